//! The two priced scenarios at full scale, and the same at reduced scale.

use serde::Serialize;
use surge_block::model::{GIB, KIB, MIB};
use surge_cloud::VolumeSpec;

/// What the application does in a burst.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum App {
    /// A checkpoint: `writers` jobs (connections) write `request`-sized blocks
    /// sequentially at queue depth `qd`, each appending its part of the
    /// checkpoint to its own region, then fsync. Bytes in flight are not
    /// scaled with rates, so they are kept small (writers x qd x request =
    /// 1 MiB): at reduced rates a deep queue would make completions lumpy.
    Checkpoint { writers: u32, request: u64, qd: u32 },
    /// A bulk load: random writes of the `bssplit` sizes at queue depth `qd`
    /// over a hot `region` (pages rewritten many times), then fsync.
    RandomWrites { bssplit: &'static str, mean_request: u64, qd: u32, region: u64 },
}

#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub key: &'static str,
    pub title: &'static str,
    /// The instance that waits on the storage (its EBS limits hold every
    /// approach's volumes), and why this one.
    pub instance: &'static str,
    pub nodes: u32,
    pub instance_why: &'static str,
    #[serde(serialize_with = "display")]
    pub backing: VolumeSpec,
    /// The peak, provisioned all the time (static-fast) or raised to (modify-volume).
    #[serde(serialize_with = "display")]
    pub peak: VolumeSpec,
    /// Cache block size of the elastic volume.
    pub block: u64,
    /// `cache=auto` demand ceilings (full scale).
    pub max_iops: f64,
    pub max_bps: f64,
    pub init_compute_s: f64,
    pub compute_s: f64,
    /// Each compute phase is compute_s x (1 + u x this), u uniform in [-1, 1] (seeded).
    pub compute_jitter: f64,
    /// Per burst: bytes (checkpoint) or requests (random writes); all
    /// bursts are alike.
    pub bursts: Vec<u64>,
    pub app: App,
    /// Settings that differ from the daemon's defaults, with the reason.
    pub deviations: Vec<String>,
}

fn display<S: serde::Serializer>(v: &VolumeSpec, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

fn spec(s: &str) -> VolumeSpec {
    s.parse().expect("scenario specs are valid")
}

impl Scenario {
    /// CM1-like checkpoint bursts on a gp3 volume at its baseline (125 MiB/s),
    /// the peak 1,000 MiB/s.
    pub fn throughput() -> Self {
        Scenario {
            key: "throughput",
            title: "checkpoint bursts (CM1-like), gp3 baseline backing, boost to 1,000 MiB/s",
            instance: "c5.9xlarge",
            nodes: 1,
            instance_why: "the cheapest c5/m5/r5 with the 9,500 Mbit/s of EBS bandwidth that 1,000 MiB/s needs",
            backing: spec("gp3:100GiB"),
            peak: spec("gp3:100GiB,iops=4000,throughput=1000MiB/s"),
            block: 256 * KIB,
            max_iops: 16_000.0,
            max_bps: 1_000.0 * MIB as f64,
            init_compute_s: 30.0,
            compute_s: 350.0,
            compute_jitter: 0.0,
            bursts: vec![12 * GIB; 4],
            app: App::Checkpoint { writers: 2, request: 256 * KIB, qd: 2 },
            deviations: vec![
                "cache block 256 KiB (default 64 KiB): with 64 KiB blocks each 256 KiB write is four cache I/Os, so a 1,000 MiB/s gp3 cache must buy 16,000 IOPS ($65/month) instead of 4,000 ($5)".into(),
            ],
        }
    }

    /// Bulk-load bursts of 4-16 KiB random writes on a gp3 volume at 3,000
    /// IOPS; the peak 32,000 IOPS (io2).
    pub fn iops() -> Self {
        Scenario {
            key: "iops",
            title: "bulk-load bursts of 4-16 KiB random writes, gp3 3,000 IOPS backing, peak 32,000 IOPS",
            instance: "r5.12xlarge",
            nodes: 1,
            instance_why: "the smallest r5 (database) instance with the 40,000 EBS IOPS that 32,000 IOPS need",
            backing: spec("gp3:100GiB"),
            peak: spec("io2:100GiB,iops=32000"),
            block: 4 * KIB,
            max_iops: 32_000.0,
            max_bps: 1_000.0 * MIB as f64,
            init_compute_s: 30.0,
            compute_s: 350.0,
            compute_jitter: 0.0,
            bursts: vec![640_000; 4],
            // Mostly 4 KiB (many small files, index pages), some 8 and 16 KiB.
            app: App::RandomWrites { bssplit: "4k/70:8k/20:16k/10", mean_request: 6_144, qd: 32, region: GIB },
            deviations: vec![
                "cache block 4 KiB (default 64 KiB): a 4-16 KiB write into an uncached 64 KiB block first reads the block from the backing volume, at its 3,000 IOPS".into(),
                "max_iops=32000 (default 16,000, gp3's ceiling): the demand the user declares for the first burst, like cache_bw for cache=reserved".into(),
            ],
        }
    }
}

/// A scenario at reduced scale: durations x `time`, rates x `rate`, amounts
/// (bytes, requests, sizes of what the application writes) x both.
#[derive(Debug, Clone, Serialize)]
pub struct Scaled {
    pub sc: Scenario,
    pub time: f64,
    pub rate: f64,
}

impl Scaled {
    pub fn secs(&self, full: f64) -> f64 {
        full * self.time
    }

    /// An amount at this scale, rounded up to `unit`.
    pub fn amount(&self, full: u64, unit: u64) -> u64 {
        ((full as f64 * self.rate * self.time) as u64).div_ceil(unit).max(1) * unit
    }

    /// Per burst: (bytes each writer writes, writers) for a checkpoint, or
    /// (requests, 1) for random writes.
    pub fn per_burst(&self) -> (u64, u64) {
        match self.sc.app {
            App::Checkpoint { writers, request, .. } => (self.amount(self.sc.bursts[0] / writers as u64, request), writers as u64),
            App::RandomWrites { .. } => (self.amount(self.sc.bursts[0], 1), 1),
        }
    }

    pub fn region(&self, full: u64) -> u64 {
        self.amount(full, 16 * KIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_bursts_keep_their_proportions() {
        let s = Scaled { sc: Scenario::throughput(), time: 0.05, rate: 1.0 / 16.0 };
        // 6 GiB per writer x 1/320 = 19.2 MiB, in whole 256 KiB requests.
        assert_eq!(s.per_burst(), (19 * MIB + 256 * KIB, 2));
        let i = Scaled { sc: Scenario::iops(), time: 0.05, rate: 1.0 / 16.0 };
        assert_eq!(i.per_burst(), (2_000, 1), "640,000 writes / 320");
        assert_eq!(i.region(GIB), 205 * 16 * KIB, "1 GiB / 320 in 16 KiB steps");
    }
}
