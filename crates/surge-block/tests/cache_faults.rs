//! The elastic cache's error paths racing with I/O (issue 9), through the public
//! API, with faults injected by `surge_block::fault` (never hand-rolled devices).
//!
//! Each test is named for the invariant it protects and failed before its fix.

mod common;
use common::image;
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
    let (n, deadline) = race_bounds(200_000, 6);
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

// ---------------------------------------------------------------------------
// Finding 6: writes that go straight to backing (write-around, pass-through,
// phase 2, write-through) are lost by a failed backing flush that drops what
// was pending, and nothing re-does them.

fn read_block(dev: &dyn BlockDev, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS as usize];
    dev.read_at(&mut buf, b * BS).unwrap();
    buf
}

/// Block 0 is dirty (so a flush step commits); block 5 is written around the
/// cache to backing, where it waits in the volatile cache. The flush step's
/// backing flush fails and loses it (as Linux drops pages after a writeback
/// error). A later FLUSH must not be acknowledged while block 5 is not on the
/// medium.
#[test]
fn a_bypassing_write_lost_by_a_failed_backing_flush_fails_the_next_flush() {
    for bypass in ["writearound", "passthrough", "drain", "writethrough"] {
        let medium = Arc::new(MemoryDev::new(64 * BS));
        let backing = faulty(medium.clone(), "volatile");
        let c = ElasticCache::new(backing.clone(), cfg(), clock());
        c.attach(cache_mem(8)).unwrap();
        c.write_at(&fill(0xA0), 0, false).unwrap(); // dirty in the cache
        match bypass {
            "drain" => c.set_phase(surge_block::cache::Phase::Drain),
            m => c.set_mode(m.parse().unwrap()),
        }
        c.write_at(&fill(0xB5), 5 * BS, false).unwrap(); // acked, pending on backing
        backing.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
        assert!(c.flush_step(usize::MAX).is_err(), "{bypass}: the flush step's backing flush failed");
        let acked = c.flush().is_ok();
        let on_medium = read_block(medium.as_ref(), 5);
        assert!(
            !acked || on_medium == fill(0xB5),
            "{bypass}: FLUSH acknowledged, but block 5 (written and acked before it) is not on the backing medium"
        );
    }
}

/// Write-through: the backing write is lost by a failed flush while the cache
/// keeps a clean copy of the new data. When the copy is evicted, reads must not
/// revert to the old data, and a FLUSH must not claim the new data durable
/// while it is not.
#[test]
fn a_write_through_copy_never_reverts_to_old_data_after_a_failed_backing_flush() {
    let medium = Arc::new(MemoryDev::new(64 * BS));
    let backing = faulty(medium.clone(), "volatile");
    let c = ElasticCache::new(backing.clone(), CacheConfig { mode: CacheMode::WriteThrough, ..cfg() }, clock());
    c.attach(cache_mem(4)).unwrap();
    c.write_at(&fill(0x01), 0, true).unwrap(); // old data, durable
    read_block(&c, 0); // cached (clean)
    c.write_at(&fill(0x02), 0, false).unwrap(); // backing (pending) + the copy
    backing.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(c.flush().is_err(), "the backing flush failed");
    let acked = c.flush().is_ok();
    // Evict block 0's copy by reading other blocks through the small cache.
    for b in 10..20 {
        read_block(&c, b);
    }
    let _ = c.flush_step(usize::MAX);
    let got = read_block(&c, 0);
    assert!(got == fill(0x02), "block 0 reverted to old data (first byte {:#x}) after its cached copy was evicted", got[0]);
    assert!(!acked || read_block(medium.as_ref(), 0) == fill(0x02), "FLUSH acknowledged while block 0's new data is not on the medium");
}

// ---------------------------------------------------------------------------
// Finding 4: a fail-over whose backing flush fails declared the rescued blocks
// lost, although the failed device still held them (readable, named by its
// metadata).

