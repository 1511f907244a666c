"""The per-packet work of both directions, with no I/O: csrc/path.c in Python.

Each function is path.c's of the same name without the ``dp_`` prefix
(``dp_path_udp`` is :func:`path_udp`): the same steps of csrc/dataplane.h, in
the same order, counting the same counters, so that the two files can be read
side by side. pyengine.py makes the syscalls around them, as tx.c, rx.c and
loop.c do around path.c; tests/unit/test_pypath.py calls them directly.

Flow, in the order the functions appear:
  1. Path,                 the state (struct dp_path, made as dp_path_init makes
     path_set_icmp_limit   it) and the ICMP rate limit's setter, for any thread
     trace_record,         the trace ring (trace.c) and a drop counted with its
     path_drop             trace event (internal.h's dp_path_drop)
  2. icmp_allowed          the ICMP rate limit: dataplane.h's GCRA, integer for integer
  3. icmp_error,           build an ICMP or ICMPv6 error into pa.icmp, if
     icmp_error6           allowed
  4. path_tun              TUN -> UDP: the checks of dataplane.h in its order,
                           route, TTL, TTL - 1; where to send each packet.
                           IPv6 takes a branch of its own after the version:
                           length, link scope, route, hop limit, the route's
                           mtu, hop limit - 1, with its ICMPv6 errors;
     path_too_big          a packet the underlay refused as over its path MTU
  5. path_udp              UDP -> TUN: truncated, source, checks, inner
                           source, TTL, TTL - 1; which datagrams to write.
                           IPv6 branches after the version as in path_tun,
                           with the inner source checks between scope and
                           hop limit
  6. tun_write_drop,       the outcome of the caller's write into the TUN
     path_icmp_written

Every packet handed in is counted in its rx counters and then either forwarded
or counted in exactly one drop counter; an ICMP error adds icmp_*_sent,
icmp_ratelimited or a TUN write drop of its own.

Where it differs from path.c, because a Python call, or a counter update in
the shared list, costs about as much as a whole step of the checks, and every
packet passes here:

* path_tun and path_udp take a batch (the reads of one TUN batch, the
  datagrams of one receive), keep its counters in locals, and are
  generators: they yield where the caller must write into the TUN before
  the next packet is looked at (an ICMP error; a datagram to forward), so
  that everything, trace events included, happens in C's order
  (dataplane/demo/trace.py follows a packet by that order).
* The steps that path.c calls from packet.c and routes.c (header checks,
  lookup, TTL update), and its inner_source, are written out, each under a
  comment naming the C function. The TTL update is dataplane.h's formula on
  the 16-bit word ``ttl << 8 | proto``, which the header calls ``old``, read
  and written whole; tests/unit/test_pypath.py holds it equal to
  ipv4.decrement_ttl for every checksum.
* dp_path_tun_written has no counterpart: the caller counts a datagram's
  write into the TUN where it makes it, as tx.c's sent() counts a send
  (tun_write_drop gives the drop reason of a failed one).
* IPv6's shares of the counters (dataplane.h, "Counters by family"), which
  C takes from each packet's first byte where it counts it, are counted in
  the IPv6 branches (path_drop6); the caller's sends and writes take theirs
  from what those branches let through (Path.fwd6) less the failures
  (path_drop_of), so that no IPv4 packet pays for a look at its version.
* The IPv6 branches (dataplane.h's "IPv6 inner packets"; path.c's is_ipv6,
  tun6, inner_source6 and udp6, written out) sit where the IPv4 path has
  already found the version not 4, so that IPv4 pays nothing for them
  (not even a call per IPv6 packet); they read the header's addresses as
  two 64-bit halves, on which the link-scope rule is a few int compares
  (ipv6.is_link_scoped is the reference, tests/unit/test_pypath_ipv6.py
  holds them equal). Their ICMPv6 errors are ipv6.py's, as IPv4's are
  ipv4.py's: only a dropped packet pays for them.
* Addresses are ints in host order (IPv6: 128-bit ints); sources and route
  hits are ``(ip_str, port)``, as ``socket`` takes and gives them (a peer of
  the IPv6 underlay: ``(ip6_str, port, 0, 0)``, and a source from its socket
  has 4 items too). A source of either socket is checked against the one set
  of peer names (pytable.RouteTable.peers), which no name of the other family
  can match, and the strict rule compares names, so an IPv4 route's peer is
  never an IPv6 sender (path.c's sent_by_peer).
"""
from __future__ import annotations

