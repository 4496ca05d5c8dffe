//! Cooperation among proxies: the coordination channel of
//! `surge_block::fairq::global`, as peer connections among `surge serve`
//! daemons listed statically (`--coop-listen`, `--coop-peer`).
//!
//! Every period a daemon sends each peer one JSON line: its name, incarnation,
//! a sequence number and, per pool, what each tenant was dispatched there so
//! far and whether it was busy. Receivers apply it to the pool of the same
//! name. Sending and receiving run on their own threads and never take part
//! in I/O: a peer that is slow, gone or refusing connections only stops being
//! heard, and after the peer timeout its pool falls back to local SFQ(D).
//! With a key (`--coop-key FILE`, a secret every peer holds) each line is
//! `MAC JSON`, MAC the hex HMAC-SHA256 of the JSON under the key, and lines
//! without a valid MAC are dropped, so only holders of the key can steer the
//! shares. Without a key, lines are bare JSON and the listener must stay on
//! loopback or a unix socket (or `--insecure`). A receiver remembers at most
//! as many peers as it was given (`GlobalConfig::max_peers`) and forgets
//! silent ones; a line is at most 1 MiB and a daemon hears at most
//! [`MAX_READERS`] connections at once.

use crate::config::ListenAddr;
use crate::control::Controllable;
use crate::stack::share::{self, Queues};
use anyhow::Context as _;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use surge_block::fairq::{Report, TenantReport};

/// How this daemon cooperates.
#[derive(Debug, Clone)]
pub struct CoopConfig {
    /// Unique among the peers (defaults to the listen address).
    pub name: String,
    pub listen: ListenAddr,
    /// The other daemons' listen addresses.
    pub peers: Vec<ListenAddr>,
    pub period: Duration,
    pub peer_timeout: Duration,
    /// Signs reports sent and checks reports received.
    pub key: Option<CoopKey>,
}

/// The secret cooperating daemons sign their reports with (HMAC-SHA256).
#[derive(Clone)]
pub struct CoopKey(ring::hmac::Key);

impl std::fmt::Debug for CoopKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoopKey(..)")
    }
}

/// Shortest key accepted, in bytes.
pub const MIN_KEY: usize = 16;

impl CoopKey {
    pub fn new(secret: &[u8]) -> anyhow::Result<CoopKey> {
        anyhow::ensure!(secret.len() >= MIN_KEY, "a coop key needs at least {MIN_KEY} bytes (e.g. `head -c 32 /dev/urandom | base64 > FILE`)");
        Ok(CoopKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret)))
    }

    /// The key in `path` (trailing newline ignored); refused if others may read it.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<CoopKey> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).with_context(|| format!("coop key {}", path.display()))?.permissions().mode();
        anyhow::ensure!(mode & 0o077 == 0, "coop key {} has mode {:o}: others could read it; chmod 600 it", path.display(), mode & 0o777);
        let text = std::fs::read(path).with_context(|| format!("reading coop key {}", path.display()))?;
        let secret = text.trim_ascii_end();
        CoopKey::new(secret).with_context(|| format!("coop key {}", path.display()))
    }

    fn sign(&self, msg: &[u8]) -> String {
        ring::hmac::sign(&self.0, msg).as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The JSON of a signed line, if its MAC is right.
    fn open<'a>(&self, line: &'a [u8]) -> Option<&'a [u8]> {
        let sp = line.iter().position(|&b| b == b' ')?;
        let (mac, json) = (&line[..sp], &line[sp + 1..]);
        if mac.len() != 64 {
            return None;
        }
        let tag: Vec<u8> = mac.chunks(2).map(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()).collect::<Option<_>>()?;
        ring::hmac::verify(&self.0, json, &tag).ok().map(|_| json)
    }
}

/// Connections heard at once; more are closed at accept (each costs a thread).
pub const MAX_READERS: usize = 64;

/// One line on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Message {
    from: String,
    incarnation: u64,
    seq: u64,
    pools: BTreeMap<String, Vec<TenantReport>>,
}

/// A peer connection longer than this per line is cut (a report is a few KiB).
const MAX_LINE: usize = 1 << 20;
/// After a failed connect or send, wait this long before trying that peer again.
const RETRY: Duration = Duration::from_millis(500);

