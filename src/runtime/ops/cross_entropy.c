/*
 * cross_entropy.c: host launchers of cross_entropy.cl. The three public forms share one run state
 * (checked options, labels, the stats and per-row scratch) and the same kernels for validation,
 * per-row terms and the final reduction:
 *   llmcl_cross_entropy_forward         ce_prepare, ce_rows or ce_partial/ce_combine/ce_grad,
 *                                       ce_finish
 *   llmcl_linear_cross_entropy_forward  the same per chunk of tokens around llmcl_matmul
 *   llmcl_fused_cross_entropy_*         cce_fwd + ce_combine; cce_coefs, cce_bwd_dh, cce_bwd_dw
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

#define CE_DEFAULT_IGNORE (-100)
#define CE_DEFAULT_BUDGET (256ull << 20)

/* One call's state: checked options and the scratch every form uses. */
typedef struct ce_run {
    llmcl_ctx *ctx;
    llmcl_ce_options o;
    int64_t ignore, n, v;
    llmcl_dtype dt;    /* storage of logits, or of hidden and W */
    llmcl_dtype dx_dt; /* storage of the dlogits the row kernels write (DX_DT): dt, or a linear
                          form's 16-bit product operand written straight from f32 logits */
    const llmcl_tensor *labels;
    llmcl__params rp; /* row-kernel tunables (WG, UNROLL) */
    llmcl_tensor *stats, *rows, *lse;
} ce_run;

static void ce_run_release(ce_run *r)
{
    llmcl_tensor_destroy(r->stats);
    llmcl_tensor_destroy(r->rows);
    llmcl_tensor_destroy(r->lse);
}

/* ---- argument checks ---- */

/* The options against V; logits16 is the 16-bit dtype the form may keep its logits in (the linear
   form's hidden dtype), LLMCL_F32 where it has none. */
static llmcl_status check_options(llmcl_ctx *ctx, const llmcl_ce_options *opts, int64_t v,
                                  llmcl_dtype logits16, llmcl_ce_options *out)
{
    *out = opts ? *opts : (llmcl_ce_options){0};
    const llmcl_ce_options *o = out;
    LLMCL__REQUIRE(ctx, o->reduction >= LLMCL_CE_MEAN && o->reduction <= LLMCL_CE_NONE,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->reduction %d is not a llmcl_ce_reduction",
                   (int)o->reduction);
    LLMCL__REQUIRE(ctx, o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->label_smoothing %g is outside [0, 1]",
                   (double)o->label_smoothing);
    LLMCL__REQUIRE(ctx, o->lse_square_scale >= 0.0f && isfinite(o->lse_square_scale),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->lse_square_scale %g must be finite and >= 0",
                   (double)o->lse_square_scale);
    LLMCL__REQUIRE(ctx, o->softcap >= 0.0f && isfinite(o->softcap), LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->softcap %g must be finite and >= 0 (0: off)", (double)o->softcap);
    LLMCL__REQUIRE(ctx, isfinite(o->grad_scale), LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->grad_scale %g must be finite (0: 1)", (double)o->grad_scale);
    if (out->grad_scale == 0.0f)
        out->grad_scale = 1.0f;
    LLMCL__REQUIRE(ctx, o->grad_filter >= 0.0f && o->grad_filter <= 1.0f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->grad_filter %g is outside [0, 1]",
                   (double)o->grad_filter);
    LLMCL__REQUIRE(ctx, o->vocab_splits >= 0 && o->chunk_rows >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->vocab_splits (%d) and opts->chunk_rows (%lld) must be >= 0",
                   o->vocab_splits, (long long)o->chunk_rows);
    LLMCL__REQUIRE(ctx, o->vocab_chunk >= -1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->vocab_chunk %lld must be >= -1 (-1: tiles, 0: chosen, > 0: classes)",
                   (long long)o->vocab_chunk);
    LLMCL__REQUIRE(ctx, o->logits_dtype == LLMCL_F32 || o->logits_dtype == logits16,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->logits_dtype %s must be F32 or, in the chunked linear form, hidden's "
                   "16-bit dtype (this call takes %s)",
                   llmcl_dtype_name(o->logits_dtype),
                   logits16 == LLMCL_F32 ? "F32 only" : llmcl_dtype_name(logits16));
    if (o->weight) {
        LLMCL__TRY(llmcl__check_tensor(ctx, o->weight, "opts->weight", 1u << LLMCL_F32, 1,
                                       LLMCL_MAX_DIMS));
        LLMCL__REQUIRE(ctx,
                       llmcl_tensor_numel(o->weight) == v && llmcl_tensor_is_contiguous(o->weight),
                       LLMCL_ERROR_SHAPE_MISMATCH,
                       "opts->weight must be contiguous with V = %lld elements (has %lld)",
                       (long long)v, (long long)llmcl_tensor_numel(o->weight));
    }
    return LLMCL_OK;
}

/* loss and z_loss: f32 with 1 element (mean, sum) or n (none); outputs must not alias inputs. */
static llmcl_status check_outputs(llmcl_ctx *ctx, const llmcl_ce_options *o, int64_t n,
                                  const llmcl_tensor *loss, const llmcl_tensor *z_loss,
                                  const llmcl_tensor *const *inputs, const char *const *names,
                                  int n_inputs)
{
    const int64_t want = o->reduction == LLMCL_CE_NONE ? n : 1;
    LLMCL__TRY(llmcl__check_vec(ctx, loss, "loss", 1u << LLMCL_F32, want));
    if (z_loss) {
        LLMCL__TRY(llmcl__check_vec(ctx, z_loss, "z_loss", 1u << LLMCL_F32, want));
        LLMCL__REQUIRE(ctx, !llmcl__overlaps(loss, z_loss), LLMCL_ERROR_INVALID_ARGUMENT,
                       "loss and z_loss overlap");
    }
    for (int i = 0; i < n_inputs; ++i) {
        if (!inputs[i])
            continue;
        LLMCL__REQUIRE(ctx, !llmcl__overlaps(loss, inputs[i]), LLMCL_ERROR_INVALID_ARGUMENT,
                       "loss overlaps %s", names[i]);
        LLMCL__REQUIRE(ctx, !z_loss || !llmcl__overlaps(z_loss, inputs[i]),
                       LLMCL_ERROR_INVALID_ARGUMENT, "z_loss overlaps %s", names[i]);
    }
    return LLMCL_OK;
}

/* ---- shared setup and kernels ---- */

static void base_defines(const ce_run *r, llmcl__defines *d)
{
    llmcl__define_str(d, "DT", llmcl__dtype_macro(r->dt));
    if (r->dx_dt != r->dt)
        llmcl__define_str(d, "DX_DT", llmcl__dtype_macro(r->dx_dt));
    llmcl__define_str(d, "LABEL_DT", llmcl__dtype_macro(r->labels->dtype));
}

/* The kernels' option flags (CE_WEIGHT, CE_SMOOTH, CE_CAP, CE_BIAS in cross_entropy.cl). */
static int32_t ce_flags(const ce_run *r, bool has_bias)
{
    return (r->o.weight ? 1 : 0) | (r->o.label_smoothing != 0.0f ? 2 : 0) |
           (r->o.softcap != 0.0f ? 4 : 0) | (has_bias ? 8 : 0);
}

/* A kernel of the row program: the base defines plus the row tunables. */
static llmcl_status row_kernel(ce_run *r, const char *name, cl_kernel *k)
{
    llmcl__defines d = {0};
    base_defines(r, &d);
    llmcl__params_define(&r->rp, &d);
    return llmcl__kernel(r->ctx, LLMCL_FAMILY_CROSS_ENTROPY, &d, name, k);
}

/* A tensor or, when t is NULL, a NULL buffer with offset 0. */
static void arg_opt(llmcl__args *a, const llmcl_tensor *t)
{
    if (t)
        llmcl__arg_tensor(a, t);
    else
        llmcl__arg_mem(a, NULL, 0);
}

static void arg_weight(llmcl__args *a, const ce_run *r) { arg_opt(a, r->o.weight); }

/* A scratch buffer the kernel takes without an offset (stats, per-row terms, partials). */
static void arg_buf(llmcl__args *a, cl_mem m) { llmcl__arg(a, sizeof m, &m); }

/* The row kernels' tunables for r->dt and r->v (shape class from V). */
static void ce_row_params(ce_run *r)
{
    const llmcl_ctx *ctx = r->ctx;
    const long wg_max = (long)llmcl__pow2_floor(ctx->info.max_work_group_size);
    const long wg = ctx->info.is_gpu ? 512 : 64;
    r->rp = (llmcl__params){0};
    llmcl__param_set(&r->rp, "WG", wg < wg_max ? wg : wg_max);
    llmcl__param_set(&r->rp, "UNROLL", ctx->info.is_gpu ? 2 : 1);
    char cls[16];
    llmcl__shape_class(r->v > 0 ? r->v : 1, cls);
    const llmcl__tune_lookup lookup =
        llmcl__params_lookup(r->ctx, LLMCL_KEY_CE_ROWS, r->dt, cls, &r->rp);
    /* the reductions need a power of two of at least 32; unrolling is bounded */
    const long w = llmcl__param_get(&r->rp, "WG", wg), u = llmcl__param_get(&r->rp, "UNROLL", 1);
    if (w < 32 || w > wg_max || (w & (w - 1)))
        llmcl__param_set(&r->rp, "WG", wg < wg_max ? wg : wg_max);
    if (u < 1 || u > 8)
        llmcl__param_set(&r->rp, "UNROLL", ctx->info.is_gpu ? 2 : 1);
    llmcl__params_record(&lookup, &r->rp);
}

/* Passes of a reduction over the row kernels' work-group (log2 WG halvings and the exit). */
static int64_t reduce_passes(const ce_run *r)
{
    int64_t passes = 1;
    for (long w = llmcl__param_get(&r->rp, "WG", 64); w > 1; w /= 2)
        ++passes;
    return passes;
}

/*
 * Where the device cuts loops short, whether the row kernels' loops fit its budget (llmcl__
 * loop_budget's count): ce_prepare and ce_finish, one work-group over the n labels (and the V
 * class weights), and a row of V logits in one work-group (ce_rows: SCAN_ROW and GRAD_ROW, chunks
 * of 8 logits with UNROLL loads and updates a trip, and three reductions), which bounds every split
 * and chunk of a row.
 */
static llmcl_status check_row_loops(ce_run *r)
{
    const int64_t wg = llmcl__param_get(&r->rp, "WG", 64);
    const int64_t u = llmcl__param_get(&r->rp, "UNROLL", 1);
    const int64_t labels = llmcl__div_up(r->n, wg) + 1, red = reduce_passes(r);
    LLMCL__TRY(llmcl__check_loops(r->ctx, labels + llmcl__div_up(r->v, wg) + 1 + 4 * red,
                                  "cross-entropy: %lld labels, V = %lld", (long long)r->n,
                                  (long long)r->v));
    LLMCL__TRY(llmcl__check_loops(r->ctx, 2 * labels + 2 * red, "cross-entropy: %lld rows",
                                  (long long)r->n));
    const int64_t scan = llmcl__div_up(llmcl__div_up(r->v, 8), wg * u) * (2 * u + 3) + 1;
    return llmcl__check_loops(r->ctx, 2 * scan + 3 * red, "cross-entropy: rows of V = %lld",
                              (long long)r->v);
}

/* ce_combine's two loops (ce_merge) over a row's nslots partials. */
static llmcl_status check_merge_loops(ce_run *r, int64_t nslots)
{
    return llmcl__check_loops(r->ctx, 2 * (nslots + 1), "cross-entropy: %lld partials a row",
                              (long long)nslots);
}

/*
 * Checks the options against V, picks the row tunables, allocates the stats and per-row scratch
 * (lse too unless the caller has one) and enqueues ce_prepare.
 */
static llmcl_status ce_begin(ce_run *r, llmcl_ctx *ctx, llmcl_dtype dt, const llmcl_tensor *labels,
                             int64_t n, int64_t v, bool need_lse)
{
    r->ctx = ctx;
    r->dt = dt;
    r->dx_dt = dt;
    r->labels = labels;
    r->n = n;
    r->v = v;
    r->ignore = r->o.use_ignore_index ? r->o.ignore_index : CE_DEFAULT_IGNORE;

    ce_row_params(r);
    LLMCL__TRY(check_row_loops(r));

    const int64_t four = 4, two_n = 2 * n;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_I32, 1, &four, "cross-entropy stats", &r->stats));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &two_n, "cross-entropy per-row terms", &r->rows));
    if (need_lse)
        LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &n, "cross-entropy lse", &r->lse));

    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_prepare", &k));
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_tensor(&a, labels);
    llmcl__arg_i64(&a, n);
    llmcl__arg_i64(&a, v);
    llmcl__arg_i64(&a, r->ignore);
    arg_weight(&a, r);
    arg_buf(&a, r->stats->mem);
    const size_t g = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    return llmcl__launch(&a, 1, &g, &g);
}

