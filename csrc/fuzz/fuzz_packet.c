/*
 * fuzz_packet.c - libFuzzer target for both directions of the packet path.
 *
 * It links the I/O-free core (path.c, packet.c, packet6.c, routes.c,
 * local.c, trace.c, gro.c; not loop.c, tx.c or rx.c) and plays arbitrary
 * bytes as a small route table followed by a sequence of packets, each
 * read from the TUN or received on the UDP socket, with the writes into
 * the TUN failing or not and a fake clock. Each IPv4 route of the input
 * also gives an IPv6 route to the same peer (its net at bytes 4-7 with
 * prefixlen + 32 for an even index, at bytes 12-15 with prefixlen + 96 for
 * an odd one: both 64-bit halves of the keys are used), and the own
 * sources an IPv6 set the same way (::a.b.c.d, prefixlen + 96), so the
 * input layout stays IPv4's. The IPv6 underlay too lives in bits the
 * layout left unused: bit 3 of a route's peer byte puts the IPv6 route's
 * peer on the IPv6 underlay (2001:db8::a.b.c.d for the IPv4 peer
 * a.b.c.d), bits 4-5 give it an mtu (0, 1280, 1400, 1500), and a datagram
 * of a stranger's source (8-14) comes from the IPv6 peer 2001:db8::a.b.c.d
 * of peer source - 8 instead (15 stays the IPv4 0.0.0.0).
 * After every packet it checks what dataplane.h guarantees:
 *
 *   - the rx counters moved by one packet and its length;
 *   - exactly one outcome: forwarded (verdict FORWARD, no drop counter
 *     moved) or exactly one drop counter + 1; an ICMP error comes on top;
 *   - a forwarded IPv4 packet is well-formed (version 4, ihl >= 5,
 *     ihl * 4 <= len, tot_len == len, len <= mtu), only TTL (- 1, so >= 1
 *     left) and the checksum changed, and a checksum that was valid on
 *     arrival is still valid (we never verify incoming checksums, so a
 *     wrong one may stay wrong: it is patched, not recomputed);
 *   - a forwarded IPv6 packet is well-formed (version 6, payload length +
 *     40 == len, len <= mtu), not link-scoped (a naive reading of the rule
 *     of dataplane.h), and only its hop limit changed (- 1, so >= 1 left);
 *     drop_scope is about a well-formed link-scoped one;
 *   - the TUN side routes as a naive longest-prefix scan over the same
 *     routes of the packet's family (the last duplicate wins: peer, its
 *     underlay, port and mtu) and the UDP side's source check agrees with
 *     a naive scan of the peers of the datagram's underlay;
 *   - an IPv6 packet longer than its route's mtu is drop_too_big (after
 *     the hop limit), never forwarded, and its ICMPv6 error names the mtu;
 *     a forwarded one whose datagram the underlay refuses as over a path
 *     MTU is drop_too_big when longer than that MTU less the outer headers
 *     (at least 1280), its error naming that and quoting it as read, and
 *     anything else so refused a send error;
 *   - the inner-source checks (UDP steps 4, 5) agree with naive scans of
 *     the packet's family: a forwarded datagram's inner source is none of
 *     the own sources and, strict, routed to its sender; a
 *     drop_inner_local is about one of them, a drop_inner_foreign about one
 *     that is not the sender's;
 *   - an ICMP error is well-formed, has valid IP and ICMP checksums, is
 *     addressed to the offender's source, quotes min(len, ihl*4 + 8) bytes
 *     of it, and is never about an ICMP error or a later fragment;
 *   - an ICMPv6 error is well-formed and at most 1280 bytes, comes from
 *     the ICMPv6 source, goes to the offender's source, has a valid
 *     checksum over the pseudo-header, quotes min(len, 1232) bytes, and is
 *     sent (or rate-limited) exactly when a naive reading of RFC 4443's
 *     rules allows one: never about an ICMPv6 error, a later fragment, an
 *     unreadable chain, ESP, to a multicast destination or from a
 *     multicast or :: source, nor before an ICMPv6 source is set;
 *   - the rate limit allows exactly what a token bucket written another way
 *     allows: a credit of ns, burst * T when full, growing with the clock,
 *     T = ceil(1e9 / rate) per error (path.c writes it as GCRA).
 *   - TUN GRO (gro.c) over the forwarded UDP-side packets, as rx.c runs
 *     it: check_gro.h.
 *
 * The oracles live beside this file, one concern each: oracle_packet.h
 * (forwarded packets, link scope, ICMP and ICMPv6 errors),
 * oracle_sources.h (peers, own sources, senders), naive_routes.h (the
 * longest-prefix scan) and check_gro.h; this file owns the input's layout,
 * the model of the rate limit and the order of the checks.
 *
 * Each packet is copied into a buffer of exactly its length, so ASan sees
 * any read past its end. Input layout (short input = zeros):
 *   byte 0      flags: bit 0 accept_any, bit 1 trace, bits 2-3 ICMP limit
 *               (0 unlimited, 1 rate 1 burst 1, 2 the default, 3 rate and
 *               burst from the next two bytes), bit 4 keep host bits,
 *               bit 5 UDP runs in the TUN GRO (DP_OFF_TUN_GRO_UDP), bit 6
 *               strict sources, bit 7 an own-source set follows the routes
 *   byte 1      mtu = 68 + byte * 6 (68 .. 1598)
 *   byte 2,3    rate, burst (used when bits 2-3 == 3)
 *   byte 4      number of routes (% 9; bit 7 also leaves the ICMPv6 source
 *               unset: no ICMPv6 errors); each route: net 4, prefixlen 1, peer 1
 *   (bit 7)     own sources: net 4, prefixlen 1 (% 33), count 1 (% 5), then
 *               count addresses of 4 bytes (host bits of net kept as routes')
 *   then packets: ctl 1, len 2 (big-endian, cut to the mtu and to what is
 *   left), bytes. ctl bit 0: 0 TUN, 1 UDP; bit 1 MSG_TRUNC (TUN: the send
 *   refused as over a path MTU of 1200 + the low 10 bits of len); bits 2-3 the
 *   TUN write: 0/1 ok, 2 EAGAIN, 3 EIO; bits 4-7 source (UDP: 0-7 a route's
 *   peer, 7 being 0.0.0.0; 8-14 the IPv6 underlay's 2001:db8::(peer - 8),
 *   15 the IPv4 0.0.0.0) and clock step (2^bits ms).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "internal.h"
#include "fuzz.h"
#include "naive_routes.h"
#include "oracle_packet.h"
#include "oracle_sources.h"
#include "check_gro.h"

enum { MAX_ROUTES = 8, PEER_BASE = 0x7f000010 };   /* peers 127.0.0.16 + i */

