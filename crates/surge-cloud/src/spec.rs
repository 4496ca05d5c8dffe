//! `TYPE:SIZE[,key=value...]`: the one-line description of a cloud volume, as
//! used by `surge cloud create` and `surge serve --export NAME=TYPE:SIZE,...`.
//!
//! | type | keys |
//! |---|---|
//! | `reserved` | `bw=RATE` and/or `iops=N` (one required), `lat=DURATION` |
//! | `gp2`, `st1`, `sc1`, `azure-premium` | `lat=` |
//! | `gp3` | `iops=N` (3000-16000), `throughput=RATE` (125-1000 MiB/s), `lat=` |
//! | `io1`, `io2` | `iops=N` (required), `lat=` |
//!
//! Sizes: `100GiB`, `2TiB`, `512MiB`, `100G` (= GiB), `10GB` (10^9). Rates:
//! `33MB/s` (10^6), `128MiB/s`. Durations: `2ms`, `500us`, `1s`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use surge_block::model::{with_latency, ModelError, Shape, VolumeModel, GIB};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("volume spec {0:?} must look like TYPE:SIZE[,key=value...] (e.g. gp2:100GiB, reserved:10GiB,bw=33MB/s, io1:100GiB,iops=30000, st1:2TiB)")]
    Shape(String),
    #[error("unknown volume type {0:?}; known types: reserved, gp2, gp3, io1, io2, st1, sc1, azure-premium")]
    UnknownType(String),
    #[error("invalid size {input:?}: {why} (examples: 100GiB, 2TiB, 512MiB)")]
    Size { input: String, why: String },
    #[error("{kind}: invalid value for {key}: {input:?}: {why}")]
    Value { kind: &'static str, key: String, input: String, why: String },
    #[error("{kind}: unknown option {key:?}; accepted: {accepted}")]
    UnknownKey { kind: &'static str, key: String, accepted: &'static str },
    #[error("{kind}: {msg}")]
    Invalid { kind: &'static str, msg: String },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A cloud volume: type with its parameters, size in bytes, base latency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpec {
    pub model: VolumeModel,
    pub size: u64,
    #[serde(default, with = "latency_us")]
    pub latency: Duration,
}

mod latency_us {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_micros() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_micros(u64::deserialize(d)?))
    }
}

impl VolumeSpec {
    pub fn kind(&self) -> &'static str {
        self.model.kind()
    }

    /// The service shape of this volume (errors if the provider would refuse it).
    pub fn shape(&self) -> Result<Shape, ModelError> {
        Ok(with_latency(self.model.shape(self.size)?, self.latency))
    }

    /// Limits AWS enforces that the emulation lets pass (IOPS/GiB ratios).
    pub fn warnings(&self) -> Vec<String> {
        self.model.ratio_warnings(self.size)
    }
}

pub use surge_block::units::{parse_duration, parse_rate, parse_size};

fn parse_count(s: &str) -> Result<u64, String> {
    s.trim().replace('_', "").parse::<u64>().map_err(|_| "expected a whole number".into())
}

/// Whether `t` names a volume type (as the TYPE of a spec).
pub fn is_volume_type(t: &str) -> bool {
    kind_name(t).is_ok()
}

fn kind_name(t: &str) -> Result<&'static str, SpecError> {
    Ok(match t.to_ascii_lowercase().as_str() {
        "reserved" => "reserved",
        "gp2" => "gp2",
        "gp3" => "gp3",
        "io1" => "io1",
        "io2" => "io2",
        "st1" => "st1",
        "sc1" => "sc1",
        "azure-premium" | "premium" | "azure" => "azure-premium",
        _ => return Err(SpecError::UnknownType(t.to_string())),
    })
}

impl FromStr for VolumeSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (t, rest) = s.trim().split_once(':').ok_or_else(|| SpecError::Shape(s.to_string()))?;
        let kind = kind_name(t.trim())?;
        let mut parts = rest.split(',');
        let size_s = parts.next().unwrap_or("").trim();
        if size_s.is_empty() {
            return Err(SpecError::Shape(s.to_string()));
        }
        let size = parse_size(size_s).map_err(|why| SpecError::Size { input: size_s.to_string(), why })?;
        if size == 0 {
            return Err(SpecError::Size { input: size_s.to_string(), why: "a volume needs a positive size".into() });
        }
        let accepted = match kind {
            "reserved" => "bw, iops, lat",
            "gp3" => "iops, throughput, lat",
            "io1" | "io2" => "iops, lat",
            _ => "lat",
        };
        let (mut bw, mut iops, mut tput, mut lat) = (None, None, None, Duration::ZERO);
        for p in parts {
            let p = p.trim();
            if p.is_empty() {
                continue;
            }
            let (k, v) = p.split_once('=').ok_or_else(|| SpecError::Invalid { kind, msg: format!("option {p:?} must be key=value") })?;
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            let bad = |why: String| SpecError::Value { kind, key: k.clone(), input: v.to_string(), why };
            if !accepted.split(", ").any(|a| a == k) && !(kind == "gp3" && k == "tp") {
                return Err(SpecError::UnknownKey { kind, key: k, accepted });
            }
            match k.as_str() {
                "bw" => bw = Some(parse_rate(v).map_err(bad)?),
                "iops" => iops = Some(parse_count(v).map_err(bad)?),
                "throughput" | "tp" => tput = Some(parse_rate(v).map_err(bad)?),
                "lat" => lat = parse_duration(v).map_err(bad)?,
                _ => unreachable!("checked against accepted keys"),
            }
        }
        let whole_gib = || {
            if size % GIB != 0 {
                Err(SpecError::Size { input: size_s.to_string(), why: format!("{kind} volumes come in whole GiB") })
            } else {
                Ok(())
            }
        };
        let model = match kind {
            "reserved" => {
                if bw.is_none() && iops.is_none() {
                    return Err(SpecError::Invalid { kind, msg: "give bw=RATE and/or iops=N (e.g. reserved:10GiB,bw=33MB/s)".into() });
                }
                VolumeModel::Reserved { bw, iops }
            }
            "gp2" => VolumeModel::Gp2,
            "gp3" => VolumeModel::Gp3 { iops, throughput: tput },
            "io1" | "io2" => {
                let iops = iops.ok_or_else(|| SpecError::Invalid { kind, msg: format!("provisioned IOPS are required, e.g. {kind}:100GiB,iops=5000") })?;
                if kind == "io1" {
                    VolumeModel::Io1 { iops }
                } else {
                    VolumeModel::Io2 { iops }
                }
            }
            "st1" => VolumeModel::St1,
            "sc1" => VolumeModel::Sc1,
            _ => VolumeModel::AzurePremium,
        };
        if kind != "reserved" {
            whole_gib()?;
        }
        let spec = VolumeSpec { model, size, latency: lat };
        spec.shape()?; // reject what the provider would refuse, now
        Ok(spec)
    }
}

