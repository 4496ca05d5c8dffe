#!/usr/bin/env bash
# Issue 5 (fair sharing): run the quick fairshare experiment through NBD and
# check the paper-beating thresholds from results.json; fail loudly otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${FAIRSHARE_OUT:-$(mktemp -d /tmp/surge-fairshare.XXXXXX)}"
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)

# 1. The daemon: two exports sharing one pool, live weight change, per-tenant stats.
D=$(mktemp -d /tmp/surge-qos.XXXXXX)
"$BIN" --log warn serve --data-dir "$D" --listen "unix:$D/nbd.sock" --pool pool=memory:64MiB \
  --export a=share:pool,weight=4 --export b=share:pool,weight=1,limit=50MB/s &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$D/control.sock" ] && [ -S "$D/nbd.sock" ] && break; sleep 0.1; done
qemu-io -f raw -c 'write -P 7 0 4M' "nbd+unix:///a?socket=$D/nbd.sock" >/dev/null
qemu-io -f raw -c 'read -P 7 0 4M' "nbd+unix:///a?socket=$D/nbd.sock" >/dev/null
"$BIN" qos --data-dir "$D" set a weight=8 depth=4
"$BIN" qos --data-dir "$D" set b limit=off
"$BIN" qos --data-dir "$D" | tee "$D/qos.txt"
"$BIN" status --data-dir "$D" --json > "$D/status.json"
python3 - "$D/status.json" <<'PY'
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
a, b = t["qos/a"]["tenant"], t["qos/b"]["tenant"]
assert a["config"]["weight"] == 8, a
assert b["config"]["limit"] is None, b
assert t["qos/a"]["pool_depth"] == 4, t["qos/a"]
assert a["bytes"] == 8 << 20 and a["ops"] >= 2, a
assert a["recent"]["p99_us"] >= a["recent"]["p50_us"] and a["recent"]["p99_us"] > 0, a
assert b["bytes"] == 0, b
print("daemon qos check ok:", {k: a[k] for k in ("ops", "bytes")}, a["recent"])
PY
kill $SERVE; wait $SERVE || true
trap - EXIT

# 2. The quick experiment.
"$BIN" --log warn experiment fairshare --quick --out "$OUT"
echo "fairshare quick run took $(( $(date +%s) - start )) s; results in $OUT"
python3 - "$OUT/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
for x in r["ratios"]:
    if x["request_bytes"] == 1 << 20 and 2 <= x["target"] <= 16:
        ok = x["achieved"] >= 0.95 * x["target"]
        print(f'  ratio {x["target"]}:1 @ 1 MiB: achieved {x["achieved"]:.3f} (need >= {0.95 * x["target"]:.2f}) {"ok" if ok else "FAIL"}')
        if not ok:
            bad.append(f'ratio {x["target"]}:1 achieved {x["achieved"]:.3f}')
        if x.get("both_backlogged") is not None and x["both_backlogged"] < 0.9:
            bad.append(f'ratio {x["target"]}:1: both tenants backlogged in only {x["both_backlogged"]:.0%} of samples')
targets = {x["target"] for x in r["ratios"] if x["request_bytes"] == 1 << 20}
if not {2, 4, 8, 16} <= targets:
    bad.append(f"missing 1 MiB targets: have {sorted(targets)}")
j = r["asymmetric_jain"]
print(f"  asymmetric 48:3 Jain {j:.4f} (need >= 0.99) {'ok' if j >= 0.99 else 'FAIL'}")
if not j >= 0.99:
    bad.append(f"asymmetric Jain {j:.4f}")
o = r["overhead_pct"]
print(f"  overhead {o:.2f} % (need < 3 %) {'ok' if o < 3 else 'FAIL'}")
if not o < 3:
    bad.append(f"overhead {o:.2f} %")
for f in ("report.md", "timeline.svg", "depth.svg", "ratios.svg"):
    import os
    if not os.path.getsize(os.path.join(os.path.dirname(sys.argv[1]), f)):
        bad.append(f"{f} is empty")
if bad:
    print("FAIRSHARE THRESHOLDS NOT MET: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
print("fairshare: all thresholds met")
PY
