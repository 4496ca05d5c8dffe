//! The machines of an experiment, on one host: every role (a client, an I/O
//! node, a metadata server, the S3 server) is a network namespace of its
//! own with one link, a veth pair whose far end is a port of a [`Switch`]
//! that gives each link its rate and delay. The experiment's own process
//! reaches every role through an unshaped host port, for control only
//! (status, buckets, checks); the programs under test run inside their
//! role's namespace (`nsenter --net`: their FUSE mounts stay visible here).
//! Everything is removed when the [`Topology`] is dropped.

pub mod switch;

use crate::experiment::streaming::proc::sh;
use anyhow::Context as _;
use std::net::Ipv4Addr;
use std::process::Command;
pub use switch::{Counters, PortSpec, Switch};

/// One machine of the topology.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Role {
    pub name: String,
    #[serde(skip)]
    pub ns: String,
    pub ip: Ipv4Addr,
    pub link: PortSpec,
}

pub struct Topology {
    /// Declared first: it stops before the interfaces it reads go away.
    switch: Option<Switch>,
    roles: Vec<Role>,
    host_if: String,
}

/// The host's end never limits: it carries control traffic only.
const HOST: PortSpec = PortSpec { rate_mbit: 0, delay_us: 0, per_peer_mbit: 0 };

/// What a signal must take down: the namespaces (with what runs in them)
/// and host interfaces of every live topology, and the FUSE mounts under the
/// directories named by [`unmount_on_signal`]. A killed experiment otherwise
/// leaves them all behind (Drop does not run on SIGINT or SIGTERM).
#[derive(Default)]
struct Leftovers {
    namespaces: Vec<String>,
    host_ifs: Vec<String>,
    mount_roots: Vec<std::path::PathBuf>,
}

static LEFTOVERS: parking_lot::Mutex<Leftovers> = parking_lot::Mutex::new(Leftovers { namespaces: Vec::new(), host_ifs: Vec::new(), mount_roots: Vec::new() });

/// Kill what runs in namespace `ns`, then delete it.
fn remove_namespace(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill(2) on a process of a namespace this topology made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

/// On SIGINT or SIGTERM: take everything down, then exit (once per process).
fn teardown_on_signal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(mut signals) = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]) else { return };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let l = std::mem::take(&mut *LEFTOVERS.lock());
                eprintln!("signal {sig}: removing the experiment's machines and mounts");
                for ns in &l.namespaces {
                    remove_namespace(ns);
                }
                for i in &l.host_ifs {
                    let _ = Command::new("ip").args(["link", "del", i]).status();
                }
                let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
                for m in mounts.lines().filter_map(|line| {
                    let mut f = line.split(' ');
                    let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
                    (kind.starts_with("fuse") && l.mount_roots.iter().any(|r| std::path::Path::new(dir).starts_with(r))).then_some(dir)
                }) {
                    let _ = Command::new("fusermount3").args(["-u", "-z", m]).status();
                }
                std::process::exit(128 + sig);
            }
        });
    });
}

/// FUSE mounts below `dir` are unmounted (lazily) if a signal ends the run.
pub fn unmount_on_signal(dir: &std::path::Path) {
    LEFTOVERS.lock().mount_roots.push(dir.to_path_buf());
}

fn run(script: &str) -> anyhow::Result<()> {
    sh(Command::new("sh").arg("-c").arg(script)).with_context(|| format!("setting up the emulated network: {script} (needs root and iproute2)"))?;
    Ok(())
}

impl Topology {
    /// Namespaces, links and the switch for `roles` (name, link); `id` keeps
    /// names apart from other runs on the machine.
    pub fn up(id: u32, roles: &[(&str, PortSpec)]) -> anyhow::Result<Topology> {
        anyhow::ensure!(roles.len() < 200, "at most 199 roles");
        let id = id % 10_000;
        teardown_on_signal();
        let subnet = format!("10.219.{}", id % 250);
        let host_if = format!("sb{id}h");
        let host_ip: Ipv4Addr = format!("{subnet}.1").parse()?;
        let mut t = Topology { switch: None, roles: Vec::new(), host_if: host_if.clone() };
        LEFTOVERS.lock().host_ifs.push(host_if.clone());
        // Left over by a run of the same id that was killed.
        let _ = Command::new("ip").args(["link", "del", &host_if]).stderr(std::process::Stdio::null()).status();
        run(&format!("ip link add {host_if} type veth peer name {host_if}p && ip addr add {host_ip}/24 dev {host_if} && ip link set {host_if} up && ip link set {host_if}p up"))?;
        let mut ports = vec![(format!("{host_if}p"), HOST)];
        for (i, (name, link)) in roles.iter().enumerate() {
            let ns = format!("surge-bb{id}-{name}");
            let port = format!("sb{id}p{i}");
            let ip: Ipv4Addr = format!("{subnet}.{}", i + 10).parse()?;
            let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(std::process::Stdio::null()).status();
            run(&format!("ip netns add {ns}"))?;
            LEFTOVERS.lock().namespaces.push(ns.clone());
            t.roles.push(Role { name: name.to_string(), ns: ns.clone(), ip, link: *link });
            run(&format!(
                "ip link add {port} type veth peer name eth0 netns {ns} && ip link set {port} up && \
                 ip -n {ns} addr add {ip}/24 dev eth0 && ip -n {ns} link set eth0 up && ip -n {ns} link set lo up"
            ))?;
            // The switch's ends carry no address; keep IPv6 chatter off them.
            let _ = Command::new("sysctl").args(["-q", "-w", &format!("net.ipv6.conf.{port}.disable_ipv6=1")]).status();
            ports.push((port, *link));
        }
        t.switch = Some(Switch::start(&ports)?);
        Ok(t)
    }

