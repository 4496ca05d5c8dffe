//! What a trace does, in numbers (`surge trace show`).

use crate::format::{Op, Rec};
use crate::reader::Trace;
use serde::Serialize;
use std::fmt::Write as _;

/// Gaps longer than this between requests count as idle.
pub const IDLE_GAP_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub name: String,
    pub source: String,
    pub aggregate: bool,
    pub timed: bool,
    pub note: String,
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub fua_writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Reads among reads + writes, by count.
    pub read_fraction: f64,
    pub duration_s: f64,
    /// Request sizes: (upper bound in bytes, count), powers of two from 4 KiB.
    pub size_histogram: Vec<(u64, u64)>,
    /// Reads/writes that start where one of the last 16 of the same kind ended.
    pub sequential_fraction: f64,
    pub idle_gaps: u64,
    pub idle_s: f64,
    pub longest_gap_s: f64,
    pub mean_iops: f64,
    pub peak_iops_1s: f64,
    pub peak_mib_s_1s: f64,
    /// Seconds with any I/O: the busy part of the run.
    pub busy_seconds: u64,
    /// Most requests in flight at once (from their recorded service times; 0: unknown).
    pub max_in_flight: u64,
    /// Highest byte touched.
    pub footprint: u64,
    pub dropped: u64,
    pub truncated: bool,
}

/// Per-second I/O: (requests, bytes) of reads, writes and zeroes for each
/// second from the first request (`recs` in time order).
pub fn per_second(recs: &[Rec]) -> Vec<(u64, u64)> {
    let (Some(first), Some(last)) = (recs.first(), recs.last()) else { return Vec::new() };
    let t0 = first.t_ns;
    let mut v = vec![(0u64, 0u64); ((last.t_ns - t0) / 1_000_000_000) as usize + 1];
    for r in recs.iter().filter(|r| r.op.moves_data()) {
        let s = &mut v[((r.t_ns - t0) / 1_000_000_000) as usize];
        s.0 += 1;
        s.1 += r.len;
    }
    v
}

fn sequential(recs: &[Rec]) -> f64 {
    let mut ends: [std::collections::VecDeque<u64>; 2] = Default::default();
    let (mut seq, mut n) = (0u64, 0u64);
    for r in recs {
        let k = match r.op {
            Op::Read => 0,
            Op::Write | Op::Zero => 1,
            _ => continue,
        };
        n += 1;
        if let Some(i) = ends[k].iter().position(|&e| e == r.offset) {
            seq += 1;
            ends[k].remove(i);
        }
        ends[k].push_front(r.offset + r.len);
        ends[k].truncate(16);
    }
    if n == 0 {
        0.0
    } else {
        seq as f64 / n as f64
    }
}

fn max_in_flight(recs: &[Rec]) -> u64 {
    if recs.iter().all(|r| r.dur_ns == 0) {
        return 0;
    }
    let mut ev: Vec<(u64, i32)> = recs.iter().flat_map(|r| [(r.t_ns, 1), (r.t_ns + r.dur_ns.max(1), -1)]).collect();
    ev.sort();
    let (mut cur, mut max) = (0i64, 0i64);
    for (_, d) in ev {
        cur += d as i64;
        max = max.max(cur);
    }
    max as u64
}

pub fn summarize(t: &Trace) -> Summary {
    let recs = &t.records;
    let count = |op: Op| recs.iter().filter(|r| r.op == op).count() as u64;
    let bytes = |op: Op| recs.iter().filter(|r| r.op == op).map(|r| r.len).sum::<u64>();
    let (reads, writes) = (count(Op::Read), count(Op::Write));
    let mut hist: Vec<(u64, u64)> = (12..=24).map(|s| (1u64 << s, 0)).collect();
    hist.push((u64::MAX, 0));
    for r in recs.iter().filter(|r| r.op == Op::Read || r.op == Op::Write) {
        let i = hist.iter().position(|h| r.len <= h.0).expect("last bucket is unbounded");
        hist[i].1 += 1;
    }
    let (mut gaps, mut idle, mut longest) = (0u64, 0u64, 0u64);
    for w in recs.windows(2) {
        let g = w[1].t_ns - w[0].t_ns;
        if g > IDLE_GAP_NS {
            gaps += 1;
            idle += g;
        }
        longest = longest.max(g);
    }
    let secs = per_second(recs);
    let span = t.span_ns().max(1) as f64 / 1e9;
    let data = recs.iter().filter(|r| r.op.moves_data()).count() as f64;
    Summary {
        name: t.header.name.clone(),
        source: format!("{:?}", t.header.source),
        aggregate: t.header.aggregate,
        timed: t.header.timed,
        note: t.header.note.clone(),
        requests: recs.len() as u64,
        reads,
        writes,
        flushes: count(Op::Flush),
        trims: count(Op::Trim),
        zeroes: count(Op::Zero),
        fua_writes: recs.iter().filter(|r| r.op == Op::Write && r.fua).count() as u64,
        read_bytes: bytes(Op::Read),
        write_bytes: bytes(Op::Write) + bytes(Op::Zero),
        read_fraction: if reads + writes == 0 { 0.0 } else { reads as f64 / (reads + writes) as f64 },
        duration_s: t.span_ns() as f64 / 1e9,
        size_histogram: hist,
        sequential_fraction: sequential(recs),
        idle_gaps: gaps,
        idle_s: idle as f64 / 1e9,
        longest_gap_s: longest as f64 / 1e9,
        mean_iops: data / span,
        peak_iops_1s: secs.iter().map(|s| s.0).max().unwrap_or(0) as f64,
        peak_mib_s_1s: secs.iter().map(|s| s.1).max().unwrap_or(0) as f64 / (1u64 << 20) as f64,
        busy_seconds: secs.iter().filter(|s| s.0 > 0).count() as u64,
        max_in_flight: max_in_flight(recs),
        footprint: t.footprint(),
        dropped: t.dropped,
        truncated: t.truncated,
    }
}

