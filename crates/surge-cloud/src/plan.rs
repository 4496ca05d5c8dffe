//! Planning burstable volumes: for a capacity and a sustained IOPS or
//! throughput target, every way to get it (one gp2 volume, N small gp2
//! volumes striped and swapped as their credits run out, gp3, io1, io2, st1),
//! what each delivers on average and what it costs per month at list prices,
//! within the instance's attachment limit, swap overheads included.
//!
//! Pure: figures come from the volume models (`surge_block::model`, so the
//! planner and the emulation agree) and the [`PriceTable`]. The demand is
//! assumed to last `hours` hours of the month in one stretch, starting with full
//! credit buckets; the rest of the month the volumes idle.
//!
//! Burstable members (gp2 of size S, baseline b IOPS, burst B, bucket C) each
//! carry r = target/N: if r <= b nothing is ever swapped; else a member lasts
//! D = C / (r - b) seconds, and is then replaced: a fresh volume is created and
//! attached (`swap_setup`) and, for persistent data, the member's S bytes are
//! copied at the rebuild rate (R = S / rate), the old one deleted. Each member
//! swap bills an extra S GiB for max(setup + R, billing minimum). A rebuild
//! also reads S/256 KiB operations from the member being replaced, which must
//! still have credits for them and for the user's I/O meanwhile; the plan
//! requires setup + R <= D/2 (the paper: beyond that, migration eats more than
//! half of a volume's credits). All members swapped at once need 2N
//! attachments, one at a time N + 1.

use crate::cost::PriceTable;
use crate::spec::VolumeSpec;
use serde::Serialize;
use std::time::Duration;
use surge_block::model::{VolumeModel, GIB, MIB, SSD_OP, TIB};

/// What the volume must sustain.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Iops(u64),
    /// Bytes per second.
    Throughput(u64),
}

/// How the data lives (what a member swap costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UseCase {
    /// Data is migrated (mirror rebuild) before a member is deleted.
    Persistent,
    /// A write-through cache: members are dropped and replaced empty.
    Cache,
    /// Scratch data: members are replaced empty.
    Ephemeral,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanRequest {
    pub capacity: u64,
    pub target: Target,
    /// Hours per month the target must hold.
    pub hours: f64,
    pub use_case: UseCase,
    /// Volumes the instance can attach (Nitro: 28 attachments, one taken by the root volume).
    pub attach_limit: usize,
    /// Member rebuild speed, bytes/s (persistent).
    pub rebuild_rate: u64,
    /// Create + attach time of a fresh member.
    #[serde(with = "secs")]
    pub swap_setup: Duration,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl PlanRequest {
    /// Defaults: persistent, 27 attachments, 64 MiB/s rebuilds, 10 s setup.
    pub fn new(capacity: u64, target: Target, hours: f64) -> Self {
        PlanRequest { capacity, target, hours, use_case: UseCase::Persistent, attach_limit: 27, rebuild_rate: 64 * MIB, swap_setup: Duration::from_secs(10) }
    }
}

/// One way to meet (or not) the request.
#[derive(Debug, Clone, Serialize)]
pub struct PlanOption {
    /// e.g. "burstable gp2, all at once".
    pub name: String,
    pub kind: &'static str,
    pub volumes: usize,
    /// One volume's spec (all volumes of an option are alike).
    pub volume_spec: String,
    /// Most volumes attached at once (during swaps).
    pub attached_peak: usize,
    /// Average over the demand period.
    pub iops: f64,
    pub mib_s: f64,
    pub meets: bool,
    pub why_not: Option<String>,
    pub usd_month: f64,
    /// Part of `usd_month` paid for swaps (extra volumes while they overlap).
    pub swap_usd_month: f64,
    pub member_swaps_per_month: f64,
    /// How long one member lasts at the target before it must be swapped (s).
    pub member_lasts_s: Option<f64>,
    /// How long one member swap takes (setup + rebuild, s).
    pub swap_s: Option<f64>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub request: PlanRequest,
    pub options: Vec<PlanOption>,
    /// Index of the cheapest option that meets the target.
    pub cheapest: Option<usize>,
}

impl Plan {
    pub fn cheapest(&self) -> Option<&PlanOption> {
        self.cheapest.map(|i| &self.options[i])
    }

    pub fn option(&self, kind: &str) -> Option<&PlanOption> {
        self.options.iter().filter(|o| o.kind == kind && o.meets).min_by(|a, b| a.usd_month.total_cmp(&b.usd_month))
    }
}

fn gib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(GIB).max(1)
}

