//! Client side of the node protocol: one persistent TCP connection per I/O
//! node, shared by every thread of the process. Requests carry ids; a reader
//! thread routes each response to its waiter, so any number of requests are in
//! flight on one connection. A broken connection fails its waiters at once and
//! is replaced on next use.

use crate::proto::{self, ChunkId, Request, Response, Status};
use crate::tls::NodeTls;
use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error, Clone)]
pub enum NodeError {
    #[error("I/O node {node} unreachable: {why}")]
    Unreachable { node: String, why: String },
    #[error("I/O node {node} did not answer within {secs} s")]
    Timeout { node: String, secs: u64 },
    #[error("I/O node {node} is full")]
    Full { node: String },
    #[error("I/O node {node} rejected the request: {why}")]
    Rejected { node: String, why: String },
}

/// Where a response body of a given length is read: memory its owner
/// already mapped (see [`crate::spare`]); any buffer of that length will do.
pub type Buffers = Arc<dyn Fn(usize) -> Vec<u8> + Send + Sync>;

/// A request waiting for its response, and where that response's body goes.
struct Waiter {
    tx: Sender<Result<Response, String>>,
    buffers: Option<Buffers>,
}

type Waiters = Arc<Mutex<HashMap<u64, Waiter>>>;

struct Conn {
    writer: Mutex<BufWriter<Box<dyn Write + Send>>>,
    waiters: Waiters,
    next_id: AtomicU64,
    dead: Arc<AtomicBool>,
}

impl Conn {
    fn open(addr: &str, timeout: Duration, tls: Option<&NodeTls>) -> std::io::Result<Conn> {
        let sock = addr
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
        let stream = TcpStream::connect_timeout(&sock, timeout)?;
        stream.set_nodelay(true)?;
        let (reader, stream) = match tls {
            Some(t) => crate::tls::connect(&t.client, stream)?,
            None => crate::tls::plain(stream)?,
        };
        let waiters: Waiters = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let (w2, d2, a2) = (waiters.clone(), dead.clone(), addr.to_string());
        std::thread::Builder::new().name(format!("bb-conn-{addr}")).spawn(move || {
            let mut r = BufReader::with_capacity(proto::READ_BUF, reader);
            let why = loop {
                let buffers = |id: u64| w2.lock().get(&id).and_then(|w| w.buffers.clone());
                match proto::read_response_into(&mut r, |id, n| buffers(id).map_or_else(|| proto::new_buffer(n), |b| b(n))) {
                    Ok(Some((id, resp))) => {
                        if let Some(w) = w2.lock().remove(&id) {
                            let _ = w.tx.send(Ok(resp));
                        }
                    }
                    Ok(None) => break "connection closed".to_string(),
                    Err(proto::ReadError::Bad(e)) => break format!("bad response: {e}"),
                    Err(proto::ReadError::Io(e)) => break e.to_string(),
                }
            };
            d2.store(true, Ordering::SeqCst);
            tracing::debug!("connection to I/O node {a2} ended: {why}");
            for (_, w) in w2.lock().drain() {
                let _ = w.tx.send(Err(why.clone()));
            }
        })?;
        Ok(Conn { writer: Mutex::new(BufWriter::with_capacity(1 << 20, stream)), waiters, next_id: AtomicU64::new(1), dead })
    }

    fn call(&self, node: &str, req: &Request, timeout: Duration, buffers: Option<Buffers>) -> Result<Response, NodeError> {
        self.call_with(node, timeout, |id| (proto::encode_request(id, req), &[]), buffers)
    }

    /// Sends the frame `encode` makes for the request id (a head, then data
    /// written from where it lies) and waits for the response, whose body is
    /// read into memory from `buffers` if given.
    fn call_with<'d>(&self, node: &str, timeout: Duration, encode: impl FnOnce(u64) -> (Vec<u8>, &'d [u8]), buffers: Option<Buffers>) -> Result<Response, NodeError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        self.waiters.lock().insert(id, Waiter { tx, buffers });
        let (head, data) = encode(id);
        let sent = {
            let mut w = self.writer.lock();
            w.write_all(&head).and_then(|_| w.write_all(data)).and_then(|_| w.flush())
        };
        if let Err(e) = sent {
            self.waiters.lock().remove(&id);
            self.dead.store(true, Ordering::SeqCst);
            return Err(NodeError::Unreachable { node: node.into(), why: e.to_string() });
        }
        match rx.recv_timeout(timeout) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(why)) => Err(NodeError::Unreachable { node: node.into(), why }),
            Err(_) => {
                self.waiters.lock().remove(&id);
                Err(NodeError::Timeout { node: node.into(), secs: timeout.as_secs() })
            }
        }
    }
}

