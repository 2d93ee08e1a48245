/*
 * bench_dist.c: the dist family of llmcl-bench (built where MPI is found; run it as
 * `mpiexec -n 2 llmcl-bench --only dist`, a GPU a rank). It measures, through llmcl_dist on the
 * transport it picks (NCCL GPU to GPU where every rank can, else host-staged MPI): the throughput
 * of a gradient reduce-scatter and of a stage-3 parameter all-gather of 16 groups of f32, each a
 * 4096 x 4096 weight, against the transport's own collectives on raw buffers of one group
 * (llmcl_dist_measure_transport: NCCL's ncclReduceScatter and ncclAllGather, or a bare
 * MPI_Alltoall and MPI_Allgather of host memory) and, under MPI, the slower direction of the host
 * link; and the exposed communication of a backward that reduces each group's gradients while the
 * next group computes (exposed = time with reductions - time without, against the reductions' own
 * time); and the fixed cost of one collective (reduce-scatters of 4 KiB). Under MPI it also sweeps
 * the chunk size (1/256 and 1/16 of a group beside the default
 * 1 MiB, llmcl_dist_opts.chunk_bytes) and measures the host's own ceilings for the exchange, every
 * rank at once: memory copies by one thread and by the rank's share of the cores, and a bare
 * MPI_Alltoall of the collectives' bytes. Every byte a staged collective exchanges crosses host
 * memory at least four times (written by the copy out, read and written between the processes,
 * read by the copy back), so on a host whose memory copies are slow these bound it, not the link
 * (docs/PERFORMANCE.md). Wall-clock times (MPI_Wtime, after the device finished), median of
 * env->reps. Ranks other than 0 are silent; the table rows carry the times. On one rank only the
 * fixed cost runs: no link, the handoffs alone.
 *
 * The backward is the trainer's for a linear layer: dX = dy W and dW += dy^T x, bf16 operands
 * (tensor cores where the device has them) into the f32 gradients, at 8192 tokens as the matmul
 * rows (64 with --small). The last group's reduction has nothing left to hide under, so at least
 * 1 / 16 of the communication stays exposed whatever the overlap.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "bench.h"
#include "llmcl_dist.h"
#include "util/util.h"

typedef struct dist_bench {
    bench_env *env;
    llmcl_dist *d;
    int groups;
    int64_t rows, cols;       /* one group: a weight [rows, cols] */
    llmcl_tensor *x, *dy, *w; /* the backward's bf16 operands: dX = dy W, dW += dy^T x */
    llmcl_tensor *dx;         /* bf16 */
    llmcl_tensor *plain;      /* f32 dW of the backward without communication */
    int reduce, compute;      /* what the backward does */
    uint64_t chunk;           /* llmcl_dist_opts.chunk_bytes (0: the default) */
    char *host_src, *host_dst; /* the host ceilings' buffers, host_bytes each */
    size_t host_bytes;
    int copy_threads;
    double group_bytes;        /* one group's f32 */
    double own_rs, own_ag;     /* the transport's own collectives, GB/s (0: unmeasured) */
    double link;               /* the slower direction of the host link, GB/s */
    bool mpi;                  /* host-staged MPI, not NCCL */
} dist_bench;

#define MAX_COPY_THREADS 64

