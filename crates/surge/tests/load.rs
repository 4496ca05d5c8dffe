//! `surge load`, the load generator experiments run as their application:
//! its own process, over NBD, against a running `surge serve`.

mod common;
use common::*;
use std::process::Command;

fn load(args: &[&str]) -> std::process::Output {
    run(Command::new(SURGE).args(["--log", "warn", "load"]).args(args))
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "surge load failed ({}):\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

#[test]
fn bursts_of_random_writes_with_think_time_are_verified_and_reported_like_fio() {
    let s = Surge::start(&["--export", "m=memory:64MiB"]);
    let out = load(&[
        &format!("--uri={}", s.uri("m")),
        "--rw=randwrite",
        "--bs=4k/70:8k/20:16k/10",
        "--iodepth=16",
        "--size=4MiB",
        "--burst-ios=500",
        "--bursts=3",
        "--think=300ms",
        "--start-delay=200ms",
        "--flush-each-burst",
        "--verify",
        "--output-format=json",
        "--group-reporting",
    ]);
    let j = json(&out);
    let job = &j["jobs"][0];
    let w = &job["write"];
    assert_eq!(w["total_ios"], 1500, "{w}");
    assert!(w["io_bytes"].as_u64().unwrap() >= 1500 * 4096);
    assert!(w["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    assert_eq!(job["read"]["total_ios"], 0);
    let b = job["surge"]["bursts"].as_array().unwrap();
    assert_eq!(b.len(), 3);
    assert!(b[0]["start_s"].as_f64().unwrap() >= 0.2, "the first burst waits for --start-delay: {b:?}");
    for w in b.windows(2) {
        let gap = w[1]["start_s"].as_f64().unwrap() - w[0]["end_s"].as_f64().unwrap();
        assert!(gap >= 0.3, "each burst waits out the think time after the last: {gap}");
    }
    // Every byte of the written extents was read back (at least one request's worth).
    assert!(job["surge"]["verified_bytes"].as_u64().unwrap() >= 16 << 10, "{job}");
}

#[test]
fn verify_fails_when_the_volume_drops_writes() {
    let s = Surge::start(&["--pool", "base=memory:16MiB", "--export", "d=fault:base,write.drop"]);
    let out = load(&[&format!("--uri={}", s.uri("d")), "--rw=write", "--bs=64k", "--size=1MiB", "--verify"]);
    assert!(!out.status.success(), "dropped writes must fail --verify:\n{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("differs"), "{}", text(&out.stderr));
}

#[test]
fn sequential_jobs_each_write_their_own_region_over_tcp() {
    let port = free_port();
    let _s = Surge::start(&["--listen", &format!("tcp:127.0.0.1:{port}"), "--export", "m=memory:16MiB"]);
    let uri = format!("nbd://127.0.0.1:{port}/m");
    let j = json(&load(&[&format!("--uri={uri}"), "--rw=write", "--bs=256KiB", "--numjobs=2", "--iodepth=2", "--size=4MiB", "--offset-increment=8MiB", "--verify", "--output-format=json"]));
    let jobs = j["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "one figure per job without --group-reporting");
    for job in jobs {
        assert_eq!(job["write"]["io_bytes"], 4 << 20, "each job goes once through its region: {job}");
    }
    // A read pass over what was written, rate-limited: about 8 MiB/s for 0.5 s.
    let j = json(&load(&[&format!("--uri={uri}"), "--rw=read", "--bs=256KiB", "--size=8MiB", "--rate=8MiB/s", "--runtime=500ms", "--output-format=json"]));
    let r = &j["jobs"][0]["read"];
    let bytes = r["io_bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes <= 5 << 20, "the rate limit holds: {bytes} bytes in 0.5 s at 8 MiB/s");
}

#[test]
fn bad_arguments_get_a_clear_error() {
    let s = Surge::start(&["--export", "m=memory:1MiB"]);
    let out = load(&[&format!("--uri={}", s.uri("m")), "--size=2MiB"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("past the end of the export"), "{}", text(&out.stderr));
    let out = load(&["--uri=http://x/y"]);
    assert!(text(&out.stderr).contains("unknown scheme"), "{}", text(&out.stderr));
    let out = load(&[&format!("--uri={}", s.uri("m")), "--rw=read", "--verify"]);
    assert!(text(&out.stderr).contains("--verify checks what was written"), "{}", text(&out.stderr));
}
