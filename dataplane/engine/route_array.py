"""A route table as numpy arrays in the layouts of csrc/dataplane.h's ``dp_route``
(IPv4 subnets) and ``dp_route6`` (IPv6 subnets), checked once for both engines.

The C engine hands the arrays' memory to ``dp_loops_set_routes`` as they are;
the Python engine builds its dicts from the columns. Both therefore accept
and refuse exactly the same input, with the same exception.
"""
from __future__ import annotations

import ipaddress

import numpy as np

from .api import Route
from .contract import MTU6_MIN, MTU_MAX

# dp_route: the addresses are uint32 holding network-order bytes, which is
# what a big-endian uint32 of the address's integer value stores; the
# numbers are native uint32. native.py checks size and offsets against cffi.
ROUTE_DTYPE = np.dtype([("net", ">u4"), ("prefixlen", "=u4"), ("peer_ip", ">u4"), ("port", "=u4")])
# dp_route6: 16 network-order bytes per address; the peer IPv4-mapped (::ffff:a.b.c.d) for
# the IPv4 underlay, as it is for the IPv6 one; the inner MTU towards it (0: none).
ROUTE6_DTYPE = np.dtype([("net", "V16"), ("peer_ip", "V16"), ("prefixlen", "=u4"),
                         ("port", "=u4"), ("mtu", "=u4"), ("reserved", "=u4")])
_MAPPED = bytes(10) + b"\xff\xff"


def _check_types(routes) -> None:
    for r in routes:
        if not isinstance(r, Route):
            raise TypeError(f"expected Route, got {type(r).__name__}")
        if not isinstance(r.subnet, (ipaddress.IPv4Network, ipaddress.IPv6Network)) or \
                not isinstance(r.peer_ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)) or \
                not isinstance(r.port, int) or not isinstance(r.mtu, int):
            raise TypeError(f"route {r!r}: a subnet of either family, a peer address and an "
                            "int port and mtu")


_NETS = {ipaddress.IPv4Network, ipaddress.IPv6Network}
_PEERS = {ipaddress.IPv4Address, ipaddress.IPv6Address}


def _plain(routes: list) -> bool:
    """Whether _check_types and _check_family accept every route, asked of whole columns
    (a loop in C each: a start hands over a table of 16,000 routes, perf/README.md#peer-table):
    Routes of ipaddress's own classes (no subclass) with int ports and mtus, each IPv4 subnet's
    to an IPv4 peer with no mtu, each mtu 0 or in range. False: ask route by route."""
    if not ({type(r) for r in routes} <= {Route} and {type(r.subnet) for r in routes} <= _NETS
            and {type(r.peer_ip) for r in routes} <= _PEERS
            and {type(r.port) for r in routes} | {type(r.mtu) for r in routes} <= {int}):
        return False
    v4 = ipaddress.IPv4Network
    if {type(r.peer_ip) for r in routes if type(r.subnet) is v4} - {ipaddress.IPv4Address} \
            or any([r.mtu for r in routes if type(r.subnet) is v4]):
        return False
    return all(not mtu or MTU6_MIN <= mtu <= MTU_MAX for mtu in {r.mtu for r in routes})


def _routes_made(rows) -> tuple:
    """``Route(*row)`` of each ``(subnet, peer_ip, port, mtu)`` row, its fields set as its
    ``__init__`` sets them (``object.__setattr__``, a frozen dataclass's way) without that
    Python call per route: 16,000 routes at a start, in the same memory."""
    out = []
    append, new, put = out.append, object.__new__, object.__setattr__
    for subnet, peer_ip, port, mtu in rows:
        route = new(Route)
        put(route, "subnet", subnet)
        put(route, "peer_ip", peer_ip)
        put(route, "port", port)
        put(route, "mtu", mtu)
        append(route)
    return tuple(out)


def _same_as_init() -> bool:
    row = (ipaddress.IPv4Network("10.5.2.0/24"), ipaddress.IPv4Address("192.0.2.7"), 8285, 0)
    try:
        made, built = _routes_made([row])[0], Route(*row)
        return vars(made) == vars(built) and made == built and hash(made) == hash(built) \
            and not hasattr(Route, "__post_init__")
    except Exception:               # noqa: BLE001 (another Route: its constructor then)
        return False


routes_of = (_routes_made if _same_as_init()
             else lambda rows: tuple(Route(*row) for row in rows))       # pragma: no cover


def _peer6(r: Route) -> bytes:
    """dp_route6.peer_ip of an IPv6 subnet's route, refused as dp_routes_build refuses it."""
    peer = r.peer_ip
    if peer.version == 4:
        return _MAPPED + peer.packed
    if peer.is_unspecified or peer.is_link_local or peer.is_multicast:
        raise ValueError(f"route {r!r}: a peer of the IPv6 underlay is neither ::, "
                         "link-local nor multicast")
    return peer.packed


def _check_family(r: Route) -> None:
    if r.subnet.version == 4 and (r.peer_ip.version == 6 or r.mtu):
        raise ValueError(f"route {r!r}: an IPv4 subnet takes an IPv4 peer and no mtu")
    if r.mtu and not MTU6_MIN <= r.mtu <= MTU_MAX:
        raise ValueError(f"route {r!r}: mtu 0 or {MTU6_MIN}..{MTU_MAX}")


