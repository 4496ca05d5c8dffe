//! On-disk format of a copy-on-write overlay (see docs/streaming.md).
//!
//! One overlay device holds, in order: a superblock with the geometry (written
//! once, when the overlay is made), two checkpoint copies of the allocation
//! map (A and B, alternating by epoch, each checksummed), a journal of map
//! changes since the newest checkpoint, then the data area, where block `b` of
//! the volume lives at `data_start + b * granularity` (identity mapping: no
//! indirection on reads, sequential stays sequential, the file stays sparse).
//!
//! The map holds 2 bits per block ([`State`]), packed 32 blocks to a little
//! endian u64 word. A commit appends one journal record with the new values of
//! the words that changed; when the journal is full, a checkpoint writes the
//! whole map into the copy the newest valid one is not in and restarts the
//! journal under the new epoch, so records of an older epoch are ignored.
//!
//! Superblock, at offset 0 (4 KiB reserved, little endian):
//! ```text
//!   0 magic        8  b"SURGECOW"
//!   8 version      4  1
//!  12 granularity  4
//!  16 size         8
//!  24 journal_len  8
//!  32 crc32c       4  over [0, 36)
//! ```
//! Checkpoint copies at 4096 and 4096 + copy_len:
//! ```text
//!   0 magic        8  b"SURGECWM"
//!   8 version      4  1
//!  12 flags        4  bit 0: independent (no block needs the base any more)
//!  16 epoch        8  > 0; the copy with the highest valid epoch wins
//!  24 granularity  4  bytes per block, a power of two >= 512
//!  28 reserved     4
//!  32 size         8  volume size in bytes (= base size)
//!  40 journal_len  8  bytes of the journal area
//!  48 data_start   8  offset of block 0's data
//!  56 map_words    8
//!  64 crc32c       4  over [0, 128 + 8 * map_words) with this field zero
//!  68 reserved    60  zero
//! 128 map words       map_words x u64
//! ```
//! Journal record, at 512-byte aligned offsets from the journal start:
//! ```text
//!   0 magic     4  b"SCJR"
//!   4 nentries  4  >= 1
//!   8 epoch     8  the checkpoint epoch this journal extends
//!  16 seq       8  1, 2, ... in the order written
//!  24 crc32c    4  over [0, 32 + 16 * nentries) with this field zero
//!  28 reserved  4
//!  32 entries      nentries x { word index u64, word value u64 }
//! ```
//! Decoding is pure and never panics (fuzzed by proptest below).

pub const SUPER_MAGIC: &[u8; 8] = b"SURGECOW";
pub const SUPER_LEN: usize = 36;
const SUPER_RESERVED: u64 = 4096;
pub const MAGIC: &[u8; 8] = b"SURGECWM";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 128;
pub const RECORD_MAGIC: &[u8; 4] = b"SCJR";
pub const RECORD_HEADER_LEN: usize = 32;
pub const RECORD_ENTRY_LEN: usize = 16;
/// Journal records start at multiples of this.
pub const RECORD_ALIGN: u64 = 512;
pub const FLAG_INDEPENDENT: u32 = 1;
/// Blocks per map word.
pub const BLOCKS_PER_WORD: u64 = 32;
/// The data area starts on a multiple of this (and of the granularity).
const DATA_ALIGN: u64 = 1 << 20;
const COPY_ALIGN: u64 = 4096;

/// Where one block's content comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum State {
    /// Not in the overlay: read the base.
    Base = 0,
    /// In the overlay's data area.
    Data = 1,
    /// Reads as zeroes (discarded, zeroed, or a hole of the base); hides the base.
    Zero = 2,
}

impl State {
    pub fn from_bits(b: u64) -> Option<State> {
        match b {
            0 => Some(State::Base),
            1 => Some(State::Data),
            2 => Some(State::Zero),
            _ => None,
        }
    }
}

/// Where things live on the overlay device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub size: u64,
    pub granularity: u64,
    pub journal_len: u64,
    /// Bytes reserved for one checkpoint copy.
    pub copy_len: u64,
    pub data_start: u64,
}

