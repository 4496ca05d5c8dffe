//! Durability review of the elastic cache (crates/surge-block/src/cache), through
//! its public API only.
//!
//! "Crash images": the devices here are `MemoryDev`s, which have no volatile cache,
//! so a copy of their bytes taken at any instant is a legal post-crash state (every
//! completed write survived). A test takes such a copy while a thread is parked at
//! a chosen point, reopens the cache on the copy with `ElasticCache::open` (the
//! daemon's restart path) and checks the durability contract: everything
//! acknowledged before the last acknowledged FLUSH is present.
//!
//! Interleavings are forced with a gate on the backing device's `flush` (the first
//! step of a cache commit after it snapshots the dirty set), never with sleeps.
//! Tests that show a bug are `#[ignore = "bug: ..."]` so CI stays green; run them
//! with `cargo test -p surge-block --test cache_review -- --include-ignored`.

mod common;
use common::image;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use surge_block::cache::fence::{FenceStore, MemoryFences};
use surge_block::cache::{CacheConfig, CacheError, CacheMode, ElasticCache, Flusher, Phase};
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::{BlockDev, BlockError, Clock, MemoryDev, Result, VirtualClock};

const BS: u64 = 4096;

fn cfg() -> CacheConfig {
    CacheConfig {
        block_size: BS,
        mode: CacheMode::WriteBack,
        seq_bypass: None,
        // Phase-1 background flushing never starts by itself in these tests.
        idle_gap: Duration::from_secs(3600),
        flush_batch: 64,
        fences: None,
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(VirtualClock::new())
}

/// A cache device with room for exactly `slots` blocks of `BS` plus metadata.
fn cache_mem(slots: u64) -> Arc<MemoryDev> {
    Arc::new(MemoryDev::new(2 * 4096 + slots * BS))
}


fn block(dev: &dyn BlockDev, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS as usize];
    dev.read_at(&mut buf, b * BS).unwrap();
    buf
}

fn fill(v: u8) -> Vec<u8> {
    vec![v; BS as usize]
}

/// First byte and whether the block is uniformly that byte, for messages.
fn describe(buf: &[u8]) -> String {
    if buf.iter().all(|&x| x == buf[0]) {
        format!("all {:#04x}", buf[0])
    } else {
        format!("mixed, starting {:#04x}", buf[0])
    }
}

fn eio(what: &'static str, offset: u64, len: u64) -> BlockError {
    BlockError::io(what, offset, len, std::io::Error::from_raw_os_error(libc::EIO))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        std::thread::yield_now();
    }
}

// ---------------------------------------------------------------------------
// A backing device whose flushes can be parked at a gate.

#[derive(Default)]
struct GateState {
    hold: bool,
    /// Park after the inner flush returned (its outcome is not yet reported).
    after: bool,
    parked: u32,
    tickets: u32,
}

struct Gated {
    inner: Arc<dyn BlockDev>,
    st: Mutex<GateState>,
    cv: Condvar,
}

impl Gated {
    fn new(inner: Arc<dyn BlockDev>) -> Arc<Self> {
        Arc::new(Gated { inner, st: Mutex::new(GateState::default()), cv: Condvar::new() })
    }
    /// From now on, flushes park until released.
    fn hold(&self) {
        self.st.lock().unwrap().hold = true;
    }
    /// From now on, flushes run, then park before returning their outcome.
    fn hold_after(&self) {
        let mut st = self.st.lock().unwrap();
        st.hold = true;
        st.after = true;
    }
    /// Let every parked and future flush through.
    fn open(&self) {
        let mut st = self.st.lock().unwrap();
        st.hold = false;
        st.tickets += st.parked;
        self.cv.notify_all();
    }
    fn release_one(&self) {
        self.st.lock().unwrap().tickets += 1;
        self.cv.notify_all();
    }
    fn wait_parked(&self, n: u32) {
        let mut st = self.st.lock().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while st.parked < n {
            let left = deadline.checked_duration_since(Instant::now()).expect("timed out waiting for a parked flush");
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
    }
}

impl BlockDev for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        let after = self.st.lock().unwrap().after;
        let r = after.then(|| self.inner.flush());
        let mut st = self.st.lock().unwrap();
        if st.hold {
            st.parked += 1;
            self.cv.notify_all();
            while st.tickets == 0 {
                st = self.cv.wait(st).unwrap();
            }
            st.tickets -= 1;
            st.parked -= 1;
        }
        drop(st);
        r.unwrap_or_else(|| self.inner.flush())
    }
}

