//! RAID-1 of a *source* and a fresh *target*, with a background rebuild that
//! copies the source onto the target: how a stripe member is migrated to a new
//! volume online.
//!
//! Data path (md's rules):
//! - the device is divided into regions (1 MiB by default); the rebuild copies
//!   them in order, region `copied` next, holding that region's lock exclusively
//!   while it copies (user I/O to it waits);
//! - a write goes to the source, and to the target too for the part that lies in
//!   regions already copied (regions not yet copied will be copied later);
//! - a read of copied regions may be served by either leg (alternating, so the
//!   rebuilt part reads at both legs' speed); anything else reads the source.
//!
//! Crash consistency (record format in [`meta`]): the record holds `copied` and
//! an intent bitmap of regions. `copied` only ever names regions that both legs
//! had flushed before the record was written. A write to a copied region
//! first makes that region's intent bit durable (one record write per region
//! that turns dirty; group commit), so after a crash every region the legs may
//! disagree on (a write in flight on one leg only) is known and re-copied from
//! the source before either leg serves it: reads never flip between old and new
//! data. Idle dirty regions are cleared lazily after both legs are flushed.
//! If the target fails, the mirror continues on the source alone, and writes
//! that reach the source alone wait until a record says the target failed
//! (until then a restart would trust the target): such a write fails, and so
//! does every FLUSH, while the record cannot be written; it is tried again
//! each time. The write that found the failure had its region's intent bit
//! durable first, so a restart that still trusts the target re-copies it.
//! A failed flush of the source that may have dropped acknowledged writes
//! fails every later FLUSH until the loss is acknowledged ([`FlushLedger`]).
//!
//! The rebuild is driven by [`Mirror::rebuild_step`]; [`spawn_rebuild`] runs it on
//! a thread, rate-limited in bytes/s on a [`Clock`], so simulations on a
//! discrete-event clock and the daemon run the same code.

pub mod meta;

use crate::clock::{spawn_registered, Clock};
use crate::dev::{check_range, BlockDev, Caps, Extent, ExtentKind, ZeroMode};
use crate::error::{BlockError, Result};
use crate::ledger::FlushLedger;
use meta::{decode, Record, FLAG_COMPLETE, FLAG_FAILED};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const MAX_LOCKS: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorConfig {
    /// Rebuild and intent granularity in bytes (power of two, >= 4 KiB).
    pub region: u64,
    /// Flush both legs and record the position after this many bytes copied...
    pub persist_every: u64,
    /// ...or this much time, whichever comes first.
    pub persist_interval: Duration,
    /// Regions that read as zeroes on both legs are not copied (a new cloud
    /// volume reads as zeroes; `block_status` tells, so this costs no I/O).
    pub skip_zero: bool,
    /// Serve reads of rebuilt regions from both legs in turn.
    pub balance_reads: bool,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig { region: 1 << 20, persist_every: 64 << 20, persist_interval: Duration::from_secs(1), skip_zero: true, balance_reads: true }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("target holds {target} bytes, less than the source's {source_size}")]
    TargetTooSmall { source_size: u64, target: u64 },
    #[error("region size {0} must be a power of two of at least 4096 bytes")]
    BadRegion(u64),
    #[error("metadata device holds {got} bytes; this mirror needs {need}")]
    MetaTooSmall { need: u64, got: u64 },
    #[error("no valid mirror record on the metadata device")]
    NoRecord,
    #[error("the mirror record belongs to another mirror (tag {found:#x}, expected {expected:#x}) or another geometry")]
    Foreign { found: u64, expected: u64 },
    #[error("the target failed; the mirror runs on the source alone (abandon this rebuild)")]
    TargetFailed,
    #[error(transparent)]
    Block(#[from] BlockError),
}

/// What one rebuild step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Copied (or resynchronised) one region; `bytes` were read and written
    /// (0 if the region was skipped as zeroes).
    Copied { bytes: u64 },
    /// Every region is on the target and the record says so.
    Done,
}

