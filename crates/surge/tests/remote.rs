//! Streaming volumes end to end with real processes: the NBD client device
//! against surge, nbdkit and qemu-nbd servers SIGKILLed and restarted mid-run
//! (no acknowledged write lost, none applied over a newer one), and `cow:`
//! exports streaming a base from another `surge serve` (status, progress,
//! the base going away once streamed, the TOML form).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_block::BlockDev;
use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};

fn wait_for_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(Instant::now() < deadline, "{} never came up", sock.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server process that can be SIGKILLed and started again on the same socket.
struct Restartable {
    start: Box<dyn Fn() -> Child>,
    child: Option<Child>,
    sock: PathBuf,
}

impl Restartable {
    fn new(sock: PathBuf, start: Box<dyn Fn() -> Child>) -> Restartable {
        let mut r = Restartable { start, child: None, sock };
        r.restart();
        r
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
    fn restart(&mut self) {
        self.child = Some((self.start)());
        wait_for_socket(&self.sock);
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writer threads own regions and write numbered versions of their blocks
/// (flushing every 16th) while the server is killed and restarted three
/// times; afterwards every block holds its last acknowledged version, read
/// through the client and, after a flush, by a fresh client.
fn kill_and_restart_mid_run(server: &mut Restartable, uri: &NbdUri) {
    let (threads, blocks) = (4u64, 128u64);
    let opts = RemoteOptions { connections: 2, reconnect_timeout: Duration::from_secs(30), request_timeout: Duration::from_secs(20), ..RemoteOptions::default() };
    let dev = Arc::new(RemoteDev::open(uri, opts.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = vec![0u64; blocks as usize];
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) || v < 200 {
                    v += 1;
                    let b = (v * 7919) % blocks;
                    let mut data = vec![0u8; 4096];
                    data[..8].copy_from_slice(&v.to_le_bytes());
                    data[8..16].copy_from_slice(&(t * blocks + b).to_le_bytes());
                    dev.write_at(&data, (t * blocks + b) * 4096, false).unwrap_or_else(|e| panic!("write failed: {e}"));
                    last[b as usize] = v;
                    if v.is_multiple_of(16) {
                        dev.flush().unwrap_or_else(|e| panic!("flush failed: {e}"));
                    }
                }
                last
            })
        })
        .collect();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(250));
        server.kill();
        std::thread::sleep(Duration::from_millis(150));
        server.restart();
    }
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, Ordering::Relaxed);
    let lasts: Vec<Vec<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let stats = dev.stats();
    assert!(stats.reconnects >= 3, "{stats:?}");
    dev.flush().unwrap();
    let check = |d: &dyn BlockDev, who: &str| {
        for (t, last) in lasts.iter().enumerate() {
            for b in 0..blocks {
                let mut data = vec![0u8; 4096];
                d.read_at(&mut data, (t as u64 * blocks + b) * 4096).unwrap();
                let v = u64::from_le_bytes(data[..8].try_into().unwrap());
                assert_eq!(v, last[b as usize], "{who}: thread {t} block {b} holds version {v}, last acknowledged {}", last[b as usize]);
            }
        }
    };
    check(dev.as_ref(), "same client");
    drop(dev);
    check(&RemoteDev::open(uri, opts).unwrap(), "fresh client");
    eprintln!("{uri}: {stats:?}");
}

fn unix_uri(sock: &Path, export: &str) -> NbdUri {
    format!("nbd+unix:///{export}?socket={}", sock.display()).parse().unwrap()
}

/// A server made by `command(dir, socket)` over `dir/disk.img` (8 MiB),
/// killed and restarted mid-run.
fn kill_and_restart(export: &str, command: impl Fn(&Path, &Path) -> Command + 'static) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    std::fs::File::create(dir.path().join("disk.img")).unwrap().set_len(8 << 20).unwrap();
    let (d, s) = (dir.path().to_path_buf(), sock.clone());
    let mut server = Restartable::new(sock.clone(), Box::new(move || command(&d, &s).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()));
    kill_and_restart_mid_run(&mut server, &unix_uri(&sock, export));
}

#[test]
fn surge_killed_and_restarted_mid_run_loses_no_request() {
    // The export holds writes in process memory until FLUSH (fault:volatile),
    // so a SIGKILL really loses acknowledged writes: the client must replay them.
    kill_and_restart("d", |dir, sock| {
        let mut c = Command::new(SURGE);
        c.args(["--log", "warn", "serve", "--data-dir"])
            .arg(dir)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(["--pool", "p=file:disk.img", "--export", "d=fault:p,volatile"]);
        c
    });
}

