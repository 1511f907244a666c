"""The IPv6 underlay's socket group (host/udpsock.py) on loopback: one socket per queue on one
[address]:port, IPv6 only, steered by the inner flow as the IPv4 group. No engine: the
sockets are read here."""
from __future__ import annotations

import errno
import ipaddress
import socket
import time

import pytest

from dataplane.host.udpsock import SocketCallError, endpoint, open_udp_sockets

QUEUES = 3
FLOWS = 24


def _inner6(sport: int, data: bytes) -> bytes:
    udp = (sport.to_bytes(2, "big") + (5201).to_bytes(2, "big")
           + (8 + len(data)).to_bytes(2, "big") + b"\0\0" + data)
    return (bytes([0x60, 0, 0, 0]) + len(udp).to_bytes(2, "big") + bytes([17, 64])
            + ipaddress.IPv6Address("fc00:5:0:2::2").packed
            + ipaddress.IPv6Address("fc00:5:0:1::2").packed + udp)


def test_an_ipv6_group_is_ipv6_only_one_port_and_steered_by_the_inner_flow():
    socks = open_udp_sockets("::1", 0, QUEUES, bufsize=1 << 20, blocking=False)
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        assert {s.family for s in socks} == {socket.AF_INET6}
        assert all(s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1 for s in socks)
        port = socks[0].getsockname()[1]
        assert {s.getsockname()[:2] for s in socks} == {("::1", port)}
        assert endpoint("::1", port) == f"[::1]:{port}"
        # the port is held: a second group (another daemon) cannot join it
        with pytest.raises(SocketCallError) as e:
            open_udp_sockets("::1", port, 2)
        assert e.value.errno == errno.EADDRINUSE and f"bind([::1]:{port})" in str(e.value)
        sent = [_inner6(30000 + 2 * f, bytes([r])) for f in range(FLOWS) for r in range(3)]
        for pkt in sent:
            peer.sendto(pkt, ("::1", port))
        got = [[] for _ in socks]
        deadline = time.monotonic() + 5
        while sum(map(len, got)) < len(sent) and time.monotonic() < deadline:
            for i, s in enumerate(socks):
                try:
                    got[i].append(s.recv(2048))
                except BlockingIOError:
                    pass
        flows_of = [{g[40:42] for g in of_one} for of_one in got]
        assert all(flows_of), [len(f) for f in flows_of]
        assert sum(len(f) for f in flows_of) == FLOWS, "a flow was split over queues"
    finally:
        peer.close()
        for s in socks:
            s.close()
