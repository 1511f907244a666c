"""The Python engine's per-packet work (dataplane/engine/pypath.py), called directly.

pypath.py is csrc/path.c function for function, with no I/O, so the checks of
csrc/dataplane.h can be played here packet by packet, without sockets or
threads: each drop reason in the header's order, the ICMP errors and when
none is sent, the TTL update against ipv4.py's for every checksum, the rate
limit against a token bucket written another way, and that every packet is
counted exactly once whatever its bytes. The engines themselves, C against
Python, are compared in test_engine_differential.py.
"""
from __future__ import annotations

import errno
import inspect
import ipaddress
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.engine import ipv4, pypath
from dataplane.engine.api import DROP_STATS, STAT_NAMES, Route
from dataplane.engine.pytable import RouteTable
from tests.engine_harness import with_v6_shares

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUN_ADDR = "10.5.1.0"
MTU = 1472
PEER, OTHER_PEER, STRANGER = ("127.0.0.16", 8285), ("127.0.0.17", 8285), ("127.0.0.99", 8285)
ROUTES = [Route.make("10.5.2.0/24", *PEER), Route.make("10.5.0.0/16", *OTHER_PEER)]
OWN_NET, OWN_ADDR = ipaddress.IPv4Network("10.5.1.0/24"), "192.168.50.2"
KIND = {v: k for k, v in vars(pypath).items() if k.startswith("TR_")}


def new_path(accept_any=True, routes=ROUTES, tracing=False, icmp_limit=(0, 0)):
    pa = pypath.Path(ipaddress.IPv4Address(TUN_ADDR).packed, accept_any)
    pa.routes = RouteTable(routes)
    pa.tracing = tracing
    pypath.path_set_icmp_limit(pa, *icmp_limit)
    return pa


def nonzero(pa) -> dict:
    return {name: v for name, v in zip(STAT_NAMES, pa.c) if v}


def drops(pa) -> int:
    return sum(pa.c[STAT_NAMES.index(name)] for name in DROP_STATS)


def run_tun(pa, packets, icmp_err=0):
    """Packets through path_tun as pyengine's tun_batch hands them over: one batch, each
    ICMP error it yields reported written with ``icmp_err``. Returns the buffers, where
    each packet goes (None: dropped) and the ICMP errors as (packet index, bytes)."""
    bufs = [bytearray(max(MTU, len(p))) for p in packets]
    for b, p in zip(bufs, packets):
        b[:len(p)] = p
    lens = [len(p) for p in packets]
    hops = ["unset"] * len(packets)
    errors = []
    for j in pypath.path_tun(pa, bufs, lens, len(packets), hops):
        errors.append((j, pa.icmp))
        pypath.path_icmp_written(pa, icmp_err)
    return bufs, hops, errors


def run_udp_batch(pa, datagrams):
    """Datagrams ((payload, source) pairs) through path_udp as pyengine's udp_batch hands
    them over: one receive, each read into mtu + 1 bytes. Returns, for each, None if it
    was dropped, else its bytes to write into the TUN."""
    bufs = [bytearray(MTU + 1) for _ in datagrams]
    lens = []
    for b, (payload, _) in zip(bufs, datagrams):
        received = min(len(payload), MTU + 1)
        b[:received] = payload[:received]
        lens.append(received)
    out = [None] * len(datagrams)
    for j in pypath.path_udp(pa, bufs, lens, [src for _, src in datagrams], len(datagrams), MTU):
        assert out[j] is None and lens[j] <= MTU
        out[j] = bytes(bufs[j][:lens[j]])
    return out


def run_udp(pa, payload, src=PEER):
    """One datagram: None if dropped, else its bytes to write."""
    return run_udp_batch(pa, [(payload, src)])[0]


def decremented(pkt) -> bytes:
    out = bytearray(pkt)
    ipv4.decrement_ttl(out)
    return bytes(out)


def udp_packet(src="10.5.1.2", dst="10.5.2.3", **kw):
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, b"payload!"), **kw)


def icmp_packet(type_, src="10.5.1.2", dst="10.5.2.3", **kw):
    return ipv4.build(src, dst, ipv4.icmp_message(type_, 0, 0, bytes(28)), proto=ipv4.PROTO_ICMP,
                      **kw)


# ---- the shape: path.c's functions, in path.c's order --------------------------------

