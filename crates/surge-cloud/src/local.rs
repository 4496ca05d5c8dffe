//! The local emulated cloud: volumes are sparse files under a directory,
//! served through the device model of their type, with EBS-like delays.
//!
//! Layout of the provider directory:
//! - `state.json`: volumes and billing records, replaced atomically (write a
//!   temporary file, fsync, rename, fsync the directory) so a crash leaves the
//!   old or the new state, never a torn one;
//! - `volumes/<id>.img`: one sparse file per volume;
//! - `lock`: every call that changes state holds an exclusive `flock` on it
//!   while it reloads, changes and saves the state, so several processes (the
//!   daemon, `surge cloud ...`) can share one directory.
//!
//! No orphans: a create writes the volume file, then the state; if anything
//! fails in between, the file is removed. A delete drops the volume from the
//! state first, then removes the file. Files that no state entry names (left by
//! a crash between those steps) are removed when the provider is opened.
//! Delays run on the provider's `Clock` before anything changes, so a call that
//! exceeds the timeout fails having changed nothing.

use crate::attachment::Attachment;
use crate::cost::{self, CostReport, PriceTable, UsageRecord, WallClock};
use crate::provider::{Action, CloudError, CreateRequest, Provider, Result, VolumeInfo, VolumeState};
use crate::spec::VolumeSpec;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::{CreditBalance, ModelDev, Scale, Scheduler};
use surge_block::{BlockDev, Clock, FileDev, FileOptions, DATA_FILE_MODE};

mod emulate;
/// `Optimizing` is public for the simulator (`surge-sim`), which ramps a
/// modified volume the way this cloud does.
pub use emulate::{ModifyRules, Optimizing};

/// How long each provider call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delays {
    pub create: Duration,
    pub attach: Duration,
    pub detach: Duration,
    pub delete: Duration,
}

impl Default for Delays {
    /// Attach and detach take a few seconds, as EBS's do (AttachVolume returns
    /// at once but the device appears seconds later); create and delete are
    /// immediate so that the CLI stays snappy.
    fn default() -> Self {
        Delays { create: Duration::ZERO, attach: Duration::from_secs(3), detach: Duration::from_secs(3), delete: Duration::ZERO }
    }
}

impl Delays {
    pub fn none() -> Self {
        Delays { create: Duration::ZERO, attach: Duration::ZERO, detach: Duration::ZERO, delete: Duration::ZERO }
    }

    fn of(&self, a: Action) -> Duration {
        match a {
            Action::Create => self.create,
            Action::Attach => self.attach,
            Action::Detach => self.detach,
            Action::Delete => self.delete,
            _ => Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The provider directory (state, volumes, lock).
    pub dir: PathBuf,
    pub delays: Delays,
    /// A call that would take longer than this fails with `Timeout` after
    /// waiting this long, changing nothing.
    pub timeout: Option<Duration>,
    pub prices: PriceTable,
    /// UNIX time of the clock's zero; `None`: anchor to the system time at open.
    pub epoch_unix_ns: Option<u64>,
    /// Reduced-scale emulation (experiments): volumes serve their type's rates
    /// x `rate`, files hold `rate x time` of their size, and billing counts each
    /// second as 1/`time` seconds. Specs, limits and prices stay full-scale.
    pub scale: Scale,
    /// EBS's elastic-volume modification rules (default: none).
    pub modify_rules: ModifyRules,
    /// The instance the volumes are attached to: all of them together are held
    /// to its EBS bandwidth and IOPS (default: no instance limit).
    pub instance: Option<crate::cost::InstanceEbs>,
}

impl LocalConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LocalConfig {
            dir: dir.into(),
            delays: Delays::default(),
            timeout: None,
            prices: PriceTable::default(),
            epoch_unix_ns: None,
            scale: Scale::FULL,
            modify_rules: ModifyRules::default(),
            instance: None,
        }
    }

