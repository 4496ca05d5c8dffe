//! `surge torture` end to end: real `surge serve` processes killed with SIGKILL.
//! The positive runs must find no loss; the broken device must be caught.

use std::process::Command;

fn torture(args: &[&str]) -> (bool, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_surge"))
        .args(["--log", "warn", "torture", "--json", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (out.status.success(), format!("{stdout}\n{stderr}"), report)
}

#[test]
fn file_export_survives_kill_restart_cycles() {
    let (ok, out, r) = torture(&["--export", "file:t.img,create=8MiB", "--cycles", "4", "--seed", "11", "--region", "4MiB"]);
    assert!(ok, "{out}");
    assert_eq!(r["cycles"], 4, "{out}");
    assert_eq!(r["kills"], 4);
    assert_eq!(r["losses"], 0);
    // 4 restarts + the initial check after formatting: 5 full reads of 4 MiB.
    assert_eq!(r["bytes_verified"], 5 * 4 * 1024 * 1024);
    assert!(r["writes_acked"].as_u64().unwrap() > 0 && r["flushes_acked"].as_u64().unwrap() > 0, "{out}");
}

#[test]
fn volatile_write_cache_loses_only_unflushed_writes() {
    // Writes sit in the server's memory until FLUSH: SIGKILL loses the unflushed
    // ones, which the checker must accept, and nothing else.
    let (ok, out, r) = torture(&[
        "--pool", "base=file:t.img,create=8MiB", "--export", "fault:base,volatile",
        "--cycles", "4", "--seed", "12", "--region", "4MiB",
    ]);
    assert!(ok, "{out}");
    assert_eq!(r["losses"], 0, "{out}");
}

#[test]
fn a_device_that_drops_flushes_is_caught() {
    let (ok, out, r) = torture(&[
        "--pool", "base=file:t.img,create=8MiB", "--export", "fault:base,volatile,flush.drop",
        "--cycles", "3", "--seed", "13", "--region", "4MiB", 
    ]);
    assert!(!ok, "torture must fail on a device that lies about flushes:\n{out}");
    assert!(out.contains("lost acknowledged data"), "{out}");
    assert!(r["losses"].as_u64().unwrap() > 0, "{out}");
    assert!(!r["loss_examples"].as_array().unwrap().is_empty());
}

#[test]
fn bad_spec_is_a_clear_error() {
    let (ok, out, _) = torture(&["--export", "nosuch:x", "--cycles", "1"]);
    assert!(!ok);
    assert!(out.contains("unknown export kind"), "{out}");
}

#[test]
fn injected_write_and_flush_errors_are_never_counted_as_acknowledged() {
    // Failed writes leave their blocks unspecified and failed flushes make
    // nothing stable: the checker must accept both, and the errors must be seen.
    let (ok, out, r) = torture(&[
        "--pool", "base=file:t.img,create=8MiB",
        "--export", "fault:base,volatile,write.fail_prob=0.01,flush.fail_prob=0.05,tear_nth=300,seed=3",
        "--cycles", "4", "--seed", "14", "--region", "4MiB",
    ]);
    assert!(ok, "{out}");
    assert_eq!(r["losses"], 0, "{out}");
    assert!(r["request_errors"].as_u64().unwrap() > 10, "{out}");
}
