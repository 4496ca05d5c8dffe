//! Fair sharing of one device among tenants.
//!
//! [`FairQueue`] wraps a shared `Arc<dyn BlockDev>` and hands out [`Tenant`]
//! handles, each a `BlockDev` of its own. A request on a handle is queued in the
//! pure [`Scheduler`] (SFQ(D) with mClock reservations and limits); the calling
//! thread parks until the scheduler dispatches it, does the I/O on the shared
//! device outside the lock, and its completion frees a slot for the next one.
//! Weights, reservations, limits, the depth and adaptive control change live.
//!
//! Cooperation across servers ([`global`]): the queue reports what it served
//! ([`FairQueue::report`]) and takes in its peers' reports
//! ([`FairQueue::apply_report`]); the transport is the daemon's business.

pub mod adaptive;
pub mod global;
pub mod sched;
pub mod stats;
#[cfg(test)]
mod cluster;
#[cfg(test)]
mod global_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use adaptive::AdaptiveConfig;
pub use global::{Anticipate, Credit, GlobalConfig, Ledger, PeerStatus, Report, TenantReport};
pub use sched::{Dispatch, Phase, ReqId, SchedConfig, Scheduler, TenantConfig, TenantCounters, TenantId};
pub use stats::{Histogram, RecentStats};

use crate::clock::Clock;
use crate::dev::{BlockDev, Caps, Extent, ZeroMode};
use crate::error::{BlockError, Result};
use parking_lot::Mutex;
use serde::Serialize;
use stats::Recent;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

/// Longest a parked request sleeps before it re-checks eligibility itself.
/// Grants unpark it at once and time-based waits are timed exactly, so this is
/// only a safety net (and covers virtual clocks moved without `kick`); kept long
/// because every wake-up takes the lock.
const POLL: Duration = Duration::from_millis(250);
/// Epoch of the recent-rate and latency statistics.
const STATS_EPOCH: Duration = Duration::from_secs(5);

struct Waiter {
    granted: AtomicBool,
    thread: Thread,
}

struct TenantInfo {
    name: String,
    recent: Recent,
    bytes: u64,
    ops: u64,
}

struct Shared {
    sched: Scheduler,
    waiters: HashMap<ReqId, Arc<Waiter>>,
    tenants: Vec<TenantInfo>,
    /// What peers reported (used while `sched`'s config has `global`).
    ledger: Ledger,
}

/// One shared device, many weighted tenants.
pub struct FairQueue {
    dev: Arc<dyn BlockDev>,
    clock: Arc<dyn Clock>,
    shared: Mutex<Shared>,
}

/// A tenant's view of the shared device.
pub struct Tenant {
    queue: Arc<FairQueue>,
    id: TenantId,
}

/// A tenant's share and what it has had.
#[derive(Debug, Clone, Serialize)]
pub struct TenantStats {
    pub name: String,
    pub config: TenantConfig,
    pub ops: u64,
    pub bytes: u64,
    pub queued: usize,
    pub in_flight: usize,
    pub by_reservation: u64,
    /// Cost served at other servers, as peers reported it.
    pub remote_cost: u64,
    /// Times a request was held back for a tenant owed service.
    pub held: u64,
    /// Total service (here and elsewhere) per unit of weight, in bytes.
    pub global_service: f64,
    pub recent: RecentStats,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueueStats {
    pub config: SchedConfig,
    /// D in force now (differs from `config.depth` under adaptive control).
    pub depth: usize,
    pub outstanding: usize,
    pub tenants: Vec<TenantStats>,
    /// Peers heard from (cooperation across servers).
    pub peers: Vec<PeerStatus>,
    /// Holds for owed tenants that ran out their anticipation bound.
    pub holds_expired: u64,
    /// Holds begun, and the time free slots were kept for owed tenants in all.
    pub holds_started: u64,
    pub hold_time_us: u64,
    /// Peer reports that only set a new baseline (first, restarted, or after
    /// the peer was stale: what it served meanwhile is not credited).
    pub rebased: u64,
}

impl FairQueue {
    pub fn new(dev: Arc<dyn BlockDev>, cfg: SchedConfig, clock: Arc<dyn Clock>) -> Arc<Self> {
        let g = cfg.global.clone().unwrap_or_default();
        let mut ledger = Ledger::new(g.peer_timeout);
        ledger.set_max_peers(g.max_peers);
        let shared = Shared { sched: Scheduler::new(cfg), waiters: HashMap::new(), tenants: Vec::new(), ledger };
        Arc::new(FairQueue { dev, clock, shared: Mutex::new(shared) })
    }

    pub fn device(&self) -> &Arc<dyn BlockDev> {
        &self.dev
    }

