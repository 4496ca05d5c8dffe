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
    pub fn backing_bytes(&self) -> u64 {
        io_total(&self.backing_io)
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
