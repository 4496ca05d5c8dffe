//! The Rust client API against a real redis-server and in-process I/O nodes
//! (no S3): concurrent writers of one chunk, replication, read-after-write.

use std::sync::Arc;
use surge_bb::client::{Client, ClientConfig, Fh};
use surge_bb::local::{LocalCluster, LocalRedis};
use surge_bb::meta::{Kind, ROOT};
use surge_bb::node::{self, NodeConfig};
use surge_bb::store::StoreConfig;
use surge_bb::tier::{Tier, TierConfig};
use surge_bb::writeback::WritebackConfig;

struct Setup {
    _dir: tempfile::TempDir,
    _redis: Server,
    tier: Arc<Tier>,
    cfg: TierConfig,
    nodes: Vec<node::NodeHandle>,
}

/// The metadata's server: a single Redis, or a secured 3-master Redis Cluster.
#[allow(dead_code)]
enum Server {
    Single(LocalRedis),
    Cluster(LocalCluster),
}

/// An in-process I/O node of `capacity` bytes, without S3.
fn start_node(cfg: &TierConfig, capacity: u64) -> node::NodeHandle {
    let c = NodeConfig {
        listen: "127.0.0.1:0".into(),
        store: StoreConfig { capacity, spill_dir: None, spill_capacity: 0 },
        writeback: WritebackConfig::default(),
        rebalance: Default::default(),
        prefault: true,
        tls: None,
        insecure: false,
    };
    node::start(c, cfg.open().unwrap()).unwrap()
}

fn setup(nodes: usize) -> Setup {
    setup_with_capacity(nodes, 64 << 20)
}

fn setup_with_capacity(nodes: usize, capacity: u64) -> Setup {
    setup_on(false, nodes, capacity)
}

/// Metadata on a Redis Cluster instead.
fn setup_on_cluster(nodes: usize) -> Setup {
    setup_on(true, nodes, 64 << 20)
}

fn setup_on(cluster: bool, nodes: usize, capacity: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (redis, url, auth) = if cluster {
        let c = LocalCluster::start_free(&dir.path().join("cluster"), 3, true).expect("redis-server and redis-cli (scripts/test-all.sh installs them)");
        let (url, auth) = (c.url(), c.auth());
        (Server::Cluster(c), url, auth)
    } else {
        let port = surge_bb::local::free_port().unwrap();
        let r = LocalRedis::start(&dir.path().join("redis"), port).expect("redis-server (scripts/test-all.sh installs it)");
        let (url, auth) = (r.url(), r.auth());
        (Server::Single(r), url, auth)
    };
    let access = surge_bb::tier::Access { redis: auth, ..Default::default() };
    let cfg = TierConfig { redis: url, fs: "t".into(), membership: "redis".into(), s3: None, replicas: 2, chunk_size: 64 << 10, access };
    let tier = cfg.open().unwrap();
    let nodes = (0..nodes).map(|_| start_node(&cfg, capacity)).collect();
    Setup { _dir: dir, _redis: redis, tier, cfg, nodes }
}

/// The consistency tests below run on a single Redis and on a Redis Cluster.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod single { $( #[test] fn $name() { super::$name(super::setup) } )* }
        mod cluster { $( #[test] fn $name() { super::$name(super::setup_on_cluster) } )* }
    };
}

on_both!(
    concurrent_writers_of_one_chunk_lose_no_bytes,
    flushed_writes_are_replicated_and_read_by_other_clients,
    cached_reads_never_serve_versions_older_than_our_commits_or_the_last_open,
);

