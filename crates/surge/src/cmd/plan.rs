//! `surge plan burstable`: print every way to meet a capacity and an IOPS or
//! throughput target, with its monthly cost (the planning logic is
//! `surge_cloud::plan`).

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

pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Burstable(a) = args.what;
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
    let prices = match &a.prices {
        Some(f) => PriceTable::from_toml(&std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)?,
        None => PriceTable::default(),
    };
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
