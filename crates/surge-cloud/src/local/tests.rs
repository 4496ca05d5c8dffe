use super::*;
use surge_block::model::{Scale, GIB, GP2_CREDITS, MIB};
use surge_block::{BlockError, VirtualClock};

fn provider(dir: &Path, clock: &Arc<VirtualClock>) -> LocalProvider {
    let mut cfg = LocalConfig::new(dir);
    cfg.epoch_unix_ns = Some(0);
    LocalProvider::open(cfg, clock.clone()).unwrap()
}

fn req(spec: &str, name: Option<&str>) -> CreateRequest {
    CreateRequest { spec: spec.parse().unwrap(), name: name.map(String::from) }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join("volumes")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn lifecycle_with_attach_and_detach_delays_on_the_clock() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    let v = p.create(req("reserved:64MiB,bw=128MB/s", Some("cache"))).unwrap();
    assert_eq!((v.id.as_str(), v.state, v.size), ("vol-000001", VolumeState::Available, 64 * MIB));
    assert_eq!(clock.now(), Duration::ZERO, "create is immediate by default");
    assert_eq!(files(d.path()), vec!["vol-000001.img"]);

    let dev = p.attach("cache").unwrap();
    assert_eq!(clock.now(), Duration::from_secs(3), "attach takes 3 s");
    assert_eq!(p.describe("cache").unwrap().state, VolumeState::Attached);
    dev.write_at(&[7u8; 4096], 0, false).unwrap();
    let err = p.delete(&v.id).unwrap_err();
    assert!(err.to_string().contains("delete vol-000001: attached to this process"), "{err}");

    p.detach(&v.id).unwrap();
    assert_eq!(clock.now(), Duration::from_secs(6), "detach takes 3 s");
    assert!(matches!(dev.read_at(&mut [0u8; 16], 0), Err(BlockError::Gone(_))), "a detached device fails I/O");

    let dev = p.attach(&v.id).unwrap();
    let mut buf = [0u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 4096], "data survives detach/attach");
    p.detach(&v.id).unwrap();
    p.delete("cache").unwrap();
    assert!(p.list().unwrap().is_empty());
    assert!(files(d.path()).is_empty());
    let e = p.describe("cache").unwrap_err();
    assert_eq!(e.to_string(), "describe cache: no such volume");
}

#[test]
fn state_and_data_survive_a_restart() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    {
        let p = provider(d.path(), &clock);
        p.create(req("gp2:1GiB", Some("a"))).unwrap();
        p.create(req("st1:125GiB", None)).unwrap();
        let dev = p.attach("a").unwrap();
        dev.write_at(b"persist me", 4096, true).unwrap();
        // No detach: the process "dies" with the volume attached.
    }
    let p = provider(d.path(), &clock);
    let l = p.list().unwrap();
    assert_eq!(l.iter().map(|v| v.spec.as_str()).collect::<Vec<_>>(), vec!["gp2:1GiB", "st1:125GiB"]);
    assert_eq!(l[0].credits.ops, Some(GP2_CREDITS - 1), "the balance was saved when the provider went away");
    // Our own pid is not a stale claim to others, but this process no longer
    // holds the attachment, so attaching again works.
    let dev = p.attach("a").unwrap();
    let mut buf = [0u8; 10];
    dev.read_at(&mut buf, 4096).unwrap();
    assert_eq!(&buf, b"persist me");
    assert_eq!(p.create(req("gp2:1GiB", None)).unwrap().id, "vol-000003", "ids are never reused");
}

#[test]
fn an_injected_failure_at_any_create_step_leaves_no_volume() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    for step in 0..3 {
        p.inject_failure(Action::Create, step);
        let e = p.create(req("gp2:8GiB", Some("x"))).unwrap_err();
        assert_eq!(e.action(), Action::Create);
        assert!(matches!(e, CloudError::Injected { step: s, .. } if s == step), "{e}");
        assert!(e.to_string().starts_with("create "), "{e}");
        assert!(p.list().unwrap().is_empty(), "step {step}: no volume listed");
        assert!(files(d.path()).is_empty(), "step {step}: no file left");
        assert!(p.cost().unwrap().volumes.is_empty(), "step {step}: nothing billed");
    }
    // And after a restart too; then the same create succeeds.
    let p = provider(d.path(), &clock);
    assert!(p.list().unwrap().is_empty());
    p.create(req("gp2:8GiB", Some("x"))).unwrap();
    assert_eq!(files(d.path()), vec!["vol-000001.img"]);
}