/* Fails with the first out-of-range label when ce_prepare found one (waits for the queue). */
static llmcl_status ce_check_labels(ce_run *r)
{
    return llmcl__check_label_stat(r->ctx, r->stats->mem, 0, r->labels, r->v, r->ignore);
}

/* ce_finish: the per-row terms into loss (and z_loss). */
static llmcl_status ce_finish(ce_run *r, llmcl_tensor *loss, llmcl_tensor *z_loss)
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_finish", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    arg_buf(&a, r->rows->mem);
    llmcl__arg_i64(&a, r->n);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i32(&a, (int32_t)r->o.reduction);
    llmcl__arg_tensor(&a, loss);
    arg_opt(&a, z_loss);
    llmcl__arg_i32(&a, z_loss != NULL);
    const size_t g = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    return llmcl__launch(&a, 1, &g, &g);
}

/* Work-groups per row across the vocabulary for the row kernels. */
static int64_t row_splits(const ce_run *r, int64_t nrows)
{
    const int64_t wg = llmcl__param_get(&r->rp, "WG", 64);
    const int64_t max_splits = r->v / (8 * wg * 2) > 1 ? r->v / (8 * wg * 2) : 1;
    if (r->o.vocab_splits > 0)
        return r->o.vocab_splits;
    const int64_t want = (int64_t)r->ctx->info.compute_units * (r->ctx->info.is_gpu ? 4 : 1);
    int64_t s = nrows >= want ? 1 : llmcl__div_up(want, nrows);
    if (s > max_splits)
        s = max_splits;
    llmcl__params p = {0};
    llmcl__param_set(&p, "SPLIT", (long)s);
    char cls[16];
    llmcl__shape_class(nrows, cls);
    const llmcl__tune_lookup lookup =
        llmcl__params_lookup(r->ctx, LLMCL_KEY_CE_SPLIT, r->dt, cls, &p);
    s = llmcl__param_get(&p, "SPLIT", (long)s);
    s = s >= 1 ? s : 1;
    /* a host-side tunable, no -D define: recorded for llmcl_tune_params_get all the same */
    llmcl__param_set(&p, "SPLIT", (long)s);
    llmcl__params_record(&lookup, &p);
    return s;
}

/* Logits rows to process: nrows rows of x (row r is global row row0 + r), dlogits into dx. */
typedef struct ce_rows_job {
    cl_mem x, dx;
    int64_t xoff, xstride, dxoff, dxstride, nrows, row0;
    bool grad;
    const llmcl_tensor *lse; /* indexed by global row */
} ce_rows_job;

/* The arguments ce_rows and ce_grad share, in their order: rows, labels, options, LSE. */
static void arg_row_terms(llmcl__args *a, const ce_run *r, const ce_rows_job *j)
{
    const llmcl_ce_options *o = &r->o;
    llmcl__arg_i32(a, ce_flags(r, false));
    llmcl__arg_mem(a, j->x, j->xoff);
    llmcl__arg_i64(a, j->xstride);
    llmcl__arg_i64(a, r->v);
    llmcl__arg_tensor(a, r->labels);
    llmcl__arg_i64(a, j->row0);
    arg_weight(a, r);
    arg_buf(a, r->stats->mem);
    llmcl__arg_i32(a, (int32_t)o->reduction);
    llmcl__arg_f32(a, o->grad_scale);
    llmcl__arg_i64(a, r->ignore);
    llmcl__arg_f32(a, o->label_smoothing);
    llmcl__arg_f32(a, o->lse_square_scale);
    llmcl__arg_f32(a, o->softcap);
    llmcl__arg_tensor(a, j->lse);
}

/* Each row in one work-group: its LSE, loss and (with grad) its gradient in one pass. */
static llmcl_status ce_rows_whole(ce_run *r, const ce_rows_job *j, size_t wg)
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_rows", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    arg_row_terms(&a, r, j);
    arg_buf(&a, r->rows->mem);
    llmcl__arg_i64(&a, r->n);
    llmcl__arg_i32(&a, j->grad);
    llmcl__arg_mem(&a, j->grad ? j->dx : NULL, j->dxoff);
    llmcl__arg_i64(&a, j->dxstride);
    const size_t g = (size_t)j->nrows * wg;
    return llmcl__launch(&a, 1, &g, &wg);
}

/* ce_partial: each of a row's splits of the vocabulary, its max and sums into part. */
static llmcl_status ce_partials(ce_run *r, const ce_rows_job *j, const llmcl_tensor *part,
                                int64_t splits, const size_t g2[2], const size_t l2[2])
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_partial", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_mem(&a, j->x, j->xoff);
    llmcl__arg_i64(&a, j->xstride);
    llmcl__arg_i64(&a, r->v);
    arg_weight(&a, r);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_f32(&a, r->o.softcap);
    arg_buf(&a, part->mem);
    llmcl__arg_i64(&a, 0);
    llmcl__arg_i64(&a, splits);
    return llmcl__launch(&a, 2, g2, l2);
}

/*
 * ce_combine: each row's partials over its nslots slots merged in order into its LSE and loss. Its
 * target logit is read from the logits (j->x) or, where the fused product wrote it, from xyb.
 */
static llmcl_status ce_combine(ce_run *r, const ce_rows_job *j, const llmcl_tensor *part,
                               int64_t nslots, const llmcl_tensor *xyb)
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_combine", &k));
    const llmcl_ce_options *o = &r->o;
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    arg_buf(&a, part->mem);
    llmcl__arg_i64(&a, nslots);
    llmcl__arg_i64(&a, j->nrows);
    llmcl__arg_mem(&a, j->x, j->xoff);
    llmcl__arg_i64(&a, j->xstride);
    llmcl__arg_i32(&a, xyb != NULL);
    arg_buf(&a, xyb ? xyb->mem : NULL);
    llmcl__arg_tensor(&a, r->labels);
    llmcl__arg_i64(&a, j->row0);
    arg_weight(&a, r);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i64(&a, r->v);
    llmcl__arg_i64(&a, r->ignore);
    llmcl__arg_f32(&a, o->label_smoothing);
    llmcl__arg_f32(&a, o->lse_square_scale);
    llmcl__arg_f32(&a, o->softcap);
    llmcl__arg_tensor(&a, j->lse);
    arg_buf(&a, r->rows->mem);
    llmcl__arg_i64(&a, r->n);
    const size_t g1 = (size_t)j->nrows, l1 = 64;
    return llmcl__launch(&a, 1, &g1, &l1);
}

/* ce_grad: each split's part of a row's gradient, from the row's LSE. */
static llmcl_status ce_grad(ce_run *r, const ce_rows_job *j, const size_t g2[2],
                            const size_t l2[2])
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "ce_grad", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    arg_row_terms(&a, r, j);
    llmcl__arg_mem(&a, j->dx, j->dxoff);
    llmcl__arg_i64(&a, j->dxstride);
    return llmcl__launch(&a, 2, g2, l2);
}

/* One work-group per row, or the vocabulary split into several when rows are few. */
static llmcl_status ce_rows_run(ce_run *r, const ce_rows_job *j)
{
    const int64_t splits = row_splits(r, j->nrows);
    const size_t wg = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    if (splits == 1)
        return ce_rows_whole(r, j, wg);

    LLMCL__TRY(check_merge_loops(r, splits));
    llmcl_tensor *part = NULL;
    const int64_t np = j->nrows * splits * 3;
    LLMCL__TRY(
        llmcl__scratch(r->ctx, LLMCL_F32, 1, &np, "cross-entropy vocabulary partials", &part));
    const size_t g2[2] = {(size_t)splits * wg, (size_t)j->nrows}, l2[2] = {wg, 1};
    llmcl_status st = ce_partials(r, j, part, splits, g2, l2);
    if (st == LLMCL_OK)
        st = ce_combine(r, j, part, splits, NULL);
    if (st == LLMCL_OK && j->grad)
        st = ce_grad(r, j, g2, l2);
    llmcl_tensor_destroy(part);
    return st;
}

/* ---- path 1: materialised logits ---- */