#[derive(Default)]
struct PeerOut {
    conn: Option<Conn>,
    retry_at: Option<Instant>,
    sent: u64,
    last_error: Option<String>,
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn open(addr: &ListenAddr, timeout: Duration) -> std::io::Result<Conn> {
        let c = match addr {
            ListenAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout)?;
                s.set_nodelay(true)?;
                s.set_write_timeout(Some(timeout))?;
                Conn::Tcp(s)
            }
            ListenAddr::Unix(p) => {
                let s = UnixStream::connect(p)?;
                s.set_write_timeout(Some(timeout))?;
                Conn::Unix(s)
            }
        };
        Ok(c)
    }

    fn send(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(line),
            Conn::Unix(s) => s.write_all(line),
        }
    }
}

struct State {
    cfg: CoopConfig,
    incarnation: u64,
    peers: Mutex<Vec<(ListenAddr, PeerOut)>>,
    received: AtomicU64,
    rejected: AtomicU64,
    /// Report rounds sent more than a period late (the sender ran late), and
    /// the longest time between two rounds, in microseconds.
    late_rounds: AtomicU64,
    max_round_gap_us: AtomicU64,
    stop: AtomicBool,
}

/// The running service; stops its threads when dropped.
pub struct Coop {
    state: Arc<State>,
    threads: Vec<JoinHandle<()>>,
}

impl Coop {
    /// Listen for peers' reports and start reporting to them.
    pub fn start(cfg: CoopConfig, queues: Queues) -> anyhow::Result<Coop> {
        let incarnation = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        let peers = cfg.peers.iter().map(|p| (p.clone(), PeerOut::default())).collect();
        let listener = Listener::bind(&cfg.listen).with_context(|| format!("coop: listening on {}", cfg.listen))?;
        let state = Arc::new(State {
            cfg,
            incarnation,
            peers: Mutex::new(peers),
            received: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            late_rounds: AtomicU64::new(0),
            max_round_gap_us: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let (s, q) = (state.clone(), queues.clone());
        threads.push(std::thread::Builder::new().name("coop-accept".into()).spawn(move || accept_loop(listener, s, q))?);
        let s = state.clone();
        threads.push(std::thread::Builder::new().name("coop-send".into()).spawn(move || send_loop(s, queues))?);
        Ok(Coop { state, threads })
    }

    /// `surge status` entry `coop`.
    pub fn control(&self) -> Arc<dyn Controllable> {
        Arc::new(CoopControl { state: self.state.clone() })
    }
}

impl Drop for Coop {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, std::path::PathBuf),
}

impl Listener {
    fn bind(addr: &ListenAddr) -> std::io::Result<Listener> {
        let l = match addr {
            ListenAddr::Tcp(a) => Listener::Tcp(TcpListener::bind(a)?),
            ListenAddr::Unix(p) => {
                let _ = crate::control::remove_stale_socket(p);
                // Only the user the daemon runs as may send reports.
                Listener::Unix(surge_nbd::bind_unix(p, 0o600)?, p.clone())
            }
        };
        match &l {
            Listener::Tcp(t) => t.set_nonblocking(true)?,
            Listener::Unix(u, _) => u.set_nonblocking(true)?,
        }
        Ok(l)
    }

