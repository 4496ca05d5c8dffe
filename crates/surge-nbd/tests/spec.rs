//! The server against the SHOULDs of NetworkBlockDevice/nbd `doc/proto.md`
//! (and the `extension-ext-header` branch for extended headers), through the
//! crate's client and, where a well-behaved client cannot provoke a case,
//! through raw sockets.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, BlockError, Caps, Extent, MemoryDev, ZeroMode};
use surge_nbd::client::{Client, ClientError, ClientOptions, Handshake, ReadChunk, ZeroFlags};
use surge_nbd::proto::*;
use surge_nbd::{AllowList, Export, Listen, Server, ServerConfig, HARD_MAX_PAYLOAD, MAX_BLOCK};

/// A server on a unix socket in a temp dir.
struct Srv {
    server: Option<Server>,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Srv {
    fn start(exports: Vec<Export>) -> Srv {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let server = Server::start(ServerConfig::new(exports)).unwrap();
        server.listen(&Listen::Unix(sock.clone())).unwrap();
        Srv { server: Some(server), sock, _dir: dir }
    }
    fn one(dev: Arc<dyn BlockDev>) -> Srv {
        Srv::start(vec![Export::new("disk", dev)])
    }
    fn client(&self) -> Client {
        Client::connect_unix(&self.sock, &ClientOptions::default()).unwrap()
    }
    fn handshake(&self) -> Handshake {
        Handshake::connect_unix(&self.sock).unwrap()
    }
    fn raw(&self, client_flags: u32) -> Raw {
        Raw::connect(&self.sock, client_flags)
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().unwrap();
        }
    }
}

/// A raw connection after the greeting (client flags already sent).
struct Raw {
    s: UnixStream,
}

impl Raw {
    fn connect(sock: &std::path::Path, client_flags: u32) -> Raw {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s.write_all(&client_flags.to_be_bytes()).unwrap();
        Raw { s }
    }
    fn option(&mut self, option: u32, data: &[u8]) {
        self.s.write_all(&encode_option_header(option, data.len() as u32)).unwrap();
        self.s.write_all(data).unwrap();
    }
    /// The next option reply, or `None` if the server closed the connection.
    fn reply(&mut self) -> Option<OptionReplyHeader> {
        let mut h = [0u8; 20];
        if !read_or_eof(&mut self.s, &mut h) {
            return None;
        }
        let h = parse_option_reply_header(&h).unwrap();
        let mut d = vec![0u8; h.len as usize];
        self.s.read_exact(&mut d).unwrap();
        Some(h)
    }
    /// Reads until EOF; true if the server closed without sending anything more.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn read_or_eof(s: &mut impl Read, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    true
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u32 {
    r.expect_err("request should fail").errno().expect("a request error")
}

/// A memory device with chosen caps, optionally failing every write with `write_errno`.
struct Dev {
    inner: MemoryDev,
    caps: Caps,
    write_errno: Option<i32>,
}

impl Dev {
    fn new(size: u64, caps: Caps) -> Dev {
        Dev { inner: MemoryDev::new(size), caps, write_errno: None }
    }
}

impl BlockDev for Dev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        if let Some(e) = self.write_errno {
            return Err(BlockError::io("write", offset, buf.len() as u64, std::io::Error::from_raw_os_error(e)));
        }
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        if mode.fast_only && !self.caps.fast_zero {
            return Err(BlockError::NotSupported("fast zeroing"));
        }
        self.inner.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
}

/// Reads as 0xa5 everywhere (no holes to find), writes are dropped.
struct Filled(u64);

impl BlockDev for Filled {
    fn size(&self) -> u64 {
        self.0
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.0, offset, buf.len() as u64)?;
        buf.fill(0xa5);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> surge_block::Result<()> {
        surge_block::check_range(self.0, offset, buf.len() as u64)
    }
    fn flush(&self) -> surge_block::Result<()> {
        Ok(())
    }
}

// Item 2: "It SHOULD return NBD_EINVAL if it receives a read or trim request
// including one or more sectors beyond the size of the device"; writes and
// write-zeroes past the end stay ENOSPC.
#[test]
fn trim_past_the_end_is_einval_while_writes_past_the_end_are_enospc() {
    let srv = Srv::one(Arc::new(MemoryDev::new(1 << 20)));
    for structured in [true, false] {
        let mut c = Client::connect_unix(&srv.sock, &ClientOptions { structured_replies: structured, block_status: false, ..Default::default() }).unwrap();
        assert_eq!(errno_of(c.trim(1 << 20, 4096, false)), EINVAL, "trim past the end");
        assert_eq!(errno_of(c.trim((1 << 20) - 512, 4096, true)), EINVAL, "trim straddling the end");
        assert_eq!(errno_of(c.cache(1 << 20, 4096)), EINVAL);
        let mut buf = [0u8; 512];
        assert_eq!(errno_of(c.read(1 << 20, &mut buf)), EINVAL);
        assert_eq!(errno_of(c.write(1 << 20, &[1u8; 512], false)), ENOSPC);
        assert_eq!(errno_of(c.write_zeroes(1 << 20, 4096, ZeroFlags::default())), ENOSPC);
        c.trim(0, 4096, false).unwrap();
        c.disconnect().unwrap();
    }
}

