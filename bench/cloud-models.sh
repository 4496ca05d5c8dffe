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
# off by more than 10 %. --quick runs 5 s per job instead of 30 s.
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

python3 - "$TOL" "$RUNTIME" "$DIR" <<'PY'
import json, sys
tol, runtime, d = float(sys.argv[1]), sys.argv[2], sys.argv[3]
w = json.load(open(f"{d}/seqwrite.json"))["jobs"][0]["write"]
r = json.load(open(f"{d}/randread.json"))["jobs"][0]["read"]
rows = [
    ("reserved:2GiB,bw=40MB/s  seq 1MiB write QD4", "MB/s", w["bw_bytes"] / 1e6, 40.0),
    ("gp2:100GiB fresh          4KiB randread QD16", "IOPS", r["iops"], 3000.0),
]
print(f"cloud models, real time through NBD ({runtime} s per job, tolerance ±{tol:.0f} %)")
print(f"{'volume / workload':<46} {'unit':<5} {'measured':>10} {'expected':>10} {'error':>8}")
bad = 0
for name, unit, got, want in rows:
    err = (got - want) / want * 100
    ok = abs(err) <= tol
    bad += not ok
    print(f"{name:<46} {unit:<5} {got:>10.1f} {want:>10.1f} {err:>+7.1f}% {'ok' if ok else 'FAIL'}")
sys.exit(1 if bad else 0)
PY
