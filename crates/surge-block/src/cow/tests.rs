use super::*;
use crate::clock::{Clock, VirtualClock};
use crate::conformance::{self, check_all, check_op, op_strategy, pattern, CrashModel, Model, Op};
use crate::crashpoint::{enumerate, EnumConfig, Power, PowerConfig, Volatile};
use crate::memory::MemoryDev;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};

const G: u64 = 4096;

/// Base contents: never zero, so a zero read where base data belongs shows.
fn base_bytes(size: u64) -> Vec<u8> {
    pattern(0xB5, 0, size)
}

fn base_dev(contents: &[u8]) -> Arc<dyn BlockDev> {
    let d = MemoryDev::new(contents.len() as u64);
    d.write_at(contents, 0, false).unwrap();
    Arc::new(d)
}

fn overlay_for(size: u64, cfg: &CowConfig) -> Arc<dyn BlockDev> {
    Arc::new(MemoryDev::new(CowDev::overlay_size_for(size, cfg)))
}

fn cfg(granularity: u64, copy_on_read: bool) -> CowConfig {
    CowConfig { granularity, copy_on_read, ..CowConfig::default() }
}

fn read(dev: &dyn BlockDev, off: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    dev.read_at(&mut b, off).unwrap();
    b
}

fn read_all(dev: &dyn BlockDev) -> Vec<u8> {
    read(dev, 0, dev.size())
}

// ---- the shared conformance suite ----

#[test]
fn cow_passes_conformance_over_a_base_with_data() {
    for g in [512, G] {
        conformance::run_with_contents(&format!("cow-{g}"), base_bytes, |size, contents| {
            let c = cfg(g, false);
            Arc::new(CowDev::create(base_dev(contents), overlay_for(size, &c), &c).unwrap())
        });
    }
}

#[test]
fn cow_with_copy_on_read_passes_conformance() {
    conformance::run_with_contents("cow-cor", base_bytes, |size, contents| {
        let c = cfg(G, true);
        Arc::new(CowDev::create(base_dev(contents), overlay_for(size, &c), &c).unwrap())
    });
}

/// A CoW volume with a stream job copying underneath every request.
struct Streaming {
    dev: Arc<CowDev>,
    _job: StreamJob,
}

impl BlockDev for Streaming {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn caps(&self) -> Caps {
        self.dev.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.dev.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.dev.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.dev.block_status(offset, len)
    }
}

/// A base that yields the CPU on every read, so the stream job and the
/// requests interleave at many points.
struct SlowBase(Arc<dyn BlockDev>);

impl BlockDev for SlowBase {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        std::thread::yield_now();
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> Result<()> {
        Err(BlockError::ReadOnly)
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

#[test]
fn cow_passes_conformance_with_a_stream_job_running_during_writes() {
    for cor in [false, true] {
        conformance::run_with_contents("cow-streaming", base_bytes, |size, contents| {
            let c = cfg(512, cor);
            let base = Arc::new(SlowBase(base_dev(contents)));
            let dev = Arc::new(CowDev::create(base, overlay_for(size, &c), &c).unwrap());
            let sc = StreamConfig { chunk: 1024, commit_every: 4096, detach_base: false, ..StreamConfig::default() };
            let job = StreamJob::start(dev.clone(), sc, Arc::new(crate::SystemClock::new()));
            Arc::new(Streaming { dev, _job: job })
        });
    }
}

// ---- restart and crash ----

fn ctl_ops(size: u64) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op_strategy(size), 1..50)
}

