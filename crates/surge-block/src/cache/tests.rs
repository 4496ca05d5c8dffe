use super::*;
use crate::clock::VirtualClock;
use crate::conformance::{self, check_all, check_op, op_strategy, pattern, CrashModel, Model, Op};
use crate::crashpoint::{enumerate, AfterDeath, EnumConfig, Power, PowerConfig, Volatile};
use crate::memory::MemoryDev;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const BS: u64 = 4096;

fn cfg(mode: CacheMode) -> CacheConfig {
    CacheConfig { block_size: BS, mode, flush_batch: 4, ..CacheConfig::default() }
}

/// A cache device with room for `slots` data blocks of `BS` (plus metadata).
fn cache_dev(slots: u64) -> Arc<dyn BlockDev> {
    Arc::new(MemoryDev::new(2 * 4096 + slots * BS))
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(VirtualClock::new())
}

fn attached(backing: Arc<dyn BlockDev>, slots: u64, mode: CacheMode) -> ElasticCache {
    let c = ElasticCache::new(backing, cfg(mode), clock());
    c.attach(cache_dev(slots)).unwrap();
    c
}

#[test]
fn layout_of_test_device_has_the_requested_slots() {
    let l = Layout::for_device(cache_dev(8).size(), BS).unwrap();
    assert_eq!(l.nslots, 8);
}

// ---- conformance in every mode ----

fn conformance_in(mode: CacheMode, name: &str) {
    conformance::run(name, |size| Arc::new(attached(Arc::new(MemoryDev::new(size)), 8, mode)));
}

#[test]
fn writeback_cache_passes_conformance() {
    conformance_in(CacheMode::WriteBack, "cache-writeback");
}

#[test]
fn writethrough_cache_passes_conformance() {
    conformance_in(CacheMode::WriteThrough, "cache-writethrough");
}

#[test]
fn writearound_cache_passes_conformance() {
    conformance_in(CacheMode::WriteAround, "cache-writearound");
}

#[test]
fn passthrough_cache_passes_conformance() {
    conformance_in(CacheMode::PassThrough, "cache-passthrough");
}

#[test]
fn drain_phase_cache_passes_conformance() {
    conformance::run("cache-drain", |size| {
        let c = attached(Arc::new(MemoryDev::new(size)), 8, CacheMode::WriteBack);
        c.set_phase(Phase::Drain);
        Arc::new(c)
    });
}

#[test]
fn detached_cache_passes_conformance() {
    conformance::run("cache-none", |size| Arc::new(ElasticCache::new(Arc::new(MemoryDev::new(size)), cfg(CacheMode::WriteBack), clock())));
}

#[test]
fn sequential_bypass_cache_passes_conformance() {
    conformance::run("cache-seq-bypass", |size| {
        let c = ElasticCache::new(Arc::new(MemoryDev::new(size)), CacheConfig { seq_bypass: Some(3 * BS), ..cfg(CacheMode::WriteBack) }, clock());
        c.attach(cache_dev(8)).unwrap();
        Arc::new(c)
    });
}

/// Control actions interleaved with I/O.
#[derive(Debug, Clone)]
enum Ctl {
    Io(Op),
    Attach,
    Detach,
    Phase(Phase),
    Mode(CacheMode),
    FlushStep,
}

fn ctl_strategy(size: u64) -> impl Strategy<Value = Ctl> {
    prop_oneof![
        12 => op_strategy(size).prop_map(Ctl::Io),
        1 => Just(Ctl::Attach),
        1 => Just(Ctl::Detach),
        1 => prop_oneof![Just(Phase::Boost), Just(Phase::Drain)].prop_map(Ctl::Phase),
        1 => prop_oneof![
            Just(CacheMode::WriteBack),
            Just(CacheMode::WriteThrough),
            Just(CacheMode::WriteAround),
            Just(CacheMode::PassThrough)
        ]
        .prop_map(Ctl::Mode),
        2 => Just(Ctl::FlushStep),
    ]
}

