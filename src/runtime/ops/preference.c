/*
 * preference.c: host launcher of the preference losses. With gradients, where a pair's logits
 * fit the budget, llmcl_linear_preference_forward copies the pairs interleaved (each chosen
 * sequence beside its rejected one) and runs the chunked linear cross-entropy over chunks of
 * whole pairs, preference.cl's terms between each chunk's cross-entropies and its gradient: three
 * products of the head. Otherwise it runs the fused cross-entropy's forward (reduction none),
 * the terms, and the fused backward with each position's upstream gradient: four products, the
 * logits never stored. Without gradients (a reference model's logps) the chunks where the logits
 * are 16-bit, else the fused forward alone: f32 logits written and read again cost more than the
 * fused epilogue's reductions.
 */
#include <math.h>

#include "../internal.h"

#define PREF_DEFAULT_IGNORE (-100)
#define PREF_DEFAULT_BETA 0.1f
/* Chunks of whole pairs' logits: at V 128256 and T 1024 a pair takes 1.6 GB in f32 with its
   16-bit copy, and fewer, larger chunks keep the weight gradient's products from re-reading
   dweight. */
#define PREF_DEFAULT_BUDGET (4ull << 30)

/* One call's shapes, checked options and scratch. */
typedef struct pref_run {
    llmcl_ctx *ctx;
    llmcl_pref_options o;
    int average;
    int64_t pairs, t, n, ignore;
    const llmcl_tensor *labels;
    size_t wg;
    int inter;                     /* 1: the chunked form's interleaved pairs */
    const llmcl_tensor *ref;       /* the reference's pi, or NULL */
    llmcl_tensor *logps, *loss;    /* the caller's outputs, each optional */
    bool grad;
    llmcl_tensor *ce, *lse, *seq, *coef, *g, *terms, *nc;
} pref_run;

static const char *const loss_names[] = {"DPO", "IPO", "SimPO", "CPO", "ORPO"};

static void run_release(pref_run *r)
{
    llmcl_tensor_destroy(r->ce);
    llmcl_tensor_destroy(r->lse);
    llmcl_tensor_destroy(r->seq);
    llmcl_tensor_destroy(r->coef);
    llmcl_tensor_destroy(r->g);
    llmcl_tensor_destroy(r->terms);
    llmcl_tensor_destroy(r->nc);
}

static bool takes_reference(llmcl_pref_loss loss)
{
    return loss == LLMCL_PREF_DPO || loss == LLMCL_PREF_IPO;
}

static bool takes_smoothing(llmcl_pref_loss loss)
{
    return loss == LLMCL_PREF_DPO || loss == LLMCL_PREF_SIMPO || loss == LLMCL_PREF_CPO;
}

