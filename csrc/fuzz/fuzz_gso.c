/*
 * fuzz_gso.c - libFuzzer target for gso.c: arbitrary virtio_net_hdr +
 * packet, as a TUN with IFF_VNET_HDR would hand them to the engine.
 *
 * Input: mtu (2 bytes big-endian, clamped to DP_MTU_MIN..), the 10-byte
 * header (host order, as the TUN writes it), then the packet (at most
 * 65535 bytes), copied into a buffer of exactly its length so that ASan
 * sees any read past it. Checked:
 *
 *   - gso_type NONE with NEEDS_CSUM: dp_gso_csum either refuses (range not
 *     inside the packet) or leaves a range that sums, with the pseudo-header
 *     sum the field held, to -0 (the checksum verifies);
 *   - a super-packet dp_gso_start accepts is cut into max(1, ceil(payload /
 *     gso_size)) segments, each a well-formed packet <= mtu of the
 *     original's family (IPv4: tot_len == its length, a valid IP checksum;
 *     IPv6: payload length + 40 == its length) with a valid TCP/UDP
 *     checksum over its family's pseudo-header, each header equal to the
 *     original's but for the fields GSO rewrites, and the payloads together
 *     are the original's;
 *   - the read itself, as tx.c makes it: the header and packet scattered
 *     over dp_gso_scatter's iovecs (the slot exactly mtu bytes, so ASan sees
 *     a read past it), then dp_gso_read finds the packet the TUN handed
 *     over - a plain one in the slot cut at mtu, a super-packet whole in the
 *     big buffer - and refuses a read shorter than the header.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "fuzz.h"


static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

/* Byte-by-byte RFC 1071 sum of the pseudo-header (RFC 791's or RFC
 * 8200's: the addresses, the protocol and the L4 length) and the L4 bytes. */
static int l4_csum_ok(const uint8_t *ip, uint32_t len)
{
    int v6 = (ip[0] >> 4) == 6;
    uint32_t ihl = v6 ? 40 : (ip[0] & 15) * 4u, i, s = 0;

    for (i = v6 ? 8 : 12; i < (v6 ? 40u : 20u); i += 2)
        s += rd16(ip + i);
    s += (v6 ? ip[6] : ip[9]) + (len - ihl);
    for (i = ihl; i + 1 < len; i += 2)
        s += rd16(ip + i);
    if ((len - ihl) & 1)
        s += (uint32_t)ip[len - 1] << 8;
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return s == 0xffff;
}

static void check_segments(const uint8_t *p, uint32_t len, const struct dp_vnet_hdr *h,
                           uint32_t mtu)
{
    static uint8_t out[65536];
    struct dp_gso g;
    uint32_t seg, n = 0, at, payload, want, ihl, hlen;
    uint8_t proto;
    int v6;

    if (dp_gso_start(&g, p, len, h, mtu))
        return;
    ihl = g.iphl;
    hlen = g.hlen;
    v6 = (p[0] >> 4) == 6;
    proto = v6 ? p[6] : p[9];
    CHECK(ihl == (v6 ? 40u : (p[0] & 15) * 4u));
    payload = len - hlen;
    want = payload ? (payload + h->gso_size - 1) / h->gso_size : 1;
    at = hlen;
    while ((seg = dp_gso_next(&g, out)) != 0) {
        CHECK(seg <= mtu && seg >= hlen);
        CHECK(l4_csum_ok(out, seg));
        if (v6) {
            /* Only the payload length changes: IPv6 has no id, no checksum. */
            CHECK(rd16(out + 4) == seg - 40 && !memcmp(out, p, 4) && !memcmp(out + 6, p + 6, 34));
        } else {
            CHECK(rd16(out + 2) == seg && (out[0] >> 4) == 4 && (out[0] & 15) * 4u == ihl);
            CHECK(dp_packet_csum(out, ihl) == 0);
            CHECK(rd16(out + 4) == (uint16_t)(rd16(p + 4) + n));
            /* Unchanged: IP but tot_len, id and checksum; ports; TCP ack,
             * doff, window, urgent and options (flags are checked below). */
            CHECK(out[0] == p[0] && out[1] == p[1] && !memcmp(out + 6, p + 6, 4) &&
                  !memcmp(out + 12, p + 12, ihl - 12));
        }
        CHECK(!memcmp(out + ihl, p + ihl, 4));
        if (proto == 6) {
            uint8_t f = p[ihl + 13], keep = 0xff;

            if (at + (seg - hlen) < len)
                keep &= (uint8_t)~0x09;          /* FIN, PSH: last only */
            if (n)
                keep &= (uint8_t)~0x80;          /* CWR: first only */
            CHECK(out[ihl + 13] == (f & keep));
            CHECK(((uint32_t)rd16(out + ihl + 4) << 16 | rd16(out + ihl + 6)) ==
                  ((uint32_t)rd16(p + ihl + 4) << 16 | rd16(p + ihl + 6)) + (at - hlen));
            CHECK(!memcmp(out + ihl + 8, p + ihl + 8, 5) &&
                  !memcmp(out + ihl + 14, p + ihl + 14, 2) &&
                  !memcmp(out + ihl + 18, p + ihl + 18, hlen - ihl - 18));
        } else {
            CHECK(rd16(out + ihl + 4) == seg - ihl);
            CHECK(rd16(out + ihl + 6) != 0);
        }
        CHECK(at + (seg - hlen) <= len && !memcmp(out + hlen, p + at, seg - hlen));
        at += seg - hlen;
        n++;
        CHECK(n <= want);
    }
    CHECK(n == want && at == len);
}

