//! The application under test: one fio process for the whole run, reaching
//! the volume through NBD (`--ioengine=nbd`). Its compute phases are fio's own
//! think time (after a burst's last write completes, `thinktime_blocks_type=
//! complete`), each burst ends with an fsync, and the first starts after
//! `startdelay`. Its data is deterministic (seeded, buffers refilled from the
//! seed, overlapping in-flight writes serialised), so a run against a plain
//! memory export gives the exact bytes every approach must end with.

use super::scenario::{App, Scaled};
use anyhow::{ensure, Context};
use std::path::Path;
use std::process::{Command, Stdio};
use surge_block::BlockDev;

/// Runs the application against the NBD export `export` on `socket`.
pub struct Fio {
    uri: String,
}

fn us(secs: f64) -> String {
    format!("{}us", (secs * 1e6).round() as u64)
}

impl Fio {
    pub fn new(socket: &Path, export: &str) -> Self {
        Fio { uri: format!("nbd+unix:///{export}?socket={}", socket.display()) }
    }

    /// fio's arguments for the whole application.
    pub fn args(&self, s: &Scaled) -> Vec<String> {
        let bursts = s.sc.bursts.len() as u64;
        let (per, _) = s.per_burst();
        let mut a: Vec<String> = vec![
            "--name=app".into(),
            "--ioengine=nbd".into(),
            format!("--uri={}", self.uri),
            "--refill_buffers".into(),
            "--scramble_buffers=0".into(),
            "--randseed=1000".into(),
            "--clocksource=clock_gettime".into(),
            "--output-format=terse".into(),
            "--group_reporting".into(),
            format!("--startdelay={}", us(s.secs(s.sc.init_compute_s))),
            format!("--thinktime={}", us(s.secs(s.sc.compute_s))),
            "--thinktime_blocks_type=complete".into(),
        ];
        match s.sc.app {
            App::Checkpoint { writers, request, qd } => {
                let blocks = per / request;
                a.extend([
                    "--rw=write".into(),
                    format!("--bs={request}"),
                    format!("--iodepth={qd}"),
                    format!("--numjobs={writers}"),
                    "--offset=0".into(),
                    format!("--size={}", per * bursts),
                    format!("--offset_increment={}", per * bursts),
                    // Stop right after the last burst (not after one more think time).
                    format!("--number_ios={}", blocks * bursts),
                    format!("--thinktime_blocks={blocks}"),
                    format!("--fsync={blocks}"),
                ]);
            }
            App::RandomWrites { bssplit, qd, region, .. } => {
                a.extend([
                    "--rw=randwrite".into(),
                    format!("--bssplit={bssplit}"),
                    "--blockalign=4k".into(),
                    "--norandommap".into(),
                    "--serialize_overlap=1".into(),
                    format!("--iodepth={qd}"),
                    "--offset=0".into(),
                    format!("--size={}", s.region(region)),
                    // Bytes never end the job first: the count of writes does.
                    format!("--io_size={}", per * bursts * 16 * 1024),
                    format!("--number_ios={}", per * bursts),
                    format!("--thinktime_blocks={per}"),
                    format!("--fsync={per}"),
                ]);
            }
        }
        a
    }

    /// Run the application to completion.
    pub fn run(&self, s: &Scaled) -> anyhow::Result<()> {
        let out = Command::new("fio").args(self.args(s)).stdin(Stdio::null()).output().context("running fio (apt-get install fio)")?;
        ensure!(
            out.status.success(),
            "fio failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout).chars().take(400).collect::<String>()
        );
        Ok(())
    }
}

/// Compare `ranges` of `got` with the reference device; bytes verified.
pub fn verify(s: &Scaled, got: &dyn BlockDev, want: &dyn BlockDev) -> anyhow::Result<u64> {
    let mut a = vec![0u8; 1 << 20];
    let mut b = vec![0u8; 1 << 20];
    let mut n = 0;
    for (start, len) in s.written_ranges() {
        let mut off = start;
        while off < start + len {
            let l = (start + len - off).min(a.len() as u64) as usize;
            got.read_at(&mut a[..l], off).with_context(|| format!("reading back at {off}"))?;
            want.read_at(&mut b[..l], off)?;
            if let Some(i) = (0..l).find(|&i| a[i] != b[i]) {
                anyhow::bail!("data differs from the reference at byte {} (region {start}+{len})", off + i as u64);
            }
            ensure!(b[..l].iter().any(|&x| x != 0) || l < 4096, "the reference is empty at {off}: fio wrote nothing there");
            off += l as u64;
            n += l as u64;
        }
    }
    Ok(n)
}
