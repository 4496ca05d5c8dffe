//! The in-memory allocation map: 2 bits per block in atomic words (lock-free
//! lookups on the I/O path), per-state counters, and the set of words changed
//! since the last commit.
//!
//! Writers change a word *after* the data it describes is written, then mark
//! the word dirty; a commit takes the dirty set first and reads the words
//! after, so every state it persists has its data written before the commit's
//! data flush (see `CowDev::commit`).

use super::meta::{State, BLOCKS_PER_WORD};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering::*};

pub struct AllocMap {
    words: Vec<AtomicU64>,
    blocks: u64,
    /// Blocks in each state (indexed by `State as usize`).
    counts: [AtomicU64; 3],
    dirty: Mutex<BTreeSet<u64>>,
}

impl AllocMap {
    pub fn from_words(words: &[u64], blocks: u64) -> AllocMap {
        let mut counts = [0u64; 3];
        for b in 0..blocks {
            let w = words[(b / BLOCKS_PER_WORD) as usize];
            counts[((w >> (2 * (b % BLOCKS_PER_WORD))) & 3) as usize] += 1;
        }
        AllocMap {
            words: words.iter().map(|&w| AtomicU64::new(w)).collect(),
            blocks,
            counts: counts.map(AtomicU64::new),
            dirty: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn get(&self, block: u64) -> State {
        let w = self.words[(block / BLOCKS_PER_WORD) as usize].load(Acquire);
        State::from_bits((w >> (2 * (block % BLOCKS_PER_WORD))) & 3).unwrap_or(State::Data)
    }

    /// Set one block; the caller holds the block's range lock.
    pub fn set(&self, block: u64, state: State) {
        let idx = block / BLOCKS_PER_WORD;
        let shift = 2 * (block % BLOCKS_PER_WORD);
        let word = &self.words[idx as usize];
        let old = word.load(Acquire);
        let old_state = State::from_bits((old >> shift) & 3).unwrap_or(State::Data);
        if old_state == state {
            return;
        }
        // Other blocks of the word may change concurrently (under their own
        // range locks), so update with a CAS loop on just our two bits.
        let mut cur = old;
        loop {
            let new = (cur & !(3 << shift)) | ((state as u64) << shift);
            match word.compare_exchange_weak(cur, new, AcqRel, Acquire) {
                Ok(_) => break,
                Err(c) => cur = c,
            }
        }
        self.counts[old_state as usize].fetch_sub(1, Relaxed);
        self.counts[state as usize].fetch_add(1, Relaxed);
        self.dirty.lock().insert(idx);
    }

    pub fn set_range(&self, blocks: std::ops::Range<u64>, state: State) {
        for b in blocks {
            self.set(b, state);
        }
    }

    /// Whether every block of the range is in `state`.
    pub fn all(&self, blocks: std::ops::Range<u64>, state: State) -> bool {
        blocks.into_iter().all(|b| self.get(b) == state)
    }

    /// The first run of equal states starting at `from`, at most up to `end`:
    /// (state, end of the run).
    pub fn run(&self, from: u64, end: u64) -> (State, u64) {
        let s = self.get(from);
        let mut b = from + 1;
        while b < end && self.get(b) == s {
            b += 1;
        }
        (s, b)
    }

    /// Whether some block of the range is in `state`.
    pub fn any(&self, blocks: std::ops::Range<u64>, state: State) -> bool {
        blocks.into_iter().any(|b| self.get(b) == state)
    }

    /// The first block at or after `from` in `state`, if any.
    pub fn find(&self, from: u64, state: State) -> Option<u64> {
        let mut b = from;
        while b < self.blocks {
            // Skip whole words that hold no such block.
            if b.is_multiple_of(BLOCKS_PER_WORD) {
                let w = self.words[(b / BLOCKS_PER_WORD) as usize].load(Acquire);
                if !word_has(w, state) {
                    b += BLOCKS_PER_WORD;
                    continue;
                }
            }
            if self.get(b) == state {
                return Some(b);
            }
            b += 1;
        }
        None
    }

    pub fn count(&self, state: State) -> u64 {
        self.counts[state as usize].load(Relaxed)
    }

    /// Take the words changed since the last call.
    pub fn take_dirty(&self) -> BTreeSet<u64> {
        std::mem::take(&mut *self.dirty.lock())
    }

    /// Put back words a failed commit did not persist.
    pub fn restore_dirty(&self, words: impl IntoIterator<Item = u64>) {
        self.dirty.lock().extend(words);
    }

    pub fn word(&self, idx: u64) -> u64 {
        self.words[idx as usize].load(Acquire)
    }

    pub fn snapshot(&self) -> Vec<u64> {
        self.words.iter().map(|w| w.load(Acquire)).collect()
    }
}

/// Whether any of the 32 two-bit fields of `w` equals `state` (padding fields
/// past the last block read as `Base`, so `find(.., Base)` checks each block).
fn word_has(w: u64, state: State) -> bool {
    const LOW: u64 = 0x5555_5555_5555_5555;
    let pattern = (state as u64) * LOW; // the state repeated in every field
    let x = w ^ pattern; // a field is zero where it matches
    let nonzero = (x | (x >> 1)) & LOW;
    nonzero != LOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_counts_and_marks_dirty_once_per_word() {
        let m = AllocMap::from_words(&[0, 0], 40);
        assert_eq!(m.count(State::Base), 40);
        m.set(3, State::Data);
        m.set(3, State::Data);
        m.set(35, State::Zero);
        assert_eq!((m.count(State::Base), m.count(State::Data), m.count(State::Zero)), (38, 1, 1));
        assert_eq!(m.take_dirty().into_iter().collect::<Vec<_>>(), vec![0, 1]);
        assert!(m.take_dirty().is_empty());
        assert_eq!(m.get(3), State::Data);
        assert_eq!(m.get(4), State::Base);
        assert_eq!(m.run(0, 40), (State::Base, 3));
        assert_eq!(m.run(3, 40), (State::Data, 4));
    }

    #[test]
    fn find_skips_words_and_sees_single_blocks() {
        let m = AllocMap::from_words(&[0; 4], 128);
        m.set_range(0..128, State::Data);
        assert_eq!(m.find(0, State::Base), None);
        m.set(77, State::Base);
        assert_eq!(m.find(0, State::Base), Some(77));
        assert_eq!(m.find(78, State::Base), None);
        m.set(127, State::Zero);
        assert_eq!(m.find(0, State::Zero), Some(127));
    }

    #[test]
    fn word_has_matches_fields_exactly() {
        assert!(word_has(0, State::Base));
        assert!(!word_has(0, State::Data));
        let all_data = 0x5555_5555_5555_5555u64;
        assert!(!word_has(all_data, State::Base));
        assert!(word_has(all_data & !(3 << 62), State::Base));
        assert!(word_has(all_data ^ (3 << 20), State::Zero));
    }
}
