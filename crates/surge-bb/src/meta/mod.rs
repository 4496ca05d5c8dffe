//! The metadata interface: namespace, attributes, chunk maps, the dirty log and
//! the publish queue, each mutation one atomic transaction. Redis implements it
//! (`redis.rs`); a distributed store (TiKV, FoundationDB, etcd, PostgreSQL)
//! implements the same trait with its own transactions.
//!
//! The namespace is keyed by (parent inode, name): renaming a directory
//! rewrites one entry, never its subtree.

pub mod redis;

use crate::proto::ChunkId;
use std::collections::BTreeMap;

pub type Ino = u64;
pub const ROOT: Ino = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    File,
    Dir,
}

impl Kind {
    pub fn code(self) -> &'static str {
        match self {
            Kind::File => "f",
            Kind::Dir => "d",
        }
    }
}

/// An inode's attributes as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub atime_ns: i64,
    pub nlink: u32,
    /// Content generation: bumped by every data commit or truncate.
    pub gen: u64,
    /// The generation last written back to S3 with its manifest and export object.
    pub pgen: u64,
    pub parent: Ino,
    pub name: String,
    /// An object that existed in the bucket before (import) and still backs the
    /// chunks this file has not rewritten: (key, bytes of it still valid).
    pub import: Option<(String, u64)>,
    /// The export object key last published for this file.
    pub xkey: Option<String>,
}

impl Attr {
    pub fn persisted(&self) -> bool {
        self.pgen == self.gen
    }
}

/// What a read needs of a file besides its chunks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileView {
    pub size: u64,
    pub import: Option<(String, u64)>,
}

/// Where one chunk's current version lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub ver: u64,
    /// Bytes in this version (a chunk may be shorter than the chunk size: the
    /// rest reads as zeros).
    pub len: u64,
    /// The version is in S3 as `chunk_key(..)`.
    pub persisted: bool,
    /// I/O nodes holding it (hints: a missing copy falls back to S3).
    pub holders: Vec<String>,
}

impl ChunkEntry {
    pub fn encode(&self) -> String {
        format!("{}:{}:{}:{}", self.ver, self.len, u8::from(self.persisted), self.holders.join(","))
    }

    pub fn decode(s: &str) -> Option<ChunkEntry> {
        let mut it = s.splitn(4, ':');
        let ver = it.next()?.parse().ok()?;
        let len = it.next()?.parse().ok()?;
        let persisted = it.next()? == "1";
        let h = it.next()?;
        let holders = if h.is_empty() { vec![] } else { h.split(',').map(str::to_string).collect() };
        Some(ChunkEntry { ver, len, persisted, holders })
    }
}

/// A chunk version to commit, valid only if the chunk's current version is
/// still `base` (None: no version yet). This compare-and-set lets two clients
/// write different bytes of one chunk without losing either (the loser merges
/// its bytes onto the winner's version and retries).
#[derive(Clone, Debug)]
pub struct ChunkUpdate {
    pub idx: u64,
    pub base: Option<u64>,
    pub entry: ChunkEntry,
}

/// Where an inode is in the namespace: the name it has in its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub ino: Ino,
    pub parent: Ino,
    pub name: String,
}

/// Directories a walk up the tree visits at most (a cycle would be a
/// corrupt store; this bounds the walk instead of hanging).
pub const MAX_DEPTH: usize = 4096;

#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
}

/// What an unlink or an overwriting rename removed: chunk versions whose node
/// copies can be dropped.
#[derive(Clone, Debug, Default)]
pub struct Removed {
    pub ino: Ino,
    pub chunks: Vec<(u64, ChunkEntry)>,
}

#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument")]
    Invalid,
    #[error("chunk {0} changed since it was read")]
    Conflict(u64),
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    #[error("metadata store answered something unexpected: {0}")]
    Corrupt(String),
    /// The name is the bucket's internal prefix (`/.surge`), kept for surge.
    #[error("/{} is reserved for the burst buffer's own objects in the bucket", crate::s3::INTERNAL_PREFIX)]
    Reserved,
    /// Past [`MAX_FILE_SIZE`] (the largest object S3 stores: every file is one).
    #[error("file size {0} is past the largest a file may be ({MAX_FILE_SIZE} bytes)")]
    TooBig(u64),
    /// Another change of this name, across shards of the store, is in flight
    /// (the store settles it and retries; this is what is left if it cannot).
    #[error("another change of this name is in flight")]
    InFlight,
}

/// The largest file (5 TiB: S3's largest object, which every file is
/// published as). Writes and truncates past it fail with EFBIG.
pub const MAX_FILE_SIZE: u64 = 5 << 40;

impl MetaError {
    pub fn errno(&self) -> i32 {
        match self {
            MetaError::NotFound => libc::ENOENT,
            MetaError::Exists => libc::EEXIST,
            MetaError::NotDir => libc::ENOTDIR,
            MetaError::IsDir => libc::EISDIR,
            MetaError::NotEmpty => libc::ENOTEMPTY,
            MetaError::Invalid => libc::EINVAL,
            MetaError::Reserved => libc::EPERM,
            MetaError::TooBig(_) => libc::EFBIG,
            MetaError::InFlight => libc::EAGAIN,
            MetaError::Conflict(_) | MetaError::Unavailable(_) | MetaError::Corrupt(_) => libc::EIO,
        }
    }
}

