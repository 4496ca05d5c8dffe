//! Errors of block devices, named after what failed, each with the errno that the
//! NBD server (or any other front end) reports for it.

use std::io;

pub type Result<T, E = BlockError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("request of {len} bytes at offset {offset} is beyond the device end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("device is read-only")]
    ReadOnly,
    #[error("{0} is not supported by this device")]
    NotSupported(&'static str),
    #[error("device is full")]
    NoSpace,
    #[error("{op} of {len} bytes at offset {offset} failed: {source}")]
    Io {
        op: &'static str,
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("flush failed: {0}")]
    Flush(#[source] io::Error),
    #[error("device is gone: {0}")]
    Gone(String),
    #[error("metadata is corrupt: {0}")]
    Corrupt(String),
}

impl BlockError {
    pub fn io(op: &'static str, offset: u64, len: u64, source: io::Error) -> Self {
        BlockError::Io { op, offset, len, source }
    }

    /// The POSIX errno that best describes the failure (what NBD sends on the wire).
    pub fn errno(&self) -> i32 {
        match self {
            BlockError::OutOfRange { .. } => libc::EINVAL,
            BlockError::ReadOnly => libc::EPERM,
            BlockError::NotSupported(_) => libc::ENOTSUP,
            BlockError::NoSpace => libc::ENOSPC,
            BlockError::Io { source, .. } | BlockError::Flush(source) => match source.raw_os_error() {
                // The NBD spec: EDQUOT and EFBIG (file too large) are ENOSPC to a client.
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => libc::ENOSPC,
                _ => libc::EIO,
            },
            BlockError::Gone(_) | BlockError::Corrupt(_) => libc::EIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_errors_of_every_kind_are_enospc() {
        for e in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG] {
            let err = BlockError::io("write", 0, 1, io::Error::from_raw_os_error(e));
            assert_eq!(err.errno(), libc::ENOSPC, "errno {e}");
        }
        assert_eq!(BlockError::io("write", 0, 1, io::Error::from_raw_os_error(libc::EBADF)).errno(), libc::EIO);
    }
}