/* Median wall-clock milliseconds of env->reps runs (after warm-up), every rank in step. */
static double wall_ms(bench_env *env, llmcl_status (*fn)(dist_bench *), dist_bench *b)
{
    double t[64];
    const int reps = env->reps < 64 ? env->reps : 64;
    for (int i = -env->warmup; i < reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (fn(b) != LLMCL_OK || llmcl_ctx_finish(env->ctx) != LLMCL_OK)
            return -1.0;
        const double t1 = MPI_Wtime();
        if (i >= 0)
            t[i] = (t1 - t0) * 1e3;
    }
    /* The slowest rank's median: the collective is as fast as its last rank. */
    double med = util_median(t, (size_t)reps), worst;
    MPI_Allreduce(&med, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

typedef struct copy_part {
    char *dst;
    const char *src;
    size_t n;
} copy_part;

static void *copy_part_run(void *arg)
{
    copy_part *p = arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* host_dst = host_src by copy_threads threads, a contiguous part each (the caller's among them). */
static llmcl_status host_copy(dist_bench *b)
{
    pthread_t th[MAX_COPY_THREADS];
    bool started[MAX_COPY_THREADS] = {false};
    copy_part part[MAX_COPY_THREADS] = {{NULL, NULL, 0}};
    const int n = b->copy_threads;
    const size_t per = b->host_bytes / (size_t)n;
    for (int t = 0; t < n; ++t) {
        const size_t at = (size_t)t * per;
        part[t] = (copy_part){b->host_dst + at, b->host_src + at,
                              t == n - 1 ? b->host_bytes - at : per};
    }
    for (int t = 1; t < n; ++t)
        started[t] = pthread_create(&th[t], NULL, copy_part_run, &part[t]) == 0;
    copy_part_run(&part[0]);
    for (int t = 1; t < n; ++t) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            copy_part_run(&part[t]);
    }
    return LLMCL_OK;
}

/* MPI alone: host_src's equal pieces to every rank, into host_dst. */
static llmcl_status host_exchange(dist_bench *b)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int piece = (int)(b->host_bytes / (size_t)world);
    return MPI_Alltoall(b->host_src, piece, MPI_BYTE, b->host_dst, piece, MPI_BYTE,
                        MPI_COMM_WORLD) == MPI_SUCCESS
               ? LLMCL_OK
               : LLMCL_ERROR_MPI;
}

/* The cores of this host over the ranks on it. */
static int cores_per_rank(void)
{
    MPI_Comm node;
    int on_node = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_size(node, &on_node);
        MPI_Comm_free(&node);
    }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN) / on_node;
    return cores < 1 ? 1 : cores > MAX_COPY_THREADS ? MAX_COPY_THREADS : (int)cores;
}

/* The host's ceilings for an exchange of `bytes` a rank (the collectives' bytes). */
static void host_ceilings(dist_bench *b, size_t bytes, int world)
{
    b->host_bytes = bytes;
    b->host_src = malloc(bytes);
    b->host_dst = malloc(bytes);
    if (!b->host_src || !b->host_dst) {
        printf("dist: host ceilings not measured (%zu bytes of host memory)\n", 2 * bytes);
        goto done;
    }
    memset(b->host_src, 1, bytes);
    memset(b->host_dst, 2, bytes);
    printf("dist: host memory copies (every rank at once)");
    const int many = cores_per_rank();
    for (int threads = 1;; threads = many) {
        b->copy_threads = threads;
        const double ms = wall_ms(b->env, host_copy, b);
        printf("%s %.1f GB/s a rank by %d thread%s", threads == 1 ? "" : ",",
               (double)bytes / (ms * 1e-3) * 1e-9, threads, threads == 1 ? "" : "s");
        if (threads == many)
            break;
    }
    if (world > 1) {
        const double ms = wall_ms(b->env, host_exchange, b);
        const double each_way = (double)bytes * (world - 1) / world;
        if (ms > 0)
            printf("; MPI_Alltoall of %zu MiB a rank %.1f GB/s a rank each way", bytes >> 20,
                   each_way / (ms * 1e-3) * 1e-9);
    }
    printf("\n");
done:
    free(b->host_src);
    free(b->host_dst);
    b->host_src = b->host_dst = NULL;
}

static llmcl_status make_dist(dist_bench *b, int stage)
{
    char name[32];
    const llmcl_dist_opts o = {.stage = stage, .chunk_bytes = b->chunk};
    llmcl_dist_destroy(b->d);
    b->d = NULL;
    const int64_t shape[2] = {b->rows, b->cols};
    llmcl_status st = llmcl_dist_create(b->env->ctx, MPI_COMM_WORLD, &o, &b->d);
    for (int g = 0; st == LLMCL_OK && g < b->groups; ++g) {
        snprintf(name, sizeof name, "w%d", g);
        st = llmcl_dist_add_param(b->d, name, g, 2, shape, 0);
    }
    return st == LLMCL_OK ? llmcl_dist_setup(b->d) : st;
}

