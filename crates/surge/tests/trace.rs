//! Recording through `surge serve` with a real client (qemu-io over NBD),
//! reading the trace back, importing blkparse text, and planning on both.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;
use surge_trace::{Op, Trace};

fn qemu_io(uri: &str, cmds: &[&str]) {
    let mut c = Command::new(require("qemu-io", "qemu-utils"));
    // Writeback: plain writes carry no FUA, so `write -f` is told apart.
    c.args(["-f", "raw", "-t", "writeback"]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    run_ok(c.arg(uri));
}

/// `want` appears in `got` in order (a client may add requests of its own, e.g. a flush at close).
fn in_order(got: &[(Op, u64, u64, bool)], want: &[(Op, u64, u64, bool)]) -> bool {
    let mut it = got.iter();
    want.iter().all(|w| it.any(|g| g == w))
}

fn plan_json(trace: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let out = run_ok(Command::new(SURGE).args(["plan", "workload", "--trace"]).arg(trace).args(["--json", "--instance", "m5.2xlarge"]).args(extra));
    serde_json::from_slice(&out.stdout).expect("plan JSON")
}

#[test]
fn a_recorded_export_holds_what_qemu_io_sent_and_plans() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec");
    let rec_s = format!("d={}", rec.display());
    let mut s = Surge::start(&["--export", "d=file:d.img,create=64MiB", "--export", "other=memory:8MiB", "--record", &rec_s]);
    let uri = s.uri("d");
    qemu_io(&uri, &["write -P 1 0 64k", "write -f -P 2 1M 4k", "read -P 1 0 64k", "read 2M 128k", "flush", "discard 4M 64k", "write -z 8M 1M"]);
    qemu_io(&s.uri("other"), &["write -P 3 0 4k"]);
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(30)).success(), "{}", s.logs());

    let t = Trace::open(&rec).unwrap();
    assert!(!t.truncated && t.dropped == 0, "a clean stop closes the trace: {t:?}");
    assert_eq!(t.header.name, "d");
    assert_eq!(t.header.device_size, 64 << 20);
    let got: Vec<(Op, u64, u64, bool)> = t.records.iter().map(|r| (r.op, r.offset, r.len, r.fua)).collect();
    let want = [
        (Op::Write, 0, 65536, false),
        (Op::Write, 1 << 20, 4096, true),
        (Op::Read, 0, 65536, false),
        (Op::Read, 2 << 20, 131072, false),
        (Op::Flush, 0, 0, false),
        (Op::Trim, 4 << 20, 65536, false),
        (Op::Zero, 8 << 20, 1 << 20, false),
    ];
    assert!(in_order(&got, &want), "trace {got:?}\nmissing or out of order: {want:?}");
    assert!(!got.contains(&(Op::Write, 0, 4096, false)), "the other export's write is not in d's trace: {got:?}");
    assert!(t.records.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));

    let show = run_ok(Command::new(SURGE).args(["trace", "show"]).arg(&rec).arg("--svg").arg(dir.path().join("p.svg")));
    let show = text(&show.stdout);
    assert!(show.contains("writes") && show.contains("sequential"), "{show}");
    let svg = std::fs::read_to_string(dir.path().join("p.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"), "an SVG with lines");

    let svg = dir.path().join("plan.svg");
    let p = plan_json(&rec, &["--deadline", "1.05x", "--svg", svg.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("polyline"), "the timeline SVG has lines");
    let rows = p["rows"].as_array().unwrap();
    let rec_i = p["recommended"].as_u64().expect("a recommendation") as usize;
    assert!(rows[rec_i]["simulated"].as_bool().unwrap());
    assert!(p["serve_args"].as_str().unwrap().starts_with("--export app="));
    assert!(rows.iter().any(|r| r["why_lost"].as_str().is_some_and(|w| w.starts_with("not simulated yet"))));
    for k in ["gp2", "gp3", "io2", "st1"] {
        assert!(rows.iter().any(|r| r["name"] == k && r["completion_s"].as_f64().is_some()), "{k} simulated");
    }
}