# path.c's functions with no function of that name here, and why.
WITHOUT = {
    "path_init": "pypath.Path() makes the state",
    "path_tun_drop": "a read refused by the vnet header: the Python engine has no offloads",
    "icmp_error6": "icmp_error serves both families, told by its Family (V4, V6)",
    "is_ipv6": "path_tun and path_udp look at the version nibble once, for both families",
    "path_tun_written": "the caller counts the TUN write it makes (pypath.py says why)",
    "sent_by_peer": "written out in inner_source's strict rule: a name compare",
    "udp_path": "path_udp serves both sockets: a source's name tells its family",
    "path_udp6": "the same",
    "icmp_sent_counter": "written out in path_icmp_written (Family.sent)",
}


def test_every_function_of_path_c_is_here_in_the_same_order():
    with open(os.path.join(ROOT, "csrc", "path.c")) as f:
        text = f.read()
    c_names = [n[len("dp_"):] if n.startswith("dp_") else n
               for n in re.findall(r"^[a-z][\w *]*?\b(\w+)\([^;{]*\)\s*\{", text, re.M)]
    assert "path_tun" in c_names and "path_udp" in c_names        # the pattern still reads path.c
    missing = [n for n in c_names if not inspect.isfunction(getattr(pypath, n, None))]
    assert sorted(missing) == sorted(WITHOUT)
    here = [n for n in c_names if n not in WITHOUT]
    lines = [inspect.getsourcelines(getattr(pypath, n))[1] for n in here]
    assert lines == sorted(lines), f"pypath.py's order differs from path.c's: {here}"


# ---- TUN -> UDP -------------------------------------------------------------------------

LATER_FRAGMENT = dict(frag_offset=185)
TUN_CASES = [
    # (what, packet, the one drop counter or None for forwarded, the ICMP type sent or None)
    ("19 bytes", b"\x45" + bytes(18), "drop_malformed", None),
    ("19 bytes of version 6: the length comes first", b"\x60" + bytes(18), "drop_malformed", None),
    ("version 6, :: to ::", b"\x60" + bytes(39), "drop_scope", None),
    ("version 5", b"\x50" + bytes(39), "drop_not_ipv4", None),
    ("ihl 4", udp_packet(ihl=4), "drop_malformed", None),
    ("ihl past the end", udp_packet(ihl=15), "drop_malformed", None),
    ("tot_len short", udp_packet(tot_len=35), "drop_malformed", None),
    ("tot_len long", udp_packet(tot_len=37), "drop_malformed", None),
    ("no route", udp_packet(dst="10.9.0.1"), "drop_no_route", 3),
    ("no route, first fragment", udp_packet(dst="10.9.0.1", flags=1), "drop_no_route", 3),
    ("no route, later fragment", udp_packet(dst="10.9.0.1", **LATER_FRAGMENT), "drop_no_route",
     None),
    ("no route, ICMP echo", icmp_packet(8, dst="10.9.0.1"), "drop_no_route", None),
    ("no route and TTL 1: the route comes first", udp_packet(dst="10.9.0.1", ttl=1),
     "drop_no_route", 3),
    ("TTL 1", udp_packet(ttl=1), "drop_ttl", 11),
    ("TTL 0", udp_packet(ttl=0), "drop_ttl", 11),
    ("TTL 1, ICMP echo (a query gets one)", icmp_packet(8, ttl=1), "drop_ttl", 11),
    ("TTL 1, ICMP unreachable", icmp_packet(3, ttl=1), "drop_ttl", None),
    ("TTL 1, ICMP time exceeded", icmp_packet(11, ttl=1), "drop_ttl", None),
    ("TTL 1, ICMP too short for a type", ipv4.build("10.5.1.2", "10.5.2.3", b"", ttl=1,
                                                    proto=ipv4.PROTO_ICMP), "drop_ttl", 11),
    ("TTL 1, later fragment", udp_packet(ttl=1, **LATER_FRAGMENT), "drop_ttl", None),
    ("TTL 2", udp_packet(ttl=2), None, None),
    ("options", udp_packet(options=bytes(range(1, 41))), None, None),
]


