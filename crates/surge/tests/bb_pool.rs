//! Burst-buffer elasticity end to end (real redis-server, moto S3, FUSE,
//! node processes on loopback): draining a node that holds dirty chunks while
//! a client writes, a node restarted at the same address, and the pool daemon
//! growing and shrinking the pool.

mod bb_support;

use bb_support::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_bb::meta::{ChunkEntry, MetaStore};
use surge_bb::proto::ChunkId;

fn status(bb: &Bb) -> serde_json::Value {
    let (ok, out, err) = bb.run(&["status", "--json"]);
    assert!(ok, "status failed: {err}");
    serde_json::from_str(&out).unwrap()
}

fn dirty_of(st: &serde_json::Value, addr: &str) -> u64 {
    st["pool"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == addr).map_or(0, |n| n["dirty_bytes"].as_u64().unwrap())
}

/// Every acknowledged (fsynced) file is read straight from the S3 server and
/// compared, after write-back.
fn assert_all_in_s3(bb: &Bb, files: &[(String, Vec<u8>)]) {
    let s3 = bb.s3();
    for (name, data) in files {
        let got = s3.get(name).unwrap().unwrap_or_else(|| panic!("{name} is not in S3\n{}", bb.logs()));
        assert!(got.to_vec() == *data, "{name}: S3 object differs ({} vs {} bytes)", got.len(), data.len());
    }
}

/// A node holding dirty chunks (write-back held back) is drained while a
/// client keeps writing: `surge bb drain` reports it draining, the node hands
/// its chunks over and exits 0, and every acknowledged byte ends up in S3.
#[test]
fn draining_a_node_with_dirty_chunks_while_a_client_writes_loses_nothing() {
    drain_while_writing(Bb::new("drain", "256KiB"));
}

/// The same with etcd membership (drain progress is re-put under the lease).
#[test]
#[cfg(feature = "etcd")]
fn draining_with_etcd_membership_loses_nothing() {
    let mut bb = Bb::new("drain-etcd", "256KiB");
    let etcd = Etcd::start(bb.dir.path());
    bb.membership = format!("etcd:{}", etcd.url);
    drain_while_writing(bb);
}