/* A readv of the r bytes `in` (header, then packet) as tx.c makes it. */
static void check_read(const uint8_t *in, uint32_t r, uint32_t mtu)
{
    static uint8_t big[DP_VNET_PKT_MAX];
    uint8_t hdr[DP_VNET_HDR_LEN], *slot = malloc(mtu), *pkt;
    struct dp_vnet_hdr h, want;
    struct iovec iov[3];
    uint32_t i, at = 0, n, len, plen;
    int reason;

    CHECK(slot);
    dp_gso_scatter(hdr, slot, big, mtu, iov);
    CHECK(iov[0].iov_len == DP_VNET_HDR_LEN && iov[1].iov_len == mtu &&
          iov[1].iov_len + iov[2].iov_len == DP_VNET_PKT_MAX);
    for (i = 0; i < 3 && at < r; i++) {
        n = r - at < iov[i].iov_len ? r - at : (uint32_t)iov[i].iov_len;
        memcpy(iov[i].iov_base, in + at, n);
        at += n;
    }
    CHECK(at == r);
    reason = dp_gso_read(hdr, r, slot, big, mtu, &h, &pkt, &len);
    if (r < DP_VNET_HDR_LEN) {
        CHECK(reason == DP_ST_DROP_MALFORMED && pkt == slot && len == 0);
    } else {
        CHECK(reason == 0);
        dp_gso_hdr_parse(in, &want);
        CHECK(h.flags == want.flags && h.gso_type == want.gso_type &&
              h.hdr_len == want.hdr_len && h.gso_size == want.gso_size &&
              h.csum_start == want.csum_start && h.csum_offset == want.csum_offset);
        plen = r - DP_VNET_HDR_LEN;
        if (h.gso_type == DP_VNET_GSO_NONE)
            CHECK(pkt == slot && len == (plen < mtu ? plen : mtu));
        else
            CHECK(pkt == big && len == plen);
        CHECK(!memcmp(pkt, in + DP_VNET_HDR_LEN, len));
    }
    free(slot);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dp_vnet_hdr h;
    uint32_t mtu, len;
    uint8_t *p;

    if (size < 2)
        return 0;
    mtu = rd16(data);
    if (mtu < DP_MTU_MIN)
        mtu = DP_MTU_MIN;
    len = (uint32_t)(size - 2);
    check_read(data + 2, len < DP_VNET_HDR_LEN + DP_VNET_PKT_MAX ? len :
               DP_VNET_HDR_LEN + DP_VNET_PKT_MAX, mtu);
    if (size < 2 + DP_VNET_HDR_LEN)
        return 0;
    dp_gso_hdr_parse(data + 2, &h);
    len = (uint32_t)(size - 2 - DP_VNET_HDR_LEN);
    if (len > DP_VNET_PKT_MAX)
        len = DP_VNET_PKT_MAX;
    p = malloc(len ? len : 1);
    if (!p)
        return 0;
    memcpy(p, data + 2 + DP_VNET_HDR_LEN, len);
    if (h.gso_type == DP_VNET_GSO_NONE) {
        uint32_t at = (uint32_t)h.csum_start + h.csum_offset, pseudo = 0, s;

        if (at + 2 <= len)
            pseudo = rd16(p + at);      /* the kernel's pseudo-header sum */
        if (dp_gso_csum(p, len, &h) == 0 && (h.flags & 1) && len >= 20 &&
            ((p[0] >> 4) == 4 || (p[0] >> 4) == 6)) {
            /* the range now sums, with the pseudo-header, to -0 */
            s = (~dp_packet_csum(p + h.csum_start, len - h.csum_start) & 0xffffu) + pseudo;
            s = (s & 0xffff) + (s >> 16);
            CHECK(s == 0xffff);
        }
    } else {
        check_segments(p, len, &h, mtu);
    }
    free(p);
    return 0;
}
