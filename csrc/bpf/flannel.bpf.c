/*
 * flannel.bpf.c - flanneld's udp wire in the kernel: two tc programs.
 *
 * fu_egress, on flannel0's egress: a packet the kernel routed into flannel0
 * is checked as csrc/dataplane.h's "TUN -> UDP" steps check it, its TTL (hop
 * limit) decremented, and sent to its route's peer as the payload of a UDP
 * datagram own_ip:port -> peer:port (the IPv6 underlay: own_ip6 -> the peer's
 * IPv6), redirected out of the external interface. fu_ingress, on the
 * external interface's ingress: a UDP datagram to own_ip:port (own_ip6:port)
 * whose UDP checksum holds is checked as "UDP -> TUN" checks it,
 * decapsulated, and delivered into flannel0's ingress, as the engine's
 * write() delivers it.
 *
 * Where the engine would answer (no route: ICMP unreachable, TTL: time
 * exceeded, too big) or drop for a malformed packet, and for what these
 * programs leave alone (IPv4 options, fragments, GRO trains, a helper that
 * refuses), the packet goes on unchanged (TC_ACT_OK): into flannel0, or up
 * to the engine's socket, whose engine then does what it does today. Only the
 * source rules (counted by the engines' reasons) and a wrong UDP checksum (which
 * their kernel drops) drop here, so a forged datagram costs the host no wake-up. Everything is counted in fu_counters
 * (maps.h names the indexes); the outer UDP checksum's sums are csum.h's.
 *
 * (Over 450 lines as one piece: the two directions are one object, one set of maps and
 * counters, and share the header checks, the source rules' lookups and the TTL update;
 * what stands apart, the checksum, is csum.h.)
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"

/* Linux 6.3's uapi; Debian 12's headers (6.1) lack them. */
#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif
/* Linux 6.19's (not in 6.18): the decapsulation also clears the UDP tunnel GSO bits. */
#ifndef BPF_F_ADJ_ROOM_DECAP_L4_UDP
#define BPF_F_ADJ_ROOM_DECAP_L4_UDP (1ULL << 10)
#endif
#define IP_DF 0x4000
#define IP_FRAG_BITS 0x3fff
/* dataplane.h's TTL update: (~old & 0xffff) + new is this whatever old is */
#define TTL_DEC_SUM 0xfeff

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, fu_config);
         __uint(max_entries, 1); } fu_config_map SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LPM_TRIE); __type(key, fu_key4); __type(value, fu_hop);
         __uint(max_entries, FU_ROUTES_MAX); __uint(map_flags, BPF_F_NO_PREALLOC); } fu_routes4 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LPM_TRIE); __type(key, fu_key6); __type(value, fu_hop);
         __uint(max_entries, FU_ROUTES_MAX); __uint(map_flags, BPF_F_NO_PREALLOC); } fu_routes6 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u32);
         __uint(max_entries, FU_PEERS_MAX); } fu_peers4 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, fu_addr6); __type(value, __u32);
         __uint(max_entries, FU_PEERS_MAX); } fu_peers6 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u32);
         __uint(max_entries, FU_LOCAL_MAX); } fu_local4 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, fu_addr6); __type(value, __u32);
         __uint(max_entries, FU_LOCAL_MAX); } fu_local6 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __type(key, __u32); __type(value, __u64);
         __uint(max_entries, FU_COUNTERS); } fu_counters SEC(".maps");

static __always_inline void count(__u32 i, __u64 n)
{
    __u64 *c = bpf_map_lookup_elem(&fu_counters, &i);
    if (c)
        *c += n;     /* per CPU: no other writer */
}

static __always_inline int pass(__u32 reason)
{
    count(reason, 1);
    return TC_ACT_OK;
}

static __always_inline int drop(__u32 reason)
{
    count(reason, 1);
    return TC_ACT_SHOT;
}

