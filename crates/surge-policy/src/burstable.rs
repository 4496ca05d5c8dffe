//! When to swap which member of a burstable volume (a stripe of small volumes
//! that carry burst credits), from the credit balances the provider reports.
//!
//! Fed once per tick with each member's balance; estimates each member's drain
//! rate (credits/s, net of refill) and the credits a swap needs before the new
//! member takes over:
//! - persistent: create + attach the new member, then copy the member (the
//!   rebuild reads `member_size / op_size` operations from the old member,
//!   whose user I/O keeps draining it meanwhile);
//! - cache, ephemeral: create + attach only (members are replaced empty).
//!
//! Threshold: a fixed fraction of the bucket (`swap_below`), or automatic:
//! `margin` x the credits a swap needs, at least `auto_floor` (5 %) of the
//! bucket (a member at zero credits serves at its baseline, and a swap must
//! wait for the requests in flight on it). Only members whose credits are
//! draining are swapped: an idle member refills by itself. Strategies (the paper's two):
//! - all at once: when any member would cross its threshold by the next tick,
//!   swap every member (as many as free attachments allow for persistent data;
//!   cache and ephemeral volumes always swap the whole set, see below);
//! - one at a time (persistent only): one swap in flight; the next one starts
//!   as soon as waiting one more tick would leave some member, in order of
//!   balance, without the credits for its turn (members drain while earlier
//!   swaps run), so the swaps spread out and the volume never loses its burst.
//!
//! Cache and ephemeral volumes swap all members together: a write-through cache
//! reset empties all of it anyway (the cache layer keeps one slot map over the
//! whole striped device), and replacing one member of a scratch stripe would
//! leave holes in every file. Ephemeral swaps also wait until the volume has
//! been idle for `ephemeral_idle`, so that a checkpoint being written is not
//! cut in two. Pure: no I/O, time passed in.

use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Persistent,
    Cache,
    Ephemeral,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "persistent" => Ok(Mode::Persistent),
            "cache" => Ok(Mode::Cache),
            "ephemeral" => Ok(Mode::Ephemeral),
            _ => Err(format!("unknown burstable mode {s:?} (persistent, cache, ephemeral)")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    AllAtOnce,
    OneAtATime,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" | "all-at-once" | "all_at_once" => Ok(Strategy::AllAtOnce),
            "one" | "one-at-a-time" | "one_at_a_time" => Ok(Strategy::OneAtATime),
            _ => Err(format!("unknown swap strategy {s:?} (all, one)")),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BurstableConfig {
    pub mode: Mode,
    pub strategy: Strategy,
    /// Bytes per member (what a persistent swap copies).
    pub member_size: u64,
    /// Swap when a member's credits fall below this fraction of its bucket;
    /// `None`: automatic (`margin` x the credits a swap needs).
    pub swap_below: Option<f64>,
    pub margin: f64,
    /// Lowest automatic threshold, as a fraction of the bucket.
    pub auto_floor: f64,
    /// Rebuild speed of a persistent swap, bytes/s.
    pub rebuild_rate: u64,
    /// Bytes per credited operation of a rebuild read (EBS SSD: 256 KiB).
    pub op_size: u64,
    /// Create + attach of a fresh member.
    pub swap_setup: Duration,
    /// Volumes the instance can attach (members + members being swapped in).
    pub attach_limit: usize,
    /// A slot is not swapped again sooner than this after its last swap.
    pub min_interval: Duration,
    /// Ephemeral swaps wait for this much idle time.
    pub ephemeral_idle: Duration,
    /// How often the policy is fed (lookahead of one tick).
    pub tick: Duration,
}

impl Default for BurstableConfig {
    fn default() -> Self {
        BurstableConfig {
            mode: Mode::Persistent,
            strategy: Strategy::AllAtOnce,
            member_size: 10 << 30,
            swap_below: None,
            margin: 1.5,
            auto_floor: 0.05,
            rebuild_rate: 64 << 20,
            op_size: 256 << 10,
            swap_setup: Duration::from_secs(10),
            attach_limit: 27,
            min_interval: Duration::from_secs(60),
            ephemeral_idle: Duration::from_secs(5),
            tick: Duration::from_secs(5),
        }
    }
}

/// One member as the provider reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberObs {
    /// Credits left (operation credits for gp2); `None`: the type has no bucket.
    pub credits: Option<u64>,
    pub capacity: Option<u64>,
    /// A swap of this slot is in progress.
    pub swapping: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Obs {
    pub members: Vec<MemberObs>,
    /// Volumes attached now (members, members being swapped in, other volumes of the stack).
    pub attached: usize,
    /// Time since the last user I/O.
    pub idle_for: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Replace these slots' members with fresh volumes.
    Swap { slots: Vec<usize> },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub at: Duration,
    #[serde(flatten)]
    pub action: Action,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    last: Option<(Duration, u64)>,
    /// Credits/s, net of refill (EWMA; 0 when refilling).
    drain: f64,
    swapped_at: Option<Duration>,
}

/// A member's state as the policy sees it (for `surge status`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlotView {
    pub credits: Option<u64>,
    pub drain_per_s: f64,
    /// Credits at which this member is swapped.
    pub threshold: Option<u64>,
    /// Seconds until the threshold at the current drain.
    pub swap_in_s: Option<f64>,
}

