//! Elastic cache: a block-granular read/write cache of a slow backing device on an
//! optional, attachable fast cache device.
//!
//! Data path: requests are split into blocks (64 KiB by default). Each block has a
//! striped lock held for the whole of its I/O, so the mapping of a block is stable
//! while it is being read, written, flushed or evicted; the mapping itself sits
//! behind one short-held mutex (map first, then I/O outside it).
//!
//! Durability (docs/cache.md): only the dirty set `(block, slot)` is persisted, in
//! two checksummed alternating copies ([`meta`]). Two rules keep a restart exact:
//! - R1: a slot is given to another block only once the last *durable* metadata no
//!   longer names it (slots freed by flushing become reusable after a commit);
//! - commit order: snapshot the dirty set, flush backing, flush cache data, write
//!   the older metadata copy, flush the cache device.
//!
//! A FLUSH is a commit; a FUA write is a write followed by a commit.
//!
//! Dynamic writeback: in [`Phase::Boost`] (phase 1) dirty blocks are flushed only
//! when the user has been idle for `idle_gap` (spare backing bandwidth) or when
//! allocation must evict; in [`Phase::Drain`] (phase 2) the flusher runs flat out,
//! new writes bypass the cache (a clean cached copy is invalidated, a dirty one is
//! updated in place so no stale read is possible) and reads may still hit.

pub mod fence;
pub mod meta;
mod rescue;

use crate::clock::Clock;
use crate::dev::{check_range, BlockDev, Caps};
use crate::error::{BlockError, Result};
use meta::{decode, Layout, Meta};
pub use rescue::RescueInfo;
use rescue::Rescue;
use parking_lot::{Mutex, MutexGuard, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

const STRIPES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Writes land in the cache, dirty, and are flushed back later.
    WriteBack,
    /// Writes go to backing and update a cached copy.
    WriteThrough,
    /// Writes go to backing and invalidate a clean cached copy; reads fill.
    WriteAround,
    /// Nothing new enters the cache; dirty blocks are still served and flushed.
    PassThrough,
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "writeback" => CacheMode::WriteBack,
            "writethrough" => CacheMode::WriteThrough,
            "writearound" => CacheMode::WriteAround,
            "passthrough" => CacheMode::PassThrough,
            _ => return Err(format!("unknown cache mode {s:?} (writeback, writethrough, writearound, passthrough)")),
        })
    }
}

/// Dynamic writeback phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Phase 1: application I/O first; flush only when idle or to evict.
    Boost,
    /// Phase 2: flush at full speed; writes bypass the cache.
    Drain,
}

#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Cache block size in bytes (power of two, >= 4096).
    pub block_size: u64,
    pub mode: CacheMode,
    /// In writeback mode, a sequential write run longer than this bypasses the cache.
    pub seq_bypass: Option<u64>,
    /// Phase 1 flushes only after the user has been idle this long.
    pub idle_gap: Duration,
    /// Blocks flushed per flush step (one metadata commit each).
    pub flush_batch: usize,
    /// Durable record of failed cache devices and of lost writes, honoured on
    /// restart ([`fence`]); `None`: fenced only by clearing the failed device's
    /// metadata, which a dead device may refuse.
    pub fences: Option<Arc<dyn fence::FenceStore>>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            block_size: 64 * 1024,
            mode: CacheMode::WriteBack,
            seq_bypass: None,
            idle_gap: Duration::from_millis(200),
            flush_batch: 64,
            fences: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache still holds {dirty_bytes} dirty bytes; drain it before detaching")]
    NotClean { dirty_bytes: u64 },
    #[error("no cache device is attached")]
    NotAttached,
    #[error("a cache device is already attached")]
    AlreadyAttached,
    #[error("cache device of {0} bytes is too small for one block plus metadata")]
    TooSmall(u64),
    #[error("cache device holds dirty data of a cache (seq {0}); open it for recovery instead")]
    HoldsDirtyData(u64),
    #[error("cache device {id:#x} failed earlier and is fenced: it is never reopened (delete it)")]
    Fenced { id: u64 },
    #[error("{blocks} blocks of a failed cache device are not yet safe on backing; no new cache until they are")]
    RescuePending { blocks: u64 },
    #[error(transparent)]
    Block(#[from] BlockError),
}

/// A point-in-time view of the cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheStats {
    pub attached: bool,
    pub mode: Option<CacheMode>,
    pub phase: Option<Phase>,
    pub block_size: u64,
    /// Data capacity of the attached cache device.
    pub cache_bytes: u64,
    pub used_bytes: u64,
    /// Most bytes mapped at once since attach (what the burst actually used).
    pub used_high_bytes: u64,
    pub dirty_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Dirty bytes flushed only because allocation needed room ("evicted early").
    pub evicted_dirty_bytes: u64,
    pub flushed_bytes: u64,
    pub bypassed_bytes: u64,
    pub commits: u64,
    /// Blocks whose only copy is on a failed cache device that cannot be read
    /// (reads of them fail with EIO until rewritten or the loss is acknowledged).
    pub lost_blocks: u64,
    /// Blocks of failed cache devices not yet safe on backing (lost ones included).
    pub rescue_pending_blocks: u64,
    /// Why every FLUSH fails until the loss is acknowledged, if it does.
    pub loss: Option<String>,
    /// Measured flush throughput (bytes/s, smoothed over flush steps): how fast
    /// dirty data drains while the flusher runs.
    pub drain_rate_bytes_per_s: Option<f64>,
    /// Time until clean at that rate (0 when clean).
    pub drain_eta_s: Option<f64>,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    evicted_dirty_bytes: AtomicU64,
    flushed_bytes: AtomicU64,
    bypassed_bytes: AtomicU64,
    commits: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    block: Option<u64>,
    dirty: bool,
    /// Block this slot is listed under in the last durable metadata, or in the
    /// snapshot of a commit in flight (which may become durable any moment).
    persisted: Option<u64>,
    /// Written back to backing, but the backing flush that makes it durable has
    /// not succeeded yet: the slot keeps the only durable copy.
    unsynced: bool,
    /// Bumped by every write and every write-back: a commit clears `unsynced`
    /// only if unchanged since its snapshot (a later write-back is not covered
    /// by its flush, even of a block that was already unsynced then).
    gen: u64,
    /// On the free list: a slot is never pushed twice (two blocks would share it).
    free: bool,
    tick: u64,
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    map: HashMap<u64, u32>,
    free: Vec<u32>,
    dirty: BTreeSet<u64>,
    lru: BTreeMap<u64, u32>,
    tick: u64,
    used_high: u32,
    flush_cursor: u64,
    /// Failed backing flushes so far: a write-back that saw one happen while
    /// it was in progress may have been dropped by it, so it stays dirty.
    failed_flushes: u64,
}

