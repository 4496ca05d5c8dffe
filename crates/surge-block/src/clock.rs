//! Time as an input. Everything time-based (token buckets, device models,
//! policies, cost) reads a [`Clock`], so tests run on virtual time without sleeping.

use parking_lot::{Condvar, Mutex};
use std::fmt::Debug;
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync + Debug {
    /// Time elapsed since the clock's origin.
    fn now(&self) -> Duration;
    /// Block until `now() >= deadline`.
    fn sleep_until(&self, deadline: Duration);
    /// The calling thread takes part in time-based work on this clock (it will
    /// sleep on it). Only a discrete-event clock ([`crate::SimClock`]) cares: time
    /// advances when every registered thread sleeps or is blocked.
    fn register_thread(&self) {}
    /// The calling thread no longer sleeps on this clock.
    fn unregister_thread(&self) {}
}

/// Registers the current thread with a clock for its lifetime (see
/// [`Clock::register_thread`]); threads that layers spawn to sleep on a clock
/// (rebuilds, controllers) hold one.
pub struct ClockThread(std::sync::Arc<dyn Clock>);

impl ClockThread {
    pub fn enter(clock: std::sync::Arc<dyn Clock>) -> Self {
        clock.register_thread();
        ClockThread(clock)
    }
}

impl Drop for ClockThread {
    fn drop(&mut self) {
        self.0.unregister_thread();
    }
}

/// Spawn a thread registered on `clock` before this returns, so that a
/// discrete-event clock (`SimClock`) cannot move time on before it starts,
/// nor while it works between its sleeps (a no-op for the system clock).
pub fn spawn_registered<T: Send + 'static>(name: String, clock: std::sync::Arc<dyn Clock>, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<std::thread::JoinHandle<T>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    // The caller waits spinning, not blocked in the kernel: a discrete-event
    // clock would take a blocked caller as waiting for time and move it on.
    let started = std::sync::Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let t = std::thread::Builder::new().name(name).spawn(move || {
        let _t = ClockThread::enter(clock);
        s.store(true, Ordering::Release);
        f()
    })?;
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    Ok(t)
}

/// Wall-clock time (monotonic), origin at construction.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock { origin: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
    fn sleep_until(&self, deadline: Duration) {
        let now = self.now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
    }
}

/// Virtual time that only moves when told to. `sleep_until` jumps the clock
/// forward to the deadline, so a single-threaded simulation runs as fast as the
/// CPU allows and gives exact, repeatable results.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: Mutex<Duration>,
    moved: Condvar,
}

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now += by;
        self.moved.notify_all();
    }

    pub fn set(&self, to: Duration) {
        let mut now = self.now.lock();
        if to > *now {
            *now = to;
            self.moved.notify_all();
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Duration {
        *self.now.lock()
    }
    fn sleep_until(&self, deadline: Duration) {
        self.set(deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_told() {
        let c = VirtualClock::new();
        assert_eq!(c.now(), Duration::ZERO);
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Duration::from_secs(2));
        c.sleep_until(Duration::from_secs(5));
        assert_eq!(c.now(), Duration::from_secs(5));
        c.sleep_until(Duration::from_secs(1));
        assert_eq!(c.now(), Duration::from_secs(5), "time never goes backwards");
    }
}
