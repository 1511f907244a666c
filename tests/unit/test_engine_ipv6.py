"""Inner IPv6 over the IPv4 underlay, both engines (dataplane.h, "IPv6 inner packets").

A packet to an IPv6 subnet goes to the route's IPv4 peer with the hop limit - 1 and every other
byte as read; a datagram carrying IPv6 is written to the TUN the same way. Longest prefix wins
in the IPv6 table as in the IPv4 one, the two tables are published together, the source checks
(own sources, --strict-sources) hold for IPv6, and a miss or an expired hop limit is dropped
without an ICMPv6 error while the engine has no IPv6 source address (set_tun_addr; the errors
themselves are test_engine_icmp6.py's).
"""
import ipaddress

import pytest

from dataplane.daemon.metrics import MetricsSource, make_registry
from dataplane.engine import ipv4
from tests.engine_harness import Harness, expect_only

MTU = 1472
OWN6 = "fc00:5:0:1::/64"          # this host's IPv6 lease part
A6, B6 = "fc00:5:0:2::/64", "fc00:5:0:3::/64"
WIDE6 = "fc00:5::/48"             # a shorter prefix over A6 and B6


def v6(src, dst, payload=b"p" * 24, nh=17, hop=64, tc=0xA5, flow=0x12345):
    """An IPv6 packet; traffic class and flow label set, so that a change to them shows."""
    first = (6 << 28 | tc << 20 | flow).to_bytes(4, "big")
    return (first + len(payload).to_bytes(2, "big") + bytes([nh, hop])
            + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed + payload)


def assert_hop_decremented(original: bytes, out: bytes) -> None:
    assert len(out) == len(original)
    assert out[7] == original[7] - 1
    assert out[:7] == original[:7] and out[8:] == original[8:], "only the hop limit may change"


@pytest.fixture
def h(engine_kind):
    with Harness(engine_kind, mtu=MTU) as h:
        a, b = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", a), h.route(A6, a), h.route(B6, b)])
        yield h


def test_tun_to_udp_goes_to_the_peer_of_the_ipv6_subnet(h):
    a, b = h.peers
    to_a = [v6("fc00:5:0:1::9", f"fc00:5:0:2::{i}", hop=64 - i) for i in range(1, 4)]
    to_b = v6("fc00:5:0:1::9", "fc00:5:0:3:ffff:ffff:ffff:ffff", nh=6, hop=2)
    h.inject_tun(*to_a, to_b)
    st = h.settle()
    assert len(a.received) == 3 and len(b.received) == 1
    for sent, got in zip(to_a + [to_b], a.received + b.received):
        assert_hop_decremented(sent, got)
    n = sum(map(len, to_a)) + len(to_b)
    expect_only(st, tun_rx_packets=4, tun_rx_bytes=n, udp_tx_packets=4, udp_tx_bytes=n)


def test_udp_to_tun_writes_ipv6_with_the_hop_limit_decremented(h):
    a, _ = h.peers
    pkts = [v6("fc00:5:0:2::7", "fc00:5:0:1::9", payload=bytes([i]) * (40 + i), hop=2 + i)
            for i in range(3)]
    h.inject_udp(a, *pkts)
    st = h.settle()
    assert len(h.tun_received) == 3
    for sent, got in zip(pkts, h.tun_received):
        assert_hop_decremented(sent, got)
    n = sum(map(len, pkts))
    expect_only(st, udp_rx_packets=3, udp_rx_bytes=n, tun_tx_packets=3, tun_tx_bytes=n)


def test_families_mixed_in_one_batch_keep_their_order(h):
    a, _ = h.peers
    four = ipv4.build("10.5.1.2", "10.5.2.3", b"four")
    six = v6("fc00:5:0:1::2", "fc00:5:0:2::3")
    h.inject_tun(four, six, four, six)
    h.settle()
    assert [p[0] >> 4 for p in a.received] == [4, 6, 4, 6]
    h.inject_udp(a, six, four, six)
    h.settle()
    assert [p[0] >> 4 for p in h.tun_received] == [6, 4, 6]


