//! The burstable-stripe candidate with its swaps: the daemon's
//! `BurstableVolume` (`surge_controller::burstable`: the stripe over gp2
//! members, the swap policy ticked by its controller thread, a member
//! nearly out of credits mirrored onto a fresh one by a rebuild thread,
//! swapped in and deleted) replayed on the threaded harness.
//!
//! The export spec (`burstable:persistent,size=..,members=N`) is parsed and
//! given the daemon's defaults by the code `surge serve` uses
//! (`surge_controller::burstable::parse_params`), on the local cloud the
//! daemon runs it on (`local_delays`: an attach takes the spec's
//! `attach_delay`, 3 s by default), every member behind the instance's EBS
//! limits, at full scale, on a [`SimClock`]. Two differences to the daemon,
//! both for the clock: the pieces of a request that spans members run in
//! order, not on threads of their own (a stripe's piece threads do not
//! register on the clock), and the volume files are on tmpfs.
//!
//! Priced from exact lifetimes (`threaded::usd_between`): every member from
//! its creation until the application completed or the member was deleted
//! by a swap, every swap target from its creation, and the instance for the
//! application's run (a persistent stripe has nothing to drain).

use crate::replay::ReplayResult;
use crate::threaded_replay::replay_threaded;
use serde::Serialize;
use std::sync::Arc;
use surge_block::{BlockDev, Clock, SimClock};
use surge_cloud::{LocalConfig, LocalProvider, PriceTable, Provider};
use surge_controller::burstable::{local_delays, parse_params, BurstableVolume, LoggedDecision, SwapRecord};
use surge_trace::Trace;

/// The export's name in the simulated daemon (its members are `app-sI-gG`).
const NAME: &str = "app";

/// A member volume of the run (the first ones and every swap's target).
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    pub id: String,
    pub name: String,
    pub spec: String,
    /// Seconds it existed (from its creation to its deletion or the run's end).
    pub seconds: f64,
    pub deleted: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct StripeSwapRun {
    /// The row's `replay` (not repeated here).
    #[serde(skip)]
    pub replay: ReplayResult,
    pub storage_usd: f64,
    pub compute_usd: f64,
    /// Swaps completed (or abandoned) during the run, with their times.
    pub swaps: Vec<SwapRecord>,
    /// Rebuilds still copying when the application completed.
    pub rebuilds_at_end: usize,
    /// The controller's decisions, with their reasons.
    pub decisions: Vec<LoggedDecision>,
    pub members: Vec<Member>,
    /// The emptiest current member's credit balance at the end, in percent.
    pub lowest_credits_pct: f64,
    /// Times the clock moved on past threads blocked on each other (diagnostic).
    pub forced_advances: u64,
}

/// Replay `t` on `burstable:ARGS` on `instance`, every member fresh.
pub fn run(t: &Trace, args: &str, instance: &str, prices: &PriceTable, qd: usize) -> Result<StripeSwapRun, String> {
    run_from(t, args, instance, prices, qd, None)
}

