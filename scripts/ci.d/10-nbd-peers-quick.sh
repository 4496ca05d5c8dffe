#!/usr/bin/env bash
# Smoke run of the NBD peer benchmark (surge vs nbdkit's file plugin, qemu-nbd
# twice (writeback+threads, its defaults) and nbd-server, with nbdkit's null
# plugin as the ceiling; fio nbd engine; 24 runs of 3 s, about 100 s, where
# nbdkit alone took 78 s): proves the script and the servers
# work, including surge's zero-copy paths for the file export. CI machines are shared and noisy, so it
# only fails on an order-of-magnitude regression; docs/performance.md has the
# real figures from full runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The binary scripts/test-all.sh built (its feature set): building here
# without those features would recompile surge and replace it.
bash bench/nbd-peers.sh --quick --min-ratio 0.25 --surge "${CARGO_TARGET_DIR:-target}/release/surge"
