"""The per-packet work of both directions, with no I/O: csrc/path.c in Python.

(Over 450 lines as one piece: it is path.c, function for function and in path.c's order,
which tests/unit/test_pypath.py holds it to, so that the two read side by side; the I/O
around it is pyloop.py's.)

Each function is path.c's of the same name without the ``dp_`` prefix
(``dp_path_udp`` is :func:`path_udp`): the same steps of csrc/dataplane.h, in
the same order, counting the same counters, so that the two files can be read
side by side. pyloop.py makes the syscalls around them, as tx.c, rx.c and
loop.c do around path.c; tests/unit/test_pypath.py calls them directly.

Flow, in the order the code appears:
     Family, V4, V6        a family's header facts: version, fixed header, TTL or
                           hop limit offset, its ICMP types and how an error is made
  1. Path, own_sources,    the state (struct dp_path, made as dp_path_init makes
     path_set_icmp_limit   it) and its setters, for any thread
     trace_record,         the trace ring (trace.c), a batch's rx counters, a
     count_batch,          drop counted with its trace event (internal.h's
     path_drop*            dp_path_drop)
  2. icmp_allowed          the ICMP rate limit: dataplane.h's GCRA, integer for integer
  3. icmp_error            build the ICMP or ICMPv6 error its Family says into pa.icmp
  4. check6                IPv6's header checks and link scope (packet.c)
  5. tun6, path_tun        TUN -> UDP, dataplane.h's steps in its order; IPv6's
                           with its rules (tun6); where to send each packet
     path_too_big          a packet the underlay refused as over its path MTU
  6. inner_source, udp6,   UDP -> TUN: truncated, source, checks, inner source
     path_udp              (either family's), TTL; which datagrams to write
  7. tun_write_drop,       the outcome of the caller's write into the TUN
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
* IPv4's header checks, route lookup and TTL update (packet.c, routes.c)
  are written out in path_tun and path_udp, under comments naming the
  steps: IPv4 is most of the traffic, and a call would cost it as much as
  a step. IPv6 takes a call or two (tun6, udp6, check6) once the version
  nibble says 6, and pays nothing on the IPv4 path.
* dp_path_tun_written has no counterpart: the caller counts a datagram's
  write into the TUN where it makes it, as tx.c's sent() counts a send
  (tun_write_drop gives the drop reason of a failed one).
* IPv6's shares of the counters (dataplane.h, "Counters by family"), which
  C takes from each packet's first byte where it counts it, are counted
  where the version is known (path_drop6); the caller's sends and writes
  take theirs from what the paths let through (Path.fwd6) less the
  failures (path_drop_of), so that no IPv4 packet pays for a look at it.
* Addresses are ints in host order (IPv6: 128-bit ints, read as two 64-bit
  halves, on which the link-scope rule is a few int compares); sources and
  route hits are ``(ip_str, port)``, as ``socket`` takes and gives them (a
  peer of the IPv6 underlay: ``(ip6_str, port, 0, 0)``, and a source from
  its socket has 4 items too). A source of either socket is checked against
  the one set of peer names (pytable.RouteTable.peers), which no name of the
  other family can match, and the strict rule compares names, so an IPv4
  route's peer is never an IPv6 sender (path.c's sent_by_peer).
"""
from __future__ import annotations

import collections
import errno
import struct
import time
from typing import Callable, NamedTuple

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
V6_UDP_TX_PACKETS, V6_UDP_TX_BYTES = V6_OF[UDP_TX_PACKETS], V6_OF[UDP_TX_BYTES]
V6_TUN_TX_PACKETS, V6_TUN_TX_BYTES = V6_OF[TUN_TX_PACKETS], V6_OF[TUN_TX_BYTES]

