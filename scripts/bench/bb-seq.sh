#!/usr/bin/env bash
# Sequential throughput of the burst-buffer mount: the experiment's
# `fsbench.py seq-write` (MIB MiB in 1 MiB writes, or -w KIB, fsync, close), then, page
# cache dropped, `seq-read` of the same file, on a fresh one-machine burst
# buffer (bb redis, moto S3, `surge bb pool --min 2 --max 6` of 256 MiB nodes
# as in the experiment, bb mount; no emulated link), for one or two surge
# binaries, alternating, ROUNDS times each. With -c, a fresh mount reads the
# file (the client's chunk cache is cold: the bytes come from the nodes).
# -n WRITES writes that many files in turn, each once the last is in S3 (as
# the experiment does; the read is of the last); -m MIN starts the pool at MIN
# nodes (default 2; the experiment's pool has grown to 6 by its throughput
# phase), -M MAX lets it grow to MAX (default 6), -g SIZE gives each node SIZE
# of memory (default 256MiB, as in the experiment). -p adds an argument to `surge bb pool` (repeat), e.g.
# `-p --node-arg=--writeback-delay=60s` keeps write-back (and the S3 server's
# CPU) out of the measurement.
#
#   scripts/bench/bb-seq.sh [-a SURGE_A] [-b SURGE_B] [-r ROUNDS] [-s MIB] [-w KIB] [-n WRITES] [-m MIN] [-M MAX] [-g SIZE] [-c] [-P] [-p POOL_ARG]...
#
# Prints one line per run (MB/s of each write, and the CPU seconds of the mount, Redis,
# the nodes and moto during the read) and the medians per binary. Root (drops
# the page cache). Without -b, only SURGE_A (default: this checkout's
# release build) runs.
# -P records the last write of each run with `perf record -a -g` (every
# process on the machine) and prints each command's share of the samples
# (perf.data kept in the work directory; needs Debian linux-perf).
# The pool's and nodes' log ($W/pool.log) gets a line at each write's start and
# end, to set beside the nodes' (`-p --node-arg=--log=surge_bb=info`).
# BB_MOUNT_ARGS adds options to `surge bb mount`, e.g. BB_MOUNT_ARGS="--attr-ttl 0s".
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
A="$REPO/${CARGO_TARGET_DIR:-target}/release/surge"
B=""
ROUNDS=3
MIB=64
WRITE_KIB=1024
COLD=""
WRITES=1
MIN=2
MAX=6
NODE_MEM=256MiB
PERF=""
POOL_ARGS=()
while getopts "a:b:r:s:w:n:m:M:g:cPp:" o; do
  case $o in
    a) A=$(realpath "$OPTARG") ;;
    b) B=$(realpath "$OPTARG") ;;
    r) ROUNDS=$OPTARG ;;
    s) MIB=$OPTARG ;;
    w) WRITE_KIB=$OPTARG ;;
    n) WRITES=$OPTARG ;;
    m) MIN=$OPTARG ;;
    M) MAX=$OPTARG ;;
    g) NODE_MEM=$OPTARG ;;
    c) COLD=1 ;;
    P) PERF=1 ;;
    p) POOL_ARGS+=("$OPTARG") ;;
    *) sed -n 2,25p "$0"; exit 2 ;;
  esac
done
. "$REPO/scripts/lib/bb-local.sh"
bb_bench_start seq
MOTO=${PIDS[0]}

# CPU seconds of the mount, Redis, the nodes and moto, on one line.
cpu_all() { echo "$(cpu_s "$MOUNT") $(cpu_s "$1") $(cpu_s $(nodes)) $(cpu_s "$MOTO")"; }
nodes() { pgrep -f "bb node" | paste -sd' '; }

# Until `surge bb status` finds every file in S3.
wait_persisted() {
  for _ in $(seq 1500); do
    "$1" --log error bb status --json / | python3 -c 'import json,sys; sys.exit(0 if all(f["persisted"] for f in json.load(sys.stdin)) else 1)' && return
    sleep 0.2
  done
  echo "files not in S3 after 300 s" >&2; return 1
}

umount_bb() { fusermount3 -u "$W/mnt"; wait "$MOUNT" || true; }

run() {
  local bin=$1 tag=$2 first=${#PIDS[@]} redis pool c0 c1
  bb_bucket "seq-$tag"
  bb_start_redis "$bin" "$W/redis-$tag"
  redis=$(pgrep -f "redis-server.*$(echo "$SURGE_BB_REDIS" | sed 's|.*:\([0-9]*\)/|\1|')" | head -1)
  "$bin" --log warn bb pool --min "$MIN" --max "$MAX" --interval 1s --node-memory "$NODE_MEM" "${POOL_ARGS[@]}" 2>>"$W/pool.log" &
  pool=$!
  PIDS+=($pool)
  for _ in $(seq 100); do [ "$("$bin" --log error bb status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))')" -ge "$MIN" ] && break; sleep 0.2; done
  bb_mount "$bin"
  for i in $(seq "$WRITES"); do
    [ "$i" = 1 ] || wait_persisted "$bin"
    echo "write $i starts $(date -u +%T.%N)" >>"$W/pool.log"
    if [ -n "$PERF" ] && [ "$i" = "$WRITES" ]; then
      perf record -q -F 4000 -a -g -o "$W/$tag.perf.data" -- python3 "$FSBENCH" seq-write "$W/mnt/seq.dat.$i" "$MIB" "$WRITE_KIB" >"$W/$tag.w$i.json"
      perf report -i "$W/$tag.perf.data" --no-children --sort comm -g none --stdio 2>/dev/null | grep '%' | head -12 | sed "s/^/  $tag perf: /"
    else
      python3 "$FSBENCH" seq-write "$W/mnt/seq.dat.$i" "$MIB" "$WRITE_KIB" >"$W/$tag.w$i.json"
    fi
    echo "write $i ends $(date -u +%T.%N)" >>"$W/pool.log"
  done
  if [ -n "$COLD" ]; then umount_bb; bb_mount "$bin"; fi
  sync; echo 3 >/proc/sys/vm/drop_caches
  c0=$(cpu_all "$redis")
  python3 "$FSBENCH" seq-read "$W/mnt/seq.dat.$WRITES" 1024 >"$W/$tag.r.json"
  c1=$(cpu_all "$redis")
  umount_bb
  kill "$pool" 2>/dev/null || true
  wait "$pool" 2>/dev/null || true
  pkill -f "bb node" 2>/dev/null || true
  bb_stop_from "$first"
  python3 - "$W" "$tag" "$c0" "$c1" "$WRITES" <<'PY'
import json, statistics, sys
w, tag = sys.argv[1], sys.argv[2]
c0, c1 = [list(map(float, a.split())) for a in sys.argv[3:5]]
cpu = [b - a for a, b in zip(c0, c1)]
writes = [json.load(open(f"{w}/{tag}.w{i}.json"))["mbps"] for i in range(1, int(sys.argv[5]) + 1)]
r = {"write_mbps": statistics.median(writes), "writes_mbps": writes, "read_mbps": json.load(open(f"{w}/{tag}.r.json"))["mbps"],
     "read_cpu": dict(zip(["mount", "redis", "nodes", "moto"], cpu))}
json.dump(r, open(f"{w}/{tag}.res.json", "w"))
print(f"{tag}: write {' '.join(f'{x:.0f}' for x in writes)} MB/s, read {r['read_mbps']:.0f} MB/s; CPU s during the read: " + ", ".join(f"{k} {v:.2f}" for k, v in r["read_cpu"].items()))
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
