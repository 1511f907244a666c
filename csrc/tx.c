/*
 * tx.c - TUN -> UDP: batched TUN reads, the virtio_net_hdr glue, trains of
 * datagrams and sendmmsg. What happens to a packet is decided in path.c;
 * where a read lands and how a super-packet is cut is gso.c's, how a batch
 * groups into trains train.c's (all three pure). This file makes the
 * syscalls around them.
 *
 * Flow, in the order the functions appear:
 *   1. icmp_send           an ICMP error path.c built (the clock for its
 *                          rate limit is dp_now_ns), written into the TUN
 *                          by io.c
 *   2. set_peer,           dp_path_tun (checks, route, TTL or hop limit - 1),
 *      tun_packet          then queue it in its slot, addressed to the
 *                          route's peer on either underlay, or send the
 *                          ICMP error
 *   3. udp_sendmmsg,       one sendmmsg() per batch and underlay (the
 *      sent, refused,      IPv4 socket or the IPv6 one), skipping refused
 *      udp_send_plain      messages, each judged by pmtu.c (a path MTU:
 *                          packet too big); each datagram sent is counted
 *                          once
 *   4. trains_build,       with DP_OFF_UDP_GSO: dp_train_plan groups the
 *      udp_send_gso        batch, each train one message with UDP_SEGMENT;
 *                          a refused train goes again plain
 *   5. tun_vnet_packet     with DP_OFF_TUN_VNET: dp_gso_read finds the
 *                          packet; a plain one gets its checksum finished,
 *                          a super-packet is cut (dp_gso_start/next) into
 *                          packets that each go through tun_packet, sending
 *                          whenever the slots run out
 *   6. dp_tx_batch         read() until EAGAIN or `batch`, then send
 *   7. dp_tx_setup,        the send slots (dp_loop_new) and the
 *      dp_tx_set_offloads  super-packet buffer (dp_loop_set_offloads)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <time.h>

#include "io.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103     /* <linux/udp.h>, Linux >= 4.18 */
#endif

/* Send slot m: where the m-th queued packet of the batch is read or cut to. */
static inline uint8_t *slot_at(struct dp_loop *l, uint32_t m)
{
    return l->tx_buf + (size_t)m * l->mtu;
}

/* ---- 1. ICMP errors ---------------------------------------------------------- */

/* path.c built it (and checked the rate limit); we write it. */
static void icmp_send(struct dp_loop *l)
{
    dp_path_icmp_written(&l->path,
                         dp_io_tun_write(l, l->path.icmp, l->path.icmp_len) < 0 ? errno : 0);
}

/* ---- 2. one packet ------------------------------------------------------------------ */

/* mh carries UDP_SEGMENT = seg in c: a train's segment size, or a datagram's
 * own length (IPv4's "don't fragment" for one datagram). */
static void put_segment(struct msghdr *mh, union dp_seg_cmsg *c, uint16_t seg)
{
    mh->msg_control = c->buf;
    mh->msg_controllen = sizeof(c->buf);
    c->align.cmsg_level = IPPROTO_UDP;
    c->align.cmsg_type = UDP_SEGMENT;
    c->align.cmsg_len = CMSG_LEN(sizeof(seg));
    memcpy(CMSG_DATA(&c->align), &seg, sizeof(seg));
}

/* Message `slot` goes to the route's peer, on the socket of its underlay;
 * an inner IPv6 packet to an IPv4 peer with its "don't fragment"
 * (dataplane.h "Path MTU"). */
static void set_peer(struct dp_loop *l, uint32_t slot, const struct dp_route_hit *hit,
                     const uint8_t *p, uint32_t len)
{
    union dp_sockaddr *a = &l->tx_addr[slot];
    struct msghdr *mh = &l->tx_msgs[slot].msg_hdr;

    mh->msg_control = NULL;
    mh->msg_controllen = 0;
    if (!hit->v6 && l->df4 && (p[0] >> 4) == 6)
        put_segment(mh, &l->tx_df[slot], (uint16_t)len);
    if (hit->v6) {
        memset(&a->v6, 0, sizeof(a->v6));
        a->v6.sin6_family = AF_INET6;
        a->v6.sin6_port = htons((uint16_t)hit->port);
        memcpy(a->v6.sin6_addr.s6_addr, hit->peer6, sizeof(hit->peer6));
        l->tx_msgs[slot].msg_hdr.msg_namelen = sizeof(a->v6);
    } else {
        a->v4.sin_family = AF_INET;
        a->v4.sin_addr.s_addr = hit->peer_ip;
        a->v4.sin_port = htons((uint16_t)hit->port);
        l->tx_msgs[slot].msg_hdr.msg_namelen = sizeof(a->v4);
    }
}