// ---------------------------------------------------------------------------
// Bug 1: a commit names a slot that is reused before the commit lands.
//
// `commit` snapshots the dirty set (block -> slot) under the state lock, then
// flushes backing and the cache device and only then writes the metadata. R1
// ("a slot is given to another block only once the last durable metadata no
// longer names it") is enforced with `Slot::persisted`, which does not know about
// the snapshot in flight. So while a FLUSH is between its snapshot and its
// metadata write, the background flusher can write a snapshotted block back
// (making it clean, `persisted == None`) and the allocator can evict it and hand
// its slot to another block. The FLUSH then persists "block B is dirty in slot S"
// while S holds the other block's data.

/// Scenario: blocks 0 and 1 dirty in a 2-slot cache. A FLUSH snapshots them and
/// parks on the backing flush; the flusher writes block 0 back; a write of block
/// 2 evicts block 0 and takes its slot; the FLUSH completes and is acknowledged.
/// A crash now must find block 0's flushed data.
#[test]
fn flushed_block_must_survive_a_crash_when_its_slot_is_reused_during_the_flush() {
    let backing_mem = Arc::new(MemoryDev::new(64 * BS));
    let gate = Gated::new(backing_mem.clone());
    let cmem = cache_mem(2);
    let c = Arc::new(ElasticCache::new(gate.clone(), cfg(), clock()));
    c.attach(cmem.clone()).unwrap();
    c.write_at(&fill(0xB1), 0, false).unwrap(); // block 0 -> slot 0, dirty
    c.write_at(&fill(0xD1), BS, false).unwrap(); // block 1 -> slot 1, dirty

    gate.hold();
    let user_flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1); // the FLUSH's snapshot names (0, slot 0) and (1, slot 1)

    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    // Block 0 is written back and clean; the flusher now waits for the commit lock.
    wait_until("block 0 is written back", || c.stats().flushed_bytes >= BS);

    // A new block needs a slot: block 0 is clean and not in durable metadata yet,
    // so it is evicted and slot 0 now holds block 2.
    c.write_at(&fill(0xC2), 2 * BS, false).unwrap();

    gate.release_one();
    user_flush.join().unwrap().expect("FLUSH acknowledged");
    // The flusher's own commit parks on the backing flush: crash here.
    gate.wait_parked(1);
    let (backing_img, cache_img) = (image(backing_mem.as_ref()), image(cmem.as_ref()));
    gate.open();
    flusher.join().unwrap().unwrap();

    let r = ElasticCache::open(backing_img, cache_img, cfg(), clock()).unwrap();
    let got = block(&r, 0);
    assert!(
        got == fill(0xB1),
        "block 0 was written and then FLUSHed (acked), but after a crash it reads {} (block 2's data is 0xc2)",
        describe(&got)
    );
}

/// Same root cause, no crash needed: in phase 2 a write-around to the clean
/// (just written back) block 0 unmaps it and, as `persisted` is still None, puts
/// its slot on the free list at once. The in-flight FLUSH then records slot 0 as
/// persisted, and the flusher's next commit, seeing it leave the metadata, pushes
/// it onto the free list a second time. After `Resume` (phase 1 again, as the
/// elastic policy does when a new burst starts while draining), two blocks are
/// given the same slot and one silently reads the other's data.
#[test]
fn a_cache_slot_must_never_be_given_to_two_blocks_at_once() {
    let backing_mem = Arc::new(MemoryDev::new(64 * BS));
    let gate = Gated::new(backing_mem.clone());
    let c = Arc::new(ElasticCache::new(gate.clone(), cfg(), clock()));
    c.attach(cache_mem(2)).unwrap();
    c.write_at(&fill(0xB1), 0, false).unwrap(); // block 0 -> slot 0, dirty

    gate.hold();
    let user_flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1);
    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    wait_until("block 0 is written back", || c.stats().flushed_bytes >= BS);

    c.set_phase(Phase::Drain);
    c.write_at(&fill(0xB2), 0, false).unwrap(); // bypass: invalidates the clean copy
    gate.open();
    user_flush.join().unwrap().unwrap();
    flusher.join().unwrap().unwrap();

    c.set_phase(Phase::Boost);
    let r = catch_unwind(AssertUnwindSafe(|| {
        for (b, v) in [(2u64, 0xC2u8), (3, 0xE3)] {
            c.write_at(&fill(v), b * BS, false).unwrap();
        }
        (block(c.as_ref(), 2), block(c.as_ref(), 3))
    }));
    let (b2, b3) = match r {
        Ok(v) => v,
        Err(_) => panic!("two blocks were mapped to the same cache slot (map_slot's debug assertion fired)"),
    };
    assert!(b2 == fill(0xC2) && b3 == fill(0xE3), "block 2 reads {}, block 3 reads {}", describe(&b2), describe(&b3));
    assert_eq!(block(c.as_ref(), 0), fill(0xB2), "the bypassing write of block 0 is visible");
}

