//! Wire constants and pure parsers/encoders of the NBD protocol (fixed newstyle,
//! structured replies, `base:allocation`), written from NetworkBlockDevice/nbd
//! `doc/proto.md`. Nothing here does I/O, so every parser can be fuzzed directly.

use thiserror::Error;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Extended headers (`extension-ext-header` branch of doc/proto.md).
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
pub const FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) + 8;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;
pub const REP_ERR_EXT_HEADER_REQD: u32 = (1 << 31) + 10;

// NBD_REP_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Extended headers only: `len` is the length of a payload that follows.
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// base:allocation flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context surge serves.
pub const BASE_ALLOCATION: &str = "base:allocation";

// Error values on the wire (the spec fixes these numbers).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

pub const REQUEST_HEADER_LEN: usize = 28;
pub const EXTENDED_REQUEST_HEADER_LEN: usize = 32;
pub const EXTENDED_REPLY_HEADER_LEN: usize = 32;
pub const OPTION_HEADER_LEN: usize = 16;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;
/// Longest string the spec allows (export names, queries, messages).
pub const MAX_STRING: usize = 4096;

/// Maps a host errno (e.g. from `BlockError::errno`) to one of the values the
/// spec allows on the wire; anything unlisted becomes EIO.
pub fn wire_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// Malformed protocol data.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("option data is truncated")]
    Truncated,
    #[error("option data has {0} trailing bytes")]
    Trailing(usize),
    #[error("string longer than {MAX_STRING} bytes")]
    StringTooLong,
    #[error("string is not valid UTF-8")]
    NotUtf8,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// A client option header: `IHAVEOPT`, option, length of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

pub fn parse_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ParseError> {
    let magic = be64(&b[0..8]);
    if magic != IHAVEOPT {
        return Err(ParseError::BadMagic(magic));
    }
    Ok(OptionHeader { option: be32(&b[8..12]), len: be32(&b[12..16]) })
}

pub fn encode_option_header(option: u32, len: u32) -> [u8; OPTION_HEADER_LEN] {
    let mut b = [0u8; OPTION_HEADER_LEN];
    b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&len.to_be_bytes());
    b
}

/// Reads length-prefixed fields out of option data.
struct Fields<'a> {
    data: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if self.data.len() < n {
            return Err(ParseError::Truncated);
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, ParseError> {
        self.take(2).map(be16)
    }
    fn u32(&mut self) -> Result<u32, ParseError> {
        self.take(4).map(be32)
    }
    fn string(&mut self, len: usize) -> Result<String, ParseError> {
        if len > MAX_STRING {
            return Err(ParseError::StringTooLong);
        }
        let raw = self.take(len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| ParseError::NotUtf8)
    }
    fn end(&self) -> Result<(), ParseError> {
        match self.data.len() {
            0 => Ok(()),
            n => Err(ParseError::Trailing(n)),
        }
    }
}

/// NBD_OPT_INFO / NBD_OPT_GO data: export name and the info types asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ParseError> {
    let mut f = Fields { data };
    let name_len = f.u32()? as usize;
    let name = f.string(name_len)?;
    let n = f.u16()? as usize;
    let infos = (0..n).map(|_| f.u16()).collect::<Result<_, _>>()?;
    f.end()?;
    Ok(InfoRequest { name, infos })
}

pub fn encode_info_request(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = Vec::with_capacity(6 + name.len() + 2 * infos.len());
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, ParseError> {
    let mut f = Fields { data };
    let name_len = f.u32()? as usize;
    let export = f.string(name_len)?;
    let n = f.u32()? as usize;
    // Each query needs at least its 4-byte length: reject absurd counts before allocating.
    if n > f.data.len() / 4 {
        return Err(ParseError::Truncated);
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        let len = f.u32()? as usize;
        queries.push(f.string(len)?);
    }
    f.end()?;
    Ok(MetaContextRequest { export, queries })
}

pub fn encode_meta_context_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(export.len() as u32).to_be_bytes());
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

