use super::*;
use crate::clock::VirtualClock;
use crate::conformance::{self, check_op, op_strategy, pattern, CrashModel, Model, Op};
use crate::counted::Counted;
use crate::crashpoint::{enumerate, EnumConfig, Power, PowerConfig, Volatile};
use crate::memory::MemoryDev;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const TAG: u64 = 0x5eed_0001;

fn cfg(region: u64) -> MirrorConfig {
    MirrorConfig { region, persist_every: 4 * region, persist_interval: Duration::from_secs(3600), ..MirrorConfig::default() }
}

fn vclock() -> Arc<dyn Clock> {
    Arc::new(VirtualClock::new())
}

struct Legs {
    source: Arc<dyn BlockDev>,
    target: Arc<dyn BlockDev>,
    meta: Arc<dyn BlockDev>,
}

fn legs(size: u64, region: u64) -> Legs {
    Legs {
        source: Arc::new(MemoryDev::new(size)),
        target: Arc::new(MemoryDev::new(size)),
        meta: Arc::new(MemoryDev::new(meta::required_size(size, region))),
    }
}

fn create(l: &Legs, region: u64) -> Mirror {
    Mirror::create(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(region), TAG, vclock()).unwrap()
}

/// Run one op for its effect (reads are not checked): true if it succeeded.
fn apply(dev: &dyn BlockDev, op: &Op) -> bool {
    match *op {
        Op::Read { offset, len } => dev.read_at(&mut vec![0u8; len as usize], offset).is_ok(),
        Op::Write { offset, len, seed, fua } => dev.write_at(&pattern(seed, offset, len), offset, fua).is_ok(),
        Op::Flush => dev.flush().is_ok(),
        Op::Discard { offset, len } => dev.discard(offset, len).is_ok(),
        Op::WriteZeroes { offset, len, may_trim } => dev.write_zeroes(offset, len, ZeroMode { may_trim, fast_only: false }).is_ok(),
    }
}

fn read_all(dev: &dyn BlockDev) -> Vec<u8> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read_at(&mut buf, 0).unwrap();
    buf
}

fn finish(m: &Mirror) {
    for _ in 0..1_000_000 {
        if m.rebuild_step().unwrap() == Step::Done {
            return;
        }
    }
    panic!("rebuild did not finish");
}

/// A mirror with its rebuild running on a real thread (slowly), for the suite.
struct Rebuilding {
    m: Arc<Mirror>,
    _r: Rebuilder,
}

impl BlockDev for Rebuilding {
    fn size(&self) -> u64 {
        self.m.size()
    }
    fn caps(&self) -> Caps {
        self.m.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.m.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.m.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        self.m.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.m.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.m.write_zeroes(offset, len, mode)
    }
}

#[test]
fn mirror_passes_conformance_while_a_rebuild_runs_in_the_background() {
    conformance::run("mirror rebuilding", |size| {
        let l = legs(size, 4096);
        let clock: Arc<dyn Clock> = Arc::new(crate::SystemClock::new());
        let m = Arc::new(Mirror::create(l.source, l.target, l.meta, cfg(4096), TAG, clock.clone()).unwrap());
        // ~1 region per 100 us: a sequence of ops meets every rebuild stage.
        m.set_rate_limit(Some(40 << 20));
        let r = spawn_rebuild(m.clone(), clock, "test-rebuild".into(), Duration::from_millis(5));
        Arc::new(Rebuilding { m, _r: r })
    });
}

#[test]
fn completed_mirror_passes_conformance() {
    conformance::run("mirror complete", |size| {
        let l = legs(size, 4096);
        let m = create(&l, 4096);
        finish(&m);
        Arc::new(m)
    });
}

/// A script for the interleaving test: I/O, rebuild steps, clear passes.
#[derive(Debug, Clone)]
enum Ctl {
    Io(Op),
    Step(u8),
    Clear,
}

fn ctl_strategy(size: u64) -> impl Strategy<Value = Ctl> {
    prop_oneof![
        6 => op_strategy(size).prop_map(Ctl::Io),
        3 => (1u8..4).prop_map(Ctl::Step),
        1 => Just(Ctl::Clear),
    ]
}

