/*
 * test_dist.c: ZeRO over MPI (suite mpi), run by Meson under mpiexec -n 1, 2, 3 and 4, on every
 * transport the machine has: host-staged MPI everywhere, NCCL where every rank has a GPU of its own
 * that shares memory with CUDA (each rank takes its node-local device, llmcl_dist_ctx_create).
 *
 * A three-layer MLP (llmcl_matmul, SiLU, a squared error) trains for a few steps with gradient
 * accumulation, weight decay and clipping by the global norm, through llmcl_dist at every stage,
 * and through plain tensors and llmcl_adamw_step on one device (the single-rank reference). Cases:
 * the parameters match the reference (f32: |d| <= 2e-5 + 1e-4 |ref|; bf16 reduction, bf16 params:
 * 5e-3 + 1e-2 |ref|; f16 params: 2e-3 + 2e-3 |ref|) and repeat bit for bit, also when the
 * collectives run in chunks of a few elements (more chunks than the pipeline holds, the last one
 * short, groups that are multiples of neither); device memory after setup equals the documented
 * formulas; a stage-3 checkpoint saved on all ranks loads on 2 and 1 ranks at stages 1 and 2 with
 * the same bits and continues on the uninterrupted trajectory; corrupt, truncated and mismatched
 * checkpoints fail on every rank and leave the run bit-identical to one that never tried; the
 * application's files of a checkpoint (llmcl_dist_save_with, llmcl_dist_load_with) are written
 * into the temporary folder and read from the checkpoint's, and a callback failing on one rank
 * fails the call on every rank, the previous checkpoint and the live state untouched, and saves
 * in a row whose application's files include a sub-folder each replace the last; a load,
 * and init_param of the group's parameter, while a stage-3 group is gathered are refused, the
 * state untouched; the step's norm asked for on rank 0 alone and get_param's values NULL on odd
 * ranks (every rank joins the collectives all the same);
 * llmcl_dist_measure_transport reports rates and refuses bad arguments, and fails on every rank
 * where the last has no host memory for its buffers (MPI);
 * different parameter sets or chunk sizes on different ranks fail setup on every rank, and so does
 * a layout past 2^63 - 1 elements (LLMCL_ERROR_OVERFLOW); destroy
 * gives back every byte and file descriptor; the transport choice (forced, automatic, by
 * LLMCL_DIST_TRANSPORT, a missing LLMCL_NCCL library) and, where NCCL runs, its results against
 * MPI's (f32: within 1e-6 + 1e-5 |MPI|; they differ only in the order of the sums). With
 * --nccl-timeout (one rank), the NCCL watchdog's abort of a call that outlives LLMCL_NCCL_TIMEOUT. With
 * --abort, rank 1 fails inside a step and the job must end through MPI_Abort (dist_abort runs it
 * under tests/expect_failure.py, which wants the failed job and rank 1's message).
 *
 * Not cmocka: a failed assertion on one rank would leave the others waiting in a collective, so
 * every check ends the whole job through MPI_Abort instead.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "llmcl.h"
#include "llmcl_dist.h"

static int rank, world;
static llmcl_ctx *ctx;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "rank %d: %s:%d: %s: ", rank, __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

#define OK(expr)                                                                                  \
    do {                                                                                          \
        llmcl_status ok_st = (expr);                                                              \
        CHECK(ok_st == LLMCL_OK, "%s: %s", llmcl_status_str(ok_st), llmcl_last_error(ctx));       \
    } while (0)

/* ---- the model: 8 -> 12 -> 10 -> 6, SiLU between, one group per layer ---- */

enum { LAYERS = 3, NP = 2 * LAYERS, BATCH = 12, MICRO = 2 };
static const int64_t dims[LAYERS + 1] = {8, 12, 10, 6};
static char names[NP][16];
static int64_t shapes[NP][2];
static int64_t numels[NP];

static void model_init(void)
{
    for (int k = 0; k < LAYERS; ++k) {
        snprintf(names[2 * k], sizeof names[0], "l%d.w", k);
        snprintf(names[2 * k + 1], sizeof names[0], "l%d.b", k);
        shapes[2 * k][0] = dims[k + 1];
        shapes[2 * k][1] = dims[k];
        shapes[2 * k + 1][0] = dims[k + 1];
        numels[2 * k] = dims[k + 1] * dims[k];
        numels[2 * k + 1] = dims[k + 1];
    }
}

/* Deterministic values in [-scale, scale) from a seed. */
static void fill(float *x, int64_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = scale * (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

static llmcl_adamw_opts hyper(int64_t step)
{
    return (llmcl_adamw_opts){.lr = 1e-2f, .weight_decay = 0.1f, .step = step,
                              .grad_scale = 1.0f / (BATCH * MICRO), .max_grad_norm = 0.5f};
}

/* A trainer: through a dist, or (d NULL) plain tensors on this rank alone. */
typedef struct net {
    llmcl_dist *d;
    MPI_Comm comm;
    int rank, world;
    llmcl_dtype pt;
    llmcl_tensor *p[NP], *g[NP], *master[NP], *m[NP], *v[NP], *norm;
} net;

static llmcl_tensor *tensor(llmcl_dtype dt, int64_t r, int64_t c)
{
    const int64_t shape[2] = {r, c};
    llmcl_tensor *t;
    OK(llmcl_tensor_create(ctx, dt, 2, shape, &t));
    return t;
}

static llmcl_tensor *param(net *n, int i)
{
    llmcl_tensor *t = n->p[i];
    if (n->d)
        OK(llmcl_dist_param(n->d, names[i], &t));
    return t;
}

static llmcl_tensor *grad(net *n, int i)
{
    llmcl_tensor *t = n->g[i];
    if (n->d)
        OK(llmcl_dist_grad(n->d, names[i], &t));
    return t;
}

static void upload_as(llmcl_tensor *t, const float *x, int64_t count)
{
    if (llmcl_tensor_dtype(t) == LLMCL_F32) {
        OK(llmcl_tensor_upload(t, x, (size_t)count * 4));
        return;
    }
    uint16_t *h = malloc((size_t)count * 2);
    for (int64_t i = 0; i < count; ++i)
        h[i] = llmcl_tensor_dtype(t) == LLMCL_BF16 ? llmcl_f32_to_bf16(x[i]) : llmcl_f32_to_f16(x[i]);
    OK(llmcl_tensor_upload(t, h, (size_t)count * 2));
    free(h);
}

static void init_values(float *x, int i)
{
    fill(x, numels[i], 100 + (uint64_t)i, i % 2 ? 0.1f : 0.5f);
}

static int64_t round_up(int64_t n, int64_t unit)
{
    return (n + unit - 1) / unit * unit;
}

/* Layer k's group by llmcl_dist_setup's documented layout: each parameter from a multiple of 16
   elements, the group padded to a multiple of 16 x world. */
static uint64_t group_numel(int k)
{
    const int64_t n = round_up(numels[2 * k], 16) + round_up(numels[2 * k + 1], 16);
    return (uint64_t)round_up(n, 16 * (int64_t)world);
}

/* Stage 3 reads only a rank's part of init_param's values: when set, the rest is NaN. */
static int poison_others;

/* NaN in x (parameter i's values) outside this rank's part of its group (llmcl_dist_setup's
   layout: the weight first, the bias from the next multiple of 16). */
static void poison_outside_shard(float *x, int i, MPI_Comm comm)
{
    int r, p;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &p);
    const int k = i / 2;
    const int64_t off = i % 2 ? round_up(numels[2 * k], 16) : 0;
    const int64_t n = round_up(round_up(numels[2 * k], 16) + round_up(numels[2 * k + 1], 16),
                               16 * (int64_t)p);
    const int64_t lo = r * (n / p), hi = lo + n / p;
    for (int64_t j = 0; j < numels[i]; ++j)
        if (off + j < lo || off + j >= hi)
            x[j] = NAN;
}

/* llmcl_dist_opts.chunk_bytes, .transport and .overlap of the nets created next (0: the
   defaults). */
static uint64_t chunk;
static llmcl_dist_transport transport;
static llmcl_dist_overlap overlap;

static void net_create(net *n, MPI_Comm comm, int stage, llmcl_dtype pt, llmcl_dtype rt)
{
    memset(n, 0, sizeof *n);
    n->comm = comm;
    n->pt = pt;
    MPI_Comm_rank(comm, &n->rank);
    MPI_Comm_size(comm, &n->world);
    float *x = malloc(sizeof(float) * 1024);
    if (stage > 0) {
        const llmcl_dist_opts o = {.stage = stage, .param_dtype = pt, .reduce_dtype = rt,
                                   .chunk_bytes = chunk, .transport = transport,
                                   .overlap = overlap};
        OK(llmcl_dist_create(ctx, comm, &o, &n->d));
        for (int i = 0; i < NP; ++i)
            OK(llmcl_dist_add_param(n->d, names[i], i / 2, i % 2 ? 1 : 2, shapes[i], i % 2));
        OK(llmcl_dist_setup(n->d));
        for (int i = 0; i < NP; ++i) {
            init_values(x, i);
            if (poison_others && stage == 3)
                poison_outside_shard(x, i, comm);
            OK(llmcl_dist_init_param(n->d, names[i], x));
        }
        free(x);
        return;
    }
    for (int i = 0; i < NP; ++i) {
        const int nd = i % 2 ? 1 : 2;
        OK(llmcl_tensor_create(ctx, pt, nd, shapes[i], &n->p[i]));
        OK(llmcl_tensor_create(ctx, LLMCL_F32, nd, shapes[i], &n->g[i]));
        OK(llmcl_tensor_create(ctx, LLMCL_F32, nd, shapes[i], &n->master[i]));
        OK(llmcl_tensor_create(ctx, LLMCL_F32, nd, shapes[i], &n->m[i]));
        OK(llmcl_tensor_create(ctx, LLMCL_F32, nd, shapes[i], &n->v[i]));
        init_values(x, i);
        upload_as(n->p[i], x, numels[i]);
        OK(llmcl_tensor_upload(n->master[i], x, (size_t)numels[i] * 4));
        OK(llmcl_fill(ctx, n->g[i], 0.0));
        OK(llmcl_fill(ctx, n->m[i], 0.0));
        OK(llmcl_fill(ctx, n->v[i], 0.0));
    }
    const int64_t one = 1;
    OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &one, &n->norm));
    free(x);
}