#[test]
fn an_injected_failure_in_delete_or_attach_keeps_the_volume_whole() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    let v = p.create(req("gp2:8GiB", None)).unwrap();
    for step in 0..2 {
        p.inject_failure(Action::Delete, step);
        let e = p.delete(&v.id).unwrap_err();
        assert!(e.to_string().starts_with("delete vol-000001: injected failure"), "{e}");
        assert_eq!(p.list().unwrap().len(), 1);
        assert_eq!(files(d.path()), vec!["vol-000001.img"]);
    }
    for step in 0..2 {
        p.inject_failure(Action::Attach, step);
        assert_eq!(p.attach(&v.id).err().unwrap().action(), Action::Attach);
        assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Available, "a failed attach releases the claim");
    }
    p.attach(&v.id).unwrap();
}

#[test]
fn a_slow_call_times_out_changing_nothing() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.timeout = Some(Duration::from_secs(10));
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp2:8GiB", None)).unwrap();
    p.inject_delay(Action::Attach, Duration::from_secs(60));
    let e = p.attach(&v.id).err().unwrap();
    assert!(matches!(e, CloudError::Timeout { .. }), "{e}");
    assert_eq!(e.to_string(), "attach vol-000001: timed out after 10s (the call would take 63s); nothing was changed");
    assert_eq!(clock.now(), Duration::from_secs(10), "gave up at the timeout");
    assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Available);

    p.inject_delay(Action::Create, Duration::from_secs(11));
    assert!(matches!(p.create(req("gp2:8GiB", None)), Err(CloudError::Timeout { .. })));
    assert_eq!(p.list().unwrap().len(), 1, "the timed-out create made nothing");
    assert_eq!(files(d.path()).len(), 1);
    p.attach(&v.id).unwrap();
}

#[test]
fn orphaned_files_are_swept_at_open() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    p.create(req("gp2:8GiB", None)).unwrap();
    drop(p);
    // As if a create crashed between writing the file and saving the state.
    fs::write(d.path().join("volumes/vol-000002.img"), b"").unwrap();
    let _p = provider(d.path(), &clock);
    assert_eq!(files(d.path()), vec!["vol-000001.img"]);
}

#[test]
fn a_volume_attached_by_another_live_process_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    let v = p.create(req("gp2:8GiB", None)).unwrap();
    // Claim it for pid 1 (always alive), as another surge process would.
    let path = d.path().join("state.json");
    let s = fs::read_to_string(&path).unwrap().replace("\"attached_pid\": null", "\"attached_pid\": 1");
    fs::write(&path, s).unwrap();
    assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Attached);
    assert_eq!(p.delete(&v.id).unwrap_err().to_string(), "delete vol-000001: attached to process 1; detach it first");
    assert!(p.attach(&v.id).err().unwrap().to_string().contains("attached to process 1"));
}

#[test]
fn names_are_unique_and_checked() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    p.create(req("gp2:8GiB", Some("db"))).unwrap();
    assert_eq!(p.create(req("gp2:8GiB", Some("db"))).unwrap_err().to_string(), "create: name \"db\" is already used by volume vol-000001");
    assert!(p.create(req("gp2:8GiB", Some("a b"))).is_err());
    assert!(p.create(req("gp2:8GiB", Some("vol-7"))).is_err(), "names cannot look like ids");
}

