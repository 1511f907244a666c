/*
 * check_gro.h - TUN GRO (gro.c) over the forwarded UDP-side packets of
 * fuzz_packet.c, as rx.c drives it: join the run, else flush it and maybe
 * start a new one. The run's packets are copies of exactly their length
 * (ASan sees any read past them), owned here until the flush. A flushed
 * run of >= 2 must describe a GSO packet whose segments are these packets:
 * one flow of gso_size segments (the last may be shorter) within 64 KB,
 * the headers built for it carrying its length (and IPv4's a valid IP
 * checksum), the virtio header its family's, its writev's iovecs those
 * headers and every payload in order; a run never mixes the families.
 */
#ifndef DP_CHECK_GRO_H
#define DP_CHECK_GRO_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "internal.h"
#include "fuzz.h"
#include "oracle_packet.h"

struct gro_check {
    struct dp_gro gro;
    uint8_t *own[DP_GRO_SEGS_MAX];
};

static inline void gro_flush(struct gro_check *gc)
{
    struct dp_gro *g = &gc->gro;
    uint8_t vnet[DP_VNET_HDR_LEN], hdr[DP_GRO_HDR_MAX];
    struct iovec iov[DP_GRO_SEGS_MAX + 2];
    uint32_t i, n, total, ip = g->iphl;
    /* Where the addresses are, and the family's TCP GSO type. */
    uint32_t addr = ip == 40 ? 8 : 12, addr_len = ip == 40 ? 32 : 8;
    uint16_t v[4];

    for (i = 0; i < g->n; i++)   /* one family: IPv4 ihl 5, or IPv6 with TCP/UDP next */
        CHECK(ip == 20 ? g->seg[i][0] == 0x45 && g->seg[i][9] == g->proto
                       : ip == 40 && g->seg[i][0] >> 4 == 6 && g->seg[i][6] == g->proto);
    if (g->n > 1) {
        CHECK(g->n <= DP_GRO_SEGS_MAX && g->hdr_len <= DP_GRO_HDR_MAX);
        total = g->hdr_len;
        for (i = 0; i < g->n; i++) {
            uint32_t pl = g->len[i] - g->hdr_len;

            CHECK(g->len[i] > g->hdr_len && pl <= g->gso_size);
            CHECK(pl == g->gso_size || i == g->n - 1);
            CHECK(memcmp(g->seg[i] + addr, g->seg[0] + addr, addr_len) == 0);   /* one flow */
            total += pl;
        }
        CHECK(total == g->total && total <= DP_GRO_BYTES_MAX);
        dp_gro_headers(g, vnet, hdr);
        /* The writev rx.c makes: the headers, then every payload in order,
         * the coalesced packet's length in all. */
        CHECK(dp_gro_iov(g, vnet, hdr, iov) == g->n + 2);
        CHECK(iov[0].iov_base == vnet && iov[0].iov_len == DP_VNET_HDR_LEN &&
              iov[1].iov_base == hdr && iov[1].iov_len == g->hdr_len);
        for (i = 0, n = g->hdr_len; i < g->n; i++) {
            CHECK(iov[i + 2].iov_base == g->seg[i] + g->hdr_len);
            n += (uint32_t)iov[i + 2].iov_len;
        }
        CHECK(n == g->total);
        memcpy(v, vnet + 2, sizeof(v));
        if (g->proto == 6) {   /* TCPV4 or TCPV6 */
            CHECK(vnet[0] == 1 && vnet[1] == (ip == 40 ? 4 : 1) && v[0] == g->hdr_len &&
                  v[1] == g->gso_size && v[2] == ip && v[3] == 16);
        } else {   /* UDP runs: VIRTIO_NET_HDR_GSO_UDP_L4, the run's UDP length */
            CHECK(g->udp && g->proto == 17 && g->hdr_len == ip + 8);
            CHECK(vnet[0] == 1 && vnet[1] == 5 && v[0] == ip + 8 && v[1] == g->gso_size &&
                  v[2] == ip && v[3] == 6 && rd16(hdr + ip + 4) == total - ip);
            for (i = 0; i < g->n; i++)   /* one flow: the same ports */
                CHECK(memcmp(g->seg[i] + ip, g->seg[0] + ip, 4) == 0);
        }
        if (ip == 40)
            CHECK(rd16(hdr + 4) == total - 40);
        else
            CHECK(rd16(hdr + 2) == total && csum(hdr, 20) == 0);
    }
    for (i = 0; i < g->n; i++)
        free(gc->own[i]);
    dp_gro_reset(g);
}

static inline void gro_add(struct gro_check *gc, const uint8_t *pkt, uint32_t len)
{
    struct dp_gro *g = &gc->gro;
    uint8_t *c = malloc(len ? len : 1);

    CHECK(c);
    memcpy(c, pkt, len);
    if (dp_gro_join(g, c, len)) {
        gc->own[g->n - 1] = c;
        return;
    }
    gro_flush(gc);
    if (dp_gro_start(g, c, len))
        gc->own[0] = c;
    else
        free(c);
}

#endif
