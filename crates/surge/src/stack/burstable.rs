//! Burstable volumes: a stripe over N small credit-carrying cloud volumes
//! (gp2), whose members are swapped for fresh ones, full of credits, as their
//! credits run out. Three modes, as in the burstable-volumes paper:
//! - `persistent`: a member is migrated by a mirror rebuild onto a new volume
//!   (`surge_block::mirror`), then swapped in and the old one deleted, online;
//! - `cache`: a write-through cache (`surge_block::cache`, public API only)
//!   striped over the members, in front of a slow backing volume (st1); spent
//!   members are dropped and replaced empty, the cache starts cold;
//! - `ephemeral`: scratch space; spent members are replaced empty, their data
//!   discarded or kept detached (`keep`) until released.
//!
//! [`BurstableVolume`] is the daemon side: it reads each member's credits from
//! the provider once per tick, asks the pure policy (`surge_policy::burstable`)
//! what to swap, and applies it. Which volumes are members, and which swap is in
//! flight, is kept in `<data-dir>/burstable/NAME/state.json` (replaced
//! atomically; a mirror's own position lives in `slotN.mirror` beside it), in
//! this order, so a crash at any point loses nothing:
//! 1. create and attach the new member (a crash leaves an unknown volume that
//!    the next start deletes);
//! 2. write the mirror record, then record the swap in the state, then put the
//!    mirror in the stripe slot (a restart resumes the rebuild from the record);
//! 3. when the mirror is complete: with requests to the slot held off, check
//!    that the target never failed and flush both legs, record the new member
//!    in the state, then put it in the slot (writes reached both legs until
//!    then), then delete the old.
//!
//! Spec: `burstable:MODE,size=SIZE,members=N[,type=gp2][,chunk=64KiB (cache: the block size)][,strategy=all|one]
//! [,swap_below=auto|PCT][,margin=1.5][,rebuild_rate=64MiB/s][,region=1MiB][,tick=5s]
//! [,min_interval=60s][,attach_limit=27][,attach_delay=DUR][,backing=TYPE:SIZE][,block=32KiB]
//! [,idle=5s][,keep][,cloudwatch_every=60s]`.

use crate::control::Controllable;
use anyhow::{bail, Context};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::{CacheConfig, CacheMode, ElasticCache};
use surge_block::mirror::{spawn_rebuild, Mirror, MirrorConfig, MirrorError, MirrorProgress, Rebuilder};
use surge_block::model::VolumeModel;
use surge_block::stripe::{Stripe, StripeConfig};
use surge_block::{BlockDev, Caps, Clock, ClockThread, Extent, FileDev, ZeroMode};
use surge_cloud::{CreateRequest, Provider, VolumeSpec};
use surge_policy::burstable::{Action, BurstableConfig, BurstablePolicy, MemberObs, Mode, Obs, SlotView, Strategy};

#[path = "burstable_ebs.rs"]
pub mod ebs;

#[derive(Debug, Clone)]
pub struct BurstableParams {
    /// Export name; volumes are named `NAME-sSLOT-gGEN` (and `NAME-backing`).
    pub name: String,
    pub mode: Mode,
    /// The size asked for (`size=`): persistent and ephemeral stripes export
    /// exactly this much, however far the members round up.
    pub size: u64,
    pub members: usize,
    /// One member's spec (e.g. `gp2:10GiB`).
    pub member: VolumeSpec,
    pub chunk: u64,
    pub policy: BurstableConfig,
    pub mirror: MirrorConfig,
    /// Rebuild rate limit, bytes/s (None: as fast as the volumes allow).
    pub rebuild_rate: Option<u64>,
    /// Cache mode: the slow volume the cache fronts.
    pub backing: Option<VolumeSpec>,
    pub cache_block: u64,
    /// Ephemeral: keep replaced members detached instead of deleting them.
    pub keep: bool,
    pub tick: Duration,
    /// Where state.json and the mirror records live.
    pub state_dir: PathBuf,
    /// Run multi-member stripe requests on parallel threads.
    pub parallel: bool,
    /// Draw rebuild progress bars on stderr (when it is a terminal).
    pub progress_bars: bool,
    /// On a cloud whose credits lag: how often each member's CloudWatch
    /// point is read (`cloudwatch_every=60s`).
    pub cloudwatch_every: Duration,
}

