//! `surge experiment burstable`: the burstable-volumes paper's Figures 1, 3 and
//! 5 on the local cloud, and one real-time persistent swap under fio `verify`
//! through NBD.
//!
//! - Figure 1: 500 GiB of gp2 as 1, 2, 5 or 10 volumes striped, 4 KiB random
//!   reads, with full and with spent credits; and the cost of 30,000 IOPS.
//! - Figure 3 (persistent): one 100 GiB gp2 vs 10 x 10 GiB gp2 striped with
//!   all-at-once member swaps (mirror rebuilds), 4 KiB random reads and 50/50
//!   reads/writes on an 80 GiB file, over 80 minutes.
//! - Figure 5 (cache): a write-through cache of 32 KiB blocks on 10 x 10 GiB
//!   gp2 (swapped empty when spent) vs on one 100 GiB gp2 vs no cache, in front
//!   of a 2 TiB st1, 1 MiB requests, Zipf theta 1.2 over a 200 GiB file, 90 %
//!   reads (and read-only in the full run), over 200 minutes.
//!
//! These long horizons run on VIRTUAL TIME through the real layers: every
//! request is really executed (stripe, mirror, cache, device models, volume
//! files on tmpfs), the provider and the swap controller are the daemon's, and
//! all threads share one discrete-event clock (`surge_block::SimClock`). The run
//! is at reduced scale f: sizes, durations and credit buckets times f, rates
//! (IOPS, MiB/s) as published, so every proportion holds. The live run is real
//! time at full scale.

mod ephemeral;
mod live;
mod plot;
mod report;
use surge_sim::threaded as sim;

use crate::stack::burstable::{BurstableParams, BurstableVolume, LoggedDecision, SwapRecord};
use anyhow::Context;
use serde::Serialize;
use sim::{Sample, Tally, Workload};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::{CacheConfig, CacheMode, ElasticCache};
use surge_block::mirror::{MirrorConfig, MirrorProgress};
use surge_block::model::{GIB, MIB};
use surge_block::{BlockDev, Clock, SimClock};
use surge_cloud::{CreateRequest, PriceTable, Provider, VolumeSpec};
use surge_policy::burstable::{BurstableConfig, Mode, Strategy};

/// The paper's settings at full scale, and the scale of this run.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub scale: f64,
    pub runs: usize,
    pub capacity: u64,
    pub members: usize,
    pub persistent_file: u64,
    pub persistent_window_s: f64,
    pub persistent_workers: usize,
    pub cache_capacity: u64,
    pub backing: String,
    pub cache_file: u64,
    pub cache_window_s: f64,
    pub cache_workers: usize,
    pub cache_block: u64,
    pub cache_request: u64,
    pub zipf_theta: f64,
    pub cache_read_pcts: Vec<u32>,
    pub chunk: u64,
    pub region: u64,
    pub rebuild_rate: u64,
    pub attach_delay_s: f64,
    pub tick_s: f64,
    pub min_interval_s: f64,
    pub margin: f64,
    pub bin_s: f64,
    pub fig1_capacity: u64,
    pub fig1_members: Vec<usize>,
    /// Model seconds of the spent-credit runs (steady, not scaled); runs with
    /// full buckets last half the shortest burst (5.4 M x f / 3,000 / 2 s).
    pub fig1_window_s: f64,
    pub billing_minimum_s: f64,
    /// §3.3 (ephemeral intermediate data): capacity, data per stage, request
    /// size, workers, compute gap between stages and the window.
    pub ephemeral_capacity: u64,
    pub ephemeral_stage: u64,
    pub ephemeral_bs: u64,
    pub ephemeral_workers: usize,
    pub ephemeral_gap_s: f64,
    pub ephemeral_window_s: f64,
}

