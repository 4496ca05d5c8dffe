//! `surge top`: a live view of a running `surge serve`, from its control
//! socket: exports with throughput, elastic layers with their phase, dirty
//! bytes and cost, cloud volumes with their credits, fair-share tenants.

use crate::cmd::status::ControlArgs;
use crate::control::{self, Request, TargetStatus};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;
use serde_json::Value;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
#[command(
    about = "Live view of exports, phases, throughput, dirty bytes, credits and cost (q quits)",
    after_long_help = "Examples:\n  surge top\n  surge top --control /tmp/t/control.sock --interval 500ms"
)]
pub struct Args {
    #[command(flatten)]
    pub target: ControlArgs,
    /// Refresh interval.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = surge_block::units::parse_duration(s)?;
    if d < Duration::from_millis(50) {
        return Err("at least 50ms".into());
    }
    Ok(d)
}

/// Two polls apart, for rates.
struct View {
    targets: Vec<TargetStatus>,
    prev: Option<(Instant, Vec<TargetStatus>)>,
    at: Instant,
    error: Option<String>,
}

fn num(v: &Value, path: &[&str]) -> f64 {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_f64).unwrap_or(0.0)
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// Rounded, for a screen: `3.0 MiB`, `512 B`.
fn format_size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", b / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b / 1_048_576.0),
        _ => format!("{:.1} GiB", b / 1_073_741_824.0),
    }
}

fn rate(bytes_per_s: f64) -> String {
    if bytes_per_s >= 1e6 {
        format!("{:.1} MB/s", bytes_per_s / 1e6)
    } else if bytes_per_s >= 1e3 {
        format!("{:.1} kB/s", bytes_per_s / 1e3)
    } else {
        format!("{bytes_per_s:.0} B/s")
    }
}

impl View {
    /// Bytes/s read and written by export `name` since the previous poll.
    fn throughput(&self, name: &str, now: &Value) -> (f64, f64) {
        let Some((t0, prev)) = &self.prev else { return (0.0, 0.0) };
        let Some(before) = prev.iter().find(|t| t.name == name) else { return (0.0, 0.0) };
        let dt = self.at.duration_since(*t0).as_secs_f64().max(1e-3);
        let d = |k| (num(now, &["io", k]) - num(&before.status, &["io", k])).max(0.0) / dt;
        (d("read_bytes"), d("write_bytes"))
    }

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &TargetStatus> {
        let kind = kind.to_string();
        self.targets.iter().filter(move |t| t.kind == kind)
    }

    /// Rows of each table, as text (the terminal drawing and tests share them).
    fn export_rows(&self) -> Vec<Vec<String>> {
        self.of_kind("export")
            .map(|t| {
                let (r, w) = self.throughput(&t.name, &t.status);
                vec![
                    t.name.clone(),
                    text(&t.status, "kind"),
                    format_size(num(&t.status, &["size_bytes"]) as u64),
                    rate(r),
                    rate(w),
                    format!("{}", num(&t.status, &["connections", "active"])),
                ]
            })
            .collect()
    }

