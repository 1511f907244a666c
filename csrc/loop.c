/*
 * loop.c - the packet loop: epoll over the TUN, the UDP socket and a stop fd.
 *
 * Flow, in the order the functions appear:
 *   1. counters, trace and syscall helpers (every syscall bumps `syscalls`)
 *   2. take_routes    at the start of each batch and before each packet,
 *                     adopt a published table (one relaxed load when none)
 *   3. icmp_send      an ICMP error back into the TUN
 *   4. TUN -> UDP     tun_packet: dp_path_tun (path.c: checks of dataplane.h,
 *                     route, TTL - 1), then queue or send an ICMP error;
 *                     udp_send: one sendmmsg() per batch, skipping refused
 *                     messages (udp_send_plain) or, with DP_OFF_UDP_GSO, of
 *                     trains of equal-sized datagrams to one peer, each one
 *                     message with UDP_SEGMENT (trains_build, udp_send_gso);
 *                     tun_vnet_packet: with DP_OFF_TUN_VNET a read is a
 *                     virtio_net_hdr + packet: finish a partial checksum or
 *                     cut a TSO/USO super-packet (gso.c) into packets that
 *                     each go through tun_packet, sending whenever the slots
 *                     run out; tun_batch: read() until EAGAIN or `batch`
 *   5. UDP -> TUN     udp_packet: one message, or with DP_OFF_UDP_GRO
 *                     udp_train: a train split at its segment size; each
 *                     datagram: dp_path_udp (checks, TTL - 1), then
 *                     tun_forward: write() to the TUN, or with
 *                     DP_OFF_TUN_GRO into a run (gro.c) that gro_flush
 *                     writes as one GSO packet; udp_batch: one
 *                     recvmmsg(MSG_DONTWAIT) of up to `batch`, then the
 *                     run held is flushed
 *   6. dp_loop_run    epoll_wait, then alternate the two directions, one
 *                     batch each, while there is work, at most DP_ROUNDS
 *                     times, so neither direction nor the stop fd starves
 *   7. the public API of dataplane.h: new/free/stop/set_routes/stats/trace
 *
 * What happens to a packet is decided in path.c, which does no I/O; this
 * file makes the syscalls around it.
 *
 * Threads: one loop thread runs dp_loop_run(); control calls come from any
 * thread. What crosses threads is atomic: `stopping`, `pending` (the next
 * route table), the counters (one writer, relaxed), the ICMP limit and the
 * trace ring.
 * Everything allocated here is allocated in dp_loop_new() (the super-packet
 * buffer and the receive slots again in dp_loop_set_offloads(), before the
 * loop runs); the data path never allocates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "internal.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103     /* <linux/udp.h>, Linux >= 4.18 */
#endif

enum dp_loop_limits {
    DP_MTU_MIN = 68,
    DP_MTU_MAX = 65535,
    DP_ROUNDS = 8,          /* batches per direction between two epoll_wait()s */
    DP_GSO_SEGS_MAX = 64,   /* datagrams per UDP_SEGMENT send (the kernel's UDP_MAX_SEGMENTS) */
    DP_GSO_TRAIN_BYTES = 65000,  /* payload of one such send: it is one IPv4 packet until
                                    the kernel cuts it (65507 at most) */
    DP_EPOLL_EVENTS = 3,
    /* UDP_GRO: the largest UDP payload (a train) is 65535 - 8; the slack
     * after each slot lets a trace head be taken from a datagram the kernel
     * cut short without reading past the buffer. */
    DP_RX_GRO_SLOT = 65536,
    DP_RX_SLACK = DP_TRACE_HEAD,
    DP_RX_CTL = 64          /* control buffer per message: one UDP_GRO int */
};

/* <linux/udp.h>; glibc's headers may lack them. */
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum dp_loop_fd { DP_FD_TUN = 1, DP_FD_UDP, DP_FD_WAKE };

/* What one batch found: whether the fd may have more to give right away. */
enum dp_io { DP_IO_IDLE = 0, DP_IO_MORE, DP_IO_ERROR };

struct dp_loop {
    int tun_fd, udp_fd;         /* the caller's; never closed here */
    int ep_fd, wake_fd;         /* ours */
    uint32_t mtu, batch;
    uint32_t offloads;          /* enum dp_offload bits; fixed once the loop runs */

    int stopping;               /* any thread sets it (release); the loop polls it */
    int running;                /* one dp_loop_run() at a time */
    struct dp_routes *pending;  /* published table, exchanged atomically */

