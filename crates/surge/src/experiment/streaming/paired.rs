//! Paired rounds (issue 40 item 10): the gated configurations measured back
//! to back. One run per configuration, minutes apart, swings by tens of per
//! cent on a shared machine; here every compared volume is provisioned once
//! and kept mounted, and each pattern runs in short rounds, the
//! configurations one after another in an order rotated every round (for two,
//! A B, B A, A B, ...: ABBA). A round's ratio compares runs seconds apart, so
//! load that lasts longer than a round cancels out; the median over rounds
//! and its spread (min..max) are reported. The serving process's CPU per I/O
//! is pooled over the rounds (every round's CPU over every round's I/Os).
//!
//! Patterns: fio's four (4 KiB random read, 4 KiB random write, 1 MiB
//! sequential read and write), pgbench, and `rewrite`: the same 4 KiB random
//! writes over a file every block of which is already written. Each round's
//! `randwrite` and `seqwrite` go to a new file, so they are first writes (for
//! a cow volume: to blocks its overlay does not hold yet, the case of a VM
//! that has just been provisioned); `rewrite` is the same I/O on blocks the
//! overlay holds, so the two show what first writes cost.

use super::proc::{shell, Proc};
use super::work::{self, fio_json, job};
use super::{guest, report, Config, Plan, Rig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Randread,
    Randwrite,
    Rewrite,
    Seqread,
    Seqwrite,
    Pgbench,
}

impl Pattern {
    pub const ALL: [Pattern; 6] = [Pattern::Randread, Pattern::Randwrite, Pattern::Rewrite, Pattern::Seqread, Pattern::Seqwrite, Pattern::Pgbench];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::Randread => "randread",
            Pattern::Randwrite => "randwrite",
            Pattern::Rewrite => "rewrite",
            Pattern::Seqread => "seqread",
            Pattern::Seqwrite => "seqwrite",
            Pattern::Pgbench => "pgbench",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Pattern::Randread => "4 KiB random reads, iodepth 16, over the laid-out read file",
            Pattern::Randwrite => "4 KiB random writes, iodepth 16, to a new (fallocated) file each round: first writes",
            Pattern::Rewrite => "the same writes over a file written whole before the rounds: every block already in the overlay",
            Pattern::Seqread => "1 MiB sequential reads, iodepth 4, over the laid-out read file",
            Pattern::Seqwrite => "1 MiB sequential writes, iodepth 4, to a new file each round, with a final fsync",
            Pattern::Pgbench => "pgbench (TPC-B-like), one cluster per volume started before the rounds",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Pattern::Seqread | Pattern::Seqwrite => "MB/s",
            Pattern::Pgbench => "tps",
            _ => "IOPS",
        }
    }

    fn per(self) -> &'static str {
        if self == Pattern::Pgbench {
            "transaction"
        } else {
            "I/O"
        }
    }
}

/// One configuration's run of one pattern in one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairSample {
    pub pattern: Pattern,
    pub config: String,
    pub round: usize,
    /// IOPS, MB/s or transactions/s.
    pub rate: f64,
    /// I/Os (transactions for pgbench) done.
    pub ops: f64,
    /// CPU seconds of the volume's serving process during the run (its final sync included).
    pub cpu_s: f64,
}

/// The order of round `round`: rotated one place each round, so for two
/// configurations A B, B A, A B, ... and each runs first as often.
pub fn order(configs: &[Config], round: usize) -> Vec<Config> {
    let mut o = configs.to_vec();
    if !o.is_empty() {
        let n = o.len();
        o.rotate_left(round % n);
    }
    o
}

/// Per round, `cfg`'s rate over `base`'s (rounds where both ran), in round order.
pub fn ratios(samples: &[PairSample], p: Pattern, base: &str, cfg: &str) -> Vec<f64> {
    let rate = |c: &str, r: usize| samples.iter().find(|s| s.pattern == p && s.config == c && s.round == r).map(|s| s.rate);
    let mut rounds: Vec<usize> = samples.iter().filter(|s| s.pattern == p).map(|s| s.round).collect();
    rounds.sort_unstable();
    rounds.dedup();
    rounds.into_iter().filter_map(|r| Some(rate(cfg, r)? / rate(base, r)?)).filter(|x| x.is_finite()).collect()
}