llmcl_status llmcl_cross_entropy_forward(llmcl_ctx *ctx, const llmcl_tensor *logits,
                                         const llmcl_tensor *labels, const llmcl_ce_options *opts,
                                         llmcl_tensor *loss, llmcl_tensor *z_loss,
                                         llmcl_tensor *lse, llmcl_tensor *dlogits)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__TRY(llmcl__check_tensor(ctx, logits, "logits", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    llmcl__rows xr;
    LLMCL__TRY(llmcl__as_rows(ctx, logits, "logits", &xr));
    LLMCL__REQUIRE(ctx, xr.n_rows >= 1 && xr.row_len >= 1 && xr.n_rows <= INT_MAX,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "logits must have 1 to 2^31-1 rows of V >= 1 (has %lld rows of %lld)",
                   (long long)xr.n_rows, (long long)xr.row_len);
    ce_run r = {0};
    LLMCL__TRY(check_options(ctx, opts, xr.row_len, LLMCL_F32, &r.o));
    LLMCL__TRY(llmcl__check_vec(ctx, labels, "labels", LLMCL__INT_DTYPES, xr.n_rows));
    const llmcl_tensor *ins[] = {logits, labels, r.o.weight, dlogits, lse};
    const char *names[] = {"logits", "labels", "opts->weight", "dlogits", "lse"};
    LLMCL__TRY(check_outputs(ctx, &r.o, xr.n_rows, loss, z_loss, ins, names, 5));
    if (lse) {
        LLMCL__TRY(llmcl__check_vec(ctx, lse, "lse", 1u << LLMCL_F32, xr.n_rows));
        LLMCL__REQUIRE(ctx,
                       !llmcl__overlaps(lse, logits) && !llmcl__overlaps(lse, labels) &&
                           (!dlogits || !llmcl__overlaps(lse, dlogits)) &&
                           (!r.o.weight || !llmcl__overlaps(lse, r.o.weight)),
                       LLMCL_ERROR_INVALID_ARGUMENT,
                       "lse overlaps logits, labels, dlogits or opts->weight");
    }
    /* later rows still read the class weights */
    LLMCL__REQUIRE(ctx, !dlogits || !r.o.weight || !llmcl__overlaps(dlogits, r.o.weight),
                   LLMCL_ERROR_INVALID_ARGUMENT, "dlogits overlaps opts->weight");
    llmcl__rows dr = xr;
    if (dlogits && !llmcl__same_view(logits, dlogits)) {
        LLMCL__TRY(
            llmcl__check_tensor(ctx, dlogits, "dlogits", 1u << logits->dtype, 1, LLMCL_MAX_DIMS));
        LLMCL__TRY(llmcl__check_same_shape(ctx, logits, "logits", dlogits, "dlogits"));
        LLMCL__TRY(llmcl__as_rows(ctx, dlogits, "dlogits", &dr));
        LLMCL__REQUIRE(ctx, !llmcl__overlaps(logits, dlogits) && !llmcl__overlaps(labels, dlogits),
                       LLMCL_ERROR_INVALID_ARGUMENT,
                       "dlogits overlaps logits or labels without being logits itself");
    } else if (dlogits) {
        LLMCL__REQUIRE(ctx, dlogits->dtype == logits->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                       "in-place dlogits must have logits' dtype");
    }

    llmcl_status st;
    LLMCL__TRY_GOTO(st, ce_begin(&r, ctx, logits->dtype, labels, xr.n_rows, xr.row_len, !lse),
                    done);
    const ce_rows_job j = {
        .x = logits->mem,
        .xoff = logits->offset,
        .xstride = xr.row_stride,
        .dx = dlogits ? dlogits->mem : NULL,
        .dxoff = dlogits ? dlogits->offset : 0,
        .dxstride = dr.row_stride,
        .nrows = xr.n_rows,
        .row0 = 0,
        .grad = dlogits != NULL,
        .lse = lse ? lse : r.lse,
    };
    LLMCL__TRY_GOTO(st, ce_rows_run(&r, &j), done);
    LLMCL__TRY_GOTO(st, ce_finish(&r, loss, z_loss), done);
    st = ce_check_labels(&r);
done:
    ce_run_release(&r);
    return st;
}

llmcl_status llmcl_cross_entropy_grad_scale(llmcl_ctx *ctx, const llmcl_tensor *grad_loss,
                                            llmcl_tensor *grad)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__TRY(llmcl__check_vec(ctx, grad_loss, "grad_loss", 1u << LLMCL_F32, 1));
    LLMCL__TRY(llmcl__check_tensor(ctx, grad, "grad", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(grad), LLMCL_ERROR_INVALID_ARGUMENT,
                   "grad must be contiguous");
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(grad, grad_loss), LLMCL_ERROR_INVALID_ARGUMENT,
                   "grad overlaps grad_loss");
    /* the program of path 1 on this dtype with I64 labels, likely built already */
    ce_run r = {.ctx = ctx, .dt = grad->dtype};
    ce_row_params(&r);
    llmcl__defines d = {0};
    llmcl__define_str(&d, "DT", llmcl__dtype_macro(grad->dtype));
    llmcl__define_str(&d, "LABEL_DT", "I64");
    llmcl__params_define(&r.rp, &d);
    cl_kernel k;
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_CROSS_ENTROPY, &d, "ce_scale", &k));
    const int64_t n = llmcl_tensor_numel(grad);
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, grad);
    llmcl__arg_i64(&a, n);
    llmcl__arg_tensor(&a, grad_loss);
    const size_t g = (size_t)n, l = 256;
    return llmcl__launch(&a, 1, &g, &l);
}

/* ---- linear forms: shared checks ---- */

typedef struct ce_linear {
    llmcl__rows h, w, dh, dw;
} ce_linear;

/*
 * hidden [N, H], weight [V, H] and bias [V] of one float dtype; gradient outputs f32, apart from
 * the inputs and opts->weight (a later chunk still reads the class weights).
 */
static llmcl_status check_linear(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                 const llmcl_tensor *weight, const llmcl_tensor *bias,
                                 const llmcl_tensor *labels, const llmcl_ce_options *opts,
                                 const llmcl_tensor *dhidden,
                                 const llmcl_tensor *dweight, const llmcl_tensor *dbias,
                                 ce_linear *out)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, hidden, "hidden", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__as_rows(ctx, hidden, "hidden", &out->h));
    LLMCL__TRY(llmcl__check_tensor(ctx, weight, "weight", 1u << hidden->dtype, 2, 2));
    LLMCL__TRY(llmcl__as_rows(ctx, weight, "weight", &out->w));
    LLMCL__REQUIRE(ctx, out->h.row_len == out->w.row_len && out->h.row_len >= 1,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "hidden rows have H = %lld but weight is [%lld, %lld]; expected [V, H]",
                   (long long)out->h.row_len, (long long)out->w.n_rows, (long long)out->w.row_len);
    LLMCL__REQUIRE(ctx, out->h.n_rows >= 1 && out->h.n_rows <= INT_MAX && out->w.n_rows >= 1,
                   LLMCL_ERROR_SHAPE_MISMATCH, "hidden needs 1 to 2^31-1 rows and weight V >= 1");
    if (bias)
        LLMCL__TRY(llmcl__check_vec(ctx, bias, "bias", 1u << hidden->dtype, out->w.n_rows));
    LLMCL__TRY(llmcl__check_vec(ctx, labels, "labels", LLMCL__INT_DTYPES, out->h.n_rows));
    const llmcl_tensor *ins[] = {hidden, weight, bias, labels, opts ? opts->weight : NULL};
    const char *in_names[] = {"hidden", "weight", "bias", "labels", "opts->weight"};
    const llmcl_tensor *outs[] = {dhidden, dweight, dbias};
    const char *out_names[] = {"dhidden", "dweight", "dbias"};
    if (dhidden)
        LLMCL__TRY(llmcl__check_grad(ctx, hidden, "hidden", dhidden, "dhidden", &out->dh));
    if (dweight)
        LLMCL__TRY(llmcl__check_grad(ctx, weight, "weight", dweight, "dweight", &out->dw));
    if (dbias)
        LLMCL__TRY(llmcl__check_vec(ctx, dbias, "dbias", 1u << LLMCL_F32, out->w.n_rows));
    for (int i = 0; i < 3; ++i) {
        if (!outs[i])
            continue;
        for (int j = 0; j < 5; ++j)
            LLMCL__REQUIRE(ctx, !ins[j] || !llmcl__overlaps(outs[i], ins[j]),
                           LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", out_names[i],
                           in_names[j]);
        for (int j = i + 1; j < 3; ++j)
            LLMCL__REQUIRE(ctx, !outs[j] || !llmcl__overlaps(outs[i], outs[j]),
                           LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", out_names[i],
                           out_names[j]);
    }
    return LLMCL_OK;
}

/* ---- path 2: chunked over tokens through llmcl_matmul ---- */

/*
 * dbias[v0 + j] (+)= sum over rows of g[r, j] for the f32 block g [rows, cols] (row stride cols)
 * through ce_colsum, rows in order: deterministic. Where the device cuts loops short, in launches
 * over blocks of rows within its budget, which give the same bits.
 */
static llmcl_status colsum(llmcl_ctx *ctx, cl_kernel kcol, const llmcl_tensor *g, int64_t rows,
                           int64_t cols, const llmcl_tensor *dbias, int64_t v0, bool accumulate)
{
    const int64_t budget = llmcl__loop_budget(ctx), block = rows < budget - 1 ? rows : budget - 1;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
        llmcl__args a = llmcl__args_begin(ctx, kcol);
        llmcl__arg_mem(&a, g->mem, g->offset + r0 * cols);
        llmcl__arg_i64(&a, rows - r0 < block ? rows - r0 : block);
        llmcl__arg_i64(&a, cols);
        llmcl__arg_mem(&a, dbias->mem, dbias->offset + v0);
        llmcl__arg_i32(&a, accumulate || r0 > 0);
        const size_t global = (size_t)cols, local = 64;
        LLMCL__TRY(llmcl__launch(&a, 1, &global, &local));
    }
    return LLMCL_OK;
}

/*
 * The gradient products of one chunk: dh = g w + dh_beta dh and dw = g^T h + dw_beta dw, each
 * where not NULL. dh_split is the dh product's split_k.
 */
static llmcl_status grad_products(llmcl_ctx *ctx, const llmcl_tensor *g, const llmcl_tensor *w,
                                  const llmcl_tensor *h, llmcl_tensor *dh, float dh_beta,
                                  int dh_split, llmcl_tensor *dw, float dw_beta)
{
    const llmcl_matmul_opts plain = {.split_k = dh_split}, transposed = {.trans_a = 1, .split_k = 1};
    if (dh)
        LLMCL__TRY(llmcl_matmul(ctx, 1.0f, g, w, dh_beta, dh, &plain));
    if (dw)
        LLMCL__TRY(llmcl_matmul(ctx, 1.0f, g, h, dw_beta, dw, &transposed));
    return LLMCL_OK;
}

/*
 * The products' dlogits operand of a chunk whose f32 dlogits are g32 [rows, cols]: g32 itself,
 * or the head of the 16-bit scratch gcast, where the row kernel wrote them (direct) or where they
 * are cast now. *view is the view to destroy.
 */
static llmcl_status dlogits_operand(llmcl_ctx *ctx, const llmcl_tensor *g32, llmcl_tensor *gcast,
                                    bool direct, const llmcl_tensor **g, llmcl_tensor **view)
{
    *g = g32;
    *view = NULL;
    if (!gcast)
        return LLMCL_OK;
    LLMCL__TRY(llmcl__head_view(gcast, g32->shape[0], g32->shape[1], view));
    *g = *view;
    return direct ? LLMCL_OK : llmcl_cast(ctx, g32, *view);
}

/* The class weights from the chunk's first class on (a NULL buffer without weights). */
static void arg_chunk_weight(llmcl__args *a, const ce_run *r, int64_t v0)
{
    if (r->o.weight)
        llmcl__arg_mem(a, r->o.weight->mem, r->o.weight->offset + v0);
    else
        llmcl__arg_mem(a, NULL, 0);
}

/* What the chunked linear form's chunks share: the call's tensors as rows, the scratch and an
   optional hook that supplies each row's upstream gradient (llmcl__linear_ce_hooked). */
typedef struct linear_job {
    const ce_linear *lin;
    const llmcl_tensor *hidden, *w2, *bias, *labels;
    llmcl_tensor *logits, *gcast, *dhidden, *dweight, *dbias;
    cl_kernel kcol;
    llmcl__ce_rows_hook hook;
    void *user;
    llmcl_tensor *g, *coef; /* the hook's upstream gradients [n] and their row coefficients */
} linear_job;

/*
 * The hooked chunk's dlogits: each row's upstream gradient from the hook, folded into the row
 * coefficients (cce_coefs), then cce_chunk_grad over the chunk's whole rows.
 */