    struct dp_path path;        /* counters, table in use, ICMP state, trace */

    /* TUN -> UDP: slot i holds the i-th packet queued for this sendmmsg. */
    uint8_t *tx_buf;
    struct mmsghdr tx_msgs[DP_BATCH_MAX];
    struct iovec tx_iov[DP_BATCH_MAX];
    struct sockaddr_in tx_addr[DP_BATCH_MAX];

    /* TUN -> UDP offloads. DP_OFF_TUN_VNET: a read is the header, then the
     * packet into the free slot and on into vnet_buf + mtu, so a plain packet
     * lands in its slot and a super-packet is made whole in vnet_buf.
     * DP_OFF_UDP_GSO: train t is slots train_first[t].. (train_n[t] of them),
     * sent as one message whose iovecs are those slots' (tx_iov is contiguous). */
    uint8_t vnet_hdr[DP_VNET_HDR_LEN];
    uint8_t *vnet_buf;          /* DP_VNET_PKT_MAX bytes; see dp_loop_set_offloads */
    struct mmsghdr train_msgs[DP_BATCH_MAX];
    uint32_t train_first[DP_BATCH_MAX], train_n[DP_BATCH_MAX];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } train_cmsg[DP_BATCH_MAX];

    /* UDP -> TUN */
    /* UDP -> TUN: slot i receives the i-th message of the recvmmsg; a slot
     * is mtu bytes, or DP_RX_GRO_SLOT with DP_OFF_UDP_GRO (a train). */
    uint8_t *rx_buf;
    uint32_t rx_slot;
    struct mmsghdr rx_msgs[DP_BATCH_MAX];
    struct iovec rx_iov[DP_BATCH_MAX];
    struct sockaddr_in rx_addr[DP_BATCH_MAX];
    union {
        struct cmsghdr align;
        uint8_t buf[DP_RX_CTL];
    } rx_ctl[DP_BATCH_MAX];

    /* DP_OFF_TUN_GRO: the run being coalesced, and one writev's worth. */
    struct dp_gro gro;
    uint8_t gro_vnet[DP_VNET_HDR_LEN];
    uint8_t gro_hdr[DP_GRO_HDR_MAX];
    struct iovec gro_iov[DP_GRO_SEGS_MAX + 2];
};

/* ---- 1. counters, trace, syscalls ---------------------------------------- */

static inline void st_add(struct dp_loop *l, enum dp_stat i, uint64_t n)
{
    dp_path_count(&l->path, i, n);
}

static inline void trace(struct dp_loop *l, uint32_t kind, uint32_t len, uint32_t addr,
                         uint32_t port, uint32_t batch, const uint8_t *head)
{
    dp_path_trace(&l->path, kind, len, addr, port, batch, head);
}

static inline void drop(struct dp_loop *l, enum dp_stat reason, uint32_t len)
{
    dp_path_drop(&l->path, reason, len);
}

static inline void sys_count(struct dp_loop *l, enum dp_stat which)
{
    st_add(l, DP_ST_SYSCALLS, 1);
    st_add(l, which, 1);
}

static inline int is_stopping(struct dp_loop *l)
{
    return __atomic_load_n(&l->stopping, __ATOMIC_ACQUIRE);
}

/* write() to the TUN; a TUN write is all or nothing. EINTR means nothing
 * was written, so retrying it is not a retry of a failed packet. With
 * DP_OFF_TUN_VNET every write starts with a virtio_net_hdr: all zero for a
 * plain packet whose checksums are complete. */
static ssize_t tun_write(struct dp_loop *l, const uint8_t *p, uint32_t len)
{
    static const uint8_t plain_hdr[DP_VNET_HDR_LEN];
    struct iovec iov[2] = {
        { .iov_base = (void *)plain_hdr, .iov_len = sizeof(plain_hdr) },
        { .iov_base = (void *)p, .iov_len = len },
    };
    int vnet = (l->offloads & DP_OFF_TUN_VNET) != 0;
    ssize_t w;

    do {
        sys_count(l, DP_ST_TUN_WRITES);
        w = vnet ? writev(l->tun_fd, iov, 2) : write(l->tun_fd, p, len);
    } while (w < 0 && errno == EINTR);
    return w;
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    /* vDSO on Linux: not a syscall, so it is not counted in `syscalls`. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- 2. route table hand-over -------------------------------------------- */

/* The publisher only ever exchanges `pending`; a table we take out of it is
 * ours alone, and the one we drop can be in use by nobody else. */
static void take_routes(struct dp_loop *l)
{
    struct dp_routes *t;

    if (!__atomic_load_n(&l->pending, __ATOMIC_RELAXED))
        return;
    t = __atomic_exchange_n(&l->pending, NULL, __ATOMIC_ACQ_REL);
    if (!t)
        return;
    dp_routes_free(l->path.routes);
    l->path.routes = t;
    st_add(l, DP_ST_ROUTE_SWAPS, 1);
}

/* ---- 3. ICMP errors ------------------------------------------------------- */

/* path.c built it (and checked the rate limit); we write it. */
static void icmp_send(struct dp_loop *l)
{
    dp_path_icmp_written(&l->path,
                         tun_write(l, l->path.icmp, l->path.icmp_len) < 0 ? errno : 0);
}

/* ---- 4. TUN -> UDP -------------------------------------------------------- */

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
    l->tx_addr[slot].sin_addr.s_addr = hit.peer_ip;
    l->tx_addr[slot].sin_port = htons((uint16_t)hit.port);
    return 1;
}

