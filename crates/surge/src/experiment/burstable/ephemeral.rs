//! The paper's third use case (§3.3, discussed there without a figure):
//! ephemeral storage for a pipeline's intermediate data. Each stage writes its
//! intermediate data, reads it back (the next step consumes it), and computes
//! for a while; the data is not needed after the stage. One 100 GiB gp2 against
//! 10 x 10 GiB gp2 as a `burstable:ephemeral` stripe, whose spent members are
//! replaced empty during the compute gaps (no migration, the paper's point:
//! the extra throughput costs nothing but the overlap of a swap).
//!
//! Simulated on virtual time like Figures 3 and 5: the stage workers run
//! inside the experiment and call the real layers on a discrete-event clock.

use surge_sim::threaded::{self as sim, stamp};
use super::{fresh_dir, open_under_test, Setting, UnderTest, TAG};
use crate::stack::burstable::SwapRecord;
use anyhow::Context as _;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use surge_block::model::GIB;
use surge_block::{BlockDev, Clock, ClockThread, Hold, SimClock};
use surge_cloud::{PriceTable, Provider};
use surge_policy::burstable::Mode;

/// One stage of the pipeline (model seconds since the window started).
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    pub start_s: f64,
    /// `None`: the window ended while the stage ran.
    pub end_s: Option<f64>,
}

/// One run of one approach.
#[derive(Debug, Clone, Serialize)]
pub struct EphemeralRun {
    pub approach: String,
    pub run: usize,
    pub stages: Vec<Stage>,
    /// Stages finished within the window.
    pub stages_done: usize,
    /// Median full-scale seconds of a finished stage's I/O (write + read back).
    pub stage_s: Option<f64>,
    /// Dollars of the volumes over the window (model time, full-size prices).
    pub usd: f64,
    /// 4 KiB pages read back with another stage's or no stamp (0: a reset
    /// never discarded data a stage still needed).
    pub bad_pages: u64,
    pub errors: u64,
    pub resets: Vec<SwapRecord>,
    pub wall_s: f64,
}

/// What every stage does.
struct StageLoad {
    bytes: u64,
    bs: u64,
    workers: usize,
    gap: Duration,
}

/// What the stage workers saw.
struct StagesSeen {
    stages: Vec<Stage>,
    bad_pages: u64,
    errors: u64,
}

/// Run stages on `dev` from now until `until`: every worker writes its slice
/// of the stage's data (stamped with the stage), all read their slice back and
/// check the stamps, then all compute (sleep) for the gap. A stage cut by the
/// window's end is not finished and its reads are not checked.
fn run_stages(dev: &Arc<dyn BlockDev>, clock: &Arc<SimClock>, load: &StageLoad, until: Duration, hold: Hold) -> StagesSeen {
    let t0 = clock.now();
    let since = move |now: Duration| (now - t0).as_secs_f64();
    let all = Barrier::new(load.workers);
    let hold = parking_lot::Mutex::new(Some(hold));
    let stop = AtomicBool::new(false);
    let stages = parking_lot::Mutex::new(Vec::<Stage>::new());
    let (bad, errors) = (AtomicU64::new(0), AtomicU64::new(0));
    let slice = load.bytes / load.workers as u64 / load.bs * load.bs;
    std::thread::scope(|s| {
        for k in 0..load.workers {
            let (dev, clock, all, hold, stop, stages, bad, errors) = (dev.clone(), clock.clone(), &all, &hold, &stop, &stages, &bad, &errors);
            s.spawn(move || {
                let _t = ClockThread::enter(clock.clone());
                if all.wait().is_leader() {
                    hold.lock().take();
                }
                let mut buf = vec![0u8; load.bs as usize];
                let base = k as u64 * slice;
                let error = |e: surge_block::BlockError| {
                    if errors.fetch_add(1, Relaxed) == 0 {
                        eprintln!("burstable experiment (ephemeral): I/O error: {e}");
                    }
                };
                for n in 0u64.. {
                    if all.wait().is_leader() {
                        let now = clock.now();
                        stop.store(now >= until, Relaxed);
                        if now < until {
                            stages.lock().push(Stage { start_s: since(now), end_s: None });
                        }
                    }
                    all.wait();
                    if stop.load(Relaxed) {
                        break;
                    }
                    let tag = TAG ^ (n + 1);
                    for off in (base..base + slice).step_by(load.bs as usize) {
                        if clock.now() >= until {
                            break;
                        }
                        stamp(&mut buf, off, tag);
                        if let Err(e) = dev.write_at(&buf, off, false) {
                            error(e);
                        }
                    }
                    all.wait();
                    for off in (base..base + slice).step_by(load.bs as usize) {
                        if clock.now() >= until {
                            break;
                        }
                        match dev.read_at(&mut buf, off) {
                            Ok(()) => {
                                let wrong = buf.chunks(4096).enumerate().filter(|(i, p)| p[..8] != (off + *i as u64 * 4096).to_le_bytes() || p[8..16] != tag.to_le_bytes()).count();
                                bad.fetch_add(wrong as u64, Relaxed);
                            }
                            Err(e) => error(e),
                        }
                    }
                    if all.wait().is_leader() {
                        let now = clock.now();
                        if now < until {
                            if let Some(st) = stages.lock().last_mut() {
                                st.end_s = Some(since(now));
                            }
                        }
                    }
                    clock.sleep_until(clock.now() + load.gap);
                }
            });
        }
    });
    StagesSeen { stages: stages.into_inner(), bad_pages: bad.load(Relaxed), errors: errors.load(Relaxed) }
}