    pub fn role(&self, name: &str) -> &Role {
        self.roles.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no role {name} in the topology"))
    }

    pub fn roles(&self) -> &[Role] {
        &self.roles
    }

    pub fn ip(&self, name: &str) -> Ipv4Addr {
        self.role(name).ip
    }

    /// `program` run on machine `name`: in its network namespace only, so
    /// its files and mounts are this host's.
    pub fn command(&self, name: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.netns(name).display())).arg("--").arg(program);
        c
    }

    /// Machine `name`'s network namespace.
    pub fn netns(&self, name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/run/netns/{}", self.role(name).ns))
    }

    pub fn counters(&self) -> Counters {
        self.switch.as_ref().map(|s| s.counters()).unwrap_or_default()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.switch.take();
        let mut l = LEFTOVERS.lock();
        for r in &self.roles {
            // Whatever still runs on a machine goes with it.
            remove_namespace(&r.ns);
            l.namespaces.retain(|n| n != &r.ns);
        }
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).stderr(std::process::Stdio::null()).status();
        l.host_ifs.retain(|i| i != &self.host_if);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// Moves this thread into `role`'s network namespace.
    fn enter(t: &Topology, role: &str) {
        let f = std::fs::File::open(format!("/run/netns/{}", t.role(role).ns)).unwrap();
        // SAFETY: setns(2) on an open namespace file; only this thread moves.
        assert_eq!(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) }, 0);
    }

    #[test]
    fn machines_see_each_other_only_across_their_links() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: network namespaces need root");
            return;
        }
        // Each end 40 Mbit/s (5 MB/s) and 5 ms: 10 ms one way, 20 ms a round trip.
        let link = PortSpec { rate_mbit: 40, delay_us: 5000, per_peer_mbit: 0 };
        let t = std::sync::Arc::new(Topology::up(std::process::id() + 7, &[("a", link), ("b", link)]).unwrap());
        let (t2, b_ip) = (t.clone(), t.ip("b"));
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            enter(&t2, "b");
            let l = TcpListener::bind((b_ip, 7000)).unwrap();
            tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut one = [0u8; 1];
            for _ in 0..10 {
                s.read_exact(&mut one).unwrap();
                s.write_all(&one).unwrap();
            }
            let mut n = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match s.read(&mut buf).unwrap() {
                    0 => break n,
                    k => n += k as u64,
                }
            }
        });
        rx.recv().unwrap();
        let t3 = t.clone();
        let client = std::thread::spawn(move || {
            enter(&t3, "a");
            let mut s = TcpStream::connect((b_ip, 7000)).unwrap();
            s.set_nodelay(true).unwrap();
            let mut rtt = Duration::MAX;
            let mut one = [7u8; 1];
            for _ in 0..10 {
                let at = Instant::now();
                s.write_all(&one).unwrap();
                s.read_exact(&mut one).unwrap();
                rtt = rtt.min(at.elapsed());
            }
            let at = Instant::now();
            let buf = vec![1u8; 3 << 20];
            s.write_all(&buf).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            (rtt, at.elapsed())
        });
        let (rtt, took) = client.join().unwrap();
        assert_eq!(server.join().unwrap(), 3 << 20);
        assert!(rtt >= Duration::from_millis(20), "round trip {rtt:?}, below the links' 20 ms");
        let mbps = (3 << 20) as f64 / took.as_secs_f64() / 1e6;
        assert!(mbps <= 5.0 * 1.1, "{mbps:.2} MB/s through a 5 MB/s link");
        assert!(mbps >= 1.0, "{mbps:.2} MB/s: the link carries far less than its rate");
        assert!(t.counters().forwarded > 100, "{:?}", t.counters());
    }
}