/// What survives a restart (see the module docs for the write order).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    version: u32,
    mode: Option<Mode>,
    member_spec: String,
    chunk: u64,
    /// Volumes made so far (names carry it).
    gen: u64,
    slots: Vec<SavedSlot>,
    backing: Option<String>,
    /// Replaced members still to delete.
    retired: Vec<String>,
    /// Ephemeral `keep`: replaced member sets, detached, until released.
    kept: Vec<KeptSet>,
    /// The exported size (`size=`); it may grow, never shrink.
    #[serde(default)]
    size: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SavedSlot {
    member: String,
    swap: Option<SavedSwap>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedSwap {
    target: String,
    tag: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeptSet {
    pub gen: u64,
    pub volumes: Vec<String>,
    pub at_s: f64,
}

struct Swapping {
    target: String,
    target_dev: Arc<dyn BlockDev>,
    mirror: Arc<Mirror>,
    rebuilder: Option<Rebuilder>,
    started: Duration,
}

struct Slot {
    member: String,
    dev: Arc<dyn BlockDev>,
    swap: Option<Swapping>,
}

/// One completed (or abandoned) swap, for status and plots.
#[derive(Debug, Clone, Serialize)]
pub struct SwapRecord {
    pub slots: Vec<usize>,
    pub started_s: f64,
    pub finished_s: f64,
    pub kind: &'static str,
    pub bytes_moved: u64,
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoggedDecision {
    pub at_s: f64,
    pub slots: Vec<usize>,
    pub reason: String,
}

pub struct BurstableVolume {
    p: BurstableParams,
    provider: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    size: u64,
    stripe: RwLock<Arc<Stripe>>,
    cache: Option<Arc<ElasticCache>>,
    slots: Mutex<Vec<Slot>>,
    saved: Mutex<Saved>,
    policy: Mutex<BurstablePolicy>,
    log: Mutex<Vec<LoggedDecision>>,
    history: Mutex<Vec<SwapRecord>>,
    manual: Mutex<Vec<Vec<usize>>>,
    last_io_ns: AtomicU64,
    /// Requests being served: a volume with one in flight is not idle, however
    /// long ago it started.
    in_flight: AtomicU64,
    /// Requests started, ever: what an ephemeral reset checks nothing came since.
    started_io: AtomicU64,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Serialises controller steps (the thread and `step()` callers).
    stepping: Mutex<()>,
    bars: Mutex<Option<RebuildBars>>,
    /// On a cloud whose credits lag (EBS): the model of surge's I/O and CloudWatch's points.
    credits: Option<ebs::SampledCredits>,
    /// Where the attachment limit came from, for `surge status`.
    slots_source: String,
    /// The last swap that could not start (the cloud refused a fresh member),
    /// while no swap has started since: the policy's swaps wait out its backoff.
    swap_failure: Mutex<Option<SwapFailure>>,
}

/// A swap the cloud refused (InsufficientVolumeCapacity, VolumeLimitExceeded,
/// AttachmentLimitExceeded, an attach that never completed, throttling or
/// expired credentials): the current members keep serving.
struct SwapFailure {
    at: Duration,
    error: String,
    retry_at: Duration,
    attempts: u32,
    slots: Vec<usize>,
}

/// Wait after `attempts` refused swaps in a row: 1 s, doubling, at most 5 min.
fn swap_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

/// A request in flight on a [`BurstableVolume`]; its end is stamped too.
struct InFlight<'a>(&'a BurstableVolume);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.note_io();
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// A slot at open: member id and device, and a resumed swap (target id, device, mirror).
type SlotDevs = (String, Arc<dyn BlockDev>, Option<(String, Arc<dyn BlockDev>, Arc<Mirror>)>);

/// FNV-1a of a volume id: the mirror record's tag.
fn tag_of(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl BurstableVolume {
    fn mirror_path(dir: &Path, slot: usize) -> PathBuf {
        dir.join(format!("slot{slot}.mirror"))
    }

    fn save(&self, s: &Saved) -> anyhow::Result<()> {
        save_state(&self.p.state_dir, s)
    }

    fn member_name(&self, slot: usize, gen: u64) -> String {
        format!("{}-s{slot}-g{gen}", self.p.name)
    }

    /// Open (or create) the volume: members, pending swaps, leftovers.
    pub fn open(mut p: BurstableParams, provider: Arc<dyn Provider>, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&p.state_dir).with_context(|| format!("creating {}", p.state_dir.display()))?;
        // Credits that lag (CloudWatch): count what surge issues to each member.
        let (provider, credits): (Arc<dyn Provider>, _) = if provider.credits_sampled() {
            let m = Arc::new(ebs::MeteredProvider::new(provider));
            (m.clone(), Some(ebs::SampledCredits::new(m, &p.member, clock.now(), p.cloudwatch_every)))
        } else {
            (provider, None)
        };
        let saved = load_state(&p.state_dir)?;
        // A state without members: the first start was killed while it made
        // them (the state is saved before, so that what it made is known as
        // never served; see below).
        let interrupted = saved.as_ref().is_some_and(|s| s.slots.is_empty());
        let fresh = saved.is_none() || interrupted;
        let mut saved = saved.unwrap_or(Saved { version: 1, mode: Some(p.mode), member_spec: p.member.to_string(), chunk: p.chunk, ..Saved::default() });
        if saved.mode != Some(p.mode) || saved.member_spec != p.member.to_string() || saved.chunk != p.chunk || (!fresh && saved.slots.len() != p.members) {
            bail!(
                "{} holds a burstable volume of {} x {} ({:?}, chunk {}); the spec asks for {} x {} ({:?}, chunk {}): delete that directory and its volumes to start over",
                p.state_dir.display(),
                saved.slots.len(),
                saved.member_spec,
                saved.mode,
                saved.chunk,
                p.members,
                p.member,
                p.mode,
                p.chunk
            );
        }
        if let Some(old) = saved.size.filter(|&old| p.size < old) {
            bail!("{} holds a burstable volume of {}; the spec asks for {}: a volume never shrinks", p.state_dir.display(), crate::stack::format_size(old), crate::stack::format_size(p.size));
        }
        saved.size = Some(p.size);
        let own: Vec<String> = saved.slots.iter().flat_map(|s| std::iter::once(s.member.clone()).chain(s.swap.as_ref().map(|w| w.target.clone()))).chain(saved.backing.clone()).collect();
        let slots_source = check_slots(&mut p, provider.as_ref(), &own)?;
        let known = provider.list()?;
        // Cache mode: the backing volume.
        let cache = if p.mode == Mode::Cache {
            let spec = p.backing.clone().context("cache mode needs backing=TYPE:SIZE")?;
            let name = format!("{}-backing", p.name);
            let id = match saved.backing.clone().or_else(|| known.iter().find(|v| v.name.as_deref() == Some(&name)).map(|v| v.id.clone())) {
                Some(id) => id,
                None => provider.create(CreateRequest { spec, name: Some(name) })?.id,
            };
            saved.backing = Some(id.clone());
            let dev = provider.attach(&id)?;
            let cfg = CacheConfig { block_size: p.cache_block, mode: CacheMode::WriteThrough, ..CacheConfig::default() };
            Some(Arc::new(ElasticCache::new(dev, cfg, clock.clone())))
        } else {
            None
        };
        // Members.
        if fresh {
            let prefix = format!("{}-s", p.name);
            if interrupted {
                // Never served: nothing on them was acknowledged.
                for v in known.iter().filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix))) {
                    tracing::warn!(volume = %v.id, name = ?v.name, "deleting a member made by a first start that was interrupted");
                    let _ = provider.detach(&v.id);
                    provider.delete(&v.id).with_context(|| format!("deleting {} (made by an interrupted first start)", v.id))?;
                }
            } else if let Some(v) = known.iter().find(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix))) {
                bail!(
                    "{} has no burstable state, but volume {} ({:?}) of this export exists: its state directory was lost; \
                     surge does not guess the layout: restore the directory, or delete the export's volumes to start over",
                    p.state_dir.display(), v.id, v.name
                );
            }
            save_state(&p.state_dir, &saved)?;
            let names: Vec<String> = (0..p.members).map(|i| format!("{}-s{i}-g0", p.name)).collect();
            let ids = create_attach_all(&provider, &clock, &p.member, &names)?;
            saved.slots = ids.iter().map(|(id, _)| SavedSlot { member: id.clone(), swap: None }).collect();
            saved.gen = 1;
            save_state(&p.state_dir, &saved)?;
            return Self::assemble(p, provider, clock, saved, ids.into_iter().map(|(id, d)| (id, d, None)).collect(), cache, (credits, slots_source));
        }
        // Restart: delete what a crash left behind, reattach, resume swaps.
        let mut referenced: Vec<String> = saved.slots.iter().flat_map(|s| std::iter::once(s.member.clone()).chain(s.swap.as_ref().map(|w| w.target.clone()))).collect();
        referenced.extend(saved.backing.clone());
        referenced.extend(saved.kept.iter().flat_map(|k| k.volumes.clone()));
        let prefix = format!("{}-s", p.name);
        for v in &known {
            let ours = v.name.as_deref().is_some_and(|n| n.starts_with(&prefix));
            if (ours && !referenced.contains(&v.id)) || saved.retired.contains(&v.id) {
                tracing::warn!(volume = %v.id, name = ?v.name, "deleting a volume left by an interrupted swap");
                let _ = provider.detach(&v.id);
                provider.delete(&v.id)?;
            }
        }
        saved.retired.clear();
        let mut devs = Vec::new();
        for (i, s) in saved.slots.clone().iter().enumerate() {
            let dev = provider.attach(&s.member)?;
            let mut resumed = None;
            if let Some(w) = &s.swap {
                match resume_mirror(&p, &provider, &clock, i, dev.clone(), w) {
                    Ok(m) => resumed = Some(m),
                    Err(e) => {
                        tracing::warn!(slot = i, target = %w.target, "abandoning an interrupted swap: {e:#}");
                        let _ = provider.detach(&w.target);
                        let _ = provider.delete(&w.target);
                        saved.slots[i].swap = None;
                    }
                }
            }
            devs.push((s.member.clone(), dev, resumed));
        }
        save_state(&p.state_dir, &saved)?;
        Self::assemble(p, provider, clock, saved, devs, cache, (credits, slots_source))
    }

    fn assemble(
        p: BurstableParams,
        provider: Arc<dyn Provider>,
        clock: Arc<dyn Clock>,
        saved: Saved,
        devs: Vec<SlotDevs>,
        cache: Option<Arc<ElasticCache>>,
        (credits, slots_source): (Option<ebs::SampledCredits>, String),
    ) -> anyhow::Result<Arc<Self>> {
        let stripe_devs: Vec<Arc<dyn BlockDev>> = devs.iter().map(|(_, d, m)| m.as_ref().map_or(d.clone(), |(_, _, m)| m.clone() as Arc<dyn BlockDev>)).collect();
        let stripe = Arc::new(Stripe::new(stripe_devs, StripeConfig { chunk: p.chunk, parallel: p.parallel })?);
        if let Some(c) = &cache {
            c.attach(stripe.clone()).context("attaching the striped cache")?;
        }
        let size = match &cache {
            Some(c) => c.size(),
            None => exported_size(stripe.size(), p.size, p.members as u64 * p.member.size),
        };
        let now = clock.now();
        let slots = devs
            .into_iter()
            .map(|(member, dev, m)| Slot {
                member,
                dev,
                swap: m.map(|(target, target_dev, mirror)| Swapping { target, target_dev, mirror, rebuilder: None, started: now }),
            })
            .collect();
        let policy = BurstablePolicy::new(p.policy.clone(), p.members);
        let bars = p.progress_bars.then(RebuildBars::new);
        let v = Arc::new(BurstableVolume {
            size,
            stripe: RwLock::new(stripe),
            cache,
            slots: Mutex::new(slots),
            saved: Mutex::new(saved),
            policy: Mutex::new(policy),
            log: Mutex::new(Vec::new()),
            history: Mutex::new(Vec::new()),
            manual: Mutex::new(Vec::new()),
            last_io_ns: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            started_io: AtomicU64::new(0),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            stepping: Mutex::new(()),
            bars: Mutex::new(bars),
            credits,
            slots_source,
            swap_failure: Mutex::new(None),
            p,
            provider,
            clock,
        });
        // Resumed rebuilds run from now on.
        for (i, s) in v.slots.lock().iter_mut().enumerate() {
            if let Some(w) = &mut s.swap {
                w.rebuilder = Some(v.start_rebuild(i, w.mirror.clone()));
            }
        }
        Ok(v)
    }

    /// A rebuild thread ends when its mirror is complete; a failed source
    /// flush may make the mirror incomplete again (regions to copy again):
    /// then it runs again.
    fn resume_rebuilds(&self) {
        for (i, s) in self.slots.lock().iter_mut().enumerate() {
            if let Some(w) = &mut s.swap {
                let ended = w.rebuilder.as_ref().is_none_or(|r| r.is_finished());
                if ended && !w.mirror.is_complete() && !w.mirror.is_failed() {
                    if let Some(r) = w.rebuilder.take() {
                        if let Err(e) = r.stop() {
                            tracing::warn!(volume = %self.p.name, slot = i, "rebuild ended: {e}; running it again");
                        }
                    }
                    w.rebuilder = Some(self.start_rebuild(i, w.mirror.clone()));
                }
            }
        }
    }

    fn start_rebuild(&self, slot: usize, m: Arc<Mirror>) -> Rebuilder {
        m.set_rate_limit(self.p.rebuild_rate);
        spawn_rebuild(m, self.clock.clone(), format!("rebuild-{}-{slot}", self.p.name), self.p.tick.min(Duration::from_millis(200)))
    }

    /// Start the controller thread.
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("burstable-{}", self.p.name))
            .spawn(move || {
                let _t = ClockThread::enter(me.clock.clone());
                let mut next = me.clock.now();
                while !me.stop.load(Relaxed) {
                    if let Err(e) = me.step() {
                        tracing::error!(volume = %me.p.name, "burstable controller: {e:#}");
                    }
                    next += me.p.tick;
                    next = next.max(me.clock.now());
                    me.clock.sleep_until(next);
                }
            })
            .expect("spawn burstable controller");
        self.threads.lock().push(t);
    }

    /// Stop the controller and the rebuilds (state stays as it is; a restart resumes).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        for s in self.slots.lock().iter_mut() {
            if let Some(w) = &mut s.swap {
                drop(w.rebuilder.take());
            }
        }
        if let Some(b) = self.bars.lock().as_ref() {
            b.clear();
        }
    }

    /// One controller step: finish swaps, observe credits, decide, apply.
    pub fn step(&self) -> anyhow::Result<()> {
        let _g = self.stepping.lock();
        self.resume_rebuilds();
        self.finish_swaps()?;
        let started_io = self.started_io.load(SeqCst);
        let obs = self.observe()?;
        let now = self.clock.now();
        let mut todo: Vec<(Vec<usize>, String)> = self.manual.lock().drain(..).map(|s| (s, "requested with surge set".to_string())).collect();
        let manual = todo.len();
        let decisions = self.policy.lock().tick(now, &obs);
        // After a refused swap the policy asks again every tick: its swaps wait
        // out the backoff (one asked for with `surge set` goes at once).
        if !self.swap_failure.lock().as_ref().is_some_and(|f| now < f.retry_at) {
            todo.extend(decisions.into_iter().map(|d| match d.action {
                Action::Swap { slots } => (slots, d.reason),
            }));
        }
        for (k, (slots, reason)) in todo.into_iter().enumerate() {
            tracing::info!(volume = %self.p.name, ?slots, %reason, "burstable swap");
            self.log.lock().push(LoggedDecision { at_s: secs(now), slots: slots.clone(), reason });
            // The policy decides an ephemeral reset on idle time: it must not
            // discard what is written while the fresh set attaches. One asked
            // for with `surge set` discards whatever is there, as asked.
            let idle_since = (self.p.mode == Mode::Ephemeral && k >= manual).then_some(started_io);
            let r = match self.p.mode {
                Mode::Persistent => slots.iter().try_for_each(|&i| self.start_persistent_swap(i)),
                Mode::Cache | Mode::Ephemeral => self.swap_all(idle_since),
            };
            match r {
                Ok(()) => *self.swap_failure.lock() = None,
                Err(e) => {
                    self.swap_failed(now, slots, &e);
                    break;
                }
            }
        }
        self.update_bars();
        Ok(())
    }

    /// A swap could not start: nothing changed (what it made was deleted), the
    /// current members keep serving; say so once and back off.
    fn swap_failed(&self, now: Duration, slots: Vec<usize>, e: &anyhow::Error) {
        let mut f = self.swap_failure.lock();
        let attempts = f.as_ref().map_or(0, |f| f.attempts) + 1;
        let wait = swap_backoff(attempts);
        tracing::error!(
            volume = %self.p.name, ?slots, attempt = attempts,
            "a member swap could not start; the current members keep serving, retrying in {:.0} s: {e:#}", wait.as_secs_f64()
        );
        *f = Some(SwapFailure { at: now, error: format!("{e:#}"), retry_at: now + wait, attempts, slots });
    }

    fn observe(&self) -> anyhow::Result<Obs> {
        let slots: Vec<(String, bool)> = self.slots.lock().iter().map(|s| (s.member.clone(), s.swap.is_some())).collect();
        let mut members = Vec::with_capacity(slots.len());
        let now = self.clock.now();
        for (id, swapping) in &slots {
            let c = match &self.credits {
                Some(sc) => sc.observe(id, now),
                None => self.provider.credits(id)?,
            };
            members.push(MemberObs { credits: c.ops, capacity: c.ops_capacity, swapping: *swapping });
        }
        if let Some(sc) = &self.credits {
            sc.retain(&slots.iter().map(|s| s.0.clone()).collect::<Vec<_>>());
        }
        let attached = slots.len() + slots.iter().filter(|s| s.1).count() + usize::from(self.cache.is_some());
        let last = self.last_io_ns.load(SeqCst);
        let idle_for = match (self.in_flight.load(SeqCst), last) {
            (0, 0) => Duration::MAX,
            (0, last) => self.clock.now().saturating_sub(Duration::from_nanos(last - 1)),
            _ => Duration::ZERO,
        };
        Ok(Obs { members, attached, idle_for })
    }

    /// Persistent: create a fresh member for `slot` and start mirroring onto it.
    fn start_persistent_swap(&self, slot: usize) -> anyhow::Result<()> {
        let (source, busy) = {
            let s = self.slots.lock();
            let st = s.get(slot).context("no such slot")?;
            (st.dev.clone(), st.swap.is_some())
        };
        if busy {
            return Ok(());
        }
        let gen = {
            let mut s = self.saved.lock();
            s.gen += 1;
            self.save(&s)?;
            s.gen - 1
        };
        let name = self.member_name(slot, gen);
        let (target, target_dev) = create_attach_all(&self.provider, &self.clock, &self.p.member, std::slice::from_ref(&name))?.remove(0);
        let undo = |e: anyhow::Error| -> anyhow::Error {
            let _ = self.provider.detach(&target);
            let _ = self.provider.delete(&target);
            e
        };
        let tag = tag_of(&target);
        let mirror = (|| -> anyhow::Result<Arc<Mirror>> {
            let path = Self::mirror_path(&self.p.state_dir, slot);
            let _ = std::fs::remove_file(&path);
            let meta = Arc::new(FileDev::create(&path, surge_block::mirror::meta::required_size(source.size(), self.p.mirror.region))?);
            Ok(Arc::new(Mirror::create(source.clone(), target_dev.clone(), meta, self.p.mirror, tag, self.clock.clone())?))
        })()
        .map_err(undo)?;
        {
            let mut s = self.saved.lock();
            s.slots[slot].swap = Some(SavedSwap { target: target.clone(), tag });
            self.save(&s).map_err(undo)?;
        }
        self.stripe.read().replace(slot, mirror.clone())?;
        let rebuilder = self.start_rebuild(slot, mirror.clone());
        self.slots.lock()[slot].swap = Some(Swapping { target, target_dev, mirror, rebuilder: Some(rebuilder), started: self.clock.now() });
        Ok(())
    }

    /// Persistent: complete the swaps whose mirror is done, abandon failed ones.
    fn finish_swaps(&self) -> anyhow::Result<()> {
        let ready: Vec<usize> = self
            .slots
            .lock()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.swap.as_ref().and_then(|w| (w.mirror.is_complete() || w.mirror.is_failed()).then_some(i)))
            .collect();
        for slot in ready {
            let (old, w) = {
                let mut s = self.slots.lock();
                let w = s[slot].swap.take().expect("swapping");
                (s[slot].member.clone(), w)
            };
            let now = self.clock.now();
            let moved = w.mirror.progress().moved_bytes;
            let switched = if w.mirror.is_failed() {
                false
            } else {
                match self.switch_to_target(slot, &w, &old) {
                    Ok(switched) => switched,
                    Err(e) => {
                        // Nothing changed: the mirror stays in the slot, tried again next step.
                        self.slots.lock()[slot].swap = Some(w);
                        return Err(e);
                    }
                }
            };
            if !switched {
                tracing::error!(slot, target = %w.target, "abandoning a swap: the new member failed");
                {
                    let mut s = self.saved.lock();
                    s.slots[slot].swap = None;
                    s.retired.push(w.target.clone());
                    self.save(&s)?;
                }
                let src = self.slots.lock()[slot].dev.clone();
                self.stripe.read().replace(slot, src)?;
                drop(w.rebuilder);
                self.retire(std::slice::from_ref(&w.target))?;
            } else {
                if let Some(r) = w.rebuilder {
                    let _ = r.stop();
                }
                {
                    let mut s = self.slots.lock();
                    s[slot].member = w.target.clone();
                    s[slot].dev = w.target_dev.clone();
                }
                self.retire(&[old])?;
                let _ = std::fs::remove_file(Self::mirror_path(&self.p.state_dir, slot));
                self.policy.lock().swapped(now, slot);
                tracing::info!(slot, member = %w.target, "swap complete");
            }
            self.history.lock().push(SwapRecord { slots: vec![slot], started_s: secs(w.started), finished_s: secs(now), kind: "rebuild", bytes_moved: moved, ok: switched });
        }
        Ok(())
    }

    /// Put a finished mirror's target in its slot, atomically with respect to
    /// I/O: while requests to the slot wait, the target must hold every
    /// acknowledged write, durably ([`Mirror::seal`]: a target that failed at
    /// any time is refused), then the state names it, then it takes the slot.
    /// The old member is deleted only after that. `Ok(false)`: the target failed.
    fn switch_to_target(&self, slot: usize, w: &Swapping, old: &str) -> anyhow::Result<bool> {
        let switched = self.stripe.read().replace_with::<anyhow::Error>(slot, |_| {
            if !w.mirror.seal().context("flushing both legs of the finished mirror")? {
                return Ok(None);
            }
            let mut s = self.saved.lock();
            s.slots[slot] = SavedSlot { member: w.target.clone(), swap: None };
            s.retired.push(old.to_string());
            self.save(&s)?;
            Ok(Some(w.target_dev.clone()))
        })?;
        Ok(switched.is_some())
    }

    /// Detach and delete volumes listed as retired, then drop them from the list.
    fn retire(&self, ids: &[String]) -> anyhow::Result<()> {
        for id in ids {
            let _ = self.provider.detach(id);
            self.provider.delete(id)?;
        }
        let mut s = self.saved.lock();
        s.retired.retain(|r| !ids.contains(r));
        self.save(&s)
    }

    /// Cache and ephemeral: a whole new set of empty members. With
    /// `idle_since` (requests started when an ephemeral reset was decided),
    /// the reset is called off if a request came since: the
    /// scratch data an application wrote after its idle time stays.
    fn swap_all(&self, idle_since: Option<u64>) -> anyhow::Result<()> {
        let started = self.clock.now();
        let gen = {
            let mut s = self.saved.lock();
            s.gen += 1;
            self.save(&s)?;
            s.gen - 1
        };
        let names: Vec<String> = (0..self.p.members).map(|i| self.member_name(i, gen)).collect();
        let fresh = create_attach_all(&self.provider, &self.clock, &self.p.member, &names)?;
        let stripe = Arc::new(Stripe::new(fresh.iter().map(|(_, d)| d.clone()).collect(), StripeConfig { chunk: self.p.chunk, parallel: self.p.parallel })?);
        match &self.cache {
            Some(c) => {
                // Write-through: always clean, so detach never waits; reads go to
                // the backing volume between detach and attach.
                c.detach().context("detaching the spent cache")?;
                c.attach(stripe.clone()).context("attaching the fresh cache")?;
                *self.stripe.write() = stripe;
            }
            None => {
                let mut current = self.stripe.write();
                // Requests stamp themselves before they take the stripe (see
                // `begin_io`): with the lock held, none can start on the old set
                // unseen.
                if idle_since.is_some_and(|t| self.in_flight.load(SeqCst) > 0 || self.started_io.load(SeqCst) != t) {
                    drop(current);
                    return self.call_off_reset(&fresh);
                }
                *current = stripe;
            }
        }
        let old: Vec<String> = {
            let mut slots = self.slots.lock();
            let old = slots.iter().map(|s| s.member.clone()).collect();
            for (s, (id, dev)) in slots.iter_mut().zip(&fresh) {
                s.member = id.clone();
                s.dev = dev.clone();
            }
            old
        };
        let keep = self.p.mode == Mode::Ephemeral && self.p.keep;
        {
            let mut s = self.saved.lock();
            for (slot, (id, _)) in s.slots.iter_mut().zip(&fresh) {
                *slot = SavedSlot { member: id.clone(), swap: None };
            }
            if keep {
                s.kept.push(KeptSet { gen: gen - 1, volumes: old.clone(), at_s: secs(self.clock.now()) });
            } else {
                s.retired.extend(old.iter().cloned());
            }
            self.save(&s)?;
        }
        if keep {
            for id in &old {
                self.provider.detach(id)?;
            }
        } else {
            self.retire(&old)?;
        }
        let now = self.clock.now();
        let mut p = self.policy.lock();
        for i in 0..self.p.members {
            p.swapped(now, i);
        }
        drop(p);
        self.history.lock().push(SwapRecord {
            slots: (0..self.p.members).collect(),
            started_s: secs(started),
            finished_s: secs(now),
            kind: if self.cache.is_some() { "cache reset" } else { "scratch reset" },
            bytes_moved: 0,
            ok: true,
        });
        Ok(())
    }

    /// An ephemeral reset that found the volume busy again: the fresh set
    /// goes (recorded first, so a crash here deletes it at the next start).
    fn call_off_reset(&self, fresh: &[(String, Arc<dyn BlockDev>)]) -> anyhow::Result<()> {
        let ids: Vec<String> = fresh.iter().map(|(id, _)| id.clone()).collect();
        tracing::info!(volume = %self.p.name, "ephemeral reset called off: requests arrived while the fresh members attached; the next idle period retries");
        self.log.lock().push(LoggedDecision { at_s: secs(self.clock.now()), slots: vec![], reason: "reset called off: requests arrived while the fresh members attached".into() });
        {
            let mut s = self.saved.lock();
            s.retired.extend(ids.iter().cloned());
            self.save(&s)?;
        }
        self.retire(&ids)
    }

    /// Ephemeral `keep`: delete kept member sets (`all` or one generation).
    pub fn release(&self, which: &str) -> anyhow::Result<usize> {
        let sets: Vec<KeptSet> = {
            let s = self.saved.lock();
            s.kept.iter().filter(|k| which == "all" || which.parse::<u64>().ok() == Some(k.gen)).cloned().collect()
        };
        if sets.is_empty() {
            bail!("no kept member set {which:?} (kept: {:?})", self.saved.lock().kept.iter().map(|k| k.gen).collect::<Vec<_>>());
        }
        for k in &sets {
            for id in &k.volumes {
                self.provider.delete(id)?;
            }
            let mut s = self.saved.lock();
            s.kept.retain(|x| x.gen != k.gen);
            self.save(&s)?;
        }
        Ok(sets.len())
    }

    /// Ask for a swap at the next step (`surge set NAME/burstable swap=...`).
    pub fn request_swap(&self, slots: Vec<usize>) {
        self.manual.lock().push(slots);
    }

    pub fn member_ids(&self) -> Vec<String> {
        self.slots.lock().iter().map(|s| s.member.clone()).collect()
    }

    /// Progress of the rebuilds in flight, by slot.
    pub fn rebuilds(&self) -> Vec<(usize, MirrorProgress)> {
        self.slots.lock().iter().enumerate().filter_map(|(i, s)| s.swap.as_ref().map(|w| (i, w.mirror.progress()))).collect()
    }

    pub fn swaps(&self) -> Vec<SwapRecord> {
        self.history.lock().clone()
    }

    pub fn decisions(&self) -> Vec<LoggedDecision> {
        self.log.lock().clone()
    }

    pub fn policy_views(&self) -> Vec<SlotView> {
        self.policy.lock().views().to_vec()
    }

    pub fn cache(&self) -> Option<&Arc<ElasticCache>> {
        self.cache.as_ref()
    }

    /// Cost so far of this volume's cloud volumes (deleted ones included).
    pub fn cost_usd(&self) -> f64 {
        let prefix = format!("{}-", self.p.name);
        self.provider.cost().map_or(0.0, |r| r.volumes.iter().filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix))).map(|v| v.usd).sum())
    }

    fn note_io(&self) {
        self.last_io_ns.store(self.clock.now().as_nanos() as u64 + 1, SeqCst);
    }

    /// A request starts: counted in flight and stamped *before* it takes the
    /// device, which an ephemeral reset relies on (`swap_all`).
    fn begin_io(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, SeqCst);
        self.started_io.fetch_add(1, SeqCst);
        self.note_io();
        InFlight(self)
    }

    fn dev(&self) -> Arc<dyn BlockDev> {
        match &self.cache {
            Some(c) => c.clone(),
            None => self.stripe.read().clone(),
        }
    }

    /// Why every FLUSH fails until acknowledged, if it does: a member's (or
    /// a migrating member's source's) flush failed after acknowledged writes.
    pub fn loss(&self) -> Option<String> {
        let mirrors = self.slots.lock().iter().filter_map(|s| s.swap.as_ref().and_then(|w| w.mirror.loss())).next();
        self.stripe.read().loss().or(mirrors)
    }

    /// The user accepts the loss: FLUSH works again. Returns what was lost.
    pub fn acknowledge_loss(&self) -> Option<String> {
        let mut lost = self.stripe.read().acknowledge_loss();
        for s in self.slots.lock().iter() {
            if let Some(w) = &s.swap {
                lost = lost.or(w.mirror.acknowledge_loss());
            }
        }
        lost
    }

    fn update_bars(&self) {
        if let Some(b) = self.bars.lock().as_mut() {
            b.update(&self.p.name, &self.rebuilds());
        }
    }
}

