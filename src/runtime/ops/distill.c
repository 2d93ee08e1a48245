/*
 * distill.c: host launchers of distill.cl. llmcl_distill_forward runs distill_count, then
 * distill_rows over the rows of materialised logits and distill_finish; the linear form does the
 * same per chunk of tokens, the chunks' logits and the student's gradient products through
 * llmcl_matmul.
 */
#include <limits.h>
#include <math.h>

#include "../internal.h"

#define DISTILL_DEFAULT_IGNORE (-100)
/* Two f32 logits chunks a token: 256 MiB held 128 tokens at V 128256, and the weight gradient's
   products with K 128 ran the linear form at 204 TFLOP/s on the H200 where 2 GiB (1664 tokens)
   ran 562 (docs/PERFORMANCE.md). */
#define DISTILL_DEFAULT_BUDGET (2ull << 30)

/* One call's state: checked options, the row program's defines and the scratch. */
typedef struct distill_run {
    llmcl_ctx *ctx;
    llmcl_distill_options o;
    int mode; /* 0 forward KL, 1 reverse KL, 2 the general form (distill.cl) */
    int hard; /* the cross-entropy term: 0 none, 1 its own LSE, 2 the student's (tau 1) */
    int64_t n, v, ignore;
    llmcl_dtype s_dt, t_dt, ds_dt;
    const llmcl_tensor *labels;
    llmcl__params rp; /* WG, UNROLL */
    llmcl_tensor *stats, *rows;
} distill_run;

static void run_release(distill_run *r)
{
    llmcl_tensor_destroy(r->stats);
    llmcl_tensor_destroy(r->rows);
}

/* ---- argument checks ---- */

