//! [`ReplayClock`]: virtual time for an event-driven replay of many requests
//! in flight on one thread.
//!
//! A `VirtualClock` jumps to every deadline slept on, which serializes
//! requests (each one starts when the previous finished). A replay needs the
//! layers to see each request submitted at its own time while earlier ones
//! are still in flight: the replayer sets `now` to the request's submission
//! time, calls the real layer, and a `sleep_until` inside the layer (the
//! volume model waiting for the booked completion) is recorded as that
//! request's completion instead of moving the clock. Layers that book their
//! service reservation style (`ModelDev`: token buckets reserved at
//! submission) are exact on it; layers with threads of their own (cache
//! writeback, mirror rebuilds, controllers) are not, and are not run on it.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use surge_block::Clock;

#[derive(Debug, Default)]
pub struct ReplayClock {
    now_ns: AtomicU64,
    deadline_ns: AtomicU64,
}

impl ReplayClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next request is submitted at `t` (time never goes backwards).
    pub fn submit_at(&self, t_ns: u64) {
        self.now_ns.fetch_max(t_ns, SeqCst);
        self.deadline_ns.store(0, SeqCst);
    }

    /// When the request just run completes: the latest deadline the layers
    /// slept until, or its submission time if none did.
    pub fn completion_ns(&self) -> u64 {
        self.deadline_ns.load(SeqCst).max(self.now_ns.load(SeqCst))
    }
}

impl Clock for ReplayClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(SeqCst))
    }
    fn sleep_until(&self, deadline: Duration) {
        self.deadline_ns.fetch_max(deadline.as_nanos().min(u64::MAX as u128) as u64, SeqCst);
    }
}
