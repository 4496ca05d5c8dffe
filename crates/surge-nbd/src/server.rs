//! The server: configuration, listeners, connection threads, statistics and
//! graceful shutdown.

use crate::access::{AllowList, Peer};
use crate::handshake::{self, Outcome};
use crate::tls::{self, TlsMode, TlsReader, TlsWriter};
use crate::io::Socket;
use crate::transmission::{self, ServiceTime};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use surge_block::{BlockDev, Caps};
use thiserror::Error;
use tracing::{info, warn};

/// One named volume the server offers.
pub struct Export {
    pub name: String,
    pub description: String,
    pub dev: Arc<dyn BlockDev>,
    /// Refuse writes even if the device accepts them.
    pub read_only: bool,
    /// Clients that may use this export (`None`: everyone). Others do not see
    /// it in NBD_OPT_LIST and get NBD_REP_ERR_POLICY on NBD_OPT_INFO/GO.
    pub allow: Option<AllowList>,
    /// Picks another device (of the same size) per connection from the
    /// client's address, e.g. the share of the application on that host.
    pub route: Option<Arc<dyn PeerRoute>>,
}

/// Chooses the device a connection uses from the client's address.
pub trait PeerRoute: Send + Sync {
    /// `None`: the export's own device.
    fn device_for(&self, peer: &Peer) -> Option<Arc<dyn BlockDev>>;
}

impl Export {
    pub fn new(name: impl Into<String>, dev: Arc<dyn BlockDev>) -> Self {
        Export { name: name.into(), description: String::new(), dev, read_only: false, allow: None, route: None }
    }

    /// The device a connection from `peer` uses.
    pub fn device_for(&self, peer: &Peer) -> Arc<dyn BlockDev> {
        self.route.as_ref().and_then(|r| r.device_for(peer)).unwrap_or_else(|| self.dev.clone())
    }

    /// Whether a client at `peer` may use this export.
    pub fn allows(&self, peer: &Peer) -> bool {
        match &self.allow {
            Some(list) => list.allows(peer),
            None => true,
        }
    }
}

/// What the server serves and how.
pub struct ServerConfig {
    /// Named exports; the first also answers to the default name "".
    pub exports: Vec<Export>,
    /// Threads serving each connection of an export: each reads requests in
    /// turn and does their device I/O (nbdkit's model), so this many requests
    /// of one connection can be at the device at once. 0 counts as 1.
    pub threads_per_connection: usize,
    /// Requests in flight per connection before the server stops reading more.
    pub max_in_flight: usize,
    /// Run small reads and writes (≤ 64 KiB) without handing the connection's
    /// input to another thread while the export serves them in under 20 µs on
    /// average (page cache, memory): waking a peer costs more than such I/O.
    /// Slower devices, large requests and other commands always hand over.
    pub inline_fast_requests: bool,
    /// Whether clients may or must upgrade with NBD_OPT_STARTTLS.
    pub tls_mode: TlsMode,
    /// Certificate and key for TLS (see [`crate::tls::server_config_from_pem`]);
    /// required unless `tls_mode` is `Off`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// At shutdown, how long clients get to leave on their own: meanwhile
    /// options are answered NBD_REP_ERR_SHUTDOWN and new requests NBD_ESHUTDOWN
    /// (both tell the client to disconnect). Then the server stops reading,
    /// answers what it has read and closes.
    pub shutdown_grace: Duration,
    /// Move large reads and writes between plain sockets and exports that are
    /// plain files without copying them through this process (sendfile,
    /// splice); off: always copy (for comparison and debugging).
    pub zero_copy: bool,
    /// Connections open at once (each costs a thread, and up to
    /// `threads_per_connection` once it serves); more are closed at accept,
    /// before the greeting. 0 counts as 1.
    pub max_connections: usize,
    /// Connections open at once from one client address (TCP; unix-socket
    /// clients count only towards `max_connections`), so one host cannot take
    /// every slot. 0 counts as 1.
    pub max_connections_per_address: usize,
    /// How long a client may take over the whole handshake, from accept to
    /// the transmission phase (STARTTLS included); then it is disconnected,
    /// however steadily it trickles bytes.
    pub handshake_timeout: Duration,
    /// A connection with no request in flight for this long gives its pooled
    /// request buffers back to the allocator.
    pub idle_buffer_trim: Duration,
}

