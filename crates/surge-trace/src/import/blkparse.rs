//! `blkparse` default output:
//!
//! ```text
//!   8,0    3        1     0.000000000  4162  Q  WS 3417048 + 8 [kjournald]
//! ```
//!
//! device, CPU, sequence, time (s), PID, action, RWBS, sector + sectors,
//! [process]. RWBS: a leading `F` is a preflush, then `R`/`W`/`D` (discard)/`N`,
//! then `F` for FUA, then flags (`S` sync, `M` meta, `A` ahead...). A flush
//! alone is `FN` (or `F` with 0 sectors). Lines that do not start with a
//! `major,minor` device (blkparse's closing summary, blank lines) are skipped;
//! an event line that does not parse is an error.

use super::{num, perr, secs_ns, span};
use crate::format::{Header, Op, Rec, Source, TraceError};

const WHAT: &str = "blkparse";

fn is_device(f: &str) -> bool {
    f.split_once(',').is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit()))
}

/// (preflush, op, fua) from RWBS; `None`: not a request we model.
fn rwbs(s: &str) -> Result<(bool, Option<Op>, bool), String> {
    let mut c = s.chars().peekable();
    let pre = c.next_if_eq(&'F').is_some();
    let op = match c.next() {
        Some('R') => Some(Op::Read),
        Some('W') => Some(Op::Write),
        Some('D') => Some(Op::Trim),
        Some('N') | None => None,
        Some(x) if pre && "SMA".contains(x) => None,
        Some(x) => return Err(format!("RWBS {s:?}: unknown operation {x:?}")),
    };
    let fua = c.next_if_eq(&'F').is_some();
    if let Some(x) = c.find(|x| !"SMAEB".contains(*x)) {
        return Err(format!("RWBS {s:?}: unknown flag {x:?}"));
    }
    Ok((pre, op, fua))
}

pub fn parse(text: &str) -> Result<(Header, Vec<Rec>), TraceError> {
    let (mut q, mut d) = (Vec::new(), Vec::new());
    let mut device = String::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first().is_none_or(|x| !is_device(x)) {
            continue;
        }
        if f.len() < 7 {
            return Err(perr(WHAT, line, "an event needs device, cpu, seq, time, pid, action, RWBS", l));
        }
        let action = f[5];
        let target = match action {
            "Q" => &mut q,
            "D" => &mut d,
            _ => continue,
        };
        if device.is_empty() {
            device = f[0].to_string();
        }
        let t = secs_ns(WHAT, line, f[3], l)?;
        let (pre, op, fua) = rwbs(f[6]).map_err(|m| perr(WHAT, line, m, l))?;
        let (mut offset, mut len) = (0u64, 0u64);
        if f.len() >= 10 && f[8] == "+" {
            let sector: u64 = num(WHAT, line, f[7], "sector", l)?;
            let n: u64 = num(WHAT, line, f[9], "sector count", l)?;
            offset = sector.checked_mul(512).ok_or_else(|| perr(WHAT, line, "sector out of range", l))?;
            len = n.checked_mul(512).ok_or_else(|| perr(WHAT, line, "sector count out of range", l))?;
            span(WHAT, line, offset, len, l)?;
        }
        if pre {
            target.push(Rec { t_ns: t, op: Op::Flush, offset: 0, len: 0, fua: false, dur_ns: 0 });
        }
        match op {
            Some(op) if len > 0 => target.push(Rec { t_ns: t, op, offset, len, fua, dur_ns: 0 }),
            // A write with no data and FUA/preflush is a flush; plain empty ones carry nothing.
            Some(Op::Write) if fua && !pre => target.push(Rec { t_ns: t, op: Op::Flush, offset: 0, len: 0, fua: false, dur_ns: 0 }),
            _ => {}
        }
    }
    let (events, which) = if q.is_empty() { (d, "D (issue)") } else { (q, "Q (queue)") };
    let mut h = Header::new(Source::Blkparse, &device);
    h.note = format!("imported from blkparse text, {which} events");
    let t0 = events.iter().map(|r| r.t_ns).min().unwrap_or(0);
    let recs = events.into_iter().map(|r| Rec { t_ns: r.t_ns - t0, ..r }).collect();
    Ok((h, recs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
  8,0    3        1     0.000000000  4162  Q  WS 3417048 + 8 [kjournald]
  8,0    3        2     0.000001000  4162  G  WS 3417048 + 8 [kjournald]
  8,0    3        3     0.000002000  4162  D  WS 3417048 + 8 [kjournald]
  8,0    0        4     0.001000000  4200  Q   R 1024 + 256 [cat]
  8,0    0        5     0.002000000  4162  Q FWFS 3417056 + 8 [jbd2/sda1-8]
  8,0    0        6     0.003000000  4162  Q  FN [kworker/0:1]
  8,0    0        7     0.004000000  4300  Q   D 0 + 2048 [fstrim]
  8,0    0        8     0.004500000  4300  C   R 1024 + 256 [0]

CPU0 (8,0):
 Reads Queued:           1,      128KiB  Writes Queued:           2,        8KiB
";

    #[test]
    fn the_sample_imports_as_sent() {
        let (h, r) = parse(SAMPLE).unwrap();
        assert_eq!(h.name, "8,0");
        let got: Vec<(u64, Op, u64, u64, bool)> = r.iter().map(|r| (r.t_ns, r.op, r.offset, r.len, r.fua)).collect();
        assert_eq!(
            got,
            vec![
                (0, Op::Write, 3417048 * 512, 4096, false),
                (1_000_000, Op::Read, 1024 * 512, 131072, false),
                (2_000_000, Op::Flush, 0, 0, false),
                (2_000_000, Op::Write, 3417056 * 512, 4096, true),
                (3_000_000, Op::Flush, 0, 0, false),
                (4_000_000, Op::Trim, 0, 2048 * 512, false),
            ]
        );
    }

    #[test]
    fn bad_event_lines_are_named_with_their_number() {
        let e = parse("  8,0 0 1 0.5 1 Q WS 12x + 8 [a]\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("sector"), "{e}");
        let e = parse("8,0 0 1 zz 1 Q R 1 + 8\n").unwrap_err().to_string();
        assert!(e.contains("time"), "{e}");
        let e = parse("8,0 0 1 1.0 1 Q XQ 1 + 8\n").unwrap_err().to_string();
        assert!(e.contains("RWBS"), "{e}");
        let e = parse("8,0 0 1 1.0 1 Q R 18446744073709551615 + 8\n").unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    }
}
