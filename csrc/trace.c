/*
 * trace.c - the trace ring: what the loop did, packet by packet, for the demo.
 *
 * Flow, in the order the functions appear:
 *   1. dp_trace_init / dp_trace_set   reset; switch on or off (any thread)
 *   2. dp_trace_record                loop thread only: fill the slot of seq
 *                                     widx + 1, then publish widx (release)
 *   3. dp_trace_read                  any thread: copy seq > after, then drop
 *                                     whatever the writer may have overwritten
 *                                     while we copied (a seqlock-style check)
 *
 * One writer, any number of readers, no lock: event seq lives in slot
 * (seq - 1) % DP_TRACE_RING. The ring is off by default; the loop checks the
 * switch before building an event, so tracing costs nothing when off.
 */
#include <string.h>
#include <time.h>

#include "internal.h"

void dp_trace_init(struct dp_trace *tr)
{
    memset(tr, 0, sizeof(*tr));
}

void dp_trace_set(struct dp_trace *tr, int enable)
{
    __atomic_store_n(&tr->enabled, enable ? 1 : 0, __ATOMIC_RELAXED);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    /* vDSO on Linux: not a syscall, so it is not counted in `syscalls`. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void dp_trace_record(struct dp_trace *tr, uint32_t kind, uint32_t len, uint32_t addr,
                     uint32_t port, uint32_t batch, const uint8_t *head, uint32_t head_len)
{
    /* Only this thread writes widx, so a relaxed read of it is exact. */
    uint64_t seq = __atomic_load_n(&tr->widx, __ATOMIC_RELAXED) + 1;
    dp_trace_event *e = &tr->ring[(seq - 1) % DP_TRACE_RING];

    if (!head)
        head_len = 0;
    if (head_len > DP_TRACE_HEAD)
        head_len = DP_TRACE_HEAD;
    e->seq = seq;
    e->ts_ns = now_ns();
    e->kind = kind;
    e->len = len;
    e->addr = addr;
    e->port = port;
    e->batch = batch;
    e->head_len = head_len;
    if (head_len)
        memcpy(e->head, head, head_len);
    if (head_len < DP_TRACE_HEAD)
        memset(e->head + head_len, 0, DP_TRACE_HEAD - head_len);
    __atomic_store_n(&tr->widx, seq, __ATOMIC_RELEASE);
}

int dp_trace_read(const struct dp_trace *tr, uint64_t after, dp_trace_event *out, uint32_t max)
{
    uint64_t w = __atomic_load_n(&tr->widx, __ATOMIC_ACQUIRE);
    uint64_t first = after + 1, s, w2, keep_from;
    uint32_t n = 0, i, skip;

    if (w >= DP_TRACE_RING && first < w - DP_TRACE_RING + 1)
        first = w - DP_TRACE_RING + 1;    /* older events are gone */
    for (s = first; s <= w && n < max; s++)
        memcpy(&out[n++], &tr->ring[(s - 1) % DP_TRACE_RING], sizeof(*out));

    /* While we copied, the writer may have published up to w2 and started on
     * w2 + 1; each of those reuses the slot of seq - DP_TRACE_RING. Keep only
     * events that no such write can have touched. */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    w2 = __atomic_load_n(&tr->widx, __ATOMIC_RELAXED);
    keep_from = w2 + 2 > DP_TRACE_RING ? w2 + 2 - DP_TRACE_RING : 0;
    for (skip = 0; skip < n && (first + skip < keep_from || out[skip].seq != first + skip); skip++)
        ;
    if (skip) {
        for (i = skip; i < n; i++)
            out[i - skip] = out[i];
        n -= skip;
    }
    return (int)n;
}
