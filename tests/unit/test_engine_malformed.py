"""Malformed input from both sides, for both engines: every packet is counted
in exactly one drop counter (the first check of dataplane.h it fails) and
in nothing else but the rx counters."""
import ipaddress

import pytest

from dataplane.engine import ipv4
from tests.engine_harness import Harness, expect_only

MTU = 1472


def good(ttl=64, payload=b"p" * 16, **kw):
    return ipv4.build("10.5.2.3", "10.5.1.2", payload, ttl=ttl, **kw)


def ipv6_packet(n_payload=8, src="fc00:5:0:2::3", dst="fc00:5:0:1::2", hop=64, plen=None):
    """Version 6, next header UDP; ``plen``: the payload length field if not the true one."""
    return (bytes([0x60, 0, 0, 0]) + (n_payload if plen is None else plen).to_bytes(2, "big")
            + bytes([17, hop]) + ipaddress.IPv6Address(src).packed
            + ipaddress.IPv6Address(dst).packed + bytes(n_payload))


def with_byte(p, i, v):
    b = bytearray(p)
    b[i] = v
    return bytes(b)


# (name, bytes, drop counter) shared by both directions; the direction
# specific differences are in the tables below.
COMMON = [
    ("len19", good()[:19], "drop_malformed"),
    ("len1-v4", b"\x45", "drop_malformed"),
    ("version0", with_byte(good(), 0, 0x05), "drop_not_ipv4"),
    ("version15", with_byte(good(), 0, 0xF5), "drop_not_ipv4"),
    ("ihl0", with_byte(good(), 0, 0x40), "drop_malformed"),
    ("ihl4", with_byte(good(), 0, 0x44), "drop_malformed"),
    ("ihl15-len36", good(ihl=15, payload=b"x" * 16), "drop_malformed"),
    ("ihl6-len20", ipv4.build("10.5.2.3", "10.5.1.2", b"", ihl=6), "drop_malformed"),
    ("totlen-short", good(tot_len=30), "drop_malformed"),
    ("totlen-long", good(tot_len=100), "drop_malformed"),
    ("totlen-zero", good(tot_len=0), "drop_malformed"),
    ("trailing-bytes", good() + b"\0\0", "drop_malformed"),
    ("version7", with_byte(ipv6_packet(), 0, 0x70), "drop_not_ipv4"),
    ("v6-len39", ipv6_packet(0)[:39], "drop_malformed"),
    ("v6-paylen-long", ipv6_packet(8, plen=9), "drop_malformed"),
    ("v6-paylen-short", ipv6_packet(8, plen=7), "drop_malformed"),
    ("v6-paylen-zero", ipv6_packet(8, plen=0), "drop_malformed"),
    ("v6-trailing-bytes", ipv6_packet(8) + b"\0", "drop_malformed"),
    ("v6-scope-malformed", ipv6_packet(8, dst="fe80::1", plen=3), "drop_malformed"),
    ("v6-dst-link-local", ipv6_packet(dst="fe80::1"), "drop_scope"),
    ("v6-dst-link-local-top", ipv6_packet(dst="febf:ffff::1"), "drop_scope"),
    ("v6-src-link-local", ipv6_packet(src="fe80::2"), "drop_scope"),
    ("v6-dst-all-nodes", ipv6_packet(dst="ff02::1"), "drop_scope"),
    ("v6-dst-node-local", ipv6_packet(dst="ff01::2"), "drop_scope"),
    ("v6-dst-scope0", ipv6_packet(dst="ff00::2"), "drop_scope"),
    ("v6-dst-mld", ipv6_packet(dst="ff12::16"), "drop_scope"),   # a flags nibble, link scope
    ("v6-dst-unspecified", ipv6_packet(dst="::"), "drop_scope"),
    ("v6-dad", ipv6_packet(src="::", dst="ff02::1:ff00:1"), "drop_scope"),
]

