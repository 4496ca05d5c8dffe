//! The replica's section of report.md: every figure from the runs.

use super::replica::{application, daemon_spec, Approach, Setting, Stat, Summary, EXACT, JITTER};
use std::fmt::Write;
use surge_block::cache::CacheConfig;
use surge_block::model::GIB;
use surge_policy::ElasticConfig;

fn spread(x: &Stat, reps: usize, f: impl Fn(f64) -> String) -> String {
    if reps > 1 {
        format!("{} [{}-{}]", f(x.median), f(x.min), f(x.max))
    } else {
        f(x.median)
    }
}

fn table(m: &mut String, res: &[Summary], reps: usize) {
    let Some(fast) = res.iter().find(|x| x.approach == Approach::Fast) else { return };
    let _ = writeln!(m, "| approach | completion time (s) | overhead vs static-fast | cost (AGBs) | cost vs static-fast | cost ($) |");
    let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|");
    for x in res {
        let oh = if x.approach == Approach::Fast { "–".to_string() } else { format!("{:+.2} %", (x.completion.median / fast.completion.median - 1.0) * 100.0) };
        let _ = writeln!(
            m,
            "| {} | {} | {oh} | {} | {:.1} % | {} |",
            x.approach.name(),
            spread(&x.completion, reps, |v| format!("{v:.1}")),
            spread(&x.agbs, reps, |v| format!("{v:.0}")),
            x.agbs.median / fast.agbs.median * 100.0,
            spread(&x.usd, reps, |v| format!("{v:.4}")),
        );
    }
}

pub fn markdown(s: &Setting, quick: bool, reps: usize, exact: &[Summary], jitter: &[Summary]) -> String {
    let f = s.scale;
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Elastic cache: CM1-style case study (scale 1/{:.0}{}, {reps} run{} per approach{})\n",
        1.0 / f,
        if quick { ", --quick" } else { "" },
        if reps == 1 { "" } else { "s" },
        if reps > 1 { ", interleaved, order rotated each round" } else { "" }
    );
    let _ = writeln!(m, "Measured: completion times and AGBs in full-scale seconds (emulated seconds / f) and full-scale sizes; medians{}.\n", if reps > 1 { " [min-max]" } else { "" });
    table(&mut m, exact, reps);
    let _ = writeln!(m, "\nPaper (CM1, Table I, 32 VMs): static-slow 1471 s (+23 %), static-fast 1190 s, adaptive 1231 s (+3.3 %); adaptive cost 35 % of static-fast (-65 %).\n");
    if let Some(ad) = exact.iter().find(|x| x.approach == Approach::Adaptive) {
        let t = ad.typical();
        let _ = writeln!(
            m,
            "Cache sizes provisioned (adaptive, run {}): {} GiB at this scale = {} GiB at full scale (paper: 10, 4, 6, 6 GB).\n",
            t.rep,
            t.cache_sizes.iter().map(|&b| format!("{:.3}", b as f64 / GIB as f64)).collect::<Vec<_>>().join(", "),
            t.cache_sizes.iter().map(|&b| format!("{:.2}", b as f64 / GIB as f64 / f)).collect::<Vec<_>>().join(", ")
        );
    }
    let verified: Vec<String> = exact.iter().chain(jitter).map(|x| format!("{} {} MiB", x.approach.name(), x.runs.iter().map(|r| r.verified_bytes).min().unwrap_or(0) >> 20)).collect();
    let _ = writeln!(m, "Data read back from the data volume after every run (the daemon stopped) and checked against what the application wrote: {}.\n", verified.join(", "));
    let _ = writeln!(m, "Plots: `io_activity.svg` (I/O on all cloud volumes and the application's throughput, typical run of each approach), `cost.svg` (AGBs accumulated).\n");
    learning_md(&mut m, exact, jitter, reps);
    let _ = writeln!(m, "## How it runs\n");
    let app = application(s, EXACT, "nbd+unix:///app?socket=DIR/nbd.sock");
    let _ = writeln!(m, "- The application, its own process over NBD: `{}`{}.", app.command_line(), if jitter.is_empty() { String::new() } else { format!(" (the jitter variant adds `--think-jitter={}`)", JITTER.jitter) });
    let _ = writeln!(m, "- The daemon, one per run, as a user starts it (the exports' specs give only what the paper's setting names: the volumes and the cache bandwidth):");
    for a in [Approach::Slow, Approach::Fast, Approach::Adaptive, Approach::AdaptiveNoLearn] {
        if exact.iter().chain(jitter).any(|x| x.approach == a) {
            let _ = writeln!(m, "  - {}: `{}`", a.name(), daemon_spec(s, a).command_line());
        }
    }
    let _ = writeln!(m, "- Settings that differ from the daemon's defaults: none (adaptive-no-learning: `learn=false`, to show what learning does).\n");
    let _ = writeln!(m, "## Setting and scale\n");
    let _ = writeln!(m, "Scale factor f = {f} (1/{:.0}, `--local-scale time={f}`): the daemon and the local cloud run every duration and size x f (bandwidths and UT are not scaled); specs, prices and the figures above are full scale.\n", 1.0 / f);
    let p = ElasticConfig::default();
    let c = CacheConfig::default();
    let _ = writeln!(m, "| setting | full scale (the daemon's default where marked) | this run |");
    let _ = writeln!(m, "|---|---:|---:|");
    let row = |m: &mut String, k: &str, full: String, ours: String| {
        let _ = writeln!(m, "| {k} | {full} | {ours} |");
    };
    let g = |b: u64| format!("{:.3} GiB", b as f64 / GIB as f64);
    let sec = |d: std::time::Duration| format!("{:.3} s", d.as_secs_f64());
    let secs = |x: f64| format!("{x:.3} s");
    row(&mut m, "backing / static volumes", format!("`{}` / `{}`", s.backing, s.fast), format!("{} each", g((50.0 * GIB as f64 * f) as u64)));
    row(&mut m, "cache volumes", format!("reserved, {}", s.cache_bw), s.cache_bw.clone());
    row(&mut m, "initial cache size (default)", g(p.initial_cache), g((p.initial_cache as f64 * f) as u64));
    row(&mut m, "cache size bounds / granularity (default)", format!("{} - {} / {}", g(p.min_cache), g(p.max_cache), g(p.granularity)), format!("{} - {} / {}", g((p.min_cache as f64 * f) as u64), g((p.max_cache as f64 * f) as u64), g((p.granularity as f64 * f) as u64)));
    row(&mut m, "utilization threshold UT (default)", format!("{:.0} %", p.ut * 100.0), format!("{:.0} %", p.ut * 100.0));
    row(&mut m, "utilization window (default)", sec(p.window), sec(p.window.mul_f64(f)));
    row(&mut m, "inactivity delay ID (default)", sec(p.inactivity_delay), sec(p.inactivity_delay.mul_f64(f)));
    row(&mut m, "attach / detach delay (local cloud default)", "3 s / 3 s".into(), format!("{} / {}", secs(3.0 * f), secs(3.0 * f)));
    row(&mut m, "phase-1 idle gap before background flushing (default, not scaled: it is timed between requests)", sec(c.idle_gap), sec(c.idle_gap));
    row(&mut m, "flusher poll when idle (default, not scaled)", "20 ms".into(), "20 ms".into());
    row(&mut m, "burst-period learning (default)", if p.learn_period { "on, guarded".into() } else { "off".into() }, if p.learn_period { "on, guarded".into() } else { "off".into() });
    row(&mut m, "billing minimum per volume", "60 s".into(), secs(60.0 * f));
    row(&mut m, "initial compute / compute between bursts", format!("{} s / {} s", s.init_compute_s, s.compute_s), format!("{} / {}", secs(s.init_compute_s * f), secs(s.compute_s * f)));
    row(
        &mut m,
        "write bursts (4 writers, 1 MiB requests, one in flight each, FLUSH at the end)",
        s.bursts.iter().map(|&b| format!("{:.2}", b as f64 / GIB as f64)).collect::<Vec<_>>().join(", ") + " GiB",
        app.burst_bytes.iter().map(|&b| format!("{:.3}", (b * 4) as f64 / GIB as f64)).collect::<Vec<_>>().join(", ") + " GiB",
    );
    let _ = writeln!(m, "\nThe application's burst sizes and compute times are chosen so that static-slow is ~23 % slower than static-fast, as in the paper's Table I (CM1); the paper does not publish per-VM burst sizes. Cost: AGBs as in the paper (MB/s x GiB x s), each volume billed from creation to deletion; the volume holding the data is billed until the application completes, cache volumes until they are deleted (after completion, if still draining). Dollars: the local cloud's price table (reserved volumes priced like gp3 storage + provisioned throughput), per second with the 60 s minimum.\n");
    if let Some(ad) = exact.iter().find(|x| x.approach == Approach::Adaptive) {
        let t = ad.typical();
        let _ = writeln!(m, "## Policy decisions (adaptive, run {}; seconds from the application's start, full scale)\n", t.rep);
        for (at, action, reason) in &t.decisions {
            let _ = writeln!(m, "- {at:.1} s: {action}: {reason}");
        }
    }
    let _ = writeln!(m, "\n## Bursts (start-end, full-scale s, typical run)\n");
    for x in exact.iter().chain(jitter) {
        let v = if x.runs[0].variant == EXACT.key { "" } else { " (jitter)" };
        let _ = writeln!(m, "- {}{v}: {}", x.approach.name(), x.typical().bursts.iter().map(|(a, b)| format!("{a:.1}-{b:.1}")).collect::<Vec<_>>().join(", "));
    }
    m
}

