//! Issue 41 item 5: the burst buffer's I/O nodes as EC2 instances, against
//! moto in server mode (EC2 behind surge-aws's fault proxy, which counts the
//! calls) with a fake agent (scripts/lib/fake-bb-agent.py) that does what a
//! node instance's user-data would: for each instance moto reports running
//! with the pool's tags it starts a local `surge bb node` and tags the
//! instance with its address; it kills the node when the instance is
//! terminated. Real redis-server and moto S3 behind the nodes (bb_support).
//!
//! Needs moto[server] and boto3 (python3), redis-server; built with `--features aws`.
#![cfg(feature = "aws")]

mod bb_support;
#[path = "../../surge-aws/tests/common/mod.rs"]
mod moto;

use bb_support::*;
use moto::{Moto, Proxy};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use surge_aws::instances::{LaunchSpec, PoolInstances, POOL_TAG, ROLE_BB_NODE, ROLE_TAG};
use surge_aws::{AwsConfig, OWNER_TAG};
use surge_bb::ec2::{Ec2Nodes, Ec2NodesConfig};
use surge_bb::pool::NodeProvider;

const OWNER: &str = "bb-test";
const AMI: &str = "ami-12c6146b";


fn aws(endpoint: &str) -> AwsConfig {
    AwsConfig {
        region: Some("us-east-1".into()),
        endpoint_url: Some(endpoint.into()),
        owner: OWNER.into(),
        poll: Duration::from_millis(100),
        max_attempts: 4,
        initial_backoff: Duration::from_millis(20),
        ..AwsConfig::default()
    }
}

fn nodes_config(endpoint: &str, pool: &str, serve_timeout: Duration) -> Ec2NodesConfig {
    Ec2NodesConfig {
        aws: aws(endpoint),
        pool: pool.into(),
        launch: LaunchSpec {
            image_id: Some(AMI.into()),
            instance_type: "r5.large".into(),
            user_data: Some(surge_bb::ec2::default_user_data("/usr/local/bin/surge", 7400, &[])),
            ..Default::default()
        },
        node_port: 7400,
        serve_timeout,
        sweep_every: Duration::ZERO,
    }
}


/// The fake agent, playing the node instances' boot.
struct Agent {
    child: Child,
}

impl Agent {
    fn start(moto: &Moto, pool: &str, bb: &Bb) -> Agent {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lib/fake-bb-agent.py");
        let out = std::fs::File::create(bb.dir.path().join(format!("agent-{pool}.log"))).unwrap();
        let err = std::fs::File::create(bb.dir.path().join(format!("agent-{pool}-stderr.log"))).unwrap();
        let child = Command::new("python3")
            .arg(script)
            .args([moto.url().as_str(), OWNER, pool, BIN, bb.dir.path().to_str().unwrap()])
            .args(bb.common())
            .args(["--memory", "64MiB", "--no-prefault"])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("SURGE_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("python3 scripts/lib/fake-bb-agent.py (needs boto3)");
        Agent { child }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Its stdin closing ends it; it kills its nodes first.
        drop(self.child.stdin.take());
        bb_support::exit_or_kill(&mut self.child, Duration::from_secs(10));
    }
}

/// EC2 as the test sees it, straight from moto.
struct Ec2 {
    url: String,
    instances: PoolInstances,
}

impl Ec2 {
    fn new(moto: &Moto) -> Ec2 {
        Ec2 { url: moto.url(), instances: PoolInstances::connect(&aws(&moto.url()), "any").unwrap() }
    }

    fn state(&self, id: &str) -> String {
        let v = self.instances.describe(&[id.to_string()]).unwrap();
        v.first().map_or("unknown".into(), |i| i.state.clone())
    }