static llmcl_status check_options(llmcl_ctx *ctx, const llmcl_pref_options *opts, pref_run *r)
{
    r->o = opts ? *opts : (llmcl_pref_options){0};
    llmcl_pref_options *o = &r->o;
    LLMCL__REQUIRE(ctx, o->loss >= LLMCL_PREF_DPO && o->loss <= LLMCL_PREF_ORPO,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->loss %d is not a llmcl_pref_loss",
                   (int)o->loss);
    const char *name = loss_names[o->loss];
    LLMCL__REQUIRE(ctx, o->beta >= 0.0f && isfinite(o->beta), LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->beta %g must be finite and > 0 (0: %g)", (double)o->beta,
                   (double)PREF_DEFAULT_BETA);
    LLMCL__REQUIRE(ctx, isfinite(o->gamma) && (o->gamma == 0.0f || o->loss == LLMCL_PREF_SIMPO),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->gamma %g: %s takes none (SimPO's margin; finite)", (double)o->gamma,
                   name);
    LLMCL__REQUIRE(ctx, o->label_smoothing >= 0.0f && o->label_smoothing <= 0.5f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->label_smoothing %g is outside [0, 0.5]",
                   (double)o->label_smoothing);
    LLMCL__REQUIRE(ctx, o->label_smoothing == 0.0f || takes_smoothing(o->loss),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->label_smoothing %g: %s takes none (DPO, SimPO and CPO do)",
                   (double)o->label_smoothing, name);
    LLMCL__REQUIRE(ctx, o->nll_weight >= 0.0f && isfinite(o->nll_weight),
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->nll_weight %g must be finite and >= 0",
                   (double)o->nll_weight);
    LLMCL__REQUIRE(ctx,
                   o->logps >= LLMCL_PREF_LOGPS_DEFAULT && o->logps <= LLMCL_PREF_LOGPS_AVERAGE,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->logps %d is not a llmcl_pref_logps",
                   (int)o->logps);
    LLMCL__REQUIRE(ctx, isfinite(o->grad_scale), LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->grad_scale %g must be finite", (double)o->grad_scale);
    if (o->beta == 0.0f)
        o->beta = PREF_DEFAULT_BETA;
    if (o->grad_scale == 0.0f)
        o->grad_scale = 1.0f;
    r->average = o->logps == LLMCL_PREF_LOGPS_DEFAULT
                     ? o->loss == LLMCL_PREF_IPO || o->loss == LLMCL_PREF_SIMPO ||
                           o->loss == LLMCL_PREF_ORPO
                     : o->logps == LLMCL_PREF_LOGPS_AVERAGE;
    r->ignore = o->use_ignore_index ? o->ignore_index : PREF_DEFAULT_IGNORE;
    return LLMCL_OK;
}

/* hidden [2B, T, H], one run of rows, and labels [2B, T], contiguous; the cross-entropy checks
   the rest of them. */
static llmcl_status check_sequences(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                    const llmcl_tensor *labels, pref_run *r)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, hidden, "hidden", LLMCL__FLOAT_DTYPES, 3, 3));
    LLMCL__TRY(llmcl__check_tensor(ctx, labels, "labels", LLMCL__INT_DTYPES, 2, 2));
    const int64_t seqs = llmcl_tensor_dim(hidden, 0), t = llmcl_tensor_dim(hidden, 1);
    LLMCL__REQUIRE(ctx, seqs >= 2 && seqs % 2 == 0 && t >= 1, LLMCL_ERROR_SHAPE_MISMATCH,
                   "hidden is [%lld, %lld, ...]; expected [2B, T, H]: B >= 1 chosen sequences, "
                   "then their rejected ones",
                   (long long)seqs, (long long)t);
    LLMCL__REQUIRE(ctx, llmcl_tensor_dim(labels, 0) == seqs && llmcl_tensor_dim(labels, 1) == t,
                   LLMCL_ERROR_SHAPE_MISMATCH, "labels is [%lld, %lld]; expected [%lld, %lld]",
                   (long long)llmcl_tensor_dim(labels, 0), (long long)llmcl_tensor_dim(labels, 1),
                   (long long)seqs, (long long)t);
    llmcl__rows rows;
    LLMCL__TRY(llmcl__as_rows(ctx, hidden, "hidden", &rows));
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(labels), LLMCL_ERROR_INVALID_ARGUMENT,
                   "labels must be contiguous");
    const llmcl_dtype ldt = r->o.logits_dtype;
    LLMCL__REQUIRE(ctx, ldt == LLMCL_F32 || (ldt == hidden->dtype && ldt != LLMCL_F32),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->logits_dtype %s must be F32 or hidden's 16-bit dtype (hidden is %s)",
                   llmcl_dtype_name(ldt), llmcl_dtype_name(hidden->dtype));
    r->pairs = seqs / 2;
    r->t = t;
    r->n = seqs * t;
    r->labels = labels;
    return LLMCL_OK;
}

