//! A trace replayed on the threaded harness: the application model of
//! [`crate::replay`] ([`drive`]: the trace's order and gaps plus the lag so
//! far, at most QD data requests in flight, flushes as barriers) issued to any
//! [`BlockDev`] whose layers have threads of their own (the elastic cache's
//! writeback, its controller, the provider's attach delays), every thread on
//! one [`SimClock`].
//!
//! Each request runs on a worker thread, registered on the clock while it
//! has a request (so time cannot move on under it) and idle off it (so an
//! idle pool holds nothing back). The pacing thread (the caller) sleeps on
//! the clock until each submission time; after submitting it waits until
//! the worker has booked its I/O (slept on the clock or blocked), and after
//! reaching a time it lets every thread due then run first, so that requests
//! submitted at one instant book in trace order and a completion at `t` is
//! seen by a submission at `t`: each costs 1 ns of virtual time, the only
//! difference to the pacing's own times.

use crate::replay::{drive, issue, Executor, ReplayResult, Timeline};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, BlockError, Clock, ClockThread, Hold, SimClock};
use surge_trace::{Op, Rec, Trace};

struct Job {
    rec: Rec,
    issue: u64,
    /// Keeps time still until the worker has registered.
    hold: Hold,
}

struct Done {
    worker: usize,
    rec: Rec,
    issue: u64,
    done: u64,
    result: Result<(), BlockError>,
}

struct Threaded<'a> {
    clock: &'a Arc<SimClock>,
    dev: &'a Arc<dyn BlockDev>,
    t0: Duration,
    workers: Vec<Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    idle: Vec<usize>,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
    /// Submitted and not yet reported (any op).
    pending: usize,
    /// Data requests submitted and not retired.
    data_inflight: usize,
    /// Data completions reported and not yet retired.
    ready: BinaryHeap<Reverse<u64>>,
    tl: Timeline,
    error: Option<BlockError>,
}

impl Threaded<'_> {
    fn now_ns(&self) -> u64 {
        (self.clock.now().saturating_sub(self.t0)).as_nanos() as u64
    }

    fn sleep_to(&self, t_ns: u64) {
        self.clock.sleep_until(self.t0 + Duration::from_nanos(t_ns));
    }

    /// Let every thread due at the current instant run (1 ns of virtual time).
    fn settle(&self) {
        self.clock.sleep_until(self.clock.now() + Duration::from_nanos(1));
    }

    fn take(&mut self, d: Done) {
        self.pending -= 1;
        self.idle.push(d.worker);
        if let Err(e) = d.result {
            self.error.get_or_insert(e);
        }
        self.tl.completed(&d.rec, d.issue, d.done);
        if d.rec.op != Op::Flush {
            self.ready.push(Reverse(d.done));
        }
    }

    fn poll(&mut self) {
        while let Ok(d) = self.done_rx.try_recv() {
            self.take(d);
        }
    }

    /// Block until a request reports (the clock moves on while this thread
    /// is blocked and every other one sleeps).
    fn wait_one(&mut self) {
        let d = self.done_rx.recv().expect("a worker is alive while requests are pending");
        self.take(d);
    }

    fn check(&mut self) -> Result<(), BlockError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn worker(&mut self) -> usize {
        if let Some(k) = self.idle.pop() {
            return k;
        }
        let k = self.workers.len();
        let (tx, rx) = channel::<Job>();
        let (clock, dev, done, t0) = (self.clock.clone(), self.dev.clone(), self.done_tx.clone(), self.t0);
        self.threads.push(
            std::thread::Builder::new()
                .name(format!("replay-{k}"))
                .spawn(move || {
                    let mut buf = Vec::new();
                    for job in rx {
                        let _t = ClockThread::enter(clock.clone());
                        drop(job.hold);
                        let result = issue(dev.as_ref(), &job.rec, &mut buf);
                        let at = (clock.now().saturating_sub(t0)).as_nanos() as u64;
                        if done.send(Done { worker: k, rec: job.rec, issue: job.issue, done: at, result }).is_err() {
                            return;
                        }
                    }
                })
                .expect("spawn a replay worker"),
        );
        self.workers.push(tx);
        k
    }
}