fn apply_ctl(c: &ElasticCache, ctl: &Ctl, model: &mut Model, fresh: impl Fn() -> Arc<dyn BlockDev>) -> Result<(), String> {
    match ctl {
        Ctl::Io(op) => check_op(c, model, op)?,
        Ctl::Attach => match c.attach(fresh()) {
            Ok(()) | Err(CacheError::AlreadyAttached) => {}
            Err(e) => return Err(format!("attach: {e}")),
        },
        Ctl::Detach => match c.detach() {
            Ok(_) | Err(CacheError::NotAttached) => {}
            Err(CacheError::NotClean { .. }) => {
                c.drain_and_detach().map_err(|e| format!("drain+detach: {e}"))?;
                if c.stats().attached {
                    return Err("still attached after drain_and_detach".into());
                }
            }
            Err(e) => return Err(format!("detach: {e}")),
        },
        Ctl::Phase(p) => c.set_phase(*p),
        Ctl::Mode(m) => c.set_mode(*m),
        Ctl::FlushStep => {
            c.flush_step(3).map_err(|e| format!("flush step: {e}"))?;
        }
    }
    Ok(())
}

#[test]
fn cache_conforms_with_attach_detach_phase_and_mode_switches_interleaved() {
    let mut runner = TestRunner::new(Config { cases: conformance::cases() * 2, failure_persistence: None, ..Config::default() });
    let strat = prop_oneof![Just(4096u64 * 3), Just(256 * 1024), 1u64..200_000]
        .prop_flat_map(|size| (Just(size), proptest::collection::vec(ctl_strategy(size), 1..80)));
    runner
        .run(&strat, |(size, ctls)| {
            let c = ElasticCache::new(Arc::new(MemoryDev::new(size)), cfg(CacheMode::WriteBack), clock());
            let mut model = Model::new(size);
            for ctl in &ctls {
                apply_ctl(&c, ctl, &mut model, || cache_dev(6)).map_err(TestCaseError::fail)?;
            }
            check_all(&c, &model).map_err(TestCaseError::fail)?;
            // Draining and detaching must not change what is read.
            if c.is_attached() {
                c.drain_and_detach().map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            check_all(&c, &model).map_err(TestCaseError::fail)?;
            check_all(c.backing().as_ref(), &model).map_err(|e| TestCaseError::fail(format!("backing after drain: {e}")))?;
            Ok(())
        })
        .unwrap();
}

// ---- crash and restart at random points ----

fn read_all(dev: &dyn BlockDev) -> Vec<u8> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read_at(&mut buf, 0).unwrap();
    buf
}

fn io_op(c: &ElasticCache, op: &Op) -> bool {
    let mut m = Model::new(c.size());
    check_op(c, &mut m, op).is_ok()
}

