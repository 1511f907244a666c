"""TUN -> UDP offloads of the C engine (DP_OFF_TUN_VNET, DP_OFF_UDP_GSO), no root.

The engine only read()s bytes from its TUN fd, so the harness's socketpair
stands in for a TUN opened with IFF_VNET_HDR: the test writes what the
kernel would hand over (a struct virtio_net_hdr, then a plain packet, a
packet with a partial checksum or a TSO/USO super-packet) and the peers'
UDP sockets record the datagrams. The wire format must not change: each
datagram is one IPv4 packet <= mtu with valid checksums, and it is byte for
byte what the Python engine (which has no offloads) sends when it is fed
the reference segmentation (tests/gso_packets.py) as plain packets.
"""
from __future__ import annotations

import errno
import random
import socket
import struct

import pytest

from dataplane.engine import ipv4, ipv6
from dataplane.engine import OFF_TUN_VNET, OFF_UDP_GSO, Route, create_engine
from tests import gso_packets as gp
from tests.conftest import require, require_engine, wait_until
from tests.engine_harness import Harness, big_rcvbuf, expect_only

SRC, DST = "10.5.1.9", "10.5.2.7"
SRC6, DST6 = "fc00:5:0:1::9", "fc00:5:0:2::7"
ROUTED = ("10.5.2.0/24", "fc00:5:0:2::/64")
SO_NO_CHECK = 11          # <asm-generic/socket.h>: UDP sends without checksums


@pytest.fixture
def c_engine():
    require_engine("c")


def _harness(offloads: int, **kw) -> Harness:
    h = Harness("c", start=False, **kw)
    try:
        h.engine.set_offloads(offloads)
        h.peer = h.add_peer()
        h.set_routes([h.route(n, h.peer) for n in ROUTED], wait=False)
        h.engine.start()
    except BaseException:
        h.close()
        raise
    return h


def _python_reference(packets, *, mtu=1472) -> list[bytes]:
    """What the Python engine sends for these plain packets (the oracle)."""
    with Harness("python", mtu=mtu) as h:
        p = h.add_peer()
        h.set_routes([h.route(n, p) for n in ROUTED])
        h.inject_tun(*packets)
        h.settle()
        return list(p.received)


def _wait_read(h: Harness, tun_rx_packets: int) -> dict:
    h.wait_for(lambda st: st["tun_rx_packets"] >= tun_rx_packets,
               what=f"{tun_rx_packets} packets read")
    return h.settle()


def _data(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def test_python_engine_has_no_offloads():
    with Harness("python", start=False) as h:
        h.engine.set_offloads(0)
        with pytest.raises(OSError) as e:
            h.engine.set_offloads(OFF_TUN_VNET)
        assert e.value.errno == errno.EOPNOTSUPP


# ---- DP_OFF_TUN_VNET: plain packets and partial checksums ---------------------------

def test_vnet_plain_packets_as_without_offloads(c_engine):
    pkts = [gp.udp(SRC, DST, _data(n, n), ident=n) for n in (0, 1, 100, 1444)]
    with _harness(OFF_TUN_VNET) as h:
        for p in pkts:
            h.inject_tun(gp.vnet_hdr(flags=0) + p)
        st = _wait_read(h, len(pkts))
        assert h.peer.received == _python_reference(pkts)
        n = sum(map(len, pkts))
        expect_only(st, tun_rx_packets=4, tun_rx_bytes=n, udp_tx_packets=4, udp_tx_bytes=n)


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_vnet_needs_csum_is_completed(c_engine, proto):
    rnd = random.Random(5)
    full = []
    for i in range(20):
        data = _data(rnd.randrange(0, 1400), i)
        full.append(gp.tcp(SRC, DST, data, seq=i * 7919, ident=i) if proto == "tcp"
                    else gp.udp(SRC, DST, data, ident=i))
    with _harness(OFF_TUN_VNET) as h:
        for p in full:
            off = 16 if proto == "tcp" else 6
            h.inject_tun(gp.vnet_hdr(csum_offset=off) + gp.partial_checksum(p))
        _wait_read(h, len(full))
        got = h.peer.received
    assert len(got) == len(full)
    for p in got:
        gp.check_wire_packet(p, 1472)
    # the completed checksum is the one computed from scratch
    assert got == _python_reference(full)


@pytest.mark.parametrize("start,offset", [(10, 16), (20, 2000), (1600, 0), (19, 0), (20, 15)])
def test_vnet_needs_csum_out_of_range_is_malformed(c_engine, start, offset):
    p = gp.partial_checksum(gp.tcp(SRC, DST, b"x" * 100))
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(csum_start=start, csum_offset=offset) + p)
        st = _wait_read(h, 1)
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(p), drop_malformed=1)