def test_longest_prefix_wins_and_tables_are_published_together(engine_kind):
    with Harness(engine_kind, mtu=MTU) as h:
        a, b, c = h.add_peer(), h.add_peer(), h.add_peer()
        h.set_routes([h.route(WIDE6, c), h.route(A6, a), h.route("fc00:5:0:2:8000::/65", b),
                      h.route("10.5.2.0/24", c)])
        h.inject_tun(v6("fc00:5:0:1::9", "fc00:5:0:2::1"),            # /64: a
                     v6("fc00:5:0:1::9", "fc00:5:0:2:8000::1"),       # /65: b
                     v6("fc00:5:0:1::9", "fc00:5:0:7::1"),            # /48: c
                     v6("fc00:5:0:1::9", "fc00:6::1"))                # nothing: dropped
        st = h.settle()
        assert [len(p.received) for p in (a, b, c)] == [1, 1, 1]
        assert st["drop_no_route"] == 1 and st["icmp_unreach_sent"] == 0
        assert h.tun_received == [], "no ICMPv6 error without set_tun_addr"
        # One swap replaces both families: the IPv6 routes go with an IPv4-only table.
        h.set_routes([h.route("10.5.2.0/24", a)])
        h.inject_tun(v6("fc00:5:0:1::9", "fc00:5:0:2::1"), ipv4.build("10.5.1.2", "10.5.2.3", b"x"))
        st = h.settle()
        assert st["drop_no_route"] == 2 and len(a.received) == 2 and st["route_swaps"] == 2


def test_expired_hop_limit_is_dropped_without_an_error_before_set_tun_addr(h):
    a, _ = h.peers
    h.inject_tun(v6("fc00:5:0:1::9", "fc00:5:0:2::1", hop=1),
                 v6("fc00:5:0:1::9", "fc00:5:0:2::1", nh=58, payload=bytes([128, 0]) + bytes(6),
                    hop=0))
    st = h.settle()
    expect_only(st, tun_rx_packets=2, tun_rx_bytes=st["tun_rx_bytes"], drop_ttl=2)
    assert a.received == [] and h.tun_received == []
    h.engine.set_tun_addr("fc00:5:0:1::")
    h.inject_tun(v6("fc00:5:0:1::9", "fc00:5:0:2::1", hop=1))
    st = h.settle()
    assert st["icmp_ttl_sent"] == 1 and h.tun_received[0][40] == 3 and a.received == []


def test_the_kernels_own_link_traffic_on_flannel0_is_dropped_as_scope(h):
    # What a TUN with IPv6 on sends by itself: router solicitations, MLD reports, DAD.
    rs = v6("fe80::1", "ff02::2", nh=58, payload=bytes([133, 0, 0, 0]) + bytes(4), hop=255)
    mld = v6("fe80::1", "ff02::16", nh=0, payload=bytes(32), hop=1)
    dad = v6("::", "ff02::1:ff00:1", nh=58, payload=bytes([135]) + bytes(23), hop=255)
    h.inject_tun(rs, mld, dad)
    st = h.settle()
    expect_only(st, tun_rx_packets=3, tun_rx_bytes=len(rs) + len(mld) + len(dad), drop_scope=3)
    assert all(not p.received for p in h.peers)


def test_a_peer_cannot_make_the_host_take_neighbour_discovery(h):
    a, _ = h.peers
    na = v6("fe80::66", "ff02::1", nh=58, payload=bytes([136]) + bytes(23), hop=255)
    redirect = v6("fe80::66", "fc00:5:0:1::9", nh=58, payload=bytes([137]) + bytes(39), hop=255)
    h.inject_udp(a, na, redirect)
    st = h.settle()
    expect_only(st, udp_rx_packets=2, udp_rx_bytes=len(na) + len(redirect), drop_scope=2)
    assert h.tun_received == []


