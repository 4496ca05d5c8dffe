//! The paper's Figs. 8 and 9: aggregate sequential and random throughput of
//! one burst buffer as I/O-node/client pairs grow (and with more clients than
//! nodes), one replica (deviation: the default is 2, which one pair cannot
//! hold). Every node and client is a machine of its own; the links are slow
//! enough (`LINK`) that this 2-core host's CPU is not what limits, and each
//! point reports the host's CPU use to show it.

use super::fs::{self, Mounted as _};
use super::machines::{self, Machines};
use super::s3::S3Server;
use super::work::{drop_caches, Tool};
use crate::experiment::progress;
use crate::experiment::topology::PortSpec;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Every machine's link in the scaling part: 25 Mbit/s (3.1 MB/s) each way,
/// so 8 pairs move at most 25 MB/s. At 100 Mbit/s the host's 2 cores were
/// what limited from 4 pairs on (99-100 % busy; 8 pairs wrote 40 MB/s, 0.63
/// of linear; the full run of a5f44b6): 16 processes of FUSE, TLS and the
/// switch's copies cost about 50 ms of CPU per MB moved here.
pub const LINK: PortSpec = PortSpec { rate_mbit: 25, delay_us: 50, per_peer_mbit: 0 };

#[derive(Debug, Clone, serde::Serialize)]
pub struct ScalePlan {
    /// (I/O nodes, clients) per point.
    pub points: Vec<(usize, usize)>,
    pub reps: usize,
    /// Written and then read by each client.
    pub mib_per_client: u64,
    pub bs_kib: u64,
    /// Random 4 KiB reads per client.
    pub rand_ops: u64,
}

impl ScalePlan {
    pub fn new(quick: bool) -> ScalePlan {
        if quick {
            return ScalePlan { points: vec![(1, 1), (2, 2)], reps: 1, mib_per_client: 8, bs_kib: 1024, rand_ops: 200 };
        }
        ScalePlan { points: vec![(1, 1), (2, 2), (4, 4), (8, 8), (4, 8)], reps: 3, mib_per_client: 16, bs_kib: 1024, rand_ops: 500 }
    }

    fn max_nodes(&self) -> usize {
        self.points.iter().map(|p| p.0).max().unwrap_or(1)
    }

    fn max_clients(&self) -> usize {
        self.points.iter().map(|p| p.1).max().unwrap_or(1)
    }
}

/// One point of one round.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    pub nodes: usize,
    pub clients: usize,
    pub round: usize,
    /// All clients' bytes over the time from the first start to the last end.
    pub write_mbps: f64,
    /// The same files read back through fresh mounts once they are in S3
    /// (no write-back shares the links): the bytes come from the I/O nodes.
    pub read_mbps: f64,
    pub rand_read_ops: f64,
    /// This host's CPU busy share (all cores) during the write and the read.
    pub cpu_pct: f64,
}

fn client(k: usize) -> String {
    format!("client-{k}")
}

/// Busy and total jiffies of all CPUs, from /proc/stat.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().sum();
    // idle and iowait are not busy.
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Run `op(k)` for every client at once; (MB/s of `bytes_each` per client
/// over the whole span, CPU busy %).
fn all_at_once(clients: usize, bytes_each: f64, op: impl Fn(usize) -> anyhow::Result<()> + Sync) -> anyhow::Result<(f64, f64)> {
    let (b0, t0) = cpu_jiffies();
    let start = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients).map(|k| s.spawn({ let op = &op; move || op(k) })).collect();
        hs.into_iter().map(|h| h.join().expect("client thread")).collect::<anyhow::Result<Vec<()>>>()
    })?;
    let secs = start.elapsed().as_secs_f64();
    let (b1, t1) = cpu_jiffies();
    Ok((clients as f64 * bytes_each / secs / 1e6, 100.0 * (b1 - b0) as f64 / (t1 - t0).max(1) as f64))
}