/// Progress, for `surge status` and progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MirrorProgress {
    pub size: u64,
    pub copied_bytes: u64,
    /// Regions to re-copy after a crash (dirty in the record found at open).
    pub resync_regions: u64,
    /// Regions whose intent bit is set now.
    pub dirty_regions: u64,
    /// Bytes copied since open, and bytes skipped as zeroes.
    pub moved_bytes: u64,
    pub skipped_bytes: u64,
    pub complete: bool,
    pub failed: bool,
    /// Rebuild speed since open (bytes of the device per second, skips included).
    pub rate_bps: Option<f64>,
    pub eta_s: Option<f64>,
    pub elapsed_s: f64,
    /// Rate limit in force (bytes/s), if any.
    pub rate_limit_bps: Option<u64>,
}

impl MirrorProgress {
    pub fn percent(&self) -> f64 {
        if self.size == 0 {
            100.0
        } else {
            self.copied_bytes as f64 * 100.0 / self.size as f64
        }
    }
}

struct St {
    dirty: Vec<u64>,
    /// What a record may claim as `copied` (target flushed through it).
    durable_copied: u64,
    complete: bool,
    failed: bool,
    /// Bumped on every change a record must carry.
    gen: u64,
    resync: BTreeSet<u64>,
    bytes_since_persist: u64,
    persisted_at: Duration,
}

impl St {
    fn bit(&self, r: u64) -> bool {
        self.dirty[(r / 64) as usize] & (1 << (r % 64)) != 0
    }
    fn set(&mut self, r: u64, on: bool) {
        let w = &mut self.dirty[(r / 64) as usize];
        if on {
            *w |= 1 << (r % 64);
        } else {
            *w &= !(1 << (r % 64));
        }
    }
    fn dirty_regions(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty.iter().enumerate().flat_map(|(i, &w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| i as u64 * 64 + b))
    }
}

struct CommitSt {
    seq: u64,
    newest: usize,
}

struct Clocking {
    opened_at: Duration,
    moved: u64,
    skipped: u64,
    copied_at_open: u64,
}

/// See the module docs.
pub struct Mirror {
    source: Arc<dyn BlockDev>,
    target: Arc<dyn BlockDev>,
    meta: Arc<dyn BlockDev>,
    cfg: MirrorConfig,
    tag: u64,
    clock: Arc<dyn Clock>,
    size: u64,
    nregions: u64,
    copy_len: u64,
    locks: Vec<RwLock<()>>,
    /// Regions below this are on the target (in memory; the record may lag).
    copied: AtomicU64,
    failed: AtomicBool,
    /// The record generation that carries the failure (valid once `failed`).
    failed_gen: AtomicU64,
    /// Writes to the source, against its flushes.
    ledger: FlushLedger,
    /// Held exclusively by a flush of the target until its outcome is
    /// settled; a read balanced onto the target takes it shared, or reads
    /// the source if a flush holds it.
    target_flush: RwLock<()>,
    /// Per region: writes started and finished (dirty regions are cleared only
    /// when no write touched them since a flush of both legs).
    started: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
    st: Mutex<St>,
    durable_gen: AtomicU64,
    commit: Mutex<CommitSt>,
    rr: AtomicU64,
    rate_limit: AtomicU64,
    clocking: Mutex<Clocking>,
}

/// Counts a write on the regions it touches from start to drop.
struct WriteMark<'a> {
    m: &'a Mirror,
    regions: std::ops::Range<u64>,
}

impl Drop for WriteMark<'_> {
    fn drop(&mut self) {
        for r in self.regions.clone() {
            self.m.done[r as usize].fetch_add(1, SeqCst);
        }
    }
}

fn all_zero(ext: &[Extent], len: u64) -> bool {
    ext.iter().all(|e| matches!(e.kind, ExtentKind::Hole | ExtentKind::Zero)) && ext.iter().map(|e| e.len).sum::<u64>() >= len
}

