"""Quick sanity figure for an engine, no root needed: push N small packets
through it over a socketpair TUN stand-in and loopback UDP, both ways.

    python perf/engine_loopback.py [--engine c|python] [-n 200000] [--size 64]

TUN -> UDP: a generator thread writes IPv4 packets into the socketpair with
sendmmsg(); a sink reads the UDP datagrams with recvmmsg(). UDP -> TUN: the
reverse. Both helpers call libc through cffi's ABI mode, so the GIL is released
and Python overhead is per batch, not per packet. Each direction is bounded
by --seconds. The socketpair's queue is only net.unix.max_dgram_qlen (10)
deep, so the UDP -> TUN direction shows drop_tun_full when the sink lags:
that is the TUN stand-in, not the engine. Figures are a sanity check, not
the benchmark (perf/ has the real harness, with namespaces and TUN devices).
"""
from __future__ import annotations

import argparse
import socket
import struct
import threading
import time

from cffi import FFI

from dataplane.engine import Route, create_engine

_ffi = FFI()
_ffi.cdef("""
struct iovec { void *iov_base; size_t iov_len; };
struct msghdr { void *msg_name; uint32_t msg_namelen; struct iovec *msg_iov; size_t msg_iovlen;
                void *msg_control; size_t msg_controllen; int msg_flags; };
struct mmsghdr { struct msghdr msg_hdr; unsigned int msg_len; };
int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags);
int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, void *timeout);
""")
_libc = _ffi.dlopen(None)
CHUNK = 64


def _csum(b: bytes) -> int:
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src: str, dst: str, size: int) -> bytes:
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, size, 0, 0, 64, 17, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", _csum(h)) + h[12:] + b"\0" * (size - 20)


class Mmsg:
    """CHUNK preallocated messages over one buffer of CHUNK x size bytes."""

    def __init__(self, size: int, payload: bytes | None = None, dest: tuple | None = None):
        self.buf = _ffi.new("char[]", CHUNK * size)
        self.iov = _ffi.new("struct iovec[]", CHUNK)
        self.msgs = _ffi.new("struct mmsghdr[]", CHUNK)
        name = _ffi.NULL
        if dest:
            sa = struct.pack("=H", socket.AF_INET) + struct.pack("!H", dest[1]) + \
                socket.inet_aton(dest[0]) + b"\0" * 8
            self.sa = _ffi.new("char[]", sa)
            name = self.sa
        for i in range(CHUNK):
            if payload:
                _ffi.memmove(self.buf + i * size, payload, len(payload))
            self.iov[i].iov_base = self.buf + i * size
            self.iov[i].iov_len = size
            self.msgs[i].msg_hdr.msg_iov = self.iov + i
            self.msgs[i].msg_hdr.msg_iovlen = 1
            self.msgs[i].msg_hdr.msg_name = name
            self.msgs[i].msg_hdr.msg_namelen = 16 if dest else 0


def generator(fd: int, m: Mmsg, n: int, deadline: float, sent: list):
    while sent[0] < n and time.monotonic() < deadline:
        k = _libc.sendmmsg(fd, m.msgs, min(CHUNK, n - sent[0]), 0)
        if k > 0:
            sent[0] += k


def sink(fd: int, m: Mmsg, n: int, deadline: float, got: list):
    while got[0] < n and time.monotonic() < deadline:
        k = _libc.recvmmsg(fd, m.msgs, CHUNK, 0, _ffi.NULL)   # SO_RCVTIMEO bounds it
        if k > 0:
            got[0] += k
            got[1] = time.monotonic()


def run_direction(name, engine, gen_fd, gen_m, sink_sock, sink_m, n, seconds):
    sink_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200_000))
    before = engine.stats()
    sent, got = [0], [0, 0.0]
    deadline = time.monotonic() + seconds
    t0 = time.monotonic()
    threads = [threading.Thread(target=sink, args=(sink_sock.fileno(), sink_m, n, deadline, got)),
               threading.Thread(target=generator, args=(gen_fd, gen_m, n, deadline, sent))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.05)
    after = engine.stats()
    d = {k: after[k] - before[k] for k in after}
    elapsed = (got[1] or time.monotonic()) - t0
    rx = d["tun_rx_packets"] if name == "tun->udp" else d["udp_rx_packets"]
    drops = {k: v for k, v in d.items() if k.startswith("drop_") and v}
    print(f"{name}: sent {sent[0]}, delivered {got[0]} in {elapsed:.2f} s = "
          f"{got[0] / elapsed / 1000:.0f} kpps; engine syscalls/packet "
          f"{d['syscalls'] / max(rx, 1):.3f} (polls {d['polls']}, batches "
          f"{d['tx_batches'] if name == 'tun->udp' else d['rx_batches']}); drops {drops}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="c")
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=4.0, help="bound per direction")
    a = ap.parse_args()

    tun, tun_engine = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.2", 0))
    for s in (udp, peer, tun, tun_engine):
        try:   # SO_RCVBUFFORCE (33) passes net.core.rmem_max as root
            s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    engine = create_engine(a.engine, tun_fd=tun_engine.fileno(), udp_fd=udp.fileno(),
                           tun_addr="10.5.1.0", mtu=1472, batch=a.batch)
    engine.set_routes([Route.make("10.7.0.0/16", "127.0.0.2", peer.getsockname()[1])])
    engine.start()
    try:
        print(f"engine {engine.name}, {a.n} packets of {a.size} bytes, batch {a.batch}")
        run_direction("tun->udp", engine, tun.fileno(),
                      Mmsg(a.size, ipv4("10.5.1.2", "10.7.0.1", a.size)),
                      peer, Mmsg(2048), a.n, a.seconds)
        run_direction("udp->tun", engine, peer.fileno(),
                      Mmsg(a.size, ipv4("10.7.0.1", "10.5.1.2", a.size),
                           dest=udp.getsockname()),
                      tun, Mmsg(2048), a.n, a.seconds)
    finally:
        engine.close()
        for s in (tun, tun_engine, udp, peer):
            s.close()


if __name__ == "__main__":
    main()
