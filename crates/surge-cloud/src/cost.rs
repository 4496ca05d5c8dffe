//! The cost meter: what each second of each volume costs.
//!
//! Billing follows EBS: per second, from creation to deletion (attached or
//! not), with a 60-second minimum per volume; a monthly price is charged per
//! second as `price x seconds / seconds_per_month` (AWS's own examples use a
//! 30-day month). Alongside dollars, the meter accumulates the elastic-cache
//! paper's "adjusted storage accumulation": a volume of N GB with reserved
//! bandwidth B MB/s accrues B x N AGBs per second (no minimum; GB counted as
//! GiB, as AWS does; MB/s as 10^6 bytes/s, as the paper's 33 MB/s disks).
//!
//! List prices: AWS us-east-1, <https://aws.amazon.com/ebs/pricing/>, figures as
//! listed in 2025 (unchanged since gp3's launch in December 2020): gp2
//! $0.10/GB-month; gp3 $0.08/GB-month, $0.005 per IOPS-month above 3,000,
//! $0.040 per MiB/s-month above 125; io1 $0.125/GB-month + $0.065/IOPS-month;
//! io2 $0.125/GB-month + $0.065/IOPS-month up to 32,000, $0.0455 for
//! 32,001-64,000, $0.032 above; st1 $0.045/GB-month; sc1 $0.015/GB-month.
//! `reserved` has no list price anywhere; we price it like gp3 storage plus
//! gp3's provisioned throughput and IOPS for every unit reserved (an
//! assumption, overridable). Azure premium is not priced by default.
//! Every figure can be overridden from TOML ([`PriceTable::from_toml`]).
//!
//! Compute: the instances whose time the storage decides (the application's
//! nodes, waiting during its I/O bursts) are priced too, so a slower, cheaper
//! volume that prolongs a run pays for it. EC2 on-demand list prices, Linux,
//! us-east-1, per hour, billed per second with a 60 s minimum (unchanged for
//! these types since 2018; <https://aws.amazon.com/ec2/pricing/on-demand/>).
//!
//! Object storage (the burst buffer's backing): S3 Standard request and
//! transfer list prices, us-east-1, <https://aws.amazon.com/s3/pricing/>
//! (2025): PUT, COPY, POST, LIST $0.005 per 1,000; GET and all other requests
//! $0.0004 per 1,000; transfer between S3 and EC2 in the same region $0.00/GB,
//! out to the internet $0.09/GB (first 10 TB/month); storage $0.023 per
//! GB-month (first 50 TB/month), which the meter leaves out (every approach
//! compared stores the same bytes) and bills priced per part may show.
//!
//! Traffic between instances (a compute node reading a base image from a
//! storage node): EC2 data transfer list prices, us-east-1,
//! <https://aws.amazon.com/ec2/pricing/on-demand/> (2025): free within an
//! Availability Zone over private addresses; $0.01/GB in each direction
//! (sender and receiver each billed) across Availability Zones.
//!
//! Reduced-scale experiments run time `time_scale` times as fast as the
//! cloud's (durations x f): billing stretches each emulated second back to
//! 1/f seconds, so the 60 s minimum and per-second rounding apply at full scale.

use crate::spec::VolumeSpec;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use surge_block::model::{VolumeModel, GIB, MIB};
use surge_block::Clock;

/// Price of units above `from` (up to the next tier's `from`), per unit-month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    pub from: u64,
    pub usd_month: f64,
}

/// One volume type's price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Price {
    /// Per GiB-month of provisioned size.
    pub gb_month: f64,
    /// Per provisioned IOPS-month, tiered.
    pub iops: Vec<Tier>,
    /// Per provisioned MiB/s-month, tiered.
    pub throughput: Vec<Tier>,
    /// false: no list price known; the volume is billed $0 and flagged.
    pub listed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    pub source: String,
    pub date: String,
    pub region: String,
    pub seconds_per_month: u64,
    pub minimum_seconds: u64,
    pub gp2: Price,
    pub gp3: Price,
    pub io1: Price,
    pub io2: Price,
    pub st1: Price,
    pub sc1: Price,
    pub reserved: Price,
    pub azure_premium: Price,
    /// Emulated seconds per billed second's 1/f: 1.0 bills real time; an
    /// experiment at time scale f (durations x f) sets f.
    #[serde(default = "one")]
    pub time_scale: f64,
    /// Compute instances, $ per hour (on-demand, Linux).
    #[serde(default = "ec2_on_demand")]
    pub instances: BTreeMap<String, f64>,
    /// What each instance type can move to and from EBS, all its volumes together.
    #[serde(default = "ec2_ebs")]
    pub instance_ebs: BTreeMap<String, InstanceEbs>,
    /// S3 requests and transfer.
    #[serde(default)]
    pub s3: S3Price,
    /// Traffic between instances in the region.
    #[serde(default)]
    pub ec2_transfer: Ec2Transfer,
}

