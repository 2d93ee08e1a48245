/*
 * bench.c: llmcl-bench, the driver. Measures the device's copy bandwidth, fp32 FMA rate and pinned
 * host link, runs every kernel family's benchmark on the selected device, and prints one table:
 * median kernel time, GB/s and its ratio to the copy bandwidth (or host link), TFLOP/s and its
 * ratio to the FMA rate, peak memory, speedup over a baseline, and whether the output matched the
 * CPU reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "util/util.h"

typedef struct family {
    const char *name;
    void (*run)(bench_env *env);
} family;

static const family families[] = {
    {"elementwise", bench_elementwise},
    {"norm", bench_norm},
    {"rope", bench_rope},
    {"glu", bench_glu},
    {"attention", bench_attention},
    {"cross_entropy", bench_cross_entropy},
    {"distill", bench_distill},
    {"preference", bench_preference},
    {"matmul", bench_matmul},
    {"offload", bench_offload},
    {"optim", bench_optim},
#ifdef LLMCL_BENCH_DIST
    {"dist", bench_dist},
#endif
};

#define MAX_ROWS 256
static bench_row rows[MAX_ROWS];
static int n_rows, n_failed;

/*
 * A copy as small as a row's traffic runs below the 1 GiB copy's rate (launch and ramp weigh more),
 * so memory-bound rows also get the copy's rate at their own size: what bounds them there.
 */
static double same_size_copy_gbs(bench_env *env, double bytes)
{
    static double sizes[MAX_ROWS], rates[MAX_ROWS];
    static int n;
    if (bytes >= env->copy_bytes)
        return env->copy_gbs; /* the ceiling's own size or more */
    for (int i = 0; i < n; ++i)
        if (sizes[i] == bytes)
            return rates[i];
    double gbs = 0;
    if (llmcl_measure_copy_bandwidth(env->ctx, (uint64_t)bytes, &gbs) != LLMCL_OK)
        gbs = 0;
    if (n < MAX_ROWS)
        sizes[n] = bytes, rates[n++] = gbs;
    return gbs;
}

void bench_add(bench_env *env, const bench_row *row)
{
    if (row->check == 0)
        ++n_failed;
    if (n_rows >= MAX_ROWS)
        return;
    bench_row *r = &rows[n_rows++];
    *r = *row;
    if (r->bytes >= 1024 && r->flops == 0 && r->link_gbs == 0 && r->ms > 0)
        r->size_copy_gbs = same_size_copy_gbs(env, r->bytes);
}

bool bench_fail(bench_env *env, const char *what, llmcl_status st)
{
    fprintf(stderr, "llmcl-bench: %s failed: %s\n", what, llmcl_last_error(env->ctx));
    (void)st;
    ++n_failed;
    return false;
}

/*
 * Seconds of warm-up before bench_wall_time's timed runs. Its ops are the heavy ones (seconds a
 * run on a CPU, products of 4 PFLOP on a GPU), and a board's clock is not steady until its draw
 * has met its power cap: the H200's falls from 1980 MHz to 1250-1600 about 1.2 s into a sustained
 * load. Path 3's cross-entropy forward, timed in that fall after one warm-up, ran 14.0-18.2 ms
 * where it runs 15.5-15.7 once the cap holds (docs/PERFORMANCE.md's cross-entropy section).
 */
#define WALL_SETTLE_S 2.0

static bool run_to_end(bench_env *env, bench_op op, void *arg)
{
    return op(env->ctx, arg) == LLMCL_OK && llmcl_ctx_finish(env->ctx) == LLMCL_OK;
}

/*
 * The settling runs' batches last about this long: a batch enqueues its runs back to back and waits
 * only at its end, where a wait after each run leaves a GPU idle until the host enqueues the next,
 * and a capped clock rises in those gaps.
 */
#define SETTLE_BATCH_S 0.02
#define SETTLE_MAX_BATCH 1024

/* Enqueues count runs of op back to back, then waits for their end. */
static bool run_batch(bench_env *env, bench_op op, void *arg, int count)
{
    for (int i = 0; i < count; ++i)
        if (op(env->ctx, arg) != LLMCL_OK)
            return false;
    return llmcl_ctx_finish(env->ctx) == LLMCL_OK;
}

