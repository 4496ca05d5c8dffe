#!/usr/bin/env bash
# Metadata rates of the burst-buffer mount: the experiment's mdtest-style
# phases (fsbench.py mdtest: create, stat, unlink; 2 processes x FILES files)
# and, with -m, its Montage workflow (16 images of 512x512, the full run's
# data set) on a fresh one-machine burst buffer (bb redis, moto S3, 3 I/O
# nodes, bb mount; no emulated link), for one or two surge binaries,
# alternating, ROUNDS times each.
#
#   scripts/bench/bb-meta.sh [-a SURGE_A] [-b SURGE_B] [-r ROUNDS] [-n FILES] [-m]
#
# Prints one line per run (ops/s of each phase, Montage seconds and the
# mount process's CPU seconds during it) and the medians per binary.
# Without -b, only SURGE_A (default: this checkout's release build) runs.
# BB_MOUNT_ARGS adds options to `surge bb mount`, e.g. BB_MOUNT_ARGS="--attr-ttl 0s".
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
A="$REPO/${CARGO_TARGET_DIR:-target}/release/surge"
B=""
ROUNDS=3
FILES=500
MONTAGE=""
while getopts "a:b:r:n:m" o; do
  case $o in
    a) A=$(realpath "$OPTARG") ;;
    b) B=$(realpath "$OPTARG") ;;
    r) ROUNDS=$OPTARG ;;
    n) FILES=$OPTARG ;;
    m) MONTAGE=1 ;;
    *) sed -n 2,10p "$0"; exit 2 ;;
  esac
done
. "$REPO/scripts/lib/bb-local.sh"
bb_bench_start meta
[ -z "$MONTAGE" ] || python3 "$FSBENCH" fits "$W/fits" 16 512 >/dev/null

# The experiment's Montage steps (crates/surge/src/experiment/burstbuffer/work.rs)
# in $1/montage; prints the seconds from stage-in to the mosaic.
montage() {
  local d=$1/montage t0
  t0=$(date +%s.%N)
  mkdir "$d" && cp -r "$W/fits" "$d/raw" && mkdir "$d/proj" "$d/diff" "$d/corr"
  (
    cd "$d"
    mImgtbl raw images.tbl && mMakeHdr images.tbl template.hdr
    mProjExec -p raw images.tbl template.hdr proj stats.tbl && mImgtbl proj pimages.tbl
    mOverlaps pimages.tbl diffs.tbl && mDiffExec -p proj diffs.tbl template.hdr diff
    mFitExec diffs.tbl fits.tbl diff && mBgModel pimages.tbl fits.tbl corr.tbl
    mBgExec -p proj pimages.tbl corr.tbl corr && mAdd -p corr pimages.tbl template.hdr mosaic.fits
  ) >"$W/montage.out"
  python3 -c "import time; print(f'{time.time() - $t0:.2f}')"
}

# One run: a fresh Redis, bucket, nodes and mount from binary $1; prints the JSON of mdtest.
run() {
  local bin=$1 tag=$2 first=${#PIDS[@]}
  bb_bucket "meta-$tag"
  bb_start_redis "$bin" "$W/redis-$tag"
  for i in 1 2 3; do
    "$bin" --log warn bb node --listen 127.0.0.1:0 --memory 256MiB >/dev/null 2>>"$W/nodes.log" &
    PIDS+=($!)
  done
  bb_mount "$bin"
  local mount=$MOUNT
  python3 "$FSBENCH" mdtest "$W/mnt" "$FILES" 2 >"$W/$tag.json"
  if [ -n "$MONTAGE" ]; then
    local c0 secs
    c0=$(cpu_s "$mount")
    secs=$(montage "$W/mnt")
    python3 - "$W/$tag.json" "$secs" "$(python3 -c "print($(cpu_s "$mount") - $c0)")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r.update(montage_seconds=float(sys.argv[2]), montage_mount_cpu_seconds=float(sys.argv[3]))
json.dump(r, open(sys.argv[1], "w"))
PY
  fi
  fusermount3 -u "$W/mnt"
  wait "$mount" || true
  bb_stop_from "$first"
  python3 - "$W/$tag.json" "$tag" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = f", Montage {r['montage_seconds']:.2f} s (mount CPU {r['montage_mount_cpu_seconds']:.2f} s)" if "montage_seconds" in r else ""
print(f"{sys.argv[2]}: create {r['create_ops']:.0f}/s, stat {r['stat_ops']:.0f}/s, unlink {r['unlink_ops']:.0f}/s{m}")
PY
}

bb_rounds
python3 - "$W" <<'PY'
import glob, json, os, statistics, sys
for who in "ab":
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], f"{who}[0-9]*.json")))]
    if runs:
        med = {k: statistics.median(r[f"{k}_ops"] for r in runs) for k in ("create", "stat", "unlink")}
        line = ", ".join(f"{k} {v:.0f}/s" for k, v in med.items())
        if "montage_seconds" in runs[0]:
            line += f", Montage {statistics.median(r['montage_seconds'] for r in runs):.2f} s"
            line += f" (mount CPU {statistics.median(r['montage_mount_cpu_seconds'] for r in runs):.2f} s)"
        print(f"{who.upper()} median of {len(runs)}: {line}")
PY
