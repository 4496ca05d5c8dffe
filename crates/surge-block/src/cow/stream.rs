//! The stream job: a background thread that copies every block still in the
//! base into the overlay, rate-limited, until the volume no longer needs the
//! base.
//!
//! Resumable by construction: progress *is* the allocation map (committed
//! blocks leave the `Base` state and never return), committed every `commit_every` bytes or
//! `commit_interval`, so after a restart the job starts over from block 0 and
//! skips, a map word at a time, whatever was copied or written before.
//! Guest writes win: each chunk is read from the base without locks and then
//! written only over blocks still `Base` ([`CowDev::copy_up`]).

use super::CowDev;
use crate::clock::Clock;
use crate::model::Bucket;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Bytes per second (None: as fast as the base answers).
    pub rate: Option<u64>,
    /// Largest copy per step.
    pub chunk: u64,
    /// Commit the map after this many copied bytes...
    pub commit_every: u64,
    /// ... or this much time, whichever comes first.
    pub commit_interval: Duration,
    /// When done, drop the base (close its connections).
    pub detach_base: bool,
    /// Guest reads come first: while they fetch from the base, the job waits
    /// until this long has passed without one (zero: never wait).
    pub yield_to_guest: Duration,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            rate: None,
            chunk: 1 << 20,
            commit_every: 64 << 20,
            commit_interval: Duration::from_secs(5),
            detach_base: true,
            yield_to_guest: Duration::from_millis(50),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "state", content = "error")]
pub enum StreamState {
    Running,
    Done,
    Stopped,
    Failed(String),
}

/// What `surge status` and the progress bar show.
#[derive(Debug, Clone, Serialize)]
pub struct StreamProgress {
    #[serde(flatten)]
    pub state: StreamState,
    /// Bytes in the base when the job started.
    pub total_bytes: u64,
    /// Bytes still only in the base (copied by the job, by copy-on-read or
    /// overwritten by the guest all count as done).
    pub remaining_bytes: u64,
    /// Bytes this job copied.
    pub copied_bytes: u64,
    /// Rate limit, bytes/s (0: none).
    pub rate_limit: u64,
    /// Average progress since the start, bytes/s.
    pub throughput_bps: f64,
    pub elapsed_s: f64,
    /// Seconds left at the average rate so far.
    pub eta_s: Option<f64>,
}

impl StreamProgress {
    pub fn fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            1.0
        } else {
            1.0 - self.remaining_bytes as f64 / self.total_bytes as f64
        }
    }
}

struct Shared {
    dev: Arc<CowDev>,
    clock: Arc<dyn Clock>,
    cfg: StreamConfig,
    state: Mutex<StreamState>,
    total: u64,
    copied: AtomicU64,
    rate: AtomicU64,
    stop: AtomicBool,
    started: Duration,
}