impl Setting {
    pub fn new(quick: bool) -> Self {
        Setting {
            scale: if quick { 1.0 / 1000.0 } else { 1.0 / 100.0 },
            runs: if quick { 1 } else { 3 },
            capacity: 100 * GIB,
            members: 10,
            persistent_file: 80 * GIB,
            persistent_window_s: 80.0 * 60.0,
            persistent_workers: 64,
            cache_capacity: 100 * GIB,
            backing: "st1:2TiB".into(),
            cache_file: 200 * GIB,
            cache_window_s: 200.0 * 60.0,
            cache_workers: 16,
            cache_block: 32 * 1024,
            cache_request: MIB,
            zipf_theta: 1.2,
            cache_read_pcts: if quick { vec![90] } else { vec![90, 100] },
            chunk: 64 * 1024,
            region: MIB,
            rebuild_rate: 64 * MIB,
            attach_delay_s: 3.0,
            tick_s: 5.0,
            min_interval_s: 60.0,
            margin: 1.5,
            bin_s: if quick { 60.0 } else { 30.0 },
            fig1_capacity: 500 * GIB,
            fig1_members: vec![1, 2, 5, 10],
            fig1_window_s: 10.0,
            billing_minimum_s: 60.0,
            ephemeral_capacity: 100 * GIB,
            ephemeral_stage: 32 * GIB,
            ephemeral_bs: 16 * 1024,
            ephemeral_workers: 32,
            ephemeral_gap_s: 300.0,
            ephemeral_window_s: 4.0 * 3600.0,
        }
    }

    /// Model time of a full-scale duration.
    fn t(&self, full_s: f64) -> Duration {
        Duration::from_secs_f64(full_s * self.scale)
    }

    /// Device bytes of a full-scale size.
    fn b(&self, full: u64) -> u64 {
        ((full as f64 * self.scale) as u64) / 4096 * 4096
    }
}

/// One virtual-time run of one approach.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub approach: String,
    pub workload: String,
    pub run: usize,
    /// Average over the whole window.
    pub iops: f64,
    pub mib_s: f64,
    /// Average over the second half of the window (after a fresh single volume's credits are gone).
    pub iops_second_half: f64,
    pub mib_s_second_half: f64,
    /// Dollars of the volumes over the window (model time, full-size prices).
    pub usd: f64,
    /// The same for the cache volumes only (cache runs).
    pub usd_cache_volumes: Option<f64>,
    /// Dollars per month at this rate (f cancels out).
    pub usd_month: f64,
    pub errors: u64,
    /// Pages whose stamp was wrong when read back after the run (persistent).
    pub bad_pages: Option<u64>,
    pub cache_hit_ratio: Option<f64>,
    pub swaps: Vec<SwapRecord>,
    pub decisions: Vec<LoggedDecision>,
    /// Real seconds the run took.
    pub wall_s: f64,
    /// Model time at which the window started (swap and decision times are absolute).
    pub t0_s: f64,
    /// Times the discrete-event clock moved past threads blocked on each
    /// other (a lock held across a modelled I/O).
    pub sim_forced_advances: u64,
    /// Mirror rebuilds still in flight when the window ended (slot,
    /// progress): a decided swap that never finished shows here, started or not.
    pub rebuilds_at_end: Vec<(usize, MirrorProgress)>,
    /// The timeline (model seconds since the window started).
    pub samples: Vec<Sample>,
}

fn burstable_params(s: &Setting, name: &str, mode: Mode, members: usize, capacity: u64, dir: &Path) -> anyhow::Result<BurstableParams> {
    let gib = capacity.div_ceil(members as u64) / GIB;
    let member: VolumeSpec = format!("gp2:{gib}GiB").parse()?;
    Ok(BurstableParams {
        name: name.into(),
        mode,
        // The whole stripe, as the paper's volumes were.
        size: members as u64 * member.size,
        members,
        policy: BurstableConfig {
            mode,
            strategy: Strategy::AllAtOnce,
            // What a swap copies on this run's (scaled) devices.
            member_size: s.b(member.size),
            swap_below: None,
            margin: s.margin,
            auto_floor: 0.05,
            rebuild_rate: s.rebuild_rate,
            op_size: surge_block::model::SSD_OP,
            swap_setup: s.t(s.attach_delay_s),
            attach_limit: 27,
            min_interval: s.t(s.min_interval_s),
            ephemeral_idle: s.t(5.0),
            tick: s.t(s.tick_s),
        },
        member,
        // As the daemon's default: a cache stripes at its block size.
        chunk: if mode == Mode::Cache { s.cache_block } else { s.chunk },
        mirror: MirrorConfig { region: s.region, ..MirrorConfig::default() },
        rebuild_rate: Some(s.rebuild_rate),
        backing: (mode == Mode::Cache).then(|| s.backing.parse()).transpose()?,
        cache_block: s.cache_block,
        keep: false,
        tick: s.t(s.tick_s),
        state_dir: dir.join("state"),
        // One member per request in these workloads; no thread fan-out on the sim clock.
        parallel: false,
        progress_bars: false,
        cloudwatch_every: std::time::Duration::from_secs(60),
        // The local cloud's UNIX time of the clock's zero (no CloudWatch here).
        epoch_unix_ns: Some(0),
    })
}