/// Block 0 is dirty and FLUSHed in the cache. The cache device stops taking
/// writes; the fail-over copies block 0 to backing, but the backing flush
/// fails (losing the copy). Block 0 must still read its data (from the failed
/// device), no FLUSH may be acknowledged until it is on backing, and once the
/// backing heals a FLUSH puts it there.
#[test]
fn fail_over_with_a_failing_backing_flush_keeps_the_rescued_blocks_until_they_are_on_backing() {
    let Rig { store, medium, backing, cdev, c } = Rig::new();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // acked: block 0 durable in the cache
    cdev.set_rules("write.fail_every=1,flush.fail_every=1".parse().unwrap());
    backing.set_rules("volatile,flush.fail_every=1,flush.fail_loses".parse().unwrap());
    // The cache write fails: fail-over. The write itself may then be done on
    // backing or fail; either is allowed.
    let _ = c.write_at(&fill(0x11), BS, false);
    assert!(!c.is_attached());
    let mut buf = fill(0);
    let r = c.read_at(&mut buf, 0);
    assert!(r.is_ok() && buf == fill(0xA1), "block 0 must read its FLUSHed data from the failed device, got {r:?}");
    assert!(c.flush().is_err(), "no FLUSH while block 0 is only on the failed device");
    // A crash now: a restart recovers block 0 from the failed device.
    let (medium_img, cache_img, record) = (image(medium.as_ref()), image(cdev.as_ref()), copy_of(&store));
    let r = ElasticCache::open(medium_img.clone(), cache_img, cfg_with(&record), clock()).unwrap();
    assert!(read_block(&r, 0) == fill(0xA1), "after a crash block 0 comes back from the failed device");
    let _ = r.flush(); // fails: block 1's acknowledged write was lost (below)
    assert_eq!(r.stats().rescue_pending_blocks, 0);
    assert!(read_block(medium_img.as_ref(), 0) == fill(0xA1), "the restart put block 0 on backing");
    backing.set_rules("volatile".parse().unwrap()); // the backing heals
    let _ = c.flush();
    assert_eq!(c.stats().rescue_pending_blocks, 0, "the retried rescue put block 0 on backing");
    assert!(read_block(medium.as_ref(), 0) == fill(0xA1), "block 0 on the backing medium");
    // Block 1 was written (and acked) on backing after the fail-over; the
    // failed flush dropped it: that loss is reported, not block 0.
    assert!(c.stats().loss.is_some() && c.flush().is_err());
    c.ack_loss().unwrap();
    c.flush().unwrap();
    assert!(read_block(medium.as_ref(), 0) == fill(0xA1), "block 0 was never given up");
}

// ---------------------------------------------------------------------------
// Findings 2 and 3: a failed cache device is fenced durably before anything
// further is acknowledged, and lost blocks and the "FLUSH fails" signal
// survive restarts until the user acknowledges.

use surge_block::cache::fence::{FenceStore, MemoryFences};
use surge_block::cache::CacheError;

/// What a crash leaves of a fence record: a copy of it now.
fn copy_of(store: &MemoryFences) -> Arc<MemoryFences> {
    let copy = Arc::new(MemoryFences::new());
    copy.update(&mut |f| *f = store.get()).unwrap();
    copy
}


/// A cache with a fence record, over a volatile backing device (a medium
/// behind a fault layer) and an 8-slot cache device behind a fault layer.
struct Rig {
    store: Arc<MemoryFences>,
    medium: Arc<MemoryDev>,
    backing: Arc<FaultDev>,
    cdev: Arc<FaultDev>,
    c: ElasticCache,
}

impl Rig {
    fn new() -> Rig {
        let store = Arc::new(MemoryFences::new());
        let medium = Arc::new(MemoryDev::new(64 * BS));
        let backing = faulty(medium.clone(), "volatile");
        let cdev = faulty(cache_mem(8), "");
        let c = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
        c.attach(cdev.clone()).unwrap();
        Rig { store, medium, backing, cdev, c }
    }
}

fn cfg_with(store: &Arc<MemoryFences>) -> CacheConfig {
    CacheConfig { fences: Some(store.clone() as Arc<dyn FenceStore>), ..cfg() }
}

/// Block 0 dirty and FLUSHed in the cache, then the cache device vanishes: the
/// fail-over cannot read block 0. Returns (backing, cache device, cache).
fn lose_block_0(c: &ElasticCache, cdev: &FaultDev) {
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap();
    cdev.set_rules("vanish_after=0".parse().unwrap());
    let _ = c.write_at(&fill(0x11), BS, false); // the cache fails: fail-over
    assert!(!c.is_attached());
    assert!(c.stats().lost_blocks >= 1);
}

