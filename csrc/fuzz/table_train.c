/*
 * table_train.c - the table test's driver for the buffer arithmetic of
 * trains and vnet reads (train.c, gso.c's dp_gso_read): one case per line
 * on stdin, one answer per line on stdout. The cases and the answers
 * expected live in tests/unit/test_train_table.py; the fuzzers check the
 * same functions against invariants, this table against worked examples.
 *
 *   plan LEN/PEER ...        -> FIRST+N ... (the trains, in order)
 *   cut LEN SEG ROOM MTU     -> train=0|1 OFF/LEN[!|?] ... (! truncated with
 *                               bytes in the slot, ? truncated without)
 *   slot OFFLOADS MTU        -> SLOT STRIDE
 *   read R MTU GSO_TYPE      -> REASON slot|big LEN
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "fuzz.h"

static void plan(char *args)
{
    static uint32_t len[DP_BATCH_MAX];
    static uint64_t dest[DP_BATCH_MAX];
    static struct dp_train t[DP_BATCH_MAX];
    uint32_t m = 0, nt, i;
    unsigned l, d;
    char *tok;

    for (tok = strtok(args, " \n"); tok && m < DP_BATCH_MAX; tok = strtok(NULL, " \n")) {
        if (sscanf(tok, "%u/%u", &l, &d) != 2)
            break;
        len[m] = l;
        dest[m++] = d;
    }
    nt = dp_train_plan(len, dest, m, t);
    for (i = 0; i < nt; i++)
        printf("%s%u+%u", i ? " " : "", t[i].first, t[i].n);
    printf("\n");
}

static void cut(const char *args)
{
    struct dp_train_cut c;
    struct dp_datagram d;
    unsigned len, seg, room, mtu;
    int i = 0;

    if (sscanf(args, "%u %u %u %u", &len, &seg, &room, &mtu) != 4)
        return;
    printf("train=%d", dp_train_cut_start(&c, len, seg, room, mtu));
    while (dp_train_cut_next(&c, &d) && i++ < 1000)
        printf(" %u/%u%s", d.off, d.len, !d.truncated ? "" : d.has_bytes ? "!" : "?");
    printf("\n");
}

static void slot(const char *args)
{
    unsigned offloads, mtu;
    uint32_t stride, s;

    if (sscanf(args, "%u %u", &offloads, &mtu) != 2)
        return;
    s = dp_train_rx_slot(offloads, mtu, &stride);
    printf("%u %u\n", s, stride);
}

static void read_case(const char *args)
{
    static uint8_t big[DP_VNET_PKT_MAX];
    uint8_t hdr[DP_VNET_HDR_LEN] = { 0 }, *slot, *pkt;
    struct dp_vnet_hdr h;
    unsigned r, mtu, type;
    uint32_t len;
    int reason;

    if (sscanf(args, "%u %u %u", &r, &mtu, &type) != 3 || !mtu)
        return;
    slot = calloc(1, mtu);
    if (!slot)
        return;
    hdr[1] = (uint8_t)type;
    reason = dp_gso_read(hdr, r, slot, big, mtu, &h, &pkt, &len);
    printf("%d %s %u\n", reason, pkt == slot ? "slot" : pkt == big ? "big" : "?", len);
    free(slot);
}

int main(void)
{
    char line[8192], *a;

    while (fgets(line, sizeof(line), stdin)) {
        if ((a = fuzz_args_of(line, "plan")))
            plan(a);
        else if ((a = fuzz_args_of(line, "cut")))
            cut(a);
        else if ((a = fuzz_args_of(line, "slot")))
            slot(a);
        else if ((a = fuzz_args_of(line, "read")))
            read_case(a);
        else
            printf("?\n");
        fflush(stdout);
    }
    return 0;
}
