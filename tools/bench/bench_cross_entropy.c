/*
 * bench_cross_entropy.c: llmcl-bench rows for the cross-entropy family. Path 1 (materialised bf16
 * logits, forward and forward+backward in place, GB/s over 2 N V 2 bytes), path 2 (chunked linear
 * CE, with 16-bit logits too where the operands are 16-bit), path 3 (fully fused, in chunks or
 * tiles: TFLOP/s of the products it executes) and a naive baseline (full f32 logits through
 * CLBlast, CE with a separate dlogits buffer, then the two gradient GEMMs), each with its peak
 * device memory. Checks run against the double reference on a small problem, and the large runs
 * of paths 2 and 3 must agree with the naive baseline's loss.
 */
#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cross_entropy_ref.h"

/* Deterministic pseudo-random values in [-scale/2, scale/2). */
static float hashval(uint64_t i, float scale)
{
    uint64_t z = i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
    return scale * ((float)(z >> 40) / (float)(1 << 24) - 0.5f);
}

/* A new tensor of dtype filled with hashval(seed + i) through an f32 upload and a cast. */
static llmcl_status make_tensor(llmcl_ctx *ctx, llmcl_dtype dt, int ndim, const int64_t *shape,
                                uint64_t seed, float scale, llmcl_tensor **out)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
        n *= shape[i];
    float *h = malloc((size_t)n * sizeof *h);
    if (!h)
        return LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    for (int64_t i = 0; i < n; ++i)
        h[i] = hashval(seed + (uint64_t)i, scale);
    llmcl_tensor *tmp = NULL;
    llmcl_status st = llmcl_tensor_create(ctx, dt, ndim, shape, out);
    if (st == LLMCL_OK && dt == LLMCL_F32)
        st = llmcl_tensor_upload(*out, h, (size_t)n * 4);
    else if (st == LLMCL_OK) {
        st = llmcl_tensor_create(ctx, LLMCL_F32, ndim, shape, &tmp);
        if (st == LLMCL_OK)
            st = llmcl_tensor_upload(tmp, h, (size_t)n * 4);
        if (st == LLMCL_OK)
            st = llmcl_cast(ctx, tmp, *out);
    }
    llmcl_tensor_destroy(tmp);
    free(h);
    return st;
}

static llmcl_status make_labels(llmcl_ctx *ctx, int64_t n, int64_t v, llmcl_tensor **out)
{
    int64_t *y = malloc((size_t)n * sizeof *y);
    if (!y)
        return LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    for (int64_t i = 0; i < n; ++i)
        y[i] = i % 17 == 3 ? -100 : (int64_t)((i * 2654435761u) % (uint64_t)v);
    llmcl_status st = llmcl_tensor_create(ctx, LLMCL_I64, 1, &n, out);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(*out, y, (size_t)n * sizeof *y);
    free(y);
    return st;
}

static llmcl_status download_f32(llmcl_ctx *ctx, const llmcl_tensor *t, double *out)
{
    const int64_t n = llmcl_tensor_numel(t);
    llmcl_tensor *tmp = NULL;
    float *h = malloc((size_t)n * sizeof *h);
    llmcl_status st =
        h ? llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &tmp) : LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    llmcl_tensor *view = NULL;
    if (st == LLMCL_OK)
        st = llmcl_tensor_view(t, 1, &n, NULL, llmcl_tensor_offset(t), &view);
    if (st == LLMCL_OK)
        st = llmcl_tensor_dtype(t) == LLMCL_F32 ? llmcl_copy(ctx, view, tmp)
                                                : llmcl_cast(ctx, view, tmp);
    if (st == LLMCL_OK)
        st = llmcl_tensor_download(tmp, h, (size_t)n * 4);
    for (int64_t i = 0; st == LLMCL_OK && i < n; ++i)
        out[i] = h[i];
    llmcl_tensor_destroy(view);
    llmcl_tensor_destroy(tmp);
    free(h);
    return st;
}