# ---- DP_OFF_TUN_VNET: TSO and USO super-packets ---------------------------------------

def _tso(payload: bytes, *, flags=gp.ACK | gp.PSH | gp.FIN | gp.CWR, seq=0xFFFFF000,
         ident=0xFFFE, options=b"\x01\x01\x08\x0a" + bytes(8)) -> bytes:
    # seq and id close to wrapping, so that both wrap inside the super-packet
    return gp.tcp(SRC, DST, payload, seq=seq, ident=ident, flags=flags, options=options,
                  tot_len=None)


def _check_tso_segments(got, sp: bytes, mss: int) -> None:
    """Each segment of super-packet sp a valid wire packet, seq + i * mss, CWR on the first
    only, FIN and PSH on the last only, and the payloads together sp's."""
    seq0 = gp.tcp_fields(sp)["seq"]
    for i, p in enumerate(got):
        gp.check_wire_packet(p, 1472)
        f = gp.tcp_fields(p)
        assert f["seq"] == (seq0 + i * mss) & 0xFFFFFFFF
        assert bool(f["flags"] & gp.CWR) == (i == 0)
        assert bool(f["flags"] & (gp.FIN | gp.PSH)) == (i == len(got) - 1)
        assert f["flags"] & gp.ACK
    assert b"".join(gp.tcp_fields(p)["payload"] for p in got) == gp.tcp_fields(sp)["payload"]


def test_tso_super_packet_is_cut_like_the_kernel(c_engine):
    mss = 1400
    sp = _tso(_data(10 * mss + 333))
    want = gp.segment(sp, mss)
    assert len(want) == 11
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, mss, hdr_len=52) + gp.partial_checksum(sp))
        st = _wait_read(h, len(want))
        got = h.peer.received
    assert got == _python_reference(want)
    _check_tso_segments(got, sp, mss)
    assert all(p[8] == 63 for p in got)                      # TTL - 1 on each
    assert [gp.tcp_fields(p)["id"] for p in got] == [(0xFFFE + i) & 0xFFFF for i in range(11)]
    n = sum(map(len, want))
    expect_only(st, tun_rx_packets=11, tun_rx_bytes=n, udp_tx_packets=11, udp_tx_bytes=n,
                tun_rx_gso=1)


def test_tso_super_packet_with_ip_options(c_engine):
    """An IPv4 header of 40 bytes (20 of options) is cut as IPv4 (tot_len, id + i, header
    checksum), not taken for IPv6's 40-byte header."""
    mss = 1000
    plain = _tso(_data(3 * mss + 7), options=b"")
    opts = b"\x01" * 19 + b"\x00"                    # NOPs, then end of options
    ip = bytearray(plain[:20] + opts)
    ip[0] = 0x4A
    ip[2:4] = struct.pack("!H", len(plain) + len(opts))
    ip[10:12] = b"\0\0"
    ip[10:12] = struct.pack("!H", ipv4.checksum(bytes(ip)))
    sp = bytes(ip) + plain[20:]                     # the TCP checksum is unchanged
    want = gp.segment(sp, mss)
    assert len(want) == 4 and all(w[0] == 0x4A for w in want)
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, mss, hdr_len=60, csum_start=40)
                     + gp.partial_checksum(sp))
        st = _wait_read(h, len(want))
        got = h.peer.received
    assert st["tun_rx_gso"] == 1 and st["udp_tx_packets"] == 4, {k: v for k, v in st.items() if v}
    for p in got:
        gp.check_wire_packet(p, 1472)
    assert [struct.unpack("!H", p[4:6])[0] for p in got] == [(0xFFFE + i) & 0xFFFF
                                                             for i in range(4)]
    assert got == _python_reference(want)


