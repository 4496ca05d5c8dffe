//! The paper's CM1 case study (Table I) as a replica at reduced scale: an
//! iterative bulk-synchronous application (compute, then a checkpoint burst
//! from 4 writers, four bursts, the first smaller) runs three ways, every
//! part its own process as a user runs it: `surge serve` with the approach's
//! export (a spec string: the daemon's builders and defaults) on a local
//! cloud at scale f (`--local-scale time=f`: durations and sizes x f,
//! bandwidths not), and `surge load` as the application over NBD.
//! - static-slow: one reserved 33 MB/s volume;
//! - static-fast: one reserved 128 MB/s volume of the same size;
//! - adaptive: a 33 MB/s backing volume plus elastic 128 MB/s cache volumes.
//!
//! The full run adds adaptive with burst-period learning off, and the same
//! application with compute phases that vary by +-25 %.

use super::plot;
use crate::experiment::daemon::{self, Daemon, DaemonSpec, ElasticLog};
use crate::load::report::Parsed;
use crate::load::{Expected, LoadConfig, OutputFormat, Rw, Sizes};
use anyhow::{ensure, Context};
use serde::Serialize;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::model::{Scale, GIB, MIB};
use surge_cloud::Provider;
pub use crate::experiment::stat::Stat;

/// The paper's setting at full scale (per VM); the run's scale.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub scale: f64,
    pub backing: String,
    pub fast: String,
    pub cache_bw: String,
    pub init_compute_s: f64,
    pub compute_s: f64,
    /// Bytes of each checkpoint burst, full scale.
    pub bursts: Vec<u64>,
    pub writers: u32,
    pub request: u64,
    /// Plot bin, full-scale seconds.
    pub bin_s: f64,
}

impl Setting {
    /// CM1 in the paper: 50 GB backing, 33 vs 128 MB/s; four I/O phases, the first smaller.
    pub fn new(scale: f64) -> Self {
        Setting {
            scale,
            backing: "reserved:50GiB,bw=33MB/s".into(),
            fast: "reserved:50GiB,bw=128MB/s".into(),
            cache_bw: "128MB/s".into(),
            init_compute_s: 30.0,
            compute_s: 350.0,
            bursts: vec![9 * GIB / 4, 7 * GIB / 2, 7 * GIB / 2, 7 * GIB / 2],
            writers: 4,
            request: MIB,
            bin_s: 5.0,
        }
    }

    pub fn local(&self) -> Scale {
        Scale { rate: 1.0, time: self.scale }
    }

    /// What each writer writes per burst, at this scale (whole requests).
    fn per_writer(&self) -> Vec<u64> {
        self.bursts.iter().map(|&b| ((b as f64 * self.scale) as u64 / self.writers as u64 / self.request).max(1) * self.request).collect()
    }
}

/// The application's compute phases.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Variant {
    pub key: &'static str,
    /// Each compute phase x (1 + u x jitter), u uniform in [-1, 1] (seeded).
    pub jitter: f64,
}

pub const EXACT: Variant = Variant { key: "exact", jitter: 0.0 };
pub const JITTER: Variant = Variant { key: "jitter", jitter: 0.25 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Approach {
    #[serde(rename = "static-slow")]
    Slow,
    #[serde(rename = "static-fast")]
    Fast,
    #[serde(rename = "adaptive")]
    Adaptive,
    /// The daemon with burst-period learning turned off (`learn=false`).
    #[serde(rename = "adaptive-no-learning")]
    AdaptiveNoLearn,
}

impl Approach {
    pub fn name(self) -> &'static str {
        match self {
            Approach::Slow => "static-slow",
            Approach::Fast => "static-fast",
            Approach::Adaptive => "adaptive",
            Approach::AdaptiveNoLearn => "adaptive-no-learning",
        }
    }
    fn elastic(self) -> bool {
        matches!(self, Approach::Adaptive | Approach::AdaptiveNoLearn)
    }
}