#[derive(Debug)]
pub struct BurstablePolicy {
    cfg: BurstableConfig,
    slots: Vec<Slot>,
    /// Why the last tick did not swap although a member was due.
    waiting: Option<String>,
    views: Vec<SlotView>,
}

impl BurstablePolicy {
    pub fn new(cfg: BurstableConfig, members: usize) -> Self {
        BurstablePolicy { cfg, slots: vec![Slot::default(); members], waiting: None, views: vec![] }
    }

    pub fn config(&self) -> &BurstableConfig {
        &self.cfg
    }

    /// Seconds one swap takes, start to new member serving.
    pub fn swap_time(&self) -> f64 {
        let copy = match self.cfg.mode {
            Mode::Persistent => self.cfg.member_size as f64 / self.cfg.rebuild_rate.max(1) as f64,
            Mode::Cache | Mode::Ephemeral => 0.0,
        };
        self.cfg.swap_setup.as_secs_f64() + copy
    }

    /// Credits a swap of `slot` needs: its user drain during the swap (and one
    /// tick of observation lag), plus the rebuild's reads.
    pub fn need(&self, slot: usize) -> f64 {
        let reads = match self.cfg.mode {
            Mode::Persistent => (self.cfg.member_size as f64 / self.cfg.op_size.max(1) as f64).ceil(),
            Mode::Cache | Mode::Ephemeral => 0.0,
        };
        self.slots[slot].drain * (self.swap_time() + self.cfg.tick.as_secs_f64()) + reads
    }

    fn threshold(&self, slot: usize, capacity: u64) -> f64 {
        match self.cfg.swap_below {
            Some(f) => f * capacity as f64,
            // Never below the floor: requests in flight on a member at zero
            // credits crawl at its baseline, and a swap waits for them.
            None => (self.cfg.margin * self.need(slot)).max(self.cfg.auto_floor * capacity as f64),
        }
    }

    /// Per-member view from the last tick.
    pub fn views(&self) -> &[SlotView] {
        &self.views
    }

    /// Why a due swap is not happening (attachment limit, not idle, ...).
    pub fn waiting(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// A slot got a fresh member (its drain history no longer applies).
    pub fn swapped(&mut self, now: Duration, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = Slot { swapped_at: Some(now), ..Slot::default() };
        }
    }

    fn observe(&mut self, now: Duration, obs: &Obs) {
        if self.slots.len() < obs.members.len() {
            self.slots.resize(obs.members.len(), Slot::default());
        }
        for (s, m) in self.slots.iter_mut().zip(&obs.members) {
            let Some(c) = m.credits else { continue };
            if let Some((t, prev)) = s.last {
                let dt = now.saturating_sub(t).as_secs_f64();
                if dt > 0.0 {
                    let rate = ((prev as f64 - c as f64) / dt).max(0.0);
                    s.drain = if s.drain == 0.0 { rate } else { 0.7 * s.drain + 0.3 * rate };
                }
            }
            s.last = Some((now, c));
        }
    }

