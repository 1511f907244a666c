"""The kernel path's tc programs (csrc/bpf/flannel.bpf.c) against the Python engine, packet
by packet, through BPF_PROG_TEST_RUN: no device, no namespace.

Each packet goes through a program and through pypath.py (the oracle of the C engine's
differential tests too) with the same routes, own sources and rules. What the program
redirects, the engine forwards, and the bytes agree: the program's inner packet is the
engine's (TTL and checksum included) and its outer IPv4 + UDP headers carry what the
engine's socket sends (own PublicIP and port to the peer and port; id 0 and DF, TTL 64,
the UDP checksum: the kernel's choices for the engine), or over the IPv6 underlay its outer
IPv6 + UDP headers (own PublicIPv6 to the peer's, hop limit 64, the UDP checksum IPv6
requires, a flow label of the inner flow's). What
the program drops, the engine drops for the same reason; what it passes on is unchanged,
and the engine drops it, answers it, or forwards one of the rarities the program leaves
alone (IPv4 options, fragments). The counters move by maps.h's names. The path MTU's check
runs in a namespace of its own, whose device is as narrow as a path.

(Over 450 lines as one piece: every test runs the one loaded object, its fixture and the same
packet builders against the same oracle.)
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dataplane.engine import bpf_contract as bc
from dataplane.engine import ipv4, ipv6, pypath
from dataplane.engine.api import Local, Route
from dataplane.engine.pytable import RouteTable
from tests.conftest import require_bpf

OWN_IP, PEER, OTHER_PEER, STRANGER = "192.168.77.1", "192.168.77.2", "192.168.77.3", "192.168.77.9"
OWN_IP6, PEER6, STRANGER6 = "fd00:99::1", "fd00:99::2", "fd00:99::9"     # the IPv6 underlay
PORT, MTU = 8285, 1472
OWN_NET, OWN_NET6 = "10.5.1.0/24", "fd00:5:1::/64"
OWN_ADDR = "10.5.1.7"          # one of the host's own addresses (a bridge's, say)
ROUTES = [Route.make("10.5.2.0/24", PEER, PORT), Route.make("10.5.3.0/24", OTHER_PEER, PORT),
          Route.make("fd00:5:2::/64", PEER, PORT),
          Route.make("fd00:5:3::/64", OTHER_PEER, PORT, mtu=1300),
          # over the IPv6 underlay, whose headers cost 48 bytes (control/routes.py's mtu)
          Route.make("fd00:5:4::/64", PEER6, PORT, mtu=MTU + 28 - 48)]
TUN_IF, EXT_IF = 41, 42        # only stored: a test run redirects nowhere
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
OK, SHOT, REDIRECT = 0, 2, 7


def loaded(obj=None):
    """A KernelPath of ``obj`` (default: bpf_build.py's) with this module's state."""
    from dataplane.engine.bpf_path import KernelPath
    k = KernelPath(obj)
    k.set_devices(TUN_IF, EXT_IF, tun_l2=True, ext_l2=True)
    k.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=[OWN_NET, OWN_NET6],
                strict=True, own_ip6=OWN_IP6)
    k.set_routes(ROUTES)
    k.set_local([OWN_ADDR, "fd00:5:1::7"])
    return k


@pytest.fixture(scope="module")
def kp():
    require_bpf()
    with loaded() as k:
        yield k


def oracle() -> pypath.Path:
    """The Python engine's path with the program's state: the routes, own sources, the
    source check (no accept_any) and the strict rule."""
    pa = pypath.Path(ipaddress.IPv4Address("10.5.1.0").packed, accept_any=False)
    pa.routes = RouteTable(ROUTES)
    pa.local = pypath.own_sources((
        Local(int(ipaddress.IPv4Network(OWN_NET).network_address), 24,
              (int(ipaddress.IPv4Address(OWN_ADDR)),)),
        Local(int(ipaddress.IPv6Network(OWN_NET6).network_address), 64,
              (int(ipaddress.IPv6Address("fd00:5:1::7")),))))
    pa.strict_sources = True
    pypath.path_set_icmp_limit(pa, 0, 0)
    return pa


def frame(pkt: bytes, proto: int | None = None) -> bytes:
    if proto is None:
        proto = ETH_P_IPV6 if pkt and pkt[0] >> 4 == 6 else ETH_P_IP
    return bytes(range(1, 13)) + struct.pack("!H", proto) + pkt


def _sum(data: bytes) -> int:
    """The ones' complement sum of ``data``'s 16-bit words."""
    return ~ipv4.checksum(data) & 0xFFFF


def _pseudo(src, dst, proto: int, length: int) -> bytes:
    a, b = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
    return a + b + (struct.pack("!BBH", 0, proto, length) if len(a) == 4 else
                    struct.pack("!IxxxB", length, proto))


def udp_checksum(src, dst, segment: bytes) -> int:
    """The UDP checksum of ``segment`` (its field 0) from src to dst, as the kernel computes
    it for the engines' socket (a computed 0 sent as 0xffff)."""
    return ipv4.checksum(_pseudo(src, dst, 17, len(segment)) + segment) or 0xFFFF


def outer(inner: bytes, src=OWN_IP, dst=PEER, port=PORT, *, check: int | None = None,
          label: int = 0) -> bytes:
    """The outer headers the engines' datagram gets from the kernel, as the program writes
    them: over IPv4 id 0 + DF (an unconnected UDP socket's datagram that fits), TTL 64; over
    IPv6 (src an IPv6 address) hop limit 64 and the flow label given; the UDP checksum (or
    ``check``)."""
    if check is None:
        seg = struct.pack("!HHHH", port, port, 8 + len(inner), 0) + inner
        check = udp_checksum(src, dst, seg)
    udp = struct.pack("!HHHH", port, port, 8 + len(inner), check)
    if ":" in str(src):
        return ipv6.build(src, dst, udp + inner, next_header=17, hop_limit=64, flow_label=label)
    return ipv4.build(src, dst, udp + inner, flags=2)


def engine_tun(pkt: bytes):
    """pypath's TUN -> UDP for one packet: (hop or None, bytes after it, counters)."""
    pa = oracle()
    buf = bytearray(max(MTU, len(pkt)))
    buf[:len(pkt)] = pkt
    hops = [None]
    for _ in pypath.path_tun(pa, [buf], [len(pkt)], 1, hops):
        pypath.path_icmp_written(pa, 0)
    return hops[0], bytes(buf[:len(pkt)]), pa


def engine_udp(payload: bytes, sender: str):
    """pypath's UDP -> TUN for one datagram: (bytes to write or None, the drop reason's name)."""
    pa = oracle()
    buf = bytearray(MTU + 1)
    n = min(len(payload), MTU + 1)
    buf[:n] = payload[:n]
    out = None
    for _ in pypath.path_udp(pa, [buf], [n], [(sender, PORT)], 1, MTU):
        out = bytes(buf[:n])
    dropped = [name for name, v in zip(pypath.STAT_NAMES, pa.c) if v and name.startswith("drop_")]
    return out, (dropped[0] if dropped else None)


def run(kp, prog, data):
    before = kp.counters()
    verdict, out = kp.test_run(prog, data)
    after = kp.counters()
    return verdict, out, {n: after[n] - before[n] for n in after if after[n] != before[n]}


def udp4(src="10.5.1.2", dst="10.5.2.3", **kw):
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, b"payload!"), **kw)


