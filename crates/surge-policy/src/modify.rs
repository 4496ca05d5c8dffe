//! The `modify-volume` policy: one volume whose IOPS and throughput are raised
//! in place when a burst starts and lowered when the bursts stop, as the
//! cloud's elastic-volume modification rules allow (`surge_cloud::ModifyRules`:
//! EBS's classic one modification per 6 hours, or its newer four per rolling
//! 24 hours, each after the previous one completed).
//!
//! Demand is measured as the elastic-cache policy measures it (a sliding
//! window, utilization of the volume's base capacity against UT, inactivity
//! delay ID), so the two approaches see bursts alike.

use crate::window::UtilWindow;
use serde::Serialize;
use std::time::Duration;
pub use surge_cloud::ModifyRules;

#[derive(Debug, Clone, Serialize)]
pub struct ModifyConfig {
    pub window: Duration,
    pub ut: f64,
    pub inactivity_delay: Duration,
    /// Base (unraised) capacity of the volume: bytes/s and operations/s.
    pub base_bw: f64,
    pub base_iops: Option<f64>,
    pub rules: ModifyRules,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModifyAction {
    /// Modify the volume to its peak spec.
    Raise,
    /// Modify it back to its base spec.
    Lower,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModifyDecision {
    pub at: Duration,
    pub action: ModifyAction,
    pub reason: String,
}

#[derive(Debug)]
pub struct ModifyPolicy {
    cfg: ModifyConfig,
    window: UtilWindow,
    raised: bool,
    /// When the volume was modified (the latest the rules look at).
    modified: Vec<Duration>,
    below_since: Option<Duration>,
    /// A wanted modification refused by the cooldown was logged already.
    waiting_logged: bool,
    /// Whether the cloud reports the latest modification still on its way
    /// (`None`: it cannot tell; the rules' `optimizing` is then the guess).
    in_flight: Option<bool>,
    /// After the cloud refused a modification: nothing before this.
    hold_until: Option<Duration>,
    /// The modification wanted now and waiting for the rules, if any.
    wanted: Option<ModifyAction>,
}

impl ModifyPolicy {
    pub fn new(cfg: ModifyConfig) -> Self {
        let window = UtilWindow::new(cfg.window);
        ModifyPolicy { cfg, window, raised: false, modified: Vec::new(), below_since: None, waiting_logged: false, in_flight: None, hold_until: None, wanted: None }
    }

    pub fn raised(&self) -> bool {
        self.raised
    }

    pub fn config(&self) -> &ModifyConfig {
        &self.cfg
    }

    /// The volume is at its peak spec already (a restart found it raised).
    pub fn set_raised(&mut self, raised: bool) {
        self.raised = raised;
    }

    /// What the cloud reports of the latest modification: `Some(true)` while
    /// modifying or optimizing. Under a rule that waits for completion
    /// (EBS's rolling one) this state decides, not the expected duration.
    pub fn observe_state(&mut self, in_flight: Option<bool>) {
        self.in_flight = in_flight;
    }

    /// The cloud refused the modification `tick` just returned: it did not
    /// happen; nothing is tried again before `now + retry`.
    pub fn refused(&mut self, now: Duration, retry: Duration) {
        self.modified.pop();
        self.raised = !self.raised;
        if self.in_flight.is_some() {
            // It did not start: the state is what it was before.
            self.in_flight = Some(false);
        }
        self.hold_until = Some(now + retry);
        self.waiting_logged = false;
    }

    /// The modification wanted and waiting for the rules, if any.
    pub fn wanted(&self) -> Option<ModifyAction> {
        self.wanted
    }

    /// Why a modification at `now` would wait, or `None` if the rules allow it.
    pub fn refusal(&self, now: Duration) -> Option<String> {
        if let Some(t) = self.hold_until.filter(|&t| now < t) {
            return Some(format!("the cloud refused the last modification; the next attempt in {:.0} s", (t - now).as_secs_f64()));
        }
        self.cfg.rules.refuses_with(&self.modified, now, self.in_flight)
    }

    fn allowed(&self, now: Duration) -> bool {
        self.refusal(now).is_none()
    }

    /// Feed cumulative application bytes and operations; a modification to
    /// apply now, if any. Once the cooldown refuses one, it is logged once
    /// (as a decision with no action taken: `None` is returned) and retried.
    pub fn tick(&mut self, now: Duration, bytes: u64, ops: u64) -> Option<ModifyDecision> {
        let util = self.window.push(now, bytes, ops)?.utilization(self.cfg.base_bw, self.cfg.base_iops);
        let pct = |u: f64| format!("{:.0} %", u * 100.0);
        let above = util > self.cfg.ut;
        if above {
            self.below_since = None;
        } else {
            self.below_since.get_or_insert(now);
        }
        let want = match (self.raised, above) {
            (false, true) => Some((ModifyAction::Raise, format!("utilization {} of the base spec > UT {}: raise to the peak", pct(util), pct(self.cfg.ut)))),
            (true, false) if now.saturating_sub(self.below_since.unwrap_or(now)) >= self.cfg.inactivity_delay => {
                Some((ModifyAction::Lower, format!("utilization below UT for ID {:?}: lower to the base spec", self.cfg.inactivity_delay)))
            }
            _ => None,
        };
        self.wanted = want.as_ref().map(|w| w.0);
        let (action, reason) = want?;
        if !self.allowed(now) {
            if !self.waiting_logged {
                self.waiting_logged = true;
                tracing::info!(?action, "modification wanted but the cooldown refuses it");
            }
            return None;
        }
        self.waiting_logged = false;
        self.wanted = None;
        self.raised = action == ModifyAction::Raise;
        // Until the cloud says otherwise, the new one is on its way.
        if self.in_flight.is_some() {
            self.in_flight = Some(true);
        }
        self.modified.push(now);
        if self.modified.len() > self.cfg.rules.memory() {
            self.modified.remove(0);
        }
        Some(ModifyDecision { at: now, action, reason })
    }

    /// When the next modification is allowed (searched in steps of a
    /// second up to two rule windows ahead; `None` if nothing was modified
    /// yet, or it waits for the cloud to report the last one completed).
    pub fn next_allowed(&self) -> Option<Duration> {
        let last = (*self.modified.last()?).max(self.hold_until.unwrap_or_default());
        let horizon = 2 * self.cfg.rules.cooldown.max(self.cfg.rules.window).max(self.cfg.rules.optimizing) + Duration::from_secs(1);
        let step = Duration::from_secs(1);
        let mut t = last;
        while t <= last + horizon {
            if self.allowed(t) {
                return Some(t);
            }
            t += step;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(cooldown_s: u64) -> ModifyPolicy {
        with_rules(ModifyRules { cooldown: Duration::from_secs(cooldown_s), ..ModifyRules::default() })
    }

    fn with_rules(rules: ModifyRules) -> ModifyPolicy {
        ModifyPolicy::new(ModifyConfig { window: Duration::from_secs(5), ut: 0.3, inactivity_delay: Duration::from_secs(30), base_bw: 125e6, base_iops: Some(3_000.0), rules })
    }

    /// Drive second by second at `bps` bytes/s and `iops`; the decisions.
    fn run(p: &mut ModifyPolicy, t: &mut u64, secs: u64, bps: u64, iops: u64, c: &mut (u64, u64)) -> Vec<(u64, ModifyAction)> {
        let mut out = vec![];
        for _ in 0..secs {
            *t += 1;
            c.0 += bps;
            c.1 += iops;
            if let Some(d) = p.tick(Duration::from_secs(*t), c.0, c.1) {
                assert!(!d.reason.is_empty());
                out.push((*t, d.action));
            }
        }
        out
    }

    #[test]
    fn raises_on_a_burst_and_lowers_only_after_the_cooldown() {
        let mut p = policy(6 * 3_600);
        let (mut t, mut c) = (0, (0, 0));
        assert!(run(&mut p, &mut t, 10, 1_000_000, 10, &mut c).is_empty());
        // An IOPS burst: 2,400 of 3,000 IOPS is 80 %, though only 10 MB/s.
        assert_eq!(run(&mut p, &mut t, 5, 10_000_000, 2_400, &mut c), vec![(12, ModifyAction::Raise)]);
        // Quiet for an hour: lowering is wanted after ID but refused for 6 h.
        assert!(run(&mut p, &mut t, 3_600, 0, 0, &mut c).is_empty());
        assert!(p.raised());
        assert_eq!(p.next_allowed(), Some(Duration::from_secs(12 + 6 * 3_600)));
        let d = run(&mut p, &mut t, 6 * 3_600, 0, 0, &mut c);
        assert_eq!(d, vec![(12 + 6 * 3_600, ModifyAction::Lower)]);
    }

    #[test]
    fn under_the_rolling_rule_it_follows_two_bursts_a_day_then_waits() {
        let mut p = with_rules(ModifyRules::ebs_rolling());
        let (mut t, mut c) = (0, (0, 0));
        let mut all = vec![];
        // Bursts of 100 s every hour: raise, lower (after ID and the 5 min of
        // optimizing), raise, lower; then the fifth waits out the rolling day.
        for _ in 0..3 {
            all.extend(run(&mut p, &mut t, 100, 100_000_000, 100, &mut c));
            all.extend(run(&mut p, &mut t, 3_500, 0, 0, &mut c));
        }
        let acts: Vec<ModifyAction> = all.iter().map(|d| d.1).collect();
        assert_eq!(acts, vec![ModifyAction::Raise, ModifyAction::Lower, ModifyAction::Raise, ModifyAction::Lower], "{all:?}");
        assert!(p.next_allowed().unwrap() >= Duration::from_secs(all[0].0 + 24 * 3_600), "{:?}", p.next_allowed());
        // Lowering waited for the raise to complete (5 min), not only for ID.
        assert!(all[1].0 - all[0].0 >= 300, "{all:?}");
    }

    #[test]
    fn the_clouds_state_decides_completion_and_a_refusal_holds_off() {
        let mut p = with_rules(ModifyRules::ebs_rolling());
        p.observe_state(Some(false));
        let (mut t, mut c) = (0, (0, 0));
        let d = run(&mut p, &mut t, 10, 100_000_000, 100, &mut c);
        assert_eq!(d.iter().map(|d| d.1).collect::<Vec<_>>(), vec![ModifyAction::Raise], "{d:?}");
        // The cloud still reports it optimizing after 10 min (5 min is the guess): no lowering.
        p.observe_state(Some(true));
        assert!(run(&mut p, &mut t, 600, 0, 0, &mut c).is_empty());
        assert_eq!(p.wanted(), Some(ModifyAction::Lower));
        assert!(p.refusal(Duration::from_secs(t)).unwrap().contains("not completed"));
        p.observe_state(Some(false));
        let d = run(&mut p, &mut t, 1, 0, 0, &mut c);
        assert_eq!(d, vec![(t, ModifyAction::Lower)]);
        // The cloud refuses the lowering: still raised, held off for the retry time.
        p.refused(Duration::from_secs(t), Duration::from_secs(60));
        assert!(p.raised());
        assert!(run(&mut p, &mut t, 59, 0, 0, &mut c).is_empty());
        assert!(p.next_allowed().unwrap() >= Duration::from_secs(t));
        assert_eq!(run(&mut p, &mut t, 1, 0, 0, &mut c), vec![(t, ModifyAction::Lower)]);
    }

    #[test]
    fn with_no_cooldown_it_follows_every_burst() {
        let mut p = policy(0);
        let (mut t, mut c) = (0, (0, 0));
        let mut all = vec![];
        for _ in 0..2 {
            all.extend(run(&mut p, &mut t, 10, 100_000_000, 100, &mut c));
            all.extend(run(&mut p, &mut t, 60, 0, 0, &mut c));
        }
        let acts: Vec<ModifyAction> = all.iter().map(|d| d.1).collect();
        assert_eq!(acts, vec![ModifyAction::Raise, ModifyAction::Lower, ModifyAction::Raise, ModifyAction::Lower]);
    }
}
