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

    ``updated(removed, added)`` derives the next table from a change: the
    dicts are copied whole (in C, without hashing again) and only the
    changed routes are visited in Python, so a lease event costs the
    control plane, and the interpreter the engine shares with it, little
    however many peers there are.
    """
    __slots__ = ("lens", "peers", "size", "_refs")

    def __init__(self, routes=()):
        by_len: dict[int, dict[int, tuple[str, int]]] = {}
        refs: dict[str, int] = {}
        # As csrc/routes.c: the peer of a duplicate that a later route replaced stays a peer.
        table = route_array(routes)
        _fill(table, lambda plen: by_len.setdefault(plen, {}), refs, replace=False)
        self._set(by_len, refs, len(table))

    @classmethod
    def of(cls, routes=()) -> "RouteTable":
        return cls(routes)

    def _set(self, by_len: dict, refs: dict, size: int) -> None:
        self.lens = tuple((_mask(plen), plen, by_len[plen])
                          for plen in sorted(by_len, reverse=True) if by_len[plen])
        self._refs = refs              # peer -> how many routes go to it (+ replaced duplicates)
        self.peers = frozenset(refs)
        self.size = size               # the routes it was built from, as the C engine counts

    def updated(self, removed=(), added=()) -> "RouteTable":
        """This table without the routes of the subnets ``removed`` (IPv4Networks; one with
        no route is ignored), then with the Routes ``added`` (replacing a route of the same
        subnet); checked as a whole table is, nothing built when a route is refused."""
        add = route_array(added)
        by_len = {plen: nets for _, plen, nets in self.lens}   # shared until written
        copied: set[int] = set()
        if sum(self._refs.values()) == sum(len(nets) for _, _, nets in self.lens):
            refs = dict(self._refs)
        else:       # built with duplicates: a derived table knows the peers of its routes only
            refs = {}
            for _, _, nets in self.lens:
                for peer, _ in nets.values():
                    refs[peer] = refs.get(peer, 0) + 1

        def writable(plen: int) -> dict:
            if plen not in copied:
                copied.add(plen)
                by_len[plen] = dict(by_len.get(plen, ()))
            return by_len[plen]

        for subnet in removed:
            net, plen = int(subnet.network_address), subnet.prefixlen
            if net in by_len.get(plen, ()):
                _unref(refs, writable(plen).pop(net)[0])
        _fill(add, writable, refs, replace=True)
        table = RouteTable.__new__(RouteTable)
        table._set(by_len, refs, sum(len(nets) for nets in by_len.values()))
        return table
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

    def __len__(self):
        return self.size


def _fill(table: np.ndarray, nets_of, refs: dict, replace: bool) -> None:
    """Put the rows of a route array into the dicts ``nets_of(prefixlen)`` returns, counting
    the routes per peer in ``refs``; a later route of the same subnet replaces an earlier one,
    whose peer loses that count when ``replace`` (else it stays, as in a whole build)."""
    # A peer's str is made once, however many subnets it serves.
    uniq, which = np.unique(table["peer_ip"], return_inverse=True)
    names = [socket.inet_ntoa(_IP.pack(ip)) for ip in uniq.tolist()]
    hops = zip([names[i] for i in which.tolist()], table["port"].tolist())
    for plen, net, hop in zip(table["prefixlen"].tolist(), table["net"].tolist(), hops):
        nets = nets_of(plen)
        old = nets.get(net) if replace else None
        if old is not None:
            _unref(refs, old[0])
        nets[net] = hop
        refs[hop[0]] = refs.get(hop[0], 0) + 1


def _unref(refs: dict, peer: str) -> None:
    left = refs[peer] - 1
    if left:
        refs[peer] = left
    else:
        del refs[peer]


def str_to_int(ip: str) -> int:
    """Dotted quad to int (for trace events); 0 if not an IPv4 address."""
    try:
        return _IP.unpack(socket.inet_aton(ip))[0]
    except (OSError, TypeError):
        return 0
