//! Running a [`LoadConfig`]: one thread and one NBD connection per job, up
//! to `iodepth` requests in flight on it, bursts started together by the
//! main thread, which also keeps the think times.

use super::pattern::{fill, JobPattern, Op, Ops};
use super::report::{JobStats, Outcome};
use super::{Amount, LoadConfig};
use anyhow::{bail, Context as _};
use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use surge_nbd::client::{Client, Handshake};
use surge_nbd::proto::{CMD_FLUSH, CMD_READ, CMD_WRITE};
use surge_nbd::remote::uri::Endpoint;
use surge_nbd::{NbdUri, Socket};

/// Open one connection to `uri` (STARTTLS for nbds://), from `bind` if given.
pub fn connect(uri: &NbdUri, bind: Option<std::net::IpAddr>) -> anyhow::Result<Client> {
    let socket = match &uri.endpoint {
        Endpoint::Unix(p) => Socket::Unix(UnixStream::connect(p).with_context(|| format!("connecting to {}", p.display()))?),
        Endpoint::Tcp { host, port } => {
            let addr: SocketAddr = (host.as_str(), *port).to_socket_addrs()?.next().with_context(|| format!("{host} resolves to no address"))?;
            let s = match bind {
                None => TcpStream::connect(addr)?,
                Some(ip) => {
                    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
                    s.bind(&SocketAddr::new(ip, 0).into()).with_context(|| format!("binding to {ip}"))?;
                    s.connect(&addr.into())?;
                    s.into()
                }
            };
            s.set_nodelay(true)?;
            Socket::Tcp(s)
        }
    };
    let mut h = Handshake::from_socket(socket)?;
    if uri.tls {
        let dir = uri.tls_certificates.as_ref().context("nbds:// needs ?tls-certificates=DIR (a directory with ca-cert.pem)")?;
        let cfg = surge_nbd::tls::client_config_from_dir(dir)?;
        h = h.starttls(cfg, &uri.tls_server_name())?;
    }
    h.structured_replies()?;
    Ok(h.go(&uri.export).with_context(|| format!("opening export {:?}", uri.export))?)
}

/// What the main thread asks of a job.
enum Cmd {
    Burst { amount: Amount, deadline: Option<Instant> },
    Stop,
}

struct Done {
    ios: u64,
    bytes: u64,
}

struct Inflight {
    cookie: u64,
    op: Op,
    sent: Instant,
    buf: Vec<u8>,
}

/// One job: its connection, its I/O sequence, its figures.
struct Job {
    client: Client,
    ops: Ops,
    pattern: JobPattern,
    cfg: LoadConfig,
    stats: JobStats,
    /// Buffers of finished writes, reused.
    spare: Vec<Vec<u8>>,
}

impl Job {
    fn complete_one(&mut self, inflight: &mut VecDeque<Inflight>) -> anyhow::Result<()> {
        let r = self.client.wait_any()?;
        let i = inflight.iter().position(|x| x.cookie == r.cookie).context("a reply to a request not in flight")?;
        let x = inflight.remove(i).expect("present");
        if let Some((errno, msg)) = &r.error {
            bail!("{} of {} bytes at {} failed: errno {errno} {msg}", if self.pattern.rw.writes() { "write" } else { "read" }, x.op.len, x.op.offset);
        }
        self.stats.record(x.op.len, x.sent.elapsed());
        self.spare.push(x.buf);
        Ok(())
    }

    fn burst(&mut self, amount: Amount, deadline: Option<Instant>) -> anyhow::Result<Done> {
        let amount = match (amount, deadline) {
            (Amount::Open, None) => Amount::Bytes(self.pattern.len),
            (a, _) => a,
        };
        let qd = self.cfg.iodepth as usize;
        let writes = self.pattern.rw.writes();
        let start = Instant::now();
        let (mut ios, mut bytes) = (0u64, 0u64);
        let mut inflight: VecDeque<Inflight> = VecDeque::new();
        let more = |ios: u64, bytes: u64| match amount {
            Amount::Bytes(n) => bytes < n,
            Amount::Ios(n) => ios < n,
            Amount::Open => true,
        } && deadline.is_none_or(|d| Instant::now() < d);
        while more(ios, bytes) {
            // Rate limits: the next request may go at start + what was sent / rate.
            let due = [self.cfg.rate.map(|r| bytes as f64 / r as f64), self.cfg.rate_iops.map(|r| ios as f64 / r as f64)].into_iter().flatten().fold(0.0, f64::max);
            let due = start + Duration::from_secs_f64(due);
            if Instant::now() < due {
                if inflight.is_empty() {
                    std::thread::sleep(due - Instant::now());
                } else {
                    self.complete_one(&mut inflight)?;
                }
                continue;
            }
            if inflight.len() >= qd {
                self.complete_one(&mut inflight)?;
                continue;
            }
            let op = self.ops.next().expect("ops never end");
            // Overlapping requests in flight together would leave the bytes to chance.
            while inflight.iter().any(|x| x.op.offset < op.offset + op.len && op.offset < x.op.offset + x.op.len) {
                self.complete_one(&mut inflight)?;
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            let sent = Instant::now();
            let cookie = if writes {
                buf.resize(op.len as usize, 0);
                fill(op.tag, op.offset, &mut buf);
                self.client.submit(CMD_WRITE, 0, op.offset, op.len as u32, &buf)?
            } else {
                self.client.submit(CMD_READ, 0, op.offset, op.len as u32, &[])?
            };
            inflight.push_back(Inflight { cookie, op, sent, buf });
            ios += 1;
            bytes += op.len;
        }
        while !inflight.is_empty() {
            self.complete_one(&mut inflight)?;
        }
        if self.cfg.flush_each_burst && ios > 0 {
            let c = self.client.submit(CMD_FLUSH, 0, 0, 0, &[])?;
            self.client.wait(c)?.into_result().context("flush at the end of a burst")?;
        }
        self.stats.ios_issued += ios;
        Ok(Done { ios, bytes })
    }

    fn serve(mut self, rx: Receiver<Cmd>, tx: Sender<anyhow::Result<Done>>) -> anyhow::Result<(JobStats, Client)> {
        while let Ok(cmd) = rx.recv() {
            match cmd {
                Cmd::Burst { amount, deadline } => {
                    let r = self.burst(amount, deadline);
                    let failed = r.is_err();
                    let _ = tx.send(r);
                    if failed {
                        bail!("job stopped after an error");
                    }
                }
                Cmd::Stop => break,
            }
        }
        Ok((self.stats, self.client))
    }
}

/// Read back every written byte through `client` and compare.
fn verify(cfg: &LoadConfig, jobs: &[(JobPattern, u64)], client: &mut Client) -> anyhow::Result<u64> {
    let expected = super::Expected::of(jobs).map_err(anyhow::Error::msg)?;
    expected.check(|off, buf| {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(256 << 10);
            client.read(off + done as u64, &mut buf[done..done + n]).with_context(|| format!("reading back at {}", off + done as u64))?;
            done += n;
        }
        Ok(())
    })
    .with_context(|| format!("--verify ({} job(s), seed {})", jobs.len(), cfg.seed))
}

