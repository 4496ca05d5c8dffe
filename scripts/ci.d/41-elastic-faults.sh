#!/usr/bin/env bash
# Issue 9: SIGKILL torture of an elastic export with fault rules on both devices
# (backing: a volatile write cache whose failed flushes lose what they held,
# write errors, flush errors, vanishing; cache volumes: write, read and flush
# errors, vanishing). Reported losses are acknowledged (--ack-losses); what was
# acknowledged before the last completed FLUSH must never be lost. The 200-cycle
# run is recorded in docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${SURGE_BIN:-${CARGO_TARGET_DIR:-target}/release/surge}"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)
SPEC="elastic:backing=reserved:64MiB,bw=20MB/s,cache=reserved,cache_bw=400MB/s,initial=16MiB,min=4MiB,granularity=4MiB,attach_delay=0s,window=1s,id=2s"
SPEC+=",backing_fault.volatile,backing_fault.flush.fail_loses,backing_fault.flush.fail_prob=0.02,backing_fault.write.fail_prob=0.001,backing_fault.vanish_after=4000,backing_fault.seed=5"
SPEC+=",cache_fault.write.fail_prob=0.001,cache_fault.read.fail_prob=0.001,cache_fault.flush.fail_prob=0.005,cache_fault.vanish_after=800,cache_fault.seed=6"
"$BIN" --log warn torture --ack-losses --cycles "${TORTURE_FAULT_CYCLES:-20}" --seed "${TORTURE_SEED:-41}" \
  --max-ops 1000 --region 8MiB --time-limit 120 --export "$SPEC" | tail -1
echo "elastic fault torture took $(( $(date +%s) - start )) s"
