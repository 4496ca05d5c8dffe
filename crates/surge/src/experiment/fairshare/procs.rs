//! The processes of `surge experiment fairshare`, every part its own process:
//! for the single-server part one `surge serve` per run ([`serve`]); for the
//! parallel store N storage servers (`surge serve` with one emulated
//! reserved-bandwidth volume each), N proxies (`surge serve` with a `share:`
//! pool over one server's export, cooperating through `--coop-peer`s); and
//! client processes (`surge stripe-bench`, [`run_client_procs`]), across
//! servers each connecting from its application's address range so the
//! proxies tell the applications apart by address.

use super::client::BenchOutcome;
use crate::control::{self, Request};
use anyhow::Context as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The two applications' client address ranges (127/8 is all loopback on Linux).
pub const APP_NETS: [&str; 2] = ["127.0.1.0/24", "127.0.2.0/24"];
pub const APP_NAMES: [&str; 2] = ["a", "b"];

fn app_addr(app: usize, client: usize) -> String {
    format!("127.0.{}.{}", app + 1, client + 1)
}

/// The emulated storage server of one data server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerSpec {
    pub count: usize,
    /// Reserved bandwidth of each server's volume, bytes/s.
    pub bw: u64,
    pub latency_us: u64,
    pub size: u64,
}

/// Where a proxy's pool comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// `remote:` over the storage server's unix socket: the proxy is interposed.
    Remote,
    /// The proxy holds the emulated volume itself (no separate server hop).
    InProxy,
}

impl Backend {
    /// `remote:` when this build has the NBD client export kind.
    pub fn available() -> Backend {
        if crate::stack::KINDS.contains(&"remote") {
            Backend::Remote
        } else {
            Backend::InProxy
        }
    }
}

pub struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// User + system CPU seconds the process has used so far (/proc/PID/stat).
    pub fn cpu_s(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name (which may hold spaces) in parentheses.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).context("reading /proc/PID/stat")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
        let ticks: u64 = f.get(11).zip(f.get(12)).and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?)).context("parsing /proc/PID/stat")?;
        // SAFETY: sysconf has no side effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Ok(ticks as f64 / hz)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first: surge serve removes its sockets and exits.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!("{} did not exit on SIGTERM; killing it", self.what);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn surge() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("finding the surge binary")
}

