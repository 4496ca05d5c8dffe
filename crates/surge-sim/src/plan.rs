//! `surge plan workload`: every candidate replayed and priced, one recommended.
//!
//! Per candidate: the replay's completion time (the run on that volume
//! behind the instance's EBS limits), storage dollars (the volume's list
//! price for the run, billed per second with the 60 s minimum, as the cost
//! meter bills), compute dollars (the instance for the run, same billing),
//! and with `--value-per-hour` what the run's time is worth to the user. The
//! recommendation is the cheapest total among the candidates that meet the
//! deadline (relative: a multiple of the fastest candidate's time; or
//! absolute).

use crate::candidates::{self, Demand, NotSimulated};
use crate::clock::ReplayClock;
use crate::replay::{replay, NullDev, ReplayOptions, ReplayResult};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::{ModelDev, Scheduler};
use surge_cloud::PriceTable;
use surge_trace::Trace;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Price(#[from] surge_cloud::cost::PriceError),
    #[error("candidate {name}: {why}")]
    Candidate { name: String, why: String },
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Deadline {
    /// At most this multiple of the fastest candidate's completion time.
    Relative(f64),
    Absolute(#[serde(with = "secs")] Duration),
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl std::str::FromStr for Deadline {
    type Err = String;
    /// `1.05x` (relative) or a duration (`90s`, `2h`).
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(x) = s.strip_suffix('x') {
            let f: f64 = x.parse().map_err(|_| format!("deadline {s:?}: expected e.g. 1.05x or 90s"))?;
            if !(f.is_finite() && f >= 1.0) {
                return Err(format!("deadline {s:?}: a multiple of the fastest time must be at least 1x"));
            }
            return Ok(Deadline::Relative(f));
        }
        surge_block::units::parse_duration(s).map(Deadline::Absolute).map_err(|e| format!("deadline {s:?}: {e} (or a multiple such as 1.05x)"))
    }
}

#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub instance: String,
    pub deadline: Option<Deadline>,
    /// What an hour of the run's time is worth (added to its cost).
    pub value_per_hour: Option<f64>,
    /// Requests in flight at most (default: the most the recording saw, at least 32).
    pub qd: Option<usize>,
    /// Capacity the volume needs at least (default: the trace's footprint).
    pub capacity: u64,
    /// The export name in the spec printed for the recommendation.
    pub export: String,
    /// Also run the candidates of the threaded harness (the elastic cache):
    /// the daemon's threads on a `SimClock`, real I/O on tmpfs, slower than
    /// the event replay (bounded by [`THREADED_MAX_BYTES`]).
    pub threaded: bool,
}

/// Most bytes a trace may move for the threaded candidates to be run (their
/// layers do the I/O, on tmpfs files); larger traces list them as not run.
pub const THREADED_MAX_BYTES: u64 = 8 << 30;

#[derive(Debug, Clone, Serialize)]
pub enum Objective {
    Cheapest,
    Deadline(Deadline),
    ValuePerHour(f64),
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    /// The volume spec (`surge serve --export NAME=SPEC`).
    pub spec: Option<String>,
    pub sized: String,
    pub simulated: bool,
    /// Which engine ran it: `event replay` (`ReplayClock`, one thread) or
    /// `threaded` (every thread of the layers on a `SimClock`); both on virtual time.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub engine: &'static str,
    pub completion_s: Option<f64>,
    pub storage_usd: Option<f64>,
    pub compute_usd: Option<f64>,
    /// `--value-per-hour` x the run's hours.
    pub time_value_usd: Option<f64>,
    pub total_usd: Option<f64>,
    pub meets_deadline: Option<bool>,
    pub why_lost: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayResult>,
    /// modify-volume: the spec it is raised to (`spec` is the base) and
    /// what the policy did when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_spec: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modifications: Option<Vec<crate::modify::Modification>>,
    /// What runs it in the daemon: `surge serve --export NAME=EXPORT`
    /// (modify-volume: a `modify:` export between its base and peak, whose
    /// controller makes the modifications the plan simulated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<String>,
    /// The volumes it attaches (modify-volume: its base).
    #[serde(skip)]
    pub volumes: Vec<surge_cloud::VolumeSpec>,
    /// Volumes with credits (gp2, st1, sc1; a stripe's emptiest member): the
    /// balance at the run's end, in percent of a fresh volume's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits_end_pct: Option<f64>,
    /// The elastic cache: its drain, cache volumes and the controller's decisions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elastic: Option<crate::elastic::ElasticRun>,
    /// The burstable stripe on the threaded harness: its swaps, members and the controller's decisions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripe: Option<crate::burstable::StripeSwapRun>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadPlan {
    /// Every figure is from a replay on virtual time, not a run on a cloud.
    pub figures: &'static str,
    pub trace: String,
    pub aggregate: bool,
    pub note: String,
    pub requests: u64,
    pub trace_duration_s: f64,
    pub demand: Demand,
    pub qd: usize,
    pub instance: String,
    pub instance_usd_hour: f64,
    pub objective: Objective,
    pub deadline_s: Option<f64>,
    pub rows: Vec<Row>,
    pub recommended: Option<usize>,
    /// `surge serve` flags that would run the recommendation.
    pub serve_args: Option<String>,
    pub prices: String,
}

/// The modify-volume candidate's name in the table.
pub const MODIFY: &str = "modify-volume";

/// The burstable stripe candidate's name in the table.
pub const STRIPE: &str = "burstable stripe";

/// Requests in flight at most, unless the recording saw more or `--qd` says.
pub const DEFAULT_QD: usize = 32;

/// The queue depth a replay of `t` uses unless told: what the recording saw
/// in flight is a lower bound (a fast device finishes a request before the
/// next arrives), so at least [`DEFAULT_QD`]. `surge trace replay` uses it too.
pub fn default_qd(t: &Trace) -> usize {
    (surge_trace::summary::summarize(t).max_in_flight as usize).max(DEFAULT_QD)
}

/// `t` replayed on one volume `spec` behind the instance's link, and the
/// volume's credit balance at the end (percent; volumes with credits only).
pub(crate) fn replay_spec(t: &Trace, name: &str, spec: &surge_cloud::VolumeSpec, link_shape: surge_block::model::Shape, qd: usize) -> Result<(ReplayResult, Option<f64>), PlanError> {
    let err = |why: String| PlanError::Candidate { name: name.to_string(), why };
    let shape = spec.shape().map_err(|e| err(e.to_string()))?;
    let clock = Arc::new(ReplayClock::new());
    let link = Arc::new(parking_lot::Mutex::new(Scheduler::new(link_shape, Duration::ZERO)));
    // The same layer `surge serve` puts under a volume export, on replay time.
    let dev = ModelDev::new(Arc::new(NullDev(spec.size)), clock.clone(), shape).with_link(Some(link));
    let r = replay(t, &dev, &clock, &ReplayOptions { qd }).map_err(|e| err(format!("replay: {e}")))?;
    Ok((r, dev.credits().percent()))
}

fn billed_usd(prices: &PriceTable, usd_hour: f64, ns: u64) -> f64 {
    prices.billed_seconds(ns, prices.minimum_seconds) as f64 / 3600.0 * usd_hour
}

/// The table row of a candidate that was replayed: its time, its dollars and
/// the value of the time it took.
fn simulated_row(name: String, spec: String, sized: String, replay: ReplayResult, storage: f64, compute: f64, o: &PlanOptions, volumes: Vec<surge_cloud::VolumeSpec>) -> Row {
    let ns = replay.completion_ns.max(1);
    let value = o.value_per_hour.map(|v| v * ns as f64 / 3.6e12);
    Row {
        name,
        export: Some(spec.clone()),
        spec: Some(spec),
        sized,
        simulated: true,
        engine: "event replay",
        completion_s: Some(ns as f64 / 1e9),
        storage_usd: Some(storage),
        compute_usd: Some(compute),
        time_value_usd: value,
        total_usd: Some(storage + compute + value.unwrap_or(0.0)),
        meets_deadline: None,
        why_lost: None,
        replay: Some(replay),
        peak_spec: None,
        modifications: None,
        volumes,
        credits_end_pct: None,
        elastic: None,
        stripe: None,
    }
}

pub fn plan_workload(t: &Trace, o: &PlanOptions, prices: &PriceTable) -> Result<WorkloadPlan, PlanError> {
    if t.records.is_empty() {
        return Err(PlanError::Invalid("the trace has no requests".into()));
    }
    let ebs = prices.instance_ebs(&o.instance)?;
    let usd_hour = prices.instance_usd_hour(&o.instance, 1)?;
    let qd = o.qd.unwrap_or_else(|| default_qd(t)).max(1);
    let demand = candidates::demand(t, o.capacity);
    let cands = candidates::static_candidates(&demand);
    let mut rows = Vec::new();
    for c in &cands {
        let (r, credits) = replay_spec(t, &c.name, &c.spec, ebs.shape(), qd)?;
        let ns = r.completion_ns.max(1);
        let storage = prices.usd_month(&c.spec) * prices.billed_seconds(ns, prices.minimum_seconds) as f64 / prices.seconds_per_month as f64;
        let compute = billed_usd(prices, usd_hour, ns);
        let mut row = simulated_row(c.name.clone(), c.spec.to_string(), c.sized.clone(), r, storage, compute, o, vec![c.spec.clone()]);
        row.credits_end_pct = credits;
        rows.push(row);
    }
    let moved: u64 = t.records.iter().filter(|r| r.op.moves_data()).map(|r| r.len).sum();
    // Why a candidate of the threaded harness is not run on it, if it is not.
    let not_threaded = if !o.threaded {
        Some("the threaded harness is off for this plan".to_string())
    } else if moved > THREADED_MAX_BYTES {
        Some(format!("the trace moves {:.1} GiB, over the threaded harness's {} GiB (its layers do the I/O on tmpfs)", moved as f64 / (1u64 << 30) as f64, THREADED_MAX_BYTES >> 30))
    } else {
        None
    };
    let stripe = crate::stripe::candidate(&demand);
    if let Some(c) = &stripe {
        rows.push(match &not_threaded {
            None => stripe_swap_row(t, c, qd, prices, o)?,
            Some(why) => stripe_row(t, c, ebs.shape(), qd, usd_hour, prices, o, why)?,
        });
    }
    match crate::modify::specs(&demand) {
        Some(ms) => {
            let rules = surge_cloud::ModifyRules::ebs_rolling();
            let m = crate::modify::run(t, &ms, rules, ebs.shape(), &o.instance, prices, qd).map_err(|why| PlanError::Candidate { name: MODIFY.into(), why })?;
            let raises = m.modifications.iter().filter(|x| x.action == surge_policy::modify::ModifyAction::Raise).count();
            let sized = format!("base: the cheapest gp3 that holds it; raised to {} on a burst ({} modifications, {raises} raises, EBS's 4 per rolling 24 h, 5 min optimizing)", ms.peak, m.modifications.len());
            let mut row = simulated_row(MODIFY.into(), ms.base.to_string(), sized, m.replay, m.cost.storage_usd, m.cost.compute_usd, o, vec![ms.base.clone()]);
            row.export = Some(format!("modify:base={},peak={}", ms.base, ms.peak));
            row.peak_spec = Some(ms.peak.to_string());
            row.modifications = Some(m.modifications);
            rows.push(row);
        }
        None => rows.push(not_simulated(&NotSimulated { name: MODIFY, why: "not run: the trace is untimed, or the base gp3 (3,000 IOPS, 125 MiB/s) already serves its peak second, so there is nothing to raise" })),
    }
    if o.threaded {
        let value = usd_hour + o.value_per_hour.unwrap_or(0.0);
        let mut elastic: Vec<(&str, String, String, Vec<surge_cloud::VolumeSpec>)> = candidates::elastic_backings(&demand, t)
            .into_iter()
            .map(|(name, b)| (name, crate::elastic::export_args(&b, value), b.to_string(), vec![b]))
            .collect();
        // Over the burstable stripe where there is one (a peak one gp2 does not burst to) and bursts to follow.
        if let Some(c) = stripe.as_ref().filter(|_| !demand.untimed) {
            let args = crate::elastic::stripe_export_args(c.size, c.members, value);
            elastic.push((candidates::ELASTIC_STRIPE, args, format!("the burstable stripe ({}, its swaps run)", c.spec()), vec![c.member.clone(); c.members as usize]));
        }
        for (name, args, backing, volumes) in elastic {
            match &not_threaded {
                Some(why) => rows.push(not_run(name, format!("not run: {why}"))),
                None => rows.push(elastic_row(t, name, args, &backing, volumes, qd, prices, o)?),
            }
        }
    }
    let fastest = rows.iter().filter_map(|r| r.completion_s).fold(f64::INFINITY, f64::min);
    let mut skipped: Vec<Row> = Vec::new();
    rows.retain(|r| r.simulated || {
        skipped.push(r.clone());
        false
    });
    let deadline_s = o.deadline.map(|d| match d {
        Deadline::Relative(x) => fastest * x,
        Deadline::Absolute(d) => d.as_secs_f64(),
    });
    for r in rows.iter_mut() {
        r.meets_deadline = Some(deadline_s.is_none_or(|d| r.completion_s.unwrap_or(f64::INFINITY) <= d * (1.0 + 1e-9)));
    }
    let recommended = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.meets_deadline == Some(true))
        .min_by(|a, b| a.1.total_usd.partial_cmp(&b.1.total_usd).expect("finite dollars"))
        .map(|(i, _)| i);
    explain(&mut rows, recommended, deadline_s);
    rows.extend(skipped);
    for n in candidates::NOT_SIMULATED {
        rows.push(not_simulated(n));
    }
    let objective = match (o.deadline, o.value_per_hour) {
        (Some(d), _) => Objective::Deadline(d),
        (None, Some(v)) => Objective::ValuePerHour(v),
        _ => Objective::Cheapest,
    };
    // modify-volume in the local cloud: EBS's rule, as the plan simulated it.
    let serve_args = recommended.map(|i| {
        let rules = if rows[i].name == MODIFY { " --local-modify-rules ebs-24h" } else { "" };
        format!("--export {}={} --local-instance {}{rules}", o.export, rows[i].export.as_deref().unwrap_or(""), o.instance)
    });
    Ok(WorkloadPlan {
        figures: "simulated on virtual time",
        trace: t.header.name.clone(),
        aggregate: t.header.aggregate,
        note: t.header.note.clone(),
        requests: t.records.len() as u64,
        trace_duration_s: t.span_ns() as f64 / 1e9,
        demand,
        qd,
        instance: o.instance.clone(),
        instance_usd_hour: usd_hour,
        objective,
        deadline_s,
        rows,
        recommended,
        serve_args,
        prices: format!("{} ({}, {})", prices.source, prices.region, prices.date),
    })
}