#[test]
fn any_interleaving_of_io_and_rebuild_leaves_both_legs_equal_to_the_model() {
    let mut runner = TestRunner::new(Config { cases: conformance::cases() * 2, failure_persistence: None, ..Config::default() });
    let strat = prop_oneof![Just(4096u64 * 16), 5000u64..120_000].prop_flat_map(|size| (Just(size), proptest::collection::vec(ctl_strategy(size), 1..80)));
    runner
        .run(&strat, |(size, ctls)| {
            let l = legs(size, 4096);
            let m = create(&l, 4096);
            let mut model = Model::new(size);
            for c in &ctls {
                match c {
                    Ctl::Io(op) => check_op(&m, &mut model, op).map_err(TestCaseError::fail)?,
                    Ctl::Step(n) => {
                        for _ in 0..*n {
                            m.rebuild_step().map_err(|e| TestCaseError::fail(e.to_string()))?;
                        }
                    }
                    Ctl::Clear => m.clear_idle().map_err(|e| TestCaseError::fail(e.to_string()))?,
                }
            }
            finish(&m);
            conformance::check_all(&m, &model).map_err(TestCaseError::fail)?;
            conformance::check_all(l.target.as_ref(), &model).map_err(|e| TestCaseError::fail(format!("target alone: {e}")))?;
            conformance::check_all(l.source.as_ref(), &model).map_err(|e| TestCaseError::fail(format!("source alone: {e}")))?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn rebuild_copies_data_and_skips_regions_that_are_zero_on_both_legs() {
    // Memory devices allocate 64 KiB at a time: write into 1 of 4 such chunks.
    let (size, region) = (64 * 4096, 4096);
    let l = legs(size, region);
    l.source.write_at(&pattern(3, 0, 10 * 4096), 0, false).unwrap();
    let m = create(&l, region);
    finish(&m);
    assert_eq!(read_all(l.target.as_ref()), read_all(l.source.as_ref()));
    let p = m.progress();
    assert!(p.complete && !p.failed);
    assert_eq!(p.copied_bytes, size);
    assert_eq!(p.moved_bytes, 16 * 4096, "only the allocated chunk is copied");
    assert_eq!(p.skipped_bytes, 48 * 4096);
    assert_eq!(p.eta_s, Some(0.0));
}

#[test]
fn a_zero_source_region_over_target_garbage_is_zeroed_not_skipped() {
    let l = legs(8 * 4096, 4096);
    l.target.write_at(&[0xee; 4096], 4096, false).unwrap();
    let m = create(&l, 4096);
    finish(&m);
    assert!(read_all(l.target.as_ref()).iter().all(|&b| b == 0));
}

#[test]
fn rate_limit_paces_the_rebuild_on_virtual_time() {
    let (size, region) = (8 << 20, 1 << 20);
    let l = legs(size, region);
    l.source.write_at(&pattern(1, 0, size), 0, false).unwrap();
    let clock = Arc::new(VirtualClock::new());
    // (persist_interval is an hour in these tests: exactly one record per 4 regions.)
    let m = Arc::new(Mirror::create(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(region), TAG, clock.clone()).unwrap());
    m.set_rate_limit(Some(4 << 20));
    spawn_rebuild(m.clone(), clock.clone(), "t".into(), Duration::from_millis(300)).stop_when_done();
    assert_eq!(clock.now(), Duration::from_secs(2), "8 MiB at 4 MiB/s");
    assert!(m.is_complete());
    let p = m.progress();
    assert_eq!(p.rate_bps, Some(4.0 * (1 << 20) as f64));
    assert_eq!(read_all(l.target.as_ref()), read_all(l.source.as_ref()));
}

impl Rebuilder {
    /// Test helper: wait for the thread to end by itself.
    fn stop_when_done(mut self) {
        if let Some(h) = self.handle.take() {
            h.join().unwrap().unwrap();
        }
    }
}

#[test]
fn the_rebuild_thread_is_on_a_discrete_event_clock_before_spawn_returns() {
    // Registered only once it ran, the thread would let a SimClock take the
    // caller's next sleep as the whole system waiting, and move time past
    // the rebuild's pacing before it started.
    let (size, region) = (4 << 20, 1 << 20);
    let l = legs(size, region);
    // Data in every region (a rebuild skips the source's holes).
    l.source.write_at(&pattern(1, 0, size), 0, false).unwrap();
    let clock = crate::SimClock::new();
    let m = Arc::new(Mirror::create(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(region), TAG, clock.clone()).unwrap());
    m.set_rate_limit(Some(1 << 20));
    let hold = clock.hold();
    let r = spawn_rebuild(m.clone(), clock.clone(), "t".into(), Duration::from_millis(100));
    assert_eq!(clock.registered(), 1, "the rebuild thread, registered as spawn_rebuild returned");
    drop(hold);
    r.stop_when_done();
    assert!(m.is_complete());
    assert_eq!(clock.now(), Duration::from_secs(4), "4 MiB at 1 MiB/s, on virtual time");
    assert_eq!(clock.registered(), 0);
}

#[test]
fn writes_reach_the_target_only_in_copied_regions() {
    let l = legs(8 * 4096, 4096);
    let m = create(&l, 4096);
    m.rebuild_step().unwrap();
    m.rebuild_step().unwrap(); // regions 0 and 1 copied
    m.write_at(&[5u8; 3 * 4096], 4096, false).unwrap(); // regions 1, 2, 3
    let t = read_all(l.target.as_ref());
    assert!(t[4096..8192].iter().all(|&b| b == 5), "copied region 1 is written on the target");
    assert!(t[8192..].iter().all(|&b| b == 0), "regions 2 and 3 wait for the rebuild");
    assert!(read_all(l.source.as_ref())[4096..4 * 4096].iter().all(|&b| b == 5));
    assert_eq!(m.progress().dirty_regions, 1);
    finish(&m);
    assert_eq!(read_all(l.target.as_ref()), read_all(l.source.as_ref()));
}

#[test]
fn reads_of_rebuilt_regions_alternate_between_the_legs() {
    let src = Arc::new(Counted::new(Arc::new(MemoryDev::new(16 * 4096))));
    let tgt = Arc::new(Counted::new(Arc::new(MemoryDev::new(16 * 4096))));
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(meta::required_size(16 * 4096, 4096)));
    let m = Mirror::create(src.clone(), tgt.clone(), meta, cfg(4096), TAG, vclock()).unwrap();
    for _ in 0..4 {
        m.rebuild_step().unwrap();
    }
    let (s0, t0) = (src.stats().reads, tgt.stats().reads);
    let mut buf = [0u8; 4096];
    for _ in 0..10 {
        m.read_at(&mut buf, 0).unwrap(); // rebuilt
    }
    for _ in 0..10 {
        m.read_at(&mut buf, 8 * 4096).unwrap(); // not yet
    }
    assert_eq!(tgt.stats().reads - t0, 5, "half the reads of rebuilt data go to the target");
    assert_eq!(src.stats().reads - s0, 15);
}

#[test]
fn a_restart_resumes_from_the_recorded_position() {
    let region = 4096;
    let l = legs(32 * region, region);
    l.source.write_at(&pattern(2, 0, 32 * region), 0, false).unwrap();
    let m = create(&l, region);
    for _ in 0..10 {
        m.rebuild_step().unwrap();
    }
    drop(m);
    let m = Mirror::open(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(region), TAG, vclock()).unwrap();
    // persist_every = 4 regions: 8 were recorded, the 2 after are copied again.
    assert_eq!(m.progress().copied_bytes, 8 * region);
    finish(&m);
    assert_eq!(read_all(l.target.as_ref()), read_all(l.source.as_ref()));
    let m = Mirror::open(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(region), TAG, vclock()).unwrap();
    assert!(m.is_complete(), "completion is recorded");
}

#[test]
fn a_record_of_another_pair_or_none_is_refused() {
    let l = legs(8 * 4096, 4096);
    let e = Mirror::open(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(4096), TAG, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::NoRecord), "{e}");
    create(&l, 4096);
    let e = Mirror::open(l.source.clone(), l.target.clone(), l.meta.clone(), cfg(4096), TAG + 1, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::Foreign { .. }), "{e}");
    let small: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(4096));
    let e = Mirror::create(l.source.clone(), l.target.clone(), small, cfg(4096), TAG, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::MetaTooSmall { .. }), "{e}");
    let tiny: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(4096));
    let e = Mirror::create(l.source.clone(), tiny, l.meta.clone(), cfg(4096), TAG, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::TargetTooSmall { .. }), "{e}");
}