fn spec(model: VolumeModel, gib: u64) -> VolumeSpec {
    VolumeSpec { model, size: gib * GIB, latency: Duration::ZERO }
}

/// IOPS and bytes/s a target asks for, with SSD operations of `SSD_OP` for throughput.
fn want(t: Target) -> (f64, f64) {
    match t {
        Target::Iops(i) => (i as f64, 0.0),
        Target::Throughput(b) => ((b as f64 / SSD_OP as f64).ceil(), b as f64),
    }
}

fn meets(t: Target, iops: f64, bps: f64) -> bool {
    match t {
        Target::Iops(i) => iops + 1e-6 >= i as f64,
        Target::Throughput(b) => bps + 1e-6 >= b as f64,
    }
}

/// Plan every option for `req` at `prices`.
pub fn plan(req: &PlanRequest, prices: &PriceTable) -> Plan {
    let mut options = Vec::new();
    options.extend(gp2_single(req, prices));
    options.extend(burstable(req, prices));
    options.extend(provisioned(req, prices, "gp3"));
    options.extend(provisioned(req, prices, "io1"));
    options.extend(provisioned(req, prices, "io2"));
    options.extend(st1(req, prices));
    let cheapest = options.iter().enumerate().filter(|(_, o)| o.meets).min_by(|a, b| a.1.usd_month.total_cmp(&b.1.usd_month)).map(|(i, _)| i);
    Plan { request: req.clone(), options, cheapest }
}

fn base(name: String, kind: &'static str, volumes: usize, s: &VolumeSpec, prices: &PriceTable) -> PlanOption {
    PlanOption {
        name,
        kind,
        volumes,
        volume_spec: s.to_string(),
        attached_peak: volumes,
        iops: 0.0,
        mib_s: 0.0,
        meets: false,
        why_not: None,
        usd_month: prices.usd_month(s) * volumes as f64,
        swap_usd_month: 0.0,
        member_swaps_per_month: 0.0,
        member_lasts_s: None,
        swap_s: None,
        notes: Vec::new(),
    }
}

/// What one gp2 member of `gib` sustains for a per-member demand (IOPS, bytes/s).
struct Member {
    baseline: f64,
    burst: f64,
    bps: f64,
    credits: Option<f64>,
}

fn gp2_member(gib: u64) -> Option<Member> {
    let s = VolumeModel::Gp2.shape(gib * GIB).ok()?;
    let c = s.op_credits;
    Some(Member {
        baseline: c.map_or(s.iops.unwrap_or(0) as f64, |c| c.baseline as f64),
        burst: s.iops.unwrap_or(0) as f64,
        bps: s.bps.unwrap_or(u64::MAX) as f64,
        credits: c.map(|c| c.capacity as f64),
    })
}

/// One gp2 volume of the capacity (bursting as long as its credits last), and
/// one sized up until its baseline alone meets the target.
fn gp2_single(req: &PlanRequest, prices: &PriceTable) -> Vec<PlanOption> {
    let (ops, _) = want(req.target);
    let active = req.hours * 3600.0;
    let cap = gib_ceil(req.capacity);
    let mut sizes = vec![(cap, "gp2, one volume of the capacity")];
    let by_baseline = (ops / 3.0).ceil() as u64;
    if by_baseline > cap && by_baseline <= 16 * 1024 {
        sizes.push((by_baseline, "gp2, sized for its baseline"));
    }
    let mut out = Vec::new();
    for (gib, label) in sizes {
        let Some(m) = gp2_member(gib) else { continue };
        let s = spec(VolumeModel::Gp2, gib);
        let mut o = base(label.into(), "gp2", 1, &s, prices);
        let op_bytes = match req.target {
            Target::Iops(_) => 4096.0,
            Target::Throughput(_) => SSD_OP as f64,
        };
        let peak = m.burst.min(m.bps / op_bytes);
        let rate = ops.min(peak);
        let lasts = m.credits.filter(|_| rate > m.baseline).map(|c| c / (rate - m.baseline));
        let avg = match lasts {
            Some(d) if d < active => (rate * d + m.baseline * (active - d)) / active,
            _ => rate,
        };
        o.member_lasts_s = lasts;
        o.iops = avg;
        o.mib_s = avg * op_bytes / MIB as f64;
        o.meets = avg + 1e-6 >= ops;
        if !o.meets {
            o.why_not = Some(if ops > peak {
                format!("one gp2 volume of {gib} GiB peaks at {peak:.0} operations/s")
            } else {
                format!("its credits last {:.0} min of the {:.1} h; then {:.0} IOPS", lasts.unwrap_or(0.0) / 60.0, req.hours, m.baseline)
            });
        }
        out.push(o);
    }
    out
}