    /// An instance with the pool's tags that the fake agent leaves alone
    /// (launched with boto3, as an earlier run or another tool would).
    fn run_ignored(&self, pool: &str) -> String {
        let script = format!(
            "import boto3\n\
             ec2 = boto3.client('ec2', region_name='us-east-1', endpoint_url='{}')\n\
             tags = [{{'Key': k, 'Value': v}} for k, v in [('{OWNER_TAG}', '{OWNER}'), ('{ROLE_TAG}', '{ROLE_BB_NODE}'), ('{POOL_TAG}', '{pool}'), ('surge:fake-agent', 'ignore')]]\n\
             i = ec2.run_instances(ImageId='{AMI}', MinCount=1, MaxCount=1, TagSpecifications=[{{'ResourceType': 'instance', 'Tags': tags}}])\n\
             print(i['Instances'][0]['InstanceId'])\n",
            self.url
        );
        let out = Command::new("python3").arg("-c").arg(script).env("AWS_ACCESS_KEY_ID", "testing").env("AWS_SECRET_ACCESS_KEY", "testing").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn live(tier: &surge_bb::tier::Tier) -> BTreeSet<String> {
    tier.forget_live_cache();
    tier.live_nodes().into_iter().collect()
}

fn serves(addr: &str) -> bool {
    std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(500)).is_ok()
}

fn wait_until(what: &str, timeout: Duration, bb: &Bb, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The provider on its own: it grows the pool by one RunInstances whose
/// nodes all serve, stops a drained node by terminating its instance (whose
/// process the agent then ends), and, restarted, adopts the nodes still
/// running without launching any, terminates an orphan of its pool (a
/// launch that never served) and leaves another pool's instance alone.
#[test]
fn ec2_nodes_grow_drain_terminate_restart_and_adopt() {
    moto::test_env();
    let bb = Bb::new("ec2", "256KiB");
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port);
    let ec2 = Ec2::new(&moto);
    let _agent = Agent::start(&moto, "p1", &bb);
    let tier = bb.tier();

    // Grow: three nodes, one call.
    let mut p = Ec2Nodes::connect(nodes_config(&proxy.url(), "p1", Duration::from_secs(30)), tier.clone()).unwrap();
    let addrs: Vec<String> = p.start_many(3).into_iter().map(|r| r.unwrap_or_else(|e| panic!("{e}\n{}", bb.logs()))).collect();
    assert_eq!(proxy.count("RunInstances"), 1, "the three nodes are launched together");
    assert_eq!(addrs.iter().collect::<BTreeSet<_>>().len(), 3, "{addrs:?}");
    let members = live(&tier);
    for a in &addrs {
        assert!(members.contains(a) && serves(a), "{a} must serve and be a member: {members:?}");
        let id = p.instance_of(a).unwrap().to_string();
        assert_eq!(ec2.state(&id), "running");
        assert!(p.running(a));
    }
    let listed = PoolInstances::connect(&aws(&moto.url()), "p1").unwrap().list().unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|i| i.instance_type == "r5.large" && i.node_addr.as_ref().is_some_and(|a| addrs.contains(a))), "{listed:?}");

    // Drain one, then stop it: its instance is terminated, its process gone.
    let victim = addrs[0].clone();
    let victim_id = p.instance_of(&victim).unwrap().to_string();
    surge_bb::drain::drain_node(&tier, &victim, Duration::from_secs(30), |_| {}).unwrap();
    p.stop(&victim);
    assert!(proxy.count("TerminateInstances") >= 1, "the provider terminated the instance");
    assert!(matches!(ec2.state(&victim_id).as_str(), "terminated" | "shutting-down"), "{}", ec2.state(&victim_id));
    assert!(!p.running(&victim));
    wait_until("the drained node's process ends", Duration::from_secs(10), &bb, || !serves(&victim));

    // An orphan of this pool (never serves) and another pool's instance.
    let orphan = ec2.run_ignored("p1");
    let other = ec2.run_ignored("p2");
    // Older than the serve timeout below (moto's launch times are in whole seconds).
    std::thread::sleep(Duration::from_millis(3500));

    // Restart: a new provider adopts the two nodes still running.
    drop(p);
    let runs = proxy.count("RunInstances");
    let mut p = Ec2Nodes::connect(nodes_config(&proxy.url(), "p1", Duration::from_secs(2)), tier.clone()).unwrap();
    let adopted: BTreeSet<String> = p.adopt(&live(&tier)).into_iter().collect();
    let rest: BTreeSet<String> = addrs[1..].iter().cloned().collect();
    assert_eq!(adopted, rest, "the running nodes are adopted\n{}", bb.logs());
    assert_eq!(proxy.count("RunInstances"), runs, "adopting launches nothing");
    assert!(matches!(ec2.state(&orphan).as_str(), "terminated" | "shutting-down"), "the orphan must be terminated: {}", ec2.state(&orphan));
    assert_eq!(ec2.state(&other), "running", "another pool's instance is not ours");
    assert!(p.adopt(&live(&tier)).is_empty(), "a node is adopted once");
    for a in &rest {
        assert!(p.running(a) && serves(a), "{a}");
    }

    // Stopped without a drain (the pool gave up on it): the agent kills the node.
    for a in &rest {
        let id = p.instance_of(a).unwrap().to_string();
        p.stop(a);
        assert!(matches!(ec2.state(&id).as_str(), "terminated" | "shutting-down"));
        wait_until("the node of a terminated instance ends", Duration::from_secs(10), &bb, || !serves(a));
    }
    assert!(PoolInstances::connect(&aws(&moto.url()), "p1").unwrap().list().unwrap().is_empty(), "nothing of the pool is left running");
}

/// Lines a process prints, collected by a thread.
fn collect_stdout(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().unwrap();
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    lines
}