impl ServerConfig {
    pub fn new(exports: Vec<Export>) -> Self {
        ServerConfig {
            exports,
            threads_per_connection: 8,
            max_in_flight: 64,
            inline_fast_requests: true,
            tls_mode: TlsMode::Off,
            tls: None,
            shutdown_grace: SHUTDOWN_GRACE,
            zero_copy: true,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_address: MAX_CONNECTIONS_PER_ADDRESS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            idle_buffer_trim: IDLE_BUFFER_TRIM,
        }
    }
}

/// Default [`ServerConfig::max_connections`].
pub const MAX_CONNECTIONS: usize = 512;
/// Default [`ServerConfig::max_connections_per_address`].
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// Where to accept connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("no exports configured")]
    NoExports,
    #[error("export name {0:?} is used twice")]
    DuplicateExport(String),
    #[error("export name {0:?} is longer than 4096 bytes")]
    ExportNameTooLong(String),
    #[error("cannot listen on {listen}: {source}")]
    Listen { listen: Listen, source: io::Error },
    #[error("{listen} is in use by a running server")]
    SocketInUse { listen: Listen },
    #[error("TLS mode {0:?} needs a TLS certificate and key")]
    TlsWithoutCertificate(TlsMode),
    #[error("the server was started without TLS: restart it to turn TLS on")]
    TlsNotStarted,
    #[error("cannot start a thread: {0}")]
    Thread(io::Error),
    #[error("flushing export {name:?} at shutdown failed: {source}")]
    Flush { name: String, source: surge_block::BlockError },
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;

/// Counters of one export, cumulative since the server started.
#[derive(Debug, Default)]
pub(crate) struct ExportCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    pub block_status: AtomicU64,
    pub caches: AtomicU64,
    pub errors: AtomicU64,
    pub zero_copy_reads: AtomicU64,
    pub zero_copy_writes: AtomicU64,
    pub connections: AtomicU64,
    pub active_connections: AtomicU64,
}

/// Counters of one export, cumulative since the server started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportStats {
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub block_status: u64,
    pub caches: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Reads sent from the export's file with sendfile, and writes spliced into
    /// it (plain connections to file exports, at least 64 KiB).
    pub zero_copy_reads: u64,
    pub zero_copy_writes: u64,
    /// Connections that entered transmission on this export.
    pub connections: u64,
    pub active_connections: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServerStats {
    /// Connections accepted (including ones that never finished the handshake).
    pub connections_accepted: u64,
    /// Connections closed at accept: over `max_connections` or the per-address cap.
    pub connections_refused: u64,
    /// Connections cut because their handshake outlasted `handshake_timeout`.
    pub handshakes_timed_out: u64,
    /// Bytes of request buffers held by connections for reuse (trimmed when idle).
    pub pooled_buffer_bytes: u64,
    pub exports: Vec<ExportStats>,
}

/// An export as the running server holds it.
pub(crate) struct ExportState {
    pub export: Export,
    pub caps: Caps,
    pub read_only: bool,
    pub counters: ExportCounters,
    pub service: ServiceTime,
}

impl ExportState {
    pub fn size(&self) -> u64 {
        self.export.dev.size()
    }
}

/// State shared by the acceptors, connections and workers.
pub(crate) struct Shared {
    pub exports: Vec<ExportState>,
    pub max_in_flight: usize,
    pub threads_per_connection: usize,
    pub inline_fast_requests: bool,
    pub tls_mode: TlsMode,
    /// Swapped whole by [`Server::set_tls`] (certificates reloaded); a
    /// connection uses the one current at its STARTTLS.
    tls: parking_lot::RwLock<Option<Arc<rustls::ServerConfig>>>,
    pub shutting_down: AtomicBool,
    shutdown_grace: Duration,
    pub zero_copy: bool,
    max_connections: usize,
    max_per_address: usize,
    handshake_timeout: Duration,
    pub idle_buffer_trim: Duration,
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    handshakes_timed_out: AtomicU64,
    next_conn_id: AtomicU64,
    live: Mutex<HashMap<u64, LiveConnection>>,
    /// Request buffers of the connections in transmission (trimmed by the janitor).
    pools: Mutex<HashMap<u64, std::sync::Weak<transmission::BufferPool>>>,
}

