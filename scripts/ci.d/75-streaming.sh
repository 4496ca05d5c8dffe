#!/usr/bin/env bash
# Issue 16 (streaming volumes): the quick streaming experiment. A storage node
# (surge serve in a network namespace behind a tbf-shaped Gigabit veth link)
# serves a real ext4 base image; six volume configurations are provisioned and
# run fio, pgbench and an external sort through nbdfuse + loop + ext4.
# The cow read-ahead default is also run beside no read-ahead and 4 MiB
# windows on the boot set and two workloads it was not tuned on (measured,
# reported; issue 40 item 13).
# Thresholds from results.json (the issue's targets):
#   surge-cow provisions >= 10x faster than local-raw with its copy;
#   surge-cow within 10 % of local-raw on every fio pattern, pgbench and sort;
#   surge-cow >= 2x qemu-qcow2 on 4 KiB random writes.
# The step fails when a configuration was not measured or an output is
# missing. The performance targets are checked and every miss is printed
# ("TARGETS NOT MET"), but they fail the step only with STREAMING_STRICT=1:
# one --quick run of 1-2 s per pattern on a shared 2-core machine swings by
# +-50 % between runs (see docs/results/streaming.md), so as a gate they would
# fail at random. What is gated is the paired rounds' figure (issue 40 item
# 10): surge-cow against local-raw run back to back, round by round, its
# median ratio per pattern at or above STREAMING_PAIRED_FLOOR.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${STREAMING_OUT:-$(mktemp -d /tmp/surge-streaming.XXXXXX)}"
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2
start=$(date +%s)
"$BIN" --log warn experiment streaming --quick --out "$OUT" > "$OUT/stdout.txt"
echo "streaming quick run took $(( $(date +%s) - start )) s; results in $OUT"
python3 - "$OUT/results.json" "${STREAMING_STRICT:-0}" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
strict = sys.argv[2] == "1"
c = r["configs"]
names = ["local-raw", "surge-cow", "surge-cow-cor", "surge-persistent", "qemu-qcow2", "nbdkit-cow"]
keys = ["provision_s", "randread_iops", "randwrite_iops", "seqread_mbps", "seqwrite_mbps", "oltp_tps", "sort_s"]
bad, missed = [], []
for k in ("application", "deviations"):
    if k not in r.get("setup", {}):
        bad.append(f"results.json has no setup.{k}")
def check(name, ok, text, target=True):
    print(f"  {name}: {text} {'ok' if ok else ('NOT MET' if target else 'FAIL')}")
    if not ok:
        (missed if target else bad).append(f"{name}: {text}")
for n in names:
    check(f"{n} measured", all(isinstance(c[n][k], (int, float)) and c[n][k] > 0 for k in keys), ", ".join(f"{k}={c[n][k]:.4g}" for k in keys), target=False)
raw, cow, qcow = c["local-raw"], c["surge-cow"], c["qemu-qcow2"]
sp = raw["provision_s"] / cow["provision_s"]
check("provisioning", sp >= 10, f"surge-cow {cow['provision_s']:.2f} s vs local-raw {raw['provision_s']:.2f} s with its copy: {sp:.1f}x (need >= 10x)")
for k in keys[1:]:
    rel = raw[k] / cow[k] if k == "sort_s" else cow[k] / raw[k]
    check(f"surge-cow {k}", rel >= 0.9, f"{(rel - 1) * 100:+.1f} % vs local-raw (need >= -10 %, aim -5 %)")
for n in names:
    k = c[n]["cost"]
    check(f"{n} priced", k["job_usd"] > 0 and k["usd_per_million_tx"] > 0, f"job ${k['job_usd']:.5f}, ${k['usd_per_million_tx']:.4f} per million transactions (computed, list prices)", target=False)
