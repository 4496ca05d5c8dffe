#!/usr/bin/env python3
"""The pooled line of docs/results/streaming.md: the median 4 KiB random-write
IOPS of every sample of each configuration in three stored streaming runs,
and surge-cow's ratios. Writes docs/results/streaming/pooled-randwrite.txt."""
import json
import os
import statistics as st

results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "results")
runs = ["streaming/full", "streaming/subset-3r", "streaming/subset-2r"]
pool = {}
for r in runs:
    with open(os.path.join(results, r, "results.json")) as f:
        for c, v in json.load(f)["configs"].items():
            pool.setdefault(c, []).extend(s["randwrite_iops"] for s in v["samples"])
med = {c: st.median(v) for c, v in pool.items()}
lines = [f"pooled 4 KiB random-write IOPS from {', '.join(runs)}"]
lines += [f"{c}: {len(v)} samples, median {round(med[c])}" for c, v in sorted(pool.items())]
lines.append(f"surge-cow vs local-raw: {(med['surge-cow'] / med['local-raw'] - 1) * 100:+.1f} %")
lines.append(f"surge-cow vs qemu-qcow2: {med['surge-cow'] / med['qemu-qcow2']:.2f}x")
out = os.path.join(results, "streaming", "pooled-randwrite.txt")
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
