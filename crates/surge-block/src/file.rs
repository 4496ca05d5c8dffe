//! Files and block devices as `BlockDev`s: pread/pwrite on one shared descriptor,
//! fallocate for discard and zeroes, SEEK_DATA/SEEK_HOLE for block status, and
//! optional O_DIRECT for aligned requests.

use crate::dev::{check_range, write_zero_buffers, BlockDev, Caps, Extent, ExtentKind, ZeroMode};
use crate::error::{BlockError, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// How to open a file device.
#[derive(Debug, Clone, Default)]
pub struct FileOptions {
    pub read_only: bool,
    /// Serve requests aligned to 4 KiB with O_DIRECT, bypassing the page cache.
    pub direct: bool,
    /// Create a sparse file of this size if the path does not exist.
    pub create_size: Option<u64>,
}

pub struct FileDev {
    path: PathBuf,
    file: File,
    direct: Option<File>,
    size: u64,
    read_only: bool,
    is_block_device: bool,
}

const DIRECT_ALIGN: usize = 4096;

/// Mode of the data files surge creates (volumes, overlays, spilled chunks):
/// readable and writable by the user surge runs as, by nobody else, whatever
/// the umask says.
pub const DATA_FILE_MODE: u32 = 0o600;

impl FileDev {
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if let Some(size) = opts.create_size {
            if !path.exists() {
                let f = OpenOptions::new().write(true).create_new(true).mode(DATA_FILE_MODE).open(&path)?;
                f.set_len(size)?;
            }
        }
        let file = oo.open(&path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        let size = if is_block_device { block_device_size(&file)? } else { meta.len() };
        let direct = if opts.direct {
            Some(oo.custom_flags(libc::O_DIRECT).open(&path)?)
        } else {
            None
        };
        Ok(FileDev { path, file, direct, size, read_only: opts.read_only, is_block_device })
    }

    /// Create (sparse) or open a read-write file of `size` bytes.
    pub fn create(path: impl AsRef<Path>, size: u64) -> io::Result<Self> {
        Self::open(path, &FileOptions { create_size: Some(size), ..Default::default() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            Err(BlockError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// The O_DIRECT descriptor, if this request may use it.
    fn direct_for(&self, offset: u64, len: usize) -> Option<&File> {
        let aligned = offset % DIRECT_ALIGN as u64 == 0 && len % DIRECT_ALIGN == 0 && len > 0;
        self.direct.as_ref().filter(|_| aligned)
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on a descriptor we own.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        // SAFETY: lseek does not touch memory; the shared file offset is unused by pread/pwrite.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        }
    }

    fn pwrite_dsync(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let iov = libc::iovec { iov_base: buf[done..].as_ptr() as *mut _, iov_len: buf.len() - done };
            // SAFETY: iov points into `buf`, which outlives the call.
            let r = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, (offset + done as u64) as libc::off_t, libc::RWF_DSYNC) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) {
                    self.file.write_all_at(&buf[done..], offset + done as u64)?;
                    return self.file.sync_data();
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            done += r as usize;
        }
        Ok(())
    }
}

fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `size`.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) };
    if r == 0 {
        Ok(size)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL))
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).expect("valid layout");
        // SAFETY: len > 0 (checked by direct_for), layout valid.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        AlignedBuf { ptr, layout }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes for our lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            read_only: self.read_only,
            volatile_cache: true,
            discard: !self.read_only,
            fast_zero: !self.read_only,
            block_status: !self.is_block_device,
            multi_conn: true,
            preferred_block: 4096,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let len = buf.len();
        if let Some(direct) = self.direct_for(offset, len) {
            let mut bounce = AlignedBuf::new(len);
            read_fully(direct, bounce.as_mut(), offset).map_err(|e| BlockError::io("read", offset, len as u64, e))?;
            buf.copy_from_slice(bounce.as_mut());
            return Ok(());
        }
        read_fully(&self.file, buf, offset).map_err(|e| BlockError::io("read", offset, len as u64, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.writable()?;
        check_range(self.size, offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        let r = if let Some(direct) = self.direct_for(offset, buf.len()) {
            let mut bounce = AlignedBuf::new(buf.len());
            bounce.as_mut().copy_from_slice(buf);
            direct.write_all_at(bounce.as_mut(), offset).and_then(|_| if fua { direct.sync_data() } else { Ok(()) })
        } else if fua {
            self.pwrite_dsync(buf, offset)
        } else {
            self.file.write_all_at(buf, offset)
        };
        r.map_err(|e| BlockError::io("write", offset, len, e))
    }

    /// The file itself, unless O_DIRECT requests must go through the aligned
    /// path (a bypass would mix cached and direct I/O).
    fn file_span(&self) -> Option<crate::dev::FileSpan<'_>> {
        use std::os::fd::AsFd;
        self.direct.is_none().then(|| crate::dev::FileSpan { fd: self.file.as_fd(), base: 0, observer: None })
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data().map_err(BlockError::Flush)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.writable()?;
        check_range(self.size, offset, len)?;
        match self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if is_unsupported(&e) => Ok(()), // discard is advisory
            Err(e) => Err(BlockError::io("discard", offset, len, e)),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.writable()?;
        check_range(self.size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let attempt = if mode.may_trim {
            self.fallocate(punch, offset, len)
        } else {
            // ZERO_RANGE keeps the blocks allocated; where it is missing (tmpfs),
            // punch then re-allocate, which gives the same result.
            self.fallocate(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, offset, len).or_else(|e| {
                if is_unsupported(&e) && !self.is_block_device {
                    self.fallocate(punch, offset, len)?;
                    self.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, len)
                } else {
                    Err(e)
                }
            })
        };
        match attempt {
            Ok(()) => Ok(()),
            Err(e) if is_unsupported(&e) => {
                if mode.fast_only {
                    Err(BlockError::NotSupported("fast zeroing"))
                } else {
                    write_zero_buffers(self, offset, len)
                }
            }
            Err(e) => Err(BlockError::io("write-zeroes", offset, len, e)),
        }
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size, offset, len)?;
        let end = offset + len;
        if self.is_block_device {
            return Ok(vec![Extent { len, kind: ExtentKind::Data }]);
        }
        let err = |e| BlockError::io("block-status", offset, len, e);
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end && out.len() < 1024 {
            let data = self.seek(pos, libc::SEEK_DATA).map_err(err)?.unwrap_or(end).min(end);
            if data > pos {
                out.push(Extent { len: data - pos, kind: ExtentKind::Hole });
                pos = data;
                continue;
            }
            let hole = self.seek(pos, libc::SEEK_HOLE).map_err(err)?.unwrap_or(end).min(end);
            let hole = hole.max(pos + 1);
            out.push(Extent { len: hole - pos, kind: ExtentKind::Data });
            pos = hole;
        }
        Ok(out)
    }

    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size, offset, len)?;
        // SAFETY: advisory syscall; failure is harmless.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_WILLNEED) };
        Ok(())
    }
}

