//! A discrete-event clock for real threads: virtual time that advances only
//! when every thread taking part is waiting.
//!
//! [`VirtualClock`](crate::VirtualClock) jumps to any deadline at once, which is
//! exact for one thread but meaningless for several: one thread's sleep would
//! move everybody's time. `SimClock` runs a conservative discrete-event
//! simulation with the real code: threads register ([`Clock::register_thread`]),
//! and time moves to the earliest pending deadline only when no registered
//! thread can make progress at the current time, i.e. each one is either
//! sleeping on the clock or blocked in the kernel (on a lock held by a sleeper,
//! on a join...). So ten threads each doing I/O on their own device model run in
//! parallel on the virtual time line, exactly as they would in real time, and a
//! lock held across a modelled I/O (a cache block lock, a rebuild's region lock)
//! delays the waiters by exactly the holder's virtual service time.
//!
//! "Blocked in the kernel" is read from `/proc/self/task/TID/stat` (state `S`)
//! by a supervisor thread, woken when a thread sleeps while others run, and
//! accepted only if no clock event happened while it looked; a
//! runnable thread (state `R`, even if preempted) and one in uninterruptible I/O
//! (`D`, e.g. fsync) hold time back. Threads must not sleep in real time (that
//! looks blocked). An unregistered thread that sleeps on the clock is registered
//! for the duration of that sleep only.
//!
//! Linux-only (the `/proc` check); results depend slightly on how threads are
//! scheduled between events at equal virtual times, like a real run.

use crate::clock::Clock;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

/// Longest pause between two supervisor looks while threads run.
const SUPERVISE_MAX_PAUSE: Duration = Duration::from_micros(200);

struct Member {
    /// Kernel thread id, for `/proc/self/task/TID/stat`.
    tid: i32,
    handle: Thread,
    asleep: bool,
    /// Nested registrations of the same thread.
    depth: u32,
}

#[derive(Default)]
struct State {
    members: HashMap<ThreadKey, Member>,
    /// Registered threads not asleep on the clock.
    running: usize,
    /// (deadline ns, sequence, thread) of sleepers.
    heap: BinaryHeap<Reverse<(u64, u64, ThreadKey)>>,
    seq: u64,
    /// Bumped on every clock event (quiet-interval detection).
    events: u64,
    /// Times the supervisor moved time past blocked threads.
    forced: u64,
    /// Outstanding [`Hold`]s (counted in `running` too).
    holds: usize,
}

struct Inner {
    now_ns: AtomicU64,
    st: Mutex<State>,
    /// Threads between calling into the clock and holding its lock: they are
    /// about to sleep or register, so time must not move under them.
    entering: AtomicUsize,
    stop: AtomicBool,
    /// Wakes the supervisor when a thread went to sleep while others run.
    poke: Condvar,
}

/// See the module docs.
pub struct SimClock {
    inner: Arc<Inner>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for SimClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimClock").field("now", &self.now()).finish()
    }
}

/// A small per-thread key (`ThreadId` is not `Ord`).
type ThreadKey = u64;

fn thread_key() -> ThreadKey {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static KEY: ThreadKey = NEXT.fetch_add(1, Ordering::Relaxed));
    KEY.with(|k| *k)
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The scheduler state letter of a thread of this process (`R`, `S`, `D`, ...).
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

impl Inner {
    fn now(&self) -> u64 {
        self.now_ns.load(Ordering::Acquire)
    }

    /// Wake every sleeper due at the earliest deadline, moving time there.
    fn wake_next(&self, st: &mut State) {
        let Some(&Reverse((first, _, _))) = st.heap.peek() else { return };
        if first > self.now() {
            self.now_ns.store(first, Ordering::Release);
        }
        let now = self.now();
        while let Some(&Reverse((d, _, id))) = st.heap.peek() {
            if d > now {
                break;
            }
            st.heap.pop();
            if let Some(m) = st.members.get_mut(&id) {
                if m.asleep {
                    m.asleep = false;
                    st.running += 1;
                    m.handle.unpark();
                }
            }
        }
        st.events += 1;
    }

    /// Nobody can run at the current time: move on.
    fn advance(&self, st: &mut State) {
        while st.running == 0 && !st.heap.is_empty() {
            self.wake_next(st);
        }
    }

    fn register(&self, st: &mut State) {
        let id = thread_key();
        st.events += 1;
        match st.members.get_mut(&id) {
            Some(m) => m.depth += 1,
            None => {
                st.members.insert(id, Member { tid: gettid(), handle: std::thread::current(), asleep: false, depth: 1 });
                st.running += 1;
            }
        }
    }

