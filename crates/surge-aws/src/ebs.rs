//! surge volume specs <-> EBS CreateVolume/ModifyVolume parameters.
//!
//! Pure functions (no SDK calls), so the mapping is tested on its own: every
//! spec AWS can make maps to parameters and back to the same spec.

use std::time::Duration;
use surge_block::model::{VolumeModel, GIB};
use surge_cloud::VolumeSpec;

const MIB: u64 = 1 << 20;
/// gp3's included performance: a gp3 volume reporting these has no extras.
pub const GP3_BASE_IOPS: u64 = 3000;
pub const GP3_BASE_MIBPS: u64 = 125;

/// What CreateVolume / ModifyVolume take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbsParams {
    /// `gp2`, `gp3`, `io1`, `io2`, `st1`, `sc1`.
    pub volume_type: &'static str,
    pub size_gib: i32,
    pub iops: Option<i32>,
    /// MiB/s (gp3 only).
    pub throughput_mibps: Option<i32>,
}

/// Why a spec cannot become an EBS volume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EbsSpecError {
    #[error("{0} volumes exist only on the local cloud; on AWS use gp2, gp3, io1, io2, st1 or sc1 (e.g. gp3:100GiB,throughput=250MiB/s)")]
    NotOnAws(&'static str),
    #[error("{what} {value} does not fit an EBS parameter")]
    TooLarge { what: &'static str, value: u64 },
    #[error("gp3 throughput is set in whole MiB/s on EBS, got {0} bytes/s")]
    Throughput(u64),
    #[error("lat={0:?} is a setting of the local cloud's model; an EBS volume's latency is what AWS gives")]
    Latency(Duration),
    #[error("EBS reported volume type {0:?}, which surge does not know")]
    UnknownType(String),
    #[error("EBS reported {volume_type} without {what}")]
    Missing { volume_type: String, what: &'static str },
    #[error("EBS reported an invalid volume: {0}")]
    Invalid(String),
}

fn fit(what: &'static str, value: u64) -> Result<i32, EbsSpecError> {
    i32::try_from(value).map_err(|_| EbsSpecError::TooLarge { what, value })
}

/// The CreateVolume parameters of `spec` (sizes are whole GiB: the spec parser checks that).
pub fn params(spec: &VolumeSpec) -> Result<EbsParams, EbsSpecError> {
    if !spec.latency.is_zero() {
        return Err(EbsSpecError::Latency(spec.latency));
    }
    let size_gib = fit("size in GiB", spec.size.div_ceil(GIB))?;
    let (volume_type, iops, tput) = match &spec.model {
        VolumeModel::Gp2 => ("gp2", None, None),
        VolumeModel::Gp3 { iops, throughput } => {
            let tput = match throughput {
                Some(t) if t % MIB != 0 => return Err(EbsSpecError::Throughput(*t)),
                Some(t) => Some(fit("throughput in MiB/s", t / MIB)?),
                None => None,
            };
            ("gp3", iops.map(|i| fit("iops", i)).transpose()?, tput)
        }
        VolumeModel::Io1 { iops } => ("io1", Some(fit("iops", *iops)?), None),
        VolumeModel::Io2 { iops } => ("io2", Some(fit("iops", *iops)?), None),
        VolumeModel::St1 => ("st1", None, None),
        VolumeModel::Sc1 => ("sc1", None, None),
        VolumeModel::Reserved { .. } => return Err(EbsSpecError::NotOnAws("reserved")),
        VolumeModel::AzurePremium => return Err(EbsSpecError::NotOnAws("azure-premium")),
    };
    Ok(EbsParams { volume_type, size_gib, iops, throughput_mibps: tput })
}

/// The spec of a volume as DescribeVolumes reports it.
pub fn spec_of(volume_type: &str, size_gib: i32, iops: Option<i32>, throughput_mibps: Option<i32>) -> Result<VolumeSpec, EbsSpecError> {
    let size = u64::try_from(size_gib).ok().filter(|&s| s > 0).ok_or_else(|| EbsSpecError::Invalid(format!("size {size_gib} GiB")))? * GIB;
    let missing = |what| EbsSpecError::Missing { volume_type: volume_type.to_string(), what };
    let pos = |v: i32, what: &str| u64::try_from(v).map_err(|_| EbsSpecError::Invalid(format!("{what} {v}")));
    let model = match volume_type {
        "gp2" => VolumeModel::Gp2,
        "gp3" => {
            let iops = iops.map(|i| pos(i, "iops")).transpose()?.filter(|&i| i != GP3_BASE_IOPS);
            let tput = throughput_mibps.map(|t| pos(t, "throughput")).transpose()?.filter(|&t| t != GP3_BASE_MIBPS);
            VolumeModel::Gp3 { iops, throughput: tput.map(|t| t * MIB) }
        }
        "io1" => VolumeModel::Io1 { iops: pos(iops.ok_or_else(|| missing("iops"))?, "iops")? },
        "io2" => VolumeModel::Io2 { iops: pos(iops.ok_or_else(|| missing("iops"))?, "iops")? },
        "st1" => VolumeModel::St1,
        "sc1" => VolumeModel::Sc1,
        other => return Err(EbsSpecError::UnknownType(other.to_string())),
    };
    Ok(VolumeSpec { model, size, latency: Duration::ZERO })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(s: &str) -> VolumeSpec {
        s.parse().unwrap()
    }

    #[test]
    fn every_ebs_type_maps_with_its_parameters() {
        let p = params(&spec("gp3:100GiB,iops=6000,throughput=500MiB/s")).unwrap();
        assert_eq!(p, EbsParams { volume_type: "gp3", size_gib: 100, iops: Some(6000), throughput_mibps: Some(500) });
        assert_eq!(params(&spec("io2:100GiB,iops=20000")).unwrap().iops, Some(20000));
        assert_eq!(params(&spec("io1:100GiB,iops=5000")).unwrap().volume_type, "io1");
        assert_eq!(params(&spec("st1:125GiB")).unwrap().size_gib, 125);
        assert_eq!(params(&spec("sc1:125GiB")).unwrap().volume_type, "sc1");
        assert_eq!(params(&spec("gp2:1GiB")).unwrap(), EbsParams { volume_type: "gp2", size_gib: 1, iops: None, throughput_mibps: None });
    }

    #[test]
    fn local_only_settings_are_refused_with_the_alternative() {
        let e = params(&spec("reserved:10GiB,bw=33MB/s")).unwrap_err().to_string();
        assert!(e.contains("only on the local cloud") && e.contains("gp3"), "{e}");
        assert!(params(&spec("gp2:10GiB,lat=2ms")).unwrap_err().to_string().contains("lat="));
        assert!(params(&spec("gp3:10GiB,throughput=200MB/s")).unwrap_err().to_string().contains("whole MiB/s"));
    }

    #[test]
    fn described_volumes_become_canonical_specs() {
        // gp3 at its included 3000 IOPS / 125 MiB/s reads back without extras.
        assert_eq!(spec_of("gp3", 8, Some(3000), Some(125)).unwrap().to_string(), "gp3:8GiB");
        // gp2 reports its baseline IOPS: not a parameter.
        assert_eq!(spec_of("gp2", 8, Some(100), None).unwrap().to_string(), "gp2:8GiB");
        assert!(spec_of("io1", 8, None, None).unwrap_err().to_string().contains("without iops"));
        assert!(spec_of("standard", 8, None, None).unwrap_err().to_string().contains("\"standard\""));
        assert!(spec_of("gp2", 0, None, None).is_err());
    }

    fn aws_specs() -> impl Strategy<Value = String> {
        prop_oneof![
            (1u64..16384).prop_map(|g| format!("gp2:{g}GiB")),
            (1u64..16384, prop::option::of(3000u64..16000), prop::option::of(125u64..1000)).prop_map(|(g, i, t)| {
                let mut s = format!("gp3:{g}GiB");
                if let Some(i) = i {
                    s += &format!(",iops={i}");
                }
                if let Some(t) = t {
                    s += &format!(",throughput={t}MiB/s");
                }
                s
            }),
            (4u64..16384, 100u64..64000).prop_map(|(g, i)| format!("io1:{g}GiB,iops={}", i.min(g * 50))),
            (4u64..16384, 100u64..64000).prop_map(|(g, i)| format!("io2:{g}GiB,iops={}", i.min(g * 500))),
            (125u64..16384).prop_map(|g| format!("st1:{g}GiB")),
            (125u64..16384).prop_map(|g| format!("sc1:{g}GiB")),
        ]
    }

    proptest! {
        #[test]
        fn specs_survive_a_trip_through_ebs_parameters(s in aws_specs()) {
            let Ok(spec) = s.parse::<VolumeSpec>() else { return Ok(()) };
            let p = params(&spec).unwrap();
            // gp3 describes report the included values when none were asked for.
            let (iops, tput) = match p.volume_type {
                "gp3" => (Some(p.iops.unwrap_or(3000)), Some(p.throughput_mibps.unwrap_or(125))),
                _ => (p.iops, p.throughput_mibps),
            };
            let back = spec_of(p.volume_type, p.size_gib, iops, tput).unwrap();
            let canon = |v: &VolumeSpec| match v.model.clone() {
                VolumeModel::Gp3 { iops, throughput } => VolumeModel::Gp3 {
                    iops: iops.filter(|&i| i != 3000),
                    throughput: throughput.filter(|&t| t != 125 * MIB),
                },
                m => m,
            };
            prop_assert_eq!(canon(&back), canon(&spec));
            prop_assert_eq!(back.size, spec.size);
        }
    }
}
