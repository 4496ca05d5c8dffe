//! The price-aware boost planner: for the next burst, which cache volume to
//! provision (type, provisioned IOPS and throughput, size), or none, by the
//! dollars it is expected to cost at list prices.
//!
//! Pure: demand, backing volume, price table and settings in, a [`Plan`] out.
//! Volume limits come from [`VolumeSpec::shape`] (the figures the emulated
//! cloud enforces) and dollars from [`surge_cloud::cost::bill`] (the meter's own
//! per-second billing with its 60 s minimum), so the planner cannot disagree
//! with the cloud it plans for. All figures are full-scale: seconds, bytes and
//! rates as on the real cloud.
//!
//! How a cache volume is really used, and therefore estimated:
//! - requests reach the cache volume split into cache blocks (a 16 KiB write on
//!   4 KiB blocks is four I/Os; a 4 KiB write into a 64 KiB block is one I/O, but
//!   the block is first filled from the backing volume), and the flusher writes
//!   whole blocks back to the backing volume;
//! - the volume is billed from creation to deletion, at least 60 s: the lead
//!   (attach delay, or the pre-provisioning lead when the burst period was
//!   learned), the burst, the settle time (inactivity delay plus a window; the
//!   flusher already drains meanwhile), the rest of the drain, the detach;
//! - after the burst the cache only feeds the drain, and a fresh volume may be
//!   modified once (the cloud allows one modification per 6 hours), so the
//!   planner also picks the cheapest spec that drains as fast, the drain spec;
//! - time is worth `value_per_hour` (the compute waiting on the storage), or the
//!   burst must meet a completion-time target.
//!
//! Among the candidates that meet the demand the cheapest in storage dollars
//! wins; it is declined when it costs more than the time it saves is worth.

use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use surge_block::model::{Credits, Shape, VolumeModel, GIB, MIB};
use surge_cloud::cost::{bill, UsageRecord};
use surge_cloud::{PriceTable, VolumeSpec};

/// Volume types the planner considers for a boost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Provisioned IOPS and throughput, up to 16,000 IOPS and 1,000 MiB/s.
    Gp3,
    /// Provisioned IOPS beyond gp3's limits (io1 costs the same per IOPS up to
    /// 32,000 but needs 20 times the size for them, so it never wins).
    Io2,
    /// A fresh gp2: 5.4 M burst credits, 250 MiB/s from 171 GiB, priced by size.
    Gp2,
    /// Throughput-optimized HDD: cheap per GiB, 250 MiB/s per TiB in bursts,
    /// every I/O counted as at least 1 MiB: for large sequential bursts.
    St1,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Gp3, Kind::Io2, Kind::Gp2, Kind::St1];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Gp3 => "gp3",
            Kind::Io2 => "io2",
            Kind::Gp2 => "gp2",
            Kind::St1 => "st1",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| format!("unknown boost type {s:?} (gp3, io2, gp2, st1)"))
    }
}

/// What the application's time is worth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Worth {
    /// Dollars per hour the application costs while it waits (its compute).
    PerHour(f64),
    /// The burst should take at most this long (seconds): the cheapest boost
    /// that achieves it, none if the backing volume alone does.
    Deadline(f64),
}

/// What a burst asks of storage, in full-scale units.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Demand {
    /// Requests per second the application issues when storage keeps up.
    pub iops: f64,
    /// Bytes per second the application moves when storage keeps up.
    pub bps: f64,
    /// Mean request size, bytes.
    pub request: u64,
    /// Bytes the burst moves.
    pub burst_bytes: u64,
    /// Distinct bytes it leaves in the cache: the cache size, and what drains.
    pub footprint: u64,
    /// The cache can be attached before the burst starts (period learned).
    pub pre_provisioned: bool,
}

