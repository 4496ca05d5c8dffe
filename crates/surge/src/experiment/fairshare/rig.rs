//! One measured run of the single-server part: a `surge serve` process
//! exporting one emulated reserved-bandwidth volume to two tenants, built
//! from the daemon's own spec syntax (`--pool pool=reserved:...` and
//! `--export a=share:pool,weight=4`), and client processes (`surge
//! stripe-bench`, one per client, own NBD connection over the unix socket,
//! one request in flight, as IOR clients).

use super::procs::{self, ClientSpec};
use crate::control::{self, Request};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The shared device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceSpec {
    /// Reserved bandwidth, bytes/s.
    pub bw: u64,
    /// Base latency added to every request.
    pub latency_us: u64,
    pub size: u64,
}

impl DeviceSpec {
    /// The volume as `surge serve` spells it.
    pub fn spec(&self) -> String {
        format!("reserved:{},bw={}/s,lat={}us", self.size, self.bw, self.latency_us)
    }
}

/// How the two tenants share it: with the fair queue (`depth` Some) or bare.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub weights: [u32; 2],
    pub streams: [usize; 2],
    pub request_bytes: u64,
    /// SFQ(D) depth; `None` exports the device directly (no scheduler).
    pub depth: Option<usize>,
    /// `adaptive=on` on the pool: the daemon's adaptive depth at its defaults.
    pub adaptive: bool,
    pub duration: Duration,
}

impl RunSpec {
    /// `surge serve` arguments after `--listen`: one pool and two `share:`
    /// exports, or (no scheduler) one export both tenants' clients use.
    pub fn serve_args(&self, dev: &DeviceSpec) -> Vec<String> {
        let Some(depth) = self.depth else {
            return vec!["--export".into(), format!("disk={}", dev.spec())];
        };
        // Pool-wide options ride on the first export; the daemon's default
        // D (2) and adaptive (off) are left unsaid.
        let mut pool_opts = String::new();
        if depth != surge_block::fairq::SchedConfig::default().depth {
            pool_opts.push_str(&format!(",depth={depth}"));
        }
        if self.adaptive {
            pool_opts.push_str(",adaptive=on");
        }
        vec![
            "--pool".into(),
            format!("pool={}", dev.spec()),
            "--export".into(),
            format!("a=share:pool,weight={}{pool_opts}", self.weights[0]),
            "--export".into(),
            format!("b=share:pool,weight={}", self.weights[1]),
        ]
    }

    fn export_of(&self, tenant: usize) -> &'static str {
        match self.depth {
            Some(_) => ["a", "b"][tenant],
            None => "disk",
        }
    }
}

/// What one run saw.
pub struct RunOutcome {
    /// Per tenant: completion time since start and bytes, in completion order.
    pub completions: [Vec<(Duration, u64)>; 2],
    /// Fraction of 50 ms samples (`surge status` of the daemon) in which both
    /// tenants had requests waiting in the fair queue (None without a queue).
    pub both_backlogged: Option<f64>,
    /// Depth in force at the end (differs from the start under adaptive control).
    pub final_depth: Option<usize>,
    /// CPU seconds the `surge serve` process (NBD server and scheduler) used in the run.
    pub cpu_s: f64,
}

/// Bytes of the device the streams cycle over.
pub const REGION_TOTAL: u64 = 256 << 20;

static RUN_SEQ: AtomicUsize = AtomicUsize::new(0);

fn run_dir() -> PathBuf {
    let n = RUN_SEQ.fetch_add(1, Ordering::Relaxed);
    scratch().join(format!("surge-fairshare-{}-{n}", std::process::id()))
}

/// Where the servers' data directories go: /dev/shm (tmpfs) when there is
/// one, else the temp dir. The emulated volumes are files in the data
/// directory; their model charges nothing for FLUSH and knows nothing of the
/// host's disk, but on a disk shared with other work (the README's test
/// command runs `cargo test` beside this step) page-cache writeback and other
/// processes' fsyncs stall the servers' writes, a latency no modelled volume
/// has, and the proxies' FLUSHes (every 64 MiB, `remote:`) made the host sync
/// what the direct clients never do.
pub fn scratch() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let writable = shm.is_dir() && tempfile::Builder::new().prefix("surge-probe").tempfile_in(shm).is_ok();
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