impl Layout {
    pub fn new(size: u64, granularity: u64, journal_len: u64) -> Layout {
        let copy_len = (HEADER_LEN as u64 + 8 * map_words(size, granularity)).div_ceil(COPY_ALIGN) * COPY_ALIGN;
        let journal_len = journal_len.max(4 * RECORD_ALIGN).div_ceil(RECORD_ALIGN) * RECORD_ALIGN;
        let align = DATA_ALIGN.max(granularity);
        let data_start = (SUPER_RESERVED + 2 * copy_len + journal_len).div_ceil(align) * align;
        Layout { size, granularity, journal_len, copy_len, data_start }
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.granularity)
    }

    pub fn map_words(&self) -> u64 {
        map_words(self.size, self.granularity)
    }

    /// Bytes the overlay device needs.
    pub fn overlay_size(&self) -> u64 {
        self.data_start + self.size
    }

    pub fn copy_offset(&self, copy: u64) -> u64 {
        SUPER_RESERVED + (copy % 2) * self.copy_len
    }

    pub fn journal_start(&self) -> u64 {
        SUPER_RESERVED + 2 * self.copy_len
    }

    /// The superblock: the geometry, written once.
    pub fn encode_super(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPER_LEN];
        b[0..8].copy_from_slice(SUPER_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.granularity as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.journal_len.to_le_bytes());
        let crc = crc32c::crc32c(&b[..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Byte range of the metadata (checkpoints and journal).
    pub fn metadata_range(&self) -> std::ops::Range<u64> {
        0..self.journal_start() + self.journal_len
    }
}

/// Decode a superblock into the layout it describes.
pub fn decode_super(bytes: &[u8]) -> Result<Layout, DecodeError> {
    if bytes.len() < SUPER_LEN {
        return Err(DecodeError::Truncated);
    }
    if &bytes[0..8] != SUPER_MAGIC {
        return Err(DecodeError::NoMagic);
    }
    let version = u32_at(bytes, 8);
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    if crc32c::crc32c(&bytes[..32]) != u32_at(bytes, 32) {
        return Err(DecodeError::Checksum);
    }
    let (granularity, size, journal_len) = (u32_at(bytes, 12) as u64, u64_at(bytes, 16), u64_at(bytes, 24));
    if !(512..=1 << 20).contains(&granularity) || !granularity.is_power_of_two() {
        return Err(DecodeError::Invalid("granularity"));
    }
    if size == 0 || size > 1 << 56 || journal_len > 1 << 40 {
        return Err(DecodeError::Invalid("size"));
    }
    let l = Layout::new(size, granularity, journal_len);
    if l.journal_len != journal_len {
        return Err(DecodeError::Invalid("journal length"));
    }
    Ok(l)
}

pub fn map_words(size: u64, granularity: u64) -> u64 {
    size.div_ceil(granularity).div_ceil(BLOCKS_PER_WORD)
}

/// One decoded checkpoint copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub epoch: u64,
    pub flags: u32,
    pub granularity: u32,
    pub size: u64,
    pub journal_len: u64,
    pub data_start: u64,
    pub words: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("no overlay metadata (magic missing)")]
    NoMagic,
    #[error("metadata truncated")]
    Truncated,
    #[error("unsupported overlay version {0}")]
    Version(u32),
    #[error("metadata checksum mismatch")]
    Checksum,
    #[error("metadata invalid: {0}")]
    Invalid(&'static str),
}

use crate::cache::meta::{u32_at, u64_at};

impl Checkpoint {
    pub fn layout(&self) -> Layout {
        Layout::new(self.size, self.granularity as u64, self.journal_len)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + 8 * self.words.len()];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..28].copy_from_slice(&self.granularity.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..48].copy_from_slice(&self.journal_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.data_start.to_le_bytes());
        b[56..64].copy_from_slice(&(self.words.len() as u64).to_le_bytes());
        for (i, w) in self.words.iter().enumerate() {
            b[HEADER_LEN + 8 * i..HEADER_LEN + 8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// Decode one checkpoint copy: checksum, geometry and every block state.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if &bytes[0..8] != MAGIC {
        return Err(DecodeError::NoMagic);
    }
    let version = u32_at(bytes, 8);
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let nwords = u64_at(bytes, 56);
    let len = usize::try_from(nwords).ok().and_then(|n| n.checked_mul(8)).and_then(|l| l.checked_add(HEADER_LEN)).ok_or(DecodeError::Truncated)?;
    if bytes.len() < len {
        return Err(DecodeError::Truncated);
    }
    let mut copy = bytes[..len].to_vec();
    let stored = u32_at(&copy, 64);
    copy[64..68].fill(0);
    if crc32c::crc32c(&copy) != stored {
        return Err(DecodeError::Checksum);
    }
    let cp = Checkpoint {
        flags: u32_at(bytes, 12),
        epoch: u64_at(bytes, 16),
        granularity: u32_at(bytes, 24),
        size: u64_at(bytes, 32),
        journal_len: u64_at(bytes, 40),
        data_start: u64_at(bytes, 48),
        words: (0..nwords as usize).map(|i| u64_at(bytes, HEADER_LEN + 8 * i)).collect(),
    };
    if cp.epoch == 0 {
        return Err(DecodeError::Invalid("epoch 0"));
    }
    if cp.granularity < 512 || !cp.granularity.is_power_of_two() {
        return Err(DecodeError::Invalid("granularity"));
    }
    if cp.size == 0 || cp.size.checked_add(cp.data_start).is_none() {
        return Err(DecodeError::Invalid("size"));
    }
    if map_words(cp.size, cp.granularity as u64) != nwords || cp.layout().data_start != cp.data_start || cp.layout().journal_len != cp.journal_len {
        return Err(DecodeError::Invalid("geometry"));
    }
    validate_words(&cp.words, cp.size.div_ceil(cp.granularity as u64)).map_err(DecodeError::Invalid)?;
    Ok(cp)
}