/// The exported size of a stripe of `stripe` bytes whose members bill
/// `billed` for the `asked` size: `asked`, scaled like the stripe when the
/// local cloud runs at reduced scale, in whole 4 KiB.
fn exported_size(stripe: u64, asked: u64, billed: u64) -> u64 {
    let v = (stripe as u128 * asked as u128 / billed.max(1) as u128) as u64;
    (v / 4096 * 4096).clamp(4096.min(stripe), stripe)
}

/// The attachment slots the stack needs (members, the fresh members of a
/// swap, a cache's backing) against what this instance has free (the
/// provider's figure, e.g. DescribeInstanceTypes, and the spec's
/// `attach_limit`); refuses what cannot swap. Lowers the policy's limit to
/// what is free. Returns where the limit came from.
fn check_slots(p: &mut BurstableParams, provider: &dyn Provider, own: &[String]) -> anyhow::Result<String> {
    let swap_all = p.mode != Mode::Persistent || p.policy.strategy == Strategy::AllAtOnce;
    let need = ebs::slots_needed(p.members, swap_all, p.mode == Mode::Cache);
    let (free, source) = match provider.attachment_slots()? {
        Some(s) if s.free_for(own) < p.policy.attach_limit => (s.free_for(own), s.source),
        _ => (p.policy.attach_limit, format!("attach_limit={}", p.policy.attach_limit)),
    };
    if need > free {
        let backing = usize::from(p.mode == Mode::Cache);
        let one = ebs::slots_needed(p.members, false, backing == 1);
        let fit = if swap_all { free.saturating_sub(backing) / 2 } else { free.saturating_sub(backing + 1) };
        let hint = if swap_all && p.mode == Mode::Persistent && one <= free {
            format!("strategy=one needs {one}; ")
        } else {
            String::new()
        };
        bail!(
            "{} members with {} swap target(s){} need {need} attachment slots, and this instance has {free} free ({source}); {hint}use fewer, larger members (members={} fits)",
            p.members,
            if swap_all { p.members } else { 1 },
            if p.mode == Mode::Cache { " and the backing volume" } else { "" },
            fit.max(1)
        );
    }
    p.policy.attach_limit = free;
    tracing::info!(volume = %p.name, need, free, %source, "burstable attachment slots");
    Ok(source)
}