impl Mirror {
    fn build(source: Arc<dyn BlockDev>, target: Arc<dyn BlockDev>, meta: Arc<dyn BlockDev>, cfg: MirrorConfig, tag: u64, clock: Arc<dyn Clock>) -> std::result::Result<Self, MirrorError> {
        if !cfg.region.is_power_of_two() || cfg.region < 4096 {
            return Err(MirrorError::BadRegion(cfg.region));
        }
        let size = source.size();
        if target.size() < size {
            return Err(MirrorError::TargetTooSmall { source_size: size, target: target.size() });
        }
        let need = meta::required_size(size, cfg.region);
        if meta.size() < need {
            return Err(MirrorError::MetaTooSmall { need, got: meta.size() });
        }
        let nregions = size.div_ceil(cfg.region);
        let now = clock.now();
        Ok(Mirror {
            cfg,
            tag,
            size,
            nregions,
            copy_len: meta::copy_len(nregions),
            locks: (0..nregions.clamp(1, MAX_LOCKS)).map(|_| RwLock::new(())).collect(),
            copied: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failed_gen: AtomicU64::new(0),
            ledger: FlushLedger::new(),
            target_flush: RwLock::new(()),
            started: (0..nregions).map(|_| AtomicU64::new(0)).collect(),
            done: (0..nregions).map(|_| AtomicU64::new(0)).collect(),
            st: Mutex::new(St {
                dirty: vec![0; nregions.div_ceil(64) as usize],
                durable_copied: 0,
                complete: false,
                failed: false,
                gen: 0,
                resync: BTreeSet::new(),
                bytes_since_persist: 0,
                persisted_at: now,
            }),
            durable_gen: AtomicU64::new(0),
            commit: Mutex::new(CommitSt { seq: 0, newest: 1 }),
            rr: AtomicU64::new(0),
            rate_limit: AtomicU64::new(0),
            clocking: Mutex::new(Clocking { opened_at: now, moved: 0, skipped: 0, copied_at_open: 0 }),
            source,
            target,
            meta,
            clock,
        })
    }

    /// Start a new rebuild of `source` onto `target`: both record copies are
    /// written (position 0) before this returns. `tag` identifies the pair
    /// (e.g. a hash of the target volume's id) and is checked by [`Mirror::open`].
    pub fn create(source: Arc<dyn BlockDev>, target: Arc<dyn BlockDev>, meta: Arc<dyn BlockDev>, cfg: MirrorConfig, tag: u64, clock: Arc<dyn Clock>) -> std::result::Result<Self, MirrorError> {
        let m = Self::build(source, target, meta, cfg, tag, clock)?;
        for copy in 0..2 {
            let mut c = m.commit.lock();
            c.newest = 1 - copy;
            m.commit_locked(&mut c)?;
        }
        Ok(m)
    }

    /// Resume after a restart (or crash) from the newest valid record: regions
    /// whose intent bit is set are re-copied before anything else, and read
    /// from the source until then.
    pub fn open(source: Arc<dyn BlockDev>, target: Arc<dyn BlockDev>, meta: Arc<dyn BlockDev>, cfg: MirrorConfig, tag: u64, clock: Arc<dyn Clock>) -> std::result::Result<Self, MirrorError> {
        let m = Self::build(source, target, meta, cfg, tag, clock)?;
        let (copy, rec) = m.read_newest()?.ok_or(MirrorError::NoRecord)?;
        if rec.tag != tag || rec.size != m.size || rec.region != m.cfg.region {
            return Err(MirrorError::Foreign { found: rec.tag, expected: tag });
        }
        if rec.failed() {
            return Err(MirrorError::TargetFailed);
        }
        {
            let mut st = m.st.lock();
            for r in 0..rec.copied {
                if rec.is_dirty(r) {
                    st.set(r, true);
                    st.resync.insert(r);
                }
            }
            st.durable_copied = rec.copied;
            st.complete = rec.complete() && st.resync.is_empty();
        }
        m.copied.store(rec.copied, SeqCst);
        *m.commit.lock() = CommitSt { seq: rec.seq, newest: copy };
        m.clocking.lock().copied_at_open = rec.copied;
        tracing::info!(copied = rec.copied, of = m.nregions, resync = m.st.lock().resync.len(), "mirror record recovered");
        Ok(m)
    }