/// pread until `buf` is full; bytes past end of file read as zeroes.
fn read_fully(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // Issue 38 item 9: a file surge creates is private, whatever the umask
    // (tests run under the usual 022, which would leave it 0644).
    #[test]
    fn created_files_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        // The usual umask (it would leave new files 0644); harmless to other tests.
        // SAFETY: umask only sets the process file-creation mask.
        unsafe { libc::umask(0o022) };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.img");
        FileDev::create(&p, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, DATA_FILE_MODE);
        // An existing file keeps the mode its owner gave it.
        let q = dir.path().join("mine.img");
        std::fs::write(&q, [0u8; 4096]).unwrap();
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o640)).unwrap();
        FileDev::create(&q, 4096).unwrap();
        assert_eq!(std::fs::metadata(&q).unwrap().permissions().mode() & 0o777, 0o640);
    }

    #[test]
    fn file_device_passes_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let n = std::sync::atomic::AtomicU32::new(0);
        crate::conformance::run("file", |size| {
            let p = dir.path().join(format!("f{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
            Arc::new(FileDev::create(p, size).unwrap())
        });
    }

    #[test]
    fn direct_file_device_passes_conformance() {
        let dir = tempfile::tempdir().unwrap();
        let n = std::sync::atomic::AtomicU32::new(0);
        crate::conformance::run("file-direct", |size| {
            let p = dir.path().join(format!("f{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
            let opts = FileOptions { direct: true, create_size: Some(size), ..Default::default() };
            match FileDev::open(&p, &opts) {
                Ok(d) => Arc::new(d),
                // tmpfs has no O_DIRECT: fall back so the test still checks buffered I/O.
                Err(_) => Arc::new(FileDev::create(p, size).unwrap()),
            }
        });
    }

    #[test]
    fn sparse_file_reports_holes_and_punched_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDev::create(dir.path().join("s"), 1 << 20).unwrap();
        assert!(d.block_status(0, 1 << 20).unwrap().iter().all(|e| e.kind == ExtentKind::Hole));
        d.write_at(&[7u8; 65536], 65536, false).unwrap();
        let ext = d.block_status(0, 1 << 20).unwrap();
        assert!(ext.iter().any(|e| e.kind == ExtentKind::Data));
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 1 << 20);
        d.discard(65536, 65536).unwrap();
        let mut b = [1u8; 16];
        d.read_at(&mut b, 65536).unwrap();
        assert_eq!(b, [0u8; 16]);
    }

    #[test]
    fn read_only_file_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        FileDev::create(&p, 4096).unwrap();
        let d = FileDev::open(&p, &FileOptions { read_only: true, ..Default::default() }).unwrap();
        assert!(matches!(d.write_at(&[1], 0, false), Err(BlockError::ReadOnly)));
        assert!(d.caps().read_only);
    }
}
