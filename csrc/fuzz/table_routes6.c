/*
 * table_routes6.c - the IPv6 part of the route table (routes.c) and of the
 * own sources (local.c) against naive scans, and worked examples: one case
 * per line on stdin, one answer per line on stdout. The cases and the
 * answers expected live in tests/unit/test_fuzz_routes6.py; fuzz_packet.c
 * checks the same functions on the packet path, with fewer prefix lengths.
 *
 *   lookup NET/LEN=PEER:PORT ... -> DST    -> PEER:PORT/LEN, or miss
 *                                             (-EINVAL: the table refused);
 *                                             PEER an IPv4 address (the IPv4
 *                                             underlay) or [IPv6] (the IPv6
 *                                             one), :PORT/MTU with an mtu
 *   build NET/LEN PEER_IP6 PORT MTU RESERVED -> dp_routes_build's return
 *   local NET/LEN ADDR ... -> IP           -> 1 if IP is an own source, 0 if
 *                                             not (or the build's return)
 *   random SEED TABLES                     -> ok HITS MISSES: TABLES random
 *                                             tables of both families, each
 *                                             looked up at addresses near its
 *                                             nets and compared with a naive
 *                                             longest-prefix scan (aborts on
 *                                             a difference)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"
#include "fuzz.h"
#include "naive_routes.h"

enum { MAX_ROUTES = 64, MAX_ADDRS = 16, LOOKUPS = 512 };

/* ---- parsing -------------------------------------------------------------------- */

