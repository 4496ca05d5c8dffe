//! `surge stripe-bench`: an IOR-like client of a volume striped over several
//! NBD exports, as a parallel file system's client stripes a file over its data
//! servers. Requests are sequential writes over the client's own region of the
//! striped volume; a request of `request` bytes is split into `chunk`-sized
//! pieces on consecutive exports (stripe unit `chunk`, round robin), which are
//! all sent before any reply is awaited, and it completes when its last piece
//! does. `outstanding` streams (own connections each) keep one request in
//! flight each: 1 is IOR's setting.
//!
//! The experiment runs one such process per client; `--bind` makes its TCP
//! connections come from a given address, so proxies can tell applications
//! apart by client address as the paper's did.

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use surge_nbd::client::{ClientOptions, Handshake};
use surge_nbd::proto::CMD_WRITE;
use surge_nbd::Socket;

/// Where one stripe member is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub at: Endpoint,
    pub export: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for Member {
    type Err = String;
    /// `nbd://HOST:PORT/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH");
        if let Some(rest) = s.strip_prefix("nbd+unix:///") {
            let (export, query) = rest.split_once('?').ok_or_else(bad)?;
            let path = query.strip_prefix("socket=").filter(|p| !p.is_empty()).ok_or_else(bad)?;
            return Ok(Member { at: Endpoint::Unix(path.into()), export: export.to_string() });
        }
        let rest = s.strip_prefix("nbd://").ok_or_else(bad)?;
        let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad());
        }
        let host = if host.contains(':') && !host.ends_with(']') { host.to_string() } else { format!("{host}:10809") };
        Ok(Member { at: Endpoint::Tcp(host), export: export.to_string() })
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.at {
            Endpoint::Tcp(h) => write!(f, "nbd://{h}/{}", self.export),
            Endpoint::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub members: Vec<Member>,
    /// Source address of TCP connections.
    pub bind: Option<IpAddr>,
    pub chunk: u64,
    pub request: u64,
    pub outstanding: usize,
    /// Start of this client's region of the striped volume, and its length.
    pub offset: u64,
    pub region: u64,
    pub duration: Duration,
    /// Each stream waits this long after a request completes before it sends
    /// the next (think time; zero: back to back, as IOR).
    pub think: Duration,
    /// Print `ready` once connected and wait for a line on stdin before starting.
    pub wait_go: bool,
}

/// What one client did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchOutcome {
    pub request_bytes: u64,
    /// CLOCK_MONOTONIC nanoseconds (shared by the processes of one machine)
    /// at which the client started, and at which each request completed.
    pub started_ns: u64,
    pub completions_ns: Vec<u64>,
    /// Request latencies, microseconds, in completion order.
    pub latencies_us: Vec<u64>,
}

/// The machine-wide monotonic clock, comparable across processes.
pub fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime only writes the struct we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn connect(m: &Member, bind: Option<IpAddr>) -> anyhow::Result<surge_nbd::client::Client> {
    let socket = match &m.at {
        Endpoint::Unix(p) => Socket::Unix(UnixStream::connect(p).with_context(|| format!("connecting to {m}"))?),
        Endpoint::Tcp(h) => {
            let addr: SocketAddr = h.to_socket_addrs()?.next().with_context(|| format!("{h} resolves to nothing"))?;
            Socket::Tcp(tcp_from(addr, bind).with_context(|| format!("connecting to {m}"))?)
        }
    };
    let opts = ClientOptions { export: m.export.clone(), structured_replies: true, block_status: false };
    let mut h = Handshake::from_socket(socket)?;
    h.structured_replies()?;
    Ok(h.go(&opts.export)?)
}

/// A TCP connection from `bind` (any loopback address works on Linux: 127/8).
fn tcp_from(addr: SocketAddr, bind: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(ip) = bind else { return TcpStream::connect(addr) };
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.bind(&SocketAddr::new(ip, 0).into())?;
    s.connect(&addr.into())?;
    let s: TcpStream = s.into();
    s.set_nodelay(true)?;
    Ok(s)
}

/// Where byte `off` of the striped volume lives: member and offset there.
pub fn locate(off: u64, chunk: u64, members: usize) -> (usize, u64) {
    let unit = off / chunk;
    ((unit % members as u64) as usize, unit / members as u64 * chunk + off % chunk)
}

/// One stream: its own connection to every member, one request at a time.
struct Stream {
    conns: Vec<surge_nbd::client::Client>,
}

