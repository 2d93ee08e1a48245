/*
 * preference.c: host launcher of the preference losses. llmcl_linear_preference_forward runs the
 * fused cross-entropy's forward (reduction none) for each position's -logp and LSE, preference.cl
 * for the sequences' and pairs' terms, and the fused cross-entropy's backward with each
 * position's upstream gradient.
 */
#include <math.h>

#include "../internal.h"

#define PREF_DEFAULT_IGNORE (-100)
#define PREF_DEFAULT_BETA 0.1f

/* One call's shapes, checked options and scratch. */
typedef struct pref_run {
    llmcl_ctx *ctx;
    llmcl_pref_options o;
    int average;
    int64_t pairs, t, n, ignore;
    const llmcl_tensor *labels;
    size_t wg;
    llmcl_tensor *ce, *lse, *seq, *coef, *g;
} pref_run;

static const char *const loss_names[] = {"DPO", "IPO", "SimPO", "CPO", "ORPO"};

static void run_release(pref_run *r)
{
    llmcl_tensor_destroy(r->ce);
    llmcl_tensor_destroy(r->lse);
    llmcl_tensor_destroy(r->seq);
    llmcl_tensor_destroy(r->coef);
    llmcl_tensor_destroy(r->g);
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
    LLMCL__REQUIRE(ctx, o->logps >= LLMCL_PREF_LOGPS_DEFAULT && o->logps <= LLMCL_PREF_LOGPS_AVERAGE,
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

/* hidden [2B, T, H] and labels [2B, T]; the fused cross-entropy checks the rest of them. */
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

/* The fused cross-entropy's options for this call. */
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

/* Each sequence's sum of logp and scored positions, from the forward's cross-entropies. */
static llmcl_status sequences_run(pref_run *r)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_seq", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_tensor(&a, r->labels);
    llmcl__arg_i64(&a, r->t);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, r->ce);
    arg_buf(&a, r->seq);
    const size_t g = (size_t)(2 * r->pairs) * r->wg;
    return llmcl__launch(&a, 1, &g, &r->wg);
}

static llmcl_status pairs_run(pref_run *r, const llmcl_tensor *ref, llmcl_tensor *logps,
                              llmcl_tensor *loss, bool grad)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_pairs", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i32(&a, (int32_t)r->o.loss);
    llmcl__arg_i32(&a, r->average);
    llmcl__arg_i64(&a, r->pairs);
    llmcl__arg_f32(&a, r->o.beta);
    llmcl__arg_f32(&a, r->o.gamma);
    llmcl__arg_f32(&a, r->o.label_smoothing);
    llmcl__arg_f32(&a, r->o.nll_weight);
    llmcl__arg_f32(&a, r->o.grad_scale);
    arg_buf(&a, r->seq);
    arg_opt(&a, ref);
    arg_opt(&a, logps);
    arg_opt(&a, loss);
    llmcl__arg_i32(&a, grad);
    arg_buf(&a, grad ? r->coef : NULL);
    return llmcl__launch(&a, 1, &r->wg, &r->wg);
}

/* Each position's upstream gradient, its sequence's coefficient. */
static llmcl_status rows_run(pref_run *r)
{
    cl_kernel k;
    LLMCL__TRY(pref_kernel(r, "pref_rows", &k));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_i64(&a, r->n);
    llmcl__arg_i64(&a, r->t);
    arg_buf(&a, r->coef);
    arg_buf(&a, r->g);
    const size_t g = (size_t)llmcl__div_up(r->n, (int64_t)r->wg) * r->wg;
    return llmcl__launch(&a, 1, &g, &r->wg);
}

/* Where the device cuts loops short: pref_seq walks T positions, pref_pairs B pairs twice. */
static llmcl_status check_loops(const pref_run *r)
{
    const int64_t wg = (int64_t)r->wg;
    int64_t red = 1;
    for (int64_t w = wg; w > 1; w /= 2)
        ++red;
    LLMCL__TRY(llmcl__check_loops(r->ctx, llmcl__div_up(r->t, wg) + 2 * red,
                                  "preference loss: sequences of %lld positions", (long long)r->t));
    return llmcl__check_loops(r->ctx, 2 * llmcl__div_up(r->pairs, wg) + 3 * red,
                              "preference loss: %lld pairs", (long long)r->pairs);
}

static llmcl_status scratch(pref_run *r, bool grad)
{
    llmcl_ctx *ctx = r->ctx;
    const int64_t seq2 = 4 * r->pairs, seqs = 2 * r->pairs;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference cross-entropies", &r->ce));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference LSEs", &r->lse));
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &seq2, "preference sequence sums", &r->seq));
    if (!grad)
        return LLMCL_OK;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &seqs, "preference coefficients", &r->coef));
    return llmcl__scratch(ctx, LLMCL_F32, 1, &r->n, "preference upstream gradients", &r->g);
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
    const bool grad = dhidden || dweight || dbias;
    const size_t wg_max = llmcl__pow2_floor(ctx->info.max_work_group_size);
    r.wg = wg_max < 256 ? wg_max : 256;
    LLMCL__TRY(check_loops(&r));

    llmcl_status st;
    const llmcl_ce_options ce = ce_options(&r);
    LLMCL__TRY_GOTO(st, scratch(&r, grad), done);
    LLMCL__TRY_GOTO(st,
                    llmcl_fused_cross_entropy_forward(ctx, hidden, weight, bias, labels, &ce,
                                                      r.ce, NULL, r.lse),
                    done);
    LLMCL__TRY_GOTO(st, sequences_run(&r), done);
    LLMCL__TRY_GOTO(st, pairs_run(&r, ref_logps, logps, loss, grad), done);
    if (grad) {
        LLMCL__TRY_GOTO(st, rows_run(&r), done);
        LLMCL__TRY_GOTO(st,
                        llmcl_fused_cross_entropy_backward(ctx, hidden, weight, bias, labels,
                                                           r.lse, r.g, &ce, dhidden, dweight,
                                                           dbias),
                        done);
    }
    st = LLMCL_OK;
done:
    run_release(&r);
    return st;
}
