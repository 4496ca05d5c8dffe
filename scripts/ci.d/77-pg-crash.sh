#!/usr/bin/env bash
# Issue 37: the PostgreSQL crash check (scripts/pg-crash-check.sh) on a cow:
# export (base over NBD, stream job running) and on a burstable:persistent
# export (a member swap rebuilding): pgbench on ext4, SIGKILL of surge serve,
# restart, journal replay + e2fsck, PostgreSQL recovery, pg_amcheck, pgbench's
# balance invariant and every logged commit in the history. Then the negative
# control: on an export that drops acknowledged flushes the check must fail.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)
quiet() { grep -E '^\[|^  (at|after)|FAIL' || true; }
for kind in cow burstable; do
  scripts/pg-crash-check.sh "$kind" > "/tmp/pg-crash-$kind.log" 2>&1 || { cat "/tmp/pg-crash-$kind.log"; echo "FAIL: PostgreSQL crash check on $kind"; exit 1; }
  quiet < "/tmp/pg-crash-$kind.log"
done
if scripts/pg-crash-check.sh dropped-flushes > /tmp/pg-crash-neg.log 2>&1; then
  cat /tmp/pg-crash-neg.log
  echo "FAIL: the PostgreSQL crash check did not notice an export that drops flushes"; exit 1
fi
grep -E '^FAIL' /tmp/pg-crash-neg.log | sed 's/^/negative control, as it must: /'
rm -f /tmp/pg-crash-*.log
echo "PostgreSQL crash check step took $(( $(date +%s) - start )) s"
