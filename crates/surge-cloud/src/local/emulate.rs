//! How the local cloud emulates EBS's elastic-volume modification rules.
//!
//! - Which modifications are allowed, two rules: the classic one, a
//!   `cooldown` after each modification (EBS: "you must wait at least six
//!   hours", [`ModifyRules::ebs`]), and AWS's newer one, at most `per_window`
//!   modifications in any rolling `window`, each only once the previous one
//!   completed (four per rolling 24 hours, [`ModifyRules::ebs_rolling`]).
//! - Optimizing: new performance takes effect gradually. EBS: "while the volume
//!   is in the optimizing state, your volume performance is in between the
//!   source and target configuration specifications", "from a few minutes to a
//!   few hours" (a fully used 1 TiB volume about 6 h). We model a linear ramp of
//!   IOPS and throughput from the source to the target over `optimizing`, in 20
//!   steps, which is never below the source when raising and never below the
//!   target when lowering, as EBS promises. Billing follows the new spec from
//!   the request (an assumption: AWS does not say when billing switches).
//!
//! Both default to zero (instant, unlimited changes, as before); experiments
//! set EBS's figures, scaled with the rest of time.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use surge_block::model::{ModelDev, Shape};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModifyRules {
    /// Least time between two modifications of one volume (EBS classic: 6 h).
    pub cooldown: Duration,
    /// How long new performance takes to arrive, linearly (EBS: minutes to hours).
    pub optimizing: Duration,
    /// At most `per_window` modifications in any rolling `window` (0: no such limit).
    #[serde(default)]
    pub window: Duration,
    #[serde(default)]
    pub per_window: u32,
    /// A modification may start only once the previous one completed.
    #[serde(default)]
    pub after_complete: bool,
}

impl ModifyRules {
    /// EBS's classic rule (one modification per 6 hours) with the short end
    /// of "a few minutes to a few hours" for the new performance to arrive.
    pub fn ebs() -> Self {
        ModifyRules { cooldown: Duration::from_secs(6 * 3_600), optimizing: Duration::from_secs(300), ..ModifyRules::default() }
    }

    /// EBS's newer rule: up to four modifications in a rolling 24 hours, as
    /// long as each completes before the next starts.
    pub fn ebs_rolling() -> Self {
        ModifyRules { optimizing: Duration::from_secs(300), window: Duration::from_secs(24 * 3_600), per_window: 4, after_complete: true, ..ModifyRules::default() }
    }

    /// Durations multiplied by `f` (an experiment at time scale f).
    pub fn scaled(self, f: f64) -> Self {
        ModifyRules { cooldown: self.cooldown.mul_f64(f), optimizing: self.optimizing.mul_f64(f), window: self.window.mul_f64(f), ..self }
    }

    /// Why a modification at `now` is refused after the ones made at `past`
    /// (any order, same clock), or `None` if it is allowed.
    pub fn refuses(&self, past: &[Duration], now: Duration) -> Option<String> {
        self.refuses_with(past, now, None)
    }

    /// [`ModifyRules::refuses`] where the cloud reports whether the latest
    /// modification is still on its way (`Some(true)`: modifying or
    /// optimizing, `Some(false)`: completed or failed): "once the previous
    /// one completed" is then decided by that state, not by `optimizing`
    /// (which stays the guess when the cloud cannot tell: `None`).
    pub fn refuses_with(&self, past: &[Duration], now: Duration, in_flight: Option<bool>) -> Option<String> {
        let last = past.iter().copied().max();
        if self.after_complete && in_flight == Some(true) {
            return Some("the previous modification has not completed yet (the cloud reports it modifying or optimizing); the next may start once it completed".into());
        }
        let last = last?;
        let ago = now.saturating_sub(last);
        if ago < self.cooldown {
            return Some(format!("modified {:.1} s ago; a volume may be modified once per {:?} (EBS's cooldown)", ago.as_secs_f64(), self.cooldown));
        }
        if self.after_complete && in_flight.is_none() && ago < self.optimizing {
            return Some(format!("the modification {:.1} s ago is still optimizing (for {:?}); the next may start once it completed", ago.as_secs_f64(), self.optimizing));
        }
        if self.per_window > 0 {
            let recent = past.iter().filter(|&&t| now.saturating_sub(t) < self.window).count();
            if recent >= self.per_window as usize {
                return Some(format!("{recent} modifications in the last {:?}; at most {} per rolling {:?}", self.window, self.per_window, self.window));
            }
        }
        None
    }

