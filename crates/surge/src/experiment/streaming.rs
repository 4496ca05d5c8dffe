//! `surge experiment streaming`: the paper's study of on-demand streaming
//! virtual disks, replicated with real programs.
//!
//! A storage node (`surge serve` in its own network namespace) serves a base
//! image, a real ext4 file system made with `mkfs.ext4 -d` from real files,
//! over TCP behind an emulated Gigabit link (tbf + a delay line, see
//! `link.rs`). On the compute node (this namespace) a volume is made in each
//! configuration and used as a VM would use its disk: through a kernel block
//! device (nbdfuse + loop) with ext4 mounted on it:
//!
//! | config | volume |
//! |---|---|
//! | `local-raw` | the image copied over the link first (copy time counted), served from a local file |
//! | `surge-cow` | `cow:` over the streamed base, overlay on a local file |
//! | `surge-cow-cor` | the same with copy-on-read and the stream job |
//! | `surge-persistent` | `remote:`: a copy of the base made on the storage node (counted), used over the link |
//! | `qemu-qcow2` | qemu-nbd serving a qcow2 overlay whose backing file is the NBD base |
//! | `nbdkit-cow` | nbdkit's cow filter over its nbd plugin reading the base |
//!
//! Measured per volume: provisioning (until a 64 MiB boot set of files has
//! been read from the mounted file system), fio (4 KiB random read/write,
//! 1 MiB sequential read/write), pgbench on PostgreSQL, and an external sort.
//! Full run: 3 repetitions, configurations interleaved (rotated per round).
//! Then the gated configurations in paired rounds (`paired.rs`): each pattern
//! run on them back to back, in short rounds, compared round by round.

mod cost;
mod guest;
mod image;
pub(crate) mod link;
mod paired;
pub(crate) mod proc;
mod readahead;
mod report;
mod work;

