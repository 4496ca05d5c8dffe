//! Scheduler tests on virtual time with exact counts (in the manner of ceph's
//! dmclock tests), then the blocking layer with real threads.

use super::sim::{Device, Event, Load, Sim};
use super::*;
use crate::clock::{SystemClock, VirtualClock};
use crate::memory::MemoryDev;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn sched(depth: usize, weights: &[u32]) -> Scheduler {
    let mut s = Scheduler::new(SchedConfig { depth, ..Default::default() });
    for &weight in weights {
        s.add_tenant(TenantConfig { weight, ..Default::default() });
    }
    s
}

/// One server at 100 MiB/s: a 1 MiB request takes exactly 10 ms.
const DISK: Device = Device { servers: 1, bytes_per_sec: 100 * MIB, fixed: Duration::ZERO };

/// Dispatch and complete one request at a time; the tenants dispatched, in order.
fn serve_one_by_one(s: &mut Scheduler, n: usize, now: Duration) -> Vec<TenantId> {
    (0..n)
        .map(|_| {
            let d = s.dispatch(now).expect("backlogged");
            assert!(s.dispatch(now).is_none(), "depth 1 allows one outstanding request");
            s.complete(d.req, now);
            d.tenant
        })
        .collect()
}

fn count(order: &[TenantId], t: TenantId) -> usize {
    order.iter().filter(|&&x| x == t).count()
}

#[test]
fn weights_1_to_2_over_a_backlog_give_exactly_1_to_2_service() {
    let mut s = sched(1, &[1, 2]);
    for _ in 0..40 {
        s.enqueue(0, 4096, Duration::ZERO);
        s.enqueue(1, 4096, Duration::ZERO);
    }
    let order = serve_one_by_one(&mut s, 60, Duration::ZERO);
    for (i, chunk) in order.chunks(3).enumerate() {
        assert_eq!(count(chunk, 0), 1, "round {i}: {chunk:?}");
        assert_eq!(count(chunk, 1), 2, "round {i}: {chunk:?}");
    }
    assert_eq!(s.counters(0).completed_cost * 2, s.counters(1).completed_cost);
}

#[test]
fn weights_1_to_2_with_closed_loop_streams_and_depth_2() {
    let mut sim = Sim::new(sched(2, &[1, 2]), DISK, vec![Load::new(0, 4, MIB), Load::new(1, 4, MIB)]);
    sim.run(secs(10), |s, _, e| {
        if let Event::Dispatched(_) = e {
            let (a, b) = (s.counters(0).dispatched as i64, s.counters(1).dispatched as i64);
            assert!((2 * a - b).abs() <= 2, "dispatched {a}:{b}");
        }
    });
    // 10 s at 10 ms per request: exactly 1000 complete, one third to tenant 0.
    let (a, b) = (sim.sched.counters(0).completed, sim.sched.counters(1).completed);
    assert_eq!(a + b, 1000);
    assert!((333..=334).contains(&a), "tenant 0 completed {a}");
}

/// Jin et al.'s SFQ(D) bound: over any interval in which both are backlogged,
/// |W_f/w_f - W_g/w_g| <= (D+1) (cmax_f/w_f + cmax_g/w_g).
#[test]
fn sfq_d_fairness_bound_holds_after_every_completion() {
    let sizes_a = vec![4 * KIB, 64 * KIB, MIB, 256 * KIB, 16 * KIB, 512 * KIB];
    let sizes_b = vec![MIB, 128 * KIB, 8 * KIB];
    let (wa, wb) = (3u32, 1u32);
    for depth in [1usize, 2, 4, 8, 16] {
        let dev = Device { servers: 4, bytes_per_sec: 100 * MIB, fixed: Duration::from_micros(200) };
        let mut a = Load::new(0, 24, 0);
        a.sizes = sizes_a.clone();
        let mut b = Load::new(1, 24, 0);
        b.sizes = sizes_b.clone();
        let mut sim = Sim::new(sched(depth, &[wa, wb]), dev, vec![a, b]);
        // Normalised service, scaled by wa*wb to stay in integers.
        let (mut lo, mut hi, mut checks) = (0i128, 0i128, 0);
        let bound = (depth as i128 + 1) * (MIB as i128 * wb as i128 + MIB as i128 * wa as i128);
        sim.run(secs(5), |s, _, e| {
            if let Event::Completed { .. } = e {
                let x = s.counters(0).completed_cost as i128 * wb as i128 - s.counters(1).completed_cost as i128 * wa as i128;
                lo = lo.min(x);
                hi = hi.max(x);
                assert!(hi - lo <= bound, "D={depth}: spread {} over bound {bound}", hi - lo);
                checks += 1;
            }
        });
        assert!(checks > 1000, "D={depth}: only {checks} completions");
    }
}