/// The elastic cache over `backing` (`args`: its `elastic:` options): the
/// daemon's `ElasticVolume` on the threaded harness (`crate::elastic`),
/// `cache=auto` valuing an hour at the instance's price plus `--value-per-hour`.
#[allow(clippy::too_many_arguments)]
fn elastic_row(t: &Trace, name: &str, args: String, backing: &str, volumes: Vec<surge_cloud::VolumeSpec>, qd: usize, prices: &PriceTable, o: &PlanOptions) -> Result<Row, PlanError> {
    let run = crate::elastic::run(t, &args, &o.instance, prices, qd).map_err(|why| PlanError::Candidate { name: name.into(), why })?;
    let caches: Vec<String> = run.cache_volumes.iter().map(|c| format!("{} for {:.1} s", c.specs.join(" then "), c.seconds)).collect();
    let mut sized = format!(
        "threaded harness (the daemon's ElasticVolume, its writeback and controller threads on a SimClock): backing {backing}; {} cache volume(s){}; clean {:.1} s after the start (the instance is billed until then), last cache deleted at {:.1} s",
        caches.len(),
        if caches.is_empty() { String::new() } else { format!(" ({})", caches.join(", ")) },
        run.drained_s,
        run.end_s
    );
    if let Some(swaps) = &run.backing_swaps {
        sized.push_str(&format!("; {} member swap(s) of the stripe", swaps.len()));
    }
    if run.cut {
        sized.push_str(&format!("; the drain did not finish within {} s of the end: the figures stop there", crate::elastic::DRAIN_LIMIT.as_secs()));
    }
    let mut row = simulated_row(name.into(), format!("elastic:{args}"), sized, run.replay.clone(), run.storage_usd, run.compute_usd, o, volumes);
    row.engine = "threaded";
    row.elastic = Some(run);
    Ok(row)
}

