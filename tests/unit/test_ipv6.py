"""dataplane/engine/ipv6.py: the IPv6 helpers the Python engine's rules and the tests rest on.

The link-scope rule is checked against ipaddress's own idea of each address
(is_link_local, is_multicast, the scope nibble), so the hand-written byte tests
cannot drift from RFC 4291; the builders against checksums recomputed from
scratch.
"""
from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.engine import ipv4, ipv6

A, B = "fd00:5:1::2", "fd00:5:2::3"


def test_build_and_parse_round_trip():
    pkt = ipv6.build(A, B, b"data", next_header=ipv6.NH_TCP, hop_limit=9, traffic_class=0xB8,
                     flow_label=0xABCDE)
    assert len(pkt) == 44 and pkt[0] >> 4 == 6
    h = ipv6.parse(pkt)
    assert (h.version, h.traffic_class, h.flow_label, h.payload_len, h.next_header,
            h.hop_limit) == (6, 0xB8, 0xABCDE, 4, ipv6.NH_TCP, 9)
    assert (h.src, h.dst) == (ipaddress.IPv6Address(A), ipaddress.IPv6Address(B))
    assert ipv6.length_ok(pkt)


def test_malformed_on_request():
    assert ipv6.parse(ipv6.build(A, B, version=4)).version == 4
    assert not ipv6.length_ok(ipv6.build(A, B, b"xy", payload_len=1))
    assert not ipv6.length_ok(ipv6.build(A, B, b"xy", payload_len=3))
    assert not ipv6.length_ok(ipv6.build(A, B)[:39])
    assert not ipv6.length_ok(ipv6.build(A, B) + b"\0")              # trailing bytes
    with pytest.raises(ValueError):
        ipv6.parse(bytes(39))


def test_decrement_hop_limit_changes_byte_7_only():
    pkt = bytearray(ipv6.build(A, B, b"x" * 8, hop_limit=2))
    before = bytes(pkt)
    ipv6.decrement_hop_limit(pkt)
    assert pkt[7] == 1 and pkt[:7] == before[:7] and pkt[8:] == before[8:]


# ---- the link-scope rule ---------------------------------------------------------------

SCOPE_CASES = [
    # (src, dst, link-scoped)
    (A, B, False),
    ("fe80::1", B, True),                  # link-local source
    ("febf:ffff::1", B, True),             # the top of fe80::/10
    ("fec0::1", B, False),                 # the old site-local: not fe80::/10
    (A, "fe80::1", True),
    (A, "::", True),                       # unspecified destination
    ("::", B, False),                      # an unspecified source is not, by itself
    (A, "::1", False),                     # loopback: not in the rule (the host drops it)
    (A, "ff00::1", True),                  # multicast scopes 0, 1, 2
    (A, "ff01::1", True),
    (A, "ff02::1:ff00:1", True),           # a neighbour solicitation's
    (A, "ff12::1", True),                  # flags do not matter, the scope does
    (A, "ff32::1", True),
    (A, "ff03::1", False),                 # realm-local and wider travel
    (A, "ff05::1", False),
    (A, "ff0e::1", False),
    (A, "ff1e::1", False),
    ("fe80::1", "ff0e::1", True),
]


@pytest.mark.parametrize("src,dst,scoped", SCOPE_CASES)
def test_link_scope_cases(src, dst, scoped):
    assert ipv6.is_link_scoped(ipv6.build(src, dst)) is scoped


def reference_scoped(src: ipaddress.IPv6Address, dst: ipaddress.IPv6Address) -> bool:
    if src in ipv6.LINK_LOCAL or dst in ipv6.LINK_LOCAL or dst.is_unspecified:
        return True
    return dst.is_multicast and dst.packed[1] & 15 in (0, 1, 2)


# Addresses near every edge of the rule, and any at all.
EDGY = st.sampled_from([0xFE80, 0xFEBF, 0xFEC0, 0xFE7F, 0xFF00, 0xFF01, 0xFF02, 0xFF03,
                        0xFF12, 0xFFFE, 0x0000, 0x2001])
