//! The elastic pool: `surge bb pool` keeps the number of I/O nodes matched to
//! demand. Every interval it measures the pool (dirty and buffered bytes from
//! the nodes, write-back rate from their S3 counters), asks the pure policy
//! (`surge_policy::bb_pool`) for a size, starts nodes through a
//! [`NodeProvider`] and removes them only by draining (`drain.rs`). Each node
//! is billed as an EC2 instance and each S3 request at list price through
//! surge-cloud's cost meter; the state is published in the metadata store for
//! `surge bb status`.

use crate::drain::drain_node;
use crate::tier::Tier;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_cloud::cost::S3Usage;
use surge_cloud::CostMeter;
use surge_policy::bb_pool::{PoolConfig, PoolDemand, PoolPolicy};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("starting an I/O node: {0}")]
    Start(String),
    #[error(transparent)]
    Price(#[from] surge_cloud::cost::PriceError),
}

/// Starts and stops I/O nodes. Local child processes by default; EC2
/// instances running `surge bb node` with the `aws` feature (`ec2.rs`).
pub trait NodeProvider: Send {
    /// Starts a node; returns its address once it serves.
    fn start(&mut self) -> Result<String, PoolError>;
    /// Starts `n` nodes; one result each (in any order). A provider whose
    /// nodes take long to boot starts them together (one by one, the pool
    /// would grow by a node per boot time).
    fn start_many(&mut self, n: usize) -> Vec<Result<String, PoolError>> {
        let mut v = Vec::new();
        for _ in 0..n {
            let r = self.start();
            let failed = r.is_err();
            v.push(r);
            if failed {
                break;
            }
        }
        v
    }
    /// Nodes of this provider that serve (their address is in `live`) but
    /// that the pool did not start in this run: a pool restarted takes them
    /// over instead of starting new ones. Called when the pool starts and at
    /// every interval; also where a provider cleans up what it left behind.
    /// Default: none (local nodes die with the pool).
    fn adopt(&mut self, live: &BTreeSet<String>) -> Vec<String> {
        let _ = live;
        Vec::new()
    }
    /// Ends a node that has drained (or kills one that would not).
    fn stop(&mut self, addr: &str);
    /// Is the node still running (false once it exited, e.g. after a drain by hand)?
    fn running(&mut self, addr: &str) -> bool;
}

/// `surge bb node` processes on this machine, listening on a port of their
/// own at `listen_ip` (127.0.0.1 unless [`LocalNodes::listening_on`]).
pub struct LocalNodes {
    pub program: PathBuf,
    pub listen_ip: std::net::IpAddr,
    /// Arguments after `bb node --listen IP:0` (memory, bucket...):
    /// every user of the machine can read them (`ps`), so no secret goes here.
    pub args: Vec<String>,
    /// Environment of the nodes (what must not be in `args`: the Redis URL,
    /// which may carry a password). Only their user and root can read it.
    pub env: Vec<(String, String)>,
    children: BTreeMap<String, Child>,
}

impl LocalNodes {
    pub fn new(program: PathBuf, args: Vec<String>) -> LocalNodes {
        LocalNodes { program, listen_ip: std::net::Ipv4Addr::LOCALHOST.into(), args, env: Vec::new(), children: BTreeMap::new() }
    }

    /// Nodes listen on `ip` (an address of this machine other clients reach;
    /// off loopback a node needs TLS or `--insecure` among `args`).
    pub fn listening_on(mut self, ip: std::net::IpAddr) -> LocalNodes {
        self.listen_ip = ip;
        self
    }

    /// Sets variables in the nodes' environment.
    pub fn with_env(mut self, env: Vec<(String, String)>) -> LocalNodes {
        self.env = env;
        self
    }
}

impl NodeProvider for LocalNodes {
    fn start(&mut self) -> Result<String, PoolError> {
        let mut child = Command::new(&self.program)
            .args(["bb", "node", "--listen", &std::net::SocketAddr::new(self.listen_ip, 0).to_string()])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PoolError::Start(format!("{}: {e}", self.program.display())))?;
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
        let addr = line.trim().to_string();
        if addr.is_empty() {
            let st = child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(PoolError::Start(format!("the node exited ({st}) before printing its address; see its log above")));
        }
        self.children.insert(addr.clone(), child);
        Ok(addr)
    }

    fn running(&mut self, addr: &str) -> bool {
        self.children.get_mut(addr).is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn stop(&mut self, addr: &str) {
        let Some(mut c) = self.children.remove(addr) else { return };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::warn!("I/O node {addr} did not exit after its drain: killing it");
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub policy: PoolConfig,
    pub interval: Duration,
    /// EC2 instance type each node is billed as (its memory should hold `node_memory`).
    pub instance: String,
    /// A drain that takes longer is given up (the node is then stopped).
    pub drain_timeout: Duration,
}

/// What the daemon publishes (`surge bb status` shows it under `pool.daemon`).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PoolReport {
    pub min: usize,
    pub max: usize,
    pub target: usize,
    /// Nodes started by the daemon and not draining.
    pub nodes: Vec<String>,
    pub draining: Vec<String>,
    pub instance: String,
    pub usd_per_hour: f64,
    pub cost_usd: f64,
    pub compute_usd: f64,
    pub s3_usd: f64,
    pub s3: S3Usage,
    pub demand: PoolDemand,
    pub last_decision: String,
    pub at_ms: i64,
}

