/* util.c: fatal errors, output paths checked, allocation, sizes, random numbers, time, slices
   and safetensors values on the host for llmcl-train (see util.h). */
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* Dies unless files can be created (and renamed) in folder, the one that holds option's path. */
static void check_folder_writable(const char *option, const char *path, const char *folder)
{
    struct stat sb;
    if (stat(folder, &sb) != 0)
        die("%s %s: cannot write there: %s: %s", option, path, folder, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        die("%s %s: cannot write there: %s is not a folder", option, path, folder);
    if (access(folder, W_OK | X_OK) != 0)
        die("%s %s: cannot write into %s: %s", option, path, folder, strerror(errno));
}

/* A folder that a checkpoint may replace: one (manifest.json, llmcl_dist's), or empty. */
static bool replaceable(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (access(path, F_OK) == 0)
        return true;
    struct dirent **names = NULL;
    const int n = scandir(dir, &names, NULL, NULL); /* "." and ".." in an empty one */
    for (int i = 0; i < n; ++i)
        free(names[i]);
    free(names);
    return n == 2;
}

void check_output_path(const char *option, const char *path, output_kind kind)
{
    char parent[4096];
    struct stat sb;
    if (!path[0])
        die("%s: the path is empty", option);
    const bool exists = stat(path, &sb) == 0;
    if (!exists && errno != ENOENT)
        die("%s %s: %s", option, path, strerror(errno));
    if (kind == OUTPUT_FILE && path[strlen(path) - 1] == '/')
        die("%s %s names a folder: give the name of a file to write", option, path);
    if (exists && kind == OUTPUT_FILE && S_ISDIR(sb.st_mode))
        die("%s %s is a folder: give the name of a file to write (a path inside it, say)", option,
            path);
    if (exists && kind != OUTPUT_FILE && !S_ISDIR(sb.st_mode))
        die("%s %s exists and is not a folder", option, path);
    if (exists && kind == OUTPUT_FOLDER_REPLACED && !replaceable(path))
        die("%s %s holds files but no manifest.json: it is no checkpoint folder, and a save "
            "would replace it", option, path);
    if (exists && kind == OUTPUT_FOLDER_FILLED) { /* written into, where it is */
        check_folder_writable(option, path, path);
        return;
    }
    snprintf(parent, sizeof parent, "%s", path); /* dirname may write into its argument */
    check_folder_writable(option, path, dirname(parent));
}

void format_bytes(double bytes, char *buf, size_t len)
{
    if (bytes >= 1073741824.0)
        snprintf(buf, len, "%.2f GiB", bytes / 1073741824.0);
    else
        snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
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