/* ref_logps, loss and logps; the gradients as the fused backward will want them. */
static llmcl_status check_outputs(llmcl_ctx *ctx, const pref_run *r, const llmcl_tensor *const *ins,
                                  const char *const *in_names, int n_ins,
                                  const llmcl_tensor *const *outs, const char *const *out_names)
{
    const bool wants = outs[0] || outs[2] || outs[3] || outs[4];
    const llmcl_tensor *ref = ins[4];
    if (ref)
        LLMCL__TRY(llmcl__check_vec(ctx, ref, "ref_logps", 1u << LLMCL_F32, 2 * r->pairs));
    LLMCL__REQUIRE(ctx, !ref || takes_reference(r->o.loss), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s takes no reference model: ref_logps must be NULL",
                   loss_names[r->o.loss]);
    LLMCL__REQUIRE(ctx, ref || !wants || !takes_reference(r->o.loss),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s needs ref_logps, the reference model's (zeros: reference-free)",
                   loss_names[r->o.loss]);
    if (outs[0])
        LLMCL__TRY(llmcl__check_vec(ctx, outs[0], "loss", 1u << LLMCL_F32, 1));
    if (outs[1])
        LLMCL__TRY(llmcl__check_vec(ctx, outs[1], "logps", 1u << LLMCL_F32, 2 * r->pairs));
    llmcl__rows rows;
    if (outs[2])
        LLMCL__TRY(llmcl__check_grad(ctx, ins[0], "hidden", outs[2], "dhidden", &rows));
    if (outs[3])
        LLMCL__TRY(llmcl__check_grad(ctx, ins[1], "weight", outs[3], "dweight", &rows));
    if (outs[4])
        LLMCL__TRY(llmcl__check_vec(ctx, outs[4], "dbias", 1u << LLMCL_F32,
                                    llmcl_tensor_dim(ins[1], 0)));
    for (int i = 0; i < 5; ++i) {
        if (!outs[i])
            continue;
        for (int j = 0; j < n_ins; ++j)
            LLMCL__REQUIRE(ctx, !ins[j] || !llmcl__overlaps(outs[i], ins[j]),
                           LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", out_names[i],
                           in_names[j]);
        for (int j = i + 1; j < 5; ++j)
            LLMCL__REQUIRE(ctx, !outs[j] || !llmcl__overlaps(outs[i], outs[j]),
                           LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", out_names[i],
                           out_names[j]);
    }
    return LLMCL_OK;
}

/* The cross-entropy's options for this call (the logits' dtype is the chunked form's). */
static llmcl_ce_options ce_options(const pref_run *r)
{
    return (llmcl_ce_options){.use_ignore_index = 1,
                              .ignore_index = r->ignore,
                              .reduction = LLMCL_CE_NONE,
                              .chunk_bytes = r->o.chunk_bytes,
                              .vocab_chunk = r->o.vocab_chunk,
                              .accumulate_weight_grad = r->o.accumulate_weight_grad};
}

static llmcl_status pref_kernel(const pref_run *r, const char *name, cl_kernel *k)
{
    llmcl__defines d = {0};
    llmcl__define_str(&d, "LABEL_DT", llmcl__dtype_macro(r->labels->dtype));
    llmcl__define_int(&d, "WG", (int64_t)r->wg);
    return llmcl__kernel(r->ctx, LLMCL_FAMILY_PREFERENCE, &d, name, k);
}

/* A scratch buffer the kernels take without an offset. */
static void arg_buf(llmcl__args *a, const llmcl_tensor *t)
{
    const cl_mem m = t ? t->mem : NULL;
    llmcl__arg(a, sizeof m, &m);
}

static void arg_opt(llmcl__args *a, const llmcl_tensor *t)
{
    llmcl__arg_i32(a, t != NULL);
    if (t)
        llmcl__arg_tensor(a, t);
    else
        llmcl__arg_mem(a, NULL, 0);
}

/* The chosen sequences' scored positions, the supervised term's divisor. */
static llmcl_status count_run(pref_run *r, const llmcl_tensor *labels)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_count", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_tensor(&a, labels);
    llmcl__arg_i64(&a, r->pairs);
    llmcl__arg_i64(&a, r->t);
    llmcl__arg_i32(&a, r->inter);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, r->nc);
    return llmcl__launch(&a, 1, &r->wg, &r->wg);
}

/* Sequences [s0, s0 + count): their sums of logp and scored positions, from ce. */
static llmcl_status sequences_run(pref_run *r, const llmcl_tensor *labels, const llmcl_tensor *ce,
                                  int64_t s0, int64_t count)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_seq", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_tensor(&a, labels);
    llmcl__arg_i64(&a, r->t);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, ce);
    llmcl__arg_i64(&a, s0);
    arg_buf(&a, r->seq);
    const size_t g = (size_t)count * r->wg;
    return llmcl__launch(&a, 1, &g, &r->wg);
}

