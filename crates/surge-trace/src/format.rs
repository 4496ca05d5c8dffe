//! The trace format (version 1).
//!
//! A trace is a directory of segment files `seg-NNNNNN.strace` (or one such
//! file), read in the order of their numbers. Each segment:
//!
//! ```text
//! magic    8 bytes  "SURGETRC"
//! version  u16 LE   1
//! hdr_len  u32 LE   at most 64 KiB
//! header   hdr_len bytes of JSON (Header)
//! body     a gzip stream of records
//! ```
//!
//! A record is a tag byte (bits 0-2: the op, bit 3: FUA), then LEB128
//! varints: the time since the previous record of the segment in ns, zigzag
//! encoded (threads finish out of order; the first record counts from the
//! header's `base_ns`), offset, length and the request's service time in ns (0:
//! unknown). `Op::Dropped` records carry in `len` how many requests the
//! recorder had to drop there (its queue was full).

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

pub const MAGIC: &[u8; 8] = b"SURGETRC";
pub const VERSION: u16 = 1;
pub const MAX_HEADER: u32 = 64 * 1024;
pub const SEGMENT_EXT: &str = "strace";

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: not a surge trace (bad magic; expected a file written by `surge serve --record` or `surge trace import`)")]
    Magic { path: String },
    #[error("{path}: trace format version {got}, this surge reads version {VERSION}")]
    Version { path: String, got: u16 },
    #[error("{path}: bad header: {what}")]
    Header { path: String, what: String },
    #[error("{path}: record {index}: {what}")]
    Record { path: String, index: u64, what: String },
    #[error("{path}: no trace segments (seg-*.strace) in this directory")]
    Empty { path: String },
    #[error("{what} line {line}: {msg}: {text:?}")]
    Parse { what: &'static str, line: usize, msg: String, text: String },
    #[error("{0}")]
    Invalid(String),
}

impl TraceError {
    pub fn io(path: impl std::fmt::Display, source: io::Error) -> Self {
        TraceError::Io { path: path.to_string(), source }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    /// write_zeroes
    Zero,
    /// `len` requests were dropped here (recorder queue full).
    Dropped,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Flush => 2,
            Op::Trim => 3,
            Op::Zero => 4,
            Op::Dropped => 5,
        }
    }
    fn from_code(c: u8) -> Option<Op> {
        Some(match c {
            0 => Op::Read,
            1 => Op::Write,
            2 => Op::Flush,
            3 => Op::Trim,
            4 => Op::Zero,
            5 => Op::Dropped,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::Zero => "zero",
            Op::Dropped => "dropped",
        }
    }
    /// Moves data through the volume (what a volume model charges).
    pub fn moves_data(self) -> bool {
        matches!(self, Op::Read | Op::Write | Op::Zero)
    }
}

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rec {
    /// Submission time, ns since the start of the trace.
    pub t_ns: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
    /// How long the request took where it was recorded (0: unknown).
    pub dur_ns: u64,
}

/// Where a trace came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// `surge serve --record`: every request an export saw.
    SurgeRecord,
    Blkparse,
    FioIolog,
    /// `iostat -x`: per-interval averages only; requests are synthesized.
    Iostat,
}

/// The JSON header of every segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u16,
    pub source: Source,
    /// Per-interval averages, not requests: offsets and sizes are synthesized
    /// (`iostat`); a plan from it is an estimate of the rates only.
    pub aggregate: bool,
    /// Request times are real (false: fio v2 iologs, where only the order is known).
    pub timed: bool,
    /// What was recorded (export name, device, file).
    pub name: String,
    /// Size of the device, if known (0: unknown).
    pub device_size: u64,
    /// Segment number (1, 2, ...).
    pub segment: u32,
    /// Time of the first record's base, ns since the start of the trace.
    pub base_ns: u64,
    /// Wall-clock start of the trace, ms since the Unix epoch (0: unknown).
    pub unix_start_ms: u64,
    /// Free text: how the trace was made, what it lacks.
    #[serde(default)]
    pub note: String,
}

impl Header {
    pub fn new(source: Source, name: &str) -> Self {
        Header {
            version: VERSION,
            source,
            aggregate: source == Source::Iostat,
            timed: true,
            name: name.to_string(),
            device_size: 0,
            segment: 1,
            base_ns: 0,
            unix_start_ms: 0,
            note: String::new(),
        }
    }
}

pub fn write_header(w: &mut impl Write, h: &Header) -> io::Result<()> {
    let json = serde_json::to_vec(h).map_err(io::Error::other)?;
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(json.len() as u32).to_le_bytes())?;
    w.write_all(&json)
}

/// Read and check a segment's header.
pub fn read_header(r: &mut impl Read, path: &str) -> Result<Header, TraceError> {
    let mut fixed = [0u8; 14];
    r.read_exact(&mut fixed).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => TraceError::Magic { path: path.into() },
        _ => TraceError::io(path, e),
    })?;
    if &fixed[..8] != MAGIC {
        return Err(TraceError::Magic { path: path.into() });
    }
    let version = u16::from_le_bytes([fixed[8], fixed[9]]);
    if version != VERSION {
        return Err(TraceError::Version { path: path.into(), got: version });
    }
    let len = u32::from_le_bytes(fixed[10..14].try_into().expect("4 bytes"));
    if len > MAX_HEADER {
        return Err(TraceError::Header { path: path.into(), what: format!("{len} bytes long (at most {MAX_HEADER})") });
    }
    let mut json = vec![0u8; len as usize];
    r.read_exact(&mut json).map_err(|e| TraceError::Header { path: path.into(), what: format!("cut short: {e}") })?;
    let h: Header = serde_json::from_slice(&json).map_err(|e| TraceError::Header { path: path.into(), what: e.to_string() })?;
    if h.version != VERSION {
        return Err(TraceError::Header { path: path.into(), what: format!("JSON says version {}", h.version) });
    }
    Ok(h)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Encodes records relative to the previous one.
