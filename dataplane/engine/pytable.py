"""The pure-Python engine's route table: longest prefix match with dicts.

Same semantics as csrc/routes.c: per family, one dict per distinct prefix
length, keyed by the masked network as an int (128 bits for IPv6), probed
longest length first, so the cost grows with the number of distinct lengths
(flannel uses one), not with the number of peers. A duplicate (net,
prefixlen) keeps the last route. The routes of both families share one set
of peers: an IPv4 peer's name is a dotted quad, an IPv6 peer's (the IPv6
underlay, IPv6 subnets only) the text recvfrom gives an AF_INET6 source in,
so one set serves both sockets' source checks and no name is of both. A
table is immutable once built; the engine publishes a new one by swapping
one reference, which is atomic under the GIL.

Flow, in the order the code appears:
  RouteTable    build (route_columns, then _fill and _fill6), updated (a change
                applied to copies of the dicts it touches), lookup / lookup6
                (the engine inlines them), lookup_addr
  _fill, _fill6 the columns of the IPv4 / IPv6 routes into the dicts
  str_to_int    a peer for trace events
"""
from __future__ import annotations

import ipaddress
import socket
import struct

from .route_array import route_columns

_IP = struct.Struct("!I")
_MAPPED = bytes(10) + b"\xff\xff"


def _mask(prefixlen: int) -> int:
    return (0xFFFFFFFF << (32 - prefixlen)) & 0xFFFFFFFF if prefixlen else 0


_ALL6 = (1 << 128) - 1


def _mask6(prefixlen: int) -> int:
    return _ALL6 ^ (_ALL6 >> prefixlen)


class RouteTable:
    """Immutable table built from an iterable of api.Route, checked as
    the C engine checks it (route_columns).

    ``lens`` is a tuple of ``(mask, prefixlen, {net_int: (peer_str, port)})``,
    longest prefix first; the value is ready to pass to ``socket.sendto``.
    ``lens6`` is the same for the IPv6 subnets, masks and nets being 128-bit
    ints, each value ``(hop, mtu)``: ``hop`` is ``(peer_str, port)`` for a
    peer of the IPv4 underlay and ``(peer_str, port, 0, 0)`` (an AF_INET6
    sockaddr, which is how the engine tells the socket) for one of the IPv6
    underlay; ``mtu`` is the route's (0: none). ``peers`` is the set of peer
    IPs of both families' routes as strings (the form ``recvfrom`` reports
    sources in), for the ``accept_any=False`` source check; ``peers6`` how many
    of them are IPv6 peers.

    ``updated(removed, added)`` derives the next table from a change: the
    dicts are copied whole (in C, without hashing again) and only the
    changed routes are visited in Python, so a lease event costs the
    control plane, and the interpreter the engine shares with it, little
    however many peers there are.
    """
    __slots__ = ("lens", "lens6", "peers", "peers6", "size", "_refs")

    def __init__(self, routes=()):
        by_len: dict[int, dict[int, dict]] = {4: {}, 6: {}}    # version -> prefixlen -> nets
        refs: dict[str, int] = {}
        # As csrc/routes.c: the peer of a duplicate that a later route replaced stays a peer.
        tables = route_columns(routes)
        for fill, table, nets in zip(_FILL, tables, by_len.values()):
            fill(table, lambda plen, nets=nets: nets.setdefault(plen, {}), refs, replace=False)
        self._set(by_len, refs, sum(len(cols[0]) for cols in tables))

    @classmethod
    def of(cls, routes=()) -> "RouteTable":
        return cls(routes)

    def _set(self, by_len: dict, refs: dict, size: int) -> None:
        """``by_len``: per version, the nets by prefix length."""
        self.lens, self.lens6 = (
            tuple((mask(plen), plen, nets[plen]) for plen in sorted(nets, reverse=True)
                  if nets[plen])
            for mask, nets in zip((_mask, _mask6), by_len.values()))
        self._refs = refs              # peer -> how many routes go to it (+ replaced duplicates)
        self.peers = frozenset(refs)
        self.peers6 = sum(":" in peer for peer in refs)
        self.size = size               # the routes it was built from, as the C engine counts

    def _routes(self):
        """Every route's (net, hop), both families."""
        for _, _, nets in self.lens:
            yield from nets.items()
        for _, _, nets in self.lens6:
            for net, (hop, _) in nets.items():
                yield net, hop

    def updated(self, removed=(), added=()) -> "RouteTable":
        """This table without the routes of the subnets ``removed`` (IPv4Networks or
        IPv6Networks; one with no route is ignored), then with the Routes ``added``
        (replacing a route of the same subnet); checked as a whole table is, nothing built
        when a route is refused."""
        adds = route_columns(added)
        by_len = {version: {plen: nets for _, plen, nets in lens}    # shared until written
                  for version, lens in ((4, self.lens), (6, self.lens6))}
        routes = sum(len(nets) for _, _, nets in self.lens + self.lens6)
        if sum(self._refs.values()) == routes:
            refs = dict(self._refs)
        else:       # built with duplicates: a derived table knows the peers of its routes only
            refs = {}
            for _, (peer, _) in self._routes():
                refs[peer] = refs.get(peer, 0) + 1
        writable = {version: _copy_on_write(nets) for version, nets in by_len.items()}
        for subnet in removed:
            version, plen = subnet.version, subnet.prefixlen
            net = int(subnet.network_address)
            if net in by_len[version].get(plen, ()):
                value = writable[version](plen).pop(net)
                _unref(refs, (value if version == 4 else value[0])[0])
        for fill, add, version in zip(_FILL, adds, (4, 6)):
            fill(add, writable[version], refs, replace=True)
        table = RouteTable.__new__(RouteTable)
        table._set(by_len, refs, sum(len(nets) for lens in by_len.values()
                                     for nets in lens.values()))
        return table

    def lookup(self, dst: int):
        """``(peer_str, port), prefixlen`` for an IPv4 destination given as an
        int, or ``None`` on a miss (the engine inlines this loop)."""
        for mask, plen, nets in self.lens:
            hop = nets.get(dst & mask)
            if hop is not None:
                return hop, plen
        return None

    def lookup6(self, dst: int):
        """:meth:`lookup` for an IPv6 destination given as a 128-bit int (the hop
        only: :meth:`route6` has the mtu too)."""
        hit = self.route6(dst)
        return None if hit is None else (hit[0], hit[2])

    def route6(self, dst: int):
        """``hop, mtu, prefixlen`` for an IPv6 destination given as a 128-bit int, or
        ``None`` on a miss (the engine inlines this loop)."""
        for mask, plen, nets in self.lens6:
            value = nets.get(dst & mask)
            if value is not None:
                return value[0], value[1], plen
        return None

    def lookup_addr(self, dst):
        """Same as :meth:`lookup` or :meth:`lookup6` for an address of either family
        given as str/IPv4Address/IPv6Address."""
        addr = ipaddress.ip_address(dst)
        return (self.lookup if addr.version == 4 else self.lookup6)(int(addr))

    def __len__(self):
        return self.size