/// What rounding each member up to a whole GiB (gp2's minimum step) adds to
/// the bill: billed bytes beyond the size asked, and their monthly list price.
pub fn rounding_cost(p: &BurstableParams) -> (u64, f64) {
    let billed = p.members as u64 * p.member.size;
    let extra = billed.saturating_sub(p.size);
    let per_gib = surge_cloud::PriceTable::default().usd_month(&p.member) / (p.member.size as f64 / (1u64 << 30) as f64);
    (extra, per_gib * extra as f64 / (1u64 << 30) as f64)
}

/// Create and attach volumes named `names` of `spec` in parallel (EBS attaches
/// concurrently); on any failure, delete what was made.
fn create_attach_all(provider: &Arc<dyn Provider>, clock: &Arc<dyn Clock>, spec: &VolumeSpec, names: &[String]) -> anyhow::Result<Vec<(String, Arc<dyn BlockDev>)>> {
    let results: Vec<anyhow::Result<(String, Arc<dyn BlockDev>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = names
            .iter()
            .map(|name| {
                s.spawn(move || -> anyhow::Result<(String, Arc<dyn BlockDev>)> {
                    let _t = ClockThread::enter(clock.clone());
                    let info = provider.create(CreateRequest { spec: spec.clone(), name: Some(name.clone()) })?;
                    match provider.attach(&info.id) {
                        Ok(d) => Ok((info.id, d)),
                        Err(e) => {
                            let _ = provider.delete(&info.id);
                            Err(e.into())
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("create/attach thread panicked")))).collect()
    });
    if results.iter().any(|r| r.is_err()) {
        for (id, _) in results.iter().flatten() {
            let _ = provider.detach(id);
            let _ = provider.delete(id);
        }
        return Err(results.into_iter().find_map(|r| r.err()).expect("an error"));
    }
    Ok(results.into_iter().flatten().collect())
}

fn resume_mirror(
    p: &BurstableParams,
    provider: &Arc<dyn Provider>,
    clock: &Arc<dyn Clock>,
    slot: usize,
    source: Arc<dyn BlockDev>,
    w: &SavedSwap,
) -> anyhow::Result<(String, Arc<dyn BlockDev>, Arc<Mirror>)> {
    let target_dev = provider.attach(&w.target)?;
    let path = BurstableVolume::mirror_path(&p.state_dir, slot);
    let meta = Arc::new(FileDev::open(&path, &Default::default()).with_context(|| format!("opening {}", path.display()))?);
    let m = Mirror::open(source, target_dev.clone(), meta, p.mirror, w.tag, clock.clone()).map_err(|e: MirrorError| {
        let _ = provider.detach(&w.target);
        anyhow::Error::from(e)
    })?;
    tracing::info!(slot, target = %w.target, copied = m.progress().copied_bytes, "resuming an interrupted rebuild");
    Ok((w.target.clone(), target_dev, Arc::new(m)))
}

fn load_state(dir: &Path) -> anyhow::Result<Option<Saved>> {
    let path = dir.join("state.json");
    match std::fs::read(&path) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).with_context(|| format!("{} is unreadable", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Write a temporary file, fsync, rename over state.json, fsync the directory.
fn save_state(dir: &Path, s: &Saved) -> anyhow::Result<()> {
    use std::io::Write;
    let (tmp, path) = (dir.join("state.json.tmp"), dir.join("state.json"));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&serde_json::to_vec_pretty(s)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

impl Drop for BurstableVolume {
    fn drop(&mut self) {
        self.stop();
    }
}

impl BlockDev for BurstableVolume {
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.dev().caps()
    }
    // The stripe may be larger than the export (members round up): every
    // request is held to the exported size.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, buf.len() as u64)?;
        let _io = self.begin_io();
        self.dev().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, buf.len() as u64)?;
        let _io = self.begin_io();
        self.dev().write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.dev().flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, len)?;
        let _io = self.begin_io();
        self.dev().discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, len)?;
        let _io = self.begin_io();
        self.dev().write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        surge_block::check_range(self.size, offset, len)?;
        self.dev().block_status(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.dev().may_wait_remote(offset, len, write)
    }
}

impl Controllable for BurstableVolume {
    fn name(&self) -> String {
        format!("{}/burstable", self.p.name)
    }
    fn kind(&self) -> String {
        "burstable".into()
    }
    fn status(&self) -> serde_json::Value {
        let views = self.policy_views();
        let rebuilds = self.rebuilds();
        let members: Vec<serde_json::Value> = self
            .slots
            .lock()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let c = match &self.credits {
                    Some(sc) => sc.estimate(&s.member).map(|e| CreditBalanceView::from(&e)),
                    None => self.provider.credits(&s.member).ok().map(|c| CreditBalanceView { ops: c.ops, percent: c.percent(), trusted: "provider", estimate: None }),
                };
                let rebuild = rebuilds.iter().find(|(j, _)| *j == i).map(|(_, p)| {
                    serde_json::json!({
                        "percent": (p.percent() * 10.0).round() / 10.0,
                        "eta_s": p.eta_s,
                        "copied_bytes": p.copied_bytes,
                        "size_bytes": p.size,
                        "rate_bps": p.rate_bps,
                        "resync_regions": p.resync_regions,
                        "dirty_regions": p.dirty_regions,
                    })
                });
                serde_json::json!({
                    "slot": i,
                    "volume": s.member,
                    "burst_balance_percent": c.as_ref().and_then(|c| c.percent),
                    "credits": c.as_ref().and_then(|c| c.ops),
                    // Which figure the policy trusted: the provider's exact
                    // balance (local cloud), surge's model, or CloudWatch's point.
                    "credits_trusted": c.as_ref().map(|c| c.trusted),
                    "credits_estimate": c.as_ref().and_then(|c| c.estimate.clone()),
                    "policy": views.get(i),
                    "swap_to": s.swap.as_ref().map(|w| w.target.clone()),
                    "rebuild": rebuild,
                })
            })
            .collect();
        let policy = self.policy.lock();
        let saved = self.saved.lock();
        serde_json::json!({
            "mode": self.p.mode,
            "strategy": self.p.policy.strategy,
            "member": self.p.member.to_string(),
            "size_bytes": self.size,
            "billed_bytes": self.p.members as u64 * self.p.member.size,
            "rounding_usd_month": rounding_cost(&self.p).1,
            "attach_limit": self.p.policy.attach_limit,
            "attach_limit_source": self.slots_source,
            "members": members,
            "rebuilds_in_flight": rebuilds.len(),
            "rebuild_rate_limit_bps": self.p.rebuild_rate,
            "waiting": policy.waiting(),
            "swap_time_s": policy.swap_time(),
            "cache": self.cache.as_ref().map(|c| c.stats()),
            "kept": saved.kept,
            "swaps_done": self.history.lock().len(),
            "last_swaps": self.history.lock().iter().rev().take(4).cloned().collect::<Vec<_>>(),
            "decisions": self.log.lock().iter().rev().take(6).cloned().collect::<Vec<_>>(),
            "usd_so_far": self.cost_usd(),
            "swap_failure": self.swap_failure.lock().as_ref().map(|f| serde_json::json!({
                "at_s": secs(f.at), "error": f.error, "retry_at_s": secs(f.retry_at), "attempts": f.attempts, "slots": f.slots,
                "effect": "no fresh member: the current ones keep serving",
            })),
            "failure": self.loss().map(|loss| serde_json::json!({
                "loss": loss,
                "action": format!("every FLUSH fails until the loss is acknowledged: surge set {} ack_lost=true", self.name()),
            })),
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "swap" => {
                let slots: Vec<usize> = if value == "all" {
                    (0..self.p.members).collect()
                } else {
                    let i: usize = value.parse().map_err(|_| format!("swap={value}: expected all or a slot number"))?;
                    if i >= self.p.members {
                        return Err(format!("no slot {i} (0..{})", self.p.members));
                    }
                    vec![i]
                };
                self.request_swap(slots);
                Ok(())
            }
            "rebuild_rate" => {
                let r = if value == "off" { None } else { Some(crate::stack::parse_rate(value).map_err(|e| e.to_string())?) };
                for s in self.slots.lock().iter() {
                    if let Some(w) = &s.swap {
                        w.mirror.set_rate_limit(r);
                    }
                }
                Ok(())
            }
            "release" => self.release(value).map(|_| ()).map_err(|e| format!("{e:#}")),
            "ack_lost" => match value {
                "true" | "yes" | "1" => match self.acknowledge_loss() {
                    Some(_) => Ok(()),
                    None => Err("no loss to acknowledge".into()),
                },
                _ => Err("ack_lost=true acknowledges writes a failed member flush may have dropped (FLUSH works again)".into()),
            },
            _ => Err(format!("{} has no setting {key:?} (settable: swap=all|SLOT, rebuild_rate=RATE|off, release=all|GEN, ack_lost=true)", self.name())),
        }
    }
}

