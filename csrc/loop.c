/*
 * loop.c - the packet loop: epoll over the TUN, the UDP socket (and the
 * IPv6 underlay's, when set) and a stop fd, and the public API of
 * dataplane.h. Each direction is its own file:
 * tx.c (TUN -> UDP) and rx.c (UDP -> TUN); the state they share is in
 * io.h, and what they both do with it in io.c. This file is the top: it
 * calls them, nothing calls back into it.
 *
 * Flow, in the order the functions appear:
 *   1. dp_loop_run          epoll_wait (at most DP_WAKE_MS: the heartbeat
 *                           beats when idle too), then passes: alternate the two
 *                           directions (UDP -> TUN: a batch of each socket),
 *                           one batch each, while there is
 *                           work, at most DP_ROUNDS times, so neither
 *                           direction nor the stop fd starves; with
 *                           coalescing on, a pass that forwarded anything
 *                           is followed by a wait and another pass
 *                           (and end when the TUN is gone)
 *   2. the public API       new/free/stop/set_routes (both families in one
 *                           table)/set_local/stats/
 *                           trace/set_offloads/set_icmp_limit/
 *                           set_strict_sources/set_addr6/set_udp6/state
 *
 * Everything is allocated in dp_loop_new() (the super-packet buffer and the
 * receive slots again in dp_loop_set_offloads(), before the loop runs); the
 * data path never allocates.
 *
 * One piece over 450 lines because the run loop and the public API share
 * one rule, which thread may touch which field and how a change reaches
 * the loop (one atomic exchange or store, read at the next pass), and
 * that rule stays checkable only while both sides of it are in one file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <poll.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "io.h"

/* DP_ROUNDS and DP_DENSE_WAITS are in dataplane.h: the Python engine's loop
 * follows them too. */
enum dp_loop_limits { DP_EPOLL_EVENTS = 4 };

enum dp_loop_fd { DP_FD_TUN = 1, DP_FD_UDP, DP_FD_WAKE, DP_FD_UDP6 };

static inline int is_stopping(struct dp_loop *l)
{
    return __atomic_load_n(&l->stopping, __ATOMIC_ACQUIRE);
}

/* ---- 1. the loop -------------------------------------------------------------------- */

