/*
 * routes.c - the route table: longest prefix match with hashes, built once,
 * one part per family of inner packets.
 *
 * Flow, in the order the functions appear:
 *   1. dp_routes_build    validate the dp_route and dp_route6 arrays, find
 *                         each family's distinct prefix lengths (longest
 *                         first), fill one open-addressing hash per length
 *                         and one hash set of peer IPs per underlay: the
 *                         IPv4 one (dp_route peers and the IPv4 address an
 *                         IPv4-mapped dp_route6 peer_ip holds) and the IPv6
 *                         one (every other dp_route6 peer_ip)
 *   2. dp_routes_hold,    a table is shared by the loops of one host: each
 *      dp_routes_free     holds a reference, the last one frees it
 *   3. dp_routes_lookup,  per length, longest first: mask dst, probe that
 *      dp_routes_lookup6  hash (IPv6: 128-bit keys as two 64-bit halves)
 *   4. dp_routes_has_peer, the accept_any == 0 source check, per underlay
 *      dp_routes_has_peer6
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
    DP_ROUTES_MAX = 1u << 24,      /* per family: keeps every capacity computation in 32 bits */
    DP_ROUTES_LENS = 33,           /* prefix lengths 0..32 */
    DP_ROUTES6_LENS = 129          /* prefix lengths 0..128 */
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

/* An IPv6 address as two host-order halves: masks and compares are two
 * word operations, not sixteen byte ones. */
struct dp_key6 {
    uint64_t hi, lo;
};

struct dp_rslot6 {
    struct dp_key6 net;  /* the key */
    uint32_t peer_ip;    /* network order: the IPv4 underlay's address (v6 == 0) */
    uint32_t port;
    uint32_t mtu;
    uint8_t used, v6;    /* v6: the peer is peer6, over the IPv6 underlay */
    uint8_t peer6[DP_IP6_ADDR];
};

struct dp_rlen6 {
    struct dp_key6 mask;
    uint32_t prefixlen;
    uint32_t cap_mask;
    struct dp_rslot6 *slots;
};

