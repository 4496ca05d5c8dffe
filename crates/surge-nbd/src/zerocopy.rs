//! Zero-copy data paths between a plain (non-TLS) socket and an export whose
//! device is a plain file ([`surge_block::BlockDev::file_span`]).
//!
//! * Reads: the reply header goes out with `MSG_MORE`, then `sendfile` moves the
//!   data from the file's page cache to the socket: no copy through this
//!   process (the kernel references the pages for unix sockets).
//! * Writes: the payload is `splice`d from the socket into a pipe (page
//!   references, no copy into this process), and only once all of it has
//!   arrived is it moved on into the file: a client that leaves mid-payload
//!   still changes nothing. A file on tmpfs takes it through a shared mapping
//!   ([`FileMap`]: one `read` from the pipe into the file's pages); any other
//!   file takes it by `splice` (the page-cache write path).
//!
//! A copy-on-write volume uses these paths for ranges already in its overlay
//! ([`surge_block::BlockDev::in_file_span`]); a write spliced for such a range
//! that left the overlay before it ran is read back from its pipe and written
//! by the device. TLS connections and layered devices (cache, model, fault,
//! share) never get here: they keep the copying path.

use parking_lot::Mutex;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use surge_block::FileSpan;

/// Capacity asked for each pipe (the default maximum, /proc/sys/fs/pipe-max-size).
pub(crate) const PIPE_SIZE: usize = 1 << 20;

