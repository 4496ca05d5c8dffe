//! An I/O node: serves its chunk store over the node protocol, keeps its
//! membership lease alive, and runs write-back and re-replication.

use crate::drain::Drainer;
use crate::meta::NodeInfo;
use crate::proto::{self, Request, Status};
use crate::rebalance::{RebalanceConfig, Rebalancer};
use crate::store::{ChunkStore, StoreConfig};
use crate::tier::Tier;
use crate::tls::NodeTls;
use crate::writeback::{Writeback, WritebackConfig};
use parking_lot::Mutex;
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Address to listen on, e.g. 127.0.0.1:7400 (port 0: any free port).
    pub listen: String,
    pub store: StoreConfig,
    pub writeback: WritebackConfig,
    pub rebalance: RebalanceConfig,
    /// Map the memory budget at start, when a CPU is idle ([`ChunkStore::prefault`]).
    pub prefault: bool,
    /// Serve only peers with a certificate from the burst buffer's CA, over TLS.
    pub tls: Option<Arc<NodeTls>>,
    /// Listen off loopback without TLS (every host that reaches it is trusted).
    pub insecure: bool,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve chunks on {0}: it is not a loopback address and the node protocol without TLS \
     lets any host that reaches it read, overwrite, delete or drain every chunk; pass --tls-dir DIR \
     (ca-cert.pem, node-cert.pem, node-key.pem: see docs/security.md) or --insecure if every host that \
     can reach it is trusted"
)]
pub struct Exposed(pub String);

impl NodeConfig {
    /// A node off loopback needs TLS, or `insecure`.
    pub fn check_exposure(&self) -> Result<(), Exposed> {
        check_exposure(&self.listen, self.tls.is_some(), self.insecure)
    }
}

/// Whether a node may listen on `listen`: on loopback always; elsewhere
/// with TLS, or when the user says every host that reaches it is trusted.
pub fn check_exposure(listen: &str, tls: bool, insecure: bool) -> Result<(), Exposed> {
    use std::net::ToSocketAddrs;
    if tls || insecure {
        return Ok(());
    }
    // Every address the name resolves to must be loopback (an unresolvable
    // one is refused here too: binding would fail anyway).
    let loopback = listen.to_socket_addrs().is_ok_and(|a| {
        let v: Vec<_> = a.collect();
        !v.is_empty() && v.iter().all(|a| a.ip().is_loopback())
    });
    if loopback {
        Ok(())
    } else {
        Err(Exposed(listen.to_string()))
    }
}

pub struct NodeHandle {
    pub addr: String,
    pub store: Arc<ChunkStore>,
    shared: Arc<Shared>,
    tier: Arc<Tier>,
}

/// What the node's threads share.
struct Shared {
    store: Arc<ChunkStore>,
    stop: AtomicBool,
    /// A drain was asked for (by `surge bb drain` through the node protocol).
    drain: AtomicBool,
    /// The drain finished: the node has left the pool.
    drained: AtomicBool,
    /// The registration renewed by the lease thread (drain progress included).
    info: Mutex<NodeInfo>,
    s3: Option<Arc<crate::s3::S3Counts>>,
    /// Refused PUTs: a client waiting for room retries, and each retry is refused.
    refusals_logged: crate::LogEvery5s,
}

impl NodeHandle {
    /// Leaves the pool, stops the background loops, and stops serving: the listener closes (a connect
    /// wakes its accept to see the flag), and each open connection closes
    /// at its next request, so clients go to other holders.
    pub fn stop(&self) {
        {
            let _g = self.shared.info.lock(); // no heartbeat in flight past this point
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        let _ = self.tier.members.leave(&self.addr);
        if let Ok(a) = self.addr.parse() {
            let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
        }
    }

    /// Starts leaving the pool (as `surge bb drain` does).
    pub fn drain(&self) {
        self.shared.drain.store(true, Ordering::SeqCst);
    }

    /// The node drained and left the pool.
    pub fn drained(&self) -> bool {
        self.shared.drained.load(Ordering::SeqCst)
    }
}

/// What a request is answered with: a status and a body, the body either
/// built for the answer or a chunk sent from the store's own buffer.
struct Reply {
    status: Status,
    body: Body,
}

enum Body {
    Built(Vec<u8>),
    Chunk(Arc<crate::store::ChunkData>),
}

impl Reply {
    fn ok(body: Vec<u8>) -> Reply {
        Reply { status: Status::Ok, body: Body::Built(body) }
    }

