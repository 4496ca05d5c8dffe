//! The client <-> I/O node wire protocol: length-prefixed frames over one
//! persistent TCP connection, each tagged with a request id so that many
//! requests are in flight at once and answers may come back in any order.
//!
//! Request frame:  `u32 len | u8 op | u64 id | body` (len counts op..body)
//! Response frame: `u32 len | u8 status | u64 id | body`
//! All integers are big-endian. Bodies:
//! - `Put`:  chunk id (3 x u64) | u8 dirty | data
//! - `Get`, `Delete`, `MarkClean`: chunk id
//! - `Has`: chunk id (answer `Ok` or `NotFound`, no data)
//! - `Stat`, `Drain`: empty; a `Stat` answer is JSON `StoreStat`. `Drain` asks
//!   the node to leave the pool (hand over its dirty chunks, then exit).

use std::io::{self, Read, Write};

/// Largest frame accepted (a chunk plus headers); bigger lengths are rejected
/// before any allocation so a corrupt or hostile length cannot exhaust memory.
pub const MAX_FRAME: usize = 64 * 1024 * 1024 + 64;

/// Buffer of a frame reader. Small on purpose: a read at least this long
/// bypasses the buffer, so a chunk's bytes go from the socket straight
/// into its own memory, and only the part that arrived with its frame's
/// head is copied twice (with 1 MiB, up to a quarter of a 4 MiB chunk was).
pub const READ_BUF: usize = 64 << 10;

/// One immutable chunk version: chunk `idx` of inode `ino`, version `ver`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId {
    pub ino: u64,
    pub idx: u64,
    pub ver: u64,
}

impl ChunkId {
    /// The name used in the dirty log and in logs: `ino:idx:ver`.
    pub fn member(&self) -> String {
        format!("{}:{}:{}", self.ino, self.idx, self.ver)
    }

    pub fn parse_member(s: &str) -> Option<ChunkId> {
        let mut it = s.split(':').map(|p| p.parse::<u64>().ok());
        let c = ChunkId { ino: it.next()??, idx: it.next()??, ver: it.next()?? };
        it.next().is_none().then_some(c)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Put { chunk: ChunkId, dirty: bool, data: Vec<u8> },
    Get { chunk: ChunkId },
    Delete { chunk: ChunkId },
    MarkClean { chunk: ChunkId },
    Stat,
    Has { chunk: ChunkId },
    Drain,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    NoSpace = 2,
    BadRequest = 3,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame length {0} is outside 9..={MAX_FRAME}")]
    BadLength(usize),
    #[error("unknown opcode {0}")]
    UnknownOp(u8),
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("body of opcode {op} has {len} bytes, which does not fit")]
    BadBody { op: u8, len: usize },
}

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const OP_DELETE: u8 = 3;
const OP_MARK_CLEAN: u8 = 4;
const OP_STAT: u8 = 5;
const OP_HAS: u8 = 6;
const OP_DRAIN: u8 = 7;

fn put_chunk(out: &mut Vec<u8>, c: &ChunkId) {
    out.extend_from_slice(&c.ino.to_be_bytes());
    out.extend_from_slice(&c.idx.to_be_bytes());
    out.extend_from_slice(&c.ver.to_be_bytes());
}

fn get_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn get_chunk(b: &[u8]) -> ChunkId {
    ChunkId { ino: get_u64(b), idx: get_u64(&b[8..]), ver: get_u64(&b[16..]) }
}

/// Encodes a request frame (with its length prefix).
pub fn encode_request(id: u64, req: &Request) -> Vec<u8> {
    let mut body = Vec::with_capacity(40);
    let op = match req {
        Request::Put { chunk, dirty, data } => {
            body.reserve(data.len());
            put_chunk(&mut body, chunk);
            body.push(u8::from(*dirty));
            body.extend_from_slice(data);
            OP_PUT
        }
        Request::Get { chunk } => {
            put_chunk(&mut body, chunk);
            OP_GET
        }
        Request::Delete { chunk } => {
            put_chunk(&mut body, chunk);
            OP_DELETE
        }
        Request::MarkClean { chunk } => {
            put_chunk(&mut body, chunk);
            OP_MARK_CLEAN
        }
        Request::Stat => OP_STAT,
        Request::Has { chunk } => {
            put_chunk(&mut body, chunk);
            OP_HAS
        }
        Request::Drain => OP_DRAIN,
    };
    frame(op, id, &body)
}

pub fn encode_response(id: u64, resp: &Response) -> Vec<u8> {
    frame(resp.status as u8, id, &resp.body)
}

/// Writes a response frame whose body is sent from `body` where it lies
/// (a chunk the node holds: no copy into a frame).
pub fn write_response(w: &mut impl Write, id: u64, status: Status, body: &[u8]) -> io::Result<()> {
    w.write_all(&head(status as u8, id, body.len()))?;
    w.write_all(body)
}

