//! The modify-volume candidate on replay time: one gp3 volume raised in
//! place to a peak spec when a burst starts and lowered after it, as a
//! controller beside the daemon does it (`experiment/elastic_priced/rig.rs`:
//! it reads the export's completed I/O every window/10 and runs `surge set
//! NAME/volume spec=`).
//!
//! The same pieces as that run, on [`ReplayClock`]: the pure policy
//! (`surge_policy::modify::ModifyPolicy`, the elastic defaults' window, UT
//! and inactivity delay), the cloud's rule (`ModifyRules::ebs_rolling()`:
//! four modifications per rolling 24 h, each after the previous completed,
//! checked again when a modification is applied), the local cloud's
//! optimizing ramp (`surge_cloud::Optimizing`: new performance arrives
//! linearly over 5 minutes), the `ModelDev` behind the instance's EBS
//! limits, and the cost meter billing each spec for its own seconds.

use crate::candidates::Demand;
use crate::clock::ReplayClock;
use crate::replay::{replay_observed, NullDev, Observer, ReplayOptions, ReplayResult};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::{ModelDev, Scheduler, Shape, GIB, MIB};
use surge_block::{BlockError, Clock};
use surge_cloud::cost::{CostMeter, CostReport, WallClock};
use surge_cloud::{ModifyRules, Optimizing, PriceTable, VolumeSpec};
use surge_policy::modify::{ModifyAction, ModifyConfig, ModifyPolicy};
use surge_policy::ElasticConfig;
use surge_trace::{Op, Rec, Trace};

/// The two specs a modify-volume run moves between.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModifySpecs {
    pub base: VolumeSpec,
    pub peak: VolumeSpec,
}

/// Base: gp3 with its included 3,000 IOPS and 125 MiB/s at the capacity;
/// peak: gp3 provisioned for the peak second. Both at one size (a volume
/// only grows, and not while attached), large enough for the peak's IOPS
/// (500 per GiB). `None` when the base already serves the peak second (there
/// is nothing to raise) or the trace is untimed (no bursts to follow).
pub fn specs(d: &Demand) -> Option<ModifySpecs> {
    if d.untimed {
        return None;
    }
    let mibs = d.peak_bps.div_ceil(MIB).clamp(125, 1_000);
    let iops = d.peak_iops.clamp(3_000, 16_000).max(mibs * 4).min(16_000);
    if iops <= 3_000 && mibs <= 125 {
        return None;
    }
    let size = d.capacity.max(iops.div_ceil(500) * GIB);
    let throughput = (mibs > 125).then_some(mibs.min(iops / 4) * MIB);
    let gp3 = |iops: Option<u64>, throughput: Option<u64>| VolumeSpec { model: surge_block::model::VolumeModel::Gp3 { iops, throughput }, size, latency: Duration::ZERO };
    let s = ModifySpecs { base: gp3(None, None), peak: gp3((iops > 3_000).then_some(iops), throughput) };
    (s.peak.shape().is_ok() && s.base.shape().is_ok()).then_some(s)
}

/// One modification made during the replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Modification {
    pub at_s: f64,
    pub action: ModifyAction,
    pub to: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModifyRun {
    pub replay: ReplayResult,
    /// The cost meter at completion: storage per spec, and the instance.
    pub cost: CostReport,
    pub modifications: Vec<Modification>,
    /// Modifications the policy wanted that the rule refused when applied (0:
    /// the policy's own check agreed with the cloud's every time).
    pub refused: u64,
    pub rules: ModifyRules,
}

/// The controller beside the replay: ticks the policy every window/10 on
/// the I/O completed by then, and applies its decisions.
struct Controller<'a> {
    clock: &'a ReplayClock,
    model: &'a ModelDev,
    meter: &'a CostMeter,
    specs: &'a ModifySpecs,
    rules: ModifyRules,
    policy: ModifyPolicy,
    optimizing: Optimizing,
    tick: Duration,
    next: Duration,
    /// Completions not yet counted: (done ns, bytes, ops).
    pending: BinaryHeap<Reverse<(u64, u64, u64)>>,
    bytes: u64,
    ops: u64,
    modified: Vec<Duration>,
    log: Vec<Modification>,
    refused: u64,
}

