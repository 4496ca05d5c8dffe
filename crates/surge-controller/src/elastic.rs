//! Elastic volumes: a slow backing cloud volume plus short-lived fast cache
//! volumes, provisioned, drained and deleted by the elastic policy.
//!
//! [`ElasticVolume`] is the daemon side: it owns the cache layer
//! (`surge_block::cache`), asks the pure policy (`surge_policy::elastic`) what to
//! do once per tick, and applies its decisions through the cloud [`Provider`].
//! Every decision is logged with its reason and kept for `surge status`.
//!
//! Spec form (one line): `elastic:backing=reserved:50GiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s`
//! plus optional `ut=0.3,window=5s,id=30s,initial=10GiB,min=1GiB,max=64GiB,block=64KiB,learn=true`
//! and fault rules for the devices (`backing_fault.RULE`, `cache_fault.RULE`).
//! `cache=auto` lets the price-aware planner (`boost.rs`) choose each cache volume.
//!
//! After a cache volume fails, the cache layer keeps it as a rescue while it
//! holds blocks not safe on backing; the controller keeps the volume (and
//! reattaches it, with a backoff, if it cannot be read), deletes it once the
//! fence record says it is fenced, and retries failed deletes each tick. The
//! record (`DATA/elastic/NAME.fences.json`) makes a restart honour all of it.

mod boost;
mod spec;
pub use boost::BoostSettings;
pub use spec::{scaled_bytes, scaled_policy, Cloud, ElasticSpec};

use crate::Controllable;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::fence::{FenceStore, FileFences, MemoryFences};
use surge_block::cache::{CacheConfig, CacheError, CacheMode, ElasticCache, Flusher, Phase};
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::model::VolumeModel;
use surge_block::{BlockDev, Caps, Clock, Counted, ZeroMode};
use surge_cloud::{CreateRequest, Provider, VolumeSpec};
use surge_policy::{Action, CacheObs, Decision, ElasticConfig, ElasticPolicy, State};

/// Most decisions and cache sizes kept for `surge status` (oldest dropped first).
pub const LOG_CAP: usize = 1024;

#[derive(Debug, Clone)]
pub struct ElasticParams {
    /// Prefix of the cloud volume names (`NAME-backing`, `NAME-cache-N`).
    pub name: String,
    pub backing: VolumeSpec,
    /// Reserved bandwidth of the cache volumes, bytes/s.
    pub cache_bw: u64,
    pub policy: ElasticConfig,
    pub cache: CacheConfig,
    /// `cache=auto`: the planner chooses each cache volume (`cache_bw` unused).
    pub boost: Option<BoostSettings>,
    /// How often the controller feeds the policy.
    pub tick: Duration,
    /// How often the background flusher looks for work when idle.
    pub flusher_poll: Duration,
    /// The fence record (failed cache volumes, lost writes), a file that a
    /// restart honours; `None`: in memory only (for runs that never restart).
    pub fences: Option<PathBuf>,
    /// Fault injection on the backing volume and on every cache volume.
    pub faults: ElasticFaults,
    /// The provider's scale (`Scale::FULL` but in experiments): cache sizes
    /// from the policy are the provider's bytes, specs are full-scale.
    pub scale: surge_block::model::Scale,
    /// Create and attach cache volumes on a worker thread while the
    /// controller keeps ticking (EBS takes seconds to minutes); `false`: in
    /// the controller's step (deterministic tests).
    pub background_provision: bool,
    /// A gp2/st1/sc1 backing's burst rate counts while its credits would last
    /// this long at it (provider time: scaled like the other durations).
    pub credit_horizon: Duration,
    /// The backing is a persistent burstable stripe (`backing=burstable:SIZE,members=N`):
    /// its controller ([`crate::burstable::BurstableVolume`]) runs beside this
    /// one, its members `NAME-backing-sI-gG` on the same provider; `backing` is
    /// then its member's spec.
    pub stripe: Option<crate::burstable::BurstableParams>,
}

/// Fault rules (`surge_block::fault`) for an elastic volume's devices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ElasticFaults {
    pub backing: Option<FaultRules>,
    pub cache: Option<FaultRules>,
}

/// One entry of the decision log.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedDecision {
    pub at_s: f64,
    #[serde(flatten)]
    pub action: Action,
    pub reason: String,
}

/// A volume waiting to be deleted: detached first (never deleted while
/// attached), retried with a backoff while the provider refuses.
#[derive(Debug, Clone, Serialize)]
pub struct Doomed {
    pub id: String,
    pub attempts: u32,
    #[serde(skip)]
    next_at: Duration,
    pub last_error: Option<String>,
}

/// Wait after `attempts` failures in a row: the first retry at once (the
/// next tick), then 1 s, 2 s, ... up to 5 min.
fn doom_backoff(attempts: u32) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(8)).min(Duration::from_secs(300)),
    }
}

/// A cache volume created and attached, not yet handed to the cache layer.
struct Provisioned {
    id: String,
    dev: Arc<dyn BlockDev>,
}

/// What a provisioning job returns: on failure, the volume it made (if any).
type JobResult = Result<Provisioned, (Option<String>, anyhow::Error)>;

