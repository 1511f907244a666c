"""ICMPv6 errors, both engines (dataplane.h, "ICMPv6 errors").

A route miss gets destination unreachable 1/0, an expired hop limit time exceeded 3/0 and a
packet longer than its route's mtu packet too big 2/0 (the mtu in its second word), from
flannel0's IPv6 address (set_tun_addr) back to the offender's source, quoting as much of the
offender as keeps the error within 1280 bytes; never about an ICMPv6 error, a later fragment,
a packet whose upper layer cannot be told, to a multicast group or from a multicast or ::
source; none at all before set_tun_addr. The bytes are checked against a checksum computed
here, not by the engines' modules, and the rate limit is one bucket for both families.
"""
import ipaddress
import struct

import pytest

from dataplane.engine import ipv4
from tests.engine_harness import Harness, expect_only

MTU = 1472
OWN6 = "fc00:5:0:1::"                 # flannel0's IPv6 address: the lease part's network
POD = "fc00:5:0:1::9"                 # a pod of ours, the senders below
ROUTED, UNROUTED = "fc00:5:0:2::1", "fc00:9::1"
UNREACH, TOO_BIG, TIME_EXCEEDED = 1, 2, 3
NARROW = "fc00:5:0:3::1"              # behind a route of mtu 1280 (a tunnel of IPv6's minimum)


def a16(addr) -> bytes:
    return ipaddress.IPv6Address(addr).packed


def v6(src, dst, payload=b"u" * 16, nh=17, hop=64):
    return (bytes([0x6A, 0xB1, 0x23, 0x45]) + len(payload).to_bytes(2, "big") + bytes([nh, hop])
            + a16(src) + a16(dst) + payload)


def echo(src=POD, dst=UNROUTED, hop=64, data=b"ping"):
    return v6(src, dst, bytes([128, 0, 0, 0, 0, 7, 0, 1]) + data, nh=58, hop=hop)