/// A server option reply header: magic, option, reply type, length.
pub fn encode_option_reply_header(option: u32, reply: u32, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

pub fn parse_option_reply_header(b: &[u8; 20]) -> Result<OptionReplyHeader, ParseError> {
    let magic = be64(&b[0..8]);
    if magic != OPT_REPLY_MAGIC {
        return Err(ParseError::BadMagic(magic));
    }
    Ok(OptionReplyHeader { option: be32(&b[8..12]), reply: be32(&b[12..16]), len: be32(&b[16..20]) })
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

pub fn parse_request(b: &[u8; REQUEST_HEADER_LEN]) -> Result<Request, ParseError> {
    let magic = be32(&b[0..4]);
    if magic != REQUEST_MAGIC {
        return Err(ParseError::BadMagic(magic as u64));
    }
    Ok(Request {
        flags: be16(&b[4..6]),
        cmd: be16(&b[6..8]),
        cookie: be64(&b[8..16]),
        offset: be64(&b[16..24]),
        len: be32(&b[24..28]),
    })
}

pub fn encode_request(r: &Request) -> [u8; REQUEST_HEADER_LEN] {
    let mut b = [0u8; REQUEST_HEADER_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.cmd.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// A request with a 64-bit length: what an extended request header carries
/// (payload length with [`CMD_FLAG_PAYLOAD_LEN`], else effect length), and what
/// a compact one converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedRequest {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u64,
}

impl From<Request> for ExtendedRequest {
    fn from(r: Request) -> Self {
        ExtendedRequest { flags: r.flags, cmd: r.cmd, cookie: r.cookie, offset: r.offset, len: r.len as u64 }
    }
}

pub fn parse_extended_request(b: &[u8; EXTENDED_REQUEST_HEADER_LEN]) -> Result<ExtendedRequest, ParseError> {
    let magic = be32(&b[0..4]);
    if magic != EXTENDED_REQUEST_MAGIC {
        return Err(ParseError::BadMagic(magic as u64));
    }
    Ok(ExtendedRequest { flags: be16(&b[4..6]), cmd: be16(&b[6..8]), cookie: be64(&b[8..16]), offset: be64(&b[16..24]), len: be64(&b[24..32]) })
}

pub fn encode_extended_request(r: &ExtendedRequest) -> [u8; EXTENDED_REQUEST_HEADER_LEN] {
    let mut b = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    b[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.cmd.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..32].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// An extended reply chunk header; `offset` echoes the request's.
pub fn encode_extended_reply_header(flags: u16, kind: u16, cookie: u64, offset: u64, len: u64) -> [u8; EXTENDED_REPLY_HEADER_LEN] {
    let mut b = [0u8; EXTENDED_REPLY_HEADER_LEN];
    b[0..4].copy_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..32].copy_from_slice(&len.to_be_bytes());
    b
}

/// Command flags that are valid for `cmd` (FUA is accepted on every command, as
/// the spec requires once SEND_FUA is advertised).
pub fn allowed_flags(cmd: u16, structured: bool) -> u16 {
    CMD_FLAG_FUA
        | match cmd {
            CMD_READ if structured => CMD_FLAG_DF,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        }
}

pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

pub fn encode_chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; CHUNK_HEADER_LEN] {
    let mut b = [0u8; CHUNK_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A reply header as the client sees it: simple or one structured chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple { error: u32, cookie: u64 },
    Chunk { flags: u16, kind: u16, cookie: u64, len: u32 },
}

/// Parses the first 4 bytes (magic) to tell how long the header is: 16 for simple
/// replies, 20 for structured chunks.
pub fn reply_header_len(magic: &[u8; 4]) -> Result<usize, ParseError> {
    match u32::from_be_bytes(*magic) {
        SIMPLE_REPLY_MAGIC => Ok(SIMPLE_REPLY_LEN),
        STRUCTURED_REPLY_MAGIC => Ok(CHUNK_HEADER_LEN),
        m => Err(ParseError::BadMagic(m as u64)),
    }
}

pub fn parse_reply_header(b: &[u8]) -> Result<ReplyHeader, ParseError> {
    if b.len() < 4 {
        return Err(ParseError::Truncated);
    }
    let need = reply_header_len(&[b[0], b[1], b[2], b[3]])?;
    if b.len() < need {
        return Err(ParseError::Truncated);
    }
    Ok(if need == SIMPLE_REPLY_LEN {
        ReplyHeader::Simple { error: be32(&b[4..8]), cookie: be64(&b[8..16]) }
    } else {
        ReplyHeader::Chunk { flags: be16(&b[4..6]), kind: be16(&b[6..8]), cookie: be64(&b[8..16]), len: be32(&b[16..20]) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_roundtrips() {
        let r = Request { flags: CMD_FLAG_FUA, cmd: CMD_WRITE, cookie: 0xdead_beef_0102, offset: 1 << 40, len: 4096 };
        assert_eq!(parse_request(&encode_request(&r)), Ok(r));
    }

    #[test]
    fn extended_request_roundtrips_with_a_64_bit_length() {
        let r = ExtendedRequest { flags: CMD_FLAG_PAYLOAD_LEN, cmd: CMD_WRITE, cookie: 9, offset: 1 << 50, len: (1 << 40) + 3 };
        assert_eq!(parse_extended_request(&encode_extended_request(&r)), Ok(r));
        let compact = encode_request(&Request { flags: 0, cmd: CMD_READ, cookie: 1, offset: 0, len: 1 });
        let mut b = [0u8; 32];
        b[..28].copy_from_slice(&compact);
        assert!(matches!(parse_extended_request(&b), Err(ParseError::BadMagic(_))));
        let h = encode_extended_reply_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 7, 1 << 33, 0);
        assert_eq!(&h[0..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(u64::from_be_bytes(h[16..24].try_into().unwrap()), 1 << 33);
    }

    #[test]
    fn request_with_bad_magic_is_rejected() {
        let mut b = encode_request(&Request { flags: 0, cmd: 0, cookie: 1, offset: 0, len: 1 });
        b[0] ^= 1;
        assert!(matches!(parse_request(&b), Err(ParseError::BadMagic(_))));
    }

    #[test]
    fn info_request_roundtrips_and_rejects_trailing_bytes() {
        let data = encode_info_request("disk", &[INFO_NAME, INFO_BLOCK_SIZE]);
        assert_eq!(parse_info_request(&data), Ok(InfoRequest { name: "disk".into(), infos: vec![1, 3] }));
        let mut longer = data.clone();
        longer.push(0);
        assert_eq!(parse_info_request(&longer), Err(ParseError::Trailing(1)));
        assert_eq!(parse_info_request(&data[..data.len() - 1]), Err(ParseError::Truncated));
    }

    #[test]
    fn meta_context_request_roundtrips() {
        let data = encode_meta_context_request("", &[BASE_ALLOCATION, "x-y:z"]);
        let parsed = parse_meta_context_request(&data).unwrap();
        assert_eq!(parsed.export, "");
        assert_eq!(parsed.queries, vec![BASE_ALLOCATION.to_string(), "x-y:z".to_string()]);
    }

    #[test]
    fn meta_context_request_with_huge_count_is_truncated_not_allocated() {
        let mut data = 0u32.to_be_bytes().to_vec();
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_meta_context_request(&data), Err(ParseError::Truncated));
    }

    #[test]
    fn wire_errno_maps_unknown_errors_to_eio() {
        assert_eq!(wire_errno(libc::EDQUOT), ENOSPC);
        assert_eq!(wire_errno(libc::EBADF), EIO);
        assert_eq!(wire_errno(libc::EINVAL), EINVAL);
    }

    proptest! {
        #[test]
        fn option_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_info_request(&data);
            let _ = parse_meta_context_request(&data);
            let _ = parse_reply_header(&data);
            if data.len() >= EXTENDED_REQUEST_HEADER_LEN {
                let _ = parse_extended_request(data[..EXTENDED_REQUEST_HEADER_LEN].try_into().unwrap());
            }
        }
    }
}