static bool close_all(const double *ref, const double *got, size_t n, double atol, double rtol)
{
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(ref[i] - got[i]) <= atol + rtol * fabs(ref[i])))
            return false;
    return true;
}

/* ---- the state every timed op reads ---- */

typedef struct ce_bench {
    int64_t n, h, v;
    llmcl_tensor *logits, *labels, *loss, *lse;
    llmcl_tensor *hidden, *weight, *dh, *dw;
    llmcl_tensor *full, *dfull; /* naive baseline: f32 logits and dlogits [n, v] */
    llmcl_ce_options opts;
} ce_bench;

static llmcl_status op_ce_fwd(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    return llmcl_cross_entropy_forward(ctx, b->logits, b->labels, &b->opts, b->loss, NULL, b->lse,
                                       NULL);
}

static llmcl_status op_ce_fwd_bwd(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    return llmcl_cross_entropy_forward(ctx, b->logits, b->labels, &b->opts, b->loss, NULL, b->lse,
                                       b->logits);
}

static llmcl_status op_linear(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    return llmcl_linear_cross_entropy_forward(ctx, b->hidden, b->weight, NULL, b->labels, &b->opts,
                                              b->loss, NULL, b->dh, b->dw, NULL);
}

static llmcl_status op_fused_fwd(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    return llmcl_fused_cross_entropy_forward(ctx, b->hidden, b->weight, NULL, b->labels, &b->opts,
                                             b->loss, NULL, b->lse);
}

static llmcl_status op_fused_bwd(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    return llmcl_fused_cross_entropy_backward(ctx, b->hidden, b->weight, NULL, b->labels, b->lse,
                                              NULL, &b->opts, b->dh, b->dw, NULL);
}

static llmcl_status op_fused_both(llmcl_ctx *ctx, void *arg)
{
    llmcl_status st = op_fused_fwd(ctx, arg);
    return st == LLMCL_OK ? op_fused_bwd(ctx, arg) : st;
}

/* Row-major f32 GEMM through CLBlast on ctx's queue (the baseline's own, outside the library). */
static llmcl_status gemm(llmcl_ctx *ctx, bool ta, bool tb, size_t m, size_t n, size_t k,
                         const llmcl_tensor *a, size_t lda, const llmcl_tensor *b, size_t ldb,
                         llmcl_tensor *c, size_t ldc)
{
    cl_command_queue q = llmcl_ctx_cl_queue(ctx);
    CLBlastStatusCode s = CLBlastSgemm(
        CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo,
        tb ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, 1.0f, llmcl_tensor_cl_mem(a), 0,
        lda, llmcl_tensor_cl_mem(b), 0, ldb, 0.0f, llmcl_tensor_cl_mem(c), 0, ldc, &q, NULL);
    return s == CLBlastSuccess ? LLMCL_OK : LLMCL_ERROR_UNSUPPORTED;
}

/*
 * Naive: logits = hidden W^T in full, CE with a separate dlogits buffer, dhidden = dlogits W,
 * dW = dlogits^T hidden. Its tensors are allocated inside, so that its peak counts them. CLBlast's
 * kernels are not in llmcl's profile, so its time is wall-clock around a finish.
 */
static llmcl_status op_naive(llmcl_ctx *ctx, void *arg)
{
    ce_bench *b = arg;
    const int64_t shape[2] = {b->n, b->v};
    llmcl_status st = llmcl_tensor_create(ctx, LLMCL_F32, 2, shape, &b->full);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(ctx, LLMCL_F32, 2, shape, &b->dfull);
    if (st == LLMCL_OK)
        st = gemm(ctx, false, true, b->n, b->v, b->h, b->hidden, b->h, b->weight, b->h, b->full,
                  b->v);
    if (st == LLMCL_OK)
        st = llmcl_cross_entropy_forward(ctx, b->full, b->labels, &b->opts, b->loss, NULL, b->lse,
                                         b->dfull);
    if (st == LLMCL_OK)
        st =
            gemm(ctx, false, false, b->n, b->h, b->v, b->dfull, b->v, b->weight, b->h, b->dh, b->h);
    if (st == LLMCL_OK)
        st = gemm(ctx, true, false, b->v, b->h, b->n, b->dfull, b->v, b->hidden, b->h, b->dw, b->h);
    if (st == LLMCL_OK)
        st = llmcl_ctx_finish(ctx);
    llmcl_tensor_destroy(b->full);
    llmcl_tensor_destroy(b->dfull);
    b->full = b->dfull = NULL;
    return st;
}