impl State {
    fn touch(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        self.lru.remove(&s.tick);
        self.tick += 1;
        s.tick = self.tick;
        self.lru.insert(self.tick, slot);
    }

    fn map_slot(&mut self, slot: u32, block: u64, dirty: bool) {
        // Hard check: a slot shared by two blocks silently corrupts both.
        let s = &self.slots[slot as usize];
        assert!(s.block.is_none() && !s.free, "cache slot {slot} handed out twice");
        self.slots[slot as usize].block = Some(block);
        self.slots[slot as usize].dirty = dirty;
        self.map.insert(block, slot);
        if dirty {
            self.dirty.insert(block);
        }
        self.touch(slot);
        self.used_high = self.used_high.max(self.map.len() as u32);
    }

    /// Forget a clean block; its slot is free at once unless metadata still names it.
    /// A dirty block is never forgotten (its slot holds the only copy): refused
    /// with `None`, in release builds too.
    fn unmap(&mut self, block: u64, reuse_now: bool) -> Option<u32> {
        let slot = *self.map.get(&block)?;
        if self.slots[slot as usize].dirty {
            tracing::error!(block, slot, "refused to unmap a dirty cache block (bug: the caller saw it clean)");
            return None;
        }
        self.map.remove(&block);
        let s = &mut self.slots[slot as usize];
        s.block = None;
        self.lru.remove(&s.tick);
        if s.persisted.is_none() && !s.unsynced && !reuse_now {
            self.push_free(slot);
        }
        Some(slot)
    }

    /// Put an unmapped slot on the free list; a second push is ignored.
    fn push_free(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.block.is_none() && !s.free {
            s.free = true;
            self.free.push(slot);
        }
    }

    fn pop_free(&mut self) -> Option<u32> {
        let slot = self.free.pop()?;
        self.slots[slot as usize].free = false;
        Some(slot)
    }

    fn set_dirty(&mut self, slot: u32, block: u64) {
        self.slots[slot as usize].dirty = true;
        self.slots[slot as usize].gen += 1;
        self.dirty.insert(block);
    }

    /// Every dirty block has a slot (a commit persists them): checked before
    /// each commit, so a broken invariant fails the FLUSH instead of panicking.
    fn check_dirty_mapped(&self) -> std::result::Result<(), String> {
        match self.dirty.iter().find(|b| !self.map.contains_key(b)) {
            Some(b) => {
                tracing::error!(block = b, "cache state corrupt: a dirty block has no slot");
                Err(format!("cache state corrupt: dirty block {b} has no slot; refusing to commit"))
            }
            None => Ok(()),
        }
    }