pub type MetaResult<T> = Result<T, MetaError>;

/// File-system wide parameters, fixed at format time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsParams {
    pub chunk_size: u64,
}

/// A live I/O node as registered with the membership service.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    pub addr: String,
    pub capacity: u64,
    /// Random per process start: a node restarted at the same address is a
    /// new, empty node (its old copies are gone).
    #[serde(default)]
    pub boot: u64,
    /// When this boot started (ms since the epoch): copies recorded before it
    /// on this address are verified before they count.
    #[serde(default)]
    pub started_ms: i64,
    /// Set while the node leaves the pool: placement no longer picks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<DrainProgress>,
    /// Set while the node moves chunks to a node that joined (`rebalance.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalancing: Option<DrainProgress>,
}

impl NodeInfo {
    pub fn new(addr: &str, capacity: u64) -> NodeInfo {
        NodeInfo { addr: addr.into(), capacity, ..Default::default() }
    }
}

/// How far a node is in moving chunks: a leaving node's dirty chunks still to
/// hand over or write back, or a rebalance's chunks still to move to an added node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DrainProgress {
    /// Bytes to move when it started (or the most seen since).
    pub total_bytes: u64,
    pub left_bytes: u64,
    pub left_chunks: u64,
    /// A rebalance waiting until its node takes no writes (`--rebalance-quiet`).
    #[serde(default)]
    pub paused: bool,
}

impl DrainProgress {
    pub fn percent(&self) -> u32 {
        if self.total_bytes == 0 {
            return if self.left_bytes == 0 { 100 } else { 0 };
        }
        (100 - (self.left_bytes.min(self.total_bytes) * 100 / self.total_bytes)) as u32
    }
}

/// [`MetaStore::getattr_with_ancestors`] by one `getattr` per directory
/// level: for stores (or layouts) without a transaction over the path.
pub fn ancestors_one_by_one<S: MetaStore + ?Sized>(store: &S, ino: Ino) -> MetaResult<(Attr, Vec<Placement>)> {
    let a = store.getattr(ino)?;
    let mut up = Vec::new();
    let mut dir = a.parent;
    while dir != ROOT && dir != 0 && up.len() < MAX_DEPTH {
        let d = store.getattr(dir)?;
        up.push(Placement { ino: dir, parent: d.parent, name: d.name });
        dir = d.parent;
    }
    Ok((a, up))
}

pub trait MetaStore: Send + Sync {
    /// Creates the root and parameters if absent; returns the parameters in force.
    fn format(&self, params: &FsParams) -> MetaResult<FsParams>;
    fn params(&self) -> MetaResult<FsParams>;
    /// A number unique to this client process (used to make chunk versions unique).
    fn new_client_id(&self) -> MetaResult<u64>;

    fn lookup(&self, parent: Ino, name: &str) -> MetaResult<Attr>;
    fn getattr(&self, ino: Ino) -> MetaResult<Attr>;
    /// An inode's attributes, and where each directory above it is now,
    /// nearest first, up to the root's child: what a mount checks the names
    /// its kernel has cached against. Stores with transactions across keys
    /// should answer in one round trip.
    fn getattr_with_ancestors(&self, ino: Ino) -> MetaResult<(Attr, Vec<Placement>)> {
        ancestors_one_by_one(self, ino)
    }
    fn setattr(&self, ino: Ino, set: &SetAttr, now_ns: i64) -> MetaResult<Attr>;
    #[allow(clippy::too_many_arguments)]
    fn create(&self, parent: Ino, name: &str, kind: Kind, mode: u32, uid: u32, gid: u32, now_ns: i64)
        -> MetaResult<Attr>;
    fn unlink(&self, parent: Ino, name: &str, now_ns: i64) -> MetaResult<Removed>;
    fn rmdir(&self, parent: Ino, name: &str, now_ns: i64) -> MetaResult<()>;
    /// Renames, replacing an existing target (file, or empty directory) atomically.
    fn rename(&self, parent: Ino, name: &str, new_parent: Ino, new_name: &str, now_ns: i64)
        -> MetaResult<Option<Removed>>;
    fn readdir(&self, ino: Ino) -> MetaResult<Vec<DirEntry>>;
    /// Completes or rolls back the multi-step changes a crashed client left
    /// (stores whose every change is one transaction have none). Returns how many.
    fn recover(&self) -> MetaResult<usize> {
        Ok(0)
    }