#[test]
fn a_failing_target_is_recorded_and_the_source_carries_on() {
    use crate::fault::{FaultDev, FaultRules};
    let size = 16 * 4096;
    let source: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let target_raw: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let target = Arc::new(FaultDev::new(target_raw.clone(), FaultRules::default(), vclock()));
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(meta::required_size(size, 4096)));
    let m = Mirror::create(source.clone(), target.clone(), meta.clone(), cfg(4096), TAG, vclock()).unwrap();
    m.rebuild_step().unwrap();
    target.set_rule("write.fail_prob", Some("1")).unwrap();
    m.write_at(&[4u8; 4096], 0, false).expect("the source takes the write");
    assert!(m.is_failed());
    assert!(matches!(m.rebuild_step(), Err(MirrorError::TargetFailed)));
    let mut b = [0u8; 4096];
    for _ in 0..4 {
        m.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [4u8; 4096], "reads come from the source");
    }
    let e = Mirror::open(source, target_raw, meta, cfg(4096), TAG, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::TargetFailed), "a restart must not trust the target: {e}");
}

/// The target fails while the record cannot be written (the metadata device
/// fails writes). Until a record says the target failed, a restart would trust
/// it: no write may reach the source alone and no FLUSH may be acknowledged.
/// Once the metadata device heals, the failure is recorded by the next FLUSH
/// (never given up), and a restart refuses the target.
#[test]
fn no_flush_is_acknowledged_after_a_target_failure_until_the_failure_is_recorded() {
    use crate::fault::{FaultDev, FaultRules};
    let size = 16 * 4096;
    let source: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let target_raw: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let target = Arc::new(FaultDev::new(target_raw.clone(), FaultRules::default(), vclock()));
    let meta_raw: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(meta::required_size(size, 4096)));
    let meta = Arc::new(FaultDev::new(meta_raw.clone(), FaultRules::default(), vclock()));
    let m = Mirror::create(source.clone(), target.clone(), meta.clone(), cfg(4096), TAG, vclock()).unwrap();
    finish(&m);
    m.write_at(&[1u8; 4096], 0, false).unwrap(); // regions 0 and 3 dirty, durable
    m.write_at(&[1u8; 4096], 3 * 4096, false).unwrap();
    meta.set_rule("write.fail_prob", Some("1")).unwrap();
    target.set_rule("write.fail_prob", Some("1")).unwrap();
    let _ = m.write_at(&[2u8; 4096], 0, false); // the target fails here
    assert!(m.is_failed());
    let second = m.write_at(&[3u8; 4096], 3 * 4096, false).is_ok();
    let flushed = m.flush().is_ok();
    assert!(!flushed, "FLUSH acknowledged while no record says the target failed (second write acknowledged: {second})");
    // A crash now: the restart trusts the target, and must find it consistent
    // with the source wherever a write may have reached the source alone.
    {
        let copy = |d: &Arc<dyn BlockDev>| -> Arc<dyn BlockDev> {
            let m = MemoryDev::new(d.size());
            m.write_at(&read_all(d.as_ref()), 0, false).unwrap();
            Arc::new(m)
        };
        let (s, t) = (copy(&source), copy(&target_raw));
        let r = Mirror::open(s.clone(), t.clone(), copy(&meta_raw), cfg(4096), TAG, vclock()).unwrap();
        finish(&r);
        assert!(read_all(s.as_ref()) == read_all(t.as_ref()), "after the restart the legs differ: reads alternate between old and new data");
    }
    // The metadata device heals: the record is written by the next FLUSH.
    meta.set_rules(FaultRules::default());
    m.write_at(&[4u8; 4096], 5 * 4096, false).unwrap();
    m.flush().expect("the failure is recorded now");
    let e = Mirror::open(source, target_raw, meta_raw, cfg(4096), TAG, vclock()).err().unwrap();
    assert!(matches!(e, MirrorError::TargetFailed), "the failure record was never written: {e}");
}

