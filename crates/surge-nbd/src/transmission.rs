//! The transmission phase.
//!
//! Each connection is served by a few threads in a leader/follower scheme (as
//! nbdkit does): the thread holding the connection's intake lock reads the next
//! request (buffered, so one `read` syscall often brings many headers) and its
//! whole write payload into a pooled buffer. A small read or write on a fast
//! export it runs right there, still holding the lock (no hand-off, no wake-up),
//! unless the device says it may wait on the network (a copy-on-write volume
//! reading its remote base: [`BlockDev::may_wait_remote`]), which would hold up
//! every request behind it; anything else it runs after releasing the lock, so
//! another thread reads the next request meanwhile. Replies are queued and sent by whichever thread finds
//! the queue unattended, many per `writev`. The pool of per-connection buffers
//! bounds the requests in flight: when all are out, nobody reads (backpressure).
//! A request runs only once its payload is complete, so a client that
//! disconnects mid-payload changes nothing.

use crate::handshake::{read_exact_or_eof, truncate_utf8, Negotiated};
use crate::io::{write_all_parts, Socket};
use crate::proto::*;
use crate::server::{ExportState, Shared};
use crate::zerocopy::{self, Pipe, SendError, ZeroCopy};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::ops::Range;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use surge_block::{BlockDev, BlockError, ExtentKind, ZeroMode};
use tracing::{debug, warn};

/// Socket read buffer of the reader thread.
pub(crate) const READ_BUFFER: usize = 64 * 1024;
/// Largest request payload advertised in NBD_INFO_BLOCK_SIZE.
pub const MAX_BLOCK: u32 = 32 << 20;
/// Write payloads above this close the connection; reads above it get EINVAL.
pub const HARD_MAX_PAYLOAD: u32 = 64 << 20;
/// Buffers bigger than this go back to the allocator after use, not to the pool.
const KEEP_BUFFER: usize = 4 << 20;
/// Requests bigger than KEEP_BUFFER in flight at once per connection (memory bound).
const BIG_IN_FLIGHT: usize = 4;
/// Structured reads at least this long send zero runs as OFFSET_HOLE chunks.
const HOLE_SCAN_MIN: u32 = 64 * 1024;
/// Longest error message sent in an error chunk.
const MAX_ERROR_MESSAGE: usize = 1024;
/// Reads and writes at least this long move between a file export and a plain
/// socket without passing through this process (sendfile, splice); smaller
/// ones are cheaper copied, batched with other replies in one writev.
const ZERO_COPY_MIN: usize = 64 * 1024;

/// The request buffers of one connection: a fixed number (the in-flight
/// bound), reused last-in first-out so the few buffers a steady load needs stay
/// hot in the CPU cache instead of cycling through all of them. While no
/// request is in flight for a while the server's janitor gives their memory
/// back ([`BufferPool::trim_if_idle`]): an idle connection holds nothing.
pub(crate) struct BufferPool {
    free: Mutex<Free>,
    returned: parking_lot::Condvar,
    total: usize,
}

struct Free {
    bufs: Vec<Vec<u8>>,
    /// When a buffer was last taken or given back.
    last_use: Instant,
}

impl BufferPool {
    fn new(total: usize) -> BufferPool {
        let free = Free { bufs: (0..total).map(|_| Vec::new()).collect(), last_use: Instant::now() };
        BufferPool { free: Mutex::new(free), returned: parking_lot::Condvar::new(), total }
    }

    fn try_take(&self) -> Option<Vec<u8>> {
        let mut free = self.free.lock();
        free.last_use = Instant::now();
        free.bufs.pop()
    }

    fn take(&self) -> Vec<u8> {
        let mut free = self.free.lock();
        loop {
            if let Some(b) = free.bufs.pop() {
                free.last_use = Instant::now();
                return b;
            }
            self.returned.wait(&mut free);
        }
    }

    fn put(&self, buf: Vec<u8>) {
        let mut free = self.free.lock();
        free.bufs.push(buf);
        free.last_use = Instant::now();
        drop(free);
        self.returned.notify_all();
    }

    /// Blocks until every buffer is back: every request has been answered.
    fn wait_all_returned(&self) {
        let mut free = self.free.lock();
        while free.bufs.len() < self.total {
            self.returned.wait(&mut free);
        }
    }

    /// Frees every buffer's memory if none is out and none was used for `idle`.
    pub(crate) fn trim_if_idle(&self, idle: Duration) {
        let mut free = self.free.lock();
        if free.bufs.len() == self.total && free.last_use.elapsed() >= idle {
            for b in free.bufs.iter_mut().filter(|b| b.capacity() > 0) {
                *b = Vec::new();
            }
        }
    }

    /// Bytes held by the buffers not in use.
    pub(crate) fn pooled_bytes(&self) -> usize {
        self.free.lock().bufs.iter().map(Vec::capacity).sum()
    }
}

/// A request with a 64-bit length (compact headers convert to it).
type Req = ExtendedRequest;

/// One request read off the wire, with its payload (writes) in `buf`.
struct Job {
    req: Req,
    buf: Vec<u8>,
    big: bool,
    /// Read after shutdown began: answered NBD_ESHUTDOWN, not run.
    refused: bool,
    /// A small read or write that may wait on a remote peer (a base image over
    /// the network): never run inline, and not part of the service time.
    remote: bool,
    /// A write payload held in a pipe (zero-copy): `buf` has only its first
    /// `prefix` bytes (what was already buffered), the pipe the rest.
    spliced: Option<Spliced>,
}

struct Spliced {
    pipe: Pipe,
    prefix: usize,
    rest: usize,
}

/// A reply waiting to be sent. It owns the request's buffer, which goes back to
/// the pool once the reply is on the wire.
pub(crate) struct OutMsg {
    /// Simple reply or chunk header (+ offset): the whole reply but read data.
    head: [u8; HEAD_MAX],
    head_len: u8,
    /// Bytes of `buf` sent after `head`.
    data: Range<usize>,
    /// Multi-part replies (sparse reads, errors, block status) instead of head/data.
    meta: Vec<u8>,
    parts: Vec<Part>,
    buf: Vec<u8>,
    big: bool,
    /// `parts` include file data to send with sendfile.
    zero_copy: bool,
}