@pytest.mark.parametrize("what,pkt,drop,icmp_type", TUN_CASES, ids=[c[0] for c in TUN_CASES])
def test_tun_checks_in_the_headers_order(what, pkt, drop, icmp_type):
    pa = new_path()
    bufs, hops, errors = run_tun(pa, [pkt])
    expect = {"tun_rx_packets": 1, "tun_rx_bytes": len(pkt)}
    if drop is None:
        assert hops == [PEER] and bytes(bufs[0][:len(pkt)]) == decremented(pkt)
    else:
        expect[drop] = 1
        assert hops == [None] and bytes(bufs[0][:len(pkt)]) == pkt      # left as read
    if icmp_type is not None:
        # about the packet as read, from the TUN's address back to its source
        assert errors == [(0, ipv4.icmp_error(pkt, icmp_type, 0, TUN_ADDR))]
        expect["icmp_unreach_sent" if icmp_type == 3 else "icmp_ttl_sent"] = 1
    else:
        assert errors == []
    assert nonzero(pa) == with_v6_shares(expect, pkt)


@pytest.mark.parametrize("routes,expect", [
    ([], [None, None, None]),
    (ROUTES[1:], [OTHER_PEER, OTHER_PEER, None]),                     # one prefix length
    (ROUTES, [PEER, OTHER_PEER, None]),                               # the longest first
    (ROUTES + [Route.make("0.0.0.0/0", *STRANGER)], [PEER, OTHER_PEER, STRANGER]),
], ids=["none", "one length", "two lengths", "and a default"])
def test_route_lookup(routes, expect):
    pa = new_path(routes=routes)
    packets = [udp_packet(dst="10.5.2.3"), udp_packet(dst="10.5.3.3"), udp_packet(dst="10.9.0.1")]
    _, hops, errors = run_tun(pa, packets)
    assert hops == expect
    assert [i for i, _ in errors] == [i for i, hop in enumerate(expect) if hop is None]
    assert nonzero(pa).get("drop_no_route", 0) == expect.count(None)


def test_an_icmp_error_is_written_before_the_next_packet_is_looked_at():
    # C's loop writes an error right after its packet: path_tun stops there, and the trace
    # shows each packet's whole story before the next one's (the demo follows packets so).
    pa = new_path(tracing=True)
    miss, hit = udp_packet(dst="10.9.0.1"), udp_packet()
    _, hops, errors = run_tun(pa, [miss, hit, miss, hit])
    assert hops == [None, PEER, None, PEER]
    assert [i for i, _ in errors] == [0, 2]
    kinds = [KIND[e[2]] for e in pa.ring]
    story = ["TR_TUN_READ", "TR_ROUTE_MISS", "TR_DROP", "TR_ICMP", "TR_TUN_READ", "TR_ROUTE_HIT"]
    assert kinds == story * 2
    assert [e[0] for e in pa.ring] == list(range(1, len(kinds) + 1))


def test_a_failed_icmp_write_is_a_drop_of_its_own():
    for err, counter in ((errno.EAGAIN, "drop_tun_full"), (errno.EWOULDBLOCK, "drop_tun_full"),
                         (errno.EIO, "drop_tun_error")):
        pa = new_path()
        pkt = udp_packet(ttl=1)
        _, _, errors = run_tun(pa, [pkt], icmp_err=err)
        assert nonzero(pa) == {"tun_rx_packets": 1, "tun_rx_bytes": len(pkt), "drop_ttl": 1,
                               counter: 1}


def test_the_ttl_update_is_ipv4s_for_every_checksum():
    # Both directions write dataplane.h's formula out; ipv4.decrement_ttl is the
    # reference. Every checksum value (right or wrong for its header), every TTL from 2.
    template = bytearray(udp_packet())
    packets = []
    for check in range(0x10000):
        pkt = bytearray(template)
        pkt[8], pkt[9] = 2 + check % 254, check >> 8
        pkt[10:12] = check.to_bytes(2, "big")
        packets.append(bytes(pkt))
    pa = new_path()
    for first in range(0, len(packets), 256):
        chunk = packets[first:first + 256]
        bufs, hops, _ = run_tun(pa, chunk)
        for pkt, buf, hop in zip(chunk, bufs, hops):
            assert hop == PEER and bytes(buf[:len(pkt)]) == decremented(pkt), pkt[8:12].hex()
    for first in range(0, len(packets), 256):
        chunk = packets[first:first + 256]
        out = run_udp_batch(pa, [(pkt, PEER) for pkt in chunk])
        for pkt, got in zip(chunk, out):
            assert got == decremented(pkt), pkt[8:12].hex()


# ---- UDP -> TUN -------------------------------------------------------------------------

