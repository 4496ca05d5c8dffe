//! What an elastic cache's backing volume really provides, and how long a
//! cache takes to arrive on this provider: the elastic policy's inputs on a
//! real cloud.
//!
//! - [`BackingCapacity`]: rates from the volume type's shape. gp3, io1/io2 and
//!   reserved volumes serve their provisioned IOPS and bytes/s; gp2 bursts on
//!   I/O credits and st1/sc1 on throughput credits, so their capacity is the
//!   burst rate while the balance would last the horizon at it, and falls to
//!   the baseline as the balance runs out.
//! - [`CreditTracker`]: the balance, from surge's own bucket model of the I/O
//!   it issued, corrected down by what the provider reports (CloudWatch's
//!   BurstBalance lags by minutes: never trusted to raise the model).
//! - [`AttachEstimate`]: a running estimate of create + attach times
//!   observed on this provider (mean plus twice the mean deviation, as TCP
//!   estimates round trips), for pre-provisioning lead.

use serde::Serialize;
use std::time::Duration;
use surge_block::model::{CreditBalance, Credits, Shape};

/// Rates a backing volume can serve now, and what limits them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    pub bytes_per_s: f64,
    pub ops_per_s: Option<f64>,
    /// `provisioned`, `burst` (credits last the horizon) or `credits` (the
    /// balance holds the rate below the burst rate, down to the baseline).
    pub limit: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackingCapacity {
    pub shape: Shape,
    /// The burst rate counts while the balance would last this long at it.
    pub horizon: Duration,
}

/// The rate a credit bucket sustains for `horizon` (baseline plus the balance
/// spread over it), capped at the burst rate.
fn credited(peak: f64, c: &Credits, balance: u64, horizon: Duration) -> (f64, bool) {
    let h = horizon.as_secs_f64().max(1e-3);
    let sustain = c.baseline as f64 + balance as f64 / h;
    if sustain >= peak {
        (peak, false)
    } else {
        (sustain.max(c.baseline as f64), true)
    }
}

impl BackingCapacity {
    pub fn new(shape: Shape, horizon: Duration) -> Self {
        BackingCapacity { shape, horizon }
    }

    /// Capacity with the given balances (`None` in a bucket: full).
    pub fn now(&self, balance: &CreditBalance) -> Capacity {
        let s = &self.shape;
        let mut limit = "provisioned";
        let mut rate = |peak: Option<u64>, c: &Option<Credits>, bal: Option<u64>| -> Option<f64> {
            let peak = peak? as f64;
            Some(match c {
                None => peak,
                Some(c) => {
                    let (r, low) = credited(peak, c, bal.unwrap_or(c.capacity), self.horizon);
                    if limit != "credits" {
                        limit = if low { "credits" } else { "burst" };
                    }
                    r
                }
            })
        };
        let bytes_per_s = rate(s.bps, &s.byte_credits, balance.bytes).unwrap_or(0.0);
        let ops_per_s = rate(s.iops, &s.op_credits, balance.ops);
        Capacity { bytes_per_s, ops_per_s, limit }
    }

    /// Operations one request of `len` bytes is charged (EBS SSDs count I/O
    /// up to 256 KiB as one operation, larger ones as several).
    pub fn charged_ops(&self, len: u64) -> u64 {
        match self.shape.op_size {
            Some(op) if op > 0 => len.div_ceil(op).max(1),
            _ => 1,
        }
    }
}

/// The backing's credit balances: a bucket model of the I/O surge issued,
/// lowered (never raised) by the provider's reports.
#[derive(Debug, Clone)]
pub struct CreditTracker {
    ops: Option<(Credits, f64)>,
    bytes: Option<(Credits, f64)>,
    last: Option<(Duration, u64, u64)>,
    /// What the last report said, and whether it lowered the model.
    pub reported: Option<CreditBalance>,
}