/// With several connections, one FLUSH consuming a single error would let the
/// writer's connection be acknowledged: every FLUSH fails until the user
/// acknowledges the loss.
#[test]
fn every_flush_fails_after_acknowledged_data_was_lost_until_the_user_acknowledges() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let cdev = faulty(cache_mem(8), "");
    let c = ElasticCache::new(backing.clone(), cfg(), clock());
    c.attach(cdev.clone()).unwrap();
    lose_block_0(&c, &cdev);
    for conn in 0..3 {
        assert!(c.flush().is_err(), "FLUSH {conn} after the loss was acknowledged");
    }
    let mut buf = fill(0);
    assert!(c.read_at(&mut buf, 0).is_err(), "the lost block reads EIO, not stale data");
    c.ack_loss().unwrap();
    c.flush().expect("FLUSH after the user acknowledged the loss");
    c.read_at(&mut buf, 0).unwrap();
    assert!(buf == fill(0), "after the acknowledgement the block reads what backing holds");
}

/// The lost set and the failing FLUSH live in the fence record: after a
/// restart without the failed device, the lost block still reads EIO and
/// FLUSH still fails, until acknowledged.
#[test]
fn blocks_lost_with_a_cache_device_still_fail_reads_and_flushes_after_a_restart() {
    let store = Arc::new(MemoryFences::new());
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let cdev = faulty(cache_mem(8), "");
    let c = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
    c.attach(cdev.clone()).unwrap();
    lose_block_0(&c, &cdev);
    drop(c);
    // Restart; the failed device is not there (deleted, or still gone).
    let r = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
    let mut buf = fill(0);
    assert!(r.read_at(&mut buf, 0).is_err(), "after a restart the lost block must not read stale backing data");
    assert_eq!(r.stats().lost_blocks, 1);
    assert!(r.flush().is_err() && r.flush().is_err(), "every FLUSH fails after a restart too");
    r.ack_loss().unwrap();
    r.flush().unwrap();
    drop(r);
    let r = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
    assert_eq!(r.stats().lost_blocks, 0, "the acknowledgement is durable too");
    r.flush().unwrap();
}

/// A block the fail-over could not read is not lost for good: its device
/// names it, and when the device is readable again after a restart, the
/// block comes back from it (and only it).
#[test]
fn a_block_unreadable_at_fail_over_comes_back_from_its_device_after_a_restart() {
    let store = Arc::new(MemoryFences::new());
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let cdev = faulty(cache_mem(8), "");
    let c = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
    c.attach(cdev.clone()).unwrap();
    c.write_at(&fill(0xB2), 2 * BS, false).unwrap();
    lose_block_0(&c, &cdev);
    // After the fail-over block 2 is rewritten and block 3 written, on backing.
    c.write_at(&fill(0xB3), 2 * BS, false).unwrap();
    c.write_at(&fill(0xC3), 3 * BS, false).unwrap();
    drop(c);
    cdev.set_rules(FaultRules::default()); // the device is back
    let r = ElasticCache::open(backing.clone(), cdev.clone(), cfg_with(&store), clock()).unwrap();
    assert!(!r.is_attached(), "a failed device is only read from, never used as a cache again");
    assert!(read_block(&r, 0) == fill(0xA1), "block 0 came back from the failed device");
    let b2 = read_block(&r, 2);
    assert!(b2 == fill(0xB2) || b2 == fill(0xB3), "block 2 holds one of its versions");
    r.flush().expect("everything is on backing now");
    assert_eq!(r.stats().lost_blocks, 0);
    assert!(read_block(backing.as_ref(), 0) == fill(0xA1) && read_block(backing.as_ref(), 3) == fill(0xC3), "blocks 0 and 3 on backing");
    // Fenced now: never reopened.
    drop(r);
    assert!(matches!(ElasticCache::open(backing.clone(), cdev.clone(), cfg_with(&store), clock()), Err(CacheError::Fenced { .. })));
}

