#!/usr/bin/env bash
# How fast this machine maps fresh anonymous memory: touches MIB MiB (one
# byte per page) in a new process, ROUNDS times. On a VM with free page
# reporting (Firecracker's page_reporting, virtio-balloon), memory the guest
# freed has gone back to the host and the first touch of it is far slower
# than a touch of memory the guest used a moment ago; surge's chunk memory is
# mapped ahead of use for that reason (docs/burst-buffer.md, Chunk memory).
#
#   scripts/bench/first-touch.sh [MIB] [ROUNDS]
#
# Needs a C compiler (cc). Prints one line per round.
set -euo pipefail
MIB=${1:-8192}
ROUNDS=${2:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cat >"$W/touch.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
int main(int argc, char **argv) {
    size_t n = (size_t)atol(argv[1]) << 20;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("touched %zu MiB in %.3f s: %.0f MB/s\n", n >> 20, s, n / s / 1e6);
    return 0;
}
C
cc -O2 -o "$W/touch" "$W/touch.c"
for _ in $(seq "$ROUNDS"); do "$W/touch" "$MIB"; done