const HEAD_MAX: usize = EXTENDED_REPLY_HEADER_LEN + 8;

#[derive(Debug, Clone)]
enum Part {
    Meta(Range<usize>),
    Data(Range<usize>),
    /// `len` bytes of the export's file from device offset `offset` (zero-copy reads).
    File { offset: u64, len: usize },
    /// The last chunk of a zero-copy read: `ok` (NONE) or, if reading the file
    /// failed while sending, `err` (an ERROR chunk); both in `meta`.
    Trailer { ok: Range<usize>, err: Range<usize> },
}

impl OutMsg {
    fn new(buf: Vec<u8>, big: bool) -> OutMsg {
        OutMsg { head: [0; HEAD_MAX], head_len: 0, data: 0..0, meta: Vec::new(), parts: Vec::new(), buf, big, zero_copy: false }
    }

    fn set_head(&mut self, bytes: &[u8]) {
        self.head[..bytes.len()].copy_from_slice(bytes);
        self.head_len = bytes.len() as u8;
    }

    /// Appends this reply's slices in wire order.
    fn slices<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        if self.parts.is_empty() {
            out.push(&self.head[..self.head_len as usize]);
            if !self.data.is_empty() {
                out.push(&self.buf[self.data.clone()]);
            }
            return;
        }
        for p in &self.parts {
            out.push(match p {
                Part::Meta(r) | Part::Trailer { ok: r, .. } => &self.meta[r.clone()],
                Part::Data(r) => &self.buf[r.clone()],
                Part::File { .. } => unreachable!("zero-copy replies are sent by Conn::write_zero_copy"),
            });
        }
    }

    /// Bytes of file data this reply sends with sendfile.
    fn file_bytes(&self) -> u64 {
        self.parts.iter().map(|p| if let Part::File { len, .. } = p { *len as u64 } else { 0 }).sum()
    }
}

/// Replies queued for sending; one thread at a time (the "flusher") writes them.
#[derive(Default)]
struct Outbox {
    queue: Vec<OutMsg>,
    spare: Vec<OutMsg>,
    flushing: bool,
}

/// What the reader and the workers share about one connection.
pub(crate) struct Conn<'a> {
    out: Mutex<Outbox>,
    writer: Mutex<Box<dyn Write + Send>>,
    /// Replies in chunks (structured replies or extended headers).
    structured: bool,
    /// Extended headers: 32-byte requests, every reply an extended chunk.
    extended: bool,
    meta_context: Option<u32>,
    buffers: std::sync::Arc<BufferPool>,
    big_tokens: Sender<()>,
    broken: AtomicBool,
    control: Option<Socket>,
    /// The device this connection uses: the export's, or the one its route
    /// picked for the client's address.
    dev: &'a dyn BlockDev,
    /// Set for plain sockets to exports that are plain files.
    zero_copy: Option<ZeroCopy<'a>>,
}