#[test]
fn a_returning_idle_tenant_gets_no_catch_up_burst() {
    let mut b = Load::new(1, 4, MIB);
    b.start = secs(5);
    let mut sim = Sim::new(sched(1, &[1, 1]), DISK, vec![Load::new(0, 4, MIB), b]);
    sim.run(secs(5) - ms(1), |_, _, _| {});
    assert_eq!(sim.sched.counters(1).dispatched, 0);
    let a0 = sim.sched.counters(0).dispatched as i64;
    // From B's return on, B may lead A by one request at most, never by 500.
    sim.run(secs(10), |s, _, e| {
        if let Event::Dispatched(_) = e {
            let a = s.counters(0).dispatched as i64 - a0;
            let b = s.counters(1).dispatched as i64;
            assert!(b - a <= 1 && a - b <= 2, "after return: A {a}, B {b}");
        }
    });
    assert_eq!(sim.sched.counters(1).completed, 250);
}

#[test]
fn reservations_are_met_even_against_a_heavier_weight() {
    let mut s = sched(1, &[9]);
    s.add_tenant(TenantConfig { weight: 1, reservation: Some(64 * MIB), limit: None });
    let mut sim = Sim::new(s, DISK, vec![Load::new(0, 4, MIB), Load::new(1, 4, MIB)]);
    sim.run(secs(10), |s, now, e| {
        if let Event::Completed { .. } = e {
            // Owed 64 MiB/s from t=0; at most one request and one service time behind.
            let owed = (now.as_secs_f64() * 64.0) as u64 * MIB;
            assert!(s.counters(1).completed_cost + 2 * MIB >= owed, "at {now:?}: {}", s.counters(1).completed_cost);
        }
    });
    // R tags fall every 1/64 s: 641 are due in [0, 10 s], each served at the
    // next 10 ms slot; the weight-9 tenant gets every other slot.
    let c = sim.sched.counters(1);
    assert_eq!(c.dispatched, 641);
    assert_eq!(c.by_reservation, 641);
    assert_eq!(sim.sched.counters(0).completed + c.completed, 1000);
}

#[test]
fn a_reservation_below_the_weighted_share_takes_nothing_extra() {
    let mut s = sched(1, &[1]);
    s.add_tenant(TenantConfig { weight: 1, reservation: Some(10 * MIB), limit: None });
    let mut sim = Sim::new(s, DISK, vec![Load::new(0, 4, MIB), Load::new(1, 4, MIB)]);
    sim.run(secs(10), |_, _, _| {});
    let (a, b) = (sim.sched.counters(0).completed, sim.sched.counters(1).completed);
    assert_eq!(a + b, 1000);
    assert!(a.abs_diff(b) <= 1, "{a}:{b}");
    assert_eq!(sim.sched.counters(1).by_reservation, 1, "only the first request, before any share existed");
}

/// mClock limits: L tags are spaced cost/limit apart from the first request, and
/// nothing is dispatched before its tag. So by any time t the tenant has had at
/// most one request plus limit x t, and (since a late dispatch may be followed by
/// the next tag at once) no window holds more than two requests plus its share.
#[test]
fn limits_are_never_exceeded_and_the_rest_goes_to_others() {
    let mut s = sched(2, &[1]);
    s.add_tenant(TenantConfig { weight: 9, reservation: None, limit: Some(32 * MIB) });
    let mut times = Vec::new();
    let mut sim = Sim::new(s, DISK, vec![Load::new(0, 4, MIB), Load::new(1, 4, MIB)]);
    sim.run(secs(10), |s, now, e| {
        if let Event::Dispatched(d) = e {
            if d.tenant == 1 {
                times.push(now);
                let allowed = MIB + (now.as_secs_f64() * 32.0 * MIB as f64) as u64;
                assert!(s.counters(1).dispatched_cost <= allowed, "at {now:?}");
            }
        }
    });
    for i in 0..times.len() {
        for j in i..times.len() {
            let n = (j - i + 1) as f64;
            let allowed = 2.0 + (times[j] - times[i]).as_secs_f64() * 32.0;
            assert!(n <= allowed + 1e-9, "{n} requests in [{:?}, {:?}]", times[i], times[j]);
        }
    }
    // L tags at k/32 s: 321 fall in [0, 10 s] and all are served by then.
    assert_eq!(times.len(), 321);
    // The weight-1 tenant is work-conserved the rest: the device never idles.
    let (a, b) = (sim.sched.counters(0).completed, sim.sched.counters(1).completed);
    assert!(a + b >= 999, "device idled: {a} + {b}");
}

