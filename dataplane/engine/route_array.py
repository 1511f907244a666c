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
