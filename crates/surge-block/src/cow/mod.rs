//! Copy-on-write over a read-only base: a local overlay device holds every
//! block written since the volume was made, with a persistent, crash-consistent
//! allocation map; everything else is read from the base (typically an NBD
//! client device streaming a remote image).
//!
//! Per block (default 4 KiB, vs qcow2's 64 KiB clusters) the map says where the
//! content is ([`State`]): the base, the overlay's data area (identity-mapped,
//! so an allocated read is one pread at a fixed offset), or zero. Rules:
//! - A write covering whole blocks writes them and marks them `Data`; a write
//!   covering part of a block not yet in the overlay first fills the rest of the
//!   block from the base (or with zeroes), once.
//! - Discard and write-zeroes mark whole blocks `Zero` (and punch their data),
//!   so base data never reappears; partial blocks of write-zeroes are written.
//! - Reads of `Base` runs go to the base in one request per run; with
//!   copy-on-read the blocks read are also copied into the overlay.
//! - A copy from the base (copy-on-read, the stream job) reads the base without
//!   locks, then under the range lock writes only blocks still `Base`: it can
//!   never overwrite a newer write.
//! - Durability: map changes are committed at FLUSH (and FUA): flush the data,
//!   then append a journal record of the changed map words, then flush again,
//!   so the map never says `Data` for a block whose data is not durable. A full
//!   journal is folded into a checkpoint (two alternating checksummed copies).
//!   One flush is enough when no block goes from `Base` (committed) to `Data`
//!   or from `Data` to `Zero`: the data area of every committed `Zero` block
//!   reads zeroes on disk (it is zeroed when made, when opened, and before a
//!   `Data`→`Zero` change is committed), so a `Zero`→`Data` block whose data
//!   did not reach the disk still reads its old contents, zeroes. A file system
//!   filling free space (holes of the base) commits with one flush, as a raw
//!   image does. Format in [`meta`] and docs/streaming.md.
//! - When no block needs the base any more (the stream job finished), a
//!   checkpoint records it and the base may go away ([`CowDev::detach_base`]).
//! - A failed overlay flush may have dropped whatever changed since the last
//!   good one (Linux after a writeback error). Those blocks are tracked
//!   (`unsynced.rs`); after the failure each goes back to its state on disk,
//!   a guest-written one reads as failed until written again, and FLUSH fails
//!   until the loss is acknowledged ([`CowDev::acknowledge_loss`],
//!   [`crate::ledger`]). So a later flush never acknowledges what a failed one
//!   lost, and no block is mapped to bytes that may not be there. Blocks
//!   changed since the last good flush ("fresh") take the locked write path
//!   and are read under a lock an overlay flush holds until its outcome is
//!   settled.

mod locks;
mod map;
pub mod meta;
pub mod readahead;
pub mod stream;
#[cfg(test)]
mod tests;
mod unsynced;

use crate::dev::{check_range, BlockDev, Caps, Extent, ExtentKind, FileSpan, ZeroMode};
use crate::error::{BlockError, Result};
use crate::ledger::FlushLedger;
use locks::RangeLocks;
use map::AllocMap;
pub use meta::{DecodeError, Layout, State};
pub use readahead::ReadaheadConfig;
use readahead::Readahead;
use meta::{Checkpoint, Record, FLAG_INDEPENDENT};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use rangemap::RangeSet;
use unsynced::{Change, Unsynced};
pub use stream::{StreamConfig, StreamJob, StreamProgress, StreamState, StreamWatch};

/// How a copy-on-write volume is made and behaves.
#[derive(Debug, Clone)]
pub struct CowConfig {
    /// Bytes per block of the map (power of two, 512 B .. 1 MiB). Only used
    /// when the overlay is made; an existing overlay keeps its own.
    pub granularity: u64,
    /// Copy blocks read from the base into the overlay.
    pub copy_on_read: bool,
    /// Bytes of journal before a checkpoint rewrites the whole map.
    pub journal_len: u64,
    /// When the overlay is made, ask the base where it has holes and mark them
    /// zero, so they are never fetched.
    pub learn_base_holes: bool,
    /// Read-ahead of base reads into a memory cache.
    pub readahead: ReadaheadConfig,
}

impl Default for CowConfig {
    fn default() -> Self {
        CowConfig { granularity: 4096, copy_on_read: false, journal_len: 4 << 20, learn_base_holes: true, readahead: ReadaheadConfig::default() }
    }
}

