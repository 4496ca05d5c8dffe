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
//!
//! * Across servers (with [`SchedConfig::global`]; see [`super::global`]):
//!   service a tenant received at other servers is [`Scheduler::credit`]ed as
//!   DSFQ's delay and dmClock's delta and rho: it is added to the tenant's next
//!   start tag (cost / weight), its limit tag (cost / limit) and, for the part
//!   served by reservation, its reservation tag, so weights, limits and
//!   reservations hold over the total. Start tags alone cannot help a tenant
//!   that has no request *here* at the moment (a striped client waiting for its
//!   other chunks): so each tenant also has a global service tag, its total
//!   service / weight, and a request of a tenant more than `lag` ahead of a
//!   tenant that is owed service, busy at other servers (peers say so) and has
//!   used this server recently, is held back, for at most the anticipation
//!   bound per dispatch. With no live peer nothing is held and no credit
//!   arrives: plain SFQ(D).

use super::adaptive::{Adaptive, AdaptiveConfig, Share, Window};
use super::global::{Anticipate, GapEstimate, GlobalConfig};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

pub type TenantId = usize;
pub type ReqId = u64;

/// Weights scale costs by lcm(1..=16), so costs divide exactly by common weights
/// and tests can count exactly.
const WSCALE: u128 = 720_720;
const NANOS: u128 = 1_000_000_000;
/// Each report period a server's global tags move by this fraction of their
/// offset from the median of the views (see `Scheduler::converge`).
const CONVERGE_DIVISOR: i128 = 4;

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
    /// Cooperate with the schedulers of other servers (shares of the total).
    #[serde(default)]
    pub global: Option<GlobalConfig>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig { depth: 2, overhead: 0, adaptive: None, global: None }
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
    /// Cost dispatched for the reservation (part of `dispatched_cost`).
    pub reserved_cost: u64,
    /// Cost served at other servers, as peers reported it.
    pub remote_cost: u64,
    /// Times this tenant's request was held back for a tenant owed service.
    pub held: u64,
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
    /// Total service / weight (WSCALE units): here and, as credited, elsewhere.
    global: u128,
    /// Service elsewhere not yet in this tenant's tags (applied at the next tagging).
    pending: u64,
    pending_reserved: u64,
    /// How many live peers report this tenant busy.
    remote_busy: usize,
    /// When a request of this tenant last arrived here.
    last_arrival: Option<Duration>,
    /// Busy here since the last report to peers.
    busy_since_report: bool,
    /// Cost dispatched here as of the last report to peers.
    reported_cost: u64,
    /// Since when it has had no request queued here (if it had one before).
    empty_since: Option<Duration>,
    /// How long it takes to send its next request here once it has none queued.
    gap: GapEstimate,
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
    /// Since when a free slot has been kept for a tenant owed service, and for how long at most.
    hold_since: Option<Duration>,
    hold_bound: Duration,
    /// Mean device latency (exponentially weighted), the anticipation bound
    /// for a tenant whose gap is not known yet.
    mean_latency: Option<Duration>,
    /// Holds that ran out their bound and served a tenant that was ahead.
    holds_expired: u64,
    /// Holds begun, and the time free slots were kept in all (ended holds).
    holds_started: u64,
    hold_time: Duration,
    /// Tag corrections taken toward the median of the views (see `converge`).
    converged: u64,
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
            hold_since: None,
            hold_bound: Duration::ZERO,
            mean_latency: None,
            holds_expired: 0,
            holds_started: 0,
            hold_time: Duration::ZERO,
            converged: 0,
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
            global: 0,
            pending: 0,
            pending_reserved: 0,
            remote_busy: 0,
            last_arrival: None,
            busy_since_report: false,
            reported_cost: 0,
            empty_since: None,
            gap: GapEstimate::default(),
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
        ts.last_finish = ts.last_finish.min(vtime.saturating_add(ts.last_span));
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

    /// Turn cooperation with other servers on or off (or change its settings).
    /// Off: credits already taken stay in the tags; nothing is held any more.
    pub fn set_global(&mut self, global: Option<GlobalConfig>) {
        if global.is_none() {
            self.hold_since = None;
        }
        if self.cfg.global.is_none() && global.is_some() {
            self.level_global_service();
        }
        self.cfg.global = global;
    }

    /// Cooperation starts with no one owed: the global service tags counted
    /// only local service while it was off (and under weights that may have
    /// changed since), so a tenant that got more here then is not held back
    /// for it now.
    fn level_global_service(&mut self) {
        let top = self.tenants.iter().map(|t| t.global).max().unwrap_or(0);
        for t in &mut self.tenants {
            t.global = top;
        }
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
        if !self.is_active(t) {
            self.catch_up(t);
        }
        let ts = &mut self.tenants[t];
        if ts.queue.is_empty() && ts.counters.in_flight == 0 {
            self.window.tenants[t].went_idle = true;
        }
        ts.last_arrival = Some(now);
        ts.busy_since_report = true;
        if let Some(since) = ts.empty_since.take() {
            ts.gap.sample(now.saturating_sub(since));
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
        // Service elsewhere since the last tagging (DSFQ's delay, dmClock's delta and rho).
        let (elsewhere, reserved_elsewhere) = (std::mem::take(&mut ts.pending), std::mem::take(&mut ts.pending_reserved));
        // Saturating: service reported by peers is not trusted to stay small.
        let start = vtime.max(ts.last_finish.saturating_add(elsewhere as u128 * WSCALE / ts.cfg.weight as u128));
        let finish = start.saturating_add(p.cost as u128 * WSCALE / ts.cfg.weight as u128);
        let now = nanos(now);
        let tag = |prev: Option<u128>, rate: u64, extra: u64| prev.map_or(now, |prev| prev.saturating_add(rate_step(p.cost.saturating_add(extra), rate)).max(now));
        let r = ts.cfg.reservation.map(|rate| tag(ts.last_r, rate, reserved_elsewhere));
        let l = ts.cfg.limit.map(|rate| tag(ts.last_l, rate, elsewhere));
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

    /// The smallest start tag among heads within their limits; with
    /// cooperation on, the smallest not held for a tenant owed service (see
    /// the module comment), or, once a hold has run out its bound, the smallest.
    fn pick_weight(&mut self, now: Duration) -> Option<TenantId> {
        let n = nanos(now);
        let mut ready: Vec<(u128, TenantId)> =
            self.heads().filter(|(_, h)| h.l.is_none_or(|l| l <= n)).map(|(t, h)| (h.start, t)).collect();
        ready.sort_unstable();
        let Some(&(_, first)) = ready.first() else {
            self.end_hold(now);
            return None;
        };
        let Some(g) = self.cfg.global.clone() else { return Some(first) };
        let mut held: Vec<TenantId> = Vec::new();
        for &(_, t) in &ready {
            if !self.owes(t, now, &g) {
                self.end_hold(now);
                for h in held {
                    self.tenants[h].counters.held += 1;
                }
                return Some(t);
            }
            held.push(t);
        }
        if self.hold_since.is_none() {
            self.holds_started += 1;
            for &t in &held {
                self.tenants[t].counters.held += 1;
            }
        }
        let since = *self.hold_since.get_or_insert(now);
        self.hold_bound = self.hold_bound(&held, now, &g);
        if now >= since + self.hold_bound {
            self.end_hold(now);
            self.holds_expired += 1;
            return Some(first);
        }
        None
    }

    /// A kept slot is given up (or used): count how long it was kept.
    fn end_hold(&mut self, now: Duration) {
        if let Some(since) = self.hold_since.take() {
            self.hold_time += now.saturating_sub(since);
        }
    }

    /// Whether `t` is more than the lag ahead of a tenant owed service that is
    /// busy elsewhere and has used this server recently.
    fn owes(&self, t: TenantId, now: Duration, g: &GlobalConfig) -> bool {
        self.owed_by(t, now, g).next().is_some()
    }

    /// The tenants `t` owes service (see [`Self::owes`]). Tenants with a limit
    /// are not waited for (their limit, not their share, decides their pace).
    fn owed_by<'a>(&'a self, t: TenantId, now: Duration, g: &GlobalConfig) -> impl Iterator<Item = TenantId> + 'a {
        let me = &self.tenants[t];
        let lag = g.lag as u128 * WSCALE / me.cfg.weight as u128;
        let recent = g.recent;
        self.tenants.iter().enumerate().filter_map(move |(u, o)| {
            let owed = u != t
                && o.cfg.limit.is_none()
                && o.remote_busy > 0
                && o.last_arrival.is_some_and(|a| now.saturating_sub(a) <= recent)
                && me.global > o.global.saturating_add(lag);
            owed.then_some(u)
        })
    }

    /// Move this server's global tags toward the median of the views: its
    /// own and its live peers' latest reports (by peer, by tenant id, bytes
    /// per unit of weight; None where a peer did not say). Called once per
    /// report period.
    ///
    /// Every server's tags count the same service, but each also moves them
    /// on its own: catch-up raises (`catch_up`, taken when a tenant returns
    /// from idle, at a moment that differs from server to server), the
    /// levelling when cooperation starts, service normalised by a weight
    /// that changed at another moment here than there, reports taken as a
    /// new baseline. Nothing brings such views back together, and two
    /// servers whose views disagree hold each other's tenants: one keeps its
    /// slot for a while another keeps its slot for b, every striped client
    /// waits at one of them, and only expiring holds move (issue 40: 22.9
    /// MB/s of 128). fair2 let a hold only if most views agreed: a server
    /// whose view disagreed then held nothing, and cooperation lost its
    /// accuracy (README test command: 7.47 for 8:1, 14.65 for 16:1). Here
    /// the views converge, and every server decides on its own view.
    ///
    /// Only differences between tenants are compared, and this server's
    /// view as its peers know it (less its service since its last report).
    /// A peer's report is up to a period old, so it lags a lead that has
    /// just built up: the tags move by a quarter of their offset per period,
    /// so a lasting disagreement is gone within a few periods while the lag
    /// of the reports, which comes and goes, averages out (a full step past a
    /// dead band pulled every fresh lead back: 8:1 fell to 4.2:1 on virtual
    /// time).
    pub fn converge(&mut self, views: &[Vec<Option<u64>>]) {
        let n = self.tenants.len();
        if self.cfg.global.is_none() || n < 2 {
            return;
        }
        let rel = |v: Vec<i128>| {
            let mean = v.iter().sum::<i128>() / n as i128;
            v.into_iter().map(|x| x - mean).collect::<Vec<i128>>()
        };
        let own = self.tenants.iter().map(|ts| {
            let unreported = ts.counters.dispatched_cost.saturating_sub(ts.reported_cost) as u128 * WSCALE / ts.cfg.weight as u128;
            (ts.global.saturating_sub(unreported) / WSCALE).min(u64::MAX as u128) as i128
        });
        let mut all = vec![rel(own.collect())];
        for v in views {
            if v.len() >= n && v[..n].iter().all(Option::is_some) {
                all.push(rel(v[..n].iter().map(|x| x.unwrap_or(0) as i128).collect()));
            }
        }
        if all.len() < 2 {
            return;
        }
        for t in 0..n {
            let mut col: Vec<i128> = all.iter().map(|v| v[t]).collect();
            col.sort_unstable();
            let k = col.len();
            let median = if k % 2 == 1 { col[k / 2] } else { (col[k / 2 - 1] + col[k / 2]) / 2 };
            let off = (all[0][t] - median) / CONVERGE_DIVISOR;
            if off == 0 {
                continue;
            }
            let step = off.unsigned_abs() * WSCALE;
            let ts = &mut self.tenants[t];
            ts.global = if off > 0 { ts.global.saturating_sub(step) } else { ts.global.saturating_add(step) };
            self.converged += 1;
        }
    }

    /// Raise tenant `t`'s global tag by `bytes` of its own service without
    /// service, as a catch-up raise does (tests: drifted views).
    #[cfg(test)]
    pub(crate) fn raise(&mut self, t: TenantId, bytes: u64) {
        let ts = &mut self.tenants[t];
        ts.global = ts.global.saturating_add(bytes as u128 * WSCALE / ts.cfg.weight as u128);
    }

    /// Tag corrections taken toward the median of the views.
    pub fn converged(&self) -> u64 {
        self.converged
    }

    /// How long a slot is kept for the tenants the `held` ones owe: the longest
    /// anticipation bound among them (each by its own gap estimate under `auto`).
    ///
    /// Under `auto` the bound grows with how far the held tenant is ahead, in
    /// lags (up to [`GlobalConfig::hold_stretch`] times, within the auto maximum): every
    /// hold that runs out serves the tenant that is ahead, so when the owed
    /// tenant cannot use every server at once (small requests, one per client)
    /// the held one's service is what the expired holds give it, and its lead
    /// keeps growing. Waiting longer the further it is ahead brings that
    /// service down to its share instead.
    fn hold_bound(&self, held: &[TenantId], now: Duration, g: &GlobalConfig) -> Duration {
        held.iter()
            .flat_map(|&t| self.owed_by(t, now, g).map(move |u| (t, u)))
            .map(|(t, u)| {
                let base = g.anticipate.bound(self.tenants[u].gap.expected_within(), self.mean_latency);
                if g.anticipate != Anticipate::Auto {
                    return base;
                }
                let (me, o) = (&self.tenants[t], &self.tenants[u]);
                let lag = (g.lag as u128 * WSCALE / me.cfg.weight as u128).max(1);
                let leads = (me.global.saturating_sub(o.global) / lag).clamp(1, g.hold_stretch.max(1) as u128) as u32;
                (base * leads).min(Anticipate::AUTO_MAX)
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Busy here, or elsewhere as far as live peers say.
    fn is_active(&self, t: TenantId) -> bool {
        let ts = &self.tenants[t];
        !ts.queue.is_empty() || ts.counters.in_flight > 0 || ts.remote_busy > 0
    }

    /// A tenant becoming busy banks nothing for its idle time: its global tag
    /// starts no lower than the lowest of the tenants already busy.
    fn catch_up(&mut self, t: TenantId) {
        let floor = (0..self.tenants.len()).filter(|&u| u != t && self.is_active(u)).map(|u| self.tenants[u].global).min();
        if let Some(floor) = floor {
            let ts = &mut self.tenants[t];
            ts.global = ts.global.max(floor);
        }
    }

    /// Service tenant `t` received at another server (from a peer's report):
    /// `cost` in all, `reserved` of it for its reservation.
    /// A waiting head is re-tagged at once (else a tenant's tags would lag the
    /// service it gets elsewhere by a whole wait each time); otherwise the next
    /// tagging takes it.
    ///
    /// The figures come from the network, so the arithmetic saturates: a
    /// report of a huge cost pushes the tenant back as far as it goes, and
    /// never panics the scheduler (release builds check overflow).
    pub fn credit(&mut self, t: TenantId, cost: u64, reserved: u64) {
        let ts = &mut self.tenants[t];
        let norm = cost as u128 * WSCALE / ts.cfg.weight as u128;
        ts.global = ts.global.saturating_add(norm);
        ts.counters.remote_cost = ts.counters.remote_cost.saturating_add(cost);
        match &mut ts.head {
            Some(h) => {
                h.start = h.start.saturating_add(norm);
                h.finish = h.finish.saturating_add(norm);
                if let (Some(l), Some(rate)) = (h.l.as_mut(), ts.cfg.limit) {
                    *l = l.saturating_add(rate_step(cost, rate));
                }
                if let (Some(r), Some(rate)) = (h.r.as_mut(), ts.cfg.reservation) {
                    *r = r.saturating_add(rate_step(reserved, rate));
                }
            }
            None => {
                ts.pending = ts.pending.saturating_add(cost);
                ts.pending_reserved = ts.pending_reserved.saturating_add(reserved);
            }
        }
    }

    /// Whether live peers report tenant `t` busy (as if one did).
    pub fn set_remote_active(&mut self, t: TenantId, active: bool) {
        self.set_remote_busy(t, active as usize);
    }

    /// How many live peers report tenant `t` busy.
    pub fn set_remote_busy(&mut self, t: TenantId, peers: usize) {
        if peers > 0 && !self.is_active(t) {
            self.catch_up(t);
        }
        self.tenants[t].remote_busy = peers;
    }

    /// What to tell peers about tenant `t`: cumulative cost dispatched here,
    /// the reservation part, and whether it was busy here since the last call.
    pub fn report(&mut self, t: TenantId) -> (u64, u64, bool) {
        let ts = &mut self.tenants[t];
        let busy = ts.busy_since_report || !ts.queue.is_empty() || ts.counters.in_flight > 0;
        ts.busy_since_report = false;
        ts.reported_cost = ts.counters.dispatched_cost;
        (ts.counters.dispatched_cost, ts.counters.reserved_cost, busy)
    }

    /// Tenant `t`'s global service tag, in bytes per unit of weight.
    pub fn global_service(&self, t: TenantId) -> f64 {
        self.tenants[t].global as f64 / WSCALE as f64
    }

    /// Holds that ran out their anticipation bound.
    pub fn holds_expired(&self) -> u64 {
        self.holds_expired
    }

    /// Holds begun, and how long slots were kept free in all (holds that ended).
    pub fn holds(&self) -> (u64, Duration) {
        (self.holds_started, self.hold_time)
    }

    fn heads(&self) -> impl Iterator<Item = (TenantId, Head)> + '_ {
        self.tenants.iter().enumerate().filter_map(|(t, ts)| ts.head.map(|h| (t, h)))
    }

    fn take_head(&mut self, t: TenantId, phase: Phase, now: Duration) -> Dispatch {
        // A tenant held back for others sends its next request late because its
        // requests elsewhere wait too: its gaps then say nothing about how long
        // to wait for it once it is owed, so they are not measured.
        let free = self.cfg.global.as_ref().is_none_or(|g| !self.owes(t, now, g));
        let ts = &mut self.tenants[t];
        let head = ts.head.take().expect("picked tenant has a head");
        let p = ts.queue.pop_front().expect("head is queued");
        ts.empty_since = (ts.queue.is_empty() && free).then_some(now);
        ts.last_finish = head.finish;
        ts.last_span = head.finish - head.start;
        ts.last_r = head.r.or(ts.last_r);
        ts.last_l = head.l.or(ts.last_l);
        let c = &mut ts.counters;
        c.queued -= 1;
        c.in_flight += 1;
        c.dispatched += 1;
        c.dispatched_cost += p.cost;
        ts.global = ts.global.saturating_add(p.cost as u128 * WSCALE / ts.cfg.weight as u128);
        ts.busy_since_report = true;
        if phase == Phase::Reservation {
            c.by_reservation += 1;
            c.reserved_cost += p.cost;
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
        self.mean_latency = Some(self.mean_latency.map_or(latency, |m| (m * 7 + latency) / 8));
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
        let n = nanos(now);
        let timed = self
            .heads()
            .filter(|(_, h)| h.l.is_some_and(|l| l > n))
            .filter_map(|(_, h)| h.r.filter(|&r| r > n).map_or(h.l, |r| h.l.map(|l| l.min(r))))
            .min()
            .map(|t| Duration::from_nanos(t.min(u64::MAX as u128) as u64));
        // A slot kept for an owed tenant is given up when the bound runs out.
        let hold = match (&self.cfg.global, self.hold_since) {
            (Some(_), Some(since)) if self.outstanding.len() < self.depth => Some(since + self.hold_bound),
            _ => None,
        };
        timed.into_iter().chain(hold).min()
    }
}

fn sanitize(mut cfg: TenantConfig) -> TenantConfig {
    cfg.weight = cfg.weight.max(1);
    cfg.reservation = cfg.reservation.filter(|&r| r > 0);
    cfg.limit = cfg.limit.filter(|&l| l > 0);
    cfg
}