/* "NET/LEN" into 16 bytes and a length; 0 if it is not one. */
static int parse_net6(const char *s, uint8_t *net, uint32_t *plen)
{
    char buf[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : 0;

    if (!slash || n >= sizeof(buf))
        return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    *plen = (uint32_t)strtoul(slash + 1, NULL, 10);
    return inet_pton(AF_INET6, buf, net) == 1;
}

static void set_peer(dp_route6 *r, uint32_t ip)
{
    memcpy(r->peer_ip, naive_mapped, sizeof(naive_mapped));
    memcpy(r->peer_ip + 12, &ip, 4);
}

static void print_hit(int found, const struct dp_route_hit *h)
{
    char ip[INET6_ADDRSTRLEN];

    if (!found) {
        printf("miss\n");
        return;
    }
    if (h->v6) {
        inet_ntop(AF_INET6, h->peer6, ip, sizeof(ip));
        printf("[%s]", ip);
    } else {
        inet_ntop(AF_INET, &h->peer_ip, ip, sizeof(ip));
        printf("%s", ip);
    }
    printf(":%u/%u", h->port, h->prefixlen);
    if (h->mtu)
        printf(" mtu %u", h->mtu);
    printf("\n");
}

/* "PEER:PORT" or "PEER:PORT/MTU", PEER an IPv4 address or [IPv6], into r. */
static int parse_peer(char *s, dp_route6 *r)
{
    char *port, *mtu;
    uint32_t ip;

    if (*s == '[') {
        if (!(port = strstr(s, "]:")))
            return 0;
        *port = 0;
        port += 2;
        if (inet_pton(AF_INET6, s + 1, r->peer_ip) != 1)
            return 0;
    } else {
        if (!(port = strchr(s, ':')))
            return 0;
        *port++ = 0;
        if (inet_pton(AF_INET, s, &ip) != 1)
            return 0;
        set_peer(r, ip);
    }
    if ((mtu = strchr(port, '/')))
        r->mtu = (uint32_t)strtoul(mtu + 1, NULL, 10);
    r->port = (uint32_t)strtoul(port, NULL, 10);
    return 1;
}

/* ---- the cases ------------------------------------------------------------------ */

static int lookup(char *args)
{
    static dp_route6 rt[MAX_ROUTES];
    struct dp_routes *t;
    struct dp_route_hit hit, naive;
    uint8_t dst[16];
    uint32_t n = 0;
    char *tok, *eq;
    int rc, found;

    for (tok = strtok(args, " \n"); tok && strcmp(tok, "->"); tok = strtok(NULL, " \n")) {
        if (n == MAX_ROUTES || !(eq = strchr(tok, '=')))
            return 0;
        *eq = 0;
        memset(&rt[n], 0, sizeof(rt[n]));
        if (!parse_net6(tok, rt[n].net, &rt[n].prefixlen) || !parse_peer(eq + 1, &rt[n++]))
            return 0;
    }
    tok = strtok(NULL, " \n");
    if (!tok || inet_pton(AF_INET6, tok, dst) != 1)
        return 0;
    rc = dp_routes_build(&t, NULL, 0, rt, n);
    if (rc) {
        printf("%d\n", rc);
        return 1;
    }
    found = dp_routes_lookup(t, DP_FAM6, dst, &hit);
    CHECK(found == naive_lookup6(rt, n, dst, &naive));
    CHECK(!found || !memcmp(&hit, &naive, sizeof(hit)));
    print_hit(found, &hit);
    dp_routes_free(t);
    return 1;
}

static int build(const char *args)
{
    char net[64], peer[64];
    unsigned port, mtu, reserved;
    struct dp_routes *t;
    dp_route6 r;
    int rc;

    memset(&r, 0, sizeof(r));
    if (sscanf(args, "%63s %63s %u %u %u", net, peer, &port, &mtu, &reserved) != 5 ||
        !parse_net6(net, r.net, &r.prefixlen) || inet_pton(AF_INET6, peer, r.peer_ip) != 1)
        return 0;
    r.port = port;
    r.mtu = mtu;
    r.reserved = reserved;
    rc = dp_routes_build(&t, NULL, 0, &r, 1);
    CHECK((rc == 0) == (t != NULL));
    /* A peer of the IPv6 underlay is one of its peers, and only there. */
    if (!rc && memcmp(r.peer_ip, naive_mapped, sizeof(naive_mapped)))
        CHECK(dp_routes_peers6(t) == 1 && dp_routes_has_peer(t, DP_FAM6, r.peer_ip));
    printf("%d\n", rc);
    dp_routes_free(t);
    return 1;
}

static int local(char *args)
{
    uint8_t net[16], addrs[MAX_ADDRS][16], ip[16];
    uint32_t plen, n = 0;
    struct dp_local *l;
    char *tok = strtok(args, " \n");
    int rc;

    if (!tok || !parse_net6(tok, net, &plen))
        return 0;
    for (tok = strtok(NULL, " \n"); tok && strcmp(tok, "->"); tok = strtok(NULL, " \n"))
        if (n == MAX_ADDRS || inet_pton(AF_INET6, tok, addrs[n++]) != 1)
            return 0;
    tok = strtok(NULL, " \n");
    if (!tok || inet_pton(AF_INET6, tok, ip) != 1)
        return 0;
    rc = dp_local_build(&l, 0, 0, NULL, 0, net, plen, addrs[0], n);
    if (rc) {
        printf("%d\n", rc);
        return 1;
    }
    CHECK(!dp_local_has(l, 0));          /* no IPv4 set: nothing is local there */
    printf("%d\n", dp_local_has6(l, ip));
    dp_local_free(l);
    return 1;
}

/* xorshift64*: the same tables for the same seed on every machine. */
static uint64_t rng;

static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* An address near one of a few bases (so that nets nest and lookups hit at
 * several lengths): the base with some of its bits flipped. */
static void near(const uint8_t (*base)[16], uint32_t nbase, uint8_t *out)
{
    uint32_t flips = (uint32_t)(next() % 4), i;

    memcpy(out, base[next() % nbase], 16);
    for (i = 0; i < flips; i++) {
        uint32_t b = (uint32_t)(next() % 128);

        out[b / 8] ^= (uint8_t)(0x80 >> (b % 8));
    }
}

static void mask_to(uint8_t *a, uint32_t plen)
{
    uint32_t b;

    for (b = plen; b < 128; b++)
        a[b / 8] &= (uint8_t)~(0x80 >> (b % 8));
}

static int random_case(const char *args)
{
    static dp_route6 rt6[MAX_ROUTES];
    static dp_route rt4[MAX_ROUTES];
    uint8_t base[4][16], dst[16];
    unsigned long long seed;
    unsigned tables, k;
    uint64_t hits = 0, misses = 0;
    uint32_t i, n6, n4, lens[4], stranger;

    if (sscanf(args, "%llu %u", &seed, &tables) != 2)
        return 0;
    rng = seed * 0x9e3779b97f4a7c15ull + 1;
    for (k = 0; k < tables; k++) {
        struct dp_routes *t;
        struct dp_route_hit hit, naive;

        for (i = 0; i < 4; i++) {
            uint64_t a = next(), b = next();

            memcpy(base[i], &a, 8);
            memcpy(base[i] + 8, &b, 8);
            /* A few lengths per table, as a real one has, or any at all. */
            lens[i] = (uint32_t)(next() % 129);
        }
        n6 = (uint32_t)(next() % (MAX_ROUTES + 1));
        n4 = (uint32_t)(next() % 9);
        for (i = 0; i < n6; i++) {
            memset(&rt6[i], 0, sizeof(rt6[i]));
            near((const uint8_t (*)[16])base, 1 + (uint32_t)(next() % 4), rt6[i].net);
            rt6[i].prefixlen = next() % 2 ? lens[next() % 4] : (uint32_t)(next() % 129);
            mask_to(rt6[i].net, rt6[i].prefixlen);
            /* A third of the peers on the IPv6 underlay, with an mtu or not. */
            if (next() % 3 == 0) {
                rt6[i].peer_ip[0] = 0x20;
                rt6[i].peer_ip[1] = 0x01;
                rt6[i].peer_ip[15] = (uint8_t)(1 + next() % 8);
                rt6[i].mtu = next() % 2 ? 0 : DP_MTU6_MIN + (uint32_t)(next() % 64000);
            } else {
                set_peer(&rt6[i], htonl(0x7f000010u + (uint32_t)(next() % 8)));
            }
            rt6[i].port = (uint32_t)(next() % 65536);
        }
        for (i = 0; i < n4; i++) {
            rt4[i].prefixlen = (uint32_t)(next() % 33);
            rt4[i].net = (uint32_t)next() &
                         (rt4[i].prefixlen ? htonl(0xffffffffu << (32 - rt4[i].prefixlen)) : 0);
            rt4[i].peer_ip = htonl(0x7f000020u + (uint32_t)(next() % 8));
            rt4[i].port = 8285;
        }
        CHECK(dp_routes_build(&t, rt4, n4, rt6, n6) == 0);
        for (i = 0; i < LOOKUPS; i++) {
            int found;

            near((const uint8_t (*)[16])base, 4, dst);
            found = dp_routes_lookup(t, DP_FAM6, dst, &hit);
            CHECK(found == naive_lookup6(rt6, n6, dst, &naive));
            CHECK(!found || !memcmp(&hit, &naive, sizeof(hit)));
            if (found)
                hits++;
            else
                misses++;
        }
        /* The IPv4 part is untouched by the IPv6 one, and the peer set
         * holds both families' peers. */
        for (i = 0; i < n4; i++) {
            uint32_t m = rt4[i].prefixlen ? htonl(0xffffffffu << (32 - rt4[i].prefixlen)) : 0;
            uint32_t d = rt4[i].net | ((uint32_t)next() & ~m);
            struct dp_route_hit h4;

            CHECK(dp_routes_lookup(t, DP_FAM4, (const uint8_t *)&d, &h4) &&
                  naive_lookup4(rt4, n4, d, &naive) && !memcmp(&h4, &naive, sizeof(h4)));
            CHECK(dp_routes_has_peer(t, DP_FAM4, (const uint8_t *)&rt4[i].peer_ip));
        }
        for (i = 0; i < n6; i++) {
            uint32_t ip;
            int v6 = memcmp(rt6[i].peer_ip, naive_mapped, sizeof(naive_mapped)) != 0;

            memcpy(&ip, rt6[i].peer_ip + 12, 4);
            /* Each underlay's peers in its own set, and no other. */
            CHECK(dp_routes_has_peer(t, v6 ? DP_FAM6 : DP_FAM4,
                                     v6 ? rt6[i].peer_ip : (const uint8_t *)&ip) &&
                  !dp_routes_has_peer(t, v6 ? DP_FAM4 : DP_FAM6,
                                      v6 ? (const uint8_t *)&ip : rt6[i].peer_ip));
        }
        stranger = htonl(0x7f000030u);
        CHECK(!dp_routes_has_peer(t, DP_FAM4, (const uint8_t *)&stranger));
        dp_routes_free(t);
    }
    printf("ok %llu %llu\n", (unsigned long long)hits, (unsigned long long)misses);
    return 1;
}

int main(void)
{
    char line[8192], *a;

    while (fgets(line, sizeof(line), stdin)) {
        int answered = 0;

        if ((a = fuzz_args_of(line, "lookup")))
            answered = lookup(a);
        else if ((a = fuzz_args_of(line, "build")))
            answered = build(a);
        else if ((a = fuzz_args_of(line, "local")))
            answered = local(a);
        else if ((a = fuzz_args_of(line, "random")))
            answered = random_case(a);
        if (!answered)
            printf("?\n");     /* one line per case, whatever it was */
        fflush(stdout);
    }
    return 0;
}