    /// A handle for tenant `name`, created with `cfg` if new (an existing
    /// tenant keeps its share, so several exports may join one tenant).
    pub fn tenant(self: &Arc<Self>, name: &str, cfg: TenantConfig) -> Arc<Tenant> {
        let mut s = self.shared.lock();
        let id = match s.tenants.iter().position(|t| t.name == name) {
            Some(id) => id,
            None => {
                let now = self.clock.now();
                s.tenants.push(TenantInfo { name: name.to_string(), recent: Recent::new(STATS_EPOCH, now), bytes: 0, ops: 0 });
                s.sched.add_tenant(cfg)
            }
        };
        Arc::new(Tenant { queue: self.clone(), id })
    }

    pub fn tenant_names(&self) -> Vec<String> {
        self.shared.lock().tenants.iter().map(|t| t.name.clone()).collect()
    }

    fn id_of(s: &Shared, name: &str) -> Result<TenantId> {
        s.tenants.iter().position(|t| t.name == name).ok_or_else(|| BlockError::Gone(format!("no tenant {name:?}")))
    }

    pub fn tenant_config(&self, name: &str) -> Result<TenantConfig> {
        let s = self.shared.lock();
        Ok(s.sched.tenant_config(Self::id_of(&s, name)?))
    }

    /// Change a tenant's weight, reservation or limit live.
    pub fn set_tenant(&self, name: &str, cfg: TenantConfig) -> Result<()> {
        self.update(|s, now| {
            let id = Self::id_of(s, name)?;
            s.sched.set_tenant(id, cfg, now);
            Ok(())
        })
    }

    pub fn set_depth(&self, depth: usize) {
        let _ = self.update(|s, _| {
            s.sched.set_depth(depth);
            Ok(())
        });
    }

    pub fn set_overhead(&self, overhead: u64) {
        let _ = self.update(|s, _| {
            s.sched.set_overhead(overhead);
            Ok(())
        });
    }

    /// Cooperate with peers (or stop: plain SFQ(D) from now on).
    pub fn set_global(&self, global: Option<GlobalConfig>) {
        let _ = self.update(|s, now| {
            if let Some(g) = &global {
                s.ledger.set_timeout(g.peer_timeout);
                s.ledger.set_max_peers(g.max_peers);
            }
            s.sched.set_global(global);
            refresh_activity(s, now);
            Ok(())
        });
    }

    /// Per tenant: cost dispatched here so far, its reservation part, and
    /// whether it was busy here since the previous report.
    pub fn report(&self) -> Vec<TenantReport> {
        let mut s = self.shared.lock();
        let names = s.names();
        global::local_report(&mut s.sched, &names)
    }

    /// Take in a peer's report: credit what its tenants got there, note who is busy.
    /// Tenants this queue does not have are ignored.
    pub fn apply_report(&self, r: &Report) {
        let _ = self.update(|s, now| {
            let (names, on) = (s.names(), s.sched.config().global.is_some());
            let Shared { sched, ledger, .. } = s;
            ledger.apply_to(sched, &names, r, now, on);
            Ok(())
        });
    }

    /// Re-judge which peers are live (call every report period): a silent
    /// peer's tenants stop counting as busy once it times out.
    pub fn refresh_peers(&self) {
        let _ = self.update(|s, now| {
            refresh_activity(s, now);
            let (names, on) = (s.names(), s.sched.config().global.is_some());
            s.ledger.converge(&mut s.sched, &names, now, on);
            Ok(())
        });
    }

    pub fn set_adaptive(&self, adaptive: Option<AdaptiveConfig>) {
        let _ = self.update(|s, _| {
            s.sched.set_adaptive(adaptive);
            Ok(())
        });
    }

    /// Re-evaluate time-based eligibility now (after moving a virtual clock).
    pub fn kick(&self) {
        let _ = self.update(|_, _| Ok(()));
    }

    fn update(&self, f: impl FnOnce(&mut Shared, Duration) -> Result<()>) -> Result<()> {
        let now = self.clock.now();
        let mut s = self.shared.lock();
        f(&mut s, now)?;
        pump(&mut s, now);
        Ok(())
    }

    pub fn stats(&self) -> QueueStats {
        let now = self.clock.now();
        let mut s = self.shared.lock();
        let Shared { sched, tenants, ledger, .. } = &mut *s;
        let tenants = tenants
            .iter_mut()
            .enumerate()
            .map(|(id, t)| {
                let c = sched.counters(id);
                TenantStats {
                    name: t.name.clone(),
                    config: sched.tenant_config(id),
                    ops: t.ops,
                    bytes: t.bytes,
                    queued: c.queued,
                    in_flight: c.in_flight,
                    by_reservation: c.by_reservation,
                    remote_cost: c.remote_cost,
                    held: c.held,
                    global_service: sched.global_service(id),
                    recent: t.recent.snapshot(now),
                }
            })
            .collect();
        QueueStats {
            config: sched.config().clone(),
            depth: sched.depth(),
            outstanding: sched.outstanding(),
            tenants,
            peers: ledger.peers(now),
            holds_expired: sched.holds_expired(),
            holds_started: sched.holds().0,
            hold_time_us: sched.holds().1.as_micros() as u64,
            rebased: ledger.rebased(),
        }
    }

