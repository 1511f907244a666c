/*
 * gro.c - TUN GRO: consecutive TCP segments of one flow (DP_OFF_TUN_GRO),
 * and consecutive UDP datagrams of one flow (DP_OFF_TUN_GRO_UDP), IPv4 or
 * IPv6, become one GSO packet for the TUN; pure, no I/O.
 *
 * Flow, in the order the functions appear:
 *   1. (checksums: packet.c's dp_packet_sum/fold/pseudo)
 *   2. candidate          may this packet take part in a run at all?
 *   3. dp_gro_start/join  open a run / append to it (the rules below)
 *   4. dp_gro_headers     the virtio_net_hdr and the coalesced IP + TCP header
 *   5. dp_gro_iov         the iovecs of the run's one writev (rx.c writes it)
 *
 * A run only holds pointers to packets the caller keeps (slots of one
 * recvmmsg batch), already forwarded by dp_path_udp (TTL - 1 done). rx.c
 * writes it with writev: vnet header, the coalesced headers, then each
 * segment's payload in arrival order. The kernel gets one GSO packet whose
 * segmentation (or local delivery) gives back exactly the segments we were
 * sent, so the rules err on the side of not merging:
 *
 *   - IPv4 with ihl 5 (no IP options), proto TCP, not a fragment (MF and
 *     offset zero; DF is allowed), TCP header within the packet; or IPv6
 *     with TCP right after the fixed header (an extension header, a
 *     fragment's included, keeps a packet out of runs);
 *   - TCP flags ACK only, or ACK|PSH; PSH ends the run (the kernel's GRO
 *     does the same: data the sender pushed goes up at once), and every
 *     other flag (SYN, FIN, RST, URG, ECE, CWR, the reserved bits) keeps a
 *     packet out of runs, as does an empty payload (pure ACKs);
 *   - a valid TCP checksum: a NEEDS_CSUM packet is not verified by the
 *     kernel, so a segment that would have been dropped for its checksum
 *     must not ride along in a run - it is written alone and the kernel
 *     drops it as it would have;
 *   - the same family as the first segment, and the same: src, dst, tos,
 *     ttl, DF (IPv6: bytes 0-3, i.e. class and flow label, and hop limit),
 *     ports, ack,
 *     window, urgent pointer, TCP header length and the options bytes
 *     (timestamps included: a new TSval ends the run);
 *   - IPv4 id: the first's + i (what GSO will give them), or DF set (an
 *     atomic datagram's id means nothing, RFC 6864); IPv6 has none;
 *   - seq contiguous (exactly where the previous segment ended);
 *   - payload equal to the first's; a shorter one may join but ends the
 *     run; a larger one cannot join;
 *   - at most DP_GRO_SEGS_MAX segments and DP_GRO_BYTES_MAX bytes in all.
 *
 * UDP runs (only where the TUN takes VIRTIO_NET_HDR_GSO_UDP_L4, Linux 6.2 on:
 * the kernel then splits the run where TCP would, at the socket or on the
 * way out of a bridge) follow the same rules where they apply: IPv4 with
 * ihl 5, not a fragment, or IPv6 with UDP right after the fixed header,
 * UDP length == what the packet holds, a payload, a valid checksum that is
 * not 0 (a datagram sent without one would get one), same IP fields as
 * above, ports, IPv4 ids first + i unless DF, payload equal to the first's
 * (a shorter one ends the run). Without the 6.2 kernel every datagram is
 * one write, as before.
 *
 * The coalesced packet is what the kernel's own GRO makes: TCPV4 or TCPV6
 * (or UDP_L4 for either family), csum_start the IP header's length, the
 * IPv4 tot_len and header checksum or the IPv6 payload length of the whole.
 *
 * Anything else is not held: the caller flushes the run and writes the
 * packet alone, so packets never change order.
 */
#include <string.h>

#include "internal.h"

/* ---- 2. candidates ------------------------------------------------------------ */

struct seg_info {
    uint32_t iphl;       /* 20 (IPv4 ihl 5) or 40 (IPv6 with no extension header) */
    uint32_t l4hl;       /* TCP header bytes, or the UDP header's 8 */
    uint32_t payload;    /* TCP or UDP payload bytes, > 0 */
    int psh;
};

/* Whether p (a packet dp_path_udp forwarded: IPv4 with tot_len == len, or
 * IPv6 with payload length + 40 == len) may take part in a run, as far as
 * its headers say; its protocol, or 0. The checksum is left to l4_csum_ok,
 * the one pass over the payload: the callers ask for it last, once every
 * cheaper rule has passed, so a packet that ends one run and opens the
 * next is summed once. */