def udp6(src="fd00:5:1::2", dst="fd00:5:2::3", **kw):
    return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 4000, 5000, b"payload!"), **kw)


# ---- TUN -> UDP ----------------------------------------------------------------------

def tcp4(src="10.5.1.2", dst="10.5.2.3", check=None, data=b"segment"):
    """A TCP segment (ACK) with its checksum right, or ``check`` in its field: a
    CHECKSUM_PARTIAL packet's carries its pseudo-header's sum, the device to fill it."""
    seg = struct.pack("!HHIIHHHH", 4000, 5000, 1, 1, 0x5010, 1024, 0, 0) + data
    if check is None:
        check = ipv4.checksum(_pseudo(src, dst, 6, len(seg)) + seg)
    return ipv4.build(src, dst, seg[:16] + struct.pack("!H", check) + seg[18:], proto=6)


def tcp6(src="fd00:5:1::2", dst="fd00:5:4::3", check=None, data=b"segment"):
    seg = struct.pack("!HHIIHHHH", 4000, 5000, 1, 1, 0x5010, 1024, 0, 0) + data
    if check is None:
        check = ipv6.upper_checksum(src, dst, 6, seg)
    return ipv6.build(src, dst, seg[:16] + struct.pack("!H", check) + seg[18:], next_header=6)


