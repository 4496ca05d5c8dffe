//! Real NBD clients (libnbd tools, qemu, fio, the kernel through nbdfuse + loop)
//! against a running `surge serve`.

mod common;
use common::*;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn nbdinfo_json(uri: &str) -> serde_json::Value {
    let out = run_ok(Command::new(require("nbdinfo", "libnbd-bin")).arg("--json").arg(uri));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("nbdinfo --json gave bad JSON ({e}): {}", text(&out.stdout)))
}

#[test]
fn nbdinfo_sees_fixed_newstyle_structured_replies_and_every_flag_of_a_writable_file() {
    let s = Surge::start(&["--export", "d=file:d.img,create=16MiB", "--export", "ro=memory:1MiB", "--read-only", "ro"]);
    let info = nbdinfo_json(&s.uri("d"));
    assert_eq!(info["protocol"], "newstyle-fixed");
    assert_eq!(info["structured"], true);
    let e = &info["exports"][0];
    assert_eq!(e["export-name"], "d");
    assert_eq!(e["export-size"], 16 * MIB);
    assert!(e["contexts"].as_array().unwrap().iter().any(|c| c == "base:allocation"), "{e}");
    assert_eq!(e["is_read_only"], false);
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn", "can_cache", "can_fast_zero"] {
        assert_eq!(e[flag], true, "{flag} in {e}");
    }

    let ro = &nbdinfo_json(&s.uri("ro"))["exports"][0];
    assert_eq!(ro["is_read_only"], true, "{ro}");
    assert_eq!(ro["export-size"], MIB);
}

#[test]
fn qemu_img_convert_in_and_out_preserves_the_checksum() {
    let qemu_img = require("qemu-img", "qemu-utils");
    let s = Surge::start(&["--export", "d=file:d.img,create=24MiB"]);
    let src = s.path("src.raw");
    random_file(&src, 24 * MIB as usize);
    run_ok(Command::new(&qemu_img).args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(s.uri("d")));
    let back = s.path("back.raw");
    run_ok(Command::new(&qemu_img).args(["convert", "-f", "raw", "-O", "raw"]).arg(s.uri("d")).arg(&back));
    assert_eq!(sha256(&src), sha256(&back));
    assert_eq!(sha256(&src), sha256(&s.path("d.img")), "the served file holds the data");
}

fn qemu_io(uri: &str, cmds: &[&str]) -> std::process::Output {
    let mut c = Command::new(require("qemu-io", "qemu-utils"));
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    run(c.arg(uri))
}

#[test]
fn qemu_io_patterns_survive_write_read_discard_and_zero() {
    let s = Surge::start(&["--export", "d=file:d.img,create=8MiB"]);
    let uri = s.uri("d");
    let ok = |cmds: &[&str]| {
        let out = qemu_io(&uri, cmds);
        assert!(out.status.success(), "{cmds:?}: {}{}", text(&out.stdout), text(&out.stderr));
    };
    ok(&["write -P 0xab 0 1M", "read -P 0xab 0 1M", "write -P 0x5c 3M 64k", "flush"]);
    // A new connection sees the data; a wrong pattern must fail.
    ok(&["read -P 0xab 0 1M", "read -P 0x5c 3M 64k", "read -P 0 1M 2M"]);
    let wrong = qemu_io(&uri, &["read -P 0xcd 0 1M"]);
    assert!(!wrong.status.success(), "a wrong pattern passed: {}", text(&wrong.stdout));
    assert!(text(&wrong.stdout).contains("Pattern verification failed"));
    // Zeroes (with and without permission to punch) and discard of a file read back as zero.
    ok(&["write -z 0 64k", "read -P 0 0 64k", "read -P 0xab 64k 960k"]);
    ok(&["write -z -u 128k 128k", "read -P 0 128k 128k"]);
    ok(&["discard 3M 64k", "read -P 0 3M 64k"]);
    ok(&["write -f -P 0x11 7M 4k", "read -P 0x11 7M 4k"]);
}

