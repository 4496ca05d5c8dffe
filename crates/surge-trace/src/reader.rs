//! Reading a trace back.

use crate::format::{self, DecodeError, Decoder, Header, Op, Rec, TraceError, SEGMENT_EXT};
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The segment files of a trace directory, in order.
pub fn segments(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let rd = std::fs::read_dir(dir).map_err(|e| TraceError::io(dir.display(), e))?;
    let mut v: Vec<(u32, PathBuf)> = Vec::new();
    for e in rd {
        let p = e.map_err(|e| TraceError::io(dir.display(), e))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(n) = name.strip_prefix("seg-").and_then(|r| r.strip_suffix(&format!(".{SEGMENT_EXT}"))).and_then(|n| n.parse().ok()) {
            v.push((n, p));
        }
    }
    v.sort();
    Ok(v.into_iter().map(|x| x.1).collect())
}

/// A whole trace in memory (48 bytes a request).
#[derive(Debug, Clone)]
pub struct Trace {
    /// The first segment's header.
    pub header: Header,
    /// Requests in time order; `Op::Dropped` markers are taken out and counted.
    pub records: Vec<Rec>,
    /// Requests the recorder dropped (queue full).
    pub dropped: u64,
    /// The last segment ended inside its compressed stream: the recording did
    /// not stop cleanly (everything before the cut is kept).
    pub truncated: bool,
    /// The oldest segment left (> 1: older ones were rotated away).
    pub first_segment: u32,
}

impl Trace {
    pub fn from_records(header: Header, mut records: Vec<Rec>) -> Self {
        records.sort_by_key(|r| r.t_ns);
        Trace { header, records, dropped: 0, truncated: false, first_segment: 1 }
    }

    /// Open a trace directory or a single segment file.
    pub fn open(path: &Path) -> Result<Trace, TraceError> {
        let files = if path.is_dir() {
            let s = segments(path)?;
            if s.is_empty() {
                return Err(TraceError::Empty { path: path.display().to_string() });
            }
            s
        } else {
            vec![path.to_path_buf()]
        };
        let mut header = None;
        let mut records = Vec::new();
        let (mut dropped, mut truncated) = (0, false);
        for (i, f) in files.iter().enumerate() {
            let last = i + 1 == files.len();
            let file = File::open(f).map_err(|e| TraceError::io(f.display(), e))?;
            let seg = read_segment(BufReader::new(file), &f.display().to_string(), &mut records, &mut dropped)?;
            if seg.1 {
                if !last {
                    return Err(TraceError::Record { path: f.display().to_string(), index: records.len() as u64, what: "segment cut short, but it is not the newest one".into() });
                }
                truncated = true;
            }
            header.get_or_insert(seg.0);
        }
        let header = header.expect("at least one segment");
        let first_segment = header.segment;
        records.sort_by_key(|r| r.t_ns);
        Ok(Trace { header, records, dropped, truncated, first_segment })
    }

    /// End of the last request's submission (ns).
    pub fn span_ns(&self) -> u64 {
        match (self.records.first(), self.records.last()) {
            (Some(a), Some(b)) => b.t_ns - a.t_ns,
            _ => 0,
        }
    }

    /// The highest byte any request touches.
    pub fn footprint(&self) -> u64 {
        self.records.iter().filter(|r| r.op != Op::Flush).map(|r| r.offset + r.len).max().unwrap_or(0)
    }
}

/// Read one segment's records (appended to `out`); returns its header and
/// whether it was cut short.
pub fn read_segment(mut r: impl Read, path: &str, out: &mut Vec<Rec>, dropped: &mut u64) -> Result<(Header, bool), TraceError> {
    let h = format::read_header(&mut r, path)?;
    let mut d = Decoder::new(MultiGzDecoder::new(r), h.base_ns);
    let start = out.len() as u64;
    loop {
        match d.next_rec() {
            Ok(Some(rec)) if rec.op == Op::Dropped => *dropped += rec.len,
            Ok(Some(rec)) => out.push(rec),
            Ok(None) => return Ok((h, false)),
            Err(DecodeError::Truncated) => return Ok((h, true)),
            Err(DecodeError::Bad(what)) => return Err(TraceError::Record { path: path.into(), index: out.len() as u64 - start, what }),
            Err(DecodeError::Io(e)) => return Err(TraceError::io(path, e)),
        }
    }
}

/// Parse a segment from bytes (the fuzz entry point): an error, never a panic.
pub fn parse_segment(bytes: &[u8]) -> Result<(Header, Vec<Rec>, bool), TraceError> {
    let mut v = Vec::new();
    let mut dropped = 0;
    let (h, t) = read_segment(bytes, "input", &mut v, &mut dropped)?;
    Ok((h, v, t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Source;
    use crate::writer::{Limits, SegmentWriter};

    fn one_segment(n: u64) -> Vec<u8> {
        let d = tempfile::tempdir().unwrap();
        let mut w = SegmentWriter::create(d.path(), Header::new(Source::SurgeRecord, "x"), Limits::default()).unwrap();
        for i in 0..n {
            w.push(&Rec { t_ns: i * 100, op: Op::Write, offset: i * 4096, len: 4096, fua: false, dur_ns: 0 }).unwrap();
        }
        w.finish().unwrap();
        std::fs::read(d.path().join(crate::writer::segment_name(1))).unwrap()
    }

    #[test]
    fn a_cut_segment_keeps_what_came_before_the_cut() {
        let full = one_segment(5000);
        let (_, all, cut) = parse_segment(&full).unwrap();
        assert_eq!((all.len(), cut), (5000, false));
        let (_, part, cut) = parse_segment(&full[..full.len() * 2 / 3]).unwrap();
        assert!(cut);
        assert!(!part.is_empty() && part.len() < 5000);
        assert_eq!(part[..], all[..part.len()]);
    }

    #[test]
    fn corrupt_bodies_give_errors_not_panics() {
        let full = one_segment(2000);
        let hdr = 14 + u32::from_le_bytes(full[10..14].try_into().unwrap()) as usize;
        let mut errors = 0;
        for i in (hdr..full.len()).step_by(7) {
            let mut b = full.clone();
            b[i] ^= 0x55;
            if parse_segment(&b).is_err() {
                errors += 1;
            }
        }
        assert!(errors > 0, "gzip's CRC must catch flipped bytes");
    }

    #[test]
    fn an_empty_dir_and_a_foreign_file_are_named() {
        let d = tempfile::tempdir().unwrap();
        assert!(Trace::open(d.path()).unwrap_err().to_string().contains("no trace segments"));
        let f = d.path().join("x.txt");
        std::fs::write(&f, "hello, not a trace").unwrap();
        assert!(Trace::open(&f).unwrap_err().to_string().contains("not a surge trace"));
    }
}
