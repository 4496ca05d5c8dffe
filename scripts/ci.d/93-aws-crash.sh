#!/usr/bin/env bash
# Issue 39 item 5 on EBS (moto): SIGKILL of `surge serve` in the middle of a
# burstable swap, while the rebuild onto the fresh members runs (throttled to
# 1 MiB/s so the kill lands there: the status shows the rebuild under way).
# The restart finds members and swap targets by their tags, resumes the
# rebuild and completes the swap; every write acknowledged before the kill
# (and flushed) reads back exactly; moto holds exactly the new members and
# `surge cloud gc` finds nothing. (The kills between CreateVolume and
# AttachVolume need the fault proxy: crates/surge/tests/aws_faults.rs.)
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
surge="${CARGO_TARGET_DIR:-target}/release/surge"

. scripts/lib/moto.sh
aws_step 93-aws-crash m5.large
aws_config '[[export]]
name = "b"
spec = "burstable:persistent,size=4GiB,members=2,rebuild_rate=1MiB/s,tick=200ms,region=256KiB,cloudwatch_every=1s"'
ids() { cloud list --json | python3 -c 'import json,sys; print(" ".join(sorted(v["id"] for v in json.load(sys.stdin))))'; }
start() {
  : >"$work/serve.out"
  "$surge" serve --config "$work/surge.toml" --data-dir "$work/data" --listen "unix:$work/nbd.sock" \
    --control "$work/control.sock" >"$work/serve.out" 2>>"$work/serve.err" &
  serve=$!
  for _ in $(seq 600); do grep -q "Connect with" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "Connect with" "$work/serve.out" || fail "surge serve did not start"
}
status() { "$surge" status --control "$work/control.sock" --json | python3 -c "import json,sys; s=[t for t in json.load(sys.stdin) if t['name'] == 'b/burstable'][0]['status']; $1"; }
members() { status 'print(" ".join(sorted(m["volume"] for m in s["members"])))'; }
nbd="nbd+unix:///b?socket=$work/nbd.sock"

start
before=$(members)
# 24 MiB over both members (the rebuild copies what is written: 12 MiB each at
# 1 MiB/s), then a flush: acknowledged and durable.
qemu-io -f raw -c "write -P 0x5a 0 16M" -c "write -P 0x3c 16M 8M" -c "write -P 0xa5 3G 1M" -c flush "$nbd" >/dev/null
m0=${before%% *}
put_burst_balance "$m0" 80
# The swap under way: both rebuilds have copied something, neither is done.
for _ in $(seq 300); do
  [ "$(status 'r=[m["rebuild"] for m in s["members"]]; print(all(x and 0 < x["copied_bytes"] < x["size_bytes"] for x in r))')" = True ] && break
  sleep 0.1
done
progress=$(status 'print([(m["volume"], m["swap_to"], m["rebuild"] and m["rebuild"]["percent"]) for m in s["members"]])')
[ "$(status 'print(all(m["rebuild"] and m["swap_to"] for m in s["members"]))')" = True ] || fail "no rebuild under way: $progress"
# A write during the rebuild, flushed: it reaches both legs before the ack.
qemu-io -f raw -c "write -P 0x77 20M 1M" -c flush "$nbd" >/dev/null
targets=$(status 'print(" ".join(sorted(m["swap_to"] for m in s["members"])))')
kill -9 "$serve"; wait "$serve" 2>/dev/null || true; serve=
echo "SIGKILLed mid-swap: $progress"
[ "$(ids)" = "$(tr ' ' '\n' <<<"$before $targets" | sort | tr '\n' ' ' | sed 's/ $//')" ] || fail "moto after the kill: $(ids), members $before, targets $targets"

# Restart: the rebuild resumes (unthrottled now) and the swap completes.
start
"$surge" set --control "$work/control.sock" b/burstable rebuild_rate=off
for _ in $(seq 300); do [ "$(status 'print(s["rebuilds_in_flight"] == 0 and all(not m["swap_to"] for m in s["members"]))')" = True ] && break; sleep 0.1; done
after=$(members)
[ "$after" = "$targets" ] || fail "the swap did not complete onto $targets: members $after, $(status 'print(s["members"])')"
check() {
  qemu-io -f raw -c "read -P 0x5a 0 16M" -c "read -P 0x3c 16M 4M" -c "read -P 0x77 20M 1M" -c "read -P 0x3c 21M 3M" \
    -c "read -P 0xa5 3G 1M" -c "read -P 0 24M 1M" "$nbd" >"$work/read.out"
  [ "$(grep -c 'read .*/.* bytes' "$work/read.out")" = 6 ] && ! grep -q "Pattern verification failed" "$work/read.out" || { cat "$work/read.out"; fail "data lost"; }
}
check
[ "$(ids)" = "$after" ] || fail "moto holds $(ids), members are $after"
kill -TERM "$serve"; wait "$serve"; serve=
[ "$(cloud gc --dry-run --min-age 0s --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["orphans"]))')" = 0 ] || fail "gc finds orphans: $(cloud gc --dry-run --min-age 0s)"
start
check
kill -TERM "$serve"; wait "$serve"; serve=
touch "$work/root/stop"; wait "$UDEV_PID" || true
echo "aws crash step: SIGKILL mid-swap on EBS, swap resumed and completed, data intact, nothing leaked: $(($(date +%s) - t0)) s"