HEADER_MIN = ipv4.HEADER_MIN
HEADER6 = ipv6.HEADER_LEN
# The IPv4 header fields path_tun needs once the lengths are known to hold them, in one
# call: tot_len, flags + fragment offset, the 16-bit word of TTL and protocol (what
# dataplane.h's TTL update calls `old`), checksum, dst.
_TUN_FIELDS = struct.Struct("!2xH2xHHH4xI").unpack_from
# The same for path_udp: tot_len, TTL and protocol, checksum, src.
_UDP_FIELDS = struct.Struct("!2xH4xHHI").unpack_from
# TTL and protocol, and the checksum, written back after the decrement: packet.c's
# dp_packet_ttl_dec, dataplane.h's formula on `old` (the 16-bit word ttl << 8 | proto, read
# whole) with new = old - 0x100, where (~old & 0xffff) + new is 0xfeff whatever old is, and
# the second fold never carries (tests/unit/test_pypath.py holds it equal to
# ipv4.decrement_ttl for every checksum).
_PUT_TTL = struct.Struct("!HH").pack_into
_TTL_DEC_SUM = 0xFEFF
# An IPv6 header once its 40 bytes are known to be there: payload length, hop limit,
# then source and destination as their high and low 64-bit halves.
_FIELDS6 = struct.Struct("!4xHxB4Q").unpack_from
# The high half of an address: fe80::/10 (link-local) is its top 10 bits 0x3fa;
# a multicast address's top byte is 0xff and its scope the nibble below the flags.
_LINK_LOCAL_TOP10 = 0x3FA
_EMPTY_ROUTES = RouteTable()
_NO_LOCAL = (0, 0, frozenset())


class Family(NamedTuple):
    """What the path needs to know of one family's packets beyond the steps they share
    (dataplane.h's IPv4 steps and "IPv6 inner packets"): its version nibble, its fixed
    header's bytes (IPv4's least), the offset of the TTL or hop limit, the ICMP types of
    the errors the path sends (the families number them apart) with the counter of each,
    and how an error is allowed and built (its source is Path.tun_addr[version])."""
    version: int
    header: int
    hop_at: int
    unreachable: int
    time_exceeded: int
    sent: dict            # ICMP type -> its *_sent counter
    may_send: Callable    # (offender, type) -> whether an error about it is allowed
    error: Callable       # (offender, type, source, word) -> the ICMP error packet


def _may_send4(offender, type_: int) -> bool:
    return (ipv4.may_send_unreachable if type_ == ipv4.ICMP_DEST_UNREACH
            else ipv4.may_send_time_exceeded)(offender)


V4 = Family(4, HEADER_MIN, 8, ipv4.ICMP_DEST_UNREACH, ipv4.ICMP_TIME_EXCEEDED,
            {ipv4.ICMP_DEST_UNREACH: ICMP_UNREACH_SENT, ipv4.ICMP_TIME_EXCEEDED: ICMP_TTL_SENT},
            _may_send4,
            lambda offender, type_, src, word: ipv4.icmp_error(offender, type_, 0, src))
V6 = Family(6, HEADER6, 7, ipv6.ICMPV6_DEST_UNREACH, ipv6.ICMPV6_TIME_EXCEEDED,
            {ipv6.ICMPV6_DEST_UNREACH: ICMP_UNREACH_SENT, ipv6.ICMPV6_TIME_EXCEEDED: ICMP_TTL_SENT,
             ipv6.ICMPV6_PACKET_TOO_BIG: ICMP_TOO_BIG_SENT},
            lambda offender, type_: ipv6.may_send_error(offender),
            lambda offender, type_, src, word: ipv6.icmp_error(offender, type_, 0, src, word))


# ---- 1. the state -------------------------------------------------------------------

class Path:
    """struct dp_path: everything the functions below read and write; made as
    dp_path_init makes it, with no routes, no own sources and the default ICMP limit.

    The loop thread owns it. Other threads only call :func:`path_set_icmp_limit`
    (one tuple stored: atomic under the GIL) and read ``c`` and ``ring`` (each
    copied in one C-level call, so never torn); what else they change (routes,
    own sources, strict, tracing) the loop copies in at the start of a batch.
    """
    __slots__ = ("c", "routes", "local", "tun_addr", "accept_any",
                 "strict_sources", "icmp_limit", "icmp_tat", "now_ns", "icmp", "tracing",
                 "trace_seq", "ring", "fwd6")

    def __init__(self, tun_addr: bytes, accept_any: bool):
        self.c = [0] * len(STAT_NAMES)        # the counters, dp_stats field order
        self.routes = _EMPTY_ROUTES           # the table in use (pytable.RouteTable)
        # Per version (4, 6): own sources, as own_sources gives them; the source address of
        # the ICMP errors, packed (IPv6's None: none). Each is replaced whole, never changed.
        self.local = {4: _NO_LOCAL, 6: _NO_LOCAL}
        self.tun_addr = {4: tun_addr, 6: None}
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