import collections
import errno
import struct
import time

from . import ipv4, ipv6
from .contract import (ICMP_BURST_DEFAULT, ICMP_RATE_DEFAULT, MTU6_MIN, STAT_NAMES, TR_DROP,
                       TR_ICMP, TR_ROUTE_HIT, TR_ROUTE_MISS, TR_TUN_READ, TR_UDP_RECV,
                       TRACE_HEAD, TRACE_RING, V6_SHARES)
from .pytable import RouteTable, str_to_int

NS_PER_S = 1_000_000_000

# enum dp_stat (internal.h): counter indices, dp_stats field order. The drop
# indices are also the reason a TR_DROP trace event carries.
_STAT = {name: i for i, name in enumerate(STAT_NAMES)}
TUN_RX_PACKETS, TUN_RX_BYTES = _STAT["tun_rx_packets"], _STAT["tun_rx_bytes"]
UDP_TX_PACKETS, UDP_TX_BYTES = _STAT["udp_tx_packets"], _STAT["udp_tx_bytes"]
UDP_RX_PACKETS, UDP_RX_BYTES = _STAT["udp_rx_packets"], _STAT["udp_rx_bytes"]
TUN_TX_PACKETS, TUN_TX_BYTES = _STAT["tun_tx_packets"], _STAT["tun_tx_bytes"]
ICMP_UNREACH_SENT, ICMP_TTL_SENT = _STAT["icmp_unreach_sent"], _STAT["icmp_ttl_sent"]
DROP_NO_ROUTE, DROP_TTL = _STAT["drop_no_route"], _STAT["drop_ttl"]
DROP_MALFORMED, DROP_NOT_IPV4 = _STAT["drop_malformed"], _STAT["drop_not_ipv4"]
DROP_TRUNCATED, DROP_BAD_SOURCE = _STAT["drop_truncated"], _STAT["drop_bad_source"]
DROP_SEND_ERROR = _STAT["drop_send_error"]
UDP_TX_FRAGMENTED = _STAT["udp_tx_fragmented"]
DROP_TUN_FULL, DROP_TUN_ERROR = _STAT["drop_tun_full"], _STAT["drop_tun_error"]
SYSCALLS, TUN_READS, TUN_WRITES = _STAT["syscalls"], _STAT["tun_reads"], _STAT["tun_writes"]
UDP_SENDS, UDP_RECVS, POLLS = _STAT["udp_sends"], _STAT["udp_recvs"], _STAT["polls"]
TX_BATCHES, RX_BATCHES, ROUTE_SWAPS = _STAT["tx_batches"], _STAT["rx_batches"], _STAT["route_swaps"]
ICMP_RATELIMITED = _STAT["icmp_ratelimited"]
DROP_INNER_LOCAL, DROP_INNER_FOREIGN = _STAT["drop_inner_local"], _STAT["drop_inner_foreign"]
COALESCE_WAITS = _STAT["coalesce_waits"]
DROP_SCOPE = _STAT["drop_scope"]
DROP_TOO_BIG, ICMP_TOO_BIG_SENT = _STAT["drop_too_big"], _STAT["icmp_too_big_sent"]
# IPv6's share of each counter by index (internal.h's dp_stat_v6), 0 for none: no share is slot 0.
V6_OF = [0] * len(STAT_NAMES)
for _total, _share in V6_SHARES.items():
    V6_OF[_STAT[_total]] = _STAT[_share]
