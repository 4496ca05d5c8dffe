//! The AWS provider against moto in server mode (EC2 + CloudWatch on
//! loopback), with a fault proxy for throttling, expired credentials and waits
//! that never end, and a fake udev that makes `/dev/disk/by-id` links under a
//! temporary root the way Nitro instances show EBS volumes.

mod common;

use common::{Moto, Proxy, Rule};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_aws::device::nvme_link_name;
use surge_aws::{AwsConfig, AwsProvider};
use surge_cloud::gc::{self, GcOptions};
use surge_cloud::{Action, CloudError, CreateRequest, Provider, VolumeState};


fn config(endpoint: &str, owner: &str, root: &Path) -> AwsConfig {
    AwsConfig {
        region: Some("us-east-1".into()),
        endpoint_url: Some(endpoint.into()),
        owner: owner.into(),
        device_root: root.to_path_buf(),
        direct_io: false,
        create_timeout: Duration::from_secs(10),
        attach_timeout: Duration::from_secs(2),
        detach_timeout: Duration::from_secs(2),
        device_timeout: Duration::from_secs(5),
        poll: Duration::from_millis(50),
        max_attempts: 4,
        initial_backoff: Duration::from_millis(20),
        ..AwsConfig::default()
    }
}

/// An instance in moto to attach to; returns (id, zone).
fn run_instance(p: &AwsProvider) -> (String, String) {
    let out = p.block_on(p.ec2().run_instances().image_id("ami-12c6146b").min_count(1).max_count(1).send()).unwrap();
    let i = &out.instances()[0];
    (i.instance_id().unwrap().to_string(), i.placement().unwrap().availability_zone().unwrap().to_string())
}

/// Plays udev: every attached volume gets a by-id link to a data file under
/// `root/dev` (kept across detach, like the volume's data), removed on detach.
struct FakeUdev {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeUdev {
    fn start(moto_url: &str, root: &Path) -> FakeUdev {
        let p = AwsProvider::connect(config(moto_url, "udev", root)).unwrap();
        let root = root.to_path_buf();
        std::fs::create_dir_all(root.join("dev/disk/by-id")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut linked: HashSet<String> = HashSet::new();
            while !stop2.load(Ordering::Relaxed) {
                let vols = p.block_on(p.ec2().describe_volumes().send()).map(|o| o.volumes().to_vec()).unwrap_or_default();
                let mut now = HashSet::new();
                for v in &vols {
                    let id = v.volume_id().unwrap().to_string();
                    if v.attachments().iter().any(|a| a.state().map(|s| s.as_str()) == Some("attached")) {
                        let data = root.join(format!("dev/ebs-{id}"));
                        if !data.exists() {
                            let f = std::fs::File::create(&data).unwrap();
                            f.set_len(v.size().unwrap() as u64 * (1 << 30)).unwrap();
                        }
                        let link = root.join("dev/disk/by-id").join(nvme_link_name(&id));
                        if !linked.contains(&id) {
                            let _ = std::os::unix::fs::symlink(format!("../../ebs-{id}"), &link);
                        }
                        now.insert(id);
                    }
                }
                for gone in linked.difference(&now) {
                    let _ = std::fs::remove_file(root.join("dev/disk/by-id").join(nvme_link_name(gone)));
                }
                linked = now;
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FakeUdev { stop, thread: Some(thread) }
    }
}

impl Drop for FakeUdev {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Rig {
    _moto: Moto,
    proxy: Proxy,
    root: tempfile::TempDir,
    p: AwsProvider,
    _udev: FakeUdev,
}

/// moto, the proxy in front of it, a provider through the proxy attached to a fresh instance.
fn rig(owner: &str) -> Rig {
    common::test_env();
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port);
    let root = tempfile::tempdir().unwrap();
    let direct = AwsProvider::connect(config(&moto.url(), owner, root.path())).unwrap();
    let (instance, az) = run_instance(&direct);
    let mut cfg = config(&proxy.url(), owner, root.path());
    cfg.instance_id = Some(instance);
    cfg.availability_zone = Some(az);
    let p = AwsProvider::connect(cfg).unwrap();
    let udev = FakeUdev::start(&moto.url(), root.path());
    Rig { _moto: moto, proxy, root, p, _udev: udev }
}

fn req(spec: &str, name: Option<&str>) -> CreateRequest {
    CreateRequest { spec: spec.parse().unwrap(), name: name.map(Into::into) }
}

#[test]
fn volumes_are_created_attached_written_detached_modified_and_deleted() {
    let r = rig("life");
    let p = &r.p;
    let v = p.create(req("gp3:1GiB,iops=4000,throughput=200MiB/s", Some("data"))).unwrap();
    assert!(v.id.starts_with("vol-"), "{v:?}");
    assert_eq!((v.spec.as_str(), v.state, v.name.as_deref()), ("gp3:1GiB,iops=4000,throughput=200MiB/s", VolumeState::Available, Some("data")));
    // Every type surge knows is created with its parameters.
    for spec in ["gp2:1GiB", "io1:4GiB,iops=200", "io2:4GiB,iops=1000", "st1:125GiB", "sc1:125GiB"] {
        assert_eq!(p.create(req(spec, None)).unwrap().spec, spec);
    }
    // Names are unique; ids and names both find a volume.
    assert!(matches!(p.create(req("gp2:1GiB", Some("data"))), Err(CloudError::NameTaken { .. })));
    assert_eq!(p.describe("data").unwrap().id, v.id);

    let dev = p.attach("data").unwrap();
    assert_eq!(dev.size(), 1 << 30);
    assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Attached);
    dev.write_at(b"surge on ebs", 4096, true).unwrap();
    assert!(matches!(p.attach(&v.id), Err(CloudError::Busy { .. })), "attached once");
    assert!(matches!(p.delete(&v.id), Err(CloudError::Busy { .. })), "an attached volume is not deleted");

    // Modified online: the new parameters show in DescribeVolumes.
    let m = p.modify(&v.id, "gp3:2GiB,iops=6000".parse().unwrap()).unwrap();
    assert_eq!(m.spec, "gp3:2GiB,iops=6000", "throughput not given: back to the included 125 MiB/s");
    assert!(p.modify(&v.id, "gp3:1GiB".parse().unwrap()).unwrap_err().to_string().contains("only grow"));

    p.detach(&v.id).unwrap();
    assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Available);
    let mut buf = [0u8; 12];
    assert!(matches!(dev.read_at(&mut buf, 4096), Err(surge_block::BlockError::Gone(_))), "the old handle is dead");
    // Reattached, the data is there (the fake device keeps it, as EBS does).
    let dev = p.attach(&v.id).unwrap();
    dev.read_at(&mut buf, 4096).unwrap();
    assert_eq!(&buf, b"surge on ebs");
    p.detach(&v.id).unwrap();

