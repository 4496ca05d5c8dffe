//! Writes the server acknowledged but has not flushed yet, kept so they can be
//! sent again after a reconnect: a server that restarted may have lost them
//! (they sat in its volatile cache), and the layers above us were told they
//! were done. Resending is safe because each entry carries its full effect
//! (data, or a zeroed/trimmed range): applying it twice leaves what applying
//! it once does, and the log is replayed in acknowledgement order while no
//! other request is in flight.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    Write(Vec<u8>),
    /// NBD_CMD_WRITE_ZEROES with these command flags.
    Zeroes { len: u32, flags: u16 },
    Trim { len: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub seq: u64,
    pub offset: u64,
    pub effect: Effect,
}

#[derive(Debug, Default)]
pub(crate) struct ReplayLog {
    entries: VecDeque<Entry>,
    next_seq: u64,
    bytes: u64,
}

impl ReplayLog {
    /// Record an acknowledged, not yet flushed change.
    pub fn push(&mut self, offset: u64, effect: Effect) {
        self.bytes += match &effect {
            Effect::Write(d) => d.len() as u64,
            _ => 0,
        } + 64;
        self.entries.push_back(Entry { seq: self.next_seq, offset, effect });
        self.next_seq += 1;
    }

    /// Where a FLUSH sent now covers up to (everything acknowledged before it).
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// A FLUSH sent at `mark` was acknowledged: what it covered is durable.
    pub fn flushed(&mut self, mark: u64) {
        while self.entries.front().is_some_and(|e| e.seq < mark) {
            let e = self.entries.pop_front().expect("present");
            self.bytes -= match &e.effect {
                Effect::Write(d) => d.len() as u64,
                _ => 0,
            } + 64;
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
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
}