struct dp_routes {
    uint32_t refs;       /* the loops holding it (one table serves every queue of a host) */
    uint32_t nlens, nlens6;
    struct dp_rlen lens[DP_ROUTES_LENS];     /* longest prefix first */
    struct dp_rlen6 lens6[DP_ROUTES6_LENS];  /* the same for the IPv6 routes */
    uint32_t *peers;     /* open addressing, 0 = empty slot */
    uint32_t peer_cap_mask;
    int has_zero_peer;   /* 0.0.0.0 cannot live in the set, so it is a flag */
    struct dp_key6 *peers6;   /* the IPv6 underlay's peers; :: (never a peer) = empty */
    uint32_t peer6_cap_mask, npeers6;
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

/* The same finalizer at 64 bits (murmur3's fmix64), over both halves: the
 * bits that tell IPv6 subnets apart sit anywhere in the upper half. */
static inline uint32_t hash128(struct dp_key6 k)
{
    uint64_t x = k.hi ^ (k.lo * 0x9e3779b97f4a7c15ull);

    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
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

static inline struct dp_key6 key6_of(const uint8_t *a)
{
    struct dp_key6 k = {
        (uint64_t)dp_rd32(a) << 32 | dp_rd32(a + 4),
        (uint64_t)dp_rd32(a + 8) << 32 | dp_rd32(a + 12),
    };

    return k;
}

static inline struct dp_key6 mask6_of(uint32_t prefixlen)
{
    struct dp_key6 m = {
        prefixlen >= 64 ? ~0ull : prefixlen ? ~0ull << (64 - prefixlen) : 0,
        prefixlen <= 64 ? 0 : ~0ull << (128 - prefixlen),
    };

    return m;
}

static inline struct dp_key6 key6_and(struct dp_key6 a, struct dp_key6 m)
{
    a.hi &= m.hi;
    a.lo &= m.lo;
    return a;
}

static inline int key6_eq(struct dp_key6 a, struct dp_key6 b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

/* ::ffff:a.b.c.d, a peer of the IPv4 underlay; *ip gets a.b.c.d in
 * network order. */
static int mapped_v4(const uint8_t *a, uint32_t *ip)
{
    static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

    if (memcmp(a, prefix, sizeof(prefix)))
        return 0;
    memcpy(ip, a + 12, 4);
    return 1;
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

static const uint8_t zero6[DP_IP6_ADDR];

static void rlen6_insert(struct dp_rlen6 *l, const dp_route6 *r)
{
    struct dp_key6 k = key6_of(r->net);
    uint32_t i = hash128(k) & l->cap_mask;

    while (l->slots[i].used && !key6_eq(l->slots[i].net, k))
        i = (i + 1) & l->cap_mask;
    l->slots[i].net = k;
    l->slots[i].peer_ip = 0;
    l->slots[i].v6 = !mapped_v4(r->peer_ip, &l->slots[i].peer_ip);
    memcpy(l->slots[i].peer6, l->slots[i].v6 ? r->peer_ip : zero6, DP_IP6_ADDR);
    l->slots[i].port = r->port;
    l->slots[i].mtu = r->mtu;
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

static void peers6_insert(struct dp_routes *t, const uint8_t *a)
{
    struct dp_key6 k = key6_of(a);
    uint32_t i = hash128(k) & t->peer6_cap_mask;

    while ((t->peers6[i].hi || t->peers6[i].lo) && !key6_eq(t->peers6[i], k))
        i = (i + 1) & t->peer6_cap_mask;
    if (!t->peers6[i].hi && !t->peers6[i].lo)
        t->npeers6++;
    t->peers6[i] = k;
}

/* An IPv6 peer dataplane.h allows: one a datagram reaches without a scope.
 * (:: is also what keeps the empty slots of peers6 apart.) */
static int peer6_ok(const uint8_t *a)
{
    struct dp_key6 k = key6_of(a);

    return (k.hi || k.lo) && a[0] != DP_IP6_MCAST &&
           !(a[0] == 0xfe && (a[1] & 0xc0) == 0x80);
}

/* Counts the routes per prefix length; -EINVAL for one the header forbids. */
static int count_routes(const dp_route *routes, uint32_t n, uint32_t *count)
{
    uint32_t i;

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
    return 0;
}

static int count_routes6(const dp_route6 *routes, uint32_t n, uint32_t *count,
                         uint32_t *n6peers)
{
    uint32_t i, ip = 0;

    if (n > DP_ROUTES_MAX || (n && !routes))
        return -EINVAL;
    for (i = 0; i < n; i++) {
        const dp_route6 *r = &routes[i];
        struct dp_key6 net, m;

        if (r->prefixlen > 128 || r->port > 0xffff || r->reserved ||
            (r->mtu && (r->mtu < DP_MTU6_MIN || r->mtu > DP_MTU_MAX)))
            return -EINVAL;
        net = key6_of(r->net);
        m = mask6_of(r->prefixlen);
        if (!key6_eq(net, key6_and(net, m)))
            return -EINVAL;
        if (!mapped_v4(r->peer_ip, &ip)) {
            if (!peer6_ok(r->peer_ip))
                return -EINVAL;
            (*n6peers)++;
        }
        count[r->prefixlen]++;
    }
    return 0;
}

int dp_routes_build(struct dp_routes **out, const dp_route *routes, uint32_t n,
                    const dp_route6 *routes6, uint32_t n6)
{
    uint32_t count[DP_ROUTES_LENS] = {0}, count6[DP_ROUTES6_LENS] = {0};
    uint32_t slot_of[DP_ROUTES_LENS], slot6_of[DP_ROUTES6_LENS];
    struct dp_routes *t;
    uint32_t i, ip = 0, n6peers = 0;
    int len, rc;

    *out = NULL;
    if ((rc = count_routes(routes, n, count)) ||
        (rc = count_routes6(routes6, n6, count6, &n6peers)))
        return rc;

    rc = -ENOMEM;
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
    for (len = 128; len >= 0; len--) {
        struct dp_rlen6 *l;

        if (!count6[len])
            continue;
        l = &t->lens6[t->nlens6];
        l->prefixlen = (uint32_t)len;
        l->mask = mask6_of((uint32_t)len);
        l->cap_mask = capacity_for(count6[len]) - 1;
        l->slots = calloc((size_t)l->cap_mask + 1, sizeof(*l->slots));
        if (!l->slots)
            goto err_free;
        slot6_of[len] = t->nlens6++;
    }
    /* One set per underlay, for the routes of both families: a datagram's
     * source is of its socket's family whatever it carries. */
    t->peer_cap_mask = capacity_for(n + n6) - 1;
    t->peers = calloc((size_t)t->peer_cap_mask + 1, sizeof(*t->peers));
    t->peer6_cap_mask = capacity_for(n6peers) - 1;
    t->peers6 = calloc((size_t)t->peer6_cap_mask + 1, sizeof(*t->peers6));
    if (!t->peers || !t->peers6)
        goto err_free;

    for (i = 0; i < n; i++) {
        rlen_insert(&t->lens[slot_of[routes[i].prefixlen]], &routes[i]);
        peers_insert(t, routes[i].peer_ip);
    }
    for (i = 0; i < n6; i++) {
        rlen6_insert(&t->lens6[slot6_of[routes6[i].prefixlen]], &routes6[i]);
        if (mapped_v4(routes6[i].peer_ip, &ip))
            peers_insert(t, ip);
        else
            peers6_insert(t, routes6[i].peer_ip);
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
    for (i = 0; i < t->nlens6; i++)
        free(t->lens6[i].slots);
    free(t->peers);
    free(t->peers6);
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
                hit->mtu = 0;
                hit->v6 = 0;
                memset(hit->peer6, 0, sizeof(hit->peer6));
                return 1;
            }
            i = (i + 1) & l->cap_mask;
        }
    }
    return 0;
}

int dp_routes_lookup6(const struct dp_routes *t, const uint8_t *dst, struct dp_route_hit *hit)
{
    struct dp_key6 d;
    uint32_t li;

    if (!t || !t->nlens6)
        return 0;
    d = key6_of(dst);
    for (li = 0; li < t->nlens6; li++) {
        const struct dp_rlen6 *l = &t->lens6[li];
        struct dp_key6 key = key6_and(d, l->mask);
        uint32_t i = hash128(key) & l->cap_mask;

        while (l->slots[i].used) {
            if (key6_eq(l->slots[i].net, key)) {
                hit->peer_ip = l->slots[i].peer_ip;
                hit->port = l->slots[i].port;
                hit->prefixlen = l->prefixlen;
                hit->mtu = l->slots[i].mtu;
                hit->v6 = l->slots[i].v6;
                memcpy(hit->peer6, l->slots[i].peer6, DP_IP6_ADDR);
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

int dp_routes_has_peer6(const struct dp_routes *t, const uint8_t *ip)
{
    struct dp_key6 k;
    uint32_t i;

    if (!t || !t->npeers6)
        return 0;
    k = key6_of(ip);
    if (!k.hi && !k.lo)
        return 0;       /* the empty slots' key */
    i = hash128(k) & t->peer6_cap_mask;
    while (t->peers6[i].hi || t->peers6[i].lo) {
        if (key6_eq(t->peers6[i], k))
            return 1;
        i = (i + 1) & t->peer6_cap_mask;
    }
    return 0;
}

uint32_t dp_routes_peers6(const struct dp_routes *t)
{
    return t ? t->npeers6 : 0;
}