/// The source's flush fails and drops the writes it held (a writeback error):
/// no later FLUSH may be acknowledged until the loss is acknowledged.
#[test]
fn a_source_flush_that_dropped_writes_fails_every_later_flush_until_acknowledged() {
    use crate::fault::FaultDev;
    let size = 16 * 4096;
    let source_raw: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let source = Arc::new(FaultDev::new(source_raw.clone(), "volatile".parse().unwrap(), vclock()));
    let target: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(size));
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(meta::required_size(size, 4096)));
    let m = Mirror::create(source.clone(), target, meta, cfg(4096), TAG, vclock()).unwrap();
    m.write_at(&[9u8; 4096], 8 * 4096, false).unwrap(); // not yet copied: source only
    source.set_rules("volatile,flush.fail_nth=1,flush.fail_loses".parse().unwrap());
    assert!(m.flush().is_err());
    assert!(m.flush().is_err(), "FLUSH acknowledged after the source dropped an acknowledged write");
    assert!(m.loss().is_some());
    m.acknowledge_loss();
    m.flush().unwrap();
}

// ---- crash consistency ----

const CR: u64 = 4096;
const CSIZE: u64 = 16 * CR;

struct Fixture {
    l: Legs,
    initial: Vec<u8>,
}

/// Source with data, a fresh target, a mirror record at position 0.
fn prepare() -> Fixture {
    let l = legs(CSIZE, CR);
    let initial = pattern(7, 0, CSIZE);
    l.source.write_at(&initial, 0, false).unwrap();
    create(&l, CR);
    Fixture { l, initial }
}

