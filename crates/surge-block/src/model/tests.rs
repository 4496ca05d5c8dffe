//! Exact virtual-time tests of the volume models.

use super::*;
use crate::clock::VirtualClock;
use crate::memory::MemoryDev;
use std::collections::VecDeque;

const S: u64 = 1_000_000_000;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Closed-loop load at queue depth `qd` on the pure scheduler: each request is
/// submitted when the oldest outstanding one completes. Calls `on_done` with each
/// completion time until it returns false.
fn backlog(sched: &mut Scheduler, start: Duration, qd: usize, bytes: u64, mut on_done: impl FnMut(Duration) -> bool) {
    let mut q: VecDeque<Duration> = (0..qd).map(|_| sched.reserve(start, IoKind::Read, bytes)).collect();
    while let Some(done) = q.pop_front() {
        if !on_done(done) {
            return;
        }
        q.push_back(sched.reserve(done, IoKind::Read, bytes));
    }
}

/// Completions counted in consecutive windows ending at each of `ends`.
fn count_windows(sched: &mut Scheduler, start: Duration, qd: usize, bytes: u64, ends: &[Duration]) -> Vec<u64> {
    let mut counts = vec![0u64; ends.len()];
    backlog(sched, start, qd, bytes, |t| match ends.iter().position(|&e| t <= e) {
        Some(i) => {
            counts[i] += 1;
            true
        }
        None => false,
    });
    counts
}

fn gp2(gib: u64) -> Scheduler {
    Scheduler::new(VolumeModel::Gp2.shape(gib * GIB).unwrap(), Duration::ZERO)
}

#[test]
fn gp2_100gib_bursts_3000_iops_for_exactly_2000_s_then_300() {
    let mut s = gp2(100);
    // 5.4 M credits / (3,000 - 300) per second = 2,000 s of burst.
    let counts = count_windows(&mut s, Duration::ZERO, 16, 4 * KIB, &[secs(2_000), secs(2_100)]);
    assert_eq!(counts[0], 3_000 * 2_000, "3,000 IOPS from 0 to 2,000 s");
    assert_eq!(counts[1], 300 * 100, "baseline 300 IOPS after the bucket is empty");
    assert_eq!(s.credits(secs(2_000)).ops, Some(0));
}

#[test]
fn gp2_refills_at_baseline_when_idle_and_bursts_again() {
    let mut s = gp2(100);
    s.set_credits(Duration::ZERO, Some(0), None);
    assert_eq!(s.credits(secs(1_000)).ops, Some(300_000), "1,000 s idle at 300 credits/s");
    assert_eq!(s.credits(secs(100_000)).ops, Some(GP2_CREDITS), "refill stops at 5.4 M");
    // 300,000 credits at 3,000 - 300 net: 111.1 s of burst from t = 1,000 s.
    let counts = count_windows(&mut s, secs(1_000), 16, 4 * KIB, &[secs(1_100), secs(1_200)]);
    assert_eq!(counts[0], 300_001, "burst: one op at 1,000 s then 3,000/s for 100 s");
    // Op j completes when 300,000 + 300 t >= j + 1 once credits bind: j < 360,000 by 200 s.
    assert_eq!(counts[0] + counts[1], 360_000);
}

#[test]
fn gp2_2mib_io_counts_as_8_operations() {
    let shape = VolumeModel::Gp2.shape(100 * GIB).unwrap();
    assert_eq!(shape.charge(2 * MIB).ops, 8);
    assert_eq!(shape.charge(2 * MIB + 1).ops, 9);
    assert_eq!(shape.charge(256 * KIB).ops, 1);
    assert_eq!(shape.charge(512).ops, 1);
    let clock = Arc::new(VirtualClock::new());
    let dev = ModelDev::new(Arc::new(MemoryDev::new(4 * MIB)), clock.clone(), shape);
    dev.write_at(&vec![7u8; 2 * MIB as usize], 0, false).unwrap();
    assert_eq!(dev.credits().ops, Some(GP2_CREDITS - 8));
    // 8 ops fit in 7/3,000 s at 3,000 IOPS, but 2 MiB at 128 MiB/s (one 256 KiB op held) binds.
    assert_eq!(clock.now(), Duration::from_nanos(((2 * MIB - 256 * KIB) as u128 * S as u128).div_ceil(128 * MIB as u128) as u64));
}

