/*
 * pmtu.c - what a send the kernel refused becomes (dataplane.h "Path MTU"),
 * below tx.c: the error queue of a UDP socket, read for the path MTU the
 * kernel learnt (and emptied on EPOLLERR for loop.c), the probe of an inner
 * IPv6 datagram to an IPv4 peer, and the verdict: sent after all, packet
 * too big (path.c builds it), or dropped. Only a refused send and an
 * EPOLLERR come here: nothing on the path of a packet that goes through.
 *
 * Flow, in the order the functions appear:
 *   1. dp_pmtu_errqueue   empty a socket's error queue: the path MTU of
 *                         the kernel's own EMSGSIZE, and whether the
 *                         network reported an error
 *   2. too_big, probe4    packet too big of a path MTU; IPv4's probe
 *   3. dp_pmtu_refused    the verdict on a refused message
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>             /* struct timespec, for <linux/errqueue.h> */
#include <linux/errqueue.h>

#include "io.h"

/* ---- 1. error queues ---------------------------------------------------------------- */

/* With IP_RECVERR / IPV6_RECVERR the kernel queues every error of the
 * socket, its own refusals (SO_EE_ORIGIN_LOCAL, ee_info the path MTU of an
 * EMSGSIZE) and the network's ICMP errors; an ICMP error also stays pending
 * (sk_err) for the next call, which it fails, until the queue is read. No
 * payload is wanted, the control message says it all; but one byte is
 * asked for, as QEMU's user mode answers a receive of no iovec with 0 and
 * no call at all. */
void dp_pmtu_errqueue(struct dp_loop *l, int fd, struct dp_errq *q)
{
    union {
        struct cmsghdr align;
        uint8_t buf[CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
    } ctl;
    struct sock_extended_err ee;
    struct msghdr mh;
    struct cmsghdr *cm;
    uint8_t byte;
    struct iovec iov = { .iov_base = &byte, .iov_len = sizeof(byte) };
    uint32_t k;

    q->mtu = 0;
    q->network = 0;
    for (k = 0; k < DP_ERRQ_MAX; k++) {
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
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

/* ---- 2. packet too big, IPv4's probe ----------------------------------------------- */

/* Slot i once more, the kernel allowed to fragment it: udp_fd's own
 * setting (the message has no cmsg left), udp6_fd in IPV6_PMTUDISC_WANT
 * for this send alone. */
static int fragmented(struct dp_loop *l, uint32_t i)
{
    struct msghdr *mh = &l->tx_msgs[i].msg_hdr;
    int v6 = l->tx_addr[i].sa.sa_family == AF_INET6, fd = v6 ? l->udp6_fd : l->udp_fd;
    int want = IPV6_PMTUDISC_WANT, old = IPV6_PMTUDISC_DO;
    socklen_t olen = sizeof(old);
    ssize_t r;

    mh->msg_control = NULL;
    mh->msg_controllen = 0;
    if (v6) {
        st_add(l, DP_ST_SYSCALLS, 2);
        getsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &old, &olen);
        setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &want, sizeof(want));
    }
    do {
        sys_count(l, DP_ST_UDP_SENDS);
        r = sendmsg(fd, mh, 0);
    } while (r < 0 && errno == EINTR);
    if (v6) {
        st_add(l, DP_ST_SYSCALLS, 1);
        setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &old, sizeof(old));
    }
    if (r < 0)
        return 0;
    st_add(l, DP_ST_UDP_TX_FRAGMENTED, 1);
    return 1;
}

/* Slot i, refused over path MTU path_mtu (hdrs: the outer headers). An
 * inner IPv6 packet of at most DP_MTU6_MIN, which its sender may always
 * send, is sent fragmented, as a tunnel entry does (RFC 2473 7.1); any
 * other path.c judges. */
static enum dp_pmtu too_big(struct dp_loop *l, uint32_t i, uint32_t path_mtu, uint32_t hdrs)
{
    uint8_t *p = l->tx_iov[i].iov_base;
    uint32_t len = (uint32_t)l->tx_iov[i].iov_len;

    if (len <= DP_MTU6_MIN && len >= DP_IP6_HDR && p[0] >> 4 == 6) {
        if (fragmented(l, i))
            return DP_PMTU_SENT;
        drop(l, DP_ST_DROP_SEND_ERROR, p, len);
        return DP_PMTU_DROPPED;
    }
    return dp_path_too_big(&l->path, p, len, path_mtu, hdrs) == DP_V_ICMP ? DP_PMTU_ICMP :
                                                                            DP_PMTU_DROPPED;
}

