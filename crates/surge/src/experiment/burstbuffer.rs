//! `surge experiment burstbuffer`: the burst-buffer paper's comparison
//! (`shared/papers/burst-buffer.txt`), surge's burst buffer against the file
//! systems a user would pick today on the same object store, on one machine.
//!
//! One local S3 server (moto), each file system on a bucket of its own,
//! mounted with FUSE and driven by separate processes (`fsbench.py`, Montage):
//!
//! | approach | processes |
//! |---|---|
//! | surge | `surge bb redis`, I/O nodes (`surge bb node`, defaults), `surge bb mount` |
//! | s3fs | `s3fs` (Debian, defaults; `url=`, `use_path_request_style`, passwd file) |
//! | juicefs | its own Redis, `juicefs format` + `juicefs mount` (cache defaults) |
//! | juicefs-writeback | the same with `juicefs mount --writeback` (uploads in the background) |
//!
//! Per approach and round: sequential and random throughput, mdtest-style
//! metadata rates, the Montage mosaic workflow; rounds interleave the
//! approaches (rotated). Then, surge only: read-after-write across two mounts
//! (stale reads) and an I/O node SIGKILLed during write-back (bytes lost,
//! read straight from S3). Costs at list prices from measured seconds and
//! counted S3 requests.

mod fs;
mod machines;
pub mod meta_bench;
mod pool;
mod report;
mod s3;
mod scaling;
mod work;

use fs::{Kind, Mounted};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::experiment::progress;
use crate::experiment::streaming::proc;

const MIB: u64 = 1 << 20;

/// Scale of a run (`--quick`: smaller, once).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub quick: bool,
    pub reps: usize,
    /// I/O nodes of the surge approach (daemon defaults otherwise: 1 GiB each).
    pub nodes: fs::Nodes,
    /// Nodes of the surge-only checks (a node is killed in one).
    pub check_nodes: usize,
    pub seq_mib: u64,
    /// Sequential writes per round, and reads of the last (the medians count).
    pub seq_writes: usize,
    pub seq_bs_kib: u64,
    pub rand_ops: u64,
    pub rand_bs_kib: u64,
    /// mdtest: files per process, processes.
    pub md_files: u64,
    pub md_procs: u64,
    pub fits_images: u64,
    pub fits_side: u64,
    pub raw_rounds: u64,
    pub loss_files: u64,
    pub loss_file_mib: u64,
    /// Every role a machine of its own behind its link (`machines.rs`), or
    /// everything on loopback (`SURGE_BB_TOPOLOGY=off`, or not root).
    pub topology: bool,
    /// The paper's Figs. 8-9 (across machines only).
    pub scaling: scaling::ScalePlan,
    /// The paper's Fig. 10: creates against metadata masters (with the scaling part).
    pub creates: meta_bench::BenchMetaArgs,
}

/// Where the pool's nodes run: on a machine of their own (the paper's
/// topology, billed as r5.large each: every figure crosses a link), unless
/// `SURGE_BB_PLACEMENT=co-located` (on the client, the Montage job's compute
/// node: no instance-hours, but surge's writes then reach nodes on the
/// writer's own machine, which would flatter its throughput against peers
/// that cross links, so it is not the experiment's default).
fn placement() -> anyhow::Result<surge_bb::pool::Placement> {
    use surge_bb::pool::Placement;
    match std::env::var("SURGE_BB_PLACEMENT").ok().as_deref() {
        Some("co-located") => Ok(Placement::CoLocated),
        None | Some("") | Some("dedicated") => Ok(Placement::Dedicated),
        Some(v) => anyhow::bail!("SURGE_BB_PLACEMENT={v:?}: expected co-located or dedicated"),
    }
}

/// The paper's topology unless switched off; it needs root (namespaces).
fn topology() -> anyhow::Result<bool> {
    match std::env::var("SURGE_BB_TOPOLOGY").ok().as_deref() {
        None | Some("") | Some("on") => {
            // SAFETY: geteuid has no preconditions.
            anyhow::ensure!(unsafe { libc::geteuid() } == 0, "the experiment's machines are network namespaces and need root; SURGE_BB_TOPOLOGY=off runs everything on loopback (its report says so)");
            Ok(true)
        }
        Some("off") => Ok(false),
        Some(v) => anyhow::bail!("SURGE_BB_TOPOLOGY={v:?}: expected on or off"),
    }
}

