use super::*;
use surge_block::model::{KIB, TIB};

fn spec(s: &str) -> VolumeSpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn cfg(worth: Worth, block: u64) -> PlannerConfig {
    PlannerConfig::new(worth, block)
}

/// A checkpoint burst: `mibs` MiB/s of 1 MiB writes, `gib` GiB per burst.
fn throughput(mibs: f64, gib: f64, footprint: u64) -> Demand {
    Demand {
        iops: mibs,
        bps: mibs * MIB as f64,
        request: MIB,
        burst_bytes: (gib * GIB as f64) as u64,
        footprint,
        pre_provisioned: true,
    }
}

/// A small-write burst: `iops` requests/s of `request` bytes, `n` requests.
fn small_writes(iops: f64, request: u64, n: u64, footprint: u64) -> Demand {
    Demand { iops, bps: iops * request as f64, request, burst_bytes: n * request, footprint, pre_provisioned: true }
}

struct Case {
    name: &'static str,
    backing: &'static str,
    demand: Demand,
    worth: Worth,
    block: u64,
    want: Kind,
}

/// One case per type, each where that type is the cheapest that keeps up.
fn table() -> Vec<Case> {
    vec![
        Case {
            // CM1-like checkpoint: 12 GiB at 1,000 MiB/s through 64 KiB cache
            // blocks (16,000 I/Os per second): gp3 at its limits.
            name: "gp3: 1,000 MiB/s checkpoint",
            backing: "gp3:100GiB",
            demand: throughput(1_000.0, 12.0, 16 * GIB),
            worth: Worth::PerHour(0.34),
            block: 64 * KIB,
            want: Kind::Gp3,
        },
        Case {
            // 32,000 random 4 KiB writes per second: beyond gp3's 16,000.
            name: "io2: 32,000 IOPS bulk load",
            backing: "gp3:100GiB",
            demand: small_writes(32_000.0, 4 * KIB, 640_000, GIB),
            worth: Worth::PerHour(2.016),
            block: 4 * KIB,
            want: Kind::Io2,
        },
        Case {
            // 250 MiB/s into a 200 GiB cache: a fresh 200 GiB gp2 bursts to
            // 250 MiB/s for $20/month; gp3 needs $16 + 125 MiB/s x $0.04.
            name: "gp2: 250 MiB/s, 200 GiB footprint",
            backing: "gp3:1TiB",
            demand: throughput(250.0, 150.0, 200 * GIB),
            worth: Worth::PerHour(0.34),
            block: MIB,
            want: Kind::Gp2,
        },
        Case {
            // 1.5 TiB of large sequential writes at 500 MiB/s into a 2 TiB
            // cache: st1 at $0.045/GiB-month bursts to 500 MiB/s.
            name: "st1: 500 MiB/s, 2 TiB sequential",
            backing: "gp3:4TiB",
            demand: throughput(500.0, 1_536.0, 2 * TIB),
            worth: Worth::PerHour(1.0),
            block: MIB,
            want: Kind::St1,
        },
    ]
}

#[test]
fn each_type_is_chosen_where_it_is_cheapest() {
    let prices = PriceTable::default();
    for c in table() {
        let p = plan(&cfg(c.worth, c.block), &prices, &spec(c.backing), &c.demand);
        let got = p.choice.as_ref().unwrap_or_else(|| panic!("{}: declined: {}", c.name, p.reason));
        assert_eq!(got.kind, c.want, "{}: {}", c.name, p.reason);
        assert!(got.meets, "{}: the choice keeps up: {}", c.name, p.reason);
        // Cheapest among those that keep up, and compared with every type.
        assert_eq!(p.candidates.len(), 4, "{}", c.name);
        for o in p.candidates.iter().filter(|o| o.meets) {
            assert!(got.storage_usd <= o.storage_usd, "{}: {} cheaper than {}", c.name, o.spec, got.spec);
        }
        assert!(p.reason.contains("boost") && p.reason.contains("also considered"), "{}", p.reason);
    }
}