    fn status(status: Status, body: Vec<u8>) -> Reply {
        Reply { status, body: Body::Built(body) }
    }

    fn body(&self) -> &[u8] {
        match &self.body {
            Body::Built(b) => b,
            Body::Chunk(d) => d,
        }
    }
}

fn handle(shared: &Shared, req: Request) -> Reply {
    let store = &shared.store;
    match req {
        Request::Put { chunk, dirty, data } => match store.put(chunk, data, dirty) {
            Ok(()) => Reply::ok(vec![]),
            Err(e) => {
                if let Some(n) = shared.refusals_logged.due() {
                    let more = if n > 1 { format!(" ({n} refused since the last such line)") } else { String::new() };
                    tracing::warn!("refusing chunk {}: {e}{more}", chunk.member());
                }
                Reply::status(Status::NoSpace, e.to_string().into_bytes())
            }
        },
        Request::Get { chunk } => match store.get(&chunk) {
            Some(d) => Reply { status: Status::Ok, body: Body::Chunk(d) },
            None => Reply::status(Status::NotFound, vec![]),
        },
        Request::Delete { chunk } => {
            store.delete(&chunk);
            Reply::ok(vec![])
        }
        Request::MarkClean { chunk } => {
            store.mark_clean(&chunk);
            Reply::ok(vec![])
        }
        Request::Has { chunk } => match store.has(&chunk) {
            true => Reply::ok(vec![]),
            false => Reply::status(Status::NotFound, vec![]),
        },
        Request::Stat => {
            let mut st = store.stat();
            if let Some(c) = &shared.s3 {
                (st.s3_puts, st.s3_gets, st.s3_bytes_up, st.s3_bytes_down) = c.snapshot();
            }
            Reply::ok(serde_json::to_vec(&st).unwrap_or_default())
        }
        Request::Drain => {
            if !shared.drain.swap(true, Ordering::SeqCst) {
                tracing::info!("drain requested: leaving the pool once no dirty chunk is left here");
            }
            Reply::ok(vec![])
        }
    }
}

fn serve_conn(shared: Arc<Shared>, stream: TcpStream, tls: Option<Arc<NodeTls>>) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = stream.set_nodelay(true);
    let halves = match &tls {
        // A peer without a certificate from the CA ends here, having read nothing.
        Some(t) => crate::tls::accept(&t.server, stream).inspect_err(|e| tracing::warn!("client {peer}: TLS handshake failed: {e}")),
        None => crate::tls::plain(stream),
    };
    let Ok((r, w)) = halves else { return };
    let writer = Mutex::new(BufWriter::with_capacity(1 << 20, w));
    let mut r = BufReader::with_capacity(proto::READ_BUF, r);
    loop {
        let (id, reply) = match proto::read_request_into(&mut r, |n| shared.store.buffer(n)) {
            Ok(Some(_)) if shared.stop.load(Ordering::SeqCst) => return,
            Ok(Some((id, req))) => (id, handle(&shared, req)),
            Ok(None) => return,
            Err(proto::ReadError::Io(e)) => {
                tracing::debug!("client {peer}: {e}");
                return;
            }
            Err(proto::ReadError::Bad(e)) => {
                tracing::warn!("client {peer} sent a bad request: {e}; closing");
                return;
            }
        };
        let mut w = writer.lock();
        if proto::write_response(&mut *w, id, reply.status, reply.body()).and_then(|_| w.flush()).is_err() {
            return;
        }
    }
}