static double loss_of(bench_env *env, const ce_bench *b)
{
    double l = NAN;
    download_f32(env->ctx, b->loss, &l);
    return l;
}

/* ---- small checks against the double reference ---- */

/* Path 1 on [n, v] bf16 in place: lse of every row and dlogits of the first rows. */
static int check_path1(bench_env *env, int64_t n, int64_t v)
{
    ce_bench b = {.n = n, .v = v};
    const int64_t shape[2] = {n, v}, one = 1;
    int ok = 0;
    double *x = malloc((size_t)(n * v) * sizeof *x), *g = malloc((size_t)(n * v) * sizeof *g);
    double *rg = malloc((size_t)(n * v) * sizeof *rg), *rl = malloc((size_t)n * sizeof *rl);
    double *rz = malloc((size_t)n * sizeof *rz), *lse = malloc((size_t)n * sizeof *lse);
    double *glse = malloc((size_t)n * sizeof *glse);
    int64_t *y = malloc((size_t)n * sizeof *y);
    if (x && g && rg && rl && rz && lse && glse && y &&
        make_tensor(env->ctx, LLMCL_BF16, 2, shape, 11, 8.0f, &b.logits) == LLMCL_OK &&
        make_labels(env->ctx, n, v, &b.labels) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &n, &b.lse) == LLMCL_OK &&
        download_f32(env->ctx, b.logits, x) == LLMCL_OK &&
        llmcl_tensor_download(b.labels, y, (size_t)n * sizeof *y) == LLMCL_OK &&
        op_ce_fwd_bwd(env->ctx, &b) == LLMCL_OK &&
        download_f32(env->ctx, b.logits, g) == LLMCL_OK &&
        download_f32(env->ctx, b.lse, glse) == LLMCL_OK) {
        const ref_ce_opts o = {-100, 0, 0, 0, 0, NULL};
        ref_cross_entropy(x, y, n, v, &o, rl, rz, lse, rg);
        double m = 0;
        for (int64_t i = 0; i < n * v; ++i)
            m = fmax(m, fabs(rg[i]));
        ok = close_all(lse, glse, (size_t)n, 1e-4, 1e-4) &&
             close_all(rl, &(double){loss_of(env, &b)}, 1, 1e-4, 1e-4) &&
             close_all(rg, g, (size_t)(n * v), 8e-3 * m, 1.6e-2);
    }
    llmcl_tensor_destroy(b.logits), llmcl_tensor_destroy(b.labels);
    llmcl_tensor_destroy(b.loss), llmcl_tensor_destroy(b.lse);
    free(x), free(g), free(rg), free(rl), free(rz), free(lse), free(glse), free(y);
    return ok;
}