static uint8_t candidate(const uint8_t *p, uint32_t len, int udp_ok, struct seg_info *si)
{
    const uint8_t *l4;
    uint32_t l4len;
    uint8_t flags, proto;

    if (len < DP_IP_HDR_MIN + DP_UDP_HDR)
        return 0;
    if (p[0] == 0x45) {
        if ((dp_rd16(p + 6) & ~(uint16_t)(DP_IP_FLAG_DF << 8)) != 0)   /* MF or an offset */
            return 0;
        si->iphl = DP_IP_HDR_MIN;
        proto = p[9];
    } else if ((p[0] >> 4) == 6 && len >= DP_IP6_HDR + DP_UDP_HDR) {
        /* An extension header (a fragment's included) keeps it out. */
        si->iphl = DP_IP6_HDR;
        proto = p[DP_IP6_NH_OFF];
    } else {
        return 0;
    }
    l4 = p + si->iphl;
    l4len = len - si->iphl;
    si->psh = 0;
    if (proto == DP_IP_PROTO_UDP && udp_ok) {
        if (dp_rd16(l4 + 4) != l4len || l4len == DP_UDP_HDR || dp_rd16(l4 + 6) == 0)
            return 0;
        si->l4hl = DP_UDP_HDR;
    } else if (proto == DP_IP_PROTO_TCP && l4len >= DP_TCP_HDR_MIN) {
        si->l4hl = (uint32_t)(l4[12] >> 4) * 4;
        if (si->l4hl < DP_TCP_HDR_MIN || si->l4hl >= l4len)   /* no payload */
            return 0;
        flags = l4[13];
        if ((l4[12] & 0x0f) || (flags & ~DP_TCP_PSH) != DP_TCP_ACK)
            return 0;
        si->psh = (flags & DP_TCP_PSH) != 0;
    } else {
        return 0;
    }
    si->payload = l4len - si->l4hl;
    return proto;
}

/* The TCP/UDP checksum of a candidate (iphl bytes of IP header) is valid. */
static int l4_csum_ok(const uint8_t *p, uint32_t len, uint32_t iphl, uint8_t proto)
{
    uint32_t l4len = len - iphl;

    return dp_packet_fold(dp_packet_pseudo_any(p, proto, l4len) +
                          dp_packet_sum(p + iphl, l4len)) == 0xffff;
}

/* The IP headers of p and the run's first f (both candidates of one
 * family) match where every segment of one GSO packet must: IPv4's tos,
 * flags (DF), ttl, src and dst, the id just below; IPv6's version, class
 * and flow label (bytes 0-3), hop limit, src and dst. */
static int same_ip(const struct dp_gro *g, const uint8_t *p, const uint8_t *f)
{
    if (g->iphl == DP_IP6_HDR)
        return !memcmp(p, f, 4) && p[DP_IP6_HOP_OFF] == f[DP_IP6_HOP_OFF] &&
               !memcmp(p + DP_IP6_SRC_OFF, f + DP_IP6_SRC_OFF, 2 * DP_IP6_ADDR);
    if (p[1] != f[1] || p[6] != f[6] || p[8] != f[8] || memcmp(p + 12, f + 12, 8))
        return 0;
    return (p[6] & DP_IP_FLAG_DF) || dp_rd16(p + 4) == (uint16_t)(dp_rd16(f + 4) + g->n);
}

/* ---- 3. runs ------------------------------------------------------------------ */

void dp_gro_reset(struct dp_gro *g)
{
    g->n = 0;
}

int dp_gro_start(struct dp_gro *g, const uint8_t *p, uint32_t len)
{
    struct seg_info si;
    uint8_t proto;

    g->n = 0;
    proto = candidate(p, len, g->udp, &si);
    /* A pushed first segment would end its own run: nothing to gain. */
    if (!proto || si.psh || !l4_csum_ok(p, len, si.iphl, proto))
        return 0;
    g->seg[0] = p;
    g->len[0] = len;
    g->n = 1;
    g->proto = proto;
    g->iphl = si.iphl;
    g->hdr_len = si.iphl + si.l4hl;
    g->gso_size = si.payload;
    g->total = len;
    g->next_seq = proto == DP_IP_PROTO_TCP ? dp_rd32(p + si.iphl + 4) + si.payload : 0;
    g->closed = 0;
    g->psh = 0;
    return 1;
}

