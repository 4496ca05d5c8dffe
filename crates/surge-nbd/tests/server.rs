//! The server against the crate's own client over real sockets.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use surge_block::{BlockDev, Caps, Extent, MemoryDev, ZeroMode};
use surge_nbd::client::{Client, ClientError, ClientOptions, Handshake, ReadChunk, StatusExtent, ZeroFlags};
use surge_nbd::proto::*;
use surge_nbd::{Export, Listen, Server, ServerConfig, HARD_MAX_PAYLOAD};

struct Running {
    server: Option<Server>,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(cfg: ServerConfig) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let server = Server::start(cfg).unwrap();
        server.listen(&Listen::Unix(sock.clone())).unwrap();
        Running { server: Some(server), sock, _dir: dir }
    }

    fn one(dev: Arc<dyn BlockDev>) -> Running {
        Running::start(ServerConfig::new(vec![Export::new("disk", dev)]))
    }

    /// One export, every request run after handing the input to a peer thread
    /// (none run inline by the thread that read it).
    fn pooled(dev: Arc<dyn BlockDev>) -> Running {
        let mut cfg = ServerConfig::new(vec![Export::new("disk", dev)]);
        cfg.inline_fast_requests = false;
        Running::start(cfg)
    }

    fn client(&self) -> Client {
        Client::connect_unix(&self.sock, &ClientOptions::default()).unwrap()
    }

    fn client_with(&self, opts: ClientOptions) -> Client {
        Client::connect_unix(&self.sock, &opts).unwrap()
    }

    fn handshake(&self) -> Handshake {
        Handshake::connect_unix(&self.sock).unwrap()
    }

    fn stop(mut self) {
        self.server.take().unwrap().shutdown().unwrap();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn write_then_read_back_with_structured_and_simple_replies() {
    let srv = Running::one(Arc::new(MemoryDev::new(4 << 20)));
    let mut c = srv.client();
    assert!(c.structured());
    let data = pattern(100_000, 7);
    c.write(12345, &data, false).unwrap();
    c.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(12345, &mut back).unwrap();
    assert_eq!(back, data);
    c.disconnect().unwrap();

    let mut simple = srv.client_with(ClientOptions { structured_replies: false, block_status: false, ..Default::default() });
    assert!(!simple.structured());
    let mut back = vec![0u8; data.len()];
    simple.read(12345, &mut back).unwrap();
    assert_eq!(back, data);
    simple.disconnect().unwrap();
    srv.stop();
}

/// A memory device with chosen caps whose reads at `gate_offset` wait until the
/// test opens the gate (to force replies out of order), and which counts flushes.
struct TestDev {
    inner: MemoryDev,
    caps: Caps,
    gate_offset: Option<u64>,
    read_delay: Duration,
    gate: Mutex<bool>,
    gate_cv: std::sync::Condvar,
    flushes: std::sync::atomic::AtomicU64,
}

impl TestDev {
    fn new(size: u64, caps: Caps) -> Arc<TestDev> {
        Arc::new(TestDev {
            inner: MemoryDev::new(size),
            caps,
            gate_offset: None,
            read_delay: Duration::ZERO,
            gate: Mutex::new(false),
            gate_cv: std::sync::Condvar::new(),
            flushes: Default::default(),
        })
    }
    fn gated(size: u64, at: u64, read_delay: Duration) -> Arc<TestDev> {
        let mut d = Arc::into_inner(TestDev::new(size, MemoryDev::new(0).caps())).unwrap();
        d.gate_offset = Some(at);
        d.read_delay = read_delay;
        Arc::new(d)
    }
    fn open_gate(&self) {
        *self.gate.lock().unwrap() = true;
        self.gate_cv.notify_all();
    }
    fn flushes(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl BlockDev for TestDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        std::thread::sleep(self.read_delay);
        if Some(offset) == self.gate_offset {
            let mut open = self.gate.lock().unwrap();
            while !*open {
                open = self.gate_cv.wait(open).unwrap();
            }
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        if mode.fast_only && !self.caps.fast_zero {
            return Err(surge_block::BlockError::NotSupported("fast zeroing"));
        }
        self.inner.write_zeroes(offset, len, ZeroMode { fast_only: false, ..mode })
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u32 {
    r.expect_err("request should fail").errno().expect("a request error")
}

#[test]
fn replies_come_out_of_order_when_an_earlier_request_is_slow() {
    let dev = TestDev::gated(1 << 20, 0, Duration::ZERO);
    let srv = Running::pooled(dev.clone());
    let mut c = srv.client();
    c.write(8192, &[5u8; 4096], false).unwrap();
    let slow = c.submit(CMD_READ, 0, 0, 4096, &[]).unwrap();
    let fast = c.submit(CMD_READ, 0, 8192, 4096, &[]).unwrap();
    let first = c.wait_any().unwrap();
    assert_eq!(first.cookie, fast, "the later request must be answered first");
    assert_eq!(first.data, vec![5u8; 4096]);
    dev.open_gate();
    let second = c.wait(slow).unwrap().into_result().unwrap();
    assert_eq!(second.data, vec![0u8; 4096]);
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn many_pipelined_requests_and_parallel_connections_all_land() {
    let srv = Running::one(Arc::new(MemoryDev::new(8 << 20)));
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let srv = &srv;
            s.spawn(move || {
                let mut c = srv.client();
                let base = t as u64 * (2 << 20);
                // 200 writes in flight at once (more than the server's in-flight bound).
                let cookies: Vec<u64> = (0..200u64)
                    .map(|i| c.submit(CMD_WRITE, 0, base + i * 4096, 4096, &pattern(4096, t.wrapping_add(i as u8))).unwrap())
                    .collect();
                for ck in cookies {
                    c.wait(ck).unwrap().into_result().unwrap();
                }
                let reads: Vec<(u64, u64)> = (0..200u64).map(|i| (i, c.submit(CMD_READ, 0, base + i * 4096, 4096, &[]).unwrap())).collect();
                for (i, ck) in reads {
                    let r = c.wait(ck).unwrap().into_result().unwrap();
                    assert_eq!(r.data, pattern(4096, t.wrapping_add(i as u8)), "block {i} of connection {t}");
                }
                c.disconnect().unwrap();
            });
        }
    });
    let st = srv.server.as_ref().unwrap().stats();
    assert_eq!(st.exports[0].writes, 800);
    assert_eq!(st.exports[0].reads, 800);
    srv.stop();
}

#[test]
fn out_of_range_requests_fail_and_the_connection_stays_usable() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    for structured in [true, false] {
        let mut c = srv.client_with(ClientOptions { structured_replies: structured, block_status: structured, ..Default::default() });
        c.write(0, &[9u8; 512], false).unwrap();
        let mut buf = vec![0u8; 4096];
        assert_eq!(errno_of(c.read(1 << 20, &mut buf)), EINVAL);
        assert_eq!(errno_of(c.read(u64::MAX - 10, &mut buf)), EINVAL);
        assert_eq!(errno_of(c.write((1 << 20) - 100, &[1u8; 200], false)), ENOSPC);
        assert_eq!(errno_of(c.trim(1 << 20, 4096, false)), EINVAL);
        assert_eq!(errno_of(c.cache(1 << 20, 1)), EINVAL);
        assert_eq!(errno_of(c.submit(99, 0, 0, 0, &[]).and_then(|k| c.wait(k)).and_then(|r| r.into_result())), EINVAL);
        // Flags not valid for the command.
        let k = c.submit(CMD_FLUSH, CMD_FLAG_REQ_ONE, 0, 0, &[]).unwrap();
        assert_eq!(errno_of(c.wait(k).unwrap().into_result()), EINVAL);
        if structured {
            let k = c.submit(CMD_READ, 0, 1 << 20, 1, &[]).unwrap();
            let r = c.wait(k).unwrap();
            assert!(!r.simple && r.error.as_ref().unwrap().1.contains("beyond"), "structured errors carry a message: {:?}", r.error);
        }
        let mut back = vec![0u8; 512];
        c.read(0, &mut back).unwrap();
        assert_eq!(back, vec![9u8; 512]);
        c.disconnect().unwrap();
    }
    srv.stop();
}

#[test]
fn zero_runs_in_large_reads_come_back_as_hole_chunks() {
    let srv = Running::one(Arc::new(MemoryDev::new(4 << 20)));
    let mut c = srv.client();
    let data = pattern(64 * 1024, 3);
    c.write(1 << 20, &data, false).unwrap();
    let r = c.read_reply(0, 2 << 20, 0).unwrap();
    assert!(r.chunks.iter().any(|ch| matches!(ch, ReadChunk::Hole { .. })), "{:?}", r.chunks);
    assert!(r.chunks.contains(&ReadChunk::Data { offset: 1 << 20, len: 64 * 1024 }), "{:?}", r.chunks);
    assert_eq!(&r.data[1 << 20..(1 << 20) + data.len()], &data[..]);
    assert!(r.data[..1 << 20].iter().all(|&b| b == 0));
    // Don't-fragment: one data chunk, zeroes included.
    let r = c.read_reply(0, 2 << 20, CMD_FLAG_DF).unwrap();
    assert_eq!(r.chunks, vec![ReadChunk::Data { offset: 0, len: 2 << 20 }]);
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn block_status_reports_holes_and_data_from_the_device() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut c = srv.client();
    assert!(c.has_block_status());
    c.write(128 * 1024, &[1u8; 64 * 1024], false).unwrap();
    let ext = c.block_status(0, 1 << 20, false).unwrap();
    assert_eq!(
        ext,
        vec![
            StatusExtent { len: 128 * 1024, flags: STATE_HOLE | STATE_ZERO },
            StatusExtent { len: 64 * 1024, flags: 0 },
            StatusExtent { len: (1 << 20) - 192 * 1024, flags: STATE_HOLE | STATE_ZERO },
        ]
    );
    assert_eq!(c.block_status(0, 1 << 20, true).unwrap().len(), 1);
    assert_eq!(errno_of(c.block_status(1 << 20, 1, false)), EINVAL);
    c.disconnect().unwrap();
    // Without a negotiated context, BLOCK_STATUS is refused.
    let mut plain = srv.client_with(ClientOptions { block_status: false, ..Default::default() });
    assert_eq!(errno_of(plain.block_status(0, 4096, false)), EINVAL);
    plain.disconnect().unwrap();
    srv.stop();
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let mut ro = Export::new("ro", Arc::new(MemoryDev::new(1 << 20)));
    ro.read_only = true;
    let srv = Running::start(ServerConfig::new(vec![ro]));
    let mut c = srv.client();
    assert!(c.info().read_only());
    assert!(!c.info().has(FLAG_SEND_TRIM) && !c.info().has(FLAG_SEND_WRITE_ZEROES));
    assert_eq!(errno_of(c.write(0, &[1u8; 10], false)), EPERM);
    assert_eq!(errno_of(c.trim(0, 4096, false)), EPERM);
    assert_eq!(errno_of(c.write_zeroes(0, 4096, ZeroFlags::default())), EPERM);
    let mut b = [1u8; 10];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, [0u8; 10]);
    c.flush().unwrap();
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn transmission_flags_follow_the_device_caps() {
    let plain = TestDev::new(1 << 20, Caps { multi_conn: false, ..Caps::default() });
    let rich = TestDev::new(1 << 20, Caps { discard: true, fast_zero: true, block_status: true, ..Caps::default() });
    let srv = Running::start(ServerConfig::new(vec![Export::new("plain", plain), Export::new("rich", rich)]));
    let mut h = srv.handshake();
    let p = h.info("plain").unwrap();
    let r = h.info("rich").unwrap();
    for f in [FLAG_HAS_FLAGS, FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_WRITE_ZEROES, FLAG_SEND_CACHE] {
        assert!(p.has(f) && r.has(f), "flag {f:#x}");
    }
    assert!(!p.has(FLAG_SEND_TRIM) && !p.has(FLAG_SEND_FAST_ZERO) && !p.multi_conn());
    assert!(r.has(FLAG_SEND_TRIM) && r.has(FLAG_SEND_FAST_ZERO) && r.multi_conn());
    let (min, pref, max) = p.block_size.unwrap();
    assert!(min == 1 && pref == 4096 && max >= 32 << 20);
    h.abort().unwrap();
    srv.stop();
}

#[test]
fn fast_zero_fails_with_einval_on_a_slow_device_and_changes_nothing() {
    let slow = TestDev::new(1 << 20, Caps::default());
    let srv = Running::one(slow);
    let mut c = srv.client();
    c.write(0, &[7u8; 4096], false).unwrap();
    // FAST_ZERO is not advertised for this device, so the flag itself is invalid.
    assert_eq!(errno_of(c.write_zeroes(0, 4096, ZeroFlags { fast: true, ..Default::default() })), EINVAL);
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, vec![7u8; 4096]);
    c.write_zeroes(0, 4096, ZeroFlags { no_hole: true, fua: true, ..Default::default() }).unwrap();
    c.read(0, &mut b).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn unknown_options_get_err_unsup_and_the_session_continues() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut h = srv.handshake();
    let r = h.option_raw(0x4242, b"whatever").unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].reply, REP_ERR_UNSUP);
    let r = h.option_raw(OPT_LIST, b"junk").unwrap();
    assert_eq!(r.last().unwrap().reply, REP_ERR_INVALID);
    let r = h.option_raw(OPT_GO, &[0, 0]).unwrap();
    assert_eq!(r.last().unwrap().reply, REP_ERR_INVALID, "malformed GO");
    assert_eq!(h.info("nope").unwrap_err().option_reply(), Some(REP_ERR_UNKNOWN));
    // Meta contexts need structured replies first.
    assert_eq!(h.set_meta_context("", &[BASE_ALLOCATION]).unwrap_err().option_reply(), Some(REP_ERR_INVALID));
    assert!(h.structured_replies().unwrap());
    assert_eq!(h.list_meta_contexts("", &[]).unwrap(), vec![BASE_ALLOCATION.to_string()]);
    assert!(h.list_meta_contexts("", &["x-other:"]).unwrap().is_empty());
    let list = h.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "disk");
    let mut c = h.go("disk").unwrap();
    c.write(0, b"still works", true).unwrap();
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn named_exports_and_the_default_name() {
    let mut a = Export::new("a", Arc::new(MemoryDev::new(1 << 20)));
    a.description = "first".into();
    let b = Export::new("b", Arc::new(MemoryDev::new(2 << 20)));
    let srv = Running::start(ServerConfig::new(vec![a, b]));
    let mut h = srv.handshake();
    let list = h.list().unwrap();
    assert_eq!(list.iter().map(|e| (e.name.as_str(), e.description.as_str())).collect::<Vec<_>>(), vec![("a", "first"), ("b", "")]);
    let info = h.info("").unwrap();
    assert_eq!((info.size, info.name.as_deref(), info.description.as_deref()), (1 << 20, Some("a"), Some("first")));
    assert_eq!(h.info("b").unwrap().size, 2 << 20);
    let c = h.go("b").unwrap();
    assert_eq!(c.size(), 2 << 20);
    c.disconnect().unwrap();
    // The old NBD_OPT_EXPORT_NAME way in.
    let mut c = srv.handshake().export_name("a").unwrap();
    assert_eq!(c.size(), 1 << 20);
    c.write(0, b"x", false).unwrap();
    c.disconnect().unwrap();
    // An unknown name through EXPORT_NAME closes the connection.
    assert!(srv.handshake().export_name("zzz").is_err());
    srv.stop();
}