/// Persistent connections to every I/O node this process talks to.
pub struct NodePool {
    conns: Mutex<HashMap<String, Arc<Conn>>>,
    timeout: Duration,
    /// Talk to nodes over TLS, with this process's certificate.
    tls: Option<Arc<NodeTls>>,
}

impl Default for NodePool {
    fn default() -> Self {
        NodePool::new(Duration::from_secs(10))
    }
}

impl NodePool {
    pub fn new(timeout: Duration) -> NodePool {
        NodePool { conns: Mutex::default(), timeout, tls: None }
    }

    /// Connections over TLS (every node must be one of the CA's).
    pub fn with_tls(mut self, tls: Option<Arc<NodeTls>>) -> NodePool {
        self.tls = tls;
        self
    }

    fn conn(&self, node: &str) -> Result<Arc<Conn>, NodeError> {
        if let Some(c) = self.conns.lock().get(node) {
            if !c.dead.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(
            Conn::open(node, Duration::from_secs(2), self.tls.as_deref())
                .map_err(|e| NodeError::Unreachable { node: node.into(), why: e.to_string() })?,
        );
        self.conns.lock().insert(node.to_string(), c.clone());
        Ok(c)
    }

    pub fn call(&self, node: &str, req: &Request) -> Result<Response, NodeError> {
        self.conn(node)?.call(node, req, self.timeout, None)
    }

    pub fn put(&self, node: &str, chunk: ChunkId, data: &[u8], dirty: bool) -> Result<(), NodeError> {
        let r = self.conn(node)?.call_with(node, self.timeout, |id| (proto::encode_put_head(id, &chunk, dirty, data.len()), data), None)?;
        match r.status {
            Status::Ok => Ok(()),
            Status::NoSpace => Err(NodeError::Full { node: node.into() }),
            _ => Err(NodeError::Rejected { node: node.into(), why: String::from_utf8_lossy(&r.body).into() }),
        }
    }

    /// `Ok(None)` when the node does not hold that chunk version.
    pub fn get(&self, node: &str, chunk: ChunkId) -> Result<Option<Vec<u8>>, NodeError> {
        self.get_into(node, chunk, None)
    }

    /// [`NodePool::get`], the bytes read into memory from `buffers`.
    pub fn get_into(&self, node: &str, chunk: ChunkId, buffers: Option<Buffers>) -> Result<Option<Vec<u8>>, NodeError> {
        let r = self.conn(node)?.call(node, &Request::Get { chunk }, self.timeout, buffers)?;
        match r.status {
            Status::Ok => Ok(Some(r.body)),
            Status::NotFound => Ok(None),
            _ => Err(NodeError::Rejected { node: node.into(), why: String::from_utf8_lossy(&r.body).into() }),
        }
    }

    pub fn delete(&self, node: &str, chunk: ChunkId) -> Result<(), NodeError> {
        self.call(node, &Request::Delete { chunk }).map(|_| ())
    }

    pub fn mark_clean(&self, node: &str, chunk: ChunkId) -> Result<(), NodeError> {
        self.call(node, &Request::MarkClean { chunk }).map(|_| ())
    }

    /// Does the node hold this chunk version? (no data moved)
    pub fn has(&self, node: &str, chunk: ChunkId) -> Result<bool, NodeError> {
        Ok(self.call(node, &Request::Has { chunk })?.status == Status::Ok)
    }

    /// Asks the node to leave the pool (see `drain.rs`).
    pub fn drain(&self, node: &str) -> Result<(), NodeError> {
        let r = self.call(node, &Request::Drain)?;
        match r.status {
            Status::Ok => Ok(()),
            _ => Err(NodeError::Rejected { node: node.into(), why: String::from_utf8_lossy(&r.body).into() }),
        }
    }

    pub fn stat(&self, node: &str) -> Result<crate::store::StoreStat, NodeError> {
        let r = self.call(node, &Request::Stat)?;
        serde_json::from_slice(&r.body)
            .map_err(|e| NodeError::Rejected { node: node.into(), why: format!("bad stat: {e}") })
    }
}
