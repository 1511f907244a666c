"""The kernel path's tc programs against the Python engine on the C fuzzer's corpus.

Every input of csrc/fuzz/corpus/ (the seeds of make_corpus.py and any regress-* file) is read
as fuzz_packet.c reads it (the layout is at the top of that file): its flags (accept_any,
strict, host bits kept), its mtu, its routes on both underlays (each IPv4 route's IPv6 twin,
its peer on the IPv6 underlay or not, its mtu), its own sources, and its packets. Each packet
goes through a program by BPF_PROG_TEST_RUN and through pypath.py (the oracle the C engine's
differential tests agree with: no per-packet call of the C engine is reachable from Python,
csrc/dataplane.h exports the loop only) with the same config. A TUN packet is the egress
program's, a UDP one the ingress program's, wrapped in the outer headers its sender's
datagram has (IPv4 or, for the sources 8-14, the IPv6 underlay; a right UDP checksum) as the
engines' socket receives it. Then: what the program redirects, the engine forwards with the
same bytes; what it drops, the engine drops for the same reason; what it passes on is
unchanged and is what the engine handles, for the reason the pass is counted under (or any
way, for the IPv4 options and fragments the program leaves to it).

What the programs do not model, and how it is taken here:
  - the ICMP rate limits, the trace, the clock steps, TUN GRO's UDP runs and the TUN write
    failures: ignored (they act after the decision, or not on it); the packets still run;
  - a TUN packet's send refused as over a path MTU (ctl bit 1): ignored, the decision before
    the send is compared (the programs' own path MTU check has its test in
    test_bpf_programs.py);
  - a UDP datagram longer than the mtu (ctl bit 1, MSG_TRUNC): the datagram is made mtu + 1
    bytes long with zeros, of which the engine sees the first mtu, as the fuzzer's;
  - each route's own port (8285 + its index): the programs have one port, the configured
    one, so the engine's routes are given that port too;
  - a TUN packet shorter than its family's header (20 bytes; an IPv6 one's 40): the kernel
    refuses a test run of one (on flannel0 the stack makes none), so it is counted as not
    run, the engine's verdict (malformed) unchecked.
"""
from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field

import pytest

from dataplane.engine import bpf_contract as bc
from dataplane.engine import pypath
from dataplane.engine.api import Local, Route
from dataplane.engine.pytable import RouteTable
from tests.conftest import require_bpf
from tests.unit.test_bpf_programs import (EXT_IF, OK, OWN_IP, OWN_IP6, PORT, REDIRECT, SHOT,
                                          TUN_IF, egress_label, frame, outer, run)

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "csrc", "fuzz", "corpus")
INPUTS = sorted(f for f in os.listdir(CORPUS) if f.startswith(("seed-", "regress-")))

MTU_MIN, PEER_BASE, MAX_ROUTES, MAX_LOCAL = 68, 0x7F000010, 8, 4
ROUTE6_MTU = (0, 1280, 1400, 1500)
# The engine's drop reason behind each pass of a program (None: the engine decides alone).
TX_PASS = {"tx_pass_no_route": {"drop_no_route"}, "tx_pass_ttl": {"drop_ttl"},
           "tx_pass_too_big": {"drop_too_big"}, "tx_pass_scope": {"drop_scope"},
           "tx_pass_malformed": {"drop_malformed", "drop_not_ipv4"},
           "tx_pass_options": None, "tx_pass_fragment": None}
RX_PASS = {"rx_pass_ttl": {"drop_ttl"}, "rx_pass_scope": {"drop_scope"},
           "rx_pass_truncated": {"drop_truncated"},
           "rx_pass_malformed": {"drop_malformed", "drop_not_ipv4"}, "rx_pass_options": None}


@dataclass
class Input:
    """One corpus input as fuzz_packet.c plays it."""
    flags: int
    mtu: int
    routes: list = field(default_factory=list)       # api.Route, IPv4's then IPv6's
    own: tuple | None = None                         # (Local4, Local6) or None
    packets: list = field(default_factory=list)      # (udp, truncated, source, bytes)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> int:
        """n bytes big-endian, zeros past the end (fuzz.h's fuzz_take)."""
        v = 0
        for _ in range(n):
            v = v << 8 | (self.data[self.at] if self.at < len(self.data) else 0)
            self.at = min(self.at + 1, len(self.data))
        return v

    def left(self) -> int:
        return len(self.data) - self.at


def peer_addr(i: int) -> ipaddress.IPv4Address:
    """Peer i is 127.0.0.16 + i, 7 and 15 being 0.0.0.0."""
    return ipaddress.IPv4Address(0 if i & 7 == 7 else PEER_BASE + i)


