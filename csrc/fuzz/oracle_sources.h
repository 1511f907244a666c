/*
 * oracle_sources.h - fuzz_packet.c's oracles of who may send what: the
 * peers of each underlay (UDP step 2), the own sources (step 4, local.c)
 * and the sender a route names (step 5), as naive scans of the input's
 * routes and own sources.
 */
#ifndef DP_ORACLE_SOURCES_H
#define DP_ORACLE_SOURCES_H

#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"
#include "naive_routes.h"

enum { MAX_LOCAL = 4 };   /* own addresses per family in an input */

/* The IPv4 underlay's peers: every dp_route's, and the IPv4-mapped ones. */
static inline int naive_has_peer(const dp_route *rt, const dp_route6 *rt6, uint32_t n,
                                 uint32_t ip)
{
    uint32_t i;

    for (i = 0; i < n; i++)
        if (rt[i].peer_ip == ip ||
            (!memcmp(rt6[i].peer_ip, naive_mapped, 12) && !memcmp(rt6[i].peer_ip + 12, &ip, 4)))
            return 1;
    return 0;
}

/* The IPv6 underlay's: the dp_route6 peers that are not IPv4-mapped. */
static inline int naive_has_peer6(const dp_route6 *rt6, uint32_t n, const uint8_t *ip6)
{
    uint32_t i;

    for (i = 0; i < n; i++)
        if (memcmp(rt6[i].peer_ip, naive_mapped, 12) && !memcmp(rt6[i].peer_ip, ip6, 16))
            return 1;
    return 0;
}

/* Whether the route's peer sent the datagram: the same underlay and address. */
static inline int naive_sent_by(const struct dp_route_hit *h, uint32_t src,
                                const uint8_t *src6)
{
    return src6 ? h->v6 && !memcmp(h->peer6, src6, 16) : !h->v6 && h->peer_ip == src;
}

/* The own sources of the input, kept as read: the oracle of local.c. */
struct own {
    int on;
    uint32_t net, prefixlen, n, addrs[MAX_LOCAL];
    uint8_t net6[16], addrs6[MAX_LOCAL][16];
    uint32_t prefixlen6;
};

static inline int naive_local(const struct own *o, uint32_t ip)
{
    uint32_t i, m = o->prefixlen ? htonl(0xffffffffu << (32 - o->prefixlen)) : 0;

    if (!o->on)
        return 0;
    if (o->prefixlen && (ip & m) == o->net)
        return 1;
    for (i = 0; i < o->n; i++)
        if (o->addrs[i] == ip)
            return 1;
    return 0;
}

static inline int naive_local6(const struct own *o, const uint8_t *ip)
{
    uint32_t i;

    if (!o->on)
        return 0;
    if (o->prefixlen6 && naive_match6(ip, o->net6, o->prefixlen6))
        return 1;
    for (i = 0; i < o->n; i++)
        if (memcmp(o->addrs6[i], ip, 16) == 0)
            return 1;
    return 0;
}

/* The peers of the datagram's underlay: src6's when not NULL, else src's. */
static inline int naive_peer(const dp_route *rt, const dp_route6 *rt6, uint32_t n, uint32_t src,
                             const uint8_t *src6)
{
    return src6 ? naive_has_peer6(rt6, n, src6) : naive_has_peer(rt, rt6, n, src);
}

/* The inner source of the (well-formed) packet p is an own source of its family. */
static inline int naive_own_source(const struct own *o, const uint8_t *p, int v6)
{
    return v6 ? naive_local6(o, p + 8) : naive_local(o, dp_packet_src(p));
}

/* The route of p's inner source, in its family's routes, names the sender. */
static inline int naive_owner_sent(const dp_route *rt, const dp_route6 *rt6, uint32_t n,
                                   const uint8_t *p, int v6, uint32_t src, const uint8_t *src6)
{
    struct dp_route_hit h;

    return (v6 ? naive_lookup6(rt6, n, p + 8, &h) : naive_lookup4(rt, n, dp_packet_src(p), &h)) &&
           naive_sent_by(&h, src, src6);
}

#endif