/// The burstable stripe on the threaded harness: the daemon's
/// `BurstableVolume` swapping members as their credits run out
/// (`crate::burstable`), every member and swap target billed for its lifetime.
fn stripe_swap_row(t: &Trace, c: &crate::stripe::StripeCandidate, qd: usize, prices: &PriceTable, o: &PlanOptions) -> Result<Row, PlanError> {
    let args = c.spec();
    let args = args.strip_prefix("burstable:").unwrap_or(&args);
    let run = crate::burstable::run(t, args, &o.instance, prices, qd).map_err(|why| PlanError::Candidate { name: STRIPE.into(), why })?;
    let mut sized = format!(
        "{}; threaded harness (the daemon's BurstableVolume, its controller and rebuild threads on a SimClock): {} member swap(s), {} volume(s) billed",
        c.sized(),
        run.swaps.len(),
        run.members.len()
    );
    if run.rebuilds_at_end > 0 {
        sized.push_str(&format!(", {} rebuild(s) still copying at the end", run.rebuilds_at_end));
    }
    let volumes = vec![c.member.clone(); c.members as usize];
    let mut row = simulated_row(STRIPE.into(), c.spec(), sized, run.replay.clone(), run.storage_usd, run.compute_usd, o, volumes);
    row.engine = "threaded";
    row.credits_end_pct = Some(run.lowest_credits_pct);
    row.stripe = Some(run);
    Ok(row)
}

