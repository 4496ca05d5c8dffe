//! RAID-0: one device striped over N member devices in chunks.
//!
//! Chunk `k` of the striped device lives on member `k % N`, at member offset
//! `(k / N) * chunk`. Members are any `Arc<dyn BlockDev>` (cloud volumes, NBD
//! client devices, mirrors during a rebuild) of at least the member size; a
//! member may be replaced online ([`Stripe::replace`]) by a device of at least
//! the same size holding the same data (a finished mirror rebuild) or, for
//! caches and scratch space, by an empty one.
//!
//! A request is split at chunk boundaries; pieces on different members run on
//! scoped threads in parallel when [`StripeConfig::parallel`] is set (threads are
//! spawned only for requests touching two or more members), else in order.
//! Each member slot has a read-write lock held (shared) for the duration of an
//! I/O on it, so `replace` waits for in-flight requests on the old member and
//! returns it idle.
//!
//! A member flush that fails may have dropped acknowledged writes (see
//! [`crate::ledger`]): every later FLUSH fails until the loss is acknowledged.

use crate::dev::{check_range, BlockDev, Caps, Extent, ExtentKind, ZeroMode};
use crate::error::{BlockError, Result};
use crate::ledger::FlushLedger;
use parking_lot::RwLock;
use std::ops::Range;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeConfig {
    /// Bytes per chunk (a power of two, at least 4 KiB).
    pub chunk: u64,
    /// Run the pieces of a multi-member request on parallel threads.
    pub parallel: bool,
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig { chunk: 64 * 1024, parallel: true }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StripeError {
    #[error("a stripe needs at least one member")]
    NoMembers,
    #[error("chunk size {0} must be a power of two of at least 4096 bytes")]
    BadChunk(u64),
    #[error("member {index} holds {size} bytes, less than one chunk of {chunk}")]
    MemberTooSmall { index: usize, size: u64, chunk: u64 },
    #[error("no member {index} (the stripe has {members})")]
    NoSuchMember { index: usize, members: usize },
    #[error("replacement for member {index} holds {got} bytes; it needs at least {need}")]
    ReplacementTooSmall { index: usize, need: u64, got: u64 },
}

/// One piece of a request: a range of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub member: usize,
    pub member_offset: u64,
    /// Range of the request's buffer (bytes from the request's offset).
    pub buf: Range<usize>,
}

pub struct Stripe {
    cfg: StripeConfig,
    /// Usable bytes of every member (a whole number of chunks).
    member_size: u64,
    slots: Vec<RwLock<Arc<dyn BlockDev>>>,
    /// Writes, against member flushes.
    ledger: FlushLedger,
}

impl Stripe {
    /// Stripe over `members`; the size is N times the smallest member, rounded
    /// down to whole chunks.
    pub fn new(members: Vec<Arc<dyn BlockDev>>, cfg: StripeConfig) -> std::result::Result<Self, StripeError> {
        if members.is_empty() {
            return Err(StripeError::NoMembers);
        }
        if !cfg.chunk.is_power_of_two() || cfg.chunk < 4096 {
            return Err(StripeError::BadChunk(cfg.chunk));
        }
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        if let Some((index, m)) = members.iter().enumerate().find(|(_, m)| m.size() < cfg.chunk) {
            return Err(StripeError::MemberTooSmall { index, size: m.size(), chunk: cfg.chunk });
        }
        let member_size = smallest / cfg.chunk * cfg.chunk;
        Ok(Stripe { cfg, member_size, slots: members.into_iter().map(RwLock::new).collect(), ledger: FlushLedger::new() })
    }

    pub fn config(&self) -> StripeConfig {
        self.cfg
    }