#[test]
fn oversized_write_closes_only_that_connection() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut other = srv.client();
    let mut c = srv.client();
    let hdr = encode_request(&Request { flags: 0, cmd: CMD_WRITE, cookie: 1, offset: 0, len: HARD_MAX_PAYLOAD + 1 });
    c.send_raw(&hdr).unwrap();
    let k = c.submit(CMD_FLUSH, 0, 0, 0, &[]).ok();
    assert!(k.is_none() || c.wait(k.unwrap()).is_err(), "the server must close the connection");
    other.write(0, b"fine", false).unwrap();
    other.disconnect().unwrap();
    srv.stop();
}

#[test]
fn garbage_magic_closes_only_that_connection() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut c = srv.client();
    c.send_raw(&[0xffu8; 28]).unwrap();
    let k = c.submit(CMD_FLUSH, 0, 0, 0, &[]).ok();
    assert!(k.is_none() || c.wait(k.unwrap()).is_err());
    let mut again = srv.client();
    again.flush().unwrap();
    again.disconnect().unwrap();
    srv.stop();
}

#[test]
fn client_leaving_mid_payload_applies_nothing() {
    let srv = Running::one(Arc::new(MemoryDev::new(4 << 20)));
    {
        let mut c = srv.client();
        let hdr = encode_request(&Request { flags: 0, cmd: CMD_WRITE, cookie: 7, offset: 4096, len: 1 << 20 });
        c.send_raw(&hdr).unwrap();
        c.send_raw(&vec![0xaau8; 300_000]).unwrap();
        // Dropped here: the socket closes with the payload incomplete.
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut c = srv.client();
    let mut back = vec![1u8; 1 << 20];
    c.read(4096, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "a half-received write must not be applied");
    c.disconnect().unwrap();
    assert_eq!(srv.server.as_ref().unwrap().stats().exports[0].writes, 0);
    srv.stop();
}

#[test]
fn tcp_listener_with_nodelay_serves_requests() {
    let server = Server::start(ServerConfig::new(vec![Export::new("t", Arc::new(MemoryDev::new(1 << 20)))])).unwrap();
    server.listen(&Listen::Tcp("127.0.0.1:0".parse().unwrap())).unwrap();
    let Listen::Tcp(addr) = server.local_addrs()[0].clone() else { panic!("tcp") };
    assert_ne!(addr.port(), 0);
    let mut c = Client::connect_tcp(addr, &ClientOptions::default()).unwrap();
    c.write(100, b"over tcp", true).unwrap();
    let mut b = [0u8; 8];
    c.read(100, &mut b).unwrap();
    assert_eq!(&b, b"over tcp");
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn shutdown_finishes_in_flight_requests_and_flushes() {
    let dev = TestDev::gated(1 << 20, 0, Duration::ZERO);
    let srv = Running::pooled(dev.clone());
    let mut c = srv.client();
    c.write(4096, &[3u8; 4096], false).unwrap();
    let slow = c.submit(CMD_READ, 0, 0, 512, &[]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let flushes_before = dev.flushes();
    let sock = srv.sock.clone();
    let d2 = dev.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        d2.open_gate();
    });
    srv.stop();
    opener.join().unwrap();
    // The request read before shutdown was answered, then the connection closed.
    let r = c.wait(slow).unwrap();
    assert!(r.error.is_none());
    assert!(dev.flushes() > flushes_before, "shutdown flushes writable exports");
    assert!(UnixStream::connect(&sock).is_err(), "no longer accepting");
}

#[test]
fn stats_count_requests_and_errors() {
    let srv = Running::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut c = srv.client();
    c.write(0, &[1u8; 1000], false).unwrap();
    let mut b = vec![0u8; 500];
    c.read(0, &mut b).unwrap();
    c.flush().unwrap();
    let _ = c.read(1 << 20, &mut b);
    let st = srv.server.as_ref().unwrap().stats();
    let e = &st.exports[0];
    assert_eq!((e.writes, e.bytes_written, e.reads, e.bytes_read, e.flushes, e.errors), (1, 1000, 1, 500, 1, 1));
    assert_eq!(e.active_connections, 1);
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn a_client_that_never_reads_replies_does_not_stall_other_connections() {
    let srv = Running::one(Arc::new(MemoryDev::new(64 << 20)));
    let mut hog = UnixStream::connect(&srv.sock).unwrap();
    // Raw handshake: skip the greeting, send flags and EXPORT_NAME "", then pile up reads.
    let mut g = [0u8; 18];
    hog.read_exact(&mut g).unwrap();
    hog.write_all(&3u32.to_be_bytes()).unwrap();
    hog.write_all(&encode_option_header(OPT_EXPORT_NAME, 0)).unwrap();
    let mut reply = [0u8; 10];
    hog.read_exact(&mut reply).unwrap();
    hog.set_nonblocking(true).unwrap();
    for i in 0..64u64 {
        let _ = hog.write_all(&encode_request(&Request { flags: 0, cmd: CMD_READ, cookie: i, offset: 0, len: 1 << 20 }));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut c = srv.client();
    c.write(0, b"others still served", false).unwrap();
    c.disconnect().unwrap();
    drop(hog);
    srv.stop();
}

#[test]
fn small_requests_on_a_slow_device_leave_the_reader_thread() {
    // Inline execution is on (the default); a device taking milliseconds must
    // still get requests in parallel and replies out of order once measured.
    let dev = TestDev::gated(1 << 20, 0, Duration::from_millis(2));
    let srv = Running::one(dev.clone());
    let mut c = srv.client();
    for i in 0..4u64 {
        let mut b = [0u8; 512];
        c.read(4096 * (i + 1), &mut b).unwrap();
    }
    let slow = c.submit(CMD_READ, 0, 0, 4096, &[]).unwrap();
    let fast = c.submit(CMD_READ, 0, 8192, 4096, &[]).unwrap();
    assert_eq!(c.wait_any().unwrap().cookie, fast);
    dev.open_gate();
    c.wait(slow).unwrap().into_result().unwrap();
    c.disconnect().unwrap();
    srv.stop();
}

#[test]
fn flush_on_one_connection_covers_writes_completed_on_another() {
    // CAN_MULTI_CONN is advertised for a device shared by all connections: a
    // write acknowledged on A is visible on B, and B's FLUSH reaches the device.
    let dev = TestDev::new(1 << 20, Caps::default());
    let srv = Running::one(dev.clone());
    let mut a = srv.client();
    let mut b = srv.client();
    assert!(a.info().multi_conn());
    a.write(4096, b"from connection a", false).unwrap();
    let before = dev.flushes();
    b.flush().unwrap();
    assert_eq!(dev.flushes(), before + 1);
    let mut got = [0u8; 17];
    b.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"from connection a");
    a.disconnect().unwrap();
    b.disconnect().unwrap();
    srv.stop();
}

// Issue 10 item 1: a client still negotiating when the server shuts down gets
// NBD_REP_ERR_SHUTDOWN for its next option (not a cut socket).
#[test]
fn shutdown_answers_a_negotiating_client_with_err_shutdown() {
    let mut srv = Running::start(long_grace(ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20)))])));
    let mut h = srv.handshake();
    assert_eq!(h.list().unwrap().len(), 1);
    let server = srv.server.take().unwrap();
    let stopping = std::thread::spawn(move || server.shutdown());
    std::thread::sleep(Duration::from_millis(200));
    let r = h.option_raw(OPT_GO, &encode_info_request("", &[])).unwrap();
    assert_eq!(r.last().unwrap().reply, REP_ERR_SHUTDOWN, "{r:?}");
    let t0 = std::time::Instant::now();
    h.abort().unwrap();
    stopping.join().unwrap().unwrap();
    assert!(t0.elapsed() < LONG_GRACE / 2, "the client's ABORT lets shutdown finish without waiting out the grace period: {:?}", t0.elapsed());
}

