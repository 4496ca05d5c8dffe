//! The `surge` command line: defaults, errors, status/set, signals.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn serve_with_no_arguments_prints_how_to_connect_and_serves_a_sparse_default() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let home = tempfile::Builder::new().prefix("surge-home").tempdir().unwrap();
    let data = home.path().join("xdg").join("surge");
    let mut cmd = Command::new(SURGE);
    cmd.arg("serve").env("HOME", home.path()).env("XDG_DATA_HOME", home.path().join("xdg"));
    let mut s = Surge::spawn(cmd, home, data.join("surge.sock"), data.join("control.sock"));
    let out = s.stdout();
    let uri = format!("nbd+unix:///default?socket={}", data.join("surge.sock").display());
    assert!(out.contains(&format!("nbdinfo '{uri}'")), "{out}");
    assert!(out.contains(&format!("qemu-img info '{uri}'")), "{out}");
    assert!(out.contains("nbdfuse") && out.contains("losetup"), "{out}");

    let info = run_ok(Command::new(nbdinfo).arg("--size").arg(&uri));
    assert_eq!(text(&info.stdout).trim(), (1u64 << 30).to_string());
    let meta = std::fs::metadata(data.join("default.img")).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) < 2048, "default.img should be sparse");

    s.signal(libc::SIGINT);
    assert!(s.wait(Duration::from_secs(20)).success(), "{}", s.logs());
    assert!(!data.join("surge.sock").exists(), "socket removed at exit");
}

#[test]
fn tcp_listeners_serve_the_same_exports_as_the_unix_socket() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let port = free_port();
    let s = Surge::start(&["--listen", &format!("tcp:127.0.0.1:{port}"), "--export", "d=memory:3MiB"]);
    assert!(s.stdout().contains(&format!("nbdinfo 'nbd://127.0.0.1:{port}/d'")), "{}", s.stdout());
    let out = run_ok(Command::new(nbdinfo).arg("--size").arg(format!("nbd://127.0.0.1:{port}/d")));
    assert_eq!(text(&out.stdout).trim(), (3u64 << 20).to_string());
}

fn serve_fails(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(SURGE).arg("serve").arg("--data-dir").arg(dir.path()).args(args));
    assert!(!out.status.success(), "surge serve {args:?} should fail");
    text(&out.stderr)
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    assert!(serve_fails(&["--export", "disk"]).contains("NAME=KIND:ARGS"));
    assert!(serve_fails(&["--export", "d=memory:12XB"]).contains("unknown unit"));
    assert!(serve_fails(&["--export", "d=tape:1G"]).contains("known kinds: file, memory"));
    assert!(serve_fails(&["--export", "d=file:/nonexistent/x.img"]).contains("create=SIZE"));
    assert!(serve_fails(&["--listen", "tcp:0.0.0.0:10809", "--export", "d=memory:1M"]).contains("--insecure"));
    assert!(serve_fails(&["--export", "d=memory:1M", "--read-only", "e"]).contains("no such export"));
    assert!(serve_fails(&["--config", "/nonexistent.toml"]).contains("/nonexistent.toml"));
}

