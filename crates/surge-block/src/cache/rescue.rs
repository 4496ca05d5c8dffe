//! After a cache device fails: save its blocks to backing, fence it durably,
//! and keep every request and every restart from seeing stale data meanwhile.
//!
//! A failed device becomes a [`Rescue`]: the blocks whose only durable copy may
//! still be on it (dirty, or written back but not yet covered by a successful
//! backing flush), with their slots. Until a block is copied to backing *and*
//! a backing flush succeeds after the copy, it is served from the failed
//! device (never from backing, which may hold an older version): reads come
//! from its slot (EIO if unreadable), a partial write merges with it, a full
//! rewrite supersedes it. A FLUSH is acknowledged only when every rescue is
//! resolved and the fence record ([`super::fence`]) durably says which blocks
//! (if any) are still only on the failed device: a restart recovers exactly
//! those from it and nothing else, and never reopens a device with none.
//! See docs/cache.md, "Failures".

use super::fence::{FailedCache, LossNote};
use super::meta::{Layout, Meta};
use super::{other_err, pad_to_4k, read_newest, Attached, CacheError, ElasticCache, FResult, Fault};
use crate::dev::BlockDev;
use crate::error::{BlockError, Result};
use parking_lot::RwLockReadGuard;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// First and largest wait between automatic (background) rescue retries; a
/// FLUSH always retries at once.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A failed cache device whose blocks are not all safe on backing yet.
pub(super) struct Rescue {
    label: String,
    /// The device and its layout; `None` while it is not reachable (after a
    /// restart without it).
    dev: Option<(Arc<dyn BlockDev>, Layout)>,
    /// (sequence number, newest copy) of its metadata, to clear it once fenced.
    meta: (u64, usize),
    blocks: BTreeMap<u64, Pending>,
    /// The fence record names this device with `blocks` (or there is no record
    /// and its metadata is cleared). Until then a restart would recover its
    /// whole dirty set, so no FLUSH may be acknowledged.
    recorded: bool,
}

/// A write of a whole rescued block to backing, and its fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Supersede {
    /// Being written.
    Writing,
    /// Written; `direct_done` was `done` just after. A backing flush that
    /// fails before one succeeds with a start mark >= `done` voids it (the
    /// write may be dropped: the device's copy is again the newest that can
    /// exist, and the loss flag is up); one that succeeds confirms it.
    Written { done: u64 },
    Confirmed,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Its slot on the failed device (unknown until the device is read).
    slot: Option<u32>,
    /// Fully written on backing since the failure: never copied from the
    /// device again (its copy is older). See [`Supersede`].
    sup: Option<Supersede>,
    /// The last attempt to read it from the device failed.
    unreadable: bool,
}

/// What `surge status` and the daemon see of a rescue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RescueInfo {
    pub cache_id: u64,
    pub label: String,
    /// Blocks whose only durable copy may still be on the failed device.
    pub pending_blocks: u64,
    /// Of those, the ones it could not be read from (reads of them fail).
    pub unreadable_blocks: u64,
    /// The device is reachable in this process.
    pub device: bool,
}

fn lost_error(block: u64, block_size: u64) -> BlockError {
    BlockError::io(
        "read of a block whose only copy is on a failed, unreadable cache device",
        block * block_size,
        block_size,
        std::io::Error::from_raw_os_error(libc::EIO),
    )
}

fn eio(what: &'static str) -> BlockError {
    BlockError::io(what, 0, 0, std::io::Error::from_raw_os_error(libc::EIO))
}

impl ElasticCache {
    /// Rescues of failed devices listed in the fence record with blocks still
    /// pending (their devices are not reachable until [`ElasticCache::open`]
    /// or [`ElasticCache::provide_rescue_device`] hands them over).
    pub(super) fn rescues_from_record(&self) {
        let Some(store) = &self.fences else { return };
        let f = store.get();
        let mut rescues = self.rescues.lock();
        for (&id, fc) in f.failed.iter().filter(|(_, fc)| !fc.pending.is_empty()) {
            let blocks = fc.pending.iter().map(|&b| (b, Pending { slot: None, sup: None, unreadable: true })).collect();
            rescues.insert(id, Rescue { label: fc.label.clone(), dev: None, meta: (0, 0), blocks, recorded: true });
        }
        self.rescuing.store(!rescues.is_empty(), SeqCst);
        if let Some(l) = f.loss {
            *self.loss.lock() = Some(l.reason);
            self.loss_recorded.store(true, SeqCst);
        }
    }