/* A stage-3 forward: every group gathered (the next prefetched) and released. */
static llmcl_status gather_pass(dist_bench *b)
{
    for (int g = 0; g < b->groups; ++g) {
        llmcl_status st = llmcl_dist_gather(b->d, g);
        if (st == LLMCL_OK)
            st = llmcl_dist_release(b->d, g);
        if (st != LLMCL_OK)
            return st;
    }
    return LLMCL_OK;
}

/* A stage-2 backward: per group, dX and dW (compute) and dW's reduce-scatter (reduce). */
static llmcl_status backward(dist_bench *b)
{
    char name[32];
    const llmcl_matmul_opts ta = {.trans_a = 1};
    for (int g = b->groups - 1; g >= 0; --g) {
        llmcl_tensor *grad = b->plain;
        snprintf(name, sizeof name, "w%d", g);
        llmcl_status st = b->reduce ? llmcl_dist_grad(b->d, name, &grad) : LLMCL_OK;
        if (st == LLMCL_OK && b->compute)
            st = llmcl_matmul(b->env->ctx, 1.0f, b->dy, b->w, 0.0f, b->dx, NULL);
        if (st == LLMCL_OK && b->compute)
            st = llmcl_matmul(b->env->ctx, 1.0f, b->dy, b->x, 1.0f, grad, &ta);
        if (st == LLMCL_OK && b->reduce)
            st = llmcl_dist_grads_ready(b->d, g);
        if (st != LLMCL_OK)
            return st;
    }
    return b->reduce ? llmcl_dist_zero_grads(b->d) : LLMCL_OK;
}

/* Both collectives' throughput in chunks of 1/256 and 1/16 of a group. */
static void chunk_sweep(dist_bench *b)
{
    const uint64_t group = (uint64_t)(b->rows * b->cols) * 4, sizes[2] = {group / 256, group / 16};
    const double bytes = (double)b->groups * (double)group;
    b->reduce = 1;
    b->compute = 0;
    for (size_t i = 0; i < 2; ++i) {
        double ms[2] = {-1.0, -1.0};
        b->chunk = sizes[i];
        for (int stage = 2; stage <= 3; ++stage) {
            if (make_dist(b, stage) == LLMCL_OK)
                ms[stage - 2] = wall_ms(b->env, stage == 2 ? backward : gather_pass, b);
            llmcl_dist_destroy(b->d);
            b->d = NULL;
        }
        const double rs = bytes / (ms[0] * 1e-3) * 1e-9, ag = bytes / (ms[1] * 1e-3) * 1e-9;
        if (ms[0] > 0 && ms[1] > 0)
            printf("dist in chunks of %llu KiB: reduce-scatter %.2f GB/s (%.0f%% of the host "
                   "link), all-gather %.2f GB/s (%.0f%%)\n", (unsigned long long)(sizes[i] >> 10),
                   rs, 100.0 * rs / b->link, ag, 100.0 * ag / b->link);
    }
    b->chunk = 0;
}

/*
 * The fixed cost of one collective: reduce-scatters of 16 groups of 4 KiB (16 x 64 f32) through
 * llmcl_dist, back to back with nothing to compute, a group's time each. It sizes the smallest
 * group worth a collective of its own.
 */
static void latency(bench_env *env)
{
    dist_bench t = {.env = env, .groups = 16, .rows = 16, .cols = 64, .reduce = 1};
    llmcl_dist_info in = {0};
    if (make_dist(&t, 2) == LLMCL_OK && llmcl_dist_info_get(t.d, &in) == LLMCL_OK) {
        const double ms = wall_ms(t.env, backward, &t);
        if (ms > 0)
            printf("dist latency: a reduce-scatter of 4 KiB through llmcl_dist on %s takes %.1f us "
                   "(16 in a row, each waited for by the next but one)\n",
                   llmcl_dist_transport_name(in.transport), 1e3 * ms / t.groups);
    }
    llmcl_dist_destroy(t.d);
}

static void add_row(bench_env *env, const char *what, const char *dtype, const char *shape,
                    double ms)
{
    bench_row row = {.ms = ms, .peak_mib = -1, .check = -1};
    snprintf(row.kernel, sizeof row.kernel, "dist %s", what);
    snprintf(row.dtype, sizeof row.dtype, "%s", dtype);
    snprintf(row.shape, sizeof row.shape, "%s", shape);
    bench_add(env, &row);
}

