//! `surge qos`: list tenants of shared pools and change their shares through
//! the control socket (`surge set qos/TENANT k=v` does the same). The daemon
//! side, the `share:` export kind, is in `stack::share`.

use crate::cmd::status::ControlArgs;
use crate::control::{self, Request};

#[derive(clap::Args, Debug)]
#[command(
    about = "Show or change tenants' shares of a shared pool (`share:` exports)",
    after_long_help = "Examples:\n  surge qos\n  surge qos set a weight=4\n  surge qos set b limit=50MB/s reservation=10MB/s\n  surge qos set a depth=8 adaptive=20ms   (pool-wide)\n  surge qos set b limit=off"
)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub control: ControlArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// List tenants: share, bytes, IOPS, queue depth, latency p50/p99.
    Show,
    /// Change a tenant: weight=N, reservation=RATE|off, limit=RATE|off;
    /// pool-wide: depth=D, overhead=SIZE, adaptive=on|off|MS.
    Set {
        tenant: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let socket = args.control.socket()?;
    match args.action.unwrap_or(Action::Show) {
        Action::Show => {
            let resp = control::call(&socket, &Request::Status)?;
            anyhow::ensure!(resp.ok, "surge serve answered: {}", resp.error.unwrap_or_default());
            let targets = resp.targets.unwrap_or_default();
            print!("{}", render(targets.iter().filter(|t| t.kind == "tenant").map(|t| &t.status)));
            Ok(())
        }
        Action::Set { tenant, settings } => {
            let target = format!("qos/{}", tenant.trim_start_matches("qos/"));
            for s in settings {
                let (key, value) = s.split_once('=').ok_or_else(|| anyhow::anyhow!("{s:?} is not KEY=VALUE"))?;
                let req = Request::Set { target: target.clone(), key: key.into(), value: value.into() };
                let resp = control::call(&socket, &req)?;
                anyhow::ensure!(resp.ok, "{target} {s}: {}", resp.error.unwrap_or_default());
                println!("{target} {s}: ok");
            }
            Ok(())
        }
    }
}

/// One line per tenant.
fn render<'a>(tenants: impl Iterator<Item = &'a serde_json::Value>) -> String {
    let mut s = format!(
        "{:<12} {:<10} {:>6} {:>12} {:>12} {:>10} {:>10} {:>6} {:>9} {:>9} {:>5}\n",
        "TENANT", "POOL", "WEIGHT", "RESERVE/s", "LIMIT/s", "MB/s", "IOPS", "QUEUE", "P50", "P99", "D"
    );
    for v in tenants {
        let t = &v["tenant"];
        let rate = |x: &serde_json::Value| x.as_u64().map_or("-".to_string(), |r| format!("{:.1}MB", r as f64 / 1e6));
        s += &format!(
            "{:<12} {:<10} {:>6} {:>12} {:>12} {:>10.1} {:>10.0} {:>6} {:>8}us {:>8}us {:>5}\n",
            t["name"].as_str().unwrap_or("?"),
            v["pool"].as_str().unwrap_or("?"),
            t["config"]["weight"].as_u64().unwrap_or(0),
            rate(&t["config"]["reservation"]),
            rate(&t["config"]["limit"]),
            t["recent"]["bytes_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
            t["recent"]["iops"].as_f64().unwrap_or(0.0),
            t["queued"].as_u64().unwrap_or(0) + t["in_flight"].as_u64().unwrap_or(0),
            t["recent"]["p50_us"].as_u64().unwrap_or(0),
            t["recent"]["p99_us"].as_u64().unwrap_or(0),
            v["pool_depth"].as_u64().unwrap_or(0),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_has_a_line_per_tenant() {
        let st = json!({"pool": "p", "pool_depth": 4, "tenant": {"name": "a", "config": {"weight": 7, "limit": 20_000_000}, "recent": {"bytes_per_sec": 3e6}}});
        let table = render([st].iter());
        let line = table.lines().nth(1).unwrap();
        assert!(line.starts_with("a ") && line.contains(" 7 ") && line.contains("20.0MB") && line.contains("3.0"), "{table}");
    }
}
