//! Adaptive depth: the SFQ(D) trade-off between device utilisation (large D) and
//! isolation (small D), decided from measurements instead of a fixed D.
//!
//! Each window of completions is judged on two signals:
//! * fairness: a tenant that had requests in the system for the whole window
//!   but received less than its weighted share (beyond a tolerance and one
//!   request of rounding) means requests already at the device are deciding the
//!   split, not the tags. D is halved and the depth that was unfair becomes a
//!   ceiling, probed again (+1) only after a run of fair windows.
//! * latency: mean device latency above the target lowers D by a quarter;
//!   below it, while requests were held back by D, D grows by one.

use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveConfig {
    pub min_depth: usize,
    pub max_depth: usize,
    /// Mean device latency (dispatch to completion) to stay under, in µs.
    pub latency_target_us: u64,
    /// Completions per evaluation; at least 16 x D are used so that SFQ(D)'s
    /// own rounding does not look unfair.
    pub window: u32,
    /// Shortfall of a tenant's weighted share tolerated, as a fraction.
    pub fairness_tolerance: f64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig { min_depth: 1, max_depth: 64, latency_target_us: 20_000, window: 64, fairness_tolerance: 0.05 }
    }
}

/// What the controller knows of one tenant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Share {
    pub weight: u32,
    /// False for tenants with a limit or reservation: their share is not the weight's.
    pub judged: bool,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TenantWindow {
    pub cost: u64,
    /// Had nothing queued or in flight at some point of the window.
    pub went_idle: bool,
}

/// Measurements since the last evaluation.
#[derive(Debug, Default)]
pub(crate) struct Window {
    pub completions: u32,
    pub latency_sum: Duration,
    pub max_cost: u64,
    /// Some request waited because D requests were outstanding.
    pub depth_bound: bool,
    pub tenants: Vec<TenantWindow>,
}

impl Window {
    pub fn record(&mut self, t: usize, cost: u64, latency: Duration) {
        self.completions += 1;
        self.latency_sum += latency;
        self.max_cost = self.max_cost.max(cost);
        self.tenants[t].cost += cost;
    }

    pub fn reset(&mut self, busy: &[bool]) {
        self.completions = 0;
        self.latency_sum = Duration::ZERO;
        self.max_cost = 0;
        self.depth_bound = false;
        for (w, &b) in self.tenants.iter_mut().zip(busy) {
            *w = TenantWindow { cost: 0, went_idle: !b };
        }
    }

    fn mean_latency(&self) -> Duration {
        self.latency_sum / self.completions.max(1)
    }
}

#[derive(Debug)]
pub(crate) struct Adaptive {
    cfg: AdaptiveConfig,
    ceiling: usize,
    fair_streak: u32,
}

/// Fair windows at the ceiling before probing one step above it.
const PROBE_AFTER: u32 = 8;

impl Adaptive {
    pub fn new(mut cfg: AdaptiveConfig) -> Self {
        cfg.min_depth = cfg.min_depth.max(1);
        cfg.max_depth = cfg.max_depth.max(cfg.min_depth);
        let ceiling = cfg.max_depth;
        Adaptive { cfg, ceiling, fair_streak: 0 }
    }

    pub fn clamp(&self, depth: usize) -> usize {
        depth.clamp(self.cfg.min_depth, self.cfg.max_depth)
    }

    pub fn window_full(&self, w: &Window, depth: usize) -> bool {
        w.completions as usize >= (self.cfg.window as usize).max(16 * depth)
    }

    /// The depth for the next window.
    pub fn evaluate(&mut self, w: &Window, shares: &[Share], depth: usize) -> usize {
        if unfair(w, shares, self.cfg.fairness_tolerance) {
            self.ceiling = self.clamp(depth.saturating_sub(1));
            self.fair_streak = 0;
            return self.clamp(depth / 2);
        }
        if w.mean_latency() > Duration::from_micros(self.cfg.latency_target_us) {
            return self.clamp(depth - (depth / 4).max(1));
        }
        if depth >= self.ceiling {
            self.fair_streak += 1;
            if self.fair_streak >= PROBE_AFTER {
                self.ceiling = self.clamp(self.ceiling + 1);
                self.fair_streak = 0;
            }
        }
        if w.depth_bound && depth < self.ceiling {
            return self.clamp(depth + 1);
        }
        depth
    }
}

