/*
 * gso.c - what a TUN with IFF_VNET_HDR hands us, turned into wire packets;
 * pure functions over byte buffers, no I/O, no allocation.
 *
 * Flow, in the order the functions appear:
 *   1. (checksums: packet.c's dp_packet_sum/fold/pseudo)
 *   2. dp_gso_hdr_parse      the 10-byte struct virtio_net_hdr (native endian)
 *   3. dp_gso_csum           VIRTIO_NET_HDR_F_NEEDS_CSUM on a plain packet
 *                            (IPv4 or IPv6): finish the checksum the kernel
 *                            left partial
 *   4. dp_gso_start          check a TSO (TCPV4, TCPV6) or USO (UDP_L4)
 *                            super-packet against its header; the
 *                            DP_ST_DROP_* reason if it is not one we can cut
 *                            into packets <= mtu
 *   5. dp_gso_next           write the next segment: IP header (IPv4: id + i,
 *                            tot_len, checksum; IPv6: payload length), TCP
 *                            (seq, flags) or UDP (length) header with a full
 *                            checksum over the family's pseudo-header, payload
 *   6. dp_gso_scatter        where a read lands: header, send slot, the
 *      dp_gso_read           super-packet buffer; and which packet it gave
 *                            (tx.c makes the read and sends the packets)
 *
 * A segment is what the kernel's own software GSO (tcp_gso_segment,
 * __udp_gso_segment) would have put on the wire, so what we send is what
 * flanneld sends for the same TCP/UDP stream: one IP packet per datagram.
 * The TUN never hands us IPv4 fragments, IPv6 extension headers under a
 * GSO type, BIG TCP (an IPv6 jumbogram's payload length 0) or UFO (we never
 * turn them on); such a header is inconsistent and so malformed.
 */
#include <string.h>

#include "internal.h"

enum {
    VNET_GSO_ECN = 0x80,         /* VIRTIO_NET_HDR_GSO_ECN: only with TUN_F_TSO_ECN */
    IP_MF = 0x2000
};

/* ---- 2. the virtio_net_hdr ------------------------------------------------------ */

void dp_gso_hdr_parse(const uint8_t *raw, struct dp_vnet_hdr *h)
{
    /* Native endian: a legacy virtio header on a TUN without TUNSETVNETLE/BE. */
    h->flags = raw[0];
    h->gso_type = raw[1];
    memcpy(&h->hdr_len, raw + 2, 2);
    memcpy(&h->gso_size, raw + 4, 2);
    memcpy(&h->csum_start, raw + 6, 2);
    memcpy(&h->csum_offset, raw + 8, 2);
}

/* ---- 3. a partial checksum on a plain packet ---------------------------------- */

/* The kernel left the sum of the pseudo-header in the checksum field and
 * expects the device to add everything from csum_start to the end (what
 * skb_checksum_help() does). The sum is the same for both IP versions: only
 * where the upper layer may start differs (past the fixed header). Any
 * other version is dropped by path.c's checks anyway, and counted there. */
int dp_gso_csum(uint8_t *p, uint32_t len, const struct dp_vnet_hdr *h)
{
    uint32_t at = (uint32_t)h->csum_start + h->csum_offset;
    uint32_t hdr_min;
    uint16_t c;

    if (!(h->flags & DP_VNET_F_NEEDS_CSUM) || len < DP_IP_HDR_MIN)
        return 0;
    switch (p[0] >> 4) {
    case 4: hdr_min = DP_IP_HDR_MIN; break;
    case 6: hdr_min = DP_IP6_HDR; break;
    default: return 0;
    }
    /* An odd offset would put the field across two 16-bit words of the sum:
     * no protocol has one. */
    if (h->csum_start < hdr_min || (h->csum_offset & 1) || at + 2 > len)
        return DP_ST_DROP_MALFORMED;
    c = (uint16_t)~dp_packet_fold(dp_packet_sum(p + h->csum_start, len - h->csum_start));
    /* 0 would mean "no checksum" to UDP; -0 is the same sum for TCP. */
    dp_wr16(p + at, c ? c : 0xffff);
    return 0;
}