static void net_destroy(net *n)
{
    llmcl_dist_destroy(n->d);
    for (int i = 0; i < NP; ++i) {
        llmcl_tensor_destroy(n->p[i]);
        llmcl_tensor_destroy(n->g[i]);
        llmcl_tensor_destroy(n->master[i]);
        llmcl_tensor_destroy(n->m[i]);
        llmcl_tensor_destroy(n->v[i]);
    }
    llmcl_tensor_destroy(n->norm);
}

/* t in dtype dt: t itself, or a cast into *tmp (the caller frees it). */
static llmcl_tensor *as_dtype(llmcl_tensor *t, llmcl_dtype dt, llmcl_tensor **tmp)
{
    *tmp = NULL;
    if (llmcl_tensor_dtype(t) == dt)
        return t;
    *tmp = tensor(dt, llmcl_tensor_dim(t, 0), llmcl_tensor_dim(t, 1));
    OK(llmcl_cast(ctx, t, *tmp));
    return *tmp;
}

/* One micro-batch: this rank's rows of the global batch (step, micro), forward and backward. */
static void micro_batch(net *n, int64_t step, int micro)
{
    const int64_t rows = BATCH / n->world, first = n->rank * rows;
    float *x = malloc(sizeof(float) * BATCH * (size_t)(dims[0] + dims[LAYERS]));
    float *y = x + BATCH * dims[0];
    fill(x, BATCH * dims[0], (uint64_t)(1000 * step + micro), 1.0f);
    fill(y, BATCH * dims[LAYERS], (uint64_t)(5000 * step + micro), 1.0f);
    llmcl_tensor *in[LAYERS], *h[LAYERS], *tmp = NULL;
    in[0] = tensor(n->pt, rows, dims[0]);
    upload_as(in[0], x + first * dims[0], rows * dims[0]);
    for (int k = 0; k < LAYERS; ++k) {
        if (n->d)
            OK(llmcl_dist_gather(n->d, k));
        h[k] = tensor(LLMCL_F32, rows, dims[k + 1]);
        const llmcl_matmul_opts mo = {.trans_b = 1, .bias = param(n, 2 * k + 1)};
        OK(llmcl_matmul(ctx, 1.0f, in[k], param(n, 2 * k), 0.0f, h[k], &mo));
        if (k + 1 < LAYERS) {
            llmcl_tensor *a = tensor(LLMCL_F32, rows, dims[k + 1]);
            OK(llmcl_activation_forward(ctx, LLMCL_ACT_SILU, h[k], a));
            in[k + 1] = tensor(n->pt, rows, dims[k + 1]);
            OK(llmcl_cast(ctx, a, in[k + 1]));
            llmcl_tensor_destroy(a);
        }
        if (n->d)
            OK(llmcl_dist_release(n->d, k));
    }
    /* d loss / d out = out - y for loss = sum 0.5 (out - y)^2 */
    llmcl_tensor *target = tensor(LLMCL_F32, rows, dims[LAYERS]);
    OK(llmcl_tensor_upload(target, y + first * dims[LAYERS], (size_t)(rows * dims[LAYERS]) * 4));
    llmcl_tensor *dy = h[LAYERS - 1];
    OK(llmcl_axpy(ctx, -1.0f, target, dy));
    llmcl_tensor *ones = tensor(n->pt, 1, rows);
    OK(llmcl_fill(ctx, ones, 1.0));
    for (int k = LAYERS - 1; k >= 0; --k) {
        if (n->d)
            OK(llmcl_dist_gather(n->d, k));
        llmcl_tensor *dyp = as_dtype(dy, n->pt, &tmp);
        const llmcl_matmul_opts ta = {.trans_a = 1};
        OK(llmcl_matmul(ctx, 1.0f, dyp, in[k], 1.0f, grad(n, 2 * k), &ta));
        llmcl_tensor *gb = grad(n, 2 * k + 1), *gb2;
        const int64_t row_shape[2] = {1, dims[k + 1]};
        OK(llmcl_tensor_view(gb, 2, row_shape, NULL, llmcl_tensor_offset(gb), &gb2));
        OK(llmcl_matmul(ctx, 1.0f, ones, dyp, 1.0f, gb2, NULL));
        llmcl_tensor_destroy(gb2);
        if (k > 0) {
            llmcl_tensor *dx = tensor(LLMCL_F32, rows, dims[k]);
            OK(llmcl_matmul(ctx, 1.0f, dyp, param(n, 2 * k), 0.0f, dx, NULL));
            OK(llmcl_activation_backward(ctx, LLMCL_ACT_SILU, h[k - 1], dx, h[k - 1]));
            llmcl_tensor_destroy(dx);
        }
        llmcl_tensor_destroy(tmp);
        if (n->d) {
            OK(llmcl_dist_grads_ready(n->d, k));
            OK(llmcl_dist_release(n->d, k));
        }
        dy = k > 0 ? h[k - 1] : NULL;
    }
    for (int k = 0; k < LAYERS; ++k) {
        llmcl_tensor_destroy(in[k]);
        llmcl_tensor_destroy(h[k]);
    }
    llmcl_tensor_destroy(target);
    llmcl_tensor_destroy(ones);
    free(x);
}

static llmcl_dist_info info_of(llmcl_dist *d)
{
    llmcl_dist_info in;
    OK(llmcl_dist_info_get(d, &in));
    return in;
}

/*
 * Under stages 1-2 with the collectives under the compute, a parameter's view is refused until
 * gather has waited for its group's part of the step's all-gather; otherwise it is ready at once.
 */