impl Plan {
    /// `pool`: the binary has `surge bb pool` (the elastic pool daemon).
    pub fn new(quick: bool, pool: bool) -> anyhow::Result<Plan> {
        Ok(Plan {
            quick,
            reps: if quick { 1 } else { 3 },
            // The pool: 2 nodes (2 replicas need 2) up to 6, of 256 MiB each (the
            // daemon's default is 512 MiB: smaller nodes let this small workflow
            // matter to the policy as a full-size one would); without it, 3 fixed.
            nodes: if pool { fs::Nodes::Pool { min: 2, max: 6, node_memory_mib: 256, placement: placement()? } } else { fs::Nodes::Fixed(3) },
            check_nodes: 3,
            seq_mib: if quick { 64 } else { 256 },
            seq_writes: 3,
            seq_bs_kib: 1024,
            rand_ops: if quick { 32 } else { 128 },
            rand_bs_kib: 4,
            md_files: if quick { 50 } else { 500 },
            md_procs: 2,
            // Quick: a 2x2 mosaic, every step of the workflow still run (s3fs
            // pays about 12 s per image across the links: a 3x3 one took the
            // quick run past 4 minutes).
            fits_images: if quick { 4 } else { 16 },
            fits_side: 512,
            raw_rounds: if quick { 50 } else { 200 },
            loss_files: 4,
            loss_file_mib: if quick { 16 } else { 64 },
            topology: topology()?,
            scaling: scaling::ScalePlan::new(quick),
            creates: meta_bench::BenchMetaArgs::experiment(quick),
        })
    }
}

/// One round of one approach.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    pub approach: &'static str,
    pub round: usize,
    pub throughput: work::Throughput,
    pub metadata: work::Metadata,
    pub montage_s: f64,
    /// From mount to everything in S3 and unmounted.
    pub wall_s: f64,
    pub node_s: f64,
    pub requests: s3::Requests,
    pub usd: f64,
    pub montage_usd: f64,
    /// Montage's own cost by part (`montage_usd` is its total).
    pub montage_bill: Bill,
    /// surge: live I/O nodes over time (s since mount), sampled every second.
    pub pool: Vec<pool::Point>,
    /// surge: seconds into the run when Montage started and ended.
    pub montage_window: (f64, f64),
}

/// A bill by part, $.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Bill {
    /// The client instance (the job's compute node).
    pub compute_usd: f64,
    /// Instances of I/O nodes (none when they are co-located on the client).
    pub io_nodes_usd: f64,
    pub s3_requests_usd: f64,
    /// S3 Standard storage of the job's bytes while it is billed.
    pub storage_usd: f64,
}

impl Bill {
    pub fn total(&self) -> f64 {
        self.compute_usd + self.io_nodes_usd + self.s3_requests_usd + self.storage_usd
    }
}

/// List prices the costs are computed with.
#[derive(Debug, Clone, Serialize)]
pub struct Prices {
    pub client_instance: String,
    pub client_usd_hour: f64,
    pub node_instance: String,
    pub node_usd_hour: f64,
    pub s3_put_per_1000: f64,
    pub s3_get_per_1000: f64,
    pub s3_storage_gb_month: f64,
    pub seconds_per_month: f64,
}

impl Prices {
    fn list() -> anyhow::Result<Prices> {
        let t = surge_cloud::cost::PriceTable::default();
        // The client: a general-purpose 4-vCPU instance (the paper's m3.xlarge
        // is retired); an I/O node: a memory instance (16 GiB).
        let (client, node) = ("m5.xlarge", "r5.large");
        Ok(Prices {
            client_instance: client.into(),
            client_usd_hour: t.instance_usd_hour(client, 1)?,
            node_instance: node.into(),
            node_usd_hour: t.instance_usd_hour(node, 1)?,
            s3_put_per_1000: t.s3.put_per_1000,
            s3_get_per_1000: t.s3.get_per_1000,
            s3_storage_gb_month: t.s3.storage_gb_month,
            seconds_per_month: t.seconds_per_month as f64,
        })
    }

