#!/usr/bin/env bash
# `surge plan workload` on two synthetic fio iologs, to show the elastic-cache
# candidate (docs/plan.md, "Elastic cache: an example"): "bursty" has two
# 6-second bursts of 6,000 random 4 KiB writes a second (twice what gp3
# includes) at 60 s and 600 s, an fsync 1 s after each, and a 4 KiB read
# every 10 s for 20 minutes; "steady" has 2,000 random 4 KiB writes a second
# for 20 s and an fsync (within gp3's 3,000 IOPS); "long" has one 30-second
# burst of 256 KiB writes at 200 MiB/s (gp3 includes 125) at 60 s, an fsync,
# and a 4 KiB read every 10 s for 10 minutes. All over 1 GiB. bursty and
# steady are the shapes of the tests in crates/surge-sim/src/elastic.rs.
# Usage: scripts/bench/plan-elastic.sh [OUT_DIR] [INSTANCE]   (default /tmp/surge-plan-elastic, m5.2xlarge)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
OUT="${1:-/tmp/surge-plan-elastic}"
INSTANCE="${2:-m5.2xlarge}"
mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys
out = sys.argv[1]
def write(name, recs):
    recs.sort(key=lambda r: r[0])
    with open(f"{out}/{name}.iolog", "w") as f:
        f.write("fio version 3 iolog\n0 f add\n0 f open\n")
        for t, a in recs:
            f.write(f"{t} f {a}\n")
        f.write(f"{recs[-1][0] + 1} f close\n")
off = lambda i: (i * 2654435761 % 262144) * 4096
# times in µs
bursty = [(i * 10_000_000, f"read {i * 4096} 4096") for i in range(120)]
for start, seed in ((60, 0), (600, 7)):
    bursty += [(start * 1_000_000 + i * 1_000_000 // 6000, f"write {off(i + seed)} 4096") for i in range(6 * 6000)]
    bursty.append(((start + 7) * 1_000_000, "sync 0 0"))
write("bursty", bursty)
steady = [(i * 500, f"write {off(i)} 4096") for i in range(40_000)] + [(20_000_000, "sync 0 0")]
write("steady", steady)
long = [(i * 10_000_000, f"read {i * 4096} 4096") for i in range(60)]
long += [(60_000_000 + i * 1250, f"write {(i * 4099 % 4096) * 262144} 262144") for i in range(30 * 800)]
long.append((91_000_000, "sync 0 0"))
write("long", long)
PY
for t in bursty steady long; do
  rm -rf "$OUT/$t.trace"
  "$BIN" trace import --format fio-iolog "$OUT/$t.iolog" --out "$OUT/$t.trace" >/dev/null
  echo "== $t"
  "$BIN" plan workload --trace "$OUT/$t.trace" --instance "$INSTANCE" | tee "$OUT/$t.txt"
  "$BIN" plan workload --trace "$OUT/$t.trace" --instance "$INSTANCE" --json > "$OUT/$t.json"
done