/// [`run`], the first members starting with `credits` (a fraction of a
/// fresh member's bucket: a stripe that served before) instead of full.
pub fn run_from(t: &Trace, args: &str, instance: &str, prices: &PriceTable, qd: usize, credits: Option<f64>) -> Result<StripeSwapRun, String> {
    let dir = crate::elastic::run_dir().map_err(|e| format!("a directory for the simulated volumes: {e}"))?;
    let mut p = parse_params(NAME, args, dir.path()).map_err(|e| format!("burstable:{args}: {e}"))?;
    p.progress_bars = false;
    p.parallel = false;
    p.epoch_unix_ns = Some(0);
    let ebs = prices.instance_ebs(instance).map_err(|e| e.to_string())?;
    let usd_hour = prices.instance_usd_hour(instance, 1).map_err(|e| e.to_string())?;
    let clock = SimClock::new();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    // This thread takes part in the simulation from here on.
    let _me = surge_block::ClockThread::enter(dyn_clock.clone());
    let cfg = LocalConfig { delays: local_delays(&p), prices: prices.clone(), epoch_unix_ns: Some(0), instance: Some(ebs), ..LocalConfig::new(dir.path().join("cloud")) };
    let prov = Arc::new(LocalProvider::open(cfg, dyn_clock.clone()).map_err(|e| e.to_string())?);
    let before = prov.cost().map_err(|e| e.to_string())?;
    let vol = BurstableVolume::open(p, prov.clone(), dyn_clock.clone()).map_err(|e| format!("opening the burstable volume: {e:#}"))?;
    if let Some(f) = credits {
        for id in vol.member_ids() {
            crate::threaded::set_op_credits(&prov, &id, f);
        }
    }
    vol.start().map_err(|e| format!("starting the controller: {e}"))?;
    let dev: Arc<dyn BlockDev> = vol.clone();
    let replay = replay_threaded(t, &dev, &clock, qd).map_err(|e| format!("replay: {e}"))?;
    vol.stop();
    let rebuilds_at_end = vol.rebuilds().len();
    let lowest_credits_pct = crate::threaded::credits_of(&prov, &vol.member_ids()).into_iter().fold(100.0, f64::min);
    let end = prov.cost().map_err(|e| e.to_string())?;
    let prefix = format!("{NAME}-");
    let storage_usd = crate::threaded::usd_between(prices, &before, &end, &prefix, 1.0);
    let compute_usd = prices.billed_seconds(replay.completion_ns.max(1), prices.minimum_seconds) as f64 / 3600.0 * usd_hour;
    let members = end
        .volumes
        .iter()
        .filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
        .map(|v| Member { id: v.id.clone(), name: v.name.clone().unwrap_or_default(), spec: v.spec.clone(), seconds: v.seconds, deleted: v.deleted })
        .collect();
    let run = StripeSwapRun {
        replay,
        storage_usd,
        compute_usd,
        swaps: vol.swaps(),
        rebuilds_at_end,
        decisions: vol.decisions(),
        members,
        lowest_credits_pct,
        forced_advances: clock.forced_advances(),
    };
    drop(vol);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidates::{demand, ELASTIC_STRIPE};
    use crate::plan::{plan_workload, tests::opts, PlanOptions, STRIPE};
    use surge_trace::{Header, Op, Rec, Source};

    /// Random 4 KiB writes at `iops` for `secs` over the first 64 MiB.
    fn writes(secs: u64, iops: u64) -> Trace {
        let gap = 1_000_000_000 / iops;
        let recs = (0..secs * iops).map(|i| Rec { t_ns: i * gap, op: Op::Write, offset: (i * 2_654_435_761 % 16_384) * 4096, len: 4096, fua: false, dur_ns: 0 }).collect();
        Trace::from_records(Header::new(Source::SurgeRecord, "writes"), recs)
    }

    /// 5,900 random writes a second for 15 s on two 1 GiB gp2 members that
    /// start at 0.5 % of their credits (27,000 operations each: 9 s at their
    /// 3,000 IOPS burst). Without swaps (the event replay) both run dry and
    /// the rest goes at their 100 IOPS baseline, near three minutes; the
    /// controller sees the drain and mirrors each onto a fresh member (full
    /// of credits; only the 32 MiB written is copied), so the run ends
    /// seconds after the trace, though late: the swaps start about when the
    /// members run dry.
    #[test]
    fn a_stripe_running_out_of_credits_is_swapped_onto_fresh_members_and_finishes_well_before_its_baseline_bound() {
        let t = writes(15, 5_900);
        let c = crate::stripe::candidate(&demand(&t, 0)).unwrap();
        assert_eq!((c.members, c.member.to_string().as_str()), (2, "gp2:1GiB"), "{c:?}");
        let prices = PriceTable::default();
        let link = prices.instance_ebs("m5.2xlarge").unwrap().shape();
        let bound = crate::stripe::run(&t, &c, link, 32, Some(0.005)).unwrap();
        assert!(bound.lowest_credits_pct < 1.0, "the event replay runs dry: {}", bound.lowest_credits_pct);
        let spec = c.spec();
        let run = run_from(&t, spec.strip_prefix("burstable:").unwrap(), "m5.2xlarge", &prices, 32, Some(0.005)).unwrap();
        assert!(run.swaps.iter().any(|s| s.ok), "{:#?}\n{:#?}", run.swaps, run.decisions);
        assert!(run.decisions.iter().any(|d| d.reason.contains("credits")), "{:#?}", run.decisions);
        let (swapped, upper) = (run.replay.completion_ns as f64 / 1e9, bound.replay.completion_ns as f64 / 1e9);
        assert!(upper > 60.0, "the baseline bound: {upper}");
        assert!(swapped < upper / 2.0 && swapped < 40.0, "with swaps {swapped} s, baseline-only bound {upper} s: {run:#?}");
        // The first members were deleted by the swaps; their targets billed too.
        assert!(run.members.len() >= 4 && run.members.iter().filter(|m| m.deleted).count() >= 2, "{:#?}", run.members);
        let all_along = 2.0 * prices.usd_month(&c.member) * prices.billed_seconds(run.replay.completion_ns, prices.minimum_seconds) as f64 / prices.seconds_per_month as f64;
        assert!(run.storage_usd > all_along && run.storage_usd < 2.5 * all_along, "two members for the run, plus the targets from their creation: {} vs {all_along}", run.storage_usd);
        assert_eq!(run.replay.requests, t.records.len() as u64);
    }

    /// A burst over one gp2's 3,000 IOPS: the plan runs the stripe with its
    /// controller and the elastic cache over it, both on the threaded
    /// harness, each with its time and dollars.
    #[test]
    fn the_plan_runs_the_stripe_and_the_elastic_cache_over_it_on_the_threaded_harness() {
        let t = writes(4, 5_900);
        let o = PlanOptions { threaded: true, ..opts() };
        let p = plan_workload(&t, &o, &PriceTable::default()).unwrap();
        let row = |n: &str| p.rows.iter().find(|r| r.name == n).unwrap_or_else(|| panic!("no {n}: {:#?}", p.rows));
        let (s, e) = (row(STRIPE), row(ELASTIC_STRIPE));
        assert!(s.simulated && s.engine == "threaded" && s.stripe.is_some(), "{s:?}");
        assert!(e.simulated && e.engine == "threaded", "{e:?}");
        assert_eq!(e.export.as_deref().unwrap().split(",cache=").next(), Some("elastic:backing=burstable:1GiB,members=2"), "{e:?}");
        for r in [s, e] {
            let c = r.completion_s.unwrap();
            assert!(c.is_finite() && c >= 3.9 && c < 10.0, "{r:?}");
            assert!(r.storage_usd.unwrap() > 0.0 && r.compute_usd.unwrap() > 0.0, "{r:?}");
            assert!((r.total_usd.unwrap() - r.storage_usd.unwrap() - r.compute_usd.unwrap()).abs() < 1e-12, "{r:?}");
            assert!(r.why_lost.is_some() || p.recommended.is_some_and(|i| p.rows[i].name == r.name));
        }
        assert!(e.elastic.as_ref().unwrap().backing_swaps.is_some(), "{e:?}");
        assert!(p.rows.iter().all(|r| r.simulated || !r.name.contains("burstable")), "nothing burstable is left unsimulated: {:#?}", p.rows);
    }
}