    pub fn members(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of each member the stripe uses.
    pub fn member_size(&self) -> u64 {
        self.member_size
    }

    /// The device in slot `index` now.
    pub fn member(&self, index: usize) -> Option<Arc<dyn BlockDev>> {
        self.slots.get(index).map(|s| s.read().clone())
    }

    /// Put `dev` in slot `index` once every I/O in flight on the old member has
    /// finished; returns the old member, now idle. Requests issued meanwhile wait.
    pub fn replace(&self, index: usize, dev: Arc<dyn BlockDev>) -> std::result::Result<Arc<dyn BlockDev>, StripeError> {
        let slot = self.slots.get(index).ok_or(StripeError::NoSuchMember { index, members: self.slots.len() })?;
        if dev.size() < self.member_size {
            return Err(StripeError::ReplacementTooSmall { index, need: self.member_size, got: dev.size() });
        }
        let mut g = slot.write();
        Ok(std::mem::replace(&mut *g, dev))
    }

    /// Decide what goes in slot `index` with no I/O in flight on it: `decide`
    /// sees the member there and runs while requests to the slot wait (for
    /// checks and records that must happen atomically with the switch);
    /// `Some(dev)` puts `dev` in the slot and returns the old member.
    pub fn replace_with<E: From<StripeError>>(&self, index: usize, decide: impl FnOnce(&Arc<dyn BlockDev>) -> std::result::Result<Option<Arc<dyn BlockDev>>, E>) -> std::result::Result<Option<Arc<dyn BlockDev>>, E> {
        let slot = self.slots.get(index).ok_or(StripeError::NoSuchMember { index, members: self.slots.len() })?;
        let mut g = slot.write();
        let Some(dev) = decide(&g)? else { return Ok(None) };
        if dev.size() < self.member_size {
            return Err(StripeError::ReplacementTooSmall { index, need: self.member_size, got: dev.size() }.into());
        }
        Ok(Some(std::mem::replace(&mut *g, dev)))
    }

    /// Why acknowledged writes may have been lost (a member flush failed), if they may.
    pub fn loss(&self) -> Option<String> {
        self.ledger.loss()
    }

    /// The user accepts the loss: FLUSH works again.
    pub fn acknowledge_loss(&self) -> Option<String> {
        self.ledger.acknowledge()
    }

    /// Where `[offset, offset+len)` of the striped device lives, chunk by chunk.
    pub fn map(&self, offset: u64, len: u64) -> Vec<Piece> {
        self.pieces(offset, len).collect()
    }

    /// The pieces of [`Stripe::map`] one at a time (nothing allocated: the
    /// request path asks `may_wait_remote` of every request).
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let n = self.slots.len() as u64;
        let chunk = self.cfg.chunk;
        let mut done = 0u64;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let pos = offset + done;
                let (k, within) = (pos / chunk, pos % chunk);
                let take = (chunk - within).min(len - done);
                let p = Piece { member: (k % n) as usize, member_offset: (k / n) * chunk + within, buf: done as usize..(done + take) as usize };
                done += take;
                p
            })
        })
    }

    /// Run `f` on every piece, with the member's slot held shared; pieces of
    /// different members in parallel when configured and worthwhile.
    fn each_piece(&self, pieces: &[Piece], f: impl Fn(&dyn BlockDev, &Piece) -> Result<()> + Sync) -> Result<()> {
        let run = |p: &Piece| -> Result<()> {
            let m = self.slots[p.member].read();
            f(m.as_ref(), p)
        };
        let first = pieces.first().map(|p| p.member);
        let multi = pieces.iter().any(|p| Some(p.member) != first);
        if !(self.cfg.parallel && multi) {
            return pieces.iter().try_for_each(run);
        }
        let mut by_member: Vec<Vec<&Piece>> = vec![Vec::new(); self.slots.len()];
        for p in pieces {
            by_member[p.member].push(p);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = by_member
                .iter()
                .filter(|ps| !ps.is_empty())
                .map(|ps| {
                    let run = &run;
                    s.spawn(move || ps.iter().try_for_each(|p| run(p)))
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(BlockError::Gone("stripe worker panicked".into()))))
        })
    }
}

/// Shares a mutable buffer between threads that write disjoint ranges of it.
struct SharedBuf {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: every user writes a distinct range (the pieces of one request never
// overlap), and the buffer outlives the scoped threads.
unsafe impl Sync for SharedBuf {}

impl SharedBuf {
    /// # Safety
    /// Ranges handed out must not overlap while in use.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, r: Range<usize>) -> &mut [u8] {
        assert!(r.start <= r.end && r.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len())
    }
}

impl BlockDev for Stripe {
    fn size(&self) -> u64 {
        self.member_size * self.slots.len() as u64
    }

