//! The elastic-cache policy: when to provision a cache, when to drain it (phase 2)
//! and when to delete it, and how big the next one should be.
//!
//! Fed with cumulative counters at arbitrary times; decides once per utilization
//! window. Utilization = application throughput over the window / the backing
//! volume's reserved bandwidth (the paper's definition): with no cache the
//! application cannot exceed the backing, so a saturating burst reads ~100 %.
//! With `backing_iops` set, the busier of bytes and operations counts (a burst
//! of small writes saturates a gp3 volume's IOPS long before its MB/s).

use crate::window::UtilWindow;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ElasticConfig {
    /// Utilization window (paper: 5 s).
    pub window: Duration,
    /// Utilization threshold UT (paper: 0.30).
    pub ut: f64,
    /// Inactivity delay ID before phase 2 (paper: 30 s).
    pub inactivity_delay: Duration,
    /// Reserved bandwidth of the backing volume, bytes/s.
    pub backing_bw: f64,
    /// IOPS of the backing volume, if it has a limit (requests counted).
    #[serde(default)]
    pub backing_iops: Option<f64>,
    /// Size of the first cache (paper: 10 GB).
    pub initial_cache: u64,
    pub min_cache: u64,
    pub max_cache: u64,
    /// Cache sizes are rounded up to a multiple of this (cloud volumes come in GiB).
    pub granularity: u64,
    /// Learn the burst period and provision before the next burst (on by
    /// default). Guarded for irregular workloads: a prediction that misses (the
    /// burst came early, or did not come while the cache waited) suspends it
    /// until the last three compute gaps agree within 2 windows + 10 %.
    pub learn_period: bool,
    /// Expected provisioning (create + attach) delay, for pre-provisioning lead.
    pub attach_delay: Duration,
    /// How far toward the used size a cache shrinks after a burst: 1.0 = all the
    /// way (the paper), 0.5 = halfway.
    pub shrink: f64,
}

impl Default for ElasticConfig {
    fn default() -> Self {
        const GIB: u64 = 1 << 30;
        ElasticConfig {
            window: Duration::from_secs(5),
            ut: 0.30,
            inactivity_delay: Duration::from_secs(30),
            backing_bw: 33e6,
            backing_iops: None,
            initial_cache: 10 * GIB,
            min_cache: GIB,
            max_cache: 64 * GIB,
            granularity: GIB,
            learn_period: true,
            attach_delay: Duration::from_secs(3),
            shrink: 1.0,
        }
    }
}

/// What the cache layer reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheObs {
    pub attached: bool,
    pub dirty_bytes: u64,
    /// Most bytes in use at once since attach.
    pub used_high_bytes: u64,
    /// Bytes evicted (dirty ones flushed early, clean ones dropped) because
    /// the cache was full (cumulative).
    pub evicted_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Create and attach a cache volume of this size.
    Provision { size: u64 },
    /// Phase 2: flush at full speed, writes bypass.
    StartDrain,
    /// Back to phase 1 (demand rose again while draining).
    Resume,
    /// Cache is clean: detach and delete it.
    Detach,
    /// The burst ended while its cache was still being created or attached:
    /// release that volume when it arrives, unused.
    CancelProvision,
    /// The last detach failed (the daemon reported why); it is retried after
    /// a backoff, meanwhile the cache keeps draining (or, if it is already
    /// detached, a new one may be provisioned).
    DetachFailed { attempt: u32, retry_in_s: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub at: Duration,
    pub action: Action,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Idle,
    Provisioning,
    /// Attached before a predicted burst, waiting for it.
    Armed,
    Boost,
    Drain,
    Detaching,
}

/// What one cached burst taught us.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BurstRecord {
    pub start: Duration,
    pub cache_size: u64,
    pub used: u64,
    pub evicted: u64,
    pub next_size: u64,
}

/// Most burst records kept in [`ElasticPolicy::history`] (the oldest go first):
/// a daemon runs for months.
pub const HISTORY_CAP: usize = 256;
/// Burst starts and ends kept for period learning (only the last two matter).
const BURST_TIMES_CAP: usize = 8;
/// First and largest wait before a failed detach is retried.
const DETACH_RETRY_FIRST: Duration = Duration::from_secs(1);
const DETACH_RETRY_MAX: Duration = Duration::from_secs(300);

#[derive(Debug)]
pub struct ElasticPolicy {
    cfg: ElasticConfig,
    state: State,
    window: UtilWindow,
    below_since: Option<Duration>,
    cache_size: u64,
    next_size: u64,
    evicted_at_attach: u64,
    evicted_in_boost: u64,
    used_high: u64,
    state_since: Duration,
    burst_start: Option<Duration>,
    /// Create + attach times observed on this provider (the lead of pre-provisioning).
    attach_est: crate::backing::AttachEstimate,
    /// Starts of bursts (utilization first above UT), for period learning.
    burst_starts: Vec<Duration>,
    /// Ends of bursts (utilization last back below UT before the drain).
    burst_ends: Vec<Duration>,
    /// Candidate end of the current burst and the app bytes then.
    end_candidate: Option<(Duration, u64)>,
    /// App bytes at the start of the window in which the burst was detected.
    burst_bytes0: u64,
    /// The cache saw a burst since it was attached.
    saw_burst: bool,
    /// What the last bursts taught (at most [`HISTORY_CAP`], oldest first).
    pub history: Vec<BurstRecord>,
    last_util: f64,
    /// Detach attempts that failed in a row, and when the next may start.
    detach_failures: u32,
    detach_retry_at: Duration,
    /// Period learning suspended after a missed prediction (irregular gaps):
    /// the count of burst starts then (only gaps seen since count to resume).
    learning_suspended: Option<usize>,
    /// Predictions that came true, and that missed.
    pub predictions: (u32, u32),
    /// Burst starts ever seen (the kept times are capped).
    starts_seen: usize,
}