impl Conn<'_> {
    /// Queues a reply. With `flush`, the caller sends everything queued unless
    /// another thread is already doing so (that one picks this reply up too), so
    /// replies that complete together leave in one `writev`.
    fn enqueue(&self, msg: OutMsg, flush: bool) {
        let mut ob = self.out.lock();
        ob.queue.push(msg);
        if flush && !ob.flushing {
            ob.flushing = true;
            self.drain(ob);
        }
    }

    /// Sends whatever is queued (used by the inline reader before it blocks).
    fn flush(&self) {
        let mut ob = self.out.lock();
        if !ob.flushing && !ob.queue.is_empty() {
            ob.flushing = true;
            self.drain(ob);
        }
    }

    fn drain<'a>(&'a self, mut ob: parking_lot::MutexGuard<'a, Outbox>) {
        loop {
            let spare = std::mem::take(&mut ob.spare);
            let mut batch = std::mem::replace(&mut ob.queue, spare);
            drop(ob);
            self.write_batch(&batch);
            for m in batch.drain(..) {
                release(self, m.buf, m.big);
            }
            ob = self.out.lock();
            ob.spare = batch;
            if ob.queue.is_empty() {
                ob.flushing = false;
                return;
            }
        }
    }

    fn write_batch(&self, batch: &[OutMsg]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let res = {
            let mut w = self.writer.lock();
            self.write_locked(&mut **w, batch)
        };
        if let Err(e) = res {
            if !self.broken.swap(true, Ordering::Relaxed) {
                debug!(error = %e, "sending replies failed; closing");
                if let Some(c) = &self.control {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

impl Conn<'_> {
    /// Sends a batch of replies (the caller holds the writer): one writev, or
    /// for zero-copy reads writev/sendmsg pieces around each sendfile.
    fn write_locked(&self, w: &mut (dyn Write + Send), batch: &[OutMsg]) -> io::Result<()> {
        let mut slices = Vec::with_capacity(batch.len() * 2);
        for m in batch {
            if m.zero_copy {
                self.write_zero_copy(m, &mut slices)?;
            } else {
                m.slices(&mut slices);
            }
        }
        write_all_parts(w, &slices)?;
        w.flush()
    }

    /// Sends `slices` queued so far and this reply's parts up to its trailer
    /// (left in `slices` to go out with what follows). A file read that fails
    /// mid-chunk is padded with zeroes (the chunk's length is already on the
    /// wire) and answered with an error chunk; with simple replies, which cannot
    /// report it, the connection is closed.
    fn write_zero_copy<'m>(&self, m: &'m OutMsg, slices: &mut Vec<&'m [u8]>) -> io::Result<()> {
        let zc = self.zero_copy.as_ref().expect("zero-copy replies exist only where it is set up");
        let mut failed = false;
        for p in &m.parts {
            match p {
                Part::Meta(r) => slices.push(&m.meta[r.clone()]),
                Part::Data(r) => slices.push(&m.buf[r.clone()]),
                Part::Trailer { ok, err } => slices.push(&m.meta[if failed { err.clone() } else { ok.clone() }]),
                Part::File { offset, len } => {
                    zerocopy::send_more(zc.sock, slices)?;
                    slices.clear();
                    match zerocopy::send_file(zc.sock, zc.span.fd, zc.span.base + offset, *len) {
                        Ok(()) => {}
                        Err(SendError::Socket(e)) => return Err(e),
                        Err(SendError::File { sent, error }) => {
                            warn!(offset, len, %error, "reading the export's file failed while sending it");
                            if !self.structured {
                                return Err(io::Error::other(format!("read failed mid-reply: {error}")));
                            }
                            zerocopy::send_zeroes(zc.sock, len - sent)?;
                            failed = true;
                        }
                    }
                }
            }
        }
        zc.span.notify(false, m.file_bytes(), !failed);
        Ok(())
    }
}

/// The reading side of a connection, owned by whichever thread leads.
struct Intake<R> {
    reader: BufReader<R>,
    /// Set when reading stopped (EOF, DISC, bad input): the summary for the log.
    done: Option<io::Result<String>>,
}

/// Serves requests with `threads` threads until the client disconnects, then
/// waits for every request in flight to be answered. Returns a short summary
/// for the close log line.
pub(crate) fn serve<R: Read + Send>(
    shared: &Shared,
    conn_id: Option<u64>,
    neg: &Negotiated,
    dev: &dyn BlockDev,
    reader: BufReader<R>,
    writer: Box<dyn Write + Send>,
    control: Option<Socket>,
    threads: usize,
    plain: bool,
) -> io::Result<String> {
    let export = &shared.exports[neg.export];
    // Zero copy needs the bare socket (not TLS) and a device that is a plain file.
    let zero_copy = match (&control, plain) {
        (Some(sock), true) => dev.file_span().map(|span| ZeroCopy::new(std::os::unix::io::AsRawFd::as_raw_fd(sock), span, dev.size())),
        _ => None,
    };
    let max = shared.max_in_flight;
    let (big_tx, big_rx) = crossbeam_channel::bounded(BIG_IN_FLIGHT);
    for _ in 0..BIG_IN_FLIGHT {
        big_tx.send(()).expect("pool has room");
    }
    let conn = Conn {
        out: Mutex::new(Outbox::default()),
        writer: Mutex::new(writer),
        structured: neg.structured,
        extended: neg.extended,
        meta_context: neg.meta_context,
        buffers: std::sync::Arc::new(BufferPool::new(max)),
        big_tokens: big_tx,
        broken: AtomicBool::new(false),
        control,
        dev,
        zero_copy,
    };
    if let Some(id) = conn_id {
        shared.register_pool(id, &conn.buffers);
    }
    let intake = Mutex::new(Intake { reader, done: None });
    let pools = Pools { big_tokens: &big_rx, shutting_down: &shared.shutting_down };
    let inline_ok = shared.inline_fast_requests;
    std::thread::scope(|s| {
        for i in 1..threads.max(1) {
            let (conn, intake) = (&conn, &intake);
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-io{i}"))
                .spawn_scoped(s, move || lead_and_follow(export, conn, intake, pools, inline_ok));
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a connection thread; serving with fewer");
                break;
            }
        }
        lead_and_follow(export, &conn, &intake, pools, inline_ok);
    });
    conn.flush();
    // Every buffer back in the pool means every request has been answered.
    conn.buffers.wait_all_returned();
    intake.into_inner().done.unwrap_or_else(|| Ok("stopped".into()))
}

#[derive(Clone, Copy)]
struct Pools<'a> {
    big_tokens: &'a Receiver<()>,
    /// The server's shutdown flag: requests read once it is set are refused.
    shutting_down: &'a AtomicBool,
}

/// One serving thread: take the intake, read a request, run it (inline while
/// leading if it is small and the export fast, else after handing the intake on).
fn lead_and_follow<R: Read>(export: &ExportState, conn: &Conn, intake: &Mutex<Intake<R>>, pools: Pools, inline_ok: bool) {
    loop {
        let mut g = intake.lock();
        loop {
            if g.done.is_some() {
                return;
            }
            match next_request(conn, &mut g.reader, pools) {
                Ok(job) => {
                    // A request waiting on the network here would hold up every
                    // request behind it on this connection.
                    if job.refused || (inline_ok && is_small_io(&job.req) && !job.remote && export.service.fast()) {
                        run_job(export, conn, job, false);
                        continue;
                    }
                    drop(g);
                    run_job(export, conn, job, true);
                    break;
                }
                Err(end) => {
                    // Peers see `done` when they next take the intake, and stop.
                    g.done = Some(end);
                    return;
                }
            }
        }
    }
}

