#!/usr/bin/env bash
# Serve the same tmpfs image with surge and with the servers a user would pick
# instead: nbdkit's file plugin, qemu-nbd (raw, --cache=writeback
# --aio=threads, and with qemu-nbd's defaults) and the reference nbd-server
# (Debian nbd-server, default export settings); run nbdkit's null plugin (a
# server doing no I/O at all: the ceiling of what the protocol path alone
# allows) beside them; run fio's nbd engine against each (2 connections = 2
# fio jobs), and print IOPS / MB/s and surge's ratio to each for: 4 KiB random
# read and write at QD 32, 1 MiB sequential read and write at QD 8. Runs
# alternate the servers and each figure is the median over rounds, so load
# drifting on a shared machine hits all alike. Every server's settings are
# printed with the results.
#
#   bench/nbd-peers.sh            # 3 rounds x 10 s per pattern and server, 1 GiB image
#   bench/nbd-peers.sh --quick    # 1 round x 3 s, 256 MiB image (CI smoke run)
#   options: --runtime S  --rounds N  --size SIZE  --surge PATH (default: cargo build --release)
#            --min-ratio R  (exit 1 if any ratio is below R; default: report only)
#            --json FILE    (write the results as JSON)
#            --surge-args "ARGS"  (extra `surge serve` flags, e.g. "--workers 2")
set -euo pipefail
cd "$(dirname "$0")/.."

runtime=10 rounds=3 size=1G quick=0 surge="" min_ratio="" json_out="" surge_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; runtime=3; rounds=1; size=256M ;;
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

for tool in fio nbdkit qemu-nbd nbd-server python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install fio nbdkit qemu-utils nbd-server python3" >&2; exit 1; }
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

# Every server, its socket and its settings (printed with the results).
# qemu-nbd: -t (stays up between fio runs) and --shared=2 (fio's 2
# connections; its default is 1). qemu-nbd(8) gives writeback and threads as
# its defaults, so its two columns differ by run-to-run noise only while that
# holds. nbd-server: a unix socket, and a TCP port on loopback (it always
# listens on one); nothing else set. It serves each connection in a forked
# child: its CPU figure is its children's, counted once they have exited.
servers=(surge nbdkit qemu-wb qemu-def nbd-server null)
declare -A pid settings
"$surge" serve --listen "unix:$work/surge.sock" --export "d=file:$img" \
  --control "$work/control.sock" --data-dir "$work" $surge_args >"$work/surge.out" 2>"$work/surge.log" &
pids+=($!); pid[surge]=$!
settings[surge]="surge serve --export d=file:disk.img ${surge_args:-(defaults)}"
nbdkit -f -U "$work/nbdkit.sock" -e d file "$img" 2>"$work/nbdkit.log" &
pids+=($!); pid[nbdkit]=$!
settings[nbdkit]="$(nbdkit --version) file plugin (defaults)"
qemu_v=$(qemu-nbd --version | head -1 | cut -d' ' -f2)
qemu-nbd -t --shared=2 -f raw --cache=writeback --aio=threads -k "$work/qemu-wb.sock" -x d "$img" 2>"$work/qemu-wb.log" &
pids+=($!); pid[qemu-wb]=$!
settings[qemu-wb]="qemu-nbd $qemu_v -t --shared=2 -f raw --cache=writeback --aio=threads"
qemu-nbd -t --shared=2 -f raw -k "$work/qemu-def.sock" -x d "$img" 2>"$work/qemu-def.log" &
pids+=($!); pid[qemu-def]=$!
settings[qemu-def]="qemu-nbd $qemu_v -t --shared=2 -f raw (cache and aio: its defaults)"
nbd_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/nbd-server.conf" <<CONF
[generic]
unixsock = $work/nbd-server.sock
listenaddr = 127.0.0.1
port = $nbd_port
[d]
exportname = $img
CONF
# It forks per connection only when it runs as a daemon (-d serves one
# connection), so it daemonizes and leaves its pid in a file.
nbd-server -C "$work/nbd-server.conf" -p "$work/nbd-server.pid" >"$work/nbd-server.log" 2>&1
for _ in $(seq 200); do [ -s "$work/nbd-server.pid" ] && break; sleep 0.05; done
pids+=("$(cat "$work/nbd-server.pid")"); pid[nbd-server]=$(cat "$work/nbd-server.pid")
settings[nbd-server]="nbd-server $(nbd-server -V 2>&1 | awk '/version/ {print $NF}') (default export settings)"
nbdkit -f -U "$work/null.sock" -e d null size="$bytes" 2>"$work/null.log" &
pids+=($!); pid[null]=$!
settings[null]="nbdkit null plugin (no I/O: the ceiling)"
for server in "${servers[@]}"; do wait_socket "$work/$server.sock"; done
for server in "${servers[@]}"; do echo "  $server: ${settings[$server]}"; done >"$work/settings.txt"

