# Sourced by scripts that run a one-machine burst buffer (scripts/ci.d/80-burst-buffer.sh,
# scripts/bench/bb-meta.sh, scripts/bench/bb-seq.sh). The caller sets W (a work
# directory) and PIDS=(), or calls bb_bench_start.

# Unmounts $W/mnt and stops every process in PIDS (installed as the EXIT trap).
bb_cleanup() {
  fusermount3 -u "$W/mnt" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts the moto S3 server on a free port (log in $W/moto.log), waits for it,
# and exports the S3 settings `surge bb` reads.
bb_start_moto() {
  local p
  p=$(free_port)
  moto_server -H 127.0.0.1 -p "$p" >"$W/moto.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$p))" 2>/dev/null && break; sleep 0.2; done
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
  export SURGE_BB_S3_ENDPOINT="http://127.0.0.1:$p"
}

# Starts `surge bb redis` (binary $1, data in directory $2) on a free port,
# exports SURGE_BB_REDIS and the ACL login (user surge, the password file it
# makes), and waits until `surge bb status` reaches it.
bb_start_redis() {
  local p
  p=$(free_port)
  "$1" --log warn bb redis --dir "$2" --port "$p" >/dev/null &
  PIDS+=($!)
  export SURGE_BB_REDIS="redis://127.0.0.1:$p/"
  export SURGE_BB_REDIS_USER=surge SURGE_BB_REDIS_PASSWORD_FILE="$2/password"
  for _ in $(seq 100); do "$1" --log error bb status >/dev/null 2>&1 && break; sleep 0.1; done
}

# For the benchmarks: FSBENCH (the experiment's client program), a work
# directory W named after $1, PIDS, the cleanup trap, and the moto server.
bb_bench_start() {
  FSBENCH="$REPO/crates/surge/src/experiment/burstbuffer/fsbench.py"
  W=$(mktemp -d "/tmp/surge-bb-$1.XXXXXX")
  PIDS=()
  trap bb_cleanup EXIT
  bb_start_moto
}

# Creates bucket $1 on the moto server and points `surge bb` at it.
bb_bucket() {
  export SURGE_BB_BUCKET="$1"
  python3 -c "import boto3; boto3.client('s3', endpoint_url='$SURGE_BB_S3_ENDPOINT').create_bucket(Bucket='$SURGE_BB_BUCKET')"
}

# `surge bb mount` (binary $1) at $W/mnt, in the background (its pid in MOUNT);
# waits until it is mounted.
bb_mount() {
  mkdir -p "$W/mnt"
  # shellcheck disable=SC2086 # BB_MOUNT_ARGS: extra mount options, word-split
  "$1" --log warn bb mount "$W/mnt" ${BB_MOUNT_ARGS:-} 2>>"$W/mount.log" &
  MOUNT=$!
  for _ in $(seq 100); do mountpoint -q "$W/mnt" && break; sleep 0.1; done
  mountpoint -q "$W/mnt" || { cat "$W/mount.log"; exit 1; }
}

# CPU seconds (user + system) of the processes $@, summed.
cpu_s() { for p in "$@"; do awk '{print ($14 + $15) / 100}' "/proc/$p/stat" 2>/dev/null || echo 0; done | awk '{s += $1} END {print s + 0}'; }

# Stops the processes a run started: those in PIDS from index $1 on.
bb_stop_from() {
  local mine=("${PIDS[@]:$1}")
  kill "${mine[@]}" 2>/dev/null || true
  wait "${mine[@]}" 2>/dev/null || true
  PIDS=("${PIDS[@]:0:$1}")
}

# ROUNDS rounds of `run BINARY TAG`: A, then B when set, alternating.
bb_rounds() {
  local r
  for r in $(seq "$ROUNDS"); do
    run "$A" "a$r"
    [ -z "$B" ] || run "$B" "b$r"
  done
}
