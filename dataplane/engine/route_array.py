"""A route table packed in the layouts of csrc/dataplane.h's ``dp_route`` (IPv4 subnets)
and ``dp_route6`` (IPv6 subnets), checked once for both engines.

The C engine hands the packed memory to ``dp_loops_set_routes`` as it is; the Python engine
builds its dicts from the checked columns. Both therefore accept and refuse exactly the same
input, with the same exception. No numpy: its import was ~0.1 s of a daemon's start, before
READY, for what ``array`` and ``struct`` do in C loops as well (perf/README.md#no-numpy).
"""
from __future__ import annotations

import ipaddress
import struct
import sys
from array import array

from .api import Route
from .contract import MTU6_MIN, MTU_MAX

assert array("I").itemsize == 4     # a row is read as the C structs' uint32 words
_LITTLE = sys.byteorder == "little"


class Layout:
    """A C struct's size and its fields' offsets and formats (native.py checks them against
    cffi); an IPv4 address is a uint32 holding network-order bytes."""
    __slots__ = ("itemsize", "fields")

    def __init__(self, itemsize: int, fields: tuple):
        self.itemsize, self.fields = itemsize, fields    # ((name, offset, struct format), ...)

    @property
    def names(self) -> tuple:
        return tuple(name for name, _, _ in self.fields)

    def offset(self, name: str) -> int:
        return next(off for n, off, _ in self.fields if n == name)


ROUTE_LAYOUT = Layout(16, (("net", 0, ">I"), ("prefixlen", 4, "=I"), ("peer_ip", 8, ">I"),
                           ("port", 12, "=I")))
# dp_route6: 16 network-order bytes per address; the peer IPv4-mapped (::ffff:a.b.c.d) for
# the IPv4 underlay, as it is for the IPv6 one; the inner MTU towards it (0: none).
ROUTE6_LAYOUT = Layout(48, (("net", 0, "16s"), ("peer_ip", 16, "16s"), ("prefixlen", 32, "=I"),
                            ("port", 36, "=I"), ("mtu", 40, "=I"), ("reserved", 44, "=I")))
_ROW6 = struct.Struct("=16s16sIIII")
_MAPPED = bytes(10) + b"\xff\xff"


class Packed:
    """One family's rows in its Layout: ``words`` (an ``array('I')``, what cffi's from_buffer
    hands to C), ``len`` its rows."""
    __slots__ = ("words", "layout")

    def __init__(self, words: array, layout: Layout):
        self.words, self.layout = words, layout

    @property
    def itemsize(self) -> int:
        return self.layout.itemsize

    @property
    def width(self) -> int:
        return self.layout.itemsize // 4

    @property
    def nbytes(self) -> int:
        return len(self.words) * 4

    def __len__(self) -> int:
        return len(self.words) // self.width

    def tobytes(self) -> bytes:
        return self.words.tobytes()

    def column(self, name: str) -> list:
        """A field of every row, as its format reads it (an IPv4 address as its int)."""
        off = self.layout.offset(name)
        fmt = struct.Struct(next(f for n, _, f in self.layout.fields if n == name))
        buf, size = self.words.tobytes(), self.itemsize
        return [fmt.unpack_from(buf, i + off)[0] for i in range(0, len(buf), size)]

    def rows(self) -> list:
        """Each row as a tuple of its fields (for checks)."""
        cols = [self.column(n) for n in self.layout.names]
        return list(zip(*cols))


def _words(values) -> array:
    """The ints as native uint32 words."""
    return array("I", values)


def be_words(values) -> array:
    """The ints as uint32 words holding their network-order bytes."""
    out = array("I", values)
    if _LITTLE:
        out.byteswap()
    return out


def pack4(nets, plens, peers, ports) -> Packed:
    """dp_route rows of four columns of ints (the addresses' own values), by whole columns."""
    words = array("I", bytes(16 * len(nets)))
    words[0::4], words[1::4] = be_words(nets), _words(plens)
    words[2::4], words[3::4] = be_words(peers), _words(ports)
    return Packed(words, ROUTE_LAYOUT)


def pack6(nets, peers, plens, ports, mtus) -> Packed:
    """dp_route6 rows of their columns (addresses as 16 bytes)."""
    words = array("I")
    words.frombytes(b"".join(map(_ROW6.pack, nets, peers, plens, ports, mtus,
                                 [0] * len(nets))))
    return Packed(words, ROUTE6_LAYOUT)


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


