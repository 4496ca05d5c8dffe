//! What a burstable stripe needs on a real cloud (EBS) beyond the local one:
//!
//! - [`Metered`]: every member's device counts the operations surge issues
//!   to it (EBS's way: one per 256 KiB or part, physically sequential I/O
//!   merged as the volume model merges it), for the credit model;
//! - [`SampledCredits`]: per member, `surge_policy::credits::CreditEstimator`
//!   fed with those counts and CloudWatch's lagging points; what the policy
//!   sees, and which source it trusted, for `surge status`;
//! - [`Slots`]: the attachment slots the stack may use.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::{CreditBalance, SeqMerge, Shape};
use surge_block::{BlockDev, Caps, Extent, ZeroMode};
use surge_cloud::{CloudError, CreateRequest, CostReport, Provider, VolumeInfo, VolumeSpec};
use surge_policy::credits::{Bucket, CreditEstimator, Estimate};

/// A device that counts the operations issued to it.
pub struct Metered {
    inner: Arc<dyn BlockDev>,
    shape: Shape,
    merge: Mutex<SeqMerge>,
    ops: Arc<AtomicU64>,
}

impl Metered {
    fn new(inner: Arc<dyn BlockDev>, shape: Shape, ops: Arc<AtomicU64>) -> Self {
        Metered { inner, shape, merge: Mutex::default(), ops }
    }

    /// EBS's count: sequential pieces of one merged operation are one, so
    /// the estimate spends credits as the volume does.
    fn count(&self, offset: u64, len: u64) {
        let ops = if self.shape.merge_sequential && len > 0 {
            let mut merge = self.merge.lock();
            let m = merge.charge(&self.shape, offset, len);
            merge.remember(m, ());
            m.charge.ops
        } else {
            self.shape.charge(len).ops
        };
        self.ops.fetch_add(ops, Relaxed);
    }
}

impl BlockDev for Metered {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.count(offset, buf.len() as u64);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.count(offset, buf.len() as u64);
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        self.count(offset, len);
        self.inner.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

/// Operations issued per volume id, and which volumes this process created.
#[derive(Default)]
struct Meters {
    ops: HashMap<String, Arc<AtomicU64>>,
    created: Vec<String>,
}

/// A provider whose attached devices are [`Metered`]; everything else is the inner one's.
pub struct MeteredProvider {
    inner: Arc<dyn Provider>,
    meters: Mutex<Meters>,
}

impl MeteredProvider {
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        MeteredProvider { inner, meters: Mutex::new(Meters::default()) }
    }

    /// Operations issued to `id` so far (0 if never attached here).
    pub fn issued(&self, id: &str) -> u64 {
        self.meters.lock().ops.get(id).map_or(0, |m| m.load(Relaxed))
    }

    /// The volume was created by this process (its bucket starts full).
    pub fn created_here(&self, id: &str) -> bool {
        self.meters.lock().created.iter().any(|c| c == id)
    }
}

impl Provider for MeteredProvider {
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo, CloudError> {
        let v = self.inner.create(req)?;
        self.meters.lock().created.push(v.id.clone());
        Ok(v)
    }
    fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>, CloudError> {
        let dev = self.inner.attach(id)?;
        let shape = self.inner.describe(id).ok().and_then(|v| v.spec.parse::<VolumeSpec>().ok()).and_then(|s| s.shape().ok()).unwrap_or_default();
        let ops = self.meters.lock().ops.entry(id.to_string()).or_default().clone();
        Ok(Arc::new(Metered::new(dev, shape, ops)))
    }
    fn detach(&self, id: &str) -> Result<(), CloudError> {
        self.inner.detach(id)
    }
    fn delete(&self, id: &str) -> Result<(), CloudError> {
        self.inner.delete(id)
    }
    fn list(&self) -> Result<Vec<VolumeInfo>, CloudError> {
        self.inner.list()
    }
    fn describe(&self, id: &str) -> Result<VolumeInfo, CloudError> {
        self.inner.describe(id)
    }
    fn credits(&self, id: &str) -> Result<CreditBalance, CloudError> {
        self.inner.credits(id)
    }
    fn credits_sampled(&self) -> bool {
        self.inner.credits_sampled()
    }
    fn credit_sample(&self, id: &str) -> Result<Option<surge_cloud::CreditSample>, CloudError> {
        self.inner.credit_sample(id)
    }
    fn attachment_slots(&self) -> Result<Option<surge_cloud::AttachmentSlots>, CloudError> {
        self.inner.attachment_slots()
    }
    fn cost(&self) -> Result<CostReport, CloudError> {
        self.inner.cost()
    }
    fn modify(&self, id: &str, spec: VolumeSpec) -> Result<VolumeInfo, CloudError> {
        self.inner.modify(id, spec)
    }
}