// ---------------------------------------------------------------------------
// Bug 2: a cache device that failed over keeps metadata naming dirty blocks.

/// A cache device behind the fault-injection layer, rules set live by the test.
fn faulty_cache(slots: u64) -> Arc<FaultDev> {
    Arc::new(FaultDev::new(cache_mem(slots), FaultRules::default(), clock()))
}

/// Every write and flush fails from now on (reads keep working: a device that
/// went read-only or has a lasting write fault).
fn fail_writes(dev: &FaultDev) {
    dev.set_rule("write.fail_every", Some("1")).unwrap();
    dev.set_rule("flush.fail_every", Some("1")).unwrap();
}

/// Scenario: block 0 dirty and FLUSHed in the cache; the cache device starts
/// failing writes, the layer falls back to backing (saving block 0 there); the
/// application rewrites block 0 and FLUSHes (acked, on backing). The process
/// restarts and reopens the failed device (the daemon reopens the newest
/// leftover cache volume). The device refused the write that would have
/// cleared its metadata, so only the fence record (`CacheConfig::fences`,
/// a file in the daemon's data directory) can say it failed: `open` must
/// refuse it, never trust its stale metadata, and draining must never write
/// old data over the newer, FLUSHed data on backing.
#[test]
fn reopening_a_failed_over_cache_must_not_resurrect_stale_dirty_blocks() {
    let fences: Arc<dyn FenceStore> = Arc::new(MemoryFences::new());
    let cfg = || CacheConfig { fences: Some(fences.clone()), ..cfg() };
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let dev = faulty_cache(8);
    let c = ElasticCache::new(backing.clone(), cfg(), clock());
    c.attach(dev.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // durable metadata: block 0 dirty in the cache

    fail_writes(&dev);
    c.write_at(&fill(0x11), BS, false).unwrap(); // cache write fails: fall back
    assert!(!c.is_attached(), "the layer fell back to backing");
    assert_eq!(c.stats().lost_blocks, 0, "block 0 was readable and saved");
    c.write_at(&fill(0xA2), 0, false).unwrap();
    c.flush().unwrap(); // acked: block 0 = 0xA2 is durable on backing
    drop(c);

    // Restart; the device works again (or only its writes had failed).
    dev.set_rules(FaultRules::default());
    let r = match ElasticCache::open(backing.clone(), dev.clone(), cfg(), clock()) {
        // The failed device is never used again: run on backing alone.
        Err(CacheError::Fenced { .. }) => ElasticCache::new(backing.clone(), cfg(), clock()),
        other => other.unwrap(),
    };
    let got = block(&r, 0);
    assert!(got == fill(0xA2), "block 0 was rewritten and FLUSHed after the fail-over, but reads {} after a restart", describe(&got));
    if r.is_attached() {
        r.drain_and_detach().unwrap();
    }
    let on_backing = block(backing.as_ref(), 0);
    assert!(on_backing == fill(0xA2), "draining wrote {} over the flushed data", describe(&on_backing));
}

/// Without a fence record, when the failed device still takes the metadata
/// write, fail-over leaves an empty, newer table behind and a reopen finds
/// nothing to resurrect. (When it takes no write at all, as in the test above,
/// only the fence record helps: without one, no FLUSH is acknowledged.)
#[test]
fn fail_over_clears_the_metadata_of_a_device_that_still_takes_writes() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let dev = faulty_cache(8);
    let c = ElasticCache::new(backing.clone(), cfg(), clock());
    c.attach(dev.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // durable metadata: block 0 dirty in the cache

    dev.set_rule("write.fail_nth", Some("1")).unwrap(); // the next write fails once
    c.write_at(&fill(0x11), BS, false).unwrap(); // cache write fails: fall back
    assert!(!c.is_attached());
    c.write_at(&fill(0xA2), 0, false).unwrap();
    c.flush().unwrap();
    drop(c);

    let r = ElasticCache::open(backing.clone(), dev.clone(), cfg(), clock()).unwrap();
    assert_eq!(r.stats().dirty_bytes, 0, "the reopened device names no dirty block");
    let got = block(&r, 0);
    assert!(got == fill(0xA2), "block 0 reads {} after a restart", describe(&got));
}

// ---------------------------------------------------------------------------
// Bug 3: a failed backing flush does not re-dirty the blocks written back.

/// A backing device with a volatile write cache whose flush can fail once. As
/// Linux does after a writeback error (the "fsyncgate" semantics), a failed
/// flush drops what was pending, and the next flush succeeds. `durable` is the
/// medium: what a crash leaves.
struct FlakyFlush {
    live: MemoryDev,
    durable: Arc<MemoryDev>,
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
    fail_next: Mutex<bool>,
    /// If non-zero, the flush that brings it to zero fails (counts down per flush).
    fail_countdown: Mutex<u32>,
}

impl BlockDev for FlakyFlush {
    fn size(&self) -> u64 {
        self.live.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.live.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.live.write_at(buf, offset, false)?;
        if fua {
            self.durable.write_at(buf, offset, false)
        } else {
            self.pending.lock().unwrap().push((offset, buf.to_vec()));
            Ok(())
        }
    }
    fn flush(&self) -> Result<()> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap());
        let countdown_hit = {
            let mut n = self.fail_countdown.lock().unwrap();
            *n > 0 && {
                *n -= 1;
                *n == 0
            }
        };
        if std::mem::take(&mut *self.fail_next.lock().unwrap()) || countdown_hit {
            return Err(eio("flush", 0, 0));
        }
        for (off, data) in pending {
            self.durable.write_at(&data, off, false)?;
        }
        Ok(())
    }
}