#[test]
fn a_live_socket_is_not_stolen_and_a_regular_file_is_not_deleted() {
    let s = Surge::start(&["--export", "d=memory:1MiB"]);
    let err = serve_fails(&["--listen", &format!("unix:{}", s.sock.display()), "--export", "d=memory:1M"]);
    assert!(err.contains("already listening"), "{err}");
    let file = s.path("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    let err = serve_fails(&["--listen", &format!("unix:{}", file.display()), "--export", "d=memory:1M"]);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let control = dir.path().join("control.sock");
    let mut cmd = Command::new(SURGE);
    cmd.arg("serve").arg("--data-dir").arg(dir.path()).arg("--listen").arg(format!("unix:{}", sock.display()));
    cmd.arg("--export").arg("d=memory:1M");
    let _s = Surge::spawn(cmd, dir, sock, control);
}

#[test]
fn status_shows_size_kind_io_counters_and_connections() {
    let s = Surge::start(&["--export", "disk=file:d.img,create=4MiB", "--export", "m=memory:2MiB", "--read-only", "m"]);
    let qemu_io = require("qemu-io", "qemu-utils");
    run_ok(Command::new(qemu_io).args(["-f", "raw", "-c", "write -P 1 0 64k", "-c", "read 0 4k"]).arg(s.uri("disk")));

    let out = s.client(&["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let disk = &st[0];
    assert_eq!(disk["name"], "disk");
    assert_eq!(disk["kind"], "export");
    assert_eq!(disk["status"]["kind"], "file");
    assert_eq!(disk["status"]["size_bytes"], 4 << 20);
    assert_eq!(disk["status"]["io"]["write_bytes"], 64 << 10);
    assert!(disk["status"]["io"]["reads"].as_u64().unwrap() >= 1);
    assert_eq!(disk["status"]["connections"]["total"], 1);
    assert_eq!(st[1]["name"], "m");
    assert_eq!(st[1]["status"]["read_only"], true);

    let human = text(&s.client(&["status"]).stdout);
    assert!(human.contains("disk (export)") && human.contains("size_bytes: 4194304 (4.0 MiB)"), "{human}");
    assert!(human.contains("write_bytes: 65536 (64.0 KiB)"), "{human}");
}

#[test]
fn set_reports_unknown_targets_and_settings() {
    let s = Surge::start(&["--export", "d=memory:1MiB"]);
    let out = s.client(&["set", "nope", "a=b"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no target named \"nope\""), "{}", text(&out.stderr));
    let out = s.client(&["set", "d", "weight=4"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no setting \"weight\""), "{}", text(&out.stderr));
    let out = s.client(&["set", "d", "weight"]);
    assert!(text(&out.stderr).contains("KEY=VALUE"));
}

#[test]
fn status_without_a_server_says_how_to_find_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(SURGE).args(["status", "--control"]).arg(dir.path().join("none.sock")));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is `surge serve` running"), "{}", text(&out.stderr));
}

/// SIGTERM while a client writes: exit 0, and every write the client saw
/// acknowledged is in the file afterwards.
#[test]
fn sigterm_during_writes_exits_zero_and_keeps_every_acknowledged_write() {
    let mut s = Surge::start(&["--export", "d=file:d.img,create=64MiB"]);
    let script = format!(
        r#"
import sys
h.connect_uri("{uri}")
for i in range(16384):
    h.pwrite(bytes([i % 251 + 1]) * 4096, i * 4096)
    print(i, flush=True)
"#,
        uri = s.uri("d")
    );
    let mut writer = nbdsh()
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = writer.stdout.take().unwrap();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    let sink = acked.clone();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l.trim().parse().unwrap());
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < 200 {
        assert!(std::time::Instant::now() < deadline, "writer made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.signal(libc::SIGTERM);
    let st = s.wait(Duration::from_secs(30));
    assert!(st.success(), "exit status {st}:\n{}", s.logs());
    let _ = writer.wait();
    reader.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() < 16384, "the writer should have been cut off by the shutdown");
    let img = std::fs::read(s.path("d.img")).unwrap();
    for &i in &acked {
        let block = &img[i * 4096..(i + 1) * 4096];
        assert!(block.iter().all(|&b| b == (i % 251 + 1) as u8), "acknowledged block {i} lost");
    }
    assert!(s.logs().contains("shutting down"), "{}", s.logs());
}

#[test]
fn help_explains_specs_and_gives_examples() {
    let out = run_ok(Command::new(SURGE).args(["serve", "--help"]));
    let h = text(&out.stdout);
    for want in ["--listen", "--export", "memory:SIZE", "create=SIZE", "--read-only", "SIGTERM", "Examples:", "--insecure"] {
        assert!(h.contains(want), "serve --help lacks {want:?}");
    }
}

/// Issue 10 item 12: SIGTERM ends `surge serve` in bounded time even after its
/// data directory (with the control and NBD sockets in it) was removed.
#[test]
fn sigterm_ends_serve_even_after_its_data_dir_was_removed() {
    let mut s = Surge::start(&["--export", "m=memory:1MiB"]);
    let client = std::os::unix::net::UnixStream::connect(&s.sock).unwrap();
    std::fs::remove_dir_all(s.dir.path()).unwrap();
    s.signal(libc::SIGTERM);
    let st = s.wait(Duration::from_secs(15));
    assert!(st.success(), "exit status {st}");
    drop(client);
}
