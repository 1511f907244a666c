/*
 * fuzz.h - what every libFuzzer target here shares: the invariant check
 * that aborts (so libFuzzer keeps the input), and a reader that hands out
 * the input as fields, zeros once it runs out (short input = zeros); and
 * the line drivers' way of telling their cases apart.
 */
#ifndef DP_FUZZ_H
#define DP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

struct reader {
    const uint8_t *p;
    size_t n;
};

/* The next `bytes` bytes (at most 4) as a big-endian number. */
static inline uint32_t fuzz_take(struct reader *r, int bytes)
{
    uint32_t v = 0;

    while (bytes--) {
        v <<= 8;
        if (r->n) {
            v |= *r->p++;
            r->n--;
        }
    }
    return v;
}

/* The line drivers' (table_*.c) cases: the arguments after `word` if the
 * line is that case, else NULL. */
static inline char *fuzz_args_of(char *line, const char *word)
{
    size_t n = strlen(word);

    return !strncmp(line, word, n) && (line[n] == ' ' || line[n] == '\n') ? line + n : NULL;
}

#endif