V6_TUN_RX_PACKETS, V6_TUN_RX_BYTES = V6_OF[TUN_RX_PACKETS], V6_OF[TUN_RX_BYTES]
V6_UDP_TX_PACKETS, V6_UDP_TX_BYTES = V6_OF[UDP_TX_PACKETS], V6_OF[UDP_TX_BYTES]
V6_UDP_RX_PACKETS, V6_UDP_RX_BYTES = V6_OF[UDP_RX_PACKETS], V6_OF[UDP_RX_BYTES]
V6_TUN_TX_PACKETS, V6_TUN_TX_BYTES = V6_OF[TUN_TX_PACKETS], V6_OF[TUN_TX_BYTES]

HEADER_MIN = ipv4.HEADER_MIN
# The header fields path_tun needs once the lengths are known to hold them, in
# one call: tot_len, flags + fragment offset, the 16-bit word of TTL and
# protocol (what dataplane.h's TTL update calls `old`), checksum, dst.
_TUN_FIELDS = struct.Struct("!2xH2xHHH4xI").unpack_from
# The same for path_udp: tot_len, TTL and protocol, checksum, src.
_UDP_FIELDS = struct.Struct("!2xH4xHHI").unpack_from
# TTL and protocol, and the checksum, written back after the decrement.
_PUT_TTL = struct.Struct("!HH").pack_into
HEADER6 = ipv6.HEADER_LEN
# An IPv6 header once its 40 bytes are known to be there: payload length, hop limit,
# then source and destination as their high and low 64-bit halves.
_FIELDS6 = struct.Struct("!4xHxB4Q").unpack_from
# The high half of an address: fe80::/10 (link-local) is its top 10 bits 0x3fa;
# a multicast address's top byte is 0xff and its scope the nibble below the flags.
_LINK_LOCAL_TOP10 = 0x3FA
_EMPTY_ROUTES = RouteTable()
_ICMP6_SENT = {ipv6.ICMPV6_DEST_UNREACH: ICMP_UNREACH_SENT,
               ipv6.ICMPV6_PACKET_TOO_BIG: ICMP_TOO_BIG_SENT}
_NO_LOCAL = (0, 0, frozenset())


# ---- 1. the state -------------------------------------------------------------------

class Path:
    """struct dp_path: everything the functions below read and write; made as
    dp_path_init makes it, with no routes, no own sources and the default ICMP limit.

    The loop thread owns it. Other threads only call :func:`path_set_icmp_limit`
    (one tuple stored: atomic under the GIL) and read ``c`` and ``ring`` (each
    copied in one C-level call, so never torn); what else they change (routes,
    own sources, strict, tracing) the loop copies in at the start of a batch.
    """
    __slots__ = ("c", "routes", "local", "local6", "tun_addr", "tun_addr6", "accept_any",
                 "strict_sources", "icmp_limit", "icmp_tat", "now_ns", "icmp", "tracing",
                 "trace_seq", "ring", "fwd6")

    def __init__(self, tun_addr: bytes, accept_any: bool):
        self.c = [0] * len(STAT_NAMES)        # the counters, dp_stats field order
        self.routes = _EMPTY_ROUTES           # the table in use (pytable.RouteTable)
        self.local = _NO_LOCAL                # own sources: subnet net, mask; addresses (ints)
        self.local6 = _NO_LOCAL               # the same for IPv6 (128-bit ints)
        self.tun_addr = tun_addr              # 4 bytes, network order: source of ICMP errors
        self.tun_addr6 = None                 # 16 bytes: source of ICMPv6 errors; None: none
        self.accept_any = accept_any
        self.strict_sources = False           # UDP -> TUN step 5
        self.icmp_limit = (ICMP_RATE_DEFAULT, ICMP_BURST_DEFAULT)
        self.icmp_tat = 0                     # rate limit: theoretical arrival time (GCRA), ns
        self.now_ns = 0                       # CLOCK_MONOTONIC, set by the caller per TUN batch
        self.icmp = b""                       # the ICMP error icmp_error built last
        self.tracing = False
        self.trace_seq = 0
        self.ring: collections.deque = collections.deque(maxlen=TRACE_RING)
        # (packets, bytes) of IPv6 the last path_tun or path_udp let through: the caller's
        # sends or writes take IPv6's share of theirs from it, so IPv4's pay nothing for it
        self.fwd6 = (0, 0)