/* ---- 4. a super-packet --------------------------------------------------------- */

/* The IP header of a super-packet: its length (20 for IPv4 without
 * options, which is all the TUN hands us, 40 for IPv6) and the protocol
 * its gso_type means, or 0 with *reason set. IPv6 must carry TCP/UDP right
 * after its fixed header: the kernel's GSO of an IPv6 packet with extension
 * headers is not something a TUN without them is handed. */
static uint32_t ip_header(const uint8_t *p, uint32_t len, uint32_t type, uint8_t *proto,
                          int *reason)
{
    uint32_t iphl;
    int v6 = (p[0] >> 4) == 6;

    *reason = DP_ST_DROP_MALFORMED;
    if ((p[0] >> 4) != 4 && !v6) {
        *reason = DP_ST_DROP_NOT_IPV4;         /* "neither 4 nor 6", as when read plain */
        return 0;
    }
    if (type == (v6 ? DP_VNET_GSO_TCPV6 : DP_VNET_GSO_TCPV4))
        *proto = DP_IP_PROTO_TCP;
    else if (type == DP_VNET_GSO_UDP_L4)
        *proto = DP_IP_PROTO_UDP;
    else
        return 0;        /* unknown, the other family's TCP, UFO, ECN unasked */
    if (v6) {
        iphl = DP_IP6_HDR;
        if (len < iphl || dp_rd16(p + DP_IP6_PLEN_OFF) + iphl != len ||
            p[DP_IP6_NH_OFF] != *proto)
            return 0;
    } else {
        iphl = (p[0] & 0x0fu) * 4u;
        if (iphl < DP_IP_HDR_MIN || iphl > len || dp_rd16(p + 2) != len || p[9] != *proto ||
            (dp_rd16(p + 6) & (IP_MF | DP_IP_FRAG_OFFSET_MASK)))
            return 0;
    }
    return iphl;
}

int dp_gso_start(struct dp_gso *g, const uint8_t *p, uint32_t len,
                 const struct dp_vnet_hdr *h, uint32_t mtu)
{
    uint32_t iphl, l4hl;
    uint8_t proto = 0;
    int reason;

    memset(g, 0, sizeof(*g));
    if (len < DP_IP_HDR_MIN)
        return DP_ST_DROP_MALFORMED;
    iphl = ip_header(p, len, h->gso_type, &proto, &reason);
    if (!iphl)
        return reason;
    if (proto == DP_IP_PROTO_TCP) {
        if (len < iphl + DP_TCP_HDR_MIN)
            return DP_ST_DROP_MALFORMED;
        l4hl = (p[iphl + 12] >> 4) * 4u;
        if (l4hl < DP_TCP_HDR_MIN || iphl + l4hl > len)
            return DP_ST_DROP_MALFORMED;
    } else {
        l4hl = DP_UDP_HDR;
        if (len < iphl + l4hl)
            return DP_ST_DROP_MALFORMED;
    }
    /* The checksum the kernel asked for must be the one of this header. */
    if ((h->flags & DP_VNET_F_NEEDS_CSUM) &&
        (h->csum_start != iphl ||
         h->csum_offset != (proto == DP_IP_PROTO_TCP ? DP_TCP_CSUM_OFF : DP_UDP_CSUM_OFF)))
        return DP_ST_DROP_MALFORMED;
    if (h->gso_size == 0 || iphl + l4hl + h->gso_size > mtu)
        return DP_ST_DROP_MALFORMED;

    g->pkt = p;
    g->len = len;
    g->iphl = iphl;
    g->hlen = iphl + l4hl;
    g->mss = h->gso_size;
    g->off = g->hlen;
    g->proto = proto;
    return 0;
}

/* ---- 5. segments --------------------------------------------------------------- */