GOOD = udp_packet("10.5.2.7", "10.5.1.9")
UDP_CASES = [
    # (what, datagram, its source, strict, the one drop counter or None for forwarded)
    ("over the mtu, from a stranger: truncated first", GOOD + bytes(MTU), STRANGER, False,
     "drop_truncated"),
    ("from a stranger", GOOD, STRANGER, False, "drop_bad_source"),
    ("malformed, from a stranger: the source first", b"\x45", STRANGER, False,
     "drop_bad_source"),
    ("empty", b"", PEER, False, "drop_malformed"),
    ("one byte of version 6", b"\x60", PEER, False, "drop_malformed"),
    ("one byte of version 7", b"\x70", PEER, False, "drop_not_ipv4"),
    ("19 bytes of version 7: the version comes first", b"\x70" + bytes(18), PEER, False,
     "drop_not_ipv4"),
    ("19 bytes", b"\x45" + bytes(18), PEER, False, "drop_malformed"),
    ("ihl 4", udp_packet("10.5.2.7", "10.5.1.9", ihl=4), PEER, False, "drop_malformed"),
    ("tot_len short", udp_packet("10.5.2.7", "10.5.1.9", tot_len=35), PEER, False,
     "drop_malformed"),
    ("inner source: our address", udp_packet(OWN_ADDR, "10.5.1.9"), PEER, False,
     "drop_inner_local"),
    ("inner source in our subnet, TTL 1: local first", udp_packet("10.5.1.77", "10.5.1.9",
                                                                  ttl=1), PEER, False,
     "drop_inner_local"),
    ("inner source another peer's, strict", udp_packet("10.5.3.7", "10.5.1.9"), PEER, True,
     "drop_inner_foreign"),
    ("inner source without a route, strict", udp_packet("10.9.0.7", "10.5.1.9"), PEER, True,
     "drop_inner_foreign"),
    ("inner source another peer's, not strict", udp_packet("10.5.3.7", "10.5.1.9"), PEER, False,
     None),
    ("TTL 1: no ICMP on this side", udp_packet("10.5.2.7", "10.5.1.9", ttl=1), PEER, False,
     "drop_ttl"),
    ("good, strict", GOOD, PEER, True, None),
]


@pytest.mark.parametrize("what,payload,src,strict,drop", UDP_CASES, ids=[c[0] for c in UDP_CASES])
def test_udp_checks_in_the_headers_order(what, payload, src, strict, drop):
    pa = new_path(accept_any=False)
    pa.local = {**pa.local, 4: (int(OWN_NET.network_address), int(OWN_NET.netmask),
                                frozenset({int(ipaddress.IPv4Address(OWN_ADDR))}))}
    pa.strict_sources = strict
    out = run_udp(pa, payload, src)
    length = min(len(payload), MTU)
    expect = {"udp_rx_packets": 1, "udp_rx_bytes": length} if length else {"udp_rx_packets": 1}
    if drop is None:
        assert out == decremented(payload)
    else:
        expect[drop] = 1
        assert out is None
    assert nonzero(pa) == with_v6_shares(expect, payload)


def test_each_datagram_is_written_before_the_next_is_looked_at():
    # C writes a datagram right after its checks: path_udp yields it there, so the trace
    # shows each datagram's fate (the caller's write, or a drop) before the next receive.
    pa = new_path(tracing=True)
    datagrams = [GOOD, udp_packet("10.5.2.7", "10.5.1.9", ttl=1), GOOD]
    bufs = [bytearray(MTU + 1) for _ in datagrams]
    for b, d in zip(bufs, datagrams):
        b[:len(d)] = d
    seen = []
    for j in pypath.path_udp(pa, bufs, [len(d) for d in datagrams], [PEER] * 3, 3, MTU):
        seen.append((j, [KIND[e[2]] for e in pa.ring]))
    assert seen == [(0, ["TR_UDP_RECV"]),
                    (2, ["TR_UDP_RECV", "TR_UDP_RECV", "TR_DROP", "TR_UDP_RECV"])]


def test_a_datagram_of_exactly_the_mtu_is_not_truncated():
    pkt = ipv4.build("10.5.2.7", "10.5.1.9", bytes(MTU - 20))
    pa = new_path()
    assert run_udp(pa, pkt) == decremented(pkt)
    assert run_udp(pa, pkt + b"x") is None
    assert nonzero(pa)["drop_truncated"] == 1 and nonzero(pa)["udp_rx_bytes"] == 2 * MTU


# ---- any bytes: counted once ----------------------------------------------------------