#[test]
fn credits_are_spent_by_io_and_kept_across_restart() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    {
        let mut cfg = LocalConfig::new(d.path());
        cfg.epoch_unix_ns = Some(0);
        cfg.delays = Delays::none();
        let p = LocalProvider::open(cfg, clock.clone()).unwrap();
        let v = p.create(req("gp2:100GiB", Some("g"))).unwrap();
        assert_eq!(v.credits.ops, Some(GP2_CREDITS), "a new gp2 volume has a full bucket");
        let dev = p.attach("g").unwrap();
        let mut buf = vec![0u8; 4096];
        // Every other page: adjacent reads would merge into 256 KiB operations.
        for i in 0..3_000u64 {
            dev.read_at(&mut buf, i * 8192).unwrap();
        }
        // 3,000 ops at 3,000 IOPS: the last at 2,999/3,000 s, having earned 299.9 credits.
        assert_eq!(p.credits("g").unwrap().ops, Some(GP2_CREDITS - 3_000 + 299));
        p.detach("g").unwrap();
    }
    clock.advance(Duration::from_secs(5));
    let p = provider(d.path(), &clock);
    // Saved at detach (5,397,299, rounded down), plus 5 s x 300/s since.
    assert_eq!(p.credits("g").unwrap().ops, Some(GP2_CREDITS - 3_000 + 299 + 1_500));
    let m = p.attach("g").ok().and(p.model("vol-000001")).unwrap();
    assert_eq!(m.credits().ops, Some(GP2_CREDITS - 3_000 + 299 + 1_500 + 900), "and 3 s more during the attach");
    clock.advance(Duration::from_secs(100));
    assert_eq!(m.credits().ops, Some(GP2_CREDITS), "the bucket stops at 5.4 M");
}

#[test]
fn cost_runs_from_create_to_delete() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    let v = p.create(req("gp2:100GiB", None)).unwrap();
    p.create(req("reserved:10GiB,bw=33MB/s", None)).unwrap();
    clock.advance(Duration::from_secs(120));
    p.delete(&v.id).unwrap();
    clock.advance(Duration::from_secs(80));
    let r = p.cost().unwrap();
    assert_eq!(r.volumes.len(), 2);
    assert!(r.volumes[0].deleted);
    assert_eq!(r.volumes[0].billed_seconds, 120);
    assert!((r.volumes[0].usd - 10.0 * 120.0 / 2_592_000.0).abs() < 1e-12);
    assert_eq!(r.volumes[1].billed_seconds, 200);
    assert!((r.volumes[1].agbs.unwrap() - 33.0 * 10.0 * 200.0).abs() < 1e-9);
}

#[test]
fn attached_volumes_pass_conformance() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.delays = Delays::none();
    let p = LocalProvider::open(cfg, clock).unwrap();
    surge_block::conformance::run("local-provider-reserved", |size| {
        let v = p.create(CreateRequest { spec: VolumeSpec { size, .."reserved:1GiB,bw=33MB/s,iops=500".parse().unwrap() }, name: None }).unwrap();
        p.attach(&v.id).unwrap()
    });
    assert!(p.list().unwrap().len() >= 2);
    let _ = GIB;
}

#[test]
fn modify_changes_parameters_live_and_bills_the_new_ones() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("io1:100GiB,iops=1000", None)).unwrap();
    let dev = p.attach(&v.id).unwrap();
    clock.advance(Duration::from_secs(100));
    p.modify(&v.id, "io1:100GiB,iops=2000".parse().unwrap()).unwrap();
    // Now 2,000 IOPS: 2,000 4 KiB reads take 1,999/2,000 s.
    let t0 = clock.now();
    let mut buf = vec![0u8; 4096];
    for _ in 0..2_000 {
        dev.read_at(&mut buf, 0).unwrap();
    }
    assert_eq!(clock.now() - t0, Duration::from_nanos((1_999 * 1_000_000_000u64).div_ceil(2_000)));
    let e = p.modify(&v.id, "io1:200GiB,iops=2000".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("detach it to resize"), "{e}");
    assert!(p.modify(&v.id, "io1:50GiB,iops=2000".parse().unwrap()).unwrap_err().to_string().contains("only grow"));
    p.detach(&v.id).unwrap();
    let info = p.modify(&v.id, "io1:200GiB,iops=2000".parse().unwrap()).unwrap();
    assert_eq!(info.spec, "io1:200GiB,iops=2000");
    assert_eq!(p.attach(&v.id).unwrap().size(), 200 * GIB);
    // Bill: 100 s at 1,000 IOPS, then the rest at 2,000 with no second minimum.
    let r = p.cost().unwrap();
    assert_eq!(r.volumes.len(), 3);
    assert_eq!(r.volumes[0].billed_seconds, 100);
    assert_eq!(r.volumes[1].billed_seconds, 1, "continuation: whole seconds, no 60 s minimum");
    let month = 2_592_000.0;
    let want = (12.5 + 65.0) * 100.0 / month + (12.5 + 130.0) * 1.0 / month + (25.0 + 130.0) * 0.0 / month;
    assert!((r.total_usd - want).abs() < 1e-12, "{} vs {want}", r.total_usd);
}