#[test]
fn an_imported_blkparse_sample_plans_and_bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bp");
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/blkparse-sample.txt");
    run_ok(Command::new(SURGE).args(["trace", "import", "--format", "blkparse", sample, "--out"]).arg(&out));
    let t = Trace::open(&out).unwrap();
    // 5 reads, 3 writes (one FUA, after a preflush), 2 flushes: the Q events.
    assert_eq!(t.records.iter().filter(|r| r.op == Op::Read).count(), 5);
    assert_eq!(t.records.iter().filter(|r| r.op == Op::Write).count(), 3);
    assert_eq!(t.records.iter().filter(|r| r.op == Op::Flush).count(), 2);
    assert!(t.records.iter().any(|r| r.op == Op::Write && r.fua && r.offset == 4194304 * 512));
    let p = plan_json(&out, &[]);
    assert!(p["recommended"].as_u64().is_some());

    // Importing over an existing trace, or malformed text, fails with a reason.
    let again = run(Command::new(SURGE).args(["trace", "import", "--format", "blkparse", sample, "--out"]).arg(&out));
    assert!(!again.status.success() && text(&again.stderr).contains("already holds a trace"), "{}", text(&again.stderr));
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "8,0 1 1 0.1 5 Q R 12 + x [a]\n").unwrap();
    let e = run(Command::new(SURGE).args(["trace", "import", "--format", "blkparse"]).arg(&bad).arg("--out").arg(dir.path().join("x")));
    assert!(!e.status.success() && text(&e.stderr).contains("line 1"), "{}", text(&e.stderr));
}

/// fio through a recorded export, then a plan on the recording.
#[test]
fn a_fleet_of_an_imported_trace_reports_cost_volumes_and_api_calls_and_refuses_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bp");
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/blkparse-sample.txt");
    run_ok(Command::new(SURGE).args(["trace", "import", "--format", "blkparse", sample, "--out"]).arg(&out));
    let fleet = |extra: &[&str]| Command::new(SURGE).args(["sim", "fleet", "--trace"]).arg(&out).args(extra).output().unwrap();
    let o = fleet(&["--vms", "500", "--hours", "1", "--offsets", "aligned", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(f["figures"], "simulated on virtual time");
    let rows = f["rows"].as_array().unwrap();
    let gp3 = rows.iter().find(|r| r["name"] == "gp3").expect("a gp3 row");
    assert_eq!(gp3["api"]["CreateVolume"]["calls"], 500);
    assert!(gp3["api"]["CreateVolume"]["throttled"].as_u64().unwrap() > 0, "500 at once over a bucket of 200: {gp3}");
    assert_eq!(gp3["peak_volumes"], 500);
    // An hour of an m5.2xlarge per VM, at least.
    assert!(gp3["total_usd"].as_f64().unwrap() > 500.0 * 0.38, "{gp3}");
    assert!(f["cheapest"].as_u64().is_some() && f["wall_s"].as_f64().is_some() && f["peak_rss_kib"].as_u64().is_some());
    let table = fleet(&["--vms", "3", "--hours", "0.5"]);
    assert!(table.status.success() && text(&table.stdout).contains("<= cheapest per run"), "{}", text(&table.stdout));
    for (bad, why) in [(&["--offsets", "sometimes"][..], "aligned or random"), (&["--vms", "0"][..], "at least 1 VM")] {
        let e = fleet(bad);
        assert!(!e.status.success() && text(&e.stderr).contains(why), "{bad:?}: {}", text(&e.stderr));
    }
}

fn record_fio(rw: &str, bs: &str, qd: &str, size: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let fio = require("fio", "fio");
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec");
    let rec_s = format!("d={}", rec.display());
    let mut s = Surge::start(&["--export", "d=memory:1GiB", "--record", &rec_s]);
    run_ok(Command::new(fio).args(["--name=app", "--ioengine=nbd", &format!("--uri={}", s.uri("d")), &format!("--rw={rw}"), &format!("--bs={bs}"), &format!("--iodepth={qd}"), &format!("--size={size}"), "--runtime=2", "--time_based", "--rate_iops=20000", "--output=/dev/null"]));
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(30)).success(), "{}", s.logs());
    (dir, rec)
}

fn recommended_spec(p: &serde_json::Value) -> String {
    let i = p["recommended"].as_u64().expect("a recommendation") as usize;
    p["rows"][i]["spec"].as_str().unwrap().to_string()
}

