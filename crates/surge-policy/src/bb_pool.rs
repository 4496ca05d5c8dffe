//! Sizing the burst buffer's pool of I/O nodes from demand. Pure: the caller
//! passes the time and what it measured (bytes buffered, dirty backlog, ingest
//! and write-back throughput, current node count); the policy answers how many
//! nodes the pool should have.
//!
//! Dirty bytes cannot be evicted, so they decide: the pool grows at once when
//! the backlog projected `horizon` ahead (at ingest minus write-back rate)
//! passes `high_water` of the pool's memory, or when the backlog would take
//! longer than `drain_within` to write back (write-back runs on every node, so
//! its rate grows with the pool). It shrinks only after the demand has stayed
//! below `low_water` of a smaller pool for `shrink_after`: growing is cheap
//! next to refusing writes, shrinking early would flap.

use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolConfig {
    pub min_nodes: usize,
    pub max_nodes: usize,
    /// Chunk memory of one node, bytes.
    pub node_memory: u64,
    /// Grow when projected dirty bytes pass this share of the pool's memory.
    pub high_water: f64,
    /// Shrink only to a size whose memory keeps projected dirty bytes below this share.
    pub low_water: f64,
    /// How far ahead the backlog is projected.
    pub horizon: Duration,
    /// The backlog should be written back within this.
    pub drain_within: Duration,
    /// Demand must stay low this long before the pool shrinks.
    pub shrink_after: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_nodes: 2,
            max_nodes: 8,
            node_memory: 512 << 20,
            high_water: 0.5,
            low_water: 0.25,
            horizon: Duration::from_secs(5),
            drain_within: Duration::from_secs(30),
            shrink_after: Duration::from_secs(30),
        }
    }
}

/// What the pool sees now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolDemand {
    /// Bytes held by the nodes (dirty and clean copies).
    pub buffered_bytes: u64,
    /// Dirty bytes (every copy counted): not in S3 yet, cannot be evicted.
    pub dirty_bytes: u64,
    /// Bytes/s newly written into the pool (every copy counted).
    pub ingest_bps: f64,
    /// Bytes/s written back to S3 by the whole pool.
    pub writeback_bps: f64,
    /// Nodes in the pool now (not counting draining ones).
    pub nodes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolDecision {
    pub target: usize,
    /// Why, in a few words (for the daemon's log line).
    pub reason: String,
}

pub struct PoolPolicy {
    cfg: PoolConfig,
    /// Since when a smaller pool would do.
    low_since: Option<Duration>,
}

