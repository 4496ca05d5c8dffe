//! Per-tenant statistics of recent I/O: operations, bytes and a latency histogram
//! over the current and the previous epoch, so rates and percentiles follow the
//! load instead of averaging over the whole life of the daemon.

use serde::Serialize;
use std::time::Duration;

/// Sub-buckets per power of two: quantiles are within 1/8 (12.5 %) of the truth.
const SUB: u32 = 8;
const BUCKETS: usize = (64 * SUB) as usize;

/// A log-linear histogram of latencies in microseconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; BUCKETS], total: 0 }
    }
}

fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros(); // us >= 8, so exp >= 3
    let sub = (us >> (exp - 3)) as u32 & (SUB - 1);
    ((exp - 2) * SUB + sub) as usize
}

/// The largest value that falls into bucket `b`.
fn bucket_high(b: usize) -> u64 {
    let b = b as u32;
    if b < SUB {
        return b as u64;
    }
    let exp = b / SUB + 2;
    let sub = (b % SUB) as u64;
    ((SUB as u64 + sub + 1) << (exp - 3)) - 1
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let us = latency.as_micros().min(u64::MAX as u128) as u64;
        self.counts[bucket(us)] += 1;
        self.total += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0..=1) in µs, as its bucket's upper bound; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_high(b);
            }
        }
        bucket_high(BUCKETS - 1)
    }
}

#[derive(Debug, Clone, Default)]
struct Epoch {
    start: Duration,
    ops: u64,
    bytes: u64,
    latency: Histogram,
}

/// Two epochs of `period`: the one filling now and the last complete one.
#[derive(Debug, Clone)]
pub struct Recent {
    period: Duration,
    cur: Epoch,
    prev: Option<Epoch>,
}

/// A snapshot of recent I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RecentStats {
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl Recent {
    pub fn new(period: Duration, now: Duration) -> Self {
        Recent { period, cur: Epoch { start: now, ..Default::default() }, prev: None }
    }

    fn roll(&mut self, now: Duration) {
        if now < self.cur.start + self.period {
            return;
        }
        let fresh = Epoch { start: now, ..Default::default() };
        let done = std::mem::replace(&mut self.cur, fresh);
        // An epoch that ended long ago says nothing about now.
        self.prev = (now < done.start + 2 * self.period).then_some(done);
    }

    pub fn record(&mut self, now: Duration, bytes: u64, latency: Duration) {
        self.roll(now);
        self.cur.ops += 1;
        self.cur.bytes += bytes;
        self.cur.latency.record(latency);
    }

    pub fn snapshot(&mut self, now: Duration) -> RecentStats {
        self.roll(now);
        let mut lat = self.cur.latency.clone();
        let (mut ops, mut bytes, mut since) = (self.cur.ops, self.cur.bytes, self.cur.start);
        if let Some(p) = &self.prev {
            lat.merge(&p.latency);
            ops += p.ops;
            bytes += p.bytes;
            since = p.start;
        }
        let secs = now.saturating_sub(since).as_secs_f64().max(1e-3);
        RecentStats {
            iops: ops as f64 / secs,
            bytes_per_sec: bytes as f64 / secs,
            p50_us: lat.quantile_us(0.5),
            p99_us: lat.quantile_us(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_bound_their_values() {
        let mut expect = 0;
        for us in 0..100_000u64 {
            let b = bucket(us);
            assert!(b == expect || b == expect + 1, "bucket jumped at {us}");
            expect = b;
            assert!(bucket_high(b) >= us, "{us} above its bucket's bound");
            assert!(bucket_high(b) as f64 <= us as f64 * 1.125 + 1.0, "bucket of {us} too wide");
        }
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let mut h = Histogram::default();
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile_us(0.5);
        let p99 = h.quantile_us(0.99);
        assert!((50_000..=56_250).contains(&p50), "p50 {p50}");
        assert!((99_000..=111_375).contains(&p99), "p99 {p99}");
        assert_eq!(Histogram::default().quantile_us(0.5), 0);
    }

    #[test]
    fn rates_cover_the_current_and_previous_epoch_only() {
        let s = Duration::from_secs;
        let mut r = Recent::new(s(5), s(0));
        for i in 0..50 {
            r.record(s(0) + Duration::from_millis(100 * i), 4096, Duration::from_millis(1));
        }
        let snap = r.snapshot(s(5));
        assert_eq!(snap.iops, 10.0);
        assert_eq!(snap.bytes_per_sec, 40960.0);
        // Long after, the old epochs are forgotten.
        assert_eq!(r.snapshot(s(60)).iops, 0.0);
    }
}
