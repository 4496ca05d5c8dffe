//! The elastic cache's error paths racing with I/O (issue 9), through the public
//! API, with faults injected by `surge_block::fault` (never hand-rolled devices).
//!
//! Each test is named for the invariant it protects and failed before its fix.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::cache::{CacheConfig, CacheMode, ElasticCache};
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::{BlockDev, Clock, MemoryDev, VirtualClock};

const BS: u64 = 4096;

fn cfg() -> CacheConfig {
    CacheConfig {
        block_size: BS,
        mode: CacheMode::WriteBack,
        // Phase-1 background flushing never starts by itself in these tests.
        idle_gap: Duration::from_secs(3600),
        ..CacheConfig::default()
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(VirtualClock::new())
}

/// A cache device with room for exactly `slots` blocks of `BS` plus metadata.
fn cache_mem(slots: u64) -> Arc<MemoryDev> {
    Arc::new(MemoryDev::new(2 * 4096 + slots * BS))
}

fn faulty(inner: Arc<dyn BlockDev>, rules: &str) -> Arc<FaultDev> {
    Arc::new(FaultDev::new(inner, rules.parse::<FaultRules>().unwrap(), clock()))
}

fn fill(v: u8) -> Vec<u8> {
    vec![v; BS as usize]
}

/// Bounds of a race test: at most `SURGE_RACE_ROUNDS` rounds (default `rounds`)
/// and `SURGE_RACE_SECS` seconds (default `secs`).
fn race_bounds(rounds: u64, secs: u64) -> (u64, Instant) {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    (env("SURGE_RACE_ROUNDS", rounds), Instant::now() + Duration::from_secs(env("SURGE_RACE_SECS", secs)))
}

// ---------------------------------------------------------------------------
// Finding 1: the bypassing write path checked "clean" and unmapped under two
// separate acquisitions of the state lock, while a failed backing flush
// re-dirtied written-back blocks in between: a dirty block without a slot.

/// One thread writes block 0 again and again; the other makes block 0 a clean,
/// written-back (unsynced) copy, switches to write-around, and runs a flush
/// step whose backing flush fails once (re-dirtying block 0 while the writer
/// may be between its "clean" check and its unmap), then a FLUSH. Every FLUSH
/// must complete without a panic and the cache must stay consistent. Before
/// the fix this panicked within 11,000-110,000 rounds here (`SURGE_RACE_SECS=60`
/// to hunt longer).
#[test]
fn bypassing_write_racing_failed_backing_flush_never_leaves_a_dirty_block_unmapped() {
    let backing = faulty(Arc::new(MemoryDev::new(64 * BS)), "");
    let c = Arc::new(ElasticCache::new(backing.clone(), cfg(), clock()));
    // Many slots: a commit's snapshot holds the state lock long enough for
    // the writer's second acquisition to wait behind it (the race window).
    c.attach(cache_mem(256)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (c, stop) = (c.clone(), stop.clone());
        move || {
            let mut v = 0u8;
            while !stop.load(Relaxed) {
                v = v.wrapping_add(1);
                // Errors are allowed (a failed flush may be reported to anyone);
                // panics are not.
                let _ = c.write_at(&fill(v), 0, false);
            }
        }
    });
    // A third thread taking the state lock widens the window on a loaded machine.
    let hammer = std::thread::spawn({
        let (c, stop) = (c.clone(), stop.clone());
        move || {
            while !stop.load(Relaxed) {
                std::hint::black_box(c.stats());
            }
        }
    });
    let (n, deadline) = race_bounds(200_000, 8);
    let mut done = 0;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        while done < n && Instant::now() < deadline {
            c.set_mode(CacheMode::WriteBack);
            let _ = c.write_at(&fill(0xEE), 0, false);
            c.set_mode(CacheMode::WriteAround);
            backing.set_rule("flush.fail_nth", Some("1")).unwrap();
            let _ = c.flush_step(usize::MAX);
            let _ = c.flush();
            if let Err(e) = c.check_consistency() {
                panic!("round {done}: {e}");
            }
            done += 1;
        }
    }));
    stop.store(true, Relaxed);
    let writer_ok = writer.join().is_ok();
    hammer.join().unwrap();
    assert!(outcome.is_ok(), "round {done}: a FLUSH or flush step panicked, or the cache state broke (a dirty block lost its slot)");
    assert!(writer_ok, "the writer panicked");
    // Quiet now: no fault armed, everything must drain and detach.
    backing.set_rules(FaultRules::default());
    c.set_mode(CacheMode::WriteBack);
    c.drain_and_detach().expect("drain and detach after the race");
}