/// A provisioning under way on the worker thread.
struct Pending {
    size: u64,
    started: Duration,
    /// The burst ended before the volume arrived: release it unused.
    cancelled: bool,
    result: Arc<Mutex<Option<JobResult>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Create and attach one cache volume (blocking for as long as the provider takes).
fn provision_job(provider: &dyn Provider, spec: VolumeSpec, name: String) -> JobResult {
    let info = provider.create(CreateRequest { spec, name: Some(name) }).map_err(|e| (None, e.into()))?;
    match provider.attach(&info.id) {
        Ok(dev) => Ok(Provisioned { id: info.id, dev }),
        Err(e) => Err((Some(info.id), e.into())),
    }
}

/// The backing's capacity and credit model (`surge_policy::backing`).
struct BackingModel {
    capacity: surge_policy::backing::BackingCapacity,
    credits: surge_policy::backing::CreditTracker,
    /// Next time the provider's balance is asked for (CloudWatch: a call).
    ask_at: Duration,
    last: Option<surge_policy::backing::Capacity>,
}

/// How often the provider is asked for the backing's credit balance.
const CREDITS_POLL: Duration = Duration::from_secs(60);

struct CacheVol {
    id: String,
    size: u64,
    io: Arc<Counted>,
    /// Its fault layer, when `faults.cache` is set.
    fault: Option<Arc<FaultDev>>,
}

/// A list that keeps only its newest `cap` entries and counts all of them.
struct Bounded<T> {
    items: VecDeque<T>,
    total: u64,
    cap: usize,
}

impl<T: Clone> Bounded<T> {
    fn new(cap: usize) -> Self {
        Bounded { items: VecDeque::new(), total: 0, cap }
    }
    fn push(&mut self, v: T) {
        if self.items.len() == self.cap {
            self.items.pop_front();
        }
        self.items.push_back(v);
        self.total += 1;
    }
    fn to_vec(&self) -> Vec<T> {
        self.items.iter().cloned().collect()
    }
}

pub struct ElasticVolume {
    p: ElasticParams,
    provider: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    cache: Arc<ElasticCache>,
    fences: Arc<dyn FenceStore>,
    /// The backing volume's id (a stripe: the prefix of its members' names).
    backing_id: String,
    backing_io: Arc<Counted>,
    /// The backing's own controller when it is a burstable stripe.
    stripe: Option<Arc<crate::burstable::BurstableVolume>>,
    /// The backing volume's fault layer, when `faults.backing` is set.
    backing_fault: Option<Arc<FaultDev>>,
    /// The cache volume: attached, or failed and still being rescued.
    vol: Mutex<Option<CacheVol>>,
    /// Volumes to delete (fenced, or left by a failed detach or delete), retried with a backoff.
    doomed: Mutex<Vec<Doomed>>,
    /// The provisioning under way (background mode).
    pending: Mutex<Option<Pending>>,
    /// Last provisioning failure: when, why, and when the next may start.
    provision_failure: Mutex<Option<(Duration, String, Duration, u32)>>,
    backing_model: Mutex<BackingModel>,
    /// Application requests charged as the backing counts them (EBS: 256 KiB operations).
    app_charged_ops: AtomicU64,
    /// The backing's operation size (0: one operation per request).
    op_size: u64,
    /// Next time a failed cache volume is reattached to rescue its blocks, and the backoff.
    reattach: Mutex<(Duration, Duration)>,
    /// Device bytes of cache volumes already deleted.
    old_cache_bytes: AtomicU64,
    app_bytes: AtomicU64,
    app_ops: AtomicU64,
    policy: Mutex<ElasticPolicy>,
    booster: Option<Mutex<boost::Booster>>,
    /// The planner's volume for the provisioning being applied.
    next_spec: Mutex<Option<VolumeSpec>>,
    log: Mutex<Bounded<LoggedDecision>>,
    sizes: Mutex<Bounded<u64>>,
    cache_seq: AtomicU64,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    flusher: Mutex<Option<Flusher>>,
    /// The detach-and-delete of doomed volumes under way (background mode):
    /// on a real cloud a detach can take minutes or stick in-use, and the
    /// controller must meanwhile go on deciding (a new burst, a drain).
    reaper: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// [`crate::spawn_registered`]; a thread that cannot be spawned is fatal here.
fn spawn_registered(name: String, clock: Arc<dyn Clock>, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    crate::spawn_registered(name, clock, f).expect("spawn a controller thread")
}

fn io_total(c: &Counted) -> u64 {
    let s = c.stats();
    s.read_bytes + s.write_bytes
}

/// Wrap a volume's device in the fault layer when rules are set.
fn with_faults(dev: Arc<dyn BlockDev>, rules: &Option<FaultRules>, clock: &Arc<dyn Clock>) -> (Arc<dyn BlockDev>, Option<Arc<FaultDev>>) {
    match rules {
        Some(r) => {
            let f = Arc::new(FaultDev::new(dev, r.clone(), clock.clone()));
            (f.clone(), Some(f))
        }
        None => (dev, None),
    }
}

const REATTACH_FIRST: Duration = Duration::from_secs(1);
const REATTACH_MAX: Duration = Duration::from_secs(60);

impl ElasticVolume {
    /// Open (or create) the backing volume. Leftover cache volumes of a crashed
    /// run: those the fence record names as failed are deleted (fenced) or have
    /// their pending blocks rescued; otherwise the newest is reattached,
    /// recovered and drained, and older ones are deleted.
    pub fn open(p: ElasticParams, provider: Arc<dyn Provider>, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<Self>> {
        let fences: Arc<dyn FenceStore> = match &p.fences {
            Some(path) => Arc::new(FileFences::open(path)?),
            None => Arc::new(MemoryFences::new()),
        };
        let cache_cfg = CacheConfig { fences: Some(fences.clone()), ..p.cache.clone() };
        let backing_name = format!("{}-backing", p.name);
        let vols = provider.list()?;
        let (backing_id, raw_backing, stripe) = match &p.stripe {
            Some(bp) => {
                let v = crate::burstable::BurstableVolume::open(bp.clone(), provider.clone(), clock.clone())?;
                v.start()?;
                (backing_name, v.clone() as Arc<dyn BlockDev>, Some(v))
            }
            None => {
                let id = match vols.iter().find(|v| v.name.as_deref() == Some(&backing_name)) {
                    Some(v) => v.id.clone(),
                    None => provider.create(CreateRequest { spec: p.backing.clone(), name: Some(backing_name) })?.id,
                };
                let dev = provider.attach(&id)?;
                (id, dev, None)
            }
        };
        let (backing_dev, backing_fault) = with_faults(raw_backing, &p.faults.backing, &clock);
        let backing_io = Arc::new(Counted::new(backing_dev));
        let prefix = format!("{}-cache-", p.name);
        let mut leftovers: Vec<_> = vols.iter().filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix))).collect();
        // New cache volumes are numbered after every leftover (names are unique).
        let next_seq = leftovers.iter().filter_map(|v| v.name.as_deref()?.strip_prefix(&prefix)?.parse::<u64>().ok()).max().map_or(0, |n| n + 1);
        leftovers.sort_by_key(|v| v.created_unix_ms);
        let record = fences.get();
        let mut doomed: Vec<String> = record.fenced_labels().into_iter().filter(|l| leftovers.iter().any(|v| &v.id == l)).collect();
        leftovers.retain(|v| !doomed.contains(&v.id));
        // A failed volume with blocks still pending comes first; then the newest.
        let pending = leftovers.iter().position(|v| record.failed.values().any(|f| f.label == v.id && !f.pending.is_empty()));
        let chosen = match pending {
            Some(i) => Some(leftovers.remove(i)),
            None => leftovers.pop(),
        };
        doomed.extend(leftovers.iter().map(|v| v.id.clone()));
        let mut vol = None;
        let mut recovered = None;
        let cache = match chosen {
            Some(v) => {
                let (dev, fault) = with_faults(provider.attach(&v.id)?, &p.faults.cache, &clock);
                let dev = Arc::new(Counted::new(dev));
                match ElasticCache::open_as(backing_io.clone(), dev.clone(), &v.id, cache_cfg.clone(), clock.clone()) {
                    Ok(c) => {
                        if c.is_attached() {
                            tracing::warn!(volume = %v.id, dirty = c.stats().dirty_bytes, "recovered a cache volume left by a previous run; draining it");
                            c.set_phase(Phase::Drain);
                            recovered = Some(v.size);
                        } else {
                            tracing::error!(volume = %v.id, rescue = ?c.rescue_info(), "a failed cache volume still holds blocks not safe on backing; rescuing them");
                        }
                        vol = Some(CacheVol { id: v.id.clone(), size: v.size, io: dev, fault });
                        c
                    }
                    Err(CacheError::Fenced { id }) => {
                        tracing::warn!(volume = %v.id, cache_id = id, "leftover cache volume is fenced (it failed earlier); deleting it");
                        let _ = provider.detach(&v.id);
                        doomed.push(v.id.clone());
                        ElasticCache::new(backing_io.clone(), cache_cfg.clone(), clock.clone())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            None => ElasticCache::new(backing_io.clone(), cache_cfg.clone(), clock.clone()),
        };
        let doomed = doomed.into_iter().map(|id| Doomed { id, attempts: 0, next_at: Duration::ZERO, last_error: None }).collect();
        // A stripe is measured at its members' bursts together (its controller swaps them before credits run out).
        let backing_shape = match &p.stripe {
            Some(bp) => crate::burstable::stripe_shape(bp).ok_or_else(|| anyhow::anyhow!("the stripe's members ({}) have no volume model", bp.member))?,
            None => p.backing.shape()?,
        };
        let shape = p.scale.shape(backing_shape.clone());
        let backing_model = BackingModel {
            capacity: surge_policy::backing::BackingCapacity::new(shape.clone(), p.credit_horizon),
            credits: surge_policy::backing::CreditTracker::new(&shape),
            ask_at: Duration::ZERO,
            last: None,
        };
        let booster = p.boost.clone().map(|b| Mutex::new(boost::Booster::new(b, &p.policy, p.cache.block_size, backing_shape.clone())));
        let mut policy = ElasticPolicy::new(p.policy.clone());
        if let Some(size) = recovered {
            policy.resume_drain(clock.now(), size);
        }
        let me = Arc::new(ElasticVolume {
            cache: Arc::new(cache),
            fences,
            backing_id,
            backing_io,
            backing_fault,
            stripe,
            vol: Mutex::new(vol),
            doomed: Mutex::new(doomed),
            pending: Mutex::new(None),
            provision_failure: Mutex::new(None),
            backing_model: Mutex::new(backing_model),
            app_charged_ops: AtomicU64::new(0),
            op_size: shape.op_size.unwrap_or(0),
            reattach: Mutex::new((Duration::ZERO, REATTACH_FIRST)),
            old_cache_bytes: AtomicU64::new(0),
            app_bytes: AtomicU64::new(0),
            app_ops: AtomicU64::new(0),
            policy: Mutex::new(policy),
            booster,
            next_spec: Mutex::new(None),
            log: Mutex::new(Bounded::new(LOG_CAP)),
            sizes: Mutex::new(Bounded::new(LOG_CAP)),
            cache_seq: AtomicU64::new(next_seq),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            flusher: Mutex::new(None),
            reaper: Mutex::new(None),
            p,
            provider,
            clock,
        });
        me.delete_doomed();
        Ok(me)
    }

    /// Start the controller and the background flusher.
    pub fn start(self: &Arc<Self>) {
        *self.flusher.lock() = Some(Flusher::spawn_on(self.cache.clone(), self.p.flusher_poll, self.clock.clone()));
        let me = self.clone();
        let t = spawn_registered(format!("elastic-{}", self.p.name), self.clock.clone(), move || {
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
            });
        self.threads.lock().push(t);
    }

    /// Stop the controller and flusher (the cache stays as it is). A
    /// provisioning under way is waited for and its volume released unused.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        if let Some(t) = self.reaper.lock().take() {
            let _ = t.join();
        }
        self.flusher.lock().take();
        // Nothing writes back to a stripe backing any more: its swaps stop too.
        if let Some(s) = &self.stripe {
            s.stop();
        }
        let pending = self.pending.lock().take();
        if let Some(mut p) = pending {
            if let Some(t) = p.thread.take() {
                let _ = t.join();
            }
            let r = p.result.lock().take();
            match r {
                Some(Ok(v)) => {
                    tracing::info!(volume = %v.id, "stopping: releasing a cache volume that arrived unused");
                    self.doom(&v.id);
                }
                Some(Err((Some(id), _))) => self.doom(&id),
                _ => {}
            }
            self.delete_doomed();
        }
    }