fn drain_while_writing(mut bb: Bb) {
    bb.node_args = vec!["--writeback-delay".into(), "8s".into()];
    let mut nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let mut acked: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..6u64 {
        let data = pattern(i, 600_000 + 100_003 * i as usize);
        let mut f = fs::File::create(m.dir.join(format!("f{i}"))).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        acked.push((format!("f{i}"), data));
    }
    let st = status(&bb);
    let victim = nodes.iter().map(|n| n.addr.clone()).max_by_key(|a| dirty_of(&st, a)).unwrap();
    assert!(dirty_of(&st, &victim) > 0, "the victim must hold dirty chunks: {st}");

    // A client writes (and fsyncs) throughout the drain.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (m.dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut done = Vec::new();
            let mut i = 100u64;
            while !stop.load(Ordering::SeqCst) {
                let data = pattern(i, 300_000 + (i as usize % 7) * 50_000);
                let mut f = fs::File::create(dir.join(format!("g{i}"))).unwrap();
                f.write_all(&data).unwrap();
                f.sync_all().unwrap();
                done.push((format!("g{i}"), data));
                i += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            done
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut drain = bb.cmd().args(["bb", "drain", &victim, "--timeout", "60s"]).args(bb.common()).spawn().unwrap();
    let start = Instant::now();
    let mut seen_draining = false;
    let drain_ok = loop {
        if let Some(st) = drain.try_wait().unwrap() {
            break st.success();
        }
        assert!(start.elapsed() < Duration::from_secs(70), "drain did not finish\n{}", bb.logs());
        let st = status(&bb);
        for n in st["pool"]["nodes"].as_array().unwrap() {
            if n["addr"] == victim && n["state"].as_str().unwrap().starts_with("draining") {
                seen_draining = true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(drain_ok, "surge bb drain failed\n{}", bb.logs());
    assert!(seen_draining, "status never showed the node draining");
    let vi = nodes.iter().position(|n| n.addr == victim).unwrap();
    let exit = nodes[vi].wait_exit(Duration::from_secs(10)).expect("the drained node must exit");
    assert!(exit.success(), "drained node exited with {exit}");
    let st = status(&bb);
    assert!(st["pool"]["nodes"].as_array().unwrap().iter().all(|n| n["addr"] != victim), "the node must have left: {st}");
    // More writes after the node left, then stop the writer.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    acked.extend(writer.join().unwrap());
    assert!(acked.len() > 10, "the writer must have written during the drain");
    let logs = bb.logs();
    assert!(logs.contains("handed to"), "the drain must hand dirty chunks over:\n{logs}");
    bb.wait_persisted("/", Duration::from_secs(60));
    assert_all_in_s3(&bb, &acked);
    for (name, data) in &acked {
        assert!(fs::read(m.dir.join(name)).unwrap() == *data, "{name}: read back through the mount differs");
    }
}

/// A node killed and restarted at the same address within its lease is a new,
/// empty node: the other holder re-replicates to it, so killing that other
/// holder afterwards loses nothing. (Without the boot id, the restarted node
/// was taken as still holding its old copies and the data died with the other.)
#[test]
fn a_node_restarted_at_the_same_address_is_refilled() {
    let mut bb = Bb::new("restart", "256KiB");
    bb.node_args = vec!["--writeback-delay".into(), "12s".into()];
    let mut x = bb.node(&[]);
    let mut y = bb.node(&[]);
    let m = bb.mount("m", &[]);
    let mut acked = Vec::new();
    for i in 0..4u64 {
        let data = pattern(i, 500_000 + 77_777 * i as usize);
        let mut f = fs::File::create(m.dir.join(format!("f{i}"))).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        acked.push((format!("f{i}"), data));
    }
    let addr = x.addr.clone();
    x.kill9();
    let x2 = bb.node_at(&addr, &[]); // back before its 3 s lease lapsed
    assert_eq!(x2.addr, addr);
    let start = Instant::now();
    while !bb.logs().contains("dead:") && start.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1)); // let the pass finish every chunk
    y.kill9();
    bb.wait_persisted("/", Duration::from_secs(40));
    assert_all_in_s3(&bb, &acked);
    drop(x2);
}

fn pool_size(st: &serde_json::Value) -> (usize, usize) {
    let nodes = st["pool"]["nodes"].as_array().unwrap();
    let draining = nodes.iter().filter(|n| n["state"].as_str().unwrap().starts_with("draining")).count();
    (nodes.len(), draining)
}

/// `surge bb pool` starts its minimum, grows under a write burst (dirty
/// backlog held by a write-back delay), drains back to the minimum once the
/// backlog is written back, prices it all, and on SIGTERM drains its nodes.
#[test]
fn the_pool_grows_under_a_write_burst_and_shrinks_after_it() {
    let bb = Bb::new("pool", "1MiB");
    let log = fs::File::create(bb.dir.path().join("pool.log")).unwrap();
    let mut pool = bb
        .cmd()
        .args(["bb", "pool", "--min", "2", "--max", "4", "--node-memory", "48MiB", "--interval", "300ms", "--shrink-after", "3s"])
        .arg("--node-arg=--writeback-delay=4s")
        .args(bb.common())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let wait = |what: &str, timeout: Duration, f: &dyn Fn(&serde_json::Value) -> bool| -> serde_json::Value {
        let start = Instant::now();
        loop {
            let st = status(&bb);
            if f(&st) {
                return st;
            }
            assert!(start.elapsed() < timeout, "{what} not reached in {timeout:?}: {st}\n{}", bb.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait("the minimum of 2 nodes", Duration::from_secs(20), &|st| pool_size(st) == (2, 0));
    let m = bb.mount("m", &[]);
    let mut acked = Vec::new();
    let mut max_seen = 2;
    for i in 0..10u64 {
        let data = pattern(i, 4 << 20);
        let mut f = fs::File::create(m.dir.join(format!("f{i}"))).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        acked.push((format!("f{i}"), data));
        max_seen = max_seen.max(pool_size(&status(&bb)).0);
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = wait("growth beyond 2 nodes", Duration::from_secs(20), &|st| pool_size(st).0 > 2 || max_seen > 2);
    max_seen = max_seen.max(pool_size(&st).0);
    assert!(max_seen > 2, "the pool must grow under the burst");
    let st = wait("shrinking back to 2 nodes", Duration::from_secs(60), &|st| pool_size(st) == (2, 0) && st["dirty_chunks"] == 0);
    let cost = st["pool"]["cost_usd"].as_f64().expect("cost_usd from the pool daemon");
    // At least 2 r5.large for their 60 s minimum, plus the S3 PUTs of 40 MiB.
    assert!(cost >= 2.0 * 0.126 * 60.0 / 3600.0, "cost {cost}");
    assert!(st["pool"]["daemon"]["s3"]["puts"].as_u64().unwrap() >= 40, "{st}");
    let logs = bb.logs();
    assert!(logs.contains("pool 2 -> 3 nodes") || logs.contains("pool 2 -> 4 nodes"), "the growth must be logged:\n{logs}");
    assert!(logs.contains("-> 2 nodes"), "the shrink must be logged:\n{logs}");
    bb.wait_persisted("/", Duration::from_secs(30));
    assert_all_in_s3(&bb, &acked);
    // SIGTERM: the daemon drains and stops its nodes, then exits.
    unsafe { libc::kill(pool.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let exit = loop {
        if let Some(st) = pool.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the pool daemon did not stop\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "pool exited with {exit}\n{}", bb.logs());
    assert_eq!(pool_size(&status(&bb)).0, 0, "every node left");
    drop(m);
}

/// `--placement co-located` on two compute hosts (two loopback addresses,
/// `--launcher ''`: on this machine): one node per host, no more even under
/// a burst, billed no instance, their memory stated; every byte reaches S3.
#[test]
fn a_co_located_pool_puts_one_node_on_each_compute_host_and_bills_no_instance() {
    let bb = Bb::new("pool-colo", "1MiB");
    let log = fs::File::create(bb.dir.path().join("pool.log")).unwrap();
    let mut pool = bb
        .cmd()
        .args(["bb", "pool", "--min", "2", "--max", "4", "--node-memory", "48MiB", "--interval", "300ms", "--shrink-after", "3s"])
        .args(["--placement", "co-located", "--compute-host", "a=127.0.0.1", "--compute-host", "b=127.0.0.2", "--launcher", ""])
        .arg("--node-arg=--writeback-delay=2s")
        .args(bb.common())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let st = loop {
        let st = status(&bb);
        if pool_size(&st) == (2, 0) && st["pool"]["daemon"].is_object() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "2 co-located nodes not up: {st}\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut ips: Vec<String> = st["pool"]["nodes"].as_array().unwrap().iter().map(|n| n["addr"].as_str().unwrap().rsplit_once(':').unwrap().0.to_string()).collect();
    ips.sort();
    assert_eq!(ips, ["127.0.0.1", "127.0.0.2"], "one node per compute host: {st}");
    let m = bb.mount("m", &[]);
    let mut max_seen = 2;
    let acked = write_acked(&m, 10, 4 << 20);
    for _ in 0..10 {
        max_seen = max_seen.max(pool_size(&status(&bb)).0);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(max_seen, 2, "two hosts hold two nodes, whatever the demand");
    let d = &status(&bb)["pool"]["daemon"];
    assert_eq!(d["placement"], "co-located", "{d}");
    assert_eq!(d["max"], 2, "the maximum is the number of hosts: {d}");
    assert_eq!(d["usd_per_hour"].as_f64(), Some(0.0), "{d}");
    assert_eq!(d["compute_usd"].as_f64(), Some(0.0), "{d}");
    assert_eq!(d["colocated_memory_bytes"].as_u64(), Some(2 * 48 << 20), "{d}");
    bb.wait_persisted("/", Duration::from_secs(30));
    assert_all_in_s3(&bb, &acked);
    unsafe { libc::kill(pool.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    while pool.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(30), "the pool daemon did not stop\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(m);
}

/// Writes `n` files of about `size` bytes through the mount, each fsynced.
fn write_acked(m: &Mount, n: u64, size: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let data = pattern(i + 1000, size + 33_331 * i as usize);
            let mut f = fs::File::create(m.dir.join(format!("f{i}"))).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            (format!("f{i}"), data)
        })
        .collect()
}

/// The node with the most dirty bytes (the drain has the most to move).
fn most_dirty(bb: &Bb, nodes: &[Node]) -> String {
    let st = status(bb);
    let victim = nodes.iter().map(|n| n.addr.clone()).max_by_key(|a| dirty_of(&st, a)).unwrap();
    assert!(dirty_of(&st, &victim) > 0, "the victim must hold dirty chunks: {st}");
    victim
}

/// `surge bb drain ADDR` in the background.
fn start_drain(bb: &Bb, addr: &str) -> std::process::Child {
    bb.cmd().args(["bb", "drain", addr, "--timeout", "90s"]).args(bb.common()).spawn().unwrap()
}

fn wait_child(bb: &Bb, child: &mut std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(start.elapsed() < timeout, "not finished after {timeout:?}\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every acknowledged file reads back right through a mount started now.
fn assert_reads_back(bb: &Bb, name: &str, files: &[(String, Vec<u8>)]) {
    let m = bb.mount(name, &[]);
    for (f, data) in files {
        assert!(fs::read(m.dir.join(f)).unwrap() == *data, "{f}: read back through a new mount differs");
    }
}

/// With one copy per chunk, a drain target that dies right after taking
/// chunks over leaves them with no live holder: the draining node must notice
/// before it leaves, take them back and hand them to another node (before,
/// it left and the chunks were lost: never written back).
#[test]
fn a_drain_target_that_dies_after_taking_chunks_loses_nothing() {
    let mut bb = Bb::new("drain-dies", "256KiB");
    bb.replicas = 1;
    bb.node_args = vec!["--writeback-delay".into(), "10s".into()];
    // Everything is written to the victim alone; the targets join empty, so
    // the one killed holds nothing but what it took over.
    let mut nodes: Vec<Node> = vec![bb.node(&[])];
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 8, 700_000);
    let victim = most_dirty(&bb, &nodes);
    nodes.extend((0..2).map(|_| bb.node(&[])));
    let mut drain = start_drain(&bb, &victim);
    // Kill the first node the victim hands a chunk to, as soon as it has one.
    let start = Instant::now();
    let target = loop {
        let logs = bb.logs();
        if let Some(at) = logs.find(" handed to ") {
            break logs[at + " handed to ".len()..].split_whitespace().next().unwrap().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no chunk handed over\n{logs}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let ti = nodes.iter().position(|n| n.addr == target).unwrap_or_else(|| panic!("handed to an unknown node {target}"));
    nodes[ti].kill9();
    let st = wait_child(&bb, &mut drain, Duration::from_secs(100));
    assert!(st.success(), "surge bb drain failed\n{}", bb.logs());
    let vi = nodes.iter().position(|n| n.addr == victim).unwrap();
    assert!(nodes[vi].wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()), "the drained node must exit 0");
    bb.wait_persisted("/", Duration::from_secs(60));
    assert_all_in_s3(&bb, &acked);
    drop(m);
    assert_reads_back(&bb, "m2", &acked);
    assert!(bb.logs().contains("taken back"), "the chunks on the dead target must have been taken back:\n{}", bb.logs());
}

/// Accepts connections at `addr` and never answers (a hung host, as the
/// network sees it), for the rest of the test; counts who connects.
struct BlackHole {
    addr: String,
    connects: Arc<AtomicUsize>,
}

fn black_hole(addr: &str) -> BlackHole {
    let hole = std::net::TcpListener::bind(addr).unwrap();
    let addr = hole.local_addr().unwrap().to_string();
    let connects = Arc::new(AtomicUsize::new(0));
    let counted = connects.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hole.incoming() {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(c);
        }
    });
    BlackHole { addr, connects }
}

/// A drain target that hangs (registered live in membership, as a node does
/// at start, for `HUNG_LEASE`; accepts connections, never answers) costs the
/// drain one timeout, not one per chunk: the drain finishes well inside its
/// timeout, and nothing is lost. (A SIGSTOPped node would drop out of
/// membership after its 3 s lease, often before the drain tried it.)
#[test]
fn a_hung_drain_target_does_not_stall_the_drain() {
    const HUNG_LEASE: Duration = Duration::from_secs(30);
    let mut bb = Bb::new("drain-hung", "256KiB");
    // Long enough that the drain (one 10 s timeout) hands chunks over first.
    bb.node_args = vec!["--writeback-delay".into(), "15s".into()];
    let nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 12, 900_000);
    let victim = most_dirty(&bb, &nodes);
    let hole = black_hole("127.0.0.1:0");
    let hung = hole.addr.clone();
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    meta.register_node(&surge_bb::meta::NodeInfo::new(&hung, 256 << 20), HUNG_LEASE.as_millis() as u64).unwrap();
    let start = Instant::now();
    let mut drain = start_drain(&bb, &victim);
    let st = wait_child(&bb, &mut drain, Duration::from_secs(100));
    let took = start.elapsed();
    assert!(st.success(), "surge bb drain failed\n{}", bb.logs());
    let logs = bb.logs();
    assert!(logs.contains(&format!("to {hung}: I/O node {hung} did not answer")), "the drain must have tried the hung node:\n{logs}");
    // One connection (one 10 s timeout) per drain pass that still had
    // chunks to hand over, not one per chunk (there are about 40): counted,
    // not timed, so a loaded machine does not fail it.
    let tried = hole.connects.load(Ordering::SeqCst);
    eprintln!("the drain took {took:?} and connected {tried} times to the hung node");
    assert!(tried <= 3, "the drain connected {tried} times to the hung node: it waited on it for more than one chunk per pass\n{logs}");
    assert!(logs.contains("handed to"), "the drain must have handed chunks over, not waited for write-back");
    // The hung node's registration lapses; publishing waits a write-back
    // delay after each requeue: allow several.
    bb.wait_persisted("/", Duration::from_secs(120));
    assert_all_in_s3(&bb, &acked);
    drop(m);
    assert_reads_back(&bb, "m2", &acked);
}

/// After a drain, no chunk names the drained node as a holder, and reads
/// never wait for it: a listener that accepts and never answers is put at
/// its address, and a new mount reads every file without once connecting to
/// it (before, each persisted chunk tried the drained node first and waited
/// 10 s for it). Counted, not timed: a loaded machine made an 8 s bound fail.
#[test]
fn a_drained_node_is_gone_from_holder_lists_and_reads_do_not_wait_for_it() {
    let bb = Bb::new("drain-holders", "256KiB");
    let mut nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 6, 600_000);
    bb.wait_persisted("/", Duration::from_secs(60));
    drop(m);
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let holders = |addr: &str| -> usize {
        let mut n = 0;
        for (f, _) in &acked {
            let a = surge_bb::meta::resolve(&meta, f).unwrap();
            n += meta.chunk_map(a.ino).unwrap().values().filter(|e| e.holders.iter().any(|h| h == addr)).count();
        }
        n
    };
    let victim = nodes.iter().map(|n| n.addr.clone()).max_by_key(|a| holders(a)).unwrap();
    assert!(holders(&victim) > 0, "the victim must be listed as a holder before the drain");
    let mut drain = start_drain(&bb, &victim);
    assert!(wait_child(&bb, &mut drain, Duration::from_secs(60)).success(), "surge bb drain failed\n{}", bb.logs());
    let vi = nodes.iter().position(|n| n.addr == victim).unwrap();
    assert!(nodes[vi].wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()), "the drained node must exit 0");
    assert_eq!(holders(&victim), 0, "chunks still name the drained node {victim} as a holder");
    let hole = black_hole(&victim);
    let start = Instant::now();
    assert_reads_back(&bb, "m2", &acked);
    eprintln!("read back through a new mount in {:?}", start.elapsed());
    let tried = hole.connects.load(Ordering::SeqCst);
    assert_eq!(tried, 0, "reads connected {tried} times to the drained node's address\n{}", bb.logs());
}

/// Every chunk of `files` with its current entry, as metadata has it.
fn chunks_of(meta: &dyn MetaStore, files: &[(String, Vec<u8>)]) -> Vec<(ChunkId, ChunkEntry)> {
    let mut v = Vec::new();
    for (f, _) in files {
        let a = surge_bb::meta::resolve(meta, f).unwrap();
        v.extend(meta.chunk_map(a.ino).unwrap().into_iter().map(|(idx, e)| (ChunkId { ino: a.ino, idx, ver: e.ver }, e)));
    }
    v
}

/// The nodes rendezvous places chunk `c` on, among `nodes`, with 2 copies.
fn top2(nodes: &[String], c: &ChunkId) -> BTreeSet<String> {
    surge_bb::placement::rank(nodes, c).into_iter().take(2).map(String::from).collect()
}

fn holder_set(e: &ChunkEntry) -> BTreeSet<String> {
    e.holders.iter().cloned().collect()
}

/// S3 GET requests the nodes made so far.
fn node_s3_gets(bb: &Bb) -> u64 {
    status(bb)["nodes"].as_array().unwrap().iter().map(|n| n["stat"]["s3_gets"].as_u64().unwrap_or(0)).sum()
}

/// Waits until every chunk of `files` is held where rendezvous over `nodes`
/// puts it; returns whether a node was seen `rebalancing` meanwhile.
fn wait_placed(bb: &Bb, meta: &dyn MetaStore, files: &[(String, Vec<u8>)], nodes: &[String], timeout: Duration) -> bool {
    let start = Instant::now();
    let mut seen = false;
    loop {
        let st = status(bb);
        let states: Vec<&str> = st["pool"]["nodes"].as_array().unwrap().iter().map(|n| n["state"].as_str().unwrap()).collect();
        seen |= states.iter().any(|s| s.starts_with("rebalancing"));
        let placed = chunks_of(meta, files).iter().all(|(c, e)| holder_set(e) == top2(nodes, c));
        if placed && states.iter().all(|s| *s == "live") {
            return seen;
        }
        assert!(start.elapsed() < timeout, "chunks not placed after {timeout:?}: {states:?}\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node joins a pool whose chunks are all clean (written back): the old
/// nodes move to it exactly the chunks whose rendezvous top-2 set now
/// contains it, one copy each, and nothing else moves; `surge bb status`
/// shows them rebalancing; every file then reads back right from the nodes
/// with no S3 GET. (Before, a node that joined got only new chunks.)
#[test]
fn an_added_node_takes_exactly_its_share_of_the_clean_chunks() {
    let mut bb = Bb::new("rebalance", "256KiB");
    // Slow enough that status can see it, and the pacing is exercised.
    bb.node_args = vec!["--rebalance-rate".into(), "1MiB".into()];
    let nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 12, 700_000);
    bb.wait_persisted("/", Duration::from_secs(60));
    drop(m);
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let mut all: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let before = chunks_of(&meta, &acked);
    for (c, e) in &before {
        assert!(e.persisted && holder_set(e) == top2(&all, c), "chunk {c:?} must be clean on its rendezvous nodes: {e:?}");
    }
    let gets = node_s3_gets(&bb);

    let added = bb.node(&[]);
    all.push(added.addr.clone());
    let share = before.iter().filter(|(c, _)| top2(&all, c).contains(&added.addr)).count();
    // Rendezvous: the new node is in the top 2 of 4 for about half the chunks.
    assert!(share * 4 >= before.len() && share * 4 <= before.len() * 3, "share {share} of {}", before.len());
    let seen = wait_placed(&bb, &meta, &acked, &all, Duration::from_secs(60));
    assert!(seen, "status never showed a node rebalancing");

    let after = chunks_of(&meta, &acked);
    let pool = surge_bb::conn::NodePool::default();
    let mut moved = 0;
    for ((c, b), (c2, a)) in before.iter().zip(&after) {
        assert_eq!(c, c2, "a chunk version changed");
        let gained: Vec<&String> = a.holders.iter().filter(|h| !b.holders.contains(h)).collect();
        assert!(gained.iter().all(|h| **h == added.addr), "chunk {c:?} moved between old nodes: {:?} -> {:?}", b.holders, a.holders);
        moved += gained.len();
        for n in &all {
            assert_eq!(pool.has(n, *c).unwrap(), a.holders.contains(n), "{n} and chunk {c:?} (holders {:?})", a.holders);
        }
    }
    assert_eq!(moved, share, "exactly one copy of each chunk whose placement changed moves");
    assert_eq!(status(&bb)["pool"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == added.addr).unwrap()["chunks"], share);
    let logs = bb.logs();
    assert!(logs.contains("rebalance started") && logs.contains("rebalance done: moved"), "start and end lines:\n{logs}");

    // Every file reads back from the nodes: no S3 GET by the reader or a node.
    let tier = bb.tier();
    let client = surge_bb::client::Client::new(tier.clone(), Default::default()).unwrap();
    for (f, data) in &acked {
        let a = client.resolve(f).unwrap();
        let fh = client.open(a.ino).unwrap();
        assert!(client.read(a.ino, 0, data.len()).unwrap() == *data, "{f} reads back wrong");
        client.release(a.ino, fh).unwrap();
    }
    assert_eq!(tier.s3.as_ref().unwrap().counts.snapshot().1, 0, "the reads went to S3");
    assert_eq!(node_s3_gets(&bb), gets, "a node fetched from S3");
}

/// A node that moves a chunk to a node that joined keeps the chunk's memory
/// mapped, as a spare buffer for the next chunk it takes in: memory freed
/// instead would be faulted in again, page by page, by the next write burst.
/// The nodes map no memory ahead (`--no-prefault`), so their spares are
/// exactly the memory of chunks that left. (Before, the rebalance freed it:
/// a pool that had grown wrote measurably slower after its copies.)
#[test]
fn a_chunk_moved_to_an_added_node_leaves_its_memory_mapped_for_the_next_write() {
    const CHUNK: u64 = 256 << 10;
    let mut bb = Bb::new("rebalance-spares", "256KiB");
    bb.node_args = vec!["--no-prefault".into()];
    let nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    // Whole chunks only: spares are kept at the chunk size.
    let acked: Vec<(String, Vec<u8>)> = (0..8u64)
        .map(|i| {
            let data = pattern(i + 500, 2 * CHUNK as usize);
            let mut f = fs::File::create(m.dir.join(format!("w{i}"))).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            (format!("w{i}"), data)
        })
        .collect();
    bb.wait_persisted("/", Duration::from_secs(60));
    drop(m);
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let pool = surge_bb::conn::NodePool::default();
    let spares = |n: &Node| pool.stat(&n.addr).unwrap().spare_bytes;
    for n in &nodes {
        assert_eq!(spares(n), 0, "{}: no chunk has left yet", n.addr);
    }
    let before = chunks_of(&meta, &acked);

    let added = bb.node(&[]);
    let mut all: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    all.push(added.addr.clone());
    wait_placed(&bb, &meta, &acked, &all, Duration::from_secs(60));
    let after = chunks_of(&meta, &acked);
    for n in &nodes {
        let left = before.iter().zip(&after).filter(|((_, b), (_, a))| b.holders.contains(&n.addr) && !a.holders.contains(&n.addr)).count() as u64;
        assert_eq!(spares(n), left * CHUNK, "{}: {left} chunks left it; their memory must stay mapped", n.addr);
    }
    let moved: u64 = nodes.iter().map(spares).sum();
    assert!(moved > 0, "some chunk must have moved to the new node");
    assert_reads_back(&bb, "m2", &acked);
}

/// Chunks not yet written back stay where they are when a node joins (the
/// holder lists and the new node do not change), and move to it once they
/// are in S3. (Before, they never moved.)
#[test]
fn dirty_chunks_move_to_an_added_node_only_once_written_back() {
    let mut bb = Bb::new("rebalance-dirty", "256KiB");
    bb.node_args = vec!["--writeback-delay".into(), "8s".into()];
    let nodes: Vec<Node> = (0..2).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 6, 600_000);
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let before = chunks_of(&meta, &acked);
    let added = bb.node(&[]);
    std::thread::sleep(Duration::from_secs(2)); // several rebalance looks
    let during = chunks_of(&meta, &acked);
    assert!(during.iter().all(|(_, e)| !e.persisted), "the test needs the chunks still dirty: {during:?}");
    assert_eq!(before, during, "dirty chunks must not move");
    let st = status(&bb);
    assert_eq!(st["pool"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == added.addr).unwrap()["chunks"], 0);

    bb.wait_persisted("/", Duration::from_secs(60));
    let mut all: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    all.push(added.addr.clone());
    assert!(before.iter().any(|(c, _)| top2(&all, c).contains(&added.addr)), "some chunk must belong to the new node");
    wait_placed(&bb, &meta, &acked, &all, Duration::from_secs(60));
    drop(m);
    assert_reads_back(&bb, "m2", &acked);
}

/// A node joins while a client keeps writing: the old nodes, taking the
/// writes, leave their clean chunks where they are (their copies would take
/// the CPU and network the writes need), and move the new node's share
/// once the writes stop. (Before, the copies ran beside the writes.) The
/// quiet time is 3 s here, not the default 1 s, and the node joins once
/// the writer has written 10 files: a writer stalled for a second on a
/// loaded CI machine, or one that had not reached every node yet, is not
/// a node free of writes.
#[test]
fn a_rebalance_waits_until_its_node_takes_no_writes() {
    let mut bb = Bb::new("rebalance-quiet", "256KiB");
    bb.node_args = vec!["--rebalance-quiet".into(), "3s".into()];
    let nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 12, 700_000);
    bb.wait_persisted("/", Duration::from_secs(60));
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let before = chunks_of(&meta, &acked);

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = keep_writing(&m, &stop, &written);
    let start = Instant::now();
    while written.load(Ordering::SeqCst) < 10 {
        assert!(start.elapsed() < Duration::from_secs(30), "the writer wrote {} files in 30 s", written.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(20));
    }
    let added = bb.node(&[]);
    let mut all: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    all.push(added.addr.clone());
    assert!(before.iter().any(|(c, _)| top2(&all, c).contains(&added.addr)), "some chunk must belong to the new node");
    std::thread::sleep(Duration::from_secs(5)); // passes are due every 2 s
    let during = chunks_of(&meta, &acked);
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().unwrap();
    assert!(written >= 20, "the writer must have kept writing: {written} files");
    assert_eq!(before, during, "clean chunks moved while their nodes took writes\n{}", bb.logs());
    assert!(!bb.logs().contains("rebalance started"), "a rebalance started during the writes:\n{}", bb.logs());

    wait_placed(&bb, &meta, &acked, &all, Duration::from_secs(60));
    assert!(bb.logs().contains("rebalance done: moved"), "the share must move once the writes stop:\n{}", bb.logs());
    drop(m);
    assert_reads_back(&bb, "m2", &acked);
}

/// Writes files of 2-3 chunks every ~50 ms until `stop`: every node takes a
/// write far more often than once a second (the default --rebalance-quiet).
/// Counts the files written in `written`; joins to the number.
fn keep_writing(m: &Mount, stop: &Arc<AtomicBool>, written: &Arc<AtomicU64>) -> std::thread::JoinHandle<u64> {
    let (dir, stop, written) = (m.dir.clone(), stop.clone(), written.clone());
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let mut f = fs::File::create(dir.join(format!("w{}", i % 20))).unwrap();
            f.write_all(&pattern(i, 600_000)).unwrap();
            f.sync_all().unwrap();
            i += 1;
            written.store(i, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        }
        i
    })
}

/// Node states in `surge bb status`.
fn node_states(bb: &Bb) -> Vec<String> {
    status(bb)["pool"]["nodes"].as_array().unwrap().iter().map(|n| n["state"].as_str().unwrap().to_string()).collect()
}

/// A rebalance under way stops when its node starts taking writes, status
/// says so, and it finishes once the writes stop.
#[test]
fn a_rebalance_under_way_pauses_while_its_node_takes_writes() {
    let mut bb = Bb::new("rebalance-pause", "256KiB");
    bb.node_args = vec!["--rebalance-rate".into(), "256KiB".into()]; // seconds to move the share
    let nodes: Vec<Node> = (0..3).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &[]);
    let acked = write_acked(&m, 12, 700_000);
    bb.wait_persisted("/", Duration::from_secs(60));
    let meta = surge_bb::meta::redis::RedisMeta::connect(&bb.redis.url(), "default").unwrap();
    let added = bb.node(&[]);
    let mut all: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    all.push(added.addr.clone());

    let start = Instant::now();
    while !node_states(&bb).iter().any(|s| s.starts_with("rebalancing")) {
        assert!(start.elapsed() < Duration::from_secs(20), "no rebalance started: {:?}\n{}", node_states(&bb), bb.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = keep_writing(&m, &stop, &written);
    let start = Instant::now();
    let mut paused = false;
    while !paused && start.elapsed() < Duration::from_secs(10) {
        paused = node_states(&bb).iter().any(|s| s.ends_with("(paused: taking writes)"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let states = node_states(&bb);
    // The pause can show before the writer's fifth file (a loaded machine):
    // the writes must go on past it, not be held up by the rebalance.
    let start = Instant::now();
    while written.load(Ordering::SeqCst) < 5 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    assert!(writer.join().unwrap() >= 5, "the writer must have kept writing");
    assert!(paused, "status never showed a rebalance paused for writes: {states:?}\n{}", bb.logs());

    wait_placed(&bb, &meta, &acked, &all, Duration::from_secs(90));
    assert!(node_states(&bb).iter().all(|s| s == "live"), "{:?}", node_states(&bb));
    drop(m);
    assert_reads_back(&bb, "m2", &acked);
}
