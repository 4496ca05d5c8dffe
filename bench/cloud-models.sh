#!/usr/bin/env bash
# Real-time check of the cloud volume models through NBD with fio.
#
#   bench/cloud-models.sh [--quick]
#
# Serves two local-cloud volumes with `surge serve` and measures them with fio's
# nbd engine:
#   reserved:2GiB,bw=40MB/s  sequential 1 MiB writes, QD 4  -> expect 40 MB/s
#   gp2:100GiB (fresh)       4 KiB random reads, QD 16      -> expect 3,000 IOPS
# (a fresh 100 GiB gp2 volume bursts at 3,000 IOPS for 2,000 s, so a short
# run sees the burst rate). Prints measured vs expected; fails if a result is
# off by more than 10 %. --quick runs 5 s per job instead of 30 s. Needs fio
# with its nbd engine (libnbd).
# Env: SURGE=path to the binary (default: the release build, built if missing).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNTIME=30
[ "${1:-}" = "--quick" ] && RUNTIME=5
TOL=10

SURGE="${SURGE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/surge}"
if [ ! -x "$SURGE" ]; then
  (cd "$ROOT" && cargo build --release -p surge >&2)
fi
command -v fio >/dev/null || { echo "cloud-models: fio is not installed" >&2; exit 1; }
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "cloud-models: this fio has no nbd engine" >&2; exit 1; }

DIR="$(mktemp -d)"
SOCK="$DIR/nbd.sock"
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT

"$SURGE" serve --data-dir "$DIR" --listen "unix:$SOCK" --workers 16 \
  --export "r=reserved:2GiB,bw=40MB/s" --export "g=gp2:100GiB" >"$DIR/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  [ -S "$SOCK" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$DIR/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -S "$SOCK" ] || { echo "cloud-models: surge serve did not start" >&2; cat "$DIR/serve.log" >&2; exit 1; }

# run NAME EXPORT FIO-ARGS...: fio's JSON result goes to $DIR/NAME.json
run() {
  local name=$1 export=$2; shift 2
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///$export?socket=$SOCK" \
    --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$DIR/$name.json" "$@"
}

run seqwrite r --rw=write --bs=1M --iodepth=4 --size=2GiB
run randread g --rw=randread --bs=4k --iodepth=16 --size=100GiB

# The first "bw_bytes"/"iops" of fio's JSON is the read side, the second the write side.
field() { grep -E "\"$2\" :" "$DIR/$1.json" | sed -n "${3}p" | tr -dc '0-9.'; }
WBPS=$(field seqwrite bw_bytes 2)
RIOPS=$(field randread iops 1)

echo "cloud models, real time through NBD ($RUNTIME s per job, tolerance ±$TOL %)"
printf '%-46s %-5s %10s %10s %8s\n' "volume / workload" unit measured expected error
check() { # NAME UNIT MEASURED EXPECTED
  awk -v n="$1" -v u="$2" -v got="$3" -v want="$4" -v tol="$TOL" 'BEGIN {
    err = (got - want) / want * 100; ok = (err <= tol && err >= -tol)
    printf "%-46s %-5s %10.1f %10.1f %+7.1f%% %s\n", n, u, got, want, err, ok ? "ok" : "FAIL"
    exit !ok }'
}
rc=0
check "reserved:2GiB,bw=40MB/s  seq 1MiB write QD4" "MB/s" "$(awk -v b="$WBPS" 'BEGIN { print b / 1e6 }')" 40 || rc=1
check "gp2:100GiB fresh          4KiB randread QD16" "IOPS" "$RIOPS" 3000 || rc=1
exit $rc
