//! results.json, report.md and the plots of the streaming experiment.

use super::cost::{self, Cost, Pricing};
use super::paired::{self, PairSample, Pattern};
use super::readahead::{self, RaSample};
use super::{Config, Plan, Sample, METRICS};
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

#[derive(Debug, Serialize, Deserialize)]
pub struct Setup {
    pub rtt_us: f64,
    #[serde(rename = "image_build_s")]
    pub image_s: f64,
    pub image_files: u64,
    pub image_file_bytes: u64,
    pub boot_files: usize,
    pub boot_bytes: u64,
    pub total_s: f64,
}

/// MB/s of local-raw's image copies over the link (their mean).
fn link_rate(samples: &BTreeMap<Config, Vec<Sample>>) -> Option<f64> {
    let rates: Vec<f64> = samples.get(&Config::LocalRaw).into_iter().flatten().filter(|s| s.copy_s > 0.0).map(|s| s.link_bytes as f64 / s.copy_s / 1e6).collect();
    (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
}

/// What a run measured: its plan, setup, samples, read-ahead check and paired rounds.
pub type Record = (Plan, Setup, BTreeMap<Config, Vec<Sample>>, Vec<RaSample>, Vec<PairSample>);

/// The record in the results.json in `out`.
pub fn read(out: &Path) -> anyhow::Result<Record> {
    let path = out.join("results.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(v["experiment"] == "streaming", "{} is not from the streaming experiment", path.display());
    let plan = Plan::deserialize(&v["plan"]).context("results.json: plan")?;
    let setup = Setup::deserialize(&v["setup"]).context("results.json: setup")?;
    let mut samples = BTreeMap::new();
    for (name, c) in v["configs"].as_object().context("results.json: no configs")? {
        let cfg = Config::named(name).with_context(|| format!("results.json: unknown configuration {name:?}"))?;
        samples.insert(cfg, Vec::<Sample>::deserialize(&c["samples"]).with_context(|| format!("results.json: samples of {name}"))?);
    }
    let ra = match v.get("readahead_check") {
        Some(r) => Vec::<RaSample>::deserialize(&r["samples"]).context("results.json: readahead_check.samples")?,
        None => Vec::new(),
    };
    let pairs = match v.get("paired_run") {
        Some(r) => Vec::<PairSample>::deserialize(&r["samples"]).context("results.json: paired_run.samples")?,
        None => Vec::new(),
    };
    Ok((plan, setup, samples, ra, pairs))
}

pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A bar on a terminal; hidden (lines still print) otherwise.
pub fn progress_bar(total: u64) -> indicatif::ProgressBar {
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(indicatif::ProgressStyle::with_template("streaming [{bar:30}] {pos}/{len} runs, {elapsed} {msg}").expect("static template").progress_chars("=> "));
    bar.enable_steady_tick(std::time::Duration::from_millis(500));
    bar
}

/// A line above the bar (on stderr when there is no terminal).
pub fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// (median, min, max) of one metric over a configuration's runs.
fn stats(samples: &[Sample], metric: &str) -> (f64, f64, f64) {
    stats_of(samples, |s| s.metric(metric))
}

/// How much better `cfg` is than `base` on a metric (> 1: better).
fn advantage(metric: &str, higher_is_better: bool, cfg: f64, base: f64) -> f64 {
    let _ = metric;
    if higher_is_better {
        cfg / base
    } else {
        base / cfg
    }
}

struct Check {
    what: String,
    value: String,
    target: String,
    ok: bool,
}

/// The issue's run-time bound on the paired figures: surge-cow's median ratio
/// to local-raw over the rounds, per pattern.
fn paired_checks(plan: &Plan, pairs: &[PairSample]) -> Vec<Check> {
    let m = paired::median_ratios(pairs, &plan.paired_configs);
    let mut out: Vec<Check> = Pattern::ALL
        .iter()
        .filter_map(|p| {
            let r = *m.get(&(*p, Config::SurgeCow.name().to_string()))?;
            let spread = paired::ratios(pairs, *p, Config::LocalRaw.name(), Config::SurgeCow.name());
            let (lo, hi) = spread.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
            Some(Check {
                what: format!("surge-cow vs local-raw, paired {} ({} rounds)", p.name(), spread.len()),
                value: format!("{:+.1} % [{:+.1}, {:+.1}]", (r - 1.0) * 100.0, (lo - 1.0) * 100.0, (hi - 1.0) * 100.0),
                target: ">= -10 % (aim -5 %)".into(),
                ok: r >= 0.9,
            })
        })
        .collect();
    // The 2x over qemu-qcow2 on random writes, when it ran in the rounds (full run).
    let q = paired::ratios(pairs, Pattern::Randwrite, Config::QemuQcow2.name(), Config::SurgeCow.name());
    if !q.is_empty() {
        let (lo, hi) = q.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let r = median(&mut q.clone());
        out.push(Check { what: format!("surge-cow vs qemu-qcow2, paired randwrite ({} rounds)", q.len()), value: format!("{r:.2}x [{lo:.2}, {hi:.2}]"), target: ">= 2x".into(), ok: r >= 2.0 });
    }
    out
}

fn checks(med: &BTreeMap<&str, BTreeMap<&str, f64>>) -> Vec<Check> {
    let mut out = Vec::new();
    if !["local-raw", "surge-cow", "qemu-qcow2"].iter().all(|c| med.contains_key(c)) {
        return out; // a partial run (SURGE_STREAMING_CONFIGS)
    }
    let m = |c: &str, k: &str| med[c][k];
    let speedup = m("local-raw", "provision_s") / m("surge-cow", "provision_s");
    out.push(Check {
        what: "surge-cow provisions faster than local-raw with its copy".into(),
        value: format!("{speedup:.1}x ({:.2} s vs {:.2} s)", m("surge-cow", "provision_s"), m("local-raw", "provision_s")),
        target: ">= 10x".into(),
        ok: speedup >= 10.0,
    });
    for (k, hib) in METRICS.iter().skip(1) {
        let a = advantage(k, *hib, m("surge-cow", k), m("local-raw", k));
        out.push(Check {
            what: format!("surge-cow vs local-raw, {k}"),
            value: format!("{:+.1} %", (a - 1.0) * 100.0),
            target: ">= -10 % (aim -5 %)".into(),
            ok: a >= 0.9,
        });
    }
    let q = m("surge-cow", "randwrite_iops") / m("qemu-qcow2", "randwrite_iops");
    out.push(Check {
        what: "surge-cow vs qemu-qcow2, 4 KiB random writes".into(),
        value: format!("{q:.2}x ({:.0} vs {:.0} IOPS)", m("surge-cow", "randwrite_iops"), m("qemu-qcow2", "randwrite_iops")),
        target: ">= 2x".into(),
        ok: q >= 2.0,
    });
    out
}

pub fn write(out: &Path, plan: &Plan, setup: &Setup, samples: &BTreeMap<Config, Vec<Sample>>, ra: &[RaSample], pairs: &[PairSample]) -> anyhow::Result<()> {
    let pricing = Pricing::list();
    let costs: BTreeMap<Config, Vec<Cost>> = samples.iter().map(|(c, v)| (*c, v.iter().map(|x| cost::of(&pricing, x)).collect())).collect();
    let mut configs = serde_json::Map::new();
    let mut med: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
    for (cfg, s) in samples {
        let mut o = serde_json::Map::new();
        let mut spread = serde_json::Map::new();
        for (k, _) in METRICS {
            let (m, lo, hi) = stats(s, k);
            o.insert(k.into(), json!(m));
            spread.insert(k.into(), json!([lo, hi]));
            med.entry(cfg.name()).or_default().insert(k, m);
        }
        let (copy, _, _) = stats_of(s, |x| x.copy_s);
        let (link, _, _) = stats_of(s, |x| x.link_bytes as f64);
        o.insert("copy_s".into(), json!(copy));
        o.insert("link_bytes".into(), json!(link));
        o.insert("spread".into(), serde_json::Value::Object(spread));
        let mut c = serde_json::Map::new();
        let mut c_spread = serde_json::Map::new();
        for (k, f) in cost::FIELDS {
            let (m, lo, hi) = median_min_max(costs[cfg].iter().map(f).collect());
            c.insert(k.into(), json!(m));
            c_spread.insert(k.into(), json!([lo, hi]));
        }
        c.insert("spread".into(), serde_json::Value::Object(c_spread));
        o.insert("cost".into(), serde_json::Value::Object(c));
        o.insert("samples".into(), serde_json::to_value(s)?);
        configs.insert(cfg.name().into(), serde_json::Value::Object(o));
    }
    let mut checks = checks(&med);
    checks.extend(paired_checks(plan, pairs));
    let mut setup_json = serde_json::to_value(setup)?;
    setup_json["application"] = json!("fio, pgbench (PostgreSQL) and sort as their users run them, on ext4 in the guest's view of the volume: nbdfuse + loop (direct I/O) over NBD to each server (surge serve, qemu-nbd, nbdkit) on a unix socket; the base image is served over NBD across a veth pair shaped with tbf");
    let mut deviations = vec![json!({"setting": "none for surge's exports (cow: with its defaults; cor,stream is the surge-cow-cor configuration under test)", "reason": "-"})];
    if let Ok(more) = std::env::var("SURGE_STREAMING_COW_OPTS") {
        deviations.push(json!({"setting": format!("cow options {more} (SURGE_STREAMING_COW_OPTS)"), "reason": "set by whoever ran this experiment"}));
    }
    setup_json["deviations"] = json!(deviations);
    let mut results = json!({
        "experiment": "streaming",
        "plan": plan,
        "setup": setup_json,
        "prices": pricing,
        "configs": configs,
        "checks": checks.iter().map(|c| json!({ "what": c.what, "value": c.value, "target": c.target, "ok": c.ok })).collect::<Vec<_>>(),
    });
    if !ra.is_empty() {
        results["readahead_check"] = readahead::to_json(ra);
    }
    if !pairs.is_empty() {
        results["paired"] = paired::to_json(pairs, &plan.paired_configs);
        results["paired_run"] = json!({ "configs": plan.paired_configs, "rounds": plan.paired_rounds, "secs": plan.paired_secs, "pg_secs": plan.paired_pg_secs, "samples": pairs });
    }
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    plot_provision(&out.join("provision.svg"), &med)?;
    plot_runtime(&out.join("runtime.svg"), &med)?;
    let text = report(plan, setup, samples, &costs, &checks, &pricing, ra, pairs);
    std::fs::write(out.join("report.md"), &text)?;
    println!("{text}");
    println!("results: {}; plots: provision.svg, runtime.svg", out.join("results.json").display());
    Ok(())
}

fn stats_of(s: &[Sample], f: impl Fn(&Sample) -> f64) -> (f64, f64, f64) {
    median_min_max(s.iter().map(f).collect())
}

fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    (median(&mut v), lo, hi)
}

fn fmt_metric(k: &str, v: f64) -> String {
    match k {
        "provision_s" | "sort_s" => format!("{v:.2}"),
        "seqread_mbps" | "seqwrite_mbps" => format!("{v:.0}"),
        _ => format!("{v:.0}"),
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

#[allow(clippy::too_many_arguments)]
fn report(plan: &Plan, setup: &Setup, samples: &BTreeMap<Config, Vec<Sample>>, costs: &BTreeMap<Config, Vec<Cost>>, checks: &[Check], pricing: &Pricing, ra: &[RaSample], pairs: &[PairSample]) -> String {
    let mut s = String::new();
    let runs = if plan.reps == 1 {
        format!("{}: one run per configuration", if plan.quick { "--quick" } else { "full scale" })
    } else {
        format!("{} scale, {} rounds, configurations interleaved (each round starts with the next one), medians with [min, max]", if plan.quick { "--quick" } else { "full" }, plan.reps)
    };
    let _ = writeln!(s, "# Streaming volumes: provisioning and run-time cost\n");
    let _ = writeln!(s, "{runs}; {:.0} s in all.\n", setup.total_s);
    let skipped: Vec<&str> = Config::ALL.iter().filter(|c| !samples.contains_key(c)).map(|c| c.name()).collect();
    if !skipped.is_empty() {
        let _ = writeln!(s, "Configurations not run (a subset, `SURGE_STREAMING_CONFIGS`): {}.\n", skipped.join(", "));
    }
    let _ = writeln!(s, "## Results (median [min, max])\n");
    let _ = writeln!(s, "| config | provision s | copy s | 4K randread IOPS | 4K randwrite IOPS | 1M seqread MB/s | 1M seqwrite MB/s | pgbench tps | sort s | over the link |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for (cfg, v) in samples {
        let _ = write!(s, "| {} |", cfg.name());
        for (i, (k, _)) in METRICS.iter().enumerate() {
            let (m, lo, hi) = stats(v, k);
            let cell = if v.len() > 1 { format!("{} [{}, {}]", fmt_metric(k, m), fmt_metric(k, lo), fmt_metric(k, hi)) } else { fmt_metric(k, m) };
            let _ = write!(s, " {cell} |");
            if i == 0 {
                let _ = write!(s, " {:.2} |", stats_of(v, |x| x.copy_s).0);
            }
        }
        let _ = writeln!(s, " {} |", gib(stats_of(v, |x| x.link_bytes as f64).0 as u64));
    }
    let _ = writeln!(s, "\n## Relative to local-raw (higher is better; provisioning and sort as speed-ups)\n");
    let base = samples.get(&Config::LocalRaw);
    let _ = writeln!(s, "| config | {} |", METRICS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(METRICS.len()));
    for (cfg, v) in samples {
        let _ = write!(s, "| {} |", cfg.name());
        for (k, hib) in METRICS {
            let a = base.map(|b| advantage(k, hib, stats(v, k).0, stats(b, k).0)).unwrap_or(f64::NAN);
            let _ = write!(s, " {a:.2}x |");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "\n## Targets\n");
    let _ = writeln!(s, "| check | measured | target | |");
    let _ = writeln!(s, "|---|---|---|---|");
    for c in checks {
        let _ = writeln!(s, "| {} | {} | {} | {} |", c.what, c.value, c.target, if c.ok { "met" } else { "**NOT MET**" });
    }
    paired::section(&mut s, plan, pairs, &plan.paired_configs);
    cpu_section(&mut s, samples);
    cost_section(&mut s, costs, pricing);
    readahead::section(&mut s, ra);
    let _ = writeln!(s, "\n## Setup and scale\n");
    let _ = writeln!(s, "- Storage node: `surge serve` (default settings) in its own network namespace, base image exported read-only over TCP.");
    let delay = if plan.delay_us > 0 {
        format!("{} µs one-way delay added by a userspace delay line", plan.delay_us)
    } else {
        "no delay added (this kernel has no `sch_netem`; a userspace delay line, `SURGE_STREAMING_DELAY_US`, distorted results under this machine's CPU load far beyond its nominal delay, so it is off)".to_string()
    };
    let _ = writeln!(
        s,
        "- Link: veth pair into the storage node's namespace, `tc tbf rate {}mbit burst 256kb` on both ends (measured: {}), {delay}; measured 4 KiB NBD read round trip: {:.0} µs (a physical Gigabit LAN adds some 50-150 µs more).",
        plan.link_mbit,
        link_rate(samples).map_or("n/a".to_string(), |r| format!("{r:.0} MB/s for the image copy")),
        setup.rtt_us
    );
    let _ = writeln!(
        s,
        "- Base image: ext4 (`mkfs.ext4 -d`), {} virtual, holding {} real files ({}) from this machine's /usr; built in {:.1} s (not counted). Boot set: {} files, {:.1} MiB, read by `xargs -P {} cat`.",
        gib(plan.image_bytes),
        setup.image_files,
        gib(setup.image_file_bytes),
        setup.image_s,
        setup.boot_files,
        setup.boot_bytes as f64 / (1 << 20) as f64,
        super::work::BOOT_READERS
    );
    let _ = writeln!(s, "- Volumes reach the applications as a kernel block device: nbdfuse + loop (direct I/O) + ext4 (no nbd module on this machine). Every server runs with its default settings: surge buffered (host page cache on), qemu-nbd `cache=writeback`, nbdkit cow filter with its 64 KiB blocks; surge cow granularity 4 KiB; the stream job of `surge-cow-cor` unthrottled.");
    let _ = writeln!(s, "- Provisioning: from starting the volume's server (local-raw: from starting `nbdcopy` of the image; surge-persistent: from copying the image on the storage node) until the boot set has been read.");
    let _ = writeln!(
        s,
        "- fio: libaio, direct=1; 4 KiB random at iodepth 16 for {} s: reads over a {} MiB file fio lays out first, writes to a new (fallocated) {} MiB file, so most writes are the first to their area; 1 MiB sequential at iodepth 4: reads {} s over the laid-out file, writes a new {} MiB file with a final fsync.",
        plan.fio_secs,
        plan.fio_read_bytes >> 20,
        plan.fio_randwrite_bytes >> 20,
        plan.fio_secs,
        plan.fio_seqwrite_bytes >> 20
    );
    let _ = writeln!(s, "- pgbench: PostgreSQL (default configuration, data directory on the volume; `initdb -N` only to make setup faster), scale {}, {} clients, 2 threads, {} s.", plan.pg_scale, plan.pg_clients, plan.pg_secs);
    let _ = writeln!(
        s,
        "- Sort: {} of 100-byte records (10-byte random keys) written to the volume, file system remounted (cold guest cache), then GNU `sort --buffer-size={} --parallel=2` (LC_ALL=C) with temporary files on the volume, timed until its output is synced.",
        gib(plan.sort_bytes),
        plan.sort_buffer
    );
    if plan.quick {
        let full = Plan::new(false);
        let _ = writeln!(
            s,
            "- `--quick` scale vs the full run: image {} with {} of files (full {} with {}), fio read/random-write/sequential-write files {}/{}/{} MiB for {} s (full {}/{}/{} MiB, {} s), pgbench scale {} for {} s (full {} for {} s), sort {} with {} (full {} with {}), {} (full 3).",
            gib(plan.image_bytes),
            gib(plan.file_bytes),
            gib(full.image_bytes),
            gib(full.file_bytes),
            plan.fio_read_bytes >> 20,
            plan.fio_randwrite_bytes >> 20,
            plan.fio_seqwrite_bytes >> 20,
            plan.fio_secs,
            full.fio_read_bytes >> 20,
            full.fio_randwrite_bytes >> 20,
            full.fio_seqwrite_bytes >> 20,
            full.fio_secs,
            plan.pg_scale,
            plan.pg_secs,
            full.pg_scale,
            full.pg_secs,
            gib(plan.sort_bytes),
            plan.sort_buffer,
            gib(full.sort_bytes),
            full.sort_buffer,
            if plan.reps == 1 { "one run".to_string() } else { format!("{} rounds", plan.reps) }
        );
    }
    let _ = writeln!(s, "- `sync` (not timed) before each phase and each fio pattern, so no phase pays for the previous one's dirty data.");
    let _ = writeln!(s, "- The machine is shared (2 cores); timings include that noise.");
    s
}

/// The fio patterns, in the order of [`Sample::server_cpu_us`].
const CPU_PATTERNS: [&str; 4] = ["4K randread", "4K randwrite", "1M seqread", "1M seqwrite"];

/// The serving process's CPU per I/O: a figure that, unlike the rates, hardly
/// moves with what else runs on the machine (issue 40 item 10).
fn cpu_section(s: &mut String, samples: &BTreeMap<Config, Vec<Sample>>) {
    let measured = |v: &[Sample]| v.iter().any(|x| x.server_cpu_us.iter().any(|&c| c > 0.0));
    if !samples.values().any(|v| measured(v)) {
        return;
    }
    let _ = writeln!(s, "\n## The serving process's CPU per I/O (µs, median [min, max])\n");
    let _ = writeln!(s, "The process serving the volume on the compute side (`surge serve`, qemu-nbd or nbdkit; not the guest path, nbdfuse and loop, nor the storage node), its user + system CPU time during each fio pattern over the pattern's I/Os.\n");
    let _ = writeln!(s, "| config | {} |", CPU_PATTERNS.join(" | "));
    let _ = writeln!(s, "|---|---|---|---|---|");
    for (cfg, v) in samples.iter().filter(|(_, v)| measured(v)) {
        let _ = write!(s, "| {} |", cfg.name());
        for i in 0..CPU_PATTERNS.len() {
            let (m, lo, hi) = stats_of(v, |x| x.server_cpu_us[i]);
            let _ = write!(s, " {m:.1} [{lo:.1}, {hi:.1}] |");
        }
        let _ = writeln!(s);
    }
    if let (Some(raw), Some(cow)) = (samples.get(&Config::LocalRaw), samples.get(&Config::SurgeCow)) {
        let ratios: Vec<String> = (0..CPU_PATTERNS.len())
            .map(|i| format!("{} {:.2}x", CPU_PATTERNS[i], stats_of(cow, |x| x.server_cpu_us[i]).0 / stats_of(raw, |x| x.server_cpu_us[i]).0))
            .collect();
        let _ = writeln!(s, "\nsurge-cow against local-raw (both `surge serve`: a cow volume against a file export): {}.", ratios.join(", "));
    }
}

fn usd(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v >= 0.1 {
        format!("${v:.2}")
    } else {
        format!("${v:.5}")
    }
}

fn cost_section(s: &mut String, costs: &BTreeMap<Config, Vec<Cost>>, p: &Pricing) {
    let _ = writeln!(s, "\n## Cost (computed from the measured seconds and bytes at list prices; median [min, max])\n");
    let _ = writeln!(s, "| config | provisioning | sort | per million pgbench transactions | job: provision + boot + sort | job vs local-raw | image bytes, storage node in another zone |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let job = |c: &Config| costs.get(c).map(|v| median_min_max(v.iter().map(|x| x.job_usd).collect()).0);
    for (cfg, v) in costs {
        let _ = write!(s, "| {} |", cfg.name());
        for (k, f) in cost::FIELDS {
            let (m, lo, hi) = median_min_max(v.iter().map(f).collect());
            let cell = if v.len() > 1 { format!("{} [{}, {}]", usd(m), usd(lo), usd(hi)) } else { usd(m) };
            let _ = write!(s, " {cell} |");
            if k == "job_usd" {
                let rel = job(&Config::LocalRaw).map_or(f64::NAN, |b| m / b);
                let _ = write!(s, " {rel:.2}x |");
            }
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nThe compute node is an EC2 `{}` (2 vCPUs, 8 GiB, like this machine) at ${}/hour on demand (Linux, us-east-1, <https://aws.amazon.com/ec2/pricing/on-demand/>), billed per second while it waits for its volume and while it sorts; pgbench ran for a fixed time on every configuration, so it is priced per transaction. Image bytes between instances: ${}/GB within a zone, ${}/GB each way across zones (both sides billed); the job column assumes one zone. Storage is not priced: the base image is kept once on the storage node for every configuration; local-raw's copy and the overlays sit on the compute node's local disk, surge-persistent's copy on the storage node.",
        p.instance, p.instance_usd_hour, p.transfer.same_az_gb, p.transfer.cross_az_gb_each_way
    );
}

fn plot_provision(path: &Path, med: &BTreeMap<&str, BTreeMap<&str, f64>>) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let names: Vec<&str> = med.keys().copied().collect();
    let max = med.values().map(|m| m["provision_s"]).fold(0.0f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("Provisioning: until the 64 MiB boot set is read (s, lower is better)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..names.len() as f64, 0f64..max.max(0.1))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|x| names.get(*x as usize).map(|n| n.to_string()).unwrap_or_default())
        .y_desc("seconds")
        .draw()?;
    for (i, n) in names.iter().enumerate() {
        let v = med[n]["provision_s"];
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new([(x + 0.15, 0.0), (x + 0.85, v)], Palette99::pick(i).filled())))?;
        chart.draw_series(std::iter::once(Text::new(format!("{v:.2}"), (x + 0.3, v + max * 0.02), ("sans-serif", 14))))?;
    }
    root.present()?;
    Ok(())
}

fn plot_runtime(path: &Path, med: &BTreeMap<&str, BTreeMap<&str, f64>>) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let Some(base) = med.get("local-raw") else { return Ok(()) };
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let metrics: Vec<(&str, bool)> = METRICS.iter().skip(1).copied().collect();
    let names: Vec<&str> = med.keys().copied().collect();
    let vals: Vec<Vec<f64>> = metrics.iter().map(|(k, hib)| names.iter().map(|n| advantage(k, *hib, med[n][k], base[k])).collect()).collect();
    let ymax = vals.iter().flatten().copied().filter(|v| v.is_finite()).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Run time relative to local-raw (1.0 = equal, higher is better; sort as speed-up)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..metrics.len() as f64, 0f64..ymax)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(metrics.len())
        .x_label_formatter(&|x| metrics.get(*x as usize).map(|m| m.0.to_string()).unwrap_or_default())
        .draw()?;
    let w = 0.8 / names.len() as f64;
    for (j, n) in names.iter().enumerate() {
        let color = Palette99::pick(j);
        chart
            .draw_series(metrics.iter().enumerate().map(|(i, _)| {
                let x = i as f64 + 0.1 + j as f64 * w;
                Rectangle::new([(x, 0.0), (x + w * 0.9, vals[i][j].min(ymax))], color.filled())
            }))?
            .label(*n)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart.draw_series(LineSeries::new([(0.0, 1.0), (metrics.len() as f64, 1.0)], BLACK))?;
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(p: f64, rw: f64, sort: f64) -> Sample {
        Sample { provision_s: p, randread_iops: 100.0, randwrite_iops: rw, seqread_mbps: 100.0, seqwrite_mbps: 100.0, oltp_tps: 100.0, sort_s: sort, server_cpu_us: [20.0, rw / 20.0, 100.0, 200.0], ..Default::default() }
    }

    #[test]
    fn a_report_rewritten_from_results_json_is_the_report_of_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan::new(true);
        let setup = Setup { rtt_us: 60.0, image_s: 20.0, image_files: 10, image_file_bytes: 1 << 30, boot_files: 5, boot_bytes: 64 << 20, total_s: 500.0 };
        let mut samples = BTreeMap::new();
        samples.insert(Config::LocalRaw, vec![Sample { copy_s: 19.0, link_bytes: 6 << 30, ..sample(20.0, 1000.0, 10.0) }, sample(22.0, 900.0, 11.0)]);
        samples.insert(Config::SurgeCow, vec![sample(1.5, 950.0, 10.9)]);
        let ra = vec![RaSample { workload: readahead::Workload::Scan, setting: "default".into(), round: 0, bytes: 64 << 20, seconds: 1.25, link_bytes: 70_000_000 }];
        let pairs: Vec<PairSample> = (0..2)
            .flat_map(|r| {
                [("local-raw", 1000.0), ("surge-cow", 700.0 + 200.0 * r as f64)]
                    .map(|(c, rate)| PairSample { pattern: Pattern::Randwrite, config: c.into(), round: r, rate, ops: rate, cpu_s: 0.01 })
            })
            .collect();
        write(dir.path(), &plan, &setup, &samples, &ra, &pairs).unwrap();
        let first = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(first.contains("## Cost") && first.contains("m5.large"), "{first}");
        assert!(first.contains("not run (a subset, `SURGE_STREAMING_CONFIGS`): surge-cow-cor, surge-persistent, qemu-qcow2, nbdkit-cow."), "{first}");
        assert!(first.contains("| local-raw | 20.0 [20.0, 20.0] | 47.5 [45.0, 50.0] |"), "{first}");
        assert!(first.contains("4K randwrite 1.00x"), "{first}");
        assert!(first.contains("| scan | 64 | ") && first.contains("1.25 s [1.25, 1.25], 70 MB"), "{first}");
        assert!(first.contains("| surge-cow vs local-raw, paired randwrite (2 rounds) | -20.0 % [-30.0, -10.0] | >= -10 % (aim -5 %) | **NOT MET** |"), "{first}");
        let (plan2, setup2, samples2, ra2, pairs2) = read(dir.path()).unwrap();
        assert_eq!(ra2.len(), 1);
        assert_eq!(pairs2.len(), 4);
        assert_eq!(plan2.image_bytes, plan.image_bytes);
        assert_eq!(setup2.image_s, 20.0);
        assert_eq!(samples2[&Config::LocalRaw].len(), 2);
        assert_eq!(samples2[&Config::LocalRaw][0].link_bytes, 6 << 30);
        std::fs::remove_file(dir.path().join("report.md")).unwrap();
        write(dir.path(), &plan2, &setup2, &samples2, &ra2, &pairs2).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("report.md")).unwrap(), first);
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap()).unwrap();
        assert!((v["paired"]["randwrite"]["surge-cow"]["median_ratio"].as_f64().unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(v["paired_run"]["rounds"], plan.paired_rounds);
        let job = |c: &str| v["configs"][c]["cost"]["job_usd"].as_f64().unwrap();
        assert!((job("surge-cow") - (1.5 + 10.9) * 0.096 / 3600.0).abs() < 1e-12, "boot and sort on an m5.large");
        assert!(job("surge-cow") < job("local-raw") / 2.0, "a 1.5 s boot against 20-22 s");
        std::fs::write(dir.path().join("results.json"), r#"{"experiment": "elastic"}"#).unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains("not from the streaming experiment"));
    }

    #[test]
    fn paired_checks_compare_rounds_with_local_raw_and_random_writes_with_qcow2() {
        let mut plan = Plan::new(false);
        let mut pairs = Vec::new();
        for r in 0..3 {
            for (c, rw, rr) in [("local-raw", 1000.0, 1000.0), ("surge-cow", 950.0, 850.0 - 100.0 * r as f64), ("qemu-qcow2", 410.0 + 100.0 * r as f64, 900.0)] {
                pairs.push(PairSample { pattern: Pattern::Randwrite, config: c.into(), round: r, rate: rw, ops: rw, cpu_s: 0.01 });
                pairs.push(PairSample { pattern: Pattern::Randread, config: c.into(), round: r, rate: rr, ops: rr, cpu_s: 0.01 });
            }
        }
        let c = paired_checks(&plan, &pairs);
        let find = |w: &str| c.iter().find(|c| c.what.contains(w)).unwrap_or_else(|| panic!("no check {w}"));
        assert!(find("paired randwrite").ok, "0.95 of local-raw in every round");
        assert!(!find("paired randread").ok, "0.75 of local-raw in the middle round");
        assert_eq!(find("paired randread").value, "-25.0 % [-35.0, -15.0]");
        // Per round 950/410, 950/510, 950/610: median 1.86x.
        let q = find("qemu-qcow2, paired randwrite (3 rounds)");
        assert!(!q.ok && q.value == "1.86x [1.56, 2.32]", "{}", q.value);
        plan.paired_configs.retain(|c| c != "qemu-qcow2");
        pairs.retain(|p| p.config != "qemu-qcow2");
        assert!(paired_checks(&plan, &pairs).iter().all(|c| !c.what.contains("qcow2")));
    }

    #[test]
    fn median_handles_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn checks_follow_the_issue_targets() {
        let mut med: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
        let put = |med: &mut BTreeMap<&str, BTreeMap<&str, f64>>, n, s: Sample| {
            med.insert(n, METRICS.iter().map(|(k, _)| (*k, s.metric(k))).collect());
        };
        put(&mut med, "local-raw", sample(20.0, 1000.0, 10.0));
        put(&mut med, "surge-cow", sample(1.5, 950.0, 10.9));
        put(&mut med, "qemu-qcow2", sample(1.5, 400.0, 12.0));
        let c = checks(&med);
        assert!(c[0].ok, "13x provisioning");
        assert!(c.iter().filter(|c| c.what.contains("local-raw,")).all(|c| c.ok), "within 10 %");
        assert!(c.last().unwrap().ok, "2.4x qcow2");
        put(&mut med, "surge-cow", sample(2.5, 750.0, 11.5));
        let c = checks(&med);
        assert!(!c[0].ok, "8x provisioning");
        assert!(!c.last().unwrap().ok, "1.9x qcow2");
        assert!(!c.iter().find(|c| c.what.ends_with("randwrite_iops")).unwrap().ok);
        assert!(!c.iter().find(|c| c.what.ends_with("sort_s")).unwrap().ok, "sort 15 % slower");
    }
}
