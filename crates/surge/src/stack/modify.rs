//! `NAME=modify:base=TYPE:SIZE[,..],peak=TYPE:SIZE[,..][,ut=0.3,window=5s,id=30s,rules=ebs-24h,retry=10m,poll=5s]`:
//! the in-place modification approach (EBS's elastic volumes) as a user can
//! pick it. One volume on the daemon's cloud (`--provider aws`: EBS, at full
//! scale; else the local cloud of the data directory) is served as the export;
//! a controller raises it to `peak` when a burst starts and lowers it back to
//! `base` after the inactivity delay, with [`ModifyPolicy`] on the daemon's
//! clock, as the modification rule allows.
//!
//! - Demand: cumulative bytes and operations through a [`Counted`] layer, as
//!   utilization of the base spec (the elastic policy's window, UT and ID).
//! - The rule (`rules=`, default `ebs-24h`: four per rolling 24 hours, each
//!   once the previous completed, the more generous of EBS's two documented
//!   rules): the controller polls the provider's modification state while a
//!   modification is on its way, and under `ebs-24h` that state, not a guessed
//!   duration, says when it completed.
//! - A modification the cloud refuses did not happen: logged once, and not
//!   tried again for `retry` (full-scale).
//! - `surge status` (`NAME/modify`): spec, the modification in flight with its
//!   state and progress, the next allowed modification and why, the rule, and
//!   dollars so far.

use crate::control::Controllable;
use crate::stack::{BuildContext, Built, SpecError};
use parking_lot::Mutex;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, Clock, Counted};
use surge_cloud::{CreateRequest, Modification, ModifyRules, Provider, VolumeSpec};
use surge_policy::modify::{ModifyAction, ModifyConfig, ModifyPolicy};

/// What a `modify:` export runs with (durations on the provider's clock).
#[derive(Debug, Clone)]
pub struct ModifyParams {
    pub name: String,
    pub base: VolumeSpec,
    pub peak: VolumeSpec,
    pub policy: ModifyConfig,
    pub tick: Duration,
    /// Least time between two modification-state polls.
    pub poll: Duration,
    /// After a refusal, nothing is tried again for this long.
    pub retry: Duration,
}

const LOG: usize = 16;

struct State {
    policy: ModifyPolicy,
    spec: String,
    modification: Option<Modification>,
    /// Poll the state at the next tick past this.
    poll_at: Option<Duration>,
    last_error: Option<String>,
    log: VecDeque<String>,
    modifications: u64,
    refusals: u64,
}

