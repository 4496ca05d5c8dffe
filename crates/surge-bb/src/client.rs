//! The client: the Rust API that the FUSE mount (and tests) use.
//!
//! - Writes go to a per-file write-behind buffer of chunk pieces; a full chunk
//!   is flushed in the background, the rest at flush/fsync/close (or when the
//!   mount's buffer budget is used up). Flushing a chunk = store a new version
//!   on R nodes, then commit it in metadata (compare-and-set on the version it
//!   was based on; on conflict merge our bytes onto the new version and retry).
//! - Reads ask metadata for the current chunk versions (one round trip), then
//!   take the data from the local chunk cache (keyed by version, so never
//!   stale), a node, or S3; a chunk is fetched once however many readers want
//!   it at a time. Sequential reads prefetch the next chunks. Close-to-open
//!   mounts answer reads of chunks read since the open from the cache alone
//!   ([`Client::read_cached`]).

use crate::conn::Buffers;
use crate::meta::{Attr, ChunkEntry, ChunkUpdate, DirEntry, FileView, Ino, Kind, MetaError, Placement, SetAttr};
use crate::proto::ChunkId;
use crate::spare::SpareBufs;
use crate::tier::{DataError, Tier};
use crate::workers::Workers;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Bytes of unflushed writes the client holds before writers wait.
    pub write_behind: u64,
    /// Chunks prefetched ahead of a sequential reader.
    pub read_ahead: u64,
    /// Bytes of chunk data cached on the client.
    pub cache: u64,
    /// `fsync` returns only once the file is persisted in S3.
    pub fsync_waits_for_s3: bool,
    /// How long such an fsync waits before failing with EIO.
    pub fsync_timeout: Duration,
    /// Background threads for flushes and prefetches.
    pub threads: usize,
    /// How long a flush waits for room when every I/O node it may use is
    /// full (write-back frees memory, the pool may grow) before failing
    /// with ENOSPC.
    pub full_wait: Duration,
    /// Serve `getattr` of an open file from the attributes read at open
    /// (close-to-open); off: every getattr asks metadata.
    pub cache_open_attrs: bool,
    /// Map the chunk memory (write-behind budget plus cache) at start, at
    /// idle CPU priority, so that a write burst fills chunks in memory
    /// already mapped instead of faulting in fresh pages.
    pub prefault: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            write_behind: 64 << 20,
            read_ahead: 4,
            cache: 256 << 20,
            fsync_waits_for_s3: false,
            fsync_timeout: Duration::from_secs(120),
            threads: 8,
            full_wait: Duration::from_secs(30),
            cache_open_attrs: true,
            prefault: true,
        }
    }
}

/// A chunk's unflushed bytes: `data` holds the chunk from offset 0, `ranges`
/// which parts of it were written (sorted, merged). `based` is true once the
/// committed content under the unwritten parts has been filled in.
#[derive(Default)]
struct ChunkBuf {
    data: Vec<u8>,
    ranges: Vec<(u64, u64)>,
    based: bool,
}

impl ChunkBuf {
    fn write(&mut self, off: u64, bytes: &[u8]) {
        let (off, end) = (off as usize, off as usize + bytes.len());
        if off >= self.data.len() {
            // Appending (the sequential writer): no zeroing before the copy.
            self.data.resize(off, 0);
            self.data.extend_from_slice(bytes);
        } else {
            if self.data.len() < end {
                self.data.resize(end, 0);
            }
            self.data[off..end].copy_from_slice(bytes);
        }
        self.ranges.push((off as u64, end as u64));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(s, e) in &self.ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.ranges = merged;
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        start >= end || self.ranges.iter().any(|&(s, e)| s <= start && end <= e)
    }

    fn written_end(&self) -> u64 {
        self.ranges.last().map_or(0, |r| r.1)
    }

    /// Our bytes laid over `base` (the committed content).
    fn merged_onto(&self, mut base: Vec<u8>) -> Vec<u8> {
        let end = self.written_end() as usize;
        if base.len() < end {
            base.resize(end, 0);
        }
        for &(s, e) in &self.ranges {
            base[s as usize..e as usize].copy_from_slice(&self.data[s as usize..e as usize]);
        }
        base
    }
}

#[derive(Default)]
struct FileState {
    bufs: BTreeMap<u64, ChunkBuf>,
    buffered: u64,
    /// Chunks taken out of `bufs` and being flushed.
    inflight: usize,
    /// Flush errors, counted as Linux's errseq_t does: `errors` flushes of this
    /// file have failed, the last with `error`; descriptor `fh` has been told
    /// by fsync of the first `told[fh]`.
    error: Option<(i32, String)>,
    errors: u64,
    /// Errors some fsync has reported: a descriptor opened now starts here, so
    /// an error nobody was told of still reaches its fsync.
    reported: u64,
    told: HashMap<Fh, u64>,
    /// End of the last read (sequential detection).
    last_read_end: u64,
    /// Largest end offset written through this client and not yet committed.
    buffered_end: u64,
    /// Attributes cached while the file is open (see `getattr`).
    attr: Option<Attr>,
    /// Chunk versions read from metadata since the file was opened, for
    /// [`Client::read_cached`] (close-to-open: another client's commit is
    /// seen at the next open). Emptied by this client's own commits.
    versions: HashMap<u64, ChunkEntry>,
    /// This client's commits to the file (flushes, truncates): a read that
    /// asked metadata before one of them must not record what it got.
    commits: u64,
}

impl FileState {
    /// The last flush error, if descriptor `fh` has not been told of it by fsync.
    fn untold(&self, ino: Ino, fh: Fh) -> Option<DataError> {
        let told = self.told.get(&fh).copied().unwrap_or(self.reported);
        self.error_since(ino, told)
    }