#[test]
fn a_limited_tenant_waits_even_on_an_idle_device() {
    let mut s = Scheduler::new(SchedConfig { depth: 4, ..Default::default() });
    s.add_tenant(TenantConfig { weight: 1, reservation: None, limit: Some(64 * MIB) });
    let mut sim = Sim::new(s, DISK, vec![Load::new(0, 4, MIB)]);
    sim.run(secs(10), |_, _, _| {});
    assert_eq!(sim.sched.counters(0).dispatched, 641, "k/64 s for k = 0..=640");
}

#[test]
fn weight_changes_take_effect_at_once() {
    let mut s = sched(1, &[1, 1]);
    for _ in 0..60 {
        s.enqueue(0, 4096, Duration::ZERO);
        s.enqueue(1, 4096, Duration::ZERO);
    }
    let before = serve_one_by_one(&mut s, 20, Duration::ZERO);
    assert_eq!(count(&before, 0), 10);
    s.set_tenant(0, TenantConfig { weight: 3, ..Default::default() }, Duration::ZERO);
    let after = serve_one_by_one(&mut s, 40, Duration::ZERO);
    assert_eq!(count(&after, 0), 30, "{after:?}");
}

#[test]
fn depth_is_never_exceeded_and_changes_live() {
    let dev = Device { servers: 8, ..DISK };
    let mut sim = Sim::new(sched(4, &[1, 1]), dev, vec![Load::new(0, 16, MIB), Load::new(1, 16, MIB)]);
    let mut max = 0;
    sim.run(secs(1), |s, _, e| {
        if let Event::Dispatched(_) = e {
            max = max.max(s.outstanding());
        }
    });
    assert_eq!(max, 4);
    sim.sched.set_depth(16);
    max = 0;
    sim.run(secs(2), |s, _, e| {
        if let Event::Dispatched(_) = e {
            assert!(s.outstanding() <= s.depth());
            max = max.max(s.outstanding());
        }
    });
    assert_eq!(max, 16);
}

#[test]
fn overhead_makes_small_requests_cost_more() {
    // With 60 KiB of overhead a 4 KiB request costs 64 KiB, as much as a 4 KiB +
    // 60 KiB one; equal weights then give equal request counts, not equal bytes.
    let mut s = Scheduler::new(SchedConfig { depth: 1, overhead: 60 * KIB, ..Default::default() });
    s.add_tenant(TenantConfig::default());
    s.add_tenant(TenantConfig::default());
    for _ in 0..40 {
        s.enqueue(0, 4 * KIB, Duration::ZERO);
        s.enqueue(1, 68 * KIB, Duration::ZERO);
    }
    let order = serve_one_by_one(&mut s, 30, Duration::ZERO);
    // Costs 64 KiB vs 128 KiB: two small for each large.
    assert_eq!(count(&order, 0), 20);
}

fn adaptive(target_us: u64, max_depth: usize) -> AdaptiveConfig {
    AdaptiveConfig { min_depth: 1, max_depth, latency_target_us: target_us, window: 64, fairness_tolerance: 0.05 }
}

/// Completions per tenant within [from, until].
fn completions_between(sim: &mut Sim, until: Duration, from: Duration) -> [u64; 2] {
    let mut n = [0u64; 2];
    sim.run(until, |_, now, e| {
        if let Event::Completed { tenant, .. } = e {
            if now >= from {
                n[tenant] += 1;
            }
        }
    });
    n
}

#[test]
fn adaptive_depth_rises_while_latency_stays_under_target() {
    // 8 servers, 0.64 ms per 64 KiB request: latency stays flat up to D=8, then
    // requests queue in the device. Target 2 ms: D should settle between.
    let dev = Device { servers: 8, bytes_per_sec: 100 * MIB, fixed: Duration::ZERO };
    let mut s = Scheduler::new(SchedConfig { depth: 1, adaptive: Some(adaptive(2_000, 64)), ..Default::default() });
    s.add_tenant(TenantConfig::default());
    s.add_tenant(TenantConfig::default());
    let mut sim = Sim::new(s, dev, vec![Load::new(0, 32, 64 * KIB), Load::new(1, 32, 64 * KIB)]);
    let mut worst = Duration::ZERO;
    sim.run(secs(5), |_, _, _| {});
    sim.run(secs(6), |_, _, e| {
        if let Event::Completed { latency, .. } = e {
            worst = worst.max(latency);
        }
    });
    let d = sim.sched.depth();
    assert!((8..=32).contains(&d), "settled at D={d}");
    assert!(worst <= ms(3), "latency {worst:?} well over target");
    // All 8 servers busy: 8 x 100 MiB/s / 64 KiB = 12800 requests/s.
    let done = completions_between(&mut sim, secs(7), secs(6));
    assert!(done[0] + done[1] >= 12_800 * 95 / 100, "throughput {done:?}");
}

