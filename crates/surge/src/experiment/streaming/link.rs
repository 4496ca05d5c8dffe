//! The emulated network between the compute node (this namespace) and the
//! storage node (a network namespace of its own): a veth pair with a token
//! bucket (tc tbf) at the link rate on both ends, plus a userspace delay line
//! on the compute side that adds the one-way propagation delay each way (this
//! kernel has no sch_netem; where it has, `tc netem` would do the same).
//! Everything is removed when the [`Link`] is dropped.

use super::proc::sh;
use anyhow::Context as _;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Link {
    pub ns: String,
    host_if: String,
    pub storage_ip: String,
    pub delay: Duration,
    relay: Option<Relay>,
}

impl Link {
    /// Create the namespace, the veth pair and the shapers; `id` keeps names
    /// apart from other runs on the machine.
    pub fn up(id: u32, rate_mbit: u64, delay: Duration) -> anyhow::Result<Link> {
        let ns = format!("surge-st{id}");
        let (host_if, ns_if) = (format!("sv{id}c"), format!("sv{id}s"));
        let subnet = format!("10.217.{}", id % 250);
        let link = Link { ns: ns.clone(), host_if: host_if.clone(), storage_ip: format!("{subnet}.2"), delay, relay: None };
        let tbf = |dev: &str| format!("tc qdisc add dev {dev} root tbf rate {rate_mbit}mbit burst 256kb latency 5ms");
        let steps = [
            format!("ip netns add {ns}"),
            format!("ip link add {host_if} type veth peer name {ns_if}"),
            format!("ip link set {ns_if} netns {ns}"),
            format!("ip addr add {subnet}.1/24 dev {host_if}"),
            format!("ip link set {host_if} up"),
            format!("ip netns exec {ns} ip addr add {subnet}.2/24 dev {ns_if}"),
            format!("ip netns exec {ns} ip link set {ns_if} up"),
            format!("ip netns exec {ns} ip link set lo up"),
            tbf(&host_if),
            format!("ip netns exec {ns} {}", tbf(&ns_if)),
        ];
        for s in &steps {
            sh(Command::new("sh").arg("-c").arg(s)).with_context(|| format!("setting up the emulated link: {s} (needs root, iproute2 and a kernel with tbf)"))?;
        }
        Ok(link)
    }

    /// A command run inside the storage node's namespace.
    pub fn in_storage(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// Start the delay line towards `port` on the storage node; returns the
    /// local address clients on the compute node connect to.
    pub fn relay_to(&mut self, port: u16) -> anyhow::Result<SocketAddr> {
        let target: SocketAddr = format!("{}:{port}", self.storage_ip).parse()?;
        let relay = Relay::start(target, self.delay)?;
        let addr = relay.addr;
        self.relay = Some(relay);
        Ok(addr)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.relay.take();
        // Whatever still runs in the namespace goes with it.
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.ns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill(2) on a process of our own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        // Usually gone already: deleting the namespace deletes the veth pair.
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).stderr(std::process::Stdio::null()).status();
    }
}

/// A TCP relay that holds every chunk for `delay` before passing it on, in
/// each direction: propagation delay without netem.
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: SocketAddr, delay: Duration) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::Builder::new().name("link-relay".into()).spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(target) else { continue };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                pump(client, s2, delay);
                pump(server, c2, delay);
            }
        })?;
        Ok(Relay { addr, stop })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copy `from` to `to`, holding each chunk `delay` after it was read. One
/// thread per direction: NBD traffic is request/response, so a chunk rarely
/// waits behind another one's delay, and no thread hand-off adds latency.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    std::thread::spawn(move || {
        // Sleep as long as asked, not up to the default 50 µs timer slack more.
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Read);
        let _ = to.shutdown(Shutdown::Write);
    });
}