#[test]
fn gp3_is_provisioned_to_the_rate_it_must_take() {
    let c = &table()[0];
    let p = plan(&cfg(c.worth, c.block), &PriceTable::default(), &spec(c.backing), &c.demand);
    let s = &p.choice.unwrap().spec;
    // 1,000 MiB/s in 64 KiB cache I/Os is 16,000 I/Os per second.
    assert_eq!(s.model, VolumeModel::Gp3 { iops: Some(16_000), throughput: Some(1_000 * MIB) });
    assert_eq!(s.size, 32 * GIB, "16,000 IOPS need 32 GiB at 500 IOPS/GiB");
}

#[test]
fn io2_cache_is_lowered_to_baseline_gp3_for_the_drain() {
    let c = &table()[1];
    let p = plan(&cfg(c.worth, c.block), &PriceTable::default(), &spec(c.backing), &c.demand);
    let ch = p.choice.unwrap();
    assert_eq!(ch.spec.model, VolumeModel::Io2 { iops: 32_000 });
    assert_eq!(ch.spec.size, 32 * GIB, "1,000 IOPS/GiB");
    // 1 GiB of 4 KiB blocks drains at the backing's 3,000 IOPS: 87 s, 52 s
    // after the 35 s settle time: worth a modification to plain gp3.
    assert_eq!(ch.drain_spec, Some(spec("gp3:32GiB")), "{}", p.reason);
    let drain = (GIB / (4 * KIB)) as f64 / 3_000.0 - 35.0 + 3.0;
    assert!((ch.drain_s - drain).abs() < 0.01, "{} vs {drain}", ch.drain_s);
    // Without the modification it would cost more.
    let kept = plan(&PlannerConfig { lower_for_drain: false, ..cfg(c.worth, c.block) }, &PriceTable::default(), &spec(c.backing), &c.demand);
    assert!(kept.choice.unwrap().storage_usd > ch.storage_usd * 1.5);
}

#[test]
fn storage_dollars_follow_the_meter_with_its_60_s_minimum() {
    let prices = PriceTable::default();
    // A short burst: 1 GiB at 1,000 MiB/s, learned period (lead 13 s).
    let d = throughput(1_000.0, 1.0, GIB);
    let c = PlannerConfig { settle: Duration::from_secs(10), lower_for_drain: false, ..cfg(Worth::PerHour(10.0), 64 * KIB) };
    let p = plan(&c, &prices, &spec("gp3:100GiB"), &d);
    let ch = p.choice.unwrap();
    let month = prices.usd_month(&ch.spec);
    // 13 s lead + 1.024 s burst + 10 s settle; 1 GiB drains at 125 MiB/s in
    // 8.19 s, all within the settle time, then the 3 s detach: 27 s, billed 60.
    assert!((ch.boost_s - (13.0 + 1.024 + 10.0)).abs() < 1e-6, "{}", ch.boost_s);
    assert!((ch.drain_s - 3.0).abs() < 1e-6);
    assert!((ch.storage_usd - month * 60.0 / 2_592_000.0).abs() < 1e-12, "{} vs 60 s of {month}", ch.storage_usd);
}

#[test]
fn a_boost_worth_less_than_its_price_is_declined() {
    let c = &table()[0];
    let prices = PriceTable::default();
    let backing = spec(c.backing);
    // Compute at a tenth of a cent per hour: the time saved is worth less.
    let p = plan(&cfg(Worth::PerHour(0.001), c.block), &prices, &backing, &c.demand);
    assert!(p.choice.is_none(), "{}", p.reason);
    assert!(p.reason.starts_with("no boost") && p.reason.contains("costs more than"), "{}", p.reason);
    assert_eq!(p.candidates.len(), 4, "the comparison is kept for the log");
    // Time not worth anything: never boost.
    assert!(plan(&cfg(Worth::PerHour(0.0), c.block), &prices, &backing, &c.demand).choice.is_none());
    // The iops case at an r5.2xlarge's $0.504/h: io2 costs more than the 193 s saved.
    let io = &table()[1];
    let p = plan(&cfg(Worth::PerHour(0.504), io.block), &prices, &spec(io.backing), &io.demand);
    assert!(p.choice.is_none(), "{}", p.reason);
    let p = plan(&cfg(Worth::PerHour(2.016), io.block), &prices, &spec(io.backing), &io.demand);
    assert!(p.choice.is_some(), "{}", p.reason);
}