    let cost = p.cost().unwrap();
    assert_eq!(cost.volumes.len(), 6);
    assert!(cost.total_usd > 0.0, "{cost:?}");
    p.delete("data").unwrap();
    assert!(matches!(p.describe(&v.id), Err(CloudError::NotFound { .. })));
    assert_eq!(p.list().unwrap().len(), 5);
    assert!(p.cost().unwrap().volumes.iter().any(|c| c.id == v.id && c.deleted), "deleted volumes stay on the bill");
}

#[test]
fn burst_balance_comes_from_cloudwatch() {
    use aws_sdk_cloudwatch::types::{Dimension, MetricDatum};
    let r = rig("credits");
    let p = &r.p;
    let v = p.create(req("gp2:100GiB", None)).unwrap();
    assert_eq!(p.credits(&v.id).unwrap().percent(), None, "no data point yet: unknown, not full");
    let datum = MetricDatum::builder()
        .metric_name("BurstBalance")
        .dimensions(Dimension::builder().name("VolumeId").value(&v.id).build())
        .value(42.0)
        .timestamp(std::time::SystemTime::now().into())
        .build();
    p.block_on(p.cloudwatch().put_metric_data().namespace("AWS/EBS").metric_data(datum).send()).unwrap();
    let c = p.credits(&v.id).unwrap();
    assert_eq!(c.ops_capacity, Some(5_400_000));
    assert!((c.percent().unwrap() - 42.0).abs() < 0.01, "{c:?}");
    assert!((p.describe(&v.id).unwrap().credits.percent().unwrap() - 42.0).abs() < 0.01);
    // gp3 has no burst bucket.
    let g = p.create(req("gp3:1GiB", None)).unwrap();
    assert_eq!(p.credits(&g.id).unwrap().percent(), None);
}

#[test]
fn throttled_calls_are_retried_with_backoff_and_fail_clearly_when_it_persists() {
    let r = rig("throttle");
    let fail = |times| Rule::Fail { action: "CreateVolume".into(), times, status: 503, code: "RequestLimitExceeded".into() };
    // Three throttled replies, then success: the fourth attempt creates one volume.
    r.proxy.add(fail(3));
    let v = r.p.create(req("gp2:1GiB", None)).unwrap();
    assert_eq!(r.proxy.count("CreateVolume"), 4);
    assert_eq!(r.p.list().unwrap().len(), 1);
    // Throttled on every attempt: a clear error and no volume.
    r.proxy.add(fail(100));
    let e = r.p.create(req("gp2:1GiB", None)).unwrap_err();
    assert_eq!(r.proxy.count("CreateVolume"), 8, "max_attempts=4");
    let msg = e.to_string();
    assert!(matches!(e, CloudError::Remote { action: Action::Create, .. }), "{e:?}");
    assert!(msg.contains("throttled") && msg.contains("RequestLimitExceeded") && msg.contains("4 attempts"), "{msg}");
    r.proxy.clear();
    assert_eq!(r.p.list().unwrap().into_iter().map(|x| x.id).collect::<Vec<_>>(), [v.id]);
}

/// Capacity and limit refusals fail the call at once (the stack's controller
/// retries later with its backoff): InsufficientVolumeCapacity comes as a
/// server error, which the SDK's standard strategy alone would repeat.
#[test]
fn capacity_and_limit_refusals_are_not_retried_in_the_call_and_say_what_to_do() {
    let r = rig("limits");
    for (action, status, code, says) in [
        ("CreateVolume", 500, "InsufficientVolumeCapacity", "no capacity"),
        ("CreateVolume", 400, "VolumeLimitExceeded", "limit of the account or instance"),
    ] {
        let before = r.proxy.count(action);
        r.proxy.add(Rule::Fail { action: action.into(), times: 100, status, code: code.into() });
        let e = r.p.create(req("gp2:1GiB", None)).unwrap_err();
        r.proxy.clear();
        assert_eq!(r.proxy.count(action) - before, 1, "{code}: one request, no retries");
        let msg = e.to_string();
        assert!(matches!(e, CloudError::Remote { action: Action::Create, .. }), "{e:?}");
        assert!(msg.contains(code) && msg.contains(says) && msg.contains("later with a backoff"), "{msg}");
    }
    // Another server error is still retried by the SDK (max_attempts=4).
    let before = r.proxy.count("CreateVolume");
    r.proxy.add(Rule::Fail { action: "CreateVolume".into(), times: 100, status: 500, code: "InternalError".into() });
    assert!(r.p.create(req("gp2:1GiB", None)).is_err());
    r.proxy.clear();
    assert_eq!(r.proxy.count("CreateVolume") - before, 4);
    let v = r.p.create(req("gp2:1GiB", None)).unwrap();
    r.proxy.add(Rule::Fail { action: "AttachVolume".into(), times: 100, status: 400, code: "AttachmentLimitExceeded".into() });
    let e = r.p.attach(&v.id).err().expect("attach refused").to_string();
    r.proxy.clear();
    assert_eq!(r.proxy.count("AttachVolume"), 1, "not retried");
    assert!(e.contains("AttachmentLimitExceeded") && e.contains("detach or delete volumes"), "{e}");
    assert_eq!(r.p.describe(&v.id).unwrap().state, VolumeState::Available);
}

#[test]
fn expired_credentials_say_so() {
    let r = rig("creds");
    r.proxy.add(Rule::Fail { action: "DescribeVolumes".into(), times: 100, status: 400, code: "RequestExpired".into() });
    let e = r.p.list().unwrap_err().to_string();
    r.proxy.clear();
    assert!(e.contains("credentials") && e.contains("expired") && e.contains("RequestExpired"), "{e}");
    r.proxy.add(Rule::Fail { action: "AttachVolume".into(), times: 100, status: 403, code: "UnauthorizedOperation".into() });
    let v = r.p.create(req("gp2:1GiB", None)).unwrap();
    let e = r.p.attach(&v.id).err().expect("attach fails").to_string();
    assert!(e.contains("ec2:AttachVolume") && e.contains("IAM"), "{e}");
}

#[test]
fn an_attach_that_never_completes_times_out_and_is_undone() {
    let r = rig("stuck");
    let v = r.p.create(req("gp2:1GiB", None)).unwrap();
    // Every DescribeVolumes reply shows the attachment still attaching.
    r.proxy.add(Rule::Rewrite { action: "DescribeVolumes".into(), times: 1000, from: "<status>attached</status>".into(), to: "<status>attaching</status>".into() });
    let e = r.p.attach(&v.id).err().expect("attach fails").to_string();
    assert!(e.contains("did not happen within 2s") && e.contains("attaching"), "{e}");
    assert!(e.contains("detach"), "says what surge did about it: {e}");
    r.proxy.clear();
    assert_eq!(r.p.describe(&v.id).unwrap().state, VolumeState::Available, "surge detached it again");
    assert!(r.proxy.count("DetachVolume") >= 1);
}

#[test]
fn a_volume_stuck_in_use_is_reported_as_busy() {
    let r = rig("inuse");
    let v = r.p.create(req("gp2:1GiB", None)).unwrap();
    let _dev = r.p.attach(&v.id).unwrap();
    // After DetachVolume the volume keeps showing in-use.
    r.proxy.add(Rule::Rewrite { action: "DescribeVolumes".into(), times: 1000, from: "<status>available</status>".into(), to: "<status>in-use</status>".into() });
    let e = r.p.detach(&v.id).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CloudError::Busy { action: Action::Detach, .. }), "{e:?}");
    assert!(msg.contains("stuck in-use") && msg.contains("within 2s"), "{msg}");
}

