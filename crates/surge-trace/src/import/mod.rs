//! Traces users already have, into the surge format.
//!
//! - `blkparse`: the default text output of `blkparse` (one event a line);
//!   queue events (`Q`) are taken, or issue events (`D`) if there are none.
//! - `fio-iolog`: `fio --write_iolog` files, version 2 (order only, `wait`
//!   lines for delays) and 3 (a timestamp in µs on every line).
//! - `iostat`: `iostat -x` reports of one device: per-interval averages, not
//!   requests. Requests are synthesized (mean size, evenly spaced, offsets
//!   uniformly random from a fixed seed) and the trace is marked `aggregate`.
//!
//! Every parser returns a clear error with the line number for a line it
//! cannot read, and never panics (fuzzed in `fuzz/`).

mod blkparse;
mod fio;
mod iostat;

use crate::format::{Header, Rec, TraceError};
use crate::reader::Trace;

pub use blkparse::parse as parse_blkparse;
pub use fio::parse as parse_fio;
pub use iostat::{parse as parse_iostat, IostatOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Blkparse,
    FioIolog,
    Iostat,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "blkparse" => Ok(Format::Blkparse),
            "fio-iolog" | "fio" => Ok(Format::FioIolog),
            "iostat" => Ok(Format::Iostat),
            o => Err(format!("unknown trace format {o:?}: blkparse, fio-iolog or iostat")),
        }
    }
}

/// Parse `text` in `format` into a trace.
pub fn import(format: Format, text: &str, iostat: &IostatOptions) -> Result<Trace, TraceError> {
    let (header, recs): (Header, Vec<Rec>) = match format {
        Format::Blkparse => blkparse::parse(text)?,
        Format::FioIolog => fio::parse(text)?,
        Format::Iostat => iostat::parse(text, iostat)?,
    };
    if recs.is_empty() {
        return Err(TraceError::Invalid(format!("no requests found in the {format:?} input")));
    }
    Ok(Trace::from_records(header, recs))
}

fn perr(what: &'static str, line: usize, msg: impl Into<String>, text: &str) -> TraceError {
    TraceError::Parse { what, line, msg: msg.into(), text: text.chars().take(120).collect() }
}

fn num<T: std::str::FromStr>(what: &'static str, line: usize, field: &str, name: &str, text: &str) -> Result<T, TraceError> {
    field.parse().map_err(|_| perr(what, line, format!("{name} {field:?} is not a number"), text))
}

/// Seconds (a decimal number) to ns, refusing what is not a finite, non-negative time.
fn secs_ns(what: &'static str, line: usize, s: &str, text: &str) -> Result<u64, TraceError> {
    let v: f64 = num(what, line, s, "time", text)?;
    if !(v.is_finite() && (0.0..1e9).contains(&v)) {
        return Err(perr(what, line, format!("time {s} out of range"), text));
    }
    Ok((v * 1e9).round() as u64)
}

fn span(what: &'static str, line: usize, offset: u64, len: u64, text: &str) -> Result<(), TraceError> {
    offset.checked_add(len).map(|_| ()).ok_or_else(|| perr(what, line, "offset + length overflows", text))
}