    /// Newest valid record on the metadata device, with its copy index.
    fn read_newest(&self) -> Result<Option<(usize, Record)>> {
        let mut best: Option<(usize, Record)> = None;
        for copy in 0..2 {
            let mut buf = vec![0u8; self.copy_len as usize];
            self.meta.read_at(&mut buf, copy as u64 * self.copy_len)?;
            if let Ok(r) = decode(&buf) {
                if best.as_ref().is_none_or(|(_, b)| r.seq > b.seq) {
                    best = Some((copy, r));
                }
            }
        }
        Ok(best)
    }

    /// Write the current state into the older copy and flush.
    fn commit_locked(&self, c: &mut CommitSt) -> Result<()> {
        let (rec, gen) = {
            let st = self.st.lock();
            let mut dirty = vec![0u8; self.nregions.div_ceil(8) as usize];
            for r in st.dirty_regions() {
                dirty[(r / 8) as usize] |= 1 << (r % 8);
            }
            let flags = if st.complete { FLAG_COMPLETE } else { 0 } | if st.failed { FLAG_FAILED } else { 0 };
            let rec = Record { seq: c.seq + 1, tag: self.tag, size: self.size, region: self.cfg.region, copied: st.durable_copied, flags, nregions: self.nregions, dirty };
            (rec, st.gen)
        };
        let copy = 1 - c.newest;
        self.meta.write_at(&rec.encode(), copy as u64 * self.copy_len, false)?;
        self.meta.flush()?;
        c.seq += 1;
        c.newest = copy;
        self.durable_gen.fetch_max(gen, SeqCst);
        Ok(())
    }

    /// Make every change up to generation `gen` durable (group commit).
    fn wait_durable(&self, gen: u64) -> Result<()> {
        if self.durable_gen.load(SeqCst) >= gen {
            return Ok(());
        }
        let mut c = self.commit.lock();
        if self.durable_gen.load(SeqCst) >= gen {
            return Ok(());
        }
        self.commit_locked(&mut c)
    }

    fn commit_now(&self) -> Result<()> {
        let gen = {
            let mut st = self.st.lock();
            st.gen += 1;
            st.gen
        };
        self.wait_durable(gen)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size
    }

    pub fn source(&self) -> &Arc<dyn BlockDev> {
        &self.source
    }

    pub fn target(&self) -> &Arc<dyn BlockDev> {
        &self.target
    }

    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Rebuild rate limit in bytes/s; `None` or 0: as fast as the legs allow.
    pub fn set_rate_limit(&self, bps: Option<u64>) {
        self.rate_limit.store(bps.unwrap_or(0), SeqCst);
    }

    pub fn rate_limit(&self) -> Option<u64> {
        Some(self.rate_limit.load(SeqCst)).filter(|&r| r > 0)
    }

    pub fn is_complete(&self) -> bool {
        self.st.lock().complete
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(SeqCst)
    }

    /// Why acknowledged writes may have been lost (a source flush failed), if they may.
    pub fn loss(&self) -> Option<String> {
        self.ledger.loss()
    }

    /// The user accepts the loss: FLUSH works again.
    pub fn acknowledge_loss(&self) -> Option<String> {
        self.ledger.acknowledge()
    }

    /// Before the target takes the source's place: with no I/O in flight
    /// (the caller holds off every request), flush both legs. `Ok(true)` if
    /// the rebuild is complete and the target holds every acknowledged write,
    /// durably; `Ok(false)` if the target failed (the source is the one to keep).
    pub fn seal(&self) -> Result<bool> {
        self.flush_source()?;
        self.ledger.check()?;
        if self.failed.load(SeqCst) {
            return Ok(false);
        }
        if self.flush_target().is_err() {
            return Ok(false);
        }
        Ok(self.is_complete() && !self.failed.load(SeqCst))
    }