static llmcl_status hooked_dlogits(ce_run *r, const linear_job *jb, int64_t r0, int64_t rows,
                                   bool direct)
{
    llmcl_ctx *ctx = r->ctx;
    const llmcl_tensor *labels = r->labels;
    LLMCL__TRY(jb->hook(jb->user, r->rows, jb->g, r0, rows));
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "cce_coefs", &k));
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_i64(&a, rows);
    llmcl__arg_i64(&a, r->v);
    llmcl__arg_mem(&a, labels->mem, labels->offset + r0);
    arg_weight(&a, r);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i32(&a, (int32_t)LLMCL_CE_NONE);
    llmcl__arg_f32(&a, r->o.grad_scale);
    llmcl__arg_i64(&a, r->ignore);
    llmcl__arg_f32(&a, r->o.label_smoothing);
    llmcl__arg_f32(&a, r->o.lse_square_scale);
    llmcl__arg_mem(&a, r->lse->mem, r->lse->offset + r0);
    llmcl__arg_mem(&a, jb->g->mem, jb->g->offset + r0);
    llmcl__arg_i32(&a, 1);
    arg_buf(&a, jb->coef->mem);
    const size_t g1 = (size_t)rows, l1 = 64;
    LLMCL__TRY(llmcl__launch(&a, 1, &g1, &l1));

    LLMCL__TRY(row_kernel(r, "cce_chunk_grad", &k));
    a = llmcl__args_begin(ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_mem(&a, jb->logits->mem, 0);
    llmcl__arg_i64(&a, r->v);
    llmcl__arg_i64(&a, 0);
    llmcl__arg_i64(&a, r->v);
    llmcl__arg_mem(&a, labels->mem, labels->offset + r0);
    arg_chunk_weight(&a, r, 0);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_f32(&a, r->o.softcap);
    arg_buf(&a, jb->coef->mem);
    arg_buf(&a, direct ? jb->gcast->mem : jb->logits->mem);
    const size_t wg = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    const size_t g2[2] = {wg, (size_t)rows}, l2[2] = {wg, 1};
    return llmcl__launch(&a, 2, g2, l2);
}

/*
 * One chunk of rows [r0, r0 + rows): logits (f32, or 16-bit as the caller asked) = hidden x W^T +
 * bias, the row kernels (LSE, per-row terms, dlogits in place; with a hook, the dlogits after it),
 * dbias += column sums, then dhidden = G W and dweight (+)= G^T hidden with G the dlogits in the
 * operands' dtype (gcast: a 16-bit copy of f32 dlogits).
 */
static llmcl_status linear_chunk(ce_run *r, const linear_job *jb, int64_t r0, int64_t rows)
{
    llmcl_ctx *ctx = r->ctx;
    const ce_linear *lin = jb->lin;
    const int64_t v = r->v;
    const bool grads = jb->dhidden || jb->dweight || jb->dbias;
    llmcl_tensor *hv = NULL, *lv = NULL, *dhv = NULL, *gv = NULL;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl__rows_view(jb->hidden, &lin->h, r0, rows, &hv), done);
    LLMCL__TRY_GOTO(st, llmcl__head_view(jb->logits, rows, v, &lv), done);
    const llmcl_matmul_opts logit_opts = {.trans_b = 1, .bias = jb->bias, .split_k = 1};
    LLMCL__TRY_GOTO(st, llmcl_matmul(ctx, 1.0f, hv, jb->w2, 0.0f, lv, &logit_opts), done);
    const bool direct = r->dx_dt != r->dt;
    const ce_rows_job j = {.x = jb->logits->mem, .xstride = v,
                           .dx = direct ? jb->gcast->mem : jb->logits->mem, .dxstride = v,
                           .nrows = rows, .row0 = r0, .grad = grads && !jb->hook, .lse = r->lse};
    LLMCL__TRY_GOTO(st, ce_rows_run(r, &j), done);
    if (grads && jb->hook)
        LLMCL__TRY_GOTO(st, hooked_dlogits(r, jb, r0, rows, direct), done);
    else if (jb->hook)
        LLMCL__TRY_GOTO(st, jb->hook(jb->user, r->rows, NULL, r0, rows), done);
    const bool acc = r0 > 0 || r->o.accumulate_weight_grad;
    if (jb->dbias)
        LLMCL__TRY_GOTO(st, colsum(ctx, jb->kcol, jb->logits, rows, v, jb->dbias, 0, acc), done);
    if (jb->dhidden)
        LLMCL__TRY_GOTO(st, llmcl__rows_view(jb->dhidden, &lin->dh, r0, rows, &dhv), done);
    if (!jb->dhidden && !jb->dweight)
        goto done;
    const llmcl_tensor *g;
    LLMCL__TRY_GOTO(st, dlogits_operand(ctx, lv, jb->gcast, direct, &g, &gv), done);
    /* dhidden of one chunk has few row tiles and a long K (the vocabulary): split K may help */
    st = grad_products(ctx, g, jb->w2, hv, dhv, 0.0f, 0, jb->dweight, acc ? 1.0f : 0.0f);
done:
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(lv);
    llmcl_tensor_destroy(dhv);
    llmcl_tensor_destroy(gv);
    return st;
}

/*
 * The chunked linear form after its checks: chunks of tokens within the budget (whole multiples
 * of align rows), the loss reduced into loss unless a hook takes the rows' terms.
 */
static llmcl_status linear_run(ce_run *r, linear_job *jb, const llmcl_tensor *weight,
                               int64_t align, llmcl_tensor *loss, llmcl_tensor *z_loss)
{
    llmcl_ctx *ctx = r->ctx;
    const ce_linear *lin = jb->lin;
    const llmcl_tensor *hidden = jb->hidden;
    const int64_t n = lin->h.n_rows, v = lin->w.n_rows;
    /* Tokens per chunk: f32 logits, plus their copy in the operands' dtype for the gradient
       products when that dtype is 16-bit; or 16-bit logits, the dlogits in their place. */
    const llmcl_dtype ldt = r->o.logits_dtype;
    const bool gcast_needed =
        ldt == LLMCL_F32 && (jb->dhidden || jb->dweight) && hidden->dtype != LLMCL_F32;
    const uint64_t per_row = (uint64_t)v * (llmcl_dtype_size(ldt) + (gcast_needed ? 2 : 0));
    int64_t c = llmcl__chunk_tokens(
        n, r->o.chunk_rows, r->o.chunk_bytes ? r->o.chunk_bytes : CE_DEFAULT_BUDGET, per_row);
    c = c < align ? align : c - c % align;

    llmcl_status st;
    llmcl_tensor *w2 = NULL;
    LLMCL__TRY_GOTO(st, ce_begin(r, ctx, ldt, jb->labels, n, v, true), done);
    if (gcast_needed && !jb->dbias) /* dbias sums the f32 dlogits */
        r->dx_dt = hidden->dtype;
    LLMCL__TRY_GOTO(st, ce_check_labels(r), done); /* before any product writes a gradient */
    const int64_t lshape[2] = {c, v}, c4 = 4 * c;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, ldt, 2, lshape, "logits chunk", &jb->logits), done);
    if (gcast_needed)
        LLMCL__TRY_GOTO(st,
                        llmcl__scratch(ctx, hidden->dtype, 2, lshape, "16-bit dlogits chunk",
                                       &jb->gcast),
                        done);
    if (jb->hook)
        LLMCL__TRY_GOTO(st,
                        llmcl__scratch(ctx, LLMCL_F32, 1, &c4, "cross-entropy row coefficients",
                                       &jb->coef),
                        done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(weight, &lin->w, 0, v, &w2), done);
    jb->w2 = w2;
    if (jb->dbias)
        LLMCL__TRY_GOTO(st, row_kernel(r, "ce_colsum", &jb->kcol), done);
    for (int64_t r0 = 0; r0 < n; r0 += c)
        LLMCL__TRY_GOTO(st, linear_chunk(r, jb, r0, n - r0 < c ? n - r0 : c), done);
    st = jb->hook ? LLMCL_OK : ce_finish(r, loss, z_loss);
done:
    llmcl_tensor_destroy(jb->logits);
    llmcl_tensor_destroy(jb->gcast);
    llmcl_tensor_destroy(jb->coef);
    llmcl_tensor_destroy(w2);
    return st;
}

llmcl_status llmcl_linear_cross_entropy_forward(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                                const llmcl_tensor *weight,
                                                const llmcl_tensor *bias,
                                                const llmcl_tensor *labels,
                                                const llmcl_ce_options *opts, llmcl_tensor *loss,
                                                llmcl_tensor *z_loss, llmcl_tensor *dhidden,
                                                llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    ce_linear lin;
    LLMCL__TRY(
        check_linear(ctx, hidden, weight, bias, labels, opts, dhidden, dweight, dbias, &lin));
    const int64_t n = lin.h.n_rows, v = lin.w.n_rows;
    ce_run r = {.ctx = ctx};
    LLMCL__TRY(check_options(ctx, opts, v, hidden->dtype, &r.o));
    const llmcl_tensor *ins[] = {hidden, weight, bias, labels, r.o.weight, dhidden, dweight, dbias};
    const char *names[] = {"hidden",       "weight",  "bias",    "labels",
                           "opts->weight", "dhidden", "dweight", "dbias"};
    LLMCL__TRY(check_outputs(ctx, &r.o, n, loss, z_loss, ins, names, 8));
    linear_job jb = {.lin = &lin, .hidden = hidden, .bias = bias, .labels = labels,
                     .dhidden = dhidden, .dweight = dweight, .dbias = dbias};
    const llmcl_status st = linear_run(&r, &jb, weight, 1, loss, z_loss);
    ce_run_release(&r);
    return st;
}

llmcl_status llmcl__linear_ce_hooked(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                     const llmcl_tensor *weight, const llmcl_tensor *bias,
                                     const llmcl_tensor *labels, const llmcl_ce_options *opts,
                                     int64_t align, llmcl__ce_rows_hook hook, void *user,
                                     llmcl_tensor *g, llmcl_tensor *dhidden,
                                     llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    ce_linear lin;
    LLMCL__TRY(
        check_linear(ctx, hidden, weight, bias, labels, opts, dhidden, dweight, dbias, &lin));
    ce_run r = {.ctx = ctx};
    LLMCL__TRY(check_options(ctx, opts, lin.w.n_rows, hidden->dtype, &r.o));
    r.o.reduction = LLMCL_CE_NONE;
    linear_job jb = {.lin = &lin, .hidden = hidden, .bias = bias, .labels = labels,
                     .dhidden = dhidden, .dweight = dweight, .dbias = dbias,
                     .hook = hook, .user = user, .g = g};
    const llmcl_status st = linear_run(&r, &jb, weight, align, NULL, NULL);
    ce_run_release(&r);
    return st;
}

/*
 * The fused forms' last forward step: each row's partials (m, s, ws) over nslots slots and its
 * target logit from xyb into lse and the per-row terms.
 */
static llmcl_status fused_combine(ce_run *r, const llmcl_tensor *part, int64_t nslots,
                                  const llmcl_tensor *xyb, llmcl_tensor *lse)
{
    LLMCL__TRY(check_merge_loops(r, nslots));
    const ce_rows_job j = {.nrows = r->n, .lse = lse};
    return ce_combine(r, &j, part, nslots, xyb);
}

/* The fused backward's per-row coefficients (A, B, C, lse) with the upstream gradient in. */
static llmcl_status fused_coefs(ce_run *r, const llmcl_tensor *lse, const llmcl_tensor *grad_loss,
                                const llmcl_tensor *coef)
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "cce_coefs", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_i64(&a, r->n);
    llmcl__arg_i64(&a, r->v);
    llmcl__arg_tensor(&a, r->labels);
    arg_weight(&a, r);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i32(&a, (int32_t)r->o.reduction);
    llmcl__arg_f32(&a, r->o.grad_scale);
    llmcl__arg_i64(&a, r->ignore);
    llmcl__arg_f32(&a, r->o.label_smoothing);
    llmcl__arg_f32(&a, r->o.lse_square_scale);
    llmcl__arg_tensor(&a, lse);
    arg_opt(&a, grad_loss);
    llmcl__arg_i32(&a, grad_loss != NULL);
    arg_buf(&a, coef->mem);
    const size_t g1 = (size_t)r->n, l1 = 64;
    return llmcl__launch(&a, 1, &g1, &l1);
}