def own_sources(local) -> dict[int, tuple]:
    """IPv4's and IPv6's api.Local (Engine._check_local's answer) as Path.local holds them,
    per version: the subnet's net and mask (0 and 0 for none) and the addresses as a
    frozenset. One dict, so that another thread can store both families in one go."""
    def own(width: int, own) -> tuple:
        full = (1 << width) - 1
        return (own.net, full ^ (full >> own.prefixlen), frozenset(own.addrs))
    return {4: own(32, local[0]), 6: own(128, local[1])}


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


def count_batch(pa: Path, packets: int, nbytes: int, got: tuple, v6_share: tuple,
                fwd6: tuple) -> None:
    """A batch's rx counters (``packets`` and ``nbytes`` their indices): ``got`` the
    (packets, bytes) read, ``v6_share`` how many of them were IPv6 (dataplane.h, "Counters by
    family"), and ``fwd6`` the (packets, bytes) of IPv6 let through, for the caller's sends or
    writes (Path.fwd6)."""
    c = pa.c
    c[packets] += got[0]
    c[nbytes] += got[1]
    c[V6_OF[packets]] += v6_share[0]
    c[V6_OF[nbytes]] += v6_share[1]
    pa.fwd6 = fwd6


def path_drop(pa: Path, reason: int, length: int) -> None:
    """internal.h's dp_path_drop of an IPv4 packet (or of no family): the drop counter,
    and its trace event."""
    pa.c[reason] += 1
    if pa.tracing:
        trace_record(pa, TR_DROP, length, 0, 0, reason, None)


def path_drop6(pa: Path, reason: int, length: int) -> None:
    """path_drop of an IPv6 packet: its share of the reason too, where it has one (the
    callers know the family; dp_path_drop looks at the packet)."""
    if V6_OF[reason]:
        pa.c[V6_OF[reason]] += 1
    path_drop(pa, reason, length)


def path_drop_of(pa: Path, reason: int, p, length: int) -> bool:
    """dp_path_drop itself: the drop of the packet ``p``, in IPv6's share too when its version
    nibble says 6 (then True). For the callers that do not know the family."""
    v6 = bool(length) and p[0] >> 4 == 6
    (path_drop6 if v6 else path_drop)(pa, reason, length)
    return v6


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

def icmp_error(pa: Path, fam: Family, p, length: int, type_: int, word: int = 0) -> bool:
    """path.c's icmp_error and icmp_error6: True with the error about the offender
    ``p[:length]`` in pa.icmp (DP_V_ICMP), False for none (DP_V_DROP): none without a
    source address, nor about an offender its family's rules forbid one about (those take
    no token of the limit, which both families share). ``word``: the 4 bytes after the
    checksum (IPv6's packet too big: the MTU)."""
    src = pa.tun_addr[fam.version]
    offender = bytes(p[:length])
    if src is None or not fam.may_send(offender, type_) or not icmp_allowed(pa):
        return False
    pa.icmp = fam.error(offender, type_, src, word)
    return True


# ---- 4. IPv6's header steps of packet.c ---------------------------------------------

def check6(p, length: int):
    """packet.c's dp_packet6_check and dp_packet6_link_scope: for a packet both let through,
    its header's fields as _FIELDS6 unpacks them, ``(payload length, hop limit, s0, s1, d0,
    d1)``, the addresses as their high and low 64-bit halves (that tuple itself: IPv6 pays for
    no second one); else the drop reason, an int. The link scope rule is ipv6.is_link_scoped as
    a few int compares on the halves (tests/unit/test_pypath_ipv6.py holds them equal)."""
    if length < HEADER6:
        return DROP_MALFORMED
    fields = _FIELDS6(p)
    payload_len, _, s0, _, d0, d1 = fields
    if payload_len + HEADER6 != length:
        return DROP_MALFORMED
    if (s0 >> 54 == _LINK_LOCAL_TOP10 or d0 >> 54 == _LINK_LOCAL_TOP10 or
            (d0 >> 56 == 0xFF and d0 >> 48 & 15 <= 2) or not (d0 or d1)):
        return DROP_SCOPE
    return fields


# ---- 5. TUN -> UDP --------------------------------------------------------------------

