/*
 * route_lookup.c - times csrc/routes.c's per-packet calls on one table:
 * the lookup of each family and the IPv4 peer check (UDP -> TUN step 2).
 * Built twice by perf/route_lookup.sh, against the routes.c of this tree
 * and against an older one (-DOLD_API: the calls before the families were
 * one code), so the two run on the same table and the same destinations.
 *
 *   route_lookup NROUTES SECONDS  -> one line: v4 NS v6 NS peer4 NS (per call)
 *
 * No I/O but stdout, no network: the table lives in memory only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>

#include "internal.h"

enum { NDST = 4096 };

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#ifdef OLD_API
#define LOOKUP4(t, d, h) dp_routes_lookup(t, d, h)
#define LOOKUP6(t, d, h) dp_routes_lookup6(t, d, h)
#define PEER4(t, ip) dp_routes_has_peer(t, ip)
#else
#define LOOKUP4(t, d, h) dp_routes_lookup(t, DP_FAM4, (const uint8_t *)&(d), h)
#define LOOKUP6(t, d, h) dp_routes_lookup(t, DP_FAM6, d, h)
#define PEER4(t, ip) dp_routes_has_peer(t, DP_FAM4, (const uint8_t *)&(ip))
#endif

static uint32_t dst4[NDST], peer4[NDST];
static uint8_t dst6[NDST][16];

int main(int argc, char **argv)
{
    uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 256, i;
    double seconds = argc > 2 ? atof(argv[2]) : 0.2, ns[3];
    dp_route *rt = calloc(n, sizeof(*rt));
    dp_route6 *rt6 = calloc(n, sizeof(*rt6));
    struct dp_routes *t;
    struct dp_route_hit hit;
    unsigned long sink = 0;
    int k;

    if (!rt || !rt6 || n == 0 || n > 65536)
        return 2;
    /* flannel's shape: one /24 per node of 10.0.0.0/8 and one /64 per node of
     * fd00::/48 (node i: 10.(i>>8).(i&255).0 and fd00:0:0:i::), one peer each. */
    for (i = 0; i < n; i++) {
        rt[i].net = htonl(0x0a000000u | i << 8);
        rt[i].prefixlen = 24;
        rt[i].peer_ip = htonl(0xc0a80000u | i);
        rt[i].port = 8285;
        rt6[i].net[0] = 0xfd;
        rt6[i].net[6] = (uint8_t)(i >> 8);
        rt6[i].net[7] = (uint8_t)i;
        rt6[i].prefixlen = 64;
        rt6[i].peer_ip[10] = rt6[i].peer_ip[11] = 0xff;
        memcpy(rt6[i].peer_ip + 12, &rt[i].peer_ip, 4);
        rt6[i].port = 8285;
    }
    if (dp_routes_build(&t, rt, n, rt6, n) != 0)
        return 1;
    /* Nine in ten destinations routed, the rest misses; peers likewise. */
    for (i = 0; i < NDST; i++) {
        uint32_t node = (uint32_t)(next() % (n + n / 9 + 1));

        dst4[i] = htonl(0x0a000000u | node << 8 | (uint32_t)(next() & 255));
        peer4[i] = htonl(0xc0a80000u | node);
        memset(dst6[i], 0, 16);
        dst6[i][0] = 0xfd;
        dst6[i][6] = (uint8_t)(node >> 8);
        dst6[i][7] = (uint8_t)node;
        dst6[i][8] = (uint8_t)next();
        dst6[i][15] = (uint8_t)next();
    }
    for (k = 0; k < 3; k++) {
        double start = now_s(), end;
        unsigned long calls = 0;

        do {
            for (i = 0; i < NDST; i++) {
                if (k == 0)
                    sink += (unsigned long)LOOKUP4(t, dst4[i], &hit) + hit.port;
                else if (k == 1)
                    sink += (unsigned long)LOOKUP6(t, dst6[i], &hit) + hit.port;
                else
                    sink += (unsigned long)PEER4(t, peer4[i]);
            }
            calls += NDST;
            end = now_s();
        } while (end - start < seconds);
        ns[k] = (end - start) * 1e9 / (double)calls;
    }
    printf("v4 %.2f v6 %.2f peer4 %.2f (sink %lu)\n", ns[0], ns[1], ns[2], sink & 1);
    dp_routes_free(t);
    free(rt);
    free(rt6);
    return 0;
}
