/*
 * csum.h - the outer UDP checksum of flannel.bpf.c's datagrams, sent and checked as the
 * engines' kernel sends and checks theirs (docs/kernel-path.md, "The outer UDP checksum").
 * Included by flannel.bpf.c alone, after its includes and maps.h.
 */
#ifndef FU_CSUM_H
#define FU_CSUM_H

#include <bpf/bpf_core_read.h>

/* The kernel's own sk_buff, for the one field tc's __sk_buff does not show: how far its
 * checksum is done (linux/skbuff.h); CO-RE finds the field where this kernel has it. */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;
struct sk_buff___fu {
    __u8 ip_summed:2;
} __attribute__((preserve_access_index));
#define CHECKSUM_PARTIAL 3

static __always_inline __u32 fold(__u64 s)
{
    s = (s & 0xffffffff) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (s & 0xffff) + (s >> 16);
}

/* The ones' complement sum of the skb's len bytes from off, copied out FU_CSUM_CHUNK at a time
 * (an odd last byte padded with a zero, as the checksum wants): bytes beyond the skb's linear
 * data (a NIC's page fragments). Global functions, these three: each verified once. */
__attribute__((noinline)) int fu_copy_sum(struct __sk_buff *skb, __u32 off, __u32 len)
{
    __u8 buf[FU_CSUM_CHUNK];
    __u64 s = 0;
    for (int i = 0; i < FU_CSUM_CHUNKS; i++) {
        __u32 at = i * FU_CSUM_CHUNK;
        if (at >= len)
            break;
        if (len - at >= FU_CSUM_CHUNK) {
            if (bpf_skb_load_bytes(skb, off + at, buf, FU_CSUM_CHUNK))
                return -1;
        } else {
            __u64 n = len - at - 1;
            __builtin_memset(buf, 0, sizeof(buf));
            /* n + 1 bytes, 1 to 128: written so that the verifier sees the bounds (clang
             * would test another register than the one it passes) */
            asm volatile("%0 &= 127\n\t%0 += 1" : "+r"(n));
            if (bpf_skb_load_bytes(skb, off + at, buf, n))
                return -1;
        }
        s += (__u32)bpf_csum_diff(0, 0, (__be32 *)buf, FU_CSUM_CHUNK, 0);
    }
    return fold(s);
}

/* Bytes in the skb's linear data (a test run's, a veth's, most small packets') are summed in
 * place by bpf_csum_diff, with no copy: FU_SUM_WIDE bytes a call (the most the helper takes
 * on older kernels), the rest in pieces of 256, 128, ... 4 bytes, each of a size the
 * verifier sees is constant, after a bounds check it can hold: about three times as fast at
 * 1400 bytes as copying them out (docs/kernel-path.md, "csum-cost"). In place from offsets
 * below 32 KB only (the verifier's packet range ends at 64 KB, the widest read included): a
 * non-GSO packet's bytes lie there. */
#define FU_SUM_WIDE 512
#define FU_SUM_MAX_POS (0x7fff - FU_SUM_WIDE)
/* An offset checked against FU_SUM_MAX_POS, masked in the register it is used from (a no-op
 * on its value): clang would otherwise test one copy of it and add another (or one it
 * hoisted out of the loop), whose bounds the verifier does not know. */
#define FU_BOUNDED(x) asm volatile("%0 &= 0x7fff" : "+r"(x))

#define FU_SUM_PIECE(n)                                                     \
    if (len & (n)) {                                                        \
        if (pos > FU_SUM_MAX_POS)                                           \
            return -1;                                                      \
        FU_BOUNDED(pos);                                                    \
        p = data + pos;                                                     \
        if ((void *)(p + (n)) > end)                                        \
            return -1;                                                      \
        s += (__u32)bpf_csum_diff(0, 0, (__be32 *)p, (n), 0);               \
        pos += (n);                                                         \
    }

/* The sum of len (< FU_SUM_WIDE) bytes from pos, all in the linear data; -1 where they are
 * not (fu_copy_sum then). Every piece starts an even number of bytes in. */
__attribute__((noinline)) int fu_place_sum(struct __sk_buff *skb, __u32 at, __u32 len)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    __u8 *p;
    __u64 s = 0, pos = at;
    if (len >= FU_SUM_WIDE)
        return -1;
    FU_SUM_PIECE(256)
    FU_SUM_PIECE(128)
    FU_SUM_PIECE(64)
    FU_SUM_PIECE(32)
    FU_SUM_PIECE(16)
    FU_SUM_PIECE(8)
    FU_SUM_PIECE(4)
    if (len & 3) {
        /* the last 1-3 bytes, as the word they begin (zeros after them) */
        __u32 w = 0;
        __u8 *b = (__u8 *)&w;
        if (pos > FU_SUM_MAX_POS)
            return -1;
        FU_BOUNDED(pos);
        p = data + pos;
        if ((void *)(p + 1) > end)
            return -1;
        b[0] = p[0];
        if (len & 2) {
            if ((void *)(p + 2) > end)
                return -1;
            b[1] = p[1];
            if (len & 1) {
                if ((void *)(p + 3) > end)
                    return -1;
                b[2] = p[2];
            }
        }
        s += w;
    }
    return fold(s);
}