@pytest.mark.parametrize("strict", [False, True])
def test_own_ipv6_sources_and_the_strict_rule(engine_kind, strict):
    with Harness(engine_kind, mtu=MTU, accept_any=False) as h:
        a, b = h.add_peer(), h.add_peer()
        h.set_routes([h.route(A6, a), h.route(B6, b), h.route("10.5.2.0/24", a)])
        h.engine.set_local([OWN6, "10.5.1.0/24"], ["192.168.50.2", "fd77::2"])
        h.engine.set_strict_sources(strict)
        own_subnet = v6("fc00:5:0:1::9", "fc00:5:0:1::2")       # claims to be one of ours
        own_addr = v6("fd77::2", "fc00:5:0:1::2")               # the host's own address
        from_b = v6("fc00:5:0:3::4", "fc00:5:0:1::2")           # b's pod, sent by a
        from_a = v6("fc00:5:0:2::4", "fc00:5:0:1::2")           # a's own pod
        elsewhere = v6("fd99::1", "fc00:5:0:1::2")               # routed to nobody
        h.inject_udp(a, own_subnet, own_addr, from_b, from_a, elsewhere)
        st = h.settle()
        got = [ipaddress.IPv6Address(p[8:24]) for p in h.tun_received]
        if strict:
            assert got == [ipaddress.IPv6Address("fc00:5:0:2::4")]
            assert st["drop_inner_foreign"] == 2
        else:
            assert len(got) == 3 and st["drop_inner_foreign"] == 0
        assert st["drop_inner_local"] == 2
        # The own sources replaced as a whole, the IPv6 part too.
        h.engine.set_local(["10.5.1.0/24"], [])
        h.inject_udp(a, own_subnet)
        assert h.settle()["drop_inner_local"] == 2


def test_ipv6_routes_peers_are_peers_for_the_source_check(engine_kind):
    with Harness(engine_kind, mtu=MTU, accept_any=False) as h:
        a, b = h.add_peer(), h.add_peer()
        h.set_routes([h.route(A6, a)])                          # a holds an IPv6 subnet only
        h.inject_udp(a, v6("fc00:5:0:2::4", "fc00:5:0:1::2"))
        h.inject_udp(b, v6("fc00:5:0:2::4", "fc00:5:0:1::2"))
        st = h.settle()
        assert st["tun_tx_packets"] == 1 and st["drop_bad_source"] == 1


@pytest.mark.parametrize("bad", [
    "fc00:5:0:1::/0",
    "fc00:5:0:1::1/64",                                        # host bits
    "10.5.2.0/24",                                             # a second of one family
])
def test_set_local_refuses_alike(engine_kind, bad):
    with Harness(engine_kind, mtu=MTU) as h:
        with pytest.raises(ValueError):
            h.engine.set_local(["10.5.1.0/24", bad], [])


def test_trace_of_an_ipv6_packet(engine_kind):
    with Harness(engine_kind, mtu=MTU) as h:
        a = h.add_peer()
        h.set_routes([h.route(A6, a)])
        h.engine.trace(True)
        h.inject_tun(v6("fc00:5:0:1::9", "fc00:5:0:2::1"), v6("fc00:5:0:1::9", "fc00:9::1"))
        h.settle()
        ev = h.engine.trace_events()
        kinds = [e["kind"] for e in ev]
        assert kinds[:3] == ["tun_read", "route_hit", "udp_send"] or \
            kinds[:2] == ["tun_read", "route_hit"]
        hit = next(e for e in ev if e["kind"] == "route_hit")
        assert (hit["addr"], hit["len"]) == (a.ip, 64)
        miss = next(e for e in ev if e["kind"] == "route_miss")
        assert miss["addr"] == "0.0.0.0"


