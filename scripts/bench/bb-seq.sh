#!/usr/bin/env bash
# Sequential throughput of the burst-buffer mount: the experiment's
# `fsbench.py seq-write` (MIB MiB in 1 MiB writes, or -w KIB, fsync, close), then, page
# cache dropped, `seq-read` of the same file, on a fresh one-machine burst
# buffer (bb redis, moto S3, `surge bb pool --min 2 --max 6` of 256 MiB nodes
# as in the experiment, bb mount; no emulated link), for one or two surge
# binaries, alternating, ROUNDS times each. With -c, a fresh mount reads the
# file (the client's chunk cache is cold: the bytes come from the nodes).
# -p adds an argument to `surge bb pool` (repeat), e.g.
# `-p --node-arg=--writeback-delay=60s` keeps write-back (and the S3 server's
# CPU) out of the measurement.
#
#   scripts/bench/bb-seq.sh [-a SURGE_A] [-b SURGE_B] [-r ROUNDS] [-s MIB] [-w KIB] [-c] [-p POOL_ARG]...
#
# Prints one line per run (MB/s, and the CPU seconds of the mount, Redis,
# the nodes and moto during the read) and the medians per binary. Root (drops
# the page cache). Without -b, only SURGE_A (default: this checkout's
# release build) runs.
# BB_MOUNT_ARGS adds options to `surge bb mount`, e.g. BB_MOUNT_ARGS="--attr-ttl 0s".
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
A="$REPO/${CARGO_TARGET_DIR:-target}/release/surge"
B=""
ROUNDS=3
MIB=64
WRITE_KIB=1024
COLD=""
POOL_ARGS=()
while getopts "a:b:r:s:w:cp:" o; do
  case $o in
    a) A=$(realpath "$OPTARG") ;;
    b) B=$(realpath "$OPTARG") ;;
    r) ROUNDS=$OPTARG ;;
    s) MIB=$OPTARG ;;
    w) WRITE_KIB=$OPTARG ;;
    c) COLD=1 ;;
    p) POOL_ARGS+=("$OPTARG") ;;
    *) sed -n 2,17p "$0"; exit 2 ;;
  esac
done
. "$REPO/scripts/lib/bb-local.sh"
bb_bench_start seq
MOTO=${PIDS[0]}

# CPU seconds of the mount, Redis, the nodes and moto, on one line.
cpu_all() { echo "$(cpu_s "$MOUNT") $(cpu_s "$1") $(cpu_s $(nodes)) $(cpu_s "$MOTO")"; }
nodes() { pgrep -f "bb node" | paste -sd' '; }

umount_bb() { fusermount3 -u "$W/mnt"; wait "$MOUNT" || true; }

run() {
  local bin=$1 tag=$2 first=${#PIDS[@]} redis pool c0 c1
  bb_bucket "seq-$tag"
  bb_start_redis "$bin" "$W/redis-$tag"
  redis=$(pgrep -f "redis-server.*$(echo "$SURGE_BB_REDIS" | sed 's|.*:\([0-9]*\)/|\1|')" | head -1)
  "$bin" --log warn bb pool --min 2 --max 6 --interval 1s --node-memory 256MiB "${POOL_ARGS[@]}" 2>>"$W/pool.log" &
  pool=$!
  PIDS+=($pool)
  for _ in $(seq 100); do [ "$("$bin" --log error bb status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))')" -ge 2 ] && break; sleep 0.2; done
  bb_mount "$bin"
  python3 "$FSBENCH" seq-write "$W/mnt/seq.dat" "$MIB" "$WRITE_KIB" >"$W/$tag.w.json"
  if [ -n "$COLD" ]; then umount_bb; bb_mount "$bin"; fi
  sync; echo 3 >/proc/sys/vm/drop_caches
  c0=$(cpu_all "$redis")
  python3 "$FSBENCH" seq-read "$W/mnt/seq.dat" 1024 >"$W/$tag.r.json"
  c1=$(cpu_all "$redis")
  umount_bb
  kill "$pool" 2>/dev/null || true
  wait "$pool" 2>/dev/null || true
  pkill -f "bb node" 2>/dev/null || true
  bb_stop_from "$first"
  python3 - "$W" "$tag" "$c0" "$c1" <<'PY'
import json, sys
w, tag = sys.argv[1], sys.argv[2]
c0, c1 = [list(map(float, a.split())) for a in sys.argv[3:5]]
cpu = [b - a for a, b in zip(c0, c1)]
r = {"write_mbps": json.load(open(f"{w}/{tag}.w.json"))["mbps"], "read_mbps": json.load(open(f"{w}/{tag}.r.json"))["mbps"],
     "read_cpu": dict(zip(["mount", "redis", "nodes", "moto"], cpu))}
json.dump(r, open(f"{w}/{tag}.res.json", "w"))
print(f"{tag}: write {r['write_mbps']:.0f} MB/s, read {r['read_mbps']:.0f} MB/s; CPU s during the read: " + ", ".join(f"{k} {v:.2f}" for k, v in r["read_cpu"].items()))
PY
}

bb_rounds
python3 - "$W" <<'PY'
import glob, json, os, statistics, sys
for who in "ab":
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], f"{who}[0-9]*.res.json")))]
    if runs:
        print(f"{who.upper()} median of {len(runs)}: write {statistics.median(r['write_mbps'] for r in runs):.0f} MB/s, read {statistics.median(r['read_mbps'] for r in runs):.0f} MB/s")
PY
