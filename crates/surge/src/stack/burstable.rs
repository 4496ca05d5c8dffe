//! `burstable:` exports: the spec parsing and wiring of a burstable stripe.
//! The controller ([`BurstableVolume`]: members, swaps, mirror rebuilds, the
//! state file) is `surge_controller::burstable`, shared with the simulator.

pub use surge_controller::burstable::*;

use std::path::Path;
use std::sync::Arc;
use surge_block::BlockDev;
use surge_cloud::Provider;
use surge_policy::burstable::Mode;

/// `burstable:MODE,size=SIZE,members=N,...` (see the module docs). Volumes live
/// on the daemon's cloud (`--provider aws`: EBS), else in the local cloud of
/// the data directory.
pub fn build_burstable(name: &str, args: &str, ctx: &crate::stack::BuildContext) -> Result<crate::stack::Built, crate::stack::SpecError> {
    let p = parse_params(name, args, &ctx.data_dir)?;
    let err = |msg: String| crate::stack::SpecError::Args { kind: "burstable".into(), msg };
    let provider: Arc<dyn Provider> = match &ctx.cloud {
        Some(c) => c.clone(),
        None => {
            // Full scale (the controller's durations are not scaled), behind `--local-instance`'s EBS limits.
            let cfg = surge_cloud::LocalConfig { delays: local_delays(&p), instance: ctx.local.instance, ..surge_cloud::LocalConfig::new(crate::stack::volume::cloud_dir(&ctx.data_dir)) };
            Arc::new(surge_cloud::LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?)
        }
    };
    let vol = BurstableVolume::open(p.clone(), provider, ctx.clock.clone()).map_err(|e| err(format!("{e:#}")))?;
    vol.start().map_err(|e| err(format!("starting the controller thread: {e}")))?;
    let (extra, usd) = rounding_cost(&p);
    let rounding = if extra > 0 && p.mode != Mode::Cache {
        tracing::warn!(
            volume = %name,
            "{} members of {} bill {} for the {} exported: {} more, ${usd:.2}/month at list price (members=1 would bill {})",
            p.members,
            p.member,
            crate::stack::format_size(p.members as u64 * p.member.size),
            crate::stack::format_size(p.size),
            crate::stack::format_size(extra),
            crate::stack::format_size(p.size.div_ceil(1 << 30).max(1) << 30)
        );
        format!("; billed {}, rounding adds ${usd:.2}/month", crate::stack::format_size(p.members as u64 * p.member.size))
    } else {
        String::new()
    };
    let detail = serde_json::json!({
        "mode": p.mode, "members": p.members, "member": p.member.to_string(), "chunk": p.chunk,
        "backing": p.backing.as_ref().map(|b| b.to_string()), "state_dir": p.state_dir,
        "size_bytes": vol.size(), "billed_bytes": p.members as u64 * p.member.size, "rounding_usd_month": usd,
    });
    let what = match p.mode {
        Mode::Persistent => "persistent",
        Mode::Cache => "cache",
        Mode::Ephemeral => "ephemeral",
    };
    let size = crate::stack::format_size(vol.size());
    // On a real cloud the members are detached when the daemon stops, so a
    // restart (or another instance) can attach them again.
    let dev: Arc<dyn BlockDev> = if ctx.cloud.is_some() { Arc::new(crate::stack::AtExit::new(vol.clone(), BurstableVolume::detach_all)) } else { vol.clone() };
    Ok(crate::stack::Built {
        dev,
        description: format!("burstable {what} volume of {size} over {} x {}{rounding}", p.members, p.member),
        detail,
        controls: vec![vol],
    })
}

/// Parse the spec's arguments (`surge_controller::burstable::parse_params`,
/// shared with the simulator so that `surge plan` runs the spec it prints).
pub fn parse_params(name: &str, args: &str, data_dir: &Path) -> Result<BurstableParams, crate::stack::SpecError> {
    surge_controller::burstable::parse_params(name, args, data_dir).map_err(|msg| crate::stack::SpecError::Args { kind: "burstable".into(), msg })
}