/// A running stream job; dropping it stops the thread (the map keeps what was copied).
pub struct StreamJob {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StreamJob {
    pub fn start(dev: Arc<CowDev>, cfg: StreamConfig, clock: Arc<dyn Clock>) -> StreamJob {
        let shared = Arc::new(Shared {
            total: dev.base_bytes(),
            rate: AtomicU64::new(cfg.rate.unwrap_or(0)),
            started: clock.now(),
            dev,
            clock,
            cfg,
            state: Mutex::new(StreamState::Running),
            copied: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("surge-stream".into())
            .spawn(move || {
                let end = match s.run() {
                    Ok(true) => StreamState::Done,
                    Ok(false) => StreamState::Stopped,
                    Err(e) => {
                        tracing::warn!("stream job failed: {e}");
                        StreamState::Failed(e.to_string())
                    }
                };
                *s.state.lock() = end;
            })
            .expect("spawning the stream thread");
        StreamJob { shared, thread: Some(thread) }
    }

    pub fn progress(&self) -> StreamProgress {
        self.shared.progress()
    }

    /// A handle that reads the progress (for a progress bar's thread).
    pub fn watcher(&self) -> StreamWatch {
        StreamWatch(self.shared.clone())
    }

    /// Change the rate limit (bytes/s; 0: none) from now on.
    pub fn set_rate(&self, rate: u64) {
        self.shared.rate.store(rate, Relaxed);
    }

    /// Wait until the job ends; its final state.
    pub fn wait(mut self) -> StreamState {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.state.lock().clone()
    }

    pub fn stop(&self) {
        self.shared.stop.store(true, Relaxed);
    }
}

/// Reads a stream job's progress; does not keep the job running.
#[derive(Clone)]
pub struct StreamWatch(Arc<Shared>);

impl StreamWatch {
    pub fn progress(&self) -> StreamProgress {
        self.0.progress()
    }
}

impl Drop for StreamJob {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Copy until done (true) or stopped (false).
    fn run(&self) -> crate::Result<bool> {
        let mut from = 0;
        let mut since_commit = 0u64;
        let mut last_commit = self.clock.now();
        let mut bucket: Option<(u64, Bucket)> = None;
        let mut guest_seen = self.dev.guest_fetches();
        loop {
            self.yield_to_guest(&mut guest_seen);
            if self.stop.load(Relaxed) {
                self.dev.commit()?;
                return Ok(false);
            }
            match self.dev.stream_step(from, self.cfg.chunk)? {
                Some((next, copied)) => {
                    from = next;
                    since_commit += copied;
                    self.copied.fetch_add(copied, Relaxed);
                    // Pay for what was copied before the next step.
                    self.pace(&mut bucket, copied);
                }
                None => {
                    self.dev.commit()?;
                    // Blocks leave the base for good once committed, but a
                    // failed flush of the guest's may have sent uncommitted
                    // copies back to it: then go round again.
                    if self.dev.is_independent() {
                        break;
                    }
                    from = 0;
                    continue;
                }
            }
            let now = self.clock.now();
            if since_commit >= self.cfg.commit_every || now.saturating_sub(last_commit) >= self.cfg.commit_interval {
                self.dev.commit()?;
                since_commit = 0;
                last_commit = now;
            }
        }
        if self.cfg.detach_base {
            self.dev.detach_base()?;
        } else {
            self.dev.mark_independent()?;
        }
        Ok(true)
    }

    /// Wait while the guest keeps fetching from the base.
    fn yield_to_guest(&self, seen: &mut u64) {
        if self.cfg.yield_to_guest.is_zero() {
            return;
        }
        loop {
            let now = self.dev.guest_fetches();
            if now == *seen || self.stop.load(Relaxed) {
                return;
            }
            *seen = now;
            self.clock.sleep_until(self.clock.now() + self.cfg.yield_to_guest);
        }
    }

    /// Wait for `n` bytes' worth of tokens at the current rate (the bucket
    /// holds one chunk, so a job starts at once and then keeps to the rate).
    fn pace(&self, bucket: &mut Option<(u64, Bucket)>, n: u64) {
        let rate = self.rate.load(Relaxed);
        if rate == 0 || n == 0 {
            *bucket = None;
            return;
        }
        let now = self.clock.now().as_nanos() as u64;
        let b = match bucket {
            Some((r, b)) if *r == rate => b,
            _ => &mut bucket.insert((rate, Bucket::new(rate, self.cfg.chunk, self.cfg.chunk, now))).1,
        };
        let at = b.ready(now, n);
        if at > now {
            self.clock.sleep_until(Duration::from_nanos(at));
        }
        b.take(now, at, n);
    }

    fn progress(&self) -> StreamProgress {
        let elapsed = self.clock.now().saturating_sub(self.started).as_secs_f64();
        let remaining = self.dev.base_bytes();
        let done = self.total.saturating_sub(remaining);
        let throughput = if elapsed > 0.0 { done as f64 / elapsed } else { 0.0 };
        let state = self.state.lock().clone();
        let eta = match state {
            StreamState::Done => Some(0.0),
            StreamState::Running if throughput > 0.0 => Some(remaining as f64 / throughput),
            _ => None,
        };
        StreamProgress {
            state,
            total_bytes: self.total,
            remaining_bytes: remaining,
            copied_bytes: self.copied.load(Relaxed),
            rate_limit: self.rate.load(Relaxed),
            throughput_bps: throughput,
            elapsed_s: elapsed,
            eta_s: eta,
        }
    }
}
