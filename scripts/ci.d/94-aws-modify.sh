#!/usr/bin/env bash
# In-place modification on EBS end to end (issue 39 item 4): `surge serve
# --config C` with `provider = "aws"` against moto and a `modify:` export,
# write bursts through NBD with qemu-io. Checks that the volume is raised to
# its peak spec in EC2 (DescribeVolumes) on a burst, that `surge status` shows
# the modification state moto reports and the rule, that it is lowered back
# after the inactivity delay (the rolling rule allows it: moto reports each
# modification `completed` at once), that the data reads back, and that the
# volume is left detached, not deleted, at exit. Quick: about 20-40 s.
#
# What moto does not emulate (docs/aws.md): `modifying` / `optimizing` states
# (every modification is `completed` at once), EBS's modification limits, no
# throughput or IOPS limits on the fake devices. The rule and the states are
# covered by `cargo test -p surge-aws --test moto modifications_` (the fault
# proxy rewrites the state and injects EBS's refusal) and by unit tests on
# virtual time (`cargo test -p surge --bin surge stack::modify`).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
surge="${CARGO_TARGET_DIR:-target}/release/surge"
. scripts/lib/moto.sh
aws_step 94-aws-modify
aws_config "" 'modify_rules = "ebs-24h"'
# A 1 s window and 3 s inactivity delay so the burst and the lowering fit in
# seconds; UT 5 % because the fake device has no EBS limits and a loaded CI
# machine writes through NBD at a few tens of MB/s.
peak="gp3:4GiB,iops=16000,throughput=1000MiB/s"
spec="app=modify:base=gp3:4GiB,peak=$peak,window=1s,id=3s,ut=0.05,poll=1s"
: >"$work/serve.out"
"$surge" serve --config "$work/surge.toml" --data-dir "$work/data" --listen "unix:$work/nbd.sock" \
  --control "$work/control.sock" --export "$spec" >"$work/serve.out" 2>>"$work/serve.err" &
serve=$!
for _ in $(seq 300); do grep -q "Connect with" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
grep -q "Connect with" "$work/serve.out" || fail "surge serve did not start"
nbd="nbd+unix:///app?socket=$work/nbd.sock"
field() { "$surge" status --json --control "$work/control.sock" | python3 -c "import json,sys; m=[t for t in json.load(sys.stdin) if t['name']=='app/modify'][0]['status']; print($1)"; }
ec2_spec() { cloud list --json | python3 -c 'import json,sys; print([v["spec"] for v in json.load(sys.stdin) if v["name"] == "app"][0])'; }

[ "$(field "m['rule']")" = ebs-24h ] || fail "rule: $(field "m['rule']")"
[ "$(ec2_spec)" = gp3:4GiB ] || fail "the volume starts at $(ec2_spec), not its base"
# 1. A burst raises the volume in EC2.
qemu-io -f raw -c "write -P 0x11 0 64M" "$nbd" >/dev/null
raised=""
for i in $(seq 1 12); do
  qemu-io -f raw -c "write -P 0x22 1G 512M" -c "write -P 0x22 1536M 512M" "$nbd" >/dev/null
  [ "$(field "m['raised']")" = True ] && { raised=$i; break; }
done
[ -n "$raised" ] || fail "not raised after 12 bursts of 1 GiB: $(field "(m['decisions'], m['last_error'])")"
[ "$(ec2_spec)" = "$peak" ] || fail "raised in surge but EC2 has $(ec2_spec)"
[ "$(field "m['modification']['state']")" = completed ] || fail "modification state: $(field "m['modification']")"
echo "raised to $peak after $raised bursts; DescribeVolumesModifications: $(field "m['modification']['state'], m['modification']['target']")"
# 2. Quiet: lowered back after ID.
for _ in $(seq 200); do [ "$(field "m['raised']")" = False ] && break; sleep 0.1; done
[ "$(field "m['raised']")" = False ] || fail "not lowered after the burst: $(field "(m['wanted'], m['waiting_because'], m['last_error'])")"
[ "$(ec2_spec)" = gp3:4GiB ] || fail "lowered in surge but EC2 has $(ec2_spec)"
[ "$(field "m['modifications']")" = 2 ] && [ "$(field "m['refusals']")" = 0 ] || fail "modifications/refusals: $(field "(m['modifications'], m['refusals'], m['decisions'])")"
out=$(qemu-io -f raw -c "read -P 0x11 0 64M" -c "read -P 0x22 1G 1G" "$nbd")
grep -q "read 67108864/67108864" <<<"$out" && grep -q "read 1073741824/1073741824" <<<"$out" || fail "data did not read back: $out"
echo "lowered to gp3:4GiB after the inactivity delay: $(field "m['decisions']")"
kill -TERM "$serve"; wait "$serve"; serve=""
state=$(cloud list --json | python3 -c 'import json,sys; print([v["state"] for v in json.load(sys.stdin) if v["name"] == "app"][0])')
[ "$state" = available ] || fail "after exit the volume is $state (expected detached, kept)"
echo "modify on aws: raised on a burst and lowered after it within ebs-24h; volume kept, detached"
echo "aws-modify step took $(( $(date +%s) - t0 )) s"