def route_arrays(routes) -> tuple[np.ndarray, np.ndarray]:
    """The routes as a ``ROUTE_DTYPE`` array of the IPv4 subnets and a ``ROUTE6_DTYPE``
    array of the IPv6 ones, each in order (a later duplicate wins in both engines).
    TypeError for anything but Routes with a peer address and int port and mtu,
    ValueError for what dataplane.h forbids: a port outside 1..65535, an IPv6 peer or an
    mtu on an IPv4 subnet, an mtu outside 0 and MTU6_MIN..MTU_MAX, an IPv6 peer that is
    ::, link-local or multicast; nothing is built then."""
    routes = list(routes)
    if not _plain(routes):      # the usual table passes whole; else each route says its fault
        _check_types(routes)
        for r in routes:
            _check_family(r)
    # An int too large for int64 makes this an object array, which compares
    # just as well; the check below is then still exact.
    ports = np.array([r.port for r in routes])
    bad = np.flatnonzero((ports < 1) | (ports > 0xFFFF))
    if bad.size:
        raise ValueError(f"route {routes[bad[0]]!r}: port out of range 1..65535")
    v4 = [r for r in routes if r.subnet._version == 4]      # (.version: a Python call)
    v6 = [r for r in routes if r.subnet._version == 6]
    arr = np.empty(len(v4), ROUTE_DTYPE)
    # ipaddress's own fields (what int() and .prefixlen read, through a Python call each)
    arr["net"] = [r.subnet.network_address._ip for r in v4]
    arr["prefixlen"] = [r.subnet._prefixlen for r in v4]
    arr["peer_ip"] = [r.peer_ip._ip for r in v4]
    arr["port"] = [r.port for r in v4]
    arr6 = np.zeros(len(v6), ROUTE6_DTYPE)
    arr6["net"] = [r.subnet.network_address.packed for r in v6]
    arr6["peer_ip"] = [_peer6(r) for r in v6]
    arr6["prefixlen"] = [r.subnet.prefixlen for r in v6]
    arr6["port"] = [r.port for r in v6]
    arr6["mtu"] = [r.mtu for r in v6]
    return arr, arr6


def _key(subnet) -> tuple:
    """A subnet as the rows of its family's array are keyed: (net as stored, prefixlen)."""
    net = subnet.network_address
    return (int(net) if net.version == 4 else net.packed), subnet.prefixlen


class _Rows:
    """One family's array and its rows by subnet, built on first use; a table built with
    duplicates keeps the last one, as the engines do."""
    __slots__ = ("array", "rows")

    def __init__(self, array: np.ndarray, rows: dict | None = None):
        self.array, self.rows = array, rows

    def index(self) -> tuple[np.ndarray, dict]:
        if self.rows is None:
            arr = self.array
            rows = {key: i for i, key in enumerate(self.keys(arr))}
            if len(rows) != len(arr):
                arr = arr[sorted(rows.values())]
                rows = {key: i for i, key in enumerate(self.keys(arr))}
            self.array, self.rows = arr, rows
        return self.array, self.rows

    @staticmethod
    def keys(arr: np.ndarray):
        return zip(arr["net"].tolist(), arr["prefixlen"].tolist())

    def updated(self, removed_keys, add: np.ndarray) -> "_Rows":
        """A copy of the array (a memory copy) with the change applied row by row."""
        old, rows = self.index()
        rows = dict(rows)
        n = len(old)
        arr = np.empty(n + len(add), old.dtype)
        arr[:n] = old
        for key in removed_keys:
            row = rows.pop(key, None)
            if row is None:
                continue
            n -= 1
            if row != n:                   # the last row fills the hole
                arr[row] = arr[n]
                rows[(arr["net"][row].tolist(), int(arr["prefixlen"][row]))] = row
        for i, key in enumerate(self.keys(add)):
            row = rows.setdefault(key, n)
            if row == n:
                n += 1
            arr[row] = add[i]
        return _Rows(arr[:n], rows)


class RouteArray:
    """A route table in ``ROUTE_DTYPE`` and ``ROUTE6_DTYPE`` layout, immutable, that derives
    the next table from a change without visiting the routes the change leaves alone.

    ``array`` and ``array6`` are what the C engine is handed. ``updated(removed, added)``
    copies them (a memory copy) and applies the change row by row, so the Python work is the
    size of the change, not of the table: with thousands of peers a burst of lease events
    costs per event, not per peer. Rows are in no particular order (no two share a subnet,
    so order cannot matter).
    """
    __slots__ = ("_families",)

    def __init__(self, arrays: tuple[np.ndarray, np.ndarray]):
        """``arrays``: the IPv4 and the IPv6 array, as :func:`route_arrays` gives them."""
        self._families = tuple(_Rows(a) for a in arrays)    # IPv4's, IPv6's

    @property
    def array(self) -> np.ndarray:
        return self._families[0].array

    @property
    def array6(self) -> np.ndarray:
        return self._families[1].array

    @classmethod
    def of(cls, routes=()) -> "RouteArray":
        return cls(route_arrays(routes))

    def __len__(self) -> int:
        return sum(len(rows.array) for rows in self._families)

    def updated(self, removed=(), added=()) -> "RouteArray":
        """The table without the routes of the subnets ``removed`` (IPv4Networks or
        IPv6Networks; one with no route is ignored), then with the Routes ``added`` (replacing
        a route of the same subnet). Checked as :func:`route_arrays` checks a whole table:
        nothing is built when a route is refused."""
        removed = list(removed)
        table = RouteArray.__new__(RouteArray)
        table._families = tuple(
            rows.updated([_key(s) for s in removed if s.version == version], add)
            for rows, version, add in zip(self._families, (4, 6), route_arrays(added)))
        return table