def _patch(pkt, changes):
    out = bytearray(pkt)
    for at, value in changes:
        if at < len(out):
            out[at] = value
    return bytes(out)


# Raw bytes, or a packet of each kind with a few bytes overwritten (or none).
ANY_PACKET = st.one_of(
    st.binary(max_size=80),
    st.builds(_patch, st.sampled_from([udp_packet(), udp_packet(dst="10.9.0.1"), udp_packet(ttl=1),
                                       icmp_packet(8, ttl=1), icmp_packet(3, ttl=1), GOOD,
                                       udp_packet(OWN_ADDR, "10.5.1.9")]),
              st.lists(st.tuples(st.integers(0, 59), st.integers(0, 255)), max_size=3)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(packets=st.lists(ANY_PACKET, min_size=1, max_size=40),
       limit=st.sampled_from([(0, 0), (1, 1), (100, 3)]), tracing=st.booleans())
def test_every_tun_packet_is_counted_once(packets, limit, tracing):
    pa = new_path(tracing=tracing, icmp_limit=limit)
    _, hops, errors = run_tun(pa, packets)
    forwarded = sum(h is not None for h in hops)
    assert "unset" not in hops
    assert pa.c[STAT_NAMES.index("tun_rx_packets")] == len(packets)
    assert pa.c[STAT_NAMES.index("tun_rx_bytes")] == sum(map(len, packets))
    assert forwarded + drops(pa) == len(packets)
    sent = pa.c[STAT_NAMES.index("icmp_unreach_sent")] + pa.c[STAT_NAMES.index("icmp_ttl_sent")]
    assert sent == len(errors)
    for i, err in errors:
        assert hops[i] is None and err == ipv4.icmp_error(packets[i], err[20], 0, TUN_ADDR)
    if tracing:
        assert sum(KIND[e[2]] == "TR_TUN_READ" for e in pa.ring) == len(packets)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(datagrams=st.lists(st.tuples(ANY_PACKET, st.sampled_from([PEER, OTHER_PEER, STRANGER])),
                          min_size=1, max_size=40),
       accept_any=st.booleans(), strict=st.booleans(), tracing=st.booleans())
def test_every_udp_datagram_is_counted_once(datagrams, accept_any, strict, tracing):
    pa = new_path(accept_any=accept_any, tracing=tracing)
    pa.local = {**pa.local, 4: (int(OWN_NET.network_address), int(OWN_NET.netmask), frozenset())}
    pa.strict_sources = strict
    out = run_udp_batch(pa, datagrams)
    forwarded = 0
    for (payload, _), got in zip(datagrams, out):
        if got is not None:
            forwarded += 1
            assert got == decremented(payload)
    assert pa.c[STAT_NAMES.index("udp_rx_packets")] == len(datagrams)
    assert forwarded + drops(pa) == len(datagrams)
    assert pa.c[STAT_NAMES.index("icmp_unreach_sent")] == pa.c[STAT_NAMES.index("icmp_ttl_sent")] \
        == pa.c[STAT_NAMES.index("icmp_ratelimited")] == 0


# ---- the ICMP rate limit --------------------------------------------------------------

@settings(max_examples=300, deadline=None, derandomize=True)
@given(rate=st.integers(1, 5000), burst=st.integers(1, 60),
       steps=st.lists(st.tuples(st.integers(0, 2 * 10 ** 9), st.integers(0, 8)), max_size=30))
def test_the_rate_limit_is_a_token_bucket(rate, burst, steps):
    # The same limit written the other way round (as csrc/fuzz/fuzz_packet.c checks C's):
    # a credit of ns, burst * T when full, growing with the clock, T per error.
    pa = new_path(icmp_limit=(rate, burst))
    interval = -(-10 ** 9 // rate)
    credit, now = burst * interval, 10 ** 12
    allowed = denied = 0
    for dt, errors in steps:
        now += dt
        credit = min(burst * interval, credit + dt)
        pa.now_ns = now
        for _ in range(errors):
            expect = credit >= interval
            if expect:
                credit -= interval
                allowed += 1
            else:
                denied += 1
            assert pypath.icmp_allowed(pa) == expect
    assert pa.c[STAT_NAMES.index("icmp_ratelimited")] == denied


def test_rate_zero_is_unlimited():
    pa = new_path(icmp_limit=(0, 0))
    assert all(pypath.icmp_allowed(pa) for _ in range(1000))
    assert not any(pa.c)