static void wake_drain(struct dp_loop *l)
{
    uint64_t v;

    st_add(l, DP_ST_SYSCALLS, 1);
    if (read(l->wake_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: someone else's wake-up was already consumed; harmless. */
    }
}

/* After a TUN batch that ended in a failed read: EBADFD, or any error
 * while epoll says the fd is broken, means the device is gone. */
static void tun_read_failed(struct dp_loop *l, uint32_t tun_events)
{
    if (l->tun_read_err == EBADFD || (tun_events & (EPOLLERR | EPOLLHUP)))
        l->tun_gone = l->tun_read_err;
}

/* EPOLLERR on a UDP socket: its error queue is emptied (dataplane.h "Path
 * MTU"), else epoll would report it again at once, and the ICMP error
 * pending with it would fail the socket's next call. */
static void errors_seen(struct dp_loop *l, int fd, uint32_t events)
{
    struct dp_errq q;

    if (events & EPOLLERR)
        dp_pmtu_errqueue(l, fd, &q);
}

/* Why the loop ended, for dp_loop_state; before `running` drops. */
static void set_end(struct dp_loop *l, uint32_t end, int err)
{
    __atomic_store_n(&l->end_err, (uint32_t)err, __ATOMIC_RELAXED);
    __atomic_store_n(&l->end, end, __ATOMIC_RELEASE);
}

/* Packets handled so far in both directions (the loop's own counters). */
static inline uint64_t handled(struct dp_loop *l)
{
    return l->path.c.v[DP_ST_TUN_RX_PACKETS] + l->path.c.v[DP_ST_UDP_RX_PACKETS];
}

/* One pass: alternate the directions that may have work, one batch each
 * (UDP -> TUN: one of each socket), at most DP_ROUNDS times. Returns the
 * packets it handled. */
static uint64_t pass(struct dp_loop *l, enum dp_io tun, enum dp_io udp, enum dp_io udp6,
                     uint32_t tun_events)
{
    uint64_t before = handled(l);
    int round;

    /* The heartbeat (dp_state.beats): one writer, read by any thread. Here,
     * not at epoll_wait, so that a loop kept busy by coalescing beats too. */
    __atomic_store_n(&l->beats, l->beats + 1, __ATOMIC_RELAXED);
    dp_io_take_tables(l);
    if (l->udp6_fd < 0)
        udp6 = DP_IO_IDLE;
    for (round = 0; round < DP_ROUNDS &&
                    (tun == DP_IO_MORE || udp == DP_IO_MORE || udp6 == DP_IO_MORE); round++) {
        if (tun == DP_IO_MORE) {
            tun = dp_tx_batch(l);
            if (tun == DP_IO_ERROR)
                tun_read_failed(l, tun_events);
        }
        if (is_stopping(l) || l->tun_gone)
            break;
        if (udp == DP_IO_MORE)
            udp = dp_rx_batch(l, l->udp_fd);
        if (is_stopping(l) || l->tun_gone)
            break;
        if (udp6 == DP_IO_MORE)
            udp6 = dp_rx_batch(l, l->udp6_fd);
        if (is_stopping(l) || l->tun_gone)
            break;
    }
    return handled(l) - before;
}

enum dp_light { DP_LIGHT_TUN = 1, DP_LIGHT_UDP = 2 };

/* Whether a direction is light: at most DP_LIGHT_PACKETS per whole wait of
 * `us`, at the rate it had over the last `ns` (a wait cut short and its
 * pass). A rate, not a count: after a short wait the busy direction has
 * few packets too, and counted it would wake us per packet. */
static inline int light(uint64_t packets, uint64_t ns, uint32_t us)
{
    return packets * us * 1000u <= (uint64_t)DP_LIGHT_PACKETS * (ns ? ns : 1);
}

/* The coalescing wait: the wake fd, and the fd of each direction in
 * `*lights` (light in the last wait and pass), can end it early; a busy
 * direction's packets queue up in the TUN or the socket meanwhile instead of
 * waking us one by one. Then a pass over both, without epoll_wait; it sets
 * `*lights` for the next wait. `*last_work` is when the last pass that
 * forwarded anything ended: the start of this wait, and moved to the end of
 * this pass if it forwarded anything. */
static uint64_t coalesce(struct dp_loop *l, uint32_t us, int *lights, uint64_t *last_work)
{
    struct pollfd pfd[4] = { { .fd = l->wake_fd, .events = POLLIN } };
    struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)us * 1000 };
    short udp_in = (*lights & DP_LIGHT_UDP) ? POLLIN : 0;
    uint64_t tun0, udp0, tun, udp, end;
    struct dp_errq q;
    nfds_t n = 1, k, udp_at;

    if (*lights & DP_LIGHT_TUN)
        pfd[n++] = (struct pollfd){ .fd = l->tun_fd, .events = POLLIN };
    /* A busy socket is watched too, for POLLERR alone (poll reports it
     * whatever the events): errors_seen's work, which epoll_wait does not
     * get to while the passes find work. */
    udp_at = n;
    pfd[n++] = (struct pollfd){ .fd = l->udp_fd, .events = udp_in };
    if (l->udp6_fd >= 0)
        pfd[n++] = (struct pollfd){ .fd = l->udp6_fd, .events = udp_in };
    sys_count(l, DP_ST_COALESCE_WAITS);
    if (ppoll(pfd, n, &ts, NULL) > 0) {
        if (pfd[0].revents & POLLIN)
            wake_drain(l);
        for (k = udp_at; k < n; k++)
            if (pfd[k].revents & POLLERR)
                dp_pmtu_errqueue(l, pfd[k].fd, &q);
    }
    if (is_stopping(l))
        return 0;
    tun0 = l->path.c.v[DP_ST_TUN_RX_PACKETS];
    udp0 = l->path.c.v[DP_ST_UDP_RX_PACKETS];
    pass(l, DP_IO_MORE, DP_IO_MORE, DP_IO_MORE, 0);
    tun = l->path.c.v[DP_ST_TUN_RX_PACKETS] - tun0;
    udp = l->path.c.v[DP_ST_UDP_RX_PACKETS] - udp0;
    end = dp_now_ns();
    *lights = (light(tun, end - *last_work, us) ? DP_LIGHT_TUN : 0) |
              (light(udp, end - *last_work, us) ? DP_LIGHT_UDP : 0);
    if (tun + udp)
        *last_work = end;
    return tun + udp;
}