/// Reads the next request and its payload. `Err` ends the connection: `Ok(summary)`
/// for a clean end, `Err(e)` for bad input or a broken stream.
fn next_request<R: Read>(conn: &Conn, reader: &mut BufReader<R>, pools: Pools) -> Result<Job, io::Result<String>> {
    let hdr_len = if conn.extended { EXTENDED_REQUEST_HEADER_LEN } else { REQUEST_HEADER_LEN };
    if reader.buffer().len() < hdr_len {
        // About to block on the socket: send what inline execution queued.
        conn.flush();
    }
    let mut hdr = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    match read_exact_or_eof(reader, &mut hdr[..hdr_len]) {
        Ok(true) => {}
        Ok(false) => return Err(Ok("client closed the connection".into())),
        Err(e) => return Err(Err(e)),
    }
    if conn.broken.load(Ordering::Relaxed) {
        return Err(Ok("reply could not be sent".into()));
    }
    let parsed = if conn.extended {
        parse_extended_request(&hdr)
    } else {
        parse_request(hdr[..REQUEST_HEADER_LEN].try_into().expect("28 bytes")).map(Req::from)
    };
    let req = parsed.map_err(|e| Err(bad_input(format!("request header: {e}"))))?;
    if req.cmd == CMD_DISC {
        return Err(Ok("client disconnected".into()));
    }
    let payload = payload_len(conn, &req);
    if payload > HARD_MAX_PAYLOAD as u64 {
        return Err(Err(bad_input(format!("request payload of {payload} bytes exceeds {HARD_MAX_PAYLOAD}"))));
    }
    let carries_data = req.cmd == CMD_READ || payload > 0;
    let big = carries_data && req.len > KEEP_BUFFER as u64 && req.len <= HARD_MAX_PAYLOAD as u64;
    if big {
        conn.flush();
        let _ = pools.big_tokens.recv();
    }
    let mut buf = match conn.buffers.try_take() {
        Some(b) => b,
        None => {
            // All buffers in flight: make sure queued replies go out, then wait.
            conn.flush();
            conn.buffers.take()
        }
    };
    let refused = pools.shutting_down.load(Ordering::Relaxed);
    let mut spliced = None;
    if payload > 0 {
        let payload = payload as usize;
        if reader.buffer().len() < payload {
            conn.flush();
        }
        let rest = payload - reader.buffer().len().min(payload);
        let pipe = match &conn.zero_copy {
            Some(zc) if req.cmd == CMD_WRITE && !refused && payload >= ZERO_COPY_MIN && rest > 0 && conn.dev.in_file_span(req.offset, req.len, true) => {
                zc.take_pipe(rest).map(|p| (zc, p))
            }
            _ => None,
        };
        let read = match pipe {
            Some((zc, pipe)) => read_payload_into_pipe(reader, &mut buf, zc, pipe, payload).map(|s| spliced = s),
            None => read_payload(reader, sized(&mut buf, payload)),
        };
        if let Err(e) = read {
            // Nothing of this write is applied: it never runs.
            release(conn, buf, big);
            return Err(Err(io::Error::new(e.kind(), format!("client left in the middle of a write payload: {e}"))));
        }
    }
    let remote = is_small_io(&req) && conn.dev.may_wait_remote(req.offset, req.len, req.cmd == CMD_WRITE);
    Ok(Job { req, buf, big, refused, remote, spliced })
}

/// Zero-copy payload: what is already buffered goes to `buf`, the rest is
/// spliced from the socket into `pipe` (which must hold it). `None` when the
/// pipe ran out of slots first: then what it took and the rest of the payload
/// are in `buf`, for the copying path. On failure the pipe is discarded with
/// whatever it got.
fn read_payload_into_pipe<R: Read>(reader: &mut BufReader<R>, buf: &mut Vec<u8>, zc: &ZeroCopy, pipe: Pipe, payload: usize) -> io::Result<Option<Spliced>> {
    let prefix = reader.buffer().len().min(payload);
    sized(buf, prefix).copy_from_slice(&reader.buffer()[..prefix]);
    reader.consume(prefix);
    let rest = payload - prefix;
    let moved = match pipe.fill_from(zc.sock, rest) {
        Ok(n) if n == rest => return Ok(Some(Spliced { pipe, prefix, rest })),
        Ok(n) => n,
        Err(e) => {
            zc.discard_pipe(pipe);
            return Err(e);
        }
    };
    if buf.len() < payload {
        buf.resize(payload, 0);
    }
    let took = pipe.drain_into(&mut buf[prefix..prefix + moved]);
    match took {
        Ok(()) => zc.put_pipe(pipe),
        Err(_) => zc.discard_pipe(pipe),
    }
    took?;
    // The reader's buffer is empty (its bytes were the prefix): read on from the socket.
    reader.get_mut().read_exact(&mut buf[prefix + moved..payload])?;
    Ok(None)
}

/// Bytes of payload that follow the request header: compact headers carry one
/// only for WRITE; extended headers whenever NBD_CMD_FLAG_PAYLOAD_LEN is set
/// (the server reads it even for commands that take none, then refuses them).
fn payload_len(conn: &Conn, req: &Req) -> u64 {
    match conn.extended {
        true if req.flags & CMD_FLAG_PAYLOAD_LEN != 0 => req.len,
        true => 0,
        false if req.cmd == CMD_WRITE => req.len,
        false => 0,
    }
}

/// Fills `dst` from the buffered bytes, then reads a large remainder straight
/// from the socket into `dst` (one copy instead of two); small remainders go
/// through the buffer so their syscalls also bring in the next headers.
fn read_payload<R: Read>(reader: &mut BufReader<R>, dst: &mut [u8]) -> io::Result<()> {
    let have = reader.buffer().len().min(dst.len());
    dst[..have].copy_from_slice(&reader.buffer()[..have]);
    reader.consume(have);
    let rest = &mut dst[have..];
    if rest.len() >= READ_BUFFER {
        reader.get_mut().read_exact(rest)
    } else {
        reader.read_exact(rest)
    }
}

fn bad_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// `buf` as a slice of `len` bytes, growing it (zeroed by the allocator) if needed.
fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        *buf = vec![0u8; len];
    }
    &mut buf[..len]
}

fn release(conn: &Conn, mut buf: Vec<u8>, big: bool) {
    if buf.capacity() > KEEP_BUFFER {
        buf = Vec::new();
    }
    if big {
        let _ = conn.big_tokens.send(());
    }
    conn.buffers.put(buf);
}

/// Reads and writes small enough to be worth running on the reader thread.
fn is_small_io(req: &Req) -> bool {
    (req.cmd == CMD_READ || req.cmd == CMD_WRITE) && req.len <= INLINE_MAX_LEN as u64
}

const INLINE_MAX_LEN: u32 = 64 * 1024;
/// Small requests run on the reader thread while they take less than this on
/// average: handing them to a worker (wake-up, context switch) would cost more.
const INLINE_BELOW: Duration = Duration::from_micros(20);

/// Running average (EWMA, 1/8 weight) of the service time of small reads and
/// writes on one export, measured wherever they run, so an export whose device
/// slows down moves its requests back to the worker pool.
#[derive(Debug, Default)]
pub(crate) struct ServiceTime {
    avg_ns: AtomicU64,
}

