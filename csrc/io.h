/*
 * io.h - the state of one packet loop, and what the files that make its
 * syscalls share: loop.c (setup, epoll, the public API) on top, the two
 * directions below it, tx.c (TUN -> UDP) and rx.c (UDP -> TUN), pmtu.c
 * under tx.c (a refused send, the error queues), and io.c below them all
 * (table hand-over, message slots, TUN writes). A file calls
 * only into files below it: the directions never call each other nor
 * loop.c (tests/unit/test_c_layers.py checks it). The pure files (path.c,
 * gso.c, gro.c, train.c, ...) never see this header: they take buffers,
 * not a loop.
 *
 * Threads: one loop thread runs dp_loop_run(); control calls come from any
 * thread. What crosses threads is atomic: `stopping`, `pending`,
 * `pending_local` and `pending_addr6` (the next route table, own-source set
 * and ICMPv6 source), the counters
 * (one writer, relaxed), the heartbeat `beats` (the same), the ICMP limit,
 * the strict switch and the trace ring.
 */
#ifndef DP_IO_H
#define DP_IO_H

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "internal.h"

/* What one batch found: whether the fd may have more to give right away. */
enum dp_io { DP_IO_IDLE = 0, DP_IO_MORE, DP_IO_ERROR };

enum dp_loop_sizes {
    DP_RX_CTL = 64          /* control buffer per received message: one UDP_GRO int */
};

/* A message's peer on either underlay: sa_family says which, and so which
 * socket (udp_fd for AF_INET, udp6_fd for AF_INET6). */
union dp_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
};

/* A message's UDP_SEGMENT control message (tx.c). */
union dp_seg_cmsg {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
};

struct dp_loop {
    int tun_fd, udp_fd;         /* the caller's; never closed here */
    int udp6_fd;                /* the caller's IPv6 underlay socket; -1 = none */
    int ep_fd, wake_fd;         /* ours */
    uint32_t mtu, batch;
    uint32_t offloads;          /* enum dp_offload bits; fixed once the loop runs
                                   (but tx.c may drop DP_OFF_UDP_GSO); written by
                                   the loop, read by dp_loop_state (atomic) */

    int stopping;               /* any thread sets it (release); the loop polls it */
    uint32_t coalesce_us;       /* dp_loop_set_coalesce; any thread sets it (relaxed) */
    int running;                /* one dp_loop_run() at a time */
    int tun_read_err;           /* errno of the batch's failed TUN read (loop thread) */
    int tun_gone;               /* errno that says the TUN has no device (loop thread) */
    uint32_t end, end_err;      /* enum dp_loop_end and its errno, for dp_loop_state */
    uint32_t beats;             /* dp_state.beats: the loop writes it, any thread reads */
    struct dp_routes *pending;  /* published table (both families), exchanged atomically */
    struct dp_local *pending_local;   /* published own sources of both families, the same way */
    uint8_t *pending_addr6;     /* published source of ICMPv6 errors (16 bytes), the same way */

    struct dp_path path;        /* counters, table in use, ICMP state, trace */

    /* TUN -> UDP (tx.c): slot i holds the i-th packet queued for this
     * sendmmsg, at tx_buf + i * mtu. */
    uint8_t *tx_buf;
    struct mmsghdr tx_msgs[DP_BATCH_MAX];
    struct iovec tx_iov[DP_BATCH_MAX];
    union dp_sockaddr tx_addr[DP_BATCH_MAX];
    /* An inner IPv6 packet to an IPv4 peer carries UDP_SEGMENT = its length:
     * IPv4's "don't fragment" for one datagram (dataplane.h "Path MTU"),
     * while df4 holds (the kernel took the cmsg so far). */
    union dp_seg_cmsg tx_df[DP_BATCH_MAX];
    int df4;

    /* DP_OFF_TUN_VNET: a read is scattered over vnet_hdr, the free slot and
     * vnet_buf (dp_gso_scatter). DP_OFF_UDP_GSO: the batch planned as trains
     * (dp_train_plan over train_len/train_dest), train t sent as
     * train_msgs[t] whose iovecs are its slots' (tx_iov is contiguous). */
    uint8_t vnet_hdr[DP_VNET_HDR_LEN];
    uint8_t *vnet_buf;          /* DP_VNET_PKT_MAX bytes; see dp_loop_set_offloads */
    uint32_t train_len[DP_BATCH_MAX];
    uint64_t train_dest[DP_BATCH_MAX];
    struct dp_train trains[DP_BATCH_MAX];
    struct mmsghdr train_msgs[DP_BATCH_MAX];
    union dp_seg_cmsg train_cmsg[DP_BATCH_MAX];

