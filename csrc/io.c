/*
 * io.c - what both directions of a loop share, below them both: tx.c and
 * rx.c call in here and never into each other or up into loop.c (as kernel
 * WireGuard's send.c and receive.c share queueing.c and peer.c).
 *
 * Flow, in the order the functions appear:
 *   1. dp_io_take_tables  at the start of each batch and before each
 *                         packet, adopt a published route table,
 *                         own-source set and ICMPv6 source (loop.c
 *                         publishes them)
 *   2. dp_io_msgs_init    the message slots of a sendmmsg or a recvmmsg
 *   3. dp_io_tun_write    write() to the TUN (with DP_OFF_TUN_VNET behind a
 *                         plain virtio_net_hdr): rx.c's forwarded packets
 *                         and tx.c's ICMP errors
 *   4. dp_io_errqueue     a UDP socket's error queue, emptied: tx.c's refused
 *                         sends, loop.c's EPOLLERR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/errqueue.h>

#include "io.h"

/* ---- 1. route table hand-over ------------------------------------------------------- */

/* The publisher only ever exchanges `pending`; a table we take out of it is
 * ours alone, and the one we drop can be in use by nobody else. The same
 * holds for `pending_local` and `pending_addr6`. */
void dp_io_take_tables(struct dp_loop *l)
{
    struct dp_routes *t;
    struct dp_local *s;
    uint8_t *a;

    if (__atomic_load_n(&l->pending_addr6, __ATOMIC_RELAXED) &&
        (a = __atomic_exchange_n(&l->pending_addr6, NULL, __ATOMIC_ACQ_REL))) {
        memcpy(l->path.tun_addr6, a, sizeof(l->path.tun_addr6));
        free(a);
    }
    if (__atomic_load_n(&l->pending_local, __ATOMIC_RELAXED) &&
        (s = __atomic_exchange_n(&l->pending_local, NULL, __ATOMIC_ACQ_REL))) {
        dp_local_free(l->path.local);
        l->path.local = s;
    }
    if (!__atomic_load_n(&l->pending, __ATOMIC_RELAXED))
        return;
    t = __atomic_exchange_n(&l->pending, NULL, __ATOMIC_ACQ_REL);
    if (!t)
        return;
    dp_routes_free(l->path.routes);
    l->path.routes = t;
    st_add(l, DP_ST_ROUTE_SWAPS, 1);
}

/* ---- 2. message slots --------------------------------------------------------------- */

void dp_io_msgs_init(struct mmsghdr *msgs, struct iovec *iov, union dp_sockaddr *addr,
                     uint8_t *buf, uint32_t batch, uint32_t stride)
{
    uint32_t i;

    for (i = 0; i < batch; i++) {
        iov[i].iov_base = buf + (size_t)i * stride;
        iov[i].iov_len = stride;
        addr[i].v4.sin_family = AF_INET;
        msgs[i].msg_hdr.msg_name = &addr[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(addr[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
}

/* ---- 3. TUN writes ------------------------------------------------------------------ */

/* A TUN write is all or nothing. EINTR means nothing was written, so
 * retrying it is not a retry of a failed packet. With DP_OFF_TUN_VNET
 * every write starts with a virtio_net_hdr: all zero for a plain packet
 * whose checksums are complete. */
ssize_t dp_io_tun_write(struct dp_loop *l, const uint8_t *p, uint32_t len)
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
    if (w < 0)
        tun_failed(l, errno);
    return w;
}

/* ---- 4. error queues ---------------------------------------------------------------- */

/* With IP_RECVERR / IPV6_RECVERR the kernel queues every error of the
 * socket, its own refusals (SO_EE_ORIGIN_LOCAL, ee_info the path MTU of an
 * EMSGSIZE) and the network's ICMP errors; an ICMP error also stays pending
 * (sk_err) for the next call, which it fails, until the queue is read. No
 * payload is wanted: the control message says it all. */
void dp_io_errqueue(struct dp_loop *l, int fd, struct dp_errq *q)
{
    union {
        struct cmsghdr align;
        uint8_t buf[CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
    } ctl;
    struct sock_extended_err ee;
    struct msghdr mh;
    struct cmsghdr *cm;
    uint32_t k;

    q->mtu = 0;
    q->network = 0;
    for (k = 0; k < DP_ERRQ_MAX; k++) {
        memset(&mh, 0, sizeof(mh));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        sys_count(l, DP_ST_UDP_RECVS);
        if (recvmsg(fd, &mh, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
            if (errno == EINTR)
                continue;
            return;             /* EAGAIN: empty */
        }
        for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (!((cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_RECVERR) ||
                  (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_RECVERR)) ||
                cm->cmsg_len < CMSG_LEN(sizeof(ee)))
                continue;
            memcpy(&ee, CMSG_DATA(cm), sizeof(ee));
            if (ee.ee_origin == SO_EE_ORIGIN_LOCAL && ee.ee_errno == EMSGSIZE)
                q->mtu = ee.ee_info;
            else if (ee.ee_origin == SO_EE_ORIGIN_ICMP || ee.ee_origin == SO_EE_ORIGIN_ICMP6)
                q->network = 1;
        }
    }
}