static llmcl_status check_options(llmcl_ctx *ctx, const llmcl_distill_options *opts, distill_run *r)
{
    r->o = opts ? *opts : (llmcl_distill_options){0};
    const llmcl_distill_options *o = &r->o;
    LLMCL__REQUIRE(ctx, o->beta >= 0.0f && o->beta <= 1.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->beta %g is outside [0, 1]", (double)o->beta);
    LLMCL__REQUIRE(ctx, o->temperature >= 0.0f && isfinite(o->temperature),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->temperature %g must be finite and > 0 (0: 1)", (double)o->temperature);
    LLMCL__REQUIRE(ctx, o->reduction >= LLMCL_CE_MEAN && o->reduction <= LLMCL_CE_NONE,
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->reduction %d is not a llmcl_ce_reduction",
                   (int)o->reduction);
    LLMCL__REQUIRE(ctx, isfinite(o->grad_scale), LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->grad_scale %g must be finite", (double)o->grad_scale);
    LLMCL__REQUIRE(ctx, o->chunk_rows >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->chunk_rows %lld must be >= 0", (long long)o->chunk_rows);
    LLMCL__REQUIRE(ctx, o->ce_weight >= 0.0f && isfinite(o->ce_weight),
                   LLMCL_ERROR_INVALID_ARGUMENT, "opts->ce_weight %g must be finite and >= 0",
                   (double)o->ce_weight);
    if (o->temperature == 0.0f)
        r->o.temperature = 1.0f;
    if (o->grad_scale == 0.0f)
        r->o.grad_scale = 1.0f;
    r->mode = o->beta == 0.0f ? 0 : o->beta == 1.0f ? 1 : 2;
    r->hard = o->ce_weight == 0.0f ? 0 : r->o.temperature == 1.0f ? 2 : 1;
    r->ignore = o->use_ignore_index ? o->ignore_index : DISTILL_DEFAULT_IGNORE;
    return LLMCL_OK;
}

/* labels (optional) and loss against n rows; loss may overlap none of the inputs. */
static llmcl_status check_labels_loss(llmcl_ctx *ctx, const distill_run *r, int64_t n,
                                      const llmcl_tensor *labels, const llmcl_tensor *loss,
                                      const llmcl_tensor *const *ins, const char *const *names,
                                      int n_ins)
{
    LLMCL__REQUIRE(ctx, labels || !r->hard, LLMCL_ERROR_INVALID_ARGUMENT,
                   "opts->ce_weight %g needs labels: the cross-entropy's targets",
                   (double)r->o.ce_weight);
    if (labels)
        LLMCL__TRY(llmcl__check_vec(ctx, labels, "labels", LLMCL__INT_DTYPES, n));
    LLMCL__TRY(llmcl__check_vec(ctx, loss, "loss", 1u << LLMCL_F32,
                                r->o.reduction == LLMCL_CE_NONE ? n : 1));
    for (int i = 0; i < n_ins; ++i)
        LLMCL__REQUIRE(ctx, !ins[i] || !llmcl__overlaps(loss, ins[i]), LLMCL_ERROR_INVALID_ARGUMENT,
                       "loss overlaps %s", names[i]);
    return LLMCL_OK;
}

/* ---- the row program ---- */

/* distill_rows merges eight floats a work-item in local memory. */
#define DISTILL_LOCAL_PER_ITEM 32

static void row_params(distill_run *r)
{
    const llmcl_ctx *ctx = r->ctx;
    const uint64_t local = ctx->info.local_mem_static_bytes / DISTILL_LOCAL_PER_ITEM;
    const uint64_t items =
        ctx->info.max_work_group_size < local ? ctx->info.max_work_group_size : local;
    const long wg_max = (long)llmcl__pow2_floor(items);
    const long wg = ctx->info.is_gpu ? 512 : 64, unroll = ctx->info.is_gpu ? 2 : 1;
    r->rp = (llmcl__params){0};
    llmcl__param_set(&r->rp, "WG", wg < wg_max ? wg : wg_max);
    llmcl__param_set(&r->rp, "UNROLL", unroll);
    char cls[16];
    llmcl__shape_class(r->v, cls);
    const llmcl__tune_lookup lookup =
        llmcl__params_lookup(r->ctx, LLMCL_KEY_DISTILL_ROWS, r->s_dt, cls, &r->rp);
    /* the reductions need a power of two of at least 32; unrolling is bounded */
    const long w = llmcl__param_get(&r->rp, "WG", wg), u = llmcl__param_get(&r->rp, "UNROLL", 1);
    if (w < 32 || w > wg_max || (w & (w - 1)))
        llmcl__param_set(&r->rp, "WG", wg < wg_max ? wg : wg_max);
    if (u != 1 && u != 2 && u != 4)
        llmcl__param_set(&r->rp, "UNROLL", unroll);
    llmcl__params_record(&lookup, &r->rp);
}

/*
 * Where the device cuts loops short, whether a work-item's loops fit its budget: distill_count
 * and distill_finish walk the n rows a work-group, distill_rows a row in chunks of eight (three
 * walks of UNROLL loads and two or three online updates a trip, scalar tails of eight, six
 * reductions).
 */
static llmcl_status check_loops(distill_run *r)
{
    const int64_t wg = llmcl__param_get(&r->rp, "WG", 64);
    const int64_t u = llmcl__param_get(&r->rp, "UNROLL", 1);
    int64_t red = 1;
    for (int64_t w = wg; w > 1; w /= 2)
        ++red;
    LLMCL__TRY(llmcl__check_loops(r->ctx, llmcl__div_up(r->n, wg) + 1 + 2 * red,
                                  "distillation: %lld rows", (long long)r->n));
    const int64_t updates = r->hard == 1 ? 3 : 2;
    const int64_t walk =
        llmcl__div_up(llmcl__div_up(r->v, 8), wg * u) * (2 * u + updates * 9 * u) + 1;
    return llmcl__check_loops(r->ctx, 3 * walk + 6 * red, "distillation: rows of V = %lld",
                              (long long)r->v);
}

static llmcl_status row_kernel(distill_run *r, const char *name, cl_kernel *k, bool aligned)
{
    llmcl__defines d = {0};
    llmcl__define_str(&d, "S_DT", llmcl__dtype_macro(r->s_dt));
    llmcl__define_str(&d, "T_DT", llmcl__dtype_macro(r->t_dt));
    llmcl__define_str(&d, "DS_DT", llmcl__dtype_macro(r->ds_dt));
    llmcl__define_str(&d, "LABEL_DT", llmcl__dtype_macro(r->labels ? r->labels->dtype : LLMCL_I64));
    llmcl__define_int(&d, "ALIGNED", aligned);
    llmcl__define_int(&d, "MODE", r->mode);
    llmcl__define_int(&d, "HARD", r->hard);
    llmcl__params_define(&r->rp, &d);
    return llmcl__kernel(r->ctx, LLMCL_FAMILY_DISTILL, &d, name, k);
}

static void arg_labels(llmcl__args *a, const distill_run *r)
{
    llmcl__arg_i32(a, r->labels != NULL);
    if (r->labels)
        llmcl__arg_tensor(a, r->labels);
    else
        llmcl__arg_mem(a, NULL, 0);
}

/* A scratch buffer the kernels take without an offset (stats, per-row terms). */
static void arg_buf(llmcl__args *a, cl_mem m) { llmcl__arg(a, sizeof m, &m); }

static size_t wg_of(const distill_run *r) { return (size_t)llmcl__param_get(&r->rp, "WG", 64); }

/*
 * Picks the tunables, allocates the stats and per-row scratch and enqueues distill_count; with
 * the cross-entropy term, fails on an out-of-range label before anything is written.
 */
static llmcl_status run_begin(distill_run *r, llmcl_ctx *ctx, const llmcl_tensor *labels, int64_t n,
                              int64_t v, llmcl_dtype s_dt, llmcl_dtype t_dt)
{
    r->ctx = ctx;
    r->labels = labels;
    r->n = n;
    r->v = v;
    r->s_dt = r->ds_dt = s_dt;
    r->t_dt = t_dt;
    row_params(r);
    LLMCL__TRY(check_loops(r));
    const int64_t two = 2;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_I32, 1, &two, "distillation stats", &r->stats));
    if (r->o.reduction != LLMCL_CE_NONE)
        LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &n, "distillation per-row terms", &r->rows));
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "distill_count", &k, true));
    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_labels(&a, r);
    llmcl__arg_i64(&a, n);
    llmcl__arg_i64(&a, v);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, r->stats->mem);
    const size_t g = wg_of(r);
    LLMCL__TRY(llmcl__launch(&a, 1, &g, &g));
    return r->hard ? llmcl__check_label_stat(ctx, r->stats->mem, 1, labels, v, r->ignore)
                   : LLMCL_OK;
}

