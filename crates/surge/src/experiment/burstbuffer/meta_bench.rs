//! `surge bb bench-meta`: file creates per second against the number of
//! Redis Cluster masters (the paper's Fig. 10), as mdtest -u runs it: each
//! client a process of its own creating empty files in a directory of its
//! own, on a sharded file system (`surge_bb::meta::redis`, shards spread
//! evenly over the masters). The burst-buffer experiment runs it too
//! ([`BenchMetaArgs::experiment`]), for `scaling.creates_by_shards`.

use super::machines::Machines;
use crate::experiment::topology::PortSpec;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use surge_bb::meta::{Kind, MetaStore, FsParams, ROOT};
use surge_bb::meta::redis::RedisMeta;

#[derive(clap::Args, Debug, Clone, serde::Serialize)]
pub struct BenchMetaArgs {
    /// Masters per point, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub masters: Vec<usize>,
    /// Creating client processes per point.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Seconds each client creates for.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Rounds (each round runs every point once, interleaved).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Shards of the file system (fixed at format).
    #[arg(long, default_value_t = surge_bb::meta::redis::CLUSTER_SHARDS)]
    pub shards: usize,
    /// Where the masters keep their files (a temporary directory if not given).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Writes the points as JSON here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Caps each master at this much of one core (a cgroup of its own, CPU
    /// quota and a high weight), as if each were a small machine: on a host
    /// with fewer cores than masters, what limits is then each master's
    /// share and not the host. 0: no cap.
    #[arg(long, default_value_t = 0.0)]
    pub master_cpu: f64,
}

impl BenchMetaArgs {
    /// The experiment's points: the recorded run's settings (32 clients, each
    /// master capped at a tenth of a core so that this 2-core host is not what
    /// limits up to 8 masters), or 1 and 2 masters briefly for CI.
    pub fn experiment(quick: bool) -> BenchMetaArgs {
        let (masters, clients, seconds, reps) = if quick { (vec![1, 2], 8, 2.0, 1) } else { (vec![1, 2, 4, 8], 32, 5.0, 3) };
        BenchMetaArgs { masters, clients, seconds, reps, shards: surge_bb::meta::redis::CLUSTER_SHARDS, dir: None, out: None, master_cpu: 0.1 }
    }
}

/// A cgroup capping one process at `share` of a core (cgroup v2 `cpu.max`,
/// or v1's cpu controller); removed on drop.
struct CpuCap(PathBuf);

