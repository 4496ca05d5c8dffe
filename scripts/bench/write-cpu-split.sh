#!/usr/bin/env bash
# Where the CPU goes during 1 MiB sequential writes (fio's nbd engine, 2 jobs,
# QD 8, as bench/nbd-peers.sh runs them) to a tmpfs file export of surge and to
# nbdkit's null plugin, alternating: IOPS, how many of the machine's CPUs are
# busy (/proc/stat), the server's share, and the server's context switches
# per request (perf stat). With `perf`, also a `perf record -g` of surge in
# $WORK/perf.data (read it with `perf report --no-children --sort sym`).
#
#   scripts/bench/write-cpu-split.sh [ROUNDS] [perf]
set -euo pipefail
SURGE="$(cd "$(dirname "$0")/../.." && pwd)/${CARGO_TARGET_DIR:-target}/release/surge"
ROUNDS="${1:-2}"
MODE="${2:-}"
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
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "1 MiB writes, fio nbd engine, 2 jobs x QD 8, 6 s measured of each 10 s run; $(nproc) CPUs"
for round in $(seq "$ROUNDS"); do
  for server in surge null; do
    pid=$surge_pid; [ "$server" = null ] && pid=$null_pid
    fio --name=w --ioengine=nbd --uri="nbd+unix:///d?socket=$WORK/$server.sock" --rw=write --bs=1M \
      --iodepth=8 --numjobs=2 --size=512M --offset_increment=512M --time_based --runtime=10 \
      --group_reporting --output-format=json --output="$WORK/fio.json" > /dev/null 2>&1 & fio_pid=$!
    sleep 2
    a=$(head -1 /proc/stat); t0=$(cpu_ticks "$pid")
    if [ "$MODE" = perf ] && [ "$server" = surge ] && [ "$round" = 1 ]; then
      perf record -g -o "$WORK/../write-cpu-split.perf.data" -p "$pid" -- sleep 6 > /dev/null 2>&1
    else
      perf stat -e context-switches -x, -o "$WORK/stat" -p "$pid" -- sleep 6 > /dev/null 2>&1
    fi
    b=$(head -1 /proc/stat); t1=$(cpu_ticks "$pid")
    wait "$fio_pid"
    python3 - "$a" "$b" "$t0" "$t1" "$server" "$WORK/fio.json" "$WORK/stat" "$(nproc)" <<'PY'
import json, os, sys
a, b = ([int(x) for x in l.split()[1:]] for l in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
cpus = int(sys.argv[8])
busy = (sum(d) - d[3] - d[4]) / sum(d) * cpus
server = (int(sys.argv[4]) - int(sys.argv[3])) / os.sysconf("SC_CLK_TCK") / 6
iops = json.load(open(sys.argv[6]))["jobs"][0]["write"]["iops"]
switches = "-"
if os.path.exists(sys.argv[7]):
    for line in open(sys.argv[7]):
        f = line.split(",")
        if len(f) > 2 and f[2].startswith("context-switches") and f[0].isdigit():
            switches = f"{int(f[0]) / 6 / iops:.1f}"
    os.remove(sys.argv[7])
print(f"{sys.argv[5]:6} {iops:7.0f} IOPS  machine {busy:.2f} CPUs busy, server {server:.2f} CPUs, "
      f"{server / iops * 1e6:6.1f} us CPU and {switches} context switches per request")
PY
  done
done
[ "$MODE" = perf ] && echo "perf data: $(dirname "$WORK")/write-cpu-split.perf.data"
