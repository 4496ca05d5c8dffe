//! The workloads, each a real program on the mounted file system: `cat` (the
//! boot set), fio, PostgreSQL + pgbench, GNU sort.

use super::guest::Guest;
use super::proc::{sh, shell, wait_until};
use super::Plan;
use anyhow::Context as _;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Readers of the boot set at once (a booting system starts many services in
/// parallel).
pub const BOOT_READERS: u32 = 8;

/// Read every boot file, `BOOT_READERS` `cat`s in parallel.
pub fn boot(mnt: &Path, list: &Path) -> anyhow::Result<()> {
    read_files(mnt, list, BOOT_READERS)
}

/// Read the files of `list` whole with `cat`, `readers` at once, in the
/// list's order.
pub fn read_files(mnt: &Path, list: &Path, readers: u32) -> anyhow::Result<()> {
    sh(Command::new("sh").arg("-c").arg(format!("xargs -0 -P {readers} -n 32 cat < '{}' > /dev/null", list.display())).current_dir(mnt))?;
    Ok(())
}

#[derive(Debug, Clone, Copy, Default)]
pub struct FioResult {
    pub randread_iops: f64,
    pub randwrite_iops: f64,
    pub seqread_mbps: f64,
    pub seqwrite_mbps: f64,
    /// CPU µs of the volume's serving process per I/O of each pattern
    /// (randread, randwrite, seqread, seqwrite): unlike the rates, it hardly
    /// moves with what else the machine runs.
    pub server_cpu_us: [f64; 4],
}

pub(super) fn fio_json(args: &[String]) -> anyhow::Result<serde_json::Value> {
    let out = sh(Command::new("fio").args(["--output-format=json", "--ioengine=libaio", "--direct=1", "--numjobs=1", "--group_reporting"]).args(args))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON.
    let start = text.find('{').context("fio printed no JSON")?;
    Ok(serde_json::from_str(&text[start..])?)
}

pub(super) fn job(v: &serde_json::Value, dir: &str, key: &str) -> f64 {
    v["jobs"][0][dir][key].as_f64().unwrap_or(0.0)
}

/// The four fio patterns: 4 KiB random read and write, 1 MiB sequential read
/// and write, direct I/O through the file system. Reads use a file fio lays
/// out first (not timed); writes go to new files, as an application writing
/// new data does.
/// `server_cpu` gives the serving process's CPU seconds so far.
pub fn fio(mnt: &Path, plan: &Plan, server_cpu: &dyn Fn() -> Option<f64>) -> anyhow::Result<FioResult> {
    let dir = mnt.join("bench");
    std::fs::create_dir_all(&dir)?;
    let f = |n: &str| format!("--filename={}", dir.join(n).display());
    let secs = format!("--runtime={}", plan.fio_secs);
    let read_size = format!("--size={}", plan.fio_read_bytes);
    let randwrite_size = format!("--size={}", plan.fio_randwrite_bytes);
    let seqwrite_size = format!("--size={}", plan.fio_seqwrite_bytes);
    // Lay the read file out once.
    fio_json(&["--name=layout".into(), f("read.dat"), read_size.clone(), "--rw=write".into(), "--bs=1M".into(), "--iodepth=4".into()])?;
    shell(&format!("sync -f '{}'", dir.display()))?;
    let settle = || shell("sync");
    settle()?;
    // One pattern, with its server CPU per I/O (the final sync of a write
    // pattern counted: the server does that work for it).
    let mut cpu_us = [0.0; 4];
    let mut pattern = |i: usize, dir: &str, args: &[String]| -> anyhow::Result<serde_json::Value> {
        let c0 = server_cpu();
        let v = fio_json(args)?;
        settle()?;
        let ios = job(&v, dir, "total_ios");
        if let (Some(a), Some(b)) = (c0, server_cpu()) {
            cpu_us[i] = if ios > 0.0 { (b - a) * 1e6 / ios } else { 0.0 };
        }
        Ok(v)
    };
    let rr = pattern(0, "read", &["--name=randread".into(), f("read.dat"), read_size.clone(), "--rw=randread".into(), "--bs=4k".into(), "--iodepth=16".into(), secs.clone(), "--time_based".into()])?;
    let rw = pattern(1, "write", &["--name=randwrite".into(), f("randwrite.dat"), randwrite_size, "--rw=randwrite".into(), "--bs=4k".into(), "--iodepth=16".into(), secs.clone(), "--time_based".into()])?;
    let sr = pattern(2, "read", &["--name=seqread".into(), f("read.dat"), read_size, "--rw=read".into(), "--bs=1M".into(), "--iodepth=4".into(), secs, "--time_based".into()])?;
    let sw = pattern(3, "write", &["--name=seqwrite".into(), f("seqwrite.dat"), seqwrite_size, "--rw=write".into(), "--bs=1M".into(), "--iodepth=4".into(), "--end_fsync=1".into()])?;
    Ok(FioResult {
        randread_iops: job(&rr, "read", "iops"),
        randwrite_iops: job(&rw, "write", "iops"),
        seqread_mbps: job(&sr, "read", "bw_bytes") / 1e6,
        seqwrite_mbps: job(&sw, "write", "bw_bytes") / 1e6,
        server_cpu_us: cpu_us,
    })
}

/// The newest PostgreSQL server binaries installed.
fn pg_bin() -> anyhow::Result<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (apt-get install postgresql)")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("postgres").exists())
        .collect();
    v.sort();
    v.pop().context("no /usr/lib/postgresql/*/bin/postgres")
}