/// Members' credits from the model of surge's I/O and CloudWatch's points.
pub struct SampledCredits {
    pub provider: Arc<MeteredProvider>,
    /// The bucket of one member (all members have the same spec).
    bucket: Option<Bucket>,
    est: Mutex<HashMap<String, CreditEstimator>>,
    /// Unix time of the clock's zero (points carry unix times).
    epoch_unix_ms: u64,
    /// How often CloudWatch is asked, per member (its points come every 1 to
    /// 5 minutes, and each GetMetricStatistics call is billed).
    poll: Duration,
    asked: Mutex<HashMap<String, Duration>>,
}

impl SampledCredits {
    /// `epoch_unix_ns`: the UNIX time of the clock's zero (CloudWatch's points carry UNIX times).
    pub fn new(provider: Arc<MeteredProvider>, member: &VolumeSpec, epoch_unix_ns: u64, poll: Duration) -> Self {
        let bucket = member.shape().ok().and_then(|s| s.op_credits).map(|c| Bucket { capacity: c.capacity as f64, refill_per_s: c.baseline as f64 });
        SampledCredits { provider, bucket, est: Mutex::new(HashMap::new()), epoch_unix_ms: epoch_unix_ns / 1_000_000, poll, asked: Mutex::new(HashMap::new()) }
    }

    /// The member's credits now: the model advanced to `now`, corrected by a
    /// fresh CloudWatch point if there is one. A failed CloudWatch read keeps
    /// the model (logged).
    pub fn observe(&self, id: &str, now: Duration) -> CreditBalance {
        let Some(b) = self.bucket else { return CreditBalance::default() };
        let issued = self.provider.issued(id);
        let due = {
            let mut asked = self.asked.lock();
            let due = asked.get(id).is_none_or(|&t| now >= t + self.poll);
            if due {
                asked.insert(id.to_string(), now);
            }
            due
        };
        let sample = if due { self.provider.credit_sample(id) } else { Ok(None) };
        let mut est = self.est.lock();
        // A volume made here started full at its creation, and its meter at
        // zero: all it was issued counts (a rebuild's writes too).
        let fresh = self.provider.created_here(id);
        let e = est.entry(id.to_string()).or_insert_with(|| CreditEstimator::new(b, now, if fresh { 0 } else { issued }, fresh));
        e.advance(now, issued);
        match sample {
            Ok(Some(p)) => e.point(Duration::from_millis(p.at_unix_ms.saturating_sub(self.epoch_unix_ms)), p.percent),
            Ok(None) => {}
            Err(err) => tracing::warn!(volume = %id, "BurstBalance: {err}; the credit model continues without it"),
        }
        let v = e.estimate().credits;
        CreditBalance { ops: v.map(|v| v as u64), ops_capacity: Some(b.capacity as u64), bytes: None, bytes_capacity: None }
    }

    pub fn estimate(&self, id: &str) -> Option<Estimate> {
        self.est.lock().get(id).map(|e| e.estimate())
    }

    /// Forget volumes that are no longer members or targets.
    pub fn retain(&self, ids: &[String]) {
        self.est.lock().retain(|k, _| ids.contains(k));
        self.asked.lock().retain(|k, _| ids.contains(k));
    }
}

