//! The bucket as other tools see it (issue 41 item 6): export keys are the
//! files' UTF-8 paths, directories have marker objects (`dir/`), and a cold
//! import of the bucket alone gives back the same tree. Real redis-server,
//! real S3 server (moto), `surge bb node`/`mount` processes, the bucket read
//! with boto3.

mod bb_support;

use bb_support::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Every key of the bucket outside `.surge/`, as boto3 (an ordinary S3 client) lists it.
fn boto3_keys(bb: &Bb) -> Vec<String> {
    let script = r#"
import boto3, json, sys
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
keys = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[2]):
    keys += [o["Key"] for o in page.get("Contents", [])]
print(json.dumps(keys))
"#;
    let out = Command::new("python3").args(["-c", script, &bb.endpoint, &bb.bucket]).output().expect("python3");
    assert!(out.status.success(), "boto3 listing: {}", String::from_utf8_lossy(&out.stderr));
    let mut keys: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    keys.retain(|k| !k.starts_with(".surge/"));
    keys.sort();
    keys
}

fn boto3_get(bb: &Bb, key: &str) -> Vec<u8> {
    let script = r#"
import boto3, sys
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
sys.stdout.buffer.write(s3.get_object(Bucket=sys.argv[2], Key=sys.argv[3])["Body"].read())
"#;
    let out = Command::new("python3").args(["-c", script, &bb.endpoint, &bb.bucket, key]).output().expect("python3");
    assert!(out.status.success(), "boto3 get {key:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Waits until the bucket's keys are exactly `want`.
fn wait_keys(bb: &Bb, want: &[String], timeout: Duration) {
    let start = Instant::now();
    loop {
        let got = boto3_keys(bb);
        if got == want {
            return;
        }
        assert!(start.elapsed() < timeout, "bucket keys after {timeout:?}:\n got  {got:?}\n want {want:?}\n{}", bb.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The tree below `root`: relative path -> file contents (None: a directory).
fn tree(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_str().expect("UTF-8 names").to_string();
            if e.file_type().unwrap().is_dir() {
                out.insert(rel, None);
                stack.push(e.path());
            } else {
                out.insert(rel, Some(fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}

const FILES: &[&str] = &[
    "a b/c+d=e&f?.bin",
    "ünï/cödé.bin",
    "%41.txt",
    "x#y",
    "%0A literally",
    "line\nbreak",
    "nested/deep/er/f.txt",
    "日本/語 ファイル.txt",
];
const DIRS: &[&str] = &["a b", "ünï", "nested", "nested/deep", "nested/deep/er", "nested/empty", "empty", "日本"];

/// Files and directories with non-ASCII names, spaces and reserved
/// characters, nested and empty directories: after write-back the bucket
/// holds exactly their UTF-8 paths (control characters and a `%` that would
/// read as an escape percent-encoded) and a `dir/` marker per directory,
/// which goes with the directory; a cold import of the bucket alone (a fresh
/// Redis) shows the same tree, the same names and contents.
#[test]
fn export_keys_are_utf8_paths_with_dir_markers_and_a_cold_import_restores_the_tree() {
    require("python3");
    let bb = Bb::new("keys", "64KiB");
    let _nodes: Vec<Node> = (0..2).map(|_| bb.node(&[])).collect();
    let mut m = bb.mount("m", &[]);
    let mut want_tree = BTreeMap::new();
    for d in DIRS {
        fs::create_dir(m.dir.join(d)).unwrap();
        want_tree.insert(d.to_string(), None);
    }
    for (i, f) in FILES.iter().enumerate() {
        let data = pattern(i as u64 + 1, 1000 + 70_000 * (i % 3));
        fs::write(m.dir.join(f), &data).unwrap();
        want_tree.insert(f.to_string(), Some(data));
    }
    // A directory removed again takes its marker with it.
    fs::create_dir(m.dir.join("gone")).unwrap();
    let mut want: Vec<String> = [
        "a b/",
        "a b/c+d=e&f?.bin",
        "ünï/",
        "ünï/cödé.bin",
        "%41.txt",
        "x#y",
        "%250A literally",
        "line%0Abreak",
        "nested/",
        "nested/deep/",
        "nested/deep/er/",
        "nested/deep/er/f.txt",
        "nested/empty/",
        "empty/",
        "日本/",
        "日本/語 ファイル.txt",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    want.sort();
    let mut with_gone = want.clone();
    with_gone.push("gone/".into());
    with_gone.sort();
    wait_keys(&bb, &with_gone, Duration::from_secs(60));
    fs::remove_dir(m.dir.join("gone")).unwrap();
    wait_keys(&bb, &want, Duration::from_secs(60));
    m.unmount();
    bb.wait_persisted("/", Duration::from_secs(60));
    assert_eq!(boto3_keys(&bb), want);
    assert_eq!(boto3_get(&bb, "ünï/cödé.bin"), *want_tree["ünï/cödé.bin"].as_ref().unwrap());
    assert_eq!(boto3_get(&bb, "a b/c+d=e&f?.bin"), *want_tree["a b/c+d=e&f?.bin"].as_ref().unwrap());
    assert!(boto3_get(&bb, "nested/empty/").is_empty(), "a marker is an empty object");

    // A cold import: another buffer (its own Redis, nodes and mount) on the same bucket.
    let mut cold = Bb::new("keys-cold", "64KiB");
    cold.bucket = bb.bucket.clone();
    let _cold_nodes: Vec<Node> = (0..2).map(|_| cold.node(&[])).collect();
    let c = cold.mount("c", &["--import"]);
    let got = tree(&c.dir);
    let names = |t: &BTreeMap<String, Option<Vec<u8>>>| t.iter().map(|(k, v)| (k.clone(), v.is_none())).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want_tree), "the imported tree (path, is a directory)");
    for (path, data) in &want_tree {
        assert!(got[path] == *data, "{path:?}: imported contents differ");
    }
}

/// A bucket written by surge before UTF-8 keys (names percent-encoded by
/// object_store's `PathPart`, manifests, no `.surge/layout.json`) imports
/// with its names decoded; a file written since under a UTF-8 key in the
/// same bucket keeps its name.
#[test]
fn a_bucket_written_by_older_surge_imports_with_its_names_decoded() {
    let bb = Bb::new("legacy", "64KiB");
    let s3 = bb.s3();
    s3.put("%C3%BCn%C3%AF/c%C3%B6d%C3%A9.bin", b"old".to_vec().into()).unwrap();
    s3.put("x%23y", b"hash".to_vec().into()).unwrap();
    s3.put("100%25", b"percent".to_vec().into()).unwrap();
    s3.put("%41.txt", b"not an escape".to_vec().into()).unwrap();
    s3.put(".surge/manifests/2/00000000000000000001.json", b"{}".to_vec().into()).unwrap();
    let _nodes: Vec<Node> = (0..1).map(|_| bb.node(&[])).collect();
    let m = bb.mount("m", &["--import"]);
    let got = tree(&m.dir);
    let want: BTreeMap<String, Option<Vec<u8>>> = [
        ("ünï", None),
        ("ünï/cödé.bin", Some(&b"old"[..])),
        ("x#y", Some(b"hash")),
        ("100%", Some(b"percent")),
        ("%41.txt", Some(b"not an escape")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.map(|v| v.to_vec())))
    .collect();
    assert_eq!(got, want);
}