const TAG: u64 = 0xB0257AB1E;

fn finish_run(
    approach: &str,
    w: &Workload,
    run: usize,
    samples: Vec<Sample>,
    tally: &Tally,
    usd: f64,
    started: std::time::Instant,
) -> Run {
    let window = samples.last().map_or(0.0, |x| x.t);
    let ops = |x: &Sample| x.ops;
    let bytes = |x: &Sample| x.bytes;
    let iops = sim::average(&samples, ops, 0.0, window);
    let mib = sim::average(&samples, bytes, 0.0, window) / MIB as f64;
    Run {
        approach: approach.into(),
        workload: w.name.clone(),
        run,
        iops,
        mib_s: mib,
        iops_second_half: sim::average(&samples, ops, window / 2.0, window),
        mib_s_second_half: sim::average(&samples, bytes, window / 2.0, window) / MIB as f64,
        usd,
        usd_cache_volumes: None,
        usd_month: if window > 0.0 { usd * PriceTable::default().seconds_per_month as f64 / window } else { 0.0 },
        errors: tally.errors.load(std::sync::atomic::Ordering::Relaxed),
        bad_pages: None,
        cache_hit_ratio: None,
        swaps: vec![],
        decisions: vec![],
        wall_s: started.elapsed().as_secs_f64(),
        t0_s: 0.0,
        sim_forced_advances: 0,
        rebuilds_at_end: vec![],
        samples,
    }
}

/// An empty directory for one run (a run's cloud and the burstable volume's
/// state must start together: a leftover state would look like a restart).
fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// What one measured window produced.
struct Measured {
    t0: Duration,
    samples: Vec<Sample>,
    tally: Arc<Tally>,
    cost0: surge_cloud::CostReport,
    cost1: surge_cloud::CostReport,
    rebuilds_at_end: Vec<(usize, MirrorProgress)>,
}

/// Run `w` on `dev` for `window` from now: start the burstable volume's
/// controller, sample throughput and credits (of `fixed` volumes, or of the
/// burstable volume's members), stop the controller. The bill is read at the
/// window's end (requests in flight finish after it).
#[allow(clippy::too_many_arguments)]
fn measure(
    clock: &Arc<SimClock>,
    prov: &Arc<surge_cloud::LocalProvider>,
    dev: &Arc<dyn BlockDev>,
    vol: &Option<Arc<BurstableVolume>>,
    fixed: Vec<String>,
    w: &Workload,
    window: Duration,
    bin: Duration,
    seed: u64,
) -> anyhow::Result<Measured> {
    let t0 = clock.now();
    let until = t0 + window;
    let cost0 = prov.cost()?;
    let hold = clock.hold();
    if let Some(v) = vol {
        v.start().context("starting the burstable controller")?;
    }
    let tally = Arc::new(Tally::default());
    let bill: Arc<parking_lot::Mutex<Option<surge_cloud::CostReport>>> = Default::default();
    let sampler = {
        let (prov, vol, bill) = (prov.clone(), vol.clone(), bill.clone());
        sim::spawn_sampler(clock.clone(), t0, bin, until, tally.clone(), move |last| {
            if last {
                *bill.lock() = prov.cost().ok();
            }
            let ids = vol.as_ref().map_or_else(|| fixed.clone(), |v| v.member_ids());
            sim::credits_of(&prov, &ids)
        })
    };
    sim::run_workers(dev, clock, w, until, &tally, seed, hold);
    let samples = sampler.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let rebuilds_at_end = vol.as_ref().map(|v| v.rebuilds()).unwrap_or_default();
    if let Some(v) = vol {
        v.stop();
    }
    let cost1 = match bill.lock().take() {
        Some(c) => c,
        None => prov.cost()?,
    };
    Ok(Measured { t0, samples, tally, cost0, cost1, rebuilds_at_end })
}