use anyhow::Context as _;
use proc::{sh, Proc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const STORAGE_PORT: u16 = 10809;

/// Scale of a run. The full run uses the sizes below; `--quick` shrinks them
/// (listed in the report) and runs once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub quick: bool,
    pub reps: usize,
    pub link_mbit: u64,
    pub delay_us: u64,
    pub image_bytes: u64,
    pub file_bytes: u64,
    pub boot_bytes: u64,
    pub fio_read_bytes: u64,
    /// The new file random writes go to (fallocated: most writes are the
    /// first to their area, where copy-on-write layers differ).
    pub fio_randwrite_bytes: u64,
    pub fio_seqwrite_bytes: u64,
    pub fio_secs: u64,
    pub pg_scale: u32,
    pub pg_clients: u32,
    pub pg_secs: u64,
    pub sort_bytes: u64,
    pub sort_buffer: String,
    /// Bytes each of the read-ahead check's other workloads reads (0: no check).
    #[serde(default)]
    pub readahead_check_bytes: u64,
    /// The paired rounds (`paired.rs`): configurations compared back to back,
    /// the baseline first (none: not run).
    #[serde(default)]
    pub paired_configs: Vec<String>,
    #[serde(default)]
    pub paired_rounds: usize,
    /// Seconds of each fio pattern per configuration and round.
    #[serde(default)]
    pub paired_secs: u64,
    #[serde(default)]
    pub paired_pg_secs: u64,
    /// The new file each round's random writes go to.
    #[serde(default)]
    pub paired_randwrite_bytes: u64,
    /// The most each round's new sequential-write file holds: the plan's
    /// `fio_seqwrite_bytes`, lowered by the rounds to what the volumes' free
    /// space holds for every round (0 in records from before it was kept).
    #[serde(default)]
    pub paired_seqwrite_bytes: u64,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                reps: 1,
                link_mbit: 1000,
                delay_us: 0,
                image_bytes: 6 * GIB,
                file_bytes: 2 * GIB,
                boot_bytes: 64 * MIB,
                fio_read_bytes: 64 * MIB,
                fio_randwrite_bytes: GIB,
                fio_seqwrite_bytes: 128 * MIB,
                // 1 s patterns and 2 s pgbench, so the paired rounds fit the
                // step's time: the gated comparison is the paired one.
                fio_secs: 1,
                pg_scale: 1,
                pg_clients: 4,
                pg_secs: 2,
                sort_bytes: 96 * MIB,
                sort_buffer: "8M".into(),
                readahead_check_bytes: 64 * MIB,
                paired_configs: vec!["local-raw".into(), "surge-cow".into()],
                paired_rounds: 4,
                paired_secs: 1,
                paired_pg_secs: 2,
                paired_randwrite_bytes: 256 * MIB,
                paired_seqwrite_bytes: 128 * MIB,
            }
        } else {
            Plan {
                quick,
                reps: 3,
                link_mbit: 1000,
                delay_us: 0,
                image_bytes: 24 * GIB,
                file_bytes: 4 * GIB,
                boot_bytes: 64 * MIB,
                fio_read_bytes: GIB,
                fio_randwrite_bytes: 4 * GIB,
                fio_seqwrite_bytes: 2 * GIB,
                fio_secs: 15,
                pg_scale: 20,
                pg_clients: 4,
                pg_secs: 60,
                sort_bytes: 2 * GIB,
                sort_buffer: "128M".into(),
                readahead_check_bytes: 256 * MIB,
                paired_configs: vec!["local-raw".into(), "surge-cow".into(), "qemu-qcow2".into()],
                paired_rounds: 8,
                paired_secs: 5,
                paired_pg_secs: 10,
                paired_randwrite_bytes: GIB,
                paired_seqwrite_bytes: 2 * GIB,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Config {
    LocalRaw,
    SurgeCow,
    SurgeCowCor,
    SurgePersistent,
    QemuQcow2,
    NbdkitCow,
}

impl Config {
    pub const ALL: [Config; 6] = [Config::LocalRaw, Config::SurgeCow, Config::SurgeCowCor, Config::SurgePersistent, Config::QemuQcow2, Config::NbdkitCow];

    pub fn name(self) -> &'static str {
        match self {
            Config::LocalRaw => "local-raw",
            Config::SurgeCow => "surge-cow",
            Config::SurgeCowCor => "surge-cow-cor",
            Config::SurgePersistent => "surge-persistent",
            Config::QemuQcow2 => "qemu-qcow2",
            Config::NbdkitCow => "nbdkit-cow",
        }
    }

    pub fn named(name: &str) -> Option<Config> {
        Config::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One run of one configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Sample {
    pub provision_s: f64,
    /// Part of provisioning spent copying the image (local-raw, persistent).
    pub copy_s: f64,
    pub randread_iops: f64,
    pub randwrite_iops: f64,
    pub seqread_mbps: f64,
    pub seqwrite_mbps: f64,
    pub oltp_tps: f64,
    pub sort_s: f64,
    /// Bytes the storage node sent over the link during the run.
    pub link_bytes: u64,
    /// CPU µs of the volume's serving process per fio I/O: randread,
    /// randwrite, seqread, seqwrite (0 where not measured).
    pub server_cpu_us: [f64; 4],
}

/// The metrics of results.json, with whether higher is better.
pub const METRICS: [(&str, bool); 7] = [
    ("provision_s", false),
    ("randread_iops", true),
    ("randwrite_iops", true),
    ("seqread_mbps", true),
    ("seqwrite_mbps", true),
    ("oltp_tps", true),
    ("sort_s", false),
];

impl Sample {
    pub fn metric(&self, name: &str) -> f64 {
        match name {
            "provision_s" => self.provision_s,
            "randread_iops" => self.randread_iops,
            "randwrite_iops" => self.randwrite_iops,
            "seqread_mbps" => self.seqread_mbps,
            "seqwrite_mbps" => self.seqwrite_mbps,
            "oltp_tps" => self.oltp_tps,
            "sort_s" => self.sort_s,
            _ => f64::NAN,
        }
    }
}

/// The storage node and everything the runs share.
struct Rig {
    plan: Plan,
    work: PathBuf,
    surge: PathBuf,
    link: link::Link,
    storage: Option<Proc>,
    /// Where compute-node clients reach the storage node (through the delay line).
    remote: SocketAddr,
    image: image::BaseImage,
    boot_list: PathBuf,
}

impl Rig {
    fn storage_dir(&self) -> PathBuf {
        self.work.join("storage")
    }

    fn persist_path(&self) -> PathBuf {
        self.storage_dir().join("persist.img")
    }

    fn start_storage(&mut self) -> anyhow::Result<()> {
        self.storage.take();
        let d = self.storage_dir();
        let mut cmd = self.link.in_storage(&self.surge.to_string_lossy());
        cmd.args(["--log", "warn", "serve", "--data-dir"])
            .arg(&d)
            .arg("--control")
            .arg(d.join("control.sock"))
            .arg("--listen")
            .arg(format!("tcp:{}:{STORAGE_PORT}", self.link.storage_ip))
            .arg("--insecure")
            .arg("--export")
            .arg(format!("base=file:{}", self.image.path.display()))
            .args(["--read-only", "base", "--export"])
            .arg(format!("persist=file:{}", self.persist_path().display()));
        let mut p = Proc::spawn("storage surge serve", &mut cmd, &d.join("serve.log"))?;
        let addr: SocketAddr = format!("{}:{STORAGE_PORT}", self.link.storage_ip).parse()?;
        proc::wait_until("the storage node", Duration::from_secs(30), || {
            p.check_alive().is_ok() && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })?;
        p.check_alive()?;
        self.storage = Some(p);
        Ok(())
    }

    /// Bytes sent by the storage node's interface so far.
    fn link_tx_bytes(&self) -> u64 {
        let out = self.link.in_storage("cat").arg(format!("/sys/class/net/sv{}s/statistics/tx_bytes", std::process::id())).output();
        out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(0)
    }

    /// Where local-raw's copy of the image is kept for the paired rounds
    /// (the last run's; a second copy over the link would only cost time).
    fn kept_local_copy(&self) -> PathBuf {
        self.work.join("local-raw-copy.img")
    }

    fn base_uri(&self, export: &str) -> String {
        format!("nbd://{}:{}/{export}", self.remote.ip(), self.remote.port())
    }
}

/// A provisioned volume on the compute node.
struct Volume {
    servers: Vec<Proc>,
    uri: String,
    copy_s: f64,
}

/// A surge-cow volume over the base, `opts` added to its spec, served on
/// `dir/vm.sock` (not yet answering: see [`ready`]); and its URI.
fn serve_cow(rig: &Rig, dir: &Path, opts: &str) -> anyhow::Result<(Proc, String)> {
    let sock = dir.join("vm.sock");
    let spec = format!("vm=cow:base={},overlay={}{opts}", rig.base_uri("base"), dir.join("vm.ovl").display());
    Ok((surge_serve(rig, dir, &spec)?, format!("nbd+unix:///vm?socket={}", sock.display())))
}

/// Wait until the server of a volume answers on `sock`.
fn ready(server: &mut Proc, sock: &Path) -> anyhow::Result<()> {
    server.wait_for_path(sock, Duration::from_secs(60))?;
    work::wait_socket(sock)
}

fn surge_serve(rig: &Rig, dir: &Path, export: &str) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(&rig.surge);
    cmd.args(["--log", "warn", "serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--control")
        .arg(dir.join("control.sock"))
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("vm.sock").display()))
        .arg("--export")
        .arg(export);
    Proc::spawn("surge serve", &mut cmd, &dir.join("serve.log"))
}

/// Bring up the volume of `cfg` in `dir` (timed by the caller, with the boot).
fn provision(rig: &mut Rig, cfg: Config, dir: &Path) -> anyhow::Result<Volume> {
    let sock = dir.join("vm.sock");
    let unix = |export: &str| format!("nbd+unix:///{export}?socket={}", sock.display());
    let (server, uri, copy_s) = match cfg {
        Config::LocalRaw => {
            let t = Instant::now();
            sh(Command::new("nbdcopy").arg(rig.base_uri("base")).arg(dir.join("local.img")))?;
            let copy_s = t.elapsed().as_secs_f64();
            (surge_serve(rig, dir, &format!("vm=file:{}", dir.join("local.img").display()))?, unix("vm"), copy_s)
        }
        Config::SurgeCow | Config::SurgeCowCor => {
            let mut extra = if cfg == Config::SurgeCowCor { ",cor,stream".to_string() } else { String::new() };
            if let Ok(more) = std::env::var("SURGE_STREAMING_COW_OPTS") {
                extra.push(',');
                extra.push_str(&more);
            }
            let (server, uri) = serve_cow(rig, dir, &extra)?;
            (server, uri, 0.0)
        }
        Config::SurgePersistent => {
            // The paper's persistent volume: the image is first duplicated on
            // the storage node, then used over the network.
            let t = Instant::now();
            rig.storage.take();
            sh(Command::new("cp").arg("--sparse=always").arg(&rig.image.path).arg(rig.persist_path()))?;
            rig.start_storage()?;
            let copy_s = t.elapsed().as_secs_f64();
            (surge_serve(rig, dir, &format!("vm=remote:{}", rig.base_uri("persist")))?, unix("vm"), copy_s)
        }
        Config::QemuQcow2 => {
            let ovl = dir.join("vm.qcow2");
            sh(Command::new("qemu-img").args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"]).arg(rig.base_uri("base")).arg(&ovl))?;
            let mut cmd = Command::new("qemu-nbd");
            cmd.args(["--persistent", "--shared=8", "--format=qcow2", "-x", "vm", "--socket"]).arg(&sock).arg(&ovl);
            (Proc::spawn("qemu-nbd", &mut cmd, &dir.join("qemu-nbd.log"))?, unix("vm"), 0.0)
        }
        Config::NbdkitCow => {
            let mut cmd = Command::new("nbdkit");
            cmd.env("TMPDIR", dir).args(["--foreground", "-U"]).arg(&sock).args(["--filter=cow", "nbd"]).arg(format!("uri={}", rig.base_uri("base")));
            (Proc::spawn("nbdkit", &mut cmd, &dir.join("nbdkit.log"))?, unix(""), 0.0)
        }
    };
    let mut server = server;
    ready(&mut server, &sock)?;
    Ok(Volume { servers: vec![server], uri, copy_s })
}

/// The volume of `cfg` for the paired rounds, in `dir`: local-raw serves the
/// copy its last run made, anything else is provisioned as in a run.
fn provision_local(rig: &mut Rig, cfg: Config, dir: &Path) -> anyhow::Result<Volume> {
    if cfg != Config::LocalRaw || !rig.kept_local_copy().exists() {
        return provision(rig, cfg, dir);
    }
    let img = dir.join("local.img");
    std::fs::rename(rig.kept_local_copy(), &img)?;
    let sock = dir.join("vm.sock");
    let mut server = surge_serve(rig, dir, &format!("vm=file:{}", img.display()))?;
    ready(&mut server, &sock)?;
    Ok(Volume { servers: vec![server], uri: format!("nbd+unix:///vm?socket={}", sock.display()), copy_s: 0.0 })
}

/// Provision `cfg`, boot, then run every workload on it.
fn run_one(rig: &mut Rig, cfg: Config, rep: usize, bar: &indicatif::ProgressBar) -> anyhow::Result<Sample> {
    let dir = rig.work.join(format!("run{rep}-{}", cfg.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let tx0 = rig.link_tx_bytes();
    let phase = |p: &str| bar.set_message(format!("{} (round {}): {p}", cfg.name(), rep + 1));
    // Each phase starts with no dirty data left by the one before (a run
    // writing gigabytes would otherwise slow the next one's writes).
    let settle = || proc::shell("sync");
    settle()?;
    phase("provisioning");
    let t = Instant::now();
    let vol = provision(rig, cfg, &dir)?;
    let t_server = t.elapsed().as_secs_f64();
    let mut guest = guest::Guest::attach(&vol.uri, &dir)?;
    let t_attach = t.elapsed().as_secs_f64();
    work::boot(&guest.mnt, &rig.boot_list)?;
    let provision_s = t.elapsed().as_secs_f64();
    tracing::debug!(config = cfg.name(), t_server, t_attach, provision_s, "provisioned");
    if std::env::var_os("SURGE_STREAMING_TRACE").is_some() {
        report::say(bar, format!("  {}: server ready {t_server:.2} s, mounted {t_attach:.2} s, booted {provision_s:.2} s", cfg.name()));
        if let Ok(o) = Command::new(&rig.surge).args(["status", "--json", "--control"]).arg(dir.join("control.sock")).output() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            for t in v.as_array().into_iter().flatten().filter(|t| t["kind"] == "cow" || t["kind"] == "remote") {
                let st = &t["status"];
                report::say(bar, format!("    {}: blocks {} remote {}", t["name"], st["blocks"], st["remote"]));
            }
        }
    }
    image::verify_boot_set(&rig.image, &guest.mnt).context("verifying the boot set")?;
    let t = Instant::now();
    settle()?;
    phase("fio");
    let f = work::fio(&guest.mnt, &rig.plan, &|| vol.servers.first().and_then(Proc::cpu_s))?;
    let t_fio = t.elapsed().as_secs_f64();
    settle()?;
    phase("pgbench");
    let tps = work::pgbench(&guest.mnt, &rig.plan)?;
    let t_pg = t.elapsed().as_secs_f64();
    settle()?;
    phase("sort");
    let sort_s = work::sort(&mut guest, &rig.plan)?;
    let t_sort = t.elapsed().as_secs_f64();
    let keep_copy = cfg == Config::LocalRaw && rig.plan.paired_rounds > 0;
    if keep_copy {
        // The paired rounds get the image as provisioned, not this run's
        // gigabytes of workload files (at full scale they left too little
        // room for the rounds' new files).
        work::remove_outputs(&guest.mnt)?;
    }
    drop(guest);
    drop(vol.servers);
    if std::env::var_os("SURGE_STREAMING_TRACE").is_some() {
        report::say(bar, format!("  {}: fio {t_fio:.1} s, pgbench {:.1} s, sort {:.1} s, teardown {:.1} s", cfg.name(), t_pg - t_fio, t_sort - t_pg, t.elapsed().as_secs_f64() - t_sort));
    }
    let link_bytes = rig.link_tx_bytes().saturating_sub(tx0);
    if keep_copy {
        std::fs::rename(dir.join("local.img"), rig.kept_local_copy())?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Sample {
        provision_s,
        copy_s: vol.copy_s,
        randread_iops: f.randread_iops,
        randwrite_iops: f.randwrite_iops,
        seqread_mbps: f.seqread_mbps,
        seqwrite_mbps: f.seqwrite_mbps,
        oltp_tps: tps,
        sort_s,
        link_bytes,
        server_cpu_us: f.server_cpu_us,
    })
}

/// Median round trip of a 4 KiB read over the emulated link, in µs.
fn measure_rtt(rig: &Rig) -> anyhow::Result<f64> {
    use surge_block::BlockDev;
    let uri: surge_nbd::NbdUri = rig.base_uri("base").parse()?;
    let dev = surge_nbd::RemoteDev::open(&uri, surge_nbd::RemoteOptions { connections: 1, ..Default::default() })?;
    let mut buf = vec![0u8; 4096];
    let mut t = Vec::new();
    for i in 0..200u64 {
        let s = Instant::now();
        dev.read_at(&mut buf, (i * 7919 % 1000) * 4096)?;
        t.push(s.elapsed().as_secs_f64() * 1e6);
    }
    Ok(report::median(&mut t))
}

/// Write report.md and the plots again from the results.json in `out` (a
/// report change applied to a recorded run; nothing is measured).
pub fn rewrite_report(out: &Path) -> anyhow::Result<()> {
    let (plan, setup, samples, readahead, paired) = report::read(out)?;
    report::write(out, &plan, &setup, &samples, &readahead, &paired)
}

pub fn run(out: &Path, quick: bool) -> anyhow::Result<()> {
    anyhow::ensure!(unsafe { libc::geteuid() } == 0, "the streaming experiment needs root (network namespaces, loop devices, mounts)");
    let mut plan = Plan::new(quick);
    if let Some(d) = std::env::var("SURGE_STREAMING_DELAY_US").ok().and_then(|v| v.parse().ok()) {
        plan.delay_us = d;
    }
    // Rounds at the chosen scale (e.g. 3 rounds of the --quick scale when a
    // full run does not fit the time there is); listed in report.md.
    if let Some(r) = std::env::var("SURGE_STREAMING_REPS").ok().and_then(|v| v.parse().ok()).filter(|&r: &usize| r >= 1) {
        plan.reps = r;
    }
    // Paired rounds (0: none).
    if let Some(r) = std::env::var("SURGE_STREAMING_PAIRED_ROUNDS").ok().and_then(|v| v.parse().ok()) {
        plan.paired_rounds = r;
    }
    let started = Instant::now();
    let work = tempfile::Builder::new().prefix("surge-streaming").tempdir_in("/var/tmp").context("making a work dir in /var/tmp")?;
    std::fs::create_dir_all(work.path().join("storage"))?;
    // The read-ahead check runs on surge-cow: left out when a subset without it is asked for.
    let configs_asked = std::env::var("SURGE_STREAMING_CONFIGS").ok();
    if configs_asked.as_deref().is_some_and(|only| !only.split(',').any(|c| c == "surge-cow")) {
        plan.readahead_check_bytes = 0;
    }
    if let Some(only) = &configs_asked {
        plan.paired_configs.retain(|c| only.split(',').any(|o| o == c));
    }
    if plan.paired_configs.len() < 2 {
        plan.paired_rounds = 0;
    }
    if plan.paired_rounds == 0 {
        plan.paired_configs.clear();
    }
    let check_runs = if plan.readahead_check_bytes > 0 { readahead::runs(plan.reps) } else { 0 };
    let bar = report::progress_bar((plan.reps * Config::ALL.len()) as u64 + check_runs + u64::from(plan.paired_rounds > 0));
    bar.set_message("building the base image (mkfs.ext4 -d)");
    let t = Instant::now();
    let img = image::build(&work.path().join("storage"), plan.image_bytes, plan.file_bytes, plan.boot_bytes)?;
    let image_s = t.elapsed().as_secs_f64();
    if std::env::var_os("SURGE_STREAMING_TRACE").is_some() {
        report::say(&bar, format!("  base image built in {image_s:.1} s"));
    }
    let boot_list = work.path().join("boot.list");
    image::write_boot_list(&img, &boot_list)?;
    let id = std::process::id();
    let mut link = link::Link::up(id, plan.link_mbit, Duration::from_micros(plan.delay_us))?;
    // Without an added delay, clients reach the storage node straight over the veth.
    let remote = if plan.delay_us > 0 { link.relay_to(STORAGE_PORT)? } else { format!("{}:{STORAGE_PORT}", link.storage_ip).parse()? };
    let mut rig = Rig { plan: plan.clone(), work: work.path().to_path_buf(), surge: std::env::current_exe()?, link, storage: None, remote, image: img, boot_list };
    std::fs::File::create(rig.persist_path())?.set_len(rig.image.size)?;
    rig.start_storage()?;
    let rtt_us = measure_rtt(&rig)?;

    let mut samples: BTreeMap<Config, Vec<Sample>> = BTreeMap::new();
    for rep in 0..plan.reps {
        // Interleave: each round starts with a different configuration.
        let mut order = Config::ALL.to_vec();
        // For debugging one configuration: SURGE_STREAMING_CONFIGS=surge-cow,local-raw
        if let Some(only) = &configs_asked {
            order.retain(|c| only.split(',').any(|o| o == c.name()));
        }
        let n = order.len().max(1);
        order.rotate_left(rep % n);
        for cfg in order {
            let t = Instant::now();
            let s = run_one(&mut rig, cfg, rep, &bar).with_context(|| format!("{} (round {})", cfg.name(), rep + 1))?;
            report::say(
                &bar,
                format!(
                    "  {:<17} provision {:>6.2} s, randwrite {:>7.0} IOPS, pgbench {:>6.0} tps, sort {:>6.2} s ({:.0} s)",
                    cfg.name(),
                    s.provision_s,
                    s.randwrite_iops,
                    s.oltp_tps,
                    s.sort_s,
                    t.elapsed().as_secs_f64()
                ),
            );
            samples.entry(cfg).or_default().push(s);
            bar.inc(1);
        }
    }
    let paired = if plan.paired_rounds > 0 { paired::run(&mut rig, &bar)? } else { Vec::new() };
    bar.inc(u64::from(plan.paired_rounds > 0));
    // The rounds' sequential-write file, as fitted to the volumes' free space.
    plan.paired_seqwrite_bytes = rig.plan.paired_seqwrite_bytes;
    let readahead = if plan.readahead_check_bytes > 0 { readahead::run(&mut rig, &bar)? } else { Vec::new() };
    bar.finish_and_clear();
    let setup = report::Setup {
        rtt_us,
        image_s,
        image_files: rig.image.files,
        image_file_bytes: rig.image.file_bytes,
        boot_files: rig.image.boot.len(),
        boot_bytes: rig.image.boot_bytes,
        total_s: started.elapsed().as_secs_f64(),
    };
    drop(rig);
    report::write(out, &plan, &setup, &samples, &readahead, &paired)
}