static uint8_t rd8(struct reader *r)
{
    return (uint8_t)fuzz_take(r, 1);
}

static uint64_t drops(const dp_stats *s)
{
    return s->drop_no_route + s->drop_ttl + s->drop_malformed + s->drop_not_ipv4 +
           s->drop_truncated + s->drop_bad_source + s->drop_send_error + s->drop_tun_full +
           s->drop_tun_error + s->drop_inner_local + s->drop_inner_foreign + s->drop_scope +
           s->drop_too_big;
}

static int same_hit(const struct dp_route_hit *a, const struct dp_route_hit *b)
{
    return a->peer_ip == b->peer_ip && a->port == b->port && a->prefixlen == b->prefixlen &&
           a->mtu == b->mtu && a->v6 == b->v6 && !memcmp(a->peer6, b->peer6, 16);
}

/* ::a.b.c.d (a network-order uint32) into 16 bytes at byte `at` of zeros. */
static void embed(uint8_t *out, uint32_t v4, int at)
{
    memset(out, 0, 16);
    memcpy(out + at, &v4, 4);
}

/* Peer i is 127.0.0.16 + i, but 7 and 15 are 0.0.0.0: the address of
 * "source unknown", which the peer set keeps apart. */
static uint32_t peer_addr(uint32_t i)
{
    return (i & 7) == 7 ? 0 : htonl(PEER_BASE + i);
}

/* The rate limit as a token bucket written another way (see above): an
 * error sent (or refused) at `now` is what a credit of ns allows. */
