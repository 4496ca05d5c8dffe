//! A userspace Ethernet switch that plays the network between machines:
//! every port is one machine's link (a rate and a one-way delay), and a
//! port may also limit each peer's traffic with it (S3 serves each client
//! at its own rate, whatever the others do). This kernel has neither
//! `sch_netem` nor `fq`, so delay cannot come from `tc`; a switch that holds
//! each frame until it is due gives rate, delay and queue drops in one place.
//!
//! Frames are read from and written to the root-namespace ends of veth pairs
//! with packet sockets carrying a virtio-net header, so TCP's 64 KiB
//! segmentation-offloaded frames pass whole (one syscall per 64 KiB, not per
//! 1,500 bytes) with their checksum left to the receiver's offload, as a
//! hypervisor's switch passes them.

use anyhow::Context as _;
use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `struct virtio_net_hdr` in front of every frame (PACKET_VNET_HDR).
const VNET_HDR: usize = 10;
/// linux/if_packet.h (not all of them are in the libc crate).
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// A frame that would wait longer than this for its links is dropped, as a
/// switch's buffer overflows (TCP backs off instead of queueing without end)...
const QUEUE_LIMIT: Duration = Duration::from_millis(20);
/// ...but a queue holds at least this many bytes: on a slow link 20 ms is
/// less than one 64 KiB offloaded frame, and every loss would take 44
/// segments at once.
const QUEUE_MIN_BYTES: f64 = 512.0 * 1024.0;

/// How long a queue at `rate` bytes/s may hold a frame.
fn queue_limit(rate: Option<f64>) -> Duration {
    match rate {
        Some(r) => QUEUE_LIMIT.max(Duration::from_secs_f64(QUEUE_MIN_BYTES / r)),
        None => QUEUE_LIMIT,
    }
}

/// One machine's link to the switch.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PortSpec {
    /// Line rate each way, Mbit/s (0: not limited).
    pub rate_mbit: u64,
    /// One-way delay of this link; a frame pays its source's and its destination's.
    pub delay_us: u64,
    /// Each connection with this port, each way, at most this (0: not
    /// limited): S3 serves every connection at its own rate.
    pub per_peer_mbit: u64,
}

/// Bytes per second of a rate in Mbit/s (None: not limited).
fn bytes_per_s(mbit: u64) -> Option<f64> {
    (mbit > 0).then(|| mbit as f64 * 1e6 / 8.0)
}

/// When the link that serves `len` bytes at `rate` from `start` is free again.
fn serve(free: &mut Instant, start: Instant, len: usize, rate: Option<f64>) -> Instant {
    let Some(rate) = rate else { return start };
    let begin = (*free).max(start);
    *free = begin + Duration::from_secs_f64(len as f64 / rate);
    *free
}

struct Port {
    fd: OwnedFd,
    spec: PortSpec,
    out: Mutex<BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>>>,
    due: Condvar,
}

/// Where the links are busy until, and which port each MAC is behind.
struct Links {
    mac: HashMap<[u8; 6], usize>,
    up_free: Vec<Instant>,
    down_free: Vec<Instant>,
    /// Connections (from, to, flow) limited by a per-connection rate.
    path_free: HashMap<(usize, usize, u32), Instant>,
}

struct Shared {
    ports: Vec<Port>,
    specs: Vec<PortSpec>,
    links: Mutex<Links>,
    stop: AtomicBool,
    seq: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    send_errors: AtomicU64,
}