#[derive(Debug, Default)]
pub struct Encoder {
    prev_ns: u64,
}

impl Encoder {
    pub fn new(base_ns: u64) -> Self {
        Encoder { prev_ns: base_ns }
    }
    pub fn encode(&mut self, r: &Rec, out: &mut Vec<u8>) {
        out.push(r.op.code() | if r.fua { 8 } else { 0 });
        let dt = (r.t_ns as i128 - self.prev_ns as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        put_varint(out, zigzag(dt));
        put_varint(out, r.offset);
        put_varint(out, r.len);
        put_varint(out, r.dur_ns);
        self.prev_ns = r.t_ns;
    }
}

/// What went wrong decoding one record.
#[derive(Debug)]
pub enum DecodeError {
    /// The stream ended inside a record (or the gzip stream was cut short).
    Truncated,
    Bad(String),
    Io(io::Error),
}

/// Decodes records from a byte stream (the decompressed body).
pub struct Decoder<R> {
    r: R,
    prev_ns: u64,
}

impl<R: Read> Decoder<R> {
    pub fn new(r: R, base_ns: u64) -> Self {
        Decoder { r, prev_ns: base_ns }
    }

    fn byte(&mut self) -> Result<Option<u8>, DecodeError> {
        let mut b = [0u8; 1];
        loop {
            return match self.r.read(&mut b) {
                Ok(0) => Ok(None),
                Ok(_) => Ok(Some(b[0])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(DecodeError::Truncated),
                Err(e) if e.kind() == io::ErrorKind::InvalidInput || e.kind() == io::ErrorKind::InvalidData => {
                    Err(DecodeError::Bad(format!("compressed body is corrupt: {e}")))
                }
                Err(e) => Err(DecodeError::Io(e)),
            };
        }
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?.ok_or(DecodeError::Truncated)?;
            let part = (b & 0x7f) as u64;
            if shift == 63 && part > 1 {
                return Err(DecodeError::Bad("varint overflows 64 bits".into()));
            }
            v |= part << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Bad("varint longer than 10 bytes".into()))
    }

    /// The next record; `Ok(None)` at a clean end.
    pub fn next_rec(&mut self) -> Result<Option<Rec>, DecodeError> {
        let Some(tag) = self.byte()? else { return Ok(None) };
        if tag & !0x0f != 0 {
            return Err(DecodeError::Bad(format!("tag byte {tag:#04x} has unknown bits")));
        }
        let op = Op::from_code(tag & 7).ok_or_else(|| DecodeError::Bad(format!("unknown op code {}", tag & 7)))?;
        let dt = unzigzag(self.varint()?);
        let t = self.prev_ns as i128 + dt as i128;
        if t < 0 || t > u64::MAX as i128 {
            return Err(DecodeError::Bad(format!("time out of range ({t} ns)")));
        }
        let offset = self.varint()?;
        let len = self.varint()?;
        let dur_ns = self.varint()?;
        if op != Op::Dropped && offset.checked_add(len).is_none() {
            return Err(DecodeError::Bad(format!("offset {offset} + length {len} overflows")));
        }
        self.prev_ns = t as u64;
        Ok(Some(Rec { t_ns: t as u64, op, offset, len, fua: tag & 8 != 0, dur_ns }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![Just(Op::Read), Just(Op::Write), Just(Op::Flush), Just(Op::Trim), Just(Op::Zero), Just(Op::Dropped)]
    }

    proptest! {
        #[test]
        fn records_round_trip(recs in proptest::collection::vec((0u64..1u64 << 50, op(), 0u64..1 << 40, 0u64..1 << 30, any::<bool>(), any::<u32>()), 0..200)) {
            let recs: Vec<Rec> = recs.into_iter().map(|(t_ns, op, offset, len, fua, d)| Rec { t_ns, op, offset, len, fua, dur_ns: d as u64 }).collect();
            let mut e = Encoder::new(7);
            let mut buf = Vec::new();
            for r in &recs { e.encode(r, &mut buf); }
            let mut d = Decoder::new(&buf[..], 7);
            let mut back = Vec::new();
            while let Some(r) = d.next_rec().unwrap() { back.push(r); }
            prop_assert_eq!(back, recs);
        }

        #[test]
        fn any_bytes_decode_or_error_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut d = Decoder::new(&bytes[..], 0);
            for _ in 0..300 {
                match d.next_rec() { Ok(Some(_)) => {}, _ => break }
            }
        }
    }

    #[test]
    fn header_round_trips_and_bad_ones_are_named() {
        let mut h = Header::new(Source::Blkparse, "sda");
        h.device_size = 1 << 30;
        let mut buf = Vec::new();
        write_header(&mut buf, &h).unwrap();
        assert_eq!(read_header(&mut &buf[..], "x").unwrap(), h);
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(matches!(read_header(&mut &bad[..], "x"), Err(TraceError::Magic { .. })));
        let mut v2 = buf.clone();
        v2[8] = 2;
        assert!(matches!(read_header(&mut &v2[..], "x"), Err(TraceError::Version { got: 2, .. })));
        assert!(matches!(read_header(&mut &buf[..20], "x"), Err(TraceError::Header { .. })));
    }
}
