/*
 * path.c - the per-packet work of both directions, with no I/O.
 *
 * Flow, in the order the functions appear:
 *   1. dp_path_init / dp_path_set_icmp_limit
 *   2. icmp_allowed      the ICMP rate limit: a token bucket written as GCRA
 *   3. icmp_error,       build an ICMP or ICMPv6 error into pa->icmp, if
 *      icmp_error6       allowed
 *   4. tun6              TUN -> UDP for IPv6: checks, link scope, route,
 *                        hop limit, the route's mtu, hop limit - 1
 *      dp_path_tun       TUN -> UDP: the checks of dataplane.h in its order,
 *                        IPv6 to tun6 by the version nibble, then IPv4's
 *                        route, TTL, TTL - 1; the verdict says what to write
 *      dp_path_tun_drop  a TUN read refused before those checks (vnet header)
 *      dp_path_too_big   a packet the IPv6 underlay refused as over its path
 *                        MTU: ICMPv6 packet too big
 *   5. inner_source      UDP -> TUN: the inner source, local or foreign, of
 *                        either family, from a sender of either underlay
 *      udp6              UDP -> TUN for IPv6: checks, link scope, inner
 *                        source, hop limit
 *      udp_path,         UDP -> TUN: truncated, source (of the IPv4 or the
 *      dp_path_udp,      IPv6 underlay), then by the version nibble IPv6
 *      dp_path_udp6      (udp6) or IPv4's checks, inner source, TTL; TTL or
 *                        hop limit - 1
 *   6. dp_path_*_written the outcome of the caller's write into the TUN
 *
 * tx.c and rx.c do the syscalls around these functions and csrc/fuzz/ drives
 * them with arbitrary bytes (the I/O-free core, as boringtun's
 * Tunn::encapsulate). Every packet handed in is counted in its rx counters
 * and then either forwarded or in exactly one drop counter; an ICMP error
 * adds icmp_*_sent, icmp_ratelimited or a TUN write drop of its own. An
 * IPv6 packet counts in the IPv6 share of each of those that has one
 * (dp_path_count_of, dp_path_drop: they are handed the packet).
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

enum { DP_NS_PER_S = 1000000000u };

/* ---- 1. set-up --------------------------------------------------------------- */

void dp_path_init(struct dp_path *pa, uint32_t tun_addr, int accept_any)
{
    memset(pa, 0, sizeof(*pa));
    pa->tun_addr = tun_addr;
    pa->accept_any = accept_any != 0;
    dp_path_set_icmp_limit(pa, DP_ICMP_RATE_DEFAULT, DP_ICMP_BURST_DEFAULT);
    dp_trace_init(&pa->trace);
}

int dp_path_set_icmp_limit(struct dp_path *pa, uint32_t rate, uint32_t burst)
{
    if (rate && !burst)
        return -EINVAL;
    /* Rate and burst in one word, so the loop never sees half a change. */
    __atomic_store_n(&pa->icmp_limit, (uint64_t)rate << 32 | burst, __ATOMIC_RELAXED);
    return 0;
}

/* ---- 2. the ICMP rate limit ------------------------------------------------------ */

/* A token bucket of `burst` tokens refilled at `rate` per second, written as
 * the generic cell rate algorithm (RFC 2697's bucket, ATM's GCRA): one
 * timestamp instead of a token count, integers only. Each error moves the
 * theoretical arrival time `tat` on by one interval T = ceil(1e9 / rate) ns
 * and is allowed while tat is at most (burst - 1) * T ahead of now. So in
 * any window of t seconds at most burst + rate * t errors go out. The Python
 * engine does the same arithmetic (pypath.py: icmp_allowed). */
static int icmp_allowed(struct dp_path *pa)
{
    uint64_t lim = __atomic_load_n(&pa->icmp_limit, __ATOMIC_RELAXED);
    uint64_t rate = lim >> 32, burst = lim & 0xffffffffu;
    uint64_t now = pa->now_ns, interval;

    if (!rate)
        return 1;
    interval = (DP_NS_PER_S + rate - 1) / rate;
    if (pa->icmp_tat < now)
        pa->icmp_tat = now;
    if (pa->icmp_tat - now > (burst - 1) * interval) {
        dp_path_count(pa, DP_ST_ICMP_RATELIMITED, 1);
        return 0;
    }
    pa->icmp_tat += interval;
    return 1;
}

/* ---- 3. ICMP errors ----------------------------------------------------------- */

