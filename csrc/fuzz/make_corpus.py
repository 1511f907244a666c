"""Writes the seed corpus of fuzz_packet.c into csrc/fuzz/corpus/.

    python csrc/fuzz/make_corpus.py

The seeds are real packets from dataplane.engine.ipv4's and ipv6's builders (the
ones the engine tests use) and a few malformed ones, wrapped in the input layout
described at the top of fuzz_packet.c. Regression inputs (crashes found by
fuzzing) live beside them as corpus/regress-*; this script leaves those alone.
"""
from __future__ import annotations

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from dataplane.engine import ipv4, ipv6  # noqa: E402

CORPUS = os.path.join(HERE, "corpus")

# flags byte
ACCEPT_ANY, TRACE, KEEP_HOST_BITS, UDP_RUNS, STRICT, LOCAL = 1, 2, 16, 32, 64, 128
LIMIT_NONE, LIMIT_ONE, LIMIT_DEFAULT, LIMIT_BYTES = 0 << 2, 1 << 2, 2 << 2, 3 << 2
# a route's peer byte, above the peer index: its IPv6 route on the IPv6 underlay, its mtu
UNDERLAY6, MTU_1280, MTU_1400, MTU_1500 = 8, 1 << 4, 2 << 4, 3 << 4
# packet ctl byte
TUN, UDP, TRUNC = 0, 1, 2
WRITE_OK, WRITE_EAGAIN, WRITE_EIO = 0 << 2, 2 << 2, 3 << 2


def mtu_byte(mtu: int) -> int:
    return (mtu - 68) // 6


def route(net: str, plen: int, peer: int) -> bytes:
    return bytes(int(x) for x in net.split(".")) + bytes([plen, peer])


def packet(ctl: int, data: bytes, src: int = 0, clock: int = 0) -> bytes:
    """src (UDP: 0-7 a route's peer, 7 being 0.0.0.0; 8-14 the IPv6 underlay's peer src - 8;
    15 the IPv4 0.0.0.0) and clock share the high nibble."""
    return bytes([ctl | (src or clock) << 4]) + struct.pack("!H", len(data)) + data


def own(net: str, plen: int, addrs: list[str]) -> bytes:
    """The own-source set that follows the routes when the LOCAL flag is set."""
    return ipv4._addr(net) + bytes([plen, len(addrs)]) + b"".join(ipv4._addr(a) for a in addrs)


def seed(flags: int, mtu: int, routes: list[bytes], packets: list[bytes], rate: int = 0,
         burst: int = 0, local: bytes = b"") -> bytes:
    return bytes([flags, mtu_byte(mtu), rate, burst, len(routes)]) + b"".join(routes) + \
        local + b"".join(packets)


def udp(src, dst, n=16, **kw):
    return ipv4.build(src, dst, ipv4.udp_payload(4000, 5000, b"d" * n), **kw)


def tcp(seq: int, n: int, flags: int = 0x10, ident: int = 0, opts: bytes = b"", **kw) -> bytes:
    """A TCP segment with valid checksums from IN to OUT (UDP side: TUN GRO runs)."""
    th = bytearray(struct.pack("!HHIIBBHHH", 40000, 5201, seq, 1, (20 + len(opts)) // 4 << 4,
                               flags, 500, 0, 0) + opts + bytes((seq + i) & 255 for i in range(n)))
    pseudo = ipv4._addr(IN) + ipv4._addr(OUT) + struct.pack("!HH", 6, len(th))
    th[16:18] = ipv4.checksum(pseudo + th).to_bytes(2, "big")
    return ipv4.build(IN, OUT, bytes(th), proto=6, ident=ident, flags=2, **kw)


def udp_ck(n: int, ident: int, sport: int = 4000, fill: int = 0, **kw) -> bytes:
    """A UDP datagram from IN to OUT with a valid checksum (TUN GRO UDP runs)."""
    uh = bytearray(struct.pack("!HHHH", sport, 5000, 8 + n, 0) + bytes([fill]) * n)
    pseudo = ipv4._addr(IN) + ipv4._addr(OUT) + struct.pack("!HH", 17, len(uh))
    uh[6:8] = ipv4.checksum(pseudo + uh).to_bytes(2, "big")
    return ipv4.build(IN, OUT, bytes(uh), ident=ident, flags=2, **kw)