/// Scenario: block 0 dirty and FLUSHed in the cache (durable there). The flusher
/// writes it back and commits; the backing flush fails (the flush step reports
/// the error, the block is already marked clean). The next FLUSH's backing flush
/// succeeds, so the commit drops block 0 from the metadata. A crash then loses
/// block 0: it is neither on the backing medium nor named by the cache.
#[test]
fn failed_backing_flush_must_keep_written_back_blocks_dirty() {
    let durable = Arc::new(MemoryDev::new(64 * BS));
    let backing = Arc::new(FlakyFlush {
        live: MemoryDev::new(64 * BS),
        durable: durable.clone(),
        pending: Mutex::new(Vec::new()),
        fail_next: Mutex::new(false),
        fail_countdown: Mutex::new(0),
    });
    let cmem = cache_mem(8);
    let c = ElasticCache::new(backing.clone(), cfg(), clock());
    c.attach(cmem.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // acked: block 0 = 0xA1 durable (in the cache)

    *backing.fail_next.lock().unwrap() = true;
    assert!(c.flush_step(usize::MAX).is_err(), "the write-back's backing flush failed and is reported");
    // The application keeps going; its next FLUSH succeeds.
    let flush_ok = c.flush().is_ok();

    let r = ElasticCache::open(image(durable.as_ref()), image(cmem.as_ref()), cfg(), clock()).unwrap();
    let got = block(&r, 0);
    assert!(
        got == fill(0xA1),
        "block 0 was FLUSHed (acked) before the backing flush failed; after a later {} FLUSH and a crash it reads {}",
        if flush_ok { "acknowledged" } else { "failed" },
        describe(&got)
    );
}

/// Same family, racing: block 0 is written back while a FLUSH is parked on its
/// backing flush, which then fails and drops that write-back too (it was
/// pending). The flusher's own commit then succeeds. Block 0 must still be
/// named by the metadata (or be on the backing medium) after a crash.
#[test]
fn a_write_back_dropped_by_a_concurrent_failed_backing_flush_stays_dirty() {
    let durable = Arc::new(MemoryDev::new(64 * BS));
    let flaky = Arc::new(FlakyFlush {
        live: MemoryDev::new(64 * BS),
        durable: durable.clone(),
        pending: Mutex::new(Vec::new()),
        fail_next: Mutex::new(false),
        fail_countdown: Mutex::new(0),
    });
    let gate = Gated::new(flaky.clone());
    let cmem = cache_mem(8);
    let c = Arc::new(ElasticCache::new(gate.clone(), cfg(), clock()));
    c.attach(cmem.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // acked: block 0 = 0xA1 durable in the cache
    c.write_at(&fill(0xD1), BS, false).unwrap();

    gate.hold();
    let user_flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1); // snapshot taken: block 0 dirty, nothing written back yet
    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    wait_until("block 0 is written back", || c.stats().flushed_bytes >= BS);
    *flaky.fail_next.lock().unwrap() = true;
    gate.open(); // the FLUSH's backing flush fails, dropping the write-back
    assert!(user_flush.join().unwrap().is_err());
    let _ = flusher.join().unwrap(); // its commit's backing flush succeeds

    let r = ElasticCache::open(image(durable.as_ref()), image(cmem.as_ref()), cfg(), clock()).unwrap();
    let got = block(&r, 0);
    assert!(got == fill(0xA1), "block 0 was FLUSHed (acked); after a crash it reads {}", describe(&got));
}

/// A device whose next write completes and then parks its caller until released.
struct ParkAfterWrite {
    inner: Arc<dyn BlockDev>,
    /// (armed, parked, released)
    st: Mutex<(bool, bool, bool)>,
    cv: Condvar,
}

impl BlockDev for ParkAfterWrite {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.inner.write_at(buf, offset, fua)?;
        let mut st = self.st.lock().unwrap();
        if std::mem::take(&mut st.0) {
            st.1 = true;
            self.cv.notify_all();
            while !st.2 {
                st = self.cv.wait(st).unwrap();
            }
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

/// Same family, tighter race: the write-back of block 0 has reached backing
/// (pending there) but is not yet recorded when a FLUSH's backing flush fails
/// and drops it. The flusher's commit then succeeds; block 0 must stay named.
#[test]
fn a_write_back_in_progress_during_a_failed_backing_flush_stays_dirty() {
    let durable = Arc::new(MemoryDev::new(64 * BS));
    let flaky = Arc::new(FlakyFlush {
        live: MemoryDev::new(64 * BS),
        durable: durable.clone(),
        pending: Mutex::new(Vec::new()),
        fail_next: Mutex::new(false),
        fail_countdown: Mutex::new(0),
    });
    let park = Arc::new(ParkAfterWrite { inner: flaky.clone(), st: Mutex::new((false, false, false)), cv: Condvar::new() });
    let cmem = cache_mem(8);
    let c = Arc::new(ElasticCache::new(park.clone(), cfg(), clock()));
    c.attach(cmem.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap(); // acked: block 0 = 0xA1 durable in the cache

    park.st.lock().unwrap().0 = true;
    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    {
        let mut st = park.st.lock().unwrap();
        while !st.1 {
            st = park.cv.wait(st).unwrap();
        }
    }
    *flaky.fail_next.lock().unwrap() = true;
    assert!(c.flush().is_err(), "the backing flush failed");
    park.st.lock().unwrap().2 = true;
    park.cv.notify_all();
    let _ = flusher.join().unwrap();

    let r = ElasticCache::open(image(durable.as_ref()), image(cmem.as_ref()), cfg(), clock()).unwrap();
    let got = block(&r, 0);
    assert!(got == fill(0xA1), "block 0 was FLUSHed (acked); after a crash it reads {}", describe(&got));
}

/// Same family, on the fail-over path: the cache device fails during a FLUSH's
/// commit; `fail_over` copies the dirty block to backing but the backing flush
/// that should make it durable fails. `fail_over` only logs that
/// (`backing_flush_ok = false`), counts the block as saved (not lost), and the
/// FLUSH is retried on backing alone, where the next flush succeeds: the FLUSH
/// is acknowledged while the block is on neither the backing medium nor a cache
/// the layer still uses, and `lost_blocks` says 0.
#[test]
fn fallback_must_not_ack_a_flush_when_saving_dirty_blocks_to_backing_failed() {
    let durable = Arc::new(MemoryDev::new(64 * BS));
    let backing = Arc::new(FlakyFlush {
        live: MemoryDev::new(64 * BS),
        durable: durable.clone(),
        pending: Mutex::new(Vec::new()),
        fail_next: Mutex::new(false),
        fail_countdown: Mutex::new(0),
    });
    let dev = faulty_cache(8);
    let c = ElasticCache::new(backing.clone(), cfg(), clock());
    c.attach(dev.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    // The cache device dies; the FLUSH's commit flushes backing (ok), then the
    // cache flush fails -> fail_over saves block 0, its backing flush (2nd) fails.
    fail_writes(&dev);
    *backing.fail_countdown.lock().unwrap() = 2;
    let acked = c.flush().is_ok();
    assert!(!c.is_attached());
    let lost = c.stats().lost_blocks;
    let on_medium = block(durable.as_ref(), 0);
    assert!(
        !acked || lost > 0 || on_medium == fill(0xA1),
        "FLUSH acknowledged, lost_blocks = {lost}, but block 0 on the backing medium is {} (the cache was abandoned)",
        describe(&on_medium)
    );
}

// ---------------------------------------------------------------------------
// Checks that pass: the parts found sound.

/// A FUA write is durable when acknowledged: a crash image taken right after
/// it returns recovers it, in every mode.
#[test]
fn fua_write_survives_a_crash_right_after_it_is_acknowledged_in_every_mode() {
    for mode in [CacheMode::WriteBack, CacheMode::WriteThrough, CacheMode::WriteAround, CacheMode::PassThrough] {
        let backing = Arc::new(MemoryDev::new(64 * BS));
        let cmem = cache_mem(4);
        let c = ElasticCache::new(backing.clone(), CacheConfig { mode, ..cfg() }, clock());
        c.attach(cmem.clone()).unwrap();
        for b in 0..6u64 {
            c.write_at(&fill(b as u8 + 1), b * BS, false).unwrap();
        }
        c.flush().unwrap();
        c.write_at(&fill(0x77), 3 * BS, true).unwrap();
        let r = ElasticCache::open(image(backing.as_ref()), image(cmem.as_ref()), cfg(), clock()).unwrap();
        for b in 0..6u64 {
            let want = if b == 3 { 0x77 } else { b as u8 + 1 };
            assert_eq!(block(&r, b), fill(want), "{mode:?}: block {b}");
        }
    }
}

/// Writers keep rewriting their own blocks (tagged with a sequence number)
/// while the flusher drains flat out and FLUSHes come in: a block written back
/// and then overwritten must not be marked clean. After the writers stop, a
/// full drain must leave every block's last acknowledged version on backing.
#[test]
fn concurrent_rewrites_during_write_back_are_never_marked_clean_wrongly() {
    const WRITERS: u64 = 2;
    const BLOCKS_EACH: u64 = 6;
    const ROUNDS: u32 = 300;
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let c = Arc::new(ElasticCache::new(backing.clone(), CacheConfig { flush_batch: 3, idle_gap: Duration::ZERO, ..cfg() }, clock()));
    // Fewer slots than blocks: eviction and dirty early flushes happen too.
    c.attach(cache_mem(8)).unwrap();
    let flusher = Flusher::spawn(c.clone(), Duration::from_micros(50));
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut last = vec![0u32; BLOCKS_EACH as usize];
                let mut x = 0x9e37_79b9u32 ^ w as u32; // xorshift, seeded per writer
                for round in 1..=ROUNDS {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let i = (x % BLOCKS_EACH as u32) as usize;
                    let b = w * BLOCKS_EACH + i as u64;
                    let mut buf = fill(w as u8);
                    buf[..4].copy_from_slice(&round.to_le_bytes());
                    // Partial and full writes alike.
                    if round % 3 == 0 {
                        c.write_at(&buf[..512], b * BS, false).unwrap();
                    } else {
                        c.write_at(&buf, b * BS, round % 7 == 0).unwrap();
                    }
                    last[i] = round;
                    if round % 50 == 0 {
                        c.flush().unwrap();
                    }
                }
                last
            })
        })
        .collect();
    let lasts: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(flusher);
    c.drain_and_detach().unwrap();
    for (w, last) in lasts.iter().enumerate() {
        for (i, &round) in last.iter().enumerate() {
            if round == 0 {
                continue;
            }
            let b = w as u64 * BLOCKS_EACH + i as u64;
            let got = block(backing.as_ref(), b);
            assert_eq!(u32::from_le_bytes(got[..4].try_into().unwrap()), round, "block {b}: last acknowledged version on backing");
        }
    }
}

/// Phase 2: reads racing bypassing writes and the flusher never see a version
/// older than the last acknowledged write of the block.
#[test]
fn drain_phase_bypass_writes_never_leave_a_stale_copy_readable() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let c = Arc::new(ElasticCache::new(backing.clone(), cfg(), clock()));
    c.attach(cache_mem(8)).unwrap();
    // Some blocks dirty, some clean cached.
    for b in 0..8u64 {
        c.write_at(&fill(1), b * BS, false).unwrap();
    }
    c.flush_step(4).unwrap();
    c.set_phase(Phase::Drain);
    let flusher = Flusher::spawn(c.clone(), Duration::from_micros(50));
    for round in 2..=60u8 {
        for b in 0..8u64 {
            c.write_at(&fill(round), b * BS, false).unwrap();
            let got = block(c.as_ref(), b);
            assert!(got == fill(round), "round {round}, block {b}: read {}", describe(&got));
        }
    }
    drop(flusher);
    c.drain_and_detach().unwrap();
    for b in 0..8u64 {
        assert_eq!(block(backing.as_ref(), b), fill(60));
    }
}

