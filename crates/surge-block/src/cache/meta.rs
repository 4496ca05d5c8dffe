//! On-disk metadata of the cache: which backing block sits dirty in which slot.
//!
//! Only the dirty set is persisted (clean mappings are rebuilt by reads after a
//! restart), so a restart finds exactly the dirty blocks. Two copies, A and B,
//! each `copy_len` bytes, alternate: a commit writes the copy not holding the
//! newest valid sequence number, so a torn commit leaves the other copy intact.
//!
//! Copy layout (little endian), see docs/cache.md:
//! ```text
//!  0  magic      8  b"SURGECM1"
//!  8  version    4  1
//! 12  nentries   4
//! 16  seq        8  commit sequence number, > 0
//! 24  block_size 4
//! 28  nslots     4
//! 32  backing    8  backing device size in bytes
//! 40  crc32c     4  over bytes [0, 64 + 12 * nentries) with this field zero
//! 44  cache_id   8  random identity of this cache, set when it is formatted
//!                   (0 in metadata written before ids existed)
//! 52  reserved  12  zero
//! 64  entries       nentries x { block u64, slot u32 }
//! ```

use std::collections::HashSet;

pub const MAGIC: &[u8; 8] = b"SURGECM1";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 64;
pub const ENTRY_LEN: usize = 12;
const ALIGN: u64 = 4096;

/// Where things live on the cache device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u64,
    pub nslots: u32,
    /// Bytes reserved for one metadata copy (room for every slot dirty).
    pub copy_len: u64,
    /// Offset of slot 0's data.
    pub data_start: u64,
}

impl Layout {
    /// The largest layout that fits a cache device of `cache_size` bytes.
    pub fn for_device(cache_size: u64, block_size: u64) -> Option<Layout> {
        let copy_len = |n: u64| (HEADER_LEN as u64 + n * ENTRY_LEN as u64).div_ceil(ALIGN) * ALIGN;
        let data_start = |n: u64| (2 * copy_len(n)).div_ceil(block_size) * block_size;
        let mut n = cache_size / block_size;
        while n > 0 && data_start(n) + n * block_size > cache_size {
            n -= 1;
        }
        (n > 0 && n <= u32::MAX as u64).then(|| Layout {
            block_size,
            nslots: n as u32,
            copy_len: copy_len(n),
            data_start: data_start(n),
        })
    }

    pub fn copy_offset(&self, copy: usize) -> u64 {
        copy as u64 * self.copy_len
    }

    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.data_start + slot as u64 * self.block_size
    }

    /// Byte range holding metadata (both copies): fault-injection tests count
    /// writes that land here.
    pub fn metadata_range(&self) -> std::ops::Range<u64> {
        0..2 * self.copy_len
    }
}

/// One decoded metadata copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub seq: u64,
    pub block_size: u32,
    pub nslots: u32,
    pub backing_size: u64,
    /// Identity of the cache (fences name failed devices by it); 0 = none.
    pub cache_id: u64,
    /// (backing block, slot), each block and each slot at most once.
    pub entries: Vec<(u64, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("no metadata (magic missing)")]
    NoMagic,
    #[error("metadata truncated")]
    Truncated,
    #[error("unsupported metadata version {0}")]
    Version(u32),
    #[error("metadata checksum mismatch")]
    Checksum,
    #[error("metadata invalid: {0}")]
    Invalid(&'static str),
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Meta {
    /// Serialized bytes (header and entries, not padded).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + self.entries.len() * ENTRY_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.block_size.to_le_bytes());
        b[28..32].copy_from_slice(&self.nslots.to_le_bytes());
        b[32..40].copy_from_slice(&self.backing_size.to_le_bytes());
        b[44..52].copy_from_slice(&self.cache_id.to_le_bytes());
        for (i, &(block, slot)) in self.entries.iter().enumerate() {
            let at = HEADER_LEN + i * ENTRY_LEN;
            b[at..at + 8].copy_from_slice(&block.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&slot.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// Decode one copy. Pure: never panics on any input, so it can be fuzzed.
/// Checks the checksum and that entries are in range and unique.
pub fn decode(bytes: &[u8]) -> Result<Meta, DecodeError> {
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
    let n = u32_at(bytes, 12) as usize;
    let len = n.checked_mul(ENTRY_LEN).and_then(|l| l.checked_add(HEADER_LEN)).ok_or(DecodeError::Truncated)?;
    if bytes.len() < len {
        return Err(DecodeError::Truncated);
    }
    let mut copy = bytes[..len].to_vec();
    let stored = u32_at(&copy, 40);
    copy[40..44].fill(0);
    if crc32c::crc32c(&copy) != stored {
        return Err(DecodeError::Checksum);
    }
    let meta = Meta {
        seq: u64_at(bytes, 16),
        block_size: u32_at(bytes, 24),
        nslots: u32_at(bytes, 28),
        backing_size: u64_at(bytes, 32),
        cache_id: u64_at(bytes, 44),
        entries: (0..n)
            .map(|i| {
                let at = HEADER_LEN + i * ENTRY_LEN;
                (u64_at(bytes, at), u32_at(bytes, at + 8))
            })
            .collect(),
    };
    if meta.seq == 0 {
        return Err(DecodeError::Invalid("sequence number 0"));
    }
    if meta.block_size == 0 || !meta.block_size.is_power_of_two() {
        return Err(DecodeError::Invalid("block size"));
    }
    let nblocks = meta.backing_size.div_ceil(meta.block_size as u64);
    let (mut blocks, mut slots) = (HashSet::new(), HashSet::new());
    for &(block, slot) in &meta.entries {
        if block >= nblocks || slot >= meta.nslots {
            return Err(DecodeError::Invalid("entry out of range"));
        }
        if !blocks.insert(block) || !slots.insert(slot) {
            return Err(DecodeError::Invalid("duplicate entry"));
        }
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Meta {
        Meta { seq: 7, block_size: 65536, nslots: 100, backing_size: 1 << 30, cache_id: 0x5eed_cafe, entries: vec![(3, 0), (9, 99), (16383, 5)] }
    }

    #[test]
    fn encode_then_decode_is_identity() {
        let m = sample();
        assert_eq!(decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let b = sample().encode();
        for i in 0..b.len() * 8 {
            let mut c = b.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(decode(&c).is_err(), "bit {i} flip not detected");
        }
    }

    #[test]
    fn duplicate_and_out_of_range_entries_are_rejected() {
        let mut m = sample();
        m.entries.push((3, 1));
        assert_eq!(decode(&m.encode()), Err(DecodeError::Invalid("duplicate entry")));
        let mut m = sample();
        m.entries.push((1 << 20, 1));
        assert_eq!(decode(&m.encode()), Err(DecodeError::Invalid("entry out of range")));
    }

    #[test]
    fn layout_fits_device_and_keeps_metadata_apart_from_data() {
        for size in [1u64 << 20, 10 << 20, 1 << 30, 3 * (1 << 30) + 12345] {
            let l = Layout::for_device(size, 65536).unwrap();
            assert!(l.slot_offset(l.nslots) <= size);
            assert!(l.metadata_range().end <= l.data_start);
            assert!(l.copy_len as usize >= HEADER_LEN + l.nslots as usize * ENTRY_LEN);
        }
        assert!(Layout::for_device(65536, 65536).is_none());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_of_mutated_valid_copy_never_panics(i in 0usize..100, v in any::<u8>()) {
            let mut b = sample().encode();
            let i = i % b.len();
            b[i] = v;
            let _ = decode(&b);
        }
    }
}
