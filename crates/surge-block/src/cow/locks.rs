//! Range locks over block numbers: whoever changes the state of blocks (a
//! write filling a block from the base, a copy-up, a zeroing) holds the range,
//! so a copy from the base can never land on top of a newer write.

use parking_lot::{Condvar, Mutex};
use std::ops::Range;

#[derive(Default)]
pub struct RangeLocks {
    held: Mutex<Vec<Range<u64>>>,
    released: Condvar,
}

pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: Range<u64>,
}

impl RangeLocks {
    /// Wait until no held range overlaps `range`, then hold it.
    pub fn lock(&self, range: Range<u64>) -> RangeGuard<'_> {
        let mut held = self.held.lock();
        while held.iter().any(|r| r.start < range.end && range.start < r.end) {
            self.released.wait(&mut held);
        }
        held.push(range.clone());
        RangeGuard { locks: self, range }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        if let Some(i) = held.iter().position(|r| *r == self.range) {
            held.swap_remove(i);
        }
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_wait_and_disjoint_ones_do_not() {
        let l = Arc::new(RangeLocks::default());
        let g = l.lock(10..20);
        let _other = l.lock(20..30); // disjoint: no wait
        let entered = Arc::new(AtomicBool::new(false));
        let t = {
            let (l, entered) = (l.clone(), entered.clone());
            std::thread::spawn(move || {
                let _g = l.lock(15..16);
                entered.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!entered.load(Ordering::SeqCst), "overlapping lock must wait");
        drop(g);
        t.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
    }
}
