//! Blocks whose state changed since the last overlay flush that succeeded
//! began: their new contents (a copy from the base, a guest's data, a cleared
//! area) may still sit in the overlay's volatile cache, and a failed flush may
//! drop them. Two generations: a change is noted in the one current when it
//! *finished*, and a flush flips the generation before it starts, so when it
//! succeeds everything in the old generation is on the medium.

use parking_lot::Mutex;
use rangemap::RangeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[derive(Default)]
pub struct Unsynced {
    current: AtomicUsize,
    sets: [Mutex<RangeSet<u64>>; 2],
}

impl Unsynced {
    /// Blocks whose change just finished.
    pub fn note(&self, blocks: Range<u64>) {
        if !blocks.is_empty() {
            self.sets[self.current.load(SeqCst)].lock().insert(blocks);
        }
    }

    /// A flush begins: changes from now on go to the other generation.
    /// Returns the generation the flush covers.
    pub fn flip(&self) -> usize {
        self.current.fetch_xor(1, SeqCst)
    }

    /// The flush that covered generation `g` succeeded.
    pub fn synced(&self, g: usize) {
        self.sets[g].lock().clear();
    }

    /// Every block of both generations, which are emptied (a flush failed).
    pub fn take_all(&self) -> RangeSet<u64> {
        let mut all = std::mem::take(&mut *self.sets[0].lock());
        all.extend(std::mem::take(&mut *self.sets[1].lock()));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_flush_forgets_exactly_the_changes_finished_before_it_began() {
        let u = Unsynced::default();
        u.note(0..4);
        let g = u.flip();
        u.note(10..12); // finished while the flush ran
        u.synced(g);
        assert_eq!(u.take_all().iter().cloned().collect::<Vec<_>>(), vec![10..12]);
    }
}