#[cfg(test)]
#[path = "burstable_stress.rs"]
mod stress_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use crate::control::Controllable;
    use surge_block::Clock;
    use surge_cloud::CreateRequest;
    use surge_block::VirtualClock;
    use surge_cloud::{Delays, LocalConfig, LocalProvider};

    fn provider(dir: &Path, clock: Arc<dyn Clock>) -> Arc<LocalProvider> {
        let mut cfg = LocalConfig::new(dir.join("cloud"));
        cfg.delays = Delays::none();
        cfg.epoch_unix_ns = Some(0);
        cfg.scale = surge_block::model::Scale { rate: 1.0, time: 1.0 / 1024.0 }; // 1 GiB members hold 1 MiB
        Arc::new(LocalProvider::open(cfg, clock).unwrap())
    }

    fn params(dir: &Path, args: &str) -> BurstableParams {
        let mut p = parse_params("v", args, dir).unwrap();
        p.progress_bars = false;
        p.mirror.region = 64 << 10;
        p.mirror.persist_every = 128 << 10;
        p
    }

    fn open<C: Clock + 'static>(dir: &Path, args: &str, clock: &Arc<C>) -> (Arc<BurstableVolume>, Arc<LocalProvider>) {
        let prov = provider(dir, clock.clone());
        let v = BurstableVolume::open(params(dir, args), prov.clone(), clock.clone()).unwrap();
        (v, prov)
    }

    fn fill(v: &dyn BlockDev, seed: u8) -> Vec<u8> {
        let data: Vec<u8> = (0..v.size()).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        v.write_at(&data, 0, false).unwrap();
        data
    }

    fn read_all(v: &dyn BlockDev) -> Vec<u8> {
        let mut b = vec![0u8; v.size() as usize];
        v.read_at(&mut b, 0).unwrap();
        b
    }

    fn run_swaps(v: &BurstableVolume) {
        for _ in 0..1000 {
            v.step().unwrap();
            if v.rebuilds().is_empty() && v.requested_swaps() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("swaps did not finish");
    }

    #[test]
    fn specs_parse_with_defaults_and_refuse_what_does_not_fit() {
        let d = Path::new("/d");
        let p = parse_params("v", "persistent,size=100GiB", d).unwrap();
        assert_eq!((p.members, p.member.to_string(), p.chunk), (10, "gp2:10GiB".to_string(), 64 << 10));
        assert_eq!(p.rebuild_rate, Some(64 << 20));
        assert_eq!(p.state_dir, Path::new("/d/burstable/v"));
        let p = parse_params("v", "cache,size=100GiB,backing=st1:2TiB,swap_below=10%,block=32KiB", d).unwrap();
        assert_eq!(p.policy.swap_below, Some(0.1));
        for (bad, why) in [
            ("cache,size=1GiB", "backing"),
            ("persistent,size=1GiB,keep", "ephemeral"),
            ("cache,size=1GiB,backing=st1:1TiB,strategy=one", "persistent"),
            ("persistent,members=2", "size="),
            ("persistent,size=1GiB,swap_below=150%", "between"),
            ("raid,size=1GiB", "persistent"),
            ("persistent,size=1GiB,color=blue", "color"),
        ] {
            let e = parse_params("v", bad, d).err().unwrap().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_persistent_swap_migrates_every_member_online_and_deletes_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "persistent,size=4GiB,members=4,rebuild_rate=off", &clock);
        assert_eq!(v.size(), 4 << 20);
        let data = fill(v.as_ref(), 1);
        let before = v.member_ids();
        v.request_swap(vec![0, 1, 2, 3]);
        v.step().unwrap();
        assert_eq!(v.rebuilds().len(), 4, "four rebuilds in flight");
        // Writes during the rebuild reach both legs.
        v.write_at(&[9u8; 8192], 4096, false).unwrap();
        let mut want = data.clone();
        want[4096..4096 + 8192].fill(9);
        run_swaps(&v);
        let after = v.member_ids();
        assert!(before.iter().all(|b| !after.contains(b)), "{before:?} -> {after:?}");
        assert_eq!(read_all(v.as_ref()), want);
        let live: Vec<String> = prov.list().unwrap().into_iter().map(|i| i.id).collect();
        assert!(before.iter().all(|b| !live.contains(b)), "old members are deleted: {live:?}");
        assert_eq!(v.swaps().len(), 4);
        // A restart finds the new members and the same data.
        drop(v);
        let (v, _) = open(dir.path(), "persistent,size=4GiB,members=4,rebuild_rate=off", &clock);
        assert_eq!(v.member_ids(), after);
        assert_eq!(read_all(v.as_ref()), want);
    }

    #[test]
    fn an_interrupted_rebuild_resumes_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(surge_block::SystemClock::new());
        let spec = "persistent,size=2GiB,members=2,rebuild_rate=1MiB/s";
        let (v, _) = open(dir.path(), spec, &clock);
        let data = fill(v.as_ref(), 2);
        v.request_swap(vec![1]);
        v.step().unwrap();
        assert_eq!(v.rebuilds().len(), 1);
        std::thread::sleep(Duration::from_millis(150));
        v.stop(); // the process goes away mid-rebuild (state and record stay)
        let copied = v.rebuilds()[0].1.copied_bytes;
        assert!(copied > 0 && copied < 1 << 20, "stopped mid-rebuild: {copied}");
        drop(v);
        let (v, _) = open(dir.path(), spec, &clock);
        assert_eq!(v.rebuilds().len(), 1, "the swap resumes");
        assert!(v.rebuilds()[0].1.copied_bytes > 0, "from its recorded position");
        assert_eq!(read_all(v.as_ref()), data);
        v.swap_in_flight(1).expect("swapping").0.set_rate_limit(None);
        run_swaps(&v);
        assert_eq!(read_all(v.as_ref()), data);
        assert_eq!(v.swaps().len(), 1);
    }

    /// A write is on its way to a finished mirror's target when the swap is
    /// completed; the target fails it (after the completion check of old).
    /// The source then holds the only copy: the swap must keep it, and the
    /// write must read back, now and after a restart.
    #[test]
    fn a_target_failing_while_a_swap_completes_never_costs_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(surge_block::SystemClock::new());
        let spec = "persistent,size=2GiB,members=2,rebuild_rate=off";
        let prov = Arc::new(surge_cloud::FaultyProvider::new(provider(dir.path(), clock.clone()), clock.clone()));
        let v = BurstableVolume::open(params(dir.path(), spec), prov.clone(), clock.clone()).unwrap();
        let data = fill(v.as_ref(), 3);
        v.request_swap(vec![0]);
        v.step().unwrap();
        let (mirror, target) = v.swap_in_flight(0).expect("swapping");
        while mirror.rebuild_step().unwrap() != surge_block::mirror::Step::Done {}
        let source = v.member_ids()[0].clone();
        // The target now fails every write, a little later than it is issued.
        prov.fault(&target).unwrap().set_rules("write.latency=300ms,write.fail_prob=1".parse().unwrap());
        let writer = {
            let v = v.clone();
            std::thread::spawn(move || v.write_at(&[0xEE; 4096], 0, false)) // chunk 0: slot 0
        };
        std::thread::sleep(Duration::from_millis(50));
        v.step().unwrap();
        writer.join().unwrap().expect("the source took the write");
        let mut want = data.clone();
        want[..4096].fill(0xEE);
        assert!(read_all(v.as_ref())[..4096] == want[..4096], "the write is gone: the failed target replaced the source");
        assert_eq!(v.member_ids()[0], source, "the source stays the member");
        v.stop();
        drop(v);
        drop(prov);
        let (v, _) = open(dir.path(), spec, &clock);
        assert!(read_all(v.as_ref()) == want, "after a restart the data differs");
    }

    #[test]
    fn a_volume_left_by_a_crash_before_the_state_named_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "persistent,size=2GiB,members=2", &clock);
        drop(v);
        prov.create(CreateRequest { spec: "gp2:1GiB".parse().unwrap(), name: Some("v-s0-g7".into()) }).unwrap();
        drop(prov);
        let (_v, prov) = open(dir.path(), "persistent,size=2GiB,members=2", &clock);
        assert!(prov.list().unwrap().iter().all(|i| i.name.as_deref() != Some("v-s0-g7")));
    }

    #[test]
    fn a_cache_swap_replaces_all_members_and_keeps_serving_the_backing_data() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "cache,size=2GiB,members=2,backing=st1:1TiB,block=4KiB", &clock);
        assert_eq!(v.size(), 1 << 30, "the backing volume's size (scaled)");
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
        v.write_at(&data, 0, false).unwrap();
        let mut got = vec![0u8; data.len()];
        v.read_at(&mut got, 0).unwrap();
        let before = v.member_ids();
        v.request_swap((0..2).collect());
        v.step().unwrap();
        assert!(v.member_ids().iter().all(|m| !before.contains(m)));
        assert_eq!(v.cache().unwrap().stats().used_bytes, 0, "a fresh cache is empty");
        v.read_at(&mut got, 0).unwrap();
        assert_eq!(got, data);
        let live: Vec<String> = prov.list().unwrap().into_iter().map(|i| i.id).collect();
        assert!(before.iter().all(|b| !live.contains(b)));
    }

    #[test]
    fn an_ephemeral_swap_starts_empty_and_keeps_the_old_set_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, prov) = open(dir.path(), "ephemeral,size=2GiB,members=2,keep", &clock);
        fill(v.as_ref(), 3);
        let before = v.member_ids();
        v.request_swap(vec![0, 1]);
        v.step().unwrap();
        assert!(read_all(v.as_ref()).iter().all(|&b| b == 0), "fresh scratch space");
        let kept = prov.list().unwrap().into_iter().filter(|i| before.contains(&i.id)).count();
        assert_eq!(kept, 2, "old members kept (detached)");
        assert!(v.set("release", "all").is_ok());
        assert!(prov.list().unwrap().iter().all(|i| !before.contains(&i.id)));
        assert!(v.set("release", "all").is_err());
    }

    /// A spent ephemeral volume, idle long enough for a reset, over a
    /// provider that runs `during_attach` while each fresh member attaches.
    fn spent_ephemeral(dir: &Path, clock: &Arc<VirtualClock>, during_attach: Arc<dyn Fn() + Send + Sync>) -> (Arc<BurstableVolume>, Arc<LocalProvider>) {
        let local = provider(dir, clock.clone());
        let wrap: surge_cloud::faulty::Wrap = Box::new(move |dev| {
            during_attach();
            dev
        });
        let faulty: Arc<dyn Provider> = Arc::new(surge_cloud::FaultyProvider::with_wrap(local.clone(), clock.clone(), wrap));
        let v = BurstableVolume::open(params(dir, "ephemeral,size=2GiB,members=2,idle=5s,min_interval=0s,swap_below=50%"), faulty, clock.clone()).unwrap();
        (v, local)
    }

    /// Spend every member's credits between two controller steps, so the
    /// policy sees them drain; then 6 s of idle time (they earn a little back).
    fn spend_credits(v: &BurstableVolume, local: &LocalProvider, clock: &VirtualClock) {
        v.step().unwrap();
        for id in v.member_ids() {
            local.model(&id).unwrap().set_credits(Some(0), None);
        }
        clock.advance(Duration::from_secs(6));
    }

    #[test]
    fn an_ephemeral_reset_is_called_off_when_data_arrives_while_the_fresh_set_attaches() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let cell: Arc<std::sync::OnceLock<std::sync::Weak<BurstableVolume>>> = Default::default();
        let writer = cell.clone();
        let hook: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(v) = writer.get().and_then(|w| w.upgrade()) {
                v.write_at(&[0x5a; 4096], 8192, false).unwrap();
            }
        });
        let (v, local) = spent_ephemeral(dir.path(), &clock, hook);
        let data = fill(v.as_ref(), 9);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        let _ = cell.set(Arc::downgrade(&v));
        v.step().unwrap();
        assert_eq!(v.member_ids(), before, "the reset was called off");
        assert!(v.decisions().iter().any(|d| d.reason.contains("called off")), "{:?}", v.decisions());
        let mut want = data;
        want[8192..8192 + 4096].fill(0x5a);
        assert!(read_all(v.as_ref()) == want, "what was there and what came during the attach are both kept");
        assert_eq!(local.list().unwrap().len(), 2, "the fresh members were deleted");
    }

    /// Item 6 for the burstable path: the cloud refuses the fresh member
    /// (InsufficientVolumeCapacity, VolumeLimitExceeded on AWS; an injected
    /// failure here). The old members keep serving, status says why and when
    /// the swap is tried again, the policy's swap waits out a backoff (not
    /// one attempt per tick), and the retry after it succeeds.
    #[test]
    fn a_refused_fresh_member_keeps_the_old_one_serving_and_is_retried_after_a_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let args = "persistent,size=2GiB,members=2,rebuild_rate=off,min_interval=0s,swap_below=50%";
        let (v, local) = open(dir.path(), args, &clock);
        let data = fill(v.as_ref(), 3);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        local.inject_failure(surge_cloud::Action::Create, 0);
        local.inject_failure(surge_cloud::Action::Create, 0);
        v.step().unwrap();
        let st = v.status();
        let f = &st["swap_failure"];
        assert_eq!(f["attempts"], 1, "{st}");
        assert!(f["error"].as_str().unwrap().contains("injected failure"), "{f}");
        assert!(f["effect"].as_str().unwrap().contains("keep serving"), "{f}");
        assert_eq!(v.member_ids(), before);
        assert!(read_all(v.as_ref()) == data, "the old members serve");
        // Ticks within the 1 s backoff try nothing.
        for _ in 0..4 {
            clock.advance(Duration::from_millis(200));
            v.step().unwrap();
        }
        assert_eq!(v.status()["swap_failure"]["attempts"], 1, "not retried before the backoff");
        assert_eq!(local.list().unwrap().len(), 2, "what the refused swaps made was deleted");
        clock.advance(Duration::from_millis(300));
        v.step().unwrap();
        assert_eq!(v.status()["swap_failure"]["attempts"], 2, "retried after 1 s, refused again");
        clock.advance(Duration::from_secs(1));
        v.step().unwrap();
        assert_eq!(v.status()["swap_failure"]["attempts"], 2, "the second backoff is 2 s");
        clock.advance(Duration::from_secs(1));
        v.write_at(&[0x77; 4096], 0, false).unwrap();
        run_swaps(&v);
        assert!(v.status()["swap_failure"].is_null(), "cleared by the swap that started");
        assert!(v.member_ids().iter().any(|m| !before.contains(m)), "a member was swapped: {before:?} -> {:?}", v.member_ids());
        let mut want = data;
        want[..4096].fill(0x77);
        assert!(read_all(v.as_ref()) == want);
        assert_eq!(local.list().unwrap().len(), 2, "the old members were deleted");
    }

    #[test]
    fn an_idle_ephemeral_volume_is_reset_by_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let (v, local) = spent_ephemeral(dir.path(), &clock, Arc::new(|| {}));
        fill(v.as_ref(), 4);
        spend_credits(&v, &local, &clock);
        let before = v.member_ids();
        v.step().unwrap();
        let after = v.member_ids();
        assert!(after.iter().all(|id| !before.contains(id)), "every member replaced: {before:?} -> {after:?}");
        assert!(read_all(v.as_ref()).iter().all(|&b| b == 0), "fresh scratch space");
        assert_eq!(local.list().unwrap().len(), 2, "the spent members were deleted");
    }

    #[test]
    fn the_export_has_the_size_asked_for_and_says_what_rounding_costs() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        // Full scale (sparse files); a new provider per open, as a restarted daemon's.
        let prov = || {
            let mut cfg = LocalConfig::new(dir.path().join("cloud"));
            cfg.delays = Delays::none();
            Arc::new(LocalProvider::open(cfg, clock.clone()).unwrap())
        };
        let p = params(dir.path(), "persistent,size=256MiB,members=4");
        assert_eq!(p.member.to_string(), "gp2:1GiB", "each member rounds up to gp2's 1 GiB");
        let (extra, usd) = rounding_cost(&p);
        assert_eq!(extra, (4 << 30) - (256 << 20));
        assert!((usd - 0.375).abs() < 1e-9, "3.75 GiB of gp2 at $0.10: {usd}");
        let v = BurstableVolume::open(p, prov(), clock.clone()).unwrap();
        assert_eq!(v.size(), 256 << 20, "the size asked for, not the 4 GiB stripe");
        v.write_at(&[7u8; 4096], (256 << 20) - 4096, true).unwrap();
        assert!(v.write_at(&[7u8; 4096], 256 << 20, true).is_err(), "past the export");
        assert!(v.read_at(&mut [0u8; 8192], (256 << 20) - 4096).is_err());
        assert_eq!(v.status()["billed_bytes"], 4u64 << 30);
        drop(v);
        // A restart may grow the export within the stripe, never shrink it.
        let v = BurstableVolume::open(params(dir.path(), "persistent,size=512MiB,members=4"), prov(), clock.clone()).unwrap();
        assert_eq!(v.size(), 512 << 20);
        drop(v);
        let e = BurstableVolume::open(params(dir.path(), "persistent,size=256MiB,members=4"), prov(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("never shrinks"), "{e}");
        // Through the builder: the description says what rounding costs.
        let d2 = tempfile::tempdir().unwrap();
        let ctx = crate::stack::BuildContext::new(d2.path().to_path_buf(), Arc::new(VirtualClock::new()));
        let b = build_burstable("r", "persistent,size=256MiB,members=4,attach_delay=0s", &ctx).unwrap();
        assert_eq!(b.dev.size(), 256 << 20);
        assert!(b.description.contains("of 256MiB over 4 x gp2:1GiB; billed 4GiB, rounding adds $0.38/month"), "{}", b.description);
    }

    /// A local cloud that may report this instance's attachment slots, and
    /// whose credit reads panic while its count is above zero.
    struct TestCloud {
        local: Arc<LocalProvider>,
        slots: Option<surge_cloud::AttachmentSlots>,
        credit_panics: std::sync::atomic::AtomicU32,
    }

    impl TestCloud {
        fn new(local: Arc<LocalProvider>, slots: Option<surge_cloud::AttachmentSlots>) -> TestCloud {
            TestCloud { local, slots, credit_panics: std::sync::atomic::AtomicU32::new(0) }
        }
    }

    impl Provider for TestCloud {
        fn create(&self, r: CreateRequest) -> Result<surge_cloud::VolumeInfo, surge_cloud::CloudError> {
            self.local.create(r)
        }
        fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>, surge_cloud::CloudError> {
            self.local.attach(id)
        }
        fn detach(&self, id: &str) -> Result<(), surge_cloud::CloudError> {
            self.local.detach(id)
        }
        fn delete(&self, id: &str) -> Result<(), surge_cloud::CloudError> {
            self.local.delete(id)
        }
        fn list(&self) -> Result<Vec<surge_cloud::VolumeInfo>, surge_cloud::CloudError> {
            self.local.list()
        }
        fn describe(&self, id: &str) -> Result<surge_cloud::VolumeInfo, surge_cloud::CloudError> {
            self.local.describe(id)
        }
        fn cost(&self) -> Result<surge_cloud::CostReport, surge_cloud::CloudError> {
            self.local.cost()
        }
        fn attachment_slots(&self) -> Result<Option<surge_cloud::AttachmentSlots>, surge_cloud::CloudError> {
            match &self.slots {
                Some(s) => Ok(Some(s.clone())),
                None => self.local.attachment_slots(),
            }
        }
        fn credits(&self, id: &str) -> Result<surge_block::model::CreditBalance, surge_cloud::CloudError> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.credit_panics.load(SeqCst) > 0 {
                self.credit_panics.fetch_sub(1, SeqCst);
                panic!("credit read panicked (test)");
            }
            self.local.credits(id)
        }
    }

    #[test]
    fn members_and_swap_targets_must_fit_the_instance_attachment_slots() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        // 8 slots, one taken by a second network interface, one by the root volume: 6 free.
        let slots = surge_cloud::AttachmentSlots { total: 8, taken_by_others: 1, attached_volumes: vec!["vol-root".into()], source: "test instance".into() };
        let prov: Arc<dyn Provider> = Arc::new(TestCloud::new(provider(dir.path(), clock.clone()), Some(slots)));
        let e = BurstableVolume::open(params(dir.path(), "persistent,size=4GiB,members=4"), prov.clone(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("need 8 attachment slots") && e.contains("6 free (test instance)") && e.contains("strategy=one needs 5"), "{e}");
        assert!(prov.list().unwrap().is_empty(), "refused before creating anything");
        let e = BurstableVolume::open(params(dir.path(), "cache,size=4GiB,members=4,backing=st1:1TiB"), prov.clone(), clock.clone()).err().unwrap().to_string();
        assert!(e.contains("need 9 attachment slots") && e.contains("members=2 fits"), "{e}");
        let v = BurstableVolume::open(params(dir.path(), "persistent,size=4GiB,members=4,strategy=one"), prov.clone(), clock.clone()).unwrap();
        assert_eq!(v.params().policy.attach_limit, 6, "the policy swaps within what is free");
        assert_eq!(v.status()["attach_limit_source"], "test instance");
    }

    #[test]
    fn a_controller_step_that_panics_costs_that_tick_only() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let prov = Arc::new(TestCloud::new(provider(dir.path(), clock.clone()), None));
        let v = BurstableVolume::open(params(dir.path(), "persistent,size=256MiB,members=2"), prov.clone(), clock.clone()).unwrap();
        v.guarded_step();
        assert_eq!(v.status()["controller_panics"], 0);
        prov.credit_panics.store(1, std::sync::atomic::Ordering::SeqCst);
        v.guarded_step();
        assert_eq!(v.status()["controller_panics"], 1, "the panic was caught and counted");
        // The next step runs (the volume's locks were not left held) and serves I/O.
        v.guarded_step();
        assert_eq!(v.status()["controller_panics"], 1);
        v.write_at(&[7u8; 4096], 0, false).unwrap();
        let mut b = [0u8; 4096];
        v.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [7u8; 4096]);
    }
}