static void expect_gather_first(net *n)
{
    const llmcl_dist_info in = info_of(n->d);
    if (in.stage == 3)
        return;
    llmcl_tensor *t = NULL;
    const int last = LAYERS - 1;
    const llmcl_status st = llmcl_dist_param(n->d, names[2 * last], &t);
    if (in.overlap) {
        CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT && strstr(llmcl_last_error(ctx), "has not landed"),
              "a view of a group still being gathered: %s", llmcl_status_str(st));
        OK(llmcl_dist_gather(n->d, last));
        OK(llmcl_dist_param(n->d, names[2 * last], &t));
    } else {
        OK(st);
    }
}

static void train_step(net *n, int64_t step)
{
    for (int mb = 0; mb < MICRO; ++mb)
        micro_batch(n, step, mb);
    llmcl_adamw_opts o = hyper(step);
    if (n->d) {
        float norm;
        OK(llmcl_dist_step(n->d, &o, &norm));
        CHECK(isfinite(norm) && norm > 0.0f, "norm %g", norm);
        OK(llmcl_dist_zero_grads(n->d));
        expect_gather_first(n);
        return;
    }
    llmcl_adamw_tensor t[NP];
    for (int i = 0; i < NP; ++i)
        t[i] = (llmcl_adamw_tensor){n->p[i], n->master[i], n->g[i], n->m[i], n->v[i], i % 2};
    OK(llmcl_grad_norm(ctx, (const llmcl_tensor *const *)n->g, NP, 0, n->norm));
    o.grad_norm = n->norm;
    OK(llmcl_adamw_step(ctx, t, NP, &o));
    for (int i = 0; i < NP; ++i)
        OK(llmcl_fill(ctx, n->g[i], 0.0));
}

enum { TOTAL = 1024 };

/* Every parameter's f32 master values, concatenated. */
static void read_params(net *n, float *out)
{
    for (int i = 0; i < NP; ++i) {
        if (n->d)
            OK(llmcl_dist_get_param(n->d, names[i], out));
        else
            OK(llmcl_tensor_download(n->master[i], out, (size_t)numels[i] * 4));
        out += numels[i];
    }
}

static int64_t total_numel(void)
{
    int64_t t = 0;
    for (int i = 0; i < NP; ++i)
        t += numels[i];
    return t;
}

static void expect_close(const char *what, const float *ref, const float *got, double atol,
                         double rtol)
{
    double worst = 0.0;
    int bad = -1;
    for (int64_t i = 0; i < total_numel(); ++i) {
        const double diff = fabs((double)got[i] - ref[i]);
        if (diff > worst)
            worst = diff;
        if (bad < 0 && !(diff <= atol + rtol * fabs(ref[i])))
            bad = (int)i;
    }
    CHECK(bad < 0, "%s: element %d is %.9g, reference %.9g (largest difference %.3g)", what, bad,
          got[bad], ref[bad], worst);
    if (rank == 0)
        printf("  %s: largest difference %.3g\n", what, worst);
}

static void expect_same(const char *what, const float *a, const float *b)
{
    CHECK(memcmp(a, b, (size_t)total_numel() * 4) == 0, "%s: not the same bits", what);
}

/* K steps from the initial values; the final parameters into out. */
static void run(MPI_Comm comm, int stage, llmcl_dtype pt, llmcl_dtype rt, int steps, float *out)
{
    net n;
    net_create(&n, comm, stage, pt, rt);
    for (int s = 1; s <= steps; ++s)
        train_step(&n, s);
    read_params(&n, out);
    net_destroy(&n);
}

/* ---- cases ---- */

enum { K = 3 };

/* Chunks of 28 bytes from each other rank: pieces of 7 f32 or 14 bf16 elements, so up to 12
   chunks where the pipeline holds 4, and shards of 32 to 80 elements, no multiple of them. */
enum { SMALL_CHUNK = 28 };

/* Run a second time in small chunks: the same bits as got. */
static void expect_same_chunked(const char *what, int stage, llmcl_dtype pt, llmcl_dtype rt,
                                const float *got)
{
    static float chunked[TOTAL];
    char name[96];
    chunk = SMALL_CHUNK * (uint64_t)(world > 1 ? world - 1 : 1);
    run(MPI_COMM_WORLD, stage, pt, rt, K, chunked);
    snprintf(name, sizeof name, "%s, in chunks of %llu bytes", what, (unsigned long long)chunk);
    chunk = 0;
    expect_same(name, got, chunked);
}

/* Run again with collectives under the compute and between it: the same bits as got. */
static void expect_same_overlaps(const char *what, int stage, const float *got)
{
    static float other[TOTAL];
    for (overlap = LLMCL_DIST_OVERLAP_ON; overlap <= LLMCL_DIST_OVERLAP_OFF; ++overlap) {
        char name[128];
        run(MPI_COMM_WORLD, stage, LLMCL_F32, LLMCL_F32, K, other);
        snprintf(name, sizeof name, "%s, overlap %s", what,
                 overlap == LLMCL_DIST_OVERLAP_ON ? "on" : "off");
        expect_same(name, got, other);
    }
    overlap = LLMCL_DIST_OVERLAP_AUTO;
}

/* Every stage and dtype mix on the current transport against the single-rank reference; MPI's
   results in mpi_ref (NULL: none yet) for the other transport to be compared with. */
static void test_stages(float (*mpi_ref)[TOTAL])
{
    static float ref[TOTAL], got[TOTAL], again[TOTAL];
    const char *tn = llmcl_dist_transport_name(transport);
    run(MPI_COMM_SELF, 0, LLMCL_F32, LLMCL_F32, K, ref);
    for (int stage = 1; stage <= 3; ++stage) {
        char what[96];
        run(MPI_COMM_WORLD, stage, LLMCL_F32, LLMCL_F32, K, got);
        snprintf(what, sizeof what, "%s: stage %d f32 on %d ranks", tn, stage, world);
        expect_close(what, ref, got, 2e-5, 1e-4);
        run(MPI_COMM_WORLD, stage, LLMCL_F32, LLMCL_F32, K, again);
        expect_same(what, got, again);
        expect_same_overlaps(what, stage, got);
        if (stage == 3) {
            poison_others = 1;
            run(MPI_COMM_WORLD, stage, LLMCL_F32, LLMCL_F32, K, again);
            poison_others = 0;
            expect_same("stage 3 from values NaN outside each rank's part", got, again);
        }
        expect_same_chunked(what, stage, LLMCL_F32, LLMCL_F32, got);
        if (transport == LLMCL_DIST_TRANSPORT_MPI && mpi_ref)
            memcpy(mpi_ref[stage - 1], got, sizeof got);
        else if (mpi_ref) {
            snprintf(what, sizeof what, "stage %d f32: %s against MPI", stage, tn);
            expect_close(what, mpi_ref[stage - 1], got, 1e-6, 1e-5);
        }
    }
    /* Stage 1 sums a bf16 wire copy into its f32 gradients; stages 2-3 into a bf16 shard. */
    run(MPI_COMM_WORLD, 1, LLMCL_F32, LLMCL_BF16, K, got);
    expect_close("stage 1 f32 params, bf16 reduction", ref, got, 5e-3, 1e-2);
    run(MPI_COMM_SELF, 0, LLMCL_BF16, LLMCL_F32, K, ref);
    run(MPI_COMM_WORLD, 3, LLMCL_BF16, LLMCL_BF16, K, got);
    expect_close("stage 3 bf16 params, bf16 reduction", ref, got, 5e-3, 1e-2);
    run(MPI_COMM_WORLD, 3, LLMCL_BF16, LLMCL_BF16, K, again);
    expect_same("stage 3 bf16 params, bf16 reduction", got, again);
    expect_same_chunked("stage 3 bf16 params, bf16 reduction", 3, LLMCL_BF16, LLMCL_BF16, got);
    run(MPI_COMM_WORLD, 2, LLMCL_F16, LLMCL_F32, K, got);
    run(MPI_COMM_SELF, 0, LLMCL_F16, LLMCL_F32, K, ref);
    expect_close("stage 2 f16 params", ref, got, 2e-3, 2e-3);
}

/*
 * llmcl_dist_get_params: the values of llmcl_dist_get_param, with the names in an order that
 * returns to a group already gathered, NULL outputs on odd ranks for the even parameters, and
 * bad names and arguments refused on every rank.
 */