print(f"  job cost (provision + boot + sort on an {r['prices']['instance']}): surge-cow {cow['cost']['job_usd'] / raw['cost']['job_usd']:.2f}x local-raw's")
q = cow["randwrite_iops"] / qcow["randwrite_iops"]
check("vs qemu-qcow2", q >= 2, f"4 KiB random writes {cow['randwrite_iops']:.0f} vs {qcow['randwrite_iops']:.0f} IOPS: {q:.2f}x (need >= 2x)")
# Issue 40 item 13: the read-ahead default on workloads it was not tuned on
# (reported: one quick run per setting is noise-bound, the full run has 3).
ra = r.get("readahead_check", {}).get("workloads", {})
for w in ("boot", "scan", "large"):
    runs = ra.get(w, {})
    measured = all(runs.get(s, {}).get("seconds", 0) > 0 and runs.get(s, {}).get("link_bytes", 0) > 0 for s in ("off", "default", "4MiB"))
    verdict = "the fastest" if runs.get("best") == "default" else f"{runs.get('default_behind_best', float('nan')) * 100:.1f} % behind {runs.get('best')}"
    check(f"read-ahead check {w}", measured, ", ".join(f"{s} {runs.get(s, {}).get('seconds', 0):.2f} s" for s in ("off", "default", "4MiB")) + f"; default {verdict}", target=False)
# Issue 40 item 10: the serving process's CPU per I/O hardly moves with the
# machine's load, unlike the rates above (reported).
pats = ["4K randread", "4K randwrite", "1M seqread", "1M seqwrite"]
cpu = {n: [s["server_cpu_us"] for s in c[n]["samples"]] for n in ("local-raw", "surge-cow")}
if all(cpu[n] and any(v > 0 for v in cpu[n][0]) for n in cpu):
    ratios = ", ".join(f"{p} {cpu['surge-cow'][0][i] / cpu['local-raw'][0][i]:.2f}x" for i, p in enumerate(pats) if cpu['local-raw'][0][i] > 0)
    print(f"  server CPU per I/O, surge-cow against local-raw (both surge serve): {ratios}")
else:
    bad.append("server CPU per I/O not measured")
# Issue 40 item 10: paired rounds. local-raw and surge-cow run each pattern
# back to back in short rounds (order rotated every round); a round's ratio
# compares runs seconds apart, so the machine's load mostly cancels. The
# median ratio per pattern is gated (PAIRED_FLOOR, below the issue's -10 %
# target, which is printed above and gates only with STREAMING_STRICT=1).
PAIRED_FLOOR = float(os.environ.get("STREAMING_PAIRED_FLOOR", "0.6"))
paired = r.get("paired", {})
for p in ("randread", "randwrite", "rewrite", "seqread", "seqwrite", "pgbench"):
    e = paired.get(p, {}).get("surge-cow")
    if not e:
        bad.append(f"paired {p}: not measured")
        continue
    raw = paired[p]["local-raw"]
    rs = " ".join(f"{x:.2f}" for x in e["ratios"])
    cpu = f"; CPU per op {e['cpu_us_per_op']:.1f} vs {raw['cpu_us_per_op']:.1f} us: {e['cpu_ratio']:.2f}x" if e.get("cpu_ratio") else ""
    check(f"paired {p}", e["median_ratio"] >= PAIRED_FLOOR, f"surge-cow/local-raw median {e['median_ratio']:.3f} [{e['min_ratio']:.3f}, {e['max_ratio']:.3f}] over rounds ({rs}){cpu} (gate >= {PAIRED_FLOOR})", target=False)
for f in ("report.md", "provision.svg", "runtime.svg"):
    p = os.path.join(os.path.dirname(sys.argv[1]), f)
    check(f, os.path.exists(p) and os.path.getsize(p) > 0, "written", target=False)
if missed:
    print("STREAMING TARGETS NOT MET: " + "; ".join(missed), file=sys.stderr)
if bad:
    print("STREAMING RUN INCOMPLETE: " + "; ".join(bad), file=sys.stderr)
if bad or (missed and strict):
    sys.exit(1)
print("streaming: every configuration measured" + ("" if missed else "; all targets met"))
PY
# The report is rewritten from results.json alone (how a report change reaches a recorded run).
mv "$OUT/report.md" "$OUT/report.first.md"
"$BIN" --log warn experiment streaming --report-only --out "$OUT" > /dev/null
cmp "$OUT/report.md" "$OUT/report.first.md" || { echo "streaming: report.md rewritten from results.json differs from the run's" >&2; exit 1; }
