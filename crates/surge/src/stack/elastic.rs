//! `elastic:` exports: the spec parsing and wiring of an elastic volume. The
//! controller itself ([`ElasticVolume`]: cache layer, policy ticks, cache
//! volumes through the provider) is `surge_controller::elastic`, shared with
//! the simulator.

pub use surge_controller::elastic::*;

use std::sync::Arc;
use std::time::Duration;
use crate::control::Controllable;
use surge_block::fault::FaultRules;
use surge_block::BlockDev;
use surge_cloud::Provider;
use surge_policy::ElasticConfig;

/// The policy of a full-scale spec on a local cloud at `local`'s scale
/// (`surge_controller::elastic::scaled_policy`).
pub(crate) fn scaled_policy(pol: ElasticConfig, local: &crate::stack::volume::LocalCloud, attach_delay: Duration) -> ElasticConfig {
    surge_controller::elastic::scaled_policy(pol, local.scale, attach_delay)
}
/// `elastic:backing=TYPE:SIZE[,bw=..,iops=..,lat=..],cache=reserved,cache_bw=RATE[,ut=0.3,window=5s,
/// id=30s,initial=10GiB,min=1GiB,max=64GiB,granularity=1GiB,block=64KiB,learn=true,attach_delay=3s,
/// mode=writeback,seq_bypass=SIZE,backing_fault.RULE,cache_fault.RULE]`. Keys after `backing=` that
/// describe a volume (`bw`, `iops`, `lat`) belong to the backing volume. `backing_fault.RULE` and
/// `cache_fault.RULE` (repeatable) put the backing volume and every cache volume behind the fault
/// layer, one rule of `surge_block::fault` each (`cache_fault.write.fail_prob=0.01`,
/// `backing_fault.volatile`, `cache_fault.vanish_after=5000`). Volumes live in the daemon's cloud
/// (`--provider aws`: EBS, at full scale) or else the local cloud of the data directory; the fence
/// record in `DATA/elastic/NAME.fences.json`. The backing's utilization is measured against what
/// its type provides now (gp3/io2: provisioned; gp2/st1/sc1: burst while credits last
/// [`CREDIT_HORIZON`], down to the baseline), and `attach_delay` is only the first estimate of
/// provisioning time: the controller learns it from the attaches it sees.
/// `cache=auto,value_per_hour=USD` (or `target=DURATION`) lets the planner choose each cache
/// volume by price (`types=gp3+io2+gp2+st1,max_iops=N,max_throughput=RATE,lower=true`); the
/// backing may then be any type with a throughput limit (e.g. `gp3:100GiB`).
pub fn build_elastic(name: &str, args: &str, ctx: &crate::stack::BuildContext) -> Result<crate::stack::Built, crate::stack::SpecError> {
    let err = |msg: String| crate::stack::SpecError::Args { kind: "elastic".into(), msg };
    // Parsed and given the daemon's defaults in surge-controller, so that
    // `surge plan workload` simulates exactly the spec it prints.
    let spec = ElasticSpec::parse(args).map_err(err)?;
    if ctx.cloud.is_some() && !spec.auto {
        return Err(err("cache=reserved volumes exist only in the local cloud; on a real cloud (--provider aws) use cache=auto,target=DURATION or value_per_hour=USD".into()));
    }
    let (provider, p): (Arc<dyn Provider>, _) = match &ctx.cloud {
        Some(cloud) => (cloud.clone(), spec.params(name, Cloud::Real, Some(&ctx.data_dir))),
        None => {
            let local = ctx.local;
            let cfg = local.config(&ctx.data_dir, spec.delays());
            let p = spec.params(name, Cloud::Local { scale: local.scale, instance: local.instance, attach_delay: cfg.delays.attach }, Some(&ctx.data_dir));
            (Arc::new(surge_cloud::LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?), p)
        }
    };
    let (cache_bw, faults, auto) = (spec.cache_bw, spec.faults.clone(), spec.auto);
    // A stripe backing (`backing=burstable:SIZE,members=N`): its members' spec is `spec.backing`.
    let backing = match &spec.stripe {
        Some(bp) => format!("a burstable stripe of {} x {}", bp.members, bp.member),
        None => spec.backing.to_string(),
    };
    let on_cloud = ctx.cloud.is_some();
    let vol = ElasticVolume::open(p, provider, ctx.clock.clone()).map_err(|e| err(format!("{e:#}")))?;
    vol.start();
    let rules = |r: &Option<FaultRules>| r.as_ref().map(|r| r.to_string());
    let detail = serde_json::json!({
        "backing": backing, "backing_volume": vol.backing_id(), "cache_bw": cache_bw,
        "backing_fault": rules(&faults.backing), "cache_fault": rules(&faults.cache),
    });
    let mut controls: Vec<Arc<dyn Controllable>> = vec![vol.clone()];
    if let Some(f) = vol.backing_fault() {
        controls.push(Arc::new(crate::stack::fault::FaultControl { target: format!("{name}/backing_fault"), dev: f.clone() }));
    }
    let dev: Arc<dyn BlockDev> = if on_cloud { Arc::new(crate::stack::AtExit::new(vol.clone(), |v: &ElasticVolume| v.shutdown())) } else { vol.clone() };
    Ok(crate::stack::Built {
        dev,
        description: if auto { format!("elastic volume over {backing} with caches chosen by price") } else { format!("elastic volume over {backing} with {} MB/s caches", cache_bw / 1_000_000) },
        detail,
        controls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::cache::CacheConfig;
    use surge_block::VirtualClock;

    fn ctx(dir: &std::path::Path) -> crate::stack::BuildContext {
        crate::stack::BuildContext::new(dir.to_path_buf(), Arc::new(VirtualClock::new()))
    }

    #[test]
    fn elastic_spec_builds_a_backing_volume_and_reports_status() {
        let d = tempfile::tempdir().unwrap();
        let b = build_elastic("d", "backing=reserved:64MiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s,initial=16MiB,min=4MiB,granularity=4MiB,attach_delay=0s", &ctx(d.path())).unwrap();
        assert_eq!(b.dev.size(), 64 << 20);
        b.dev.write_at(&[7; 4096], 0, true).unwrap();
        let st = b.controls[0].status();
        assert_eq!(st["state"], "idle");
        assert_eq!(st["cache_size"], 0);
        let mut buf = [0u8; 4];
        b.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7; 4]);
    }

    #[test]
    fn elastic_spec_errors_name_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let e = |a: &str| build_elastic("d", a, &ctx(d.path())).err().unwrap().to_string();
        assert!(e("cache=reserved,cache_bw=128MB/s").contains("backing="));
        assert!(e("backing=reserved:64MiB,bw=33MB/s").contains("cache_bw"));
        assert!(e("backing=reserved:64MiB,iops=100,cache_bw=128MB/s").contains("throughput limit"));
        assert!(e("backing=gp3:1GiB,cache=auto").contains("value_per_hour"));
        assert!(e("backing=gp3:1GiB,cache_bw=1MB/s,value_per_hour=1").contains("only apply with cache=auto"));
        assert!(e("backing=reserved:64MiB,bw=33MB/s,cache_bw=1MB/s,bogus=1").contains("bogus"));
    }

    /// The controller on virtual time: a burst provisions a cache, inactivity
    /// drains it, and a clean cache is detached and deleted, with reasons.
    #[test]
    fn controller_provisions_drains_and_deletes_on_virtual_time() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = surge_cloud::LocalConfig::new(d.path());
        cfg.delays = surge_cloud::Delays::none();
        let prov: Arc<dyn Provider> = Arc::new(surge_cloud::LocalProvider::open(cfg, clock.clone()).unwrap());
        let mib = 1u64 << 20;
        let p = ElasticParams {
            name: "v".into(),
            backing: "reserved:64MiB,bw=33MB/s".parse().unwrap(),
            cache_bw: 128_000_000,
            policy: ElasticConfig { backing_bw: 33e6, initial_cache: 16 * mib, min_cache: 4 * mib, granularity: 4 * mib, attach_delay: Duration::ZERO, ..ElasticConfig::default() },
            cache: CacheConfig::default(),
            boost: None,
            tick: Duration::from_secs(1),
            flusher_poll: Duration::from_millis(1),
            fences: Some(d.path().join("v.fences.json")),
            faults: ElasticFaults::default(),
            scale: Default::default(),
            background_provision: false,
            credit_horizon: CREDIT_HORIZON,
            stripe: None,
        };
        let v = ElasticVolume::open(p, prov.clone(), clock.clone()).unwrap();
        v.step().unwrap();
        // A burst: 8 MiB every 0.2 s of compute (the backing model's pacing
        // moves virtual time too): well above 30 % of 33 MB/s.
        for i in 0..20u64 {
            v.write_at(&vec![i as u8 + 1; (8 * mib) as usize], i * 4 * mib % (48 * mib), false).unwrap();
            clock.advance(Duration::from_millis(200));
            v.step().unwrap();
        }
        assert!(v.cache().is_attached(), "burst provisions a cache: {:?}", v.decisions());
        assert_eq!(v.cache_sizes(), vec![16 * mib]);
        // Idle: after ID the policy drains; flushing makes it clean; then detach.
        for _ in 0..60 {
            clock.advance(Duration::from_secs(1));
            v.step().unwrap();
            v.cache().flush_step(usize::MAX).unwrap();
        }
        assert!(!v.cache().is_attached(), "{:?}", v.decisions());
        let kinds: Vec<String> = v.decisions().iter().map(|d| format!("{:?}", d.action)).collect();
        assert!(kinds.iter().any(|k| k.starts_with("Provision")) && kinds.contains(&"StartDrain".to_string()) && kinds.contains(&"Detach".to_string()), "{kinds:?}");
        assert!(v.decisions().iter().all(|d| !d.reason.is_empty()));
        // Only the backing volume is left.
        assert_eq!(prov.list().unwrap().len(), 1);
        let mut buf = vec![0u8; 4096];
        v.read_at(&mut buf, 28 * mib).unwrap();
        assert_eq!(buf[0], 20, "the last write survived provisioning, draining and deletion");
    }
}