#[test]
fn crash_at_a_random_point_loses_nothing_flushed_and_recovers_exact_dirty_set() {
    let mut runner = TestRunner::new(Config { cases: conformance::cases() * 4, failure_persistence: None, ..Config::default() });
    let strat = (prop_oneof![Just(4096u64 * 5), 20_000u64..150_000], 1u64..400, any::<u64>())
        .prop_flat_map(|(size, crash_at, seed)| (Just(size), Just(crash_at), Just(seed), proptest::collection::vec(ctl_strategy(size), 1..70)));
    let recovered_dirty = std::cell::Cell::new(0u32);
    runner
        .run(&strat, |(size, crash_at, seed, ctls)| {
            let (back_raw, cache_raw): (Arc<dyn BlockDev>, Arc<dyn BlockDev>) = (Arc::new(MemoryDev::new(size)), cache_dev(6));
            let power = Power::new(PowerConfig { crash_at: Some(crash_at), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
            let (back, cdev) = (power.wrap(back_raw.clone(), true), power.wrap(cache_raw.clone(), true));
            let c = ElasticCache::new(back, cfg(CacheMode::WriteBack), clock());
            let attached = c.attach(cdev.clone()).is_ok();
            let mut model = CrashModel::new(size);
            for ctl in ctls.iter().filter(|_| attached) {
                let ok = match ctl {
                    Ctl::Io(op) => {
                        let ok = io_op(&c, op);
                        if ok {
                            model.acked(op);
                        } else {
                            model.maybe(op);
                        }
                        ok
                    }
                    // The same device is re-attached, so a restart knows where to look.
                    Ctl::Attach => !matches!(c.attach(cdev.clone()), Err(CacheError::Block(_))),
                    Ctl::Detach => !matches!(c.detach(), Err(CacheError::Block(_))),
                    other => {
                        let mut m = Model::new(size);
                        apply_ctl(&c, other, &mut m, || cdev.clone()).is_ok()
                    }
                };
                if !ok || power.is_dead() {
                    break;
                }
            }
            drop(c);
            power.cut();
            // Restart on the raw media.
            let r = ElasticCache::open(back_raw.clone(), cache_raw.clone(), cfg(CacheMode::WriteBack), clock())
                .map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
            if r.stats().dirty_bytes > 0 {
                recovered_dirty.set(recovered_dirty.get() + 1);
            }
            let got = read_all(&r);
            model.check(&got).map_err(|e| TestCaseError::fail(format!("after restart: {e}")))?;
            // Recovery resumes draining; the drained backing must read the same.
            r.drain_and_detach().map_err(|e| TestCaseError::fail(format!("drain after restart: {e}")))?;
            prop_assert_eq!(read_all(back_raw.as_ref()), got, "draining after restart changed the data");
            Ok(())
        })
        .unwrap();
    assert!(recovered_dirty.get() > 0, "no case crashed with dirty blocks to recover");
}

// ---- Open-CAS style: crash at every N-th metadata/device event ----

struct Fixture {
    backing: Arc<dyn BlockDev>,
    cache: Arc<dyn BlockDev>,
    /// Expected content after the preparation (all of it flushed).
    flushed: Vec<u8>,
}

const FSIZE: u64 = 16 * BS;

/// Backing + cache with dirty blocks 0..5 (4 of them flushed by FLUSH, one
/// written after it), all in a known state.
fn prepare() -> Fixture {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(FSIZE));
    backing.write_at(&pattern(9, 0, FSIZE), 0, false).unwrap();
    let cache = cache_dev(8);
    let c = ElasticCache::new(backing.clone(), cfg(CacheMode::WriteBack), clock());
    c.attach(cache.clone()).unwrap();
    for b in 0..4 {
        c.write_at(&pattern(b as u8 + 1, b * BS, BS), b * BS, false).unwrap();
    }
    c.write_at(&pattern(77, 9 * BS + 100, 1000), 9 * BS + 100, false).unwrap();
    c.flush().unwrap();
    let flushed = read_all(&c);
    assert_eq!(c.stats().dirty_bytes, 5 * BS);
    Fixture { backing, cache, flushed }
}

fn reopen(f: &Fixture) -> Result<ElasticCache, String> {
    ElasticCache::open(f.backing.clone(), f.cache.clone(), cfg(CacheMode::WriteBack), clock()).map_err(|e| format!("reopen: {e}"))
}

fn verify_data(f: &Fixture, extra: Option<&[u8]>) -> Result<(), String> {
    let r = reopen(f)?;
    let got = read_all(&r);
    if got != f.flushed && extra.is_none_or(|e| got != e) {
        let at = got.iter().zip(&f.flushed).position(|(a, b)| a != b).unwrap();
        return Err(format!("data differs from the flushed state at byte {at}"));
    }
    r.drain_and_detach().map_err(|e| format!("drain: {e}"))?;
    if read_all(f.backing.as_ref()) != got {
        return Err("drain after restart changed data".into());
    }
    Ok(())
}

fn ecfg() -> EnumConfig {
    EnumConfig { volatile: Volatile::RandomSectors, variants: 3, ..EnumConfig::default() }
}

#[test]
fn crash_at_every_event_of_a_flush_step_keeps_data_and_dirty_set() {
    let report = enumerate(
        &ecfg(),
        prepare,
        |f, power| {
            let c = ElasticCache::open(power.wrap(f.backing.clone(), true), power.wrap(f.cache.clone(), true), cfg(CacheMode::WriteBack), clock()).unwrap();
            let before = c.stats().dirty_bytes;
            let _ = c.flush_step(2);
            (before, c.stats().dirty_bytes)
        },
        |f, point, (before, after)| {
            if point.n > point.total && after + 2 * BS != before {
                return Err(format!("flush step flushed {} bytes, expected 2 blocks", before - after));
            }
            // The dirty set on restart is the old or the new one, never "everything".
            let r = reopen(f)?;
            let dirty = r.stats().dirty_bytes;
            if dirty != before && dirty != before - 2 * BS {
                return Err(format!("restart found {dirty} dirty bytes, expected {before} or {}", before - 2 * BS));
            }
            drop(r);
            verify_data(f, None)
        },
    )
    .unwrap();
    assert!(report.events >= 4, "a flush step writes data, flushes, writes metadata: {report:?}");
}

#[test]
fn crash_at_every_event_of_a_full_drain_and_detach_keeps_data() {
    let report = enumerate(
        &ecfg(),
        prepare,
        |f, power| {
            let c = ElasticCache::open(power.wrap(f.backing.clone(), true), power.wrap(f.cache.clone(), true), cfg(CacheMode::WriteBack), clock()).unwrap();
            c.drain_and_detach().is_ok()
        },
        |f, point, detached| {
            if point.after_return() && !detached {
                return Err("drain_and_detach failed without a crash".into());
            }
            if point.after_return() && reopen(f)?.stats().dirty_bytes != 0 {
                return Err("detached cache still lists dirty blocks".into());
            }
            verify_data(f, None)
        },
    )
    .unwrap();
    assert!(report.events > 10);
}

#[test]
fn crash_at_every_event_of_attach_leaves_a_usable_empty_or_valid_cache() {
    let report = enumerate(
        &ecfg(),
        || {
            let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(FSIZE));
            backing.write_at(&pattern(3, 0, FSIZE), 0, false).unwrap();
            backing.flush().unwrap();
            let flushed = read_all(backing.as_ref());
            Fixture { backing, cache: cache_dev(8), flushed }
        },
        |f, power| {
            let c = ElasticCache::new(power.wrap(f.backing.clone(), true), cfg(CacheMode::WriteBack), clock());
            c.attach(power.wrap(f.cache.clone(), true)).is_ok()
        },
        |f, _point, _ok| {
            let r = reopen(f)?;
            if r.stats().dirty_bytes != 0 {
                return Err("a fresh cache recovered dirty blocks".into());
            }
            drop(r);
            verify_data(f, None)
        },
    )
    .unwrap();
    assert_eq!(report.events, 4, "attach writes and flushes two metadata copies");
}

