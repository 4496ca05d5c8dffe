//! [`RemoteDev`]: a remote NBD export (surge, nbdkit, qemu-nbd, ...) as a
//! [`BlockDev`], for streamed base images and persistent remote volumes.
//!
//! - **Concurrency.** Any number of threads call it at once. Requests go
//!   round-robin over `connections` connections (one when the server does not
//!   advertise multi-conn), each with many requests in flight and a reader
//!   thread matching replies to callers by cookie. Structured replies are
//!   negotiated, and `base:allocation`, so [`BlockDev::block_status`] reports
//!   the server's holes.
//! - **Reconnect.** When a connection breaks (reset, EOF, a reply that does not
//!   come within `request_timeout`, an ESHUTDOWN reply from a server stopping),
//!   every request on it is sent again after a reconnect, retried with backoff
//!   for up to `reconnect_timeout`. Why resending is safe: every NBD request
//!   this device sends carries its whole effect (READ, BLOCK_STATUS and CACHE
//!   change nothing; WRITE carries all its data; WRITE_ZEROES and TRIM name
//!   their range; FLUSH is idempotent), so a request the server had already
//!   applied when the connection broke ends up applied with the same result;
//!   and the caller is still waiting for it, so nothing it issued later
//!   depends on it (requests that overlap and run concurrently have no order
//!   to keep). What a restarted server may have *lost* is handled by the
//!   replay log: writes it acknowledged but that no FLUSH covered yet are kept
//!   (past `replay_limit` bytes we send a FLUSH without waiting for it, so
//!   the writer is not held up by the server's sync; past twice the limit
//!   writers wait for one) and sent again on the new connection before any other request (pipelined: the log keeps
//!   only the newest change of each byte, so its entries are disjoint and a
//!   server may run them in any order). Every new connection is made before
//!   that replay starts: a server that restarts after it cuts them all, so
//!   none is left up on a server that lost what the replay sent. A FLUSH the
//!   server fails may have lost what it covered (a writeback error), so the
//!   log is sent again before the next FLUSH. FUA writes are logged too,
//!   though durable: they cut what they overwrite out of older entries.
//!   Not covered: a write the server still runs for a connection that broke
//!   (a link failure, not a restart) can land after its retry on the new
//!   connection, and after newer writes: NBD has no way to fence a dead
//!   connection. And two concurrent overlapping writes acknowledged in one order
//!   and applied by the server in the other; after a restart, the replay
//!   applies them in acknowledgement order.
//! - **FUA** is sent as the flag where the server takes it, else as the
//!   write followed by a FLUSH.
//! - **Gone.** If no connection can be made within `reconnect_timeout`, the
//!   waiting requests fail with `BlockError::Gone` naming the URI, the time and
//!   the last error; later requests try once and fail at once while the server
//!   stays away, and work again when it is back.
//! - **TLS** when the URI says `nbds://` (see [`uri`]), verified against a CA.

mod conn;
mod replay;
pub mod uri;

use crate::client::{ClientError, Handshake, Reply};
use crate::io::Socket;
use crate::proto::*;
use crate::tls;
use conn::{Conn, Failure};
use parking_lot::{Mutex, RwLock};
use replay::{Effect, ReplayLog};
use serde::Serialize;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::{check_range, BlockDev, BlockError, Caps, Extent, ExtentKind, ZeroMode};
pub use uri::{Endpoint, NbdUri, UriError};

/// How a [`RemoteDev`] connects and recovers.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Connections to open (only one if the server lacks multi-conn).
    pub connections: usize,
    /// How long to keep trying to reconnect before requests fail.
    pub reconnect_timeout: Duration,
    /// A request unanswered this long declares its connection dead.
    pub request_timeout: Duration,
    /// Largest request sent (bigger ones are split); also capped by the
    /// server's maximum block size.
    pub max_request: u32,
    /// Bytes of unflushed acknowledged writes kept for replay before the
    /// device flushes on its own.
    pub replay_limit: u64,
    /// TLS client configuration for `nbds://`; by default the CA comes from the
    /// URI's `tls-certificates=DIR` (`DIR/ca-cert.pem`).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Ask the server for read-only access (refuse writes locally).
    pub read_only: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            connections: 4,
            reconnect_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
            max_request: 32 << 20,
            replay_limit: 64 << 20,
            tls: None,
            read_only: false,
        }
    }
}

