//! Medians and spread per approach, `results.json`'s `priced` part, the
//! report section and the dollars-over-time plots.

use super::rig::{Approach, RunResult, Sample};
use super::scenario::Scaled;
use super::Plan;
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;
use surge_cloud::PriceTable;
pub use crate::experiment::stat::Stat;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub completion_s: Stat,
    pub instance_s: Stat,
    pub storage_usd: Stat,
    pub compute_usd: Stat,
    pub total_usd: Stat,
    pub runs: Vec<RunResult>,
}

impl Summary {
    /// The run whose completion time is the median one (for plots and logs).
    fn typical(&self) -> &RunResult {
        let mut v: Vec<&RunResult> = self.runs.iter().collect();
        v.sort_by(|a, b| a.completion_s.total_cmp(&b.completion_s));
        v[v.len() / 2]
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub scaled: Scaled,
    pub approaches: Vec<(Approach, Summary)>,
}

impl ScenarioResult {
    pub fn get(&self, a: Approach) -> Option<&Summary> {
        self.approaches.iter().find(|(x, _)| *x == a).map(|x| &x.1)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Priced {
    pub plan: Plan,
    pub scenarios: Vec<ScenarioResult>,
}

pub fn aggregate(plan: &Plan, scen: &[Scaled], runs: Vec<(usize, RunResult)>) -> Priced {
    let scenarios = scen
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let approaches = Approach::ALL
                .iter()
                .map(|&a| {
                    let rs: Vec<RunResult> = runs.iter().filter(|(j, r)| *j == i && r.approach == a).map(|(_, r)| r.clone()).collect();
                    let stat = |f: fn(&RunResult) -> f64| Stat::of(rs.iter().map(f).collect());
                    let sum = Summary {
                        completion_s: stat(|r| r.completion_s),
                        instance_s: stat(|r| r.instance_s),
                        storage_usd: stat(|r| r.storage_usd),
                        compute_usd: stat(|r| r.compute_usd),
                        total_usd: stat(|r| r.total_usd),
                        runs: rs,
                    };
                    (a, sum)
                })
                .filter(|(_, sum)| !sum.runs.is_empty())
                .collect();
            ScenarioResult { scaled: s.clone(), approaches }
        })
        .collect();
    Priced { plan: plan.clone(), scenarios }
}

impl Priced {
    /// `priced.{scenario}.{approach}.{completion_s,storage_usd,compute_usd,total_usd,runs}`
    /// (medians; `spread` has min and max), and the scenarios' settings.
    pub fn json(&self) -> (serde_json::Value, serde_json::Value) {
        let mut priced = serde_json::Map::new();
        let mut settings = serde_json::Map::new();
        for s in &self.scenarios {
            let mut m = serde_json::Map::new();
            for (a, sum) in &s.approaches {
                let range = |x: &Stat| serde_json::json!([x.min, x.max]);
                m.insert(
                    a.name().into(),
                    serde_json::json!({
                        "completion_s": sum.completion_s.median,
                        "instance_s": sum.instance_s.median,
                        "storage_usd": sum.storage_usd.median,
                        "compute_usd": sum.compute_usd.median,
                        "total_usd": sum.total_usd.median,
                        "spread": {"completion_s": range(&sum.completion_s), "instance_s": range(&sum.instance_s), "storage_usd": range(&sum.storage_usd), "compute_usd": range(&sum.compute_usd), "total_usd": range(&sum.total_usd)},
                        "runs": sum.runs,
                        "plans": sum.typical().plans,
                        "timeline": sum.typical().samples,
                    }),
                );
            }
            priced.insert(s.scaled.sc.key.into(), serde_json::Value::Object(m));
            let app = super::app::Application::new("nbd+unix:///app?socket=DIR/nbd.sock", &s.scaled);
            settings.insert(s.scaled.sc.key.into(), serde_json::json!({"scenario": s.scaled.sc, "time_scale": s.scaled.time, "rate_scale": s.scaled.rate, "policy": super::rig::policy(&s.scaled), "application": app.command_line()}));
        }
        (serde_json::Value::Object(priced), serde_json::json!({"plan": self.plan, "scenarios": settings}))
    }

    /// Each scenario's application command line.
    pub fn applications(&self) -> serde_json::Value {
        self.scenarios.iter().map(|s| (s.scaled.sc.key.to_string(), serde_json::json!(super::app::Application::new("nbd+unix:///app?socket=DIR/nbd.sock", &s.scaled).command_line()))).collect::<serde_json::Map<_, _>>().into()
    }