/// Planner settings (the elastic controller derives the delays from its policy).
#[derive(Debug, Clone, Serialize)]
pub struct PlannerConfig {
    pub kinds: Vec<Kind>,
    pub worth: Worth,
    /// Cache block size: the I/O size the cache volume sees and the flusher writes.
    pub block: u64,
    pub attach_delay: Duration,
    pub detach_delay: Duration,
    /// Burst start to provisioning, when the burst was not predicted.
    pub detect_delay: Duration,
    /// How long before a predicted burst the cache is created.
    pub lead: Duration,
    /// Burst end to the start of the drain phase (inactivity delay + a window).
    pub settle: Duration,
    /// Modify the cache to the cheapest spec that drains as fast once the burst
    /// is over (one modification of a fresh volume, as the cloud allows).
    pub lower_for_drain: bool,
    /// The instance's EBS limits (IOPS, bytes/s), all its volumes together:
    /// no cache volume is provisioned beyond them, and a candidate's speed is
    /// what the instance lets through.
    pub instance: Option<(f64, f64)>,
}

impl PlannerConfig {
    /// Every type, delays of the elastic policy's defaults.
    pub fn new(worth: Worth, block: u64) -> Self {
        PlannerConfig {
            kinds: Kind::ALL.to_vec(),
            worth,
            block,
            attach_delay: Duration::from_secs(3),
            detach_delay: Duration::from_secs(3),
            detect_delay: Duration::from_secs(5),
            lead: Duration::from_secs(13),
            settle: Duration::from_secs(35),
            lower_for_drain: true,
            instance: None,
        }
    }
}

fn as_string<S: Serializer>(v: &VolumeSpec, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

fn as_opt_string<S: Serializer>(v: &Option<VolumeSpec>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&v.to_string()),
        None => s.serialize_none(),
    }
}

/// One boost considered, with its estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub kind: Kind,
    #[serde(serialize_with = "as_string")]
    pub spec: VolumeSpec,
    /// The spec the cache is modified to for the drain, if that is cheaper.
    #[serde(serialize_with = "as_opt_string")]
    pub drain_spec: Option<VolumeSpec>,
    /// How long the application's burst takes with this boost.
    pub burst_s: f64,
    /// Seconds billed at `spec`, then at `drain_spec` (or `spec`).
    pub boost_s: f64,
    pub drain_s: f64,
    pub storage_usd: f64,
    /// What `burst_s` of the application's time is worth.
    pub time_usd: f64,
    /// Keeps up with the demand (or meets the deadline).
    pub meets: bool,
}

impl Candidate {
    pub fn total_usd(&self) -> f64 {
        self.storage_usd + self.time_usd
    }
}

/// The planner's answer, with everything it compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The boost to provision; `None`: no boost.
    pub choice: Option<Candidate>,
    /// The burst on the backing volume alone.
    pub no_boost_s: f64,
    pub no_boost_usd: f64,
    /// The best candidate of each type considered.
    pub candidates: Vec<Candidate>,
    pub demand: Demand,
    pub reason: String,
}

/// Charged (operations, bytes) one request costs a volume of `shape`. `block`:
/// the request goes through the cache and is split into cache blocks.
/// Requests are taken as whole blocks when at least one block long, so for a
/// mix of sizes the mean request gives the mean count of cache I/Os.
fn per_request(shape: &Shape, request: u64, block: Option<u64>) -> (f64, f64) {
    let (n, io) = match block {
        Some(b) if request >= b => (request as f64 / b as f64, b),
        _ => (1.0, request),
    };
    let c = shape.charge(io.max(1));
    (n * c.ops as f64, n * c.bytes as f64)
}

/// Seconds a fresh bucket needs to serve `units` at peak `rate` per second,
/// with burst credits that refill at their baseline (the model's burst rule).
fn serve_time(units: f64, rate: Option<u64>, credits: Option<Credits>) -> f64 {
    let Some(p) = rate.filter(|&r| r > 0).map(|r| r as f64) else { return 0.0 };
    let Some(c) = credits else { return units / p };
    let b = c.baseline as f64;
    if b >= p {
        return units / p;
    }
    // At the peak until the bucket is empty, then at the baseline.
    let t1 = c.initial as f64 / (p - b);
    if units <= p * t1 {
        units / p
    } else if b > 0.0 {
        t1 + (units - p * t1) / b
    } else {
        f64::INFINITY
    }
}

/// Seconds `requests` take on `shape` (charged `per` each), the application
/// issuing at most `rate` requests per second.
fn burst_time(shape: &Shape, requests: f64, per: (f64, f64), rate: f64) -> f64 {
    let ops = serve_time(requests * per.0, shape.iops, shape.op_credits);
    let bytes = serve_time(requests * per.1, shape.bps, shape.byte_credits);
    ops.max(bytes).max(if rate > 0.0 { requests / rate } else { f64::INFINITY })
}

