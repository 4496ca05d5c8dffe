//! `surge status`: what a running `surge serve` is doing, from its control socket.

use crate::control::{self, Request, TargetStatus};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
#[command(
    about = "Show every export (size, kind, I/O counters, connections) and registered layer",
    after_long_help = "Examples:\n  surge status\n  surge status --json | jq '.[0].status.io'\n  surge status --control /tmp/t/control.sock"
)]
pub struct Args {
    /// Print the raw JSON (a list of {name, kind, status}).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: ControlArgs,
}

/// How to find the daemon; shared by every control client command.
#[derive(clap::Args, Debug, Clone)]
pub struct ControlArgs {
    /// The daemon's control socket [default: <data-dir>/control.sock].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Data directory of the daemon, used to find its control socket.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

impl ControlArgs {
    pub fn socket(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.control {
            return Ok(p.clone());
        }
        let dir = match &self.data_dir {
            Some(d) => d.clone(),
            None => crate::config::default_data_dir()?,
        };
        Ok(dir.join("control.sock"))
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let resp = control::call(&args.target.socket()?, &Request::Status)?;
    if let Some(e) = resp.error {
        anyhow::bail!("surge serve answered: {e}");
    }
    let targets = resp.targets.unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&targets)?);
    } else {
        print!("{}", render(&targets));
    }
    Ok(())
}

/// Human-readable: one block per target, nested fields indented.
pub fn render(targets: &[TargetStatus]) -> String {
    let mut s = String::new();
    if targets.is_empty() {
        s.push_str("nothing registered\n");
    }
    for t in targets {
        let _ = writeln!(s, "{} ({})", t.name, t.kind);
        render_value(&mut s, &t.status, 1);
    }
    s
}

fn render_value(s: &mut String, v: &serde_json::Value, depth: usize) {
    let Some(map) = v.as_object() else {
        let _ = writeln!(s, "{}{}", "  ".repeat(depth), scalar(v));
        return;
    };
    for (k, v) in map {
        let pad = "  ".repeat(depth);
        match v {
            serde_json::Value::Object(m) if m.is_empty() => {}
            serde_json::Value::Object(_) => {
                let _ = writeln!(s, "{pad}{k}:");
                render_value(s, v, depth + 1);
            }
            // A list of objects (burstable members, decisions): one block each.
            serde_json::Value::Array(items) if !items.is_empty() && items.iter().all(|i| i.is_object()) => {
                let _ = writeln!(s, "{pad}{k}:");
                for (i, item) in items.iter().enumerate() {
                    let _ = writeln!(s, "{pad}  [{i}]");
                    render_value(s, item, depth + 2);
                }
            }
            _ => {
                let _ = writeln!(s, "{pad}{k}: {}", field(k, v));
            }
        }
    }
}

/// Byte counts and rates get a human size beside them.
fn field(key: &str, v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(n) if key.ends_with("bytes") && n >= 1024.0 => format!("{} ({})", scalar(v), human_bytes(n as u64)),
        Some(n) if key.ends_with("bytes_per_s") && n >= 1024.0 => format!("{n:.0} ({}/s)", human_bytes(n as u64)),
        _ => scalar(v),
    }
}

fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn render_nests_fields_and_humanizes_byte_counts() {
        let t = [TargetStatus {
            name: "disk".into(),
            kind: "export".into(),
            status: json!({"size_bytes": 1u64 << 30, "io": {"reads": 3, "read_bytes": 1536}, "detail": {}, "kind": "file"}),
        }];
        let out = render(&t);
        assert!(out.starts_with("disk (export)\n"), "{out}");
        assert!(out.contains("  size_bytes: 1073741824 (1.0 GiB)"), "{out}");
        assert!(out.contains("  io:\n") && out.contains("    read_bytes: 1536 (1.5 KiB)"), "{out}");
        assert!(out.contains("    reads: 3\n") && out.contains("  kind: file\n"), "{out}");
        assert!(!out.contains("detail"), "empty objects are skipped: {out}");
        assert_eq!(render(&[]), "nothing registered\n");
        let t = [TargetStatus { name: "v/burstable".into(), kind: "burstable".into(), status: json!({"members": [{"slot": 0, "rebuild": {"percent": 12.5}}]}) }];
        let out = render(&t);
        assert!(out.contains("  members:\n    [0]\n      rebuild:\n        percent: 12.5\n"), "{out}");
    }

    /// An elastic volume's drain progress reads as one line plus its numbers.
    #[test]
    fn render_shows_drain_progress_with_a_human_rate() {
        let t = [TargetStatus {
            name: "d/elastic".into(),
            kind: "elastic".into(),
            status: json!({"drain": {"dirty_bytes": 6u64 << 20, "rate_bytes_per_s": 33.0e6, "eta_s": 0.19, "summary": "6.3 MB dirty, flushing at 33.0 MB/s, clean in ~0 s"}}),
        }];
        let out = render(&t);
        assert!(out.contains("  drain:\n"), "{out}");
        assert!(out.contains("    rate_bytes_per_s: 33000000 (31.5 MiB/s)"), "{out}");
        assert!(out.contains("    dirty_bytes: 6291456 (6.0 MiB)"), "{out}");
        assert!(out.contains("    summary: 6.3 MB dirty, flushing at 33.0 MB/s, clean in ~0 s"), "{out}");
    }

    #[test]
    fn control_socket_defaults_to_the_data_dir() {
        let a = ControlArgs { control: None, data_dir: Some("/d".into()) };
        assert_eq!(a.socket().unwrap(), PathBuf::from("/d/control.sock"));
        let a = ControlArgs { control: Some("/c.sock".into()), data_dir: Some("/d".into()) };
        assert_eq!(a.socket().unwrap(), PathBuf::from("/c.sock"));
    }
}