    /// Settings of the priced runs that differ from the daemon's defaults, with the reason.
    pub fn deviations(&self) -> Vec<serde_json::Value> {
        let mut v = vec![serde_json::json!({"setting": "priced: value_per_hour = the instance's list price", "reason": "cache=auto requires it (no default): what an hour of the application's time is worth"})];
        for s in &self.scenarios {
            for d in &s.scaled.sc.deviations {
                v.push(serde_json::json!({"setting": format!("priced {}: {}", s.scaled.sc.key, d.split(':').next().unwrap_or(d)), "reason": d}));
            }
        }
        v
    }

    pub fn plot(&self, out: &Path) -> anyhow::Result<Vec<String>> {
        let mut files = Vec::new();
        for s in &self.scenarios {
            let name = format!("priced_{}.svg", s.scaled.sc.key);
            plot_dollars(&out.join(&name), s)?;
            files.push(name);
        }
        Ok(files)
    }

    pub fn markdown(&self) -> String {
        let mut m = String::new();
        let p = &self.plan;
        let _ = writeln!(
            m,
            "# Elastic cache in dollars: priced scenarios ({}, time scale 1/{:.0}, rate scale 1/{:.0}, {} run{} per approach{})\n",
            if p.quick { "--quick" } else { "full run" },
            1.0 / p.time,
            1.0 / p.rate,
            p.reps,
            if p.reps == 1 { "" } else { "s" },
            if p.parallel { ", all approaches at once" } else { ", interleaved" }
        );
        let _ = writeln!(
            m,
            "Measured: completion times (emulated seconds / time scale = full-scale seconds). Dollars: list prices (AWS us-east-1 EBS and EC2 on-demand) applied by the cost meter to the measured lifetimes of each volume and of the instance, per second with 60 s minimums, at full scale. Figures marked *computed* come from the planner's model, not from a run.\n"
        );
        for s in &self.scenarios {
            scenario_md(&mut m, s, p);
        }
        let _ = writeln!(m, "## How the priced runs are set up\n");
        let learn = self.scenarios.first().map(|s| super::rig::policy(&s.scaled).learn_period).unwrap_or(false);
        let _ = writeln!(m, "- Every part is its own process, as a user runs it: `surge serve` with the approach's export (the spec strings above, built by the daemon's own builders) on a local cloud at the run's scale (`--local-scale`), and the application, `surge load` (one process for the whole run: bursts, then think time), over NBD on the daemon's unix socket. Its writes carry bytes derived from the seed, the request and the position (overlapping requests in flight serialised); once the daemon has stopped, every run's data volume is read back and checked against what the application's configuration and its count of requests say it must hold.");
        let _ = writeln!(m, "- Scale: durations x {} (windows, ID, attach/detach delays, EBS's modification rules and 5 min optimizing ramp, compute phases), rates x {} (every volume's IOPS and MiB/s, the planner's observed demand divided back), amounts x {} (bytes written, cache sizes, volume files). Prices, limits and every value in a spec are full-scale.", p.time, p.rate, p.time * p.rate);
        let _ = writeln!(m, "- Policy: the daemon's defaults (UT 30 %, window 5 s, ID 30 s, initial cache 10 GiB, min 1 GiB, max 64 GiB, granularity 1 GiB, attach/detach 3 s, idle gap 200 ms, flusher poll 20 ms, burst-period learning {}, all at scale but the idle gap and the poll, which are timed between requests; `cache=auto` with its defaults: every type, drain spec on). The one setting every adaptive run adds: value_per_hour = the instance's list price (required with cache=auto, no default). Per-scenario deviations are listed with each scenario.", if learn { "on" } else { "off" });
        let _ = writeln!(m, "- Billing: the data volume is billed until the application completes (the user keeps it, at the spec it has then: modify-volume's raised spec stays until the rules let it down); cache volumes until they are deleted after draining. Compute: the named instance from the application's start until it could stop: the application's completion, and for adaptive the end of the drain (the daemon on the instance flushes the cache to the backing volume, then deletes it), `instance billed (s)`.");
        let _ = writeln!(m, "- modify-volume: a script beside the daemon (as a user would write one with the AWS CLI) reads the export's I/O from the control API every window/10 and decides with the same utilization window, UT and ID; it changes the volume with `surge set app/volume spec=...` (type changes in place, gp3 to io2). The local cloud enforces EBS's rules: `modify-volume` the newer one (up to four modifications per rolling 24 hours, each once the previous one completed, `--local-modify-rules ebs-24h`), `modify-volume-6h` the classic one (one per 6 hours, `ebs-6h`); new performance ramps linearly over 5 minutes (the short end of AWS's \"a few minutes to a few hours\"; a fully used 1 TiB volume takes about 6 hours), billed at the new spec from the request.");
        let _ = writeln!(m, "- After the last burst the run ends once the cache is released. A daemon left running with learning on would pre-provision one more cache for the burst the learned period predicts; it is released after attach delay + ID + window (about 38 s, billed 60 s) and is not in these figures.\n");
        m
    }
}

fn usd(v: f64) -> String {
    if v.abs() >= 1.0 {
        format!("${v:.3}")
    } else {
        format!("${v:.4}")
    }
}

fn scenario_md(m: &mut String, s: &ScenarioResult, p: &Plan) {
    let sc = &s.scaled.sc;
    let nan = Stat { median: f64::NAN, min: f64::NAN, max: f64::NAN };
    let (fast_t, fast_storage, fast_total) = s.get(Approach::Fast).map_or((nan, nan, nan), |f| (f.completion_s, f.storage_usd, f.total_usd));
    let prices = PriceTable::default();
    let inst = prices.instance_usd_hour(sc.instance, sc.nodes).unwrap_or(f64::NAN);
    let _ = writeln!(m, "## {}: {}\n", sc.key, sc.title);
    let _ = writeln!(m, "Application: `{}`\n", super::app::Application::new("nbd+unix:///app?socket=DIR/nbd.sock", &s.scaled).command_line());
    let _ = writeln!(m, "Daemons (one per run):\n");
    for (a, _) in &s.approaches {
        if let Ok(d) = super::rig::daemon_spec(&s.scaled, *a) {
            let _ = writeln!(m, "- {}: `{}`", a.name(), d.command_line());
        }
    }
    let _ = writeln!(m);
    let _ = writeln!(
        m,
        "Backing `{}` (${:.2}/month); peak `{}` (${:.2}/month); compute {} x {} (${inst}/h, {}).\n",
        sc.backing,
        prices.usd_month(&sc.backing),
        sc.peak,
        prices.usd_month(&sc.peak),
        sc.nodes,
        sc.instance,
        sc.instance_why
    );
    if let Ok(e) = prices.instance_ebs(sc.instance) {
        let _ = writeln!(m, "The {}'s EBS limits hold every approach's volumes together (`--local-instance`): {} MB/s and {} IOPS sustained (price table `instance_ebs`, AWS's EBS-optimized figures); `cache=auto` never buys more than they let through.\n", sc.instance, e.baseline_mbps, e.baseline_iops);
    }
    let _ = writeln!(m, "| approach | completion (s) | vs static-fast | instance billed (s) | storage $ | storage vs static-fast | compute $ | total $ | total vs static-fast |");
    let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let spread = |x: &Stat, f: &dyn Fn(f64) -> String| if p.reps > 1 { format!("{} [{}-{}]", f(x.median), f(x.min), f(x.max)) } else { f(x.median) };
    for (a, sum) in &s.approaches {
        let pct = |v: f64, base: f64| format!("{:+.1} %", (v / base - 1.0) * 100.0);
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {:.0} % | {} | {} | {} |",
            a.name(),
            spread(&sum.completion_s, &|v| format!("{v:.1}")),
            if *a == Approach::Fast { "–".into() } else { pct(sum.completion_s.median, fast_t.median) },
            spread(&sum.instance_s, &|v| format!("{v:.1}")),
            spread(&sum.storage_usd, &usd),
            sum.storage_usd.median / fast_storage.median * 100.0,
            spread(&sum.compute_usd, &usd),
            spread(&sum.total_usd, &usd),
            if *a == Approach::Fast { "–".into() } else { pct(sum.total_usd.median, fast_total.median) },
        );
    }
    let best = s.approaches.iter().min_by(|a, b| a.1.total_usd.median.total_cmp(&b.1.total_usd.median)).map(|x| x.0.name()).unwrap_or("-");
    let _ = writeln!(m, "\nLowest total, with the instance billed until it could stop (adaptive: until its cache is drained and deleted): **{best}**. Medians{}; full-scale seconds and dollars.\n", if p.reps > 1 { " [min-max]" } else { "" });
    if let (Some(ad), Some(f), Some(sl)) = (s.get(Approach::Adaptive), s.get(Approach::Fast), s.get(Approach::Slow)) {
        // The instance is billed until it could stop: compare instance seconds.
        let (ta, tf, ts) = (ad.instance_s.median, f.instance_s.median, sl.instance_s.median);
        let (sa, sf, ss) = (ad.storage_usd.median, f.storage_usd.median, sl.storage_usd.median);
        let vs_fast = if ta > tf { format!("while the instance costs less than ${:.2}/h", (sf - sa) * 3_600.0 / (ta - tf)) } else { "at any instance price (it was not billed longer)".into() };
        let vs_slow = if ts > ta { format!("once the instance costs more than ${:.3}/h", ((sa - ss) * 3_600.0 / (ts - ta)).max(0.0)) } else { "never (it was not billed shorter)".into() };
        let _ = writeln!(
            m,
            "*Computed* from these medians (same instance seconds, other instance prices): adaptive costs less than static-fast {vs_fast}, and less than static-slow {vs_slow}; the {} here costs ${inst}/h. Adaptive's instance ran {:.1} s past the application's completion: the daemon on it drains the last burst from the cache to the backing volume before deleting the cache.\n",
            sc.instance,
            ad.instance_s.median - ad.completion_s.median
        );
    }
    if let Some(ad) = s.get(Approach::Adaptive).map(|x| x.typical()) {
        let _ = writeln!(m, "Adaptive's decisions (run {}; the planner's estimates in them are *computed*):\n", ad.rep);
        for d in &ad.decisions {
            let _ = writeln!(m, "- {d}");
        }
    }
    if let Some(mo) = s.get(Approach::Modify).map(|x| x.typical()) {
        let _ = writeln!(m, "\nmodify-volume's modifications (run {}):\n", mo.rep);
        for d in &mo.decisions {
            let _ = writeln!(m, "- {d}");
        }
        if mo.decisions.is_empty() {
            let _ = writeln!(m, "- none");
        }
    }
    let _ = writeln!(m, "\nBills of these runs (spec, seconds billed, $):\n");
    for (a, sum) in &s.approaches {
        let r = sum.typical();
        let bills: Vec<String> = r.bills.iter().map(|(spec, secs, u)| format!("`{spec}` {secs} s {}", usd(*u))).collect();
        let _ = writeln!(m, "- {}: {}", a.name(), bills.join("; "));
    }
    let _ = writeln!(m, "\nBursts (start-end, full-scale s), typical run of each approach:\n");
    for (a, sum) in &s.approaches {
        let r = sum.typical();
        let _ = writeln!(m, "- {}: {}", a.name(), r.bursts.iter().map(|(x, y)| format!("{x:.1}-{y:.1}")).collect::<Vec<_>>().join(", "));
    }
    let _ = writeln!(m, "\nPlot: `priced_{}.svg` (total and storage dollars over time, typical run of each approach).\n", sc.key);
    if !sc.deviations.is_empty() {
        let _ = writeln!(m, "Settings that differ from the daemon's defaults in this scenario:\n");
        for d in &sc.deviations {
            let _ = writeln!(m, "- {d}");
        }
        let _ = writeln!(m);
    }
}

