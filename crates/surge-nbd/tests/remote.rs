//! The NBD client device (`RemoteDev`) against an in-process surge server,
//! nbdkit and qemu-nbd: the conformance suite, many threads at once, block
//! status, connections cut mid-run (with a server that loses unflushed writes
//! when it "restarts"), and a server that stays gone. Kills of real server
//! processes are in crates/surge/tests/remote.rs.

use parking_lot::Mutex;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::{conformance, BlockDev, BlockError, Caps, ExtentKind, MemoryDev};
use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};

mod support;
use support::{opts, uri_for, InProcess, Proxy, VolatileDisk};

/// A device that keeps its server alive as long as it lives, seen through a
/// window of `size` bytes (qemu rounds image sizes up to 512 bytes).
struct Kept<T> {
    dev: RemoteDev,
    size: u64,
    _server: T,
}

impl<T> Kept<T> {
    fn new(dev: RemoteDev, size: u64, server: T) -> Self {
        assert!(dev.size() >= size && dev.size() - size < 512, "export is {} bytes, want {size}", dev.size());
        Kept { dev, size, _server: server }
    }
    fn check(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, len)
    }
}

impl<T: Send + Sync> BlockDev for Kept<T> {
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.dev.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.dev.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.check(offset, len)?;
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: surge_block::ZeroMode) -> surge_block::Result<()> {
        self.check(offset, len)?;
        self.dev.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<surge_block::Extent>> {
        self.check(offset, len)?;
        self.dev.block_status(offset, len)
    }
}

#[test]
fn remote_device_passes_conformance_against_surge() {
    conformance::run("remote(surge)", |size| {
        let srv = InProcess::start(Arc::new(MemoryDev::new(size)));
        let dev = RemoteDev::open(&uri_for(&srv.sock, "disk"), RemoteOptions { max_request: 8192, ..opts() }).unwrap();
        Arc::new(Kept::new(dev, size, srv))
    });
}

#[test]
fn many_threads_share_the_connections_with_requests_in_flight() {
    let size = 64u64 << 20;
    let mem = Arc::new(MemoryDev::new(size));
    let srv = InProcess::start(mem.clone());
    let dev = Arc::new(RemoteDev::open(&uri_for(&srv.sock, "disk"), opts()).unwrap());
    assert_eq!(dev.stats().connections, 4, "surge advertises multi-conn");
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let region = t * (size / 8);
                for i in 0..200u64 {
                    let off = region + (i * 37 % 1000) * 4096;
                    dev.write_at(&[(t + i) as u8; 4096], off, false).unwrap();
                    let mut b = [0u8; 4096];
                    dev.read_at(&mut b, off).unwrap();
                    assert_eq!(b, [(t + i) as u8; 4096]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    dev.flush().unwrap();
    let s = dev.stats();
    assert_eq!((s.requests, s.retries, s.reconnects), (8 * 400 + 1, 0, 0));
    // A request bigger than max_request is split and reassembled in order.
    let big: Vec<u8> = (0..(40u32 << 20)).map(|i| (i / 4096) as u8).collect();
    dev.write_at(&big, 1 << 20, false).unwrap();
    let mut back = vec![0u8; big.len()];
    dev.read_at(&mut back, 1 << 20).unwrap();
    assert!(back == big);
}

#[test]
fn block_status_reports_the_servers_holes() {
    let mem = Arc::new(MemoryDev::new(16 << 20));
    mem.write_at(&[1u8; 1 << 20], 4 << 20, false).unwrap();
    let srv = InProcess::start(mem);
    let dev = RemoteDev::open(&uri_for(&srv.sock, "disk"), opts()).unwrap();
    assert!(dev.caps().block_status);
    let mut pos = 0;
    let mut data = 0;
    while pos < dev.size() {
        for e in dev.block_status(pos, dev.size() - pos).unwrap() {
            if e.kind == ExtentKind::Data {
                data += e.len;
            }
            pos += e.len;
        }
    }
    assert_eq!(data, 1 << 20, "exactly the written MiB is data");
}

// ---- connections cut, server restarts, server gone ----

/// A unix-socket proxy in front of a server: `cut` closes every connection
/// at once (as a dead server or network would), `down`/`up` stop and resume
/// accepting.
/// Writer threads each own a region and write numbered versions of its blocks,
/// flushing now and then; returns, per block, the last acknowledged version.
fn versioned_writes(dev: Arc<RemoteDev>, threads: u64, blocks: u64, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<Vec<u64>>> {
    (0..threads)
        .map(|t| {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = vec![0u64; blocks as usize];
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v += 1;
                    let b = (v * 7919) % blocks;
                    let mut data = [0u8; 4096];
                    data[..8].copy_from_slice(&v.to_le_bytes());
                    data[8..16].copy_from_slice(&(t * blocks + b).to_le_bytes());
                    dev.write_at(&data, (t * blocks + b) * 4096, false).unwrap_or_else(|e| panic!("write {v} failed: {e}"));
                    last[b as usize] = v;
                    if v.is_multiple_of(16) {
                        dev.flush().unwrap_or_else(|e| panic!("flush failed: {e}"));
                    }
                }
                last
            })
        })
        .collect()
}