    fn caps(&self) -> Caps {
        let caps: Vec<Caps> = self.slots.iter().map(|s| s.read().caps()).collect();
        Caps {
            read_only: caps.iter().any(|c| c.read_only),
            volatile_cache: caps.iter().any(|c| c.volatile_cache),
            discard: caps.iter().all(|c| c.discard),
            fast_zero: caps.iter().all(|c| c.fast_zero),
            block_status: caps.iter().all(|c| c.block_status),
            multi_conn: caps.iter().all(|c| c.multi_conn),
            preferred_block: caps.iter().map(|c| c.preferred_block).max().unwrap_or(4096),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        let pieces = self.map(offset, buf.len() as u64);
        let shared = SharedBuf { ptr: buf.as_mut_ptr(), len: buf.len() };
        // SAFETY: pieces of one request cover disjoint ranges of `buf`.
        self.each_piece(&pieces, |m, p| m.read_at(unsafe { shared.range(p.buf.clone()) }, p.member_offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        let pieces = self.map(offset, buf.len() as u64);
        let _counted = self.ledger.begin();
        self.each_piece(&pieces, |m, p| m.write_at(&buf[p.buf.clone()], p.member_offset, fua))
    }

    fn flush(&self) -> Result<()> {
        self.ledger.flush("a member flush", || {
            let mut first_err = None;
            for s in &self.slots {
                let m = s.read().clone();
                if let Err(e) = m.flush() {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })?;
        self.ledger.check()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), offset, len)?;
        let pieces = self.map(offset, len);
        self.each_piece(&pieces, |m, p| m.discard(p.member_offset, p.buf.len() as u64))
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        check_range(self.size(), offset, len)?;
        if mode.fast_only && !self.caps().fast_zero {
            return Err(BlockError::NotSupported("fast zeroing"));
        }
        let pieces = self.map(offset, len);
        let _counted = self.ledger.begin();
        self.each_piece(&pieces, |m, p| m.write_zeroes(p.member_offset, p.buf.len() as u64, mode))
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size(), offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        // Bounded work per call: at most 64 chunks; callers ask again for the rest.
        for p in self.map(offset, len).into_iter().take(64) {
            let want = p.buf.len() as u64;
            let m = self.slots[p.member].read().clone();
            let mut got = 0;
            for e in m.block_status(p.member_offset, want)? {
                let e = Extent { len: e.len.min(want - got), kind: e.kind };
                if e.len == 0 {
                    break;
                }
                got += e.len;
                match out.last_mut() {
                    Some(last) if last.kind == e.kind => last.len += e.len,
                    _ => out.push(e),
                }
            }
            if got < want {
                break; // the member answered for part of the piece only
            }
        }
        if out.is_empty() {
            out.push(Extent { len, kind: ExtentKind::Data });
        }
        Ok(out)
    }

    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), offset, len)?;
        let pieces = self.map(offset, len);
        self.each_piece(&pieces, |m, p| m.prefetch(p.member_offset, p.buf.len() as u64))
    }