def with_byte(p: bytes, i: int, v: int) -> bytes:
    b = bytearray(p)
    b[i] = v
    return bytes(b)


ROUTES = [route("10.5.2.0", 24, 0), route("10.5.3.0", 24, 1), route("10.6.0.0", 16, 2)]
OUT = "10.5.1.9"                     # a pod on this host
IN = "10.5.2.7"                      # a pod behind peer 0

GOOD_TUN = [
    udp(OUT, "10.5.2.3"),
    udp(OUT, "10.5.3.200", n=400, ttl=2),
    udp(OUT, "10.6.7.8", options=b"\x94\x04\x00\x00"),
    ipv4.build(OUT, "10.5.2.3", ipv4.echo_request(7, 1), proto=1),
]
ICMP_TUN = [
    udp(OUT, "10.9.0.1"),                                   # no route: unreachable
    udp(OUT, "10.5.2.3", ttl=1),                            # time exceeded
    ipv4.build(OUT, "10.5.2.3", ipv4.echo_request(), proto=1, ttl=0),
    udp(OUT, "10.9.0.1", options=bytes(40)),                # ihl 15: the longest quote
    udp(OUT, "10.9.0.1", n=0),
    ipv4.build(OUT, "10.9.0.1", b"abc"),                    # quote shorter than ihl*4 + 8
    ipv4.build(OUT, "10.5.2.3", b"1234567", ttl=1),         # one byte short of it
    ipv4.build(OUT, "10.9.0.1", b""),
]
QUIET_TUN = [
    ipv4.build(OUT, "10.9.0.1", ipv4.echo_request(), proto=1),            # ICMP: no unreachable
    ipv4.build(OUT, "10.5.2.3", ipv4.icmp_message(11, 0, 0, b"q" * 28), proto=1, ttl=1),
    udp(OUT, "10.9.0.1", frag_offset=5),                    # later fragment
    udp(OUT, "10.5.2.3", ttl=1, flags=1, frag_offset=185),
]
MALFORMED = [
    b"", b"\x45", udp(OUT, "10.5.2.3")[:19],
    with_byte(udp(OUT, "10.5.2.3"), 0, 0x65),               # version 6
    with_byte(udp(OUT, "10.5.2.3"), 0, 0x44),               # ihl 4
    with_byte(udp(OUT, "10.5.2.3"), 0, 0x4F),               # ihl 15 > len
    udp(OUT, "10.5.2.3", tot_len=30), udp(OUT, "10.5.2.3", tot_len=0),
    udp(OUT, "10.5.2.3") + b"\0\0",                          # trailing bytes
    bytes([0x60]) + bytes(39),                               # IPv6-looking
    udp(OUT, "10.5.2.3", check=0x0BAD),                      # wrong checksum: forwarded
    udp(OUT, "10.5.2.3", check=0x0000), udp(OUT, "10.5.2.3", check=0xFFFF),
]
GOOD_UDP = [udp(IN, OUT), udp(IN, OUT, n=1000, ttl=2), udp("10.5.3.4", OUT, ttl=255)]


TCP_RUNS = ([tcp(1000 + 100 * i, 100, ident=i) for i in range(5)]         # one run
            + [tcp(1500, 100, 0x18, ident=5)]                             # PSH ends it
            + [tcp(1600 + 100 * i, 100, ident=6 + i) for i in range(3)]
            + [tcp(1900, 40, ident=9), tcp(1940, 100, ident=10)]          # short ends it
            + [tcp(2040, 100, 0x11, ident=11), tcp(2140, 0, ident=12)]    # FIN, pure ACK
            + [tcp(2140 + 60 * i, 60, ident=13 + i, opts=b"\x01\x01\x08\x0a" + bytes(8))
               for i in range(4)])


UDP_RUNS_PKTS = ([udp_ck(64, i, fill=i) for i in range(6)]                 # one run
                 + [udp_ck(30, 6), udp_ck(64, 7)]                        # short ends it
                 + [udp_ck(64, 8, sport=4001), udp(IN, OUT, n=64)]      # other flow, no csum
                 + [udp_ck(64, 9 + i) for i in range(3)])