def egress_label(out: bytes) -> int:
    return struct.unpack_from("!I", out, 14)[0] & 0xFFFFF


@pytest.mark.parametrize("pkt", [
    udp4(), udp6(), ipv4.build("10.5.1.2", "10.5.2.3", ipv4.echo_request(), proto=ipv4.PROTO_ICMP,
                               ttl=2), tcp4(),
    udp6(dst="fd00:5:4::3"), tcp6(), ipv6.build("fd00:5:1::2", "fd00:5:4::3", ipv6.echo_request(
        "fd00:5:1::2", "fd00:5:4::3"), next_header=58, hop_limit=2)],
    ids=["udp4", "udp6", "icmp4-ttl2", "tcp4", "udp6-underlay6", "tcp6-underlay6",
         "icmp6-underlay6"])
def test_egress_encapsulates_as_the_engine_sends(kp, pkt):
    hop, inner, _ = engine_tun(pkt)
    verdict, out, moved = run(kp, bc.PROG_EGRESS, frame(pkt))
    assert verdict == REDIRECT
    assert moved == {"udp_tx_packets": 1, "udp_tx_bytes": len(pkt)}
    label = 0
    if hop[0] == PEER6:
        # the flow label: the inner flow's, the same for each of its packets
        label = egress_label(out)
        assert egress_label(kp.test_run(bc.PROG_EGRESS, frame(pkt))[1]) == label
        src, proto = OWN_IP6, ETH_P_IPV6
    else:
        assert hop == (PEER, PORT)
        src, proto = OWN_IP, ETH_P_IP
    assert out[12:14] == struct.pack("!H", proto)
    want = outer(inner, src=src, dst=hop[0], label=label)
    assert out[14:] == want, (out[14:70].hex(), want[:56].hex())


@pytest.mark.parametrize("pkt,reason", [
    (udp4(dst="10.6.0.1"), "tx_pass_no_route"),
    (udp6(dst="fd00:6::1"), "tx_pass_no_route"),
    (udp4(ttl=1), "tx_pass_ttl"),
    (udp6(hop_limit=1), "tx_pass_ttl"),
    (udp4(options=b"\x01\x01\x01\x00"), "tx_pass_options"),
    (udp4(flags=1), "tx_pass_fragment"),
    (udp4(frag_offset=8), "tx_pass_fragment"),
    (udp4(tot_len=99), "tx_pass_malformed"),
    (udp6(payload_len=3), "tx_pass_malformed"),
    (udp6(src="fe80::1"), "tx_pass_scope"),
    (ipv6.build("fd00:5:1::2", "fd00:5:3::3", bytes(1300)), "tx_pass_too_big"),
    (bytes([0x55]) + bytes(39), "tx_pass_malformed"),
    (ipv6.build("fd00:5:1::2", "fd00:5:4::3", bytes(MTU - 20 - 40 + 1)), "tx_pass_too_big"),
    (udp6(dst="fd00:5:4::3", hop_limit=1), "tx_pass_ttl"),
], ids=["no-route", "no-route6", "ttl", "hop-limit", "options", "more-fragments", "offset",
        "tot-len", "payload-len", "link-scope", "too-big6", "version-5", "too-big-underlay6",
        "hop-limit-underlay6"])
def test_egress_passes_the_rest_to_the_engine_unchanged(kp, pkt, reason):
    data = frame(pkt)
    verdict, out, moved = run(kp, bc.PROG_EGRESS, data)
    assert (verdict, out, moved) == (OK, data, {reason: 1})