    pub fn progress(&self) -> MirrorProgress {
        let (resync, dirty, complete, failed) = {
            let st = self.st.lock();
            (st.resync.len() as u64, st.dirty_regions().count() as u64, st.complete, st.failed)
        };
        let copied = (self.copied.load(SeqCst) * self.cfg.region).min(self.size);
        let c = self.clocking.lock();
        let elapsed = self.clock.now().saturating_sub(c.opened_at).as_secs_f64();
        let done_since_open = copied.saturating_sub((c.copied_at_open * self.cfg.region).min(self.size));
        let rate = (elapsed > 0.0 && done_since_open > 0).then(|| done_since_open as f64 / elapsed);
        let remaining = (self.size - copied) + resync * self.cfg.region;
        let eta_s = if complete { Some(0.0) } else { rate.map(|r| remaining as f64 / r) };
        MirrorProgress {
            size: self.size,
            copied_bytes: copied,
            resync_regions: resync,
            dirty_regions: dirty,
            moved_bytes: c.moved,
            skipped_bytes: c.skipped,
            complete,
            failed,
            rate_bps: rate,
            eta_s,
            elapsed_s: elapsed,
            rate_limit_bps: self.rate_limit(),
        }
    }

    fn region_range(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / self.cfg.region..(offset + len - 1) / self.cfg.region + 1
    }

    fn lock_index(&self, r: u64) -> usize {
        (r % self.locks.len() as u64) as usize
    }