/// A grace period far longer than a shutdown that does not wait it out takes,
/// even on a loaded machine.
const LONG_GRACE: Duration = Duration::from_secs(30);

fn long_grace(mut cfg: ServerConfig) -> ServerConfig {
    cfg.shutdown_grace = LONG_GRACE;
    cfg
}

// Issue 10 item 1: at shutdown, requests already read are answered; requests
// that arrive afterwards get NBD_ESHUTDOWN (writes change nothing), and the
// client's soft disconnect ends the connection.
#[test]
fn shutdown_answers_in_flight_requests_and_later_ones_with_eshutdown() {
    let dev = TestDev::gated(1 << 20, 0, Duration::ZERO);
    let mut cfg = long_grace(ServerConfig::new(vec![Export::new("disk", dev.clone())]));
    cfg.inline_fast_requests = false;
    let mut srv = Running::start(cfg);
    for structured in [true, false] {
        let mut c = srv.client_with(ClientOptions { structured_replies: structured, block_status: structured, ..Default::default() });
        c.write(8192, &[5u8; 4096], false).unwrap();
        c.disconnect().unwrap();
    }
    let mut c = srv.client();
    let mut simple = srv.client_with(ClientOptions { structured_replies: false, block_status: false, ..Default::default() });
    let slow = c.submit(CMD_READ, 0, 0, 4096, &[]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let server = srv.server.take().unwrap();
    let stopping = std::thread::spawn(move || server.shutdown());
    std::thread::sleep(Duration::from_millis(200));
    for c in [&mut c, &mut simple] {
        let late = c.submit(CMD_READ, 0, 8192, 4096, &[]).unwrap();
        assert_eq!(errno_of(c.wait(late).unwrap().into_result()), ESHUTDOWN);
        let late_write = c.submit(CMD_WRITE, 0, 8192, 4096, &[9u8; 4096]).unwrap();
        assert_eq!(errno_of(c.wait(late_write).unwrap().into_result()), ESHUTDOWN);
        let late_flush = c.submit(CMD_FLUSH, 0, 0, 0, &[]).unwrap();
        assert_eq!(errno_of(c.wait(late_flush).unwrap().into_result()), ESHUTDOWN);
    }
    dev.open_gate();
    let r = c.wait(slow).unwrap().into_result().unwrap();
    assert_eq!(r.data, vec![0u8; 4096], "the request read before shutdown is answered");
    let t0 = std::time::Instant::now();
    c.disconnect().unwrap();
    simple.disconnect().unwrap();
    stopping.join().unwrap().unwrap();
    assert!(t0.elapsed() < LONG_GRACE / 2, "soft disconnects let shutdown finish without waiting out the grace period: {:?}", t0.elapsed());
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 8192).unwrap();
    assert_eq!(b, vec![5u8; 4096], "a write refused with ESHUTDOWN changed nothing");
}

// Issue 10 items 1 and 12: clients that neither negotiate nor send requests do
// not hold shutdown up beyond the grace period.
#[test]
fn shutdown_with_idle_clients_ends_after_the_grace_period() {
    let mut cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20)))]);
    cfg.shutdown_grace = Duration::from_millis(300);
    let srv = Running::start(cfg);
    let idle = srv.client();
    let negotiating = srv.handshake();
    let silent = UnixStream::connect(&srv.sock).unwrap();
    let t0 = std::time::Instant::now();
    srv.stop();
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "shutdown took {took:?}");
    drop((idle, negotiating, silent));
}