    /// Asks only the members the request touches.
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        if check_range(self.size(), offset, len).is_err() {
            return false; // refused at once
        }
        self.pieces(offset, len).any(|p| self.slots[p.member].read().may_wait_remote(p.member_offset, p.buf.len() as u64, write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use crate::memory::MemoryDev;

    fn mem(n: usize, size: u64) -> Vec<Arc<dyn BlockDev>> {
        (0..n).map(|_| Arc::new(MemoryDev::new(size)) as Arc<dyn BlockDev>).collect()
    }

    #[test]
    fn chunks_rotate_over_members() {
        let s = Stripe::new(mem(3, 64 << 10), StripeConfig { chunk: 4096, parallel: false }).unwrap();
        assert_eq!(s.size(), 3 * (64 << 10));
        let p = s.map(4096 * 4 + 100, 8192);
        assert_eq!(
            p,
            vec![
                Piece { member: 1, member_offset: 4096 + 100, buf: 0..3996 },
                Piece { member: 2, member_offset: 4096, buf: 3996..8092 },
                Piece { member: 0, member_offset: 8192, buf: 8092..8192 },
            ]
        );
    }

    #[test]
    fn size_is_members_times_the_smallest_member_in_whole_chunks() {
        let members: Vec<Arc<dyn BlockDev>> = vec![Arc::new(MemoryDev::new(10_000)), Arc::new(MemoryDev::new(50_000))];
        let s = Stripe::new(members, StripeConfig { chunk: 4096, parallel: true }).unwrap();
        assert_eq!(s.member_size(), 8192);
        assert_eq!(s.size(), 16384);
        assert_eq!(Stripe::new(vec![], StripeConfig::default()).err(), Some(StripeError::NoMembers));
        assert_eq!(Stripe::new(mem(2, 1 << 20), StripeConfig { chunk: 3000, parallel: true }).err(), Some(StripeError::BadChunk(3000)));
        let e = Stripe::new(mem(2, 1000), StripeConfig { chunk: 4096, parallel: true }).err().unwrap();
        assert!(matches!(e, StripeError::MemberTooSmall { index: 0, .. }), "{e}");
    }

    fn conformance_with(n: usize, chunk: u64, parallel: bool) {
        conformance::run(&format!("stripe x{n} chunk {chunk} parallel={parallel}"), |size| {
            // Members a little larger than needed, so the stripe size can be exact
            // only through the rounding rule: build for a whole number of chunks,
            // then trim with a sub-device view.
            let per = size.div_ceil(n as u64).div_ceil(chunk) * chunk;
            let s = Arc::new(Stripe::new(mem(n, per), StripeConfig { chunk, parallel }).unwrap());
            Arc::new(Window { inner: s, size })
        });
    }

    /// The first `size` bytes of a device (the conformance suite picks odd sizes).
    struct Window {
        inner: Arc<Stripe>,
        size: u64,
    }

    impl BlockDev for Window {
        fn size(&self) -> u64 {
            self.size
        }
        fn caps(&self) -> Caps {
            self.inner.caps()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            check_range(self.size, offset, buf.len() as u64)?;
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
            check_range(self.size, offset, buf.len() as u64)?;
            self.inner.write_at(buf, offset, fua)
        }
        fn flush(&self) -> Result<()> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> Result<()> {
            check_range(self.size, offset, len)?;
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
            check_range(self.size, offset, len)?;
            self.inner.write_zeroes(offset, len, mode)
        }
    }

    #[test]
    fn stripe_of_three_with_small_chunks_passes_conformance() {
        conformance_with(3, 4096, true);
    }

    #[test]
    fn stripe_of_ten_sequential_passes_conformance() {
        conformance_with(10, 8192, false);
    }

    #[test]
    fn stripe_of_one_passes_conformance() {
        conformance_with(1, 65536, true);
    }

    #[test]
    fn requests_past_the_end_fail_and_change_nothing() {
        let s = Stripe::new(mem(4, 8192), StripeConfig { chunk: 4096, parallel: true }).unwrap();
        assert!(matches!(s.write_at(&[1u8; 10], s.size() - 5, false), Err(BlockError::OutOfRange { .. })));
        assert!(matches!(s.read_at(&mut [0u8; 1], s.size()), Err(BlockError::OutOfRange { .. })));
        assert!(matches!(s.discard(u64::MAX, 2), Err(BlockError::OutOfRange { .. })));
        let mut all = vec![1u8; s.size() as usize];
        s.read_at(&mut all, 0).unwrap();
        assert!(all.iter().all(|&b| b == 0));
    }

    #[test]
    fn data_lands_on_the_member_the_layout_names() {
        let members = mem(4, 1 << 20);
        let s = Stripe::new(members.clone(), StripeConfig { chunk: 65536, parallel: true }).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        s.write_at(&data, 12345, false).unwrap();
        for p in s.map(12345, data.len() as u64) {
            let mut got = vec![0u8; p.buf.len()];
            members[p.member].read_at(&mut got, p.member_offset).unwrap();
            assert_eq!(got, &data[p.buf.clone()], "piece {p:?}");
        }
    }

    #[test]
    fn replace_swaps_a_member_online_and_keeps_what_the_new_one_holds() {
        let members = mem(3, 1 << 20);
        let s = Arc::new(Stripe::new(members.clone(), StripeConfig { chunk: 4096, parallel: true }).unwrap());
        let data = vec![7u8; 3 * 4096 * 4];
        s.write_at(&data, 0, false).unwrap();
        // A copy of member 1 replaces it: nothing changes for the user.
        let copy: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(1 << 20));
        let mut buf = vec![0u8; 1 << 20];
        members[1].read_at(&mut buf, 0).unwrap();
        copy.write_at(&buf, 0, false).unwrap();
        let old = s.replace(1, copy.clone()).unwrap();
        assert!(Arc::ptr_eq(&old, &members[1]));
        let mut got = vec![0u8; data.len()];
        s.read_at(&mut got, 0).unwrap();
        assert_eq!(got, data);
        // Writes now reach the new member only.
        s.write_at(&[9u8; 4096], 4096, false).unwrap();
        let (mut a, mut b) = ([0u8; 1], [0u8; 1]);
        copy.read_at(&mut a, 0).unwrap();
        members[1].read_at(&mut b, 0).unwrap();
        assert_eq!((a[0], b[0]), (9, 7));
        let small: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(4096));
        assert!(matches!(s.replace(0, small), Err(StripeError::ReplacementTooSmall { .. })));
        assert!(matches!(s.replace(5, copy), Err(StripeError::NoSuchMember { .. })));
    }