static void test_get_params(void)
{
    static float one[TOTAL], all[TOTAL];
    net n;
    net_create(&n, MPI_COMM_WORLD, 3, LLMCL_F32, LLMCL_F32);
    train_step(&n, 1);
    read_params(&n, one);
    const char *order[NP];
    float *outs[NP];
    int64_t at[NP], offset = 0;
    for (int i = 0; i < NP; ++i)
        at[i] = offset, offset += numels[i];
    for (int k = 0; k < NP; ++k) { /* weights first, then biases: every group twice */
        const int i = k < LAYERS ? 2 * k : 2 * (k - LAYERS) + 1;
        order[k] = names[i];
        outs[k] = rank % 2 && i % 2 == 0 ? NULL : all + at[i];
    }
    for (int i = 0; i < TOTAL; ++i)
        all[i] = NAN;
    OK(llmcl_dist_get_params(n.d, NP, order, outs));
    for (int i = 0; i < NP; ++i)
        if (!(rank % 2 && i % 2 == 0))
            CHECK(memcmp(all + at[i], one + at[i], (size_t)numels[i] * 4) == 0,
                  "get_params: %s differs from get_param's", names[i]);
    OK(llmcl_dist_get_params(n.d, 0, NULL, NULL));
    const char *bad[2] = {names[0], "nope"};
    llmcl_status st = llmcl_dist_get_params(n.d, 2, bad, outs);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT && strstr(llmcl_last_error(ctx), "'nope'"),
          "an unknown name: %s", llmcl_status_str(st));
    st = llmcl_dist_get_params(n.d, 1, NULL, outs);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT, "names NULL: %s", llmcl_status_str(st));
    net_destroy(&n);
}

/* Open file descriptors of this process (-1 where /proc cannot say). */
static int open_fds(void)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return -1;
    int n = 0;
    while (readdir(dir))
        ++n;
    closedir(dir);
    return n;
}

/* Device bytes held after setup, against llmcl_dist.h's formulas, and all of them (and every file
   descriptor) given back by destroy. */
static void test_memory(void)
{
    for (int stage = 1; stage <= 3; ++stage)
        for (int half = 0; half < 2; ++half) {
            const llmcl_dtype pt = half ? LLMCL_BF16 : LLMCL_F32, rt = pt;
            llmcl_memory_stats before, after, freed;
            OK(llmcl_memory_stats_get(ctx, &before));
            const int fds = open_fds();
            net n;
            net_create(&n, MPI_COMM_WORLD, stage, pt, rt);
            OK(llmcl_memory_stats_get(ctx, &after));
            llmcl_dist_info in;
            OK(llmcl_dist_info_get(n.d, &in));
            const uint64_t S = (uint64_t)in.shard_numel, G = (uint64_t)in.max_group;
            const uint64_t p = half ? 2 : 4, w = p;
            const int nccl = in.transport == LLMCL_DIST_TRANSPORT_NCCL;
            uint64_t want = 12 * S + 4 + (half ? 2 * 2 * G : 0) + in.transport_bytes;
            uint64_t F = 0;
            for (int k = 0; k < LAYERS; ++k)
                F += group_numel(k);
            if (stage == 1)
                want += p * F + 4 * F;
            if (stage == 2)
                want += p * F + w * S + 2 * 4 * G;
            if (stage == 3)
                want += p * S + w * S + 2 * 4 * G + 2 * p * G;
            /* NCCL's staging: two channels a kind, an exchange's (bf16, or the copy engines)
               twice the wire's */
            const int ce = nccl && strstr(in.transport_detail, "copy engines");
            const uint64_t staging = 2 * (half || ce ? 2 : 1) * w * G + 2 * p * G;
            CHECK(nccl ? in.transport_bytes > staging && in.transport_bytes < staging + (40u << 20)
                       : in.transport_bytes == 0,
                  "%s: %llu bytes of staging for %llu bytes of collectives",
                  llmcl_dist_transport_name(in.transport), (unsigned long long)in.transport_bytes,
                  (unsigned long long)staging);
            const uint64_t held = after.current_bytes - before.current_bytes;
            CHECK(held == want, "%s, stage %d %s: %llu bytes held, formula %llu",
                  llmcl_dist_transport_name(in.transport), stage, half ? "bf16" : "f32",
                  (unsigned long long)held, (unsigned long long)want);
            CHECK((uint64_t)in.padded_numel == F && in.shard_numel * in.world == in.padded_numel &&
                      in.numel == total_numel(),
                  "layout");
            if (!nccl)
                CHECK((in.host_bytes == 0) == (world == 1) &&
                          in.host_bytes <= 32ull * (4u << 20),
                      "%llu bytes of pinned host memory", (unsigned long long)in.host_bytes);
            if (stage == 3 && half && rank == 0)
                printf("  stage 3 bf16 (%s): (2 + 2 + 12) x %lld + 16 x %lld + 4 = %llu bytes a "
                       "rank (%lld parameters, %d ranks)\n",
                       llmcl_dist_transport_name(in.transport), (long long)S, (long long)G,
                       (unsigned long long)held, (long long)in.numel, world);
            net_destroy(&n);
            OK(llmcl_memory_stats_get(ctx, &freed));
            CHECK(freed.current_bytes == before.current_bytes,
                  "after destroy %llu bytes are held, %llu before",
                  (unsigned long long)freed.current_bytes, (unsigned long long)before.current_bytes);
            if (open_fds() != fds) {
                char cmd[64];
                snprintf(cmd, sizeof cmd, "ls -l /proc/%d/fd >&2", (int)getpid());
                CHECK(system(cmd) >= 0, "%s", cmd);
            }
            CHECK(open_fds() == fds, "%d file descriptors open after destroy, %d before",
                  open_fds(), fds);
        }
}

/* A dist of the MLP's parameters at stage 2 on the given transport: its status, *out on success. */
static llmcl_status create_on(llmcl_dist_transport t, llmcl_dist **out)
{
    const llmcl_dist_opts o = {.stage = 2, .transport = t};
    llmcl_status st = llmcl_dist_create(ctx, MPI_COMM_WORLD, &o, out);
    CHECK(st == LLMCL_OK || !*out, "a failed create returned a dist");
    for (int i = 0; st == LLMCL_OK && i < NP; ++i)
        OK(llmcl_dist_add_param(*out, names[i], i / 2, i % 2 ? 1 : 2, shapes[i], i % 2));
    if (st == LLMCL_OK)
        OK(llmcl_dist_setup(*out));
    return st;
}

/*
 * Which transport runs: MPI where asked for; NCCL where asked for, or a refusal on every rank that
 * says why; automatic runs NCCL exactly where the forced one does, else MPI, saying why not;
 * LLMCL_DIST_TRANSPORT overrides automatic, a bad value of it, of LLMCL_NCCL_CE or of
 * LLMCL_NCCL_TIMEOUT is refused whatever the transport, and a missing LLMCL_NCCL library is named.
 * Returns whether NCCL runs here.
 */
/* MPI and NCCL forced, then the automatic choice: NCCL wherever it can run. Returns whether it
   can. */
static int check_forced_and_auto(void)
{
    llmcl_dist *d;
    OK(create_on(LLMCL_DIST_TRANSPORT_MPI, &d));
    CHECK(info_of(d).transport == LLMCL_DIST_TRANSPORT_MPI, "forced MPI");
    llmcl_dist_destroy(d);

    const llmcl_status forced = create_on(LLMCL_DIST_TRANSPORT_NCCL, &d);
    const int nccl = forced == LLMCL_OK;
    if (nccl) {
        const llmcl_dist_info in = info_of(d);
        CHECK(in.transport == LLMCL_DIST_TRANSPORT_NCCL &&
                  strncmp(in.transport_detail, "NCCL ", 5) == 0 &&
                  (strstr(in.transport_detail, "copy engines") ||
                   strstr(in.transport_detail, "kernels")),
              "forced NCCL runs %s (%s)", llmcl_dist_transport_name(in.transport),
              in.transport_detail);
        llmcl_dist_destroy(d);
    } else {
        CHECK(forced == LLMCL_ERROR_UNSUPPORTED &&
                  strstr(llmcl_last_error(ctx), "the NCCL transport cannot run: "),
              "forced NCCL where it cannot run: %s: %s", llmcl_status_str(forced),
              llmcl_last_error(ctx));
    }
    OK(create_on(LLMCL_DIST_TRANSPORT_AUTO, &d));
    const llmcl_dist_info in = info_of(d);
    CHECK(in.transport == (nccl ? LLMCL_DIST_TRANSPORT_NCCL : LLMCL_DIST_TRANSPORT_MPI) &&
              (nccl || strncmp(in.transport_detail, "NCCL not used: ", 15) == 0),
          "automatic: %s (%s)", llmcl_dist_transport_name(in.transport), in.transport_detail);
    if (rank == 0)
        printf("  transport: %s (%s)\n", llmcl_dist_transport_name(in.transport),
               in.transport_detail);
    llmcl_dist_destroy(d);
    return nccl;
}