/// Why a copy-on-write volume could not be made or opened.
#[derive(Debug, thiserror::Error)]
pub enum CowError {
    #[error("overlay I/O failed: {0}")]
    Io(#[from] BlockError),
    #[error("overlay metadata unreadable: {0}")]
    Metadata(#[from] DecodeError),
    #[error("overlay metadata: {0}")]
    Inconsistent(String),
    #[error("the overlay device has {have} bytes; a {size}-byte volume at granularity {granularity} needs {need}")]
    OverlayTooSmall { have: u64, need: u64, size: u64, granularity: u64 },
    #[error("the base has {base} bytes but the overlay was made for a {size}-byte base")]
    BaseSize { base: u64, size: u64 },
    #[error("granularity {0} must be a power of two from 512 B to 1 MiB")]
    Granularity(u64),
    #[error("the overlay still needs its base: {0} blocks were never copied (let the stream job finish first)")]
    NeedsBase(u64),
}

/// What the layer has done, for `surge status` and experiments.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct CowStats {
    pub granularity: u64,
    pub blocks_base: u64,
    pub blocks_data: u64,
    pub blocks_zero: u64,
    /// Bytes read from the base to answer reads.
    pub base_read_bytes: u64,
    /// Bytes read from the base to fill partly written blocks.
    pub fill_bytes: u64,
    /// Bytes copied into the overlay by copy-on-read and the stream job.
    pub copied_bytes: u64,
    pub commits: u64,
    pub checkpoints: u64,
    pub independent: bool,
    /// Why every FLUSH fails until the loss is acknowledged, if it does: an
    /// overlay flush failed after guest writes it should have made durable.
    pub loss: Option<String>,
    /// Blocks whose reads fail until rewritten or the loss is acknowledged.
    pub lost_blocks: u64,
}

#[derive(Default)]
struct Counters {
    base_read_bytes: AtomicU64,
    fill_bytes: AtomicU64,
    copied_bytes: AtomicU64,
    commits: AtomicU64,
    checkpoints: AtomicU64,
    /// Requests from the guest that had to go to the base (the stream job
    /// yields while this moves).
    guest_fetches: AtomicU64,
    /// Failed overlay flushes settled (see `CowDev::undo_unsynced`).
    undos: AtomicU64,
}

/// Where the journal is (under the commit lock).
struct Journal {
    epoch: u64,
    flags: u32,
    /// Bytes used from the journal start.
    tail: u64,
    next_seq: u64,
    /// The map as it is on disk (for deciding whether a commit needs the data
    /// flushed before its record).
    committed: Vec<u64>,
}

pub struct CowDev {
    base: RwLock<Option<Arc<dyn BlockDev>>>,
    overlay: Arc<dyn BlockDev>,
    layout: Layout,
    map: AllocMap,
    locks: RangeLocks,
    journal: Mutex<Journal>,
    copy_on_read: AtomicBool,
    readahead: Readahead,
    /// The overlay zeroes ranges cheaply, so committed `Zero` blocks are kept
    /// zero on disk and most commits need one flush.
    single_flush: bool,
    /// Guest writes of data, against overlay flushes: what a failed one may
    /// have lost (copies from the base and zeroings are redone instead).
    ledger: FlushLedger,
    /// Held shared by every change of the data area together with its map
    /// update (taken before any range lock); exclusively to undo what a
    /// failed overlay flush may have dropped.
    io: RwLock<()>,
    /// Blocks whose state changed since the last good overlay flush began.
    unsynced: Unsynced,
    /// Blocks whose guest writes a failed overlay flush may have dropped:
    /// reads fail until they are written again or the loss is acknowledged
    /// (their map state is back to the one on disk).
    lost: Mutex<RangeSet<u64>>,
    /// `lost` is not empty (checked lock-free by every read).
    any_lost: AtomicBool,
    /// Reads of fresh blocks hold it shared; an overlay flush holds it
    /// exclusively from before it starts until its outcome is settled. A
    /// failed flush may drop a fresh block's contents at once, while the
    /// block goes back to its old state only after: a read in between would
    /// return bytes never written there.
    fresh_reads: RwLock<()>,
    counters: Counters,
}

/// What a commit persists: changed words, or (journal full) the whole map.
enum Pending {
    Words(Vec<(u64, u64)>),
    Full(Vec<u64>),
}

impl CowDev {
    /// Make a new volume over `base` on `overlay` (whatever it held is forgotten).
    pub fn create(base: Arc<dyn BlockDev>, overlay: Arc<dyn BlockDev>, cfg: &CowConfig) -> Result<CowDev, CowError> {
        let g = cfg.granularity;
        if !(512..=1 << 20).contains(&g) || !g.is_power_of_two() {
            return Err(CowError::Granularity(g));
        }
        let size = base.size();
        let layout = Layout::new(size, g, cfg.journal_len);
        if overlay.size() < layout.overlay_size() {
            return Err(CowError::OverlayTooSmall { have: overlay.size(), need: layout.overlay_size(), size, granularity: g });
        }
        let mut words = vec![0u64; layout.map_words() as usize];
        if cfg.learn_base_holes {
            mark_base_holes(base.as_ref(), &layout, &mut words)?;
        }
        // Forget any earlier overlay: both checkpoint headers and the whole
        // journal go (a volume must never replay another's records), and the
        // new epoch is above any the old checkpoints carry, so a crash before
        // the final flush cannot bring the old map back over the new one. The
        // data area is released (advisory).
        let epoch = old_epoch(overlay.as_ref()).saturating_add(1);
        for copy in 0..2 {
            overlay.write_at(&[0u8; meta::HEADER_LEN], layout.copy_offset(copy), false)?;
        }
        zero_range(overlay.as_ref(), layout.journal_start(), layout.journal_len)?;
        if overlay.caps().fast_zero {
            overlay.write_zeroes(layout.data_start, size, ZeroMode { may_trim: true, fast_only: false })?;
        } else {
            let _ = overlay.discard(layout.data_start, size);
        }
        overlay.write_at(&layout.encode_super(), 0, false)?;
        let cp = checkpoint_of(&layout, epoch, 0, words);
        overlay.write_at(&cp.encode(), layout.copy_offset(epoch), false)?;
        overlay.flush()?;
        let journal = Journal { epoch, flags: 0, tail: 0, next_seq: 1, committed: cp.words.clone() };
        Ok(Self::assemble(Some(base), overlay, layout, &cp.words, journal, cfg))
    }

    /// Open an existing overlay. `base` may be `None` only if the overlay no
    /// longer needs it.
    pub fn open(base: Option<Arc<dyn BlockDev>>, overlay: Arc<dyn BlockDev>, cfg: &CowConfig) -> Result<CowDev, CowError> {
        let layout = read_layout(overlay.as_ref())?;
        if overlay.size() < layout.overlay_size() {
            let (size, granularity) = (layout.size, layout.granularity);
            return Err(CowError::OverlayTooSmall { have: overlay.size(), need: layout.overlay_size(), size, granularity });
        }
        let mut best: Option<Checkpoint> = None;
        let mut last_err = None;
        for copy in 0..2 {
            let mut b = vec![0u8; layout.copy_len as usize];
            overlay.read_at(&mut b, layout.copy_offset(copy))?;
            match meta::decode_checkpoint(&b) {
                Ok(cp) if best.as_ref().is_none_or(|b| cp.epoch > b.epoch) => best = Some(cp),
                Ok(_) => {}
                Err(e) => last_err = Some(e),
            }
        }
        let mut cp = best.ok_or(last_err.unwrap_or(DecodeError::NoMagic))?;
        if cp.layout() != layout {
            return Err(CowError::Inconsistent("checkpoint geometry differs from the superblock".into()));
        }
        let mut journal = vec![0u8; layout.journal_len as usize];
        overlay.read_at(&mut journal, layout.journal_start())?;
        let (applied, used) = meta::replay_journal(&journal, cp.epoch, &mut cp.words, layout.blocks());
        let journal = Journal { epoch: cp.epoch, flags: cp.flags, tail: used, next_seq: applied + 1, committed: cp.words.clone() };
        let dev = Self::assemble(base.clone(), overlay, layout, &cp.words, journal, cfg);
        // A crash may have left data of uncommitted writes in the data area of
        // blocks the map says are zero: clear it again.
        dev.zero_free_areas()?;
        let missing = dev.map.count(State::Base);
        match base {
            None if missing > 0 => return Err(CowError::NeedsBase(missing)),
            Some(b) if b.size() != layout.size => return Err(CowError::BaseSize { base: b.size(), size: layout.size }),
            _ => {}
        }
        Ok(dev)
    }