impl Shared {
    pub(crate) fn new(cfg: ServerConfig) -> Shared {
        let exports = cfg
            .exports
            .into_iter()
            .map(|export| {
                let caps = export.dev.caps();
                let read_only = export.read_only || caps.read_only;
                ExportState {
                    export,
                    caps,
                    read_only,
                    counters: ExportCounters::default(),
                    service: ServiceTime::default(),
                }
            })
            .collect();
        Shared {
            exports,
            max_in_flight: cfg.max_in_flight.max(1),
            threads_per_connection: cfg.threads_per_connection.max(1),
            inline_fast_requests: cfg.inline_fast_requests,
            tls_mode: cfg.tls_mode,
            tls: parking_lot::RwLock::new(cfg.tls),
            shutting_down: AtomicBool::new(false),
            shutdown_grace: cfg.shutdown_grace,
            zero_copy: cfg.zero_copy,
            max_connections: cfg.max_connections.max(1),
            max_per_address: cfg.max_connections_per_address.max(1),
            handshake_timeout: cfg.handshake_timeout,
            idle_buffer_trim: cfg.idle_buffer_trim,
            connections_accepted: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            handshakes_timed_out: AtomicU64::new(0),
            next_conn_id: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The TLS configuration new STARTTLS sessions use.
    pub fn tls(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.read().clone()
    }

    /// Lets the janitor trim connection `id`'s request buffers while it is idle.
    pub(crate) fn register_pool(&self, id: u64, pool: &Arc<transmission::BufferPool>) {
        self.pools.lock().insert(id, Arc::downgrade(pool));
    }

    /// Cuts connections whose handshake outlasted the deadline, and gives back
    /// the buffers of connections idle for `idle_buffer_trim`.
    fn janitor_pass(&self) {
        let now = std::time::Instant::now();
        for c in self.live.lock().values_mut() {
            if c.handshake_until.is_some_and(|t| now >= t) {
                c.handshake_until = None;
                self.handshakes_timed_out.fetch_add(1, Ordering::Relaxed);
                warn!(peer = %c.socket.peer(), timeout = ?self.handshake_timeout, "handshake took too long: disconnecting");
                let _ = c.socket.shutdown(Shutdown::Both);
            }
        }
        self.pools.lock().retain(|_, p| match p.upgrade() {
            Some(pool) => {
                pool.trim_if_idle(self.idle_buffer_trim);
                true
            }
            None => false,
        });
    }

    fn pooled_buffer_bytes(&self) -> u64 {
        self.pools.lock().values().filter_map(|p| p.upgrade()).map(|p| p.pooled_bytes() as u64).sum()
    }

    /// The export a client means by `name` ("" is the first one).
    pub fn find_export(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return (!self.exports.is_empty()).then_some(0);
        }
        self.exports.iter().position(|e| e.export.name == name)
    }
}

struct LiveConnection {
    socket: Socket,
    thread: Option<JoinHandle<()>>,
    /// The client's TCP address (`None`: a unix-socket client).
    addr: Option<std::net::IpAddr>,
    /// While in the handshake: when it must be over.
    handshake_until: Option<std::time::Instant>,
}

struct Acceptor {
    listen: Listen,
    thread: JoinHandle<()>,
}

/// A running NBD server. Dropping it without [`Server::shutdown`] leaves its
/// threads running until the process exits.
pub struct Server {
    shared: Arc<Shared>,
    acceptors: Mutex<Vec<Acceptor>>,
}

/// Default [`ServerConfig::handshake_timeout`].
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`ServerConfig::idle_buffer_trim`].
const IDLE_BUFFER_TRIM: Duration = Duration::from_secs(5);
/// How often the janitor looks for late handshakes and idle buffers.
const JANITOR_PERIOD: Duration = Duration::from_millis(100);
/// Socket buffer size asked for (1 MiB replies then go out in one go).
const SOCKET_BUFFER: usize = 4 << 20;
/// How long sending one batch of replies may block.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Mode of NBD unix sockets: the user surge runs as and its group (e.g. a
/// qemu group) may connect, nobody else.
pub const UNIX_SOCKET_MODE: u32 = 0o660;
/// How often acceptors look at the shutdown flag.
const ACCEPT_POLL_MS: i32 = 100;
/// Default [`ServerConfig::shutdown_grace`].
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Logged when clients are still connected as the grace period ends.
pub const GRACE_OVER: &str = "shutdown: clients still connected at the end of the grace period; no more requests are read from them";
/// At shutdown, how long in-flight requests get to be answered once reading stopped.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

