#!/usr/bin/env bash
# Where the CPU goes during 1 MiB sequential writes (fio's nbd engine, by
# default 2 jobs at QD 8, as bench/nbd-peers.sh runs them) to a tmpfs file
# export of surge and to nbdkit's null plugin, alternating: IOPS, how many of
# the machine's CPUs are busy (/proc/stat), and for the server and for the
# client (fio) apart: CPU time and context switches per request, summed over
# their threads from /proc/PID/task/*/schedstat and status (`perf stat -p`
# undercounted nbdkit by almost half here, against both of these and
# /proc/stat). With `perf`, the server is also profiled (`perf record -g`,
# the path is printed; read it with `perf report --no-children --sort sym`).
#
#   [JOBS=2] [QD=8] scripts/bench/write-cpu-split.sh [ROUNDS] [perf]
set -euo pipefail
SURGE="$(cd "$(dirname "$0")/../.." && pwd)/${CARGO_TARGET_DIR:-target}/release/surge"
ROUNDS="${1:-2}"
MODE="${2:-}"
JOBS="${JOBS:-2}"
QD="${QD:-8}"
WORK=$(mktemp -d /dev/shm/write-cpu-split.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
truncate -s 1G "$WORK/img"
"$SURGE" --log warn serve --data-dir "$WORK/d" --control "$WORK/c.sock" --listen "unix:$WORK/surge.sock" \
  --export "d=file:$WORK/img" > "$WORK/surge.log" 2>&1 & pids+=($!); surge_pid=$!
nbdkit -f -U "$WORK/null.sock" -e d null size=1G & pids+=($!); null_pid=$!
for s in surge null; do
  for _ in $(seq 50); do nbdinfo --size "nbd+unix:///d?socket=$WORK/$s.sock" >/dev/null 2>&1 && break; sleep 0.1; done
done
# "NS SWITCHES": CPU time (ns) and context switches so far of every thread of PIDs.
usage() {
  local p
  for p in "$@"; do
    cat /proc/"$p"/task/*/schedstat 2>/dev/null | awk '{ns += $1} END {printf "%.0f ", ns}'
    cat /proc/"$p"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {printf "%d\n", n}'
  done | awk '{ns += $1; sw += $2} END {printf "%.0f %.0f", ns, sw}'
}
echo "1 MiB writes, fio nbd engine, $JOBS jobs x QD $QD, 6 s measured of each 10 s run; $(nproc) CPUs"
for round in $(seq "$ROUNDS"); do
  for server in surge null; do
    pid=$surge_pid; [ "$server" = null ] && pid=$null_pid
    fio --name=w --ioengine=nbd --uri="nbd+unix:///d?socket=$WORK/$server.sock" --rw=write --bs=1M \
      --iodepth="$QD" --numjobs="$JOBS" --size=512M --offset_increment=512M --time_based --runtime=10 \
      --group_reporting --output-format=json --output="$WORK/fio.json" > /dev/null 2>&1 & fio_pid=$!
    sleep 2
    client=$(pgrep -f "^fio --name=w" | tr '\n' ' ')
    a=$(head -1 /proc/stat); s0=$(usage "$pid"); c0=$(usage $client)
    if [ "$MODE" = perf ] && [ "$server" = surge ] && [ "$round" = 1 ]; then
      perf record -g -o "$WORK/../write-cpu-split.perf.data" -p "$pid" -- sleep 6 > /dev/null 2>&1
    else
      sleep 6
    fi
    b=$(head -1 /proc/stat); s1=$(usage "$pid"); c1=$(usage $client)
    wait "$fio_pid"
    python3 - "$a" "$b" "$server" "$WORK/fio.json" "$s0" "$s1" "$c0" "$c1" "$(nproc)" <<'PY'
import json, sys
a, b = ([int(x) for x in l.split()[1:]] for l in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
busy = (sum(d) - d[3] - d[4]) / sum(d) * int(sys.argv[9])
iops = json.load(open(sys.argv[4]))["jobs"][0]["write"]["iops"]


def per_request(before, after):
    """CPUs, CPU us and context switches per request between two `usage` lines."""
    (ns0, sw0), (ns1, sw1) = (map(int, x.split()) for x in (before, after))
    cpus = (ns1 - ns0) / 1e9 / 6
    return f"{cpus:.2f} CPUs, {cpus / iops * 1e6:5.1f} us and {(sw1 - sw0) / 6 / iops:4.1f} switches per request"


print(f"{sys.argv[3]:6} {iops:7.0f} IOPS, {busy:.2f} CPUs busy; server {per_request(*sys.argv[5:7])}; client {per_request(*sys.argv[7:9])}")
PY
  done
done
if [ "$MODE" = perf ]; then echo "perf data: $(dirname "$WORK")/write-cpu-split.perf.data"; fi