int dp_loop_run(dp_loop *l)
{
    struct epoll_event ev[DP_EPOLL_EVENTS];
    int n, i, rc = 0;
    enum dp_io tun, udp, udp6;
    uint32_t tun_events, us;
    uint64_t work, now, last_work_ns = 0;
    int lights;

    if (!l)
        return -EINVAL;
    if (__atomic_exchange_n(&l->running, 1, __ATOMIC_ACQ_REL))
        return -EBUSY;
    set_end(l, DP_END_NONE, 0);
    /* This thread's timers fire on time: the default slack (50 us) would
     * stretch every coalescing wait by up to 50 us. Only this thread's. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);

    while (!is_stopping(l) && !l->tun_gone) {
        sys_count(l, DP_ST_POLLS);
        /* Bounded: an idle loop still beats, so that a loop that beats no more
         * is one that hangs (the daemon's liveness, daemon/liveness.py). */
        n = epoll_wait(l->ep_fd, ev, DP_EPOLL_EVENTS, DP_WAKE_MS);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        tun = udp = udp6 = DP_IO_IDLE;
        tun_events = 0;
        for (i = 0; i < n; i++) {
            switch (ev[i].data.u32) {
            case DP_FD_TUN:
                tun = DP_IO_MORE;
                tun_events = ev[i].events;
                break;
            case DP_FD_UDP:
                udp = DP_IO_MORE;
                errors_seen(l, l->udp_fd, ev[i].events);
                break;
            case DP_FD_UDP6:
                udp6 = DP_IO_MORE;
                errors_seen(l, l->udp6_fd, ev[i].events);
                break;
            case DP_FD_WAKE:
                wake_drain(l);   /* stop, or a new route table */
                break;
            }
        }
        work = pass(l, tun, udp, udp6, tun_events);
        us = __atomic_load_n(&l->coalesce_us, __ATOMIC_RELAXED);
        if (!work || !us)
            continue;
        /* Coalescing, once packets come densely (this work within a few
         * waits of the last): while passes find work, wait and look again;
         * a pass that finds nothing hands the wake-ups back to epoll. A
         * lone packet (a ping, a request) finds no wait in its way. */
        now = dp_now_ns();
        if (now - last_work_ns < (uint64_t)us * 1000u * DP_DENSE_WAITS) {
            lights = 0;      /* unknown yet: the first wait holds both */
            while (work && !is_stopping(l) && !l->tun_gone)
                work = coalesce(l, us, &lights, &now);
        }
        last_work_ns = now;
    }
    if (rc)
        set_end(l, DP_END_ERROR, -rc);
    else if (l->tun_gone)
        set_end(l, DP_END_TUN_GONE, l->tun_gone);
    else
        set_end(l, DP_END_STOPPED, 0);
    __atomic_store_n(&l->running, 0, __ATOMIC_RELEASE);
    return rc ? rc : -l->tun_gone;
}

/* ---- 2. public API ------------------------------------------------------------------ */

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
    l->udp6_fd = -1;
    l->df4 = 1;
    l->ep_fd = l->wake_fd = -1;
    l->mtu = mtu;
    l->batch = batch;
    dp_path_init(&l->path, tun_addr, accept_any);

    if ((rc = dp_tx_setup(l)) || (rc = dp_rx_setup(l, 0)))
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
    dp_local_free(l->path.local);
    dp_local_free(__atomic_exchange_n(&l->pending_local, NULL, __ATOMIC_ACQ_REL));
    free(__atomic_exchange_n(&l->pending_addr6, NULL, __ATOMIC_ACQ_REL));
    free(l->tx_buf);
    free(l->rx_buf);
    free(l->vnet_buf);
    free(l);
}

int dp_loop_set_routes(dp_loop *l, const dp_route *routes, uint32_t n,
                       const dp_route6 *routes6, uint32_t n6)
{
    return dp_loops_set_routes(&l, 1, routes, n, routes6, n6);
}