    /// Run `io` for tenant `id` once the scheduler lets a request of `bytes` through.
    fn run<T>(&self, id: TenantId, bytes: u64, io: impl FnOnce() -> T) -> T {
        let queued_at = self.clock.now();
        let req = self.admit(id, bytes, queued_at);
        let _done = Completion { queue: self, req, bytes, queued_at };
        io()
    }

    /// Queue a request and park until it is dispatched.
    fn admit(&self, id: TenantId, bytes: u64, now: Duration) -> ReqId {
        let waiter = Arc::new(Waiter { granted: AtomicBool::new(false), thread: std::thread::current() });
        let req = {
            let mut s = self.shared.lock();
            let req = s.sched.enqueue(id, bytes, now);
            s.waiters.insert(req, waiter.clone());
            pump(&mut s, now);
            req
        };
        while !waiter.granted.load(Ordering::Acquire) {
            std::thread::park_timeout(self.park_time());
            if !waiter.granted.load(Ordering::Acquire) {
                let now = self.clock.now();
                pump(&mut self.shared.lock(), now);
            }
        }
        req
    }

    /// How long to park: until the next time-based eligibility, at most POLL.
    fn park_time(&self) -> Duration {
        let now = self.clock.now();
        let next = self.shared.lock().sched.next_wakeup(now);
        next.map_or(POLL, |t| t.saturating_sub(now).min(POLL))
    }

    fn complete(&self, req: ReqId, bytes: u64, queued_at: Duration) {
        let now = self.clock.now();
        let mut s = self.shared.lock();
        if let Some((t, _)) = s.sched.complete(req, now) {
            let info = &mut s.tenants[t];
            info.ops += 1;
            info.bytes += bytes;
            info.recent.record(now, bytes, now.saturating_sub(queued_at));
        }
        pump(&mut s, now);
    }
}

impl Shared {
    fn names(&self) -> Vec<String> {
        self.tenants.iter().map(|t| t.name.clone()).collect()
    }
}

/// Which tenants live peers report busy (none while cooperation is off).
fn refresh_activity(s: &mut Shared, now: Duration) {
    let (names, on) = (s.names(), s.sched.config().global.is_some());
    s.ledger.refresh(&mut s.sched, &names, now, on);
}

/// Dispatch all that may go now and wake their callers.
fn pump(s: &mut Shared, now: Duration) {
    while let Some(d) = s.sched.dispatch(now) {
        if let Some(w) = s.waiters.remove(&d.req) {
            w.granted.store(true, Ordering::Release);
            w.thread.unpark();
        }
    }
}

/// Frees the request's slot even if the I/O panics.
struct Completion<'a> {
    queue: &'a FairQueue,
    req: ReqId,
    bytes: u64,
    queued_at: Duration,
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        self.queue.complete(self.req, self.bytes, self.queued_at);
    }
}

impl Tenant {
    pub fn queue(&self) -> &Arc<FairQueue> {
        &self.queue
    }

    pub fn id(&self) -> TenantId {
        self.id
    }

    pub fn name(&self) -> String {
        self.queue.shared.lock().tenants[self.id].name.clone()
    }

    fn dev(&self) -> &dyn BlockDev {
        &*self.queue.dev
    }

    fn sched<T>(&self, bytes: u64, io: impl FnOnce() -> T) -> T {
        self.queue.run(self.id, bytes, io)
    }
}

impl BlockDev for Tenant {
    fn size(&self) -> u64 {
        self.dev().size()
    }
    fn caps(&self) -> Caps {
        self.dev().caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.sched(buf.len() as u64, || self.dev().read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.sched(buf.len() as u64, || self.dev().write_at(buf, offset, fua))
    }
    fn flush(&self) -> Result<()> {
        self.sched(0, || self.dev().flush())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.sched(0, || self.dev().discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        // Zeroes written as buffers cost their length; native zeroing costs a request.
        let bytes = if self.dev().caps().fast_zero { 0 } else { len };
        self.sched(bytes, || self.dev().write_zeroes(offset, len, mode))
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        // Metadata only: not worth a slot.
        self.dev().block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        self.sched(len, || self.dev().prefetch(offset, len))
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.dev().may_wait_remote(offset, len, write)
    }
}
