//! The `fault` export kind: `fault:POOL[,RULES...]` wraps the pool device POOL in
//! a [`FaultDev`] with the one-line rules of `surge_block::fault`, e.g.
//! `--pool base=file:x.img,create=1GiB --export d=fault:base,write.fail_nth=100,latency=5ms`.
//! The layer registers as control target `fault/POOL`: `surge set fault/base rules
//! "read.fail_prob=0.01"` replaces all rules, `surge set fault/base KEY VALUE` changes one.

use crate::control::Controllable;
use crate::stack::{BuildContext, Built, SpecError};
use serde_json::json;
use std::sync::Arc;
use surge_block::fault::{FaultDev, FaultRules, OpKind};

fn err(msg: impl Into<String>) -> SpecError {
    SpecError::Args { kind: "fault".into(), msg: msg.into() }
}

/// `fault:POOL[,RULE...]`
pub fn build_fault(args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    let (pool, rules) = match args.split_once(',') {
        Some((p, r)) => (p.trim(), r),
        None => (args.trim(), ""),
    };
    if pool.is_empty() || pool.contains('=') {
        return Err(err(format!("{args:?}: write fault:POOL[,RULES], where POOL is declared with --pool POOL=KIND:ARGS")));
    }
    let inner = ctx.pool("fault", pool)?;
    let rules: FaultRules = rules.parse().map_err(err)?;
    let dev = Arc::new(FaultDev::new(inner, rules.clone(), ctx.clock.clone()));
    let control = Arc::new(FaultControl { target: format!("fault/{pool}"), dev: dev.clone() });
    Ok(Built {
        dev,
        description: format!("fault injection over {pool}: {}", if rules == FaultRules::default() { "no rules".to_string() } else { rules.to_string() }),
        detail: json!({ "pool": pool, "rules": rules.to_string() }),
        controls: vec![control],
    })
}

/// A [`FaultDev`] on the control API.
pub struct FaultControl {
    /// Control target name, `fault/POOL`.
    pub target: String,
    pub dev: Arc<FaultDev>,
}

impl Controllable for FaultControl {
    fn name(&self) -> String {
        self.target.clone()
    }
    fn kind(&self) -> String {
        "fault".into()
    }
    fn status(&self) -> serde_json::Value {
        let s = self.dev.stats();
        let per_kind = |a: [u64; 5]| -> serde_json::Map<String, serde_json::Value> { OpKind::ALL.iter().map(|k| (k.name().to_string(), json!(a[*k as usize]))).collect() };
        json!({
            "rules": self.dev.rules().to_string(),
            "ops": per_kind(s.ops),
            "injected": per_kind(s.injected),
            "dropped": s.dropped,
            "torn": s.torn,
            "gone": s.gone,
            "passthrough_errors": s.passthrough_errors,
            "vanished": s.vanished,
            "buffered_bytes": s.buffered_bytes,
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        if key == "rules" {
            self.dev.set_rules(value.parse()?);
            Ok(())
        } else {
            self.dev.set_rule(key, Some(value))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::{BlockDev, MemoryDev, SystemClock};

    fn ctx() -> BuildContext {
        let mut c = BuildContext::new(std::env::temp_dir(), Arc::new(SystemClock::new()));
        c.pools.insert("base".into(), Arc::new(MemoryDev::new(1 << 20)));
        c
    }

    #[test]
    fn fault_kind_wraps_a_pool_and_changes_live() {
        let b = build_fault("base,write.fail_nth=2", &ctx()).unwrap();
        b.dev.write_at(&[1; 8], 0, false).unwrap();
        assert_eq!(b.dev.write_at(&[1; 8], 0, false).unwrap_err().errno(), libc::EIO);
        let c = &b.controls[0];
        assert_eq!(c.status()["injected"]["write"], 1);
        c.set("rules", "read.fail_nth=1").unwrap();
        assert!(b.dev.read_at(&mut [0; 8], 0).is_err());
        c.set("write.fail_every", "1").unwrap();
        assert!(b.dev.write_at(&[1; 8], 0, false).is_err());
        assert!(c.set("write.fail_every", "often").unwrap_err().contains("not a non-negative integer"));
    }

    #[test]
    fn fault_kind_errors_are_clear() {
        assert!(build_fault("nosuch", &ctx()).err().unwrap().to_string().contains("no pool named"));
        assert!(build_fault("base,write.boom=1", &ctx()).err().unwrap().to_string().contains("unknown fault rule"));
        assert!(build_fault("", &ctx()).err().unwrap().to_string().contains("fault:POOL"));
    }
}
