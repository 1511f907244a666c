/*
 * routes.c - the route table: longest prefix match with hashes, built once,
 * one part per family of inner packets, the same code for both.
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
 *   3. dp_routes_lookup   per length, longest first: mask dst, probe that hash
 *   4. dp_routes_has_peer the accept_any == 0 source check, per underlay
 *
 * Both families' addresses are one 128-bit key (an IPv4 address in the low
 * 32 bits, the rest zero), so a family differs from the other only in its
 * width (32 or 128 bits) and in how a dp_route or dp_route6 is read
 * (route_of): the hashes, probes, masks and peer sets are one code. The
 * IPv4 lookup pays a few ns for it, under 1% of a packet's cost
 * (dp_routes_lookup says the figures).
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
    DP_ROUTES_LENS = 129           /* prefix lengths 0..128 (IPv4 uses 0..32) */
};

/* An address as two host-order halves: masks and compares are two word
 * operations, not sixteen byte ones. An IPv4 address is lo's low 32 bits. */
struct dp_key {
    uint64_t hi, lo;
};

struct dp_rslot {
    struct dp_key net;   /* the key */
    uint32_t peer_ip;    /* network order: the IPv4 underlay's address (v6 == 0) */
    uint32_t port;
    uint32_t mtu;        /* dp_route6.mtu; 0 for dp_route */
    uint8_t used, v6;    /* v6: the peer is peer6, over the IPv6 underlay */
    uint8_t peer6[DP_IP6_ADDR];
};

struct dp_rlen {
    struct dp_key mask;
    uint32_t prefixlen;
    uint32_t cap_mask;   /* capacity - 1, capacity a power of two */
    struct dp_rslot *slots;
};

/* One family's routes: its distinct prefix lengths, longest first. */
struct dp_rfamily {
    uint32_t nlens;
    struct dp_rlen lens[DP_ROUTES_LENS];
};

/* One underlay's peers, open addressing with the zero key as the empty
 * slot: 0.0.0.0, an IPv4 peer the header allows, is a flag instead (::
 * never is an IPv6 peer). */
struct dp_peers {
    struct dp_key *slots;
    uint32_t cap_mask, n;
    int has_zero;
};

struct dp_routes {
    uint32_t refs;       /* the loops holding it (one table serves every queue of a host) */
    struct dp_rfamily fam[DP_FAMILIES];   /* by the inner packet's family */
    struct dp_peers peers[DP_FAMILIES];   /* by the underlay's family */
};

/* A dp_route or dp_route6 as the table keeps it. */
struct dp_rview {
    struct dp_key net;
    uint32_t prefixlen, port, mtu, reserved;
    uint32_t peer_ip;    /* network order, when !v6 */
    int v6;
    const uint8_t *peer6;   /* 16 bytes, when v6 */
};

static const uint32_t width_of[DP_FAMILIES] = { [DP_FAM4] = 32, [DP_FAM6] = 128 };

/* murmur3's fmix64 over both halves: the bits that tell subnets apart sit
 * anywhere (IPv6: in the upper half; IPv4: lo's low word), and all of them
 * reach the low bits we index by. */
static inline uint32_t key_hash(struct dp_key k)
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

/* a: 4 bytes (DP_FAM4) or 16, network order. */
static inline struct dp_key key_of(enum dp_family f, const uint8_t *a)
{
    struct dp_key k = { 0, dp_rd32(a) };

    if (f == DP_FAM6) {
        k.hi = (uint64_t)dp_rd32(a) << 32 | dp_rd32(a + 4);
        k.lo = (uint64_t)dp_rd32(a + 8) << 32 | dp_rd32(a + 12);
    }
    return k;
}

/* The mask of a prefix of the family's width: its top bits are the key's
 * bits above the width, zero in every key of that family. */
static inline struct dp_key mask_of(enum dp_family f, uint32_t prefixlen)
{
    uint32_t bits = 128 - width_of[f] + prefixlen;
    struct dp_key m = {
        bits >= 64 ? ~0ull : bits ? ~0ull << (64 - bits) : 0,
        bits <= 64 ? 0 : ~0ull << (128 - bits),
    };

    return m;
}

static inline struct dp_key key_and(struct dp_key a, struct dp_key m)
{
    a.hi &= m.hi;
    a.lo &= m.lo;
    return a;
}