/// Every 2-bit field is a known state and bits past the last block are zero.
pub fn validate_words(words: &[u64], blocks: u64) -> Result<(), &'static str> {
    for (i, &w) in words.iter().enumerate() {
        validate_word(i as u64, w, blocks)?;
    }
    Ok(())
}

fn validate_word(index: u64, w: u64, blocks: u64) -> Result<(), &'static str> {
    for slot in 0..BLOCKS_PER_WORD {
        let bits = (w >> (2 * slot)) & 3;
        if State::from_bits(bits).is_none() {
            return Err("unknown block state");
        }
        if bits != 0 && index * BLOCKS_PER_WORD + slot >= blocks {
            return Err("state set past the last block");
        }
    }
    Ok(())
}

/// One decoded journal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub epoch: u64,
    pub seq: u64,
    /// (word index, new word value)
    pub entries: Vec<(u64, u64)>,
}

impl Record {
    pub fn encoded_len(nentries: usize) -> u64 {
        (RECORD_HEADER_LEN + nentries * RECORD_ENTRY_LEN) as u64
    }

    /// Bytes the record occupies in the journal (aligned).
    pub fn footprint(nentries: usize) -> u64 {
        Self::encoded_len(nentries).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::encoded_len(self.entries.len()) as usize];
        b[0..4].copy_from_slice(RECORD_MAGIC);
        b[4..8].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        for (i, &(idx, w)) in self.entries.iter().enumerate() {
            let at = RECORD_HEADER_LEN + RECORD_ENTRY_LEN * i;
            b[at..at + 8].copy_from_slice(&idx.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// Decode the record at the start of `bytes`, for a map of `nwords` words over
/// `blocks` blocks.
pub fn decode_record(bytes: &[u8], nwords: u64, blocks: u64) -> Result<Record, DecodeError> {
    if bytes.len() < RECORD_HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if &bytes[0..4] != RECORD_MAGIC {
        return Err(DecodeError::NoMagic);
    }
    let n = u32_at(bytes, 4) as usize;
    if n == 0 {
        return Err(DecodeError::Invalid("empty record"));
    }
    let len = Record::encoded_len(n) as usize;
    if bytes.len() < len {
        return Err(DecodeError::Truncated);
    }
    let mut copy = bytes[..len].to_vec();
    let stored = u32_at(&copy, 24);
    copy[24..28].fill(0);
    if crc32c::crc32c(&copy) != stored {
        return Err(DecodeError::Checksum);
    }
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let at = RECORD_HEADER_LEN + RECORD_ENTRY_LEN * i;
        let (idx, w) = (u64_at(bytes, at), u64_at(bytes, at + 8));
        if idx >= nwords {
            return Err(DecodeError::Invalid("record entry past the map"));
        }
        validate_word(idx, w, blocks).map_err(DecodeError::Invalid)?;
        entries.push((idx, w));
    }
    Ok(Record { epoch: u64_at(bytes, 8), seq: u64_at(bytes, 16), entries })
}

/// Replay the journal onto `words` (a checkpoint of `epoch`): records of this
/// epoch with consecutive sequence numbers from 1, stopping at the first that
/// is missing, torn or stale. Returns (records applied, journal bytes used).
pub fn replay_journal(journal: &[u8], epoch: u64, words: &mut [u64], blocks: u64) -> (u64, u64) {
    let mut at = 0usize;
    let mut seq = 1;
    while at < journal.len() {
        let Ok(r) = decode_record(&journal[at..], words.len() as u64, blocks) else { break };
        if r.epoch != epoch || r.seq != seq {
            break;
        }
        for (idx, w) in r.entries.iter() {
            words[*idx as usize] = *w;
        }
        at += Record::footprint(r.entries.len()) as usize;
        seq += 1;
    }
    (seq - 1, at as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Checkpoint {
        let l = Layout::new(100 * 4096 + 1000, 4096, 8192);
        let mut words = vec![0u64; l.map_words() as usize];
        words[0] = 0b10_01_00_01;
        words[3] = 0b01 << 8; // block 3*32+4 = 100: the last (partial) block
        Checkpoint { epoch: 3, flags: 0, granularity: 4096, size: l.size, journal_len: l.journal_len, data_start: l.data_start, words }
    }

    #[test]
    fn checkpoint_encode_then_decode_is_identity() {
        let c = sample();
        assert_eq!(decode_checkpoint(&c.encode()).unwrap(), c);
    }

    /// Every single-bit flip of `b` makes `decodes` fail.
    fn every_bit_flip_is_caught(b: &[u8], decodes: impl Fn(&[u8]) -> bool) {
        for i in 0..b.len() * 8 {
            let mut c = b.to_vec();
            c[i / 8] ^= 1 << (i % 8);
            assert!(!decodes(&c), "bit {i} flip not detected");
        }
    }

    #[test]
    fn any_flipped_bit_of_a_checkpoint_is_detected() {
        every_bit_flip_is_caught(&sample().encode(), |c| decode_checkpoint(c).is_ok());
    }

    #[test]
    fn states_past_the_last_block_and_unknown_states_are_rejected() {
        let mut c = sample();
        c.words[3] = 1 << 10; // block 101 does not exist
        assert_eq!(decode_checkpoint(&c.encode()), Err(DecodeError::Invalid("state set past the last block")));
        let mut c = sample();
        c.words[1] = 3;
        assert_eq!(decode_checkpoint(&c.encode()), Err(DecodeError::Invalid("unknown block state")));
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let l = Layout::new(10 << 30, 4096, 4 << 20);
        let b = l.encode_super();
        assert_eq!(decode_super(&b).unwrap(), l);
        every_bit_flip_is_caught(&b, |c| decode_super(c).is_ok());
    }

    #[test]
    fn layout_keeps_metadata_before_aligned_data() {
        for (size, g) in [(1u64 << 20, 4096u64), (10 << 30, 4096), (12345, 512), (1 << 40, 65536)] {
            let l = Layout::new(size, g, 4 << 20);
            assert!(l.metadata_range().end <= l.data_start);
            assert_eq!(l.data_start % g, 0);
            assert_eq!(l.data_start % (1 << 20), 0);
            assert!(l.copy_len >= HEADER_LEN as u64 + 8 * l.map_words());
            assert_eq!(l.overlay_size(), l.data_start + size);
        }
    }

    #[test]
    fn journal_replays_consecutive_records_of_its_epoch_only() {
        let blocks = 64;
        let rec = |epoch, seq, idx, w| Record { epoch, seq, entries: vec![(idx, w)] };
        let mut j = vec![0u8; 4096];
        for (i, r) in [rec(5, 1, 0, 1), rec(5, 2, 1, 2), rec(4, 3, 0, 2), rec(5, 4, 0, 2)].iter().enumerate() {
            let e = r.encode();
            j[i * 512..i * 512 + e.len()].copy_from_slice(&e);
        }
        let mut words = vec![0u64; 2];
        let (n, used) = replay_journal(&j, 5, &mut words, blocks);
        assert_eq!((n, used), (2, 1024), "stops at the record of an older epoch");
        assert_eq!(words, vec![1, 2]);
        // A torn second record ends the journal after the first.
        let mut t = j.clone();
        t[512 + 40] ^= 0xff;
        let mut words = vec![0u64; 2];
        assert_eq!(replay_journal(&t, 5, &mut words, blocks), (1, 512));
        assert_eq!(words, vec![1, 0]);
    }

    proptest! {
        #[test]
        fn decode_checkpoint_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_checkpoint(&bytes);
        }

        #[test]
        fn decode_of_a_mutated_checkpoint_never_panics(i in 0usize..200, v in any::<u8>()) {
            let mut b = sample().encode();
            let i = i % b.len();
            b[i] = v;
            let _ = decode_checkpoint(&b);
        }

        #[test]
        fn decode_super_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_super(&bytes);
        }

        #[test]
        fn decode_record_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), nwords in 0u64..10) {
            let _ = decode_record(&bytes, nwords, nwords * 32);
        }

        #[test]
        fn replay_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..2000), epoch in 0u64..3) {
            let mut words = vec![0u64; 4];
            let _ = replay_journal(&bytes, epoch, &mut words, 128);
        }
    }
}