/// What burst-period learning does, on exact and on jittered compute phases.
fn learning_md(m: &mut String, exact: &[Summary], jitter: &[Summary], reps: usize) {
    let has = |v: &[Summary], a| v.iter().any(|x| x.approach == a);
    if !has(exact, Approach::AdaptiveNoLearn) && jitter.is_empty() {
        let _ = writeln!(m, "Burst-period learning is on (the daemon's default); the full run also measures it off, and on compute phases that vary by +-{:.0} %.\n", JITTER.jitter * 100.0);
        return;
    }
    let _ = writeln!(m, "## Burst-period learning (on by default, guarded)\n");
    let _ = writeln!(m, "adaptive-no-learning is the same daemon with `learn=false`. With learning the policy pre-provisions the cache before the burst the last compute gap predicts; a prediction that misses (the burst came early, or did not come while the cache waited) suspends it until three compute gaps agree within 2 windows + 10 %.\n");
    if has(exact, Approach::AdaptiveNoLearn) {
        let _ = writeln!(m, "Exact compute phases:\n");
        table(m, exact, reps);
    }
    if !jitter.is_empty() {
        let _ = writeln!(m, "\nCompute phases x (1 +- u x {:.0} %), u uniform, seeded (the same phases in every run):\n", JITTER.jitter * 100.0);
        table(m, jitter, reps);
        for x in jitter.iter().filter(|x| x.approach == Approach::Adaptive) {
            let d = &x.typical().decisions;
            let pre = d.iter().filter(|(_, _, r)| r.contains("pre-provision")).count();
            let unused = d.iter().filter(|(_, _, r)| r.contains("did not come")).count();
            let _ = writeln!(m, "\nadaptive (jitter), run {}: {pre} cache(s) pre-provisioned, {unused} released unused.", x.typical().rep);
        }
    }
    let _ = writeln!(m);
}
