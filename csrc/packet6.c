/*
 * packet6.c - IPv6 checks and the hop limit; no I/O here.
 *
 * Flow, in the order the functions appear:
 *   1. dp_packet6_check       len >= 40, version 6, payload length + 40 == len
 *   2. dp_packet6_link_scope  dataplane.h's link scope: a packet that must
 *                             never leave its link (drop_scope)
 *   3. dp_packet6_src/dst     where the addresses are
 *   4. dp_packet6_hop_dec     hop limit - 1
 *   5. dp_packet6_may_error   when an ICMPv6 error is allowed: the walk to
 *                             the upper layer (RFC 4443 2.4 e)
 *   6. dp_packet6_pseudo,     the pseudo-header sum, and the error itself
 *      dp_packet6_icmp_error
 *
 * Forwarding looks at the fixed header only: extension headers are payload
 * to a router (RFC 8200 4: only the destination looks at them, hop-by-hop
 * options aside, which a router may skip). Only the decision to send an
 * error walks them, since RFC 4443 forbids an error about an error and the
 * ICMPv6 type sits behind them. IPv6 has no header checksum, so
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

int dp_packet6_unspecified(const uint8_t *a)
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

    if (link_local(src) || link_local(dst) || dp_packet6_unspecified(dst))
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

/* ---- 5. when an ICMPv6 error is allowed -------------------------------------------- */

/* Whether nh names an extension header rather than an upper layer: the set
 * of dataplane/engine/ipv6.py's EXTENSION_HEADERS, RFC 8200's and the later
 * ones in its common layout (RFC 6564). ESP is an upper layer here. */
static int is_ext(uint8_t nh)
{
    switch (nh) {
    case DP_IP6_NH_HOP: case DP_IP6_NH_ROUTING: case DP_IP6_NH_DEST: case DP_IP6_NH_FRAGMENT:
    case DP_IP6_NH_AH: case DP_IP6_NH_MOBILITY: case DP_IP6_NH_HIP: case DP_IP6_NH_SHIM6:
        return 1;
    }
    return 0;
}

/* The bytes the extension header nh at h takes (its first 8 are there). */
static uint32_t ext_len(uint8_t nh, const uint8_t *h)
{
    if (nh == DP_IP6_NH_FRAGMENT)
        return DP_IP6_EXT_MIN;
    if (nh == DP_IP6_NH_AH)              /* RFC 4302: in 4-byte words, less 2 */
        return ((uint32_t)h[1] + 2) * 4;
    return ((uint32_t)h[1] + 1) * 8;
}

/* dataplane.h's rule, in its order. The addresses first: a multicast or
 * :: source names no one sender to tell (RFC 4443 2.4 e.5), and errors
 * about a packet sent to a group could come from every router it meets
 * (e.3). Then the upper layer, which must be known not to be
 * an ICMPv6 error (e.1): a chain that does not end inside the packet or
 * within DP_IPV6_EXT_MAX headers, a later fragment (its upper layer is in
 * the first: e.2 forbids it anyway), ESP (encrypted: it may hide anything)
 * and an ICMPv6 header cut before its type are all unknown, and get none.
 * Any other upper layer, even one we know nothing of, is not ICMPv6. */
int dp_packet6_may_error(const uint8_t *p, uint32_t len)
{
    const uint8_t *src = p + DP_IP6_SRC_OFF;
    uint32_t off = DP_IP6_HDR, n, size;
    uint8_t nh = p[DP_IP6_NH_OFF];

    if (p[DP_IP6_DST_OFF] == DP_IP6_MCAST || src[0] == DP_IP6_MCAST ||
        dp_packet6_unspecified(src))
        return 0;
    for (n = 0; is_ext(nh); n++) {
        if (n == DP_IPV6_EXT_MAX || off + DP_IP6_EXT_MIN > len)
            return 0;                    /* too long a chain, or cut short */
        if (nh == DP_IP6_NH_FRAGMENT &&
            (dp_rd16(p + off + 2) & DP_IP6_FRAG_OFFSET_MASK))
            return 0;
        size = ext_len(nh, p + off);
        nh = p[off];
        off += size;
    }
    if (nh == DP_IP6_NH_ESP || off > len)
        return 0;
    return nh != DP_IP6_NH_ICMP || (off < len && p[off] >= DP_ICMP6_INFO_MIN);
}

/* ---- 6. the error ------------------------------------------------------------- */

uint64_t dp_packet6_pseudo(const uint8_t *ip, uint8_t nh, uint32_t l4len)
{
    uint8_t tail[8] = {(uint8_t)(l4len >> 24), (uint8_t)(l4len >> 16), (uint8_t)(l4len >> 8),
                       (uint8_t)l4len, 0, 0, 0, nh};

    return (uint64_t)dp_packet_sum(ip + DP_IP6_SRC_OFF, 2 * DP_IP6_ADDR) +
           dp_packet_sum(tail, sizeof(tail));
}

/* RFC 4443 2.4 c: as much of the offender as fits in IPv6's minimum MTU,
 * so the error reaches the sender whatever the links on the way back. The
 * offender is quoted as read, before any hop limit change. */
uint32_t dp_packet6_icmp_error(uint8_t *out, const uint8_t *offender, uint32_t len,
                               uint8_t type, uint8_t code, uint32_t word, const uint8_t *src)
{
    uint32_t room = DP_ICMP6_ERR_MAX - DP_IP6_HDR - DP_ICMP_HDR;
    uint32_t q = len < room ? len : room, plen = DP_ICMP_HDR + q;
    uint8_t *icmp = out + DP_IP6_HDR;

    dp_wr32(out, 6u << 28);              /* traffic class 0, flow label 0 */
    dp_wr16(out + DP_IP6_PLEN_OFF, (uint16_t)plen);
    out[DP_IP6_NH_OFF] = DP_IP6_NH_ICMP;
    out[DP_IP6_HOP_OFF] = DP_ICMP_TTL;
    memcpy(out + DP_IP6_SRC_OFF, src, DP_IP6_ADDR);
    memcpy(out + DP_IP6_DST_OFF, offender + DP_IP6_SRC_OFF, DP_IP6_ADDR);

    icmp[0] = type;
    icmp[1] = code;
    memset(icmp + 2, 0, 2);              /* the checksum, summed as 0 */
    dp_wr32(icmp + 4, word);             /* unused (0), or packet too big's MTU */
    memcpy(icmp + DP_ICMP_HDR, offender, q);
    dp_wr16(icmp + 2, (uint16_t)~dp_packet_fold(dp_packet6_pseudo(out, DP_IP6_NH_ICMP, plen) +
                                                dp_packet_sum(icmp, plen)));
    return DP_IP6_HDR + plen;
}