/// A member's credits as `surge status` shows them.
struct CreditBalanceView {
    ops: Option<u64>,
    percent: Option<f64>,
    trusted: &'static str,
    estimate: Option<surge_policy::credits::Estimate>,
}

impl From<&surge_policy::credits::Estimate> for CreditBalanceView {
    fn from(e: &surge_policy::credits::Estimate) -> Self {
        use surge_policy::credits::Source;
        let trusted = match e.source {
            Source::Model => "model",
            Source::Cloudwatch => "cloudwatch",
            Source::Unknown => "unknown",
        };
        CreditBalanceView { ops: e.credits.map(|c| c as u64), percent: e.credits.map(|c| c * 100.0 / e.capacity.max(1.0)), trusted, estimate: Some(e.clone()) }
    }
}

/// Rebuild progress bars (indicatif) on stderr; hidden when it is not a terminal.
pub struct RebuildBars {
    multi: indicatif::MultiProgress,
    bars: Vec<(usize, indicatif::ProgressBar)>,
}

impl RebuildBars {
    pub fn new() -> Self {
        RebuildBars { multi: indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr()), bars: Vec::new() }
    }

    fn update(&mut self, volume: &str, rebuilds: &[(usize, MirrorProgress)]) {
        for (slot, p) in rebuilds {
            let bar = match self.bars.iter().find(|(s, _)| s == slot) {
                Some((_, b)) => b.clone(),
                None => {
                    let b = self.multi.add(indicatif::ProgressBar::new(p.size));
                    b.set_style(
                        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {msg}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                    b.set_prefix(format!("{volume} slot {slot} rebuild"));
                    self.bars.push((*slot, b.clone()));
                    b
                }
            };
            bar.set_position(p.copied_bytes);
            bar.set_message(match p.eta_s {
                Some(e) => format!("ETA {e:.0} s"),
                None => "starting".into(),
            });
        }
        self.bars.retain(|(s, b)| {
            let active = rebuilds.iter().any(|(r, _)| r == s);
            if !active {
                b.finish_and_clear();
            }
            active
        });
    }

    fn clear(&self) {
        for (_, b) in &self.bars {
            b.finish_and_clear();
        }
    }
}

impl Default for RebuildBars {
    fn default() -> Self {
        Self::new()
    }
}