    /// At daemon exit on a real cloud: stop, flush, and detach the cache
    /// volume and the backing (not deleted: a restart finds them by name and
    /// drains what the cache still holds).
    pub fn shutdown(&self) {
        self.stop();
        let _ = self.cache.flush();
        // A clean cache holds nothing a restart needs: deleted, not left behind.
        if self.cache.is_attached() && self.cache.stats().dirty_bytes == 0 {
            if let Err(e) = self.release(true) {
                tracing::warn!(export = %self.p.name, "releasing the clean cache volume at exit: {e:#}");
            }
        }
        let backing = match &self.stripe {
            Some(s) => {
                s.detach_all();
                None
            }
            None => Some(self.backing_id.clone()),
        };
        let ids: Vec<String> = self.vol.lock().as_ref().map(|v| v.id.clone()).into_iter().chain(backing).collect();
        for id in ids {
            if let Err(e) = self.provider.detach(&id) {
                tracing::error!(volume = %id, export = %self.p.name, "detaching at exit: {e}");
            }
        }
    }

    fn obs(&self) -> CacheObs {
        let s = self.cache.stats();
        CacheObs { attached: s.attached, dirty_bytes: s.dirty_bytes, used_high_bytes: s.used_high_bytes, evicted_bytes: s.evictions * s.block_size }
    }

    /// One controller step: settle failed caches and leftovers, feed the
    /// policy, apply what it decides.
    pub fn step(self: &Arc<Self>) -> anyhow::Result<()> {
        self.poll_provision();
        self.drop_failed_cache()?;
        self.reap();
        let now = self.clock.now();
        self.update_backing(now);
        let (bytes, ops) = (self.app_bytes.load(Relaxed), self.app_ops.load(Relaxed));
        self.boost_observe(now, bytes, ops);
        let charged = self.app_charged_ops.load(Relaxed);
        let decisions = self.policy.lock().tick_ops(now, bytes, charged, self.obs());
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
        // After a failed provisioning, none until its backoff is over (quietly:
        // the failure was logged once, and status shows when it retries).
        let now = self.clock.now();
        if matches!(d.action, Action::Provision { .. }) && self.provision_failure.lock().as_ref().is_some_and(|f| now < f.2) {
            self.policy.lock().provision_failed(now);
            return Ok(());
        }
        let Some(d) = self.boost_decision(d) else { return Ok(()) };
        self.record(&d);
        match d.action {
            Action::Provision { size } => return self.start_provision(size),
            Action::CancelProvision => {
                if let Some(p) = self.pending.lock().as_mut() {
                    p.cancelled = true;
                }
            }
            Action::StartDrain => {
                self.cache.set_phase(Phase::Drain);
                self.boost_drain();
            }
            Action::Resume => self.cache.set_phase(Phase::Boost),
            Action::Detach => match self.release(!self.p.background_provision) {
                Ok(()) => {
                    self.boost_released();
                    self.policy.lock().detached(self.clock.now());
                }
                Err(e) => {
                    let obs = self.obs();
                    let report = self.policy.lock().detach_failed(self.clock.now(), obs, &format!("{e:#}"));
                    tracing::warn!(volume = %self.p.name, "releasing the cache volume failed: {e:#}");
                    self.record(&report);
                }
            },
            Action::DetachFailed { .. } => {}
        }
        Ok(())
    }

    /// The spec and name of the next cache volume, once nothing blocks one.
    fn next_cache(&self, size: u64) -> anyhow::Result<(VolumeSpec, String)> {
        let pending: u64 = self.cache.rescue_info().iter().map(|r| r.pending_blocks).sum();
        anyhow::ensure!(
            pending == 0 && self.vol.lock().is_none(),
            "{pending} blocks of a failed cache volume are not yet safe on backing; no new cache until they are"
        );
        let n = self.cache_seq.fetch_add(1, Relaxed);
        let planned = self.next_spec.lock().take();
        let full = |b: u64| if self.p.scale.is_full() { b } else { ((b as f64 / (self.p.scale.rate * self.p.scale.time)).ceil() as u64).div_ceil(1 << 20) << 20 };
        let spec = planned.unwrap_or(VolumeSpec { model: VolumeModel::Reserved { bw: Some(self.p.cache_bw), iops: None }, size: full(size), latency: Duration::ZERO });
        Ok((spec, format!("{}-cache-{n}", self.p.name)))
    }

    /// Create and attach a cache volume and hand it to the cache layer, in
    /// this call (tests, and the synchronous mode).
    fn provision(&self, size: u64) -> anyhow::Result<()> {
        let (spec, name) = self.next_cache(size)?;
        match provision_job(self.provider.as_ref(), spec, name) {
            Ok(v) => self.install(v, size),
            Err((id, e)) => {
                if let Some(id) = id {
                    self.doom(&id);
                }
                Err(e)
            }
        }
    }

    /// Hand an attached volume to the cache layer.
    fn install(&self, v: Provisioned, size: u64) -> anyhow::Result<()> {
        let (d, fault) = with_faults(v.dev, &self.p.faults.cache, &self.clock);
        let dev = Arc::new(Counted::new(d));
        if let Err(e) = self.cache.attach_as(dev.clone(), &v.id) {
            let _ = self.provider.detach(&v.id);
            self.doom(&v.id);
            return Err(e.into());
        }
        self.cache.set_phase(Phase::Boost);
        self.sizes.lock().push(size);
        *self.vol.lock() = Some(CacheVol { id: v.id, size, io: dev, fault });
        Ok(())
    }

    /// Apply a Provision decision: on the worker thread (background mode) or
    /// now. A cancelled provisioning still under way is taken back instead of
    /// starting another; while a failure's backoff lasts, none is started.
    fn start_provision(&self, size: u64) -> anyhow::Result<()> {
        let now = self.clock.now();
        if let Some(p) = self.pending.lock().as_mut() {
            // The planner's spec for a second volume is not used: this one is kept.
            self.next_spec.lock().take();
            if p.cancelled {
                p.cancelled = false;
                tracing::info!(volume = %self.p.name, "demand is back: the cache volume still being provisioned is kept");
            }
            return Ok(());
        }
        if !self.p.background_provision {
            let r = self.provision(size);
            return self.provisioned(size, now, r.map(|()| false));
        }
        let (spec, name) = match self.next_cache(size) {
            Ok(x) => x,
            Err(e) => return self.provisioned(size, now, Err(e)),
        };
        let result = Arc::new(Mutex::new(None));
        let (r2, prov) = (result.clone(), self.provider.clone());
        let thread = spawn_registered(format!("provision-{}", self.p.name), self.clock.clone(), move || *r2.lock() = Some(provision_job(prov.as_ref(), spec, name)));
        *self.pending.lock() = Some(Pending { size, started: now, cancelled: false, result, thread: Some(thread) });
        Ok(())
    }

