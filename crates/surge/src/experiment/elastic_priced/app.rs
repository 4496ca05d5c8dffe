//! The application under test: one `surge load` process for the whole run,
//! reaching the volume through NBD, as a user's application would. Its
//! compute phases are the load generator's think time (after all jobs' part
//! of a burst has completed and been flushed), and the first burst starts
//! after `start_delay`. Its writes carry bytes derived from the seed, the
//! request and the position, so the volume is checked afterwards against
//! the configuration alone (`crate::load::Expected`).

use super::scenario::{App, Scaled};
use crate::load::report::Parsed;
use crate::load::{Expected, LoadConfig, OutputFormat, Rw};
use anyhow::{ensure, Context};
use std::process::{Command, Stdio};
use std::time::Duration;
use surge_block::BlockDev;

/// The application: its load generator's configuration.
pub struct Application {
    pub cfg: LoadConfig,
}

/// What one run of the application reported.
pub struct AppRun {
    pub parsed: Parsed,
}

impl Application {
    pub fn new(uri: &str, s: &Scaled) -> Self {
        let bursts = s.sc.bursts.len() as u64;
        let (per, _) = s.per_burst();
        let mut c = LoadConfig::new(uri);
        c.seed = 1000;
        c.flush_each_burst = true;
        c.output_format = OutputFormat::Json;
        c.group_reporting = true;
        c.name = format!("app-{}", s.sc.key);
        c.start_delay = Duration::from_secs_f64(s.secs(s.sc.init_compute_s));
        c.think = Duration::from_secs_f64(s.secs(s.sc.compute_s));
        c.think_jitter = s.sc.compute_jitter;
        c.bursts = Some(bursts as u32);
        match s.sc.app {
            App::Checkpoint { writers, request, qd } => {
                c.rw = Rw::Write;
                c.bs = crate::load::Sizes::one(request);
                c.iodepth = qd;
                c.numjobs = writers;
                c.size = Some(per * bursts);
                c.offset_increment = Some(per * bursts);
                c.burst_bytes = vec![per];
            }
            App::RandomWrites { bssplit, qd, region, .. } => {
                c.rw = Rw::Randwrite;
                c.bs = bssplit.parse().expect("scenario bssplit is valid");
                c.blockalign = Some(4096);
                c.iodepth = qd;
                c.size = Some(s.region(region));
                c.burst_ios = vec![per];
            }
        }
        Application { cfg: c }
    }

    /// How the application is started, for the report.
    pub fn command_line(&self) -> String {
        self.cfg.command_line()
    }

    /// Run the application to completion as its own process.
    pub fn run(&self) -> anyhow::Result<AppRun> {
        let exe = std::env::current_exe().context("finding the surge binary")?;
        let out = Command::new(exe).args(["--log", "warn", "load"]).args(self.cfg.args()).stdin(Stdio::null()).output().context("running surge load")?;
        ensure!(
            out.status.success(),
            "surge load failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout).chars().take(400).collect::<String>()
        );
        let parsed = Parsed::from_output(&String::from_utf8_lossy(&out.stdout)).context("reading surge load's figures")?;
        Ok(AppRun { parsed })
    }

    /// Check that `got` holds what the run wrote; bytes verified.
    pub fn verify(&self, run: &AppRun, got: &dyn BlockDev) -> anyhow::Result<u64> {
        let issued = &run.parsed.jobs.first().context("no job in the output")?.surge.ios_issued_per_job;
        let jobs = self.cfg.jobs(got.size())?;
        ensure!(issued.len() == jobs.len(), "{} jobs reported, {} configured", issued.len(), jobs.len());
        let expected = Expected::of(&jobs.into_iter().zip(issued.iter().copied()).collect::<Vec<_>>()).map_err(anyhow::Error::msg)?;
        ensure!(expected.bytes() > 0, "the application wrote nothing");
        expected.check(|off, buf| got.read_at(buf, off).with_context(|| format!("reading back at {off}")))
    }
}
