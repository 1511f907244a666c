/*
 * packet.c - IPv4 checks, the TTL update and ICMP errors; no I/O here
 * (IPv6's checks are packet6.c's).
 *
 * Flow, in the order the functions appear:
 *   1. dp_packet_sum/fold/csum  internet checksum (RFC 1071) over bytes; the
 *                               pseudo-header of TCP/UDP (dp_packet_pseudo)
 *   2. dp_packet_check_tun/udp  the validation rules of dataplane.h, in its order,
 *                               returning the index of the drop counter to bump
 *   3. dp_packet_ttl_dec        TTL - 1 with the incremental checksum (RFC 1624)
 *   4. dp_packet_may_*          when a generated ICMP error is allowed
 *   5. dp_packet_icmp_error     builds 3/0 or 11/0 quoting the offender
 *
 * All multi-byte fields are read and written byte by byte in network order,
 * so nothing here depends on the host's endianness or on alignment.
 */
#include <string.h>

#include "internal.h"

/* ---- 1. checksums ------------------------------------------------------------- */

/* Two 64-bit lanes of a GCC/Clang vector: SSE2 on x86-64, NEON on arm64,
 * plain pairs of registers elsewhere. */
typedef uint64_t dp_u64x2 __attribute__((vector_size(16)));

/* The sum of p[0..len) as native 32-bit words, a trailing part padded with
 * zeros, folded to 32 bits so that callers can add a few without overflow.
 * Ones' complement sums do not care about word size or byte order up to a
 * final byte swap (RFC 1071), so any width works; this one adds the low and
 * high halves of 64-bit words into 64-bit lanes (no carries to chase: 2^32
 * words before a lane could overflow), 64 bytes per step. Every TCP segment
 * the offloads cut or join goes through here once, so it is the hottest
 * loop of a TCP stream; this shape beat the 32-bit-word and the 64-bit
 * add-with-carry loops by far (docs/design.md#fig-checksum). */
uint32_t dp_packet_sum(const uint8_t *p, size_t len)
{
    const dp_u64x2 lo32 = {0xffffffffu, 0xffffffffu};
    dp_u64x2 a = {0, 0}, b = {0, 0}, c = {0, 0}, d = {0, 0}, w, x, y, z;
    uint64_t s;
    uint32_t t;

    for (; len >= 64; p += 64, len -= 64) {
        memcpy(&w, p, 16);
        memcpy(&x, p + 16, 16);
        memcpy(&y, p + 32, 16);
        memcpy(&z, p + 48, 16);
        a += w & lo32;
        b += w >> 32;
        c += x & lo32;
        d += x >> 32;
        a += y & lo32;
        b += y >> 32;
        c += z & lo32;
        d += z >> 32;
    }
    a += b + c + d;
    s = (a[0] & 0xffffffffu) + (a[0] >> 32) + (a[1] & 0xffffffffu) + (a[1] >> 32);
    for (; len >= 4; p += 4, len -= 4) {
        memcpy(&t, p, 4);
        s += t;
    }
    if (len) {
        t = 0;
        memcpy(&t, p, len);
        s += t;
    }
    s = (s & 0xffffffffu) + (s >> 32);
    s = (s & 0xffffffffu) + (s >> 32);
    return (uint32_t)s;
}

uint16_t dp_packet_fold(uint64_t s)
{
    s = (s & 0xffffffffu) + (s >> 32);
    s = (s & 0xffffffffu) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap16((uint16_t)s);
#else
    return (uint16_t)s;
#endif
}

uint64_t dp_packet_pseudo(const uint8_t *ip, uint8_t proto, uint32_t l4len)
{
    uint8_t tail[4] = {0, proto, (uint8_t)(l4len >> 8), (uint8_t)l4len};

    return (uint64_t)dp_packet_sum(ip + 12, 8) + dp_packet_sum(tail, 4);
}

uint16_t dp_packet_csum(const uint8_t *p, size_t len)
{
    return (uint16_t)~dp_packet_fold(dp_packet_sum(p, len));
}

static inline unsigned ihl_bytes(const uint8_t *p)
{
    return (p[0] & 0x0fu) * 4u;
}

/* Length rules shared by both directions: the header must fit and tot_len
 * must be exactly what was read (no trailing bytes, no short packet). */
static int check_lengths(const uint8_t *p, uint32_t len)
{
    if (len < DP_IP_HDR_MIN)
        return DP_ST_DROP_MALFORMED;
    if ((p[0] & 0x0f) < 5 || ihl_bytes(p) > len)
        return DP_ST_DROP_MALFORMED;
    if (dp_rd16(p + 2) != len)
        return DP_ST_DROP_MALFORMED;
    return 0;
}