// Item 4: "If the server did not advertise NBD_FLAG_SEND_FAST_ZERO, then it
// SHOULD NOT fail with NBD_ENOTSUP ... and SHOULD fail with NBD_EINVAL if the
// NBD_CMD_FLAG_FAST_ZERO flag was set."
#[test]
fn fast_zero_without_the_advertised_flag_is_einval_and_with_it_enotsup() {
    let slow = Arc::new(Dev::new(1 << 20, Caps::default()));
    let fast_but_failing = Arc::new(Dev::new(1 << 20, Caps { fast_zero: true, ..Caps::default() }));
    let srv = Srv::start(vec![Export::new("slow", slow), Export::new("fast", fast_but_failing.clone())]);
    let mut c = Client::connect_unix(&srv.sock, &ClientOptions { export: "slow".into(), ..Default::default() }).unwrap();
    assert!(!c.info().has(FLAG_SEND_FAST_ZERO));
    c.write(0, &[7u8; 4096], false).unwrap();
    assert_eq!(errno_of(c.write_zeroes(0, 4096, ZeroFlags { fast: true, ..Default::default() })), EINVAL);
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, vec![7u8; 4096], "a refused fast zero changes nothing");
    c.disconnect().unwrap();
    // An export that advertises fast zeroing may still fail one with ENOTSUP.
    let mut c = Client::connect_unix(&srv.sock, &ClientOptions { export: "fast".into(), ..Default::default() }).unwrap();
    assert!(c.info().has(FLAG_SEND_FAST_ZERO));
    c.write_zeroes(0, 4096, ZeroFlags { fast: true, ..Default::default() }).unwrap();
    c.disconnect().unwrap();
}

// Item 9: "It also SHOULD map the EDQUOT and EFBIG errors to NBD_ENOSPC."
#[test]
fn efbig_and_edquot_from_the_device_are_enospc_on_the_wire() {
    for errno in [libc::EFBIG, libc::EDQUOT, libc::ENOSPC] {
        let dev = Dev { write_errno: Some(errno), ..Dev::new(1 << 20, Caps::default()) };
        let srv = Srv::one(Arc::new(dev));
        let mut c = srv.client();
        assert_eq!(errno_of(c.write(0, &[1u8; 4096], false)), ENOSPC, "device errno {errno}");
        c.disconnect().unwrap();
    }
}

// Item 5: NBD_OPT_SET_META_CONTEXT "replaces all previously-set metadata
// contexts (including when this command fails)".
#[test]
fn a_failed_set_meta_context_clears_the_previous_selection() {
    let srv = Srv::one(Arc::new(MemoryDev::new(1 << 20)));
    let bad_requests: [(&str, Vec<u8>); 3] = [
        ("unknown export", encode_meta_context_request("no-such-export", &[BASE_ALLOCATION])),
        ("malformed data", vec![0, 0, 0, 9]),
        ("trailing bytes", [encode_meta_context_request("", &[BASE_ALLOCATION]), vec![1]].concat()),
    ];
    for (what, data) in bad_requests {
        let mut h = srv.handshake();
        assert!(h.structured_replies().unwrap());
        assert_eq!(h.set_meta_context("", &[BASE_ALLOCATION]).unwrap().len(), 1);
        let r = h.option_raw(OPT_SET_META_CONTEXT, &data).unwrap();
        assert!(r.last().unwrap().is_error(), "{what}: {r:?}");
        let mut c = h.go("").unwrap();
        let k = c.submit(CMD_BLOCK_STATUS, 0, 0, 4096, &[]).unwrap();
        assert_eq!(errno_of(c.wait(k).unwrap().into_result()), EINVAL, "{what}: the old selection must be gone");
        c.disconnect().unwrap();
    }
}