    /// `<user data dir>/surge/cloud`, e.g. `~/.local/share/surge/cloud`.
    pub fn default_dir() -> Option<PathBuf> {
        dirs::data_dir().map(|d| d.join("surge").join("cloud"))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SavedCredits {
    ops: Option<u64>,
    bytes: Option<u64>,
    at_unix_ns: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VolRec {
    id: String,
    name: Option<String>,
    spec: VolumeSpec,
    created_unix_ns: u64,
    /// Process that has it attached (stale if that process is gone).
    attached_pid: Option<u32>,
    credits: Option<SavedCredits>,
    /// Last modification (for the cooldown rule).
    #[serde(default)]
    modified_unix_ns: Option<u64>,
    /// The latest modifications (as many as the rules look at), oldest first.
    #[serde(default)]
    modifications_unix_ns: Vec<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    version: u32,
    next_id: u64,
    volumes: Vec<VolRec>,
    billing: Vec<UsageRecord>,
}

/// Volumes this process serves.
struct Live {
    model: Arc<ModelDev>,
    attachment: Option<Arc<Attachment>>,
    optimizing: Arc<Optimizing>,
}

/// The embedded emulated cloud.
pub struct LocalProvider {
    cfg: LocalConfig,
    /// The instance's EBS limits, shared by every volume this process attaches.
    link: Option<surge_block::model::Link>,
    wall: WallClock,
    live: Mutex<HashMap<String, Live>>,
    /// Serialises this process's calls (flock serialises processes).
    big: Mutex<()>,
    fail: Mutex<Vec<(Action, u32)>>,
    slow: Mutex<Vec<(Action, Duration)>>,
}

fn pid_alive(pid: u32) -> bool {
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl LocalProvider {
    /// Open (creating if needed) the provider directory, removing volume files
    /// that no state entry names.
    pub fn open(mut cfg: LocalConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        if !cfg.scale.is_full() {
            cfg.prices.time_scale = cfg.scale.time;
        }
        let wall = match cfg.epoch_unix_ns {
            Some(epoch_unix_ns) => WallClock { clock, epoch_unix_ns },
            None => WallClock::anchored(clock),
        };
        let link = cfg.instance.map(|i| Arc::new(Mutex::new(Scheduler::new(cfg.scale.shape(i.shape()), wall.clock.now()))));
        let p = LocalProvider {
            cfg,
            link,
            wall,
            live: Mutex::new(HashMap::new()),
            big: Mutex::new(()),
            fail: Mutex::new(Vec::new()),
            slow: Mutex::new(Vec::new()),
        };
        let vols = p.cfg.dir.join("volumes");
        fs::create_dir_all(&vols).map_err(|source| p.io(Action::List, "", "creating", &vols, source))?;
        p.locked(Action::List, |st| {
            for e in fs::read_dir(&vols).map_err(|source| p.io(Action::List, "", "reading", &vols, source))? {
                let Ok(e) = e else { continue };
                let name = e.file_name().to_string_lossy().into_owned();
                let known = name.strip_suffix(".img").is_some_and(|id| st.volumes.iter().any(|v| v.id == id));
                if !known {
                    tracing::warn!(file = %e.path().display(), "removing orphaned volume file (no state entry)");
                    let _ = fs::remove_file(e.path());
                }
            }
            Ok(((), false))
        })?;
        Ok(p)
    }

    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.wall.clock
    }

    /// Make the next call of `action` fail at `step` (test hook). Steps: create
    /// 0 = before the file, 1 = after the file, 2 = while saving the state;
    /// attach 0 = before opening the file, 1 = after; delete 0 = before saving
    /// the state, 1 = while saving it; detach 0 = before detaching.
    pub fn inject_failure(&self, action: Action, step: u32) {
        self.fail.lock().push((action, step));
    }

    /// Make the next call of `action` take `extra` longer (test hook).
    pub fn inject_delay(&self, action: Action, extra: Duration) {
        self.slow.lock().push((action, extra));
    }

    fn fault(&self, action: Action, volume: &str, step: u32) -> Result<()> {
        let mut f = self.fail.lock();
        if let Some(i) = f.iter().position(|&(a, s)| a == action && s == step) {
            f.remove(i);
            return Err(CloudError::Injected { action, volume: volume.to_string(), step });
        }
        Ok(())
    }

    fn io(&self, action: Action, volume: &str, what: &'static str, path: &Path, source: std::io::Error) -> CloudError {
        CloudError::Io { action, volume: volume.to_string(), what, path: path.to_path_buf(), source }
    }

    fn state_path(&self) -> PathBuf {
        self.cfg.dir.join("state.json")
    }

    fn vol_path(&self, id: &str) -> PathBuf {
        self.cfg.dir.join("volumes").join(format!("{id}.img"))
    }

    fn load(&self, action: Action) -> Result<State> {
        let path = self.state_path();
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| CloudError::State { action, path, why: e.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State { version: 1, next_id: 1, ..State::default() }),
            Err(e) => Err(CloudError::State { action, path, why: e.to_string() }),
        }
    }

    /// Write temp, fsync, rename, fsync dir. `fail_step` is the fault step of a
    /// failed save (after the temp file is written, before the rename).
    fn save(&self, action: Action, volume: &str, st: &mut State, fail_step: u32) -> Result<()> {
        self.snapshot_credits(st);
        let path = self.state_path();
        let tmp = self.cfg.dir.join("state.json.tmp");
        let body = serde_json::to_vec_pretty(st).expect("state serialises");
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(DATA_FILE_MODE).open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()
        };
        write().map_err(|source| self.io(action, volume, "writing", &tmp, source))?;
        if let Err(e) = self.fault(action, volume, fail_step) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &path).map_err(|source| self.io(action, volume, "renaming", &path, source))?;
        File::open(&self.cfg.dir).and_then(|d| d.sync_all()).map_err(|source| self.io(action, volume, "syncing", &self.cfg.dir, source))?;
        Ok(())
    }

