"""Differential test: the C engine against the Python oracle.

A seeded script of route tables and chunks of random packets (valid and
malformed, both directions) is played into each engine in turn. Both must
write the same bytes into the TUN and send the same datagrams to each peer,
in the same order, with the same counters (all but SYSCALL_STATS), and
record the same trace events kind by kind.

Chunks go one direction at a time and each chunk is settled before the next
(tests/engine_harness.py), so the order of outputs is fully determined.
Scripts with `sources` also change the engine's own-source set now and then
and give inner packets sources from it, from the sender's subnet and from
other peers' subnets (dataplane.h, UDP -> TUN steps 4 and 5), with and
without the strict rule.
About a fifth of the routes and packets are IPv6 (dataplane.h, "IPv6 inner packets"): subnets of
every prefix length class, destinations inside and beside them, link-scoped addresses, hop limits
around 1, broken payload lengths, chains of extension headers and ICMPv6 messages (so that the
ICMPv6 errors and the cases RFC 4443 forbids them are compared); the own-source sets have an IPv6
part. A third of the peers are on the IPv6 underlay ("The IPv6 underlay": ::1, a port each), which
IPv6 routes choose as often as the others, with an mtu now and then (packet too big compared), and
which send datagrams as the others do.
Template: selftest/allowedips.c's randomized_test in kernel WireGuard.
"""
import ipaddress
import random
import socket

import pytest

from dataplane.engine import ipv4
from tests.conftest import require_engine
from tests.engine_harness import Harness, behaviour_stats, kernel_drops

MTU = 1472
NPEERS = 6                        # peers of the IPv4 underlay: 0..5
NPEERS6 = 3                       # of the IPv6 underlay: 6..8 (IPv6 routes only)
TUN_ADDR6 = "fc00:5:0:1::"
STRANGER = -1


# ---- the script ---------------------------------------------------------------

V6_BASE = 0xFC00_0005 << 96       # the IPv6 network the v6 routes mostly come from


def random_net6(rnd, plens=(0, 16, 48, 56, 64, 64, 64, 65, 120, 128)):
    plen = rnd.choice(plens)
    base = V6_BASE | rnd.getrandbits(80) << 16 if rnd.random() < 0.85 else rnd.getrandbits(128)
    return ipaddress.IPv6Network((base >> (128 - plen) << (128 - plen) if plen else 0, plen))