// Item 6: strings "MUST NOT exceed 4,096 bytes" (names echoed in errors,
// descriptions, messages).
#[test]
fn strings_sent_to_the_client_never_exceed_4096_bytes() {
    let long_name = "n".repeat(MAX_STRING);
    let mut refused = Export::new(long_name.clone(), Arc::new(MemoryDev::new(1 << 20)));
    refused.allow = Some("10.0.0.0/8".parse::<AllowList>().unwrap());
    refused.description = "d".repeat(3 * MAX_STRING);
    let mut described = Export::new("described", Arc::new(MemoryDev::new(1 << 20)));
    described.description = "é".repeat(MAX_STRING);
    let srv = Srv::start(vec![described, refused]);
    let mut h = srv.handshake();
    let escaped = "\u{1}".repeat(MAX_STRING);
    for name in [long_name.as_str(), &"x".repeat(MAX_STRING), &escaped] {
        for opt in [OPT_INFO, OPT_GO] {
            let replies = h.option_raw(opt, &encode_info_request(name, &[INFO_NAME, INFO_DESCRIPTION])).unwrap();
            let last = replies.last().unwrap();
            assert!(last.is_error(), "{replies:?}");
            assert!(last.data.len() <= MAX_STRING, "option {opt}: an error message of {} bytes", last.data.len());
        }
        assert!(h.structured_replies().unwrap());
        for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
            let replies = h.option_raw(opt, &encode_meta_context_request(name, &[BASE_ALLOCATION])).unwrap();
            assert!(replies.last().unwrap().data.len() <= MAX_STRING, "option {opt}: {} bytes", replies.last().unwrap().data.len());
        }
    }
    let info = h.option_raw(OPT_INFO, &encode_info_request("described", &[INFO_DESCRIPTION])).unwrap();
    for r in &info {
        assert!(r.data.len() <= 2 + MAX_STRING, "an info reply of {} bytes", r.data.len());
    }
    h.abort().unwrap();
}

// Item 7: NBD_OPT_EXPORT_NAME cannot be answered with an option reply, so an
// oversized one ends the session instead of getting NBD_REP_ERR_TOO_BIG.
#[test]
fn export_name_with_an_oversized_payload_ends_the_session() {
    let srv = Srv::one(Arc::new(MemoryDev::new(1 << 20)));
    for len in [MAX_STRING + 1, 100_000, 1 << 20] {
        let mut r = srv.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        r.s.write_all(&encode_option_header(OPT_EXPORT_NAME, len as u32)).unwrap();
        // The server may close before reading all of it.
        let _ = r.s.write_all(&vec![b'a'; len]);
        assert!(r.reply().is_none(), "an option reply to NBD_OPT_EXPORT_NAME of {len} bytes");
    }
    // Other options with oversized data still get NBD_REP_ERR_TOO_BIG and go on.
    let mut r = srv.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_LIST, &vec![0u8; 100_000]);
    assert_eq!(r.reply().unwrap().reply, REP_ERR_TOO_BIG);
    r.option(OPT_ABORT, &[]);
    assert_eq!(r.reply().unwrap().reply, REP_ACK);
}

// Item 3: a structured READ longer than the advertised maximum payload is
// split into chunks no larger than it; with NBD_CMD_FLAG_DF it gets
// NBD_EOVERFLOW, as does any read over the hard limit.
#[test]
fn reads_longer_than_the_maximum_payload_are_split_or_refused_with_eoverflow() {
    let size = 2 * HARD_MAX_PAYLOAD as u64;
    let srv = Srv::one(Arc::new(Filled(size)));
    let mut c = srv.client();
    let (min, _pref, max) = c.info().block_size.unwrap();
    assert_eq!((min, max), (1, MAX_BLOCK));
    let len = MAX_BLOCK + MAX_BLOCK / 2 + 4096;
    let r = c.read_reply(4096, len, 0).unwrap();
    assert!(r.chunks.len() >= 2, "{:?}", r.chunks);
    for ch in &r.chunks {
        let ReadChunk::Data { len, .. } = ch else { panic!("{ch:?}") };
        assert!(*len <= MAX_BLOCK, "a chunk of {len} bytes exceeds the advertised maximum {MAX_BLOCK}");
    }
    assert_eq!(r.data.len(), len as usize);
    assert!(r.data.iter().all(|&b| b == 0xa5));
    assert_eq!(errno_of(c.read_reply(0, len, CMD_FLAG_DF)), EOVERFLOW);
    assert_eq!(errno_of(c.read_reply(0, HARD_MAX_PAYLOAD + 4096, 0)), EOVERFLOW);
    // At the limit, with DF, one chunk.
    let r = c.read_reply(0, MAX_BLOCK, CMD_FLAG_DF).unwrap();
    assert_eq!(r.chunks, vec![ReadChunk::Data { offset: 0, len: MAX_BLOCK }]);
    c.disconnect().unwrap();
}
