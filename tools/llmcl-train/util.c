/* util.c: fatal errors, output paths checked, allocation, sizes, random numbers, a loop over
   threads, time, slices and safetensors values on the host for llmcl-train (see util.h). */
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The message goes out in one write: the ranks of a job share stderr, and a line written in parts
   interleaves with theirs. */
__attribute__((noreturn)) static void vdie(void (*finish)(void), const char *fmt, va_list ap)
{
    char line[4096];
    int n = snprintf(line, sizeof line, "llmcl-train: ");
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fflush(stderr);
    const ssize_t written = write(STDERR_FILENO, line, (size_t)n);
    (void)written; /* nothing is left to report a failed write to */
    if (finish)
        finish();
    exit(1);
}

bool path_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
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

uint64_t rng_stream(uint64_t seed, uint64_t stream)
{
    const uint64_t key = util_mix64(seed + UTIL_GOLDEN_GAMMA);
    return util_mix64(key ^ (stream + 1) * 0xd1b54a32d192ed03ull);
}

/* Word c of a stream: splitmix64's output c from the state key, which needs none before it. */
static uint64_t stream_word(uint64_t key, uint64_t c)
{
    return util_mix64(key + (c + 1) * UTIL_GOLDEN_GAMMA);
}

/* Standard normal values 2i and 2i + 1 of a stream, by Box-Muller from words 2i and 2i + 1: the
   radius in double from 53 bits (its tail as far as 8.6 sigma), the angle in float, which is
   enough for float results and nearly twice as fast as sin and cos in double. */
static void normal_pair(uint64_t key, int64_t i, double z[2])
{
    const double u1 = 1.0 - (double)(stream_word(key, 2 * (uint64_t)i) >> 11) * 0x1.0p-53;
    const float angle = 6.2831853f * (float)(stream_word(key, 2 * (uint64_t)i + 1) >> 40) *
                        0x1.0p-24f;
    const double radius = sqrt(-2.0 * log(u1));
    z[0] = radius * cosf(angle);
    z[1] = radius * sinf(angle);
}

void rng_normal_fill(uint64_t key, int64_t from, int64_t n, double scale, float *out)
{
    const int64_t end = from + n;
    int64_t j = from;
    double z[2];
    if (j < end && j % 2) { /* a range that starts inside a pair takes its second value */
        normal_pair(key, j / 2, z);
        *out++ = (float)(scale * z[1]);
        ++j;
    }
    for (; j + 1 < end; j += 2, out += 2) {
        normal_pair(key, j / 2, z);
        out[0] = (float)(scale * z[0]);
        out[1] = (float)(scale * z[1]);
    }
    if (j < end) {
        normal_pair(key, j / 2, z);
        *out = (float)(scale * z[0]);
    }
}

void rng_uniform_fill(uint64_t key, int64_t from, int64_t n, double lo, double hi, float *out)
{
    for (int64_t k = 0; k < n; ++k)
        out[k] = (float)(lo + (hi - lo) * (double)(stream_word(key, (uint64_t)(from + k)) >> 11) *
                                  0x1.0p-53);
}

typedef struct piece {
    void (*body)(void *arg, int64_t lo, int64_t hi);
    void *arg;
    int64_t lo, hi;
} piece;

static void *run_piece(void *p)
{
    const piece *pc = p;
    pc->body(pc->arg, pc->lo, pc->hi);
    return NULL;
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  void (*body)(void *arg, int64_t lo, int64_t hi), void *arg)
{
    enum { MAX_THREADS = 32 }; /* mpiexec may start several ranks on a host, each with as many */
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int64_t by_size = grain > 0 ? (end - begin) / grain : end - begin;
    int threads = online < 1 ? 1 : online > MAX_THREADS ? MAX_THREADS : (int)online;
    if (by_size < threads)
        threads = by_size < 1 ? 1 : (int)by_size;
    piece pieces[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 0; t < threads; ++t)
        pieces[t] = (piece){body, arg, begin + (end - begin) * t / threads,
                            begin + (end - begin) * (t + 1) / threads};
    for (int t = 1; t < threads; ++t) /* a thread that cannot start leaves its piece to the caller */
        started[t] = pthread_create(&ids[t], NULL, run_piece, &pieces[t]) == 0;
    for (int t = 0; t < threads; ++t)
        if (!started[t])
            run_piece(&pieces[t]);
    for (int t = 1; t < threads; ++t)
        if (started[t])
            pthread_join(ids[t], NULL);
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

bool same_place(const char *a, const char *b)
{
    char da[4096], db[4096], ba[4096], bb[4096]; /* dirname and basename may write into them */
    snprintf(da, sizeof da, "%s", a), snprintf(ba, sizeof ba, "%s", a);
    snprintf(db, sizeof db, "%s", b), snprintf(bb, sizeof bb, "%s", b);
    struct stat fa, fb;
    return strcmp(basename(ba), basename(bb)) == 0 && stat(dirname(da), &fa) == 0 &&
           stat(dirname(db), &fb) == 0 && fa.st_dev == fb.st_dev && fa.st_ino == fb.st_ino;
}

void format_bytes(double bytes, char *buf, size_t len)
{
    if (bytes >= 1073741824.0)
        snprintf(buf, len, "%.2f GiB", bytes / 1073741824.0);
    else
        snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
}

llmcl_tensor *tensor_slice(const llmcl_tensor *t, int64_t at, int64_t n)
{
    llmcl_tensor *v = NULL;
    CHECK(llmcl_tensor_view(t, 1, &n, NULL, llmcl_tensor_offset(t) + at, &v), llmcl_tensor_ctx(t));
    return v;
}

void tensor_upload_f32(llmcl_tensor *t, const float *host, int64_t n)
{
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    if (dt == LLMCL_F32) {
        CHECK(llmcl_tensor_upload(t, host, (size_t)n * sizeof *host), llmcl_tensor_ctx(t));
        return;
    }
    uint16_t *h16 = xmalloc((size_t)n * sizeof *h16);
    for (int64_t i = 0; i < n; ++i)
        h16[i] = dt == LLMCL_BF16 ? llmcl_f32_to_bf16(host[i]) : llmcl_f32_to_f16(host[i]);
    CHECK(llmcl_tensor_upload(t, h16, (size_t)n * sizeof *h16), llmcl_tensor_ctx(t));
    free(h16);
}

void tensor_download_f32(const llmcl_tensor *t, float *host, int64_t n)
{
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    if (dt == LLMCL_F32) {
        CHECK(llmcl_tensor_download(t, host, (size_t)n * sizeof *host), llmcl_tensor_ctx(t));
        return;
    }
    uint16_t *h16 = xmalloc((size_t)n * sizeof *h16);
    CHECK(llmcl_tensor_download(t, h16, (size_t)n * sizeof *h16), llmcl_tensor_ctx(t));
    for (int64_t i = 0; i < n; ++i)
        host[i] = dt == LLMCL_BF16 ? llmcl_bf16_to_f32(h16[i]) : llmcl_f16_to_f32(h16[i]);
    free(h16);
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