/// After a crash: reopen on the raw media, check that a read before the
/// resync equals what the legs hold once the rebuild finishes (no flip), that
/// both legs agree, and that the model accepts the data.
fn verify_after_crash(f: &Fixture, model: &CrashModel) -> std::result::Result<(), String> {
    let m = Mirror::open(f.l.source.clone(), f.l.target.clone(), f.l.meta.clone(), cfg(CR), TAG, vclock()).map_err(|e| format!("reopen: {e}"))?;
    let before = read_all(&m);
    for _ in 0..10_000 {
        match m.rebuild_step().map_err(|e| format!("rebuild after restart: {e}"))? {
            Step::Done => break,
            Step::Copied { .. } => {}
        }
    }
    let (s, t) = (read_all(f.l.source.as_ref()), read_all(f.l.target.as_ref()));
    if s != t {
        let at = s.iter().zip(&t).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("legs disagree after the rebuild, first at byte {at}"));
    }
    if before != t {
        return Err("a read after restart differs from the data after resync (data flipped)".into());
    }
    model.check(&t)
}

/// A fixed script of rebuild steps and writes (some into copied regions), with flushes.
fn script(m: &Mirror, model: &mut CrashModel) {
    for i in 0..12u64 {
        if m.rebuild_step().is_err() {
            return;
        }
        let op = Op::Write { offset: (i * 5000) % (CSIZE - 6000), len: 6000, seed: i as u8 + 1, fua: i == 7 };
        let ok = apply(m, &op);
        if ok {
            model.acked(&op);
        } else {
            model.maybe(&op);
            return;
        }
        if i % 4 == 3 {
            if m.flush().is_err() {
                return;
            }
            model.acked(&Op::Flush);
        }
    }
}

/// Enumerate every crash point of [`script`] on the fixture, then verify.
fn crash_everywhere(volatile: Volatile, variants: u32) -> crate::crashpoint::EnumReport {
    // Without a volatile cache (a killed process), completed writes survive.
    let writes_durable = volatile == Volatile::Off;
    enumerate(
        &EnumConfig { volatile, variants, ..EnumConfig::default() },
        prepare,
        |f, power| {
            let wrap = |d: &Arc<dyn BlockDev>| power.wrap(d.clone(), true) as Arc<dyn BlockDev>;
            let mut model = CrashModel::with_contents(&f.initial, writes_durable);
            if let Ok(m) = Mirror::open(wrap(&f.l.source), wrap(&f.l.target), wrap(&f.l.meta), cfg(CR), TAG, vclock()) {
                script(&m, &mut model);
            }
            model
        },
        |f, _point, model| verify_after_crash(f, &model),
    )
    .unwrap()
}

#[test]
fn crash_at_every_event_of_a_rebuild_under_writes_keeps_flushed_data_and_legs_equal() {
    let report = crash_everywhere(Volatile::RandomSectors, 2);
    assert!(report.events > 40, "{report:?}");
}