impl CreditTracker {
    /// Buckets of `shape`, at their initial balance.
    pub fn new(shape: &Shape) -> Self {
        let b = |c: &Option<Credits>| c.map(|c| (c, c.initial as f64));
        CreditTracker { ops: b(&shape.op_credits), bytes: b(&shape.byte_credits), last: None, reported: None }
    }

    /// Cumulative operations and bytes charged on the backing at `now`.
    pub fn observe_io(&mut self, now: Duration, ops: u64, bytes: u64) {
        if let Some((t, o, b)) = self.last {
            let dt = now.saturating_sub(t).as_secs_f64();
            let step = |x: &mut Option<(Credits, f64)>, used: u64| {
                if let Some((c, bal)) = x {
                    *bal = (*bal + c.baseline as f64 * dt - used as f64).clamp(0.0, c.capacity as f64);
                }
            };
            step(&mut self.ops, ops.saturating_sub(o));
            step(&mut self.bytes, bytes.saturating_sub(b));
        }
        self.last = Some((now, ops, bytes));
    }

    /// A balance the provider reported: lowers the model where it is below.
    pub fn observe_reported(&mut self, r: CreditBalance) {
        let low = |x: &mut Option<(Credits, f64)>, v: Option<u64>| {
            if let (Some((_, bal)), Some(v)) = (x, v) {
                *bal = bal.min(v as f64);
            }
        };
        low(&mut self.ops, r.ops);
        low(&mut self.bytes, r.bytes);
        self.reported = Some(r);
    }

    pub fn balance(&self) -> CreditBalance {
        let v = |x: &Option<(Credits, f64)>| x.map(|(_, b)| b as u64);
        let c = |x: &Option<(Credits, f64)>| x.map(|(c, _)| c.capacity);
        CreditBalance { ops: v(&self.ops), ops_capacity: c(&self.ops), bytes: v(&self.bytes), bytes_capacity: c(&self.bytes) }
    }
}

/// Running estimate of how long provisioning (create + attach) takes here.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AttachEstimate {
    /// Smoothed mean and mean deviation, seconds (`None` before a sample).
    mean_s: Option<f64>,
    dev_s: f64,
    prior: Duration,
    pub samples: u32,
    pub last_s: Option<f64>,
}

impl AttachEstimate {
    /// Until a provisioning is observed, the estimate is `prior`.
    pub fn new(prior: Duration) -> Self {
        AttachEstimate { mean_s: None, dev_s: 0.0, prior, samples: 0, last_s: None }
    }

    pub fn observe(&mut self, took: Duration) {
        let r = took.as_secs_f64();
        match self.mean_s {
            None => {
                self.mean_s = Some(r);
                self.dev_s = r / 2.0;
            }
            Some(m) => {
                self.dev_s = 0.75 * self.dev_s + 0.25 * (m - r).abs();
                self.mean_s = Some(0.875 * m + 0.125 * r);
            }
        }
        self.samples += 1;
        self.last_s = Some(r);
    }

