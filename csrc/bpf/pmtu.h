/*
 * pmtu.h - the path MTU towards a peer, as the kernel learnt it: fu_egress's
 * last check before it encapsulates (docs/kernel-path.md "Path MTU").
 * Included by flannel.bpf.c alone, after its includes, maps.h and csum.h.
 *
 * Where a link on the way to a peer is narrower than the interfaces, its
 * router answers a datagram over it with ICMP fragmentation needed (IPv6:
 * packet too big). The programs send with no socket, but the error names
 * own address:port -> peer:port, so the kernel's UDP error handler finds the
 * slow path's socket bound there and records the path MTU on the route to the
 * peer (IPv4: a nexthop exception; IPv6: a cached route), where the engines'
 * own sends read it too. bpf_fib_lookup given the outer length (tot_len)
 * compares it with that MTU and says BPF_FIB_LKUP_RET_FRAG_NEEDED; the
 * packet then goes to the engine, which answers it as it does today (a
 * pod's IPv6 with packet too big, IPv4 fragmented as under flanneld).
 */
#ifndef FU_PMTU_H
#define FU_PMTU_H

#include <linux/tcp.h>

/* linux/bpf.h's, by value: Linux 6.3's SKIP_NEIGH (redirect_neigh finds the neighbour itself) */
#define FU_FIB_OUTPUT (1U << 1)
#define FU_FIB_SKIP_NEIGH (1U << 2)
#define FU_FIB_FRAG_NEEDED 8        /* BPF_FIB_LKUP_RET_FRAG_NEEDED */
#define FU_AF_INET 2
#define FU_AF_INET6 10

/* The inner headers each segment of a GSO packet carries: the IP header, then TCP's with its
 * options or UDP's (a packet with neither: TCP's 20 bytes). hdr: the IP header's length. */
static __always_inline __u32 seg_headers(struct __sk_buff *skb, __u32 l2, __u32 hdr, int v6)
{
    pull(skb, l2 + hdr + sizeof(struct tcphdr));
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct tcphdr *t = data + l2 + hdr;
    if ((void *)(t + 1) > end)
        return hdr + sizeof(struct tcphdr);
    __u8 proto = v6 ? ((struct ipv6hdr *)(data + l2))->nexthdr : ((struct iphdr *)(data + l2))->protocol;
    if (proto == IPPROTO_UDP)
        return hdr + sizeof(struct udphdr);
    return hdr + (proto == IPPROTO_TCP && t->doff > 5 ? t->doff * 4 : sizeof(struct tcphdr));
}

/* Whether an outer datagram of size bytes to hop's peer is over the path MTU the kernel knows. */
static __always_inline int over_path_mtu(struct __sk_buff *skb, const fu_config *c,
                                         const fu_hop *hop, __u32 size)
{
    struct bpf_fib_lookup f = {};
    f.l4_protocol = IPPROTO_UDP;
    f.sport = f.dport = bpf_htons(c->port);
    f.tot_len = size;
    f.ifindex = c->ext_ifindex;
    if (hop->peer_ip) {
        f.family = FU_AF_INET;
        f.ipv4_src = c->own_ip;
        f.ipv4_dst = hop->peer_ip;
    } else {
        f.family = FU_AF_INET6;
        __builtin_memcpy(f.ipv6_src, c->own_ip6, 16);
        __builtin_memcpy(f.ipv6_dst, hop->peer_ip6, 16);
    }
    /* any other answer (no route, forwarding off) leaves it to redirect_neigh, as before */
    return bpf_fib_lookup(skb, &f, sizeof(f), FU_FIB_OUTPUT | FU_FIB_SKIP_NEIGH) ==
           FU_FIB_FRAG_NEEDED;
}

#endif