/* Paths 2 and 3 on a small f32 problem: loss, dhidden and dW against the reference. */
static int check_linear(bench_env *env, int path)
{
    const int64_t n = 48, h = 64, v = 700, one = 1, hs[2] = {n, h}, ws[2] = {v, h};
    ce_bench b = {.n = n, .h = h, .v = v};
    int ok = 0;
    double *hid = malloc((size_t)(n * h) * sizeof *hid), *w = malloc((size_t)(v * h) * sizeof *w);
    double *lg = malloc((size_t)(n * v) * sizeof *lg), *g = malloc((size_t)(n * v) * sizeof *g);
    double *rdh = malloc((size_t)(n * h) * sizeof *rdh),
           *rdw = malloc((size_t)(v * h) * sizeof *rdw);
    double *gdh = malloc((size_t)(n * h) * sizeof *gdh),
           *gdw = malloc((size_t)(v * h) * sizeof *gdw);
    double rdb[700], rl, rz, lse[48];
    int64_t y[48];
    if (hid && w && lg && g && rdh && rdw && gdh && gdw &&
        make_tensor(env->ctx, LLMCL_F32, 2, hs, 21, 2.0f, &b.hidden) == LLMCL_OK &&
        make_tensor(env->ctx, LLMCL_F32, 2, ws, 22, 1.0f, &b.weight) == LLMCL_OK &&
        make_labels(env->ctx, n, v, &b.labels) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &n, &b.lse) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 2, hs, &b.dh) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 2, ws, &b.dw) == LLMCL_OK &&
        download_f32(env->ctx, b.hidden, hid) == LLMCL_OK &&
        download_f32(env->ctx, b.weight, w) == LLMCL_OK &&
        llmcl_tensor_download(b.labels, y, sizeof y) == LLMCL_OK &&
        (path == 2 ? op_linear(env->ctx, &b) : op_fused_both(env->ctx, &b)) == LLMCL_OK &&
        download_f32(env->ctx, b.dh, gdh) == LLMCL_OK &&
        download_f32(env->ctx, b.dw, gdw) == LLMCL_OK) {
        const ref_ce_opts o = {-100, 0, 0, 0, 0, NULL};
        ref_linear(hid, w, NULL, n, h, v, lg);
        ref_cross_entropy(lg, y, n, v, &o, &rl, &rz, lse, g);
        ref_linear_backward(g, hid, w, n, h, v, rdh, rdw, rdb);
        double mh = 0, mw = 0;
        for (int64_t i = 0; i < n * h; ++i)
            mh = fmax(mh, fabs(rdh[i]));
        for (int64_t i = 0; i < v * h; ++i)
            mw = fmax(mw, fabs(rdw[i]));
        ok = close_all(&rl, &(double){loss_of(env, &b)}, 1, 1e-4, 1e-4) &&
             close_all(rdh, gdh, (size_t)(n * h), 1e-4 * mh, 1e-3) &&
             close_all(rdw, gdw, (size_t)(v * h), 1e-4 * mw, 1e-3);
    }
    llmcl_tensor_destroy(b.hidden), llmcl_tensor_destroy(b.weight), llmcl_tensor_destroy(b.labels);
    llmcl_tensor_destroy(b.loss), llmcl_tensor_destroy(b.lse), llmcl_tensor_destroy(b.dh);
    llmcl_tensor_destroy(b.dw);
    free(hid), free(w), free(lg), free(g), free(rdh), free(rdw), free(gdh), free(gdw);
    return ok;
}

/* ---- rows ---- */

static void add_row(bench_env *env, const char *kernel, const char *dir, llmcl_dtype dt,
                    const char *shape, double ms, double bytes, double flops, double peak,
                    double base_ms, int check)
{
    bench_row r = {.ms = ms,
                   .bytes = bytes,
                   .flops = flops,
                   .peak_mib = peak,
                   .baseline_ms = base_ms,
                   .check = check};
    snprintf(r.kernel, sizeof r.kernel, "%s", kernel);
    snprintf(r.direction, sizeof r.direction, "%s", dir);
    snprintf(r.dtype, sizeof r.dtype, "%s", llmcl_dtype_name(dt));
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    bench_add(env, &r);
}

