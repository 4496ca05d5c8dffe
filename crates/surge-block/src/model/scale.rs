//! Reduced-scale emulation: a volume model run with every rate multiplied by
//! `rate` and every duration by `time`, so amounts (bytes, operations, burst
//! credits) shrink by `rate x time`. Request sizes are kept, so each request
//! is charged as on the real volume; a run at scale keeps the proportions of
//! the full-scale one (a 100 s burst at 1,000 MiB/s becomes a `100 time` s
//! burst at `1,000 rate` MiB/s, moving `rate x time` of the bytes).

use super::sched::{Credits, Shape};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scale {
    pub rate: f64,
    pub time: f64,
}

impl Default for Scale {
    fn default() -> Self {
        Scale::FULL
    }
}

impl Scale {
    pub const FULL: Scale = Scale { rate: 1.0, time: 1.0 };

    pub fn is_full(&self) -> bool {
        *self == Scale::FULL
    }

    /// An amount (bytes, operations) at this scale, rounded up.
    pub fn amount(&self, units: u64) -> u64 {
        if self.is_full() {
            units
        } else {
            (units as f64 * self.rate * self.time).ceil() as u64
        }
    }

    /// A volume's size at this scale: whole MiB, at least one.
    pub fn size(&self, bytes: u64) -> u64 {
        const MIB: u64 = 1 << 20;
        if self.is_full() {
            bytes
        } else {
            self.amount(bytes).div_ceil(MIB).max(1) * MIB
        }
    }

    fn rate_of(&self, r: u64) -> u64 {
        ((r as f64 * self.rate).round() as u64).max(1)
    }

    /// The shape a volume serves at this scale.
    pub fn shape(&self, s: Shape) -> Shape {
        if self.is_full() {
            return s;
        }
        let credits = |c: Credits| Credits { capacity: self.amount(c.capacity), baseline: self.rate_of(c.baseline), initial: self.amount(c.initial) };
        Shape {
            iops: s.iops.map(|r| self.rate_of(r)),
            bps: s.bps.map(|r| self.rate_of(r)),
            op_credits: s.op_credits.map(credits),
            byte_credits: s.byte_credits.map(credits),
            latency: s.latency.mul_f64(self.time),
            ..s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Scheduler, VolumeModel, GIB, KIB, MIB};
    use std::time::Duration;

    #[test]
    fn a_scaled_gp2_bursts_for_the_scaled_time() {
        // Full scale: a 100 GiB gp2 bursts at 3,000 IOPS for 2,000 s (5.4 M
        // credits at 3,000 - 300 per second). At rate 1/10 and time 1/20 it
        // bursts at 300 IOPS for 100 s.
        let s = Scale { rate: 0.1, time: 0.05 };
        let shape = s.shape(VolumeModel::Gp2.shape(100 * GIB).unwrap());
        assert_eq!(shape.iops, Some(300));
        assert_eq!(shape.op_credits.unwrap().baseline, 30);
        assert_eq!(shape.op_credits.unwrap().capacity, 27_000);
        let mut sched = Scheduler::new(shape, Duration::ZERO);
        let mut done = Duration::ZERO;
        for _ in 0..30_000 {
            done = sched.reserve(Duration::ZERO, crate::model::IoKind::Read, 4 * KIB);
        }
        assert_eq!(done, Duration::from_secs(100), "30,000 I/Os at 300/s while 27,000 credits last (270 per second net)");
        assert_eq!(s.size(100 * GIB), 512 * MIB);
    }

    #[test]
    fn full_scale_changes_nothing() {
        let shape = VolumeModel::St1.shape(GIB * 500).unwrap();
        assert_eq!(Scale::FULL.shape(shape.clone()), shape);
        assert_eq!(Scale::FULL.size(3 * MIB + 1), 3 * MIB + 1);
    }
}
