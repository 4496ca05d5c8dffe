#!/usr/bin/env bash
# Issue 12 (burst buffer): a one-machine burst buffer (redis-server, the moto
# S3 server, 3 I/O nodes, a FUSE mount). Build a tree through the mount (untar
# a source tarball, write large files), unmount, wait for write-back, then
# verify every byte of every file straight from the S3 server (boto3, not
# surge), and that `surge bb status` reports everything persisted.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
BIN=$(realpath "$BIN")
start=$(date +%s)
W=$(mktemp -d /tmp/surge-bb.XXXXXX)
PIDS=()
. "$REPO/scripts/lib/bb-local.sh"
trap bb_cleanup EXIT
bb_start_moto
export SURGE_BB_BUCKET=surge-bb-ci
python3 - <<PY
import boto3
boto3.client("s3", endpoint_url="$SURGE_BB_S3_ENDPOINT").create_bucket(Bucket="$SURGE_BB_BUCKET")
PY

bb_start_redis "$BIN" "$W/redis"
for i in 1 2 3; do
  "$BIN" --log warn bb node --listen 127.0.0.1:0 --memory 512MiB >"$W/node$i.addr" 2>"$W/node$i.log" &
  PIDS+=($!)
done
mkdir -p "$W/mnt"
"$BIN" --log warn bb mount "$W/mnt" 2>"$W/mount.log" &
MOUNT=$!
PIDS+=($MOUNT)
for _ in $(seq 100); do mountpoint -q "$W/mnt" && break; sleep 0.1; done
mountpoint -q "$W/mnt" || { cat "$W/mount.log"; exit 1; }

# 1. A source tree: this repository's own sources as a tarball, untarred through the mount.
mkdir -p "$W/ref"
tar -C "$REPO" -czf "$W/src.tar.gz" --exclude=./target --exclude=./.git --exclude=./fuzz/target .
t0=$(date +%s.%N)
mkdir "$W/mnt/src"
tar -C "$W/mnt/src" -xzf "$W/src.tar.gz"
t1=$(date +%s.%N)
mkdir "$W/ref/src"
tar -C "$W/ref/src" -xzf "$W/src.tar.gz"
# 2. Large files: written with dd, read back through the mount and compared.
mkdir "$W/mnt/big" "$W/ref/big"
for i in 1 2; do
  head -c $((64 << 20)) /dev/urandom >"$W/ref/big/f$i"
done
t2=$(date +%s.%N)
for i in 1 2; do dd if="$W/ref/big/f$i" of="$W/mnt/big/f$i" bs=1M conv=fsync status=none; done
t3=$(date +%s.%N)
diff -r "$W/ref" "$W/mnt" >/dev/null || { echo "tree read back through the mount differs"; exit 1; }
files=$(find "$W/ref" -type f | wc -l)
python3 -c "print(f'untar of {$files} files: {$t1-$t0:.2f} s; 128 MiB of large files written at {128/($t3-$t2):.0f} MiB/s (dd, fsync)')"

# 3. Unmount, wait until everything is written back.
fusermount3 -u "$W/mnt"
wait "$MOUNT"
for _ in $(seq 300); do
  "$BIN" --log error bb status / --json >"$W/status.json" && python3 -c "
import json,sys; f=json.load(open('$W/status.json')); sys.exit(0 if f and all(x['persisted'] for x in f) else 1)" && break
  sleep 0.5
done
"$BIN" --log error bb status / | tail -1

# 4. Every byte, straight from the S3 server.
python3 - "$W/ref" "$W/status.json" <<'PY'
import boto3, hashlib, json, os, sys
ref, status = sys.argv[1], json.load(open(sys.argv[2]))
s3 = boto3.client("s3", endpoint_url=os.environ["SURGE_BB_S3_ENDPOINT"])
bucket = os.environ["SURGE_BB_BUCKET"]
assert all(f["persisted"] for f in status), [f["path"] for f in status if not f["persisted"]][:5]
n = nbytes = 0
standalone = set()
for root, _, names in os.walk(ref):
    for name in names:
        path = os.path.join(root, name)
        key = os.path.relpath(path, ref)
        want = open(path, "rb").read()
        got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        if hashlib.sha256(got).digest() != hashlib.sha256(want).digest():
            sys.exit(f"S3 object {key}: {len(got)} bytes, differs from the file written ({len(want)} bytes)")
        # Its manifest rides on the object (user metadata, as any S3 client
        # reads it) or, too big for S3's 2 KB of metadata, is an object of its own.
        man = s3.head_object(Bucket=bucket, Key=key)["Metadata"].get("surge-manifest")
        if man is None:
            standalone.add(key)
        else:
            man = json.loads(man)
            assert man["size"] == len(want), f"{key}: its manifest says {man['size']} bytes, the file has {len(want)}"
            assert sum(c["len"] for c in man["chunks"]) == len(want), f"{key}: its manifest's chunks do not add up: {man}"
        n += 1
        nbytes += len(want)
assert n == len(status), f"{n} files written, surge lists {len(status)}"
# The manifests of their own (immutable, one per file version written back).
paths = set()
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=".surge/manifests/"):
    for o in page.get("Contents", []):
        paths.add(json.loads(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())["path"])
assert standalone <= paths, f"no manifest for {sorted(standalone - paths)[:5]}"
print(f"burst buffer: {n} files, {nbytes} bytes verified straight from S3; {n - len(standalone)} manifests on their objects, {len(standalone)} of their own")
PY
echo "burst-buffer CI step took $(( $(date +%s) - start )) s"