impl Controller<'_> {
    /// Every tick up to `t_ns`, in order, each at its own time on the clock.
    fn run_until(&mut self, t_ns: u64) {
        while self.next.as_nanos() as u64 <= t_ns {
            let now = self.next;
            let now_ns = now.as_nanos() as u64;
            self.clock.submit_at(now_ns);
            while let Some(&Reverse((done, b, o))) = self.pending.peek() {
                if done > now_ns {
                    break;
                }
                self.pending.pop();
                self.bytes += b;
                self.ops += o;
            }
            if let Some(d) = self.policy.tick(now, self.bytes, self.ops) {
                // What the cloud says when the controller asks (its rule, not the policy's view of it).
                if self.rules.refuses(&self.modified, now).is_some() {
                    self.refused += 1;
                } else {
                    let to = if d.action == ModifyAction::Raise { &self.specs.peak } else { &self.specs.base };
                    let shape: Shape = to.shape().expect("checked in specs()");
                    self.optimizing.start(self.model, shape, now, self.rules.optimizing);
                    self.meter.modify("volume", to.clone());
                    self.modified.push(now);
                    self.log.push(Modification { at_s: now.as_secs_f64(), action: d.action, to: to.to_string(), reason: d.reason });
                }
            }
            self.next += self.tick;
        }
    }
}

impl Observer for Controller<'_> {
    fn before(&mut self, issue_ns: u64) {
        self.run_until(issue_ns);
        // The ramp's steps due by now, as the local cloud applies them before each request.
        self.clock.submit_at(issue_ns);
        self.optimizing.advance(self.model, self.clock.now());
    }
    fn completed(&mut self, r: &Rec, _issue_ns: u64, done_ns: u64) {
        // What the export's counters show: reads and writes, their bytes.
        if matches!(r.op, Op::Read | Op::Write) {
            self.pending.push(Reverse((done_ns, r.len, 1)));
        }
    }
}