/// Seconds to move `blocks` cache blocks: read from `from`, written to `to`,
/// one block at a time (each bucket refills while the other one is waited on).
fn copy_time(from: &Shape, to: &Shape, blocks: f64, block: u64) -> f64 {
    let side = |s: &Shape| {
        let c = s.charge(block);
        serve_time(blocks * c.ops as f64, s.iops, s.op_credits).max(serve_time(blocks * c.bytes as f64, s.bps, s.byte_credits))
    };
    side(from).max(side(to))
}

fn gib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(GIB).max(1)
}

fn ceil_to(v: f64, step: u64) -> u64 {
    ((v / step as f64).ceil().max(0.0) as u64) * step
}

fn vol(model: VolumeModel, gib: u64) -> Option<VolumeSpec> {
    let spec = VolumeSpec { model, size: gib * GIB, latency: Duration::ZERO };
    spec.shape().ok().map(|_| spec)
}

/// The specs of `kind` worth evaluating for a cache of `size` bytes that should
/// take `ops` operations and `bytes` bytes per second (each within the type's
/// limits, including AWS's IOPS-per-GiB ratios).
/// `shape` as the instance lets it be used.
fn capped(mut shape: Shape, instance: Option<(f64, f64)>) -> Shape {
    if let Some((iops, bps)) = instance {
        shape.iops = Some(shape.iops.map_or(iops as u64, |v| v.min(iops as u64)));
        shape.bps = Some(shape.bps.map_or(bps as u64, |v| v.min(bps as u64)));
    }
    shape
}

fn levels(kind: Kind, size: u64, ops: f64, bytes: f64) -> Vec<VolumeSpec> {
    let gib = gib_ceil(size);
    let mut out = Vec::new();
    match kind {
        Kind::Gp3 => {
            let tput = ceil_to(bytes / MIB as f64, 1).clamp(125, 1_000);
            let mut iops = ceil_to(ops, 100).clamp(3_000, 16_000);
            if tput > 125 {
                iops = iops.max(4 * tput);
            }
            let gib = gib.max(if iops > 3_000 { iops.div_ceil(500) } else { 1 });
            let model = VolumeModel::Gp3 { iops: (iops > 3_000).then_some(iops), throughput: (tput > 125).then_some(tput * MIB) };
            out.extend(vol(model, gib));
        }
        Kind::Io2 => {
            // io2: 0.256 MiB/s per provisioned IOPS.
            let for_bytes = bytes / (256.0 * MIB as f64 / 1_000.0);
            let iops = ceil_to(ops.max(for_bytes), 100).clamp(100, 256_000);
            out.extend(vol(VolumeModel::Io2 { iops }, gib.max(4).max(iops.div_ceil(1_000))));
        }
        Kind::Gp2 => {
            // Performance follows the size: 3 IOPS/GiB baseline (burst 3,000
            // on a fresh volume), 250 MiB/s from 171 GiB.
            let mut sizes = vec![gib, 171, 334, ceil_to(ops / 3.0, 1), 1_000];
            sizes.retain(|&g| g >= gib && g <= 16_384);
            sizes.sort_unstable();
            sizes.dedup();
            out.extend(sizes.into_iter().filter_map(|g| vol(VolumeModel::Gp2, g)));
        }
        Kind::St1 => {
            // Burst 250 MiB/s per TiB, at most 500 MiB/s (2 TiB), from 125 GiB.
            let for_bytes = ceil_to(bytes / (250.0 * MIB as f64) * 1_024.0, 1);
            let mut sizes = vec![gib.max(125), for_bytes.max(125), 2_048];
            sizes.retain(|&g| g >= gib && g <= 16_384);
            sizes.sort_unstable();
            sizes.dedup();
            out.extend(sizes.into_iter().filter_map(|g| vol(VolumeModel::St1, g)));
        }
    }
    out
}

