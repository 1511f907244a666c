"""route_arrays: the one check and layout of a route table, of both families, for both engines."""
from __future__ import annotations

import ipaddress
import struct

import pytest

from dataplane.engine import Route
from dataplane.engine.route_array import ROUTE6_LAYOUT, ROUTE_LAYOUT, route_arrays
from tests.conftest import require_engine
from tests.engine_harness import Harness


def test_bytes_are_dp_route_layout():
    routes = [Route.make("10.5.2.0/24", "192.168.77.2", 8285), Route.make("0.0.0.0/0", "127.0.0.9", 1)]
    want = b"".join(struct.pack("=4sI4sI", r.subnet.network_address.packed, r.subnet.prefixlen,
                                r.peer_ip.packed, r.port) for r in routes)
    assert route_arrays(routes)[0].tobytes() == want
    assert route_arrays(iter(routes))[0].tobytes() == want
    assert len(route_arrays(routes)[1]) == 0
    for arr, layout in zip(route_arrays([]), (ROUTE_LAYOUT, ROUTE6_LAYOUT)):
        assert len(arr) == 0 and arr.tobytes() == b"" and arr.layout is layout


def test_ipv6_bytes_are_dp_route6_layout_with_the_peer_ipv4_mapped():
    routes = [Route.make("fc00:66:0:5d::/64", "192.168.77.2", 8285),
              Route.make("10.5.2.0/24", "192.168.77.3", 8285),
              Route.make("::/0", "127.0.0.9", 1)]
    v6 = [r for r in routes if r.subnet.version == 6]
    want = b"".join(r.subnet.network_address.packed + bytes(10) + b"\xff\xff" + r.peer_ip.packed +
                    struct.pack("=IIII", r.subnet.prefixlen, r.port, 0, 0) for r in v6)
    arr, arr6 = route_arrays(routes)
    assert arr6.tobytes() == want and len(arr) == 1


def test_ipv6_peers_and_mtus_are_dp_route6_layout():
    routes = [Route.make("fc00:66:0:5d::/64", "2001:db8::7", 8285, mtu=1452),
              Route.make("fc00:66:0:5e::/64", "::ffff:192.168.77.2", 8286, 1472),
              Route.make("fc00:66:0:5f::/64", "192.168.77.3", 8287)]
    assert routes[1].peer_ip == ipaddress.IPv4Address("192.168.77.2")    # mapped is IPv4
    want = b"".join(struct.pack("=16s16sIIII", r.subnet.network_address.packed,
                                (r.peer_ip.packed if r.peer_ip.version == 6 else
                                 bytes(10) + b"\xff\xff" + r.peer_ip.packed),
                                r.subnet.prefixlen, r.port, r.mtu, 0) for r in routes)
    assert route_arrays(routes)[1].tobytes() == want


V6NET = ipaddress.IPv6Network("fd00::/64")


@pytest.mark.parametrize("bad, why", [
    (Route(NET := ipaddress.IPv4Network("10.5.3.0/24"), ipaddress.IPv6Address("fd00::1"), 8285),
     "an IPv4 subnet takes an IPv4 peer"),
    (Route(NET, ipaddress.IPv4Address("127.0.0.2"), 8285, 1400), "an IPv4 subnet takes"),
    (Route(V6NET, ipaddress.IPv6Address("fd00::1"), 8285, 1279), "mtu 0 or 1280"),
    (Route(V6NET, ipaddress.IPv6Address("fd00::1"), 8285, 65536), "mtu 0 or 1280"),
    (Route(V6NET, ipaddress.IPv6Address("::"), 8285), "neither ::"),
    (Route(V6NET, ipaddress.IPv6Address("fe80::1"), 8285), "link-local"),
    (Route(V6NET, ipaddress.IPv6Address("ff05::1"), 8285), "multicast"),
])
def test_what_the_header_forbids_of_a_route6_is_a_value_error(bad, why):
    with pytest.raises(ValueError, match=why):
        route_arrays([Route.make("10.5.2.0/24", "127.0.0.2", 8285), bad])


