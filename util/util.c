/*
 * util.c: seeded random numbers, a monotonic clock, command-line numbers, appended text and whole
 * files for the tests and the tools (util.h).
 */
#include "util/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t util_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t util_splitmix64(uint64_t *state) { return util_mix64(*state += UTIL_GOLDEN_GAMMA); }

util_rng util_rng_new(uint64_t seed)
{
    util_rng r;
    for (int i = 0; i < 4; ++i)
        r.s[i] = util_splitmix64(&seed);
    return r;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t util_rng_next(util_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double util_bits_to_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }

double util_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void util_sort_doubles(double *v, size_t n)
{
    qsort(v, n, sizeof *v, by_value);
}

double util_median(double *v, size_t n)
{
    util_sort_doubles(v, n);
    return v[n / 2];
}

bool util_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    const long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool util_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    const double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !isfinite(v) || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

void util_appendf(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at >= len) /* a buffer of no bytes */
        return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n < 0) /* an encoding error: the text as it was */
        buf[*at] = '\0';
    else
        *at = (size_t)n < len - *at ? *at + (size_t)n : len - 1;
}

bool util_replace_file(const char *path, bool (*write)(FILE *f, void *arg), void *arg, char *why,
                       size_t n)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        snprintf(why, n, "cannot write %s: the path is too long", path);
        return false;
    }
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        snprintf(why, n, "cannot create %s: %s", tmp, strerror(errno));
        return false;
    }
    errno = 0;
    bool ok = write(f, arg) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok)
        ok = false, err = errno;
    if (!ok)
        snprintf(why, n, "cannot write %s: %s", tmp, err ? strerror(err) : "the writer failed");
    else if (rename(tmp, path) != 0) {
        snprintf(why, n, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        ok = false;
    }
    if (!ok)
        remove(tmp);
    return ok;
}
