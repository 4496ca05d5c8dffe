//! What clients and I/O nodes share: the metadata store, membership, the node
//! connections and S3, with the two data-path primitives built on them:
//! storing a chunk version on R nodes, and reading a chunk version from
//! wherever it is (its holders, its rendezvous node, then S3).

use crate::conn::{Buffers, NodeError, NodePool};
use crate::membership::Membership;
use crate::meta::{ChunkEntry, FsParams, MetaError, MetaStore, NodeInfo};
use crate::placement;
use crate::proto::{new_buffer, ChunkId};
use crate::s3::{chunk_key, S3Error, S3};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("storing chunk {chunk}: only {got} of {want} I/O nodes took it ({why})")]
    NotReplicated { chunk: String, got: usize, want: usize, why: String, full: bool },
    #[error("reading chunk {chunk}: no I/O node has it and {why}")]
    Unreadable { chunk: String, why: String },
    /// Buffered writes of the file could not be stored; reported (with its
    /// errno) by every call on the file until an fsync.
    #[error("inode {ino}: buffered writes could not be stored: {why}")]
    FlushFailed { ino: u64, errno: i32, why: String },
    /// An fsync that waits for S3 timed out.
    #[error("inode {ino} not persisted in S3 after {waited:?} (generation {persisted} of {current})")]
    NotPersisted { ino: u64, waited: Duration, persisted: u64, current: u64 },
    #[error("no S3 bucket configured: {0} needs one")]
    NoS3(&'static str),
    #[error(transparent)]
    S3(#[from] S3Error),
}

impl DataError {
    pub fn errno(&self) -> i32 {
        match self {
            DataError::Meta(m) => m.errno(),
            DataError::NotReplicated { full: true, .. } => libc::ENOSPC,
            DataError::FlushFailed { errno, .. } => *errno,
            _ => libc::EIO,
        }
    }
}

/// How handing one node's copy of a chunk version to another node ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Handover {
    /// Copied to this node, which replaced the giver in the holder list.
    To(String),
    /// The version or its holders changed meanwhile: nothing changed, look again later.
    Changed,
    /// Every candidate already holds it or failed in this pass.
    NoTarget,
}

pub struct Tier {
    pub meta: Arc<dyn MetaStore>,
    pub members: Arc<dyn Membership>,
    pub pool: Arc<NodePool>,
    pub s3: Option<S3>,
    pub params: FsParams,
    /// Copies a dirty chunk needs before a write is acknowledged.
    pub replicas: usize,
    live_cache: Mutex<(Instant, Vec<NodeInfo>)>,
}

impl Tier {
    pub fn new(meta: Arc<dyn MetaStore>, members: Arc<dyn Membership>, s3: Option<S3>, replicas: usize) -> Result<Tier, MetaError> {
        let params = meta.params()?;
        Ok(Tier {
            meta,
            members,
            pool: Arc::new(NodePool::default()),
            s3,
            params,
            replicas: replicas.max(1),
            live_cache: Mutex::new((Instant::now() - Duration::from_secs(60), vec![])),
        })
    }

    /// Talk to the nodes through `pool` (e.g. one that speaks TLS).
    pub fn with_pool(mut self, pool: NodePool) -> Tier {
        self.pool = Arc::new(pool);
        self
    }

    /// Live nodes as registered (address, boot, drain state), refreshed at
    /// most every 500 ms.
    pub fn live_info(&self) -> Vec<NodeInfo> {
        {
            let g = self.live_cache.lock();
            if g.0.elapsed() < Duration::from_millis(500) {
                return g.1.clone();
            }
        }
        match self.members.live() {
            Ok(v) => {
                *self.live_cache.lock() = (Instant::now(), v.clone());
                v
            }
            Err(e) => {
                tracing::warn!("membership: {e}; using the last known node list");
                self.live_cache.lock().1.clone()
            }
        }
    }

    /// Addresses of every live node, draining ones included (they still hold
    /// and serve their chunks).
    pub fn live_nodes(&self) -> Vec<String> {
        self.live_info().into_iter().map(|n| n.addr).collect()
    }

    /// Addresses of the live nodes that take new chunks: not draining.
    pub fn placement_nodes(&self) -> Vec<String> {
        self.live_info().into_iter().filter(|n| n.draining.is_none()).map(|n| n.addr).collect()
    }

    pub fn forget_live_cache(&self) {
        self.live_cache.lock().0 = Instant::now() - Duration::from_secs(60);
    }

