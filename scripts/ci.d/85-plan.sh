#!/usr/bin/env bash
# Issue 42 item 3 (`surge plan workload` validated against real runs): the
# quick experiment records two applications (surge load over NBD through
# `surge serve --record`), plans each with `surge plan workload --json`, and
# runs the recommended candidate and the next two cheapest for real (`surge
# serve` at full scale, the trace replayed over NBD by `surge trace replay`).
# Gated from results.json: every planned candidate ran, the keys issue 42
# names are there (candidates.NAME.{predicted,measured}.{completion_s,
# total_usd}, recommended, measured_cheapest, setup.application,
# setup.deviations), the recommended candidate's completion-time error within
# 10 % (measured 0.0 to -1.9 % over three quick runs on this machine, the
# others to -2.8 %), the recommendation the
# measured cheapest or within 2 %; the other candidates' errors are printed,
# and a miss is reported as NOT MET with the control replay's time (the
# machine's own share), failing only with PLAN_STRICT=1. Real-time figures on a shared 2-core machine: one
# retry on a miss, as other steps do. Fails loudly otherwise. The step took
# 111 s alone (/usr/bin/time: 11.6 s user + 30.0 s system CPU: it mostly waits
# on the models' timed throttling), the machine shared with other agents.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${CARGO_TARGET_DIR:-target}/release/surge"
[ -x "$BIN" ] || cargo build --release -p surge --locked 2>&1 | tail -2

attempt() {
  local out start
  out="${PLAN_OUT:-$(mktemp -d /tmp/surge-plan.XXXXXX)}"
  start=$(date +%s)
  "$BIN" --log warn experiment plan --quick --out "$out" >/dev/null
  echo "plan quick run took $(( $(date +%s) - start )) s; results in $out"
  python3 - "$out/results.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
bad, missed = [], []
strict = os.environ.get("PLAN_STRICT") == "1"
def check(name, ok, text):
    print(f"  {name}: {text} {'ok' if ok else 'FAIL'}")
    if not ok:
        bad.append(f"{name}: {text}")
for k in ("application", "deviations"):
    check(f"setup.{k}", bool(r.get("setup", {}).get(k)), "in results.json")
for k in ("candidates", "recommended", "measured_cheapest"):
    check(k, bool(r.get(k)), "in results.json")
apps = r["applications"]
check("applications", set(apps) == {"bursty", "random4k"}, ", ".join(sorted(apps)))
for a, x in apps.items():
    c = x["candidates"]
    check(f"{a}: candidates run", len(c) == 3 and x["recommended"] in c, f'{len(c)} run: {", ".join(c)}; recommended {x["recommended"]}')
    for n, v in c.items():
        for side in ("predicted", "measured"):
            for f in ("completion_s", "total_usd"):
                check(f"{a}/{n} {side}.{f}", isinstance(v[side].get(f), (int, float)) and v[side][f] > 0, f"{v[side].get(f)}")
        e = v["error_pct"]["completion_s"]
        text = f'{e:+.1f} % (predicted {v["predicted"]["completion_s"]:.2f} s, measured {v["measured"]["completion_s"]:.2f} s; need within 10 %)'
        if n == x["recommended"] or strict or abs(e) <= 10:
            check(f"{a}/{n} completion error", abs(e) <= 10, text)
        else:
            ctl = x["control"]
            print(f'  {a}/{n} completion error: {text} NOT MET (reported; PLAN_STRICT=1 fails on it); the control took {ctl["completion_s"]:.2f} s for the trace\'s {ctl["trace_span_s"]:.2f} s')
            missed.append(f"{a}/{n}")
        print(f'  {a}/{n} dollars error: {v["error_pct"]["total_usd"]:+.2f} % (quick: every bill is the 60 s minimum)')
    check(f"{a}: recommendation", x["recommended_within_2pct"], f'recommended {x["recommended"]}, measured cheapest {x["measured_cheapest"]} ({x["recommended_over_cheapest_pct"]:+.2f} %; need within 2 %)')
path = os.path.join(os.path.dirname(sys.argv[1]), "report.md")
check("report.md", os.path.exists(path) and os.path.getsize(path) > 0, "written")
if bad:
    print("PLAN THRESHOLDS NOT MET: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
print("plan: all thresholds met" + (f"; targets not met (reported): {', '.join(missed)}" if missed else ""))
PY
}

attempt || { echo "plan: a threshold missed (above); retrying once" >&2; attempt; }