/// The burstable stripe's row on the event engine (`why`: the threaded
/// harness could not run it): every member billed for the run, no swaps.
#[allow(clippy::too_many_arguments)]
fn stripe_row(t: &Trace, c: &crate::stripe::StripeCandidate, link: surge_block::model::Shape, qd: usize, usd_hour: f64, prices: &PriceTable, o: &PlanOptions, why: &str) -> Result<Row, PlanError> {
    let run = crate::stripe::run(t, c, link, qd, None).map_err(|why| PlanError::Candidate { name: STRIPE.into(), why })?;
    let ns = run.replay.completion_ns.max(1);
    let billed = prices.billed_seconds(ns, prices.minimum_seconds) as f64 / prices.seconds_per_month as f64;
    let storage = c.members as f64 * prices.usd_month(&c.member) * billed;
    let mut sized = format!("{}; event replay, no member swaps ({why})", c.sized());
    if run.lowest_credits_pct < 1.0 {
        sized.push_str("; a member ran out of credits: the time is an upper bound (the controller would have swapped it onto a fresh member)");
    }
    let volumes = vec![c.member.clone(); c.members as usize];
    let mut row = simulated_row(STRIPE.into(), c.spec(), sized, run.replay, storage, billed_usd(prices, usd_hour, ns), o, volumes);
    row.credits_end_pct = Some(run.lowest_credits_pct);
    Ok(row)
}