def own_sources(local) -> tuple[tuple, tuple]:
    """api.Local (Engine._check_local's answer) as Path.local and Path.local6 hold it:
    per family the subnet's net and mask (0 and 0 for none) and the addresses as a
    frozenset. One pair, so that another thread can store both families in one go."""
    mask = (0xFFFFFFFF << (32 - local.prefixlen)) & 0xFFFFFFFF if local.prefixlen else 0
    all6 = (1 << 128) - 1
    mask6 = all6 ^ (all6 >> local.prefixlen6)
    return ((local.net, mask, frozenset(local.addrs)),
            (local.net6, mask6, frozenset(local.addrs6)))


def path_set_icmp_limit(pa: Path, rate: int, burst: int) -> None:
    """rate 0 = unlimited; otherwise burst must be >= 1 (api.Engine checks it). Any
    thread: rate and burst go in one store, so the loop never sees half a change."""
    pa.icmp_limit = (rate, burst)


def trace_record(pa: Path, kind: int, length: int, addr: int, port: int, batch: int,
                 head) -> None:
    """One trace event (trace.c's dp_trace_record); head is cut at TRACE_HEAD bytes and
    at ``length``. Callers look at pa.tracing first: a call costs more than the look."""
    pa.trace_seq += 1
    pa.ring.append((pa.trace_seq, time.monotonic_ns(), kind, length, addr, port, batch,
                    bytes(head[:min(length, TRACE_HEAD)]) if head is not None else b""))


def path_drop(pa: Path, reason: int, length: int) -> None:
    """internal.h's dp_path_drop: the drop counter, and its trace event."""
    pa.c[reason] += 1
    if pa.tracing:
        trace_record(pa, TR_DROP, length, 0, 0, reason, None)


def path_drop_of(pa: Path, reason: int, p, length: int) -> bool:
    """dp_path_drop itself: the drop of the packet ``p``, in IPv6's share too when its version
    nibble says 6 (then True). For the callers that do not know the family."""
    if length and p[0] >> 4 == 6:
        path_drop6(pa, reason, length)
        return True
    path_drop(pa, reason, length)
    return False


def path_drop6(pa: Path, reason: int, length: int) -> None:
    """path_drop of an IPv6 packet: its share of the reason too, where it has one (the
    callers know the family; dp_path_drop looks at the packet)."""
    c = pa.c
    c[reason] += 1
    if V6_OF[reason]:
        c[V6_OF[reason]] += 1
    if pa.tracing:
        trace_record(pa, TR_DROP, length, 0, 0, reason, None)


# ---- 2. the ICMP rate limit ---------------------------------------------------------

def icmp_allowed(pa: Path) -> bool:
    """A token bucket of ``burst`` errors refilled at ``rate`` per second, written as
    GCRA (path.c says why): one timestamp, integers only, the same arithmetic as C."""
    rate, burst = pa.icmp_limit
    if not rate:
        return True
    now_ns = pa.now_ns
    interval_ns = (NS_PER_S + rate - 1) // rate
    if pa.icmp_tat < now_ns:
        pa.icmp_tat = now_ns
    if pa.icmp_tat - now_ns > (burst - 1) * interval_ns:
        pa.c[ICMP_RATELIMITED] += 1
        return False
    pa.icmp_tat += interval_ns
    return True


