"""Route tables: the Python table against a naive oracle, and the route
behaviour both engines share (validation, longest prefix, duplicates,
route_swaps)."""
import ipaddress
import random
import time

import pytest

from dataplane.engine import ipv4
from dataplane.engine import Route
from dataplane.engine.pytable import RouteTable
from tests.engine_harness import Harness, expect_only


def naive_lookup(routes, dst):
    """The obviously right answer: the longest matching prefix, the last
    route given for a duplicated subnet."""
    best = None
    d = ipaddress.IPv4Address(dst)
    for r in routes:
        if d in r.subnet and (best is None or r.subnet.prefixlen >= best.subnet.prefixlen):
            best = r
    return best


def random_table(rnd, n, peers, lens=(8, 16, 20, 24, 24, 24, 28, 32)):
    routes = []
    for _ in range(n):
        plen = rnd.choice(lens)
        net = ipaddress.IPv4Network((rnd.getrandbits(32) & (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
                                     if plen else 0, plen))
        # bias towards 10/8 so that prefixes nest
        if rnd.random() < 0.7 and plen >= 8:
            net = ipaddress.IPv4Network(((10 << 24) | (int(net.network_address) & 0xFFFFFF), plen))
        routes.append(Route(net, ipaddress.IPv4Address(rnd.choice(peers)), rnd.randrange(1, 65536)))
    return routes


def random_dst(rnd, routes):
    if rnd.random() < 0.7 and routes:
        r = rnd.choice(routes)
        return str(r.subnet[rnd.randrange(r.subnet.num_addresses)])
    return str(ipaddress.IPv4Address((10 << 24) | rnd.getrandbits(24) if rnd.random() < 0.5
                                     else rnd.getrandbits(32)))


def test_pytable_matches_naive_lookup():
    rnd = random.Random(5)
    for trial in range(30):
        routes = random_table(rnd, rnd.randrange(0, 60), ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
        if trial % 5 == 0:
            routes.append(Route.make("0.0.0.0/0", "127.0.0.9", 9))
        t = RouteTable(routes)
        for _ in range(300):
            dst = random_dst(rnd, routes)
            want = naive_lookup(routes, dst)
            got = t.lookup_addr(dst)
            if want is None:
                assert got is None, dst
            else:
                assert got == ((str(want.peer_ip), want.port), want.subnet.prefixlen), dst


def test_pytable_structure():
    t = RouteTable([Route.make("10.5.2.0/24", "127.0.0.2", 8285),
                    Route.make("10.5.2.0/24", "127.0.0.3", 8286),      # duplicate: last wins
                    Route.make("10.0.0.0/8", "127.0.0.4", 8285),
                    Route.make("10.5.2.9/32", "127.0.0.4", 8285)])
    assert [plen for _, plen, _ in t.lens] == [32, 24, 8]
    assert t.lookup_addr("10.5.2.1") == (("127.0.0.3", 8286), 24)
    assert t.peers == frozenset({"127.0.0.3", "127.0.0.2", "127.0.0.4"})
    assert len(t) == 4
    assert RouteTable().lookup_addr("1.2.3.4") is None


def test_pytable_builds_10000_routes():
    # What the build costs in time is measured by perf/route_publish.py.
    routes = [Route.make(f"10.{i // 256}.{i % 256}.0/24", "127.0.0.2", 8285) for i in range(10000)]
    t = RouteTable(routes)
    assert len(t) == 10000 and [plen for _, plen, _ in t.lens] == [24]
    assert t.lookup_addr("10.39.15.77") == (("127.0.0.2", 8285), 24)


@pytest.mark.parametrize("bad,exc", [
    ("not a route", TypeError),
    (("10.5.0.0/16", "127.0.0.2", 8285), TypeError),
    (Route.make("10.5.0.0/16", "127.0.0.2", 0), ValueError),
    (Route.make("10.5.0.0/16", "127.0.0.2", 65536), ValueError),
])
def test_set_routes_rejects_bad_input_and_keeps_the_old_table(engine_kind, bad, exc):
    with Harness(engine_kind) as h:
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        with pytest.raises(exc):
            h.engine.set_routes([h.route("10.5.3.0/24", p), bad])
        h.inject_tun(ipv4.build("10.5.1.2", "10.5.2.3", b"a"), ipv4.build("10.5.1.2", "10.5.3.3", b"b"))
        st = h.settle()
        assert st["route_swaps"] == 1 and st["udp_tx_packets"] == 1 and st["drop_no_route"] == 1


def test_host_bits_are_rejected_before_the_engine():
    with pytest.raises(ValueError):
        Route.make("10.5.2.1/24", "127.0.0.2", 8285)


def test_route_swaps_counting(engine_kind):
    with Harness(engine_kind, start=False) as h:
        p = h.add_peer()
        h.engine.set_routes([h.route("10.5.2.0/24", p)])
        h.engine.set_routes([h.route("10.5.3.0/24", p)])   # both before start: one adopted
        assert h.stats()["route_swaps"] == 0
        h.engine.start()
        h.wait_for(lambda st: st["route_swaps"] == 1, what="adopted at start")
        h.inject_tun(ipv4.build("10.5.1.2", "10.5.2.3", b"old"),
                     ipv4.build("10.5.1.2", "10.5.3.3", b"new"))
        st = h.settle()
        assert st["udp_tx_packets"] == 1 and st["drop_no_route"] == 1   # the newest table won
        h.engine.set_routes([])
        h.wait_for(lambda st: st["route_swaps"] == 2, what="empty table adopted")
        h.engine.set_routes([])
        h.wait_for(lambda st: st["route_swaps"] == 3, what="same content, new table")
        time.sleep(0.05)                 # no event to wait for: time for a stray swap to show
        assert h.stats()["route_swaps"] == 3


def test_no_table_no_swap(engine_kind):
    with Harness(engine_kind) as h:
        h.inject_tun(ipv4.build("10.5.1.2", "10.5.2.3", b"x"))
        st = h.settle()
        expect_only(st, tun_rx_packets=1, tun_rx_bytes=21, drop_no_route=1, icmp_unreach_sent=1)
        assert st["route_swaps"] == 0


def test_duplicates_keep_the_last_and_default_route(engine_kind):
    with Harness(engine_kind) as h:
        a, b, d = h.add_peer(), h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", a), h.route("10.5.2.0/24", b),
                      h.route("0.0.0.0/0", d)])
        h.inject_tun(ipv4.build("10.5.1.2", "10.5.2.3", b"x"),
                     ipv4.build("10.5.1.2", "8.8.8.8", b"y"))
        st = h.settle()
        assert (len(a.received), len(b.received), len(d.received)) == (0, 1, 1)
        assert st["drop_no_route"] == 0