    /// Take the result of the background provisioning, if it is done.
    fn poll_provision(&self) {
        let done = self.pending.lock().as_ref().is_some_and(|p| p.result.lock().is_some());
        if !done {
            return;
        }
        let Some(mut p) = self.pending.lock().take() else { return };
        if let Some(t) = p.thread.take() {
            let _ = t.join();
        }
        let r = p.result.lock().take().expect("checked");
        let took = self.clock.now().saturating_sub(p.started);
        let r = match r {
            Ok(v) if p.cancelled => {
                self.policy.lock().observe_provision_time(took);
                tracing::info!(volume = %v.id, export = %self.p.name, "cache volume arrived after {:.1} s, after its burst: released unused", took.as_secs_f64());
                // Detached and deleted by the next step's reaping.
                self.doom(&v.id);
                self.boost_released();
                return;
            }
            Ok(v) => self.install(v, p.size).map(|()| true),
            Err((id, e)) => {
                if let Some(id) = id {
                    self.doom(&id);
                }
                Err(e)
            }
        };
        if p.cancelled && r.is_err() {
            self.boost_released();
            return;
        }
        let _ = self.provisioned(p.size, p.started, r);
    }

    /// A provisioning begun at `started` finished: tell the policy (and the
    /// attach-time estimate), or record the failure and back off.
    fn provisioned(&self, size: u64, started: Duration, r: anyhow::Result<bool>) -> anyhow::Result<()> {
        let now = self.clock.now();
        match r {
            Ok(background) => {
                *self.provision_failure.lock() = None;
                self.cache.reset_used_high();
                let obs = self.obs();
                let mut pol = self.policy.lock();
                pol.observe_provision_time(now.saturating_sub(started));
                pol.attached(now, size, obs);
                let (attach, window) = (pol.config().attach_delay, pol.config().window);
                drop(pol);
                self.boost_attach_delay(attach, window);
                if background {
                    tracing::info!(volume = %self.p.name, "cache volume attached after {:.1} s", now.saturating_sub(started).as_secs_f64());
                }
                Ok(())
            }
            Err(e) => {
                self.boost_released();
                self.policy.lock().provision_failed(now);
                let mut f = self.provision_failure.lock();
                let n = f.as_ref().map_or(0, |f| f.3) + 1;
                let wait = Duration::from_secs(1u64 << (n - 1).min(8)).min(Duration::from_secs(300));
                *f = Some((now, format!("{e:#}"), now + wait, n));
                tracing::error!(volume = %self.p.name, attempt = n, "provisioning a cache volume failed; I/O goes on at the backing's speed, retrying in {:.0} s: {e:#}", wait.as_secs_f64());
                Err(e.context("provisioning a cache volume"))
            }
        }
    }

    /// Measure the backing against what its type provides now (credits from
    /// surge's bucket model, lowered by the provider's reports).
    fn update_backing(&self, now: Duration) {
        let s = self.backing_io.stats();
        let mut m = self.backing_model.lock();
        let op = m.capacity.shape.op_size.unwrap_or(0).max(1);
        let (ops, bytes) = (s.reads + s.writes, s.read_bytes + s.write_bytes);
        m.credits.observe_io(now, ops.max(bytes / op), bytes);
        let has_credits = m.capacity.shape.op_credits.is_some() || m.capacity.shape.byte_credits.is_some();
        if has_credits && now >= m.ask_at {
            m.ask_at = now + CREDITS_POLL.mul_f64(self.p.scale.time);
            match self.provider.credits(&self.backing_id) {
                Ok(c) if c.ops.is_some() || c.bytes.is_some() => m.credits.observe_reported(c),
                Ok(_) => {}
                Err(e) => tracing::debug!(volume = %self.backing_id, "backing credits unknown: {e}"),
            }
        }
        let cap = m.capacity.now(&m.credits.balance());
        m.last = Some(cap);
        drop(m);
        self.policy.lock().set_backing(cap.bytes_per_s, cap.ops_per_s);
        self.boost_backing(cap.bytes_per_s, cap.ops_per_s);
    }

    /// The cache layer fell back to backing (its device failed). While the
    /// failed volume still holds blocks not safe on backing it is kept (and,
    /// with a backoff, reattached so that a device that vanished can be read
    /// again); once fenced it is deleted, retried until the provider agrees.
    /// The policy starts over from Idle.
    fn drop_failed_cache(&self) -> anyhow::Result<()> {
        if self.cache.is_attached() {
            return Ok(());
        }
        // Lock order: never hold `vol` while taking `policy` (status takes policy, then vol).
        let Some(id) = self.vol.lock().as_ref().map(|v| v.id.clone()) else { return Ok(()) };
        {
            let mut policy = self.policy.lock();
            if policy.state() != State::Idle {
                policy.detached(self.clock.now());
            }
        }
        let rescue = self.cache.rescue_info().into_iter().find(|r| r.label == id);
        match rescue {
            Some(r) => {
                if r.unreadable_blocks > 0 {
                    self.reattach_for_rescue(&id);
                }
                Ok(())
            }
            None => {
                let Some(v) = self.vol.lock().take() else { return Ok(()) };
                tracing::error!(volume = %v.id, "cache volume failed over to backing and is fenced; deleting it");
                self.boost_released();
                self.old_cache_bytes.fetch_add(io_total(&v.io), Relaxed);
                // Detached and deleted by the next step's reaping.
                self.doom(&v.id);
                Ok(())
            }
        }
    }

    /// Reattach a failed cache volume (with a backoff) and hand the fresh
    /// device to the cache layer's rescue.
    fn reattach_for_rescue(&self, id: &str) {
        let now = self.clock.now();
        {
            let r = self.reattach.lock();
            if now < r.0 {
                return;
            }
        }
        let _ = self.provider.detach(id);
        let ok = match self.provider.attach(id) {
            Ok(d) => {
                let (d, fault) = with_faults(d, &self.p.faults.cache, &self.clock);
                let dev = Arc::new(Counted::new(d));
                let r = self.cache.provide_rescue_device(dev.clone());
                if let Some(v) = self.vol.lock().as_mut().filter(|v| v.id == id) {
                    v.io = dev;
                    v.fault = fault;
                }
                matches!(r, Ok(true)) && !self.cache.rescue_info().iter().any(|r| r.label == id && r.unreadable_blocks > 0)
            }
            Err(e) => {
                tracing::warn!(volume = %id, "reattaching a failed cache volume to rescue its blocks: {e}");
                false
            }
        };
        let mut r = self.reattach.lock();
        *r = if ok { (Duration::ZERO, REATTACH_FIRST) } else { (now + r.1, (r.1 * 2).min(REATTACH_MAX)) };
    }

    /// Remember a volume to delete (retried each tick until the provider agrees).
    fn doom(&self, id: &str) {
        let mut d = self.doomed.lock();
        if !d.iter().any(|x| x.id == id) {
            d.push(Doomed { id: id.to_string(), attempts: 0, next_at: Duration::ZERO, last_error: None });
        }
    }

    /// A detach or delete of a doomed volume failed: back off and say so.
    fn doom_failed(&self, id: &str, what: &str, e: &dyn std::fmt::Display) {
        let now = self.clock.now();
        let mut d = self.doomed.lock();
        if let Some(x) = d.iter_mut().find(|x| x.id == id) {
            x.attempts += 1;
            let wait = doom_backoff(x.attempts);
            x.next_at = now + wait;
            x.last_error = Some(format!("{what}: {e}"));
            tracing::warn!(volume = %id, export = %self.p.name, attempt = x.attempts, "{what} a cache volume failed; retrying in {:.0} s (it is not deleted while attached): {e}", wait.as_secs_f64());
        }
    }

    /// Detach and delete the doomed volumes that are due: in this call
    /// (synchronous mode), or on the reaper thread, one at a time, so that a
    /// slow or stuck detach holds up nothing else.
    fn reap(self: &Arc<Self>) {
        if !self.p.background_provision {
            return self.delete_doomed();
        }
        let now = self.clock.now();
        if !self.doomed.lock().iter().any(|d| d.next_at <= now) {
            return;
        }
        let mut reaper = self.reaper.lock();
        if reaper.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Some(t) = reaper.take() {
            let _ = t.join();
        }
        let me = self.clone();
        *reaper = Some(spawn_registered(format!("reap-{}", self.p.name), self.clock.clone(), move || me.delete_doomed()));
    }

