#!/usr/bin/env bash
# Issue 6: bounded stable fuzzing of every fuzz target (NBD handshake, NBD
# requests, cache metadata, fault rules): replay fuzz/corpus and
# fuzz/regressions, then seeded mutation for SURGE_FUZZ_SECS per target.
# Long coverage-guided runs (cargo +nightly fuzz) are recorded in docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/../../fuzz"
# Share the workspace's build directory: most dependencies are already built there.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}"
start=$(date +%s)
# No --locked: fuzz/Cargo.lock must follow whatever the workspace crates add.
SURGE_FUZZ_SECS="${SURGE_FUZZ_SECS:-8}" cargo test --release --no-default-features -- --nocapture
echo "fuzz CI step took $(( $(date +%s) - start )) s"