#[test]
fn io1_serves_its_provisioned_iops() {
    let shape = VolumeModel::Io1 { iops: 5_000 }.shape(100 * GIB).unwrap();
    let mut s = Scheduler::new(shape, Duration::ZERO);
    let counts = count_windows(&mut s, Duration::ZERO, 16, 4 * KIB, &[secs(1), secs(11)]);
    assert_eq!(counts[1], 50_000, "5,000 IOPS for 10 s");
}

#[test]
fn io1_over_ratio_still_serves_30000_iops() {
    let m = VolumeModel::Io1 { iops: 30_000 };
    assert_eq!(m.ratio_warnings(100 * GIB).len(), 1, "AWS would need 600 GiB");
    let mut s = Scheduler::new(m.shape(100 * GIB).unwrap(), Duration::ZERO);
    let counts = count_windows(&mut s, Duration::ZERO, 16, 4 * KIB, &[secs(1), secs(3)]);
    assert_eq!(counts[1], 60_000);
}

#[test]
fn st1_bursts_at_250_mibs_per_tib_then_falls_to_40() {
    let mut s = Scheduler::new(VolumeModel::St1.shape(TIB).unwrap(), Duration::ZERO);
    assert_eq!(s.credits(Duration::ZERO).bytes, Some(TIB), "starts with a full 1 TiB bucket");
    // 21,000 MiB of credits drain at 250 - 40 = 210 MiB/s: exactly 100 s of burst.
    s.set_credits(Duration::ZERO, None, Some(21_000 * MIB));
    let counts = count_windows(&mut s, Duration::ZERO, 4, MIB, &[secs(100), secs(200)]);
    assert_eq!(counts[0], 25_000, "250 MiB/s for 100 s");
    assert_eq!(counts[1], 4_000, "40 MiB/s baseline for the next 100 s");
}

#[test]
fn st1_small_io_counts_as_1_mib() {
    let mut s = Scheduler::new(VolumeModel::St1.shape(TIB).unwrap(), Duration::ZERO);
    // 4 KiB random reads are charged 1 MiB each: 250 MiB/s burst = 250 IOPS (< 500 cap).
    let counts = count_windows(&mut s, Duration::ZERO, 16, 4 * KIB, &[secs(10)]);
    assert_eq!(counts[0], 2_501, "op j at j/250 s");
    let mut s = Scheduler::new(VolumeModel::St1.shape(TIB).unwrap(), Duration::ZERO);
    s.reserve(Duration::ZERO, IoKind::Read, 4 * KIB);
    assert_eq!(s.credits(Duration::ZERO).bytes, Some(TIB - MIB), "credits charged in MiB");
}

#[test]
fn st1_merges_physically_sequential_small_io_into_1_mib_operations() {
    let shape = VolumeModel::St1.shape(2 * TIB).unwrap();
    let mut s = Scheduler::new(shape.clone(), Duration::ZERO);
    s.set_credits(Duration::ZERO, None, Some(0)); // baseline: 80 MiB/s
    // Two interleaved streams of 32 KiB pieces, each covering 1 MiB.
    let mut done = Duration::ZERO;
    for piece in 0..32u64 {
        for stream in [0u64, 8] {
            done = done.max(s.reserve_at(Duration::ZERO, IoKind::Read, stream * MIB + piece * 32 * KIB, 32 * KIB));
        }
    }
    assert_eq!(done, Duration::from_nanos(2 * 1_000_000_000 / 80), "2 MiB at 80 MiB/s");
    assert_eq!(s.credits(done).bytes, Some(0));
    // Random 32 KiB pieces are charged 1 MiB each.
    let mut s = Scheduler::new(shape, Duration::ZERO);
    s.set_credits(Duration::ZERO, None, Some(0));
    let mut done = Duration::ZERO;
    for i in 0..8u64 {
        done = done.max(s.reserve_at(Duration::ZERO, IoKind::Read, i * 7 * MIB, 32 * KIB));
    }
    assert_eq!(done, Duration::from_nanos(8 * 1_000_000_000 / 80), "8 x 1 MiB at 80 MiB/s");
}