#[test]
fn flushed_state_survives_a_clean_restart() {
    let mut runner = TestRunner::new(Config { cases: conformance::cases(), failure_persistence: None, ..Config::default() });
    let strat = prop_oneof![Just(G * 9), 20_000u64..120_000].prop_flat_map(|size| (Just(size), ctl_ops(size), any::<bool>()));
    runner
        .run(&strat, |(size, ops, cor)| {
            let contents = base_bytes(size);
            let base = base_dev(&contents);
            let c = CowConfig { journal_len: 2048, ..cfg(512, cor) };
            let overlay = overlay_for(size, &c);
            let dev = CowDev::create(base.clone(), overlay.clone(), &c).unwrap();
            let mut model = Model { bytes: contents.iter().map(|&b| Some(b)).collect() };
            for op in &ops {
                check_op(&dev, &mut model, op).map_err(TestCaseError::fail)?;
            }
            dev.flush().unwrap();
            let before = read_all(&dev);
            drop(dev);
            let r = CowDev::open(Some(base), overlay, &c).map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
            prop_assert_eq!(read_all(&r), before);
            check_all(&r, &model).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}

/// A base with holes: every other 64 KiB stays unwritten (MemoryDev reports
/// it as a hole, so the overlay learns it as `Zero` and writes there commit
/// with one flush).
fn holey_bytes(size: u64) -> Vec<u8> {
    let mut b = base_bytes(size);
    for (i, chunk) in b.chunks_mut(64 << 10).enumerate() {
        if i % 2 == 1 {
            chunk.fill(0);
        }
    }
    b
}

fn holey_dev(contents: &[u8]) -> Arc<dyn BlockDev> {
    let d = MemoryDev::new(contents.len() as u64);
    for (i, chunk) in contents.chunks(64 << 10).enumerate() {
        if i % 2 == 0 {
            d.write_at(chunk, (i as u64) << 16, false).unwrap();
        }
    }
    Arc::new(d)
}

/// Run `ops` on the volume in `raw` under a power domain that fails at event
/// `crash_at`, then cut; returns the crash model of what may be read after.
fn run_until_crash(base: &Arc<dyn BlockDev>, raw: &Arc<dyn BlockDev>, c: &CowConfig, before: Vec<u8>, ops: &[Op], crash_at: u64, seed: u64) -> (CrashModel, bool) {
    let size = before.len() as u64;
    let power = Power::new(PowerConfig { crash_at: Some(crash_at), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let mut model = CrashModel::with_contents(&before, false);
    // Opening writes too (it clears the data area of zero blocks): it may be
    // where the power fails.
    let Ok(dev) = CowDev::open(Some(base.clone()), power.wrap(raw.clone(), true), c) else {
        power.cut();
        return (model, true);
    };
    for op in ops {
        let mut m = Model { bytes: vec![Some(0); size as usize] };
        if check_op(&dev, &mut m, op).is_ok() || matches!(op, Op::Read { .. }) {
            model.acked(op);
        } else {
            model.maybe(op);
        }
        if power.is_dead() {
            break;
        }
    }
    drop(dev);
    let crashed = power.is_dead();
    power.cut();
    (model, crashed)
}

#[test]
fn crash_at_a_random_point_keeps_every_flushed_byte() {
    // Two lives: ops, crash, reopen, check; more ops, crash, reopen, check
    // (what a crash left in the overlay must not show through later).
    let mut runner = TestRunner::new(Config { cases: conformance::cases() * 4, failure_persistence: None, ..Config::default() });
    let strat = (prop_oneof![Just(G * 40), 150_000u64..400_000], 1u64..200, 1u64..200, any::<u64>(), any::<bool>(), any::<bool>())
        .prop_flat_map(|(size, c1, c2, seed, cor, holes)| (Just(size), Just(c1), Just(c2), Just(seed), Just(cor), Just(holes), ctl_ops(size), ctl_ops(size)));
    let crashed = AtomicUsize::new(0);
    runner
        .run(&strat, |(size, c1, c2, seed, cor, holes, ops1, ops2)| {
            let contents = if holes { holey_bytes(size) } else { base_bytes(size) };
            let base = if holes { holey_dev(&contents) } else { base_dev(&contents) };
            // A small journal, so checkpoints happen too.
            let c = CowConfig { journal_len: 2048, ..cfg(512, cor) };
            let raw = overlay_for(size, &c);
            CowDev::create(base.clone(), raw.clone(), &c).unwrap();
            let mut before = contents.clone();
            for (round, (ops, crash_at)) in [(&ops1, c1), (&ops2, c2)].into_iter().enumerate() {
                let (model, died) = run_until_crash(&base, &raw, &c, before, ops, crash_at, seed ^ round as u64);
                if died {
                    crashed.fetch_add(1, Ordering::Relaxed);
                }
                let r = CowDev::open(Some(base.clone()), raw.clone(), &c).map_err(|e| TestCaseError::fail(format!("reopen {round}: {e}")))?;
                before = read_all(&r);
                model.check(&before).map_err(|e| TestCaseError::fail(format!("after restart {round}: {e}")))?;
            }
            Ok(())
        })
        .unwrap();
    assert!(crashed.load(Ordering::Relaxed) > 0, "no case crashed mid-sequence");
}

#[test]
fn a_write_into_a_base_hole_commits_with_one_flush_and_survives_every_crash_point() {
    let size = 64 * G;
    let contents = holey_bytes(size);
    let base = holey_dev(&contents);
    let c = cfg(G, false);
    let report = enumerate(
        &EnumConfig { volatile: Volatile::RandomSectors, variants: 8, ..EnumConfig::default() },
        || {
            let raw = overlay_for(size, &c);
            CowDev::create(base.clone(), raw.clone(), &c).unwrap();
            raw
        },
        |raw, power| {
            let Ok(d) = CowDev::open(Some(base.clone()), power.wrap(raw.clone(), true), &c) else { return false };
            assert_eq!(d.state_at(16 * G), State::Zero, "the hole was learned");
            d.write_at(&[0x5a; 5000], 16 * G + 100, false).is_ok() && d.flush().is_ok()
        },
        |raw, _, acked| {
            let r = CowDev::open(Some(base.clone()), raw.clone(), &c).map_err(|e| format!("reopen: {e}"))?;
            let got = read(&r, 16 * G, 2 * G);
            let mut after = vec![0u8; 2 * G as usize];
            after[100..5100].fill(0x5a);
            let ok = got == after || (!acked && got.iter().all(|&b| b == 0 || b == 0x5a));
            if ok && read(&r, 0, 16 * G) == contents[..16 * G as usize] {
                Ok(())
            } else {
                Err(format!("acked={acked}: the hole reads {:?}...", &got[..8]))
            }
        },
    )
    .unwrap();
    // Opening clears the zero blocks' data areas and flushes; then come the
    // data write, the journal record and one flush.
    let opening = Power::new(PowerConfig::default());
    let raw = overlay_for(size, &c);
    CowDev::create(base.clone(), raw.clone(), &c).unwrap();
    CowDev::open(Some(base.clone()), opening.wrap(raw, true), &c).unwrap();
    assert_eq!(report.events, opening.events() + 3, "one flush per commit: {report:?}");
}

#[test]
fn data_a_crash_left_in_a_zero_block_never_shows_through_a_later_write() {
    let size = 64 * G;
    let contents = holey_bytes(size);
    let base = holey_dev(&contents);
    let c = cfg(G, false);
    let hole = 16 * G; // inside the second 64 KiB: a hole of the base
    // Life 1: a write into the hole reaches the disk, its commit never does.
    let life1 = || {
        let raw = overlay_for(size, &c);
        let d = CowDev::create(base.clone(), raw.clone(), &c).unwrap();
        d.write_at(&[0xAA; G as usize], hole, false).unwrap();
        raw
    };
    let counting = Power::new(PowerConfig::default());
    CowDev::open(Some(base.clone()), counting.wrap(life1(), true), &c).unwrap();
    let opening = counting.events();
    let mut seen = std::collections::HashSet::new();
    for seed in 0..48 {
        // Life 2: a partial write to the same block, then a flush during which
        // the power fails (event: data write +1, journal record +2, flush +3);
        // each unflushed write survives or not.
        let raw = life1();
        let power = Power::new(PowerConfig { crash_at: Some(opening + 3), volatile: Volatile::RandomWrites, seed, ..PowerConfig::default() });
        let d = CowDev::open(Some(base.clone()), power.wrap(raw.clone(), true), &c).unwrap();
        assert_eq!(read(&d, hole, G), vec![0; G as usize], "life 1's write was never committed");
        d.write_at(&[0xBB; 100], hole + 10, false).unwrap();
        assert!(d.flush().is_err(), "the power fails at the flush");
        drop(d);
        let r = CowDev::open(Some(base.clone()), raw, &c).unwrap();
        let got = read(&r, hole, G);
        assert!(got.iter().all(|&b| b == 0 || b == 0xBB), "seed {seed}: life 1's data came back");
        seen.insert((r.state_at(hole), got[10]));
    }
    assert!(seen.contains(&(State::Data, 0)), "some seed kept the record but not the data: {seen:?}");
}

/// Every crash point of one operation (plus its flush), Open-CAS style.
fn every_crash_point(name: &str, size: u64, prep: impl Fn(&CowDev), op: impl Fn(&CowDev) -> bool, expect: impl Fn(&[u8], &[u8], bool) -> Result<(), String>) {
    let contents = base_bytes(size);
    let base = base_dev(&contents);
    let c = CowConfig { journal_len: 2048, ..cfg(G, false) };
    let report = enumerate(
        &EnumConfig { volatile: Volatile::RandomSectors, variants: 3, ..EnumConfig::default() },
        || {
            let raw = overlay_for(size, &c);
            let d = CowDev::create(base.clone(), raw.clone(), &c).unwrap();
            prep(&d);
            d.flush().unwrap();
            let before = read_all(&d);
            (raw, before)
        },
        |(raw, _), power| {
            let Ok(d) = CowDev::open(Some(base.clone()), power.wrap(raw.clone(), true), &c) else { return false };
            op(&d)
        },
        |(raw, before), _, acked| {
            let r = CowDev::open(Some(base.clone()), raw.clone(), &c).map_err(|e| format!("reopen: {e}"))?;
            expect(before, &read_all(&r), acked)
        },
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(report.events >= 3, "{name}: {report:?}");
}

#[test]
fn partial_write_never_loses_the_base_bytes_around_it() {
    // Live, after a clean restart, and at every crash point of write + flush.
    let size = 8 * G;
    let contents = base_bytes(size);
    let base = base_dev(&contents);
    let c = cfg(G, false);
    let overlay = overlay_for(size, &c);
    let d = CowDev::create(base.clone(), overlay.clone(), &c).unwrap();
    d.write_at(&[0xEE; 100], G + 1000, false).unwrap();
    d.write_at(&[0xDD; 10], 3 * G - 5, false).unwrap(); // across a block edge
    let mut want = contents.clone();
    want[(G + 1000) as usize..(G + 1100) as usize].fill(0xEE);
    want[(3 * G - 5) as usize..(3 * G + 5) as usize].fill(0xDD);
    assert_eq!(read_all(&d), want);
    assert_eq!(d.stats().fill_bytes, 3 * G, "each partly written block is filled from the base once");
    assert_eq!(d.state_at(G), State::Data);
    d.flush().unwrap();
    drop(d);
    let r = CowDev::open(Some(base), overlay, &c).unwrap();
    assert_eq!(read_all(&r), want);
    let r0 = r.stats().fill_bytes;
    r.write_at(&[0xCC; 10], G + 2000, false).unwrap();
    assert_eq!(r.stats().fill_bytes, r0, "an allocated block is never filled again");

    every_crash_point(
        "partial write",
        size,
        |_| {},
        |d| d.write_at(&[0xEE; 100], G + 1000, false).is_ok() && d.flush().is_ok(),
        |before, got, acked| {
            let mut after = before.to_vec();
            after[(G + 1000) as usize..(G + 1100) as usize].fill(0xEE);
            if got == after || (!acked && got == before) {
                Ok(())
            } else {
                let at = got.iter().zip(&after).position(|(a, b)| a != b).unwrap_or(0);
                Err(format!("acked={acked}: byte {at} is {:#x}, want {:#x} (base {:#x})", got[at], after[at], before[at]))
            }
        },
    );
}

#[test]
fn base_data_never_reappears_after_discard_or_zero() {
    let size = 16 * G;
    let contents = base_bytes(size);
    let base = base_dev(&contents);
    let c = cfg(G, false);
    let overlay = overlay_for(size, &c);
    let d = CowDev::create(base.clone(), overlay.clone(), &c).unwrap();
    d.discard(2 * G, 3 * G).unwrap();
    d.write_zeroes(8 * G + 100, 2 * G, ZeroMode { may_trim: true, fast_only: false }).unwrap();
    // A block written, then discarded: neither its data nor the base's returns.
    d.write_at(&[0x11; G as usize], 12 * G, false).unwrap();
    d.discard(12 * G, G).unwrap();
    let check = |dev: &dyn BlockDev| {
        assert_eq!(read(dev, 2 * G, 3 * G), vec![0; 3 * G as usize], "discarded blocks read zero, not base data");
        assert_eq!(read(dev, 8 * G + 100, 2 * G), vec![0; 2 * G as usize]);
        assert_eq!(read(dev, 12 * G, G), vec![0; G as usize]);
        assert_eq!(read(dev, 8 * G, 100), contents[8 * G as usize..(8 * G + 100) as usize], "bytes beside a zeroed range keep the base");
    };
    check(&d);
    d.flush().unwrap();
    drop(d);
    let r = CowDev::open(Some(base), overlay, &c).unwrap();
    check(&r);
    // Streaming must not bring the base back either.
    while r.stream_step(0, 1 << 20).unwrap().is_some() {}
    check(&r);
    assert!(r.is_independent());

    every_crash_point(
        "zeroes",
        size,
        |_| {},
        |d| d.write_zeroes(2 * G, 3 * G, ZeroMode::default()).is_ok() && d.flush().is_ok(),
        |before, got, acked| {
            let mut after = before.to_vec();
            after[2 * G as usize..5 * G as usize].fill(0);
            if got == after || (!acked && got == before) {
                Ok(())
            } else {
                Err(format!("acked={acked}: neither the zeroed nor the old contents"))
            }
        },
    );
}

/// A base whose reads run a hook first (to write to the volume while a copy
/// from the base is in flight).
struct HookedBase {
    inner: Arc<dyn BlockDev>,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl BlockDev for HookedBase {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        let hook = self.hook.lock().take();
        if let Some(h) = hook {
            h();
        }
        Ok(())
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> Result<()> {
        Err(BlockError::ReadOnly)
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

fn hooked(size: u64, cor: bool) -> (Arc<HookedBase>, Arc<CowDev>, Vec<u8>) {
    let contents = base_bytes(size);
    let base = Arc::new(HookedBase { inner: base_dev(&contents), hook: Mutex::new(None) });
    let c = cfg(G, cor);
    let dev = Arc::new(CowDev::create(base.clone(), overlay_for(size, &c), &c).unwrap());
    (base, dev, contents)
}

#[test]
fn stream_job_never_overwrites_a_newer_write() {
    let size = 64 * G;
    let (base, dev, contents) = hooked(size, false);
    // While the stream step has the base data for blocks 0.. in hand, the guest
    // writes block 3 (whole) and part of block 5.
    let d2 = dev.clone();
    *base.hook.lock() = Some(Box::new(move || {
        d2.write_at(&[0x77; G as usize], 3 * G, false).unwrap();
        d2.write_at(&[0x66; 10], 5 * G + 7, false).unwrap();
    }));
    let (_, copied) = dev.stream_step(0, 16 * G).unwrap().unwrap();
    assert_eq!(copied, 14 * G, "the two written blocks are not copied");
    assert_eq!(read(dev.as_ref(), 3 * G, G), vec![0x77; G as usize]);
    let mut want5 = contents[5 * G as usize..6 * G as usize].to_vec();
    want5[7..17].fill(0x66);
    assert_eq!(read(dev.as_ref(), 5 * G, G), want5);

    // The same through the job thread, to completion.
    let (base, dev, _) = hooked(size, false);
    let d2 = dev.clone();
    *base.hook.lock() = Some(Box::new(move || d2.write_at(&[0x55; 3 * G as usize], 40 * G, false).unwrap()));
    let job = StreamJob::start(dev.clone(), StreamConfig { chunk: 64 * G, ..StreamConfig::default() }, Arc::new(crate::SystemClock::new()));
    assert_eq!(job.wait(), StreamState::Done);
    assert_eq!(read(dev.as_ref(), 40 * G, 3 * G), vec![0x55; 3 * G as usize]);
}

#[test]
fn copy_on_read_never_overwrites_a_newer_write() {
    let size = 16 * G;
    let (base, dev, contents) = hooked(size, true);
    let d2 = dev.clone();
    *base.hook.lock() = Some(Box::new(move || d2.write_at(&[0x42; 100], 2 * G + 50, false).unwrap()));
    // The read itself returns base data (it began before the write) ...
    assert_eq!(read(dev.as_ref(), 0, 4 * G), contents[..4 * G as usize]);
    // ... but the copy it made must not cover the write.
    let mut want = contents[2 * G as usize..3 * G as usize].to_vec();
    want[50..150].fill(0x42);
    assert_eq!(read(dev.as_ref(), 2 * G, G), want);
    assert_eq!(dev.stats().copied_bytes, 3 * G, "blocks 0, 1 and 3 were copied on read");
    assert_eq!(dev.state_at(0), State::Data);
}

#[test]
fn stream_job_resumes_after_a_restart_and_then_needs_no_base() {
    let size = 300 * G + 123;
    let contents = base_bytes(size);
    let base = base_dev(&contents);
    let c = cfg(G, false);
    let overlay = overlay_for(size, &c);
    let d = CowDev::create(base.clone(), overlay.clone(), &c).unwrap();
    d.write_at(&[9; 5000], 10 * G, false).unwrap();
    // Copy a third, commit, "crash" (drop without the job finishing).
    let mut from = 0;
    let mut copied = 0;
    while copied < 100 * G {
        let (next, n) = d.stream_step(from, 8 * G).unwrap().unwrap();
        from = next;
        copied += n;
    }
    d.commit().unwrap();
    drop(d);
    let d = Arc::new(CowDev::open(Some(base.clone()), overlay.clone(), &c).unwrap());
    let left = d.base_bytes();
    assert!(left < size - 99 * G, "progress survived the restart: {left} bytes left");
    let clock = Arc::new(VirtualClock::new());
    let job = StreamJob::start(d.clone(), StreamConfig { chunk: 16 * G, ..StreamConfig::default() }, clock);
    assert_eq!(job.wait(), StreamState::Done);
    assert!(!d.has_base(), "the job drops the base when done");
    assert!(d.stats().independent);
    let mut want = contents.clone();
    want[10 * G as usize..10 * G as usize + 5000].fill(9);
    assert_eq!(read_all(d.as_ref()), want);
    drop(d);
    // Reopen with no base at all.
    let r = CowDev::open(None, overlay.clone(), &c).unwrap();
    assert_eq!(read_all(&r), want);
    // A fresh overlay without a base cannot open.
    let fresh = overlay_for(size, &c);
    CowDev::create(base, fresh.clone(), &c).unwrap();
    assert!(matches!(CowDev::open(None, fresh, &c), Err(CowError::NeedsBase(_))));
}

#[test]
fn stream_rate_limit_paces_on_the_clock() {
    let size = 256 * G; // 1 MiB
    let contents = base_bytes(size);
    let c = cfg(G, false);
    let d = Arc::new(CowDev::create(base_dev(&contents), overlay_for(size, &c), &c).unwrap());
    let clock = Arc::new(VirtualClock::new());
    let sc = StreamConfig { rate: Some(256 * 1024), chunk: 64 * 1024, ..StreamConfig::default() };
    let job = StreamJob::start(d.clone(), sc, clock.clone());
    assert_eq!(job.wait(), StreamState::Done);
    // 1 MiB at 256 KiB/s with a 64 KiB burst: 3.75 s of virtual time.
    let t = clock.now().as_secs_f64();
    assert!((3.7..=3.8).contains(&t), "took {t} s");
}

#[test]
fn progress_reports_remaining_bytes_and_an_eta() {
    let size = 64 * G;
    let contents = base_bytes(size);
    let c = cfg(G, false);
    let d = Arc::new(CowDev::create(base_dev(&contents), overlay_for(size, &c), &c).unwrap());
    // 256 KiB at 512 KiB/s: about half a second of wall time.
    let sc = StreamConfig { rate: Some(512 << 10), chunk: 8 * G, detach_base: false, ..StreamConfig::default() };
    let job = StreamJob::start(d.clone(), sc, Arc::new(crate::SystemClock::new()));
    while d.base_bytes() > size / 2 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let p = job.progress();
    assert_eq!(p.total_bytes, size);
    assert!(p.remaining_bytes <= size / 2 && p.fraction() >= 0.5, "{p:?}");
    assert!(p.eta_s.is_some_and(|e| e > 0.0 && e < 10.0), "{p:?}");
    assert_eq!(p.state, StreamState::Running);
    assert_eq!(job.wait(), StreamState::Done);
    assert!(d.has_base(), "detach_base=false keeps the base");
}

#[test]
fn the_stream_job_waits_while_the_guest_reads_the_base() {
    let size = 256 * G;
    // While the job copies its first chunk, the guest reads another part of
    // the base: the job must then pause until 50 ms (virtual) pass without one.
    let (base, d, _) = hooked(size, false);
    let d2 = d.clone();
    *base.hook.lock() = Some(Box::new(move || {
        read(d2.as_ref(), 200 * G, G);
    }));
    let clock = Arc::new(VirtualClock::new());
    let sc = StreamConfig { chunk: 16 * G, yield_to_guest: std::time::Duration::from_millis(50), ..StreamConfig::default() };
    let job = StreamJob::start(d.clone(), sc, clock.clone());
    assert_eq!(job.wait(), StreamState::Done);
    assert_eq!(d.guest_fetches(), 1);
    assert_eq!(clock.now(), std::time::Duration::from_millis(50), "the job paused once for the guest");
    // Without guest reads, no pause.
    let (_, d, _) = hooked(size, false);
    let clock = Arc::new(VirtualClock::new());
    assert_eq!(StreamJob::start(d, StreamConfig::default(), clock.clone()).wait(), StreamState::Done);
    assert_eq!(clock.now(), std::time::Duration::ZERO);
}

#[test]
fn base_holes_are_learned_at_creation_and_never_fetched() {
    let size = 64 * G;
    let base = Arc::new(MemoryDev::new(size)); // all holes but what we write
    base.write_at(&[1; 4096], 10 * G, false).unwrap();
    let c = cfg(G, false);
    let d = CowDev::create(base.clone(), overlay_for(size, &c), &c).unwrap();
    assert!(d.base_blocks() >= 1 && d.base_blocks() < 64, "{:?}", d.stats());
    assert_eq!(d.state_at(60 * G), State::Zero);
    assert_eq!(read(&d, 10 * G, G), vec![1; G as usize]);
    let fetched = d.stats().base_read_bytes;
    assert_eq!(read(&d, 40 * G, G), vec![0; G as usize]);
    assert_eq!(d.stats().base_read_bytes, fetched, "a known hole is not fetched");
}

#[test]
fn block_status_reports_overlay_zero_and_base_extents() {
    let size = 64 * G;
    let base = Arc::new(MemoryDev::new(size));
    base.write_at(&vec![1; 32 * G as usize], 0, false).unwrap();
    let c = CowConfig { learn_base_holes: false, ..cfg(G, false) };
    let d = CowDev::create(base, overlay_for(size, &c), &c).unwrap();
    d.write_at(&[2; 100], 4 * G, false).unwrap();
    d.discard(8 * G, 2 * G).unwrap();
    let e = d.block_status(0, size).unwrap();
    let kinds: Vec<_> = e.iter().map(|e| (e.len / G, e.kind)).collect();
    assert_eq!(kinds[0], (8, ExtentKind::Data), "base data and overlay data are both data");
    assert_eq!(kinds[1], (2, ExtentKind::Hole), "discarded");
    assert_eq!(kinds[2], (22, ExtentKind::Data), "base data again");
    assert_eq!(kinds[3].1, ExtentKind::Hole, "the base's hole shows through");
    assert_eq!(e.iter().map(|e| e.len).sum::<u64>(), size);
    // Starting inside the overlay block, the first extent is the overlay's.
    assert_eq!(d.block_status(4 * G + 10, G).unwrap()[0].kind, ExtentKind::Data);
}

#[test]
fn a_reused_overlay_forgets_its_old_volume() {
    let size = 16 * G;
    let contents = base_bytes(size);
    let c = CowConfig { journal_len: 2048, ..cfg(G, false) };
    let overlay = overlay_for(size, &c);
    let d = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    for i in 0..40 {
        d.write_at(&[i as u8 + 1; 512], (i % 16) * G, false).unwrap();
        d.flush().unwrap(); // many commits: checkpoints with higher epochs
    }
    drop(d);
    let d = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    assert_eq!(read_all(&d), contents);
    drop(d);
    let r = CowDev::open(Some(base_dev(&contents)), overlay, &c).unwrap();
    assert_eq!(read_all(&r), contents, "no older checkpoint or journal record came back");
}

#[test]
fn wrong_base_size_and_small_overlays_are_refused_by_name() {
    let c = cfg(G, false);
    let base = base_dev(&base_bytes(16 * G));
    let small = Arc::new(MemoryDev::new(64 * G));
    assert!(matches!(CowDev::create(base.clone(), small, &c), Err(CowError::OverlayTooSmall { .. })));
    let overlay = overlay_for(16 * G, &c);
    CowDev::create(base, overlay.clone(), &c).unwrap();
    let other = base_dev(&base_bytes(8 * G));
    let e = CowDev::open(Some(other), overlay, &c).err().unwrap();
    assert!(matches!(e, CowError::BaseSize { .. }), "{e}");
    assert!(matches!(CowDev::create(base_dev(&[1; 4096]), overlay_for(4096, &c), &cfg(1000, false)), Err(CowError::Granularity(1000))));
}

// ---- faults of the overlay under concurrent I/O ----

/// The overlay (volatile cache) fails writes, write-zeroes and flushes while
/// four threads read, write (partly covered blocks too), zero and flush: with
/// every op of the overlay failing, every write and FLUSH fails to the caller; with random
/// failures, reads during the faults and all reads once healed show only
/// acknowledged data (never the base where a write was acknowledged, never a
/// failed write's absence hidden as success); a crash then (the overlay's
/// cache lost) reopens and keeps everything acknowledged before a FLUSH.
#[test]
fn overlay_errors_reach_the_caller_and_acknowledged_writes_survive_heal_and_reopen() {
    use crate::fault::{FaultDev, FaultRules};
    use crate::faultcheck::{SectorModel, Workload};

    let size = 1u64 << 20;
    let rules = |s: &str| s.parse::<FaultRules>().unwrap();
    for seed in 1..=8u64 {
        let c = CowConfig { journal_len: 2048, ..cfg(G, seed % 2 == 0) };
        let contents = base_bytes(size);
        let base = base_dev(&contents);
        let raw = overlay_for(size, &c);
        let overlay = Arc::new(FaultDev::new(raw.clone(), rules(&format!("volatile,seed={seed}")), Arc::new(VirtualClock::new())));
        let dev = CowDev::create(base.clone(), overlay.clone(), &c).unwrap();
        let model = SectorModel::new(contents);
        // A failed FLUSH may have lost writes: the user acknowledges it.
        let ack = || {
            dev.acknowledge_loss();
        };
        // Groups of 4 blocks: threads share map words and every commit.
        let w = Workload { threads: 4, ops_per_thread: 300, group: 4 * G / 512, seed };

        overlay.set_rules(rules(&format!("volatile,write.fail_every=1,flush.fail_every=1,zeroes.fail_every=1,seed={seed}")));
        let always = Workload { ops_per_thread: 30, ..w };
        let o = model.run_with(&dev, &always, &|off, len, ok| assert!(!ok, "a write at {off}+{len} was acknowledged while every overlay write fails"), &ack).unwrap();
        assert_eq!(o.flushes_ok, 0, "a FLUSH was acknowledged while every overlay flush fails");
        assert!(o.writes_failed > 0 && o.flushes_failed > 0, "{o:?}");

        overlay.set_rules(rules(&format!("volatile,write.fail_prob=0.1,zeroes.fail_prob=0.1,flush.fail_prob=0.3,write.spin=20us,seed={seed}")));
        let o = model.run_with(&dev, &w, &|_, _, _| {}, &ack).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let st = overlay.stats();
        assert!(st.injected[1] > 0 && st.injected[2] > 0 && o.flushes_ok > 0 && o.writes_ok > 0, "faults did not happen: {o:?} {st:?}");
        assert!(dev.stats().commits > 0 && dev.stats().checkpoints > 0, "{:?}", dev.stats());

        overlay.set_rules(rules("volatile"));
        model.check_now(&dev).unwrap_or_else(|e| panic!("seed {seed}, healed: {e}"));
        // Crash: the overlay's cache is lost, the raw overlay is reopened.
        drop(dev);
        drop(overlay);
        let reopened = CowDev::open(Some(base), raw, &c).unwrap_or_else(|e| panic!("seed {seed}: reopen after the faults: {e}"));
        model.check_after_crash(&reopened).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

// ---- zero-copy access to the overlay ----

#[test]
fn the_overlay_span_holds_the_data_blocks_and_takes_writes_that_fill_nothing_from_the_base() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * G;
    let c = cfg(G, false);
    let overlay_path = dir.path().join("ovl");
    let overlay = Arc::new(crate::file::FileDev::create(&overlay_path, CowDev::overlay_size_for(size, &c)).unwrap());
    let dev = CowDev::create(base_dev(&base_bytes(size)), overlay, &c).unwrap();
    assert!(!dev.in_file_span(0, G, false), "base blocks are not in the overlay");
    dev.write_at(&pattern(7, 0, 3 * G), 4 * G, false).unwrap();
    dev.discard(10 * G, G).unwrap();
    assert!(!dev.in_file_span(4 * G, 3 * G, false), "blocks written since the last flush are not read through the span");
    dev.flush().unwrap();
    assert!(dev.in_file_span(4 * G, 3 * G, false) && dev.in_file_span(4 * G + 100, 2 * G, true), "written and flushed blocks are");
    assert!(dev.in_file_span(8 * G, G, true) && !dev.in_file_span(8 * G + 1, G, true), "writes of whole base blocks are, of partial ones not");
    assert!(!dev.in_file_span(3 * G, 2 * G, false), "a range reaching a base block is not");
    assert!(!dev.in_file_span(10 * G, G, false), "a discarded block is not");
    assert!(!dev.in_file_span(size - G, 2 * G, false) && !dev.in_file_span(4 * G, 0, false), "out of range or empty");
    let span = dev.file_span().expect("a file overlay offers its data area");
    // Reading the file where the span says gives what the volume reads.
    let file = std::fs::File::open(&overlay_path).unwrap();
    let mut via_span = vec![0u8; (3 * G) as usize];
    file.read_exact_at(&mut via_span, span.base + 4 * G).unwrap();
    assert_eq!(via_span, read(&dev, 4 * G, 3 * G));
    // A write through the span is what the volume then reads.
    let w = std::fs::OpenOptions::new().write(true).open(&overlay_path).unwrap();
    w.write_all_at(&pattern(9, 0, G), span.base + 5 * G).unwrap();
    assert_eq!(read(&dev, 5 * G, G), pattern(9, 0, G));
    // Writes through the span: whole blocks of the base are taken and leave
    // it; a partial block of the base is not (it needs the rest filled first).
    let mut called = 0;
    let mut fill = || {
        called += 1;
        w.write_all_at(&pattern(11, 0, 2 * G), span.base + 20 * G)
    };
    assert!(dev.write_via_span(20 * G, 2 * G, &mut fill).unwrap());
    assert_eq!((called, dev.state_at(20 * G), dev.state_at(21 * G)), (1, State::Data, State::Data));
    assert_eq!(read(&dev, 20 * G, 2 * G), pattern(11, 0, 2 * G));
    let mut never = || -> std::io::Result<()> { panic!("a partial base block must not be written through the span") };
    assert!(!dev.write_via_span(30 * G + 1, G, &mut never).unwrap());
    assert_eq!(dev.state_at(30 * G), State::Base);
    // A failed fill leaves the blocks where they were.
    let mut failing = || Err(std::io::Error::other("disk gone"));
    assert!(dev.write_via_span(40 * G, G, &mut failing).is_err());
    assert_eq!(dev.state_at(40 * G), State::Base);
    assert_eq!(read(&dev, 40 * G, G), base_bytes(size)[(40 * G) as usize..(41 * G) as usize]);
    // A memory overlay has no span.
    let m = CowDev::create(base_dev(&base_bytes(size)), overlay_for(size, &c), &c).unwrap();
    m.write_at(&pattern(7, 0, G), 0, false).unwrap();
    assert!(m.file_span().is_none() && !m.in_file_span(0, G, false));
}

// ---- issue 37: error paths that lost acknowledged data ----

fn faulty_overlay(size: u64, c: &CowConfig) -> (Arc<dyn BlockDev>, Arc<crate::fault::FaultDev>) {
    let raw = overlay_for(size, c);
    let f = Arc::new(crate::fault::FaultDev::new(raw.clone(), "volatile".parse().unwrap(), Arc::new(VirtualClock::new())));
    (raw, f)
}

/// A partial write copies block 0 from the base into the overlay, unflushed;
/// the overlay flush fails and drops it. The next FLUSH must not be
/// acknowledged (the write is gone), and block 0 must never read zeroes (bytes
/// never written there): live its reads fail until it is written again or
/// the loss acknowledged, and after a reopen it reads the base or the write.
#[test]
fn a_write_lost_by_a_failed_overlay_flush_fails_the_next_flush_and_never_maps_to_missing_bytes() {
    let size = 16 * G;
    let c = cfg(G, false);
    let contents = base_bytes(size);
    let (raw, overlay) = faulty_overlay(size, &c);
    let dev = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    dev.write_at(&[0x77; 100], 10, false).unwrap();
    let mut written = contents[..G as usize].to_vec();
    written[10..110].fill(0x77);
    overlay.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(dev.flush().is_err(), "the overlay flush failed");
    let acked = dev.flush().is_ok();
    assert!(!acked, "FLUSH acknowledged after a failed one dropped an acknowledged write");
    assert!(dev.loss().is_some());
    // The write may or may not be there: its block reads neither, it fails.
    let mut b0 = vec![0u8; G as usize];
    assert!(dev.read_at(&mut b0, 0).is_err(), "block 0 reads bytes the failed flush may have dropped (first bytes {:?})", &b0[..12]);
    assert_eq!(read(&dev, G, G), contents[G as usize..2 * G as usize], "other blocks read on");
    drop(dev);
    let r = CowDev::open(Some(base_dev(&contents)), raw, &c).unwrap();
    let b0 = read(&r, 0, G);
    assert!(b0 == contents[..G as usize] || b0 == written, "after reopen block 0 reads neither the base nor the write (first bytes {:?})", &b0[..12]);
}

/// The same loss found by a commit of the stream job (copies only): the copied
/// blocks go back to the base, nothing is lost, FLUSH works again at once.
#[test]
fn copies_from_the_base_lost_by_a_failed_flush_go_back_to_the_base_without_a_loss() {
    let size = 16 * G;
    let c = cfg(G, false);
    let contents = base_bytes(size);
    let (_raw, overlay) = faulty_overlay(size, &c);
    let dev = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    dev.stream_step(0, 4 * G).unwrap();
    overlay.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(dev.commit().is_err());
    assert_eq!(dev.state_at(0), State::Base, "the lost copy is not mapped");
    assert_eq!(read_all(&dev), contents);
    dev.flush().expect("no guest write was lost");
    assert!(dev.loss().is_none());
}

/// Acknowledging the loss makes FLUSH work again; what was lost reads its old contents.
#[test]
fn an_acknowledged_loss_lets_flush_succeed_again() {
    let size = 16 * G;
    let c = cfg(G, false);
    let contents = base_bytes(size);
    let (_raw, overlay) = faulty_overlay(size, &c);
    let dev = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    dev.write_at(&[1; G as usize], 3 * G, false).unwrap();
    overlay.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(dev.flush().is_err());
    assert!(dev.flush().is_err());
    assert!(dev.read_at(&mut vec![0u8; G as usize], 3 * G).is_err(), "until the loss is acknowledged");
    assert!(dev.acknowledge_loss().is_some());
    dev.flush().unwrap();
    assert_eq!(read(&dev, 3 * G, G), contents[3 * G as usize..4 * G as usize], "the lost write's block reads the base");
}

/// A volume made on an overlay that held another volume must never replay
/// that volume's journal records: its own FLUSHed write reads back and every
/// other block reads the base, after a clean reopen.
#[test]
fn a_new_volume_never_replays_the_journal_records_of_the_old_one() {
    let size = 64 * G;
    let c = cfg(G, false);
    let contents = base_bytes(size);
    let overlay = overlay_for(size, &c);
    let old = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    for i in 0..6u64 {
        old.write_at(&[0xA0 + i as u8; G as usize], (10 + 2 * i) * G, false).unwrap();
        old.flush().unwrap();
    }
    drop(old);
    let new = CowDev::create(base_dev(&contents), overlay.clone(), &c).unwrap();
    new.write_at(&[0x5A; G as usize], 0, false).unwrap();
    new.flush().unwrap();
    drop(new);
    let r = CowDev::open(Some(base_dev(&contents)), overlay, &c).unwrap();
    let mut want = contents.clone();
    want[..G as usize].fill(0x5A);
    let got = read_all(&r);
    let bad = (0..size / G).find(|&b| got[(b * G) as usize..((b + 1) * G) as usize] != want[(b * G) as usize..((b + 1) * G) as usize]);
    assert_eq!(bad, None, "block {bad:?} does not read what the new volume holds");
}

/// An overlay whose writes of one chosen offset run a hook first.
struct HookedOverlay {
    inner: Arc<dyn BlockDev>,
    at: u64,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl BlockDev for HookedOverlay {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        if offset == self.at {
            let hook = self.hook.lock().take();
            if let Some(h) = hook {
                h();
            }
        }
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.inner.write_zeroes(offset, len, mode)
    }
}

/// A write to a block already in the overlay takes no lock; a discard of the
/// block runs to its end while the write is on its way to the overlay. Both
/// orders are allowed, but the map and the data area must agree: a block the
/// map says is `Zero` has a data area of zeroes (one-flush commits rely on it).
#[test]
fn a_lock_free_write_racing_a_discard_never_leaves_data_under_a_zero_block() {
    let size = 16 * G;
    let c = cfg(G, false);
    let raw = overlay_for(size, &c);
    let layout = Layout::new(size, G, c.journal_len);
    let hooked = Arc::new(HookedOverlay { inner: raw.clone(), at: layout.data_start + 2 * G, hook: Mutex::new(None) });
    let dev = Arc::new(CowDev::create(base_dev(&base_bytes(size)), hooked.clone(), &c).unwrap());
    dev.write_at(&[1; G as usize], 2 * G, false).unwrap();
    dev.flush().unwrap(); // block 2 is Data and synced: writes to it take no lock
    let d2 = dev.clone();
    *hooked.hook.lock() = Some(Box::new(move || std::thread::spawn(move || d2.discard(2 * G, G).unwrap()).join().unwrap()));
    dev.write_at(&[2; G as usize], 2 * G, false).unwrap();
    let state = dev.state_at(2 * G);
    let area = read(raw.as_ref(), layout.data_start + 2 * G, G);
    assert!(state != State::Zero || area.iter().all(|&b| b == 0), "block 2 is Zero in the map but its data area holds the write");
    assert_eq!(read(dev.as_ref(), 2 * G, G), if state == State::Zero { vec![0; G as usize] } else { vec![2; G as usize] });
}

/// Reads of blocks still in the base race the stream job, which copies the
/// last of them and detaches the base: a read that found a block in the base
/// just before must not fail because the base went away.
#[test]
fn a_read_racing_the_detach_of_the_base_never_fails() {
    let size = 4 * G;
    let contents = base_bytes(size);
    let c = CowConfig { readahead: ReadaheadConfig { max_window: 0, ..ReadaheadConfig::default() }, ..cfg(G, false) };
    let mut failures = 0;
    for _ in 0..3000 {
        let dev = Arc::new(CowDev::create(base_dev(&contents), overlay_for(size, &c), &c).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; G as usize];
                let mut failed = 0;
                while !stop.load(Ordering::SeqCst) {
                    if dev.read_at(&mut b, 3 * G).is_err() {
                        failed += 1;
                    }
                }
                failed
            })
        };
        std::thread::yield_now();
        while dev.stream_step(0, size).unwrap().is_some() {}
        dev.commit().unwrap();
        dev.detach_base().unwrap();
        stop.store(true, Ordering::SeqCst);
        failures += reader.join().unwrap();
    }
    assert_eq!(failures, 0, "reads failed because the base was detached under them");
}