    /// The cache device failed: it becomes a rescue (see the module docs), and
    /// the request goes on with backing alone. Always true now: a request on
    /// a rescued block is served from the failed device, and a FLUSH fails
    /// until the rescue is resolved.
    pub(super) fn fail_over(&self, failed: &Arc<Attached>, cause: &BlockError) -> bool {
        let mut g = self.attached.write();
        match g.as_ref() {
            Some(a) if Arc::ptr_eq(a, failed) => {}
            _ => return true,
        }
        let att = g.take().expect("checked");
        let blocks: BTreeMap<u64, Pending> = {
            let st = att.state.lock();
            // Unsynced written-back blocks too: their backing copy may not be durable yet.
            st.slots
                .iter()
                .filter(|s| s.dirty || s.unsynced)
                .filter_map(|s| s.block)
                .map(|b| (b, Pending { slot: st.map.get(&b).copied(), sup: None, unreadable: false }))
                .collect()
        };
        let meta = {
            let c = att.commit.lock();
            (c.seq, c.newest_copy)
        };
        let n = blocks.len();
        self.rescues.lock().insert(att.id, Rescue { label: att.label.clone(), dev: Some((att.dev.clone(), att.layout)), meta, blocks, recorded: false });
        self.rescuing.store(true, SeqCst);
        let resolved = self.resolve_locked(None);
        let info = self.rescue_info();
        tracing::error!(
            %cause, cache_id = att.id, label = %att.label, dirty_blocks = n, resolved,
            pending = ?info.iter().map(|r| (r.pending_blocks, r.unreadable_blocks)).collect::<Vec<_>>(),
            "CACHE DEVICE FAILED: fell back to the backing device; blocks not yet safe on backing are served from the failed device and no FLUSH is acknowledged until they are"
        );
        drop(g);
        true
    }

    /// Try to resolve every rescue now (holding the attach lock: no request is
    /// in flight): copy pending blocks from their devices to backing, flush
    /// backing, record what is still pending. True when none is left.
    pub(super) fn resolve_locked(&self, att: Option<&Attached>) -> bool {
        let mut rescues = self.rescues.lock();
        if rescues.is_empty() {
            return true;
        }
        // Copy what can be read. Copies are re-done at every attempt until a
        // backing flush after them succeeds (a failed flush may drop them).
        let mut copied: BTreeSet<(u64, u64)> = BTreeSet::new();
        for (&id, r) in rescues.iter_mut() {
            let Some((dev, layout)) = r.dev.clone() else { continue };
            for (&b, p) in r.blocks.iter_mut().filter(|(_, p)| p.sup.is_none()) {
                let Some(slot) = p.slot else {
                    p.unreadable = true;
                    continue;
                };
                let mut buf = vec![0u8; self.block_len(b) as usize];
                p.unreadable = dev.read_at(&mut buf, layout.slot_offset(slot)).is_err();
                if !p.unreadable && self.backing.write_at(&buf, b * self.block_size, false).is_ok() {
                    copied.insert((id, b));
                }
            }
        }
        let synced = match self.flush_backing_locked(Some(&mut rescues)) {
            Ok(()) => true,
            Err(e) => {
                // Like any failed backing flush: write-backs of an attached cache may be gone.
                if let Some(att) = att {
                    att.state.lock().redirty_unsynced();
                }
                tracing::warn!(%e, "backing flush after copying rescued blocks failed; the failed cache device keeps them");
                false
            }
        };
        let mut done = Vec::new();
        for (&id, r) in rescues.iter_mut() {
            // Durable on backing now: blocks copied or superseded before the flush.
            let keep: BTreeSet<u64> = if synced {
                r.blocks.iter().filter(|&(&b, p)| p.sup != Some(Supersede::Confirmed) && !copied.contains(&(id, b))).map(|(&b, _)| b).collect()
            } else {
                r.blocks.keys().copied().collect()
            };
            r.recorded = match &self.fences {
                Some(store) => {
                    let label = r.label.clone();
                    let res = store.update(&mut |f| {
                        f.failed.insert(id, FailedCache { label: label.clone(), pending: keep.clone() });
                    });
                    if let Err(e) = &res {
                        tracing::error!(%e, cache_id = id, "could not record the failed cache device in the fence record; no FLUSH is acknowledged until it is");
                    }
                    res.is_ok()
                }
                // No record: only a device with nothing pending can be fenced,
                // by clearing its metadata (a dead device may refuse).
                None => keep.is_empty() && self.clear_metadata(id, r).is_ok(),
            };
            if r.recorded {
                r.blocks.retain(|b, _| keep.contains(b));
            }
            if r.recorded && r.blocks.is_empty() {
                if self.fences.is_some() {
                    // Belt and braces: a device that still takes writes names nothing.
                    let _ = self.clear_metadata(id, r);
                }
                done.push(id);
            }
        }
        for id in done {
            let r = rescues.remove(&id).expect("listed");
            tracing::warn!(cache_id = id, label = %r.label, "failed cache device fenced: everything it held is safe on backing; it is never reopened");
        }
        self.rescuing.store(!rescues.is_empty(), SeqCst);
        rescues.is_empty()
    }

