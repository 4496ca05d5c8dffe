"""The boot of burst-buffer node instances in moto (tests of `surge bb pool --nodes ec2`).

Usage: fake-bb-agent.py ENDPOINT OWNER POOL SURGE LOGDIR [NODE_ARG...]

What user-data does on a real instance, done here for each instance moto
reports running with the tags surge:owner=OWNER, surge:role=bb-node and
surge:pool=POOL: start `SURGE bb node --listen 127.0.0.1:0 NODE_ARG...` (its
log in LOGDIR/node-ID.log) and tag the instance surge:node-addr with the
address the node prints. When the instance is no longer running
(terminated), the node is killed; when the node exits by itself (drained),
the instance is terminated (the user-data's `poweroff` with shutdown
behaviour terminate). Instances tagged surge:fake-agent=ignore are left
alone (a launch that never serves). Events go to stdout, one a line.

Runs until its stdin closes (the test ended) or SIGTERM; then kills its nodes.
The nodes die with it (PR_SET_PDEATHSIG) if it is killed.
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import boto3

endpoint, owner, pool, surge, logdir = sys.argv[1:6]
node_args = sys.argv[6:]
ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def watch_stdin():
    sys.stdin.read()
    stop.set()


threading.Thread(target=watch_stdin, daemon=True).start()


def die_with_me():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def say(*words):
    print(*words, flush=True)


def instances():
    filters = [
        {"Name": "tag:surge:owner", "Values": [owner]},
        {"Name": "tag:surge:role", "Values": ["bb-node"]},
        {"Name": "tag:surge:pool", "Values": [pool]},
    ]
    out = {}
    for r in ec2.describe_instances(Filters=filters)["Reservations"]:
        for i in r["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            out[i["InstanceId"]] = (i["State"]["Name"], tags)
    return out


def start_node(iid):
    log = open(os.path.join(logdir, f"node-{iid}.log"), "wb")
    p = subprocess.Popen([surge, "bb", "node", "--listen", "127.0.0.1:0", *node_args],
                         stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=die_with_me)
    addr = p.stdout.readline().decode().strip()
    if not addr:
        say("failed", iid, p.wait())
        return None
    ec2.create_tags(Resources=[iid], Tags=[{"Key": "surge:node-addr", "Value": addr}])
    say("started", iid, addr, p.pid)
    return p


def end(p):
    p.terminate()
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


nodes = {}  # instance id -> Popen
done = set()  # instance ids handled for good
while not stop.is_set():
    try:
        seen = instances()
    except Exception as e:  # moto restarting, a test's fault proxy: try again
        say("describe failed", e)
        time.sleep(0.2)
        continue
    for iid, (state, tags) in seen.items():
        if state == "running" and iid not in nodes and iid not in done and tags.get("surge:fake-agent") != "ignore":
            p = start_node(iid)
            if p is None:
                done.add(iid)
            else:
                nodes[iid] = p
    for iid, p in list(nodes.items()):
        state = seen.get(iid, ("gone", {}))[0]
        if state not in ("pending", "running"):
            end(p)
            say("killed", iid, state)
        elif p.poll() is not None:
            ec2.terminate_instances(InstanceIds=[iid])
            say("exited", iid, p.returncode, "terminated its instance")
        else:
            continue
        del nodes[iid]
        done.add(iid)
    time.sleep(0.1)
for p in nodes.values():
    end(p)
