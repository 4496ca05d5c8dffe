//! One measured run: a reserved-bandwidth volume model shared by two tenants,
//! exported over NBD (unix socket), driven by closed-loop client threads, each
//! with its own NBD connection and one request in flight (as IOR clients).

use anyhow::Context;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use surge_block::fairq::{AdaptiveConfig, FairQueue, SchedConfig, TenantConfig};
use surge_block::model::{with_latency, ModelDev, VolumeModel};
use surge_block::{BlockDev, MemoryDev, SystemClock};
use surge_nbd::client::{Client, ClientOptions};
use surge_nbd::{Export, Listen, Server, ServerConfig};

/// The shared device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceSpec {
    /// Reserved bandwidth, bytes/s.
    pub bw: u64,
    /// Base latency added to every request.
    pub latency_us: u64,
    pub size: u64,
}

/// How the two tenants share it: with the fair queue (`depth` Some) or bare.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub weights: [u32; 2],
    pub streams: [usize; 2],
    pub request_bytes: u64,
    /// SFQ(D) depth; `None` exports the device directly (no scheduler).
    pub depth: Option<usize>,
    pub adaptive: Option<AdaptiveConfig>,
    pub duration: Duration,
}

/// What one run saw.
pub struct RunOutcome {
    /// Per tenant: completion time since start and bytes, in completion order.
    pub completions: [Vec<(Duration, u64)>; 2],
    /// Fraction of 50 ms samples in which both tenants had requests waiting
    /// in the fair queue (1.0 when always backlogged; None without a queue).
    pub both_backlogged: Option<f64>,
    /// Depth in force at the end (differs from the start under adaptive control).
    pub final_depth: Option<usize>,
    /// CPU seconds this process (server, scheduler and clients) used in the run.
    pub cpu_s: f64,
}

/// User + system CPU time of this process so far.
fn process_cpu() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

static RUN_SEQ: AtomicUsize = AtomicUsize::new(0);

fn socket_path() -> PathBuf {
    let n = RUN_SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("surge-fairshare-{}-{n}.sock", std::process::id()))
}

fn device(spec: &DeviceSpec) -> anyhow::Result<Arc<dyn BlockDev>> {
    let shape = VolumeModel::Reserved { bw: Some(spec.bw), iops: None }.shape(spec.size)?;
    let shape = with_latency(shape, Duration::from_micros(spec.latency_us));
    let mem = Arc::new(MemoryDev::new(spec.size));
    Ok(Arc::new(ModelDev::new(mem, Arc::new(SystemClock::new()), shape)))
}

pub fn run(dev_spec: &DeviceSpec, spec: &RunSpec) -> anyhow::Result<RunOutcome> {
    let dev = device(dev_spec)?;
    let queue = spec.depth.map(|depth| {
        let cfg = SchedConfig { depth, adaptive: spec.adaptive.clone(), ..Default::default() };
        FairQueue::new(dev.clone(), cfg, Arc::new(SystemClock::new()))
    });
    let exports: Vec<Export> = ["a", "b"]
        .iter()
        .zip(spec.weights)
        .map(|(name, weight)| {
            let d: Arc<dyn BlockDev> = match &queue {
                Some(q) => q.tenant(name, TenantConfig { weight, ..Default::default() }),
                None => dev.clone(),
            };
            Export::new(*name, d)
        })
        .collect();
    let mut cfg = ServerConfig::new(exports);
    // One worker per stream, so the server never queues ahead of the scheduler.
    cfg.threads_per_connection = spec.streams.iter().copied().max().unwrap_or(1) + 2;
    let server = Server::start(cfg)?;
    let path = socket_path();
    server.listen(&Listen::Unix(path.clone()))?;
    let cpu0 = process_cpu();
    let outcome = drive(&path, spec, queue.as_ref());
    let cpu_s = process_cpu() - cpu0;
    server.shutdown()?;
    let _ = std::fs::remove_file(&path);
    let (completions, both_backlogged) = outcome?;
    Ok(RunOutcome { completions, both_backlogged, final_depth: queue.map(|q| q.stats().depth), cpu_s })
}

type Completions = [Vec<(Duration, u64)>; 2];

/// Start every stream at once, run for the duration, collect completions.
fn drive(path: &PathBuf, spec: &RunSpec, queue: Option<&Arc<FairQueue>>) -> anyhow::Result<(Completions, Option<f64>)> {
    let total: usize = spec.streams.iter().sum();
    let go = Arc::new(Barrier::new(total + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let region = (REGION_TOTAL / total as u64) / spec.request_bytes * spec.request_bytes;
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for (t, &n) in spec.streams.iter().enumerate() {
        for _ in 0..n {
            let client = connect(path, ["a", "b"][t])?;
            let (go, stop) = (go.clone(), stop.clone());
            let s = Stream { base: handles.len() as u64 * region, region, bytes: spec.request_bytes, t0 };
            handles.push((t, std::thread::spawn(move || s.run(client, &go, &stop))));
        }
    }
    go.wait();
    let start = t0.elapsed();
    let backlog = sample_backlog(queue, Instant::now() + spec.duration);
    stop.store(true, Ordering::Relaxed);
    let mut out: Completions = [Vec::new(), Vec::new()];
    for (t, h) in handles {
        let v = h.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        out[t].extend(v.into_iter().map(|(at, b)| (at.saturating_sub(start), b)));
    }
    for v in &mut out {
        v.sort();
    }
    Ok((out, backlog))
}

/// Bytes of the device the streams cycle over.
pub const REGION_TOTAL: u64 = 256 << 20;

fn connect(path: &PathBuf, export: &str) -> anyhow::Result<Client> {
    let opts = ClientOptions { export: export.to_string(), structured_replies: true, block_status: false };
    Client::connect_unix(path, &opts).with_context(|| format!("connecting to export {export}"))
}

/// One closed-loop stream: sequential writes over its own region until told to stop.
struct Stream {
    base: u64,
    region: u64,
    bytes: u64,
    /// Common origin of all streams' timestamps.
    t0: Instant,
}

impl Stream {
    fn run(self, mut client: Client, go: &Barrier, stop: &AtomicBool) -> anyhow::Result<Vec<(Duration, u64)>> {
        let buf = vec![0x5au8; self.bytes as usize];
        let mut done = Vec::new();
        let mut off = 0;
        go.wait();
        while !stop.load(Ordering::Relaxed) {
            client.write(self.base + off, &buf, false)?;
            done.push((self.t0.elapsed(), self.bytes));
            off = (off + self.bytes) % self.region.max(self.bytes);
        }
        let _ = client.disconnect();
        Ok(done)
    }
}

/// Until `until`, sample every 50 ms whether both tenants have requests waiting.
fn sample_backlog(queue: Option<&Arc<FairQueue>>, until: Instant) -> Option<f64> {
    let mut n = 0u32;
    let mut both = 0u32;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())));
        if let Some(q) = queue {
            let st = q.stats();
            n += 1;
            if st.tenants.iter().all(|t| t.queued > 0) {
                both += 1;
            }
        }
    }
    queue.map(|_| both as f64 / n.max(1) as f64)
}