    fn unregister(&self, st: &mut State) {
        let id = thread_key();
        let Some(m) = st.members.get_mut(&id) else { return };
        m.depth -= 1;
        if m.depth == 0 {
            st.members.remove(&id);
            st.running -= 1;
            st.events += 1;
            self.advance(st);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.entering.fetch_add(1, Ordering::AcqRel);
        let g = self.st.lock();
        self.entering.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// The supervisor: whenever threads run while others sleep, look (with a
    /// growing pause while nothing happens) whether every running member is
    /// blocked in the kernel; if so, time moves on to the next deadline.
    fn supervise(&self) {
        // Short pauses should be short: no 50 us timer slack.
        // SAFETY: prctl on the calling thread with plain integer arguments.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
        let mut pause = 0u32;
        let mut st = self.st.lock();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if st.running == 0 || st.holds > 0 || st.heap.is_empty() {
                self.poke.wait_for(&mut st, Duration::from_millis(5));
                pause = 0;
                continue;
            }
            let events = st.events;
            let tids: Vec<i32> = st.members.values().filter(|m| !m.asleep).map(|m| m.tid).collect();
            let blocked = MutexGuard::unlocked(&mut st, || self.entering.load(Ordering::Acquire) == 0 && tids.iter().all(|&t| thread_state(t) == Some('S')));
            if st.events != events {
                pause = 0;
                continue;
            }
            if blocked && self.entering.load(Ordering::Acquire) == 0 && st.holds == 0 {
                st.forced += 1;
                self.wake_next(&mut st);
                pause = 0;
                continue;
            }
            pause += 1;
            MutexGuard::unlocked(&mut st, || {
                if pause < 4 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep((Duration::from_micros(10) * (pause - 3)).min(SUPERVISE_MAX_PAUSE));
                }
            });
        }
    }
}

impl SimClock {
    /// A clock at time zero, with its supervisor thread.
    pub fn new() -> Arc<Self> {
        let inner = Arc::new(Inner {
            now_ns: AtomicU64::new(0),
            st: Mutex::new(State::default()),
            entering: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            poke: Condvar::new(),
        });
        let sup = inner.clone();
        let sup = std::thread::Builder::new().name("simclock-supervisor".into()).spawn(move || sup.supervise()).expect("spawn simclock supervisor");
        Arc::new(SimClock { inner, supervisor: Mutex::new(Some(sup)) })
    }

    /// Keep time still until the returned guard is dropped, e.g. while a
    /// group of threads is being started: without it, the first one to sleep
    /// would let time run before the others registered.
    pub fn hold(&self) -> Hold {
        let mut st = self.inner.lock();
        st.running += 1;
        st.holds += 1;
        st.events += 1;
        Hold { inner: self.inner.clone() }
    }

    /// Times the supervisor moved time on past threads blocked on each other.
    pub fn forced_advances(&self) -> u64 {
        self.inner.st.lock().forced
    }

    /// Registered threads (for tests and diagnostics).
    pub fn registered(&self) -> usize {
        self.inner.st.lock().members.len()
    }
}

/// See [`SimClock::hold`].
pub struct Hold {
    inner: Arc<Inner>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.running -= 1;
        st.holds -= 1;
        st.events += 1;
        self.inner.advance(&mut st);
        self.inner.poke.notify_one();
    }
}