/// The fence must be durable before anything further is acknowledged: while
/// the fence record cannot be written (and the dead device refuses the write
/// that would clear its metadata), no FLUSH is acknowledged; a restart then
/// recovers the device's dirty set, which is legal because nothing after it
/// was FLUSHed.
#[test]
fn no_flush_is_acknowledged_until_a_failed_cache_device_is_fenced_durably() {
    let store = Arc::new(MemoryFences::new());
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let cdev = faulty(cache_mem(8), "");
    let c = ElasticCache::new(backing.clone(), cfg_with(&store), clock());
    c.attach(cdev.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap();
    store.set_failing(true);
    cdev.set_rules("write.fail_every=1,flush.fail_every=1".parse().unwrap());
    let _ = c.write_at(&fill(0x11), BS, false); // fail-over; block 0 saved to backing
    c.write_at(&fill(0xA2), 0, false).unwrap();
    assert!(c.flush().is_err(), "FLUSH acknowledged before the failed device was fenced");
    // A crash now: the device is not fenced, its dirty set (block 0 = A1) comes back; legal.
    store.set_failing(false);
    c.flush().expect("FLUSH once the fence is durable");
    drop(c);
    cdev.set_rules(FaultRules::default());
    assert!(matches!(ElasticCache::open(backing.clone(), cdev.clone(), cfg_with(&store), clock()), Err(CacheError::Fenced { .. })));
    assert!(read_block(backing.as_ref(), 0) == fill(0xA2), "the FLUSHed rewrite of block 0 is on backing");
}

// ---------------------------------------------------------------------------
// Found by the stress test (cache_stress.rs): a write that supersedes a block
// still only on a failed device is itself lost by a failed backing flush.

/// The failed device holds block 0 (FLUSHed) and the backing flush fails, so
/// the rescue is pending. Block 0 is rewritten (on backing) and a failed flush
/// drops the rewrite: block 0 must read the device's copy again (or the
/// rewrite), never the older data backing held before.
#[test]
fn a_rescued_block_whose_rewrite_is_lost_by_a_failed_flush_reads_its_device_copy_not_older_data() {
    let Rig { medium, backing, cdev, c, .. } = Rig::new();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap();
    cdev.set_rules("write.fail_every=1,flush.fail_every=1".parse().unwrap());
    backing.set_rules("volatile,flush.fail_every=1,flush.fail_loses".parse().unwrap());
    let _ = c.write_at(&fill(0x11), 8 * BS, false); // fail-over; the rescue stays pending
    c.write_at(&fill(0xA2), 0, false).unwrap(); // supersedes the device's copy, on backing
    assert!(c.flush().is_err(), "the backing flush fails and drops the rewrite");
    let got = read_block(&c, 0);
    assert!(got == fill(0xA1) || got == fill(0xA2), "block 0 reads {:#x}: older than its last FLUSH", got[0]);
    backing.set_rules("volatile".parse().unwrap());
    let _ = c.flush();
    assert_eq!(c.stats().rescue_pending_blocks, 0);
    let on_medium = read_block(medium.as_ref(), 0);
    assert!(on_medium == fill(0xA1) || on_medium == fill(0xA2), "block 0 on the medium is {:#x}", on_medium[0]);
    assert!(c.stats().loss.is_some(), "the dropped rewrite is reported");
}

/// Block 0's rewrite supersedes the failed device's copy and a backing flush
/// makes it durable (block 1 keeps the rescue pending: the device is gone). A
/// later failed backing flush must not bring the device's older copy back.
#[test]
fn a_durable_rewrite_of_a_rescued_block_is_never_replaced_by_the_device_copy() {
    let Rig { medium, backing, cdev, c, .. } = Rig::new();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.write_at(&fill(0xB1), BS, false).unwrap();
    c.flush().unwrap();
    cdev.set_rules("vanish_after=0".parse().unwrap());
    let _ = c.write_at(&fill(0x11), 8 * BS, false); // fail-over; blocks 0 and 1 unreadable
    c.write_at(&fill(0xA2), 0, false).unwrap(); // block 0 superseded
    // The FLUSH's first backing flush succeeds (block 0's rewrite is durable),
    // the second (after copying what the rescue can) fails.
    backing.set_rules("volatile,flush.fail_nth=2,flush.fail_loses".parse().unwrap());
    assert!(c.flush().is_err(), "block 1 is still only on the failed device");
    assert!(c.flush().is_err());
    cdev.set_rules(FaultRules::default()); // the device is back
    let _ = c.flush();
    assert_eq!(c.stats().rescue_pending_blocks, 0);
    assert!(read_block(&c, 0) == fill(0xA2), "the FLUSHed rewrite of block 0 was replaced by the failed device's older copy");
    assert!(read_block(medium.as_ref(), 0) == fill(0xA2) && read_block(medium.as_ref(), 1) == fill(0xB1));
}