    /// Delete every doomed volume the provider lets us; a deleted failed
    /// volume leaves the fence record.
    fn delete_doomed(&self) {
        let now = self.clock.now();
        let ids: Vec<String> = self.doomed.lock().iter().filter(|d| d.next_at <= now).map(|d| d.id.clone()).collect();
        for id in ids {
            let gone = || self.provider.list().is_ok_and(|l| !l.iter().any(|v| v.id == id));
            // Detached first: a volume is never deleted while attached (a
            // detach stuck in-use is retried with a backoff).
            if let Err(e) = self.provider.detach(&id) {
                // Refused because it is detached already (or gone): fine.
                let still = self.provider.describe(&id).map(|v| v.state == surge_cloud::VolumeState::Attached);
                if still.unwrap_or_else(|_| !gone()) {
                    self.doom_failed(&id, "detaching", &e);
                    continue;
                }
            }
            match self.provider.delete(&id) {
                Ok(()) => {}
                Err(e) if gone() => {
                    tracing::debug!(volume = %id, "already gone: {e}");
                }
                Err(e) => {
                    self.doom_failed(&id, "deleting", &e);
                    continue;
                }
            }
            self.doomed.lock().retain(|x| x.id != id);
            let _ = self.fences.update(&mut |f| f.failed.retain(|_, fc| !(fc.label == id && fc.pending.is_empty())));
        }
    }

    /// Detach (only when clean) and delete the cache volume. An error leaves
    /// the cache attached (detach refused) or the volume doomed (the provider
    /// refused; retried each tick). Unless `wait`, the provider's detach and
    /// delete are left to the reaper (`deletes` in status says how they go).
    fn release(&self, wait: bool) -> anyhow::Result<()> {
        self.cache.detach()?;
        let taken = self.vol.lock().take();
        if let Some(v) = taken {
            self.old_cache_bytes.fetch_add(io_total(&v.io), Relaxed);
            if !wait {
                self.doom(&v.id);
                return Ok(());
            }
            let detach = self.provider.detach(&v.id);
            self.doom(&v.id);
            self.delete_doomed();
            detach?;
            anyhow::ensure!(!self.doomed.lock().iter().any(|d| d.id == v.id), "deleting cache volume {} failed; retried with a backoff", v.id);
        }
        Ok(())
    }

    pub fn cache(&self) -> &Arc<ElasticCache> {
        &self.cache
    }
    pub fn backing_id(&self) -> &str {
        &self.backing_id
    }

    /// The backing's controller when it is a burstable stripe (its swaps, decisions, members).
    pub fn backing_stripe(&self) -> Option<&Arc<crate::burstable::BurstableVolume>> {
        self.stripe.as_ref()
    }
    /// The backing volume's fault layer, when fault rules were given.
    pub fn backing_fault(&self) -> Option<&Arc<FaultDev>> {
        self.backing_fault.as_ref()
    }
    /// The current cache volume's fault layer, when fault rules were given.
    pub fn cache_fault(&self) -> Option<Arc<FaultDev>> {
        self.vol.lock().as_ref().and_then(|v| v.fault.clone())
    }
    /// Size of the attached cache volume (0 if none).
    pub fn cache_size(&self) -> u64 {
        if !self.cache.is_attached() {
            return 0;
        }
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
    /// The newest decisions (at most [`LOG_CAP`]), oldest first.
    pub fn decisions(&self) -> Vec<LoggedDecision> {
        self.log.lock().to_vec()
    }
    /// Size of the newest cache volumes provisioned (at most [`LOG_CAP`]), in order.
    pub fn cache_sizes(&self) -> Vec<u64> {
        self.sizes.lock().to_vec()
    }
    /// Volumes waiting to be deleted (a delete failed, retried each tick).
    pub fn doomed_volumes(&self) -> Vec<String> {
        self.doomed.lock().iter().map(|d| d.id.clone()).collect()
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
        self.app_ops.fetch_add(1, Relaxed);
        let charged = if self.op_size > 0 { (n as u64).div_ceil(self.op_size).max(1) } else { 1 };
        self.app_charged_ops.fetch_add(charged, Relaxed);
    }

    /// Drain progress for `surge status`: dirty bytes, the measured flush rate,
    /// time left at that rate, and a one-line summary.
    fn drain_status(&self, s: &surge_block::cache::CacheStats) -> serde_json::Value {
        let summary = if !s.attached {
            "no cache attached".to_string()
        } else if s.dirty_bytes == 0 {
            "clean".to_string()
        } else {
            let dirty = human(s.dirty_bytes as f64, "B");
            match (s.drain_rate_bytes_per_s, s.drain_eta_s) {
                (Some(rate), Some(eta)) => {
                    let eta = if eta < 10.0 { format!("{eta:.1}") } else { format!("{eta:.0}") };
                    format!("{dirty} dirty, flushing at {}, clean in ~{eta} s", human(rate, "B/s"))
                }
                _ => format!("{dirty} dirty, flush rate not measured yet"),
            }
        };
        serde_json::json!({
            "dirty_bytes": s.dirty_bytes,
            "flushed_bytes": s.flushed_bytes,
            "rate_bytes_per_s": s.drain_rate_bytes_per_s,
            "eta_s": s.drain_eta_s,
            "phase": s.phase,
            "summary": summary,
        })
    }
}

/// `1.5 GB`, `33.0 MB/s` (decimal units, as cloud rates are quoted).
fn human(v: f64, unit: &str) -> String {
    let (mut v, mut i) = (v, 0);
    const P: [&str; 5] = ["", "k", "M", "G", "T"];
    while v >= 1000.0 && i + 1 < P.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}{unit}", P[i])
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
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.cache.may_wait_remote(offset, len, write)
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
        let now = self.clock.now();
        // Each taken and released here: several in one json! would deadlock.
        let deletes: Vec<_> = self.doomed.lock().iter().map(|d| serde_json::json!({
            "id": d.id, "attempts": d.attempts, "last_error": d.last_error,
            "retry_in_s": d.next_at.saturating_sub(now).as_secs_f64(),
        })).collect();
        let provisioning = self.pending.lock().as_ref().map(|p| serde_json::json!({
            "size": p.size, "for_s": now.saturating_sub(p.started).as_secs_f64(), "cancelled": p.cancelled,
        }));
        let provision_failure = self.provision_failure.lock().as_ref().map(|f| serde_json::json!({
            "at_s": f.0.as_secs_f64(), "error": f.1, "retry_at_s": f.2.as_secs_f64(), "attempts": f.3,
            "effect": "no cache: I/O runs at the backing's speed",
        }));
        let backing_capacity = {
            let m = self.backing_model.lock();
            serde_json::json!({ "now": m.last, "credits": m.credits.balance(), "reported_credits": m.credits.reported })
        };
        let policy = self.policy.lock();
        let log = self.log.lock();
        let sizes = self.sizes.lock();
        let failure = (s.loss.is_some() || s.rescue_pending_blocks > 0).then(|| {
            serde_json::json!({
                "loss": s.loss,
                "lost_blocks": s.lost_blocks,
                "rescue_pending_blocks": s.rescue_pending_blocks,
                "rescues": self.cache.rescue_info(),
                "action": "every FLUSH fails until the blocks are safe on backing or the loss is acknowledged: surge set NAME/elastic ack_lost=true",
            })
        });
        serde_json::json!({
            "state": policy.state(),
            "utilization": policy.last_utilization(),
            "next_cache_size": policy.next_size(),
            "phase": s.phase,
            "mode": s.mode,
            "cache_volume": self.vol.lock().as_ref().map(|v| serde_json::json!({"id": v.id, "size": v.size, "failed": !s.attached})),
            "cache_size": self.cache_size(),
            "dirty_bytes": s.dirty_bytes,
            "drain": self.drain_status(&s),
            "failure": failure,
            "volumes_to_delete": self.doomed_volumes(),
            "deletes": deletes,
            "provisioning": provisioning,
            "provision_failure": provision_failure,
            "attach_time": {
                "estimate_s": policy.config().attach_delay.as_secs_f64(),
                "observed": policy.attach_estimate(),
            },
            "backing_capacity": backing_capacity,
            "cache_fault": self.cache_fault().map(|f| serde_json::json!({"rules": f.rules().to_string(), "stats": f.stats()})),
            "stats": s,
            "cost": {"agbs": agbs, "usd": usd},
            "io": {"app_bytes": self.app_bytes(), "device_bytes": self.device_bytes()},
            // The clock decisions' `at_s` are read on.
            "clock_s": self.clock.now().as_secs_f64(),
            "cache_sizes": sizes.to_vec(),
            "caches_provisioned": sizes.total,
            "decisions": log.items.iter().rev().take(8).collect::<Vec<_>>(),
            "decisions_total": log.total,
            "boost": self.boost_status(),
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "mode" => {
                self.cache.set_mode(value.parse::<CacheMode>()?);
                Ok(())
            }
            "ack_lost" => match value {
                "true" | "yes" | "1" => self.cache.ack_loss().map_err(|e| format!("recording the acknowledgement failed: {e}")),
                _ => Err("ack_lost=true acknowledges lost writes (FLUSH works again, blocks of a failed cache are given up)".into()),
            },
            _ => Err(format!("{} has no setting {key:?} (settable: mode, ack_lost)", self.name())),
        }
    }
}


/// A gp2/st1 backing's burst rate counts while its credits last this long (full scale).
pub const CREDIT_HORIZON: Duration = Duration::from_secs(300);

/// Where an elastic export keeps its fence record (failed cache volumes, lost writes).
pub fn fences_path(data_dir: &std::path::Path, name: &str) -> PathBuf {
    data_dir.join("elastic").join(format!("{name}.fences.json"))
}

/// Issue 9: the controller after a cache volume fails (findings 2, 7, 8).
#[cfg(test)]
mod failure_tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::LocalProvider;