/// A PUT frame up to its data, which follows it on the wire (written from
/// the caller's buffer: one chunk goes to R nodes without R copies).
pub fn encode_put_head(id: u64, chunk: &ChunkId, dirty: bool, data_len: usize) -> Vec<u8> {
    let mut out = head(OP_PUT, id, 25 + data_len);
    put_chunk(&mut out, chunk);
    out.push(u8::from(dirty));
    out
}

/// Length prefix, tag and id of a frame whose body is `body_len` bytes.
fn head(tag: u8, id: u64, body_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 9 + 25);
    out.extend_from_slice(&((9 + body_len) as u32).to_be_bytes());
    out.push(tag);
    out.extend_from_slice(&id.to_be_bytes());
    out
}

fn frame(tag: u8, id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = head(tag, id, body.len());
    out.extend_from_slice(body);
    out
}

/// Why a frame could not be read: the stream failed or ended inside a frame,
/// or the frame is malformed (the connection cannot be trusted after either).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Bad(#[from] DecodeError),
}

/// Reads a frame's length prefix, tag and id; `Ok(None)` on a clean EOF
/// between frames. Returns the tag, the id and the body's length, checked
/// before anything of that size is allocated.
fn read_head(r: &mut impl Read) -> Result<Option<(u8, u64, usize)>, ReadError> {
    let mut len = [0u8; 4];
    // Only an end before a frame's first byte is clean.
    loop {
        match r.read(&mut len[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    r.read_exact(&mut len[1..])?;
    let len = u32::from_be_bytes(len) as usize;
    if !(9..=MAX_FRAME).contains(&len) {
        return Err(DecodeError::BadLength(len).into());
    }
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    Ok(Some((head[0], get_u64(&head[1..]), len - 9)))
}

/// A new zeroed buffer of `n` bytes (for reads that have no spare memory).
pub fn new_buffer(n: usize) -> Vec<u8> {
    vec![0u8; n]
}

/// Reads `n` bytes into a buffer of their own from `buffer` (`n` bytes
/// long: every byte is overwritten), where they stay: a chunk is never
/// moved after its read. (`read_exact` lets a buffered reader pass a large
/// read straight to the socket.)
fn read_vec(r: &mut impl Read, n: usize, buffer: impl FnOnce(usize) -> Vec<u8>) -> io::Result<Vec<u8>> {
    let mut v = buffer(n);
    assert_eq!(v.len(), n, "a read buffer of the wrong length");
    r.read_exact(&mut v)?;
    Ok(v)
}

fn read_chunk_id(r: &mut impl Read) -> io::Result<ChunkId> {
    let mut b = [0u8; 24];
    r.read_exact(&mut b)?;
    Ok(get_chunk(&b))
}

/// Reads one request frame; `Ok(None)` on a clean EOF between frames. A
/// PUT's data is read straight into a new buffer of its own.
pub fn read_request(r: &mut impl Read) -> Result<Option<(u64, Request)>, ReadError> {
    read_request_into(r, new_buffer)
}

/// [`read_request`], with a PUT's data read into the buffer `buffer` gives
/// for its length (what a node does: memory its store already mapped).
pub fn read_request_into(r: &mut impl Read, buffer: impl FnOnce(usize) -> Vec<u8>) -> Result<Option<(u64, Request)>, ReadError> {
    let Some((op, id, body_len)) = read_head(r)? else { return Ok(None) };
    let need = |n: usize, exact: bool| {
        if body_len < n || (exact && body_len != n) {
            Err(DecodeError::BadBody { op, len: body_len })
        } else {
            Ok(())
        }
    };
    let req = match op {
        OP_PUT => {
            need(25, false)?;
            let chunk = read_chunk_id(r)?;
            let mut dirty = [0u8];
            r.read_exact(&mut dirty)?;
            let dirty = match dirty[0] {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::BadBody { op, len: body_len }.into()),
            };
            Request::Put { chunk, dirty, data: read_vec(r, body_len - 25, buffer)? }
        }
        OP_GET | OP_DELETE | OP_MARK_CLEAN | OP_HAS => {
            need(24, true)?;
            let chunk = read_chunk_id(r)?;
            match op {
                OP_GET => Request::Get { chunk },
                OP_DELETE => Request::Delete { chunk },
                OP_HAS => Request::Has { chunk },
                _ => Request::MarkClean { chunk },
            }
        }
        OP_STAT => {
            need(0, true)?;
            Request::Stat
        }
        OP_DRAIN => {
            need(0, true)?;
            Request::Drain
        }
        other => return Err(DecodeError::UnknownOp(other).into()),
    };
    Ok(Some((id, req)))
}

/// Reads one response frame (what a client does); the body is read straight
/// into its own buffer.
pub fn read_response(r: &mut impl Read) -> Result<Option<(u64, Response)>, ReadError> {
    read_response_into(r, |_, n| new_buffer(n))
}

/// [`read_response`], with the body read into the buffer `buffer` gives for
/// the response's id and length.
pub fn read_response_into(r: &mut impl Read, buffer: impl FnOnce(u64, usize) -> Vec<u8>) -> Result<Option<(u64, Response)>, ReadError> {
    let Some((tag, id, body_len)) = read_head(r)? else { return Ok(None) };
    let status = match tag {
        0 => Status::Ok,
        1 => Status::NotFound,
        2 => Status::NoSpace,
        3 => Status::BadRequest,
        other => return Err(DecodeError::UnknownStatus(other).into()),
    };
    Ok(Some((id, Response { status, body: read_vec(r, body_len, |n| buffer(id, n))? })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk() -> impl Strategy<Value = ChunkId> {
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(ino, idx, ver)| ChunkId { ino, idx, ver })
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (chunk(), any::<bool>(), proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(chunk, dirty, data)| Request::Put { chunk, dirty, data }),
            chunk().prop_map(|chunk| Request::Get { chunk }),
            chunk().prop_map(|chunk| Request::Delete { chunk }),
            chunk().prop_map(|chunk| Request::MarkClean { chunk }),
            Just(Request::Stat),
            chunk().prop_map(|chunk| Request::Has { chunk }),
            Just(Request::Drain),
        ]
    }

    proptest! {
        #[test]
        fn request_roundtrips(id in any::<u64>(), req in request()) {
            let f = encode_request(id, &req);
            let mut r = OneByteAtATime(&f);
            prop_assert_eq!(read_request(&mut r).unwrap(), Some((id, req)));
            prop_assert!(read_request(&mut r).unwrap().is_none());
        }

        /// A PUT sent as its head and then its data is the same frame.
        #[test]
        fn put_head_and_data_make_the_put_frame(id in any::<u64>(), c in chunk(), dirty in any::<bool>(), data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut f = encode_put_head(id, &c, dirty, data.len());
            f.extend_from_slice(&data);
            prop_assert_eq!(f, encode_request(id, &Request::Put { chunk: c, dirty, data }));
        }

        /// A response written from a body in place is the encoded frame.
        #[test]
        fn written_response_is_the_encoded_frame(id in any::<u64>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut w = Vec::new();
            write_response(&mut w, id, Status::NotFound, &body).unwrap();
            prop_assert_eq!(w, encode_response(id, &Response { status: Status::NotFound, body }));
        }

        #[test]
        fn response_roundtrips(id in any::<u64>(), st in 0u8..4, body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let status = read_response(&mut &frame(st, 0, &[])[..]).unwrap().unwrap().1.status;
            let resp = Response { status, body };
            let f = encode_response(id, &resp);
            let mut r = OneByteAtATime(&f);
            prop_assert_eq!(read_response(&mut r).unwrap(), Some((id, resp)));
            prop_assert!(read_response(&mut r).unwrap().is_none());
        }

        /// Arbitrary bytes never panic the parser; they decode or are rejected.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut r = &bytes[..];
            while let Ok(Some(_)) = read_request(&mut r) {}
            let mut r = &bytes[..];
            while let Ok(Some(_)) = read_response(&mut r) {}
        }

        #[test]
        fn member_roundtrips(c in chunk()) {
            prop_assert_eq!(ChunkId::parse_member(&c.member()), Some(c));
        }
    }

    #[test]
    fn oversized_length_is_rejected_without_allocating() {
        let f = [0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        assert!(matches!(read_request(&mut &f[..]), Err(ReadError::Bad(DecodeError::BadLength(_)))));
        assert!(matches!(read_response(&mut &f[..]), Err(ReadError::Bad(DecodeError::BadLength(_)))));
    }

    #[test]
    fn a_stream_ending_inside_a_frame_is_an_error_not_a_clean_end() {
        let f = encode_request(9, &Request::Put { chunk: ChunkId { ino: 1, idx: 2, ver: 3 }, dirty: true, data: vec![7; 100] });
        for cut in 1..f.len() {
            assert!(matches!(read_request(&mut &f[..cut]), Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof), "cut at {cut}");
        }
    }

    /// A reader that hands out one byte per call, as a slow socket may.
    struct OneByteAtATime<'a>(&'a [u8]);

    impl Read for OneByteAtATime<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else { return Ok(0) };
            match buf.first_mut() {
                Some(b) => {
                    *b = *first;
                    self.0 = rest;
                    Ok(1)
                }
                None => Ok(0),
            }
        }
    }
}