/// N small gp2 members striped, swapped as their credits run out: every N
/// from the fewest that can burst to the target up to the attachment limit;
/// the cheapest that meets the target per strategy (and the fewest members,
/// for reference, when none meets).
fn burstable(req: &PlanRequest, prices: &PriceTable) -> Vec<PlanOption> {
    let (iops, bps) = want(req.target);
    let active = req.hours * 3600.0;
    let strategies: &[(&str, bool)] = match req.use_case {
        UseCase::Persistent => &[("all at once", true), ("one at a time", false)],
        UseCase::Cache | UseCase::Ephemeral => &[("all at once", true)],
    };
    let mut out = Vec::new();
    for &(strategy, all) in strategies {
        let mut best: Option<PlanOption> = None;
        let mut first: Option<PlanOption> = None;
        for n in 1..=req.attach_limit.max(1) {
            let peak = if all { 2 * n } else { n + 1 };
            let gib = gib_ceil(req.capacity.div_ceil(n as u64));
            let Some(m) = gp2_member(gib) else { continue };
            if m.burst * n as f64 + 1e-9 < iops || m.bps * n as f64 + 1e-9 < bps {
                continue;
            }
            let s = spec(VolumeModel::Gp2, gib);
            let name = format!("burstable {n} x gp2:{gib}GiB ({}, {strategy})", use_name(req.use_case));
            let mut o = base(name, "burstable", n, &s, prices);
            o.attached_peak = peak;
            let r = iops / n as f64;
            let rebuild_s = match req.use_case {
                UseCase::Persistent => (gib * GIB) as f64 / req.rebuild_rate as f64,
                _ => 0.0,
            };
            let swap_s = req.swap_setup.as_secs_f64() + rebuild_s;
            o.swap_s = Some(swap_s);
            let lasts = m.credits.filter(|_| r > m.baseline).map(|c| c / (r - m.baseline));
            o.member_lasts_s = lasts;
            let mut avg = r;
            match lasts {
                Some(d) if d < active => {
                    let swaps = n as f64 * (active / d).floor();
                    o.member_swaps_per_month = swaps;
                    let billed = swap_s.max(prices.minimum_seconds as f64);
                    o.swap_usd_month = swaps * prices.usd_month(&s) * billed / prices.seconds_per_month as f64;
                    o.usd_month += o.swap_usd_month;
                    if req.use_case == UseCase::Persistent {
                        // Rebuild reads take operations from the member being replaced.
                        let rb_ops = req.rebuild_rate as f64 / SSD_OP as f64;
                        let during = r.min(m.burst - rb_ops).max(0.0);
                        let frac = (rebuild_s / d).min(1.0);
                        avg = r * (1.0 - frac) + during * frac;
                    }
                    if swap_s > d / 2.0 {
                        o.why_not = Some(format!("a swap takes {swap_s:.0} s, more than half of the {d:.0} s a member's credits last"));
                    }
                }
                _ => o.notes.push("members never run out of credits in this period: no swaps".into()),
            }
            if peak > req.attach_limit {
                o.why_not.get_or_insert(format!("needs {peak} attachments during swaps; the instance allows {}", req.attach_limit));
            }
            let total_iops = avg * n as f64;
            let total_bps = if bps > 0.0 { total_iops * SSD_OP as f64 } else { 0.0 };
            o.iops = total_iops;
            o.mib_s = if bps > 0.0 { total_bps / MIB as f64 } else { total_iops * 4096.0 / MIB as f64 };
            o.meets = o.why_not.is_none() && meets(req.target, total_iops, total_bps);
            if !o.meets && o.why_not.is_none() {
                o.why_not = Some(format!("averages {total_iops:.0} IOPS: rebuild reads take operations from the members being replaced"));
            }
            if req.use_case == UseCase::Cache {
                o.notes.push("every swap empties the cache; warm-up misses go to the backing volume (not priced here)".into());
            }
            if first.is_none() {
                first = Some(o.clone());
            }
            if o.meets && best.as_ref().is_none_or(|b| o.usd_month < b.usd_month) {
                best = Some(o);
            }
        }
        if let Some(o) = best.or(first) {
            out.push(o);
        }
    }
    out
}

