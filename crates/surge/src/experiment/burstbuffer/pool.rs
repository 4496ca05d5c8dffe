//! The size of surge's I/O-node pool over time, sampled from
//! `surge bb status --json` every second while an approach runs.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One sample: seconds since the sampler started, live nodes, the pool
/// daemon's dollars so far (None without a daemon).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Point {
    pub t: f64,
    pub nodes: usize,
    pub cost_usd: Option<f64>,
}

pub struct Sampler {
    points: Arc<Mutex<Vec<Point>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Live nodes and the daemon's cost from `status --json` (both layouts: the
/// `pool` view when present, else the node list).
pub fn parse(v: &serde_json::Value) -> Option<(usize, Option<f64>)> {
    if let Some(p) = v.get("pool").filter(|p| p.is_object()) {
        let n = p["nodes"].as_array()?.iter().filter(|n| n["state"].as_str().is_none_or(|s| s != "unreachable")).count();
        return Some((n, p["cost_usd"].as_f64()));
    }
    Some((v.get("nodes")?.as_array()?.len(), None))
}

impl Sampler {
    /// Sample every `every` with `surge` and its environment `env`.
    /// Sample every `every` with `surge` and its environment `env`; times are seconds since `t0`.
    pub fn start(surge: PathBuf, env: Vec<(String, String)>, t0: Instant, every: Duration) -> Sampler {
        let points = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (points.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let next = Instant::now() + every;
                let out = Command::new(&surge).envs(env.iter().map(|(k, v)| (k, v))).args(["--log", "error", "bb", "status", "--json"]).output();
                let parsed = out.ok().filter(|o| o.status.success()).and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok());
                if let Some((nodes, cost_usd)) = parsed.as_ref().and_then(parse) {
                    p.lock().push(Point { t: t0.elapsed().as_secs_f64(), nodes, cost_usd });
                }
                while Instant::now() < next && !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Sampler { points, stop, thread: Some(thread) }
    }

    pub fn points(&self) -> Vec<Point> {
        self.points.lock().clone()
    }

    pub fn finish(mut self) -> Vec<Point> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.points()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Node-seconds under a sampled trace (each sample holds until the next).
pub fn node_seconds(points: &[Point]) -> f64 {
    node_seconds_between(points, f64::MIN, f64::MAX)
}

/// Node-seconds of the trace between `t0` and `t1` seconds.
pub fn node_seconds_between(points: &[Point], t0: f64, t1: f64) -> f64 {
    points.windows(2).map(|w| w[0].nodes as f64 * (w[1].t.min(t1) - w[0].t.max(t0)).max(0.0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_seconds_hold_each_sample_until_the_next() {
        let p = |t, nodes| Point { t, nodes, cost_usd: None };
        assert_eq!(node_seconds(&[p(0.0, 1), p(1.0, 3), p(3.0, 2)]), 1.0 + 6.0);
        assert_eq!(node_seconds(&[p(0.0, 1)]), 0.0);
        assert_eq!(node_seconds_between(&[p(0.0, 1), p(1.0, 3), p(3.0, 2)], 0.5, 2.0), 0.5 + 3.0);
    }

    #[test]
    fn parses_both_status_layouts() {
        let old = serde_json::json!({"nodes": [{"addr": "a"}, {"addr": "b"}]});
        assert_eq!(parse(&old), Some((2, None)));
        let new = serde_json::json!({"nodes": [], "pool": {"nodes": [{"addr": "a", "state": "live"}, {"addr": "b", "state": "unreachable"}, {"addr": "c", "state": "draining 5%"}], "cost_usd": 0.5}});
        assert_eq!(parse(&new), Some((2, Some(0.5))));
    }
}