/// Two clients writing interleaved bytes of the same chunks at the same
/// time: the compare-and-set commit makes the loser merge, so no byte is lost.
fn concurrent_writers_of_one_chunk_lose_no_bytes(setup: fn(usize) -> Setup) {
    let s = setup(3);
    let a = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let b = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let f = a.create(ROOT, "shared", Kind::File, 0o644, 0, 0).unwrap().ino;
    let rounds = 40u64;
    let piece = 1000u64;
    let writer = |c: Arc<Client>, parity: u64, byte: u8| {
        let fh = c.open(f).unwrap();
        std::thread::spawn(move || {
            for r in 0..rounds {
                let off = (2 * r + parity) * piece;
                c.write(f, fh, off, &vec![byte; piece as usize]).unwrap();
                c.flush(f, fh).unwrap();
            }
        })
    };
    let (ta, tb) = (writer(a.clone(), 0, b'a'), writer(b.clone(), 1, b'b'));
    ta.join().unwrap();
    tb.join().unwrap();
    let got = a.read(f, 0, (2 * rounds * piece) as usize).unwrap();
    assert_eq!(got.len() as u64, 2 * rounds * piece);
    for (i, chunk) in got.chunks(piece as usize).enumerate() {
        let want = if i % 2 == 0 { b'a' } else { b'b' };
        assert!(chunk.iter().all(|&x| x == want), "piece {i} lost a writer's bytes");
    }
}

