//! What the torture client knows: self-describing block contents and, per block,
//! which versions a crash may legally leave.
//!
//! Every block the workload writes holds a header (magic, run seed, block number,
//! generation) and a pattern derived from them, so a read tells which write it
//! came from, and a misplaced, stale or mixed block is recognised. Generation 0 is
//! an all-zero block (the state after a format or a write-zeroes).
//!
//! The rule checked after every crash (NBD durability): a block holds the version
//! that was stable at the last completed FLUSH (or FUA write), or any version
//! written to it since (acknowledged or still in flight); nothing else.

use serde::Serialize;

const MAGIC: u64 = 0x5355_5247_4554_5254; // "SURGETRT"
const HEADER: usize = 32;

/// Contents of block `block` at generation `gen` (0 = zeroes).
pub fn block_data(seed: u64, block: u64, gen: u64, out: &mut [u8]) {
    if gen == 0 {
        out.fill(0);
        return;
    }
    let mut x = seed ^ block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ gen.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1;
    for chunk in out[HEADER..].chunks_mut(8) {
        // xorshift64: cheap, and different for every (seed, block, gen).
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&seed.to_le_bytes());
    out[16..24].copy_from_slice(&block.to_le_bytes());
    out[24..32].copy_from_slice(&gen.to_le_bytes());
}

/// What a block read back as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Gen(u64),
    /// Neither zeroes nor an intact block of this run at this position.
    Corrupt(String),
}

pub fn decode(seed: u64, block: u64, data: &[u8], scratch: &mut Vec<u8>) -> Found {
    if data.iter().all(|&b| b == 0) {
        return Found::Gen(0);
    }
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    if word(0) != MAGIC {
        return Found::Corrupt("no torture header (foreign or partly written data)".into());
    }
    if word(1) != seed {
        return Found::Corrupt(format!("written by another run (seed {})", word(1)));
    }
    if word(2) != block {
        return Found::Corrupt(format!("holds block {} (misplaced write)", word(2)));
    }
    let gen = word(3);
    scratch.resize(data.len(), 0);
    block_data(seed, block, gen, scratch);
    match scratch.iter().zip(data).position(|(a, b)| a != b) {
        None => Found::Gen(gen),
        Some(at) => Found::Corrupt(format!("generation {gen} header but byte {at} differs (torn or mixed block)")),
    }
}

/// What became of a write sent since the block's stable version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    InFlight,
    Acked,
    /// The server answered with an error: NBD leaves the range unspecified
    /// (the write may have landed, partly or not at all) until rewritten.
    Failed,
}

/// Per block: the stable version and those written since.
#[derive(Debug, Clone)]
pub struct Model {
    stable: Vec<u64>,
    since: Vec<Vec<(u64, Fate)>>,
    /// Blocks with entries in `since`, so a flush is cheap.
    dirty: Vec<u64>,
}

/// One block that broke the rule.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Loss {
    pub block: u64,
    pub found: String,
    pub stable: u64,
    pub written_since: Vec<u64>,
}

impl Model {
    /// All blocks stable at generation 0 (a formatted region).
    pub fn new(blocks: u64) -> Self {
        Model { stable: vec![0; blocks as usize], since: vec![Vec::new(); blocks as usize], dirty: Vec::new() }
    }

    pub fn blocks(&self) -> u64 {
        self.stable.len() as u64
    }

    /// A write of `gen` to `block` was sent (it may or may not land).
    pub fn sent(&mut self, block: u64, gen: u64) {
        let s = &mut self.since[block as usize];
        if s.is_empty() {
            self.dirty.push(block);
        }
        s.push((gen, Fate::InFlight));
    }

    fn set_fate(&mut self, block: u64, gen: u64, fate: Fate) {
        if let Some(e) = self.since[block as usize].iter_mut().rev().find(|e| e.0 == gen) {
            e.1 = fate;
        }
    }

    /// The write of `gen` to `block` was acknowledged.
    pub fn acked(&mut self, block: u64, gen: u64) {
        self.set_fate(block, gen, Fate::Acked);
    }

    /// The write of `gen` to `block` failed.
    pub fn failed(&mut self, block: u64, gen: u64) {
        self.set_fate(block, gen, Fate::Failed);
    }

    /// A FUA write of `gen` to `block` was acknowledged: durable now. Older
    /// versions of this block can no longer come back.
    pub fn durable(&mut self, block: u64, gen: u64) {
        self.stable[block as usize] = gen;
        let s = &mut self.since[block as usize];
        if let Some(i) = s.iter().position(|e| e.0 == gen) {
            s.drain(..=i);
        }
    }

    /// A FLUSH completed, and every write sent before it had completed: the
    /// newest acknowledged version of each dirty block is stable; failed writes
    /// after it keep the block unspecified.
    pub fn flushed(&mut self) {
        for b in std::mem::take(&mut self.dirty) {
            let s = &mut self.since[b as usize];
            if let Some(i) = s.iter().rposition(|e| e.1 == Fate::Acked) {
                self.stable[b as usize] = s[i].0;
                s.drain(..=i);
            }
            s.retain(|e| e.1 == Fate::Failed);
            if !s.is_empty() {
                self.dirty.push(b);
            }
        }
    }

    /// The server reported that acknowledged writes may have been lost and the
    /// loss was acknowledged: every write since the last stable version is as
    /// unspecified as a failed one (the stable versions stay: a FLUSH made them
    /// durable).
    pub fn forget_unflushed(&mut self) {
        for &b in &self.dirty {
            for e in self.since[b as usize].iter_mut().filter(|e| e.1 == Fate::Acked) {
                e.1 = Fate::Failed;
            }
        }
    }