/// The device of a single-vs-striped comparison.
#[derive(Clone, Copy)]
enum UnderTest {
    /// One gp2 volume of the whole capacity, named so.
    Single { name: &'static str },
    /// A burstable volume over `s.members` gp2 members.
    Striped { name: &'static str, mode: Mode },
}

fn open_under_test(s: &Setting, prov: &Arc<dyn Provider>, clock: &Arc<dyn Clock>, what: UnderTest, capacity: u64, dir: &Path) -> anyhow::Result<(Arc<dyn BlockDev>, Option<Arc<BurstableVolume>>)> {
    Ok(match what {
        UnderTest::Striped { name, mode } => {
            let v = BurstableVolume::open(burstable_params(s, name, mode, s.members, capacity, dir)?, prov.clone(), clock.clone())?;
            (v.clone(), Some(v))
        }
        UnderTest::Single { name } => {
            let spec = VolumeSpec { model: surge_block::model::VolumeModel::Gp2, size: capacity, latency: Duration::ZERO };
            let info = prov.create(CreateRequest { spec, name: Some(name.into()) })?;
            (prov.attach(&info.id)?, None)
        }
    })
}

/// Figure 3: one 100 GiB gp2 ("single") or 10 x 10 GiB striped with swaps ("striped").
fn run_persistent(s: &Setting, striped: bool, w: &Workload, run: usize, dir: &Path) -> anyhow::Result<Run> {
    let started = std::time::Instant::now();
    fresh_dir(dir)?;
    let clock = SimClock::new();
    let c: Arc<dyn Clock> = clock.clone();
    let prov = sim::provider(&dir.join("cloud"), c.clone(), s.scale, s.t(s.attach_delay_s))?;
    let pdyn: Arc<dyn Provider> = prov.clone();
    let approach = if striped { "striped" } else { "single" };
    let under_test = if striped { UnderTest::Striped { name: "striped", mode: Mode::Persistent } } else { UnderTest::Single { name: "single-vol" } };
    let (dev, vol) = open_under_test(s, &pdyn, &c, under_test, s.capacity, dir)?;
    let ids = |v: &Option<Arc<BurstableVolume>>| -> anyhow::Result<Vec<String>> {
        Ok(match v {
            Some(v) => v.member_ids(),
            None => vec![sim::id_of(prov.as_ref(), "single-vol")?],
        })
    };
    // fio lays out its file first; then every bucket starts full.
    sim::lay_out(dev.as_ref(), w.region, TAG)?;
    for id in ids(&vol)? {
        sim::set_op_credits(&prov, &id, 1.0);
    }
    let single = if vol.is_none() { ids(&None)? } else { vec![] };
    let m = measure(&clock, &prov, &dev, &vol, single, w, s.t(s.persistent_window_s), s.t(s.bin_s), 0x5eed + run as u64)?;
    let (t0, samples, tally, cost0, cost1) = (m.t0, m.samples, m.tally, m.cost0, m.cost1);
    let prefix = if striped { "striped-" } else { "single-" };
    let usd = sim::usd_between(&PriceTable::default(), &cost0, &cost1, prefix, s.scale);
    let mut r = finish_run(approach, w, run, samples, &tally, usd, started);
    r.t0_s = t0.as_secs_f64();
    r.sim_forced_advances = clock.forced_advances();
    r.rebuilds_at_end = m.rebuilds_at_end;
    r.bad_pages = Some(sim::bad_pages(dev.as_ref(), w.region, TAG)?);
    if let Some(v) = &vol {
        r.swaps = v.swaps();
        r.decisions = v.decisions();
    }
    drop((dev, vol, pdyn));
    drop(prov);
    Ok(r)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheKind {
    None,
    Single,
    Striped,
}

/// The device under test, the burstable volume (if any) and its cache layer.
type CacheStack = (Arc<dyn BlockDev>, Option<Arc<BurstableVolume>>, Option<Arc<ElasticCache>>);

/// Figure 5: no cache, a cache on one 100 GiB gp2, or on 10 x 10 GiB swapped.
fn run_cache(s: &Setting, kind: CacheKind, w: &Workload, run: usize, dir: &Path) -> anyhow::Result<Run> {
    let started = std::time::Instant::now();
    fresh_dir(dir)?;
    let clock = SimClock::new();
    let c: Arc<dyn Clock> = clock.clone();
    let prov = sim::provider(&dir.join("cloud"), c.clone(), s.scale, s.t(s.attach_delay_s))?;
    let pdyn: Arc<dyn Provider> = prov.clone();
    let backing: VolumeSpec = s.backing.parse()?;
    let cache_cfg = CacheConfig { block_size: s.cache_block, mode: CacheMode::WriteThrough, ..CacheConfig::default() };
    let (approach, prefix) = match kind {
        CacheKind::None => ("none", "none-"),
        CacheKind::Single => ("single", "single-"),
        CacheKind::Striped => ("striped", "striped-"),
    };
    let (dev, vol, cache): CacheStack = match kind {
        CacheKind::None => {
            let b = prov.create(CreateRequest { spec: backing, name: Some("none-backing".into()) })?;
            (prov.attach(&b.id)?, None, None)
        }
        CacheKind::Single => {
            let b = prov.create(CreateRequest { spec: backing, name: Some("single-backing".into()) })?;
            let g = prov.create(CreateRequest { spec: format!("gp2:{}GiB", s.cache_capacity / GIB).parse()?, name: Some("single-cache".into()) })?;
            let cache = Arc::new(ElasticCache::new(prov.attach(&b.id)?, cache_cfg, c.clone()));
            cache.attach(prov.attach(&g.id)?)?;
            (cache.clone(), None, Some(cache))
        }
        CacheKind::Striped => {
            let v = BurstableVolume::open(burstable_params(s, "striped", Mode::Cache, s.members, s.cache_capacity, dir)?, pdyn.clone(), c.clone())?;
            let cache = v.cache().cloned();
            (v.clone(), Some(v), cache)
        }
    };
    // The paper measured st1 at 79 MiB/s, its 80 MiB/s baseline: its burst
    // bucket was spent. Start it empty.
    sim::set_byte_credits(&prov, &sim::id_of(prov.as_ref(), &format!("{prefix}backing"))?, 0.0);
    let cache_ids = |vol: &Option<Arc<BurstableVolume>>| -> Vec<String> {
        match (kind, vol) {
            (CacheKind::Striped, Some(v)) => v.member_ids(),
            (CacheKind::Single, _) => sim::id_of(prov.as_ref(), "single-cache").into_iter().collect(),
            _ => vec![],
        }
    };
    let m = measure(&clock, &prov, &dev, &vol, cache_ids(&None), w, s.t(s.cache_window_s), s.t(s.bin_s), 0xcace + run as u64)?;
    let (t0, samples, tally, cost0, cost1) = (m.t0, m.samples, m.tally, m.cost0, m.cost1);
    let prices = PriceTable::default();
    let usd = sim::usd_between(&prices, &cost0, &cost1, prefix, s.scale);
    let mut r = finish_run(approach, w, run, samples, &tally, usd, started);
    r.t0_s = t0.as_secs_f64();
    r.sim_forced_advances = clock.forced_advances();
    r.usd_cache_volumes = match kind {
        CacheKind::None => None,
        CacheKind::Single => Some(sim::usd_between(&prices, &cost0, &cost1, "single-cache", s.scale)),
        CacheKind::Striped => Some(sim::usd_between(&prices, &cost0, &cost1, "striped-s", s.scale)),
    };
    if let Some(c) = &cache {
        let st = c.stats();
        r.cache_hit_ratio = Some(st.hits as f64 / (st.hits + st.misses).max(1) as f64);
    }
    if let Some(v) = &vol {
        r.swaps = v.swaps();
        r.decisions = v.decisions();
    }
    Ok(r)
}

/// Figure 1(a): `members` x (500 GiB / members) gp2, 4 KiB random reads, with
/// full or spent credits; average IOPS over a minute (full scale).
fn run_fig1(s: &Setting, members: usize, spent: bool, run: usize, dir: &Path) -> anyhow::Result<f64> {
    fresh_dir(dir)?;
    let clock = SimClock::new();
    let c: Arc<dyn Clock> = clock.clone();
    let prov = sim::provider(&dir.join("cloud"), c.clone(), s.scale, Duration::ZERO)?;
    let pdyn: Arc<dyn Provider> = prov.clone();
    let v = BurstableVolume::open(burstable_params(s, "fig1", Mode::Persistent, members, s.fig1_capacity, dir)?, pdyn, c)?;
    for id in v.member_ids() {
        sim::set_op_credits(&prov, &id, if spent { 0.0 } else { 1.0 });
    }
    let dev: Arc<dyn BlockDev> = v.clone();
    let w = Workload { name: "randread".into(), bs: 4096, workers: s.persistent_workers, region: dev.size(), read_pct: 100, zipf: None, tag: TAG };
    let tally = Arc::new(Tally::default());
    // A window long enough to count (the spent case is steady, so it need not
    // scale), and within the burst of full buckets (half of the shortest).
    let window = if spent { Duration::from_secs_f64(s.fig1_window_s) } else { Duration::from_secs_f64(5_400_000.0 * s.scale / 3_000.0 / 2.0) };
    let t0 = clock.now();
    let until = t0 + window;
    sim::run_workers(&dev, &clock, &w, until, &tally, 1 + run as u64, clock.hold());
    let ops = tally.ops.load(std::sync::atomic::Ordering::Relaxed);
    Ok(ops as f64 / (clock.now() - t0).as_secs_f64().max(1e-9))
}

#[derive(Debug, Clone, Serialize)]
pub struct Fig1Point {
    pub members: usize,
    pub member_gib: u64,
    /// Medians over the runs.
    pub iops_full_credits: f64,
    pub iops_spent_credits: f64,
    pub full_credits: report::Stat,
    pub spent_credits: report::Stat,
}

/// Figure 1's points: medians and spread of every (members, credits) over the runs.
fn fig1_points(s: &Setting, runs: &[(usize, bool, f64)]) -> Vec<Fig1Point> {
    let stat = |n: usize, spent: bool| {
        let v: Vec<f64> = runs.iter().filter(|r| r.0 == n && r.1 == spent).map(|r| r.2).collect();
        let (median, min, max) = median(&v);
        report::Stat { median, min, max }
    };
    s.fig1_members
        .iter()
        .map(|&n| {
            let (full, spent) = (stat(n, false), stat(n, true));
            Fig1Point { members: n, member_gib: s.fig1_capacity / n as u64 / GIB, iops_full_credits: full.median, iops_spent_credits: spent.median, full_credits: full, spent_credits: spent }
        })
        .collect()
}

/// Median and (min, max) of a list.
pub fn median(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = if s.len() % 2 == 1 { s[s.len() / 2] } else { (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0 };
    (m, s[0], s[s.len() - 1])
}

/// Where the volume files of the virtual-time runs go (tmpfs when there is one).
fn work_dir(out: &Path) -> PathBuf {
    match std::env::var_os("SURGE_BURSTABLE_VOLUMES") {
        Some(d) => PathBuf::from(d),
        None if Path::new("/dev/shm").is_dir() => Path::new("/dev/shm").join(format!("surge-burstable-{}", std::process::id())),
        None => out.join("cloud"),
    }
}

fn progress(total: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
    pb.set_style(indicatif::ProgressStyle::with_template("burstable [{bar:30}] {pos}/{len} runs, {elapsed} {msg}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    pb
}

pub fn run(out: &Path, quick: bool) -> anyhow::Result<()> {
    let mut s = Setting::new(quick);
    if let Some(f) = std::env::var("SURGE_BURSTABLE_SCALE").ok().and_then(|v| v.parse::<f64>().ok()) {
        s.scale = f;
    }
    let work = work_dir(out);
    let persistent_loads = [
        Workload { name: "randread".into(), bs: 4096, workers: s.persistent_workers, region: s.b(s.persistent_file), read_pct: 100, zipf: None, tag: TAG },
        Workload { name: "randrw".into(), bs: 4096, workers: s.persistent_workers, region: s.b(s.persistent_file), read_pct: 50, zipf: None, tag: TAG },
    ];
    let cache_loads: Vec<Workload> = s
        .cache_read_pcts
        .iter()
        .map(|&pct| Workload {
            name: if pct == 100 { "zipf-read".into() } else { format!("zipf-{pct}r") },
            bs: s.cache_request,
            workers: s.cache_workers,
            region: s.b(s.cache_file) / s.cache_request * s.cache_request,
            read_pct: pct,
            zipf: Some(s.zipf_theta),
            tag: TAG,
        })
        .collect();
    let total = (s.runs * (2 * persistent_loads.len() + 3 * cache_loads.len() + 2 * s.fig1_members.len() + 2) + 1) as u64;
    let pb = progress(total);
    let mut runs: Vec<Run> = Vec::new();
    let mut eph = Vec::new();
    let mut fig1_runs = Vec::new();
    // Interleaved: every approach once per round.
    for round in 0..s.runs {
        for w in &persistent_loads {
            for striped in [false, true] {
                let name = if striped { "striped" } else { "single" };
                pb.set_message(format!("persistent {} {name}", w.name));
                let dir = work.join(format!("p-{}-{name}", w.name));
                let r = run_persistent(&s, striped, w, round, &dir).with_context(|| format!("persistent {} {name}", w.name))?;
                let _ = std::fs::remove_dir_all(&dir);
                pb.inc(1);
                runs.push(r);
            }
        }
        for w in &cache_loads {
            for kind in [CacheKind::None, CacheKind::Single, CacheKind::Striped] {
                pb.set_message(format!("cache {} {kind:?}", w.name));
                let dir = work.join(format!("c-{}-{kind:?}", w.name));
                let r = run_cache(&s, kind, w, round, &dir).with_context(|| format!("cache {} {kind:?}", w.name))?;
                let _ = std::fs::remove_dir_all(&dir);
                pb.inc(1);
                runs.push(r);
            }
        }
        for striped in [false, true] {
            let name = if striped { "striped" } else { "single" };
            pb.set_message(format!("ephemeral stages {name}"));
            let dir = work.join(format!("e-{name}"));
            let r = ephemeral::run(&s, striped, round, &dir).with_context(|| format!("ephemeral {name}"))?;
            let _ = std::fs::remove_dir_all(&dir);
            pb.inc(1);
            eph.push(r);
        }
        for &n in &s.fig1_members {
            pb.set_message(format!("figure 1: {n} members"));
            for spent in [false, true] {
                let iops = run_fig1(&s, n, spent, round, &work.join(format!("f1-{n}-{spent}")))?;
                fig1_runs.push((n, spent, iops));
                pb.inc(1);
            }
        }
    }
    let fig1 = fig1_points(&s, &fig1_runs);
    let ephemeral = ephemeral::summarize(&eph);
    let _ = std::fs::remove_dir_all(&work);
    pb.set_message("live: fio verify through NBD during a swap (real time)");
    let live = live::run(out, quick).context("the real-time run (fio verify through NBD)")?;
    pb.inc(1);
    pb.finish_and_clear();
    let results = report::Results::new(&s, &runs, fig1, ephemeral, live);
    plot::all(out, &s, &runs, &results)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&results.json(&s, &runs, &eph))?)?;
    let md = report::markdown(&s, &runs, &results, quick, &work);
    std::fs::write(out.join("report.md"), &md)?;
    println!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figure 3's striped randrw case, cut short after the first swap
    /// (`SURGE_SWAPSTALL_RUNS` runs, default 3): every run must complete the
    /// all-at-once swap its decision starts. On a loaded machine one run in a
    /// few once decided a swap that never happened (the old members' baseline
    /// IOPS for the rest of the window). Slow (seconds per run): ignored by
    /// default.
    #[test]
    #[ignore]
    fn every_striped_randrw_run_completes_its_first_swap() {
        let mut s = Setting::new(false);
        s.persistent_window_s = 2200.0; // 22 s of model time: a swap starts at ~17.5 s, lasts ~1.5 s
        let w = Workload { name: "randrw".into(), bs: 4096, workers: s.persistent_workers, region: s.b(s.persistent_file), read_pct: 50, zipf: None, tag: TAG };
        let runs: usize = std::env::var("SURGE_SWAPSTALL_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
        // On tmpfs, as the experiment's volumes (see `work_dir`).
        let dir = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm") } else { Path::new("/tmp") }).unwrap();
        for run in 0..runs {
            let r = run_persistent(&s, true, &w, run, &dir.path().join("p")).unwrap();
            eprintln!("run {run}: decisions {} swaps {} iops {:.0} second half {:.0} forced {} wall {:.1} s; in flight at the end {:?}", r.decisions.len(), r.swaps.len(), r.iops, r.iops_second_half, r.sim_forced_advances, r.wall_s, r.rebuilds_at_end);
            assert_eq!(r.decisions.len(), 1, "run {run}: {:?}", r.decisions);
            assert_eq!(r.swaps.len(), 10, "run {run}: the decided swap of all 10 members did not complete: {:?}", r.swaps);
            assert_eq!((r.errors, r.bad_pages), (0, Some(0)), "run {run}");
        }
    }
}