/// Start `surge serve ARGS` and wait until its control socket answers.
pub fn serve(dir: &Path, what: &str, args: &[String]) -> anyhow::Result<Proc> {
    std::fs::create_dir_all(dir)?;
    let log = std::fs::File::create(dir.join("serve.log"))?;
    let child = Command::new(surge()?)
        .args(["--log", "warn", "serve", "--data-dir"])
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut p = Proc { child, what: what.to_string() };
    let control = dir.join("control.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if control::call(&control, &Request::Status).is_ok_and(|r| r.ok) {
            return Ok(p);
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            anyhow::bail!("{what} exited ({status}) while starting:\n{log}");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not answer on {} within 30 s", control.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Storage servers and the proxies in front of them.
pub struct Store {
    pub dir: PathBuf,
    pub spec: ServerSpec,
    /// TCP ports where clients reach each server directly, and each proxy.
    pub server_ports: Vec<u16>,
    pub proxy_ports: Vec<u16>,
    // Proxies are dropped (stopped) before the servers they use; the servers
    // are only held to be stopped.
    proxies: Vec<Proc>,
    _servers: Vec<Proc>,
}

impl Store {
    /// Start `spec.count` servers and as many proxies with tenants a and b
    /// (weights 1:1, cooperation on; change both live with [`Store::set`]).
    pub fn start(dir: &Path, spec: &ServerSpec, backend: Backend) -> anyhow::Result<Store> {
        let volume = format!("reserved:{},bw={}/s,lat={}us", spec.size, spec.bw, spec.latency_us);
        let mut servers = Vec::new();
        let mut server_ports = Vec::new();
        for k in 0..spec.count {
            let d = dir.join(format!("server{k}"));
            let port = surge_bb::local::free_port()?;
            let args = vec![
                "--listen".into(),
                format!("unix:{}", d.join("nbd.sock").display()),
                "--listen".into(),
                format!("tcp:127.0.0.1:{port}"),
                "--export".into(),
                format!("disk={volume}"),
            ];
            servers.push(serve(&d, &format!("storage server {k}"), &args)?);
            server_ports.push(port);
        }
        let coop: Vec<String> = (0..spec.count).map(|k| format!("unix:{}", dir.join(format!("proxy{k}")).join("coop.sock").display())).collect();
        let mut proxies = Vec::new();
        let mut proxy_ports = Vec::new();
        for k in 0..spec.count {
            let d = dir.join(format!("proxy{k}"));
            let port = surge_bb::local::free_port()?;
            let pool = match backend {
                Backend::Remote => format!("remote:nbd+unix:///disk?socket={}", dir.join(format!("server{k}")).join("nbd.sock").display()),
                Backend::InProxy => volume.clone(),
            };
            let mut args = vec![
                "--listen".into(),
                format!("tcp:127.0.0.1:{port}"),
                "--pool".into(),
                format!("pfs={pool}"),
                "--export".into(),
                "pfs=share:pfs,tenant=other".into(),
                "--coop-listen".into(),
                coop[k].clone(),
            ];
            for (app, net) in APP_NAMES.iter().zip(APP_NETS) {
                args.push("--export".into());
                args.push(format!("{app}=share:pfs,clients={net}"));
            }
            for (j, c) in coop.iter().enumerate() {
                if j != k {
                    args.push("--coop-peer".into());
                    args.push(c.clone());
                }
            }
            proxies.push(serve(&d, &format!("proxy {k}"), &args)?);
            proxy_ports.push(port);
        }
        Ok(Store { dir: dir.to_path_buf(), spec: spec.clone(), server_ports, proxy_ports, proxies, _servers: servers })
    }

    /// `surge qos set TENANT KEY=VALUE` on every proxy.
    pub fn set(&self, tenant: &str, key: &str, value: &str) -> anyhow::Result<()> {
        for k in 0..self.proxies.len() {
            let sock = self.dir.join(format!("proxy{k}")).join("control.sock");
            let req = Request::Set { target: format!("qos/{tenant}"), key: key.into(), value: value.into() };
            let r = control::call(&sock, &req)?;
            anyhow::ensure!(r.ok, "proxy {k}: qos/{tenant} {key}={value}: {}", r.error.unwrap_or_default());
        }
        Ok(())
    }

    /// Every proxy's status targets by name (None for a proxy that did not answer).
    pub fn proxy_statuses(&self) -> Vec<Option<serde_json::Map<String, serde_json::Value>>> {
        self.statuses("proxy")
    }

    /// Every `role` (proxy, server) process's status targets by name.
    pub fn statuses(&self, role: &str) -> Vec<Option<serde_json::Map<String, serde_json::Value>>> {
        (0..self.proxies.len())
            .map(|k| {
                let sock = self.dir.join(format!("{role}{k}")).join("control.sock");
                let r = control::call(&sock, &Request::Status).ok()?;
                Some(r.targets?.into_iter().map(|t| (t.name, t.status)).collect())
            })
            .collect()
    }

    /// Tenant status of every proxy (for the report: holds, credits).
    pub fn tenant_status(&self, tenant: &str) -> Vec<serde_json::Value> {
        (0..self.proxies.len())
            .filter_map(|k| {
                let sock = self.dir.join(format!("proxy{k}")).join("control.sock");
                let r = control::call(&sock, &Request::Status).ok()?;
                r.targets?.into_iter().find(|t| t.name == format!("qos/{tenant}")).map(|t| t.status)
            })
            .collect()
    }
}

/// How one application's clients run.
#[derive(Debug, Clone)]
pub struct AppLoad {
    pub clients: usize,
    /// Servers its files stripe over (indices), in stripe order.
    pub servers: Vec<usize>,
    pub outstanding: usize,
}

#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub apps: [AppLoad; 2],
    /// Through the proxies, or straight to the storage servers.
    pub via_proxies: bool,
    pub chunk: u64,
    pub request: u64,
    /// Think time of every stream after each request (zero: back to back).
    pub think: Duration,
    pub duration: Duration,
}

/// Completions of one run: per application, (time since the start, bytes).
pub type Completions = [Vec<(Duration, u64)>; 2];

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    app: usize,
}

/// One client process: `surge stripe-bench` over `members` (NBD URIs, in stripe order).
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// Application (tenant) index its completions count for.
    pub app: usize,
    pub members: Vec<String>,
    /// Source address of its TCP connections.
    pub bind: Option<String>,
    pub chunk: u64,
    pub request: u64,
    pub outstanding: usize,
    pub offset: u64,
    pub region: u64,
    pub think: Duration,
    pub duration: Duration,
}