    /// `none`, `ebs-6h` (one modification per 6 hours) or `ebs-24h` (four per
    /// rolling 24 hours, each after the previous one completed).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(ModifyRules::default()),
            "ebs-6h" => Ok(ModifyRules::ebs()),
            "ebs-24h" => Ok(ModifyRules::ebs_rolling()),
            other => Err(format!("{other:?}: modification rules are none, ebs-6h or ebs-24h")),
        }
    }

    /// The name [`ModifyRules::parse`] takes, if these are one of its rules (any scale).
    pub fn name(&self) -> String {
        let same = |r: ModifyRules| r.per_window == self.per_window && r.after_complete == self.after_complete && r.cooldown.is_zero() == self.cooldown.is_zero();
        if *self == ModifyRules::default() {
            "none".into()
        } else if same(ModifyRules::ebs()) {
            "ebs-6h".into()
        } else if same(ModifyRules::ebs_rolling()) {
            "ebs-24h".into()
        } else {
            format!("{self:?}")
        }
    }

    /// How many past modifications matter to [`ModifyRules::refuses`].
    pub fn memory(&self) -> usize {
        (self.per_window as usize).max(1)
    }

    /// The earliest time from `now` at which [`ModifyRules::refuses`] allows
    /// a modification after `past` (the cloud not asked whether the last one
    /// completed): what a simulation may skip to instead of asking each tick.
    pub fn next_allowed(&self, past: &[Duration], now: Duration) -> Duration {
        let Some(last) = past.iter().copied().max() else { return now };
        let mut t = now.max(last + self.cooldown);
        if self.after_complete {
            t = t.max(last + self.optimizing);
        }
        if self.per_window > 0 {
            let mut recent: Vec<Duration> = past.iter().copied().filter(|&p| t.saturating_sub(p) < self.window).collect();
            recent.sort();
            // Wait until enough of them have left the window.
            if recent.len() >= self.per_window as usize {
                t = t.max(recent[recent.len() - self.per_window as usize] + self.window);
            }
        }
        t
    }
}

const STEPS: u32 = 20;

/// A shape change on its way, applied step by step as I/O arrives.
#[derive(Debug, Clone)]
struct Ramp {
    from: Shape,
    to: Shape,
    start: Duration,
    length: Duration,
    applied: u32,
}

fn lerp(a: Option<u64>, b: Option<u64>, w: f64) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some((a as f64 + (b as f64 - a as f64) * w).round() as u64),
        _ => b,
    }
}

impl Ramp {
    fn shape_at(&self, step: u32) -> Shape {
        let w = step as f64 / STEPS as f64;
        Shape { iops: lerp(self.from.iops, self.to.iops, w), bps: lerp(self.from.bps, self.to.bps, w), ..self.to.clone() }
    }
}

/// The modification in progress on one volume, if any.
#[derive(Debug, Default)]
pub struct Optimizing {
    active: AtomicBool,
    ramp: Mutex<Option<Ramp>>,
}

impl Optimizing {
    /// Start moving `model` to `to` over `length` from `now` (at once if zero).
    pub fn start(&self, model: &ModelDev, to: Shape, now: Duration, length: Duration) {
        let mut r = self.ramp.lock();
        if length.is_zero() {
            *r = None;
            self.active.store(false, Ordering::Release);
            model.set_shape(to);
            return;
        }
        let ramp = Ramp { from: model.shape(), to, start: now, length, applied: 0 };
        *r = Some(ramp);
        self.active.store(true, Ordering::Release);
    }

