//! Elastic volumes: a slow backing cloud volume plus short-lived fast cache
//! volumes, provisioned, drained and deleted by the elastic policy.
//!
//! [`ElasticVolume`] is the daemon side: it owns the cache layer
//! (`surge_block::cache`), asks the pure policy (`surge_policy::elastic`) what to
//! do once per tick, and applies its decisions through the cloud [`Provider`].
//! Every decision is logged with its reason and kept for `surge status`.
//!
//! Spec form (one line): `elastic:backing=reserved:50GiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s`
//! plus optional `ut=0.3,window=5s,id=30s,initial=10GiB,min=1GiB,max=64GiB,block=64KiB,learn=true`.

use crate::control::Controllable;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::{CacheConfig, CacheMode, ElasticCache, Flusher, Phase};
use surge_block::model::VolumeModel;
use surge_block::{BlockDev, Caps, Clock, Counted, ZeroMode};
use surge_cloud::{CreateRequest, Provider, VolumeSpec};
use surge_policy::{Action, CacheObs, Decision, ElasticConfig, ElasticPolicy, State};

#[derive(Debug, Clone)]
pub struct ElasticParams {
    /// Prefix of the cloud volume names (`NAME-backing`, `NAME-cache-N`).
    pub name: String,
    pub backing: VolumeSpec,
    /// Reserved bandwidth of the cache volumes, bytes/s.
    pub cache_bw: u64,
    pub policy: ElasticConfig,
    pub cache: CacheConfig,
    /// How often the controller feeds the policy.
    pub tick: Duration,
    /// How often the background flusher looks for work when idle.
    pub flusher_poll: Duration,
}

/// One entry of the decision log.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedDecision {
    pub at_s: f64,
    #[serde(flatten)]
    pub action: Action,
    pub reason: String,
}

struct CacheVol {
    id: String,
    size: u64,
    io: Arc<Counted>,
}

pub struct ElasticVolume {
    p: ElasticParams,
    provider: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    cache: Arc<ElasticCache>,
    backing_id: String,
    backing_io: Arc<Counted>,
    vol: Mutex<Option<CacheVol>>,
    /// Device bytes of cache volumes already deleted.
    old_cache_bytes: AtomicU64,
    app_bytes: AtomicU64,
    policy: Mutex<ElasticPolicy>,
    log: Mutex<Vec<LoggedDecision>>,
    sizes: Mutex<Vec<u64>>,
    cache_seq: AtomicU64,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    flusher: Mutex<Option<Flusher>>,
}

fn io_total(c: &Counted) -> u64 {
    let s = c.stats();
    s.read_bytes + s.write_bytes
}

