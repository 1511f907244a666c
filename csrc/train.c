/*
 * train.c - the buffer arithmetic of UDP trains, both directions; pure, no
 * I/O, no allocation. tx.c and rx.c make the syscalls around it; the fuzzer
 * (csrc/fuzz/fuzz_train.c) and the table test (csrc/fuzz/table_train.c)
 * call it directly.
 *
 * Flow, in the order the functions appear:
 *   1. dp_train_plan       TX, DP_OFF_UDP_GSO: the datagrams queued for one
 *                          sendmmsg grouped into trains, each one message
 *                          with UDP_SEGMENT (tx.c builds the messages)
 *   2. dp_train_rx_slot    RX: how large a receive slot is, with or without
 *                          DP_OFF_UDP_GRO
 *   3. dp_train_cut_start  RX, DP_OFF_UDP_GRO: one received message cut at
 *      dp_train_cut_next   its segment size into the datagrams the peer
 *                          sent, with how much of each the slot holds
 */
#include "internal.h"

/* ---- 1. TX: trains for UDP_SEGMENT ------------------------------------------------ */

/* Slot k + 1 may follow slot k in the train that starts at `first`: same
 * peer, the same length as the train's first (the last of a train may be
 * shorter, and ends it), within the kernel's limits for one UDP_SEGMENT
 * send (64 segments, one IPv4 packet of payload). */
static int extends(const uint32_t *len, const uint64_t *dest, uint32_t first, uint32_t k,
                   uint32_t bytes)
{
    uint32_t seg = len[first];

    return dest[first] == dest[k + 1] && len[k] == seg && len[k + 1] <= seg &&
           k + 1 - first < DP_GSO_SEGS_MAX && bytes + len[k + 1] <= DP_GSO_TRAIN_BYTES;
}

uint32_t dp_train_plan(const uint32_t *len, const uint64_t *dest, uint32_t m,
                       struct dp_train *out)
{
    uint32_t t = 0, i = 0, k, bytes;

    /* Greedy: each train takes every slot that can follow, so a batch of
     * one flow becomes as few sends as the limits allow. */
    while (i < m) {
        bytes = len[i];
        for (k = i; k + 1 < m && extends(len, dest, i, k, bytes); k++)
            bytes += len[k + 1];
        out[t].first = i;
        out[t].n = k + 1 - i;
        t++;
        i = k + 1;
    }
    return t;
}

/* ---- 2. RX: slot sizes ------------------------------------------------------------- */

uint32_t dp_train_rx_slot(uint32_t offloads, uint32_t mtu, uint32_t *stride)
{
    /* A plain receive needs mtu bytes: a longer datagram is MSG_TRUNC,
     * dropped as truncated. A UDP_GRO train is up to 65535 - 8 bytes; the
     * slack after it lets a trace head be taken from a datagram the kernel
     * cut short without reading past the buffer. */
    if (offloads & DP_OFF_UDP_GRO) {
        *stride = DP_RX_GRO_SLOT + DP_RX_SLACK;
        return DP_RX_GRO_SLOT;
    }
    *stride = mtu;
    return mtu;
}

/* ---- 3. RX: a UDP_GRO train cut into datagrams ------------------------------------ */

int dp_train_cut_start(struct dp_train_cut *c, uint32_t len, uint32_t seg, uint32_t room,
                       uint32_t mtu)
{
    /* seg 0 (no UDP_GRO cmsg) or larger than the message: one datagram. */
    if (!seg || seg > len)
        seg = len;
    c->len = len;
    c->seg = seg;
    /* recvmmsg got MSG_TRUNC: len is the whole train even when the slot
     * held less (possible only with a gro_max_size over 64 KB). */
    c->copied = room < len ? room : len;
    c->mtu = mtu;
    c->off = 0;
    c->done = 0;
    return seg < len;
}

int dp_train_cut_next(struct dp_train_cut *c, struct dp_datagram *d)
{
    uint32_t n, have;

    /* At least one datagram, even from an empty message: an empty datagram
     * is a datagram. */
    if (c->done)
        return 0;
    n = c->len - c->off < c->seg ? c->len - c->off : c->seg;
    have = c->copied > c->off ? (c->copied - c->off < n ? c->copied - c->off : n) : 0;
    d->off = c->off;
    if (have == n && n <= c->mtu) {
        d->len = n;
        d->truncated = 0;
        d->has_bytes = 1;
    } else {
        /* What a plain receive reports for it: MSG_TRUNC with at most mtu
         * bytes. Only the trace reads them, and only if the slot holds some
         * (the slack keeps that read in bounds). */
        d->len = n < c->mtu ? n : c->mtu;
        d->truncated = 1;
        d->has_bytes = have != 0;
    }
    c->off += n;
    c->done = c->off >= c->len;
    return 1;
}
