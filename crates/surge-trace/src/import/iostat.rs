//! `iostat -x [-d] DEVICE INTERVAL` reports (sysstat 11 and later: `r/s`,
//! `rkB/s`, `w/s`, `wkB/s`, optionally `d/s`, `dkB/s`, `f/s`).
//!
//! These are averages, not requests, so the trace is synthesized and marked
//! `aggregate`: each interval gets its rates' worth of requests of the mean
//! size, evenly spaced, at offsets drawn uniformly (4 KiB aligned, fixed seed)
//! over the device. Where I/O landed and how sequential it was is unknown:
//! a plan from such a trace prices the rates, not the access pattern.

use super::{perr, TraceError};
use crate::format::{Header, Op, Rec, Source};
use rand::{Rng, SeedableRng};

const WHAT: &str = "iostat";

#[derive(Debug, Clone)]
pub struct IostatOptions {
    /// The device to take (default: the first one reported).
    pub device: Option<String>,
    /// Seconds between reports (the INTERVAL given to iostat).
    pub interval_s: f64,
    /// Offsets are drawn below this (default 100 GiB).
    pub device_size: u64,
    /// Keep the first report (iostat's first one averages since boot).
    pub keep_first: bool,
    /// Refuse input that would synthesize more requests than this.
    pub max_requests: u64,
}

impl Default for IostatOptions {
    fn default() -> Self {
        IostatOptions { device: None, interval_s: 1.0, device_size: 100 << 30, keep_first: false, max_requests: 50_000_000 }
    }
}

#[derive(Default, Debug, Clone, Copy)]
struct Cols {
    rs: usize,
    rkb: usize,
    ws: usize,
    wkb: usize,
    ds: Option<usize>,
    dkb: Option<usize>,
    fs: Option<usize>,
}

fn header_cols(f: &[&str], line: usize, l: &str) -> Result<Cols, TraceError> {
    let find = |n: &str| f.iter().position(|x| *x == n);
    let need = |n: &str| find(n).ok_or_else(|| perr(WHAT, line, format!("the header has no {n} column (use `iostat -x`, kB units)"), l));
    Ok(Cols { rs: need("r/s")?, rkb: need("rkB/s")?, ws: need("w/s")?, wkb: need("wkB/s")?, ds: find("d/s"), dkb: find("dkB/s"), fs: find("f/s") })
}

fn rate(f: &[&str], i: usize, line: usize, l: &str) -> Result<f64, TraceError> {
    let s = f.get(i).ok_or_else(|| perr(WHAT, line, "fewer fields than the header", l))?;
    // Some locales print a decimal comma.
    let v: f64 = s.replace(',', ".").parse().map_err(|_| perr(WHAT, line, format!("{s:?} is not a number"), l))?;
    if !(v.is_finite() && (0.0..1e12).contains(&v)) {
        return Err(perr(WHAT, line, format!("rate {s} out of range"), l));
    }
    Ok(v)
}

