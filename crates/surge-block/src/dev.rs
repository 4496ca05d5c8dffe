//! The device trait.
//!
//! I/O model: synchronous positional I/O on `&self`, called concurrently from a
//! worker pool (as nbdkit's thread model does). One trait with default methods for
//! the optional operations keeps `Arc<dyn BlockDev>` stacking simple, while a
//! device implements only what it does natively: the defaults give correct
//! semantics (discard is advisory, zeroes are written as zero buffers, every byte
//! is "data"), and [`Caps`] says which operations are native so front ends
//! advertise only those.

use crate::error::{BlockError, Result};
use std::os::fd::BorrowedFd;

/// How a write-zeroes request may be carried out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroMode {
    /// The range may be deallocated (punched) instead of written (NBD: no NO_HOLE flag).
    pub may_trim: bool,
    /// Fail with `NotSupported` rather than zero slowly (NBD_CMD_FLAG_FAST_ZERO).
    pub fast_only: bool,
}

/// What a device does natively; front ends advertise exactly this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub read_only: bool,
    /// Writes may sit in a volatile cache until `flush` (so FLUSH/FUA matter).
    pub volatile_cache: bool,
    /// `discard` deallocates (otherwise it is a no-op).
    pub discard: bool,
    /// `write_zeroes` is faster than writing zero buffers.
    pub fast_zero: bool,
    /// `block_status` reports holes (otherwise everything is data).
    pub block_status: bool,
    /// A flush through any handle makes every completed write durable
    /// (true for a device shared by all connections with one durable state).
    pub multi_conn: bool,
    /// Requests should be aligned to this many bytes for efficiency (power of two).
    pub preferred_block: u32,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            read_only: false,
            volatile_cache: false,
            discard: false,
            fast_zero: false,
            block_status: false,
            multi_conn: true,
            preferred_block: 4096,
        }
    }
}

/// Allocation state of a range, as reported by `block_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// Allocated, contents unknown.
    Data,
    /// Allocated and known to read as zeroes.
    Zero,
    /// Not allocated; reads as zeroes.
    Hole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub kind: ExtentKind,
}

/// A plain file that holds a device's bytes one to one: device offset `o` is
/// file offset `base + o`, and for every range [`BlockDev::in_file_span`]
/// accepts, reading or writing the file there does exactly what `read_at` /
/// `write_at(.., fua = false)` would. A front end may then move data between
/// the file and a socket without copying it through user memory (sendfile,
/// splice); see [`BlockDev::file_span`].
#[derive(Clone, Copy)]
pub struct FileSpan<'a> {
    pub fd: BorrowedFd<'a>,
    pub base: u64,
    /// Told of every transfer made through the span, so a counting layer above
    /// the file still counts it.
    pub observer: Option<&'a dyn SpanObserver>,
}

/// Sees the transfers a front end makes through a [`FileSpan`].
pub trait SpanObserver: Sync {
    /// `bytes` were read (`write == false`) or written through the span; `ok`
    /// is false if the transfer failed.
    fn transferred(&self, write: bool, bytes: u64, ok: bool);
}

impl FileSpan<'_> {
    pub fn notify(&self, write: bool, bytes: u64, ok: bool) {
        if let Some(o) = self.observer {
            o.transferred(write, bytes, ok);
        }
    }
}

/// A block device. All offsets and lengths are in bytes and need not be aligned.
pub trait BlockDev: Send + Sync {
    /// Size in bytes; fixed for the life of the handle.
    fn size(&self) -> u64;

    fn caps(&self) -> Caps {
        Caps::default()
    }

    /// Fill `buf` from `offset`. Errors with `OutOfRange` past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Write `buf` at `offset`. With `fua`, the data is durable when this returns.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()>;

    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;

    /// Hint that a range is unused. After it, the range reads as zeroes or as its
    /// old contents; callers must not rely on either (NBD_CMD_TRIM semantics).
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), offset, len)
    }

    /// Make a range read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        check_range(self.size(), offset, len)?;
        if mode.fast_only {
            return Err(BlockError::NotSupported("fast zeroing"));
        }
        write_zero_buffers(self, offset, len)
    }

    /// Allocation state of `[offset, offset+len)`: extents in order, covering at
    /// least one byte and at most `len` bytes.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size(), offset, len)?;
        Ok(vec![Extent { len, kind: ExtentKind::Data }])
    }

    /// Hint that a range will be read soon (NBD_CMD_CACHE). A no-op by default.
    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), offset, len)
    }

    /// Zero-copy access for front ends: `Some` only when this device's bytes are
    /// a plain file with nothing in between (see [`FileSpan`]). Everything that
    /// caches, models, delays, injects faults into, shares or otherwise sees
    /// I/O keeps the default `None`, so its callers use `read_at`/`write_at`; a
    /// layer that only counts may pass its child's span on with itself as the
    /// observer.
    fn file_span(&self) -> Option<FileSpan<'_>> {
        None
    }

    /// Whether `[offset, offset+len)` may be read (`write == false`) or
    /// written through [`BlockDev::file_span`] now. A plain file: always. A
    /// device that keeps only some ranges in the file (a copy-on-write overlay)
    /// accepts those; the answer may change once the call returns only in ways
    /// a concurrent request could have caused anyway.
    fn in_file_span(&self, _offset: u64, _len: u64, _write: bool) -> bool {
        self.file_span().is_some()
    }

    /// Write `len` bytes at `offset` by calling `fill`, which puts them into
    /// the file of [`BlockDev::file_span`] at `base + offset`; the device does
    /// around it what its `write_at(.., fua = false)` would (locks, allocation).
    /// `Ok(false)`: the range cannot be written this way now and nothing was
    /// written (use `write_at`).
    fn write_via_span(&self, offset: u64, len: u64, fill: &mut dyn FnMut() -> std::io::Result<()>) -> Result<bool> {
        if self.file_span().is_none() || !self.in_file_span(offset, len, true) {
            return Ok(false);
        }
        fill().map_err(|e| BlockError::io("write", offset, len, e))?;
        Ok(true)
    }

    /// Whether a read (`write == false`) or write of `[offset, offset+len)`
    /// may wait on a remote peer (a network round trip), so a front end must
    /// not run it on a thread other requests wait behind. Local devices keep
    /// the default `false`; a layer passes the question on to what it would
    /// touch.
    fn may_wait_remote(&self, _offset: u64, _len: u64, _write: bool) -> bool {
        false
    }
}

/// `OutOfRange` unless `[offset, offset+len)` lies inside a device of `size` bytes.
pub fn check_range(size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BlockError::OutOfRange { offset, len, size }),
    }
}

/// The generic way to zero: write zero buffers of at most 1 MiB.
pub fn write_zero_buffers<D: BlockDev + ?Sized>(dev: &D, offset: u64, len: u64) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        dev.write_at(&zeroes[..n as usize], offset + done, false)?;
        done += n;
    }
    Ok(())
}

impl<T: BlockDev + ?Sized> BlockDev for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn caps(&self) -> Caps {
        (**self).caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        (**self).write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        (**self).write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        (**self).block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        (**self).prefetch(offset, len)
    }
    fn file_span(&self) -> Option<FileSpan<'_>> {
        (**self).file_span()
    }
    fn in_file_span(&self, offset: u64, len: u64, write: bool) -> bool {
        (**self).in_file_span(offset, len, write)
    }
    fn write_via_span(&self, offset: u64, len: u64, fill: &mut dyn FnMut() -> std::io::Result<()>) -> Result<bool> {
        (**self).write_via_span(offset, len, fill)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        (**self).may_wait_remote(offset, len, write)
    }
}