/* With the variable set to value, creating on `transport` fails with `want` and a message that
   holds `names`; the variable is unset after. */
static void expect_env_refused(const char *var, const char *value, llmcl_dist_transport transport,
                               llmcl_status want, const char *names)
{
    llmcl_dist *d;
    setenv(var, value, 1);
    const llmcl_status st = create_on(transport, &d);
    CHECK(st == want && strstr(llmcl_last_error(ctx), names), "%s=%s: %s: %s", var, value,
          llmcl_status_str(st), llmcl_last_error(ctx));
    unsetenv(var);
}

/* The environment's say: LLMCL_DIST_TRANSPORT, LLMCL_NCCL_CE, LLMCL_NCCL_TIMEOUT,
   LLMCL_DIST_OVERLAP and LLMCL_NCCL, and the options' overlap; each bad value refused. */
static void check_transport_env(void)
{
    llmcl_dist *d;
    setenv("LLMCL_DIST_TRANSPORT", "mpi", 1);
    OK(create_on(LLMCL_DIST_TRANSPORT_AUTO, &d));
    CHECK(info_of(d).transport == LLMCL_DIST_TRANSPORT_MPI, "LLMCL_DIST_TRANSPORT=mpi");
    llmcl_dist_destroy(d);
    const llmcl_dist_transport any = LLMCL_DIST_TRANSPORT_AUTO;
    expect_env_refused("LLMCL_DIST_TRANSPORT", "infiniband", any, LLMCL_ERROR_INVALID_ARGUMENT,
                       "infiniband");
    expect_env_refused("LLMCL_NCCL_CE", "2", any, LLMCL_ERROR_INVALID_ARGUMENT, "LLMCL_NCCL_CE=2");
    static const char *const bad_timeouts[] = {"5x", "-1", "0", "inf", "nan", "1e999", " "};
    for (size_t i = 0; i < sizeof bad_timeouts / sizeof *bad_timeouts; ++i)
        expect_env_refused("LLMCL_NCCL_TIMEOUT", bad_timeouts[i], any,
                           LLMCL_ERROR_INVALID_ARGUMENT, "LLMCL_NCCL_TIMEOUT=");
    setenv("LLMCL_NCCL_TIMEOUT", "2.5", 1);
    OK(create_on(any, &d));
    llmcl_dist_destroy(d);
    unsetenv("LLMCL_NCCL_TIMEOUT");

    setenv("LLMCL_DIST_OVERLAP", "off", 1);
    OK(create_on(any, &d));
    CHECK(info_of(d).overlap == 0, "LLMCL_DIST_OVERLAP=off");
    llmcl_dist_destroy(d);
    unsetenv("LLMCL_DIST_OVERLAP");
    expect_env_refused("LLMCL_DIST_OVERLAP", "sideways", any, LLMCL_ERROR_INVALID_ARGUMENT,
                       "sideways");
    const llmcl_dist_opts bad = {.stage = 2, .overlap = (llmcl_dist_overlap)7};
    const llmcl_status st = llmcl_dist_create(ctx, MPI_COMM_WORLD, &bad, &d);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT && strstr(llmcl_last_error(ctx), "overlap 7"),
          "overlap 7: %s: %s", llmcl_status_str(st), llmcl_last_error(ctx));
    expect_env_refused("LLMCL_NCCL", "/nonexistent/libnccl.so.2", LLMCL_DIST_TRANSPORT_NCCL,
                       LLMCL_ERROR_UNSUPPORTED, "LLMCL_NCCL=/nonexistent/libnccl.so.2");
}

static int test_transport_choice(void)
{
    const int nccl = check_forced_and_auto();
    check_transport_env();
    return nccl;
}

/* The last rank registers one shape differently (odd case), or asks for other chunks (even). */
static void test_mismatch(void)
{
    for (int c = 0; c < 2; ++c) {
        const int odd_one = rank == world - 1 && world > 1;
        llmcl_dist *d;
        const llmcl_dist_opts o = {.stage = 2, .chunk_bytes = c == 1 && odd_one ? 64 : 0};
        OK(llmcl_dist_create(ctx, MPI_COMM_WORLD, &o, &d));
        for (int i = 0; i < NP; ++i) {
            int64_t shape[2] = {shapes[i][0], shapes[i][1]};
            if (c == 0 && i == 2 && odd_one)
                shape[1] += 1;
            OK(llmcl_dist_add_param(d, names[i], i / 2, i % 2 ? 1 : 2, shape, i % 2));
        }
        const llmcl_status st = llmcl_dist_setup(d);
        if (world > 1)
            CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT && strstr(llmcl_last_error(ctx), "rank"),
                  "setup with different %s gave %s: %s", c ? "chunk sizes" : "parameter sets",
                  llmcl_status_str(st), llmcl_last_error(ctx));
        else
            CHECK(st == LLMCL_OK, "%s", llmcl_last_error(ctx));
        llmcl_dist_destroy(d);
    }
}

/*
 * Parameter sets whose layout passes 2^63 - 1 elements (add_param takes up to INT64_MAX a
 * parameter): setup fails with LLMCL_ERROR_OVERFLOW on every rank, where the sums wrapped before.
 */
static void test_overflow(void)
{
    static const int64_t huge[][2] = {{INT64_MAX, 0}, {(int64_t)1 << 62, (int64_t)1 << 62}};
    for (size_t c = 0; c < sizeof huge / sizeof *huge; ++c) {
        llmcl_dist *d;
        const llmcl_dist_opts o = {.stage = 2};
        OK(llmcl_dist_create(ctx, MPI_COMM_WORLD, &o, &d));
        for (int i = 0; i < 2 && huge[c][i]; ++i)
            OK(llmcl_dist_add_param(d, names[i], 0, 1, &huge[c][i], 0));
        const llmcl_status st = llmcl_dist_setup(d);
        CHECK(st == LLMCL_ERROR_OVERFLOW && strstr(llmcl_last_error(ctx), "2^63"),
              "setup of %lld + %lld elements: %s: %s", (long long)huge[c][0],
              (long long)huge[c][1], llmcl_status_str(st), llmcl_last_error(ctx));
        llmcl_dist_destroy(d);
    }
}

static char folder[256];

static void path(char *out, const char *name)
{
    snprintf(out, 512, "%s/%s", folder, name);
}