/// EC2 data transfer between instances of one region, $ per GB.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ec2Transfer {
    /// Within one Availability Zone, over private addresses.
    pub same_az_gb: f64,
    /// Across Availability Zones, billed to each side.
    pub cross_az_gb_each_way: f64,
}

impl Default for Ec2Transfer {
    fn default() -> Self {
        Ec2Transfer { same_az_gb: 0.0, cross_az_gb_each_way: 0.01 }
    }
}

impl Ec2Transfer {
    /// What moving `bytes` from one instance to another costs (both sides'
    /// charges), within one zone or across two.
    pub fn usd(&self, bytes: u64, cross_az: bool) -> f64 {
        let per_gb = if cross_az { 2.0 * self.cross_az_gb_each_way } else { self.same_az_gb };
        bytes as f64 / GIB as f64 * per_gb
    }
}

/// S3 Standard requests and transfer, $ (see the module comment for the source).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct S3Price {
    /// PUT, COPY, POST, LIST (and multipart parts), per 1,000.
    pub put_per_1000: f64,
    /// GET and other requests, per 1,000.
    pub get_per_1000: f64,
    /// Per GB between S3 and EC2 in the same region.
    pub transfer_in_region_gb: f64,
    /// Per GB out of AWS to the internet.
    pub transfer_out_gb: f64,
    /// S3 Standard storage, per GB-month (first 50 TB, us-east-1, 2025).
    pub storage_gb_month: f64,
}

impl Default for S3Price {
    fn default() -> Self {
        S3Price { put_per_1000: 0.005, get_per_1000: 0.0004, transfer_in_region_gb: 0.0, transfer_out_gb: 0.09, storage_gb_month: 0.023 }
    }
}

/// S3 traffic to price: requests and bytes moved within the region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct S3Usage {
    pub puts: u64,
    pub gets: u64,
    /// Bytes moved between S3 and the instances (same region), both ways.
    pub bytes: u64,
}

impl S3Usage {
    pub fn add(&mut self, o: S3Usage) {
        self.puts += o.puts;
        self.gets += o.gets;
        self.bytes += o.bytes;
    }
}

fn one() -> f64 {
    1.0
}