fn check_versions(read: &dyn BlockDev, t: u64, blocks: u64, last: &[u64]) {
    for b in 0..blocks {
        let mut data = [0u8; 4096];
        read.read_at(&mut data, (t * blocks + b) * 4096).unwrap();
        let v = u64::from_le_bytes(data[..8].try_into().unwrap());
        assert_eq!(v, last[b as usize], "thread {t} block {b}: holds version {v}, the last acknowledged is {}", last[b as usize]);
        if v > 0 {
            assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), t * blocks + b, "block landed in the wrong place");
        }
    }
}

#[test]
fn cut_connections_and_a_restart_that_loses_unflushed_writes_lose_no_request() {
    let (threads, blocks) = (4u64, 64u64);
    let disk = Arc::new(VolatileDisk::memory(threads * blocks * 4096));
    let srv = InProcess::start(disk.clone());
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path().join("proxy.sock"), srv.sock.clone());
    let dev = Arc::new(RemoteDev::open(&uri_for(&proxy.path, "disk"), RemoteOptions { connections: 3, ..opts() }).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers = versioned_writes(dev.clone(), threads, blocks, stop.clone());
    let mut lost = 0;
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(60));
        // The server "dies": connections drop, its cache is lost; it is back
        // after a pause (rounds alternate between a quick and a slow return).
        proxy.down();
        lost += disk.lose();
        std::thread::sleep(Duration::from_millis(if round % 2 == 0 { 10 } else { 300 }));
        proxy.resume();
    }
    std::thread::sleep(Duration::from_millis(60));
    stop.store(true, Ordering::Relaxed);
    let lasts: Vec<Vec<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let s = dev.stats();
    // Six cuts; under heavy load a cut can land while the device is still
    // reconnecting from the one before, and the two then count as one.
    assert!(s.reconnects >= 3, "{s:?}");
    assert!(lost > 0 && s.replayed > 0, "the restarts lost unflushed writes ({lost}) that the replay restored ({s:?})");
    // Read back through the device, then straight from the disk after a flush.
    for (t, last) in lasts.iter().enumerate() {
        check_versions(dev.as_ref(), t as u64, blocks, last);
    }
    dev.flush().unwrap();
    for (t, last) in lasts.iter().enumerate() {
        check_versions(disk.disk.as_ref(), t as u64, blocks, last);
    }
}

/// A disk with a volatile cache whose FLUSH waits until the test opens a gate
/// (a server syncing a large cache to a slow disk).
struct SlowSync {
    disk: VolatileDisk,
    open: Mutex<bool>,
    opened: parking_lot::Condvar,
    syncs_started: AtomicU64,
    /// Syncs that fail (with EIO) before one succeeds.
    failing: AtomicU64,
}

