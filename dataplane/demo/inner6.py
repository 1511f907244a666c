"""An inner IPv6 packet's first bytes, as the demo shows them (``demo --ipv6``).

The engines' trace events hold a packet's first 64 bytes (``head``) whatever its family: for
an IPv6 packet that is its fixed header (40 bytes) and the start of what follows. This decodes
them into the same shape as trace.decode_packet gives an IPv4 header, so that following a
packet through the rings does not care about the family: ``ttl`` is the hop limit (the field a
router decrements in either), ``id`` is None (IPv6 has no identification field: ``flow_key``
ties the two sides of a leg together by the ICMPv6 echo's id and sequence, or the ports).
"""
from __future__ import annotations

import struct

from ..engine import ipv6

ICMPV6_NAMES = {128: "echo request", 129: "echo reply", 1: "unreachable",
                2: "packet too big", 3: "time exceeded"}


def decode(head: bytes, length: int | None = None) -> dict:
    """The IPv6 header (and the UDP ports / ICMPv6 type, id, seq) of a packet's first bytes;
    ValueError when fewer than 40 bytes."""
    h = ipv6.parse(head)
    upper = ipv6.upper_layer(head)
    proto, off = upper if upper is not None else (h.next_header, ipv6.HEADER_LEN)
    out = {"version": h.version, "header_len": ipv6.HEADER_LEN, "traffic_class": h.traffic_class,
           "flow_label": h.flow_label, "payload_len": h.payload_len,
           "tot_len": ipv6.HEADER_LEN + h.payload_len, "id": None, "ttl": h.hop_limit,
           "hop_limit": h.hop_limit,
           "proto": ipv6.PROTO_NAMES.get(proto, str(proto)),
           "src": str(h.src), "dst": str(h.dst), "summary": ipv6.describe(head)}
    l4 = bytes(head[off:off + 8])
    if proto == ipv6.NH_UDP and len(l4) >= 8:
        sport, dport, ulen, _ = struct.unpack("!HHHH", l4)
        out["udp"] = {"sport": sport, "dport": dport, "len": ulen}
    elif proto == ipv6.NH_ICMPV6 and len(l4) >= 8:
        typ, code, _, ident, seq = struct.unpack("!BBHHH", l4)
        out["icmp"] = {"type": typ, "code": code, "id": ident, "seq": seq,
                       "name": ICMPV6_NAMES.get(typ, f"type {typ}")}
    if length is not None:
        out["len"] = length
    return out


def flow_key(pkt: dict):
    """What ties a packet seen on the sender to the same one on the receiver: the IPv4 id, or
    for IPv6 the ICMPv6 echo's (id, seq), else the UDP ports, with the flow label."""
    if pkt.get("version") != 6:
        return pkt.get("id")
    icmp, udp = pkt.get("icmp"), pkt.get("udp")
    if icmp:
        return ("icmp", icmp["type"], icmp["id"], icmp["seq"])
    if udp:
        return ("udp", udp["sport"], udp["dport"], pkt["flow_label"])
    return ("flow", pkt["flow_label"], pkt["payload_len"])