    /// Run `f` on the freshly loaded state under the lock; save if it says so.
    fn locked<T>(&self, action: Action, f: impl FnOnce(&mut State) -> Result<(T, bool)>) -> Result<T> {
        let _g = self.big.lock();
        let lock_path = self.cfg.dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(DATA_FILE_MODE)
            .open(&lock_path)
            .map_err(|source| self.io(action, "", "opening", &lock_path, source))?;
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(self.io(action, "", "locking", &lock_path, std::io::Error::last_os_error()));
        }
        let mut st = self.load(action)?;
        let (v, dirty) = f(&mut st)?;
        if dirty {
            self.save(action, "", &mut st, u32::MAX)?;
        }
        Ok(v) // the lock is released when `lock` is closed
    }

    fn snapshot_credits(&self, st: &mut State) {
        let now = self.wall.now_unix_ns();
        let live = self.live.lock();
        for v in st.volumes.iter_mut() {
            if let Some(l) = live.get(&v.id) {
                let c = l.model.credits();
                v.credits = Some(SavedCredits { ops: c.ops, bytes: c.bytes, at_unix_ns: now });
            }
        }
    }

    /// Credits of a volume this process does not serve: the saved balance plus
    /// what the baseline has earned since (the bucket keeps filling while idle).
    fn offline_credits(&self, v: &VolRec) -> CreditBalance {
        let Ok(shape) = v.spec.shape() else { return CreditBalance::default() };
        let shape = self.cfg.scale.shape(shape);
        let mut s = Scheduler::new(shape, Duration::ZERO);
        let Some(saved) = &v.credits else { return s.credits(Duration::ZERO) };
        s.set_credits(Duration::ZERO, saved.ops, saved.bytes);
        s.credits(Duration::from_nanos(self.wall.now_unix_ns().saturating_sub(saved.at_unix_ns)))
    }

    fn attached_elsewhere(v: &VolRec) -> Option<u32> {
        v.attached_pid.filter(|&p| p != std::process::id() && pid_alive(p))
    }

    fn info(&self, v: &VolRec) -> VolumeInfo {
        let live = self.live.lock();
        let l = live.get(&v.id);
        let here = l.is_some_and(|l| l.attachment.is_some());
        let credits = match l {
            Some(l) => l.model.credits(),
            None => self.offline_credits(v),
        };
        VolumeInfo {
            id: v.id.clone(),
            name: v.name.clone(),
            spec: v.spec.to_string(),
            kind: v.spec.kind().to_string(),
            size: v.spec.size,
            state: if here || Self::attached_elsewhere(v).is_some() { VolumeState::Attached } else { VolumeState::Available },
            created_unix_ms: v.created_unix_ns / 1_000_000,
            credits,
        }
    }

    fn find<'a>(st: &'a mut State, action: Action, key: &str) -> Result<&'a mut VolRec> {
        let i = st.volumes.iter().position(|v| v.id == key).or_else(|| st.volumes.iter().position(|v| v.name.as_deref() == Some(key)));
        match i {
            Some(i) => Ok(&mut st.volumes[i]),
            None => Err(CloudError::NotFound { action, volume: key.to_string() }),
        }
    }

    /// Wait out a call's delay (plus any injected one) on the clock; with a
    /// timeout, give up after it.
    fn delay(&self, action: Action, volume: &str) -> Result<()> {
        let extra = {
            let mut s = self.slow.lock();
            s.iter().position(|&(a, _)| a == action).map(|i| s.remove(i).1).unwrap_or_default()
        };
        let needed = self.cfg.delays.of(action) + extra;
        if needed.is_zero() {
            return Ok(());
        }
        let clock = &self.wall.clock;
        let start = clock.now();
        match self.cfg.timeout {
            Some(limit) if needed > limit => {
                clock.sleep_until(start + limit);
                Err(CloudError::Timeout { action, volume: volume.to_string(), waited: limit, needed })
            }
            _ => {
                clock.sleep_until(start + needed);
                Ok(())
            }
        }
    }

    /// Find the volume named `name`, creating it from `spec` if there is none,
    /// and attach it: what `surge serve --export NAME=TYPE:SIZE,...` serves.
    /// An existing volume of the same type is modified to `spec` (new
    /// parameters, a larger size); another type or a smaller size is an error.
    pub fn open_export(&self, name: &str, spec: &VolumeSpec) -> Result<Arc<dyn BlockDev>> {
        let existing = self.list()?.into_iter().find(|v| v.name.as_deref() == Some(name));
        let id = match existing {
            Some(v) if v.spec != spec.to_string() => {
                if v.kind != spec.kind() || v.size > spec.size {
                    return Err(CloudError::Busy {
                        action: Action::Attach,
                        volume: v.id,
                        why: format!("volume {name:?} exists as {}, not {spec}; delete it first (surge cloud delete {name})", v.spec),
                    });
                }
                self.modify(&v.id, spec.clone())?.id
            }
            Some(v) => v.id,
            None => self.create(CreateRequest { spec: spec.clone(), name: Some(name.to_string()) })?.id,
        };
        self.attach(&id)
    }

    /// The model of a volume this process has attached (credits, live shape changes).
    pub fn model(&self, id: &str) -> Option<Arc<ModelDev>> {
        self.live.lock().get(id).map(|l| l.model.clone())
    }
}