    fn cooling(&self, now: Duration, slot: usize) -> bool {
        self.slots[slot].swapped_at.is_some_and(|t| now.saturating_sub(t) < self.cfg.min_interval)
    }

    /// Credits of `slot` one tick from now at its drain rate.
    fn soon(&self, slot: usize, credits: u64) -> f64 {
        credits as f64 - self.slots[slot].drain * self.cfg.tick.as_secs_f64()
    }

    /// Decide what to swap now.
    pub fn tick(&mut self, now: Duration, obs: &Obs) -> Vec<Decision> {
        self.observe(now, obs);
        self.waiting = None;
        self.views = obs
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let threshold = m.capacity.map(|c| self.threshold(i, c));
                let drain = self.slots[i].drain;
                let swap_in_s = match (m.credits, threshold) {
                    (Some(c), Some(t)) if drain > 0.0 => Some(((c as f64 - t) / drain).max(0.0)),
                    _ => None,
                };
                SlotView { credits: m.credits, drain_per_s: drain, threshold: threshold.map(|t| t as u64), swap_in_s }
            })
            .collect();
        let due: Vec<usize> = obs
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| !m.swapping && !self.cooling(now, *i) && self.slots[*i].drain > 0.0)
            .filter(|(i, m)| matches!((m.credits, m.capacity), (Some(c), Some(cap)) if self.soon(*i, c) <= self.threshold(*i, cap)))
            .map(|(i, _)| i)
            .collect();
        let swapping = obs.members.iter().filter(|m| m.swapping).count();
        let free = self.cfg.attach_limit.saturating_sub(obs.attached);
        let decision = match (self.cfg.mode, self.cfg.strategy) {
            (Mode::Persistent, Strategy::OneAtATime) => self.one_at_a_time(now, obs, swapping, free),
            (Mode::Persistent, Strategy::AllAtOnce) => self.all_persistent(obs, &due, free),
            (Mode::Cache | Mode::Ephemeral, _) => self.all_members(obs, &due, swapping, free),
        };
        decision.into_iter().map(|(slots, reason)| Decision { at: now, action: Action::Swap { slots }, reason }).collect()
    }

    fn describe(&self, obs: &Obs, slot: usize) -> String {
        let m = obs.members[slot];
        let (c, cap) = (m.credits.unwrap_or(0), m.capacity.unwrap_or(1).max(1));
        format!(
            "member {slot} at {:.1} % of its credits ({c}), draining {:.0}/s; threshold {:.0} ({})",
            c as f64 * 100.0 / cap as f64,
            self.slots[slot].drain,
            self.threshold(slot, cap),
            match self.cfg.swap_below {
                Some(f) => format!("swap_below {:.1} %", f * 100.0),
                None => format!("{:.1} x a swap's need: {:.0} s of swap + reads", self.cfg.margin, self.swap_time()),
            }
        )
    }

    fn all_persistent(&mut self, obs: &Obs, due: &[usize], free: usize) -> Option<(Vec<usize>, String)> {
        let first = *due.iter().min_by_key(|&&i| obs.members[i].credits)?;
        // A member whose balance is unknown (after a restart, before its
        // first CloudWatch point) is swapped too, after the known ones: the
        // stripe bursts only as fast as its emptiest member, and an early
        // swap costs a rebuild where a late one costs the burst.
        let mut slots: Vec<usize> = (0..obs.members.len()).filter(|&i| !obs.members[i].swapping && obs.members[i].capacity.is_some()).collect();
        slots.sort_by_key(|&i| obs.members[i].credits.map_or((1, 0), |c| (0, c)));
        if free == 0 {
            self.waiting = Some(format!("{}; no free attachment (limit {})", self.describe(obs, first), self.cfg.attach_limit));
            return None;
        }
        let limited = slots.len() > free;
        slots.truncate(free);
        let mut reason = format!("{}: swapping all members at once", self.describe(obs, first));
        if limited {
            reason.push_str(&format!(" ({} of them: attachment limit {})", slots.len(), self.cfg.attach_limit));
        }
        Some((slots, reason))
    }

    fn all_members(&mut self, obs: &Obs, due: &[usize], swapping: usize, free: usize) -> Option<(Vec<usize>, String)> {
        let first = *due.iter().min_by_key(|&&i| obs.members[i].credits)?;
        let n = obs.members.len();
        if swapping > 0 {
            return None;
        }
        if free < n {
            self.waiting = Some(format!("{}; a whole new set needs {n} attachments, {free} free", self.describe(obs, first)));
            return None;
        }
        if self.cfg.mode == Mode::Ephemeral && obs.idle_for < self.cfg.ephemeral_idle {
            self.waiting = Some(format!("{}; waiting for {:?} of idle time (idle {:?})", self.describe(obs, first), self.cfg.ephemeral_idle, obs.idle_for));
            return None;
        }
        let what = if self.cfg.mode == Mode::Cache { "replacing the cache's members with empty ones" } else { "replacing the scratch members with empty ones" };
        Some(((0..n).collect(), format!("{}: {what}", self.describe(obs, first))))
    }

    /// Start the next single swap if waiting one more tick would leave a member
    /// without the credits it needs when its turn comes.
    fn one_at_a_time(&mut self, now: Duration, obs: &Obs, swapping: usize, free: usize) -> Option<(Vec<usize>, String)> {
        if swapping > 0 {
            return None;
        }
        let mut order: Vec<usize> = (0..obs.members.len()).filter(|&i| obs.members[i].credits.is_some() && obs.members[i].capacity.is_some()).collect();
        order.sort_by_key(|&i| obs.members[i].credits);
        let t = self.swap_time();
        let (late_turn, late) = order
            .iter()
            .enumerate()
            .map(|(turn, &i)| (turn, i))
            .filter(|&(_, i)| self.slots[i].drain > 0.0)
            .find(|&(turn, i)| {
                let m = obs.members[i];
                let (c, cap) = (m.credits.unwrap_or(0), m.capacity.unwrap_or(0));
                let at_turn = self.soon(i, c) - self.slots[i].drain * t * turn as f64;
                at_turn <= self.threshold(i, cap)
            })?;
        let next = order.into_iter().find(|&i| !self.cooling(now, i))?;
        if free == 0 {
            self.waiting = Some(format!("{}; no free attachment (limit {})", self.describe(obs, next), self.cfg.attach_limit));
            return None;
        }
        let reason = if late == next {
            format!("{}: swapping it (one at a time)", self.describe(obs, next))
        } else {
            format!(
                "{}: swapping it now (one at a time) so that member {} still has its credits when its turn comes {:.0} s from now",
                self.describe(obs, next),
                late,
                t * late_turn as f64
            )
        };
        Some((vec![next], reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = 5_400_000;
    const GIB: u64 = 1 << 30;

    /// Members draining at `rate` credits/s each (net), with swaps applied by
    /// the test harness instantly at full credits after `swap_s`.
    struct Sim {
        policy: BurstablePolicy,
        credits: Vec<f64>,
        rate: Vec<f64>,
        /// (slot, done at) of swaps in flight.
        inflight: Vec<(usize, Duration)>,
        swaps: Vec<(Duration, Vec<usize>)>,
        min_seen: f64,
        idle: Duration,
    }

    impl Sim {
        fn new(cfg: BurstableConfig, rate: Vec<f64>, start: Vec<f64>) -> Self {
            let n = rate.len();
            Sim { policy: BurstablePolicy::new(cfg, n), credits: start, rate, inflight: vec![], swaps: vec![], min_seen: f64::MAX, idle: Duration::ZERO }
        }

        fn run(&mut self, until: Duration) {
            let tick = self.policy.config().tick;
            let swap = Duration::from_secs_f64(self.policy.swap_time());
            let mut now = Duration::ZERO;
            while now < until {
                let done: Vec<usize> = self.inflight.iter().filter(|(_, t)| *t <= now).map(|(s, _)| *s).collect();
                self.inflight.retain(|(_, t)| *t > now);
                for s in done {
                    self.credits[s] = CAP as f64;
                    self.policy.swapped(now, s);
                }
                let obs = Obs {
                    members: (0..self.credits.len())
                        .map(|i| MemberObs { credits: Some(self.credits[i].max(0.0) as u64), capacity: Some(CAP), swapping: self.inflight.iter().any(|(s, _)| *s == i) })
                        .collect(),
                    attached: self.credits.len() + self.inflight.len(),
                    idle_for: self.idle,
                };
                for d in self.policy.tick(now, &obs) {
                    let Action::Swap { slots } = d.action;
                    assert!(!d.reason.is_empty());
                    for &s in &slots {
                        self.inflight.push((s, now + swap));
                    }
                    self.swaps.push((now, slots));
                }
                for (c, r) in self.credits.iter_mut().zip(&self.rate) {
                    *c -= r * tick.as_secs_f64();
                    self.min_seen = self.min_seen.min(*c);
                }
                now += tick;
            }
        }
    }

    fn cfg(mode: Mode, strategy: Strategy) -> BurstableConfig {
        BurstableConfig { mode, strategy, member_size: 10 * GIB, tick: Duration::from_secs(5), ..BurstableConfig::default() }
    }

    #[test]
    fn all_at_once_swaps_every_member_together_before_credits_run_out() {
        // 10 members at 3,000 IOPS, baseline 100: 2,900 credits/s net, 31 min each.
        let mut sim = Sim::new(cfg(Mode::Persistent, Strategy::AllAtOnce), vec![2_900.0; 10], vec![CAP as f64; 10]);
        sim.run(Duration::from_secs(80 * 60));
        assert_eq!(sim.swaps.len(), 2, "{:?}", sim.swaps);
        for (at, slots) in &sim.swaps {
            assert_eq!(slots.len(), 10);
            // Swap time: 10 s + 10 GiB / 64 MiB/s = 170 s; need = 2,900 x 175 + 40,960 reads.
            let need = 2_900.0 * 175.0 + 40_960.0;
            let credits_at = CAP as f64 - 2_900.0 * (at.as_secs_f64() % 1_862.0);
            assert!(credits_at > need, "swapped too late at {at:?}: {credits_at} left");
        }
        assert!(sim.min_seen > 0.0, "a member ran out of credits: {}", sim.min_seen);
    }

    #[test]
    fn one_at_a_time_spreads_swaps_and_never_runs_dry() {
        let mut sim = Sim::new(cfg(Mode::Persistent, Strategy::OneAtATime), vec![2_900.0; 10], vec![CAP as f64; 10]);
        sim.run(Duration::from_secs(3 * 3600));
        assert!(sim.swaps.iter().all(|(_, s)| s.len() == 1));
        assert!(sim.swaps.len() >= 20, "{}", sim.swaps.len());
        assert!(sim.min_seen > 0.0, "a member ran out of credits: {}", sim.min_seen);
        // Never two swaps at once.
        let swap = 170.0;
        for w in sim.swaps.windows(2) {
            assert!(w[1].0.as_secs_f64() - w[0].0.as_secs_f64() >= swap - 1e-9, "{:?}", w);
        }
    }

    #[test]
    fn a_fixed_threshold_swaps_at_that_fraction() {
        let mut c = cfg(Mode::Persistent, Strategy::AllAtOnce);
        c.swap_below = Some(0.5);
        let mut sim = Sim::new(c, vec![1_000.0; 2], vec![CAP as f64; 2]);
        sim.run(Duration::from_secs(3_000));
        // 50 % = 2.7 M credits at 1,000/s: the tick before 2,700 s.
        assert_eq!(sim.swaps.first().map(|s| s.0), Some(Duration::from_secs(2_695)));
    }

    #[test]
    fn all_at_once_swaps_members_of_unknown_balance_too_after_the_known_ones() {
        let mut c = cfg(Mode::Persistent, Strategy::AllAtOnce);
        c.attach_limit = 6;
        let mut p = BurstablePolicy::new(c, 3);
        let m = |credits: Option<u64>| MemberObs { credits, capacity: Some(CAP), swapping: false };
        let low = |c: u64| Obs { members: vec![m(None), m(Some(c)), m(Some(CAP))], attached: 3, idle_for: Duration::ZERO };
        assert!(p.tick(Duration::ZERO, &low(300_000)).is_empty());
        let d = p.tick(Duration::from_secs(5), &low(100_000));
        assert_eq!(d.len(), 1, "member 1 drains below its floor");
        assert_eq!(d[0].action, Action::Swap { slots: vec![1, 2, 0] }, "lowest first, the unknown one last");
        // One free attachment: the known, lowest member only.
        let mut c = cfg(Mode::Persistent, Strategy::AllAtOnce);
        c.attach_limit = 4;
        let mut p = BurstablePolicy::new(c, 3);
        p.tick(Duration::ZERO, &low(300_000));
        assert_eq!(p.tick(Duration::from_secs(5), &low(100_000))[0].action, Action::Swap { slots: vec![1] });
        // A member without a bucket (gp3) is never swapped.
        let mut p = BurstablePolicy::new(cfg(Mode::Persistent, Strategy::AllAtOnce), 2);
        let obs = |c: u64| Obs { members: vec![MemberObs { credits: None, capacity: None, swapping: false }, m(Some(c))], attached: 2, idle_for: Duration::ZERO };
        p.tick(Duration::ZERO, &obs(300_000));
        assert_eq!(p.tick(Duration::from_secs(5), &obs(100_000))[0].action, Action::Swap { slots: vec![1] });
    }

    #[test]
    fn idle_members_are_not_swapped() {
        let mut sim = Sim::new(cfg(Mode::Persistent, Strategy::AllAtOnce), vec![0.0; 4], vec![1_000.0; 4]);
        sim.run(Duration::from_secs(3_600));
        assert!(sim.swaps.is_empty(), "nothing drains, so nothing is due: {:?}", sim.swaps);
    }

    #[test]
    fn the_attachment_limit_caps_a_persistent_swap() {
        let mut c = cfg(Mode::Persistent, Strategy::AllAtOnce);
        c.attach_limit = 14;
        let mut sim = Sim::new(c, vec![2_900.0; 10], vec![CAP as f64; 10]);
        sim.run(Duration::from_secs(1_800));
        let first = &sim.swaps[0];
        assert_eq!(first.1.len(), 4, "14 - 10 attached = 4 free: {:?}", sim.swaps);
    }

    #[test]
    fn a_cache_swaps_all_members_when_credits_are_spent_and_needs_room_for_a_whole_set() {
        let mut sim = Sim::new(cfg(Mode::Cache, Strategy::AllAtOnce), vec![2_900.0; 10], vec![CAP as f64; 10]);
        sim.run(Duration::from_secs(40 * 60));
        assert_eq!(sim.swaps.len(), 1);
        assert_eq!(sim.swaps[0].1, (0..10).collect::<Vec<_>>());
        // No copy: the threshold is the 5 % floor (270,000 credits, 93 s before
        // the bucket runs dry at 1,862 s), not 1.5 x a copy's need.
        let at = sim.swaps[0].0.as_secs_f64();
        assert!((1_760.0..1_775.0).contains(&at), "{at}");
        let mut c = cfg(Mode::Cache, Strategy::AllAtOnce);
        c.attach_limit = 15;
        let mut sim = Sim::new(c, vec![2_900.0; 10], vec![CAP as f64; 10]);
        sim.run(Duration::from_secs(40 * 60));
        assert!(sim.swaps.is_empty());
        assert!(sim.policy.waiting().unwrap().contains("needs 10 attachments"), "{:?}", sim.policy.waiting());
    }

    #[test]
    fn ephemeral_swaps_wait_for_idle_time() {
        let mut sim = Sim::new(cfg(Mode::Ephemeral, Strategy::AllAtOnce), vec![2_900.0; 3], vec![CAP as f64; 3]);
        sim.idle = Duration::from_secs(1);
        sim.run(Duration::from_secs(40 * 60));
        assert!(sim.swaps.is_empty());
        assert!(sim.policy.waiting().unwrap().contains("idle"));
        sim.idle = Duration::from_secs(10);
        sim.run(Duration::from_secs(10));
        assert_eq!(sim.swaps.len(), 1);
    }

    #[test]
    fn modes_and_strategies_parse() {
        assert_eq!("cache".parse::<Mode>().unwrap(), Mode::Cache);
        assert_eq!("one".parse::<Strategy>().unwrap(), Strategy::OneAtATime);
        assert!("raid5".parse::<Mode>().unwrap_err().contains("persistent"));
    }
}
