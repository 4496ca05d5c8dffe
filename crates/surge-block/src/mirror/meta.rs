//! The mirror's persistent record, on its own small metadata device: where the
//! rebuild stands and which rebuilt regions may differ between the legs.
//!
//! Two copies at offsets 0 and `copy_len`, written alternately (the older one
//! is overwritten), each checksummed with CRC32C; the valid copy with the
//! highest sequence number wins, so a torn or lost write of one copy leaves the
//! other. Layout of a copy (little endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SRGMIRR1` |
//! | 8 | sequence number |
//! | 8 | tag (who the record belongs to: the caller's id of the target) |
//! | 8 | device size in bytes |
//! | 8 | region size in bytes |
//! | 8 | regions copied durably (`copied`: regions below it are on the target) |
//! | 4 | flags: bit 0 complete, bit 1 target failed |
//! | 8 | number of regions |
//! | ceil(regions/8) | intent bitmap: regions below `copied` that writes may have left different on the legs |
//! | 4 | CRC32C of everything before it |

pub const MAGIC: [u8; 8] = *b"SRGMIRR1";
const HEADER_LEN: usize = 8 + 8 + 8 + 8 + 8 + 8 + 4 + 8;
const ALIGN: u64 = 4096;

pub const FLAG_COMPLETE: u32 = 1;
pub const FLAG_FAILED: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub tag: u64,
    pub size: u64,
    pub region: u64,
    pub copied: u64,
    pub flags: u32,
    pub nregions: u64,
    /// One bit per region, `nregions` bits.
    pub dirty: Vec<u8>,
}

/// Bytes reserved for one copy of the record of `nregions` regions.
pub fn copy_len(nregions: u64) -> u64 {
    (HEADER_LEN as u64 + nregions.div_ceil(8) + 4).div_ceil(ALIGN) * ALIGN
}

/// Size a metadata device needs for a mirror of `size` bytes in `region`-byte regions.
pub fn required_size(size: u64, region: u64) -> u64 {
    2 * copy_len(size.div_ceil(region))
}

impl Record {
    pub fn complete(&self) -> bool {
        self.flags & FLAG_COMPLETE != 0
    }

    pub fn failed(&self) -> bool {
        self.flags & FLAG_FAILED != 0
    }

    pub fn is_dirty(&self, r: u64) -> bool {
        self.dirty.get((r / 8) as usize).is_some_and(|b| b & (1 << (r % 8)) != 0)
    }

    /// The copy, padded to `copy_len`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(copy_len(self.nregions) as usize);
        b.extend_from_slice(&MAGIC);
        for v in [self.seq, self.tag, self.size, self.region, self.copied] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&self.nregions.to_le_bytes());
        debug_assert_eq!(self.dirty.len() as u64, self.nregions.div_ceil(8));
        b.extend_from_slice(&self.dirty);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.resize(copy_len(self.nregions) as usize, 0);
        b
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("no mirror record (magic missing)")]
    NoMagic,
    #[error("record truncated")]
    Truncated,
    #[error("record checksum mismatch")]
    Checksum,
    #[error("record fields are inconsistent: {0}")]
    Inconsistent(&'static str),
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Decode one copy; never panics on arbitrary bytes.
pub fn decode(b: &[u8]) -> Result<Record, DecodeError> {
    if b.len() < HEADER_LEN + 4 {
        return Err(if b.starts_with(&MAGIC) { DecodeError::Truncated } else { DecodeError::NoMagic });
    }
    if b[..8] != MAGIC {
        return Err(DecodeError::NoMagic);
    }
    let nregions = u64_at(b, 52);
    let bitmap = nregions.div_ceil(8);
    let end = (HEADER_LEN as u64).checked_add(bitmap).ok_or(DecodeError::Truncated)?;
    if end.checked_add(4).is_none_or(|e| e > b.len() as u64) {
        return Err(DecodeError::Truncated);
    }
    let end = end as usize;
    let crc = u32::from_le_bytes(b[end..end + 4].try_into().expect("4 bytes"));
    if crc32c::crc32c(&b[..end]) != crc {
        return Err(DecodeError::Checksum);
    }
    let r = Record {
        seq: u64_at(b, 8),
        tag: u64_at(b, 16),
        size: u64_at(b, 24),
        region: u64_at(b, 32),
        copied: u64_at(b, 40),
        flags: u32::from_le_bytes(b[48..52].try_into().expect("4 bytes")),
        nregions,
        dirty: b[HEADER_LEN..end].to_vec(),
    };
    if r.region == 0 || r.size.div_ceil(r.region) != r.nregions {
        return Err(DecodeError::Inconsistent("size, region and region count disagree"));
    }
    if r.copied > r.nregions {
        return Err(DecodeError::Inconsistent("more regions copied than exist"));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(nregions: u64) -> Record {
        let mut dirty = vec![0u8; nregions.div_ceil(8) as usize];
        if nregions > 3 {
            dirty[0] = 0b1010;
        }
        Record { seq: 9, tag: 0xfeed, size: nregions * 4096 - 100, region: 4096, copied: nregions / 2, flags: FLAG_COMPLETE, nregions, dirty }
    }

    #[test]
    fn a_record_round_trips_and_fills_its_copy() {
        for n in [1, 7, 8, 9, 1000, 40_000] {
            let r = rec(n);
            let b = r.encode();
            assert_eq!(b.len() as u64, copy_len(n));
            assert_eq!(decode(&b).unwrap(), r);
        }
        let r = rec(16);
        assert!(r.is_dirty(1) && r.is_dirty(3) && !r.is_dirty(2) && !r.is_dirty(100));
        assert!(r.complete() && !r.failed());
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let b = rec(100).encode();
        let len = HEADER_LEN + 13 + 4;
        for i in 8..len {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(decode(&c).is_err(), "flip at byte {i} went unnoticed");
        }
        assert_eq!(decode(&[0u8; 8192]), Err(DecodeError::NoMagic));
        assert_eq!(decode(&b[..HEADER_LEN]), Err(DecodeError::Truncated));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_behind_a_valid_magic(mut bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&MAGIC);
            }
            let _ = decode(&bytes);
        }
    }
}
