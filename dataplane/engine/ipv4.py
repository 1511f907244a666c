"""IPv4 headers, the internet checksum, the TTL update and ICMP errors.

Plain functions over ``bytes``/``bytearray``, no I/O: csrc/packet.c's rules
(those of ``csrc/dataplane.h``) written for reading rather than for speed.
The Python engine's per-packet work (pypath.py) calls them on its slow paths
(ICMP errors) and writes the TTL update out for speed
(tests/unit/test_pypath.py holds it to :func:`decrement_ttl`), the tests use
them to build and check packets, and the teaching demo uses :func:`parse` /
:func:`describe` to decode what the engine moves.

The IPv4 header (RFC 791), 20 bytes plus 0..40 bytes of options::

    offset  size  field            here
    ------  ----  ---------------  ------------------------------------------
         0   4 b  version          always 4 (the high nibble of byte 0)
         0   4 b  ihl              header length in 32-bit words, 5..15
         1   1 B  tos              type of service / DSCP + ECN
         2   2 B  total length     header + payload in bytes (tot_len)
         4   2 B  identification   groups the fragments of one datagram
         6   3 b  flags            reserved, DF (don't fragment), MF (more)
         6  13 b  fragment offset  in 8-byte units; != 0 means "not the first"
         8   1 B  time to live     decremented once per hop (TTL)
         9   1 B  protocol         1 ICMP, 6 TCP, 17 UDP, ...
        10   2 B  header checksum  over the header only (not the payload)
        12   4 B  source address
        16   4 B  destination address
        20  ...   options          (ihl - 5) * 4 bytes

All multi-byte fields are big-endian ("network order").

An ICMP error (RFC 792) that the engine generates::

    offset  size  field
    ------  ----  -------------------------------------------------------
         0   1 B  type             3 destination unreachable, 11 time exceeded
         1   1 B  code             0 (net unreachable / TTL exceeded in transit)
         2   2 B  checksum         over the whole ICMP message
         4   4 B  unused           zero
         8  ...   quote            the offender's first min(len, ihl*4 + 8) bytes

It travels in a fresh IPv4 header: 0x45, tos 0, id 0, no flags, TTL 64,
protocol 1, source = the TUN address, destination = the offender's source.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .contract import ICMP_TTL

# --- constants ---------------------------------------------------------------

HEADER_MIN = 20             # ihl 5
HEADER_MAX = 60             # ihl 15
PROTO_ICMP = 1
PROTO_TCP = 6
PROTO_UDP = 17
FLAG_DF = 0x4000
FLAG_MF = 0x2000
FRAG_OFFSET_MASK = 0x1FFF

ICMP_ECHO_REPLY = 0
ICMP_DEST_UNREACH = 3
ICMP_SOURCE_QUENCH = 4
ICMP_REDIRECT = 5
ICMP_ECHO_REQUEST = 8
ICMP_TIME_EXCEEDED = 11
ICMP_PARAM_PROBLEM = 12
#: ICMP types that report an error; no error is ever sent about one of these.
ICMP_ERROR_TYPES = frozenset({ICMP_DEST_UNREACH, ICMP_SOURCE_QUENCH, ICMP_REDIRECT,
                              ICMP_TIME_EXCEEDED, ICMP_PARAM_PROBLEM})
ICMP_HEADER = 8
ICMP_QUOTE_PAYLOAD = 8      # payload bytes quoted after the offender's header

# version/ihl, tos, tot_len, id, flags+frag, ttl, proto, checksum, src, dst
_HEADER = struct.Struct("!BBHHHBBH4s4s")
_ICMP_HEADER = struct.Struct("!BBHI")
PROTO_NAMES = {PROTO_ICMP: "icmp", PROTO_TCP: "tcp", PROTO_UDP: "udp"}


# --- checksums ---------------------------------------------------------------

def checksum(data) -> int:
    """The internet checksum (RFC 1071) of ``data``, as the 16-bit value to
    store big-endian: the one's complement of the one's-complement sum of the
    16-bit words, an odd last byte padded with a zero byte.

    Over a header whose checksum field is already filled in, the result is 0
    when that checksum is right (see :func:`header_checksum_ok`).
    """
    data = bytes(data)
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:                      # fold the carries back in
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def header_checksum_ok(packet) -> bool:
    """True if the IPv4 header checksum of ``packet`` is valid."""
    ihl = (packet[0] & 0x0F) * 4
    return checksum(bytes(packet[:ihl])) == 0


def ttl_decrement_checksum(check: int, ttl: int, proto: int) -> int:
    """The header checksum after TTL -> TTL - 1, patched incrementally
    (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')), exactly as dataplane.h
    writes it. ``m`` is the 16-bit word holding TTL and protocol."""
    old = ttl << 8 | proto
    new = (ttl - 1) << 8 | proto
    s = (~check & 0xFFFF) + (~old & 0xFFFF) + new
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def decrement_ttl(packet: bytearray) -> None:
    """TTL - 1 in place, with the incremental checksum update. TTL must be
    at least 1 (the engines never forward a packet whose TTL is <= 1)."""
    ttl, proto = packet[8], packet[9]
    check = packet[10] << 8 | packet[11]
    check = ttl_decrement_checksum(check, ttl, proto)
    packet[8] = ttl - 1
    packet[10] = check >> 8
    packet[11] = check & 0xFF


# --- parsing -----------------------------------------------------------------

@dataclass(frozen=True)
class IPv4Header:
    """One decoded IPv4 header (addresses as IPv4Address)."""
    version: int
    ihl: int                # in 32-bit words
    tos: int
    tot_len: int
    ident: int
    flags: int              # the 3 flag bits, 0..7 (DF = 2, MF = 1)
    frag_offset: int        # in 8-byte units
    ttl: int
    proto: int
    checksum: int
    src: ipaddress.IPv4Address
    dst: ipaddress.IPv4Address
    options: bytes

    @property
    def header_len(self) -> int:
        return self.ihl * 4

    @property
    def is_later_fragment(self) -> bool:
        return self.frag_offset != 0

    @property
    def dont_fragment(self) -> bool:
        return bool(self.flags & 2)

    @property
    def more_fragments(self) -> bool:
        return bool(self.flags & 1)


def parse(packet) -> IPv4Header:
    """Decode the IPv4 header at the start of ``packet``. Raises ValueError if
    fewer than 20 bytes or the header does not fit; nothing else is checked,
    so a wrong version or length can still be looked at."""
    packet = bytes(packet)
    if len(packet) < HEADER_MIN:
        raise ValueError(f"{len(packet)} bytes: shorter than an IPv4 header")
    vihl, tos, tot_len, ident, ffo, ttl, proto, check, src, dst = _HEADER.unpack_from(packet)
    ihl = vihl & 0x0F
    if ihl * 4 > len(packet):
        raise ValueError(f"ihl {ihl} ({ihl * 4} bytes) longer than the packet ({len(packet)})")
    return IPv4Header(version=vihl >> 4, ihl=ihl, tos=tos, tot_len=tot_len, ident=ident,
                      flags=ffo >> 13, frag_offset=ffo & FRAG_OFFSET_MASK, ttl=ttl,
                      proto=proto, checksum=check, src=ipaddress.IPv4Address(src),
                      dst=ipaddress.IPv4Address(dst),
                      options=packet[HEADER_MIN:max(ihl * 4, HEADER_MIN)])


def describe(packet) -> str:
    """One line for humans, e.g. ``10.5.1.2 > 10.5.2.3 udp ttl 63 len 84``."""
    try:
        h = parse(packet)
    except ValueError as e:
        return f"<{e}>"
    if h.version != 4:
        return f"<not IPv4: version {h.version}, {len(packet)} bytes>"
    proto = PROTO_NAMES.get(h.proto, f"proto {h.proto}")
    extra = ""
    if h.proto == PROTO_ICMP and len(packet) > h.header_len + 1:
        extra = f" type {packet[h.header_len]} code {packet[h.header_len + 1]}"
    if h.frag_offset or h.more_fragments:
        extra += f" frag {h.frag_offset * 8}{'+' if h.more_fragments else ''}"
    return f"{h.src} > {h.dst} {proto}{extra} ttl {h.ttl} len {h.tot_len}"


def is_later_fragment(packet) -> bool:
    """True for a fragment other than the first (fragment offset != 0)."""
    return ((packet[6] << 8 | packet[7]) & FRAG_OFFSET_MASK) != 0


def is_icmp_error(packet) -> bool:
    """True if ``packet`` is ICMP and its type is an error type. An ICMP
    packet too short to carry a type is not known to be an error."""
    hl = (packet[0] & 0x0F) * 4
    return packet[9] == PROTO_ICMP and len(packet) > hl and packet[hl] in ICMP_ERROR_TYPES


def may_send_unreachable(packet) -> bool:
    """Net unreachable is never sent about ICMP (any type, as flanneld) nor
    about a fragment other than the first."""
    return packet[9] != PROTO_ICMP and not is_later_fragment(packet)


def may_send_time_exceeded(packet) -> bool:
    """Time exceeded is never sent about an ICMP error nor a later fragment;
    ICMP queries (echo request, ...) do get one (traceroute -I relies on it)."""
    return not is_later_fragment(packet) and not is_icmp_error(packet)


# --- building ----------------------------------------------------------------

def _addr(a) -> bytes:
    return ipaddress.IPv4Address(a).packed


def build(src, dst, payload: bytes = b"", *, proto: int = PROTO_UDP, ttl: int = 64,
          tos: int = 0, ident: int = 0, flags: int = 0, frag_offset: int = 0,
          options: bytes = b"", version: int = 4, ihl: int | None = None,
          tot_len: int | None = None, check: int | None = None) -> bytes:
    """An IPv4 packet with a correct checksum, unless a field is forced.

    ``options`` must be a multiple of 4 bytes. ``version``, ``ihl``,
    ``tot_len`` and ``check`` can be overridden to build malformed packets.
    """
    if len(options) % 4:
        raise ValueError("options must be a multiple of 4 bytes")
    if ihl is None:
        ihl = (HEADER_MIN + len(options)) // 4
    if tot_len is None:
        tot_len = HEADER_MIN + len(options) + len(payload)
    header = bytearray(_HEADER.pack(
        (version & 0x0F) << 4 | (ihl & 0x0F), tos, tot_len & 0xFFFF, ident,
        (flags & 7) << 13 | (frag_offset & FRAG_OFFSET_MASK), ttl, proto, 0,
        _addr(src), _addr(dst)) + options)
    if check is None:
        check = checksum(header)
    header[10:12] = check.to_bytes(2, "big")
    return bytes(header) + bytes(payload)


def udp_payload(sport: int, dport: int, data: bytes = b"") -> bytes:
    """A UDP header + data with a zero (= absent) checksum, to put in an IPv4 packet."""
    return struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data


def icmp_message(type_: int, code: int, rest: int = 0, data: bytes = b"") -> bytes:
    """An ICMP message with its checksum; ``rest`` is the 4-byte word after
    the checksum (id/seq for echo, unused for errors)."""
    msg = bytearray(_ICMP_HEADER.pack(type_, code, 0, rest) + data)
    msg[2:4] = checksum(msg).to_bytes(2, "big")
    return bytes(msg)


def echo_request(ident: int = 1, seq: int = 1, data: bytes = b"ping") -> bytes:
    """An ICMP echo request message (the IPv4 payload of a ping)."""
    return icmp_message(ICMP_ECHO_REQUEST, 0, ident << 16 | seq, data)


def quote_length(offender) -> int:
    """How many bytes of the offender an ICMP error quotes."""
    return min(len(offender), (offender[0] & 0x0F) * 4 + ICMP_QUOTE_PAYLOAD)


def icmp_error(offender, type_: int, code: int, src) -> bytes:
    """The complete IPv4 packet of an ICMP error about ``offender`` (the
    packet as read, before any TTL change), sent from ``src`` back to the
    offender's source, in the format of dataplane.h."""
    offender = bytes(offender)
    quote = offender[:quote_length(offender)]
    message = icmp_message(type_, code, 0, quote)
    return build(src, offender[12:16], message, proto=PROTO_ICMP, ttl=ICMP_TTL)