/// Rates from successive samples of cumulative counters.
#[derive(Default)]
struct Sampler {
    last: Option<(Instant, u64, u64)>,
    /// Last S3 counters seen per node (a node's counters start at 0).
    s3_seen: BTreeMap<String, (u64, u64, u64)>,
}

impl Sampler {
    /// Demand now; S3 traffic since the last call goes to the meter.
    fn sample(&mut self, tier: &Tier, meter: &CostMeter, nodes: usize) -> PoolDemand {
        tier.forget_live_cache();
        let (mut dirty, mut buffered, mut up) = (0u64, 0u64, 0u64);
        let mut usage = S3Usage::default();
        for addr in tier.live_nodes() {
            let Ok(st) = tier.pool.stat(&addr) else { continue };
            dirty += st.dirty_bytes;
            buffered += st.used_bytes;
            let now = (st.s3_puts, st.s3_gets, st.s3_bytes_up + st.s3_bytes_down);
            let before = self.s3_seen.insert(addr, now).unwrap_or_default();
            let before = if now.0 < before.0 || now.1 < before.1 { (0, 0, 0) } else { before };
            usage.add(S3Usage { puts: now.0 - before.0, gets: now.1 - before.1, bytes: now.2.saturating_sub(before.2) });
            up += st.s3_bytes_up;
        }
        meter.add_s3(usage);
        let t = Instant::now();
        let (mut ingest, mut wb) = (0.0, 0.0);
        if let Some((t0, dirty0, up0)) = self.last {
            let dt = t.duration_since(t0).as_secs_f64().max(1e-3);
            // Write-back drops every copy of a chunk: dirty bytes fall R times
            // faster than S3 receives them.
            wb = up.saturating_sub(up0) as f64 / dt * tier.replicas as f64;
            ingest = ((dirty as f64 - dirty0 as f64) / dt + wb).max(0.0);
        }
        self.last = Some((t, dirty, up));
        PoolDemand { buffered_bytes: buffered, dirty_bytes: dirty, ingest_bps: ingest, writeback_bps: wb, nodes }
    }
}

/// Takes over the provider's nodes that serve but this run did not start
/// (billed from now: what ran before the restart was the last run's).
fn adopt(provider: &mut dyn NodeProvider, live: &[String], draining: &BTreeSet<String>, nodes: &mut BTreeSet<String>, meter: &CostMeter, s: &PoolSettings) -> Result<(), PoolError> {
    let live: BTreeSet<String> = live.iter().cloned().collect();
    for addr in provider.adopt(&live) {
        if nodes.contains(&addr) || draining.contains(&addr) {
            continue;
        }
        meter.start_compute(&addr, &s.instance, 1)?;
        let line = format!("pool: adopted {addr} (a node of this pool that was running before this start)");
        tracing::info!("{line}");
        println!("{line}");
        nodes.insert(addr);
    }
    Ok(())
}

fn mib(b: f64) -> f64 {
    b / 1048576.0
}