/* ---- path 3 in vocabulary chunks: the logits of one chunk at a time from llmcl_matmul ---- */

#define CE_FUSED_BUDGET (64ull << 20)
/* Of a tensor-core path's budget, room for its products' TMA tensor maps (256 bytes a group). */
#define CE_MAPS_RESERVE (64ull << 10)
/* Tensor-core multiply-adds a byte of memory traffic costs (the H100: ~300 T/s against 3 TB/s). */
#define CE_MACS_PER_BYTE 100.0

/*
 * Classes per chunk: f32 logits of every row, plus their 16-bit copy for the gradient products
 * (gcast), and the forward's partials (3 floats a row and chunk) within the budget; whole
 * multiples of 128 where that leaves any, for whole tiles.
 */
static int64_t fused_chunk_cols(const ce_run *r, bool gcast)
{
    int64_t c = r->o.vocab_chunk;
    if (c <= 0) {
        const uint64_t budget = r->o.chunk_bytes ? r->o.chunk_bytes : CE_FUSED_BUDGET;
        const uint64_t per_col = (uint64_t)r->n * (gcast ? 6 : 4);
        c = (int64_t)(budget / per_col);
        while (c > 1 && per_col * (uint64_t)c + (uint64_t)r->n * 12 * llmcl__div_up(r->v, c) +
                                (uint64_t)r->n * 20 >
                            budget)
            c -= c > 256 ? 128 : 1;
        c = c >= 256 ? c / 128 * 128 : c;
    }
    return c < 1 ? 1 : c > r->v ? r->v : c;
}

/* One chunk of classes [v0, v0 + w): its W rows, bias slice and [n, w] logits in the scratch. */
typedef struct ce_chunk {
    int64_t v0, w;
    llmcl_tensor *weight, *bias, *logits;
} ce_chunk;

static void chunk_free(ce_chunk *c)
{
    llmcl_tensor_destroy(c->weight);
    llmcl_tensor_destroy(c->bias);
    llmcl_tensor_destroy(c->logits);
    *c = (ce_chunk){0};
}

/* Chunk ci of vc classes: its W rows, its bias slice and the head of scratch as its [n, w]
   output. */
static llmcl_status chunk_views(const ce_run *r, const ce_linear *lin, const llmcl_tensor *weight,
                                const llmcl_tensor *bias, const llmcl_tensor *scratch, int64_t ci,
                                int64_t vc, ce_chunk *c)
{
    c->v0 = ci * vc;
    c->w = r->v - c->v0 < vc ? r->v - c->v0 : vc;
    LLMCL__TRY(llmcl__rows_view(weight, &lin->w, c->v0, c->w, &c->weight));
    if (scratch)
        LLMCL__TRY(llmcl__head_view(scratch, r->n, c->w, &c->logits));
    if (bias) {
        const int64_t stride = bias->strides[bias->ndim - 1];
        LLMCL__TRY(llmcl_tensor_view(bias, 1, &c->w, &stride, bias->offset + c->v0 * stride,
                                     &c->bias));
    }
    return LLMCL_OK;
}

/* Chunk ci of vc classes: its views, then its logits = hidden W[v0..]^T + bias[v0..] in f32. */
static llmcl_status chunk_logits(ce_run *r, const ce_linear *lin, const llmcl_tensor *hv,
                                 const llmcl_tensor *weight, const llmcl_tensor *bias,
                                 const llmcl_tensor *scratch, int64_t ci, int64_t vc, ce_chunk *c)
{
    LLMCL__TRY(chunk_views(r, lin, weight, bias, scratch, ci, vc, c));
    const llmcl_matmul_opts o = {.trans_b = 1, .bias = c->bias, .split_k = 1};
    return llmcl_matmul(r->ctx, 1.0f, hv, c->weight, 0.0f, c->logits, &o);
}

/* ---- path 3 in vocabulary chunks on tensor cores: the products' epilogues do the row math ---- */

/* The epilogue's arguments for this run: the forward's partials or the backward's dlogits. */
static llmcl__mm_ce epilogue_of(const ce_run *r, llmcl__mm_epilogue epilogue)
{
    return (llmcl__mm_ce){.epilogue = epilogue, .flags = ce_flags(r, false),
                          .cap = r->o.softcap, .labels = r->labels, .weight = r->o.weight,
                          .ignore_index = r->ignore, .stats = r->stats->mem};
}

/*
 * Whether the logits products of hidden (n x V, with bias or not) run with the cross-entropy
 * epilogue here (llmcl__matmul_plan: on tensor cores).
 */
static bool epilogue_runs(const ce_run *r, const llmcl_tensor *hidden, const llmcl_tensor *bias,
                          llmcl__mm_epilogue epilogue)
{
    return llmcl__matmul_plan(r->ctx, hidden->dtype, r->n, r->v, epilogue, bias != NULL).kernel !=
           NULL;
}

/* Rounds classes per chunk down to whole 128-column tiles where that leaves any, within [1, V]. */
static int64_t whole_tiles(const ce_run *r, int64_t c)
{
    c = c >= 256 ? c / 128 * 128 : c;
    return c < 1 ? 1 : c > r->v ? r->v : c;
}

/* The budget of a tensor-core path's chunks, less its products' tensor maps. */
static uint64_t epilogue_budget(const ce_run *r)
{
    const uint64_t budget = r->o.chunk_bytes ? r->o.chunk_bytes : CE_FUSED_BUDGET;
    return budget > 2 * CE_MAPS_RESERVE ? budget - CE_MAPS_RESERVE : budget;
}

/*
 * Classes per chunk of the tensor-core forward: the chunk's partials (3 floats a row per
 * LLMCL__MM_CE_SLOT classes), the per-chunk slots, the target logits and the per-row terms
 * within the budget.
 */
static int64_t epilogue_fwd_cols(const ce_run *r)
{
    if (r->o.vocab_chunk > 0)
        return whole_tiles(r, r->o.vocab_chunk);
    const uint64_t budget = epilogue_budget(r);
    const uint64_t row = (uint64_t)r->n * 12;
    int64_t c = (int64_t)(budget / row) * LLMCL__MM_CE_SLOT;
    while (c > LLMCL__MM_CE_SLOT &&
           row * (uint64_t)(llmcl__div_up(c, LLMCL__MM_CE_SLOT) + llmcl__div_up(r->v, c)) +
                   (uint64_t)r->n * 12 >
               budget)
        c -= LLMCL__MM_CE_SLOT;
    return whole_tiles(r, c);
}

/* The tensor-core backward's products: hidden's dtype and size h, and whether the logits product
   adds a class bias (the gradient products have none). */
typedef struct ce_products {
    llmcl_dtype dt;
    int64_t h;
    bool bias;
} ce_products;

/* A product's (rows x cols, inner k) whole waves of its tiles, in time (llmcl__matmul_plan). */
static double waves_cost(const ce_run *r, const ce_products *pr, llmcl__mm_epilogue epilogue,
                         int64_t rows, int64_t cols, int64_t k)
{
    const bool bias = epilogue != LLMCL__MM_PLAIN && pr->bias;
    const llmcl__mm_plan t = llmcl__matmul_plan(r->ctx, pr->dt, rows, cols, epilogue, bias);
    const int64_t tiles = llmcl__div_up(rows, t.bm) * llmcl__div_up(cols, t.bn);
    return (double)llmcl__div_up(tiles, t.slots) * t.tile_time * (double)k;
}

/*
 * The tensor-core backward's products for one chunk of w classes: the logits product with its
 * epilogue's tiles (n x w, K = h), dhidden (n x h, K = w) and dweight (w x h, K = n) with the
 * plain tiles, h the hidden size; and the chunk's reading and writing of dhidden's f32 sums
 * (8 n h bytes spread over the slots), at CE_MACS_PER_BYTE, so that narrow chunks cost what they
 * do.
 */
static double bwd_chunk_cost(const ce_run *r, const ce_products *pr, int64_t w)
{
    const int64_t n = r->n, h = pr->h;
    const llmcl__mm_plan dh = llmcl__matmul_plan(r->ctx, pr->dt, n, h, LLMCL__MM_PLAIN, false);
    const double sums = 8.0 * (double)n * (double)h * CE_MACS_PER_BYTE / (double)dh.slots;
    return waves_cost(r, pr, LLMCL__MM_CE_BACKWARD, n, w, h) +
           waves_cost(r, pr, LLMCL__MM_PLAIN, n, h, w) +
           waves_cost(r, pr, LLMCL__MM_PLAIN, w, h, n) + sums;
}

/* The backward's products over the vocabulary in chunks of c classes: whole chunks and the last
   one (the tile model costs microseconds a call, so each width is weighed once). */
static double bwd_chunks_cost(const ce_run *r, const ce_products *pr, int64_t c)
{
    const int64_t whole = r->v / c, rest = r->v - whole * c;
    return (double)whole * bwd_chunk_cost(r, pr, c) + (rest ? bwd_chunk_cost(r, pr, rest) : 0.0);
}

/*
 * Classes per chunk of the tensor-core backward: the chunk's 16-bit dlogits, beside the row
 * coefficients and statistics (8 floats a row), within the budget; of the multiples of 128 from
 * 1024 up to that, the one whose products waste the least of their last waves (bwd_chunks_cost;
 * on the H100 at N 8192, H 4096, V 128256: 3072 classes keep 96.7% of the waves' capacity busy,
 * 3968, the most the budget holds, 94.7%, and 3584, the old choice, 92.5%).
 */
static int64_t epilogue_bwd_cols(const ce_run *r, const ce_products *pr)
{
    if (r->o.vocab_chunk > 0)
        return whole_tiles(r, r->o.vocab_chunk);
    const uint64_t budget = epilogue_budget(r);
    const uint64_t rows = (uint64_t)r->n * 32;
    const uint64_t left = budget > rows ? budget - rows : 0;
    const int64_t most = (int64_t)(left / ((uint64_t)r->n * llmcl_dtype_size(pr->dt)));
    if (most < 1024)
        return whole_tiles(r, most);
    int64_t best = most / 128 * 128;
    double best_cost = bwd_chunks_cost(r, pr, best);
    for (int64_t c = best - 128; c >= 1024; c -= 128) {
        const double cost = bwd_chunks_cost(r, pr, c);
        if (cost < best_cost * (1.0 - 1e-9)) {
            best = c;
            best_cost = cost;
        }
    }
    return whole_tiles(r, best);
}

/*
 * Backward: per chunk, the logits product whose epilogue writes the dlogits G in hidden's dtype
 * (llmcl__matmul_ce, LLMCL__MM_CE_BACKWARD), then dhidden (+)= G W[chunk] and
 * dweight[chunk] (+)= G^T hidden.
 */