/* Returns 1 if the packet was queued as message `slot` of the next sendmmsg. */
static int tun_packet(struct dp_loop *l, uint8_t *p, uint32_t len, uint32_t slot)
{
    struct dp_route_hit hit;

    switch (dp_path_tun(&l->path, p, len, &hit)) {
    case DP_V_FORWARD:
        break;
    case DP_V_ICMP:
        icmp_send(l);
        return 0;
    default:
        return 0;
    }
    l->tx_iov[slot].iov_len = len;
    set_peer(l, slot, &hit, p, len);
    return 1;
}

/* ---- 3. plain sends ----------------------------------------------------------------- */

/* One sendmmsg() on the socket of the messages' underlay (all of one),
 * again when a signal interrupted it before it sent anything. */
static int udp_sendmmsg(struct dp_loop *l, struct mmsghdr *msgs, uint32_t n)
{
    const union dp_sockaddr *a = msgs[0].msg_hdr.msg_name;
    int fd = a->sa.sa_family == AF_INET6 ? l->udp6_fd : l->udp_fd;
    int r;

    do {
        sys_count(l, DP_ST_UDP_SENDS);
        r = sendmmsg(fd, msgs, n, 0);
    } while (r < 0 && errno == EINTR);
    return r;
}

/* How many of the n messages from msgs on go to the first one's underlay:
 * one sendmmsg's worth. */
static uint32_t same_socket(const struct mmsghdr *msgs, uint32_t n)
{
    const union dp_sockaddr *a = msgs[0].msg_hdr.msg_name;
    uint32_t k = 1;

    while (k < n && ((const union dp_sockaddr *)msgs[k].msg_hdr.msg_name)->sa.sa_family ==
                    a->sa.sa_family)
        k++;
    return k;
}

/* Slot k went out, in a call handed `batch` datagrams. The trace's addr
 * is a uint32: 0 for an IPv6 peer. */
static void sent(struct dp_loop *l, uint32_t k, uint32_t batch)
{
    uint32_t len = (uint32_t)l->tx_iov[k].iov_len;
    const union dp_sockaddr *a = &l->tx_addr[k];
    int v6 = a->sa.sa_family == AF_INET6;

    dp_path_count_packet(&l->path, DP_ST_UDP_TX_PACKETS, l->tx_iov[k].iov_base, len);
    trace(l, DP_TR_UDP_SEND, len, v6 ? 0 : a->v4.sin_addr.s_addr,
          ntohs(v6 ? a->v6.sin6_port : a->v4.sin_port), batch, NULL);
}

/* Slot i was refused with err (0: no errno): pmtu.c says what it becomes
 * (dataplane.h "Path MTU"), and the send or the error is counted here. */
static void refused(struct dp_loop *l, uint32_t i, int err)
{
    switch (dp_pmtu_refused(l, i, err)) {
    case DP_PMTU_SENT:
        sent(l, i, 1);
        break;
    case DP_PMTU_ICMP:
        icmp_send(l);
        break;
    default:
        break;
    }
}

/* One sendmmsg() for the queued messages from slot i on, per run of one
 * underlay. The kernel stops at the first message it refuses and reports
 * only how many went before it; so on a short count we call again from
 * there, and the call that starts with the refused message fails with its
 * errno: that one is judged (refused) and skipped. */
static void udp_send_plain(struct dp_loop *l, uint32_t i, uint32_t m)
{
    uint32_t k, n;
    int r;

    while (i < m) {
        n = same_socket(&l->tx_msgs[i], m - i);
        r = udp_sendmmsg(l, &l->tx_msgs[i], n);
        if (r <= 0) {
            refused(l, i, r < 0 ? errno : 0);
            i++;
            continue;
        }
        /* batch = the messages handed to this call (all of the run when none fails). */
        for (k = i; k < i + (uint32_t)r; k++)
            sent(l, k, n);
        i += (uint32_t)r;
    }
}

/* Whether slots a and b go to the same peer (address, port, underlay). */
static int same_peer(const union dp_sockaddr *a, const union dp_sockaddr *b)
{
    if (a->sa.sa_family != b->sa.sa_family)
        return 0;
    if (a->sa.sa_family == AF_INET6)
        return a->v6.sin6_port == b->v6.sin6_port &&
               !memcmp(&a->v6.sin6_addr, &b->v6.sin6_addr, sizeof(a->v6.sin6_addr));
    return a->v4.sin_port == b->v4.sin_port && a->v4.sin_addr.s_addr == b->v4.sin_addr.s_addr;
}

