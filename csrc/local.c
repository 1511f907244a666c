/*
 * local.c - this host's own sources: the addresses and the lease subnet of
 * each family that no inner packet from the underlay may claim as its
 * source (dataplane.h, UDP -> TUN step 4: drop_inner_local).
 *
 * Flow, in the order the functions appear:
 *   1. dp_local_build   validate, copy both families' addresses and sort them
 *   2. dp_local_free
 *   3. dp_local_has,    the subnet's mask, then a binary search
 *      dp_local_has6
 *
 * Like routes.c's table, a set is immutable once built: loop.c publishes a
 * new one with one atomic exchange and the loop thread frees the old one.
 * A host has a handful of addresses (a few thousand on a busy node), so a
 * sorted array and log2(n) compares cost less than a hash, and the set
 * needs no sentinel for 0.0.0.0 or ::. An IPv6 address is kept as two
 * host-order halves, so that masking, sorting and comparing are word
 * operations.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"

struct dp_addr6 {
    uint64_t hi, lo;      /* host order */
};

struct dp_local {
    uint32_t net, mask;   /* host order; mask 0 = no subnet */
    struct dp_addr6 net6, mask6;   /* the same; mask6 all zero = no subnet */
    uint32_t n, n6;
    uint32_t *addrs;      /* host order, ascending; in the same block as this */
    struct dp_addr6 *addrs6;       /* ascending; the same block */
};

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return (x > y) - (x < y);
}

static int cmp_addr6(const void *a, const void *b)
{
    const struct dp_addr6 *x = a, *y = b;

    if (x->hi != y->hi)
        return x->hi > y->hi ? 1 : -1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static struct dp_addr6 addr6_of(const uint8_t *a)
{
    struct dp_addr6 v = {
        (uint64_t)dp_rd32(a) << 32 | dp_rd32(a + 4),
        (uint64_t)dp_rd32(a + 8) << 32 | dp_rd32(a + 12),
    };

    return v;
}

static struct dp_addr6 mask6_of(uint32_t prefixlen)
{
    struct dp_addr6 m = {
        prefixlen >= 64 ? ~0ull : prefixlen ? ~0ull << (64 - prefixlen) : 0,
        prefixlen <= 64 ? 0 : ~0ull << (128 - prefixlen),
    };

    return m;
}

int dp_local_build(struct dp_local **out, uint32_t net, uint32_t prefixlen,
                   const uint32_t *addrs, uint32_t n, const uint8_t *net6,
                   uint32_t prefixlen6, const uint8_t *addrs6, uint32_t n6)
{
    uint32_t mask = prefixlen ? 0xffffffffu << (32 - (prefixlen > 32 ? 32 : prefixlen)) : 0;
    struct dp_addr6 n6v = {0, 0}, m6 = mask6_of(prefixlen6 > 128 ? 128 : prefixlen6);
    struct dp_local *l;
    uint32_t i;

    *out = NULL;
    net = ntohl(net);
    if (prefixlen > 32 || n > DP_LOCAL_MAX || (n && !addrs) || (net & ~mask))
        return -EINVAL;   /* prefixlen 0 means no subnet, so net must be 0 too */
    if (prefixlen6 > 128 || n6 > DP_LOCAL_MAX || (n6 && !addrs6) || (prefixlen6 && !net6))
        return -EINVAL;
    if (net6)
        n6v = addr6_of(net6);
    if ((n6v.hi & ~m6.hi) || (n6v.lo & ~m6.lo))
        return -EINVAL;   /* the same rule: host bits, or a net without a prefix */
    /* One block: the struct, then the IPv6 addresses (8-byte aligned), then
     * the IPv4 ones. */
    l = malloc(sizeof(*l) + (size_t)n6 * sizeof(l->addrs6[0]) + (size_t)n * sizeof(l->addrs[0]));
    if (!l)
        return -ENOMEM;
    l->addrs6 = (struct dp_addr6 *)(l + 1);
    l->addrs = (uint32_t *)(l->addrs6 + n6);
    l->net = net;
    l->mask = mask;
    l->net6 = n6v;
    l->mask6 = m6;
    l->n = n;
    l->n6 = n6;
    for (i = 0; i < n; i++)
        l->addrs[i] = ntohl(addrs[i]);
    qsort(l->addrs, n, sizeof(l->addrs[0]), cmp_u32);
    for (i = 0; i < n6; i++)
        l->addrs6[i] = addr6_of(addrs6 + (size_t)i * DP_IP6_ADDR);
    qsort(l->addrs6, n6, sizeof(l->addrs6[0]), cmp_addr6);
    *out = l;
    return 0;
}

void dp_local_free(struct dp_local *l)
{
    free(l);
}

int dp_local_has(const struct dp_local *l, uint32_t ip)
{
    uint32_t lo = 0, hi, mid;

    if (!l)
        return 0;
    ip = ntohl(ip);
    if (l->mask && (ip & l->mask) == l->net)
        return 1;
    for (hi = l->n; lo < hi;) {
        mid = lo + (hi - lo) / 2;
        if (l->addrs[mid] == ip)
            return 1;
        if (l->addrs[mid] < ip)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

int dp_local_has6(const struct dp_local *l, const uint8_t *ip)
{
    struct dp_addr6 a;
    uint32_t lo = 0, hi, mid;
    int c;

    if (!l)
        return 0;
    a = addr6_of(ip);
    if ((l->mask6.hi || l->mask6.lo) && (a.hi & l->mask6.hi) == l->net6.hi &&
        (a.lo & l->mask6.lo) == l->net6.lo)
        return 1;
    for (hi = l->n6; lo < hi;) {
        mid = lo + (hi - lo) / 2;
        c = cmp_addr6(&l->addrs6[mid], &a);
        if (c == 0)
            return 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}