/* Rows [row0, row0 + nrows) of the call: student rows in s, teacher rows in t, dstudent in ds. */
typedef struct rows_job {
    cl_mem s, t, ds;
    int64_t soff, sstride, toff, tstride, dsoff, dsstride, nrows, row0;
} rows_job;

/* Whole chunks of eight are 16-byte accesses where every row of every operand starts on 16. */
static bool rows_aligned(const rows_job *j, bool grad)
{
    const int64_t e = 8;
    return j->soff % e == 0 && j->sstride % e == 0 && j->toff % e == 0 && j->tstride % e == 0 &&
           (!grad || (j->dsoff % e == 0 && j->dsstride % e == 0));
}

static llmcl_status rows_run(distill_run *r, const rows_job *j, llmcl_tensor *loss, bool grad)
{
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "distill_rows", &k, rows_aligned(j, grad)));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    llmcl__arg_mem(&a, j->s, j->soff);
    llmcl__arg_i64(&a, j->sstride);
    llmcl__arg_mem(&a, j->t, j->toff);
    llmcl__arg_i64(&a, j->tstride);
    llmcl__arg_i64(&a, r->v);
    arg_labels(&a, r);
    llmcl__arg_i64(&a, j->row0);
    llmcl__arg_i64(&a, r->ignore);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i32(&a, (int32_t)r->o.reduction);
    llmcl__arg_f32(&a, r->o.grad_scale);
    llmcl__arg_f32(&a, 1.0f / r->o.temperature);
    llmcl__arg_f32(&a, r->o.beta);
    llmcl__arg_f32(&a, r->o.ce_weight);
    if (r->rows)
        llmcl__arg_mem(&a, r->rows->mem, 0);
    else
        llmcl__arg_mem(&a, loss->mem, loss->offset);
    llmcl__arg_i32(&a, grad);
    llmcl__arg_mem(&a, grad ? j->ds : NULL, j->dsoff);
    llmcl__arg_i64(&a, j->dsstride);
    const size_t wg = wg_of(r), g = (size_t)j->nrows * wg;
    return llmcl__launch(&a, 1, &g, &wg);
}

