//! One run of one approach, every part its own process as a user runs it:
//! `surge serve` with the approach's export (a spec string, built by the
//! daemon's own builders, on a local cloud at the run's scale), `surge load`
//! as the application over NBD, and for modify-volume a controller that
//! watches the export's I/O and modifies the volume through the daemon's
//! control API, as a user's script would. Beside them: a sampler of dollars
//! over time, billing at list prices (the instance until it could stop, the
//! drain included), and the data read back once the daemon has stopped.

use super::app::Application;
use super::scenario::Scaled;
use crate::experiment::daemon::{self, Daemon, DaemonSpec, ElasticLog};
use crate::stack::volume::LocalCloud;
use anyhow::{ensure, Context};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::model::{Scale, KIB, MIB};
use surge_cloud::cost::{CostMeter, WallClock};
use surge_cloud::{Delays, ModifyRules, PriceTable, Provider};
use surge_policy::modify::{ModifyAction, ModifyConfig, ModifyPolicy};
use surge_policy::ElasticConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Approach {
    #[serde(rename = "static-slow")]
    Slow,
    #[serde(rename = "static-fast")]
    Fast,
    /// Under EBS's newer rule (four modifications per rolling 24 h).
    #[serde(rename = "modify-volume")]
    Modify,
    /// Under EBS's classic rule (one modification per 6 h).
    #[serde(rename = "modify-volume-6h")]
    ModifyClassic,
    #[serde(rename = "adaptive")]
    Adaptive,
}

impl Approach {
    pub const ALL: [Approach; 5] = [Approach::Slow, Approach::Fast, Approach::Modify, Approach::ModifyClassic, Approach::Adaptive];

    pub fn name(self) -> &'static str {
        match self {
            Approach::Slow => "static-slow",
            Approach::Fast => "static-fast",
            Approach::Modify => "modify-volume",
            Approach::ModifyClassic => "modify-volume-6h",
            Approach::Adaptive => "adaptive",
        }
    }

    fn modifies(self) -> bool {
        matches!(self, Approach::Modify | Approach::ModifyClassic)
    }

    /// The modification rule of the run's cloud.
    pub fn rule(self) -> Rule {
        if self == Approach::ModifyClassic {
            Rule::Classic
        } else {
            Rule::Rolling
        }
    }
}

/// EBS's modification rule a modify-volume run is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Rule {
    /// Four modifications per rolling 24 h, each after the previous completed.
    #[serde(rename = "ebs-24h")]
    Rolling,
    /// One modification per 6 hours.
    #[serde(rename = "ebs-6h")]
    Classic,
}