/* The transport's name and its own collectives on raw buffers of one group; 0 if unmeasured. */
static llmcl_dist_info transport_ceiling(dist_bench *b)
{
    llmcl_dist_info in = {0};
    b->own_rs = b->own_ag = 0.0;
    if (llmcl_dist_info_get(b->d, &in) != LLMCL_OK ||
        llmcl_dist_measure_transport(b->d, (uint64_t)b->group_bytes, b->env->reps, &b->own_rs,
                                     &b->own_ag) != LLMCL_OK)
        return in;
    printf("dist transport: %s (%s); its own collectives on raw buffers of %.0f MiB: "
           "reduce-scatter %.1f GB/s, all-gather %.1f GB/s\n",
           llmcl_dist_transport_name(in.transport), in.transport_detail,
           b->group_bytes / 1048576.0, b->own_rs, b->own_ag);
    return in;
}

/* What a collective reached: GB/s, against the transport's own and (MPI) the host link. */
static void print_rate(const dist_bench *b, const char *what, const char *of, double gbs,
                       double own)
{
    printf("dist %s: %.2f GB/s of %s", what, gbs, of);
    if (own > 0)
        printf(", %.0f%% of the transport's own", 100.0 * gbs / own);
    if (b->mpi)
        printf(", %.0f%% of the host link", 100.0 * gbs / b->link);
    printf("\n");
}

/* The backward's operands at `tokens` rows: bf16 x, dy, w and dX, and a zeroed f32 dW. */
static bool make_operands(dist_bench *b, int64_t tokens)
{
    llmcl_ctx *ctx = b->env->ctx;
    const int64_t xs[2] = {tokens, b->cols}, dys[2] = {tokens, b->rows}, ws[2] = {b->rows, b->cols};
    return llmcl_tensor_create(ctx, LLMCL_BF16, 2, xs, &b->x) == LLMCL_OK &&
           llmcl_tensor_create(ctx, LLMCL_BF16, 2, xs, &b->dx) == LLMCL_OK &&
           llmcl_tensor_create(ctx, LLMCL_BF16, 2, ws, &b->w) == LLMCL_OK &&
           llmcl_tensor_create(ctx, LLMCL_F32, 2, ws, &b->plain) == LLMCL_OK &&
           llmcl_fill(ctx, b->plain, 0.0) == LLMCL_OK &&
           llmcl_tensor_create(ctx, LLMCL_BF16, 2, dys, &b->dy) == LLMCL_OK &&
           bench_upload_random(b->x, 1) == LLMCL_OK && bench_upload_random(b->dy, 2) == LLMCL_OK &&
           bench_upload_random(b->w, 3) == LLMCL_OK;
}

/* Stage 2: the reduce-scatters alone, the backward without them and with them, and what of the
   communication the backward leaves exposed. */
static void measure_reduce(dist_bench *b, const char *shape, bool overlap)
{
    const int64_t tokens = b->env->small ? 64 : 8192;
    if (!make_operands(b, tokens)) {
        bench_fail(b->env, "dist: operands", LLMCL_ERROR_OUT_OF_DEVICE_MEMORY);
        return;
    }
    b->reduce = 1;
    const double comm_ms = wall_ms(b->env, backward, b);
    b->compute = 1;
    const double both_ms = wall_ms(b->env, backward, b);
    b->reduce = 0;
    const double compute_ms = wall_ms(b->env, backward, b);
    if (comm_ms <= 0 || both_ms <= 0 || compute_ms <= 0)
        return;
    const double gbs = b->groups * b->group_bytes / (comm_ms * 1e-3) * 1e-9;
    const double exposed = both_ms - compute_ms > 0 ? both_ms - compute_ms : 0;
    char tok[64];
    snprintf(tok, sizeof tok, "%s, %lld tokens", shape, (long long)tokens);
    add_row(b->env, "reduce-scatter", "f32", shape, comm_ms);
    add_row(b->env, "backward, no comm", "bf16", tok, compute_ms);
    add_row(b->env, "backward + reduce", "bf16", tok, both_ms);
    print_rate(b, "reduce-scatter", "gradients", gbs, b->own_rs);
    printf("dist overlap: exposed communication %.3f ms of %.3f ms (%.0f%%; backward %.3f ms "
           "without it; collectives %s the compute, LLMCL_DIST_OVERLAP)\n",
           exposed, comm_ms, 100.0 * exposed / comm_ms, compute_ms, overlap ? "under" : "between");
}

