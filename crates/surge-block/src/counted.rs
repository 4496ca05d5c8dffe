//! A layer that counts operations, bytes and errors of the device below.

use crate::dev::{BlockDev, Caps, Extent, ZeroMode};
use crate::error::Result;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    zeroes: AtomicU64,
    errors: AtomicU64,
}

/// A point-in-time copy of a device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub zeroes: u64,
    pub errors: u64,
}

pub struct Counted {
    inner: Arc<dyn BlockDev>,
    c: Counters,
}

impl Counted {
    pub fn new(inner: Arc<dyn BlockDev>) -> Self {
        Counted { inner, c: Counters::default() }
    }

    pub fn stats(&self) -> IoStats {
        let c = &self.c;
        IoStats {
            reads: c.reads.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            writes: c.writes.load(Relaxed),
            write_bytes: c.write_bytes.load(Relaxed),
            flushes: c.flushes.load(Relaxed),
            discards: c.discards.load(Relaxed),
            zeroes: c.zeroes.load(Relaxed),
            errors: c.errors.load(Relaxed),
        }
    }

    fn count<T>(&self, ops: &AtomicU64, bytes: Option<(&AtomicU64, usize)>, r: Result<T>) -> Result<T> {
        match &r {
            Ok(_) => {
                ops.fetch_add(1, Relaxed);
                if let Some((b, n)) = bytes {
                    b.fetch_add(n as u64, Relaxed);
                }
            }
            Err(_) => {
                self.c.errors.fetch_add(1, Relaxed);
            }
        }
        r
    }
}

impl BlockDev for Counted {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let n = buf.len();
        let r = self.inner.read_at(buf, offset);
        self.count(&self.c.reads, Some((&self.c.read_bytes, n)), r)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let r = self.inner.write_at(buf, offset, fua);
        self.count(&self.c.writes, Some((&self.c.write_bytes, buf.len())), r)
    }
    fn flush(&self) -> Result<()> {
        let r = self.inner.flush();
        self.count(&self.c.flushes, None, r)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.discard(offset, len);
        self.count(&self.c.discards, None, r)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        let r = self.inner.write_zeroes(offset, len, mode);
        self.count(&self.c.zeroes, None, r)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.prefetch(offset, len)
    }
}
