"""The Python engine's IPv6 branches (dataplane/engine/pypath.py), called directly.

csrc/dataplane.h's "IPv6 inner packets" played packet by packet, as
test_pypath.py plays IPv4's: each drop reason in the header's order, no ICMPv6
error for a miss or an expired hop limit until Path.tun_addr[6] is set and then
exactly where ipv6.may_send_error allows one, the hop limit - 1 touching byte 7
only, the link-scope rule written out on 64-bit halves equal to
ipv6.is_link_scoped for any addresses, the own sources and the strict rule per
family, and every packet counted once. C against Python is
test_engine_differential.py's.
"""
from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.engine import ipv4, ipv6, pypath
from dataplane.engine.api import DROP_STATS, STAT_NAMES, Engine, Route
from dataplane.engine.pytable import RouteTable
from tests.engine_harness import with_v6_shares

TUN_ADDR = "10.5.1.0"
MTU = 1472
PEER, OTHER_PEER, V6_ONLY_PEER = ("127.0.0.16", 8285), ("127.0.0.17", 8285), ("127.0.0.18", 8286)
STRANGER = ("127.0.0.99", 8285)
ROUTES = [Route.make("10.5.2.0/24", *PEER),
          Route.make("fd00:5:2::/64", *PEER),
          Route.make("fd00:5::/32", *OTHER_PEER),
          Route.make("fd00:7::/64", *V6_ONLY_PEER)]
OWN_NET6, OWN_ADDR6 = "fd00:5:1::/64", "fd00:99::2"
KIND = {v: k for k, v in vars(pypath).items() if k.startswith("TR_")}


def new_path(accept_any=True, routes=ROUTES, tracing=False):
    pa = pypath.Path(ipaddress.IPv4Address(TUN_ADDR).packed, accept_any)
    pa.routes = RouteTable(routes)
    pa.tracing = tracing
    pypath.path_set_icmp_limit(pa, 0, 0)
    return pa


def nonzero(pa) -> dict:
    return {name: v for name, v in zip(STAT_NAMES, pa.c) if v}


def run_tun(pa, packets):
    bufs = [bytearray(max(MTU, len(p))) for p in packets]
    for b, p in zip(bufs, packets):
        b[:len(p)] = p
    hops = ["unset"] * len(packets)
    errors = list(pypath.path_tun(pa, bufs, [len(p) for p in packets], len(packets), hops))
    return bufs, hops, errors


def run_udp_batch(pa, datagrams):
    bufs = [bytearray(MTU + 1) for _ in datagrams]
    lens = []
    for b, (payload, _) in zip(bufs, datagrams):
        received = min(len(payload), MTU + 1)
        b[:received] = payload[:received]
        lens.append(received)
    out = [None] * len(datagrams)
    for j in pypath.path_udp(pa, bufs, lens, [src for _, src in datagrams], len(datagrams), MTU):
        out[j] = bytes(bufs[j][:lens[j]])
    return out


def pkt6(src="fd00:5:1::2", dst="fd00:5:2::3", **kw):
    return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 4000, 5000, b"payload!"), **kw)


def decremented(pkt) -> bytes:
    out = bytearray(pkt)
    ipv6.decrement_hop_limit(out)
    return bytes(out)


# ---- TUN -> UDP -------------------------------------------------------------------------

TUN_CASES = [
    # (what, packet, the one drop counter, or None for forwarded to the hop given)
    ("19 bytes of version 6: IPv4's length check first", b"\x60" + bytes(18), "drop_malformed"),
    ("39 bytes", pkt6()[:39], "drop_malformed"),
    ("payload length short", pkt6(payload_len=15), "drop_malformed"),
    ("payload length long", pkt6(payload_len=17), "drop_malformed"),
    ("a byte past the payload length", pkt6() + b"\0", "drop_malformed"),
    ("version 5", b"\x50" + bytes(39), "drop_not_ipv4"),
    ("malformed and link-local: the length first", pkt6(src="fe80::1", payload_len=0),
     "drop_malformed"),
    ("link-local source", pkt6(src="fe80::1"), "drop_scope"),
    ("link-local destination", pkt6(dst="fe80::2"), "drop_scope"),
    ("destination ::", pkt6(dst="::"), "drop_scope"),
    ("all-nodes multicast", pkt6(dst="ff02::1"), "drop_scope"),
    ("interface-local multicast", pkt6(dst="ff01::1"), "drop_scope"),
    ("link scope with TTL 1 and no route: scope first", pkt6(dst="ff02::16", hop_limit=1),
     "drop_scope"),
    ("no route", pkt6(dst="fd00:9::1"), "drop_no_route"),
    ("no route and hop limit 1: the route first", pkt6(dst="fd00:9::1", hop_limit=1),
     "drop_no_route"),
    ("an IPv4 route does not hold an IPv4-mapped destination", pkt6(dst="::ffff:10.5.2.3"),
     "drop_no_route"),
    ("hop limit 1", pkt6(hop_limit=1), "drop_ttl"),
    ("hop limit 0", pkt6(hop_limit=0), "drop_ttl"),
    ("hop limit 2", pkt6(hop_limit=2), PEER),
    ("the longest prefix", pkt6(dst="fd00:5:2::3"), PEER),
    ("the shorter one", pkt6(dst="fd00:5:3::3"), OTHER_PEER),
    ("empty payload", ipv6.build("fd00:5:1::2", "fd00:5:2::3"), PEER),
    ("global multicast travels", pkt6(dst="ff0e::1"), "drop_no_route"),
]