fn size_label(b: u64) -> String {
    if b == u64::MAX {
        "larger".into()
    } else if b >= 1 << 20 {
        format!("<= {} MiB", b >> 20)
    } else {
        format!("<= {} KiB", b >> 10)
    }
}

pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let _ = writeln!(o, "trace {} ({}{}): {}", s.name, s.source, if s.aggregate { ", AGGREGATE: rates only" } else { "" }, s.note);
    let _ = writeln!(o, "requests      {} over {:.3} s ({} busy seconds){}", s.requests, s.duration_s, s.busy_seconds, if s.timed { "" } else { " (untimed: order only)" });
    let _ = writeln!(o, "reads         {} ({:.3} GiB)", s.reads, gib(s.read_bytes));
    let _ = writeln!(o, "writes        {} ({:.3} GiB, {} with FUA)", s.writes, gib(s.write_bytes), s.fua_writes);
    let _ = writeln!(o, "flush/trim/zero {} / {} / {}", s.flushes, s.trims, s.zeroes);
    let _ = writeln!(o, "read share    {:.1} % of reads + writes", s.read_fraction * 100.0);
    let _ = writeln!(o, "sequential    {:.1} % (start where a recent request of the same kind ended)", s.sequential_fraction * 100.0);
    let _ = writeln!(o, "rate          mean {:.0} IOPS; peak second {:.0} IOPS, {:.1} MiB/s", s.mean_iops, s.peak_iops_1s, s.peak_mib_s_1s);
    let _ = writeln!(o, "idle          {} gaps > 1 s, {:.1} s in all, longest gap {:.3} s", s.idle_gaps, s.idle_s, s.longest_gap_s);
    if s.max_in_flight > 0 {
        let _ = writeln!(o, "in flight     at most {} requests at once", s.max_in_flight);
    }
    let _ = writeln!(o, "footprint     {:.3} GiB (highest byte touched)", gib(s.footprint));
    if s.dropped > 0 || s.truncated {
        let _ = writeln!(o, "incomplete    {} requests dropped by the recorder{}", s.dropped, if s.truncated { "; the last segment is cut short" } else { "" });
    }
    let _ = writeln!(o, "sizes (reads + writes):");
    let total: u64 = s.size_histogram.iter().map(|h| h.1).sum::<u64>().max(1);
    for (b, n) in s.size_histogram.iter().filter(|h| h.1 > 0) {
        let _ = writeln!(o, "  {:>10} {:>10} {:>5.1} % {}", size_label(*b), n, *n as f64 * 100.0 / total as f64, "#".repeat((*n * 40 / total) as usize));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Header, Source};

    fn r(t_s: f64, op: Op, offset: u64, len: u64) -> Rec {
        Rec { t_ns: (t_s * 1e9) as u64, op, offset, len, fua: false, dur_ns: 0 }
    }

    #[test]
    fn the_numbers_follow_the_requests() {
        let mut recs: Vec<Rec> = (0..100).map(|i| r(i as f64 * 0.001, Op::Read, i * 4096, 4096)).collect();
        recs.push(r(5.0, Op::Write, 1 << 30, 1 << 20));
        recs.push(r(5.5, Op::Flush, 0, 0));
        let s = summarize(&Trace::from_records(Header::new(Source::SurgeRecord, "x"), recs));
        assert_eq!((s.reads, s.writes, s.flushes), (100, 1, 1));
        assert_eq!(s.read_bytes, 100 * 4096);
        assert!((s.sequential_fraction - 99.0 / 101.0).abs() < 1e-9);
        assert_eq!(s.idle_gaps, 1);
        assert_eq!(s.peak_iops_1s, 100.0);
        assert_eq!(s.size_histogram[0], (4096, 100));
        assert_eq!(s.size_histogram[8], (1 << 20, 1));
        assert_eq!(s.footprint, (1 << 30) + (1 << 20));
        assert!((s.duration_s - 5.5).abs() < 1e-9);
    }
}
