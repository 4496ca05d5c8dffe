//! The configurations a plan tries, sized from what the trace demands.

use serde::Serialize;
use std::time::Duration;
use surge_block::model::{VolumeModel, GIB, MIB, SSD_OP, TIB};
use surge_cloud::VolumeSpec;
use surge_trace::Trace;

/// What a trace asks of a volume.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Demand {
    /// Bytes the volume must hold (the highest byte touched, whole GiB, or more if asked).
    pub capacity: u64,
    /// Operations (I/O up to 256 KiB is one, larger ones are split, as EBS
    /// counts) in the busiest second.
    pub peak_iops: u64,
    /// Bytes in the busiest second.
    pub peak_bps: u64,
    /// The trace has no times (requests as fast as the volume allows): the
    /// peaks are then unbounded and each type is provisioned at its ceiling.
    pub untimed: bool,
}

pub fn demand(t: &Trace, min_capacity: u64) -> Demand {
    let capacity = t.footprint().max(min_capacity).div_ceil(GIB).max(1) * GIB;
    if !t.header.timed {
        return Demand { capacity, peak_iops: u64::MAX, peak_bps: u64::MAX, untimed: true };
    }
    let mut per_s: Vec<(u64, u64)> = Vec::new();
    let t0 = t.records.first().map_or(0, |r| r.t_ns);
    for r in t.records.iter().filter(|r| r.op.moves_data()) {
        let s = ((r.t_ns - t0) / 1_000_000_000) as usize;
        if per_s.len() <= s {
            per_s.resize(s + 1, (0, 0));
        }
        per_s[s].0 += r.len.div_ceil(SSD_OP).max(1);
        per_s[s].1 += r.len;
    }
    Demand {
        capacity,
        peak_iops: per_s.iter().map(|s| s.0).max().unwrap_or(0),
        peak_bps: per_s.iter().map(|s| s.1).max().unwrap_or(0),
        untimed: false,
    }
}

/// One configuration to replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub spec: VolumeSpec,
    /// How it was sized.
    pub sized: String,
}

/// A kind of configuration the engine cannot run yet, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NotSimulated {
    pub name: &'static str,
    pub why: &'static str,
}

/// Listed in every plan: candidates issue 42 asks for that the engine does
/// not run yet.
pub const NOT_SIMULATED: &[NotSimulated] = &[
    NotSimulated { name: "elastic cache with cache=reserved volumes, or with target=DURATION", why: "the plan runs cache=auto valuing an hour at the instance's price (plus --value-per-hour); other cache settings are not tried" },
    NotSimulated { name: "modify-volume to io2 (peaks over gp3's 16,000 IOPS / 1,000 MiB/s)", why: "modify-volume is simulated between gp3 specs only" },
];

/// The elastic-cache candidate's table name over gp3.
pub const ELASTIC_GP3: &str = "elastic cache over gp3";
/// ... and over st1.
pub const ELASTIC_ST1: &str = "elastic cache over st1";
/// ... and over the burstable stripe candidate (its swaps run).
pub const ELASTIC_STRIPE: &str = "elastic cache over a burstable stripe";

/// Share of a trace's reads and writes that must be sequential for an
/// elastic cache over st1 to be tried (st1 charges every request as up to
/// 1 MiB: a random writeback to it is slower than the application).
pub const ST1_SEQUENTIAL: f64 = 0.5;

/// Backings for the elastic cache: gp3 as [`static_candidates`] sizes it at
/// the capacity (its included 3,000 IOPS and 125 MiB/s; the cache takes the
/// bursts), and st1 at the capacity (at least 125 GiB) when the trace is
/// mostly sequential. None for an untimed trace (no bursts to follow).
pub fn elastic_backings(d: &Demand, t: &Trace) -> Vec<(&'static str, VolumeSpec)> {
    if d.untimed {
        return Vec::new();
    }
    let mut v = vec![(ELASTIC_GP3, spec(VolumeModel::Gp3 { iops: None, throughput: None }, d.capacity))];
    if surge_trace::summary::summarize(t).sequential_fraction >= ST1_SEQUENTIAL {
        v.push((ELASTIC_ST1, spec(VolumeModel::St1, d.capacity.max(125 * GIB))));
    }
    v
}

fn spec(model: VolumeModel, size: u64) -> VolumeSpec {
    VolumeSpec { model, size, latency: Duration::ZERO }
}