#[test]
fn gp2_merges_physically_sequential_32kib_io_into_256kib_operations() {
    // AWS's example: 8 contiguous 32 KiB I/Os count as 1 operation, 8 random
    // ones as 8. A 100 GiB gp2 with spent credits: 300 operations/s.
    let spent_shape = |shape: Shape| {
        let mut s = Scheduler::new(shape, Duration::ZERO);
        s.set_credits(Duration::ZERO, Some(0), None);
        s
    };
    let spent = || spent_shape(VolumeModel::Gp2.shape(100 * GIB).unwrap());
    // 64 sequential 32 KiB pieces (2 MiB): 8 operations. Op j (from 0)
    // completes when j + 1 credits have been earned at 300/s.
    let mut s = spent();
    let mut done = Duration::ZERO;
    for piece in 0..64u64 {
        done = done.max(s.reserve_at(Duration::ZERO, IoKind::Read, piece * 32 * KIB, 32 * KIB));
    }
    assert_eq!(done, Duration::from_nanos((8 * S).div_ceil(300)), "8 operations at the 300 IOPS baseline");
    assert_eq!(s.credits(done).ops, Some(0));
    // Two interleaved streams, 1 MiB each: 4 + 4 operations (the throughput
    // ceiling lifted, so only operations bind).
    let mut s = spent_shape(Shape { bps: None, ..VolumeModel::Gp2.shape(100 * GIB).unwrap() });
    let mut done = Duration::ZERO;
    for piece in 0..32u64 {
        for stream in [0u64, 8] {
            done = done.max(s.reserve_at(Duration::ZERO, IoKind::Read, stream * MIB + piece * 32 * KIB, 32 * KIB));
        }
    }
    assert_eq!(done, Duration::from_nanos((8 * S).div_ceil(300)), "interleaved streams: still 8 operations");
    // Random 32 KiB pieces are one operation each.
    let mut s = spent();
    let mut done = Duration::ZERO;
    for i in 0..64u64 {
        done = done.max(s.reserve_at(Duration::ZERO, IoKind::Read, i * 7 * MIB, 32 * KIB));
    }
    assert_eq!(done, Duration::from_nanos((64 * S).div_ceil(300)), "64 operations");
    // A piece continuing a run long after it still pays nothing, and a run
    // ends at its 256 KiB operation: the 9th piece is a new operation.
    let mut s = spent();
    let first = s.reserve_at(Duration::ZERO, IoKind::Read, 0, 32 * KIB);
    for piece in 1..8u64 {
        assert_eq!(s.reserve_at(secs(100), IoKind::Read, piece * 32 * KIB, 32 * KIB), secs(100), "piece {piece} rides on the first operation");
    }
    let before = s.credits(secs(100)).ops.unwrap();
    s.reserve_at(secs(100), IoKind::Read, 256 * KIB, 32 * KIB);
    assert_eq!(s.credits(secs(100)).ops, Some(before - 1), "the 9th piece opens a new operation");
    assert!(first <= secs(100));
}

#[test]
fn merged_ssd_pieces_still_pay_the_throughput_ceiling() {
    // gp3: 3,000 IOPS, 125 MiB/s. 4,000 sequential 32 KiB writes are 500
    // merged operations (well under 3,000 IOPS) but 125 MiB: one second at
    // the throughput ceiling (256 KiB held after idle), not 1/6 of one.
    let mut s = Scheduler::new(VolumeModel::Gp3 { iops: None, throughput: None }.shape(100 * GIB).unwrap(), Duration::ZERO);
    let mut done = Duration::ZERO;
    for i in 0..4_000u64 {
        done = done.max(s.reserve_at(Duration::ZERO, IoKind::Write, i * 32 * KIB, 32 * KIB));
    }
    assert_eq!(done, Duration::from_nanos(((125 * MIB - 256 * KIB) as u128 * S as u128).div_ceil(125 * MIB as u128) as u64));
    for t in [VolumeModel::Gp2, VolumeModel::Gp3 { iops: None, throughput: None }, VolumeModel::Io1 { iops: 1_000 }, VolumeModel::Io2 { iops: 1_000 }] {
        assert!(t.shape(100 * GIB).unwrap().merge_sequential, "{} merges", t.kind());
    }
    assert!(!VolumeModel::AzurePremium.shape(100 * GIB).unwrap().merge_sequential, "Azure documents no merging");
}

#[test]
fn st1_and_sc1_figures_scale_with_size_and_cap() {
    let st1 = VolumeModel::St1.shape(2 * TIB).unwrap();
    assert_eq!((st1.bps, st1.byte_credits.unwrap().baseline), (Some(500 * MIB), 80 * MIB));
    let big = VolumeModel::St1.shape(16 * TIB).unwrap();
    assert_eq!((big.bps, big.byte_credits), (Some(500 * MIB), None), "baseline reaches the 500 MiB/s cap");
    let sc1 = VolumeModel::Sc1.shape(TIB).unwrap();
    assert_eq!((sc1.bps, sc1.byte_credits.unwrap().baseline, sc1.iops), (Some(80 * MIB), 12 * MIB, Some(250)));
    assert!(VolumeModel::St1.shape(100 * GIB).is_err(), "st1 starts at 125 GiB");
}

