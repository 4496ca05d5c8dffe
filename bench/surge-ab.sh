#!/usr/bin/env bash
# A/B two surge builds (or one build with two flag sets) on one fio pattern over
# the nbd engine, alternating A and B so that load drifting on a shared machine
# hits both alike. Prints each run and the medians: IOPS and the server's CPU
# time per request (user + system of the surge process / requests completed).
#
#   bench/surge-ab.sh --a PATH [--a-args "ARGS"] --b PATH [--b-args "ARGS"] \
#                     [--rw randread] [--bs 4k] [--qd 32] [--runtime 5] [--rounds 3]
#   e.g. zero copy on/off for 1 MiB writes:
#   bench/surge-ab.sh --a target/release/surge --b target/release/surge --b-args --no-zero-copy --rw write --bs 1M --qd 8
#   recording overhead (B records export d into a fresh trace directory each round):
#   bench/surge-ab.sh --a target/release/surge --b target/release/surge --b-record --rw randread --bs 4k --qd 32
set -euo pipefail
a="" b="" a_args="" b_args="" b_record=0 rw=randread bs=4k qd=32 runtime=5 rounds=3 size=256M
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a="$2"; shift ;;
    --b) b="$2"; shift ;;
    --a-args) a_args="$2"; shift ;;
    --b-args) b_args="$2"; shift ;;
    --b-record) b_record=1 ;;
    --rw) rw="$2"; shift ;;
    --bs) bs="$2"; shift ;;
    --qd) qd="$2"; shift ;;
    --runtime) runtime="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$a" ] && [ -n "$b" ] || { echo "--a and --b are required (see --help)" >&2; exit 2; }

work=$(mktemp -d /dev/shm/surge-ab.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
fio --name=fill --filename="$work/disk.img" --size="$size" --rw=write --bs=1M --ioengine=psync --output=/dev/null >/dev/null
half=$(( $(stat -c %s "$work/disk.img") / 2 ))

one() { # label binary args round
  local label=$1 bin=$2 args=$3 round=$4 sock="$work/$1.sock"
  if [ "$label" = B ] && [ "$b_record" = 1 ]; then args="$args --record d=$work/trace-$round"; fi
  # shellcheck disable=SC2086
  "$bin" serve --listen "unix:$sock" --export "d=file:$work/disk.img" --control "$work/$label.ctl" --data-dir "$work" $args \
    >/dev/null 2>"$work/$label.log" &
  local pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  local before; before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  fio --name=ab --ioengine=nbd --uri="nbd+unix:///d?socket=$sock" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=2 \
      --size="$half" --offset_increment="$half" --time_based --runtime="$runtime" --ramp_time=1 --group_reporting \
      --output-format=json --output="$work/$label-$round.json" >/dev/null
  echo $(( $(awk '{print $14 + $15}' "/proc/$pid/stat") - before )) >"$work/$label-$round.cpu"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$sock" "$work/$label.ctl"
  # A recorder that dropped requests would look cheaper than one that kept
  # them all: say how many each recording kept and dropped.
  if [ "$label" = B ] && [ "$b_record" = 1 ]; then
    "$bin" --log error trace show "$work/trace-$round" --json --no-plot >"$work/trace-$round.json"
    rm -rf "$work/trace-$round"
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$rounds"); do
  one A "$a" "$a_args" "$r"
  one B "$b" "$b_args" "$r"
done
python3 - "$work" "$rounds" "$load_before / $(cut -d' ' -f1-3 /proc/loadavg)" "$rw $bs QD$qd, 2 connections, ${runtime} s" "$a $a_args" "$b $b_args$( [ "$b_record" = 1 ] && echo ' --record d=DIR')" <<'EOF'
import json, os, sys
work, rounds, load, what, a, b = sys.argv[1:7]
TICK = os.sysconf("SC_CLK_TCK")
def run(label, r):
    job = json.load(open(f"{work}/{label}-{r}.json"))["jobs"][0]
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    cpu = int(open(f"{work}/{label}-{r}.cpu").read()) / TICK * 1e6 / max(1, side["total_ios"])
    return side["iops"], cpu
print(f"{what}; load average before / after: {load}")
med = {}
for label, desc in (("A", a), ("B", b)):
    runs = [run(label, r) for r in range(1, int(rounds) + 1)]
    print(f"{label} ({desc}): " + ", ".join(f"{i:.0f} IOPS {c:.1f} us/op" for i, c in runs))
    med[label] = (sorted(i for i, _ in runs)[len(runs) // 2], sorted(c for _, c in runs)[len(runs) // 2])
traces = [f"{work}/trace-{r}.json" for r in range(1, int(rounds) + 1)]
if all(os.path.exists(t) for t in traces):
    kept = [json.load(open(t)) for t in traces]
    print("B's traces: " + ", ".join(f"{k['requests']} requests kept, {k['dropped']} dropped" for k in kept))
print(f"medians: A {med['A'][0]:.0f} IOPS {med['A'][1]:.1f} us/op, B {med['B'][0]:.0f} IOPS {med['B'][1]:.1f} us/op, B/A IOPS {med['B'][0] / med['A'][0]:.2f}x")
EOF
