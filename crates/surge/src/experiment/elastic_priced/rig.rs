//! One run of one approach: a scaled local cloud, the approach's volume stack
//! exported over NBD, `surge load` as the application (its own process), a
//! sampler of dollars over time, billing at list prices, and the data checked
//! against what the application wrote.

use super::app::{unix_uri, Application};
use super::scenario::Scaled;
use crate::stack::elastic::{BoostSettings, ElasticParams, ElasticVolume, LoggedPlan};
use anyhow::{ensure, Context};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cache::CacheConfig;
use surge_block::model::{Scale, Shape};
use surge_block::{BlockDev, Clock, Counted, SystemClock};
use surge_cloud::cost::{CostMeter, WallClock};
use surge_cloud::{CreateRequest, Delays, LocalConfig, LocalProvider, ModifyRules, PriceTable, Provider, VolumeSpec};
use surge_nbd::{Export, Listen, Server, ServerConfig};
use surge_policy::modify::{ModifyAction, ModifyConfig, ModifyPolicy};
use surge_policy::{ElasticConfig, Worth};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Approach {
    #[serde(rename = "static-slow")]
    Slow,
    #[serde(rename = "static-fast")]
    Fast,
    #[serde(rename = "modify-volume")]
    Modify,
    #[serde(rename = "adaptive")]
    Adaptive,
}

impl Approach {
    pub const ALL: [Approach; 4] = [Approach::Slow, Approach::Fast, Approach::Modify, Approach::Adaptive];

    pub fn name(self) -> &'static str {
        match self {
            Approach::Slow => "static-slow",
            Approach::Fast => "static-fast",
            Approach::Modify => "modify-volume",
            Approach::Adaptive => "adaptive",
        }
    }
}

/// Dollars so far at one moment (full-scale seconds and dollars).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub storage_usd: f64,
    pub compute_usd: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub approach: Approach,
    pub rep: usize,
    /// Full-scale seconds (measured emulated seconds / time scale).
    pub completion_s: f64,
    pub storage_usd: f64,
    pub compute_usd: f64,
    pub total_usd: f64,
    /// Start and end of each burst, full-scale seconds from the start.
    pub bursts: Vec<(f64, f64)>,
    /// Every volume's bill: spec, seconds billed, dollars.
    pub bills: Vec<(String, u64, f64)>,
    pub decisions: Vec<String>,
    #[serde(skip)]
    pub plans: Vec<LoggedPlan>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
    pub verified_bytes: u64,
}

/// The policy settings every elastic and modify-volume run uses: the daemon's
/// defaults, durations and sizes at the run's scale; learn=true.
pub fn policy(s: &Scaled) -> ElasticConfig {
    let d = ElasticConfig::default();
    let shape = s.sc.backing.shape().expect("valid backing");
    let amount = |b: u64| ((b as f64 * s.rate * s.time) as u64).div_ceil(4096).max(1) * 4096;
    ElasticConfig {
        window: d.window.mul_f64(s.time),
        inactivity_delay: d.inactivity_delay.mul_f64(s.time),
        attach_delay: d.attach_delay.mul_f64(s.time),
        backing_bw: shape.bps.unwrap_or(0) as f64 * s.rate,
        backing_iops: shape.iops.map(|i| i as f64 * s.rate),
        initial_cache: amount(d.initial_cache),
        min_cache: amount(d.min_cache),
        max_cache: amount(d.max_cache),
        granularity: amount(d.granularity),
        learn_period: true,
        ..d
    }
}