def test_gso_packets_of_the_ipv6_underlay_go_to_the_engine(kp):
    """A super-packet for the IPv6 underlay (its segments would all copy one UDP checksum),
    and any GSO packet that comes over it, is the engine's. (Over IPv4 the program takes a
    TCP one: a test run's GSO packet has no GSO type, which bpf_skb_adjust_room refuses, so
    the integration tests' TCP shows that.)"""
    pkt = tcp6(data=bytes(1000))
    moved = {}
    for data, prog, gso in ((frame(pkt), bc.PROG_EGRESS, 500),
                            (datagram(tcp6(src="fd00:5:4::3", dst="fd00:5:1::2", data=bytes(1000)),
                                      src=PEER6), bc.PROG_INGRESS, 500)):
        before = kp.counters()
        verdict, out = kp.test_run(prog, data, gso_size=gso)
        assert (verdict, out) == (OK, data)
        moved.update({n: v - before[n] for n, v in kp.counters().items() if v != before[n]})
    assert moved == {"tx_pass_gso6": 1, "rx_pass_gso": 1}


# ---- UDP -> TUN ----------------------------------------------------------------------

def datagram(inner: bytes, src=PEER, dst=None, port=PORT, **kw) -> bytes:
    """A datagram from ``src`` (of either underlay) to own address, as a frame."""
    if dst is None:
        dst = OWN_IP6 if ":" in src else OWN_IP
    return frame(outer(inner, src=src, dst=dst, port=port, **kw))


@pytest.mark.parametrize("pkt,sender", [
    (udp4(src="10.5.2.3", dst="10.5.1.2"), PEER),
    (udp6(src="fd00:5:2::3", dst="fd00:5:1::2"), PEER),
    (udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), PEER6),
    (tcp6(src="fd00:5:4::3", dst="fd00:5:1::2"), PEER6),
], ids=["v4", "v6", "v6-underlay6", "tcp6-underlay6"])
def test_ingress_decapsulates_as_the_engine_writes(kp, pkt, sender):
    want, reason = engine_udp(pkt, sender)
    verdict, out, moved = run(kp, bc.PROG_INGRESS, datagram(pkt, src=sender))
    assert reason is None and want is not None
    assert verdict == REDIRECT
    assert out[14:] == want
    assert out[12:14] == struct.pack("!H", ETH_P_IPV6 if pkt[0] >> 4 == 6 else ETH_P_IP)
    assert moved == {"tun_tx_packets": 1, "tun_tx_bytes": len(pkt)}


@pytest.mark.parametrize("pkt,src,reason", [
    (udp4(src="10.5.2.3", dst="10.5.1.2"), STRANGER, "drop_bad_source"),
    (udp4(src="10.5.1.9", dst="10.5.1.2"), PEER, "drop_inner_local"),
    (udp4(src=OWN_ADDR, dst="10.5.1.2"), PEER, "drop_inner_local"),
    (udp4(src="10.5.3.3", dst="10.5.1.2"), PEER, "drop_inner_foreign"),
    (udp4(src="10.9.0.1", dst="10.5.1.2"), PEER, "drop_inner_foreign"),
    (udp6(src="fd00:5:1::9", dst="fd00:5:1::2"), PEER, "drop_inner_local"),
    (udp6(src="fd00:5:3::3", dst="fd00:5:1::2"), PEER, "drop_inner_foreign"),
    (udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), STRANGER6, "drop_bad_source"),
    (udp6(src="fd00:5:1::9", dst="fd00:5:1::2"), PEER6, "drop_inner_local"),
    (udp6(src="fd00:5:2::3", dst="fd00:5:1::2"), PEER6, "drop_inner_foreign"),
    (udp4(src="10.5.2.3", dst="10.5.1.2"), PEER6, "drop_inner_foreign"),
    (udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), PEER, "drop_inner_foreign"),
], ids=["stranger", "own-subnet", "own-address", "other-peers-subnet", "no-lease", "own-subnet6",
        "other-peers-subnet6", "stranger-underlay6", "own-subnet-underlay6",
        "underlay6-peer-ipv4-routes-subnet", "underlay6-peer-ipv4-inner",
        "underlay4-peer-underlay6-subnet"])
def test_ingress_drops_what_the_source_rules_refuse(kp, pkt, src, reason):
    assert engine_udp(pkt, src) == (None, reason)
    verdict, _, moved = run(kp, bc.PROG_INGRESS, datagram(pkt, src=src))
    assert (verdict, moved) == (SHOT, {reason: 1})