# TUN side: the length rule (>= 20) comes before the version.
TUN_ONLY = [
    ("empty", b"", "drop_malformed"),
    ("ipv6-short", ipv6_packet()[:10], "drop_malformed"),
    ("v6-nibble-19", b"\x60" + bytes(18), "drop_malformed"),
    ("v6-len20", b"\x60" + bytes(19), "drop_malformed"),
    ("v6-no-route", ipv6_packet(dst="fc00:9::1"), "drop_no_route"),
    ("v6-site-multicast", ipv6_packet(dst="ff05::2"), "drop_no_route"),   # not link scope
    ("v6-above-link-local", ipv6_packet(dst="fec0::1"), "drop_no_route"),
    ("v6-hop1", ipv6_packet(hop=1), "drop_ttl"),
    ("v6-hop0", ipv6_packet(hop=0), "drop_ttl"),
]
# UDP side: the version comes before every length rule.
UDP_ONLY = [
    ("empty", b"", "drop_malformed"),
    ("ipv6-short", ipv6_packet()[:10], "drop_malformed"),
    ("v6-nibble-1", b"\x60", "drop_malformed"),
    ("version5-1", b"\x50", "drop_not_ipv4"),
    ("v6-hop1", ipv6_packet(hop=1), "drop_ttl"),
    ("v6-hop0", ipv6_packet(hop=0), "drop_ttl"),
    ("v6-hop0-malformed", ipv6_packet(hop=0, plen=1), "drop_malformed"),
    ("v6-hop1-scope", ipv6_packet(hop=1, src="fe80::1"), "drop_scope"),
    ("ttl1", good(ttl=1), "drop_ttl"),
    ("ttl0", good(ttl=0), "drop_ttl"),
    ("ttl0-malformed", good(ttl=0, tot_len=99), "drop_malformed"),
    ("ttl1-ipv6-lookalike", with_byte(good(ttl=1), 0, 0x65), "drop_malformed"),
]


@pytest.fixture
def h(engine_kind):
    with Harness(engine_kind, mtu=MTU) as h:
        peer = h.add_peer()
        h.set_routes([h.route("10.5.1.0/24", peer), h.route("10.5.2.0/24", peer),
                      h.route("fc00:5:0:1::/64", peer)])
        yield h


@pytest.mark.parametrize("name,data,counter", COMMON + TUN_ONLY, ids=lambda x: x
                         if isinstance(x, str) and not x.startswith("drop_") else "")
def test_tun_side(h, name, data, counter):
    h.inject_tun(data)
    st = h.settle()
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(data), **{counter: 1})
    assert h.tun_received == [] and h.peers[0].received == []


@pytest.mark.parametrize("name,data,counter", COMMON + UDP_ONLY, ids=lambda x: x
                         if isinstance(x, str) and not x.startswith("drop_") else "")
def test_udp_side(h, name, data, counter):
    h.inject_udp(h.peers[0], data)
    st = h.settle()
    expect_only(st, udp_rx_packets=1, udp_rx_bytes=len(data), **{counter: 1})
    assert h.tun_received == []


def test_tun_side_many_mixed_counted_once_each(h):
    cases = COMMON + TUN_ONLY
    h.inject_tun(*[d for _, d, _ in cases])
    ok = ipv4.build("10.5.1.2", "10.5.2.3", b"ok")
    h.inject_tun(ok)
    st = h.settle()
    want = {}
    for _, _, c in cases:
        want[c] = want.get(c, 0) + 1
    expect_only(st, tun_rx_packets=len(cases) + 1,
                tun_rx_bytes=sum(len(d) for _, d, _ in cases) + len(ok),
                udp_tx_packets=1, udp_tx_bytes=len(ok), **want)
    assert len(h.peers[0].received) == 1