/// Why a remote export could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{uri}: {source}")]
    Connect {
        uri: String,
        #[source]
        source: ClientError,
    },
    #[error("{uri}: nbds:// needs a CA to check the server: add ?tls-certificates=DIR (holding ca-cert.pem)")]
    NoCa { uri: String },
    #[error("{uri}: {source}")]
    Tls {
        uri: String,
        #[source]
        source: tls::TlsError,
    },
    #[error("{uri}: the export is empty (0 bytes)")]
    Empty { uri: String },
}

/// Counters for `surge status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RemoteStats {
    pub uri: String,
    pub connections: usize,
    pub connections_open: usize,
    pub requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Requests sent again after a connection broke.
    pub retries: u64,
    pub reconnects: u64,
    /// Writes sent again from the replay log after reconnects.
    pub replayed: u64,
    /// Unflushed acknowledged writes kept for replay.
    pub replay_bytes: u64,
    /// Why the server is considered gone, while it is.
    pub gone: Option<String>,
    /// FLUSHes sent in the background to bound the replay log.
    pub bounding_flushes: u64,
    /// Times a writer flushed and waited (the log past twice its limit), and
    /// how long those waits took in all, in microseconds.
    pub waited_flushes: u64,
    pub waited_flush_us: u64,
}

struct Slot {
    conn: Option<Arc<Conn>>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    retries: AtomicU64,
    reconnects: AtomicU64,
    replayed: AtomicU64,
    bounding_flushes: AtomicU64,
    waited_flushes: AtomicU64,
    waited_flush_us: AtomicU64,
}

pub struct RemoteDev {
    uri: NbdUri,
    text: String,
    opts: RemoteOptions,
    tls: Option<Arc<rustls::ClientConfig>>,
    size: u64,
    flags: u16,
    block_status: bool,
    preferred_block: u32,
    max_request: u32,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    /// Requests hold it shared while in flight; a replay holds it exclusively.
    epoch: RwLock<()>,
    reconnecting: Mutex<()>,
    replay: Mutex<ReplayLog>,
    /// The FLUSH sent to bound the replay log, not waited for: its mark, when
    /// it was sent, and where its reply comes.
    bounding: Mutex<Option<BoundingFlush>>,
    /// A FLUSH failed on the server: it may have dropped the writes it
    /// covered, so the log is sent again before the next one.
    resend: AtomicBool,
    gone: Mutex<Option<String>>,
    counters: Counters,
}

struct BoundingFlush {
    mark: u64,
    sent: Instant,
    reply: crossbeam_channel::Receiver<Result<Reply, Failure>>,
}

/// One request as sent.
#[derive(Clone, Copy)]
struct Req<'a> {
    cmd: u16,
    flags: u16,
    offset: u64,
    len: u32,
    payload: &'a [u8],
}