    /// Shared guards of every lock the regions use, in lock order.
    fn share(&self, regions: std::ops::Range<u64>) -> Vec<RwLockReadGuard<'_, ()>> {
        let n = self.locks.len() as u64;
        let ids: BTreeSet<usize> = if regions.end - regions.start >= n { (0..n as usize).collect() } else { regions.map(|r| self.lock_index(r)).collect() };
        ids.into_iter().map(|i| self.locks[i].read()).collect()
    }

    /// The target failed: go on with the source alone, and record it (so a
    /// restart abandons the rebuild instead of trusting the target). A record
    /// that cannot be written now is tried again by the next write or FLUSH
    /// ([`Mirror::failure_recorded`]).
    fn fail_target(&self, cause: &BlockError) {
        let gen = {
            let mut st = self.st.lock();
            if st.failed {
                return;
            }
            st.failed = true;
            st.gen += 1;
            st.gen
        };
        self.failed_gen.store(gen, SeqCst);
        self.failed.store(true, SeqCst);
        tracing::error!(%cause, "mirror target failed; continuing on the source alone");
        if let Err(e) = self.wait_durable(gen) {
            tracing::error!("recording the mirror target's failure: {e}; writes and FLUSHes fail until it is recorded");
        }
    }

    /// After a target failure, `Ok` once a record says so (writing it if
    /// needed): only then may a write reach the source alone or a FLUSH be
    /// acknowledged, or a crash would bring back a target that lacks them.
    fn failure_recorded(&self) -> Result<()> {
        if !self.failed.load(SeqCst) {
            return Ok(());
        }
        self.wait_durable(self.failed_gen.load(SeqCst))
    }

    /// Flush the target; a failure fails it. Reads of the target wait out
    /// the flush ([`Mirror::target_flush`]): a failed one may drop what the
    /// target held before the mirror knows it failed.
    fn flush_target(&self) -> Result<()> {
        let _no_target_reads = self.target_flush.write();
        let r = self.target.flush();
        if let Err(e) = &r {
            self.fail_target(e);
        }
        r
    }

    /// Flush the source, settling its writes in the ledger. A failed flush
    /// may have dropped writes the target already holds, so that reads would
    /// flip between the legs: every region written since the legs were last
    /// flushed together (its intent bit is set) is copied again from the
    /// source before either leg serves it, and so is every region copied
    /// since the position was last recorded (the copy may hold what the
    /// source lost).
    fn flush_source(&self) -> Result<()> {
        let after_failure = |r: &Result<()>| {
            if r.is_err() {
                let mut st = self.st.lock();
                self.copied.fetch_min(st.durable_copied, SeqCst);
                let dirty: Vec<u64> = st.dirty_regions().collect();
                st.resync.extend(dirty);
                if !st.resync.is_empty() || self.copied.load(SeqCst) < self.nregions {
                    st.complete = false;
                }
            }
        };
        self.ledger.flush_settled("a source flush", || self.source.flush(), after_failure)
    }

    /// A mutation: source always, target for the part in copied regions (after
    /// their intent bits are durable).
    fn mutate(&self, offset: u64, len: u64, op: impl Fn(&dyn BlockDev, u64, u64) -> Result<()>) -> Result<()> {
        check_range(self.size, offset, len)?;
        let regions = self.region_range(offset, len);
        let _guards = self.share(regions.clone());
        let _counted = self.ledger.begin();
        if self.failed.load(SeqCst) {
            self.failure_recorded()?;
            return op(self.source.as_ref(), offset, len);
        }
        let copied = self.copied.load(SeqCst);
        let both = regions.start..regions.end.min(copied);
        let _mark = if both.is_empty() {
            None
        } else {
            for r in both.clone() {
                self.started[r as usize].fetch_add(1, SeqCst);
            }
            let mark = WriteMark { m: self, regions: both.clone() };
            let gen = {
                let mut st = self.st.lock();
                let mut changed = false;
                for r in both.clone() {
                    if !st.bit(r) {
                        st.set(r, true);
                        changed = true;
                    }
                }
                if changed {
                    st.gen += 1;
                }
                st.gen
            };
            self.wait_durable(gen)?;
            Some(mark)
        };
        if let Err(e) = op(self.source.as_ref(), offset, len) {
            // A failed write may have landed in part (torn): the legs may
            // differ in the copied regions it covers until they are copied again.
            if !both.is_empty() {
                let mut st = self.st.lock();
                st.resync.extend(both.clone());
                st.complete = false;
            }
            return Err(e);
        }
        if !both.is_empty() && !self.failed.load(SeqCst) {
            let end = (offset + len).min(both.end * self.cfg.region);
            if let Err(e) = op(self.target.as_ref(), offset, end - offset) {
                // The region's intent bit is durable: a restart that still
                // trusts the target copies this region again.
                self.fail_target(&e);
            }
        }
        Ok(())
    }

    /// Copy region `r` (its lock held exclusively): skip it if both legs read
    /// as zeroes, else read the source and write the target. With `advance`,
    /// `copied` moves past `r` before the lock is released: a write that takes
    /// the lock next must see the region as copied and reach the target too;
    /// without, `r` leaves the resync set.
    fn copy_region(&self, r: u64, advance: bool) -> std::result::Result<u64, MirrorError> {
        let _g = self.locks[self.lock_index(r)].write();
        let failures = self.ledger.failures();
        let moved = self.copy_locked(r)?;
        // A source flush that failed meanwhile may have dropped what was
        // copied (and moved the position back, or sent the region to resync):
        // then the copy counts for nothing. Checked under the state lock,
        // which the failure's settlement takes after counting it.
        let mut st = self.st.lock();
        if self.ledger.failures() == failures {
            if advance {
                let _ = self.copied.compare_exchange(r, r + 1, SeqCst, SeqCst);
            } else {
                st.resync.remove(&r);
            }
        }
        Ok(moved)
    }

    fn copy_locked(&self, r: u64) -> std::result::Result<u64, MirrorError> {
        let off = r * self.cfg.region;
        let len = self.cfg.region.min(self.size - off);
        if self.cfg.skip_zero && all_zero(&self.source.block_status(off, len)?, len) {
            let t = self.target.block_status(off, len);
            if t.is_ok_and(|e| all_zero(&e, len)) {
                self.clocking.lock().skipped += len;
                return Ok(0);
            }
            if let Err(e) = self.target.write_zeroes(off, len, ZeroMode { may_trim: true, fast_only: false }) {
                self.fail_target(&e);
                return Err(MirrorError::TargetFailed);
            }
            self.clocking.lock().moved += len;
            return Ok(len);
        }
        let mut buf = vec![0u8; len as usize];
        self.source.read_at(&mut buf, off)?;
        if let Err(e) = self.target.write_at(&buf, off, false) {
            self.fail_target(&e);
            return Err(MirrorError::TargetFailed);
        }
        self.clocking.lock().moved += len;
        Ok(len)
    }

    /// Flush both legs and record the position; then clear idle intent bits.
    /// The source is flushed too: a copied region may hold a write that was
    /// still volatile on the source when it was copied (before the region was
    /// copied, writes go to the source alone), and after a power cut the legs
    /// would then differ in a region the record calls clean.
    fn persist_position(&self) -> std::result::Result<(), MirrorError> {
        let c = self.copied.load(SeqCst);
        self.flush_source()?;
        if self.flush_target().is_err() {
            return Err(MirrorError::TargetFailed);
        }
        {
            let mut st = self.st.lock();
            // A failed source flush meanwhile may have moved the position back.
            st.durable_copied = st.durable_copied.max(c.min(self.copied.load(SeqCst)));
            st.bytes_since_persist = 0;
            st.persisted_at = self.clock.now();
        }
        self.commit_now()?;
        self.clear_idle()
    }

    /// Clear intent bits of regions that no write touched since both legs
    /// were last flushed (bounded work: the record shrinks, a crash re-copies less).
    pub fn clear_idle(&self) -> std::result::Result<(), MirrorError> {
        let candidates: Vec<(u64, u64)> = {
            let st = self.st.lock();
            st.dirty_regions()
                .filter(|r| !st.resync.contains(r))
                .filter_map(|r| {
                    let s = self.started[r as usize].load(SeqCst);
                    (s == self.done[r as usize].load(SeqCst)).then_some((r, s))
                })
                .collect()
        };
        if candidates.is_empty() || self.failed.load(SeqCst) {
            return Ok(());
        }
        self.flush_source()?;
        if self.flush_target().is_err() {
            return Err(MirrorError::TargetFailed);
        }
        {
            let mut st = self.st.lock();
            for (r, s) in candidates {
                // A source flush that failed since the candidates were picked
                // sent the region to resync: it stays dirty.
                if self.started[r as usize].load(SeqCst) == s && !st.resync.contains(&r) {
                    st.set(r, false);
                }
            }
        }
        self.commit_now()?;
        Ok(())
    }

    /// One unit of rebuild work: re-copy a region left dirty by a crash, or copy
    /// the next region, or (once all are copied) record completion.
    pub fn rebuild_step(&self) -> std::result::Result<Step, MirrorError> {
        if self.failed.load(SeqCst) {
            return Err(MirrorError::TargetFailed);
        }
        let resync = self.st.lock().resync.first().copied();
        if let Some(r) = resync {
            let bytes = self.copy_region(r, false)?;
            return Ok(Step::Copied { bytes });
        }
        let r = self.copied.load(SeqCst);
        if r < self.nregions {
            let bytes = self.copy_region(r, true)?;
            let due = {
                let mut st = self.st.lock();
                st.bytes_since_persist += self.cfg.region;
                st.bytes_since_persist >= self.cfg.persist_every || self.clock.now().saturating_sub(st.persisted_at) >= self.cfg.persist_interval
            };
            if due {
                self.persist_position()?;
            }
            return Ok(Step::Copied { bytes });
        }
        if !self.st.lock().complete {
            self.persist_position()?;
            self.st.lock().complete = true;
            self.commit_now()?;
            tracing::info!(bytes = self.size, "mirror rebuild complete");
        }
        Ok(Step::Done)
    }
}