fn use_name(u: UseCase) -> &'static str {
    match u {
        UseCase::Persistent => "persistent",
        UseCase::Cache => "cache",
        UseCase::Ephemeral => "ephemeral",
    }
}

/// Provisioned SSDs (gp3, io1, io2): as few volumes as the per-volume ceilings
/// allow, each at least the size its IOPS-per-GiB ratio requires.
fn provisioned(req: &PlanRequest, prices: &PriceTable, kind: &'static str) -> Option<PlanOption> {
    let (iops, bps) = want(req.target);
    let iops = iops.max(0.0) as u64;
    let (max_iops, per_gib, min_gib, max_bps) = match kind {
        "gp3" => (16_000u64, 500u64, 1u64, 1_000 * MIB),
        "io1" => (64_000, 50, 4, 1_000 * MIB),
        _ => (256_000, 1_000, 4, 4_000 * MIB),
    };
    let need_bps = bps as u64;
    let k = (iops.div_ceil(max_iops)).max(need_bps.div_ceil(max_bps)).max(1) as usize;
    let per_iops = iops.div_ceil(k as u64).max(if kind == "gp3" { 3_000 } else { 100 });
    let per_bps = need_bps.div_ceil(k as u64);
    let gib = gib_ceil(req.capacity.div_ceil(k as u64)).max(per_iops.div_ceil(per_gib)).max(min_gib);
    let model = match kind {
        "gp3" => {
            let tput = (per_bps > 125 * MIB).then(|| per_bps.div_ceil(MIB) * MIB);
            let iops_for_tput = tput.map_or(0, |t| (t * 4).div_ceil(MIB));
            VolumeModel::Gp3 { iops: Some(per_iops.max(iops_for_tput).max(3_000)), throughput: tput }
        }
        "io1" => VolumeModel::Io1 { iops: per_iops.max((per_bps as f64 / SSD_OP as f64).ceil() as u64) },
        _ => VolumeModel::Io2 { iops: per_iops.max((per_bps as f64 / (256.0 * MIB as f64 / 1000.0)).ceil() as u64) },
    };
    let s = spec(model, gib);
    let shape = s.shape().ok()?;
    let name = if k == 1 { kind.to_string() } else { format!("{kind}, {k} volumes striped") };
    let mut o = base(name, kind, k, &s, prices);
    let vol_iops = shape.iops.unwrap_or(0) as f64;
    let vol_bps = (shape.bps.unwrap_or(0) as f64).min(vol_iops * SSD_OP as f64);
    match req.target {
        Target::Iops(_) => {
            o.iops = vol_iops * k as f64;
            o.mib_s = o.iops * 4096.0 / MIB as f64;
        }
        Target::Throughput(_) => {
            o.mib_s = vol_bps * k as f64 / MIB as f64;
            o.iops = vol_bps * k as f64 / SSD_OP as f64;
        }
    }
    o.meets = meets(req.target, o.iops, o.mib_s * MIB as f64) && k <= req.attach_limit;
    if k > req.attach_limit {
        o.why_not = Some(format!("needs {k} volumes; the instance allows {}", req.attach_limit));
    }
    if gib * GIB > req.capacity.max(GIB) && gib > gib_ceil(req.capacity.div_ceil(k as u64)) {
        o.notes.push(format!("{kind} allows {per_gib} IOPS per GiB: {gib} GiB per volume for {per_iops} IOPS"));
    }
    if kind == "gp3" && k > 1 {
        o.notes.push("AWS raised gp3 to 80,000 IOPS per volume in 2025 (same per-IOPS price); the model keeps the 16,000 of the paper's era".into());
    }
    Some(o)
}

