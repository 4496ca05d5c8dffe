//! The workloads, each run as separate processes on a mounted file system:
//! the client tool `fsbench.py` (throughput, mdtest-style metadata,
//! read-after-write, synthetic FITS images, S3 verification) and Montage.

use super::fs::Mounted;
use super::Plan;
use crate::experiment::streaming::proc::sh;
use anyhow::Context as _;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The client tool, shipped inside the binary and written to the work dir.
pub struct Tool {
    script: PathBuf,
    env: Vec<(String, String)>,
}

impl Tool {
    pub fn install(work: &Path, env: Vec<(String, String)>) -> anyhow::Result<Tool> {
        let script = work.join("fsbench.py");
        std::fs::write(&script, include_str!("fsbench.py"))?;
        Ok(Tool { script, env })
    }

    /// Run one mode; its JSON answer.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut c = Command::new("python3");
        c.arg(&self.script).args(args).envs(self.env.iter().map(|(k, v)| (k, v)));
        let out = sh(&mut c)?;
        serde_json::from_slice(&out.stdout).with_context(|| format!("fsbench {args:?}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

/// Drop the kernel's page cache so reads go to the file system, not memory
/// (false: not permitted here; listed as a deviation).
pub fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Throughput of one file system, MB/s (10^6 bytes/s).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Throughput {
    /// Median of the writes below.
    pub seq_write_mbps: f64,
    pub seq_write_samples_mbps: Vec<f64>,
    /// Median of the reads below.
    pub seq_read_mbps: f64,
    pub seq_read_samples_mbps: Vec<f64>,
    /// Sequential read through a fresh mount.
    pub cold_read_mbps: f64,
    pub rand_write_mbps: f64,
    pub rand_read_mbps: f64,
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The throughput phase on mount `m`. The sequential write runs
/// `plan.seq_writes` times, each to a new file once the file system is quiet
/// again (its write-back done); the median counts: a write of tens of
/// milliseconds is at the mercy of one stall of a shared machine. The
/// sequential read of the last file runs as many times on the mount that
/// wrote it, the page cache dropped before each (the median counts, for the
/// same reason), then once on a fresh mount (memory caches of the client
/// cold); the random I/O on the fresh mount.
pub fn throughput(tool: &Tool, m: &mut dyn Mounted, plan: &Plan) -> anyhow::Result<Throughput> {
    let (bs, rbs) = (plan.seq_bs_kib.to_string(), plan.rand_bs_kib.to_string());
    let count = plan.rand_ops.to_string();
    let mut files = vec![];
    let mut writes = vec![];
    for i in 0..plan.seq_writes.max(1) {
        if i > 0 {
            m.settle()?;
        }
        let file = m.mnt().join(format!("seq-{i}.dat"));
        let w = tool.run(&["seq-write", file.to_str().context("path")?, &plan.seq_mib.to_string(), &bs])?;
        writes.push(f(&w, "mbps"));
        files.push(file);
    }
    let file = files.last().expect("one write at least").to_str().context("path")?.to_string();
    let file = file.as_str();
    let mut reads = vec![];
    for _ in 0..plan.seq_writes.max(1) {
        drop_caches();
        reads.push(f(&tool.run(&["seq-read", file, &bs])?, "mbps"));
    }
    m.remount()?;
    drop_caches();
    let cold = tool.run(&["seq-read", file, &bs])?;
    drop_caches();
    let rr = tool.run(&["rand-read", file, &count, &rbs, "1"])?;
    let rw = tool.run(&["rand-write", file, &count, &rbs, "2"])?;
    for f in &files {
        std::fs::remove_file(f)?;
    }
    Ok(Throughput {
        seq_write_mbps: super::report::stats(writes.iter().copied()).0,
        seq_write_samples_mbps: writes,
        seq_read_mbps: super::report::stats(reads.iter().copied()).0,
        seq_read_samples_mbps: reads,
        cold_read_mbps: f(&cold, "mbps"),
        rand_write_mbps: f(&rw, "mbps"),
        rand_read_mbps: f(&rr, "mbps"),
    })
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Metadata {
    pub create_ops: f64,
    pub stat_ops: f64,
    pub unlink_ops: f64,
}

pub fn metadata(tool: &Tool, mnt: &Path, plan: &Plan) -> anyhow::Result<Metadata> {
    let v = tool.run(&["mdtest", mnt.to_str().context("path")?, &plan.md_files.to_string(), &plan.md_procs.to_string()])?;
    Ok(Metadata { create_ops: f(&v, "create_ops"), stat_ops: f(&v, "stat_ops"), unlink_ops: f(&v, "unlink_ops") })
}

/// Generate the Montage input images (on local disk, once per experiment).
pub fn fits(tool: &Tool, dir: &Path, plan: &Plan) -> anyhow::Result<(u64, u64)> {
    let v = tool.run(&["fits", dir.to_str().context("path")?, &plan.fits_images.to_string(), &plan.fits_side.to_string()])?;
    Ok((v["images"].as_u64().unwrap_or(0), v["bytes"].as_u64().unwrap_or(0)))
}

/// Bytes of the files under `dir` (what the job keeps in S3).
pub fn tree_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let e = e?;
        let t = e.file_type()?;
        n += if t.is_dir() { tree_bytes(&e.path())? } else { e.metadata()?.len() };
    }
    Ok(n)
}

/// Montage's mosaic workflow, every program with its working directory on
/// the file system: stage the raw images in, project, fit and remove the
/// background differences, add into one mosaic. Seconds, stage-in included.
pub fn montage(fits_src: &Path, mnt: &Path) -> anyhow::Result<f64> {
    let d = mnt.join("montage");
    let t = Instant::now();
    std::fs::create_dir_all(&d)?;
    sh(Command::new("cp").arg("-r").arg(fits_src).arg(d.join("raw")))?;
    for sub in ["proj", "diff", "corr"] {
        std::fs::create_dir(d.join(sub))?;
    }
    let steps: [&[&str]; 10] = [
        &["mImgtbl", "raw", "images.tbl"],
        &["mMakeHdr", "images.tbl", "template.hdr"],
        &["mProjExec", "-p", "raw", "images.tbl", "template.hdr", "proj", "stats.tbl"],
        &["mImgtbl", "proj", "pimages.tbl"],
        &["mOverlaps", "pimages.tbl", "diffs.tbl"],
        &["mDiffExec", "-p", "proj", "diffs.tbl", "template.hdr", "diff"],
        &["mFitExec", "diffs.tbl", "fits.tbl", "diff"],
        &["mBgModel", "pimages.tbl", "fits.tbl", "corr.tbl"],
        &["mBgExec", "-p", "proj", "pimages.tbl", "corr.tbl", "corr"],
        &["mAdd", "-p", "corr", "pimages.tbl", "template.hdr", "mosaic.fits"],
    ];
    for s in steps {
        let out = sh(Command::new(s[0]).args(&s[1..]).current_dir(&d))?;
        let text = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(text.contains("stat=\"OK\""), "Montage {} on {}: {}", s[0], mnt.display(), text.trim());
        anyhow::ensure!(!text.contains("failed=") || text.contains("failed=0"), "Montage {} on {}: {}", s[0], mnt.display(), text.trim());
    }
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(std::fs::metadata(d.join("mosaic.fits"))?.len() > 0, "Montage wrote an empty mosaic on {}", mnt.display());
    Ok(secs)
}