    /// File size, import source and the current entries of chunks `idxs`, in
    /// one round trip (the read path asks this for every read).
    fn chunks(&self, ino: Ino, idxs: &[u64]) -> MetaResult<(FileView, Vec<Option<ChunkEntry>>)>;
    fn chunk_map(&self, ino: Ino) -> MetaResult<BTreeMap<u64, ChunkEntry>>;
    /// Atomically installs chunk versions (all or none, each compare-and-set on
    /// its base), raises the size to at least `end`, bumps the generation and
    /// logs the new versions dirty. Returns the replaced entries.
    fn commit(&self, ino: Ino, end: u64, updates: &[ChunkUpdate], now_ns: i64) -> MetaResult<Vec<(u64, ChunkEntry)>>;
    /// Installs already-persisted versions of imported chunks without changing
    /// the file's content generation.
    fn materialize(&self, ino: Ino, update: &ChunkUpdate) -> MetaResult<()>;
    /// Atomically sets the size, drops chunks past it and installs the trimmed
    /// tail chunk (compare-and-set like `commit`). Returns the dropped entries.
    fn truncate(&self, ino: Ino, size: u64, tail: Option<&ChunkUpdate>, now_ns: i64) -> MetaResult<Vec<(u64, ChunkEntry)>>;

    /// Oldest dirty chunk versions first, with the time (ms since epoch) they were logged.
    fn dirty_oldest(&self, n: usize) -> MetaResult<Vec<(ChunkId, i64)>>;
    fn dirty_count(&self) -> MetaResult<u64>;
    fn is_dirty(&self, chunk: &ChunkId) -> MetaResult<bool>;
    /// Moves a file's dirty chunks to the head of the write-back queue.
    fn expedite(&self, ino: Ino) -> MetaResult<()>;
    /// The chunk version is in S3; drops it from the dirty log.
    fn mark_persisted(&self, chunk: &ChunkId) -> MetaResult<bool>;
    /// Replaces the holder list of a chunk version, if the version is still
    /// current and its holders are still `old` (two nodes moving one chunk
    /// at once must not overwrite each other's list).
    fn set_holders(&self, chunk: &ChunkId, old: &[String], new: &[String]) -> MetaResult<bool>;
    /// Removes `addr` from the holders of a chunk version (if still current),
    /// unless that leaves a version not yet in S3 with no holder at all.
    fn drop_holder(&self, chunk: &ChunkId, addr: &str) -> MetaResult<bool>;

    /// Inodes waiting to be published (manifest + export object) that were queued
    /// before `before_ms`.
    fn publish_queue(&self, before_ms: i64, n: usize) -> MetaResult<Vec<Ino>>;
    fn requeue_publish(&self, ino: Ino, at_ms: i64) -> MetaResult<()>;
    fn drop_publish(&self, ino: Ino) -> MetaResult<()>;
    /// Records generation `gen` as published at `xkey`, if it is still current.
    fn mark_published(&self, ino: Ino, gen: u64, xkey: &str, clear_import: bool) -> MetaResult<bool>;
    fn publish_pending(&self) -> MetaResult<u64>;
    /// Takes an export key to delete, unless a file is published there again.
    fn claim_unpublish(&self) -> MetaResult<Option<String>>;
    fn unpublish_done(&self, key: &str) -> MetaResult<()>;

    /// Adds an object that already exists in the bucket as a file (no-op if the
    /// name exists).
    fn import_file(&self, parent: Ino, name: &str, key: &str, size: u64, now_ns: i64) -> MetaResult<Attr>;

    /// Membership through the metadata store (the default without etcd).
    fn register_node(&self, node: &NodeInfo, ttl_ms: u64) -> MetaResult<()>;
    fn live_nodes(&self) -> MetaResult<Vec<NodeInfo>>;
    fn deregister_node(&self, addr: &str) -> MetaResult<()>;

    /// The pool daemon's last report (JSON), kept for `ttl_ms` unless renewed.
    fn put_pool_report(&self, json: &str, ttl_ms: u64) -> MetaResult<()>;
    fn pool_report(&self) -> MetaResult<Option<String>>;
}

/// `/a/b` of an inode, by walking parent links (None if an ancestor vanished).
pub fn path_of(meta: &dyn MetaStore, ino: Ino) -> MetaResult<String> {
    let mut parts = Vec::new();
    let mut cur = ino;
    while cur != ROOT {
        let a = meta.getattr(cur)?;
        parts.push(a.name);
        cur = a.parent;
        if parts.len() > 4096 {
            return Err(MetaError::Corrupt(format!("parent loop at inode {ino}")));
        }
    }
    parts.reverse();
    Ok(parts.join("/"))
}

/// Resolves `a/b/c` from the root.
pub fn resolve(meta: &dyn MetaStore, path: &str) -> MetaResult<Attr> {
    let mut a = meta.getattr(ROOT)?;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        a = meta.lookup(a.ino, part)?;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_entry_roundtrips_with_colons_in_holders() {
        let e = ChunkEntry { ver: 7, len: 10, persisted: true, holders: vec!["127.0.0.1:1".into(), "[::1]:2".into()] };
        assert_eq!(ChunkEntry::decode(&e.encode()), Some(e));
        let e = ChunkEntry { ver: 1, len: 0, persisted: false, holders: vec![] };
        assert_eq!(ChunkEntry::decode(&e.encode()), Some(e));
    }
}