/* Pairs [p0, p0 + count): their terms, logps and sequences' upstream gradients. */
static llmcl_status pairs_run(pref_run *r, int64_t p0, int64_t count)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_pairs", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(&a, (int32_t)r->o.loss);
    llmcl__arg_i32(&a, r->average);
    llmcl__arg_i64(&a, r->pairs);
    llmcl__arg_i64(&a, p0);
    llmcl__arg_i64(&a, count);
    llmcl__arg_i32(&a, r->inter);
    llmcl__arg_f32(&a, r->o.beta);
    llmcl__arg_f32(&a, r->o.gamma);
    llmcl__arg_f32(&a, r->o.label_smoothing);
    llmcl__arg_f32(&a, r->o.nll_weight);
    llmcl__arg_f32(&a, r->o.grad_scale);
    arg_buf(&a, r->seq);
    arg_buf(&a, r->nc);
    arg_opt(&a, r->ref);
    arg_opt(&a, r->logps);
    arg_buf(&a, r->terms);
    llmcl__arg_i32(&a, r->grad);
    arg_buf(&a, r->grad ? r->coef : NULL);
    const size_t local = 64, g = (size_t)llmcl__div_up(count, 64) * local;
    return llmcl__launch(&a, 1, &g, &local);
}

static llmcl_status loss_run(pref_run *r)
{
    if (!r->loss)
        return LLMCL_OK;
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_loss", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i64(&a, r->pairs);
    llmcl__arg_i32(&a, r->inter);
    llmcl__arg_f32(&a, r->o.nll_weight);
    arg_buf(&a, r->seq);
    arg_buf(&a, r->nc);
    arg_buf(&a, r->terms);
    llmcl__arg_tensor(&a, r->loss);
    return llmcl__launch(&a, 1, &r->wg, &r->wg);
}

/* Positions [r0, r0 + n): their upstream gradients into g, their sequences' coefficients. */
static llmcl_status rows_run(pref_run *r, llmcl_tensor *g, int64_t r0, int64_t n)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_rows", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i64(&a, r0);
    llmcl__arg_i64(&a, n);
    llmcl__arg_i64(&a, r->t);
    arg_buf(&a, r->coef);
    arg_buf(&a, g);
    const size_t gl = (size_t)llmcl__div_up(n, (int64_t)r->wg) * r->wg;
    return llmcl__launch(&a, 1, &gl, &r->wg);
}

/*
 * The chunked form's hook: a chunk of whole interleaved pairs has its cross-entropies in ce;
 * its sequences' sums, its pairs' terms and its positions' upstream gradients into g.
 */
static llmcl_status chunk_hook(void *user, const llmcl_tensor *ce, llmcl_tensor *g, int64_t r0,
                               int64_t rows)
{
    pref_run *r = user;
    LLMCL__TRY(sequences_run(r, r->labels, ce, r0 / r->t, rows / r->t));
    LLMCL__TRY(pairs_run(r, r0 / (2 * r->t), rows / (2 * r->t)));
    return g ? rows_run(r, g, r0, rows) : LLMCL_OK;
}

/* Where the device cuts loops short: pref_seq walks T positions, pref_count B T, pref_loss B
   pairs. */
static llmcl_status check_loops(const pref_run *r)
{
    const int64_t wg = (int64_t)r->wg;
    int64_t red = 1;
    for (int64_t w = wg; w > 1; w /= 2)
        ++red;
    LLMCL__TRY(llmcl__check_loops(r->ctx, llmcl__div_up(r->t, wg) + 2 * red,
                                  "preference loss: sequences of %lld positions", (long long)r->t));
    LLMCL__TRY(llmcl__check_loops(r->ctx, llmcl__div_up(r->pairs * r->t, wg) + red,
                                  "preference loss: %lld chosen positions",
                                  (long long)(r->pairs * r->t)));
    return llmcl__check_loops(r->ctx, llmcl__div_up(r->pairs, wg) + 2 * red,
                              "preference loss: %lld pairs", (long long)r->pairs);
}

static llmcl_status scratch(pref_run *r)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t seq2 = 4 * r->pairs, seqs = 2 * r->pairs, one = 1;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &seq2, "preference sequence sums", &r->seq));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->pairs, "preference pair terms", &r->terms));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &one, "preference chosen positions", &r->nc));
    if (!r->grad)
        return LLMCL_OK;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference upstream gradients", &r->g));
    return llmcl__scratch(ctx, LLMCL_F32, 1, &seqs, "preference coefficients", &r->coef);
}