/* TUN side: len >= 20 first, then the version, then the other length rules.
 * path.c hands version 6 to packet6.c first, so here it is "not IPv4". */
int dp_packet_check_tun(const uint8_t *p, uint32_t len)
{
    if (len < DP_IP_HDR_MIN)
        return DP_ST_DROP_MALFORMED;
    if ((p[0] >> 4) != 4)
        return DP_ST_DROP_NOT_IPV4;
    return check_lengths(p, len);
}

/* UDP side: the version is checked before any length rule, so a short
 * datagram of another version is "not IPv4"; an empty one has no version
 * at all. Version 6 never gets here: path.c hands it to packet6.c. */
int dp_packet_check_udp(const uint8_t *p, uint32_t len)
{
    if (len >= 1 && (p[0] >> 4) != 4)
        return DP_ST_DROP_NOT_IPV4;
    return check_lengths(p, len);
}

uint32_t dp_packet_dst(const uint8_t *p)
{
    uint32_t a;

    memcpy(&a, p + 16, 4);    /* stays in network order */
    return a;
}

uint32_t dp_packet_src(const uint8_t *p)
{
    uint32_t a;

    memcpy(&a, p + 12, 4);
    return a;
}

/* The formula of dataplane.h, bit for bit: the Python engine does the same
 * arithmetic, so both give the same checksum even for a header whose
 * checksum was wrong on arrival (it is patched, never recomputed). */
void dp_packet_ttl_dec(uint8_t *p)
{
    uint32_t ttl = p[8], proto = p[9];
    uint32_t old = ttl << 8 | proto;
    uint32_t new = (ttl - 1) << 8 | proto;
    uint32_t check = dp_rd16(p + 10);
    uint32_t s;

    s = (~check & 0xffff) + (~old & 0xffff) + new;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    p[8] = (uint8_t)(ttl - 1);
    dp_wr16(p + 10, (uint16_t)(~s & 0xffff));
}

static inline int is_later_fragment(const uint8_t *p)
{
    return (dp_rd16(p + 6) & DP_IP_FRAG_OFFSET_MASK) != 0;
}

/* Net unreachable: never about ICMP (any type), never about a fragment
 * other than the first, which is what flanneld's proxy does. */
int dp_packet_may_unreach(const uint8_t *p, uint32_t len)
{
    (void)len;
    return p[9] != DP_IP_PROTO_ICMP && !is_later_fragment(p);
}

/* Time exceeded: never about an ICMP error (RFC 1812 4.3.2.7) nor a later
 * fragment. ICMP queries (echo, ...) do get one: that is what traceroute
 * with ICMP probes relies on. An ICMP packet too short to carry a type is
 * not known to be an error, so it gets a reply. */
int dp_packet_may_time_exceed(const uint8_t *p, uint32_t len)
{
    unsigned hl = ihl_bytes(p);

    if (is_later_fragment(p))
        return 0;
    if (p[9] == DP_IP_PROTO_ICMP && len > hl) {
        switch (p[hl]) {
        case 3: case 4: case 5: case 11: case 12:
            return 0;
        }
    }
    return 1;
}

uint32_t dp_packet_icmp_error(uint8_t *out, const uint8_t *offender, uint32_t len,
                              uint8_t type, uint8_t code, uint32_t src)
{
    uint32_t q = ihl_bytes(offender) + DP_ICMP_QUOTE_PAYLOAD;
    uint32_t total;
    uint8_t *icmp = out + DP_IP_HDR_MIN;

    if (q > len)
        q = len;
    total = DP_IP_HDR_MIN + DP_ICMP_HDR + q;

    out[0] = 0x45;
    out[1] = 0;                          /* tos */
    dp_wr16(out + 2, (uint16_t)total);
    dp_wr16(out + 4, 0);                    /* id */
    dp_wr16(out + 6, 0);                    /* no DF, offset 0 */
    out[8] = DP_ICMP_TTL;
    out[9] = DP_IP_PROTO_ICMP;
    dp_wr16(out + 10, 0);
    memcpy(out + 12, &src, 4);
    memcpy(out + 16, offender + 12, 4);  /* back to the offender's source */
    dp_wr16(out + 10, dp_packet_csum(out, DP_IP_HDR_MIN));

    icmp[0] = type;
    icmp[1] = code;
    memset(icmp + 2, 0, 6);              /* checksum, then the unused word */
    memcpy(icmp + DP_ICMP_HDR, offender, q);
    dp_wr16(icmp + 2, dp_packet_csum(icmp, DP_ICMP_HDR + q));
    return total;
}