def tun6(pa: Path, p, length: int):
    """path.c's tun6, TUN -> UDP for an IPv6 packet: the hop to send it to (its hop limit
    decremented), True with an ICMPv6 error in pa.icmp, or False (dropped)."""
    fields = check6(p, length)
    if fields.__class__ is int:
        path_drop6(pa, fields, length)
        return False
    _, hop_limit, _, _, d0, d1 = fields
    dst = d0 << 64 | d1
    for mask, prefixlen, nets in pa.routes.lens6:   # RouteTable.route6 written out
        hit = nets.get(dst & mask)
        if hit is not None:
            break
    else:
        if pa.tracing:
            trace_record(pa, TR_ROUTE_MISS, 0, 0, 0, 0, None)
        path_drop6(pa, DROP_NO_ROUTE, length)
        return icmp_error(pa, V6, p, length, V6.unreachable)
    hop, mtu = hit
    if pa.tracing:
        trace_record(pa, TR_ROUTE_HIT, prefixlen, str_to_int(hop[0]), hop[1], 0, None)
    if hop_limit <= 1:
        path_drop6(pa, DROP_TTL, length)
        return icmp_error(pa, V6, p, length, V6.time_exceeded)
    # the route's mtu: the tunnel towards that peer is a link of that MTU
    if mtu and length > mtu:
        path_drop6(pa, DROP_TOO_BIG, length)
        return icmp_error(pa, V6, p, length, ipv6.ICMPV6_PACKET_TOO_BIG, mtu)
    p[V6.hop_at] = hop_limit - 1
    return hop


def path_tun(pa: Path, bufs, lens, n: int, hops):
    """The packets of one batch of TUN reads, packet ``j`` being ``lens[j]`` bytes at the
    start of ``bufs[j]`` (a buffer that may be longer), taken one after the other as
    dp_path_tun takes each: a forwarded one has its TTL decremented and ``hops[j]`` set to
    where to send it; any other has ``hops[j] = None``.

    A generator: it yields ``j`` for a packet whose ICMP error (pa.icmp) the caller writes
    into the TUN, and reports with path_icmp_written, before the next packet is looked at,
    as C's loop writes an error right after its packet.
    """
    tracing = pa.tracing
    routes = pa.routes.lens
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

            # step 1 (packet.c: dp_packet_check_tun): IPv6 takes tun6, whose own length
            # rule holds one under 20 bytes malformed too
            version = p[0] >> 4 if length else 0
            if version != 4:
                if version == 6:
                    rx6 += 1
                    rx6_bytes += length
                    hop = tun6(pa, p, length)
                    if hop is True:
                        yield j
                    elif hop:
                        hops[j] = hop
                        fwd6 += 1
                        fwd6_bytes += length
                else:
                    path_drop(pa, DROP_MALFORMED if length < HEADER_MIN else DROP_NOT_IPV4,
                              length)
                continue
            header_len = (p[0] & 15) << 2
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
                if icmp_error(pa, V4, p, length, V4.unreachable):
                    yield j
                continue
            if tracing:
                trace_record(pa, TR_ROUTE_HIT, prefixlen, str_to_int(hop[0]), hop[1], 0, None)

            # step 3: the TTL is the high byte of `old`
            if old >> 8 <= 1:
                path_drop(pa, DROP_TTL, length)
                if icmp_error(pa, V4, p, length, V4.time_exceeded):
                    yield j
                continue

            # step 4, and step 5 is the caller's
            s = (check ^ 0xFFFF) + _TTL_DEC_SUM
            _PUT_TTL(p, 8, old - 0x100, ((s & 0xFFFF) + (s >> 16)) ^ 0xFFFF)
            hops[j] = hop
    finally:
        count_batch(pa, TUN_RX_PACKETS, TUN_RX_BYTES, (n, rx_bytes), (rx6, rx6_bytes),
                    (fwd6, fwd6_bytes))


def path_too_big(pa: Path, p, length: int, path_mtu: int, hdrs: int) -> bool:
    """dp_path_too_big: the queued packet ``p`` the underlay refused as over its path MTU,
    ``hdrs`` the outer headers (dataplane.h "Path MTU"): True with the packet too big in
    pa.icmp, the hop limit put back first (the quote as read); False when dropped without."""
    mtu = path_mtu - hdrs if path_mtu > MTU6_MIN + hdrs else MTU6_MIN
    if length <= mtu or length < HEADER6 or p[0] >> 4 != 6:
        path_drop_of(pa, DROP_SEND_ERROR, p, length)
        return False
    path_drop(pa, DROP_TOO_BIG, length)
    p[V6.hop_at] += 1
    return icmp_error(pa, V6, p, length, ipv6.ICMPV6_PACKET_TOO_BIG, mtu)