impl ElasticVolume {
    /// Open (or create) the backing volume; a leftover cache volume from a
    /// crashed run is reattached, recovered and drained.
    pub fn open(p: ElasticParams, provider: Arc<dyn Provider>, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<Self>> {
        let backing_name = format!("{}-backing", p.name);
        let vols = provider.list()?;
        let backing_id = match vols.iter().find(|v| v.name.as_deref() == Some(&backing_name)) {
            Some(v) => v.id.clone(),
            None => provider.create(CreateRequest { spec: p.backing.clone(), name: Some(backing_name) })?.id,
        };
        let backing_io = Arc::new(Counted::new(provider.attach(&backing_id)?));
        let prefix = format!("{}-cache-", p.name);
        let mut leftovers: Vec<_> = vols.iter().filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix))).collect();
        leftovers.sort_by_key(|v| v.created_unix_ms);
        let mut vol = None;
        let cache = match leftovers.pop() {
            Some(v) => {
                let dev = Arc::new(Counted::new(provider.attach(&v.id)?));
                let c = ElasticCache::open(backing_io.clone(), dev.clone(), p.cache.clone(), clock.clone())?;
                tracing::warn!(volume = %v.id, dirty = c.stats().dirty_bytes, "recovered a cache volume left by a previous run; draining it");
                c.set_phase(Phase::Drain);
                vol = Some(CacheVol { id: v.id.clone(), size: v.size, io: dev });
                c
            }
            None => ElasticCache::new(backing_io.clone(), p.cache.clone(), clock.clone()),
        };
        for v in leftovers {
            tracing::warn!(volume = %v.id, "deleting an older leftover cache volume");
            let _ = provider.detach(&v.id);
            provider.delete(&v.id)?;
        }
        let mut policy = ElasticPolicy::new(p.policy.clone());
        if let Some(v) = &vol {
            policy.resume_drain(clock.now(), v.size);
        }
        Ok(Arc::new(ElasticVolume {
            cache: Arc::new(cache),
            backing_id,
            backing_io,
            vol: Mutex::new(vol),
            old_cache_bytes: AtomicU64::new(0),
            app_bytes: AtomicU64::new(0),
            policy: Mutex::new(policy),
            log: Mutex::new(Vec::new()),
            sizes: Mutex::new(Vec::new()),
            cache_seq: AtomicU64::new(0),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            flusher: Mutex::new(None),
            p,
            provider,
            clock,
        }))
    }

    /// Start the controller and the background flusher.
    pub fn start(self: &Arc<Self>) {
        *self.flusher.lock() = Some(Flusher::spawn(self.cache.clone(), self.p.flusher_poll));
        let me = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("elastic-{}", self.p.name))
            .spawn(move || {
                let mut next = me.clock.now();
                while !me.stop.load(Relaxed) {
                    if let Err(e) = me.step() {
                        tracing::error!(volume = %me.p.name, "elastic controller: {e:#}");
                    }
                    next += me.p.tick;
                    let now = me.clock.now();
                    if next < now {
                        next = now;
                    }
                    me.clock.sleep_until(next);
                }
            })
            .expect("spawn controller");
        self.threads.lock().push(t);
    }

    /// Stop the controller and flusher (the cache stays as it is).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.flusher.lock().take();
    }

    fn obs(&self) -> CacheObs {
        let s = self.cache.stats();
        CacheObs { attached: s.attached, dirty_bytes: s.dirty_bytes, used_high_bytes: s.used_high_bytes, evicted_bytes: s.evictions * s.block_size }
    }

    /// One controller step: feed the policy, apply what it decides.
    pub fn step(&self) -> anyhow::Result<()> {
        self.drop_failed_cache()?;
        let now = self.clock.now();
        let decisions = self.policy.lock().tick(now, self.app_bytes.load(Relaxed), self.obs());
        for d in decisions {
            self.apply(d)?;
        }
        Ok(())
    }

    fn record(&self, d: &Decision) {
        tracing::info!(volume = %self.p.name, action = ?d.action, reason = %d.reason, "elastic decision");
        self.log.lock().push(LoggedDecision { at_s: d.at.as_secs_f64(), action: d.action.clone(), reason: d.reason.clone() });
    }

    fn apply(&self, d: Decision) -> anyhow::Result<()> {
        self.record(&d);
        match d.action {
            Action::Provision { size } => match self.provision(size) {
                Ok(()) => {
                    self.cache.reset_used_high();
                    let obs = self.obs();
                    self.policy.lock().attached(self.clock.now(), size, obs);
                }
                Err(e) => {
                    self.policy.lock().provision_failed(self.clock.now());
                    return Err(e.context("provisioning a cache volume"));
                }
            },
            Action::StartDrain => self.cache.set_phase(Phase::Drain),
            Action::Resume => self.cache.set_phase(Phase::Boost),
            Action::Detach => {
                self.release()?;
                self.policy.lock().detached(self.clock.now());
            }
            Action::DetachFailed { .. } => {}
        }
        Ok(())
    }

    fn provision(&self, size: u64) -> anyhow::Result<()> {
        let n = self.cache_seq.fetch_add(1, Relaxed);
        let spec = VolumeSpec { model: VolumeModel::Reserved { bw: Some(self.p.cache_bw), iops: None }, size, latency: Duration::ZERO };
        let name = format!("{}-cache-{n}", self.p.name);
        let info = self.provider.create(CreateRequest { spec, name: Some(name) })?;
        let dev = match self.provider.attach(&info.id) {
            Ok(d) => Arc::new(Counted::new(d)),
            Err(e) => {
                let _ = self.provider.delete(&info.id);
                return Err(e.into());
            }
        };
        if let Err(e) = self.cache.attach(dev.clone()) {
            let _ = self.provider.detach(&info.id);
            let _ = self.provider.delete(&info.id);
            return Err(e.into());
        }
        self.cache.set_phase(Phase::Boost);
        self.sizes.lock().push(size);
        *self.vol.lock() = Some(CacheVol { id: info.id, size, io: dev });
        Ok(())
    }

    /// The cache layer fell back to backing (its device failed): delete that
    /// volume. Its metadata may still name dirty blocks that were saved to
    /// backing and rewritten since, so a restart must never reopen it. The
    /// policy starts over from Idle.
    fn drop_failed_cache(&self) -> anyhow::Result<()> {
        if self.cache.is_attached() {
            return Ok(());
        }
        let Some(v) = self.vol.lock().take() else { return Ok(()) };
        tracing::error!(volume = %v.id, "cache volume failed over to backing; deleting it");
        self.old_cache_bytes.fetch_add(io_total(&v.io), Relaxed);
        self.policy.lock().detached(self.clock.now());
        let _ = self.provider.detach(&v.id);
        self.provider.delete(&v.id)?;
        Ok(())
    }

    /// Detach (only when clean) and delete the cache volume.
    fn release(&self) -> anyhow::Result<()> {
        self.cache.detach()?;
        if let Some(v) = self.vol.lock().take() {
            self.old_cache_bytes.fetch_add(io_total(&v.io), Relaxed);
            self.provider.detach(&v.id)?;
            self.provider.delete(&v.id)?;
        }
        Ok(())
    }

    pub fn cache(&self) -> &Arc<ElasticCache> {
        &self.cache
    }
    pub fn backing_id(&self) -> &str {
        &self.backing_id
    }
    /// Size of the attached cache volume (0 if none).
    pub fn cache_size(&self) -> u64 {
        self.vol.lock().as_ref().map_or(0, |v| v.size)
    }
    /// Bytes the application read and wrote.
    pub fn app_bytes(&self) -> u64 {
        self.app_bytes.load(Relaxed)
    }
    /// Bytes moved on all cloud volumes (backing and caches), reads and writes.
    pub fn device_bytes(&self) -> u64 {
        io_total(&self.backing_io) + self.old_cache_bytes.load(Relaxed) + self.vol.lock().as_ref().map_or(0, |v| io_total(&v.io))
    }
    pub fn decisions(&self) -> Vec<LoggedDecision> {
        self.log.lock().clone()
    }
    /// Size of every cache provisioned so far, in order.
    pub fn cache_sizes(&self) -> Vec<u64> {
        self.sizes.lock().clone()
    }
    pub fn policy_state(&self) -> State {
        self.policy.lock().state()
    }

    /// Cost of this volume's cloud volumes so far (all of them, deleted ones too).
    pub fn cost(&self) -> Option<(f64, f64)> {
        let prefix = format!("{}-", self.p.name);
        let r = self.provider.cost().ok()?;
        let mine = r.volumes.iter().filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix)));
        Some(mine.fold((0.0, 0.0), |(a, u), v| (a + v.agbs.unwrap_or(0.0), u + v.usd)))
    }

    fn count(&self, n: usize) {
        self.app_bytes.fetch_add(n as u64, Relaxed);
    }
}

