/*
 * fuzz_train.c - libFuzzer target for train.c: the arithmetic of UDP trains
 * in both directions, with arbitrary lengths, peers and segment sizes.
 *
 * Input (short input = zeros):
 *   bytes 0-1   mtu, big-endian, clamped to DP_MTU_MIN..DP_MTU_MAX
 *   byte 2      m, the datagrams queued for one send (at most DP_BATCH_MAX)
 *   m x 3       each: length (2 bytes, cut to the mtu), peer (1 byte, & 3:
 *               few peers, so that trains form and break)
 *   then 7-byte received messages: length (3 bytes, & 0x3ffff: beyond what
 *   one GRO slot holds), segment size (2 bytes), 2 bytes unused
 *
 * Checked, TX (dp_train_plan): the trains cover slots 0..m-1 in order, each
 * goes to one peer, its datagrams have the first's length but the last
 * (which may be shorter), within DP_GSO_SEGS_MAX datagrams and
 * DP_GSO_TRAIN_BYTES bytes unless it is a single one, and no train could
 * have taken the slot that starts the next one (greedy: fewest sends).
 *
 * Checked, RX (dp_train_cut_*): with the slot dp_train_rx_slot gives for
 * DP_OFF_UDP_GRO, the datagrams are contiguous, as many as the segment
 * size makes of the message (one for an empty one), each intact exactly
 * when it fits the mtu and lies wholly in the slot, a truncated one at
 * most mtu long; and reading what rx.c and path.c read of each (all of an
 * intact one, a trace head of a truncated one the slot holds some of) stays
 * inside the slot and its slack (ASan: the buffer is exactly stride bytes).
 */
#include <string.h>

#include "internal.h"
#include "fuzz.h"

static void check_plan(const uint32_t *len, const uint64_t *dest, uint32_t m)
{
    static struct dp_train t[DP_BATCH_MAX];
    uint32_t nt = dp_train_plan(len, dest, m, t), i, j, at = 0, bytes, seg, last;

    CHECK(nt <= m);
    for (i = 0; i < nt; i++) {
        CHECK(t[i].first == at && t[i].n >= 1 && at + t[i].n <= m);
        seg = len[at];
        bytes = 0;
        for (j = at; j < at + t[i].n; j++) {
            CHECK(dest[j] == dest[at]);
            CHECK(j + 1 == at + t[i].n ? len[j] <= seg : len[j] == seg);
            bytes += len[j];
        }
        CHECK(t[i].n == 1 || (t[i].n <= DP_GSO_SEGS_MAX && bytes <= DP_GSO_TRAIN_BYTES));
        at += t[i].n;
        last = at - 1;
        if (at < m)   /* the next slot could not have joined */
            CHECK(dest[at] != dest[t[i].first] || len[last] != seg || len[at] > seg ||
                  t[i].n == DP_GSO_SEGS_MAX || bytes + len[at] > DP_GSO_TRAIN_BYTES);
    }
    CHECK(at == m);
}

static void check_cut(uint32_t len, uint32_t seg, uint32_t mtu)
{
    struct dp_train_cut c;
    struct dp_datagram d[2];
    uint32_t stride, room = dp_train_rx_slot(DP_OFF_UDP_GRO, mtu, &stride);
    uint32_t copied = len < room ? len : room, size = !seg || seg > len ? len : seg;
    uint32_t want = len ? (len + size - 1) / size : 1, got = 0, at = 0, n, k, sum = 0;
    uint8_t *slot = malloc(stride);
    int train, more;

    CHECK(slot && stride - room >= DP_TRACE_HEAD);
    memset(slot, 0x5a, stride);
    train = dp_train_cut_start(&c, len, seg, room, mtu);
    CHECK(train == (want >= 2));
    more = dp_train_cut_next(&c, &d[0]);
    CHECK(more);                                      /* at least one datagram */
    while (more) {
        more = dp_train_cut_next(&c, &d[1]);
        n = (more ? d[1].off : len) - d[0].off;       /* its size on the wire */
        CHECK(d[0].off == at && n <= size && (more ? n == size : 1));
        if (d[0].truncated) {
            CHECK(n > mtu || at + n > copied);
            CHECK(d[0].len == (n < mtu ? n : mtu));
            CHECK(d[0].has_bytes == (at < copied));
        } else {
            CHECK(n <= mtu && at + n <= copied && d[0].len == n && d[0].has_bytes);
        }
        /* What path.c reads: the packet, or a truncated one's trace head. */
        k = d[0].truncated ? (d[0].len < DP_TRACE_HEAD ? d[0].len : DP_TRACE_HEAD) : d[0].len;
        if (d[0].has_bytes)
            while (k--)
                sum += slot[d[0].off + k];
        at += n;
        got++;
        d[0] = d[1];
    }
    CHECK(got == want && at == len);
    CHECK(!dp_train_cut_next(&c, &d[0]));             /* and stays done */
    free(slot);
    (void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint32_t len[DP_BATCH_MAX];
    static uint64_t dest[DP_BATCH_MAX];
    struct reader r = { data, size };
    uint32_t mtu = fuzz_take(&r, 2), m = fuzz_take(&r, 1), i;

    if (mtu < DP_MTU_MIN)
        mtu = DP_MTU_MIN;
    if (m > DP_BATCH_MAX)
        m = DP_BATCH_MAX;
    for (i = 0; i < m; i++) {
        len[i] = fuzz_take(&r, 2) % (mtu + 1);
        dest[i] = fuzz_take(&r, 1) & 3;
    }
    check_plan(len, dest, m);
    while (r.n) {
        uint32_t l = fuzz_take(&r, 3) & 0x3ffff, seg = fuzz_take(&r, 2);

        (void)fuzz_take(&r, 2);
        check_cut(l, seg, mtu);
    }
    return 0;
}