def test_route_make_refuses_an_ipv6_peer_or_an_mtu_for_an_ipv4_subnet():
    with pytest.raises(ValueError, match="an IPv4 subnet"):
        Route.make("10.5.3.0/24", "fd00::1", 8285)
    with pytest.raises(ValueError, match="an IPv4 subnet"):
        Route.make("10.5.3.0/24", "127.0.0.2", 8285, mtu=1400)
    assert Route.make("10.5.3.0/24", "::ffff:127.0.0.2", 8285).peer_ip.version == 4


@pytest.mark.parametrize("struct_name, layout", [("dp_route", ROUTE_LAYOUT),
                                                 ("dp_route6", ROUTE6_LAYOUT)])
def test_layout_matches_the_header(struct_name, layout):
    require_engine("c")
    from dataplane._dataplane_c import ffi
    assert layout.itemsize == ffi.sizeof(struct_name)
    assert [(n, layout.offset(n)) for n in layout.names] == \
        [(n, ffi.offsetof(struct_name, n)) for n, _ in ffi.typeof(struct_name).fields]
    assert all(struct.calcsize(f) == ffi.sizeof(ffi.typeof(struct_name).fields[i][1].type)
               for i, (_, _, f) in enumerate(layout.fields))


@pytest.mark.parametrize("port", [0, -1, 65536, 2 ** 70, -2 ** 70])
def test_port_out_of_range_names_the_route(port):
    bad = Route.make("10.5.3.0/24", "127.0.0.3", port)
    with pytest.raises(ValueError, match=r"10\.5\.3\.0/24.*port out of range"):
        route_arrays([Route.make("10.5.2.0/24", "127.0.0.2", 8285), bad])


NET, PEER = ipaddress.IPv4Network("10.5.3.0/24"), ipaddress.IPv4Address("127.0.0.2")


@pytest.mark.parametrize("bad", [
    Route("10.5.3.0/24", PEER, 8285),                       # str subnet, not built by Route.make
    Route(NET, "127.0.0.2", 8285),
    Route(NET, PEER, 8285.0),
    Route(NET, PEER, "8285"),
    Route(ipaddress.IPv6Network("fd00::/64"), PEER, 8285.0),
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


def test_python_table_of_both_families():
    from dataplane.engine.pytable import RouteTable
    t = RouteTable([Route.make("fc00:66:0:5d::/64", "127.0.0.2", 8285),
                    Route.make("fc00:66::/56", "127.0.0.4", 8285),
                    Route.make("10.5.2.0/24", "127.0.0.3", 9)])
    assert t.lookup6(int(ipaddress.IPv6Address("fc00:66:0:5d::7"))) == (("127.0.0.2", 8285), 64)
    assert t.lookup6(int(ipaddress.IPv6Address("fc00:66:0:5e::7"))) == (("127.0.0.4", 8285), 56)
    assert t.lookup6(int(ipaddress.IPv6Address("fc00:67::7"))) is None
    assert t.lookup_addr("10.5.2.7") == (("127.0.0.3", 9), 24)
    assert t.peers == {"127.0.0.2", "127.0.0.3", "127.0.0.4"} and len(t) == 3


def test_a_start_imports_no_numpy():
    """The daemon, its engines' tables and the kernel path's route maps pack without numpy, whose
    import was ~0.1 s of every start before READY (perf/README.md#no-numpy)."""
    import subprocess
    import sys
    code = ("import sys, dataplane.cli.run, dataplane.daemon.main, dataplane.engine.pytable, "
            "dataplane.engine.route_array, dataplane.engine.bpf_routes, dataplane.engine.kernel_engine, "
            "dataplane.daemon.early_load, dataplane.daemon.kernel_path, dataplane.engine.choice\n"
            "from dataplane.engine import Route\n"
            "from dataplane.engine.route_array import RouteArray\n"
            "from dataplane.engine.pytable import RouteTable\n"
            "r = [Route.make('10.5.2.0/24', '192.0.2.7', 8285)]\n"
            "RouteArray.of(r).updated([], r); RouteTable.of(r).updated([], r)\n"
            "print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.strip() == "False"
