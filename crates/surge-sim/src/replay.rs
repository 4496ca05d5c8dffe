//! Replaying a trace on a device stack.
//!
//! The application model: requests keep the trace's order and the time
//! between them, with at most `qd` in flight. A request is submitted at its
//! trace time plus the lag so far; when `qd` are in flight it waits for the
//! first to complete, and that wait becomes lag for everything after it (the
//! application runs late, as a real one behind a slow volume does). A flush
//! waits for every request in flight (a barrier) and then runs. So on a volume
//! that keeps up the replay takes the trace's own duration, and on a slower
//! one it takes longer by what the volume held it back.

use crate::clock::ReplayClock;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use surge_block::{BlockDev, BlockError, ZeroMode};
use surge_trace::{Op, Rec, Trace};

#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Requests in flight at most.
    pub qd: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplayResult {
    /// From the first submission to the last completion.
    pub completion_ns: u64,
    pub requests: u64,
    /// Mean time from submission to completion.
    pub mean_latency_us: f64,
    /// How late the last request was submitted against the trace.
    pub final_lag_ns: u64,
    /// Bytes completed in each second of the replay (reads + writes).
    pub bytes_per_second: Vec<u64>,
}

/// A leaf that stores nothing: the replay needs the layers' timing, not the bytes.
pub struct NullDev(pub u64);

impl BlockDev for NullDev {
    fn size(&self) -> u64 {
        self.0
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.0, offset, buf.len() as u64)
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> surge_block::Result<()> {
        surge_block::check_range(self.0, offset, buf.len() as u64)
    }
    fn flush(&self) -> surge_block::Result<()> {
        Ok(())
    }
}

/// Sees the replay as a controller beside the daemon would: told before each
/// request is submitted (it may act on the clock's time up to then, e.g. a
/// policy's ticks) and of each completion.
pub trait Observer {
    /// The next request is submitted at `issue_ns` (the clock is still at or before it).
    fn before(&mut self, _issue_ns: u64) {}
    /// Request `r` submitted at `issue_ns` completes at `done_ns`.
    fn completed(&mut self, _r: &Rec, _issue_ns: u64, _done_ns: u64) {}
}

struct Nobody;
impl Observer for Nobody {}

/// Where a replay's requests run, as the pacing ([`drive`]) sees it: on
/// virtual time ([`replay`]: a layer's booked completion is known when the
/// request is submitted) or in real time (`surge trace replay` over NBD,
/// where completions arrive as the server sends them). Times are ns since
/// the replay's start. The pacing is in one place so that a real replay
/// issues exactly what the simulated one assumes.
pub trait Executor {
    type Error;
    /// Retire every request that completed by `t_ns` (in real time: wait
    /// until then, taking completions as they come) and say how many data
    /// requests (not flushes) are still in flight.
    fn retire_until(&mut self, t_ns: u64) -> Result<usize, Self::Error>;
    /// Wait for the earliest data request in flight to complete: when it did.
    fn retire_first(&mut self) -> Result<u64, Self::Error>;
    /// Wait for every request in flight: the latest completion so far (0 if none).
    fn retire_all(&mut self) -> Result<u64, Self::Error>;
    /// Submit `r` at `issue_ns` (in real time: now, which is at or after it).
    fn submit(&mut self, r: &Rec, issue_ns: u64) -> Result<(), Self::Error>;
}

/// What [`drive`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Driven {
    /// Requests submitted (dropped markers are not requests).
    pub requests: u64,
    /// How late the last request was submitted against the trace.
    pub final_lag_ns: u64,
}

/// The application model (module docs): each request at its trace time plus
/// the lag so far; with `qd` data requests in flight the next waits for the
/// first to complete; a flush first waits for everything in flight (it is
/// then not counted against `qd` and holds up nothing after it).
pub fn drive<E: Executor>(trace: &Trace, qd: usize, ex: &mut E) -> Result<Driven, E::Error> {
    let qd = qd.max(1);
    let t0 = trace.records.first().map_or(0, |r| r.t_ns);
    let (mut lag, mut n) = (0u64, 0u64);
    for r in &trace.records {
        let want = r.t_ns - t0 + lag;
        let mut issue = want;
        if ex.retire_until(want)? >= qd {
            issue = issue.max(ex.retire_first()?);
        }
        if r.op == Op::Flush {
            issue = issue.max(ex.retire_all()?);
        }
        lag = issue - (r.t_ns - t0);
        if r.op == Op::Dropped {
            continue;
        }
        ex.submit(r, issue)?;
        n += 1;
    }
    Ok(Driven { requests: n, final_lag_ns: lag })
}

