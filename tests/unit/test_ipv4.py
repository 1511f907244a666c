"""dataplane.engine.ipv4: checksum, parse/build, the TTL update, ICMP errors."""
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.engine import ipv4

# RFC 1071-style textbook example: a 20-byte header whose checksum is 0xb861.
TEXTBOOK = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")


def naive_checksum(data: bytes) -> int:
    """An independent RFC 1071 checksum: byte pairs, 32-bit end-around carry."""
    if len(data) % 2:
        data += b"\0"
    s = 0
    for i in range(0, len(data), 2):
        s += data[i] * 256 + data[i + 1]
        s = (s & 0xFFFF) + (s >> 16)
    return 0xFFFF - s


def test_checksum_textbook():
    assert ipv4.checksum(TEXTBOOK) == 0xB861
    filled = TEXTBOOK[:10] + b"\xb8\x61" + TEXTBOOK[12:]
    assert ipv4.checksum(filled) == 0
    assert ipv4.header_checksum_ok(filled)


def test_checksum_matches_naive_on_random_data():
    rnd = random.Random(1)
    for n in list(range(0, 70)) + [1471, 1472]:
        data = bytes(rnd.getrandbits(8) for _ in range(n))
        assert ipv4.checksum(data) == naive_checksum(data), n


def test_build_and_parse_roundtrip():
    opts = b"\x01\x01\x01\x00"  # NOP NOP NOP EOL
    pkt = ipv4.build("10.5.1.2", "10.5.2.3", b"payload", proto=ipv4.PROTO_TCP, ttl=17, tos=0x10,
                     ident=0x1234, flags=2, frag_offset=0, options=opts)
    h = ipv4.parse(pkt)
    assert (h.version, h.ihl, h.header_len, h.tot_len) == (4, 6, 24, 24 + 7)
    assert (h.tos, h.ident, h.ttl, h.proto) == (0x10, 0x1234, 17, 6)
    assert h.dont_fragment and not h.more_fragments and not h.is_later_fragment
    assert (str(h.src), str(h.dst), h.options) == ("10.5.1.2", "10.5.2.3", opts)
    assert ipv4.header_checksum_ok(pkt)
    assert h.checksum == naive_checksum(pkt[:10] + b"\0\0" + pkt[12:24])


def test_build_can_force_malformed_fields():
    pkt = ipv4.build("1.2.3.4", "5.6.7.8", b"x" * 8, version=6, ihl=3, tot_len=999, check=0xABCD)
    assert pkt[0] == 0x63 and pkt[2:4] == (999).to_bytes(2, "big") and pkt[10:12] == b"\xab\xcd"


def test_parse_rejects_short_and_overlong_header():
    with pytest.raises(ValueError):
        ipv4.parse(b"\x45" * 19)
    with pytest.raises(ValueError):
        ipv4.parse(ipv4.build("1.2.3.4", "5.6.7.8", ihl=15))


def test_describe():
    pkt = ipv4.build("10.5.1.2", "10.5.2.3", ipv4.echo_request(), proto=ipv4.PROTO_ICMP, ttl=9)
    assert ipv4.describe(pkt) == "10.5.1.2 > 10.5.2.3 icmp type 8 code 0 ttl 9 len 32"
    frag = ipv4.build("10.5.1.2", "10.5.2.3", b"x" * 8, flags=1, frag_offset=3)
    assert "frag 24+" in ipv4.describe(frag)
    assert ipv4.describe(b"\x60" + bytes(39)).startswith("<not IPv4")
    assert ipv4.describe(b"\x45").startswith("<")


def test_checksum_rfc1071_example():
    # RFC 1071 section 3's worked example: these 8 bytes sum to 0xddf2
    assert ipv4.checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0xDDF2 ^ 0xFFFF
    # an odd length is padded with a zero byte
    assert ipv4.checksum(bytes.fromhex("0001f203f4f5f6")) == \
        ipv4.checksum(bytes.fromhex("0001f203f4f5f600"))


def test_ttl_decrement_textbook():
    # the TTL word drops by 0x100, so the checksum of the textbook header rises by 0x100
    pkt = bytearray(TEXTBOOK[:10] + b"\xb8\x61" + TEXTBOOK[12:])
    ipv4.decrement_ttl(pkt)
    assert pkt == TEXTBOOK[:8] + b"\x3f\x11\xb9\x61" + TEXTBOOK[12:]
    assert ipv4.header_checksum_ok(pkt)


def test_ttl_decrement_equals_recomputation_for_every_checksum():
    # The identification field runs through all 65536 values, and with it the
    # header's checksum: the update must land on the recomputed checksum every
    # time, 0x0000 included (RFC 1624's point: eqn. 3, not eqn. 2, which
    # gives 0xffff there).
    base = bytearray(TEXTBOOK)
    seen = set()
    for ident in range(0x10000):
        base[4:6] = ident.to_bytes(2, "big")
        base[10:12] = b"\0\0"
        check = ipv4.checksum(base)
        base[10:12] = check.to_bytes(2, "big")
        seen.add(check)
        pkt = bytearray(base)
        ipv4.decrement_ttl(pkt)
        after = pkt[:10] + b"\0\0" + pkt[12:]
        assert pkt[10] << 8 | pkt[11] == naive_checksum(after), ident
    assert len(seen) == 0x10000 - 1        # 0xffff would need an all-zero header