impl BlockDev for Mirror {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        let (s, t) = (self.source.caps(), self.target.caps());
        Caps {
            read_only: s.read_only || t.read_only,
            volatile_cache: s.volatile_cache || t.volatile_cache,
            discard: s.discard && t.discard,
            fast_zero: s.fast_zero && t.fast_zero,
            block_status: s.block_status,
            multi_conn: s.multi_conn && t.multi_conn,
            preferred_block: s.preferred_block.max(t.preferred_block),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let end = offset + buf.len() as u64;
        let copied = self.copied.load(SeqCst) * self.cfg.region;
        let use_target = self.cfg.balance_reads && !self.failed.load(SeqCst) && end <= copied && !buf.is_empty() && self.rr.fetch_add(1, SeqCst) % 2 == 1 && {
            let st = self.st.lock();
            st.resync.is_empty() || !self.region_range(offset, buf.len() as u64).any(|r| st.resync.contains(&r))
        };
        if use_target {
            if let Some(_settled) = self.target_flush.try_read() {
                if !self.failed.load(SeqCst) {
                    match self.target.read_at(buf, offset) {
                        Ok(()) => return Ok(()),
                        Err(e) => self.fail_target(&e),
                    }
                }
            }
        }
        self.source.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.mutate(offset, buf.len() as u64, |d, off, len| d.write_at(&buf[(off - offset) as usize..][..len as usize], off, fua))
    }

