//! An I/O node's chunk store: chunk versions in memory under a byte budget,
//! each flagged dirty (not yet in S3) or clean. Dirty chunks are never evicted;
//! clean ones are evicted least-recently-used first, optionally spilling to a
//! local directory (an SSD) instead of being dropped.

use crate::proto::ChunkId;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Memory given back by chunks whose last reference went, waiting to be
/// kept as spares (see [`ChunkData`]).
type Returned = Mutex<Vec<Vec<u8>>>;

/// A chunk's bytes as the store holds and lends them. When the last
/// reference goes (the store dropped the chunk, and no GET reply, upload or
/// hand-over still sends it), the memory goes back to the store, which
/// keeps it mapped for the next incoming chunk while the budget has room:
/// whoever holds a chunk last, its memory is not freed to be faulted in
/// again by the next write burst.
pub struct ChunkData {
    bytes: Vec<u8>,
    home: Weak<Returned>,
}

impl ChunkData {
    /// The memory, taken out of the return path.
    fn into_vec(mut self) -> Vec<u8> {
        self.home = Weak::new();
        std::mem::take(&mut self.bytes)
    }
}

impl std::ops::Deref for ChunkData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ChunkData {
    fn drop(&mut self) {
        // Only the returned list's own lock is taken here: a chunk may go
        // while the store's lock is held.
        if let Some(home) = self.home.upgrade() {
            home.lock().push(std::mem::take(&mut self.bytes));
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Memory budget for chunk data, bytes.
    pub capacity: u64,
    /// Where clean chunks go when evicted from memory (None: dropped).
    pub spill_dir: Option<PathBuf>,
    /// Byte budget of the spill directory.
    pub spill_capacity: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PutError {
    #[error("node full: {used} of {capacity} bytes hold dirty chunks that cannot be evicted")]
    Full { used: u64, capacity: u64 },
}

struct Entry {
    data: Arc<ChunkData>,
    dirty: bool,
    /// When the chunk was stored dirty (for orphan detection).
    stored: Instant,
    /// LRU stamp (higher = more recent).
    stamp: u64,
}

#[derive(Default)]
struct Inner {
    mem: HashMap<ChunkId, Entry>,
    /// stamp -> chunk for clean chunks in memory (eviction order).
    lru: BTreeMap<u64, ChunkId>,
    used: u64,
    dirty_bytes: u64,
    next_stamp: u64,
    spilled: HashMap<ChunkId, u64>,
    spill_used: u64,
    spare: Spare,
    /// When the last dirty chunk (a write) arrived.
    last_dirty_put: Option<Instant>,
}

/// Memory for incoming chunks of one size (the file system's chunk size),
/// already mapped: the memory of chunks removed from the store, and the
/// budget faulted in ahead of a burst ([`ChunkStore::prefault`]); see
/// [`crate::spare`]. Spares count against the memory budget.
#[derive(Default)]
struct Spare {
    size: usize,
    bufs: Vec<Vec<u8>>,
}

impl Spare {
    fn bytes(&self) -> u64 {
        (self.size * self.bufs.len()) as u64
    }
}

impl Inner {
    /// Memory in use or kept spare: what the budget bounds.
    fn held(&self) -> u64 {
        self.used + self.spare.bytes()
    }

    /// Keeps `v`'s memory as a spare buffer if it is the size spares are
    /// kept at and fits the budget; whether it was kept.
    fn keep_spare(&mut self, v: Vec<u8>, capacity: u64) -> bool {
        let keep = v.len() == self.spare.size && self.held() + v.len() as u64 <= capacity;
        if keep {
            self.spare.bufs.push(v);
        }
        keep
    }

    /// Evicts clean chunks, least recently used first, until `len` more
    /// bytes fit beside the memory in use, into `evicted` (to spill and
    /// free). `false` when they do not fit with every clean chunk gone.
    fn evict_for(&mut self, len: u64, capacity: u64, evicted: &mut Vec<(ChunkId, Arc<ChunkData>)>) -> bool {
        while self.used + len > capacity {
            let Some((&stamp, &victim)) = self.lru.iter().next() else { return false };
            self.lru.remove(&stamp);
            if let Some(e) = self.mem.remove(&victim) {
                self.used -= e.data.len() as u64;
                evicted.push((victim, e.data));
            }
        }
        true
    }

    /// Drops spare buffers until memory in use plus spares fits the budget.
    fn trim_spare(&mut self, capacity: u64) {
        while self.held() > capacity && self.spare.bufs.pop().is_some() {}
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreStat {
    pub chunks: u64,
    pub used_bytes: u64,
    pub dirty_chunks: u64,
    pub dirty_bytes: u64,
    pub capacity_bytes: u64,
    pub spilled_chunks: u64,
    pub spilled_bytes: u64,
    /// Memory mapped and kept for incoming chunks (not in `used_bytes`).
    #[serde(default)]
    pub spare_bytes: u64,
    /// The node's S3 traffic so far (filled in by the node, not the store).
    #[serde(default)]
    pub s3_puts: u64,
    #[serde(default)]
    pub s3_gets: u64,
    #[serde(default)]
    pub s3_bytes_up: u64,
    #[serde(default)]
    pub s3_bytes_down: u64,
}

pub struct ChunkStore {
    cfg: StoreConfig,
    inner: Mutex<Inner>,
    returned: Arc<Returned>,
}

impl ChunkStore {
    pub fn new(cfg: StoreConfig) -> ChunkStore {
        if let Some(d) = &cfg.spill_dir {
            if let Err(e) = std::fs::create_dir_all(d) {
                tracing::warn!("spill directory {}: {e}; spilling disabled", d.display());
            }
        }
        ChunkStore { cfg, inner: Mutex::new(Inner::default()), returned: Arc::default() }
    }

    /// `v` as a chunk's bytes whose memory comes back here.
    fn chunk_data(&self, v: Vec<u8>) -> ChunkData {
        ChunkData { bytes: v, home: Arc::downgrade(&self.returned) }
    }

    /// Keeps the memory of chunks whose last reference went as spares,
    /// where they fit the budget (the rest is freed).
    fn reclaim(&self, inner: &mut Inner) {
        let back = std::mem::take(&mut *self.returned.lock());
        for v in back {
            inner.keep_spare(v, self.cfg.capacity);
        }
    }

    fn spill_path(&self, c: &ChunkId) -> Option<PathBuf> {
        self.cfg.spill_dir.as_ref().map(|d| d.join(format!("{}_{}_{}", c.ino, c.idx, c.ver)))
    }

    /// Stores a chunk version. A dirty put that does not fit after evicting every
    /// clean chunk fails with `Full` (the client then tries another node).
    pub fn put(&self, chunk: ChunkId, data: Vec<u8>, dirty: bool) -> Result<(), PutError> {
        let mut evicted = Vec::new();
        let r = self.insert(chunk, data, dirty, &mut evicted);
        self.spill_and_free(evicted, None);
        r
    }

    fn insert(&self, chunk: ChunkId, data: Vec<u8>, dirty: bool, evicted: &mut Vec<(ChunkId, Arc<ChunkData>)>) -> Result<(), PutError> {
        let len = data.len() as u64;
        let now = Instant::now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if dirty {
            inner.last_dirty_put = Some(now);
        }
        if let Some(old) = inner.mem.get(&chunk) {
            // Same version again (a retried put): keep the stronger flag.
            if old.dirty || !dirty {
                return Ok(());
            }
        }
        self.remove_locked(inner, &chunk);
        if !inner.evict_for(len, self.cfg.capacity, evicted) {
            if dirty {
                return Err(PutError::Full { used: inner.used, capacity: self.cfg.capacity });
            }
            // A clean chunk that does not fit is simply not cached.
            return Ok(());
        }
        inner.next_stamp += 1;
        let stamp = inner.next_stamp;
        if !dirty {
            inner.lru.insert(stamp, chunk);
        } else {
            inner.dirty_bytes += len;
        }
        inner.used += len;
        inner.mem.insert(chunk, Entry { data: Arc::new(self.chunk_data(data)), dirty, stored: now, stamp });
        inner.trim_spare(self.cfg.capacity);
        Ok(())
    }

    /// Spills evicted chunks, then lets go of them: the first one of
    /// `take` bytes that nothing else holds is returned, the others come
    /// back as spares (at once, or when their last holder lets go).
    fn spill_and_free(&self, evicted: Vec<(ChunkId, Arc<ChunkData>)>, take: Option<usize>) -> Option<Vec<u8>> {
        let mut taken = None;
        for (c, data) in evicted {
            self.spill(c, &data);
            if taken.is_none() && take == Some(data.len()) {
                taken = Arc::try_unwrap(data).ok().map(ChunkData::into_vec);
            }
        }
        self.reclaim(&mut self.inner.lock());
        taken
    }

    fn spill(&self, c: ChunkId, data: &[u8]) {
        let Some(path) = self.spill_path(&c) else { return };
        let len = data.len() as u64;
        {
            let g = self.inner.lock();
            if g.spill_used + len > self.cfg.spill_capacity {
                return;
            }
        }
        // Other users of the machine may not read them.
        let written = {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path).and_then(|mut f| f.write_all(data))
        };
        match written {
            Ok(()) => {
                let mut g = self.inner.lock();
                g.spill_used += len;
                g.spilled.insert(c, len);
            }
            Err(e) => tracing::warn!("spilling chunk {} to {}: {e}", c.member(), path.display()),
        }
    }

    fn remove_locked(&self, inner: &mut Inner, chunk: &ChunkId) {
        if let Some(e) = inner.mem.remove(chunk) {
            let len = e.data.len() as u64;
            inner.used -= len;
            if e.dirty {
                inner.dirty_bytes -= len;
            } else {
                inner.lru.remove(&e.stamp);
            }
            // Its memory comes back once nothing else holds it (no reply or
            // upload in flight): now, or when the last holder lets go.
            drop(e.data);
            self.reclaim(inner);
        }
    }

    /// A buffer for an incoming chunk of `n` bytes (the read overwrites all
    /// its old bytes): a spare one of that size; when the store is full, the
    /// memory of the least recent clean chunk, which the put would evict
    /// anyway; else a new one.
    pub fn buffer(&self, n: usize) -> Vec<u8> {
        let mut evicted = Vec::new();
        {
            let mut g = self.inner.lock();
            self.reclaim(&mut g);
            if g.spare.bufs.is_empty() {
                // Keep what comes back at the size chunks arrive in.
                g.spare.size = n;
            }
            if g.spare.size == n {
                if let Some(b) = g.spare.bufs.pop() {
                    return b;
                }
            }
            g.evict_for(n as u64, self.cfg.capacity, &mut evicted);
        }
        self.spill_and_free(evicted, Some(n)).unwrap_or_else(|| vec![0u8; n])
    }

    /// Faults in the budget not in use as spare buffers for chunks of
    /// `size` bytes, so that a burst's chunks land in mapped memory: this
    /// moves the page faults from the burst to the node's idle start.
    /// Returns the bytes faulted in.
    pub fn prefault(&self, size: usize) -> u64 {
        if size == 0 {
            return 0;
        }
        {
            let mut g = self.inner.lock();
            if g.spare.size != size {
                g.spare = Spare { size, bufs: Vec::new() };
            }
        }
        let mut done = 0;
        while self.prefault_one(size) {
            done += size as u64;
        }
        done
    }

    /// Maps one spare buffer of `size` bytes; `false` when the budget is
    /// full, or when spares are no longer kept at that size (a chunk of
    /// another size arrived while the spares ran out: see [`Self::buffer`]).
    fn prefault_one(&self, size: usize) -> bool {
        {
            let mut g = self.inner.lock();
            self.reclaim(&mut g);
            if g.held() + size as u64 > self.cfg.capacity {
                return false;
            }
        }
        let v = crate::spare::faulted_in(size);
        self.inner.lock().keep_spare(v, self.cfg.capacity)
    }

    pub fn get(&self, chunk: &ChunkId) -> Option<Arc<ChunkData>> {
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.next_stamp += 1;
            let stamp = inner.next_stamp;
            if let Some(e) = inner.mem.get_mut(chunk) {
                if !e.dirty {
                    inner.lru.remove(&e.stamp);
                    inner.lru.insert(stamp, *chunk);
                }
                e.stamp = stamp;
                return Some(e.data.clone());
            }
            if !inner.spilled.contains_key(chunk) {
                return None;
            }
        }
        let path = self.spill_path(chunk)?;
        std::fs::read(path).ok().map(|v| Arc::new(self.chunk_data(v)))
    }

    pub fn delete(&self, chunk: &ChunkId) {
        let spilled = {
            let mut g = self.inner.lock();
            self.remove_locked(&mut g, chunk);
            let s = g.spilled.remove(chunk);
            if let Some(len) = s {
                g.spill_used -= len;
            }
            s.is_some()
        };
        if spilled {
            if let Some(p) = self.spill_path(chunk) {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// When a dirty chunk (a write) last came in, taken or refused as full.
    pub fn last_dirty_put(&self) -> Option<Instant> {
        self.inner.lock().last_dirty_put
    }

    /// The chunk is now in S3: it may be evicted from here on.
    pub fn mark_clean(&self, chunk: &ChunkId) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if let Some(e) = inner.mem.get_mut(chunk) {
            if e.dirty {
                e.dirty = false;
                inner.dirty_bytes -= e.data.len() as u64;
                inner.lru.insert(e.stamp, *chunk);
            }
        }
    }

    pub fn is_dirty(&self, chunk: &ChunkId) -> bool {
        self.inner.lock().mem.get(chunk).is_some_and(|e| e.dirty)
    }

    /// Dirty chunks stored longer ago than `age` (candidates for orphan checks).
    pub fn dirty_older_than(&self, age: std::time::Duration) -> Vec<ChunkId> {
        let g = self.inner.lock();
        g.mem.iter().filter(|(_, e)| e.dirty && e.stored.elapsed() >= age).map(|(c, _)| *c).collect()
    }

    /// Every dirty chunk with its length, oldest stored first.
    pub fn dirty_chunks(&self) -> Vec<(ChunkId, u64, std::time::Duration)> {
        let g = self.inner.lock();
        let mut v: Vec<_> = g.mem.iter().filter(|(_, e)| e.dirty).map(|(c, e)| (*c, e.data.len() as u64, e.stored.elapsed())).collect();
        v.sort_by(|a, b| b.2.cmp(&a.2));
        v
    }

    /// Every chunk version held, in memory or spilled.
    pub fn chunks(&self) -> Vec<ChunkId> {
        let g = self.inner.lock();
        g.mem.keys().chain(g.spilled.keys()).copied().collect()
    }

    /// Every chunk version held (in memory or spilled) with its length.
    pub fn list(&self) -> Vec<(ChunkId, u64)> {
        let g = self.inner.lock();
        let mem = g.mem.iter().map(|(c, e)| (*c, e.data.len() as u64));
        mem.chain(g.spilled.iter().map(|(c, l)| (*c, *l))).collect()
    }

    /// Holds this version (in memory or spilled)?
    pub fn has(&self, chunk: &ChunkId) -> bool {
        let g = self.inner.lock();
        g.mem.contains_key(chunk) || g.spilled.contains_key(chunk)
    }

    pub fn stat(&self) -> StoreStat {
        let mut g = self.inner.lock();
        self.reclaim(&mut g);
        StoreStat {
            chunks: g.mem.len() as u64,
            used_bytes: g.used,
            dirty_chunks: g.mem.values().filter(|e| e.dirty).count() as u64,
            dirty_bytes: g.dirty_bytes,
            capacity_bytes: self.cfg.capacity,
            spilled_chunks: g.spilled.len() as u64,
            spilled_bytes: g.spill_used,
            spare_bytes: g.spare.bytes(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(i: u64) -> ChunkId {
        ChunkId { ino: 1, idx: i, ver: 1 }
    }

    fn store(capacity: u64, spill: Option<PathBuf>) -> ChunkStore {
        ChunkStore::new(StoreConfig { capacity, spill_dir: spill, spill_capacity: 1 << 20 })
    }

    // Issue 38 item 9: spilled chunks are other users' file data: 0600,
    // whatever the umask (the usual 022 would make them 0644).
    #[test]
    fn spilled_chunks_are_readable_by_the_node_only() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: umask only sets the process file-creation mask.
        unsafe { libc::umask(0o022) };
        let d = tempfile::tempdir().unwrap();
        let s = store(100, Some(d.path().to_path_buf()));
        s.put(c(0), vec![7; 60], false).unwrap();
        s.put(c(1), vec![8; 60], false).unwrap(); // evicts c(0) to the spill directory
        let files: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "one chunk spilled");
        assert_eq!(files[0].metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(s.get(&c(0)).unwrap()[0], 7, "read back from the spill");
    }

    #[test]
    fn dirty_chunks_are_never_evicted_and_full_is_reported() {
        let s = store(100, None);
        s.put(c(0), vec![1; 60], true).unwrap();
        assert_eq!(s.put(c(1), vec![2; 60], true), Err(PutError::Full { used: 60, capacity: 100 }));
        assert_eq!(s.get(&c(0)).unwrap()[0], 1);
    }

    #[test]
    fn clean_chunks_make_room_lru_first() {
        let s = store(100, None);
        s.put(c(0), vec![0; 40], false).unwrap();
        s.put(c(1), vec![1; 40], false).unwrap();
        s.get(&c(0)); // c(1) is now least recent
        s.put(c(2), vec![2; 40], true).unwrap();
        assert!(s.get(&c(1)).is_none());
        assert!(s.get(&c(0)).is_some());
        s.mark_clean(&c(2));
        s.put(c(3), vec![3; 90], true).unwrap();
        assert_eq!(s.stat().dirty_bytes, 90);
    }

    #[test]
    fn evicted_clean_chunks_spill_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let s = store(50, Some(d.path().to_path_buf()));
        s.put(c(0), vec![7; 40], false).unwrap();
        s.put(c(1), vec![8; 40], false).unwrap();
        assert_eq!(s.stat().spilled_chunks, 1);
        assert_eq!(s.get(&c(0)).unwrap()[..], [7; 40]);
        s.delete(&c(0));
        assert!(s.get(&c(0)).is_none());
    }

    #[test]
    fn prefault_maps_the_budget_not_in_use_and_puts_draw_on_it() {
        let s = store(100, None);
        s.put(c(9), vec![9; 30], true).unwrap();
        assert_eq!(s.prefault(20), 60, "3 buffers of 20 fit beside 30 used");
        assert_eq!(s.stat().spare_bytes, 60);
        let b = s.buffer(20);
        assert_eq!(b.len(), 20);
        assert_eq!(s.stat().spare_bytes, 40);
        s.put(c(0), b, true).unwrap();
        assert_eq!((s.stat().used_bytes, s.stat().spare_bytes), (50, 40));
        // A chunk of another size gets new memory and leaves the spares alone.
        assert_eq!(s.buffer(7).len(), 7);
        assert_eq!(s.stat().spare_bytes, 40);
        assert_eq!(s.prefault(0), 0, "no chunk size, nothing to map");
    }

    #[test]
    fn prefault_never_keeps_a_buffer_of_a_size_other_than_the_spares() {
        let s = store(20, None);
        assert_eq!(s.prefault(20), 20, "one buffer of 20 fits");
        assert_eq!(s.buffer(20).len(), 20, "the one spare");
        // The spares are out, so a 7-byte chunk makes 7 bytes the spare size
        // while a prefault of 20-byte buffers is under way.
        assert_eq!(s.buffer(7).len(), 7);
        assert!(!s.prefault_one(20), "the prefault stops");
        assert_eq!(s.stat().spare_bytes, 0);
        assert_eq!(s.buffer(7).len(), 7, "a 7-byte chunk never gets a 20-byte buffer");
    }

    #[test]
    fn a_removed_chunks_memory_serves_the_next_chunk_of_its_size() {
        let s = store(100, None);
        let b = s.buffer(40);
        let p = b.as_ptr();
        s.put(c(0), b, true).unwrap();
        s.delete(&c(0));
        assert_eq!(s.stat().spare_bytes, 40);
        let again = s.buffer(40);
        assert_eq!(again.as_ptr(), p);
    }

    #[test]
    fn a_chunk_still_being_sent_is_not_reused_until_its_sender_lets_go() {
        let s = store(100, None);
        let b = s.buffer(40);
        let p = b.as_ptr();
        s.put(c(0), b, true).unwrap();
        let sending = s.get(&c(0)).unwrap();
        s.delete(&c(0));
        assert_eq!(s.stat().spare_bytes, 0);
        assert_eq!(sending.len(), 40);
        drop(sending);
        assert_eq!(s.stat().spare_bytes, 40, "the memory came back with the last reference");
        let reused = s.buffer(40);
        assert_eq!(reused.as_ptr(), p, "the next buffer is that memory");
    }

    #[test]
    fn when_full_the_least_recent_clean_chunk_gives_its_memory_to_the_next() {
        let s = store(100, None);
        let b = s.buffer(40);
        let p = b.as_ptr();
        s.put(c(0), b, false).unwrap();
        s.put(c(1), s.buffer(40), false).unwrap();
        let b = s.buffer(40);
        assert_eq!(b.as_ptr(), p, "c(0), the least recent, made room");
        assert!(s.get(&c(0)).is_none() && s.get(&c(1)).is_some());
        s.put(c(2), b, true).unwrap();
        let st = s.stat();
        assert_eq!((st.used_bytes, st.spare_bytes), (80, 0));
    }

    #[test]
    fn a_chunk_evicted_for_room_still_spills() {
        let d = tempfile::tempdir().unwrap();
        let s = store(50, Some(d.path().to_path_buf()));
        s.put(c(0), vec![7; 40], false).unwrap();
        let mut b = s.buffer(40);
        b.fill(8);
        s.put(c(1), b, true).unwrap();
        assert_eq!(s.get(&c(0)).unwrap()[..], [7; 40], "read back from the spill directory");
        assert_eq!(s.get(&c(1)).unwrap()[..], [8; 40]);
    }

    proptest::proptest! {
        /// Whatever the order of puts, deletes, evictions, prefaults and
        /// chunks lent out (as to a GET reply or an upload) and given back,
        /// memory in use plus spare memory stays within the budget, and the
        /// bytes of a chunk held by the store or lent out never change (no
        /// memory is reused while anything still holds it). A chunk version
        /// has one length and content.
        #[test]
        fn spare_memory_stays_in_the_budget_and_held_bytes_never_change(ops in proptest::collection::vec((0u8..6, 0u64..8, proptest::bool::ANY, proptest::sample::select(vec![10usize, 20, 20, 20])), 1..80)) {
            let s = store(100, None);
            let mut held: HashMap<ChunkId, u8> = HashMap::new();
            let mut lent: Vec<(Arc<ChunkData>, u8)> = Vec::new();
            let len_of = |i: u64| if i % 3 == 0 { 10 } else { 20 };
            for (op, i, dirty, prefault_len) in ops {
                match op {
                    0 | 1 => {
                        let mut b = s.buffer(len_of(i));
                        b.fill(i as u8 + 1);
                        if s.put(c(i), b, dirty).is_ok() {
                            held.insert(c(i), i as u8 + 1);
                        }
                    }
                    2 => {
                        s.delete(&c(i));
                        held.remove(&c(i));
                    }
                    3 => {
                        s.prefault(prefault_len);
                    }
                    4 => {
                        if let Some(d) = s.get(&c(i)) {
                            lent.push((d, i as u8 + 1));
                        }
                    }
                    _ => lent.clear(),
                }
                let st = s.stat();
                proptest::prop_assert!(st.used_bytes + st.spare_bytes <= 100, "{st:?}");
                for (ch, v) in &held {
                    if let Some(d) = s.get(ch) {
                        proptest::prop_assert!(d.iter().all(|x| x == v));
                    }
                }
                for (d, v) in &lent {
                    proptest::prop_assert!(d.iter().all(|x| x == v), "a lent chunk's memory was reused");
                }
            }
        }
    }
}
