//! `surge sim fleet`: N VMs running a recorded application on one account,
//! simulated on virtual time (the engine is `surge_sim::fleet`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;
use surge_sim::fleet::{Api, FleetOptions, FleetReport, Offsets};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// N VMs each repeating the traced application for H hours with their own phase offsets:
    /// each candidate's cost per VM and per run, volumes attached at once, and the EC2 API calls
    /// against the account's request buckets and EBS storage quotas.
    #[command(after_long_help = "Example:\n  surge sim fleet --trace app.trace --vms 1000 --offsets random --hours 24")]
    Fleet(FleetArgs),
}

#[derive(clap::Args)]
struct FleetArgs {
    /// The trace (a directory from `surge serve --record` or `surge trace import`).
    #[arg(long)]
    trace: PathBuf,
    #[arg(long, default_value_t = 100)]
    vms: u32,
    /// `aligned` (every VM starts at once) or `random` (each at a random point of one run).
    #[arg(long, default_value = "random")]
    offsets: String,
    /// How long each VM runs.
    #[arg(long, default_value_t = 24.0)]
    hours: f64,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The instance type each VM is (its price and EBS limits).
    #[arg(long, default_value = "m5.2xlarge")]
    instance: String,
    /// Requests in flight at most [default: the most the recording saw in flight, at least 32].
    #[arg(long)]
    qd: Option<usize>,
    /// Capacity each VM's volume needs at least [default: the trace's highest byte].
    #[arg(long)]
    capacity: Option<String>,
    /// TOML file overriding list prices (see `surge cloud cost --prices`).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Fleet(a) = args.what;
    let started = Instant::now();
    let trace = surge_trace::Trace::open(&a.trace)?;
    let offsets: Offsets = a.offsets.parse().map_err(anyhow::Error::msg)?;
    let capacity = a.capacity.as_deref().map(surge_block::units::parse_size).transpose().map_err(|e| anyhow::anyhow!("--capacity: {e}"))?.unwrap_or(0);
    let plan = surge_sim::PlanOptions { instance: a.instance, deadline: None, value_per_hour: None, qd: a.qd, capacity, export: "app".into(), threaded: false };
    let o = FleetOptions { vms: a.vms, offsets, hours: a.hours, seed: a.seed, limits: Default::default() };
    let f = surge_sim::fleet::simulate_fleet(&trace, &plan, &o, &super::plan::prices(&a.prices)?)?;
    let wall = started.elapsed().as_secs_f64();
    let rss = peak_rss_kib();
    if a.json {
        let mut v = serde_json::to_value(&f)?;
        v["wall_s"] = wall.into();
        v["peak_rss_kib"] = rss.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&f));
        println!("\nsimulated in {wall:.1} s wall, peak memory {:.0} MiB", rss.unwrap_or(0) as f64 / 1024.0);
    }
    Ok(())
}

/// This process's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn render(f: &FleetReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "fleet: {} VMs ({}) x {} h, offsets {:?} (seed {}), trace {}", f.vms, f.instance, f.hours, f.offsets, f.seed, f.trace);
    let _ = writeln!(s, "every figure is {}; account limits: {}\n", f.figures, f.limits.source);
    let _ = writeln!(s, "{:<22} {:>9} {:>11} {:>11} {:>12} {:>8}  {:<34} {}", "candidate", "runs/VM", "$/VM", "$ fleet", "$/run", "volumes", "API calls (throttled, failed, max delay)", "notes");
    for (i, r) in f.rows.iter().enumerate() {
        let calls: Vec<String> = Api::ALL
            .iter()
            .filter_map(|a| r.api.get(a).map(|st| (a, st)))
            .filter(|(a, _)| matches!(a, Api::CreateVolume | Api::AttachVolume | Api::ModifyVolume))
            .map(|(a, st)| format!("{a:?} {} ({}, {}, {:.0} s)", st.calls, st.throttled, st.failed, st.max_delay_s))
            .collect();
        let mut notes = Vec::new();
        if Some(i) == f.cheapest {
            notes.push("<= cheapest per run".to_string());
        }
        if r.max_start_delay_s > 1.0 {
            notes.push(format!("a VM waited {:.0} s for its volumes", r.max_start_delay_s));
        }
        if r.raises_refused_by_rule + r.raises_failed_throttled > 0 {
            notes.push(format!("{} raises refused by EBS's rule, {} failed throttled: those runs on the base spec", r.raises_refused_by_rule, r.raises_failed_throttled));
        }
        notes.extend(r.over_quota.iter().map(|q| format!("OVER QUOTA {q}")));
        if let (Some(c), Some(n)) = (r.credits_end_pct, r.credits_dry_after_runs) {
            let when = if n < r.iterations_per_vm.mean { "within the VM's hours: the runs after that are timed on credits they would not have (flattered)" } else { "after the VM's hours" };
            notes.push(format!("a run from full credits leaves {c:.1} %: dry after about {n:.0} back-to-back runs, {when}"));
        }
        let _ = writeln!(
            s,
            "{:<22} {:>9.1} {:>11.2} {:>11.2} {:>12.6} {:>8}  {:<34} {}",
            r.name,
            r.iterations_per_vm.mean,
            r.usd_per_vm.mean,
            r.total_usd,
            r.usd_per_iteration,
            r.peak_volumes,
            calls.join("; "),
            notes.join("; ")
        );
    }
    let _ = writeln!(s, "\nnot simulated (left out, not guessed):");
    for n in &f.not_simulated {
        let _ = writeln!(s, "  {}", n.replace(": not simulated yet: ", ": "));
    }
    for n in &f.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}