static void bench_path1(bench_env *env, int64_t n, int64_t v)
{
    ce_bench b = {.n = n, .v = v};
    const int64_t shape[2] = {n, v}, one = 1;
    llmcl_status st = make_tensor(env->ctx, LLMCL_BF16, 2, shape, 1, 8.0f, &b.logits);
    if (st == LLMCL_OK)
        st = make_labels(env->ctx, n, v, &b.labels);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &n, &b.lse);
    if (st != LLMCL_OK) {
        bench_fail(env, "cross_entropy setup", st);
    } else {
        char s[48];
        snprintf(s, sizeof s, "N=%lld V=%lld", (long long)n, (long long)v);
        const int check = check_path1(env, 64, v < 4099 ? v : 4099);
        const double nv2 = (double)n * (double)v * 2;
        add_row(env, "ce_logits", "fwd", LLMCL_BF16, s, bench_time(env, op_ce_fwd, &b), nv2, 0,
                bench_peak_mib(env, op_ce_fwd, &b), 0, check);
        add_row(env, "ce_logits", "fwd+bwd", LLMCL_BF16, s, bench_time(env, op_ce_fwd_bwd, &b),
                2 * nv2, 0, bench_peak_mib(env, op_ce_fwd_bwd, &b), 0, check);
    }
    llmcl_tensor_destroy(b.logits), llmcl_tensor_destroy(b.labels);
    llmcl_tensor_destroy(b.loss), llmcl_tensor_destroy(b.lse);
}

static llmcl_status make_linear_tensors(bench_env *env, ce_bench *b, llmcl_dtype dt)
{
    const int64_t hs[2] = {b->n, b->h}, ws[2] = {b->v, b->h}, one = 1;
    llmcl_status st = make_tensor(env->ctx, dt, 2, hs, 2, 2.0f, &b->hidden);
    if (st == LLMCL_OK)
        st = make_tensor(env->ctx, dt, 2, ws, 3, 0.5f, &b->weight);
    if (st == LLMCL_OK)
        st = make_labels(env->ctx, b->n, b->v, &b->labels);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b->loss);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &b->n, &b->lse);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 2, hs, &b->dh);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 2, ws, &b->dw);
    return st;
}

/* The flops of one product of the head: [n, h] by [h, v]. */
static double head_flops(const ce_bench *b)
{
    return 2.0 * (double)b->n * (double)b->h * (double)b->v;
}

/* The chunked form: at its default chunks, at llmcl-train's budget and (16-bit operands) with
   the logits in their dtype. Its loss checked against the naive one where that ran. */
static void chunked_rows(bench_env *env, ce_bench *b, llmcl_dtype dt, const char *s,
                         double naive_ms, double naive_loss)
{
    const double gemm = head_flops(b);
    const double l2_ms = bench_wall_time(env, op_linear, b, 16);
    const double l2 = loss_of(env, b);
    const int c2 = check_linear(env, 2) &&
                   (isnan(naive_loss) || fabs(l2 - naive_loss) < 1e-3 * fabs(naive_loss) + 1e-4);
    add_row(env, "ce_linear_chunked", "fwd+bwd", dt, s, l2_ms, 0, 3 * gemm,
            bench_peak_mib(env, op_linear, b), naive_ms, c2);
    /* llmcl-train's budget: 2048 tokens a chunk at 128256 classes, a quarter of the passes over
       the f32 dW of 256 MiB chunks */
    b->opts.chunk_bytes = 1536ull << 20;
    const double l2b_ms = bench_wall_time(env, op_linear, b, 16);
    const int c2b = c2 && fabs(loss_of(env, b) - l2) <= 1e-4 * fabs(l2) + 1e-5;
    add_row(env, "ce_linear_chunked_1536M", "fwd+bwd", dt, s, l2b_ms, 0, 3 * gemm,
            bench_peak_mib(env, op_linear, b), naive_ms, c2b);
    b->opts.chunk_bytes = 0;
    if (dt != LLMCL_F32) { /* the logits in the operands' dtype (llmcl-train's --ce-logits) */
        b->opts.logits_dtype = dt;
        const double l16_ms = bench_wall_time(env, op_linear, b, 16);
        const int c16 = c2 && fabs(loss_of(env, b) - l2) <= 1e-3 * fabs(l2) + 1e-4;
        add_row(env, "ce_linear_chunked_logits16", "fwd+bwd", dt, s, l16_ms, 0, 3 * gemm,
                bench_peak_mib(env, op_linear, b), naive_ms, c16);
        b->opts.logits_dtype = LLMCL_F32;
    }
}