/* A socket option of the probe below; its syscall counted. */
static int sockopt(struct dp_loop *l, int name, int val)
{
    st_add(l, DP_ST_SYSCALLS, 1);
    return setsockopt(l->udp_fd, IPPROTO_IP, name, &val, sizeof(val));
}

/* Slot i, an inner IPv6 packet to an IPv4 peer, was refused with err while
 * it carried its "don't fragment": when err may be about its size or the
 * cmsg, sent again plain, with udp_fd in IP_PMTUDISC_DO and IP_RECVERR for
 * this send only, so that the kernel either sends it or puts the path MTU
 * on the error queue (dataplane.h "Path MTU"). */
static enum dp_pmtu probe4(struct dp_loop *l, uint32_t i, int err)
{
    struct msghdr *mh = &l->tx_msgs[i].msg_hdr;
    uint8_t *p = l->tx_iov[i].iov_base;
    uint32_t len = (uint32_t)l->tx_iov[i].iov_len;
    int old = IP_PMTUDISC_WANT, e = 0;
    socklen_t olen = sizeof(old);
    struct dp_errq q = { 0, 0 };
    ssize_t r;

    if (err != EMSGSIZE && err != EINVAL && err != EIO) {     /* not about the size */
        drop(l, DP_ST_DROP_SEND_ERROR, p, len);
        return DP_PMTU_DROPPED;
    }
    st_add(l, DP_ST_SYSCALLS, 1);
    getsockopt(l->udp_fd, IPPROTO_IP, IP_MTU_DISCOVER, &old, &olen);
    mh->msg_control = NULL;
    mh->msg_controllen = 0;
    if (sockopt(l, IP_RECVERR, 1) < 0 || sockopt(l, IP_MTU_DISCOVER, IP_PMTUDISC_DO) < 0) {
        e = errno;
    } else {
        do {
            sys_count(l, DP_ST_UDP_SENDS);
            r = sendmsg(l->udp_fd, mh, 0);
        } while (r < 0 && errno == EINTR);
        e = r < 0 ? errno : 0;
        if (e == EMSGSIZE)
            dp_pmtu_errqueue(l, l->udp_fd, &q);
    }
    sockopt(l, IP_MTU_DISCOVER, old);
    sockopt(l, IP_RECVERR, 0);
    if (!e) {
        if (err != EMSGSIZE)
            l->df4 = 0;         /* the kernel refused the cmsg itself */
        return DP_PMTU_SENT;
    }
    if (e == EMSGSIZE && q.mtu)
        return too_big(l, i, q.mtu, DP_UNDERLAY4_HDRS);
    drop(l, DP_ST_DROP_SEND_ERROR, p, len);
    return DP_PMTU_DROPPED;
}

/* ---- 3. the verdict -------------------------------------------------------------------- */

/* Slot i was refused with err (0: no errno). On the IPv6 underlay its error
 * queue says why: over the path MTU, the packet's sender learns that MTU;
 * an ICMP error of the network that the kernel handed to this send, the
 * message goes once more. An inner IPv6 packet to an IPv4 peer is probed.
 * Else it is dropped. */
enum dp_pmtu dp_pmtu_refused(struct dp_loop *l, uint32_t i, int err)
{
    struct msghdr *mh = &l->tx_msgs[i].msg_hdr;
    uint8_t *p = l->tx_iov[i].iov_base;
    uint32_t len = (uint32_t)l->tx_iov[i].iov_len;
    struct dp_errq q;
    int again = 1;
    ssize_t r;

    if (mh->msg_controllen)
        return probe4(l, i, err);
    while (l->tx_addr[i].sa.sa_family == AF_INET6) {
        dp_pmtu_errqueue(l, l->udp6_fd, &q);
        if (err == EMSGSIZE && q.mtu)
            return too_big(l, i, q.mtu, DP_UNDERLAY6_HDRS);
        if (!q.network || !again--)
            break;
        do {
            sys_count(l, DP_ST_UDP_SENDS);
            r = sendmsg(l->udp6_fd, mh, 0);
        } while (r < 0 && errno == EINTR);
        if (r >= 0)
            return DP_PMTU_SENT;
        err = errno;
    }
    drop(l, DP_ST_DROP_SEND_ERROR, p, len);
    return DP_PMTU_DROPPED;
}