def test_uso_super_packet(c_engine):
    seg = 1000
    sp = gp.udp(SRC, DST, _data(7 * seg + 1), ident=77)
    want = gp.segment(sp, seg)
    assert [len(w) for w in want] == [1028] * 7 + [29]
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_UDP_L4, seg, csum_offset=6) + gp.partial_checksum(sp))
        st = _wait_read(h, len(want))
        got = h.peer.received
    for p in got:
        gp.check_wire_packet(p, 1472)
        assert struct.unpack("!H", p[24:26])[0] == len(p) - 20      # UDP length
    assert [struct.unpack("!H", p[4:6])[0] for p in got] == list(range(77, 85))
    assert got == _python_reference(want)
    assert st["tun_rx_gso"] == 1 and st["udp_tx_packets"] == 8


def test_tso_exactly_one_segment_and_bare_header(c_engine):
    one = _tso(_data(500), flags=gp.ACK | gp.PSH)
    bare = _tso(b"", flags=gp.ACK)
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, 1000) + one, gp.vnet_hdr(gp.GSO_TCPV4, 1000) + bare)
        st = _wait_read(h, 2)
        assert h.peer.received == _python_reference([one, bare])
    assert st["tun_rx_gso"] == 2 and st["udp_tx_packets"] == 2


def test_tiny_gso_size_yields_hundreds_of_segments(c_engine):
    """More segments than the batch has slots: the engine sends what it has
    queued and goes on cutting; nothing lost, order kept."""
    sp = _tso(_data(4000), options=b"")
    want = gp.segment(sp, 8)
    assert len(want) == 500
    with _harness(OFF_TUN_VNET | OFF_UDP_GSO, batch=16) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, 8) + sp)
        h.inject_tun(gp.vnet_hdr(flags=0) + gp.udp(SRC, DST, b"after"))
        st = _wait_read(h, 501)
        got = h.peer.received
    assert got[:500] == _python_reference(want)
    assert gp.udp(SRC, DST, b"after")[28:] == got[500][28:]
    assert st["udp_tx_packets"] == 501 and st["tun_rx_gso"] == 1
    assert st["drop_send_error"] == 0


def test_plain_packets_behind_a_super_packet_in_one_batch(c_engine):
    """A backlog (the TUN full while no engine read it: a restart, a crash): a super-packet
    whose segments leave slots queued, then more plain packets than the slots left. Each read
    must land in a slot of the batch: none lost, none written past the send buffer."""
    sp = _tso(_data(5 * 1000), options=b"")
    segments = gp.segment(sp, 1000)
    plain = [gp.udp(SRC, DST, _data(100, i), ident=i) for i in range(40)]
    h = Harness("c", start=False, batch=16)
    try:
        h.engine.set_offloads(OFF_TUN_VNET)
        h.peer = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", h.peer)], wait=False)
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, 1000) + sp,
                     *[gp.vnet_hdr(flags=0) + p for p in plain])
        h.engine.start()                    # its first batch: all of it waiting
        st = _wait_read(h, len(segments) + len(plain))
        got = h.peer.received
    finally:
        h.close()
    assert got == _python_reference(segments + plain)
    assert st["udp_tx_packets"] == len(segments) + len(plain) and st["drop_send_error"] == 0