/// Writers fill chunks in memory mapped ahead (the write-behind budget, at
/// idle priority), and chunks the cache evicts give their memory back for
/// later writes; the bytes written are what another client reads.
#[test]
fn writes_fill_spare_memory_and_evicted_chunks_give_it_back() {
    let s = setup(2);
    let cs = 64 << 10;
    // Chunk memory: the write-behind budget plus the cache, 6 chunks.
    let c = Client::new(s.tier.clone(), ClientConfig { write_behind: 4 * cs, cache: 2 * cs, ..Default::default() }).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while c.spare_bytes() < 6 * cs {
        assert!(std::time::Instant::now() < deadline, "chunk buffers not mapped: {} bytes", c.spare_bytes());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let a: Vec<u8> = (0..2 * cs).map(|i| (i % 251) as u8).collect();
    let b: Vec<u8> = (0..2 * cs).map(|i| (i % 241) as u8).collect();
    c.write_file("/a", &a).unwrap();
    assert_eq!(c.spare_bytes(), 4 * cs, "each chunk of /a took a spare buffer");
    c.write_file("/b", &b).unwrap();
    assert_eq!(c.spare_bytes(), 4 * cs, "/b took two more; evicting /a's chunks from the cache gave two back");
    let other = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    assert!(other.read_file("/a").unwrap() == a);
    assert!(other.read_file("/b").unwrap() == b);
}

/// A chunk fetched from a node is read into the reader's mapped spare memory
/// (fresh memory is slow to touch), not into new memory.
#[test]
fn fetched_chunks_are_read_into_spare_memory() {
    let s = setup(2);
    let cs = 64 << 10;
    let writer = Client::new(s.tier.clone(), ClientConfig { prefault: false, ..Default::default() }).unwrap();
    let a: Vec<u8> = (0..2 * cs).map(|i| (i % 239) as u8).collect();
    writer.write_file("/a", &a).unwrap();
    let reader = Client::new(s.tier.clone(), ClientConfig { write_behind: 2 * cs, cache: 2 * cs, ..Default::default() }).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while reader.spare_bytes() < 4 * cs {
        assert!(std::time::Instant::now() < deadline, "chunk buffers not mapped: {} bytes", reader.spare_bytes());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(reader.read_file("/a").unwrap() == a);
    assert_eq!(reader.chunk_fetches(), 2);
    assert_eq!(reader.spare_bytes(), 2 * cs, "each fetched chunk took a spare buffer");
}

/// Evicted chunks' memory is kept only while the cache and the spares fit
/// the chunk memory (write-behind budget plus cache): a reader whose cache
/// turns over many times keeps no more.
#[test]
fn spare_memory_never_grows_past_the_chunk_memory() {
    let s = setup(2);
    let cs = 64 << 10;
    let writer = Client::new(s.tier.clone(), ClientConfig { prefault: false, ..Default::default() }).unwrap();
    let names = ["/a", "/b", "/c", "/d"];
    for (i, name) in names.iter().enumerate() {
        writer.write_file(name, &vec![i as u8; 2 * cs as usize]).unwrap();
    }
    let reader = Client::new(s.tier.clone(), ClientConfig { write_behind: cs, cache: 2 * cs, prefault: false, ..Default::default() }).unwrap();
    for (i, name) in names.iter().enumerate() {
        assert!(reader.read_file(name).unwrap() == vec![i as u8; 2 * cs as usize]);
        // The cache holds the last 2 chunks read: 1 chunk of room is left.
        assert_eq!(reader.spare_bytes(), if i == 0 { 0 } else { cs }, "after {name}");
    }
}

/// A flushed write is on two distinct nodes and visible to another client at once.
fn flushed_writes_are_replicated_and_read_by_other_clients(setup: fn(usize) -> Setup) {
    let s = setup(3);
    let a = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let b = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let ino = a.write_file("/f", &data).unwrap();
    for (idx, e) in s.tier.meta.chunk_map(ino).unwrap() {
        assert_eq!(e.holders.len(), 2, "chunk {idx}: {:?}", e.holders);
        assert_ne!(e.holders[0], e.holders[1]);
    }
    assert!(b.read_file("/f").unwrap() == data);
    // Overwrite a range through a: b's next read sees it (no stale cache).
    let fa = a.open(ino).unwrap();
    a.write(ino, fa, 70_000, b"NEW BYTES").unwrap();
    a.flush(ino, fa).unwrap();
    b.open(ino).unwrap();
    assert_eq!(b.read(ino, 70_000, 9).unwrap(), b"NEW BYTES");
    // Truncate through b, extend again: the cut bytes must read as zeros.
    b.truncate(ino, 70_004).unwrap();
    b.truncate(ino, 80_000).unwrap();
    let got = a.read(ino, 70_000, 10_000).unwrap();
    assert_eq!(&got[..4], b"NEW ");
    assert!(got[4..].iter().all(|&x| x == 0));
}

/// Two nodes of two 64 KiB chunks each, two copies: two chunks fit. A client
/// with `cfg`, the file "big" and a descriptor of it.
fn room_for_two_chunks(cfg: ClientConfig) -> (Setup, Arc<Client>, u64, Fh) {
    let s = setup_with_capacity(2, 128 << 10);
    // Nothing here frees room (no S3, no new nodes): no waiting for it.
    let a = Client::new(s.tier.clone(), ClientConfig { full_wait: std::time::Duration::ZERO, ..cfg }).unwrap();
    let f = a.create(ROOT, "big", Kind::File, 0o644, 0, 0).unwrap().ino;
    let fh = a.open(f).unwrap();
    (s, a, f, fh)
}

/// A background flush that failed (nodes full) is reported by the next write
/// and still by fsync: the kernel turns a failed WRITE after bytes it already
/// sent into a short count and drops the error, so a write must not clear it.
#[test]
fn an_error_reported_by_a_write_is_reported_again_by_fsync() {
    let (_s, a, f, fh) = room_for_two_chunks(ClientConfig::default());
    // Four whole chunks: flushed in the background, two fail with "full".
    a.write(f, fh, 0, &vec![7u8; 4 << 16]).unwrap();
    let _ = a.read(f, 0, 1); // waits for the background flushes
    let e = a.write(f, fh, 4 << 16, b"x").expect_err("the failed background flush is reported");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let e = a.fsync(f, fh).expect_err("fsync must report the failed flush too");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
}

/// A write over the write-behind budget flushes the file itself; when that
/// flush fails, the write reports it and so must fsync (the kernel may turn
/// the failed WRITE into a short count and drop the error, and the failed
/// chunks are no longer buffered).
#[test]
fn a_flush_failed_under_write_behind_backpressure_is_reported_by_fsync() {
    let (_s, a, f, fh) = room_for_two_chunks(ClientConfig { write_behind: 100 << 10, ..ClientConfig::default() });
    a.write(f, fh, 0, &vec![1u8; 2 << 16]).unwrap();
    a.fsync(f, fh).unwrap(); // the nodes are full now
    // Partial chunks stay buffered until the budget is exceeded.
    a.write(f, fh, 2 << 16, &vec![2u8; 60 << 10]).unwrap();
    let e = a.write(f, fh, 3 << 16, &vec![3u8; 60 << 10]).expect_err("the flush that makes room fails");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let e = a.fsync(f, fh).expect_err("fsync must report the failed flush too");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
}

/// A background flush error that a write under backpressure reports reaches
/// fsync unchanged: the same errno and the same words, not wrapped again.
#[test]
fn a_stored_flush_error_reaches_fsync_unwrapped() {
    let (_s, a, f, fh) = room_for_two_chunks(ClientConfig { write_behind: 100 << 10, ..ClientConfig::default() });
    // Four whole chunks, over the budget: the write waits for the background
    // flushes, two of which fail with "full", and reports that.
    let by_write = a.write(f, fh, 0, &vec![5u8; 4 << 16]).expect_err("two chunks cannot be stored");
    let by_fsync = a.fsync(f, fh).expect_err("fsync reports it again");
    assert_eq!((by_write.errno(), by_fsync.errno()), (libc::ENOSPC, libc::ENOSPC));
    assert_eq!(by_write.to_string(), by_fsync.to_string());
    let text = by_fsync.to_string();
    assert_eq!(text.matches("could not be stored").count(), 1, "{text}");
    assert!(text.contains("full"), "{text}");
    a.fsync(f, fh).expect("reported once to fsync, then cleared");
}

/// close() of another copy of the descriptor (FLUSH; a forked child's exec
/// closes its inherited copy) reports a failed background flush but does not
/// clear it: the writer's fsync still gets it.
#[test]
fn a_close_by_another_descriptor_does_not_swallow_the_writers_error() {
    let (_s, a, f, fh) = room_for_two_chunks(ClientConfig::default());
    a.write(f, fh, 0, &vec![9u8; 4 << 16]).unwrap(); // two of four chunks will not fit
    let e = a.flush(f, fh).expect_err("the close sees the failed flush");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let e = a.fsync(f, fh).expect_err("the writer's fsync must still see it");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
}

/// Every descriptor's fsync is told of a failed flush once (Linux's errseq_t
/// semantics), not only the first fsync on the file: a second descriptor (a
/// database's checkpointer fsyncs files other processes wrote) got success
/// for chunks never stored once the writer's fsync had taken the error.
#[test]
fn every_descriptors_fsync_is_told_of_a_failed_flush_once() {
    let (_s, a, f, writer) = room_for_two_chunks(ClientConfig::default());
    let other = a.open(f).unwrap();
    a.write(f, writer, 0, &vec![4u8; 4 << 16]).unwrap(); // two of four chunks will not fit
    let e = a.fsync(f, writer).expect_err("the writer's fsync");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let e = a.fsync(f, other).expect_err("the other descriptor's fsync must be told too");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    a.fsync(f, writer).expect("told once");
    a.fsync(f, other).expect("told once");
    let late = a.open(f).unwrap();
    a.fsync(f, late).expect("opened after the error was reported: nothing to tell");
    a.write(f, writer, 0, b"after").expect("a descriptor that was told writes again");
}

/// A descriptor opened after a flush failed, before any fsync was told of it,
/// is told at its fsync (the writer may have closed without looking).
#[test]
fn a_descriptor_opened_before_anyone_was_told_is_told() {
    let (_s, a, f, writer) = room_for_two_chunks(ClientConfig::default());
    a.write(f, writer, 0, &vec![6u8; 4 << 16]).unwrap();
    let _ = a.read(f, 0, 1); // waits for the background flushes
    let checkpointer = a.open(f).unwrap();
    let e = a.fsync(f, checkpointer).expect_err("nobody was told yet");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let e = a.fsync(f, writer).expect_err("the writer still is");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
}

/// truncate reports only the failures of flushes it waited for: an older
/// error belongs to the descriptors' fsyncs, and truncate took it from them
/// (an open with O_TRUNC by another process made the writer's fsync succeed).
#[test]
fn a_truncate_does_not_take_an_older_error_from_fsync() {
    let (_s, a, f, fh) = room_for_two_chunks(ClientConfig::default());
    a.write(f, fh, 0, &vec![8u8; 4 << 16]).unwrap();
    let _ = a.read(f, 0, 1); // waits for the background flushes
    a.truncate(f, 0).expect("the failure is older than this truncate");
    let e = a.fsync(f, fh).expect_err("the writer's fsync must still be told");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
}

/// An fsync racing a close of another descriptor (both flush the file) returns
/// only once the buffered write is committed, whichever call took the buffer:
/// a second client reads it right after. Before the fix the fsync found
/// nothing buffered and returned while the close was still committing (the
/// stale read seen by bb.rs `read_after_write_between_two_mounts` in CI).
#[test]
fn fsync_racing_a_close_returns_after_the_commit() {
    let s = setup(2);
    let a = Arc::new(Client::new(s.tier.clone(), ClientConfig::default()).unwrap());
    let b = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let f = a.create(ROOT, "f", Kind::File, 0o644, 0, 0).unwrap().ino;
    let fh = a.open(f).unwrap();
    b.open(f).unwrap();
    for round in 0..100u64 {
        let data = vec![round as u8 + 1; 3000];
        let off = (round % 40) * 4096;
        a.write(f, fh, off, &data).unwrap();
        let closer = {
            let a = a.clone();
            std::thread::spawn(move || a.flush(f, fh))
        };
        a.fsync(f, fh).unwrap();
        assert_eq!(b.read(f, off, data.len()).unwrap(), data, "round {round}: fsync returned before the commit");
        closer.join().unwrap().unwrap();
    }
}

/// Membership that panics when `armed`: a stand-in for a bug inside a flush
/// (storing a chunk asks it for the live nodes).
struct PanicWhenArmed {
    nodes: Vec<surge_bb::meta::NodeInfo>,
    armed: std::sync::atomic::AtomicBool,
}

impl surge_bb::membership::Membership for PanicWhenArmed {
    fn heartbeat(&self, _: &surge_bb::meta::NodeInfo) -> Result<(), surge_bb::membership::MembershipError> {
        Ok(())
    }
    fn live(&self) -> Result<Vec<surge_bb::meta::NodeInfo>, surge_bb::membership::MembershipError> {
        assert!(!self.armed.load(std::sync::atomic::Ordering::SeqCst), "membership bug");
        Ok(self.nodes.clone())
    }
    fn leave(&self, _: &str) -> Result<(), surge_bb::membership::MembershipError> {
        Ok(())
    }
}

/// `fsync` on another thread; panics with `why` if it has not returned in 30 s.
fn fsync_or_hang(a: &Arc<Client>, f: u64, fh: Fh, why: &str) -> surge_bb::client::Result<()> {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let a = a.clone();
    std::thread::spawn(move || done_tx.send(a.fsync(f, fh)).unwrap());
    done_rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_else(|_| panic!("fsync hung: {why}"))
}

/// A flush that panics (a bug) fails the file with EIO instead of leaving
/// the flush counted in flight, which would make every later fsync and close
/// wait forever; the client's one worker thread survives it and the file
/// takes writes again.
#[test]
fn a_panic_in_a_flush_is_an_eio_not_a_hang() {
    use std::sync::atomic::Ordering;
    let s = setup(2);
    let members = Arc::new(PanicWhenArmed { nodes: s.tier.live_info(), armed: false.into() });
    let tier = Arc::new(Tier::new(s.tier.meta.clone(), members.clone(), None, 2).unwrap());
    let a = Client::new(tier.clone(), ClientConfig { threads: 1, ..ClientConfig::default() }).unwrap();
    let f = a.create(ROOT, "f", Kind::File, 0o644, 0, 0).unwrap().ino;
    let fh = a.open(f).unwrap();
    members.armed.store(true, Ordering::SeqCst);
    tier.forget_live_cache();
    // One whole chunk (64 KiB) goes to a background flush on the one worker.
    a.write(f, fh, 0, &vec![1u8; 64 << 10]).unwrap();
    let e = fsync_or_hang(&a, f, fh, "after a panicking flush").expect_err("the panicked flush is reported");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(e.to_string().contains("panicked"), "{e}");
    members.armed.store(false, Ordering::SeqCst);
    tier.forget_live_cache();
    // The worker still runs background flushes: a second whole chunk.
    a.write(f, fh, 0, &vec![2u8; 64 << 10]).unwrap();
    fsync_or_hang(&a, f, fh, "the worker died with the panic").expect("the rewrite is stored");
    assert_eq!(a.read(f, 0, 64 << 10).unwrap(), vec![2u8; 64 << 10]);
}

/// Readers that want the same chunk at once (the kernel reads a chunk in
/// several pieces in parallel; a prefetch races the reader it runs ahead of)
/// wait for one fetch of it: every chunk moves from the nodes once.
#[test]
fn a_chunk_wanted_by_several_readers_at_once_is_fetched_once() {
    let s = setup(3);
    let writer = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let chunks = 8u64;
    let cs = writer.chunk_size();
    let data: Vec<u8> = (0..chunks * cs).map(|i| (i * 13 % 251) as u8).collect();
    let ino = writer.write_file("/f", &data).unwrap();
    let piece = 8 << 10;
    let pieces = data.len() / piece;

    // Eight threads, thread t reading pieces t, t + 8, ...: all eight start
    // on chunk 0 together.
    let parallel = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (c, data) = (parallel.clone(), data.clone());
            std::thread::spawn(move || {
                for p in (t..pieces).step_by(8) {
                    let got = c.read(ino, (p * piece) as u64, piece).unwrap();
                    assert!(got == data[p * piece..(p + 1) * piece], "piece {p}");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(parallel.chunk_fetches(), chunks, "parallel readers fetched some chunk twice");

    // One sequential reader of an open file: the prefetches run ahead of it.
    let sequential = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    sequential.open(ino).unwrap();
    for p in 0..pieces {
        assert!(sequential.read(ino, (p * piece) as u64, piece).unwrap() == data[p * piece..(p + 1) * piece], "piece {p}");
    }
    assert_eq!(sequential.chunk_fetches(), chunks, "a prefetch and its reader fetched some chunk twice");
}

/// Close-to-open reads from memory: once an open file's chunks are read,
/// later reads are answered from the cache without asking metadata, but
/// never with bytes older than this client's own commits or than the last
/// open (another client's close is seen by every later open, also of a
/// descriptor opened beside one still open).
fn cached_reads_never_serve_versions_older_than_our_commits_or_the_last_open(setup: fn(usize) -> Setup) {
    let s = setup(3);
    let a = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let b = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let cs = a.chunk_size() as usize;
    let old = vec![b'o'; 2 * cs];
    let ino = a.write_file("/f", &old).unwrap();

    let fb = b.open(ino).unwrap();
    assert!(b.read_cached(ino, 0, 100).is_none(), "nothing read since the open: metadata must be asked");
    assert_eq!(b.read(ino, 0, 2 * cs).unwrap(), old);
    let hit = b.read_cached(ino, 10, 100).expect("a chunk read since the open is served from memory");
    assert_eq!(hit.as_slice(), &old[10..110]);
    let across = b.read_cached(ino, cs as u64 - 5, 10).expect("two cached chunks");
    assert_eq!(across.as_slice(), &old[cs - 5..cs + 5]);
    assert!(b.read_cached(ino, 2 * cs as u64, 10).unwrap().as_slice().is_empty(), "at the end of file");

    // Our own write, flushed: the cached version of that chunk is not used again.
    b.write(ino, fb, 20, b"mine").unwrap();
    assert!(b.read_cached(ino, 20, 4).is_none(), "buffered bytes of ours: the full read path");
    b.flush(ino, fb).unwrap();
    match b.read_cached(ino, 20, 4) {
        Some(d) => assert_eq!(d.as_slice(), b"mine"),
        None => assert_eq!(b.read(ino, 20, 4).unwrap(), b"mine"),
    }

    // Another client's close, then a new open here (the first still open).
    let fa = a.open(ino).unwrap();
    a.write(ino, fa, 5000, b"theirs").unwrap();
    a.release(ino, fa).unwrap();
    let fb2 = b.open(ino).unwrap();
    assert!(b.read_cached(ino, 5000, 6).is_none(), "versions read before this open must not be used");
    assert_eq!(b.read(ino, 5000, 6).unwrap(), b"theirs");
    assert_eq!(b.read_cached(ino, 5000, 6).expect("read since the open").as_slice(), b"theirs");
    b.release(ino, fb2).unwrap();
    b.release(ino, fb).unwrap();
    assert!(b.read_cached(ino, 0, 10).is_none(), "a file no longer open is never served from memory");
}

/// Full nodes hold a flush until room appears (here: the pool grows while
/// the writer waits), as a write-back cache holds writers while it cleans;
/// the fsync then succeeds with every byte stored twice.
#[test]
fn a_flush_waits_for_room_when_the_nodes_are_full() {
    let mut s = setup_with_capacity(2, 128 << 10);
    let a = Client::new(s.tier.clone(), ClientConfig { full_wait: std::time::Duration::from_secs(30), ..ClientConfig::default() }).unwrap();
    let f = a.create(ROOT, "big", Kind::File, 0o644, 0, 0).unwrap().ino;
    let fh = a.open(f).unwrap();
    let cs = a.chunk_size() as usize;
    let data: Vec<u8> = (0..4 * cs).map(|i| (i % 253) as u8).collect();
    a.write(f, fh, 0, &data).unwrap();
    // Two of the four chunks fit; the pool grows after the flushes found it full.
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.nodes.extend((0..2).map(|_| start_node(&s.cfg, 128 << 10)));
    a.fsync(f, fh).expect("the flushes waiting for room must succeed once the pool grew");
    assert!(a.read(f, 0, data.len()).unwrap() == data);
    for (idx, e) in s.tier.meta.chunk_map(f).unwrap() {
        assert_eq!(e.holders.len(), 2, "chunk {idx}: {:?}", e.holders);
    }
}

/// A fetch that fails leaves no reader waiting on it: readers of a chunk no
/// node holds any more (and no S3) all get the error, none hangs, and a
/// later read tries again.
#[test]
fn readers_waiting_on_a_failed_fetch_get_the_error_not_a_hang() {
    let s = setup(2);
    let writer = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let data = vec![7u8; writer.chunk_size() as usize];
    let ino = writer.write_file("/f", &data).unwrap();
    for (idx, e) in s.tier.meta.chunk_map(ino).unwrap() {
        for h in &e.holders {
            s.tier.pool.delete(h, surge_bb::proto::ChunkId { ino, idx, ver: e.ver }).unwrap();
        }
    }
    let reader = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..6 {
        let (c, tx) = (reader.clone(), tx.clone());
        std::thread::spawn(move || tx.send(c.read(ino, t * 1000, 1000).map(|v| v.len())).unwrap());
    }
    for _ in 0..6 {
        let r = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a reader hung on a failed fetch");
        let e = r.expect_err("no node holds the chunk");
        assert_eq!(e.errno(), libc::EIO, "{e}");
    }
    let before = reader.chunk_fetches();
    assert!(reader.read(ino, 0, 10).is_err());
    assert!(reader.chunk_fetches() > before, "a failed fetch must not be remembered as done");
}

/// A stopped in-process node serves nothing more: a connection it had
/// answered gets no answer to its next request, and a new one is refused.
/// (Before, its listener kept accepting and serving after the stop.)
#[test]
fn a_stopped_node_closes_its_listener_and_connections() {
    let s = setup(1);
    let n = &s.nodes[0];
    let pool = surge_bb::conn::NodePool::new(std::time::Duration::from_secs(2));
    let c = surge_bb::proto::ChunkId { ino: 7, idx: 0, ver: 1 };
    pool.put(&n.addr, c, &[5; 1000], false).unwrap();
    assert!(pool.has(&n.addr, c).unwrap(), "the node serves before the stop");
    n.stop();
    assert!(pool.has(&n.addr, c).is_err(), "the open connection was served after the stop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::net::TcpStream::connect(&n.addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the listener still accepts 5 s after the stop");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

// Issue 38 item 7: `/.surge` is where the bucket keeps every chunk and
// manifest; a file there would be published over them, and its removal
// would delete them. Reserved at the root (EPERM), free below it.
#[test]
fn the_buckets_internal_prefix_is_reserved_at_the_root() {
    let s = setup(1);
    let c = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    for kind in [Kind::File, Kind::Dir] {
        let e = c.create(ROOT, ".surge", kind, 0o755, 0, 0).unwrap_err();
        assert_eq!(e.errno(), libc::EPERM, "{e}");
    }
    let f = c.create(ROOT, "x", Kind::File, 0o644, 0, 0).unwrap();
    assert_eq!(c.rename(ROOT, "x", ROOT, ".surge").unwrap_err().errno(), libc::EPERM);
    assert!(c.lookup(ROOT, ".surge").is_err(), "nothing was made at /.surge");
    assert_eq!(c.lookup(ROOT, "x").unwrap().ino, f.ino, "the refused rename moved nothing");
    let d = c.create(ROOT, "d", Kind::Dir, 0o755, 0, 0).unwrap();
    c.create(d.ino, ".surge", Kind::File, 0o644, 0, 0).unwrap();
}

// Issue 38 item 7: a file may not grow past the largest object S3 stores
// (every file is published as one): `truncate -s 8E` and writes past the
// cap fail with EFBIG and change nothing.
#[test]
fn files_past_the_largest_object_fail_with_efbig() {
    let s = setup(1);
    let c = Client::new(s.tier.clone(), ClientConfig::default()).unwrap();
    let f = c.create(ROOT, "big", Kind::File, 0o644, 0, 0).unwrap().ino;
    for size in [8u64 << 60, surge_bb::meta::MAX_FILE_SIZE + 1, u64::MAX] {
        assert_eq!(c.truncate(f, size).unwrap_err().errno(), libc::EFBIG, "truncate to {size}");
    }
    let fh = c.open(f).unwrap();
    assert_eq!(c.write(f, fh, surge_bb::meta::MAX_FILE_SIZE, b"x").unwrap_err().errno(), libc::EFBIG);
    assert_eq!(c.write(f, fh, u64::MAX - 1, b"xyz").unwrap_err().errno(), libc::EFBIG);
    c.flush(f, fh).unwrap();
    assert_eq!(c.getattr(f).unwrap().size, 0, "the refused calls changed the size");
    c.truncate(f, 1 << 20).unwrap();
    assert_eq!(c.getattr(f).unwrap().size, 1 << 20);
}
