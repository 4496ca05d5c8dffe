#!/usr/bin/env python3
"""The client programs of `surge experiment burstbuffer`, run as their own
processes against a mounted file system (surge, s3fs or JuiceFS), as a user's
application would. Each mode prints one JSON object on stdout.

  seq-write FILE MIB BS_KIB          write MIB MiB sequentially, fsync, close
  seq-read FILE BS_KIB               read the whole file sequentially
  rand-write FILE COUNT BS_KIB SEED  COUNT writes at random aligned offsets, fsync, close
  rand-read FILE COUNT BS_KIB SEED   COUNT reads at random aligned offsets
  mdtest DIR FILES PROCS             mdtest-style: PROCS processes, each FILES
                                     files in its own directory; timed phases
                                     create (open O_CREAT|O_EXCL, close), stat, unlink
  raw DIR_A DIR_B ROUNDS             read-after-write across two mounts: a writer
                                     process writes round i through A and closes,
                                     then a reader process opens through B; a read
                                     not returning round i's bytes is stale
  fits DIR COUNT SIDE                synthetic FITS images (SIDE x SIDE float32,
                                     TAN WCS headers) tiling a patch of sky
  s3-verify REF_DIR PREFIX           every file under REF_DIR vs the S3 object
                                     PREFIX/relpath (endpoint, bucket from env)
"""

import json
import math
import multiprocessing
import os
import random
import struct
import sys
import time


def seq_write(path, mib, bs_kib):
    bs = bs_kib << 10
    buf = os.urandom(bs)
    total = mib << 20
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t1 = time.monotonic()
    done = 0
    while done < total:
        done += os.write(fd, buf[: min(bs, total - done)])
    t2 = time.monotonic()
    os.fsync(fd)
    t3 = time.monotonic()
    os.close(fd)
    dt = time.monotonic() - t0
    # Where the time went: open, the writes, fsync, close.
    phases = {"open": t1 - t0, "write": t2 - t1, "fsync": t3 - t2, "close": t0 + dt - t3}
    return {"bytes": total, "seconds": dt, "mbps": total / dt / 1e6, "phases_s": phases}


def seq_read(path, bs_kib):
    bs = bs_kib << 10
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    total = 0
    while True:
        b = os.read(fd, bs)
        if not b:
            break
        total += len(b)
    os.close(fd)
    dt = time.monotonic() - t0
    return {"bytes": total, "seconds": dt, "mbps": total / dt / 1e6}