impl Stream {
    fn write(&mut self, cfg: &BenchConfig, off: u64, buf: &[u8]) -> anyhow::Result<()> {
        let mut cookies = Vec::new();
        let mut done = 0u64;
        while done < buf.len() as u64 {
            let at = off + done;
            let len = (cfg.chunk - at % cfg.chunk).min(buf.len() as u64 - done);
            let (m, moff) = locate(at, cfg.chunk, cfg.members.len());
            let piece = &buf[done as usize..(done + len) as usize];
            cookies.push((m, self.conns[m].submit(CMD_WRITE, 0, moff, len as u32, piece)?));
            done += len;
        }
        for (m, c) in cookies {
            self.conns[m].wait(c)?.into_result().with_context(|| format!("write on {}", cfg.members[m]))?;
        }
        Ok(())
    }
}

/// Connect every stream, optionally wait for "go", then write until the duration ends.
pub fn run(cfg: &BenchConfig) -> anyhow::Result<BenchOutcome> {
    anyhow::ensure!(!cfg.members.is_empty(), "give at least one --export");
    anyhow::ensure!(cfg.chunk > 0 && cfg.request > 0 && cfg.outstanding > 0, "chunk, request and outstanding must be positive");
    let per_stream = (cfg.region / cfg.outstanding as u64) / cfg.request * cfg.request;
    anyhow::ensure!(per_stream >= cfg.request, "region {} is too small for {} streams of {} requests", cfg.region, cfg.outstanding, cfg.request);
    let mut streams = Vec::new();
    for _ in 0..cfg.outstanding {
        let conns = cfg.members.iter().map(|m| connect(m, cfg.bind)).collect::<anyhow::Result<Vec<_>>>()?;
        streams.push(Stream { conns });
    }
    if cfg.wait_go {
        crate::load::ready_then_wait_for_go()?;
    }
    let started_ns = monotonic_ns();
    let end = Instant::now() + cfg.duration;
    let results: Vec<anyhow::Result<Vec<(u64, u64)>>> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(i, mut st)| {
                let base = cfg.offset + i as u64 * per_stream;
                s.spawn(move || -> anyhow::Result<Vec<(u64, u64)>> {
                    let buf = vec![0x5a; cfg.request as usize];
                    let mut done = Vec::new();
                    let mut pos = 0;
                    while Instant::now() < end {
                        let t0 = monotonic_ns();
                        st.write(cfg, base + pos, &buf)?;
                        let t1 = monotonic_ns();
                        done.push((t1, (t1 - t0) / 1000));
                        pos = (pos + cfg.request) % per_stream;
                        if !cfg.think.is_zero() {
                            std::thread::sleep(cfg.think);
                        }
                    }
                    for c in st.conns {
                        let _ = c.disconnect();
                    }
                    Ok(done)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("stream panicked")))).collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_unstable();
    Ok(BenchOutcome {
        request_bytes: cfg.request,
        started_ns,
        completions_ns: all.iter().map(|x| x.0).collect(),
        latencies_us: all.iter().map(|x| x.1).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_1_mib_request_covers_four_consecutive_members() {
        let k = 256 << 10;
        let members: Vec<usize> = (0..4).map(|i| locate((1 << 20) * 3 + i * k, k, 8).0).collect();
        assert_eq!(members, vec![4, 5, 6, 7]);
        assert_eq!(locate(8 * k + 5, k, 8), (0, k + 5));
    }

    #[test]
    fn member_uris_parse_and_print() {
        let m: Member = "nbd://127.0.0.1:10901/pfs".parse().unwrap();
        assert_eq!(m.at, Endpoint::Tcp("127.0.0.1:10901".into()));
        assert_eq!(m.to_string(), "nbd://127.0.0.1:10901/pfs");
        let u: Member = "nbd+unix:///disk?socket=/tmp/x.sock".parse().unwrap();
        assert_eq!((u.at.clone(), u.export.as_str()), (Endpoint::Unix("/tmp/x.sock".into()), "disk"));
        assert_eq!(u.to_string().parse::<Member>().unwrap(), u);
        let d: Member = "nbd://host/e".parse().unwrap();
        assert_eq!(d.at, Endpoint::Tcp("host:10809".into()));
        assert!("http://x".parse::<Member>().is_err());
        assert!("nbd+unix:///e".parse::<Member>().is_err());
    }

    proptest::proptest! {
        #[test]
        fn member_uris_parse_or_fail_without_panicking(s in "(nbd://|nbd\\+unix:///)?[a-z0-9.:/?=\\[\\]]{0,30}") {
            let _ = s.parse::<Member>();
        }

        #[test]
        fn printed_members_parse_back(host in "[a-z][a-z0-9.]{0,12}", port in 1u16.., export in "[a-z0-9_-]{0,10}", path in "/[a-z0-9/._-]{1,20}") {
            for m in [
                Member { at: Endpoint::Tcp(format!("{host}:{port}")), export: export.clone() },
                Member { at: Endpoint::Unix(path.clone().into()), export: export.clone() },
            ] {
                proptest::prop_assert_eq!(m.to_string().parse::<Member>().unwrap(), m);
            }
        }
    }
}