impl SlowSync {
    fn gate(&self, open: bool) {
        *self.open.lock() = open;
        self.opened.notify_all();
    }
}

impl BlockDev for SlowSync {
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn caps(&self) -> Caps {
        self.disk.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.disk.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.syncs_started.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        drop(open);
        if self.failing.load(Ordering::SeqCst) > 0 {
            self.failing.fetch_sub(1, Ordering::SeqCst);
            return Err(BlockError::Io { op: "flush", offset: 0, len: 0, source: std::io::Error::other("sync failed") });
        }
        self.disk.flush()
    }
}

impl SlowSync {
    fn new(size: u64, open: bool, failing: u64) -> Arc<SlowSync> {
        Arc::new(SlowSync {
            disk: VolatileDisk::memory(size),
            open: Mutex::new(open),
            opened: parking_lot::Condvar::new(),
            syncs_started: AtomicU64::new(0),
            failing: AtomicU64::new(failing),
        })
    }
}

/// Write `n` blocks of 64 KiB from `first` on, in another thread; the
/// receiver gets the result when every write returned.
fn write_blocks(dev: &Arc<RemoteDev>, first: u64, n: u64) -> std::sync::mpsc::Receiver<surge_block::Result<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let dev = dev.clone();
    std::thread::spawn(move || {
        let r = (first..first + n).try_for_each(|b| dev.write_at(&[b as u8; 64 << 10], b * (64 << 10), false));
        let _ = tx.send(r);
    });
    rx
}

