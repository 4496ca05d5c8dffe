//! Local servers for a one-machine setup (and tests): a `redis-server` with
//! an append-only file fsynced on every write, so a restarted server loses no
//! committed metadata; and ports to start servers on.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where [`free_port`] starts looking: the ports below stay to well-known
/// and registered services, and to the defaults servers start on (NBD's
/// 10809, an I/O node's 7400).
const LOW_PORT: u32 = 20_000;

/// A TCP port free on every address now, for a server the caller starts
/// next (in another process, which is why it cannot bind port 0 itself).
///
/// A port from `bind(:0)`, released and bound again later, can be taken in
/// between: by any outgoing connection, or by another `bind(:0)`, since both
/// draw from the kernel's ephemeral range. These ports come from below that
/// range, in a sequence of this process's own (starting at a point set by
/// its pid), so only a server that names the port itself can take it.
pub fn free_port() -> std::io::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let top = ephemeral_low().unwrap_or(32_768).min(u16::MAX as u32 + 1);
    if top < LOW_PORT + 1_000 {
        // No room below the ephemeral range: the kernel's pick.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    }
    let span = top - LOW_PORT;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = (LOW_PORT + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no free TCP port in {LOW_PORT}..{top}")))
}

/// The first port of the kernel's ephemeral range, if it says.
fn ephemeral_low() -> Option<u32> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[derive(Debug, thiserror::Error)]
pub enum LocalRedisError {
    #[error("starting redis-server (is the redis-server package installed?): {0}")]
    Spawn(std::io::Error),
    #[error("redis-server on port {port} did not accept connections within 10 s (log: {log})")]
    NotReady { port: u16, log: String },
}

pub struct LocalRedis {
    pub port: u16,
    /// The address it listens on (127.0.0.1 unless [`LocalRedis::start_secured_on`]).
    pub bind: std::net::IpAddr,
    pub dir: PathBuf,
    /// With [`LocalRedis::start_secured`]: the password of user [`ACL_USER`].
    password: Option<String>,
    /// A Redis Cluster master ([`LocalCluster`]), its cluster bus on this port.
    cluster_bus: Option<u16>,
    /// The network namespace it runs in (`nsenter --net=`; None: this one).
    netns: Option<PathBuf>,
    child: Option<Child>,
}

/// Where a master of [`LocalCluster::start_on`] runs: the address it listens
/// on, in the network namespace it runs in (an experiment's machine).
#[derive(Debug, Clone)]
pub struct Host {
    pub bind: std::net::IpAddr,
    pub netns: Option<PathBuf>,
}

/// The ACL user [`LocalRedis::start_secured`] makes (the default user is off).
pub const ACL_USER: &str = "surge";

const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// Where [`LocalRedis::start_secured`] keeps the password (mode 0600).
pub fn password_file(dir: &Path) -> PathBuf {
    dir.join("password")
}

impl LocalRedis {
    /// Starts redis-server on 127.0.0.1:`port` keeping its files in `dir`.
    /// No password: anyone who can connect to the port can read and change
    /// the metadata (tests, and `surge bb redis --no-auth`).
    pub fn start(dir: &Path, port: u16) -> Result<LocalRedis, LocalRedisError> {
        std::fs::create_dir_all(dir).map_err(LocalRedisError::Spawn)?;
        let mut r = LocalRedis { port, bind: LOOPBACK, dir: dir.to_path_buf(), password: None, cluster_bus: None, netns: None, child: None };
        r.spawn()?;
        Ok(r)
    }

    /// Like [`LocalRedis::start`], but only user [`ACL_USER`] may log in,
    /// with the password in [`password_file`] (made, random, if missing; kept
    /// across restarts). The ACL file holds its SHA-256, never the password,
    /// and no password is ever on redis-server's command line.
    pub fn start_secured(dir: &Path, port: u16) -> Result<LocalRedis, LocalRedisError> {
        Self::start_secured_on(dir, LOOPBACK, port)
    }

    /// [`LocalRedis::start_secured`] listening on `bind` (another machine's
    /// clients reach it there; only the ACL user with its password gets in).
    pub fn start_secured_on(dir: &Path, bind: std::net::IpAddr, port: u16) -> Result<LocalRedis, LocalRedisError> {
        let mut r = Self::secured(dir, port)?;
        r.bind = bind;
        r.spawn()?;
        Ok(r)
    }

    /// A secured server set up in `dir` but not started.
    fn secured(dir: &Path, port: u16) -> Result<LocalRedis, LocalRedisError> {
        std::fs::create_dir_all(dir).map_err(LocalRedisError::Spawn)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            // Its data (the metadata, the ACL) is nobody else's to read either.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(LocalRedisError::Spawn)?;
        }
        let password = ensure_password(&password_file(dir)).map_err(LocalRedisError::Spawn)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        // The default user is off (no one logs in as it) but keeps every
        // permission: redis-server replays the append-only file as that
        // user, and 7.0 checks its permissions at each EXEC there, so a
        // default user without them drops every script's writes (a
        // MULTI/EXEC in the file) at a restart.
        write_private(&dir.join("users.acl"), format!("user default off ~* &* +@all\nuser {ACL_USER} on #{hex} ~* &* +@all\n").as_bytes()).map_err(LocalRedisError::Spawn)?;
        Ok(LocalRedis { port, bind: LOOPBACK, dir: dir.to_path_buf(), password: Some(password), cluster_bus: None, netns: None, child: None })
    }

    /// How clients log in (nothing for an open server).
    pub fn auth(&self) -> crate::meta::redis::RedisAuth {
        crate::meta::redis::RedisAuth { user: self.password.as_ref().map(|_| ACL_USER.to_string()), password: self.password.clone(), tls_dir: None }
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.bind, self.port)
    }

    fn spawn(&mut self) -> Result<(), LocalRedisError> {
        let log = self.dir.join("redis.log");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg("--").arg("redis-server");
                c
            }
            None => Command::new("redis-server"),
        };
        cmd.args(["--bind", &self.bind.to_string(), "--port", &self.port.to_string(), "--appendonly", "yes", "--appendfsync", "always"]);
        match self.password {
            Some(_) => cmd.args(["--save", "", "--protected-mode", "yes", "--daemonize", "no", "--aclfile"]).arg(self.dir.join("users.acl")),
            None => cmd.args(["--save", "", "--protected-mode", "no", "--daemonize", "no"]),
        };
        if let Some(bus) = self.cluster_bus {
            // nodes.conf in --dir: a restarted master keeps its id and slots.
            cmd.args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()]);
            cmd.args(["--cluster-port", &bus.to_string()]);
        }
        let child = cmd
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(LocalRedisError::Spawn)?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(mut s) = std::net::TcpStream::connect((self.bind, self.port)) {
                use std::io::{Read, Write};
                let mut hello = Vec::new();
                if let Some(p) = &self.password {
                    hello.extend_from_slice(format!("AUTH {ACL_USER} {p}\r\n").as_bytes());
                }
                hello.extend_from_slice(b"PING\r\n");
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let mut got = Vec::new();
                let mut buf = [0u8; 64];
                if s.write_all(&hello).is_ok() {
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                        if got.windows(5).any(|w| w == b"+PONG") || got.starts_with(b"-") {
                            break;
                        }
                    }
                }
                if got.windows(5).any(|w| w == b"+PONG") {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(LocalRedisError::NotReady { port: self.port, log: log.display().to_string() })
    }

    /// Kills the server (SIGKILL: no chance to save anything more).
    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills and starts it again on the same port and files.
    pub fn restart(&mut self) -> Result<(), LocalRedisError> {
        self.kill();
        self.spawn()
    }

    /// Waits for the server process (foreground use by `surge bb redis`).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self.child.as_mut() {
            Some(c) => c.wait(),
            None => Err(std::io::Error::other("redis-server not running")),
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LocalClusterError {
    #[error("a Redis Cluster needs at least 1 master, not {0}")]
    TooFew(usize),
    #[error(transparent)]
    Node(#[from] LocalRedisError),
    #[error("redis-cli --cluster create failed ({0}); is redis-cli (redis-tools) installed?")]
    Create(String),
    #[error("the cluster did not reach cluster_state:ok within 20 s: {0}")]
    NotReady(String),
    #[error("{dir} holds a cluster made on other ports or of another size ({found}); start it as it was made")]
    Mismatch { dir: String, found: String },
}

/// Local redis-server masters made one Redis Cluster (no replicas), each
/// with the single server's persistence (append-only, fsync always) and,
/// secured, the same ACL user and one password (in the cluster's
/// [`password_file`]). Master `i` keeps its files in `DIR/node-i`.
pub struct LocalCluster {
    pub nodes: Vec<LocalRedis>,
    pub dir: PathBuf,
}

/// How long a master may be silent before the others count it failed.
/// Short, so a test sees a failed master soon; a restart (AOF reload)
/// of a small store fits well within it.
const NODE_TIMEOUT_MS: u32 = 3000;

impl LocalCluster {
    /// Starts one master per `(port, cluster bus port)` in `ports` and makes
    /// them a cluster (slots spread evenly), or, when `dir` holds one made
    /// before on the same ports, starts it again as it was.
    pub fn start(dir: &Path, ports: &[(u16, u16)], secured: bool) -> Result<LocalCluster, LocalClusterError> {
        let local = Host { bind: LOOPBACK, netns: None };
        Self::start_at(dir, &ports.iter().map(|&(p, b)| (local.clone(), p, b)).collect::<Vec<_>>(), secured)
    }

    /// A fresh cluster of one open master per host (a benchmark's masters
    /// on machines of their own), each on ports of its own namespace.
    pub fn start_on(dir: &Path, hosts: &[Host]) -> Result<LocalCluster, LocalClusterError> {
        let at = hosts.iter().map(|h| Ok((h.clone(), free_port()?, free_port()?))).collect::<std::io::Result<Vec<_>>>().map_err(LocalRedisError::Spawn)?;
        Self::start_at(dir, &at, false)
    }

    fn start_at(dir: &Path, ports: &[(Host, u16, u16)], secured: bool) -> Result<LocalCluster, LocalClusterError> {
        if ports.is_empty() {
            return Err(LocalClusterError::TooFew(0));
        }
        std::fs::create_dir_all(dir).map_err(LocalRedisError::Spawn)?;
        let password = if secured { Some(ensure_password(&password_file(dir)).map_err(LocalRedisError::Spawn)?) } else { None };
        // The masters of a cluster made before in `dir` (a master alone: a
        // start that never got as far as making the cluster).
        let conf = std::fs::read_to_string(dir.join("node-0").join("nodes.conf")).unwrap_or_default();
        let masters: Vec<&str> = conf.lines().filter(|l| l.split_whitespace().nth(2).is_some_and(|f| f.contains("master"))).collect();
        let mut was: Vec<String> = masters
            .iter()
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|a| a.split(',').next().unwrap_or(a).to_string())
            .collect();
        // (Fields 9 on are a master's slots: none yet, a start that never made the cluster.)
        let made_before = masters.iter().any(|l| l.split_whitespace().count() > 8);
        let mut nodes = Vec::new();
        for (i, (host, port, bus)) in ports.iter().enumerate() {
            let (port, bus) = (*port, *bus);
            let ndir = dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&ndir).map_err(LocalRedisError::Spawn)?;
            let mut r = match &password {
                Some(p) => {
                    write_private(&password_file(&ndir), format!("{p}\n").as_bytes()).map_err(LocalRedisError::Spawn)?;
                    LocalRedis::secured(&ndir, port)?
                }
                None => LocalRedis { port, bind: LOOPBACK, dir: ndir, password: None, cluster_bus: None, netns: None, child: None },
            };
            r.cluster_bus = Some(bus);
            r.bind = host.bind;
            r.netns = host.netns.clone();
            nodes.push(r);
        }
        if made_before {
            // Peers find each other at the addresses in nodes.conf: other
            // ports would leave the cluster down for good.
            let mut now: Vec<String> = ports.iter().map(|(h, p, b)| format!("{}:{p}@{b}", h.bind)).collect();
            was.sort();
            now.sort();
            if was != now {
                return Err(LocalClusterError::Mismatch { dir: dir.display().to_string(), found: was.join(" ") });
            }
        }
        for r in &mut nodes {
            r.spawn()?;
        }
        let c = LocalCluster { nodes, dir: dir.to_path_buf() };
        if made_before {
            c.wait_ok()?;
            return Ok(c);
        }
        if c.nodes.len() < 3 {
            c.assign_slots()?;
            c.wait_ok()?;
            return Ok(c);
        }
        let mut cli = c.cli();
        cli.arg("--cluster").arg("create");
        for r in &c.nodes {
            cli.arg(format!("{}:{}", r.bind, r.port));
        }
        let out = cli.arg("--cluster-yes").output().map_err(|e| LocalClusterError::Create(e.to_string()))?;
        if !out.status.success() {
            return Err(LocalClusterError::Create(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))));
        }
        c.wait_ok()?;
        Ok(c)
    }

    /// What `redis-cli --cluster create` does, for the 1 or 2 masters it
    /// refuses: an even share of the slots each, distinct config epochs,
    /// and every master introduced to the first.
    fn assign_slots(&self) -> Result<(), LocalClusterError> {
        let n = self.nodes.len();
        let want_ok = |i: usize, args: &[&str]| -> Result<(), LocalClusterError> {
            match self.ask(i, args) {
                Some(out) if out.trim() == "OK" => Ok(()),
                out => Err(LocalClusterError::Create(format!("master {i}: {} answered {:?}", args.join(" "), out.unwrap_or_default().trim()))),
            }
        };
        for i in 0..n {
            let (a, b) = (i * 16384 / n, (i + 1) * 16384 / n - 1);
            want_ok(i, &["cluster", "set-config-epoch", &(i + 1).to_string()])?;
            want_ok(i, &["cluster", "addslotsrange", &a.to_string(), &b.to_string()])?;
        }
        let (p0, bus0) = (self.nodes[0].port.to_string(), self.nodes[0].cluster_bus.unwrap_or(0).to_string());
        for i in 1..n {
            want_ok(i, &["cluster", "meet", &self.nodes[0].bind.to_string(), &p0, &bus0])?;
        }
        Ok(())
    }

    /// `n` masters on ports from [`free_port`] (tests).
    pub fn start_free(dir: &Path, n: usize, secured: bool) -> Result<LocalCluster, LocalClusterError> {
        let ports = (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<std::io::Result<Vec<_>>>().map_err(LocalRedisError::Spawn)?;
        Self::start(dir, &ports, secured)
    }

    /// redis-cli logged in as the cluster's user; the password goes in the
    /// environment (REDISCLI_AUTH), never on a command line.
    fn cli(&self) -> Command {
        let mut cli = Command::new("redis-cli");
        if let Some(p) = &self.nodes[0].password {
            cli.env("REDISCLI_AUTH", p).args(["--user", ACL_USER]);
        }
        cli.stdin(Stdio::null());
        cli
    }

    /// `redis-cli -h HOST -p PORT-of-master-i args...`'s output.
    fn ask(&self, i: usize, args: &[&str]) -> Option<String> {
        let out = self.cli().args(["-h", &self.nodes[i].bind.to_string(), "-p", &self.nodes[i].port.to_string()]).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// Waits until every master says cluster_state:ok and knows all the others.
    pub fn wait_ok(&self) -> Result<(), LocalClusterError> {
        let start = Instant::now();
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let states: Vec<String> = (0..self.nodes.len()).map(|i| self.ask(i, &["cluster", "info"]).unwrap_or_default()).collect();
            if states.iter().all(|s| s.contains("cluster_state:ok") && s.contains(&known)) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                let first_bad = states.into_iter().find(|s| !s.contains("cluster_state:ok")).unwrap_or_default();
                return Err(LocalClusterError::NotReady(first_bad.lines().next().unwrap_or("no answer").to_string()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,.../`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|r| format!("{}:{}", r.bind, r.port)).collect();
        format!("{}{}/", crate::meta::redis::CLUSTER_SCHEME, hosts.join(","))
    }

    pub fn auth(&self) -> crate::meta::redis::RedisAuth {
        self.nodes[0].auth()
    }

    /// The index of the master serving `key`'s slot, as the cluster says.
    pub fn owner_of(&self, key: &str) -> Option<usize> {
        let slot: u32 = self.ask(0, &["cluster", "keyslot", key])?.trim().parse().ok()?;
        (0..self.nodes.len()).find(|&i| {
            let text = self.ask(i, &["cluster", "nodes"]).unwrap_or_default();
            let mine = text.lines().find(|l| l.contains("myself")).unwrap_or("");
            // Fields 9 on: the slots it serves, `a-b` or `a`.
            mine.split_whitespace().skip(8).any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            })
        })
    }

    /// Every key master `i` holds (tests).
    pub fn keys_on(&self, i: usize) -> Vec<String> {
        self.ask(i, &["--scan"]).unwrap_or_default().lines().map(str::to_string).collect()
    }

    /// Kills master `i` (SIGKILL), starts it again on its files and waits
    /// for the cluster to be whole again.
    pub fn restart(&mut self, i: usize) -> Result<(), LocalClusterError> {
        self.nodes[i].restart()?;
        self.wait_ok()
    }

    /// Waits for every master's process (foreground use by `surge bb redis --cluster`).
    pub fn wait(&mut self) -> std::io::Result<()> {
        for r in &mut self.nodes {
            r.wait()?;
        }
        Ok(())
    }
}

/// The password in `path`, or a new random one written there (mode 0600).
fn ensure_password(path: &Path) -> std::io::Result<String> {
    if path.exists() {
        return crate::meta::redis::RedisAuth::read_password(path);
    }
    let mut raw = [0u8; 24];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).map_err(|_| std::io::Error::other("no randomness"))?;
    let password: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    write_private(path, format!("{password}\n").as_bytes())?;
    Ok(password)
}

/// Writes `data` to `path`, readable by its owner only.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port handed out twice: {ports:?}");
        let top = ephemeral_low().unwrap_or(32_768);
        for p in ports {
            assert!((p as u32) < top, "port {p} is in the ephemeral range (from {top})");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap_or_else(|e| panic!("port {p}: {e}"));
        }
    }
}