/// Did a tenant busy all window get less than its weighted share?
fn unfair(w: &Window, shares: &[Share], tolerance: f64) -> bool {
    let busy: Vec<(u64, u32)> = w
        .tenants
        .iter()
        .zip(shares)
        .filter(|(t, s)| !t.went_idle && s.judged)
        .map(|(t, s)| (t.cost, s.weight))
        .collect();
    if busy.len() < 2 {
        return false;
    }
    let total: u64 = busy.iter().map(|b| b.0).sum();
    let weights: u64 = busy.iter().map(|b| b.1 as u64).sum();
    busy.iter().any(|&(got, weight)| {
        let entitled = total as f64 * weight as f64 / weights as f64;
        entitled - got as f64 > tolerance * entitled + w.max_cost as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(costs: &[u64], latency_ms: u64) -> Window {
        let n = 64;
        Window {
            completions: n,
            latency_sum: Duration::from_millis(latency_ms) * n,
            max_cost: 1,
            depth_bound: true,
            tenants: costs.iter().map(|&cost| TenantWindow { cost, went_idle: false }).collect(),
        }
    }

    const SHARES_4_1: [Share; 2] = [Share { weight: 4, judged: true }, Share { weight: 1, judged: true }];

    #[test]
    fn a_short_changed_tenant_halves_depth_and_caps_it() {
        let mut a = Adaptive::new(AdaptiveConfig { latency_target_us: 10_000, ..Default::default() });
        // 4:1 wanted, 1:1 got: tenant 0 got 32 of its entitled 51.2.
        assert_eq!(a.evaluate(&window(&[32, 32], 1), &SHARES_4_1, 8), 4);
        assert_eq!(a.ceiling, 7);
        // Fair windows raise D again, but not past the ceiling.
        let fair = window(&[51, 13], 1);
        let mut d = 4;
        for _ in 0..3 {
            d = a.evaluate(&fair, &SHARES_4_1, d);
        }
        assert_eq!(d, 7);
        assert_eq!(a.evaluate(&fair, &SHARES_4_1, 7), 7, "held at the ceiling");
    }

    #[test]
    fn latency_over_target_lowers_depth_by_a_quarter() {
        let mut a = Adaptive::new(AdaptiveConfig { latency_target_us: 10_000, ..Default::default() });
        assert_eq!(a.evaluate(&window(&[51, 13], 11), &SHARES_4_1, 16), 12);
        assert_eq!(a.evaluate(&window(&[51, 13], 11), &SHARES_4_1, 1), 1, "never below min_depth");
    }

    #[test]
    fn depth_grows_only_when_requests_wait_for_it() {
        let mut a = Adaptive::new(AdaptiveConfig::default());
        let mut w = window(&[51, 13], 1);
        assert_eq!(a.evaluate(&w, &SHARES_4_1, 3), 4);
        w.depth_bound = false;
        assert_eq!(a.evaluate(&w, &SHARES_4_1, 4), 4);
    }

    #[test]
    fn limited_or_idle_tenants_are_not_judged() {
        let mut w = window(&[60, 4], 1);
        let limited = [SHARES_4_1[0], Share { weight: 1, judged: false }];
        assert!(!unfair(&w, &limited, 0.05));
        w.tenants[0] = TenantWindow { cost: 4, went_idle: true };
        assert!(!unfair(&w, &SHARES_4_1, 0.05));
        w.tenants[0].went_idle = false;
        assert!(unfair(&w, &SHARES_4_1, 0.05));
    }
}