#[test]
fn a_device_that_never_appears_times_out_and_the_attach_is_undone() {
    common::test_env();
    let moto = Moto::start();
    let root = tempfile::tempdir().unwrap();
    let direct = AwsProvider::connect(config(&moto.url(), "nodev", root.path())).unwrap();
    let (instance, az) = run_instance(&direct);
    let mut cfg = config(&moto.url(), "nodev", root.path());
    cfg.instance_id = Some(instance);
    cfg.availability_zone = Some(az);
    cfg.device_timeout = Duration::from_millis(300);
    let p = AwsProvider::connect(cfg).unwrap(); // no fake udev: nothing appears
    let v = p.create(req("gp2:1GiB", None)).unwrap();
    let e = p.attach(&v.id).err().expect("attach fails").to_string();
    assert!(e.contains("no block device appeared within 300ms") && e.contains(&nvme_link_name(&v.id)), "{e}");
    assert_eq!(p.describe(&v.id).unwrap().state, VolumeState::Available);
}

#[test]
fn gc_removes_unattached_unnamed_surge_volumes_only() {
    let r = rig("gc");
    let p = &r.p;
    let orphan = p.create(req("gp2:1GiB", None)).unwrap();
    let named = p.create(req("gp2:1GiB", Some("keep"))).unwrap();
    let busy = p.create(req("gp2:1GiB", None)).unwrap();
    let _dev = p.attach(&busy.id).unwrap();
    // A volume of another owner (another deployment) and an untagged one are never touched.
    let other = AwsProvider::connect(config(&r.proxy.url(), "someone-else", r.root.path())).unwrap();
    let foreign = {
        let mut c = config(&r.proxy.url(), "someone-else", r.root.path());
        c.availability_zone = Some("us-east-1a".into());
        let o = AwsProvider::connect(c).unwrap();
        o.create(req("gp2:1GiB", None)).unwrap()
    };
    let untagged = p.block_on(p.ec2().create_volume().availability_zone("us-east-1a").size(1).send()).unwrap();
    let untagged = untagged.volume_id().unwrap().to_string();

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let opts = GcOptions { min_age: Duration::ZERO, named: false, dry_run: false };
    let rep = gc::collect(p, &opts, now + 1000).unwrap();
    assert_eq!(rep.orphans.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), [orphan.id.as_str()]);
    assert!(rep.failed.is_empty() && rep.kept.len() == 1, "{rep:?}");
    let mut left: Vec<String> = p.list().unwrap().into_iter().map(|v| v.id).collect();
    let mut want = vec![named.id, busy.id];
    left.sort();
    want.sort();
    assert_eq!(left, want, "the named and the attached volume stay");
    assert_eq!(other.list().unwrap().len(), 1, "{foreign:?} stays");
    assert!(matches!(p.delete(&untagged), Err(CloudError::Busy { .. })), "surge refuses volumes it does not own");
}

