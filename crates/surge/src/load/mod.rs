//! `surge load`: a load generator that reaches a volume over NBD, as an
//! application's own process would, so experiments need no third-party tool
//! where the application does not have to be one.
//!
//! A run is a series of *bursts*: every job (one NBD connection each, up to
//! `iodepth` requests in flight) does its part of the burst (bytes or
//! requests), optionally flushes, and once all jobs are done the application
//! "computes" (think time, optionally jittered) before the next burst: a
//! bulk-synchronous application (CM1's checkpoints, a bulk load). Without
//! bursts, each job goes once through its region, or until `--runtime`.
//!
//! The figures are printed as fio prints them (`--output-format json`:
//! `jobs[].write.{io_bytes,bw,iops,runtime,clat_ns.percentile}`), plus a
//! `surge` section with the bursts' times. Writes carry bytes derived from the
//! seed, the request and the position (`pattern.rs`), so a harness can check the
//! volume afterwards from the configuration alone (`--verify` does it too).

pub mod pattern;
pub mod replay;
pub mod report;
mod run;

pub use pattern::{Expected, JobPattern, Rw, Sizes};
pub use run::run;

/// The start handshake of a client process an experiment runs (`--wait-go`):
/// print `ready`, then wait for a line on stdin, so that every client's
/// connections are open before any starts timing.
pub fn ready_then_wait_for_go() -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}

use std::net::IpAddr;
use std::time::Duration;
use surge_block::units::{format_size, parse_duration, parse_rate, parse_size};

/// Largest request (the NBD server's default maximum payload is larger).
pub const MAX_REQUEST: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum OutputFormat {
    Normal,
    Json,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}
fn rate(s: &str) -> Result<u64, String> {
    parse_rate(s)
}
fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

/// Everything a run does (the command line of `surge load`).
#[derive(clap::Args, Debug, Clone)]
#[command(
    about = "Drive a volume over NBD: bursts of sequential or random writes or reads, think time between them, fio-style figures",
    after_long_help = "Examples:\n  \
surge load --uri 'nbd+unix:///disk?socket=/run/surge/nbd.sock' --rw randwrite --bs 4k/70:8k/20:16k/10 --iodepth 32 --runtime 30s\n  \
surge load --uri nbd://127.0.0.1/disk --rw write --bs 256KiB --numjobs 2 --iodepth 2 --size 1GiB \\\n      \
--burst-bytes 128MiB --bursts 4 --think 10s --think-jitter 0.25 --flush-each-burst --output-format json\n\
Every job has its own connection and region: job j covers [offset + j x offset_increment, + size).\n\
Each burst, every job moves its part (--burst-bytes or --burst-ios; a list gives one value per burst,\n\
the last repeated up to --bursts), then flushes if asked; the next burst starts after all jobs are done\n\
and the think time has passed. With --verify, every written byte is read back and checked at the end."
)]
pub struct LoadConfig {
    /// The export: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH (nbds:// for TLS).
    #[arg(long)]
    pub uri: String,
    #[arg(long, value_enum, default_value = "write")]
    pub rw: Rw,
    /// Request size, or sizes with weights as fio's bssplit (4k/70:8k/20:16k/10).
    #[arg(long, default_value = "4KiB")]
    pub bs: Sizes,
    /// Alignment of random offsets [default: the smallest request size].
    #[arg(long, value_parser = size)]
    pub blockalign: Option<u64>,
    /// Requests in flight per job.
    #[arg(long, default_value_t = 1)]
    pub iodepth: u32,
    /// Jobs, each with its own connection and region.
    #[arg(long, default_value_t = 1)]
    pub numjobs: u32,
    /// Start of job 0's region.
    #[arg(long, default_value = "0", value_parser = size)]
    pub offset: u64,
    /// Length of each job's region [default: the export's size after --offset, split between the jobs].
    #[arg(long, value_parser = size)]
    pub size: Option<u64>,
    /// Distance between jobs' regions [default: --size].
    #[arg(long, value_parser = size)]
    pub offset_increment: Option<u64>,
    /// Bytes each job moves per burst (comma-separated: one per burst, the last repeated).
    #[arg(long, value_delimiter = ',', value_parser = size, conflicts_with = "burst_ios")]
    pub burst_bytes: Vec<u64>,
    /// Requests each job issues per burst (comma-separated, as --burst-bytes).
    #[arg(long, value_delimiter = ',')]
    pub burst_ios: Vec<u64>,
    /// Number of bursts [default: as many as values given].
    #[arg(long)]
    pub bursts: Option<u32>,
    /// Compute time between bursts.
    #[arg(long, default_value = "0", value_parser = duration)]
    pub think: Duration,
    /// Each think time is --think x (1 + u x this), u uniform in [-1, 1] (seeded).
    #[arg(long, default_value_t = 0.0)]
    pub think_jitter: f64,
    /// Compute time before the first burst.
    #[arg(long, default_value = "0", value_parser = duration)]
    pub start_delay: Duration,
    /// Flush (NBD_CMD_FLUSH, an fsync) at the end of each job's part of a burst.
    #[arg(long)]
    pub flush_each_burst: bool,
    /// Bytes per second per job, at most (e.g. 10MiB/s).
    #[arg(long, value_parser = rate)]
    pub rate: Option<u64>,
    /// Requests per second per job, at most.
    #[arg(long)]
    pub rate_iops: Option<u64>,
    /// Stop after this long (time-based: the bursts repeat until then).
    #[arg(long, value_parser = duration)]
    pub runtime: Option<Duration>,
    /// Seed of offsets, sizes, jitter and written bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Read back every byte written and check it (after the run, not timed).
    #[arg(long)]
    pub verify: bool,
    /// Source address of TCP connections (proxies may tell applications apart by address).
    #[arg(long, value_name = "IP")]
    pub bind: Option<IpAddr>,
    /// Print `ready` once connected, then start on a line from stdin (for harnesses).
    #[arg(long)]
    pub wait_go: bool,
    #[arg(long, value_enum, default_value = "normal")]
    pub output_format: OutputFormat,
    /// One figure for all jobs together (fio's group_reporting).
    #[arg(long)]
    pub group_reporting: bool,
    /// Job name in the output.
    #[arg(long, default_value = "load")]
    pub name: String,
}