/// Detach is atomic with respect to I/O: writers running across a drain and
/// detach lose nothing, and detach never succeeds with dirty data.
#[test]
fn detach_while_writers_run_loses_nothing() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(64 * BS));
    let c = Arc::new(ElasticCache::new(backing.clone(), cfg(), clock()));
    c.attach(cache_mem(8)).unwrap();
    let writer = std::thread::spawn({
        let c = c.clone();
        move || {
            for round in 1..=400u32 {
                let b = (round % 16) as u64;
                let mut buf = fill(0);
                buf[..4].copy_from_slice(&round.to_le_bytes());
                c.write_at(&buf, b * BS, false).unwrap();
            }
        }
    });
    for _ in 0..3 {
        let dev = c.drain_and_detach().unwrap();
        c.attach(dev).unwrap_or_else(|e| panic!("re-attach: {e}"));
    }
    writer.join().unwrap();
    c.drain_and_detach().unwrap();
    for b in 0..16u64 {
        let want = (1..=400u32).rev().find(|r| (r % 16) as u64 == b).unwrap();
        let got = block(backing.as_ref(), b);
        assert_eq!(u32::from_le_bytes(got[..4].try_into().unwrap()), want, "block {b}");
    }
}

// ---------------------------------------------------------------------------
// Found by the stress test: a bypassing write of a block written back but not
// yet covered by a backing flush.

