//! The real-time run: `surge serve` (this binary) exports a persistent
//! burstable volume over NBD; fio's nbd engine writes it with `verify`
//! (checked while writing, `verify_backlog`) while the controller swaps members
//! on their credits; then a `verify_only` pass reads everything back. Full
//! scale, real clock: 4 x 1 GiB gp2 members with their real 5.4 M-credit
//! buckets, so the swap threshold is set high (`swap_below=99.9%`) to swap
//! within seconds.

use anyhow::{bail, Context};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct FioOutcome {
    pub exit_ok: bool,
    pub errors: u64,
    pub write_iops: f64,
    pub read_iops: f64,
    pub runtime_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LiveResult {
    pub export: String,
    pub data_bytes: u64,
    pub write_verify: FioOutcome,
    pub verify_only: FioOutcome,
    /// Member swaps completed while the verifying writer ran, and in all.
    pub swaps_during_fio: u64,
    pub swaps_total: u64,
    /// Rebuild progress (percent) seen in `surge status` while fio ran.
    pub rebuild_progress_seen: Vec<f64>,
    pub nothing_lost: bool,
    pub wall_s: f64,
}

struct Serve {
    child: Child,
    control: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn status(exe: &Path, control: &Path) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(exe).args(["status", "--json", "--control"]).arg(control).output()?;
    anyhow::ensure!(out.status.success(), "surge status failed: {}", String::from_utf8_lossy(&out.stderr));
    let targets: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    targets.into_iter().find(|t| t["name"] == "p/burstable").map(|t| t["status"].clone()).context("no p/burstable in surge status")
}

fn fio(uri: &str, size: &str, extra: &[&str]) -> anyhow::Result<FioOutcome> {
    let start = Instant::now();
    let out = Command::new("fio")
        .args(["--name=live", "--ioengine=nbd", &format!("--uri={uri}"), "--rw=randwrite", "--bs=4k", "--iodepth=8", &format!("--size={size}")])
        // verify_state_save=0: fio would otherwise leave a `*-verify.state` file in the working directory.
        .args(["--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0", "--output-format=json"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .context("running fio (Debian package fio)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = text.find('{').and_then(|i| serde_json::from_str(&text[i..]).ok()).unwrap_or(serde_json::Value::Null);
    let job = &json["jobs"][0];
    if !out.status.success() {
        eprintln!("fio {extra:?} failed ({}):\n{}\n{}", out.status, text, String::from_utf8_lossy(&out.stderr));
    }
    Ok(FioOutcome {
        exit_ok: out.status.success(),
        errors: job["error"].as_u64().unwrap_or(u64::from(!out.status.success())),
        write_iops: job["write"]["iops"].as_f64().unwrap_or(0.0),
        read_iops: job["read"]["iops"].as_f64().unwrap_or(0.0),
        runtime_s: start.elapsed().as_secs_f64(),
    })
}

/// The live run's export.
pub const SPEC: &str = "p=burstable:persistent,size=4GiB,members=4,swap_below=99.9%,min_interval=2s,tick=250ms,attach_delay=200ms,rebuild_rate=64MiB/s";

pub fn run(out: &Path, quick: bool) -> anyhow::Result<LiveResult> {
    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("surge-burstable-live-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let d = dir.as_path();
    let sock = d.join("nbd.sock");
    let control = d.join("control.sock");
    let spec = SPEC;
    let log = std::fs::File::create(out.join("live-serve.log"))?;
    let child = Command::new(&exe)
        .args(["--log", "info", "serve", "--data-dir"])
        .arg(d)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--control")
        .arg(&control)
        .args(["--export", spec])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting surge serve")?;
    let serve = Serve { child, control };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(sock.exists() && serve.control.exists()) {
        if Instant::now() > deadline {
            bail!("surge serve did not come up; see {}", out.join("live-serve.log").display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let uri = format!("nbd+unix:///p?socket={}", sock.display());
    let size = if quick { "96M" } else { "384M" };
    // Writer with live verification, while the sampler watches the swaps.
    let swaps_before = status(&exe, &serve.control)?["swaps_done"].as_u64().unwrap_or(0);
    let writer = {
        let (uri, size) = (uri.clone(), size.to_string());
        std::thread::spawn(move || fio(&uri, &size, &["--verify_backlog=256"]))
    };
    let mut progress = Vec::new();
    while !writer.is_finished() {
        if let Ok(st) = status(&exe, &serve.control) {
            for m in st["members"].as_array().into_iter().flatten() {
                if let Some(p) = m["rebuild"]["percent"].as_f64() {
                    progress.push(p);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let write_verify = writer.join().map_err(|_| anyhow::anyhow!("fio thread panicked"))??;
    let swaps_during = status(&exe, &serve.control)?["swaps_done"].as_u64().unwrap_or(0) - swaps_before;
    // Let swaps in flight finish, then read everything back.
    let deadline = Instant::now() + Duration::from_secs(120);
    while status(&exe, &serve.control)?["rebuilds_in_flight"].as_u64().unwrap_or(0) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let verify_only = fio(&uri, size, &["--verify_only"])?;
    let total = status(&exe, &serve.control)?["swaps_done"].as_u64().unwrap_or(0);
    // SIGTERM: a clean stop.
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(serve.child.id() as i32, libc::SIGTERM) };
    let mut serve = serve;
    let stop_by = Instant::now() + Duration::from_secs(30);
    while serve.child.try_wait()?.is_none() && Instant::now() < stop_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
    let nothing_lost = write_verify.exit_ok && verify_only.exit_ok && write_verify.errors == 0 && verify_only.errors == 0;
    Ok(LiveResult {
        export: spec.into(),
        data_bytes: surge_block::units::parse_size(&size.replace('M', "MiB")).unwrap_or(0),
        write_verify,
        verify_only,
        swaps_during_fio: swaps_during,
        swaps_total: total,
        rebuild_progress_seen: progress,
        nothing_lost,
        wall_s: started.elapsed().as_secs_f64(),
    })
}
