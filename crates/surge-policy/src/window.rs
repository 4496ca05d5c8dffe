//! A sliding utilization window over cumulative counters, shared by the
//! elastic-cache policy and the modify-volume policy.

use std::collections::VecDeque;
use std::time::Duration;

/// Rates over the last `span`, from cumulative (bytes, operations) counters
/// fed at arbitrary times.
#[derive(Debug, Clone)]
pub struct UtilWindow {
    span: Duration,
    /// (time, cumulative bytes, cumulative operations) covering the last span.
    samples: VecDeque<(Duration, u64, u64)>,
}

/// Throughput over a full window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub bytes_per_s: f64,
    pub ops_per_s: f64,
}

impl Rates {
    /// The larger share of a volume's capacity these rates use.
    pub fn utilization(&self, bw: f64, iops: Option<f64>) -> f64 {
        let by_bytes = if bw > 0.0 { self.bytes_per_s / bw } else { 0.0 };
        let by_ops = iops.filter(|&i| i > 0.0).map_or(0.0, |i| self.ops_per_s / i);
        by_bytes.max(by_ops)
    }
}

impl UtilWindow {
    pub fn new(span: Duration) -> Self {
        UtilWindow { span, samples: VecDeque::new() }
    }

    /// Record the counters at `now`; the rates over the window ending now, or
    /// `None` until a full window of samples exists.
    pub fn push(&mut self, now: Duration, bytes: u64, ops: u64) -> Option<Rates> {
        self.samples.push_back((now, bytes, ops));
        while self.samples.len() > 2 && now.saturating_sub(self.samples[1].0) >= self.span {
            self.samples.pop_front();
        }
        let (t0, b0, o0) = self.samples[0];
        let span = now.saturating_sub(t0);
        (span >= self.span && !span.is_zero()).then(|| {
            let s = span.as_secs_f64();
            Rates { bytes_per_s: bytes.saturating_sub(b0) as f64 / s, ops_per_s: ops.saturating_sub(o0) as f64 / s }
        })
    }

    /// Cumulative bytes at the start of the window.
    pub fn first_bytes(&self) -> u64 {
        self.samples.front().map_or(0, |s| s.1)
    }

    /// Cumulative operations at the start of the window.
    pub fn first_ops(&self) -> u64 {
        self.samples.front().map_or(0, |s| s.2)
    }

    pub fn span(&self) -> Duration {
        self.span
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_over_a_full_window_only() {
        let mut w = UtilWindow::new(Duration::from_secs(5));
        assert_eq!(w.push(Duration::ZERO, 0, 0), None);
        assert_eq!(w.push(Duration::from_secs(4), 400, 4), None, "4 s < 5 s");
        let r = w.push(Duration::from_secs(5), 1_000, 50).unwrap();
        assert_eq!((r.bytes_per_s, r.ops_per_s), (200.0, 10.0));
        // Slides: at 10 s the window starts at the 5 s sample.
        let r = w.push(Duration::from_secs(10), 1_000, 50).unwrap();
        assert_eq!((r.bytes_per_s, r.ops_per_s), (0.0, 0.0));
        assert_eq!(w.first_bytes(), 1_000);
    }

    #[test]
    fn utilization_is_the_busier_of_bytes_and_operations() {
        let r = Rates { bytes_per_s: 30e6, ops_per_s: 2_400.0 };
        assert!((r.utilization(125e6, None) - 0.24).abs() < 1e-12);
        assert!((r.utilization(125e6, Some(3_000.0)) - 0.8).abs() < 1e-12);
    }
}