    /// Overwrite both metadata copies of a rescued device with empty tables.
    fn clear_metadata(&self, id: u64, r: &Rescue) -> Result<()> {
        let Some((dev, layout)) = &r.dev else { return Err(eio("clearing the metadata of an unreachable cache device")) };
        let mut m = Meta {
            seq: r.meta.0 + 1,
            block_size: self.block_size as u32,
            nslots: layout.nslots,
            backing_size: self.backing.size(),
            // Keep the id: the fence record still names the device by it.
            cache_id: id,
            entries: vec![],
        };
        for copy in [1 - r.meta.1, r.meta.1] {
            dev.write_at(&pad_to_4k(m.encode()), layout.copy_offset(copy), false)?;
            dev.flush()?;
            m.seq += 1;
        }
        Ok(())
    }

    /// Resolve every rescue for a FLUSH: `Err` while any block is not safe on
    /// backing or the fence is not durable.
    pub(super) fn flush_rescues(&self) -> Result<()> {
        if !self.rescuing.load(SeqCst) {
            return Ok(());
        }
        let g = self.attached.write();
        let ok = self.resolve_locked(g.as_deref());
        drop(g);
        if ok {
            *self.rescue_retry.lock() = (Duration::ZERO, RETRY_FIRST);
            return Ok(());
        }
        let info = self.rescue_info();
        let (pending, unreadable): (u64, u64) = info.iter().fold((0, 0), |(p, u), r| (p + r.pending_blocks, u + r.unreadable_blocks));
        tracing::error!(pending, unreadable, "FLUSH refused: blocks of a failed cache device are not yet safe on backing");
        Err(eio("flush: blocks of a failed cache device are not yet safe on backing (acknowledge the loss to give them up)"))
    }

    /// Background retry with backoff (the flusher thread calls it).
    pub(super) fn retry_rescues_when_due(&self) {
        if !self.rescuing.load(SeqCst) {
            return;
        }
        let now = self.clock.now();
        {
            let r = self.rescue_retry.lock();
            if now < r.0 {
                return;
            }
        }
        let ok = {
            let g = self.attached.write();
            self.resolve_locked(g.as_deref())
        };
        let mut r = self.rescue_retry.lock();
        *r = if ok { (Duration::ZERO, RETRY_FIRST) } else { (now + r.1, (r.1 * 2).min(RETRY_MAX)) };
    }

