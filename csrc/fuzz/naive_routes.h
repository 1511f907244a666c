/*
 * naive_routes.h - the oracle the route table (routes.c) is checked
 * against, shared by fuzz_packet.c and table_routes6.c: every route
 * scanned, bit by bit for IPv6, longest prefix first and the last of equal
 * routes winning (dataplane.h's rule), too slow to be the engine and too
 * plain to be wrong the way a trie can be.
 */
#ifndef DP_NAIVE_ROUTES_H
#define DP_NAIVE_ROUTES_H

#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"

/* A dp_route6 peer_ip under this prefix (::ffff:a.b.c.d) is an IPv4 peer. */
static const uint8_t naive_mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

static inline int naive_match6(const uint8_t *a, const uint8_t *net, uint32_t plen)
{
    uint32_t b;

    for (b = 0; b < plen; b++)
        if ((a[b / 8] ^ net[b / 8]) & (0x80 >> (b % 8)))
            return 0;
    return 1;
}

/* dst in network order; the hit whole (no byte left from an earlier one). */
static inline int naive_lookup4(const dp_route *rt, uint32_t n, uint32_t dst,
                                struct dp_route_hit *hit)
{
    int found = 0;
    uint32_t i, best = 0;

    for (i = 0; i < n; i++) {
        uint32_t m = rt[i].prefixlen ? htonl(0xffffffffu << (32 - rt[i].prefixlen)) : 0;

        if ((dst & m) != rt[i].net || (found && rt[i].prefixlen < best))
            continue;
        found = 1;
        best = rt[i].prefixlen;
        memset(hit, 0, sizeof(*hit));
        hit->peer_ip = rt[i].peer_ip;
        hit->port = rt[i].port;
        hit->prefixlen = rt[i].prefixlen;
    }
    return found;
}

/* dst: 16 bytes; an IPv4-mapped peer is a hit of the IPv4 underlay. */
static inline int naive_lookup6(const dp_route6 *rt, uint32_t n, const uint8_t *dst,
                                struct dp_route_hit *hit)
{
    int found = 0;
    uint32_t i, best = 0;

    for (i = 0; i < n; i++) {
        if (!naive_match6(dst, rt[i].net, rt[i].prefixlen) || (found && rt[i].prefixlen < best))
            continue;
        found = 1;
        best = rt[i].prefixlen;
        memset(hit, 0, sizeof(*hit));
        hit->v6 = memcmp(rt[i].peer_ip, naive_mapped, sizeof(naive_mapped)) != 0;
        if (hit->v6)
            memcpy(hit->peer6, rt[i].peer_ip, 16);
        else
            memcpy(&hit->peer_ip, rt[i].peer_ip + 12, 4);
        hit->port = rt[i].port;
        hit->prefixlen = rt[i].prefixlen;
        hit->mtu = rt[i].mtu;
    }
    return found;
}

#endif