    /// Mean plus twice the deviation: a pre-provisioned cache is rather early than late.
    pub fn estimate(&self) -> Duration {
        match self.mean_s {
            None => self.prior,
            Some(m) => Duration::from_secs_f64((m + 2.0 * self.dev_s).max(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::model::{VolumeModel, GIB, MIB};

    fn cap(spec: VolumeModel, size: u64) -> BackingCapacity {
        BackingCapacity::new(spec.shape(size).unwrap(), Duration::from_secs(300))
    }

    #[test]
    fn gp3_serves_what_is_provisioned() {
        let c = cap(VolumeModel::Gp3 { iops: Some(6000), throughput: Some(250 * MIB) }, 4 * GIB).now(&CreditBalance::default());
        assert_eq!((c.bytes_per_s, c.ops_per_s, c.limit), ((250 * MIB) as f64, Some(6000.0), "provisioned"));
        let c = cap(VolumeModel::Gp3 { iops: None, throughput: None }, 4 * GIB).now(&CreditBalance::default());
        assert_eq!((c.bytes_per_s, c.ops_per_s), ((125 * MIB) as f64, Some(3000.0)));
        // 1 MiB requests are 4 operations of 256 KiB.
        assert_eq!(cap(VolumeModel::Gp3 { iops: None, throughput: None }, GIB).charged_ops(MIB), 4);
    }

    #[test]
    fn gp2_bursts_while_credits_last_the_horizon_then_falls_to_baseline() {
        // 100 GiB gp2: 300 IOPS baseline, 3,000 burst, 5.4 M credits.
        let c = cap(VolumeModel::Gp2, 100 * GIB);
        let full = c.now(&CreditBalance::default());
        assert_eq!((full.ops_per_s, full.limit), (Some(3000.0), "burst"));
        // 300,000 credits over 300 s: 1,000 + 300 baseline.
        let low = c.now(&CreditBalance { ops: Some(300_000), ..Default::default() });
        assert_eq!((low.ops_per_s, low.limit), (Some(1300.0), "credits"));
        let empty = c.now(&CreditBalance { ops: Some(0), ..Default::default() });
        assert_eq!(empty.ops_per_s, Some(300.0));
    }

    #[test]
    fn st1_throughput_follows_its_credits() {
        // 500 GiB st1: baseline 40 MiB/s per TiB, burst 250 MiB/s per TiB.
        let c = cap(VolumeModel::St1, 500 * GIB);
        let s = c.shape.clone();
        let burst = s.bps.unwrap() as f64;
        let base = s.byte_credits.unwrap().baseline as f64;
        assert_eq!(c.now(&CreditBalance::default()).bytes_per_s, burst);
        assert_eq!(c.now(&CreditBalance { bytes: Some(0), ..Default::default() }).bytes_per_s, base);
        assert!(base < burst);
    }

    #[test]
    fn the_bucket_model_drains_refills_and_is_only_lowered_by_reports() {
        let shape = VolumeModel::Gp2.shape(100 * GIB).unwrap();
        let mut t = CreditTracker::new(&shape);
        let s = Duration::from_secs;
        t.observe_io(s(0), 0, 0);
        // 100 s at 3,000 IOPS: 300,000 used, 30,000 earned.
        t.observe_io(s(100), 300_000, 0);
        assert_eq!(t.balance().ops, Some(5_400_000 - 270_000));
        // A lagging report above the model changes nothing; one below lowers it.
        t.observe_reported(CreditBalance { ops: Some(5_400_000), ..Default::default() });
        assert_eq!(t.balance().ops, Some(5_130_000));
        t.observe_reported(CreditBalance { ops: Some(1_000_000), ..Default::default() });
        assert_eq!(t.balance().ops, Some(1_000_000));
        // Idle: refills at the baseline, capped.
        t.observe_io(s(200), 300_000, 0);
        assert_eq!(t.balance().ops, Some(1_030_000));
        t.observe_io(s(100_000), 300_000, 0);
        assert_eq!(t.balance().ops, Some(5_400_000));
        assert_eq!(CreditTracker::new(&VolumeModel::Gp3 { iops: None, throughput: None }.shape(GIB).unwrap()).balance(), CreditBalance::default());
    }

    #[test]
    fn attach_estimate_follows_observed_times_and_their_spread() {
        let mut e = AttachEstimate::new(Duration::from_secs(3));
        assert_eq!(e.estimate(), Duration::from_secs(3), "the prior until a sample");
        e.observe(Duration::from_secs(10));
        assert_eq!(e.estimate(), Duration::from_secs(20), "10 s + 2 x 5 s");
        for _ in 0..40 {
            e.observe(Duration::from_secs(10));
        }
        let steady = e.estimate().as_secs_f64();
        assert!((10.0..10.1).contains(&steady), "{steady}");
        // One slow attach (EBS sometimes takes a minute) widens the lead at once.
        e.observe(Duration::from_secs(60));
        assert!(e.estimate().as_secs_f64() > 40.0, "{:?}", e.estimate());
        assert_eq!((e.samples, e.last_s), (42, Some(60.0)));
    }
}