impl Server {
    /// Validates the configuration; call [`Server::listen`] to accept connections.
    pub fn start(cfg: ServerConfig) -> Result<Server> {
        validate(&cfg)?;
        let shared = Arc::new(Shared::new(cfg));
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("nbd-janitor".into())
            .spawn(move || {
                while let Some(s) = weak.upgrade() {
                    if s.shutting_down.load(Ordering::SeqCst) {
                        break;
                    }
                    s.janitor_pass();
                    drop(s);
                    std::thread::sleep(JANITOR_PERIOD);
                }
            })
            .map_err(ServerError::Thread)?;
        Ok(Server { shared, acceptors: Mutex::new(Vec::new()) })
    }

    /// Replaces the TLS configuration (certificates re-read, e.g. on SIGHUP):
    /// connections that upgrade from now on use it; sessions already
    /// established keep theirs. Refused on a server started without TLS.
    pub fn set_tls(&self, tls: Arc<rustls::ServerConfig>) -> Result<()> {
        let mut cur = self.shared.tls.write();
        if cur.is_none() {
            return Err(ServerError::TlsNotStarted);
        }
        *cur = Some(tls);
        Ok(())
    }

    /// Binds `listen` and accepts connections on it in a background thread.
    /// A stale unix socket file (nobody listening) is replaced.
    pub fn listen(&self, listen: &Listen) -> Result<()> {
        let err = |source| ServerError::Listen { listen: listen.clone(), source };
        let listener = match listen {
            Listen::Unix(path) => {
                remove_stale_socket(path, listen)?;
                AnyListener::Unix(crate::io::bind_unix(path, UNIX_SOCKET_MODE).map_err(err)?)
            }
            Listen::Tcp(addr) => AnyListener::Tcp(TcpListener::bind(addr).map_err(err)?),
        };
        // The address actually bound (TCP port 0 gets a real port).
        let bound = match &listener {
            AnyListener::Tcp(l) => Listen::Tcp(l.local_addr().map_err(err)?),
            AnyListener::Unix(_) => listen.clone(),
        };
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nbd-accept {listen}"))
            .spawn(move || accept_loop(shared, listener))
            .map_err(ServerError::Thread)?;
        info!(listen = %bound, "listening");
        self.acceptors.lock().push(Acceptor { listen: bound, thread });
        Ok(())
    }

    /// Where the server listens, with the real port of TCP listeners bound to port 0.
    pub fn local_addrs(&self) -> Vec<Listen> {
        self.acceptors.lock().iter().map(|a| a.listen.clone()).collect()
    }

    pub fn stats(&self) -> ServerStats {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: c(&self.shared.connections_accepted),
            connections_refused: c(&self.shared.connections_refused),
            handshakes_timed_out: c(&self.shared.handshakes_timed_out),
            pooled_buffer_bytes: self.shared.pooled_buffer_bytes(),
            exports: self
                .shared
                .exports
                .iter()
                .map(|e| {
                    let k = &e.counters;
                    ExportStats {
                        name: e.export.name.clone(),
                        reads: c(&k.reads),
                        writes: c(&k.writes),
                        bytes_read: c(&k.bytes_read),
                        bytes_written: c(&k.bytes_written),
                        flushes: c(&k.flushes),
                        trims: c(&k.trims),
                        zeroes: c(&k.zeroes),
                        block_status: c(&k.block_status),
                        caches: c(&k.caches),
                        errors: c(&k.errors),
                        zero_copy_reads: c(&k.zero_copy_reads),
                        zero_copy_writes: c(&k.zero_copy_writes),
                        connections: c(&k.connections),
                        active_connections: c(&k.active_connections),
                    }
                })
                .collect(),
        }
    }

    /// Stops accepting; for [`ServerConfig::shutdown_grace`] answers options
    /// with NBD_REP_ERR_SHUTDOWN and newly read requests with NBD_ESHUTDOWN (the
    /// spec's way to ask clients to disconnect) while requests read before are
    /// served; then stops reading from the connections left, answers what they
    /// sent, closes them (cutting, after a bounded drain, clients that do not
    /// read their replies) and flushes every writable export. Returns the first
    /// flush error, after trying them all. Files on disk (socket files) play no
    /// part: it ends even if they were removed.
    pub fn shutdown(self) -> Result<()> {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        for a in self.acceptors.lock().drain(..) {
            let _ = a.thread.join();
            if let Listen::Unix(path) = &a.listen {
                let _ = std::fs::remove_file(path);
            }
        }
        let start = std::time::Instant::now();
        self.wait_for_connections(start + self.shared.shutdown_grace);
        let left = self.shared.live.lock().len();
        if left > 0 {
            warn!(connections = left, grace_ms = self.shared.shutdown_grace.as_millis() as u64, "{GRACE_OVER}");
        }
        // Half-close: readers see EOF, answer what they read, and exit.
        self.shutdown_sockets(Shutdown::Read);
        self.wait_for_connections(std::time::Instant::now() + SHUTDOWN_DRAIN);
        // Whoever is still here does not read its replies.
        self.shutdown_sockets(Shutdown::Both);
        let threads: Vec<JoinHandle<()>> = self.shared.live.lock().values_mut().filter_map(|c| c.thread.take()).collect();
        for t in threads {
            let _ = t.join();
        }
        let mut first_err = None;
        for e in self.shared.exports.iter().filter(|e| !e.read_only) {
            if let Err(source) = e.export.dev.flush() {
                warn!(export = %e.export.name, error = %source, "flush at shutdown failed");
                first_err.get_or_insert(ServerError::Flush { name: e.export.name.clone(), source });
            }
        }
        info!("server stopped");
        first_err.map_or(Ok(()), Err)
    }
}