static void bucket(uint64_t *credit, uint64_t *last, uint64_t now, uint64_t interval,
                   uint64_t burst, int sent)
{
    *credit += now - *last;
    if (*credit > burst * interval)
        *credit = burst * interval;
    *last = now;
    CHECK(sent == (*credit >= interval));
    if (sent)
        *credit -= interval;
}

static struct dp_path path;     /* static: the trace ring is large */
static struct gro_check gro;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader r = { data, size };
    dp_route rt[MAX_ROUTES];
    dp_route6 rt6[MAX_ROUTES];
    dp_stats before, after;
    uint8_t flags = rd8(&r);
    uint32_t mtu = DP_MTU_MIN + (uint32_t)rd8(&r) * 6;
    uint32_t rate = rd8(&r), burst = rd8(&r), nbyte = rd8(&r), nroutes = nbyte % (MAX_ROUTES + 1);
    uint32_t i, tun_addr = htonl(0x0a050100);
    static const uint8_t tun_addr6[16] = {0xfc, 0, 0, 5, 0, 0, 0, 1};   /* fc00:5:0:1:: */
    uint64_t now = 1000000000ull, interval = 0, credit = 0, last = now;
    struct dp_routes *table = NULL;
    struct dp_local *local = NULL;
    struct own own = {0};

    switch (flags >> 2 & 3) {
    case 0: rate = 0; burst = 0; break;
    case 1: rate = 1; burst = 1; break;
    case 2: rate = DP_ICMP_RATE_DEFAULT; burst = DP_ICMP_BURST_DEFAULT; break;
    default: if (!burst) burst = 1; break;
    }
    /* The checksum over the whole input, at every start alignment. */
    for (i = 0; i < 4 && i <= size; i++)
        (void)csum(data + i, size - i);
    dp_path_init(&path, tun_addr, flags & 1);
    if (!(nbyte & 0x80))
        memcpy(path.tun_addr6, tun_addr6, 16);
    gro.gro.udp = (flags & 0x20) != 0;
    CHECK(dp_path_set_icmp_limit(&path, rate, burst) == 0);
    CHECK(dp_path_set_icmp_limit(&path, 5, 0) == -EINVAL);   /* and unchanged */
    if (flags & 2)
        dp_trace_set(&path.trace, 1);
    if (rate) {
        interval = (1000000000ull + rate - 1) / rate;
        credit = burst * interval;                     /* the bucket starts full */
    }

    for (i = 0; i < nroutes; i++) {
        static const uint32_t route_mtu[4] = { 0, DP_MTU6_MIN, 1400, 1500 };
        uint8_t b[4] = { rd8(&r), rd8(&r), rd8(&r), rd8(&r) }, peer;
        uint32_t plen = rd8(&r) % 33, m = plen ? htonl(0xffffffffu << (32 - plen)) : 0;

        memcpy(&rt[i].net, b, 4);
        if (!(flags & 16))
            rt[i].net &= m;
        rt[i].prefixlen = plen;
        peer = rd8(&r);
        rt[i].peer_ip = peer_addr(peer & 7);
        rt[i].port = 8285 + i;
        memset(&rt6[i], 0, sizeof(rt6[i]));
        embed(rt6[i].net, rt[i].net, i & 1 ? 12 : 4);
        rt6[i].prefixlen = plen + (i & 1 ? 96 : 32);
        embed(rt6[i].peer_ip, rt[i].peer_ip, 12);
        if (peer & 8) {                                /* the IPv6 underlay: 2001:db8::a.b.c.d */
            rt6[i].peer_ip[0] = 0x20;
            rt6[i].peer_ip[1] = 0x01;
            rt6[i].peer_ip[2] = 0x0d;
            rt6[i].peer_ip[3] = 0xb8;
        } else {
            rt6[i].peer_ip[10] = rt6[i].peer_ip[11] = 0xff;
        }
        rt6[i].mtu = route_mtu[peer >> 4 & 3];
        rt6[i].port = rt[i].port;
    }
    if (dp_routes_build(&table, rt, nroutes, rt6, nroutes) != 0) {
        CHECK(flags & 16);                             /* only host bits are refused */
        CHECK(table == NULL);
        nroutes = 0;
    }
    path.routes = table;

    if (flags & 0x80) {
        uint8_t b[4] = { rd8(&r), rd8(&r), rd8(&r), rd8(&r) };
        uint32_t m;

        own.prefixlen = rd8(&r) % 33;
        m = own.prefixlen ? htonl(0xffffffffu << (32 - own.prefixlen)) : 0;
        memcpy(&own.net, b, 4);
        if (!(flags & 16))
            own.net &= m;
        own.n = rd8(&r) % (MAX_LOCAL + 1);
        for (i = 0; i < own.n; i++) {
            own.addrs[i] = htonl(fuzz_take(&r, 4));
            embed(own.addrs6[i], own.addrs[i], 12);
        }
        embed(own.net6, own.net, 12);
        own.prefixlen6 = own.prefixlen ? own.prefixlen + 96 : 0;
        own.on = dp_local_build(&local, own.net, own.prefixlen, own.addrs, own.n, own.net6,
                                own.prefixlen6, own.addrs6[0], own.n) == 0;
        if (!own.on)
            CHECK((flags & 16) && (own.net & ~m) && local == NULL);   /* host bits only */
        path.local = local;
    }
    CHECK(dp_local_build(&local, 0, 33, NULL, 0, NULL, 0, NULL, 0) == -EINVAL && local == NULL);
    CHECK(dp_local_build(&local, 0, 0, NULL, 0, NULL, 129, NULL, 0) == -EINVAL && local == NULL);
    local = path.local;
    path.strict_sources = (flags & 0x40) != 0;

    while (r.n) {
        uint8_t ctl = rd8(&r);
        uint32_t want = (uint32_t)rd8(&r) << 8, len;
        int udp = ctl & 1, wr = ctl >> 2 & 3, err = wr == 2 ? EAGAIN : wr == 3 ? EIO : 0;
        uint8_t *pkt, *orig;
        struct dp_route_hit hit, naive;
        enum dp_verdict v;
        int v6;

        want |= rd8(&r);
        len = want < mtu ? want : mtu;
        if (len > r.n)
            len = (uint32_t)r.n;
        pkt = malloc(len ? len : 1);
        orig = malloc(len ? len : 1);
        CHECK(pkt && orig);
        memcpy(pkt, r.p, len);
        memcpy(orig, r.p, len);
        /* Under 20 bytes the TUN side has no version: malformed either way. */
        v6 = len >= (udp ? 1u : 20u) && (orig[0] >> 4) == 6;
        r.p += len;
        r.n -= len;
        now += 1000000ull << (ctl >> 4);               /* 1 ms .. 33 s */
        path.now_ns = now;
        memset(&hit, 0, sizeof(hit));

        memcpy(&before, &path.c.s, sizeof(before));
        if (!udp) {
            v = dp_path_tun(&path, pkt, len, &hit);
        } else {
            uint32_t s = ctl >> 4, src = 0;            /* 8-14: the IPv6 underlay */
            uint8_t src6_buf[16], *src6 = NULL;
            int step4;

            if (s >= 8 && s < 15) {
                embed(src6_buf, peer_addr(s - 8), 12);
                memcpy(src6_buf, "\x20\x01\x0d\xb8", 4);
                src6 = src6_buf;
                v = dp_path_udp6(&path, pkt, len, src6, 4000, 1, ctl & 2);
            } else {
                src = peer_addr(s);
                v = dp_path_udp(&path, pkt, len, src, 4000, 1, ctl & 2);
            }
            if (v == DP_V_FORWARD) {
                CHECK(!(ctl & 2) && !naive_own_source(&own, orig, v6));
                CHECK(path.accept_any || naive_peer(rt, rt6, nroutes, src, src6));
                if (path.strict_sources)
                    CHECK(naive_owner_sent(rt, rt6, nroutes, orig, v6, src, src6));
            }
            /* Steps 4 and 5 see only what passed the header checks. */
            step4 = v6 ? well_formed6(orig, len, mtu) && !naive_scope6(orig)
                       : well_formed(orig, len, mtu);
            if (path.c.s.drop_inner_local != before.drop_inner_local)
                CHECK(step4 && naive_own_source(&own, orig, v6));
            if (path.c.s.drop_inner_foreign != before.drop_inner_foreign)
                CHECK(path.strict_sources && step4 && !naive_own_source(&own, orig, v6) &&
                      !naive_owner_sent(rt, rt6, nroutes, orig, v6, src, src6));
            if (path.c.s.drop_not_ipv4 != before.drop_not_ipv4)
                CHECK(len >= 1 && (orig[0] >> 4) != 4 && !v6);
            if (!(ctl & 2) && !path.accept_any && !naive_peer(rt, rt6, nroutes, src, src6))
                CHECK(path.c.s.drop_bad_source == before.drop_bad_source + 1);
        }
        memcpy(&after, &path.c.s, sizeof(after));

        /* rx moved by exactly this packet */
        if (!udp) {
            CHECK(after.tun_rx_packets == before.tun_rx_packets + 1);
            CHECK(after.tun_rx_bytes == before.tun_rx_bytes + len);
            CHECK(after.udp_rx_packets == before.udp_rx_packets);
        } else {
            CHECK(after.udp_rx_packets == before.udp_rx_packets + 1);
            CHECK(after.udp_rx_bytes == before.udp_rx_bytes + len);
            CHECK(after.tun_rx_packets == before.tun_rx_packets);
            CHECK(v != DP_V_ICMP);                     /* no ICMP on this side */
        }
        /* exactly one outcome */
        if (v == DP_V_FORWARD) {
            CHECK(drops(&after) == drops(&before));
            if (v6)
                check_forwarded6(orig, pkt, len, mtu);
            else
                check_forwarded(orig, pkt, len, mtu);
        } else {
            CHECK(drops(&after) == drops(&before) + 1);
        }
        CHECK(after.icmp_unreach_sent == before.icmp_unreach_sent &&
              after.icmp_ttl_sent == before.icmp_ttl_sent &&
              after.icmp_too_big_sent == before.icmp_too_big_sent);
        if (!udp && v != DP_V_FORWARD && after.drop_malformed == before.drop_malformed &&
            after.drop_not_ipv4 == before.drop_not_ipv4)    /* routed, then dropped */
            CHECK(v6 ? well_formed6(orig, len, mtu) : well_formed(orig, len, mtu));
        if (after.drop_scope != before.drop_scope)
            CHECK(v6 && well_formed6(orig, len, mtu) && naive_scope6(orig));
        else if (v6 && well_formed6(orig, len, mtu) && naive_scope6(orig))   /* taken earlier */
            CHECK(after.drop_truncated != before.drop_truncated ||
                  after.drop_bad_source != before.drop_bad_source);
        if (!udp && !v6 && (v == DP_V_FORWARD || after.drop_ttl > before.drop_ttl))
            CHECK(naive_lookup4(rt, nroutes, dp_packet_dst(orig), &naive) && same_hit(&naive, &hit));
        if (!udp && v6 && (v == DP_V_FORWARD || after.drop_ttl > before.drop_ttl ||
                           after.drop_too_big > before.drop_too_big))
            CHECK(naive_lookup6(rt6, nroutes, orig + 24, &naive) && same_hit(&naive, &hit));
        /* The route's mtu: over it is too big (the hop limit first), never forwarded. */
        if (!udp && v6 && v == DP_V_FORWARD)
            CHECK(!hit.mtu || len <= hit.mtu);
        if (after.drop_too_big > before.drop_too_big)
            CHECK(!udp && v6 && hit.mtu && len > hit.mtu && orig[7] > 1 &&
                  well_formed6(orig, len, mtu) && !naive_scope6(orig));
        if (!udp && after.drop_no_route > before.drop_no_route)
            CHECK(v6 ? !naive_lookup6(rt6, nroutes, orig + 24, &naive)
                     : !naive_lookup4(rt, nroutes, dp_packet_dst(orig), &naive));
        if (v6 && !udp && (after.drop_no_route > before.drop_no_route ||
                           after.drop_ttl > before.drop_ttl ||
                           after.drop_too_big > before.drop_too_big)) {
            /* An error (or a refusal of the limit) exactly when it is allowed. */
            int may = (nbyte & 0x80) == 0 && naive_may_error6(orig, len);

            CHECK(may == (v == DP_V_ICMP || after.icmp_ratelimited > before.icmp_ratelimited));
        } else if (v6) {
            CHECK(v != DP_V_ICMP && after.icmp_ratelimited == before.icmp_ratelimited);
        }
        CHECK(after.icmp_ratelimited <= before.icmp_ratelimited + 1);
        if (after.icmp_ratelimited > before.icmp_ratelimited)
            CHECK(rate != 0 && v == DP_V_DROP);
        if (rate && (v == DP_V_ICMP || after.icmp_ratelimited > before.icmp_ratelimited))
            bucket(&credit, &last, now, interval, burst, v == DP_V_ICMP);

        /* the caller's write, and its accounting */
        if (v == DP_V_ICMP) {
            if (v6)
                check_icmp6(&path, orig, len,
                            after.drop_too_big > before.drop_too_big ? hit.mtu : 0);
            else
                check_icmp(&path, orig, len);
            dp_path_icmp_written(&path, err);
        } else if (v == DP_V_FORWARD && udp) {
            gro_add(&gro, pkt, len);
            dp_path_tun_written(&path, pkt, len, err);
        }
        if (v == DP_V_ICMP || (v == DP_V_FORWARD && udp)) {
            if (err == EAGAIN)
                CHECK(path.c.s.drop_tun_full == after.drop_tun_full + 1);
            else if (err)
                CHECK(path.c.s.drop_tun_error == after.drop_tun_error + 1);
            else if (v == DP_V_ICMP)   /* unreachable is type 3 in IPv4, 1 in IPv6 */
                CHECK(path.c.s.icmp_unreach_sent - after.icmp_unreach_sent ==
                      (uint64_t)(path.icmp[v6 ? 40 : 20] == (v6 ? 1 : 3)) &&
                      path.c.s.icmp_too_big_sent - after.icmp_too_big_sent ==
                      (uint64_t)(v6 && path.icmp[40] == 2) &&
                      path.c.s.icmp_unreach_sent + path.c.s.icmp_ttl_sent +
                      path.c.s.icmp_too_big_sent == after.icmp_unreach_sent +
                      after.icmp_ttl_sent + after.icmp_too_big_sent + 1);
            else
                CHECK(path.c.s.tun_tx_packets == after.tun_tx_packets + 1 &&
                      path.c.s.tun_tx_bytes == after.tun_tx_bytes + len);
        }
        /* The underlay refused a forwarded packet's datagram as over its path
         * MTU (from the length's bits): packet too big with that MTU less
         * the outer headers, never under 1280, only about IPv6 longer than
         * that, quoting the packet as read; else a send error. */
        if (!udp && v == DP_V_FORWARD && (ctl & 2)) {
            uint32_t hdrs = hit.v6 ? DP_UNDERLAY6_HDRS : DP_UNDERLAY4_HDRS;
            uint32_t pmtu = 1200 + (want & 0x3ff);
            uint32_t m = pmtu > DP_MTU6_MIN + hdrs ? pmtu - hdrs : DP_MTU6_MIN;
            uint64_t limited = path.c.s.icmp_ratelimited, dropped = drops(&path.c.s);
            uint64_t big = path.c.s.drop_too_big;

            v = dp_path_too_big(&path, pkt, len, pmtu, hdrs);
            CHECK(drops(&path.c.s) == dropped + 1);
            CHECK((path.c.s.drop_too_big == big + 1) == (v6 && len > m));
            if (path.c.s.drop_too_big == big + 1)
                CHECK(memcmp(pkt, orig, len) == 0);
            CHECK(v == DP_V_DROP || path.c.s.drop_too_big == big + 1);
            if (rate && (v == DP_V_ICMP || path.c.s.icmp_ratelimited > limited))
                bucket(&credit, &last, now, interval, burst, v == DP_V_ICMP);
            if (v == DP_V_ICMP) {
                check_icmp6(&path, orig, len, m);
                dp_path_icmp_written(&path, 0);
            }
        }
        free(pkt);
        free(orig);
    }

    gro_flush(&gro);
    if (flags & 2) {
        static dp_trace_event ev[DP_TRACE_RING];
        int n = dp_trace_read(&path.trace, 0, ev, DP_TRACE_RING);

        CHECK(n >= 0);
        for (i = 1; i < (uint32_t)n; i++)
            CHECK(ev[i].seq == ev[i - 1].seq + 1 && ev[i].head_len <= DP_TRACE_HEAD);
    }
    dp_routes_free(table);
    dp_local_free(local);
    return 0;
}