# ---- 3. ICMP errors -----------------------------------------------------------------

def icmp_error(pa: Path, p, length: int, type_: int) -> bool:
    """True with the error about the offender ``p[:length]`` in pa.icmp (path.c's
    DP_V_ICMP), False when the rate limit says no (DP_V_DROP)."""
    if not icmp_allowed(pa):
        return False
    pa.icmp = ipv4.icmp_error(p[:length], type_, 0, pa.tun_addr)
    return True


def icmp_error6(pa: Path, p, length: int, type_: int, word: int = 0) -> bool:
    """The same for an IPv6 offender (path.c's icmp_error6): none without a source
    address, nor where RFC 4443 forbids one, and neither takes a token of the limit
    that both families share. ``word``: the 4 bytes after the checksum (packet too
    big: the MTU)."""
    if pa.tun_addr6 is None:
        return False
    offender = bytes(p[:length])
    if not ipv6.may_send_error(offender) or not icmp_allowed(pa):
        return False
    pa.icmp = ipv6.icmp_error(offender, type_, 0, pa.tun_addr6, word)
    return True


# ---- 4. TUN -> UDP --------------------------------------------------------------------

def path_tun(pa: Path, bufs, lens, n: int, hops):
    """The packets of one batch of TUN reads, packet ``j`` being ``lens[j]`` bytes at the
    start of ``bufs[j]`` (a buffer that may be longer), taken one after the other as
    dp_path_tun takes each: a forwarded one has its TTL decremented and ``hops[j]`` set to
    where to send it; any other has ``hops[j] = None``.

    A generator: it yields ``j`` for a packet whose ICMP error (pa.icmp) the caller writes
    into the TUN, and reports with path_icmp_written, before the next packet is looked at,
    as C's loop writes an error right after its packet.
    """
    c = pa.c
    tracing = pa.tracing
    routes, routes6 = pa.routes.lens, pa.routes.lens6
    one_length = len(routes) == 1             # flannel's case: no loop over the lengths
    if one_length:
        mask0, prefixlen0, nets0 = routes[0]
    rx_bytes = rx6 = rx6_bytes = fwd6 = fwd6_bytes = 0
    try:
        for j in range(n):
            p = bufs[j]
            length = lens[j]
            rx_bytes += length
            hops[j] = None
            if tracing:
                trace_record(pa, TR_TUN_READ, length, 0, 0, 0, p)

            # step 1 (packet.c: dp_packet_check_tun)
            if length < HEADER_MIN:
                if length and p[0] >> 4 == 6:      # IPv6's share, as for any IPv6 read
                    rx6 += 1
                    rx6_bytes += length
                    path_drop6(pa, DROP_MALFORMED, length)
                else:
                    path_drop(pa, DROP_MALFORMED, length)
                continue
            version_ihl = p[0]
            if version_ihl >> 4 != 4:
                if version_ihl >> 4 != 6:
                    path_drop(pa, DROP_NOT_IPV4, length)
                    continue
                # IPv6, to the end of this branch (dataplane.h, "IPv6 inner packets"),
                # each drop with its IPv6 share
                rx6 += 1
                rx6_bytes += length
                if length < HEADER6:
                    path_drop6(pa, DROP_MALFORMED, length)
                    continue
                payload_len, hop_limit, s0, s1, d0, d1 = _FIELDS6(p)
                if payload_len + HEADER6 != length:
                    path_drop6(pa, DROP_MALFORMED, length)
                    continue
                # link scope (ipv6.is_link_scoped written out on the halves)
                if (s0 >> 54 == _LINK_LOCAL_TOP10 or d0 >> 54 == _LINK_LOCAL_TOP10 or
                        (d0 >> 56 == 0xFF and d0 >> 48 & 15 <= 2) or not (d0 or d1)):
                    path_drop(pa, DROP_SCOPE, length)
                    continue
                # route (RouteTable.route6 written out)
                dst = d0 << 64 | d1
                entry = None
                for mask, prefixlen, nets in routes6:
                    entry = nets.get(dst & mask)
                    if entry is not None:
                        break
                if entry is None:
                    if tracing:
                        trace_record(pa, TR_ROUTE_MISS, 0, 0, 0, 0, None)
                    path_drop6(pa, DROP_NO_ROUTE, length)
                    if icmp_error6(pa, p, length, ipv6.ICMPV6_DEST_UNREACH):
                        yield j
                    continue
                hop, mtu = entry
                if tracing:
                    trace_record(pa, TR_ROUTE_HIT, prefixlen, str_to_int(hop[0]), hop[1], 0,
                                 None)
                # hop limit; no checksum covers it
                if hop_limit <= 1:
                    path_drop6(pa, DROP_TTL, length)
                    if icmp_error6(pa, p, length, ipv6.ICMPV6_TIME_EXCEEDED):
                        yield j
                    continue
                # the route's mtu: the tunnel towards that peer is a link of that MTU
                if mtu and length > mtu:
                    path_drop(pa, DROP_TOO_BIG, length)
                    if icmp_error6(pa, p, length, ipv6.ICMPV6_PACKET_TOO_BIG, mtu):
                        yield j
                    continue
                p[7] = hop_limit - 1
                hops[j] = hop
                fwd6 += 1
                fwd6_bytes += length
                continue
            header_len = (version_ihl & 15) << 2
            if header_len < HEADER_MIN or header_len > length:
                path_drop(pa, DROP_MALFORMED, length)
                continue
            tot_len, flags_frag, old, check, dst = _TUN_FIELDS(p)
            if tot_len != length:
                path_drop(pa, DROP_MALFORMED, length)
                continue

            # step 2 (routes.c: dp_routes_lookup; RouteTable.lookup written out)
            if one_length:
                hop, prefixlen = nets0.get(dst & mask0), prefixlen0
            else:
                hop = None
                for mask, prefixlen, nets in routes:
                    hop = nets.get(dst & mask)
                    if hop is not None:
                        break
            if hop is None:
                if tracing:
                    trace_record(pa, TR_ROUTE_MISS, 0, dst, 0, 0, None)
                path_drop(pa, DROP_NO_ROUTE, length)
                if ipv4.may_send_unreachable(p[:length]) and icmp_error(
                        pa, p, length, ipv4.ICMP_DEST_UNREACH):
                    yield j
                continue
            if tracing:
                trace_record(pa, TR_ROUTE_HIT, prefixlen, str_to_int(hop[0]), hop[1], 0, None)

            # step 3: the TTL is the high byte of `old`
            if old >> 8 <= 1:
                path_drop(pa, DROP_TTL, length)
                if ipv4.may_send_time_exceeded(p[:length]) and icmp_error(
                        pa, p, length, ipv4.ICMP_TIME_EXCEEDED):
                    yield j
                continue

            # step 4 (packet.c: dp_packet_ttl_dec; ipv4.decrement_ttl written out), with
            # the header's ~x & 0xffff as x ^ 0xffff, the same for 16 bits
            new = old - 0x100                     # (ttl - 1) << 8 | proto
            s = (check ^ 0xFFFF) + (old ^ 0xFFFF) + new
            s = (s & 0xFFFF) + (s >> 16)
            s = (s & 0xFFFF) + (s >> 16)
            _PUT_TTL(p, 8, new, s ^ 0xFFFF)
            hops[j] = hop
    finally:
        pa.fwd6 = (fwd6, fwd6_bytes)
        c[V6_TUN_RX_PACKETS] += rx6
        c[V6_TUN_RX_BYTES] += rx6_bytes
        c[TUN_RX_PACKETS] += n
        c[TUN_RX_BYTES] += rx_bytes