#[test]
fn crash_at_every_event_of_writes_then_flush_keeps_all_flushed_data() {
    // The new writes + FLUSH: after an acknowledged FLUSH they must survive.
    let expect_new = std::cell::RefCell::new(None::<Vec<u8>>);
    let report = enumerate(
        &EnumConfig { after: AfterDeath::Fail, ..ecfg() },
        prepare,
        |f, power| {
            let c = ElasticCache::open(power.wrap(f.backing.clone(), true), power.wrap(f.cache.clone(), true), cfg(CacheMode::WriteBack), clock()).unwrap();
            let ok = (|| {
                c.write_at(&pattern(50, 2 * BS + 10, 3 * BS), 2 * BS + 10, false)?;
                c.write_at(&pattern(51, 12 * BS, 2 * BS), 12 * BS, false)?;
                c.flush()
            })()
            .is_ok();
            if ok && expect_new.borrow().is_none() {
                *expect_new.borrow_mut() = Some(read_all(&c));
            }
            ok
        },
        |f, point, flushed_ok| {
            let r = reopen(f)?;
            let got = read_all(&r);
            drop(r);
            let new = expect_new.borrow().clone().expect("counting run completes");
            if flushed_ok || point.after_return() {
                if got != new {
                    return Err("acknowledged FLUSH lost data".into());
                }
            } else {
                // Each byte is old or new.
                for (i, g) in got.iter().enumerate() {
                    if *g != f.flushed[i] && *g != new[i] {
                        return Err(format!("byte {i} is neither old nor new"));
                    }
                }
            }
            verify_data(f, Some(&got))
        },
    )
    .unwrap();
    assert!(report.events > 4);
}

