//! A member's burst credits on a cloud whose own figure lags: CloudWatch's
//! `BurstBalance` arrives in 1 to 5 minute points, minutes late, while a
//! gp2 member can go from full to empty in half an hour. The estimate joins
//! two sources:
//!
//! - **the model**: surge's own bucket of the I/O it issued to the volume
//!   (every operation takes a credit, the bucket refills at the baseline,
//!   clamped to its capacity). Exact between points as long as surge is the
//!   volume's only user and counts operations as EBS does;
//! - **CloudWatch points**: the authority at the time they held, carried
//!   forward to now through the model's record of what surge issued since.
//!
//! Rule, on each fresh point: if the point (carried to now) is *lower* than
//! the model, take it (re-anchor down): running out unseen is what costs, a
//! member at zero serves at its baseline. If it is *higher*, keep the lower
//! model (pessimistic), unless two fresh points in a row say so: then the
//! model over-counts (EBS merges sequential small I/Os into one operation,
//! surge counts them one by one) and the point is taken. Within the
//! tolerance the two agree and the model stays. An early swap costs an extra
//! member for a rebuild (cents); a late one costs the burst.
//!
//! A member whose state is unknown (a restart: surge did not see its past
//! I/O) has no estimate until the first point; a fresh volume starts full.

use serde::Serialize;
use std::collections::VecDeque;
use std::time::Duration;

/// A credit bucket: capacity and refill (units per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub capacity: f64,
    pub refill_per_s: f64,
}

/// Which source the current estimate follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// No point yet, or between points: the model of surge's I/O.
    Model,
    /// A point was lower than the model (or higher, twice): taken, carried forward.
    Cloudwatch,
    /// Nothing known yet (a reused member before its first point).
    Unknown,
}

/// What `surge status` shows about a member's credits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Credits now; `None` while unknown.
    pub credits: Option<f64>,
    pub capacity: f64,
    pub source: Source,
    /// Why the last point was taken or not.
    pub reason: String,
    /// The last point: its value (percent) and its age now, seconds.
    pub point_percent: Option<f64>,
    pub point_age_s: Option<f64>,
}

/// Points within this fraction of the bucket agree with the model.
const TOLERANCE: f64 = 0.02;
/// How much I/O history is kept to carry points forward (points lag minutes).
const HISTORY: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone)]
pub struct CreditEstimator {
    b: Bucket,
    /// The model's balance at `at` (`None`: unknown).
    model: Option<f64>,
    at: Duration,
    /// Operations issued so far (cumulative), at `at`.
    issued: u64,
    /// (time, cumulative operations) at each advance, oldest first.
    history: VecDeque<(Duration, u64)>,
    last_point: Option<(Duration, f64)>,
    higher_in_a_row: u32,
    source: Source,
    reason: String,
}

impl CreditEstimator {
    /// `full`: a fresh volume (full bucket); else unknown until the first point.
    pub fn new(b: Bucket, now: Duration, issued: u64, full: bool) -> Self {
        let mut history = VecDeque::new();
        history.push_back((now, issued));
        CreditEstimator {
            b,
            model: full.then_some(b.capacity),
            at: now,
            issued,
            history,
            last_point: None,
            higher_in_a_row: 0,
            source: if full { Source::Model } else { Source::Unknown },
            reason: if full { "a new volume starts full".into() } else { "no CloudWatch point yet".into() },
        }
    }

    fn step(b: &Bucket, v: f64, dt: Duration, ops: u64) -> f64 {
        (v + b.refill_per_s * dt.as_secs_f64() - ops as f64).clamp(0.0, b.capacity)
    }

    /// The model at `now`, with `issued` operations issued so far in total.
    pub fn advance(&mut self, now: Duration, issued: u64) {
        let (dt, ops) = (now.saturating_sub(self.at), issued.saturating_sub(self.issued));
        self.model = self.model.map(|v| Self::step(&self.b, v, dt, ops));
        self.at = now.max(self.at);
        self.issued = issued.max(self.issued);
        self.history.push_back((self.at, self.issued));
        while self.history.len() > 2 && self.history[1].0 + HISTORY < now {
            self.history.pop_front();
        }
    }

