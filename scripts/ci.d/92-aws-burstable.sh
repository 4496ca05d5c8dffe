#!/usr/bin/env bash
# A burstable stripe on EBS (moto): `surge serve --config C` with provider =
# "aws" and b=burstable:persistent,size=8GiB,members=4. Checks the dry run
# (prints the calls, makes none), the members as tagged EBS volumes, a CloudWatch
# BurstBalance point taken over surge's credit model, which makes the policy
# swap every member, through NBD writes (volume ids change in
# moto, the old ones are deleted), the data read back exactly, a restart that
# finds the new members, and nothing leaked after stop. Quick: 11 to 25 s
# here (most of it moto's start and the daemon's restarts).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
surge="${CARGO_TARGET_DIR:-target}/release/surge"

. scripts/lib/moto.sh
aws_step 92-aws-burstable m5.large
aws_config '[[export]]
name = "b"
spec = "burstable:persistent,size=8GiB,members=4,rebuild_rate=off,tick=500ms,region=256KiB,cloudwatch_every=1s"'
nvol() { cloud list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }

# 1. Dry run: the four members' CreateVolume and AttachVolume with list
# prices, and no volume made.
"$surge" serve --config "$work/surge.toml" --data-dir "$work/data" --dry-run >"$work/dry.out"
cat "$work/dry.out"
[ "$(grep -c 'CreateVolume .* name=b-s[0-3]-g0 gp2:2GiB \$0.20/month' "$work/dry.out")" = 4 ]
[ "$(grep -c 'AttachVolume' "$work/dry.out")" = 4 ]
grep -q 'volumes to create, \$0.80/month' "$work/dry.out"
[ "$(nvol)" = 0 ] || { echo "the dry run made volumes"; cloud list; exit 1; }

start() {
  "$surge" serve --config "$work/surge.toml" --data-dir "$work/data" --listen "unix:$work/nbd.sock" \
    --control "$work/control.sock" >"$work/serve.out" 2>"$work/serve.err" &
  serve=$!
  for _ in $(seq 600); do grep -q "Connect with" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "Connect with" "$work/serve.out" || { cat "$work/serve.err"; exit 1; }
}
stop() { kill -TERM "$serve"; wait "$serve"; serve=; }
status() { "$surge" status --control "$work/control.sock" --json | python3 -c "import json,sys; s=[t for t in json.load(sys.stdin) if t['name'] == 'b/burstable'][0]['status']; $1"; }
nbd="nbd+unix:///b?socket=$work/nbd.sock"

# 2. Serve: four tagged gp2:2GiB members, an export of exactly 8 GiB.
start
grep -q "burstable persistent volume of 8GiB over 4 x gp2:2GiB" "$work/serve.out"
before=$(status 'print(" ".join(m["volume"] for m in s["members"]))')
[ "$(cloud list --json | python3 -c 'import json,sys; print(sorted(v["name"] for v in json.load(sys.stdin)))')" = "['b-s0-g0', 'b-s1-g0', 'b-s2-g0', 'b-s3-g0']" ]
[ "$(status 'print(s["size_bytes"])')" = $((8 << 30)) ]
qemu-io -f raw -c "write -P 0x5a 0 4M" -c "write -P 0xa5 7G 1M" "$nbd" >/dev/null

# 3. Credits: the model of surge's I/O until CloudWatch has a point; a point
# below the model (put with put_metric_data) is taken, and the policy swaps
# every member (strategy all) as the drop brings the threshold forward; NBD
# writes go on meanwhile.
[ "$(status 'print({m["credits_trusted"] for m in s["members"]})')" = "{'model'}" ]
m0=${before%% *}
put_burst_balance "$m0" 80
qemu-io -f raw -c "write -P 0x3c 1M 1M" "$nbd" >/dev/null
for _ in $(seq 600); do [ "$(status 'print(s["swaps_done"])')" = 4 ] && break; sleep 0.1; done
sleep 1 # no further swap follows
status 'print(s["decisions"][-1]["reason"])'
[ "$(status 'print(s["swaps_done"], all(x["ok"] for x in s["last_swaps"]), len(s["decisions"]))')" = "4 True 1" ] || { status 'print(s)'; exit 1; }
status 'r=s["decisions"][0]["reason"]; assert r.startswith("member 0 at 80.0 % of its credits"), r'
after=$(status 'print(" ".join(m["volume"] for m in s["members"]))')
for v in $before; do
  grep -qw "$v" <<<"$after" && { echo "member $v was not replaced ($before -> $after)"; exit 1; }
done
live=$(cloud list --json | python3 -c 'import json,sys; print(" ".join(sorted(v["id"] for v in json.load(sys.stdin))))')
[ "$live" = "$(tr ' ' '\n' <<<"$after" | sort | tr '\n' ' ' | sed 's/ $//')" ] || { echo "volumes in moto: $live; members: $after"; exit 1; }
check() {
  qemu-io -f raw -c "read -P 0x5a 0 1M" -c "read -P 0x3c 1M 1M" -c "read -P 0x5a 2M 2M" -c "read -P 0xa5 7G 1M" -c "read -P 0 4M 1M" "$nbd" >"$work/read.out"
  [ "$(grep -c 'read .*/.* bytes' "$work/read.out")" = 5 ] && ! grep -q "Pattern verification failed" "$work/read.out" || { cat "$work/read.out"; exit 1; }
}
check
stop

# 5. Detached at exit; a restart finds the new members and the same data.
[ "$(cloud list --json | python3 -c 'import json,sys; print({v["state"] for v in json.load(sys.stdin)})')" = "{'available'}" ]
start
[ "$(status 'print(" ".join(m["volume"] for m in s["members"]))')" = "$after" ]
check
stop

# 6. Nothing leaked: only the four members, no orphan.
[ "$(nvol)" = 4 ]
[ "$(cloud gc --dry-run --min-age 0s --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["orphans"]))')" = 0 ]
touch "$work/root/stop"; wait "$UDEV_PID" || true
echo "aws burstable step: dry run, members on EBS, CloudWatch point taken, swap of 4 members, data intact, restart, no leak: $(($(date +%s) - t0)) s"
