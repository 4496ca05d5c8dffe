//! `share:POOL,...`: fair sharing in the daemon.
//!
//! The export kind puts a tenant of the pool's fair queue
//! (`surge_block::fairq`) behind an export; the first share of a pool creates
//! the queue. Each tenant is a control target `qos/TENANT` whose status carries
//! its share and recent I/O and whose settings change it live (`surge qos`).

use crate::control::Controllable;
use crate::stack::{parse_rate, parse_size, BuildContext, Built, Opts, SpecError};
use parking_lot::Mutex;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use surge_block::fairq::{AdaptiveConfig, FairQueue, SchedConfig, Tenant, TenantConfig};

/// Fair queues by pool name, shared by every `share:` export of a daemon.
pub type Queues = Arc<Mutex<BTreeMap<String, Arc<FairQueue>>>>;

const KEYS: &[&str] = &["tenant", "weight", "reservation", "limit", "depth", "overhead", "adaptive"];

/// `share:POOL[,tenant=NAME][,weight=N][,reservation=RATE][,limit=RATE][,depth=D][,overhead=SIZE][,adaptive=on|off|MS]`.
/// The tenant defaults to the export name; depth, overhead and adaptive apply
/// to the pool's queue (the first export that names them sets them).
pub fn build_share(export: &str, args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    let mut o = Opts::parse("share", args)?;
    let pool = o.positional_required("POOL")?;
    let tenant = o.take("tenant").unwrap_or_else(|| export.to_string());
    let cfg = TenantConfig {
        weight: o.take("weight").map(|w| parse_weight(&w)).transpose().map_err(|m| share_err(&m))?.unwrap_or(1),
        reservation: o.take_rate("reservation")?,
        limit: o.take_rate("limit")?,
    };
    let mut sched = SchedConfig::default();
    if let Some(d) = o.take("depth") {
        sched.depth = parse_depth(&d).map_err(|m| share_err(&m))?;
    }
    if let Some(overhead) = o.take_size("overhead")? {
        sched.overhead = overhead;
    }
    if let Some(v) = o.take("adaptive") {
        sched.adaptive = parse_adaptive(&v).map_err(|m| share_err(&m))?;
    }
    o.finish(KEYS)?;
    if tenant.is_empty() {
        return Err(share_err("name the tenant with tenant=NAME"));
    }
    crate::stack::validate_name(&tenant)?;
    let dev = ctx.pool("share", &pool)?;
    let (queue, _) = queue_for(&ctx.fair_queues, &pool, dev, sched, ctx);
    let is_new = !queue.tenant_names().contains(&tenant);
    let handle = queue.tenant(&tenant, cfg);
    let detail = json!({ "pool": pool, "tenant": tenant, "share": queue.tenant_config(&tenant).ok() });
    let mut built = Built {
        dev: handle.clone(),
        description: format!("share of pool {pool} (tenant {tenant})"),
        detail,
        controls: Vec::new(),
    };
    if is_new {
        built.controls.push(Arc::new(TenantControl { pool, handle }));
    }
    Ok(built)
}

fn queue_for(
    queues: &Queues,
    pool: &str,
    dev: Arc<dyn surge_block::BlockDev>,
    sched: SchedConfig,
    ctx: &BuildContext,
) -> (Arc<FairQueue>, bool) {
    let mut q = queues.lock();
    if let Some(existing) = q.get(pool) {
        return (existing.clone(), false);
    }
    let queue = FairQueue::new(dev, sched, ctx.clock.clone());
    q.insert(pool.to_string(), queue.clone());
    (queue, true)
}

fn share_err(msg: &str) -> SpecError {
    SpecError::Args { kind: "share".into(), msg: msg.to_string() }
}

fn parse_weight(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(w) if (1..=1_000_000).contains(&w) => Ok(w),
        _ => Err(format!("weight {s:?} must be a whole number from 1 to 1000000")),
    }
}

fn parse_depth(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(d) if (1..=4096).contains(&d) => Ok(d),
        _ => Err(format!("depth {s:?} must be a whole number from 1 to 4096")),
    }
}

/// `off`, `on` (default target) or a mean-latency target in milliseconds.
fn parse_adaptive(s: &str) -> Result<Option<AdaptiveConfig>, String> {
    match s {
        "off" | "false" | "no" => Ok(None),
        "on" | "true" | "yes" => Ok(Some(AdaptiveConfig::default())),
        ms => match ms.trim_end_matches("ms").parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Some(AdaptiveConfig { latency_target_us: ms * 1000, ..AdaptiveConfig::default() })),
            _ => Err(format!("adaptive {s:?}: use on, off or a latency target in ms (e.g. 20ms)")),
        },
    }
}