impl Drop for ElasticVolume {
    fn drop(&mut self) {
        self.stop();
    }
}

impl BlockDev for ElasticVolume {
    fn size(&self) -> u64 {
        self.cache.size()
    }
    fn caps(&self) -> Caps {
        self.cache.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.cache.read_at(buf, offset)?;
        self.count(buf.len());
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.cache.write_at(buf, offset, fua)?;
        self.count(buf.len());
        Ok(())
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.cache.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        self.cache.write_zeroes(offset, len, mode)?;
        self.count(len as usize);
        Ok(())
    }
}

impl Controllable for ElasticVolume {
    fn name(&self) -> String {
        format!("{}/elastic", self.p.name)
    }
    fn kind(&self) -> String {
        "elastic".into()
    }
    fn status(&self) -> serde_json::Value {
        let s = self.cache.stats();
        let (agbs, usd) = self.cost().unwrap_or_default();
        let policy = self.policy.lock();
        let log = self.log.lock();
        serde_json::json!({
            "state": policy.state(),
            "utilization": policy.last_utilization(),
            "next_cache_size": policy.next_size(),
            "phase": s.phase,
            "mode": s.mode,
            "cache_volume": self.vol.lock().as_ref().map(|v| serde_json::json!({"id": v.id, "size": v.size})),
            "cache_size": self.cache_size(),
            "dirty_bytes": s.dirty_bytes,
            "drain": {"flushed_bytes": s.flushed_bytes, "dirty_bytes": s.dirty_bytes, "eta_s": s.drain_eta_s},
            "stats": s,
            "cost": {"agbs": agbs, "usd": usd},
            "cache_sizes": *self.sizes.lock(),
            "decisions": log.iter().rev().take(8).collect::<Vec<_>>(),
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "mode" => {
                self.cache.set_mode(value.parse::<CacheMode>()?);
                Ok(())
            }
            _ => Err(format!("{} has no setting {key:?} (settable: mode)", self.name())),
        }
    }
}

/// `elastic:backing=TYPE:SIZE[,bw=..,iops=..,lat=..],cache=reserved,cache_bw=RATE[,ut=0.3,window=5s,
/// id=30s,initial=10GiB,min=1GiB,max=64GiB,granularity=1GiB,block=64KiB,learn=true,attach_delay=3s,
/// mode=writeback,seq_bypass=SIZE]`. Keys after `backing=` that describe a volume (`bw`, `iops`,
/// `lat`) belong to the backing volume. Volumes live in the local cloud of the data directory.
pub fn build_elastic(name: &str, args: &str, ctx: &crate::stack::BuildContext) -> Result<crate::stack::Built, crate::stack::SpecError> {
    use surge_cloud::spec::{parse_duration, parse_rate, parse_size};
    let err = |msg: String| crate::stack::SpecError::Args { kind: "elastic".into(), msg };
    let (mut backing, mut cache_kind, mut cache_bw) = (None::<String>, None::<String>, None::<u64>);
    let mut pol = ElasticConfig::default();
    let mut cache = CacheConfig::default();
    let mut attach_delay = None;
    let ratio = |v: &str| v.parse::<f64>().map_err(|_| err(format!("ut={v}: expected a fraction like 0.3")));
    for item in args.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| err(format!("{item:?} is not key=value")))?;
        let size = || parse_size(v).map_err(|e| err(format!("{k}={v}: {e}")));
        let dur = || parse_duration(v).map_err(|e| err(format!("{k}={v}: {e}")));
        match k {
            "backing" => backing = Some(v.to_string()),
            "bw" | "iops" | "lat" => match &mut backing {
                Some(b) => b.push_str(&format!(",{k}={v}")),
                None => return Err(err(format!("{k}= must follow backing="))),
            },
            "cache" => cache_kind = Some(v.to_string()),
            "cache_bw" => cache_bw = Some(parse_rate(v).map_err(|e| err(format!("cache_bw={v}: {e}")))?),
            "ut" => pol.ut = ratio(v)?,
            "window" => pol.window = dur()?,
            "id" => pol.inactivity_delay = dur()?,
            "initial" => pol.initial_cache = size()?,
            "min" => pol.min_cache = size()?,
            "max" => pol.max_cache = size()?,
            "granularity" => pol.granularity = size()?,
            "learn" => pol.learn_period = matches!(v, "true" | "on" | "yes" | "1"),
            "attach_delay" => attach_delay = Some(dur()?),
            "block" => cache.block_size = size()?,
            "mode" => cache.mode = v.parse().map_err(err)?,
            "seq_bypass" => cache.seq_bypass = Some(size()?),
            _ => return Err(err(format!("unknown option {k:?}"))),
        }
    }
    let backing: VolumeSpec = backing.ok_or_else(|| err("backing=TYPE:SIZE is required".into()))?.parse().map_err(|e| err(format!("backing: {e}")))?;
    if cache_kind.as_deref().unwrap_or("reserved") != "reserved" {
        return Err(err("cache volumes are of type reserved (cache=reserved,cache_bw=RATE)".into()));
    }
    let cache_bw = cache_bw.ok_or_else(|| err("cache_bw=RATE is required (e.g. 128MB/s)".into()))?;
    if !cache.block_size.is_power_of_two() || cache.block_size < 4096 {
        return Err(err("block must be a power of two >= 4KiB".into()));
    }
    pol.backing_bw = backing.model.reserved_bw().ok_or_else(|| err("the backing volume needs a reserved bandwidth (bw=RATE) to measure utilization".into()))? as f64;
    let mut cfg = surge_cloud::LocalConfig::new(crate::stack::volume::cloud_dir(&ctx.data_dir));
    if let Some(d) = attach_delay {
        cfg.delays.attach = d;
        cfg.delays.detach = d;
    }
    pol.attach_delay = cfg.delays.attach;
    let provider = Arc::new(surge_cloud::LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?);
    let tick = pol.window / 10;
    let p = ElasticParams { name: name.to_string(), backing: backing.clone(), cache_bw, policy: pol, cache, tick, flusher_poll: Duration::from_millis(20) };
    let vol = ElasticVolume::open(p, provider, ctx.clock.clone()).map_err(|e| err(format!("{e:#}")))?;
    vol.start();
    let detail = serde_json::json!({ "backing": backing.to_string(), "backing_volume": vol.backing_id(), "cache_bw": cache_bw });
    Ok(crate::stack::Built {
        dev: vol.clone(),
        description: format!("elastic volume over {backing} with {} MB/s caches", cache_bw / 1_000_000),
        detail,
        controls: vec![vol],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;

    fn ctx(dir: &std::path::Path) -> crate::stack::BuildContext {
        crate::stack::BuildContext::new(dir.to_path_buf(), Arc::new(VirtualClock::new()))
    }

    #[test]
    fn elastic_spec_builds_a_backing_volume_and_reports_status() {
        let d = tempfile::tempdir().unwrap();
        let b = build_elastic("d", "backing=reserved:64MiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s,initial=16MiB,min=4MiB,granularity=4MiB,attach_delay=0s", &ctx(d.path())).unwrap();
        assert_eq!(b.dev.size(), 64 << 20);
        b.dev.write_at(&[7; 4096], 0, true).unwrap();
        let st = b.controls[0].status();
        assert_eq!(st["state"], "idle");
        assert_eq!(st["cache_size"], 0);
        let mut buf = [0u8; 4];
        b.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7; 4]);
    }

    #[test]
    fn elastic_spec_errors_name_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let e = |a: &str| build_elastic("d", a, &ctx(d.path())).err().unwrap().to_string();
        assert!(e("cache=reserved,cache_bw=128MB/s").contains("backing="));
        assert!(e("backing=reserved:64MiB,bw=33MB/s").contains("cache_bw"));
        assert!(e("backing=gp2:64GiB,cache_bw=128MB/s").contains("reserved bandwidth"));
        assert!(e("backing=reserved:64MiB,bw=33MB/s,cache_bw=1MB/s,bogus=1").contains("bogus"));
    }

    /// The controller on virtual time: a burst provisions a cache, inactivity
    /// drains it, and a clean cache is detached and deleted, with reasons.
    #[test]
    fn controller_provisions_drains_and_deletes_on_virtual_time() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = surge_cloud::LocalConfig::new(d.path());
        cfg.delays = surge_cloud::Delays::none();
        let prov: Arc<dyn Provider> = Arc::new(surge_cloud::LocalProvider::open(cfg, clock.clone()).unwrap());
        let mib = 1u64 << 20;
        let p = ElasticParams {
            name: "v".into(),
            backing: "reserved:64MiB,bw=33MB/s".parse().unwrap(),
            cache_bw: 128_000_000,
            policy: ElasticConfig { backing_bw: 33e6, initial_cache: 16 * mib, min_cache: 4 * mib, granularity: 4 * mib, attach_delay: Duration::ZERO, ..ElasticConfig::default() },
            cache: CacheConfig::default(),
            tick: Duration::from_secs(1),
            flusher_poll: Duration::from_millis(1),
        };
        let v = ElasticVolume::open(p, prov.clone(), clock.clone()).unwrap();
        v.step().unwrap();
        // A burst: 8 MiB every 0.2 s of compute (the backing model's pacing
        // moves virtual time too): well above 30 % of 33 MB/s.
        for i in 0..20u64 {
            v.write_at(&vec![i as u8 + 1; (8 * mib) as usize], i * 4 * mib % (48 * mib), false).unwrap();
            clock.advance(Duration::from_millis(200));
            v.step().unwrap();
        }
        assert!(v.cache().is_attached(), "burst provisions a cache: {:?}", v.decisions());
        assert_eq!(v.cache_sizes(), vec![16 * mib]);
        // Idle: after ID the policy drains; flushing makes it clean; then detach.
        for _ in 0..60 {
            clock.advance(Duration::from_secs(1));
            v.step().unwrap();
            v.cache().flush_step(usize::MAX).unwrap();
        }
        assert!(!v.cache().is_attached(), "{:?}", v.decisions());
        let kinds: Vec<String> = v.decisions().iter().map(|d| format!("{:?}", d.action)).collect();
        assert!(kinds.iter().any(|k| k.starts_with("Provision")) && kinds.contains(&"StartDrain".to_string()) && kinds.contains(&"Detach".to_string()), "{kinds:?}");
        assert!(v.decisions().iter().all(|d| !d.reason.is_empty()));
        // Only the backing volume is left.
        assert_eq!(prov.list().unwrap().len(), 1);
        let mut buf = vec![0u8; 4096];
        v.read_at(&mut buf, 28 * mib).unwrap();
        assert_eq!(buf[0], 20, "the last write survived provisioning, draining and deletion");
    }
}