/// One window of stages on one 100 GiB gp2 (`striped` false) or on the
/// ephemeral stripe of 10 x 10 GiB.
pub fn run(s: &Setting, striped: bool, run: usize, dir: &Path) -> anyhow::Result<EphemeralRun> {
    let started = std::time::Instant::now();
    fresh_dir(dir)?;
    let clock = SimClock::new();
    let c: Arc<dyn Clock> = clock.clone();
    let prov = sim::provider(&dir.join("cloud"), c.clone(), s.scale, s.t(s.attach_delay_s))?;
    let pdyn: Arc<dyn Provider> = prov.clone();
    let (approach, prefix) = if striped { ("striped", "eph-") } else { ("single", "single-eph") };
    let under_test = if striped { UnderTest::Striped { name: "eph", mode: Mode::Ephemeral } } else { UnderTest::Single { name: "single-eph" } };
    let (dev, vol) = open_under_test(s, &pdyn, &c, under_test, s.ephemeral_capacity, dir)?;
    let load = StageLoad { bytes: s.b(s.ephemeral_stage), bs: s.ephemeral_bs, workers: s.ephemeral_workers, gap: s.t(s.ephemeral_gap_s) };
    let cost0 = prov.cost()?;
    let hold = clock.hold();
    if let Some(v) = &vol {
        v.start().context("starting the burstable controller")?;
    }
    let until = clock.now() + s.t(s.ephemeral_window_s);
    let seen = run_stages(&dev, &clock, &load, until, hold);
    if let Some(v) = &vol {
        v.stop();
    }
    let cost1 = prov.cost()?;
    let done: Vec<f64> = seen.stages.iter().filter_map(|st| st.end_s.map(|e| (e - st.start_s) / s.scale)).collect();
    Ok(EphemeralRun {
        approach: approach.into(),
        run,
        stages_done: done.len(),
        stage_s: (!done.is_empty()).then(|| super::median(&done).0),
        usd: sim::usd_between(&PriceTable::default(), &cost0, &cost1, prefix, s.scale),
        bad_pages: seen.bad_pages,
        errors: seen.errors,
        resets: vol.as_ref().map(|v| v.swaps()).unwrap_or_default(),
        stages: seen.stages,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Medians over runs, striped against single.
#[derive(Debug, Clone, Serialize)]
pub struct EphemeralSummary {
    pub single_stages: super::report::Stat,
    pub striped_stages: super::report::Stat,
    pub single_stage_s: super::report::Stat,
    pub striped_stage_s: super::report::Stat,
    /// Stages finished in the window, striped / single.
    pub stages_ratio: f64,
    /// Median stage time, single / striped.
    pub stage_speedup: f64,
    pub cost_ratio: f64,
    pub resets: super::report::Stat,
    pub bad_pages: u64,
    pub errors: u64,
}

pub fn summarize(runs: &[EphemeralRun]) -> EphemeralSummary {
    let of = |a: &'static str| runs.iter().filter(move |r| r.approach == a);
    let stat = |v: Vec<f64>| {
        let (median, min, max) = super::median(&v);
        super::report::Stat { median, min, max }
    };
    let stages = |a| stat(of(a).map(|r| r.stages_done as f64).collect());
    let stage_s = |a| stat(of(a).filter_map(|r| r.stage_s).collect());
    let usd = |a| stat(of(a).map(|r| r.usd).collect()).median;
    let (si, st) = (stages("single"), stages("striped"));
    let (sis, sts) = (stage_s("single"), stage_s("striped"));
    EphemeralSummary {
        stages_ratio: st.median / si.median.max(1e-9),
        stage_speedup: sis.median / sts.median.max(1e-9),
        cost_ratio: usd("striped") / usd("single").max(1e-12),
        resets: stat(of("striped").map(|r| r.resets.len() as f64).collect()),
        bad_pages: runs.iter().map(|r| r.bad_pages).sum(),
        errors: runs.iter().map(|r| r.errors).sum(),
        single_stages: si,
        striped_stages: st,
        single_stage_s: sis,
        striped_stage_s: sts,
    }
}

/// The full-scale stage size in GiB, for the report.
pub fn stage_gib(s: &Setting) -> f64 {
    s.ephemeral_stage as f64 / GIB as f64
}