/// EC2 on-demand list prices, Linux, us-east-1, $/hour.
fn ec2_on_demand() -> BTreeMap<String, f64> {
    [
        ("m5.large", 0.096),
        ("m5.xlarge", 0.192),
        ("m5.2xlarge", 0.384),
        ("m5.4xlarge", 0.768),
        ("c5.large", 0.085),
        ("c5.xlarge", 0.17),
        ("c5.2xlarge", 0.34),
        ("c5.4xlarge", 0.68),
        ("c5.9xlarge", 1.53),
        ("r5.large", 0.126),
        ("r5.xlarge", 0.252),
        ("r5.2xlarge", 0.504),
        ("r5.4xlarge", 1.008),
        ("r5.8xlarge", 2.016),
        ("r5.12xlarge", 3.024),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// An instance type's dedicated EBS bandwidth (AWS, "Amazon EBS-optimized
/// instance types": throughput measured with 128 KiB I/O, IOPS with 16 KiB I/O;
/// https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html, co.html, mo.html).
/// Sizes up to 4xlarge (c5, m5, r5 up to 2xlarge) run at the baseline and may
/// burst to the maximum for 30 minutes at least once a day; larger ones hold
/// the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InstanceEbs {
    /// MB/s (10^6 bytes).
    pub baseline_mbps: f64,
    pub max_mbps: f64,
    pub baseline_iops: u64,
    pub max_iops: u64,
}

impl InstanceEbs {
    /// What the instance sustains (the baseline: the 30-minute burst of the
    /// smaller sizes is not modelled), as a device-model shape: every volume of
    /// the instance shares it. I/Os of up to 256 KiB count as one operation.
    pub fn shape(&self) -> surge_block::model::Shape {
        surge_block::model::Shape {
            iops: Some(self.baseline_iops),
            bps: Some((self.baseline_mbps * 1e6) as u64),
            op_size: Some(surge_block::model::SSD_OP),
            ..Default::default()
        }
    }

    /// Sustained (IOPS, bytes/s).
    pub fn sustained(&self) -> (f64, f64) {
        (self.baseline_iops as f64, self.baseline_mbps * 1e6)
    }
}

/// EBS limits of the instance types priced above (us-east-1, Nitro, EBS-optimized by default).
fn ec2_ebs() -> BTreeMap<String, InstanceEbs> {
    let e = |b: f64, m: f64, bi: u64, mi: u64| InstanceEbs { baseline_mbps: b, max_mbps: m, baseline_iops: bi, max_iops: mi };
    [
        ("m5.large", e(81.25, 593.75, 3_600, 18_750)),
        ("m5.xlarge", e(143.75, 593.75, 6_000, 18_750)),
        ("m5.2xlarge", e(287.5, 593.75, 12_000, 18_750)),
        ("m5.4xlarge", e(593.75, 593.75, 18_750, 18_750)),
        ("c5.large", e(81.25, 593.75, 4_000, 20_000)),
        ("c5.xlarge", e(143.75, 593.75, 6_000, 20_000)),
        ("c5.2xlarge", e(287.5, 593.75, 10_000, 20_000)),
        ("c5.4xlarge", e(593.75, 593.75, 20_000, 20_000)),
        ("c5.9xlarge", e(1_187.5, 1_187.5, 40_000, 40_000)),
        ("r5.large", e(81.25, 593.75, 3_600, 18_750)),
        ("r5.xlarge", e(143.75, 593.75, 6_000, 18_750)),
        ("r5.2xlarge", e(287.5, 593.75, 12_000, 18_750)),
        ("r5.4xlarge", e(593.75, 593.75, 18_750, 18_750)),
        ("r5.8xlarge", e(850.0, 850.0, 30_000, 30_000)),
        ("r5.12xlarge", e(1_187.5, 1_187.5, 40_000, 40_000)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn storage(gb_month: f64) -> Price {
    Price { gb_month, listed: true, ..Price::default() }
}

fn tiers(t: &[(u64, f64)]) -> Vec<Tier> {
    t.iter().map(|&(from, usd_month)| Tier { from, usd_month }).collect()
}

impl Default for PriceTable {
    fn default() -> Self {
        PriceTable {
            source: "https://aws.amazon.com/ebs/pricing/".into(),
            date: "2025 (unchanged since December 2020)".into(),
            region: "us-east-1".into(),
            seconds_per_month: 30 * 86_400,
            minimum_seconds: 60,
            gp2: storage(0.10),
            gp3: Price { iops: tiers(&[(3_000, 0.005)]), throughput: tiers(&[(125, 0.040)]), ..storage(0.08) },
            io1: Price { iops: tiers(&[(0, 0.065)]), ..storage(0.125) },
            io2: Price { iops: tiers(&[(0, 0.065), (32_000, 0.0455), (64_000, 0.032)]), ..storage(0.125) },
            st1: storage(0.045),
            sc1: storage(0.015),
            reserved: Price { iops: tiers(&[(0, 0.005)]), throughput: tiers(&[(0, 0.040)]), ..storage(0.08) },
            azure_premium: Price::default(),
            time_scale: 1.0,
            instances: ec2_on_demand(),
            instance_ebs: ec2_ebs(),
            s3: S3Price::default(),
            ec2_transfer: Ec2Transfer::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("price table TOML: {0}")]
    Toml(String),
    #[error("no price for instance type {0:?}; known: {1} (add it under [instances] in a price table)")]
    UnknownInstance(String, String),
}

fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(bv) => merge(bv, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl PriceTable {
    /// The default table with the keys given in `s` replaced, e.g.
    /// `[gp2]\ngb_month = 0.12` or `seconds_per_month = 2678400`.
    pub fn from_toml(s: &str) -> Result<Self, PriceError> {
        let over: toml::Value = toml::from_str(s).map_err(|e| PriceError::Toml(e.to_string()))?;
        let mut base = toml::Value::try_from(PriceTable::default()).map_err(|e| PriceError::Toml(e.to_string()))?;
        merge(&mut base, over);
        let t: PriceTable = base.try_into().map_err(|e: toml::de::Error| PriceError::Toml(e.to_string()))?;
        if t.seconds_per_month == 0 {
            return Err(PriceError::Toml("seconds_per_month must be positive".into()));
        }
        if !(t.time_scale > 0.0 && t.time_scale.is_finite()) {
            return Err(PriceError::Toml("time_scale must be positive".into()));
        }
        Ok(t)
    }

    /// The EBS limits of instance type `instance`.
    pub fn instance_ebs(&self, instance: &str) -> Result<InstanceEbs, PriceError> {
        self.instance_ebs.get(instance).copied().ok_or_else(|| PriceError::UnknownInstance(instance.to_string(), self.instance_ebs.keys().cloned().collect::<Vec<_>>().join(", ")))
    }

    /// $ per hour of `count` instances of `instance`.
    pub fn instance_usd_hour(&self, instance: &str, count: u32) -> Result<f64, PriceError> {
        match self.instances.get(instance) {
            Some(p) => Ok(p * count as f64),
            None => Err(PriceError::UnknownInstance(instance.to_string(), self.instances.keys().cloned().collect::<Vec<_>>().join(", "))),
        }
    }

    /// What S3 traffic costs (requests, plus same-region transfer).
    pub fn s3_usd(&self, u: &S3Usage) -> f64 {
        u.puts as f64 / 1000.0 * self.s3.put_per_1000
            + u.gets as f64 / 1000.0 * self.s3.get_per_1000
            + u.bytes as f64 / GIB as f64 * self.s3.transfer_in_region_gb
    }

    /// Seconds billed for `ns` of emulated time: full-scale seconds, rounded
    /// up, at least `minimum` (0 for a continuation).
    pub fn billed_seconds(&self, ns: u64, minimum: u64) -> u64 {
        let secs = if self.time_scale == 1.0 { ns.div_ceil(1_000_000_000) } else { (ns as f64 / 1e9 / self.time_scale - 1e-9).ceil().max(0.0) as u64 };
        secs.max(minimum)
    }

    pub fn price(&self, model: &VolumeModel) -> &Price {
        match model {
            VolumeModel::Reserved { .. } => &self.reserved,
            VolumeModel::Gp2 => &self.gp2,
            VolumeModel::Gp3 { .. } => &self.gp3,
            VolumeModel::Io1 { .. } => &self.io1,
            VolumeModel::Io2 { .. } => &self.io2,
            VolumeModel::St1 => &self.st1,
            VolumeModel::Sc1 => &self.sc1,
            VolumeModel::AzurePremium => &self.azure_premium,
        }
    }

    /// What a volume costs per month.
    pub fn usd_month(&self, spec: &VolumeSpec) -> f64 {
        let p = self.price(&spec.model);
        let (iops, mibs) = match spec.model {
            VolumeModel::Reserved { bw, iops } => (iops.unwrap_or(0), bw.unwrap_or(0) as f64 / MIB as f64),
            VolumeModel::Gp3 { iops, throughput } => (iops.unwrap_or(3_000), throughput.unwrap_or(125 * MIB) as f64 / MIB as f64),
            VolumeModel::Io1 { iops } | VolumeModel::Io2 { iops } => (iops, 0.0),
            _ => (0, 0.0),
        };
        let gib = spec.size as f64 / GIB as f64;
        p.gb_month * gib + tiered(&p.iops, iops as f64) + tiered(&p.throughput, mibs)
    }
}

fn tiered(tiers: &[Tier], units: f64) -> f64 {
    tiers
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let upto = tiers.get(i + 1).map_or(f64::INFINITY, |n| n.from as f64);
            (units.min(upto) - t.from as f64).max(0.0) * t.usd_month
        })
        .sum()
}

/// One volume's life for billing: created at `start`, deleted at `end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub id: String,
    pub name: Option<String>,
    pub spec: VolumeSpec,
    pub start_unix_ns: u64,
    pub end_unix_ns: Option<u64>,
    /// A continuation after a modification: the 60 s minimum was billed already.
    #[serde(default)]
    pub continued: bool,
}

/// A volume's bill so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeCost {
    pub id: String,
    pub name: Option<String>,
    pub spec: String,
    pub deleted: bool,
    /// Seconds the volume has existed.
    pub seconds: f64,
    /// Seconds billed: whole seconds, rounded up, at least the minimum.
    pub billed_seconds: u64,
    pub usd_month: f64,
    pub usd: f64,
    /// Adjusted GB seconds (reserved MB/s x GiB x s); only volumes with reserved bandwidth.
    pub agbs: Option<f64>,
    /// false when the type has no list price (billed $0).
    pub priced: bool,
}

/// Instances running for an application: started at `start`, stopped at `end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeRecord {
    pub id: String,
    pub instance: String,
    pub count: u32,
    pub start_unix_ns: u64,
    pub end_unix_ns: Option<u64>,
}

/// What some instances cost so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeCost {
    pub id: String,
    pub instance: String,
    pub count: u32,
    pub stopped: bool,
    pub seconds: f64,
    pub billed_seconds: u64,
    pub usd_hour: f64,
    pub usd: f64,
}