fn provider(s: &Scaled, dir: &Path, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<LocalProvider>> {
    let d = Delays::default();
    let cfg = LocalConfig {
        delays: Delays { create: Duration::ZERO, attach: d.attach.mul_f64(s.time), detach: d.detach.mul_f64(s.time), delete: Duration::ZERO },
        scale: Scale { rate: s.rate, time: s.time },
        modify_rules: ModifyRules::ebs().scaled(s.time),
        epoch_unix_ns: Some(0),
        ..LocalConfig::new(dir)
    };
    Ok(Arc::new(LocalProvider::open(cfg, clock)?))
}

struct Stack {
    /// What the application reaches (counted).
    dev: Arc<Counted>,
    data_id: String,
    elastic: Option<Arc<ElasticVolume>>,
    modify: Option<(Arc<AtomicBool>, std::thread::JoinHandle<Vec<String>>)>,
}

fn create(prov: &LocalProvider, spec: &VolumeSpec, name: &str) -> anyhow::Result<(String, Arc<dyn BlockDev>)> {
    let info = prov.create(CreateRequest { spec: spec.clone(), name: Some(name.into()) })?;
    let dev = prov.attach(&info.id)?;
    Ok((info.id, dev))
}

/// modify-volume: one volume, raised to the peak on a burst, lowered when the
/// cloud's cooldown allows.
fn modify_controller(s: &Scaled, prov: Arc<LocalProvider>, id: String, io: Arc<Counted>, clock: Arc<dyn Clock>) -> (Arc<AtomicBool>, std::thread::JoinHandle<Vec<String>>) {
    let pol = policy(s);
    let shape = s.sc.backing.shape().expect("valid");
    let mut p = ModifyPolicy::new(ModifyConfig {
        window: pol.window,
        ut: pol.ut,
        inactivity_delay: pol.inactivity_delay,
        base_bw: shape.bps.unwrap_or(0) as f64 * s.rate,
        base_iops: shape.iops.map(|i| i as f64 * s.rate),
        rules: surge_policy::ModifyRules { cooldown: ModifyRules::ebs().scaled(s.time).cooldown },
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (base, peak, f) = (s.sc.backing.clone(), s.sc.peak.clone(), s.time);
    let st = stop.clone();
    let h = std::thread::spawn(move || {
        let mut log = Vec::new();
        let tick = pol.window / 10;
        let mut next = clock.now();
        while !st.load(Relaxed) {
            let c = io.stats();
            if let Some(d) = p.tick(clock.now(), c.read_bytes + c.write_bytes, c.reads + c.writes) {
                let to = if d.action == ModifyAction::Raise { &peak } else { &base };
                let r = prov.modify(&id, to.clone());
                log.push(format!("{:.1} s: {:?} to {to}: {} ({})", d.at.as_secs_f64() / f, d.action, d.reason, r.map_or_else(|e| format!("refused: {e}"), |_| "done".into())));
            }
            next += tick;
            clock.sleep_until(next.max(clock.now()));
        }
        log
    });
    (stop, h)
}

fn build(s: &Scaled, a: Approach, prov: &Arc<LocalProvider>, clock: &Arc<dyn Clock>) -> anyhow::Result<Stack> {
    Ok(match a {
        Approach::Slow | Approach::Fast => {
            let spec = if a == Approach::Slow { &s.sc.backing } else { &s.sc.peak };
            let (id, dev) = create(prov, spec, "app-volume")?;
            Stack { dev: Arc::new(Counted::new(dev)), data_id: id, elastic: None, modify: None }
        }
        Approach::Modify => {
            let (id, dev) = create(prov, &s.sc.backing, "app-volume")?;
            let io = Arc::new(Counted::new(dev));
            let ctl = modify_controller(s, prov.clone(), id.clone(), io.clone(), clock.clone());
            Stack { dev: io, data_id: id, elastic: None, modify: Some(ctl) }
        }
        Approach::Adaptive => {
            let pol = policy(s);
            let boost = BoostSettings {
                max_iops: s.sc.max_iops,
                max_bps: s.sc.max_bps,
                prices: PriceTable::default(),
                scale: Scale { rate: s.rate, time: s.time },
                ..BoostSettings::new(Worth::PerHour(PriceTable::default().instance_usd_hour(s.sc.instance, s.sc.nodes)?))
            };
            let tick = pol.window / 10;
            let cache = CacheConfig { block_size: s.sc.block, idle_gap: CacheConfig::default().idle_gap.mul_f64(s.time), ..CacheConfig::default() };
            let p = ElasticParams {
                name: "app".into(),
                backing: s.sc.backing.clone(),
                cache_bw: 0,
                policy: pol,
                cache,
                boost: Some(boost),
                tick,
                flusher_poll: Duration::from_millis(5),
                // One run, never restarted: no fence record to keep.
                fences: None,
                faults: Default::default(),
            };
            let pdyn: Arc<dyn Provider> = prov.clone();
            let v = ElasticVolume::open(p, pdyn, clock.clone())?;
            v.start();
            Stack { dev: Arc::new(Counted::new(v.clone())), data_id: v.backing_id().to_string(), elastic: Some(v), modify: None }
        }
    })
}

/// Run approach `a` once in `dir` (removed afterwards).
pub fn run(s: &Scaled, a: Approach, rep: usize, dir: &Path) -> anyhow::Result<RunResult> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let prov = provider(s, &dir.join("cloud"), clock.clone())?;
    let mut stack = build(s, a, &prov, &clock)?;
    let sock: PathBuf = dir.join("nbd.sock");
    let server = Server::start(ServerConfig::new(vec![Export::new("app", stack.dev.clone() as Arc<dyn BlockDev>)]))?;
    server.listen(&Listen::Unix(sock.clone()))?;
    // Compute: the instance the application runs on, billed while it runs.
    let prices = PriceTable { time_scale: s.time, ..PriceTable::default() };
    let meter = Arc::new(CostMeter::new(prices, WallClock { clock: clock.clone(), epoch_unix_ns: 0 }));
    let t0 = clock.now();
    meter.start_compute("app", s.sc.instance, s.sc.nodes)?;
    let stop = Arc::new(AtomicBool::new(false));
    // Sampler: dollars over time.
    let sampler = {
        let (stop, clock, prov, meter) = (stop.clone(), clock.clone(), prov.clone(), meter.clone());
        let f = s.time;
        let period = Duration::from_secs_f64(s.secs(2.0));
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut next = clock.now();
            while !stop.load(Relaxed) {
                let t = (clock.now() - t0).as_secs_f64() / f;
                let storage = prov.cost().map(|r| r.storage_usd).unwrap_or(f64::NAN);
                out.push(Sample { t_s: t, storage_usd: storage, compute_usd: meter.report().compute_usd });
                next += period;
                clock.sleep_until(next.max(clock.now()));
            }
            out
        })
    };
    // The application.
    let since = |t: Duration| (t - t0).as_secs_f64() / s.time;
    let t0_ns = crate::experiment::fairshare::client::monotonic_ns();
    let application = Application::new(&unix_uri(&sock, "app"), s);
    let app = application.run();
    let done = clock.now();
    meter.stop_compute("app");
    let at_completion = prov.cost()?;
    let mut decisions = Vec::new();
    // adaptive: the cache lives on until drained and deleted; the user pays for it.
    if let Some(e) = &stack.elastic {
        let deadline = clock.now() + Duration::from_secs_f64(s.secs(600.0));
        while e.cache_size() > 0 || e.cache().is_attached() {
            if clock.now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        e.stop();
        decisions = e.decisions().iter().map(|d| format!("{:.1} s: {:?}: {}", d.at_s / s.time, d.action, d.reason)).collect();
    }
    if let Some((stop, h)) = stack.modify.take() {
        stop.store(true, Relaxed);
        decisions = h.join().unwrap_or_default();
    }
    stop.store(true, Relaxed);
    let mut samples = sampler.join().unwrap_or_default();
    let at_end = prov.cost()?;
    samples.push(Sample { t_s: since(clock.now()), storage_usd: at_end.storage_usd, compute_usd: meter.report().compute_usd });
    let app = app.with_context(|| format!("{} run {rep}", a.name()))?;
    // The bursts as the application saw them, full-scale seconds from t0.
    let job = app.parsed.jobs.first().context("surge load reported no job")?;
    let off = (job.surge.started_monotonic_ns as f64 - t0_ns as f64) / 1e9;
    let bursts = job.surge.bursts.iter().map(|b| ((off + b.start_s) / s.time, (off + b.end_s) / s.time)).collect();
    if let Some(e) = &stack.elastic {
        ensure!(e.cache_size() == 0 && !e.cache().is_attached(), "the cache was not released within 600 s (full scale) after the run: {:?}", e.policy_state());
    }
    // Bills: the data volume until the application completed (the user keeps
    // it, at whatever spec it had then); cache volumes until deleted.
    let mut storage = 0.0;
    let mut bills = Vec::new();
    for (i, v) in at_end.volumes.iter().enumerate() {
        // Billing records only get appended: record i is the same in both.
        let v = match at_completion.volumes.get(i) {
            Some(c) if v.id == stack.data_id => c,
            _ => v,
        };
        storage += v.usd;
        bills.push((v.spec.clone(), v.billed_seconds, v.usd));
    }
    let compute = meter.report().compute_usd;
    // Verify through the same stack, the volume models unthrottled.
    if let Some(m) = prov.model(&stack.data_id) {
        m.set_shape(Shape::default());
    }
    let verified = application.verify(&app, stack.dev.as_ref()).with_context(|| format!("{} run {rep}: data check", a.name()))?;
    let plans = stack.elastic.as_ref().map(|e| e.boost_plans()).unwrap_or_default();
    server.shutdown()?;
    drop(stack);
    drop(prov);
    let _ = std::fs::remove_dir_all(dir);
    Ok(RunResult {
        approach: a,
        rep,
        completion_s: (done - t0).as_secs_f64() / s.time,
        storage_usd: storage,
        compute_usd: compute,
        total_usd: storage + compute,
        bursts,
        bills,
        decisions,
        plans,
        samples,
        verified_bytes: verified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_the_daemons_at_the_runs_scale() {
        let s = super::super::scenarios(&super::super::Plan { quick: true, time: 0.05, rate: 1.0 / 16.0, reps: 1, parallel: true }).remove(1);
        let p = policy(&s);
        let d = ElasticConfig::default();
        assert_eq!(p.window, d.window.mul_f64(0.05));
        assert_eq!(p.inactivity_delay, d.inactivity_delay.mul_f64(0.05));
        assert_eq!((p.ut, p.shrink), (d.ut, d.shrink));
        assert_eq!(p.backing_iops, Some(3_000.0 / 16.0), "gp3's 3,000 IOPS at rate 1/16");
        assert!(p.learn_period, "the one policy deviation, listed in the report");
    }
}