impl Drop for SimClock {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.poke.notify_all();
        if let Some(h) = self.supervisor.lock().take() {
            let _ = h.join();
        }
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.inner.now())
    }

    fn sleep_until(&self, deadline: Duration) {
        let d = deadline.as_nanos().min(u64::MAX as u128) as u64;
        if d <= self.inner.now() {
            return;
        }
        let inner = &self.inner;
        let mut st = inner.lock();
        if d <= inner.now() {
            return;
        }
        let id = thread_key();
        let temporary = !st.members.contains_key(&id);
        if temporary {
            inner.register(&mut st);
        }
        let seq = st.seq;
        st.seq += 1;
        st.heap.push(Reverse((d, seq, id)));
        st.members.get_mut(&id).expect("registered").asleep = true;
        st.running -= 1;
        st.events += 1;
        inner.advance(&mut st);
        if st.running > 0 {
            inner.poke.notify_one();
        }
        while st.members.get(&id).is_some_and(|m| m.asleep) {
            drop(st);
            std::thread::park();
            st = inner.lock();
        }
        if temporary {
            inner.unregister(&mut st);
        }
    }

    fn register_thread(&self) {
        let mut st = self.inner.lock();
        self.inner.register(&mut st);
        self.inner.poke.notify_one();
    }

    fn unregister_thread(&self) {
        let mut st = self.inner.lock();
        self.inner.unregister(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ClockThread;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn threads_sleeping_on_their_own_run_in_parallel_on_virtual_time() {
        let clock = SimClock::new();
        let dynclock: Arc<dyn Clock> = clock.clone();
        let all_in = std::sync::Barrier::new(8);
        let ends: Vec<Duration> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8u64)
                .map(|i| {
                    let (c, all_in) = (dynclock.clone(), &all_in);
                    s.spawn(move || {
                        let _t = ClockThread::enter(c.clone());
                        all_in.wait();
                        // Thread i takes i+1 virtual seconds per step, 10 steps.
                        for _ in 0..10 {
                            c.sleep_until(c.now() + secs(i + 1));
                        }
                        c.now()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, e) in ends.iter().enumerate() {
            assert_eq!(*e, secs(10 * (i as u64 + 1)), "thread {i} ends at its own 10 steps, in parallel");
        }
        assert_eq!(clock.now(), secs(80));
        assert_eq!(clock.registered(), 0);
    }

    #[test]
    fn time_waits_for_a_running_thread() {
        let clock = SimClock::new();
        let c: Arc<dyn Clock> = clock.clone();
        let both_in = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let (c1, b1) = (c.clone(), &both_in);
            let sleeper = s.spawn(move || {
                let _t = ClockThread::enter(c1.clone());
                b1.wait();
                c1.sleep_until(secs(5));
                c1.now()
            });
            let (c2, b2) = (c.clone(), &both_in);
            let worker = s.spawn(move || {
                let _t = ClockThread::enter(c2.clone());
                b2.wait();
                // Real work (not a sleep on the clock): time must not move meanwhile.
                let start = c2.now();
                let t0 = std::time::Instant::now();
                while t0.elapsed() < Duration::from_millis(30) {
                    std::hint::spin_loop();
                }
                let seen = c2.now();
                c2.sleep_until(secs(1));
                (start, seen, c2.now())
            });
            let (start, seen, after) = worker.join().unwrap();
            assert_eq!(start, seen, "time moved while a registered thread was running");
            assert_eq!(after, secs(1));
            assert_eq!(sleeper.join().unwrap(), secs(5));
        });
    }

    #[test]
    fn a_lock_held_across_a_sleep_delays_the_waiter_by_the_holders_virtual_time() {
        let clock = SimClock::new();
        let c: Arc<dyn Clock> = clock.clone();
        let lock = Arc::new(Mutex::new(()));
        let (locked, both_in) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let (c1, l1, locked1, both1) = (c.clone(), lock.clone(), &locked, &both_in);
            s.spawn(move || {
                let _t = ClockThread::enter(c1.clone());
                let _g = l1.lock();
                locked1.wait();
                both1.wait();
                // Holds the lock for 3 virtual seconds.
                c1.sleep_until(secs(3));
            });
            let (c2, l2, locked2, both2) = (c.clone(), lock.clone(), &locked, &both_in);
            let waiter = s.spawn(move || {
                let _t = ClockThread::enter(c2.clone());
                locked2.wait();
                both2.wait();
                let _g = l2.lock();
                let got = c2.now();
                c2.sleep_until(got + secs(1));
                (got, c2.now())
            });
            assert_eq!(waiter.join().unwrap(), (secs(3), secs(4)));
        });
        assert!(clock.forced_advances() >= 1, "the supervisor must have moved time past the blocked waiter");
    }

    #[test]
    fn a_hold_keeps_time_still_until_released() {
        let clock = SimClock::new();
        let hold = clock.hold();
        let c: Arc<dyn Clock> = clock.clone();
        let early = std::thread::spawn(move || {
            let _t = ClockThread::enter(c.clone());
            c.sleep_until(secs(10));
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(clock.now(), Duration::ZERO, "time moved under a hold");
        drop(hold);
        early.join().unwrap();
        assert_eq!(clock.now(), secs(10));
    }

    #[test]
    fn unregistered_sleepers_still_wake_at_their_deadline() {
        let clock = SimClock::new();
        clock.sleep_until(secs(7));
        assert_eq!(clock.now(), secs(7));
        clock.sleep_until(secs(2));
        assert_eq!(clock.now(), secs(7), "time never goes backwards");
    }
}