#[test]
fn nbdkit_killed_and_restarted_mid_run_loses_no_request() {
    let nbdkit = require("nbdkit", "nbdkit");
    kill_and_restart("", move |dir, sock| {
        let mut c = Command::new(&nbdkit);
        c.args(["--foreground", "-U"]).arg(sock).arg("file").arg(dir.join("disk.img"));
        c
    });
}

#[test]
fn qemu_nbd_killed_and_restarted_mid_run_loses_no_request() {
    let qemu_nbd = require("qemu-nbd", "qemu-utils");
    kill_and_restart("d", move |dir, sock| {
        let mut c = Command::new(&qemu_nbd);
        c.args(["--persistent", "--shared=4", "--format=raw", "--cache=writeback", "-x", "d", "--socket"]).arg(sock).arg(dir.join("disk.img"));
        c
    });
}

fn status_of(s: &Surge, target: &str) -> serde_json::Value {
    let out = s.client(&["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    all.as_array().unwrap().iter().find(|t| t["name"] == target).unwrap_or_else(|| panic!("no {target} in {all}"))["status"].clone()
}

#[test]
fn a_cow_export_streams_its_base_from_another_surge_and_then_needs_it_no_more() {
    let qemu_io = require("qemu-io", "qemu-utils");
    // The storage node: a base image served read-only.
    let storage = Surge::start(&["--export", "base=file:base.img,create=32MiB", "--read-only", "base"]);
    let base_path = storage.path("base.img");
    // Fill the base (through the file: the export is read-only).
    let pattern: Vec<u8> = (0..32u32 << 20).map(|i| (i / 4096 % 251) as u8 + 1).collect();
    std::fs::write(&base_path, &pattern).unwrap();
    let base_uri = storage.uri("base");
    // The compute node: copy-on-write over it, stream job at 8 MB/s.
    let compute = Surge::start(&["--export", &format!("vm=cow:base={base_uri},overlay=vm.ovl,stream,rate=8MB/s,cor")]);
    let vm = compute.uri("vm");
    run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "write -P 0xab 1M 64k", "-c", "flush", &vm]));
    run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "read -P 0xab 1M 64k", &vm]));
    // Progress and an ETA while it runs.
    let st = status_of(&compute, "vm/cow");
    assert_eq!(st["stream"]["state"], "running", "{st}");
    assert!(st["stream"]["eta_s"].as_f64().is_some_and(|e| e > 0.0 && e < 60.0), "{st}");
    assert!(st["remote"]["connections_open"].as_u64() >= Some(1), "{st}");
    let human = text(&compute.client(&["status"]).stdout);
    assert!(human.contains("vm/cow (cow)") && human.contains("eta_s") && human.contains("percent"), "{human}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while status_of(&compute, "vm/cow")["stream"]["state"] == "running" {
        assert!(Instant::now() < deadline, "stream did not finish: {}", status_of(&compute, "vm/cow"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = status_of(&compute, "vm/cow");
    assert_eq!(st["stream"]["state"], "done", "{st}");
    assert_eq!((st["needs_base"].clone(), st["blocks"]["independent"].clone()), (false.into(), true.into()), "{st}");
    // The storage node goes away; the volume keeps working, all local.
    drop(storage);
    std::thread::sleep(Duration::from_millis(300));
    let at_30m = format!("read -P {:#x} 30M 4096", (30 * 256) % 251 + 1);
    let out = run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "read -P 0xab 1M 64k", "-c", "read -P 0x02 4096 4096", "-c", &at_30m, &vm]));
    assert!(text(&out.stdout).contains("read 4096/4096"), "{}", text(&out.stdout));
    let st = status_of(&compute, "vm/cow");
    assert_eq!(st["base_attached"], false, "{st}");
    drop(compute);

    // The TOML form, and a base that is a local file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.img"), &pattern[..4 << 20]).unwrap();
    std::fs::write(
        dir.path().join("surge.toml"),
        format!(
            "[[export]]\nname = \"vm2\"\nspec = \"cow:base=file:{},overlay={},granularity=16KiB\"\n",
            dir.path().join("base.img").display(),
            dir.path().join("vm2.ovl").display()
        ),
    )
    .unwrap();
    let s = Surge::start(&["--config", &dir.path().join("surge.toml").to_string_lossy()]);
    let out = run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "write -P 0x33 100 10", "-c", "read -P 0x33 100 10", "-c", "read -P 0x01 0 100", &s.uri("vm2")]));
    assert!(text(&out.stdout).contains("read 10/10"));
    let st = status_of(&s, "vm2/cow");
    assert_eq!(st["blocks"]["granularity"], 16384, "{st}");
    assert_eq!(st["blocks"]["fill_bytes"], 16384, "one partial write filled one block from the base: {st}");
}