# ---- 6. UDP -> TUN --------------------------------------------------------------------

def inner_source(pa: Path, inner: int, sender, own: tuple, lookup) -> int:
    """path.c's inner_source and inner_source6 (UDP -> TUN steps 4 and 5) on the family's
    own sources ``own`` (Path.local[4] or [6]) and route lookup (RouteTable.lookup or
    lookup6): 0, or the drop reason. The inner source is not this host's own, and with the
    strict rule it is routed to the sender (who owns it, as kernel WireGuard asks its
    allowed IPs)."""
    net, mask, addrs = own
    if inner in addrs or (mask and inner & mask == net):
        return DROP_INNER_LOCAL
    if pa.strict_sources:
        hit = lookup(pa.routes, inner)
        if hit is None or hit[0][0] != sender[0]:
            return DROP_INNER_FOREIGN
    return 0


def udp6(pa: Path, p, length: int, sender) -> int:
    """path.c's udp6, UDP -> TUN steps 3-6 for an IPv6 payload: 0, or the drop reason.
    Link scope comes before the inner source, as in C."""
    fields = check6(p, length)
    if fields.__class__ is int:
        return fields
    _, hop_limit, s0, s1, _, _ = fields
    return (inner_source(pa, s0 << 64 | s1, sender, pa.local[6], RouteTable.lookup6)
            or (DROP_TTL if hop_limit <= 1 else 0))


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
    tracing = pa.tracing
    peers = None if pa.accept_any else pa.routes.peers
    own = pa.local[4]
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

            # steps 1 and 2
            if truncated or (peers is not None and srcs[j][0] not in peers):
                if path_drop_of(pa, DROP_TRUNCATED if truncated else DROP_BAD_SOURCE, p,
                                length):
                    rx6 += 1
                    rx6_bytes += length
                continue

            # step 3 (packet.c: dp_packet_check_udp): the version comes first, so that
            # a short datagram of another version is "not IPv4" (nor IPv6); IPv6 takes
            # udp6 for steps 3 to 6
            if length and p[0] >> 4 != 4:
                if p[0] >> 4 != 6:
                    path_drop(pa, DROP_NOT_IPV4, length)
                    continue
                rx6 += 1
                rx6_bytes += length
                reason = udp6(pa, p, length, srcs[j])
                if reason:
                    path_drop6(pa, reason, length)
                    continue
                p[V6.hop_at] -= 1
                fwd6 += 1
                fwd6_bytes += length
                yield j
                continue
            header_len = (p[0] & 15) << 2 if length else 0
            if header_len < HEADER_MIN or header_len > length:
                path_drop(pa, DROP_MALFORMED, length)
                continue
            tot_len, old, check, inner = _UDP_FIELDS(p)
            if tot_len != length:
                path_drop(pa, DROP_MALFORMED, length)
                continue

            # steps 4 and 5
            reason = inner_source(pa, inner, srcs[j], own, RouteTable.lookup)
            if reason:
                path_drop(pa, reason, length)
                continue

            # step 6: the TTL is the high byte of `old`
            if old >> 8 <= 1:
                path_drop(pa, DROP_TTL, length)
                continue

            # step 7 as path_tun's step 4, and the caller writes it
            s = (check ^ 0xFFFF) + _TTL_DEC_SUM
            _PUT_TTL(p, 8, old - 0x100, ((s & 0xFFFF) + (s >> 16)) ^ 0xFFFF)
            yield j
    finally:
        count_batch(pa, UDP_RX_PACKETS, UDP_RX_BYTES, (k, rx_bytes), (rx6, rx6_bytes),
                    (fwd6, fwd6_bytes))


# ---- 7. outcomes of the caller's writes ---------------------------------------------

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
    v6 = icmp[0] >> 4 == 6
    fam = V6 if v6 else V4
    counter = fam.sent.get(icmp[fam.header], ICMP_TTL_SENT)
    pa.c[counter] += 1
    if v6 and V6_OF[counter]:
        pa.c[V6_OF[counter]] += 1
    if pa.tracing:
        trace_record(pa, TR_ICMP, len(icmp), 0, 0, 0, icmp)
