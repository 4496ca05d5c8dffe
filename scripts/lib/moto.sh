# Sourced by the AWS CI steps (scripts/ci.d/9*-aws*.sh): moto in server mode
# on a free loopback port, and an EC2 instance in it with a fake udev.

# moto_start WORK: start moto (log in WORK/moto.log), wait until it answers
# (it imports slowly on a loaded machine: up to a minute); sets MOTO_PORT and
# MOTO_PID and exports moto's test credentials.
moto_start() {
  MOTO_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" >"$1/moto.log" 2>&1 &
  MOTO_PID=$!
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/"$MOTO_PORT") 2>/dev/null && break; sleep 0.1; done
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
}

# fake_instance WORK [TYPE]: an instance in moto and the fake udev linking its
# attached volumes under WORK/root/dev (scripts/lib/fake-udev.py); sets
# INSTANCE, ZONE and UDEV_PID. `touch WORK/root/stop` ends the udev.
fake_instance() {
  mkdir -p "$1/root/dev/disk/by-id"
  python3 "$(dirname "${BASH_SOURCE[0]}")/fake-udev.py" "$MOTO_PORT" "$1/root" ${2:+"$2"} >"$1/instance" &
  UDEV_PID=$!
  for _ in $(seq 600); do [ -s "$1/instance" ] && break; sleep 0.1; done
  read -r INSTANCE ZONE <"$1/instance"
}
