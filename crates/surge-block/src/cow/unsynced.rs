//! What changed in the overlay since the last flush that succeeded began:
//! blocks made `Data` by a copy from the base or by a guest write, and blocks
//! cleared (made `Zero`). Their new contents may still sit in the overlay's
//! volatile cache, and a failed flush may drop them (see `CowDev::undo_unsynced`).
//!
//! Two generations: a change is noted in the one current when it *finished*,
//! and a flush flips the generation before it starts, so when it succeeds
//! everything in the old generation is on the medium.
//!
//! Blocks made `Data` are also *fresh* (a bit per block, read lock-free):
//! a failed flush may send them back to their old state, so writes to them
//! take the locked path, where they are noted, never the lock-free one.

use parking_lot::Mutex;
use rangemap::RangeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

/// How a block changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Made `Data` by a copy of the base (copy-on-read, the stream job).
    Copied,
    /// Made `Data` (or rewritten while fresh) by a guest write.
    Written,
    /// Made `Zero` (its data area cleared).
    Cleared,
}

#[derive(Default)]
pub struct Generation {
    pub copied: RangeSet<u64>,
    pub written: RangeSet<u64>,
    pub cleared: RangeSet<u64>,
}

impl Generation {
    fn set(&mut self, c: Change) -> &mut RangeSet<u64> {
        match c {
            Change::Copied => &mut self.copied,
            Change::Written => &mut self.written,
            Change::Cleared => &mut self.cleared,
        }
    }

    fn made_data(&self) -> impl Iterator<Item = &Range<u64>> {
        self.copied.iter().chain(self.written.iter())
    }

    fn is_data(&self, b: u64) -> bool {
        self.copied.contains(&b) || self.written.contains(&b)
    }
}

pub struct Unsynced {
    current: AtomicUsize,
    gens: [Mutex<Generation>; 2],
    fresh: Vec<AtomicU64>,
}

impl Unsynced {
    pub fn new(blocks: u64) -> Self {
        Unsynced { current: AtomicUsize::new(0), gens: Default::default(), fresh: (0..blocks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Blocks whose change just finished.
    pub fn note(&self, blocks: Range<u64>, c: Change) {
        if blocks.is_empty() {
            return;
        }
        if c != Change::Cleared {
            self.set_fresh(blocks.clone(), true);
        }
        self.gens[self.current.load(SeqCst)].lock().set(c).insert(blocks);
    }

    /// Whether any block of the range is fresh.
    pub fn any_fresh(&self, blocks: Range<u64>) -> bool {
        blocks.into_iter().any(|b| self.fresh[(b / 64) as usize].load(SeqCst) & (1 << (b % 64)) != 0)
    }

    fn set_fresh(&self, blocks: Range<u64>, on: bool) {
        for b in blocks {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            if on {
                self.fresh[w].fetch_or(bit, SeqCst);
            } else {
                self.fresh[w].fetch_and(!bit, SeqCst);
            }
        }
    }

    /// A flush begins: changes from now on go to the other generation.
    /// Returns the generation the flush covers.
    pub fn flip(&self) -> usize {
        self.current.fetch_xor(1, SeqCst)
    }

    /// The flush that covered generation `g` succeeded: its blocks are no
    /// longer fresh, unless changed again since.
    pub fn synced(&self, g: usize) {
        let old = std::mem::take(&mut *self.gens[g].lock());
        let newer = self.gens[g ^ 1].lock();
        for r in old.made_data() {
            for b in r.clone() {
                if !newer.is_data(b) {
                    self.set_fresh(b..b + 1, false);
                }
            }
        }
    }

    /// Both generations, emptied (a flush failed; the caller holds off every
    /// change while it settles them). The blocks stay fresh until
    /// [`Unsynced::clear_fresh`]: a read must not take them lock-free before
    /// they are back in their old state.
    pub fn take_all(&self) -> Generation {
        let mut all = std::mem::take(&mut *self.gens[0].lock());
        let other = std::mem::take(&mut *self.gens[1].lock());
        all.copied.extend(other.copied);
        all.written.extend(other.written);
        all.cleared.extend(other.cleared);
        all
    }

    /// No block is fresh any more (the changes a failed flush may have
    /// dropped are settled).
    pub fn clear_fresh(&self) {
        for w in &self.fresh {
            w.store(0, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_flush_forgets_exactly_the_changes_finished_before_it_began() {
        let u = Unsynced::new(64);
        u.note(0..4, Change::Written);
        u.note(2..3, Change::Copied);
        let g = u.flip();
        u.note(10..12, Change::Copied); // finished while the flush ran
        u.note(3..4, Change::Written);
        u.synced(g);
        assert!(!u.any_fresh(0..1) && !u.any_fresh(2..3), "synced");
        assert!(u.any_fresh(3..4) && u.any_fresh(10..11), "changed again, or while the flush ran");
        let all = u.take_all();
        assert_eq!(all.copied.iter().cloned().collect::<Vec<_>>(), vec![10..12]);
        assert_eq!(all.written.iter().cloned().collect::<Vec<_>>(), vec![3..4]);
        assert!(u.any_fresh(3..4), "fresh until settled");
        u.clear_fresh();
        assert!(!u.any_fresh(0..64));
    }
}