impl PoolPolicy {
    pub fn new(cfg: PoolConfig) -> PoolPolicy {
        PoolPolicy { cfg, low_since: None }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    fn clamp(&self, n: usize) -> usize {
        n.clamp(self.cfg.min_nodes, self.cfg.max_nodes.max(self.cfg.min_nodes))
    }

    /// Nodes whose memory keeps `bytes` below `water` of it.
    fn nodes_for(&self, bytes: f64, water: f64) -> usize {
        (bytes / (self.cfg.node_memory as f64 * water)).ceil() as usize
    }

    /// Nodes that write the backlog back within `drain_within`, if write-back
    /// rate scales with the node count.
    fn nodes_for_writeback(&self, d: &PoolDemand) -> usize {
        if d.dirty_bytes == 0 || d.writeback_bps <= 0.0 || d.nodes == 0 {
            return 0;
        }
        let secs = d.dirty_bytes as f64 / d.writeback_bps;
        let within = self.cfg.drain_within.as_secs_f64().max(1e-3);
        (d.nodes as f64 * secs / within).ceil() as usize
    }

    /// The pool size wanted at `now` for demand `d`.
    pub fn decide(&mut self, now: Duration, d: &PoolDemand) -> PoolDecision {
        let growth = (d.ingest_bps - d.writeback_bps).max(0.0) * self.cfg.horizon.as_secs_f64();
        let projected = d.dirty_bytes as f64 + growth;
        let wb = self.nodes_for_writeback(d);
        let high = self.clamp(self.nodes_for(projected, self.cfg.high_water).max(wb));
        let mib = |b: f64| b / 1048576.0;
        if high > d.nodes || d.nodes < self.cfg.min_nodes {
            self.low_since = None;
            let reason = if wb >= high && wb > 0 {
                format!("write-back backlog {:.0} MiB at {:.1} MiB/s", mib(d.dirty_bytes as f64), mib(d.writeback_bps))
            } else {
                format!("dirty {:.0} MiB projected to {:.0} MiB", mib(d.dirty_bytes as f64), mib(projected))
            };
            return PoolDecision { target: high.max(self.clamp(d.nodes)), reason };
        }
        let low = self.clamp(self.nodes_for(projected, self.cfg.low_water).max(wb));
        if low < d.nodes {
            let since = *self.low_since.get_or_insert(now);
            let waited = now.saturating_sub(since);
            if waited >= self.cfg.shrink_after || d.nodes > self.cfg.max_nodes {
                self.low_since = None;
                return PoolDecision {
                    target: low,
                    reason: format!("demand low for {:.0} s (dirty {:.0} MiB)", waited.as_secs_f64(), mib(d.dirty_bytes as f64)),
                };
            }
            return PoolDecision { target: d.nodes, reason: format!("low for {:.0} s, waiting", waited.as_secs_f64()) };
        }
        self.low_since = None;
        PoolDecision { target: d.nodes, reason: "steady".into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn policy() -> PoolPolicy {
        PoolPolicy::new(PoolConfig {
            min_nodes: 2,
            max_nodes: 6,
            node_memory: 100 * MIB,
            shrink_after: Duration::from_secs(30),
            ..Default::default()
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn demand(dirty_mib: u64, ingest_mibs: f64, wb_mibs: f64, nodes: usize) -> PoolDemand {
        PoolDemand {
            buffered_bytes: dirty_mib * MIB,
            dirty_bytes: dirty_mib * MIB,
            ingest_bps: ingest_mibs * MIB as f64,
            writeback_bps: wb_mibs * MIB as f64,
            nodes,
        }
    }

    #[test]
    fn an_idle_pool_stays_at_its_minimum() {
        let mut p = policy();
        for t in 0..100 {
            assert_eq!(p.decide(secs(t), &demand(0, 0.0, 0.0, 2)).target, 2);
        }
        // Below the minimum (a node died): back up at once.
        assert_eq!(p.decide(secs(100), &demand(0, 0.0, 0.0, 1)).target, 2);
    }

    #[test]
    fn a_write_burst_grows_the_pool_at_once_up_to_the_maximum() {
        let mut p = policy();
        // 2 nodes = 200 MiB; 80 MiB dirty and +40 MiB/s net for 5 s: 280 MiB projected.
        let d = p.decide(secs(0), &demand(80, 50.0, 10.0, 2));
        assert_eq!(d.target, 6, "280 MiB at 50 % of 100 MiB nodes needs 6 nodes: {d:?}");
        assert!(d.reason.contains("projected"), "{}", d.reason);
        // A bigger burst is capped at max_nodes.
        assert_eq!(p.decide(secs(1), &demand(900, 100.0, 0.0, 6)).target, 6);
    }

    #[test]
    fn a_slow_write_back_backlog_grows_the_pool() {
        let mut p = policy();
        // 90 MiB dirty fits 2 nodes at 50 %, but at 1 MiB/s it takes 90 s > 30 s:
        // three times the write-back rate, so three times the nodes.
        let d = p.decide(secs(0), &demand(90, 0.0, 1.0, 2));
        assert_eq!(d.target, 6, "{d:?}");
        assert!(d.reason.contains("write-back backlog"), "{}", d.reason);
    }

    #[test]
    fn shrinking_waits_until_demand_stays_low() {
        let mut p = policy();
        let busy = demand(250, 0.0, 50.0, 6);
        assert_eq!(p.decide(secs(0), &busy).target, 6);
        // The burst is over: nothing dirty. Hold for 30 s, then shrink to the minimum.
        let idle = demand(0, 0.0, 0.0, 6);
        for t in 1..31 {
            assert_eq!(p.decide(secs(t), &idle).target, 6, "t={t}: shrinks too early");
        }
        let d = p.decide(secs(31), &idle);
        assert_eq!(d.target, 2, "{d:?}");
        assert!(d.reason.contains("low for 30 s"), "{}", d.reason);
    }

    #[test]
    fn a_short_dip_does_not_shrink_and_restarts_the_wait() {
        let mut p = policy();
        let idle = demand(0, 0.0, 0.0, 4);
        let busy = demand(180, 0.0, 100.0, 4);
        for t in 0..20 {
            assert_eq!(p.decide(secs(t), &idle).target, 4);
        }
        assert_eq!(p.decide(secs(20), &busy).target, 4, "180 MiB fits 4 nodes at 50 %");
        for t in 21..50 {
            assert_eq!(p.decide(secs(t), &idle).target, 4, "t={t}: the wait restarts after demand returns");
        }
        assert_eq!(p.decide(secs(51), &idle).target, 2);
    }

    #[test]
    fn hysteresis_between_the_water_marks_holds_the_size() {
        let mut p = policy();
        // 4 nodes = 400 MiB. 120 MiB dirty: above 25 % of 3 nodes (75 MiB),
        // below 50 % of 4 (200 MiB): neither grow nor shrink, however long.
        for t in 0..200 {
            assert_eq!(p.decide(secs(t), &demand(120, 0.0, 100.0, 4)).target, 4);
        }
        // 60 MiB: 25 % of 3 nodes is 75 MiB, so 3 nodes do after the wait.
        for t in 200..230 {
            assert_eq!(p.decide(secs(t), &demand(60, 0.0, 100.0, 4)).target, 4);
        }
        assert_eq!(p.decide(secs(230), &demand(60, 0.0, 100.0, 4)).target, 3);
    }
}
