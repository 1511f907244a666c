"""IPv6 headers: building, decoding, the link-scope rule, the upper-layer walk and ICMPv6 errors.

Plain functions over ``bytes``/``bytearray``, no I/O, as ipv4.py is for IPv4:
csrc/dataplane.h's rules for inner IPv6 packets written for reading rather
than for speed. The Python engine's per-packet work (pypath.py) writes the
length check, the link-scope rule and the hop-limit update out for speed
(tests/unit/test_pypath_ipv6.py holds them to :func:`is_link_scoped` and
:func:`decrement_hop_limit`); the tests build packets with :func:`build`, and
the demo can decode them with :func:`parse` / :func:`describe`. The ICMPv6
errors are built here for both the engine and the tests (:func:`may_send_error`,
:func:`icmp_error`): not every packet pays for them.

The IPv6 header (RFC 8200), always 40 bytes; options live in extension
headers after it::

    offset  size  field            here
    ------  ----  ---------------  ------------------------------------------
         0   4 b  version          always 6 (the high nibble of byte 0)
         0   8 b  traffic class    DSCP + ECN (byte 0's low nibble, byte 1's high)
         1  20 b  flow label       byte 1's low nibble, bytes 2 and 3
         4   2 B  payload length   bytes after this header (extension headers included)
         6   1 B  next header      an extension header, or 6 TCP, 17 UDP, 58 ICMPv6, ...
         7   1 B  hop limit        decremented once per hop; no header checksum
         8  16 B  source address
        24  16 B  destination address

All multi-byte fields are big-endian ("network order").

Link scope (dataplane.h, "IPv6 inner packets"): a packet whose source or
destination is link-local (fe80::/10), whose destination is unspecified
(::), or whose destination is multicast (ff00::/8) of scope 0 (reserved),
1 (interface-local) or 2 (link-local) never leaves its link (RFC 4291), so
the overlay neither carries nor delivers it: drop_scope.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .contract import ICMP6_ERR_MAX, ICMP_TTL, IPV6_EXT_MAX
from .ipv4 import checksum

# --- constants ---------------------------------------------------------------

VERSION = 6
HEADER_LEN = 40
HOP_LIMIT_DEFAULT = 64
FLOW_LABEL_MASK = 0xFFFFF

# Next header values (IANA "Assigned Internet Protocol Numbers").
NH_HOP_BY_HOP = 0
NH_TCP = 6
NH_UDP = 17
NH_ROUTING = 43
NH_FRAGMENT = 44
NH_ESP = 50
NH_AH = 51
NH_ICMPV6 = 58
NH_NONE = 59
NH_DEST_OPTS = 60
NH_MOBILITY = 135
NH_HIP = 139
NH_SHIM6 = 140
# Extension headers whose length is (byte 1 + 1) * 8 (RFC 8200 4.x, RFC 6564).
_EXT_8 = frozenset({NH_HOP_BY_HOP, NH_ROUTING, NH_DEST_OPTS, NH_MOBILITY, NH_HIP, NH_SHIM6})
FRAGMENT_LEN = 8
#: Every next-header value that names an extension header rather than an upper layer.
EXTENSION_HEADERS = _EXT_8 | {NH_FRAGMENT, NH_AH}

ICMPV6_DEST_UNREACH = 1
ICMPV6_PACKET_TOO_BIG = 2
ICMPV6_TIME_EXCEEDED = 3
ICMPV6_PARAM_PROBLEM = 4
ICMPV6_ECHO_REQUEST = 128
ICMPV6_ECHO_REPLY = 129
ICMPV6_ROUTER_SOLICIT = 133
ICMPV6_ROUTER_ADVERT = 134
ICMPV6_NEIGHBOR_SOLICIT = 135
ICMPV6_NEIGHBOR_ADVERT = 136
ICMPV6_REDIRECT = 137
ICMPV6_MLD2_REPORT = 143
#: Types 0..127 are errors (RFC 4443 2.1): no error is ever sent about one.
ICMPV6_ERROR_MAX = 127

LINK_LOCAL = ipaddress.IPv6Network("fe80::/10")
MULTICAST = ipaddress.IPv6Network("ff00::/8")
#: Multicast scopes that stay on the link: reserved, interface-local, link-local.
LINK_MULTICAST_SCOPES = frozenset({0, 1, 2})

# vtf (version, traffic class, flow label), payload length, next header, hop limit, src, dst
_HEADER = struct.Struct("!IHBB16s16s")
_PSEUDO = struct.Struct("!16s16sI3xB")
_UDP = struct.Struct("!HHHH")
_ICMP = struct.Struct("!BBHI")
PROTO_NAMES = {NH_TCP: "tcp", NH_UDP: "udp", NH_ICMPV6: "icmp6"}


# --- the link-scope rule -----------------------------------------------------

def is_link_scoped_pair(src: bytes, dst: bytes) -> bool:
    """dataplane.h's link-scope rule on a source and a destination of 16 bytes each."""
    if src[0] == 0xFE and src[1] & 0xC0 == 0x80:
        return True
    if dst[0] == 0xFE and dst[1] & 0xC0 == 0x80:
        return True
    if dst[0] == 0xFF:
        return dst[1] & 0x0F in LINK_MULTICAST_SCOPES
    return not any(dst)


