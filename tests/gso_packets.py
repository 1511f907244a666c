"""TCP/UDP packets, virtio_net_hdr and reference segmentation for the offload tests.

What a TUN opened with IFF_VNET_HDR hands the engine (csrc/gso.c cuts it):
a 10-byte ``struct virtio_net_hdr`` in host byte order, then the packet; a
TSO/USO "super-packet" is one IPv4 packet of up to 64 KB whose payload is
cut into ``gso_size`` pieces; an IPv6 one (TCPV6, or UDP_L4) has TCP/UDP right after its
40-byte header. :func:`segment` is the reference cut (what the kernel's software GSO does),
written independently of the C code, so the Python engine fed its output is the oracle for the
wire bytes.
"""
from __future__ import annotations

import ipaddress
import struct

from dataplane.engine import ipv4, ipv6

VNET = struct.Struct("=BBHHHH")      # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
F_NEEDS_CSUM = 1
GSO_NONE, GSO_TCPV4, GSO_UDP, GSO_TCPV6, GSO_UDP_L4, GSO_ECN = 0, 1, 3, 4, 5, 0x80
FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = 1, 2, 4, 8, 16, 32, 64, 128
PROTO_TCP, PROTO_UDP = 6, 17


def vnet_hdr(gso_type=GSO_NONE, gso_size=0, *, flags=F_NEEDS_CSUM, hdr_len=0, csum_start=20,
             csum_offset=16) -> bytes:
    return VNET.pack(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)


def ip_header(p: bytes) -> tuple[int, int]:
    """(IP header length, TCP/UDP protocol) of an IPv4 packet or of an IPv6 one whose upper
    layer follows its fixed header."""
    if p[0] >> 4 == 6:
        return 40, p[6]
    return (p[0] & 15) * 4, p[9]


def _pseudo(p: bytes, length: int) -> bytes:
    if p[0] >> 4 == 6:
        return p[8:40] + struct.pack("!IxxxB", length, p[6])
    return p[12:20] + struct.pack("!BBH", 0, p[9], length)


def l4_checksum(ip_packet: bytes) -> int:
    """The TCP/UDP checksum over the pseudo-header (of either family) and the segment: 0 when
    the one stored is right."""
    ihl, _ = ip_header(ip_packet)
    seg = ip_packet[ihl:]
    return ipv4.checksum(_pseudo(ip_packet, len(seg)) + seg)


def partial_checksum(ip_packet: bytes) -> bytes:
    """The packet as the kernel hands it with NEEDS_CSUM: the L4 checksum
    field holds the folded pseudo-header sum, not the checksum."""
    ihl, proto = ip_header(ip_packet)
    off = ihl + (16 if proto == PROTO_TCP else 6)
    s = ~ipv4.checksum(_pseudo(ip_packet, len(ip_packet) - ihl)) & 0xFFFF
    return ip_packet[:off] + struct.pack("!H", s) + ip_packet[off + 2:]


def tcp(src, dst, payload=b"", *, sport=40000, dport=5001, seq=1000, ack=1, flags=ACK | PSH,
        window=502, options=b"", ident=1, ttl=64, ip_flags=2, tot_len=None, csum=True) -> bytes:
    """An IPv4/TCP packet with correct checksums (csum=False: TCP checksum 0)."""
    doff = (20 + len(options)) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack, doff << 4, flags,
                      window, 0, 0) + options
    pkt = ipv4.build(src, dst, hdr + payload, proto=PROTO_TCP, ttl=ttl, ident=ident,
                     flags=ip_flags, tot_len=tot_len)
    return _with_l4_checksum(pkt) if csum else pkt


def udp(src, dst, payload=b"", *, sport=4000, dport=5000, ident=1, ttl=64, ip_flags=0,
        length=None) -> bytes:
    """An IPv4/UDP packet with correct checksums."""
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload) if length is None else length, 0)
    pkt = ipv4.build(src, dst, hdr + payload, proto=PROTO_UDP, ttl=ttl, ident=ident,
                     flags=ip_flags)
    return _with_l4_checksum(pkt)


def tcp6(src, dst, payload=b"", *, sport=40000, dport=5001, seq=1000, ack=1, flags=ACK | PSH,
         window=502, options=b"", hop=64, traffic_class=0, flow_label=0, payload_len=None,
         csum=True) -> bytes:
    """An IPv6/TCP packet (TCP right after the fixed header) with a correct checksum."""
    doff = (20 + len(options)) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack, doff << 4, flags,
                      window, 0, 0) + options
    pkt = ipv6.build(src, dst, hdr + payload, next_header=PROTO_TCP, hop_limit=hop,
                     traffic_class=traffic_class, flow_label=flow_label,
                     payload_len=payload_len)
    return _with_l4_checksum(pkt) if csum else pkt


def udp6(src, dst, payload=b"", *, sport=4000, dport=5000, hop=64, traffic_class=0,
         flow_label=0, length=None) -> bytes:
    """An IPv6/UDP packet with a correct checksum."""
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload) if length is None else length, 0)
    pkt = ipv6.build(src, dst, hdr + payload, next_header=PROTO_UDP, hop_limit=hop,
                     traffic_class=traffic_class, flow_label=flow_label)
    return _with_l4_checksum(pkt)