    /// The last flush error, if there were errors after the first `since`.
    fn error_since(&self, ino: Ino, since: u64) -> Option<DataError> {
        let (errno, why) = self.error.clone().filter(|_| since < self.errors)?;
        Some(DataError::FlushFailed { ino, errno, why })
    }

    /// Versions read until now may be stale (after a commit of ours, at an
    /// open): later reads ask metadata again.
    fn forget_versions(&mut self) {
        self.commits += 1;
        self.versions.clear();
    }

    fn store_error(&mut self, e: &DataError) {
        self.errors += 1;
        self.error = Some((e.errno(), e.to_string()));
    }
}

struct OpenFile {
    ino: Ino,
    st: Mutex<FileState>,
    changed: Condvar,
}

/// An open descriptor of a file (a FUSE file handle): flush errors are
/// reported to each descriptor's fsync, not only to the first fsync.
pub type Fh = u64;

/// Chunk data by version: an entry can never be stale.
struct ChunkCache {
    budget: u64,
    used: u64,
    map: HashMap<ChunkId, Arc<Vec<u8>>>,
    order: VecDeque<ChunkId>,
}

impl ChunkCache {
    fn get(&self, c: &ChunkId) -> Option<Arc<Vec<u8>>> {
        self.map.get(c).cloned()
    }

    /// Caches `d`; returns what it evicted for room.
    fn insert(&mut self, c: ChunkId, d: Arc<Vec<u8>>) -> Vec<Arc<Vec<u8>>> {
        let mut evicted = Vec::new();
        if self.map.contains_key(&c) || d.len() as u64 > self.budget {
            return evicted;
        }
        self.used += d.len() as u64;
        self.map.insert(c, d);
        self.order.push_back(c);
        while self.used > self.budget {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(d) = self.map.remove(&old) {
                self.used -= d.len() as u64;
                evicted.push(d);
            }
        }
        evicted
    }
}


pub struct Client {
    pub tier: Arc<Tier>,
    cfg: ClientConfig,
    client_id: u64,
    next_ver: AtomicU64,
    next_fh: AtomicU64,
    open: Mutex<HashMap<Ino, Arc<OpenFile>>>,
    cache: Mutex<ChunkCache>,
    /// Mapped memory for the chunks writers fill: evicted chunks', and the
    /// write-behind budget mapped at start.
    spare: Arc<SpareBufs>,
    /// Memory fetched chunks are read into (the spares).
    read_buffers: Buffers,
    /// Chunk versions being fetched from a node or S3: a reader that needs one
    /// waits for that fetch (a prefetch, or another reader of the same chunk:
    /// the kernel reads a chunk in several pieces at once) instead of moving
    /// the same bytes again.
    fetching: Mutex<HashSet<ChunkId>>,
    fetched: Condvar,
    /// Chunk fetches started (from a node or S3).
    fetches: AtomicU64,
    jobs: Workers,
    /// Unflushed bytes across all files, and a condvar writers wait on.
    buffered: Mutex<u64>,
    drained: Condvar,
}

pub type Result<T> = std::result::Result<T, DataError>;

/// A write at least this large (or a whole chunk) at a chunk's start
/// reserves the whole chunk.
const LARGE_WRITE: usize = 256 << 10;

/// How often a read follows a chunk replaced under it before giving up.
const SUPERSEDED_RETRIES: usize = 50;

/// The right to fetch one chunk version: others wanting it wait until the
/// claim is dropped (also when the fetch fails or panics), then look in the
/// cache again.
struct FetchClaim<C: std::ops::Deref<Target = Client>> {
    client: C,
    id: ChunkId,
}

impl<C: std::ops::Deref<Target = Client>> Drop for FetchClaim<C> {
    fn drop(&mut self) {
        self.client.fetching.lock().remove(&self.id);
        self.client.fetched.notify_all();
    }
}

/// Which stored flush errors a flush reports. A write under backpressure and
/// a close report what the descriptor has not been told of and mark nothing
/// (the kernel may turn that failed WRITE into a short count and drop the
/// error; a close may be a forked child's of an inherited descriptor); fsync
/// reports it and marks the descriptor told; truncate reports only errors of
/// the flushes it waited for (an older error belongs to the descriptors'
/// fsyncs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Report {
    Untold(Fh),
    Fsync(Fh),
    New,
}

/// The answer of [`Client::read_cached`].
pub enum CachedBytes {
    /// A range of one cached chunk.
    Chunk(Arc<Vec<u8>>, std::ops::Range<usize>),
    /// Pieces of several chunks, put together.
    Copied(Vec<u8>),
}

impl CachedBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            CachedBytes::Chunk(d, r) => &d[r.clone()],
            CachedBytes::Copied(v) => v,
        }
    }
}

/// Version used in the cache for bytes of an imported object.
const IMPORTED: u64 = 0;

