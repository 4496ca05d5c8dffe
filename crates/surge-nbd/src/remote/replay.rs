//! Writes the server acknowledged but has not flushed yet, kept so they can be
//! sent again after a reconnect: a server that restarted may have lost them
//! (they sat in its volatile cache), and the layers above us were told they
//! were done. Resending is safe because each entry carries its full effect
//! (data, or a zeroed/trimmed range): applying it twice leaves what applying
//! it once does.
//!
//! The log keeps only the newest change of each byte: a change cuts what it
//! overlaps out of the older entries. Its entries are disjoint, so a replay
//! may send them in any order and pipelined, and a replay that fails half
//! way never leaves an older change on top of a newer one (which a FUA
//! write, durable and then overwritten by the replay of an older write,
//! would otherwise lose).

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    Write(Vec<u8>),
    /// NBD_CMD_WRITE_ZEROES with these command flags.
    Zeroes { len: u32, flags: u16 },
    Trim { len: u32 },
}

impl Effect {
    pub fn len(&self) -> u64 {
        match self {
            Effect::Write(d) => d.len() as u64,
            Effect::Zeroes { len, .. } | Effect::Trim { len } => u64::from(*len),
        }
    }

    /// The part `from..to` (relative to the effect's start).
    fn slice(&self, from: u64, to: u64) -> Effect {
        let len = (to - from) as u32;
        match self {
            Effect::Write(d) => Effect::Write(d[from as usize..to as usize].to_vec()),
            Effect::Zeroes { flags, .. } => Effect::Zeroes { len, flags: *flags },
            Effect::Trim { .. } => Effect::Trim { len },
        }
    }

    /// What it holds in memory: its data, and a fixed cost per entry.
    fn cost(&self) -> u64 {
        let data = match self {
            Effect::Write(d) => d.len() as u64,
            _ => 0,
        };
        data + 64
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// When it was acknowledged: a FLUSH sent at a later mark covers it.
    pub seq: u64,
    pub offset: u64,
    pub effect: Effect,
}

impl Entry {
    fn end(&self) -> u64 {
        self.offset + self.effect.len()
    }
}

/// Disjoint entries, by offset.
#[derive(Debug, Default)]
pub(crate) struct ReplayLog {
    entries: BTreeMap<u64, Entry>,
    next_seq: u64,
    bytes: u64,
}

impl ReplayLog {
    /// Record an acknowledged, not yet flushed change: it replaces whatever
    /// older entries held in its range.
    pub fn push(&mut self, offset: u64, effect: Effect) {
        let end = offset + effect.len();
        self.cut_out(offset, end);
        if end > offset {
            self.insert(Entry { seq: self.next_seq, offset, effect });
        }
        self.next_seq += 1;
    }

    /// Remove `from..to` from every entry, keeping the parts outside it.
    fn cut_out(&mut self, from: u64, to: u64) {
        let overlapping: Vec<u64> = self.entries.range(..to).rev().take_while(|(_, e)| e.end() > from).map(|(&o, _)| o).collect();
        for o in overlapping {
            let e = self.remove(o);
            if e.offset < from {
                self.insert(Entry { seq: e.seq, offset: e.offset, effect: e.effect.slice(0, from - e.offset) });
            }
            if e.end() > to {
                self.insert(Entry { seq: e.seq, offset: to, effect: e.effect.slice(to - e.offset, e.effect.len()) });
            }
        }
    }

    fn insert(&mut self, e: Entry) {
        self.bytes += e.effect.cost();
        self.entries.insert(e.offset, e);
    }

    fn remove(&mut self, offset: u64) -> Entry {
        let e = self.entries.remove(&offset).expect("present");
        self.bytes -= e.effect.cost();
        e
    }