static enum dp_verdict icmp_error(struct dp_path *pa, const uint8_t *p, uint32_t len,
                                  uint8_t type)
{
    if (!icmp_allowed(pa))
        return DP_V_DROP;
    pa->icmp_len = dp_packet_icmp_error(pa->icmp, p, len, type, 0, pa->tun_addr);
    return DP_V_ICMP;
}

/* The same for IPv6: no source address yet means no error at all, and an
 * offender RFC 4443 forbids an error about takes no token of the limit,
 * which both families share as they share the TUN and the senders. word:
 * the 4 bytes after the checksum (packet too big: the MTU; else 0). */
static enum dp_verdict icmp_error6(struct dp_path *pa, const uint8_t *p, uint32_t len,
                                   uint8_t type, uint32_t word)
{
    if (dp_packet6_unspecified(pa->tun_addr6) || !dp_packet6_may_error(p, len) ||
        !icmp_allowed(pa))
        return DP_V_DROP;
    pa->icmp_len = dp_packet6_icmp_error(pa->icmp, p, len, type, 0, word, pa->tun_addr6);
    return DP_V_ICMP;
}

/* ---- 4. TUN -> UDP ------------------------------------------------------------ */

static inline int is_ipv6(const uint8_t *p, uint32_t len)
{
    return len >= 1 && (p[0] >> 4) == 6;
}

/* IPv4's steps with IPv6's rules (dataplane.h, "IPv6 inner packets"); the
 * trace's addr is a uint32, so a miss shows 0. */
static enum dp_verdict tun6(struct dp_path *pa, uint8_t *p, uint32_t len,
                            struct dp_route_hit *hit)
{
    int reason = dp_packet6_check(p, len);

    if (!reason && dp_packet6_link_scope(p))
        reason = DP_ST_DROP_SCOPE;
    if (reason) {
        dp_path_drop(pa, reason, p, len);
        return DP_V_DROP;
    }
    if (!dp_routes_lookup(pa->routes, DP_FAM6, dp_packet6_dst(p), hit)) {
        dp_path_trace(pa, DP_TR_ROUTE_MISS, 0, 0, 0, 0, NULL);
        dp_path_drop(pa, DP_ST_DROP_NO_ROUTE, p, len);
        return icmp_error6(pa, p, len, DP_ICMP6_DEST_UNREACH, 0);
    }
    dp_path_trace(pa, DP_TR_ROUTE_HIT, hit->prefixlen, hit->peer_ip, hit->port, 0, NULL);
    if (p[DP_IP6_HOP_OFF] <= 1) {
        dp_path_drop(pa, DP_ST_DROP_TTL, p, len);
        return icmp_error6(pa, p, len, DP_ICMP6_TIME_EXCEEDED, 0);
    }
    /* The tunnel towards this peer is a link of hit->mtu (RFC 8200 5): the
     * sender learns it (RFC 8201) rather than the packet being lost, or cut
     * into IPv6 fragments of the outer packet on the way. */
    if (hit->mtu && len > hit->mtu) {
        dp_path_drop(pa, DP_ST_DROP_TOO_BIG, p, len);
        return icmp_error6(pa, p, len, DP_ICMP6_TOO_BIG, hit->mtu);
    }
    dp_packet6_hop_dec(p);
    return DP_V_FORWARD;
}

enum dp_verdict dp_path_tun(struct dp_path *pa, uint8_t *p, uint32_t len,
                            struct dp_route_hit *hit)
{
    uint32_t dst;
    int reason;

    dp_path_count_packet(pa, DP_ST_TUN_RX_PACKETS, p, len);
    dp_path_trace(pa, DP_TR_TUN_READ, len, 0, 0, 0, p);

    /* Under 20 bytes a packet is malformed whatever its version. */
    if (len >= DP_IP_HDR_MIN && is_ipv6(p, len))
        return tun6(pa, p, len, hit);
    reason = dp_packet_check_tun(p, len);
    if (reason) {
        dp_path_drop(pa, reason, p, len);
        return DP_V_DROP;
    }
    dst = dp_packet_dst(p);
    if (!dp_routes_lookup(pa->routes, DP_FAM4, (const uint8_t *)&dst, hit)) {
        dp_path_trace(pa, DP_TR_ROUTE_MISS, 0, dst, 0, 0, NULL);
        dp_path_drop(pa, DP_ST_DROP_NO_ROUTE, p, len);
        if (!dp_packet_may_unreach(p, len))
            return DP_V_DROP;
        return icmp_error(pa, p, len, DP_ICMP_DEST_UNREACH);
    }
    dp_path_trace(pa, DP_TR_ROUTE_HIT, hit->prefixlen, hit->peer_ip, hit->port, 0, NULL);
    if (p[8] <= 1) {
        dp_path_drop(pa, DP_ST_DROP_TTL, p, len);
        if (!dp_packet_may_time_exceed(p, len))
            return DP_V_DROP;
        return icmp_error(pa, p, len, DP_ICMP_TIME_EXCEEDED);
    }
    dp_packet_ttl_dec(p);
    return DP_V_FORWARD;
}