    /// Stores a dirty chunk version on `replicas` nodes in rendezvous order,
    /// skipping nodes that fail or are full. Returns the holders.
    pub fn store_chunk(&self, chunk: ChunkId, data: &[u8], exclude: &[String]) -> Result<Vec<String>, DataError> {
        let live = self.placement_nodes();
        let want = self.replicas;
        let mut holders = Vec::with_capacity(want);
        let mut why = Vec::new();
        let mut full = false;
        // Candidates in rendezvous order; each round sends to as many as are
        // still missing, in parallel, so a healthy store costs one round trip.
        let mut candidates = placement::rank(&live, &chunk).into_iter().filter(|n| !exclude.iter().any(|e| e == n));
        while holders.len() < want {
            let round: Vec<&str> = candidates.by_ref().take(want - holders.len()).collect();
            if round.is_empty() {
                break;
            }
            let results: Vec<Result<(), NodeError>> = std::thread::scope(|s| {
                let handles: Vec<_> = round.iter().map(|node| s.spawn(move || self.pool.put(node, chunk, data, true))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(NodeError::Rejected { node: "?".into(), why: "panicked".into() }))).collect()
            });
            for (node, r) in round.iter().zip(results) {
                match r {
                    Ok(()) => holders.push(node.to_string()),
                    Err(e) => {
                        let node_full = matches!(e, NodeError::Full { .. });
                        full |= node_full;
                        // A full node is routine under load (the caller may wait for room).
                        if node_full {
                            tracing::debug!("chunk {}: {e}; trying the next node", chunk.member());
                        } else {
                            tracing::warn!("chunk {}: {e}; trying the next node", chunk.member());
                        }
                        why.push(e.to_string());
                    }
                }
            }
        }
        if holders.len() < want {
            if live.len() < want {
                why.push(format!("{} live I/O nodes, {want} copies required", live.len()));
            }
            // Do not leave partial copies behind as dirty.
            for h in &holders {
                let _ = self.pool.delete(h, chunk);
            }
            let err = DataError::NotReplicated { chunk: chunk.member(), got: holders.len(), want, why: why.join("; "), full };
            if full {
                tracing::debug!("{err}");
            } else {
                tracing::error!("{err}");
            }
            return Err(err);
        }
        Ok(holders)
    }

    /// Reads chunk version `e` of `(ino, idx)`: from a live holder, else from
    /// the node rendezvous picks (a cached clean copy), else from S3 (lazy
    /// fetch; the copy is then cached clean on that node). A listed holder
    /// that is not a live node (drained, or dead) is tried only for a chunk
    /// not in S3, and last: it may be slow to fail, and S3 has the bytes.
    pub fn read_chunk(&self, ino: u64, idx: u64, e: &ChunkEntry) -> Result<Vec<u8>, DataError> {
        self.read_chunk_into(ino, idx, e, None)
    }

    /// [`Tier::read_chunk`], the bytes read into memory from `buffers`.
    pub fn read_chunk_into(&self, ino: u64, idx: u64, e: &ChunkEntry, buffers: Option<Buffers>) -> Result<Vec<u8>, DataError> {
        let chunk = ChunkId { ino, idx, ver: e.ver };
        let mut why = Vec::new();
        let members = self.live_nodes();
        let (alive, gone): (Vec<&String>, Vec<&String>) = e.holders.iter().partition(|h| members.contains(h));
        let tried = if e.persisted { alive } else { alive.into_iter().chain(gone).collect() };
        for h in tried {
            match self.pool.get_into(h, chunk, buffers.clone()) {
                Ok(Some(d)) => return Ok(d),
                Ok(None) => why.push(format!("{h} does not hold it")),
                Err(err) => why.push(err.to_string()),
            }
        }
        let live = self.placement_nodes();
        let cache_node = placement::rank(&live, &chunk).into_iter().find(|n| !e.holders.iter().any(|h| h == n));
        if e.persisted {
            if let Some(n) = cache_node {
                if let Ok(Some(d)) = self.pool.get_into(n, chunk, buffers.clone()) {
                    return Ok(d);
                }
            }
            let s3 = self.s3.as_ref().ok_or(DataError::NoS3("reading a written-back chunk"))?;
            let key = chunk_key(ino, idx, e.ver);
            match s3.get(&key) {
                Ok(Some(got)) => {
                    let mut d = buffers.map_or_else(|| new_buffer(got.len()), |b| b(got.len()));
                    d.copy_from_slice(&got);
                    if let Some(n) = cache_node {
                        let _ = self.pool.put(n, chunk, &d, false);
                    }
                    return Ok(d);
                }
                Ok(None) => why.push(format!("S3 object {key} is missing")),
                Err(err) => why.push(err.to_string()),
            }
        } else {
            why.push("it is not in S3 yet".into());
        }
        let err = DataError::Unreadable { chunk: chunk.member(), why: why.join("; ") };
        tracing::error!("{err}");
        Err(err)
    }

    /// Bytes `[idx*cs, ..)` of an imported object still backing chunk `idx`.
    pub fn read_imported(&self, import: &Option<(String, u64)>, idx: u64) -> Result<Vec<u8>, DataError> {
        let Some((key, limit)) = import else { return Ok(vec![]) };
        let cs = self.params.chunk_size;
        let start = idx * cs;
        let end = ((idx + 1) * cs).min(*limit);
        if start >= end {
            return Ok(vec![]);
        }
        let s3 = self.s3.as_ref().ok_or(DataError::NoS3("reading an imported object"))?;
        match s3.get_range(key, start..end) {
            Ok(b) => Ok(b.to_vec()),
            Err(e) => {
                tracing::error!("lazy fetch of imported {key} bytes {start}..{end}: {e}");
                Err(e.into())
            }
        }
    }

    /// Hands `from`'s copy of chunk `c` (current entry `e`, `from` among its
    /// holders) to the first of `candidates` that is not a holder and has not
    /// failed in this pass (the drain and the rebalance both move copies this
    /// way): copies it there, then swaps `from` for it in the holder list
    /// with compare-and-set, so a concurrent change of the list is never
    /// overwritten. `from` keeps its copy: the caller decides what becomes of
    /// it. A target that fails goes into `failed` (a hung node then costs one
    /// timeout per pass, not one per chunk).
    #[allow(clippy::too_many_arguments)]
    pub fn hand_over(&self, what: &str, c: ChunkId, e: &ChunkEntry, from: &str, data: &[u8], dirty: bool, candidates: &[&str], failed: &mut HashSet<String>) -> Result<Handover, DataError> {
        for &t in candidates {
            if e.holders.iter().any(|h| h == t) || failed.contains(t) {
                continue;
            }
            if let Err(err) = self.put_checked(t, c, data, dirty) {
                tracing::warn!("{what}: chunk {} to {t}: {err}; not trying {t} again in this pass", c.member());
                failed.insert(t.to_string());
                continue;
            }
            let holders: Vec<String> = e.holders.iter().map(|h| if h == from { t.to_string() } else { h.clone() }).collect();
            if self.meta.set_holders(&c, &e.holders, &holders)? {
                return Ok(Handover::To(t.to_string()));
            }
            // The copy on t is garbage, unless someone listed t meanwhile.
            let (_, now) = self.meta.chunks(c.ino, &[c.idx])?;
            if !now.into_iter().flatten().any(|n| n.ver == c.ver && n.holders.iter().any(|h| h == t)) {
                let _ = self.pool.delete(t, c);
            }
            return Ok(Handover::Changed);
        }
        Ok(Handover::NoTarget)
    }

    /// Puts a copy on `node`; a clean copy is checked to be there, since a
    /// node without room for it takes it without keeping it (it is a cache).
    fn put_checked(&self, node: &str, c: ChunkId, data: &[u8], dirty: bool) -> Result<(), NodeError> {
        self.pool.put(node, c, data, dirty)?;
        if !dirty && !self.pool.has(node, c)? {
            return Err(NodeError::Full { node: node.into() });
        }
        Ok(())
    }

    /// Drops node copies of chunk versions nobody references any more.
    pub fn discard(&self, ino: u64, removed: &[(u64, ChunkEntry)]) {
        for (idx, e) in removed {
            let c = ChunkId { ino, idx: *idx, ver: e.ver };
            for h in &e.holders {
                let _ = self.pool.delete(h, c);
            }
        }
    }
}