/// Replay `trace` on `dev`, whose layers run on `clock`.
pub fn replay(trace: &Trace, dev: &dyn BlockDev, clock: &ReplayClock, o: &ReplayOptions) -> Result<ReplayResult, BlockError> {
    replay_observed(trace, dev, clock, o, &mut Nobody)
}

/// What a replay's completions add up to (both engines: [`replay`] here,
/// `crate::threaded_replay` on the threaded harness).
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    pub(crate) latest: u64,
    lat_sum: u128,
    per_s: Vec<u64>,
}

impl Timeline {
    /// Request `r` submitted at `issue` completed at `done` (ns since the replay's start).
    pub(crate) fn completed(&mut self, r: &Rec, issue: u64, done: u64) {
        self.latest = self.latest.max(done);
        self.lat_sum += done.saturating_sub(issue) as u128;
        if r.op.moves_data() {
            let s = (done / 1_000_000_000) as usize;
            if self.per_s.len() <= s {
                self.per_s.resize(s + 1, 0);
            }
            self.per_s[s] += r.len;
        }
    }

    pub(crate) fn result(self, d: Driven) -> ReplayResult {
        let n = d.requests;
        ReplayResult {
            completion_ns: self.latest,
            requests: n,
            mean_latency_us: if n == 0 { 0.0 } else { self.lat_sum as f64 / n as f64 / 1e3 },
            final_lag_ns: d.final_lag_ns,
            bytes_per_second: self.per_s,
        }
    }
}

/// Run one trace record on `dev` (reads and writes from/into `buf`).
pub(crate) fn issue(dev: &dyn BlockDev, r: &Rec, buf: &mut Vec<u8>) -> Result<(), BlockError> {
    match r.op {
        Op::Read | Op::Write => {
            let len = usize::try_from(r.len).map_err(|_| BlockError::OutOfRange { offset: r.offset, len: r.len, size: dev.size() })?;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            if r.op == Op::Read {
                dev.read_at(&mut buf[..len], r.offset)
            } else {
                dev.write_at(&buf[..len], r.offset, r.fua)
            }
        }
        Op::Zero => dev.write_zeroes(r.offset, r.len, ZeroMode::default()),
        Op::Trim => dev.discard(r.offset, r.len),
        Op::Flush => dev.flush(),
        Op::Dropped => Ok(()),
    }
}

/// [`drive`] on virtual time: each request is run on the layers when it is
/// submitted, and its completion is the deadline the layers booked.
struct Virtual<'a> {
    dev: &'a dyn BlockDev,
    clock: &'a ReplayClock,
    obs: &'a mut dyn Observer,
    inflight: BinaryHeap<Reverse<u64>>,
    tl: Timeline,
    buf: Vec<u8>,
}

impl Executor for Virtual<'_> {
    type Error = BlockError;
    fn retire_until(&mut self, t_ns: u64) -> Result<usize, BlockError> {
        while self.inflight.peek().is_some_and(|Reverse(d)| *d <= t_ns) {
            self.inflight.pop();
        }
        Ok(self.inflight.len())
    }
    fn retire_first(&mut self) -> Result<u64, BlockError> {
        Ok(self.inflight.pop().map_or(0, |Reverse(d)| d))
    }
    fn retire_all(&mut self) -> Result<u64, BlockError> {
        self.inflight.clear();
        Ok(self.tl.latest)
    }
    fn submit(&mut self, r: &Rec, issue_ns: u64) -> Result<(), BlockError> {
        if r.op == Op::Dropped {
            return Ok(());
        }
        self.obs.before(issue_ns);
        self.clock.submit_at(issue_ns);
        issue(self.dev, r, &mut self.buf)?;
        let done = self.clock.completion_ns();
        self.obs.completed(r, issue_ns, done);
        if r.op != Op::Flush {
            self.inflight.push(Reverse(done));
        }
        self.tl.completed(r, issue_ns, done);
        Ok(())
    }
}