/*
 * Runs op once, which builds its programs, once more to see how long a run takes, then in batches
 * of SETTLE_BATCH_S until seconds have passed. Returns the batch's run count, 0 on failure.
 */
static int settle(bench_env *env, bench_op op, void *arg, double seconds)
{
    if (!run_to_end(env, op, arg))
        return 0;
    const double start = util_now_s();
    if (!run_to_end(env, op, arg))
        return 0;
    const double run_s = util_now_s() - start;
    const int batch = run_s * SETTLE_MAX_BATCH < SETTLE_BATCH_S ? SETTLE_MAX_BATCH
                      : run_s < SETTLE_BATCH_S                  ? (int)(SETTLE_BATCH_S / run_s)
                                                                : 1;
    while (util_now_s() - start < seconds)
        if (!run_batch(env, op, arg, batch))
            return 0;
    return batch;
}

#define SETTLED_BATCHES 5

/*
 * With --settle: the time a run takes in batches like the settling ones, each enqueued back to back
 * and timed on the host from its first enqueue to the end of its wait, over its run count; the
 * median of SETTLED_BATCHES batches. No profiling events: NVIDIA's OpenCL runs a kernel enqueued
 * with one about 3.5 us longer back to back (docs/PERFORMANCE.md's matrix products), which the
 * yardsticks' CUDA graphs do not pay.
 */
static double settled_ms(bench_env *env, bench_op op, void *arg, int batch)
{
    double t[SETTLED_BATCHES];
    for (int b = 0; b < SETTLED_BATCHES; ++b) {
        const double start = util_now_s();
        if (!run_batch(env, op, arg, batch)) {
            bench_fail(env, "timed run", LLMCL_OK);
            return -1;
        }
        t[b] = 1e3 * (util_now_s() - start) / batch;
    }
    return util_median(t, SETTLED_BATCHES);
}

double bench_time(bench_env *env, bench_op op, void *arg)
{
    for (int i = 0; i < env->warmup; ++i)
        if (op(env->ctx, arg) != LLMCL_OK) {
            bench_fail(env, "warm-up", LLMCL_OK);
            return -1;
        }
    if (env->settle_s > 0) {
        const int batch = settle(env, op, arg, env->settle_s);
        if (batch == 0) {
            bench_fail(env, "settling run", LLMCL_OK);
            return -1;
        }
        return settled_ms(env, op, arg, batch);
    }
    double times[64];
    const int reps = env->reps < 64 ? env->reps : 64;
    for (int i = 0; i < reps; ++i) {
        llmcl_profile p;
        if (llmcl_profile_begin(env->ctx) != LLMCL_OK)
            return -1;
        llmcl_status st = op(env->ctx, arg);
        llmcl_status st2 = llmcl_profile_end(env->ctx, &p);
        if (st != LLMCL_OK || st2 != LLMCL_OK) {
            bench_fail(env, "timed run", st);
            return -1;
        }
        times[i] = p.kernel_ms;
    }
    return util_median(times, (size_t)reps);
}

double bench_wall_time(bench_env *env, bench_op op, void *arg, int max_reps)
{
    double t[16];
    int reps = env->reps < max_reps ? env->reps : max_reps;
    reps = reps < 1 ? 1 : reps > 16 ? 16 : reps;
    if (settle(env, op, arg, env->settle_s > WALL_SETTLE_S ? env->settle_s : WALL_SETTLE_S) == 0)
        return -1;
    for (int i = 0; i < reps; ++i) {
        const double start = util_now_s();
        if (!run_to_end(env, op, arg))
            return -1;
        t[i] = 1e3 * (util_now_s() - start);
    }
    return util_median(t, (size_t)reps);
}