/* ---- 4. trains (DP_OFF_UDP_GSO) ----------------------------------------------------- */

/* Plans slots 0..m-1 as trains and builds one message per train; returns
 * how many. A train of one is a plain message (its only cmsg the "don't
 * fragment" of set_peer): exactly what udp_send_plain sends. A train only
 * ever joins consecutive slots, so a slot's key is the first slot of its
 * run of one peer: equal exactly when the peer is, for 16-byte addresses as
 * for 4-byte ones, and whatever table routed the slot (a table may be taken
 * between two reads). */
static uint32_t trains_build(struct dp_loop *l, uint32_t m)
{
    uint32_t t, nt, i;

    for (i = 0; i < m; i++) {
        l->train_len[i] = (uint32_t)l->tx_iov[i].iov_len;
        l->train_dest[i] = i && same_peer(&l->tx_addr[i - 1], &l->tx_addr[i]) ?
                           l->train_dest[i - 1] : i;
    }
    nt = dp_train_plan(l->train_len, l->train_dest, m, l->trains);
    for (t = 0; t < nt; t++) {
        struct msghdr *mh = &l->train_msgs[t].msg_hdr;

        i = l->trains[t].first;
        memset(mh, 0, sizeof(*mh));
        mh->msg_name = &l->tx_addr[i];
        mh->msg_namelen = l->tx_msgs[i].msg_hdr.msg_namelen;
        mh->msg_iov = &l->tx_iov[i];
        mh->msg_iovlen = l->trains[t].n;
        mh->msg_control = l->tx_msgs[i].msg_hdr.msg_control;
        mh->msg_controllen = l->tx_msgs[i].msg_hdr.msg_controllen;
        if (l->trains[t].n > 1)
            put_segment(mh, &l->train_cmsg[t], (uint16_t)l->tx_iov[i].iov_len);
    }
    return nt;
}

/* One sendmmsg() of trains. A refused train is sent again as plain
 * messages (a single one is just dropped, as by udp_send_plain), so each of
 * its datagrams meets the fate it would have had without GSO. Only EIO
 * means the kernel cannot segment on this path at all (udp_send_skb(): a
 * UDP-Lite socket, an IPsec route, and on older kernels a device without tx
 * checksumming): then UDP_GSO goes off for this loop and everything from
 * that train on goes out plain. EMSGSIZE (a segment over one peer's path
 * MTU; EINVAL on older kernels), EINVAL (SO_NO_CHECK) and the rest are
 * about this send alone: the next train may well go through. */
static void udp_send_gso(struct dp_loop *l, uint32_t m)
{
    uint32_t nt = trains_build(l, m), t = 0, j, k, first, n, run, handed;
    int r, err;

    while (t < nt) {
        /* One call per run of trains of one underlay; handed: its datagrams. */
        run = same_socket(&l->train_msgs[t], nt - t);
        handed = l->trains[t + run - 1].first + l->trains[t + run - 1].n - l->trains[t].first;
        r = udp_sendmmsg(l, &l->train_msgs[t], run);
        if (r <= 0) {
            err = r < 0 ? errno : 0;
            first = l->trains[t].first;
            n = l->trains[t].n;
            if (n == 1) {
                refused(l, first, err);
            } else {
                st_add(l, DP_ST_UDP_GSO_FALLBACKS, 1);
                if (err == EIO) {
                    __atomic_store_n(&l->offloads, l->offloads & ~(uint32_t)DP_OFF_UDP_GSO,
                                     __ATOMIC_RELAXED);
                    udp_send_plain(l, first, m);
                    return;
                }
                udp_send_plain(l, first, first + n);
            }
            t++;
            continue;
        }
        for (j = t; j < t + (uint32_t)r; j++) {
            first = l->trains[j].first;
            n = l->trains[j].n;
            if (n > 1)
                st_add(l, DP_ST_UDP_TX_GSO, 1);
            /* batch = the datagrams handed to this call. */
            for (k = first; k < first + n; k++)
                sent(l, k, handed);
        }
        t += (uint32_t)r;
    }
}

static void udp_send(struct dp_loop *l, uint32_t m)
{
    if (l->offloads & DP_OFF_UDP_GSO)
        udp_send_gso(l, m);
    else
        udp_send_plain(l, 0, m);
}

