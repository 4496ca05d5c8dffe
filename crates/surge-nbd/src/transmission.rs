//! The transmission phase.
//!
//! One reader thread per connection parses requests (buffered: many headers per
//! `read` syscall), reads write payloads completely into a pooled buffer and hands
//! the request to the export's worker pool. A worker does the device I/O, then
//! takes the connection's writer lock only to send the reply with one `writev`.
//! The pool of per-connection buffers bounds the requests in flight: when all are
//! out, the reader stops reading (backpressure). A request is dispatched only once
//! its payload is complete, so a client that disconnects mid-payload changes nothing.

use crate::handshake::{read_exact_or_eof, truncate_utf8, Negotiated};
use crate::io::{write_all_parts, Socket};
use crate::proto::*;
use crate::server::{ExportState, Shared};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use surge_block::{BlockDev, BlockError, ExtentKind, ZeroMode};
use tracing::{debug, warn};

/// Socket read buffer of the reader thread.
pub(crate) const READ_BUFFER: usize = 256 * 1024;
/// Largest request payload advertised in NBD_INFO_BLOCK_SIZE.
pub const MAX_BLOCK: u32 = 32 << 20;
/// Write payloads above this close the connection; reads above it get EINVAL.
pub const HARD_MAX_PAYLOAD: u32 = 64 << 20;
/// Buffers bigger than this go back to the allocator after use, not to the pool.
const KEEP_BUFFER: usize = 4 << 20;
/// Requests bigger than KEEP_BUFFER in flight at once per connection (memory bound).
const BIG_IN_FLIGHT: usize = 4;
/// Reads at least this long look for holes first (structured replies only).
const HOLE_SCAN_MIN: u32 = 64 * 1024;
/// Longest error message sent in an error chunk.
const MAX_ERROR_MESSAGE: usize = 1024;

pub(crate) enum Work {
    Request(Job),
    Stop,
}

pub(crate) struct Job {
    conn: Arc<Conn>,
    req: Request,
    buf: Vec<u8>,
    big: bool,
}

pub(crate) enum Dispatch {
    Pool(Sender<Work>),
    Inline,
}

/// What the reader and the workers share about one connection.
pub(crate) struct Conn {
    writer: Mutex<Box<dyn Write + Send>>,
    structured: bool,
    meta_context: Option<u32>,
    buffers: Sender<Vec<u8>>,
    big_tokens: Sender<()>,
    broken: AtomicBool,
    control: Option<Socket>,
}