double bench_peak_mib(bench_env *env, bench_op op, void *arg)
{
    llmcl_memory_stats before, after;
    llmcl_memory_stats_get(env->ctx, &before);
    llmcl_memory_reset_peak(env->ctx);
    if (!run_to_end(env, op, arg))
        return -1;
    llmcl_memory_stats_get(env->ctx, &after);
    return (double)(after.peak_bytes - before.current_bytes) / (1 << 20);
}

void bench_add_timed(bench_env *env, const char *kernel, const char *dir, const char *dtype,
                     const char *shape, double bytes, bench_op op, bench_op baseline, void *arg,
                     int check)
{
    bench_row row = {.bytes = bytes, .check = check};
    snprintf(row.kernel, sizeof row.kernel, "%s", kernel);
    snprintf(row.direction, sizeof row.direction, "%s", dir);
    snprintf(row.dtype, sizeof row.dtype, "%s", dtype);
    snprintf(row.shape, sizeof row.shape, "%s", shape);
    bench_add_op(env, &row, op, baseline, arg);
}

void bench_add_op(bench_env *env, bench_row *row, bench_op op, bench_op baseline, void *arg)
{
    row->ms = bench_time(env, op, arg);
    if (row->ms < 0)
        return;
    row->peak_mib = bench_peak_mib(env, op, arg);
    row->baseline_ms = baseline ? bench_time(env, baseline, arg) : 0;
    if (row->baseline_ms < 0)
        row->baseline_ms = 0;
    bench_add(env, row);
}

llmcl_status bench_upload_random(llmcl_tensor *t, uint64_t seed)
{
    const int64_t n = llmcl_tensor_numel(t);
    const size_t es = llmcl_dtype_size(llmcl_tensor_dtype(t));
    unsigned char *h = malloc((size_t)n * es);
    if (!h)
        return LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const float f = (float)((x >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
        if (es == 4)
            memcpy(h + i * 4, &f, 4);
        else {
            const uint16_t b = llmcl_tensor_dtype(t) == LLMCL_BF16 ? llmcl_f32_to_bf16(f)
                                                                   : llmcl_f32_to_f16(f);
            memcpy(h + i * 2, &b, 2);
        }
    }
    const llmcl_status st = llmcl_tensor_upload(t, h, (size_t)n * es);
    free(h);
    return st;
}

llmcl_status bench_new_random(llmcl_ctx *ctx, llmcl_dtype dt, int ndim, const int64_t *shape,
                              uint64_t seed, llmcl_tensor **out)
{
    const llmcl_status st = llmcl_tensor_create(ctx, dt, ndim, shape, out);
    return st == LLMCL_OK ? bench_upload_random(*out, seed) : st;
}

llmcl_status bench_new_labels(llmcl_ctx *ctx, int ndim, const int64_t *shape, int64_t v,
                              int64_t prompt, llmcl_tensor **out)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d)
        n *= shape[d];
    int32_t *y = malloc((size_t)n * sizeof *y);
    if (!y)
        return LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = i % shape[ndim - 1] < prompt ? -100 : (int32_t)((x >> 33) % (uint64_t)v);
    }
    llmcl_status st = llmcl_tensor_create(ctx, LLMCL_I32, ndim, shape, out);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(*out, y, (size_t)n * sizeof *y);
    free(y);
    return st;
}