/// The replay log's bound: past the limit the device sends a FLUSH and goes
/// on writing (before, every writer past the limit waited for the server's
/// sync: the fairshare experiment's proxies stalled behind their storage
/// servers' fsyncs, 4-77 % below direct clients); the reply, when it comes,
/// takes what it covered out of the log; past twice the limit writers wait.
#[test]
fn the_replay_bound_flushes_in_the_background_and_waits_only_past_twice_the_limit() {
    let disk = SlowSync::new(64 << 20, false, 0);
    let srv = InProcess::start(disk.clone());
    let limit = 1 << 20;
    let dev = Arc::new(RemoteDev::open(&uri_for(&srv.sock, "disk"), RemoteOptions { replay_limit: limit, ..opts() }).unwrap());
    // 1.5 MiB: past the limit, under twice it. The sync starts and hangs; the writes return.
    let done = write_blocks(&dev, 0, 24).recv_timeout(Duration::from_secs(5));
    if !matches!(done, Ok(Ok(()))) {
        // Let the server's sync end, so the server shuts down and the test fails rather than hangs.
        disk.gate(true);
        panic!("writes past the limit waited for the server's sync: {done:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while disk.syncs_started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no FLUSH was sent past the limit");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(dev.stats().replay_bytes > limit, "{:?}", dev.stats());
    // Past twice the limit the writer waits for a sync.
    let blocked = write_blocks(&dev, 24, 16);
    assert!(blocked.recv_timeout(Duration::from_millis(300)).is_err(), "a writer past twice the limit did not wait");
    disk.gate(true);
    assert!(matches!(blocked.recv_timeout(Duration::from_secs(5)), Ok(Ok(()))));
    // Synced: the log is empty, or holds only what came after the sync.
    let s = dev.stats();
    assert!(s.replay_bytes <= limit, "{s:?}");
    // What was written is on the disk once flushed.
    dev.flush().unwrap();
    let mut b = vec![0u8; 64 << 10];
    for blk in [0u64, 23, 39] {
        disk.disk.disk.read_at(&mut b, blk * (64 << 10)).unwrap();
        assert!(b.iter().all(|&x| x == blk as u8), "block {blk}");
    }
}

/// A background FLUSH that the server fails leaves what it covered in the
/// replay log (the writes were acknowledged, not yet durable) and fails no
/// write: before, the writer that crossed the limit got the sync's error for
/// a write that had succeeded. The next bound, or an explicit flush, syncs.
#[test]
fn a_failed_background_flush_keeps_its_writes_logged_and_fails_no_write() {
    let disk = SlowSync::new(64 << 20, true, u64::MAX);
    let srv = InProcess::start(disk.clone());
    let limit = 1 << 20;
    let dev = Arc::new(RemoteDev::open(&uri_for(&srv.sock, "disk"), RemoteOptions { replay_limit: limit, ..opts() }).unwrap());
    // Past the limit: a FLUSH is sent, and the server fails it.
    let r = write_blocks(&dev, 0, 20).recv_timeout(Duration::from_secs(10)).expect("writes returned");
    assert!(r.is_ok(), "a write failed for a background sync: {r:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while disk.syncs_started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the server never saw the background FLUSH");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Later writes take the failed replies: nothing leaves the log.
    let r = write_blocks(&dev, 20, 1).recv_timeout(Duration::from_secs(10)).expect("write returned");
    assert!(r.is_ok(), "{r:?}");
    assert!(dev.stats().replay_bytes > 21 * (64 << 10), "{:?}", dev.stats());
    disk.failing.store(0, Ordering::SeqCst);
    // An explicit flush syncs everything.
    dev.flush().unwrap();
    assert_eq!(dev.stats().replay_bytes, 0);
    let mut b = vec![0u8; 64 << 10];
    disk.disk.disk.read_at(&mut b, 7 * (64 << 10)).unwrap();
    assert!(b.iter().all(|&x| x == 7));
}

#[test]
fn a_server_that_stays_gone_fails_requests_clearly_and_is_used_again_when_back() {
    let srv = InProcess::start(Arc::new(MemoryDev::new(1 << 20)));
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path().join("proxy.sock"), srv.sock.clone());
    // Long enough that "at once" below cannot be mistaken for a retry loop
    // that gave up, even on a loaded machine.
    let o = RemoteOptions { reconnect_timeout: Duration::from_secs(3), ..opts() };
    let dev = RemoteDev::open(&uri_for(&proxy.path, "disk"), o).unwrap();
    dev.write_at(&[5; 512], 0, false).unwrap();
    proxy.down();
    let t = Instant::now();
    let e = dev.read_at(&mut [0; 512], 0).unwrap_err();
    let waited = t.elapsed();
    assert!(matches!(e, BlockError::Gone(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("proxy.sock") && msg.contains("unreachable"), "{msg}");
    assert!(waited >= Duration::from_millis(2900) && waited < Duration::from_secs(15), "{waited:?}");
    // Known gone: the next request tries once and fails, well within the
    // reconnect timeout.
    let t = Instant::now();
    assert!(dev.read_at(&mut [0; 512], 0).is_err());
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    assert!(dev.stats().gone.is_some());
    proxy.resume();
    let mut b = [0u8; 512];
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [5; 512]);
    assert!(dev.stats().gone.is_none());
}

// ---- peers: nbdkit and qemu-nbd ----

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map(|o| o.status.success()).unwrap_or(false)
}