/// The scaling points, each on a fresh burst buffer (fresh Redis, nodes and
/// bucket), rounds interleaved.
pub fn run(surge: &Path, work: &Path, plan: &ScalePlan) -> anyhow::Result<Vec<Point>> {
    let mut roles: Vec<(String, PortSpec)> = vec![(machines::META.to_string(), LINK)];
    roles.extend((0..plan.max_nodes()).map(|i| (machines::node(i), LINK)));
    roles.extend((0..plan.max_clients()).map(|k| (client(k), LINK)));
    roles.push((machines::S3.to_string(), machines::S3_LINK));
    let m = Machines::with_roles(work, std::process::id() + 1, &roles)?;
    let dir = work.join("scaling");
    std::fs::create_dir_all(&dir)?;
    let s3 = S3Server::start(&dir, &m)?;
    let tool = Tool::install(&dir, s3.client_env())?;
    let mut out = Vec::new();
    let mut n = 0;
    for round in 0..plan.reps {
        for j in 0..plan.points.len() {
            // Rotated, as the main rounds are.
            let (nodes, clients) = plan.points[(round + j) % plan.points.len()];
            n += 1;
            progress::step(format!("scaling round {}: {nodes} nodes, {clients} clients", round + 1), false);
            let d = dir.join(format!("{n:02}-{nodes}n{clients}c"));
            std::fs::create_dir_all(&d)?;
            out.push(point(&m, surge, &s3, &tool, plan, &d, n, (nodes, clients), round)?);
            let p = out.last().expect("pushed");
            eprintln!("  scaling {nodes} nodes x {clients} clients: write {:.1} MB/s, read {:.1} MB/s, {:.0} random reads/s, CPU {:.0} %", p.write_mbps, p.read_mbps, p.rand_read_ops, p.cpu_pct);
        }
    }
    if let Some(t) = m.topology() {
        eprintln!("  scaling: the switch {:?}", t.counters());
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn point(m: &Machines, surge: &Path, s3: &S3Server, tool: &Tool, plan: &ScalePlan, d: &Path, n: usize, (nodes, clients): (usize, usize), round: usize) -> anyhow::Result<Point> {
    // One replica: a single pair has one node to hold it (the paper keeps one copy too).
    let mut bb = fs::Surge::start_with(m, surge, s3, &format!("bb-scale-{n}"), d, fs::Nodes::Fixed(nodes), &[("SURGE_BB_REPLICAS", "1")])?;
    let mnt = |k: usize| d.join(format!("mnt-{k}"));
    for k in 0..clients {
        bb.mount_on(&client(k), &mnt(k))?;
    }
    let file = |k: usize| -> PathBuf { mnt(k).join(format!("seq-{k}.dat")) };
    let bytes = (plan.mib_per_client << 20) as f64;
    let (mib, bs) = (plan.mib_per_client.to_string(), plan.bs_kib.to_string());
    let (write_mbps, cpu_w) = all_at_once(clients, bytes, |k| tool.run(&["seq-write", file(k).to_str().context("path")?, &mib, &bs]).map(drop))?;
    // The reads from a quiet start, as in the main rounds: a node's write-back
    // to S3 would share its link with them.
    bb.settle()?;
    // Fresh mounts: the clients' chunk caches are empty, the bytes come from the nodes.
    bb.unmount_all()?;
    for k in 0..clients {
        bb.mount_on(&client(k), &mnt(k))?;
    }
    drop_caches();
    let (read_mbps, cpu_r) = all_at_once(clients, bytes, |k| tool.run(&["seq-read", file(k).to_str().context("path")?, &bs]).map(drop))?;
    drop_caches();
    let ops = plan.rand_ops.to_string();
    let (rand_mbps, _) = all_at_once(clients, (plan.rand_ops * 4096) as f64, |k| tool.run(&["rand-read", file(k).to_str().context("path")?, &ops, "4", "1"]).map(drop))?;
    Box::new(bb).stop()?;
    Ok(Point { nodes, clients, round, write_mbps, read_mbps, rand_read_ops: rand_mbps * 1e6 / 4096.0, cpu_pct: cpu_w.max(cpu_r) })
}

/// Medians and spread per point, and how close to linear the largest
/// balanced point is against the single pair.
pub fn summary(points: &[Point]) -> serde_json::Value {
    use super::report::stats;
    let mut keys: Vec<(usize, usize)> = points.iter().map(|p| (p.nodes, p.clients)).collect();
    keys.sort();
    keys.dedup();
    let at = |k: (usize, usize)| points.iter().filter(move |p| (p.nodes, p.clients) == k);
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|&k| {
            let s = |f: fn(&Point) -> f64| {
                let (m, lo, hi) = stats(at(k).map(f));
                serde_json::json!({"median": m, "min": lo, "max": hi})
            };
            serde_json::json!({"nodes": k.0, "clients": k.1, "n": at(k).count(),
                "write_mbps": s(|p| p.write_mbps), "read_mbps": s(|p| p.read_mbps),
                "rand_read_ops": s(|p| p.rand_read_ops), "cpu_pct": s(|p| p.cpu_pct)})
        })
        .collect();
    let med = |k: (usize, usize), f: fn(&Point) -> f64| stats(at(k).map(f)).0;
    let top = keys.iter().copied().filter(|k| k.0 == k.1).max();
    let linear = top.filter(|t| t.0 > 1 && keys.contains(&(1, 1))).map(|t| {
        let pairs = t.0 as f64;
        serde_json::json!({"pairs": t.0,
            "write": med(t, |p| p.write_mbps) / (pairs * med((1, 1), |p| p.write_mbps)),
            "read": med(t, |p| p.read_mbps) / (pairs * med((1, 1), |p| p.read_mbps))})
    });
    serde_json::json!({"link": LINK, "points": rows, "samples": points, "linearity": linear})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(nodes: usize, clients: usize, round: usize, write_mbps: f64, read_mbps: f64) -> Point {
        Point { nodes, clients, round, write_mbps, read_mbps, rand_read_ops: 1.0, cpu_pct: 10.0 }
    }

    #[test]
    fn linearity_compares_the_largest_balanced_point_with_one_pair_times_pairs() {
        let pts = [p(1, 1, 0, 10.0, 20.0), p(1, 1, 1, 12.0, 20.0), p(4, 4, 0, 40.0, 40.0), p(4, 8, 0, 44.0, 44.0), p(2, 2, 0, 20.0, 40.0)];
        let v = summary(&pts);
        let l = &v["linearity"];
        assert_eq!(l["pairs"], 4);
        // Median of one pair: 11 MB/s written, so 4 pairs at 40 are 40/44 of linear.
        assert!((l["write"].as_f64().unwrap() - 40.0 / 44.0).abs() < 1e-9, "{l}");
        assert!((l["read"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{l}");
        // Points sorted, (4, 8) reported beside (4, 4) but not counted as balanced.
        let rows: Vec<(u64, u64)> = v["points"].as_array().unwrap().iter().map(|r| (r["nodes"].as_u64().unwrap(), r["clients"].as_u64().unwrap())).collect();
        assert_eq!(rows, [(1, 1), (2, 2), (4, 4), (4, 8)]);
        assert_eq!(v["points"][0]["n"], 2);
    }

    #[test]
    fn one_pair_alone_has_no_linearity() {
        assert!(summary(&[p(1, 1, 0, 10.0, 10.0)])["linearity"].is_null());
    }
}