    const MIB: u64 = 1 << 20;

    /// A local cloud in `dir` without delays (a fresh one = a restart).
    fn cloud(dir: &std::path::Path, clock: &Arc<VirtualClock>) -> Arc<LocalProvider> {
        let mut cfg = surge_cloud::LocalConfig::new(dir);
        cfg.delays = surge_cloud::Delays::none();
        Arc::new(LocalProvider::open(cfg, clock.clone()).unwrap())
    }

    fn params(dir: &std::path::Path) -> ElasticParams {
        ElasticParams {
            name: "v".into(),
            backing: "reserved:64MiB,bw=33MB/s".parse().unwrap(),
            cache_bw: 128_000_000,
            policy: ElasticConfig { backing_bw: 33e6, initial_cache: 16 * MIB, min_cache: 4 * MIB, granularity: 4 * MIB, attach_delay: Duration::ZERO, ..ElasticConfig::default() },
            cache: CacheConfig { block_size: 4096, ..CacheConfig::default() },
            boost: None,
            tick: Duration::from_secs(1),
            flusher_poll: Duration::from_millis(1),
            fences: Some(dir.join("v.fences.json")),
            // An empty rule set: the cache volumes sit behind a fault layer the test drives.
            faults: ElasticFaults { backing: None, cache: Some(FaultRules::default()) },
            scale: Default::default(),
            background_provision: false,
            credit_horizon: CREDIT_HORIZON,
            stripe: None,
        }
    }

    fn block(v: &dyn BlockDev, b: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        v.read_at(&mut buf, b * 4096).unwrap();
        buf
    }

    /// A cache holding block 0 = 0xA1 (FLUSHed) whose device then refuses every
    /// write and flush (so its metadata cannot be cleared); a write fails it
    /// over; block 0 is rewritten (0xA2) and FLUSHed.
    fn fail_over_with_a_dead_cache(v: &Arc<ElasticVolume>) -> String {
        v.provision(16 * MIB).unwrap();
        v.write_at(&[0xA1; 4096], 0, false).unwrap();
        v.flush().unwrap();
        let id = v.vol.lock().as_ref().unwrap().id.clone();
        v.cache_fault().unwrap().set_rules("write.fail_every=1,flush.fail_every=1".parse().unwrap());
        v.write_at(&[0x11; 4096], 4096, false).unwrap();
        assert!(!v.cache().is_attached(), "fell back to backing");
        v.write_at(&[0xA2; 4096], 0, false).unwrap();
        v.flush().unwrap();
        id
    }

    /// Finding 2: a crash (or stop) before the controller's next tick used to
    /// reopen the failed volume, the newest leftover, and drain its stale block
    /// over the newer FLUSHed data.
    #[test]
    fn a_failed_cache_volume_is_never_reopened_by_a_restart_before_the_controller_deletes_it() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let v = ElasticVolume::open(params(d.path()), cloud(d.path(), &clock), clock.clone()).unwrap();
        let failed = fail_over_with_a_dead_cache(&v);
        drop(v); // no controller tick: the failed volume still exists
        let prov = cloud(d.path(), &clock);
        assert!(prov.list().unwrap().iter().any(|x| x.id == failed));
        let v = ElasticVolume::open(params(d.path()), prov.clone(), clock.clone()).unwrap();
        assert!(!v.cache().is_attached(), "the failed volume must not be used again");
        assert!(block(v.as_ref(), 0) == vec![0xA2; 4096], "block 0 after the restart is not the FLUSHed rewrite");
        for _ in 0..3 {
            v.step().unwrap();
            let _ = v.cache().flush_step(usize::MAX);
        }
        assert!(block(v.as_ref(), 0) == vec![0xA2; 4096]);
        assert_eq!(prov.list().unwrap().len(), 1, "the failed volume is deleted; only the backing volume is left");
        assert!(!std::fs::read_to_string(d.path().join("v.fences.json")).unwrap().contains(&failed), "a deleted volume leaves the fence record");
    }

    /// Finding 2: a failed delete of a failed cache volume used to be forgotten
    /// (the volume leaked, the only leftover a restart would reopen).
    #[test]
    fn a_failed_delete_of_a_fenced_cache_volume_is_retried_until_it_succeeds() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let prov = cloud(d.path(), &clock);
        let v = ElasticVolume::open(params(d.path()), prov.clone(), clock.clone()).unwrap();
        let failed = fail_over_with_a_dead_cache(&v);
        // Refused at the fail-over and at the retry in the same tick.
        prov.inject_failure(surge_cloud::Action::Delete, 0);
        prov.inject_failure(surge_cloud::Action::Delete, 0);
        v.step().unwrap();
        assert_eq!(v.doomed_volumes(), vec![failed.clone()], "the failed delete is remembered");
        assert!(prov.list().unwrap().iter().any(|x| x.id == failed));
        // A restart now still knows (the fence record) and deletes it.
        drop(v);
        let prov = cloud(d.path(), &clock);
        prov.inject_failure(surge_cloud::Action::Delete, 0);
        let v = ElasticVolume::open(params(d.path()), prov.clone(), clock.clone()).unwrap();
        assert!(!v.cache().is_attached());
        assert_eq!(v.doomed_volumes(), vec![failed.clone()]);
        v.step().unwrap();
        assert!(v.doomed_volumes().is_empty());
        assert_eq!(prov.list().unwrap().len(), 1, "deleted on retry");
        assert!(block(v.as_ref(), 0) == vec![0xA2; 4096]);
        // And a new burst can get a new cache.
        v.provision(16 * MIB).unwrap();
        assert!(v.cache().is_attached());
    }

    /// Finding 3 through the control API: lost blocks fail every FLUSH until
    /// `surge set NAME/elastic ack_lost=true`; status says so meanwhile.
    #[test]
    fn lost_blocks_fail_every_flush_until_acknowledged_through_the_control_api() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let v = ElasticVolume::open(params(d.path()), cloud(d.path(), &clock), clock.clone()).unwrap();
        v.provision(16 * MIB).unwrap();
        v.write_at(&[0xA1; 4096], 0, false).unwrap();
        v.flush().unwrap();
        v.cache_fault().unwrap().set_rules("vanish_after=0".parse().unwrap());
        let _ = v.write_at(&[0x11; 4096], 4096, false); // fail-over; block 0 unreadable
        assert!(v.flush().is_err() && v.flush().is_err());
        let st = v.status();
        assert_eq!(st["failure"]["lost_blocks"], 1, "{st}");
        assert!(st["failure"]["action"].as_str().unwrap().contains("ack_lost=true"));
        v.set("ack_lost", "true").unwrap();
        v.flush().unwrap();
        assert!(v.status()["failure"].is_null());
        v.step().unwrap();
        assert!(v.doomed_volumes().is_empty() && v.vol.lock().is_none(), "the given-up volume is deleted");
    }

    /// Finding 8: `surge status` says how much is dirty, how fast it drains and
    /// when it will be clean, as numbers (JSON) and as one line (text).
    #[test]
    fn status_reports_drain_progress_with_rate_and_time_left() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let v = ElasticVolume::open(params(d.path()), cloud(d.path(), &clock), clock.clone()).unwrap();
        v.provision(16 * MIB).unwrap();
        v.write_at(&vec![7u8; (8 * MIB) as usize], 0, false).unwrap();
        v.cache().set_phase(Phase::Drain);
        // Flush a quarter; the backing model paces it on the virtual clock.
        let t0 = clock.now();
        while v.cache().stats().dirty_bytes > 6 * MIB {
            v.cache().flush_step(usize::MAX).unwrap();
        }
        let measured = (2 * MIB) as f64 / (clock.now() - t0).as_secs_f64();
        let st = v.status();
        let drain = &st["drain"];
        let (dirty, rate, eta) = (drain["dirty_bytes"].as_u64().unwrap(), drain["rate_bytes_per_s"].as_f64().unwrap(), drain["eta_s"].as_f64().unwrap());
        assert_eq!(dirty, 6 * MIB, "{drain}");
        assert!((rate / measured - 1.0).abs() < 0.3, "reported drain rate {rate} B/s, measured {measured} B/s");
        assert!((eta - dirty as f64 / rate).abs() < 1e-6 && eta > 0.0, "{drain}");
        let summary = drain["summary"].as_str().unwrap();
        assert!(summary.starts_with("6.3 MB dirty, flushing at ") && summary.contains("MB/s, clean in ~"), "{summary}");
        while v.cache().flush_step(usize::MAX).unwrap() > 0 {}
        assert_eq!(v.status()["drain"]["summary"], "clean");
    }

    /// Finding 7: a long-running daemon keeps a bounded decision log and list
    /// of cache sizes (and counts everything).
    #[test]
    fn decision_log_and_cache_sizes_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let v = ElasticVolume::open(params(d.path()), cloud(d.path(), &clock), clock.clone()).unwrap();
        for i in 0..(LOG_CAP as u64 + 100) {
            v.record(&Decision { at: Duration::from_secs(i), action: Action::StartDrain, reason: format!("r{i}") });
            v.sizes.lock().push(i);
        }
        let log = v.decisions();
        assert_eq!(log.len(), LOG_CAP);
        assert_eq!(log.last().unwrap().reason, format!("r{}", LOG_CAP + 99), "the newest are kept");
        assert_eq!(v.cache_sizes().len(), LOG_CAP);
        let st = v.status();
        assert_eq!(st["decisions_total"], LOG_CAP as u64 + 100);
        assert_eq!(st["caches_provisioned"], LOG_CAP as u64 + 100);
    }
}

