/*
 * xdp.h - fu_xdp, the kernel path's XDP program on the external interface (included by
 * flannel.bpf.c: the same object, maps and counters, and its rules' helpers).
 *
 * Why: a datagram fu_ingress decapsulates at tc is past GRO, and a packet redirected into
 * flannel0's ingress is never coalesced, so the receiver's stack takes every TCP segment on its
 * own. fu_xdp runs before GRO (native XDP only: generic XDP runs after it) and strips the outer
 * IPv4 + UDP headers of a datagram that passes every rule fu_ingress applies, so GRO coalesces
 * the inner segments; fu_ingress then finds the mark it leaves in the XDP metadata and
 * redirects the coalesced packet into flannel0's ingress as it does its own.
 *
 * It takes only what it can decide whole, and leaves everything else as it came (XDP_PASS,
 * counted rx_xdp_pass) to fu_ingress, which then does what it does without it: a datagram
 * with a UDP checksum (the engines' and flanneld's: a peer program's super-packet segments
 * carry 0), of the IPv6 underlay, with any rule refusing it (fu_ingress drops and counts it),
 * a TTL <= 1, IPv4 options, lengths that do not agree, an inner packet over the mtu. A packet
 * it strips has passed steps 1 to 5 and had its TTL decremented: even if it reached the
 * external interface's stack without fu_ingress (attach puts fu_ingress on first and takes it
 * off last) it would be a packet the rules admit.
 */

static __always_inline int xdp_leave(void)
{
    count(FU_RX_XDP_PASS, 1);
    return XDP_PASS;
}

SEC("xdp")
int fu_xdp(struct xdp_md *ctx)
{
    __u32 z = 0;
    fu_config *c = bpf_map_lookup_elem(&fu_config_map, &z);
    if (!c || !c->own_ip || !(c->flags & FU_F_EXT_L2))
        return XDP_PASS;
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *o = (void *)(eth + 1);
    struct udphdr *u = (void *)(o + 1);
    __u8 *p = (void *)(u + 1);
    if ((void *)(u + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || o->version != 4 ||
        o->ihl != 5 || o->protocol != IPPROTO_UDP || o->daddr != c->own_ip ||
        (o->frag_off & bpf_htons(IP_FRAG_BITS)) || u->dest != bpf_htons(c->port))
        return XDP_PASS;             /* not ours: the stack's */
    __u32 ulen = bpf_ntohs(u->len), len = ulen - sizeof(*u);
    if (u->check || ulen < sizeof(*u) + 1 || bpf_ntohs(o->tot_len) != ulen + sizeof(*o) ||
        (void *)u + ulen != end || len > c->mtu || (void *)(p + 1) > end)
        return xdp_leave();
    if (!(c->flags & FU_F_ACCEPT_ANY) && !bpf_map_lookup_elem(&fu_peers4, &o->saddr))
        return xdp_leave();
    sender_t from = { .v4 = o->saddr };
    int v6 = p[0] >> 4 == 6;
    if (!v6) {
        struct iphdr *ip = (void *)p;
        fu_key4 k = { .prefixlen = 32 };
        if ((void *)(ip + 1) > end || p[0] >> 4 != 4 || check4(ip, len) || ip->ttl <= 1 ||
            own4(c, ip->saddr))
            return xdp_leave();
        __builtin_memcpy(k.addr, &ip->saddr, 4);
        if ((c->flags & FU_F_STRICT) && foreign(&fu_routes4, &k, &from))
            return xdp_leave();
    } else {
        struct ipv6hdr *ip6 = (void *)p;
        fu_key6 k = { .prefixlen = 128 };
        if (check6(ip6, end, len) || ip6->hop_limit <= 1 || own6(c, ip6))
            return xdp_leave();
        __builtin_memcpy(k.addr, &ip6->saddr, 16);
        if ((c->flags & FU_F_STRICT) && foreign(&fu_routes6, &k, &from))
            return xdp_leave();
    }
    /* decided: the TTL (hop limit) decremented, the MAC addresses moved up over the outer
     * headers, which go, and the mark put in front */
    if (hop_dec(p, end, v6))
        return xdp_leave();
    __builtin_memmove((void *)eth + FU_OUTER4, eth, 12);
    if (bpf_xdp_adjust_head(ctx, FU_OUTER4))
        return XDP_DROP;             /* the headers are half made: unreachable in practice */
    if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(fu_xdp_mark)))
        return XDP_DROP;
    data = (void *)(long)ctx->data;
    end = (void *)(long)ctx->data_end;
    fu_xdp_mark *m = (void *)(long)ctx->data_meta;
    eth = data;
    if ((void *)(m + 1) > data || (void *)(eth + 1) > end)
        return XDP_DROP;
    m->magic = FU_XDP_MAGIC;
    m->sender = from.v4;
    eth->h_proto = bpf_htons(v6 ? ETH_P_IPV6 : ETH_P_IP);
    count(FU_RX_XDP_PACKETS, 1);
    count(FU_TUN_TX_PACKETS, 1);
    count(FU_TUN_TX_BYTES, len);
    return XDP_PASS;
}

/* fu_ingress's first question: a packet fu_xdp decapsulated (its mark in the metadata), checked
 * and its TTL decremented there, goes into flannel0 as it is (one packet, or a run GRO
 * coalesced). -1: not one. */
static __always_inline int from_xdp(struct __sk_buff *skb, const fu_config *c)
{
    void *data = (void *)(long)skb->data;
    fu_xdp_mark *m = (void *)(long)skb->data_meta;
    if ((void *)(m + 1) > data || m->magic != FU_XDP_MAGIC)
        return -1;
    count(FU_RX_XDP_WRITES, 1);
    return bpf_redirect(c->tun_ifindex, BPF_F_INGRESS);
}