def test_segments_meet_route_and_ttl_checks_one_by_one(c_engine):
    """A super-packet without a route: every segment is a drop_no_route and
    gets its ICMP error, as the same packets read one by one would."""
    sp = gp.tcp(SRC, "10.5.9.9", _data(3000), ttl=64)
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV4, 1000) + sp)
        st = _wait_read(h, 3)
        icmp = h.take_tun()
    want = gp.segment(sp, 1000)
    expect_only(st, tun_rx_packets=3, tun_rx_bytes=sum(map(len, want)), drop_no_route=3,
                icmp_unreach_sent=3, tun_rx_gso=1)
    # written back with DP_OFF_TUN_VNET's plain header, each quoting its own segment
    assert len(icmp) == 3
    for e, w in zip(icmp, want):
        assert e[:10] == bytes(10)
        assert e[10 + 28:] == w[:28]


def _bad(**over):
    sp = _tso(_data(3000), options=b"")
    args = dict(gso_type=gp.GSO_TCPV4, gso_size=1000, flags=gp.F_NEEDS_CSUM, csum_start=20,
                csum_offset=16)
    pkt = over.pop("pkt", sp)
    args.update(over)
    return gp.vnet_hdr(args.pop("gso_type"), args.pop("gso_size"), **args) + pkt


MALFORMED = {
    "gso_size 0": _bad(gso_size=0),
    "segment over mtu": _bad(gso_size=1433),
    "ECN not asked for": _bad(gso_type=gp.GSO_TCPV4 | gp.GSO_ECN),
    "unknown type": _bad(gso_type=2),
    "UFO": _bad(gso_type=gp.GSO_UDP),
    "TCPV6 on IPv4": _bad(gso_type=gp.GSO_TCPV6),
    "csum_start not the TCP header": _bad(csum_start=24),
    "csum_offset not TCP's": _bad(csum_offset=6),
    "TCPV4 on UDP": _bad(pkt=gp.udp(SRC, DST, _data(3000))),
    "USO on TCP": _bad(gso_type=gp.GSO_UDP_L4, csum_offset=6),
    "tot_len short": _bad(pkt=gp.tcp(SRC, DST, _data(3000), tot_len=2000)),
    "a fragment": _bad(pkt=gp.tcp(SRC, DST, _data(3000), ip_flags=1)),
    "TCP header cut": _bad(pkt=ipv4.build(SRC, DST, bytes(12), proto=gp.PROTO_TCP)),
    "TCP data offset < 5": _bad(pkt=ipv4.build(SRC, DST, bytes(12) + b"\x40" + bytes(99),
                                               proto=gp.PROTO_TCP)),
    "shorter than IPv4": _bad(pkt=bytes(12)),
}


def test_tso6_super_packet_is_cut_like_the_kernel(c_engine):
    """TCPV6: each segment its own payload length, no id, the checksum over RFC 8200's
    pseudo-header; class and flow label kept (the kernel copies the header)."""
    mss = 1400
    sp = gp.tcp6(SRC6, DST6, _data(4 * mss + 77), seq=0xFFFFF000, flags=gp.ACK | gp.PSH | gp.FIN
                 | gp.CWR, options=b"\x01\x01\x08\x0a" + bytes(8), traffic_class=0x28,
                 flow_label=0xABCDE)
    want = gp.segment(sp, mss)
    assert len(want) == 5
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV6, mss, hdr_len=72, csum_start=40)
                     + gp.partial_checksum(sp))
        st = _wait_read(h, len(want))
        got = h.peer.received
    assert got == _python_reference(want)
    _check_tso_segments(got, sp, mss)
    assert all(p[:4] == sp[:4] and p[7] == 63 for p in got)  # class/flow kept, hop limit - 1
    n = sum(map(len, want))
    expect_only(st, tun_rx_packets=5, tun_rx_bytes=n, udp_tx_packets=5, udp_tx_bytes=n,
                tun_rx_gso=1)