/// Block 0 is dirty and FLUSHed in the cache. A FLUSH parks in its backing
/// flush; the flusher writes block 0 back (clean, "unsynced": the backing copy
/// is not durable yet) and waits for the commit lock. A write-around write of
/// block 0 follows. The parked backing flush then fails and loses both the
/// write-back and the write. Block 0 must not read older than its last FLUSH
/// (here: the zeroes backing held before the cache).
#[test]
fn a_bypassing_write_of_an_unsynced_block_never_reverts_it_when_the_backing_flush_fails() {
    let medium = Arc::new(MemoryDev::new(64 * BS));
    let volatile = Arc::new(FaultDev::new(medium.clone(), "volatile".parse().unwrap(), clock()));
    let gate = Gated::new(volatile.clone());
    let c = Arc::new(ElasticCache::new(gate.clone(), cfg(), clock()));
    c.attach(cache_mem(8)).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap();
    c.write_at(&fill(0xD1), BS, false).unwrap(); // so the next FLUSH has something to commit
    gate.hold();
    let user_flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1);
    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    wait_until("block 0 is written back", || c.stats().flushed_bytes >= BS);
    c.set_mode(CacheMode::WriteAround);
    c.write_at(&fill(0xA2), 0, false).unwrap();
    volatile.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    gate.open();
    assert!(user_flush.join().unwrap().is_err(), "the parked backing flush failed");
    let _ = flusher.join().unwrap();
    let got = block(c.as_ref(), 0);
    assert!(got == fill(0xA1) || got == fill(0xA2), "block 0 reads {} after the failed flush", describe(&got));
    c.set_mode(CacheMode::WriteBack);
    c.drain_and_detach().unwrap();
    let on_medium = block(medium.as_ref(), 0);
    assert!(on_medium == fill(0xA1) || on_medium == fill(0xA2), "drained block 0 is {}", describe(&on_medium));
}