/// Replay `t` on a volume at `specs.base` that the policy modifies under
/// `rules`, behind the instance's EBS limits `link_shape`; billed by the
/// cost meter (the volume and one `instance`) until the last completion.
pub fn run(t: &Trace, specs: &ModifySpecs, rules: ModifyRules, link_shape: Shape, instance: &str, prices: &PriceTable, qd: usize) -> Result<ModifyRun, String> {
    let clock = Arc::new(ReplayClock::new());
    let base_shape = specs.base.shape().map_err(|e| e.to_string())?;
    let link = Arc::new(parking_lot::Mutex::new(Scheduler::new(link_shape, Duration::ZERO)));
    let model = ModelDev::new(Arc::new(NullDev(specs.base.size)), clock.clone(), base_shape.clone()).with_link(Some(link));
    let meter = CostMeter::new(prices.clone(), WallClock { clock: clock.clone(), epoch_unix_ns: 0 });
    meter.start("volume", Some("app".into()), specs.base.clone());
    meter.start_compute("app", instance, 1).map_err(|e| e.to_string())?;
    let pol = ElasticConfig::default();
    let policy = ModifyPolicy::new(ModifyConfig {
        window: pol.window,
        ut: pol.ut,
        inactivity_delay: pol.inactivity_delay,
        base_bw: base_shape.bps.unwrap_or(0) as f64,
        base_iops: base_shape.iops.map(|i| i as f64),
        rules,
    });
    let mut c = Controller {
        clock: &clock,
        model: &model,
        meter: &meter,
        specs,
        rules,
        policy,
        optimizing: Optimizing::default(),
        tick: pol.window / 10,
        next: pol.window / 10,
        pending: BinaryHeap::new(),
        bytes: 0,
        ops: 0,
        modified: Vec::new(),
        log: Vec::new(),
        refused: 0,
    };
    let r = replay_observed(t, &model, &clock, &ReplayOptions { qd }, &mut c).map_err(|e: BlockError| format!("replay: {e}"))?;
    let (log, refused) = (std::mem::take(&mut c.log), c.refused);
    drop(c);
    // Billed until the last completion, at whatever spec it had then.
    clock.submit_at(r.completion_ns.max(1));
    meter.stop_compute("app");
    meter.stop("volume");
    Ok(ModifyRun { replay: r, cost: meter.report(), modifications: log, refused, rules })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use surge_block::model::VolumeModel;
    use surge_trace::{Header, Source};

    #[test]
    fn specs_raise_only_what_the_peak_needs() {
        let d = Demand { capacity: 100 * GIB, peak_iops: 10_000, peak_bps: 40 * MIB, untimed: false };
        let s = specs(&d).unwrap();
        assert_eq!(s.base.model, VolumeModel::Gp3 { iops: None, throughput: None });
        assert_eq!(s.peak.model, VolumeModel::Gp3 { iops: Some(10_000), throughput: None });
        assert_eq!((s.base.size, s.peak.size), (100 * GIB, 100 * GIB));
        // 16,000 IOPS need 32 GiB: both specs at that size.
        let s = specs(&Demand { capacity: 10 * GIB, peak_iops: 50_000, peak_bps: 600 * MIB, untimed: false }).unwrap();
        assert_eq!(s.peak.model, VolumeModel::Gp3 { iops: Some(16_000), throughput: Some(600 * MIB) });
        assert_eq!(s.base.size, 32 * GIB);
        assert!(specs(&Demand { capacity: GIB, peak_iops: 2_000, peak_bps: 100 * MIB, untimed: false }).is_none(), "the base keeps up");
        assert!(specs(&Demand { capacity: GIB, peak_iops: u64::MAX, peak_bps: u64::MAX, untimed: true }).is_none());
    }

    /// 1 MiB sequential reads: `mibs` a second for `secs` seconds from `from_s`.
    pub(crate) fn burst(from_s: u64, secs: u64, mibs: u64) -> impl Iterator<Item = Rec> {
        let gap = 1_000_000_000 / mibs;
        (0..secs * mibs).map(move |i| Rec { t_ns: from_s * 1_000_000_000 + i * gap, op: Op::Read, offset: ((from_s * 1_000 + i) % 50_000) << 20, len: MIB, fua: false, dur_ns: 0 })
    }

    /// `quiet` MiB/s for 60 s, a burst at 400 MiB/s for `burst_s`, then `quiet` MiB/s for `after_s`.
    pub(crate) fn bursty_with(quiet: u64, burst_s: u64, after_s: u64) -> Trace {
        let recs: Vec<Rec> = burst(0, 60, quiet).chain(burst(60, burst_s, 400)).chain(burst(60 + burst_s, after_s, quiet)).collect();
        Trace::from_records(Header::new(Source::SurgeRecord, "bursty"), recs)
    }

    /// 20 MiB/s for 60 s, a 10-minute burst at 400 MiB/s, then 20 MiB/s for 20 minutes.
    pub(crate) fn bursty() -> Trace {
        let recs: Vec<Rec> = burst(0, 60, 20).chain(burst(60, 600, 400)).chain(burst(660, 1_200, 20)).collect();
        Trace::from_records(Header::new(Source::SurgeRecord, "bursty"), recs)
    }

    #[test]
    fn a_burst_is_followed_by_a_raise_then_a_lower_and_billed_per_spec() {
        let t = bursty();
        let s = ModifySpecs { base: "gp3:100GiB".parse().unwrap(), peak: "gp3:100GiB,iops=3000,throughput=400MiB/s".parse().unwrap() };
        let prices = PriceTable::default();
        let link = prices.instance_ebs("m5.4xlarge").unwrap().shape();
        let r = run(&t, &s, ModifyRules::ebs_rolling(), link, "m5.4xlarge", &prices, 32).unwrap();
        let acts: Vec<ModifyAction> = r.modifications.iter().map(|m| m.action).collect();
        assert_eq!(acts, vec![ModifyAction::Raise, ModifyAction::Lower], "{:?}", r.modifications);
        assert_eq!(r.refused, 0);
        // Raised within seconds of the burst; lowered at least the 5 minutes of optimizing later.
        assert!(r.modifications[0].at_s > 60.0 && r.modifications[0].at_s < 64.0, "{:?}", r.modifications);
        assert!(r.modifications[1].at_s - r.modifications[0].at_s >= 300.0);
        // Three bills: base, peak, base, covering the run.
        let specs: Vec<&str> = r.cost.volumes.iter().map(|v| v.spec.as_str()).collect();
        assert_eq!(specs, [s.base.to_string(), s.peak.to_string(), s.base.to_string()]);
        let secs: u64 = r.cost.volumes.iter().map(|v| v.billed_seconds).sum();
        assert!((secs as f64 - r.replay.completion_ns as f64 / 1e9).abs() <= 3.0, "billed {secs} s for {} ns", r.replay.completion_ns);
        // 400 MiB/s on a volume that ramps from 125 MiB/s over 5 minutes: the burst runs late.
        assert!(r.replay.completion_ns as f64 / 1e9 > 1_860.0 + 10.0, "{}", r.replay.completion_ns);
        assert_eq!(r.cost.compute.len(), 1);
    }
}