def underlay6(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(0x20010DB8 << 96 | int(v4))


def _mask(plen: int, width: int = 32) -> int:
    full = (1 << width) - 1
    return full ^ (full >> plen)


def parse(data: bytes) -> Input:
    r = _Reader(data)
    flags = r.take(1)
    inp = Input(flags, MTU_MIN + r.take(1) * 6)
    r.take(2)                                       # the ICMP limit's rate and burst
    nroutes = r.take(1) % (MAX_ROUTES + 1)
    keep = flags & 16
    v4, v6, host_bits = [], [], False
    for i in range(nroutes):
        net, plen, peer = r.take(4), r.take(1) % 33, r.take(1)
        host_bits |= bool(net & ~_mask(plen) & 0xFFFFFFFF)
        if not keep:
            net &= _mask(plen)
        hop = peer_addr(peer & 7)
        net6 = net << (0 if i & 1 else 64)         # at byte 12 (odd) or byte 4 (even)
        plen6 = plen + (96 if i & 1 else 32)
        hop6 = underlay6(hop) if peer & 8 else hop
        v4.append(Route(ipaddress.IPv4Network((net, plen), strict=False), hop, PORT))
        v6.append(Route(ipaddress.IPv6Network((net6, plen6), strict=False), hop6, PORT,
                        ROUTE6_MTU[peer >> 4 & 3]))
    if not (keep and host_bits):                     # dp_routes_build refuses host bits only
        inp.routes = v4 + v6
    if flags & 0x80:
        net, plen = r.take(4), r.take(1) % 33
        n = r.take(1) % (MAX_LOCAL + 1)
        addrs = tuple(r.take(4) for _ in range(n))
        bits = net & ~_mask(plen) & 0xFFFFFFFF
        if not keep:
            net &= _mask(plen)
        if not (keep and bits):                      # else dp_local_build refuses: none
            inp.own = (Local(net if plen else 0, plen, addrs),
                       Local(net if plen else 0, plen + 96 if plen else 0, addrs))
    while r.left():
        ctl, want = r.take(1), r.take(2)
        n = min(want, inp.mtu, r.left())
        pkt = r.data[r.at:r.at + n]
        r.at += n
        inp.packets.append((ctl & 1, bool(ctl & 2), ctl >> 4, pkt))
    return inp


def _own_subnets(own) -> list:
    if own is None or not own[0].prefixlen:
        return []
    return [ipaddress.IPv4Network((own[0].net, own[0].prefixlen)),
            ipaddress.IPv6Network((own[1].net, own[1].prefixlen))]


def _own_addrs(own) -> list:
    if own is None:
        return []
    return [ipaddress.IPv4Address(a) for a in own[0].addrs] + \
        [ipaddress.IPv6Address(a) for a in own[1].addrs]


def oracle(inp: Input) -> pypath.Path:
    pa = pypath.Path(ipaddress.IPv4Address("10.5.1.0").packed, accept_any=bool(inp.flags & 1))
    pa.routes = RouteTable(inp.routes)
    if inp.own is not None:
        pa.local = pypath.own_sources(inp.own)
    pa.strict_sources = bool(inp.flags & 0x40)
    pypath.path_set_icmp_limit(pa, 0, 0)
    return pa


def _moved(pa, before) -> set:
    return {n for n, a, b in zip(pypath.STAT_NAMES, pa.c, before)
            if a != b and n.startswith("drop_")}


def engine_tun(pa, pkt: bytes):
    buf = bytearray(max(len(pkt), 1))
    buf[:len(pkt)] = pkt
    hops, before = [None], list(pa.c)
    for _ in pypath.path_tun(pa, [buf], [len(pkt)], 1, hops):
        pypath.path_icmp_written(pa, 0)
    return hops[0], bytes(buf[:len(pkt)]), _moved(pa, before)


def engine_udp(pa, payload: bytes, sender, mtu: int):
    buf = bytearray(max(mtu + 1, len(payload)))
    buf[:len(payload)] = payload
    out, before = None, list(pa.c)
    for _ in pypath.path_udp(pa, [buf], [len(payload)], [(str(sender), PORT)], 1, mtu):
        out = bytes(buf[:len(payload)])
    return out, _moved(pa, before)


@pytest.fixture(scope="module")
def kp():
    require_bpf()
    from dataplane.engine.bpf_path import KernelPath
    with KernelPath() as k:
        k.set_devices(TUN_IF, EXT_IF, tun_l2=True, ext_l2=True)
        yield k


def configure(kp, inp: Input) -> None:
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=inp.mtu, own_subnets=_own_subnets(inp.own),
                 strict=bool(inp.flags & 0x40), accept_any=bool(inp.flags & 1),
                 own_ip6=OWN_IP6)
    kp.set_routes(inp.routes)
    kp.set_local(_own_addrs(inp.own))