/// Issue 39: the controller on a cloud whose calls take time (EBS): attach
/// times observed, a cache still attaching when the burst ends, a detach
/// stuck in-use. All on virtual time.
#[cfg(test)]
mod cloud_tests {
    use super::*;
    use std::sync::mpsc;
    use surge_block::VirtualClock;
    use surge_cloud::LocalProvider;

    const MIB: u64 = 1 << 20;

    fn cloud(dir: &std::path::Path, clock: &Arc<VirtualClock>, delays: surge_cloud::Delays) -> Arc<LocalProvider> {
        let mut cfg = surge_cloud::LocalConfig::new(dir);
        cfg.delays = delays;
        Arc::new(LocalProvider::open(cfg, clock.clone()).unwrap())
    }

    fn params(dir: &std::path::Path, background: bool) -> ElasticParams {
        ElasticParams {
            name: "v".into(),
            backing: "reserved:64MiB,bw=33MB/s".parse().unwrap(),
            cache_bw: 128_000_000,
            policy: ElasticConfig { backing_bw: 33e6, initial_cache: 16 * MIB, min_cache: 4 * MIB, granularity: 4 * MIB, attach_delay: Duration::from_secs(3), learn_period: false, ..ElasticConfig::default() },
            cache: CacheConfig { block_size: 4096, ..CacheConfig::default() },
            boost: None,
            tick: Duration::from_secs(1),
            flusher_poll: Duration::from_millis(1),
            fences: Some(dir.join("v.fences.json")),
            faults: ElasticFaults::default(),
            scale: Default::default(),
            background_provision: background,
            credit_horizon: CREDIT_HORIZON,
            stripe: None,
        }
    }

    /// A provider whose attach (or detach) of a cache volume waits until
    /// the test lets it go (an EBS attach that takes minutes, a detach stuck
    /// in-use), counting the calls begun.
    struct Gated {
        inner: Arc<LocalProvider>,
        on: surge_cloud::Action,
        gate: Mutex<mpsc::Receiver<()>>,
        begun: AtomicU64,
    }

    impl Gated {
        fn new(inner: Arc<LocalProvider>, on: surge_cloud::Action) -> (Arc<Self>, mpsc::Sender<()>) {
            let (go, gate) = mpsc::channel();
            (Arc::new(Gated { inner, on, gate: Mutex::new(gate), begun: AtomicU64::new(0) }), go)
        }

        fn hold(&self, action: surge_cloud::Action, id: &str) {
            if action == self.on && self.inner.describe(id).is_ok_and(|v| v.name.as_deref().is_some_and(|n| n.contains("-cache-"))) {
                self.begun.fetch_add(1, Relaxed);
                let _ = self.gate.lock().recv();
            }
        }
    }

    impl Provider for Gated {
        fn create(&self, r: CreateRequest) -> surge_cloud::provider::Result<surge_cloud::VolumeInfo> {
            self.inner.create(r)
        }
        fn attach(&self, id: &str) -> surge_cloud::provider::Result<Arc<dyn BlockDev>> {
            self.hold(surge_cloud::Action::Attach, id);
            self.inner.attach(id)
        }
        fn detach(&self, id: &str) -> surge_cloud::provider::Result<()> {
            self.hold(surge_cloud::Action::Detach, id);
            self.inner.detach(id)
        }
        fn delete(&self, id: &str) -> surge_cloud::provider::Result<()> {
            self.inner.delete(id)
        }
        fn list(&self) -> surge_cloud::provider::Result<Vec<surge_cloud::VolumeInfo>> {
            self.inner.list()
        }
        fn describe(&self, id: &str) -> surge_cloud::provider::Result<surge_cloud::VolumeInfo> {
            self.inner.describe(id)
        }
        fn cost(&self) -> surge_cloud::provider::Result<surge_cloud::CostReport> {
            self.inner.cost()
        }
    }

    /// `n` writes of 8 MiB (byte i + 1) every 0.2 s of compute: well above
    /// 30 % of 33 MB/s (the backing's model paces them on the virtual clock).
    fn burst(v: &Arc<ElasticVolume>, clock: &VirtualClock, n: u64) {
        for i in 0..n {
            v.write_at(&vec![i as u8 + 1; (8 * MIB) as usize], i * 4 * MIB % (48 * MIB), false).unwrap();
            clock.advance(Duration::from_millis(200));
            v.step().unwrap();
        }
    }