def offsets(path, count, bs, seed):
    size = os.stat(path).st_size
    rng = random.Random(seed)
    return [rng.randrange(size // bs) * bs for _ in range(count)]


def rand_write(path, count, bs_kib, seed):
    bs = bs_kib << 10
    offs = offsets(path, count, bs, seed)
    buf = os.urandom(bs)
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY)
    for o in offs:
        os.pwrite(fd, buf, o)
    os.fsync(fd)
    os.close(fd)
    dt = time.monotonic() - t0
    return {"bytes": count * bs, "seconds": dt, "mbps": count * bs / dt / 1e6, "iops": count / dt}


def rand_read(path, count, bs_kib, seed):
    bs = bs_kib << 10
    offs = offsets(path, count, bs, seed)
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    n = 0
    for o in offs:
        n += len(os.pread(fd, bs, o))
    os.close(fd)
    dt = time.monotonic() - t0
    return {"bytes": n, "seconds": dt, "mbps": n / dt / 1e6, "iops": count / dt}


def md_worker(args):
    d, files, phase, start = args
    while time.time() < start:  # all processes start a phase together
        time.sleep(0.001)
    names = [os.path.join(d, f"f{i}") for i in range(files)]
    if phase == "create":
        for n in names:
            os.close(os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    elif phase == "stat":
        for n in names:
            os.stat(n)
    else:
        for n in names:
            os.unlink(n)
    return time.time()


def mdtest(root, files, procs):
    dirs = [os.path.join(root, f"md.{p}") for p in range(procs)]
    for d in dirs:
        os.mkdir(d)
    out = {"files": files * procs, "procs": procs}
    with multiprocessing.Pool(procs) as pool:
        for phase in ("create", "stat", "unlink"):
            start = time.time() + 0.2
            ends = pool.map(md_worker, [(d, files, phase, start) for d in dirs])
            dt = max(ends) - start
            out[f"{phase}_ops"] = files * procs / dt
            out[f"{phase}_seconds"] = dt
    for d in dirs:
        os.rmdir(d)
    return out


def raw_writer(path, rounds, go, done):
    for i in range(rounds):
        go.get()
        with open(path, "wb") as f:
            f.write(round_bytes(i))
        done.put(i)


def round_bytes(i):
    return (b"round %08d " % i) * 512


def raw(dir_a, dir_b, rounds):
    go, done = multiprocessing.Queue(), multiprocessing.Queue()
    name = "raw.dat"
    w = multiprocessing.Process(target=raw_writer, args=(os.path.join(dir_a, name), rounds, go, done))
    w.start()
    stale = 0
    first = None
    for i in range(rounds):
        go.put(i)
        done.get()  # the writer closed the file: round i is acknowledged
        r = multiprocessing.Process(target=raw_reader, args=(os.path.join(dir_b, name), i))
        r.start()
        r.join()
        if r.exitcode != 0:
            stale += 1
            first = first if first is not None else i
    w.join()
    return {"rounds": rounds, "stale_reads": stale, "first_stale_round": first}


def raw_reader(path, i):
    with open(path, "rb") as f:
        got = f.read()
    sys.exit(0 if got == round_bytes(i) else 1)


def fits_card(key, value=None, comment=""):
    if value is None:
        s = key.ljust(80)
    else:
        if isinstance(value, str):
            v = ("'" + value.ljust(8) + "'").ljust(20)
        elif isinstance(value, bool):
            v = ("T" if value else "F").rjust(20)
        elif isinstance(value, int):
            v = str(value).rjust(20)
        else:
            v = ("%.12G" % value).rjust(20)
        s = (key.ljust(8) + "= " + v + (" / " + comment if comment else "")).ljust(80)
    return s[:80].encode("ascii")


def write_fits(path, side, ra, dec, scale, seed):
    hdr = [
        fits_card("SIMPLE", True), fits_card("BITPIX", -32), fits_card("NAXIS", 2),
        fits_card("NAXIS1", side), fits_card("NAXIS2", side),
        fits_card("CTYPE1", "RA---TAN"), fits_card("CTYPE2", "DEC--TAN"),
        fits_card("CRVAL1", ra), fits_card("CRVAL2", dec),
        fits_card("CRPIX1", (side + 1) / 2.0), fits_card("CRPIX2", (side + 1) / 2.0),
        fits_card("CDELT1", -scale), fits_card("CDELT2", scale),
        fits_card("CROTA2", 0.0), fits_card("EQUINOX", 2000.0), fits_card("END"),
    ]
    h = b"".join(hdr)
    h += b" " * (-len(h) % 2880)
    rng = random.Random(seed)
    sky = 100.0 + 10.0 * rng.random()  # each image its own background: the mosaic evens them out
    stars = [(rng.randrange(side), rng.randrange(side), rng.uniform(50, 500)) for _ in range(side // 8)]
    row = [0.0] * side
    data = bytearray()
    for y in range(side):
        for x in range(side):
            row[x] = sky + rng.random()
        for sx, sy, amp in stars:
            if abs(sy - y) <= 2:
                for x in range(max(0, sx - 2), min(side, sx + 3)):
                    row[x] += amp * math.exp(-((x - sx) ** 2 + (y - sy) ** 2) / 2.0)
        data += struct.pack(">%df" % side, *row)
    data += b"\0" * (-len(data) % 2880)
    with open(path, "wb") as f:
        f.write(h + data)


def fits(d, count, side):
    """COUNT images on a grid, overlapping their neighbours by 10 %."""
    os.makedirs(d, exist_ok=True)
    scale = 1.0 / 3600  # 1 arcsec pixels
    step = side * scale * 0.9
    cols = int(math.ceil(math.sqrt(count)))
    total = 0
    for i in range(count):
        ra = 180.0 + (i % cols) * step
        dec = 30.0 + (i // cols) * step
        p = os.path.join(d, "img%04d.fits" % i)
        write_fits(p, side, ra, dec, scale, i)
        total += os.stat(p).st_size
    return {"images": count, "bytes": total, "side": side}


def s3_verify(ref, prefix):
    import boto3
    s3 = boto3.client("s3", endpoint_url=os.environ["SURGE_BB_S3_ENDPOINT"])
    bucket = os.environ["SURGE_BB_BUCKET"]
    files = nbytes = lost = 0
    bad = []
    for root, _, names in os.walk(ref):
        for name in names:
            path = os.path.join(root, name)
            key = os.path.join(prefix, os.path.relpath(path, ref)).lstrip("/")
            want = open(path, "rb").read()
            try:
                got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            except s3.exceptions.NoSuchKey:
                got = b""
            files += 1
            nbytes += len(want)
            if got != want:
                # Bytes lost: those of the acknowledged file not found as written.
                same = sum(1 for a, b in zip(got, want) if a == b)
                lost += len(want) - same
                bad.append(key)
    return {"files": files, "bytes": nbytes, "bytes_lost": lost, "bad": bad[:10]}


def main():
    mode, a = sys.argv[1], sys.argv[2:]
    if mode == "seq-write":
        r = seq_write(a[0], int(a[1]), int(a[2]))
    elif mode == "seq-read":
        r = seq_read(a[0], int(a[1]))
    elif mode == "rand-write":
        r = rand_write(a[0], int(a[1]), int(a[2]), int(a[3]))
    elif mode == "rand-read":
        r = rand_read(a[0], int(a[1]), int(a[2]), int(a[3]))
    elif mode == "mdtest":
        r = mdtest(a[0], int(a[1]), int(a[2]))
    elif mode == "raw":
        r = raw(a[0], a[1], int(a[2]))
    elif mode == "fits":
        r = fits(a[0], int(a[1]), int(a[2]))
    elif mode == "s3-verify":
        r = s3_verify(a[0], a[1])
    else:
        sys.exit(f"unknown mode {mode!r}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
