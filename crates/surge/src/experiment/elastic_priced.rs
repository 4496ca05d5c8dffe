//! The elastic-cache experiment in dollars (issue 14): two priced scenarios on
//! real volume types, each run with four approaches:
//! - static-slow: the backing volume alone (gp3 at its baseline);
//! - static-fast: the peak provisioned all the time;
//! - modify-volume: one volume raised to the peak in place when a burst starts
//!   and lowered when EBS allows (four modifications per rolling 24 hours,
//!   each after the previous completed; `modify-volume-6h`: the classic one
//!   per 6 hours; new performance arriving over 5 minutes, see
//!   `surge_cloud::local`);
//! - adaptive: the elastic volume with `cache=auto`: the price-aware planner
//!   chooses each cache volume (type, IOPS, throughput, size) or none.
//!
//! The application is `surge load`, one process for the whole run, reaching the
//! volume through NBD; compute phases are its think time. Everything runs at reduced scale (durations
//! x time, rates x rate, amounts x both) on the scaled local cloud; dollars are
//! list prices for the full-scale volumes and instance over full-scale seconds
//! (measured emulated seconds / time), per second with 60 s minimums.

mod app;
mod report;
mod rig;
mod scenario;

pub use report::Priced;
use rig::{Approach, RunResult};
use scenario::{Scaled, Scenario};
use std::path::Path;

/// How the priced part runs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub quick: bool,
    pub time: f64,
    pub rate: f64,
    pub reps: usize,
    /// Run the approaches of every scenario at once (quick mode).
    pub parallel: bool,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
        let time = env("SURGE_PRICED_TIME").unwrap_or(if quick { 1.0 / 20.0 } else { 1.0 / 8.0 });
        let rate = env("SURGE_PRICED_RATE").unwrap_or(1.0 / 16.0);
        let reps = env("SURGE_PRICED_REPS").map_or(if quick { 1 } else { 3 }, |r| r as usize);
        let parallel = env("SURGE_PRICED_PARALLEL").map_or(quick, |p| p != 0.0);
        Plan { quick, time, rate, reps, parallel }
    }
}

pub fn scenarios(p: &Plan) -> Vec<Scaled> {
    [Scenario::throughput(), Scenario::iops()].into_iter().map(|sc| Scaled { sc, time: p.time, rate: p.rate }).collect()
}

/// Run both scenarios: every approach `reps` times, interleaved (rep by rep,
/// the approaches' order rotated each rep), or all at once in quick mode.
pub fn run(plan: &Plan, work: &Path) -> anyhow::Result<Priced> {
    let scen = scenarios(plan);
    std::fs::create_dir_all(work)?;
    let total = scen.len() * Approach::ALL.len() * plan.reps;
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(indicatif::ProgressStyle::with_template("priced {bar:30} {pos}/{len} runs, ETA {eta} {msg}").expect("valid template"));
    let mut runs: Vec<(usize, RunResult)> = Vec::new();
    let only = std::env::var("SURGE_PRICED_ONLY").ok();
    for rep in 0..plan.reps {
        let mut jobs = Vec::new();
        for (i, s) in scen.iter().enumerate() {
            for j in 0..Approach::ALL.len() {
                let a = Approach::ALL[(j + rep) % Approach::ALL.len()];
                // SURGE_PRICED_ONLY=iops:adaptive (development: one scenario or run).
                if only.as_deref().is_some_and(|o| !format!("{}:{}", s.sc.key, a.name()).contains(o)) {
                    continue;
                }
                jobs.push((i, s, a));
            }
        }
        let one = |(i, s, a): (usize, &Scaled, Approach)| -> anyhow::Result<(usize, RunResult)> {
            let dir = work.join(format!("{}-{}-{rep}", s.sc.key, a.name()));
            let r = rig::run(s, a, rep, &dir)?;
            bar.inc(1);
            bar.println(format!("priced {} {}: {:.1} s, ${:.4} storage + ${:.4} compute", s.sc.key, a.name(), r.completion_s, r.storage_usd, r.compute_usd));
            Ok((i, r))
        };
        if plan.parallel {
            let results: Vec<anyhow::Result<(usize, RunResult)>> = std::thread::scope(|sc| {
                let hs: Vec<_> = jobs.into_iter().map(|j| sc.spawn(move || one(j))).collect();
                hs.into_iter().map(|h| h.join().expect("run panicked")).collect()
            });
            for r in results {
                runs.push(r?);
            }
        } else {
            for j in jobs {
                runs.push(one(j)?);
            }
        }
    }
    bar.finish_and_clear();
    Ok(report::aggregate(plan, &scen, runs))
}
