#!/usr/bin/env bash
# A single pass of writes to a file export on tmpfs: nbdcopy (its defaults)
# copies a 1 GiB random image in; prints the wall time and the server's CPU
# time, and checks the copy, for each surge binary given, 3 rounds interleaved.
#
#   scripts/bench/import-tmpfs-ab.sh SURGE_BINARY [SURGE_BINARY ...]
set -euo pipefail
W=/dev/shm/imp; rm -rf $W; mkdir -p $W
head -c 1G /dev/urandom > $W/src.img
for round in 1 2 3; do for b in "$@"; do
  rm -f $W/img $W/*.sock; rm -rf $W/d; truncate -s 1G $W/img
  $b --log warn serve --data-dir $W/d --control $W/c.sock --listen unix:$W/s.sock --export d=file:$W/img > $W/log 2>&1 & S=$!
  for i in $(seq 50); do nbdinfo --size "nbd+unix:///d?socket=$W/s.sock" >/dev/null 2>&1 && break; sleep 0.1; done
  t0=$(date +%s.%N); c0=$(awk '{print $14+$15}' /proc/$S/stat)
  nbdcopy $W/src.img "nbd+unix:///d?socket=$W/s.sock"
  t1=$(date +%s.%N); c1=$(awk '{print $14+$15}' /proc/$S/stat)
  kill $S; wait $S 2>/dev/null || true
  cmp -s $W/src.img $W/img || echo "MISMATCH $b"
  echo "$b wall $(python3 -c "print(round($t1-$t0,2))") s server cpu $(python3 -c "print(round(($c1-$c0)/100,2))") s"
done; done
rm -rf $W
