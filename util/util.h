/*
 * util.h: what the tests (tests/harness.c) and the tools (llmcl-bench, llmcl-tune) share and the
 * library does not: returning a failed llmcl_status, seeded random numbers, a monotonic clock and
 * medians of times, the parsing of command-line numbers, text appended to a buffer and replacing a
 * file whole.
 * Built once as the static library llmcl_util (util/meson.build); llmcl-train links it too (it is
 * no part of the library: the trainer still reaches llmcl through the public API alone).
 */
#ifndef LLMCL_UTIL_H
#define LLMCL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmcl.h"

/* Returns a failed status from the enclosing function. */
#define TRY(expr)                                                                                 \
    do {                                                                                          \
        llmcl_status try_st_ = (expr);                                                            \
        if (try_st_ != LLMCL_OK)                                                                  \
            return try_st_;                                                                       \
    } while (0)

/* Stores a failed status in st and jumps to label (the caller's clean-up). */
#define TRY_GOTO(st, expr, label)                                                                 \
    do {                                                                                          \
        (st) = (expr);                                                                            \
        if ((st) != LLMCL_OK)                                                                     \
            goto label;                                                                           \
    } while (0)

/* splitmix64's increment, the golden ratio in 64 bits. */
#define UTIL_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's finaliser: a bijection of 64-bit words that mixes every bit into every other. */
uint64_t util_mix64(uint64_t z);

/* splitmix64: advances *state and returns its next output (a generator of its own, and the
   seeding of util_rng). */
uint64_t util_splitmix64(uint64_t *state);

/* xoshiro256** from a splitmix64-expanded seed: the same seed gives the same stream everywhere. */
typedef struct util_rng {
    uint64_t s[4];
} util_rng;

util_rng util_rng_new(uint64_t seed);
uint64_t util_rng_next(util_rng *r);

/* 53 random bits as a double in [0, 1). */
double util_bits_to_unit(uint64_t bits);

/* Seconds on a monotonic clock. */
double util_now_s(void);

/* v sorted ascending, in place. */
void util_sort_doubles(double *v, size_t n);

/* The median of n > 0 times: v sorted in place, its middle element (the upper one of an even n). */
double util_median(double *v, size_t n);

/* An option's value: the whole of s a decimal integer, or a finite number, in [lo, hi]; *out is
   written only where it is. */
bool util_parse_long(const char *s, long lo, long hi, long *out);
bool util_parse_double(const char *s, double lo, double hi, double *out);

/*
 * Appends printf's text for fmt to the string buf of len bytes at *at (its length so far), cut at
 * the buffer's end, and moves *at to the new end: never past len - 1, where `at += snprintf(...)`
 * adds the length the text would have had, and the next append's size len - at wraps around.
 */
void util_appendf(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * Writes path whole or not at all: write(f, arg) fills a new file beside it (path.tmp.<pid>),
 * which is flushed to disk, closed and renamed over path. On any failure that file is removed,
 * path stays as it was, and why (n bytes) says what failed.
 */
bool util_replace_file(const char *path, bool (*write)(FILE *f, void *arg), void *arg, char *why,
                       size_t n);

#endif