fn round_up(v: u64, g: u64) -> u64 {
    v.div_ceil(g.max(1)) * g.max(1)
}

impl ElasticPolicy {
    pub fn new(cfg: ElasticConfig) -> Self {
        let next = round_up(cfg.initial_cache, cfg.granularity).clamp(cfg.min_cache, cfg.max_cache);
        ElasticPolicy {
            window: UtilWindow::new(cfg.window),
            attach_est: crate::backing::AttachEstimate::new(cfg.attach_delay),
            cfg,
            state: State::Idle,
            below_since: None,
            cache_size: 0,
            next_size: next,
            evicted_at_attach: 0,
            evicted_in_boost: 0,
            used_high: 0,
            state_since: Duration::ZERO,
            burst_start: None,
            burst_starts: Vec::new(),
            burst_ends: Vec::new(),
            end_candidate: None,
            burst_bytes0: 0,
            saw_burst: false,
            history: Vec::new(),
            last_util: 0.0,
            detach_failures: 0,
            detach_retry_at: Duration::ZERO,
            learning_suspended: None,
            predictions: (0, 0),
            starts_seen: 0,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }
    pub fn next_size(&self) -> u64 {
        self.next_size
    }
    pub fn last_utilization(&self) -> f64 {
        self.last_util
    }
    pub fn config(&self) -> &ElasticConfig {
        &self.cfg
    }

    /// What the backing provides now (from [`crate::backing::BackingCapacity`]):
    /// utilization is measured against it from the next tick on.
    pub fn set_backing(&mut self, bytes_per_s: f64, ops_per_s: Option<f64>) {
        self.cfg.backing_bw = bytes_per_s;
        self.cfg.backing_iops = ops_per_s;
    }

    /// A provisioning (create + attach) took `took` on this provider: the
    /// pre-provisioning lead follows the running estimate of these.
    pub fn observe_provision_time(&mut self, took: Duration) {
        self.attach_est.observe(took);
        self.cfg.attach_delay = self.attach_est.estimate();
    }

    pub fn attach_estimate(&self) -> &crate::backing::AttachEstimate {
        &self.attach_est
    }

    fn go(&mut self, s: State, now: Duration) {
        self.state = s;
        self.state_since = now;
    }

    /// The provisioned cache is attached (after the provider's delay).
    pub fn attached(&mut self, now: Duration, size: u64, obs: CacheObs) {
        self.cache_size = size;
        self.evicted_at_attach = obs.evicted_bytes;
        self.evicted_in_boost = 0;
        self.used_high = 0;
        self.below_since = None;
        let armed = self.state == State::Provisioning && self.burst_start.is_none();
        self.saw_burst = !armed;
        self.go(if armed { State::Armed } else { State::Boost }, now);
    }

    /// After a restart that recovered a cache volume of `size`: drain and release it.
    pub fn resume_drain(&mut self, now: Duration, size: u64) {
        self.cache_size = size;
        self.go(State::Drain, now);
    }

    /// Provisioning failed: back to idle (the next window retries).
    pub fn provision_failed(&mut self, now: Duration) {
        self.go(State::Idle, now);
    }

    /// The cache was detached and deleted.
    pub fn detached(&mut self, now: Duration) {
        self.cache_size = 0;
        self.burst_start = None;
        self.detach_failures = 0;
        self.detach_retry_at = Duration::ZERO;
        self.go(State::Idle, now);
    }

    /// Applying [`Action::Detach`] failed (`error` says why): never stay in
    /// `Detaching`. A cache still attached goes back to `Drain` (it keeps
    /// draining, demand may resume it, and detach is retried once clean after
    /// a backoff: 1 s, 2 s, 4 s ... up to 5 min); one already detached (only
    /// the provider's detach or delete failed, which the daemon retries) goes
    /// to `Idle`, so a new cache can be provisioned. Returns the decision that
    /// reports it.
    pub fn detach_failed(&mut self, now: Duration, obs: CacheObs, error: &str) -> Decision {
        self.detach_failures += 1;
        let backoff = DETACH_RETRY_FIRST.saturating_mul(1 << (self.detach_failures - 1).min(16)).min(DETACH_RETRY_MAX);
        self.detach_retry_at = now + backoff;
        let next = if obs.attached { State::Drain } else { State::Idle };
        if next == State::Idle {
            self.cache_size = 0;
            self.burst_start = None;
        }
        self.go(next, now);
        self.decide(
            now,
            Action::DetachFailed { attempt: self.detach_failures, retry_in_s: backoff.as_secs_f64() },
            format!(
                "detach failed ({error}); {}",
                if obs.attached {
                    format!("still draining, retrying in {:.0} s (attempt {})", backoff.as_secs_f64(), self.detach_failures)
                } else {
                    "the cache is detached; its volume is deleted later, a new cache may be provisioned".into()
                }
            ),
        )
    }

    /// Utilization over the sliding window ending at `now`; `None` until a
    /// full window of samples exists.
    fn utilization(&mut self, now: Duration, app_bytes: u64, app_ops: u64) -> Option<f64> {
        Some(self.window.push(now, app_bytes, app_ops)?.utilization(self.cfg.backing_bw, self.cfg.backing_iops))
    }

    /// Feed cumulative application bytes (reads + writes) and the cache's state,
    /// as often as you like (each call evaluates the sliding window ending now).
    /// Returns the decisions to apply, each with its reason.
    pub fn tick(&mut self, now: Duration, app_bytes: u64, obs: CacheObs) -> Vec<Decision> {
        self.tick_ops(now, app_bytes, 0, obs)
    }

    /// [`Self::tick`] with the cumulative count of application requests too,
    /// for a backing volume with an IOPS limit (`backing_iops`).
    pub fn tick_ops(&mut self, now: Duration, app_bytes: u64, app_ops: u64, obs: CacheObs) -> Vec<Decision> {
        let mut out = Vec::new();
        if matches!(self.state, State::Boost | State::Armed) {
            self.used_high = self.used_high.max(obs.used_high_bytes);
        }
        if self.state == State::Boost {
            self.evicted_in_boost = obs.evicted_bytes.saturating_sub(self.evicted_at_attach);
        }
        // Drain completes whenever it completes.
        if self.state == State::Drain && obs.attached && obs.dirty_bytes == 0 && now >= self.detach_retry_at {
            self.finish_burst();
            out.push(self.decide(now, Action::Detach, "cache is clean after draining: detach and delete it".into()));
            self.go(State::Detaching, now);
        }
        let Some(util) = self.utilization(now, app_bytes, app_ops) else {
            return out;
        };
        self.last_util = util;
        let above = util > self.cfg.ut;
        if self.burst_start.is_some() && self.burst_ends.len() < self.burst_starts.len() {
            if above {
                self.end_candidate = None;
            } else if self.end_candidate.is_none() {
                self.end_candidate = Some((now, app_bytes));
            }
        }
        let pct = |u: f64| format!("{:.0} %", u * 100.0);
        let window = self.cfg.window;
        match self.state {
            State::Idle if above => {
                // A burst before the predicted one could be provisioned for:
                // the prediction was wrong.
                if self.cfg.learn_period && self.learning_suspended.is_none() && self.next_burst().is_some_and(|n| now + self.lead() < n) {
                    self.missed(now, "the burst came before the predicted time");
                }
                self.note_burst_start(now);
                self.below_since = None;
                let size = self.next_size;
                out.push(self.decide(
                    now,
                    Action::Provision { size },
                    format!("utilization {} > UT {} over the last {:?}: provision a {} cache", pct(util), pct(self.cfg.ut), window, gib(size)),
                ));
                self.go(State::Provisioning, now);
            }
            State::Provisioning if above => {
                self.below_since = None;
                if self.burst_start.is_none() {
                    self.note_burst_start(now);
                }
            }
            // A reactive cache that has not arrived when the burst is over
            // (below UT for ID, as a cache would start draining): not needed.
            State::Provisioning if self.burst_start.is_some() => {
                if let Some(below) = self.below_for_id(now) {
                    self.close_burst(app_bytes);
                    out.push(self.decide(
                        now,
                        Action::CancelProvision,
                        format!(
                            "utilization below UT {} for {:?} >= ID {:?} while the cache was still being provisioned (for {:.1} s): the burst is over, release it unused",
                            pct(self.cfg.ut),
                            below,
                            self.cfg.inactivity_delay,
                            now.saturating_sub(self.state_since).as_secs_f64()
                        ),
                    ));
                    self.cache_size = 0;
                    self.burst_start = None;
                    self.below_since = None;
                    self.go(State::Idle, now);
                }
            }
            State::Armed => {
                if above {
                    self.predictions.0 += 1;
                    self.note_burst_start(now);
                    self.go(State::Boost, now);
                } else if now.saturating_sub(self.state_since) > self.cfg.attach_delay + self.cfg.inactivity_delay + window {
                    self.missed(now, "the burst did not come");
                    out.push(self.decide(now, Action::StartDrain, "predicted burst did not come: release the pre-provisioned cache".into()));
                    self.go(State::Drain, now);
                }
            }
            State::Boost => {
                if above {
                    self.below_since = None;
                } else if let Some(below) = self.below_for_id(now) {
                    self.close_burst(app_bytes);
                    out.push(self.decide(
                        now,
                        Action::StartDrain,
                        format!(
                            "utilization below UT {} for {:?} >= ID {:?}: phase 2 (flush at full speed, writes bypass); {} dirty",
                            pct(self.cfg.ut),
                            below,
                            self.cfg.inactivity_delay,
                            gib(obs.dirty_bytes)
                        ),
                    ));
                    self.go(State::Drain, now);
                }
            }
            State::Drain if above && obs.attached && obs.dirty_bytes > 0 => {
                self.below_since = None;
                self.note_burst_start(now);
                out.push(self.decide(now, Action::Resume, format!("utilization {} > UT while draining: back to phase 1", pct(util))));
                self.go(State::Boost, now);
            }
            _ => {}
        }
        self.pre_provision(now, &mut out);
        out
    }

    /// How long utilization has been below UT, once that is at least the
    /// inactivity delay (the clock starts at the first tick below it).
    fn below_for_id(&mut self, now: Duration) -> Option<Duration> {
        let below = now.saturating_sub(*self.below_since.get_or_insert(now));
        (below >= self.cfg.inactivity_delay).then_some(below)
    }

    fn note_burst_start(&mut self, at: Duration) {
        if self.burst_start.is_none() {
            self.burst_start = Some(at);
            self.burst_starts.push(at);
            self.starts_seen += 1;
            // Bounded: drop the oldest (start, end) pairs; only the last two count.
            while self.burst_starts.len() > BURST_TIMES_CAP && !self.burst_ends.is_empty() {
                self.burst_starts.remove(0);
                self.burst_ends.remove(0);
            }
            self.burst_bytes0 = self.window.first_bytes();
            self.end_candidate = None;
            self.saw_burst = true;
        }
    }

    /// The burst is over (drain decided): its end is when utilization last went
    /// below UT; what it wrote counts as used cache (the cache may have come late).
    fn close_burst(&mut self, app_bytes: u64) {
        if self.burst_ends.len() < self.burst_starts.len() {
            let (end, bytes) = self.end_candidate.take().unwrap_or((self.state_since, app_bytes));
            self.burst_ends.push(end);
            self.used_high = self.used_high.max(bytes.saturating_sub(self.burst_bytes0));
        }
    }

    /// Learn the next size from this burst: shrink toward what was used (all the
    /// way by default), grow by what had to be evicted early.
    fn finish_burst(&mut self) {
        if !self.saw_burst {
            // A pre-provisioned cache whose burst never came teaches nothing.
            return;
        }
        let (used, evicted) = (self.used_high, self.evicted_in_boost);
        let want = if evicted > 0 {
            self.cache_size + evicted
        } else {
            let cut = (self.cache_size.saturating_sub(used)) as f64 * self.cfg.shrink.clamp(0.0, 1.0);
            self.cache_size - cut as u64
        };
        self.next_size = round_up(want, self.cfg.granularity).clamp(self.cfg.min_cache, self.cfg.max_cache);
        self.history.push(BurstRecord {
            start: self.burst_start.unwrap_or_default(),
            cache_size: self.cache_size,
            used,
            evicted,
            next_size: self.next_size,
        });
        if self.history.len() > HISTORY_CAP {
            self.history.remove(0);
        }
    }

    /// The compute gap between the last burst's end and the next one's start,
    /// learned from the previous gap (bulk-synchronous apps repeat their phases).
    pub fn gap(&self) -> Option<Duration> {
        let (s, e) = (&self.burst_starts, &self.burst_ends);
        if s.len() < 2 {
            return None;
        }
        // Gap before the latest burst: its start minus the previous burst's end.
        let prev_end = *e.get(s.len() - 2)?;
        Some(s[s.len() - 1].saturating_sub(prev_end))
    }

    /// When the next burst is expected, if the period has been learned.
    pub fn next_burst(&self) -> Option<Duration> {
        let end = *self.burst_ends.get(self.burst_starts.len().checked_sub(1)?)?;
        Some(end + self.gap()?)
    }

    /// How far ahead of a predicted burst the cache is provisioned: the attach
    /// delay and two windows of slack (predictions jitter by about one).
    fn lead(&self) -> Duration {
        self.cfg.attach_delay + 2 * self.cfg.window
    }

    fn missed(&mut self, now: Duration, why: &str) {
        self.predictions.1 += 1;
        self.learning_suspended = Some(self.starts_seen);
        tracing::info!(at = ?now, "burst-period prediction missed ({why}): pre-provisioning suspended until three compute gaps agree");
    }

    /// The last three compute gaps, all seen since burst start `since`,
    /// agree: they span at most two windows + 10 %.
    fn regular(&self, since: usize) -> bool {
        let (s, e) = (&self.burst_starts, &self.burst_ends);
        let n = s.len();
        // The cap on kept times shifts indices: count from the end.
        if n < 4 || e.len() < n - 1 || self.starts_seen < since + 3 {
            return false;
        }
        let gaps: Vec<f64> = (n - 3..n).map(|i| s[i].saturating_sub(e[i - 1]).as_secs_f64()).collect();
        let (lo, hi) = gaps.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &g| (lo.min(g), hi.max(g)));
        hi - lo <= 2.0 * self.cfg.window.as_secs_f64() + 0.1 * hi
    }