impl Rule {
    pub fn flag(self) -> &'static str {
        match self {
            Rule::Rolling => "ebs-24h",
            Rule::Classic => "ebs-6h",
        }
    }
    pub fn rules(self) -> ModifyRules {
        match self {
            Rule::Rolling => ModifyRules::ebs_rolling(),
            Rule::Classic => ModifyRules::ebs(),
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
    /// The cloud's modification rule.
    pub rule: Rule,
    pub rep: usize,
    /// Full-scale seconds (measured emulated seconds / time scale).
    pub completion_s: f64,
    /// How long the instance was billed: until it could stop (the
    /// application done, and for adaptive the cache drained and deleted).
    pub instance_s: f64,
    pub storage_usd: f64,
    pub compute_usd: f64,
    pub total_usd: f64,
    /// Start and end of each burst, full-scale seconds from the start.
    pub bursts: Vec<(f64, f64)>,
    /// Every volume's bill: spec, seconds billed, dollars.
    pub bills: Vec<(String, u64, f64)>,
    pub decisions: Vec<String>,
    #[serde(skip)]
    pub plans: Vec<serde_json::Value>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
    pub verified_bytes: u64,
}

/// The run's local cloud.
pub fn local(s: &Scaled) -> LocalCloud {
    LocalCloud { scale: Scale { rate: s.rate, time: s.time }, ..Default::default() }
}

/// The policy the daemon runs for this scenario's elastic export, and the
/// modify-volume controller uses: the daemon's defaults at the run's scale.
pub fn policy(s: &Scaled) -> ElasticConfig {
    let shape = s.sc.backing.shape().expect("valid backing");
    let full = ElasticConfig { backing_bw: shape.bps.unwrap_or(0) as f64, backing_iops: shape.iops.map(|i| i as f64), ..ElasticConfig::default() };
    let l = local(s);
    crate::stack::elastic::scaled_policy(full, &l, l.duration(Delays::default().attach))
}

/// The approach's export, as a user writes it.
pub fn export(s: &Scaled, a: Approach) -> anyhow::Result<String> {
    Ok(match a {
        Approach::Slow | Approach::Modify | Approach::ModifyClassic => format!("app={}", s.sc.backing),
        Approach::Fast => format!("app={}", s.sc.peak),
        Approach::Adaptive => {
            let mut e = format!("app=elastic:backing={},cache=auto,value_per_hour={}", s.sc.backing, PriceTable::default().instance_usd_hour(s.sc.instance, s.sc.nodes)?);
            if s.sc.block != 64 * KIB {
                e.push_str(&format!(",block={}", surge_block::units::format_size(s.sc.block)));
            }
            if s.sc.max_iops != 16_000.0 {
                e.push_str(&format!(",max_iops={}", s.sc.max_iops));
            }
            if s.sc.max_bps != 1_000.0 * MIB as f64 {
                e.push_str(&format!(",max_throughput={}/s", s.sc.max_bps as u64));
            }
            e
        }
    })
}

/// How the daemon of approach `a` is started.
pub fn daemon_spec(s: &Scaled, a: Approach) -> anyhow::Result<DaemonSpec> {
    let mut d = DaemonSpec::new(vec![export(s, a)?], local(s).scale);
    // The local cloud enforces EBS's modification rules (a cloud property, not
    // a daemon setting): the modify-volume runs and adaptive's drain-spec change;
    // and the instance's EBS limits, for every approach.
    d.modify_rules = Some(a.rule().flag());
    d.extra = vec!["--local-instance".into(), s.sc.instance.into()];
    Ok(d)
}

/// modify-volume: a user's script beside the daemon: it reads the export's I/O
/// counters from the control API each tick, and raises the volume to the peak
/// on a burst and lowers it when the rules allow (`surge set app/volume spec=`).
fn modify_controller(s: &Scaled, d: &Daemon, rule: Rule, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    let pol = policy(s);
    let shape = s.sc.backing.shape().expect("valid");
    let mut p = ModifyPolicy::new(ModifyConfig {
        window: pol.window,
        ut: pol.ut,
        inactivity_delay: pol.inactivity_delay,
        base_bw: shape.bps.unwrap_or(0) as f64 * s.rate,
        base_iops: shape.iops.map(|i| i as f64 * s.rate),
        rules: rule.rules().scaled(s.time),
    });
    let (base, peak, f) = (s.sc.backing.to_string(), s.sc.peak.to_string(), s.time);
    let control = d.control.clone();
    std::thread::spawn(move || {
        let mut log = Vec::new();
        let tick = pol.window / 10;
        let t0 = Instant::now();
        let mut next = t0;
        while !stop.load(Relaxed) {
            let io = crate::control::call(&control, &crate::control::Request::Status).ok().and_then(|r| r.targets?.into_iter().find(|t| t.name == "app").map(|t| t.status["io"].clone()));
            if let Some(io) = io {
                let n = |k: &str| io[k].as_u64().unwrap_or(0);
                if let Some(dec) = p.tick(t0.elapsed(), n("read_bytes") + n("write_bytes"), n("reads") + n("writes")) {
                    let to = if dec.action == ModifyAction::Raise { &peak } else { &base };
                    let req = crate::control::Request::Set { target: "app/volume".into(), key: "spec".into(), value: to.clone() };
                    let r = crate::control::call(&control, &req).map_err(|e| e.to_string()).and_then(|r| if r.ok { Ok(()) } else { Err(r.error.unwrap_or_default()) });
                    if r.is_err() {
                        // It did not happen (e.g. the cloud's clock ran a moment behind the
                        // policy's): the policy keeps the old spec and asks again next tick.
                        p.refused(t0.elapsed(), tick);
                    }
                    log.push(format!("{:.1} s: {:?} to {to}: {} ({})", dec.at.as_secs_f64() / f, dec.action, dec.reason, r.map_or_else(|e| format!("refused: {e}"), |_| "done".into())));
                }
            }
            next += tick;
            let now = Instant::now();
            std::thread::sleep(next.saturating_duration_since(now));
        }
        log
    })
}

/// The name of the volume that holds the application's data.
fn data_volume(a: Approach) -> &'static str {
    if a == Approach::Adaptive {
        "app-backing"
    } else {
        "app"
    }
}

