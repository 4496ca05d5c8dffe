//! `surge torture`: run an export under a real NBD client, SIGKILL the server at
//! seeded moments, restart it and check the durability contract.
//!
//! One cycle: start `surge serve` (this same binary) on a unix socket in the data
//! directory → connect → read back the whole test region and check every block
//! against the [`model::Model`] → flush → run a pipelined workload of writes (some
//! FUA, some multi-block, some write-zeroes) with FLUSH at intervals → SIGKILL the
//! server right after the seeded K-th request (with requests still in flight).
//! After the last cycle the server is restarted once more, checked, and stopped
//! with SIGTERM.
//!
//! The workload and the kill points come from the seed, so a run can be replayed;
//! where inside the server the kill lands still depends on thread timing.

pub mod model;

use anyhow::{bail, Context as _};
use model::{block_data, decode, Found, Loss, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use surge_nbd::client::{Client, ClientOptions};
use surge_nbd::proto::{CMD_FLAG_FUA, CMD_FLUSH, CMD_WRITE, CMD_WRITE_ZEROES};

/// Name of the export under test inside the served process.
pub const EXPORT: &str = "t";

#[derive(Debug, Clone)]
pub struct Config {
    /// KIND:ARGS, as after `NAME=` in `surge serve --export`.
    pub spec: String,
    /// `NAME=KIND:ARGS` pools passed to serve.
    pub pools: Vec<String>,
    /// Extra arguments for `surge serve`.
    pub serve_args: Vec<String>,
    pub cycles: u64,
    pub seed: u64,
    pub time_limit: Option<Duration>,
    pub data_dir: PathBuf,
    pub block_size: u32,
    /// Bytes of the export exercised, from offset 0 (capped at the export size).
    pub region: u64,
    /// Requests per cycle before the kill: the kill comes after a seeded number
    /// in 1..=max_ops.
    pub max_ops: u64,
    /// Average writes between flushes.
    pub flush_every: u64,
    /// Requests in flight.
    pub queue_depth: usize,
    /// Largest write, in blocks.
    pub max_write_blocks: u64,
    pub surge_exe: PathBuf,
    /// After a failed FLUSH, settle it through this control target (the
    /// export's `NAME/elastic`): wait while blocks of a failed cache are being
    /// rescued (at most 10 s once per server run: a device that stays away
    /// only comes back after a restart), acknowledge a reported loss
    /// (`ack_lost=true`; writes since the last completed FLUSH become
    /// unspecified in the model), and FLUSH again.
    pub ack_losses: Option<String>,
}

/// What a run saw; `losses` is the verdict.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub spec: String,
    pub seed: u64,
    pub cycles: u64,
    pub kills: u64,
    pub writes_sent: u64,
    pub writes_acked: u64,
    pub fua_writes_acked: u64,
    pub zeroes_acked: u64,
    pub flushes_acked: u64,
    /// Requests the server answered with an error (not counted as losses).
    pub request_errors: u64,
    /// Losses the server reported and the run acknowledged (`--ack-losses`).
    pub losses_acknowledged: u64,
    /// FLUSHes that still failed after waiting for a rescue (`--ack-losses`).
    pub flushes_unsettled: u64,
    /// Blocks that could not be read back after a restart (counted as losses too).
    pub unreadable_blocks: u64,
    /// The final graceful stop reported a failed FLUSH (`--ack-losses` only).
    pub shutdown_flush_failed: bool,
    pub blocks_verified: u64,
    pub bytes_verified: u64,
    pub losses: u64,
    /// The first losses, for diagnosis.
    pub loss_examples: Vec<CycleLoss>,
    pub elapsed_secs: f64,
    pub stopped_by_time_limit: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CycleLoss {
    pub after_cycle: u64,
    #[serde(flatten)]
    pub loss: Loss,
}

/// A running `surge serve`.
struct Server {
    child: Child,
    sock: PathBuf,
}

impl Server {
    fn start(cfg: &Config, log: &Path) -> anyhow::Result<Server> {
        let sock = cfg.data_dir.join("nbd.sock");
        // The previous server was SIGKILLed: its socket file is stale.
        let _ = std::fs::remove_file(&sock);
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = Command::new(&cfg.surge_exe);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&cfg.data_dir)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(cfg.data_dir.join("control.sock"))
            .arg("--export")
            .arg(format!("{EXPORT}={}", cfg.spec));
        for p in &cfg.pools {
            cmd.arg("--pool").arg(p);
        }
        cmd.args(&cfg.serve_args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log_file);
        let child = cmd.spawn().with_context(|| format!("starting {} serve", cfg.surge_exe.display()))?;
        Ok(Server { child, sock })
    }

    /// Connect, waiting for the server to come up (or to die trying).
    fn connect(&mut self, log: &Path) -> anyhow::Result<Client> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let opts = ClientOptions { export: EXPORT.to_string(), ..ClientOptions::default() };
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("surge serve exited with {status} before accepting clients; its log ({}):\n{}", log.display(), tail(log));
            }
            match Client::connect_unix(&self.sock, &opts) {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    bail!("surge serve did not accept a client within 60 s ({e}); its log:\n{}", tail(log))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("SIGKILL of surge serve")?; // std sends SIGKILL
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM and wait: the graceful stop. With `flush_may_fail` (an export
    /// with injected faults), an exit status that only reports a failed
    /// shutdown FLUSH is accepted; returns whether that happened.
    fn stop(mut self, log: &Path, flush_may_fail: bool) -> anyhow::Result<bool> {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait()? {
                if s.success() {
                    return Ok(false);
                }
                if flush_may_fail && tail(log).contains("at shutdown failed") {
                    return Ok(true);
                }
                bail!("surge serve exited with {s} on SIGTERM; its log:\n{}", tail(log));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill()?;
        bail!("surge serve did not stop within 30 s of SIGTERM")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

struct InFlight {
    first: u64,
    blocks: u64,
    gen: u64,
    fua: bool,
    kind: u16,
}

struct Runner<'a> {
    cfg: &'a Config,
    rng: StdRng,
    model: Model,
    next_gen: u64,
    report: Report,
    buf: Vec<u8>,
    scratch: Vec<u8>,
    /// A wait for a rescue timed out since the last restart: do not wait again
    /// (the device it needs is gone until the server restarts).
    rescue_wait_expired: bool,
}

const MAX_LOSS_EXAMPLES: usize = 20;

impl Runner<'_> {
    fn bs(&self) -> u64 {
        self.cfg.block_size as u64
    }

    /// Write zeroes over the region and flush: a known starting state.
    fn format(&mut self, c: &mut Client) -> anyhow::Result<()> {
        let chunk = 1u64 << 20;
        let zeroes = vec![0u8; chunk as usize];
        let size = self.model.blocks() * self.bs();
        let mut off = 0;
        while off < size {
            let n = chunk.min(size - off);
            // A device with injected faults may refuse a write: retry it.
            let mut tries = 0;
            while let Err(e) = c.write(off, &zeroes[..n as usize], false) {
                tries += 1;
                if tries >= 20 {
                    return Err(anyhow::Error::from(e).context("formatting the test region"));
                }
            }
            off += n;
        }
        self.flush_or_settle(c, "flush after formatting")?;
        Ok(())
    }

    /// Read the whole region back and check every block; settle the model on
    /// what was read, and rewrite blocks that are damaged so later cycles test
    /// something meaningful.
    fn verify(&mut self, c: &mut Client, cycle: u64) -> anyhow::Result<()> {
        let bs = self.bs();
        let per_read = ((1u64 << 20) / bs).max(1);
        let blocks = self.model.blocks();
        let mut damaged = Vec::new();
        let mut b = 0;
        while b < blocks {
            let n = per_read.min(blocks - b);
            self.buf.resize((n * bs) as usize, 0);
            let readable = self.read_back(c, b, n)?;
            for i in 0..n {
                let data = &self.buf[(i * bs) as usize..((i + 1) * bs) as usize];
                let found = match &readable[i as usize] {
                    None => decode(self.cfg.seed, b + i, data, &mut self.scratch),
                    Some(e) => {
                        self.report.unreadable_blocks += 1;
                        Found::Corrupt(format!("unreadable: {e}"))
                    }
                };
                if let Err(loss) = self.model.check(b + i, &found) {
                    self.report.losses += 1;
                    if self.report.loss_examples.len() < MAX_LOSS_EXAMPLES {
                        self.report.loss_examples.push(CycleLoss { after_cycle: cycle, loss });
                    }
                }
                match found {
                    Found::Gen(g) => self.model.settle(b + i, g),
                    Found::Corrupt(_) => damaged.push(b + i),
                }
            }
            self.report.blocks_verified += n;
            self.report.bytes_verified += n * bs;
            b += n;
        }
        self.model.clear_dirty();
        for blk in damaged {
            let zero = vec![0u8; bs as usize];
            c.write(blk * bs, &zero, false).context("rewriting a damaged block")?;
            self.model.settle(blk, 0);
        }
        // What was read may sit in a volatile cache of the restarted server.
        self.flush_or_settle(c, "flush after verification")?;
        Ok(())
    }

    /// Read blocks `first..first+n` into `self.buf`; per block, `Some(error)`
    /// if it stayed unreadable (retried for a while: a restarted elastic
    /// volume may still be rescuing blocks of a failed cache).
    fn read_back(&mut self, c: &mut Client, first: u64, n: u64) -> anyhow::Result<Vec<Option<String>>> {
        let bs = self.bs();
        if c.read(first * bs, &mut self.buf).is_ok() {
            return Ok(vec![None; n as usize]);
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let range = (i * bs) as usize..((i + 1) * bs) as usize;
            let deadline = Instant::now() + Duration::from_secs(if self.cfg.ack_losses.is_some() { 20 } else { 0 });
            loop {
                match c.read((first + i) * bs, &mut self.buf[range.clone()]) {
                    Ok(()) => break out.push(None),
                    Err(e) if Instant::now() >= deadline => break out.push(Some(e.to_string())),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        Ok(out)
    }

    /// FLUSH; with `ack_losses`, settle a failure (see [`Config::ack_losses`]).
    fn flush_or_settle(&mut self, c: &mut Client, what: &str) -> anyhow::Result<()> {
        match c.flush() {
            Ok(()) => Ok(()),
            Err(e) if self.cfg.ack_losses.is_none() => Err(anyhow::Error::from(e).context(what.to_string())),
            Err(_) => {
                if !self.settle_failed_flush(c)? {
                    self.report.flushes_unsettled += 1;
                }
                Ok(())
            }
        }
    }

    /// After a failed FLUSH (nothing in flight): wait while the server rescues
    /// blocks of a failed cache, acknowledge a reported loss, FLUSH again.
    /// True once a FLUSH succeeded (the model is told), false on timeout.
    fn settle_failed_flush(&mut self, c: &mut Client) -> anyhow::Result<bool> {
        let Some(target) = self.cfg.ack_losses.clone() else { return Ok(false) };
        let socket = self.cfg.data_dir.join("control.sock");
        let deadline = Instant::now() + Duration::from_secs(if self.rescue_wait_expired { 0 } else { 10 });
        loop {
            let resp = crate::control::call(&socket, &crate::control::Request::Status)?;
            let status = resp.targets.unwrap_or_default().into_iter().find(|t| t.name == target).map(|t| t.status);
            let Some(status) = status else { bail!("control target {target} not found (--ack-losses needs an elastic export)") };
            let stats = &status["stats"];
            let rescuing = stats["rescue_pending_blocks"].as_u64() != Some(0);
            if !rescuing && !stats["loss"].is_null() {
                let set = crate::control::Request::Set { target: target.clone(), key: "ack_lost".into(), value: "true".into() };
                let r = crate::control::call(&socket, &set)?;
                anyhow::ensure!(r.ok, "acknowledging the loss failed: {:?}", r.error);
                self.report.losses_acknowledged += 1;
                self.model.forget_unflushed();
            }
            if c.flush().is_ok() {
                self.report.flushes_acked += 1;
                self.model.flushed();
                return Ok(true);
            }
            // Only a rescue in progress is worth waiting for; a device that
            // keeps failing fails the next FLUSH too.
            if !rescuing {
                return Ok(false);
            }
            if Instant::now() > deadline {
                self.rescue_wait_expired = true;
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Collect one reply and account for it.
    fn complete(&mut self, c: &mut Client, inflight: &mut HashMap<u64, InFlight>) -> surge_nbd::client::Result<()> {
        let reply = c.wait_any()?;
        let Some(req) = inflight.remove(&reply.cookie) else { return Ok(()) };
        if reply.error.is_some() {
            self.report.request_errors += 1;
            for blk in req.first..req.first + req.blocks {
                self.model.failed(blk, req.gen);
            }
            return Ok(());
        }
        for blk in req.first..req.first + req.blocks {
            self.model.acked(blk, req.gen);
        }
        match req.kind {
            CMD_WRITE => {
                self.report.writes_acked += 1;
                if req.fua {
                    self.report.fua_writes_acked += 1;
                    for blk in req.first..req.first + req.blocks {
                        self.model.durable(blk, req.gen);
                    }
                }
            }
            CMD_WRITE_ZEROES => self.report.zeroes_acked += 1,
            _ => {}
        }
        Ok(())
    }

    /// Run requests until the seeded kill point; then SIGKILL the server.
    /// Returns whether the time limit stopped the run early.
    fn workload(&mut self, c: &mut Client, server: &mut Server, deadline: Option<Instant>) -> anyhow::Result<()> {
        let bs = self.bs();
        let blocks = self.model.blocks();
        let kill_at = self.rng.gen_range(1..=self.cfg.max_ops.max(1));
        let mut inflight: HashMap<u64, InFlight> = HashMap::new();
        let mut data = Vec::new();
        let mut op = 0u64;
        let result: surge_nbd::client::Result<()> = (|| {
            loop {
                op += 1;
                let flush = self.rng.gen_range(0..self.cfg.flush_every.max(1)) == 0;
                if flush {
                    // Every write sent before the flush must have completed, so
                    // the flush covers all of them.
                    while !inflight.is_empty() {
                        self.complete(c, &mut inflight)?;
                    }
                    let cookie = c.submit(CMD_FLUSH, 0, 0, 0, &[])?;
                    if op == kill_at {
                        return Ok(());
                    }
                    let reply = c.wait(cookie)?;
                    if reply.error.is_none() {
                        self.report.flushes_acked += 1;
                        self.model.flushed();
                    } else {
                        self.report.request_errors += 1;
                        if self.cfg.ack_losses.is_some() && !self.settle_failed_flush(c).map_err(|e| std::io::Error::other(format!("settling a failed FLUSH: {e:#}")))? {
                            self.report.flushes_unsettled += 1;
                        }
                    }
                } else {
                    let n = self.rng.gen_range(1..=self.cfg.max_write_blocks.min(blocks).max(1));
                    let first = self.rng.gen_range(0..=blocks - n);
                    // Requests in flight are unordered: never overlap them.
                    if inflight.values().any(|r| first < r.first + r.blocks && r.first < first + n) {
                        while !inflight.is_empty() {
                            self.complete(c, &mut inflight)?;
                        }
                    }
                    let zeroes = self.rng.gen_ratio(1, 32);
                    let fua = !zeroes && self.rng.gen_ratio(1, 16);
                    let gen = if zeroes {
                        0
                    } else {
                        self.next_gen += 1;
                        self.next_gen
                    };
                    for blk in first..first + n {
                        self.model.sent(blk, gen);
                    }
                    let cookie = if zeroes {
                        c.submit(CMD_WRITE_ZEROES, 0, first * bs, (n * bs) as u32, &[])?
                    } else {
                        data.resize((n * bs) as usize, 0);
                        for i in 0..n {
                            block_data(self.cfg.seed, first + i, gen, &mut data[(i * bs) as usize..((i + 1) * bs) as usize]);
                        }
                        c.submit(CMD_WRITE, if fua { CMD_FLAG_FUA } else { 0 }, first * bs, (n * bs) as u32, &data)?
                    };
                    self.report.writes_sent += 1;
                    let kind = if zeroes { CMD_WRITE_ZEROES } else { CMD_WRITE };
                    inflight.insert(cookie, InFlight { first, blocks: n, gen, fua, kind });
                    if op == kill_at {
                        return Ok(());
                    }
                    while inflight.len() >= self.cfg.queue_depth.max(1) {
                        self.complete(c, &mut inflight)?;
                    }
                }
                if deadline.is_some_and(|d| Instant::now() > d) {
                    return Ok(());
                }
            }
        })();
        // Let the server get some way into the last requests before the kill.
        std::thread::sleep(Duration::from_micros(self.rng.gen_range(0..300)));
        server.kill()?;
        self.report.kills += 1;
        result.context("the connection failed before the kill (server crashed on its own?)")
    }
}

/// Run the torture test. Errors are setup or server failures; losses are in the
/// report.
pub fn run(cfg: &Config, mut progress: impl FnMut(&Report)) -> anyhow::Result<Report> {
    let start = Instant::now();
    let deadline = cfg.time_limit.map(|t| start + t);
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("creating {}", cfg.data_dir.display()))?;
    let log = cfg.data_dir.join("serve.log");
    anyhow::ensure!(cfg.block_size >= 64 && cfg.block_size.is_power_of_two(), "--block-size must be a power of two of at least 64 bytes");

    let mut server = Server::start(cfg, &log)?;
    let mut client = server.connect(&log)?;
    let size = client.size();
    let region = cfg.region.min(size) / cfg.block_size as u64 * cfg.block_size as u64;
    anyhow::ensure!(region > 0, "the export ({size} bytes) is smaller than one block ({} bytes)", cfg.block_size);
    let mut r = Runner {
        cfg,
        rng: StdRng::seed_from_u64(cfg.seed),
        model: Model::new(region / cfg.block_size as u64),
        next_gen: 0,
        report: Report { spec: cfg.spec.clone(), seed: cfg.seed, ..Report::default() },
        buf: Vec::new(),
        scratch: Vec::new(),
        rescue_wait_expired: false,
    };
    r.format(&mut client)?;

    for cycle in 1..=cfg.cycles {
        if deadline.is_some_and(|d| Instant::now() > d) {
            r.report.stopped_by_time_limit = true;
            break;
        }
        r.rescue_wait_expired = false;
        r.verify(&mut client, cycle - 1)?;
        r.workload(&mut client, &mut server, deadline)?;
        drop(client);
        r.report.cycles = cycle;
        r.report.elapsed_secs = start.elapsed().as_secs_f64();
        progress(&r.report);
        server = Server::start(cfg, &log)?;
        client = server.connect(&log)?;
    }
    r.verify(&mut client, r.report.cycles)?;
    client.disconnect().ok();
    r.report.shutdown_flush_failed = server.stop(&log, cfg.ack_losses.is_some())?;
    r.report.elapsed_secs = start.elapsed().as_secs_f64();
    Ok(r.report)
}
