//! `surge plan burstable`: print every way to meet a capacity and an IOPS or
//! throughput target, with its monthly cost (the planning logic is
//! `surge_cloud::plan`). `surge plan workload`: replay a trace through every
//! candidate on virtual time and price it (the engine is `surge_sim`).

use anyhow::Context;
use std::fmt::Write as _;
use std::path::PathBuf;
use surge_cloud::plan::{plan, Plan, PlanRequest, Target, UseCase};
use surge_cloud::PriceTable;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Burstable volumes (N small gp2 volumes striped and swapped) vs gp2, gp3, io1, io2, st1.
    #[command(after_long_help = "Example:\n  surge plan burstable --capacity 100GiB --iops 30000 --hours 720")]
    Burstable(BurstableArgs),
    /// Replay a recorded or imported trace on every candidate volume (virtual time, the real volume
    /// models behind the instance's EBS limits) and recommend the cheapest that meets the deadline.
    #[command(after_long_help = "Examples:\n  surge plan workload --trace app.trace --deadline 1.05x --instance m5.2xlarge\n  \
        surge plan workload --trace app.trace --value-per-hour 40 --json")]
    Workload(WorkloadArgs),
}

#[derive(clap::Args)]
struct WorkloadArgs {
    /// The trace (a directory from `surge serve --record` or `surge trace import`).
    #[arg(long)]
    trace: PathBuf,
    /// Completion time allowed: a multiple of the fastest candidate's (1.05x) or a duration (90s).
    #[arg(long, conflicts_with = "value_per_hour")]
    deadline: Option<String>,
    /// What an hour of the run's time is worth, in USD (added to each candidate's cost).
    #[arg(long)]
    value_per_hour: Option<f64>,
    /// The instance type the volume is attached to (its price and EBS limits).
    #[arg(long, default_value = "m5.2xlarge")]
    instance: String,
    /// Requests in flight at most: the application's queue depth [default: the most the recording saw in flight, at least 32].
    #[arg(long)]
    qd: Option<usize>,
    /// Capacity the volume needs at least [default: the trace's highest byte].
    #[arg(long)]
    capacity: Option<String>,
    /// The export name in the printed spec.
    #[arg(long, default_value = "app")]
    export: String,
    /// TOML file overriding list prices (see `surge cloud cost --prices`).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
    /// Write the recommended candidate's timeline (MiB/s completed vs submitted) as SVG.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BurstableArgs {
    /// Capacity, e.g. 100GiB.
    #[arg(long)]
    capacity: String,
    /// Sustained IOPS (4 KiB operations) to reach.
    #[arg(long, conflicts_with = "throughput", required_unless_present = "throughput")]
    iops: Option<u64>,
    /// Sustained throughput to reach, e.g. 500MiB/s (256 KiB operations).
    #[arg(long)]
    throughput: Option<String>,
    /// Hours per month the target must hold (in one stretch).
    #[arg(long, default_value_t = 720.0)]
    hours: f64,
    /// What the data is: persistent (migrated on swaps), cache, ephemeral.
    #[arg(long = "use", default_value = "persistent")]
    use_case: String,
    /// Volumes the instance can attach (Nitro: 28, one of them the root volume).
    #[arg(long, default_value_t = 27)]
    attach_limit: usize,
    /// Speed of a member rebuild (persistent).
    #[arg(long, default_value = "64MiB/s")]
    rebuild_rate: String,
    /// Create + attach time of a fresh member.
    #[arg(long, default_value = "10s")]
    swap_setup: String,
    /// TOML file overriding list prices (see `surge cloud cost --prices`).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn prices(file: &Option<PathBuf>) -> anyhow::Result<PriceTable> {
    Ok(match file {
        Some(f) => PriceTable::from_toml(&std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)?,
        None => PriceTable::default(),
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let a = match args.what {
        What::Burstable(a) => a,
        What::Workload(w) => return workload(w),
    };
    let capacity = surge_block::units::parse_size(&a.capacity).map_err(|e| anyhow::anyhow!("--capacity {}: {e}", a.capacity))?;
    let target = match (a.iops, &a.throughput) {
        (Some(i), _) => Target::Iops(i),
        (None, Some(t)) => Target::Throughput(crate::stack::parse_rate(t)?),
        (None, None) => anyhow::bail!("give --iops or --throughput"),
    };
    anyhow::ensure!(a.hours > 0.0 && a.hours <= 744.0, "--hours must be within a month (0-744)");
    let mut req = PlanRequest::new(capacity, target, a.hours);
    req.use_case = match a.use_case.as_str() {
        "persistent" => UseCase::Persistent,
        "cache" => UseCase::Cache,
        "ephemeral" => UseCase::Ephemeral,
        other => anyhow::bail!("--use {other}: persistent, cache or ephemeral"),
    };
    req.attach_limit = a.attach_limit;
    req.rebuild_rate = crate::stack::parse_rate(&a.rebuild_rate)?;
    req.swap_setup = surge_block::units::parse_duration(&a.swap_setup).map_err(|e| anyhow::anyhow!("--swap-setup: {e}"))?;
    let prices = prices(&a.prices)?;
    let p = plan(&req, &prices);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", render(&p, &prices));
    }
    Ok(())
}

fn render(p: &Plan, prices: &PriceTable) -> String {
    let mut s = String::new();
    let r = &p.request;
    let target = match r.target {
        Target::Iops(i) => format!("{i} IOPS"),
        Target::Throughput(b) => format!("{:.0} MiB/s", b as f64 / (1 << 20) as f64),
    };
    let _ = writeln!(
        s,
        "{} GiB at {target} for {} h/month ({:?} data; at most {} attached volumes; rebuilds at {:.0} MiB/s)\nprices: {} ({}, {})\n",
        r.capacity as f64 / (1u64 << 30) as f64,
        r.hours,
        r.use_case,
        r.attach_limit,
        r.rebuild_rate as f64 / (1 << 20) as f64,
        prices.source,
        prices.region,
        prices.date
    );
    let _ = writeln!(s, "{:<58} {:>5} {:>9} {:>8} {:>10} {:>8}  meets", "option", "peak", "IOPS", "MiB/s", "$/month", "swaps $");
    for (i, o) in p.options.iter().enumerate() {
        let mark = if Some(i) == p.cheapest { " <= cheapest" } else { "" };
        let meets = if o.meets { "yes".to_string() } else { format!("no: {}", o.why_not.clone().unwrap_or_default()) };
        let _ = writeln!(
            s,
            "{:<58} {:>5} {:>9.0} {:>8.1} {:>10.2} {:>8.2}  {meets}{mark}",
            if o.kind == "burstable" { o.name.clone() } else { format!("{} [{}{}]", o.name, if o.volumes > 1 { format!("{} x ", o.volumes) } else { String::new() }, o.volume_spec) },
            o.attached_peak,
            o.iops,
            o.mib_s,
            o.usd_month,
            o.swap_usd_month
        );
        if let (Some(l), Some(sw)) = (o.member_lasts_s, o.swap_s) {
            if o.member_swaps_per_month > 0.0 {
                let _ = writeln!(s, "{:<58}   a member lasts {:.0} min, a swap takes {:.0} s, {:.0} member swaps/month", "", l / 60.0, sw, o.member_swaps_per_month);
            }
        }
        for n in &o.notes {
            let _ = writeln!(s, "{:<58}   note: {n}", "");
        }
    }
    match p.cheapest() {
        Some(c) => {
            let _ = writeln!(s, "\ncheapest that meets the target: {} at ${:.2}/month", c.name, c.usd_month);
            for k in ["gp3", "io1", "io2"] {
                if let Some(o) = p.option(k) {
                    if o.usd_month > 0.0 && c.kind == "burstable" {
                        let _ = writeln!(s, "  = {:.1} % of {k} (${:.2}/month)", c.usd_month / o.usd_month * 100.0, o.usd_month);
                    }
                }
            }
            if c.kind != "burstable" {
                let _ = writeln!(s, "  the burstable trick does not pay here at today's list prices");
            }
        }
        None => {
            let _ = writeln!(s, "\nno option meets the target within the attachment limit");
        }
    }
    s
}

fn workload(a: WorkloadArgs) -> anyhow::Result<()> {
    let trace = surge_trace::Trace::open(&a.trace)?;
    let deadline = a.deadline.as_deref().map(str::parse::<surge_sim::plan::Deadline>).transpose().map_err(anyhow::Error::msg)?;
    if let Some(v) = a.value_per_hour {
        anyhow::ensure!(v.is_finite() && v >= 0.0, "--value-per-hour must be a non-negative number of USD");
    }
    let capacity = a.capacity.as_deref().map(surge_block::units::parse_size).transpose().map_err(|e| anyhow::anyhow!("--capacity: {e}"))?.unwrap_or(0);
    let opts = surge_sim::PlanOptions { instance: a.instance, deadline, value_per_hour: a.value_per_hour, qd: a.qd, capacity, export: a.export, threaded: true };
    let p = surge_sim::plan_workload(&trace, &opts, &prices(&a.prices)?)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", render_workload(&p));
    }
    if let Some(svg) = &a.svg {
        surge_sim::plot::timeline_svg(&p, &trace, svg).map_err(anyhow::Error::msg)?;
        if !a.json {
            println!("timeline: {}", svg.display());
        }
    }
    Ok(())
}