    fn pre_provision(&mut self, now: Duration, out: &mut Vec<Decision>) {
        if !self.cfg.learn_period || self.state != State::Idle {
            return;
        }
        if let Some(since) = self.learning_suspended {
            if !self.regular(since) {
                return;
            }
            self.learning_suspended = None;
        }
        let Some(next) = self.next_burst() else { return };
        let lead = self.lead();
        if now + lead >= next && now < next {
            let size = self.next_size;
            out.push(self.decide(
                now,
                Action::Provision { size },
                format!(
                    "bursts follow {:.1} s compute gaps; next expected at {:.1} s: pre-provision a {} cache {:.1} s ahead",
                    self.gap().unwrap_or_default().as_secs_f64(),
                    next.as_secs_f64(),
                    gib(size),
                    lead.as_secs_f64()
                ),
            ));
            self.burst_start = None;
            self.go(State::Provisioning, now);
        }
    }

    fn decide(&self, at: Duration, action: Action, reason: String) -> Decision {
        tracing::info!(?action, %reason, "elastic policy decision");
        Decision { at, action, reason }
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MB: f64 = 1e6;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    /// Drives a policy second by second with a demand function (bytes/s) and a
    /// trivial cache model, recording decisions.
    struct Sim {
        p: ElasticPolicy,
        now: f64,
        bytes: u64,
        obs: CacheObs,
        log: Vec<Decision>,
        /// The next this many detaches fail (the cache stays attached).
        fail_detaches: u32,
        /// Provisioning takes this long (0: at once), and the one under way.
        attach_s: f64,
        pending: Option<(f64, f64, u64)>,
    }

    impl Sim {
        fn new(cfg: ElasticConfig) -> Self {
            let mut p = ElasticPolicy::new(cfg);
            assert!(p.tick(Duration::ZERO, 0, CacheObs::default()).is_empty());
            Sim { p, now: 0.0, bytes: 0, obs: CacheObs::default(), log: vec![], fail_detaches: 0, attach_s: 0.0, pending: None }
        }
        fn run(&mut self, secs: f64, rate: f64) {
            let end = self.now + secs;
            while self.now < end - 1e-9 {
                self.now += 1.0;
                self.bytes += rate as u64;
                if let Some((due, began, size)) = self.pending.filter(|p| p.0 <= self.now + 1e-9) {
                    let _ = due;
                    self.pending = None;
                    self.obs.attached = true;
                    self.p.observe_provision_time(s(self.now - began));
                    self.p.attached(s(self.now), size, self.obs);
                }
                let d = self.p.tick(s(self.now), self.bytes, self.obs);
                for d in d {
                    match d.action {
                        Action::Provision { size } if self.attach_s > 0.0 => self.pending = Some((self.now + self.attach_s, self.now, size)),
                        Action::Provision { size } => {
                            self.obs.attached = true;
                            self.p.attached(s(self.now), size, self.obs);
                        }
                        Action::CancelProvision => self.pending = None,
                        Action::Detach if self.fail_detaches > 0 => {
                            self.fail_detaches -= 1;
                            self.log.push(d);
                            let f = self.p.detach_failed(s(self.now), self.obs, "injected");
                            self.log.push(f);
                            continue;
                        }
                        Action::Detach => {
                            self.obs = CacheObs { evicted_bytes: self.obs.evicted_bytes, ..CacheObs::default() };
                            self.p.detached(s(self.now));
                        }
                        _ => {}
                    }
                    self.log.push(d);
                }
            }
        }
        fn actions(&self) -> Vec<(u64, &Action)> {
            self.log.iter().map(|d| (d.at.as_secs(), &d.action)).collect()
        }
    }

    #[test]
    fn burst_above_ut_provisions_at_the_end_of_its_first_window() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.run(20.0, 1.0 * MB); // 3 %: nothing
        assert!(sim.log.is_empty());
        sim.run(5.0, 33.0 * MB);
        // Sliding 5 s window: 42 % two seconds into the burst.
        assert_eq!(sim.actions(), vec![(22, &Action::Provision { size: 10 * GIB })]);
        assert!(sim.log[0].reason.contains("UT"), "{}", sim.log[0].reason);
    }