/* The fused form, forward and backward apart and together; wall time, as CLBlast's event covers
   only one of the kernels an SGEMM enqueues. */
static void fused_rows(bench_env *env, ce_bench *b, llmcl_dtype dt, const char *s, double naive_ms,
                       double naive_loss)
{
    const double gemm = head_flops(b);
    const bool chunks = llmcl_ctx_device_info(env->ctx)->has_mma;
    const char *fused = chunks ? "ce_fused_chunks" : "ce_fused_tiles";
    const double f_ms = bench_wall_time(env, op_fused_fwd, b, 16);
    const double l3 = loss_of(env, b);
    const int c3 = check_linear(env, 3) &&
                   (isnan(naive_loss) || fabs(l3 - naive_loss) < 1e-3 * fabs(naive_loss) + 1e-4);
    add_row(env, fused, "fwd", dt, s, f_ms, 0, gemm, bench_peak_mib(env, op_fused_fwd, b), 0, c3);
    /* executed products: chunks recompute the logits once, tiles once for dhidden and once for
       dW */
    const double bwd_gemms = chunks ? 3 : 4;
    const double b_ms = bench_wall_time(env, op_fused_bwd, b, 16);
    add_row(env, fused, "bwd", dt, s, b_ms, 0, bwd_gemms * gemm,
            bench_peak_mib(env, op_fused_bwd, b), 0, c3);
    add_row(env, fused, "fwd+bwd", dt, s, f_ms + b_ms, 0, (1 + bwd_gemms) * gemm,
            bench_peak_mib(env, op_fused_both, b), naive_ms, c3);
}

static void bench_linear(bench_env *env, int64_t n, int64_t h, int64_t v, llmcl_dtype dt)
{
    ce_bench b = {.n = n, .h = h, .v = v};
    const llmcl_status st = make_linear_tensors(env, &b, dt);
    if (st != LLMCL_OK) {
        bench_fail(env, "linear cross_entropy setup", st);
    } else {
        char s[48];
        snprintf(s, sizeof s, "N=%lld H=%lld V=%lld", (long long)n, (long long)h, (long long)v);
        /* naive baseline (f32 only: CLBlast has no bf16), then the fused forms against its loss */
        double naive_ms = 0, naive_loss = NAN;
        if (dt == LLMCL_F32) {
            naive_ms = bench_wall_time(env, op_naive, &b, 16);
            naive_loss = loss_of(env, &b);
            add_row(env, "ce_naive_clblast", "fwd+bwd", dt, s, naive_ms, 0, 3 * head_flops(&b),
                    bench_peak_mib(env, op_naive, &b), 0, -1);
        }
        chunked_rows(env, &b, dt, s, naive_ms, naive_loss);
        fused_rows(env, &b, dt, s, naive_ms, naive_loss);
    }
    llmcl_tensor_destroy(b.hidden), llmcl_tensor_destroy(b.weight), llmcl_tensor_destroy(b.labels);
    llmcl_tensor_destroy(b.loss), llmcl_tensor_destroy(b.lse), llmcl_tensor_destroy(b.dh);
    llmcl_tensor_destroy(b.dw);
}

void bench_cross_entropy(bench_env *env)
{
    /* the GEMM-bound rows take seconds per run at full size: fewer repetitions (their warm-up is
       bench_wall_time's settling) */
    bench_env few = *env;
    few.reps = env->reps < 3 ? env->reps : 3;
    if (env->small) {
        bench_path1(env, 256, 32000);
        bench_linear(&few, 128, 128, 4096, LLMCL_F32);
        bench_linear(&few, 128, 128, 4096, LLMCL_BF16);
        return;
    }
    bench_path1(env, 8192, 128256);
    bench_linear(&few, 8192, 4096, 128256, LLMCL_F32);
    bench_linear(&few, 8192, 4096, 128256, LLMCL_BF16);
}