pub fn parse(text: &str, o: &IostatOptions) -> Result<(Header, Vec<Rec>), TraceError> {
    if !(o.interval_s.is_finite() && o.interval_s > 0.0 && o.interval_s < 1e6) {
        return Err(TraceError::Invalid(format!("iostat interval {} s: must be positive", o.interval_s)));
    }
    if o.device_size < 1 << 20 {
        return Err(TraceError::Invalid("iostat import: the device size must be at least 1 MiB".into()));
    }
    let mut cols: Option<Cols> = None;
    let mut device = o.device.clone();
    let mut samples: Vec<[f64; 7]> = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(first) = f.first() else { continue };
        if *first == "Device" || *first == "Device:" {
            cols = Some(header_cols(&f, line, l)?);
            continue;
        }
        let Some(c) = cols else { continue };
        match &device {
            Some(d) if d != first => continue,
            None => device = Some(first.to_string()),
            _ => {}
        }
        let opt = |i: Option<usize>| i.map_or(Ok(0.0), |i| rate(&f, i, line, l));
        samples.push([rate(&f, c.rs, line, l)?, rate(&f, c.rkb, line, l)?, rate(&f, c.ws, line, l)?, rate(&f, c.wkb, line, l)?, opt(c.ds)?, opt(c.dkb)?, opt(c.fs)?]);
    }
    if cols.is_none() {
        return Err(TraceError::Invalid("iostat: no \"Device\" header line found (expected `iostat -x` output)".into()));
    }
    let name = device.unwrap_or_default();
    if !o.keep_first && samples.len() > 1 {
        samples.remove(0);
    }
    let total: f64 = samples.iter().map(|s| (s[0] + s[2] + s[4] + s[6]) * o.interval_s).sum();
    if total > o.max_requests as f64 {
        return Err(TraceError::Invalid(format!("iostat: these rates make {total:.0} requests, more than the {} an import synthesizes", o.max_requests)));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut recs = Vec::new();
    let iv = o.interval_s;
    for (k, s) in samples.iter().enumerate() {
        let t0 = k as f64 * iv;
        let mut add = |ops: f64, kb: f64, op: Op| {
            let n = (ops * iv).round() as u64;
            if n == 0 {
                return;
            }
            let size = if op == Op::Flush { 0 } else { (((kb * 1024.0 / ops) / 512.0).round() as u64).max(1) * 512 };
            let size = size.min(o.device_size / 2);
            for j in 0..n {
                let t = t0 + iv * j as f64 / n as f64;
                let offset = if size == 0 { 0 } else { rng.gen_range(0..(o.device_size - size) / 4096) * 4096 };
                recs.push(Rec { t_ns: (t * 1e9) as u64, op, offset, len: size, fua: false, dur_ns: 0 });
            }
        };
        add(s[0], s[1], Op::Read);
        add(s[2], s[3], Op::Write);
        add(s[4], s[5], Op::Trim);
        add(s[6], 0.0, Op::Flush);
    }
    let mut h = Header::new(Source::Iostat, &name);
    h.device_size = o.device_size;
    h.note = format!(
        "AGGREGATE: synthesized from {} iostat -x reports of {iv} s (mean sizes, even spacing, random offsets); rates only, no access pattern",
        samples.len()
    );
    Ok((h, recs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_iostat_report_gives_its_rates() {
        let (h, r) = parse(include_str!("../../tests/data/iostat-x.txt"), &IostatOptions::default()).unwrap();
        assert!(h.aggregate && h.note.contains("AGGREGATE"));
        assert_eq!(h.name, "vda");
        // Reports 2-4 (the first, since boot, is skipped): 13 + 0 + 1 reads,
        // 10892 + 16836 + 13691 writes of 16 KiB.
        let reads = r.iter().filter(|r| r.op == Op::Read).count();
        let writes: Vec<&Rec> = r.iter().filter(|r| r.op == Op::Write).collect();
        assert_eq!(reads, 14);
        assert_eq!(writes.len(), 10892 + 16836 + 13691);
        assert!(writes.iter().all(|w| w.len == 16384));
        assert!(r.iter().all(|x| x.t_ns < 3_000_000_000));
    }

    #[test]
    fn malformed_reports_are_refused() {
        assert!(parse("nothing here\n", &IostatOptions::default()).unwrap_err().to_string().contains("Device"));
        let e = parse("Device r/s w/s\nsda 1 2\n", &IostatOptions::default()).unwrap_err().to_string();
        assert!(e.contains("rkB/s"), "{e}");
        let e = parse("Device r/s rkB/s w/s wkB/s\nsda 1 x 2 3\n", &IostatOptions::default()).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("Device r/s rkB/s w/s wkB/s\nsda 1\n", &IostatOptions::default()).unwrap_err().to_string();
        assert!(e.contains("fewer fields"), "{e}");
    }
}
