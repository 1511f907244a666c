/*
 * trace.c - the trace ring: what the loop did, packet by packet, for the demo.
 *
 * Flow, in the order the functions appear:
 *   1. dp_trace_init / dp_trace_set   reset; switch on or off (any thread)
 *   2. dp_trace_record                loop thread only: fill the slot of seq
 *                                     widx + 1 (slot seq 0 while writing), then
 *                                     publish the slot seq and widx (release)
 *   3. dp_trace_read                  any thread: copy seq > after, keeping a
 *                                     copy only if its slot held that seq
 *                                     before and after (a per-slot seqlock)
 *
 * One writer, any number of readers, no lock: event seq lives in slot
 * (seq - 1) % DP_TRACE_RING. The ring is off by default; the loop checks the
 * switch before building an event, so tracing costs nothing when off.
 */
#include <string.h>

#include "internal.h"

void dp_trace_init(struct dp_trace *tr)
{
    memset(tr, 0, sizeof(*tr));
}

void dp_trace_set(struct dp_trace *tr, int enable)
{
    __atomic_store_n(&tr->enabled, enable ? 1 : 0, __ATOMIC_RELAXED);
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
    /* seq 0 marks the slot as being rewritten for readers that copy it now. */
    __atomic_store_n(&e->seq, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    e->ts_ns = dp_now_ns();
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
    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
    __atomic_store_n(&tr->widx, seq, __ATOMIC_RELEASE);
}

int dp_trace_read(const struct dp_trace *tr, uint64_t after, dp_trace_event *out, uint32_t max)
{
    uint64_t w = __atomic_load_n(&tr->widx, __ATOMIC_ACQUIRE);
    uint64_t first = after + 1, s;
    uint32_t n = 0;

    if (w >= DP_TRACE_RING && first < w - DP_TRACE_RING + 1)
        first = w - DP_TRACE_RING + 1;    /* older events are gone */
    for (s = first; s <= w && n < max; s++) {
        const dp_trace_event *e = &tr->ring[(s - 1) % DP_TRACE_RING];

        /* Per-slot seqlock: the copy is good if the slot held event s
         * before and after it. A slot the writer has lapped meanwhile holds
         * a newer event or 0; such an event is lost, as if it had aged out. */
        if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != s)
            continue;
        memcpy(&out[n], e, sizeof(*out));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != s)
            continue;
        out[n++].seq = s;
    }
    return (int)n;
}