#[test]
fn a_burst_that_ends_before_the_cache_arrives_is_not_boosted() {
    let mut d = throughput(1_000.0, 0.5, 16 * GIB);
    d.pre_provisioned = false;
    // 512 MiB at 125 MiB/s: 4.1 s, before detection (5 s) + attach (3 s).
    let p = plan(&cfg(Worth::PerHour(100.0), 64 * KIB), &PriceTable::default(), &spec("gp3:100GiB"), &d);
    assert!(p.choice.is_none() && p.reason.contains("before a cache could be attached"), "{}", p.reason);
}

#[test]
fn an_unpredicted_burst_runs_on_the_backing_until_the_cache_is_attached() {
    let mut d = throughput(1_000.0, 12.0, 16 * GIB);
    let c = cfg(Worth::PerHour(0.34), 64 * KIB);
    let pre = plan(&c, &PriceTable::default(), &spec("gp3:100GiB"), &d).choice.unwrap();
    d.pre_provisioned = false;
    let late = plan(&c, &PriceTable::default(), &spec("gp3:100GiB"), &d).choice.unwrap();
    // 8 s on the backing (1,000 MiB) then 11,288 MiB at 1,000 MiB/s.
    assert!((pre.burst_s - 12.288).abs() < 1e-6, "{}", pre.burst_s);
    assert!((late.burst_s - (8.0 + 11.288)).abs() < 1e-6, "{}", late.burst_s);
}

#[test]
fn a_completion_target_buys_the_cheapest_boost_that_meets_it() {
    let d = throughput(1_000.0, 12.0, 16 * GIB);
    let backing = spec("gp3:100GiB");
    let prices = PriceTable::default();
    // 98.3 s on the backing alone: a 120 s target needs no boost.
    let p = plan(&cfg(Worth::Deadline(120.0), 64 * KIB), &prices, &backing, &d);
    assert!(p.choice.is_none() && p.reason.contains("target"), "{}", p.reason);
    // A 40 s target: 307 MiB/s is enough; the cheapest that meets it is slower than 1,000 MiB/s.
    let p = plan(&cfg(Worth::Deadline(40.0), 64 * KIB), &prices, &backing, &d);
    let ch = p.choice.unwrap();
    assert!(ch.meets && ch.burst_s <= 40.0, "{}", p.reason);
    let fast = plan(&cfg(Worth::Deadline(13.0), 64 * KIB), &prices, &backing, &d).choice.unwrap();
    assert!(ch.storage_usd < fast.storage_usd, "{} vs {}", ch.spec, fast.spec);
}

#[test]
fn demand_beyond_every_type_gets_the_cheapest_in_total() {
    // 300,000 IOPS: more than io2's 256,000.
    let d = small_writes(300_000.0, 4 * KIB, 6_000_000, GIB);
    let p = plan(&cfg(Worth::PerHour(50.0), 4 * KIB), &PriceTable::default(), &spec("gp3:100GiB"), &d);
    assert!(p.candidates.iter().all(|c| !c.meets));
    let ch = p.choice.unwrap();
    assert_eq!(ch.spec.model, VolumeModel::Io2 { iops: 256_000 }, "{}", p.reason);
    assert!(p.reason.contains("no type keeps up"), "{}", p.reason);
}

#[test]
fn served_rate_counts_cache_blocks() {
    // 16 KiB requests on 4 KiB blocks: four I/Os each.
    assert!((served_rate(&spec("io2:32GiB,iops=32000"), 16 * KIB, 4 * KIB) - 8_000.0).abs() < 1e-9);
    // 1 MiB requests on 64 KiB blocks, gp3 at 1,000 MiB/s and 16,000 IOPS.
    assert!((served_rate(&spec("gp3:32GiB,iops=16000,throughput=1000MiB/s"), MIB, 64 * KIB) - 1_000.0).abs() < 1e-9);
}