/// Attachment slots a stack of `members` needs, by mode and strategy: the
/// members, the fresh members of a swap in flight (all of them at once, or
/// one), and a cache's backing volume.
pub fn slots_needed(members: usize, swap_all: bool, backing: bool) -> usize {
    members + if swap_all { members } else { 1 } + usize::from(backing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::{Delays, LocalConfig, LocalProvider};

    /// A local cloud that pretends its credits are CloudWatch's: points are
    /// put in by the test, dated on the virtual clock.
    struct Sampled {
        inner: LocalProvider,
        points: Mutex<HashMap<String, surge_cloud::CreditSample>>,
    }

    impl Provider for Sampled {
        fn create(&self, r: CreateRequest) -> Result<VolumeInfo, CloudError> {
            self.inner.create(r)
        }
        fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>, CloudError> {
            self.inner.attach(id)
        }
        fn detach(&self, id: &str) -> Result<(), CloudError> {
            self.inner.detach(id)
        }
        fn delete(&self, id: &str) -> Result<(), CloudError> {
            self.inner.delete(id)
        }
        fn list(&self) -> Result<Vec<VolumeInfo>, CloudError> {
            self.inner.list()
        }
        fn describe(&self, id: &str) -> Result<VolumeInfo, CloudError> {
            self.inner.describe(id)
        }
        fn cost(&self) -> Result<CostReport, CloudError> {
            self.inner.cost()
        }
        fn credits_sampled(&self) -> bool {
            true
        }
        fn credit_sample(&self, id: &str) -> Result<Option<surge_cloud::CreditSample>, CloudError> {
            Ok(self.points.lock().get(id).copied())
        }
    }

    #[test]
    fn metered_members_feed_the_model_and_a_lower_point_takes_over() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = LocalConfig::new(d.path());
        cfg.delays = Delays::none();
        let inner = Arc::new(Sampled { inner: LocalProvider::open(cfg, clock.clone()).unwrap(), points: Mutex::new(HashMap::new()) });
        let mp = Arc::new(MeteredProvider::new(inner.clone()));
        let spec: VolumeSpec = "gp2:10GiB".parse().unwrap();
        let v = mp.create(CreateRequest { spec: spec.clone(), name: Some("m".into()) }).unwrap();
        let dev = mp.attach(&v.id).unwrap();
        let sc = SampledCredits::new(mp.clone(), &spec, 1_700_000_000_000_000_000, Duration::from_secs(60));
        assert_eq!(sc.observe(&v.id, Duration::ZERO).ops, Some(5_400_000), "created here: full");
        // 1,000 writes of 4 KiB a page apart (1,000 operations), 64 of 4 KiB
        // back to back (merged: one of 256 KiB, as EBS counts them) and one
        // of 1 MiB (4 of 256 KiB).
        for i in 0..1000 {
            dev.write_at(&[1u8; 4096], i * 8192, false).unwrap();
        }
        for j in 0..64 {
            dev.write_at(&[3u8; 4096], (32 << 20) + j * 4096, false).unwrap();
        }
        dev.write_at(&vec![2u8; 1 << 20], 64 << 20, false).unwrap();
        assert_eq!(mp.issued(&v.id), 1005);
        let c = sc.observe(&v.id, Duration::from_secs(1));
        assert_eq!(c.ops, Some(5_400_000 - 1005 + 100), "one second of a 10 GiB gp2's baseline refill (100/s; the bucket was full at 0)");
        assert_eq!(sc.estimate(&v.id).unwrap().source, surge_policy::credits::Source::Model);
        // CloudWatch: 50 % at t = 0, seen at t = 300 s.
        let epoch = sc.epoch_unix_ms;
        inner.points.lock().insert(v.id.clone(), surge_cloud::CreditSample { at_unix_ms: epoch, percent: 50.0 });
        let c = sc.observe(&v.id, Duration::from_secs(300));
        assert_eq!(sc.estimate(&v.id).unwrap().source, surge_policy::credits::Source::Cloudwatch);
        assert_eq!(c.ops, Some(2_700_000 - 1005 + 300 * 100));
    }

    #[test]
    fn slots_follow_mode_and_strategy() {
        assert_eq!(slots_needed(4, true, false), 8);
        assert_eq!(slots_needed(4, false, false), 5);
        assert_eq!(slots_needed(10, true, true), 21);
    }
}