def check_egress(kp, pa, pkt: bytes) -> str:
    hop, inner, dropped = engine_tun(pa, pkt)
    verdict, out, moved = run(kp, bc.PROG_EGRESS, frame(pkt))
    if verdict == REDIRECT:
        assert hop is not None and moved == {"udp_tx_packets": 1, "udp_tx_bytes": len(pkt)}
        if hop[0].count(":"):
            want = outer(inner, src=OWN_IP6, dst=hop[0], label=egress_label(out))
        else:
            want = outer(inner, dst=hop[0])
        assert out[14:] == want, (out[14:70].hex(), want[:56].hex())
        return "redirect"
    assert verdict == OK and out == frame(pkt), "the egress program drops nothing"
    (reason,) = moved
    assert reason in TX_PASS, reason
    if TX_PASS[reason] is not None:
        assert hop is None and dropped <= TX_PASS[reason] and len(dropped) == 1, \
            (reason, hop, dropped)
    return reason


def sender_of(source: int):
    if 8 <= source < 15:
        return underlay6(peer_addr(source - 8))
    return peer_addr(source)


def check_ingress(kp, pa, pkt: bytes, truncated: bool, source: int, mtu: int) -> str:
    sender = sender_of(source)
    if truncated:                 # longer than the mtu: the engine reads its first mtu bytes
        pkt = pkt + bytes(mtu + 1 - len(pkt))
    want, dropped = engine_udp(pa, pkt, sender, mtu)
    dst = OWN_IP6 if sender.version == 6 else OWN_IP
    data = frame(outer(pkt, src=str(sender), dst=dst))
    verdict, out, moved = run(kp, bc.PROG_INGRESS, data)
    if verdict == REDIRECT:
        assert want is not None and out[14:] == want, (out[14:54].hex(), want)
        assert moved == {"tun_tx_packets": 1, "tun_tx_bytes": len(pkt)}
        return "redirect"
    if verdict == SHOT:
        (reason,) = moved
        assert want is None and moved == {reason: 1} and dropped == {reason}, (moved, dropped)
        return reason
    assert verdict == OK and out == data
    (reason,) = moved
    assert reason in RX_PASS, reason
    if RX_PASS[reason] is not None:
        assert want is None and dropped <= RX_PASS[reason] and len(dropped) == 1, \
            (reason, dropped)
    return reason


def run_input(kp, name: str) -> dict:
    with open(os.path.join(CORPUS, name), "rb") as f:
        inp = parse(f.read())
    configure(kp, inp)
    pa = oracle(inp)
    seen: dict = {}
    for i, (udp, truncated, source, pkt) in enumerate(inp.packets):
        if not udp and len(pkt) < (40 if pkt and pkt[0] >> 4 == 6 else 20):
            outcome = "not run"
        elif udp:
            outcome = check_ingress(kp, pa, pkt, truncated, source, inp.mtu)
        else:
            outcome = check_egress(kp, pa, pkt)
        seen[outcome] = seen.get(outcome, 0) + 1
    return seen


@pytest.mark.parametrize("name", INPUTS)
def test_corpus_input_decides_as_the_engine(kp, name):
    start = time.monotonic()
    seen = run_input(kp, name)
    print(f"{name}: {sum(seen.values())} packets {seen} in {time.monotonic() - start:.2f} s")
    assert sum(seen.values()) > 0


def test_corpus_reaches_every_kind_of_decision(kp):
    """The corpus as a whole takes both programs through each of their outcomes, so a parse
    that went wrong (every packet to no route, say) shows here."""
    seen: dict = {}
    for name in INPUTS:
        for outcome, n in run_input(kp, name).items():
            seen[outcome] = seen.get(outcome, 0) + n
    print(f"{len(INPUTS)} inputs, {sum(seen.values())} packets: {dict(sorted(seen.items()))}")
    assert {"redirect", "drop_bad_source", "drop_inner_local", "drop_inner_foreign",
            "tx_pass_no_route", "tx_pass_ttl", "tx_pass_too_big", "tx_pass_scope",
            "tx_pass_malformed", "tx_pass_options", "tx_pass_fragment", "rx_pass_ttl",
            "rx_pass_scope", "rx_pass_truncated", "rx_pass_malformed"} <= set(seen)