    /// A point's value carried from `point_at` to now through the I/O issued
    /// since. Operations are counted from the last record at or before
    /// `point_at` (a few more than happened after it: pessimistic).
    fn carried(&self, point_at: Duration, value: f64) -> f64 {
        let start = self.history.iter().rposition(|(t, _)| *t <= point_at).unwrap_or(0);
        let (mut t, mut cum) = (point_at, self.history[start].1);
        let mut v = value;
        for &(ti, ci) in self.history.iter().skip(start + 1) {
            v = Self::step(&self.b, v, ti.saturating_sub(t), ci.saturating_sub(cum));
            (t, cum) = (ti, ci);
        }
        Self::step(&self.b, v, self.at.saturating_sub(t), self.issued.saturating_sub(cum))
    }

    /// A point (percent of the bucket) that held at `point_at`; call after
    /// [`Self::advance`] to now. Points not newer than the last are ignored.
    pub fn point(&mut self, point_at: Duration, percent: f64) {
        if self.last_point.is_some_and(|(t, _)| point_at <= t) {
            return;
        }
        self.last_point = Some((point_at, percent));
        let cw = self.carried(point_at, percent.clamp(0.0, 100.0) / 100.0 * self.b.capacity);
        let tol = TOLERANCE * self.b.capacity;
        let pct = |v: f64| v * 100.0 / self.b.capacity;
        match self.model {
            None => {
                (self.model, self.source) = (Some(cw), Source::Cloudwatch);
                self.reason = format!("first point: {percent:.1} %, {:.1} % now", pct(cw));
            }
            Some(m) if cw < m - tol => {
                (self.model, self.source, self.higher_in_a_row) = (Some(cw), Source::Cloudwatch, 0);
                self.reason = format!("point lower than the model ({:.1} % vs {:.1} %): taken", pct(cw), pct(m));
            }
            Some(m) if cw > m + tol => {
                self.higher_in_a_row += 1;
                if self.higher_in_a_row >= 2 {
                    (self.model, self.source, self.higher_in_a_row) = (Some(cw), Source::Cloudwatch, 0);
                    self.reason = format!("two points in a row above the model ({:.1} % vs {:.1} %): the model over-counts, point taken", pct(cw), pct(m));
                } else {
                    self.source = Source::Model;
                    self.reason = format!("point above the model ({:.1} % vs {:.1} %): kept the lower model", pct(cw), pct(m));
                }
            }
            Some(m) => {
                (self.source, self.higher_in_a_row) = (Source::Model, 0);
                self.reason = format!("point agrees with the model ({:.1} % vs {:.1} %)", pct(cw), pct(m));
            }
        }
    }