uint32_t dp_gso_next(struct dp_gso *g, uint8_t *out)
{
    const uint8_t *p = g->pkt;
    uint32_t iphl = g->iphl, hlen = g->hlen;
    uint32_t n, seglen, l4len;
    uint64_t pseudo;
    uint8_t *l4 = out + iphl;
    uint16_t c;
    int first = g->idx == 0, last;

    if (g->done)
        return 0;
    n = g->len - g->off;
    if (n > g->mss)
        n = g->mss;
    last = g->off + n >= g->len;
    seglen = hlen + n;
    l4len = seglen - iphl;

    memcpy(out, p, hlen);
    memcpy(out + hlen, p + g->off, n);

    if ((p[0] >> 4) == 6) {
        /* No id, no header checksum: only the payload length changes. (By
         * the version, not iphl: an IPv4 header with options is 40 bytes too.) */
        dp_wr16(out + DP_IP6_PLEN_OFF, (uint16_t)l4len);
    } else {
        dp_wr16(out + 2, (uint16_t)seglen);
        dp_wr16(out + 4, (uint16_t)(dp_rd16(p + 4) + g->idx));
        dp_wr16(out + 10, 0);
        dp_wr16(out + 10, dp_packet_csum(out, iphl));
    }
    pseudo = dp_packet_pseudo_any(out, g->proto, l4len);

    if (g->proto == DP_IP_PROTO_TCP) {
        dp_wr32(l4 + 4, dp_rd32(p + iphl + 4) + (g->off - hlen));
        if (!last)
            l4[13] &= (uint8_t)~(DP_TCP_FIN | DP_TCP_PSH);
        if (!first)
            l4[13] &= (uint8_t)~DP_TCP_CWR;
        dp_wr16(l4 + DP_TCP_CSUM_OFF, 0);
        c = (uint16_t)~dp_packet_fold(pseudo + dp_packet_sum(l4, hlen - iphl) +
                                      dp_packet_sum(out + hlen, n));
        dp_wr16(l4 + DP_TCP_CSUM_OFF, c);
    } else {
        dp_wr16(l4 + 4, (uint16_t)l4len);
        dp_wr16(l4 + DP_UDP_CSUM_OFF, 0);
        c = (uint16_t)~dp_packet_fold(pseudo + dp_packet_sum(l4, DP_UDP_HDR) +
                                      dp_packet_sum(out + hlen, n));
        dp_wr16(l4 + DP_UDP_CSUM_OFF, c ? c : 0xffff);
    }
    g->off += n;
    g->idx++;
    /* A super-packet with no payload is still one packet (a bare ACK). */
    g->done = last;
    return seglen;
}

/* ---- 6. where a read lands --------------------------------------------------------- */

void dp_gso_scatter(uint8_t *hdr, uint8_t *slot, uint8_t *big, uint32_t mtu,
                    struct iovec iov[3])
{
    /* One readv: a plain packet needs no copy (it is in its send slot, as a
     * plain read(mtu) puts it), and a super-packet only its first mtu bytes. */
    iov[0].iov_base = hdr;
    iov[0].iov_len = DP_VNET_HDR_LEN;
    iov[1].iov_base = slot;
    iov[1].iov_len = mtu;
    iov[2].iov_base = big + mtu;
    iov[2].iov_len = DP_VNET_PKT_MAX - mtu;
}

int dp_gso_read(const uint8_t *hdr, uint32_t r, uint8_t *slot, uint8_t *big, uint32_t mtu,
                struct dp_vnet_hdr *h, uint8_t **pkt, uint32_t *len)
{
    uint32_t n;

    *pkt = slot;
    *len = 0;
    if (r < DP_VNET_HDR_LEN)
        return DP_ST_DROP_MALFORMED;
    n = r - DP_VNET_HDR_LEN;
    dp_gso_hdr_parse(hdr, h);
    if (h->gso_type == DP_VNET_GSO_NONE) {
        /* What a plain read(mtu) would have returned. */
        *len = n < mtu ? n : mtu;
        return 0;
    }
    memcpy(big, slot, n < mtu ? n : mtu);
    *pkt = big;
    *len = n;
    return 0;
}