/// Nanoseconds from `start` to `end` (or to now while it runs).
fn lifetime_ns(start: u64, end: Option<u64>, now: u64) -> u64 {
    end.unwrap_or(now).max(start) - start
}

/// Bill one compute record at `now_unix_ns` (per second, 60 s minimum).
pub fn bill_compute(prices: &PriceTable, r: &ComputeRecord, now_unix_ns: u64) -> ComputeCost {
    let ns = lifetime_ns(r.start_unix_ns, r.end_unix_ns, now_unix_ns);
    let billed_seconds = prices.billed_seconds(ns, prices.minimum_seconds);
    let usd_hour = prices.instance_usd_hour(&r.instance, r.count).unwrap_or(0.0);
    ComputeCost {
        id: r.id.clone(),
        instance: r.instance.clone(),
        count: r.count,
        stopped: r.end_unix_ns.is_some(),
        seconds: ns as f64 / 1e9,
        billed_seconds,
        usd_hour,
        usd: usd_hour * billed_seconds as f64 / 3_600.0,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostReport {
    pub at_unix_ms: u64,
    pub volumes: Vec<VolumeCost>,
    /// Instances priced with the storage (none unless someone starts them).
    #[serde(default)]
    pub compute: Vec<ComputeCost>,
    /// Volumes only.
    #[serde(default)]
    pub storage_usd: f64,
    #[serde(default)]
    pub compute_usd: f64,
    /// S3 requests and transfer recorded with [`CostMeter::add_s3`].
    #[serde(default)]
    pub s3: S3Usage,
    #[serde(default)]
    pub s3_usd: f64,
    /// Storage + compute + S3.
    pub total_usd: f64,
    pub total_agbs: f64,
    pub price_source: String,
    pub price_date: String,
}

/// Bill one record at `now_unix_ns`.
pub fn bill(prices: &PriceTable, r: &UsageRecord, now_unix_ns: u64) -> VolumeCost {
    let ns = lifetime_ns(r.start_unix_ns, r.end_unix_ns, now_unix_ns);
    let min = if r.continued { 0 } else { prices.minimum_seconds };
    let billed_seconds = prices.billed_seconds(ns, min);
    let usd_month = prices.usd_month(&r.spec);
    let seconds = ns as f64 / 1e9;
    let agbs = r.spec.model.reserved_bw().map(|bw| bw as f64 / 1e6 * (r.spec.size as f64 / GIB as f64) * seconds);
    VolumeCost {
        id: r.id.clone(),
        name: r.name.clone(),
        spec: r.spec.to_string(),
        deleted: r.end_unix_ns.is_some(),
        seconds,
        billed_seconds,
        usd_month,
        usd: usd_month * billed_seconds as f64 / prices.seconds_per_month as f64,
        agbs,
        priced: prices.price(&r.spec.model).listed,
    }
}

/// Bill every record at `now_unix_ns`.
pub fn report(prices: &PriceTable, records: &[UsageRecord], now_unix_ns: u64) -> CostReport {
    report_with_compute(prices, records, &[], now_unix_ns)
}

/// Bill every volume and compute record at `now_unix_ns`.
pub fn report_with_compute(prices: &PriceTable, records: &[UsageRecord], compute: &[ComputeRecord], now_unix_ns: u64) -> CostReport {
    let volumes: Vec<VolumeCost> = records.iter().map(|r| bill(prices, r, now_unix_ns)).collect();
    let compute: Vec<ComputeCost> = compute.iter().map(|r| bill_compute(prices, r, now_unix_ns)).collect();
    let storage_usd: f64 = volumes.iter().map(|v| v.usd).fold(0.0, |a, b| a + b);
    let compute_usd: f64 = compute.iter().map(|c| c.usd).fold(0.0, |a, b| a + b);
    CostReport {
        at_unix_ms: now_unix_ns / 1_000_000,
        storage_usd,
        compute_usd,
        s3: S3Usage::default(),
        s3_usd: 0.0,
        total_usd: storage_usd + compute_usd,
        total_agbs: volumes.iter().filter_map(|v| v.agbs).sum(),
        compute,
        volumes,
        price_source: prices.source.clone(),
        price_date: prices.date.clone(),
    }
}

/// Maps a [`Clock`] to UNIX time: `epoch_unix_ns + clock.now()`.
#[derive(Debug, Clone)]
pub struct WallClock {
    pub clock: Arc<dyn Clock>,
    pub epoch_unix_ns: u64,
}

impl WallClock {
    /// Anchor `clock` to the system's UNIX time now.
    pub fn anchored(clock: Arc<dyn Clock>) -> Self {
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let epoch_unix_ns = unix.saturating_sub(clock.now().as_nanos() as u64);
        WallClock { clock, epoch_unix_ns }
    }

    pub fn now_unix_ns(&self) -> u64 {
        self.epoch_unix_ns + self.clock.now().as_nanos() as u64
    }
}

/// An in-process meter on a clock, for callers without a provider (the
/// simulator, experiments): start and stop volumes, ask for the bill any time.
pub struct CostMeter {
    prices: PriceTable,
    wall: WallClock,
    records: Mutex<Vec<UsageRecord>>,
    compute: Mutex<Vec<ComputeRecord>>,
    s3: Mutex<S3Usage>,
}

impl CostMeter {
    pub fn new(prices: PriceTable, wall: WallClock) -> Self {
        CostMeter { prices, wall, records: Mutex::new(Vec::new()), compute: Mutex::new(Vec::new()), s3: Mutex::default() }
    }

    /// Billing of `count` instances of type `instance` (e.g. `c5.2xlarge`) starts now.
    pub fn start_compute(&self, id: &str, instance: &str, count: u32) -> Result<(), PriceError> {
        self.prices.instance_usd_hour(instance, count)?;
        let now = self.wall.now_unix_ns();
        self.compute.lock().push(ComputeRecord { id: id.into(), instance: instance.into(), count, start_unix_ns: now, end_unix_ns: None });
        Ok(())
    }

    /// Billing of the instances `id` stops now; false if they were not running.
    pub fn stop_compute(&self, id: &str) -> bool {
        let now = self.wall.now_unix_ns();
        let mut recs = self.compute.lock();
        match recs.iter_mut().find(|r| r.id == id && r.end_unix_ns.is_none()) {
            Some(r) => {
                r.end_unix_ns = Some(now);
                true
            }
            None => false,
        }
    }

    pub fn prices(&self) -> &PriceTable {
        &self.prices
    }

    /// Billing of volume `id` starts now.
    pub fn start(&self, id: &str, name: Option<String>, spec: VolumeSpec) {
        let now = self.wall.now_unix_ns();
        self.records.lock().push(UsageRecord { id: id.into(), name, spec, start_unix_ns: now, end_unix_ns: None, continued: false });
    }

    /// Billing of volume `id` stops now; false if it was not running.
    pub fn stop(&self, id: &str) -> bool {
        let now = self.wall.now_unix_ns();
        let mut recs = self.records.lock();
        match recs.iter_mut().find(|r| r.id == id && r.end_unix_ns.is_none()) {
            Some(r) => {
                r.end_unix_ns = Some(now);
                true
            }
            None => false,
        }
    }

    /// Volume `id` is modified to `spec` now: billed at the new spec from now
    /// on (as the local cloud bills a modification, no second 60 s minimum);
    /// false if it was not running.
    pub fn modify(&self, id: &str, spec: VolumeSpec) -> bool {
        let now = self.wall.now_unix_ns();
        let mut recs = self.records.lock();
        let Some(r) = recs.iter_mut().find(|r| r.id == id && r.end_unix_ns.is_none()) else { return false };
        r.end_unix_ns = Some(now);
        let name = r.name.clone();
        recs.push(UsageRecord { id: id.into(), name, spec, start_unix_ns: now, end_unix_ns: None, continued: true });
        true
    }

    /// Adds S3 requests and transfer to the bill.
    pub fn add_s3(&self, u: S3Usage) {
        self.s3.lock().add(u);
    }

    /// $ per hour of the instances running now.
    pub fn compute_usd_hour(&self) -> f64 {
        // fold from 0.0: an empty f64 sum is -0.0, which prints as "-0.000".
        self.compute.lock().iter().filter(|r| r.end_unix_ns.is_none()).map(|r| self.prices.instance_usd_hour(&r.instance, r.count).unwrap_or(0.0)).fold(0.0, |a, b| a + b)
    }

    pub fn report(&self) -> CostReport {
        let mut r = report_with_compute(&self.prices, &self.records.lock(), &self.compute.lock(), self.wall.now_unix_ns());
        r.s3 = *self.s3.lock();
        r.s3_usd = self.prices.s3_usd(&r.s3);
        r.total_usd += r.s3_usd;
        r
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_priced_instance_has_its_ebs_limits() {
        let p = PriceTable::default();
        for name in p.instances.keys() {
            let e = p.instance_ebs(name).unwrap_or_else(|e| panic!("{e}"));
            assert!(e.baseline_mbps <= e.max_mbps && e.baseline_iops <= e.max_iops, "{name}: {e:?}");
        }
        // The priced scenarios' instances: 1,000 MiB/s and 40,000 IOPS fit.
        assert!(p.instance_ebs("c5.9xlarge").unwrap().sustained().1 >= 1_000.0 * 1_048_576.0);
        assert_eq!(p.instance_ebs("r5.12xlarge").unwrap().sustained().0, 40_000.0);
        assert!(p.instance_ebs("t9.nano").unwrap_err().to_string().contains("known"));
    }
    use super::*;
    use std::time::Duration;
    use surge_block::VirtualClock;

    fn spec(s: &str) -> VolumeSpec {
        s.parse().unwrap()
    }

    fn meter() -> (Arc<VirtualClock>, CostMeter) {
        let clock = Arc::new(VirtualClock::new());
        let m = CostMeter::new(PriceTable::default(), WallClock { clock: clock.clone(), epoch_unix_ns: 0 });
        (clock, m)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn a_modified_volume_is_billed_at_each_spec_for_its_own_seconds() {
        let (clock, m) = meter();
        m.start("a", None, spec("gp3:100GiB"));
        clock.advance(Duration::from_secs(100));
        assert!(m.modify("a", spec("gp3:100GiB,iops=16000")));
        assert!(!m.modify("b", spec("gp3:100GiB")), "no such volume");
        clock.advance(Duration::from_secs(30));
        let r = m.report();
        assert_eq!(r.volumes.iter().map(|v| v.billed_seconds).collect::<Vec<_>>(), vec![100, 30], "no second minimum after a modification");
        let p = PriceTable::default();
        let want = (p.usd_month(&spec("gp3:100GiB")) * 100.0 + p.usd_month(&spec("gp3:100GiB,iops=16000")) * 30.0) / p.seconds_per_month as f64;
        assert!(close(r.storage_usd, want), "{} vs {want}", r.storage_usd);
    }

    #[test]
    fn per_second_billing_with_60_s_minimum() {
        let (clock, m) = meter();
        m.start("a", None, spec("gp2:100GiB"));
        clock.advance(Duration::from_secs(10));
        // 10 s exist, 60 s billed: 100 GiB x $0.10 x 60 / 2,592,000.
        let r = m.report();
        assert_eq!(r.volumes[0].billed_seconds, 60);
        assert!(close(r.total_usd, 10.0 * 60.0 / 2_592_000.0), "{}", r.total_usd);
        clock.advance(Duration::from_millis(3_600_500 - 10_000));
        // 3,600.5 s: billed 3,601 whole seconds.
        let r = m.report();
        assert_eq!(r.volumes[0].billed_seconds, 3_601);
        assert!(close(r.total_usd, 10.0 * 3_601.0 / 2_592_000.0));
        assert!(m.stop("a"));
        clock.advance(Duration::from_secs(1_000));
        assert_eq!(m.report().volumes[0].billed_seconds, 3_601, "deleted volumes stop accruing");
        assert!(m.report().volumes[0].deleted);
    }

    #[test]
    fn a_full_month_costs_the_list_price() {
        let (clock, m) = meter();
        for (i, s) in ["gp2:100GiB", "gp3:100GiB,iops=4000,throughput=250MiB/s", "io1:100GiB,iops=5000", "io2:1000GiB,iops=70000", "st1:500GiB", "sc1:500GiB"].iter().enumerate() {
            m.start(&i.to_string(), None, spec(s));
        }
        clock.advance(Duration::from_secs(30 * 86_400));
        let r = m.report();
        let usd: Vec<f64> = r.volumes.iter().map(|v| v.usd).collect();
        let want = [
            10.0,
            8.0 + 1_000.0 * 0.005 + 125.0 * 0.04,
            12.5 + 5_000.0 * 0.065,
            125.0 + 32_000.0 * 0.065 + 32_000.0 * 0.0455 + 6_000.0 * 0.032,
            500.0 * 0.045,
            500.0 * 0.015,
        ];
        for (got, want) in usd.iter().zip(want) {
            assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
        }
        assert!((r.total_usd - want.iter().sum::<f64>()).abs() < 1e-9);
    }

    #[test]
    fn agbs_of_the_paper_backing_and_cache() {
        let (clock, m) = meter();
        // Backing: 10 GB at 33 MB/s for the whole run; cache: 10 GB at 128 MB/s for 100 s.
        m.start("backing", None, spec("reserved:10GiB,bw=33MB/s"));
        clock.advance(Duration::from_secs(50));
        m.start("cache", None, spec("reserved:10GiB,bw=128MB/s"));
        clock.advance(Duration::from_secs(100));
        m.stop("cache");
        clock.advance(Duration::from_secs(50));
        let r = m.report();
        assert!(close(r.volumes[0].agbs.unwrap(), 33.0 * 10.0 * 200.0));
        assert!(close(r.volumes[1].agbs.unwrap(), 128.0 * 10.0 * 100.0));
        assert!(close(r.total_agbs, 66_000.0 + 128_000.0));
        // A gp2 volume has no reserved bandwidth, hence no AGBs.
        m.start("g", None, spec("gp2:1GiB"));
        assert_eq!(m.report().volumes[2].agbs, None);
    }

    #[test]
    fn agbs_have_no_minimum_but_dollars_do() {
        let (clock, m) = meter();
        m.start("c", None, spec("reserved:2GiB,bw=100MB/s"));
        clock.advance(Duration::from_millis(1_500));
        let v = &m.report().volumes[0];
        assert!(close(v.agbs.unwrap(), 100.0 * 2.0 * 1.5));
        assert_eq!(v.billed_seconds, 60);
        // reserved priced like gp3: 2 GiB x $0.08 + 95.367 MiB/s x $0.04 per month.
        let month = 2.0 * 0.08 + (100e6 / 1_048_576.0) * 0.04;
        assert!(close(v.usd, month * 60.0 / 2_592_000.0));
    }

    #[test]
    fn compute_is_billed_per_second_with_a_minimum() {
        let (clock, m) = meter();
        m.start_compute("app", "c5.2xlarge", 4).unwrap();
        m.start("v", None, spec("gp3:100GiB"));
        clock.advance(Duration::from_secs(30));
        let r = m.report();
        // 4 x $0.34/h, 60 s minimum.
        assert_eq!(r.compute[0].billed_seconds, 60);
        assert!(close(r.compute_usd, 4.0 * 0.34 * 60.0 / 3_600.0));
        clock.advance(Duration::from_millis(3_570_500));
        assert!(m.stop_compute("app"));
        assert!(!m.stop_compute("app"));
        clock.advance(Duration::from_secs(100));
        let r = m.report();
        assert_eq!(r.compute[0].billed_seconds, 3_601, "3,600.5 s rounded up, stopped");
        assert!(close(r.compute_usd, 1.36 * 3_601.0 / 3_600.0));
        assert!(close(r.total_usd, r.storage_usd + r.compute_usd));
        assert!(close(r.storage_usd, 8.0 * 3_700.5f64.ceil() / 2_592_000.0));
        let e = m.start_compute("x", "z9.huge", 1).unwrap_err().to_string();
        assert!(e.contains("z9.huge") && e.contains("c5.2xlarge"), "{e}");
    }

    #[test]
    fn a_time_scale_bills_emulated_seconds_at_full_scale() {
        let clock = Arc::new(VirtualClock::new());
        let prices = PriceTable { time_scale: 0.05, ..PriceTable::default() };
        let m = CostMeter::new(prices, WallClock { clock: clock.clone(), epoch_unix_ns: 0 });
        m.start("c", None, spec("gp2:100GiB"));
        m.start_compute("app", "r5.8xlarge", 1).unwrap();
        // 2 s at scale 1/20 are 40 s: billed the 60 s minimum; 10 s are 200 s.
        clock.advance(Duration::from_secs(2));
        assert_eq!(m.report().volumes[0].billed_seconds, 60);
        clock.advance(Duration::from_secs(8));
        let r = m.report();
        assert_eq!(r.volumes[0].billed_seconds, 200);
        assert!(close(r.compute_usd, 2.016 * 200.0 / 3_600.0));
        assert!((r.volumes[0].seconds - 10.0).abs() < 1e-9, "seconds existed stay emulated");
    }

    #[test]
    fn burst_buffer_nodes_and_s3_requests_at_list_prices() {
        let (clock, m) = meter();
        // Two r5.large I/O nodes (16 GiB, $0.126/h): one for 10 min, one for 30 s (billed 60 s).
        m.start_compute("n1", "r5.large", 1).unwrap();
        m.start_compute("n2", "r5.large", 1).unwrap();
        assert!(close(m.compute_usd_hour(), 0.252));
        clock.advance(Duration::from_secs(30));
        m.stop_compute("n2");
        clock.advance(Duration::from_secs(570));
        assert!(close(m.compute_usd_hour(), 0.126));
        // 20,000 PUTs, 50,000 GETs, 10 GiB within the region (free).
        m.add_s3(S3Usage { puts: 12_000, gets: 50_000, bytes: 10 << 30 });
        m.add_s3(S3Usage { puts: 8_000, gets: 0, bytes: 0 });
        let r = m.report();
        let nodes = 0.126 * 600.0 / 3_600.0 + 0.126 * 60.0 / 3_600.0;
        let s3 = 20.0 * 0.005 + 50.0 * 0.0004;
        assert!(close(r.compute_usd, nodes), "{}", r.compute_usd);
        assert!(close(r.s3_usd, s3), "{}", r.s3_usd);
        assert_eq!(r.s3, S3Usage { puts: 20_000, gets: 50_000, bytes: 10 << 30 });
        assert!(close(r.total_usd, nodes + s3));
        // Priced out of the region, the transfer is not free.
        let t = PriceTable { s3: S3Price { transfer_in_region_gb: 0.09, ..S3Price::default() }, ..PriceTable::default() };
        assert!(close(t.s3_usd(&S3Usage { puts: 0, gets: 0, bytes: 10 << 30 }), 0.9));
    }

    #[test]
    fn traffic_between_instances_is_free_in_a_zone_and_billed_to_both_sides_across_zones() {
        let t = PriceTable::default().ec2_transfer;
        assert_eq!(t.usd(24 << 30, false), 0.0);
        assert!(close(t.usd(24 << 30, true), 24.0 * 0.02));
        let t = PriceTable::from_toml("[ec2_transfer]\ncross_az_gb_each_way = 0.02\n").unwrap().ec2_transfer;
        assert!(close(t.usd(1 << 30, true), 0.04));
        assert_eq!(t.same_az_gb, 0.0, "unspecified keys keep their defaults");
    }

    #[test]
    fn prices_can_be_overridden_from_toml() {
        let t = PriceTable::from_toml("seconds_per_month = 2678400\n[gp2]\ngb_month = 0.12\n").unwrap();
        assert_eq!(t.gp2.gb_month, 0.12);
        assert!(t.gp2.listed, "unspecified keys keep their defaults");
        assert_eq!(t.gp3, PriceTable::default().gp3);
        assert_eq!(t.seconds_per_month, 2_678_400);
        let e = PriceTable::from_toml("[gp2]\ngb_month = \"cheap\"").unwrap_err().to_string();
        assert!(e.contains("gb_month") || e.contains("invalid type"), "{e}");
        assert!(PriceTable::from_toml("seconds_per_month = 0").is_err());
        let t = PriceTable::from_toml("[instances]\n\"x1.tiny\" = 0.01\n").unwrap();
        assert_eq!(t.instance_usd_hour("x1.tiny", 3).unwrap(), 0.03);
        assert_eq!(t.instance_usd_hour("c5.2xlarge", 1).unwrap(), 0.34, "defaults kept");
        assert!(PriceTable::from_toml("time_scale = 0").is_err());
    }
}
