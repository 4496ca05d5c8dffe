//! `surge serve --dry-run`: build every export that lives on the cloud (cloud
//! volume types, `burstable:`, `elastic:`, `modify:`) over a [`DryRunProvider`], which
//! answers reads from the daemon's provider and records every create,
//! attach, detach, delete and modify instead of making it; print the record
//! with list prices. Stacks keep their state in a throwaway copy of the data
//! directory's, so a restart's plan (members found again, nothing created) is
//! what the daemon would do, and the real state is never written.

use crate::stack::{build, BuildContext, ExportSpec};
use anyhow::Context as _;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use surge_cloud::dryrun::{created_usd_month, render};
use surge_cloud::{DryRunProvider, PriceTable, Provider};

/// Kinds whose builders call the cloud.
fn on_cloud(kind: &str) -> bool {
    matches!(kind, "burstable" | "elastic" | "modify") || surge_cloud::spec::is_volume_type(kind)
}

/// Copy the stacks' state (small JSON files and mirror records) of `from` into `to`.
fn copy_state(from: &Path, to: &Path) -> anyhow::Result<()> {
    for sub in ["burstable", "elastic"] {
        let src = from.join(sub);
        if !src.is_dir() {
            continue;
        }
        for e in walk(&src)? {
            let rel = e.strip_prefix(from).expect("under from");
            let dst = to.join(rel);
            std::fs::create_dir_all(dst.parent().expect("a parent")).with_context(|| format!("creating {}", dst.display()))?;
            std::fs::copy(&e, &dst).with_context(|| format!("copying {}", e.display()))?;
        }
    }
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

/// The plan of `exports` on `cloud` (the daemon's provider), as text. Nothing
/// mutating reaches `cloud`; `data_dir` is only read.
pub fn plan(exports: &[ExportSpec], cloud: Arc<dyn Provider>, data_dir: &Path, base: &BuildContext) -> anyhow::Result<String> {
    let scratch = tempfile::Builder::new().prefix("surge-dry-run").tempdir().context("a scratch directory for the dry run")?;
    copy_state(data_dir, scratch.path())?;
    let dry = Arc::new(DryRunProvider::new(cloud, PriceTable::default()));
    let mut ctx = base.clone();
    ctx.data_dir = scratch.path().to_path_buf();
    ctx.cloud = Some(dry.clone());
    let mut out = String::from("Dry run: the calls below were NOT made; list prices from surge-cloud's price table.\n");
    let mut built = Vec::new();
    for spec in exports {
        let _ = writeln!(out, "export {spec}");
        if !on_cloud(&spec.kind) {
            out.push_str("  not on the cloud: nothing to plan\n");
            continue;
        }
        let before = dry.calls().len();
        match build(spec, &ctx) {
            Ok(b) => {
                let _ = writeln!(out, "  {}", b.description);
                built.push(b);
            }
            Err(e) => {
                let _ = writeln!(out, "  would fail: {e}");
            }
        }
        let calls = dry.calls().split_off(before);
        if calls.is_empty() {
            out.push_str("  no cloud calls\n");
        }
        out.push_str(&render(&calls));
    }
    let all = dry.calls();
    let creates = all.iter().filter(|c| c.api == "CreateVolume").count();
    let _ = writeln!(out, "Total: {} API calls, {creates} volumes to create, ${:.2}/month at list price", all.len(), created_usd_month(&all));
    // What the stacks do when dropped (detach at exit) is not part of the plan.
    drop(built);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::{CloudError, CostReport, CreateRequest, Delays, LocalConfig, LocalProvider, VolumeInfo};

    /// A cloud that fails the test on any mutating call.
    struct ReadOnly(LocalProvider);

    impl Provider for ReadOnly {
        fn create(&self, r: CreateRequest) -> Result<VolumeInfo, CloudError> {
            panic!("dry run created {:?}", r.name)
        }
        fn attach(&self, id: &str) -> Result<Arc<dyn surge_block::BlockDev>, CloudError> {
            panic!("dry run attached {id}")
        }
        fn detach(&self, id: &str) -> Result<(), CloudError> {
            panic!("dry run detached {id}")
        }
        fn delete(&self, id: &str) -> Result<(), CloudError> {
            panic!("dry run deleted {id}")
        }
        fn list(&self) -> Result<Vec<VolumeInfo>, CloudError> {
            self.0.list()
        }
        fn describe(&self, id: &str) -> Result<VolumeInfo, CloudError> {
            self.0.describe(id)
        }
        fn cost(&self) -> Result<CostReport, CloudError> {
            self.0.cost()
        }
    }

    #[test]
    fn a_dry_run_lists_every_call_with_prices_and_makes_none() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = LocalConfig::new(d.path().join("cloud"));
        cfg.delays = Delays::none();
        let real = LocalProvider::open(cfg, clock.clone()).unwrap();
        // An export volume that exists already is found, not created.
        real.create(CreateRequest { spec: "gp3:8GiB".parse().unwrap(), name: Some("v".into()) }).unwrap();
        let cloud: Arc<dyn Provider> = Arc::new(ReadOnly(real));
        let base = BuildContext::new(d.path().join("data"), clock);
        let exports: Vec<ExportSpec> = ["b=burstable:persistent,size=8GiB,members=4", "v=gp3:8GiB", "n=gp2:100GiB", "m=memory:1MiB"].iter().map(|s| s.parse().unwrap()).collect();
        let out = plan(&exports, cloud.clone(), &d.path().join("data"), &base).unwrap();
        for want in [
            "burstable persistent volume of 8GiB over 4 x gp2:2GiB",
            "CreateVolume   dry-5 name=n gp2:100GiB $10.00/month",
            "AttachVolume   dry-5 name=n",
            "not on the cloud: nothing to plan",
            "volumes to create, $10.80/month at list price",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
        // The members are made in parallel: in any order.
        for slot in 0..4 {
            let name = format!("name=b-s{slot}-g0 gp2:2GiB $0.20/month");
            assert_eq!(out.lines().filter(|l| l.starts_with("  CreateVolume   dry-") && l.ends_with(&name)).count(), 1, "{name} in\n{out}");
        }
        // The existing volume is attached (planned), not created again.
        assert!(out.lines().any(|l| l.starts_with("  AttachVolume") && l.contains("name=v")), "{out}");
        assert!(!out.contains("name=v gp3"), "{out}");
        assert_eq!(out.matches("AttachVolume").count(), 6, "four members, v and n: {out}");
        assert_eq!(cloud.list().unwrap().len(), 1, "nothing was made");
        assert!(!d.path().join("data").exists(), "the real data directory was not written");
    }
}
