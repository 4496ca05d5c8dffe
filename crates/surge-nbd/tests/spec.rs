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

// --- Item 10: extended headers (NBD_OPT_EXTENDED_HEADERS), from the
// `extension-ext-header` branch of doc/proto.md. Neither Debian's libnbd (1.14)
// nor qemu (7.2) asks for them, so these tests speak the wire format directly.

const EXT_REQUEST_MAGIC: u32 = 0x21e4_1c71;
const EXT_REPLY_MAGIC: u32 = 0x6e8a_278c;
const OPT_EXT_HEADERS: u32 = 11;
const REP_EXT_HEADER_REQD: u32 = (1 << 31) + 10;
const FLAG_PAYLOAD_LEN: u16 = 1 << 5;
const TYPE_BLOCK_STATUS_EXT: u16 = 6;
const GIB: u64 = 1 << 30;

/// One extended reply chunk as received.
#[derive(Debug)]
struct ExtChunk {
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    payload: Vec<u8>,
}

impl ExtChunk {
    fn error(&self) -> Option<u32> {
        (self.kind & 0x8000 != 0).then(|| u32::from_be_bytes(self.payload[0..4].try_into().unwrap()))
    }
}

impl Raw {
    /// Sends an option and returns every reply up to the final one.
    fn option_replies(&mut self, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        self.option(option, data);
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; 20];
            self.s.read_exact(&mut h).unwrap();
            let h = parse_option_reply_header(&h).unwrap();
            let mut d = vec![0u8; h.len as usize];
            self.s.read_exact(&mut d).unwrap();
            let last = h.reply == REP_ACK || h.reply & (1 << 31) != 0;
            out.push((h.reply, d));
            if last {
                return out;
            }
        }
    }
    fn ext_request(&mut self, flags: u16, cmd: u16, cookie: u64, offset: u64, len: u64, payload: &[u8]) {
        let mut b = Vec::with_capacity(32 + payload.len());
        b.extend_from_slice(&EXT_REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }
    fn ext_chunk(&mut self) -> ExtChunk {
        let mut h = [0u8; 32];
        self.s.read_exact(&mut h).unwrap();
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let be64 = |i: usize| u64::from_be_bytes(h[i..i + 8].try_into().unwrap());
        assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), EXT_REPLY_MAGIC, "every reply must be an extended chunk: {h:02x?}");
        let len = be64(24);
        assert!(len <= (MAX_BLOCK as u64) + 8, "a chunk of {len} bytes");
        let mut payload = vec![0u8; len as usize];
        self.s.read_exact(&mut payload).unwrap();
        ExtChunk { flags: be16(4), kind: be16(6), cookie: be64(8), offset: be64(16), payload }
    }
    /// Every chunk of one reply (up to the DONE flag).
    fn ext_reply(&mut self) -> Vec<ExtChunk> {
        let mut out = Vec::new();
        loop {
            let c = self.ext_chunk();
            let done = c.flags & REPLY_FLAG_DONE != 0;
            out.push(c);
            if done {
                return out;
            }
        }
    }
}

/// Extended headers, base:allocation and GO on the default export; returns the context id.
fn ext_session(srv: &Srv) -> (Raw, u32) {
    let mut r = srv.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    assert_eq!(r.option_replies(OPT_EXT_HEADERS, &[]), vec![(REP_ACK, vec![])]);
    let meta = r.option_replies(OPT_SET_META_CONTEXT, &encode_meta_context_request("", &[BASE_ALLOCATION]));
    assert_eq!(meta.len(), 2, "{meta:?}");
    let ctx = u32::from_be_bytes(meta[0].1[0..4].try_into().unwrap());
    let go = r.option_replies(OPT_GO, &encode_info_request("", &[INFO_BLOCK_SIZE]));
    assert_eq!(go.last().unwrap().0, REP_ACK, "{go:?}");
    let export = go.iter().find(|(rep, d)| *rep == REP_INFO && d[0..2] == INFO_EXPORT.to_be_bytes()).unwrap();
    let tflags = u16::from_be_bytes([export.1[10], export.1[11]]);
    assert!(tflags & FLAG_SEND_DF != 0, "DF is advertised with extended headers");
    (r, ctx)
}