#[test]
fn adaptive_depth_backs_off_when_latency_exceeds_target() {
    // One server with a FIFO: latency grows by 10 ms per outstanding request.
    let mut s = Scheduler::new(SchedConfig { depth: 16, adaptive: Some(adaptive(25_000, 64)), ..Default::default() });
    s.add_tenant(TenantConfig::default());
    let mut sim = Sim::new(s, DISK, vec![Load::new(0, 32, MIB)]);
    sim.run(secs(30), |_, _, _| {});
    assert!(sim.sched.depth() <= 3, "D={}", sim.sched.depth());
}

#[test]
fn adaptive_depth_falls_when_fairness_would_suffer() {
    // 4 streams each at 4:1 on 8 servers: with D=8 every request is at the device
    // at once and the split is 1:1 whatever the weights.
    let dev = Device { servers: 8, ..DISK };
    let loads = || vec![Load::new(0, 4, MIB), Load::new(1, 4, MIB)];
    let fixed = Sim::new(sched(8, &[4, 1]), dev, loads());
    let mut fixed = fixed;
    let n = completions_between(&mut fixed, secs(20), secs(10));
    assert!(n[0] <= n[1] + 1, "fixed D=8 split {n:?}");

    let mut s = Scheduler::new(SchedConfig { depth: 8, adaptive: Some(adaptive(1_000_000, 64)), ..Default::default() });
    s.add_tenant(TenantConfig { weight: 4, ..Default::default() });
    s.add_tenant(TenantConfig { weight: 1, ..Default::default() });
    let mut sim = Sim::new(s, dev, loads());
    let n = completions_between(&mut sim, secs(20), secs(10));
    assert!(sim.sched.depth() < 8, "D={}", sim.sched.depth());
    let ratio = n[0] as f64 / n[1] as f64;
    assert!(ratio >= 3.6, "adaptive split {n:?} = {ratio:.2}");
}

// ---- the blocking layer ----

fn mem_queue(size: u64, depth: usize) -> Arc<FairQueue> {
    FairQueue::new(Arc::new(MemoryDev::new(size)), SchedConfig { depth, ..Default::default() }, Arc::new(SystemClock::new()))
}

#[test]
fn each_tenant_handle_passes_conformance() {
    crate::conformance::run("fairq-tenant", |size| {
        let q = mem_queue(size, 1);
        q.tenant("other", TenantConfig { weight: 3, ..Default::default() });
        q.tenant("me", TenantConfig::default())
    });
}

#[test]
fn handles_of_one_tenant_name_share_one_share() {
    let q = mem_queue(1 << 20, 2);
    let a = q.tenant("a", TenantConfig { weight: 4, ..Default::default() });
    let again = q.tenant("a", TenantConfig { weight: 1, ..Default::default() });
    assert_eq!(a.id(), again.id());
    assert_eq!(q.tenant_config("a").unwrap().weight, 4);
    assert_eq!(q.tenant_names(), vec!["a".to_string()]);
    assert!(q.set_tenant("nobody", TenantConfig::default()).is_err());
}