impl ServiceTime {
    fn record(&self, took: Duration) {
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        let old = self.avg_ns.load(Ordering::Relaxed);
        // Racy read-modify-write: a lost sample only nudges an average.
        self.avg_ns.store(old - old / 8 + ns / 8, Ordering::Relaxed);
    }

    fn fast(&self) -> bool {
        self.avg_ns.load(Ordering::Relaxed) < INLINE_BELOW.as_nanos() as u64
    }
}

/// Why a request failed: the wire errno and a message for the client.
struct Fail {
    errno: u32,
    msg: String,
}

impl Fail {
    fn new(errno: u32, msg: impl Into<String>) -> Fail {
        Fail { errno, msg: msg.into() }
    }
}

impl From<BlockError> for Fail {
    fn from(e: BlockError) -> Fail {
        Fail { errno: wire_errno(e.errno()), msg: e.to_string() }
    }
}

/// Runs one request and queues its reply (sending it at once with `flush`).
fn run_job(export: &ExportState, conn: &Conn, job: Job, flush: bool) {
    let Job { req, buf, big, refused, remote, spliced } = job;
    let mut msg = OutMsg::new(buf, big);
    // The service time says whether local small requests are fast enough to
    // run inline; requests that wait on the network never run inline.
    let started = (is_small_io(&req) && !remote).then(Instant::now);
    let result = match spliced {
        // Payloads are spliced only when no shutdown was under way.
        Some(sp) => spliced_write(export, conn, &req, &mut msg, sp),
        // The spec: requests received during shutdown get ESHUTDOWN; the client then disconnects.
        None if refused => Err(Fail::new(ESHUTDOWN, "the server is shutting down")),
        None => execute(export, conn, &req, &mut msg),
    };
    if let Some(t) = started {
        export.service.record(t.elapsed());
    }
    if let Err(mut fail) = result {
        export.counters.errors.fetch_add(1, Ordering::Relaxed);
        // The spec allows ENOTSUP only as the answer to a fast zero request.
        if fail.errno == ENOTSUP && !(req.cmd == CMD_WRITE_ZEROES && req.flags & CMD_FLAG_FAST_ZERO != 0) {
            fail.errno = EINVAL;
        }
        if fail.errno == EIO || fail.errno == ENOSPC {
            warn!(export = %export.export.name, cmd = req.cmd, offset = req.offset, len = req.len, error = %fail.msg, "request failed");
        } else {
            debug!(cmd = req.cmd, offset = req.offset, len = req.len, errno = fail.errno, error = %fail.msg, "request refused");
        }
        error_reply(conn, &req, &fail, &mut msg);
    }
    conn.enqueue(msg, flush);
}

/// Does the request's work and fills `msg` with its successful reply.
/// Command flags valid for this request on this connection.
fn check_flags(conn: &Conn, req: &Req) -> Result<(), Fail> {
    // With extended headers WRITE must flag its payload; no other command takes one here.
    let payload_flag = if conn.extended && req.cmd == CMD_WRITE { CMD_FLAG_PAYLOAD_LEN } else { 0 };
    let bad_flags = req.flags & !(allowed_flags(req.cmd, conn.structured) | payload_flag);
    if bad_flags != 0 && is_known_command(req.cmd) {
        return Err(Fail::new(EINVAL, format!("flags {bad_flags:#x} are not valid for command {}", req.cmd)));
    }
    if payload_flag != 0 && req.flags & CMD_FLAG_PAYLOAD_LEN == 0 {
        return Err(Fail::new(EINVAL, "a WRITE with extended headers needs NBD_CMD_FLAG_PAYLOAD_LEN"));
    }
    Ok(())
}

