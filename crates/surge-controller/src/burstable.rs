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

use crate::Controllable;
use anyhow::{bail, Context};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::{CacheConfig, CacheMode, ElasticCache};
use surge_block::mirror::{spawn_rebuild, Mirror, MirrorConfig, MirrorError, MirrorProgress, Rebuilder};
use surge_block::stripe::{Stripe, StripeConfig};
use surge_block::{BlockDev, Caps, Clock, ClockThread, Extent, FileDev, ZeroMode};
use surge_cloud::{CreateRequest, Provider, VolumeSpec};
use surge_policy::burstable::{Action, BurstableConfig, BurstablePolicy, MemberObs, Mode, Obs, SlotView, Strategy};

pub mod ebs;
pub mod spec;

pub use spec::{local_delays, parse_params, stripe_shape};

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
    /// The UNIX time of the clock's zero, in ns: where CloudWatch's points
    /// (UNIX times) fall on the clock. `None`: the system's time at `open`
    /// less the clock's (the daemon, whose clock is the system's).
    pub epoch_unix_ns: Option<u64>,
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
    /// Controller steps that panicked (each logged; the next tick ran again).
    step_panics: AtomicU64,
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
            let epoch_unix_ns = p.epoch_unix_ns.unwrap_or_else(|| surge_cloud::WallClock::anchored(clock.clone()).epoch_unix_ns);
            (m.clone(), Some(ebs::SampledCredits::new(m, &p.member, epoch_unix_ns, p.cloudwatch_every)))
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
            bail!("{} holds a burstable volume of {}; the spec asks for {}: a volume never shrinks", p.state_dir.display(), surge_block::units::format_size(old), surge_block::units::format_size(p.size));
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
            step_panics: AtomicU64::new(0),
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
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        let t = crate::spawn_registered(format!("burstable-{}", self.p.name), self.clock.clone(), move || {
            let mut next = me.clock.now();
            while !me.stop.load(Relaxed) {
                me.guarded_step();
                next += me.p.tick;
                next = next.max(me.clock.now());
                me.clock.sleep_until(next);
            }
        })?;
        self.threads.lock().push(t);
        Ok(())
    }

    /// One controller step whose failure, even a panic, costs that tick only
    /// (what the controller thread runs each tick):
    /// a controller thread that died would leave every member unswapped for
    /// good, and silently. Panics are counted (`controller_panics` in status);
    /// the locks are parking_lot's, released and not poisoned by the unwind.
    pub fn guarded_step(&self) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step())) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(volume = %self.p.name, "burstable controller: {e:#}"),
            Err(panic) => {
                self.step_panics.fetch_add(1, Relaxed);
                let msg = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                tracing::error!(volume = %self.p.name, "burstable controller: a step panicked ({msg}); the next tick tries again");
            }
        }
    }

    /// Stop the controller and the rebuilds (state stays as it is; a restart resumes).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.lock().drain(..) {
            if t.join().is_err() {
                tracing::error!(volume = %self.p.name, "burstable controller thread panicked");
            }
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

    /// Swaps asked for (`request_swap`, `surge set NAME swap=`) and not started yet.
    pub fn requested_swaps(&self) -> usize {
        self.manual.lock().len()
    }

    /// The mirror and target volume of the swap in flight in `slot`, if any.
    pub fn swap_in_flight(&self, slot: usize) -> Option<(Arc<Mirror>, String)> {
        self.slots.lock().get(slot)?.swap.as_ref().map(|w| (w.mirror.clone(), w.target.clone()))
    }

    /// The parameters in force (after `open` fitted them to the instance's attachment slots).
    pub fn params(&self) -> &BurstableParams {
        &self.p
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

    /// At the daemon's exit on a real cloud: the controller stops and every
    /// volume of the stack is detached (not deleted).
    pub fn detach_all(&self) {
        self.stop();
        let ids: Vec<String> = {
            let slots = self.slots.lock();
            slots.iter().flat_map(|s| std::iter::once(s.member.clone()).chain(s.swap.as_ref().map(|w| w.target.clone()))).collect()
        };
        let backing = self.saved.lock().backing.clone();
        for id in ids.iter().chain(backing.as_ref()) {
            if let Err(e) = self.provider.detach(id) {
                tracing::error!(volume = %id, "detaching at exit: {e}");
            }
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
            "controller_panics": self.step_panics.load(Relaxed),
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
                let r = if value == "off" { None } else { Some(surge_cloud::spec::parse_rate(value).map_err(|e| e.to_string())?) };
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