/// st1: throughput only (1 MiB operations, 500 IOPS per volume).
fn st1(req: &PlanRequest, prices: &PriceTable) -> Option<PlanOption> {
    let (iops, bps) = want(req.target);
    let per_tib = 40 * MIB; // baseline
    let need_tib_bytes = if bps > 0.0 { (bps / per_tib as f64 * TIB as f64).ceil() as u64 } else { 0 };
    let gib = gib_ceil(req.capacity).max(125).max(need_tib_bytes.div_ceil(GIB)).min(16 * 1024);
    let s = spec(VolumeModel::St1, gib);
    let shape = s.shape().ok()?;
    let mut o = base("st1".into(), "st1", 1, &s, prices);
    let base_bps = shape.byte_credits.map_or(shape.bps.unwrap_or(0), |c| c.baseline) as f64;
    match req.target {
        Target::Iops(_) => {
            o.iops = (base_bps / MIB as f64).min(500.0);
            o.mib_s = o.iops * 4096.0 / MIB as f64;
            o.meets = o.iops >= iops;
            o.why_not = (!o.meets).then(|| format!("st1 counts every small random I/O as 1 MiB: {:.0} IOPS at its {:.0} MiB/s baseline", o.iops, base_bps / MIB as f64));
        }
        Target::Throughput(_) => {
            o.mib_s = base_bps / MIB as f64;
            o.iops = base_bps / MIB as f64;
            o.meets = base_bps + 1e-6 >= bps;
            o.why_not = (!o.meets).then(|| format!("st1 sustains {:.0} MiB/s at most (500 MiB/s cap)", base_bps / MIB as f64));
        }
    }
    Some(o)
}