    /// A read of `block` while it may be only on a failed device: from there,
    /// or EIO; `None` when it is not pending.
    pub(super) fn read_rescued(&self, block: u64, at: u64, out: &mut [u8]) -> Option<FResult<()>> {
        let (dev, slot) = self.rescue_source(block)?;
        let r = match (dev, slot) {
            (Some((dev, layout)), Some(slot)) => dev.read_at(out, layout.slot_offset(slot) + at).map_err(|e| {
                tracing::warn!(%e, block, "read of a rescued block from the failed cache device failed");
                self.mark_unreadable(block);
                lost_error(block, self.block_size)
            }),
            _ => Err(lost_error(block, self.block_size)),
        };
        Some(other_err(r))
    }

    /// A write of `block` while it may be only on a failed device: the whole
    /// block goes to backing (merged with the device's copy for a partial
    /// write) and supersedes the copy; `None` when it is not pending.
    pub(super) fn write_rescued(&self, block: u64, at: u64, data: &[u8]) -> Option<FResult<()>> {
        let (dev, slot) = self.rescue_source(block)?;
        let len = self.block_len(block) as usize;
        let mut buf;
        let whole = if at == 0 && data.len() == len {
            data
        } else {
            buf = vec![0u8; len];
            let read = match (dev, slot) {
                (Some((dev, layout)), Some(slot)) => dev.read_at(&mut buf, layout.slot_offset(slot)).is_ok(),
                _ => false,
            };
            if !read {
                // The rest of the block is unreadable: a partial write cannot complete it.
                self.mark_unreadable(block);
                return Some(Err(Fault::Other(lost_error(block, self.block_size))));
            }
            buf[at as usize..at as usize + data.len()].copy_from_slice(data);
            &buf[..]
        };
        // Marked before the write, so that a backing flush failing meanwhile voids it.
        self.set_supersede(block, |_| Some(Supersede::Writing));
        if let Err(e) = self.write_direct(whole, block * self.block_size) {
            self.set_supersede(block, |_| None);
            return Some(Err(Fault::Other(e)));
        }
        let done = self.direct_done.load(SeqCst);
        self.set_supersede(block, |s| (s == Some(Supersede::Writing)).then_some(Supersede::Written { done }));
        self.c.bypassed_bytes.fetch_add(data.len() as u64, Relaxed);
        Some(Ok(()))
    }

    /// Where a pending, not superseded block lives: (device, slot).
    #[allow(clippy::type_complexity)]
    fn rescue_source(&self, block: u64) -> Option<(Option<(Arc<dyn BlockDev>, Layout)>, Option<u32>)> {
        if !self.rescuing.load(SeqCst) {
            return None;
        }
        let rescues = self.rescues.lock();
        rescues.values().find_map(|r| r.blocks.get(&block).filter(|p| p.sup.is_none()).map(|p| (r.dev.clone(), p.slot)))
    }