impl Client {
    pub fn new(tier: Arc<Tier>, cfg: ClientConfig) -> Result<Arc<Client>> {
        let client_id = tier.meta.new_client_id()?;
        let jobs = Workers::start("bb-client", cfg.threads).map_err(|e| MetaError::Unavailable(format!("starting client threads: {e}")))?;
        // Every written chunk passes through the cache: its memory is the
        // write-behind budget plus the cache.
        let spare = Arc::new(SpareBufs::new(tier.params.chunk_size as usize, cfg.write_behind + cfg.cache));
        if cfg.prefault {
            let s = spare.clone();
            crate::spare::map_when_idle("chunk buffers", move || s.fill());
        }
        // A fetched chunk goes to the cache too: read it into spare memory.
        let read_buffers: Buffers = {
            let s = spare.clone();
            Arc::new(move |n| s.take_sized(n))
        };
        Ok(Arc::new(Client {
            cache: Mutex::new(ChunkCache { budget: cfg.cache, used: 0, map: HashMap::new(), order: VecDeque::new() }),
            spare,
            read_buffers,
            tier,
            cfg,
            client_id,
            next_ver: AtomicU64::new(1),
            next_fh: AtomicU64::new(1),
            open: Mutex::default(),
            fetching: Mutex::default(),
            fetched: Condvar::new(),
            fetches: AtomicU64::new(0),
            jobs,
            buffered: Mutex::new(0),
            drained: Condvar::new(),
        }))
    }

    /// Chunk versions fetched from a node or S3 so far (cache misses that
    /// moved data; a chunk wanted by several readers at once counts once).
    pub fn chunk_fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    pub fn chunk_size(&self) -> u64 {
        self.tier.params.chunk_size
    }

    /// Bytes of mapped memory kept for the chunks writers fill.
    pub fn spare_bytes(&self) -> u64 {
        self.spare.bytes()
    }

    /// Caches a chunk version; the memory of what it evicts serves later
    /// writes when nothing else holds it and the cache and the spares
    /// together stay within the chunk memory.
    fn cache_insert(&self, id: ChunkId, d: Arc<Vec<u8>>) {
        let (evicted, cached) = {
            let mut c = self.cache.lock();
            (c.insert(id, d), c.used)
        };
        let room = (self.cfg.write_behind + self.cfg.cache).saturating_sub(cached);
        for d in evicted {
            if let Ok(v) = Arc::try_unwrap(d) {
                self.spare.give_within(v, room);
            }
        }
    }

    fn new_ver(&self) -> u64 {
        (self.client_id << 32) | self.next_ver.fetch_add(1, Ordering::Relaxed)
    }

    fn open_file(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.open.lock().get(&ino).cloned()
    }

    // ---- namespace ----------------------------------------------------------

    pub fn lookup(&self, parent: Ino, name: &str) -> Result<Attr> {
        let a = self.tier.meta.lookup(parent, name)?;
        Ok(self.overlay(a))
    }