/* The IPv4 TTL decrement, dataplane.h's formula bit for bit. */
static __always_inline void ttl_dec4(struct iphdr *ip)
{
    __u32 s = (bpf_ntohs(ip->check) ^ 0xffff) + TTL_DEC_SUM;
    ip->ttl--;
    ip->check = bpf_htons(((s & 0xffff) + (s >> 16)) ^ 0xffff);
}

/* The inner packet at in: its TTL (IPv6: hop limit) - 1; -1 if its header is not there. */
static __always_inline int hop_dec(void *in, const void *end, int v6)
{
    if (in + (v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr)) > end)
        return -1;
    if (v6)
        ((struct ipv6hdr *)in)->hop_limit--;
    else
        ttl_dec4(in);
    return 0;
}

/* dataplane.h's link scope: fe80::/10 either side, a destination of ::, or
 * multicast of scope 0, 1 or 2. */
static __always_inline int link_scoped(const struct ipv6hdr *ip6)
{
    const __u8 *s = ip6->saddr.in6_u.u6_addr8, *d = ip6->daddr.in6_u.u6_addr8;
    const __u32 *d32 = ip6->daddr.in6_u.u6_addr32;
    if ((s[0] == 0xfe && (s[1] & 0xc0) == 0x80) || (d[0] == 0xfe && (d[1] & 0xc0) == 0x80))
        return 1;
    if (d[0] == 0xff && (d[1] & 0x0f) <= 2)
        return 1;
    return !(d32[0] | d32[1] | d32[2] | d32[3]);
}

/* The header checks both directions make (csrc/packet.c's): 0, BAD_SHAPE (the lengths, the
 * engine drops it as malformed) or BAD_RARE (what the programs leave to the engine: IPv4
 * options; IPv6 link scope, which the engine drops). len: the packet's length. */
enum { BAD_SHAPE = 1, BAD_RARE = 2 };

static __always_inline int check4(const struct iphdr *ip, __u32 len)
{
    if (ip->ihl < 5 || ip->ihl * 4 > len || bpf_ntohs(ip->tot_len) != len)
        return BAD_SHAPE;
    return ip->ihl != 5 ? BAD_RARE : 0;
}

static __always_inline int check6(const struct ipv6hdr *ip6, const void *end, __u32 len)
{
    if ((void *)(ip6 + 1) > end || bpf_ntohs(ip6->payload_len) + sizeof(*ip6) != len)
        return BAD_SHAPE;
    return link_scoped(ip6) ? BAD_RARE : 0;
}

static __always_inline void pull(struct __sk_buff *skb, __u32 want)
{
    /* the headers looked at, linear and writable; a shorter packet fails the
     * bounds checks after it */
    bpf_skb_pull_data(skb, want < skb->len ? want : skb->len);
}

#include "csum.h"
#include "pmtu.h"

/* ---- TUN -> UDP -------------------------------------------------------------------- */

/* The outer headers in front of the inner packet (len bytes), its TTL or
 * hop limit decremented after them, then out to the peer. The room is made
 * first: a refusal leaves the packet as it was, for the engine. */
