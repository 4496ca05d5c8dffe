//! Cloud volume types and the [`Shape`] each one has, from the providers'
//! published figures.
//!
//! Sources (figures as published, read 2025; AWS units are binary: GiB, MiB/s):
//! - AWS EBS volume types:
//!   <https://docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html>
//! - gp2: <https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp2-performance>
//!   (3 IOPS/GiB, min 100, max 16,000; 3,000 IOPS burst under 1 TiB; 5.4 M credits,
//!   full at creation, earned at the baseline rate; 128 MiB/s up to 170 GiB,
//!   250 MiB/s for 171-333 GiB while credits last, 250 MiB/s from 334 GiB;
//!   throughput = IOPS x I/O size, I/O counted up to 256 KiB)
//! - gp3: same page, gp3 section (3,000 IOPS and 125 MiB/s included; up to 16,000
//!   IOPS at 500 IOPS/GiB and 1,000 MiB/s at 0.25 MiB/s per IOPS). AWS raised
//!   the gp3 ceilings in 2025; we keep the 16,000 / 1,000 the paper era used.
//! - io1/io2: <https://docs.aws.amazon.com/ebs/latest/userguide/provisioned-iops.html>
//!   (io1: 100-64,000 IOPS, 50 IOPS/GiB, 256 KiB/IOPS up to 500 MiB/s below
//!   32,000 IOPS, 16 KiB/IOPS above, max 1,000 MiB/s; io2 Block Express: up to
//!   256,000 IOPS, 1,000 IOPS/GiB, 0.256 MiB/s per IOPS up to 4,000 MiB/s)
//! - EBS SSD I/O accounting: <https://docs.aws.amazon.com/ebs/latest/userguide/ebs-io-characteristics.html>
//!   (SSD I/O up to 256 KiB is one operation, larger I/O is split; HDD I/O up to
//!   1 MiB counts as 1 MiB; physically sequential small I/Os are merged up to
//!   the maximum I/O size, 256 KiB on SSD, 1 MiB on HDD: "8 contiguous I/O
//!   operations at 32 KiB each count as 1 operation", 8 random ones as 8).
//!   Modelled for every EBS type (`Shape::merge_sequential`). The burstable
//!   paper's lvmcache figures need it on gp2 too: its 10 gp2 caches delivered
//!   1,047 MiB/s, above the 937.5 MiB/s that 30,000 IOPS of unmerged 32 KiB
//!   chunks allow, and its single 100 GiB gp2 cache 56 MiB/s, which at the
//!   300 IOPS baseline is ~190 KiB per operation (unmerged: 9.4 MiB/s).
//! - st1/sc1: <https://docs.aws.amazon.com/ebs/latest/userguide/hdd-vols.html>
//!   (st1: 40 MiB/s per TiB baseline, 250 MiB/s per TiB burst, both capped at
//!   500 MiB/s, 500 IOPS, bucket of 1 TiB of credits per TiB; sc1: 12 and 80
//!   MiB/s per TiB, capped at 250 MiB/s, 250 IOPS; 125 GiB - 16 TiB)
//! - Azure premium SSD credit bursting (P1-P20):
//!   <https://learn.microsoft.com/en-us/azure/virtual-machines/disk-bursting> and
//!   <https://learn.microsoft.com/en-us/azure/virtual-machines/disks-scalability-targets>
//!   (burst to 3,500 IOPS / 170 MB/s for 30 minutes from a full bucket)

use super::sched::{Credits, Shape};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;
pub const MB: u64 = 1_000_000;

