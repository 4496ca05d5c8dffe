#!/usr/bin/env bash
# The fleet simulator's own speed and memory (issue 42 item 4): a synthetic
# application (10-minute period: a 60 s burst of 1 MiB writes at 200 MiB/s,
# then 540 s at 2 MiB/s) written as a fio version 3 iolog, imported with
# `surge trace import`, and simulated with `surge sim fleet` for N VMs over H
# hours. Prints the wall time and peak memory the simulator reports (its
# /proc/self/status VmHWM) beside /usr/bin/time's where it is installed
# (Debian package `time`), and the fleet's table.
#
#   bench/sim-fleet.sh                      # 1,000 VMs x 24 h, random and aligned offsets
#   bench/sim-fleet.sh --vms 200 --hours 6  # smaller
# Env: SURGE=path to the binary (default: the release build, built if missing).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
vms=1000 hours=24
while [ $# -gt 0 ]; do
  case "$1" in
    --vms) vms="$2"; shift ;;
    --hours) hours="$2"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
SURGE="${SURGE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/surge}"
[ -x "$SURGE" ] || (cd "$ROOT" && cargo build --release -p surge >&2)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/app.iolog" <<'PY'
import sys
MiB = 1 << 20
with open(sys.argv[1], "w") as f:
    f.write("fio version 3 iolog\n0 /dev/app add\n0 /dev/app open\n")
    off = 0
    # burst: 200 writes of 1 MiB a second for 60 s; then 2 a second for 540 s
    # (version 3 timestamps are µs since the job's start)
    for t_us, n in [(s * 10**6, 200) for s in range(60)] + [(s * 10**6, 2) for s in range(60, 600)]:
        for i in range(n):
            f.write(f"{t_us + i * 10**6 // n} /dev/app write {off} {MiB}\n")
            off = (off + MiB) % (64 << 30)
    f.write("600000000 /dev/app close\n")
PY
"$SURGE" trace import --format fio-iolog "$work/app.iolog" --out "$work/app.trace" >/dev/null
echo "trace: $("$SURGE" trace show "$work/app.trace" 2>/dev/null | head -1)"
for offsets in random aligned; do
  echo
  echo "== surge sim fleet --vms $vms --hours $hours --offsets $offsets --instance m5.4xlarge"
  timed=()
  [ -x /usr/bin/time ] && timed=(/usr/bin/time -f "/usr/bin/time: %e s wall, %M KiB max RSS")
  "${timed[@]}" "$SURGE" sim fleet --trace "$work/app.trace" --vms "$vms" --hours "$hours" --offsets "$offsets" --instance m5.4xlarge
done