#[test]
fn a_recorded_random_4k_fio_run_is_not_given_st1_and_a_sequential_one_not_io2() {
    // Random 4 KiB reads at up to 20,000 IOPS: st1 (500 IOPS) cannot keep up.
    let (_d, rec) = record_fio("randread", "4k", "32", "1g");
    let t = Trace::open(&rec).unwrap();
    let reads = t.records.iter().filter(|r| r.op == Op::Read && r.len == 4096).count();
    assert!(reads > 5_000 && t.records.iter().all(|r| r.op == Op::Flush || (r.op == Op::Read && r.len == 4096)), "{reads} reads of {}", t.records.len());
    let p = plan_json(&rec, &["--deadline", "1.05x"]);
    let spec = recommended_spec(&p);
    assert!(!spec.starts_with("st1") && !spec.starts_with("sc1"), "{spec}");
    let st1 = p["rows"].as_array().unwrap().iter().find(|r| r["name"] == "st1").unwrap();
    assert_eq!(st1["meets_deadline"], false, "{st1}");

    // 1 MiB sequential reads: throughput, not IOPS; io2 is never the cheapest.
    let (_d, rec) = record_fio("read", "1m", "4", "1g");
    let p = plan_json(&rec, &["--deadline", "1.05x"]);
    let spec = recommended_spec(&p);
    assert!(!spec.starts_with("io2"), "{spec}");
}