    /// The bill for `client_s` seconds of the client, `billed_node_s` seconds
    /// of I/O-node instances, requests `r` and `stored_bytes` kept in S3 for
    /// `stored_s` seconds (per second, no minimum).
    pub fn bill(&self, client_s: f64, billed_node_s: f64, r: s3::Requests, stored_bytes: u64, stored_s: f64) -> Bill {
        Bill {
            compute_usd: client_s * self.client_usd_hour / 3600.0,
            io_nodes_usd: billed_node_s * self.node_usd_hour / 3600.0,
            s3_requests_usd: r.put_class as f64 * self.s3_put_per_1000 / 1000.0 + r.get_class as f64 * self.s3_get_per_1000 / 1000.0,
            storage_usd: stored_bytes as f64 / (1u64 << 30) as f64 * self.s3_storage_gb_month * stored_s / self.seconds_per_month,
        }
    }

    /// Dollars for the client, I/O-node instances and requests (no storage).
    pub fn usd(&self, client_s: f64, billed_node_s: f64, r: s3::Requests) -> f64 {
        self.bill(client_s, billed_node_s, r, 0, 0.0).total()
    }
}

/// What the surge-only checks found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checks {
    pub raw_rounds: u64,
    pub stale_reads: u64,
    pub loss_bytes_written: u64,
    pub bytes_lost: u64,
    pub loss_persisted: bool,
    /// Chunks not yet in S3 just before the kill (> 0: it hit write-back in progress).
    pub dirty_chunks_at_kill: u64,
    pub loss_note: String,
}

struct Rig {
    plan: Plan,
    machines: machines::Machines,
    surge: PathBuf,
    work: PathBuf,
    s3: s3::S3Server,
    tool: work::Tool,
    fits: PathBuf,
    fits_bytes: u64,
    prices: Prices,
    runs: usize,
}