pub fn run(dev: &DeviceSpec, spec: &RunSpec) -> anyhow::Result<RunOutcome> {
    let dir = run_dir();
    let out = run_in(&dir, dev, spec);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn run_in(dir: &Path, dev: &DeviceSpec, spec: &RunSpec) -> anyhow::Result<RunOutcome> {
    let sock = dir.join("nbd.sock");
    let mut args = vec!["--listen".to_string(), format!("unix:{}", sock.display())];
    args.extend(spec.serve_args(dev));
    let server = procs::serve(dir, "the fairshare server", &args)?;
    let total: usize = spec.streams.iter().sum();
    let region = (REGION_TOTAL / total as u64) / spec.request_bytes * spec.request_bytes;
    let mut clients = Vec::new();
    for (t, &n) in spec.streams.iter().enumerate() {
        for _ in 0..n {
            clients.push(ClientSpec {
                app: t,
                members: vec![format!("nbd+unix:///{}?socket={}", spec.export_of(t), sock.display())],
                bind: None,
                // One member: requests go whole (the chunk only splits across members).
                chunk: spec.request_bytes,
                request: spec.request_bytes,
                outstanding: 1,
                offset: clients.len() as u64 * region,
                region,
                think: Duration::ZERO,
                duration: spec.duration,
            });
        }
    }
    let control = dir.join("control.sock");
    let cpu0 = server.cpu_s()?;
    let queued = spec.depth.is_some();
    let (completions, both_backlogged) =
        procs::run_client_procs(&clients, || queued.then(|| sample_backlog(&control, Instant::now() + spec.duration)))?;
    let cpu_s = server.cpu_s()? - cpu0;
    let final_depth = if queued { status(&control, "qos/a").and_then(|s| s["pool_depth"].as_u64()).map(|d| d as usize) } else { None };
    drop(server);
    Ok(RunOutcome { completions, both_backlogged, final_depth, cpu_s })
}

/// The control API's status of one target.
fn status(control: &Path, target: &str) -> Option<serde_json::Value> {
    let r = control::call(control, &Request::Status).ok()?;
    r.targets?.into_iter().find(|t| t.name == target).map(|t| t.status)
}

/// Until `until`, sample every 50 ms whether both tenants have requests waiting.
fn sample_backlog(control: &Path, until: Instant) -> f64 {
    let mut n = 0u32;
    let mut both = 0u32;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())));
        let Ok(r) = control::call(control, &Request::Status) else { continue };
        let queued = |name: &str| {
            r.targets.iter().flatten().find(|t| t.name == name).and_then(|t| t.status["tenant"]["queued"].as_u64()).unwrap_or(0)
        };
        n += 1;
        if queued("qos/a") > 0 && queued("qos/b") > 0 {
            both += 1;
        }
    }
    both as f64 / n.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(depth: Option<usize>, adaptive: bool) -> RunSpec {
        RunSpec { weights: [4, 1], streams: [32, 32], request_bytes: 1 << 20, depth, adaptive, duration: Duration::from_secs(1) }
    }

    #[test]
    fn the_server_is_built_from_the_daemons_spec_syntax_and_defaults() {
        let dev = DeviceSpec { bw: 128_000_000, latency_us: 1000, size: REGION_TOTAL };
        let a = spec(Some(2), false).serve_args(&dev);
        assert_eq!(a, ["--pool", "pool=reserved:268435456,bw=128000000/s,lat=1000us", "--export", "a=share:pool,weight=4", "--export", "b=share:pool,weight=1"]);
        assert_eq!(spec(Some(8), true).serve_args(&dev)[3], "a=share:pool,weight=4,depth=8,adaptive=on");
        assert_eq!(spec(None, false).serve_args(&dev), ["--export", "disk=reserved:268435456,bw=128000000/s,lat=1000us"]);
        assert_eq!((spec(None, false).export_of(0), spec(None, false).export_of(1)), ("disk", "disk"));
    }
}