/* The ones' complement sum of the skb's len bytes from off: in place where they lie in the
 * linear data, else copied out; -1: a read failed. (The tests compile it with
 * FU_SUM_COPY_ONLY too, which copies every byte: a test run's packet is always linear.) */
__attribute__((noinline)) int fu_bytes_sum(struct __sk_buff *skb, __u32 off, __u32 len)
{
    __u64 s = 0, at = 0;
    int rest = -1;
    if (len > 0xffff)
        return -1;
#ifndef FU_SUM_COPY_ONLY
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    for (int i = 0; i < 0x10000 / FU_SUM_WIDE; i++) {
        __u64 pos = (__u64)off + at;
        if (len - at < FU_SUM_WIDE || pos > FU_SUM_MAX_POS)
            break;
        FU_BOUNDED(pos);
        __u8 *p = data + pos;
        if ((void *)(p + FU_SUM_WIDE) > end)
            break;
        s += (__u32)bpf_csum_diff(0, 0, (__be32 *)p, FU_SUM_WIDE, 0);
        at += FU_SUM_WIDE;
    }
    rest = fu_place_sum(skb, off + at, len - at);
#endif
    if (rest < 0)
        rest = fu_copy_sum(skb, off + at, len - at);
    if (rest < 0)
        return -1;
    return fold(s + rest);
}

/* The sum of an upper-layer pseudo-header's protocol and length, and of the addresses. */
static __always_inline __u64 pseudo(__u8 proto, __u32 len)
{
    return bpf_htons(proto) + bpf_htons(len & 0xffff) + bpf_htons(len >> 16);
}

static __always_inline __u64 sum_words(const __u32 *w, int n)
{
    __u64 s = 0;
#pragma unroll
    for (int i = 0; i < 10; i++)
        if (i < n)
            s += w[i];
    return s;
}

/* Whether the skb's checksum is done or never needed a wire: the device verified it
 * (CHECKSUM_UNNECESSARY), or a sender on this host left it for the device to fill
 * (CHECKSUM_PARTIAL). Asked before bpf_skb_adjust_room, which resets the first. */
static __always_inline int csum_trusted(struct __sk_buff *skb)
{
    if (bpf_csum_level(skb, BPF_CSUM_LEVEL_QUERY) >= 0)
        return 1;
    struct sk_buff___fu *k = bpf_cast_to_kern_ctx(skb);
    return BPF_CORE_READ_BITFIELD(k, ip_summed) == CHECKSUM_PARTIAL;
}

/* The ones' complement sum of the inner packet (len bytes at off) as the outer UDP checksum
 * covers it. Every byte, as the engines' kernel sums them; but where its checksum is
 * trusted (csum_trusted), the kernel's own UDP tunnels' way (local checksum offload): a TCP
 * segment or a checksummed UDP datagram right after the IP header (not a fragment) sums, once
 * its own checksum holds or is filled in, to the complement of its pseudo-header, so only the
 * IP header is read (and a CHECKSUM_PARTIAL packet's bytes are not final: they could not be
 * summed). -1: a read failed. */
static __always_inline int inner_sum(struct __sk_buff *skb, __u32 off, __u32 len, int trusted)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    __u8 *p = data + off;
    if (trusted && (void *)(p + 48) <= end && p[0] >> 4 == 6) {
        struct ipv6hdr *ip6 = (void *)p;
        __u8 nh = ip6->nexthdr;
        __u32 ul = len - sizeof(*ip6);
        if (bpf_ntohs(ip6->payload_len) == ul &&
            ((nh == IPPROTO_TCP && ul >= 20) ||
             (nh == IPPROTO_UDP && ul >= 8 && ((struct udphdr *)(ip6 + 1))->check))) {
            __u64 ps = sum_words((const __u32 *)&ip6->saddr, 8) + pseudo(nh, ul);
            return fold(sum_words((const __u32 *)ip6, 10) + (~fold(ps) & 0xffff));
        }
    } else if (trusted && (void *)(p + 28) <= end && p[0] == 0x45) {
        struct iphdr *ip = (void *)p;
        __u8 pr = ip->protocol;
        __u32 ul = len - sizeof(*ip);
        if (bpf_ntohs(ip->tot_len) == len && !(ip->frag_off & bpf_htons(IP_FRAG_BITS)) &&
            ((pr == IPPROTO_TCP && ul >= 20) ||
             (pr == IPPROTO_UDP && ul >= 8 && ((struct udphdr *)(ip + 1))->check))) {
            __u64 ps = (__u64)ip->saddr + ip->daddr + pseudo(pr, ul);
            return fold(sum_words((const __u32 *)ip, 5) + (~fold(ps) & 0xffff));
        }
    }
    return fu_bytes_sum(skb, off, len);
}

/* The sum of the outer UDP header and its pseudo-header but the addresses (len: the UDP length). */
static __always_inline __u64 udp_sum(const struct udphdr *u, __u32 len)
{
    return pseudo(IPPROTO_UDP, len) + u->source + u->dest + u->len + u->check;
}

#endif