    /// Open the overlay if it holds one, else make a new one.
    pub fn open_or_create(base: Option<Arc<dyn BlockDev>>, overlay: Arc<dyn BlockDev>, cfg: &CowConfig) -> Result<CowDev, CowError> {
        match read_layout(overlay.as_ref()) {
            Err(CowError::Metadata(DecodeError::NoMagic)) => match base {
                Some(b) => Self::create(b, overlay, cfg),
                None => Err(CowError::Inconsistent("the overlay is empty and no base was given".into())),
            },
            Err(e) => Err(e),
            Ok(_) => Self::open(base, overlay, cfg),
        }
    }

    /// Bytes an overlay device needs for a volume of `size` bytes.
    pub fn overlay_size_for(size: u64, cfg: &CowConfig) -> u64 {
        Layout::new(size, cfg.granularity, cfg.journal_len).overlay_size()
    }

    fn assemble(base: Option<Arc<dyn BlockDev>>, overlay: Arc<dyn BlockDev>, layout: Layout, words: &[u64], journal: Journal, cfg: &CowConfig) -> CowDev {
        CowDev {
            base: RwLock::new(base),
            single_flush: overlay.caps().fast_zero,
            overlay,
            map: AllocMap::from_words(words, layout.blocks()),
            layout,
            locks: RangeLocks::default(),
            journal: Mutex::new(journal),
            copy_on_read: AtomicBool::new(cfg.copy_on_read),
            readahead: Readahead::new(cfg.readahead),
            ledger: FlushLedger::new(),
            io: RwLock::new(()),
            unsynced: Unsynced::new(layout.blocks()),
            lost: Mutex::new(RangeSet::new()),
            any_lost: AtomicBool::new(false),
            fresh_reads: RwLock::new(()),
            counters: Counters::default(),
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn granularity(&self) -> u64 {
        self.layout.granularity
    }

    pub fn set_copy_on_read(&self, on: bool) {
        self.copy_on_read.store(on, Relaxed);
    }

    pub fn copy_on_read(&self) -> bool {
        self.copy_on_read.load(Relaxed)
    }

    /// State of the block holding byte `offset`.
    pub fn state_at(&self, offset: u64) -> State {
        self.map.get(offset / self.layout.granularity)
    }

    /// Blocks still only in the base.
    pub fn base_blocks(&self) -> u64 {
        self.map.count(State::Base)
    }

    /// Bytes still only in the base.
    pub fn base_bytes(&self) -> u64 {
        (self.base_blocks() * self.layout.granularity).min(self.layout.size)
    }

    /// No block needs the base any more.
    pub fn is_independent(&self) -> bool {
        self.base_blocks() == 0
    }

    pub fn has_base(&self) -> bool {
        self.base.read().is_some()
    }

    /// Drop the base once nothing needs it (the independence is committed
    /// first, so a restart opens without a base too). Returns the base.
    pub fn detach_base(&self) -> Result<Option<Arc<dyn BlockDev>>> {
        if !self.is_independent() {
            return Err(BlockError::NotSupported("detaching the base before every block is in the overlay"));
        }
        self.mark_independent()?;
        Ok(self.base.write().take())
    }

    pub fn stats(&self) -> CowStats {
        let c = &self.counters;
        CowStats {
            granularity: self.layout.granularity,
            blocks_base: self.map.count(State::Base),
            blocks_data: self.map.count(State::Data),
            blocks_zero: self.map.count(State::Zero),
            base_read_bytes: c.base_read_bytes.load(Relaxed),
            fill_bytes: c.fill_bytes.load(Relaxed),
            copied_bytes: c.copied_bytes.load(Relaxed),
            commits: c.commits.load(Relaxed),
            checkpoints: c.checkpoints.load(Relaxed),
            independent: self.journal.lock().flags & FLAG_INDEPENDENT != 0,
            loss: self.ledger.loss(),
            lost_blocks: self.lost.lock().iter().map(|r| r.end - r.start).sum(),
        }
    }

    /// Why acknowledged writes may have been lost, if they may (every FLUSH
    /// fails until [`CowDev::acknowledge_loss`]).
    pub fn loss(&self) -> Option<String> {
        self.ledger.loss()
    }

    /// The user accepts that writes acknowledged before a failed FLUSH are
    /// gone (their blocks read what they held before: the base, zeroes, or
    /// older data): FLUSH works again. Returns the loss acknowledged, if any.
    pub fn acknowledge_loss(&self) -> Option<String> {
        let _no_changes = self.io.write();
        *self.lost.lock() = RangeSet::new();
        self.any_lost.store(false, Relaxed);
        self.ledger.acknowledge()
    }

    /// State, freshness and loss of the blocks holding `[offset, offset+len)`
    /// (for diagnostics).
    pub fn describe_range(&self, offset: u64, len: u64) -> String {
        let g = self.g();
        let (b0, b1) = (offset / g, (offset + len).div_ceil(g));
        let lost = self.lost.lock();
        let committed = self.journal.lock().committed.clone();
        (b0..b1).map(|b| format!("{b}:{:?}/disk {:?}{}{}", self.map.get(b), state_in(&committed, b), if self.unsynced.any_fresh(b..b + 1) { " fresh" } else { "" }, if lost.contains(&b) { " lost" } else { "" })).collect::<Vec<_>>().join(" ")
    }

    /// Reads of blocks `[b0, b1)` fail if a failed flush may have dropped
    /// what a guest wrote there.
    fn check_not_lost(&self, b0: u64, b1: u64) -> Result<()> {
        if self.any_lost.load(Relaxed) && self.lost.lock().overlaps(&(b0..b1)) {
            return Err(BlockError::io("read", b0 * self.g(), (b1 - b0) * self.g(), std::io::Error::other("a failed overlay flush may have dropped what was written here (write it again, or acknowledge the loss)")));
        }
        Ok(())
    }

    /// Blocks `[b0, b1)` hold what was written now: readable again.
    fn found(&self, b0: u64, b1: u64) {
        if self.any_lost.load(Relaxed) {
            let mut l = self.lost.lock();
            l.remove(b0..b1);
            self.any_lost.store(!l.is_empty(), Relaxed);
        }
    }

    /// Wait until every failed overlay flush is settled (a change made
    /// between the failure and its undo would be undone with the rest),
    /// then return how many have been.
    fn settled(&self) -> u64 {
        loop {
            let undos = self.counters.undos.load(SeqCst);
            if self.ledger.failures() <= undos {
                return undos;
            }
            std::thread::yield_now();
        }
    }

    /// A write of `[b0, b1)` that changes no block state may skip the range
    /// lock: every block is `Data` and none is fresh (a failed flush could
    /// send a fresh one back to its old state under the write).
    fn lock_free(&self, b0: u64, b1: u64) -> bool {
        self.map.all(b0..b1, State::Data) && !self.unsynced.any_fresh(b0..b1)
    }

    fn base(&self) -> Result<Arc<dyn BlockDev>> {
        self.base.read().clone().ok_or_else(|| BlockError::Gone("the base was detached but a block still needs it".into()))
    }

    /// The base, to read block `b` that the map said is `Base`; `None` if
    /// the base is detached because `b` has left it meanwhile (read the map
    /// again). The base only goes once no block needs it.
    fn base_for(&self, b: u64) -> Result<Option<Arc<dyn BlockDev>>> {
        if let Some(base) = self.base.read().clone() {
            return Ok(Some(base));
        }
        match self.map.get(b) {
            State::Base => Err(BlockError::Gone("the base was detached but a block still needs it".into())),
            _ => Ok(None),
        }
    }

    fn g(&self) -> u64 {
        self.layout.granularity
    }

    /// Byte range of blocks `[b0, b1)`, clamped to the volume.
    fn byte_range(&self, b0: u64, b1: u64) -> (u64, u64) {
        (b0 * self.g(), (b1 * self.g()).min(self.layout.size))
    }

    fn read_base(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.base()?.read_at(buf, offset)?;
        self.counters.base_read_bytes.fetch_add(buf.len() as u64, Relaxed);
        Ok(())
    }

    /// A guest read of base data, through the read-ahead cache; `limit` is
    /// the end of the run of `Base` blocks it belongs to.
    fn read_base_for_guest(&self, base: &dyn BlockDev, buf: &mut [u8], offset: u64, limit: u64) -> Result<()> {
        let fetched = self.readahead.read(base, buf, offset, limit)?;
        if fetched > 0 {
            self.counters.base_read_bytes.fetch_add(fetched, Relaxed);
            self.counters.guest_fetches.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// How many guest requests have had to wait for the base so far.
    pub fn guest_fetches(&self) -> u64 {
        self.counters.guest_fetches.load(Relaxed)
    }

    /// Put base data for blocks `[b0, b1)` (`data` covers exactly their bytes)
    /// into the overlay, for the blocks still `Base` once the lock is held.
    /// Returns the bytes written.
    pub(crate) fn copy_up(&self, b0: u64, b1: u64, data: &[u8]) -> Result<u64> {
        self.settled();
        let _io = self.io.read();
        let _held = self.locks.lock(b0..b1);
        let origin = b0 * self.g();
        let mut written = 0;
        let mut b = b0;
        while b < b1 {
            let (state, end) = self.map.run(b, b1);
            if state == State::Base {
                let (lo, hi) = self.byte_range(b, end);
                self.overlay.write_at(&data[(lo - origin) as usize..(hi - origin) as usize], self.layout.data_start + lo, false)?;
                self.unsynced.note(b..end, Change::Copied);
                self.map.set_range(b..end, State::Data);
                written += hi - lo;
            }
            b = end;
        }
        self.counters.copied_bytes.fetch_add(written, Relaxed);
        Ok(written)
    }

    /// Contents of block `b` as the volume reads it now (for filling a partial write).
    fn block_contents(&self, b: u64, state: State) -> Result<Vec<u8>> {
        let (lo, hi) = self.byte_range(b, b + 1);
        let mut v = vec![0u8; (hi - lo) as usize];
        match state {
            State::Base => {
                // Under the block's range lock: it stays `Base`, so the base stays.
                self.read_base_for_guest(self.base()?.as_ref(), &mut v, lo, hi)?;
                self.counters.fill_bytes.fetch_add(v.len() as u64, Relaxed);
            }
            State::Data => self.overlay.read_at(&mut v, self.layout.data_start + lo)?,
            State::Zero => {}
        }
        Ok(v)
    }

    /// A write that changes block states: under the range lock, fill partly
    /// covered blocks that are not in the overlay yet, write, mark `Data`.
    fn write_allocating(&self, buf: &[u8], offset: u64) -> Result<()> {
        let g = self.g();
        let end = offset + buf.len() as u64;
        let (b0, b1) = (offset / g, end.div_ceil(g));
        let _held = self.locks.lock(b0..b1);
        let (first_lo, _) = self.byte_range(b0, b0 + 1);
        let (_, last_hi) = self.byte_range(b1 - 1, b1);
        let (s0, s1) = (self.map.get(b0), self.map.get(b1 - 1));
        let head = offset > first_lo && s0 != State::Data;
        let tail = end < last_hi && s1 != State::Data;
        if !head && !tail {
            self.overlay.write_at(buf, self.layout.data_start + offset, false)?;
        } else {
            let lo = if head { first_lo } else { offset };
            let hi = if tail { last_hi } else { end };
            let mut ext = vec![0u8; (hi - lo) as usize];
            if head {
                let c = self.block_contents(b0, s0)?;
                ext[..c.len()].copy_from_slice(&c);
            }
            if tail && !(head && b1 - 1 == b0) {
                let c = self.block_contents(b1 - 1, s1)?;
                let at = (hi - lo) as usize - c.len();
                ext[at..].copy_from_slice(&c);
            }
            ext[(offset - lo) as usize..(end - lo) as usize].copy_from_slice(buf);
            self.overlay.write_at(&ext, self.layout.data_start + lo, false)?;
        }
        self.unsynced.note(b0..b1, Change::Written);
        self.map.set_range(b0..b1, State::Data);
        self.found(b0, b1);
        Ok(())
    }

    /// A write to blocks already `Data` takes no range lock, so a discard of
    /// them may have run meanwhile and cleared their area before the write's
    /// data landed there: clear again what is `Zero` now, so the data area of
    /// a `Zero` block reads zeroes (one-flush commits rely on it). The caller
    /// holds the I/O gate shared.
    fn clear_raced_zeroes(&self, b0: u64, b1: u64) -> Result<()> {
        if self.map.all(b0..b1, State::Data) {
            return Ok(());
        }
        let _held = self.locks.lock(b0..b1);
        let mut b = b0;
        while b < b1 {
            let (state, end) = self.map.run(b, b1);
            if state == State::Zero {
                let (lo, hi) = self.byte_range(b, end);
                self.clear_area(lo, hi)?;
                self.unsynced.note(b..end, Change::Cleared);
            }
            b = end;
        }
        Ok(())
    }

    /// Whether a write of `[offset, end)` must first fill a partly covered
    /// block that is not in the overlay yet.
    fn needs_fill(&self, offset: u64, end: u64) -> bool {
        let g = self.g();
        let (b0, b1) = (offset / g, end.div_ceil(g));
        let (first_lo, _) = self.byte_range(b0, b0 + 1);
        let (_, last_hi) = self.byte_range(b1 - 1, b1);
        (offset > first_lo && self.map.get(b0) != State::Data) || (end < last_hi && self.map.get(b1 - 1) != State::Data)
    }

    /// Mark whole blocks `[b0, b1)` zero and release their data.
    fn zero_blocks(&self, b0: u64, b1: u64) -> Result<()> {
        if b0 >= b1 {
            return Ok(());
        }
        self.settled();
        let _io = self.io.read();
        let _held = self.locks.lock(b0..b1);
        self.map.set_range(b0..b1, State::Zero);
        let (lo, hi) = self.byte_range(b0, b1);
        self.clear_area(lo, hi)?;
        self.unsynced.note(b0..b1, Change::Cleared);
        self.found(b0, b1);
        Ok(())
    }

    /// Make the data area of `[lo, hi)` read zeroes (with one-flush commits,
    /// committed `Zero` blocks rely on it; otherwise it only frees space).
    fn clear_area(&self, lo: u64, hi: u64) -> Result<()> {
        let at = self.layout.data_start + lo;
        if self.single_flush {
            self.overlay.write_zeroes(at, hi - lo, ZeroMode { may_trim: true, fast_only: false })
        } else {
            let _ = self.overlay.discard(at, hi - lo);
            Ok(())
        }
    }

    /// Zero the data area of every `Zero` block (at open), then flush.
    fn zero_free_areas(&self) -> Result<()> {
        if !self.single_flush {
            return Ok(());
        }
        let blocks = self.layout.blocks();
        let mut b = 0;
        while let Some(z) = self.map.find(b, State::Zero) {
            let (_, end) = self.map.run(z, blocks);
            let (lo, hi) = self.byte_range(z, end);
            self.clear_area(lo, hi)?;
            b = end;
        }
        self.overlay.flush()
    }

    /// Byte offset where the run of `Base` blocks reaching block `b` ends
    /// (looking at most a few MiB ahead): the read-ahead stops there.
    fn base_run_end(&self, b: u64) -> u64 {
        let look = (4 << 20) / self.g();
        let (state, end) = self.map.run(b.min(self.layout.blocks() - 1), (b + look).min(self.layout.blocks()));
        let end = if b >= self.layout.blocks() || state != State::Base { b } else { end };
        (end * self.g()).min(self.layout.size)
    }

    /// Whole blocks inside `[offset, end)`: `[fb0, fb1)` (empty if none).
    fn whole_blocks(&self, offset: u64, end: u64) -> (u64, u64) {
        let g = self.g();
        let fb0 = offset.div_ceil(g);
        let fb1 = if end == self.layout.size { end.div_ceil(g) } else { end / g };
        (fb0, fb1.max(fb0))
    }

    /// Read through the map, run by run. Returns whether any of it came from
    /// the overlay's data area.
    fn read_mapped(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        let g = self.g();
        let end = offset + buf.len() as u64;
        if !buf.is_empty() {
            self.check_not_lost(offset / g, end.div_ceil(g))?;
        }
        let mut from_overlay = false;
        let mut pos = offset;
        while pos < end {
            let (state, run_end) = self.map.run(pos / g, end.div_ceil(g));
            let stop = (run_end * g).min(end);
            let dst = &mut buf[(pos - offset) as usize..(stop - offset) as usize];
            match state {
                State::Data => {
                    from_overlay = true;
                    self.overlay.read_at(dst, self.layout.data_start + pos)?;
                }
                State::Zero => dst.fill(0),
                State::Base => {
                    // The stream job may have copied the run and detached the
                    // base since the map was read: then read the map again.
                    let Some(base) = self.base_for(pos / g)? else { continue };
                    if self.copy_on_read() {
                        let (b0, b1) = (pos / g, run_end);
                        let (lo, hi) = self.byte_range(b0, b1);
                        let mut whole = vec![0u8; (hi - lo) as usize];
                        self.read_base_for_guest(base.as_ref(), &mut whole, lo, self.base_run_end(b1))?;
                        dst.copy_from_slice(&whole[(pos - lo) as usize..(stop - lo) as usize]);
                        self.copy_up(b0, b1, &whole)?;
                    } else {
                        self.read_base_for_guest(base.as_ref(), dst, pos, self.base_run_end(run_end))?;
                    }
                }
            }
            pos = stop;
        }
        Ok(from_overlay)
    }

    /// Make every state change since the last commit durable, after the data
    /// it describes (see the module docs).
    pub fn commit(&self) -> Result<()> {
        let mut j = self.journal.lock();
        let dirty = self.map.take_dirty();
        if dirty.is_empty() {
            return self.flush_overlay(&j.committed);
        }
        let fits = j.tail + Record::footprint(dirty.len()) <= self.layout.journal_len;
        // Read the words before the data flush: each state in them had its data
        // written before it was set, so the flush below makes that data durable.
        let pending = if fits { Pending::Words(dirty.iter().map(|&i| (i, self.map.word(i))).collect()) } else { Pending::Full(self.map.snapshot()) };
        let one_flush = match &pending {
            Pending::Words(entries) => self.single_flush && entries.iter().all(|&(i, w)| safe_without_data_flush(j.committed[i as usize], w)),
            Pending::Full(_) => false,
        };
        let flags = j.flags;
        let result = if one_flush { self.persist(&mut j, pending, flags) } else { self.flush_overlay(&j.committed).and_then(|_| self.persist(&mut j, pending, flags)) };
        if result.is_err() {
            self.map.restore_dirty(dirty);
        }
        result
    }

    /// Flush the overlay, settling what the flush covered: on success every
    /// change finished before it is durable; on failure the overlay may have
    /// dropped any change since the last good flush, so those are undone
    /// (see [`CowDev::undo_unsynced`]) and lost guest writes become the
    /// ledger's loss. `committed` is the map as it is on disk.
    fn flush_overlay(&self, committed: &[u64]) -> Result<()> {
        let _settling = self.fresh_reads.write();
        let covered = self.unsynced.flip();
        match self.ledger.flush("an overlay flush", || self.overlay.flush()) {
            Ok(()) => {
                self.unsynced.synced(covered);
                Ok(())
            }
            Err(e) => {
                self.undo_unsynced(committed);
                Err(e)
            }
        }
    }

    /// After a failed overlay flush, no block may be mapped to bytes that may
    /// not be there. Of the blocks changed since the last good flush began
    /// (all noted: fresh blocks take the locked write path):
    /// - a block made `Data` by copies of the base alone goes back to its
    ///   state on disk (the copy is made again when needed);
    /// - a block a guest wrote goes back to its state on disk too, and its
    ///   reads fail until it is written again or the loss is acknowledged
    ///   (the write may or may not be there; a write that landed after the
    ///   failure but before this ran is among them, so nothing guesses);
    /// - a block made `Zero` has its data area cleared again (the clearing may
    ///   have been dropped, and a one-flush commit relies on it).
    /// Runs with no change of the data area in flight.
    fn undo_unsynced(&self, committed: &[u64]) {
        let _no_changes = self.io.write();
        let changed = self.unsynced.take_all();
        let mut reclear: Vec<std::ops::Range<u64>> = Vec::new();
        let mut lost = self.lost.lock();
        let blocks: RangeSet<u64> = changed.copied.iter().chain(changed.written.iter()).chain(changed.cleared.iter()).cloned().collect();
        for r in blocks.iter() {
            for b in r.clone() {
                let was = state_in(committed, b);
                match self.map.get(b) {
                    State::Data if was != State::Data => {
                        self.map.set(b, was);
                        if changed.written.contains(&b) {
                            lost.insert(b..b + 1);
                        }
                        if was == State::Zero {
                            push_block(&mut reclear, b);
                        }
                    }
                    State::Zero => push_block(&mut reclear, b),
                    _ => {}
                }
            }
        }
        self.any_lost.store(!lost.is_empty(), Relaxed);
        drop(lost);
        self.unsynced.clear_fresh();
        self.counters.undos.fetch_add(1, SeqCst);
        for r in reclear {
            let (lo, hi) = self.byte_range(r.start, r.end);
            if let Err(e) = self.clear_area(lo, hi) {
                self.ledger.flag(format!("clearing discarded blocks again after a failed overlay flush failed ({e})"));
            }
            // The clearing waits for the next flush like any other change.
            self.unsynced.note(r, Change::Cleared);
        }
    }

    fn persist(&self, j: &mut Journal, pending: Pending, flags: u32) -> Result<()> {
        match pending {
            Pending::Words(entries) => {
                let r = Record { epoch: j.epoch, seq: j.next_seq, entries };
                self.overlay.write_at(&r.encode(), self.layout.journal_start() + j.tail, false)?;
                self.flush_overlay(&j.committed)?;
                j.tail += Record::footprint(r.entries.len());
                j.next_seq += 1;
                for &(i, w) in &r.entries {
                    j.committed[i as usize] = w;
                }
                self.counters.commits.fetch_add(1, Relaxed);
            }
            Pending::Full(words) => {
                let cp = checkpoint_of(&self.layout, j.epoch + 1, flags, words);
                self.overlay.write_at(&cp.encode(), self.layout.copy_offset(cp.epoch), false)?;
                self.flush_overlay(&j.committed)?;
                *j = Journal { epoch: cp.epoch, flags, tail: 0, next_seq: 1, committed: cp.words };
                self.counters.checkpoints.fetch_add(1, Relaxed);
            }
        }
        Ok(())
    }

    /// Record durably that no block needs the base (a checkpoint with the flag).
    pub fn mark_independent(&self) -> Result<()> {
        let mut j = self.journal.lock();
        if j.flags & FLAG_INDEPENDENT != 0 {
            return Ok(());
        }
        if !self.is_independent() {
            return Err(BlockError::NotSupported("marking independent while blocks still need the base"));
        }
        let dirty = self.map.take_dirty();
        let words = self.map.snapshot();
        let flags = j.flags | FLAG_INDEPENDENT;
        let result = self.flush_overlay(&j.committed).and_then(|_| self.persist(&mut j, Pending::Full(words), flags));
        if result.is_err() {
            self.map.restore_dirty(dirty);
        }
        result
    }

    /// Copy the next run of blocks still in the base, from block `from` on, of
    /// at most `max_bytes`. Returns `(next block to look at, bytes copied)`, or
    /// `None` when no block at or after `from` needs the base.
    pub fn stream_step(&self, from: u64, max_bytes: u64) -> Result<Option<(u64, u64)>> {
        let Some(b0) = self.map.find(from, State::Base) else { return Ok(None) };
        let max_blocks = (max_bytes / self.g()).max(1);
        let (_, b1) = self.map.run(b0, (b0 + max_blocks).min(self.layout.blocks()));
        let (lo, hi) = self.byte_range(b0, b1);
        let mut data = vec![0u8; (hi - lo) as usize];
        // The base is read-only, so it is read without the lock; copy_up then
        // keeps only blocks no one wrote meanwhile.
        self.read_base(&mut data, lo)?;
        let copied = self.copy_up(b0, b1, &data)?;
        Ok(Some((b1, copied)))
    }
}

/// Whether committing `new` over the on-disk word `old` needs no data flush
/// first: no block goes `Base`→`Data` (its old contents, the base, would be
/// lost if the data did not land) or `Data`→`Zero` (the clearing of its data
/// area must be durable before the map says `Zero`).
fn safe_without_data_flush(old: u64, new: u64) -> bool {
    (0..meta::BLOCKS_PER_WORD).all(|f| {
        let (o, n) = ((old >> (2 * f)) & 3, (new >> (2 * f)) & 3);
        !matches!((State::from_bits(o), State::from_bits(n)), (Some(State::Base), Some(State::Data)) | (Some(State::Data), Some(State::Zero)))
    })
}

/// Add block `b` to a list of ranges built in order.
fn push_block(v: &mut Vec<std::ops::Range<u64>>, b: u64) {
    match v.last_mut() {
        Some(last) if last.end == b => last.end = b + 1,
        _ => v.push(b..b + 1),
    }
}

/// State of block `b` in map words `words`.
fn state_in(words: &[u64], b: u64) -> State {
    let w = words[(b / meta::BLOCKS_PER_WORD) as usize];
    State::from_bits((w >> (2 * (b % meta::BLOCKS_PER_WORD))) & 3).unwrap_or(State::Data)
}

fn checkpoint_of(l: &Layout, epoch: u64, flags: u32, words: Vec<u64>) -> Checkpoint {
    Checkpoint { epoch, flags, granularity: l.granularity as u32, size: l.size, journal_len: l.journal_len, data_start: l.data_start, words }
}

/// The newest epoch of a valid checkpoint an earlier volume left on `overlay`
/// (0 if none).
fn old_epoch(overlay: &dyn BlockDev) -> u64 {
    let Ok(old) = read_layout(overlay) else { return 0 };
    if overlay.size() < old.journal_start() {
        return 0;
    }
    (0..2)
        .filter_map(|copy| {
            let mut b = vec![0u8; old.copy_len as usize];
            overlay.read_at(&mut b, old.copy_offset(copy)).ok()?;
            meta::decode_checkpoint(&b).ok().map(|cp| cp.epoch)
        })
        .max()
        .unwrap_or(0)
}

/// Make `[offset, offset+len)` read zeroes, quickly where the device can.
fn zero_range(dev: &dyn BlockDev, offset: u64, len: u64) -> Result<()> {
    if dev.caps().fast_zero {
        dev.write_zeroes(offset, len, ZeroMode { may_trim: false, fast_only: false })
    } else {
        crate::dev::write_zero_buffers(dev, offset, len)
    }
}

fn read_layout(overlay: &dyn BlockDev) -> Result<Layout, CowError> {
    if overlay.size() < meta::SUPER_LEN as u64 {
        return Err(DecodeError::NoMagic.into());
    }
    let mut b = [0u8; meta::SUPER_LEN];
    overlay.read_at(&mut b, 0)?;
    Ok(meta::decode_super(&b)?)
}

/// Mark every whole block inside a hole (or zero extent) of the base `Zero`.
fn mark_base_holes(base: &dyn BlockDev, l: &Layout, words: &mut [u64]) -> Result<()> {
    if !base.caps().block_status {
        return Ok(());
    }
    let g = l.granularity;
    let mut pos = 0;
    while pos < l.size {
        let extents = base.block_status(pos, (l.size - pos).min(1 << 30))?;
        if extents.is_empty() {
            break;
        }
        for e in extents {
            let end = (pos + e.len).min(l.size);
            if e.kind != ExtentKind::Data {
                let b0 = pos.div_ceil(g);
                let b1 = if end == l.size { end.div_ceil(g) } else { end / g };
                for b in b0..b1.max(b0) {
                    let (w, shift) = ((b / meta::BLOCKS_PER_WORD) as usize, 2 * (b % meta::BLOCKS_PER_WORD));
                    words[w] = (words[w] & !(3 << shift)) | ((State::Zero as u64) << shift);
                }
            }
            pos = end;
        }
    }
    Ok(())
}

impl BlockDev for CowDev {
    fn size(&self) -> u64 {
        self.layout.size
    }

    fn caps(&self) -> Caps {
        Caps {
            read_only: false,
            volatile_cache: true,
            discard: true,
            fast_zero: true,
            block_status: true,
            multi_conn: true,
            preferred_block: self.layout.granularity.min(1 << 20) as u32,
        }
    }

    /// Fresh blocks are read under `fresh_reads`. A read that found none may
    /// have met one made fresh meanwhile (a copy of the stream job) whose
    /// contents a failing flush dropped: it is read again under the lock if
    /// a block of it is fresh when it ends, or an undo ran meanwhile.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.layout.size, offset, buf.len() as u64)?;
        let g = self.g();
        let (b0, b1) = (offset / g, (offset + buf.len() as u64).div_ceil(g));
        if !self.unsynced.any_fresh(b0..b1) {
            let undos = self.counters.undos.load(SeqCst);
            let from_overlay = self.read_mapped(buf, offset)?;
            if !from_overlay || (!self.unsynced.any_fresh(b0..b1) && self.counters.undos.load(SeqCst) == undos) {
                return Ok(());
            }
        }
        let _settled = self.fresh_reads.read();
        self.read_mapped(buf, offset).map(|_| ())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        check_range(self.layout.size, offset, buf.len() as u64)?;
        let undos = self.settled();
        if !buf.is_empty() {
            let _counted = self.ledger.begin();
            let _io = self.io.read();
            let g = self.g();
            let (b0, b1) = (offset / g, (offset + buf.len() as u64).div_ceil(g));
            if self.lock_free(b0, b1) {
                // In the overlay already: no state changes, no lock.
                self.overlay.write_at(buf, self.layout.data_start + offset, false)?;
                self.clear_raced_zeroes(b0, b1)?;
            } else {
                self.write_allocating(buf, offset)?;
            }
        }
        if fua {
            self.commit()?;
            if self.counters.undos.load(SeqCst) != undos {
                // An overlay flush failed after the write began: it may have
                // dropped it or sent it back, and the commit's flush would not know.
                return Err(crate::ledger::lost("an overlay flush failed after this FUA write"));
            }
        }
        Ok(())
    }

    /// Commit, and fail while an earlier failed flush may have lost
    /// acknowledged writes.
    fn flush(&self) -> Result<()> {
        self.commit()?;
        self.ledger.check()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.layout.size, offset, len)?;
        let (fb0, fb1) = self.whole_blocks(offset, offset + len);
        self.zero_blocks(fb0, fb1)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        check_range(self.layout.size, offset, len)?;
        let end = offset + len;
        let (fb0, fb1) = self.whole_blocks(offset, end);
        let g = self.g();
        let (head, tail) = if fb0 < fb1 { ((offset, (fb0 * g).min(end)), ((fb1 * g).clamp(offset, end), end)) } else { ((offset, end), (end, end)) };
        self.zero_blocks(fb0, fb1)?;
        for (lo, hi) in [head, tail] {
            if hi > lo {
                self.write_at(&vec![0u8; (hi - lo) as usize], lo, false)?;
            }
        }
        Ok(())
    }

    /// The overlay's data area, which holds the volume's bytes identity-mapped
    /// wherever a block is `Data`.
    fn file_span(&self) -> Option<FileSpan<'_>> {
        let span = self.overlay.file_span()?;
        Some(FileSpan { base: span.base + self.layout.data_start, ..span })
    }

    /// Reads: ranges whose blocks are all `Data` and none fresh (only a fresh
    /// block can go back to its old state, and a block turning `Zero`
    /// meanwhile is a concurrent discard).
    /// Writes: ranges that fill no partial block from the base, which
    /// [`BlockDev::write_via_span`] then marks `Data`.
    fn in_file_span(&self, offset: u64, len: u64, write: bool) -> bool {
        if len == 0 || check_range(self.layout.size, offset, len).is_err() || self.overlay.file_span().is_none() {
            return false;
        }
        let g = self.g();
        if write {
            !self.needs_fill(offset, offset + len)
        } else {
            // Fresh blocks are read under `fresh_reads`, never through the span.
            let (b0, b1) = (offset / g, (offset + len).div_ceil(g));
            self.map.all(b0..b1, State::Data) && !self.unsynced.any_fresh(b0..b1) && self.check_not_lost(b0, b1).is_ok()
        }
    }

    /// As `write_at`, with `fill` writing the data area: no lock where every
    /// block is `Data` already, else under the range lock, then marked `Data`.
    fn write_via_span(&self, offset: u64, len: u64, fill: &mut dyn FnMut() -> std::io::Result<()>) -> Result<bool> {
        if !self.in_file_span(offset, len, true) {
            return Ok(false);
        }
        let g = self.g();
        let (b0, b1) = (offset / g, (offset + len).div_ceil(g));
        let mut fill = || fill().map_err(|e| BlockError::io("write", offset, len, e));
        self.settled();
        let _counted = self.ledger.begin();
        let _io = self.io.read();
        if self.lock_free(b0, b1) {
            fill()?;
            self.clear_raced_zeroes(b0, b1)?;
            return Ok(true);
        }
        let _held = self.locks.lock(b0..b1);
        if self.needs_fill(offset, offset + len) {
            return Ok(false);
        }
        fill()?;
        self.unsynced.note(b0..b1, Change::Written);
        self.map.set_range(b0..b1, State::Data);
        self.found(b0, b1);
        Ok(true)
    }

    /// Reads of blocks still in the base, and writes that must fill a partial
    /// block from the base, wait on the base; everything else is local.
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        if len == 0 || check_range(self.layout.size, offset, len).is_err() {
            return false;
        }
        let g = self.g();
        let end = offset + len;
        let (b0, b1) = (offset / g, end.div_ceil(g));
        let needs_base = if write {
            let partial = |b: u64, covered: bool| !covered && self.map.get(b) == State::Base;
            let (first_lo, _) = self.byte_range(b0, b0 + 1);
            let (_, last_hi) = self.byte_range(b1 - 1, b1);
            partial(b0, offset == first_lo) || partial(b1 - 1, end == last_hi)
        } else {
            self.map.any(b0..b1, State::Base)
        };
        needs_base && self.base.read().as_ref().is_some_and(|b| b.may_wait_remote(offset, len, false))
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.layout.size, offset, len)?;
        let g = self.g();
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len: u64, kind: ExtentKind| match out.last_mut() {
            Some(last) if last.kind == kind => last.len += len,
            _ => out.push(Extent { len, kind }),
        };
        let mut pos = offset;
        let mut runs = 0;
        while pos < end && runs < 1024 {
            runs += 1;
            let (state, run_end) = self.map.run(pos / g, end.div_ceil(g));
            let stop = (run_end * g).min(end);
            match state {
                State::Data => push(stop - pos, ExtentKind::Data),
                State::Zero => push(stop - pos, ExtentKind::Hole),
                State::Base => {
                    // Not in the overlay: the base says what it holds.
                    let Some(base) = self.base_for(pos / g)? else { continue };
                    let mut at = pos;
                    for e in base.block_status(pos, stop - pos)? {
                        let n = e.len.min(stop - at);
                        if n == 0 {
                            break;
                        }
                        push(n, e.kind);
                        at += n;
                    }
                    if at < stop {
                        // The base answered for part of the run only: stop here.
                        break;
                    }
                }
            }
            pos = stop;
        }
        Ok(out)
    }
}