impl RemoteDev {
    /// Connect (all connections) or fail with the reason.
    pub fn open(uri: &NbdUri, opts: RemoteOptions) -> Result<RemoteDev, RemoteError> {
        let text = uri.to_string();
        let tls = match (uri.tls, &opts.tls, &uri.tls_certificates) {
            (false, _, _) => None,
            (true, Some(cfg), _) => Some(cfg.clone()),
            (true, None, Some(dir)) => Some(tls::client_config_from_dir(dir).map_err(|source| RemoteError::Tls { uri: text.clone(), source })?),
            (true, None, None) => return Err(RemoteError::NoCa { uri: text }),
        };
        let first = connect(uri, tls.as_ref()).map_err(|source| RemoteError::Connect { uri: text.clone(), source })?;
        let info = first.info.clone();
        if info.size == 0 {
            return Err(RemoteError::Empty { uri: text });
        }
        let n = if info.multi_conn() { opts.connections.max(1) } else { 1 };
        let mut slots = vec![Mutex::new(Slot { conn: Some(first.clone()) })];
        for _ in 1..n {
            let c = connect(uri, tls.as_ref()).map_err(|source| RemoteError::Connect { uri: text.clone(), source })?;
            slots.push(Mutex::new(Slot { conn: Some(c) }));
        }
        let (_, preferred, max) = info.block_size.unwrap_or((1, 4096, 32 << 20));
        Ok(RemoteDev {
            uri: uri.clone(),
            text,
            tls,
            size: info.size,
            flags: info.flags,
            block_status: first.block_status,
            preferred_block: preferred.clamp(512, 1 << 20).next_power_of_two(),
            max_request: opts.max_request.min(max).max(4096),
            opts,
            slots,
            next: AtomicUsize::new(0),
            epoch: RwLock::new(()),
            reconnecting: Mutex::new(()),
            replay: Mutex::new(ReplayLog::default()),
            bounding: Mutex::new(None),
            resend: AtomicBool::new(false),
            gone: Mutex::new(None),
            counters: Counters::default(),
        })
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    pub fn stats(&self) -> RemoteStats {
        let c = &self.counters;
        RemoteStats {
            uri: self.text.clone(),
            connections: self.slots.len(),
            connections_open: self.slots.iter().filter(|s| s.lock().conn.as_ref().is_some_and(|c| !c.is_broken())).count(),
            requests: c.requests.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            write_bytes: c.write_bytes.load(Relaxed),
            retries: c.retries.load(Relaxed),
            reconnects: c.reconnects.load(Relaxed),
            replayed: c.replayed.load(Relaxed),
            replay_bytes: self.replay.lock().bytes(),
            gone: self.gone.lock().clone(),
            bounding_flushes: c.bounding_flushes.load(Relaxed),
            waited_flushes: c.waited_flushes.load(Relaxed),
            waited_flush_us: c.waited_flush_us.load(Relaxed),
        }
    }

    fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Whether acknowledged writes may still be lost by the server (it asks
    /// for flushes), so they are kept for replay.
    fn volatile(&self) -> bool {
        self.has(FLAG_SEND_FLUSH)
    }

    /// A healthy connection, round-robin.
    fn healthy(&self) -> Option<Arc<Conn>> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Relaxed);
        (0..n).find_map(|i| self.slots[(start + i) % n].lock().conn.clone().filter(|c| !c.is_broken()))
    }

    fn pick(&self) -> Result<Arc<Conn>, BlockError> {
        loop {
            if let Some(c) = self.healthy() {
                return Ok(c);
            }
            self.reconnect()?;
        }
    }

