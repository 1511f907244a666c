"""A route table as one numpy array in the layout of csrc/dataplane.h's
``dp_route``, checked once for both engines.

The C engine hands the array's memory to ``dp_loop_set_routes`` as it is;
the Python engine builds its dicts from the columns. Both therefore accept
and refuse exactly the same input, with the same exception.
"""
from __future__ import annotations

import ipaddress

import numpy as np

from .api import Route

# dp_route: the addresses are uint32 holding network-order bytes, which is
# what a big-endian uint32 of the address's integer value stores; the
# numbers are native uint32. native.py checks size and offsets against cffi.
ROUTE_DTYPE = np.dtype([("net", ">u4"), ("prefixlen", "=u4"), ("peer_ip", ">u4"), ("port", "=u4")])


def _check_types(routes) -> None:
    for r in routes:
        if not isinstance(r, Route):
            raise TypeError(f"expected Route, got {type(r).__name__}")
        if not isinstance(r.subnet, ipaddress.IPv4Network) or \
                not isinstance(r.peer_ip, ipaddress.IPv4Address) or \
                not isinstance(r.port, int):
            raise TypeError(f"route {r!r} is not IPv4")


def route_array(routes) -> np.ndarray:
    """The routes as a ``ROUTE_DTYPE`` array, in order (a later duplicate
    wins in both engines). TypeError for anything but IPv4 Routes with an
    int port, ValueError for a port outside 1..65535; nothing is built then."""
    routes = list(routes)
    _check_types(routes)
    # An int too large for int64 makes this an object array, which compares
    # just as well; the check below is then still exact.
    ports = np.array([r.port for r in routes])
    bad = np.flatnonzero((ports < 1) | (ports > 0xFFFF))
    if bad.size:
        raise ValueError(f"route {routes[bad[0]]!r}: port out of range 1..65535")
    arr = np.empty(len(routes), ROUTE_DTYPE)
    arr["net"] = [int(r.subnet.network_address) for r in routes]
    arr["prefixlen"] = [r.subnet.prefixlen for r in routes]
    arr["peer_ip"] = [int(r.peer_ip) for r in routes]
    arr["port"] = ports
    return arr


class RouteArray:
    """A route table in ``ROUTE_DTYPE`` layout, immutable, that derives the next table from a
    change without visiting the routes the change leaves alone.

    ``array`` is what the C engine is handed. ``updated(removed, added)`` copies it (a memory
    copy) and applies the change row by row, so the Python work is the size of the change, not
    of the table: with thousands of peers a burst of lease events costs per event, not per peer.
    Rows are in no particular order (no two share a subnet, so order cannot matter).
    """
    __slots__ = ("array", "_rows")

    def __init__(self, array: np.ndarray, rows: dict | None = None):
        self.array = array
        self._rows = rows          # (net int, prefixlen) -> row; built on first update

    @classmethod
    def of(cls, routes=()) -> "RouteArray":
        return cls(route_array(routes))

    def __len__(self) -> int:
        return len(self.array)

    def _index(self) -> tuple[np.ndarray, dict]:
        """The rows by subnet; a table built with duplicates keeps the last one, as the engines do."""
        if self._rows is None:
            arr = self.array
            rows = {key: i for i, key in enumerate(zip(arr["net"].tolist(), arr["prefixlen"].tolist()))}
            if len(rows) != len(arr):
                keep = sorted(rows.values())
                arr = arr[keep]
                rows = {key: i for i, key in enumerate(zip(arr["net"].tolist(), arr["prefixlen"].tolist()))}
            self.array, self._rows = arr, rows
        return self.array, self._rows

    def updated(self, removed=(), added=()) -> "RouteArray":
        """The table without the routes of the subnets ``removed`` (IPv4Networks; one with no route
        is ignored), then with the Routes ``added`` (replacing a route of the same subnet). Checked
        as :func:`route_array` checks a whole table: nothing is built when a route is refused."""
        add = route_array(added)
        old, rows = self._index()
        rows = dict(rows)
        n = len(old)
        arr = np.empty(n + len(add), ROUTE_DTYPE)
        arr[:n] = old
        for subnet in removed:
            row = rows.pop((int(subnet.network_address), subnet.prefixlen), None)
            if row is None:
                continue
            n -= 1
            if row != n:                   # the last row fills the hole
                arr[row] = arr[n]
                rows[(int(arr["net"][row]), int(arr["prefixlen"][row]))] = row
        for net, plen, peer, port in add.tolist():
            row = rows.setdefault((net, plen), n)
            if row == n:
                n += 1
            arr[row] = (net, plen, peer, port)
        return RouteArray(arr[:n], rows)