#[test]
fn threads_on_two_tenants_share_by_weight() {
    let q = mem_queue(64 << 20, 1);
    let heavy = q.tenant("heavy", TenantConfig { weight: 3, ..Default::default() });
    let light = q.tenant("light", TenantConfig { weight: 1, ..Default::default() });
    let stop = Arc::new(AtomicBool::new(false));
    // Start all eight together so both tenants are backlogged from the first request.
    let go = Arc::new(std::sync::Barrier::new(8));
    let mut threads = Vec::new();
    for (i, t) in [heavy, light].into_iter().enumerate() {
        for k in 0..4u64 {
            let (t, stop, go) = (t.clone(), stop.clone(), go.clone());
            threads.push(std::thread::spawn(move || {
                let buf = vec![i as u8 + 1; 64 * 1024];
                go.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    t.write_at(&buf, ((k * 64 + n % 64) * 65536) % (64 << 20), false).unwrap();
                    n += 1;
                }
            }));
        }
    }
    // Stop once the heavy tenant has done 20000 writes.
    while q.stats().tenants[0].ops < 20_000 {
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    let st = q.stats();
    let ratio = st.tenants[0].bytes as f64 / st.tenants[1].bytes as f64;
    // Real threads on a shared, noisy machine: a descheduled thread leaves its
    // tenant briefly idle (and SFQ rightly gives no catch-up), so allow slack here;
    // the exact 3:1 is asserted on virtual time above. 1:1 would still fail.
    assert!((2.2..=4.0).contains(&ratio), "heavy:light = {ratio:.2} ({:?})", st.tenants);
    assert_eq!(st.outstanding, 0);
    assert_eq!(st.tenants[1].queued + st.tenants[1].in_flight, 0);
}

#[test]
fn a_limited_tenant_blocks_until_its_time_comes() {
    let clock = Arc::new(VirtualClock::new());
    let q = FairQueue::new(Arc::new(MemoryDev::new(1 << 20)), SchedConfig::default(), clock.clone());
    let t = q.tenant("slow", TenantConfig { weight: 1, reservation: None, limit: Some(4096) });
    let writer = {
        let t = t.clone();
        std::thread::spawn(move || {
            for i in 0..3 {
                t.write_at(&[7u8; 4096], i * 4096, false).unwrap();
            }
        })
    };
    // The first write goes at once; the second waits for the L tag at t = 1 s.
    let wait_for = |queued: usize, ops: u64| {
        while !(q.stats().tenants[0].queued == queued && q.stats().tenants[0].ops == ops) {
            std::thread::yield_now();
        }
    };
    wait_for(1, 1);
    clock.advance(ms(999));
    q.kick();
    assert_eq!(q.stats().tenants[0].ops, 1, "released before its L tag");
    clock.advance(ms(1));
    q.kick();
    wait_for(1, 2);
    clock.advance(secs(1));
    q.kick();
    writer.join().unwrap();
    assert_eq!(q.stats().tenants[0].ops, 3);
}

#[test]
fn live_changes_show_in_stats() {
    let q = mem_queue(1 << 20, 2);
    let t = q.tenant("a", TenantConfig::default());
    t.write_at(&[1u8; 8192], 0, false).unwrap();
    let mut buf = [0u8; 4096];
    t.read_at(&mut buf, 4096).unwrap();
    q.set_tenant("a", TenantConfig { weight: 5, reservation: Some(1 << 20), limit: Some(100 << 20) }).unwrap();
    q.set_depth(7);
    let st = q.stats();
    assert_eq!(st.depth, 7);
    assert_eq!(st.tenants[0].config.weight, 5);
    assert_eq!(st.tenants[0].config.limit, Some(100 << 20));
    assert_eq!(st.tenants[0].ops, 2);
    assert_eq!(st.tenants[0].bytes, 12288);
    assert!(st.tenants[0].recent.iops > 0.0);
}

// Issue 38 item 4: peers' figures come off the network; any value is taken
// without panicking (release builds check overflow) and the other tenants
// keep being served.
#[test]
fn huge_credits_from_peers_saturate_instead_of_overflowing() {
    let mut s = Scheduler::new(SchedConfig { depth: 1, global: Some(GlobalConfig::default()), ..Default::default() });
    s.add_tenant(TenantConfig { weight: 1, reservation: Some(MIB), limit: Some(64 * MIB) });
    s.add_tenant(TenantConfig::default());
    // Credited while idle (pending), then again with a head queued.
    for _ in 0..3 {
        s.credit(0, u64::MAX, u64::MAX);
    }
    s.enqueue(0, 4096, ms(1));
    s.enqueue(1, 4096, ms(1));
    for _ in 0..3 {
        s.credit(0, u64::MAX, u64::MAX);
        s.set_remote_busy(0, 1);
    }
    let order = serve_one_by_one(&mut s, 1, ms(1));
    assert_eq!(order, [1], "the other tenant goes first");
    for i in 0..4 {
        s.enqueue(1, 4096, ms(2 + i));
        s.credit(1, u64::MAX, 0);
    }
    while let Some(d) = s.dispatch(ms(10)) {
        s.complete(d.req, ms(10));
    }
    assert_eq!(s.counters(0).remote_cost, u64::MAX, "the counter saturates");
}
