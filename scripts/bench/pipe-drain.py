#!/usr/bin/env python3
"""CPU per MiB of the ways a write payload can reach a file, as surge's NBD
server moves it: a sender process streams 1 MiB messages over a unix socket;
the receiver splices each into a pipe (as the server does) and then moves it
into a file

  splice  pipe -> file with splice (the page-cache write path),
  mapped  read(2) from the pipe into a shared mapping of the file whose
          pages are all in it already (data written again and again),
  cold    the same into a fresh mapping, each MiB once (one pass: every
          page is faulted in by the copy),

or, for reference, without a pipe (each applies a payload as it arrives,
which surge does not do: a client leaving halfway would leave half a write)

  recv         receives into one reused buffer and keeps nothing (what
               nbdkit's null plugin costs),
  recvmap      receives straight into the warm mapping (the least a server
               that stores the payload can do),
  recv+pwrite  receives into a buffer, then pwrite (the copying path),
  recv+pvm     receives into a buffer, then copies it into the mapping with
               process_vm_readv (the kernel copies, so no SIGBUS).

Prints the CPU time (user + system) per MiB of the receiver and of the
sender, per round and the median.

  scripts/bench/pipe-drain.py [DIR] [ROUNDS] [SYNC_EVERY_MIB]

DIR holds the 1 GiB test file (default /dev/shm, tmpfs). On a file system that
writes pages back (ext4), SYNC_EVERY_MIB > 0 calls fdatasync every so many MiB,
as a guest's FLUSHes would, so pages are written back and written again.
"""
import ctypes
import fcntl
import mmap
import os
import socket
import statistics
import sys

MIB = 1 << 20
MESSAGES = 3000
FILE_BYTES = 1 << 30
F_SETPIPE_SZ = 1031


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


LIBC = ctypes.CDLL(None, use_errno=True)


def copy_in(view, off, buf):
    """Copies buf into the mapping at off by process_vm_readv on this very
    process: the kernel does the copy, so a page it cannot have is EFAULT."""
    dst = (ctypes.c_char * len(buf)).from_buffer(view.obj, off)
    src = (ctypes.c_char * len(buf)).from_buffer(buf.obj)
    local, remote = IoVec(ctypes.addressof(dst), len(buf)), IoVec(ctypes.addressof(src), len(buf))
    n = LIBC.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    assert n == len(buf), ctypes.get_errno()
    del dst, src


def run(mode, path, sync_every):
    messages = FILE_BYTES // MIB if mode == "cold" else MESSAGES
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        b.close()
        payload = os.urandom(MIB)
        for _ in range(messages):
            a.sendall(payload)
        os._exit(0)
    a.close()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.ftruncate(fd, FILE_BYTES)
    fill = b"\1" * MIB
    for i in range(FILE_BYTES // MIB):
        os.pwrite(fd, fill, i * MIB)
    os.fdatasync(fd)
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, MIB)
    view = None
    if mode in ("mapped", "cold", "recvmap", "recv+pvm"):
        m = mmap.mmap(fd, FILE_BYTES)
        view = memoryview(m)
    if mode in ("mapped", "recvmap", "recv+pvm"):
        for i in range(0, FILE_BYTES, 4096):  # map every page first, as a long-lived mapping would be
            m[i] = 2
    buf = memoryview(bytearray(MIB))
    t0 = os.times()
    for i in range(messages):
        off = (i * MIB) % FILE_BYTES
        if mode == "recv":
            got = 0
            while got < MIB:
                got += b.recv_into(buf[got:], MIB - got)
            continue
        if mode in ("recv+pwrite", "recv+pvm"):
            got = 0
            while got < MIB:
                got += b.recv_into(buf[got:], MIB - got)
            if mode == "recv+pwrite":
                os.pwrite(fd, buf, off)
            else:
                copy_in(view, off, buf)
            continue
        if mode == "recvmap":
            got = 0
            while got < MIB:
                got += b.recv_into(view[off + got:off + MIB], MIB - got)
            continue
        got = 0
        while got < MIB:
            got += os.splice(b.fileno(), w, MIB - got)
        put = 0
        while put < MIB:
            if mode == "splice":
                put += os.splice(r, fd, MIB - put, offset_dst=off + put)
            else:
                put += os.readv(r, [view[off + put:off + MIB]])
        if sync_every and i % sync_every == sync_every - 1:
            os.fdatasync(fd)
    t1 = os.times()
    _, _, usage = os.wait4(pid, 0)
    if view is not None:
        view.release()
        m.close()
    os.close(fd)
    os.unlink(path)
    return ((t1.user - t0.user) + (t1.system - t0.system)) / messages * 1e6, (usage.ru_utime + usage.ru_stime) / messages * 1e6


def main():
    where = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    sync_every = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    path = os.path.join(where, f"pipe-drain.{os.getpid()}.img")
    runs = {m: [] for m in ("splice", "mapped", "cold", "recv", "recvmap", "recv+pwrite", "recv+pvm")}
    for _ in range(rounds):
        for mode in runs:
            runs[mode].append(run(mode, path, sync_every))
    print(f"{where}, {MESSAGES} x 1 MiB (cold: {FILE_BYTES // MIB}), fdatasync every {sync_every or 'never'} MiB; CPU us per MiB, median (runs):")
    print(f"  {'mode':7} {'receiver':>9} {'sender':>9}")
    for mode, v in runs.items():
        recv, send = [r for r, _ in v], [s for _, s in v]
        print(f"  {mode:7} {statistics.median(recv):9.1f} {statistics.median(send):9.1f}   receiver {' '.join(f'{x:.0f}' for x in recv)}   sender {' '.join(f'{x:.0f}' for x in send)}")


if __name__ == "__main__":
    main()