fn execute(export: &ExportState, conn: &Conn, req: &Req, msg: &mut OutMsg) -> Result<(), Fail> {
    check_flags(conn, req)?;
    let c = &export.counters;
    let dev = conn.dev;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    match req.cmd {
        CMD_READ => {
            check_bounds(export, req, EINVAL)?;
            check_read_len(conn, req)?;
            match &conn.zero_copy {
                Some(_) if req.len >= ZERO_COPY_MIN as u64 && dev.in_file_span(req.offset, req.len, false) => {
                    zero_copy_read(conn, req, msg);
                    c.zero_copy_reads.fetch_add(1, Ordering::Relaxed);
                }
                _ => read(dev, conn, req, msg)?,
            }
            c.reads.fetch_add(1, Ordering::Relaxed);
            c.bytes_read.fetch_add(req.len, Ordering::Relaxed);
            return Ok(());
        }
        CMD_WRITE => {
            check_writable(export, req, ENOSPC)?;
            dev.write_at(&msg.buf[..req.len as usize], req.offset, fua)?;
            c.writes.fetch_add(1, Ordering::Relaxed);
            c.bytes_written.fetch_add(req.len, Ordering::Relaxed);
        }
        CMD_FLUSH => {
            dev.flush()?;
            c.flushes.fetch_add(1, Ordering::Relaxed);
        }
        CMD_TRIM => {
            check_writable(export, req, EINVAL)?;
            dev.discard(req.offset, req.len)?;
            flush_if(dev, fua)?;
            c.trims.fetch_add(1, Ordering::Relaxed);
        }
        CMD_WRITE_ZEROES => {
            check_writable(export, req, ENOSPC)?;
            let mode = ZeroMode {
                may_trim: req.flags & CMD_FLAG_NO_HOLE == 0,
                fast_only: req.flags & CMD_FLAG_FAST_ZERO != 0,
            };
            if mode.fast_only && !export.caps.fast_zero {
                // The flag was not advertised (NBD_FLAG_SEND_FAST_ZERO): a bad flag.
                return Err(Fail::new(EINVAL, "NBD_CMD_FLAG_FAST_ZERO on an export that does not advertise it"));
            }
            dev.write_zeroes(req.offset, req.len, mode)?;
            flush_if(dev, fua)?;
            c.zeroes.fetch_add(1, Ordering::Relaxed);
        }
        CMD_CACHE => {
            check_bounds(export, req, EINVAL)?;
            dev.prefetch(req.offset, req.len)?;
            c.caches.fetch_add(1, Ordering::Relaxed);
        }
        CMD_BLOCK_STATUS => {
            block_status(export, conn, req, msg)?;
            c.block_status.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        other => return Err(Fail::new(EINVAL, format!("unknown command {other}"))),
    }
    done_reply(conn, req, msg);
    Ok(())
}

/// A write whose payload waits in a pipe: checks as for any write, then the
/// device has the buffered prefix written and the rest spliced from the pipe
/// into its file ([`BlockDev::write_via_span`]). The pipe goes back for reuse
/// only if it was emptied.
fn spliced_write(export: &ExportState, conn: &Conn, req: &Req, msg: &mut OutMsg, sp: Spliced) -> Result<(), Fail> {
    let zc = conn.zero_copy.as_ref().expect("spliced payloads exist only with zero copy");
    let checked = check_flags(conn, req).and_then(|_| check_writable(export, req, ENOSPC));
    if let Err(f) = checked {
        zc.discard_pipe(sp.pipe);
        return Err(f);
    }
    let (span, len) = (zc.span, req.len);
    let at = span.base + req.offset;
    let mut moved = None;
    let written = {
        let mut fill = || {
            let r = zerocopy::pwrite_all(span.fd, &msg.buf[..sp.prefix], at).and_then(|_| zc.drain(&sp.pipe, at + sp.prefix as u64, sp.rest));
            moved = Some(r.is_ok());
            r
        };
        conn.dev.write_via_span(req.offset, len, &mut fill)
    };
    if let Some(ok) = moved {
        span.notify(true, len, ok);
    }
    match written {
        Ok(true) => zc.put_pipe(sp.pipe),
        // The range cannot take it now (a copy-on-write block left the
        // overlay since the payload was spliced): the device writes it.
        Ok(false) => {
            unsplice(conn, msg, sp)?;
            return execute(export, conn, req, msg);
        }
        Err(e) => {
            zc.discard_pipe(sp.pipe);
            return Err(e.into());
        }
    }
    // FUA: the file device's flush is what its own FUA write would do (fdatasync).
    flush_if(conn.dev, req.flags & CMD_FLAG_FUA != 0)?;
    let c = &export.counters;
    c.writes.fetch_add(1, Ordering::Relaxed);
    c.zero_copy_writes.fetch_add(1, Ordering::Relaxed);
    c.bytes_written.fetch_add(len, Ordering::Relaxed);
    done_reply(conn, req, msg);
    Ok(())
}

/// Moves a spliced payload back into the request's buffer, for the copying path.
fn unsplice(conn: &Conn, msg: &mut OutMsg, sp: Spliced) -> Result<(), Fail> {
    let zc = conn.zero_copy.as_ref().expect("spliced payloads exist only with zero copy");
    let len = sp.prefix + sp.rest;
    if msg.buf.len() < len {
        msg.buf.resize(len, 0);
    }
    match sp.pipe.drain_into(&mut msg.buf[sp.prefix..len]) {
        Ok(()) => {
            zc.put_pipe(sp.pipe);
            Ok(())
        }
        Err(e) => {
            zc.discard_pipe(sp.pipe);
            Err(Fail::new(EIO, format!("taking a write payload back from its pipe: {e}")))
        }
    }
}

/// A read answered from the export's file with sendfile when the reply is sent:
/// headers in `meta`, the data as `File` parts (split at the maximum payload).
/// Structured data chunks are not flagged DONE, as an error may still show up
/// while sending them; a NONE chunk (or an error chunk) ends the reply.
fn zero_copy_read(conn: &Conn, req: &Req, msg: &mut OutMsg) {
    msg.meta.clear();
    msg.parts.clear();
    msg.zero_copy = true;
    let len = req.len as usize;
    if !conn.structured {
        msg.meta.extend_from_slice(&encode_simple_reply(0, req.cookie));
        msg.parts.push(Part::Meta(0..msg.meta.len()));
        msg.parts.push(Part::File { offset: req.offset, len });
        return;
    }
    for p in split_data(vec![Piece { rel: 0, len: len as u32, hole: false }], MAX_BLOCK) {
        let at = msg.meta.len();
        push_chunk_header(conn, &mut msg.meta, 0, REPLY_TYPE_OFFSET_DATA, req, 8 + p.len as u64);
        msg.meta.extend_from_slice(&(req.offset + p.rel as u64).to_be_bytes());
        msg.parts.push(Part::Meta(at..msg.meta.len()));
        msg.parts.push(Part::File { offset: req.offset + p.rel as u64, len: p.len as usize });
    }
    let at = msg.meta.len();
    push_chunk_header(conn, &mut msg.meta, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req, 0);
    let ok = at..msg.meta.len();
    let text = b"reading the export's file failed";
    push_chunk_header(conn, &mut msg.meta, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, req, 6 + text.len() as u64);
    msg.meta.extend_from_slice(&EIO.to_be_bytes());
    msg.meta.extend_from_slice(&(text.len() as u16).to_be_bytes());
    msg.meta.extend_from_slice(text);
    let err = ok.end..msg.meta.len();
    msg.parts.push(Part::Trailer { ok, err });
}

/// A reply chunk header for this connection: structured (20 bytes) or extended
/// (32, echoing the request's offset, 64-bit length).
fn chunk_header(conn: &Conn, flags: u16, kind: u16, req: &Req, len: u64) -> ([u8; EXTENDED_REPLY_HEADER_LEN], usize) {
    if conn.extended {
        return (encode_extended_reply_header(flags, kind, req.cookie, req.offset, len), EXTENDED_REPLY_HEADER_LEN);
    }
    let mut b = [0u8; EXTENDED_REPLY_HEADER_LEN];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(flags, kind, req.cookie, len as u32));
    (b, CHUNK_HEADER_LEN)
}

/// Appends a chunk header to `out`.
fn push_chunk_header(conn: &Conn, out: &mut Vec<u8>, flags: u16, kind: u16, req: &Req, len: u64) {
    let (h, n) = chunk_header(conn, flags, kind, req, len);
    out.extend_from_slice(&h[..n]);
}