pub struct Switch {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Frames forwarded, dropped (a queue full) and refused by the kernel so far.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Counters {
    pub forwarded: u64,
    pub dropped: u64,
    pub send_errors: u64,
}

/// A TCP or UDP frame's connection (its two ports; 0 for anything else),
/// from the Ethernet frame `eth`.
fn flow(eth: &[u8]) -> u32 {
    if eth.len() < 14 + 20 || eth[12..14] != [0x08, 0x00] {
        return 0;
    }
    let ip = &eth[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if !matches!(ip[9], 6 | 17) || ip.len() < ihl + 4 {
        return 0;
    }
    u32::from_be_bytes(ip[ihl..ihl + 4].try_into().expect("4"))
}

fn packet_socket(ifname: &str) -> anyhow::Result<OwnedFd> {
    let name = std::ffi::CString::new(ifname)?;
    // SAFETY: plain syscalls on a descriptor this function owns; the
    // structures passed are fully initialised and outlive the calls.
    unsafe {
        let index = libc::if_nametoindex(name.as_ptr());
        anyhow::ensure!(index != 0, "no interface {ifname}");
        let proto = (libc::ETH_P_ALL as u16).to_be();
        let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as libc::c_int);
        anyhow::ensure!(raw >= 0, "packet socket: {} (needs root)", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(raw);
        let set = |level, opt, v: libc::c_int| {
            let r = libc::setsockopt(fd.as_raw_fd(), level, opt, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32);
            if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        };
        set(libc::SOL_PACKET, PACKET_VNET_HDR, 1).context("PACKET_VNET_HDR")?;
        set(libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1).context("PACKET_IGNORE_OUTGOING (Linux >= 4.20)")?;
        set(libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20).context("SO_RCVBUF")?;
        set(libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20).context("SO_SNDBUF")?;
        // Wake every 100 ms to see whether the switch is stopping.
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv as *const _ as *const libc::c_void, std::mem::size_of::<libc::timeval>() as u32);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        let r = libc::bind(fd.as_raw_fd(), &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32);
        anyhow::ensure!(r == 0, "binding a packet socket to {ifname}: {}", std::io::Error::last_os_error());
        Ok(fd)
    }
}

impl Switch {
    /// Switch between the interfaces `ports` (each with its link).
    pub fn start(ports: &[(String, PortSpec)]) -> anyhow::Result<Switch> {
        let now = Instant::now();
        let mut ps = Vec::new();
        for (ifname, spec) in ports {
            ps.push(Port { fd: packet_socket(ifname)?, spec: *spec, out: Mutex::new(BinaryHeap::new()), due: Condvar::new() });
        }
        let n = ps.len();
        let links = Links { mac: HashMap::new(), up_free: vec![now; n], down_free: vec![now; n], path_free: HashMap::new() };
        let specs = ps.iter().map(|p| p.spec).collect();
        let shared = Arc::new(Shared {
            ports: ps,
            specs,
            links: Mutex::new(links),
            stop: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for i in 0..n {
            let s = shared.clone();
            threads.push(std::thread::Builder::new().name(format!("switch-rx{i}")).spawn(move || receive(&s, i))?);
            let s = shared.clone();
            threads.push(std::thread::Builder::new().name(format!("switch-tx{i}")).spawn(move || transmit(&s, i))?);
        }
        Ok(Switch { shared, threads })
    }

    pub fn counters(&self) -> Counters {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters { forwarded: c(&self.shared.forwarded), dropped: c(&self.shared.dropped), send_errors: c(&self.shared.send_errors) }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for p in &self.shared.ports {
            p.due.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// When a frame of `len` bytes of connection `flow` from `from`, read at
/// `now`, is due at each of `to` (left out: dropped, its queue is full).
/// Serves the source's uplink once, then each connection and destination
/// downlink.
fn schedule(specs: &[PortSpec], links: &mut Links, from: usize, to: &[usize], flow: u32, len: usize, now: Instant) -> Vec<(usize, Instant)> {
    let src = specs[from];
    let mut up = links.up_free[from];
    let t1 = serve(&mut up, now, len, bytes_per_s(src.rate_mbit));
    if t1 > now + queue_limit(bytes_per_s(src.rate_mbit)) {
        return Vec::new();
    }
    links.up_free[from] = up;
    let mut due = Vec::new();
    for &dst in to {
        let d = specs[dst];
        let per_peer = [src.per_peer_mbit, d.per_peer_mbit].into_iter().filter(|&r| r > 0).min().unwrap_or(0);
        let mut path = *links.path_free.get(&(from, dst, flow)).unwrap_or(&now);
        let t2 = serve(&mut path, t1, len, bytes_per_s(per_peer));
        let mut down = links.down_free[dst];
        let t3 = serve(&mut down, t2, len, bytes_per_s(d.rate_mbit));
        let slowest = [per_peer, d.rate_mbit].into_iter().filter(|&r| r > 0).min().unwrap_or(0);
        if t3 > t1 + queue_limit(bytes_per_s(slowest)) {
            continue;
        }
        if per_peer > 0 {
            if links.path_free.len() > 4096 {
                // Connections long idle hold no backlog: forget them.
                links.path_free.retain(|_, free| *free > now);
            }
            links.path_free.insert((from, dst, flow), path);
        }
        links.down_free[dst] = down;
        due.push((dst, t3 + Duration::from_micros(src.delay_us + d.delay_us)));
    }
    due
}

fn receive(shared: &Shared, from: usize) {
    let port = &shared.ports[from];
    let mut buf = vec![0u8; VNET_HDR + 65536 + 64];
    while !shared.stop.load(Ordering::Relaxed) {
        // SAFETY: recv into a buffer of the length given.
        let n = unsafe { libc::recv(port.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < (VNET_HDR + 14) as isize {
            continue; // timeout (checks stop), error, or a runt
        }
        let frame = &buf[..n as usize];
        let eth = &frame[VNET_HDR..];
        let (dst_mac, src_mac): ([u8; 6], [u8; 6]) = (eth[0..6].try_into().expect("6"), eth[6..12].try_into().expect("6"));
        let now = Instant::now();
        let due = {
            let mut links = shared.links.lock();
            links.mac.insert(src_mac, from);
            let to: Vec<usize> = match links.mac.get(&dst_mac) {
                Some(&p) if dst_mac[0] & 1 == 0 => vec![p],
                _ => (0..shared.ports.len()).collect(),
            };
            let to: Vec<usize> = to.into_iter().filter(|&p| p != from).collect();
            schedule(&shared.specs, &mut links, from, &to, flow(eth), eth.len(), now)
        };
        if due.is_empty() {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        for (dst, at) in due {
            let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
            let out = &shared.ports[dst];
            out.out.lock().push(Reverse((at, seq, frame.to_vec())));
            out.due.notify_one();
        }
    }
}

fn transmit(shared: &Shared, to: usize) {
    let port = &shared.ports[to];
    // Wake as close to a frame's time as the timer allows (default slack: 50 µs).
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut q = port.out.lock();
    while !shared.stop.load(Ordering::Relaxed) {
        let next = q.peek().map(|Reverse((at, _, _))| *at);
        match next {
            None => {
                port.due.wait_for(&mut q, Duration::from_millis(100));
            }
            Some(at) if at > Instant::now() => {
                port.due.wait_until(&mut q, at);
            }
            Some(_) => {
                let Reverse((_, _, frame)) = q.pop().expect("peeked");
                drop(q);
                // SAFETY: send from a buffer of the length given.
                let r = unsafe { libc::send(port.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
                if r < 0 {
                    shared.send_errors.fetch_add(1, Ordering::Relaxed);
                } else {
                    shared.forwarded.fetch_add(1, Ordering::Relaxed);
                }
                q = port.out.lock();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate_mbit: u64, delay_us: u64, per_peer_mbit: u64) -> PortSpec {
        PortSpec { rate_mbit, delay_us, per_peer_mbit }
    }

    #[test]
    fn a_link_serves_bytes_at_its_rate_after_the_last_frame() {
        let t0 = Instant::now();
        let mut free = t0;
        // 8 Mbit/s = 1 MB/s: 1,000 bytes take 1 ms, and queue behind each other.
        let a = serve(&mut free, t0, 1000, bytes_per_s(8));
        let b = serve(&mut free, t0, 1000, bytes_per_s(8));
        assert_eq!((a - t0, b - t0), (Duration::from_millis(1), Duration::from_millis(2)));
        // Not limited: due at once, the link's clock untouched.
        assert_eq!(serve(&mut free, t0, 1000, None), t0);
        assert_eq!(free - t0, Duration::from_millis(2));
    }

    fn links(n: usize, now: Instant) -> Links {
        Links { mac: HashMap::new(), up_free: vec![now; n], down_free: vec![now; n], path_free: HashMap::new() }
    }

    #[test]
    fn a_slow_queue_holds_half_a_mebibyte_and_a_fast_one_20_ms() {
        // 8 Mbit/s: 512 KiB take 524 ms; 2,500 Mbit/s: 20 ms hold 6.25 MB.
        assert_eq!(queue_limit(bytes_per_s(8)), Duration::from_secs_f64(512.0 * 1024.0 / 1e6));
        assert_eq!(queue_limit(bytes_per_s(2500)), QUEUE_LIMIT);
        assert_eq!(queue_limit(None), QUEUE_LIMIT);
    }

    #[test]
    fn a_frame_pays_both_links_and_both_delays() {
        let t0 = Instant::now();
        // 80 Mbit/s = 10 MB/s: 10,000 bytes take 1 ms on each link.
        let specs = [spec(80, 100, 0), spec(80, 2000, 0)];
        let mut l = links(2, t0);
        let due = schedule(&specs, &mut l, 0, &[1], 0, 10_000, t0);
        assert_eq!(due, vec![(1, t0 + Duration::from_micros(1000 + 1000 + 2100))]);
    }

    #[test]
    fn a_per_connection_rate_holds_each_connection_alone_and_full_queues_drop() {
        let t0 = Instant::now();
        // Port 2 (S3) serves each peer at 8 Mbit/s (1 MB/s) on an unlimited line.
        let specs = [spec(0, 0, 0), spec(0, 0, 0), spec(0, 0, 8)];
        let mut l = links(3, t0);
        let a = schedule(&specs, &mut l, 0, &[2], 7, 1000, t0);
        let b = schedule(&specs, &mut l, 1, &[2], 7, 1000, t0);
        let a2 = schedule(&specs, &mut l, 0, &[2], 8, 1000, t0);
        // Two peers, and a second connection of the first: each at its own 1 ms.
        assert_eq!([a[0].1 - t0, b[0].1 - t0, a2[0].1 - t0], [Duration::from_millis(1); 3]);
        // The same connection again queues behind its first frame...
        let c = schedule(&specs, &mut l, 0, &[2], 7, 1000, t0);
        assert_eq!(c[0].1 - t0, Duration::from_millis(2));
        // ...until the queue would hold a frame longer than its limit
        // (512 KiB at 1 MB/s: 524 ms): dropped.
        let mut dropped = 0;
        for _ in 0..600 {
            dropped += usize::from(schedule(&specs, &mut l, 0, &[2], 7, 1000, t0).is_empty());
        }
        assert!(dropped > 0 && dropped < 600, "{dropped}");
        assert!(l.path_free[&(0, 2, 7)] <= t0 + queue_limit(bytes_per_s(8)));
    }
}