impl CpuCap {
    fn new(name: &str, pid: u32, share: f64) -> anyhow::Result<CpuCap> {
        let period = 100_000u64;
        let quota = ((share * period as f64) as u64).max(1000);
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 { PathBuf::from("/sys/fs/cgroup").join(name) } else { PathBuf::from("/sys/fs/cgroup/cpu").join(name) };
        std::fs::create_dir_all(&dir).with_context(|| format!("making cgroup {} (--master-cpu needs a writable cgroup fs)", dir.display()))?;
        let w = |f: &str, v: String| std::fs::write(dir.join(f), v).with_context(|| format!("{}/{f}", dir.display()));
        if v2 {
            w("cpu.max", format!("{quota} {period}"))?;
            w("cpu.weight", "1000".into())?;
            w("cgroup.procs", pid.to_string())?;
        } else {
            w("cpu.cfs_period_us", period.to_string())?;
            w("cpu.cfs_quota_us", quota.to_string())?;
            w("cpu.shares", "10240".into())?;
            w("tasks", pid.to_string())?;
        }
        Ok(CpuCap(dir))
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // (Empty once its process has exited.)
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchMetaClientArgs {
    #[arg(long)]
    pub redis: String,
    #[arg(long)]
    pub fs: String,
    #[arg(long)]
    pub name: String,
    /// Start creating at this time (ms since the epoch), with the others.
    #[arg(long)]
    pub start_ms: i64,
    #[arg(long)]
    pub seconds: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    pub masters: usize,
    pub round: usize,
    pub clients: usize,
    pub creates: u64,
    pub seconds: f64,
    pub creates_per_s: f64,
    /// The host's CPU busy (all cores) over the creating window, 0..1.
    pub cpu_busy: f64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// (busy, total) jiffies of all cores, from /proc/stat.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

pub fn client(a: &BenchMetaClientArgs) -> anyhow::Result<()> {
    let m = RedisMeta::connect(&a.redis, &a.fs)?;
    let d = m.create(ROOT, &a.name, Kind::Dir, 0o755, 0, 0, 1)?;
    let wait = a.start_ms - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < a.seconds {
        m.create(d.ino, &format!("f{n}"), Kind::File, 0o644, 0, 0, n as i64)?;
        n += 1;
    }
    println!("{}", serde_json::json!({"creates": n, "seconds": t.elapsed().as_secs_f64()}));
    Ok(())
}

/// Machine names of the experiment's creates part.
pub fn master(i: usize) -> String {
    format!("master-{i}")
}

pub fn client_machine(k: usize) -> String {
    format!("mdclient-{k}")
}

/// Client machines of the experiment's creates part (the paper's 8, fewer
/// when there are fewer client processes); processes are dealt over them.
pub fn client_machines(a: &BenchMetaArgs) -> usize {
    a.clients.min(8)
}

/// Every master and client a machine of its own behind `link` (the
/// experiment), or all here on loopback (`surge bb bench-meta`).
pub fn machines(work: &Path, a: &BenchMetaArgs, link: PortSpec) -> anyhow::Result<Machines> {
    let masters = a.masters.iter().copied().max().unwrap_or(1);
    let mut roles: Vec<(String, PortSpec)> = (0..masters).map(|i| (master(i), link)).collect();
    roles.extend((0..client_machines(a)).map(|k| (client_machine(k), link)));
    Machines::with_roles(work, std::process::id() + 2, &roles)
}

pub fn run(a: &BenchMetaArgs) -> anyhow::Result<Vec<Point>> {
    run_on(a, &Machines::loopback())
}

/// The points, with masters and clients on `m`'s machines.
pub fn run_on(a: &BenchMetaArgs, on: &Machines) -> anyhow::Result<Vec<Point>> {
    anyhow::ensure!(a.clients > 0 && a.reps > 0 && !a.masters.is_empty(), "--clients, --reps and --masters must not be empty");
    let tmp = tempfile::tempdir()?;
    let base = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let exe = std::env::current_exe()?;
    let mut points = Vec::new();
    println!("masters round clients creates/s cpu_busy");
    for round in 0..a.reps {
        for &masters in &a.masters {
            let dir = base.join(format!("m{masters}-r{round}"));
            let _ = std::fs::remove_dir_all(&dir);
            let hosts: Vec<_> = (0..masters).map(|i| on.host(&master(i))).collect();
            let mut c = surge_bb::local::LocalCluster::start_on(&dir, &hosts).with_context(|| format!("a cluster of {masters}"))?;
            let caps = if a.master_cpu > 0.0 {
                c.nodes.iter().enumerate().map(|(i, r)| CpuCap::new(&format!("surge-bench-meta-{}-{i}", std::process::id()), r.pid().unwrap_or(0), a.master_cpu)).collect::<anyhow::Result<Vec<_>>>()?
            } else {
                vec![]
            };
            let m = RedisMeta::connect(&c.url(), "bench")?.with_shards(a.shards);
            m.format(&FsParams { chunk_size: 1 << 20 })?;
            let start_ms = now_ms() + 1500;
            let children = (0..a.clients)
                .map(|i| {
                    on.command(&client_machine(i % client_machines(a)), &exe)
                        .args(["bb", "bench-meta-client", "--redis", &c.url(), "--fs", "bench", "--name", &format!("c{i}")])
                        .args(["--start-ms", &start_ms.to_string(), "--seconds", &a.seconds.to_string()])
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .context("starting a bench client")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let wait = start_ms - now_ms();
            if wait > 0 {
                std::thread::sleep(Duration::from_millis(wait as u64));
            }
            let cpu0 = cpu_jiffies();
            std::thread::sleep(Duration::from_secs_f64(a.seconds));
            let cpu1 = cpu_jiffies();
            let (mut creates, mut secs) = (0u64, 0f64);
            for ch in children {
                let out = ch.wait_with_output()?;
                anyhow::ensure!(out.status.success(), "a bench client failed ({})", out.status);
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("a bench client's figures")?;
                creates += v["creates"].as_u64().unwrap_or(0);
                secs = secs.max(v["seconds"].as_f64().unwrap_or(0.0));
            }
            let cpu_busy = match (cpu0, cpu1) {
                (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64,
                _ => f64::NAN,
            };
            let p = Point { masters, round, clients: a.clients, creates, seconds: secs, creates_per_s: creates as f64 / secs.max(1e-9), cpu_busy };
            println!("{} {} {} {:.0} {:.2}", p.masters, p.round, p.clients, p.creates_per_s, p.cpu_busy);
            points.push(p);
            for r in &mut c.nodes {
                r.kill();
            }
            drop(caps);
            drop(c);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    println!("masters median_creates/s min max");
    for r in summary(&points)["points"].as_array().into_iter().flatten() {
        println!("{} {:.0} {:.0} {:.0}", r["masters"], r["creates_per_s"]["median"].as_f64().unwrap_or(f64::NAN), r["creates_per_s"]["min"].as_f64().unwrap_or(f64::NAN), r["creates_per_s"]["max"].as_f64().unwrap_or(f64::NAN));
    }
    if let Some(out) = &a.out {
        let j = serde_json::json!({"clients": a.clients, "seconds": a.seconds, "shards": a.shards, "reps": a.reps, "master_cpu": a.master_cpu, "points": points});
        std::fs::write(out, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(points)
}

/// Median, min and max creates/s per number of masters, each against one
/// master's median (`vs_one`; linear growth would be the masters' count).
pub fn summary(points: &[Point]) -> serde_json::Value {
    use super::report::stats;
    let mut masters: Vec<usize> = points.iter().map(|p| p.masters).collect();
    masters.sort();
    masters.dedup();
    let at = |m: usize| points.iter().filter(move |p| p.masters == m);
    let one = stats(at(1).map(|p| p.creates_per_s)).0;
    let rows: Vec<serde_json::Value> = masters
        .iter()
        .map(|&m| {
            let (med, lo, hi) = stats(at(m).map(|p| p.creates_per_s));
            let cpu = stats(at(m).map(|p| p.cpu_busy)).0;
            serde_json::json!({"masters": m, "n": at(m).count(), "creates_per_s": {"median": med, "min": lo, "max": hi}, "vs_one": med / one, "cpu_busy": cpu})
        })
        .collect();
    serde_json::json!({"points": rows, "samples": points})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(masters: usize, round: usize, creates_per_s: f64) -> Point {
        Point { masters, round, clients: 8, creates: 0, seconds: 1.0, creates_per_s, cpu_busy: 0.5 }
    }

    #[test]
    fn summary_gives_each_masters_count_its_median_and_growth_over_one() {
        let v = summary(&[p(2, 0, 300.0), p(1, 0, 100.0), p(1, 1, 140.0), p(1, 2, 120.0), p(2, 1, 200.0)]);
        let rows = v["points"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["masters"], 1);
        assert_eq!(rows[0]["creates_per_s"]["median"], 120.0);
        assert_eq!(rows[0]["creates_per_s"]["min"], 100.0);
        // Two samples at 2 masters: their mean is the median, 250 against 120.
        assert!((rows[1]["vs_one"].as_f64().unwrap() - 250.0 / 120.0).abs() < 1e-9, "{v}");
        assert_eq!(rows[1]["n"], 2);
    }
}