/// The served volume and its controller.
pub struct ModifyVolume {
    p: ModifyParams,
    id: String,
    provider: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    io: Arc<Counted>,
    st: Mutex<State>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl ModifyVolume {
    /// Find the volume named `p.name` (else create it at `base`), attach it,
    /// and learn whether it is raised and a modification is on its way.
    pub fn open(p: ModifyParams, provider: Arc<dyn Provider>, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<Self>> {
        if p.base.size != p.peak.size {
            anyhow::bail!("base and peak must have the same size (an attached volume keeps its size): {} vs {}", p.base, p.peak);
        }
        if p.base == p.peak {
            anyhow::bail!("base and peak are the same spec {}: nothing to modify", p.base);
        }
        let existing = provider.list()?.into_iter().find(|v| v.name.as_deref() == Some(p.name.as_str()));
        let (id, created, spec) = match existing {
            Some(v) => (v.id, false, v.spec),
            None => {
                let v = provider.create(CreateRequest { spec: p.base.clone(), name: Some(p.name.clone()) })?;
                (v.id, true, v.spec)
            }
        };
        let dev = match provider.attach(&id) {
            Ok(d) => d,
            Err(e) => {
                if created {
                    if let Err(d) = provider.delete(&id) {
                        tracing::error!(volume = %id, "deleting the volume made for {}: {d}", p.name);
                    }
                }
                return Err(anyhow::anyhow!("attaching volume {id} for export {}: {e}", p.name));
            }
        };
        let mut policy = ModifyPolicy::new(p.policy.clone());
        let raised = spec == p.peak.to_string();
        if !raised && spec != p.base.to_string() {
            tracing::warn!(volume = %id, export = %p.name, "volume is {spec}, neither base {} nor peak {}; treated as base", p.base, p.peak);
        }
        policy.set_raised(raised);
        let now = clock.now();
        let st = State { policy, spec, modification: None, poll_at: Some(now), last_error: None, log: VecDeque::new(), modifications: 0, refusals: 0 };
        let me = Arc::new(ModifyVolume { io: Arc::new(Counted::new(dev)), p, id, provider, clock, st: Mutex::new(st), stop: AtomicBool::new(false), thread: Mutex::new(None) });
        me.poll_state(now);
        Ok(me)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn device(&self) -> Arc<Counted> {
        self.io.clone()
    }

    /// Ask the provider where the latest modification is (at most every `poll`).
    fn poll_state(&self, now: Duration) {
        let due = self.st.lock().poll_at.is_some_and(|t| now >= t);
        if !due {
            return;
        }
        let r = self.provider.modification(&self.id);
        let mut st = self.st.lock();
        match r {
            Ok(m) => {
                let in_flight = m.as_ref().is_some_and(|m| m.state.in_flight());
                st.policy.observe_state(Some(in_flight));
                st.poll_at = in_flight.then_some(now + self.p.poll);
                st.modification = m;
            }
            Err(e) => {
                // The rule's expected duration stands in for the state.
                st.policy.observe_state(None);
                st.poll_at = Some(now + self.p.poll);
                let msg = format!("reading the modification state: {e}");
                if st.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(export = %self.p.name, volume = %self.id, "{msg}");
                    st.last_error = Some(msg);
                }
            }
        }
    }

    /// One controller step at the clock's now.
    pub fn step(&self) {
        let now = self.clock.now();
        self.poll_state(now);
        let s = self.io.stats();
        let decision = self.st.lock().policy.tick(now, s.read_bytes + s.write_bytes, s.reads + s.writes);
        let Some(d) = decision else { return };
        let to = if d.action == ModifyAction::Raise { &self.p.peak } else { &self.p.base };
        let r = self.provider.modify(&self.id, to.clone());
        let mut st = self.st.lock();
        let entry = match r {
            Ok(v) => {
                st.spec = v.spec;
                st.modifications += 1;
                st.last_error = None;
                st.poll_at = Some(now);
                format!("{:.1} s: {:?} to {to}: {}", now.as_secs_f64(), d.action, d.reason)
            }
            Err(e) => {
                st.policy.refused(now, self.p.retry);
                st.refusals += 1;
                st.poll_at = Some(now);
                let msg = e.to_string();
                if st.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(export = %self.p.name, volume = %self.id, "modification to {to} refused; retrying in {:?}: {msg}", self.p.retry);
                    st.last_error = Some(msg.clone());
                }
                format!("{:.1} s: {:?} to {to} refused: {msg}", now.as_secs_f64(), d.action)
            }
        };
        if entry.contains(" refused: ") {
            tracing::debug!("{entry}");
        } else {
            tracing::info!(export = %self.p.name, "{entry}");
        }
        st.log.push_back(entry);
        if st.log.len() > LOG {
            st.log.pop_front();
        }
    }

    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("modify-{}", self.p.name))
            .spawn(move || {
                let mut next = me.clock.now();
                while !me.stop.load(Relaxed) {
                    me.step();
                    next += me.p.tick;
                    let now = me.clock.now();
                    if next < now {
                        next = now;
                    }
                    me.clock.sleep_until(next);
                }
            })
            .expect("spawn modify controller");
        *self.thread.lock() = Some(t);
    }

    /// Stop the controller (the volume stays as it is).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// At daemon exit: stop, flush and detach (not delete: a restart finds it by name).
    pub fn shutdown(&self) {
        self.stop();
        let _ = self.io.flush();
        if let Err(e) = self.provider.detach(&self.id) {
            tracing::error!(volume = %self.id, export = %self.p.name, "detaching at exit: {e}");
        }
    }

    #[cfg(test)]
    pub fn decisions(&self) -> Vec<String> {
        self.st.lock().log.iter().cloned().collect()
    }
}

/// `surge status` of a `modify:` export (target `NAME/modify`).
pub struct ModifyControl(pub Arc<ModifyVolume>);

impl Controllable for ModifyControl {
    fn name(&self) -> String {
        format!("{}/modify", self.0.p.name)
    }
    fn kind(&self) -> String {
        "modify".into()
    }
    fn status(&self) -> serde_json::Value {
        let v = &self.0;
        let now = v.clock.now();
        let usd = v.provider.cost().ok().map(|r| r.volumes.iter().filter(|c| c.id == v.id).map(|c| c.usd).sum::<f64>());
        let st = v.st.lock();
        let rules = &st.policy.config().rules;
        let next = st.policy.next_allowed();
        json!({
            "volume": v.id,
            "spec": st.spec,
            "base": v.p.base.to_string(),
            "peak": v.p.peak.to_string(),
            "raised": st.policy.raised(),
            "rule": rules.name(),
            "modification": st.modification,
            "wanted": st.policy.wanted(),
            "next_allowed_in_s": next.map(|t| t.saturating_sub(now).as_secs_f64()),
            "waiting_because": st.policy.refusal(now),
            "modifications": st.modifications,
            "refusals": st.refusals,
            "last_error": st.last_error,
            "usd_so_far": usd,
            "decisions": st.log.iter().rev().take(8).collect::<Vec<_>>(),
        })
    }
}