/// [`replay`], with `obs` told of every submission and completion.
pub fn replay_observed(trace: &Trace, dev: &dyn BlockDev, clock: &ReplayClock, o: &ReplayOptions, obs: &mut dyn Observer) -> Result<ReplayResult, BlockError> {
    let mut v = Virtual { dev, clock, obs, inflight: BinaryHeap::new(), tl: Timeline::default(), buf: Vec::new() };
    let d = drive(trace, o.qd, &mut v)?;
    Ok(v.tl.result(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use surge_block::model::{ModelDev, VolumeModel, GIB, KIB};
    use surge_trace::{Header, Rec, Source};

    fn reads(n: u64, gap_ns: u64, len: u64) -> Trace {
        let recs = (0..n).map(|i| Rec { t_ns: i * gap_ns, op: Op::Read, offset: (i * 7919 % 10_000) * len, len, fua: false, dur_ns: 0 }).collect();
        Trace::from_records(Header::new(Source::SurgeRecord, "t"), recs)
    }

    fn run(t: &Trace, model: VolumeModel, size: u64, qd: usize) -> ReplayResult {
        let clock = Arc::new(ReplayClock::new());
        let dev = ModelDev::new(Arc::new(NullDev(size)), clock.clone(), model.shape(size).unwrap());
        replay(t, &dev, &clock, &ReplayOptions { qd }).unwrap()
    }

    #[test]
    fn a_volume_that_keeps_up_takes_the_traces_time() {
        // 1,000 IOPS of 4 KiB for 10 s: gp3's 3,000 IOPS keeps up.
        let t = reads(10_000, 1_000_000, 4 * KIB);
        let r = run(&t, VolumeModel::Gp3 { iops: None, throughput: None }, 100 * GIB, 32);
        assert!((r.completion_ns as f64 / 1e9 - 10.0).abs() < 0.01, "{r:?}");
    }

    #[test]
    fn a_slower_volume_stretches_the_run_by_its_rate() {
        // 30,000 random 4 KiB reads as fast as possible at QD32.
        let t = reads(30_000, 0, 4 * KIB);
        // gp3 at 3,000 IOPS: 10 s; io2 at 30,000: 1 s; st1 at 500 IOPS (every I/O counts as 1 MiB): >= 60 s.
        let g = run(&t, VolumeModel::Gp3 { iops: None, throughput: None }, 100 * GIB, 32).completion_ns as f64 / 1e9;
        let i = run(&t, VolumeModel::Io2 { iops: 30_000 }, 100 * GIB, 32).completion_ns as f64 / 1e9;
        let s = run(&t, VolumeModel::St1, 500 * GIB, 32).completion_ns as f64 / 1e9;
        assert!((g - 10.0).abs() < 0.05, "gp3 {g}");
        assert!((i - 1.0).abs() < 0.05, "io2 {i}");
        assert!(s > 60.0, "st1 {s}");
    }

    #[test]
    fn queue_depth_one_serializes() {
        // QD1 on a model with 1 ms latency: 100 reads take 100 ms.
        let t = reads(100, 0, 4 * KIB);
        let clock = Arc::new(ReplayClock::new());
        let shape = surge_block::model::with_latency(VolumeModel::Gp3 { iops: None, throughput: None }.shape(10 * GIB).unwrap(), std::time::Duration::from_millis(1));
        let dev = ModelDev::new(Arc::new(NullDev(10 * GIB)), clock.clone(), shape);
        let r = replay(&t, &dev, &clock, &ReplayOptions { qd: 1 }).unwrap();
        assert!((r.completion_ns as f64 / 1e6 - 100.0).abs() < 1.0, "{r:?}");
    }

    #[test]
    fn a_full_queue_waits_for_the_first_completion_and_a_flush_for_all_and_holds_nothing_up() {
        // Every request takes 10 ms; QD 2. Three reads at 0: the third waits for
        // the first (10 ms). A flush at 0 (now 10 ms late) waits for the third
        // (done at 20 ms); the read after it goes at 20 ms, not after the flush.
        let mut recs: Vec<Rec> = (0..3).map(|i| Rec { t_ns: 0, op: Op::Read, offset: i * 4096, len: 4096, fua: false, dur_ns: 0 }).collect();
        recs.push(Rec { t_ns: 0, op: Op::Flush, offset: 0, len: 0, fua: false, dur_ns: 0 });
        recs.push(Rec { t_ns: 0, op: Op::Read, offset: 0, len: 4096, fua: false, dur_ns: 0 });
        let t = Trace::from_records(Header::new(Source::SurgeRecord, "t"), recs);
        struct Issues(Vec<u64>);
        impl Observer for Issues {
            fn completed(&mut self, _r: &Rec, issue_ns: u64, _done_ns: u64) {
                self.0.push(issue_ns / 1_000_000);
            }
        }
        let clock = Arc::new(ReplayClock::new());
        let shape = surge_block::model::with_latency(VolumeModel::Io2 { iops: 64_000 }.shape(10 * GIB).unwrap(), std::time::Duration::from_millis(10));
        let dev = ModelDev::new(Arc::new(NullDev(10 * GIB)), clock.clone(), shape);
        let mut seen = Issues(Vec::new());
        let r = replay_observed(&t, &dev, &clock, &ReplayOptions { qd: 2 }, &mut seen).unwrap();
        assert_eq!(seen.0, vec![0, 0, 10, 20, 20], "{r:?}");
        assert_eq!(r.final_lag_ns, 20_000_000);
    }
}