/* A TUN read refused before the checks above could see it (DP_OFF_TUN_VNET:
 * a super-packet that cannot be cut, or a partial checksum out of range):
 * counted as read, then in its one drop reason. */
void dp_path_tun_drop(struct dp_path *pa, const uint8_t *p, uint32_t len, int reason)
{
    p = len ? p : NULL;
    dp_path_count_packet(pa, DP_ST_TUN_RX_PACKETS, p, len);
    dp_path_trace(pa, DP_TR_TUN_READ, len, 0, 0, 0, p);
    dp_path_drop(pa, (enum dp_stat)reason, p, len);
}

/* A packet step 5 could not send: the IPv6 underlay refused it as longer than
 * its path MTU (dataplane.h "Path MTU"; hdrs: the outer headers). Its sender
 * learns the inner MTU, as from a route's mtu; the hop limit is put back, so
 * that the quote is the packet as read. */
enum dp_verdict dp_path_too_big(struct dp_path *pa, uint8_t *p, uint32_t len,
                                uint32_t path_mtu, uint32_t hdrs)
{
    uint32_t mtu = path_mtu > DP_MTU6_MIN + hdrs ? path_mtu - hdrs : DP_MTU6_MIN;

    if (len <= mtu || len < DP_IP6_HDR || !is_ipv6(p, len)) {
        dp_path_drop(pa, DP_ST_DROP_SEND_ERROR, p, len);
        return DP_V_DROP;
    }
    dp_path_drop(pa, DP_ST_DROP_TOO_BIG, p, len);
    p[DP_IP6_HOP_OFF]++;
    return icmp_error6(pa, p, len, DP_ICMP6_TOO_BIG, mtu);
}

/* ---- 5. UDP -> TUN ------------------------------------------------------------ */

/* A datagram's outer source, from the socket of either underlay. */
struct dp_sender {
    enum dp_family f;       /* the underlay's */
    const uint8_t *addr;    /* network order, 4 or 16 bytes */
    uint32_t src;           /* the trace's addr: the IPv4 source; 0 for an IPv6 one */
};

/* Whether the route's peer is the sender: same underlay, same address. */
static inline int sent_by_peer(const struct dp_route_hit *hit, const struct dp_sender *s)
{
    if (s->f == DP_FAM6)
        return hit->v6 && !memcmp(hit->peer6, s->addr, DP_IP6_ADDR);
    return !hit->v6 && !memcmp(&hit->peer_ip, s->addr, sizeof(hit->peer_ip));
}

/* Steps 4 and 5 of dataplane.h on a packet of family f that passed the
 * header checks: 0, or the drop reason. Both families alike: local
 * against that family's own sources, and the strict rule asks that
 * family's route table who owns the inner source, as kernel WireGuard asks
 * its allowed IPs: the sender, of either underlay, must be that owner. */
static int inner_source(const struct dp_path *pa, enum dp_family f, const uint8_t *p,
                        const struct dp_sender *s)
{
    uint32_t src4 = f == DP_FAM4 ? dp_packet_src(p) : 0;
    const uint8_t *inner = f == DP_FAM6 ? dp_packet6_src(p) : (const uint8_t *)&src4;
    struct dp_route_hit hit;

    if (f == DP_FAM6 ? dp_local_has6(pa->local, inner) : dp_local_has(pa->local, src4))
        return DP_ST_DROP_INNER_LOCAL;
    if (__atomic_load_n(&pa->strict_sources, __ATOMIC_RELAXED) &&
        (!dp_routes_lookup(pa->routes, f, inner, &hit) || !sent_by_peer(&hit, s)))
        return DP_ST_DROP_INNER_FOREIGN;
    return 0;
}

/* UDP steps 3-6 for an IPv6 payload: 0, or the drop reason. Link scope
 * comes before the inner source: a neighbour discovery message from the
 * underlay is refused as such, whoever it claims to be. */
static int udp6(const struct dp_path *pa, const uint8_t *p, uint32_t len,
                const struct dp_sender *src)
{
    int reason = dp_packet6_check(p, len);

    if (reason)
        return reason;
    if (dp_packet6_link_scope(p))
        return DP_ST_DROP_SCOPE;
    if ((reason = inner_source(pa, DP_FAM6, p, src)))
        return reason;
    return p[DP_IP6_HOP_OFF] <= 1 ? DP_ST_DROP_TTL : 0;
}