/// `modify:base=TYPE:SIZE[,iops=..,throughput=..],peak=TYPE:SIZE[,..][,ut=F,window=D,id=D,rules=ebs-24h|ebs-6h|none,retry=D,poll=D]`.
/// Keys that describe a volume (`iops`, `throughput`, `bw`, `lat`) belong to
/// the `base=` or `peak=` before them. Durations are full-scale (a local cloud
/// at reduced scale runs them x its time scale).
pub fn build_modify(name: &str, args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    use surge_cloud::spec::parse_duration;
    let err = |msg: String| SpecError::Args { kind: "modify".into(), msg };
    let (mut base, mut peak) = (None::<String>, None::<String>);
    let mut last: Option<&str> = None;
    let defaults = surge_policy::ElasticConfig::default();
    let (mut window, mut ut, mut id) = (defaults.window, defaults.ut, defaults.inactivity_delay);
    let mut rules = ModifyRules::ebs_rolling();
    let (mut retry, mut poll) = (Duration::from_secs(600), Duration::from_secs(5));
    for item in args.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| err(format!("{item:?} is not key=value")))?;
        let dur = || parse_duration(v).map_err(|e| err(format!("{k}={v}: {e}")));
        match k {
            "base" => (base, last) = (Some(v.to_string()), Some("base")),
            "peak" => (peak, last) = (Some(v.to_string()), Some("peak")),
            "iops" | "throughput" | "tp" | "bw" | "lat" => match last {
                Some("base") => base.as_mut().expect("set").push_str(&format!(",{k}={v}")),
                Some(_) => peak.as_mut().expect("set").push_str(&format!(",{k}={v}")),
                None => return Err(err(format!("{k}= must follow base= or peak="))),
            },
            "ut" => ut = v.parse::<f64>().ok().filter(|u| *u > 0.0 && *u <= 1.0).ok_or_else(|| err(format!("ut={v}: expected a fraction like 0.3")))?,
            "window" => window = dur()?,
            "id" => id = dur()?,
            "rules" => rules = ModifyRules::parse(v).map_err(err)?,
            "retry" => retry = dur()?,
            "poll" => poll = dur()?,
            _ => return Err(err(format!("unknown option {k:?} (allowed: base, peak, iops, throughput, bw, lat, ut, window, id, rules, retry, poll)"))),
        }
        if !matches!(k, "base" | "peak" | "iops" | "throughput" | "tp" | "bw" | "lat") {
            last = None;
        }
    }
    let spec = |s: Option<String>, what: &str| -> Result<VolumeSpec, SpecError> {
        s.ok_or_else(|| err(format!("{what}=TYPE:SIZE is required")))?.parse().map_err(|e| err(format!("{what}: {e}")))
    };
    let (base, peak) = (spec(base, "base")?, spec(peak, "peak")?);
    let shape = base.shape().map_err(|e| err(format!("base: {e}")))?;
    peak.shape().map_err(|e| err(format!("peak: {e}")))?;
    let bw = shape.bps.ok_or_else(|| err("the base volume needs a throughput limit to measure utilization".into()))? as f64;
    let (provider, local): (Arc<dyn Provider>, _) = match &ctx.cloud {
        Some(c) => (c.clone(), crate::stack::volume::LocalCloud::default()),
        None => {
            let cfg = ctx.local.config(&ctx.data_dir, surge_cloud::Delays::none());
            (Arc::new(surge_cloud::LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?), ctx.local)
        }
    };
    let (t, rate) = (local.scale.time, local.scale.rate);
    let policy = ModifyConfig {
        window: local.duration(window),
        ut,
        inactivity_delay: local.duration(id),
        base_bw: bw * rate,
        base_iops: shape.iops.map(|i| i as f64 * rate),
        rules: rules.scaled(t),
    };
    let tick = policy.window / 10;
    let p = ModifyParams { name: name.to_string(), base: base.clone(), peak: peak.clone(), policy, tick, poll: local.duration(poll), retry: local.duration(retry) };
    let v = ModifyVolume::open(p, provider, ctx.clock.clone()).map_err(|e| err(format!("{e:#}")))?;
    v.start();
    let detail = json!({ "volume": v.id(), "base": base.to_string(), "peak": peak.to_string(), "rule": rules.name() });
    let dev: Arc<dyn BlockDev> = Arc::new(crate::stack::AtExit::new(v.device(), {
        let v = v.clone();
        move |_: &Counted| v.shutdown()
    }));
    Ok(Built {
        dev,
        description: format!("{base} modified in place to {peak} on bursts (rule {}; volume {})", rules.name(), v.id()),
        detail,
        controls: vec![Arc::new(ModifyControl(v))],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::{Delays, LocalConfig, LocalProvider, ModificationState};

    fn cloud(dir: &std::path::Path, clock: &Arc<VirtualClock>, rules: ModifyRules) -> Arc<LocalProvider> {
        let mut cfg = LocalConfig::new(dir);
        cfg.epoch_unix_ns = Some(0);
        cfg.delays = Delays::none();
        cfg.modify_rules = rules;
        Arc::new(LocalProvider::open(cfg, clock.clone()).unwrap())
    }

    fn params(rules: ModifyRules) -> ModifyParams {
        let base: VolumeSpec = "gp3:8GiB".parse().unwrap();
        ModifyParams {
            name: "m".into(),
            peak: "gp3:8GiB,iops=16000,throughput=1000MiB/s".parse().unwrap(),
            policy: ModifyConfig { window: Duration::from_secs(5), ut: 0.3, inactivity_delay: Duration::from_secs(30), base_bw: 125.0 * 1_048_576.0, base_iops: Some(3_000.0), rules },
            base,
            tick: Duration::from_millis(500),
            poll: Duration::from_secs(5),
            retry: Duration::from_secs(600),
        }
    }

    /// `secs` seconds of steps, writing `mib_per_s` MiB each second (in 1 MiB requests).
    fn drive(v: &ModifyVolume, clock: &VirtualClock, secs: u64, mib_per_s: u64) {
        let buf = vec![7u8; 1 << 20];
        for _ in 0..secs * 2 {
            for i in 0..mib_per_s / 2 {
                v.device().write_at(&buf, (i % 64) << 20, false).unwrap();
            }
            clock.advance(Duration::from_millis(500));
            v.step();
        }
    }

    fn spec(p: &LocalProvider, v: &ModifyVolume) -> String {
        p.describe(v.id()).unwrap().spec
    }

    #[test]
    fn a_burst_raises_the_volume_and_it_is_lowered_after_id_once_completed() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let p = cloud(d.path(), &clock, ModifyRules::ebs_rolling());
        let v = ModifyVolume::open(params(ModifyRules::ebs_rolling()), p.clone(), clock.clone()).unwrap();
        drive(&v, &clock, 10, 0);
        assert_eq!(spec(&p, &v), "gp3:8GiB");
        // 100 MiB/s of 125: above UT 30 %. The model serves it in virtual time.
        drive(&v, &clock, 10, 100);
        assert_eq!(spec(&p, &v), "gp3:8GiB,iops=16000,throughput=1000MiB/s", "{:?}", v.decisions());
        let st = ModifyControl(v.clone()).status();
        assert_eq!(st["raised"], true);
        assert_eq!(st["modification"]["state"], "optimizing", "{st}");
        assert_eq!(st["rule"], "ebs-24h");
        assert!(st["usd_so_far"].as_f64().unwrap() > 0.0);
        // Quiet for ID (30 s), but the raise optimizes for 5 min: lowered only once it completed.
        drive(&v, &clock, 60, 0);
        assert_eq!(spec(&p, &v), "gp3:8GiB,iops=16000,throughput=1000MiB/s");
        let st = ModifyControl(v.clone()).status();
        assert_eq!(st["wanted"], "lower");
        assert!(st["waiting_because"].as_str().unwrap().contains("not completed"), "{st}");
        drive(&v, &clock, 300, 0);
        assert_eq!(spec(&p, &v), "gp3:8GiB", "{:?}", v.decisions());
        let m = p.modification(v.id()).unwrap().unwrap();
        assert_eq!(m.state, ModificationState::Optimizing);
        assert_eq!(v.decisions().len(), 2, "{:?}", v.decisions());
        assert_eq!(ModifyControl(v.clone()).status()["refusals"], 0);
    }

    #[test]
    fn a_modification_the_cloud_refuses_waits_for_the_retry_time() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        // The cloud keeps to the classic 6 h; the controller plans with the rolling rule.
        let p = cloud(d.path(), &clock, ModifyRules::ebs());
        let mut pa = params(ModifyRules::ebs_rolling());
        pa.retry = Duration::from_secs(600);
        let v = ModifyVolume::open(pa, p.clone(), clock.clone()).unwrap();
        drive(&v, &clock, 10, 100);
        assert_eq!(spec(&p, &v), "gp3:8GiB,iops=16000,throughput=1000MiB/s");
        // Lowering once the raise completed (rolling: allowed) is refused by the cloud (6 h).
        let refusals = |v: &Arc<ModifyVolume>| ModifyControl(v.clone()).status()["refusals"].as_u64().unwrap();
        let mut waited = 0;
        while refusals(&v) == 0 {
            drive(&v, &clock, 1, 0);
            waited += 1;
            assert!(waited < 1_000, "never tried to lower: {:?}", v.decisions());
        }
        let st = ModifyControl(v.clone()).status();
        assert_eq!(st["raised"], true, "{st}");
        assert!(st["last_error"].as_str().unwrap().contains("once per"), "{st}");
        assert!(st["waiting_because"].as_str().unwrap().contains("refused"), "{st}");
        // Not retried in a loop: the next attempt 10 min after the refusal.
        drive(&v, &clock, 598, 0);
        assert_eq!(refusals(&v), 1);
        drive(&v, &clock, 3, 0);
        assert_eq!(refusals(&v), 2);
        // After 6 h the cloud takes it; about one attempt per 10 min until then.
        drive(&v, &clock, 6 * 3_600, 0);
        assert_eq!(spec(&p, &v), "gp3:8GiB");
        assert!((30..=40).contains(&refusals(&v)), "{}", refusals(&v));
    }

    #[test]
    fn the_classic_rule_holds_the_lowering_six_hours() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let p = cloud(d.path(), &clock, ModifyRules::ebs());
        let v = ModifyVolume::open(params(ModifyRules::ebs()), p.clone(), clock.clone()).unwrap();
        drive(&v, &clock, 10, 100);
        drive(&v, &clock, 3_600, 0);
        let st = ModifyControl(v.clone()).status();
        assert_eq!((st["raised"].as_bool(), st["refusals"].as_u64(), st["rule"].as_str()), (Some(true), Some(0), Some("ebs-6h")), "{st}");
        let next = st["next_allowed_in_s"].as_f64().unwrap();
        assert!(next > 4.9 * 3_600.0 && next <= 5.0 * 3_600.0 + 1.0, "{st}");
        drive(&v, &clock, 5 * 3_600, 0);
        assert_eq!(spec(&p, &v), "gp3:8GiB");
    }

    #[test]
    fn the_spec_parses_and_a_restart_finds_the_raised_volume() {
        let d = tempfile::tempdir().unwrap();
        let ctx = BuildContext::new(d.path().to_path_buf(), Arc::new(VirtualClock::new()));
        let b = build_modify("m", "base=gp3:8GiB,peak=gp3:8GiB,iops=16000,throughput=1000MiB/s,ut=0.5,id=1m,rules=ebs-6h", &ctx).unwrap();
        assert_eq!(b.dev.size(), 8 << 30);
        assert_eq!(b.controls[0].name(), "m/modify");
        let st = b.controls[0].status();
        assert_eq!((st["peak"].as_str(), st["rule"].as_str()), (Some("gp3:8GiB,iops=16000,throughput=1000MiB/s"), Some("ebs-6h")), "{st}");
        drop(b);
        for (bad, why) in [
            ("peak=gp3:8GiB,iops=6000", "base=TYPE:SIZE is required"),
            ("base=gp3:8GiB,peak=gp3:9GiB", "same size"),
            ("base=gp3:8GiB,peak=gp3:8GiB", "nothing to modify"),
            ("iops=5,base=gp3:8GiB", "must follow"),
            ("base=gp3:8GiB,peak=gp3:8GiB,iops=6000,rules=weekly", "ebs-24h"),
            ("base=gp3:8GiB,peak=gp3:8GiB,iops=6000,speed=1", "unknown option"),
        ] {
            let e = build_modify("x", bad, &ctx).err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // A volume left at its peak (a daemon stopped mid-burst) is known raised.
        let clock = Arc::new(VirtualClock::new());
        let p = cloud(&crate::stack::volume::cloud_dir(d.path()), &clock, ModifyRules::default());
        let id = p.list().unwrap()[0].id.clone();
        p.modify(&id, "gp3:8GiB,iops=16000,throughput=1000MiB/s".parse().unwrap()).unwrap();
        let mut pa = params(ModifyRules::ebs_rolling());
        pa.name = "m".into();
        let v = ModifyVolume::open(pa, p.clone(), clock.clone()).unwrap();
        assert_eq!(ModifyControl(v.clone()).status()["raised"], true);
    }
}
