#!/usr/bin/env bash
# Smoke run of the NBD peer benchmark (surge vs nbdkit, fio nbd engine): proves
# the script and both servers work. CI machines are shared and noisy, so it
# only fails on an order-of-magnitude regression; docs/performance.md has the
# real figures from full runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash bench/nbd-peers.sh --quick --min-ratio 0.25