static void print_table(const bench_env *env)
{
    printf("\n%-22s %-8s %-5s %-26s %9s %8s %6s %6s %8s %6s %9s %7s %5s\n", "kernel", "dir",
           "dtype", "shape", "ms", "GB/s", "%copy", "%size", "TFLOP/s", "%peak", "peak MiB",
           "speedup", "check");
    for (int i = 0; i < n_rows; ++i) {
        const bench_row *r = &rows[i];
        char gbs[16] = "-", pc[16] = "-", ps[16] = "-", tf[16] = "-", pf[16] = "-", peak[16] = "-",
             sp[16] = "-";
        if (r->bytes > 0 && r->ms > 0) {
            const double g = r->bytes / (r->ms * 1e-3) * 1e-9;
            snprintf(gbs, sizeof gbs, "%.1f", g);
            if (r->link_gbs > 0)
                snprintf(pc, sizeof pc, "%.0f%%h", 100.0 * g / r->link_gbs);
            else
                snprintf(pc, sizeof pc, "%.0f%%", 100.0 * g / env->copy_gbs);
            if (r->size_copy_gbs > 0)
                snprintf(ps, sizeof ps, "%.0f%%", 100.0 * g / r->size_copy_gbs);
        }
        if (r->flops > 0 && r->ms > 0) {
            const double t = r->flops / (r->ms * 1e-3) * 1e-12;
            snprintf(tf, sizeof tf, "%.2f", t);
            snprintf(pf, sizeof pf, "%.0f%%%s", 100.0 * t / (r->on_mma ? env->mma_tflops : env->fma_tflops),
                     r->on_mma ? "m" : "");
        }
        if (r->peak_mib >= 0)
            snprintf(peak, sizeof peak, "%.1f", r->peak_mib);
        if (r->baseline_ms > 0 && r->ms > 0)
            snprintf(sp, sizeof sp, "%.2fx", r->baseline_ms / r->ms);
        printf("%-22s %-8s %-5s %-26s %9.4f %8s %6s %6s %8s %6s %9s %7s %5s\n", r->kernel,
               r->direction, r->dtype, r->shape, r->ms, gbs, pc, ps, tf, pf, peak, sp,
               r->check < 0 ? "-" : r->check ? "ok" : "FAIL");
    }
}

static void print_families(FILE *f)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; ++i)
        fprintf(f, " %s", families[i].name);
    fprintf(f, "\n");
}

static void usage(void)
{
    printf("usage: llmcl-bench [--only FAMILY] [--reps N] [--settle S] [--small | --full]\n"
           "Runs every kernel at a representative size on the selected device (LLMCL_PLATFORM,\n"
           "LLMCL_DEVICE), checks each output against the CPU reference and prints a table.\n"
           "--reps N times N runs a row (1 to 64; default 20, 3 with --small; slow rows fewer).\n"
           "--small shrinks sizes (the default on CPU devices); --full forces GPU sizes.\n"
           "--settle S runs each row for S seconds (0 to 60) before timing it, so that a GPU's\n"
           "clock has settled under its power cap, then times batches of its runs back to back on\n"
           "the host, each over its count (compare with the yardsticks' --settle S).\n"
           "families:");
    print_families(stdout);
}

static bool known_family(const char *name)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; ++i)
        if (strcmp(name, families[i].name) == 0)
            return true;
    return false;
}

/*
 * The command line, checked before the device is touched. A bad one gets one line on stderr
 * naming what is wrong, and exit status 2 (returned; 0 to go on, -1 after --help).
 */
