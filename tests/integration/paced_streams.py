"""Paced streams that measure an outage: what was lost and the longest silence, at the receiver.

Run inside a testbed host as ``python paced_streams.py MODE ARGS...``; each end prints one JSON
line when it is done (receivers print ``ready`` first, once they listen; senders ``sending``,
once they send). Every loop is bounded in packets and in time. A sender stops early, cleanly,
on SIGUSR1: the caller ends the streams a fixed time after what it measures, however long that
took. Arrival times are the kernel's (SO_TIMESTAMPNS: when the data reached the socket), so that
a receiver the scheduler kept waiting on a busy machine makes no silence of its own. IP is
either family.

    udp-sink IP PORT SECONDS              datagrams numbered by udp-send; ends at its END marker
                                          or after SECONDS: received, distinct, max_gap_ms (the
                                          longest time between two arrivals)
    udp-send IP PORT RATE COUNT           at most COUNT datagrams at RATE per second, then END
                                          markers: sent (how many were)
    tcp-sink IP PORT SECONDS              one connection, read to EOF: bytes, sha256, max_gap_ms
                                          (the longest time between two arrivals of data), error
                                          (a reset shows here)
    tcp-send IP PORT RATE CHUNK SECONDS   CHUNK bytes RATE times a second for at most SECONDS
                                          (sent on schedule: a stall is caught up after it), then
                                          EOF: bytes, sha256, error
"""
from __future__ import annotations

import hashlib
import json
import signal
import socket
import struct
import sys
import time

_SEQ = struct.Struct("!Q")
_TIMESPEC = struct.Struct("qq")
END = 2 ** 64 - 1
UDP_PAYLOAD = 200
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
STALL_S = 30.0          # a TCP send or connect blocked this long is an error, not an outage
STOP = signal.SIGUSR1


class _Stop:
    """Set by STOP; the senders look at it before each send."""
    asked = False

    @classmethod
    def arm(cls) -> None:
        signal.signal(STOP, lambda *_: setattr(cls, "asked", True))
        print("sending", flush=True)


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _stamped(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def _recv(s: socket.socket, size: int) -> tuple[bytes, float]:
    """Data and when the kernel received it (the last of it, for TCP)."""
    data, anc, _flags, _addr = s.recvmsg(size, socket.CMSG_SPACE(_TIMESPEC.size))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            return data, sec + nsec / 1e9
    return data, time.time()


def _done(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


def udp_sink(ip: str, port: int, seconds: float) -> None:
    s = socket.socket(_family(ip), socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    _stamped(s)
    s.bind((ip, port))
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    seen, received, max_gap, last, ended = set(), 0, 0.0, None, False
    while not ended:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s.settimeout(left)
        try:
            data, now = _recv(s, 2048)
        except socket.timeout:
            break
        (seq,) = _SEQ.unpack_from(data)
        if seq == END:
            ended = True
            continue
        received += 1
        seen.add(seq)
        if last is not None:
            max_gap = max(max_gap, now - last)
        last = now
    _done({"received": received, "distinct": len(seen), "max_gap_ms": round(max_gap * 1e3, 1),
           "ended": ended, "missing": sorted(set(range(max(seen, default=-1) + 1)) - seen)[:50]})


def udp_send(ip: str, port: int, rate: float, count: int) -> None:
    s = socket.socket(_family(ip), socket.SOCK_DGRAM)
    pad = bytes(UDP_PAYLOAD - _SEQ.size)
    _Stop.arm()
    start, errors, sent = time.monotonic(), 0, 0
    for seq in range(count):
        if _Stop.asked:
            break
        sent += 1
        due = start + seq / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            s.sendto(_SEQ.pack(seq) + pad, (ip, port))
        except OSError:         # ENETUNREACH while there is no route: counted, as lost
            errors += 1
    for _ in range(5):
        time.sleep(0.05)
        s.sendto(_SEQ.pack(END), (ip, port))
    _done({"sent": sent, "send_errors": errors, "seconds": round(time.monotonic() - start, 2)})


def tcp_sink(ip: str, port: int, seconds: float) -> None:
    ls = socket.socket(_family(ip))
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((ip, port))
    ls.listen(1)
    ls.settimeout(seconds)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    h, n, max_gap, last, error = hashlib.sha256(), 0, 0.0, None, None
    try:
        c, _ = ls.accept()
        _stamped(c)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                error = "timed out"
                break
            c.settimeout(left)
            b, now = _recv(c, 1 << 16)
            if not b:
                break
            if last is not None:
                max_gap = max(max_gap, now - last)
            last = now
            h.update(b)
            n += len(b)
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
    _done({"bytes": n, "sha256": h.hexdigest(), "max_gap_ms": round(max_gap * 1e3, 1),
           "error": error})


def tcp_send(ip: str, port: int, rate: float, chunk: int, seconds: float) -> None:
    h, n, error = hashlib.sha256(), 0, None
    block = bytes(range(256)) * (chunk // 256 + 1)
    try:
        s = socket.create_connection((ip, port), timeout=STALL_S)
        _Stop.arm()
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            if _Stop.asked:
                break
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            data = block[i % 256:i % 256 + chunk]
            s.sendall(data)
            h.update(data)
            n += len(data)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        s.recv(1)               # the sink's close: everything was read
        s.close()
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
    _done({"bytes": n, "sha256": h.hexdigest(), "error": error})


def main(argv: list[str]) -> None:
    mode, ip, port, *rest = argv
    port = int(port)
    if mode == "udp-sink":
        udp_sink(ip, port, float(rest[0]))
    elif mode == "udp-send":
        udp_send(ip, port, float(rest[0]), int(rest[1]))
    elif mode == "tcp-sink":
        tcp_sink(ip, port, float(rest[0]))
    elif mode == "tcp-send":
        tcp_send(ip, port, float(rest[0]), int(rest[1]), float(rest[2]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
