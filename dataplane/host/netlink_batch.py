"""rtnetlink requests in bulk on one socket: many messages to a send, each acknowledged, the
acks read in bulk and every answer or error mapped back to its request by its sequence number;
and one dump of a kind of object (routes), its messages split without parsing their attributes.

Why not pyroute2 on this path: DirectRouting makes one route per peer, 16,000 of them at a
start, and each pyroute2 call costs milliseconds of Python (its asyncio machinery, a socket
per IPRoute); its route dump turns every attribute of every route into objects, 2.4 s of CPU
for 16,000 routes against ~0.1 s here (perf/README.md#direct-batch). The kernel's own work is
what remains. host/rtnl.py sends a start's few link, address and route requests through it too
(pyroute2's import alone is ~0.2 s); pyroute2 stays for rare calls off the start, imported there.
"""
from __future__ import annotations

import errno
import os
import socket
import struct

HDR = struct.Struct("=IHHII")
NLMSG_ERROR, NLMSG_DONE = 2, 3
F_REQUEST, F_ACK, F_DUMP = 0x1, 0x4, 0x300
RTMSG = struct.Struct("=BBBBBBBBI")
# Requests per send: the acks of one send (each its own buffer in the kernel's accounting, ~1 KB)
# must fit the socket's default receive buffer, or some are dropped.
BATCH = 64


def attr(kind: int, data: bytes) -> bytes:
    """One rtattr: length, type, data, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(data), kind) + data + bytes(-len(data) % 4)


def attrs(payload: bytes, skip: int = RTMSG.size) -> dict:
    """The attributes after a message's fixed part (``skip`` bytes: an rtmsg's) by type."""
    found: dict = {}
    off = skip
    while off + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, off)
        if length < 4:
            break
        found[kind] = payload[off + 4:off + length]
        off += (length + 3) & ~3
    return found


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def _messages(data: bytes):
    """(type, seq, payload) of each netlink message in one datagram."""
    off = 0
    while off + HDR.size <= len(data):
        length, kind, _, seq, _ = HDR.unpack_from(data, off)
        if length < HDR.size:
            return
        yield kind, seq, data[off + HDR.size:off + length]
        off += (length + 3) & ~3


def request(msgs: list) -> tuple[list, list]:
    """Send ``msgs`` ((type, flags, body) each), every one with NLM_F_ACK, ``BATCH`` to a send;
    returns (errors, answers), both in the order of ``msgs``: the errno the kernel answered
    each with (0: done), and the body of the message it answered with, if any (a route get's
    route), else None."""
    errors, answers = [0] * len(msgs), [None] * len(msgs)
    if not msgs:
        return errors, answers
    with _socket() as sock:
        for start in range(0, len(msgs), BATCH):
            chunk = msgs[start:start + BATCH]
            sock.sendall(b"".join(
                HDR.pack(HDR.size + len(body), kind, F_REQUEST | F_ACK | flags, start + i + 1, 0)
                + body for i, (kind, flags, body) in enumerate(chunk)))
            pending = len(chunk)
            while pending:
                for kind, seq, payload in _messages(sock.recv(1 << 16)):
                    i = seq - 1
                    if not 0 <= i < len(msgs):
                        continue
                    if kind == NLMSG_ERROR:
                        errors[i] = -struct.unpack_from("=i", payload)[0]
                        pending -= 1
                    elif kind != NLMSG_DONE:
                        answers[i] = payload
    return errors, answers


def dump(kind: int, body: bytes, sock: socket.socket | None = None) -> list:
    """The bodies of the kernel's answer to one dump request (``kind``, e.g. RTM_GETROUTE, with
    ``body`` its fixed part: the family); OSError with the kernel's errno if it refuses. On
    ``sock`` (:func:`open_socket`'s, kept by a caller that asks often) when given, else on a
    socket of its own."""
    if sock is not None:
        return _dump(sock, kind, body)
    with _socket() as own:
        return _dump(own, kind, body)


def open_socket() -> socket.socket:
    """A bound rtnetlink socket for :func:`dump`; the caller closes it (and drops it after a
    failed dump: the rest of that answer may still be queued)."""
    return _socket()


def _dump(sock: socket.socket, kind: int, body: bytes) -> list:
    out: list = []
    sock.sendall(HDR.pack(HDR.size + len(body), kind, F_REQUEST | F_DUMP, 1, 0) + body)
    while True:
        for got, seq, payload in _messages(sock.recv(1 << 16)):
            if seq != 1:
                continue
            if got == NLMSG_DONE:
                return out
            if got == NLMSG_ERROR:
                code = -struct.unpack_from("=i", payload)[0]
                if code:
                    raise OSError(code, os.strerror(code))
                return out
            out.append(payload)


def errno_name(code: int) -> str:
    """``EEXIST``, say, for the log; the number if it has no name."""
    return errno.errorcode.get(code, str(code))