def test_udp_truncated(h):
    too_big = good(payload=b"t" * (MTU + 1 - 20))          # mtu + 1 bytes
    fits = good(payload=b"t" * (MTU - 20))                 # exactly mtu
    h.inject_udp(h.peers[0], too_big)
    st = h.settle()
    # Reading: udp_rx_bytes counts what the mtu-sized buffer received (mtu).
    expect_only(st, udp_rx_packets=1, udp_rx_bytes=MTU, drop_truncated=1)
    h.inject_udp(h.peers[0], fits, good(payload=b"t" * 60000))
    st = h.settle()
    expect_only(st, udp_rx_packets=3, udp_rx_bytes=3 * MTU, drop_truncated=2,
                tun_tx_packets=1, tun_tx_bytes=MTU)
    assert len(h.tun_received) == 1 and h.tun_received[0][:8] == fits[:8]


def test_udp_truncated_wins_over_everything(engine_kind):
    with Harness(engine_kind, mtu=MTU, accept_any=False) as h:
        h.inject_udp(None, b"\x60" + bytes(MTU + 10))      # from a stranger, IPv6, too long
        st = h.settle()
        expect_only(st, udp_rx_packets=1, udp_rx_bytes=MTU, drop_truncated=1)


def test_tun_oversize_read_is_cut_at_mtu(h):
    # A read() returns at most mtu bytes; the rest is gone, so tot_len no
    # longer matches and the packet is malformed.
    pkt = ipv4.build("10.5.1.2", "10.5.2.3", b"o" * (MTU + 100 - 20))
    h.inject_tun(pkt)
    st = h.settle()
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=MTU, drop_malformed=1)


@pytest.fixture
def strict(engine_kind):
    with Harness(engine_kind, mtu=MTU, accept_any=False) as h:
        a, b = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", a), h.route("10.5.3.0/24", b)])
        yield h


def test_bad_source(strict):
    h = strict
    a, b = h.peers
    h.inject_udp(None, good())                             # 127.0.0.254: no route's peer
    h.inject_udp(None, good(ttl=1, tot_len=5))             # bad source wins over malformed
    h.inject_udp(None, ipv6_packet())                      # ... and over not IPv4
    h.inject_udp(a, good(ident=1))                         # peers of routes are accepted,
    h.inject_udp(b, good(ident=2, payload=b"x" * 40))      # whatever subnet they sent for
    st = h.settle()
    assert [p[4:6] for p in h.tun_received] == [b"\0\1", b"\0\2"]
    nbytes = 36 + 36 + len(ipv6_packet()) + 36 + 60
    expect_only(st, udp_rx_packets=5, udp_rx_bytes=nbytes, drop_bad_source=3,
                tun_tx_packets=2, tun_tx_bytes=96)


def test_bad_source_follows_the_route_table(strict):
    h = strict
    a, b = h.peers
    h.set_routes([h.route("10.5.3.0/24", b)])              # a is no longer a peer
    h.wait_for(lambda st: st["route_swaps"] == 2)
    h.inject_udp(a, good(ident=1))
    h.inject_udp(b, good(ident=2))
    st = h.settle()
    assert [p[4:6] for p in h.tun_received] == [b"\0\2"]
    assert st["drop_bad_source"] == 1 and st["tun_tx_packets"] == 1


def test_bad_source_port_does_not_matter(strict):
    h = strict
    from tests.engine_harness import Peer
    other = Peer(h.peers[0].ip)                            # same IP, another port
    try:
        other.sock.sendto(good(), h.udp_addr)
        h._injected_udp += 1
        st = h.settle()
        assert st["tun_tx_packets"] == 1 and st["drop_bad_source"] == 0
    finally:
        other.close()


def test_accept_any_false_with_no_routes_drops_all(engine_kind):
    with Harness(engine_kind, mtu=MTU, accept_any=False) as h:
        p = h.add_peer()
        h.inject_udp(p, good())
        st = h.settle()
        expect_only(st, udp_rx_packets=1, udp_rx_bytes=36, drop_bad_source=1)


def test_malformed_udp_does_not_touch_the_tun_side(h):
    h.inject_udp(h.peers[0], *[d for _, d, _ in COMMON])
    st = h.settle()
    assert st["tun_rx_packets"] == 0 and st["udp_tx_packets"] == 0
    assert st["icmp_unreach_sent"] == st["icmp_ttl_sent"] == 0