    /// Reconnect every broken slot (one thread at a time), replay unflushed
    /// writes, or give up after `reconnect_timeout`.
    fn reconnect(&self) -> Result<(), BlockError> {
        let _one = self.reconnecting.lock();
        if self.healthy().is_some() {
            return Ok(());
        }
        let started = Instant::now();
        let was_gone = self.gone.lock().is_some();
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = connect(&self.uri, self.tls.as_ref())
                .map_err(|e| e.to_string())
                .and_then(|c| self.check_same_export(&c).map(|_| c))
                .and_then(|first| {
                    let spares = self.spare_connections();
                    self.replay_on(&first).map(|_| (first, spares))
                });
            match result {
                Ok((first, spares)) => {
                    self.install(first, spares);
                    *self.gone.lock() = None;
                    self.counters.reconnects.fetch_add(1, Relaxed);
                    tracing::info!(uri = %self.text, attempts, "reconnected");
                    return Ok(());
                }
                Err(e) => {
                    // A server already known gone gets one try per request.
                    if was_gone || started.elapsed() >= self.opts.reconnect_timeout {
                        let msg = format!("{}: server unreachable for {:.1} s ({attempts} attempts): {e}", self.text, started.elapsed().as_secs_f64());
                        tracing::warn!("{msg}");
                        *self.gone.lock() = Some(msg.clone());
                        return Err(BlockError::Gone(msg));
                    }
                    tracing::debug!(uri = %self.text, "reconnect failed: {e}");
                    std::thread::sleep(backoff.min(self.opts.reconnect_timeout.saturating_sub(started.elapsed())));
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    fn check_same_export(&self, c: &Conn) -> Result<(), String> {
        if c.info.size != self.size {
            c.kill("export changed");
            return Err(format!("the export is now {} bytes, was {}", c.info.size, self.size));
        }
        Ok(())
    }

    /// Send every logged write again, in order, before anything else runs.
    fn replay_on(&self, c: &Conn) -> Result<(), String> {
        let _only = self.epoch.write();
        self.replay_locked(c)
    }

    /// The replay itself (the caller holds the epoch exclusively), pipelined:
    /// the log's entries are disjoint, so the order the server applies them
    /// in does not matter.
    fn replay_locked(&self, c: &Conn) -> Result<(), String> {
        let log = self.replay.lock();
        let mut in_flight = Vec::with_capacity(log.len());
        for e in log.entries() {
            let (cmd, flags, len, payload): (u16, u16, u32, &[u8]) = match &e.effect {
                Effect::Write(d) => (CMD_WRITE, 0, d.len() as u32, d),
                Effect::Zeroes { len, flags } => (CMD_WRITE_ZEROES, *flags, *len, &[]),
                Effect::Trim { len } => (CMD_TRIM, 0, *len, &[]),
            };
            in_flight.push(c.send(cmd, flags, e.offset, len, payload).map_err(|f| failure_text(&f))?);
        }
        for rx in in_flight {
            self.replayed_reply(c, &rx)?;
        }
        self.counters.replayed.fetch_add(log.len() as u64, Relaxed);
        Ok(())
    }

    fn replayed_reply(&self, c: &Conn, rx: &crossbeam_channel::Receiver<Result<Reply, Failure>>) -> Result<(), String> {
        match rx.recv_timeout(self.opts.request_timeout) {
            Ok(Ok(r)) if r.error.is_none() => Ok(()),
            Ok(Ok(r)) => Err(format!("replaying a write: server error {:?}", r.error)),
            Ok(Err(f)) => Err(failure_text(&f)),
            Err(_) => {
                c.kill("replay timed out");
                Err("replay timed out".into())
            }
        }
    }

    /// After a FLUSH the server failed: send the log again (it may have
    /// dropped those writes) before the next FLUSH may cover them.
    fn resend_log(&self) -> Result<(), BlockError> {
        if !self.resend.load(Relaxed) {
            return Ok(());
        }
        let conn = self.pick()?;
        let _only = self.epoch.write();
        if !self.resend.swap(false, Relaxed) {
            return Ok(());
        }
        self.replay_locked(&conn).map_err(|why| {
            self.resend.store(true, Relaxed);
            BlockError::io("flush", 0, 0, io::Error::other(format!("{}: resending unflushed writes after a failed FLUSH: {why}", self.text)))
        })
    }

    /// Connections for the broken slots but one (best effort: a slot that
    /// fails stays broken until needed). They are made before the replay, not
    /// after: one made after it could reach a server that restarted since and
    /// lost what the replay sent, and nothing would send it again while that
    /// connection stayed up (the restart cut the others, so their requests
    /// fail; this one's would read stale data).
    fn spare_connections(&self) -> Vec<Arc<Conn>> {
        let broken = self.slots.iter().filter(|s| s.lock().conn.as_ref().is_none_or(|c| c.is_broken())).count();
        (1..broken).filter_map(|_| connect(&self.uri, self.tls.as_ref()).ok().filter(|c| c.info.size == self.size)).collect()
    }

    /// Put `first`, then the spares, into the broken slots.
    fn install(&self, first: Arc<Conn>, spares: Vec<Arc<Conn>>) {
        let mut fresh = std::iter::once(first).chain(spares);
        for slot in &self.slots {
            let mut s = slot.lock();
            if s.conn.as_ref().is_some_and(|c| !c.is_broken()) {
                continue;
            }
            match fresh.next() {
                Some(c) => s.conn = Some(c),
                None => break,
            }
        }
    }

    /// Send one request and wait for its reply, across reconnects.
    fn call(&self, req: Req, op: &'static str) -> Result<Reply, BlockError> {
        self.counters.requests.fetch_add(1, Relaxed);
        let mut tries = 0u32;
        loop {
            let conn = self.pick()?;
            let shared = self.epoch.read();
            let mark = (req.cmd == CMD_FLUSH).then(|| self.replay.lock().mark());
            let outcome = match conn.send(req.cmd, req.flags, req.offset, req.len, req.payload) {
                Ok(rx) => match rx.recv_timeout(self.opts.request_timeout) {
                    Ok(o) => o,
                    Err(_) => {
                        let why = format!("no reply in {:?}", self.opts.request_timeout);
                        conn.kill(&why);
                        Err(Failure::Broken(why))
                    }
                },
                Err(f) => Err(f),
            };
            match outcome {
                Ok(reply) => match reply.error {
                    Some((errno, _)) if errno == ESHUTDOWN => {
                        // The server is stopping: retry on the next one.
                        conn.kill("server shutting down");
                    }
                    Some((errno, msg)) => return Err(errno_error(errno, &msg, op, req.offset, req.len as u64)),
                    None => {
                        self.logged(&req, mark);
                        return Ok(reply);
                    }
                },
                Err(Failure::Protocol(why)) => return Err(BlockError::Gone(format!("{}: {why}", self.text))),
                Err(Failure::Broken(why)) => tracing::debug!(uri = %self.text, "request interrupted ({why}); retrying"),
            }
            drop(shared);
            tries += 1;
            self.counters.retries.fetch_add(1, Relaxed);
            if tries > 1000 {
                return Err(BlockError::Gone(format!("{}: request retried {tries} times", self.text)));
            }
        }
    }

    /// Keep an acknowledged change for replay, or drop what a FLUSH covered
    /// (called while the request still holds the epoch shared).
    fn logged(&self, req: &Req, mark: Option<u64>) {
        if !self.volatile() {
            return;
        }
        // FUA changes are durable, yet logged: an older unflushed change to
        // the same range is in the log, and a replay must land this one
        // after it, not leave the older one on top.
        let effect = match req.cmd {
            CMD_WRITE => Effect::Write(req.payload.to_vec()),
            CMD_WRITE_ZEROES => Effect::Zeroes { len: req.len, flags: req.flags & !CMD_FLAG_FUA },
            CMD_TRIM => Effect::Trim { len: req.len },
            CMD_FLUSH => {
                self.replay.lock().flushed(mark.unwrap_or(0));
                return;
            }
            _ => return,
        };
        self.replay.lock().push(req.offset, effect);
    }

    /// After a write: keep the replay log near its limit. Past the limit a
    /// FLUSH is sent and not waited for: a server syncing a large volatile
    /// cache can take seconds, and a writer waiting for it holds whatever
    /// the layers above gave it (a fair-queue slot, a client's request).
    /// Its reply is taken by a later write. Past twice the limit (the server
    /// syncs slower than we write, or the background FLUSH was lost) the
    /// writer flushes and waits: the log's memory stays bounded.
    fn bound_replay_log(&self) -> Result<(), BlockError> {
        if !self.volatile() {
            return Ok(());
        }
        self.reap_bounding_flush();
        let bytes = self.replay.lock().bytes();
        if bytes > self.opts.replay_limit.saturating_mul(2) {
            let t = Instant::now();
            let r = self.flush();
            let waited = t.elapsed();
            self.counters.waited_flushes.fetch_add(1, Relaxed);
            self.counters.waited_flush_us.fetch_add(waited.as_micros() as u64, Relaxed);
            tracing::warn!(uri = %self.text, "a writer waited {} ms for the server's FLUSH: {} MiB acknowledged and not yet flushed (the server syncs slower than it is written)", waited.as_millis(), bytes >> 20);
            return r;
        }
        if bytes > self.opts.replay_limit {
            self.start_bounding_flush();
        }
        Ok(())
    }

    /// Take the background FLUSH's reply if it came: what it covered leaves
    /// the log. One that failed, broke or is older than the request timeout
    /// is dropped (its writes stay logged; the next bound sends another).
    fn reap_bounding_flush(&self) {
        let mut b = self.bounding.lock();
        let Some(f) = b.as_ref() else { return };
        match f.reply.try_recv() {
            Ok(Ok(reply)) => match reply.error {
                None => self.replay.lock().flushed(f.mark),
                // The writes it covered stay logged and are sent again before
                // the next FLUSH (the server may have dropped them).
                Some((errno, msg)) => {
                    tracing::warn!(uri = %self.text, "background flush failed (errno {errno}: {msg}); its writes stay logged and are sent again");
                    self.resend.store(true, Relaxed);
                }
            },
            Ok(Err(_)) | Err(crossbeam_channel::TryRecvError::Disconnected) => {}
            Err(crossbeam_channel::TryRecvError::Empty) if f.sent.elapsed() > self.opts.request_timeout => {}
            Err(crossbeam_channel::TryRecvError::Empty) => return,
        }
        *b = None;
    }

    fn start_bounding_flush(&self) {
        let mut b = self.bounding.lock();
        if b.is_some() {
            return;
        }
        let Some(conn) = self.healthy() else { return };
        let mark = self.replay.lock().mark();
        if let Ok(reply) = conn.send(CMD_FLUSH, 0, 0, 0, &[]) {
            self.counters.bounding_flushes.fetch_add(1, Relaxed);
            *b = Some(BoundingFlush { mark, sent: Instant::now(), reply });
        }
    }

    /// Split `[offset, offset+len)` into requests of at most `max_request`.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
        let max = self.max_request as u64;
        (0..len.div_ceil(max)).map(move |i| (offset + i * max, (len - i * max).min(max) as u32))
    }

    fn writable(&self) -> Result<(), BlockError> {
        if self.has(FLAG_READ_ONLY) || self.opts.read_only {
            Err(BlockError::ReadOnly)
        } else {
            Ok(())
        }
    }
}

impl Drop for RemoteDev {
    fn drop(&mut self) {
        for s in &self.slots {
            if let Some(c) = s.lock().conn.take() {
                c.disconnect();
            }
        }
    }
}

fn failure_text(f: &Failure) -> String {
    match f {
        Failure::Broken(s) | Failure::Protocol(s) => s.clone(),
    }
}

/// The error a failed request reports, from the NBD errno.
fn errno_error(errno: u32, msg: &str, op: &'static str, offset: u64, len: u64) -> BlockError {
    match errno {
        EPERM => BlockError::ReadOnly,
        ENOSPC => BlockError::NoSpace,
        ENOTSUP => BlockError::NotSupported(op),
        _ => {
            let e = io::Error::from_raw_os_error(errno as i32);
            let e = if msg.is_empty() { e } else { io::Error::new(e.kind(), format!("{e}: {msg}")) };
            BlockError::io(op, offset, len, e)
        }
    }
}

/// Open one connection: TCP or unix, STARTTLS if asked, structured replies,
/// `base:allocation`, GO.
fn connect(uri: &NbdUri, tls: Option<&Arc<rustls::ClientConfig>>) -> Result<Arc<Conn>, ClientError> {
    let socket = match &uri.endpoint {
        Endpoint::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port).to_socket_addrs()?.collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} resolves to no address"));
            let mut stream = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = stream.ok_or(last)?;
            s.set_nodelay(true)?;
            Socket::Tcp(s)
        }
        Endpoint::Unix(p) => Socket::Unix(UnixStream::connect(p)?),
    };
    let mut h = Handshake::from_socket(socket)?;
    if let Some(cfg) = tls {
        h = h.starttls(cfg.clone(), &uri.tls_server_name())?;
    }
    if h.structured_replies()? {
        // Without base:allocation everything reads as data; still usable.
        let _ = h.set_meta_context(&uri.export, &[BASE_ALLOCATION]);
    }
    let client = h.go(&uri.export)?;
    Ok(Conn::start(client.into_parts(), &uri.export)?)
}

