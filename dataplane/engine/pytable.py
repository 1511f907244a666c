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

from .api import Route

_IP = struct.Struct("!I")


def _mask(prefixlen: int) -> int:
    return (0xFFFFFFFF << (32 - prefixlen)) & 0xFFFFFFFF if prefixlen else 0


class RouteTable:
    """Immutable table built from an iterable of api.Route.

    ``lens`` is a tuple of ``(mask, prefixlen, {net_int: (peer_str, port)})``,
    longest prefix first; the value is ready to pass to ``socket.sendto``.
    ``peers`` is the set of peer IPs as strings (the form ``recvfrom``
    reports sources in), for the ``accept_any=False`` source check.
    """
    __slots__ = ("lens", "peers", "size")

    def __init__(self, routes=()):
        by_len: dict[int, dict[int, tuple[str, int]]] = {}
        peers = set()
        size = 0
        for r in routes:
            if not isinstance(r, Route):
                raise TypeError(f"expected Route, got {type(r).__name__}")
            net = ipaddress.IPv4Network(r.subnet)      # strict: host bits must be zero
            port = int(r.port)
            if not 1 <= port <= 0xFFFF:
                raise ValueError(f"route {r!r}: port out of range 1..65535")
            peer = str(ipaddress.IPv4Address(r.peer_ip))
            by_len.setdefault(net.prefixlen, {})[int(net.network_address)] = (peer, port)
            peers.add(peer)
            size += 1
        self.lens = tuple((_mask(plen), plen, by_len[plen]) for plen in sorted(by_len, reverse=True))
        self.peers = frozenset(peers)
        self.size = size

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
