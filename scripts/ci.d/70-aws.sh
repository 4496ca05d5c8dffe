#!/usr/bin/env bash
# The AWS EBS provider: build surge-aws (the AWS SDK), run its tests against
# moto in server mode, build `surge --features aws` and drive `surge cloud
# --provider aws` against moto. Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
cargo test --release --locked -p surge-aws --no-run 2>&1 | tail -1
t1=$(date +%s)
cargo test --release --locked -p surge-aws
t2=$(date +%s)
cargo build --release --locked -p surge --features aws 2>&1 | tail -1
t3=$(date +%s)

# `surge cloud` against a moto server on a free loopback port.
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m moto.server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto=$!
trap 'kill $moto 2>/dev/null || true; rm -rf "$work"' EXIT
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
t4=$(date +%s)
echo "aws step: build surge-aws tests $((t1 - t0)) s, moto tests $((t2 - t1)) s, surge --features aws $((t3 - t2)) s, cloud CLI $((t4 - t3)) s"