    fn layer_rows(&self) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for t in self.of_kind("elastic") {
            let s = &t.status;
            rows.push(vec![
                t.name.clone(),
                text(s, "state"),
                text(s, "phase"),
                format_size(num(s, &["cache_size"]) as u64),
                format_size(num(s, &["dirty_bytes"]) as u64),
                format!("{:.0}%", num(s, &["utilization"]) * 100.0),
                format!("${:.6}", num(s, &["cost", "usd"])),
            ]);
        }
        for t in self.of_kind("volume") {
            let s = &t.status;
            let credits = s.get("burst_balance_percent").and_then(Value::as_f64).map_or("-".into(), |p| format!("credits {p:.1}%"));
            rows.push(vec![t.name.clone(), text(s, "spec"), credits, "-".into(), "-".into(), "-".into(), format!("${:.6}", num(s, &["usd_so_far"]))]);
        }
        for t in self.of_kind("tenant") {
            let s = &t.status;
            rows.push(vec![
                t.name.clone(),
                format!("pool {}", text(s, "pool")),
                format!("weight {}", num(s, &["tenant", "config", "weight"])),
                format!("queued {}", num(s, &["tenant", "queued"])),
                format!("in flight {}", num(s, &["tenant", "in_flight"])),
                format!("depth {}", num(s, &["pool_depth"])),
                "-".into(),
            ]);
        }
        rows
    }

    fn total_cost(&self) -> f64 {
        self.of_kind("elastic").map(|t| num(&t.status, &["cost", "usd"])).sum::<f64>()
            + self.of_kind("volume").map(|t| num(&t.status, &["usd_so_far"])).sum::<f64>()
    }

    fn draw(&self, f: &mut Frame) {
        let [head, exports, layers] = Layout::vertical([Constraint::Length(1), Constraint::Percentage(40), Constraint::Fill(1)]).areas(f.area());
        let status = match &self.error {
            Some(e) => format!("surge top: {e}"),
            None => format!("surge top: {} targets, cost so far ${:.6}   (q quits)", self.targets.len(), self.total_cost()),
        };
        f.render_widget(Paragraph::new(Line::from(status)), head);
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let table = |title: &str, header: &[&str], rows: Vec<Vec<String>>, widths: &[u16]| {
            Table::new(rows.into_iter().map(Row::new), widths.iter().map(|w| Constraint::Length(*w)))
                .header(Row::new(header.iter().map(|h| h.to_string())).style(bold))
                .block(Block::bordered().title(title.to_string()))
        };
        f.render_widget(table("exports", &["EXPORT", "KIND", "SIZE", "READ", "WRITE", "CONNS"], self.export_rows(), &[16, 10, 10, 12, 12, 6]), exports);
        f.render_widget(
            table("layers", &["LAYER", "STATE", "PHASE", "CACHE", "DIRTY", "UTIL", "COST"], self.layer_rows(), &[20, 20, 16, 12, 12, 10, 12]),
            layers,
        );
    }

    fn poll(&mut self, socket: &std::path::Path) {
        match control::call(socket, &Request::Status) {
            Ok(r) if r.ok => {
                let now = Instant::now();
                let old = std::mem::replace(&mut self.targets, r.targets.unwrap_or_default());
                self.prev = Some((self.at, old));
                self.at = now;
                self.error = None;
            }
            Ok(r) => self.error = r.error,
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let socket = args.target.socket()?;
    // Fail before taking over the terminal if nothing answers.
    control::call(&socket, &Request::Status)?;
    let mut view = View { targets: Vec::new(), prev: None, at: Instant::now(), error: None };
    view.poll(&socket);
    let mut term = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            term.draw(|f| view.draw(f))?;
            if event::poll(args.interval)? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.code == KeyCode::Char('q') || k.code == KeyCode::Esc || ctrl_c {
                        return Ok(());
                    }
                }
                continue;
            }
            view.poll(&socket);
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use serde_json::json;

    fn target(name: &str, kind: &str, status: Value) -> TargetStatus {
        TargetStatus { name: name.into(), kind: kind.into(), status }
    }

    #[test]
    fn the_screen_shows_throughput_phase_dirty_bytes_credits_and_cost() {
        let t0 = Instant::now();
        let before = vec![target("d", "export", json!({"kind": "elastic", "size_bytes": 1 << 30, "io": {"read_bytes": 0, "write_bytes": 0}}))];
        let now = vec![
            target("d", "export", json!({"kind": "elastic", "size_bytes": 1 << 30, "io": {"read_bytes": 0, "write_bytes": 4_000_000}, "connections": {"active": 1}})),
            target("d/elastic", "elastic", json!({"state": "boost", "phase": "boost", "cache_size": 16 << 20, "dirty_bytes": 3 << 20, "utilization": 0.9, "cost": {"usd": 0.0125}})),
            target("g/volume", "volume", json!({"spec": "gp2:8GiB", "burst_balance_percent": 97.5, "usd_so_far": 0.5})),
        ];
        let view = View { targets: now, prev: Some((t0, before)), at: t0 + Duration::from_secs(2), error: None };
        let mut term = ratatui::Terminal::new(TestBackend::new(110, 20)).unwrap();
        term.draw(|f| view.draw(f)).unwrap();
        let screen: String = term.backend().buffer().content().iter().map(|c| c.symbol()).collect::<Vec<_>>().chunks(110).map(|l| l.concat() + "\n").collect();
        for want in ["2.0 MB/s", "boost", "3.0 MiB", "16.0 MiB", "90%", "$0.012500", "credits 97.5%", "$0.512500", "gp2:8GiB"] {
            assert!(screen.contains(want), "{want:?} not on screen:\n{screen}");
        }
    }
}