/// `off`/`none` or a rate.
fn parse_optional_rate(s: &str) -> Result<Option<u64>, String> {
    match s {
        "off" | "none" | "0" => Ok(None),
        r => parse_rate(r).map(Some).map_err(|e| e.to_string()),
    }
}

/// One tenant on the control API.
struct TenantControl {
    pool: String,
    handle: Arc<Tenant>,
}

impl Controllable for TenantControl {
    fn name(&self) -> String {
        format!("qos/{}", self.handle.name())
    }

    fn kind(&self) -> String {
        "tenant".into()
    }

    fn status(&self) -> serde_json::Value {
        let q = self.handle.queue().stats();
        let me = q.tenants.iter().find(|t| t.name == self.handle.name());
        json!({
            "pool": self.pool,
            "tenant": me,
            "pool_depth": q.depth,
            "pool_outstanding": q.outstanding,
            "pool_config": q.config,
            "pool_tenants": q.tenants.iter().map(|t| &t.name).collect::<Vec<_>>(),
        })
    }

    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        let q = self.handle.queue();
        let name = self.handle.name();
        let mut cfg = q.tenant_config(&name).map_err(|e| e.to_string())?;
        match key {
            "weight" => cfg.weight = parse_weight(value)?,
            "reservation" => cfg.reservation = parse_optional_rate(value)?,
            "limit" => cfg.limit = parse_optional_rate(value)?,
            "depth" => {
                q.set_depth(parse_depth(value)?);
                return Ok(());
            }
            "overhead" => {
                q.set_overhead(parse_size(value).map_err(|e| e.to_string())?);
                return Ok(());
            }
            "adaptive" => {
                q.set_adaptive(parse_adaptive(value)?);
                return Ok(());
            }
            other => {
                return Err(format!(
                    "{} has no setting {other:?} (weight, reservation, limit; pool-wide: depth, overhead, adaptive)",
                    self.name()
                ))
            }
        }
        q.set_tenant(&name, cfg).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use surge_block::{BlockDev, MemoryDev, SystemClock};

    fn ctx() -> BuildContext {
        let mut c = BuildContext::new(PathBuf::from("/nonexistent"), Arc::new(SystemClock::new()));
        c.pools.insert("pool".into(), Arc::new(MemoryDev::new(1 << 20)));
        c
    }

    #[test]
    fn shares_of_one_pool_join_one_queue_and_register_each_tenant_once() {
        let c = ctx();
        let a = build_share("a", "pool,weight=4,depth=3", &c).unwrap();
        let b = build_share("b", "pool,weight=1,limit=10MB/s", &c).unwrap();
        let a2 = build_share("a2", "pool,tenant=a", &c).unwrap();
        assert_eq!((a.controls.len(), b.controls.len(), a2.controls.len()), (1, 1, 0));
        let q = c.fair_queues.lock().get("pool").cloned().unwrap();
        assert_eq!(q.tenant_names(), vec!["a", "b"]);
        assert_eq!(q.stats().depth, 3);
        assert_eq!(q.tenant_config("a").unwrap().weight, 4);
        assert_eq!(q.tenant_config("b").unwrap().limit, Some(10_000_000));
        a.dev.write_at(&[1u8; 4096], 0, false).unwrap();
        let mut buf = [0u8; 4096];
        a2.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1u8; 4096], "both handles reach the same device");
    }

    #[test]
    fn bad_share_specs_say_what_is_wrong() {
        let c = ctx();
        let e = build_share("a", "nopool", &c).err().unwrap().to_string();
        assert!(e.contains("no pool named"), "{e}");
        let e = build_share("a", "pool,weight=0", &c).err().unwrap().to_string();
        assert!(e.contains("weight"), "{e}");
        let e = build_share("a", "pool,colour=red", &c).err().unwrap().to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn tenant_targets_change_shares_live_and_report_stats() {
        let c = ctx();
        let built = build_share("a", "pool,weight=2", &c).unwrap();
        let t = built.controls[0].clone();
        assert_eq!(t.name(), "qos/a");
        t.set("weight", "7").unwrap();
        t.set("limit", "20MB/s").unwrap();
        t.set("depth", "5").unwrap();
        t.set("adaptive", "15ms").unwrap();
        assert!(t.set("weight", "0").is_err());
        assert!(t.set("colour", "red").unwrap_err().contains("weight, reservation, limit"));
        built.dev.write_at(&[2u8; 8192], 0, false).unwrap();
        let st = t.status();
        assert_eq!(st["tenant"]["config"]["weight"], 7);
        assert_eq!(st["tenant"]["config"]["limit"], 20_000_000);
        assert_eq!(st["tenant"]["bytes"], 8192);
        assert_eq!(st["pool_config"]["adaptive"]["latency_target_us"], 15_000);
        t.set("limit", "off").unwrap();
        assert!(t.status()["tenant"]["config"]["limit"].is_null());
    }
}