fn plot_dollars(path: &Path, s: &ScenarioResult) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 1));
    let color = |a: Approach| match a {
        Approach::Slow => RED,
        Approach::Fast => BLUE,
        Approach::Modify => MAGENTA,
        Approach::ModifyClassic => RGBColor(200, 120, 0),
        Approach::Adaptive => GREEN,
    };
    let series: Vec<(&str, &[Sample], RGBColor)> = s.approaches.iter().map(|(a, sum)| (a.name(), sum.typical().samples.as_slice(), color(*a))).collect();
    // Room on the right for the final figures.
    let tmax = series.iter().flat_map(|(_, v, _)| v.last()).map(|x| x.t_s).fold(1.0, f64::max) * 1.15;
    for (panel, (title, f)) in panels.iter().zip([
        ("total dollars (storage + compute)", (|x: &Sample| x.storage_usd + x.compute_usd) as fn(&Sample) -> f64),
        ("storage dollars", |x: &Sample| x.storage_usd),
    ]) {
        let ymax = series.iter().flat_map(|(_, v, _)| v.iter()).map(f).filter(|y| y.is_finite()).fold(1e-9, f64::max) * 1.05;
        let mut ch = ChartBuilder::on(panel)
            .caption(format!("{}: {title} over time", s.scaled.sc.key), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..tmax, 0.0..ymax)?;
        ch.configure_mesh().x_desc("time (s, full scale)").y_desc("US$").draw()?;
        for &(name, v, color) in &series {
            ch.draw_series(LineSeries::new(v.iter().filter(|x| f(x).is_finite()).map(|x| (x.t_s, f(x))), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
            // Where each approach ends, with its final dollars.
            if let Some(last) = v.iter().rev().find(|x| f(x).is_finite()) {
                let (x, y) = (last.t_s, f(last));
                ch.draw_series(std::iter::once(Circle::new((x, y), 4, color.filled())))?;
                ch.draw_series(std::iter::once(Text::new(format!("${y:.4}"), (x, y), ("sans-serif", 12).into_font().color(&color))))?;
            }
        }
        ch.configure_series_labels().position(SeriesLabelPosition::UpperLeft).background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        let s = Stat::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stat::of(vec![4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Stat::of(vec![]).median.is_nan());
    }
}