static inline int key_eq(struct dp_key a, struct dp_key b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

static inline int key_zero(struct dp_key k)
{
    return !k.hi && !k.lo;
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

/* Route i of routes, a dp_route array (DP_FAM4) or a dp_route6 one. */
static void route_of(enum dp_family f, const void *routes, uint32_t i, struct dp_rview *v)
{
    const dp_route *r4 = (const dp_route *)routes + i;
    const dp_route6 *r6 = (const dp_route6 *)routes + i;

    memset(v, 0, sizeof(*v));
    if (f == DP_FAM4) {
        v->net = key_of(f, (const uint8_t *)&r4->net);
        v->prefixlen = r4->prefixlen;
        v->port = r4->port;
        v->peer_ip = r4->peer_ip;
    } else {
        v->net = key_of(f, r6->net);
        v->prefixlen = r6->prefixlen;
        v->port = r6->port;
        v->mtu = r6->mtu;
        v->reserved = r6->reserved;
        v->v6 = !mapped_v4(r6->peer_ip, &v->peer_ip);
        v->peer6 = r6->peer_ip;
    }
}

/* An IPv6 peer dataplane.h allows: one a datagram reaches without a scope.
 * (:: is also what keeps the empty slots of the peer sets apart.) */
static int peer6_ok(const uint8_t *a)
{
    return !key_zero(key_of(DP_FAM6, a)) && a[0] != DP_IP6_MCAST &&
           !(a[0] == 0xfe && (a[1] & 0xc0) == 0x80);
}

/* Counts one family's routes per prefix length, and its peers of the IPv6
 * underlay; -EINVAL for a route the header forbids (dp_route has no mtu,
 * reserved word or IPv6 peer, so their rules never refuse one). */
static int count_routes(enum dp_family f, const void *routes, uint32_t n, uint32_t *count,
                        uint32_t *npeers6)
{
    struct dp_rview v;
    uint32_t i;

    if (n > DP_ROUTES_MAX || (n && !routes))
        return -EINVAL;
    for (i = 0; i < n; i++) {
        route_of(f, routes, i, &v);
        if (v.prefixlen > width_of[f] || v.port > 0xffff || v.reserved ||
            (v.mtu && (v.mtu < DP_MTU6_MIN || v.mtu > DP_MTU_MAX)))
            return -EINVAL;
        if (!key_eq(v.net, key_and(v.net, mask_of(f, v.prefixlen))))
            return -EINVAL;   /* host bits set: the header forbids it */
        if (v.v6) {
            if (!peer6_ok(v.peer6))
                return -EINVAL;
            (*npeers6)++;
        }
        count[v.prefixlen]++;
    }
    return 0;
}

static void rlen_insert(struct dp_rlen *l, const struct dp_rview *v)
{
    uint32_t i = key_hash(v->net) & l->cap_mask;
    struct dp_rslot *s;

    while (l->slots[i].used && !key_eq(l->slots[i].net, v->net))
        i = (i + 1) & l->cap_mask;
    s = &l->slots[i];
    s->net = v->net;
    s->peer_ip = v->v6 ? 0 : v->peer_ip;
    s->port = v->port;
    s->mtu = v->mtu;
    s->v6 = (uint8_t)v->v6;
    if (v->v6)
        memcpy(s->peer6, v->peer6, DP_IP6_ADDR);
    else
        memset(s->peer6, 0, DP_IP6_ADDR);
    s->used = 1;
}

static void peers_insert(struct dp_peers *p, struct dp_key k)
{
    uint32_t i;

    if (key_zero(k)) {
        p->has_zero = 1;
        return;
    }
    i = key_hash(k) & p->cap_mask;
    while (!key_zero(p->slots[i]) && !key_eq(p->slots[i], k))
        i = (i + 1) & p->cap_mask;
    if (key_zero(p->slots[i]))
        p->n++;
    p->slots[i] = k;
}

/* One hash per distinct prefix length of count, longest first; slot_of
 * gets each length's index. */
static int family_alloc(struct dp_rfamily *fam, enum dp_family f, const uint32_t *count,
                        uint32_t *slot_of)
{
    int len;

    for (len = (int)width_of[f]; len >= 0; len--) {
        struct dp_rlen *l;

        if (!count[len])
            continue;
        l = &fam->lens[fam->nlens];
        l->prefixlen = (uint32_t)len;
        l->mask = mask_of(f, (uint32_t)len);
        l->cap_mask = capacity_for(count[len]) - 1;
        l->slots = calloc((size_t)l->cap_mask + 1, sizeof(*l->slots));
        if (!l->slots)
            return -ENOMEM;
        slot_of[len] = fam->nlens++;
    }
    return 0;
}

static int peers_alloc(struct dp_peers *p, uint32_t n)
{
    p->cap_mask = capacity_for(n) - 1;
    p->slots = calloc((size_t)p->cap_mask + 1, sizeof(*p->slots));
    return p->slots ? 0 : -ENOMEM;
}

int dp_routes_build(struct dp_routes **out, const dp_route *routes, uint32_t n,
                    const dp_route6 *routes6, uint32_t n6)
{
    const void *arr[DP_FAMILIES] = { routes, routes6 };
    const uint32_t num[DP_FAMILIES] = { n, n6 };
    uint32_t count[DP_FAMILIES][DP_ROUTES_LENS] = {{0}}, slot_of[DP_FAMILIES][DP_ROUTES_LENS];
    uint32_t i, npeers6 = 0;
    struct dp_routes *t;
    struct dp_rview v;
    int f, rc;

    *out = NULL;
    for (f = 0; f < DP_FAMILIES; f++)
        if ((rc = count_routes(f, arr[f], num[f], count[f], &npeers6)))
            return rc;

    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->refs = 1;
    /* One set per underlay, for the routes of both families: a datagram's
     * source is of its socket's family whatever it carries. */
    if (family_alloc(&t->fam[DP_FAM4], DP_FAM4, count[DP_FAM4], slot_of[DP_FAM4]) ||
        family_alloc(&t->fam[DP_FAM6], DP_FAM6, count[DP_FAM6], slot_of[DP_FAM6]) ||
        peers_alloc(&t->peers[DP_FAM4], n + n6) || peers_alloc(&t->peers[DP_FAM6], npeers6)) {
        dp_routes_free(t);
        return -ENOMEM;
    }
    for (f = 0; f < DP_FAMILIES; f++) {
        for (i = 0; i < num[f]; i++) {
            struct dp_key peer;

            route_of(f, arr[f], i, &v);
            rlen_insert(&t->fam[f].lens[slot_of[f][v.prefixlen]], &v);
            peer = v.v6 ? key_of(DP_FAM6, v.peer6) : key_of(DP_FAM4, (const uint8_t *)&v.peer_ip);
            peers_insert(&t->peers[v.v6 ? DP_FAM6 : DP_FAM4], peer);
        }
    }
    *out = t;
    return 0;
}

void dp_routes_hold(struct dp_routes *t, uint32_t n)
{
    __atomic_add_fetch(&t->refs, n, __ATOMIC_RELAXED);
}

void dp_routes_free(struct dp_routes *t)
{
    uint32_t i;
    int f;

    /* The last holder frees; the acquire pairs with the other holders'
     * release, so their lookups are over before the memory goes. */
    if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL))
        return;
    for (f = 0; f < DP_FAMILIES; f++) {
        for (i = 0; i < t->fam[f].nlens; i++)
            free(t->fam[f].lens[i].slots);
        free(t->peers[f].slots);
    }
    free(t);
}