    /// The invariants every operation keeps; a description of the first broken one.
    fn check(&self) -> std::result::Result<(), String> {
        for (&block, &slot) in &self.map {
            let s = self.slots.get(slot as usize).ok_or(format!("block {block} mapped to slot {slot} out of range"))?;
            if s.block != Some(block) || s.free {
                return Err(format!("block {block} maps to slot {slot}, which holds {:?} (free: {})", s.block, s.free));
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            match s.block {
                Some(b) if self.map.get(&b) != Some(&(i as u32)) => return Err(format!("slot {i} holds block {b}, which is not mapped to it")),
                Some(b) if s.dirty != self.dirty.contains(&b) => return Err(format!("slot {i} (block {b}) dirty flag {} disagrees with the dirty set", s.dirty)),
                None if s.dirty => return Err(format!("slot {i} is dirty but holds no block")),
                _ => {}
            }
        }
        if let Some(b) = self.dirty.iter().find(|b| !self.map.contains_key(b)) {
            return Err(format!("dirty block {b} has no slot"));
        }
        let mut seen = std::collections::HashSet::new();
        for &f in &self.free {
            let s = &self.slots[f as usize];
            if !seen.insert(f) || !s.free || s.block.is_some() {
                return Err(format!("free list entry {f} is duplicated, unflagged or in use"));
            }
        }
        if self.slots.iter().filter(|s| s.free).count() != self.free.len() {
            return Err("free flags disagree with the free list".into());
        }
        if self.lru.len() != self.map.len() {
            return Err(format!("{} LRU entries for {} mapped blocks", self.lru.len(), self.map.len()));
        }
        Ok(())
    }

    /// A backing flush failed and may have dropped every write-back pending
    /// on it, including ones made after the commit's snapshot: all of them
    /// are dirty again.
    fn redirty_unsynced(&mut self) {
        self.failed_flushes += 1;
        for i in 0..self.slots.len() {
            let s = self.slots[i];
            if !s.unsynced {
                continue;
            }
            if let Some(b) = s.block {
                self.set_dirty(i as u32, b);
            }
            self.slots[i].unsynced = false;
            if s.block.is_none() && s.persisted.is_none() {
                self.push_free(i as u32);
            }
        }
    }
}

struct CommitState {
    seq: u64,
    newest_copy: usize,
    last: Vec<(u64, u32)>,
}

/// An attached cache device and its mapping.
struct Attached {
    /// Random identity, in its metadata (fences name failed devices by it).
    id: u64,
    /// Who attached it (the elastic controller: the cloud volume id).
    label: String,
    dev: Arc<dyn BlockDev>,
    layout: Layout,
    state: Mutex<State>,
    commit: Mutex<CommitState>,
    /// Flush-rate estimate (bytes/s) for the drain ETA.
    flush_rate: Mutex<Option<f64>>,
}

/// Where an error came from: the cache device triggers a fallback to backing.
enum Fault {
    Cache(BlockError),
    Other(BlockError),
}
type FResult<T> = std::result::Result<T, Fault>;

fn cache_err<T>(r: Result<T>) -> FResult<T> {
    r.map_err(Fault::Cache)
}
fn other_err<T>(r: Result<T>) -> FResult<T> {
    r.map_err(Fault::Other)
}

pub struct ElasticCache {
    backing: Arc<dyn BlockDev>,
    block_size: u64,
    cfg: CacheConfig,
    mode: AtomicU8,
    phase: AtomicU8,
    attached: RwLock<Option<Arc<Attached>>>,
    locks: Vec<Mutex<()>>,
    c: Counters,
    fences: Option<Arc<dyn fence::FenceStore>>,
    /// Failed cache devices whose blocks are not all safe on backing, by cache id.
    rescues: Mutex<BTreeMap<u64, Rescue>>,
    /// `rescues` is not empty (the fast path of every request checks this).
    rescuing: AtomicBool,
    /// Next background rescue retry (clock time) and the backoff after it.
    rescue_retry: Mutex<(Duration, Duration)>,
    /// Acknowledged writes may have been lost: every FLUSH fails until `ack_loss`.
    loss: Mutex<Option<String>>,
    /// `loss` is in the fence record (or there is none).
    loss_recorded: AtomicBool,
    /// Writes straight to backing: started, completed, and completed before
    /// the start of the last successful backing flush (`flush_backing`).
    direct_started: AtomicU64,
    direct_done: AtomicU64,
    direct_synced: AtomicU64,
    /// Serializes backing flushes (their outcomes settle rescue supersedes in order).
    backing_flush: Mutex<()>,
    /// Reads of a rescued block superseded on backing but not yet confirmed
    /// hold it shared; a backing flush holds it exclusive from before it starts
    /// until its outcome is settled. A failed flush may drop the superseding
    /// write at once, while the supersede is voided only after: without this a
    /// read in between returns backing's copy, older than the last FLUSH.
    superseded_reads: RwLock<()>,
    /// Backing flushes that failed and voided a supersede (readers re-check).
    supersedes_voided: AtomicU64,
    clock: Arc<dyn Clock>,
    last_io_ns: AtomicU64,
    seq_run: Mutex<(u64, u64)>,
}

fn mode_from(v: u8) -> CacheMode {
    [CacheMode::WriteBack, CacheMode::WriteThrough, CacheMode::WriteAround, CacheMode::PassThrough][v as usize]
}

/// How one write is placed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Cache,
    Through,
    Around,
}

fn pad_to_4k(mut v: Vec<u8>) -> Vec<u8> {
    v.resize(v.len().div_ceil(4096) * 4096, 0);
    v
}

/// A random, non-zero cache id.
fn new_cache_id() -> u64 {
    rand::random::<u64>() | 1
}

/// Read both metadata copies; the valid one with the highest sequence number.
fn read_newest(dev: &dyn BlockDev, layout: &Layout) -> Result<Option<(usize, Meta)>> {
    let mut best: Option<(usize, Meta)> = None;
    for copy in 0..2 {
        let mut buf = vec![0u8; layout.copy_len as usize];
        dev.read_at(&mut buf, layout.copy_offset(copy))?;
        if let Ok(m) = decode(&buf) {
            if best.as_ref().is_none_or(|(_, b)| m.seq > b.seq) {
                best = Some((copy, m));
            }
        }
    }
    Ok(best)
}

impl ElasticCache {
    /// A cache over `backing`, with no cache device yet.
    pub fn new(backing: Arc<dyn BlockDev>, cfg: CacheConfig, clock: Arc<dyn Clock>) -> Self {
        assert!(cfg.block_size.is_power_of_two() && cfg.block_size >= 4096, "block size");
        let fences = cfg.fences.clone();
        let me = ElasticCache {
            backing,
            block_size: cfg.block_size,
            mode: AtomicU8::new(cfg.mode as u8),
            phase: AtomicU8::new(Phase::Boost as u8),
            cfg,
            attached: RwLock::new(None),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            c: Counters::default(),
            fences,
            rescues: Mutex::new(BTreeMap::new()),
            rescuing: AtomicBool::new(false),
            rescue_retry: Mutex::new((Duration::ZERO, Duration::from_millis(100))),
            loss: Mutex::new(None),
            loss_recorded: AtomicBool::new(true),
            direct_started: AtomicU64::new(0),
            direct_done: AtomicU64::new(0),
            direct_synced: AtomicU64::new(0),
            backing_flush: Mutex::new(()),
            superseded_reads: RwLock::new(()),
            supersedes_voided: AtomicU64::new(0),
            clock,
            last_io_ns: AtomicU64::new(0),
            seq_run: Mutex::new((u64::MAX, 0)),
        };
        me.rescues_from_record();
        me
    }

    /// Restart path: reopen a cache device that may hold dirty blocks. Recovers
    /// exactly the dirty set of the newest valid metadata copy (flushing resumes
    /// with the flusher); a device with no valid copy is formatted empty. A
    /// device the fence record names as failed is never used as a cache again:
    /// fenced (nothing pending), `Err(Fenced)`; with blocks pending, exactly
    /// those are rescued from it and the cache starts detached.
    pub fn open(
        backing: Arc<dyn BlockDev>,
        cache: Arc<dyn BlockDev>,
        cfg: CacheConfig,
        clock: Arc<dyn Clock>,
    ) -> std::result::Result<Self, CacheError> {
        Self::open_as(backing, cache, "", cfg, clock)
    }

