"""route_array: the one check and layout of a route table for both engines."""
from __future__ import annotations

import ipaddress
import struct

import pytest

from dataplane.engine import Route
from dataplane.engine.route_array import ROUTE_DTYPE, route_array
from tests.conftest import require_engine
from tests.engine_harness import Harness


def test_bytes_are_dp_route_layout():
    routes = [Route.make("10.5.2.0/24", "192.168.77.2", 8285), Route.make("0.0.0.0/0", "127.0.0.9", 1)]
    want = b"".join(struct.pack("=4sI4sI", r.subnet.network_address.packed, r.subnet.prefixlen,
                                r.peer_ip.packed, r.port) for r in routes)
    assert route_array(routes).tobytes() == want
    assert route_array(iter(routes)).tobytes() == want
    assert route_array([]).shape == (0,) and route_array([]).dtype == ROUTE_DTYPE


def test_dtype_matches_the_header():
    require_engine("c")
    from dataplane._dataplane_c import ffi
    assert ROUTE_DTYPE.itemsize == ffi.sizeof("dp_route")
    assert [(n, ROUTE_DTYPE.fields[n][1]) for n in ROUTE_DTYPE.names] == \
        [(n, ffi.offsetof("dp_route", n)) for n, _ in ffi.typeof("dp_route").fields]


@pytest.mark.parametrize("port", [0, -1, 65536, 2 ** 70, -2 ** 70])
def test_port_out_of_range_names_the_route(port):
    bad = Route.make("10.5.3.0/24", "127.0.0.3", port)
    with pytest.raises(ValueError, match=r"10\.5\.3\.0/24.*port out of range"):
        route_array([Route.make("10.5.2.0/24", "127.0.0.2", 8285), bad])


NET, PEER = ipaddress.IPv4Network("10.5.3.0/24"), ipaddress.IPv4Address("127.0.0.2")


@pytest.mark.parametrize("bad", [
    Route("10.5.3.0/24", PEER, 8285),                       # str subnet, not built by Route.make
    Route(NET, "127.0.0.2", 8285),
    Route(NET, PEER, 8285.0),
    Route(NET, PEER, "8285"),
    Route(ipaddress.IPv6Network("fd00::/64"), PEER, 8285),
])
def test_both_engines_refuse_the_same_malformed_routes(engine_kind, bad):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        with pytest.raises(TypeError):
            h.engine.set_routes([bad])
        assert h.engine.stats()["route_swaps"] == 1


def test_python_table_from_the_array():
    from dataplane.engine.pytable import RouteTable
    t = RouteTable([Route.make("10.5.2.0/24", "127.0.0.2", 8285),
                    Route.make("10.5.3.0/24", "127.0.0.2", 8286),
                    Route.make("10.5.2.0/24", "127.0.0.3", 9)])     # duplicate: last wins
    assert t.lookup_addr("10.5.2.7") == (("127.0.0.3", 9), 24)
    assert t.lookup_addr("10.5.3.7") == (("127.0.0.2", 8286), 24)
    assert t.peers == {"127.0.0.2", "127.0.0.3"}
    assert all(isinstance(peer, str) and isinstance(port, int) and type(net) is int
               for _, _, nets in t.lens for net, (peer, port) in nets.items())
