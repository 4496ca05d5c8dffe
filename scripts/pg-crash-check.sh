#!/usr/bin/env bash
# PostgreSQL crash check of a surge export (issue 37): PostgreSQL + pgbench on
# ext4 on the export (through nbdfuse + loop, as a guest reaches it), SIGKILL
# of `surge serve` mid-run while the export's own machinery runs underneath
# (cow: the stream job copying the base; burstable: a member swap rebuilding),
# then what a machine that lost power does on the way back: surge restarts on
# the same data directory, the file system's journal is replayed and e2fsck
# must find nothing, PostgreSQL recovers, pg_amcheck checks every table and
# index, and pgbench's invariant holds (the balances of accounts, tellers and
# branches each sum to the history's deltas), with at least every transaction
# pgbench logged as committed in the history.
#
#   scripts/pg-crash-check.sh cow        the base image (ext4 with a pgbench
#                                        database) served over NBD by qemu-nbd,
#                                        a cow: export over it, stream job on
#   scripts/pg-crash-check.sh burstable  burstable:persistent over 4 local-cloud
#                                        members, a swap of member 0 under way
#   scripts/pg-crash-check.sh dropped-flushes
#                                        the negative control: an export whose
#                                        flushes are acknowledged and dropped
#                                        (fault:...,volatile,flush.drop); the
#                                        check must FAIL on it
#
# Needs root (loop devices, mount), nbdfuse, qemu-nbd, PostgreSQL. Settings:
# PG_SCALE (pgbench scale, 5), PG_CLIENTS (4), KILL_AFTER (seconds of pgbench
# before the kill, 8), SURGE_BIN, KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND="${1:?usage: pg-crash-check.sh cow|burstable}"
BIN="$(realpath "${SURGE_BIN:-${CARGO_TARGET_DIR:-target}/release/surge}")"
SCALE="${PG_SCALE:-5}" CLIENTS="${PG_CLIENTS:-4}" KILL_AFTER="${KILL_AFTER:-8}"
PGBIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
W="$(mktemp -d /tmp/surge-pgcrash.XXXXXX)"
chmod 755 "$W"
S="$W/surge" MNT="$W/mnt" LOGS="$W/pgbench-logs"
mkdir -p "$S" "$MNT" "$LOGS"
chmod 777 "$LOGS"
LOOP="" NBDFUSE="" SERVE="" QEMU_NBD="" FUSE=""
start=$(date +%s)
say() { echo "[$KIND $(( $(date +%s) - start ))s] $*"; }
as_pg() { runuser -u postgres -- "$@"; }
# The socket directory is off the volume and new per start: a killed
# postmaster's socket lock would stop the next one.
pg_start() { SOCK=$(mktemp -d "$W/sock.XXXX"); chmod 777 "$SOCK"; as_pg "$PGBIN/pg_ctl" -w -t 120 -l "$LOGS/pg.log" -D "$MNT/pg/data" -o "-c listen_addresses='' -k $SOCK" start >/dev/null; }
pg_stop() { as_pg "$PGBIN/pg_ctl" -w -m fast -D "$MNT/pg/data" stop >/dev/null 2>&1 || true; }
sql() { as_pg "$PGBIN/psql" -h "$SOCK" -U postgres -d postgres -XAtqc "$1"; }

detach() {
  [ -d "$MNT/pg/data" ] && pg_stop
  if mountpoint -q "$MNT"; then umount "$MNT" 2>/dev/null || umount -l "$MNT"; fi
  [ -n "$LOOP" ] && { losetup -d "$LOOP" 2>/dev/null || true; }
  [ -n "$FUSE" ] && { fusermount3 -u "$FUSE" 2>/dev/null || fusermount3 -uz "$FUSE" 2>/dev/null || true; }
  [ -n "$NBDFUSE" ] && { kill "$NBDFUSE" 2>/dev/null || true; wait "$NBDFUSE" 2>/dev/null || true; }
  LOOP="" NBDFUSE="" FUSE=""
}

cleanup() {
  pkill -9 -f "postgres -D $MNT/pg/data" 2>/dev/null || true
  detach || true
  [ -n "$SERVE" ] && kill -9 "$SERVE" 2>/dev/null || true
  [ -n "$QEMU_NBD" ] && kill "$QEMU_NBD" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ] || [ "${FAILED:-0}" = 1 ]; then echo "work directory kept: $W"; else rm -rf "$W"; fi
}
trap 'FAILED=1' ERR
trap cleanup EXIT
fail() { FAILED=1; echo "FAIL ($KIND): $*" >&2; for f in "$LOGS/pg.log" "$S"/serve*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done; exit 1; }

wait_for() { for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done; fail "$1 did not appear"; }

serve() {
  rm -f "$W/nbd.sock" "$S/control.sock" # a killed server leaves them behind
  "$BIN" --log info serve --data-dir "$S" --listen "unix:$W/nbd.sock" ${POOL:+--pool "$POOL"} --export "v=$SPEC" >>"$S/serve.$1.log" 2>&1 &
  SERVE=$!
  wait_for "$W/nbd.sock"
  wait_for "$S/control.sock"
}

