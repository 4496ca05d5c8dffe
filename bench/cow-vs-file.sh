#!/usr/bin/env bash
# A `file:` export and a `cow:` volume over the same fresh ext4 image, served
# by one `surge serve`, each reached as a user would: nbdfuse + loop (direct
# I/O) + ext4. fio lays out a file on each, then 1 MiB sequential reads of it
# (iodepth 4, direct) alternate between the two. Root (loop, mount).
#
#   bench/cow-vs-file.sh [--rounds 3] [--runtime 3] [-- SERVE-ARGS...]
#   e.g. with zero copy off:  bench/cow-vs-file.sh -- --no-zero-copy
set -euo pipefail
rounds=3 runtime=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift ;;
    --runtime) runtime="$2"; shift ;;
    --) shift; break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
surge="${SURGE:-$(dirname "$0")/../target/release/surge}"
surge="$(realpath "$surge")"
for t in nbdfuse fio mkfs.ext4 losetup; do command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 2; }; done
d=$(mktemp -d /var/tmp/surge-cow-vs-file.XXXXXX)
pid=""
cleanup() {
  umount -q "$d/mnt-file" "$d/mnt-cow" 2>/dev/null || true
  for l in "${loop_file:-}" "${loop_cow:-}"; do if [ -n "$l" ]; then losetup -d "$l" 2>/dev/null || true; fi; done
  for m in file cow; do fusermount -uq "$d/f-$m" 2>/dev/null || true; done
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$d"
}
trap cleanup EXIT
truncate -s 2G "$d/base.img"
mkfs.ext4 -q -F "$d/base.img"
cp --sparse=always "$d/base.img" "$d/file.img"
"$surge" --log warn serve "$@" --data-dir "$d/data" --control "$d/c.sock" --listen "unix:$d/s.sock" \
  --export "file=file:$d/file.img" --export "cow=cow:base=file:$d/base.img,overlay=file:$d/cow.ovl" > "$d/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
for m in file cow; do
  mkdir -p "$d/f-$m" "$d/mnt-$m"
  nbdfuse "$d/f-$m" "nbd+unix:///$m?socket=$d/s.sock" > /dev/null 2>&1 &
done
for m in file cow; do for _ in $(seq 100); do [ -e "$d/f-$m/nbd" ] && break; sleep 0.1; done; done
loop_file=$(losetup -f --show --direct-io=on "$d/f-file/nbd")
loop_cow=$(losetup -f --show --direct-io=on "$d/f-cow/nbd")
mount "$loop_file" "$d/mnt-file"
mount "$loop_cow" "$d/mnt-cow"
fio_args=(--ioengine=libaio --direct=1 --size=64M --bs=1M --iodepth=4)
for m in file cow; do
  fio --name=layout --filename="$d/mnt-$m/read.dat" --rw=write "${fio_args[@]}" > /dev/null
done
declare -A runs
for r in $(seq "$rounds"); do
  for m in file cow; do
    sync
    bw=$(fio --name=seqread --filename="$d/mnt-$m/read.dat" --rw=read "${fio_args[@]}" --runtime="$runtime" --time_based \
      --output-format=json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw"] / 1024))')
    echo "round $r $m: $bw MiB/s"
    runs[$m]+="$bw "
  done
done
for m in file cow; do
  echo "$m median: $(echo ${runs[$m]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') MiB/s"
done