    #[test]
    fn small_writes_provision_by_operations_when_the_backing_has_an_iops_limit() {
        // gp3 backing: 125 MiB/s, 3,000 IOPS. 2,400 writes/s of 8 KiB: 15 % of
        // its bytes but 80 % of its operations.
        let cfg = ElasticConfig { backing_bw: 125.0 * 1_048_576.0, backing_iops: Some(3_000.0), ..ElasticConfig::default() };
        let mut p = ElasticPolicy::new(cfg.clone());
        let (mut bytes, mut ops) = (0u64, 0u64);
        let mut got = vec![];
        for t in 1..=10u64 {
            bytes += 2_400 * 8_192;
            ops += 2_400;
            got.extend(p.tick_ops(s(t as f64), bytes, ops, CacheObs::default()));
        }
        assert!(matches!(got.first().map(|d| &d.action), Some(Action::Provision { .. })), "{got:?}");
        // Without the IOPS limit the same burst is invisible.
        let mut p = ElasticPolicy::new(ElasticConfig { backing_iops: None, ..cfg });
        let quiet: Vec<Decision> = (1..=10u64).flat_map(|t| p.tick_ops(s(t as f64), t * 2_400 * 8_192, t * 2_400, CacheObs::default())).collect();
        assert!(quiet.is_empty(), "{quiet:?}");
    }