/// Success without data: a simple reply, or with extended headers (which allow
/// no simple replies) a NONE chunk.
fn done_reply(conn: &Conn, req: &Req, msg: &mut OutMsg) {
    if conn.extended {
        let (h, n) = chunk_header(conn, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req, 0);
        msg.set_head(&h[..n]);
    } else {
        msg.set_head(&encode_simple_reply(0, req.cookie));
    }
}

fn is_known_command(cmd: u16) -> bool {
    cmd <= CMD_BLOCK_STATUS
}

fn flush_if(dev: &dyn BlockDev, fua: bool) -> Result<(), Fail> {
    if fua {
        dev.flush()?;
    }
    Ok(())
}

fn check_bounds(export: &ExportState, req: &Req, errno: u32) -> Result<(), Fail> {
    let size = export.size();
    match req.offset.checked_add(req.len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Fail::new(errno, format!("{} bytes at offset {} is beyond the export size {size}", req.len, req.offset))),
    }
}

/// Writes, trims and zeroes: EPERM on read-only exports, `past_end` beyond
/// the end (the spec: ENOSPC for writes and write-zeroes, EINVAL for trims).
fn check_writable(export: &ExportState, req: &Req, past_end: u32) -> Result<(), Fail> {
    if export.read_only {
        return Err(Fail::new(EPERM, "export is read-only"));
    }
    check_bounds(export, req, past_end)
}

/// Read lengths: a structured read longer than the advertised maximum is split
/// into chunks (unless the client asked for one chunk, NBD_CMD_FLAG_DF); past the
/// hard limit it is refused with EOVERFLOW so the client retries smaller. Simple
/// replies cannot be split; a client must not ask for more than the maximum.
fn check_read_len(conn: &Conn, req: &Req) -> Result<(), Fail> {
    let df = req.flags & CMD_FLAG_DF != 0;
    if conn.structured && (req.len > HARD_MAX_PAYLOAD as u64 || (df && req.len > MAX_BLOCK as u64)) {
        let limit = if df { MAX_BLOCK } else { HARD_MAX_PAYLOAD };
        return Err(Fail::new(EOVERFLOW, format!("read of {} bytes in one reply exceeds {limit}", req.len)));
    }
    if req.len > HARD_MAX_PAYLOAD as u64 {
        return Err(Fail::new(EINVAL, format!("read of {} bytes exceeds {HARD_MAX_PAYLOAD}", req.len)));
    }
    Ok(())
}

/// Replaces whatever `msg` held with an error reply (simple, or an ERROR chunk).
fn error_reply(conn: &Conn, req: &Req, fail: &Fail, msg: &mut OutMsg) {
    msg.data = 0..0;
    msg.parts.clear();
    msg.zero_copy = false;
    if !conn.structured {
        msg.set_head(&encode_simple_reply(fail.errno, req.cookie));
        return;
    }
    let text = truncate_utf8(&fail.msg, MAX_ERROR_MESSAGE).as_bytes();
    msg.meta.clear();
    push_chunk_header(conn, &mut msg.meta, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, req, 6 + text.len() as u64);
    msg.meta.extend_from_slice(&fail.errno.to_be_bytes());
    msg.meta.extend_from_slice(&(text.len() as u16).to_be_bytes());
    msg.meta.extend_from_slice(text);
    msg.parts.push(Part::Meta(0..msg.meta.len()));
}

/// Reads into the request's buffer (`check_read_len` bounds `req.len`).
fn read(dev: &dyn BlockDev, conn: &Conn, req: &Req, msg: &mut OutMsg) -> Result<(), Fail> {
    let len = req.len as usize;
    dev.read_at(sized(&mut msg.buf, len), req.offset)?;
    if !conn.structured {
        msg.set_head(&encode_simple_reply(0, req.cookie));
        msg.data = 0..len;
        return Ok(());
    }
    if len == 0 {
        let (h, n) = chunk_header(conn, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req, 0);
        msg.set_head(&h[..n]);
        return Ok(());
    }
    let len32 = len as u32;
    let fragment = req.flags & CMD_FLAG_DF == 0;
    let pieces = if fragment && len32 >= HOLE_SCAN_MIN { zero_pieces(req.offset, &msg.buf[..len]) } else { None };
    if pieces.is_some() || len32 > MAX_BLOCK {
        let pieces = pieces.unwrap_or_else(|| vec![Piece { rel: 0, len: len32, hole: false }]);
        sparse_reply(conn, req, &split_data(pieces, MAX_BLOCK), msg);
        return Ok(());
    }
    let (h, n) = chunk_header(conn, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, req, 8 + req.len);
    let mut head = [0u8; HEAD_MAX];
    head[..n].copy_from_slice(&h[..n]);
    head[n..n + 8].copy_from_slice(&req.offset.to_be_bytes());
    msg.set_head(&head[..n + 8]);
    msg.data = 0..len;
    Ok(())
}

/// A piece of a read: `len` bytes at `rel` (relative to the request), zeroes or data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    rel: u32,
    len: u32,
    hole: bool,
}

/// Granularity of zero detection in reads.
const ZERO_SEGMENT: u64 = 64 * 1024;

fn is_zero(b: &[u8]) -> bool {
    // OR-reduce 4 KiB blocks (vectorizes well), stopping at the first non-zero block.
    b.chunks(4096).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// Splits read data into runs of zero and non-zero 64 KiB segments, or `None`
/// if it holds no zero segment, so the common case stays one data chunk.
fn zero_pieces(offset: u64, data: &[u8]) -> Option<Vec<Piece>> {
    let len = data.len() as u64;
    let mut pieces: Vec<Piece> = Vec::new();
    let mut rel = 0u64;
    while rel < len {
        let end = len.min(rel + ZERO_SEGMENT - (offset + rel) % ZERO_SEGMENT);
        let hole = is_zero(&data[rel as usize..end as usize]);
        let p = Piece { rel: rel as u32, len: (end - rel) as u32, hole };
        match pieces.last_mut() {
            Some(last) if last.hole == p.hole => last.len += p.len,
            _ => pieces.push(p),
        }
        rel = end;
    }
    pieces.iter().any(|p| p.hole).then_some(pieces)
}

/// Splits data pieces longer than `max` (the advertised maximum payload): no
/// chunk may carry more data than that.
fn split_data(pieces: Vec<Piece>, max: u32) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        if p.hole || p.len <= max {
            out.push(p);
            continue;
        }
        let mut rel = p.rel;
        while rel < p.rel + p.len {
            let len = max.min(p.rel + p.len - rel);
            out.push(Piece { rel, len, hole: false });
            rel += len;
        }
    }
    out
}