    /// [`ElasticCache::open`], recording `label` (who attached the device) for
    /// fences.
    pub fn open_as(
        backing: Arc<dyn BlockDev>,
        cache: Arc<dyn BlockDev>,
        label: &str,
        cfg: CacheConfig,
        clock: Arc<dyn Clock>,
    ) -> std::result::Result<Self, CacheError> {
        let me = Self::new(backing, cfg, clock);
        let layout = me.layout_for(cache.as_ref())?;
        match read_newest(cache.as_ref(), &layout)? {
            None => *me.attached.write() = Some(me.format(cache, layout, 0, label)?),
            Some((copy, m)) => {
                if m.block_size as u64 != me.block_size || m.nslots != layout.nslots || m.backing_size != me.backing.size() {
                    return Err(BlockError::Corrupt(format!(
                        "cache metadata geometry (block {}, {} slots, backing {}) does not match this cache",
                        m.block_size, m.nslots, m.backing_size
                    ))
                    .into());
                }
                let record = me.fences.as_ref().map(|f| f.get()).unwrap_or_default();
                if let Some(f) = record.failed.get(&m.cache_id).filter(|_| m.cache_id != 0) {
                    if f.pending.is_empty() {
                        return Err(CacheError::Fenced { id: m.cache_id });
                    }
                    me.provide_rescue_device(cache)?;
                    return Ok(me);
                }
                let mut st = State { slots: vec![Slot::default(); layout.nslots as usize], ..State::default() };
                for &(block, slot) in &m.entries {
                    st.slots[slot as usize].persisted = Some(block);
                    st.map_slot(slot, block, true);
                }
                (0..layout.nslots).rev().for_each(|s| st.push_free(s));
                tracing::info!(dirty_blocks = m.entries.len(), seq = m.seq, cache_id = m.cache_id, "cache recovered");
                let id = if m.cache_id == 0 { new_cache_id() } else { m.cache_id };
                let att = Arc::new(Attached {
                    id,
                    label: label.to_string(),
                    dev: cache,
                    layout,
                    state: Mutex::new(st),
                    commit: Mutex::new(CommitState { seq: m.seq, newest_copy: copy, last: sorted(m.entries.clone()) }),
                    flush_rate: Mutex::new(None),
                });
                if m.cache_id == 0 {
                    // Metadata from before cache ids: stamp one now, so that a
                    // fence can name this device.
                    let mut c = att.commit.lock();
                    me.write_meta(&att, &mut c, m.entries)?;
                }
                *me.attached.write() = Some(att);
            }
        }
        Ok(me)
    }

    fn layout_for(&self, dev: &dyn BlockDev) -> std::result::Result<Layout, CacheError> {
        Layout::for_device(dev.size(), self.block_size).ok_or(CacheError::TooSmall(dev.size()))
    }

    fn empty_state(&self, layout: &Layout) -> State {
        let mut st = State { slots: vec![Slot::default(); layout.nslots as usize], ..State::default() };
        (0..layout.nslots).rev().for_each(|s| st.push_free(s));
        st
    }

    /// Write an empty table to both copies, newer than anything there.
    fn format(&self, dev: Arc<dyn BlockDev>, layout: Layout, seq0: u64, label: &str) -> Result<Arc<Attached>> {
        let id = new_cache_id();
        let mut m = Meta {
            seq: 0,
            block_size: self.block_size as u32,
            nslots: layout.nslots,
            backing_size: self.backing.size(),
            cache_id: id,
            entries: vec![],
        };
        for copy in 0..2 {
            m.seq = seq0 + 1 + copy as u64;
            dev.write_at(&pad_to_4k(m.encode()), layout.copy_offset(copy), false)?;
            dev.flush()?;
        }
        Ok(Arc::new(Attached {
            id,
            label: label.to_string(),
            dev,
            state: Mutex::new(self.empty_state(&layout)),
            layout,
            commit: Mutex::new(CommitState { seq: m.seq, newest_copy: 1, last: vec![] }),
            flush_rate: Mutex::new(None),
        }))
    }

    /// Attach a new cache device online, atomically w.r.t. I/O. Refuses a device
    /// holding a cache's dirty data (that is [`ElasticCache::open`]'s job), and
    /// any device while blocks of a failed one are not safe on backing.
    pub fn attach(&self, dev: Arc<dyn BlockDev>) -> std::result::Result<(), CacheError> {
        self.attach_as(dev, "")
    }

    /// [`ElasticCache::attach`], recording `label` (who attached the device) for fences.
    pub fn attach_as(&self, dev: Arc<dyn BlockDev>, label: &str) -> std::result::Result<(), CacheError> {
        let layout = self.layout_for(dev.as_ref())?;
        let mut g = self.attached.write();
        if g.is_some() {
            return Err(CacheError::AlreadyAttached);
        }
        if self.rescuing.load(SeqCst) {
            let blocks = self.rescue_info().iter().map(|r| r.pending_blocks).sum();
            return Err(CacheError::RescuePending { blocks });
        }
        let newest = read_newest(dev.as_ref(), &layout)?;
        if let Some((_, m)) = &newest {
            if !m.entries.is_empty() {
                return Err(CacheError::HoldsDirtyData(m.seq));
            }
        }
        *g = Some(self.format(dev, layout, newest.map_or(0, |(_, m)| m.seq), label)?);
        self.phase.store(Phase::Boost as u8, Relaxed);
        tracing::info!(slots = layout.nslots, "cache attached");
        Ok(())
    }

    /// Detach the cache device; only when clean, atomically w.r.t. I/O. The final
    /// commit leaves an empty table behind.
    pub fn detach(&self) -> std::result::Result<Arc<dyn BlockDev>, CacheError> {
        let mut g = self.attached.write();
        let att = g.as_ref().ok_or(CacheError::NotAttached)?.clone();
        let dirty = att.state.lock().dirty.len() as u64;
        if dirty > 0 {
            return Err(CacheError::NotClean { dirty_bytes: dirty * self.block_size });
        }
        self.commit(&att).map_err(|f| match f {
            Fault::Cache(e) | Fault::Other(e) => CacheError::Block(e),
        })?;
        *g = None;
        self.phase.store(Phase::Boost as u8, Relaxed);
        tracing::info!("cache detached");
        Ok(att.dev.clone())
    }