static __always_inline int encap(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                 const fu_hop *hop, __u32 len, int v6)
{
    int u6 = !hop->peer_ip;
    __u32 outer = u6 ? FU_OUTER6 : FU_OUTER4;
    /* A super-packet's segments copy its outer UDP checksum, which tc cannot have the kernel
     * fill per segment (bpf_skb_adjust_room marks SKB_GSO_UDP_TUNNEL, never _CSUM): over
     * IPv4 it is 0, which IPv4 allows; IPv6 does not, so the engine sends those. */
    if (u6 && skb->gso_size)
        return pass(FU_TX_PASS_GSO6);
    int trusted = csum_trusted(skb);
    /* the flow label: the inner flow's hash, as the kernel's own IPv6 tunnels take it */
    __u32 label = u6 ? bpf_get_hash_recalc(skb) : 0;
    label = ((label << 16) | (label >> 16)) & 0xfffff;
    if (bpf_skb_adjust_room(skb, outer, BPF_ADJ_ROOM_MAC,
                            (u6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) |
                            BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_FIXED_GSO))
        return pass(FU_TX_PASS_HELPER);
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    if (hop_dec(data + l2 + outer, end, v6))
        return drop(FU_TX_DROP_HELPER);
    __u64 sum;
    struct udphdr *u;
    if (u6) {
        struct ipv6hdr *o = data + l2;
        u = (void *)(o + 1);
        if ((void *)(u + 1) > end)
            return drop(FU_TX_DROP_HELPER);
        *(__be32 *)o = bpf_htonl(0x60000000 | label);
        o->payload_len = bpf_htons(len + sizeof(struct udphdr));
        o->nexthdr = IPPROTO_UDP;
        o->hop_limit = FU_OUTER_TTL;
        __builtin_memcpy(&o->saddr, c->own_ip6, 16);
        __builtin_memcpy(&o->daddr, hop->peer_ip6, 16);
        sum = sum_words((const __u32 *)&o->saddr, 8);
    } else {
        struct iphdr *o = data + l2;
        u = (void *)(o + 1);
        if ((void *)(u + 1) > end)
            return drop(FU_TX_DROP_HELPER);
        o->version = 4;
        o->ihl = 5;
        o->tos = 0;
        o->tot_len = bpf_htons(len + FU_OUTER4);
        o->id = 0;          /* DF: an atomic datagram (RFC 6864), as the kernel writes the engines' */
        o->frag_off = bpf_htons(IP_DF);
        o->ttl = FU_OUTER_TTL;
        o->protocol = IPPROTO_UDP;
        o->check = 0;
        o->saddr = c->own_ip;
        o->daddr = hop->peer_ip;
        o->check = ~fold(sum_words((const __u32 *)o, 5)) & 0xffff;
        sum = (__u64)o->saddr + o->daddr;
    }
    u->source = bpf_htons(c->port);
    u->dest = bpf_htons(c->port);
    u->len = bpf_htons(len + sizeof(struct udphdr));
    u->check = 0;
    if (!skb->gso_size) {
        /* the engines' kernel checksums their datagrams: so does this, the same sum. (A
         * super-packet's stays 0 over IPv4, above.) */
        sum += udp_sum(u, len + sizeof(struct udphdr));
        int in = inner_sum(skb, l2 + outer, len, trusted);
        if (in < 0)
            return drop(FU_TX_DROP_HELPER);
        __u16 check = ~fold(sum + in) & 0xffff;
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
        u = data + l2 + outer - sizeof(struct udphdr);
        if ((void *)(u + 1) > end)
            return drop(FU_TX_DROP_HELPER);
        u->check = check ? check : 0xffff;
    }
    count(FU_UDP_TX_PACKETS, 1);
    count(FU_UDP_TX_BYTES, len);
    if ((c->flags & FU_F_EXT_L2) && !l2) {
        /* an L3 device's packet has no MAC header; redirect_neigh fills one in */
        if (bpf_skb_change_head(skb, FU_ETH_HLEN, 0))
            return drop(FU_TX_DROP_HELPER);
        l2 = FU_ETH_HLEN;
    }
    if (l2) {
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
        struct ethhdr *eth = data;
        if ((void *)(eth + 1) > end)
            return drop(FU_TX_DROP_HELPER);
        eth->h_proto = bpf_htons(u6 ? ETH_P_IPV6 : ETH_P_IP);
    }
    /* No next hop given: the kernel looks the outer destination up (a peer behind a router
     * goes to the router) and sets the packet's route to it. With the peer as next hop the
     * packet kept flannel0's route, and one queued while its neighbour was resolved went
     * out through flannel0's neighbour, without a MAC header. */
    return bpf_redirect_neigh(c->ext_ifindex, NULL, 0, 0);
}

/* Steps 2 to 5 of either family, once its header checks passed: the route (hop), the TTL
 * or hop limit, the size (the route's MTU, flannel0's by default, then the path's), then out.
 * A GSO packet's size is its segments'. */
