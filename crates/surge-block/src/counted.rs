//! A layer that counts operations, bytes and errors of the device below.

use crate::dev::{BlockDev, Caps, Extent, FileSpan, SpanObserver, ZeroMode};
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
    c: Arc<Counters>,
}

impl Counted {
    pub fn new(inner: Arc<dyn BlockDev>) -> Self {
        Counted { inner, c: Arc::default() }
    }

    /// Another device counted in the same counters (e.g. the device a
    /// connection was routed to instead of the export's own).
    pub fn sharing(&self, inner: Arc<dyn BlockDev>) -> Counted {
        Counted { inner, c: self.c.clone() }
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
    /// The file below, with this layer counting what goes through it (a span
    /// that already reports to someone else is not passed on).
    fn file_span(&self) -> Option<FileSpan<'_>> {
        let span = self.inner.file_span().filter(|s| s.observer.is_none())?;
        Some(FileSpan { observer: Some(self), ..span })
    }
    fn in_file_span(&self, offset: u64, len: u64, write: bool) -> bool {
        self.file_span().is_some() && self.inner.in_file_span(offset, len, write)
    }
    /// Counted by the front end through the span's observer.
    fn write_via_span(&self, offset: u64, len: u64, fill: &mut dyn FnMut() -> std::io::Result<()>) -> Result<bool> {
        if self.file_span().is_none() {
            return Ok(false);
        }
        self.inner.write_via_span(offset, len, fill)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

impl SpanObserver for Counted {
    fn transferred(&self, write: bool, bytes: u64, ok: bool) {
        let c = &self.c;
        let (ops, b) = if write { (&c.writes, &c.write_bytes) } else { (&c.reads, &c.read_bytes) };
        if ok {
            ops.fetch_add(1, Relaxed);
            b.fetch_add(bytes, Relaxed);
        } else {
            c.errors.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDev, MemoryDev};

    #[test]
    fn the_file_span_passes_through_with_counting_and_layers_that_see_io_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let file: Arc<dyn BlockDev> = Arc::new(FileDev::create(dir.path().join("f"), 1 << 20).unwrap());
        assert!(file.file_span().is_some(), "a plain file offers its descriptor");
        let direct = FileDev::open(dir.path().join("f"), &crate::FileOptions { direct: true, ..Default::default() }).unwrap();
        assert!(direct.file_span().is_none(), "O_DIRECT devices keep the aligned path");
        assert!(MemoryDev::new(4096).file_span().is_none());
        let counted = Counted::new(file.clone());
        let span = counted.file_span().expect("counting passes the file on");
        span.notify(true, 4096, true);
        span.notify(false, 512, true);
        span.notify(false, 512, false);
        let st = counted.stats();
        assert_eq!((st.writes, st.write_bytes, st.reads, st.read_bytes, st.errors), (1, 4096, 1, 512, 1));
        // A second counting layer does not steal the first one's observer.
        assert!(Counted::new(Arc::new(counted)).file_span().is_none());
        let clock: Arc<dyn crate::Clock> = Arc::new(crate::SystemClock::new());
        let fault = crate::fault::FaultDev::new(file.clone(), crate::fault::FaultRules::default(), clock);
        assert!(fault.file_span().is_none(), "fault injection must see every I/O");
    }
}
