//! The pure scheduler: SFQ(D) with mClock-style reservations and limits.
//!
//! No threads and no clock: every call takes `now`, so tests drive it on virtual
//! time and count exactly. The blocking layer ([`super::FairQueue`]) wraps it.
//!
//! * Proportional share (SFQ(D), Jin et al. 2004): a request's start tag is
//!   `max(v, tenant's last finish tag)`, its finish tag `start + cost / weight`;
//!   `v` is the start tag of the last request dispatched by weight. The smallest
//!   start tag is dispatched while fewer than `depth` requests are outstanding.
//!   An idle tenant's last finish falls behind `v`, so it earns no credit.
//! * Reservation and limit (mClock, Gulati et al. 2010), in cost units per second:
//!   a request's R tag is `max(previous R + cost / reservation, now)`, its L tag
//!   likewise with the limit. A head whose R tag is due is dispatched first
//!   (smallest R tag); otherwise only tenants whose L tag is due compete by start
//!   tag. Service given for a reservation also advances the tenant's SFQ tags, so
//!   a tenant gets the larger of its reservation and its weighted share.
//!
//! Tags are computed when a request reaches the head of its tenant's queue, so a
//! live change of weight, reservation or limit applies from the next head on.

use super::adaptive::{Adaptive, AdaptiveConfig, Share, Window};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

pub type TenantId = usize;
pub type ReqId = u64;

/// Weights scale costs by lcm(1..=16), so costs divide exactly by common weights
/// and tests can count exactly.
const WSCALE: u128 = 720_720;
const NANOS: u128 = 1_000_000_000;

/// A tenant's share. Rates are in cost units (bytes plus per-request overhead) per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantConfig {
    /// Relative share of the device while others compete (at least 1).
    pub weight: u32,
    /// Minimum rate, served ahead of weights when due.
    pub reservation: Option<u64>,
    /// Maximum rate; the tenant waits (even on an idle device) beyond it.
    pub limit: Option<u64>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig { weight: 1, reservation: None, limit: None }
    }
}

/// The shared part of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// D: how many requests may be outstanding at the device at once.
    pub depth: usize,
    /// Cost added to every request, in bytes: seeks and per-request work.
    pub overhead: u64,
    /// Let the scheduler move D itself (within bounds); `depth` is its start.
    pub adaptive: Option<AdaptiveConfig>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig { depth: 2, overhead: 0, adaptive: None }
    }
}

/// Why a request was dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Reservation,
    Weight,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    pub req: ReqId,
    pub tenant: TenantId,
    pub phase: Phase,
}

/// Counters the scheduler keeps per tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TenantCounters {
    pub dispatched: u64,
    pub dispatched_cost: u64,
    pub by_reservation: u64,
    pub completed: u64,
    pub completed_cost: u64,
    /// Waiting for dispatch now.
    pub queued: usize,
    /// Dispatched, not yet complete.
    pub in_flight: usize,
}

#[derive(Debug)]
struct Pending {
    id: ReqId,
    cost: u64,
}

#[derive(Debug, Clone, Copy)]
struct Head {
    start: u128,
    finish: u128,
    r: Option<u128>,
    l: Option<u128>,
}

#[derive(Debug)]
struct TenantState {
    cfg: TenantConfig,
    queue: VecDeque<Pending>,
    head: Option<Head>,
    last_finish: u128,
    /// Finish minus start of the last dispatched request.
    last_span: u128,
    /// R and L tags of the last request that reached the head.
    last_r: Option<u128>,
    last_l: Option<u128>,
    counters: TenantCounters,
}

#[derive(Debug)]
struct Outstanding {
    tenant: TenantId,
    cost: u64,
    dispatched_at: Duration,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    depth: usize,
    vtime: u128,
    tenants: Vec<TenantState>,
    outstanding: HashMap<ReqId, Outstanding>,
    next_id: ReqId,
    adaptive: Option<Adaptive>,
    window: Window,
}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

fn rate_step(cost: u64, rate: u64) -> u128 {
    (cost as u128 * NANOS).div_ceil(rate.max(1) as u128)
}