#[test]
fn a_scaled_cloud_shrinks_devices_and_credit_buckets_but_bills_full_sizes_and_full_scale_seconds() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    cfg.scale = Scale { rate: 1.0, time: 1.0 / 1024.0 };
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp2:10GiB", Some("m"))).unwrap();
    assert_eq!(v.size, 10 * GIB, "describe keeps the full size");
    let dev = p.attach("m").unwrap();
    assert_eq!(dev.size(), 10 * MIB);
    let c = p.credits("m").unwrap();
    assert_eq!((c.ops, c.ops_capacity), (Some(GP2_CREDITS.div_ceil(1024)), Some(GP2_CREDITS.div_ceil(1024))));
    // Rates are not scaled: 3,000 IOPS burst, 100 baseline for 10 GiB.
    assert_eq!(p.model(&v.id).unwrap().shape().iops, Some(3_000));
    clock.advance(Duration::from_secs(600));
    let cost = p.cost().unwrap();
    // 600 s at time scale 1/1024 stand for 614,400 s of the full-scale cloud.
    let want = 10.0 * 0.10 * 614_400.0 / (30.0 * 86_400.0);
    assert!((cost.total_usd - want).abs() < 1e-9, "billed as 10 GiB for 614,400 s: {} vs {want}", cost.total_usd);
}

#[test]
fn modify_changes_the_type_in_place_ramps_and_keeps_the_cooldown() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    cfg.modify_rules = ModifyRules { cooldown: Duration::from_secs(6 * 3_600), optimizing: Duration::from_secs(100), ..ModifyRules::default() };
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp3:32GiB", None)).unwrap();
    let dev = p.attach(&v.id).unwrap();
    let iops = |clock: &VirtualClock| {
        dev.read_at(&mut [0u8; 4096], 0).unwrap();
        let _ = clock;
        p.model(&v.id).unwrap().shape().iops
    };
    clock.advance(Duration::from_secs(10));
    let info = p.modify(&v.id, "io2:32GiB,iops=32000".parse().unwrap()).unwrap();
    assert_eq!(info.kind, "io2", "EBS changes the type in place");
    assert_eq!(iops(&clock), Some(3_000), "optimizing: not yet faster");
    clock.advance(Duration::from_secs(50));
    assert_eq!(iops(&clock), Some(17_500), "halfway through the ramp");
    clock.advance(Duration::from_secs(50));
    assert_eq!(iops(&clock), Some(32_000));
    // A second modification within 6 hours is refused, then allowed.
    let e = p.modify(&v.id, "gp3:32GiB".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("once per") && e.contains("100.0 s ago"), "{e}");
    clock.advance(Duration::from_secs(6 * 3_600 - 100));
    p.modify(&v.id, "gp3:32GiB".parse().unwrap()).unwrap();
    // Billed: gp3 for 10 s (60 s minimum), io2 for 6 h, then gp3 on.
    let r = p.cost().unwrap();
    let secs: Vec<u64> = r.volumes.iter().map(|v| v.billed_seconds).collect();
    assert_eq!(secs, vec![60, 6 * 3_600, 0]);
    assert_eq!(r.volumes[1].spec, "io2:32GiB,iops=32000");
}

#[test]
fn the_rolling_rule_takes_four_modifications_a_day_each_after_the_last_completed() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    cfg.modify_rules = ModifyRules::ebs_rolling();
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp3:32GiB", None)).unwrap();
    let specs = ["gp3:32GiB,iops=6000", "gp3:32GiB", "gp3:32GiB,iops=6000", "gp3:32GiB"];
    for (i, s) in specs.iter().enumerate() {
        p.modify(&v.id, s.parse().unwrap()).unwrap_or_else(|e| panic!("modification {}: {e}", i + 1));
        // Before the 5 minutes of optimizing are over, the next is refused.
        let e = p.modify(&v.id, "gp3:32GiB,iops=7000".parse().unwrap()).unwrap_err().to_string();
        assert!(e.contains("optimizing"), "{e}");
        clock.advance(Duration::from_secs(300));
    }
    let e = p.modify(&v.id, "gp3:32GiB,iops=7000".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("at most 4 per rolling"), "{e}");
    // A day after the first, one more.
    clock.advance(Duration::from_secs(24 * 3_600 - 4 * 300));
    p.modify(&v.id, "gp3:32GiB,iops=7000".parse().unwrap()).unwrap();
}