/// The application: `surge load`, 4 writers (one connection each, one 1 MiB
/// request in flight each) appending their part of each checkpoint to their
/// own region, a FLUSH at the end of each burst, compute between bursts.
pub fn application(s: &Setting, v: Variant, uri: &str) -> LoadConfig {
    let per = s.per_writer();
    let mut c = LoadConfig::new(uri);
    c.rw = Rw::Write;
    c.bs = Sizes::one(s.request);
    c.numjobs = s.writers;
    c.size = Some(per.iter().sum());
    c.burst_bytes = per;
    c.start_delay = Duration::from_secs_f64(s.init_compute_s * s.scale);
    c.think = Duration::from_secs_f64(s.compute_s * s.scale);
    c.think_jitter = v.jitter;
    c.flush_each_burst = true;
    c.seed = 40;
    c.output_format = OutputFormat::Json;
    c.group_reporting = true;
    c.name = "cm1".into();
    c
}

/// The approach's daemon, as a user starts it (at the run's scale).
pub fn daemon_spec(s: &Setting, a: Approach) -> DaemonSpec {
    let export = match a {
        Approach::Slow => format!("app={}", s.backing),
        Approach::Fast => format!("app={}", s.fast),
        Approach::Adaptive => format!("app=elastic:backing={},cache=reserved,cache_bw={}", s.backing, s.cache_bw),
        Approach::AdaptiveNoLearn => format!("app=elastic:backing={},cache=reserved,cache_bw={},learn=false", s.backing, s.cache_bw),
    };
    DaemonSpec::new(vec![export], s.local())
}

/// One sample of a run's timeline (full-scale seconds from the start).
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t: f64,
    pub app_bytes: u64,
    pub device_bytes: u64,
    pub cache_size: u64,
    pub agbs: f64,
    pub usd: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub variant: &'static str,
    pub approach: Approach,
    pub rep: usize,
    /// Full-scale seconds.
    pub completion_s: f64,
    pub cost_agbs: f64,
    pub cost_usd: f64,
    /// Start and end of each burst, full-scale seconds from the start.
    pub bursts: Vec<(f64, f64)>,
    pub verified_bytes: u64,
    /// Cache sizes provisioned, bytes at this scale.
    pub cache_sizes: Vec<u64>,
    /// The daemon's decisions: (full-scale seconds from the start, action, reason).
    pub decisions: Vec<(f64, String, String)>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

