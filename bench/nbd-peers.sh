#!/usr/bin/env bash
# Serve the same tmpfs image with surge and with nbdkit's file plugin, and run
# nbdkit's null plugin (a server doing no I/O at all: the ceiling of what the
# protocol path alone allows) beside them; run fio's nbd engine against each
# (2 connections = 2 fio jobs), and print IOPS / MB/s, the ratio surge/nbdkit
# and surge/null for: 4 KiB random read and write at QD 32, 1 MiB sequential
# read and write at QD 8. Runs alternate surge/nbdkit/null and each figure is
# the median over rounds, so load drifting on a shared machine hits all alike.
#
#   bench/nbd-peers.sh            # 3 rounds x 10 s per pattern and server, 1 GiB image
#   bench/nbd-peers.sh --quick    # 1 round x 5 s, 256 MiB image (CI smoke run)
#   options: --runtime S  --rounds N  --size SIZE  --surge PATH (default: cargo build --release)
#            --min-ratio R  (exit 1 if any ratio is below R; default: report only)
#            --json FILE    (write the results as JSON)
#            --surge-args "ARGS"  (extra `surge serve` flags, e.g. "--workers 2")
set -euo pipefail
cd "$(dirname "$0")/.."

runtime=10 rounds=3 size=1G quick=0 surge="" min_ratio="" json_out="" surge_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; runtime=5; rounds=1; size=256M ;;
    --runtime) runtime="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --size) size="$2"; shift ;;
    --surge) surge="$2"; shift ;;
    --min-ratio) min_ratio="$2"; shift ;;
    --json) json_out="$2"; shift ;;
    --surge-args) surge_args="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install fio nbdkit python3" >&2; exit 1; }
done
if [ -z "$surge" ]; then
  cargo build --release -p surge --quiet
  surge="${CARGO_TARGET_DIR:-target}/release/surge"
fi

work=$(mktemp -d /dev/shm/nbd-peers.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

img="$work/disk.img"
fio --name=fill --filename="$img" --size="$size" --rw=write --bs=1M --ioengine=psync \
    --output=/dev/null >/dev/null
bytes=$(stat -c %s "$img")
half=$((bytes / 2))

wait_socket() {
  for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "server did not create $1" >&2; exit 1
}

"$surge" serve --listen "unix:$work/surge.sock" --export "d=file:$img" \
  --control "$work/control.sock" --data-dir "$work" $surge_args >"$work/surge.out" 2>"$work/surge.log" &
pids+=($!); surge_pid=$!
nbdkit -f -U "$work/nbdkit.sock" -e d file "$img" 2>"$work/nbdkit.log" &
pids+=($!); nbdkit_pid=$!
nbdkit -f -U "$work/null.sock" -e d null size="$bytes" 2>"$work/null.log" &
pids+=($!); null_pid=$!
wait_socket "$work/surge.sock"
wait_socket "$work/nbdkit.sock"
wait_socket "$work/null.sock"

# pattern name, fio rw, block size, queue depth
patterns=(
  "randread-4k-qd32 randread 4k 32"
  "randwrite-4k-qd32 randwrite 4k 32"
  "seqread-1m-qd8 read 1M 8"
  "seqwrite-1m-qd8 write 1M 8"
)

# CPU time (user+system, clock ticks) a server process has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run_fio() { # server pattern rw bs qd round -> json file + server CPU ticks file
  local server=$1 name=$2 rw=$3 bs=$4 qd=$5 round=$6
  local pid=$surge_pid; [ "$server" = nbdkit ] && pid=$nbdkit_pid; [ "$server" = null ] && pid=$null_pid
  local before; before=$(cpu_ticks "$pid")
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///d?socket=$work/$server.sock" \
      --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=2 --size="$half" --offset_increment="$half" \
      --time_based --runtime="$runtime" --ramp_time=1 --group_reporting \
      --output-format=json --output="$work/$server-$name-$round.json" >/dev/null
  echo $(( $(cpu_ticks "$pid") - before )) >"$work/$server-$name-$round.cpu"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
  for p in "${patterns[@]}"; do
    read -r name rw bs qd <<<"$p"
    for server in surge nbdkit null; do
      run_fio "$server" "$name" "$rw" "$bs" "$qd" "$round"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work" "$runtime" "$bytes" "$rounds" "${min_ratio:-0}" "$json_out" "$load_before / $load_after" "${patterns[@]}" <<'EOF'
import json, os, sys
work, runtime, size, rounds, min_ratio, json_out, load = sys.argv[1:8]
patterns = [p.split()[0] for p in sys.argv[8:]]
TICK = os.sysconf("SC_CLK_TCK")
def one(server, name, r):
    job = json.load(open(f"{work}/{server}-{name}-{r}.json"))["jobs"][0]
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    ios = side["total_ios"] or 1  # ramp-time I/O is not counted, so CPU/op is a slight overestimate
    cpu_us = int(open(f"{work}/{server}-{name}-{r}.cpu").read()) / TICK * 1e6
    return side["iops"], side["bw_bytes"] / 1e6, cpu_us / ios
def measure(server, name):
    runs = sorted(one(server, name, r) for r in range(1, int(rounds) + 1))
    return runs[len(runs) // 2]
rows, worst = [], None
print(f"fio nbd engine, 2 connections, median of {rounds} x {runtime} s runs, image {int(size) >> 20} MiB on tmpfs")
print(f"load average before / after: {load} (on {os.cpu_count()} CPUs)")
print(f"{'pattern':<20}{'surge':>34}{'nbdkit file':>34}{'nbdkit null (ceiling)':>34}{'surge/file':>12}{'surge/null':>12}")
worst_null = None
for name in patterns:
    s_iops, s_mb, s_cpu = measure("surge", name)
    k_iops, k_mb, k_cpu = measure("nbdkit", name)
    n_iops, n_mb, n_cpu = measure("null", name)
    ratio = s_iops / k_iops if k_iops else float("inf")
    ratio_null = s_iops / n_iops if n_iops else float("inf")
    worst = ratio if worst is None else min(worst, ratio)
    worst_null = ratio_null if worst_null is None else min(worst_null, ratio_null)
    fmt = lambda iops, mb, cpu: f"{iops:>9.0f} IOPS {mb:>6.0f} MB/s {cpu:>5.1f} us/op"
    print(f"{name:<20}{fmt(s_iops, s_mb, s_cpu):>34}{fmt(k_iops, k_mb, k_cpu):>34}{fmt(n_iops, n_mb, n_cpu):>34}{ratio:>11.2f}x{ratio_null:>11.2f}x")
    rows.append({"pattern": name, "surge_iops": s_iops, "surge_mbs": s_mb, "surge_cpu_us_per_op": s_cpu,
                 "nbdkit_iops": k_iops, "nbdkit_mbs": k_mb, "nbdkit_cpu_us_per_op": k_cpu,
                 "null_iops": n_iops, "null_mbs": n_mb, "null_cpu_us_per_op": n_cpu,
                 "ratio": ratio, "ratio_null": ratio_null})
print(f"lowest surge/file: {worst:.2f}x (target >= 1.5x; below 1.0x is a defect); us/op = server CPU time per request")
print(f"lowest surge/null: {worst_null:.2f}x (floor >= 1.0x: at or above a server that does no I/O)")
if json_out:
    json.dump({"runtime_s": int(runtime), "rounds": int(rounds), "image_bytes": int(size), "load": load, "results": rows}, open(json_out, "w"), indent=2)
if worst < float(min_ratio):
    sys.exit(f"lowest ratio {worst:.2f}x is below --min-ratio {min_ratio}")
EOF