    /// Drain (phase 2) until clean, then detach. For tests and the daemon.
    pub fn drain_and_detach(&self) -> std::result::Result<Arc<dyn BlockDev>, CacheError> {
        self.set_phase(Phase::Drain);
        loop {
            while self.flush_step(usize::MAX)? > 0 {}
            match self.detach() {
                Err(CacheError::NotClean { .. }) => continue,
                r => return r,
            }
        }
    }

    pub fn is_attached(&self) -> bool {
        self.attached.read().is_some()
    }

    pub fn set_mode(&self, mode: CacheMode) {
        self.mode.store(mode as u8, Relaxed);
    }

    pub fn mode(&self) -> CacheMode {
        mode_from(self.mode.load(Relaxed))
    }

    pub fn set_phase(&self, phase: Phase) {
        if self.phase.swap(phase as u8, Relaxed) != phase as u8 {
            tracing::info!(?phase, "cache phase");
        }
    }

    pub fn phase(&self) -> Phase {
        if self.phase.load(Relaxed) == Phase::Drain as u8 {
            Phase::Drain
        } else {
            Phase::Boost
        }
    }

    pub fn backing(&self) -> &Arc<dyn BlockDev> {
        &self.backing
    }

    /// The metadata byte range of the attached device (for fault-injection tests).
    pub fn metadata_range(&self) -> Option<std::ops::Range<u64>> {
        self.attached.read().as_ref().map(|a| a.layout.metadata_range())
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.c;
        let mut s = CacheStats {
            block_size: self.block_size,
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            evicted_dirty_bytes: c.evicted_dirty_bytes.load(Relaxed),
            flushed_bytes: c.flushed_bytes.load(Relaxed),
            bypassed_bytes: c.bypassed_bytes.load(Relaxed),
            commits: c.commits.load(Relaxed),
            loss: self.loss.lock().clone(),
            ..CacheStats::default()
        };
        for r in self.rescue_info() {
            s.lost_blocks += r.unreadable_blocks;
            s.rescue_pending_blocks += r.pending_blocks;
        }
        if let Some(att) = self.attached.read().as_ref() {
            let st = att.state.lock();
            s.attached = true;
            s.mode = Some(self.mode());
            s.phase = Some(self.phase());
            s.cache_bytes = att.layout.nslots as u64 * self.block_size;
            s.used_bytes = st.map.len() as u64 * self.block_size;
            s.used_high_bytes = st.used_high as u64 * self.block_size;
            s.dirty_bytes = st.dirty.len() as u64 * self.block_size;
            s.drain_rate_bytes_per_s = *att.flush_rate.lock();
            s.drain_eta_s = match s.drain_rate_bytes_per_s {
                _ if s.dirty_bytes == 0 => Some(0.0),
                Some(rate) if rate > 0.0 => Some(s.dirty_bytes as f64 / rate),
                _ => None,
            };
        }
        s
    }

    /// Check the cache's internal invariants (mapping, dirty set, free list, LRU):
    /// for tests and diagnostics; `Err` describes the first broken one.
    pub fn check_consistency(&self) -> std::result::Result<(), String> {
        match self.attached.read().as_ref() {
            Some(att) => att.state.lock().check(),
            None => Ok(()),
        }
    }

    /// Reset the high-water mark of used slots (at the start of a burst).
    pub fn reset_used_high(&self) {
        if let Some(att) = self.attached.read().as_ref() {
            let mut st = att.state.lock();
            st.used_high = st.map.len() as u32;
        }
    }

    fn stripe(&self, block: u64) -> usize {
        (block % STRIPES as u64) as usize
    }