/// Dollars for a volume that lives `boost_s` at `spec`, then `drain_s` at
/// `drain` (a modification: no second minimum), by the meter's own rules.
fn storage_usd(prices: &PriceTable, spec: &VolumeSpec, boost_s: f64, drain: Option<&VolumeSpec>, drain_s: f64) -> f64 {
    let ns = |s: f64| (s.max(0.0) * 1e9).round() as u64;
    let rec = |spec: &VolumeSpec, from: f64, to: f64, continued: bool| UsageRecord {
        id: "plan".into(),
        name: None,
        spec: spec.clone(),
        start_unix_ns: ns(from),
        end_unix_ns: Some(ns(to)),
        continued,
    };
    match drain {
        Some(d) => {
            let first = bill(prices, &rec(spec, 0.0, boost_s, false), 0).usd;
            first + bill(prices, &rec(d, boost_s, boost_s + drain_s, true), 0).usd
        }
        None => bill(prices, &rec(spec, 0.0, boost_s + drain_s, false), 0).usd,
    }
}

struct Ctx<'a> {
    cfg: &'a PlannerConfig,
    prices: PriceTable,
    backing: Shape,
    d: &'a Demand,
    /// Requests per second the application issues at most.
    rate: f64,
    /// Requests in the burst.
    requests: f64,
    /// Seconds the burst runs on the backing volume before the cache is there.
    pre_s: f64,
    /// Requests done by then.
    pre_requests: f64,
    worth_per_s: f64,
}

impl Ctx<'_> {
    fn evaluate(&self, kind: Kind, spec: VolumeSpec) -> Candidate {
        let shape = capped(spec.shape().expect("levels() returns valid specs"), self.cfg.instance);
        let cfg = self.cfg;
        let block = cfg.block.max(4_096);
        let left = (self.requests - self.pre_requests).max(0.0);
        let t_cache = burst_time(&shape, left, per_request(&shape, self.d.request, Some(block)), self.rate);
        // A request smaller than a block fills the block from the backing first.
        let blocks = (self.d.footprint as f64 / block as f64).ceil();
        let t_fill = if self.d.request < block { copy_time(&self.backing, &self.backing, blocks, block) } else { 0.0 };
        let on_cache = t_cache.max(t_fill);
        let burst_s = self.pre_s + on_cache;
        // Keeping up means keeping up with what the instance lets through.
        let reachable = match cfg.instance {
            Some((iops, bps)) => {
                let (ops, bytes) = per_request(&Shape { op_size: shape.op_size, byte_unit: shape.byte_unit, ..Shape::default() }, self.d.request, Some(block));
                self.rate.min(iops / ops.max(1e-9)).min(bps / bytes.max(1e-9))
            }
            None => self.rate,
        };
        let meets = match cfg.worth {
            Worth::Deadline(t) => burst_s <= t,
            Worth::PerHour(_) => on_cache <= 1.01 * left / reachable + 1e-9,
        };
        let lead = if self.d.pre_provisioned { cfg.lead } else { cfg.attach_delay };
        let boost_s = lead.as_secs_f64() + on_cache + cfg.settle.as_secs_f64();
        // The flusher drains from the end of the burst on; what is left after
        // the settle time drains in phase 2, then the volume is detached.
        let drain_all = copy_time(&shape, &self.backing, blocks, block);
        let drain_left = (drain_all - cfg.settle.as_secs_f64()).max(0.0);
        let drain_s = drain_left + cfg.detach_delay.as_secs_f64();
        let mut best = (storage_usd(&self.prices, &spec, boost_s, None, drain_s), None);
        if cfg.lower_for_drain && drain_left > 0.0 {
            for d in self.drain_specs(&spec) {
                let ds = d.shape().expect("valid");
                if copy_time(&ds, &self.backing, blocks, block) > drain_all * 1.02 + 1e-9 {
                    continue; // would slow the drain down
                }
                let usd = storage_usd(&self.prices, &spec, boost_s, Some(&d), drain_s);
                if usd < best.0 {
                    best = (usd, Some(d));
                }
            }
        }
        Candidate {
            kind,
            spec,
            drain_spec: best.1,
            burst_s,
            boost_s,
            drain_s,
            storage_usd: best.0,
            time_usd: burst_s * self.worth_per_s,
            meets,
        }
    }

    /// What a cache may be modified to for the drain: any type (EBS changes
    /// types in place), the same size, read at the backing's write pace.
    fn drain_specs(&self, boost: &VolumeSpec) -> Vec<VolumeSpec> {
        let block = self.cfg.block.max(4_096);
        let c = self.backing.charge(block);
        let secs = (c.ops as f64 / self.backing.iops.unwrap_or(u64::MAX) as f64).max(c.bytes as f64 / self.backing.bps.unwrap_or(u64::MAX) as f64);
        let blocks_s = if secs > 0.0 { 1.0 / secs } else { 0.0 };
        let mut out = Vec::new();
        for k in Kind::ALL {
            for s in levels(k, boost.size, blocks_s, blocks_s * block as f64) {
                // An attached device keeps its size.
                if s != *boost && s.size == boost.size {
                    out.push(s);
                }
            }
        }
        out
    }
}

