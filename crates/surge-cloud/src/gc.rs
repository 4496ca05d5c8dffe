//! Orphans: volumes surge created that nothing will use again.
//!
//! A provider lists only surge's volumes (the local cloud holds nothing else;
//! on AWS they carry the `surge:owner` tag). Of those, a volume is an orphan
//! when it is not attached, is older than a grace period (a volume just
//! created is unattached for a moment before its attach), and has no name:
//! surge finds the volumes it keeps (export volumes, elastic backings and the
//! caches a restart recovers) by name, so an unnamed unattached volume is one
//! whose creator died or gave up between create and use. Named volumes are
//! listed as kept unless the caller asks for them too.

use crate::provider::{Provider, Result, VolumeInfo, VolumeState};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct GcOptions {
    /// Leave volumes younger than this alone.
    pub min_age: Duration,
    /// Also treat named, unattached volumes as orphans (e.g. the caches of an
    /// elastic export that was removed for good; they may hold its dirty data).
    pub named: bool,
    /// Only list, delete nothing.
    pub dry_run: bool,
}

#[derive(Debug, Default)]
pub struct GcReport {
    /// Orphans found (deleted unless dry run or their delete failed).
    pub orphans: Vec<VolumeInfo>,
    /// Unattached but kept (named, or too young), with the reason.
    pub kept: Vec<(VolumeInfo, String)>,
    /// Orphans whose delete failed, with the error.
    pub failed: Vec<(String, String)>,
}

/// Classify `vols` at `now_unix_ms`: (orphans, kept with reasons). Attached volumes are neither.
pub fn classify(vols: Vec<VolumeInfo>, opts: &GcOptions, now_unix_ms: u64) -> (Vec<VolumeInfo>, Vec<(VolumeInfo, String)>) {
    let (mut orphans, mut kept) = (Vec::new(), Vec::new());
    for v in vols.into_iter().filter(|v| v.state == VolumeState::Available) {
        let age = Duration::from_millis(now_unix_ms.saturating_sub(v.created_unix_ms));
        if age < opts.min_age {
            let why = format!("created {}s ago (younger than --min-age {}s)", age.as_secs(), opts.min_age.as_secs());
            kept.push((v, why));
        } else if let (Some(n), false) = (&v.name, opts.named) {
            let why = format!("named {n:?}: the export of that name uses it again (--named deletes it too)");
            kept.push((v, why));
        } else {
            orphans.push(v);
        }
    }
    (orphans, kept)
}

/// Find orphans and, unless `dry_run`, delete them.
pub fn collect(p: &dyn Provider, opts: &GcOptions, now_unix_ms: u64) -> Result<GcReport> {
    let (orphans, kept) = classify(p.list()?, opts, now_unix_ms);
    let mut failed = Vec::new();
    if !opts.dry_run {
        for v in &orphans {
            match p.delete(&v.id) {
                Ok(()) => tracing::info!(volume = %v.id, spec = %v.spec, "deleted orphan volume"),
                Err(e) => failed.push((v.id.clone(), e.to_string())),
            }
        }
    }
    Ok(GcReport { orphans, kept, failed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::{LocalConfig, LocalProvider};
    use crate::provider::CreateRequest;
    use std::sync::Arc;
    use surge_block::VirtualClock;

    #[test]
    fn unnamed_unattached_old_volumes_are_orphans_and_the_rest_stays() {
        let d = tempfile::tempdir().unwrap();
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = LocalConfig::new(d.path());
        cfg.delays = crate::Delays::none();
        let p = LocalProvider::open(cfg, clock.clone()).unwrap();
        let mk = |name: Option<&str>| p.create(CreateRequest { spec: "gp2:1GiB".parse().unwrap(), name: name.map(Into::into) }).unwrap().id;
        let orphan = mk(None);
        let named = mk(Some("keep"));
        let busy = mk(None);
        let _dev = p.attach(&busy).unwrap();
        let now = p.describe(&orphan).unwrap().created_unix_ms;

        let young = GcOptions { min_age: Duration::from_secs(600), named: false, dry_run: false };
        let r = collect(&p, &young, now + 1000).unwrap();
        assert!(r.orphans.is_empty() && r.kept.len() == 2, "{r:?}");
        assert!(r.kept[0].1.contains("younger than --min-age"), "{r:?}");

        let dry = GcOptions { min_age: Duration::ZERO, named: false, dry_run: true };
        let r = collect(&p, &dry, now).unwrap();
        assert_eq!(r.orphans.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), [orphan.as_str()]);
        assert!(r.kept[0].1.contains("named \"keep\""), "{r:?}");
        assert_eq!(p.list().unwrap().len(), 3, "a dry run deletes nothing");

        let r = collect(&p, &GcOptions { dry_run: false, ..dry }, now).unwrap();
        assert!(r.failed.is_empty());
        let left: Vec<String> = p.list().unwrap().into_iter().map(|v| v.id).collect();
        assert_eq!(left, [named.clone(), busy.clone()], "the orphan is gone, the named and the attached volume stay");

        let r = collect(&p, &GcOptions { named: true, ..dry }, now).unwrap();
        assert_eq!(r.orphans.len(), 1);
        collect(&p, &GcOptions { named: true, dry_run: false, ..dry }, now).unwrap();
        assert_eq!(p.list().unwrap().into_iter().map(|v| v.id).collect::<Vec<_>>(), [busy]);
    }
}