def path_too_big(pa: Path, p, length: int, path_mtu: int, hdrs: int) -> bool:
    """dp_path_too_big: the queued packet ``p`` the underlay refused as over its path MTU,
    ``hdrs`` the outer headers (dataplane.h "Path MTU"): True with the packet too big in
    pa.icmp, the hop limit put back first (the quote as read); False when dropped without."""
    mtu = path_mtu - hdrs if path_mtu > MTU6_MIN + hdrs else MTU6_MIN
    if length <= mtu or length < HEADER6 or p[0] >> 4 != 6:
        path_drop_of(pa, DROP_SEND_ERROR, p, length)
        return False
    path_drop(pa, DROP_TOO_BIG, length)
    p[7] += 1
    return icmp_error6(pa, p, length, ipv6.ICMPV6_PACKET_TOO_BIG, mtu)


# ---- 5. UDP -> TUN --------------------------------------------------------------------

def path_udp(pa: Path, bufs, lens, srcs, k: int, mtu: int):
    """The datagrams of one receive, datagram ``j`` being ``lens[j]`` bytes at the start of
    ``bufs[j]``, from ``srcs[j]`` (``(ip_str, port)``; the caller may leave it stale when
    neither the source check, the strict rule nor the trace needs it), taken one after the
    other as dp_path_udp takes each. ``lens[j]`` over ``mtu`` means the datagram was
    longer than the mtu (then ``bufs[j]`` holds mtu bytes of it and more): truncated.

    A generator: it yields ``j`` for each datagram to write into the TUN, its TTL
    decremented (``lens[j]`` bytes); the caller writes it, and counts how that went,
    before the next datagram is looked at, as C's loop does.
    """
    c = pa.c
    tracing = pa.tracing
    accept_any, routes = pa.accept_any, pa.routes
    own_net, own_mask, own_addrs = pa.local
    own_net6, own_mask6, own_addrs6 = pa.local6
    strict = pa.strict_sources
    rx_bytes = rx6 = rx6_bytes = fwd6 = fwd6_bytes = 0
    try:
        for j in range(k):
            p = bufs[j]
            received = lens[j]
            truncated = received > mtu
            length = mtu if truncated else received
            rx_bytes += length
            if tracing:
                src = srcs[j]
                trace_record(pa, TR_UDP_RECV, length, str_to_int(src[0]), src[1], k, p)

            # steps 1 and 2; IPv6's share of udp_rx counted in each branch that sees an
            # IPv6 packet, so that IPv4 pays nothing for it
            if truncated:
                if length and p[0] >> 4 == 6:
                    rx6 += 1
                    rx6_bytes += length
                path_drop(pa, DROP_TRUNCATED, length)
                continue
            if not accept_any and srcs[j][0] not in routes.peers:
                if length and p[0] >> 4 == 6:
                    rx6 += 1
                    rx6_bytes += length
                    path_drop6(pa, DROP_BAD_SOURCE, length)
                else:
                    path_drop(pa, DROP_BAD_SOURCE, length)
                continue

            # step 3 (packet.c: dp_packet_check_udp): the version comes first, so that
            # a short datagram of another version is "not IPv4" (nor IPv6)
            if length and p[0] >> 4 != 4:
                if p[0] >> 4 != 6:
                    path_drop(pa, DROP_NOT_IPV4, length)
                    continue
                # IPv6, to the end of this branch (dataplane.h, "IPv6 inner packets"):
                # the steps of IPv4 with its rules, link scope between 3 and 4; each drop
                # with its IPv6 share
                rx6 += 1
                rx6_bytes += length
                if length < HEADER6:
                    path_drop6(pa, DROP_MALFORMED, length)
                    continue
                payload_len, hop_limit, s0, s1, d0, d1 = _FIELDS6(p)
                if payload_len + HEADER6 != length:
                    path_drop6(pa, DROP_MALFORMED, length)
                    continue
                if (s0 >> 54 == _LINK_LOCAL_TOP10 or d0 >> 54 == _LINK_LOCAL_TOP10 or
                        (d0 >> 56 == 0xFF and d0 >> 48 & 15 <= 2) or not (d0 or d1)):
                    path_drop(pa, DROP_SCOPE, length)
                    continue
                inner = s0 << 64 | s1
                if inner in own_addrs6 or (own_mask6 and inner & own_mask6 == own_net6):
                    path_drop6(pa, DROP_INNER_LOCAL, length)
                    continue
                if strict:
                    hit = routes.lookup6(inner)
                    if hit is None or hit[0][0] != srcs[j][0]:
                        path_drop6(pa, DROP_INNER_FOREIGN, length)
                        continue
                if hop_limit <= 1:
                    path_drop6(pa, DROP_TTL, length)
                    continue
                p[7] = hop_limit - 1
                fwd6 += 1
                fwd6_bytes += length
                yield j
                continue
            if length < HEADER_MIN:
                path_drop(pa, DROP_MALFORMED, length)
                continue
            header_len = (p[0] & 15) << 2
            tot_len, old, check, inner = _UDP_FIELDS(p)
            if header_len < HEADER_MIN or header_len > length or tot_len != length:
                path_drop(pa, DROP_MALFORMED, length)
                continue

            # steps 4 and 5 (path.c: inner_source): the inner source is not this host's
            # own, and with the strict rule it is routed to the sender (who owns it, as
            # kernel WireGuard asks its allowed IPs)
            if inner in own_addrs or (own_mask and inner & own_mask == own_net):
                path_drop(pa, DROP_INNER_LOCAL, length)
                continue
            if strict:
                hit = routes.lookup(inner)
                if hit is None or hit[0][0] != srcs[j][0]:
                    path_drop(pa, DROP_INNER_FOREIGN, length)
                    continue

            # step 6: the TTL is the high byte of `old`
            if old >> 8 <= 1:
                path_drop(pa, DROP_TTL, length)
                continue

            # step 7, TTL - 1 as in path_tun
            new = old - 0x100                     # (ttl - 1) << 8 | proto
            s = (check ^ 0xFFFF) + (old ^ 0xFFFF) + new
            s = (s & 0xFFFF) + (s >> 16)
            s = (s & 0xFFFF) + (s >> 16)
            _PUT_TTL(p, 8, new, s ^ 0xFFFF)
            yield j
    finally:
        pa.fwd6 = (fwd6, fwd6_bytes)
        c[V6_UDP_RX_PACKETS] += rx6
        c[V6_UDP_RX_BYTES] += rx6_bytes
        c[UDP_RX_PACKETS] += k
        c[UDP_RX_BYTES] += rx_bytes


# ---- 6. outcomes of the caller's writes ---------------------------------------------

def tun_write_drop(err: int) -> int:
    """The drop reason of a failed TUN write: full (EAGAIN) or any other error."""
    return DROP_TUN_FULL if err in (errno.EAGAIN, errno.EWOULDBLOCK) else DROP_TUN_ERROR


def path_icmp_written(pa: Path, err: int) -> None:
    """How the write of pa.icmp into the TUN went: 0 or the errno."""
    icmp = pa.icmp
    if err:
        path_drop_of(pa, tun_write_drop(err), icmp, len(icmp))
        return
    # The counters mean unreachable and time exceeded in both families, whose types
    # differ; packet too big is IPv6's alone.
    if icmp[0] >> 4 == 6:
        counter = _ICMP6_SENT.get(icmp[HEADER6], ICMP_TTL_SENT)
        if V6_OF[counter]:
            pa.c[V6_OF[counter]] += 1
    else:
        counter = ICMP_UNREACH_SENT if icmp[HEADER_MIN] == ipv4.ICMP_DEST_UNREACH \
            else ICMP_TTL_SENT
    pa.c[counter] += 1
    if pa.tracing:
        trace_record(pa, TR_ICMP, len(icmp), 0, 0, 0, icmp)