// ---- invariants, one per test ----

#[test]
fn bypassing_write_in_drain_phase_must_not_leave_a_stale_cached_copy() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(8 * BS));
    let c = attached(backing.clone(), 4, CacheMode::WriteBack);
    // A clean cached copy of block 1 (read miss fills it).
    let mut buf = vec![0u8; BS as usize];
    c.read_at(&mut buf, BS).unwrap();
    c.read_at(&mut buf, BS).unwrap();
    assert_eq!(c.stats().hits, 1);
    c.set_phase(Phase::Drain);
    c.write_at(&[7u8; 100], BS + 5, false).unwrap();
    c.read_at(&mut buf, BS).unwrap();
    assert_eq!(&buf[5..105], &[7u8; 100][..]);
    assert_eq!(backing_byte(&backing, BS + 5), 7, "the write went to backing");
}

fn backing_byte(b: &Arc<dyn BlockDev>, at: u64) -> u8 {
    let mut x = [0u8];
    b.read_at(&mut x, at).unwrap();
    x[0]
}

#[test]
fn bypassing_write_to_a_dirty_block_updates_the_cached_copy() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(8 * BS));
    let c = attached(backing.clone(), 4, CacheMode::WriteBack);
    c.write_at(&[1u8; 4096], 0, false).unwrap();
    c.set_phase(Phase::Drain);
    c.write_at(&[2u8; 10], 0, false).unwrap();
    let mut buf = vec![0u8; 20];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..10], &[2u8; 10]);
    assert_eq!(&buf[10..], &[1u8; 10]);
    c.drain_and_detach().unwrap();
    backing.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..10], &[2u8; 10]);
}

#[test]
fn writeback_writes_land_in_cache_until_flushed_back() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(8 * BS));
    let c = attached(backing.clone(), 4, CacheMode::WriteBack);
    c.write_at(&[5u8; 8192], 0, false).unwrap();
    assert_eq!(backing_byte(&backing, 0), 0, "not yet on backing");
    assert_eq!(c.stats().dirty_bytes, 2 * BS);
    assert_eq!(c.flush_step(10).unwrap(), 2);
    assert_eq!(backing_byte(&backing, 4096), 5);
    let s = c.stats();
    assert_eq!((s.dirty_bytes, s.flushed_bytes), (0, 2 * BS));
}

#[test]
fn detach_is_refused_while_dirty_and_allowed_when_clean() {
    let c = attached(Arc::new(MemoryDev::new(8 * BS)), 4, CacheMode::WriteBack);
    c.write_at(&[5u8; 100], 0, false).unwrap();
    assert!(matches!(c.detach(), Err(CacheError::NotClean { dirty_bytes }) if dirty_bytes == BS));
    assert!(c.is_attached());
    c.drain_and_detach().unwrap();
    assert!(!c.is_attached());
}

#[test]
fn full_cache_evicts_lru_and_counts_early_evicted_dirty_bytes() {
    let c = attached(Arc::new(MemoryDev::new(64 * BS)), 4, CacheMode::WriteBack);
    for b in 0..10 {
        c.write_at(&pattern(b as u8, b * BS, BS), b * BS, false).unwrap();
    }
    let s = c.stats();
    assert!(s.evicted_dirty_bytes >= 6 * BS, "{s:?}");
    assert!(s.evictions >= 6, "{s:?}");
    assert_eq!(s.used_high_bytes, 4 * BS);
    let mut m = Model::new(64 * BS);
    for b in 0..10 {
        m.apply(&Op::Write { offset: b * BS, len: BS, seed: b as u8, fua: false });
    }
    check_all(&c, &m).unwrap();
}

