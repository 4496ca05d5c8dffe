#!/usr/bin/env bash
# Issue 4 (elastic cache): an elastic export in the daemon (write, read back,
# status), then the quick CM1-style experiment; thresholds from results.json:
# adaptive within 3.3 % of static-fast completion, cost <= 35 % of static-fast
# and below static-slow, every approach's data verified. Issue 14 (dollars):
# a cache=auto export in the daemon shows its priced plans; in both priced
# scenarios adaptive's total dollars (the instance billed until it could stop,
# its last drain included) are below static-slow's and modify-volume's (AWS's
# 4-per-24 h rule), in the iops scenario the lowest of all with its storage dollars
# <= 35 % of static-fast's; its completion within 3.3 % of static-fast (goal
# 2 %). Issue 40: the quick run has nothing on PATH. Fails loudly otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${ELASTIC_OUT:-$(mktemp -d /tmp/surge-elastic.XXXXXX)}"
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)

# Serve export d=SPEC from a fresh data dir ($D), write SIZE of pattern P
# through NBD, read it back, save `surge status --json` as $D/status.json.
daemon_burst() {
  D=$(mktemp -d /tmp/surge-elastic-d.XXXXXX)
  "$BIN" --log warn serve --data-dir "$D" --listen "unix:$D/nbd.sock" --export "d=$1" &
  SERVE=$!
  trap 'kill $SERVE 2>/dev/null || true' EXIT
  for _ in $(seq 100); do [ -S "$D/control.sock" ] && [ -S "$D/nbd.sock" ] && break; sleep 0.1; done
  qemu-io -f raw -c "write -P $2 0 $3" -c 'flush' "nbd+unix:///d?socket=$D/nbd.sock" >/dev/null
  qemu-io -f raw -c "read -P $2 0 $3" "nbd+unix:///d?socket=$D/nbd.sock" >/dev/null
  "$BIN" status --data-dir "$D" --json > "$D/status.json"
}

# 1. The daemon: an elastic export over the local cloud, I/O through NBD, status.
daemon_burst elastic:backing=reserved:256MiB,bw=33MB/s,cache=reserved,cache_bw=128MB/s,initial=64MiB,min=16MiB,granularity=16MiB,window=1s,id=2s,attach_delay=100ms 7 48M
python3 - "$D/status.json" <<'PY'
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
e = t["d/elastic"]
assert e["cache_sizes"], f"a 48 MiB burst at 33 MB/s must provision a cache: {e}"
assert e["decisions"] and all(d["reason"] for d in e["decisions"]), e["decisions"]
print("daemon elastic check ok: state", e["state"], "cache sizes", e["cache_sizes"], "cost", e["cost"])
PY
kill $SERVE; wait $SERVE || true
trap - EXIT

# 1b. cache=auto: the planner prices each cache volume (gp3 backing, a burst of
#     256 MiB at its 125 MiB/s baseline; time worth $20/h buys a gp3 boost).
daemon_burst elastic:backing=gp3:1GiB,cache=auto,value_per_hour=20,initial=256MiB,min=64MiB,granularity=64MiB,window=500ms,id=1s,attach_delay=100ms 9 256M
python3 - "$D/status.json" <<'PY'
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
b = t["d/elastic"]["boost"]
assert b and b["plans"], f"a 256 MiB burst on a 125 MiB/s gp3 must be planned: {t['d/elastic']}"
p = b["plans"][-1]
assert p["reason"] and p["plan"]["candidates"], p
assert (p["chosen"] or "").startswith("gp3:"), f"at $20/h a gp3 boost pays: {p['reason']}"
assert any("boost gp3:" in d["reason"] for d in t["d/elastic"]["decisions"]), t["d/elastic"]["decisions"]
print("daemon cache=auto check ok:", p["chosen"], "-", p["reason"][:160])
PY
kill $SERVE; wait $SERVE || true
trap - EXIT

# 2. SIGKILL torture of an elastic export (small window/ID so a cache full of
#    dirty blocks is attached at most kills): zero acknowledged-and-flushed loss.
"$BIN" --log warn torture --export elastic:backing=reserved:64MiB,bw=20MB/s,cache=reserved,cache_bw=128MB/s,initial=16MiB,min=4MiB,granularity=4MiB,window=100ms,id=300ms,attach_delay=10ms \
  --cycles 20 --seed 11 --time-limit 120