@pytest.mark.parametrize("what,pkt,outcome", TUN_CASES, ids=[c[0] for c in TUN_CASES])
def test_tun_checks_in_the_headers_order(what, pkt, outcome):
    pa = new_path()
    bufs, hops, errors = run_tun(pa, [pkt])
    assert errors == []                               # no ICMPv6 source: no error, whatever the drop
    expect = {"tun_rx_packets": 1, "tun_rx_bytes": len(pkt)}
    if isinstance(outcome, tuple):
        assert hops == [outcome] and bytes(bufs[0][:len(pkt)]) == decremented(pkt)
    else:
        expect[outcome] = 1
        assert hops == [None] and bytes(bufs[0][:len(pkt)]) == pkt      # left as read
    assert nonzero(pa) == with_v6_shares(expect, pkt)


def test_a_default_route_takes_global_multicast_but_not_link_scope():
    pa = new_path(routes=[Route.make("::/0", *PEER)])
    _, hops, _ = run_tun(pa, [pkt6(dst="ff0e::1"), pkt6(dst="ff02::1"), pkt6(dst="2001:db8::1")])
    assert hops == [PEER, None, PEER]
    assert nonzero(pa)["drop_scope"] == 1


def test_the_families_have_tables_of_their_own():
    v4_only = new_path(routes=[Route.make("0.0.0.0/0", *PEER)])
    v6_only = new_path(routes=[Route.make("::/0", *PEER)])
    v4 = ipv4.build("10.5.1.2", "10.5.2.3", ipv4.udp_payload(1, 2))
    for pa, expect in ((v4_only, [PEER, None]), (v6_only, [None, PEER])):
        _, hops, errors = run_tun(pa, [v4, pkt6()])
        assert hops == expect
        # an IPv4 miss is answered with ICMP, an IPv6 one is silent without tun_addr[6]
        assert [j for j in errors] == ([] if expect[0] else [0])


def test_trace_of_a_hit_and_a_miss():
    pa = new_path(tracing=True)
    hit, miss = pkt6(), pkt6(dst="fd00:9::1")
    run_tun(pa, [hit, miss])
    events = [(KIND[e[2]], e[3], e[4], e[5]) for e in pa.ring]
    peer = int(ipaddress.IPv4Address(PEER[0]))
    assert events == [
        ("TR_TUN_READ", len(hit), 0, 0),
        ("TR_ROUTE_HIT", 64, peer, PEER[1]),              # len: the route's prefix length
        ("TR_TUN_READ", len(miss), 0, 0),
        ("TR_ROUTE_MISS", 0, 0, 0),                       # addr 0: an IPv6 destination
        ("TR_DROP", len(miss), 0, 0),
    ]
    assert pa.ring[-1][6] == STAT_NAMES.index("drop_no_route")


# ---- UDP -> TUN -------------------------------------------------------------------------