/// `burstable:MODE,size=SIZE,members=N,...` (see the module docs). Volumes live
/// on the daemon's cloud (`--provider aws`: EBS), else in the local cloud of
/// the data directory.
pub fn build_burstable(name: &str, args: &str, ctx: &crate::stack::BuildContext) -> Result<crate::stack::Built, crate::stack::SpecError> {
    let p = parse_params(name, args, &ctx.data_dir)?;
    let err = |msg: String| crate::stack::SpecError::Args { kind: "burstable".into(), msg };
    let provider: Arc<dyn Provider> = match &ctx.cloud {
        Some(c) => c.clone(),
        None => {
            let mut cfg = surge_cloud::LocalConfig::new(crate::stack::volume::cloud_dir(&ctx.data_dir));
            cfg.delays.attach = p.policy.swap_setup;
            cfg.delays.detach = Duration::ZERO;
            Arc::new(surge_cloud::LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?)
        }
    };
    let vol = BurstableVolume::open(p.clone(), provider, ctx.clock.clone()).map_err(|e| err(format!("{e:#}")))?;
    vol.start();
    let (extra, usd) = rounding_cost(&p);
    let rounding = if extra > 0 && p.mode != Mode::Cache {
        tracing::warn!(
            volume = %name,
            "{} members of {} bill {} for the {} exported: {} more, ${usd:.2}/month at list price (members=1 would bill {})",
            p.members,
            p.member,
            crate::stack::format_size(p.members as u64 * p.member.size),
            crate::stack::format_size(p.size),
            crate::stack::format_size(extra),
            crate::stack::format_size(p.size.div_ceil(1 << 30).max(1) << 30)
        );
        format!("; billed {}, rounding adds ${usd:.2}/month", crate::stack::format_size(p.members as u64 * p.member.size))
    } else {
        String::new()
    };
    let detail = serde_json::json!({
        "mode": p.mode, "members": p.members, "member": p.member.to_string(), "chunk": p.chunk,
        "backing": p.backing.as_ref().map(|b| b.to_string()), "state_dir": p.state_dir,
        "size_bytes": vol.size(), "billed_bytes": p.members as u64 * p.member.size, "rounding_usd_month": usd,
    });
    let what = match p.mode {
        Mode::Persistent => "persistent",
        Mode::Cache => "cache",
        Mode::Ephemeral => "ephemeral",
    };
    let size = crate::stack::format_size(vol.size());
    // On a real cloud the members are detached when the daemon stops, so a
    // restart (or another instance) can attach them again.
    let dev: Arc<dyn BlockDev> = if ctx.cloud.is_some() { Arc::new(crate::stack::AtExit::new(vol.clone(), detach_all)) } else { vol.clone() };
    Ok(crate::stack::Built {
        dev,
        description: format!("burstable {what} volume of {size} over {} x {}{rounding}", p.members, p.member),
        detail,
        controls: vec![vol],
    })
}

/// At the daemon's exit on a real cloud: the controller stops and every
/// volume of the stack is detached (not deleted).
fn detach_all(v: &BurstableVolume) {
    v.stop();
    let ids: Vec<String> = {
        let slots = v.slots.lock();
        slots.iter().flat_map(|s| std::iter::once(s.member.clone()).chain(s.swap.as_ref().map(|w| w.target.clone()))).collect()
    };
    let backing = v.saved.lock().backing.clone();
    for id in ids.iter().chain(backing.as_ref()) {
        if let Err(e) = v.provider.detach(id) {
            tracing::error!(volume = %id, "detaching at exit: {e}");
        }
    }
}

/// Parse the spec's arguments (see the module docs).
pub fn parse_params(name: &str, args: &str, data_dir: &Path) -> Result<BurstableParams, crate::stack::SpecError> {
    use crate::stack::{parse_rate, Opts};
    let err = |msg: String| crate::stack::SpecError::Args { kind: "burstable".into(), msg };
    let mut o = Opts::parse("burstable", args)?;
    let mode: Mode = o.positional_required("MODE")?.parse().map_err(err)?;
    let size = o.take_size("size")?.ok_or_else(|| err("size=SIZE is required (the striped capacity, e.g. size=100GiB)".into()))?;
    let members: usize = o.take("members").map(|v| v.parse().map_err(|_| err(format!("members={v}: expected a count")))).transpose()?.unwrap_or(10);
    if members == 0 {
        return Err(err("members must be at least 1".into()));
    }
    let kind = o.take("type").unwrap_or_else(|| "gp2".into());
    let gib = (size.div_ceil(members as u64)).div_ceil(1 << 30).max(1);
    let member: VolumeSpec = format!("{kind}:{gib}GiB").parse().map_err(|e| err(format!("member volumes: {e}")))?;
    if !matches!(member.model, VolumeModel::Gp2 | VolumeModel::AzurePremium) {
        tracing::warn!("burstable members of type {kind} carry no operation credits: the policy will never swap them");
    }
    let chunk = o.take_size("chunk")?;
    let dur = |o: &mut Opts, k: &str, d: Duration| -> Result<Duration, crate::stack::SpecError> {
        o.take(k).map(|v| surge_block::units::parse_duration(&v).map_err(|e| err(format!("{k}={v}: {e}")))).transpose().map(|x| x.unwrap_or(d))
    };
    let tick = dur(&mut o, "tick", Duration::from_secs(5))?;
    let swap_setup = dur(&mut o, "attach_delay", Duration::from_secs(3))?;
    let min_interval = dur(&mut o, "min_interval", Duration::from_secs(60))?;
    let ephemeral_idle = dur(&mut o, "idle", Duration::from_secs(5))?;
    let cloudwatch_every = dur(&mut o, "cloudwatch_every", Duration::from_secs(60))?;
    let strategy: Strategy = o.take("strategy").map(|v| v.parse().map_err(err)).transpose()?.unwrap_or(Strategy::AllAtOnce);
    let swap_below = match o.take("swap_below").as_deref() {
        None | Some("auto") => None,
        Some(v) => {
            let pct: f64 = v.trim_end_matches('%').parse().map_err(|_| err(format!("swap_below={v}: expected auto or a percentage like 20%")))?;
            if !(0.0..=100.0).contains(&pct) {
                return Err(err(format!("swap_below={v}: a percentage between 0 and 100")));
            }
            Some(pct / 100.0)
        }
    };
    let margin: f64 = o.take("margin").map(|v| v.parse().map_err(|_| err(format!("margin={v}: expected a number like 1.5")))).transpose()?.unwrap_or(1.5);
    let rebuild_rate = match o.take("rebuild_rate").as_deref() {
        Some("off") => None,
        Some(v) => Some(parse_rate(v)?),
        None => Some(64 << 20),
    };
    let region = o.take_size("region")?.unwrap_or(1 << 20);
    let attach_limit: usize = o.take("attach_limit").map(|v| v.parse().map_err(|_| err(format!("attach_limit={v}: expected a count")))).transpose()?.unwrap_or(27);
    let backing: Option<VolumeSpec> = o.take("backing").map(|v| v.parse().map_err(|e| err(format!("backing={v}: {e}")))).transpose()?;
    let cache_block = o.take_size("block")?.unwrap_or(32 << 10);
    // A cache stripes at its block size: a block never straddles two members,
    // and consecutive blocks (a request's) rotate over all of them.
    let chunk = chunk.unwrap_or(if mode == Mode::Cache { cache_block } else { 64 << 10 });
    let keep = o.flag("keep")?;
    o.finish(&[
        "size", "members", "type", "chunk", "tick", "attach_delay", "min_interval", "idle", "strategy", "swap_below", "margin", "rebuild_rate", "region", "attach_limit",
        "backing", "block", "keep", "cloudwatch_every",
    ])?;
    if mode == Mode::Cache && backing.is_none() {
        return Err(err("cache mode needs backing=TYPE:SIZE (e.g. backing=st1:2TiB)".into()));
    }
    if mode != Mode::Cache && backing.is_some() {
        return Err(err("backing= is for cache mode only".into()));
    }
    if keep && mode != Mode::Ephemeral {
        return Err(err("keep is for ephemeral mode only".into()));
    }
    if strategy == Strategy::OneAtATime && mode != Mode::Persistent {
        return Err(err("strategy=one is for persistent mode: a cache or scratch stripe is replaced as a whole (see docs/burstable.md)".into()));
    }
    if !chunk.is_power_of_two() || chunk < 4096 || !region.is_power_of_two() || region < 4096 || !cache_block.is_power_of_two() || cache_block < 4096 {
        return Err(err("chunk, region and block must be powers of two of at least 4KiB".into()));
    }
    let policy = BurstableConfig {
        mode,
        strategy,
        member_size: member.size,
        swap_below,
        margin,
        auto_floor: 0.05,
        rebuild_rate: rebuild_rate.unwrap_or(member.shape().ok().and_then(|s| s.bps).unwrap_or(128 << 20)),
        op_size: surge_block::model::SSD_OP,
        swap_setup,
        attach_limit,
        min_interval,
        ephemeral_idle,
        tick,
    };
    Ok(BurstableParams {
        name: name.to_string(),
        mode,
        size,
        members,
        member,
        chunk,
        policy,
        mirror: MirrorConfig { region, ..MirrorConfig::default() },
        rebuild_rate,
        backing,
        cache_block,
        keep,
        tick,
        state_dir: data_dir.join("burstable").join(name),
        parallel: true,
        progress_bars: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        cloudwatch_every,
    })
}