    #[test]
    fn a_cache_still_attaching_when_the_burst_ends_is_released_unused() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let local = cloud(d.path(), &clock, surge_cloud::Delays::none());
        let (prov, go) = Gated::new(local.clone(), surge_cloud::Action::Attach);
        let v = ElasticVolume::open(params(d.path(), true), prov.clone(), clock.clone()).unwrap();
        burst(&v, &clock, 20);
        // The controller keeps ticking while the attach hangs; I/O goes to backing.
        while prov.begun.load(Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!v.cache().is_attached());
        assert_eq!(v.status()["state"], "provisioning");
        assert!(v.status()["provisioning"]["size"].as_u64() == Some(16 * MIB), "{}", v.status()["provisioning"]);
        for _ in 0..50 {
            clock.advance(Duration::from_secs(1));
            v.step().unwrap();
        }
        assert!(v.decisions().iter().any(|d| d.action == Action::CancelProvision), "{:?}", v.decisions());
        assert_eq!(v.status()["provisioning"]["cancelled"], true);
        assert_eq!(v.status()["state"], "idle");
        // The attach completes at last: the volume is detached and deleted, never used.
        go.send(()).unwrap();
        for _ in 0..1000 {
            v.step().unwrap();
            if v.status()["provisioning"].is_null() && v.doomed_volumes().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(v.status()["provisioning"].is_null());
        assert!(!v.cache().is_attached());
        let names: Vec<_> = local.list().unwrap().into_iter().filter_map(|x| x.name).collect();
        assert_eq!(names, vec!["v-backing".to_string()], "the late cache volume is deleted");
        assert_eq!(v.status()["attach_time"]["observed"]["samples"], 1, "a cancelled attach still teaches how long attaches take");
        let mut buf = vec![0u8; 4096];
        v.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf[0], 13, "the burst's last write to block 0 (i = 12) went to backing");
    }

    /// Steps (each after `dt` of virtual time and a real millisecond, for
    /// the worker threads) until `done`, at most `n`.
    fn step_until(v: &Arc<ElasticVolume>, clock: &VirtualClock, dt: Duration, n: usize, mut done: impl FnMut(&ElasticVolume) -> bool) -> bool {
        for _ in 0..n {
            if done(v) {
                return true;
            }
            clock.advance(dt);
            while v.cache().flush_step(usize::MAX).unwrap_or(0) > 0 {}
            v.step().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        done(v)
    }

    #[test]
    fn a_detach_that_hangs_holds_up_neither_the_controller_nor_the_next_burst() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let local = cloud(d.path(), &clock, surge_cloud::Delays::none());
        let (prov, go) = Gated::new(local.clone(), surge_cloud::Action::Detach);
        let v = ElasticVolume::open(params(d.path(), true), prov.clone(), clock.clone()).unwrap();
        burst(&v, &clock, 20);
        assert!(step_until(&v, &clock, Duration::from_millis(200), 500, |v| v.cache().is_attached()), "{:?}", v.decisions());
        let first = v.vol.lock().as_ref().unwrap().id.clone();
        // Idle: drained, released; its detach hangs on the reaper thread.
        assert!(step_until(&v, &clock, Duration::from_secs(1), 300, |_| prov.begun.load(Relaxed) == 1), "{:?}", v.decisions());
        assert!(!v.cache().is_attached());
        assert_eq!(v.status()["deletes"][0]["id"], first.as_str(), "{}", v.status());
        // The next burst gets its cache while the first volume is still detaching.
        burst(&v, &clock, 20);
        assert!(step_until(&v, &clock, Duration::from_millis(200), 500, |v| v.cache().is_attached()), "{:?}", v.decisions());
        let second = v.vol.lock().as_ref().unwrap().id.clone();
        assert_ne!(second, first);
        assert!(local.list().unwrap().iter().any(|x| x.id == first && x.state == surge_cloud::VolumeState::Attached), "not deleted while attached");
        // The detach completes at last: the first volume is deleted, the second serves.
        go.send(()).unwrap();
        assert!(step_until(&v, &clock, Duration::from_millis(200), 1000, |v| v.doomed_volumes().is_empty()), "{}", v.status()["deletes"]);
        assert!(!local.list().unwrap().iter().any(|x| x.id == first));
        assert!(v.cache().is_attached());
        let mut buf = vec![0u8; 4096];
        v.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf[0], 13, "the second burst's last write to block 0");
    }

    #[test]
    fn observed_attach_times_replace_the_configured_guess() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let delays = surge_cloud::Delays { create: Duration::from_secs(2), attach: Duration::from_secs(20), detach: Duration::ZERO, delete: Duration::ZERO };
        let v = ElasticVolume::open(params(d.path(), false), cloud(d.path(), &clock, delays), clock.clone()).unwrap();
        assert_eq!(v.status()["attach_time"]["estimate_s"], 3.0, "the configured first estimate");
        burst(&v, &clock, 20);
        assert!(v.cache().is_attached());
        let st = v.status();
        let obs = &st["attach_time"]["observed"];
        assert_eq!((obs["samples"].as_u64(), obs["last_s"].as_f64()), (Some(1), Some(22.0)), "{st}");
        assert_eq!(st["attach_time"]["estimate_s"], 44.0, "22 s + 2 x 11 s after one sample");
    }

    /// Item 6 for the elastic path: the cloud refuses the cache volume
    /// (InsufficientVolumeCapacity, VolumeLimitExceeded, an attach that
    /// times out and is undone: here the local cloud's injected failures).
    /// I/O goes on at the backing; status says why and when it retries;
    /// the retry waits out a backoff, then succeeds.
    #[test]
    fn a_refused_cache_volume_leaves_io_on_the_backing_and_is_retried_after_a_backoff() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let prov = cloud(d.path(), &clock, surge_cloud::Delays::none());
        let v = ElasticVolume::open(params(d.path(), false), prov.clone(), clock.clone()).unwrap();
        for _ in 0..2 {
            prov.inject_failure(surge_cloud::Action::Create, 0);
        }
        // The first window above UT asks for a cache: refused.
        let mut failed_at = None;
        for i in 0..40u64 {
            v.write_at(&vec![7; (8 * MIB) as usize], i * 4 * MIB % (48 * MIB), false).unwrap();
            clock.advance(Duration::from_millis(200));
            let r = v.step();
            if r.is_err() && failed_at.is_none() {
                failed_at = Some(clock.now());
                let st = v.status();
                let f = &st["provision_failure"];
                assert_eq!(f["attempts"], 1, "{st}");
                assert!(f["error"].as_str().unwrap().contains("injected failure"), "{f}");
                assert!(f["effect"].as_str().unwrap().contains("backing"));
                assert!(!v.cache().is_attached());
            }
            if v.cache().is_attached() {
                break;
            }
        }
        let failed_at = failed_at.expect("the refused create is reported");
        assert!(v.cache().is_attached(), "retried after the backoff: {:?}", v.decisions());
        assert!(v.status()["provision_failure"].is_null(), "cleared by the success");
        // Two failures (1 s, then 2 s backoff) before the third try succeeded.
        assert!(clock.now() >= failed_at + Duration::from_secs(3), "{:?} vs {failed_at:?}", clock.now());
        let mut buf = [0u8; 4];
        v.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7; 4]);
    }

    #[test]
    fn a_detach_stuck_in_use_is_retried_with_a_backoff_and_never_deleted_while_attached() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let prov = cloud(d.path(), &clock, surge_cloud::Delays::none());
        let v = ElasticVolume::open(params(d.path(), false), prov.clone(), clock.clone()).unwrap();
        v.provision(16 * MIB).unwrap();
        v.write_at(&[9; 4096], 0, false).unwrap();
        let id = v.vol.lock().as_ref().unwrap().id.clone();
        v.policy.lock().attached(clock.now(), 16 * MIB, v.obs());
        v.cache().set_phase(Phase::Drain);
        v.policy.lock().resume_drain(clock.now(), 16 * MIB);
        while v.cache().flush_step(usize::MAX).unwrap() > 0 {}
        for _ in 0..3 {
            prov.inject_failure(surge_cloud::Action::Detach, 0);
        }
        v.step().unwrap();
        let kinds: Vec<String> = v.decisions().iter().map(|d| format!("{:?}", d.action)).collect();
        assert!(kinds.iter().any(|k| k == "Detach") && kinds.iter().any(|k| k.starts_with("DetachFailed")), "{kinds:?}");
        v.step().unwrap();
        let st = v.status();
        assert_eq!(st["deletes"][0]["id"], id.as_str(), "{st}");
        assert_eq!(st["deletes"][0]["attempts"], 2, "{st}");
        assert!(st["deletes"][0]["last_error"].as_str().unwrap().starts_with("detaching"), "{st}");
        assert!(st["deletes"][0]["retry_in_s"].as_f64().unwrap() > 0.0);
        assert!(prov.list().unwrap().iter().any(|x| x.id == id && x.state == surge_cloud::VolumeState::Attached), "kept while attached");
        v.step().unwrap();
        assert_eq!(v.status()["deletes"][0]["attempts"], 2, "not retried before the backoff");
        clock.advance(Duration::from_secs(2));
        v.step().unwrap();
        assert!(v.doomed_volumes().is_empty(), "{}", v.status()["deletes"]);
        assert!(!prov.list().unwrap().iter().any(|x| x.id == id));
        let mut buf = [0u8; 4];
        v.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [9; 4]);
    }
}
