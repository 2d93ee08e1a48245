/* util.c: fatal errors, allocation, random numbers, time, slices and safetensors values on the
   host for llmcl-train (see util.h). */
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__attribute__((noreturn)) static void vdie(void (*finish)(void), const char *fmt, va_list ap)
{
    fputs("llmcl-train: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    if (finish)
        finish();
    exit(1);
}

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdie(NULL, fmt, ap);
}

void die_finally(void (*finish)(void), const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdie(finish, fmt, ap);
}

void check_status(llmcl_status st, const llmcl_ctx *ctx, const char *expr, const char *file,
                  int line)
{
    if (st != LLMCL_OK)
        die("%s failed (%s:%d): %s: %s", expr, file, line, llmcl_status_str(st),
            llmcl_last_error(ctx));
}

void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        die("out of host memory (%zu bytes)", bytes);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die("out of host memory (%zu x %zu bytes)", n, size);
    return p;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

rng rng_new(uint64_t seed)
{
    rng r = {.has_spare = 0};
    for (int i = 0; i < 4; ++i)
        r.s[i] = splitmix64(&seed);
    return r;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(rng *r)
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

double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

double rng_normal(rng *r)
{
    if (r->has_spare) { /* Box-Muller makes two: the second waits for the next call */
        r->has_spare = 0;
        return r->spare;
    }
    const double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r), rad = sqrt(-2.0 * log(u1));
    r->spare = rad * sin(6.283185307179586 * u2);
    r->has_spare = 1;
    return rad * cos(6.283185307179586 * u2);
}

double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

llmcl_tensor *tensor_slice(const llmcl_tensor *t, int64_t at, int64_t n)
{
    llmcl_tensor *v = NULL;
    CHECK(llmcl_tensor_view(t, 1, &n, NULL, llmcl_tensor_offset(t) + at, &v), llmcl_tensor_ctx(t));
    return v;
}

void safetensors_to_host(const llmcl_safetensors *st, const char *name, float *host, int64_t n)
{
    llmcl_safetensors_info info;
    CHECK(llmcl_safetensors_find(st, name, &info), NULL);
    const char *data = info.data;
    if (info.dtype == LLMCL_F32) {
        memcpy(host, data, (size_t)n * sizeof *host);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        uint16_t x; /* the file need not align 16-bit values */
        memcpy(&x, data + 2 * i, sizeof x);
        host[i] = info.dtype == LLMCL_BF16 ? llmcl_bf16_to_f32(x) : llmcl_f16_to_f32(x);
    }
}