/// Runs the pool until `stop` is set, then drains and stops every node it started.
pub fn run(tier: Arc<Tier>, provider: &mut dyn NodeProvider, meter: &CostMeter, s: &PoolSettings, stop: &AtomicBool) -> Result<(), PoolError> {
    meter.prices().instance_usd_hour(&s.instance, 1)?;
    let mut policy = PoolPolicy::new(s.policy.clone());
    let mut nodes: BTreeSet<String> = BTreeSet::new();
    let mut draining: BTreeSet<String> = BTreeSet::new();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<String>();
    let mut sampler = Sampler::default();
    let started = Instant::now();
    let mut report = PoolReport { min: s.policy.min_nodes, max: s.policy.max_nodes, instance: s.instance.clone(), ..Default::default() };
    let start_drain = |addr: String, draining: &mut BTreeSet<String>| {
        draining.insert(addr.clone());
        let (tier, tx, timeout) = (tier.clone(), done_tx.clone(), s.drain_timeout);
        std::thread::spawn(move || {
            if let Err(e) = drain_node(&tier, &addr, timeout, |_| {}) {
                tracing::error!("pool: draining {addr}: {e}");
            }
            let _ = tx.send(addr);
        });
    };
    while !stop.load(Ordering::SeqCst) {
        let tick = Instant::now();
        for addr in done_rx.try_iter() {
            provider.stop(&addr);
            meter.stop_compute(&addr);
            draining.remove(&addr);
            tracing::info!("pool: {addr} drained and stopped");
            println!("pool: {addr} drained and stopped");
        }
        // A node drained by hand (`surge bb drain`) or dead is no longer ours
        // (one out of membership but still running is kept: a lapsed lease).
        let live = tier.live_nodes();
        let mut gone: Vec<String> = nodes.iter().filter(|a| !live.contains(a)).cloned().collect();
        gone.retain(|a| !provider.running(a));
        for gone in gone {
            nodes.remove(&gone);
            provider.stop(&gone);
            meter.stop_compute(&gone);
            let line = format!("pool: {gone} left the pool and exited (drained by hand or died)");
            tracing::warn!("{line}");
            println!("{line}");
        }
        let before = nodes.len();
        adopt(provider, &live, &draining, &mut nodes, meter, s)?;
        let demand = sampler.sample(&tier, meter, nodes.len());
        let d = policy.decide(started.elapsed(), &demand);
        if d.target > nodes.len() {
            for r in provider.start_many(d.target - nodes.len()) {
                match r {
                    Ok(addr) => {
                        meter.start_compute(&addr, &s.instance, 1)?;
                        nodes.insert(addr);
                    }
                    Err(e) => tracing::error!("pool: {e}"),
                }
            }
        } else if d.target < nodes.len() && draining.is_empty() {
            // One node at a time, the one with the least dirty data: its
            // chunks move while the rest keep serving.
            let victim = nodes.iter().min_by_key(|a| tier.pool.stat(a).map(|st| st.dirty_bytes).unwrap_or(0)).cloned();
            if let Some(v) = victim {
                nodes.remove(&v);
                start_drain(v, &mut draining);
            }
        }
        let cost = meter.report();
        report.target = d.target;
        report.nodes = nodes.iter().cloned().collect();
        report.draining = draining.iter().cloned().collect();
        report.usd_per_hour = meter.compute_usd_hour();
        report.cost_usd = cost.total_usd;
        report.compute_usd = cost.compute_usd;
        report.s3_usd = cost.s3_usd;
        report.s3 = cost.s3;
        report.demand = demand;
        report.at_ms = crate::now_ms();
        if nodes.len() != before {
            let line = format!(
                "pool {before} -> {} nodes: backlog {:.0} MiB, buffered {:.0} MiB, ingest {:.1} MiB/s, write-back {:.1} MiB/s, ${:.3}/h, ${:.5} so far ({})",
                nodes.len(),
                mib(demand.dirty_bytes as f64),
                mib(demand.buffered_bytes as f64),
                mib(demand.ingest_bps),
                mib(demand.writeback_bps),
                report.usd_per_hour,
                report.cost_usd,
                d.reason
            );
            tracing::info!("{line}");
            println!("{line}");
            report.last_decision = line;
        }
        let ttl = (s.interval * 5).max(Duration::from_secs(5));
        match serde_json::to_string(&report) {
            Ok(j) => {
                if let Err(e) = tier.meta.put_pool_report(&j, ttl.as_millis() as u64) {
                    tracing::warn!("pool: publishing the pool state: {e}");
                }
            }
            Err(e) => tracing::warn!("pool: {e}"),
        }
        let spent = tick.elapsed();
        let mut left = s.interval.saturating_sub(spent);
        while !left.is_zero() && !stop.load(Ordering::SeqCst) {
            let step = left.min(Duration::from_millis(100));
            std::thread::sleep(step);
            left -= step;
        }
    }
    // Stopping: drain every node (in parallel), then stop them.
    tracing::info!("pool: stopping; draining {} nodes", nodes.len());
    for a in std::mem::take(&mut nodes) {
        start_drain(a, &mut draining);
    }
    drop(done_tx);
    while !draining.is_empty() {
        match done_rx.recv_timeout(s.drain_timeout + Duration::from_secs(5)) {
            Ok(addr) => {
                provider.stop(&addr);
                meter.stop_compute(&addr);
                draining.remove(&addr);
            }
            Err(_) => break,
        }
    }
    let cost = meter.report();
    println!("pool: stopped; ${:.5} in all (nodes ${:.5}, S3 ${:.5})", cost.total_usd, cost.compute_usd, cost.s3_usd);
    let _ = tier.meta.put_pool_report("", 1);
    Ok(())
}
