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
    /// The most nodes this provider can hold (None: no limit of its own).
    fn capacity(&self) -> Option<usize> {
        None
    }
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
        let mut c = Command::new(&self.program);
        c.args(["bb", "node", "--listen", &std::net::SocketAddr::new(self.listen_ip, 0).to_string()]).args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        let (addr, child) = spawn_node(&mut c, &self.program.display().to_string())?;
        self.children.insert(addr.clone(), child);
        Ok(addr)
    }

    fn running(&mut self, addr: &str) -> bool {
        self.children.get_mut(addr).is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn stop(&mut self, addr: &str) {
        if let Some(c) = self.children.remove(addr) {
            stop_child(addr, c);
        }
    }
}

/// Spawns a node command and reads the address it prints once it serves.
fn spawn_node(c: &mut Command, what: &str) -> Result<(String, Child), PoolError> {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().map_err(|e| PoolError::Start(format!("{what}: {e}")))?;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    let addr = line.trim().to_string();
    if addr.is_empty() {
        let st = child.wait().map(|s| s.to_string()).unwrap_or_default();
        return Err(PoolError::Start(format!("the node exited ({st}) before printing its address; see its log above")));
    }
    Ok((addr, child))
}

/// Waits for a drained node to exit (it does after its drain), else kills it.
fn stop_child(addr: &str, mut c: Child) {
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

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A compute node of the job that I/O nodes may share: `NAME=IP` (or just
/// `IP`, then the name too). The nodes listen on IP; NAME fills the
/// launcher's `{host}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComputeHost {
    pub name: String,
    pub ip: std::net::IpAddr,
}

impl std::str::FromStr for ComputeHost {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, ip) = s.split_once('=').unwrap_or((s, s));
        let ip = ip.parse().map_err(|e| format!("{s:?}: expected NAME=IP or IP ({e})"))?;
        if name.is_empty() {
            return Err(format!("{s:?}: empty host name"));
        }
        Ok(ComputeHost { name: name.to_string(), ip })
    }
}

/// Where the next co-located node goes, from the nodes each host runs now:
/// the host with the fewest. With two hosts or more, one node per host at
/// most, so that any two replicas are on two machines (chunk placement does
/// not know machines); a single host takes them all (there is no second
/// machine to spread to). None: full.
pub fn pick_host(per_host: &[usize]) -> Option<usize> {
    let (i, &n) = per_host.iter().enumerate().min_by_key(|&(_, n)| *n)?;
    (per_host.len() == 1 || n == 0).then_some(i)
}

/// I/O nodes on the job's own compute nodes (DESIGN: "compute nodes pool
/// memory into a shared buffer tier"): `LAUNCHER surge bb node --listen IP:0`
/// for the host chosen by [`pick_host`], e.g. `ssh {host}`. They cost no
/// instance-hours (the compute nodes are billed anyway), only the memory they
/// take from the job.
pub struct CoLocatedNodes {
    pub program: PathBuf,
    pub hosts: Vec<ComputeHost>,
    /// Words before the program, `{host}` replaced by the host's name (none: run here).
    pub launcher: Vec<String>,
    /// Arguments after `bb node --listen IP:0` (no secrets: see [`LocalNodes::args`]).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Address -> (host index, its launcher process).
    children: BTreeMap<String, (usize, Child)>,
}

impl CoLocatedNodes {
    /// `launcher`: words separated by spaces (`ssh {host}`; empty: run on this machine).
    pub fn new(program: PathBuf, hosts: Vec<ComputeHost>, launcher: &str, args: Vec<String>, env: Vec<(String, String)>) -> CoLocatedNodes {
        CoLocatedNodes { program, hosts, launcher: launcher.split_whitespace().map(String::from).collect(), args, env, children: BTreeMap::new() }
    }

    fn per_host(&mut self) -> Vec<usize> {
        let mut v = vec![0; self.hosts.len()];
        for (h, c) in self.children.values_mut() {
            if matches!(c.try_wait(), Ok(None)) {
                v[*h] += 1;
            }
        }
        v
    }

    fn command(&self, host: &ComputeHost) -> Command {
        let words: Vec<String> = self.launcher.iter().map(|w| w.replace("{host}", &host.name)).collect();
        let mut c = match words.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        c.args(["bb", "node", "--listen", &std::net::SocketAddr::new(host.ip, 0).to_string()]).args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }
}

impl NodeProvider for CoLocatedNodes {
    fn start(&mut self) -> Result<String, PoolError> {
        let per_host = self.per_host();
        let h = pick_host(&per_host).ok_or_else(|| PoolError::Start(format!("every one of the {} compute hosts runs a node already", self.hosts.len())))?;
        let mut c = self.command(&self.hosts[h]);
        let (addr, child) = spawn_node(&mut c, &format!("{} on {}", self.program.display(), self.hosts[h].name))?;
        self.children.insert(addr.clone(), (h, child));
        Ok(addr)
    }

    fn running(&mut self, addr: &str) -> bool {
        self.children.get_mut(addr).is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }

    fn stop(&mut self, addr: &str) {
        if let Some((_, c)) = self.children.remove(addr) {
            stop_child(addr, c);
        }
    }

    fn capacity(&self) -> Option<usize> {
        (self.hosts.len() != 1).then_some(self.hosts.len())
    }
}