#[test]
fn the_modification_state_follows_the_optimizing_ramp() {
    use crate::ModificationState::*;
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    cfg.modify_rules = ModifyRules::ebs_rolling();
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp3:32GiB", None)).unwrap();
    assert_eq!(p.modification(&v.id).unwrap(), None, "never modified");
    clock.advance(Duration::from_secs(10));
    p.modify(&v.id, "gp3:32GiB,iops=6000".parse().unwrap()).unwrap();
    clock.advance(Duration::from_secs(150));
    let m = p.modification(&v.id).unwrap().unwrap();
    assert_eq!((m.state, m.progress_percent, m.started_unix_ms, m.ended_unix_ms), (Optimizing, Some(50), Some(10_000), None), "{m:?}");
    assert_eq!((m.target.as_deref(), m.target_iops), (Some("gp3:32GiB,iops=6000"), Some(6_000)));
    clock.advance(Duration::from_secs(150));
    let m = p.modification(&v.id).unwrap().unwrap();
    assert_eq!((m.state, m.progress_percent, m.ended_unix_ms), (Completed, Some(100), Some(310_000)));
    assert!(matches!(p.modification("vol-nope"), Err(CloudError::NotFound { .. })));
}

#[test]
fn a_scaled_cloud_serves_scaled_rates_and_bills_full_scale_seconds() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    cfg.scale = Scale { rate: 0.1, time: 0.5 };
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let v = p.create(req("gp3:10GiB", None)).unwrap();
    assert_eq!(v.size, 10 * GIB, "the spec stays full-scale");
    let dev = p.attach(&v.id).unwrap();
    assert_eq!(dev.size(), 512 * MIB, "10 GiB x 0.1 x 0.5");
    // 3,000 IOPS x 0.1: 300 4 KiB reads take 299/300 s.
    let t0 = clock.now();
    for _ in 0..300 {
        dev.read_at(&mut [0u8; 4096], 0).unwrap();
    }
    assert_eq!(clock.now() - t0, Duration::from_nanos((299 * 1_000_000_000u64).div_ceil(300)));
    // 100 emulated seconds are 200 billed ones.
    clock.advance(Duration::from_secs(100) - (clock.now() - t0));
    let r = p.cost().unwrap();
    assert_eq!(r.volumes[0].billed_seconds, 200);
    assert!((r.total_usd - 0.8 * 200.0 / 2_592_000.0).abs() < 1e-12);
}

// Issue 38 item 9: volume files and the state beside them are private to the
// user surge runs as, whatever the umask (tests run under the usual 022).
#[test]
fn volume_and_state_files_are_created_private() {
    use std::os::unix::fs::PermissionsExt;
    // The usual umask (it would leave new files 0644); harmless to other tests.
    // SAFETY: umask only sets the process file-creation mask.
    unsafe { libc::umask(0o022) };
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let p = provider(d.path(), &clock);
    p.create(req("gp2:1GiB", Some("a"))).unwrap();
    let mode = |f: &Path| fs::metadata(f).unwrap().permissions().mode() & 0o777;
    let vol = d.path().join("volumes").join(&files(d.path())[0]);
    assert_eq!(mode(&vol), 0o600, "{}", vol.display());
    for name in ["state.json", "lock"] {
        let f = d.path().join(name);
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

#[test]
fn volumes_of_one_instance_are_held_to_its_ebs_limits_together() {
    let d = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new());
    let mut cfg = LocalConfig::new(d.path());
    cfg.epoch_unix_ns = Some(0);
    cfg.delays = Delays::none();
    // c5.large: 4,000 EBS IOPS sustained; two gp3 volumes of 3,000 each.
    cfg.instance = Some(PriceTable::default().instance_ebs("c5.large").unwrap());
    let p = LocalProvider::open(cfg, clock.clone()).unwrap();
    let devs: Vec<_> = (0..2).map(|_| p.attach(&p.create(req("gp3:8GiB", None)).unwrap().id).unwrap()).collect();
    let t0 = clock.now();
    for i in 0..4_000 {
        devs[i % 2].read_at(&mut [0u8; 4096], 0).unwrap();
    }
    let took = clock.now() - t0;
    assert!(took >= Duration::from_millis(995), "4,000 reads at the instance's 4,000 IOPS take a second, not 2/3 of one: {took:?}");
}