#[test]
fn restart_recovers_exactly_the_flushed_dirty_blocks() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(16 * BS));
    let cache = cache_dev(8);
    let c = ElasticCache::new(backing.clone(), cfg(CacheMode::WriteBack), clock());
    c.attach(cache.clone()).unwrap();
    for b in [1u64, 3, 5] {
        c.write_at(&[b as u8; 4096], b * BS, false).unwrap();
    }
    c.flush_step(1).unwrap(); // block 1 clean, committed
    c.flush().unwrap();
    drop(c);
    let r = ElasticCache::open(backing, cache, cfg(CacheMode::WriteBack), clock()).unwrap();
    assert_eq!(r.stats().dirty_bytes, 2 * BS, "blocks 3 and 5 only, not everything");
    let mut buf = [0u8; 1];
    r.read_at(&mut buf, 5 * BS).unwrap();
    assert_eq!(buf[0], 5);
}

#[test]
fn attach_refuses_a_device_holding_dirty_data() {
    let cache = cache_dev(8);
    let c = attached(Arc::new(MemoryDev::new(16 * BS)), 8, CacheMode::WriteBack);
    drop(c);
    let c = ElasticCache::new(Arc::new(MemoryDev::new(16 * BS)), cfg(CacheMode::WriteBack), clock());
    c.attach(cache.clone()).unwrap();
    c.write_at(&[1; 10], 0, false).unwrap();
    c.flush().unwrap();
    let other = ElasticCache::new(Arc::new(MemoryDev::new(16 * BS)), cfg(CacheMode::WriteBack), clock());
    assert!(matches!(other.attach(cache), Err(CacheError::HoldsDirtyData(_))));
}

/// A device whose reads and writes fail in a byte range once armed.
struct Failing {
    inner: Arc<dyn BlockDev>,
    bad: Mutex<Option<std::ops::Range<u64>>>,
}

impl Failing {
    fn hit(&self, offset: u64, len: u64) -> Result<()> {
        match &*self.bad.lock() {
            Some(r) if offset < r.end && offset + len > r.start => Err(BlockError::io("test", offset, len, std::io::Error::from_raw_os_error(libc::EIO))),
            _ => Ok(()),
        }
    }
}

impl BlockDev for Failing {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.hit(offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.hit(offset, buf.len() as u64)?;
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

#[test]
fn failing_cache_device_falls_back_saving_readable_dirty_data_and_failing_reads_of_lost_blocks() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(16 * BS));
    let failing = Arc::new(Failing { inner: cache_dev(8), bad: Mutex::new(None) });
    let c = ElasticCache::new(backing.clone(), cfg(CacheMode::WriteBack), clock());
    c.attach(failing.clone()).unwrap();
    for b in 0..4u64 {
        c.write_at(&[b as u8 + 1; 4096], b * BS, false).unwrap();
    }
    // Slot of block 2 is unreadable (slots fill from 0; data starts at 8192).
    let l = Layout::for_device(failing.size(), BS).unwrap();
    let slot2 = l.slot_offset(2);
    *failing.bad.lock() = Some(slot2..slot2 + BS);
    let mut buf = vec![0u8; 4096];
    assert!(c.read_at(&mut buf, 2 * BS).is_err(), "lost data must fail loudly, not read stale");
    assert!(!c.is_attached(), "fell back to backing");
    assert_eq!(c.stats().lost_blocks, 1);
    for b in [0u64, 1, 3] {
        c.read_at(&mut buf, b * BS).unwrap();
        assert_eq!(buf[0], b as u8 + 1, "block {b} saved to backing");
    }
    // A full rewrite makes the block usable again.
    c.write_at(&[9; 4096], 2 * BS, false).unwrap();
    c.read_at(&mut buf, 2 * BS).unwrap();
    assert_eq!(buf[0], 9);
    assert_eq!(c.stats().lost_blocks, 0);
}

