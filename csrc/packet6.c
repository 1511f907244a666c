/*
 * packet6.c - IPv6 checks and the hop limit; no I/O here.
 *
 * Flow, in the order the functions appear:
 *   1. dp_packet6_check       len >= 40, version 6, payload length + 40 == len
 *   2. dp_packet6_link_scope  dataplane.h's link scope: a packet that must
 *                             never leave its link (drop_scope)
 *   3. dp_packet6_src/dst     where the addresses are
 *   4. dp_packet6_hop_dec     hop limit - 1
 *
 * The fixed header only: extension headers are payload to us, as they are
 * to a router (RFC 8200 4: only the destination looks at them, hop-by-hop
 * options aside, which a router may skip). IPv6 has no header checksum, so
 * the hop limit is the one byte a forwarded packet changes. Fields are read
 * byte by byte, as in packet.c: no alignment or endianness assumed.
 */
#include <string.h>

#include "internal.h"

/* ---- 1. validation ------------------------------------------------------------ */

/* No trailing bytes and no short packet, as tot_len == len for IPv4. A
 * jumbogram (RFC 2675: payload length 0) is larger than any mtu we take,
 * so payload length 0 means a bare header here, and anything else that
 * disagrees with len is malformed. */
int dp_packet6_check(const uint8_t *p, uint32_t len)
{
    if (len < DP_IP6_HDR || (p[0] >> 4) != 6)
        return DP_ST_DROP_MALFORMED;
    if ((uint32_t)dp_rd16(p + DP_IP6_PLEN_OFF) + DP_IP6_HDR != len)
        return DP_ST_DROP_MALFORMED;
    return 0;
}

/* ---- 2. link scope ------------------------------------------------------------ */

static inline int link_local(const uint8_t *a)
{
    return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;      /* fe80::/10 */
}

static inline int unspecified(const uint8_t *a)
{
    static const uint8_t zero[DP_IP6_ADDR];

    return !memcmp(a, zero, DP_IP6_ADDR);
}

/* RFC 4291 2.5.6 and 2.7: a link-local address and a multicast scope up to
 * link-local mean nothing beyond the link. :: as a destination is nobody.
 * The rule of dataplane.h, term for term; a multicast or :: source is the
 * destination's business and is forwarded. */
int dp_packet6_link_scope(const uint8_t *p)
{
    const uint8_t *src = p + DP_IP6_SRC_OFF, *dst = p + DP_IP6_DST_OFF;

    if (link_local(src) || link_local(dst) || unspecified(dst))
        return 1;
    return dst[0] == DP_IP6_MCAST && (dst[1] & 0x0f) <= DP_IP6_SCOPE_LINK;
}

/* ---- 3. addresses ------------------------------------------------------------- */

const uint8_t *dp_packet6_src(const uint8_t *p)
{
    return p + DP_IP6_SRC_OFF;
}

const uint8_t *dp_packet6_dst(const uint8_t *p)
{
    return p + DP_IP6_DST_OFF;
}

/* ---- 4. hop limit ------------------------------------------------------------- */

void dp_packet6_hop_dec(uint8_t *p)
{
    p[DP_IP6_HOP_OFF]--;
}