fn run_app(cfg: &LoadConfig) -> anyhow::Result<Parsed> {
    let exe = std::env::current_exe().context("finding the surge binary")?;
    let out = Command::new(exe).args(["--log", "warn", "load"]).args(cfg.args()).stdin(Stdio::null()).output().context("running surge load")?;
    ensure!(out.status.success(), "surge load failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    Parsed::from_output(&String::from_utf8_lossy(&out.stdout))
}

/// Run approach `a` with variant `v` once in `dir` (removed afterwards).
pub fn run(s: &Setting, v: Variant, a: Approach, rep: usize, dir: &Path) -> anyhow::Result<RunResult> {
    let _ = std::fs::remove_dir_all(dir);
    let f = s.scale;
    let d = Daemon::start(dir, &daemon_spec(s, a))?;
    let prov = daemon::cloud(dir, s.local())?;
    let cfg = application(s, v, &d.uri("app"));
    let t0 = Instant::now();
    let t0_ns = crate::experiment::fairshare::client::monotonic_ns();
    // Decisions are stamped on the daemon's clock: where t0 is on it.
    let clock_at_t0 = if a.elastic() { d.target("app/elastic")?["clock_s"].as_f64().unwrap_or(0.0) - t0.elapsed().as_secs_f64() } else { 0.0 };
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, prov, control) = (stop.clone(), prov.clone(), d.control.clone());
        let period = Duration::from_secs_f64(s.bin_s * f / 5.0);
        let elastic = a.elastic();
        std::thread::spawn(move || {
            let (mut out, mut log) = (Vec::new(), ElasticLog::new("app/elastic"));
            loop {
                let r = crate::control::call(&control, &crate::control::Request::Status).ok().and_then(|r| r.targets).unwrap_or_default();
                let get = |name: &str| r.iter().find(|t| t.name == name).map(|t| t.status.clone()).unwrap_or_default();
                let (app, dev, cache) = if elastic {
                    let e = get("app/elastic");
                    log.see(&e);
                    log.last = e.clone();
                    (e["io"]["app_bytes"].as_u64().unwrap_or(0), e["io"]["device_bytes"].as_u64().unwrap_or(0), e["cache_size"].as_u64().unwrap_or(0))
                } else {
                    let io = get("app")["io"].clone();
                    let b = io["read_bytes"].as_u64().unwrap_or(0) + io["write_bytes"].as_u64().unwrap_or(0);
                    (b, b, 0)
                };
                let (agbs, usd) = prov.cost().map(|c| (c.total_agbs, c.total_usd)).unwrap_or_default();
                out.push(Sample { t: t0.elapsed().as_secs_f64() / f, app_bytes: app, device_bytes: dev, cache_size: cache, agbs, usd });
                if stop.load(Relaxed) {
                    return (out, log);
                }
                std::thread::sleep(period);
            }
        })
    };
    let app = run_app(&cfg);
    let done = Instant::now();
    let at_completion = prov.cost()?;
    // Adaptive: the cache lives on until drained and deleted; the user pays for it.
    if a.elastic() {
        let deadline = Instant::now() + Duration::from_secs_f64(1200.0 * f);
        loop {
            let st = d.target("app/elastic")?;
            if st["cache_size"].as_u64() == Some(0) && st["cache_volume"].is_null() {
                break;
            }
            ensure!(Instant::now() < deadline, "the cache was not released within 1,200 s (full scale) after the run: state {}", st["state"]);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let at_end = prov.cost()?;
    std::thread::sleep(Duration::from_secs_f64(s.bin_s * f / 5.0));
    stop.store(true, Relaxed);
    let (samples, log) = sampler.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let parsed = app.with_context(|| format!("{} ({}) run {rep}", a.name(), v.key))?;
    let job = parsed.jobs.first().context("surge load reported no job")?;
    let off = (job.surge.started_monotonic_ns as f64 - t0_ns as f64) / 1e9;
    let bursts = job.surge.bursts.iter().map(|b| ((off + b.start_s) / f, (off + b.end_s) / f)).collect();
    // Cost: the data volume until the application completed; cache volumes until deleted.
    let data = if a.elastic() { "app-backing" } else { "app" };
    let data_id = prov.list()?.into_iter().find(|x| x.name.as_deref() == Some(data)).map(|x| x.id).context("the data volume")?;
    let (mut agbs, mut usd) = (0.0, 0.0);
    for (i, vc) in at_end.volumes.iter().enumerate() {
        let vc = match at_completion.volumes.get(i) {
            Some(c) if vc.id == data_id => c,
            _ => vc,
        };
        agbs += vc.agbs.unwrap_or(0.0);
        usd += vc.usd;
    }
    let cache_sizes = log.last["cache_sizes"].as_array().map(|v| v.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
    let decisions = log
        .decisions()
        .iter()
        .map(|x| {
            let size = x["size"].as_u64().map_or(String::new(), |b| format!(" {:.3} GiB", b as f64 / GIB as f64));
            ((x["at_s"].as_f64().unwrap_or(0.0) - clock_at_t0) / f, format!("{}{size}", x["action"].as_str().unwrap_or("?")), x["reason"].as_str().unwrap_or("").to_string())
        })
        .collect();
    d.stop()?;
    let verified = daemon::read_volume(&prov, data, |dev| {
        let jobs = cfg.jobs(dev.size())?;
        let issued = &job.surge.ios_issued_per_job;
        let e = Expected::of(&jobs.into_iter().zip(issued.iter().copied()).collect::<Vec<_>>()).map_err(anyhow::Error::msg)?;
        e.check(|off, buf| dev.read_at(buf, off).with_context(|| format!("reading back at {off}")))
    })
    .with_context(|| format!("{} ({}) run {rep}: data check", a.name(), v.key))?;
    drop(prov);
    let _ = std::fs::remove_dir_all(dir);
    Ok(RunResult { variant: v.key, approach: a, rep, completion_s: (done - t0).as_secs_f64() / f, cost_agbs: agbs, cost_usd: usd, bursts, verified_bytes: verified, cache_sizes, decisions, samples })
}

/// An approach's runs in one variant.
#[derive(Debug, Clone)]
pub struct Summary {
    pub approach: Approach,
    pub completion: Stat,
    pub agbs: Stat,
    pub usd: Stat,
    pub runs: Vec<RunResult>,
}

impl Summary {
    /// The run with the median completion time.
    pub fn typical(&self) -> &RunResult {
        let mut v: Vec<&RunResult> = self.runs.iter().collect();
        v.sort_by(|a, b| a.completion_s.total_cmp(&b.completion_s));
        v[v.len() / 2]
    }
}

/// What ran in one variant.
pub fn summarize(runs: &[RunResult], v: Variant) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for a in [Approach::Slow, Approach::Fast, Approach::Adaptive, Approach::AdaptiveNoLearn] {
        let rs: Vec<RunResult> = runs.iter().filter(|r| r.variant == v.key && r.approach == a).cloned().collect();
        if rs.is_empty() {
            continue;
        }
        let st = |f: fn(&RunResult) -> f64| Stat::of(rs.iter().map(f).collect());
        out.push(Summary { approach: a, completion: st(|r| r.completion_s), agbs: st(|r| r.cost_agbs), usd: st(|r| r.cost_usd), runs: rs });
    }
    out
}

/// Which runs a plan makes: (variant, approach), in the order of the first rep.
pub fn plan(quick: bool) -> Vec<(Variant, Approach)> {
    let mut v = vec![(EXACT, Approach::Slow), (EXACT, Approach::Fast), (EXACT, Approach::Adaptive)];
    let all = std::env::var("SURGE_ELASTIC_VARIANTS").map_or(!quick, |x| x == "all");
    if all {
        v.extend([(EXACT, Approach::AdaptiveNoLearn), (JITTER, Approach::Fast), (JITTER, Approach::Adaptive), (JITTER, Approach::AdaptiveNoLearn)]);
    }
    v
}

/// Every run of the replica: `reps` rounds, the order rotated each round.
pub fn run_all(s: &Setting, quick: bool, reps: usize, work: &Path) -> anyhow::Result<Vec<RunResult>> {
    let runs = plan(quick);
    crate::experiment::progress::set_steps((runs.len() * reps) as u64);
    let mut out = Vec::new();
    for rep in 0..reps {
        for j in 0..runs.len() {
            let (v, a) = runs[(j + rep) % runs.len()];
            crate::experiment::progress::step(format!("elastic: {} ({}) run {}/{reps} (scale 1/{:.0})...", a.name(), v.key, rep + 1, 1.0 / s.scale), false);
            let r = run(s, v, a, rep, &work.join(format!("{}-{}-{rep}", v.key, a.name()))).with_context(|| format!("approach {} ({})", a.name(), v.key))?;
            crate::experiment::progress::step(format!("elastic: {} ({}): completion {:.1} s, {:.0} AGBs, verified {} MiB", a.name(), v.key, r.completion_s, r.cost_agbs, r.verified_bytes / MIB), true);
            out.push(r);
        }
    }
    Ok(out)
}

/// The replica's part of results.json and report.md.
pub fn report(out: &Path, s: &Setting, quick: bool, reps: usize, runs: &[RunResult]) -> anyhow::Result<(serde_json::Value, String)> {
    let exact = summarize(runs, EXACT);
    let jitter = summarize(runs, JITTER);
    let get = |v: &[Summary], a: Approach| v.iter().find(|x| x.approach == a).cloned();
    let fast = get(&exact, Approach::Fast).context("static-fast ran")?;
    plot::io(&out.join("io_activity.svg"), s, &exact)?;
    plot::cost(&out.join("cost.svg"), &exact)?;
    let approaches = |v: &[Summary], fast: &Summary| -> serde_json::Map<String, serde_json::Value> {
        v.iter()
            .map(|x| {
                let t = x.typical();
                let j = serde_json::json!({
                    "completion_s": x.completion.median, "cost_agbs": x.agbs.median, "cost_usd": x.usd.median,
                    "overhead_pct": (x.completion.median / fast.completion.median - 1.0) * 100.0,
                    "cost_vs_static_fast_pct": x.agbs.median / fast.agbs.median * 100.0,
                    "spread": {"completion_s": [x.completion.min, x.completion.max], "cost_agbs": [x.agbs.min, x.agbs.max]},
                    "verified_bytes": x.runs.iter().map(|r| r.verified_bytes).min().unwrap_or(0),
                    "bursts": t.bursts, "cache_sizes_gib": t.cache_sizes.iter().map(|&b| b as f64 / GIB as f64).collect::<Vec<_>>(),
                    "runs": x.runs,
                });
                (x.approach.name().to_string(), j)
            })
            .collect()
    };
    let ad = get(&exact, Approach::Adaptive).context("adaptive ran")?;
    let sizes: Vec<f64> = ad.typical().cache_sizes.iter().map(|&b| b as f64 / GIB as f64).collect();
    let mut json = serde_json::json!({
        "experiment": "elastic",
        "quick": quick,
        "reps": reps,
        "setting": s,
        "approaches": approaches(&exact, &fast),
        "cache_sizes_gib": sizes,
        "cache_sizes_gib_full_scale": sizes.iter().map(|g| g / s.scale).collect::<Vec<_>>(),
        "decisions": ad.typical().decisions,
        "timeline": exact.iter().map(|x| (x.approach.name().to_string(), serde_json::to_value(&x.typical().samples).unwrap_or_default())).collect::<serde_json::Map<_, _>>(),
    });
    if let Some(jf) = get(&jitter, Approach::Fast) {
        json["variants"] = serde_json::json!({"jitter": {"compute_jitter": JITTER.jitter, "approaches": approaches(&jitter, &jf)}});
    }
    Ok((json, super::replica_md::markdown(s, quick, reps, &exact, &jitter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_writes_the_papers_bursts_at_scale() {
        let s = Setting::new(0.05);
        let c = application(&s, EXACT, "nbd+unix:///app?socket=/x");
        // 2.25 GiB x 0.05 / 4 writers = 28.8 MiB -> 28 whole MiB each.
        assert_eq!(c.burst_bytes, vec![28 * MIB, 44 * MIB, 44 * MIB, 44 * MIB]);
        assert_eq!(c.size, Some(160 * MIB));
        assert_eq!((c.start_delay, c.think), (Duration::from_millis(1500), Duration::from_millis(17_500)));
        assert!(c.flush_each_burst && c.numjobs == 4 && c.iodepth == 1);
        assert!(160 * MIB * 4 <= (50.0 * GIB as f64 * 0.05) as u64, "the regions fit the scaled volume");
        assert_eq!(application(&s, JITTER, "x").think_jitter, 0.25);
    }

    #[test]
    fn the_daemons_are_started_with_the_daemons_defaults() {
        let s = Setting::new(0.05);
        let d = daemon_spec(&s, Approach::Adaptive);
        assert_eq!(d.args(), ["--export", "app=elastic:backing=reserved:50GiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s", "--local-scale", "time=0.05,rate=1"]);
        assert!(daemon_spec(&s, Approach::AdaptiveNoLearn).args()[1].ends_with(",learn=false"));
    }
}
