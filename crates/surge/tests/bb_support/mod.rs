//! Harness for the burst-buffer tests: a real redis-server, a real S3 server
//! (moto in server mode), `surge bb node` processes on loopback and
//! `surge bb mount` FUSE mounts, all children of the test process.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use surge_bb::local::{LocalCluster, LocalRedis};
use surge_bb::s3::{S3Config, S3};

pub const BIN: &str = env!("CARGO_BIN_EXE_surge");

/// A port for a server a test starts (see `surge_bb::local::free_port`).
pub fn free_port() -> u16 {
    surge_bb::local::free_port().expect("a free TCP port")
}

/// Children die with the test process, even when it panics or is killed.
fn die_with_parent(cmd: &mut Command) -> &mut Command {
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

pub fn require(tool: &str) {
    let ok = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    assert!(ok, "{tool} is needed by this test (scripts/test-all.sh installs it)");
}

/// One moto S3 server per test binary.
pub fn s3_endpoint() -> &'static str {
    static EP: OnceLock<String> = OnceLock::new();
    EP.get_or_init(|| {
        require("moto_server");
        let port = free_port();
        // PDEATHSIG fires when the spawning *thread* ends, and test threads end
        // with their test: spawn the shared server from a thread that never ends.
        std::thread::spawn(move || {
            let mut cmd = Command::new("moto_server");
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]).stdout(Stdio::null()).stderr(Stdio::null());
            let mut child = die_with_parent(&mut cmd).spawn().expect("moto_server");
            let _ = child.wait();
        });
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "moto_server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        format!("http://127.0.0.1:{port}")
    })
}

/// Creates a bucket with a plain HTTP PUT (moto accepts unsigned requests).
pub fn create_bucket(endpoint: &str, bucket: &str) {
    let hostport = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(hostport).unwrap();
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {resp}");
}

pub struct Node {
    pub addr: String,
    pub child: Child,
}

impl Node {
    /// Waits up to `timeout` for the node process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn kill9(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Mount {
    pub dir: PathBuf,
    child: Child,
}

fn mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let d = dir.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*d))
}

impl Mount {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn unmount(&mut self) {
        if mounted(&self.dir) {
            let _ = Command::new("fusermount3").arg("-u").arg(&self.dir).status();
        }
        exit_or_kill(&mut self.child, Duration::from_secs(20));
    }
}