def _copy_on_write(by_len: dict):
    """``writable(prefixlen)``: the dict of that length in ``by_len``, copied on the first
    call (the old table still uses the original) and made if there is none."""
    copied: set[int] = set()

    def writable(plen: int) -> dict:
        if plen not in copied:
            copied.add(plen)
            by_len[plen] = dict(by_len.get(plen, ()))
        return by_len[plen]
    return writable


def _fill(cols: tuple, nets_of, refs: dict, replace: bool) -> None:
    """Put the IPv4 routes' columns (route_columns) into the dicts ``nets_of(prefixlen)``
    returns, counting the routes per peer in ``refs``; a later route of the same subnet
    replaces an earlier one, whose peer loses that count when ``replace`` (else it stays, as
    in a whole build)."""
    nets, plens, peers, ports = cols
    # A peer's str is made once, however many subnets it serves.
    names = {ip: socket.inet_ntoa(_IP.pack(ip)) for ip in set(peers)}
    hops = zip(map(names.__getitem__, peers), ports)
    for plen, net, hop in zip(plens, nets, hops):
        nets = nets_of(plen)
        old = nets.get(net) if replace else None
        if old is not None:
            _unref(refs, old[0])
        nets[net] = hop
        refs[hop[0]] = refs.get(hop[0], 0) + 1


def _name6(peer: bytes) -> str:
    """A dp_route6 peer_ip as recvfrom names a source of its underlay's socket: an
    IPv4-mapped peer by its last 4 bytes, any other as inet_ntop writes it."""
    if peer[:12] == _MAPPED:
        return socket.inet_ntoa(peer[12:])
    return socket.inet_ntop(socket.AF_INET6, peer)


def _fill6(cols: tuple, nets_of, refs: dict, replace: bool) -> None:
    """:func:`_fill` for the IPv6 routes' columns: nets as 128-bit ints, values (hop, mtu)
    with an IPv6 peer's hop in AF_INET6's form (RouteTable says why)."""
    names: dict[bytes, str] = {}
    for net, peer, plen, port, mtu in zip(*cols):
        name = names.get(peer)
        if name is None:
            name = names[peer] = _name6(peer)
        nets = nets_of(plen)
        net = int.from_bytes(net, "big")
        old = nets.get(net) if replace else None
        if old is not None:
            _unref(refs, old[0][0])
        nets[net] = ((name, port) if ":" not in name else (name, port, 0, 0), mtu)
        refs[name] = refs.get(name, 0) + 1


_FILL = (_fill, _fill6)      # IPv4's, IPv6's


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
