//! `surge trace replay`: a recorded trace issued to an NBD export in real
//! time, paced by the simulator's own [`surge_sim::replay::drive`], so a real
//! replay asks of a volume exactly what `surge plan workload` assumed: the
//! trace's order and gaps, at most QD data requests in flight (the next
//! waits for the first to complete, and that wait delays everything after
//! it), a flush after everything in flight.
//!
//! Each of QD (+ a few, for flushes) worker threads owns one NBD connection
//! and runs one request at a time; the pacing thread hands requests to them
//! and takes their completions off a channel as they arrive. Write payloads
//! are a fixed non-zero pattern: the replay reproduces the timing of the
//! application, not its bytes.

use super::run::connect;
use anyhow::Context as _;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};
use surge_nbd::client::Client;
use surge_nbd::proto::{CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES};
use surge_nbd::NbdUri;
use surge_trace::{Op, Rec, Trace};

/// Workers beyond QD: flushes are not counted against QD (as in the simulator).
const FLUSH_WORKERS: usize = 4;

/// What a real replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayOutcome {
    pub uri: String,
    pub trace: String,
    pub qd: usize,
    pub requests: u64,
    /// From the first submission to the last completion (wall time).
    pub completion_s: f64,
    /// How late the last request was submitted against the trace (the pacing's lag).
    pub final_lag_s: f64,
    pub mean_latency_us: f64,
    /// How far behind its paced time the replayer itself sent a request, at
    /// most and on average (its own fidelity: near zero on an idle machine).
    pub max_send_late_ms: f64,
    pub mean_send_late_us: f64,
    /// CLOCK_MONOTONIC of the first submission (to line up with other processes).
    pub started_monotonic_ns: u64,
}

struct Job {
    rec: Rec,
}

struct Done {
    flush: bool,
    at: Instant,
    sent: Instant,
    err: Option<String>,
}

fn worker(mut c: Client, jobs: Receiver<Job>, done: Sender<Done>) {
    let mut payload: Vec<u8> = Vec::new();
    while let Ok(Job { rec: r }) = jobs.recv() {
        let sent = Instant::now();
        let fua = if r.fua { CMD_FLAG_FUA } else { 0 };
        let len = r.len.min(u32::MAX as u64) as u32;
        let res = match r.op {
            Op::Read => c.submit(CMD_READ, 0, r.offset, len, &[]),
            Op::Write => {
                if payload.len() < len as usize {
                    payload.resize(len as usize, 0xa5);
                }
                c.submit(CMD_WRITE, fua, r.offset, len, &payload[..len as usize])
            }
            Op::Flush => c.submit(CMD_FLUSH, 0, 0, 0, &[]),
            Op::Trim => c.submit(CMD_TRIM, fua, r.offset, len, &[]),
            Op::Zero => c.submit(CMD_WRITE_ZEROES, fua, r.offset, len, &[]),
            Op::Dropped => continue,
        }
        .and_then(|cookie| c.wait(cookie))
        .and_then(|reply| reply.into_result());
        let err = res.err().map(|e| format!("{:?} of {} bytes at {}: {e}", r.op, r.len, r.offset));
        let failed = err.is_some();
        if done.send(Done { flush: r.op == Op::Flush, at: Instant::now(), sent, err }).is_err() || failed {
            break;
        }
    }
    let _ = c.disconnect();
}

/// The real-time side of [`surge_sim::replay::Executor`].
struct RealTime {
    start: Instant,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    data_in_flight: usize,
    flushes_in_flight: usize,
    /// Completions received that happened after the time last retired to.
    arrived: BinaryHeap<Reverse<u64>>,
    latest: u64,
    lat_sum: u128,
    late_max: u64,
    late_sum: u128,
    sent: u64,
}

impl RealTime {
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// Take one completion in; data completions go to `arrived`.
    fn take(&mut self, d: Done) -> anyhow::Result<()> {
        if let Some(e) = d.err {
            anyhow::bail!("the export failed a request: {e}");
        }
        let at = self.ns(d.at);
        self.latest = self.latest.max(at);
        self.lat_sum += d.at.saturating_duration_since(d.sent).as_nanos();
        if d.flush {
            self.flushes_in_flight -= 1;
        } else {
            self.arrived.push(Reverse(at));
        }
        Ok(())
    }

    fn recv(&mut self) -> anyhow::Result<()> {
        let d = self.done.recv().context("a replay worker stopped")?;
        self.take(d)
    }
}