int dp_loops_set_routes(dp_loop *const *loops, uint32_t nloops, const dp_route *routes,
                        uint32_t n, const dp_route6 *routes6, uint32_t n6)
{
    struct dp_routes *t;
    uint32_t i;
    int rc;

    if (!loops || !nloops)
        return -EINVAL;
    for (i = 0; i < nloops; i++)
        if (!loops[i])
            return -EINVAL;
    /* One table for every queue and both families, built before any is
     * published: the slow part must not separate one queue's switch from
     * the next one's, nor IPv4's from IPv6's. */
    rc = dp_routes_build(&t, routes, n, routes6, n6);
    if (rc)
        return rc;
    /* An IPv6 peer needs the socket to reach it on every queue. */
    for (i = 0; i < nloops && dp_routes_peers6(t); i++) {
        if (loops[i]->udp6_fd < 0) {
            dp_routes_free(t);
            return -EINVAL;
        }
    }
    dp_routes_hold(t, nloops - 1);
    /* A table still pending was never taken by its loop (a loop exchanges
     * `pending` out before using a table): we drop that loop's reference.
     * (Dropping is a decrement but for the last holder of an old table.) */
    for (i = 0; i < nloops; i++)
        dp_routes_free(__atomic_exchange_n(&loops[i]->pending, t, __ATOMIC_ACQ_REL));
    /* Wake the loops so that they adopt the table now, not at their next
     * packet; it is published either way. */
    for (i = 0; i < nloops; i++)
        wake(loops[i]);
    return 0;
}

int dp_loop_set_local(dp_loop *l, uint32_t own_net, uint32_t own_prefixlen,
                      const uint32_t *addrs, uint32_t n, const uint8_t *own_net6,
                      uint32_t own_prefixlen6, const uint8_t *addrs6, uint32_t n6)
{
    struct dp_local *s;
    int rc;

    if (!l)
        return -EINVAL;
    rc = dp_local_build(&s, own_net, own_prefixlen, addrs, n, own_net6, own_prefixlen6,
                        addrs6, n6);
    if (rc)
        return rc;
    /* As dp_loop_set_routes: a set still pending was never taken. */
    dp_local_free(__atomic_exchange_n(&l->pending_local, s, __ATOMIC_ACQ_REL));
    wake(l);
    return 0;
}

/* Sixteen bytes could be read torn if stored in place while the loop reads
 * them, so they are handed over as a table is. */
int dp_loop_set_addr6(dp_loop *l, const uint8_t *addr6)
{
    uint8_t *a;

    if (!l || !addr6)
        return -EINVAL;
    a = malloc(DP_IP6_ADDR);
    if (!a)
        return -ENOMEM;
    memcpy(a, addr6, DP_IP6_ADDR);
    free(__atomic_exchange_n(&l->pending_addr6, a, __ATOMIC_ACQ_REL));
    wake(l);
    return 0;
}

/* The receive slots and the send path serve both sockets, so all this
 * takes is the fd and its place in the epoll set. */
int dp_loop_set_udp6(dp_loop *l, int fd)
{
    int rc;

    if (!l)
        return -EINVAL;
    if (__atomic_load_n(&l->running, __ATOMIC_ACQUIRE) || l->udp6_fd >= 0)
        return -EBUSY;
    if (fd < 0 || fd == l->tun_fd || fd == l->udp_fd)
        return -EBADF;
    if ((rc = ep_add(l->ep_fd, fd, DP_FD_UDP6)))
        return rc;
    l->udp6_fd = fd;
    return 0;
}

int dp_loop_set_strict_sources(dp_loop *l, int enable)
{
    if (!l)
        return -EINVAL;
    __atomic_store_n(&l->path.strict_sources, enable != 0, __ATOMIC_RELAXED);
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
    if ((rc = dp_tx_set_offloads(l, flags)) || (rc = dp_rx_setup(l, flags)))
        return rc;
    dp_gro_reset(&l->gro);
    l->gro.udp = (flags & DP_OFF_TUN_GRO_UDP) != 0;
    __atomic_store_n(&l->offloads, flags, __ATOMIC_RELAXED);
    return 0;
}