#[test]
fn failing_cache_write_falls_back_and_the_write_still_succeeds() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(16 * BS));
    let failing = Arc::new(Failing { inner: cache_dev(8), bad: Mutex::new(None) });
    let c = ElasticCache::new(backing.clone(), cfg(CacheMode::WriteBack), clock());
    c.attach(failing.clone()).unwrap();
    c.write_at(&[3; 4096], 0, false).unwrap();
    *failing.bad.lock() = Some(0..failing.size());
    c.write_at(&[4; 4096], BS, false).unwrap();
    assert!(!c.is_attached());
    let mut buf = [0u8; 1];
    c.read_at(&mut buf, BS).unwrap();
    assert_eq!(buf[0], 4);
    // Block 0's dirty slot was unreadable too: lost, and reported as such.
    assert_eq!(c.stats().lost_blocks, 1);
    assert!(c.read_at(&mut buf, 0).is_err());
}

/// Durability contract: a FLUSH acknowledges everything written before it. A
/// block lost with the cache device (written, acked, then unreadable) makes
/// every FLUSH fail (on every connection) until the user acknowledges the loss.
#[test]
fn every_flush_after_a_block_was_lost_with_the_cache_device_fails_until_acknowledged() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(16 * BS));
    let failing = Arc::new(Failing { inner: cache_dev(8), bad: Mutex::new(None) });
    let c = ElasticCache::new(backing, cfg(CacheMode::WriteBack), clock());
    c.attach(failing.clone()).unwrap();
    c.write_at(&[3; 4096], 0, false).unwrap();
    *failing.bad.lock() = Some(0..failing.size());
    c.write_at(&[4; 4096], BS, false).unwrap(); // falls back; block 0 is lost
    assert_eq!(c.stats().lost_blocks, 1);
    assert!(c.flush().is_err(), "a FLUSH must not be acked after acked data was lost");
    assert!(c.flush().is_err(), "nor a second one");
    c.ack_loss().unwrap();
    c.flush().unwrap();
}

#[test]
fn a_slot_freed_twice_is_on_the_free_list_once() {
    let mut st = State { slots: vec![Slot::default(); 2], ..State::default() };
    st.push_free(1);
    st.push_free(1);
    assert_eq!(st.pop_free(), Some(1));
    assert_eq!(st.pop_free(), None);
}