    fn accept(&self) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        match self {
            Listener::Tcp(t) => {
                let (s, _) = t.accept()?;
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok(Box::new(s))
            }
            Listener::Unix(u, _) => {
                let (s, _) = u.accept()?;
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                Ok(Box::new(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn accept_loop(listener: Listener, state: Arc<State>, queues: Queues) {
    let mut readers = Vec::new();
    while !state.stop.load(Ordering::Relaxed) {
        readers.retain(|h: &JoinHandle<()>| !h.is_finished());
        match listener.accept() {
            Ok(_) if readers.len() >= MAX_READERS => {
                state.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("coop: {MAX_READERS} connections open already: closing a new one");
            }
            Ok(stream) => {
                let (s, q) = (state.clone(), queues.clone());
                match std::thread::Builder::new().name("coop-recv".into()).spawn(move || receive(stream, s, q)) {
                    Ok(h) => readers.push(h),
                    Err(e) => tracing::warn!("coop: cannot start a reader: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                tracing::warn!("coop: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for h in readers {
        let _ = h.join();
    }
}

/// Read report lines from one peer until it goes away or we stop. A line
/// longer than [`MAX_LINE`] ends the connection before more of it is read.
fn receive(stream: Box<dyn std::io::Read + Send>, state: Arc<State>, queues: Queues) {
    use std::io::Read as _;
    let mut r = BufReader::new(stream);
    let mut line = Vec::new();
    while !state.stop.load(Ordering::Relaxed) {
        let room = (MAX_LINE + 1).saturating_sub(line.len()) as u64;
        match (&mut r).take(room).read_until(b'\n', &mut line) {
            Ok(0) if line.len() <= MAX_LINE => return,
            Ok(_) if line.ends_with(b"\n") => {
                apply_line(&line, &state, &queues);
                line.clear();
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
        if line.len() > MAX_LINE {
            state.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
}

fn apply_line(line: &[u8], state: &State, queues: &Queues) {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let json = match &state.cfg.key {
        Some(k) => k.open(line),
        None => Some(line),
    };
    let Some(m) = json.and_then(|j| serde_json::from_slice::<Message>(j).ok()) else {
        state.rejected.fetch_add(1, Ordering::Relaxed);
        return;
    };
    state.received.fetch_add(1, Ordering::Relaxed);
    for (pool, queue) in share::pools(queues) {
        if let Some(tenants) = m.pools.get(&pool) {
            let r = Report { from: m.from.clone(), incarnation: m.incarnation, seq: m.seq, tenants: tenants.clone() };
            queue.apply_report(&r);
        }
    }
}

fn send_loop(state: Arc<State>, queues: Queues) {
    let period = state.cfg.period;
    let mut seq = 0;
    let mut next = Instant::now();
    let mut last: Option<Instant> = None;
    while !state.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        if let Some(l) = last {
            state.max_round_gap_us.fetch_max((now - l).as_micros() as u64, Ordering::Relaxed);
        }
        last = Some(now);
        next += period;
        if next < now {
            state.late_rounds.fetch_add(1, Ordering::Relaxed);
            next = now + period; // fell behind (machine busy): do not burst
        }
        seq += 1;
        let pools = share::pools(&queues);
        for (_, q) in &pools {
            q.refresh_peers();
        }
        let msg = Message {
            from: state.cfg.name.clone(),
            incarnation: state.incarnation,
            seq,
            pools: pools.iter().map(|(n, q)| (n.clone(), q.report())).collect(),
        };
        let Ok(json) = serde_json::to_vec(&msg) else { continue };
        let mut line = match &state.cfg.key {
            Some(k) => [k.sign(&json).as_bytes(), b" ", &json].concat(),
            None => json,
        };
        line.push(b'\n');
        send_all(&state, &line);
    }
}

/// One line to every peer; a failing peer is dropped and retried later.
fn send_all(state: &State, line: &[u8]) {
    let now = Instant::now();
    let timeout = state.cfg.period.max(Duration::from_millis(10));
    for (addr, p) in state.peers.lock().iter_mut() {
        if p.conn.is_none() {
            if p.retry_at.is_some_and(|t| now < t) {
                continue;
            }
            match Conn::open(addr, timeout) {
                Ok(c) => p.conn = Some(c),
                Err(e) => {
                    p.last_error = Some(format!("connect: {e}"));
                    p.retry_at = Some(now + RETRY);
                    continue;
                }
            }
        }
        if let Some(c) = &mut p.conn {
            match c.send(line) {
                Ok(()) => {
                    p.sent += 1;
                    p.last_error = None;
                }
                Err(e) => {
                    p.last_error = Some(format!("send: {e}"));
                    p.conn = None;
                    p.retry_at = Some(now + RETRY);
                }
            }
        }
    }
}

struct CoopControl {
    state: Arc<State>,
}

impl Controllable for CoopControl {
    fn name(&self) -> String {
        "coop".into()
    }
    fn kind(&self) -> String {
        "coop".into()
    }
    fn status(&self) -> serde_json::Value {
        let s = &self.state;
        let peers: Vec<_> = s
            .peers
            .lock()
            .iter()
            .map(|(a, p)| json!({ "address": a.to_string(), "connected": p.conn.is_some(), "sent": p.sent, "last_error": p.last_error }))
            .collect();
        json!({
            "name": s.cfg.name,
            "listen": s.cfg.listen.to_string(),
            "period_us": s.cfg.period.as_micros() as u64,
            "peer_timeout_us": s.cfg.peer_timeout.as_micros() as u64,
            "signed": s.cfg.key.is_some(),
            "received": s.received.load(Ordering::Relaxed),
            "rejected": s.rejected.load(Ordering::Relaxed),
            "late_rounds": s.late_rounds.load(Ordering::Relaxed),
            "max_round_gap_us": s.max_round_gap_us.load(Ordering::Relaxed),
            "peers": peers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_and_garbage_is_rejected() {
        let m = Message {
            from: "p1".into(),
            incarnation: 7,
            seq: 3,
            pools: [("pfs".to_string(), vec![TenantReport { name: "a".into(), cost: 10, reserved: 2, active: true, global: None }])].into(),
        };
        let line = serde_json::to_vec(&m).unwrap();
        assert_eq!(serde_json::from_slice::<Message>(&line).unwrap(), m);
        assert!(serde_json::from_slice::<Message>(b"{\"from\":1}").is_err());
    }

    fn keyed_state(key: Option<&[u8]>) -> (Arc<State>, Queues, crate::stack::BuildContext) {
        use crate::stack::share::{build_share, set_coop, CoopTiming};
        let mut ctx = crate::stack::BuildContext::new(std::path::PathBuf::from("/nonexistent"), Arc::new(surge_block::SystemClock::new()));
        ctx.pools.insert("pfs".into(), Arc::new(surge_block::MemoryDev::new(1 << 20)));
        set_coop(&ctx, Some(CoopTiming { period: Duration::from_millis(20), peer_timeout: Duration::from_secs(5), max_peers: 1 }));
        build_share("a", "pfs", &ctx).unwrap();
        let cfg = CoopConfig {
            name: "me".into(),
            listen: "unix:/nonexistent".parse().unwrap(),
            peers: vec!["unix:/peer".parse().unwrap()],
            period: Duration::from_millis(20),
            peer_timeout: Duration::from_secs(5),
            key: key.map(|k| CoopKey::new(k).unwrap()),
        };
        let state = Arc::new(State { cfg, incarnation: 1, peers: Mutex::new(vec![]), received: AtomicU64::new(0), rejected: AtomicU64::new(0), late_rounds: AtomicU64::new(0), max_round_gap_us: AtomicU64::new(0), stop: AtomicBool::new(false) });
        (state, ctx.fair_queues.clone(), ctx)
    }

    fn line(key: Option<&CoopKey>, from: &str, seq: u64, cost: u64) -> Vec<u8> {
        let m = Message { from: from.into(), incarnation: 9, seq, pools: [("pfs".to_string(), vec![TenantReport { name: "a".into(), cost, reserved: 0, active: true, global: None }])].into() };
        let json = serde_json::to_vec(&m).unwrap();
        let mut l = match key {
            Some(k) => [k.sign(&json).as_bytes(), b" ", &json].concat(),
            None => json,
        };
        l.push(b'\n');
        l
    }

    fn remote_cost(q: &Queues) -> u64 {
        share::pools(q)[0].1.stats().tenants.iter().find(|t| t.name == "a").map_or(0, |t| t.remote_cost)
    }

    // Issue 38 item 4: with a key, only reports signed with it count; a
    // forged or unsigned report (huge cost included) changes nothing.
    #[test]
    fn with_a_key_unsigned_and_forged_reports_change_nothing() {
        let secret = b"0123456789abcdef-the-peers-secret";
        let (state, queues, _ctx) = keyed_state(Some(secret));
        let right = CoopKey::new(secret).unwrap();
        let wrong = CoopKey::new(b"another-secret-of-16-bytes").unwrap();
        for l in [line(None, "p", 1, 0), line(None, "p", 2, u64::MAX), line(Some(&wrong), "p", 1, 0), line(Some(&wrong), "p", 2, u64::MAX)] {
            apply_line(&l, &state, &queues);
        }
        // A signed line whose JSON was altered after signing.
        let mut tampered = line(Some(&right), "p", 3, 5);
        let at = tampered.len() - 4;
        tampered[at] = b'9';
        apply_line(&tampered, &state, &queues);
        assert_eq!(state.rejected.load(Ordering::Relaxed), 5);
        assert_eq!(state.received.load(Ordering::Relaxed), 0);
        assert_eq!(remote_cost(&queues), 0);
        assert!(share::pools(&queues)[0].1.stats().peers.is_empty(), "a forged sender became a peer");
        // The peer that holds the key is heard: baseline, then its credit.
        apply_line(&line(Some(&right), "p", 10, 1000), &state, &queues);
        apply_line(&line(Some(&right), "p", 11, 5000), &state, &queues);
        assert_eq!(remote_cost(&queues), 4000);
        // A second sender beyond the one configured peer is not remembered.
        apply_line(&line(Some(&right), "q", 1, 0), &state, &queues);
        assert_eq!(share::pools(&queues)[0].1.stats().peers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["p"]);
    }

    #[test]
    fn a_short_or_readable_key_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "short\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(CoopKey::from_file(&f).unwrap_err().to_string().contains("coop key"));
        std::fs::write(&f, "a-long-enough-secret-for-hmac\n").unwrap();
        CoopKey::from_file(&f).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(format!("{:#}", CoopKey::from_file(&f).unwrap_err()).contains("chmod 600"));
    }
}