impl Drop for CoLocatedNodes {
    fn drop(&mut self) {
        for (_, (_, mut c)) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where the pool's nodes run, which decides what they cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Machines of their own, each billed as the pool's instance type.
    #[default]
    Dedicated,
    /// On the job's compute nodes ([`CoLocatedNodes`]): no instance-hours.
    CoLocated,
}

/// Bills a node that starts (or is adopted) now: dedicated nodes as the
/// pool's instance, co-located ones not at all (their compute node is paid for).
fn bill_start(meter: &CostMeter, addr: &str, s: &PoolSettings) -> Result<(), PoolError> {
    match s.placement {
        Placement::Dedicated => Ok(meter.start_compute(addr, &s.instance, 1)?),
        Placement::CoLocated => Ok(()),
    }
}

/// The policy's bounds within what the provider can hold.
pub fn fit_to_capacity(mut cfg: PoolConfig, capacity: Option<usize>) -> Result<PoolConfig, PoolError> {
    if let Some(c) = capacity {
        if c < cfg.min_nodes {
            return Err(PoolError::Start(format!("the pool's minimum is {} nodes but its provider holds {c} (one per compute host)", cfg.min_nodes)));
        }
        cfg.max_nodes = cfg.max_nodes.min(c);
    }
    Ok(cfg)
}

#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub policy: PoolConfig,
    pub interval: Duration,
    /// EC2 instance type each node is billed as (its memory should hold `node_memory`).
    pub instance: String,
    /// A drain that takes longer is given up (the node is then stopped).
    pub drain_timeout: Duration,
    pub placement: Placement,
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
    #[serde(default)]
    pub placement: Placement,
    /// Memory the pool's nodes take from the compute nodes (co-located placement).
    #[serde(default)]
    pub colocated_memory_bytes: u64,
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
        bill_start(meter, &addr, s)?;
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
    let cfg = fit_to_capacity(s.policy.clone(), provider.capacity())?;
    let mut policy = PoolPolicy::new(cfg.clone());
    let mut nodes: BTreeSet<String> = BTreeSet::new();
    let mut draining: BTreeSet<String> = BTreeSet::new();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<String>();
    let mut sampler = Sampler::default();
    let started = Instant::now();
    let mut report = PoolReport { min: cfg.min_nodes, max: cfg.max_nodes, instance: s.instance.clone(), placement: s.placement, ..Default::default() };
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
                        bill_start(meter, &addr, s)?;
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
        if s.placement == Placement::CoLocated {
            report.colocated_memory_bytes = (nodes.len() + draining.len()) as u64 * cfg.node_memory;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_hosts_parse_as_name_and_ip_or_ip_alone() {
        let h: ComputeHost = "c1=10.0.0.5".parse().unwrap();
        assert_eq!(h, ComputeHost { name: "c1".into(), ip: "10.0.0.5".parse().unwrap() });
        let h: ComputeHost = "10.0.0.6".parse().unwrap();
        assert_eq!(h.name, "10.0.0.6");
        assert!("c1=nowhere".parse::<ComputeHost>().is_err());
        assert!("=10.0.0.5".parse::<ComputeHost>().is_err());
    }

    #[test]
    fn co_located_nodes_go_one_per_host_when_there_are_several_and_all_on_a_single_one() {
        assert_eq!(pick_host(&[1, 0, 1]), Some(1));
        assert_eq!(pick_host(&[1, 1]), None, "a second node on a host could hold both replicas of a chunk");
        assert_eq!(pick_host(&[3]), Some(0));
        assert_eq!(pick_host(&[]), None);
    }

    #[test]
    fn the_policy_is_bounded_by_the_provider_and_a_minimum_it_cannot_hold_is_refused() {
        let cfg = PoolConfig { min_nodes: 2, max_nodes: 8, ..Default::default() };
        assert_eq!(fit_to_capacity(cfg.clone(), Some(3)).unwrap().max_nodes, 3);
        assert_eq!(fit_to_capacity(cfg.clone(), None).unwrap().max_nodes, 8);
        assert!(fit_to_capacity(cfg, Some(1)).is_err());
    }

    fn settings(placement: Placement) -> PoolSettings {
        PoolSettings { policy: PoolConfig::default(), interval: Duration::from_secs(1), instance: "r5.large".into(), drain_timeout: Duration::from_secs(1), placement }
    }

    #[test]
    fn dedicated_nodes_bill_their_instance_and_co_located_ones_nothing() {
        let clock: Arc<dyn surge_block::Clock> = Arc::new(surge_block::SystemClock::new());
        let meter = CostMeter::new(surge_cloud::PriceTable::default(), surge_cloud::WallClock::anchored(clock));
        bill_start(&meter, "a:1", &settings(Placement::CoLocated)).unwrap();
        assert_eq!(meter.compute_usd_hour(), 0.0);
        assert!(meter.compute_usd_hour().is_sign_positive() && meter.report().compute_usd.is_sign_positive(), "status would print $-0.000/h");
        bill_start(&meter, "b:1", &settings(Placement::Dedicated)).unwrap();
        assert!((meter.compute_usd_hour() - 0.126).abs() < 1e-9, "{}", meter.compute_usd_hour());
    }

    #[test]
    fn co_located_nodes_start_through_the_launcher_on_distinct_hosts_until_full() {
        // A fake `surge`: prints the --listen address and the launcher's HOST.
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("fake-surge");
        std::fs::write(&prog, "#!/bin/sh\necho \"$4-$HOST\"\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let hosts = vec!["a=127.0.0.2".parse().unwrap(), "b=127.0.0.3".parse().unwrap()];
        let mut p = CoLocatedNodes::new(prog, hosts, "env HOST={host}", vec![], vec![]);
        assert_eq!(p.capacity(), Some(2));
        let mut got = vec![p.start().unwrap(), p.start().unwrap()];
        got.sort();
        assert_eq!(got, vec!["127.0.0.2:0-a".to_string(), "127.0.0.3:0-b".to_string()]);
        assert!(p.start().is_err(), "a third node would share a host");
        assert!(p.running(&got[0]));
    }
}