/// CPU µs per op of `cfg` on `p`, pooled over its rounds.
pub fn cpu_us_per_op(samples: &[PairSample], p: Pattern, cfg: &str) -> Option<f64> {
    let (cpu, ops) = samples.iter().filter(|s| s.pattern == p && s.config == cfg).fold((0.0, 0.0), |(c, o), s| (c + s.cpu_s, o + s.ops));
    (ops > 0.0 && cpu > 0.0).then(|| cpu * 1e6 / ops)
}

/// Median, min and max.
fn mmm(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (report::median(&mut v.to_vec()), lo, hi)
}

/// The configurations in the samples, the baseline (the first measured) first.
fn configs_in(samples: &[PairSample], configs: &[String]) -> Vec<String> {
    configs.iter().filter(|c| samples.iter().any(|s| &s.config == *c)).cloned().collect()
}

/// results.json's `paired`: `paired.{pattern}.{config}` with the median rate
/// and each round's rate; for every configuration after the baseline also
/// `median_ratio` (to the baseline, same round), `ratios` (per round), their
/// min and max and `cpu_ratio` (pooled CPU per op over the baseline's).
pub fn to_json(samples: &[PairSample], configs: &[String]) -> serde_json::Value {
    let configs = configs_in(samples, configs);
    let mut out = serde_json::Map::new();
    let Some(base) = configs.first() else { return serde_json::Value::Object(out) };
    for p in Pattern::ALL {
        let mut o = serde_json::Map::new();
        for c in &configs {
            let rates: Vec<f64> = samples.iter().filter(|s| s.pattern == p && &s.config == c).map(|s| s.rate).collect();
            if rates.is_empty() {
                continue;
            }
            let mut e = serde_json::json!({ "median_rate": mmm(&rates).0, "rates": rates, "cpu_us_per_op": cpu_us_per_op(samples, p, c) });
            if c != base {
                let r = ratios(samples, p, base, c);
                let (m, lo, hi) = mmm(&r);
                e["median_ratio"] = serde_json::json!(m);
                e["min_ratio"] = serde_json::json!(lo);
                e["max_ratio"] = serde_json::json!(hi);
                e["ratios"] = serde_json::json!(r);
                e["cpu_ratio"] = serde_json::json!(cpu_us_per_op(samples, p, c).zip(cpu_us_per_op(samples, p, base)).map(|(a, b)| a / b));
            }
            o.insert(c.clone(), e);
        }
        if !o.is_empty() {
            out.insert(p.name().into(), serde_json::Value::Object(o));
        }
    }
    serde_json::Value::Object(out)
}