def test_random_tables_route_like_the_naive_oracle(engine_kind):
    rnd = random.Random(6)
    with Harness(engine_kind) as h:
        peers = [h.add_peer() for _ in range(4)]
        by_addr = {p.addr: p for p in peers}
        for trial in range(3):
            spec = random_table(rnd, 200, [p.ip for p in peers])
            # the same table with the real peers' ports
            port_of = {p.ip: p.port for p in peers}
            routes = [Route(r.subnet, r.peer_ip, port_of[str(r.peer_ip)]) for r in spec]
            h.set_routes(routes)
            start = {p.addr: len(p.received) for p in peers}
            dropped_before = h.stats()["drop_no_route"]
            expected = {p.addr: [] for p in peers}
            misses = 0
            for j in range(300):
                dst = random_dst(rnd, routes)
                pkt = ipv4.build("10.99.0.1", dst, j.to_bytes(2, "big"), ident=j)
                want = naive_lookup(routes, dst)
                if want is None:
                    misses += 1
                else:
                    expected[(str(want.peer_ip), want.port)].append(j)
                h.inject_tun(pkt)
            st = h.settle()
            for addr, want in expected.items():
                got = by_addr[addr].received[start[addr]:]
                assert [int.from_bytes(x[20:22], "big") for x in got] == want
            assert st["drop_no_route"] - dropped_before == misses
        st = h.stats()
        assert st["route_swaps"] == 3
