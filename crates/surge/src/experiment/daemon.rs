//! A `surge serve` process for one run of an experiment, started as a user
//! starts the daemon (exports are spec strings, built by the same builders),
//! on a unix socket in its own data directory; its control socket answers
//! the harness's questions (`status`, `set`), and SIGTERM stops it cleanly.

use crate::control::{self, Request, TargetStatus};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use surge_block::model::Scale;

/// How the daemon is started.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// `NAME=KIND:ARGS`, as `--export` takes them.
    pub exports: Vec<String>,
    pub scale: Scale,
    /// `--local-modify-rules` (none by default).
    pub modify_rules: Option<&'static str>,
    /// Other flags (none by default: the daemon's defaults).
    pub extra: Vec<String>,
}

impl DaemonSpec {
    pub fn new(exports: Vec<String>, scale: Scale) -> Self {
        DaemonSpec { exports, scale, modify_rules: None, extra: Vec::new() }
    }

    /// The flags after `surge serve --data-dir DIR --listen ... --control ...`.
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for e in &self.exports {
            a.push("--export".into());
            a.push(e.clone());
        }
        if !self.scale.is_full() {
            a.push("--local-scale".into());
            a.push(format!("time={},rate={}", self.scale.time, self.scale.rate));
        }
        if let Some(r) = self.modify_rules {
            a.push("--local-modify-rules".into());
            a.push(r.into());
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The command line, for reports.
    pub fn command_line(&self) -> String {
        let q = |s: &String| if s.contains([',', '=', ' ']) && !s.starts_with("--") { format!("'{s}'") } else { s.clone() };
        format!("surge serve --data-dir DIR --listen unix:DIR/nbd.sock {}", self.args().iter().map(q).collect::<Vec<_>>().join(" "))
    }
}

/// A running daemon; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon {
    child: Option<Child>,
    pub sock: PathBuf,
    pub control: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Start it in `dir` and wait until its control socket answers.
    pub fn start(dir: &Path, spec: &DaemonSpec) -> anyhow::Result<Daemon> {
        std::fs::create_dir_all(dir)?;
        let (sock, control, log) = (dir.join("nbd.sock"), dir.join("control.sock"), dir.join("serve.log"));
        let child = Command::new(std::env::current_exe().context("finding the surge binary")?)
            .args(["--log", "warn", "serve", "--data-dir"])
            .arg(dir)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(&control)
            .args(spec.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting surge serve")?;
        let mut d = Daemon { child: Some(child), sock, control, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if d.sock.exists() && control::call(&d.control, &Request::Status).is_ok_and(|r| r.ok) {
                return Ok(d);
            }
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                anyhow::bail!("surge serve exited ({st}) while starting:\n{}", d.log_text());
            }
            anyhow::ensure!(Instant::now() < deadline, "surge serve did not answer within 60 s:\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `nbd+unix:///EXPORT?socket=...`
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    /// Every target's status (`surge status --json`).
    pub fn status(&self) -> anyhow::Result<Vec<TargetStatus>> {
        let r = control::call(&self.control, &Request::Status)?;
        anyhow::ensure!(r.ok, "status: {}", r.error.unwrap_or_default());
        Ok(r.targets.unwrap_or_default())
    }

    /// The status of target `name` (e.g. `app` for the export, `app/elastic`).
    pub fn target(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        self.status()?.into_iter().find(|t| t.name == name).map(|t| t.status).with_context(|| format!("no target {name:?} in the daemon's status"))
    }

    /// SIGTERM and wait (the daemon flushes every export and exits 0).
    pub fn stop(mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = child.try_wait()? {
                anyhow::ensure!(st.success(), "surge serve exited with {st} on SIGTERM:\n{}", self.log_text());
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("surge serve did not stop within 60 s of SIGTERM:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The daemon's local cloud, opened beside it (billing, and reading the
/// volumes back once it has stopped).
pub fn cloud(dir: &Path, scale: Scale) -> anyhow::Result<std::sync::Arc<surge_cloud::LocalProvider>> {
    let local = crate::stack::volume::LocalCloud { scale, ..Default::default() };
    let cfg = local.config(dir, surge_cloud::Delays::none());
    Ok(std::sync::Arc::new(surge_cloud::LocalProvider::open(cfg, std::sync::Arc::new(surge_block::SystemClock::new()))?))
}

/// Read back volume `name` of the stopped daemon's cloud, its model
/// unthrottled, with `check`.
pub fn read_volume<T>(prov: &surge_cloud::LocalProvider, name: &str, check: impl FnOnce(&dyn surge_block::BlockDev) -> anyhow::Result<T>) -> anyhow::Result<T> {
    use surge_cloud::Provider;
    let v = prov.list()?.into_iter().find(|v| v.name.as_deref() == Some(name)).with_context(|| format!("no volume named {name:?}"))?;
    let dev = prov.attach(&v.id)?;
    if let Some(m) = prov.model(&v.id) {
        m.set_shape(surge_block::model::Shape::default());
    }
    let r = check(dev.as_ref());
    drop(dev);
    let _ = prov.detach(&v.id);
    r
}

/// An elastic export's decisions and plans, gathered from its status.
#[derive(Default)]
pub struct ElasticLog {
    target: String,
    /// Decisions by (daemon time in µs, reason).
    seen: std::collections::BTreeMap<(u64, String), serde_json::Value>,
    /// The run's time scale (lines are in full-scale seconds).
    time: f64,
    plans: Vec<serde_json::Value>,
    /// The latest status seen.
    pub last: serde_json::Value,
}

impl ElasticLog {
    /// For the elastic target `target` (`NAME/elastic`).
    pub fn new(target: &str) -> Self {
        ElasticLog { target: target.into(), ..Default::default() }
    }

    /// Read the status once (`time`: the run's time scale, for the lines).
    pub fn poll(&mut self, control: &Path, time: f64) {
        let Ok(r) = crate::control::call(control, &crate::control::Request::Status) else { return };
        let Some(st) = r.targets.into_iter().flatten().find(|t| t.name == self.target).map(|t| t.status) else { return };
        self.time = time;
        self.see(&st);
        self.last = st;
    }

    /// Take in one status of the elastic target.
    pub fn see(&mut self, st: &serde_json::Value) {
        for x in st["decisions"].as_array().into_iter().flatten() {
            let at = x["at_s"].as_f64().unwrap_or(0.0);
            self.seen.insert(((at * 1e6) as u64, x["reason"].as_str().unwrap_or("").to_string()), x.clone());
        }
        for p in st["boost"]["plans"].as_array().into_iter().flatten() {
            if !self.plans.contains(p) {
                self.plans.push(p.clone());
            }
        }
    }

    pub fn sorted_plans(mut self) -> Vec<serde_json::Value> {
        self.plans.sort_by(|a, b| a["at_s"].as_f64().unwrap_or(0.0).total_cmp(&b["at_s"].as_f64().unwrap_or(0.0)));
        self.plans
    }

    /// One line per decision, full-scale seconds of the daemon's clock.
    pub fn lines(&self) -> Vec<String> {
        let f = if self.time > 0.0 { self.time } else { 1.0 };
        self.seen
            .values()
            .map(|x| {
                let size = x["size"].as_u64().map_or(String::new(), |b| format!(" {}", surge_block::units::format_size(b)));
                format!("{:.1} s: {}{size}: {}", x["at_s"].as_f64().unwrap_or(0.0) / f, x["action"].as_str().unwrap_or("?"), x["reason"].as_str().unwrap_or(""))
            })
            .collect()
    }

    /// Every decision seen, as the daemon reported it, in order.
    pub fn decisions(&self) -> Vec<serde_json::Value> {
        self.seen.values().cloned().collect()
    }
}