def test_uso6_super_packet_and_tso6_bare_header(c_engine):
    seg = 1000
    sp = gp.udp6(SRC6, DST6, _data(3 * seg + 1))
    bare = gp.tcp6(SRC6, DST6, b"", flags=gp.ACK)
    want = gp.segment(sp, seg) + [bare]
    assert [len(w) for w in want] == [1048] * 3 + [49, 60]
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_UDP_L4, seg, csum_start=40, csum_offset=6)
                     + gp.partial_checksum(sp),
                     gp.vnet_hdr(gp.GSO_TCPV6, seg, csum_start=40) + gp.partial_checksum(bare))
        st = _wait_read(h, len(want))
        got = h.peer.received
    for p in got[:4]:
        gp.check_wire_packet(p, 1472)
        assert struct.unpack("!H", p[44:46])[0] == len(p) - 40      # UDP length
    assert got == _python_reference(want)
    assert st["tun_rx_gso"] == 2 and st["udp_tx_packets"] == 5


def _bad6(**over):
    sp = gp.tcp6(SRC6, DST6, _data(3000))
    args = dict(gso_type=gp.GSO_TCPV6, gso_size=1000, flags=gp.F_NEEDS_CSUM, csum_start=40,
                csum_offset=16)
    pkt = over.pop("pkt", sp)
    args.update(over)
    return gp.vnet_hdr(args.pop("gso_type"), args.pop("gso_size"), **args) + pkt


MALFORMED.update({
    "TCPV4 on IPv6": _bad6(gso_type=gp.GSO_TCPV4),
    "UFO on IPv6": _bad6(gso_type=gp.GSO_UDP),
    "ECN on IPv6": _bad6(gso_type=gp.GSO_TCPV6 | gp.GSO_ECN),
    "csum_start in the IPv6 header": _bad6(csum_start=20),
    "USO on TCP/IPv6": _bad6(gso_type=gp.GSO_UDP_L4, csum_offset=6),
    "TCPV6 on UDP/IPv6": _bad6(pkt=gp.udp6(SRC6, DST6, _data(3000)), csum_offset=6),
    "payload length short": _bad6(pkt=gp.tcp6(SRC6, DST6, _data(3000), payload_len=2000)),
    "a jumbogram's payload length 0": _bad6(pkt=gp.tcp6(SRC6, DST6, _data(3000), payload_len=0)),
    "an extension header first": _bad6(pkt=ipv6.build(SRC6, DST6, bytes(8) + gp.tcp6(
        SRC6, DST6, _data(3000))[40:], next_header=0)),
    "TCP header cut after IPv6": _bad6(pkt=ipv6.build(SRC6, DST6, bytes(12), next_header=gp.PROTO_TCP)),
    "shorter than IPv6": _bad6(pkt=gp.tcp6(SRC6, DST6)[:30]),
    "IPv6 segment over mtu": _bad6(gso_size=1413),
})


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_inconsistent_super_packet_is_malformed(c_engine, name):
    raw = MALFORMED[name]
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(raw)
        st = _wait_read(h, 1)
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(raw) - 10, drop_malformed=1,
                tun_rx_gso=1)


def test_super_packet_of_neither_version_is_not_ipv4(c_engine):
    bad = bytes([0x70]) + gp.tcp6(SRC6, DST6, _data(3000))[1:]
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(gp.GSO_TCPV6, 1000, csum_start=40) + bad)
        st = _wait_read(h, 1)
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=len(bad), drop_not_ipv4=1, tun_rx_gso=1)


def test_read_shorter_than_the_vnet_header(c_engine):
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(b"\0" * 6)
        st = _wait_read(h, 1)
    expect_only(st, tun_rx_packets=1, drop_malformed=1)