/// What each burst asks of each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Bytes(u64),
    Ios(u64),
    /// Until the run's time is up (or the region is done once, without --runtime).
    Open,
}

impl LoadConfig {
    /// The defaults of the command line, for `uri`.
    pub fn new(uri: impl Into<String>) -> Self {
        LoadConfig {
            uri: uri.into(),
            rw: Rw::Write,
            bs: Sizes::one(4096),
            blockalign: None,
            iodepth: 1,
            numjobs: 1,
            offset: 0,
            size: None,
            offset_increment: None,
            burst_bytes: Vec::new(),
            burst_ios: Vec::new(),
            bursts: None,
            think: Duration::ZERO,
            think_jitter: 0.0,
            start_delay: Duration::ZERO,
            flush_each_burst: false,
            rate: None,
            rate_iops: None,
            runtime: None,
            seed: 1,
            verify: false,
            bind: None,
            wait_go: false,
            output_format: OutputFormat::Normal,
            group_reporting: false,
            name: "load".into(),
        }
    }

    /// The command line that runs this configuration (`surge load ARGS`).
    pub fn args(&self) -> Vec<String> {
        let d = LoadConfig::new(self.uri.clone());
        let dur = |x: Duration| format!("{}us", x.as_micros());
        let list = |v: &[u64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        let mut a = vec![format!("--uri={}", self.uri), format!("--rw={}", self.rw.as_str()), format!("--bs={}", self.bs)];
        let mut opt = |on: bool, s: String| {
            if on {
                a.push(s);
            }
        };
        opt(self.blockalign.is_some(), format!("--blockalign={}", self.blockalign.unwrap_or(0)));
        opt(self.iodepth != d.iodepth, format!("--iodepth={}", self.iodepth));
        opt(self.numjobs != d.numjobs, format!("--numjobs={}", self.numjobs));
        opt(self.offset != 0, format!("--offset={}", self.offset));
        opt(self.size.is_some(), format!("--size={}", self.size.unwrap_or(0)));
        opt(self.offset_increment.is_some(), format!("--offset-increment={}", self.offset_increment.unwrap_or(0)));
        opt(!self.burst_bytes.is_empty(), format!("--burst-bytes={}", list(&self.burst_bytes)));
        opt(!self.burst_ios.is_empty(), format!("--burst-ios={}", list(&self.burst_ios)));
        opt(self.bursts.is_some(), format!("--bursts={}", self.bursts.unwrap_or(0)));
        opt(!self.think.is_zero(), format!("--think={}", dur(self.think)));
        opt(self.think_jitter != 0.0, format!("--think-jitter={}", self.think_jitter));
        opt(!self.start_delay.is_zero(), format!("--start-delay={}", dur(self.start_delay)));
        opt(self.flush_each_burst, "--flush-each-burst".into());
        opt(self.rate.is_some(), format!("--rate={}/s", self.rate.unwrap_or(0)));
        opt(self.rate_iops.is_some(), format!("--rate-iops={}", self.rate_iops.unwrap_or(0)));
        opt(self.runtime.is_some(), format!("--runtime={}", dur(self.runtime.unwrap_or_default())));
        opt(self.seed != d.seed, format!("--seed={}", self.seed));
        opt(self.verify, "--verify".into());
        opt(self.bind.is_some(), format!("--bind={}", self.bind.map(|b| b.to_string()).unwrap_or_default()));
        opt(self.wait_go, "--wait-go".into());
        opt(self.output_format == OutputFormat::Json, "--output-format=json".into());
        opt(self.group_reporting, "--group-reporting".into());
        opt(self.name != d.name, format!("--name={}", self.name));
        a
    }

    /// One line for reports: `surge load --rw=... ...`, sizes made readable.
    pub fn command_line(&self) -> String {
        let pretty = |a: &String| {
            let Some((k, v)) = a.split_once('=') else { return a.clone() };
            match k {
                "--offset" | "--size" | "--offset-increment" | "--blockalign" => format!("{k}={}", format_size(v.parse().unwrap_or(0))),
                "--burst-bytes" => format!("{k}={}", v.split(',').map(|x| format_size(x.parse().unwrap_or(0))).collect::<Vec<_>>().join(",")),
                _ => a.clone(),
            }
        };
        format!("surge load {}", self.args().iter().map(pretty).collect::<Vec<_>>().join(" "))
    }

    /// Alignment of random offsets.
    pub fn align(&self) -> u64 {
        self.blockalign.unwrap_or_else(|| self.bs.min())
    }

    /// The amount of burst `k` (`None`: no more bursts).
    pub fn amount(&self, k: u32) -> Option<Amount> {
        let (list, f): (&[u64], fn(u64) -> Amount) = if !self.burst_ios.is_empty() { (&self.burst_ios, Amount::Ios) } else { (&self.burst_bytes, Amount::Bytes) };
        let n = self.bursts.unwrap_or(list.len().max(1) as u32);
        if k >= n && self.runtime.is_none() {
            return None;
        }
        Some(match list.len() {
            0 => Amount::Open,
            len => f(list[(k as usize % n as usize).min(len - 1)]),
        })
    }

    /// Think time after burst `k` (seeded jitter).
    pub fn think_after(&self, k: u32) -> Duration {
        if self.think_jitter == 0.0 {
            return self.think;
        }
        let u = (pattern::mix(self.seed ^ 0x7468_696e_6b00_0000 ^ k as u64) >> 11) as f64 / (1u64 << 53) as f64;
        self.think.mul_f64((1.0 + self.think_jitter * (2.0 * u - 1.0)).max(0.0))
    }

    /// Each job's pattern, for an export of `dev_size` bytes; checks that the
    /// regions fit.
    pub fn jobs(&self, dev_size: u64) -> anyhow::Result<Vec<JobPattern>> {
        use anyhow::ensure;
        ensure!(self.numjobs >= 1 && self.iodepth >= 1, "--numjobs and --iodepth must be at least 1");
        ensure!((0.0..=1.0).contains(&self.think_jitter), "--think-jitter is a fraction between 0 and 1");
        let align = self.align();
        ensure!(align >= 512 && align % 512 == 0, "--blockalign must be a positive multiple of 512");
        ensure!(self.offset % 512 == 0, "--offset must be a multiple of 512");
        ensure!(self.offset < dev_size, "--offset {} is past the end of the export ({} bytes)", self.offset, dev_size);
        let size = match self.size {
            Some(s) => s,
            None => (dev_size - self.offset) / self.numjobs as u64 / align * align,
        };
        ensure!(size >= self.bs.max(), "each job's region ({size} bytes) must hold its largest request ({})", self.bs.max());
        ensure!(size % 512 == 0, "--size must be a multiple of 512");
        let inc = self.offset_increment.unwrap_or(size);
        let end = self.offset + inc * (self.numjobs as u64 - 1) + size;
        ensure!(end <= dev_size, "the jobs' regions end at byte {end}, past the end of the export ({dev_size} bytes)");
        ensure!(self.amount(0).is_some(), "--bursts 0: nothing to do");
        if self.verify {
            ensure!(self.rw.writes(), "--verify checks what was written: use --rw write or randwrite");
            ensure!(self.numjobs == 1 || inc >= size, "--verify needs jobs' regions apart (--offset-increment >= --size)");
        }
        Ok((0..self.numjobs)
            .map(|j| JobPattern { rw: self.rw, sizes: self.bs.clone(), align, start: self.offset + j as u64 * inc, len: size, seed: self.seed, job: j })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadConfig,
    }

    fn parse(args: &[String]) -> LoadConfig {
        Cli::try_parse_from(std::iter::once("surge-load".to_string()).chain(args.iter().cloned())).unwrap_or_else(|e| panic!("{args:?}: {e}")).load
    }

    #[test]
    fn the_command_line_of_a_config_parses_back_to_it() {
        let mut c = LoadConfig::new("nbd+unix:///app?socket=/tmp/x.sock");
        c.rw = Rw::Randwrite;
        c.bs = "4k/70:8k/20:16k/10".parse().unwrap();
        c.iodepth = 32;
        c.numjobs = 2;
        c.size = Some(1 << 20);
        c.offset_increment = Some(4 << 20);
        c.burst_ios = vec![2000, 1000];
        c.bursts = Some(4);
        c.think = Duration::from_millis(17_500);
        c.think_jitter = 0.25;
        c.start_delay = Duration::from_micros(1_500_001);
        c.flush_each_burst = true;
        c.rate = Some(10 << 20);
        c.seed = 1000;
        c.output_format = OutputFormat::Json;
        let back = parse(&c.args());
        assert_eq!(back.args(), c.args());
        assert_eq!((back.think, back.start_delay, back.rate), (c.think, c.start_delay, c.rate));
        assert_eq!(back.bs, c.bs);
        assert!(c.command_line().contains("--size=1MiB"), "{}", c.command_line());
    }

    #[test]
    fn bursts_repeat_the_last_amount_and_stop_at_the_count() {
        let mut c = LoadConfig::new("nbd://h/e");
        c.burst_bytes = vec![10, 20];
        c.bursts = Some(4);
        let got: Vec<_> = (0..5).map(|k| c.amount(k)).collect();
        assert_eq!(got, vec![Some(Amount::Bytes(10)), Some(Amount::Bytes(20)), Some(Amount::Bytes(20)), Some(Amount::Bytes(20)), None]);
        let plain = LoadConfig::new("nbd://h/e");
        assert_eq!((plain.amount(0), plain.amount(1)), (Some(Amount::Open), None));
    }

    #[test]
    fn jittered_think_times_vary_within_the_bound_and_repeat_with_the_seed() {
        let mut c = LoadConfig::new("nbd://h/e");
        c.think = Duration::from_secs(100);
        c.think_jitter = 0.25;
        let t: Vec<f64> = (0..50).map(|k| c.think_after(k).as_secs_f64()).collect();
        assert!(t.iter().all(|x| (75.0..=125.0).contains(x)), "{t:?}");
        assert!(t.iter().cloned().fold(0.0, f64::max) - t.iter().cloned().fold(1e9, f64::min) > 25.0, "they vary: {t:?}");
        assert_eq!(t[3], c.think_after(3).as_secs_f64());
    }

    #[test]
    fn regions_must_fit_the_export() {
        let mut c = LoadConfig::new("nbd://h/e");
        c.numjobs = 4;
        let j = c.jobs(1 << 20).unwrap();
        assert_eq!(j.iter().map(|p| (p.start, p.len)).collect::<Vec<_>>(), vec![(0, 256 << 10), (256 << 10, 256 << 10), (512 << 10, 256 << 10), (768 << 10, 256 << 10)]);
        c.size = Some(512 << 10);
        assert!(c.jobs(1 << 20).unwrap_err().to_string().contains("past the end"));
        c.size = None;
        c.verify = true;
        c.rw = Rw::Read;
        assert!(c.jobs(1 << 20).unwrap_err().to_string().contains("--verify"));
    }
}