    /* UDP -> TUN (rx.c): slot i receives the i-th message of the recvmmsg;
     * its size is dp_train_rx_slot's. */
    uint8_t *rx_buf;
    uint32_t rx_slot;
    struct mmsghdr rx_msgs[DP_BATCH_MAX];
    struct iovec rx_iov[DP_BATCH_MAX];
    union dp_sockaddr rx_addr[DP_BATCH_MAX];
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

/* Counters and trace, through the path's (one writer: the loop thread). */
static inline void st_add(struct dp_loop *l, enum dp_stat i, uint64_t n)
{
    dp_path_count(&l->path, i, n);
}

static inline void trace(struct dp_loop *l, uint32_t kind, uint32_t len, uint32_t addr,
                         uint32_t port, uint32_t batch, const uint8_t *head)
{
    dp_path_trace(&l->path, kind, len, addr, port, batch, head);
}

static inline void drop(struct dp_loop *l, enum dp_stat reason, const uint8_t *p, uint32_t len)
{
    dp_path_drop(&l->path, reason, p, len);
}

/* Every syscall bumps `syscalls` and its own counter. */
static inline void sys_count(struct dp_loop *l, enum dp_stat which)
{
    st_add(l, DP_ST_SYSCALLS, 1);
    st_add(l, which, 1);
}

/* A TUN read or write failed with err: EBADFD is the tun driver's answer
 * for an fd whose device is gone; the loop ends after this batch. */
static inline void tun_failed(struct dp_loop *l, int err)
{
    if (err == EBADFD)
        l->tun_gone = err;
}

/* io.c: adopt a published route table and own-source set, if any (one
 * relaxed load each when none); at the start of each batch and before each
 * packet. */
void dp_io_take_tables(struct dp_loop *l);
/* io.c: one message per slot of buf (stride bytes apart), addressed by addr[i]
 * (AF_INET until set otherwise). */
void dp_io_msgs_init(struct mmsghdr *msgs, struct iovec *iov, union dp_sockaddr *addr,
                     uint8_t *buf, uint32_t batch, uint32_t stride);
/* io.c: one write into the TUN (forwarded packets, ICMP errors); write()'s result. */
ssize_t dp_io_tun_write(struct dp_loop *l, const uint8_t *p, uint32_t len);

/* pmtu.c: what a socket's error queue held (dataplane.h "Path MTU"): mtu,
 * the path MTU of the last local EMSGSIZE (0: none); network, whether an
 * error came from the network (ICMP or ICMPv6). */
struct dp_errq {
    uint32_t mtu;
    int network;
};
/* pmtu.c: empty fd's error queue (at most DP_ERRQ_MAX reads) into *q. */
void dp_pmtu_errqueue(struct dp_loop *l, int fd, struct dp_errq *q);
/* pmtu.c: what tx.c's refused message i (err: its errno, 0 for none)
 * became: sent on a second try (to be counted as sent), an ICMP error in
 * l->path.icmp (to be written), or dropped and counted. */
enum dp_pmtu { DP_PMTU_DROPPED = 0, DP_PMTU_SENT, DP_PMTU_ICMP };
enum dp_pmtu dp_pmtu_refused(struct dp_loop *l, uint32_t i, int err);

/* tx.c: TUN -> UDP. */
int dp_tx_setup(struct dp_loop *l);
/* Room for a super-packet when DP_OFF_TUN_VNET is asked for; before the loop runs. */
int dp_tx_set_offloads(struct dp_loop *l, uint32_t offloads);
enum dp_io dp_tx_batch(struct dp_loop *l);

/* rx.c: UDP -> TUN. Setup sizes the receive slots for the offloads; on
 * failure the old ones stay. A batch reads one socket, udp_fd or udp6_fd:
 * the slots serve each in turn. */
int dp_rx_setup(struct dp_loop *l, uint32_t offloads);
enum dp_io dp_rx_batch(struct dp_loop *l, int fd);

#endif