    /// Where a FLUSH sent now covers up to (everything acknowledged before it).
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// A FLUSH sent at `mark` was acknowledged: what it covered is durable.
    pub fn flushed(&mut self, mark: u64) {
        let bytes = &mut self.bytes;
        self.entries.retain(|_, e| {
            let keep = e.seq >= mark;
            if !keep {
                *bytes -= e.effect.cost();
            }
            keep
        });
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_drops_exactly_what_was_acknowledged_before_it_was_sent() {
        let mut l = ReplayLog::default();
        l.push(0, Effect::Write(vec![1; 100]));
        l.push(4096, Effect::Trim { len: 512 });
        let mark = l.mark();
        l.push(8192, Effect::Write(vec![2; 10])); // acknowledged while the flush was in flight
        assert_eq!(l.len(), 3);
        l.flushed(mark);
        assert_eq!(l.entries().map(|e| e.offset).collect::<Vec<_>>(), vec![8192]);
        assert_eq!(l.bytes(), 10 + 64);
        l.flushed(l.mark());
        assert_eq!((l.len(), l.bytes()), (0, 0));
    }

    /// What the log replays, applied to a zeroed buffer (trims as zeroes).
    fn replayed(l: &ReplayLog, size: usize) -> Vec<u8> {
        let mut img = vec![0u8; size];
        for e in l.entries() {
            let r = e.offset as usize..e.end() as usize;
            match &e.effect {
                Effect::Write(d) => img[r].copy_from_slice(d),
                _ => img[r].fill(0),
            }
        }
        img
    }

    #[test]
    fn a_change_cuts_what_it_overlaps_out_of_older_entries() {
        let mut l = ReplayLog::default();
        l.push(0, Effect::Write(vec![1; 100]));
        l.push(40, Effect::Write(vec![2; 20])); // inside
        l.push(90, Effect::Zeroes { len: 20, flags: 0 }); // across the end
        l.push(200, Effect::Write(vec![3; 10]));
        l.push(195, Effect::Trim { len: 30 }); // over a whole entry
        let pieces: Vec<(u64, u64, u64)> = l.entries().map(|e| (e.offset, e.end(), e.seq)).collect();
        assert_eq!(pieces, vec![(0, 40, 0), (40, 60, 1), (60, 90, 0), (90, 110, 2), (195, 225, 4)]);
        let mut want = vec![0u8; 256];
        want[..40].fill(1);
        want[40..60].fill(2);
        want[60..90].fill(1);
        assert_eq!(replayed(&l, 256), want);
        assert_eq!(l.bytes(), 40 + 20 + 30 + 5 * 64);
        // A FLUSH marked after the first write keeps the newer pieces only.
        l.flushed(1);
        assert_eq!(l.entries().map(|e| e.offset).collect::<Vec<_>>(), vec![40, 90, 195]);
    }

    proptest::proptest! {
        /// Whatever the changes, the entries stay disjoint and replaying
        /// them gives what applying every change in order gives, on every
        /// byte some change touched.
        #[test]
        fn the_log_replays_the_newest_change_of_every_byte(ops in proptest::collection::vec((0u64..200, 1u64..60, 0u8..3), 1..40)) {
            let mut l = ReplayLog::default();
            let mut want = vec![0u8; 260];
            let mut touched = vec![false; 260];
            for (i, &(off, len, kind)) in ops.iter().enumerate() {
                let v = (i % 250) as u8 + 1;
                let r = off as usize..(off + len) as usize;
                touched[r.clone()].iter_mut().for_each(|t| *t = true);
                match kind {
                    0 => { want[r].fill(v); l.push(off, Effect::Write(vec![v; len as usize])) }
                    1 => { want[r].fill(0); l.push(off, Effect::Zeroes { len: len as u32, flags: 0 }) }
                    _ => { want[r].fill(0); l.push(off, Effect::Trim { len: len as u32 }) }
                }
            }
            let es: Vec<&Entry> = l.entries().collect();
            for w in es.windows(2) {
                proptest::prop_assert!(w[0].end() <= w[1].offset, "entries overlap: {:?}", w);
            }
            let covered: u64 = es.iter().map(|e| e.effect.len()).sum();
            proptest::prop_assert_eq!(covered, touched.iter().filter(|&&t| t).count() as u64);
            proptest::prop_assert_eq!(replayed(&l, 260), want);
        }
    }
}
