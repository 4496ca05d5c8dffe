//! Operations: the Prometheus endpoint scraped during real I/O, `surge top`
//! driven in tmux while an elastic volume changes phase, SIGHUP reloads, and
//! JSON logs.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// GET /metrics with a bare HTTP/1.0 request.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample whose line starts with `series` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().split(' ').next()).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

#[test]
fn metrics_move_while_a_client_writes() {
    let qemu_io = require("qemu-io", "qemu-utils");
    let port = free_port();
    let s = Surge::start(&["--metrics", &format!("127.0.0.1:{port}"), "--export", "d=gp2:1GiB"]);
    assert!(s.stdout().contains(&format!("curl http://127.0.0.1:{port}/metrics")), "{}", s.stdout());
    let before = scrape(port);
    assert_eq!(value(&before, "surge_export_bytes_total{export=\"d\",op=\"write\"}"), 0.0);
    let credits0 = value(&before, "surge_volume_credits{layer=\"d/volume\",unit=\"ops\"}");

    // A client writing in a loop while we scrape.
    let stop = Arc::new(AtomicBool::new(false));
    let (uri, stop2) = (s.uri("d"), stop.clone());
    let writer = std::thread::spawn(move || {
        let mut rounds = 0;
        while !stop2.load(Ordering::Relaxed) || rounds == 0 {
            run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "write -P 7 0 4M", &uri]));
            rounds += 1;
        }
        rounds
    });
    let mut seen = vec![];
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 3 && Instant::now() < deadline {
        let t = scrape(port);
        let w = value(&t, "surge_export_bytes_total{export=\"d\",op=\"write\"}");
        if seen.last().is_none_or(|&last| w > last) {
            seen.push(w);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(seen.len() >= 3, "the write counter moved during I/O: {seen:?}");

    let after = scrape(port);
    let written = value(&after, "surge_export_bytes_total{export=\"d\",op=\"write\"}");
    assert_eq!(written, ((rounds * 4) << 20) as f64, "every byte counted");
    assert!(value(&after, "surge_export_ops_total{export=\"d\",op=\"write\"}") > 0.0);
    assert!(value(&after, "surge_export_latency_seconds_count{export=\"d\",op=\"write\"}") > 0.0);
    assert!(value(&after, "surge_export_latency_seconds_sum{export=\"d\",op=\"write\"}") > 0.0);
    assert!(value(&after, "surge_volume_credits{layer=\"d/volume\",unit=\"ops\"}") < credits0, "gp2 credits were spent");
    assert!(value(&after, "surge_cost_dollars{layer=\"d/volume\"}") > 0.0);
    assert!(after.contains("# TYPE surge_export_latency_seconds histogram"));
}

fn tmux(args: &[&str]) -> String {
    let tmux = require("tmux", "tmux");
    text(&run_ok(Command::new(tmux).args(args)).stdout)
}

/// Wait until the `v/elastic` row of the tmux pane satisfies `ok`; returns the screen.
fn wait_row(session: &str, what: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let screen = tmux(&["capture-pane", "-p", "-t", session]);
        if screen.lines().any(|l| l.contains("v/elastic") && ok(l)) {
            return screen;
        }
        assert!(Instant::now() < deadline, "{what} never appeared on screen:\n{screen}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct TmuxSession(String);
impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.0]).stderr(std::process::Stdio::null()).status();
    }
}

#[test]
fn top_shows_an_elastic_volume_change_phase() {
    let qemu_io = require("qemu-io", "qemu-utils");
    // A slow backing volume (4 MB/s), quick policy windows, no attach delay.
    let spec = "v=elastic:backing=reserved:64MiB,bw=4MB/s,cache=reserved,cache_bw=200MB/s,window=1s,id=2s,initial=32MiB,min=8MiB,granularity=8MiB,attach_delay=0s";
    let s = Surge::start(&["--export", spec]);
    let session = format!("surge-top-{}", std::process::id());
    let _guard = TmuxSession(session.clone());
    let cmd = format!("{SURGE} top --control {} --interval 200ms", s.control.display());
    tmux(&["new-session", "-d", "-s", &session, "-x", "160", "-y", "30", &cmd]);
    wait_row(&session, "the idle elastic layer", Duration::from_secs(20), |l| l.contains("idle"));

    // A burst well above 30 % of the backing bandwidth: a cache is attached (boost).
    let uri = s.uri("v");
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut off = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", &format!("write -P 3 {off} 2M"), &uri]));
            off = (off + (2 << 20)) % (48 << 20);
        }
    });
    wait_row(&session, "phase boost", Duration::from_secs(60), |l| l.contains("boost"));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    // Quiet for the inactivity delay: the cache drains (phase drain, often
    // brief) and is detached (idle again): either way, no longer boost.
    wait_row(&session, "the end of boost (drain or idle)", Duration::from_secs(60), |l| !l.contains("boost") && (l.contains("drain") || l.contains("idle")));
    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("tmux").args(["has-session", "-t", &session]).status().unwrap().success() {
        assert!(Instant::now() < deadline, "surge top did not quit on q");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sighup_reloads_live_settings_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("surge.toml");
    let write_cfg = |weight: u32, extra: &str| {
        std::fs::write(
            &cfg,
            format!("{extra}\n[[pool]]\nname='p'\nspec='memory:64MiB'\n[[export]]\nname='a'\nspec='share:p,weight={weight}'\n[[export]]\nname='b'\nspec='share:p'\n"),
        )
        .unwrap();
    };
    write_cfg(1, "");
    let s = Surge::start(&["--config", cfg.to_str().unwrap()]);
    let weight = || {
        let out = s.client(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().iter().find(|t| t["name"] == "qos/a").unwrap()["status"]["tenant"]["config"]["weight"].as_u64().unwrap()
    };
    assert_eq!(weight(), 1);
    write_cfg(5, "workers = 3\nlog = 'info'");
    s.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while weight() != 5 {
        assert!(Instant::now() < deadline, "weight not reloaded:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.logs().contains("needs a restart: workers changed") {
        assert!(Instant::now() < deadline, "no restart notice:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = s.logs();
    assert!(logs.contains("qos/a weight=5: applied") && logs.contains("log filter is now \"info\""), "{logs}");
    // A config that no longer parses changes nothing and says so.
    std::fs::write(&cfg, "this is not toml [").unwrap();
    s.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.logs().contains("config not reloaded") {
        assert!(Instant::now() < deadline, "{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(weight(), 5);
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let control = dir.path().join("control.sock");
    let mut cmd = Command::new(SURGE);
    cmd.args(["--log-format", "json", "serve", "--data-dir"]).arg(dir.path()).arg("--listen").arg(format!("unix:{}", sock.display())).arg("--control").arg(&control).args(["--export", "m=memory:1MiB"]);
    let mut s = Surge::spawn(cmd, dir, sock, control);
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(20)).success());
    let logs = s.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "the shutdown is logged");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{l}");
    }
    assert!(logs.contains("shutting down"), "{logs}");
}

#[test]
fn the_default_log_shows_decisions_not_every_attach() {
    let mut s = Surge::start(&["--export", "g=gp2:1GiB", "--export", "m=memory:1MiB"]);
    let qemu_img = require("qemu-img", "qemu-utils");
    run_ok(Command::new(qemu_img).args(["info", &s.uri("m")]));
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(20)).success());
    let logs = s.logs();
    assert!(logs.contains("shutting down"), "{logs}");
    assert!(!logs.contains("attached volume") && !logs.contains("connection open"), "routine events at the default level:\n{logs}");
}