@pytest.mark.parametrize("data,reason", [
    (datagram(udp4(src="10.5.2.3", dst="10.5.1.2", ttl=1)), "rx_pass_ttl"),
    (datagram(udp4(src="10.5.2.3", dst="10.5.1.2", tot_len=50)), "rx_pass_malformed"),
    (datagram(udp4(src="10.5.2.3", dst="10.5.1.2", options=bytes(4))), "rx_pass_options"),
    (datagram(udp6(src="fd00:5:2::3", dst="fe80::1")), "rx_pass_scope"),
    (datagram(ipv4.build("10.5.2.3", "10.5.1.2", bytes(MTU))), "rx_pass_truncated"),
    (datagram(udp4(src="10.5.2.3", dst="10.5.1.2"), port=PORT + 1), None),
    (datagram(udp4(src="10.5.2.3", dst="10.5.1.2"), dst=PEER), None),
    (datagram(udp6(src="fd00:5:4::3", dst="fd00:5:1::2", hop_limit=1), src=PEER6), "rx_pass_ttl"),
    (datagram(ipv6.build("fd00:5:4::3", "fd00:5:1::2", bytes(MTU - 39)), src=PEER6),
     "rx_pass_truncated"),
    (datagram(udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), src=PEER6, port=PORT + 1), None),
    (datagram(udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), src=PEER6, dst=PEER6), None),
    (datagram(udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), src=PEER6)[:18] + b"\0\x99" +
     datagram(udp6(src="fd00:5:4::3", dst="fd00:5:1::2"), src=PEER6)[20:], "rx_pass_malformed"),
], ids=["ttl", "tot-len", "options", "link-scope", "over-mtu", "other-port", "not-to-us",
        "ttl-underlay6", "over-mtu-underlay6", "other-port-underlay6", "not-to-us-underlay6",
        "payload-len-underlay6"])
def test_ingress_passes_the_rest_up_unchanged(kp, data, reason):
    verdict, out, moved = run(kp, bc.PROG_INGRESS, data)
    assert (verdict, out, moved) == (OK, data, {reason: 1} if reason else {})


BACK4 = udp4(src="10.5.2.3", dst="10.5.1.2")
BACK6 = udp6(src="fd00:5:4::3", dst="fd00:5:1::2")


@pytest.mark.parametrize("data", [
    datagram(BACK4, check=0x1234), datagram(BACK6, src=PEER6, check=0x1234),
    datagram(BACK6, src=PEER6, check=0),
    # a bit flipped on the way, the checksum as sent
    datagram(BACK4)[:-1] + b"?", datagram(BACK6, src=PEER6)[:-1] + b"?",
    datagram(tcp4(src="10.5.2.3", dst="10.5.1.2"))[:-1] + b"?",
], ids=["wrong4", "wrong6", "none6", "flipped4", "flipped6", "flipped-tcp4"])
def test_ingress_drops_a_wrong_udp_checksum(kp, data):
    """The engines' kernel drops these before their socket sees them (IPv6 requires a
    checksum); the program drops them too, counted."""
    verdict, _, moved = run(kp, bc.PROG_INGRESS, data)
    assert (verdict, moved) == (SHOT, {"rx_drop_checksum": 1})


@pytest.mark.parametrize("data,pkt,sender", [
    (datagram(BACK4, check=0), BACK4, PEER),      # none: IPv4 allows it, as flanneld's kernel
    (datagram(BACK4), BACK4, PEER),
    (datagram(BACK6, src=PEER6), BACK6, PEER6),
    # an inner checksum that does not hold, the outer one (the engine's kernel's) right: the
    # inner packet's receiver judges it, as behind the engine
    (datagram(tcp4(src="10.5.2.3", dst="10.5.1.2", check=0x4242)),
     tcp4(src="10.5.2.3", dst="10.5.1.2", check=0x4242), PEER),
    (datagram(tcp6(src="fd00:5:4::3", dst="fd00:5:1::2", check=0x4242), src=PEER6),
     tcp6(src="fd00:5:4::3", dst="fd00:5:1::2", check=0x4242), PEER6),
], ids=["none4", "right4", "right6", "inner-wrong4", "inner-wrong6"])
def test_ingress_takes_every_right_udp_checksum(kp, data, pkt, sender):
    want, reason = engine_udp(pkt, sender)
    verdict, out, moved = run(kp, bc.PROG_INGRESS, data)
    assert (verdict, out[14:], moved) == (REDIRECT, want, {"tun_tx_packets": 1,
                                                           "tun_tx_bytes": len(pkt)})