/* Both underlays: the source check asks the sender's own family's set of
 * peers, and from there on only the strict rule looks at the sender. */
static enum dp_verdict udp_path(struct dp_path *pa, uint8_t *p, uint32_t len,
                                const struct dp_sender *s, uint32_t sport, uint32_t nmsgs,
                                int truncated)
{
    int reason;

    dp_path_count_packet(pa, DP_ST_UDP_RX_PACKETS, p, len);
    dp_path_trace(pa, DP_TR_UDP_RECV, len, s->src, sport, nmsgs, p);

    if (truncated)
        reason = DP_ST_DROP_TRUNCATED;
    else if (!pa->accept_any && !dp_routes_has_peer(pa->routes, s->f, s->addr))
        reason = DP_ST_DROP_BAD_SOURCE;
    else if (is_ipv6(p, len))     /* p may be NULL only when truncated, above */
        reason = udp6(pa, p, len, s);
    else if ((reason = dp_packet_check_udp(p, len)) == 0 &&
             (reason = inner_source(pa, DP_FAM4, p, s)) == 0 && p[8] <= 1)
        reason = DP_ST_DROP_TTL;
    if (reason) {
        dp_path_drop(pa, reason, p, len);
        return DP_V_DROP;
    }
    if (is_ipv6(p, len))
        dp_packet6_hop_dec(p);
    else
        dp_packet_ttl_dec(p);
    return DP_V_FORWARD;
}

enum dp_verdict dp_path_udp(struct dp_path *pa, uint8_t *p, uint32_t len, uint32_t src,
                            uint32_t sport, uint32_t nmsgs, int truncated)
{
    struct dp_sender s = { DP_FAM4, (const uint8_t *)&src, src };

    return udp_path(pa, p, len, &s, sport, nmsgs, truncated);
}

/* The trace's addr is a uint32: 0 for an IPv6 sender, as for a miss of an
 * IPv6 destination. */
enum dp_verdict dp_path_udp6(struct dp_path *pa, uint8_t *p, uint32_t len, const uint8_t *src6,
                             uint32_t sport, uint32_t nmsgs, int truncated)
{
    struct dp_sender s = { DP_FAM6, src6, 0 };

    return udp_path(pa, p, len, &s, sport, nmsgs, truncated);
}

/* ---- 6. outcomes of the caller's writes ------------------------------------------ */

static inline enum dp_stat tun_write_drop(int err)
{
    return (err == EAGAIN || err == EWOULDBLOCK) ? DP_ST_DROP_TUN_FULL : DP_ST_DROP_TUN_ERROR;
}

void dp_path_tun_written(struct dp_path *pa, const uint8_t *p, uint32_t len, int err)
{
    if (err) {
        dp_path_drop(pa, tun_write_drop(err), p, len);
        return;
    }
    dp_path_count_packet(pa, DP_ST_TUN_TX_PACKETS, p, len);
    dp_path_trace(pa, DP_TR_TUN_WRITE, len, 0, 0, 0, p);
}

/* The counters mean "unreachable" and "time exceeded" for both families,
 * whose type numbers differ; packet too big is IPv6's alone. */
static enum dp_stat icmp_sent_counter(const struct dp_path *pa)
{
    if (!is_ipv6(pa->icmp, pa->icmp_len))
        return pa->icmp[DP_IP_HDR_MIN] == DP_ICMP_DEST_UNREACH ? DP_ST_ICMP_UNREACH_SENT :
                                                                 DP_ST_ICMP_TTL_SENT;
    switch (pa->icmp[DP_IP6_HDR]) {
    case DP_ICMP6_DEST_UNREACH:
        return DP_ST_ICMP_UNREACH_SENT;
    case DP_ICMP6_TOO_BIG:
        return DP_ST_ICMP_TOO_BIG_SENT;
    default:
        return DP_ST_ICMP_TTL_SENT;
    }
}

void dp_path_icmp_written(struct dp_path *pa, int err)
{
    if (err) {
        dp_path_drop(pa, tun_write_drop(err), pa->icmp, pa->icmp_len);
        return;
    }
    dp_path_count_of(pa, icmp_sent_counter(pa), 1, pa->icmp, pa->icmp_len);
    dp_path_trace(pa, DP_TR_ICMP, pa->icmp_len, 0, 0, 0, pa->icmp);
}