/// `surge set EXPORT record=on|off` through the control socket: only what
/// the export served while on is in each recording; a file export keeps its
/// zero-copy path while off, and every request is seen while on.
#[test]
fn recording_is_switched_on_and_off_on_a_running_daemon() {
    let mut s = Surge::start(&["--export", "d=file:d.img,create=64MiB"]);
    let uri = s.uri("d");
    let set = |kv: &[&str]| {
        let mut a = vec!["set", "d"];
        a.extend_from_slice(kv);
        s.client(&a)
    };
    let status = || -> serde_json::Value {
        let out = s.client(&["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        st.as_array().unwrap().iter().find(|t| t["name"] == "d").unwrap()["status"]["record"].clone()
    };
    assert_eq!(status()["on"], false);
    // Off: not recorded (1 MiB writes and reads take the zero-copy path when it is open).
    qemu_io(&uri, &["write -P 1 0 1M", "read 0 1M"]);
    let r1 = s.path("r1");
    let r1_s = format!("record_dir={}", r1.display());
    let out = set(&[r1_s.as_str(), "record=on"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(status()["on"], true);
    assert_eq!(status()["dir"], r1.to_str().unwrap());
    qemu_io(&uri, &["write -P 2 4M 1M", "read 4M 1M", "write -f 8M 4k"]);
    let twice = set(&["record=on"]);
    assert!(!twice.status.success() && text(&twice.stderr).contains("already recording into"), "{}", text(&twice.stderr));
    let elsewhere = format!("record_dir={}", s.path("elsewhere").display());
    let moved = set(&[elsewhere.as_str()]);
    assert!(!moved.status.success() && text(&moved.stderr).contains("record=off first"), "{}", text(&moved.stderr));
    assert!(set(&["record=off"]).status.success());
    let st = status();
    assert_eq!(st["on"], false);
    assert!(st["last"]["stats"]["recorded"].as_u64().unwrap() >= 3, "{st}");
    qemu_io(&uri, &["write -P 3 12M 1M"]); // off again
    // On again without record_dir: a fresh directory under the data dir.
    assert!(set(&["record=on"]).status.success());
    let r2 = std::path::PathBuf::from(status()["dir"].as_str().unwrap());
    assert!(r2.starts_with(s.path("traces")), "{}", r2.display());
    qemu_io(&uri, &["read 16M 64k"]);
    let bad = set(&["record=maybe"]);
    assert!(!bad.status.success() && text(&bad.stderr).contains("on or off"), "{}", text(&bad.stderr));
    // The r1 directory holds a trace: a recording into it again is refused with a reason.
    assert!(set(&["record=off", r1_s.as_str()]).status.success());
    let again = set(&["record=on"]);
    assert!(!again.status.success() && text(&again.stderr).contains("record_dir="), "{}", text(&again.stderr));
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(30)).success(), "{}", s.logs());

    let shapes = |t: &Trace| -> Vec<(Op, u64, u64, bool)> { t.records.iter().filter(|r| r.op != Op::Flush).map(|r| (r.op, r.offset, r.len, r.fua)).collect() };
    let t1 = Trace::open(&r1).unwrap();
    let got = shapes(&t1);
    assert!(in_order(&got, &[(Op::Write, 4 << 20, 1 << 20, false), (Op::Read, 4 << 20, 1 << 20, false), (Op::Write, 8 << 20, 4096, true)]), "{got:?}");
    assert!(got.iter().all(|r| r.1 >= 4 << 20 && r.1 < 12 << 20), "only what was served while on: {got:?}");
    let t2 = Trace::open(&r2).unwrap();
    assert_eq!(shapes(&t2), vec![(Op::Read, 16 << 20, 65536, false)]);
    assert!(!t1.truncated && !t2.truncated);
}

/// A trace of `n` random 4 KiB reads submitted over the first `over_ms`,
/// with a flush halfway, written as a trace directory.
fn synthetic_reads(dir: &std::path::Path, n: u64, over_ms: u64) -> std::path::PathBuf {
    use surge_trace::{Header, Limits, Rec, SegmentWriter, Source};
    let path = dir.join("reads.trace");
    let mut h = Header::new(Source::SurgeRecord, "reads");
    h.device_size = 1 << 30;
    let mut w = SegmentWriter::create(&path, h, Limits { segment_bytes: 64 << 20, max_bytes: u64::MAX }).unwrap();
    for i in 0..n {
        let t_ns = i * over_ms * 1_000_000 / n;
        w.push(&Rec { t_ns, op: Op::Read, offset: (i * 7919 % 250_000) * 4096, len: 4096, fua: false, dur_ns: 0 }).unwrap();
        if i == n / 2 {
            w.push(&Rec { t_ns, op: Op::Flush, offset: 0, len: 0, fua: false, dur_ns: 0 }).unwrap();
        }
    }
    w.finish().unwrap();
    path
}

#[test]
fn a_real_replay_on_gp3_is_held_back_to_the_time_the_plan_predicts() {
    // 6,000 random 4 KiB reads asked for in 0.5 s: gp3's 3,000 IOPS make it about 2 s,
    // in the plan (virtual time) and in the daemon (real time), through the same pacing.
    let dir = tempfile::tempdir().unwrap();
    let trace = synthetic_reads(dir.path(), 6_000, 500);
    let p = plan_json(&trace, &[]);
    let row = p["rows"].as_array().unwrap().iter().find(|r| r["name"] == "gp3").expect("a gp3 row").clone();
    let predicted = row["completion_s"].as_f64().unwrap();
    assert!((1.8..2.3).contains(&predicted), "6,000 reads at 3,000 IOPS: {predicted} s");
    let spec = format!("app={}", row["spec"].as_str().unwrap());
    let mut s = Surge::start(&["--export", &spec, "--local-instance", "m5.2xlarge"]);
    let out = run_ok(Command::new(SURGE).args(["trace", "replay", "--trace"]).arg(&trace).arg(s.uri("app")).args(["--json", "--qd"]).arg(p["qd"].to_string()));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("replay JSON");
    assert_eq!(r["requests"], 6_001, "every read and the flush: {r}");
    let measured = r["completion_s"].as_f64().unwrap();
    // One-sided: the volume's throttle cannot be beaten, while a loaded
    // machine may always run late (the 10 % target is gated by the
    // experiment's CI step, `85-plan.sh`, not here).
    assert!(measured >= predicted * 0.97, "measured {measured} s, faster than the throttle's predicted {predicted} s: {r}");
    assert!(measured <= predicted * 3.0, "measured {measured} s against predicted {predicted} s: {r}");
    assert!(r["final_lag_s"].as_f64().unwrap() > 1.0, "the volume held the reads back: {r}");
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(30)).success(), "{}", s.logs());
}

#[test]
fn a_replay_refuses_an_export_smaller_than_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = synthetic_reads(dir.path(), 100, 10);
    let mut s = Surge::start(&["--export", "small=memory:64MiB"]);
    let out = Command::new(SURGE).args(["trace", "replay", "--trace"]).arg(&trace).arg(s.uri("small")).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("the trace reaches byte") && err.contains("at least as large"), "{err}");
    s.signal(libc::SIGTERM);
    assert!(s.wait(Duration::from_secs(30)).success(), "{}", s.logs());
}