    pub fn estimate(&self) -> Estimate {
        Estimate {
            credits: self.model,
            capacity: self.b.capacity,
            source: self.source,
            reason: self.reason.clone(),
            point_percent: self.last_point.map(|(_, p)| p),
            point_age_s: self.last_point.map(|(t, _)| self.at.saturating_sub(t).as_secs_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gp2 of 10 GiB: 5.4 M credits, 100/s baseline.
    const B: Bucket = Bucket { capacity: 5_400_000.0, refill_per_s: 100.0 };

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    /// A virtual run: `iops` operations/s issued from t=0, advanced every 5 s.
    fn run(e: &mut CreditEstimator, from: u64, to: u64, iops: u64, issued: &mut u64) {
        let mut t = from;
        while t < to {
            t += 5;
            *issued += 5 * iops;
            e.advance(s(t), *issued);
        }
    }

    #[test]
    fn between_points_the_model_follows_the_io_surge_issued() {
        let mut e = CreditEstimator::new(B, s(0), 0, true);
        let mut n = 0;
        run(&mut e, 0, 600, 3_000, &mut n);
        let want = 5_400_000.0 - 600.0 * 2_900.0;
        assert!((e.estimate().credits.unwrap() - want).abs() < 1.0, "{:?}", e.estimate());
        assert_eq!(e.estimate().source, Source::Model);
        // Idle: it refills, up to the capacity.
        run(&mut e, 600, 600 + 86_400, 0, &mut n);
        assert_eq!(e.estimate().credits.unwrap(), B.capacity);
    }

    #[test]
    fn a_lagging_point_lower_than_the_model_is_carried_forward_and_taken() {
        let mut e = CreditEstimator::new(B, s(0), 0, true);
        let mut n = 0;
        run(&mut e, 0, 900, 3_000, &mut n);
        let model = e.estimate().credits.unwrap();
        // CloudWatch says the volume held 40 % at t=300 (someone else, or EBS
        // counting differently); it arrives at t=900. Carried forward over
        // 600 s at a net 2,900/s drain.
        e.point(s(300), 40.0);
        let want = 0.4 * B.capacity - 600.0 * 2_900.0;
        let got = e.estimate();
        assert!(want < model && (got.credits.unwrap() - want).abs() < 5.0 * 3_000.0 + 1.0, "{got:?} vs {want}");
        assert_eq!(got.source, Source::Cloudwatch);
        assert_eq!(got.point_age_s, Some(600.0));
        // The same point again changes nothing; an older one is ignored.
        e.point(s(300), 90.0);
        e.point(s(200), 90.0);
        assert_eq!(e.estimate().credits, got.credits);
    }

    #[test]
    fn a_higher_point_is_taken_only_when_the_next_one_says_so_too() {
        let mut e = CreditEstimator::new(B, s(0), 0, true);
        let mut n = 0;
        run(&mut e, 0, 600, 3_000, &mut n); // model: 3.66 M (67.8 %)
        let model = e.estimate().credits.unwrap();
        e.point(s(600), 90.0);
        assert_eq!((e.estimate().credits.unwrap(), e.estimate().source), (model, Source::Model), "one higher point: keep the lower model");
        run(&mut e, 600, 900, 3_000, &mut n);
        e.point(s(900), 85.0);
        let got = e.estimate();
        assert_eq!(got.source, Source::Cloudwatch, "{got:?}");
        assert!((got.credits.unwrap() - 0.85 * B.capacity).abs() < 1.0);
        // A point that agrees resets nothing and keeps the model.
        run(&mut e, 900, 1200, 100, &mut n);
        e.point(s(1200), 85.0);
        assert_eq!(e.estimate().source, Source::Model);
    }

    #[test]
    fn a_reused_member_is_unknown_until_its_first_point() {
        let mut e = CreditEstimator::new(B, s(0), 0, false);
        let mut n = 0;
        run(&mut e, 0, 60, 1_000, &mut n);
        assert_eq!((e.estimate().credits, e.estimate().source), (None, Source::Unknown));
        e.point(s(30), 50.0);
        let got = e.estimate();
        // 30 s at a net 900/s since the point (from the record at or before it: 30 s).
        assert!((got.credits.unwrap() - (0.5 * B.capacity - 30.0 * 900.0)).abs() < 1.0, "{got:?}");
        assert_eq!(got.source, Source::Cloudwatch);
    }

    #[test]
    fn the_bucket_never_goes_below_zero_or_above_its_capacity() {
        let mut e = CreditEstimator::new(B, s(0), 0, true);
        let mut n = 0;
        run(&mut e, 0, 3_600, 16_000, &mut n);
        assert_eq!(e.estimate().credits, Some(0.0));
        e.point(s(3_600), 150.0);
        e.point(s(3_601), 150.0);
        assert!(e.estimate().credits.unwrap() <= B.capacity);
    }
}
