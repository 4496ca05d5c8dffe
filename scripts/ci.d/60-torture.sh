#!/usr/bin/env bash
# Issue 6: quick crash torture (SIGKILL/restart of a real `surge serve`) on every
# persistent export configuration, plus the negative control: a device that
# acknowledges flushes without doing them must be reported as losing data.
# Full runs (>= 200 cycles) are recorded in docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${SURGE_BIN:-${CARGO_TARGET_DIR:-target}/release/surge}"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)
run() { "$BIN" --log warn torture --cycles "${TORTURE_CYCLES:-15}" --seed "${TORTURE_SEED:-60}" --region 8MiB "$@" | tail -1; }

echo "-- file export"
run --export file:t.img,create=16MiB
echo "-- volatile write cache (unflushed writes may be lost, flushed ones not)"
run --pool base=file:t.img,create=16MiB --export fault:base,volatile

echo "-- elastic cache (a fast cache volume attaches under load; kills leave dirty blocks to recover)"
ELASTIC="elastic:backing=reserved:64MiB,bw=20MB/s,cache=reserved,cache_bw=400MB/s,initial=16MiB,min=4MiB,granularity=4MiB,attach_delay=0s,window=1s,id=2s"
if out=$("$BIN" --log warn torture --cycles "${TORTURE_ELASTIC_CYCLES:-5}" --seed 62 --export "$ELASTIC" 2>&1); then
  echo "$out" | tail -1
elif echo "$out" | grep -q 'unknown export kind "elastic"'; then
  echo "skipped: this build has no elastic export kind yet"
else
  echo "$out"; echo "FAIL: torture of the elastic cache"; exit 1
fi

echo "-- negative control: flushes acknowledged but dropped (must fail)"
neg=$(mktemp -d /tmp/surge-torture-neg.XXXXXX)
trap 'rm -rf "$neg"' EXIT
if out=$("$BIN" --log warn torture --cycles 3 --seed 61 --region 4MiB --data-dir "$neg" \
      --pool base=file:t.img,create=8MiB --export fault:base,volatile,flush.drop 2>&1); then
  echo "$out"
  echo "FAIL: torture did not notice a device that drops flushes"; exit 1
fi
echo "$out" | grep -E '^cycles|lost acknowledged data' | tail -2
echo "torture CI step took $(( $(date +%s) - start )) s"