impl Executor for Threaded<'_> {
    type Error = BlockError;
    fn retire_until(&mut self, t_ns: u64) -> Result<usize, BlockError> {
        if self.now_ns() < t_ns {
            self.sleep_to(t_ns);
        }
        self.settle();
        self.poll();
        while self.ready.peek().is_some_and(|Reverse(d)| *d <= t_ns) {
            self.ready.pop();
            self.data_inflight -= 1;
        }
        self.check()?;
        Ok(self.data_inflight)
    }
    fn retire_first(&mut self) -> Result<u64, BlockError> {
        if self.data_inflight == 0 {
            return Ok(0);
        }
        while self.ready.is_empty() {
            self.wait_one();
        }
        self.check()?;
        self.data_inflight -= 1;
        Ok(self.ready.pop().map_or(0, |Reverse(d)| d))
    }
    fn retire_all(&mut self) -> Result<u64, BlockError> {
        while self.pending > 0 {
            self.wait_one();
        }
        self.ready.clear();
        self.data_inflight = 0;
        self.check()?;
        Ok(self.tl.latest)
    }
    fn submit(&mut self, r: &Rec, issue_ns: u64) -> Result<(), BlockError> {
        if r.op == Op::Dropped {
            return Ok(());
        }
        if self.now_ns() < issue_ns {
            self.sleep_to(issue_ns);
        }
        let k = self.worker();
        let hold = self.clock.hold();
        self.workers[k].send(Job { rec: *r, issue: issue_ns, hold }).expect("replay worker alive");
        self.pending += 1;
        if r.op != Op::Flush {
            self.data_inflight += 1;
        }
        self.settle();
        Ok(())
    }
}

/// Replay `trace` on `dev` (whose layers run on `clock`) with at most `qd`
/// data requests in flight, from the clock's current time; returns when
/// every request has completed. Times in the result are since the start.
pub fn replay_threaded(trace: &Trace, dev: &Arc<dyn BlockDev>, clock: &Arc<SimClock>, qd: usize) -> Result<ReplayResult, BlockError> {
    let _me = ClockThread::enter(clock.clone() as Arc<dyn Clock>);
    let (done_tx, done_rx) = channel();
    let mut ex = Threaded {
        clock,
        dev,
        t0: clock.now(),
        workers: Vec::new(),
        threads: Vec::new(),
        idle: Vec::new(),
        done_tx,
        done_rx,
        pending: 0,
        data_inflight: 0,
        ready: BinaryHeap::new(),
        tl: Timeline::default(),
        error: None,
    };
    let driven = drive(trace, qd, &mut ex);
    let all = ex.retire_all();
    ex.workers.clear();
    for t in ex.threads.drain(..) {
        let _ = t.join();
    }
    let driven = driven?;
    all?;
    Ok(ex.tl.result(driven))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{replay, NullDev, ReplayOptions};
    use surge_block::model::{ModelDev, VolumeModel, GIB, KIB};
    use surge_trace::{Header, Source};

    /// The threaded engine paces exactly as the event replay: the same
    /// volume model, the same trace (bursts over gp3's IOPS, flushes, a
    /// queue that fills), the same completion time to within its 1 ns steps.
    #[test]
    fn the_threaded_replay_of_a_volume_model_matches_the_event_replay() {
        let mut recs = Vec::new();
        for b in 0..3u64 {
            for i in 0..2_000u64 {
                recs.push(Rec { t_ns: b * 2_000_000_000 + i * 100_000, op: if i % 3 == 0 { Op::Read } else { Op::Write }, offset: (i * 7919 % 50_000) * 4 * KIB, len: 4 * KIB, fua: false, dur_ns: 0 });
            }
            recs.push(Rec { t_ns: b * 2_000_000_000 + 200_000_000, op: Op::Flush, offset: 0, len: 0, fua: false, dur_ns: 0 });
        }
        let t = Trace::from_records(Header::new(Source::SurgeRecord, "t"), recs);
        let shape = VolumeModel::Gp3 { iops: None, throughput: None }.shape(10 * GIB).unwrap();
        let rc = Arc::new(crate::clock::ReplayClock::new());
        let ev = replay(&t, &ModelDev::new(Arc::new(NullDev(10 * GIB)), rc.clone(), shape.clone()), &rc, &ReplayOptions { qd: 16 }).unwrap();
        let clock = SimClock::new();
        let dev: Arc<dyn BlockDev> = Arc::new(ModelDev::new(Arc::new(NullDev(10 * GIB)), clock.clone(), shape));
        let th = replay_threaded(&t, &dev, &clock, 16).unwrap();
        assert_eq!(th.requests, ev.requests);
        // 2,000 requests a burst at 10,000/s over 3,000 IOPS: each burst runs late.
        assert!(ev.completion_ns > 4_600_000_000, "{ev:?}");
        let diff = (th.completion_ns as f64 - ev.completion_ns as f64).abs();
        assert!(diff < 1e-4 * ev.completion_ns as f64, "threaded {} vs event {}", th.completion_ns, ev.completion_ns);
    }
}
