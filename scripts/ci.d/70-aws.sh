#!/usr/bin/env bash
# The AWS EBS provider: build surge-aws (the AWS SDK), run its tests against
# moto in server mode, build `surge --features aws` and drive `surge cloud
# --provider aws` against moto. Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
# One cargo invocation for surge-aws and `surge --features aws`: with the same
# package selection every build shares one feature resolution, so the SDK is
# compiled once (a second selection would rebuild it with other features).
cargo test --release --locked -p surge-aws -p surge --features surge/aws --no-run 2>&1 | tail -1
t1=$(date +%s)
cargo test --release --locked -p surge-aws -p surge --features surge/aws
t2=$(date +%s)
t3=$t2

# `surge cloud` against a moto server on a free loopback port.
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m moto.server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto=$!
trap 'kill $moto 2>/dev/null || true; touch "$work/root/stop" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
cat >"$work/surge.toml" <<TOML
provider = "aws"
[aws]
region = "us-east-1"
endpoint_url = "http://127.0.0.1:$port"
availability_zone = "us-east-1a"
owner = "ci"
TOML
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
surge="${CARGO_TARGET_DIR:-target}/release/surge"
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
mkdir -p "$work/root/dev/disk/by-id"
python3 - "$port" "$work/root" >"$work/instance" <<'PY' &
import boto3, os, sys, time
port, root = sys.argv[1], sys.argv[2]
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}")
i = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]
print(i["InstanceId"], i["Placement"]["AvailabilityZone"], flush=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists(f"{root}/stop"):
    for v in ec2.describe_volumes()["Volumes"]:
        vid, link = v["VolumeId"], f"{root}/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{v['VolumeId'].replace('-', '')}"
        if any(a["State"] == "attached" for a in v.get("Attachments", [])):
            data = f"{root}/dev/ebs-{vid}"
            if not os.path.exists(data):
                with open(data, "wb") as f:
                    f.truncate(v["Size"] << 30)
            if not os.path.islink(link):
                os.symlink(f"../../ebs-{vid}", link)
        elif os.path.islink(link):
            os.remove(link)
    time.sleep(0.05)
PY
udev=$!
for _ in $(seq 100); do [ -s "$work/instance" ] && break; sleep 0.1; done
read -r instance zone <"$work/instance"
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
state=$("$surge" cloud --config "$work/surge.toml" list --json | python3 -c 'import json,sys; print([v["state"] for v in json.load(sys.stdin) if v["name"] == "e"][0])')
[ "$state" = available ] || { echo "volume e is $state after exit"; exit 1; }
cmp <(dd if="$(ls "$work"/root/dev/ebs-vol-*)" bs=1M skip=1 count=1 status=none) <(head -c 1M /dev/zero | tr '\0' '\132')
touch "$work/root/stop"; wait "$udev" || true
echo "surge serve --provider aws: created, attached, served over NBD, detached at exit"
t4=$(date +%s)
echo "aws step: build (SDK, surge-aws, surge --features aws) $((t1 - t0)) s, tests (moto and surge's) $((t2 - t1)) s, cloud CLI and serve $((t4 - t3)) s"