GOOD = pkt6("fd00:5:2::7", "fd00:5:1::9")
UDP_CASES = [
    # (what, datagram, its source, strict, the one drop counter or None for forwarded)
    ("from a stranger", GOOD, STRANGER, False, "drop_bad_source"),
    ("from the peer of an IPv6 route only", pkt6("fd00:7::7", "fd00:5:1::9"), V6_ONLY_PEER,
     False, None),
    ("one byte of version 6", b"\x60", PEER, False, "drop_malformed"),
    ("39 bytes", GOOD[:39], PEER, False, "drop_malformed"),
    ("payload length short", pkt6("fd00:5:2::7", "fd00:5:1::9", payload_len=15), PEER, False,
     "drop_malformed"),
    ("trailing byte", GOOD + b"\0", PEER, False, "drop_malformed"),
    ("version 7", b"\x70" + bytes(39), PEER, False, "drop_not_ipv4"),
    ("link-local source", pkt6("fe80::7", "fd00:5:1::9"), PEER, False, "drop_scope"),
    ("neighbour solicitation's destination", pkt6("fd00:5:2::7", "ff02::1:ff00:9"), PEER,
     False, "drop_scope"),
    ("to ::", pkt6("fd00:5:2::7", "::"), PEER, False, "drop_scope"),
    ("link-local and our address: scope first", pkt6("fe80::1", "fd00:5:1::9"), PEER, False,
     "drop_scope"),
    ("inner source: our address", pkt6(OWN_ADDR6, "fd00:5:1::9"), PEER, False,
     "drop_inner_local"),
    ("inner source in our subnet, hop limit 1: local first",
     pkt6("fd00:5:1::77", "fd00:5:1::9", hop_limit=1), PEER, False, "drop_inner_local"),
    ("our IPv4 address, IPv4-mapped, is not ours in IPv6", pkt6("::ffff:192.168.50.2",
                                                             "fd00:5:1::9"), PEER, False, None),
    ("inner source another peer's, strict", pkt6("fd00:5:3::7", "fd00:5:1::9"), PEER, True,
     "drop_inner_foreign"),
    ("inner source without a route, strict", pkt6("fd00:9::7", "fd00:5:1::9"), PEER, True,
     "drop_inner_foreign"),
    ("inner source another peer's, not strict", pkt6("fd00:5:3::7", "fd00:5:1::9"), PEER,
     False, None),
    ("hop limit 1", pkt6("fd00:5:2::7", "fd00:5:1::9", hop_limit=1), PEER, False, "drop_ttl"),
    ("good, strict", GOOD, PEER, True, None),
    ("global multicast, strict", pkt6("fd00:5:2::7", "ff05::2"), PEER, True, None),
]


@pytest.mark.parametrize("what,payload,src,strict,drop", UDP_CASES, ids=[c[0] for c in UDP_CASES])
def test_udp_checks_in_the_headers_order(what, payload, src, strict, drop):
    pa = new_path(accept_any=False)
    pa.local = pypath.own_sources(
        Engine._check_local(["10.5.1.0/24", OWN_NET6], ["192.168.50.2", OWN_ADDR6, "fe80::1"]))
    pa.strict_sources = strict
    out = run_udp_batch(pa, [(payload, src)])[0]
    expect = {"udp_rx_packets": 1, "udp_rx_bytes": len(payload)}
    if drop is None:
        assert out == decremented(payload)
    else:
        expect[drop] = 1
        assert out is None
    assert nonzero(pa) == with_v6_shares(expect, payload)


def test_own_sources_per_family():
    own = pypath.own_sources(Engine._check_local(["fd00:1::/56"], ["10.0.0.1", "fd00::1"]))
    v4, v6 = own[4], own[6]
    assert v4 == (0, 0, frozenset({int(ipaddress.IPv4Address("10.0.0.1"))}))
    net = ipaddress.IPv6Network("fd00:1::/56")
    assert v6 == (int(net.network_address), int(net.netmask),
                  frozenset({int(ipaddress.IPv6Address("fd00::1"))}))
    assert pypath.own_sources(Engine._check_local([], [])) == {4: (0, 0, frozenset()),
                                                               6: (0, 0, frozenset())}


# ---- the written-out rules against ipv6.py ----------------------------------------------

EDGY = st.sampled_from([0xFE80, 0xFEBF, 0xFEC0, 0xFE7F, 0xFF00, 0xFF02, 0xFF03, 0xFF12,
                        0x0000, 0xFD00])
ADDR6 = st.one_of(st.integers(0, (1 << 128) - 1),
                  st.builds(lambda top, rest: top << 112 | rest, EDGY,
                            st.integers(0, (1 << 112) - 1)),
                  st.just(0)).map(ipaddress.IPv6Address)