#[test]
fn gp2_figures_follow_size() {
    let s = |g| VolumeModel::Gp2.shape(g * GIB).unwrap();
    assert_eq!(s(1).op_credits.unwrap().baseline, 100, "minimum 100 IOPS");
    assert_eq!(s(100).op_credits.unwrap().baseline, 300);
    assert_eq!(s(170).bps, Some(128 * MIB));
    assert_eq!(s(171).bps, Some(250 * MIB));
    assert_eq!(s(334).bps, Some(250 * MIB));
    assert_eq!((s(1_000).iops, s(1_000).op_credits), (Some(3_000), None), "no burst from 1,000 GiB");
    assert_eq!(s(6_000).iops, Some(16_000), "maximum 16,000 IOPS");
    assert!(VolumeModel::Gp2.shape(17 * TIB).is_err());
}

#[test]
fn gp2_mid_size_runs_250_mibs_with_credits_then_baseline_iops_times_256_kib() {
    let mut s = gp2(200);
    // 256 KiB reads: 250 MiB/s = 1,000 ops/s; credits drain at 1,000 - 600 = 400/s.
    s.set_credits(Duration::ZERO, Some(4_000), None);
    let counts = count_windows(&mut s, Duration::ZERO, 16, 256 * KIB, &[secs(10), secs(20)]);
    assert_eq!(counts[0], 10_000, "250 MiB/s while credits last");
    // Then the 600 IOPS baseline x 256 KiB = 150 MiB/s.
    assert_eq!(counts[1], 6_000);
}

#[test]
fn gp3_and_io2_limits() {
    let g = VolumeModel::Gp3 { iops: None, throughput: None }.shape(GIB).unwrap();
    assert_eq!((g.iops, g.bps), (Some(3_000), Some(125 * MIB)));
    assert!(VolumeModel::Gp3 { iops: Some(20_000), throughput: None }.shape(100 * GIB).is_err());
    assert!(VolumeModel::Gp3 { iops: Some(3_000), throughput: Some(1_000 * MIB) }.shape(100 * GIB).is_err(), "1,000 MiB/s needs 4,000 IOPS");
    assert!(VolumeModel::Gp3 { iops: Some(4_000), throughput: Some(1_000 * MIB) }.shape(100 * GIB).is_ok());
    let io1 = |i| VolumeModel::Io1 { iops: i }.shape(1_000 * GIB).unwrap().bps;
    assert_eq!(io1(1_000), Some(250 * MIB));
    assert_eq!(io1(32_000), Some(500 * MIB));
    assert_eq!(io1(48_000), Some(750 * MIB), "16 KiB per IOPS above 32,000");
    let io2 = VolumeModel::Io2 { iops: 256_000 }.shape(1_000 * GIB).unwrap();
    assert_eq!(io2.bps, Some(4_000 * MIB));
}

#[test]
fn reserved_paces_bandwidth_iops_and_latency() {
    let shape = VolumeModel::Reserved { bw: Some(33 * MB), iops: None }.shape(10 * GIB).unwrap();
    let mut s = Scheduler::new(shape, Duration::ZERO);
    let counts = count_windows(&mut s, Duration::ZERO, 16, MIB, &[secs(100)]);
    // One MiB held after idle; op j done when j MiB <= 33 MB/s x t: j <= 3,147 by 100 s.
    assert_eq!(counts[0], 3_148);

    let shape = with_latency(VolumeModel::Reserved { bw: None, iops: Some(100) }.shape(GIB).unwrap(), Duration::from_millis(2));
    let mut s = Scheduler::new(shape, Duration::ZERO);
    assert_eq!(s.reserve(Duration::ZERO, IoKind::Write, 4096), Duration::from_millis(2));
    assert_eq!(s.reserve(Duration::ZERO, IoKind::Write, 4096), Duration::from_millis(12));
    assert_eq!(s.reserve(secs(5), IoKind::Read, 4096), secs(5) + Duration::from_millis(2), "idle: no queue");
}