/* The per-packet lookup, one code for both families: inlined once per
 * family, so that each copy knows its width as a constant. No IPv4 copy
 * with 32-bit keys is kept, though it was faster: `perf/route_lookup.sh 9`
 * (this code against f8c2acc's per-family one, run in turns; median and
 * min..max of 9 rounds on 2 shared cores, load 5) gave IPv4 8.7 ns
 * (6.6..10.0) vs 6.8 (5.0..18.5) at 256 routes, 13.9 (7.9..17.5) vs 9.2
 * (5.9..20.8) at 4096, the slots now IPv6's size; IPv6 9.1 vs 11.1 and
 * 16.4 vs 16.1; the IPv4 peer check 5.4 vs 3.9 and 7.1 vs 4.3. At most 5
 * to 7 ns of the microseconds a packet costs the engine (a few hundred
 * kpps per loop, perf/README.md): under 1%, not worth a second table. */
static inline __attribute__((always_inline)) int lookup(const struct dp_rfamily *fam,
                                                        enum dp_family f, const uint8_t *dst,
                                                        struct dp_route_hit *hit)
{
    struct dp_key d = key_of(f, dst);
    uint32_t li;

    for (li = 0; li < fam->nlens; li++) {
        const struct dp_rlen *l = &fam->lens[li];
        struct dp_key key = key_and(d, l->mask);
        uint32_t i = key_hash(key) & l->cap_mask;

        /* Half-full tables always hold an empty slot, so this ends. */
        while (l->slots[i].used) {
            const struct dp_rslot *s = &l->slots[i];

            if (key_eq(s->net, key)) {
                hit->peer_ip = s->peer_ip;
                hit->port = s->port;
                hit->prefixlen = l->prefixlen;
                hit->mtu = s->mtu;
                hit->v6 = s->v6;
                memcpy(hit->peer6, s->peer6, DP_IP6_ADDR);
                return 1;
            }
            i = (i + 1) & l->cap_mask;
        }
    }
    return 0;
}

int dp_routes_lookup(const struct dp_routes *t, enum dp_family f, const uint8_t *dst,
                     struct dp_route_hit *hit)
{
    if (!t)
        return 0;
    return f == DP_FAM4 ? lookup(&t->fam[DP_FAM4], DP_FAM4, dst, hit)
                        : lookup(&t->fam[DP_FAM6], DP_FAM6, dst, hit);
}

int dp_routes_has_peer(const struct dp_routes *t, enum dp_family f, const uint8_t *ip)
{
    const struct dp_peers *p;
    struct dp_key k;
    uint32_t i;

    if (!t)
        return 0;
    p = &t->peers[f];
    k = key_of(f, ip);
    if (key_zero(k))
        return p->has_zero;
    if (!p->n)
        return 0;
    i = key_hash(k) & p->cap_mask;
    while (!key_zero(p->slots[i])) {
        if (key_eq(p->slots[i], k))
            return 1;
        i = (i + 1) & p->cap_mask;
    }
    return 0;
}

uint32_t dp_routes_peers6(const struct dp_routes *t)
{
    return t ? t->peers[DP_FAM6].n : 0;
}