def is_link_scoped(packet) -> bool:
    """The link-scope rule on the addresses of ``packet`` (at least 40 bytes)."""
    return is_link_scoped_pair(bytes(packet[8:24]), bytes(packet[24:40]))


def length_ok(packet, length: int | None = None) -> bool:
    """dataplane.h's length rule: at least a header, and the payload length field
    accounting for every byte after it (no jumbograms, no trailing bytes)."""
    length = len(packet) if length is None else length
    return length >= HEADER_LEN and (packet[4] << 8 | packet[5]) + HEADER_LEN == length


def decrement_hop_limit(packet: bytearray) -> None:
    """Hop limit - 1 in place (no checksum covers it). The hop limit must be at
    least 1 (the engines never forward a packet whose hop limit is <= 1)."""
    packet[7] -= 1


# --- parsing -----------------------------------------------------------------

@dataclass(frozen=True)
class IPv6Header:
    """One decoded IPv6 header (addresses as IPv6Address)."""
    version: int
    traffic_class: int
    flow_label: int
    payload_len: int
    next_header: int
    hop_limit: int
    src: ipaddress.IPv6Address
    dst: ipaddress.IPv6Address


def parse(packet) -> IPv6Header:
    """Decode the IPv6 header at the start of ``packet``. Raises ValueError if
    fewer than 40 bytes; nothing else is checked, so a wrong version or length
    can still be looked at."""
    packet = bytes(packet)
    if len(packet) < HEADER_LEN:
        raise ValueError(f"{len(packet)} bytes: shorter than an IPv6 header")
    vtf, plen, nh, hop, src, dst = _HEADER.unpack_from(packet)
    return IPv6Header(version=vtf >> 28, traffic_class=vtf >> 20 & 0xFF,
                      flow_label=vtf & FLOW_LABEL_MASK, payload_len=plen, next_header=nh,
                      hop_limit=hop, src=ipaddress.IPv6Address(src),
                      dst=ipaddress.IPv6Address(dst))


def upper_layer(packet) -> tuple[int, int] | None:
    """``(protocol, offset)`` of the upper-layer header after the extension
    headers, or None when the chain runs past the packet or past IPV6_EXT_MAX
    headers, reaches a fragment other than the first (whose upper layer is
    elsewhere) or ESP (encrypted from there on). ``protocol`` may be NH_NONE
    (59: nothing follows). The walk of dataplane.h's "ICMPv6 errors"."""
    packet = bytes(packet)
    nh, off, n = packet[6], HEADER_LEN, 0
    while nh in EXTENSION_HEADERS:
        if n == IPV6_EXT_MAX or off + 8 > len(packet):
            return None
        n += 1
        if nh == NH_FRAGMENT:
            if (packet[off + 2] << 8 | packet[off + 3]) & 0xFFF8:
                return None
            size = FRAGMENT_LEN
        elif nh == NH_AH:
            size = (packet[off + 1] + 2) * 4
        else:
            size = (packet[off + 1] + 1) * 8
        nh, off = packet[off], off + size
    if nh == NH_ESP or off > len(packet):
        return None
    return nh, off


def describe(packet) -> str:
    """One line for humans, e.g. ``fd00:5:1::2 > fd00:5:2::3 udp hlim 63 len 56``."""
    try:
        h = parse(packet)
    except ValueError as e:
        return f"<{e}>"
    if h.version != VERSION:
        return f"<not IPv6: version {h.version}, {len(packet)} bytes>"
    upper = upper_layer(packet)
    if upper is None:
        what = f"next header {h.next_header}"
    else:
        proto, off = upper
        what = PROTO_NAMES.get(proto, f"proto {proto}")
        if proto == NH_ICMPV6 and len(packet) > off + 1:
            what += f" type {packet[off]} code {packet[off + 1]}"
    scope = " link-scoped" if is_link_scoped(packet) else ""
    return (f"{h.src} > {h.dst} {what}{scope} hlim {h.hop_limit} "
            f"len {HEADER_LEN + h.payload_len}")


