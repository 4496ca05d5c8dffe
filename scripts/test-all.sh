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
  openssl gnutls-bin ca-certificates \
  iproute2 postgresql coreutils >/dev/null

echo "== cargo build"
cargo build --release --workspace --locked 2>&1 | tail -3

echo "== cargo test"
# Release profile (with overflow checks, see Cargo.toml): reuses the build above
# instead of compiling everything a second time.
cargo test --release --workspace --locked

# Further steps (real-client checks, bounded fuzzing, quick experiments) live in
# scripts/ci.d/, one file each, run in name order.
for step in scripts/ci.d/*.sh; do
  [ -e "$step" ] || continue
  echo "== $step"
  bash "$step"
done
echo "== all tests passed"
