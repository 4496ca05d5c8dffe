# Sourced by the AWS CI steps (scripts/ci.d/9*-aws*.sh): moto in server mode
# on a free loopback port, and an EC2 instance in it with a fake udev.

# moto_start WORK: start moto (log in WORK/moto.log), wait until it answers
# (it imports slowly on a loaded machine: up to a minute); sets MOTO_PORT and
# MOTO_PID and exports moto's test credentials.
moto_start() {
  MOTO_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" >"$1/moto.log" 2>&1 &
  MOTO_PID=$!
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"$MOTO_PORT") 2>/dev/null && break; sleep 0.1; done
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
}

# fake_instance WORK [TYPE]: an instance in moto and the fake udev linking its
# attached volumes under WORK/root/dev (scripts/lib/fake-udev.py); sets
# INSTANCE, ZONE and UDEV_PID. `touch WORK/root/stop` ends the udev.
fake_instance() {
  mkdir -p "$1/root/dev/disk/by-id"
  python3 "$(dirname "${BASH_SOURCE[0]}")/fake-udev.py" "$MOTO_PORT" "$1/root" ${2:+"$2"} >"$1/instance" &
  UDEV_PID=$!
  for _ in $(seq 600); do [ -s "$1/instance" ] && break; sleep 0.1; done
  read -r INSTANCE ZONE <"$1/instance"
}

# aws_step NAME [TYPE]: the common start of an AWS CI step that serves. Sets
# work (a scratch dir, kept at exit if KEEP_WORK is set), port, instance and
# zone; starts moto and the fake instance; at exit kills $serve (if the step
# set it), stops the udev and moto, and on failure shows the end of
# $work/serve.err. fail MSG names the step.
aws_step() {
  step=$1
  work=$(mktemp -d)
  serve=""
  trap aws_step_cleanup EXIT
  moto_start "$work"
  port=$MOTO_PORT
  fake_instance "$work" ${2:+"$2"}
  instance=$INSTANCE zone=$ZONE
}

aws_step_cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -f "$work/serve.err" ]; then tail -30 "$work/serve.err" >&2 || true; fi
  if [ -n "$serve" ]; then kill -9 "$serve" 2>/dev/null || true; fi
  touch "$work/root/stop" 2>/dev/null || true
  wait "$UDEV_PID" 2>/dev/null || true
  kill "$MOTO_PID" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}

fail() { echo "$step: $*" >&2; exit 1; }

# aws_config [TOP] [AWS]: $work/surge.toml for provider "aws" on moto and the
# fake instance; TOP (top-level keys, [[export]] tables) goes before [aws],
# AWS (further [aws] keys) at the end.
aws_config() {
  {
    echo 'provider = "aws"'
    [ -n "${1:-}" ] && echo "$1"
    cat <<TOML
[aws]
region = "us-east-1"
endpoint_url = "http://127.0.0.1:$port"
availability_zone = "$zone"
instance_id = "$instance"
owner = "ci"
device_root = "$work/root"
direct_io = false
poll = "100ms"
TOML
    [ -n "${2:-}" ] && echo "$2"
    true
  } >"$work/surge.toml"
}

cloud() { "$surge" cloud --config "$work/surge.toml" "$@"; }

# put_burst_balance VOLUME PERCENT: a CloudWatch BurstBalance point for
# VOLUME, now (moto's CloudWatch, boto3).
put_burst_balance() {
  python3 - "$port" "$1" "$2" <<'PY'
import boto3, sys, datetime
cw = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}")
cw.put_metric_data(Namespace="AWS/EBS", MetricData=[{"MetricName": "BurstBalance", "Dimensions": [{"Name": "VolumeId", "Value": sys.argv[2]}],
                   "Timestamp": datetime.datetime.now(datetime.timezone.utc), "Value": float(sys.argv[3]), "Unit": "Percent"}])
PY
}