/* The per-row terms into loss (mean or sum); reduction none wrote them there already. */
static llmcl_status run_finish(distill_run *r, llmcl_tensor *loss)
{
    if (!r->rows)
        return LLMCL_OK;
    cl_kernel k;
    LLMCL__TRY(row_kernel(r, "distill_finish", &k, true));
    llmcl__args a = llmcl__args_begin(r->ctx, k);
    arg_buf(&a, r->rows->mem);
    llmcl__arg_i64(&a, r->n);
    arg_buf(&a, r->stats->mem);
    llmcl__arg_i32(&a, (int32_t)r->o.reduction);
    llmcl__arg_tensor(&a, loss);
    const size_t g = wg_of(r);
    return llmcl__launch(&a, 1, &g, &g);
}

/* ---- materialised logits ---- */

static llmcl_status check_logits(llmcl_ctx *ctx, const llmcl_tensor *student,
                                 const llmcl_tensor *teacher, llmcl__rows *sr, llmcl__rows *tr)
{
    LLMCL__TRY(
        llmcl__check_tensor(ctx, student, "student", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(
        llmcl__check_tensor(ctx, teacher, "teacher", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__as_rows(ctx, student, "student", sr));
    LLMCL__TRY(llmcl__as_rows(ctx, teacher, "teacher", tr));
    LLMCL__REQUIRE(
        ctx, sr->n_rows == tr->n_rows && sr->row_len == tr->row_len, LLMCL_ERROR_SHAPE_MISMATCH,
        "student has %lld rows of %lld logits but teacher %lld of %lld", (long long)sr->n_rows,
        (long long)sr->row_len, (long long)tr->n_rows, (long long)tr->row_len);
    LLMCL__REQUIRE(ctx, sr->n_rows >= 1 && sr->row_len >= 1 && sr->n_rows <= INT_MAX,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "the logits must have 1 to 2^31-1 rows of V >= 1 (have %lld rows of %lld)",
                   (long long)sr->n_rows, (long long)sr->row_len);
    return LLMCL_OK;
}

/* dstudent: student itself, or a tensor of its shape and dtype that overlaps no input. */
static llmcl_status check_dstudent(llmcl_ctx *ctx, const llmcl_tensor *student,
                                   const llmcl_tensor *teacher, const llmcl_tensor *labels,
                                   const llmcl_tensor *loss, const llmcl_tensor *ds,
                                   llmcl__rows *dr)
{
    LLMCL__REQUIRE(ctx,
                   !llmcl__overlaps(ds, teacher) && (!labels || !llmcl__overlaps(ds, labels)) &&
                       !llmcl__overlaps(ds, loss),
                   LLMCL_ERROR_INVALID_ARGUMENT, "dstudent overlaps teacher, labels or loss");
    if (llmcl__same_view(student, ds))
        return LLMCL_OK;
    LLMCL__TRY(llmcl__check_tensor(ctx, ds, "dstudent", 1u << student->dtype, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_same_shape(ctx, student, "student", ds, "dstudent"));
    LLMCL__TRY(llmcl__as_rows(ctx, ds, "dstudent", dr));
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(student, ds), LLMCL_ERROR_INVALID_ARGUMENT,
                   "dstudent overlaps student without being student itself");
    LLMCL__REQUIRE(ctx, dr->n_rows <= 1 || dr->row_stride >= dr->row_len,
                   LLMCL_ERROR_INVALID_ARGUMENT, "dstudent's rows overlap each other");
    return LLMCL_OK;
}

llmcl_status llmcl_distill_forward(llmcl_ctx *ctx, const llmcl_tensor *student,
                                   const llmcl_tensor *teacher, const llmcl_tensor *labels,
                                   const llmcl_distill_options *opts, llmcl_tensor *loss,
                                   llmcl_tensor *dstudent)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    llmcl__rows sr, tr;
    LLMCL__TRY(check_logits(ctx, student, teacher, &sr, &tr));
    distill_run r = {0};
    LLMCL__TRY(check_options(ctx, opts, &r));
    const llmcl_tensor *ins[] = {student, teacher, labels, dstudent};
    const char *names[] = {"student", "teacher", "labels", "dstudent"};
    LLMCL__TRY(check_labels_loss(ctx, &r, sr.n_rows, labels, loss, ins, names, 4));
    llmcl__rows dr = sr;
    if (dstudent)
        LLMCL__TRY(check_dstudent(ctx, student, teacher, labels, loss, dstudent, &dr));

    llmcl_status st;
    LLMCL__TRY_GOTO(
        st, run_begin(&r, ctx, labels, sr.n_rows, sr.row_len, student->dtype, teacher->dtype),
        done);
    const rows_job j = {.s = student->mem,
                        .soff = student->offset,
                        .sstride = sr.row_stride,
                        .t = teacher->mem,
                        .toff = teacher->offset,
                        .tstride = tr.row_stride,
                        .ds = dstudent ? dstudent->mem : NULL,
                        .dsoff = dstudent ? dstudent->offset : 0,
                        .dsstride = dr.row_stride,
                        .nrows = sr.n_rows,
                        .row0 = 0};
    LLMCL__TRY_GOTO(st, rows_run(&r, &j, loss, dstudent != NULL), done);
    st = run_finish(&r, loss);
done:
    run_release(&r);
    return st;
}

/* ---- linear form: chunks of tokens through llmcl_matmul ---- */

typedef struct distill_linear {
    llmcl__rows h, w, th, tw, dh;
} distill_linear;

/* hidden [N, H] with weight [V, H], teacher_hidden [N, Ht] with teacher_weight [V, Ht]. */
static llmcl_status check_pair(llmcl_ctx *ctx, const llmcl_tensor *h, const char *hn,
                               const llmcl_tensor *w, const char *wn, llmcl__rows *hr,
                               llmcl__rows *wr)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, h, hn, LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__as_rows(ctx, h, hn, hr));
    LLMCL__TRY(llmcl__check_tensor(ctx, w, wn, 1u << h->dtype, 2, 2));
    LLMCL__TRY(llmcl__as_rows(ctx, w, wn, wr));
    LLMCL__REQUIRE(ctx, hr->row_len == wr->row_len && hr->row_len >= 1, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s rows have H = %lld but %s is [%lld, %lld]; expected [V, H]", hn,
                   (long long)hr->row_len, wn, (long long)wr->n_rows, (long long)wr->row_len);
    return LLMCL_OK;
}