/// A server process on a unix socket, killed on drop.
struct Peer {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(sock).is_err() {
        assert!(Instant::now() < deadline, "{} never came up", sock.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

static PEER_SEQ: AtomicU64 = AtomicU64::new(0);

fn peer(tool: &str, size: u64) -> (Peer, NbdUri) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join(format!("p{}.sock", PEER_SEQ.fetch_add(1, Ordering::Relaxed)));
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let mut cmd = match tool {
        "nbdkit" => {
            let mut c = Command::new("nbdkit");
            c.args(["--foreground", "--exit-with-parent", "-U"]).arg(&sock).arg("file").arg(&img);
            c
        }
        _ => {
            let mut c = Command::new("qemu-nbd");
            c.args(["--persistent", "--shared=8", "--format=raw", "--cache=writeback", "-x", "disk", "--socket"]).arg(&sock).arg(&img);
            c
        }
    };
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for_socket(&sock);
    let export = if tool == "nbdkit" { "" } else { "disk" };
    (Peer { child, _dir: dir }, uri_for(&sock, export))
}

#[test]
fn remote_device_passes_conformance_against_nbdkit_and_qemu_nbd() {
    for tool in ["nbdkit", "qemu-nbd"] {
        if !have(tool) {
            eprintln!("SKIP: {tool} not installed");
            continue;
        }
        conformance::run(&format!("remote({tool})"), |size| {
            let (p, uri) = peer(tool, size);
            let dev = RemoteDev::open(&uri, opts()).unwrap_or_else(|e| panic!("{tool}: {e}"));
            Arc::new(Kept::new(dev, size, p))
        });
    }
}

/// A device whose reads take `delay` (a base image behind a slow link).
struct SlowReads {
    inner: MemoryDev,
    delay: Duration,
}

impl BlockDev for SlowReads {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.inner.flush()
    }
}

/// The compute-node stack of a streamed volume: a surge server exporting a
/// copy-on-write volume whose base is a `RemoteDev` on a storage server with
/// slow reads; `local` bytes at the start are already in the overlay.
fn streamed_volume(delay: Duration, local: u64) -> (InProcess, InProcess) {
    use surge_block::cow::{CowConfig, CowDev};
    let size = 64u64 << 20;
    let mem = MemoryDev::new(size);
    mem.write_at(&conformance::pattern(7, 0, size), 0, false).unwrap();
    let storage = InProcess::start(Arc::new(SlowReads { inner: mem, delay }));
    let base = Arc::new(RemoteDev::open(&uri_for(&storage.sock, "disk"), opts()).unwrap());
    let cfg = CowConfig::default();
    let overlay = Arc::new(MemoryDev::new(CowDev::overlay_size_for(size, &cfg)));
    let cow = CowDev::create(base, overlay, &cfg).unwrap();
    cow.write_at(&conformance::pattern(8, 0, local), 0, false).unwrap();
    (storage, InProcess::start(Arc::new(cow)))
}

#[test]
fn base_fetches_overlap_and_never_hold_up_local_reads_on_their_connection() {
    // One client connection: a thread reading blocks already in the overlay,
    // while four threads read blocks still in the base, 300 ms each.
    let delay = Duration::from_millis(300);
    let local = 1u64 << 20;
    let (_storage, compute) = streamed_volume(delay, local);
    let dev = Arc::new(RemoteDev::open(&uri_for(&compute.sock, "disk"), RemoteOptions { connections: 1, ..opts() }).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let fast = {
        let (dev, stop) = (dev.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut worst, mut n) = (Duration::ZERO, 0u64);
            let mut b = [0u8; 4096];
            while !stop.load(Ordering::SeqCst) {
                let off = (n * 4096) % local;
                let t = Instant::now();
                dev.read_at(&mut b, off).unwrap();
                worst = worst.max(t.elapsed());
                assert_eq!(b[..], conformance::pattern(8, off, 4096)[..]);
                n += 1;
            }
            (worst, n)
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                for i in 0..3u64 {
                    let off = (8 << 20) + (t * 3 + i) * (1 << 20);
                    let mut b = [0u8; 4096];
                    dev.read_at(&mut b, off).unwrap();
                    assert_eq!(b[..], conformance::pattern(7, off, 4096)[..]);
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let base_time = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (worst, n) = fast.join().unwrap();
    // In series the 12 fetches take 3.6 s; in flight together, about 0.9 s.
    assert!(base_time < delay * 6, "12 base fetches by 4 threads took {base_time:?}: they did not overlap");
    assert!(n > 10, "only {n} local reads completed meanwhile");
    assert!(worst < delay / 2, "a local read waited {worst:?} behind base fetches of {delay:?} on the same connection");
}

// ---- issue 37: writes that a reconnect, a failed FLUSH or a missing FUA lost ----

/// A disk whose writes take a varying time, so that a server running one
/// connection's requests in parallel finishes them out of order.
struct JitterDisk {
    inner: Arc<VolatileDisk>,
    seq: AtomicU64,
}

impl BlockDev for JitterDisk {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54; // 0..1023
        std::thread::sleep(Duration::from_micros(n * 2));
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.inner.flush()
    }
}

/// Overlapping 128 KiB writes, acknowledged in order and not flushed, are
/// lost by a server restart; the replay on the new connection must leave the
/// newest of them in place once a FLUSH is acknowledged, even though surge's
/// server runs large writes of one connection in parallel.
#[test]
fn a_replay_lands_overlapping_writes_in_acknowledgement_order() {
    for round in 0..3 {
        let disk = Arc::new(VolatileDisk::memory(1 << 20));
        let srv = InProcess::start(Arc::new(JitterDisk { inner: disk.clone(), seq: AtomicU64::new(round) }));
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::start(dir.path().join("proxy.sock"), srv.sock.clone());
        let dev = RemoteDev::open(&uri_for(&proxy.path, "disk"), RemoteOptions { connections: 1, ..opts() }).unwrap();
        let last = 24u8;
        for v in 1..=last {
            // Each write covers the one before but for its first 4 KiB.
            dev.write_at(&vec![v; 128 << 10], u64::from(v) * 4096, false).unwrap();
        }
        proxy.down();
        assert!(disk.lose() > 0, "the restart lost the unflushed writes");
        proxy.resume();
        dev.flush().unwrap();
        let mut got = vec![0u8; 1 << 20];
        disk.disk.read_at(&mut got, 0).unwrap();
        for v in 1..=last {
            let at = usize::from(v) * 4096;
            // The first 4 KiB of each write is its own.
            assert_eq!(got[at], v, "round {round}: 4 KiB block {v} holds version {} after the replay", got[at]);
        }
        let tail = usize::from(last) * 4096 + (128 << 10) - 1;
        assert_eq!(got[tail], last, "round {round}: the newest write's end was overwritten by an older one");
    }
}

/// The server restarts again while the client reconnects (CI caught this in
/// the remote stress test as a stale read): a connection made after the
/// replay went over the first one reaches a server that lost the replayed
/// write, and it stays up. So every connection is made before the replay: a
/// restart then cuts the one the replay uses, and the client replays again.
/// Two moments for the second restart: when a connection is accepted while
/// the server's cache holds the replayed write (after the replay), and on
/// the second connection accepted.
#[test]
fn a_restart_while_the_client_reconnects_loses_no_replayed_write() {
    for second_restart in ["after the replay", "on the second connection"] {
        let disk = Arc::new(VolatileDisk::memory(1 << 20));
        let srv = Arc::new(InProcess::start(disk.clone()));
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::start(dir.path().join("proxy.sock"), srv.sock.clone());
        let dev = RemoteDev::open(&uri_for(&proxy.path, "disk"), RemoteOptions { connections: 2, ..opts() }).unwrap();
        dev.write_at(&[1; 4096], 0, false).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 4096], 0, false).unwrap();
        let server_idle = |srv: &InProcess| {
            while srv.server.as_ref().unwrap().stats().exports.iter().any(|e| e.active_connections > 0) {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        proxy.down();
        server_idle(&srv);
        assert_eq!(disk.lose(), 1, "the restart lost the unflushed write");
        let (accepted, fired) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (a, f, d, s) = (accepted.clone(), fired.clone(), disk.clone(), srv.clone());
        *proxy.before_forward.lock() = Some(Box::new(move |cut: &dyn Fn()| {
            let n = a.fetch_add(1, Ordering::SeqCst) + 1;
            let now = match second_restart {
                "after the replay" => d.waiting() > 0,
                _ => n == 2,
            };
            if now && !f.swap(true, Ordering::SeqCst) {
                cut();
                server_idle(&s);
                d.lose();
            }
        }));
        proxy.resume();
        let mut got = vec![0u8; 4096];
        for _ in 0..4 {
            dev.read_at(&mut got, 0).unwrap();
            assert!(got.iter().all(|&b| b == 2), "second restart {second_restart}: read version {}, the replayed write was lost", got[0]);
        }
        assert!(accepted.load(Ordering::SeqCst) >= 2, "both connections were made again (accepted: {})", accepted.load(Ordering::SeqCst));
        dev.flush().unwrap();
        let mut durable = vec![0u8; 4096];
        disk.disk.read_at(&mut durable, 0).unwrap();
        assert!(durable.iter().all(|&b| b == 2), "second restart {second_restart}: flushed, but the disk holds version {}", durable[0]);
    }
}

/// The server fails a FLUSH and drops what it held (a writeback error). The
/// writes it covered are still in the replay log: the next FLUSH must send
/// them again before it is acknowledged, so they reach the disk.
#[test]
fn writes_a_failed_server_flush_dropped_are_sent_again_before_the_next_flush() {
    use surge_block::fault::FaultDev;
    let raw = Arc::new(MemoryDev::new(1 << 20));
    let disk = Arc::new(FaultDev::new(raw.clone(), "volatile".parse().unwrap(), Arc::new(surge_block::SystemClock::new())));
    let srv = InProcess::start(disk.clone());
    let dev = RemoteDev::open(&uri_for(&srv.sock, "disk"), opts()).unwrap();
    dev.write_at(&[0x5C; 8192], 4096, false).unwrap();
    disk.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(dev.flush().is_err(), "the server's flush failed");
    dev.flush().expect("the server heals");
    let mut got = vec![0u8; 8192];
    raw.read_at(&mut got, 4096).unwrap();
    assert!(got.iter().all(|&b| b == 0x5C), "FLUSH acknowledged, but the write it covered is not on the disk");
}

/// Against a server that takes FLUSH but not FUA (nbdkit's fua filter,
/// whose default is `fuamode=none`), a FUA write is the write and then a FLUSH.
#[test]
fn a_fua_write_to_a_server_without_fua_is_followed_by_a_flush() {
    if !have("nbdkit") {
        eprintln!("SKIP: nbdkit not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (sock, log) = (dir.path().join("n.sock"), dir.path().join("log"));
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(["--filter=log", "--filter=fua", "memory", "1M"]) // fuamode=none is the default
        .arg(format!("logfile={}", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _peer = Peer { child, _dir: tempfile::tempdir().unwrap() };
    wait_for_socket(&sock);
    let dev = RemoteDev::open(&uri_for(&sock, ""), opts()).unwrap();
    assert!(dev.caps().volatile_cache, "the server takes FLUSH");
    dev.write_at(&[1u8; 4096], 0, true).unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let write = text.find("Write ").expect("the write was logged");
    assert!(text[write..].contains("Flush "), "a FUA write was acknowledged without a FLUSH: {text}");
}

/// A FUA write is durable when acknowledged, but an older unflushed write to
/// the same range is still in the replay log: a server restart must not let
/// the replay land the older write over it.
#[test]
fn a_replay_never_lands_an_older_write_over_a_newer_fua_write() {
    let disk = Arc::new(VolatileDisk::memory(1 << 20));
    let srv = InProcess::start(disk.clone());
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path().join("proxy.sock"), srv.sock.clone());
    let dev = RemoteDev::open(&uri_for(&proxy.path, "disk"), RemoteOptions { connections: 1, ..opts() }).unwrap();
    dev.write_at(&[1; 8192], 0, false).unwrap();
    dev.write_at(&[2; 4096], 4096, true).unwrap();
    proxy.down();
    disk.lose();
    proxy.resume();
    dev.flush().unwrap();
    let mut got = vec![0u8; 8192];
    disk.disk.read_at(&mut got, 0).unwrap();
    assert!(got[..4096].iter().all(|&b| b == 1), "the older write's own block was replayed");
    assert!(got[4096..].iter().all(|&b| b == 2), "the replay put the older write over the acknowledged FUA write");
}