class _Counters(MetricsSource):
    """/metrics over one engine's counters, as the daemon's source reads them."""

    def __init__(self, engine):
        self.engine = engine

    def engine_stats(self):
        return self.engine.stats()


def test_each_family_counts_in_its_share_and_metrics_split_by_it(h):
    """dataplane.h "Counters by family": IPv6's packets count in the v6_ shares of the counters
    they count in, IPv4's in none; /metrics serves ipv6 = the share, ipv4 = the rest."""
    a, _ = h.peers
    h.engine.set_tun_addr("fc00:5:0:1::")
    four = ipv4.build("10.5.1.2", "10.5.2.3", b"four")
    six = v6("fc00:5:0:1::9", "fc00:5:0:2::1")
    h.inject_tun(four, four, six,
                 ipv4.build("10.5.1.2", "10.9.0.1", b"x"),        # no route: ICMP, IPv4
                 v6("fc00:5:0:1::9", "fc00:9::1"),                # no route: ICMPv6
                 v6("fc00:5:0:1::9", "fc00:5:0:2::1", hop=1),     # hop limit: ICMPv6
                 six[:10])                                        # version 6, malformed
    h.inject_udp(a, ipv4.build("10.5.2.3", "10.5.1.2", b"in"),
                 v6("fc00:5:0:2::7", "fc00:5:0:1::9", payload=b"q" * 50),
                 v6("fc00:5:0:2::7", "fc00:5:0:1::9", hop=1))     # hop limit on arrival
    st = h.settle()
    n6 = len(six)
    # one datagram and one ICMP error of IPv4, one datagram and two errors of IPv6
    assert sorted(p[0] >> 4 for p in h.tun_received) == [4, 4, 6, 6, 6]
    udp_in = [len(four) + 2 - 4, n6 + 26]       # "in" and 50 bytes of payload
    expect_only(
        st, tun_rx_packets=7, tun_rx_bytes=2 * len(four) + 3 * n6 + 21 + 10,
        udp_tx_packets=3, udp_tx_bytes=2 * len(four) + n6,
        udp_rx_packets=3, udp_rx_bytes=sum(udp_in) + n6,
        tun_tx_packets=2, tun_tx_bytes=sum(udp_in),
        drop_no_route=2, drop_ttl=2, drop_malformed=1,
        icmp_unreach_sent=2, icmp_ttl_sent=1,
        v6_tun_rx_packets=4, v6_tun_rx_bytes=3 * n6 + 10,
        v6_udp_tx_packets=1, v6_udp_tx_bytes=n6,
        v6_udp_rx_packets=2, v6_udp_rx_bytes=udp_in[1] + n6,
        v6_tun_tx_packets=1, v6_tun_tx_bytes=udp_in[1],
        v6_drop_no_route=1, v6_drop_ttl=2, v6_drop_malformed=1,
        v6_icmp_unreach_sent=1, v6_icmp_ttl_sent=1)

    reg = make_registry(_Counters(h.engine), standard=False)

    def served(family, **labels):
        dp = {} if "icmp" in family else {"datapath": "engine"}
        return {fam: reg.get_sample_value(family, dict(labels, family=fam, queue="0", **dp))
                for fam in ("ipv4", "ipv6")}
    assert served("flannel_udp_packets_total", path="tun_rx") == {"ipv4": 3, "ipv6": 4}
    assert served("flannel_udp_bytes_total", path="udp_tx") == {"ipv4": 2 * len(four),
                                                                "ipv6": n6}
    assert served("flannel_udp_packets_total", path="tun_tx") == {"ipv4": 1, "ipv6": 1}
    assert served("flannel_udp_drops_total", reason="ttl") == {"ipv4": 0, "ipv6": 2}
    assert served("flannel_udp_icmp_sent_total", type="net_unreachable") == {"ipv4": 1,
                                                                            "ipv6": 1}
    assert served("flannel_udp_drops_total", reason="scope") == {"ipv4": None, "ipv6": 0}