static __always_inline int forward(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                   __u32 len, const fu_hop *hop, __u8 ttl, int v6)
{
    if (!hop)
        return pass(FU_TX_PASS_NO_ROUTE);
    if (ttl <= 1)
        return pass(FU_TX_PASS_TTL);
    __u32 size = len, mtu = hop->mtu ? hop->mtu : c->mtu;
    if (skb->gso_size)
        size = skb->gso_size +
               seg_headers(skb, l2, v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr), v6);
    if (size > mtu)
        return pass(FU_TX_PASS_TOO_BIG);
    /* No path MTU the kernel keeps is below IPv6's minimum, or IPv4's min_pmtu (by default):
     * a datagram within it needs no lookup (the 64-byte packets, the ACKs). */
    size += hop->peer_ip ? FU_OUTER4 : FU_OUTER6;
    if (size > (hop->peer_ip ? FU_PMTU_FLOOR4 : FU_PMTU_FLOOR6) && over_path_mtu(skb, c, hop, size))
        return pass(FU_TX_PASS_PATH_MTU);
    return encap(skb, c, l2, hop, len, v6);
}

static __always_inline int egress4(struct __sk_buff *skb, const fu_config *c, __u32 l2, __u32 len)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct iphdr *ip = data + l2;
    if ((void *)(ip + 1) > end)
        return pass(FU_TX_PASS_MALFORMED);
    int bad = check4(ip, len);      /* step 1 */
    if (bad)
        return pass(bad == BAD_SHAPE ? FU_TX_PASS_MALFORMED : FU_TX_PASS_OPTIONS);
    if (ip->frag_off & bpf_htons(IP_FRAG_BITS))
        return pass(FU_TX_PASS_FRAGMENT);
    fu_key4 k = { .prefixlen = 32 };
    __builtin_memcpy(k.addr, &ip->daddr, 4);
    return forward(skb, c, l2, len, bpf_map_lookup_elem(&fu_routes4, &k), ip->ttl, 0);
}

static __always_inline int egress6(struct __sk_buff *skb, const fu_config *c, __u32 l2, __u32 len)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ipv6hdr *ip6 = data + l2;
    int bad = check6(ip6, end, len);
    if (bad)
        return pass(bad == BAD_SHAPE ? FU_TX_PASS_MALFORMED : FU_TX_PASS_SCOPE);
    fu_key6 k = { .prefixlen = 128 };
    __builtin_memcpy(k.addr, &ip6->daddr, 16);
    return forward(skb, c, l2, len, bpf_map_lookup_elem(&fu_routes6, &k), ip6->hop_limit, 1);
}

SEC("tc")
int fu_egress(struct __sk_buff *skb)
{
    __u32 z = 0;
    fu_config *c = bpf_map_lookup_elem(&fu_config_map, &z);
    if (!c || !c->own_ip)
        return TC_ACT_OK;   /* not configured yet: the engine's, as without us */
    __u32 l2 = (c->flags & FU_F_TUN_L2) ? FU_ETH_HLEN : 0;
    if (skb->len <= l2)
        return pass(FU_TX_PASS_MALFORMED);
    __u32 len = skb->len - l2;
    pull(skb, l2 + sizeof(struct ipv6hdr) + sizeof(struct udphdr));
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    __u8 *p = data + l2;
    if ((void *)(p + 1) > end)
        return pass(FU_TX_PASS_MALFORMED);
    if (p[0] >> 4 == 4)
        return egress4(skb, c, l2, len);
    if (p[0] >> 4 == 6)
        return egress6(skb, c, l2, len);
    return pass(FU_TX_PASS_MALFORMED);
}

/* ---- UDP -> TUN -------------------------------------------------------------------- */

static __always_inline int own4(const fu_config *c, __u32 src)
{
    return (c->own_mask && (src & c->own_mask) == c->own_net) ||
           bpf_map_lookup_elem(&fu_local4, &src);
}