#[test]
fn process_crash_at_every_event_keeps_every_acknowledged_write() {
    // A killed process (no power cut): completed writes are in the page cache
    // and survive; the record must still make the legs agree.
    let report = crash_everywhere(Volatile::Off, 1);
    assert!(report.runs > 40, "{report:?}");
}

#[test]
fn crash_at_a_random_point_of_random_io_and_rebuild_loses_nothing_flushed() {
    let mut runner = TestRunner::new(Config { cases: conformance::cases() * 2, failure_persistence: None, ..Config::default() });
    let strat = (1u64..400, any::<u64>(), any::<bool>()).prop_flat_map(|(crash_at, seed, power_cut)| {
        (Just(crash_at), Just(seed), Just(power_cut), proptest::collection::vec(ctl_strategy(CSIZE), 1..70))
    });
    runner
        .run(&strat, |(crash_at, seed, power_cut, ctls)| {
            let f = prepare();
            let volatile = if power_cut { Volatile::RandomSectors } else { Volatile::Off };
            let power = Power::new(PowerConfig { crash_at: Some(crash_at), volatile, seed, ..PowerConfig::default() });
            let wrap = |d: &Arc<dyn BlockDev>| power.wrap(d.clone(), true) as Arc<dyn BlockDev>;
            let mut model = CrashModel::with_contents(&f.initial, !power_cut);
            let m = Mirror::open(wrap(&f.l.source), wrap(&f.l.target), wrap(&f.l.meta), cfg(CR), TAG, vclock()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for c in &ctls {
                let ok = match c {
                    Ctl::Io(op) => {
                        let ok = apply(&m, op);
                        if ok {
                            model.acked(op);
                        } else {
                            model.maybe(op);
                        }
                        ok
                    }
                    Ctl::Step(n) => (0..*n).all(|_| m.rebuild_step().is_ok()),
                    Ctl::Clear => m.clear_idle().is_ok(),
                };
                if !ok || power.is_dead() {
                    break;
                }
            }
            drop(m);
            power.cut();
            verify_after_crash(&f, &model).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn writes_racing_the_rebuild_front_reach_the_target() {
    // Writers hammer regions right behind the rebuild while it advances: a
    // write that sees a region as "not yet copied" after its copy finished
    // would be missing on the target.
    let (size, region) = (256 * 4096u64, 4096u64);
    for round in 0..20u64 {
        let l = legs(size, region);
        let m = Arc::new(create(&l, region));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (m, stop) = (m.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(SeqCst) {
                        let front = m.copied.load(SeqCst);
                        // Own blocks only (block % 4 == w), at and around the front:
                        // two writers racing on one block may leave the legs with
                        // either's data (overlapping concurrent writes have no order),
                        // so the clamp at the end stays on the writer's own last block.
                        let b = ((front + i % 3) / 4 * 4 + w).min(252 + w);
                        let v = (round as u8) ^ (i as u8) | 1;
                        m.write_at(&[v; 4096], b * 4096, false).unwrap();
                        i += 1;
                    }
                })
            })
            .collect();
        while m.rebuild_step().unwrap() != Step::Done {}
        stop.store(true, SeqCst);
        writers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(read_all(l.target.as_ref()), read_all(l.source.as_ref()), "round {round}: the legs differ");
    }
}

#[test]
fn the_position_is_recorded_at_least_every_persist_interval() {
    let region = 4096;
    let l = legs(64 * region, region);
    l.source.write_at(&pattern(4, 0, 64 * region), 0, false).unwrap();
    let clock = Arc::new(VirtualClock::new());
    let c = MirrorConfig { region, persist_every: 1 << 40, persist_interval: Duration::from_secs(1), ..MirrorConfig::default() };
    let m = Mirror::create(l.source.clone(), l.target.clone(), l.meta.clone(), c, TAG, clock.clone()).unwrap();
    for _ in 0..3 {
        m.rebuild_step().unwrap();
    }
    clock.advance(Duration::from_secs(2));
    m.rebuild_step().unwrap(); // 4 regions copied, a second has passed: recorded
    m.rebuild_step().unwrap();
    drop(m);
    let m = Mirror::open(l.source.clone(), l.target.clone(), l.meta.clone(), c, TAG, clock).unwrap();
    assert_eq!(m.progress().copied_bytes, 4 * region);
}