# IPv6: fuzz_packet.c derives an IPv6 route from each IPv4 one (an even index's net at bytes
# 4-7, prefixlen + 32; an odd one's at bytes 12-15, prefixlen + 96), so ROUTES gives
# 0:0:a05:200::/56 (peer 0), ::a05:300/120 (peer 1) and 0:0:a06::/48 (peer 2); an own-source
# set gives ::a.b.c.d/prefixlen + 96.
OUT6 = "0:0:a05:100::9"             # a pod on this host
IN6 = "0:0:a05:207::7"              # a pod behind peer 0


def udp6(src, dst, n=16, **kw):
    return ipv6.build(src, dst, ipv6.udp_payload(src, dst, 4000, 5000, b"d" * n), **kw)


GOOD_TUN6 = [
    udp6(OUT6, "0:0:a05:203::3"),
    udp6(OUT6, "::a05:3c8", n=400, hop_limit=2),
    udp6(OUT6, "0:0:a06:7:8::1"),
    ipv6.echo_request(OUT6, "0:0:a05:203::3"),
]
QUIET_TUN6 = [
    udp6(OUT6, "fc00::1"),                                   # no route
    udp6(OUT6, "0:0:a05:203::3", hop_limit=1),               # hop limit
    ipv6.echo_request(OUT6, "fc00::1"),
    udp6("fe80::1", "0:0:a05:203::3"),                      # link scope
    udp6(OUT6, "ff02::1"), udp6(OUT6, "ff05::1"), udp6("::", "ff02::1:ff00:9"),
]
MALFORMED6 = [
    udp6(OUT6, "0:0:a05:203::3")[:39],
    udp6(OUT6, "0:0:a05:203::3", payload_len=7),
    udp6(OUT6, "0:0:a05:203::3") + b"\0",
    udp6(OUT6, "0:0:a05:203::3", version=7),
]
GOOD_UDP6 = [udp6(IN6, OUT6), udp6(IN6, OUT6, n=1000, hop_limit=2), udp6("::a05:304", OUT6)]