    /// A device whose I/O takes a while, counting requests in flight.
    struct Slow {
        inner: MemoryDev,
        in_flight: std::sync::atomic::AtomicI64,
    }

    impl BlockDev for Slow {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            self.in_flight.fetch_add(1, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            let r = self.inner.read_at(buf, offset);
            self.in_flight.fetch_sub(1, SeqCst);
            r
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            self.in_flight.fetch_add(1, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            let r = self.inner.write_at(buf, offset, fua);
            self.in_flight.fetch_sub(1, SeqCst);
            r
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replace_returns_the_old_member_only_when_no_request_is_in_flight_on_it() {
        use std::sync::atomic::Ordering::SeqCst;
        let slow = Arc::new(Slow { inner: MemoryDev::new(1 << 20), in_flight: 0.into() });
        let members: Vec<Arc<dyn BlockDev>> = vec![slow.clone(), Arc::new(MemoryDev::new(1 << 20))];
        let s = Arc::new(Stripe::new(members, StripeConfig { chunk: 4096, parallel: true }).unwrap());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while !stop.load(SeqCst) {
                        s.read_at(&mut buf, (w % 2) * 8192).unwrap(); // member 0
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        for _ in 0..5 {
            let old = s.replace(0, Arc::new(MemoryDev::new(1 << 20))).unwrap();
            if Arc::ptr_eq(&old, &(slow.clone() as Arc<dyn BlockDev>)) {
                assert_eq!(slow.in_flight.load(SeqCst), 0, "replace returned while I/O was in flight on the old member");
            }
            s.replace(0, slow.clone()).unwrap();
        }
        stop.store(true, SeqCst);
        workers.into_iter().for_each(|w| w.join().unwrap());
    }

    #[test]
    fn block_status_reports_holes_of_members() {
        let s = Stripe::new(mem(2, 1 << 20), StripeConfig { chunk: 65536, parallel: true }).unwrap();
        s.write_at(&[1u8; 100], 65536 * 3, false).unwrap();
        let ext = s.block_status(0, 4 * 65536).unwrap();
        let total: u64 = ext.iter().map(|e| e.len).sum();
        assert!(total > 0 && total <= 4 * 65536);
        assert_eq!(ext[0].kind, ExtentKind::Hole, "{ext:?}");
        assert!(ext.iter().any(|e| e.kind == ExtentKind::Data), "{ext:?}");
    }

    /// One member fails writes, write-zeroes and flushes (volatile cache) while
    /// four threads read, write, zero and flush: when it always fails, exactly
    /// the writes that touched it and every FLUSH fail to the caller; with random failures, once healed,
    /// every acknowledged write reads back, and after a crash (the member's
    /// cache lost) everything acknowledged before a successful FLUSH does.
    #[test]
    fn errors_of_a_failing_member_reach_the_caller_and_acknowledged_writes_survive() {
        use crate::clock::VirtualClock;
        use crate::fault::{FaultDev, FaultRules};
        use crate::faultcheck::{SectorModel, Workload};

        let (n, chunk, member_size) = (3usize, 4096u64, 256u64 << 10);
        for seed in 1..=6u64 {
            let raw = mem(n, member_size);
            let rules = |s: &str| s.parse::<FaultRules>().unwrap();
            let faulty = Arc::new(FaultDev::new(raw[1].clone(), rules(&format!("volatile,seed={seed}")), Arc::new(VirtualClock::new())));
            let mut members = raw.clone();
            members[1] = faulty.clone();
            let stripe = Stripe::new(members, StripeConfig { chunk, parallel: true }).unwrap();
            let model = SectorModel::new(vec![0u8; stripe.size() as usize]);
            let ack = || {
                stripe.acknowledge_loss();
            };
            // Group of 24 sectors: writes inside one span up to 3 members.
            let w = Workload { threads: 4, ops_per_thread: 300, group: 24, seed };

            // Every op of the member fails: exactly the writes touching it fail.
            faulty.set_rules(rules(&format!("volatile,write.fail_every=1,flush.fail_every=1,zeroes.fail_every=1,seed={seed}")));
            let touches = |off: u64, len: u64| stripe.map(off, len).iter().any(|p| p.member == 1);
            let always = Workload { ops_per_thread: 40, ..w };
            let o = model.run_with(&stripe, &always, &|off, len, ok| assert_eq!(ok, !touches(off, len), "write at {off}+{len}: ok={ok}"), &ack).unwrap();
            assert_eq!(o.flushes_ok, 0, "a FLUSH over a failing member was acknowledged");
            assert!(o.writes_failed > 0 && o.flushes_failed > 0, "{o:?}");

            // Random failures under concurrency, widened races.
            faulty.set_rules(rules(&format!("volatile,write.fail_prob=0.1,zeroes.fail_prob=0.1,flush.fail_prob=0.3,write.spin=20us,seed={seed}")));
            let o = model.run_with(&stripe, &w, &|_, _, _| {}, &ack).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let st = faulty.stats();
            assert!(st.injected[1] > 0 && st.injected[2] > 0 && o.flushes_ok > 0 && o.writes_ok > 0, "faults did not happen: {o:?} {st:?}");

            faulty.set_rules(rules("volatile"));
            model.check_now(&stripe).unwrap_or_else(|e| panic!("seed {seed}, healed: {e}"));
            // Crash: the member's volatile cache is lost; the raw members remain.
            drop(stripe);
            drop(faulty);
            let after = Stripe::new(raw, StripeConfig { chunk, parallel: true }).unwrap();
            model.check_after_crash(&after).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }

    /// A member's flush fails and drops the writes it held: no later FLUSH
    /// may be acknowledged until the loss is acknowledged.
    #[test]
    fn a_member_flush_that_dropped_writes_fails_every_later_flush_until_acknowledged() {
        use crate::clock::VirtualClock;
        use crate::fault::FaultDev;
        let raw = mem(2, 1 << 20);
        let faulty = Arc::new(FaultDev::new(raw[1].clone(), "volatile".parse().unwrap(), Arc::new(VirtualClock::new())));
        let s = Stripe::new(vec![raw[0].clone(), faulty.clone()], StripeConfig { chunk: 4096, parallel: false }).unwrap();
        s.write_at(&[5u8; 4096], 4096, false).unwrap(); // member 1
        faulty.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
        assert!(s.flush().is_err());
        assert!(s.flush().is_err(), "FLUSH acknowledged after a member dropped an acknowledged write");
        assert!(s.acknowledge_loss().is_some());
        s.flush().unwrap();
    }

    #[test]
    fn replace_with_decides_with_no_io_in_flight_and_may_keep_the_member() {
        let s = Stripe::new(mem(2, 1 << 20), StripeConfig { chunk: 4096, parallel: false }).unwrap();
        let kept = s.replace_with::<StripeError>(0, |_| Ok(None)).unwrap();
        assert!(kept.is_none());
        let fresh: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(1 << 20));
        let old = s.replace_with::<StripeError>(0, |_| Ok(Some(fresh.clone()))).unwrap().unwrap();
        assert!(Arc::ptr_eq(&s.member(0).unwrap(), &fresh) && !Arc::ptr_eq(&old, &fresh));
        let small: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(4096));
        assert!(matches!(s.replace_with::<StripeError>(1, |_| Ok(Some(small))), Err(StripeError::ReplacementTooSmall { .. })));
    }
}