/* Stage 3: every pass gathers each group anew, through two gather buffers for 16 groups. */
static void measure_gather(dist_bench *b, const char *shape)
{
    if (make_dist(b, 3) != LLMCL_OK) {
        bench_fail(b->env, "dist: stage 3 setup", LLMCL_ERROR_MPI);
        return;
    }
    const double gather_ms = wall_ms(b->env, gather_pass, b);
    if (gather_ms > 0) {
        const double gbs = b->groups * b->group_bytes / (gather_ms * 1e-3) * 1e-9;
        add_row(b->env, "all-gather", "f32", shape, gather_ms);
        print_rate(b, "all-gather", "parameters", gbs, b->own_ag);
    }
    llmcl_dist_destroy(b->d);
    b->d = NULL;
}

static void release(dist_bench *b)
{
    llmcl_dist_destroy(b->d);
    llmcl_tensor_destroy(b->x);
    llmcl_tensor_destroy(b->dx);
    llmcl_tensor_destroy(b->w);
    llmcl_tensor_destroy(b->dy);
    llmcl_tensor_destroy(b->plain);
}

/* Two ranks or more: the collectives' throughput against the transport's own and the host link,
   the overlap, the fixed cost and (MPI) the chunk sizes. */
static void measure_link(bench_env *env, int world)
{
    dist_bench b = {.env = env, .groups = 16, .rows = env->small ? 256 : 4096,
                    .cols = env->small ? 1024 : 4096};
    b.group_bytes = (double)b.rows * b.cols * 4;
    double d2h, h2d;
    const llmcl_status hs = llmcl_measure_host_bandwidth(env->ctx, (uint64_t)b.group_bytes, &d2h,
                                                         &h2d);
    if (hs != LLMCL_OK) {
        bench_fail(env, "dist: measuring the host link", hs);
        return;
    }
    b.link = d2h < h2d ? d2h : h2d;
    char shape[48];
    snprintf(shape, sizeof shape, "%d x [%lld, %lld] / %d ranks", b.groups, (long long)b.rows,
             (long long)b.cols, world);
    printf("dist: %d ranks; host link (pinned, this rank's device, llmcl_measure_host_bandwidth): "
           "d2h %.1f GB/s, h2d %.1f GB/s\n", world, d2h, h2d);
    if (make_dist(&b, 2) != LLMCL_OK) {
        bench_fail(env, "dist: stage 2 setup", LLMCL_ERROR_MPI);
        release(&b);
        return;
    }
    const llmcl_dist_info in = transport_ceiling(&b);
    b.mpi = in.transport != LLMCL_DIST_TRANSPORT_NCCL;
    if (b.mpi)
        host_ceilings(&b, (size_t)(b.groups * b.group_bytes), world);
    measure_reduce(&b, shape, in.overlap);
    measure_gather(&b, shape);
    latency(env);
    if (b.mpi)
        chunk_sweep(&b);
    release(&b);
}

static void run(bench_env *env)
{
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world < 2) { /* one rank exchanges nothing: only a collective's fixed cost means anything */
        printf("dist: one rank, no link to measure (mpiexec -n 2 llmcl-bench --only dist): the "
               "fixed cost of a collective alone, the handoffs between the device's queue and "
               "the transport\n");
        latency(env);
        return;
    }
    if (rank != 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout))
            return;
    }
    measure_link(env, world);
}

void bench_dist(bench_env *env)
{
    /* llmcl-bench is no MPI program otherwise: MPI lives for this family only. */
    MPI_Init(NULL, NULL);
    /* A rank a GPU: the node-local device, unless LLMCL_DEVICE names one. */
    llmcl_ctx *shared = env->ctx, *local = NULL;
    const char *dev = getenv("LLMCL_DEVICE");
    if (!(dev && *dev) && llmcl_dist_ctx_create(MPI_COMM_WORLD, &local) == LLMCL_OK)
        env->ctx = local;
    run(env);
    env->ctx = shared;
    llmcl_ctx_destroy(local);
    MPI_Finalize();
}