static int parse_args(int argc, char **argv, const char **only, int *reps, double *settle_s,
                      int *force_small)
{
    for (int i = 1; i < argc; ++i) {
        const char *opt = argv[i];
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            usage();
            return -1;
        }
        if (strcmp(opt, "--small") == 0 || strcmp(opt, "--full") == 0) {
            *force_small = strcmp(opt, "--small") == 0;
            continue;
        }
        const bool takes_value = strcmp(opt, "--only") == 0 || strcmp(opt, "--reps") == 0 ||
                                 strcmp(opt, "--settle") == 0;
        if (!takes_value) {
            fprintf(stderr, "llmcl-bench: unknown option %s (--help lists them)\n", opt);
            return 2;
        }
        if (i + 1 == argc) {
            fprintf(stderr, "llmcl-bench: %s needs a value (--help)\n", opt);
            return 2;
        }
        const char *val = argv[++i];
        if (strcmp(opt, "--only") == 0) {
            if (!known_family(val)) {
                fprintf(stderr, "llmcl-bench: --only %s: no such family; the families:", val);
                print_families(stderr);
                return 2;
            }
            *only = val;
        } else if (strcmp(opt, "--reps") == 0) {
            long n; /* 64 runs at most: the most a row keeps */
            if (!util_parse_long(val, 1, 64, &n)) {
                fprintf(stderr,
                        "llmcl-bench: --reps %s: expected a whole number of runs from 1 to 64\n",
                        val);
                return 2;
            }
            *reps = (int)n;
        } else if (strcmp(opt, "--settle") == 0 && !util_parse_double(val, 0, 60, settle_s)) {
            fprintf(stderr, "llmcl-bench: --settle %s: expected seconds from 0 to 60\n", val);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int reps = 0, force_small = -1;
    double settle_s = 0;
    const int parsed = parse_args(argc, argv, &only, &reps, &settle_s, &force_small);
    if (parsed)
        return parsed < 0 ? 0 : parsed;
    bench_env env = {0};
    if (llmcl_ctx_create(&env.ctx) != LLMCL_OK) {
        fprintf(stderr, "llmcl-bench: %s\n", llmcl_last_error(NULL));
        return 1;
    }
    const llmcl_device_info *info = llmcl_ctx_device_info(env.ctx);
    env.small = force_small >= 0 ? force_small : !info->is_gpu;
    env.warmup = env.small ? 1 : 3;
    env.reps = reps > 0 ? reps : env.small ? 3 : 20;
    env.settle_s = settle_s;
    const uint64_t copy_bytes = env.small ? (64u << 20) : (1u << 30);
    env.host_bytes = env.copy_bytes = (double)copy_bytes;
    if (llmcl_measure_copy_bandwidth(env.ctx, copy_bytes, &env.copy_gbs) != LLMCL_OK ||
        llmcl_measure_fma_rate(env.ctx, &env.fma_tflops) != LLMCL_OK ||
        llmcl_measure_host_bandwidth(env.ctx, copy_bytes, &env.host_d2h_gbs, &env.host_h2d_gbs) !=
            LLMCL_OK) {
        fprintf(stderr, "llmcl-bench: measuring the device's ceilings failed: %s\n",
                llmcl_last_error(env.ctx));
        llmcl_ctx_destroy(env.ctx);
        return 1;
    }
    printf("llmcl %s on %s (%s, driver %s)\n", llmcl_version(), info->name, info->platform_name,
           info->driver_version);
    if (info->has_mma && llmcl_measure_mma_rate(env.ctx, &env.mma_tflops) != LLMCL_OK) {
        fprintf(stderr, "llmcl-bench: measuring the tensor-core rate failed: %s\n",
                llmcl_last_error(env.ctx));
        llmcl_ctx_destroy(env.ctx);
        return 1;
    }
    printf("ceilings: copy %.1f GB/s (read + write, %.0f MiB f32 copy), fp32 FMA %.2f TFLOP/s",
           env.copy_gbs, (double)copy_bytes / (1 << 20), env.fma_tflops);
    if (env.mma_tflops > 0)
        printf(", bf16 mma.sync %.1f TFLOP/s", env.mma_tflops);
    printf("\nhost link (pinned, %.0f MiB): device to host %.1f GB/s, host to device %.1f GB/s\n",
           (double)copy_bytes / (1 << 20), env.host_d2h_gbs, env.host_h2d_gbs);
    printf("%%peak: of the FMA rate, or with 'm' of the mma.sync rate (tensor-core rows); %%copy:\n"
           "of the copy bandwidth, or with 'h' of the host link (offload rows); %%size: of the copy\n"
           "kernel's rate when it moves the row's bytes (memory-bound rows)\n");
    printf("sizes: %s; ", env.small ? "small (CPU)" : "full (GPU)");
    if (env.settle_s > 0)
        printf("median of %d batches of about %g ms of runs back to back, host time over their "
               "count, after %d warm-up and %g s of settling runs\n",
               SETTLED_BATCHES, 1e3 * SETTLE_BATCH_S, env.warmup, env.settle_s);
    else
        printf("median of %d runs after %d warm-up\n", env.reps, env.warmup);
    fflush(stdout);
    for (size_t i = 0; i < sizeof families / sizeof families[0]; ++i)
        if (!only || strcmp(only, families[i].name) == 0)
            families[i].run(&env);
    print_table(&env);
    llmcl_ctx_destroy(env.ctx);
    if (n_failed)
        printf("\n%d check(s) FAILED\n", n_failed);
    return n_failed ? 1 : 0;
}
