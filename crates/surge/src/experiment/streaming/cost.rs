//! What each configuration costs: its measured seconds and bytes turned into
//! dollars with list prices (`surge_cloud::cost::PriceTable`). Computed, not
//! billed: nothing here ran in a cloud.
//!
//! The compute node is billed per second while it waits for its disk
//! (provisioning) and while it works; the fixed-length phases (fio, pgbench)
//! cost every configuration the same time, so pgbench is priced per
//! transaction instead. Image bytes over the link are free when the storage
//! node is in the compute node's zone, and billed to both sides across zones.

use super::Sample;
use serde::Serialize;
use surge_cloud::cost::{Ec2Transfer, PriceTable};

/// The VM the volumes belong to: 2 vCPUs and 8 GiB, like the machine the
/// experiment runs on.
pub const COMPUTE_NODE: &str = "m5.large";

/// The list prices a report uses.
#[derive(Debug, Clone, Serialize)]
pub struct Pricing {
    pub instance: &'static str,
    pub instance_usd_hour: f64,
    pub transfer: Ec2Transfer,
}

impl Pricing {
    pub fn list() -> Pricing {
        let t = PriceTable::default();
        let instance_usd_hour = t.instance_usd_hour(COMPUTE_NODE, 1).expect("the compute node's type is in the default price table");
        Pricing { instance: COMPUTE_NODE, instance_usd_hour, transfer: t.ec2_transfer }
    }

    fn usd_per_s(&self) -> f64 {
        self.instance_usd_hour / 3600.0
    }
}

/// One run's costs, $.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Cost {
    /// The compute node paid while its volume is provisioned and booted.
    pub provision_usd: f64,
    /// The compute node paid while the sort runs.
    pub sort_usd: f64,
    /// Compute-node time per million pgbench transactions.
    pub usd_per_million_tx: f64,
    /// The bytes the storage node sent, were it in another zone.
    pub link_usd_cross_az: f64,
    /// A job on a new VM: provision, boot, sort (storage node in the same zone).
    pub job_usd: f64,
}

/// Cost fields with their names in results.json and report.md.
pub const FIELDS: [(&str, fn(&Cost) -> f64); 5] = [
    ("provision_usd", |c| c.provision_usd),
    ("sort_usd", |c| c.sort_usd),
    ("usd_per_million_tx", |c| c.usd_per_million_tx),
    ("job_usd", |c| c.job_usd),
    ("link_usd_cross_az", |c| c.link_usd_cross_az),
];

pub fn of(p: &Pricing, s: &Sample) -> Cost {
    let per_s = p.usd_per_s();
    let provision_usd = s.provision_s * per_s;
    let sort_usd = s.sort_s * per_s;
    Cost {
        provision_usd,
        sort_usd,
        usd_per_million_tx: if s.oltp_tps > 0.0 { per_s / s.oltp_tps * 1e6 } else { f64::NAN },
        link_usd_cross_az: p.transfer.usd(s.link_bytes, true),
        job_usd: provision_usd + sort_usd + p.transfer.usd(s.link_bytes, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
    }

    #[test]
    fn seconds_are_priced_at_the_compute_nodes_list_price_and_bytes_only_across_zones() {
        let p = Pricing::list();
        assert_eq!(p.instance_usd_hour, 0.096, "m5.large on demand, us-east-1");
        let s = Sample { provision_s: 36.0, sort_s: 72.0, oltp_tps: 500.0, link_bytes: 24 << 30, ..Default::default() };
        let c = of(&p, &s);
        assert!(close(c.provision_usd, 0.00096), "{c:?}");
        assert!(close(c.sort_usd, 0.00192), "{c:?}");
        assert!(close(c.usd_per_million_tx, 0.096 / 3600.0 / 500.0 * 1e6), "{c:?}");
        assert!(close(c.link_usd_cross_az, 24.0 * 0.02), "{c:?}");
        assert!(close(c.job_usd, 0.00096 + 0.00192), "same zone: no transfer charge: {c:?}");
        // A slower boot costs more; a run with no transactions has no price per transaction.
        let slow = of(&p, &Sample { provision_s: 360.0, ..s.clone() });
        assert!(slow.job_usd > c.job_usd);
        assert!(of(&p, &Sample { oltp_tps: 0.0, ..s }).usd_per_million_tx.is_nan());
    }
}