# pattern name, fio rw, block size, queue depth
patterns=(
  "randread-4k-qd32 randread 4k 32"
  "randwrite-4k-qd32 randwrite 4k 32"
  "seqread-1m-qd8 read 1M 8"
  "seqwrite-1m-qd8 write 1M 8"
)

# CPU time (user+system, clock ticks) a server process has used so far, its
# exited children's included (nbd-server forks one per connection).
cpu_ticks() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"; }

run_fio() { # server pattern rw bs qd round -> json file + server CPU ticks file
  local server=$1 name=$2 rw=$3 bs=$4 qd=$5 round=$6
  local before; before=$(cpu_ticks "${pid[$server]}")
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///d?socket=$work/$server.sock" \
      --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=2 --size="$half" --offset_increment="$half" \
      --time_based --runtime="$runtime" --ramp_time=1 --group_reporting \
      --output-format=json --output="$work/$server-$name-$round.json" >/dev/null
  [ "$server" = nbd-server ] && sleep 0.3 # its children exit and are reaped
  echo $(( $(cpu_ticks "${pid[$server]}") - before )) >"$work/$server-$name-$round.cpu"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
  for p in "${patterns[@]}"; do
    read -r name rw bs qd <<<"$p"
    for server in "${servers[@]}"; do
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
# (server, column title); surge is compared with each.
PEERS = [("nbdkit", "nbdkit file"), ("qemu-wb", "qemu-nbd wb+threads"), ("qemu-def", "qemu-nbd defaults"),
         ("nbd-server", "nbd-server"), ("null", "nbdkit null (ceiling)")]
ALL = ["surge"] + [k for k, _ in PEERS]
def one(server, name, r):
    job = json.load(open(f"{work}/{server}-{name}-{r}.json"))["jobs"][0]
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    ios = side["total_ios"] or 1  # ramp-time I/O is not counted, so CPU/op is a slight overestimate
    cpu_us = int(open(f"{work}/{server}-{name}-{r}.cpu").read()) / TICK * 1e6
    return side["iops"], side["bw_bytes"] / 1e6, cpu_us / ios
def measure(server, name):
    runs = sorted(one(server, name, r) for r in range(1, int(rounds) + 1))
    return runs[len(runs) // 2]
settings = open(f"{work}/settings.txt").read().rstrip()
print(f"fio nbd engine over unix sockets, 2 connections, median of {rounds} x {runtime} s runs, image {int(size) >> 20} MiB on tmpfs")
print(f"load average before / after: {load} (on {os.cpu_count()} CPUs)")
print("servers:\n" + settings)
fmt = lambda iops, mb, cpu: f"{iops:>8.0f} IOPS {mb:>5.0f} MB/s {cpu:>5.1f} us"
print(f"{'pattern':<19}" + "".join(f"{t:>31}" for t in ["surge"] + [t for _, t in PEERS]))
rows, worst = [], {}
for name in patterns:
    got = {k: measure(k, name) for k in ALL}
    print(f"{name:<19}" + "".join(f"{fmt(*got[k]):>31}" for k in ALL))
    row = {"pattern": name}
    for k in ALL:
        key = k.replace("-", "_")
        row[f"{key}_iops"], row[f"{key}_mbs"], row[f"{key}_cpu_us_per_op"] = got[k]
    for k, _ in PEERS:
        r = got["surge"][0] / got[k][0] if got[k][0] else float("inf")
        worst[k] = min(worst.get(k, r), r)
        row["ratio" if k == "nbdkit" else f"ratio_{k.replace('-', '_')}"] = r
    rows.append(row)
print("surge/each in IOPS, lowest over the patterns: " + ", ".join(f"{t} {worst[k]:.2f}x" for k, t in PEERS))
print("us = server CPU time per request; targets: surge/nbdkit file >= 1.5x (below 1.0x is a defect), surge/null >= 1.0x")
if json_out:
    json.dump({"runtime_s": int(runtime), "rounds": int(rounds), "image_bytes": int(size), "load": load,
               "servers": [l.strip() for l in settings.splitlines()], "results": rows}, open(json_out, "w"), indent=2)
if worst["nbdkit"] < float(min_ratio):
    sys.exit(f"lowest ratio surge/nbdkit {worst['nbdkit']:.2f}x is below --min-ratio {min_ratio}")
EOF