    fn lock_block(&self, block: u64) -> MutexGuard<'_, ()> {
        self.locks[self.stripe(block)].lock()
    }

    fn block_len(&self, block: u64) -> u64 {
        self.block_size.min(self.backing.size() - block * self.block_size)
    }

    /// Split `[offset, offset+len)` into (block, offset in block, range in request).
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let mut done = 0;
        while done < len {
            let pos = offset + done;
            let (blk, at) = (pos / self.block_size, pos % self.block_size);
            let n = (self.block_size - at).min(len - done);
            out.push((blk, at, done as usize..(done + n) as usize));
            done += n;
        }
        out
    }

    fn note_io(&self) {
        self.last_io_ns.store(self.clock.now().as_nanos() as u64 + 1, Relaxed);
    }

    /// Time since the last user request (for phase-1 idle flushing).
    pub fn idle_for(&self) -> Duration {
        let last = self.last_io_ns.load(Relaxed);
        if last == 0 {
            return Duration::MAX;
        }
        self.clock.now().saturating_sub(Duration::from_nanos(last - 1))
    }

    // ---- slot allocation ----

    /// A slot for `block` (whose stripe we hold). Without `may_flush`, only free
    /// slots or clean evictable ones; with it, may commit and flush LRU dirty blocks.
    fn allocate(&self, att: &Attached, block: u64, may_flush: bool) -> FResult<Option<u32>> {
        for _ in 0..8 {
            let mut need_commit = false;
            {
                let mut st = att.state.lock();
                if let Some(s) = st.pop_free() {
                    return Ok(Some(s));
                }
                let mut victim = None;
                for (_, &slot) in st.lru.iter().take(256) {
                    let s = st.slots[slot as usize];
                    let v = s.block.expect("lru holds mapped slots");
                    if s.dirty {
                        continue;
                    }
                    if s.persisted.is_some() || s.unsynced {
                        need_commit = true;
                        continue;
                    }
                    if self.stripe(v) == self.stripe(block) {
                        victim = Some(v);
                        break;
                    }
                    if let Some(_g) = self.locks[self.stripe(v)].try_lock() {
                        victim = Some(v);
                        break;
                    }
                }
                if let Some(v) = victim {
                    let slot = st.unmap(v, true).expect("victim mapped");
                    self.c.evictions.fetch_add(1, Relaxed);
                    return Ok(Some(slot));
                }
                if !need_commit {
                    need_commit = st.slots.iter().any(|s| (s.persisted.is_some() || s.unsynced) && (s.block.is_none() || !s.dirty));
                }
            }
            if !may_flush {
                return Ok(None);
            }
            if !need_commit {
                // Everything is dirty: flush a batch of the least recently used.
                let victims: Vec<u64> = {
                    let st = att.state.lock();
                    let batch = (st.slots.len() / 32).clamp(1, self.cfg.flush_batch.max(1));
                    st.lru.values().filter_map(|&s| st.slots[s as usize].block).take(batch).collect()
                };
                for v in victims {
                    let guard = if self.stripe(v) == self.stripe(block) {
                        None
                    } else {
                        match self.locks[self.stripe(v)].try_lock() {
                            Some(g) => Some(g),
                            None => continue,
                        }
                    };
                    let n = self.flush_locked(att, v)?;
                    self.c.evicted_dirty_bytes.fetch_add(n, Relaxed);
                    drop(guard);
                }
            }
            // Never wait for a commit in flight (a FLUSH parked on a slow
            // backing flush): write around the cache instead.
            match att.commit.try_lock() {
                Some(c) => self.commit_locked(att, c)?,
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    // ---- flushing ----

    /// Write a dirty block back (caller holds its stripe). Returns bytes flushed.
    fn flush_locked(&self, att: &Attached, block: u64) -> FResult<u64> {
        let (slot, failed_flushes) = {
            let st = att.state.lock();
            match st.map.get(&block) {
                Some(&s) if st.slots[s as usize].dirty => (s, st.failed_flushes),
                _ => return Ok(0),
            }
        };
        let len = self.block_len(block);
        let mut buf = vec![0u8; len as usize];
        cache_err(att.dev.read_at(&mut buf, att.layout.slot_offset(slot)))?;
        other_err(self.backing.write_at(&buf, block * self.block_size, false))?;
        let mut st = att.state.lock();
        if st.failed_flushes != failed_flushes {
            return Ok(0); // a failed backing flush may have dropped it
        }
        st.slots[slot as usize].dirty = false;
        st.slots[slot as usize].unsynced = true;
        st.slots[slot as usize].gen += 1;
        st.dirty.remove(&block);
        self.c.flushed_bytes.fetch_add(len, Relaxed);
        Ok(len)
    }

    /// Flush up to `max_blocks` dirty blocks in block order (sequential on the
    /// backing device), then commit. Returns the number of blocks flushed.
    pub fn flush_step(&self, max_blocks: usize) -> Result<usize> {
        self.retry_rescues_when_due();
        let att = match self.attached.read().clone() {
            Some(a) => a,
            None => return Ok(0),
        };
        let batch = max_blocks.min(self.cfg.flush_batch.max(1));
        let todo: Vec<u64> = {
            let mut st = att.state.lock();
            let cursor = st.flush_cursor;
            let mut v: Vec<u64> = st.dirty.range(cursor..).take(batch).copied().collect();
            if v.len() < batch {
                v.extend(st.dirty.range(..cursor).take(batch - v.len()).copied());
            }
            if let Some(&last) = v.last() {
                st.flush_cursor = last + 1;
            }
            v
        };
        if todo.is_empty() {
            return Ok(0);
        }
        let start = self.clock.now();
        let r = (|| -> FResult<(usize, u64)> {
            let g = self.attached.read();
            if !g.as_ref().is_some_and(|a| Arc::ptr_eq(a, &att)) {
                return Ok((0, 0));
            }
            let (mut n, mut bytes) = (0, 0);
            for b in todo {
                let _l = self.lock_block(b);
                let f = self.flush_locked(&att, b)?;
                if f > 0 {
                    n += 1;
                    bytes += f;
                }
            }
            self.commit(&att)?;
            Ok((n, bytes))
        })();
        match r {
            Ok((n, bytes)) => {
                let dt = (self.clock.now() - start).as_secs_f64();
                if dt > 0.0 && bytes > 0 {
                    let mut rate = att.flush_rate.lock();
                    let now = bytes as f64 / dt;
                    *rate = Some(rate.map_or(now, |r| 0.7 * r + 0.3 * now));
                }
                Ok(n)
            }
            Err(Fault::Cache(e)) => {
                if !self.fail_over(&att, &e) {
                    return Err(e);
                }
                Ok(0)
            }
            Err(Fault::Other(e)) => Err(e),
        }
    }

    /// Persist the dirty set (see the module doc for the order).
    fn commit(&self, att: &Attached) -> FResult<()> {
        self.commit_locked(att, att.commit.lock())
    }

    fn commit_locked(&self, att: &Attached, mut c: MutexGuard<'_, CommitState>) -> FResult<()> {
        // The snapshot, and the (slot, generation) of blocks written back before it.
        let (entries, written_back) = {
            let mut st = att.state.lock();
            if let Err(e) = st.check_dirty_mapped() {
                return Err(Fault::Other(BlockError::Corrupt(e)));
            }
            let entries: Vec<(u64, u32)> = st.dirty.iter().map(|b| (*b, st.map[b])).collect();
            // From now on the snapshot may become durable at any moment: its
            // slots count as persisted (R1) until the commit settles.
            for &(b, slot) in &entries {
                st.slots[slot as usize].persisted = Some(b);
            }
            let wb: Vec<(u32, u64)> = (0..st.slots.len() as u32).filter(|&i| st.slots[i as usize].unsynced).map(|i| (i, st.slots[i as usize].gen)).collect();
            (entries, wb)
        };
        if let Err(e) = self.flush_backing() {
            att.state.lock().redirty_unsynced();
            return Err(Fault::Other(e));
        }
        cache_err(att.dev.flush())?;
        if entries != c.last {
            cache_err(self.write_meta(att, &mut c, entries.clone()))?;
            self.c.commits.fetch_add(1, Relaxed);
        }
        let now: HashMap<u32, u64> = entries.iter().map(|&(b, s)| (s, b)).collect();
        let mut st = att.state.lock();
        let synced: std::collections::HashSet<u32> =
            written_back.into_iter().filter(|&(i, gen)| st.slots[i as usize].gen == gen).map(|(i, _)| i).collect();
        for &slot in &synced {
            st.slots[slot as usize].unsynced = false;
        }
        // A slot goes to the free list exactly when it stops being held (named
        // by metadata or unsynced) while unmapped; unmap never frees held slots.
        for i in 0..st.slots.len() {
            let new = now.get(&(i as u32)).copied();
            let s = &mut st.slots[i];
            let was_held = s.persisted.is_some() || synced.contains(&(i as u32));
            s.persisted = new;
            if was_held && new.is_none() && s.block.is_none() && !s.unsynced {
                st.push_free(i as u32);
            }
        }
        c.last = entries;
        Ok(())
    }

    /// Write `entries` to the older metadata copy with the next sequence number
    /// and flush the cache device.
    fn write_meta(&self, att: &Attached, c: &mut CommitState, entries: Vec<(u64, u32)>) -> Result<()> {
        let copy = 1 - c.newest_copy;
        let m = Meta {
            seq: c.seq + 1,
            block_size: self.block_size as u32,
            nslots: att.layout.nslots,
            backing_size: self.backing.size(),
            cache_id: att.id,
            entries,
        };
        att.dev.write_at(&pad_to_4k(m.encode()), att.layout.copy_offset(copy), false)?;
        att.dev.flush()?;
        c.seq += 1;
        c.newest_copy = copy;
        c.last = m.entries;
        Ok(())
    }

    // ---- request paths ----

    fn read_block(&self, att: Option<&Attached>, block: u64, at: u64, out: &mut [u8]) -> FResult<()> {
        let _l = self.lock_block(block);
        let superseded = self.hold_superseded(block);
        if superseded.is_none() {
            if let Some(r) = self.read_rescued(block, at, out) {
                return r;
            }
        }
        let pos = block * self.block_size + at;
        let Some(att) = att else {
            return other_err(self.backing.read_at(out, pos));
        };
        let hit = {
            let mut st = att.state.lock();
            let s = st.map.get(&block).copied();
            if let Some(s) = s {
                st.touch(s);
            }
            s
        };
        if let Some(slot) = hit {
            self.c.hits.fetch_add(1, Relaxed);
            return cache_err(att.dev.read_at(out, att.layout.slot_offset(slot) + at));
        }
        self.c.misses.fetch_add(1, Relaxed);
        if self.mode() == CacheMode::PassThrough || self.phase() == Phase::Drain {
            return other_err(self.backing.read_at(out, pos));
        }
        let len = self.block_len(block);
        let mut buf = vec![0u8; len as usize];
        other_err(self.backing.read_at(&mut buf, block * self.block_size))?;
        out.copy_from_slice(&buf[at as usize..at as usize + out.len()]);
        if let Some(slot) = self.allocate(att, block, false)? {
            cache_err(att.dev.write_at(&buf, att.layout.slot_offset(slot), false))?;
            att.state.lock().map_slot(slot, block, false);
        }
        Ok(())
    }

    fn write_block(&self, att: Option<&Attached>, block: u64, at: u64, data: &[u8], place: Place) -> FResult<()> {
        let _l = self.lock_block(block);
        if let Some(r) = self.write_rescued(block, at, data) {
            return r;
        }
        let pos = block * self.block_size + at;
        let Some(att) = att else {
            return other_err(self.write_direct(data, pos));
        };
        // Look up and, for a bypassing write, invalidate a clean copy under one
        // acquisition: a failed backing flush may re-dirty a written-back block
        // at any moment (it does not take block locks), and a dirty block must
        // never be unmapped.
        let cached = {
            let mut st = att.state.lock();
            match st.map.get(&block).copied() {
                Some(s) if st.slots[s as usize].dirty => Some((s, true)),
                // A clean copy whose write-back is not yet durable (unsynced) is
                // written through instead: if the backing flush fails, it is
                // dirty again with this write's data; invalidated, the block
                // would revert to data older than its last FLUSH.
                Some(s) if place == Place::Around && !st.slots[s as usize].unsynced => {
                    st.unmap(block, false);
                    None
                }
                Some(s) => Some((s, false)),
                None => None,
            }
        };
        match (cached, place) {
            // A cached dirty copy is always updated in place (never left stale).
            (Some((slot, dirty)), _) if dirty || place == Place::Cache => {
                cache_err(att.dev.write_at(data, att.layout.slot_offset(slot) + at, false))?;
                let mut st = att.state.lock();
                st.set_dirty(slot, block);
                st.touch(slot);
                self.c.hits.fetch_add(1, Relaxed);
            }
            (Some((slot, _)), _) => {
                // Write-through of a clean copy (or a bypassing write of an
                // unsynced one): backing, then the copy. Until a
                // backing flush succeeds the copy is "unsynced" (kept, and dirty
                // again if a backing flush fails), like a write-back: a failed
                // flush may drop the backing write, and evicting the copy would
                // then revert the block.
                let failed_flushes = att.state.lock().failed_flushes;
                other_err(self.backing.write_at(data, pos, false))?;
                cache_err(att.dev.write_at(data, att.layout.slot_offset(slot) + at, false))?;
                let mut st = att.state.lock();
                st.slots[slot as usize].gen += 1;
                if st.failed_flushes != failed_flushes {
                    st.set_dirty(slot, block);
                } else if !st.slots[slot as usize].dirty {
                    st.slots[slot as usize].unsynced = true;
                }
                st.touch(slot);
            }
            (None, Place::Cache) => {
                self.c.misses.fetch_add(1, Relaxed);
                match self.allocate(att, block, true)? {
                    Some(slot) => {
                        let len = self.block_len(block);
                        if data.len() as u64 == len {
                            cache_err(att.dev.write_at(data, att.layout.slot_offset(slot), false))?;
                        } else {
                            let mut buf = vec![0u8; len as usize];
                            let r = self.backing.read_at(&mut buf, block * self.block_size);
                            if let Err(e) = r {
                                att.state.lock().push_free(slot);
                                return Err(Fault::Other(e));
                            }
                            buf[at as usize..at as usize + data.len()].copy_from_slice(data);
                            cache_err(att.dev.write_at(&buf, att.layout.slot_offset(slot), false))?;
                        }
                        att.state.lock().map_slot(slot, block, true);
                    }
                    None => {
                        other_err(self.write_direct(data, pos))?;
                        self.c.bypassed_bytes.fetch_add(data.len() as u64, Relaxed);
                    }
                }
            }
            (None, _) => {
                other_err(self.write_direct(data, pos))?;
                self.c.bypassed_bytes.fetch_add(data.len() as u64, Relaxed);
            }
        }
        Ok(())
    }

    fn place_for(&self, offset: u64, len: u64) -> Place {
        if self.phase() == Phase::Drain {
            return Place::Around;
        }
        match self.mode() {
            CacheMode::WriteBack => {
                if let Some(limit) = self.cfg.seq_bypass {
                    let mut run = self.seq_run.lock();
                    run.1 = if offset == run.0 { run.1 + len } else { len };
                    run.0 = offset + len;
                    if run.1 > limit {
                        return Place::Around;
                    }
                }
                Place::Cache
            }
            CacheMode::WriteThrough => Place::Through,
            CacheMode::WriteAround | CacheMode::PassThrough => Place::Around,
        }
    }

    /// Run `op` against the attached cache; if the cache device fails, fall back
    /// and run it once more on backing alone.
    fn with_fallback(&self, mut op: impl FnMut(Option<&Attached>) -> FResult<()>) -> Result<()> {
        let failed = {
            let g = self.attached.read();
            match op(g.as_deref()) {
                Ok(()) => return Ok(()),
                Err(Fault::Other(e)) => return Err(e),
                Err(Fault::Cache(e)) => (g.clone().expect("cache fault needs a cache"), e),
            }
        };
        if !self.fail_over(&failed.0, &failed.1) {
            return Err(failed.1);
        }
        let g = self.attached.read();
        op(g.as_deref()).map_err(|f| match f {
            Fault::Cache(e) | Fault::Other(e) => e,
        })
    }
}

fn sorted(mut v: Vec<(u64, u32)>) -> Vec<(u64, u32)> {
    v.sort_unstable();
    v
}

impl BlockDev for ElasticCache {
    fn size(&self) -> u64 {
        self.backing.size()
    }

    fn caps(&self) -> Caps {
        Caps { volatile_cache: true, preferred_block: 4096, ..Caps::default() }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        self.note_io();
        let pieces = self.pieces(offset, buf.len() as u64);
        self.with_fallback(|att| {
            for (blk, at, r) in &pieces {
                self.read_block(att, *blk, *at, &mut buf[r.clone()])?;
            }
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        self.note_io();
        let place = self.place_for(offset, buf.len() as u64);
        let pieces = self.pieces(offset, buf.len() as u64);
        self.with_fallback(|att| {
            for (blk, at, r) in &pieces {
                self.write_block(att, *blk, *at, &buf[r.clone()], place)?;
            }
            Ok(())
        })?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// A miss (or a write when no cache is attached) goes to backing; the
    /// cache device's blocks are anywhere on it, so it is asked as a whole.
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        let cache = self.attached.read().as_ref().map(|a| a.dev.clone());
        self.backing.may_wait_remote(offset, len, write) || cache.is_some_and(|d| d.may_wait_remote(0, d.size(), write))
    }

    /// A commit (or a backing flush without a cache); then every rescue must be
    /// resolved and no loss pending, or the FLUSH fails.
    fn flush(&self) -> Result<()> {
        let r = self.with_fallback(|att| match att {
            Some(att) => self.commit(att),
            None => other_err(self.flush_backing()),
        });
        let rescue = self.flush_rescues();
        let loss = self.check_loss();
        r.and(rescue).and(loss)
    }
}

/// Runs [`ElasticCache::flush_step`] in the background: in phase 1 only after
/// `idle_gap` without user I/O, in phase 2 continuously. Stops on drop.
pub struct Flusher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    /// Polls in real time (`std::thread::sleep`), whatever the cache's clock.
    pub fn spawn(cache: Arc<ElasticCache>, poll: Duration) -> Flusher {
        Self::start(cache, poll, None)
    }

    /// Polls by sleeping on `clock`, on which the thread is registered before
    /// this returns: on a discrete-event clock (`SimClock`) the flusher then
    /// runs on virtual time with everything else; on the system clock it is
    /// [`Flusher::spawn`]. Not for a `VirtualClock`, whose sleeps jump time.
    pub fn spawn_on(cache: Arc<ElasticCache>, poll: Duration, clock: Arc<dyn Clock>) -> Flusher {
        Self::start(cache, poll, Some(clock))
    }

    fn start(cache: Arc<ElasticCache>, poll: Duration, clock: Option<Arc<dyn Clock>>) -> Flusher {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        // The caller waits spinning, not blocked in the kernel: a discrete-event
        // clock would take a blocked caller as waiting for time and move it on.
        let started = Arc::new(AtomicBool::new(false));
        let st = started.clone();
        let thread = std::thread::Builder::new()
            .name("cache-flusher".into())
            .spawn(move || {
                let _t = clock.clone().map(crate::clock::ClockThread::enter);
                st.store(true, std::sync::atomic::Ordering::Release);
                while !s.load(Relaxed) {
                    let may = cache.phase() == Phase::Drain || cache.idle_for() >= cache.cfg.idle_gap;
                    let n = if may {
                        match cache.flush_step(usize::MAX) {
                            Ok(n) => n,
                            Err(e) => {
                                tracing::warn!(%e, "background flush failed");
                                0
                            }
                        }
                    } else {
                        0
                    };
                    if n == 0 {
                        match &clock {
                            Some(c) => c.sleep_until(c.now() + poll),
                            None => std::thread::sleep(poll),
                        }
                    }
                }
            })
            .expect("spawn flusher");
        while !started.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::yield_now();
        }
        Flusher { stop, thread: Some(thread) }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