/// Waits up to `grace` for `child` to exit by itself, then kills it.
pub fn exit_or_kill(child: &mut std::process::Child, grace: Duration) {
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// The metadata's server: a single Redis (open), or a Redis Cluster of 3
/// masters secured as `surge bb redis --cluster 3` makes it.
pub enum Meta {
    Single(LocalRedis),
    Cluster(LocalCluster),
}

impl Meta {
    pub fn url(&self) -> String {
        match self {
            Meta::Single(r) => r.url(),
            Meta::Cluster(c) => c.url(),
        }
    }

    pub fn auth(&self) -> surge_bb::meta::redis::RedisAuth {
        match self {
            Meta::Single(r) => r.auth(),
            Meta::Cluster(c) => c.auth(),
        }
    }

    /// What `surge bb` commands need to log in.
    pub fn login_args(&self) -> Vec<String> {
        match self {
            Meta::Single(_) => vec![],
            Meta::Cluster(c) => vec![
                "--redis-user".into(),
                surge_bb::local::ACL_USER.into(),
                "--redis-password-file".into(),
                surge_bb::local::password_file(&c.dir).display().to_string(),
            ],
        }
    }

    /// Kills (SIGKILL) and starts again the server, or on a cluster every
    /// master in turn (a sharded file system is on all of them).
    pub fn restart(&mut self) -> Result<(), String> {
        match self {
            Meta::Single(r) => r.restart().map_err(|e| e.to_string()),
            Meta::Cluster(c) => (0..c.nodes.len()).try_for_each(|i| c.restart(i).map_err(|e| e.to_string())),
        }
    }
}

/// A burst buffer on loopback: Redis, a bucket on the shared moto server,
/// nodes and mounts.
pub struct Bb {
    pub dir: tempfile::TempDir,
    pub redis: Meta,
    pub bucket: String,
    pub endpoint: String,
    pub chunk_size: String,
    pub replicas: usize,
    pub node_args: Vec<String>,
    pub membership: String,
}

impl Bb {
    /// The tier as a client of this burst buffer opens it (2 replicas, 256 KiB chunks).
    pub fn tier(&self) -> std::sync::Arc<surge_bb::tier::Tier> {
        surge_bb::tier::TierConfig {
            redis: self.redis.url(),
            fs: "default".into(),
            membership: "redis".into(),
            s3: Some(surge_bb::s3::S3Config {
                endpoint: Some(self.endpoint.clone()),
                bucket: self.bucket.clone(),
                region: "us-east-1".into(),
                access_key: Some("test".into()),
                secret_key: Some("test".into()),
            }),
            replicas: 2,
            chunk_size: 256 << 10,
            access: surge_bb::tier::Access { redis: self.redis.auth(), ..Default::default() },
        }
        .open()
        .unwrap()
    }

    pub fn new(name: &str, chunk_size: &str) -> Bb {
        Self::new_on(name, chunk_size, false)
    }

    /// With the metadata on a 3-master Redis Cluster (`name` as for a
    /// single Redis: the bucket is named after it).
    pub fn on_cluster(name: &str, chunk_size: &str) -> Bb {
        Self::new_on(&format!("{name}-cluster"), chunk_size, true)
    }

    fn new_on(name: &str, chunk_size: &str, cluster: bool) -> Bb {
        require("redis-server");
        require("fusermount3");
        let dir = tempfile::tempdir().unwrap();
        let redis = if cluster {
            require("redis-cli");
            Meta::Cluster(LocalCluster::start_free(&dir.path().join("cluster"), 3, true).unwrap())
        } else {
            Meta::Single(LocalRedis::start(&dir.path().join("redis"), free_port()).unwrap())
        };
        let endpoint = s3_endpoint().to_string();
        let bucket = format!("bb-{name}-{}", std::process::id());
        create_bucket(&endpoint, &bucket);
        Bb { dir, redis, bucket, endpoint, chunk_size: chunk_size.into(), replicas: 2, node_args: vec![], membership: "redis".into() }
    }

    pub fn common(&self) -> Vec<String> {
        let mut args = vec![
            "--redis".into(),
            self.redis.url(),
            "--bucket".into(),
            self.bucket.clone(),
            "--s3-endpoint".into(),
            self.endpoint.clone(),
            "--chunk-size".into(),
            self.chunk_size.clone(),
            "--replicas".into(),
            self.replicas.to_string(),
            "--membership".into(),
            self.membership.clone(),
        ];
        args.extend(self.redis.login_args());
        args
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("AWS_ACCESS_KEY_ID", "test").env("AWS_SECRET_ACCESS_KEY", "test").env("SURGE_LOG", "info");
        c
    }

    pub fn node(&self, extra: &[&str]) -> Node {
        self.node_at("127.0.0.1:0", extra)
    }

    /// A node listening on `listen` (e.g. the address of a node killed before).
    pub fn node_at(&self, listen: &str, extra: &[&str]) -> Node {
        let name = format!("node-{}.log", free_port());
        let log = std::fs::File::create(self.dir.path().join(&name)).unwrap();
        let mut cmd = self.cmd();
        cmd.args(["bb", "node", "--listen", listen]);
        if !extra.contains(&"--memory") {
            cmd.args(["--memory", "256MiB"]);
        }
        cmd
            .args(self.common())
            .args(&self.node_args)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = die_with_parent(&mut cmd).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(!line.trim().is_empty(), "node did not start: {}", self.log(&name));
        Node { addr: line.trim().to_string(), child }
    }

    pub fn mount(&self, name: &str, extra: &[&str]) -> Mount {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(self.dir.path().join(format!("mount-{name}.log"))).unwrap();
        let mut cmd = self.cmd();
        cmd.args(["bb", "mount"]).arg(&dir).args(self.common()).args(extra).stdout(Stdio::null()).stderr(log);
        let mut child = die_with_parent(&mut cmd).spawn().unwrap();
        let start = Instant::now();
        while !mounted(&dir) {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("mount exited with {st}: {}", self.log(&format!("mount-{name}.log")));
            }
            assert!(start.elapsed() < Duration::from_secs(20), "mount did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mount { dir, child }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                out += &format!("== {}\n{}\n", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }

    /// `surge bb ...` with this buffer's settings; (status ok, stdout, stderr).
    pub fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.cmd().arg("bb").args(args).args(self.common()).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    }

    pub fn s3(&self) -> S3 {
        S3::connect(&S3Config {
            endpoint: Some(self.endpoint.clone()),
            bucket: self.bucket.clone(),
            region: "us-east-1".into(),
            access_key: Some("test".into()),
            secret_key: Some("test".into()),
        })
        .unwrap()
    }

    /// Waits until every file below `path` is persisted in S3.
    pub fn wait_persisted(&self, path: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            let (ok, out, err) = self.run(&["status", path, "--json"]);
            if ok {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                if v.as_array().unwrap().iter().all(|f| f["persisted"] == true) {
                    return;
                }
            }
            assert!(start.elapsed() < timeout, "not persisted after {timeout:?}: {out} {err}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A single-member etcd on loopback, killed on drop.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub struct Etcd {
    pub url: String,
    child: Child,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        require("etcd");
        let (client, peer) = (free_port(), free_port());
        let c = format!("http://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new("etcd");
        cmd.arg("--data-dir")
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args(["--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("default={p}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = die_with_parent(&mut cmd).spawn().expect("etcd");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "etcd did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Etcd { url: c, child }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