    /// For a read of `block` while it is superseded on backing but not yet
    /// confirmed: a guard that keeps backing flushes out until the read is
    /// done, taken only if no failed flush voided the supersede meanwhile.
    /// `None` when the block is not in that state (reads take their usual path).
    pub(super) fn hold_superseded(&self, block: u64) -> Option<RwLockReadGuard<'_, ()>> {
        if !self.rescuing.load(SeqCst) {
            return None;
        }
        loop {
            let voided = {
                let rescues = self.rescues.lock();
                let unconfirmed = rescues
                    .values()
                    .find_map(|r| r.blocks.get(&block))
                    .is_some_and(|p| matches!(p.sup, Some(Supersede::Writing | Supersede::Written { .. })));
                if !unconfirmed {
                    return None;
                }
                self.supersedes_voided.load(SeqCst)
            };
            // Not under `rescues`: a flush holding it may wait for this guard.
            let guard = self.superseded_reads.read();
            if self.supersedes_voided.load(SeqCst) == voided {
                return Some(guard);
            }
        }
    }

    fn set_supersede(&self, block: u64, f: impl FnOnce(Option<Supersede>) -> Option<Supersede>) {
        if let Some(p) = self.rescues.lock().values_mut().find_map(|r| r.blocks.get_mut(&block)) {
            p.sup = f(p.sup);
        }
    }

    /// After a backing flush (started when `direct_done` was `done0`): a
    /// success confirms the supersedes written before it started; a failure
    /// voids those not yet confirmed (counted, for `hold_superseded`).
    fn settle_supersedes(&self, rescues: &mut BTreeMap<u64, Rescue>, ok: bool, done0: u64) {
        let mut voided = false;
        for p in rescues.values_mut().flat_map(|r| r.blocks.values_mut()) {
            p.sup = match (p.sup, ok) {
                (Some(Supersede::Written { done }), true) if done <= done0 => Some(Supersede::Confirmed),
                (Some(Supersede::Confirmed), _) => Some(Supersede::Confirmed),
                (s, true) => s,
                (s, false) => {
                    voided |= s.is_some();
                    None
                }
            };
        }
        if voided {
            self.supersedes_voided.fetch_add(1, SeqCst);
        }
    }

    fn mark_unreadable(&self, block: u64) {
        if let Some(p) = self.rescues.lock().values_mut().find_map(|r| r.blocks.get_mut(&block)) {
            p.unreadable = true;
        }
    }

    /// Every rescue in progress.
    pub fn rescue_info(&self) -> Vec<RescueInfo> {
        self.rescues
            .lock()
            .iter()
            .map(|(&id, r)| {
                let live: Vec<&Pending> = r.blocks.values().filter(|p| p.sup.is_none()).collect();
                RescueInfo {
                    cache_id: id,
                    label: r.label.clone(),
                    pending_blocks: live.len() as u64,
                    unreadable_blocks: live.iter().filter(|p| p.unreadable || r.dev.is_none()).count() as u64,
                    device: r.dev.is_some(),
                }
            })
            .collect()
    }

    /// Hand a failed device (reattached, or found after a restart) to its
    /// rescue, matched by the cache id in its metadata, and try to resolve.
    /// `Ok(false)` when no rescue waits for this device.
    pub fn provide_rescue_device(&self, dev: Arc<dyn BlockDev>) -> std::result::Result<bool, CacheError> {
        let layout = self.layout_for(dev.as_ref())?;
        let Some((copy, m)) = read_newest(dev.as_ref(), &layout)? else { return Ok(false) };
        let g = self.attached.write();
        {
            let mut rescues = self.rescues.lock();
            let Some(r) = rescues.get_mut(&m.cache_id).filter(|_| m.cache_id != 0) else { return Ok(false) };
            let slots: BTreeMap<u64, u32> = m.entries.iter().copied().collect();
            // A pending block the metadata does not name was never in a
            // committed snapshot in this version: its acknowledged version is
            // on backing already. (Slots known from before the failure stay.)
            r.blocks.retain(|b, p| p.sup.is_some() || p.slot.is_some() || slots.contains_key(b));
            for (b, p) in r.blocks.iter_mut() {
                if p.slot.is_none() {
                    p.slot = slots.get(b).copied();
                }
            }
            r.dev = Some((dev, layout));
            r.meta = (m.seq, copy);
            tracing::warn!(cache_id = m.cache_id, pending = r.blocks.len(), "a failed cache device is reachable again; rescuing its blocks");
        }
        self.resolve_locked(g.as_deref());
        drop(g);
        Ok(true)
    }

    /// Raise the "acknowledged writes may have been lost" flag: every FLUSH
    /// fails until [`ElasticCache::ack_loss`]. Recorded in the fence record.
    pub(super) fn flag_loss(&self, reason: String) {
        {
            let mut l = self.loss.lock();
            if l.is_some() {
                return;
            }
            tracing::error!(%reason, "ACKNOWLEDGED WRITES MAY HAVE BEEN LOST: every FLUSH fails until the loss is acknowledged");
            *l = Some(reason);
            self.loss_recorded.store(false, SeqCst);
        }
        self.record_loss();
    }

    fn record_loss(&self) {
        let Some(reason) = self.loss.lock().clone() else { return };
        let ok = match &self.fences {
            Some(store) => {
                let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
                store
                    .update(&mut |f| {
                        if f.loss.is_none() {
                            f.loss = Some(LossNote { reason: reason.clone(), since_unix_ms: since });
                        }
                    })
                    .map_err(|e| tracing::error!(%e, "could not record the loss in the fence record (retried at the next FLUSH)"))
                    .is_ok()
            }
            None => true,
        };
        self.loss_recorded.store(ok, SeqCst);
    }

    /// `Err` while the loss flag is up (every FLUSH, on every connection).
    pub(super) fn check_loss(&self) -> Result<()> {
        if self.loss.lock().is_none() {
            return Ok(());
        }
        if !self.loss_recorded.load(SeqCst) {
            self.record_loss();
        }
        Err(eio("flush: acknowledged writes may have been lost since an earlier FLUSH; acknowledge with `surge set NAME/elastic ack_lost=true`"))
    }

    /// The user accepts the loss: FLUSH works again, blocks still only on a
    /// failed device are given up (they read what backing holds) and the device
    /// is fenced. Durable before it returns.
    pub fn ack_loss(&self) -> Result<()> {
        let _g = self.attached.write();
        if let Some(store) = &self.fences {
            store.update(&mut |f| {
                f.loss = None;
                for fc in f.failed.values_mut() {
                    fc.pending.clear();
                }
            })?;
        }
        let mut rescues = self.rescues.lock();
        let (given_up, lost): (usize, Option<String>) = (rescues.values().map(|r| r.blocks.values().filter(|p| p.sup.is_none()).count()).sum(), self.loss.lock().take());
        for (&id, r) in rescues.iter() {
            let _ = self.clear_metadata(id, r);
        }
        rescues.clear();
        self.rescuing.store(false, SeqCst);
        self.loss_recorded.store(true, SeqCst);
        tracing::warn!(given_up_blocks = given_up, loss = ?lost, "the user acknowledged the loss; FLUSH is acknowledged again");
        Ok(())
    }

    /// A write straight to backing (no cache copy keeps it): counted, so that
    /// a failed backing flush that may have dropped it raises the loss flag.
    pub(super) fn write_direct(&self, data: &[u8], pos: u64) -> Result<()> {
        self.direct_started.fetch_add(1, SeqCst);
        let r = self.backing.write_at(data, pos, false);
        self.direct_done.fetch_add(1, SeqCst);
        r
    }

    /// Flush backing. A success covers every direct write completed before it
    /// started; a failure, with a direct write not covered by an earlier
    /// success, may have dropped it (fsyncgate): the loss flag goes up.
    /// Backing flushes are serialized, so their outcomes have an order.
    /// Callers hold the attach lock (read or write), so this never waits on
    /// `resolve_locked`, which holds `rescues` while it flushes.
    pub(super) fn flush_backing(&self) -> Result<()> {
        self.flush_backing_locked(None)
    }

    fn flush_backing_locked(&self, held: Option<&mut BTreeMap<u64, Rescue>>) -> Result<()> {
        let _serial = self.backing_flush.lock();
        // Until settled below (see `superseded_reads`).
        let _no_superseded_reads = self.superseded_reads.write();
        let done = self.direct_done.load(SeqCst);
        let r = self.backing.flush();
        match &r {
            Ok(()) => {
                self.direct_synced.fetch_max(done, SeqCst);
            }
            Err(e) => {
                if self.direct_started.load(SeqCst) > self.direct_synced.load(SeqCst) {
                    self.flag_loss(format!("a backing flush failed ({e}) after writes that went straight to backing; they may be lost"));
                }
            }
        }
        if self.rescuing.load(SeqCst) {
            match held {
                Some(rescues) => self.settle_supersedes(rescues, r.is_ok(), done),
                None => self.settle_supersedes(&mut self.rescues.lock(), r.is_ok(), done),
            }
        }
        r
    }
}