impl Scheduler {
    pub fn new(cfg: SchedConfig) -> Self {
        let depth = cfg.depth.max(1);
        let adaptive = cfg.adaptive.clone().map(Adaptive::new);
        Scheduler {
            cfg,
            depth,
            vtime: 0,
            tenants: Vec::new(),
            outstanding: HashMap::new(),
            next_id: 0,
            adaptive,
            window: Window::default(),
        }
    }

    pub fn add_tenant(&mut self, cfg: TenantConfig) -> TenantId {
        self.tenants.push(TenantState {
            cfg: sanitize(cfg),
            queue: VecDeque::new(),
            head: None,
            last_finish: 0,
            last_span: 0,
            last_r: None,
            last_l: None,
            counters: TenantCounters::default(),
        });
        self.window.tenants.push(Default::default());
        self.tenants.len() - 1
    }

    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    pub fn tenant_config(&self, t: TenantId) -> TenantConfig {
        self.tenants[t].cfg
    }

    /// Change a tenant's share live. Its last finish tag is clamped to one
    /// request ahead of virtual time, so a lead built up by a reservation does not
    /// carry over into the new share; the head is re-tagged at once.
    pub fn set_tenant(&mut self, t: TenantId, cfg: TenantConfig, now: Duration) {
        let vtime = self.vtime;
        let ts = &mut self.tenants[t];
        ts.cfg = sanitize(cfg);
        ts.last_finish = ts.last_finish.min(vtime + ts.last_span);
        if ts.head.take().is_some() {
            self.retag(t, now);
        }
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// The depth in force now (moves under adaptive control).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Set D live. With adaptive control on, this is its new starting point.
    pub fn set_depth(&mut self, depth: usize) {
        self.depth = match &self.adaptive {
            Some(a) => a.clamp(depth),
            None => depth.max(1),
        };
        self.cfg.depth = self.depth;
    }

    pub fn set_overhead(&mut self, overhead: u64) {
        self.cfg.overhead = overhead;
    }

    pub fn set_adaptive(&mut self, adaptive: Option<AdaptiveConfig>) {
        self.adaptive = adaptive.clone().map(Adaptive::new);
        self.cfg.adaptive = adaptive;
        self.set_depth(self.depth);
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    pub fn counters(&self, t: TenantId) -> TenantCounters {
        self.tenants[t].counters
    }

    /// The cost of a request of `bytes` bytes.
    pub fn cost_of(&self, bytes: u64) -> u64 {
        bytes + self.cfg.overhead
    }

    /// Queue a request of `bytes` bytes (its cost adds the overhead).
    pub fn enqueue(&mut self, t: TenantId, bytes: u64, now: Duration) -> ReqId {
        let id = self.next_id;
        self.next_id += 1;
        let cost = self.cost_of(bytes);
        let ts = &mut self.tenants[t];
        if ts.queue.is_empty() && ts.counters.in_flight == 0 {
            self.window.tenants[t].went_idle = true;
        }
        ts.queue.push_back(Pending { id, cost });
        ts.counters.queued += 1;
        if ts.head.is_none() {
            self.retag(t, now);
        }
        id
    }

    /// Tag the tenant's first queued request.
    fn retag(&mut self, t: TenantId, now: Duration) {
        let vtime = self.vtime;
        let ts = &mut self.tenants[t];
        let Some(p) = ts.queue.front() else {
            ts.head = None;
            return;
        };
        let start = vtime.max(ts.last_finish);
        let finish = start + p.cost as u128 * WSCALE / ts.cfg.weight as u128;
        let now = nanos(now);
        let r = ts.cfg.reservation.map(|rate| ts.last_r.map_or(now, |prev| (prev + rate_step(p.cost, rate)).max(now)));
        let l = ts.cfg.limit.map(|rate| ts.last_l.map_or(now, |prev| (prev + rate_step(p.cost, rate)).max(now)));
        ts.head = Some(Head { start, finish, r, l });
    }

    /// The next request to send to the device, if a slot is free and one is eligible.
    /// Call until `None` after every enqueue, completion or change.
    pub fn dispatch(&mut self, now: Duration) -> Option<Dispatch> {
        let waiting = self.tenants.iter().any(|t| t.head.is_some());
        if self.outstanding.len() >= self.depth {
            self.window.depth_bound |= waiting;
            return None;
        }
        let (t, phase) = match self.pick_reservation(now) {
            Some(t) => (t, Phase::Reservation),
            None => (self.pick_weight(now)?, Phase::Weight),
        };
        Some(self.take_head(t, phase, now))
    }

    fn pick_reservation(&self, now: Duration) -> Option<TenantId> {
        let now = nanos(now);
        self.heads().filter_map(|(t, h)| h.r.filter(|&r| r <= now).map(|r| (r, t))).min().map(|(_, t)| t)
    }

    fn pick_weight(&self, now: Duration) -> Option<TenantId> {
        let now = nanos(now);
        self.heads().filter(|(_, h)| h.l.is_none_or(|l| l <= now)).map(|(t, h)| (h.start, t)).min().map(|(_, t)| t)
    }

    fn heads(&self) -> impl Iterator<Item = (TenantId, Head)> + '_ {
        self.tenants.iter().enumerate().filter_map(|(t, ts)| ts.head.map(|h| (t, h)))
    }

    fn take_head(&mut self, t: TenantId, phase: Phase, now: Duration) -> Dispatch {
        let ts = &mut self.tenants[t];
        let head = ts.head.take().expect("picked tenant has a head");
        let p = ts.queue.pop_front().expect("head is queued");
        ts.last_finish = head.finish;
        ts.last_span = head.finish - head.start;
        ts.last_r = head.r.or(ts.last_r);
        ts.last_l = head.l.or(ts.last_l);
        let c = &mut ts.counters;
        c.queued -= 1;
        c.in_flight += 1;
        c.dispatched += 1;
        c.dispatched_cost += p.cost;
        if phase == Phase::Reservation {
            c.by_reservation += 1;
        } else {
            self.vtime = self.vtime.max(head.start);
        }
        self.outstanding.insert(p.id, Outstanding { tenant: t, cost: p.cost, dispatched_at: now });
        self.retag(t, now);
        Dispatch { req: p.id, tenant: t, phase }
    }

    /// The device finished `req`. Returns its tenant and device latency
    /// (dispatch to completion), or `None` for an unknown request.
    pub fn complete(&mut self, req: ReqId, now: Duration) -> Option<(TenantId, Duration)> {
        let o = self.outstanding.remove(&req)?;
        let latency = now.saturating_sub(o.dispatched_at);
        let c = &mut self.tenants[o.tenant].counters;
        c.in_flight -= 1;
        c.completed += 1;
        c.completed_cost += o.cost;
        self.window.record(o.tenant, o.cost, latency);
        if self.tenants[o.tenant].queue.is_empty() && self.tenants[o.tenant].counters.in_flight == 0 {
            self.window.tenants[o.tenant].went_idle = true;
        }
        self.adapt();
        Some((o.tenant, latency))
    }

    /// Let the adaptive controller move D at the end of each window.
    fn adapt(&mut self) {
        let Some(a) = &mut self.adaptive else { return };
        if !a.window_full(&self.window, self.depth) {
            return;
        }
        let shares: Vec<Share> = self
            .tenants
            .iter()
            .map(|t| Share {
                weight: t.cfg.weight,
                // A limit or reservation is a share of its own: not judged here.
                judged: t.cfg.limit.is_none() && t.cfg.reservation.is_none(),
            })
            .collect();
        self.depth = a.evaluate(&self.window, &shares, self.depth);
        let busy: Vec<bool> = self.tenants.iter().map(|t| !t.queue.is_empty() || t.counters.in_flight > 0).collect();
        self.window.reset(&busy);
    }

    /// When a queued request that is waiting only for time (a limit, or a
    /// reservation not yet due) becomes eligible; `None` if none is.
    pub fn next_wakeup(&self, now: Duration) -> Option<Duration> {
        let now = nanos(now);
        self.heads()
            .filter(|(_, h)| h.l.is_some_and(|l| l > now))
            .filter_map(|(_, h)| h.r.filter(|&r| r > now).map_or(h.l, |r| h.l.map(|l| l.min(r))))
            .min()
            .map(|t| Duration::from_nanos(t.min(u64::MAX as u128) as u64))
    }
}

fn sanitize(mut cfg: TenantConfig) -> TenantConfig {
    cfg.weight = cfg.weight.max(1);
    cfg.reservation = cfg.reservation.filter(|&r| r > 0);
    cfg.limit = cfg.limit.filter(|&l| l > 0);
    cfg
}