#[test]
fn reserved_volumes_are_refused_with_the_aws_alternative() {
    let r = rig("types");
    let e = r.p.create(req("reserved:1GiB,bw=33MB/s", None)).unwrap_err().to_string();
    assert!(e.contains("only on the local cloud") && e.contains("gp3"), "{e}");
    assert_eq!(r.proxy.count("CreateVolume"), 0, "refused before calling AWS");
}

/// A daemon SIGKILLed with a volume attached leaves it attached to the
/// instance; the next run (a fresh provider) takes the attachment over and
/// sees the data, instead of refusing the volume as "in-use".
#[test]
fn a_volume_left_attached_by_a_dead_process_is_taken_over() {
    let r = rig("adopt");
    let v = r.p.create(req("gp3:1GiB", Some("kept"))).unwrap();
    let dev = r.p.attach(&v.id).unwrap();
    dev.write_at(b"before the crash", 0, true).unwrap();
    // The "restarted" process: same config, knows nothing of the attachment.
    let next = AwsProvider::connect(r.p.config().clone()).unwrap();
    let dev2 = next.attach("kept").unwrap();
    let mut buf = [0u8; 16];
    dev2.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before the crash");
    assert!(matches!(next.attach(&v.id), Err(CloudError::Busy { .. })), "still attached once per process");
    next.detach(&v.id).unwrap();
    assert_eq!(next.describe(&v.id).unwrap().state, VolumeState::Available);
}

