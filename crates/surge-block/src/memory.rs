//! A sparse in-memory device: 64 KiB chunks allocated on first write, so a large
//! memory export costs only what is written. Volatile: lost with the process.

use crate::dev::{check_range, BlockDev, Caps, Extent, ExtentKind, ZeroMode};
use crate::error::Result;
use parking_lot::RwLock;

const CHUNK: u64 = 64 * 1024;

pub struct MemoryDev {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemoryDev {
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK) as usize;
        MemoryDev { size, chunks: (0..n).map(|_| RwLock::new(None)).collect() }
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_request)` for each chunk piece.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(usize, usize, std::ops::Range<usize>) -> Result<()>) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let in_chunk = pos % CHUNK;
            let n = (CHUNK - in_chunk).min(len - done);
            f((pos / CHUNK) as usize, in_chunk as usize, done as usize..(done + n) as usize)?;
            done += n;
        }
        Ok(())
    }

    /// Bytes held in allocated chunks.
    pub fn allocated_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| c.read().is_some()).count() as u64 * CHUNK
    }

    fn clear(&self, offset: u64, len: u64, deallocate: bool) -> Result<()> {
        check_range(self.size, offset, len)?;
        Self::for_each_piece(offset, len, |i, at, r| {
            let mut chunk = self.chunks[i].write();
            if deallocate && r.len() as u64 == CHUNK {
                *chunk = None;
            } else if let Some(data) = chunk.as_mut() {
                data[at..at + r.len()].fill(0);
            }
            Ok(())
        })
    }
}

impl BlockDev for MemoryDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps { discard: true, fast_zero: true, block_status: true, ..Caps::default() }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |i, at, r| {
            match self.chunks[i].read().as_ref() {
                Some(data) => buf[r.clone()].copy_from_slice(&data[at..at + r.len()]),
                None => buf[r].fill(0),
            }
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |i, at, r| {
            let mut chunk = self.chunks[i].write();
            let data = chunk.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            data[at..at + r.len()].copy_from_slice(&buf[r]);
            Ok(())
        })
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.clear(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.clear(offset, len, mode.may_trim)
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size, offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        Self::for_each_piece(offset, len, |i, _, r| {
            let kind = if self.chunks[i].read().is_some() { ExtentKind::Data } else { ExtentKind::Hole };
            match out.last_mut() {
                Some(last) if last.kind == kind => last.len += r.len() as u64,
                _ => out.push(Extent { len: r.len() as u64, kind }),
            }
            Ok(())
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn memory_device_passes_conformance() {
        crate::conformance::run("memory", |size| Arc::new(MemoryDev::new(size)));
    }

    #[test]
    fn unwritten_memory_is_a_hole_and_costs_nothing() {
        let d = MemoryDev::new(1 << 30);
        assert_eq!(d.allocated_bytes(), 0);
        d.write_at(&[1; 10], CHUNK * 3 + 5, false).unwrap();
        assert_eq!(d.allocated_bytes(), CHUNK);
        let ext = d.block_status(0, CHUNK * 5).unwrap();
        assert_eq!(
            ext,
            vec![
                Extent { len: CHUNK * 3, kind: ExtentKind::Hole },
                Extent { len: CHUNK, kind: ExtentKind::Data },
                Extent { len: CHUNK, kind: ExtentKind::Hole },
            ]
        );
    }
}