    #[test]
    fn demand_just_below_ut_never_provisions() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.run(100.0, 0.29 * 33.0 * MB);
        assert!(sim.log.is_empty(), "{:?}", sim.log);
    }

    #[test]
    fn drain_starts_only_after_id_below_ut_and_detach_when_clean() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.run(10.0, 100.0 * MB);
        assert_eq!(sim.p.state(), State::Boost);
        sim.obs.dirty_bytes = GIB;
        sim.run(25.0, 0.0);
        assert_eq!(sim.p.state(), State::Boost, "25 s below UT < ID");
        sim.run(10.0, 0.0);
        assert_eq!(sim.p.state(), State::Drain);
        let drain_at = sim.log.iter().find(|d| d.action == Action::StartDrain).unwrap().at.as_secs();
        assert_eq!(drain_at, 45, "window below UT from 15 s, ID 30 s");
        sim.run(5.0, 0.0);
        assert_eq!(sim.p.state(), State::Drain, "still dirty");
        sim.obs.dirty_bytes = 0;
        sim.run(1.0, 0.0);
        assert_eq!(sim.log.last().unwrap().action, Action::Detach);
    }

    #[test]
    fn a_window_above_ut_resets_the_inactivity_delay() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.run(10.0, 100.0 * MB);
        sim.obs.dirty_bytes = GIB;
        sim.run(25.0, 0.0);
        sim.run(5.0, 100.0 * MB);
        sim.run(25.0, 0.0);
        assert_eq!(sim.p.state(), State::Boost);
        sim.run(15.0, 0.0);
        assert_eq!(sim.p.state(), State::Drain);
    }

    #[test]
    fn demand_during_drain_resumes_phase_one() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.run(10.0, 100.0 * MB);
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        assert_eq!(sim.p.state(), State::Drain);
        sim.run(5.0, 100.0 * MB);
        assert_eq!(sim.p.state(), State::Boost);
        assert_eq!(sim.log.last().unwrap().action, Action::Resume);
    }

    #[test]
    fn cache_shrinks_to_used_then_grows_by_evicted() {
        let mut sim = Sim::new(ElasticConfig::default());
        // Burst 1 uses 3.2 GiB of 10.
        sim.run(10.0, 100.0 * MB);
        sim.obs.used_high_bytes = 3 * GIB + GIB / 5;
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        sim.obs.dirty_bytes = 0;
        sim.run(5.0, 0.0);
        assert_eq!(sim.p.next_size(), 4 * GIB, "rounded up to whole GiB");
        // Burst 2 evicts 1.5 GiB early.
        sim.run(10.0, 100.0 * MB);
        let prov = sim.log.iter().filter_map(|d| if let Action::Provision { size } = d.action { Some(size) } else { None }).last();
        assert_eq!(prov, Some(4 * GIB));
        sim.obs.used_high_bytes = 4 * GIB;
        sim.obs.evicted_bytes += GIB + GIB / 2;
        sim.run(5.0, 100.0 * MB);
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        sim.obs.dirty_bytes = 0;
        sim.run(5.0, 0.0);
        assert_eq!(sim.p.next_size(), 6 * GIB, "4 + 1.5 rounded up");
        assert_eq!(sim.p.history.len(), 2);
    }

    #[test]
    fn a_shrink_factor_of_one_half_shrinks_halfway_to_used() {
        let cfg = ElasticConfig { shrink: 0.5, ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        sim.run(10.0, 100.0 * MB);
        sim.obs.used_high_bytes = 2 * GIB;
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        sim.obs.dirty_bytes = 0;
        sim.run(2.0, 0.0);
        assert_eq!(sim.p.next_size(), 6 * GIB, "10 - (10 - 2) / 2");
    }

    #[test]
    fn size_bounds_hold() {
        let cfg = ElasticConfig { min_cache: 2 * GIB, max_cache: 5 * GIB, ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        assert_eq!(sim.p.next_size(), 5 * GIB, "initial clamped to max");
        sim.run(10.0, 100.0 * MB);
        sim.obs.used_high_bytes = GIB / 10;
        sim.run(40.0, 0.0);
        sim.run(2.0, 0.0);
        assert_eq!(sim.p.next_size(), 2 * GIB, "shrunk to min");
    }

    #[test]
    fn learned_period_pre_provisions_before_the_next_burst() {
        let cfg = ElasticConfig { learn_period: true, attach_delay: s(10.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        // Bursts of 20 s every 200 s.
        for _ in 0..3 {
            sim.run(20.0, 100.0 * MB);
            sim.run(180.0, 0.0);
        }
        // Detected 1 s into each burst, back below UT 5 s after its end.
        assert_eq!(sim.p.gap(), Some(s(176.0)));
        assert_eq!(sim.p.next_burst(), Some(s(601.0)));
        sim.run(20.0, 100.0 * MB);
        let provs: Vec<u64> = sim.log.iter().filter(|d| matches!(d.action, Action::Provision { .. })).map(|d| d.at.as_secs()).collect();
        // Fourth burst is detected at 601 s: provisioned attach delay + 2 windows ahead.
        assert_eq!(provs.last(), Some(&581), "{provs:?}");
        assert!(sim.log.iter().any(|d| d.reason.contains("pre-provision")));
    }

    #[test]
    fn bytes_written_before_the_cache_arrived_count_as_used() {
        let mut sim = Sim::new(ElasticConfig::default());
        // 30 s at 100 MB/s = 3 GB (2.8 GiB), but the cache saw only 1 GiB of it.
        sim.run(30.0, 100.0 * MB);
        sim.obs.used_high_bytes = GIB;
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        sim.obs.dirty_bytes = 0;
        sim.run(2.0, 0.0);
        assert_eq!(sim.p.next_size(), 3 * GIB, "{:?}", sim.p.history);
    }

    #[test]
    fn an_unused_pre_provisioned_cache_does_not_shrink_the_next_one() {
        let cfg = ElasticConfig { learn_period: true, attach_delay: s(10.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        for _ in 0..3 {
            sim.run(20.0, 100.0 * MB);
            sim.run(180.0, 0.0);
        }
        let before = sim.p.next_size();
        sim.run(100.0, 0.0);
        assert!(sim.log.iter().any(|d| d.reason.contains("did not come")));
        assert_eq!(sim.p.next_size(), before);
    }

    #[test]
    fn a_short_dip_inside_a_burst_does_not_end_it() {
        let cfg = ElasticConfig { learn_period: true, ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        sim.run(10.0, 100.0 * MB);
        sim.run(6.0, 0.0); // dip: below UT for a moment
        sim.run(10.0, 100.0 * MB);
        sim.run(100.0, 0.0);
        sim.run(20.0, 100.0 * MB);
        // Burst 1 ends when utilization last fell below UT (31 s), not at the dip;
        // burst 2 is detected 1 s into it (127 s).
        assert_eq!(sim.p.gap(), Some(s(127.0 - 31.0)), "{:?}", sim.p.history);
    }

    /// `release()` can fail (a backing flush error, the cache re-dirtied, the
    /// provider's detach or delete): the policy must not wait in `Detaching`
    /// forever (every write bypassing, no cache ever again). The failure is
    /// reported, detach is retried with a doubling backoff while the cache
    /// stays attached, and a detached cache lets a new burst provision again.
    #[test]
    fn a_failed_detach_is_retried_with_backoff_and_never_blocks_provisioning() {
        let mut sim = Sim::new(ElasticConfig::default());
        sim.fail_detaches = 2;
        sim.run(10.0, 100.0 * MB);
        sim.obs.dirty_bytes = GIB;
        sim.run(40.0, 0.0);
        sim.obs.dirty_bytes = 0;
        sim.run(10.0, 0.0);
        let at = |want: fn(&Action) -> bool| sim.log.iter().filter(|d| want(&d.action)).map(|d| d.at.as_secs()).collect::<Vec<_>>();
        let detaches = at(|a| *a == Action::Detach);
        let failures = at(|a| matches!(a, Action::DetachFailed { .. }));
        // Clean at 51 s: detach fails, retried 1 s later, fails, retried 2 s later, works.
        assert_eq!(detaches, vec![51, 52, 54], "{:?}", sim.log);
        assert_eq!(failures, vec![51, 52]);
        assert!(sim.log.iter().any(|d| d.reason.contains("detach failed (injected)") && d.reason.contains("retrying in 2 s")), "{:?}", sim.log);
        assert_eq!(sim.p.state(), State::Idle);
        // The next burst gets a cache.
        sim.run(10.0, 100.0 * MB);
        assert_eq!(sim.p.state(), State::Boost);
    }

    /// Only the provider's delete failed (the cache itself is detached): the
    /// policy is `Idle` at once and provisions for the next burst.
    #[test]
    fn a_failed_volume_delete_after_detach_lets_the_next_burst_provision() {
        let mut p = ElasticPolicy::new(ElasticConfig::default());
        let obs = CacheObs { attached: true, ..CacheObs::default() };
        p.attached(s(1.0), GIB, obs);
        p.go(State::Detaching, s(2.0));
        let d = p.detach_failed(s(2.0), CacheObs::default(), "delete: provider unavailable");
        assert!(matches!(d.action, Action::DetachFailed { attempt: 1, .. }), "{d:?}");
        assert_eq!(p.state(), State::Idle);
        let mut bytes = 0;
        let mut out = vec![];
        for t in 3..12 {
            bytes += 100_000_000;
            out.extend(p.tick(s(t as f64), bytes, CacheObs::default()));
        }
        assert!(out.iter().any(|d| matches!(d.action, Action::Provision { .. })), "{out:?}");
    }

    /// A long-running daemon: the burst history and the burst times stay bounded.
    #[test]
    fn burst_history_is_bounded() {
        let cfg = ElasticConfig { learn_period: true, inactivity_delay: s(5.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        for _ in 0..(HISTORY_CAP + 40) {
            sim.run(8.0, 100.0 * MB);
            sim.obs.dirty_bytes = GIB;
            sim.run(12.0, 0.0);
            sim.obs.dirty_bytes = 0;
            sim.run(3.0, 0.0);
        }
        assert_eq!(sim.p.history.len(), HISTORY_CAP, "oldest burst records dropped");
        assert!(sim.p.history.last().unwrap().start > s(23.0 * HISTORY_CAP as f64), "the newest are kept");
        assert!(sim.p.burst_starts.len() <= BURST_TIMES_CAP && sim.p.burst_ends.len() <= BURST_TIMES_CAP);
        assert!(sim.p.gap().is_some(), "period learning still works on the kept times");
    }

    /// Compute phases of 180 s x (1 +- 25 %), seeded: the gaps between bursts.
    fn jittered(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                180.0 * (1.0 + 0.25 * (2.0 * u - 1.0))
            })
            .collect()
    }

    fn wasted(sim: &Sim) -> usize {
        sim.log.iter().filter(|d| d.reason.contains("did not come")).count()
    }

    #[test]
    fn irregular_compute_gaps_suspend_period_learning_after_a_miss() {
        let cfg = ElasticConfig { attach_delay: s(10.0), ..ElasticConfig::default() };
        assert!(cfg.learn_period, "learning is the default");
        for seed in 1..=5 {
            let mut sim = Sim::new(cfg.clone());
            for gap in jittered(30, seed) {
                sim.run(20.0, 100.0 * MB);
                sim.run(gap.round(), 0.0);
            }
            let (hits, misses) = sim.p.predictions;
            // Unguarded, a prediction from the last gap misses about half the
            // time (gaps differ by up to 90 s): 17 misses, 7 caches released
            // unused with seed 1; guarded, a miss stops it until three fresh
            // gaps happen to agree within 10 % + 10 s: 3-5 misses, 1-2 unused.
            assert!(misses <= 6, "seed {seed}: {misses} missed predictions ({hits} hit), {} caches wasted", wasted(&sim));
            assert!(wasted(&sim) <= 3, "seed {seed}: {} pre-provisioned caches released unused", wasted(&sim));
        }
    }

    #[test]
    fn learning_resumes_once_the_gaps_agree_again() {
        let cfg = ElasticConfig { attach_delay: s(10.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        // Regular, then one long gap (a miss: the armed cache is released),
        // then regular again: pre-provisioning comes back after three equal gaps.
        for gap in [180.0, 180.0, 180.0, 400.0, 180.0, 180.0, 180.0, 180.0, 180.0] {
            sim.run(20.0, 100.0 * MB);
            sim.run(gap, 0.0);
        }
        sim.run(20.0, 100.0 * MB);
        assert_eq!(wasted(&sim), 1, "{:?}", sim.log);
        let (hits, misses) = sim.p.predictions;
        // Bursts 3 and 4 predicted, 5 missed (the armed cache released), 6-8
        // reactive while gaps 4-6 disagree, 9 and 10 predicted again.
        assert_eq!((hits, misses), (4, 1), "{:?}", sim.log.iter().map(|d| (d.at.as_secs(), &d.reason)).collect::<Vec<_>>());
        let last_prov = sim.log.iter().rev().find(|d| matches!(d.action, Action::Provision { .. })).unwrap();
        assert!(last_prov.reason.contains("pre-provision"), "{last_prov:?}");
    }

    #[test]
    fn pre_provisioned_cache_is_released_if_the_burst_does_not_come() {
        let cfg = ElasticConfig { learn_period: true, attach_delay: s(10.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        for _ in 0..3 {
            sim.run(20.0, 100.0 * MB);
            sim.run(180.0, 0.0);
        }
        sim.run(100.0, 0.0);
        assert!(sim.log.iter().any(|d| d.reason.contains("did not come")), "{:?}", sim.log);
        assert_eq!(sim.p.state(), State::Idle);
    }

    /// EBS can take minutes to attach: a burst that is over before its cache
    /// arrives cancels it (after ID below UT, as a drain would start), and
    /// a later burst provisions again.
    #[test]
    fn a_cache_still_attaching_when_the_burst_ends_is_cancelled() {
        let mut sim = Sim::new(ElasticConfig { learn_period: false, ..ElasticConfig::default() });
        sim.attach_s = 120.0;
        sim.run(10.0, 100.0 * MB);
        assert_eq!(sim.p.state(), State::Provisioning);
        sim.run(20.0, 0.0);
        assert_eq!(sim.p.state(), State::Provisioning, "below UT for less than ID: still wanted");
        sim.run(20.0, 0.0);
        let cancel = sim.log.iter().find(|d| d.action == Action::CancelProvision).expect("cancelled");
        assert!(cancel.reason.contains("still being provisioned"), "{}", cancel.reason);
        assert_eq!((sim.p.state(), sim.pending), (State::Idle, None));
        // Demand returning during the attach keeps it.
        sim.run(10.0, 100.0 * MB);
        sim.run(20.0, 0.0);
        sim.run(5.0, 100.0 * MB);
        sim.run(100.0, 100.0 * MB);
        assert_eq!(sim.p.state(), State::Boost, "{:?}", sim.actions());
        assert_eq!(sim.log.iter().filter(|d| d.action == Action::CancelProvision).count(), 1);
    }

    /// Pre-provisioning leads by the attach times observed, not the
    /// configured guess: with 30 s attaches (3 s configured) the cache is
    /// asked for early enough to be there when the predicted burst starts.
    #[test]
    fn pre_provisioning_leads_by_the_observed_attach_time() {
        let cfg = ElasticConfig { learn_period: true, attach_delay: s(3.0), ..ElasticConfig::default() };
        let mut sim = Sim::new(cfg);
        sim.attach_s = 30.0;
        // Bursts of 60 s every 300 s: each waits 30 s for its cache.
        for _ in 0..3 {
            sim.run(60.0, 100.0 * MB);
            sim.run(240.0, 0.0);
        }
        assert!(sim.p.attach_estimate().samples >= 3, "{:?}", sim.p.attach_estimate());
        let lead = sim.p.config().attach_delay.as_secs_f64();
        assert!((30.0..=60.0).contains(&lead), "estimate {lead} s from three 30 s attaches");
        let predicted = sim.p.next_burst().unwrap().as_secs_f64();
        sim.run(60.0, 100.0 * MB);
        let pre = sim.log.iter().rev().find(|d| d.reason.contains("pre-provision")).expect("pre-provisioned");
        let ahead = predicted - pre.at.as_secs_f64();
        assert!(ahead >= 30.0 + 10.0, "asked {ahead} s ahead of the predicted burst: must cover the 30 s attach and 2 windows");
    }

    /// The backing's capacity can change (gp2 credits running out):
    /// utilization follows what it provides now.
    #[test]
    fn utilization_is_measured_against_the_capacity_set_now() {
        let mut sim = Sim::new(ElasticConfig { backing_bw: 250.0 * MB, learn_period: false, ..ElasticConfig::default() });
        sim.run(10.0, 50.0 * MB);
        assert!(sim.log.is_empty(), "20 % of 250 MB/s");
        sim.p.set_backing(100.0 * MB, None);
        sim.run(10.0, 50.0 * MB);
        assert!(matches!(sim.log[0].action, Action::Provision { .. }), "50 % of what is left");
    }
}