static __always_inline int own6(const fu_config *c, const struct ipv6hdr *ip6)
{
    const __u32 *s = ip6->saddr.in6_u.u6_addr32;
    const __u32 *n = (const __u32 *)c->own_net6, *m = (const __u32 *)c->own_mask6;
    if ((m[0] | m[1] | m[2] | m[3]) && (s[0] & m[0]) == n[0] && (s[1] & m[1]) == n[1] &&
        (s[2] & m[2]) == n[2] && (s[3] & m[3]) == n[3])
        return 1;
    fu_addr6 a;
    __builtin_memcpy(a.addr, s, 16);
    return bpf_map_lookup_elem(&fu_local6, &a) != 0;
}

/* Who sent a datagram: the outer source of either underlay (v6: 0 for IPv4's). */
typedef struct sender {
    __u32 v4;
    fu_addr6 v6;
} sender_t;

/* Step 5: the inner source's route names the sender, address and underlay. */
static __always_inline int foreign(void *routes, void *key, const sender_t *from)
{
    fu_hop *hop = bpf_map_lookup_elem(routes, key);
    if (!hop || hop->peer_ip != from->v4)
        return 1;
    const __u32 *a = (const __u32 *)hop->peer_ip6, *b = (const __u32 *)from->v6.addr;
    return hop->peer_ip == 0 && ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]));
}

/* Decapsulated (outer: the outer headers' length), then the TTL (hop limit) decremented and
 * into flannel0's ingress. */
static __always_inline int decap(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                 __u32 outer, __u32 len, int v6)
{
    __u64 flags = v6 ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6 : BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
    /* A super-packet keeps its segment size (the inner MSS, not the outer headers'), and
     * loses the tunnel's GSO bits: left set, the kernel would cut the inner packet as if it
     * were still encapsulated wherever it is segmented next. */
    if (skb->gso_size)
        flags |= BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_DECAP_L4_UDP;
    if (bpf_skb_adjust_room(skb, -(int)outer, BPF_ADJ_ROOM_MAC, flags))
        return pass(FU_RX_PASS_HELPER);
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    void *in = data + l2;
    if (hop_dec(in, end, v6))
        return drop(FU_RX_DROP_HELPER);
    if (l2) {
        struct ethhdr *eth = data;
        if ((void *)(eth + 1) > end)
            return drop(FU_RX_DROP_HELPER);
        eth->h_proto = bpf_htons(v6 ? ETH_P_IPV6 : ETH_P_IP);
    }
    count(FU_TUN_TX_PACKETS, 1);
    count(FU_TUN_TX_BYTES, len);
    return bpf_redirect(c->tun_ifindex, BPF_F_INGRESS);
}

/* Steps 4 to 7 of either family, once its header checks passed: the inner source not our
 * own (own), routed to the sender under the strict rule (key in routes), the TTL, then in. */
static __always_inline int accept(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                  __u32 outer, __u32 len, int own, void *routes, void *key,
                                  const sender_t *from, __u8 ttl, int v6)
{
    if (own)
        return drop(FU_DROP_INNER_LOCAL);
    if ((c->flags & FU_F_STRICT) && foreign(routes, key, from))
        return drop(FU_DROP_INNER_FOREIGN);
    if (ttl <= 1)
        return pass(FU_RX_PASS_TTL);
    return decap(skb, c, l2, outer, len, v6);
}

static __always_inline int ingress4(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                    __u32 outer, __u32 len, const sender_t *from)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct iphdr *ip = data + l2 + outer;
    if ((void *)(ip + 1) > end)
        return pass(FU_RX_PASS_MALFORMED);
    int bad = check4(ip, len);      /* step 3 */
    if (bad)
        return pass(bad == BAD_SHAPE ? FU_RX_PASS_MALFORMED : FU_RX_PASS_OPTIONS);
    fu_key4 k = { .prefixlen = 32 };
    __builtin_memcpy(k.addr, &ip->saddr, 4);
    return accept(skb, c, l2, outer, len, own4(c, ip->saddr), &fu_routes4, &k, from, ip->ttl, 0);
}