#[test]
fn extended_headers_carry_64_bit_lengths_and_every_reply_is_an_extended_chunk() {
    let srv = Srv::one(Arc::new(MemoryDev::new(6 * GIB)));
    let (mut r, ctx) = ext_session(&srv);
    // A write (payload length flag), echoed offset, NONE+DONE reply.
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    r.ext_request(FLAG_PAYLOAD_LEN, CMD_WRITE, 1, 5 * GIB, data.len() as u64, &data);
    let c = r.ext_reply();
    assert_eq!((c.len(), c[0].kind, c[0].cookie, c[0].offset, c[0].error()), (1, REPLY_TYPE_NONE, 1, 5 * GIB, None), "{c:?}");
    // Read it back: OFFSET_DATA, the header's offset is the request's.
    r.ext_request(0, CMD_READ, 2, 5 * GIB, 8192, &[]);
    let c = r.ext_reply();
    let got: Vec<u8> = c.iter().filter(|c| c.kind == REPLY_TYPE_OFFSET_DATA).flat_map(|c| c.payload[8..].to_vec()).collect();
    assert_eq!(got, data);
    assert!(c.iter().all(|c| c.cookie == 2 && c.offset == 5 * GIB), "{c:?}");
    // Block status over more than 4 GiB: BLOCK_STATUS_EXT with 64-bit lengths.
    r.ext_request(0, CMD_BLOCK_STATUS, 3, 0, 6 * GIB, &[]);
    let c = r.ext_reply();
    assert_eq!((c.len(), c[0].kind), (1, TYPE_BLOCK_STATUS_EXT), "{c:?}");
    let p = &c[0].payload;
    assert_eq!(u32::from_be_bytes(p[0..4].try_into().unwrap()), ctx);
    let count = u32::from_be_bytes(p[4..8].try_into().unwrap()) as usize;
    assert_eq!(p.len(), 8 + 16 * count);
    let descs: Vec<(u64, u64)> = p[8..].chunks(16).map(|d| (u64::from_be_bytes(d[0..8].try_into().unwrap()), u64::from_be_bytes(d[8..16].try_into().unwrap()))).collect();
    assert!(descs[0].0 >= 4 * GIB && descs[0].1 == (STATE_HOLE | STATE_ZERO) as u64, "a hole longer than 32 bits: {descs:?}");
    assert!(descs.iter().any(|d| d.1 == 0), "the written data: {descs:?}");
    assert_eq!(descs.iter().map(|d| d.0).sum::<u64>(), 6 * GIB);
    // Effect lengths over 32 bits: zero 5 GiB in one request.
    r.ext_request(0, CMD_WRITE_ZEROES, 4, 0, 5 * GIB + 4096, &[]);
    assert_eq!(r.ext_reply()[0].error(), None);
    r.ext_request(0, CMD_READ, 5, 5 * GIB, 4096, &[]);
    assert!(r.ext_reply().iter().all(|c| c.kind == REPLY_TYPE_OFFSET_HOLE || c.payload[8..].iter().all(|&b| b == 0)));
    // Errors are extended chunks too.
    r.ext_request(0, CMD_READ, 6, 6 * GIB, 512, &[]);
    assert_eq!(r.ext_reply()[0].error(), Some(EINVAL));
    r.ext_request(0, CMD_FLUSH, 7, 0, 0, &[]);
    let c = r.ext_reply();
    assert_eq!((c[0].kind, c[0].error()), (REPLY_TYPE_NONE, None));
    // A write without the payload flag is refused (nothing follows its header);
    // a payload on a command without one is read and refused, and the stream goes on.
    r.ext_request(0, CMD_WRITE, 8, 0, 4096, &[]);
    assert_eq!(r.ext_reply()[0].error(), Some(EINVAL));
    r.ext_request(FLAG_PAYLOAD_LEN, CMD_FLUSH, 9, 0, 8, &[1u8; 8]);
    assert_eq!(r.ext_reply()[0].error(), Some(EINVAL));
    r.ext_request(0, CMD_READ, 10, 5 * GIB, 16, &[]);
    assert_eq!(r.ext_reply()[0].error(), None);
    r.ext_request(0, CMD_DISC, 11, 0, 0, &[]);
    assert!(r.closed());
}

#[test]
fn extended_headers_negotiation_rules() {
    let srv = Srv::one(Arc::new(MemoryDev::new(1 << 20)));
    let mut r = srv.raw(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    assert_eq!(r.option_replies(OPT_EXT_HEADERS, b"x")[0].0, REP_ERR_INVALID, "the option takes no data");
    assert_eq!(r.option_replies(OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
    assert_eq!(r.option_replies(OPT_EXT_HEADERS, &[])[0].0, REP_ACK, "may follow structured replies");
    assert_eq!(r.option_replies(OPT_STRUCTURED_REPLY, &[])[0].0, REP_EXT_HEADER_REQD, "no downgrade");
    // NBD_OPT_EXPORT_NAME after extended headers is a client error: the session ends.
    r.option(OPT_EXPORT_NAME, b"");
    assert!(r.closed());
    // A client that does not ask keeps compact headers: 16-byte simple replies.
    let mut c = srv.client();
    c.write(0, b"compact", false).unwrap();
    c.disconnect().unwrap();
}