    fn flush(&self) -> Result<()> {
        self.flush_source()?;
        if !self.failed.load(SeqCst) {
            let _ = self.flush_target();
        }
        self.failure_recorded()?;
        self.ledger.check()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        // Both legs must agree afterwards, so discard is "write zeroes, may trim".
        self.write_zeroes(offset, len, ZeroMode { may_trim: true, fast_only: false })
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.mutate(offset, len, |d, off, l| d.write_zeroes(off, l, mode))
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.source.block_status(offset, len)
    }

    /// Writes go to both legs and reads may be balanced onto the target.
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.source.may_wait_remote(offset, len, write) || (!self.failed.load(SeqCst) && self.target.may_wait_remote(offset, len, write))
    }
}

/// A rebuild running on its own thread; stops (between steps) on drop.
pub struct Rebuilder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<std::result::Result<(), MirrorError>>>,
}

impl Rebuilder {
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Stop and return how the rebuild ended (Ok if stopped or complete).
    pub fn stop(mut self) -> std::result::Result<(), MirrorError> {
        self.stop.store(true, SeqCst);
        self.handle.take().map_or(Ok(()), |h| h.join().unwrap_or(Err(MirrorError::Block(BlockError::Gone("rebuild thread panicked".into())))))
    }
}

impl Drop for Rebuilder {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Run `mirror`'s rebuild to completion on a thread, paced to its rate limit
/// on `clock` (sleeps are cut into pieces of at most `poll` so a stop is
/// noticed). The thread is registered with the clock before this returns.
pub fn spawn_rebuild(mirror: Arc<Mirror>, clock: Arc<dyn Clock>, name: String, poll: Duration) -> Rebuilder {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let handle = spawn_registered(name, clock.clone(), move || {
        let mut next = clock.now();
        while !s.load(SeqCst) {
            let started = clock.now();
            match mirror.rebuild_step()? {
                Step::Done => return Ok(()),
                Step::Copied { bytes } => {
                    let Some(rate) = mirror.rate_limit() else { continue };
                    if bytes == 0 {
                        continue;
                    }
                    next = next.max(started) + Duration::from_secs_f64(bytes as f64 / rate as f64);
                    while clock.now() < next && !s.load(SeqCst) {
                        clock.sleep_until(next.min(clock.now() + poll));
                    }
                }
            }
        }
        Ok(())
    })
    .expect("spawn rebuild thread");
    Rebuilder { stop, handle: Some(handle) }
}

#[cfg(test)]
mod tests;