    /// Apply the steps due by `now` (called on each I/O; cheap when idle).
    pub fn advance(&self, model: &ModelDev, now: Duration) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.ramp.lock();
        let Some(r) = g.as_mut() else { return };
        let done = now.saturating_sub(r.start).as_secs_f64() / r.length.as_secs_f64();
        let step = ((done * STEPS as f64).floor() as u32).min(STEPS);
        if step > r.applied {
            r.applied = step;
            model.set_shape(r.shape_at(step));
            if step == STEPS {
                *g = None;
                self.active.store(false, Ordering::Release);
            }
        }
    }

    #[cfg(test)]
    pub fn in_progress(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn h(x: u64) -> Duration {
        Duration::from_secs(x * 3_600)
    }

    #[test]
    fn next_allowed_is_the_first_time_the_rule_allows() {
        let r = ModifyRules::ebs_rolling();
        assert_eq!(r.next_allowed(&[], h(1)), h(1));
        // Optimizing: 5 minutes after the last.
        assert_eq!(r.next_allowed(&[h(1)], h(1)), h(1) + Duration::from_secs(300));
        // Four in the window: the oldest must leave it.
        let past = [h(1), h(2), h(3), h(4)];
        let t = r.next_allowed(&past, h(5));
        assert_eq!(t, h(25));
        assert!(r.refuses(&past, t).is_none() && r.refuses(&past, t - Duration::from_secs(1)).is_some());
        assert_eq!(ModifyRules::ebs().next_allowed(&[h(1)], h(2)), h(7));
    }

    #[test]
    fn the_classic_rule_allows_one_modification_per_six_hours() {
        let r = ModifyRules::ebs();
        assert!(r.refuses(&[], h(0)).is_none());
        assert!(r.refuses(&[h(1)], h(6)).unwrap().contains("once per"));
        assert!(r.refuses(&[h(1)], h(7)).is_none());
    }

    #[test]
    fn the_rolling_rule_allows_four_a_day_each_after_the_previous_completed() {
        let r = ModifyRules::ebs_rolling();
        let m = |x: u64| Duration::from_secs(x * 60);
        // Five minutes of optimizing: not before it completed.
        assert!(r.refuses(&[m(0)], m(4)).unwrap().contains("optimizing"));
        assert!(r.refuses(&[m(0)], m(5)).is_none());
        // Four within 24 h, then the fifth waits until the first is a day old.
        let four = [m(0), m(10), m(20), m(30)];
        assert!(r.refuses(&four, m(40)).unwrap().contains("at most 4"));
        assert!(r.refuses(&four, h(24) - m(1)).is_some());
        assert!(r.refuses(&four, h(24)).is_none());
        // Scaled: the same at 1/100 of the time.
        let s = r.scaled(0.01);
        assert!(s.refuses(&[Duration::ZERO], Duration::from_secs(3)).is_none());
        assert_eq!(s.window, Duration::from_secs(864));
    }

    #[test]
    fn the_clouds_modification_state_decides_completion_when_it_reports_one() {
        let r = ModifyRules::ebs_rolling();
        let m = |x: u64| Duration::from_secs(x * 60);
        // Still optimizing after an hour (a large volume): refused, though 5 min passed.
        assert!(r.refuses_with(&[m(0)], m(60), Some(true)).unwrap().contains("not completed"));
        // Completed after one minute: allowed, though the guess says 5 min.
        assert!(r.refuses_with(&[m(0)], m(1), Some(false)).is_none());
        assert!(r.refuses_with(&[m(0)], m(1), None).is_some());
        // Even with no history of its own (a restarted daemon), a modification in flight refuses.
        assert!(r.refuses_with(&[], m(1), Some(true)).is_some());
        // The classic rule has no completion condition: the cooldown only.
        assert!(ModifyRules::ebs().refuses_with(&[], m(1), Some(true)).is_none());
        assert_eq!(ModifyRules::parse("ebs-24h").unwrap().name(), "ebs-24h");
        assert_eq!(ModifyRules::ebs().scaled(0.01).name(), "ebs-6h");
        assert!(ModifyRules::parse("weekly").is_err());
    }
    use surge_block::model::{VolumeModel, GIB};
    use surge_block::{BlockDev, Clock, MemoryDev, VirtualClock};

    #[test]
    fn performance_ramps_linearly_to_the_target() {
        let clock = Arc::new(VirtualClock::new());
        let from = VolumeModel::Gp3 { iops: None, throughput: None }.shape(GIB).unwrap();
        let to = VolumeModel::Io2 { iops: 32_000 }.shape(32 * GIB).unwrap();
        let m = ModelDev::new(Arc::new(MemoryDev::new(GIB)), clock.clone(), from);
        let o = Optimizing::default();
        o.start(&m, to.clone(), clock.now(), Duration::from_secs(100));
        assert!(o.in_progress());
        o.advance(&m, clock.now());
        assert_eq!(m.shape().iops, Some(3_000), "nothing before the first step");
        clock.advance(Duration::from_secs(50));
        o.advance(&m, clock.now());
        assert_eq!(m.shape().iops, Some(17_500), "halfway");
        clock.advance(Duration::from_secs(50));
        o.advance(&m, clock.now());
        assert_eq!(m.shape(), to);
        assert!(!o.in_progress());
        // No ramp: at once.
        o.start(&m, VolumeModel::Gp2.shape(GIB).unwrap(), clock.now(), Duration::ZERO);
        assert_eq!(m.shape().iops, Some(3_000));
        let _ = m.size();
    }
}
