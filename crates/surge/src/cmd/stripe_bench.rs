//! `surge stripe-bench`: IOR-like sequential writes to a volume striped over
//! several NBD exports (the logic is in `experiment::fairshare::client`).

use crate::experiment::fairshare::client::{self, BenchConfig, Member};
use std::net::IpAddr;
use surge_block::units::{parse_duration, parse_size};

#[derive(clap::Args, Debug)]
#[command(
    about = "Write to a volume striped over several NBD exports, like a parallel file system client (IOR)",
    after_long_help = "Each request is split into --chunk pieces on consecutive exports (round robin), all sent at once;\n\
it completes when the last piece does. --outstanding streams keep one request in flight each.\n\
Examples:\n  surge stripe-bench --export nbd://10.0.0.1:10809/pfs --export nbd://10.0.0.2:10809/pfs \\\n      --export nbd://10.0.0.3:10809/pfs --export nbd://10.0.0.4:10809/pfs --duration 30s\n  surge stripe-bench --export 'nbd+unix:///pfs?socket=/run/s1.sock' --export 'nbd+unix:///pfs?socket=/run/s2.sock' --json"
)]
pub struct Args {
    /// A stripe member, nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH, in stripe order (repeatable).
    #[arg(long = "export", value_name = "URI", required = true)]
    pub exports: Vec<Member>,
    /// Stripe unit.
    #[arg(long, default_value = "256KiB", value_parser = size)]
    pub chunk: u64,
    /// Request size.
    #[arg(long, default_value = "1MiB", value_parser = size)]
    pub request: u64,
    /// Requests in flight (one stream with its own connections each).
    #[arg(long, default_value_t = 1)]
    pub outstanding: usize,
    /// Where this client's region of the striped volume starts.
    #[arg(long, default_value = "0", value_parser = size)]
    pub offset: u64,
    /// Length of the region written, cyclically.
    #[arg(long, default_value = "64MiB", value_parser = size)]
    pub region: u64,
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub duration: std::time::Duration,
    /// Each stream waits this long after a request completes before it sends the next (think time).
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub think: std::time::Duration,
    /// Source address of TCP connections (e.g. 127.0.1.5: proxies may tell applications apart by address).
    #[arg(long, value_name = "IP")]
    pub bind: Option<IpAddr>,
    /// Print `ready` once connected, then start on a line from stdin (for experiment harnesses).
    #[arg(long)]
    pub wait_go: bool,
    /// Print every completion as JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = BenchConfig {
        members: a.exports,
        bind: a.bind,
        chunk: a.chunk,
        request: a.request,
        outstanding: a.outstanding,
        offset: a.offset,
        region: a.region,
        duration: a.duration,
        think: a.think,
        wait_go: a.wait_go,
    };
    let o = client::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string(&o)?);
        return Ok(());
    }
    let n = o.completions_ns.len();
    let secs = o.completions_ns.last().map_or(0.0, |&t| (t - o.started_ns) as f64 / 1e9);
    let mut lat = o.latencies_us.clone();
    lat.sort_unstable();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    println!(
        "{n} requests of {} in {secs:.1} s: {:.1} MB/s, latency p50 {} us, p99 {} us",
        surge_block::units::format_size(o.request_bytes),
        n as f64 * o.request_bytes as f64 / 1e6 / secs.max(1e-9),
        q(0.5),
        q(0.99)
    );
    Ok(())
}