int dp_gro_join(struct dp_gro *g, const uint8_t *p, uint32_t len)
{
    const uint8_t *f, *th, *fth;
    struct seg_info si;

    if (!g->n || g->closed || g->n >= DP_GRO_SEGS_MAX)
        return 0;
    f = g->seg[0];
    if (candidate(p, len, g->udp, &si) != g->proto || si.iphl != g->iphl ||
        si.iphl + si.l4hl != g->hdr_len)
        return 0;
    if (si.payload > g->gso_size || g->total + si.payload > DP_GRO_BYTES_MAX)
        return 0;
    if (!same_ip(g, p, f))
        return 0;
    fth = f + g->iphl;
    th = p + g->iphl;
    if (memcmp(th, fth, 4))                                   /* ports */
        return 0;
    /* TCP: ack, doff, flags (ACK, maybe PSH: checked above), window, and
     * past the checksum the urgent pointer and the options. */
    if (g->proto == DP_IP_PROTO_TCP &&
        (dp_rd32(th + 4) != g->next_seq || memcmp(th + 8, fth + 8, 5) ||
         memcmp(th + 14, fth + 14, 2) || memcmp(th + 18, fth + 18, si.l4hl - 18)))
        return 0;
    if (!l4_csum_ok(p, len, g->iphl, g->proto))
        return 0;
    g->seg[g->n] = p;
    g->len[g->n] = len;
    g->n++;
    g->total += si.payload;
    g->next_seq += si.payload;
    g->psh = si.psh;
    g->closed = si.psh || si.payload < g->gso_size;
    return 1;
}

/* ---- 4. the coalesced packet's headers ------------------------------------------ */

void dp_gro_headers(const struct dp_gro *g, uint8_t *vnet, uint8_t *hdr)
{
    uint16_t v[4];
    uint32_t iphl = g->iphl, l4len = g->total - iphl;
    int tcp = g->proto == DP_IP_PROTO_TCP;
    uint32_t csum_at = tcp ? DP_TCP_CSUM_OFF : DP_UDP_CSUM_OFF;

    memcpy(hdr, g->seg[0], g->hdr_len);
    if (iphl == DP_IP6_HDR) {
        dp_wr16(hdr + DP_IP6_PLEN_OFF, (uint16_t)l4len);
    } else {
        dp_wr16(hdr + 2, (uint16_t)g->total);
        dp_wr16(hdr + 10, 0);
        dp_wr16(hdr + 10, dp_packet_csum(hdr, DP_IP_HDR_MIN));
    }
    if (tcp && g->psh)
        hdr[iphl + 13] |= DP_TCP_PSH;
    if (!tcp)
        dp_wr16(hdr + iphl + 4, (uint16_t)l4len);      /* the run's UDP length */
    /* NEEDS_CSUM: the kernel sums from csum_start to the end and stores the
     * result at csum_start + csum_offset, starting from what is there: the
     * pseudo-header sum, folded, not inverted (as the stack's own
     * CHECKSUM_PARTIAL packets carry it). */
    dp_wr16(hdr + iphl + csum_at, dp_packet_fold(dp_packet_pseudo_any(hdr, g->proto, l4len)));

    /* struct virtio_net_hdr: flags, gso_type, then four u16 in the TUN's
     * vnet byte order, which is the host's unless TUNSETVNETBE/LE changed it. */
    vnet[0] = DP_VNET_F_NEEDS_CSUM;
    vnet[1] = !tcp ? DP_VNET_GSO_UDP_L4 : iphl == DP_IP6_HDR ? DP_VNET_GSO_TCPV6
                                                             : DP_VNET_GSO_TCPV4;
    v[0] = (uint16_t)g->hdr_len;                 /* hdr_len */
    v[1] = (uint16_t)g->gso_size;                /* gso_size */
    v[2] = (uint16_t)iphl;                       /* csum_start */
    v[3] = (uint16_t)csum_at;                    /* csum_offset */
    memcpy(vnet + 2, v, sizeof(v));
}

/* ---- 5. the writev ----------------------------------------------------------------- */

uint32_t dp_gro_iov(const struct dp_gro *g, uint8_t *vnet, uint8_t *hdr, struct iovec *iov)
{
    uint32_t i;

    iov[0].iov_base = vnet;
    iov[0].iov_len = DP_VNET_HDR_LEN;
    iov[1].iov_base = hdr;
    iov[1].iov_len = g->hdr_len;
    /* Each segment without its headers: hdr stands for all of them. */
    for (i = 0; i < g->n; i++) {
        iov[i + 2].iov_base = (void *)(g->seg[i] + g->hdr_len);
        iov[i + 2].iov_len = g->len[i] - g->hdr_len;
    }
    return g->n + 2;
}