static llmcl_status fused_backward_epilogue(ce_run *r, const ce_linear *lin,
                                            const llmcl_tensor *hidden,
                                            const llmcl_tensor *weight, const llmcl_tensor *bias,
                                            const llmcl_tensor *coef, llmcl_tensor *dhidden,
                                            llmcl_tensor *dweight)
{
    llmcl_ctx *ctx = r->ctx;
    const ce_products pr = {hidden->dtype, lin->h.row_len, bias != NULL};
    const int64_t n = r->n, vc = epilogue_bwd_cols(r, &pr);
    const int64_t nchunks = llmcl__div_up(r->v, vc), gshape[2] = {n, vc};
    llmcl_tensor *g = NULL, *hv = NULL, *dhv = NULL, *dwv = NULL;
    ce_chunk c = {0};
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, hidden->dtype, 2, gshape, "16-bit dlogits chunk", &g),
                    done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(hidden, &lin->h, 0, n, &hv), done);
    if (dhidden)
        LLMCL__TRY_GOTO(st, llmcl__rows_view(dhidden, &lin->dh, 0, n, &dhv), done);
    llmcl__mm_ce ce = epilogue_of(r, LLMCL__MM_CE_BACKWARD);
    ce.coef = coef->mem;
    for (int64_t ci = 0; ci < nchunks; ++ci) {
        LLMCL__TRY_GOTO(st, chunk_views(r, lin, weight, bias, g, ci, vc, &c), done);
        ce.v0 = c.v0;
        LLMCL__TRY_GOTO(st, llmcl__matmul_ce(ctx, hv, c.weight, c.bias, c.logits, &ce), done);
        if (dweight)
            LLMCL__TRY_GOTO(st, llmcl__rows_view(dweight, &lin->dw, c.v0, c.w, &dwv), done);
        LLMCL__TRY_GOTO(st,
                        grad_products(ctx, c.logits, c.weight, hv, dhv, ci ? 1.0f : 0.0f, 1, dwv,
                                      r->o.accumulate_weight_grad ? 1.0f : 0.0f),
                        done);
        llmcl_tensor_destroy(dwv);
        dwv = NULL;
        chunk_free(&c);
    }
    st = LLMCL_OK;
done:
    chunk_free(&c);
    llmcl_tensor_destroy(g);
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(dhv);
    llmcl_tensor_destroy(dwv);
    return st;
}

/* What one forward chunk needs: the row kernels of its form and the buffers they fill. */
typedef struct fwd_chunks {
    int64_t vc, nchunks;
    cl_kernel k1, k2;          /* ce_fold; or ce_partial and ce_pick */
    llmcl_tensor *buf;         /* the chunk's LSE partials (epilogue) or f32 logits */
    llmcl_tensor *part, *xyb;  /* every chunk's slot a row, and the target logits */
} fwd_chunks;

/* Chunk ci on tensor cores: the product writes its partials, ce_fold merges them into slot ci. */
static llmcl_status forward_chunk_epilogue(ce_run *r, const fwd_chunks *f, const ce_linear *lin,
                                           const llmcl_tensor *hv, const llmcl_tensor *weight,
                                           const llmcl_tensor *bias, int64_t ci, ce_chunk *c)
{
    LLMCL__TRY(chunk_views(r, lin, weight, bias, NULL, ci, f->vc, c));
    llmcl__mm_ce ce = epilogue_of(r, LLMCL__MM_CE_FORWARD);
    ce.v0 = c->v0;
    ce.part = f->buf->mem;
    ce.xyb = f->xyb->mem;
    LLMCL__TRY(llmcl__matmul_ce(r->ctx, hv, c->weight, c->bias, NULL, &ce));
    llmcl__args a = llmcl__args_begin(r->ctx, f->k1);
    arg_buf(&a, f->buf->mem);
    llmcl__arg_i64(&a, llmcl__div_up(c->w, LLMCL__MM_CE_SLOT));
    llmcl__arg_i64(&a, r->n);
    arg_buf(&a, r->stats->mem);
    arg_buf(&a, f->part->mem);
    llmcl__arg_i64(&a, ci);
    llmcl__arg_i64(&a, f->nchunks);
    const size_t g1 = (size_t)r->n, l1 = 64;
    return llmcl__launch(&a, 1, &g1, &l1);
}

/* Chunk ci elsewhere: its f32 logits, each row's partial in slot ci (ce_partial) and the target
   logits that fall in it (ce_pick). */
static llmcl_status forward_chunk_rows(ce_run *r, const fwd_chunks *f, const ce_linear *lin,
                                       const llmcl_tensor *hv, const llmcl_tensor *weight,
                                       const llmcl_tensor *bias, int64_t ci, ce_chunk *c)
{
    const size_t wg = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    LLMCL__TRY(chunk_logits(r, lin, hv, weight, bias, f->buf, ci, f->vc, c));
    llmcl__args a = llmcl__args_begin(r->ctx, f->k1);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_mem(&a, f->buf->mem, 0);
    llmcl__arg_i64(&a, c->w);
    llmcl__arg_i64(&a, c->w);
    arg_chunk_weight(&a, r, c->v0);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_f32(&a, r->o.softcap);
    arg_buf(&a, f->part->mem);
    llmcl__arg_i64(&a, ci);
    llmcl__arg_i64(&a, f->nchunks);
    const size_t g2[2] = {wg, (size_t)r->n}, l2[2] = {wg, 1};
    LLMCL__TRY(llmcl__launch(&a, 2, g2, l2));
    a = llmcl__args_begin(r->ctx, f->k2);
    llmcl__arg_i32(&a, ce_flags(r, false));
    llmcl__arg_mem(&a, f->buf->mem, 0);
    llmcl__arg_i64(&a, c->w);
    llmcl__arg_i64(&a, c->v0);
    llmcl__arg_i64(&a, c->w);
    llmcl__arg_tensor(&a, r->labels);
    llmcl__arg_i64(&a, r->n);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_f32(&a, r->o.softcap);
    arg_buf(&a, f->xyb->mem);
    const size_t g1 = (size_t)r->n, l1 = 64;
    return llmcl__launch(&a, 1, &g1, &l1);
}

/*
 * Forward: per chunk, each row's online-LSE partial into slot `chunk` and the target logits that
 * fall in the chunk, then the common combine. On tensor cores with 16-bit operands the logits
 * product's epilogue computes the partials (llmcl__matmul_ce, LLMCL__MM_CE_FORWARD), so no logits
 * are stored; elsewhere the chunk's f32 logits go through the row kernels.
 */
static llmcl_status fused_forward_chunks(ce_run *r, const ce_linear *lin,
                                         const llmcl_tensor *hidden, const llmcl_tensor *weight,
                                         const llmcl_tensor *bias, llmcl_tensor *lse)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t n = r->n;
    /* tensor cores: the product's epilogue writes the partials */
    const bool epilogue = epilogue_runs(r, hidden, bias, LLMCL__MM_CE_FORWARD);
    fwd_chunks f = {.vc = epilogue ? epilogue_fwd_cols(r) : fused_chunk_cols(r, false)};
    f.nchunks = llmcl__div_up(r->v, f.vc);
    const int64_t np = n * f.nchunks * 3, lshape[2] = {n, f.vc};
    const int64_t ncp = n * llmcl__div_up(f.vc, LLMCL__MM_CE_SLOT) * 3;
    llmcl_tensor *hv = NULL;
    ce_chunk c = {0};
    llmcl_status st;
    LLMCL__TRY_GOTO(st,
                    epilogue
                        ? llmcl__scratch(ctx, LLMCL_F32, 1, &ncp, "fused CE chunk partials", &f.buf)
                        : llmcl__scratch(ctx, LLMCL_F32, 2, lshape, "logits chunk", &f.buf),
                    done);
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 1, &np, "fused CE partials", &f.part), done);
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 1, &n, "fused CE target logits", &f.xyb),
                    done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(hidden, &lin->h, 0, n, &hv), done);
    LLMCL__TRY_GOTO(st, row_kernel(r, epilogue ? "ce_fold" : "ce_partial", &f.k1), done);
    if (!epilogue)
        LLMCL__TRY_GOTO(st, row_kernel(r, "ce_pick", &f.k2), done);
    for (int64_t ci = 0; ci < f.nchunks; ++ci) {
        LLMCL__TRY_GOTO(st,
                        epilogue ? forward_chunk_epilogue(r, &f, lin, hv, weight, bias, ci, &c)
                                   : forward_chunk_rows(r, &f, lin, hv, weight, bias, ci, &c),
                        done);
        chunk_free(&c);
    }
    st = fused_combine(r, f.part, f.nchunks, f.xyb, lse);
done:
    chunk_free(&c);
    llmcl_tensor_destroy(f.buf);
    llmcl_tensor_destroy(f.part);
    llmcl_tensor_destroy(f.xyb);
    llmcl_tensor_destroy(hv);
    return st;
}

/*
 * Backward: per chunk, the logits again, dlogits in place from the row coefficients
 * (cce_chunk_grad), dbias over the chunk's classes, then dhidden (+)= G W[chunk] and dweight[chunk]
 * = G^T hidden, G in hidden's dtype (rounded from f32 when that is 16-bit).
 */
static llmcl_status fused_backward_chunks(ce_run *r, const ce_linear *lin,
                                          const llmcl_tensor *hidden, const llmcl_tensor *weight,
                                          const llmcl_tensor *bias, const llmcl_tensor *coef,
                                          llmcl_tensor *dhidden, llmcl_tensor *dweight,
                                          llmcl_tensor *dbias)
{
    llmcl_ctx *ctx = r->ctx;
    /* dbias sums f32 dlogits */
    if (!dbias && epilogue_runs(r, hidden, bias, LLMCL__MM_CE_BACKWARD))
        return fused_backward_epilogue(r, lin, hidden, weight, bias, coef, dhidden, dweight);
    const bool gcast_needed = (dhidden || dweight) && hidden->dtype != LLMCL_F32;
    const int64_t n = r->n, vc = fused_chunk_cols(r, gcast_needed);
    const int64_t nchunks = llmcl__div_up(r->v, vc), lshape[2] = {n, vc};
    const size_t wg = (size_t)llmcl__param_get(&r->rp, "WG", 64);
    llmcl_tensor *logits = NULL, *gcast = NULL, *hv = NULL, *dhv = NULL, *dwv = NULL, *gv = NULL;
    ce_chunk c = {0};
    cl_kernel kgrad, kcol = NULL;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 2, lshape, "logits chunk", &logits), done);
    if (gcast_needed)
        LLMCL__TRY_GOTO(
            st, llmcl__scratch(ctx, hidden->dtype, 2, lshape, "16-bit dlogits chunk", &gcast), done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(hidden, &lin->h, 0, n, &hv), done);
    if (dhidden)
        LLMCL__TRY_GOTO(st, llmcl__rows_view(dhidden, &lin->dh, 0, n, &dhv), done);
    const bool direct = gcast && !dbias; /* dbias sums the f32 dlogits */
    if (direct)
        r->dx_dt = hidden->dtype;
    LLMCL__TRY_GOTO(st, row_kernel(r, "cce_chunk_grad", &kgrad), done);
    if (dbias)
        LLMCL__TRY_GOTO(st, row_kernel(r, "ce_colsum", &kcol), done);
    for (int64_t ci = 0; ci < nchunks; ++ci) {
        LLMCL__TRY_GOTO(st, chunk_logits(r, lin, hv, weight, bias, logits, ci, vc, &c), done);
        llmcl__args a = llmcl__args_begin(ctx, kgrad);
        llmcl__arg_i32(&a, ce_flags(r, false));
        llmcl__arg_mem(&a, logits->mem, 0);
        llmcl__arg_i64(&a, c.w);
        llmcl__arg_i64(&a, c.v0);
        llmcl__arg_i64(&a, c.w);
        llmcl__arg_tensor(&a, r->labels);
        arg_chunk_weight(&a, r, c.v0);
        arg_buf(&a, r->stats->mem);
        llmcl__arg_f32(&a, r->o.softcap);
        arg_buf(&a, coef->mem);
        arg_buf(&a, direct ? gcast->mem : logits->mem);
        const size_t g2[2] = {wg, (size_t)n}, l2[2] = {wg, 1};
        LLMCL__TRY_GOTO(st, llmcl__launch(&a, 2, g2, l2), done);
        if (dbias)
            LLMCL__TRY_GOTO(st,
                            colsum(ctx, kcol, logits, n, c.w, dbias, c.v0,
                                   r->o.accumulate_weight_grad),
                            done);
        if (dweight)
            LLMCL__TRY_GOTO(st, llmcl__rows_view(dweight, &lin->dw, c.v0, c.w, &dwv), done);
        const llmcl_tensor *g;
        LLMCL__TRY_GOTO(st, dlogits_operand(ctx, c.logits, gcast, direct, &g, &gv), done);
        LLMCL__TRY_GOTO(st,
                        grad_products(ctx, g, c.weight, hv, dhv, ci ? 1.0f : 0.0f, 1, dwv,
                                      r->o.accumulate_weight_grad ? 1.0f : 0.0f),
                        done);
        llmcl_tensor_destroy(dwv);
        llmcl_tensor_destroy(gv);
        dwv = gv = NULL;
        chunk_free(&c);
    }
    st = LLMCL_OK;