static __always_inline int ingress6(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                    __u32 outer, __u32 len, const sender_t *from)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ipv6hdr *ip6 = data + l2 + outer;
    int bad = check6(ip6, end, len);
    if (bad)
        return pass(bad == BAD_SHAPE ? FU_RX_PASS_MALFORMED : FU_RX_PASS_SCOPE);
    fu_key6 k = { .prefixlen = 128 };
    __builtin_memcpy(k.addr, &ip6->saddr, 16);
    return accept(skb, c, l2, outer, len, own6(c, ip6), &fu_routes6, &k, from, ip6->hop_limit, 1);
}

/* A super-packet's inner packet at p spans the datagram's len bytes (it is not a train's
 * first datagram), and its segments (a TCP header at least) fit the mtu. */
static __always_inline int whole(const __u8 *p, const void *end, __u32 len, __u32 seg, __u32 mtu)
{
    if (p[0] >> 4 == 4) {
        const struct iphdr *ip = (const void *)p;
        return (void *)(ip + 1) <= end && bpf_ntohs(ip->tot_len) == len &&
               seg + sizeof(*ip) + 20 <= mtu;
    }
    const struct ipv6hdr *ip6 = (const void *)p;
    return (void *)(ip6 + 1) <= end && bpf_ntohs(ip6->payload_len) + sizeof(*ip6) == len &&
           seg + sizeof(*ip6) + 20 <= mtu;
}

/* The datagram's UDP checksum, as the kernel's UDP checks it before the engine's socket
 * sees it: trusted where the device verified it (CHECKSUM_UNNECESSARY) or where it was never
 * on a wire (CHECKSUM_PARTIAL: a sender on this host, over a veth, its inner checksum still
 * to fill), else every byte summed. 0 is no checksum, which only IPv4 allows. addrs: the
 * sum of the pseudo-header's addresses. */
static __always_inline int checksum_ok(struct __sk_buff *skb, __u32 l2, __u32 outer,
                                       __u64 addrs, int u6)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct udphdr *u = data + l2 + outer - sizeof(struct udphdr);
    if ((void *)(u + 1) > end)
        return 0;
    if (!u->check)
        return !u6;
    if (csum_trusted(skb))
        return 1;
    __u32 ulen = bpf_ntohs(u->len);
    __u64 sum = addrs + udp_sum(u, ulen);
    int in = fu_bytes_sum(skb, l2 + outer, ulen - sizeof(*u));
    return in >= 0 && fold(sum + in) == 0xffff;
}

/* Steps 1 to 3 of a datagram of either underlay that is ours (UDP to own address and port,
 * ulen its UDP length, olen the outer IP header's), its sender in from. */