mod limits {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Whatever the demand, every spec the planner names is one the cloud
        /// accepts, within the type's limits and AWS's IOPS-per-GiB ratios, and
        /// a drain spec never changes the size of an attached volume.
        #[test]
        fn never_exceeds_a_types_limits(
            iops in 1.0f64..400_000.0,
            req_kib in prop::sample::select(vec![4u64, 8, 16, 64, 256, 1024, 4096]),
            block_kib in prop::sample::select(vec![4u64, 16, 64, 256, 1024]),
            burst_mib in 1u64..4_000_000,
            footprint_mib in 1u64..20_000_000,
            worth in 0.0f64..100.0,
            pre in any::<bool>(),
        ) {
            let request = req_kib * KIB;
            let d = Demand { iops, bps: iops * request as f64, request, burst_bytes: burst_mib * MIB, footprint: footprint_mib * MIB, pre_provisioned: pre };
            let p = plan(&cfg(Worth::PerHour(worth), block_kib * KIB), &PriceTable::default(), &spec("gp3:100GiB"), &d);
            for c in p.candidates.iter().chain(p.choice.iter()) {
                for s in std::iter::once(&c.spec).chain(c.drain_spec.iter()) {
                    prop_assert!(s.shape().is_ok(), "{s}");
                    prop_assert!(s.warnings().is_empty(), "{s}: {:?}", s.warnings());
                    match s.model {
                        VolumeModel::Gp3 { iops, throughput } => {
                            prop_assert!(iops.unwrap_or(3_000) <= 16_000 && throughput.unwrap_or(125 * MIB) <= 1_000 * MIB);
                        }
                        VolumeModel::Io2 { iops } => prop_assert!(iops <= 256_000 && s.size <= 64 * TIB),
                        VolumeModel::Gp2 | VolumeModel::St1 => prop_assert!(s.size <= 16 * TIB),
                        ref m => prop_assert!(false, "unexpected type {m:?}"),
                    }
                    prop_assert!(s.size >= d.footprint, "{s} holds the footprint");
                }
                if let Some(ds) = &c.drain_spec {
                    prop_assert_eq!(ds.size, c.spec.size);
                }
                prop_assert!(c.storage_usd > 0.0 && c.burst_s.is_finite());
            }
        }
    }
}

#[test]
fn no_cache_volume_is_provisioned_beyond_the_instances_ebs_limits() {
    // 32,000 writes/s of 4-16 KiB (6 KiB mean) on 4 KiB blocks are 48,000
    // cache I/Os per second: beyond an r5.12xlarge's 40,000 EBS IOPS.
    let d = small_writes(32_000.0, 6 * KIB, 640_000, GIB);
    let free = plan(&cfg(Worth::PerHour(3.024), 4 * KIB), &PriceTable::default(), &spec("gp3:100GiB"), &d);
    let iops = |p: &Plan| p.choice.as_ref().and_then(|c| c.spec.shape().ok()).and_then(|s| s.iops).unwrap_or(0);
    assert!(iops(&free) > 40_000, "without the instance: {}", free.reason);
    let mut c = cfg(Worth::PerHour(3.024), 4 * KIB);
    c.instance = Some(PriceTable::default().instance_ebs("r5.12xlarge").unwrap().sustained());
    let held = plan(&c, &PriceTable::default(), &spec("gp3:100GiB"), &d);
    assert!(iops(&held) <= 40_000, "{}", held.reason);
    // What the instance lets through is what keeps up: io2 at its 40,000.
    let got = held.choice.as_ref().unwrap_or_else(|| panic!("declined: {}", held.reason));
    assert!(got.meets && got.kind == Kind::Io2 && iops(&held) == 40_000, "{}", held.reason);
    assert!(held.candidates.iter().all(|k| k.spec.shape().unwrap().iops.unwrap_or(0) <= 40_000), "{:?}", held.candidates.iter().map(|k| k.spec.to_string()).collect::<Vec<_>>());
}
