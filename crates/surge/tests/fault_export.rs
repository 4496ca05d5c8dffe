//! The `fault` export kind end to end: injected errors reach an NBD client with
//! the right errno, a failed write changes nothing, and rules change live
//! through `surge set` while `surge status` counts what was injected.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use surge_nbd::client::{Client, ClientOptions};
use surge_nbd::proto::{EIO, ENOSPC};

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn surge(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_surge")).args(args).arg("--control").arg(dir.join("c.sock")).output().unwrap()
}

#[test]
fn injected_errors_reach_the_client_and_rules_change_live() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let _serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_surge"))
            .args(["--log", "warn", "serve", "--data-dir"])
            .arg(dir.path())
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(dir.path().join("c.sock"))
            .args(["--pool", "base=memory:1MiB", "--export", "d=fault:base,write.fail_nth=2,write.errno=enospc"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let opts = ClientOptions { export: "d".into(), ..ClientOptions::default() };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = loop {
        match Client::connect_unix(&sock, &opts) {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => panic!("serve did not come up: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // serve binds the NBD socket before the control socket.
    while !dir.path().join("c.sock").exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.write(0, &[1; 4096], false).unwrap();
    let e = c.write(4096, &[2; 4096], false).unwrap_err();
    assert_eq!(e.errno(), Some(ENOSPC), "{e}");
    let mut buf = vec![0xAAu8; 4096];
    c.read(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 4096], "the failed write must not land");
    c.write(4096, &[3; 4096], false).unwrap();

    let out = surge(dir.path(), &["set", "fault/base", "rules=read.fail_every=1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.read(0, &mut buf).unwrap_err().errno(), Some(EIO));
    let out = surge(dir.path(), &["set", "fault/base", "read.fail_every=0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.read(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![3; 4096]);

    let out = surge(dir.path(), &["status", "--json"]);
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && status.contains("fault/base"), "{status}");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let fault = find(&v, "fault/base").unwrap_or_else(|| panic!("no fault/base in {status}"));
    assert_eq!(fault["status"]["injected"]["write"], 1, "{fault}");
    assert_eq!(fault["status"]["injected"]["read"], 1, "{fault}");
    assert!(fault["status"]["ops"]["write"].as_u64().unwrap() >= 3);
}

/// The status entry named `name`, wherever the JSON nests it.
fn find<'a>(v: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) if m.get("name").and_then(|n| n.as_str()) == Some(name) => Some(v),
        serde_json::Value::Object(m) => m.values().find_map(|x| find(x, name)),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, name)),
        _ => None,
    }
}