def seeds() -> dict[str, bytes]:
    s = {}
    s["tun-forward"] = seed(ACCEPT_ANY, 1472, ROUTES, [packet(TUN, p) for p in GOOD_TUN])
    s["tun-icmp"] = seed(ACCEPT_ANY, 1472, ROUTES,
                         [packet(TUN | WRITE_OK, p, clock=1) for p in ICMP_TUN + QUIET_TUN])
    s["tun-icmp-write-fails"] = seed(ACCEPT_ANY, 1472, ROUTES,
                                     [packet(TUN | WRITE_EAGAIN, ICMP_TUN[0]),
                                      packet(TUN | WRITE_EIO, ICMP_TUN[1])])
    s["tun-malformed"] = seed(ACCEPT_ANY | TRACE, 1472, ROUTES,
                              [packet(TUN, p) for p in MALFORMED])
    s["udp-forward"] = seed(ACCEPT_ANY, 1472, ROUTES,
                            [packet(UDP | WRITE_OK, p, src=i % 3) for i, p in enumerate(GOOD_UDP)]
                            + [packet(UDP | WRITE_EAGAIN, GOOD_UDP[0]),
                               packet(UDP | WRITE_EIO, GOOD_UDP[1])])
    s["udp-malformed"] = seed(ACCEPT_ANY | TRACE, 1472, ROUTES,
                              [packet(UDP, p) for p in MALFORMED]
                              + [packet(UDP, udp(IN, OUT, ttl=1)),
                                 packet(UDP | TRUNC, udp(IN, OUT))])
    s["udp-tcp-runs"] = seed(ACCEPT_ANY, 1472, ROUTES,
                             [packet(UDP | (WRITE_EAGAIN if i == 3 else 0), p)
                              for i, p in enumerate(TCP_RUNS)])
    s["udp-udp-runs"] = seed(ACCEPT_ANY | UDP_RUNS, 1472, ROUTES,
                             [packet(UDP | (WRITE_EAGAIN if i == 2 else 0), p)
                              for i, p in enumerate(UDP_RUNS_PKTS + TCP_RUNS[:3])])
    s["udp-strict-sources"] = seed(0, 1472, ROUTES,
                                   [packet(UDP, GOOD_UDP[0], src=0),
                                    packet(UDP, GOOD_UDP[0], src=9),     # stranger
                                    packet(UDP, GOOD_UDP[0], src=5),     # peer of no route
                                    packet(UDP, MALFORMED[3], src=12)])
    s["udp-strict-zero-peer"] = seed(0, 1472, [route("10.5.2.0", 24, 7)],
                                     [packet(UDP, GOOD_UDP[0], src=7),     # 0.0.0.0: a peer
                                      packet(UDP, GOOD_UDP[0], src=1)])    # 127.0.0.17: not
    s["udp-strict-no-routes"] = seed(0, 1472, [], [packet(UDP, GOOD_UDP[0], src=0)])
    mine = own("10.5.1.0", 24, ["192.168.50.2", "10.5.1.0"])
    s["udp-inner-local"] = seed(ACCEPT_ANY | LOCAL, 1472, ROUTES,
                                [packet(UDP, udp(a, OUT), src=0) for a in
                                 ("192.168.50.2", "10.5.1.0", "10.5.1.77", IN, "10.5.0.1")]
                                + [packet(UDP, udp("192.168.50.2", OUT, ttl=1), src=0),
                                   packet(UDP, with_byte(udp("10.5.1.7", OUT), 0, 0x44), src=0),
                                   packet(UDP, udp("10.5.1.7", OUT), src=9)], local=mine)
    s["udp-inner-strict"] = seed(STRICT | LOCAL, 1472, ROUTES,
                                 [packet(UDP, udp(IN, OUT), src=0),
                                  packet(UDP, udp("10.5.3.4", OUT), src=0),     # peer 1's
                                  packet(UDP, udp("10.5.3.4", OUT), src=1),
                                  packet(UDP, udp("192.0.2.1", OUT), src=2),    # no route
                                  packet(UDP, udp("10.5.1.9", OUT), src=0)],    # own first
                                 local=mine)
    s["udp-inner-strict-any"] = seed(ACCEPT_ANY | STRICT, 1472, ROUTES,
                                     [packet(UDP, udp(IN, OUT), src=9),         # stranger
                                      packet(UDP, udp("10.6.1.1", OUT), src=2)])
    s["udp-inner-host-bits"] = seed(ACCEPT_ANY | LOCAL | KEEP_HOST_BITS, 1472, ROUTES,
                                    [packet(UDP, udp("10.5.1.9", OUT), src=0)],
                                    local=own("10.5.1.1", 24, []))
    s["icmp-flood-limit-one"] = seed(ACCEPT_ANY | LIMIT_ONE, 1472, ROUTES,
                                     [packet(TUN, udp(OUT, f"10.9.0.{i}")) for i in range(12)]
                                     + [packet(TUN, udp(OUT, "10.9.0.1"), clock=15)])
    s["icmp-flood-default-limit"] = seed(ACCEPT_ANY | LIMIT_DEFAULT, 1472, ROUTES,
                                         [packet(TUN, udp(OUT, f"10.9.1.{i}", n=0))
                                          for i in range(60)])
    s["icmp-flood-rate-bytes"] = seed(ACCEPT_ANY | LIMIT_BYTES, 1472, ROUTES,
                                      [packet(TUN, udp(OUT, "10.5.2.3", ttl=1, ident=i), clock=i % 4)
                                       for i in range(20)], rate=5, burst=3)
    s["mtu-68"] = seed(ACCEPT_ANY, 68, ROUTES,
                       [packet(TUN, udp(OUT, "10.9.0.1", n=20, options=bytes(8))),
                        packet(TUN, udp(OUT, "10.5.2.3", n=40)),
                        packet(UDP, udp(IN, OUT, n=40)), packet(UDP, udp(IN, OUT, n=41))])
    s["routes-lpm"] = seed(ACCEPT_ANY, 1472,
                           [route("0.0.0.0", 0, 3), route("10.0.0.0", 8, 4),
                            route("10.5.2.0", 24, 0), route("10.5.2.128", 25, 1),
                            route("10.5.2.200", 32, 2), route("10.5.2.0", 24, 5)],
                           [packet(TUN, udp(OUT, d)) for d in
                            ("10.5.2.1", "10.5.2.129", "10.5.2.200", "10.77.0.1", "192.0.2.1")])
    s["routes-host-bits"] = seed(ACCEPT_ANY | KEEP_HOST_BITS, 1472, [route("10.5.2.1", 24, 0)],
                                 [packet(TUN, udp(OUT, "10.5.2.3"))])
    s["jumbo"] = seed(ACCEPT_ANY | LIMIT_ONE, 1598, ROUTES,
                      [packet(TUN, udp(OUT, "10.5.2.3", n=1570)),
                       packet(UDP, udp(IN, OUT, n=1570))])
    s["tun6-forward"] = seed(ACCEPT_ANY | TRACE, 1472, ROUTES,
                             [packet(TUN, p) for p in GOOD_TUN6 + QUIET_TUN6 + MALFORMED6])
    s["udp6-forward"] = seed(ACCEPT_ANY, 1472, ROUTES,
                             [packet(UDP, p, src=i % 3) for i, p in enumerate(GOOD_UDP6)]
                             + [packet(UDP, p) for p in MALFORMED6 + QUIET_TUN6[1:]])
    mine6 = own("10.5.1.0", 24, ["192.168.50.2", "10.5.1.0"])    # ::a05:100/120 and two more
    s["udp6-inner-strict"] = seed(STRICT | LOCAL, 1472, ROUTES,
                                  [packet(UDP, udp6(IN6, OUT6), src=0),
                                   packet(UDP, udp6("::a05:304", OUT6), src=0),   # peer 1's
                                   packet(UDP, udp6("::a05:304", OUT6), src=1),
                                   packet(UDP, udp6("fd00::1", OUT6), src=2),      # no route
                                   packet(UDP, udp6("::a05:109", OUT6), src=0),    # own subnet
                                   packet(UDP, udp6("::c0a8:3202", OUT6), src=0)],  # own address
                                  local=mine6)
    # The IPv6 underlay (bits of the layout left unused): route 0's IPv6 peer is
    # 2001:db8::127.0.0.16 with an mtu of 1280, route 1's the IPv4-mapped 127.0.0.17 with 1400,
    # route 2's 2001:db8::127.0.0.18; a datagram from source 8 + k comes from 2001:db8::(peer k).
    routes6 = [route("10.5.2.0", 24, 0 | UNDERLAY6 | MTU_1280), route("10.5.3.0", 24, 1 | MTU_1400),
               route("10.6.0.0", 16, 2 | UNDERLAY6)]
    s["underlay6-too-big"] = seed(ACCEPT_ANY | LIMIT_ONE, 1472, routes6,
                                  [packet(TUN, udp6(OUT6, "0:0:a05:203::3", n=1280 - 48)),
                                   packet(TUN, udp6(OUT6, "0:0:a05:203::3", n=1281 - 48)),
                                   packet(TUN, udp6(OUT6, "0:0:a05:203::3", n=1300,
                                                    hop_limit=1), clock=15),
                                   packet(TUN, udp6(OUT6, "::a05:3c8", n=1401 - 48), clock=15),
                                   packet(TUN, udp6(OUT6, "0:0:a06:7:8::1", n=1400)),
                                   packet(TUN, udp(OUT, "10.5.2.3", n=1400))])
    s["underlay6-sources"] = seed(STRICT, 1472, routes6,
                                  [packet(UDP, udp6(IN6, OUT6), src=8),          # peer 0's
                                   packet(UDP, udp6(IN6, OUT6), src=0),          # IPv4: not it
                                   packet(UDP, udp6("::a05:304", OUT6), src=9),  # mapped peer
                                   packet(UDP, udp6("::a05:304", OUT6), src=1),
                                   packet(UDP, udp(IN, OUT), src=8),             # inner IPv4
                                   packet(UDP, udp6("0:0:a06::5", OUT6), src=10),
                                   packet(UDP, udp6(IN6, OUT6), src=13)])        # no peer
    return s


def main() -> None:
    os.makedirs(CORPUS, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(CORPUS, f"seed-{name}"), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds())} seeds into {CORPUS}")


if __name__ == "__main__":
    main()