fn explain(rows: &mut [Row], rec: Option<usize>, deadline_s: Option<f64>) {
    let best = rec.map(|i| (rows[i].name.clone(), rows[i].total_usd.unwrap_or(0.0)));
    for (i, r) in rows.iter_mut().enumerate() {
        if Some(i) == rec {
            continue;
        }
        let c = r.completion_s.unwrap_or(0.0);
        r.why_lost = Some(match (r.meets_deadline, &best, deadline_s) {
            (Some(false), _, Some(d)) => format!("misses the deadline: {c:.1} s > {d:.1} s"),
            (_, Some((name, usd)), _) => {
                let more = r.total_usd.unwrap_or(0.0) - usd;
                format!("${more:.6} more than {name} ({:+.1} %)", if *usd > 0.0 { more / usd * 100.0 } else { 0.0 })
            }
            _ => "no candidate meets the deadline".into(),
        });
    }
}

/// A candidate that is simulated in general but was not run for this trace.
fn not_run(name: &str, why: String) -> Row {
    let mut r = not_simulated(&NotSimulated { name: "", why: "" });
    r.name = name.to_string();
    r.why_lost = Some(why);
    r
}

fn not_simulated(n: &NotSimulated) -> Row {
    Row {
        name: n.name.to_string(),
        spec: None,
        sized: String::new(),
        simulated: false,
        engine: "",
        completion_s: None,
        storage_usd: None,
        compute_usd: None,
        time_value_usd: None,
        total_usd: None,
        meets_deadline: None,
        why_lost: Some(format!("not simulated yet: {}", n.why)),
        replay: None,
        peak_spec: None,
        modifications: None,
        export: None,
        volumes: Vec::new(),
        credits_end_pct: None,
        elastic: None,
        stripe: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use surge_trace::{Header, Op, Rec, Source};

    fn trace(recs: Vec<Rec>) -> Trace {
        Trace::from_records(Header::new(Source::SurgeRecord, "t"), recs)
    }

    pub(crate) fn opts() -> PlanOptions {
        PlanOptions { instance: "m5.2xlarge".into(), deadline: Some(Deadline::Relative(1.05)), value_per_hour: None, qd: Some(32), capacity: 0, export: "app".into(), threaded: false }
    }

    fn recommended(p: &WorkloadPlan) -> &Row {
        &p.rows[p.recommended.expect("a recommendation")]
    }

    #[test]
    fn random_4k_heavy_work_gets_an_iops_capable_ssd_not_st1() {
        // 8,000 random 4 KiB reads a second for 20 s over 200 GiB.
        let recs = (0..160_000u64).map(|i| Rec { t_ns: i * 125_000, op: if i % 4 == 0 { Op::Write } else { Op::Read }, offset: (i * 2_654_435_761 % 52_428_800) * 4096, len: 4096, fua: false, dur_ns: 0 }).collect();
        let p = plan_workload(&trace(recs), &opts(), &PriceTable::default()).unwrap();
        let r = recommended(&p);
        assert!(!r.spec.as_ref().unwrap().starts_with("st1") && !r.spec.as_ref().unwrap().starts_with("sc1"), "{r:?}");
        let st1 = p.rows.iter().find(|r| r.name == "st1").unwrap();
        assert_eq!(st1.meets_deadline, Some(false), "st1 serves 500 IOPS: {st1:?}");
        assert!(r.completion_s.unwrap() <= p.deadline_s.unwrap());
        assert!(p.rows.iter().any(|r| !r.simulated && r.why_lost.as_deref().unwrap().starts_with("not simulated yet")));
    }

    #[test]
    fn large_sequential_work_does_not_pick_io2() {
        // 1 MiB sequential reads at 200 MiB/s for 60 s over 12 GiB.
        let recs = (0..12_000u64).map(|i| Rec { t_ns: i * 5_000_000, op: Op::Read, offset: i << 20, len: 1 << 20, fua: false, dur_ns: 0 }).collect();
        let p = plan_workload(&trace(recs), &opts(), &PriceTable::default()).unwrap();
        let r = recommended(&p);
        assert!(!r.spec.as_ref().unwrap().starts_with("io2"), "{r:?}");
        let io2 = p.rows.iter().find(|r| r.name == "io2").unwrap();
        assert!(io2.total_usd.unwrap() > r.total_usd.unwrap());
    }

    fn row<'a>(p: &'a WorkloadPlan, name: &str) -> &'a Row {
        p.rows.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no row {name}: {:?}", p.rows.iter().map(|r| &r.name).collect::<Vec<_>>()))
    }

    #[test]
    fn modify_volume_follows_a_burst_paying_less_for_storage_than_the_peak_all_along_but_running_late() {
        // A 10-minute burst at 400 MiB/s in half an hour at 20 MiB/s.
        let t = crate::modify::tests::bursty();
        let o = PlanOptions { instance: "m5.4xlarge".into(), deadline: None, ..opts() };
        let p = plan_workload(&t, &o, &PriceTable::default()).unwrap();
        assert_eq!(p.figures, "simulated on virtual time");
        let (m, peak) = (row(&p, MODIFY), row(&p, "gp3 (provisioned)"));
        assert!(m.simulated && m.peak_spec.as_deref() == peak.spec.as_deref(), "raised to the same spec gp3 is provisioned at: {m:?}\n{peak:?}");
        assert_eq!(m.modifications.as_ref().unwrap().len(), 2, "raise, lower: {:?}", m.modifications);
        assert!(m.storage_usd.unwrap() < 0.7 * peak.storage_usd.unwrap(), "peak spec billed for a third of the run: {m:?} vs {peak:?}");
        // gp3 at the peak keeps up; the modified volume serves the burst at
        // its base 125 MiB/s first, then ramps for 5 minutes: the run is late.
        assert!((peak.completion_s.unwrap() - 1_860.0).abs() < 2.0, "{peak:?}");
        assert!(m.completion_s.unwrap() > peak.completion_s.unwrap() + 30.0, "{m:?}");
        // ... which costs more compute than the storage it saves on this instance.
        assert!(m.total_usd.unwrap() > peak.total_usd.unwrap());
        assert_ne!(p.rows[p.recommended.unwrap()].name, MODIFY);
    }

    #[test]
    fn a_short_burst_in_two_quiet_hours_is_cheapest_on_modify_volume_unless_a_small_stripe_bursts_for_less() {
        // 2 minutes at 400 MiB/s, then 2 hours at 5 MiB/s.
        let t = crate::modify::tests::bursty_with(5, 120, 7_200);
        let o = PlanOptions { instance: "m5.4xlarge".into(), deadline: None, ..opts() };
        let p = plan_workload(&t, &o, &PriceTable::default()).unwrap();
        let (m, peak, base) = (row(&p, MODIFY), row(&p, "gp3 (provisioned)"), row(&p, "gp3"));
        assert!(m.total_usd.unwrap() < peak.total_usd.unwrap(), "{m:?}\n{peak:?}");
        assert!(m.total_usd.unwrap() < base.total_usd.unwrap(), "{m:?}\n{base:?}");
        assert!(m.completion_s.unwrap() < base.completion_s.unwrap());
        // The daemon runs it as a `modify:` export between the two specs.
        let export = m.export.as_deref().unwrap();
        assert_eq!(export, format!("modify:base={},peak={}", m.spec.as_deref().unwrap(), m.peak_spec.as_deref().unwrap()));
        assert_eq!(base.export, base.spec);
        for r in p.rows.iter().filter(|r| r.simulated && r.name != MODIFY && r.name != STRIPE) {
            assert!(m.total_usd.unwrap() < r.total_usd.unwrap(), "every single volume costs more: {m:?}\n{r:?}");
        }
        // At 49 GiB four 13 GiB gp2 members burst to 512 MiB/s with no
        // 5-minute ramp: the run ends earlier, and that saves more compute
        // than gp2's dearer GiB cost.
        let rec = &p.rows[p.recommended.unwrap()];
        assert_eq!(rec.name, STRIPE, "{:#?}", p.rows);
        assert!(!p.serve_args.as_deref().unwrap().contains("modify"), "{:?}", p.serve_args);
    }

    #[test]
    fn a_random_4k_burst_over_gp3s_ceiling_is_served_by_a_burstable_stripe_for_less_than_io2() {
        // 20,000 random 4 KiB writes a second for 20 s over 100 GiB: past
        // gp3's 16,000 IOPS, within seven gp2 members' bursts (21,000).
        let recs = (0..400_000u64).map(|i| Rec { t_ns: i * 50_000, op: Op::Write, offset: (i * 2_654_435_761 % 26_214_400) * 4096, len: 4096, fua: false, dur_ns: 0 }).collect();
        let o = PlanOptions { instance: "r5.12xlarge".into(), capacity: 100 << 30, ..opts() };
        let p = plan_workload(&trace(recs), &o, &PriceTable::default()).unwrap();
        let (s, gp3, io2) = (row(&p, STRIPE), row(&p, "gp3 (provisioned)"), row(&p, "io2"));
        assert_eq!(s.spec.as_deref(), Some("burstable:persistent,size=100GiB,members=7"), "{s:?}");
        assert!(s.simulated && !s.sized.contains("upper bound"), "twenty seconds leave credits: {s:?}");
        assert!(s.completion_s.unwrap() < 20.5, "keeps up: {s:?}");
        assert!(gp3.completion_s.unwrap() > 24.0, "16,000 IOPS at most: {gp3:?}");
        assert!(s.storage_usd.unwrap() < io2.storage_usd.unwrap() / 10.0, "{s:?}\n{io2:?}");
        assert!(s.total_usd.unwrap() < gp3.total_usd.unwrap() && s.total_usd.unwrap() < io2.total_usd.unwrap());
        assert_eq!(p.rows[p.recommended.unwrap()].name, STRIPE, "{:#?}", p.rows);
        assert!(p.serve_args.as_deref().unwrap().contains("--export app=burstable:persistent,size=100GiB,members=7"));
    }

    #[test]
    fn deadlines_parse() {
        assert_eq!("1.05x".parse::<Deadline>().unwrap(), Deadline::Relative(1.05));
        assert_eq!("90s".parse::<Deadline>().unwrap(), Deadline::Absolute(Duration::from_secs(90)));
        assert!("0.5x".parse::<Deadline>().is_err());
        assert!("soon".parse::<Deadline>().is_err());
    }
}