// ---------------------------------------------------------------------------
// Found by the stress test (cache_stress.rs) in CI: a failed backing flush
// drops the rewrite of a rescued block at once, but the rewrite's supersede of
// the failed device's copy is voided only when the flush returns. A read in
// between returned what backing held before: older than the last FLUSH.

/// Block 0 is FLUSHed in the cache, the cache device vanishes (block 0 is now
/// only there, unreadable), block 0 is rewritten on backing, and a backing
/// flush fails and drops the rewrite, then parks before returning. A read of
/// block 0 meanwhile must return a version at least as new as the FLUSHed one,
/// or EIO; never the zeroes backing held before.
#[test]
fn a_read_racing_the_failed_flush_that_drops_a_rescued_blocks_rewrite_never_sees_older_data() {
    let backing = Arc::new(FaultDev::new(Arc::new(MemoryDev::new(64 * BS)), "volatile".parse().unwrap(), clock()));
    let gate = Gated::new(backing.clone());
    let cdev = Arc::new(FaultDev::new(cache_mem(8), FaultRules::default(), clock()));
    let fences: Arc<dyn FenceStore> = Arc::new(MemoryFences::new());
    let c = Arc::new(ElasticCache::new(gate.clone(), CacheConfig { fences: Some(fences), ..cfg() }, clock()));
    c.attach(cdev.clone()).unwrap();
    c.write_at(&fill(0xA1), 0, false).unwrap();
    c.flush().unwrap();
    cdev.set_rules("vanish_after=0".parse().unwrap());
    let _ = c.write_at(&fill(0x11), BS, false); // the cache fails: fail-over, block 0 unreadable
    assert!(!c.is_attached());
    c.write_at(&fill(0xA2), 0, false).unwrap(); // supersedes the device's copy, on backing
    backing.set_rules("volatile,flush.fail_every=1,flush.fail_loses".parse().unwrap());
    gate.hold_after();
    let flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1); // the rewrite is dropped; the flush has not returned
    let reader = std::thread::spawn({
        let c = c.clone();
        move || {
            let mut buf = fill(0);
            c.read_at(&mut buf, 0).map(|()| buf)
        }
    });
    // A read that does not wait for the flush's outcome finishes now.
    let start = Instant::now();
    while !reader.is_finished() && start.elapsed() < Duration::from_secs(1) {
        std::thread::yield_now();
    }
    gate.open();
    assert!(flush.join().unwrap().is_err(), "the backing flush failed");
    match reader.join().unwrap() {
        Ok(got) => assert!(got == fill(0xA1) || got == fill(0xA2), "block 0 reads {}: older than its last FLUSH", describe(&got)),
        Err(e) => assert!(e.to_string().contains("failed, unreadable cache device"), "unexpected error: {e}"),
    }
}