fn cvt(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A pipe used to hold one write payload between the socket and the file.
pub(crate) struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// A pipe of (at most) `want` bytes; its real capacity may be smaller.
    pub(crate) fn new(want: usize) -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a valid descriptor. Failing to grow (limits) is not an error.
        let capacity = unsafe {
            libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, want as libc::c_int);
            libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        Ok(Pipe { r, w, capacity: capacity.max(0) as usize })
    }

    /// Moves up to `len` bytes (at most the capacity) from `sock` into the
    /// pipe and says how many it moved: all of them, or fewer once the pipe
    /// has no slot left. A pipe holds a fixed number of slots, one per socket
    /// buffer piece, so a sender that wrote in small pieces (or a TCP peer whose
    /// packets each fill a slot) can fill it long before `len` bytes; waiting
    /// for room then would wait forever, as nothing drains the pipe meanwhile.
    pub(crate) fn fill_from(&self, sock: RawFd, len: usize) -> io::Result<usize> {
        let mut left = len;
        while left > 0 {
            if left < len && !self.has_room() {
                break;
            }
            // SAFETY: splice between two valid descriptors, no offsets (socket, pipe).
            let r = unsafe { libc::splice(sock, std::ptr::null_mut(), self.w.as_raw_fd(), std::ptr::null_mut(), left, libc::SPLICE_F_MOVE) };
            match cvt(r) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(len - left)
    }

    /// Whether the pipe has a free slot (a splice into it would not wait for one).
    fn has_room(&self) -> bool {
        let mut p = libc::pollfd { fd: self.w.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: poll on one valid descriptor, without waiting.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLOUT != 0 }
    }

    /// Moves exactly `len` bytes from the pipe into `file` at `offset`.
    pub(crate) fn drain_to(&self, file: BorrowedFd, offset: u64, len: usize) -> io::Result<()> {
        let mut off = offset as libc::loff_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: splice from the pipe into the file at `off`, which the kernel advances.
            let r = unsafe { libc::splice(self.r.as_raw_fd(), std::ptr::null_mut(), file.as_raw_fd(), &mut off, left, libc::SPLICE_F_MOVE) };
            match cvt(r) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the file took no more data")),
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves up to `len` bytes from the pipe into `map` at `offset`, and says
    /// how many it moved: fewer than `len` when a page of the mapping cannot be
    /// had (beyond the end of the file, tmpfs full), the rest still in the pipe.
    pub(crate) fn drain_into_map(&self, map: &FileMap, offset: u64, len: usize) -> io::Result<usize> {
        let Some(dst) = map.range(offset, len) else { return Ok(0) };
        let mut done = 0;
        while done < len {
            // SAFETY: `dst` is `len` bytes of a live mapping that only the kernel
            // writes; a page it cannot fault in fails the read with EFAULT.
            let r = unsafe { libc::read(self.r.as_raw_fd(), dst.as_ptr().add(done).cast(), len - done) };
            match cvt(r) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The pipe keeps what was not copied (pipe_read consumes only whole copies).
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Reads exactly `buf.len()` bytes out of the pipe (which holds them).
    pub(crate) fn drain_into(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: read into a valid slice from a valid descriptor.
            let r = unsafe { libc::read(self.r.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
            match cvt(r) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A shared writable mapping of an export's file on tmpfs, which write
/// payloads that rewrite data ([`Rewrites`]) are read into from their pipes:
/// one copy straight into the file's pages, without the page-cache write
/// path's work for every page (`splice` into a tmpfs file costs about a third
/// more CPU per MiB once the mapping's pages are in). Only for tmpfs: on
/// a file system that writes pages back, each write after a writeback faults
/// every page again (`scripts/bench/pipe-drain.py` measured 7x the CPU on
/// ext4). Nothing in this process reads or writes through the mapping; only
/// the kernel does, inside `read`, so a page it cannot have fails that call
/// with EFAULT instead of raising SIGBUS here.
pub(crate) struct FileMap {
    ptr: NonNull<u8>,
    len: usize,
    written: Rewrites,
}

// SAFETY: the mapping is only ever handed to the kernel as a read(2) target;
// no Rust reference to its memory exists.
unsafe impl Send for FileMap {}
unsafe impl Sync for FileMap {}

const TMPFS_MAGIC: i64 = 0x0102_1994;

impl FileMap {
    /// A mapping of the first `len` bytes of `fd`, if it is a regular file on
    /// tmpfs and the mapping can be made; `None` otherwise (splice instead).
    /// Device nodes are not mapped: /dev is often a tmpfs too, but a block
    /// device's pages are written back like a disk file's.
    pub(crate) fn of_tmpfs(fd: BorrowedFd, len: u64) -> Option<FileMap> {
        // SAFETY: zeroed stat and statfs are valid; fstat and fstatfs fill them for a valid descriptor.
        let (mut st, mut fs): (libc::stat, libc::statfs) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let regular = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG;
        if !regular || unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 || fs.f_type as i64 != TMPFS_MAGIC {
            return None;
        }
        let len = usize::try_from(len).ok().filter(|&l| l > 0 && len <= MAP_MAX)?;
        // SAFETY: a new shared mapping of a valid descriptor; the kernel picks the address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(p.cast()).map(|ptr| FileMap { ptr, len, written: Rewrites::new(len) })
    }

    /// Whether a write of `[offset, offset+len)` should go through the
    /// mapping: only where it rewrites blocks written before (see [`Rewrites`]).
    pub(crate) fn takes(&self, offset: u64, len: usize) -> bool {
        self.written.rewrites(offset, len)
    }

    /// The mapped bytes `[offset, offset+len)`, if the mapping covers them.
    fn range(&self, offset: u64, len: usize) -> Option<NonNull<u8>> {
        let start = usize::try_from(offset).ok()?;
        (start.checked_add(len)? <= self.len).then(|| {
            // SAFETY: `start` lies within the mapping (checked above).
            unsafe { self.ptr.add(start) }
        })
    }
}

/// Which 64 KiB blocks of a mapping the connection has written before (64 KiB:
/// the smallest payload spliced, so a single pass of writes of any size that
/// zero copy takes writes no block twice, unless it is unaligned, where the
/// boundary blocks are not rewrites: the next write touches blocks not seen).
/// A block's first write goes by splice and later ones through the mapping:
/// the first write through a mapping faults each of its pages in, which costs
/// more than the splice it replaces (`scripts/bench/pipe-drain.py cold`), so a
/// single pass (an image copied in) never pays for it, and data written again
/// and again pays once.
struct Rewrites {
    blocks: u64,
    bits: Vec<AtomicU64>,
}

const REWRITE_BLOCK_SHIFT: u32 = 16;
/// Files larger than this are not mapped (the map of rewrites would pass 2 MiB).
const MAP_MAX: u64 = 1 << 40;

impl Rewrites {
    fn new(len: usize) -> Rewrites {
        let blocks = len.div_ceil(1 << REWRITE_BLOCK_SHIFT);
        Rewrites { blocks: blocks as u64, bits: (0..blocks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Whether every block of `[offset, offset+len)` was written before;
    /// marks them all written.
    fn rewrites(&self, offset: u64, len: usize) -> bool {
        let Some(end) = offset.checked_add(len as u64).filter(|_| len > 0) else { return false };
        let (first, last) = (offset >> REWRITE_BLOCK_SHIFT, (end - 1) >> REWRITE_BLOCK_SHIFT);
        if last >= self.blocks {
            return false;
        }
        let mut all = true;
        for block in first..=last {
            let bit = 1u64 << (block % 64);
            all &= self.bits[(block / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit != 0;
        }
        all
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `of_tmpfs` mapped, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Pipes a connection keeps at most (each holds one write payload in flight).
const MAX_PIPES: usize = 16;

/// What a connection needs for zero-copy I/O: its plain socket, the export's
/// file, and a few pipes for write payloads.
pub(crate) struct ZeroCopy<'a> {
    pub(crate) sock: RawFd,
    pub(crate) span: FileSpan<'a>,
    /// The device's size: how far into the span payloads may land.
    size: u64,
    /// The span's file mapped, once the first payload needs it (tmpfs only).
    /// Per connection: a client's rewrites are mostly its own.
    map: OnceLock<Option<FileMap>>,
    free: Mutex<Vec<Pipe>>,
    made: AtomicUsize,
}

impl<'a> ZeroCopy<'a> {
    pub(crate) fn new(sock: RawFd, span: FileSpan<'a>, size: u64) -> Self {
        ZeroCopy { sock, span, size, map: OnceLock::new(), free: Mutex::new(Vec::new()), made: AtomicUsize::new(0) }
    }

    /// Moves `len` bytes from `pipe` into the span's file at `at` (a file
    /// offset): through the mapping where there is one and it takes them all,
    /// the rest (or all) by splice, which reports the file's own error.
    pub(crate) fn drain(&self, pipe: &Pipe, at: u64, len: usize) -> io::Result<()> {
        let map = self.map.get_or_init(|| FileMap::of_tmpfs(self.span.fd, self.span.base + self.size));
        let moved = match map {
            Some(m) if m.takes(at, len) => pipe.drain_into_map(m, at, len)?,
            _ => 0,
        };
        if moved == len {
            return Ok(());
        }
        pipe.drain_to(self.span.fd, at + moved as u64, len - moved)
    }

    /// An empty pipe that holds `need` bytes, or `None` (use the copying path).
    pub(crate) fn take_pipe(&self, need: usize) -> Option<Pipe> {
        let free = self.free.lock().pop();
        if let Some(p) = free {
            if p.capacity >= need {
                return Some(p);
            }
            self.put_pipe(p);
            return None;
        }
        if self.made.fetch_add(1, Ordering::Relaxed) >= MAX_PIPES {
            self.made.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        match Pipe::new(PIPE_SIZE) {
            Ok(p) if p.capacity >= need => Some(p),
            Ok(p) => {
                self.put_pipe(p);
                None
            }
            Err(_) => {
                self.made.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Returns an empty pipe for reuse.
    pub(crate) fn put_pipe(&self, p: Pipe) {
        self.free.lock().push(p);
    }

    /// Drops a pipe that may still hold data (closing it discards the data).
    pub(crate) fn discard_pipe(&self, p: Pipe) {
        drop(p);
        self.made.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes all of `buf` to `file` at `offset`.
pub(crate) fn pwrite_all(file: BorrowedFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        // SAFETY: pwrite from a valid slice to a valid descriptor.
        let r = unsafe { libc::pwrite(file.as_raw_fd(), rest.as_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t) };
        match cvt(r) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the file took no more data")),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why sending file data stopped.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The connection failed: nothing more can be sent.
    Socket(io::Error),
    /// Reading the file failed after `sent` bytes; the connection is fine.
    File { sent: usize, error: io::Error },
}

fn is_socket_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN | libc::EAGAIN | libc::ETIMEDOUT | libc::ESHUTDOWN | libc::ECONNABORTED)
    )
}

/// Sends `len` bytes of `file` from `offset` to `sock` with sendfile.
pub(crate) fn send_file(sock: RawFd, file: BorrowedFd, offset: u64, len: usize) -> Result<(), SendError> {
    let mut off = offset as libc::off_t;
    let mut sent = 0;
    while sent < len {
        // SAFETY: sendfile between valid descriptors; the kernel advances `off`.
        let r = unsafe { libc::sendfile(sock, file.as_raw_fd(), &mut off, len - sent) };
        match cvt(r) {
            Ok(0) => return Err(SendError::File { sent, error: io::Error::new(io::ErrorKind::UnexpectedEof, "the file ended early") }),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_socket_error(&e) => return Err(SendError::Socket(e)),
            Err(error) => return Err(SendError::File { sent, error }),
        }
    }
    Ok(())
}

/// Sends every part with `sendmsg(MSG_MORE)`: more follows at once, so TCP
/// need not push a small segment for a reply header alone.
pub(crate) fn send_more(sock: RawFd, parts: &[&[u8]]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = parts.iter().filter(|p| !p.is_empty()).map(|p| libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() }).collect();
    let mut first = 0;
    while first < iov.len() {
        // SAFETY: a zeroed msghdr is valid; iov points at live slices for the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov[first..].as_mut_ptr();
        msg.msg_iovlen = (iov.len() - first) as _;
        // SAFETY: sendmsg on a valid socket with a valid msghdr.
        let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
        let mut n = match cvt(r) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < iov.len() && n >= iov[first].iov_len {
            n -= iov[first].iov_len;
            first += 1;
        }
        if n > 0 {
            let v = &mut iov[first];
            // SAFETY: advancing within the same slice by less than its length.
            v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) }.cast();
            v.iov_len -= n;
        }
    }
    Ok(())
}

/// Sends `len` zero bytes (to finish a data chunk whose file read failed).
pub(crate) fn send_zeroes(sock: RawFd, mut len: usize) -> io::Result<()> {
    let zeroes = [0u8; 4096];
    while len > 0 {
        let n = len.min(zeroes.len());
        send_more(sock, &[&zeroes[..n]])?;
        len -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_payload_goes_from_socket_through_a_pipe_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.path().join("f")).unwrap();
        file.set_len(1 << 20).unwrap();
        let (mut a, b) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || a.write_all(&data).unwrap())
        };
        let pipe = Pipe::new(PIPE_SIZE).unwrap();
        assert!(pipe.capacity >= data.len(), "capacity {}", pipe.capacity);
        assert_eq!(pipe.fill_from(b.as_raw_fd(), data.len()).unwrap(), data.len());
        writer.join().unwrap();
        pipe.drain_to(file.as_fd(), 4096, data.len()).unwrap();
        let mut back = vec![0u8; data.len()];
        file.read_exact_at(&mut back, 4096).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn only_regular_files_on_tmpfs_are_mapped() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(shm.path().join("f")).unwrap();
        file.set_len(1 << 20).unwrap();
        assert!(FileMap::of_tmpfs(file.as_fd(), 1 << 20).is_some(), "a file on tmpfs");
        assert!(FileMap::of_tmpfs(file.as_fd(), 0).is_none(), "nothing to map");
        // /dev is a tmpfs on most systems, but a device node is no tmpfs file.
        let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").unwrap();
        assert!(FileMap::of_tmpfs(dev.as_fd(), 1 << 20).is_none(), "a device node");
        let map = FileMap::of_tmpfs(file.as_fd(), 1 << 20).unwrap();
        assert!(map.range(0, 1 << 20).is_some() && map.range(1, 1 << 20).is_none() && map.range(u64::MAX, 1).is_none());
    }

    #[test]
    fn only_blocks_written_before_are_rewrites() {
        let r = Rewrites::new(8 << 20);
        assert!(!r.rewrites(0, 1 << 20) && r.rewrites(0, 1 << 20), "a block's second write");
        assert!(!r.rewrites((1 << 20) - 1, 2), "reaches a block not written before");
        assert!(r.rewrites((1 << 20) - 1, 2) && r.rewrites(100, 5000));
        assert!(!r.rewrites(3 << 20, 0) && !r.rewrites(3 << 20, 1), "empty writes are none");
        assert!(!r.rewrites(8 << 20, 1) && !r.rewrites(8 << 20, 1), "past the mapping: never");
        // A single pass of 256 KiB writes rewrites nothing, aligned or not.
        let r = Rewrites::new(8 << 20);
        assert!((0..16u64).all(|i| !r.rewrites(i << 18, 1 << 18)));
        let r = Rewrites::new(8 << 20);
        assert!((0..16u64).all(|i| !r.rewrites((i << 18) + 4096, 1 << 18)));
    }

    #[test]
    fn a_pipe_out_of_slots_stops_filling_instead_of_waiting_for_room() {
        let (mut a, b) = UnixStream::pair().unwrap();
        // 300 sends of 100 bytes: one slot each, more than the 256 slots of a
        // 1 MiB pipe. (The socket's send buffer cannot hold them all at once.)
        let writer = std::thread::spawn(move || {
            for _ in 0..300 {
                a.write_all(&[7u8; 100]).unwrap();
            }
        });
        let pipe = Pipe::new(PIPE_SIZE).unwrap();
        let moved = pipe.fill_from(b.as_raw_fd(), 30_000).unwrap();
        assert!(moved < 30_000 && moved >= 100, "moved {moved}");
        let mut got = vec![0u8; 30_000];
        pipe.drain_into(&mut got[..moved]).unwrap();
        (&b).read_exact(&mut got[moved..]).unwrap();
        writer.join().unwrap();
        assert!(got.iter().all(|&x| x == 7));
    }

    #[test]
    fn a_client_leaving_mid_payload_is_an_error_not_a_short_write() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1u8; 1000]).unwrap();
        drop(a);
        let pipe = Pipe::new(PIPE_SIZE).unwrap();
        assert_eq!(pipe.fill_from(b.as_raw_fd(), 5000).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn file_data_and_headers_arrive_in_order_and_a_short_file_is_a_file_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).unwrap();
            got
        });
        send_more(a.as_raw_fd(), &[b"head", b"", b"er"]).unwrap();
        send_file(a.as_raw_fd(), file.as_fd(), 1000, 150_000).unwrap();
        match send_file(a.as_raw_fd(), file.as_fd(), 199_000, 5000) {
            Err(SendError::File { sent: 1000, .. }) => {}
            other => panic!("{other:?}"),
        }
        send_zeroes(a.as_raw_fd(), 4000).unwrap();
        drop(a);
        let got = reader.join().unwrap();
        assert_eq!(&got[..6], b"header");
        assert_eq!(&got[6..150_006], &data[1000..151_000]);
        assert_eq!(&got[150_006..151_006], &data[199_000..]);
        assert!(got[151_006..].iter().all(|&x| x == 0) && got.len() == 155_006);
    }
}
