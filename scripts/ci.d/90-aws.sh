#!/usr/bin/env bash
# The AWS EBS provider end to end: the `surge` built by scripts/test-all.sh
# (with --features surge/aws) drives `surge cloud --provider aws` and `surge
# serve --provider aws` against moto in server mode.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
# The binary comes from scripts/test-all.sh's build (features surge/aws and
# surge/etcd), which also ran surge-aws's moto tests under `cargo test`.
surge="${CARGO_TARGET_DIR:-target}/release/surge"

# `surge cloud` against a moto server on a free loopback port.
work=$(mktemp -d)
. scripts/lib/moto.sh
moto_start "$work"
port=$MOTO_PORT moto=$MOTO_PID
trap 'kill $moto 2>/dev/null || true; touch "$work/root/stop" 2>/dev/null; rm -rf "$work"' EXIT
cat >"$work/surge.toml" <<TOML
provider = "aws"
[aws]
region = "us-east-1"
endpoint_url = "http://127.0.0.1:$port"
availability_zone = "us-east-1a"
owner = "ci"
TOML
"$surge" cloud --config "$work/surge.toml" create gp3:1GiB,iops=4000 --name kept >/dev/null
orphan=$("$surge" cloud --config "$work/surge.toml" create st1:125GiB)
"$surge" cloud --config "$work/surge.toml" list
out=$("$surge" cloud --config "$work/surge.toml" gc --min-age 0s)
echo "$out"
grep -q "deleted $orphan st1:125GiB" <<<"$out"
grep -q "kept .* gp3:1GiB,iops=4000: named \"kept\"" <<<"$out"
[ "$("$surge" cloud --config "$work/surge.toml" list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1 ]

# `surge serve --provider aws` end to end: an instance in moto, a fake udev
# (python, boto3 comes with moto) that links attached volumes under a fake
# /dev, qemu-io through NBD, and the volume detached again at exit.
fake_instance "$work"
udev=$UDEV_PID instance=$INSTANCE zone=$ZONE
cat >>"$work/surge.toml" <<TOML
instance_id = "$instance"
device_root = "$work/root"
direct_io = false
poll = "100ms"
TOML
"$surge" serve --config "$work/surge.toml" --data-dir "$work/data" --listen "unix:$work/nbd.sock" \
  --control "$work/control.sock" --export e=gp2:1GiB >"$work/serve.out" 2>"$work/serve.err" &
serve=$!
for _ in $(seq 300); do grep -q "Connect with" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
grep -q "Connect with" "$work/serve.out" || { cat "$work/serve.err"; exit 1; }
qemu-io -f raw -c "write -P 0x5a 1M 1M" "nbd+unix:///e?socket=$work/nbd.sock" >/dev/null
qemu-io -f raw -c "read -P 0x5a 1M 1M" "nbd+unix:///e?socket=$work/nbd.sock" | grep -q "read 1048576/1048576"
"$surge" status --control "$work/control.sock" | grep -q "gp2:1GiB"
kill -TERM "$serve"; wait "$serve"
read -r state vol < <("$surge" cloud --config "$work/surge.toml" list --json | python3 -c 'import json,sys; v=[v for v in json.load(sys.stdin) if v["name"] == "e"][0]; print(v["state"], v["id"])')
[ "$state" = available ] || { echo "volume e is $state after exit"; exit 1; }
# The export's volume (moto also attaches the instance's root volume).
cmp <(dd if="$work/root/dev/ebs-$vol" bs=1M skip=1 count=1 status=none) <(head -c 1M /dev/zero | tr '\0' '\132')
touch "$work/root/stop"; wait "$udev" || true
echo "surge serve --provider aws: created, attached, served over NBD, detached at exit"
t4=$(date +%s)
echo "aws step: cloud CLI and serve against moto took $((t4 - t0)) s"