// ---------------------------------------------------------------------------
// Found by the stress test (cache_stress.rs, seed 4149 of the default range): a
// block written back but not yet covered by a backing flush ("unsynced") and
// then rewritten in the cache is both dirty and unsynced. A commit snapshots it
// as unsynced at its generation; the flusher writes it back again after the
// commit's backing flush ran. The write-back did not change the generation, so
// the commit took its own flush to cover it and marked the block synced: a
// later failed backing flush then dropped the write-back without re-dirtying
// the block, and the cache forgot the only copy of FLUSHed data.

/// Block 0 is written through (unsynced, A on backing) and rewritten in the
/// cache (B, dirty and unsynced). A FLUSH snapshots it and parks after its
/// backing flush; the flusher writes B back; the next backing flush fails and
/// drops B. B was FLUSHed: after the cache drains, backing must hold it.
#[test]
fn a_write_back_after_a_commits_backing_flush_is_not_taken_as_covered_by_it() {
    let backing = Arc::new(FaultDev::new(Arc::new(MemoryDev::new(64 * BS)), "volatile".parse().unwrap(), clock()));
    let gate = Gated::new(backing.clone());
    let c = Arc::new(ElasticCache::new(gate.clone(), cfg(), clock()));
    c.attach(cache_mem(8)).unwrap();
    let mut buf = fill(0);
    c.read_at(&mut buf, 0).unwrap(); // block 0 cached, clean
    c.set_mode(CacheMode::WriteThrough);
    c.write_at(&fill(0xA1), 0, false).unwrap(); // on backing, not yet durable: unsynced
    c.set_mode(CacheMode::WriteBack);
    c.write_at(&fill(0xB2), 0, false).unwrap(); // dirty and still unsynced

    gate.hold_after();
    let user_flush = std::thread::spawn({
        let c = c.clone();
        move || c.flush()
    });
    gate.wait_parked(1); // the FLUSH's backing flush ran (A durable) and has not returned
    let flusher = std::thread::spawn({
        let c = c.clone();
        move || c.flush_step(1)
    });
    wait_until("the flusher wrote block 0 back", || c.stats().dirty_bytes == 0);
    // B is on backing, buffered; the flusher's commit waits for the FLUSH's.
    backing.set_rules("volatile,flush.fail_every=1,flush.fail_loses".parse().unwrap());
    gate.open();
    user_flush.join().unwrap().expect("the FLUSH succeeded (its backing flush ran before the failure was armed)");
    assert!(flusher.join().unwrap().is_err(), "the flusher's backing flush failed and dropped B");
    assert_eq!(backing.stats().lost_bytes, BS, "the failed flush dropped exactly the write-back of B");

    backing.set_rules("volatile".parse().unwrap());
    c.drain_and_detach().unwrap();
    c.read_at(&mut buf, 0).unwrap();
    assert!(buf == fill(0xB2), "block 0 reads {} after the drain; its last FLUSH covered 0xb2", describe(&buf));
}