impl Conn {
    /// Sends one reply; on failure marks the connection broken and wakes the reader.
    fn send(&self, parts: &[&[u8]]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let res = {
            let mut w = self.writer.lock();
            write_all_parts(&mut **w, parts).and_then(|_| w.flush())
        };
        if let Err(e) = res {
            if !self.broken.swap(true, Ordering::Relaxed) {
                debug!(error = %e, "sending reply failed; closing");
                if let Some(c) = &self.control {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

/// Serves requests until the client disconnects, then waits for every request in
/// flight to be answered. Returns a short summary for the close log line.
pub(crate) fn serve<R: Read>(
    shared: &Shared,
    neg: &Negotiated,
    mut reader: BufReader<R>,
    writer: Box<dyn Write + Send>,
    control: Option<Socket>,
    dispatch: Dispatch,
) -> io::Result<String> {
    let export = &shared.exports[neg.export];
    let max = shared.max_in_flight;
    let (buf_tx, buf_rx) = crossbeam_channel::bounded(max);
    for _ in 0..max {
        buf_tx.send(Vec::new()).expect("pool has room");
    }
    let (big_tx, big_rx) = crossbeam_channel::bounded(BIG_IN_FLIGHT);
    for _ in 0..BIG_IN_FLIGHT {
        big_tx.send(()).expect("pool has room");
    }
    let conn = Arc::new(Conn {
        writer: Mutex::new(writer),
        structured: neg.structured,
        meta_context: neg.meta_context,
        buffers: buf_tx,
        big_tokens: big_tx,
        broken: AtomicBool::new(false),
        control,
    });
    let mut scratch = Vec::new();
    let outcome = read_requests(export, &conn, &mut reader, &buf_rx, &big_rx, &dispatch, &mut scratch);
    // Every buffer back in the pool means every request has been answered.
    for _ in 0..max {
        let _ = buf_rx.recv();
    }
    if let Some(c) = &conn.control {
        let _ = c.shutdown(Shutdown::Both);
    }
    outcome
}

fn read_requests<R: Read>(
    export: &ExportState,
    conn: &Arc<Conn>,
    reader: &mut BufReader<R>,
    buffers: &Receiver<Vec<u8>>,
    big_tokens: &Receiver<()>,
    dispatch: &Dispatch,
    scratch: &mut Vec<u8>,
) -> io::Result<String> {
    loop {
        let mut hdr = [0u8; REQUEST_HEADER_LEN];
        if !read_exact_or_eof(reader, &mut hdr)? {
            return Ok("client closed the connection".into());
        }
        if conn.broken.load(Ordering::Relaxed) {
            return Ok("reply could not be sent".into());
        }
        let req = parse_request(&hdr).map_err(|e| bad_input(format!("request header: {e}")))?;
        if req.cmd == CMD_DISC {
            return Ok("client disconnected".into());
        }
        let payload = if req.cmd == CMD_WRITE { req.len } else { 0 };
        if payload > HARD_MAX_PAYLOAD {
            return Err(bad_input(format!("write payload of {payload} bytes exceeds {HARD_MAX_PAYLOAD}")));
        }
        let big = req.len as usize > KEEP_BUFFER && req.len <= HARD_MAX_PAYLOAD;
        if big {
            let _ = big_tokens.recv();
        }
        let mut buf = buffers.recv().expect("the connection holds a sender");
        if payload > 0 {
            if let Err(e) = reader.read_exact(sized(&mut buf, payload as usize)) {
                // Nothing of this write is applied: it was never dispatched.
                release(conn, buf, big);
                return Err(io::Error::new(e.kind(), format!("client left in the middle of a write payload: {e}")));
            }
        }
        let job = Job { conn: conn.clone(), req, buf, big };
        match dispatch {
            Dispatch::Pool(tx) => {
                if let Err(crossbeam_channel::SendError(Work::Request(job))) = tx.send(Work::Request(job)) {
                    execute(export, job, scratch);
                }
            }
            Dispatch::Inline => execute(export, job, scratch),
        }
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
    let _ = conn.buffers.send(buf);
}

pub(crate) fn worker_loop(export: &ExportState, rx: Receiver<Work>) {
    let mut scratch = Vec::new();
    while let Ok(Work::Request(job)) = rx.recv() {
        execute(export, job, &mut scratch);
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

/// Runs one request and sends its reply, then returns its buffer to the pool.
pub(crate) fn execute(export: &ExportState, job: Job, scratch: &mut Vec<u8>) {
    let Job { conn, req, mut buf, big } = job;
    let result = run(export, &conn, &req, &mut buf, scratch);
    match result {
        Ok(Answered::Ack) => send_ack(&conn, req.cookie),
        Ok(Answered::Sent) => {}
        Err(fail) => {
            export.counters.errors.fetch_add(1, Ordering::Relaxed);
            if fail.errno == EIO || fail.errno == ENOSPC {
                warn!(export = %export.export.name, cmd = req.cmd, offset = req.offset, len = req.len, error = %fail.msg, "request failed");
            } else {
                debug!(cmd = req.cmd, offset = req.offset, len = req.len, errno = fail.errno, error = %fail.msg, "request refused");
            }
            send_error(&conn, req.cookie, &fail);
        }
    }
    release(&conn, buf, big);
}

enum Answered {
    /// Succeeded without data: send the plain acknowledgement.
    Ack,
    /// The reply was already sent (reads and block status).
    Sent,
}

type Outcome = Result<Answered, Fail>;

fn run(export: &ExportState, conn: &Conn, req: &Request, buf: &mut Vec<u8>, scratch: &mut Vec<u8>) -> Outcome {
    let bad_flags = req.flags & !allowed_flags(req.cmd, conn.structured);
    if bad_flags != 0 && is_known_command(req.cmd) {
        return Err(Fail::new(EINVAL, format!("flags {bad_flags:#x} are not valid for command {}", req.cmd)));
    }
    let c = &export.counters;
    let dev = &*export.export.dev;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    match req.cmd {
        CMD_READ => {
            check_bounds(export, req, EINVAL)?;
            if req.len > HARD_MAX_PAYLOAD {
                let errno = if req.flags & CMD_FLAG_DF != 0 { EOVERFLOW } else { EINVAL };
                return Err(Fail::new(errno, format!("read of {} bytes exceeds {HARD_MAX_PAYLOAD}", req.len)));
            }
            read(export, conn, req, buf, scratch)?;
            c.reads.fetch_add(1, Ordering::Relaxed);
            c.bytes_read.fetch_add(req.len as u64, Ordering::Relaxed);
            Ok(Answered::Sent)
        }
        CMD_WRITE => {
            check_writable(export, req)?;
            dev.write_at(&buf[..req.len as usize], req.offset, fua)?;
            c.writes.fetch_add(1, Ordering::Relaxed);
            c.bytes_written.fetch_add(req.len as u64, Ordering::Relaxed);
            Ok(Answered::Ack)
        }
        CMD_FLUSH => {
            dev.flush()?;
            c.flushes.fetch_add(1, Ordering::Relaxed);
            Ok(Answered::Ack)
        }
        CMD_TRIM => {
            check_writable(export, req)?;
            dev.discard(req.offset, req.len as u64)?;
            flush_if(dev, fua)?;
            c.trims.fetch_add(1, Ordering::Relaxed);
            Ok(Answered::Ack)
        }
        CMD_WRITE_ZEROES => {
            check_writable(export, req)?;
            let mode = ZeroMode {
                may_trim: req.flags & CMD_FLAG_NO_HOLE == 0,
                fast_only: req.flags & CMD_FLAG_FAST_ZERO != 0,
            };
            if mode.fast_only && !export.caps.fast_zero {
                return Err(Fail::new(ENOTSUP, "this export cannot zero fast"));
            }
            dev.write_zeroes(req.offset, req.len as u64, mode)?;
            flush_if(dev, fua)?;
            c.zeroes.fetch_add(1, Ordering::Relaxed);
            Ok(Answered::Ack)
        }
        CMD_CACHE => {
            check_bounds(export, req, EINVAL)?;
            dev.prefetch(req.offset, req.len as u64)?;
            c.caches.fetch_add(1, Ordering::Relaxed);
            Ok(Answered::Ack)
        }
        CMD_BLOCK_STATUS => {
            block_status(export, conn, req, scratch)?;
            c.block_status.fetch_add(1, Ordering::Relaxed);
            Ok(Answered::Sent)
        }
        other => Err(Fail::new(EINVAL, format!("unknown command {other}"))),
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

fn check_bounds(export: &ExportState, req: &Request, errno: u32) -> Result<(), Fail> {
    let size = export.size();
    match req.offset.checked_add(req.len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Fail::new(errno, format!("{} bytes at offset {} is beyond the export size {size}", req.len, req.offset))),
    }
}

/// Writes, trims and zeroes: EPERM on read-only exports, ENOSPC past the end.
fn check_writable(export: &ExportState, req: &Request) -> Result<(), Fail> {
    if export.read_only {
        return Err(Fail::new(EPERM, "export is read-only"));
    }
    check_bounds(export, req, ENOSPC)
}

fn send_ack(conn: &Conn, cookie: u64) {
    conn.send(&[&encode_simple_reply(0, cookie)]);
}

fn send_error(conn: &Conn, cookie: u64, fail: &Fail) {
    if !conn.structured {
        conn.send(&[&encode_simple_reply(fail.errno, cookie)]);
        return;
    }
    let msg = truncate_utf8(&fail.msg, MAX_ERROR_MESSAGE).as_bytes();
    let hdr = encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6 + msg.len() as u32);
    let mut fixed = [0u8; 6];
    fixed[0..4].copy_from_slice(&fail.errno.to_be_bytes());
    fixed[4..6].copy_from_slice(&(msg.len() as u16).to_be_bytes());
    conn.send(&[&hdr, &fixed, msg]);
}

fn read(export: &ExportState, conn: &Conn, req: &Request, buf: &mut Vec<u8>, scratch: &mut Vec<u8>) -> Result<(), Fail> {
    let dev = &*export.export.dev;
    let len = req.len as usize;
    if conn.structured && len as u32 >= HOLE_SCAN_MIN && export.caps.block_status && req.flags & CMD_FLAG_DF == 0 {
        if let Some(pieces) = sparse_pieces(dev, req) {
            return read_sparse(dev, conn, req, &pieces, buf, scratch);
        }
    }
    let data = sized(buf, len);
    dev.read_at(data, req.offset)?;
    if !conn.structured {
        conn.send(&[&encode_simple_reply(0, req.cookie), data]);
    } else if len == 0 {
        conn.send(&[&encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0)]);
    } else {
        let mut head = [0u8; CHUNK_HEADER_LEN + 8];
        head[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            req.cookie,
            8 + len as u32,
        ));
        head[CHUNK_HEADER_LEN..].copy_from_slice(&req.offset.to_be_bytes());
        conn.send(&[&head, data]);
    }
    Ok(())
}

/// A piece of a read: `len` bytes at `rel` (relative to the request), a hole or data.
#[derive(Debug, Clone, Copy)]
struct Piece {
    rel: u32,
    len: u32,
    hole: bool,
}

/// Splits a read into data and zero pieces, or `None` if it is all data (or the
/// device cannot tell), so the common case stays one data chunk.
fn sparse_pieces(dev: &dyn BlockDev, req: &Request) -> Option<Vec<Piece>> {
    let extents = dev.block_status(req.offset, req.len as u64).ok()?;
    if extents.iter().all(|e| e.kind == ExtentKind::Data) {
        return None;
    }
    let mut pieces: Vec<Piece> = Vec::new();
    let mut rel = 0u32;
    for e in extents {
        let len = e.len.min((req.len - rel) as u64) as u32;
        if len == 0 {
            break;
        }
        push_piece(&mut pieces, Piece { rel, len, hole: e.kind != ExtentKind::Data });
        rel += len;
    }
    if rel < req.len {
        push_piece(&mut pieces, Piece { rel, len: req.len - rel, hole: false });
    }
    Some(pieces)
}

fn push_piece(pieces: &mut Vec<Piece>, p: Piece) {
    match pieces.last_mut() {
        Some(last) if last.hole == p.hole => last.len += p.len,
        _ => pieces.push(p),
    }
}

/// Reads the data pieces, then sends all chunks at once: OFFSET_DATA for data,
/// OFFSET_HOLE for zeroes, the last one flagged DONE (no error can follow).
fn read_sparse(
    dev: &dyn BlockDev,
    conn: &Conn,
    req: &Request,
    pieces: &[Piece],
    buf: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> Result<(), Fail> {
    let data = sized(buf, req.len as usize);
    for p in pieces.iter().filter(|p| !p.hole) {
        dev.read_at(&mut data[p.rel as usize..(p.rel + p.len) as usize], req.offset + p.rel as u64)?;
    }
    scratch.clear();
    for (i, p) in pieces.iter().enumerate() {
        let flags = if i + 1 == pieces.len() { REPLY_FLAG_DONE } else { 0 };
        let (kind, len) = if p.hole { (REPLY_TYPE_OFFSET_HOLE, 12) } else { (REPLY_TYPE_OFFSET_DATA, 8 + p.len) };
        scratch.extend_from_slice(&encode_chunk_header(flags, kind, req.cookie, len));
        scratch.extend_from_slice(&(req.offset + p.rel as u64).to_be_bytes());
        if p.hole {
            scratch.extend_from_slice(&p.len.to_be_bytes());
        }
    }
    let mut parts: Vec<&[u8]> = Vec::with_capacity(pieces.len() * 2);
    let mut at = 0;
    for p in pieces {
        let head = if p.hole { CHUNK_HEADER_LEN + 12 } else { CHUNK_HEADER_LEN + 8 };
        parts.push(&scratch[at..at + head]);
        at += head;
        if !p.hole {
            parts.push(&data[p.rel as usize..(p.rel + p.len) as usize]);
        }
    }
    conn.send(&parts);
    Ok(())
}

fn block_status(export: &ExportState, conn: &Conn, req: &Request, scratch: &mut Vec<u8>) -> Result<(), Fail> {
    let Some(ctx) = conn.meta_context.filter(|_| conn.structured) else {
        return Err(Fail::new(EINVAL, "no metadata context was negotiated"));
    };
    if req.len == 0 {
        return Err(Fail::new(EINVAL, "block status of zero bytes"));
    }
    check_bounds(export, req, EINVAL)?;
    let extents = export.export.dev.block_status(req.offset, req.len as u64)?;
    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
    scratch.clear();
    scratch.extend_from_slice(&[0u8; CHUNK_HEADER_LEN]);
    scratch.extend_from_slice(&ctx.to_be_bytes());
    let (mut total, mut last): (u32, Option<u32>) = (0, None);
    for e in extents {
        let len = e.len.min((req.len - total) as u64) as u32;
        if len == 0 {
            break;
        }
        let flags = match e.kind {
            ExtentKind::Data => 0,
            ExtentKind::Zero => STATE_ZERO,
            ExtentKind::Hole => STATE_HOLE | STATE_ZERO,
        };
        if last == Some(flags) {
            // Same status as the previous descriptor: extend it.
            let at = scratch.len() - 8;
            let prev = u32::from_be_bytes(scratch[at..at + 4].try_into().expect("4 bytes"));
            scratch[at..at + 4].copy_from_slice(&(prev + len).to_be_bytes());
        } else {
            if one && last.is_some() {
                break;
            }
            scratch.extend_from_slice(&len.to_be_bytes());
            scratch.extend_from_slice(&flags.to_be_bytes());
            last = Some(flags);
        }
        total += len;
    }
    if last.is_none() {
        // The device reported nothing usable; status 0 ("data") is always safe.
        scratch.extend_from_slice(&req.len.to_be_bytes());
        scratch.extend_from_slice(&0u32.to_be_bytes());
    }
    let payload = (scratch.len() - CHUNK_HEADER_LEN) as u32;
    scratch[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        req.cookie,
        payload,
    ));
    conn.send(&[scratch]);
    Ok(())
}