def ext(nh, size=8):
    """An extension header in the common layout (hop-by-hop, destination options...)."""
    return bytes([nh, size // 8 - 1]) + bytes(size - 2)


def frag(nh, offset, more=True):
    return struct.pack("!BxHI", nh, offset << 3 | more, 0x99)


def ones_sum(data: bytes) -> int:
    data = data + b"\0" * (len(data) & 1)
    s = 0
    for i in range(0, len(data), 2):
        s += data[i] << 8 | data[i + 1]
        s = (s & 0xFFFF) + (s >> 16)
    return s


def pseudo(src: bytes, dst: bytes, length: int) -> bytes:
    return src + dst + length.to_bytes(4, "big") + bytes(3) + bytes([58])


def expected_error(type_: int, offender: bytes, src=OWN6, mtu: int = 0) -> bytes:
    """RFC 4443's error, written out here: header, type, code 0, checksum, unused (packet too
    big: the mtu), quote."""
    body = bytes([type_, 0, 0, 0]) + mtu.to_bytes(4, "big") + offender[:1280 - 48]
    check = ~ones_sum(pseudo(a16(src), offender[8:24], len(body)) + body) & 0xFFFF
    body = body[:2] + check.to_bytes(2, "big") + body[4:]
    return (bytes([0x60, 0, 0, 0]) + len(body).to_bytes(2, "big") + bytes([58, 64]) + a16(src)
            + offender[8:24] + body)


def assert_valid(err: bytes) -> None:
    assert err[0] == 0x60 and err[1:4] == bytes(3) and err[6] == 58 and err[7] == 64
    assert int.from_bytes(err[4:6], "big") + 40 == len(err) <= 1280
    assert ones_sum(pseudo(err[8:24], err[24:40], len(err) - 40) + err[40:]) == 0xFFFF


def make(engine_kind, more=(), **kw):
    """A harness whose one peer takes ROUTED, NARROW (mtu 1280) and the subnets ``more``
    (mtu 1280 too)."""
    h = Harness(engine_kind, mtu=MTU, **kw)
    a = h.add_peer()
    h.set_routes([h.route("fc00:5:0:2::/64", a), h.route("10.5.2.0/24", a),
                  h.route("fc00:5:0:3::/64", a, mtu=1280)] +
                 [h.route(net, a, mtu=1280) for net in more])
    h.engine.set_tun_addr(OWN6)
    return h


def padded(p: bytes, length: int) -> bytes:
    """p with its payload grown to a packet of ``length`` bytes (zeros after what it had)."""
    payload = p[40:] + bytes(length - len(p))
    return p[:4] + len(payload).to_bytes(2, "big") + p[6:40] + payload


@pytest.fixture
def h(engine_kind):
    with make(engine_kind) as h:
        yield h


def test_unreachable_and_time_exceeded_bytes(h):
    miss = v6(POD, UNROUTED, nh=6, payload=bytes(range(60)))
    expired = echo(dst=ROUTED, hop=1)             # traceroute6 -I: an echo request gets one
    h.inject_tun(miss, expired)
    st = h.settle()
    assert h.tun_received == [expected_error(UNREACH, miss), expected_error(TIME_EXCEEDED,
                                                                            expired)]
    for err in h.tun_received:
        assert_valid(err)
    expect_only(st, tun_rx_packets=2, tun_rx_bytes=len(miss) + len(expired), drop_no_route=1,
                drop_ttl=1, icmp_unreach_sent=1, icmp_ttl_sent=1)


def test_the_quote_stops_at_1280_bytes(h):
    small, exact, big = (v6(POD, UNROUTED, payload=bytes([i]) * n)
                         for i, n in ((1, 0), (2, 1280 - 48 - 40), (3, MTU - 40)))
    h.inject_tun(small, exact, big)
    h.settle()
    assert [len(e) for e in h.tun_received] == [48 + 40, 1280, 1280]
    assert h.tun_received[2][48:] == big[:1232]
    assert h.tun_received == [expected_error(UNREACH, p) for p in (small, exact, big)]


@pytest.mark.parametrize("offender", [
    echo(src="ff05::1"), echo(src="::"), echo(dst="ff05::2"), echo(dst="ff0e::2"),
    v6(POD, UNROUTED, bytes([1, 0]) + bytes(30), nh=58),                   # an error
    v6(POD, UNROUTED, bytes([127, 0]) + bytes(30), nh=58),                 # the last error type
    v6(POD, UNROUTED, b"", nh=58),                                        # no type: unknown
    v6(POD, UNROUTED, ext(58) + bytes([3, 0]) + bytes(30), nh=0),         # an error behind one
    v6(POD, UNROUTED, frag(17, 1, False) + bytes(16), nh=44),             # a later fragment
    v6(POD, UNROUTED, ext(44) + frag(58, 185) + bytes([128]) + bytes(7), nh=60),
    v6(POD, UNROUTED, bytes(16), nh=50),                                  # ESP: unknown
    v6(POD, UNROUTED, ext(17)[:7], nh=0),                                  # cut short
    v6(POD, UNROUTED, ext(17, 32)[:16], nh=60),                            # says 32, has 16
    v6(POD, UNROUTED, b"".join(ext(60) for _ in range(8)) + ext(17) + bytes(8), nh=60),  # 9
], ids=["mcast-src", "unspec-src", "mcast-dst", "mcast-dst-global", "error", "error-127",
        "no-type", "error-behind-hbh", "later-fragment", "later-fragment-2", "esp", "cut",
        "too-long", "nine-headers"])
def test_never_about(engine_kind, offender):
    with make(engine_kind, icmp_rate=1, icmp_burst=1) as h:
        expired = offender[:7] + b"\x01" + offender[8:]
        h.inject_tun(offender, expired.replace(a16(UNROUTED), a16(ROUTED)))
        st = h.settle()
        assert h.tun_received == []
        assert st["icmp_ratelimited"] == 0, "no token taken either"
        assert st["drop_no_route"] + st["drop_ttl"] == 2
        # The one token is still there: the next eligible offender gets its error.
        h.inject_tun(echo())
        h.settle()
        assert len(h.tun_received) == 1


@pytest.mark.parametrize("payload,nh", [
    (ext(60) + ext(44, 16) + frag(58, 0) + bytes([128]) + bytes(7), 0),    # the first fragment
    (b"".join(ext(60) for _ in range(7)) + ext(58) + bytes([128]) + bytes(7), 60),   # eight
    (bytes([58, 2]) + bytes(14) + bytes([129]) + bytes(7), 51),            # AH, echo reply
    (bytes(8), 59),                                                        # no next header
    (bytes(8), 253),                                                       # unknown: not ICMPv6
    (bytes([6, 0]) + bytes(6), 135),                                       # mobility, then TCP
], ids=["first-fragment", "eight-headers", "ah", "none", "unknown", "mobility"])
def test_errors_about_packets_with_extension_headers(h, payload, nh):
    p = v6(POD, UNROUTED, payload, nh=nh)
    h.inject_tun(p)
    h.settle()
    assert h.tun_received == [expected_error(UNREACH, p)]


def test_no_address_no_error_and_nothing_else_counted(engine_kind):
    with Harness(engine_kind, mtu=MTU, icmp_rate=1, icmp_burst=1) as h:
        h.set_routes([h.route("fc00:5:0:2::/64", h.add_peer())])
        h.inject_tun(echo(), echo(dst=ROUTED, hop=1))
        st = h.settle()
        expect_only(st, tun_rx_packets=2, tun_rx_bytes=2 * len(echo()), drop_no_route=1,
                    drop_ttl=1)
        h.engine.set_tun_addr("fc00:5:0:1::1")
        h.inject_tun(echo())
        h.settle()
        assert h.tun_received == [expected_error(UNREACH, echo(), src="fc00:5:0:1::1")]
        h.engine.set_tun_addr("::")                   # unset again
        h.inject_tun(echo())
        st = h.settle()
        assert len(h.tun_received) == 1 and st["icmp_ratelimited"] == 0


def test_one_rate_limit_for_both_families(engine_kind):
    with make(engine_kind, icmp_rate=1, icmp_burst=3) as h:
        four = ipv4.build("10.5.1.2", "10.9.0.1", b"four")
        h.inject_tun(echo(), four, echo(dst=ROUTED, hop=1), four, echo())
        st = h.settle()
        assert [p[0] >> 4 for p in h.tun_received] == [6, 4, 6]
        assert (st["icmp_unreach_sent"], st["icmp_ttl_sent"], st["icmp_ratelimited"]) == (2, 1, 2)


def test_refused_args(h):
    for bad in ("10.5.1.9", "fc00::/64", b"\0" * 4):     # IPv4's is the constructor's
        with pytest.raises(ValueError):
            h.engine.set_tun_addr(bad)
    h.engine.set_tun_addr(h.tun_addr)                    # which it keeps


def test_trace_shows_the_error(h):
    h.engine.trace(True)
    h.inject_tun(echo())
    h.settle()
    icmp = [e for e in h.engine.trace_events() if e["kind"] == "icmp"]
    assert len(icmp) == 1 and icmp[0]["len"] == len(echo()) + 48
    assert icmp[0]["head"] == expected_error(UNREACH, echo())[:64]


def test_packet_too_big_bytes_and_the_mtu_itself_forwarded(h):
    a = h.peers[0]
    fits = v6(POD, NARROW, bytes([5]) * (1280 - 40))
    over = v6(POD, NARROW, bytes([6]) * (1281 - 40))
    big = v6(POD, NARROW, bytes([7]) * (MTU - 40))
    h.inject_tun(fits, over, big)
    st = h.settle()
    assert a.received == [fits[:7] + bytes([63]) + fits[8:]]
    assert h.tun_received == [expected_error(TOO_BIG, over, mtu=1280),
                              expected_error(TOO_BIG, big, mtu=1280)]
    assert [len(e) for e in h.tun_received] == [1280, 1280]
    for err in h.tun_received:
        assert_valid(err)
        assert err[40:48] == bytes([2, 0]) + err[42:44] + (1280).to_bytes(4, "big")
    expect_only(st, tun_rx_packets=3, tun_rx_bytes=1280 + 1281 + MTU, udp_tx_packets=1,
                udp_tx_bytes=1280, drop_too_big=2, icmp_too_big_sent=2)


def test_hop_limit_before_the_mtu(h):
    """RFC 8200's router: an expired hop limit is time exceeded, however long the packet."""
    p = echo(dst=NARROW, hop=1, data=bytes(1400))
    h.inject_tun(p)
    st = h.settle()
    assert h.tun_received == [expected_error(TIME_EXCEEDED, p)]
    assert st["drop_ttl"] == 1 and st["drop_too_big"] == 0


@pytest.mark.parametrize("offender", [
    echo(src="ff05::1", dst=NARROW), echo(src="::", dst=NARROW), echo(dst="ff0e::2"),
    v6(POD, NARROW, bytes([2, 0]) + bytes(30), nh=58),                     # itself too big
    v6(POD, NARROW, frag(17, 1, False) + bytes(16), nh=44),               # a later fragment
    v6(POD, NARROW, bytes(16), nh=50),                                    # ESP
], ids=["mcast-src", "unspec-src", "mcast-dst", "error", "later-fragment", "esp"])
def test_never_a_packet_too_big_about(engine_kind, offender):
    with make(engine_kind, ("ff0e::/16",), icmp_rate=1, icmp_burst=1) as h:
        h.inject_tun(padded(offender, 1300))
        st = h.settle()
        assert h.tun_received == [] and st["icmp_ratelimited"] == 0
        expect_only(st, tun_rx_packets=1, tun_rx_bytes=1300, drop_too_big=1)


def test_packet_too_big_shares_the_rate_limit(engine_kind):
    with make(engine_kind, icmp_rate=1, icmp_burst=2) as h:
        over = v6(POD, NARROW, bytes(1300))
        h.inject_tun(over, echo(), over)
        st = h.settle()
        assert [e[40] for e in h.tun_received] == [TOO_BIG, UNREACH]
        assert (st["icmp_too_big_sent"], st["icmp_unreach_sent"], st["icmp_ratelimited"],
                st["drop_too_big"]) == (1, 1, 1, 2)