/// OFFSET_DATA chunks for data pieces, OFFSET_HOLE chunks for zero pieces; the
/// last is flagged DONE (the data is already read, so no error can follow).
fn sparse_reply(conn: &Conn, req: &Req, pieces: &[Piece], msg: &mut OutMsg) {
    msg.meta.clear();
    msg.parts.clear();
    for (i, p) in pieces.iter().enumerate() {
        let flags = if i + 1 == pieces.len() { REPLY_FLAG_DONE } else { 0 };
        let (kind, len) = if p.hole { (REPLY_TYPE_OFFSET_HOLE, 12) } else { (REPLY_TYPE_OFFSET_DATA, 8 + p.len as u64) };
        let at = msg.meta.len();
        push_chunk_header(conn, &mut msg.meta, flags, kind, req, len);
        msg.meta.extend_from_slice(&(req.offset + p.rel as u64).to_be_bytes());
        if p.hole {
            msg.meta.extend_from_slice(&p.len.to_be_bytes());
        }
        msg.parts.push(Part::Meta(at..msg.meta.len()));
        if !p.hole {
            msg.parts.push(Part::Data(p.rel as usize..(p.rel + p.len) as usize));
        }
    }
}

fn status_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Data => 0,
        ExtentKind::Zero => STATE_ZERO,
        ExtentKind::Hole => STATE_HOLE | STATE_ZERO,
    }
}

/// The spec's bound on descriptors in one block status chunk.
const MAX_DESCRIPTORS: usize = 1 << 20;

fn block_status(export: &ExportState, conn: &Conn, req: &Req, msg: &mut OutMsg) -> Result<(), Fail> {
    let Some(ctx) = conn.meta_context.filter(|_| conn.structured) else {
        return Err(Fail::new(EINVAL, "no metadata context was negotiated"));
    };
    if req.len == 0 {
        return Err(Fail::new(EINVAL, "block status of zero bytes"));
    }
    check_bounds(export, req, EINVAL)?;
    let extents = conn.dev.block_status(req.offset, req.len)?;
    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
    // Merged (len, flags) descriptors, clipped to the request (so they fit 32
    // bits whenever the request did).
    let mut descs: Vec<(u64, u32)> = Vec::new();
    let mut total = 0u64;
    for e in extents {
        let len = e.len.min(req.len - total);
        if len == 0 {
            break;
        }
        let flags = status_flags(e.kind);
        let full = descs.len() == MAX_DESCRIPTORS;
        match descs.last_mut() {
            Some(last) if last.1 == flags => last.0 += len,
            Some(_) if one || full => break,
            _ => descs.push((len, flags)),
        }
        total += len;
    }
    if descs.is_empty() {
        // The device reported nothing usable; status 0 ("data") is always safe.
        descs.push((req.len, 0));
    }
    let mut m = std::mem::take(&mut msg.meta);
    m.clear();
    let n = descs.len() as u64;
    if conn.extended {
        push_chunk_header(conn, &mut m, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS_EXT, req, 8 + 16 * n);
        m.extend_from_slice(&ctx.to_be_bytes());
        m.extend_from_slice(&(n as u32).to_be_bytes());
        for (len, flags) in descs {
            m.extend_from_slice(&len.to_be_bytes());
            m.extend_from_slice(&(flags as u64).to_be_bytes());
        }
    } else {
        push_chunk_header(conn, &mut m, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, req, 4 + 8 * n);
        m.extend_from_slice(&ctx.to_be_bytes());
        for (len, flags) in descs {
            m.extend_from_slice(&(len as u32).to_be_bytes());
            m.extend_from_slice(&flags.to_be_bytes());
        }
    }
    msg.parts.clear();
    msg.parts.push(Part::Meta(0..m.len()));
    msg.meta = m;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pieces_splits_on_64k_segments_and_merges_runs() {
        let mut data = vec![0u8; 256 * 1024];
        data[70 * 1024] = 1; // second segment has data
        let p = zero_pieces(0, &data).unwrap();
        assert_eq!(
            p,
            vec![
                Piece { rel: 0, len: 65536, hole: true },
                Piece { rel: 65536, len: 65536, hole: false },
                Piece { rel: 131072, len: 131072, hole: true },
            ]
        );
    }

    #[test]
    fn long_data_pieces_are_split_at_the_maximum_and_holes_kept() {
        let pieces = vec![Piece { rel: 0, len: 10, hole: false }, Piece { rel: 10, len: 100, hole: true }, Piece { rel: 110, len: 9, hole: false }];
        let got = split_data(pieces, 4);
        let lens: Vec<(u32, u32, bool)> = got.iter().map(|p| (p.rel, p.len, p.hole)).collect();
        assert_eq!(lens, vec![(0, 4, false), (4, 4, false), (8, 2, false), (10, 100, true), (110, 4, false), (114, 4, false), (118, 1, false)]);
    }

    #[test]
    fn all_data_reads_are_not_split() {
        let data = vec![7u8; 200 * 1024];
        assert_eq!(zero_pieces(4096, &data), None);
    }

    #[test]
    fn unaligned_reads_segment_on_absolute_boundaries() {
        let data = vec![0u8; 100 * 1024];
        let p = zero_pieces(60 * 1024, &data).unwrap();
        assert_eq!(p, vec![Piece { rel: 0, len: 100 * 1024, hole: true }]);
    }
}