# The export as a guest sees it: nbdfuse's file, a loop device over it.
attach() {
  FUSE="$W/fuse.$1"
  mkdir -p "$FUSE"
  nbdfuse "$FUSE" "nbd+unix:///v?socket=$W/nbd.sock" >"$W/nbdfuse.$1.log" 2>&1 &
  NBDFUSE=$!
  wait_for "$FUSE/nbd"
  LOOP=$(losetup --find --show --direct-io=on "$FUSE/nbd")
}

# A pgbench database on the mounted file system, PostgreSQL stopped cleanly.
make_database() {
  mkdir -p "$MNT/pg"
  chown postgres:postgres "$MNT/pg"
  as_pg "$PGBIN/initdb" -N -A trust -U postgres -D "$MNT/pg/data" >/dev/null
  pg_start
  as_pg "$PGBIN/pgbench" -h "$SOCK" -U postgres -i -q -s "$SCALE" postgres >/dev/null 2>&1
  pg_stop
  sync -f "$MNT"
}

case "$KIND" in
  cow)
    # The base: an ext4 image holding the database, served read-only over NBD.
    truncate -s 1G "$W/base.img"
    mkfs.ext4 -q -F "$W/base.img"
    mount -o loop "$W/base.img" "$MNT"
    make_database
    umount "$MNT"
    qemu-nbd -r -t -f raw -x base -k "$W/base.sock" "$W/base.img" >"$W/qemu-nbd.log" 2>&1 &
    QEMU_NBD=$!
    wait_for "$W/base.sock"
    # A slow stream job, so that it is still copying at the kill.
    SPEC="cow:base=nbd+unix:///base?socket=$W/base.sock,overlay=file:v.ovl,stream,rate=4MB/s"
    serve 1
    attach 1
    mount -t ext4 "$LOOP" "$MNT"
    ;;
  burstable)
    SPEC="burstable:persistent,size=2GiB,members=4,attach_delay=0s,tick=500ms,rebuild_rate=4MiB/s"
    serve 1
    attach 1
    mkfs.ext4 -q -F "$LOOP"
    mount -t ext4 "$LOOP" "$MNT"
    make_database
    ;;
  dropped-flushes)
    POOL="disk=file:disk.img,create=2GiB"
    SPEC="fault:disk,volatile,flush.drop"
    serve 1
    attach 1
    mkfs.ext4 -q -F "$LOOP"
    mount -t ext4 "$LOOP" "$MNT"
    make_database
    ;;
  *) fail "unknown kind $KIND (cow, burstable or dropped-flushes)" ;;
esac

# The run: pgbench against PostgreSQL on the export; each transaction it
# completes is logged (the log is on local disk, not on the export).
pg_start
say "pgbench ($CLIENTS clients, scale $SCALE) for ${KILL_AFTER}s, then SIGKILL of surge serve"
as_pg "$PGBIN/pgbench" -h "$SOCK" -U postgres -c "$CLIENTS" -j 2 -T 600 -l --log-prefix="$LOGS/tx" postgres >"$W/pgbench.out" 2>&1 &
PGBENCH=$!
if [ "$KIND" = burstable ]; then
  # The swap starts 3 s before the kill; at rebuild_rate=4MiB/s the member's
  # data (about 60 MB) is still being copied then. On a loaded machine the
  # controller may take a while to attach the new member: wait for its
  # rebuild (up to 30 s) before the last 2 s.
  sleep $(( KILL_AFTER > 3 ? KILL_AFTER - 3 : 0 ))
  "$BIN" set --data-dir "$S" v/burstable swap=0 >/dev/null
  for _ in $(seq 300); do
    "$BIN" status --data-dir "$S" --json 2>/dev/null | python3 -c 'import json,sys; t={x["name"]:x["status"] for x in json.load(sys.stdin)}; sys.exit(0 if any(m["rebuild"] for m in t["v/burstable"]["members"]) else 1)' && break
    sleep 0.1
  done
  sleep 2
else
  sleep "$KILL_AFTER"
fi
"$BIN" status --data-dir "$S" --json >"$W/status.before.json"
python3 - "$W/status.before.json" "$KIND" <<'PY' || fail "the export's machinery was not running at the kill"
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
if sys.argv[2] == "dropped-flushes":
    sys.exit(0)
if sys.argv[2] == "cow":
    job = t["v/cow"]["stream"]
    print(f"  at the kill: stream job {job['state']}, {job['percent']:.1f} % copied")
    sys.exit(0 if job["state"] == "running" else 1)
b = t["v/burstable"]
rebuilding = [m for m in b["members"] if m["rebuild"]]
for m in rebuilding:
    print(f"  at the kill: slot {m['slot']} rebuilding onto {m['swap_to']}, {m['rebuild']['percent']:.1f} % copied")
sys.exit(0 if rebuilding else 1)
PY