static llmcl_status check_linear(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                 const llmcl_tensor *weight, const llmcl_tensor *th,
                                 const llmcl_tensor *tw, const llmcl_tensor *dhidden,
                                 const llmcl_tensor *dweight, distill_linear *out)
{
    LLMCL__TRY(check_pair(ctx, hidden, "hidden", weight, "weight", &out->h, &out->w));
    LLMCL__TRY(check_pair(ctx, th, "teacher_hidden", tw, "teacher_weight", &out->th, &out->tw));
    LLMCL__REQUIRE(ctx, out->h.n_rows == out->th.n_rows && out->w.n_rows == out->tw.n_rows,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "hidden has %lld rows and weight V = %lld but teacher_hidden %lld and "
                   "teacher_weight V = %lld",
                   (long long)out->h.n_rows, (long long)out->w.n_rows, (long long)out->th.n_rows,
                   (long long)out->tw.n_rows);
    LLMCL__REQUIRE(ctx, out->h.n_rows >= 1 && out->h.n_rows <= INT_MAX && out->w.n_rows >= 1,
                   LLMCL_ERROR_SHAPE_MISMATCH, "hidden needs 1 to 2^31-1 rows and weight V >= 1");
    if (dhidden)
        LLMCL__TRY(llmcl__check_grad(ctx, hidden, "hidden", dhidden, "dhidden", &out->dh));
    if (dweight) {
        llmcl__rows dw;
        LLMCL__TRY(llmcl__check_grad(ctx, weight, "weight", dweight, "dweight", &dw));
        LLMCL__REQUIRE(ctx, !dhidden || !llmcl__overlaps(dhidden, dweight),
                       LLMCL_ERROR_INVALID_ARGUMENT, "dhidden overlaps dweight");
    }
    return LLMCL_OK;
}