fn usd(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.6}"))
}

fn render_workload(p: &surge_sim::WorkloadPlan) -> String {
    let mut s = String::new();
    let d = &p.demand;
    let _ = writeln!(s, "trace {}: {} requests over {:.1} s{}", p.trace, p.requests, p.trace_duration_s, if p.aggregate { " (AGGREGATE import: rates only, offsets synthesized)" } else { "" });
    let peak = if d.untimed { "untimed: as fast as the volume allows".to_string() } else { format!("peak second {} IOPS, {:.1} MiB/s", d.peak_iops, d.peak_bps as f64 / (1u64 << 20) as f64) };
    let _ = writeln!(s, "demand: {:.0} GiB, {peak}; replayed at QD {} on {} (${:.3}/h, its EBS baseline shared)", d.capacity as f64 / (1u64 << 30) as f64, p.qd, p.instance, p.instance_usd_hour);
    let goal = match (&p.objective, p.deadline_s) {
        (surge_sim::Objective::Deadline(_), Some(dl)) => format!("cheapest total that completes within {dl:.1} s"),
        (surge_sim::Objective::ValuePerHour(v), _) => format!("cheapest total, the run's time valued at ${v}/h"),
        _ => "cheapest total (storage + compute)".into(),
    };
    let _ = writeln!(s, "goal: {goal}; prices: {}", p.prices);
    let _ = writeln!(s, "every figure below is {} (the trace replayed through the volume models and policies; nothing ran on a cloud)\n", p.figures);
    let _ = writeln!(s, "{:<28} {:<44} {:>11} {:>11} {:>11} {:>11}  why it lost", "candidate", "spec", "complete s", "storage $", "compute $", "total $");
    for (i, r) in p.rows.iter().enumerate().filter(|(_, r)| r.simulated) {
        let why = if Some(i) == p.recommended { "<= recommended".to_string() } else { r.why_lost.clone().unwrap_or_default() };
        let _ = writeln!(
            s,
            "{:<28} {:<44} {:>11} {:>11} {:>11} {:>11}  {why}",
            r.name,
            r.spec.as_deref().unwrap_or("-"),
            r.completion_s.map_or("-".into(), |c| format!("{c:.2}")),
            usd(r.storage_usd),
            usd(r.compute_usd),
            usd(r.total_usd)
        );
        if r.peak_spec.is_some() || r.name == surge_sim::plan::STRIPE || r.elastic.is_some() {
            let _ = writeln!(s, "{:<28}   {}", "", r.sized);
        }
        for m in r.modifications.iter().flatten() {
            let _ = writeln!(s, "{:<28}   {:>9.1} s  {:?} to {}: {}", "", m.at_s, m.action, m.to, m.reason);
        }
    }
    let _ = writeln!(s, "\nnot simulated (left out, not guessed):");
    for r in p.rows.iter().filter(|r| !r.simulated) {
        let why = r.why_lost.as_deref().unwrap_or("").trim_start_matches("not simulated yet: ");
        let _ = writeln!(s, "  {}: {why}", r.name);
    }
    match (p.recommended, &p.serve_args) {
        (Some(i), Some(args)) => {
            let r = &p.rows[i];
            let _ = writeln!(s, "\nrecommended: {} ({}), {:.2} s, ${:.6} a run (simulated on virtual time)", r.name, r.sized, r.completion_s.unwrap_or(0.0), r.total_usd.unwrap_or(0.0));
            let _ = writeln!(s, "  surge serve {args}");
        }
        _ => {
            let _ = writeln!(s, "\nno simulated candidate meets the deadline");
        }
    }
    s
}
