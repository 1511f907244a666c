/*
 * oracle_packet.h - fuzz_packet.c's oracles of what leaves the packet path:
 * a forwarded packet of either family (well-formed, only TTL or hop limit
 * - 1 and IPv4's checksum changed), the link scope, and the ICMP and ICMPv6
 * errors (well-formed, valid checksums, the right quote, and for ICMPv6
 * exactly when RFC 4443's rules allow one). Each is written the slow,
 * obvious way, apart from the engine's packet.c and packet6.c.
 */
#ifndef DP_ORACLE_PACKET_H
#define DP_ORACLE_PACKET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "fuzz.h"

static inline uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

/* RFC 1071 the slow, obvious way: the oracle for packet.c's vector sum. */
static inline uint16_t ref_csum(const uint8_t *p, size_t len)
{
    uint64_t s = 0;
    size_t i;

    for (i = 0; i + 1 < len; i += 2)
        s += rd16(p + i);
    if (len & 1)
        s += (uint32_t)p[len - 1] << 8;
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return (uint16_t)(~s & 0xffff);
}

static inline uint16_t csum(const uint8_t *p, size_t len)
{
    uint16_t c = dp_packet_csum(p, len);

    CHECK(c == ref_csum(p, len));
    return c;
}

static inline int well_formed(const uint8_t *p, uint32_t len, uint32_t mtu)
{
    return len >= 20 && len <= mtu && (p[0] >> 4) == 4 && (p[0] & 15) >= 5 &&
           (uint32_t)(p[0] & 15) * 4 <= len && rd16(p + 2) == len;
}

static inline int well_formed6(const uint8_t *p, uint32_t len, uint32_t mtu)
{
    return len >= 40 && len <= mtu && (p[0] >> 4) == 6 && (uint32_t)rd16(p + 4) + 40 == len;
}

/* dataplane.h's link scope, read the long way round. */
static inline int naive_scope6(const uint8_t *p)
{
    static const uint8_t zero[16];
    const uint8_t *src = p + 8, *dst = p + 24;
    unsigned src10 = (unsigned)src[0] << 2 | src[1] >> 6;
    unsigned dst10 = (unsigned)dst[0] << 2 | dst[1] >> 6;

    return src10 == 0x3fa || dst10 == 0x3fa || memcmp(dst, zero, 16) == 0 ||
           (dst[0] == 0xff && (dst[1] & 15) < 3);
}

static inline int later_fragment(const uint8_t *p)
{
    return (rd16(p + 6) & 0x1fff) != 0;
}

/* A forwarded IPv6 packet: only the hop limit, by - 1. */
static inline void check_forwarded6(const uint8_t *in, const uint8_t *out, uint32_t len,
                                    uint32_t mtu)
{
    CHECK(well_formed6(out, len, mtu) && !naive_scope6(in));
    CHECK(in[7] >= 2 && out[7] == in[7] - 1);
    CHECK(memcmp(in, out, 7) == 0 && memcmp(in + 8, out + 8, len - 8) == 0);
}

/* A forwarded packet: only TTL - 1 and the checksum changed, and a valid
 * checksum stayed valid. */
static inline void check_forwarded(const uint8_t *in, const uint8_t *out, uint32_t len,
                                   uint32_t mtu)
{
    uint32_t hl = (uint32_t)(in[0] & 15) * 4;

    CHECK(well_formed(out, len, mtu));
    CHECK(in[8] >= 2 && out[8] == in[8] - 1);
    CHECK(memcmp(in, out, 8) == 0 && in[9] == out[9]);
    CHECK(memcmp(in + 12, out + 12, len - 12) == 0);
    if (csum(in, hl) == 0)
        CHECK(csum(out, hl) == 0);
}

/* RFC 4443 2.4 e as dataplane.h words it, walked the long way: may an
 * ICMPv6 error be sent about this well-formed packet? */