def random_routes(rnd):
    routes = []
    for _ in range(rnd.choice([0, 1, 3, 10])):
        net = random_net6(rnd)
        if net.prefixlen == 0 and rnd.random() < 0.7:
            continue
        mtu = rnd.choice([0, 0, 1280, 1300, 1400, 1500])
        routes.append((str(net), rnd.randrange(NPEERS + NPEERS6), mtu))
    for _ in range(rnd.choice([0, 1, 5, 20, 60])):
        plen = rnd.choice([0, 8, 12, 16, 16, 24, 24, 24, 24, 25, 30, 32])
        base = (10 << 24) | rnd.getrandbits(24) if rnd.random() < 0.85 else rnd.getrandbits(32)
        net = ipaddress.IPv4Network((base & ((0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF), plen))
        if plen == 0 and rnd.random() < 0.7:
            continue                      # a default route only now and then
        routes.append((str(net), rnd.randrange(NPEERS), 0))
    return routes


def random_addr6(rnd, routes):
    x = rnd.random()
    nets6 = [ipaddress.IPv6Network(r[0]) for r in routes if ":" in r[0]]
    if x < 0.6 and nets6:
        net = rnd.choice(nets6)
        return str(net.network_address + rnd.getrandbits(128 - net.prefixlen))
    if x < 0.8:
        return str(ipaddress.IPv6Address(V6_BASE | rnd.getrandbits(96)))
    if x < 0.9:                           # link scope, or just beside it
        return rnd.choice(["fe80::1", "febf::2", "fec0::3", "ff02::1", "ff12::16", "ff05::2",
                           "ff0e::1", "::", "::1", "ff00::9", "ff03::3"])
    return str(ipaddress.IPv6Address(rnd.getrandbits(128)))


def chain6(rnd, nh, size):
    """``size`` bytes of payload that begin as a chain of extension headers (the first named
    by ``nh``), each naming the next, a fragment now and then a later one, ending in ICMPv6
    of an error or an informational type, or in UDP."""
    out = bytearray()
    while nh in (0, 44, 60) and len(out) + 16 <= size:
        nxt = rnd.choice([60, 44, 58, 58, 17, 0])
        if nh == 44:
            out += bytes([nxt, 0]) + (rnd.choice([0, 0, 1, 0x1FFF]) << 3 | 1).to_bytes(2, "big")
            out += rnd.randbytes(4)
        else:
            out += bytes([nxt, 0]) + rnd.randbytes(6)
        nh = nxt
    if nh == 58 and len(out) < size:
        out.append(rnd.choice([1, 3, 4, 127, 128, 129, 135, rnd.randrange(256)]))
    return bytes(out) + rnd.randbytes(size - len(out))


def random_packet6(rnd, routes, mtu=MTU, src=None):
    dst = random_addr6(rnd, routes)
    src = src or (random_addr6(rnd, routes) if rnd.random() < 0.3 else
                  str(ipaddress.IPv6Address(V6_BASE | rnd.getrandbits(96))))
    hop = rnd.choice([0, 1, 1, 2, 2, 3, 64, 255, rnd.randrange(256)])
    # Near the mtu now and then: over a route's mtu (packet too big) or just under it.
    size = min(rnd.choice([0, 1, 8, 40, rnd.randrange(300), rnd.randrange(max(1, mtu - 40)),
                           rnd.randrange(max(1, mtu - 240), max(2, mtu - 39))]),
               max(0, mtu - 40))
    first = (6 << 28 | rnd.getrandbits(8) << 20 | rnd.getrandbits(20)).to_bytes(4, "big")
    nh = rnd.choice([17, 6, 58, 0, 44, 60])
    payload = chain6(rnd, nh, size) if rnd.random() < 0.6 else rnd.randbytes(size)
    pkt = bytearray(first + size.to_bytes(2, "big") + bytes([nh, hop])
                    + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed
                    + payload)
    if rnd.random() < 0.25:               # break it
        how = rnd.randrange(6)
        if how == 0:
            pkt = pkt[:rnd.randrange(41)]
        elif how == 1:
            pkt[4:6] = ((size + rnd.choice([-1, 1, 7, -size])) & 0xFFFF).to_bytes(2, "big")
        elif how == 2:
            pkt += rnd.randbytes(rnd.randrange(1, 5))
        elif how == 3:
            pkt[0] = rnd.choice([0x4, 0x7, 0x0]) << 4 | (pkt[0] & 15)
        elif how == 4:                     # longer than the mtu
            extra = mtu - len(pkt) + rnd.randrange(1, 100)
            pkt += rnd.randbytes(max(0, extra))
            pkt[4:6] = ((len(pkt) - 40) & 0xFFFF).to_bytes(2, "big")
        else:                              # exactly the mtu
            pkt += rnd.randbytes(max(0, mtu - len(pkt)))
            pkt[4:6] = ((len(pkt) - 40) & 0xFFFF).to_bytes(2, "big")
    return bytes(pkt)


def random_dst(rnd, routes):
    routes = [r for r in routes if ":" not in r[0]]
    x = rnd.random()
    if x < 0.65 and routes:
        net = ipaddress.IPv4Network(rnd.choice(routes)[0])
        return str(net[rnd.randrange(net.num_addresses)])
    if x < 0.9:
        return str(ipaddress.IPv4Address((10 << 24) | rnd.getrandbits(24)))
    return str(ipaddress.IPv4Address(rnd.getrandbits(32)))


def random_local(rnd):
    """An own-source set: a lease subnet (or none) and a few addresses, of both families."""
    net = net6 = None
    if rnd.random() < 0.8:
        plen = rnd.choice([16, 24, 24, 26, 32])
        net = str(ipaddress.IPv4Network(((10 << 24) | rnd.getrandbits(24), plen), strict=False))
    if rnd.random() < 0.6:
        net6 = str(random_net6(rnd, (48, 64, 64, 80, 128)))
    addrs = [str(ipaddress.IPv4Address(rnd.choice([(10 << 24) | rnd.getrandbits(24),
                                                   0xC0A83200 | rnd.getrandbits(8),
                                                   rnd.getrandbits(32)])))
             for _ in range(rnd.choice([0, 1, 3, 8]))]
    addrs += [str(ipaddress.IPv6Address(V6_BASE | rnd.getrandbits(96)))
              for _ in range(rnd.choice([0, 1, 3]))]
    return net, addrs, net6


def random_src(rnd, routes, local, sender):
    """An inner source: the host's own, one routed to the sender, one routed
    to another peer, or any."""
    x = rnd.random()
    net, addrs, net6 = local
    six = rnd.random() < 0.2
    addrs = [a for a in addrs if (":" in a) == six]
    net = net6 if six else net
    if x < 0.15 and addrs:
        return rnd.choice(addrs)
    if x < 0.3 and net:
        n = ipaddress.ip_network(net)
        return str(n.network_address + rnd.getrandbits(n.max_prefixlen - n.prefixlen))
    own = [r for r in routes if r[1] == sender and (":" in r[0]) == six]
    pick = own if x < 0.7 else [r for r in routes if (":" in r[0]) == six]
    if pick:
        n = ipaddress.ip_network(rnd.choice(pick)[0])
        return str(n.network_address + rnd.getrandbits(n.max_prefixlen - n.prefixlen))
    return None


def random_any(rnd, routes, mtu=MTU, src=None):
    """An IPv4 or (a fifth of the time, or when src is IPv6) an IPv6 packet."""
    if (src is not None and ":" in src) or (src is None and rnd.random() < 0.2):
        return random_packet6(rnd, routes, mtu, src)
    return random_packet(rnd, routes, mtu, src)


def random_packet(rnd, routes, mtu=MTU, src=None):
    dst = random_dst(rnd, routes)
    src = src or str(ipaddress.IPv4Address((10 << 24) | rnd.getrandbits(24)))
    ttl = rnd.choice([0, 1, 1, 2, 2, 3, 64, 64, 255, rnd.randrange(256)])
    proto = rnd.choice([17, 17, 6, 1, 1, rnd.randrange(256)])
    size = rnd.choice([0, 1, 7, 8, 9, 16, 40, rnd.randrange(300), rnd.randrange(mtu - 60)])
    size = min(size, mtu - 60)
    if proto == 1 and size >= 8:
        payload = ipv4.icmp_message(rnd.choice([0, 3, 4, 5, 8, 11, 12, 13, rnd.randrange(256)]),
                                    rnd.randrange(16), rnd.getrandbits(32),
                                    rnd.randbytes(size - 8))
    else:
        payload = rnd.randbytes(size)
    kw = {}
    if rnd.random() < 0.2:
        kw["options"] = rnd.randbytes(4 * rnd.randrange(1, 11))
    if rnd.random() < 0.2:
        kw["flags"] = rnd.randrange(8)
        kw["frag_offset"] = rnd.choice([0, 1, rnd.randrange(0x2000)])
    if rnd.random() < 0.1:
        kw["check"] = rnd.getrandbits(16)
    pkt = bytearray(ipv4.build(src, dst, payload, proto=proto, ttl=ttl, tos=rnd.getrandbits(8),
                               ident=rnd.getrandbits(16), **kw))
    if rnd.random() < 0.25:               # break it
        how = rnd.randrange(10)
        if how == 0:
            pkt = pkt[:rnd.randrange(20)]
        elif how == 1:
            pkt[0] = rnd.choice([0x0, 0x6, 0x5, 0xF]) << 4 | (pkt[0] & 15)
        elif how == 2:
            pkt[0] = 0x40 | rnd.randrange(5)
        elif how == 3:
            pkt[0] = 0x4F
            pkt = pkt[:rnd.randrange(20, 60)]
            pkt[2:4] = len(pkt).to_bytes(2, "big")
        elif how == 4:
            pkt[2:4] = ((len(pkt) + rnd.choice([-3, -1, 1, 2, 500])) & 0xFFFF).to_bytes(2, "big")
        elif how == 5:
            pkt += rnd.randbytes(rnd.randrange(1, 5))
        elif how == 6:
            pkt = bytearray(rnd.randbytes(rnd.randrange(0, 80)))
        elif how == 7:
            pkt = bytearray()
        elif how == 8:                     # longer than the mtu (TUN: cut; UDP: truncated)
            pkt = bytearray(ipv4.build(src, dst, rnd.randbytes(mtu - 20 + rnd.randrange(1, 200)),
                                       ttl=ttl))
        else:                              # exactly the mtu
            pkt = bytearray(ipv4.build(src, dst, rnd.randbytes(mtu - 20), ttl=ttl))
    return bytes(pkt)


def make_script(seed, npackets, mtu=MTU, sources=False):
    rnd = random.Random(seed)
    steps, routes, count, local = [], [], 0, (None, [], None)
    while count < npackets:
        if rnd.random() < 0.12 or not steps:
            routes = random_routes(rnd)
            steps.append(("routes", routes))
        if sources and (rnd.random() < 0.1 or len(steps) == 1):
            local = random_local(rnd)
            steps.append(("local", local))
        n = rnd.randrange(1, 40)
        if rnd.random() < 0.5:
            steps.append(("tun", [random_any(rnd, routes, mtu) for _ in range(n)]))
        else:
            items = []
            # One underlay per chunk: the engines read each socket in batches of its own, so
            # the order of two sockets' datagrams in the TUN is the kernel's, not theirs.
            six = rnd.random() < 0.3
            for _ in range(n):
                who = rnd.randrange(NPEERS, NPEERS + NPEERS6) if six else \
                    STRANGER if rnd.random() < 0.1 else rnd.randrange(NPEERS)
                src = random_src(rnd, routes, local, who) if sources else None
                items.append((who, random_any(rnd, routes, mtu, src)))
            steps.append(("udp", items))
        count += n
    return steps


# ---- playing it -------------------------------------------------------------------

def play(kind, steps, *, accept_any, batch, trace, mtu=MTU, strict=False):
    with Harness(kind, mtu=mtu, accept_any=accept_any, batch=batch, udp6=True) as h:
        h.engine.set_strict_sources(strict)
        h.engine.set_tun_addr(TUN_ADDR6)            # so that ICMPv6 errors are compared
        peers = [h.add_peer() for _ in range(NPEERS)] + \
            [h.add_peer(family=socket.AF_INET6) for _ in range(NPEERS6)]
        # By address and port: sockets bound to different addresses (and the two families)
        # may share a port number.
        who = {(_trace_addr(p.ip), p.port): i for i, p in enumerate(peers)}
        who[(_trace_addr(h.stranger.ip), h.stranger.port)] = STRANGER
        events = []
        if trace:
            h.engine.trace(True)
        for step, arg in steps:
            if step == "routes":
                h.set_routes([h.route(net, peers[i], mtu) for net, i, mtu in arg])
            elif step == "local":
                h.engine.set_local([n for n in arg[::2] if n is not None], arg[1])
            elif step == "tun":
                h.inject_tun(*arg)
            else:
                for i, data in arg:
                    h.inject_udp(None if i == STRANGER else peers[i], data)
            h.settle()
            if trace:
                events += h.engine.trace_events(events[-1]["seq"] if events else 0)
        return {
            "stats": behaviour_stats(h.settle()),
            "tun": list(h.tun_received),
            "peers": [list(p.received) for p in peers],
            "stranger": list(h.stranger.received),
            "events": normalise(events, who),
        }


def _trace_addr(ip: str) -> str:
    """A peer's address as trace events give it: an IPv6 one as 0.0.0.0 (they hold 32 bits)."""
    return ip if ipaddress.ip_address(ip).version == 4 else "0.0.0.0"


def normalise(events, who):
    """Events grouped by kind (the interleaving of kinds depends on how reads
    were batched), ports replaced by peer index (ephemeral ports differ
    between runs; a peer is known by address and port), and without seq/ts/batch
    (batching). Drop events keep their reason, which the header puts in `batch`."""
    if events:
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "trace seq has gaps"
    by_kind = {}
    for e in events:
        port = who.get((e["addr"], e["port"]), e["port"]) if e["kind"] in (
            "route_hit", "udp_send", "udp_recv") else e["port"]
        extra = e["batch"] if e["kind"] == "drop" else None
        by_kind.setdefault(e["kind"], []).append((e["len"], e["addr"], port, extra, e["head"]))
    return by_kind


def compare(a, b):
    assert a["stats"] == b["stats"]
    assert a["stranger"] == b["stranger"] == []
    assert len(a["tun"]) == len(b["tun"])
    for i, (x, y) in enumerate(zip(a["tun"], b["tun"])):
        assert x == y, f"TUN output {i}: {ipv4.describe(x)} != {ipv4.describe(y)}"
    for k, (pa, pb) in enumerate(zip(a["peers"], b["peers"])):
        assert len(pa) == len(pb), f"peer {k}"
        for i, (x, y) in enumerate(zip(pa, pb)):
            assert x == y, f"peer {k} datagram {i}: {ipv4.describe(x)} != {ipv4.describe(y)}"
    assert a["events"].keys() == b["events"].keys()
    for kind in a["events"]:
        assert a["events"][kind] == b["events"][kind], kind


@pytest.mark.parametrize("seed,npackets,accept_any,batch,trace,mtu,sources,strict", [
    (1, 4000, True, 64, False, MTU, False, False),
    (2, 3000, False, 7, False, MTU, False, False),
    (3, 1000, True, 256, True, MTU, False, False),
    (4, 600, False, 1, True, MTU, False, False),
    (5, 800, True, 16, True, 68, False, False),   # the smallest mtu: quotes longer than it
    (6, 500, True, 64, False, 9000, False, False),
    (7, 2000, False, 32, True, MTU, True, False),  # own sources
    (8, 2000, True, 64, False, MTU, True, True),   # own sources and the strict rule
    (9, 1000, False, 5, True, MTU, True, True),
])
def test_c_matches_python(seed, npackets, accept_any, batch, trace, mtu, sources, strict):
    require_engine("c")
    steps = make_script(seed, npackets, mtu, sources)
    for attempt in range(3):
        # Loopback drops datagrams when the host is flooded (other tests,
        # benchmarks): a run that lost packets in the kernel proves nothing
        # about the engines, so it is played again (at most twice).
        drops0 = kernel_drops()
        try:
            kw = dict(accept_any=accept_any, batch=batch, trace=trace, mtu=mtu, strict=strict)
            py = play("python", steps, **kw)
            c = play("c", steps, **kw)
            compare(c, py)
            break
        except AssertionError:
            if attempt == 2 or kernel_drops() == drops0:
                raise
    # The script must have exercised every behaviour counter but the
    # failures of the kernel (send error, full or failing TUN).
    exercised = {k for k, v in py["stats"].items() if v}
    assert exercised >= {"tun_rx_packets", "udp_tx_packets", "udp_rx_packets", "tun_tx_packets",
                         "icmp_unreach_sent", "icmp_ttl_sent", "drop_no_route", "drop_ttl",
                         "drop_malformed", "drop_not_ipv4", "drop_truncated", "drop_scope",
                         "route_swaps",
                         # IPv6's shares ("Counters by family"), compared as every counter is
                         "v6_tun_rx_packets", "v6_udp_tx_packets", "v6_udp_rx_packets",
                         "v6_tun_tx_packets", "v6_icmp_unreach_sent", "v6_icmp_ttl_sent",
                         "v6_drop_no_route", "v6_drop_ttl", "v6_drop_malformed"}
    if mtu > 1280 and npackets >= 1000:
        assert {"drop_too_big", "icmp_too_big_sent"} <= exercised
    if not accept_any:
        assert {"drop_bad_source", "v6_drop_bad_source"} <= exercised
    if sources:
        assert {"drop_inner_local", "v6_drop_inner_local"} <= exercised
    assert ("drop_inner_foreign" in exercised) == strict == ("v6_drop_inner_foreign" in exercised)