impl BlockDev for RemoteDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            read_only: self.has(FLAG_READ_ONLY) || self.opts.read_only,
            volatile_cache: self.has(FLAG_SEND_FLUSH),
            discard: self.has(FLAG_SEND_TRIM),
            fast_zero: self.has(FLAG_SEND_FAST_ZERO),
            block_status: self.block_status,
            multi_conn: true,
            preferred_block: self.preferred_block,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        for (off, len) in self.pieces(offset, buf.len() as u64) {
            let r = self.call(Req { cmd: CMD_READ, flags: 0, offset: off, len, payload: &[] }, "read")?;
            let at = (off - offset) as usize;
            buf[at..at + len as usize].copy_from_slice(&r.data);
        }
        self.counters.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.writable()?;
        let native_fua = fua && self.has(FLAG_SEND_FUA);
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        for (off, len) in self.pieces(offset, buf.len() as u64) {
            let at = (off - offset) as usize;
            self.call(Req { cmd: CMD_WRITE, flags, offset: off, len, payload: &buf[at..at + len as usize] }, "write")?;
        }
        self.counters.write_bytes.fetch_add(buf.len() as u64, Relaxed);
        if fua && !native_fua {
            // The server takes no FUA flag: durable once a FLUSH covers it.
            return self.flush();
        }
        self.bound_replay_log()
    }

    fn flush(&self) -> surge_block::Result<()> {
        if !self.has(FLAG_SEND_FLUSH) {
            return Ok(());
        }
        self.resend_log()?;
        let r = self.call(Req { cmd: CMD_FLUSH, flags: 0, offset: 0, len: 0, payload: &[] }, "flush");
        if r.is_err() {
            self.resend.store(true, Relaxed);
        }
        r.map(|_| ())
    }

    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        check_range(self.size, offset, len)?;
        self.writable()?;
        if !self.has(FLAG_SEND_TRIM) {
            return Ok(());
        }
        for (off, n) in self.pieces(offset, len) {
            self.call(Req { cmd: CMD_TRIM, flags: 0, offset: off, len: n, payload: &[] }, "trim")?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        check_range(self.size, offset, len)?;
        self.writable()?;
        if !self.has(FLAG_SEND_WRITE_ZEROES) || (mode.fast_only && !self.has(FLAG_SEND_FAST_ZERO)) {
            if mode.fast_only {
                return Err(BlockError::NotSupported("fast zeroing"));
            }
            return surge_block::dev::write_zero_buffers(self, offset, len);
        }
        let mut flags = if mode.may_trim { 0 } else { CMD_FLAG_NO_HOLE };
        if mode.fast_only {
            flags |= CMD_FLAG_FAST_ZERO;
        }
        for (off, n) in self.pieces(offset, len) {
            self.call(Req { cmd: CMD_WRITE_ZEROES, flags, offset: off, len: n, payload: &[] }, "write zeroes")?;
        }
        self.bound_replay_log()
    }

    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        check_range(self.size, offset, len)?;
        if !self.block_status || len == 0 {
            return Ok(vec![Extent { len, kind: ExtentKind::Data }]);
        }
        let ask = len.min(u32::MAX as u64 & !0xfff) as u32;
        let r = self.call(Req { cmd: CMD_BLOCK_STATUS, flags: 0, offset, len: ask, payload: &[] }, "block status")?;
        let mut out = Vec::new();
        let mut covered = 0u64;
        for e in r.extents {
            let n = (e.len as u64).min(len - covered);
            if n == 0 {
                break;
            }
            // HOLE alone says "not allocated" without promising zeroes.
            let kind = match (e.flags & STATE_HOLE != 0, e.flags & STATE_ZERO != 0) {
                (true, true) => ExtentKind::Hole,
                (false, true) => ExtentKind::Zero,
                _ => ExtentKind::Data,
            };
            out.push(Extent { len: n, kind });
            covered += n;
        }
        Ok(out)
    }

    /// Every request is a network round trip.
    fn may_wait_remote(&self, _offset: u64, _len: u64, _write: bool) -> bool {
        true
    }

    fn prefetch(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        check_range(self.size, offset, len)?;
        if self.has(FLAG_SEND_CACHE) {
            for (off, n) in self.pieces(offset, len) {
                self.call(Req { cmd: CMD_CACHE, flags: 0, offset: off, len: n, payload: &[] }, "cache")?;
            }
        }
        Ok(())
    }
}