impl surge_sim::replay::Executor for RealTime {
    type Error = anyhow::Error;

    fn retire_until(&mut self, t_ns: u64) -> anyhow::Result<usize> {
        let deadline = self.start + Duration::from_nanos(t_ns);
        loop {
            match self.done.recv_deadline(deadline) {
                Ok(d) => self.take(d)?,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => anyhow::bail!("every replay worker stopped"),
            }
        }
        while self.arrived.peek().is_some_and(|Reverse(a)| *a <= t_ns) {
            self.arrived.pop();
            self.data_in_flight -= 1;
        }
        Ok(self.data_in_flight)
    }

    fn retire_first(&mut self) -> anyhow::Result<u64> {
        if self.data_in_flight == 0 {
            return Ok(0);
        }
        while self.arrived.is_empty() {
            self.recv()?;
        }
        let Reverse(a) = self.arrived.pop().expect("arrived");
        self.data_in_flight -= 1;
        Ok(a)
    }

    fn retire_all(&mut self) -> anyhow::Result<u64> {
        while self.arrived.len() < self.data_in_flight || self.flushes_in_flight > 0 {
            self.recv()?;
        }
        self.arrived.clear();
        self.data_in_flight = 0;
        Ok(self.latest)
    }

    fn submit(&mut self, r: &Rec, issue_ns: u64) -> anyhow::Result<()> {
        let now = self.ns(Instant::now());
        let late = now.saturating_sub(issue_ns);
        self.late_max = self.late_max.max(late);
        self.late_sum += late as u128;
        self.sent += 1;
        if r.op == Op::Flush {
            self.flushes_in_flight += 1;
        } else {
            self.data_in_flight += 1;
        }
        self.jobs.send(Job { rec: *r }).map_err(|_| anyhow::anyhow!("every replay worker stopped"))
    }
}

/// Replay `trace` on the export at `uri`, at most `qd` data requests in flight.
pub fn replay(trace: &Trace, uri: &str, qd: usize) -> anyhow::Result<ReplayOutcome> {
    let parsed: NbdUri = uri.parse().map_err(|e| anyhow::anyhow!("{uri}: {e}"))?;
    let qd = qd.max(1);
    let workers = qd + FLUSH_WORKERS;
    let clients = (0..workers).map(|_| connect(&parsed, None)).collect::<anyhow::Result<Vec<_>>>()?;
    let size = clients[0].size();
    if let Some(r) = trace.records.iter().find(|r| r.op.moves_data() && r.offset + r.len > size) {
        anyhow::bail!("the trace reaches byte {} but the export holds {size}: give it an export at least as large", r.offset + r.len);
    }
    let writes = trace.records.iter().any(|r| matches!(r.op, Op::Write | Op::Trim | Op::Zero));
    anyhow::ensure!(!(writes && clients[0].info().read_only()), "the trace writes, and the export is read-only");
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let mut handles = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let (jobs, done) = (jobs_rx.clone(), done_tx.clone());
        handles.push(std::thread::Builder::new().name(format!("replay-{i}")).spawn(move || worker(c, jobs, done))?);
    }
    drop(done_tx);
    let started_monotonic_ns = crate::experiment::fairshare::client::monotonic_ns();
    let mut ex = RealTime {
        start: Instant::now(),
        jobs: jobs_tx,
        done: done_rx,
        data_in_flight: 0,
        flushes_in_flight: 0,
        arrived: BinaryHeap::new(),
        latest: 0,
        lat_sum: 0,
        late_max: 0,
        late_sum: 0,
        sent: 0,
    };
    let d = surge_sim::replay::drive(trace, qd, &mut ex)?;
    use surge_sim::replay::Executor as _;
    let last = ex.retire_all()?;
    drop(ex.jobs);
    for h in handles {
        let _ = h.join();
    }
    let n = ex.sent.max(1);
    Ok(ReplayOutcome {
        uri: uri.to_string(),
        trace: trace.header.name.clone(),
        qd,
        requests: d.requests,
        completion_s: last as f64 / 1e9,
        final_lag_s: d.final_lag_ns as f64 / 1e9,
        mean_latency_us: ex.lat_sum as f64 / n as f64 / 1e3,
        max_send_late_ms: ex.late_max as f64 / 1e6,
        mean_send_late_us: ex.late_sum as f64 / n as f64 / 1e3,
        started_monotonic_ns,
    })
}