def test_plain_read_longer_than_mtu_is_cut_as_without_offloads(c_engine):
    big = gp.udp(SRC, DST, _data(1600))
    with _harness(OFF_TUN_VNET) as h:
        h.inject_tun(gp.vnet_hdr(flags=0) + big)
        st = _wait_read(h, 1)
    expect_only(st, tun_rx_packets=1, tun_rx_bytes=1472, drop_malformed=1)


# ---- DP_OFF_UDP_GSO: trains of datagrams ----------------------------------------------

def _burst(h: Harness, pkts) -> dict:
    """Everything written before the loop starts: the first batches are full."""
    h.inject_tun(*pkts)
    h.engine.start()
    return _wait_read(h, len(pkts))


def test_udp_gso_trains_keep_every_datagram(c_engine):
    rnd = random.Random(9)
    pkts = []
    for i in range(300):
        # runs of equal sizes, some shorter ones closing a train, two peers
        size = (1200, 1200, 1200, 800, 1472, 28)[min(5, (i // 7) % 8)]
        dst = DST if i % 50 < 40 else "10.5.3.3"
        pkts.append(gp.udp(SRC, dst, _data(size - 28, i), ident=i))
    rnd.shuffle(pkts[250:])
    h = Harness("c", start=False, batch=64)
    with h:
        h.engine.set_offloads(OFF_UDP_GSO)
        p1, p2 = h.add_peer(), h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p1), h.route("10.5.3.0/24", p2)], wait=False)
        st = _burst(h, pkts)
        got1, got2 = list(p1.received), list(p2.received)
    with Harness("python") as ref:
        r1, r2 = ref.add_peer(), ref.add_peer()
        ref.set_routes([ref.route("10.5.2.0/24", r1), ref.route("10.5.3.0/24", r2)])
        ref.inject_tun(*pkts)
        ref.settle()
        assert got1 == r1.received and got2 == r2.received
    n = sum(map(len, pkts))
    assert st["udp_tx_packets"] == 300 and st["udp_tx_bytes"] == n
    assert st["udp_tx_gso"] > 0 and st["udp_sends"] < 300 // 2
    assert st["drop_send_error"] == 0


def test_udp_gso_train_limits(c_engine):
    """100 equal datagrams to one peer in one batch: trains of at most 64
    segments and 65000 bytes, so 1472-byte ones go 44 to a train."""
    pkts = [gp.udp(SRC, DST, _data(1444, i), ident=i) for i in range(100)]
    with Harness("c", start=False, batch=100) as h:
        h.engine.set_offloads(OFF_UDP_GSO)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)], wait=False)
        st = _burst(h, pkts)
        assert [q[4:6] for q in p.received] == [q[4:6] for q in pkts]
    assert st["tx_batches"] == 1 and st["udp_sends"] == 1
    assert st["udp_tx_gso"] == 3           # 44 + 44 + 12


def test_udp_gso_einval_resends_that_train_and_keeps_gso(c_engine):
    """SO_NO_CHECK makes the kernel refuse UDP_SEGMENT with EINVAL, as a
    segment over one peer's path MTU does on older kernels: that train goes
    again datagram by datagram, counted, and GSO stays on - once the socket
    checksums again, trains go out again."""
    first = [gp.udp(SRC, DST, _data(1000, i), ident=i) for i in range(150)]
    then = [gp.udp(SRC, DST, _data(1000, i), ident=1000 + i) for i in range(100)]
    with Harness("c", start=False) as h:
        h.udp.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        h.engine.set_offloads(OFF_UDP_GSO)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)], wait=False)
        st = _burst(h, first)
        assert [q[4:6] for q in p.received] == [q[4:6] for q in first]
        assert st["udp_tx_packets"] == 150 and st["drop_send_error"] == 0
        assert st["udp_tx_gso"] == 0
        # every batch held a train of >= 2, and each was refused and resent
        assert st["udp_gso_fallbacks"] >= st["tx_batches"] >= 3, st
        assert h.engine.offloads_in_use() == OFF_UDP_GSO
        h.udp.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 0)
        h.inject_tun(*then)
        st2 = _wait_read(h, 250)
        assert [q[4:6] for q in p.received[150:]] == [q[4:6] for q in then]
    assert st2["udp_tx_packets"] == 250 and st2["drop_send_error"] == 0
    assert st2["udp_tx_gso"] > 0 and st2["udp_gso_fallbacks"] == st["udp_gso_fallbacks"]