/// Issue 39 item 4: ModifyVolume within the modification rule, whose "once
/// the previous one completed" is DescribeVolumesModifications' state. moto
/// answers DescribeVolumesModifications but reports every modification
/// `completed` (progress 100) at once and enforces no limit; the proxy
/// rewrites its state to `optimizing` and injects EBS's refusal.
#[test]
fn modifications_keep_to_the_rule_and_wait_for_the_state_aws_reports() {
    let r = rig("modify");
    let p = &r.p;
    let v = p.create(req("gp3:1GiB", Some("m"))).unwrap();
    assert_eq!(p.modification(&v.id).unwrap(), None, "never modified");
    p.modify(&v.id, "gp3:1GiB,iops=6000".parse().unwrap()).unwrap();
    let m = p.modification("m").unwrap().expect("moto reports the modification");
    assert_eq!((m.state, m.progress_percent), (surge_cloud::ModificationState::Completed, Some(100)), "{m:?}");
    assert_eq!(m.target.as_deref(), Some("gp3:1GiB,iops=6000"), "{m:?}");
    assert!(m.started_unix_ms.is_some(), "{m:?}");

    // Still optimizing (as AWS says for minutes to hours): not asked of AWS.
    let optimizing = Rule::Rewrite { action: "DescribeVolumesModifications".into(), times: 1, from: "completed".into(), to: "optimizing".into() };
    r.proxy.add(optimizing);
    let sent = r.proxy.count("ModifyVolume");
    let e = p.modify(&v.id, "gp3:1GiB,iops=7000".parse().unwrap()).unwrap_err();
    assert!(matches!(e, CloudError::Busy { action: Action::Modify, .. }), "{e:?}");
    assert!(e.to_string().contains("not completed") && e.to_string().contains("ebs-24h"), "{e}");
    assert_eq!(r.proxy.count("ModifyVolume"), sent, "a modification surge knows AWS refuses is not sent");
    // Completed: the rolling rule allows four a day.
    for iops in [7000, 8000, 9000] {
        p.modify(&v.id, format!("gp3:1GiB,iops={iops}").parse().unwrap()).unwrap();
    }
    let e = p.modify(&v.id, "gp3:1GiB,iops=10000".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("at most 4 per rolling"), "{e}");
    assert_eq!(r.proxy.count("ModifyVolume"), sent + 3);

    // EBS's refusal: a clear Busy error, and no retry until modify_retry passed.
    let w = p.create(req("gp3:1GiB", None)).unwrap();
    r.proxy.add(Rule::Fail { action: "ModifyVolume".into(), times: 1, status: 400, code: "VolumeModificationRateExceeded".into() });
    let e = p.modify(&w.id, "gp3:1GiB,iops=6000".parse().unwrap()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CloudError::Busy { .. }) && msg.contains("EBS refused the modification") && msg.contains("VolumeModificationRateExceeded"), "{msg}");
    let sent = r.proxy.count("ModifyVolume");
    let e = p.modify(&w.id, "gp3:1GiB,iops=6000".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("AWS refused the last modification"), "{e}");
    assert_eq!(r.proxy.count("ModifyVolume"), sent, "not retried");

    // The classic rule: one per 6 hours, AWS's start time counting (a fresh provider knows no history).
    let mut cfg = p.config().clone();
    cfg.modify_rules = surge_cloud::ModifyRules::ebs();
    let classic = AwsProvider::connect(cfg).unwrap();
    let e = classic.modify(&v.id, "gp3:1GiB,iops=11000".parse().unwrap()).unwrap_err().to_string();
    assert!(e.contains("once per") && e.contains("ebs-6h"), "{e}");
}
