/*
 * rx.c - UDP -> TUN: recvmmsg, UDP_GRO trains, TUN writes and TUN GRO
 * runs. What happens to a datagram is decided in path.c; how a train is
 * cut is train.c's, how a run is coalesced gro.c's (all three pure). This
 * file makes the syscalls around them; a single packet's TUN write is
 * io.c's, which tx.c's ICMP errors share.
 *
 * Flow, in the order the functions appear:
 *   1. tun_write_one     dp_io_tun_write, and its outcome counted
 *   2. gro_flush,        with DP_OFF_TUN_GRO a forwarded packet joins the
 *      tun_forward       run (gro.c), which is written as one GSO packet
 *                        when it breaks or the batch ends
 *   3. udp_datagram      dp_path_udp, or dp_path_udp6 for a datagram of the
 *                        IPv6 underlay (checks, TTL or hop limit - 1), then
 *                        tun_forward
 *   4. udp_packet        one message: a datagram, or with DP_OFF_UDP_GRO a
 *                        train cut by dp_train_cut_* into datagrams
 *   5. dp_rx_batch       one recvmmsg(MSG_DONTWAIT) of up to `batch` on one
 *                        socket (either underlay's), then the run held is
 *                        flushed
 *   6. dp_rx_setup       the receive slots, sized for the offloads
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "io.h"

/* <linux/udp.h>; glibc's headers may lack them. */
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

/* ---- 1. TUN writes ------------------------------------------------------------------ */

static void tun_write_one(struct dp_loop *l, const uint8_t *p, uint32_t len)
{
    dp_path_tun_written(&l->path, p, len, dp_io_tun_write(l, p, len) < 0 ? errno : 0);
}

/* ---- 2. TUN GRO runs ---------------------------------------------------------------- */

/* Writes the run held, if any: one segment as it is, more as one GSO
 * packet (gro.c). Each segment is counted written, or dropped, on its own:
 * the counters see the packets the peer sent, whatever the syscalls. */
static void gro_flush(struct dp_loop *l)
{
    struct dp_gro *g = &l->gro;
    uint32_t i, niov;
    ssize_t w;
    int err;

    if (g->n == 1) {
        tun_write_one(l, g->seg[0], g->len[0]);
    } else if (g->n > 1) {
        dp_gro_headers(g, l->gro_vnet, l->gro_hdr);
        niov = dp_gro_iov(g, l->gro_vnet, l->gro_hdr, l->gro_iov);
        do {
            sys_count(l, DP_ST_TUN_WRITES);
            w = writev(l->tun_fd, l->gro_iov, (int)niov);
        } while (w < 0 && errno == EINTR);
        err = w < 0 ? errno : 0;
        tun_failed(l, err);
        for (i = 0; i < g->n; i++)
            dp_path_tun_written(&l->path, g->seg[i], g->len[i], err);
        if (!err)
            st_add(l, DP_ST_TUN_TX_GSO, 1);
    }
    dp_gro_reset(g);
}

/* A forwarded packet goes into the run, or is written now - after the run
 * it breaks, so packets leave in the order they came. */
static void tun_forward(struct dp_loop *l, const uint8_t *p, uint32_t len)
{
    if (l->offloads & DP_OFF_TUN_GRO) {
        if (dp_gro_join(&l->gro, p, len))
            return;
        gro_flush(l);
        if (dp_gro_start(&l->gro, p, len))
            return;
    }
    tun_write_one(l, p, len);
}

/* ---- 3. one datagram ---------------------------------------------------------------- */

/* Where a message came from: an IPv4 source, or (src6) an IPv6 one. */
struct dp_datagram_src {
    uint32_t src;
    const uint8_t *src6;
    uint32_t sport;
};

static void udp_datagram(struct dp_loop *l, uint8_t *p, uint32_t len,
                         const struct dp_datagram_src *s, uint32_t nmsgs, int truncated)
{
    enum dp_verdict v = s->src6 ?
        dp_path_udp6(&l->path, p, len, s->src6, s->sport, nmsgs, truncated) :
        dp_path_udp(&l->path, p, len, s->src, s->sport, nmsgs, truncated);

    if (v == DP_V_FORWARD)
        tun_forward(l, p, len);
}

/* ---- 4. one message ----------------------------------------------------------------- */

/* The segment size of a UDP_GRO train; 0 when the message is one datagram. */
static uint32_t gro_segment_size(struct msghdr *mh)
{
    struct cmsghdr *c;
    int v;

    for (c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO &&
            c->cmsg_len >= CMSG_LEN(sizeof(v))) {
            memcpy(&v, CMSG_DATA(c), sizeof(v));
            return v > 0 ? (uint32_t)v : 0;
        }
    }
    return 0;
}

/* DP_OFF_UDP_GRO: each datagram of the train is handled as if received
 * alone - one larger than the mtu, or cut short by the slot, as a plain
 * receive reports it: truncated (dataplane.h). */
