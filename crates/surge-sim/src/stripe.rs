//! The burstable-stripe candidate: the capacity split over N small gp2
//! volumes striped together (`burstable:persistent,size=..,members=N`), each
//! bursting to 3,000 IOPS on its own credits, so N of them serve N times one
//! volume's burst at the price of the same capacity.
//!
//! Replayed through the layers the daemon stacks for it: `surge-block`'s
//! `Stripe` (the export's chunk size) over one `ModelDev` per member (its own
//! token buckets and credit balance), all behind the instance's EBS `Link`.
//! The stripe's pieces run in order (`parallel: false`) on the replay clock:
//! each member books its piece at the request's submission time and the
//! request completes when the last piece does, as in parallel.
//!
//! Not run here: the controller's member swaps (a member nearly out of
//! credits mirrored onto a fresh one), whose rebuild runs on a thread of its
//! own and not on replay time; [`crate::burstable`] runs them on the threaded
//! harness, which the plan uses unless it cannot (then this replay's row says
//! why). A replay in which members run out of credits serves them at their
//! baseline, so its time is an upper bound; the row says so.

use crate::candidates::Demand;
use crate::clock::ReplayClock;
use crate::replay::{replay, NullDev, ReplayOptions, ReplayResult};
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::{ModelDev, Scheduler, Shape, GIB, MIB};
use surge_block::stripe::{Stripe, StripeConfig};
use surge_block::BlockDev;
use surge_cloud::VolumeSpec;
use surge_trace::Trace;

/// A gp2 volume under 1 TiB bursts to this many IOPS while it has credits.
const GP2_BURST_IOPS: u64 = 3_000;
/// gp2's throughput limit for the small members a stripe uses (up to 170 GiB).
const GP2_SMALL_MIBS: u64 = 128;
/// Most members: a swap attaches a target beside each member (strategy=all),
/// within the 27 slots the daemon assumes by default.
pub const MAX_MEMBERS: u64 = 12;
/// The burstable export's default chunk for persistent stripes.
const CHUNK: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq)]
pub struct StripeCandidate {
    pub members: u64,
    pub member: VolumeSpec,
    /// What the export holds (`size=`).
    pub size: u64,
}

impl StripeCandidate {
    /// The export spec `surge serve --export NAME=...` takes for it.
    pub fn spec(&self) -> String {
        format!("burstable:persistent,size={},members={}", surge_block::units::format_size(self.size), self.members)
    }

    pub fn sized(&self) -> String {
        format!(
            "{} x {}: {} IOPS and {} MiB/s of burst for the peak second, on each member's own credits",
            self.members,
            self.member,
            self.members * GP2_BURST_IOPS,
            self.members * GP2_SMALL_MIBS
        )
    }
}

/// The stripe sized for `d`'s peak second, or `None` where one gp2 volume's
/// burst already serves it (the stripe would be plain gp2).
pub fn candidate(d: &Demand) -> Option<StripeCandidate> {
    let by_iops = d.peak_iops.div_ceil(GP2_BURST_IOPS);
    let by_mibs = d.peak_bps.div_ceil(MIB).div_ceil(GP2_SMALL_MIBS);
    let members = by_iops.max(by_mibs).min(MAX_MEMBERS);
    if members < 2 {
        return None;
    }
    let member_size = d.capacity.div_ceil(members).div_ceil(GIB).max(1) * GIB;
    let member = VolumeSpec { model: surge_block::model::VolumeModel::Gp2, size: member_size, latency: Duration::ZERO };
    member.shape().ok()?;
    Some(StripeCandidate { members, member, size: d.capacity })
}

/// What the replay of a stripe found.
pub struct StripeRun {
    pub replay: ReplayResult,
    /// The emptiest member's credit balance at the end, in percent.
    pub lowest_credits_pct: f64,
}

/// `credits`: the fraction of a fresh member's bucket each member starts
/// with (a stripe that served before); `None`: full, as fresh volumes.
pub fn run(t: &Trace, c: &StripeCandidate, link_shape: Shape, qd: usize, credits: Option<f64>) -> Result<StripeRun, String> {
    let shape = c.member.shape().map_err(|e| e.to_string())?;
    let clock = Arc::new(ReplayClock::new());
    let link = Arc::new(parking_lot::Mutex::new(Scheduler::new(link_shape, Duration::ZERO)));
    let models: Vec<Arc<ModelDev>> = (0..c.members)
        .map(|_| Arc::new(ModelDev::new(Arc::new(NullDev(c.member.size)), clock.clone(), shape.clone()).with_link(Some(link.clone()))))
        .collect();
    if let Some(f) = credits {
        for m in &models {
            let cap = m.credits().ops_capacity.unwrap_or(0);
            m.set_credits(Some((cap as f64 * f) as u64), None);
        }
    }
    let devs: Vec<Arc<dyn BlockDev>> = models.iter().map(|m| m.clone() as Arc<dyn BlockDev>).collect();
    let stripe = Stripe::new(devs, StripeConfig { chunk: CHUNK, parallel: false }).map_err(|e| e.to_string())?;
    let replay = replay(t, &stripe, &clock, &ReplayOptions { qd }).map_err(|e| format!("replay: {e}"))?;
    let lowest_credits_pct = models.iter().filter_map(|m| m.credits().percent()).fold(100.0, f64::min);
    Ok(StripeRun { replay, lowest_credits_pct })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_follow_the_peak_and_a_small_demand_gets_no_stripe() {
        let d = |iops, mibs| Demand { capacity: 100 * GIB, peak_iops: iops, peak_bps: mibs * MIB, untimed: false };
        assert_eq!(candidate(&d(2_000, 50)), None, "one gp2 bursts to 3,000 IOPS");
        let c = candidate(&d(20_000, 80)).unwrap();
        assert_eq!((c.members, c.member.size), (7, 15 * GIB), "{c:?}");
        assert_eq!(candidate(&d(1_000, 600)).unwrap().members, 5, "128 MiB/s per member");
        assert_eq!(candidate(&d(u64::MAX, u64::MAX >> 20)).unwrap().members, MAX_MEMBERS);
        assert_eq!(c.spec(), "burstable:persistent,size=100GiB,members=7");
    }
}