    /// Attributes, with this client's unflushed writes reflected in the size.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        match self.open_attr(ino) {
            Some(a) => Ok(a),
            None => Ok(self.overlay(self.tier.meta.getattr(ino)?)),
        }
    }

    /// The attributes of a file this client has open, as read at open or
    /// at its last commit (close-to-open), with unflushed writes in the size;
    /// `None` when they must come from metadata. Never blocks on I/O.
    pub fn open_attr(&self, ino: Ino) -> Option<Attr> {
        let of = self.open_file(ino).filter(|_| self.cfg.cache_open_attrs)?;
        let st = of.st.lock();
        let mut a = st.attr.clone()?;
        a.size = a.size.max(st.buffered_end);
        Some(a)
    }

    fn overlay(&self, mut a: Attr) -> Attr {
        if let Some(of) = self.open_file(a.ino) {
            let st = of.st.lock();
            a.size = a.size.max(st.buffered_end);
        }
        a
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr, size: Option<u64>) -> Result<Attr> {
        if let Some(size) = size {
            self.truncate(ino, size)?;
        }
        let a = self.tier.meta.setattr(ino, set, crate::now_ns())?;
        self.refresh_cached_attr(ino, &a);
        Ok(self.overlay(a))
    }

    fn refresh_cached_attr(&self, ino: Ino, a: &Attr) {
        if let Some(of) = self.open_file(ino) {
            of.st.lock().attr = Some(a.clone());
        }
    }

    pub fn create(&self, parent: Ino, name: &str, kind: Kind, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        check_name(parent, name)?;
        Ok(self.tier.meta.create(parent, name, kind, mode, uid, gid, crate::now_ns())?)
    }

    pub fn unlink(&self, parent: Ino, name: &str) -> Result<()> {
        let r = self.tier.meta.unlink(parent, name, crate::now_ns())?;
        self.tier.discard(r.ino, &r.chunks);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &str) -> Result<()> {
        Ok(self.tier.meta.rmdir(parent, name, crate::now_ns())?)
    }

    pub fn rename(&self, parent: Ino, name: &str, new_parent: Ino, new_name: &str) -> Result<()> {
        check_name(new_parent, new_name)?;
        if let Some(r) = self.tier.meta.rename(parent, name, new_parent, new_name, crate::now_ns())? {
            self.tier.discard(r.ino, &r.chunks);
        }
        Ok(())
    }

    pub fn readdir(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        Ok(self.tier.meta.readdir(ino)?)
    }

    pub fn resolve(&self, path: &str) -> Result<Attr> {
        Ok(crate::meta::resolve(self.tier.meta.as_ref(), path)?)
    }

    // ---- open files ------------------------------------------------------

    /// Opens a descriptor of a file: fresh attributes (close-to-open),
    /// write-behind state shared by the file's descriptors.
    pub fn open(&self, ino: Ino) -> Result<Fh> {
        self.open_fresh(self.tier.meta.getattr(ino)?)
    }

    /// A file's attributes and where its directories are, from metadata
    /// (for a mount to check the names its kernel cached before it opens
    /// the file with [`Client::open_fresh`]).
    pub fn fresh_attr_with_ancestors(&self, ino: Ino) -> Result<(Attr, Vec<Placement>)> {
        Ok(self.tier.meta.getattr_with_ancestors(ino)?)
    }

    /// Opens a descriptor of the file whose attributes `a` were just read
    /// from metadata (by `create`, say): no second read.
    pub fn open_fresh(&self, a: Attr) -> Result<Fh> {
        let ino = a.ino;
        if a.kind == Kind::Dir {
            return Err(MetaError::IsDir.into());
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // The map stays locked until the descriptor is registered, so a
        // concurrent last release cannot forget the file in between.
        let mut open = self.open.lock();
        let of = open.entry(ino).or_insert_with(|| Arc::new(OpenFile { ino, st: Mutex::default(), changed: Condvar::new() })).clone();
        let mut st = of.st.lock();
        let start = st.reported;
        st.told.insert(fh, start);
        st.attr = Some(a);
        // Close-to-open for every descriptor, also one opened beside another.
        st.forget_versions();
        Ok(fh)
    }

    /// Closes a descriptor: flushes, and forgets the file after its last.
    pub fn release(&self, ino: Ino, fh: Fh) -> Result<()> {
        let r = self.flush(ino, fh);
        let mut open = self.open.lock();
        if let Some(of) = open.get(&ino).cloned() {
            let mut st = of.st.lock();
            st.told.remove(&fh);
            if st.told.is_empty() {
                open.remove(&ino);
            }
        }
        r
    }

    pub fn write(self: &Arc<Self>, ino: Ino, fh: Fh, off: u64, data: &[u8]) -> Result<usize> {
        if self.write_buffered(ino, fh, off, data)? {
            self.wait_under_budget(ino, fh)?;
        }
        Ok(data.len())
    }

    /// The part of a write that never waits: copies `data` into the file's
    /// chunk buffers and hands full chunks to background flushes. `true`
    /// when the client is now over its write-behind budget: the writer must
    /// then [`Client::wait_under_budget`] before its write is acknowledged.
    pub fn write_buffered(self: &Arc<Self>, ino: Ino, fh: Fh, off: u64, data: &[u8]) -> Result<bool> {
        let end = off.checked_add(data.len() as u64).filter(|e| *e <= crate::meta::MAX_FILE_SIZE);
        let Some(_) = end else { return Err(MetaError::TooBig(off.saturating_add(data.len() as u64)).into()) };
        let of = self.open_file(ino).ok_or(MetaError::Invalid)?;
        let cs = self.chunk_size();
        {
            let mut st = of.st.lock();
            // Reported, not marked told: the kernel turns a failed WRITE after
            // bytes it already sent into a short count and drops the error,
            // so only fsync may.
            if let Some(e) = st.untold(ino, fh) {
                return Err(e);
            }
            let mut pos = 0usize;
            let mut full = Vec::new();
            while pos < data.len() {
                let abs = off + pos as u64;
                let idx = abs / cs;
                let within = abs % cs;
                let n = ((cs - within) as usize).min(data.len() - pos);
                let buf = st.bufs.entry(idx).or_default();
                if within == 0 && n >= LARGE_WRITE.min(cs as usize) && buf.data.capacity() == 0 {
                    // A large write at the chunk's start: the chunk will likely
                    // fill, so take its room at once instead of regrowing.
                    match self.spare.take() {
                        Some(room) => buf.data = room,
                        None => buf.data.reserve_exact(cs as usize),
                    }
                }
                buf.write(within, &data[pos..pos + n]);
                if buf.covers(0, cs) {
                    full.push(idx);
                }
                pos += n;
            }
            st.buffered += data.len() as u64;
            st.buffered_end = st.buffered_end.max(off + data.len() as u64);
            for idx in full {
                if let Some(buf) = st.bufs.remove(&idx) {
                    st.inflight += 1;
                    let (me, of2) = (self.clone(), of.clone());
                    self.jobs.run(move || me.flush_in_background(&of2, idx, buf));
                }
            }
        }
        let mut b = self.buffered.lock();
        *b += data.len() as u64;
        Ok(*b > self.cfg.write_behind)
    }

    /// Backpressure: the writer flushes its own file, then waits for
    /// background flushes to bring the client's total under the budget. A
    /// failed flush stays stored for fsync or close: the kernel may turn
    /// this failed WRITE into a short count and drop the error.
    pub fn wait_under_budget(&self, ino: Ino, fh: Fh) -> Result<()> {
        if let Some(of) = self.open_file(ino) {
            self.flush_buffers(&of, Report::Untold(fh))?;
        }
        let mut b = self.buffered.lock();
        let deadline = Instant::now() + Duration::from_secs(60);
        while *b > self.cfg.write_behind && Instant::now() < deadline {
            self.drained.wait_for(&mut b, Duration::from_millis(100));
        }
        Ok(())
    }

    fn release_budget(&self, bytes: u64) {
        let mut b = self.buffered.lock();
        *b = b.saturating_sub(bytes);
        self.drained.notify_all();
    }

    fn flush_in_background(&self, of: &OpenFile, idx: u64, buf: ChunkBuf) {
        let bytes: u64 = buf.ranges.iter().map(|r| r.1 - r.0).sum();
        let r = self.flush_chunk_or_eio(of.ino, idx, buf);
        self.release_budget(bytes);
        self.flushed(of, bytes, r);
    }

    /// One flush in flight is done: `buffered` bytes leave the file's count
    /// (0 when the caller already zeroed it), its error is stored for the file.
    fn flushed(&self, of: &OpenFile, buffered: u64, r: Result<()>) {
        let mut st = of.st.lock();
        st.buffered = st.buffered.saturating_sub(buffered);
        if let Err(e) = r {
            st.store_error(&e);
        }
        st.inflight -= 1;
        of.changed.notify_all();
    }

    /// Flushes every buffered chunk of the file and waits for every flush in
    /// flight, this call's and others'; then reports a stored error as
    /// `report` says.
    fn flush_buffers(&self, of: &OpenFile, report: Report) -> Result<()> {
        // The taken buffers count as in flight: a concurrent flush (an fsync
        // racing a close of another descriptor) must wait for them, not find
        // nothing buffered and return before they are committed.
        let (bufs, errors_before) = {
            let mut st = of.st.lock();
            st.buffered = 0;
            let bufs = std::mem::take(&mut st.bufs);
            st.inflight += bufs.len();
            (bufs, st.errors)
        };
        let flushed = bufs.len();
        for (idx, buf) in bufs {
            let bytes: u64 = buf.ranges.iter().map(|r| r.1 - r.0).sum();
            let r = self.flush_chunk_or_eio(of.ino, idx, buf);
            self.release_budget(bytes);
            self.flushed(of, 0, r);
        }
        {
            let mut st = of.st.lock();
            while st.inflight > 0 {
                of.changed.wait(&mut st);
            }
            let failed = match report {
                Report::Untold(fh) => st.untold(of.ino, fh),
                Report::Fsync(fh) => {
                    let e = st.untold(of.ino, fh);
                    let errors = st.errors;
                    if let Some(told) = st.told.get_mut(&fh) {
                        *told = errors;
                    }
                    st.reported = errors;
                    e
                }
                Report::New => st.error_since(of.ino, errors_before),
            };
            if let Some(e) = failed {
                return Err(e);
            }
            if flushed == 0 && st.buffered_end == 0 {
                // Nothing written since the attributes were last read (a
                // create then close, say): they need no refresh.
                return Ok(());
            }
        }
        // Committed: the size now comes from metadata again.
        let a = self.tier.meta.getattr(of.ino)?;
        let mut st = of.st.lock();
        if st.bufs.is_empty() && st.inflight == 0 {
            st.buffered_end = 0;
        }
        st.attr = Some(a);
        Ok(())
    }

    /// [`Client::flush_chunk`], with a panic in it (a bug) turned into EIO
    /// for the file: the flush's accounting (budget, in-flight count) must
    /// still run, or every later fsync and close of the file would wait
    /// forever.
    fn flush_chunk_or_eio(&self, ino: Ino, idx: u64, buf: ChunkBuf) -> Result<()> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.flush_chunk(ino, idx, buf))).unwrap_or_else(|panic| {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            Err(DataError::FlushFailed { ino, errno: libc::EIO, why: format!("flushing chunk {idx} panicked: {}", what.as_deref().unwrap_or("(no message)")) })
        })
    }

    /// Makes one chunk's buffered bytes committed: store a new version on the
    /// nodes, then compare-and-set it in metadata; on conflict, merge and retry.
    fn flush_chunk(&self, ino: Ino, idx: u64, mut buf: ChunkBuf) -> Result<()> {
        let cs = self.chunk_size();
        for attempt in 0.. {
            let (view, e) = self.tier.meta.chunks(ino, &[idx])?;
            let cur = e.into_iter().next().flatten();
            let base_len = match &cur {
                Some(c) => c.len,
                None => view.import.as_ref().map_or(0, |(_, lim)| lim.saturating_sub(idx * cs).min(cs)),
            };
            let need_base = !buf.based && !buf.covers(0, base_len.min(cs));
            let content = if need_base {
                let base = match &cur {
                    Some(c) => self.chunk_data(ino, idx, c)?.to_vec(),
                    None => self.imported_data(ino, &view, idx)?.to_vec(),
                };
                buf.merged_onto(base)
            } else {
                // Our bytes are the whole content (zeros in any gap between
                // them, as merging onto nothing gives): sent without a copy,
                // and put back below if a retry needs them.
                std::mem::take(&mut buf.data)
            };
            let ver = self.new_ver();
            let chunk = ChunkId { ino, idx, ver };
            let t = Instant::now();
            let holders = self.store_waiting_for_room(chunk, &content)?;
            let stored = t.elapsed();
            let entry = ChunkEntry { ver, len: content.len() as u64, persisted: false, holders: holders.clone() };
            let end = idx * cs + buf.written_end();
            let update = ChunkUpdate { idx, base: cur.as_ref().map(|c| c.ver), entry: entry.clone() };
            let committed = self.tier.meta.commit(ino, end, &[update], crate::now_ns());
            tracing::debug!("chunk {}: stored on {holders:?} in {stored:?}, committed in {:?}", chunk.member(), t.elapsed() - stored);
            match committed {
                Ok(old) => {
                    self.tier.discard(ino, &old);
                    self.cache_insert(chunk, Arc::new(content));
                    if let Some(of) = self.open_file(ino) {
                        of.st.lock().forget_versions();
                    }
                    return Ok(());
                }
                Err(MetaError::Conflict(_)) if attempt < 50 => {
                    // Another client committed this chunk since we read it.
                    self.tier.discard(ino, &[(idx, entry)]);
                    if !need_base {
                        buf.data = content;
                    }
                    continue;
                }
                Err(err) => {
                    self.tier.discard(ino, &[(idx, entry)]);
                    if !matches!(err, MetaError::NotFound) {
                        tracing::error!("committing chunk {idx} of inode {ino}: {err}");
                    }
                    return Err(err.into());
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Stores a new chunk version on R nodes. While every node it may use
    /// is full, waits (backing off, up to `full_wait`) for write-back to free
    /// memory or the pool to grow, as a write-back cache holds writers while
    /// it cleans; then fails with ENOSPC.
    fn store_waiting_for_room(&self, chunk: ChunkId, data: &[u8]) -> Result<Vec<String>> {
        let give_up = Instant::now() + self.cfg.full_wait;
        let mut pause = Duration::from_millis(20);
        let mut waited = false;
        loop {
            match self.tier.store_chunk(chunk, data, &[]) {
                Err(DataError::NotReplicated { full: true, .. }) if Instant::now() + pause <= give_up => {
                    if !waited {
                        tracing::warn!("chunk {}: the I/O nodes are full; waiting up to {:?} for room", chunk.member(), self.cfg.full_wait);
                        waited = true;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                    self.tier.forget_live_cache();
                }
                Err(e @ DataError::NotReplicated { full: true, .. }) => {
                    tracing::error!("{e} (waited {:?} for room)", self.cfg.full_wait);
                    return Err(e);
                }
                r => {
                    if waited && r.is_ok() {
                        tracing::info!("chunk {}: stored after waiting for room", chunk.member());
                    }
                    return r;
                }
            }
        }
    }

    /// flush(2)/close: everything written so far is committed (visible to all
    /// clients and on R nodes) when this returns Ok. An error this descriptor
    /// has not been told of is reported but kept for fsync: the kernel sends FLUSH for every close of
    /// a descriptor, also when a forked child execs and closes its inherited
    /// copy, and that close must not swallow the writer's error.
    pub fn flush(&self, ino: Ino, fh: Fh) -> Result<()> {
        let Some(of) = self.open_file(ino) else { return Ok(()) };
        self.flush_buffers(&of, Report::Untold(fh))
    }

    /// fsync: flush, report a flush error this descriptor has not been told
    /// of (every descriptor's fsync is told once, as with Linux's errseq_t),
    /// and with `fsync_waits_for_s3`, wait until the file's current
    /// generation is in S3 (chunks, manifest and export object).
    pub fn fsync(&self, ino: Ino, fh: Fh) -> Result<()> {
        if let Some(of) = self.open_file(ino) {
            self.flush_buffers(&of, Report::Fsync(fh))?;
        }
        if !self.cfg.fsync_waits_for_s3 {
            return Ok(());
        }
        self.wait_persisted(ino, self.cfg.fsync_timeout)
    }

    pub fn wait_persisted(&self, ino: Ino, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        self.tier.meta.expedite(ino)?;
        loop {
            let a = self.tier.meta.getattr(ino)?;
            if a.persisted() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                let err = DataError::NotPersisted { ino, waited: timeout, persisted: a.pgen, current: a.gen };
                tracing::error!("fsync: {err}");
                return Err(err);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        if size > crate::meta::MAX_FILE_SIZE {
            return Err(MetaError::TooBig(size).into());
        }
        if let Some(of) = self.open_file(ino) {
            self.flush_buffers(&of, Report::New)?;
        }
        let cs = self.chunk_size();
        let tail_idx = size / cs;
        let keep = size % cs;
        loop {
            let (view, e) = self.tier.meta.chunks(ino, &[tail_idx])?;
            let cur = e.into_iter().next().flatten();
            let mut tail = None;
            if keep > 0 {
                if let Some(c) = cur.as_ref().filter(|c| c.len > keep) {
                    let mut data = self.chunk_data(ino, tail_idx, c)?.to_vec();
                    data.truncate(keep as usize);
                    let ver = self.new_ver();
                    let holders = self.tier.store_chunk(ChunkId { ino, idx: tail_idx, ver }, &data, &[])?;
                    tail = Some(ChunkUpdate {
                        idx: tail_idx,
                        base: Some(c.ver),
                        entry: ChunkEntry { ver, len: keep, persisted: false, holders },
                    });
                }
            }
            let _ = view;
            match self.tier.meta.truncate(ino, size, tail.as_ref(), crate::now_ns()) {
                Ok(removed) => {
                    self.tier.discard(ino, &removed);
                    if let Some(of) = self.open_file(ino) {
                        let mut st = of.st.lock();
                        st.forget_versions();
                        st.buffered_end = 0;
                        if let Some(a) = st.attr.as_mut() {
                            a.size = size;
                        }
                    }
                    return Ok(());
                }
                Err(MetaError::Conflict(_)) => {
                    if let Some(t) = tail {
                        self.tier.discard(ino, &[(t.idx, t.entry)]);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    // ---- reads ----------------------------------------------------------------

    /// The bytes of chunk version `e`, or of a newer version of the chunk if
    /// `e` was superseded and discarded from the nodes before we read it (a
    /// concurrent commit: either version is a valid answer to a read, and a
    /// read-modify-write based on the newer one fails its compare-and-set and
    /// retries).
    fn chunk_data(&self, ino: Ino, idx: u64, e: &ChunkEntry) -> Result<Arc<Vec<u8>>> {
        let mut e = e.clone();
        for _ in 0..SUPERSEDED_RETRIES {
            let id = ChunkId { ino, idx, ver: e.ver };
            let claim = match self.cached_or_claim(id) {
                Ok(d) => return Ok(d),
                Err(claim) => claim,
            };
            match self.fetch(claim.id, &e) {
                Ok(d) => return Ok(d),
                Err(err @ DataError::Unreadable { .. }) => {
                    drop(claim);
                    let (_, cur) = self.tier.meta.chunks(ino, &[idx])?;
                    match cur.into_iter().next().flatten() {
                        Some(newer) if newer.ver != e.ver => e = newer,
                        _ => return Err(err),
                    }
                }
                Err(err) => return Err(err),
            }
        }
        Err(DataError::Unreadable { chunk: format!("{idx} of inode {ino}"), why: format!("superseded {SUPERSEDED_RETRIES} times while being read") })
    }

    /// The cached bytes of `id`, waiting first for a fetch of it in flight;
    /// if nobody holds them, the claim to fetch them.
    fn cached_or_claim(&self, id: ChunkId) -> std::result::Result<Arc<Vec<u8>>, FetchClaim<&Client>> {
        let mut fetching = self.fetching.lock();
        loop {
            if let Some(d) = self.cache.lock().get(&id) {
                return Ok(d);
            }
            if fetching.insert(id) {
                return Err(FetchClaim { client: self, id });
            }
            // The fetch may fail, or its bytes not stay cached: then look
            // again and fetch ourselves.
            self.fetched.wait(&mut fetching);
        }
    }

    /// Fetches chunk version `id` (entry `e`; the caller holds its claim)
    /// and caches it.
    fn fetch(&self, id: ChunkId, e: &ChunkEntry) -> Result<Arc<Vec<u8>>> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let d = Arc::new(self.tier.read_chunk_into(id.ino, id.idx, e, Some(self.read_buffers.clone()))?);
        self.cache_insert(id, d.clone());
        Ok(d)
    }

    fn imported_data(&self, ino: Ino, view: &FileView, idx: u64) -> Result<Arc<Vec<u8>>> {
        let Some((_, limit)) = &view.import else { return Ok(Arc::default()) };
        let id = ChunkId { ino, idx, ver: IMPORTED };
        let cs = self.chunk_size();
        let valid = limit.saturating_sub(idx * cs).min(cs) as usize;
        let d = match self.cache.lock().get(&id) {
            Some(d) => d,
            None => Arc::new(Vec::new()),
        };
        let d = if d.is_empty() && valid > 0 {
            let d = Arc::new(self.tier.read_imported(&view.import, idx)?);
            self.cache_insert(id, d.clone());
            d
        } else {
            d
        };
        // The import limit may have shrunk (truncate) since the bytes were cached.
        if d.len() > valid {
            return Ok(Arc::new(d[..valid].to_vec()));
        }
        Ok(d)
    }

    /// Reads up to `len` bytes at `off` (short only at end of file).
    pub fn read(self: &Arc<Self>, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        let cs = self.chunk_size();
        let of = self.open_file(ino);
        // Our own unflushed writes must be visible to us: wait out background
        // flushes, and serve buffered chunks from the buffer.
        let mut local_end = 0;
        if let Some(of) = &of {
            let mut st = of.st.lock();
            while st.inflight > 0 {
                of.changed.wait(&mut st);
            }
            local_end = st.buffered_end;
        }
        let first = off / cs;
        let last = (off + len.max(1) as u64 - 1) / cs;
        let (sequential, commits) = of.as_ref().map_or((false, 0), |o| {
            let st = o.st.lock();
            (st.last_read_end == off, st.commits)
        });
        let ahead = if sequential { self.cfg.read_ahead } else { 0 };
        let idxs: Vec<u64> = (first..=last + ahead).collect();
        let (view, entries) = self.tier.meta.chunks(ino, &idxs)?;
        if let Some(of) = of.as_ref().filter(|_| self.cfg.cache_open_attrs && view.import.is_none()) {
            let mut st = of.st.lock();
            if st.commits == commits {
                for (idx, e) in idxs.iter().zip(&entries) {
                    if let Some(e) = e {
                        st.versions.insert(*idx, e.clone());
                    }
                }
            }
        }
        let size = view.size.max(local_end);
        if off >= size {
            return Ok(vec![]);
        }
        let end = (off + len as u64).min(size);
        let mut out = Vec::with_capacity((end - off) as usize);
        for (i, idx) in (first..=last).enumerate() {
            let cstart = idx * cs;
            let (a, b) = (off.max(cstart), end.min(cstart + cs));
            if a >= b {
                break;
            }
            let piece = (a - cstart) as usize..(b - cstart) as usize;
            if let Some(of) = &of {
                if let Some(bytes) = self.read_buffered(of, ino, idx, &view, entries[i].as_ref(), piece.clone())? {
                    out.extend_from_slice(&bytes);
                    continue;
                }
            }
            let data = match &entries[i] {
                Some(e) => self.chunk_data(ino, idx, e)?,
                None => self.imported_data(ino, &view, idx)?,
            };
            let have = piece.start.min(data.len())..piece.end.min(data.len());
            out.extend_from_slice(&data[have.clone()]);
            out.resize(out.len() + (piece.len() - have.len()), 0);
        }
        if let Some(of) = &of {
            of.st.lock().last_read_end = end;
        }
        for (i, idx) in (last + 1..=last + ahead).enumerate() {
            if idx * cs >= size {
                break;
            }
            if let Some(e) = entries[(last - first + 1) as usize + i].clone() {
                self.prefetch(ino, idx, e);
            }
        }
        Ok(out)
    }

    /// A read answered from memory without waiting, for close-to-open
    /// mounts: the file is open here with nothing of ours buffered or being
    /// flushed, and each chunk the range touches has a version read from
    /// metadata since the open whose bytes are cached. `None` means: take
    /// [`Client::read`] (which asks metadata).
    pub fn read_cached(&self, ino: Ino, off: u64, len: usize) -> Option<CachedBytes> {
        if !self.cfg.cache_open_attrs {
            return None;
        }
        let of = self.open_file(ino)?;
        let cs = self.chunk_size();
        let mut st = of.st.lock();
        if st.inflight > 0 || !st.bufs.is_empty() {
            return None;
        }
        let size = st.attr.as_ref()?.size.max(st.buffered_end);
        let end = (off + len as u64).min(size);
        if off >= end {
            return Some(CachedBytes::Copied(Vec::new()));
        }
        let mut pieces = Vec::new();
        {
            let cache = self.cache.lock();
            for idx in off / cs..=(end - 1) / cs {
                let e = st.versions.get(&idx)?;
                let data = cache.get(&ChunkId { ino, idx, ver: e.ver })?;
                let cstart = idx * cs;
                pieces.push((data, (off.max(cstart) - cstart) as usize..(end.min(cstart + cs) - cstart) as usize));
            }
        }
        st.last_read_end = end;
        drop(st);
        // The usual case, a piece of one chunk: no copy here.
        if pieces.len() == 1 && pieces[0].1.end <= pieces[0].0.len() {
            let (data, piece) = pieces.pop().expect("one piece");
            return Some(CachedBytes::Chunk(data, piece));
        }
        let mut out = Vec::with_capacity((end - off) as usize);
        for (data, piece) in &pieces {
            let have = piece.start.min(data.len())..piece.end.min(data.len());
            out.extend_from_slice(&data[have.clone()]);
            out.resize(out.len() + (piece.len() - have.len()), 0);
        }
        Some(CachedBytes::Copied(out))
    }

    /// Serves a piece from the write-behind buffer (filling in the committed
    /// content below it first if needed); None when the chunk is not buffered.
    fn read_buffered(&self, of: &OpenFile, ino: Ino, idx: u64, view: &FileView, cur: Option<&ChunkEntry>, piece: std::ops::Range<usize>) -> Result<Option<Vec<u8>>> {
        {
            let st = of.st.lock();
            let Some(buf) = st.bufs.get(&idx) else { return Ok(None) };
            if buf.based || buf.covers(piece.start as u64, piece.end as u64) {
                let mut v = buf.data.get(piece.start.min(buf.data.len())..piece.end.min(buf.data.len())).unwrap_or(&[]).to_vec();
                v.resize(piece.len(), 0);
                return Ok(Some(v));
            }
        }
        let base = match cur {
            Some(e) => self.chunk_data(ino, idx, e)?.to_vec(),
            None => self.imported_data(ino, view, idx)?.to_vec(),
        };
        let mut st = of.st.lock();
        let Some(buf) = st.bufs.get_mut(&idx) else { return Ok(None) };
        if !buf.based {
            buf.data = buf.merged_onto(base);
            buf.based = true;
        }
        let mut v = buf.data.get(piece.start.min(buf.data.len())..piece.end.min(buf.data.len())).unwrap_or(&[]).to_vec();
        v.resize(piece.len(), 0);
        Ok(Some(v))
    }

    fn prefetch(self: &Arc<Self>, ino: Ino, idx: u64, e: ChunkEntry) {
        let id = ChunkId { ino, idx, ver: e.ver };
        {
            // As in cached_or_claim: the cache is looked at under the claims' lock.
            let mut fetching = self.fetching.lock();
            if self.cache.lock().get(&id).is_some() || !fetching.insert(id) {
                return;
            }
        }
        // The job owns the claim: dropped unrun, it still releases it.
        let claim = FetchClaim { client: self.clone(), id };
        self.jobs.run(move || {
            if let Err(err) = claim.client.fetch(claim.id, &e) {
                tracing::debug!("prefetch of chunk {} failed: {err}", claim.id.member());
            }
        });
    }

    // ---- conveniences for tools and tests ------------------------------------

    /// Creates (or truncates) `path` (parent directories must exist) and writes `data`.
    pub fn write_file(self: &Arc<Self>, path: &str, data: &[u8]) -> Result<Ino> {
        let (dir, name) = path.trim_matches('/').rsplit_once('/').unwrap_or(("", path.trim_matches('/')));
        let parent = self.resolve(dir)?.ino;
        let a = match self.create(parent, name, Kind::File, 0o644, 0, 0) {
            Ok(a) => a,
            Err(DataError::Meta(MetaError::Exists)) => {
                let a = self.lookup(parent, name)?;
                self.truncate(a.ino, 0)?;
                a
            }
            Err(e) => return Err(e),
        };
        let fh = self.open(a.ino)?;
        let r = self.write(a.ino, fh, 0, data).and_then(|_| self.fsync(a.ino, fh));
        let c = self.release(a.ino, fh);
        r.and(c)?;
        Ok(a.ino)
    }

    pub fn read_file(self: &Arc<Self>, path: &str) -> Result<Vec<u8>> {
        let a = self.resolve(path)?;
        let fh = self.open(a.ino)?;
        let mut out = Vec::new();
        let r = (|| loop {
            let piece = self.read(a.ino, out.len() as u64, 4 << 20)?;
            if piece.is_empty() {
                return Ok(());
            }
            out.extend_from_slice(&piece);
        })();
        let c = self.release(a.ino, fh);
        r.and(c)?;
        Ok(out)
    }
}

/// `/.surge` is where the bucket keeps chunk and manifest objects: a file
/// there would be published over them (or its removal would delete them).
fn check_name(parent: Ino, name: &str) -> std::result::Result<(), MetaError> {
    if parent == crate::meta::ROOT && name == crate::s3::INTERNAL_PREFIX {
        return Err(MetaError::Reserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_buf_merges_ranges_and_overlays_base() {
        let mut b = ChunkBuf::default();
        b.write(4, b"bb");
        b.write(0, b"aaaa");
        assert_eq!(b.ranges, vec![(0, 6)]);
        b.write(10, b"c");
        assert!(b.covers(0, 6) && !b.covers(0, 11));
        assert_eq!(b.merged_onto(b"xxxxxxxxxxxxxxx".to_vec()), b"aaaabbxxxxcxxxx".to_vec());
        assert_eq!(b.merged_onto(vec![]).len(), 11);
    }
}