static void udp_train(struct dp_loop *l, struct mmsghdr *mh, uint8_t *p,
                      const struct dp_datagram_src *s, uint32_t nmsgs)
{
    struct dp_train_cut c;
    struct dp_datagram d;

    if (dp_train_cut_start(&c, mh->msg_len, gro_segment_size(&mh->msg_hdr), l->rx_slot,
                           l->mtu))
        st_add(l, DP_ST_UDP_RX_GRO, 1);
    while (dp_train_cut_next(&c, &d))
        udp_datagram(l, d.has_bytes ? p + d.off : NULL, d.len, s, nmsgs, d.truncated);
}

static void udp_packet(struct dp_loop *l, uint32_t k, uint32_t nmsgs)
{
    struct mmsghdr *mh = &l->rx_msgs[k];
    union dp_sockaddr *a = &l->rx_addr[k];
    uint8_t *p = l->rx_iov[k].iov_base;
    struct dp_datagram_src s = { 0, NULL, 0 };

    if (mh->msg_hdr.msg_namelen >= sizeof(struct sockaddr_in6) && a->sa.sa_family == AF_INET6) {
        s.src6 = a->v6.sin6_addr.s6_addr;
        s.sport = ntohs(a->v6.sin6_port);
    } else if (mh->msg_hdr.msg_namelen >= sizeof(struct sockaddr_in) &&
               a->sa.sa_family == AF_INET) {
        s.src = a->v4.sin_addr.s_addr;
        s.sport = ntohs(a->v4.sin_port);
    }
    if (l->offloads & DP_OFF_UDP_GRO)
        udp_train(l, mh, p, &s, nmsgs);
    else
        udp_datagram(l, p, mh->msg_len, &s, nmsgs, (mh->msg_hdr.msg_flags & MSG_TRUNC) != 0);
}

/* ---- 5. one batch ------------------------------------------------------------------- */

enum dp_io dp_rx_batch(struct dp_loop *l, int fd)
{
    int gro = (l->offloads & DP_OFF_UDP_GRO) != 0;
    uint32_t k;
    int r;

    dp_io_take_tables(l);
    do {
        sys_count(l, DP_ST_UDP_RECVS);
        r = recvmmsg(fd, l->rx_msgs, l->batch, MSG_DONTWAIT | (gro ? MSG_TRUNC : 0),
                     NULL);
    } while (r < 0 && errno == EINTR);
    if (r <= 0)
        return (r == 0 || errno == EAGAIN || errno == EWOULDBLOCK) ? DP_IO_IDLE : DP_IO_ERROR;

    st_add(l, DP_ST_RX_BATCHES, 1);
    for (k = 0; k < (uint32_t)r; k++) {
        dp_io_take_tables(l);   /* the source checks, too, use the newest tables */
        udp_packet(l, k, (uint32_t)r);
        /* msg_namelen, msg_controllen and msg_flags are value-result:
         * reset for next time. */
        l->rx_msgs[k].msg_hdr.msg_namelen = sizeof(l->rx_addr[k]);
        if (gro)
            l->rx_msgs[k].msg_hdr.msg_controllen = sizeof(l->rx_ctl[k].buf);
        l->rx_msgs[k].msg_hdr.msg_flags = 0;
    }
    /* A run never outlives its batch: the next recvmmsg reuses the slots,
     * and a packet held back waiting for more would be a delay. */
    gro_flush(l);
    /* A short batch means the queue was empty a moment ago: let epoll say
     * when there is more, rather than pay for an EAGAIN recvmmsg(). */
    return (uint32_t)r == l->batch ? DP_IO_MORE : DP_IO_IDLE;
}

/* ---- 6. setup ----------------------------------------------------------------------- */

/* Only while the loop does not run. */
int dp_rx_setup(struct dp_loop *l, uint32_t offloads)
{
    int gro = (offloads & DP_OFF_UDP_GRO) != 0;
    uint32_t stride, slot = dp_train_rx_slot(offloads, l->mtu, &stride);
    uint8_t *buf;
    uint32_t i;

    if (l->rx_buf && l->rx_slot == slot)
        return 0;
    buf = malloc((size_t)l->batch * stride);
    if (!buf)
        return -ENOMEM;
    free(l->rx_buf);
    l->rx_buf = buf;
    l->rx_slot = slot;
    dp_io_msgs_init(l->rx_msgs, l->rx_iov, l->rx_addr, buf, l->batch, stride);
    for (i = 0; i < l->batch; i++) {
        l->rx_iov[i].iov_len = slot;
        l->rx_msgs[i].msg_hdr.msg_control = gro ? l->rx_ctl[i].buf : NULL;
        l->rx_msgs[i].msg_hdr.msg_controllen = gro ? sizeof(l->rx_ctl[i].buf) : 0;
    }
    return 0;
}