UDPLITE = 136             # IPPROTO_UDPLITE: the kernel refuses UDP_SEGMENT on it with EIO


def _udplite(bind=True) -> socket.socket:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, UDPLITE)
    except OSError as e:
        require(False, f"a kernel with UDP-Lite, to make UDP_SEGMENT fail with EIO ({e})")
    if bind:
        s.bind(("127.0.0.1", 0))
    return s


def test_udp_gso_eio_turns_gso_off_for_good(engine_kind):
    """EIO is the kernel's "no segmentation on this path" (udp_send_skb():
    UDP-Lite, IPsec; on older kernels also a device without tx checksumming).
    A UDP-Lite socket as the engine's makes every UDP_SEGMENT send fail so:
    the C engine resends that train plain, counts it, and sends plain from
    then on (offloads_in_use() without OFF_UDP_GSO); nothing is lost. The
    Python engine has no offloads: the same datagrams, its counters 0."""
    pkts = [gp.udp(SRC, DST, _data(900, i), ident=i) for i in range(200)]
    tun_engine, tun_test = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    tun_test.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)     # the whole burst
    udp, peer = _udplite(), _udplite()
    big_rcvbuf(peer)
    peer.settimeout(5)
    engine = create_engine(engine_kind, tun_fd=tun_engine.fileno(), udp_fd=udp.fileno(),
                           tun_addr="10.5.1.0", mtu=1472, batch=64)
    try:
        offloads = OFF_UDP_GSO if engine_kind == "c" else 0
        engine.set_offloads(offloads)
        engine.set_routes([Route.make("10.5.2.0/24", *peer.getsockname())])
        for p in pkts:
            tun_test.send(p)
        engine.start()
        got = [peer.recv(2000) for _ in pkts]
        assert [g[4:6] for g in got] == [q[4:6] for q in pkts]
        # the peer can read a batch before the engine has counted it
        def counted():
            st = engine.stats()
            return st if st["udp_tx_packets"] >= 200 else None
        st = wait_until(counted, 5, 0.01, "the engine to count the 200 datagrams sent")
        in_use = engine.offloads_in_use()
    finally:
        engine.close()
        for s in (tun_engine, tun_test, udp, peer):
            s.close()
    assert st["udp_tx_packets"] == 200 and st["drop_send_error"] == 0
    assert st["udp_tx_gso"] == 0 and in_use == 0
    # one refused train, then plain sends only: GSO was not tried again
    assert st["udp_gso_fallbacks"] == (1 if engine_kind == "c" else 0), st


def test_udp_gso_train_to_unreachable_peer_counts_each(c_engine):
    """A train whose send fails for another reason is sent again plain:
    each datagram is counted in drop_send_error, as without GSO."""
    pkts = [gp.udp(SRC, DST, _data(500, i)) for i in range(10)]
    with Harness("c", start=False) as h:
        h.engine.set_offloads(OFF_UDP_GSO)
        # a broadcast address without SO_BROADCAST: EACCES on every send
        h.engine.set_routes([Route.make("10.5.2.0/24", "255.255.255.255", 9)])
        st = _burst(h, pkts)
        in_use = h.engine.offloads_in_use()
    expect_only(st, tun_rx_packets=10, tun_rx_bytes=sum(map(len, pkts)), drop_send_error=10,
                udp_gso_fallbacks=1, route_swaps=st["route_swaps"])
    assert in_use == OFF_UDP_GSO                # EACCES is about that peer, not about GSO