def route_columns(routes) -> tuple[tuple, tuple]:
    """The routes checked and split by family into columns: the IPv4 subnets' (nets, prefix
    lengths, peers, ports; addresses as their ints) and the IPv6 ones' (nets and peers as
    dp_route6's 16 bytes, prefix lengths, ports, mtus), each in order (a later duplicate wins
    in both engines). TypeError for anything but Routes with a peer address and int port and
    mtu, ValueError for what dataplane.h forbids: a port outside 1..65535, an IPv6 peer or an
    mtu on an IPv4 subnet, an mtu outside 0 and MTU6_MIN..MTU_MAX, an IPv6 peer that is ::,
    link-local or multicast; nothing is built then."""
    routes = list(routes)
    if not _plain(routes):      # the usual table passes whole; else each route says its fault
        _check_types(routes)
        for r in routes:
            _check_family(r)
    ports = [r.port for r in routes]
    if ports and (min(ports) < 1 or max(ports) > 0xFFFF):
        bad = next(r for r in routes if not 1 <= r.port <= 0xFFFF)
        raise ValueError(f"route {bad!r}: port out of range 1..65535")
    v4 = [r for r in routes if r.subnet._version == 4]      # (.version: a Python call)
    v6 = [r for r in routes if r.subnet._version == 6]
    # ipaddress's own fields (what int() and .prefixlen read, through a Python call each)
    cols4 = ([r.subnet.network_address._ip for r in v4], [r.subnet._prefixlen for r in v4],
             [r.peer_ip._ip for r in v4], [r.port for r in v4])
    cols6 = ([r.subnet.network_address.packed for r in v6], [_peer6(r) for r in v6],
             [r.subnet.prefixlen for r in v6], [r.port for r in v6], [r.mtu for r in v6])
    return cols4, cols6


def route_arrays(routes) -> tuple[Packed, Packed]:
    """The routes as dp_route rows of the IPv4 subnets and dp_route6 rows of the IPv6 ones,
    each in order, checked as :func:`route_columns` checks them."""
    cols4, cols6 = route_columns(routes)
    return pack4(*cols4), pack6(*cols6)


def _key(subnet) -> tuple:
    """A subnet as the rows of its family's array are keyed: (net as stored, prefixlen)."""
    net = subnet.network_address
    if net.version == 4:
        return int.from_bytes(net.packed, sys.byteorder), subnet.prefixlen
    return net.packed, subnet.prefixlen


class _Rows:
    """One family's rows and their row numbers by subnet, indexed on first use; a table built
    with duplicates keeps the last one, as the engines do."""
    __slots__ = ("array", "rows")

    def __init__(self, array: Packed, rows: dict | None = None):
        self.array, self.rows = array, rows

    def index(self) -> tuple[Packed, dict]:
        if self.rows is None:
            arr = self.array
            rows = {key: i for i, key in enumerate(self.keys(arr))}
            if len(rows) != len(arr):
                w, words = arr.width, arr.words
                kept = array("I")
                for i in sorted(rows.values()):
                    kept.extend(words[i * w:(i + 1) * w])
                arr = Packed(kept, arr.layout)
                rows = {key: i for i, key in enumerate(self.keys(arr))}
            self.array, self.rows = arr, rows
        return self.array, self.rows

    @staticmethod
    def keys(arr: Packed):
        """(net as stored, prefixlen) of each row: IPv4's net word, IPv6's 16 bytes."""
        words, w = arr.words, arr.width
        if arr.layout is ROUTE_LAYOUT:
            return zip(words[0::4], words[1::4])
        return zip([words[i:i + 4].tobytes() for i in range(0, len(words), w)], words[8::w])

    @staticmethod
    def _key_at(words: array, row: int, w: int) -> tuple:
        at = row * w
        if w == 4:
            return words[at], words[at + 1]
        return words[at:at + 4].tobytes(), words[at + 8]

    def updated(self, removed_keys, add: Packed) -> "_Rows":
        """A copy of the rows (a memory copy) with the change applied row by row."""
        old, rows = self.index()
        rows = dict(rows)
        w, n = old.width, len(old)
        arr = array("I", old.words)
        arr.extend(add.words)               # room for the added rows; written below
        for key in removed_keys:
            row = rows.pop(key, None)
            if row is None:
                continue
            n -= 1
            if row != n:                   # the last row fills the hole
                arr[row * w:(row + 1) * w] = arr[n * w:(n + 1) * w]
                rows[self._key_at(arr, row, w)] = row
        add_words = add.words
        for i, key in enumerate(self.keys(add)):
            row = rows.setdefault(key, n)
            if row == n:
                n += 1
            arr[row * w:(row + 1) * w] = add_words[i * w:(i + 1) * w]
        del arr[n * w:]
        return _Rows(Packed(arr, old.layout), rows)


class RouteArray:
    """A route table in ``dp_route`` and ``dp_route6`` layout, immutable, that derives the next
    table from a change without visiting the routes the change leaves alone.

    ``array`` and ``array6`` (:class:`Packed`) are what the C engine is handed.
    ``updated(removed, added)`` copies them (a memory copy) and applies the change row by row,
    so the Python work is the size of the change, not of the table: with thousands of peers a
    burst of lease events costs per event, not per peer. Rows are in no particular order (no
    two share a subnet, so order cannot matter).
    """
    __slots__ = ("_families",)

    def __init__(self, arrays: tuple[Packed, Packed]):
        """``arrays``: the IPv4 and the IPv6 rows, as :func:`route_arrays` gives them."""
        self._families = tuple(_Rows(a) for a in arrays)    # IPv4's, IPv6's

    @property
    def array(self) -> Packed:
        return self._families[0].array

    @property
    def array6(self) -> Packed:
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