/* A fresh copy of folder from at to (rank 0's part of the two below). */
static void copy_folder(const char *from, const char *to)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* Rank 0 copies a checkpoint folder and damages one file of the copy. */
static void damaged_copy(const char *from, const char *to, const char *file, int truncate)
{
    if (rank == 0) {
        char victim[1024];
        copy_folder(from, to);
        snprintf(victim, sizeof victim, "%s/%s", to, file);
        FILE *f = fopen(victim, "r+b");
        CHECK(f, "%s", victim);
        fseek(f, 0, SEEK_END);
        const long size = ftell(f);
        if (truncate) {
            CHECK(ftruncate(fileno(f), size / 2) == 0, "truncate");
        } else {
            fseek(f, size - 5, SEEK_SET);
            const int c = fgetc(f);
            fseek(f, size - 5, SEEK_SET);
            fputc(c ^ 0x40, f);
        }
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Rank 0 copies a checkpoint folder with one number of its manifest replaced: the first
   parameter's (params_key) or the top level's. */
static void tampered_copy(const char *from, const char *to, const char *params_key,
                          const char *key, json_int_t value)
{
    if (rank == 0) {
        char manifest[1024];
        copy_folder(from, to);
        snprintf(manifest, sizeof manifest, "%s/manifest.json", to);
        json_t *root = json_load_file(manifest, 0, NULL);
        CHECK(root, "%s", manifest);
        json_t *obj = params_key ? json_array_get(json_object_get(root, params_key), 0) : root;
        CHECK(json_object_set_new(obj, key, json_integer(value)) == 0, "%s", key);
        CHECK(json_dump_file(root, manifest, 0) == 0, "%s", manifest);
        json_decref(root);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A load of dir, with the application's files callback (may be NULL), refused with want: the
   hyperparameters unwritten and the parameters bit for bit as they were. */
static void expect_refused_with(net *n, const char *dir, llmcl_status want,
                                llmcl_dist_files_fn files, void *user)
{
    static float before[TOTAL], after[TOTAL];
    read_params(n, before);
    llmcl_adamw_opts h = {.step = -7};
    const llmcl_status st = llmcl_dist_load_with(n->d, dir, &h, files, user);
    CHECK(st == want, "load of '%s' gave %s, not %s: %s", dir, llmcl_status_str(st),
          llmcl_status_str(want), llmcl_last_error(ctx));
    CHECK(h.step == -7, "hyperparameters written by a failed load");
    read_params(n, after);
    expect_same("parameters after a refused load", before, after);
}

static void expect_refused(net *n, const char *dir, llmcl_status want)
{
    expect_refused_with(n, dir, want, NULL, NULL);
}

enum { K1 = 2, K2 = 2 };

/* Damaged copies of the checkpoint in dir, each load refused: a corrupt shard, a truncated
   manifest, and numbers that wrap in 32 or 64 bits (a layout outside the files, not a read past
   them). */
static void check_damaged_refused(net *n, const char *dir)
{
    char bad[512], shard[64];
    snprintf(shard, sizeof shard, "shard-%05d.safetensors", world - 1);
    path(bad, "corrupt");
    damaged_copy(dir, bad, shard, 0);
    expect_refused(n, bad, LLMCL_ERROR_BAD_FILE);
    path(bad, "truncated");
    damaged_copy(dir, bad, "manifest.json", 1);
    expect_refused(n, bad, LLMCL_ERROR_BAD_FILE);
    static const struct {
        const char *params_key, *key;
        json_int_t value;
    } tampered[] = {{"params", "offset", INT64_MAX - 2}, {"params", "group", (json_int_t)1 << 32},
                    {NULL, "world_size", ((json_int_t)1 << 32) + 1},
                    {"groups", "numel", INT64_MAX - INT64_MAX % 12}};
    for (size_t i = 0; i < sizeof tampered / sizeof tampered[0]; ++i) {
        path(bad, "tampered");
        tampered_copy(dir, bad, tampered[i].params_key, tampered[i].key, tampered[i].value);
        expect_refused(n, bad, LLMCL_ERROR_BAD_FILE);
    }
}

/* Another parameter set: the checkpoint refused. */
static void check_other_params_refused(const char *dir)
{
    llmcl_dist *d;
    const llmcl_dist_opts o = {.stage = 1};
    OK(llmcl_dist_create(ctx, MPI_COMM_WORLD, &o, &d));
    OK(llmcl_dist_add_param(d, names[0], 0, 2, shapes[0], 0));
    OK(llmcl_dist_setup(d));
    const llmcl_status st = llmcl_dist_load(d, dir, NULL);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT, "a mismatched checkpoint gave %s",
          llmcl_status_str(st));
    llmcl_dist_destroy(d);
}

/* Loaded on 2 ranks (stage 1) and on 1 (stage 2): the saved parameters and step, and the
   straight run's trajectory when training goes on. */
static void continue_on_fewer_ranks(const char *dir, const float *straight, const float *saved)
{
    static float got[TOTAL], loaded[TOTAL];
    for (int size = 2; size >= 1; --size) {
        if (size > world)
            continue;
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, rank < size ? 0 : MPI_UNDEFINED, rank, &sub);
        if (sub == MPI_COMM_NULL)
            continue;
        net n;
        net_create(&n, sub, size == 2 ? 1 : 2, LLMCL_F32, LLMCL_F32);
        llmcl_adamw_opts h;
        OK(llmcl_dist_load(n.d, dir, &h));
        CHECK(h.step == K1 && h.lr == hyper(K1).lr && h.max_grad_norm == hyper(K1).max_grad_norm,
              "loaded step %lld", (long long)h.step);
        read_params(&n, loaded);
        expect_same("parameters loaded on fewer ranks", saved, loaded);
        for (int s = K1 + 1; s <= K1 + K2; ++s)
            train_step(&n, s);
        read_params(&n, got);
        char what[64];
        snprintf(what, sizeof what, "saved on %d ranks, continued on %d", world, size);
        expect_close(what, straight, got, 2e-5, 1e-4);
        net_destroy(&n);
        MPI_Comm_free(&sub);
    }
}

/* What the application's file callbacks saw and do: the folder of their last call, their calls,
   the rank that fails (-1: none), the text rank 0 writes or every rank read, and whether the
   file is app.txt in the folder or in its sub-folder app. */
typedef struct app_files {
    char folder[600], text[32];
    int calls, fail_rank, sub;
} app_files;

/* A callback's call recorded, and app.txt's path in its folder; true where this rank fails. */
static bool app_call(app_files *a, const char *at, char file[700])
{
    a->calls++;
    snprintf(a->folder, sizeof a->folder, "%s", at);
    snprintf(file, 700, "%s/%s", at, a->sub ? "app/app.txt" : "app.txt");
    return rank == a->fail_rank;
}

static llmcl_status write_app_file(const char *at, void *user)
{
    app_files *a = user;
    char file[700];
    if (app_call(a, at, file))
        return LLMCL_ERROR_IO;
    if (rank == 0) {
        char sub[700];
        snprintf(sub, sizeof sub, "%s/app", at);
        CHECK(!a->sub || mkdir(sub, 0755) == 0, "%s", sub);
        FILE *f = fopen(file, "w");
        CHECK(f && fputs(a->text, f) >= 0 && fclose(f) == 0, "%s", file);
    }
    return LLMCL_OK;
}

static llmcl_status read_app_file(const char *at, void *user)
{
    app_files *a = user;
    char file[700];
    if (app_call(a, at, file))
        return LLMCL_ERROR_BAD_FILE;
    FILE *f = fopen(file, "r");
    if (!f)
        return LLMCL_ERROR_IO;
    const size_t n = fread(a->text, 1, sizeof a->text - 1, f);
    a->text[n] = '\0';
    fclose(f);
    return LLMCL_OK;
}

static void expect_app_text(const char *dir, const char *want)
{
    app_files a = {.fail_rank = -1};
    const llmcl_status st = read_app_file(dir, &a);
    CHECK(st == LLMCL_OK && strcmp(a.text, want) == 0, "%s/app.txt holds '%s', not '%s'", dir,
          a.text, want);
}

/*
 * The application's files in a checkpoint (llmcl_dist_save_with, llmcl_dist_load_with): written
 * into the temporary folder before it is renamed, read from the checkpoint's folder. A callback
 * that fails on one rank fails the call on every rank with its status: a save leaves the previous
 * checkpoint and its file whole and no temporary folder, a load leaves the live state as it was.
 */
static void test_checkpoint_files(void)
{
    static float saved[TOTAL], got[TOTAL];
    char dir[512], tmp[600];
    path(dir, "ckpt_files");
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    net n;
    net_create(&n, MPI_COMM_WORLD, 2, LLMCL_F32, LLMCL_F32);
    for (int s = 1; s <= K1; ++s)
        train_step(&n, s);
    app_files w = {.text = "first", .fail_rank = -1};
    OK(llmcl_dist_save_with(n.d, dir, write_app_file, &w));
    CHECK(w.calls == 1 && strcmp(w.folder, tmp) == 0, "save's callback: %d calls, on '%s'",
          w.calls, w.folder);
    expect_app_text(dir, "first");
    read_params(&n, saved);

    train_step(&n, K1 + 1);
    w = (app_files){.text = "second", .fail_rank = world - 1};
    llmcl_status st = llmcl_dist_save_with(n.d, dir, write_app_file, &w);
    CHECK(st == LLMCL_ERROR_IO, "a failed file callback's save gave %s", llmcl_status_str(st));
    CHECK(rank != world - 1 || strstr(llmcl_last_error(ctx), "application's files"),
          "the failing rank's message: %s", llmcl_last_error(ctx));
    MPI_Barrier(MPI_COMM_WORLD);
    expect_app_text(dir, "first");
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);

    app_files r = {.fail_rank = world - 1};
    expect_refused_with(&n, dir, LLMCL_ERROR_BAD_FILE, read_app_file, &r);

    r = (app_files){.fail_rank = -1};
    llmcl_adamw_opts h;
    OK(llmcl_dist_load_with(n.d, dir, &h, read_app_file, &r));
    CHECK(r.calls == 1 && strcmp(r.folder, dir) == 0 && strcmp(r.text, "first") == 0 &&
              h.step == K1,
          "load's callback: %d calls on '%s', read '%s', step %lld", r.calls, r.folder, r.text,
          (long long)h.step);
    read_params(&n, got);
    expect_same("parameters loaded with the application's files", saved, got);
    net_destroy(&n);
    MPI_Barrier(MPI_COMM_WORLD);
}

/*
 * The application's files in a sub-folder of the checkpoint: saves in a row each replace the
 * previous checkpoint, sub-folder and all, leaving no dir.old or dir.tmp, and the load reads the
 * last one's.
 */
static void test_checkpoint_subfolder(void)
{
    char dir[512], side[600];
    path(dir, "ckpt_sub");
    net n;
    net_create(&n, MPI_COMM_WORLD, 1, LLMCL_F32, LLMCL_F32);
    app_files w = {.fail_rank = -1, .sub = 1};
    for (int s = 1; s <= 3; ++s) {
        train_step(&n, s);
        snprintf(w.text, sizeof w.text, "save %d", s);
        OK(llmcl_dist_save_with(n.d, dir, write_app_file, &w));
    }
    static const char *const sides[] = {"tmp", "old"};
    for (int i = 0; i < 2; ++i) {
        snprintf(side, sizeof side, "%s.%s", dir, sides[i]);
        CHECK(access(side, F_OK) != 0, "%s left behind", side);
    }
    app_files r = {.fail_rank = -1, .sub = 1};
    OK(llmcl_dist_load_with(n.d, dir, NULL, read_app_file, &r));
    CHECK(strcmp(r.text, "save 3") == 0, "the load read '%s'", r.text);
    net_destroy(&n);
    MPI_Barrier(MPI_COMM_WORLD);
}

/*
 * Stage 3 with group 0 gathered: a load is refused on every rank, the state as it was (it would
 * forget the gather buffers, and the release that follows free the buffer of no group), and so is
 * init_param of a parameter of the group (its view would keep the old values); after the release
 * init_param runs and the next gather shows its values, and the same load runs.
 */
static void test_while_gathered(void)
{
    static float saved[TOTAL], got[TOTAL];
    char dir[512];
    path(dir, "ckpt_gathered");
    net n;
    net_create(&n, MPI_COMM_WORLD, 3, LLMCL_F32, LLMCL_F32);
    train_step(&n, 1);
    OK(llmcl_dist_save(n.d, dir));
    read_params(&n, saved);
    train_step(&n, 2);
    OK(llmcl_dist_gather(n.d, 0));
    expect_refused(&n, dir, LLMCL_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(llmcl_last_error(ctx), "group 0 is still gathered"), "load while gathered: %s",
          llmcl_last_error(ctx));
    float *x = malloc((size_t)numels[0] * sizeof *x), *seen = malloc((size_t)numels[0] * 4);
    fill(x, numels[0], 77, 1.0f);
    const llmcl_status st = llmcl_dist_init_param(n.d, names[0], x);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT && strstr(llmcl_last_error(ctx), "is gathered"),
          "init_param while its group is gathered: %s: %s", llmcl_status_str(st),
          llmcl_last_error(ctx));
    OK(llmcl_dist_release(n.d, 0));
    OK(llmcl_dist_init_param(n.d, names[0], x));
    OK(llmcl_dist_gather(n.d, 0));
    OK(llmcl_tensor_download(param(&n, 0), seen, (size_t)numels[0] * 4));
    OK(llmcl_dist_release(n.d, 0));
    CHECK(memcmp(x, seen, (size_t)numels[0] * 4) == 0, "the gather after init_param");
    free(x);
    free(seen);
    OK(llmcl_dist_load(n.d, dir, NULL));
    read_params(&n, got);
    expect_same("loaded after the release", saved, got);
    net_destroy(&n);
    MPI_Barrier(MPI_COMM_WORLD);
}

