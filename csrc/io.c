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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