impl Server {
    /// Waits until every connection has ended or `deadline` passes.
    fn wait_for_connections(&self, deadline: std::time::Instant) {
        while !self.shared.live.lock().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn shutdown_sockets(&self, how: Shutdown) {
        for c in self.shared.live.lock().values() {
            let _ = c.socket.shutdown(how);
        }
    }
}

fn validate(cfg: &ServerConfig) -> Result<()> {
    if cfg.exports.is_empty() {
        return Err(ServerError::NoExports);
    }
    if cfg.tls_mode != TlsMode::Off && cfg.tls.is_none() {
        return Err(ServerError::TlsWithoutCertificate(cfg.tls_mode));
    }
    let mut seen = std::collections::HashSet::new();
    for e in &cfg.exports {
        if e.name.len() > crate::proto::MAX_STRING {
            return Err(ServerError::ExportNameTooLong(e.name.clone()));
        }
        if !seen.insert(e.name.as_str()) {
            return Err(ServerError::DuplicateExport(e.name.clone()));
        }
    }
    Ok(())
}

/// Removes a unix socket file nobody listens on; refuses one that is live.
fn remove_stale_socket(path: &std::path::Path, listen: &Listen) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ServerError::SocketInUse { listen: listen.clone() });
    }
    std::fs::remove_file(path).map_err(|source| ServerError::Listen { listen: listen.clone(), source })
}