/*
 * Outputs that some ranks leave NULL while the others do not: the step's norm without clipping
 * wanted on rank 0 alone (the same number and step as where every rank asks), and get_param's
 * values on odd ranks. Every rank must still join the collectives, or the others wait in them.
 */
static void test_outputs_on_some_ranks(void)
{
    static float params[2][TOTAL], got[TOTAL];
    float norm[2] = {-1.0f, -1.0f};
    llmcl_adamw_opts o = hyper(1);
    o.max_grad_norm = 0.0f;
    net n;
    for (int every = 0; every < 2; ++every) {
        net_create(&n, MPI_COMM_WORLD, 2, LLMCL_F32, LLMCL_F32);
        micro_batch(&n, 1, 0);
        OK(llmcl_dist_step(n.d, &o, every || rank == 0 ? &norm[every] : NULL));
        read_params(&n, params[every]);
        if (!every)
            net_destroy(&n);
    }
    CHECK(rank != 0 || (isfinite(norm[0]) && norm[0] > 0.0f && norm[0] == norm[1]),
          "rank 0's norm %g asked alone, %g asked by every rank", norm[0], norm[1]);
    expect_same("a step with the norm asked on rank 0 alone", params[0], params[1]);
    int64_t at = 0;
    for (int i = 0; i < NP; ++i) {
        OK(llmcl_dist_get_param(n.d, names[i], rank % 2 ? NULL : got + at));
        at += numels[i];
    }
    CHECK(rank % 2 || memcmp(got, params[1], (size_t)total_numel() * 4) == 0,
          "get_param with NULL values on odd ranks gave other values");
    /* a name unknown on the last rank alone: every rank fails, none waits in a gather */
    const char *asked = rank == world - 1 ? "no such parameter" : names[0];
    float *into = got;
    const llmcl_status st = llmcl_dist_get_params(n.d, 1, &asked, &into);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT, "get_params with a name unknown on rank %d: %s",
          world - 1, llmcl_status_str(st));
    net_destroy(&n);
}

/* The process's address space now, from /proc (0 where it cannot be read). */
static uint64_t address_space_bytes(void)
{
    unsigned long long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%llu", &pages) != 1)
        pages = 0;
    if (f)
        fclose(f);
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* The last rank without room for MPI's buffers of 512 MiB (its address space capped 64 MiB above
   what it holds): every rank fails, none is left waiting in the exchange, and the last says
   why. The others' buffers are small enough to be touched (glibc's calloc clears them under
   Meson's MALLOC_PERTURB_). */