/// report.md's section.
pub fn section(s: &mut String, plan: &Plan, samples: &[PairSample], configs: &[String]) {
    let configs = configs_in(samples, configs);
    let Some(base) = configs.first() else { return };
    let rounds = samples.iter().map(|x| x.round + 1).max().unwrap_or(0);
    let _ = writeln!(s, "\n## Paired rounds: {} against {base}, back to back\n", configs[1..].join(", "));
    let _ = writeln!(
        s,
        "Each configuration's volume provisioned once ({base}: the copy of the image its last run made, that run's workload files removed) and kept mounted; each pattern in {rounds} rounds of {} s (pgbench {} s), the configurations in an order rotated every round. Files: reads and rewrites over {} MiB files written whole before the rounds, random writes to a new {} MiB file each round, sequential writes to a new file of at most {} MiB each round. The ratio is each round's rate over {base}'s in the same round: median [min, max] over the rounds. CPU: the serving process's µs per I/O (per transaction for pgbench; from its CPU-time clock), pooled over the rounds.\n",
        plan.paired_secs,
        plan.paired_pg_secs,
        plan.fio_read_bytes >> 20,
        plan.paired_randwrite_bytes >> 20,
        if plan.paired_seqwrite_bytes > 0 { plan.paired_seqwrite_bytes } else { plan.fio_seqwrite_bytes } >> 20
    );
    let mut head = format!("| pattern | {base} |");
    let mut rule = "|---|---|".to_string();
    for c in &configs[1..] {
        let _ = write!(head, " {c} | {c} / {base} (per round) |");
        rule.push_str("---|---|");
    }
    let _ = write!(head, " CPU µs per op: {} |", configs.join(", "));
    rule.push_str("---|");
    let _ = writeln!(s, "{head}\n{rule}");
    for p in Pattern::ALL {
        let rates = |c: &str| samples.iter().filter(|x| x.pattern == p && x.config == c).map(|x| x.rate).collect::<Vec<_>>();
        if rates(base).is_empty() {
            continue;
        }
        let _ = write!(s, "| {} ({}) | {:.0} |", p.name(), p.unit(), mmm(&rates(base)).0);
        for c in &configs[1..] {
            let (m, lo, hi) = mmm(&ratios(samples, p, base, c));
            let _ = write!(s, " {:.0} | {m:.3} [{lo:.3}, {hi:.3}] |", mmm(&rates(c)).0);
        }
        let cpu: Vec<String> = configs.iter().map(|c| cpu_us_per_op(samples, p, c).map_or("-".into(), |v| format!("{v:.1}"))).collect();
        let _ = writeln!(s, " {} |", cpu.join(", "));
    }
    let _ = writeln!(s);
    for p in Pattern::ALL {
        let _ = writeln!(s, "- `{}`: {}.", p.name(), p.describe());
    }
    for c in &configs[1..] {
        let cpu = |p| cpu_us_per_op(samples, p, c).zip(cpu_us_per_op(samples, p, base)).map(|(a, b)| a / b);
        if let (Some(first), Some(again)) = (cpu(Pattern::Randwrite), cpu(Pattern::Rewrite)) {
            let (rf, ra) = (mmm(&ratios(samples, Pattern::Randwrite, base, c)).0, mmm(&ratios(samples, Pattern::Rewrite, base, c)).0);
            let _ = writeln!(
                s,
                "\nFirst writes against rewrites, {c} over {base}: rate {rf:.3}x on first writes, {ra:.3}x on rewrites; the serving process's CPU per {} {first:.2}x on first writes, {again:.2}x on rewrites.",
                Pattern::Randwrite.per()
            );
        }
    }
}

/// A volume of the paired rounds, mounted. Fields drop in order: the
/// database stops, then the file system is unmounted, then the server goes.
struct Mounted {
    pg: Option<work::Pg>,
    guest: guest::Guest,
    server: Proc,
    cfg: Config,
}

impl Mounted {
    fn bench(&self) -> PathBuf {
        self.guest.mnt.join("paired")
    }
}