def test_counter_names_come_from_maps_h():
    names = bc.COUNTER_NAMES
    assert len(names) == bc.N_COUNTERS and len(set(names)) == len(names)
    # the drop reasons the programs count are the engines' own, by name
    assert {n for n in names if n.startswith("drop_")} <= set(pypath.STAT_NAMES)


# ---- differential: generated packets, the program against the engine --------------------

V4_ADDRS = ["10.5.1.2", "10.5.1.9", OWN_ADDR, "10.5.2.3", "10.5.3.3", "10.6.0.1"]
V6_ADDRS = ["fd00:5:1::2", "fd00:5:2::3", "fd00:5:3::3", "fd00:5:4::3", "fd00:6::1", "fe80::1",
            "ff02::1", "ff0e::1", "::"]


@st.composite
def inner_packets(draw):
    payload = draw(st.binary(max_size=64))
    if draw(st.booleans()):
        pkt = bytearray(ipv4.build(
            draw(st.sampled_from(V4_ADDRS)), draw(st.sampled_from(V4_ADDRS)), payload,
            proto=draw(st.sampled_from([1, 6, 17])), ttl=draw(st.sampled_from([0, 1, 2, 64, 255])),
            flags=draw(st.sampled_from([0, 0, 0, 2, 1])),
            frag_offset=draw(st.sampled_from([0, 0, 0, 8])),
            options=draw(st.sampled_from([b"", b"", b"", bytes(4)]))))
        # any checksum: the TTL update must be the engine's for every one
        pkt[10:12] = draw(st.integers(0, 0xFFFF)).to_bytes(2, "big")
    else:
        pkt = bytearray(ipv6.build(draw(st.sampled_from(V6_ADDRS)), draw(st.sampled_from(V6_ADDRS)),
                                   payload, hop_limit=draw(st.sampled_from([0, 1, 2, 64, 255]))))
    if draw(st.integers(0, 9)) == 0:    # a length field that lies
        at = 2 if pkt[0] >> 4 == 4 else 4
        pkt[at:at + 2] = draw(st.integers(0, 0xFFFF)).to_bytes(2, "big")
    if draw(st.integers(0, 19)) == 0:   # another version
        pkt[0] = draw(st.integers(0, 15)) << 4 | (pkt[0] & 15)
    return bytes(pkt)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pkt=inner_packets())
def test_egress_decides_as_the_engine(kp, pkt):
    # the kernel refuses a test run of an IPv6 frame shorter than an IPv6 header (on flannel0
    # the stack makes no such packet; the ingress test has these inside IPv4)
    assume(not (pkt[0] >> 4 == 6 and len(pkt) < 40))
    hop, inner, _ = engine_tun(pkt)
    verdict, out, moved = run(kp, bc.PROG_EGRESS, frame(pkt))
    if verdict == REDIRECT:
        assert hop is not None
        if hop[0] == PEER6:
            assert out[14:] == outer(inner, src=OWN_IP6, dst=PEER6, label=egress_label(out))
        else:
            assert out[14:] == outer(inner, dst=hop[0], port=hop[1])
    else:
        assert verdict == OK and out == frame(pkt), "the program drops nothing on egress"
        (reason,) = moved
        if hop is not None:     # forwarded by the engine: only what the program leaves alone
            assert reason in ("tx_pass_options", "tx_pass_fragment"), reason


@SETTINGS
@given(pkt=inner_packets(), sender=st.sampled_from([PEER, OTHER_PEER, STRANGER, PEER6, STRANGER6]))
def test_ingress_decides_as_the_engine(kp, pkt, sender):
    want, reason = engine_udp(pkt, sender)
    data = datagram(pkt, src=sender)
    verdict, out, moved = run(kp, bc.PROG_INGRESS, data)
    if verdict == REDIRECT:
        assert out[14:] == want
    elif verdict == SHOT:
        assert moved == {reason: 1}
    else:
        assert verdict == OK and out == data
        (passed,) = moved
        # options: the program looks no further, the engine decides all of it; the rest
        # the engine drops too, for the reason the program saw
        if passed != "rx_pass_options":
            assert want is None and reason in (
                "drop_malformed", "drop_not_ipv4", "drop_ttl", "drop_scope", "drop_truncated"), \
                (passed, reason)