/* One sendmmsg() for the queued messages from slot i on. The kernel stops
 * at the first message it refuses and reports only how many went before
 * it; so on a short count we call again from there, and the call that
 * starts with the refused message fails with its errno: that one is
 * dropped and skipped. */
static void udp_send_plain(struct dp_loop *l, uint32_t i, uint32_t m)
{
    uint32_t k;
    int r;

    while (i < m) {
        sys_count(l, DP_ST_UDP_SENDS);
        r = sendmmsg(l->udp_fd, &l->tx_msgs[i], m - i, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            drop(l, DP_ST_DROP_SEND_ERROR, (uint32_t)l->tx_iov[i].iov_len);
            i++;
            continue;
        }
        /* batch = the messages handed to this call (all m when none fails). */
        for (k = i; k < i + (uint32_t)r; k++) {
            uint32_t len = (uint32_t)l->tx_iov[k].iov_len;

            st_add(l, DP_ST_UDP_TX_PACKETS, 1);
            st_add(l, DP_ST_UDP_TX_BYTES, len);
            trace(l, DP_TR_UDP_SEND, len, l->tx_addr[k].sin_addr.s_addr,
                  ntohs(l->tx_addr[k].sin_port), m - i, NULL);
        }
        i += (uint32_t)r;
    }
}

/* A train may follow slot k with slot k + 1: same peer, the same length
 * as the train's first (the last of a train may be shorter, and ends it),
 * within the kernel's limits for one UDP_SEGMENT send (64 segments, one
 * IPv4 packet of payload). */
static int train_extends(struct dp_loop *l, uint32_t first, uint32_t k, uint32_t bytes)
{
    const struct sockaddr_in *a = &l->tx_addr[first], *b = &l->tx_addr[k + 1];
    size_t seg = l->tx_iov[first].iov_len, len = l->tx_iov[k + 1].iov_len;

    return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port &&
           l->tx_iov[k].iov_len == seg && len <= seg &&
           k + 1 - first < DP_GSO_SEGS_MAX && bytes + len <= DP_GSO_TRAIN_BYTES;
}

/* Groups slots 0..m-1 into trains; returns how many. A train of one is a
 * plain message, no cmsg: exactly what udp_send_plain sends. */
static uint32_t trains_build(struct dp_loop *l, uint32_t m)
{
    uint32_t t = 0, i = 0, k, bytes;

    while (i < m) {
        struct msghdr *mh = &l->train_msgs[t].msg_hdr;

        bytes = (uint32_t)l->tx_iov[i].iov_len;
        for (k = i; k + 1 < m && train_extends(l, i, k, bytes); k++)
            bytes += (uint32_t)l->tx_iov[k + 1].iov_len;
        memset(mh, 0, sizeof(*mh));
        mh->msg_name = &l->tx_addr[i];
        mh->msg_namelen = sizeof(l->tx_addr[i]);
        mh->msg_iov = &l->tx_iov[i];
        mh->msg_iovlen = k + 1 - i;
        if (k > i) {
            struct cmsghdr *cm = &l->train_cmsg[t].align;
            uint16_t seg = (uint16_t)l->tx_iov[i].iov_len;

            mh->msg_control = l->train_cmsg[t].buf;
            mh->msg_controllen = sizeof(l->train_cmsg[t].buf);
            cm->cmsg_level = IPPROTO_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(seg));
            memcpy(CMSG_DATA(cm), &seg, sizeof(seg));
        }
        l->train_first[t] = i;
        l->train_n[t] = k + 1 - i;
        t++;
        i = k + 1;
    }
    return t;
}