/// Monthly cost of the cheapest option of `kind` that sustains `iops` on
/// `capacity` (for "X costs Y % of io1 at equal IOPS" comparisons).
pub fn usd_month_at_iops(kind: &str, capacity: u64, iops: u64, prices: &PriceTable) -> Option<(f64, String)> {
    let req = PlanRequest::new(capacity, Target::Iops(iops), 720.0);
    let p = plan(&req, prices);
    p.option(kind).map(|o| (o.usd_month, if o.volumes > 1 { format!("{} x {}", o.volumes, o.volume_spec) } else { o.volume_spec.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(capacity: u64, target: Target, hours: f64) -> Plan {
        plan(&PlanRequest::new(capacity, target, hours), &PriceTable::default())
    }

    #[test]
    fn thirty_thousand_iops_on_100_gib_is_cheapest_with_small_gp2_members() {
        let plan = p(100 * GIB, Target::Iops(30_000), 720.0);
        let best = plan.cheapest().expect("an option meets 30,000 IOPS");
        assert_eq!(best.kind, "burstable", "{best:#?}");
        assert!(best.usd_month < 15.0 && best.attached_peak <= 27, "{best:#?}");
        assert!(best.member_swaps_per_month > 0.0 && best.swap_usd_month > 0.0);
        // All at once: 2N attachments while swapping, so at most 13 members;
        // 10 x 10 GiB burst exactly 30,000 but rebuild reads take some.
        let all = plan.options.iter().find(|o| o.kind == "burstable" && o.name.contains("all at once")).unwrap();
        assert!(all.meets && (11..=13).contains(&all.volumes), "{all:#?}");
        // io1 needs 600 GiB for 30,000 IOPS (50 IOPS/GiB): 600 x 0.125 + 30,000 x 0.065.
        let io1 = plan.option("io1").unwrap();
        assert!((io1.usd_month - (600.0 * 0.125 + 30_000.0 * 0.065)).abs() < 1e-6, "{io1:#?}");
        // io2: 1,000 IOPS/GiB, so 100 GiB is enough.
        let io2 = plan.option("io2").unwrap();
        assert!((io2.usd_month - (100.0 * 0.125 + 30_000.0 * 0.065)).abs() < 1e-6, "{io2:#?}");
        // gp3: two volumes of 15,000 IOPS (16,000 per volume).
        let gp3 = plan.option("gp3").unwrap();
        assert_eq!(gp3.volumes, 2);
        assert!((gp3.usd_month - (100.0 * 0.08 + 2.0 * 12_000.0 * 0.005)).abs() < 1e-6, "{gp3:#?}");
        assert!(best.usd_month / io1.usd_month < 0.01);
        let single = plan.options.iter().find(|o| o.kind == "gp2" && o.volume_spec == "gp2:100GiB").unwrap();
        assert!(!single.meets && single.why_not.as_ref().unwrap().contains("3000"), "{single:#?}");
        assert!(!plan.options.iter().find(|o| o.kind == "st1").unwrap().meets);
    }

    #[test]
    fn swap_overhead_follows_rebuild_time_and_member_life() {
        let plan = p(100 * GIB, Target::Iops(30_000), 720.0);
        let b = plan.options.iter().find(|o| o.kind == "burstable" && o.name.contains("all at once")).unwrap();
        let n = b.volumes as f64;
        let gib = 100f64 / n;
        let d = 5_400_000.0 / (30_000.0 / n - 100.0);
        assert!((b.member_lasts_s.unwrap() - d).abs() < 1.0, "{b:#?}");
        let swap = 10.0 + gib.ceil() * GIB as f64 / (64.0 * MIB as f64);
        assert!((b.swap_s.unwrap() - swap).abs() < 1e-6);
        let swaps = n * (720.0 * 3600.0 / d).floor();
        let extra = swaps * gib.ceil() * 0.10 * swap / (30.0 * 86_400.0);
        assert!((b.swap_usd_month - extra).abs() < 1e-6, "{} vs {extra}", b.swap_usd_month);
        // A cache swaps without copying: cheaper swaps.
        let mut r = PlanRequest::new(100 * GIB, Target::Iops(30_000), 720.0);
        r.use_case = UseCase::Cache;
        let c = plan_with(&r);
        let cb = c.options.iter().find(|o| o.kind == "burstable").unwrap();
        assert!(cb.swap_usd_month < b.swap_usd_month);
    }

    fn plan_with(r: &PlanRequest) -> Plan {
        plan(r, &PriceTable::default())
    }

    #[test]
    fn a_short_demand_fits_one_gp2_burst_yet_gp3_is_cheaper_today() {
        // 3,000 IOPS for 20 minutes: a 100 GiB gp2 bursts for 33 minutes...
        let plan = p(100 * GIB, Target::Iops(3_000), 20.0 / 60.0);
        let gp2 = plan.options.iter().find(|o| o.kind == "gp2").unwrap();
        assert!(gp2.meets && gp2.member_swaps_per_month == 0.0, "{gp2:#?}");
        // ...but gp3 includes 3,000 IOPS at $0.08/GiB-month: today it is cheaper.
        let best = plan.cheapest().unwrap();
        assert_eq!((best.kind, best.volume_spec.as_str()), ("gp3", "gp3:100GiB,iops=3000"), "{best:#?}");
        assert!(best.usd_month < gp2.usd_month);
    }

    #[test]
    fn the_attachment_limit_bounds_the_member_count() {
        let mut r = PlanRequest::new(100 * GIB, Target::Iops(60_000), 720.0);
        r.attach_limit = 27;
        let plan = plan_with(&r);
        let all = plan.options.iter().find(|o| o.kind == "burstable" && o.name.contains("all at once")).unwrap();
        assert!(!all.meets, "20 members need 40 attachments while swapping: {all:#?}");
        assert!(all.why_not.as_ref().unwrap().contains("attachments"));
        let one = plan.options.iter().find(|o| o.kind == "burstable" && o.name.contains("one at a time")).unwrap();
        assert!(one.meets && one.attached_peak <= 27, "{one:#?}");
    }

    #[test]
    fn large_members_whose_rebuild_eats_the_burst_are_rejected() {
        // 3 TiB in 10 members of 300 GiB: a rebuild at 64 MiB/s takes 80 min, a
        // member at 3,000 IOPS (baseline 900) lasts 43 min.
        let plan = p(3 * TIB, Target::Iops(30_000), 720.0);
        let b = plan.options.iter().filter(|o| o.kind == "burstable").collect::<Vec<_>>();
        assert!(b.iter().all(|o| !o.meets || o.volumes > 10), "{b:#?}");
    }

    #[test]
    fn a_throughput_target_is_planned_in_mib_per_second() {
        let plan = p(2 * TIB, Target::Throughput(500 * MIB), 720.0);
        let st1 = plan.options.iter().find(|o| o.kind == "st1").unwrap();
        assert!(st1.meets, "{st1:#?}");
        assert!(plan.cheapest().is_some());
        // Two 1 TiB gp2 volumes stream 250 MiB/s each on their baseline alone.
        let b = plan.options.iter().find(|o| o.kind == "burstable").unwrap();
        assert!(b.meets && b.volumes == 2 && b.member_swaps_per_month == 0.0, "{b:#?}");
    }

    #[test]
    fn usd_at_equal_iops_names_the_layout() {
        let (usd, layout) = usd_month_at_iops("io1", 100 * GIB, 30_000, &PriceTable::default()).unwrap();
        assert!((usd - 2025.0).abs() < 1e-6);
        assert_eq!(layout, "io1:600GiB,iops=30000");
    }
}