/* The fused form: the fused cross-entropy's forward, the terms, and its backward. */
static llmcl_status fused_run(pref_run *r, const llmcl_tensor *hidden, const llmcl_tensor *weight,
                              const llmcl_tensor *bias, const llmcl_tensor *labels,
                              llmcl_tensor *dhidden, llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    llmcl_ctx *ctx = r->ctx;
    const llmcl_ce_options ce = ce_options(r);
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference cross-entropies", &r->ce));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference LSEs", &r->lse));
    LLMCL__TRY(llmcl_fused_cross_entropy_forward(ctx, hidden, weight, bias, labels, &ce, r->ce,
                                                 NULL, r->lse));
    LLMCL__TRY(count_run(r, labels));
    LLMCL__TRY(sequences_run(r, labels, r->ce, 0, 2 * r->pairs));
    LLMCL__TRY(pairs_run(r, 0, r->pairs));
    LLMCL__TRY(loss_run(r));
    if (!r->grad)
        return LLMCL_OK;
    LLMCL__TRY(rows_run(r, r->g, 0, r->n));
    return llmcl_fused_cross_entropy_backward(ctx, hidden, weight, bias, labels, r->lse, r->g, &ce,
                                              dhidden, dweight, dbias);
}

/*
 * hidden [2B, T, ...] or its labels seen as [2, B, T, ...], and a contiguous copy of the same
 * shape seen with each chosen sequence beside its rejected one.
 */
static llmcl_status pair_views(const llmcl_tensor *t, const llmcl_tensor *copy, int64_t pairs,
                               llmcl_tensor **stacked, llmcl_tensor **inter)
{
    const int nd = llmcl_tensor_ndim(t);
    int64_t shape[4] = {2, pairs}, st[4], ct[4];
    st[0] = pairs * llmcl_tensor_stride(t, 0);
    st[1] = llmcl_tensor_stride(t, 0);
    int64_t inner = 1;
    for (int d = nd - 1; d >= 1; --d) {
        shape[d + 1] = llmcl_tensor_dim(t, d);
        st[d + 1] = llmcl_tensor_stride(t, d);
        ct[d + 1] = inner;
        inner *= shape[d + 1];
    }
    ct[0] = inner;
    ct[1] = 2 * inner;
    LLMCL__TRY(llmcl_tensor_view(t, nd + 1, shape, st, llmcl_tensor_offset(t), stacked));
    return llmcl_tensor_view(copy, nd + 1, shape, ct, llmcl_tensor_offset(copy), inter);
}

/* dst (the interleaved copy, or the caller's tensor) = src through their pair views. */
static llmcl_status copy_pairs(pref_run *r, const llmcl_tensor *src, llmcl_tensor *dst,
                               bool to_copy)
{
    const llmcl_tensor *user = to_copy ? src : dst, *copy = to_copy ? dst : src;
    llmcl_tensor *stacked = NULL, *inter = NULL;
    llmcl_status st = pair_views(user, copy, r->pairs, &stacked, &inter);
    if (st == LLMCL_OK)
        st = to_copy ? llmcl_copy(r->ctx, stacked, inter) : llmcl_copy(r->ctx, inter, stacked);
    llmcl_tensor_destroy(stacked);
    llmcl_tensor_destroy(inter);
    return st;
}