fn usd(v: f64) -> String {
    if v >= 1.0 {
        format!("${v:.2}")
    } else {
        format!("${v:.4}")
    }
}

impl Candidate {
    fn brief(&self) -> String {
        let drain = self.drain_spec.as_ref().map_or(String::new(), |d| format!(", then {d} for the drain"));
        format!(
            "{}{drain}: {} storage ({:.0} s + {:.0} s, billed at least 60 s), burst {:.1} s{}",
            self.spec,
            usd(self.storage_usd),
            self.boost_s,
            self.drain_s,
            self.burst_s,
            if self.meets { "" } else { " (short of the demand)" }
        )
    }
}

/// Plan the boost for one burst. `backing` is the volume the cache fronts.
pub fn plan(cfg: &PlannerConfig, prices: &PriceTable, backing: &VolumeSpec, d: &Demand) -> Plan {
    plan_on(cfg, prices, &backing.shape().unwrap_or_default(), d)
}

/// [`plan`] for a backing known by its shape only (a stripe of volumes).
pub fn plan_on(cfg: &PlannerConfig, prices: &PriceTable, backing_shape: &Shape, d: &Demand) -> Plan {
    let mut prices = prices.clone();
    prices.time_scale = 1.0; // the planner works in full-scale seconds
    let backing_shape = backing_shape.clone();
    let rate = d.iops.min(if d.request > 0 { d.bps / d.request as f64 } else { 0.0 });
    let requests = if d.request > 0 { d.burst_bytes as f64 / d.request as f64 } else { 0.0 };
    let worth_per_s = match cfg.worth {
        Worth::PerHour(v) => v.max(0.0) / 3_600.0,
        Worth::Deadline(_) => 0.0,
    };
    let none = |reason: String, no_boost_s: f64| Plan {
        choice: None,
        no_boost_s,
        no_boost_usd: no_boost_s * worth_per_s,
        candidates: vec![],
        demand: d.clone(),
        reason,
    };
    if requests <= 0.0 || rate <= 0.0 || !rate.is_finite() {
        return none("no demand observed: no boost".into(), 0.0);
    }
    let back_per = per_request(&backing_shape, d.request, None);
    let no_boost_s = burst_time(&backing_shape, requests, back_per, rate);
    let pre_s = if d.pre_provisioned { 0.0 } else { (cfg.detect_delay + cfg.attach_delay).as_secs_f64() };
    let ctx = Ctx {
        cfg,
        prices: prices.clone(),
        backing: backing_shape.clone(),
        d,
        rate,
        requests,
        pre_s: pre_s.min(no_boost_s),
        pre_requests: (requests * pre_s / no_boost_s).min(requests),
        worth_per_s,
    };
    if ctx.pre_requests >= requests {
        return none(format!("the burst ({no_boost_s:.1} s on the backing volume) ends before a cache could be attached ({pre_s:.1} s): no boost"), no_boost_s);
    }
    // The rate the cache volume must take: the application's, or for a
    // completion target what finishes the rest of the burst in time.
    let size_rate = match cfg.worth {
        Worth::Deadline(t) if t > ctx.pre_s => rate.min((requests - ctx.pre_requests) / (t - ctx.pre_s)),
        _ => rate,
    };
    let block = cfg.block.max(4_096);
    let mut candidates = Vec::new();
    for &kind in &cfg.kinds {
        let ref_shape = Shape { op_size: Some(surge_block::model::SSD_OP), ..Shape::default() };
        let probe = match kind {
            Kind::St1 => Shape { op_size: Some(MIB), byte_unit: MIB, ..Shape::default() },
            _ => ref_shape,
        };
        let (ops, bytes) = per_request(&probe, d.request, Some(block));
        // Never more than the instance lets through.
        let (max_ops, max_bytes) = cfg.instance.unwrap_or((f64::INFINITY, f64::INFINITY));
        let evaluated: Vec<Candidate> = levels(kind, d.footprint, (size_rate * ops).min(max_ops), (size_rate * bytes).min(max_bytes)).into_iter().map(|s| ctx.evaluate(kind, s)).collect();
        // Per type: the cheapest that meets the demand, else the fastest.
        let best = evaluated
            .iter()
            .filter(|c| c.meets)
            .min_by(|a, b| a.storage_usd.total_cmp(&b.storage_usd))
            .or_else(|| evaluated.iter().min_by(|a, b| a.burst_s.total_cmp(&b.burst_s).then(a.storage_usd.total_cmp(&b.storage_usd))));
        candidates.extend(best.cloned());
    }
    candidates.sort_by(|a, b| b.meets.cmp(&a.meets).then(a.storage_usd.total_cmp(&b.storage_usd)));
    let no_boost_usd = no_boost_s * worth_per_s;
    let best = match cfg.worth {
        _ if candidates.iter().any(|c| c.meets) => candidates.iter().find(|c| c.meets).cloned(),
        Worth::PerHour(_) => candidates.iter().min_by(|a, b| a.total_usd().total_cmp(&b.total_usd())).cloned(),
        Worth::Deadline(_) => candidates.iter().min_by(|a, b| a.burst_s.total_cmp(&b.burst_s)).cloned(),
    };
    let others = |skip: Option<&Candidate>| {
        let v: Vec<String> = candidates.iter().filter(|c| Some(*c) != skip).map(|c| c.brief()).collect();
        if v.is_empty() {
            String::new()
        } else {
            format!("; also considered: {}", v.join("; "))
        }
    };
    let Some(best) = best else {
        return Plan { reason: "no volume type is allowed: no boost".into(), candidates, ..none(String::new(), no_boost_s) };
    };
    let (choice, reason) = match cfg.worth {
        Worth::PerHour(v) => {
            let saved = no_boost_usd - best.time_usd;
            if best.storage_usd >= saved {
                let r = format!(
                    "no boost: the cheapest, {}, costs more than the {:.1} s it saves are worth ({} at ${v}/h){}",
                    best.brief(),
                    no_boost_s - best.burst_s,
                    usd(saved.max(0.0)),
                    others(Some(&best))
                );
                (None, r)
            } else {
                let r = format!(
                    "boost {}: saves {:.1} s of {:.1} s, worth {} at ${v}/h{}{}",
                    best.brief(),
                    no_boost_s - best.burst_s,
                    no_boost_s,
                    usd(saved),
                    if best.meets { "" } else { "; no type keeps up with the demand, this one costs least in all" },
                    others(Some(&best))
                );
                (Some(best), r)
            }
        }
        Worth::Deadline(t) => {
            if no_boost_s <= t {
                (None, format!("no boost: the backing volume alone takes {no_boost_s:.1} s <= the {t:.1} s target{}", others(None)))
            } else {
                let r = format!(
                    "boost {}: {} the {t:.1} s target ({no_boost_s:.1} s without){}",
                    best.brief(),
                    if best.meets { "meets" } else { "comes closest to" },
                    others(Some(&best))
                );
                (Some(best), r)
            }
        }
    };
    Plan { choice, no_boost_s, no_boost_usd, candidates, demand: d.clone(), reason }
}

/// Requests per second a cache volume of `spec` serves for requests of
/// `request` bytes split into `block`-sized cache I/Os (no credits counted).
pub fn served_rate(spec: &VolumeSpec, request: u64, block: u64) -> f64 {
    let Ok(shape) = spec.shape() else { return 0.0 };
    let (ops, bytes) = per_request(&shape, request.max(1), Some(block.max(4_096)));
    let by = |units: f64, rate: Option<u64>| rate.map_or(f64::INFINITY, |r| r as f64 / units);
    by(ops, shape.iops).min(by(bytes, shape.bps))
}

#[cfg(test)]
mod tests;
