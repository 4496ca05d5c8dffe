//! Socket plumbing shared by the server and the client.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::io::AsRawFd;
use std::time::Duration;

/// Binds a unix socket at `path` that has `mode` from the start: bound under
/// a temporary name beside it, given its mode, then renamed into place, so
/// there is no moment when the umask's mode lets others connect. A file at
/// `path` is replaced (the caller checks it is a stale socket).
pub fn bind_unix(path: &std::path::Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "socket path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = match std::os::unix::net::UnixListener::bind(&tmp) {
        Ok(l) => l,
        // The temporary name is too long for sun_path: bind in place, then
        // set the mode (others may connect in between, as before).
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            let l = std::os::unix::net::UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            return Ok(l);
        }
        Err(e) => return Err(e),
    };
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// A connected unix or TCP stream.
#[derive(Debug)]
pub enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tcp(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_read_timeout(t),
            Socket::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_write_timeout(t),
            Socket::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// Asks for socket buffers of `bytes` each way (the kernel caps this at
    /// net.core.wmem_max / rmem_max); large replies then need fewer wake-ups.
    pub fn set_buffer_sizes(&self, bytes: usize) {
        let fd = self.as_raw_fd();
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: setsockopt with a valid fd and a c_int option value. Best effort.
            unsafe {
                libc::setsockopt(fd, libc::SOL_SOCKET, opt, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32);
            }
        }
    }

    /// A printable peer address for logs.
    pub fn peer(&self) -> String {
        match self {
            Socket::Unix(_) => "unix".to_string(),
            Socket::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp".into()),
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        match self {
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.read(buf),
            Socket::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write(buf),
            Socket::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write_vectored(bufs),
            Socket::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes every part, normally with a single `writev`; falls back to plain writes
/// for whatever a short write left over.
pub fn write_all_parts(w: &mut (impl Write + ?Sized), parts: &[&[u8]]) -> io::Result<()> {
    const INLINE: usize = 8;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = if parts.len() <= INLINE {
        let mut iov = [IoSlice::new(&[]); INLINE];
        for (slot, p) in iov.iter_mut().zip(parts) {
            *slot = IoSlice::new(p);
        }
        write_vectored_retrying(w, &iov[..parts.len()])?
    } else {
        let iov: Vec<IoSlice> = parts.iter().map(|p| IoSlice::new(p)).collect();
        write_vectored_retrying(w, &iov)?
    };
    if written == total {
        return Ok(());
    }
    for p in parts {
        if written >= p.len() {
            written -= p.len();
            continue;
        }
        w.write_all(&p[written..])?;
        written = 0;
    }
    Ok(())
}

fn write_vectored_retrying(w: &mut (impl Write + ?Sized), iov: &[IoSlice]) -> io::Result<usize> {
    loop {
        match w.write_vectored(iov) {
            Ok(0) if iov.iter().any(|s| !s.is_empty()) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that accepts at most `max` bytes per call, to force short writes.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
    }
    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(self.max);
            self.out.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn short_writes_still_deliver_every_part_in_order() {
        let mut w = Trickle { out: Vec::new(), max: 3 };
        let parts: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; i as usize + 1]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        write_all_parts(&mut w, &refs).unwrap();
        assert_eq!(w.out, parts.concat());
    }
}