# --- building ----------------------------------------------------------------

def _addr(a) -> bytes:
    return ipaddress.IPv6Address(a).packed


def build(src, dst, payload: bytes = b"", *, next_header: int = NH_UDP,
          hop_limit: int = HOP_LIMIT_DEFAULT, traffic_class: int = 0, flow_label: int = 0,
          version: int = VERSION, payload_len: int | None = None) -> bytes:
    """An IPv6 packet of ``payload`` (extension headers included, if any).
    ``version`` and ``payload_len`` can be overridden to build malformed packets."""
    if payload_len is None:
        payload_len = len(payload)
    vtf = ((version & 0x0F) << 28 | (traffic_class & 0xFF) << 20 |
           (flow_label & FLOW_LABEL_MASK))
    return _HEADER.pack(vtf, payload_len & 0xFFFF, next_header, hop_limit & 0xFF,
                        _addr(src), _addr(dst)) + bytes(payload)


def upper_checksum(src, dst, next_header: int, segment: bytes) -> int:
    """The checksum of an upper-layer ``segment`` (its checksum field zero) over
    RFC 8200 8.1's pseudo-header."""
    pseudo = _PSEUDO.pack(_addr(src), _addr(dst), len(segment), next_header)
    return checksum(pseudo + bytes(segment))


def udp_payload(src, dst, sport: int, dport: int, data: bytes = b"") -> bytes:
    """A UDP header + data with its checksum, which IPv6 requires (RFC 8200 8.1:
    a computed 0 is sent as 0xffff)."""
    seg = _UDP.pack(sport, dport, 8 + len(data), 0) + data
    check = upper_checksum(src, dst, NH_UDP, seg) or 0xFFFF
    return seg[:6] + check.to_bytes(2, "big") + seg[8:]


def icmp_message(src, dst, type_: int, code: int, rest: int = 0, data: bytes = b"") -> bytes:
    """An ICMPv6 message with its checksum (over the pseudo-header, unlike ICMPv4's);
    ``rest`` is the 4-byte word after the checksum."""
    msg = _ICMP.pack(type_, code, 0, rest) + data
    check = upper_checksum(src, dst, NH_ICMPV6, msg)
    return msg[:2] + check.to_bytes(2, "big") + msg[4:]


def may_send_error(packet) -> bool:
    """RFC 4443 2.4 (e) as dataplane.h's "ICMPv6 errors" writes it: no error to a
    multicast destination, from a multicast or :: source, or about a packet whose
    upper layer is not known to be anything but an ICMPv6 error (an unreadable
    chain, a later fragment, ESP, a cut ICMPv6 header, an ICMPv6 error)."""
    if packet[24] == 0xFF or packet[8] == 0xFF or not any(packet[8:24]):
        return False
    upper = upper_layer(packet)
    if upper is None:
        return False
    proto, off = upper
    return proto != NH_ICMPV6 or (off < len(packet) and packet[off] > ICMPV6_ERROR_MAX)


def icmp_error(offender, type_: int, code: int, src, rest: int = 0) -> bytes:
    """The complete IPv6 packet of an ICMPv6 error about ``offender`` (the packet
    as read, before any hop limit change), sent from ``src`` back to the
    offender's source, in the format of dataplane.h: as much of the offender as
    keeps the error within ICMP6_ERR_MAX bytes (IPv6's minimum MTU). ``rest``: the
    word after the checksum (packet too big: the MTU)."""
    offender = bytes(offender)
    dst = offender[8:24]
    quote = offender[:ICMP6_ERR_MAX - HEADER_LEN - _ICMP.size]
    return build(src, dst, icmp_message(src, dst, type_, code, rest, quote),
                 next_header=NH_ICMPV6, hop_limit=ICMP_TTL)


def echo_request(src, dst, ident: int = 1, seq: int = 1, data: bytes = b"ping") -> bytes:
    """A complete ICMPv6 echo request packet (a ping6) from ``src`` to ``dst``."""
    return build(src, dst, icmp_message(src, dst, ICMPV6_ECHO_REQUEST, 0, ident << 16 | seq,
                                        data), next_header=NH_ICMPV6)