def _with_l4_checksum(pkt: bytes) -> bytes:
    ihl, proto = ip_header(pkt)
    off = ihl + (16 if proto == PROTO_TCP else 6)
    pkt = pkt[:off] + b"\0\0" + pkt[off + 2:]
    c = l4_checksum(pkt)
    if proto == PROTO_UDP and c == 0:
        c = 0xFFFF
    return pkt[:off] + struct.pack("!H", c) + pkt[off + 2:]


def segment(super_packet: bytes, gso_size: int) -> list[bytes]:
    """The reference cut of a TSO/USO super-packet: what tcp_gso_segment /
    __udp_gso_segment put on the wire (IPv4: id + i, tot_len; IPv6: payload
    length; seq, FIN/PSH on the last only, CWR on the first only, full
    checksums)."""
    p = super_packet
    ihl, proto = ip_header(p)
    hlen = ihl + ((p[ihl + 12] >> 4) * 4 if proto == PROTO_TCP else 8)
    ident = struct.unpack("!H", p[4:6])[0]
    data = p[hlen:]
    pieces = [data[i:i + gso_size] for i in range(0, len(data), gso_size)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        ip = bytearray(p[:ihl])
        if p[0] >> 4 == 6:
            ip[4:6] = struct.pack("!H", hlen - 40 + len(piece))
        else:
            ip[2:4] = struct.pack("!H", hlen + len(piece))
            ip[4:6] = struct.pack("!H", (ident + i) & 0xFFFF)
            ip[10:12] = b"\0\0"
            ip[10:12] = struct.pack("!H", ipv4.checksum(ip))
        l4 = bytearray(p[ihl:hlen])
        if proto == PROTO_TCP:
            seq = struct.unpack("!I", l4[4:8])[0]
            l4[4:8] = struct.pack("!I", (seq + i * gso_size) & 0xFFFFFFFF)
            if i != len(pieces) - 1:
                l4[13] &= ~(FIN | PSH) & 0xFF
            if i != 0:
                l4[13] &= ~CWR & 0xFF
        else:
            l4[4:6] = struct.pack("!H", 8 + len(piece))
        out.append(_with_l4_checksum(bytes(ip) + bytes(l4) + piece))
    return out


def check_wire_packet(pkt: bytes, mtu: int) -> None:
    """One datagram as flanneld's wire format has it: exactly one IPv4 (or
    IPv6) packet of at most mtu bytes, with valid IP and (TCP/UDP) checksums."""
    assert len(pkt) <= mtu, f"{len(pkt)} > mtu {mtu}"
    if len(pkt) >= 40 and pkt[0] >> 4 == 6:
        assert struct.unpack("!H", pkt[4:6])[0] + 40 == len(pkt), "payload length != datagram"
        assert l4_checksum(pkt) == 0, f"bad L4 checksum in {ipv6.describe(pkt)}"
        return
    assert len(pkt) >= 20 and pkt[0] >> 4 == 4, pkt[:20].hex()
    assert struct.unpack("!H", pkt[2:4])[0] == len(pkt), "tot_len != datagram length"
    assert ipv4.header_checksum_ok(pkt), "bad IP header checksum"
    if pkt[9] in (PROTO_TCP, PROTO_UDP):
        if pkt[9] == PROTO_UDP and pkt[(pkt[0] & 15) * 4 + 6:][:2] == b"\0\0":
            return                                   # UDP without a checksum
        assert l4_checksum(pkt) == 0, f"bad L4 checksum in {ipv4.describe(pkt)}"


def tcp_fields(pkt: bytes) -> dict:
    """A TCP packet's fields; ``id`` is None for IPv6 (it has none)."""
    ihl, _ = ip_header(pkt)
    sport, dport, seq, ack, doff, flags = struct.unpack("!HHIIBB", pkt[ihl:ihl + 14])
    hlen = ihl + (doff >> 4) * 4
    if ihl == 40:
        ident, src, dst = None, ipaddress.IPv6Address(pkt[8:24]), ipaddress.IPv6Address(pkt[24:40])
    else:
        ident = struct.unpack("!H", pkt[4:6])[0]
        src, dst = ipaddress.IPv4Address(pkt[12:16]), ipaddress.IPv4Address(pkt[16:20])
    return {"sport": sport, "dport": dport, "seq": seq, "ack": ack, "flags": flags,
            "id": ident, "payload": pkt[hlen:], "src": str(src), "dst": str(dst)}


def reassemble(packets, sport: int | None = None, dport: int | None = None) -> bytes:
    """The byte stream of one TCP direction from its segments (any order,
    retransmissions allowed), from the SYN's sequence number on."""
    isn = None
    pieces = {}
    for p in packets:
        f = tcp_fields(p)
        if (sport is not None and f["sport"] != sport) or (dport is not None and f["dport"] != dport):
            continue
        if f["flags"] & SYN:
            isn = (f["seq"] + 1) & 0xFFFFFFFF
            continue
        if f["payload"]:
            pieces[f["seq"]] = f["payload"]
    assert isn is not None, "no SYN seen"
    out = bytearray()
    by_off = sorted((((s - isn) & 0xFFFFFFFF), d) for s, d in pieces.items())
    for off, d in by_off:
        assert off <= len(out), f"hole in the stream at {len(out)} (next piece at {off})"
        out += d[len(out) - off:]
    return bytes(out)
