"""The pure-Python engine's route table: longest prefix match with dicts.

Same semantics as csrc/routes.c: one dict per distinct prefix length, keyed
by the masked network as an int, probed longest length first, so the cost
grows with the number of distinct lengths (flannel uses one), not with the
number of peers. A duplicate (net, prefixlen) keeps the last route. A table
is immutable once built; the engine publishes a new one by swapping one
reference, which is atomic under the GIL.
"""
from __future__ import annotations

import ipaddress
import socket
import struct

import numpy as np

from .route_array import route_array

_IP = struct.Struct("!I")


def _mask(prefixlen: int) -> int:
    return (0xFFFFFFFF << (32 - prefixlen)) & 0xFFFFFFFF if prefixlen else 0


class RouteTable:
    """Immutable table built from an iterable of api.Route, checked as
    the C engine checks it (route_array).

    ``lens`` is a tuple of ``(mask, prefixlen, {net_int: (peer_str, port)})``,
    longest prefix first; the value is ready to pass to ``socket.sendto``.
    ``peers`` is the set of peer IPs as strings (the form ``recvfrom``
    reports sources in), for the ``accept_any=False`` source check.
    """
    __slots__ = ("lens", "peers", "size")

    def __init__(self, routes=()):
        table = route_array(routes)
        # A peer's str is made once, however many subnets it serves.
        uniq, which = np.unique(table["peer_ip"], return_inverse=True)
        names = [socket.inet_ntoa(_IP.pack(ip)) for ip in uniq.tolist()]
        hops = list(zip([names[i] for i in which.tolist()], table["port"].tolist()))
        nets = table["net"].tolist()
        by_len: dict[int, dict[int, tuple[str, int]]] = {}
        for plen, net, hop in zip(table["prefixlen"].tolist(), nets, hops):
            by_len.setdefault(plen, {})[net] = hop
        self.lens = tuple((_mask(plen), plen, by_len[plen]) for plen in sorted(by_len, reverse=True))
        self.peers = frozenset(names)
        self.size = len(table)

    def lookup(self, dst: int):
        """``(peer_str, port), prefixlen`` for a destination given as an
        int, or ``None`` on a miss (the engine inlines this loop)."""
        for mask, plen, nets in self.lens:
            hop = nets.get(dst & mask)
            if hop is not None:
                return hop, plen
        return None

    def lookup_addr(self, dst):
        """Same as :meth:`lookup` for an address given as str/IPv4Address."""
        return self.lookup(int(ipaddress.IPv4Address(dst)))

    def has_peer(self, ip: str) -> bool:
        return ip in self.peers

    def __len__(self):
        return self.size


def ip_to_int(packed: bytes) -> int:
    return _IP.unpack(packed)[0]


def str_to_int(ip: str) -> int:
    """Dotted quad to int (for trace events); 0 if not an IPv4 address."""
    try:
        return _IP.unpack(socket.inet_aton(ip))[0]
    except (OSError, TypeError):
        return 0