/* The chunks' scratch (f32 logits of both models, and the 16-bit dlogits operand where needed)
   and both weights as [V, H] views, made once for every chunk. */
typedef struct distill_chunk {
    llmcl_tensor *s, *t, *g16, *w, *tw;
} distill_chunk;

/* logits [rows, V] = h[r0, r0 + rows) x w^T (w the [V, H] view) into the head of scratch. */
static llmcl_status chunk_logits(llmcl_ctx *ctx, const llmcl_tensor *h, const llmcl__rows *hr,
                                 const llmcl_tensor *w, int64_t r0, int64_t rows,
                                 const llmcl_tensor *scratch)
{
    llmcl_tensor *hv = NULL, *lv = NULL;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl__rows_view(h, hr, r0, rows, &hv), done);
    LLMCL__TRY_GOTO(st, llmcl__head_view(scratch, rows, w->shape[0], &lv), done);
    const llmcl_matmul_opts o = {.trans_b = 1, .split_k = 1};
    st = llmcl_matmul(ctx, 1.0f, hv, w, 0.0f, lv, &o);
done:
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(lv);
    return st;
}

/* dhidden[r0, r0 + rows) = G w and dweight (+)= G^T hidden[r0, r0 + rows), w the [V, H] view. */
static llmcl_status chunk_grads(distill_run *r, const distill_linear *lin,
                                const llmcl_tensor *hidden, const llmcl_tensor *w,
                                const llmcl_tensor *gsrc, llmcl_tensor *dhidden,
                                llmcl_tensor *dweight, int64_t r0, int64_t rows)
{
    llmcl_tensor *g = NULL, *hv = NULL, *dhv = NULL;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl__head_view(gsrc, rows, r->v, &g), done);
    if (dhidden) {
        LLMCL__TRY_GOTO(st, llmcl__rows_view(dhidden, &lin->dh, r0, rows, &dhv), done);
        const llmcl_matmul_opts plain = {0};
        LLMCL__TRY_GOTO(st, llmcl_matmul(r->ctx, 1.0f, g, w, 0.0f, dhv, &plain), done);
    }
    if (dweight) {
        LLMCL__TRY_GOTO(st, llmcl__rows_view(hidden, &lin->h, r0, rows, &hv), done);
        const bool acc = r0 > 0 || r->o.accumulate_weight_grad;
        const llmcl_matmul_opts transposed = {.trans_a = 1, .split_k = 1};
        LLMCL__TRY_GOTO(
            st, llmcl_matmul(r->ctx, 1.0f, g, hv, acc ? 1.0f : 0.0f, dweight, &transposed), done);
    }
    st = LLMCL_OK;
done:
    llmcl_tensor_destroy(g);
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(dhv);
    return st;
}