/// Run approach `a` once in `dir` (removed afterwards).
pub fn run(s: &Scaled, a: Approach, rep: usize, dir: &Path) -> anyhow::Result<RunResult> {
    let _ = std::fs::remove_dir_all(dir);
    let d = Daemon::start(dir, &daemon_spec(s, a)?)?;
    let prov = daemon::cloud(dir, local(s).scale)?;
    let sys: Arc<dyn surge_block::Clock> = Arc::new(surge_block::SystemClock::new());
    // Compute: the instance the application runs on.
    let prices = PriceTable { time_scale: s.time, ..PriceTable::default() };
    let meter = Arc::new(CostMeter::new(prices, WallClock::anchored(sys)));
    let t0 = Instant::now();
    let t0_ns = crate::experiment::fairshare::client::monotonic_ns();
    meter.start_compute("app", s.sc.instance, s.sc.nodes)?;
    let stop = Arc::new(AtomicBool::new(false));
    let since = |t: Instant| (t - t0).as_secs_f64() / s.time;
    // Sampler: dollars over time, and adaptive's decisions (the status shows
    // the latest few; sampled often enough to see them all).
    let sampler = {
        let (stop, prov, meter, f) = (stop.clone(), prov.clone(), meter.clone(), s.time);
        let control = (a == Approach::Adaptive).then(|| d.control.clone());
        let period = Duration::from_secs_f64(s.secs(2.0));
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut log = ElasticLog::new("app/elastic");
            while !stop.load(Relaxed) {
                let storage = prov.cost().map(|r| r.storage_usd).unwrap_or(f64::NAN);
                out.push(Sample { t_s: t0.elapsed().as_secs_f64() / f, storage_usd: storage, compute_usd: meter.report().compute_usd });
                if let Some(c) = &control {
                    log.poll(c, f);
                }
                std::thread::sleep(period);
            }
            (out, log)
        })
    };
    let ctl_stop = Arc::new(AtomicBool::new(false));
    let controller = a.modifies().then(|| modify_controller(s, &d, a.rule(), ctl_stop.clone()));
    // The application.
    let application = Application::new(&d.uri("app"), s);
    let app = application.run();
    let done = Instant::now();
    let at_completion = prov.cost()?;
    let mut decisions = Vec::new();
    let mut plans = Vec::new();
    // adaptive: the cache lives on until drained and deleted; the instance
    // runs the daemon until then, and the user pays for both.
    if a == Approach::Adaptive {
        let deadline = Instant::now() + Duration::from_secs_f64(s.secs(1200.0));
        loop {
            let st = d.target("app/elastic")?;
            let released = st["cache_size"].as_u64() == Some(0) && st["cache_volume"].is_null();
            if released || Instant::now() > deadline {
                ensure!(released, "the cache was not released within 1,200 s (full scale) after the run: state {}", st["state"]);
                break;
            }
            std::thread::sleep(Duration::from_secs_f64(s.secs(0.5)).min(Duration::from_millis(50)));
        }
    }
    let could_stop = Instant::now();
    meter.stop_compute("app");
    ctl_stop.store(true, Relaxed);
    if let Some(h) = controller {
        decisions = h.join().unwrap_or_default();
    }
    stop.store(true, Relaxed);
    let (mut samples, mut log): (Vec<Sample>, ElasticLog) = sampler.join().unwrap_or_default();
    if a == Approach::Adaptive {
        log.poll(&d.control, s.time);
        decisions = log.lines();
        plans = log.sorted_plans();
    }
    let at_end = prov.cost()?;
    samples.push(Sample { t_s: since(Instant::now()), storage_usd: at_end.storage_usd, compute_usd: meter.report().compute_usd });
    let app = app.with_context(|| format!("{} run {rep}", a.name()))?;
    // The bursts as the application saw them, full-scale seconds from t0.
    let job = app.parsed.jobs.first().context("surge load reported no job")?;
    let off = (job.surge.started_monotonic_ns as f64 - t0_ns as f64) / 1e9;
    let bursts = job.surge.bursts.iter().map(|b| ((off + b.start_s) / s.time, (off + b.end_s) / s.time)).collect();
    // Bills: the data volume until the application completed (the user keeps
    // it, at whatever spec it had then); cache volumes until deleted.
    let data_id = prov.list()?.into_iter().find(|v| v.name.as_deref() == Some(data_volume(a))).map(|v| v.id).context("the data volume")?;
    let mut storage = 0.0;
    let mut bills = Vec::new();
    for (i, v) in at_end.volumes.iter().enumerate() {
        // Billing records only get appended: record i is the same in both.
        let v = match at_completion.volumes.get(i) {
            Some(c) if v.id == data_id => c,
            _ => v,
        };
        storage += v.usd;
        bills.push((v.spec.clone(), v.billed_seconds, v.usd));
    }
    let compute = meter.report().compute_usd;
    d.stop().with_context(|| format!("{} run {rep}: stopping the daemon", a.name()))?;
    // Read the data volume back, its model unthrottled.
    let verified = daemon::read_volume(&prov, data_volume(a), |dev| application.verify(&app, dev)).with_context(|| format!("{} run {rep}: data check", a.name()))?;
    drop(prov);
    let _ = std::fs::remove_dir_all(dir);
    Ok(RunResult {
        approach: a,
        rule: a.rule(),
        rep,
        completion_s: (done - t0).as_secs_f64() / s.time,
        instance_s: (could_stop - t0).as_secs_f64() / s.time,
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

    fn iops() -> Scaled {
        super::super::scenarios(&super::super::Plan { quick: true, time: 0.05, rate: 1.0 / 16.0, reps: 1, parallel: true }).remove(1)
    }

    #[test]
    fn the_policy_is_the_daemons_at_the_runs_scale() {
        let p = policy(&iops());
        let d = ElasticConfig::default();
        assert_eq!(p.window, d.window.mul_f64(0.05));
        assert_eq!(p.inactivity_delay, d.inactivity_delay.mul_f64(0.05));
        assert_eq!((p.ut, p.shrink, p.learn_period), (d.ut, d.shrink, d.learn_period));
        assert_eq!(p.backing_iops, Some(3_000.0 / 16.0), "gp3's 3,000 IOPS at rate 1/16");
    }

    #[test]
    fn exports_are_what_a_user_writes_with_only_the_scenarios_deviations() {
        let s = iops();
        assert_eq!(export(&s, Approach::Slow).unwrap(), "app=gp3:100GiB");
        assert_eq!(export(&s, Approach::Fast).unwrap(), "app=io2:100GiB,iops=32000");
        assert_eq!(export(&s, Approach::Adaptive).unwrap(), "app=elastic:backing=gp3:100GiB,cache=auto,value_per_hour=3.024,block=4KiB,max_iops=32000");
        let d = daemon_spec(&s, Approach::Adaptive).unwrap();
        assert_eq!(d.args()[2..], ["--local-scale", "time=0.05,rate=0.0625", "--local-modify-rules", "ebs-24h", "--local-instance", "r5.12xlarge"]);
        assert_eq!(daemon_spec(&s, Approach::ModifyClassic).unwrap().args()[5], "ebs-6h");
    }
}