/// Run the clients of one run across the servers, every client its own process.
pub fn run_clients(store: &Store, load: &LoadSpec) -> anyhow::Result<Completions> {
    Ok(run_clients_with(store, load, || ())?.0)
}

/// [`run_clients`], running `during` beside the clients.
pub fn run_clients_with<T: Send>(store: &Store, load: &LoadSpec, during: impl FnOnce() -> T + Send) -> anyhow::Result<(Completions, T)> {
    let spec = &store.spec;
    let total: usize = load.apps.iter().map(|a| a.clients).sum();
    // Each client writes its own region of its application's striped volume
    // (as wide as the servers it uses), cyclically; regions start on
    // different servers so the clients do not move in lock step.
    let mut clients = Vec::new();
    let mut n = 0;
    for (app, a) in load.apps.iter().enumerate() {
        for i in 0..a.clients {
            let members = a
                .servers
                .iter()
                .map(|&s| {
                    let port = if load.via_proxies { store.proxy_ports[s] } else { store.server_ports[s] };
                    let export = if load.via_proxies { "pfs" } else { "disk" };
                    format!("nbd://127.0.0.1:{port}/{export}")
                })
                .collect();
            let width = a.servers.len() as u64 * load.chunk;
            let region = spec.size * a.servers.len() as u64 / total as u64 / width * width;
            anyhow::ensure!(region >= load.request * 4 + width, "servers too small for {total} clients");
            let phase = (n as u64 * 3 % a.servers.len() as u64) * load.chunk;
            let offset = n as u64 * region / width * width + phase;
            clients.push(ClientSpec {
                app,
                members,
                bind: Some(app_addr(app, i)),
                chunk: load.chunk,
                request: load.request,
                outstanding: a.outstanding,
                offset,
                region: region - width,
                think: load.think,
                duration: load.duration,
            });
            n += 1;
        }
    }
    run_client_procs(&clients, during)
}

/// Start every client as its own process, wait until all are connected,
/// start them together, run `during` (on another thread) while they run, and
/// collect their completions: per application, time since the start and bytes.
pub fn run_client_procs<T: Send>(specs: &[ClientSpec], during: impl FnOnce() -> T + Send) -> anyhow::Result<(Completions, T)> {
    let exe = surge()?;
    let mut clients = Vec::new();
    for c in specs {
        let mut cmd = Command::new(&exe);
        cmd.args(["--log", "warn", "stripe-bench", "--json", "--wait-go"]);
        for m in &c.members {
            cmd.args(["--export", m]);
        }
        if let Some(b) = &c.bind {
            cmd.args(["--bind", b]);
        }
        cmd.args(["--chunk", &c.chunk.to_string(), "--request", &c.request.to_string()])
            .args(["--outstanding", &c.outstanding.to_string()])
            .args(["--offset", &c.offset.to_string(), "--region", &c.region.to_string()])
            .args(["--duration", &format!("{}ms", c.duration.as_millis())])
            .args(["--think", &format!("{}us", c.think.as_micros())])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().context("starting a client")?;
        let stdin = child.stdin.take().context("client stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("client stdout")?);
        clients.push(Client { child, stdin, stdout, app: c.app });
    }
    for c in &mut clients {
        let mut line = String::new();
        c.stdout.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "a client did not connect (said {line:?})");
    }
    let t0 = super::client::monotonic_ns();
    for c in &mut clients {
        c.stdin.write_all(b"go\n")?;
        c.stdin.flush()?;
    }
    std::thread::scope(|s| {
        let side = s.spawn(during);
        let mut out: Completions = [Vec::new(), Vec::new()];
        for mut c in clients {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut c.stdout, &mut text)?;
            let status = c.child.wait()?;
            anyhow::ensure!(status.success(), "a client of application {} failed ({status})", APP_NAMES[c.app]);
            let o: BenchOutcome = serde_json::from_str(text.trim()).context("reading a client's results")?;
            out[c.app].extend(o.completions_ns.iter().map(|&t| (Duration::from_nanos(t.saturating_sub(t0)), o.request_bytes)));
        }
        for v in &mut out {
            v.sort();
        }
        let t = side.join().map_err(|_| anyhow::anyhow!("the sampler beside the clients panicked"))?;
        Ok((out, t))
    })
}
