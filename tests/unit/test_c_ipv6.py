"""Inner IPv6 and the C engine's offloads (dataplane.h, "IPv6 inner packets" and "Offloads").

The offloads are the C engine's alone, so these are not cross-engine tests: a partial checksum
on a plain IPv6 read is finished as on IPv4 (csum_start past the 40-byte fixed header), an IPv6
USO super-packet is cut into datagrams, and TUN GRO coalesces IPv6 runs into TCPV6 / UDP_L4
writes (the thorough cases: test_engine_offload_tx.py, test_engine_offload_rx.py).
The checksums here are computed from scratch over RFC 8200's pseudo-header.
"""
from __future__ import annotations

import ipaddress
import struct

import pytest

from dataplane.engine import OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO
from tests.conftest import require_engine
from tests.engine_harness import Harness, expect_only

SRC6, DST6 = "fc00:5:0:1::9", "fc00:5:0:2::7"
NEEDS_CSUM, GSO_NONE, GSO_TCPV6, GSO_UDP_L4 = 1, 0, 4, 5
VNET = struct.Struct("=BBHHHH")      # struct virtio_net_hdr, host order (the TUN default)
TCP, UDP = 6, 17


@pytest.fixture(autouse=True)
def c_engine():
    require_engine("c")


def _sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _pseudo6(src: str, dst: str, nh: int, length: int) -> bytes:
    return (ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed
            + struct.pack("!IxxxB", length, nh))


def v6(l4: bytes, nh: int, src: str = SRC6, dst: str = DST6, hop: int = 64) -> bytes:
    return (struct.pack("!IHBB", 6 << 28, len(l4), nh, hop) + ipaddress.IPv6Address(src).packed
            + ipaddress.IPv6Address(dst).packed + l4)


def udp6(payload: bytes, *, partial: bool = False, **kw) -> bytes:
    """UDP/IPv6 with its checksum complete, or (partial) holding the folded pseudo-header sum
    as the kernel hands it with NEEDS_CSUM."""
    n = 8 + len(payload)
    src, dst = kw.get("src", SRC6), kw.get("dst", DST6)
    ph = _pseudo6(src, dst, UDP, n)
    if partial:
        c = _sum(ph)
    else:
        c = ~_sum(ph + struct.pack("!HHHH", 4000, 5000, n, 0) + payload) & 0xFFFF or 0xFFFF
    return v6(struct.pack("!HHHH", 4000, 5000, n, c) + payload, UDP, **kw)


def tcp6(seq: int, payload: bytes) -> bytes:
    """A TCP/IPv6 ACK segment of one flow with a valid checksum: what IPv4 GRO would join."""
    hdr = struct.pack("!HHIIBBHHH", 40000, 5201, seq, 7777, 5 << 4, 0x10, 501, 0, 0)
    c = ~_sum(_pseudo6(SRC6, DST6, TCP, len(hdr) + len(payload)) + hdr + payload) & 0xFFFF
    return v6(hdr[:16] + struct.pack("!H", c) + hdr[18:] + payload, TCP)


def _vnet(gso_type=GSO_NONE, gso_size=0, *, flags=NEEDS_CSUM, csum_start=40, csum_offset=6):
    return VNET.pack(flags, gso_type, 0, gso_size, csum_start, csum_offset)


def _tx(offloads: int) -> Harness:
    h = Harness("c", start=False)
    try:
        h.engine.set_offloads(offloads)
        h.peer = h.add_peer()
        h.set_routes([h.route("fc00:5:0:2::/64", h.peer)], wait=False)
        h.engine.start()
    except BaseException:
        h.close()
        raise
    return h


def _hop_decremented(pkt: bytes) -> bytes:
    return pkt[:7] + bytes([pkt[7] - 1]) + pkt[8:]