done:
    chunk_free(&c);
    llmcl_tensor_destroy(logits);
    llmcl_tensor_destroy(gcast);
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(dhv);
    llmcl_tensor_destroy(dwv);
    llmcl_tensor_destroy(gv);
    return st;
}

/* ---- path 3: fully fused tiles ---- */

/* Local bytes a tile configuration needs (the larger of the forward and the backward). */
static uint64_t tile_local_bytes(long t, long bk, long tn)
{
    const uint64_t fwd = 4u * (uint64_t)(2 * bk * (t + 4) + 3 * t * (t / tn));
    const uint64_t bwd = 4u * (uint64_t)(t * t + 2 * bk * (t + 4)) + 16;
    return fwd > bwd ? fwd : bwd;
}

static bool tile_ok(const llmcl_ctx *ctx, long t, long bk, long tm, long tn)
{
    if (t < 1 || bk < 1 || tm < 1 || tn < 1 || t % tm || t % tn || bk > t)
        return false;
    const long wg = (t / tm) * (t / tn);
    return wg >= t && (size_t)wg <= ctx->info.max_work_group_size &&
           tile_local_bytes(t, bk, tn) + 1024 <= ctx->info.local_mem_static_bytes;
}

/* Tile tunables for one fused kernel: device defaults, the database, then a fit check. */
static llmcl_status tile_params(ce_run *r, const char *key, int64_t shape_key, llmcl__params *p)
{
    llmcl_ctx *ctx = r->ctx;
    long t = ctx->info.is_gpu ? 64 : 32, tm = 4, tn = 4;
    if (ctx->info.is_gpu && !strcmp(key, LLMCL_KEY_CCE_BWD_DH) &&
        2 * llmcl__div_up(r->n, 64) < (int64_t)ctx->info.compute_units) {
        /* dhidden has one work-group per row tile: with few, smaller tiles keep more CUs busy */
        t = 32;
        tm = tn = 2;
    }
    while (t > 16 && !tile_ok(ctx, t, 16, tm, tn))
        t /= 2;
    *p = (llmcl__params){0};
    llmcl__param_set(p, "T", t);
    llmcl__param_set(p, "BK", 16);
    llmcl__param_set(p, "TM", tm);
    llmcl__param_set(p, "TN", tn);
    char cls[16];
    llmcl__shape_class(shape_key, cls);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, key, r->dt, cls, p);
    if (!tile_ok(ctx, llmcl__param_get(p, "T", 0), llmcl__param_get(p, "BK", 0),
                 llmcl__param_get(p, "TM", 0), llmcl__param_get(p, "TN", 0))) {
        /* an entry made for another device or shape: back to the defaults */
        llmcl__param_set(p, "T", t);
        llmcl__param_set(p, "BK", 16);
        llmcl__param_set(p, "TM", tm);
        llmcl__param_set(p, "TN", tn);
    }
    LLMCL__REQUIRE(ctx,
                   tile_ok(ctx, llmcl__param_get(p, "T", 0), llmcl__param_get(p, "BK", 0),
                           llmcl__param_get(p, "TM", 0), llmcl__param_get(p, "TN", 0)),
                   LLMCL_ERROR_UNSUPPORTED,
                   "%s: no tile fits this device (%zu work-items, %llu bytes of local memory)", key,
                   ctx->info.max_work_group_size, (unsigned long long)ctx->info.local_mem_static_bytes);
    llmcl__params_record(&lookup, p);
    return LLMCL_OK;
}

static llmcl_status tile_kernel(ce_run *r, const llmcl__params *p, const char *name, cl_kernel *k)
{
    llmcl__defines d = {0};
    base_defines(r, &d);
    llmcl__params_define(p, &d);
    return llmcl__kernel(r->ctx, LLMCL_FAMILY_CROSS_ENTROPY, &d, name, k);
}

/* Loop passes of a TM x TN loop nest (accumulators' set-up and epilogue, the row math). */
static int64_t nest_passes(int64_t tm, int64_t tn) { return tm + 1 + tm * (tn + 1); }

/*
 * Where the device cuts loops short, the tiles that one work-item of the fused kernel `name`
 * (tiles p, hidden size h) may take in a launch within the budget: vocabulary tiles for cce_fwd
 * and cce_bwd_dh, row tiles for cce_bwd_dw; 0 when not even one fits; INT64_MAX without a limit.
 * The count is llmcl__loop_budget's, from the kernels' loops: a tile's dot products over h
 * (cce_tile) take ceil(h / BK) k-steps, each the step, its loads and BK multiply-adds of TM x TN
 * products read by LDS_RUN; the backward's G tile then multiplies T columns of h at a time.
 */
static int64_t tiles_per_launch(const ce_run *r, const llmcl__params *p, const char *name,
                                int64_t h)
{
    const int64_t budget = llmcl__loop_budget(r->ctx);
    if (budget == INT64_MAX)
        return INT64_MAX;
    const int64_t t = llmcl__param_get(p, "T", 32), bk = llmcl__param_get(p, "BK", 16);
    const int64_t tm = llmcl__param_get(p, "TM", 4), tn = llmcl__param_get(p, "TN", 4);
    const int64_t nest = nest_passes(tm, tn), twg = (t / tm) * (t / tn);
    const int64_t lds = (tm % 4 ? tm : tm / 4) + 1 + (tn % 4 ? tn : tn / 4) + 1;
    const int64_t kstep = 1 + llmcl__div_up(t * bk, twg) + 1 + bk + 1 + bk * (lds + nest);
    const int64_t dot = nest + llmcl__div_up(h, bk) * kstep + 1;
    int64_t fixed = 1, per;
    if (!strcmp(name, LLMCL_KEY_CCE_FWD)) {
        fixed = 2 * (tm + 1) + 1 + 2 * (t / tn + 1); /* set-up, exit, the rows' reduction */
        per = 1 + dot + tm + 1 + 2 * tm * (tn + 1);
    } else {
        const int64_t cols = 2 + 2 * nest + llmcl__div_up(t, bk) * kstep; /* T columns of h */
        per = 1 + dot + nest + llmcl__div_up(h, t) * cols + 1;
        if (!strcmp(name, LLMCL_KEY_CCE_BWD_DW))
            per += t + 1; /* dbias */
    }
    return budget > fixed ? (budget - fixed) / per : 0;
}

/* The arguments every fused kernel starts with: hidden, W, bias, labels, class weights. */
static void tile_args(llmcl__args *a, const ce_run *r, const llmcl_tensor *hidden,
                      const ce_linear *lin, const llmcl_tensor *weight, const llmcl_tensor *bias)
{
    llmcl__arg_tensor(a, hidden);
    llmcl__arg_i64(a, lin->h.row_stride);
    llmcl__arg_i64(a, r->n);
    llmcl__arg_i64(a, lin->h.row_len);
    llmcl__arg_tensor(a, weight);
    llmcl__arg_i64(a, lin->w.row_stride);
    llmcl__arg_i64(a, r->v);
    arg_opt(a, bias);
    llmcl__arg_tensor(a, r->labels);
    arg_weight(a, r);
}


/*
 * Chunks where the device has tensor cores (or vocab_chunk asks), else the tile kernels; but
 * chunks also where the device cuts loops short before one tile's sums over hidden's h columns
 * are done (with vocab_chunk -1, asking for tiles, that is refused). Sets up r for tile_params.
 */
static llmcl_status fused_path(ce_run *r, llmcl_ctx *ctx, llmcl_dtype dt, int64_t n, int64_t v,
                               int64_t h, bool *chunked)
{
    const llmcl_ce_options *o = &r->o;
    *chunked = o->vocab_chunk > 0 || (o->vocab_chunk == 0 && ctx->info.has_mma);
    if (*chunked || llmcl__loop_budget(ctx) == INT64_MAX)
        return LLMCL_OK;
    r->ctx = ctx;
    r->dt = dt;
    r->n = n;
    r->v = v;
    static const char *const keys[3] = {LLMCL_KEY_CCE_FWD, LLMCL_KEY_CCE_BWD_DH,
                                        LLMCL_KEY_CCE_BWD_DW};
    for (int i = 0; i < 3 && !*chunked; ++i) {
        llmcl__params p;
        LLMCL__TRY(tile_params(r, keys[i], i == 1 ? n : v, &p));
        if (tiles_per_launch(r, &p, keys[i], h) >= 1)
            continue;
        LLMCL__REQUIRE(ctx, o->vocab_chunk == 0, LLMCL_ERROR_UNSUPPORTED,
                       "fused cross-entropy in tiles (opts->vocab_chunk -1): %s's sums over "
                       "hidden's %lld columns take more loop iterations in one work-item than "
                       "the %llu this device runs before it cuts loops short; vocab_chunk 0 or > 0 "
                       "runs in vocabulary chunks",
                       keys[i], (long long)h, (unsigned long long)ctx->info.loop_limit);
        *chunked = true;
    }
    return LLMCL_OK;
}