impl Drop for LocalProvider {
    /// Save the credit balances of the volumes this process served, so a
    /// restart resumes from them (claims stay: a dead pid is a stale claim).
    fn drop(&mut self) {
        if self.live.lock().is_empty() {
            return;
        }
        if let Err(e) = self.locked(Action::Detach, |_| Ok(((), true))) {
            tracing::warn!("could not save credit balances: {e}");
        }
    }
}

impl Provider for LocalProvider {
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo> {
        let a = Action::Create;
        let label = req.name.clone().unwrap_or_else(|| req.spec.to_string());
        req.spec.shape().map_err(|e| CloudError::Spec { action: a, source: e.into() })?;
        if let Some(n) = &req.name {
            if n.is_empty() || n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) || n.starts_with("vol-") {
                return Err(CloudError::Busy { action: a, volume: n.clone(), why: "a name is 1-64 letters, digits, '-', '_' or '.', not starting with \"vol-\"".into() });
            }
        }
        for w in req.spec.warnings() {
            tracing::warn!("{w}");
        }
        self.delay(a, &label)?;
        self.fault(a, &label, 0)?;
        let info = self.locked(a, |st| {
            if let Some(n) = &req.name {
                if let Some(v) = st.volumes.iter().find(|v| v.name.as_ref() == Some(n)) {
                    return Err(CloudError::NameTaken { action: a, name: n.clone(), id: v.id.clone() });
                }
            }
            let id = format!("vol-{:06}", st.next_id);
            let path = self.vol_path(&id);
            let made = File::options()
                .write(true)
                .create_new(true)
                .mode(DATA_FILE_MODE)
                .open(&path)
                .and_then(|f| f.set_len(self.cfg.scale.size(req.spec.size)).and_then(|_| f.sync_all()));
            made.map_err(|source| {
                let _ = fs::remove_file(&path);
                self.io(a, &id, "creating", &path, source)
            })?;
            let now = self.wall.now_unix_ns();
            let undo = |e: CloudError| {
                let _ = fs::remove_file(&path);
                e
            };
            self.fault(a, &id, 1).map_err(undo)?;
            st.next_id += 1;
            let rec = VolRec {
                id: id.clone(),
                name: req.name.clone(),
                spec: req.spec.clone(),
                created_unix_ns: now,
                attached_pid: None,
                credits: None,
                modified_unix_ns: None,
                modifications_unix_ns: Vec::new(),
            };
            st.volumes.push(rec.clone());
            st.billing.push(UsageRecord { id: id.clone(), name: req.name.clone(), spec: req.spec.clone(), start_unix_ns: now, end_unix_ns: None, continued: false });
            self.save(a, &id, st, 2).map_err(undo)?;
            Ok((self.info(&rec), false))
        })?;
        tracing::info!(id = %info.id, spec = %info.spec, "created volume");
        Ok(info)
    }

    fn attach(&self, key: &str) -> Result<Arc<dyn BlockDev>> {
        let a = Action::Attach;
        // Claim it first (so no one else attaches meanwhile), then wait.
        let rec = self.locked(a, |st| {
            let v = Self::find(st, a, key)?;
            if let Some(pid) = Self::attached_elsewhere(v) {
                return Err(CloudError::Busy { action: a, volume: v.id.clone(), why: format!("attached to process {pid}") });
            }
            if self.live.lock().get(&v.id).is_some_and(|l| l.attachment.is_some()) {
                return Err(CloudError::Busy { action: a, volume: v.id.clone(), why: "already attached to this process".into() });
            }
            v.attached_pid = Some(std::process::id());
            Ok((v.clone(), true))
        })?;
        let release = |e: CloudError| {
            let _ = self.locked(a, |st| {
                if let Ok(v) = Self::find(st, a, &rec.id) {
                    v.attached_pid = None;
                }
                Ok(((), true))
            });
            e
        };
        self.delay(a, &rec.id).map_err(release)?;
        self.fault(a, &rec.id, 0).map_err(release)?;
        let path = self.vol_path(&rec.id);
        let file = FileDev::open(&path, &FileOptions::default()).map_err(|source| release(self.io(a, &rec.id, "opening", &path, source)))?;
        self.fault(a, &rec.id, 1).map_err(release)?;
        let mut live = self.live.lock();
        let (model, optimizing) = match live.get(&rec.id) {
            // Re-attach in this process: keep the model, and its credits.
            Some(l) => (l.model.clone(), l.optimizing.clone()),
            None => {
                let shape = rec.spec.shape().map_err(|e| CloudError::Spec { action: a, source: e.into() })?;
                let m = Arc::new(ModelDev::new(Arc::new(file), self.wall.clock.clone(), self.cfg.scale.shape(shape)).with_link(self.link.clone()));
                let c = self.offline_credits(&rec);
                m.set_credits(c.ops, c.bytes);
                (m, Arc::new(Optimizing::default()))
            }
        };
        let advance = (optimizing.clone(), model.clone(), self.wall.clock.clone());
        let att = Arc::new(Attachment::new(&rec.id, model.clone()).before_each_request(move || advance.0.advance(&advance.1, advance.2.now())));
        live.insert(rec.id.clone(), Live { model, attachment: Some(att.clone()), optimizing });
        tracing::info!(id = %rec.id, spec = %rec.spec, "attached volume");
        Ok(att)
    }

    fn detach(&self, key: &str) -> Result<()> {
        let a = Action::Detach;
        let id = self.locked(a, |st| Ok((Self::find(st, a, key)?.id.clone(), false)))?;
        let attached_here = self.live.lock().get(&id).is_some_and(|l| l.attachment.is_some());
        if !attached_here {
            return Err(CloudError::Busy { action: a, volume: id, why: "not attached to this process".into() });
        }
        self.delay(a, &id)?;
        self.fault(a, &id, 0)?;
        if let Some(l) = self.live.lock().get_mut(&id) {
            if let Some(att) = l.attachment.take() {
                att.detach();
            }
        }
        self.locked(a, |st| {
            if let Ok(v) = Self::find(st, a, &id) {
                v.attached_pid = None;
            }
            Ok(((), true))
        })?;
        tracing::info!(%id, "detached volume");
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let a = Action::Delete;
        let id = self.locked(a, |st| {
            let v = Self::find(st, a, key)?;
            if let Some(pid) = Self::attached_elsewhere(v) {
                return Err(CloudError::Busy { action: a, volume: v.id.clone(), why: format!("attached to process {pid}; detach it first") });
            }
            Ok((v.id.clone(), false))
        })?;
        if self.live.lock().get(&id).is_some_and(|l| l.attachment.is_some()) {
            return Err(CloudError::Busy { action: a, volume: id, why: "attached to this process; detach it first".into() });
        }
        self.delay(a, &id)?;
        self.locked(a, |st| {
            self.fault(a, &id, 0)?;
            let now = self.wall.now_unix_ns();
            st.volumes.retain(|v| v.id != id);
            for r in st.billing.iter_mut().filter(|r| r.id == id && r.end_unix_ns.is_none()) {
                r.end_unix_ns = Some(now);
            }
            self.save(a, &id, st, 1)?;
            Ok(((), false))
        })?;
        self.live.lock().remove(&id);
        let path = self.vol_path(&id);
        if let Err(e) = fs::remove_file(&path) {
            // The volume is gone from the state; the next open sweeps the file.
            tracing::warn!(%id, path = %path.display(), "deleted volume but could not remove its file: {e}");
        }
        tracing::info!(%id, "deleted volume");
        Ok(())
    }

    fn list(&self) -> Result<Vec<VolumeInfo>> {
        let st = self.locked(Action::List, |st| Ok((st.clone(), false)))?;
        Ok(st.volumes.iter().map(|v| self.info(v)).collect())
    }

    fn describe(&self, key: &str) -> Result<VolumeInfo> {
        let a = Action::Describe;
        let v = self.locked(a, |st| Ok((Self::find(st, a, key)?.clone(), false)))?;
        Ok(self.info(&v))
    }

    fn cost(&self) -> Result<CostReport> {
        let st = self.locked(Action::Cost, |st| Ok((st.clone(), false)))?;
        Ok(cost::report(&self.cfg.prices, &st.billing, self.wall.now_unix_ns()))
    }

    fn modify(&self, key: &str, spec: VolumeSpec) -> Result<VolumeInfo> {
        let a = Action::Modify;
        let shape = spec.shape().map_err(|e| CloudError::Spec { action: a, source: e.into() })?;
        for w in spec.warnings() {
            tracing::warn!("{w}");
        }
        self.delay(a, key)?;
        self.fault(a, key, 0)?;
        let info = self.locked(a, |st| {
            let v = Self::find(st, a, key)?;
            let busy = |why: String| CloudError::Busy { action: a, volume: v.id.clone(), why };
            // EBS changes the type in place too (gp3 to io2 and back, st1 from
            // 125 GiB); `spec.shape()` above checked the new type's limits.
            let now = self.wall.now_unix_ns();
            // State written before the history was kept has the last one only.
            let mut past: Vec<Duration> = v.modifications_unix_ns.iter().map(|&t| Duration::from_nanos(t)).collect();
            past.extend(v.modified_unix_ns.filter(|t| !v.modifications_unix_ns.contains(t)).map(Duration::from_nanos));
            if let Some(why) = self.cfg.modify_rules.refuses(&past, Duration::from_nanos(now)) {
                return Err(busy(why));
            }
            if spec.size < v.spec.size {
                return Err(busy("volumes only grow".into()));
            }
            let mut live = self.live.lock();
            let here = live.get(&v.id).is_some_and(|l| l.attachment.is_some());
            if spec.size != v.spec.size {
                if here || Self::attached_elsewhere(v).is_some() {
                    return Err(busy("detach it to resize (an attached device keeps its size)".into()));
                }
                let path = self.vol_path(&v.id);
                let grown = OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(self.cfg.scale.size(spec.size)).and_then(|_| f.sync_all()));
                grown.map_err(|source| self.io(a, &v.id, "resizing", &path, source))?;
                // The next attach opens the file at its new size; keep the credits.
                if let Some(l) = live.remove(&v.id) {
                    let c = l.model.credits();
                    v.credits = Some(SavedCredits { ops: c.ops, bytes: c.bytes, at_unix_ns: self.wall.now_unix_ns() });
                }
            } else if let Some(l) = live.get(&v.id) {
                l.optimizing.start(&l.model, self.cfg.scale.shape(shape.clone()), self.wall.clock.now(), self.cfg.modify_rules.optimizing);
            }
            drop(live);
            v.spec = spec.clone();
            v.modified_unix_ns = Some(now);
            v.modifications_unix_ns.push(now);
            let keep = self.cfg.modify_rules.memory();
            if v.modifications_unix_ns.len() > keep {
                v.modifications_unix_ns.drain(..v.modifications_unix_ns.len() - keep);
            }
            let (id, name) = (v.id.clone(), v.name.clone());
            for r in st.billing.iter_mut().filter(|r| r.id == id && r.end_unix_ns.is_none()) {
                r.end_unix_ns = Some(now);
            }
            st.billing.push(UsageRecord { id: id.clone(), name, spec: spec.clone(), start_unix_ns: now, end_unix_ns: None, continued: true });
            self.save(a, &id, st, 1)?;
            let v = st.volumes.iter().find(|v| v.id == id).expect("still there").clone();
            Ok((self.info(&v), false))
        })?;
        tracing::info!(id = %info.id, spec = %info.spec, "modified volume");
        Ok(info)
    }

    /// From the emulation's ramp: `optimizing` (with its progress) for the
    /// rules' `optimizing` after the request, then `completed`; never `modifying`
    /// (the ramp starts at the request).
    fn modification(&self, key: &str) -> Result<Option<crate::Modification>> {
        use crate::{Modification, ModificationState};
        let a = Action::Describe;
        let v = self.locked(a, |st| Ok((Self::find(st, a, key)?.clone(), false)))?;
        let Some(at) = v.modifications_unix_ns.iter().copied().chain(v.modified_unix_ns).max() else { return Ok(None) };
        let length = self.cfg.modify_rules.optimizing.as_nanos() as u64;
        let ago = self.wall.now_unix_ns().saturating_sub(at);
        let done = ago >= length;
        let shape = v.spec.shape().ok();
        Ok(Some(Modification {
            state: if done { ModificationState::Completed } else { ModificationState::Optimizing },
            progress_percent: Some(if done { 100 } else { (ago as f64 / length as f64 * 100.0) as u32 }),
            started_unix_ms: Some(at / 1_000_000),
            ended_unix_ms: done.then_some((at + length) / 1_000_000),
            target: Some(v.spec.to_string()),
            target_iops: shape.as_ref().and_then(|s| s.iops),
            target_throughput_mibps: shape.as_ref().and_then(|s| s.bps).map(|b| b / (1 << 20)),
            message: None,
        }))
    }
}

#[cfg(test)]
mod tests;