# 3. The quick experiment, checked against the thresholds in results.json.
check() {
python3 - "$1/results.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
a = r["approaches"]
slow, fast, ad = a["static-slow"], a["static-fast"], a["adaptive"]
bad = []
def check(name, ok, text):
    print(f"  {name}: {text} {'ok' if ok else 'FAIL'}")
    if not ok:
        bad.append(f"{name}: {text}")
oh = (ad["completion_s"] / fast["completion_s"] - 1) * 100
check("adaptive overhead", oh <= 3.3, f"{oh:.2f} % vs static-fast (need <= 3.3 %, aim <= 2 %)")
cr = ad["cost_agbs"] / fast["cost_agbs"] * 100
check("adaptive cost", cr <= 35, f"{cr:.1f} % of static-fast (need <= 35 %, aim <= 30 %)")
check("adaptive below static-slow", ad["cost_agbs"] < slow["cost_agbs"], f'{ad["cost_agbs"]:.1f} vs {slow["cost_agbs"]:.1f} AGBs')
check("static-slow slower", slow["completion_s"] > fast["completion_s"], f'{slow["completion_s"]:.2f} s vs {fast["completion_s"]:.2f} s')
for k, v in a.items():
    check(f"{k} verified", v["verified_bytes"] > 0, f'{v["verified_bytes"]} bytes')
check("cache sizes", len(r["cache_sizes_gib"]) >= 4, f'{r["cache_sizes_gib"]} (one per burst)')
for f in ("report.md", "io_activity.svg", "cost.svg", "priced_throughput.svg", "priced_iops.svg"):
    p = os.path.join(os.path.dirname(sys.argv[1]), f)
    check(f, os.path.exists(p) and os.path.getsize(p) > 0, "written")
# Issue 14: the priced scenarios; issue 40: they run with nothing installed.
check("priced scenarios ran", "priced" in r, "results.json has `priced` (run with PATH=/nonexistent: no fio)")
for sc in ("throughput", "iops"):
    p = r["priced"][sc]
    names = [n for n in ("static-slow", "static-fast", "modify-volume", "modify-volume-6h", "adaptive") if n in p]
    ad, fast = p["adaptive"], p["static-fast"]
    others = {n: p[n]["total_usd"] for n in names if n != "adaptive"}
    cheapest = min(names, key=lambda n: p[n]["total_usd"])
    print(f"  {sc}: cheapest with the instance billed until it could stop: {cheapest} (adaptive billed {ad['instance_s']:.0f} s for a {ad['completion_s']:.0f} s run)")
    # The instance runs through adaptive's last drain (issue 40): where that
    # drain costs more compute than the cache saves in storage (throughput:
    # 12 GiB at the backing's 125 MiB/s after the last burst, a cheap gp3
    # peak), keeping the peak (static-fast, or modify-volume under the 6 h
    # rule, which cannot lower it) may be cheaper; adaptive must still beat
    # static-slow and modify-volume under AWS's newer rule. In the iops
    # scenario it must beat all.
    beat = list(others) if sc == "iops" else ["static-slow", "modify-volume"]
    check(f"{sc}: adaptive total $ below " + ", ".join(beat), all(ad["total_usd"] < others[n] for n in beat),
          f'${ad["total_usd"]:.4f} vs ' + ", ".join(f"{n} ${v:.4f}" for n, v in others.items()))
    check(f"{sc}: instance billed through the drain", ad["instance_s"] > ad["completion_s"], f'{ad["instance_s"]:.1f} s > {ad["completion_s"]:.1f} s')
    oh = (ad["completion_s"] / fast["completion_s"] - 1) * 100
    check(f"{sc}: adaptive completion", oh <= 3.3, f"{oh:+.2f} % vs static-fast (need <= 3.3 %, aim <= 2 %)")
    for n in names:
        check(f"{sc}: {n} verified", all(x["verified_bytes"] > 0 for x in p[n]["runs"]), f'{len(p[n]["runs"])} run(s)')
    if sc == "iops":
        sr = ad["storage_usd"] / fast["storage_usd"] * 100
        check("iops: adaptive storage $", sr <= 35, f"{sr:.1f} % of static-fast (need <= 35 %)")
for k in ("application", "deviations"):
    check(f"setup.{k}", k in r.get("setup", {}), "in results.json")
if bad:
    print("ELASTIC THRESHOLDS NOT MET: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
print("elastic: all thresholds met")
PY
}
quick_run() {
  # As on a fresh machine: nothing on PATH (no fio, no qemu, no python); the
  # experiment starts only itself (`surge serve`, `surge load`).
  env PATH=/nonexistent "$BIN" --log warn experiment elastic --quick --out "$1" >/dev/null
  echo "elastic quick run took $(( $(date +%s) - start )) s; results in $1"
  check "$1"
}
# Real time on a shared 2-core machine (the models sleep; fio and the daemon
# need the CPU on time): one retry, and both attempts stay in the log.
if ! quick_run "$OUT"; then
  echo "elastic: thresholds not met on the first attempt (above); retrying once" >&2
  OUT="$OUT-retry"; mkdir -p "$OUT"
  quick_run "$OUT"
fi