static __always_inline int datagram(struct __sk_buff *skb, const fu_config *c, __u32 l2,
                                    __u32 outer, __u32 ulen, __u32 olen, const sender_t *from,
                                    __u64 addrs, int u6)
{
    /* A GSO packet is either a peer program's TCP super-packet, encapsulated whole (one
     * datagram's headers over one inner packet), or a train of the engine's datagrams
     * (UDP_SEGMENT, or GRO), which cannot be taken apart here: the inner packet's length
     * below tells them apart. Without the kernel's help (FU_F_DECAP_GSO) neither, and over
     * IPv6 no program sends super-packets (FU_TX_PASS_GSO6). */
    if (skb->gso_size && (u6 || !(c->flags & FU_F_DECAP_GSO)))
        return pass(FU_RX_PASS_GSO);
    if (ulen < sizeof(struct udphdr) || olen != ulen ||
        l2 + outer - sizeof(struct udphdr) + ulen != skb->len)
        return pass(FU_RX_PASS_MALFORMED);
    /* a super-packet's outer checksum is 0 (IPv4), its segments' each their own */
    if (!skb->gso_size && !checksum_ok(skb, l2, outer, addrs, u6))
        return drop(FU_RX_DROP_CHECKSUM);
    __u32 len = ulen - sizeof(struct udphdr);
    /* step 1 (a super-packet's segments: whole() below) */
    if (!skb->gso_size && len > c->mtu)
        return pass(FU_RX_PASS_TRUNCATED);
    /* step 2 */
    if (!(c->flags & FU_F_ACCEPT_ANY) &&
        !(u6 ? bpf_map_lookup_elem(&fu_peers6, &from->v6) : bpf_map_lookup_elem(&fu_peers4, &from->v4)))
        return drop(FU_DROP_BAD_SOURCE);
    /* step 3: the version first, as the engines take it */
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    __u8 *p = data + l2 + outer;
    if ((void *)(p + 1) > end)
        return pass(FU_RX_PASS_MALFORMED);
    if (skb->gso_size && !whole(p, end, len, skb->gso_size, c->mtu))
        return pass(FU_RX_PASS_GSO);
    if (p[0] >> 4 == 4)
        return ingress4(skb, c, l2, outer, len, from);
    if (p[0] >> 4 == 6)
        return ingress6(skb, c, l2, outer, len, from);
    return pass(FU_RX_PASS_MALFORMED);
}

SEC("tc")
int fu_ingress(struct __sk_buff *skb)
{
    __u32 z = 0;
    fu_config *c = bpf_map_lookup_elem(&fu_config_map, &z);
    if (!c || !c->own_ip)
        return TC_ACT_OK;
    __u32 l2 = (c->flags & FU_F_EXT_L2) ? FU_ETH_HLEN : 0;
    sender_t from = {};
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        pull(skb, l2 + FU_OUTER4 + sizeof(struct ipv6hdr) + sizeof(struct udphdr));
        void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
        struct iphdr *o = data + l2;
        struct udphdr *u = (void *)(o + 1);
        /* ours: UDP to own_ip:port, in one piece, no options; the rest is the stack's */
        if ((void *)(u + 1) > end || o->version != 4 || o->ihl != 5 ||
            o->protocol != IPPROTO_UDP || o->daddr != c->own_ip ||
            (o->frag_off & bpf_htons(IP_FRAG_BITS)) || u->dest != bpf_htons(c->port))
            return TC_ACT_OK;
        from.v4 = o->saddr;
        return datagram(skb, c, l2, FU_OUTER4, bpf_ntohs(u->len),
                        bpf_ntohs(o->tot_len) - sizeof(struct iphdr), &from,
                        (__u64)o->saddr + o->daddr, 0);
    }
    const __u32 *own6 = (const __u32 *)c->own_ip6;
    if (skb->protocol != bpf_htons(ETH_P_IPV6) || !(own6[0] | own6[1] | own6[2] | own6[3]))
        return TC_ACT_OK;
    pull(skb, l2 + FU_OUTER6 + sizeof(struct ipv6hdr) + sizeof(struct udphdr));
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ipv6hdr *o = data + l2;
    struct udphdr *u = (void *)(o + 1);
    /* ours: UDP right after the header (no extension headers) to own_ip6:port */
    const __u32 *d = o->daddr.in6_u.u6_addr32;
    if ((void *)(u + 1) > end || o->version != 6 || o->nexthdr != IPPROTO_UDP ||
        ((d[0] ^ own6[0]) | (d[1] ^ own6[1]) | (d[2] ^ own6[2]) | (d[3] ^ own6[3])) ||
        u->dest != bpf_htons(c->port))
        return TC_ACT_OK;
    __builtin_memcpy(from.v6.addr, &o->saddr, 16);
    return datagram(skb, c, l2, FU_OUTER6, bpf_ntohs(u->len), bpf_ntohs(o->payload_len), &from,
                    sum_words((const __u32 *)&o->saddr, 8), 1);
}

char LICENSE[] SEC("license") = "GPL";