fn as_postgres(program: &Path) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(program);
    c
}

/// A PostgreSQL cluster on the volume (default settings; initdb without its
/// own fsync, which only speeds up setup), running, with pgbench's tables
/// at `plan.pg_scale`; stopped when dropped.
pub struct Pg {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    clients: u32,
}

impl Pg {
    /// In `mnt/name`.
    pub fn start(mnt: &Path, name: &str, plan: &Plan) -> anyhow::Result<Pg> {
        let bin = pg_bin()?;
        let dir = mnt.join(name);
        std::fs::create_dir_all(&dir)?;
        sh(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
        let data = dir.join("data");
        sh(as_postgres(&bin.join("initdb")).args(["-N", "-A", "trust", "-U", "postgres", "-D"]).arg(&data))?;
        let opts = format!("-c listen_addresses='' -k {}", dir.display());
        sh(as_postgres(&bin.join("pg_ctl")).args(["-w", "-t", "60", "-l"]).arg(dir.join("server.log")).args(["-D"]).arg(&data).args(["-o", &opts, "start"]))?;
        let pg = Pg { bin, dir, data, clients: plan.pg_clients };
        sh(as_postgres(&pg.bin.join("pgbench")).args(["-h", &pg.host(), "-U", "postgres", "-i", "-q", "-s", &plan.pg_scale.to_string(), "postgres"]))?;
        Ok(pg)
    }

    fn host(&self) -> String {
        self.dir.to_string_lossy().to_string()
    }

    /// pgbench's TPC-B-like load for `secs`: (transactions/s, transactions).
    pub fn bench(&self, secs: u64) -> anyhow::Result<(f64, f64)> {
        let out = sh(as_postgres(&self.bin.join("pgbench")).args(["-h", &self.host(), "-U", "postgres", "-c", &self.clients.to_string(), "-j", "2", "-T", &secs.to_string(), "postgres"]))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let num = |prefix: &str| text.lines().find_map(|l| l.trim().strip_prefix(prefix).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse::<f64>().ok()));
        let tps = num("tps = ").with_context(|| format!("no tps in pgbench output: {text}"))?;
        let txns = num("number of transactions actually processed: ").with_context(|| format!("no transaction count in pgbench output: {text}"))?;
        Ok((tps, txns))
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl")).args(["-w", "-m", "fast", "-D"]).arg(&self.data).arg("stop").output();
    }
}

/// pgbench with `plan.pg_clients` clients for `plan.pg_secs` on a new
/// cluster on the volume; returns transactions/s.
pub fn pgbench(mnt: &Path, plan: &Plan) -> anyhow::Result<f64> {
    Ok(Pg::start(mnt, "pg", plan)?.bench(plan.pg_secs)?.0)
}

/// Generate the data set (100-byte records with 10-byte random keys, like
/// sort benchmarks use), drop the guest's cache of it (remount), then time
/// `sort` (external: its memory is a fraction of the data) until its output
/// is on the volume (syncfs). Returns seconds.
pub fn sort(guest: &mut Guest, plan: &Plan) -> anyhow::Result<f64> {
    let dir = guest.mnt.join("sort");
    std::fs::create_dir_all(dir.join("tmp"))?;
    let input = dir.join("input");
    {
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&input)?);
        const KEY: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut rec = [b'.'; 100];
        rec[99] = b'\n';
        rec[10] = b' ';
        for i in 0..plan.sort_bytes / 100 {
            for k in rec.iter_mut().take(10) {
                *k = KEY[rng.gen_range(0..KEY.len())];
            }
            let n = format!("{i:020}");
            rec[11..31].copy_from_slice(n.as_bytes());
            w.write_all(&rec)?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    guest.remount()?;
    shell("sync")?;
    let output = dir.join("output");
    let t = Instant::now();
    sh(Command::new("sort")
        .env("LC_ALL", "C")
        .arg(format!("--buffer-size={}", plan.sort_buffer))
        .arg("--parallel=2")
        .arg("-T")
        .arg(dir.join("tmp"))
        .arg("-o")
        .arg(&output)
        .arg(&input))?;
    shell(&format!("sync -f '{}'", output.display()))?;
    let secs = t.elapsed().as_secs_f64();
    let (a, b) = (std::fs::metadata(&input)?.len(), std::fs::metadata(&output)?.len());
    anyhow::ensure!(a == b, "sort output has {b} bytes, input {a}");
    Ok(secs)
}

/// What the workloads above leave on the volume (fio's files, the
/// PostgreSQL cluster, sort's data), removed and the removal on the volume.
pub fn remove_outputs(mnt: &Path) -> anyhow::Result<()> {
    for d in ["bench", "pg", "sort"] {
        match std::fs::remove_dir_all(mnt.join(d)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(anyhow::Error::new(e).context(format!("removing {d} from {}", mnt.display()))),
            _ => {}
        }
    }
    shell(&format!("sync -f '{}'", mnt.display())).map(drop)
}

/// Wait until `path` answers on its NBD socket.
pub fn wait_socket(path: &Path) -> anyhow::Result<()> {
    wait_until(&format!("{}", path.display()), Duration::from_secs(30), || std::os::unix::net::UnixStream::connect(path).is_ok())
}
