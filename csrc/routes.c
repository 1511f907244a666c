/*
 * routes.c - the route table: longest prefix match with hashes, built once.
 *
 * Flow, in the order the functions appear:
 *   1. dp_routes_build    validate the dp_route array, find the distinct prefix
 *                         lengths (longest first), fill one open-addressing
 *                         hash per length and a hash set of peer IPs
 *   2. dp_routes_hold,    a table is shared by the loops of one host: each
 *      dp_routes_free     holds a reference, the last one frees it
 *   3. dp_routes_lookup   per length, longest first: mask dst, probe that hash
 *   4. dp_routes_has_peer the accept_any == 0 source check
 *
 * A table is immutable once built. loop.c publishes a new one with one
 * atomic exchange per loop and each loop lets the old one go from its own
 * thread, so lookups take no lock. Lookup cost depends on the number of distinct prefix lengths
 * (flannel uses one) and not on the number of peers. Hashes are kept at most
 * half full, so probe sequences stay short; duplicates of (net, prefixlen)
 * keep the last entry, as a dict would.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"

enum dp_routes_limits {
    DP_ROUTES_MAX = 1u << 24,      /* keeps every capacity computation in 32 bits */
    DP_ROUTES_LENS = 33            /* prefix lengths 0..32 */
};

struct dp_rslot {
    uint32_t net;        /* network order; the key */
    uint32_t peer_ip;
    uint32_t port;
    uint32_t used;
};

struct dp_rlen {
    uint32_t mask;       /* network order */
    uint32_t prefixlen;
    uint32_t cap_mask;   /* capacity - 1, capacity a power of two */
    struct dp_rslot *slots;
};

struct dp_routes {
    uint32_t refs;       /* the loops holding it (one table serves every queue of a host) */
    uint32_t nlens;
    struct dp_rlen lens[DP_ROUTES_LENS];   /* longest prefix first */
    uint32_t *peers;     /* open addressing, 0 = empty slot */
    uint32_t peer_cap_mask;
    int has_zero_peer;   /* 0.0.0.0 cannot live in the set, so it is a flag */
};

/* murmur3's finalizer: all 32 bits of the key reach the low bits we index by. */
static inline uint32_t hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* Smallest power of two >= 2 * n (at least 2): load factor <= 0.5. */
static uint32_t capacity_for(uint32_t n)
{
    uint32_t c = 2;

    while (c < 2 * n)
        c <<= 1;
    return c;
}

static inline uint32_t mask_of(uint32_t prefixlen)
{
    return htonl(prefixlen ? 0xffffffffu << (32 - prefixlen) : 0);
}

static void rlen_insert(struct dp_rlen *l, const dp_route *r)
{
    uint32_t i = hash32(r->net) & l->cap_mask;

    while (l->slots[i].used && l->slots[i].net != r->net)
        i = (i + 1) & l->cap_mask;
    l->slots[i].net = r->net;
    l->slots[i].peer_ip = r->peer_ip;
    l->slots[i].port = r->port;
    l->slots[i].used = 1;
}

static void peers_insert(struct dp_routes *t, uint32_t ip)
{
    uint32_t i;

    if (ip == 0) {
        t->has_zero_peer = 1;
        return;
    }
    i = hash32(ip) & t->peer_cap_mask;
    while (t->peers[i] && t->peers[i] != ip)
        i = (i + 1) & t->peer_cap_mask;
    t->peers[i] = ip;
}

int dp_routes_build(struct dp_routes **out, const dp_route *routes, uint32_t n)
{
    uint32_t count[DP_ROUTES_LENS] = {0};
    uint32_t slot_of[DP_ROUTES_LENS];
    struct dp_routes *t;
    uint32_t i;
    int len, rc = -ENOMEM;

    *out = NULL;
    if (n > DP_ROUTES_MAX || (n && !routes))
        return -EINVAL;
    for (i = 0; i < n; i++) {
        const dp_route *r = &routes[i];

        if (r->prefixlen > 32 || r->port > 0xffff)
            return -EINVAL;
        if (r->net & ~mask_of(r->prefixlen))
            return -EINVAL;   /* host bits set: the header forbids it */
        count[r->prefixlen]++;
    }

    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->refs = 1;
    for (len = 32; len >= 0; len--) {
        struct dp_rlen *l;

        if (!count[len])
            continue;
        l = &t->lens[t->nlens];
        l->prefixlen = (uint32_t)len;
        l->mask = mask_of((uint32_t)len);
        l->cap_mask = capacity_for(count[len]) - 1;
        l->slots = calloc((size_t)l->cap_mask + 1, sizeof(*l->slots));
        if (!l->slots)
            goto err_free;
        slot_of[len] = t->nlens++;
    }
    t->peer_cap_mask = capacity_for(n) - 1;
    t->peers = calloc((size_t)t->peer_cap_mask + 1, sizeof(*t->peers));
    if (!t->peers)
        goto err_free;

    for (i = 0; i < n; i++) {
        rlen_insert(&t->lens[slot_of[routes[i].prefixlen]], &routes[i]);
        peers_insert(t, routes[i].peer_ip);
    }
    *out = t;
    return 0;

err_free:
    dp_routes_free(t);
    return rc;
}

void dp_routes_hold(struct dp_routes *t, uint32_t n)
{
    __atomic_add_fetch(&t->refs, n, __ATOMIC_RELAXED);
}

void dp_routes_free(struct dp_routes *t)
{
    uint32_t i;

    /* The last holder frees; the acquire pairs with the other holders'
     * release, so their lookups are over before the memory goes. */
    if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL))
        return;
    for (i = 0; i < t->nlens; i++)
        free(t->lens[i].slots);
    free(t->peers);
    free(t);
}

int dp_routes_lookup(const struct dp_routes *t, uint32_t dst, struct dp_route_hit *hit)
{
    uint32_t li;

    if (!t)
        return 0;
    for (li = 0; li < t->nlens; li++) {
        const struct dp_rlen *l = &t->lens[li];
        uint32_t key = dst & l->mask;
        uint32_t i = hash32(key) & l->cap_mask;

        /* Half-full tables always hold an empty slot, so this ends. */
        while (l->slots[i].used) {
            if (l->slots[i].net == key) {
                hit->peer_ip = l->slots[i].peer_ip;
                hit->port = l->slots[i].port;
                hit->prefixlen = l->prefixlen;
                return 1;
            }
            i = (i + 1) & l->cap_mask;
        }
    }
    return 0;
}

int dp_routes_has_peer(const struct dp_routes *t, uint32_t ip)
{
    uint32_t i;

    if (!t)
        return 0;
    if (ip == 0)
        return t->has_zero_peer;
    i = hash32(ip) & t->peer_cap_mask;
    while (t->peers[i]) {
        if (t->peers[i] == ip)
            return 1;
        i = (i + 1) & t->peer_cap_mask;
    }
    return 0;
}