# ---- the path MTU (pmtu.h) -------------------------------------------------------------

NARROW = 1400      # the external device's MTU in the namespace below: the path's, to each peer


@pytest.fixture
def narrow_path(kp):
    """The test runs in a network namespace of their own, whose external device (a veth,
    forwarding on, as on every flannel host) is NARROW bytes wide and holds both underlays'
    peers: the route the egress program looks up has that MTU, as it has the path MTU the
    kernel learnt from a router (the integration test's case: tests/integration/test_path_mtu.py).
    A test run's packet belongs to the caller's namespace, so this thread enters it."""
    import ctypes
    import subprocess
    name = f"fu-kmtu-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        subprocess.run(["ip", "-n", name, "-batch", "-"], check=True, text=True, input=(
            f"link add fu0 mtu {NARROW} type veth peer name fu1\n"
            "link set fu1 up\nlink set fu0 up\n"
            f"addr add {OWN_IP}/24 dev fu0\naddr add {OWN_IP6}/64 dev fu0 nodad\n"))
        for key in ("net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"):
            subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", f"{key}=1"], check=True)
        assert libc.setns(there, 0x40000000) == 0, os.strerror(ctypes.get_errno())  # CLONE_NEWNET
        kp.set_devices(TUN_IF, socket.if_nametoindex("fu0"), tun_l2=True, ext_l2=True)
        yield
    finally:
        libc.setns(home, 0x40000000)
        kp.set_devices(TUN_IF, EXT_IF, tun_l2=True, ext_l2=True)
        os.close(home)
        os.close(there)
        subprocess.run(["ip", "netns", "del", name], check=False)


def sized(length: int, dst="10.5.2.3") -> bytes:
    """A UDP packet ``length`` bytes long, to dst (its family's)."""
    if ":" in dst:
        src = "fd00:5:1::2"
        return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 4000, 5000, bytes(length - 48)))
    return ipv4.build("10.5.1.2", dst, ipv4.udp_payload(4000, 5000, bytes(length - 28)))


def tcp_options4(data_len: int) -> bytes:
    """A TCP segment with 12 bytes of options (a timestamp's), as a pod's TCP sends."""
    seg = struct.pack("!HHIIHHHH", 4000, 5000, 1, 1, 0x8010, 1024, 0, 0) + \
        b"\x01\x01\x08\x0a" + bytes(8) + bytes(data_len)
    return ipv4.build("10.5.1.2", "10.5.2.3", seg, proto=6)


@pytest.mark.parametrize("pkt,gso,fits", [
    (sized(NARROW - 28), 0, True),
    (sized(NARROW - 28 + 1), 0, False),
    (sized(NARROW - 48, "fd00:5:4::3"), 0, True),
    (sized(NARROW - 48 + 1, "fd00:5:4::3"), 0, False),
    (sized(NARROW - 28 + 1, "fd00:5:2::3"), 0, False),        # inner IPv6 over IPv4
    # a super-packet by its segments, headers and TCP options included (a test run's GSO
    # packet that fits is then refused by adjust_room: see the IPv6 underlay's GSO test)
    (tcp_options4(2000), NARROW - 28 - 20 - 32, True),
    (tcp_options4(2000), NARROW - 28 - 20 - 32 + 1, False),
], ids=["udp4-fits", "udp4-over", "underlay6-fits", "underlay6-over", "udp6-over",
        "gso-fits", "gso-over"])
def test_egress_hands_what_the_path_mtu_refuses_to_the_engine(kp, narrow_path, pkt, gso, fits):
    data = frame(pkt)
    before = kp.counters()
    verdict, out = kp.test_run(bc.PROG_EGRESS, data, gso_size=gso)
    moved = {n: v - before[n] for n, v in kp.counters().items() if v != before[n]}
    if not fits:
        assert (verdict, out, moved) == (OK, data, {"tx_pass_path_mtu": 1})
    elif gso:
        assert moved == {"tx_pass_helper": 1}
    else:
        assert (verdict, moved) == (REDIRECT, {"udp_tx_packets": 1, "udp_tx_bytes": len(pkt)})