    /// Is `found` legal for `block`?
    pub fn check(&self, block: u64, found: &Found) -> Result<(), Loss> {
        let b = block as usize;
        let since = &self.since[b];
        let ok = match found {
            Found::Gen(g) => *g == self.stable[b] || since.iter().any(|e| e.0 == *g),
            // Only a failed write may leave a block mixed.
            Found::Corrupt(_) => since.iter().any(|e| e.1 == Fate::Failed),
        };
        if ok {
            return Ok(());
        }
        Err(Loss {
            block,
            found: match found {
                Found::Gen(g) => format!("generation {g}"),
                Found::Corrupt(why) => why.clone(),
            },
            stable: self.stable[b],
            written_since: since.iter().map(|e| e.0).collect(),
        })
    }

    /// After a verified restart (and a flush): what was read is the truth.
    pub fn settle(&mut self, block: u64, gen: u64) {
        self.stable[block as usize] = gen;
        self.since[block as usize].clear();
    }

    pub fn clear_dirty(&mut self) {
        self.dirty.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(seed: u64, block: u64, gen: u64) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        block_data(seed, block, gen, &mut b);
        b
    }

    #[test]
    fn blocks_decode_to_their_generation_and_detect_damage() {
        let mut scratch = Vec::new();
        assert_eq!(decode(7, 3, &data(7, 3, 42), &mut scratch), Found::Gen(42));
        assert_eq!(decode(7, 3, &vec![0; 4096], &mut scratch), Found::Gen(0));
        assert!(matches!(decode(7, 4, &data(7, 3, 42), &mut scratch), Found::Corrupt(w) if w.contains("misplaced")));
        assert!(matches!(decode(8, 3, &data(7, 3, 42), &mut scratch), Found::Corrupt(w) if w.contains("another run")));
        // Half of generation 5 and half of 6: a torn block.
        let mut torn = data(7, 3, 5);
        torn[2048..].copy_from_slice(&data(7, 3, 6)[2048..]);
        assert!(matches!(decode(7, 3, &torn, &mut scratch), Found::Corrupt(w) if w.contains("torn")));
        let mut junk = data(7, 3, 5);
        junk[0] ^= 1;
        assert!(matches!(decode(7, 3, &junk, &mut scratch), Found::Corrupt(_)));
    }

    #[test]
    fn unflushed_writes_may_be_lost_flushed_ones_may_not() {
        let mut m = Model::new(4);
        m.sent(1, 10);
        m.acked(1, 10);
        m.flushed();
        m.sent(1, 11);
        m.sent(2, 12);
        // Crash now: block 1 may be 10 or 11, block 2 may be 0 or 12.
        assert!(m.check(1, &Found::Gen(10)).is_ok());
        assert!(m.check(1, &Found::Gen(11)).is_ok());
        assert!(m.check(2, &Found::Gen(0)).is_ok());
        assert!(m.check(2, &Found::Gen(12)).is_ok());
        // Losing the flushed write is a loss.
        let loss = m.check(1, &Found::Gen(0)).unwrap_err();
        assert_eq!((loss.stable, loss.written_since.clone()), (10, vec![11]));
        assert!(m.check(3, &Found::Corrupt("x".into())).is_err());
    }

    #[test]
    fn a_failed_write_never_becomes_stable_but_leaves_the_block_unspecified() {
        let mut m = Model::new(2);
        m.sent(0, 1);
        m.acked(0, 1);
        m.sent(0, 2);
        m.failed(0, 2);
        m.flushed();
        assert!(m.check(0, &Found::Gen(1)).is_ok(), "the failed write need not have landed");
        assert!(m.check(0, &Found::Gen(2)).is_ok(), "or it may have");
        assert!(m.check(0, &Found::Corrupt("torn".into())).is_ok(), "or partly");
        assert!(m.check(0, &Found::Gen(0)).is_err(), "but the flushed write 1 may not be lost");
        // A later acknowledged and flushed write makes the block exact again.
        m.sent(0, 3);
        m.acked(0, 3);
        m.flushed();
        assert!(m.check(0, &Found::Gen(3)).is_ok());
        assert!(m.check(0, &Found::Gen(2)).is_err());
        assert!(m.check(0, &Found::Corrupt("torn".into())).is_err());
    }

    #[test]
    fn acknowledged_loss_makes_unflushed_writes_unspecified_but_keeps_stable_ones() {
        let mut m = Model::new(2);
        m.sent(0, 1);
        m.acked(0, 1);
        m.flushed();
        m.sent(0, 2);
        m.acked(0, 2);
        m.forget_unflushed();
        m.flushed();
        assert!(m.check(0, &Found::Gen(1)).is_ok(), "the lost write need not be there");
        assert!(m.check(0, &Found::Gen(2)).is_ok());
        assert!(m.check(0, &Found::Gen(0)).is_err(), "the stable write 1 may not be lost");
    }

    #[test]
    fn a_fua_write_is_durable_and_retires_older_versions() {
        let mut m = Model::new(2);
        m.sent(0, 1);
        m.sent(0, 2);
        m.durable(0, 2);
        m.sent(0, 3);
        assert!(m.check(0, &Found::Gen(1)).is_err(), "older than a durable FUA write");
        assert!(m.check(0, &Found::Gen(0)).is_err());
        assert!(m.check(0, &Found::Gen(2)).is_ok());
        assert!(m.check(0, &Found::Gen(3)).is_ok());
    }
}