@settings(max_examples=300)
@given(st.lists(st.tuples(ADDR6, ADDR6, st.integers(0, 255)), min_size=1, max_size=8))
def test_link_scope_and_hop_limit_are_ipv6_pys(headers):
    packets = [pkt6(s, d, hop_limit=h) for s, d, h in headers]
    # both directions: a default route, the sender its peer, strict on
    pa = new_path(routes=[Route.make("::/0", *PEER)])
    pa.strict_sources = True
    bufs, hops, _ = run_tun(pa, packets)
    out = run_udp_batch(pa, [(p, PEER) for p in packets])
    for p, buf, hop, got in zip(packets, bufs, hops, out):
        if ipv6.is_link_scoped(p) or p[7] <= 1:
            assert hop is None and got is None
        else:
            assert hop == PEER and bytes(buf[:len(p)]) == got == decremented(p)
    scoped = sum(ipv6.is_link_scoped(p) for p in packets)
    assert nonzero(pa).get("drop_scope", 0) == 2 * scoped


# Any bytes, and IPv6 headers with any fields after them, both ways.
DATAGRAM = st.one_of(
    st.binary(max_size=60).map(lambda b: b"\x60" + b),
    st.builds(lambda s, d, body, plen, h: ipv6.build(s, d, body, payload_len=plen, hop_limit=h),
              ADDR6, ADDR6, st.binary(max_size=24), st.integers(0, 30), st.integers(0, 3)))


@settings(max_examples=300)
@given(st.lists(DATAGRAM, min_size=1, max_size=12), st.booleans(), st.booleans())
def test_every_packet_is_counted_once(packets, strict, tracing):
    pa = new_path(accept_any=False, tracing=tracing)
    pa.local = pypath.own_sources(Engine._check_local(["fd00:5:1::/64"], []))
    pa.strict_sources = strict
    _, hops, _ = run_tun(pa, packets)
    out = run_udp_batch(pa, [(p, PEER) for p in packets])
    c = dict(zip(STAT_NAMES, pa.c))
    dropped = sum(c[name] for name in DROP_STATS)
    forwarded = (len(packets) - hops.count(None)) + (len(out) - out.count(None))
    assert dropped + forwarded == 2 * len(packets)
    assert c["tun_rx_packets"] == c["udp_rx_packets"] == len(packets)


OWN6 = ipaddress.IPv6Address("fd00:5:1::").packed


@pytest.mark.parametrize("what,pkt,outcome", TUN_CASES, ids=[c[0] for c in TUN_CASES])
def test_icmpv6_errors_where_the_header_allows(what, pkt, outcome):
    pa = new_path()
    pa.tun_addr = {**pa.tun_addr, 6: OWN6}
    _, _, errors = run_tun(pa, [pkt])
    counted = nonzero(pa)
    if outcome in ("drop_no_route", "drop_ttl") and ipv6.may_send_error(pkt):
        type_ = ipv6.ICMPV6_DEST_UNREACH if outcome == "drop_no_route" else \
            ipv6.ICMPV6_TIME_EXCEEDED
        assert errors == [0] and pa.icmp == ipv6.icmp_error(pkt, type_, 0, OWN6)
        pypath.path_icmp_written(pa, 0)
        sent = "icmp_unreach_sent" if outcome == "drop_no_route" else "icmp_ttl_sent"
        assert nonzero(pa) == {**counted, **with_v6_shares({sent: 1}, pa.icmp)}
    else:
        assert errors == []


def test_icmpv6_and_icmp_share_the_rate_limit():
    pa = new_path(routes=[])
    pa.tun_addr = {**pa.tun_addr, 6: OWN6}
    pypath.path_set_icmp_limit(pa, 1, 2)
    v4 = ipv4.build("10.5.1.2", "10.5.2.3", ipv4.udp_payload(1, 2))
    _, _, errors = run_tun(pa, [pkt6(), v4, pkt6(), v4])
    assert errors == [0, 1] and nonzero(pa)["icmp_ratelimited"] == 2


@given(st.binary(min_size=0, max_size=120), st.sampled_from([0, 43, 44, 50, 51, 58, 60, 17]))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_the_error_is_well_formed_for_any_payload(payload, nh):
    pkt = ipv6.build("fd00:5:1::2", "fd00:9::1", payload, next_header=nh)
    err = ipv6.icmp_error(pkt, ipv6.ICMPV6_DEST_UNREACH, 0, OWN6)
    assert len(err) == 48 + len(pkt) and err[48:] == pkt and err[24:40] == pkt[8:24]
    pseudo = err[8:40] + (len(err) - 40).to_bytes(4, "big") + bytes([0, 0, 0, 58])
    assert ipv4.checksum(pseudo + err[40:]) == 0