#[test]
fn concurrent_writers_with_flusher_and_attach_detach_cycles_lose_nothing() {
    let size = 256 * BS;
    let backing: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let c = Arc::new(ElasticCache::new(backing.clone(), CacheConfig { idle_gap: Duration::ZERO, ..cfg(CacheMode::WriteBack) }, clock()));
    c.attach(cache_dev(32)).unwrap();
    let _flusher = Flusher::spawn(c.clone(), Duration::from_millis(1));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                // Thread t owns blocks t, t+4, ...: the last write of each wins.
                for round in 0..30u64 {
                    for b in (t..256).step_by(4).skip((round % 7) as usize).step_by(3) {
                        let off = b * BS + (round % 5) * 100;
                        c.write_at(&pattern((round + t) as u8, off, 700), off, false).unwrap();
                        let mut buf = vec![0u8; 700];
                        c.read_at(&mut buf, off).unwrap();
                        assert_eq!(buf, pattern((round + t) as u8, off, 700), "read after write");
                    }
                }
            })
        })
        .collect();
    for i in 0..20 {
        if i % 2 == 0 {
            c.drain_and_detach().unwrap();
        } else {
            c.attach(cache_dev(32)).unwrap();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let before = read_all(c.as_ref());
    if c.is_attached() {
        c.drain_and_detach().unwrap();
    }
    assert_eq!(read_all(backing.as_ref()), before);
}

#[test]
fn phase_one_flusher_waits_for_idle_time() {
    let vc = Arc::new(VirtualClock::new());
    let c = ElasticCache::new(Arc::new(MemoryDev::new(8 * BS)), CacheConfig { idle_gap: Duration::from_secs(1), ..cfg(CacheMode::WriteBack) }, vc.clone());
    c.attach(cache_dev(4)).unwrap();
    vc.advance(Duration::from_secs(5));
    c.write_at(&[1; 10], 0, false).unwrap();
    assert!(c.idle_for() < Duration::from_secs(1));
    vc.advance(Duration::from_millis(1500));
    assert!(c.idle_for() >= Duration::from_secs(1));
}

#[test]
fn drain_eta_follows_measured_flush_rate() {
    let vc = Arc::new(VirtualClock::new());
    let c = ElasticCache::new(Arc::new(Slow { inner: MemoryDev::new(64 * BS), clock: vc.clone() }), cfg(CacheMode::WriteBack), vc.clone());
    c.attach(cache_dev(32)).unwrap();
    c.write_at(&vec![1; 16 * BS as usize], 0, false).unwrap();
    c.flush_step(4).unwrap(); // 4 blocks at 1 block per 10 ms
    let eta = c.stats().drain_eta_s.unwrap();
    assert!((eta - 0.12).abs() < 0.01, "12 blocks left at 100 blocks/s: {eta}");
}

/// Backing that advances virtual time by 10 ms per write.
struct Slow {
    inner: MemoryDev,
    clock: Arc<VirtualClock>,
}

impl BlockDev for Slow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.clock.advance(Duration::from_millis(10));
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// The burstable paper's single gp2 cache (issue 40 item 8): a write-through
/// cache of 32 KiB blocks on a 100 GiB gp2 at its 300 IOPS baseline. The
/// blocks of a 1 MiB request filled alone land in adjacent slots, so EBS's
/// merging charges their 32 writes, and later their 32 reads, as 4
/// operations each (75 MiB/s at 300 IOPS); blocks in scattered slots (filled
/// interleaved with another request's) are one operation each (9.4 MiB/s).
#[test]
fn blocks_of_one_request_fill_adjacent_slots_that_gp2_merges() {
    use crate::model::{ModelDev, VolumeModel, GIB, KIB, MIB};
    let clock = Arc::new(VirtualClock::new());
    let gp2 = Arc::new(ModelDev::new(Arc::new(MemoryDev::new(64 * MIB)), clock.clone(), VolumeModel::Gp2.shape(100 * GIB).unwrap()));
    let c = ElasticCache::new(Arc::new(MemoryDev::new(256 * MIB)), CacheConfig { block_size: 32 * KIB, mode: CacheMode::WriteThrough, ..CacheConfig::default() }, clock.clone());
    c.attach(gp2.clone()).unwrap();
    // Operations a step costs, from its time with the bucket empty (300/s).
    let ops = |step: &dyn Fn()| {
        gp2.set_credits(Some(0), None);
        let t0 = clock.now();
        step();
        ((clock.now() - t0).as_nanos() * 300 / 1_000_000_000) as u64
    };
    let mut buf = vec![0u8; MIB as usize];
    assert_eq!(ops(&|| c.read_at(&mut vec![0u8; MIB as usize], 0).unwrap()), 4, "32 fills in adjacent slots: 4 operations");
    assert_eq!(ops(&|| c.read_at(&mut vec![0u8; MIB as usize], 0).unwrap()), 4, "32 hits in adjacent slots: 4 operations");
    // Two requests' blocks filled in turn: every other slot.
    for b in 0..32u64 {
        for base in [8 * MIB, 16 * MIB] {
            c.read_at(&mut buf[..32 * KIB as usize], base + b * 32 * KIB).unwrap();
        }
    }
    assert_eq!(ops(&|| c.read_at(&mut vec![0u8; MIB as usize], 8 * MIB).unwrap()), 32, "32 hits in scattered slots: 32 operations");
    assert_eq!(c.stats().misses, 32 + 64);
}