impl Rig {
    fn run_dir(&mut self, what: &str) -> anyhow::Result<PathBuf> {
        self.runs += 1;
        let d = self.work.join(format!("{:02}-{what}", self.runs));
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Mount approach `k` in a fresh directory (fresh bucket, fresh metadata).
    fn mount(&mut self, k: Kind) -> anyhow::Result<(Box<dyn Mounted>, String)> {
        let d = self.run_dir(k.name())?;
        let bucket = format!("{}-{}", k.bucket(), self.runs);
        let mnt = d.join("mnt");
        let m: Box<dyn Mounted> = match k {
            Kind::Surge => {
                let mut s = fs::Surge::start(&self.machines, &self.surge, &self.s3, &bucket, &d, self.plan.nodes)?;
                s.mount(&mnt)?;
                Box::new(s)
            }
            Kind::S3fs => Box::new(fs::S3fs::mount(&self.machines, &self.s3, &bucket, &d, &mnt)?),
            Kind::Juicefs | Kind::JuicefsWriteback => Box::new(fs::JuiceFs::mount(&self.machines, &self.surge, &self.s3, &bucket, &d, &mnt, k == Kind::JuicefsWriteback)?),
        };
        Ok((m, bucket))
    }

    /// One round of approach `k`: throughput, metadata, Montage.
    fn round(&mut self, k: Kind, round: usize) -> anyhow::Result<Sample> {
        let t = Instant::now();
        let (mut m, bucket) = self.mount(k)?;
        let sampler = m.status_env().map(|env| pool::Sampler::start(self.surge.clone(), env, t, Duration::from_secs(1)));
        let say = |what: &str| progress::step(format!("{} round {}: {what}", k.name(), round + 1), false);
        // Montage first: the pool starts at its minimum when the workflow does.
        say("Montage");
        let (m_t, m_req, m_node) = (t.elapsed().as_secs_f64(), self.s3.requests(&bucket), m.node_seconds());
        let montage_s = work::montage(&self.fits, m.mnt())?;
        let montage_window = (m_t, t.elapsed().as_secs_f64());
        let montage_bytes = work::tree_bytes(&m.mnt().join("montage"))?;
        // Throughput from a quiet start, as s3fs and JuiceFS have it (they
        // upload before close returns): Montage's files in S3 first.
        say("write-back of Montage");
        m.settle()?;
        let montage_persisted = t.elapsed().as_secs_f64();
        let (m_req1, m_node1) = (self.s3.requests(&bucket), m.node_seconds());
        say("throughput");
        let throughput = work::throughput(&self.tool, m.as_mut(), &self.plan)?;
        say("metadata");
        let metadata = work::metadata(&self.tool, m.mnt(), &self.plan)?;
        say("write-back");
        m.settle()?;
        if let (Some(s), fs::Nodes::Pool { min, .. }) = (&sampler, self.plan.nodes) {
            // The daemon drains one node per 30 s of low demand (its default):
            // wait for the first drain (the minimum would take 30 s per node).
            say("pool shrinking");
            let done = |p: &[pool::Point]| {
                let (peak, last) = (p.iter().map(|x| x.nodes).max().unwrap_or(0), p.last().map(|x| x.nodes).unwrap_or(0));
                last <= min || last < peak
            };
            let _ = proc::wait_until("the pool to shrink", Duration::from_secs(75), || done(&s.points()));
        }
        let pool = sampler.map(|s| s.finish()).unwrap_or_default();
        let pooled = matches!(self.plan.nodes, fs::Nodes::Pool { .. }) && k == Kind::Surge;
        let (node_s, montage_node_s) =
            if pooled { (pool::node_seconds(&pool), pool::node_seconds_between(&pool, montage_window.0, montage_persisted)) } else { (m.node_seconds(), m_node1 - m_node) };
        // Co-located nodes bill no instance; they hold the job's dirty data,
        // so the client is billed until its write-back is done.
        let colocated = pooled && matches!(self.plan.nodes, fs::Nodes::Pool { placement: surge_bb::pool::Placement::CoLocated, .. });
        let node_billed = |s: f64| if colocated { 0.0 } else { s };
        let uploads_from_client = m.uploads_from_client() || colocated;
        m.stop()?;
        let wall_s = t.elapsed().as_secs_f64();
        let requests = self.s3.requests(&bucket);
        let usd = self.prices.usd(wall_s, node_billed(node_s), requests);
        // Montage's own share: the client for its seconds (until its files
        // are in S3 when the client itself holds them); the nodes, the
        // requests and the storage until its files are in S3 (its write-back
        // included).
        let client_s = if uploads_from_client { montage_persisted - montage_window.0 } else { montage_s };
        let montage_requests = s3::Requests { put_class: m_req1.put_class - m_req.put_class, get_class: m_req1.get_class - m_req.get_class };
        let montage_bill = self.prices.bill(client_s, node_billed(montage_node_s), montage_requests, montage_bytes, montage_persisted - montage_window.0);
        let montage_usd = montage_bill.total();
        progress::step(format!("{} round {}: done", k.name(), round + 1), true);
        Ok(Sample { approach: k.name(), round, throughput, metadata, montage_s, wall_s, node_s, requests, usd, montage_usd, montage_bill, pool, montage_window })
    }

    /// Read-after-write between two surge mounts (default, close-to-open
    /// mounts: a reader opening after the writer's close).
    fn consistency(&mut self, c: &mut Checks) -> anyhow::Result<()> {
        progress::step("surge: read-after-write across two mounts", false);
        let d = self.run_dir("surge-raw")?;
        let mut s = fs::Surge::start(&self.machines, &self.surge, &self.s3, &format!("bb-raw-{}", self.runs), &d, fs::Nodes::Fixed(self.plan.check_nodes))?;
        let (a, b) = (d.join("mnt-a"), d.join("mnt-b"));
        s.mount(&a)?;
        s.mount(&b)?;
        let v = self.tool.run(&["raw", &a.to_string_lossy(), &b.to_string_lossy(), &self.plan.raw_rounds.to_string()])?;
        c.raw_rounds = v["rounds"].as_u64().unwrap_or(0);
        c.stale_reads = v["stale_reads"].as_u64().unwrap_or(u64::MAX);
        Box::new(s).stop()?;
        progress::step("surge: read-after-write done", true);
        Ok(())
    }

    /// Write files, close (acknowledged: on 2 nodes), SIGKILL one node while
    /// write-back runs, then compare every acknowledged byte with S3.
    fn node_loss(&mut self, c: &mut Checks) -> anyhow::Result<()> {
        progress::step("surge: I/O node SIGKILLed during write-back", false);
        let d = self.run_dir("surge-loss")?;
        let bucket = format!("bb-loss-{}", self.runs);
        let mut s = fs::Surge::start(&self.machines, &self.surge, &self.s3, &bucket, &d, fs::Nodes::Fixed(self.plan.check_nodes))?;
        let mnt = d.join("mnt");
        s.mount(&mnt)?;
        let reference = d.join("ref");
        std::fs::create_dir_all(&reference)?;
        let mut rng = rand::thread_rng();
        for i in 0..self.plan.loss_files {
            let mut buf = vec![0u8; (self.plan.loss_file_mib * MIB) as usize];
            rand::RngCore::fill_bytes(&mut rng, &mut buf);
            std::fs::write(reference.join(format!("f{i}")), &buf)?;
            c.loss_bytes_written += buf.len() as u64;
        }
        std::fs::create_dir(mnt.join("loss"))?;
        // cp closes each file: close returns once its chunks are on 2 nodes.
        crate::experiment::streaming::proc::sh(std::process::Command::new("cp").arg("-r").arg(format!("{}/.", reference.display())).arg(mnt.join("loss")))?;
        // Write-back waits 500 ms (default) before a chunk goes: kill while it runs.
        std::thread::sleep(Duration::from_millis(700));
        c.dirty_chunks_at_kill = s.status_json(None)?["dirty_chunks"].as_u64().unwrap_or(0);
        s.kill_node(0);
        match s.wait_persisted(Duration::from_secs(120)) {
            Ok(()) => c.loss_persisted = true,
            Err(e) => c.loss_note = format!("{e:#}"),
        }
        Box::new(s).stop()?;
        let mut env = self.s3.client_env();
        env.push(("SURGE_BB_BUCKET".into(), bucket));
        let v = work::Tool::install(&d, env)?.run(&["s3-verify", &reference.to_string_lossy(), "loss"])?;
        c.bytes_lost = v["bytes_lost"].as_u64().unwrap_or(u64::MAX);
        progress::step("surge: node loss done", true);
        Ok(())
    }
}

/// `SURGE_BB_APPROACHES=surge,juicefs`: run the rounds of these approaches
/// only, in their usual order, and print each round (for diagnosis).
fn approaches() -> anyhow::Result<Option<Vec<Kind>>> {
    let Ok(v) = std::env::var("SURGE_BB_APPROACHES") else { return Ok(None) };
    let kinds = v
        .split(',')
        .map(|name| Kind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| anyhow::anyhow!("SURGE_BB_APPROACHES: unknown approach {name:?} (surge, s3fs, juicefs, juicefs-writeback)")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(kinds))
}

pub fn run(out: &Path, quick: bool) -> anyhow::Result<()> {
    let only = approaches()?;
    let surge = std::env::current_exe()?;
    let has_pool = std::process::Command::new(&surge).args(["bb", "pool", "--help"]).output().is_ok_and(|o| o.status.success());
    let plan = Plan::new(quick, has_pool)?;
    let started = Instant::now();
    let mut work_dir = tempfile::Builder::new().prefix("surge-burstbuffer").tempdir_in("/var/tmp")?;
    // SURGE_BB_KEEP_WORK=1 keeps every process's log (and the data) for a look after the run.
    if std::env::var("SURGE_BB_KEEP_WORK").is_ok_and(|v| v == "1") {
        work_dir.disable_cleanup(true);
        eprintln!("work directory kept: {}", work_dir.path().display());
    }
    let work = work_dir.path().to_path_buf();
    crate::experiment::topology::unmount_on_signal(&work);
    let fixed = match plan.nodes {
        fs::Nodes::Fixed(n) => n,
        fs::Nodes::Pool { .. } => 0,
    };
    let machines = if plan.topology { machines::Machines::up(&work, fixed.max(plan.check_nodes))? } else { machines::Machines::loopback() };
    if std::env::var("SURGE_BB_SCALING_ONLY").is_ok_and(|v| v == "1") {
        anyhow::ensure!(plan.topology, "SURGE_BB_SCALING_ONLY=1 needs the topology (root, SURGE_BB_TOPOLOGY on)");
        let points = scaling::run(&surge, &work, &plan.scaling)?;
        println!("{}", serde_json::to_string_pretty(&scaling::summary(&points))?);
        eprintln!("SURGE_BB_SCALING_ONLY=1: a diagnostic run of the scaling part alone, no report");
        return Ok(());
    }
    if std::env::var("SURGE_BB_CREATES_ONLY").is_ok_and(|v| v == "1") {
        anyhow::ensure!(plan.topology, "SURGE_BB_CREATES_ONLY=1 needs the topology (root, SURGE_BB_TOPOLOGY on)");
        let m = meta_bench::machines(&work, &plan.creates, machines::CLUSTER_LINK)?;
        let points = meta_bench::run_on(&plan.creates, &m)?;
        println!("{}", serde_json::to_string_pretty(&meta_bench::summary(&points)["points"])?);
        eprintln!("SURGE_BB_CREATES_ONLY=1: a diagnostic run of the creates part alone, no report");
        return Ok(());
    }
    let s3 = s3::S3Server::start(&work, &machines)?;
    let tool = work::Tool::install(&work, s3.client_env())?;
    let mut deviations = Vec::new();
    if !work::drop_caches() {
        deviations.push("the page cache could not be dropped between write and read (not root): reads may be served from memory".to_string());
    }
    let scaling_steps = if plan.topology { plan.scaling.reps * plan.scaling.points.len() + 1 } else { 0 };
    progress::set_steps((plan.reps * Kind::ALL.len() + 2 + scaling_steps) as u64);
    progress::step("generating the Montage images", false);
    let fits = work.join("fits");
    let (images, fits_bytes) = work::fits(&tool, &fits, &plan)?;
    let mut rig = Rig { plan: plan.clone(), machines: machines.clone(), surge, work: work.clone(), s3, tool, fits, fits_bytes, prices: Prices::list()?, runs: 0 };
    let mut samples = Vec::new();
    for round in 0..plan.reps {
        // Interleaved, rotated: no approach always runs first.
        for j in 0..Kind::ALL.len() {
            let k = Kind::ALL[(round + j) % Kind::ALL.len()];
            if only.as_ref().is_some_and(|o| !o.contains(&k)) {
                continue;
            }
            let s = rig.round(k, round)?;
            let t = &s.throughput;
            let writes: Vec<String> = t.seq_write_samples_mbps.iter().map(|w| format!("{w:.0}")).collect();
            let reads: Vec<String> = t.seq_read_samples_mbps.iter().map(|r| format!("{r:.0}")).collect();
            eprintln!(
                "  {} round {}: write {:.0} MB/s ({}), read {:.0} MB/s ({}; fresh mount {:.0}), Montage {:.1} s",
                k.name(),
                round + 1,
                t.seq_write_mbps,
                writes.join(", "),
                t.seq_read_mbps,
                reads.join(", "),
                t.cold_read_mbps,
                s.montage_s
            );
            samples.push(s);
        }
    }
    if only.is_some() {
        eprintln!("SURGE_BB_APPROACHES is set: a diagnostic run, no checks and no report");
        return Ok(());
    }
    let mut checks = Checks::default();
    rig.consistency(&mut checks)?;
    rig.node_loss(&mut checks)?;
    let scaling = if plan.topology { Some(scaling::run(&rig.surge, &work, &plan.scaling)?) } else { None };
    let creates = if plan.topology {
        progress::step("creates against metadata masters", false);
        let m = meta_bench::machines(&work, &plan.creates, machines::CLUSTER_LINK)?;
        Some(meta_bench::run_on(&plan.creates, &m)?)
    } else {
        None
    };
    let topology = machines.topology().map(|t| report::TopologyReport { roles: t.roles().to_vec(), switch: t.counters() });
    let setup = report::Setup { images, fits_bytes: rig.fits_bytes, total_s: started.elapsed().as_secs_f64(), deviations, topology, scaling, creates };
    let by: BTreeMap<&str, Vec<Sample>> = Kind::ALL.iter().map(|k| (k.name(), samples.iter().filter(|s| s.approach == k.name()).cloned().collect())).collect();
    report::write(out, &plan, &rig.prices, &by, &checks, &setup)?;
    drop(rig);
    drop(work_dir);
    Ok(())
}
