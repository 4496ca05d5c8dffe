//! fio iologs (`--write_iolog`).
//!
//! Version 2: `FILE ACTION [OFFSET LENGTH]`; `wait` lines (`FILE wait USEC`, or
//! with the delay in the offset field) delay what follows. Without waits only
//! the order is known: requests get 0 time apart and the header says
//! `timed: false` (a replay then issues them as fast as the volume allows).
//! Version 3: a timestamp in µs since the job's start first on every line.
//! Actions: read, write, trim, sync/datasync (flushes); add/open/close and
//! unknown files' bookkeeping are skipped.

use super::{num, perr, span};
use crate::format::{Header, Op, Rec, Source, TraceError};

const WHAT: &str = "fio iolog";

pub fn parse(text: &str) -> Result<(Header, Vec<Rec>), TraceError> {
    let mut lines = text.lines().enumerate();
    let first = lines.next().map(|x| x.1.trim()).unwrap_or("");
    let v3 = match first {
        "fio version 2 iolog" => false,
        "fio version 3 iolog" => true,
        _ => return Err(perr(WHAT, 1, "expected \"fio version 2 iolog\" or \"fio version 3 iolog\"", first)),
    };
    let mut recs = Vec::new();
    let mut name = String::new();
    let mut clock_ns = 0u64;
    let mut waited = false;
    for (i, l) in lines {
        let line = i + 1;
        let mut f: Vec<&str> = l.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if v3 {
            let us: u64 = num(WHAT, line, f[0], "timestamp (µs)", l)?;
            clock_ns = us.checked_mul(1000).ok_or_else(|| perr(WHAT, line, "timestamp out of range", l))?;
            f.remove(0);
        }
        if f.len() < 2 {
            return Err(perr(WHAT, line, "expected FILE ACTION [OFFSET LENGTH]", l));
        }
        if name.is_empty() {
            name = f[0].to_string();
        }
        let op = match f[1] {
            "read" => Op::Read,
            "write" => Op::Write,
            "trim" => Op::Trim,
            "sync" | "datasync" => Op::Flush,
            "wait" => {
                let us: u64 = num(WHAT, line, f.get(2).copied().unwrap_or(""), "wait (µs)", l)?;
                clock_ns = clock_ns.checked_add(us.saturating_mul(1000)).ok_or_else(|| perr(WHAT, line, "time out of range", l))?;
                waited = true;
                continue;
            }
            "add" | "open" | "close" => continue,
            other => return Err(perr(WHAT, line, format!("unknown action {other:?}"), l)),
        };
        let (offset, len) = if op == Op::Flush {
            (0, 0)
        } else {
            if f.len() < 4 {
                return Err(perr(WHAT, line, format!("{} needs OFFSET LENGTH", f[1]), l));
            }
            let o: u64 = num(WHAT, line, f[2], "offset", l)?;
            let n: u64 = num(WHAT, line, f[3], "length", l)?;
            span(WHAT, line, o, n, l)?;
            (o, n)
        };
        recs.push(Rec { t_ns: clock_ns, op, offset, len, fua: false, dur_ns: 0 });
    }
    let mut h = Header::new(Source::FioIolog, &name);
    h.timed = v3 || waited;
    h.note = format!("imported from a fio version {} iolog{}", if v3 { 3 } else { 2 }, if h.timed { "" } else { " (no times: order only)" });
    Ok((h, recs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_fio_v3_log_imports() {
        let (h, r) = parse(include_str!("../../tests/data/fio-v3.iolog")).unwrap();
        assert!(h.timed);
        assert_eq!(r.len(), 10, "10 reads of 4 KiB (40 KiB at --rate_iops=50)");
        assert!(r.iter().all(|r| r.op == Op::Read && r.len == 4096));
        // 50 IOPS: 20 ms apart.
        let gap = r[1].t_ns - r[0].t_ns;
        assert!((19_000_000..21_000_000).contains(&gap), "{gap}");
        let (_, s) = parse(include_str!("../../tests/data/fio-v3-sync.iolog")).unwrap();
        assert!(s.iter().any(|r| r.op == Op::Flush) && s.iter().any(|r| r.op == Op::Write));
    }

    #[test]
    fn v2_with_waits_and_errors() {
        let (h, r) = parse("fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 0 4096\n/dev/x wait 1000\n/dev/x read 4096 512\n/dev/x close\n").unwrap();
        assert!(h.timed);
        assert_eq!(r[1].t_ns, 1_000_000);
        assert!(parse("fio version 9 iolog\n").unwrap_err().to_string().contains("line 1"));
        let e = parse("fio version 2 iolog\n/dev/x read 0\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("OFFSET LENGTH"), "{e}");
        let e = parse("fio version 2 iolog\n/dev/x frob 0 1\n").unwrap_err().to_string();
        assert!(e.contains("unknown action"), "{e}");
    }
}