int dp_loop_state(dp_loop *l, dp_state *out)
{
    if (!l || !out)
        return -EINVAL;
    memset(out, 0, sizeof(*out));
    out->end = __atomic_load_n(&l->end, __ATOMIC_ACQUIRE);
    out->err = __atomic_load_n(&l->end_err, __ATOMIC_RELAXED);
    out->offloads = __atomic_load_n(&l->offloads, __ATOMIC_RELAXED);
    out->beats = __atomic_load_n(&l->beats, __ATOMIC_RELAXED);
    return 0;
}

int dp_loop_set_coalesce(dp_loop *l, uint32_t usecs)
{
    if (!l || usecs > DP_COALESCE_MAX_US)
        return -EINVAL;
    __atomic_store_n(&l->coalesce_us, usecs, __ATOMIC_RELAXED);
    return 0;
}

int dp_loop_set_icmp_limit(dp_loop *l, uint32_t rate, uint32_t burst)
{
    if (!l)
        return -EINVAL;
    return dp_path_set_icmp_limit(&l->path, rate, burst);
}

/* The stats block is part of the ABI: its size is fixed and the counter
 * indices of internal.h must match the field order. */
_Static_assert(sizeof(dp_stats) == 64 * sizeof(uint64_t), "dp_stats is 64 words");
_Static_assert(offsetof(dp_stats, drop_no_route) == DP_ST_DROP_NO_ROUTE * 8, "drop index");
_Static_assert(offsetof(dp_stats, drop_tun_error) == DP_ST_DROP_TUN_ERROR * 8, "drop index");
_Static_assert(offsetof(dp_stats, route_swaps) == DP_ST_ROUTE_SWAPS * 8, "stats index");
_Static_assert(offsetof(dp_stats, icmp_ratelimited) == DP_ST_ICMP_RATELIMITED * 8, "stats index");
_Static_assert(offsetof(dp_stats, tun_tx_gso) == DP_ST_TUN_TX_GSO * 8, "stats index");
_Static_assert(offsetof(dp_stats, udp_gso_fallbacks) == DP_ST_UDP_GSO_FALLBACKS * 8, "stats index");
_Static_assert(offsetof(dp_stats, drop_inner_local) == DP_ST_DROP_INNER_LOCAL * 8, "drop index");
_Static_assert(offsetof(dp_stats, drop_inner_foreign) == DP_ST_DROP_INNER_FOREIGN * 8,
               "drop index");
_Static_assert(offsetof(dp_stats, coalesce_waits) == DP_ST_COALESCE_WAITS * 8, "stats index");
_Static_assert(offsetof(dp_stats, drop_scope) == DP_ST_DROP_SCOPE * 8, "drop index");
_Static_assert(offsetof(dp_stats, drop_too_big) == DP_ST_DROP_TOO_BIG * 8, "drop index");
_Static_assert(offsetof(dp_stats, icmp_too_big_sent) == DP_ST_ICMP_TOO_BIG_SENT * 8,
               "stats index");
_Static_assert(offsetof(dp_stats, v6_tun_rx_packets) == DP_ST_V6_TUN_RX_PACKETS * 8,
               "stats index");
_Static_assert(offsetof(dp_stats, v6_drop_inner_foreign) == DP_ST_V6_DROP_INNER_FOREIGN * 8,
               "stats index");
_Static_assert(offsetof(dp_stats, udp_tx_fragmented) == DP_ST_UDP_TX_FRAGMENTED * 8,
               "stats index");
_Static_assert(offsetof(dp_stats, reserved) == DP_ST_COUNT * 8, "stats count");
_Static_assert(sizeof(dp_state) == 8 * sizeof(uint32_t), "dp_state is 8 words");
/* dp_route6 is read from Python's ROUTE6_DTYPE array as it is (native.py
 * checks the same from its side). */
_Static_assert(sizeof(dp_route6) == 48 && offsetof(dp_route6, prefixlen) == 32 &&
               offsetof(dp_route6, mtu) == 40 && offsetof(dp_route6, reserved) == 44,
               "dp_route6 layout");