static void measure_without_memory(llmcl_dist *d)
{
    struct rlimit was;
    CHECK(getrlimit(RLIMIT_AS, &was) == 0, "getrlimit");
    const uint64_t now = address_space_bytes();
    CHECK(now > 0, "no /proc/self/statm");
    if (rank == world - 1) {
        const struct rlimit cap = {.rlim_cur = now + (64ull << 20), .rlim_max = was.rlim_max};
        CHECK(cap.rlim_cur < was.rlim_max && setrlimit(RLIMIT_AS, &cap) == 0, "setrlimit");
    }
    double rs, ag;
    const llmcl_status st = llmcl_dist_measure_transport(d, 256ull << 20, 1, &rs, &ag);
    if (rank == world - 1)
        CHECK(setrlimit(RLIMIT_AS, &was) == 0, "setrlimit back");
    CHECK(st == LLMCL_ERROR_OUT_OF_HOST_MEMORY, "measure_transport of 256 MiB, no room on rank %d: "
          "%s", world - 1, llmcl_status_str(st));
    /* another rank may lack the room as well: the host's overcommit decides */
    const char *msg = llmcl_last_error(ctx);
    CHECK(strstr(msg, "268435456 bytes") || (rank < world - 1 && strstr(msg, "another rank")),
          "message: %s", msg);
}

/* llmcl_dist_measure_transport: rates for a buffer of 1 MiB; bad arguments refused on every
   rank (each passes the same); the last rank out of host memory fails it on every rank. */
static void test_measure_transport(void)
{
    llmcl_dist *d;
    OK(create_on(transport, &d));
    double rs = -1, ag = -1;
    OK(llmcl_dist_measure_transport(d, 1 << 20, 2, &rs, &ag));
    CHECK(rs > 0 && ag > 0 && isfinite(rs) && isfinite(ag), "rates %g, %g GB/s", rs, ag);
    static const struct {
        uint64_t bytes;
        int reps, outputs;
    } bad[] = {{1 << 20, 0, 1}, {1 << 20, 1, 0}, {0, 1, 1}, {(1ull << 34) + 4, 1, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        const llmcl_status st = llmcl_dist_measure_transport(
            d, bad[i].bytes, bad[i].reps, bad[i].outputs ? &rs : NULL, &ag);
        CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT, "measure_transport(%llu bytes, %d reps): %s",
              (unsigned long long)bad[i].bytes, bad[i].reps, llmcl_status_str(st));
    }
    const llmcl_status st = llmcl_dist_measure_transport(NULL, 1 << 20, 1, &rs, &ag);
    CHECK(st == LLMCL_ERROR_INVALID_ARGUMENT, "a NULL dist gave %s", llmcl_status_str(st));
    if (transport == LLMCL_DIST_TRANSPORT_MPI)
        measure_without_memory(d);
    llmcl_dist_destroy(d);
}

static void test_checkpoint(void)
{
    static float straight[TOTAL], saved[TOTAL], got[TOTAL];
    char dir[512];
    path(dir, "ckpt");
    run(MPI_COMM_WORLD, 3, LLMCL_F32, LLMCL_F32, K1 + K2, straight);

    net n;
    net_create(&n, MPI_COMM_WORLD, 3, LLMCL_F32, LLMCL_F32);
    for (int s = 1; s <= K1; ++s)
        train_step(&n, s);
    OK(llmcl_dist_save(n.d, dir));
    OK(llmcl_dist_save(n.d, dir)); /* replacing an existing checkpoint */
    read_params(&n, saved);
    check_damaged_refused(&n, dir);
    for (int s = K1 + 1; s <= K1 + K2; ++s)
        train_step(&n, s);
    read_params(&n, got);
    expect_same("after refused loads, the uninterrupted trajectory", straight, got);
    net_destroy(&n);
    check_other_params_refused(dir);
    continue_on_fewer_ranks(dir, straight, saved);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Rank 1 runs out of device memory inside the step: the job must end, not hang. */
static int test_abort(void)
{
    net n;
    net_create(&n, MPI_COMM_WORLD, 2, LLMCL_F32, LLMCL_F32);
    micro_batch(&n, 1, 0);
    llmcl_memory_stats ms;
    OK(llmcl_memory_stats_get(ctx, &ms));
    if (rank == 1)
        OK(llmcl_memory_set_limit(ctx, ms.current_bytes));
    const llmcl_adamw_opts o = hyper(1);
    llmcl_dist_step(n.d, &o, NULL);
    fprintf(stderr, "rank %d: the step returned instead of aborting\n", rank);
    net_destroy(&n);
    return 0;
}

/*
 * The NCCL transport's watchdog, on one rank: with LLMCL_NCCL_TIMEOUT far below the time of a
 * reduce-scatter of 256 MiB, the helper thread aborts the communicator, and the dist calls that
 * follow report it (LLMCL_ERROR_NCCL, naming the timeout) instead of hanging. 77 where NCCL
 * cannot run.
 */
static int test_nccl_timeout(void)
{
    CHECK(world == 1, "--nccl-timeout runs on one rank");
    setenv("LLMCL_NCCL_TIMEOUT", "0.000000001", 1);
    const llmcl_dist_opts o = {.stage = 2, .transport = LLMCL_DIST_TRANSPORT_NCCL,
                               .return_on_error = 1};
    llmcl_dist *d;
    const llmcl_status made = llmcl_dist_create(ctx, MPI_COMM_WORLD, &o, &d);
    if (made == LLMCL_ERROR_UNSUPPORTED) {
        printf("NCCL cannot run here: %s\n", llmcl_last_error(ctx));
        return 77;
    }
    OK(made);
    const int64_t n = 64 << 20;
    OK(llmcl_dist_add_param(d, "w", 0, 1, &n, 0));
    OK(llmcl_dist_setup(d));
    llmcl_tensor *g;
    OK(llmcl_dist_grad(d, "w", &g));
    OK(llmcl_fill(ctx, g, 1.0));
    llmcl_status st = llmcl_dist_grads_ready(d, 0);
    const llmcl_adamw_opts h = hyper(1);
    if (st == LLMCL_OK)
        st = llmcl_dist_step(d, &h, NULL);
    CHECK(st != LLMCL_OK, "a step whose reduce-scatter outlived LLMCL_NCCL_TIMEOUT succeeded");
    st = llmcl_dist_grads_ready(d, 0);
    CHECK(st == LLMCL_ERROR_NCCL && strstr(llmcl_last_error(ctx), "LLMCL_NCCL_TIMEOUT"),
          "after the timeout: %s: %s", llmcl_status_str(st), llmcl_last_error(ctx));
    printf("  %s\n", llmcl_last_error(ctx));
    llmcl_dist_destroy(d);
    printf("test_dist: the NCCL watchdog ended a call that outlived its timeout\n");
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (llmcl_dist_ctx_create(MPI_COMM_WORLD, &ctx) != LLMCL_OK) {
        fprintf(stderr, "rank %d: no device: %s\n", rank, llmcl_last_error(NULL));
        MPI_Finalize();
        return 77;
    }
    model_init();
    if (argc > 1 && strcmp(argv[1], "--nccl-timeout") == 0) {
        const int rc = test_nccl_timeout();
        llmcl_ctx_destroy(ctx);
        MPI_Finalize();
        return rc;
    }
    const int abort_case = argc > 1 && strcmp(argv[1], "--abort") == 0;
    if (abort_case) {
        CHECK(world >= 2, "--abort needs 2 ranks");
        const int rc = test_abort();
        llmcl_ctx_destroy(ctx);
        MPI_Finalize();
        return rc;
    }
    if (rank == 0) {
        snprintf(folder, sizeof folder, "/tmp/llmcl_test_dist_XXXXXX");
        CHECK(mkdtemp(folder), "mkdtemp");
    }
    MPI_Bcast(folder, sizeof folder, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_dist on %d ranks\n", world);
    test_mismatch();
    test_overflow();
    static float mpi_ref[3][TOTAL];
    const int nccl = test_transport_choice();
    for (int t = 0; t <= nccl; ++t) {
        transport = t ? LLMCL_DIST_TRANSPORT_NCCL : LLMCL_DIST_TRANSPORT_MPI;
        if (rank == 0)
            printf("transport %s\n", llmcl_dist_transport_name(transport));
        test_memory();
        test_stages(mpi_ref);
        test_get_params();
        test_checkpoint();
        test_checkpoint_files();
        test_checkpoint_subfolder();
        test_while_gathered();
        test_outputs_on_some_ranks();
        test_measure_transport();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", folder);
        CHECK(system(cmd) == 0, "%s", cmd);
        printf("test_dist: all cases passed on %d ranks\n", world);
    }
    llmcl_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