/// Starts a node: listener, lease heartbeat, write-back and maintenance loops.
pub fn start(cfg: NodeConfig, tier: Arc<Tier>) -> std::io::Result<NodeHandle> {
    cfg.check_exposure().map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()))?;
    let listener = TcpListener::bind(&cfg.listen)?;
    let addr = listener.local_addr()?.to_string();
    let store = Arc::new(ChunkStore::new(cfg.store.clone()));
    if cfg.prefault {
        let (store, size) = (store.clone(), tier.params.chunk_size as usize);
        crate::spare::map_when_idle("chunk memory", move || store.prefault(size));
    }
    let info = NodeInfo {
        addr: addr.clone(),
        capacity: cfg.store.capacity,
        boot: boot_id(),
        started_ms: crate::now_ms(),
        draining: None,
        rebalancing: None,
    };
    let shared = Arc::new(Shared {
        store: store.clone(),
        stop: AtomicBool::new(false),
        drain: AtomicBool::new(false),
        drained: AtomicBool::new(false),
        info: Mutex::new(info),
        s3: tier.s3.as_ref().map(|s| s.counts.clone()),
        refusals_logged: Default::default(),
    });
    let (s2, tls) = (shared.clone(), cfg.tls.clone());
    std::thread::Builder::new().name("bb-listen".into()).spawn(move || {
        for conn in listener.incoming() {
            if s2.stop.load(Ordering::SeqCst) {
                break; // the listener closes with this thread
            }
            match conn {
                Ok(c) => {
                    let (s, t) = (s2.clone(), tls.clone());
                    let _ = std::thread::Builder::new().name("bb-serve".into()).spawn(move || serve_conn(s, c, t));
                }
                Err(e) => tracing::warn!("accept: {e}"),
            }
        }
    })?;
    if let Err(e) = tier.members.heartbeat(&shared.info.lock()) {
        return Err(std::io::Error::other(format!("registering node {addr}: {e}")));
    }
    {
        let (tier, shared) = (tier.clone(), shared.clone());
        std::thread::Builder::new().name("bb-lease".into()).spawn(move || {
            let mut failing = false;
            while !shared.stop.load(Ordering::SeqCst) {
                std::thread::sleep(crate::membership::LEASE / 3);
                let info = shared.info.lock();
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                match tier.members.heartbeat(&info) {
                    Ok(()) if failing => {
                        tracing::info!("membership lease renewed again");
                        failing = false;
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        tracing::error!("renewing membership lease: {e}");
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        })?;
    }
    let wb = Arc::new(Writeback::new(tier.clone(), store.clone(), addr.clone(), cfg.writeback.clone()));
    {
        let (wb, shared) = (wb.clone(), shared.clone());
        std::thread::Builder::new().name("bb-writeback".into()).spawn(move || {
            while !shared.stop.load(Ordering::SeqCst) {
                if wb.tick() == 0 {
                    // In slices, so a stop is not held up by a long pause.
                    let until = Instant::now() + wb.pause().max(Duration::from_millis(100));
                    while Instant::now() < until && !shared.stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    }
    {
        let shared = shared.clone();
        std::thread::Builder::new().name("bb-maintain".into()).spawn(move || {
            while !shared.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(1));
                wb.maintain();
            }
        })?;
    }
    {
        let (tier, shared) = (tier.clone(), shared.clone());
        let drainer = Drainer::new(tier.clone(), store.clone(), addr.clone());
        std::thread::Builder::new().name("bb-drain".into()).spawn(move || {
            while !shared.drain.load(Ordering::SeqCst) {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            run_drain(&tier, &shared, &drainer);
        })?;
    }
    if cfg.rebalance.rate > 0 {
        let (tier, shared) = (tier.clone(), shared.clone());
        let rb = Rebalancer::new(tier.clone(), store.clone(), addr.clone(), cfg.rebalance.clone());
        std::thread::Builder::new().name("bb-rebalance".into()).spawn(move || run_rebalance(&tier, &shared, &rb))?;
    }
    tracing::info!("I/O node {addr} serving ({} MiB of memory)", cfg.store.capacity >> 20);
    Ok(NodeHandle { addr, store, shared, tier })
}

/// A number that differs between two starts of a node (time and pid mixed).
fn boot_id() -> u64 {
    let x = (crate::now_ns() as u64) ^ (u64::from(std::process::id()) << 40);
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    (x ^ (x >> 31)).max(1)
}

/// Publishes drain or rebalance progress at once (not only at the next lease renewal).
fn publish(tier: &Tier, shared: &Shared, set: impl FnOnce(&mut NodeInfo)) {
    let mut info = shared.info.lock();
    set(&mut info);
    if !shared.stop.load(Ordering::SeqCst) {
        if let Err(e) = tier.members.heartbeat(&info) {
            tracing::warn!("publishing progress in membership: {e}");
        }
    }
}

/// Runs a rebalance pass whenever the placement nodes change (and again
/// while chunks are left), until the node stops or drains.
fn run_rebalance(tier: &Tier, shared: &Shared, rb: &Rebalancer) {
    let me = shared.info.lock().addr.clone();
    let stopping = || shared.stop.load(Ordering::SeqCst) || shared.drain.load(Ordering::SeqCst);
    let mut st = crate::rebalance::State::default();
    while !stopping() {
        std::thread::sleep(Duration::from_millis(500));
        let mut nodes = tier.placement_nodes();
        nodes.sort();
        if !nodes.contains(&me) || !st.due(&nodes, rb.cfg.retry, std::time::Instant::now()) {
            continue;
        }
        if let Err(e) = rb.pass(&mut st, &nodes, &mut |p| publish(tier, shared, |i| i.rebalancing = p), &stopping) {
            tracing::warn!("rebalance pass: {e}; retrying");
        }
    }
    publish(tier, shared, |i| i.rebalancing = None);
}

/// Marks the node draining, hands over its dirty chunks until none is left
/// for a few passes in a row, then leaves the pool.
fn run_drain(tier: &Tier, shared: &Shared, drainer: &Drainer) {
    let mut progress = drainer.left();
    publish(tier, shared, |i| i.draining = Some(progress));
    // Clients cache the node list for 500 ms: after this, none picks us.
    std::thread::sleep(Duration::from_secs(1));
    let mut clean_passes = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        // Nothing dirty left here: check the chunks handed over still have a
        // live holder (a taken-back chunk is dirty here again).
        let pass = drainer.pass().and_then(|(chunks, bytes)| match chunks {
            0 => drainer.confirm_handed().map(|unsure| (unsure, bytes)),
            _ => Ok((chunks, bytes)),
        });
        match pass {
            Ok((chunks, bytes)) => {
                progress.total_bytes = progress.total_bytes.max(bytes);
                progress.left_bytes = bytes;
                progress.left_chunks = chunks;
                publish(tier, shared, |i| i.draining = Some(progress));
                clean_passes = if chunks == 0 { clean_passes + 1 } else { 0 };
                if clean_passes >= 3 {
                    match drainer.drop_from_holders() {
                        Ok(n) => tracing::info!("drain: removed this node from the holder lists of {n} chunks"),
                        Err(e) => tracing::warn!("drain: removing this node from holder lists: {e}; readers skip it once it has left"),
                    }
                    break;
                }
            }
            Err(e) => tracing::warn!("drain pass: {e}; retrying"),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    {
        let _g = shared.info.lock();
        shared.stop.store(true, Ordering::SeqCst);
    }
    if let Err(e) = tier.members.leave(&shared.info.lock().addr) {
        tracing::error!("leaving the pool after the drain: {e}");
    }
    tracing::info!("drained: no dirty chunk left here; left the pool");
    shared.drained.store(true, Ordering::SeqCst);
}