/* DP_OFF_UDP_GSO: one sendmmsg() of trains. A refused train is sent again
 * as plain messages (a single one is just dropped, as by udp_send_plain), so
 * each of its datagrams meets the fate it would have had without GSO. When
 * the kernel cannot segment at all (EIO: the route's device has no tx
 * checksum offload, which UDP_SEGMENT needs; EINVAL: e.g. SO_NO_CHECK, or a
 * segment over the path MTU) UDP_GSO goes off for this loop and everything
 * from that train on goes out plain. */
static void udp_send_gso(struct dp_loop *l, uint32_t m)
{
    uint32_t nt = trains_build(l, m), t = 0, j, k, first, n;
    int r, err;

    while (t < nt) {
        sys_count(l, DP_ST_UDP_SENDS);
        r = sendmmsg(l->udp_fd, &l->train_msgs[t], nt - t, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            err = r < 0 ? errno : 0;
            first = l->train_first[t];
            n = l->train_n[t];
            if (n > 1 && (err == EIO || err == EINVAL)) {
                l->offloads &= ~(uint32_t)DP_OFF_UDP_GSO;
                udp_send_plain(l, first, m);
                return;
            }
            /* Any other refusal: each datagram of the train meets its own
             * fate as a plain message, as it would have without GSO. */
            if (n > 1)
                udp_send_plain(l, first, first + n);
            else
                drop(l, DP_ST_DROP_SEND_ERROR, (uint32_t)l->tx_iov[first].iov_len);
            t++;
            continue;
        }
        for (j = t; j < t + (uint32_t)r; j++) {
            first = l->train_first[j];
            n = l->train_n[j];
            if (n > 1)
                st_add(l, DP_ST_UDP_TX_GSO, 1);
            /* batch = the datagrams handed to this call. */
            for (k = first; k < first + n; k++) {
                uint32_t len = (uint32_t)l->tx_iov[k].iov_len;

                st_add(l, DP_ST_UDP_TX_PACKETS, 1);
                st_add(l, DP_ST_UDP_TX_BYTES, len);
                trace(l, DP_TR_UDP_SEND, len, l->tx_addr[k].sin_addr.s_addr,
                      ntohs(l->tx_addr[k].sin_port), m - l->train_first[t], NULL);
            }
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

/* DP_OFF_TUN_VNET: the read of one packet into slot m (see struct dp_loop). */
static ssize_t tun_read_vnet(struct dp_loop *l, uint32_t m)
{
    struct iovec iov[3] = {
        { .iov_base = l->vnet_hdr, .iov_len = DP_VNET_HDR_LEN },
        { .iov_base = l->tx_buf + (size_t)m * l->mtu, .iov_len = l->mtu },
        { .iov_base = l->vnet_buf + l->mtu, .iov_len = DP_VNET_PKT_MAX - l->mtu },
    };

    return readv(l->tun_fd, iov, 3);
}

/* The r bytes of a DP_OFF_TUN_VNET read into slot m: a plain packet goes
 * on as a plain read would (cut at mtu), after its checksum is finished if
 * the kernel left it partial; a super-packet is cut into segments, each
 * going on as a plain read, flushing the batch whenever the slots run out.
 * Returns the number of slots now queued. */
static uint32_t tun_vnet_packet(struct dp_loop *l, uint32_t r, uint32_t m)
{
    uint8_t *slot = l->tx_buf + (size_t)m * l->mtu;
    struct dp_vnet_hdr h;
    struct dp_gso g;
    uint32_t len, seg;
    int reason;

    if (r < DP_VNET_HDR_LEN) {
        dp_path_tun_drop(&l->path, slot, 0, DP_ST_DROP_MALFORMED);
        return m;
    }
    len = r - DP_VNET_HDR_LEN;
    dp_gso_hdr_parse(l->vnet_hdr, &h);
    if (h.gso_type == DP_VNET_GSO_NONE) {
        if (len > l->mtu)
            len = l->mtu;
        reason = dp_gso_csum(slot, len, &h);
        if (reason) {
            dp_path_tun_drop(&l->path, slot, len, reason);
            return m;
        }
        return m + (uint32_t)tun_packet(l, slot, len, m);
    }

    st_add(l, DP_ST_TUN_RX_GSO, 1);
    memcpy(l->vnet_buf, slot, len < l->mtu ? len : l->mtu);
    reason = dp_gso_start(&g, l->vnet_buf, len, &h, l->mtu);
    if (reason) {
        dp_path_tun_drop(&l->path, l->vnet_buf, len, reason);
        return m;
    }
    while ((seg = dp_gso_next(&g, l->tx_buf + (size_t)m * l->mtu)) != 0) {
        m += (uint32_t)tun_packet(l, l->tx_buf + (size_t)m * l->mtu, seg, m);
        if (m == l->batch) {
            udp_send(l, m);
            m = 0;
        }
    }
    return m;
}

static enum dp_io tun_batch(struct dp_loop *l)
{
    enum dp_io res = DP_IO_MORE;
    uint32_t n = 0, m = 0;
    int vnet = (l->offloads & DP_OFF_TUN_VNET) != 0;
    ssize_t r;

    take_routes(l);
    /* For the ICMP rate limit: one clock read per batch, not per packet. */
    l->path.now_ns = now_ns();
    while (n < l->batch) {
        sys_count(l, DP_ST_TUN_READS);
        r = vnet ? tun_read_vnet(l, m) : read(l->tun_fd, l->tx_buf + (size_t)m * l->mtu, l->mtu);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            res = (errno == EAGAIN || errno == EWOULDBLOCK) ? DP_IO_IDLE : DP_IO_ERROR;
            break;
        }
        n++;
        /* Checked per packet, not only per batch: a packet written into the
         * TUN after set_routes() returned is routed by that table or a newer
         * one, never by an older one. */
        take_routes(l);
        /* A dropped packet leaves its slot free for the next read. */
        if (vnet)
            m = tun_vnet_packet(l, (uint32_t)r, m);
        else if (tun_packet(l, l->tx_buf + (size_t)m * l->mtu, (uint32_t)r, m))
            m++;
    }
    if (n)
        st_add(l, DP_ST_TX_BATCHES, 1);
    if (m)
        udp_send(l, m);
    return res;
}

/* ---- 5. UDP -> TUN -------------------------------------------------------- */

static void tun_write_one(struct dp_loop *l, const uint8_t *p, uint32_t len)
{
    dp_path_tun_written(&l->path, p, len, tun_write(l, p, len) < 0 ? errno : 0);
}

/* Writes the run held, if any: one segment as it is, more as one GSO
 * packet (gro.c). Each segment is counted written, or dropped, on its own:
 * the counters see the packets the peer sent, whatever the syscalls. */
static void gro_flush(struct dp_loop *l)
{
    struct dp_gro *g = &l->gro;
    uint32_t i;
    ssize_t w;
    int err;

    if (g->n == 1) {
        tun_write_one(l, g->seg[0], g->len[0]);
    } else if (g->n > 1) {
        dp_gro_headers(g, l->gro_vnet, l->gro_hdr);
        l->gro_iov[0].iov_base = l->gro_vnet;
        l->gro_iov[0].iov_len = DP_VNET_HDR_LEN;
        l->gro_iov[1].iov_base = l->gro_hdr;
        l->gro_iov[1].iov_len = g->hdr_len;
        for (i = 0; i < g->n; i++) {
            l->gro_iov[i + 2].iov_base = (void *)(g->seg[i] + g->hdr_len);
            l->gro_iov[i + 2].iov_len = g->len[i] - g->hdr_len;
        }
        do {
            sys_count(l, DP_ST_TUN_WRITES);
            w = writev(l->tun_fd, l->gro_iov, (int)g->n + 2);
        } while (w < 0 && errno == EINTR);
        err = w < 0 ? errno : 0;
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

static void udp_datagram(struct dp_loop *l, uint8_t *p, uint32_t len, uint32_t src,
                         uint32_t sport, uint32_t nmsgs, int truncated)
{
    if (dp_path_udp(&l->path, p, len, src, sport, nmsgs, truncated) == DP_V_FORWARD)
        tun_forward(l, p, len);
}

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

/* DP_OFF_UDP_GRO: the message is a train of datagrams of `seg` bytes (the
 * last may be shorter), each handled as if received alone. recvmmsg got
 * MSG_TRUNC, so len is the whole train even if the slot held less. A
 * datagram larger than the mtu is what a plain receive reports as
 * MSG_TRUNC with mtu bytes: so it is counted here, drop_truncated with at
 * most mtu bytes. A datagram the slot could not hold (not with the
 * kernel's 64 KB GRO limit, but a larger gro_max_size allows it) is
 * truncated too; the ones before it are intact and go on as usual. */
static void udp_train(struct dp_loop *l, struct mmsghdr *mh, uint8_t *p, uint32_t src,
                      uint32_t sport, uint32_t nmsgs)
{
    uint32_t len = mh->msg_len, seg = gro_segment_size(&mh->msg_hdr);
    uint32_t copied = len < l->rx_slot ? len : l->rx_slot;
    uint32_t off = 0, n, have;

    if (!seg || seg > len)
        seg = len;
    if (seg < len)
        st_add(l, DP_ST_UDP_RX_GRO, 1);
    do {    /* at least once: an empty datagram is a datagram */
        n = len - off < seg ? len - off : seg;
        have = copied > off ? (copied - off < n ? copied - off : n) : 0;
        if (have == n && n <= l->mtu)
            udp_datagram(l, p + off, n, src, sport, nmsgs, 0);
        else    /* only the trace reads the bytes; the slack keeps it in bounds */
            udp_datagram(l, have ? p + off : NULL, n < l->mtu ? n : l->mtu, src, sport,
                         nmsgs, 1);
        off += n;
    } while (off < len);
}

static void udp_packet(struct dp_loop *l, uint32_t k, uint32_t nmsgs)
{
    struct mmsghdr *mh = &l->rx_msgs[k];
    uint8_t *p = l->rx_iov[k].iov_base;
    uint32_t src = 0, sport = 0;

    if (mh->msg_hdr.msg_namelen >= sizeof(struct sockaddr_in) &&
        l->rx_addr[k].sin_family == AF_INET) {
        src = l->rx_addr[k].sin_addr.s_addr;
        sport = ntohs(l->rx_addr[k].sin_port);
    }
    if (l->offloads & DP_OFF_UDP_GRO)
        udp_train(l, mh, p, src, sport, nmsgs);
    else
        udp_datagram(l, p, mh->msg_len, src, sport, nmsgs,
                     (mh->msg_hdr.msg_flags & MSG_TRUNC) != 0);
}

static enum dp_io udp_batch(struct dp_loop *l)
{
    int gro = (l->offloads & DP_OFF_UDP_GRO) != 0;
    uint32_t k;
    int r;

    take_routes(l);
    do {
        sys_count(l, DP_ST_UDP_RECVS);
        r = recvmmsg(l->udp_fd, l->rx_msgs, l->batch, MSG_DONTWAIT | (gro ? MSG_TRUNC : 0),
                     NULL);
    } while (r < 0 && errno == EINTR);
    if (r <= 0)
        return (r == 0 || errno == EAGAIN || errno == EWOULDBLOCK) ? DP_IO_IDLE : DP_IO_ERROR;

    st_add(l, DP_ST_RX_BATCHES, 1);
    for (k = 0; k < (uint32_t)r; k++) {
        take_routes(l);   /* the source check, too, uses the newest table */
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

/* ---- 6. the loop ---------------------------------------------------------- */

static void wake_drain(struct dp_loop *l)
{
    uint64_t v;

    st_add(l, DP_ST_SYSCALLS, 1);
    if (read(l->wake_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: someone else's wake-up was already consumed; harmless. */
    }
}

int dp_loop_run(dp_loop *l)
{
    struct epoll_event ev[DP_EPOLL_EVENTS];
    int n, i, round, rc = 0;
    enum dp_io tun, udp;
    uint32_t tun_events;

    if (!l)
        return -EINVAL;
    if (__atomic_exchange_n(&l->running, 1, __ATOMIC_ACQ_REL))
        return -EBUSY;

    while (!is_stopping(l)) {
        sys_count(l, DP_ST_POLLS);
        n = epoll_wait(l->ep_fd, ev, DP_EPOLL_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        tun = udp = DP_IO_IDLE;
        tun_events = 0;
        for (i = 0; i < n; i++) {
            switch (ev[i].data.u32) {
            case DP_FD_TUN:
                tun = DP_IO_MORE;
                tun_events = ev[i].events;
                break;
            case DP_FD_UDP:
                udp = DP_IO_MORE;
                break;
            case DP_FD_WAKE:
                wake_drain(l);   /* stop, or a new route table */
                break;
            }
        }
        take_routes(l);
        for (round = 0; round < DP_ROUNDS && (tun == DP_IO_MORE || udp == DP_IO_MORE); round++) {
            if (tun == DP_IO_MORE) {
                tun = tun_batch(l);
                /* A TUN whose device is gone reports EPOLLERR/HUP and fails
                 * every read: take it out of the set rather than spin. */
                if (tun == DP_IO_ERROR && (tun_events & (EPOLLERR | EPOLLHUP))) {
                    st_add(l, DP_ST_SYSCALLS, 1);
                    epoll_ctl(l->ep_fd, EPOLL_CTL_DEL, l->tun_fd, NULL);
                }
            }
            if (is_stopping(l))
                break;
            if (udp == DP_IO_MORE)
                udp = udp_batch(l);
            if (is_stopping(l))
                break;
        }
    }
    __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
    return rc;
}

/* ---- 7. public API -------------------------------------------------------- */

static int wake(dp_loop *l)
{
    uint64_t one = 1;

    /* EAGAIN means the counter is already non-zero: the loop will wake. */
    if (write(l->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        return -errno;
    return 0;
}

int dp_loop_stop(dp_loop *l)
{
    if (!l)
        return -EINVAL;
    __atomic_store_n(&l->stopping, 1, __ATOMIC_RELEASE);
    return wake(l);
}

static int ep_add(int ep_fd, int fd, uint32_t tag)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = tag };

    return epoll_ctl(ep_fd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static void msgs_init(struct mmsghdr *msgs, struct iovec *iov, struct sockaddr_in *addr,
                      uint8_t *buf, uint32_t batch, uint32_t mtu)
{
    uint32_t i;

    for (i = 0; i < batch; i++) {
        iov[i].iov_base = buf + (size_t)i * mtu;
        iov[i].iov_len = mtu;
        addr[i].sin_family = AF_INET;
        msgs[i].msg_hdr.msg_name = &addr[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(addr[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
}

/* Sizes the receive slots for the offloads: mtu bytes each, or a whole
 * UDP_GRO train (and a control buffer for its segment size). Only while
 * the loop does not run; on failure the old slots stay. */
static int rx_setup(struct dp_loop *l, uint32_t offloads)
{
    int gro = (offloads & DP_OFF_UDP_GRO) != 0;
    uint32_t slot = gro ? DP_RX_GRO_SLOT : l->mtu;
    uint32_t stride = gro ? DP_RX_GRO_SLOT + DP_RX_SLACK : l->mtu;
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
    msgs_init(l->rx_msgs, l->rx_iov, l->rx_addr, buf, l->batch, stride);
    for (i = 0; i < l->batch; i++) {
        l->rx_iov[i].iov_len = slot;
        l->rx_msgs[i].msg_hdr.msg_control = gro ? l->rx_ctl[i].buf : NULL;
        l->rx_msgs[i].msg_hdr.msg_controllen = gro ? sizeof(l->rx_ctl[i].buf) : 0;
    }
    return 0;
}

int dp_loop_new(dp_loop **out, int tun_fd, int udp_fd, uint32_t tun_addr,
                uint32_t mtu, uint32_t batch, int accept_any)
{
    struct dp_loop *l;
    int flags, rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (tun_fd < 0 || udp_fd < 0 || tun_fd == udp_fd)
        return -EBADF;
    if (mtu < DP_MTU_MIN || mtu > DP_MTU_MAX || batch < 1 || batch > DP_BATCH_MAX)
        return -EINVAL;

    l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->tun_fd = tun_fd;
    l->udp_fd = udp_fd;
    l->ep_fd = l->wake_fd = -1;
    l->mtu = mtu;
    l->batch = batch;
    dp_path_init(&l->path, tun_addr, accept_any);

    rc = -ENOMEM;
    l->tx_buf = malloc((size_t)batch * mtu);
    if (!l->tx_buf)
        goto err_free;
    msgs_init(l->tx_msgs, l->tx_iov, l->tx_addr, l->tx_buf, batch, mtu);
    if ((rc = rx_setup(l, 0)))
        goto err_free;

    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0)
        goto err_errno;
    l->ep_fd = epoll_create1(EPOLL_CLOEXEC);
    if (l->ep_fd < 0)
        goto err_errno;
    if ((rc = ep_add(l->ep_fd, tun_fd, DP_FD_TUN)) ||
        (rc = ep_add(l->ep_fd, udp_fd, DP_FD_UDP)) ||
        (rc = ep_add(l->ep_fd, l->wake_fd, DP_FD_WAKE)))
        goto err_free;

    /* Last, so that a failure above leaves the caller's fd untouched. Reads
     * must not block: we read until EAGAIN. The UDP socket keeps its mode. */
    flags = fcntl(tun_fd, F_GETFL);
    if (flags < 0 || fcntl(tun_fd, F_SETFL, flags | O_NONBLOCK) < 0)
        goto err_errno;

    *out = l;
    return 0;

err_errno:
    rc = -errno;
err_free:
    dp_loop_free(l);
    return rc;
}

void dp_loop_free(dp_loop *l)
{
    if (!l)
        return;
    if (l->ep_fd >= 0)
        close(l->ep_fd);
    if (l->wake_fd >= 0)
        close(l->wake_fd);
    dp_routes_free(l->path.routes);
    dp_routes_free(__atomic_exchange_n(&l->pending, NULL, __ATOMIC_ACQ_REL));
    free(l->tx_buf);
    free(l->rx_buf);
    free(l->vnet_buf);
    free(l);
}

int dp_loop_set_routes(dp_loop *l, const dp_route *routes, uint32_t n)
{
    struct dp_routes *t;
    int rc;

    if (!l)
        return -EINVAL;
    rc = dp_routes_build(&t, routes, n);
    if (rc)
        return rc;
    /* A table still pending was never taken by the loop (it exchanges
     * `pending` out before using a table), so nobody else holds it. */
    dp_routes_free(__atomic_exchange_n(&l->pending, t, __ATOMIC_ACQ_REL));
    /* Wake the loop so that it adopts the table now, not at the next packet;
     * the table is published either way. */
    wake(l);
    return 0;
}

int dp_loop_stats(dp_loop *l, dp_stats *out)
{
    uint64_t *dst;
    size_t i;

    if (!l || !out)
        return -EINVAL;
    dst = (uint64_t *)out;
    for (i = 0; i < DP_ST_SLOTS; i++)
        dst[i] = __atomic_load_n(&l->path.c.v[i], __ATOMIC_RELAXED);
    return 0;
}

int dp_loop_trace(dp_loop *l, int enable)
{
    if (!l)
        return -EINVAL;
    dp_trace_set(&l->path.trace, enable);
    return 0;
}

int dp_loop_trace_read(dp_loop *l, uint64_t after, dp_trace_event *out, uint32_t max)
{
    if (!l || (!out && max))
        return -EINVAL;
    return dp_trace_read(&l->path.trace, after, out, max);
}

int dp_loop_set_offloads(dp_loop *l, uint32_t flags)
{
    const uint32_t all = DP_OFF_TUN_VNET | DP_OFF_UDP_GSO | DP_OFF_UDP_GRO | DP_OFF_TUN_GRO |
                         DP_OFF_TUN_GRO_UDP;
    int rc;

    if (!l || (flags & ~all))
        return -EINVAL;
    if ((flags & DP_OFF_TUN_GRO) && !(flags & DP_OFF_TUN_VNET))
        return -EINVAL;
    if ((flags & DP_OFF_TUN_GRO_UDP) && !(flags & DP_OFF_TUN_GRO))
        return -EINVAL;
    if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE))
        return -EBUSY;
    /* Room for a super-packet: allocated here, never on the data path. */
    if ((flags & DP_OFF_TUN_VNET) && !l->vnet_buf) {
        l->vnet_buf = malloc(DP_VNET_PKT_MAX);
        if (!l->vnet_buf)
            return -ENOMEM;
    }
    rc = rx_setup(l, flags);
    if (rc)
        return rc;
    dp_gro_reset(&l->gro);
    l->gro.udp = (flags & DP_OFF_TUN_GRO_UDP) != 0;
    l->offloads = flags;
    return 0;
}

int dp_loop_set_icmp_limit(dp_loop *l, uint32_t rate, uint32_t burst)
{
    if (!l)
        return -EINVAL;
    return dp_path_set_icmp_limit(&l->path, rate, burst);
}

/* The stats block is part of the ABI: its size is fixed and the counter
 * indices above must match the field order. */
_Static_assert(sizeof(dp_stats) == 64 * sizeof(uint64_t), "dp_stats is 64 words");
_Static_assert(offsetof(dp_stats, drop_no_route) == DP_ST_DROP_NO_ROUTE * 8, "drop index");
_Static_assert(offsetof(dp_stats, drop_tun_error) == DP_ST_DROP_TUN_ERROR * 8, "drop index");
_Static_assert(offsetof(dp_stats, route_swaps) == DP_ST_ROUTE_SWAPS * 8, "stats index");
_Static_assert(offsetof(dp_stats, icmp_ratelimited) == DP_ST_ICMP_RATELIMITED * 8, "stats index");
_Static_assert(offsetof(dp_stats, tun_tx_gso) == DP_ST_TUN_TX_GSO * 8, "stats index");
_Static_assert(offsetof(dp_stats, reserved) == DP_ST_COUNT * 8, "stats count");