#[test]
fn live_update_changes_rate_and_keeps_credits() {
    let mut s = Scheduler::new(VolumeModel::Reserved { bw: Some(33 * MB), iops: None }.shape(GIB).unwrap(), Duration::ZERO);
    s.update(Duration::ZERO, VolumeModel::Reserved { bw: Some(128 * MB), iops: None }.shape(GIB).unwrap());
    let counts = count_windows(&mut s, Duration::ZERO, 4, MB, &[secs(10)]);
    assert_eq!(counts[0], 1_281, "op j at j MB / 128 MB/s");

    let mut g = gp2(100);
    g.set_credits(Duration::ZERO, Some(1_000_000), None);
    g.update(Duration::ZERO, VolumeModel::Gp2.shape(200 * GIB).unwrap());
    assert_eq!(g.credits(Duration::ZERO).ops, Some(1_000_000), "resize keeps the balance");
    assert_eq!(g.credits(secs(10)).ops, Some(1_006_000), "and earns at the new baseline (600/s)");
    g.update(Duration::ZERO, VolumeModel::Gp2.shape(2_000 * GIB).unwrap());
    assert_eq!(g.credits(Duration::ZERO).ops, None, "no bucket from 1 TiB");
}

#[test]
fn concurrent_threads_are_paced_exactly_on_virtual_time() {
    let clock = Arc::new(VirtualClock::new());
    let dev = Arc::new(ModelDev::new(Arc::new(MemoryDev::new(64 * MIB)), clock.clone(), VolumeModel::Gp2.shape(100 * GIB).unwrap()));
    let threads: Vec<_> = (0..16u64)
        .map(|i| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                for j in 0..500u64 {
                    // Every other 4 KiB page: no two reads are physically
                    // sequential, so gp2 cannot merge them.
                    dev.read_at(&mut buf, ((i * 500 + j) * 8192) % (64 * MIB)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // 8,000 ops at 3,000 IOPS: the last completes at 7,999/3,000 s.
    assert_eq!(clock.now(), Duration::from_nanos((7_999 * S).div_ceil(3_000)));
    assert_eq!(dev.credits().ops, Some(GP2_CREDITS - 8_000 + (300 * 7_999) / 3_000));
}

#[test]
fn free_operations_do_not_consume_service() {
    let clock = Arc::new(VirtualClock::new());
    let dev = ModelDev::new(Arc::new(MemoryDev::new(2 * MIB)), clock.clone(), VolumeModel::Reserved { bw: Some(MB), iops: None }.shape(MIB).unwrap());
    dev.flush().unwrap();
    dev.discard(0, MIB).unwrap();
    dev.write_zeroes(0, MIB, ZeroMode { may_trim: true, fast_only: false }).unwrap();
    assert_eq!(clock.now(), Duration::ZERO);
    // 1 MiB held after idle, the rest at 1 MB/s.
    dev.write_zeroes(0, MIB + 500_000, ZeroMode::default()).unwrap();
    assert_eq!(clock.now(), Duration::from_millis(500), "a writing zero request is charged its length");
    assert!(dev.read_at(&mut [0u8; 10], 2 * MIB).is_err());
    assert_eq!(clock.now(), Duration::from_millis(500), "a failed request is not charged");
}

#[test]
fn model_layer_passes_conformance() {
    for (name, model) in [
        ("model-reserved", VolumeModel::Reserved { bw: Some(33 * MB), iops: Some(1_000) }),
        ("model-gp2", VolumeModel::Gp2),
        ("model-st1", VolumeModel::St1),
    ] {
        crate::conformance::run(name, |size| {
            // Shapes of a real-sized volume over a small device: the conformance
            // sizes are below the types' minimums.
            let shape = model.shape(200 * GIB).unwrap();
            Arc::new(ModelDev::new(Arc::new(MemoryDev::new(size)), Arc::new(VirtualClock::new()), shape))
        });
    }
}


#[test]
fn azure_p10_bursts_3500_iops_for_30_minutes_then_500() {
    let shape = VolumeModel::AzurePremium.shape(128 * GIB).unwrap();
    assert_eq!(azure_tier(128 * GIB).map(|t| t.0), Some("P10"));
    let mut s = Scheduler::new(shape, Duration::ZERO);
    // Bucket (3,500 - 500) x 1,800 s, drained at 3,000/s: exactly 1,800 s.
    let counts = count_windows(&mut s, Duration::ZERO, 16, 4 * KIB, &[secs(1_800), secs(1_900)]);
    assert_eq!(counts, vec![3_500 * 1_800, 500 * 100]);
    let p30 = VolumeModel::AzurePremium.shape(TIB).unwrap();
    assert_eq!((p30.iops, p30.op_credits), (Some(5_000), None), "P30 and up do not credit-burst");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn shape() -> impl Strategy<Value = Shape> {
        (
            proptest::option::of(1u64..20_000),
            proptest::option::of(1_000u64..500_000_000),
            proptest::option::of(prop_oneof![Just(256 * KIB), Just(MIB)]),
            prop_oneof![Just(0u64), Just(MIB)],
            proptest::option::of((0u64..10_000, 1u64..500, 0u64..10_000)),
        )
            .prop_map(|(iops, bps, op_size, byte_unit, oc)| Shape {
                iops,
                bps,
                op_size,
                byte_unit,
                op_credits: oc.map(|(capacity, baseline, initial)| Credits { capacity, baseline, initial: initial.min(capacity) }),
                ..Shape::default()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the shape and the arrivals, completions come in order, never
        /// before submission, and no window serves more than its rate allows
        /// (plus what the buckets may hold at its start).
        #[test]
        fn ceilings_hold_over_every_window(shape in shape(), reqs in proptest::collection::vec((0u64..2_000_000, 1u64..3 * MIB), 1..200)) {
            let mut s = Scheduler::new(shape.clone(), Duration::ZERO);
            let mut now = 0u64;
            let mut done: Vec<(u64, Charge)> = Vec::new();
            for (gap, bytes) in reqs {
                now += gap;
                let t = s.reserve(Duration::from_nanos(now), IoKind::Read, bytes).as_nanos() as u64;
                prop_assert!(t >= now);
                if let Some(&(last, _)) = done.last() {
                    prop_assert!(t >= last, "completions in order");
                }
                done.push((t, shape.charge(bytes)));
            }
            // Request i's service ends at done[i]; requests i..=j end within
            // [done[i], done[j]], so (all but the first's) charges fit in the rate.
            for i in 0..done.len() {
                for j in i + 1..done.len().min(i + 40) {
                    let span = (done[j].0 - done[i].0) as u128;
                    let ops: u128 = done[i + 1..=j].iter().map(|d| d.1.ops as u128).sum();
                    let bytes: u128 = done[i + 1..=j].iter().map(|d| d.1.bytes as u128).sum();
                    if let Some(r) = shape.iops {
                        prop_assert!(ops * 1_000_000_000 <= r as u128 * span + 1_000_000_000 + r as u128, "iops: {ops} ops in {span} ns at {r}/s");
                    }
                    if let Some(r) = shape.bps {
                        let cap = shape.op_size.unwrap_or(MIB).max(shape.byte_unit) as u128;
                        prop_assert!(bytes * 1_000_000_000 <= r as u128 * span + cap * 1_000_000_000 + r as u128, "bps: {bytes} B in {span} ns at {r}/s");
                    }
                }
            }
        }
    }
}

#[test]
fn volumes_sharing_an_instance_link_are_held_to_its_limit_together() {
    // Two volumes of 1,000 IOPS each behind a 1,000 IOPS instance link: 1,000
    // reads spread over both take a second, not half of one.
    let clock = Arc::new(VirtualClock::new());
    let vol = Shape { iops: Some(1_000), ..Shape::default() };
    let link: Link = Arc::new(Mutex::new(Scheduler::new(Shape { iops: Some(1_000), ..Shape::default() }, clock.now())));
    let devs: Vec<ModelDev> = (0..2).map(|_| ModelDev::new(Arc::new(MemoryDev::new(1 << 20)), clock.clone(), vol.clone()).with_link(Some(link.clone()))).collect();
    let mut buf = [0u8; 4096];
    for i in 0..1_000 {
        devs[i % 2].read_at(&mut buf, 0).unwrap();
    }
    assert!(clock.now() >= Duration::from_millis(998), "held to the link: {:?}", clock.now());
    // Without the link the two volumes serve 2,000 IOPS together.
    let clock = Arc::new(VirtualClock::new());
    let devs: Vec<ModelDev> = (0..2).map(|_| ModelDev::new(Arc::new(MemoryDev::new(1 << 20)), clock.clone(), vol.clone())).collect();
    for i in 0..1_000 {
        devs[i % 2].read_at(&mut buf, 0).unwrap();
    }
    assert!(clock.now() <= Duration::from_millis(500), "{:?}", clock.now());
}