fn fmt_size(b: u64) -> String {
    for (u, m) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if b >= m && b % m == 0 {
            return format!("{}{u}", b / m);
        }
    }
    b.to_string()
}

fn fmt_rate(r: u64) -> String {
    if r % (1 << 20) == 0 {
        format!("{}MiB/s", r >> 20)
    } else if r % 1_000_000 == 0 {
        format!("{}MB/s", r / 1_000_000)
    } else {
        format!("{r}/s")
    }
}

/// The canonical form, which parses back to the same spec.
impl fmt::Display for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind(), fmt_size(self.size))?;
        match &self.model {
            VolumeModel::Reserved { bw, iops } => {
                if let Some(b) = bw {
                    write!(f, ",bw={}", fmt_rate(*b))?;
                }
                if let Some(i) = iops {
                    write!(f, ",iops={i}")?;
                }
            }
            VolumeModel::Gp3 { iops, throughput } => {
                if let Some(i) = iops {
                    write!(f, ",iops={i}")?;
                }
                if let Some(t) = throughput {
                    write!(f, ",throughput={}", fmt_rate(*t))?;
                }
            }
            VolumeModel::Io1 { iops } | VolumeModel::Io2 { iops } => write!(f, ",iops={iops}")?,
            _ => {}
        }
        if !self.latency.is_zero() {
            write!(f, ",lat={}us", self.latency.as_micros())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::model::{MB, MIB, TIB};

    fn p(s: &str) -> VolumeSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_documented_examples() {
        assert_eq!(p("gp2:100GiB"), VolumeSpec { model: VolumeModel::Gp2, size: 100 * GIB, latency: Duration::ZERO });
        assert_eq!(p("reserved:10GiB,bw=33MB/s").model, VolumeModel::Reserved { bw: Some(33 * MB), iops: None });
        assert_eq!(p("io1:100GiB,iops=30000").model, VolumeModel::Io1 { iops: 30_000 });
        assert_eq!(p("st1:2TiB").size, 2 * TIB);
        assert_eq!(p("gp3:50G,iops=6000,throughput=250MiB/s").model, VolumeModel::Gp3 { iops: Some(6_000), throughput: Some(250 * MIB) });
        assert_eq!(p("reserved:1GiB,iops=500,lat=2ms").latency, Duration::from_millis(2));
        assert_eq!(p("PREMIUM:128GiB").model, VolumeModel::AzurePremium);
    }

    #[test]
    fn display_round_trips() {
        for s in ["gp2:100GiB", "reserved:10GiB,bw=33MB/s,iops=100,lat=1500us", "gp3:1TiB,iops=4000,throughput=1000MiB/s", "io2:8GiB,iops=8000", "sc1:125GiB"] {
            let v = p(s);
            assert_eq!(v.to_string(), s);
            assert_eq!(p(&v.to_string()), v);
        }
    }

    #[test]
    fn bad_input_gets_a_clear_error() {
        let e = |s: &str| s.parse::<VolumeSpec>().unwrap_err().to_string();
        assert!(e("gp2").contains("TYPE:SIZE"), "{}", e("gp2"));
        assert!(e("gp9:1GiB").contains("unknown volume type \"gp9\""));
        assert!(e("gp2:lots").contains("invalid size \"lots\""));
        assert!(e("gp2:1.5GiB").contains("whole GiB"));
        assert!(e("reserved:1GiB").contains("bw=RATE"));
        assert!(e("reserved:1GiB,bw=33MB").contains("/s"));
        assert!(e("gp2:100GiB,iops=5").contains("unknown option \"iops\"; accepted: lat"));
        assert!(e("io1:100GiB").contains("provisioned IOPS are required"));
        assert!(e("gp2:20TiB").contains("between 1 GiB and 16 TiB"), "{}", e("gp2:20TiB"));
        assert!(e("st1:100GiB").contains("st1 volume size must be between 125 GiB"));
        assert!(e("gp3:100GiB,iops=99999").contains("3000-16000"));
        assert!(e("reserved:1GiB,bw=1MB/s,lat=3h").contains("unknown unit"));
    }

    #[test]
    fn over_ratio_io1_warns_but_parses() {
        assert_eq!(p("io1:100GiB,iops=30000").warnings().len(), 1);
        assert!(p("io1:600GiB,iops=30000").warnings().is_empty());
    }
}