#[cfg(test)]
#[path = "burstable_stress.rs"]
mod stress_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::{Delays, LocalConfig, LocalProvider};

    fn provider(dir: &Path, clock: Arc<dyn Clock>) -> Arc<LocalProvider> {
        let mut cfg = LocalConfig::new(dir.join("cloud"));
        cfg.delays = Delays::none();
        cfg.epoch_unix_ns = Some(0);
        cfg.scale = surge_block::model::Scale { rate: 1.0, time: 1.0 / 1024.0 }; // 1 GiB members hold 1 MiB
        Arc::new(LocalProvider::open(cfg, clock).unwrap())
    }

    fn params(dir: &Path, args: &str) -> BurstableParams {
        let mut p = parse_params("v", args, dir).unwrap();
        p.progress_bars = false;
        p.mirror.region = 64 << 10;
        p.mirror.persist_every = 128 << 10;
        p
    }

    fn open<C: Clock + 'static>(dir: &Path, args: &str, clock: &Arc<C>) -> (Arc<BurstableVolume>, Arc<LocalProvider>) {
        let prov = provider(dir, clock.clone());
        let v = BurstableVolume::open(params(dir, args), prov.clone(), clock.clone()).unwrap();
        (v, prov)
    }

    fn fill(v: &dyn BlockDev, seed: u8) -> Vec<u8> {
        let data: Vec<u8> = (0..v.size()).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        v.write_at(&data, 0, false).unwrap();
        data
    }

    fn read_all(v: &dyn BlockDev) -> Vec<u8> {
        let mut b = vec![0u8; v.size() as usize];
        v.read_at(&mut b, 0).unwrap();
        b
    }

    fn run_swaps(v: &BurstableVolume) {
        for _ in 0..1000 {
            v.step().unwrap();
            if v.rebuilds().is_empty() && v.manual.lock().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("swaps did not finish");
    }

    #[test]
    fn specs_parse_with_defaults_and_refuse_what_does_not_fit() {
        let d = Path::new("/d");
        let p = parse_params("v", "persistent,size=100GiB", d).unwrap();
        assert_eq!((p.members, p.member.to_string(), p.chunk), (10, "gp2:10GiB".to_string(), 64 << 10));
        assert_eq!(p.rebuild_rate, Some(64 << 20));
        assert_eq!(p.state_dir, Path::new("/d/burstable/v"));
        let p = parse_params("v", "cache,size=100GiB,backing=st1:2TiB,swap_below=10%,block=32KiB", d).unwrap();
        assert_eq!(p.policy.swap_below, Some(0.1));
        for (bad, why) in [
            ("cache,size=1GiB", "backing"),
            ("persistent,size=1GiB,keep", "ephemeral"),
            ("cache,size=1GiB,backing=st1:1TiB,strategy=one", "persistent"),
            ("persistent,members=2", "size="),
            ("persistent,size=1GiB,swap_below=150%", "between"),
            ("raid,size=1GiB", "persistent"),
            ("persistent,size=1GiB,color=blue", "color"),
        ] {
            let e = parse_params("v", bad, d).err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_persistent_swap_migrates_every_member_online_and_deletes_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "persistent,size=4GiB,members=4,rebuild_rate=off", &clock);
        assert_eq!(v.size(), 4 << 20);
        let data = fill(v.as_ref(), 1);
        let before = v.member_ids();
        v.request_swap(vec![0, 1, 2, 3]);
        v.step().unwrap();
        assert_eq!(v.rebuilds().len(), 4, "four rebuilds in flight");
        // Writes during the rebuild reach both legs.
        v.write_at(&[9u8; 8192], 4096, false).unwrap();
        let mut want = data.clone();
        want[4096..4096 + 8192].fill(9);
        run_swaps(&v);
        let after = v.member_ids();
        assert!(before.iter().all(|b| !after.contains(b)), "{before:?} -> {after:?}");
        assert_eq!(read_all(v.as_ref()), want);
        let live: Vec<String> = prov.list().unwrap().into_iter().map(|i| i.id).collect();
        assert!(before.iter().all(|b| !live.contains(b)), "old members are deleted: {live:?}");
        assert_eq!(v.swaps().len(), 4);
        // A restart finds the new members and the same data.
        drop(v);
        let (v, _) = open(dir.path(), "persistent,size=4GiB,members=4,rebuild_rate=off", &clock);
        assert_eq!(v.member_ids(), after);
        assert_eq!(read_all(v.as_ref()), want);
    }

    #[test]
    fn an_interrupted_rebuild_resumes_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(surge_block::SystemClock::new());
        let spec = "persistent,size=2GiB,members=2,rebuild_rate=1MiB/s";
        let (v, _) = open(dir.path(), spec, &clock);
        let data = fill(v.as_ref(), 2);
        v.request_swap(vec![1]);
        v.step().unwrap();
        assert_eq!(v.rebuilds().len(), 1);
        std::thread::sleep(Duration::from_millis(150));
        v.stop(); // the process goes away mid-rebuild (state and record stay)
        let copied = v.rebuilds()[0].1.copied_bytes;
        assert!(copied > 0 && copied < 1 << 20, "stopped mid-rebuild: {copied}");
        drop(v);
        let (v, _) = open(dir.path(), spec, &clock);
        assert_eq!(v.rebuilds().len(), 1, "the swap resumes");
        assert!(v.rebuilds()[0].1.copied_bytes > 0, "from its recorded position");
        assert_eq!(read_all(v.as_ref()), data);
        v.slots.lock()[1].swap.as_ref().unwrap().mirror.set_rate_limit(None);
        run_swaps(&v);
        assert_eq!(read_all(v.as_ref()), data);
        assert_eq!(v.swaps().len(), 1);
    }

    /// A write is on its way to a finished mirror's target when the swap is
    /// completed; the target fails it (after the completion check of old).
    /// The source then holds the only copy: the swap must keep it, and the
    /// write must read back, now and after a restart.
    #[test]
    fn a_target_failing_while_a_swap_completes_never_costs_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(surge_block::SystemClock::new());
        let spec = "persistent,size=2GiB,members=2,rebuild_rate=off";
        let prov = Arc::new(surge_cloud::FaultyProvider::new(provider(dir.path(), clock.clone()), clock.clone()));
        let v = BurstableVolume::open(params(dir.path(), spec), prov.clone(), clock.clone()).unwrap();
        let data = fill(v.as_ref(), 3);
        v.request_swap(vec![0]);
        v.step().unwrap();
        let (mirror, target) = {
            let s = v.slots.lock();
            let w = s[0].swap.as_ref().expect("swapping");
            (w.mirror.clone(), w.target.clone())
        };
        while mirror.rebuild_step().unwrap() != surge_block::mirror::Step::Done {}
        let source = v.member_ids()[0].clone();
        // The target now fails every write, a little later than it is issued.
        prov.fault(&target).unwrap().set_rules("write.latency=300ms,write.fail_prob=1".parse().unwrap());
        let writer = {
            let v = v.clone();
            std::thread::spawn(move || v.write_at(&[0xEE; 4096], 0, false)) // chunk 0: slot 0
        };
        std::thread::sleep(Duration::from_millis(50));
        v.step().unwrap();
        writer.join().unwrap().expect("the source took the write");
        let mut want = data.clone();
        want[..4096].fill(0xEE);
        assert!(read_all(v.as_ref())[..4096] == want[..4096], "the write is gone: the failed target replaced the source");
        assert_eq!(v.member_ids()[0], source, "the source stays the member");
        v.stop();
        drop(v);
        drop(prov);
        let (v, _) = open(dir.path(), spec, &clock);
        assert!(read_all(v.as_ref()) == want, "after a restart the data differs");
    }

    #[test]
    fn a_volume_left_by_a_crash_before_the_state_named_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "persistent,size=2GiB,members=2", &clock);
        drop(v);
        prov.create(CreateRequest { spec: "gp2:1GiB".parse().unwrap(), name: Some("v-s0-g7".into()) }).unwrap();
        drop(prov);
        let (_v, prov) = open(dir.path(), "persistent,size=2GiB,members=2", &clock);
        assert!(prov.list().unwrap().iter().all(|i| i.name.as_deref() != Some("v-s0-g7")));
    }

    #[test]
    fn a_cache_swap_replaces_all_members_and_keeps_serving_the_backing_data() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "cache,size=2GiB,members=2,backing=st1:1TiB,block=4KiB", &clock);
        assert_eq!(v.size(), 1 << 30, "the backing volume's size (scaled)");
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
        v.write_at(&data, 0, false).unwrap();
        let mut got = vec![0u8; data.len()];
        v.read_at(&mut got, 0).unwrap();
        let before = v.member_ids();
        v.request_swap((0..2).collect());
        v.step().unwrap();
        assert!(v.member_ids().iter().all(|m| !before.contains(m)));
        assert_eq!(v.cache().unwrap().stats().used_bytes, 0, "a fresh cache is empty");
        v.read_at(&mut got, 0).unwrap();
        assert_eq!(got, data);
        let live: Vec<String> = prov.list().unwrap().into_iter().map(|i| i.id).collect();
        assert!(before.iter().all(|b| !live.contains(b)));
    }

    #[test]
    fn an_ephemeral_swap_starts_empty_and_keeps_the_old_set_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "ephemeral,size=2GiB,members=2,keep", &clock);
        fill(v.as_ref(), 3);
        let before = v.member_ids();
        v.request_swap(vec![0, 1]);
        v.step().unwrap();
        assert!(read_all(v.as_ref()).iter().all(|&b| b == 0), "fresh scratch space");
        let kept = prov.list().unwrap().into_iter().filter(|i| before.contains(&i.id)).count();
        assert_eq!(kept, 2, "old members kept (detached)");
        assert!(v.set("release", "all").is_ok());
        assert!(prov.list().unwrap().iter().all(|i| !before.contains(&i.id)));
        assert!(v.set("release", "all").is_err());
    }

    /// A spent ephemeral volume, idle long enough for a reset, over a
    /// provider that runs `during_attach` while each fresh member attaches.
    fn spent_ephemeral(dir: &Path, clock: &Arc<VirtualClock>, during_attach: Arc<dyn Fn() + Send + Sync>) -> (Arc<BurstableVolume>, Arc<LocalProvider>) {
        let local = provider(dir, clock.clone());
        let wrap: surge_cloud::faulty::Wrap = Box::new(move |dev| {
            during_attach();
            dev
        });
        let faulty: Arc<dyn Provider> = Arc::new(surge_cloud::FaultyProvider::with_wrap(local.clone(), clock.clone(), wrap));
        let v = BurstableVolume::open(params(dir, "ephemeral,size=2GiB,members=2,idle=5s,min_interval=0s,swap_below=50%"), faulty, clock.clone()).unwrap();
        (v, local)
    }

    /// Spend every member's credits between two controller steps, so the
    /// policy sees them drain; then 6 s of idle time (they earn a little back).
    fn spend_credits(v: &BurstableVolume, local: &LocalProvider, clock: &VirtualClock) {
        v.step().unwrap();
        for id in v.member_ids() {
            local.model(&id).unwrap().set_credits(Some(0), None);
        }
        clock.advance(Duration::from_secs(6));
    }

    #[test]
    fn an_ephemeral_reset_is_called_off_when_data_arrives_while_the_fresh_set_attaches() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let cell: Arc<std::sync::OnceLock<std::sync::Weak<BurstableVolume>>> = Default::default();
        let writer = cell.clone();
        let hook: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(v) = writer.get().and_then(|w| w.upgrade()) {
                v.write_at(&[0x5a; 4096], 8192, false).unwrap();
            }
        });
        let (v, local) = spent_ephemeral(dir.path(), &clock, hook);
        let data = fill(v.as_ref(), 9);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        let _ = cell.set(Arc::downgrade(&v));
        v.step().unwrap();
        assert_eq!(v.member_ids(), before, "the reset was called off");
        assert!(v.decisions().iter().any(|d| d.reason.contains("called off")), "{:?}", v.decisions());
        let mut want = data;
        want[8192..8192 + 4096].fill(0x5a);
        assert!(read_all(v.as_ref()) == want, "what was there and what came during the attach are both kept");
        assert_eq!(local.list().unwrap().len(), 2, "the fresh members were deleted");
    }

    /// Item 6 for the burstable path: the cloud refuses the fresh member
    /// (InsufficientVolumeCapacity, VolumeLimitExceeded on AWS; an injected
    /// failure here). The old members keep serving, status says why and when
    /// the swap is tried again, the policy's swap waits out a backoff (not
    /// one attempt per tick), and the retry after it succeeds.
    #[test]
    fn a_refused_fresh_member_keeps_the_old_one_serving_and_is_retried_after_a_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let args = "persistent,size=2GiB,members=2,rebuild_rate=off,min_interval=0s,swap_below=50%";
        let (v, local) = open(dir.path(), args, &clock);
        let data = fill(v.as_ref(), 3);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        local.inject_failure(surge_cloud::Action::Create, 0);
        local.inject_failure(surge_cloud::Action::Create, 0);
        v.step().unwrap();
        let st = v.status();
        let f = &st["swap_failure"];
        assert_eq!(f["attempts"], 1, "{st}");
        assert!(f["error"].as_str().unwrap().contains("injected failure"), "{f}");
        assert!(f["effect"].as_str().unwrap().contains("keep serving"), "{f}");
        assert_eq!(v.member_ids(), before);
        assert!(read_all(v.as_ref()) == data, "the old members serve");
        // Ticks within the 1 s backoff try nothing.
        for _ in 0..4 {
            clock.advance(Duration::from_millis(200));
            v.step().unwrap();
        }
        assert_eq!(v.status()["swap_failure"]["attempts"], 1, "not retried before the backoff");
        assert_eq!(local.list().unwrap().len(), 2, "what the refused swaps made was deleted");
        clock.advance(Duration::from_millis(300));
        v.step().unwrap();
        assert_eq!(v.status()["swap_failure"]["attempts"], 2, "retried after 1 s, refused again");
        clock.advance(Duration::from_secs(1));
        v.step().unwrap();
        assert_eq!(v.status()["swap_failure"]["attempts"], 2, "the second backoff is 2 s");
        clock.advance(Duration::from_secs(1));
        v.write_at(&[0x77; 4096], 0, false).unwrap();
        run_swaps(&v);
        assert!(v.status()["swap_failure"].is_null(), "cleared by the swap that started");
        assert!(v.member_ids().iter().any(|m| !before.contains(m)), "a member was swapped: {before:?} -> {:?}", v.member_ids());
        let mut want = data;
        want[..4096].fill(0x77);
        assert!(read_all(v.as_ref()) == want);
        assert_eq!(local.list().unwrap().len(), 2, "the old members were deleted");
    }

    #[test]
    fn an_idle_ephemeral_volume_is_reset_by_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, local) = spent_ephemeral(dir.path(), &clock, Arc::new(|| {}));
        fill(v.as_ref(), 4);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        v.step().unwrap();
        let after = v.member_ids();
        assert!(after.iter().all(|id| !before.contains(id)), "every member replaced: {before:?} -> {after:?}");
        assert!(read_all(v.as_ref()).iter().all(|&b| b == 0), "fresh scratch space");
        assert_eq!(local.list().unwrap().len(), 2, "the spent members were deleted");
    }

    #[test]
    fn the_export_has_the_size_asked_for_and_says_what_rounding_costs() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        // Full scale (sparse files); a new provider per open, as a restarted daemon's.
        let prov = || {
            let mut cfg = LocalConfig::new(dir.path().join("cloud"));
            cfg.delays = Delays::none();
            Arc::new(LocalProvider::open(cfg, clock.clone()).unwrap())
        };
        let p = params(dir.path(), "persistent,size=256MiB,members=4");
        assert_eq!(p.member.to_string(), "gp2:1GiB", "each member rounds up to gp2's 1 GiB");
        let (extra, usd) = rounding_cost(&p);
        assert_eq!(extra, (4 << 30) - (256 << 20));
        assert!((usd - 0.375).abs() < 1e-9, "3.75 GiB of gp2 at $0.10: {usd}");
        let v = BurstableVolume::open(p, prov(), clock.clone()).unwrap();
        assert_eq!(v.size(), 256 << 20, "the size asked for, not the 4 GiB stripe");
        v.write_at(&[7u8; 4096], (256 << 20) - 4096, true).unwrap();
        assert!(v.write_at(&[7u8; 4096], 256 << 20, true).is_err(), "past the export");
        assert!(v.read_at(&mut [0u8; 8192], (256 << 20) - 4096).is_err());
        assert_eq!(v.status()["billed_bytes"], 4u64 << 30);
        drop(v);
        // A restart may grow the export within the stripe, never shrink it.
        let v = BurstableVolume::open(params(dir.path(), "persistent,size=512MiB,members=4"), prov(), clock.clone()).unwrap();
        assert_eq!(v.size(), 512 << 20);
        drop(v);
        let e = BurstableVolume::open(params(dir.path(), "persistent,size=256MiB,members=4"), prov(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("never shrinks"), "{e}");
        // Through the builder: the description says what rounding costs.
        let d2 = tempfile::tempdir().unwrap();
        let ctx = crate::stack::BuildContext::new(d2.path().to_path_buf(), Arc::new(VirtualClock::new()));
        let b = build_burstable("r", "persistent,size=256MiB,members=4,attach_delay=0s", &ctx).unwrap();
        assert_eq!(b.dev.size(), 256 << 20);
        assert!(b.description.contains("of 256MiB over 4 x gp2:1GiB; billed 4GiB, rounding adds $0.38/month"), "{}", b.description);
    }

    /// A local cloud that reports this instance's attachment slots.
    struct Slotted(Arc<LocalProvider>, surge_cloud::AttachmentSlots);

    impl Provider for Slotted {
        fn create(&self, r: CreateRequest) -> Result<surge_cloud::VolumeInfo, surge_cloud::CloudError> {
            self.0.create(r)
        }
        fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>, surge_cloud::CloudError> {
            self.0.attach(id)
        }
        fn detach(&self, id: &str) -> Result<(), surge_cloud::CloudError> {
            self.0.detach(id)
        }
        fn delete(&self, id: &str) -> Result<(), surge_cloud::CloudError> {
            self.0.delete(id)
        }
        fn list(&self) -> Result<Vec<surge_cloud::VolumeInfo>, surge_cloud::CloudError> {
            self.0.list()
        }
        fn describe(&self, id: &str) -> Result<surge_cloud::VolumeInfo, surge_cloud::CloudError> {
            self.0.describe(id)
        }
        fn cost(&self) -> Result<surge_cloud::CostReport, surge_cloud::CloudError> {
            self.0.cost()
        }
        fn attachment_slots(&self) -> Result<Option<surge_cloud::AttachmentSlots>, surge_cloud::CloudError> {
            Ok(Some(self.1.clone()))
        }
    }

    #[test]
    fn members_and_swap_targets_must_fit_the_instance_attachment_slots() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        // 8 slots, one taken by a second network interface, one by the root volume: 6 free.
        let slots = surge_cloud::AttachmentSlots { total: 8, taken_by_others: 1, attached_volumes: vec!["vol-root".into()], source: "test instance".into() };
        let prov: Arc<dyn Provider> = Arc::new(Slotted(provider(dir.path(), clock.clone()), slots));
        let e = BurstableVolume::open(params(dir.path(), "persistent,size=4GiB,members=4"), prov.clone(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("need 8 attachment slots") && e.contains("6 free (test instance)") && e.contains("strategy=one needs 5"), "{e}");
        assert!(prov.list().unwrap().is_empty(), "refused before creating anything");
        let e = BurstableVolume::open(params(dir.path(), "cache,size=4GiB,members=4,backing=st1:1TiB"), prov.clone(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("need 9 attachment slots") && e.contains("members=2 fits"), "{e}");
        let v = BurstableVolume::open(params(dir.path(), "persistent,size=4GiB,members=4,strategy=one"), prov.clone(), clock.clone()).unwrap();
        assert_eq!(v.p.policy.attach_limit, 6, "the policy swaps within what is free");
        assert_eq!(v.status()["attach_limit_source"], "test instance");
    }
}