#[test]
fn nbdcopy_copies_in_and_out_over_several_connections() {
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    let s = Surge::start(&["--export", "d=file:d.img,create=32MiB"]);
    let src = s.path("src.raw");
    random_file(&src, 32 * MIB as usize);
    run_ok(Command::new(&nbdcopy).args(["--connections=4", "--flush"]).arg(&src).arg(s.uri("d")));
    let back = s.path("back.raw");
    run_ok(Command::new(&nbdcopy).arg(s.uri("d")).arg(&back));
    assert_eq!(sha256(&src), sha256(&back));
}

#[test]
fn fio_nbd_engine_verifies_crc32c_over_two_connections() {
    let fio = require("fio", "fio");
    let s = Surge::start(&["--export", "d=file:d.img,create=64MiB"]);
    // Two jobs, each its own NBD connection, on disjoint halves of the export.
    let out = run_ok(
        Command::new(fio)
            .current_dir(s.dir.path()) // fio writes verify state files into its cwd
            .args(["--name=half", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--iodepth=16"])
            .args(["--size=32M", "--numjobs=2", "--offset_increment=32M", "--verify=crc32c"])
            .args(["--verify_fatal=1", "--output-format=json"])
            .arg(format!("--output={}", s.path("fio.json").display()))
            .arg(format!("--uri={}", s.uri("d"))),
    );
    let json = std::fs::read(s.path("fio.json")).unwrap();
    let r: serde_json::Value =
        serde_json::from_slice(&json).unwrap_or_else(|e| panic!("fio json: {e}: {}{}", text(&json), text(&out.stderr)));
    let jobs = r["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        assert_eq!(j["error"], 0, "{j}");
        assert_eq!(j["write"]["io_bytes"], 32 * MIB, "each job wrote its half");
        assert_eq!(j["read"]["io_bytes"], 32 * MIB, "each job verified its half");
    }
    // Both connections were live at once, as the server saw them.
    let st: serde_json::Value = serde_json::from_slice(&s.client(&["status", "--json"]).stdout).unwrap();
    assert!(st[0]["status"]["connections"]["total"].as_u64().unwrap() >= 2, "{st}");
}

#[test]
fn out_of_range_read_gets_einval_and_the_connection_keeps_working() {
    let s = Surge::start(&["--export", "d=memory:1MiB"]);
    let script = format!(
        r#"
import errno
h.set_strict_mode(0)
h.connect_uri("{uri}")
h.pwrite(b"\x42" * 4096, 8192)
try:
    h.pread(4096, 1048576 - 1024)
    raise SystemExit("out-of-range read succeeded")
except nbd.Error as e:
    assert e.errno in (errno.EINVAL, "EINVAL"), (e.errno, e.string)
assert h.pread(4096, 8192) == b"\x42" * 4096
print("connection still good")
"#,
        uri = s.uri("d")
    );
    let out = run_ok(nbdsh().arg("-c").arg(script));
    assert!(text(&out.stdout).contains("connection still good"));
}

/// A kernel block device over surge: nbdfuse exposes the export as a file, a
/// loop device makes it a block device, ext4 goes on top.
#[test]
fn ext4_on_a_loop_device_over_nbdfuse_checks_clean() {
    let nbdfuse = require("nbdfuse", "nbdfuse");
    let losetup = require("losetup", "util-linux");
    let mkfs = require("mkfs.ext4", "e2fsprogs");
    let e2fsck = require("e2fsck", "e2fsprogs");
    require("fusermount3", "fuse3");
    let s = Surge::start(&["--export", "d=file:d.img,create=64MiB"]);
    let fuse_dir = s.path("fuse");
    let mnt = s.path("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let pidfile = s.path("nbdfuse.pid");
    let _fuse = Mounted::fuse(Command::new(nbdfuse).arg("-P").arg(&pidfile).arg(&fuse_dir).arg(s.uri("d")), &fuse_dir, &pidfile);
    let loopdev = text(&run_ok(Command::new(&losetup).args(["-f", "--show"]).arg(fuse_dir.join("nbd"))).stdout).trim().to_string();
    let _loop = Detach(losetup.clone(), loopdev.clone());
    run_ok(Command::new(&mkfs).args(["-q", "-F"]).arg(&loopdev));
    {
        run_ok(Command::new("mount").arg(&loopdev).arg(&mnt));
        let _m = Unmount(mnt.clone());
        for i in 0..8 {
            let mut data = vec![i as u8; 512 * 1024];
            data[..8].copy_from_slice(&(i as u64).to_le_bytes());
            std::fs::write(mnt.join(format!("f{i}")), &data).unwrap();
        }
        run_ok(&mut Command::new("sync"));
    }
    let out = run(Command::new(&e2fsck).arg("-fn").arg(&loopdev));
    assert!(out.status.success(), "e2fsck -fn found problems:\n{}{}", text(&out.stdout), text(&out.stderr));
    // Remount read-only and read the files back.
    run_ok(Command::new("mount").args(["-o", "ro"]).arg(&loopdev).arg(&mnt));
    let _m = Unmount(mnt.clone());
    for i in 0..8u8 {
        let data = std::fs::read(mnt.join(format!("f{i}"))).unwrap();
        assert_eq!(data.len(), 512 * 1024);
        assert!(data[8..].iter().all(|&b| b == i), "file f{i} corrupted");
    }
}

struct Unmount(std::path::PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

struct Detach(std::path::PathBuf, String);
impl Drop for Detach {
    fn drop(&mut self) {
        let _ = Command::new(&self.0).arg("-d").arg(&self.1).status();
    }
}

/// nbdfuse in the background, unmounted (which ends it) on drop.
struct Mounted {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Mounted {
    fn fuse(cmd: &mut Command, dir: &std::path::Path, pidfile: &std::path::Path) -> Mounted {
        let mut child = cmd.stdin(std::process::Stdio::null()).spawn().expect("start nbdfuse");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !pidfile.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("nbdfuse exited early: {st}");
            }
            assert!(std::time::Instant::now() < deadline, "nbdfuse did not mount within 20 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Mounted { child, dir: dir.to_path_buf() }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.dir).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 10 item 1, with libnbd: after SIGTERM a connected client's next request
/// fails with ESHUTDOWN (not a dropped connection); its soft disconnect then lets
/// `surge serve` exit 0 without waiting out the grace period.
#[test]
fn libnbd_gets_eshutdown_after_sigterm_and_serve_exits_on_its_disconnect() {
    use std::io::{BufRead, Read, Write};
    use std::time::Duration;
    let mut s = Surge::start(&["--export", "d=memory:1MiB"]);
    let script = format!(
        r#"
import sys
h.connect_uri("{uri}")
h.pread(4096, 0)
print("ready", flush=True)
sys.stdin.readline()
try:
    h.pread(4096, 0)
    print("read ok", flush=True)
except nbd.Error as e:
    print("errno", e.errno, e.string, flush=True)
h.shutdown()
print("disconnected", flush=True)
"#,
        uri = s.uri("d")
    );
    let mut py = nbdsh()
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "nbdsh: {line}");
    s.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    py.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut all = String::new();
    out.read_to_string(&mut all).unwrap();
    let py = py.wait_with_output().unwrap();
    assert!(all.contains("errno ESHUTDOWN"), "libnbd saw: {all}\nstderr: {}", text(&py.stderr));
    assert!(all.contains("disconnected"), "{all}");
    let st = s.wait(Duration::from_secs(10));
    assert!(st.success(), "exit status {st}:\n{}", s.logs());
    // Not a time bound (a loaded machine can take longer than the 2 s grace
    // to run the client): the server says when it waited the grace out.
    let logs = s.logs();
    assert!(logs.contains("shutting down"), "serve's log is read:\n{logs}");
    assert!(!logs.contains(surge_nbd::GRACE_OVER), "serve waited out the grace period after the client left ({:?}):\n{logs}", t0.elapsed());
}