/// A volume type and its own parameters (the size is passed separately).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum VolumeModel {
    /// A hypervisor-throttled disk with reserved bandwidth (bytes/s) and/or IOPS,
    /// as in the elastic-cache paper (33 MB/s "slow", 128 MB/s "fast").
    Reserved { bw: Option<u64>, iops: Option<u64> },
    Gp2,
    /// Provisioned IOPS and throughput (bytes/s); `None` = the included 3,000 / 125 MiB/s.
    Gp3 { iops: Option<u64>, throughput: Option<u64> },
    Io1 { iops: u64 },
    Io2 { iops: u64 },
    St1,
    Sc1,
    /// Azure premium SSD; the tier (P1-P50) follows from the size.
    AzurePremium,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("{kind} volume size must be between {min} and {max}, got {got}")]
    Size { kind: &'static str, min: String, max: String, got: String },
    #[error("{kind}: {what}")]
    Param { kind: &'static str, what: String },
}

fn human(bytes: u64) -> String {
    if bytes % TIB == 0 {
        format!("{} TiB", bytes / TIB)
    } else if bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn check_size(kind: &'static str, size: u64, min: u64, max: u64) -> Result<(), ModelError> {
    if size < min || size > max {
        return Err(ModelError::Size { kind, min: human(min), max: human(max), got: human(size) });
    }
    Ok(())
}

fn param(kind: &'static str, what: String) -> ModelError {
    ModelError::Param { kind, what }
}

/// gp2/io credits: an EBS I/O credit bucket holds 5.4 M credits (gp2 page).
pub const GP2_CREDITS: u64 = 5_400_000;
pub const GP2_BURST_IOPS: u64 = 3_000;
/// EBS SSD operation size: I/O up to 256 KiB is one operation.
pub const SSD_OP: u64 = 256 * KIB;

impl VolumeModel {
    pub fn kind(&self) -> &'static str {
        match self {
            VolumeModel::Reserved { .. } => "reserved",
            VolumeModel::Gp2 => "gp2",
            VolumeModel::Gp3 { .. } => "gp3",
            VolumeModel::Io1 { .. } => "io1",
            VolumeModel::Io2 { .. } => "io2",
            VolumeModel::St1 => "st1",
            VolumeModel::Sc1 => "sc1",
            VolumeModel::AzurePremium => "azure-premium",
        }
    }

    /// Reserved bandwidth in bytes/s: what the paper's AGBs metric charges for.
    pub fn reserved_bw(&self) -> Option<u64> {
        match self {
            VolumeModel::Reserved { bw, .. } => *bw,
            _ => None,
        }
    }

    /// Provider-side limits that AWS enforces as ratios (IOPS per GiB): we only
    /// warn about these, so an emulated volume can be over-provisioned on purpose
    /// (e.g. `io1:100GiB,iops=30000`, beyond io1's 50 IOPS/GiB).
    pub fn ratio_warnings(&self, size: u64) -> Vec<String> {
        let gib = size.div_ceil(GIB).max(1);
        let mut w = Vec::new();
        let mut ratio = |kind: &str, iops: u64, per_gib: u64| {
            if iops > per_gib * gib {
                w.push(format!(
                    "{kind}: {iops} IOPS on {gib} GiB exceeds AWS's {per_gib} IOPS/GiB (needs {} GiB); emulating it anyway",
                    iops.div_ceil(per_gib)
                ));
            }
        };
        match self {
            VolumeModel::Gp3 { iops: Some(i), .. } if *i > 3_000 => ratio("gp3", *i, 500),
            VolumeModel::Io1 { iops } => ratio("io1", *iops, 50),
            VolumeModel::Io2 { iops } => ratio("io2", *iops, 1_000),
            _ => {}
        }
        w
    }

    /// The service shape of a volume of `size` bytes of this type.
    pub fn shape(&self, size: u64) -> Result<Shape, ModelError> {
        let gib = size.div_ceil(GIB);
        match *self {
            VolumeModel::Reserved { bw, iops } => {
                if bw == Some(0) || iops == Some(0) {
                    return Err(param("reserved", "bw and iops must be positive".into()));
                }
                Ok(Shape { iops, bps: bw, ..Shape::default() })
            }
            VolumeModel::Gp2 => {
                check_size("gp2", size, GIB, 16 * TIB)?;
                let baseline = (3 * gib).clamp(100, 16_000);
                // 128 MiB/s up to 170 GiB, else 250. AWS adds "171-333 GiB: 250
                // MiB/s while credits last"; without credits the bucket holds the
                // volume to baseline IOPS x 256 KiB (< 250 MiB/s below 334 GiB),
                // which is that rule, so no separate ceiling is needed.
                let bps = if gib <= 170 { 128 * MIB } else { 250 * MIB };
                let (iops, op_credits) = if baseline < GP2_BURST_IOPS {
                    let c = Credits { capacity: GP2_CREDITS, baseline, initial: GP2_CREDITS };
                    (GP2_BURST_IOPS, Some(c))
                } else {
                    (baseline, None)
                };
                Ok(Shape {
                    iops: Some(iops),
                    bps: Some(bps),
                    op_size: Some(SSD_OP),
                    op_credits,
                    merge_sequential: true,
                    ..Shape::default()
                })
            }
            VolumeModel::Gp3 { iops, throughput } => {
                check_size("gp3", size, GIB, 16 * TIB)?;
                let iops = iops.unwrap_or(3_000);
                let bps = throughput.unwrap_or(125 * MIB);
                if !(3_000..=16_000).contains(&iops) {
                    return Err(param("gp3", format!("iops must be 3000-16000, got {iops}")));
                }
                if !(125 * MIB..=1_000 * MIB).contains(&bps) {
                    return Err(param("gp3", format!("throughput must be 125-1000 MiB/s, got {} bytes/s", bps)));
                }
                // At most 0.25 MiB/s per provisioned IOPS.
                if bps > 125 * MIB && bps * 4 > iops * MIB {
                    return Err(param("gp3", format!("throughput {} MiB/s needs at least {} IOPS (0.25 MiB/s per IOPS)", bps / MIB, (bps * 4).div_ceil(MIB))));
                }
                Ok(Shape { iops: Some(iops), bps: Some(bps), op_size: Some(SSD_OP), merge_sequential: true, ..Shape::default() })
            }
            VolumeModel::Io1 { iops } => {
                check_size("io1", size, 4 * GIB, 16 * TIB)?;
                if !(100..=64_000).contains(&iops) {
                    return Err(param("io1", format!("iops must be 100-64000, got {iops}")));
                }
                let bps = if iops <= 32_000 { (iops * SSD_OP).min(500 * MIB) } else { (iops * 16 * KIB).min(1_000 * MIB) };
                Ok(Shape { iops: Some(iops), bps: Some(bps), op_size: Some(SSD_OP), merge_sequential: true, ..Shape::default() })
            }
            VolumeModel::Io2 { iops } => {
                check_size("io2", size, 4 * GIB, 64 * TIB)?;
                if !(100..=256_000).contains(&iops) {
                    return Err(param("io2", format!("iops must be 100-256000, got {iops}")));
                }
                // 0.256 MiB/s per IOPS = 256/1000 MiB/s, up to 4,000 MiB/s.
                let bps = (iops * 256 * MIB / 1_000).min(4_000 * MIB);
                Ok(Shape { iops: Some(iops), bps: Some(bps), op_size: Some(SSD_OP), merge_sequential: true, ..Shape::default() })
            }
            VolumeModel::St1 => hdd("st1", size, 40, 250, 500, 500),
            VolumeModel::Sc1 => hdd("sc1", size, 12, 80, 250, 250),
            VolumeModel::AzurePremium => azure_premium(size),
        }
    }
}

/// st1/sc1: MiB/s per TiB baseline and burst, both capped; a throughput-credit
/// bucket of 1 TiB per TiB of size, refilling at the baseline; 1 MiB I/O units.
fn hdd(kind: &'static str, size: u64, base_per_tib: u64, burst_per_tib: u64, max_mibs: u64, iops: u64) -> Result<Shape, ModelError> {
    check_size(kind, size, 125 * GIB, 16 * TIB)?;
    let per_tib = |mibs: u64| ((mibs * MIB) as u128 * size as u128 / TIB as u128) as u64;
    let baseline = per_tib(base_per_tib).min(max_mibs * MIB);
    let burst = per_tib(burst_per_tib).min(max_mibs * MIB);
    let byte_credits = (burst > baseline).then_some(Credits { capacity: size, baseline, initial: size });
    Ok(Shape {
        iops: Some(iops),
        bps: Some(if byte_credits.is_some() { burst } else { baseline }),
        op_size: Some(MIB),
        byte_unit: MIB,
        byte_credits,
        merge_sequential: true,
        ..Shape::default()
    })
}

/// Azure premium SSD tiers: (max size GiB, IOPS, MB/s); P1-P20 credit-burst to
/// 3,500 IOPS / 170 MB/s for 30 minutes (bucket = (burst - baseline) x 1,800 s).
const AZURE_PREMIUM: [(&str, u64, u64, u64); 11] = [
    ("P1", 4, 120, 25),
    ("P2", 8, 120, 25),
    ("P3", 16, 120, 25),
    ("P4", 32, 120, 25),
    ("P6", 64, 240, 50),
    ("P10", 128, 500, 100),
    ("P15", 256, 1_100, 125),
    ("P20", 512, 2_300, 150),
    ("P30", 1_024, 5_000, 200),
    ("P40", 2_048, 7_500, 250),
    ("P50", 4_096, 7_500, 250),
];

/// The Azure premium tier a size falls in (Azure bills and serves the tier).
pub fn azure_tier(size: u64) -> Option<(&'static str, u64, u64, u64)> {
    let gib = size.div_ceil(GIB);
    AZURE_PREMIUM.iter().copied().find(|t| gib <= t.1)
}

fn azure_premium(size: u64) -> Result<Shape, ModelError> {
    check_size("azure-premium", size, 1, 4 * TIB)?;
    let (name, _, iops, mbs) = azure_tier(size).expect("size checked");
    let bursts = matches!(name, "P1" | "P2" | "P3" | "P4" | "P6" | "P10" | "P15" | "P20");
    if !bursts {
        return Ok(Shape { iops: Some(iops), bps: Some(mbs * MB), ..Shape::default() });
    }
    const BURST_S: u64 = 30 * 60;
    let (biops, bbps) = (3_500, 170 * MB);
    Ok(Shape {
        iops: Some(biops),
        bps: Some(bbps),
        op_size: Some(SSD_OP),
        op_credits: Some(Credits { capacity: (biops - iops) * BURST_S, baseline: iops, initial: (biops - iops) * BURST_S }),
        byte_credits: Some(Credits {
            capacity: (bbps - mbs * MB) * BURST_S,
            baseline: mbs * MB,
            initial: (bbps - mbs * MB) * BURST_S,
        }),
        ..Shape::default()
    })
}

/// Base latency for a shape; kept separate so every type can take `lat=`.
pub fn with_latency(mut s: Shape, latency: Duration) -> Shape {
    s.latency = latency;
    s
}