/// Run the paired rounds of `plan.paired_configs` (the first is the baseline).
pub fn run(rig: &mut Rig, bar: &indicatif::ProgressBar) -> anyhow::Result<Vec<PairSample>> {
    let configs: Vec<Config> = rig.plan.paired_configs.iter().filter_map(|n| Config::named(n)).collect();
    anyhow::ensure!(configs.len() >= 2, "paired rounds need two configurations, got {:?}", rig.plan.paired_configs);
    let plan = rig.plan.clone();
    let mut vols = Vec::new();
    for cfg in &configs {
        bar.set_message(format!("paired rounds: provisioning {}", cfg.name()));
        let dir = rig.work.join(format!("paired-{}", cfg.name()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let vol = super::provision_local(rig, *cfg, &dir)?;
        let guest = guest::Guest::attach(&vol.uri, &dir)?;
        let server = vol.servers.into_iter().next().expect("one server");
        let m = Mounted { pg: None, guest, server, cfg: *cfg };
        std::fs::create_dir_all(m.bench())?;
        // The read file and the rewrite file, written whole once.
        for f in ["read.dat", "rewrite.dat"] {
            fio_json(&["--name=layout".into(), format!("--filename={}", m.bench().join(f).display()), format!("--size={}", plan.fio_read_bytes), "--rw=write".into(), "--bs=1M".into(), "--iodepth=4".into(), "--end_fsync=1".into()])?;
        }
        vols.push(m);
    }
    for m in &mut vols {
        m.pg = Some(work::Pg::start(&m.guest.mnt, "pg-paired", &plan)?);
        shell(&format!("sync -f '{}'", m.guest.mnt.display()))?;
    }
    let free = vols.iter().map(|m| free_bytes(&m.guest.mnt)).collect::<anyhow::Result<Vec<_>>>()?;
    rig.plan.paired_seqwrite_bytes = seqwrite_bytes_that_fit(&plan, free.into_iter().min().unwrap_or(0))?;
    let plan = rig.plan.clone();
    let mut out = Vec::new();
    for p in Pattern::ALL {
        for round in 0..plan.paired_rounds {
            for cfg in order(&configs, round) {
                let m = vols.iter().find(|m| m.cfg == cfg).expect("provisioned");
                bar.set_message(format!("paired rounds: {} round {} on {}", p.name(), round + 1, cfg.name()));
                let s = run_pattern(m, p, round, &plan)?;
                out.push(s);
            }
        }
        let line: Vec<String> = configs[1..].iter().map(|c| format!("{} {:.3}x", c.name(), mmm(&ratios(&out, p, configs[0].name(), c.name())).0)).collect();
        report::say(bar, format!("  paired {:<9} median ratio to {}: {}", p.name(), configs[0].name(), line.join(", ")));
    }
    drop(vols);
    for cfg in &configs {
        let _ = std::fs::remove_dir_all(rig.work.join(format!("paired-{}", cfg.name())));
    }
    Ok(out)
}

/// The size of each round's new sequential-write file: the plan's, or less
/// so that every round's new files (random and sequential) fit in `free`
/// bytes with a tenth to spare. Each round writes new files (first writes
/// into a fresh overlay are what is measured), so nothing can be reused.
fn seqwrite_bytes_that_fit(plan: &Plan, free: u64) -> anyhow::Result<u64> {
    const MIN: u64 = 16 << 20;
    let rounds = plan.paired_rounds.max(1) as u64;
    let per_round = free / 10 * 9 / rounds;
    let fits = per_round.saturating_sub(plan.paired_randwrite_bytes).min(plan.paired_seqwrite_bytes) >> 20 << 20;
    anyhow::ensure!(
        fits >= MIN,
        "the paired rounds need {} rounds of a {} MiB random-write file and a sequential-write file of at least {} MiB, but the volumes have {} MiB free",
        rounds,
        plan.paired_randwrite_bytes >> 20,
        MIN >> 20,
        free >> 20
    );
    Ok(fits)
}

/// Bytes an unprivileged writer can still allocate on the file system at `p`.
fn free_bytes(p: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(anyhow::Error::new(std::io::Error::last_os_error()).context(format!("statvfs {}", p.display())));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

fn fio_args(p: Pattern, dir: &Path, round: usize, plan: &Plan) -> Vec<String> {
    let f = |n: &str| format!("--filename={}", dir.join(n).display());
    let secs = format!("--runtime={}", plan.paired_secs);
    let (name, file, size, rw, bs, depth) = match p {
        Pattern::Randread => ("randread", f("read.dat"), plan.fio_read_bytes, "randread", "4k", 16),
        Pattern::Randwrite => ("randwrite", f(&format!("randwrite{round}.dat")), plan.paired_randwrite_bytes, "randwrite", "4k", 16),
        Pattern::Rewrite => ("rewrite", f("rewrite.dat"), plan.fio_read_bytes, "randwrite", "4k", 16),
        Pattern::Seqread => ("seqread", f("read.dat"), plan.fio_read_bytes, "read", "1M", 4),
        Pattern::Seqwrite => ("seqwrite", f(&format!("seqwrite{round}.dat")), plan.paired_seqwrite_bytes, "write", "1M", 4),
        Pattern::Pgbench => unreachable!("pgbench is not fio"),
    };
    let mut a = vec![format!("--name={name}"), file, format!("--size={size}"), format!("--rw={rw}"), format!("--bs={bs}"), format!("--iodepth={depth}"), secs];
    if p == Pattern::Seqwrite {
        // A new file each round: at most its size, at most the round's time.
        a.push("--end_fsync=1".into());
    } else {
        a.push("--time_based".into());
    }
    a
}

fn run_pattern(m: &Mounted, p: Pattern, round: usize, plan: &Plan) -> anyhow::Result<PairSample> {
    // The volume's file system only: a machine-wide sync would wait for
    // whatever else the machine writes.
    let settle = || shell(&format!("sync -f '{}'", m.guest.mnt.display()));
    settle()?;
    let cpu0 = m.server.cpu_s();
    let (rate, ops) = if p == Pattern::Pgbench {
        m.pg.as_ref().expect("started").bench(plan.paired_pg_secs)?
    } else {
        let v = fio_json(&fio_args(p, &m.bench(), round, plan))?;
        let dir = if matches!(p, Pattern::Randread | Pattern::Seqread) { "read" } else { "write" };
        let rate = if matches!(p, Pattern::Seqread | Pattern::Seqwrite) { job(&v, dir, "bw_bytes") / 1e6 } else { job(&v, dir, "iops") };
        (rate, job(&v, dir, "total_ios"))
    };
    // The sync of what the run wrote is the server's work for it too.
    settle()?;
    let cpu_s = match (cpu0, m.server.cpu_s()) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    anyhow::ensure!(rate > 0.0 && ops > 0.0, "{} on {} (round {}) did nothing", p.name(), m.cfg.name(), round + 1);
    Ok(PairSample { pattern: p, config: m.cfg.name().into(), round, rate, ops, cpu_s })
}

/// The paired figures of the samples, by pattern and configuration (for
/// the checks): median ratio to the baseline.
pub fn median_ratios(samples: &[PairSample], configs: &[String]) -> BTreeMap<(Pattern, String), f64> {
    let configs = configs_in(samples, configs);
    let mut m = BTreeMap::new();
    if let Some(base) = configs.first() {
        for p in Pattern::ALL {
            for c in &configs[1..] {
                let r = ratios(samples, p, base, c);
                if !r.is_empty() {
                    m.insert((p, c.clone()), mmm(&r).0);
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequential_write_file_shrinks_to_what_every_round_can_hold() {
        let mut plan = Plan::new(false);
        plan.paired_rounds = 8;
        plan.paired_randwrite_bytes = 1 << 30;
        plan.paired_seqwrite_bytes = 2 << 30;
        // Room for all: the plan's size.
        assert_eq!(seqwrite_bytes_that_fit(&plan, 40 << 30).unwrap(), 2 << 30);
        // 17.5 GiB free: 9/10 of it over 8 rounds is 1.97 GiB a round, 1 GiB of it random writes.
        let fits = seqwrite_bytes_that_fit(&plan, 35 << 29).unwrap();
        assert!(fits < 1 << 30 && fits > 900 << 20, "{fits}");
        assert_eq!(fits % (1 << 20), 0);
        assert!(8 * (fits + plan.paired_randwrite_bytes) <= (35u64 << 29) / 10 * 9);
        // Not even the random-write files fit: a clear error, before any round.
        let e = seqwrite_bytes_that_fit(&plan, 8 << 30).unwrap_err().to_string();
        assert!(e.contains("8192 MiB free"), "{e}");
    }

    fn s(p: Pattern, c: &str, round: usize, rate: f64) -> PairSample {
        PairSample { pattern: p, config: c.into(), round, rate, ops: rate, cpu_s: rate * 1e-5 }
    }

    #[test]
    fn rounds_rotate_so_each_configuration_goes_first_as_often() {
        let two = [Config::LocalRaw, Config::SurgeCow];
        let seq: Vec<Vec<Config>> = (0..4).map(|r| order(&two, r)).collect();
        assert_eq!(seq, [vec![Config::LocalRaw, Config::SurgeCow], vec![Config::SurgeCow, Config::LocalRaw], vec![Config::LocalRaw, Config::SurgeCow], vec![Config::SurgeCow, Config::LocalRaw]]);
        let three = [Config::LocalRaw, Config::SurgeCow, Config::QemuQcow2];
        let firsts: Vec<Config> = (0..3).map(|r| order(&three, r)[0]).collect();
        assert_eq!(firsts, three);
        assert!(order(&[], 3).is_empty());
    }

    #[test]
    fn a_round_is_compared_with_the_same_round_and_drift_between_rounds_cancels() {
        // The machine slows down round after round; both configurations with it.
        let mut v = Vec::new();
        for (r, load) in [1.0, 0.5, 0.8, 0.3, 0.9].iter().enumerate() {
            v.push(s(Pattern::Randwrite, "local-raw", r, 1000.0 * load));
            v.push(s(Pattern::Randwrite, "surge-cow", r, 900.0 * load));
        }
        let r = ratios(&v, Pattern::Randwrite, "local-raw", "surge-cow");
        assert_eq!(r.len(), 5);
        assert!(r.iter().all(|x| (x - 0.9).abs() < 1e-12), "{r:?}");
        // Medians of the rates alone would be 800 vs 720: also 0.9, but one
        // outlier round moves the pair's median less than the rates' medians.
        v.push(s(Pattern::Randwrite, "local-raw", 5, 5000.0));
        v.push(s(Pattern::Randwrite, "surge-cow", 5, 1000.0));
        let j = to_json(&v, &["local-raw".into(), "surge-cow".into()]);
        let e = &j["randwrite"]["surge-cow"];
        assert!((e["median_ratio"].as_f64().unwrap() - 0.9).abs() < 1e-12, "{e}");
        assert!((e["min_ratio"].as_f64().unwrap() - 0.2).abs() < 1e-12);
        assert!((e["max_ratio"].as_f64().unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(e["ratios"].as_array().unwrap().len(), 6);
        assert!(j["randwrite"]["local-raw"].get("median_ratio").is_none(), "the baseline has no ratio to itself");
        assert!(j.get("randread").is_none(), "patterns not run are left out");
    }

    #[test]
    fn a_round_missing_one_side_is_left_out_and_an_even_count_takes_the_middle_pair() {
        let v = vec![
            s(Pattern::Seqread, "local-raw", 0, 100.0),
            s(Pattern::Seqread, "surge-cow", 0, 80.0),
            s(Pattern::Seqread, "local-raw", 1, 100.0),
            s(Pattern::Seqread, "surge-cow", 1, 120.0),
            s(Pattern::Seqread, "surge-cow", 2, 500.0),
        ];
        let r = ratios(&v, Pattern::Seqread, "local-raw", "surge-cow");
        assert_eq!(r, [0.8, 1.2]);
        let m = median_ratios(&v, &["local-raw".into(), "surge-cow".into()]);
        assert!((m[&(Pattern::Seqread, "surge-cow".to_string())] - 1.0).abs() < 1e-12);
    }

    #[test]
    fn cpu_per_op_is_pooled_over_rounds_not_averaged() {
        let mut v = vec![
            PairSample { pattern: Pattern::Rewrite, config: "local-raw".into(), round: 0, rate: 1.0, ops: 1000.0, cpu_s: 0.01 },
            PairSample { pattern: Pattern::Rewrite, config: "local-raw".into(), round: 1, rate: 1.0, ops: 3000.0, cpu_s: 0.05 },
        ];
        // (0.01 + 0.05) s over 4000 ops: 15 µs (the mean of 10 and 16.7 would be 13.3).
        assert!((cpu_us_per_op(&v, Pattern::Rewrite, "local-raw").unwrap() - 15.0).abs() < 1e-9);
        assert_eq!(cpu_us_per_op(&v, Pattern::Rewrite, "surge-cow"), None);
        v.push(PairSample { pattern: Pattern::Rewrite, config: "surge-cow".into(), round: 0, rate: 1.0, ops: 2000.0, cpu_s: 0.06 });
        let j = to_json(&v, &["local-raw".into(), "surge-cow".into()]);
        assert!((j["rewrite"]["surge-cow"]["cpu_ratio"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_section_names_the_baseline_and_compares_first_writes_with_rewrites() {
        let plan = Plan::new(true);
        let mut v = Vec::new();
        for r in 0..4 {
            v.push(s(Pattern::Randwrite, "local-raw", r, 1000.0));
            v.push(PairSample { cpu_s: 0.03, ..s(Pattern::Randwrite, "surge-cow", r, 950.0) });
            v.push(s(Pattern::Rewrite, "local-raw", r, 1000.0));
            v.push(s(Pattern::Rewrite, "surge-cow", r, 1000.0));
        }
        let mut out = String::new();
        section(&mut out, &plan, &v, &["local-raw".into(), "surge-cow".into()]);
        assert!(out.contains("## Paired rounds: surge-cow against local-raw"), "{out}");
        assert!(out.contains("| randwrite (IOPS) | 1000 | 950 | 0.950 [0.950, 0.950] |"), "{out}");
        assert!(out.contains("rate 0.950x on first writes, 1.000x on rewrites"), "{out}");
        assert!(!out.contains("| seqread"), "{out}");
    }
}