# The crash: surge dies, and with it the guest (nbdfuse, PostgreSQL, the page
# cache of the file system: nothing it held reaches the export any more).
kill -9 "$SERVE"; wait "$SERVE" 2>/dev/null || true; SERVE=""
kill -9 "$NBDFUSE" 2>/dev/null || true; wait "$NBDFUSE" 2>/dev/null || true; NBDFUSE=""
# The postmaster and its backends together, as a power cut would: a backend
# left alone can wait forever on a lock its dead peers held (seen once: a
# COMMIT in a futex wait, and pgbench waiting on it).
pm=$(pgrep -f "postgres -D $MNT/pg/data" | head -1 || true)
[ -n "$pm" ] && kill -9 "$pm" $(pgrep -P "$pm") 2>/dev/null || true
pkill -9 -f "postgres -D $MNT/pg/data" || true
for _ in $(seq 300); do pgrep -f "postgres -D $MNT/pg/data" >/dev/null || break; sleep 0.1; done
pgrep -f "postgres -D $MNT/pg/data" >/dev/null && fail "PostgreSQL does not die"
# pgbench ends by itself once its connections are gone (and writes out its
# log); bounded, in case a connection never says so.
for _ in $(seq 300); do kill -0 "$PGBENCH" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PGBENCH" 2>/dev/null; then
  echo "pgbench did not end within 30 s of the kill: killing it (its last log lines may be lost)" >&2
  pkill -9 -P "$PGBENCH" 2>/dev/null || true
  kill -9 "$PGBENCH" 2>/dev/null || true
fi
wait "$PGBENCH" 2>/dev/null || true
umount -l "$MNT"
losetup -d "$LOOP" 2>/dev/null || true
fusermount3 -uz "$FUSE" 2>/dev/null || true
LOOP="" FUSE=""
logged=$(cat "$LOGS"/tx* 2>/dev/null | wc -l)
say "killed; pgbench logged $logged committed transactions"
[ "$logged" -gt 0 ] || fail "pgbench committed nothing before the kill (see $W/pgbench.out)"

# The way back.
serve 2
attach 2
mount -t ext4 "$LOOP" "$MNT" || fail "the file system does not mount after the restart"
umount "$MNT"
e2fsck -fn "$LOOP" >"$W/e2fsck.log" 2>&1 || { cat "$W/e2fsck.log"; fail "e2fsck found errors after the journal replay"; }
say "e2fsck clean after the journal replay"
mount -t ext4 "$LOOP" "$MNT"
# The killed postmaster may linger here as a zombie nobody reaps, and its PID
# in the lock file then looks alive; after a real power cut it is gone.
pid=$(head -1 "$MNT/pg/data/postmaster.pid" 2>/dev/null || true)
if [ -n "$pid" ] && { [ ! -e "/proc/$pid" ] || grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; }; then
  rm -f "$MNT/pg/data/postmaster.pid"
fi
pg_start || fail "PostgreSQL does not start (recover) after the crash"
grep -q "redo done\|database system was not properly shut down" "$LOGS/pg.log" && say "PostgreSQL recovered: $(grep -o 'redo done at [^ ]*' "$LOGS/pg.log" | tail -1)"
as_pg "$PGBIN/pg_amcheck" -h "$SOCK" -U postgres --all --install-missing --heapallindexed >"$W/amcheck.log" 2>&1 \
  || { cat "$W/amcheck.log"; fail "pg_amcheck found corruption"; }
say "pg_amcheck: every table and index checks"
read -r acc tel bra hist n <<<"$(sql "select (select sum(abalance) from pgbench_accounts), (select sum(tbalance) from pgbench_tellers), (select sum(bbalance) from pgbench_branches), (select coalesce(sum(delta), 0) from pgbench_history), (select count(*) from pgbench_history)" | tr '|' ' ')"
[ "$acc" = "$hist" ] && [ "$tel" = "$hist" ] && [ "$bra" = "$hist" ] \
  || fail "pgbench invariant broken: accounts $acc, tellers $tel, branches $bra, history $hist"
[ "$n" -ge "$logged" ] || fail "the history holds $n transactions, pgbench saw $logged commit"
say "invariant holds (balances = history = $hist); history $n >= $logged committed"
pg_stop
"$BIN" status --data-dir "$S" --json >"$W/status.after.json"
python3 - "$W/status.after.json" "$KIND" <<'PY'
import json, sys
t = {x["name"]: x["status"] for x in json.load(open(sys.argv[1]))}
if sys.argv[2] == "dropped-flushes":
    pass
elif sys.argv[2] == "cow":
    job = t["v/cow"].get("stream")
    print("  after the restart: stream job", job and job["state"])
else:
    b = t["v/burstable"]
    left = [f"slot {m['slot']} {m['rebuild']['percent']:.1f} %" for m in b["members"] if m["rebuild"]]
    print(f"  after the restart: swaps done {b['swaps_done']}, rebuilding: {', '.join(left) or 'none'}")
PY
say "PostgreSQL crash check passed"