headers = st.builds(
    lambda ttl, proto, ident, tos, frag, src, dst, opts, payload: ipv4.build(
        src, dst, payload, proto=proto, ttl=ttl, ident=ident, tos=tos, frag_offset=frag,
        options=opts),
    st.integers(1, 255), st.integers(0, 255), st.integers(0, 0xFFFF), st.integers(0, 255),
    st.integers(0, 0x1FFF), st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 32 - 1),
    st.integers(0, 10).flatmap(lambda n: st.binary(min_size=4 * n, max_size=4 * n)),
    st.binary(max_size=40))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200))
def test_checksum_property_matches_naive(data):
    assert ipv4.checksum(data) == naive_checksum(data)
    if len(data) % 2 == 0:
        # the checksum appended, the whole sums to zero: what a receiver checks
        assert ipv4.checksum(data + ipv4.checksum(data).to_bytes(2, "big")) == 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pkt=headers)
def test_ttl_decrement_property_equals_recomputation(pkt):
    pkt = bytearray(pkt)
    ihl = (pkt[0] & 15) * 4
    ttl = pkt[8]
    ipv4.decrement_ttl(pkt)
    assert pkt[8] == ttl - 1
    assert pkt[10] << 8 | pkt[11] == ipv4.checksum(pkt[:10] + b"\0\0" + pkt[12:ihl])
    assert ipv4.header_checksum_ok(pkt)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pkt=headers, check=st.integers(0, 0xFFFF))
def test_ttl_decrement_property_keeps_the_sum_of_a_wrong_checksum(pkt, check):
    # RFC 1624's point: the update carries a wrong checksum along instead of
    # repairing it. The ones' complement sum over every header word, the
    # checksum included, is the same before and after (0 and 0xFFFF are the
    # two zeros), whatever the checksum was.
    def words_sum(hdr):
        s = sum(hdr[i] << 8 | hdr[i + 1] for i in range(0, len(hdr), 2))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return s
    pkt = bytearray(pkt)
    pkt[10:12] = check.to_bytes(2, "big")
    ihl = (pkt[0] & 15) * 4
    before = words_sum(pkt[:ihl])
    ipv4.decrement_ttl(pkt)
    after = words_sum(pkt[:ihl])
    assert after == before or {after, before} == {0, 0xFFFF}


def test_fragment_and_icmp_error_predicates():
    first = ipv4.build("1.1.1.1", "2.2.2.2", b"x" * 16, flags=1, frag_offset=0)
    later = ipv4.build("1.1.1.1", "2.2.2.2", b"x" * 16, flags=0, frag_offset=185)
    assert not ipv4.is_later_fragment(first) and ipv4.is_later_fragment(later)
    for t in range(256):
        pkt = ipv4.build("1.1.1.1", "2.2.2.2", ipv4.icmp_message(t, 0), proto=ipv4.PROTO_ICMP)
        assert ipv4.is_icmp_error(pkt) == (t in (3, 4, 5, 11, 12))
        assert ipv4.may_send_time_exceeded(pkt) == (t not in (3, 4, 5, 11, 12))
        assert not ipv4.may_send_unreachable(pkt)
    bare_icmp = ipv4.build("1.1.1.1", "2.2.2.2", b"", proto=ipv4.PROTO_ICMP)
    assert not ipv4.is_icmp_error(bare_icmp) and ipv4.may_send_time_exceeded(bare_icmp)
    assert ipv4.may_send_unreachable(first) and not ipv4.may_send_unreachable(later)


def test_icmp_error_layout():
    opts = bytes(range(40))                                   # ihl 15
    off = ipv4.build("10.5.1.7", "10.9.0.1", bytes(range(100, 130)), options=opts, ttl=1)
    err = ipv4.icmp_error(off, 11, 0, "10.5.1.0")
    q = 60 + 8
    assert len(err) == 20 + 8 + q
    assert err[:12] == struct.pack("!BBHHHBBH", 0x45, 0, 28 + q, 0, 0, 64, 1,
                                   naive_checksum(err[:10] + err[12:20]))
    assert err[12:16] == bytes([10, 5, 1, 0]) and err[16:20] == off[12:16]
    assert err[20:24] == bytes([11, 0]) + naive_checksum(err[20:22] + b"\0\0" + err[24:]).to_bytes(2, "big")
    assert err[24:28] == bytes(4) and err[28:] == off[:q]
    short = ipv4.build("10.5.1.7", "10.9.0.1", b"abc")      # shorter than ihl*4 + 8
    assert ipv4.quote_length(short) == 23
    assert ipv4.icmp_error(short, 3, 0, "10.5.1.0")[28:] == short
