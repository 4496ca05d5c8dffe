//! An I/O node's chunk store: chunk versions in memory under a byte budget,
//! each flagged dirty (not yet in S3) or clean. Dirty chunks are never evicted;
//! clean ones are evicted least-recently-used first, optionally spilling to a
//! local directory (an SSD) instead of being dropped.

use crate::proto::ChunkId;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    data: Arc<Vec<u8>>,
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
}

impl ChunkStore {
    pub fn new(cfg: StoreConfig) -> ChunkStore {
        if let Some(d) = &cfg.spill_dir {
            if let Err(e) = std::fs::create_dir_all(d) {
                tracing::warn!("spill directory {}: {e}; spilling disabled", d.display());
            }
        }
        ChunkStore { cfg, inner: Mutex::new(Inner::default()) }
    }

    fn spill_path(&self, c: &ChunkId) -> Option<PathBuf> {
        self.cfg.spill_dir.as_ref().map(|d| d.join(format!("{}_{}_{}", c.ino, c.idx, c.ver)))
    }

    /// Stores a chunk version. A dirty put that does not fit after evicting every
    /// clean chunk fails with `Full` (the client then tries another node).
    pub fn put(&self, chunk: ChunkId, data: Vec<u8>, dirty: bool) -> Result<(), PutError> {
        let len = data.len() as u64;
        let mut evicted = Vec::new();
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            if let Some(old) = inner.mem.get(&chunk) {
                // Same version again (a retried put): keep the stronger flag.
                if old.dirty || !dirty {
                    return Ok(());
                }
            }
            Self::remove_locked(inner, &chunk);
            while inner.used + len > self.cfg.capacity {
                let Some((&stamp, &victim)) = inner.lru.iter().next() else {
                    if dirty {
                        return Err(PutError::Full { used: inner.used, capacity: self.cfg.capacity });
                    }
                    // A clean chunk that does not fit is simply not cached.
                    return Ok(());
                };
                inner.lru.remove(&stamp);
                if let Some(e) = inner.mem.remove(&victim) {
                    inner.used -= e.data.len() as u64;
                    evicted.push((victim, e.data));
                }
            }
            inner.next_stamp += 1;
            let stamp = inner.next_stamp;
            if !dirty {
                inner.lru.insert(stamp, chunk);
            } else {
                inner.dirty_bytes += len;
            }
            inner.used += len;
            inner.mem.insert(chunk, Entry { data: Arc::new(data), dirty, stored: Instant::now(), stamp });
        }
        for (c, data) in evicted {
            self.spill(c, &data);
        }
        Ok(())
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
        match std::fs::write(&path, data) {
            Ok(()) => {
                let mut g = self.inner.lock();
                g.spill_used += len;
                g.spilled.insert(c, len);
            }
            Err(e) => tracing::warn!("spilling chunk {} to {}: {e}", c.member(), path.display()),
        }
    }

    fn remove_locked(inner: &mut Inner, chunk: &ChunkId) {
        if let Some(e) = inner.mem.remove(chunk) {
            let len = e.data.len() as u64;
            inner.used -= len;
            if e.dirty {
                inner.dirty_bytes -= len;
            } else {
                inner.lru.remove(&e.stamp);
            }
        }
    }

    pub fn get(&self, chunk: &ChunkId) -> Option<Arc<Vec<u8>>> {
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
        std::fs::read(path).ok().map(Arc::new)
    }

    pub fn delete(&self, chunk: &ChunkId) {
        let spilled = {
            let mut g = self.inner.lock();
            Self::remove_locked(&mut g, chunk);
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
        let g = self.inner.lock();
        StoreStat {
            chunks: g.mem.len() as u64,
            used_bytes: g.used,
            dirty_chunks: g.mem.values().filter(|e| e.dirty).count() as u64,
            dirty_bytes: g.dirty_bytes,
            capacity_bytes: self.cfg.capacity,
            spilled_chunks: g.spilled.len() as u64,
            spilled_bytes: g.spill_used,
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
        assert_eq!(*s.get(&c(0)).unwrap(), vec![7; 40]);
        s.delete(&c(0));
        assert!(s.get(&c(0)).is_none());
    }
}