fn pool_cmd(bb: &Bb, proxy: &Proxy, log: &str) -> Child {
    let log = std::fs::File::create(bb.dir.path().join(log)).unwrap();
    bb.cmd()
        .args(["bb", "pool", "--nodes", "ec2", "--min", "2", "--max", "2", "--interval", "200ms", "--instance", "r5.large"])
        .args(["--ec2-ami", AMI, "--ec2-endpoint", &proxy.url(), "--ec2-owner", OWNER, "--ec2-pool", "pp", "--ec2-serve-timeout", "30s"])
        .args(bb.common())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent/surge-test")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/surge-test")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `surge bb pool --nodes ec2` end to end: it starts its minimum as EC2
/// instances; killed (SIGKILL) and started again, it adopts them instead of
/// launching more; on SIGTERM it drains them and terminates their instances,
/// and their instance-hours are in its cost.
#[test]
fn the_pool_on_ec2_adopts_its_nodes_after_a_crash_and_terminates_them_on_stop() {
    moto::test_env();
    let bb = Bb::new("ec2pool", "256KiB");
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port);
    let _agent = Agent::start(&moto, "pp", &bb);
    let instances = PoolInstances::connect(&aws(&moto.url()), "pp").unwrap();
    let tier = bb.tier();

    let mut pool = pool_cmd(&bb, &proxy, "pool-1.log");
    wait_until("two nodes serve", Duration::from_secs(60), &bb, || live(&tier).len() == 2);
    let first = live(&tier);
    assert_eq!(instances.list().unwrap().len(), 2);
    assert_eq!(proxy.count("RunInstances"), 1);
    pool.kill().unwrap();
    pool.wait().unwrap();

    let mut pool = pool_cmd(&bb, &proxy, "pool-2.log");
    let out = collect_stdout(&mut pool);
    wait_until("both nodes adopted", Duration::from_secs(30), &bb, || out.lock().unwrap().iter().filter(|l| l.starts_with("pool: adopted")).count() == 2);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(proxy.count("RunInstances"), 1, "the restarted pool launched instances: {:?}\n{}", out.lock().unwrap(), bb.logs());
    assert_eq!(live(&tier), first);
    for a in &first {
        assert!(out.lock().unwrap().iter().any(|l| l.contains(a.as_str()) && l.starts_with("pool: adopted")), "{a}: {:?}", out.lock().unwrap());
    }

    unsafe { libc::kill(pool.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let exit = loop {
        if let Some(st) = pool.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the pool did not stop\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "pool exited with {exit}\n{}", bb.logs());
    std::thread::sleep(Duration::from_millis(300));
    let lines = out.lock().unwrap().clone();
    assert!(instances.list().unwrap().is_empty(), "every instance is terminated: {:?}", instances.list().unwrap());
    for a in &first {
        // Terminated by the pool after the drain (the agent also ends the
        // instance of a node that exits, as the user-data's poweroff would).
        let log = bb.log("pool-2.log");
        assert!(log.contains(&format!("pool: node {a} stopped: instance i-")), "{a}:\n{log}");
        wait_until("the node's process ends", Duration::from_secs(10), &bb, || !serves(a));
    }
    let stopped = lines.iter().find(|l| l.starts_with("pool: stopped;")).unwrap_or_else(|| panic!("{lines:?}"));
    let nodes_usd: f64 = stopped.split("(nodes $").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{stopped}"));
    // Two r5.large for at least their 60 s minimum.
    assert!(nodes_usd >= 2.0 * 0.126 * 60.0 / 3600.0 - 1e-5, "{stopped}");
}

/// EC2 without room for the whole growth: the provider asks once for all
/// (the SDK does not repeat the capacity refusal), then for as many as EC2
/// has room for. A launch whose node never joins the pool (no agent plays
/// this pool's boot) is reported and its instance terminated.
#[test]
fn ec2_nodes_short_of_capacity_or_never_serving_are_reported_and_cleaned() {
    moto::test_env();
    let bb = Bb::new("ec2faults", "256KiB");
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port);
    let ec2 = Ec2::new(&moto);
    let tier = bb.tier();
    let mut p = Ec2Nodes::connect(nodes_config(&proxy.url(), "silent", Duration::from_millis(1500)), tier).unwrap();
    proxy.add(moto::Rule::Fail { action: "RunInstances".into(), times: 1, status: 500, code: "InsufficientInstanceCapacity".into() });
    let start = Instant::now();
    let r = p.start_many(3);
    assert_eq!(proxy.count("RunInstances"), 2, "one refused call, not retried by the SDK, then one for fewer");
    assert_eq!(r.len(), 1, "moto starts the minimum asked for: 1 ({r:?})");
    let err = r[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("did not join the pool's membership within 1.5s") && err.contains("terminated it"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "the wait ends at the serve timeout");
    let id = err.split_whitespace().find(|w| w.starts_with("i-")).unwrap();
    assert!(matches!(ec2.state(id).as_str(), "terminated" | "shutting-down"), "{}", ec2.state(id));
    assert!(PoolInstances::connect(&aws(&moto.url()), "silent").unwrap().list().unwrap().is_empty());
}