enum AnyListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl AnyListener {
    fn fd(&self) -> i32 {
        match self {
            AnyListener::Unix(l) => l.as_raw_fd(),
            AnyListener::Tcp(l) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<Socket> {
        Ok(match self {
            AnyListener::Unix(l) => Socket::Unix(l.accept()?.0),
            AnyListener::Tcp(l) => {
                let s = l.accept()?.0;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
        })
    }
}

/// Waits up to `ms` for the listener to have a pending connection.
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn accept_loop(shared: Arc<Shared>, listener: AnyListener) {
    while !shared.shutting_down.load(Ordering::SeqCst) {
        if !readable(listener.fd(), ACCEPT_POLL_MS) {
            continue;
        }
        match listener.accept() {
            Ok(socket) => {
                if let Err(e) = spawn_connection(&shared, socket) {
                    warn!(error = %e, "cannot start connection");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn spawn_connection(shared: &Arc<Shared>, socket: Socket) -> io::Result<()> {
    shared.connections_accepted.fetch_add(1, Ordering::Relaxed);
    let addr = match &socket {
        Socket::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
        Socket::Unix(_) => None,
    };
    let mut live = shared.live.lock();
    if let Some(why) = over_cap(shared, &live, addr) {
        // Closed before the greeting: the client learns nothing.
        shared.connections_refused.fetch_add(1, Ordering::Relaxed);
        warn!(peer = %socket.peer(), "refusing connection: {why}");
        return Ok(());
    }
    let id = shared.next_conn_id.fetch_add(1, Ordering::Relaxed);
    let control = socket.try_clone()?;
    let s = shared.clone();
    let thread = std::thread::Builder::new().name(format!("nbd-conn{id}")).spawn(move || {
        run_connection(&s, id, socket);
        s.live.lock().remove(&id);
        s.pools.lock().remove(&id);
    })?;
    let handshake_until = Some(std::time::Instant::now() + shared.handshake_timeout);
    live.insert(id, LiveConnection { socket: control, thread: Some(thread), addr, handshake_until });
    Ok(())
}

/// Why a new connection from `addr` would exceed a cap, if it would.
fn over_cap(shared: &Shared, live: &HashMap<u64, LiveConnection>, addr: Option<std::net::IpAddr>) -> Option<String> {
    if live.len() >= shared.max_connections {
        return Some(format!("{} connections open, the most allowed (max_connections)", live.len()));
    }
    let addr = addr?;
    let from = live.values().filter(|c| c.addr == Some(addr)).count();
    (from >= shared.max_per_address).then(|| format!("{from} connections open from {addr}, the most allowed per address"))
}

/// One connection from accept to close.
fn run_connection(shared: &Arc<Shared>, id: u64, socket: Socket) {
    let peer = socket.peer();
    let span = tracing::info_span!("conn", id, %peer);
    let _g = span.enter();
    let result = serve_socket(shared, id, socket);
    match result {
        Ok(summary) => info!(%summary, "connection closed"),
        Err(e) => warn!(error = %e, "connection closed with error"),
    }
}

/// The client's address for allow-lists.
fn peer_of(socket: &Socket) -> Peer {
    match socket {
        Socket::Unix(_) => Peer::Unix,
        // No address (the peer already left): match nothing but open exports.
        Socket::Tcp(s) => s.peer_addr().map_or(Peer::Tcp(std::net::Ipv6Addr::UNSPECIFIED.into()), |a| Peer::tcp(a.ip())),
    }
}

fn serve_socket(shared: &Arc<Shared>, id: u64, socket: Socket) -> io::Result<String> {
    let control = socket.try_clone()?;
    // The janitor cuts the whole handshake at its deadline; this bounds each read too.
    control.set_read_timeout(Some(shared.handshake_timeout.max(Duration::from_millis(1))))?;
    // A client that stops reading replies fails its connection instead of
    // holding a worker (and shutdown) forever.
    control.set_write_timeout(Some(REPLY_TIMEOUT))?;
    control.set_buffer_sizes(SOCKET_BUFFER);
    let mut reader: BufReader<Box<dyn Read + Send>> =
        BufReader::with_capacity(transmission::READ_BUFFER, Box::new(socket.try_clone()?));
    let mut writer: Box<dyn Write + Send> = Box::new(socket.try_clone()?);
    let Some(mut st) = handshake::greet(&mut reader, &mut writer, peer_of(&socket))? else {
        return Ok("during handshake".into());
    };
    let mut session: Option<Arc<tls::TlsSession>> = None;
    let neg = loop {
        let outcome = handshake::options(shared, &mut st, &mut reader, &mut writer);
        if let (Some(s), Ok(Outcome::Closed) | Err(_)) = (&session, &outcome) {
            // The spec: shut TLS down (close_notify) before closing.
            s.close(&socket);
        }
        match outcome? {
            Outcome::Closed => return Ok("during handshake".into()),
            Outcome::Transmission(neg) => break neg,
            Outcome::StartTls => {
                let cfg = shared.tls().expect("STARTTLS is acknowledged only with a TLS config");
                let s = tls::accept(cfg, &socket, reader.buffer())?;
                reader = BufReader::with_capacity(transmission::READ_BUFFER, Box::new(TlsReader::new(s.clone(), socket.try_clone()?)));
                writer = Box::new(TlsWriter::new(s.clone(), socket.try_clone()?));
                st.tls_started();
                session = Some(s);
            }
        }
    };
    if let Some(c) = shared.live.lock().get_mut(&id) {
        c.handshake_until = None;
    }
    control.set_read_timeout(None)?;
    if let Some(s) = &session {
        s.sync_read_timeout(&control)?;
    }
    let export = &shared.exports[neg.export];
    info!(export = %export.export.name, structured = neg.structured, tls = session.is_some(), "connection open");
    export.counters.connections.fetch_add(1, Ordering::Relaxed);
    export.counters.active_connections.fetch_add(1, Ordering::Relaxed);
    let threads = shared.threads_per_connection;
    let dev = export.export.device_for(&peer_of(&socket));
    let out = transmission::serve(shared, Some(id), &neg, &*dev, reader, writer, Some(control.try_clone()?), threads, shared.zero_copy && session.is_none());
    export.counters.active_connections.fetch_sub(1, Ordering::Relaxed);
    if let Some(s) = session {
        s.close(&socket);
    }
    let _ = control.shutdown(Shutdown::Both);
    out
}