def test_partial_checksum_of_an_ipv6_read_is_completed():
    payloads = [bytes((i * 7 + j) % 256 for j in range(n))
                for i, n in enumerate([0, 1, 2, 701, 1400])]
    full = [udp6(d) for d in payloads]
    partial = [udp6(d, partial=True) for d in payloads]
    with _tx(OFF_TUN_VNET) as h:
        h.inject_tun(*(_vnet() + p for p in partial))
        h.wait_for(lambda st: st["udp_tx_packets"] >= len(full), what="all sent")
        st = h.settle()
        got = h.peer.received
    assert got == [_hop_decremented(p) for p in full]
    n = sum(map(len, full))
    expect_only(st, tun_rx_packets=len(full), tun_rx_bytes=n, udp_tx_packets=len(full),
                udp_tx_bytes=n)


@pytest.mark.parametrize("start,offset", [(20, 6), (39, 7), (40, 2000), (40, 7)])
def test_partial_checksum_inside_the_ipv6_header_or_out_of_range_is_malformed(start, offset):
    p = udp6(b"x" * 100, partial=True)
    with _tx(OFF_TUN_VNET) as h:
        h.inject_tun(_vnet(csum_start=start, csum_offset=offset) + p)
        h.wait_for(lambda st: st["tun_rx_packets"] >= 1, what="read")
        st = h.settle()
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(p), drop_malformed=1)


def test_ipv6_uso_super_packet_is_cut_into_datagrams():
    payload = bytes(i % 251 for i in range(2500))
    p = udp6(payload, partial=True)
    with _tx(OFF_TUN_VNET) as h:
        h.inject_tun(_vnet(GSO_UDP_L4, 1000) + p)
        h.wait_for(lambda st: st["udp_tx_packets"] >= 3, what="three datagrams sent")
        st = h.settle()
        got = h.peer.received
    want = [_hop_decremented(udp6(payload[i:i + 1000])) for i in range(0, 2500, 1000)]
    assert got == want
    n = sum(map(len, want))
    expect_only(st, tun_rx_packets=3, tun_rx_bytes=n, tun_rx_gso=1, udp_tx_packets=3,
                udp_tx_bytes=n)


def test_tun_gro_coalesces_ipv6():
    flow = [tcp6(1000 + i * 500, bytes([i]) * 500) for i in range(6)]
    dgrams = [udp6(bytes([i]) * 300) for i in range(4)]
    sent = flow + dgrams
    with Harness("c", start=False) as h:
        h.engine.set_offloads(OFF_TUN_VNET | OFF_UDP_GRO | OFF_TUN_GRO | OFF_TUN_GRO_UDP)
        p = h.add_peer()
        h.set_routes([h.route("fc00:5:0:1::/64", p)], wait=False)
        h.inject_udp(p, *sent)
        h.engine.start()
        st = h.wait_for(lambda st: st["tun_tx_packets"] >= len(sent) and h.outputs()[0] >= 2,
                        what="all written")
        writes = h.take_tun()
    # One TCPV6 write and one UDP_L4 write, csum_start past the fixed header, the checksum
    # field holding the folded pseudo-header sum of the whole, the payloads in order.
    assert len(writes) == 2 and st["tun_tx_gso"] == 2 and st["tun_writes"] == 2
    for w, group, gso_type, hdr_len, size, nh, coff in (
            (writes[0], flow, GSO_TCPV6, 60, 500, TCP, 16),
            (writes[1], dgrams, GSO_UDP_L4, 48, 300, UDP, 6)):
        assert VNET.unpack_from(w) == (NEEDS_CSUM, gso_type, hdr_len, size, 40, coff)
        pkt = w[10:]
        assert pkt[:40] == _hop_decremented(v6(pkt[40:], nh))[:40]
        assert struct.unpack("!H", pkt[40 + coff:42 + coff])[0] == \
            _sum(_pseudo6(SRC6, DST6, nh, len(pkt) - 40))
        assert pkt[hdr_len:] == b"".join(g[hdr_len:] for g in group)
