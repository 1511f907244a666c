/*
 * local.c - this host's own sources: the addresses and the lease subnet
 * that no inner packet from the underlay may claim as its source
 * (dataplane.h, UDP -> TUN step 4: drop_inner_local).
 *
 * Flow, in the order the functions appear:
 *   1. dp_local_build   validate, copy the addresses and sort them
 *   2. dp_local_free
 *   3. dp_local_has     the subnet's mask, then a binary search
 *
 * Like routes.c's table, a set is immutable once built: loop.c publishes a
 * new one with one atomic exchange and the loop thread frees the old one.
 * A host has a handful of addresses (a few thousand on a busy node), so a
 * sorted array and log2(n) compares cost less than a hash, and the set
 * needs no sentinel for 0.0.0.0.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"

struct dp_local {
    uint32_t net, mask;   /* host order; mask 0 = no subnet */
    uint32_t n;
    uint32_t addrs[];     /* host order, ascending */
};

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return (x > y) - (x < y);
}

int dp_local_build(struct dp_local **out, uint32_t net, uint32_t prefixlen,
                   const uint32_t *addrs, uint32_t n)
{
    uint32_t mask = prefixlen ? 0xffffffffu << (32 - (prefixlen > 32 ? 32 : prefixlen)) : 0;
    struct dp_local *l;
    uint32_t i;

    *out = NULL;
    net = ntohl(net);
    if (prefixlen > 32 || n > DP_LOCAL_MAX || (n && !addrs) || (net & ~mask))
        return -EINVAL;   /* prefixlen 0 means no subnet, so net must be 0 too */
    l = malloc(sizeof(*l) + (size_t)n * sizeof(l->addrs[0]));
    if (!l)
        return -ENOMEM;
    l->net = net;
    l->mask = mask;
    l->n = n;
    for (i = 0; i < n; i++)
        l->addrs[i] = ntohl(addrs[i]);
    qsort(l->addrs, n, sizeof(l->addrs[0]), cmp_u32);
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