/// Connect, run every burst, collect the figures (and check the bytes with --verify).
pub fn run(cfg: &LoadConfig) -> anyhow::Result<Outcome> {
    let uri: NbdUri = cfg.uri.parse().map_err(|e| anyhow::anyhow!("--uri: {e}"))?;
    let mut clients = (0..cfg.numjobs).map(|_| connect(&uri, cfg.bind)).collect::<anyhow::Result<Vec<_>>>()?;
    let dev_size = clients[0].size();
    let patterns = cfg.jobs(dev_size)?;
    if cfg.rw.writes() && clients[0].info().read_only() {
        bail!("export {:?} is read-only", uri.export);
    }
    if cfg.wait_go {
        crate::load::ready_then_wait_for_go()?;
    }
    let started = Instant::now();
    let started_ns = crate::experiment::fairshare::client::monotonic_ns();
    let deadline = cfg.runtime.map(|r| started + r);
    let mut handles = Vec::new();
    let mut txs = Vec::new();
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    for (p, client) in patterns.iter().zip(clients.drain(..)) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let job = Job { client, ops: p.ops(), pattern: p.clone(), cfg: cfg.clone(), stats: JobStats::new(), spare: Vec::new() };
        let done_tx = done_tx.clone();
        handles.push(std::thread::Builder::new().name(format!("load-job-{}", p.job)).spawn(move || job.serve(rx, done_tx))?);
        txs.push(tx);
    }
    let mut bursts = Vec::new();
    let mut think = Vec::new();
    let mut failure = None;
    let sleep_until = |t: Instant| {
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
    };
    let past = |t: Instant| deadline.is_some_and(|d| t >= d);
    sleep_until(deadline.map_or(started + cfg.start_delay, |d| d.min(started + cfg.start_delay)));
    let mut k = 0;
    while let Some(amount) = cfg.amount(k) {
        if past(Instant::now()) {
            break;
        }
        let b0 = Instant::now();
        for tx in &txs {
            let _ = tx.send(Cmd::Burst { amount, deadline });
        }
        let (mut ios, mut bytes) = (0, 0);
        for _ in &txs {
            match done_rx.recv().context("a job ended")? {
                Ok(d) => {
                    ios += d.ios;
                    bytes += d.bytes;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        let b1 = Instant::now();
        bursts.push(super::report::Burst { start_s: (b0 - started).as_secs_f64(), end_s: (b1 - started).as_secs_f64(), ios, bytes });
        if failure.is_some() {
            break;
        }
        k += 1;
        if cfg.amount(k).is_some() {
            let t = cfg.think_after(k - 1);
            think.push(t.as_secs_f64());
            sleep_until(deadline.map_or(b1 + t, |d| d.min(b1 + t)));
        }
    }
    let runtime = started.elapsed();
    for tx in &txs {
        let _ = tx.send(Cmd::Stop);
    }
    let mut stats = Vec::new();
    let mut clients = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok((s, c))) => {
                stats.push(s);
                clients.push(c);
            }
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some(anyhow::anyhow!("a job panicked"))),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let issued: Vec<(JobPattern, u64)> = patterns.iter().cloned().zip(stats.iter().map(|s| s.ios_issued)).collect();
    let verified = if cfg.verify { Some(verify(cfg, &issued, &mut clients[0])?) } else { None };
    for c in clients {
        let _ = c.disconnect();
    }
    Ok(Outcome::new(cfg, started_ns, runtime, stats, bursts, think, verified))
}