/* ---- 5. DP_OFF_TUN_VNET reads ------------------------------------------------------- */

/* The r bytes of a read into slot m (dp_gso_scatter): a plain packet goes
 * on as a plain read would, after its checksum is finished if the kernel
 * left it partial; a super-packet is cut into segments, each going on as a
 * plain read, flushing the batch whenever the slots run out. Returns the
 * number of slots now queued. */
static uint32_t tun_vnet_packet(struct dp_loop *l, uint32_t r, uint32_t m)
{
    struct dp_vnet_hdr h;
    struct dp_gso g;
    uint8_t *p;
    uint32_t len, seg;
    int reason;

    reason = dp_gso_read(l->vnet_hdr, r, slot_at(l, m), l->vnet_buf, l->mtu, &h, &p, &len);
    if (reason) {
        dp_path_tun_drop(&l->path, p, len, reason);
        return m;
    }
    if (h.gso_type == DP_VNET_GSO_NONE) {
        reason = dp_gso_csum(p, len, &h);
        if (reason) {
            dp_path_tun_drop(&l->path, p, len, reason);
            return m;
        }
        return m + (uint32_t)tun_packet(l, p, len, m);
    }

    st_add(l, DP_ST_TUN_RX_GSO, 1);
    reason = dp_gso_start(&g, p, len, &h, l->mtu);
    if (reason) {
        dp_path_tun_drop(&l->path, p, len, reason);
        return m;
    }
    while ((seg = dp_gso_next(&g, slot_at(l, m))) != 0) {
        m += (uint32_t)tun_packet(l, slot_at(l, m), seg, m);
        if (m == l->batch) {
            udp_send(l, m);
            m = 0;
        }
    }
    return m;
}

/* ---- 6. one batch ------------------------------------------------------------------- */

enum dp_io dp_tx_batch(struct dp_loop *l)
{
    enum dp_io res = DP_IO_MORE;
    uint32_t n = 0, m = 0;
    int vnet = (l->offloads & DP_OFF_TUN_VNET) != 0;
    struct iovec iov[3];
    ssize_t r;

    dp_io_take_tables(l);
    /* For the ICMP rate limit: one clock read per batch, not per packet. */
    l->path.now_ns = dp_now_ns();
    while (n < l->batch) {
        /* A super-packet's segments may have left slots queued: a read must
         * still land in a slot of the batch. */
        if (m == l->batch) {
            udp_send(l, m);
            m = 0;
        }
        sys_count(l, DP_ST_TUN_READS);
        if (vnet) {
            dp_gso_scatter(l->vnet_hdr, slot_at(l, m), l->vnet_buf, l->mtu, iov);
            r = readv(l->tun_fd, iov, 3);
        } else {
            r = read(l->tun_fd, slot_at(l, m), l->mtu);
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            res = (errno == EAGAIN || errno == EWOULDBLOCK) ? DP_IO_IDLE : DP_IO_ERROR;
            if (res == DP_IO_ERROR)
                l->tun_read_err = errno;
            break;
        }
        n++;
        /* Checked per packet, not only per batch: a packet written into the
         * TUN after set_routes() returned is routed by that table or a newer
         * one, never by an older one. */
        dp_io_take_tables(l);
        /* A dropped packet leaves its slot free for the next read. */
        if (vnet)
            m = tun_vnet_packet(l, (uint32_t)r, m);
        else if (tun_packet(l, slot_at(l, m), (uint32_t)r, m))
            m++;
    }
    if (n)
        st_add(l, DP_ST_TX_BATCHES, 1);
    if (m)
        udp_send(l, m);
    return res;
}

/* ---- 7. setup ----------------------------------------------------------------------- */

int dp_tx_setup(struct dp_loop *l)
{
    l->tx_buf = malloc((size_t)l->batch * l->mtu);
    if (!l->tx_buf)
        return -ENOMEM;
    dp_io_msgs_init(l->tx_msgs, l->tx_iov, l->tx_addr, l->tx_buf, l->batch, l->mtu);
    return 0;
}

int dp_tx_set_offloads(struct dp_loop *l, uint32_t offloads)
{
    /* Room for a super-packet: allocated here, never on the data path. */
    if ((offloads & DP_OFF_TUN_VNET) && !l->vnet_buf) {
        l->vnet_buf = malloc(DP_VNET_PKT_MAX);
        if (!l->vnet_buf)
            return -ENOMEM;
    }
    return 0;
}