static void chunk_free(distill_chunk *c)
{
    llmcl_tensor *all[] = {c->s, c->t, c->g16, c->w, c->tw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

llmcl_status
llmcl_linear_distill_forward(llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
                             const llmcl_tensor *teacher_hidden, const llmcl_tensor *teacher_weight,
                             const llmcl_tensor *labels, const llmcl_distill_options *opts,
                             llmcl_tensor *loss, llmcl_tensor *dhidden, llmcl_tensor *dweight)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    distill_linear lin = {0};
    LLMCL__TRY(
        check_linear(ctx, hidden, weight, teacher_hidden, teacher_weight, dhidden, dweight, &lin));
    const int64_t n = lin.h.n_rows, v = lin.w.n_rows;
    distill_run r = {0};
    LLMCL__TRY(check_options(ctx, opts, &r));
    const llmcl_tensor *ins[] = {hidden, weight,  teacher_hidden, teacher_weight,
                                 labels, dhidden, dweight};
    const char *names[] = {"hidden", "weight",  "teacher_hidden", "teacher_weight",
                           "labels", "dhidden", "dweight"};
    LLMCL__TRY(check_labels_loss(ctx, &r, n, labels, loss, ins, names, 7));
    for (int i = 5; i < 7; ++i)
        for (int j = 0; j < 5; ++j)
            LLMCL__REQUIRE(ctx, !ins[i] || !ins[j] || !llmcl__overlaps(ins[i], ins[j]),
                           LLMCL_ERROR_INVALID_ARGUMENT, "%s overlaps %s", names[i], names[j]);

    const bool grads = dhidden || dweight, g16 = grads && hidden->dtype != LLMCL_F32;
    distill_chunk ch = {0};
    llmcl_status st;
    LLMCL__TRY_GOTO(st, run_begin(&r, ctx, labels, n, v, LLMCL_F32, LLMCL_F32), done);
    if (g16)
        r.ds_dt = hidden->dtype; /* the row kernel writes the products' operand itself */
    /* a token's two f32 logits, and the 16-bit dlogits operand */
    const int64_t c = llmcl__chunk_tokens(
        n, r.o.chunk_rows, r.o.chunk_bytes ? r.o.chunk_bytes : DISTILL_DEFAULT_BUDGET,
        (uint64_t)v * (8 + (g16 ? 2 : 0)));
    const int64_t shape[2] = {c, v};
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 2, shape, "student logits chunk", &ch.s),
                    done);
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_F32, 2, shape, "teacher logits chunk", &ch.t),
                    done);
    if (g16)
        LLMCL__TRY_GOTO(
            st, llmcl__scratch(ctx, hidden->dtype, 2, shape, "16-bit dlogits chunk", &ch.g16),
            done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(weight, &lin.w, 0, v, &ch.w), done);
    LLMCL__TRY_GOTO(st, llmcl__rows_view(teacher_weight, &lin.tw, 0, v, &ch.tw), done);
    for (int64_t r0 = 0; r0 < n; r0 += c) {
        const int64_t rows = n - r0 < c ? n - r0 : c;
        LLMCL__TRY_GOTO(st, chunk_logits(ctx, hidden, &lin.h, ch.w, r0, rows, ch.s), done);
        LLMCL__TRY_GOTO(st, chunk_logits(ctx, teacher_hidden, &lin.th, ch.tw, r0, rows, ch.t),
                        done);
        const llmcl_tensor *g = g16 ? ch.g16 : ch.s;
        const rows_job j = {.s = ch.s->mem,
                            .soff = ch.s->offset,
                            .sstride = v,
                            .t = ch.t->mem,
                            .toff = ch.t->offset,
                            .tstride = v,
                            .ds = g->mem,
                            .dsoff = g->offset,
                            .dsstride = v,
                            .nrows = rows,
                            .row0 = r0};
        LLMCL__TRY_GOTO(st, rows_run(&r, &j, loss, grads), done);
        if (grads)
            LLMCL__TRY_GOTO(st, chunk_grads(&r, &lin, hidden, ch.w, g, dhidden, dweight, r0, rows),
                            done);
    }
    st = run_finish(&r, loss);
done:
    chunk_free(&ch);
    run_release(&r);
    return st;
}