fn clamp(v: u64, lo: u64, hi: u64) -> u64 {
    v.clamp(lo, hi)
}

/// The static volume types, sized for `d`: each at the capacity, and where
/// the capacity alone would not serve the peak, sized (or provisioned) for it.
pub fn static_candidates(d: &Demand) -> Vec<Candidate> {
    let cap = d.capacity;
    let mut v = Vec::new();
    let mut add = |name: &str, model: VolumeModel, size: u64, sized: String| {
        let s = spec(model, size);
        if s.shape().is_ok() && !v.iter().any(|c: &Candidate| c.spec == s) {
            v.push(Candidate { name: name.to_string(), spec: s, sized });
        }
    };
    let peak_mib = d.peak_bps.div_ceil(MIB);

    // gp2: 3 IOPS/GiB baseline (burst to 3,000 on credits).
    let gp2_cap = cap.max(GIB);
    add("gp2", VolumeModel::Gp2, gp2_cap, "capacity".into());
    let gp2_iops = clamp(d.peak_iops.div_ceil(3), 1, 16 * TIB / GIB) * GIB;
    if gp2_iops > gp2_cap {
        add("gp2 (sized for IOPS)", VolumeModel::Gp2, gp2_iops.min(16 * TIB), "3 IOPS/GiB baseline covers the peak second".into());
    }

    // gp3: the included 3,000 IOPS / 125 MiB/s, and provisioned for the peak.
    add("gp3", VolumeModel::Gp3 { iops: None, throughput: None }, cap, "capacity, 3,000 IOPS and 125 MiB/s included".into());
    let mibs = clamp(peak_mib, 125, 1_000);
    let iops = clamp(d.peak_iops, 3_000, 16_000).max(mibs * 4);
    let iops = iops.min(16_000);
    let size = cap.max(iops.div_ceil(500) * GIB);
    if iops > 3_000 || mibs > 125 {
        let throughput = (mibs > 125).then_some(mibs.min(iops / 4) * MIB);
        add("gp3 (provisioned)", VolumeModel::Gp3 { iops: (iops > 3_000).then_some(iops), throughput }, size, format!("IOPS and MiB/s of the peak second ({} IOPS, {} MiB/s)", iops, throughput.map_or(125, |t| t / MIB)));
    }

    // io2: provisioned IOPS for the peak (at most 1,000 IOPS/GiB).
    let io2_iops = clamp(d.peak_iops, 100, 64_000);
    add("io2", VolumeModel::Io2 { iops: io2_iops }, cap.max(4 * GIB).max(io2_iops.div_ceil(1_000) * GIB), format!("{io2_iops} IOPS: the peak second (up to 64,000)"));

    // st1: throughput per TiB; at least 125 GiB.
    let st1_cap = cap.max(125 * GIB);
    add("st1", VolumeModel::St1, st1_cap, "capacity (at least 125 GiB)".into());
    let st1_bw = peak_mib.div_ceil(40).min(16) * TIB;
    if st1_bw > st1_cap && !d.untimed {
        add("st1 (sized for MiB/s)", VolumeModel::St1, st1_bw, "40 MiB/s per TiB baseline covers the peak second".into());
    }
    add("sc1", VolumeModel::Sc1, st1_cap, "capacity (at least 125 GiB)".into());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_is_a_valid_volume_and_provisioning_follows_demand() {
        for (iops, bps) in [(10, 1 << 20), (20_000, 80 << 20), (2_000, 900 << 20), (u64::MAX, u64::MAX)] {
            let d = Demand { capacity: 50 * GIB, peak_iops: iops, peak_bps: bps, untimed: iops == u64::MAX };
            let c = static_candidates(&d);
            assert!(c.iter().all(|c| c.spec.shape().is_ok()));
            assert!(c.iter().all(|c| c.spec.size >= d.capacity));
            let io2 = c.iter().find(|c| c.name == "io2").unwrap();
            assert_eq!(io2.spec.model, VolumeModel::Io2 { iops: iops.clamp(100, 64_000) });
        }
        let d = Demand { capacity: 50 * GIB, peak_iops: 10_000, peak_bps: 400 << 20, untimed: false };
        let c = static_candidates(&d);
        let gp3 = c.iter().find(|c| c.name == "gp3 (provisioned)").unwrap();
        assert_eq!(gp3.spec.model, VolumeModel::Gp3 { iops: Some(10_000), throughput: Some(400 * MIB) });
    }
}