/* Forward in tiles: cce_fwd's vocabulary splits of every row tile, then the common combine. */
static llmcl_status fused_forward_tiles(ce_run *r, const ce_linear *lin,
                                        const llmcl_tensor *hidden, const llmcl_tensor *weight,
                                        const llmcl_tensor *bias, llmcl_tensor *lse)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t n = r->n, v = r->v;
    llmcl_status st;
    llmcl_tensor *part = NULL, *xyb = NULL;
    llmcl__params tp;
    LLMCL__TRY_GOTO(st, tile_params(r, LLMCL_KEY_CCE_FWD, v, &tp), done);
    const long t = llmcl__param_get(&tp, "T", 32);
    const size_t twg =
        (size_t)((t / llmcl__param_get(&tp, "TM", 4)) * (t / llmcl__param_get(&tp, "TN", 4)));
    const int64_t rt = llmcl__div_up(n, t), vt = llmcl__div_up(v, t);
    cl_kernel k;
    LLMCL__TRY_GOTO(st, tile_kernel(r, &tp, LLMCL_KEY_CCE_FWD, &k), done);
    int64_t splits = r->o.vocab_splits;
    if (!splits) {
        const int64_t want = (int64_t)ctx->info.compute_units * (ctx->info.is_gpu ? 4 : 1);
        splits = llmcl__div_up(want, rt);
        llmcl__params sp = {0};
        llmcl__param_set(&sp, "SPLIT", (long)splits);
        char cls[16];
        llmcl__shape_class(rt, cls);
        const llmcl__tune_lookup lookup =
            llmcl__params_lookup(ctx, LLMCL_KEY_CCE_SPLIT, r->dt, cls, &sp);
        splits = llmcl__param_get(&sp, "SPLIT", (long)splits);
        splits = splits < 1 ? 1 : splits > vt ? vt : splits;
        llmcl__param_set(&sp, "SPLIT", (long)splits);
        llmcl__params_record(&lookup, &sp);
    }
    splits = splits < 1 ? 1 : splits > vt ? vt : splits;
    /* within the loop budget (fused_path left the tiles only where one fits) */
    const int64_t per = tiles_per_launch(r, &tp, LLMCL_KEY_CCE_FWD, lin->h.row_len);
    if (llmcl__div_up(vt, splits) > per)
        splits = llmcl__div_up(vt, per);
    const int64_t np = n * splits * 3;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 1, &np, "fused CE partials", &part), done);
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 1, &n, "fused CE target logits", &xyb),
                    done);

    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_i32(&a, ce_flags(r, bias != NULL));
    tile_args(&a, r, hidden, lin, weight, bias);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i64(&a, r->ignore);
    llmcl__arg_f32(&a, r->o.softcap);
    arg_buf(&a, part->mem);
    arg_buf(&a, xyb->mem);
    const size_t g2[2] = {(size_t)splits * twg, (size_t)rt}, l2[2] = {twg, 1};
    LLMCL__TRY_GOTO(st, llmcl__launch(&a, 2, g2, l2), done);

    LLMCL__TRY_GOTO(st, fused_combine(r, part, splits, xyb, lse), done);
done:
    llmcl_tensor_destroy(part);
    llmcl_tensor_destroy(xyb);
    return st;
}

llmcl_status llmcl_fused_cross_entropy_forward(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                               const llmcl_tensor *weight, const llmcl_tensor *bias,
                                               const llmcl_tensor *labels,
                                               const llmcl_ce_options *opts, llmcl_tensor *loss,
                                               llmcl_tensor *z_loss, llmcl_tensor *lse)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    ce_linear lin;
    LLMCL__TRY(check_linear(ctx, hidden, weight, bias, labels, opts, NULL, NULL, NULL, &lin));
    const int64_t n = lin.h.n_rows, v = lin.w.n_rows;
    ce_run r = {0};
    LLMCL__TRY(check_options(ctx, opts, v, LLMCL_F32, &r.o));
    LLMCL__TRY(llmcl__check_vec(ctx, lse, "lse", 1u << LLMCL_F32, n));
    const llmcl_tensor *ins[] = {hidden, weight, bias, labels, r.o.weight, lse};
    const char *names[] = {"hidden", "weight", "bias", "labels", "opts->weight", "lse"};
    LLMCL__TRY(check_outputs(ctx, &r.o, n, loss, z_loss, ins, names, 6));
    for (int i = 0; i < 5; ++i)
        LLMCL__REQUIRE(ctx, !ins[i] || !llmcl__overlaps(lse, ins[i]), LLMCL_ERROR_INVALID_ARGUMENT,
                       "lse overlaps %s", names[i]);

    bool chunked;
    LLMCL__TRY(fused_path(&r, ctx, hidden->dtype, n, v, lin.h.row_len, &chunked));
    llmcl_status st;
    LLMCL__TRY_GOTO(st, ce_begin(&r, ctx, chunked ? LLMCL_F32 : hidden->dtype, labels, n, v, false),
                    done);
    LLMCL__TRY_GOTO(st,
                    chunked ? fused_forward_chunks(&r, &lin, hidden, weight, bias, lse)
                        : fused_forward_tiles(&r, &lin, hidden, weight, bias, lse),
                    done);
    LLMCL__TRY_GOTO(st, ce_finish(&r, loss, z_loss), done);
    st = ce_check_labels(&r);
done:
    ce_run_release(&r);
    return st;
}


/*
 * cce_bwd_dh (tiled over the n rows) or cce_bwd_dw (over the v classes), with the arguments both
 * take first set in *a; the caller adds its outputs and launches over *global items in groups of
 * *local.
 */
static llmcl_status cce_bwd_begin(ce_run *r, const char *name, int64_t size,
                                  const llmcl_tensor *hidden, const ce_linear *lin,
                                  const llmcl_tensor *weight, const llmcl_tensor *bias,
                                  const llmcl_tensor *coef, llmcl__args *a, size_t *global,
                                  size_t *local, llmcl__params *tp)
{
    cl_kernel k;
    LLMCL__TRY(tile_params(r, name, size, tp));
    LLMCL__TRY(tile_kernel(r, tp, name, &k));
    const long t = llmcl__param_get(tp, "T", 32);
    *local = (size_t)((t / llmcl__param_get(tp, "TM", 4)) * (t / llmcl__param_get(tp, "TN", 4)));
    *global = (size_t)llmcl__div_up(size, t) * *local;
    *a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(a, ce_flags(r, bias != NULL));
    tile_args(a, r, hidden, lin, weight, bias);
    arg_buf(a, r->stats->mem);
    arg_buf(a, coef->mem);
    llmcl__arg_f32(a, r->o.softcap);
    llmcl__arg_f32(a, r->o.grad_filter);
    return LLMCL_OK;
}

/*
 * Backward in tiles: cce_bwd_dh over row tiles and cce_bwd_dw over vocabulary tiles. Each walks
 * the other dimension's tiles in one launch, or where the device cuts loops short in launches over
 * consecutive ranges of them that keep its loops within the budget.
 */
static llmcl_status fused_backward_tiles(ce_run *r, const ce_linear *lin,
                                         const llmcl_tensor *hidden, const llmcl_tensor *weight,
                                         const llmcl_tensor *bias, const llmcl_tensor *coef,
                                         llmcl_tensor *dhidden, llmcl_tensor *dweight,
                                         llmcl_tensor *dbias)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t n = r->n, v = r->v, h = lin->h.row_len;
    llmcl__params tp;
    llmcl__args begun;
    size_t g, twg;
    if (dhidden) {
        LLMCL__TRY(llmcl_fill(ctx, dhidden, 0.0));
        LLMCL__TRY(cce_bwd_begin(r, LLMCL_KEY_CCE_BWD_DH, n, hidden, lin, weight, bias, coef,
                                 &begun, &g, &twg, &tp));
        const int64_t vt = llmcl__div_up(v, llmcl__param_get(&tp, "T", 32));
        const int64_t per = tiles_per_launch(r, &tp, LLMCL_KEY_CCE_BWD_DH, h);
        for (int64_t t0 = 0; t0 < vt; t0 += per) {
            llmcl__args a = begun;
            llmcl__arg_i64(&a, t0);
            llmcl__arg_i64(&a, vt - t0 < per ? vt : t0 + per);
            llmcl__arg_tensor(&a, dhidden);
            llmcl__arg_i64(&a, lin->dh.row_stride);
            LLMCL__TRY(llmcl__launch(&a, 1, &g, &twg));
        }
    }
    if (dweight || dbias) {
        if (dweight && !r->o.accumulate_weight_grad)
            LLMCL__TRY(llmcl_fill(ctx, dweight, 0.0));
        LLMCL__TRY(cce_bwd_begin(r, LLMCL_KEY_CCE_BWD_DW, v, hidden, lin, weight, bias, coef,
                                 &begun, &g, &twg, &tp));
        const int64_t rt = llmcl__div_up(n, llmcl__param_get(&tp, "T", 32));
        const int64_t per = tiles_per_launch(r, &tp, LLMCL_KEY_CCE_BWD_DW, h);
        for (int64_t t0 = 0; t0 < rt; t0 += per) {
            llmcl__args a = begun;
            llmcl__arg_i64(&a, t0);
            llmcl__arg_i64(&a, rt - t0 < per ? rt : t0 + per);
            llmcl__arg_i32(&a, dweight != NULL);
            arg_opt(&a, dweight);
            llmcl__arg_i64(&a, dweight ? lin->dw.row_stride : 0);
            /* the first range sets dbias (unless accumulating), the later ones add to it */
            llmcl__arg_i32(&a, dbias ? 1 + (r->o.accumulate_weight_grad || t0 > 0) : 0);
            arg_opt(&a, dbias);
            LLMCL__TRY(llmcl__launch(&a, 1, &g, &twg));
        }
    }
    return LLMCL_OK;
}

llmcl_status llmcl_fused_cross_entropy_backward(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                                const llmcl_tensor *weight,
                                                const llmcl_tensor *bias,
                                                const llmcl_tensor *labels, const llmcl_tensor *lse,
                                                const llmcl_tensor *grad_loss,
                                                const llmcl_ce_options *opts, llmcl_tensor *dhidden,
                                                llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    ce_linear lin;
    LLMCL__TRY(
        check_linear(ctx, hidden, weight, bias, labels, opts, dhidden, dweight, dbias, &lin));
    const int64_t n = lin.h.n_rows, v = lin.w.n_rows;
    ce_run r = {0};
    LLMCL__TRY(check_options(ctx, opts, v, LLMCL_F32, &r.o));
    LLMCL__TRY(llmcl__check_vec(ctx, lse, "lse", 1u << LLMCL_F32, n));
    if (grad_loss)
        LLMCL__TRY(llmcl__check_vec(ctx, grad_loss, "grad_loss", 1u << LLMCL_F32,
                             r.o.reduction == LLMCL_CE_NONE ? n : 1));
    const llmcl_tensor *outs[] = {dhidden, dweight, dbias};
    const char *out_names[] = {"dhidden", "dweight", "dbias"};
    for (int i = 0; i < 3; ++i)
        LLMCL__REQUIRE(ctx,
                       !outs[i] || ((!grad_loss || !llmcl__overlaps(outs[i], grad_loss)) &&
                                    !llmcl__overlaps(outs[i], lse)),
                       LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps lse or grad_loss", out_names[i]);

    bool chunked;
    LLMCL__TRY(fused_path(&r, ctx, hidden->dtype, n, v, lin.h.row_len, &chunked));
    llmcl_status st;
    llmcl_tensor *coef = NULL;
    LLMCL__TRY_GOTO(st, ce_begin(&r, ctx, chunked ? LLMCL_F32 : hidden->dtype, labels, n, v, false),
                    done);
    LLMCL__TRY_GOTO(st, ce_check_labels(&r), done); /* before the outputs are zeroed */
    const int64_t n4 = 4 * n;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 1, &n4, "fused CE row coefficients", &coef),
                    done);
    LLMCL__TRY_GOTO(st, fused_coefs(&r, lse, grad_loss, coef), done);
    LLMCL__TRY_GOTO(st,
                    chunked
                        ? fused_backward_chunks(&r, &lin, hidden, weight, bias, coef, dhidden,
                                                dweight, dbias)
                        : fused_backward_tiles(&r, &lin, hidden, weight, bias, coef, dhidden,
                                               dweight, dbias),
                    done);
    st = LLMCL_OK;
done:
    llmcl_tensor_destroy(coef);
    ce_run_release(&r);
    return st;
}