/// Everything needed to reach a burst buffer, as given on the command line.
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// redis://HOST:PORT/ of the metadata store.
    pub redis: String,
    /// File-system name (several can share one Redis and one bucket prefix).
    pub fs: String,
    /// `redis` (default), `etcd:http://HOST:PORT` or `static:ADDR,ADDR`.
    pub membership: String,
    pub s3: Option<crate::s3::S3Config>,
    pub replicas: usize,
    /// Chunk size used if the file system is formatted now.
    pub chunk_size: u64,
    /// How this process proves itself to the services (and checks them).
    pub access: Access,
}

/// Credentials and TLS for the burst buffer's services: the node protocol
/// (mutual TLS), Redis (ACL user and password, TLS) and etcd (user and
/// password, TLS). `Default`: none (loopback, single-user machines).
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub node_tls: Option<Arc<crate::tls::NodeTls>>,
    pub redis: crate::meta::redis::RedisAuth,
    pub etcd: crate::membership::EtcdAuth,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Membership(#[from] crate::membership::MembershipError),
    #[error(transparent)]
    S3(#[from] S3Error),
}

impl TierConfig {
    /// Connects to metadata (formatting it if new), membership and S3.
    pub fn open(&self) -> Result<Arc<Tier>, OpenError> {
        let meta: Arc<dyn MetaStore> = Arc::new(crate::meta::redis::RedisMeta::connect_with(&self.redis, &self.access.redis, &self.fs)?);
        meta.format(&FsParams { chunk_size: self.chunk_size })?;
        // Changes across metadata shards that a client left half-done when it died.
        let settled = meta.recover()?;
        if settled > 0 {
            tracing::info!("settled {settled} metadata changes a client left half-done");
        }
        let members = crate::membership::open_with(&self.membership, &self.fs, meta.clone(), &self.access.etcd)?;
        let s3 = self.s3.as_ref().map(S3::connect).transpose()?;
        let tier = Tier::new(meta, members, s3, self.replicas)?.with_pool(NodePool::default().with_tls(self.access.node_tls.clone()));
        Ok(Arc::new(tier))
    }
}