/* The chunked form: the pairs interleaved, chunks of whole pairs, dhidden copied back. */
static llmcl_status chunked_run(pref_run *r, const llmcl_tensor *hidden,
                                const llmcl_tensor *weight, const llmcl_tensor *bias,
                                const llmcl_tensor *labels, llmcl_tensor *dhidden,
                                llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t h = llmcl_tensor_dim(hidden, 2), hshape[2] = {r->n, h};
    llmcl_tensor *hid = NULL, *lab = NULL, *dh = NULL;
    llmcl_status st;
    r->inter = 1;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, hidden->dtype, 2, hshape, "interleaved pairs", &hid),
                    done);
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, labels->dtype, 1, &r->n, "interleaved labels", &lab),
                    done);
    if (dhidden)
        LLMCL__TRY_GOTO(
            st, llmcl__scratch(ctx, LLMCL_F32, 2, hshape, "interleaved dhidden", &dh), done);
    LLMCL__TRY_GOTO(st, copy_pairs(r, hidden, hid, true), done);
    LLMCL__TRY_GOTO(st, copy_pairs(r, labels, lab, true), done);
    r->labels = lab;
    LLMCL__TRY_GOTO(st, count_run(r, lab), done);
    llmcl_ce_options ce = ce_options(r);
    ce.chunk_bytes = r->o.chunk_bytes ? r->o.chunk_bytes : PREF_DEFAULT_BUDGET;
    ce.logits_dtype = r->o.logits_dtype;
    LLMCL__TRY_GOTO(st,
                    llmcl__linear_ce_hooked(ctx, hid, weight, bias, lab, &ce, 2 * r->t, chunk_hook,
                                            r, r->g, dh, dweight, dbias),
                    done);
    LLMCL__TRY_GOTO(st, loss_run(r), done);
    st = dhidden ? copy_pairs(r, dh, dhidden, false) : LLMCL_OK;
done:
    r->labels = labels;
    llmcl_tensor_destroy(hid);
    llmcl_tensor_destroy(lab);
    llmcl_tensor_destroy(dh);
    return st;
}

/*
 * Whether the chunked form runs: gradients or 16-bit logits asked for, no fused form forced
 * (vocab_chunk), and one pair's logits within the budget (f32 ones with their 16-bit copy for
 * 16-bit products).
 */
static bool chunked_fits(const pref_run *r, const llmcl_tensor *hidden, int64_t v,
                         bool products)
{
    const bool logits16 = r->o.logits_dtype != LLMCL_F32;
    if ((!r->grad && !logits16) || r->o.vocab_chunk != 0)
        return false;
    const bool copy = !logits16 && products && hidden->dtype != LLMCL_F32;
    const uint64_t per_row = (uint64_t)v * (logits16 ? 2 : copy ? 6 : 4);
    const uint64_t budget = r->o.chunk_bytes ? r->o.chunk_bytes : PREF_DEFAULT_BUDGET;
    return per_row * (uint64_t)(2 * r->t) <= budget;
}

llmcl_status llmcl_linear_preference_forward(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                             const llmcl_tensor *weight, const llmcl_tensor *bias,
                                             const llmcl_tensor *labels,
                                             const llmcl_tensor *ref_logps,
                                             const llmcl_pref_options *opts, llmcl_tensor *loss,
                                             llmcl_tensor *logps, llmcl_tensor *dhidden,
                                             llmcl_tensor *dweight, llmcl_tensor *dbias)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    pref_run r = {.ctx = ctx};
    LLMCL__TRY(check_options(ctx, opts, &r));
    LLMCL__TRY(check_sequences(ctx, hidden, labels, &r));
    LLMCL__TRY(llmcl__check_tensor(ctx, weight, "weight", 1u << hidden->dtype, 2, 2));
    const llmcl_tensor *ins[] = {hidden, weight, bias, labels, ref_logps};
    const char *in_names[] = {"hidden", "weight", "bias", "labels", "ref_logps"};
    const llmcl_tensor *outs[] = {loss, logps, dhidden, dweight, dbias};
    const char *out_names[] = {"loss", "logps", "dhidden", "dweight", "dbias"};
    LLMCL__TRY(check_outputs(ctx, &r, ins, in_names, 5, outs, out_names));
    r.grad = dhidden || dweight || dbias;
    r.ref = ref_logps;
    r.logps = logps;
    r.loss = loss;
    const size_t wg_max = llmcl__pow2_floor(ctx->info.max_work_group_size);
    r.wg = wg_max < 256 ? wg_max : 256;
    LLMCL__TRY(check_loops(&r));

    llmcl_status st;
    LLMCL__TRY_GOTO(st, scratch(&r), done);
    if (chunked_fits(&r, hidden, llmcl_tensor_dim(weight, 0), dhidden || dweight))
        st = chunked_run(&r, hidden, weight, bias, labels, dhidden, dweight, dbias);
    else
        st = fused_run(&r, hidden, weight, bias, labels, dhidden, dweight, dbias);
done:
    run_release(&r);
    return st;
}