static inline int naive_may_error6(const uint8_t *p, uint32_t len)
{
    static const uint8_t zero[16];
    uint32_t off = 40, hops = 0;
    uint8_t nh = p[6];

    if (p[24] == 0xff || p[8] == 0xff || memcmp(p + 8, zero, 16) == 0)
        return 0;
    for (;;) {
        uint32_t size;

        if (nh == 0 || nh == 43 || nh == 60 || nh == 135 || nh == 139 || nh == 140)
            size = 8u * (1u + (off + 1 < len ? p[off + 1] : 0));
        else if (nh == 51)
            size = 4u * (2u + (off + 1 < len ? p[off + 1] : 0));
        else if (nh == 44)
            size = 8;
        else
            break;
        if (++hops > 8 || off + 8 > len)
            return 0;
        if (nh == 44 && ((p[off + 2] << 5) | (p[off + 3] >> 3)) != 0)
            return 0;
        nh = p[off];
        off += size;
    }
    if (off > len || nh == 50)
        return 0;
    if (nh == 58)
        return off < len && p[off] >= 128;
    return 1;
}

/* mtu: the route's, for packet too big (type 2); 0 for the others. */
static inline void check_icmp6(const struct dp_path *pa, const uint8_t *off, uint32_t len,
                               uint32_t mtu)
{
    const uint8_t *e = pa->icmp;
    uint32_t q = len < 1232 ? len : 1232, n = pa->icmp_len;
    uint8_t *sum = malloc(n);

    CHECK(sum);
    CHECK(n == 48 + q && n <= 1280 && well_formed6(e, n, 1280));
    CHECK(e[0] == 0x60 && e[1] == 0 && e[2] == 0 && e[3] == 0 && e[6] == 58 && e[7] == 64);
    CHECK(memcmp(e + 8, pa->tun_addr6, 16) == 0 && memcmp(e + 24, off + 8, 16) == 0);
    CHECK((e[40] == 1 || e[40] == 2 || e[40] == 3) && e[41] == 0);
    CHECK(((uint32_t)rd16(e + 44) << 16 | rd16(e + 46)) == (e[40] == 2 ? mtu : 0));
    CHECK(e[40] != 2 || (mtu && len > mtu));
    CHECK(memcmp(e + 48, off, q) == 0);
    /* The pseudo-header (addresses, length, 3 zeros, 58) in the place of
     * the IPv6 header: the sum over it and the message must be 0. */
    memcpy(sum, e + 8, 32);
    sum[32] = sum[33] = 0;
    sum[34] = (uint8_t)((n - 40) >> 8);
    sum[35] = (uint8_t)(n - 40);
    sum[36] = sum[37] = sum[38] = 0;
    sum[39] = 58;
    memcpy(sum + 40, e + 40, n - 40);
    CHECK(ref_csum(sum, n) == 0);
    free(sum);
    CHECK(naive_may_error6(off, len));
}

static inline void check_icmp(const struct dp_path *pa, const uint8_t *off, uint32_t len)
{
    const uint8_t *e = pa->icmp;
    uint32_t hl = (uint32_t)(off[0] & 15) * 4;
    uint32_t q = hl + 8 < len ? hl + 8 : len;

    CHECK(pa->icmp_len == 28 + q && pa->icmp_len <= DP_ICMP_ERR_MAX);
    CHECK(pa->icmp_len <= 576);                        /* RFC 1812 4.3.2.3 */
    CHECK(well_formed(e, pa->icmp_len, 65535) && e[0] == 0x45);
    CHECK(csum(e, 20) == 0 && csum(e + 20, pa->icmp_len - 20) == 0);
    CHECK(e[8] == 64 && e[9] == 1 && !later_fragment(e));
    CHECK(memcmp(e + 12, &pa->tun_addr, 4) == 0 && memcmp(e + 16, off + 12, 4) == 0);
    CHECK(e[20] == 3 || e[20] == 11);
    CHECK(memcmp(e + 28, off, q) == 0);
    CHECK(!later_fragment(off));
    if (off[9] == 1) {
        CHECK(e[20] == 11);                            /* never unreachable about ICMP */
        CHECK(len <= hl || (off[hl] != 3 && off[hl] != 4 && off[hl] != 5 &&
                            off[hl] != 11 && off[hl] != 12));
    }
}

#endif
