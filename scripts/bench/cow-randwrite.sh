#!/usr/bin/env bash
# 4 KiB random writes through nbdfuse + loop + ext4 (the streaming experiment's
# guest path and its full-scale fio job) on a copy-on-write export against a
# file export of a copy of the same image: where the cow layer's cost shows,
# without the link or the other configurations. Root (loop devices, mounts).
#
#   scripts/bench/cow-randwrite.sh [IMAGE] [PAIRS] [perf|stat] [KINDS]
#
# IMAGE: an ext4 image (default: a 24 GiB sparse one made from
# /usr/share/doc). KINDS (default "file cow"): which exports run, in turn, in
# each of PAIRS rounds; `qcow2` is the experiment's qemu-qcow2 peer (qemu-nbd,
# its defaults, serving a qcow2 overlay whose backing file is the NBD base).
# Prints the IOPS of each run; with `stat`, the serving process's CPU per
# write; with `perf`, a `perf record -g` of it in $WORK/perf.KIND.data.
set -euo pipefail
SURGE="$(cd "$(dirname "$0")/../.." && pwd)/${CARGO_TARGET_DIR:-target}/release/surge"
WORK="${WORK:-/var/tmp/surge-cow-randwrite}"
PAIRS="${2:-2}"
MODE="${3:-}"
KINDS="${4:-file cow}"
mkdir -p "$WORK"
cd "$WORK"
IMAGE="${1:-}"
if [ -z "$IMAGE" ]; then
  IMAGE="$WORK/base.img"
  if [ ! -e "$IMAGE" ]; then
    truncate -s 24G "$IMAGE"
    mkfs.ext4 -q -F -d /usr/share/doc "$IMAGE"
  fi
fi
IMAGE="$(realpath "$IMAGE")"
pids=()
LOOP=""
teardown() {
  umount "$WORK/mnt" 2>/dev/null || true
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
  LOOP=""
  for _ in $(seq 50); do fusermount3 -u "$WORK/fuse" 2>/dev/null && break; sleep 0.1; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap teardown EXIT
machine_busy() { # CPUs busy on average over the next $1 s (from /proc/stat)
  local a b
  a=$(head -1 /proc/stat); sleep "$1"; b=$(head -1 /proc/stat)
  python3 -c "a, b = [list(map(int, l.split()[1:])) for l in ('$a', '$b')]
d = [y - x for x, y in zip(a, b)]
idle = d[3] + d[4]  # idle, iowait
print(round((sum(d) - idle) / sum(d) * $(nproc), 3))"
}
one() { # one run of $1 (file|cow|qcow2)
  local kind=$1 spec server busy_probe
  rm -rf st vm mnt fuse vm.ovl vm.qcow2 local.img
  mkdir -p st vm mnt fuse
  "$SURGE" --log warn serve --data-dir st --control st/c.sock --listen unix:"$WORK/st/base.sock" \
    --export "base=file:$IMAGE" --read-only base > st/log 2>&1 & pids+=($!)
  local base="nbd+unix:///base?socket=$WORK/st/base.sock"
  case "$kind" in
    cow|qcow2) for _ in $(seq 100); do nbdinfo --size "$base" >/dev/null 2>&1 && break; sleep 0.2; done ;;
  esac
  case "$kind" in
    cow) spec="vm=cow:base=$base,overlay=$WORK/vm.ovl" ;;
    file)
      cp --sparse=always "$IMAGE" local.img
      spec="vm=file:$WORK/local.img" ;;
    qcow2) qemu-img create -q -f qcow2 -F raw -b "$base" vm.qcow2 ;;
    *) echo "unknown kind $kind (file, cow or qcow2)" >&2; exit 2 ;;
  esac
  if [ "$kind" = qcow2 ]; then
    qemu-nbd --persistent --shared=8 --format=qcow2 -x vm --socket "$WORK/vm/vm.sock" vm.qcow2 > vm/log 2>&1 & server=$!
  else
    "$SURGE" --log warn serve --data-dir vm --control vm/c.sock --listen unix:"$WORK/vm/vm.sock" --export "$spec" > vm/log 2>&1 & server=$!
  fi
  pids+=($server)
  local uri="nbd+unix:///vm?socket=$WORK/vm/vm.sock"
  for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.2; done
  nbdfuse fuse "$uri" > fuse.log 2>&1 & pids+=($!)
  for _ in $(seq 50); do [ -e fuse/nbd ] && break; sleep 0.1; done
  LOOP=$(losetup --find --show --direct-io=on fuse/nbd)
  mount -t ext4 "$LOOP" mnt
  local job=(--output-format=json --ioengine=libaio --direct=1 --numjobs=1 --group_reporting --name=randwrite
    --filename=mnt/randwrite.dat --size=4G --rw=randwrite --bs=4k --iodepth=16 --time_based)
  fio "${job[@]}" --runtime=3 > /dev/null # lay the file out, warm up
  local probe=""
  case "$MODE" in
    perf) perf record -g -p "$server" -o "$WORK/perf.$kind.data" -- sleep 12 > /dev/null 2>&1 & probe=$! ;;
    stat)
      perf stat -x, -e task-clock -p "$server" -o "$WORK/stat.$kind" -- sleep 12 > /dev/null 2>&1 & probe=$!
      machine_busy 12 > "$WORK/busy.$kind" & busy_probe=$! ;;
  esac
  local iops
  iops=$(fio "${job[@]}" --runtime=15 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))')
  [ -n "$probe" ] && wait "$probe"
  if [ "$MODE" = stat ]; then
    local ms
    ms=$(grep task-clock "$WORK/stat.$kind" | cut -d, -f1)
    wait "$busy_probe"
    read -r busy < "$WORK/busy.$kind"
    python3 -c "ms, busy, iops = $ms, $busy, $iops
server, machine = ms * 1000 / (iops * 12), busy * 1e6 / iops
print(f'$kind: {iops} IOPS; CPU per write: serving process {server:.1f} µs, machine {machine:.1f} µs ({busy:.2f} of $(nproc) CPUs busy), the rest {machine - server:.1f} µs')"
  else
    echo "$kind: $iops IOPS"
  fi
  teardown
}
for _ in $(seq "$PAIRS"); do
  for k in $KINDS; do one "$k"; done
done