ADDR6 = st.one_of(
    st.integers(0, (1 << 128) - 1),
    st.builds(lambda top, rest: top << 112 | rest, EDGY, st.integers(0, (1 << 112) - 1)),
    st.just(0), st.just(1)).map(ipaddress.IPv6Address)


@given(ADDR6, ADDR6)
def test_link_scope_is_rfc_4291s(src, dst):
    assert ipv6.is_link_scoped(ipv6.build(src, dst)) is reference_scoped(src, dst)


# ---- upper layers ----------------------------------------------------------------------

def ext(next_header: int, size: int) -> bytes:
    """An extension header of ``size`` bytes (a multiple of 8) in the common layout."""
    return bytes([next_header, size // 8 - 1]) + bytes(size - 2)


def fragment(next_header: int, offset: int, more: bool) -> bytes:
    return struct.pack("!BxHI", next_header, offset << 3 | more, 0x1234)


UDP = ipv6.udp_payload(A, B, 1, 2, b"hi")


@pytest.mark.parametrize("payload,first,expect", [
    (UDP, ipv6.NH_UDP, (ipv6.NH_UDP, 40)),
    (ext(ipv6.NH_UDP, 8) + UDP, ipv6.NH_HOP_BY_HOP, (ipv6.NH_UDP, 48)),
    (ext(ipv6.NH_ROUTING, 16) + ext(ipv6.NH_ICMPV6, 24) + bytes(8), ipv6.NH_DEST_OPTS,
     (ipv6.NH_ICMPV6, 80)),
    (fragment(ipv6.NH_UDP, 0, True) + UDP, ipv6.NH_FRAGMENT, (ipv6.NH_UDP, 48)),
    (fragment(ipv6.NH_UDP, 1, False) + UDP, ipv6.NH_FRAGMENT, None),     # not the first
    (bytes([ipv6.NH_TCP, 1]) + bytes(10) + bytes(20), ipv6.NH_AH, (ipv6.NH_TCP, 52)),
    (bytes(16), ipv6.NH_ESP, None),
    (b"", ipv6.NH_NONE, (ipv6.NH_NONE, 40)),
    (ext(ipv6.NH_UDP, 8)[:7], ipv6.NH_HOP_BY_HOP, None),                 # cut short
    (bytes([ipv6.NH_UDP, 3]) + bytes(6), ipv6.NH_HOP_BY_HOP, None),      # says 32, has 8
], ids=["udp", "hop-by-hop", "two", "first fragment", "later fragment", "ah", "esp", "none",
        "cut", "too long"])
def test_upper_layer_walk(payload, first, expect):
    assert ipv6.upper_layer(ipv6.build(A, B, payload, next_header=first)) == expect


def pseudo_sum_is_zero(src, dst, nh, segment) -> bool:
    pseudo = (ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed +
              len(segment).to_bytes(4, "big") + bytes(3) + bytes([nh]))
    return ipv4.checksum(pseudo + segment) == 0


def test_udp_and_icmpv6_checksums_cover_the_pseudo_header():
    assert pseudo_sum_is_zero(A, B, ipv6.NH_UDP, ipv6.udp_payload(A, B, 4000, 5000, b"odd"))
    # the addresses are summed: another destination fails it (swapping them would not)
    assert not pseudo_sum_is_zero(A, "fd00:5:2::4", ipv6.NH_UDP,
                                  ipv6.udp_payload(A, B, 4000, 5000, b"x"))
    ping = ipv6.echo_request(A, B, 7, 9, b"ping")
    assert ping[6] == ipv6.NH_ICMPV6 and ping[40] == ipv6.ICMPV6_ECHO_REQUEST
    assert pseudo_sum_is_zero(A, B, ipv6.NH_ICMPV6, ping[40:])


def test_describe():
    assert ipv6.describe(ipv6.echo_request(A, B)) == \
        f"{A} > {B} icmp6 type 128 code 0 hlim 64 len 52"
    assert "link-scoped" in ipv6.describe(ipv6.build("fe80::1", "ff02::2", b""))
    assert ipv6.describe(bytes(10)).startswith("<10 bytes")
    assert ipv6.describe(ipv4.build("10.0.0.1", "10.0.0.2") + bytes(20)).startswith("<not IPv6")
