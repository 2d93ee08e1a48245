/*
 * test_distill.c: the distillation losses against the double reference (ref/distill_ref.c) at
 * beta 0 (forward KL), 1 (reverse KL) and between, every reduction and temperature, mixed
 * dtypes, in place, strided and unaligned rows, V of 1 to 40000, with and without the weighted
 * cross-entropy; the edge cases (every row ignored, -inf classes and labels, logits of +-1e4),
 * repeatability, the loop budget of devices that cut loops short, the linear form over several
 * chunks with and without gradients and its repeated bits, log-probabilities as inputs, and
 * every bad argument (out-of-range labels leaving every output as it was, the first of several
 * named).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill_ref.h"
#include "harness.h"

#define IGNORE (-100)

/* ---- helpers ---- */


/* Labels in [0, v) with about one row in `ignore_every` ignored (0: none). */
static llmcl_tensor *make_labels(th_rng *rng, int64_t n, int64_t v, int ignore_every,
                                 llmcl_dtype dt, int64_t *y)
{
    double *d = th_alloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; ++i) {
        y[i] =
            ignore_every && th_randint(rng, 0, ignore_every) == 0 ? IGNORE : th_randint(rng, 0, v);
        d[i] = (double)y[i];
    }
    llmcl_tensor *t = th_tensor_from(dt, 1, &n, d);
    free(d);
    return t;
}

static const th_tol loss_tol = {1e-5, 2e-4};

static llmcl_distill_options opts_of(double beta, double tau, int reduction, double gs)
{
    return (llmcl_distill_options){.beta = (float)beta,
                                   .temperature = (float)tau,
                                   .reduction = (llmcl_ce_reduction)reduction,
                                   .grad_scale = (float)gs};
}

static ref_distill_opts ref_of(const llmcl_distill_options *o)
{
    return (ref_distill_opts){o->beta, o->temperature ? o->temperature : 1.0, (int)o->reduction,
                              IGNORE,  o->grad_scale ? o->grad_scale : 1.0,   o->ce_weight};
}

static llmcl_tensor *loss_tensor(const llmcl_distill_options *o, int64_t n)
{
    const int64_t k = o->reduction == LLMCL_CE_NONE ? n : 1;
    return th_tensor(LLMCL_F32, 1, &k);
}

/* ---- the reference: its gradient against central differences of its loss ---- */

static void test_ref_gradient(void **state)
{
    (void)state;
    const int64_t n = 3, v = 6;
    const int64_t labels[3] = {1, IGNORE, 4};
    const double betas[] = {0.0, 0.3, 0.5, 1.0}, taus[] = {1.0, 2.5}, hard[] = {0.0, 0.7};
    th_rng rng = th_rng_new(1);
    double s[18], t[18], g[18], loss, lp, lm;
    th_fill_uniform(&rng, s, 18, -3, 3);
    th_fill_uniform(&rng, t, 18, -3, 3);
    for (int b = 0; b < 8; ++b)
        for (int k = 0; k < 2; ++k) {
            const ref_distill_opts o = {betas[b % 4], taus[k], 0, IGNORE, 1.5, hard[b / 4]};
            ref_distill(s, t, labels, n, v, &o, &loss, g);
            assert_true(loss > 0.0);
            for (int64_t i = 0; i < n * v; ++i) {
                const double h = 1e-6, keep = s[i];
                s[i] = keep + h;
                ref_distill(s, t, labels, n, v, &o, &lp, NULL);
                s[i] = keep - h;
                ref_distill(s, t, labels, n, v, &o, &lm, NULL);
                s[i] = keep;
                assert_true(fabs(1.5 * (lp - lm) / (2 * h) - g[i]) < 1e-6);
            }
        }
}

/* ---- materialised logits ---- */

typedef struct dcase {
    int64_t n, v;
    llmcl_dtype sdt, tdt;
    double beta, tau;
    int reduction, ignore_every;
    bool in_place;
    double gs, hw; /* grad_scale, ce_weight */
} dcase;

/* One call on poisoned outputs against the reference; returns nothing, asserts. */
static void run_case(const dcase *c, uint64_t seed)
{
    th_rng rng = th_rng_new(seed);
    const int64_t n = c->n, v = c->v, shape[2] = {n, v};
    double *s = th_new_normal(&rng, (size_t)(n * v), 2.0, c->sdt);
    double *t = th_new_normal(&rng, (size_t)(n * v), 2.0, c->tdt);
    int64_t *y = th_alloc((size_t)n * sizeof *y);
    llmcl_tensor *lab = c->ignore_every >= 0 ? make_labels(&rng, n, v, c->ignore_every,
                                                           seed % 2 ? LLMCL_I32 : LLMCL_I64, y)
                                             : NULL;
    llmcl_tensor *st = th_tensor_from(c->sdt, 2, shape, s),
                 *tt = th_tensor_from(c->tdt, 2, shape, t);
    llmcl_tensor *ds = c->in_place ? st : th_tensor(c->sdt, 2, shape);
    llmcl_distill_options o = opts_of(c->beta, c->tau, c->reduction, c->gs);
    o.ce_weight = (float)c->hw;
    llmcl_tensor *loss = loss_tensor(&o, n);
    TH_OK(llmcl_distill_forward(th_ctx(), st, tt, lab, &o, loss, ds));

    const ref_distill_opts ro = ref_of(&o);
    const size_t nl = (size_t)llmcl_tensor_numel(loss);
    double *rl = th_alloc(nl * sizeof *rl), *rg = th_alloc((size_t)(n * v) * sizeof *rg);
    ref_distill(s, t, lab ? y : NULL, n, v, &ro, rl, rg);
    double *gl = th_download_new(loss), *gg = th_download_new(ds);
    char what[128];
    snprintf(what, sizeof what, "loss n %lld v %lld beta %g tau %g red %d ce %g", (long long)n,
             (long long)v, c->beta, c->tau, c->reduction, c->hw);
    TH_ASSERT_CLOSE(what, rl, gl, nl, loss_tol);
    TH_ASSERT_CLOSE("dstudent", rg, gg, (size_t)(n * v), th_grad_tol(c->sdt, rg, (size_t)(n * v)));
    free(s), free(t), free(y), free(rl), free(rg), free(gl), free(gg);
    if (!c->in_place)
        llmcl_tensor_destroy(ds);
    llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(lab);
    llmcl_tensor_destroy(loss);
}

static void test_distill_cases(void **state)
{
    (void)state;
    static const dcase cases[] = {
        /* n, v, sdt, tdt, beta, tau, red, ignore_every (-1: no labels), in_place, gs, ce_weight */
        {5, 1000, LLMCL_F32, LLMCL_F32, 0.0, 1.0, 0, 3, false, 1.0, 0.0},
        {5, 1000, LLMCL_F32, LLMCL_F32, 1.0, 1.0, 0, 3, false, 1.0, 0.0},
        {5, 1000, LLMCL_F32, LLMCL_F32, 0.5, 1.0, 0, 3, false, 1.0, 0.0},
        {7, 333, LLMCL_F32, LLMCL_F32, 0.25, 2.0, 1, -1, false, 2.0, 0.0},
        {7, 333, LLMCL_F32, LLMCL_F32, 0.0, 0.5, 2, 2, true, 1.0, 0.0},
        {7, 333, LLMCL_F32, LLMCL_F32, 1.0, 3.0, 2, -1, true, 0.5, 0.0},
        {33, 64, LLMCL_BF16, LLMCL_BF16, 0.0, 1.0, 0, 4, false, 1.0, 0.0},
        {33, 64, LLMCL_BF16, LLMCL_F32, 0.5, 2.0, 0, 4, true, 1.0, 0.0},
        {9, 517, LLMCL_F16, LLMCL_BF16, 1.0, 1.0, 1, 0, false, 1.0, 0.0},
        {9, 517, LLMCL_F32, LLMCL_F16, 0.9, 1.0, 2, 0, false, 1.0, 0.0},
        {1, 1, LLMCL_F32, LLMCL_F32, 0.5, 1.0, 0, -1, false, 1.0, 0.0},
        {3, 7, LLMCL_F32, LLMCL_BF16, 0.0, 1.0, 0, -1, false, 1.0, 0.0},
        {3, 7, LLMCL_BF16, LLMCL_F32, 1.0, 1.0, 1, -1, true, 1.0, 0.0},
        {2, 40000, LLMCL_F32, LLMCL_F32, 0.5, 1.0, 0, -1, false, 1.0, 0.0},
        {2, 40001, LLMCL_BF16, LLMCL_BF16, 0.0, 2.0, 1, -1, false, 1.0, 0.0},
        /* the cross-entropy beside: at tau 1 (the student's LSE serves) and not */
        {5, 1000, LLMCL_F32, LLMCL_F32, 0.0, 1.0, 0, 3, false, 1.0, 1.0},
        {7, 333, LLMCL_F32, LLMCL_F32, 0.25, 2.0, 1, 0, false, 2.0, 1.5},
        {7, 333, LLMCL_F32, LLMCL_F32, 1.0, 3.0, 2, 2, true, 0.5, 0.25},
        {33, 64, LLMCL_BF16, LLMCL_BF16, 0.5, 1.0, 0, 4, true, 1.0, 1.0},
        {9, 517, LLMCL_F16, LLMCL_BF16, 1.0, 0.5, 0, 0, false, 1.0, 3.0},
        {1, 1, LLMCL_F32, LLMCL_F32, 0.5, 2.0, 0, 0, false, 1.0, 1.0},
        {2, 40001, LLMCL_BF16, LLMCL_BF16, 0.0, 2.0, 1, 0, false, 1.0, 2.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_case(&cases[i], 100 + i);
}

/* Loss only (no dstudent), and every row ignored: loss 0 (mean and sum) and a zero gradient. */
static void test_distill_edges(void **state)
{
    (void)state;
    th_rng rng = th_rng_new(7);
    const int64_t n = 4, v = 50, shape[2] = {n, v};
    double *s = th_new_normal(&rng, (size_t)(n * v), 3.0, LLMCL_F32);
    double *t = th_new_normal(&rng, (size_t)(n * v), 3.0, LLMCL_F32);
    llmcl_tensor *st = th_tensor_from(LLMCL_F32, 2, shape, s),
                 *tt = th_tensor_from(LLMCL_F32, 2, shape, t);
    llmcl_distill_options o = opts_of(0.5, 1.0, 0, 1.0);
    llmcl_tensor *loss = loss_tensor(&o, n);
    TH_OK(llmcl_distill_forward(th_ctx(), st, tt, NULL, &o, loss, NULL));
    double got, ref;
    const ref_distill_opts ro = ref_of(&o);
    ref_distill(s, t, NULL, n, v, &ro, &ref, NULL);
    th_download(loss, &got);
    TH_ASSERT_CLOSE("loss only", &ref, &got, 1, loss_tol);

    const double ign[4] = {IGNORE, IGNORE, IGNORE, IGNORE};
    llmcl_tensor *lab = th_tensor_from(LLMCL_I64, 1, &n, ign), *ds = th_tensor(LLMCL_F32, 2, shape);
    for (int red = 0; red < 2; ++red) {
        o.reduction = (llmcl_ce_reduction)red;
        TH_OK(llmcl_distill_forward(th_ctx(), st, tt, lab, &o, loss, ds));
        double *g = th_download_new(ds);
        th_download(loss, &got);
        assert_true(got == 0.0);
        for (int64_t i = 0; i < n * v; ++i)
            assert_true(g[i] == 0.0);
        free(g);
    }
    free(s), free(t);
    llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(lab);
    llmcl_tensor_destroy(ds), llmcl_tensor_destroy(loss);
}

/*
 * -inf logits: classes -inf on both sides add nothing; a class -inf for the student only makes
 * the forward KL +inf with a finite gradient, and for the teacher only the reverse KL; 0 < beta
 * < 1 stays finite. Large logits (+-1e4) stay finite too.
 */
static void test_distill_ninf(void **state)
{
    (void)state;
    const int64_t n = 3, v = 37, shape[2] = {n, v};
    th_rng rng = th_rng_new(11);
    double *s = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_F32);
    double *t = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_F32);
    for (int64_t j = 0; j < v; j += 5)
        s[j] = t[j] = -INFINITY; /* row 0: both sides */
    s[v + 3] = -INFINITY;        /* row 1: the student only */
    t[2 * v + 4] = -INFINITY;    /* row 2: the teacher only */
    s[11] = 1e4, t[12] = -1e4;   /* and large logits in row 0 */
    const double betas[] = {0.0, 0.5, 1.0};
    for (int b = 0; b < 3; ++b) {
        llmcl_tensor *st = th_tensor_from(LLMCL_F32, 2, shape, s);
        llmcl_tensor *tt = th_tensor_from(LLMCL_F32, 2, shape, t),
                     *ds = th_tensor(LLMCL_F32, 2, shape);
        const llmcl_distill_options o = opts_of(betas[b], 1.0, 2, 1.0);
        llmcl_tensor *loss = loss_tensor(&o, n);
        TH_OK(llmcl_distill_forward(th_ctx(), st, tt, NULL, &o, loss, ds));
        double rl[3], *rg = th_alloc((size_t)(n * v) * sizeof *rg);
        const ref_distill_opts ro = ref_of(&o);
        ref_distill(s, t, NULL, n, v, &ro, rl, rg);
        assert_true(isfinite(rl[0]));
        assert_true(b == 0 ? rl[1] == INFINITY : isfinite(rl[1]));
        assert_true(b == 2 ? rl[2] == INFINITY : isfinite(rl[2]));
        double *gl = th_download_new(loss), *gg = th_download_new(ds);
        TH_ASSERT_CLOSE("-inf loss", rl, gl, 3, loss_tol);
        /* rows of finite divergence: every gradient; the infinite one's is undefined there.
           Row 0's logits of 1e4 carry f32's rounding at that size into X, Y and the KL. */
        for (int64_t i = 0; i < n; ++i) {
            th_tol tol = th_grad_tol(LLMCL_F32, rg + i * v, (size_t)v);
            tol.atol += i == 0 ? 4e4 * 0x1p-24 : 0.0;
            if (isfinite(rl[i]) || b == 0)
                TH_ASSERT_CLOSE("-inf dstudent", rg + i * v, gg + i * v, (size_t)v, tol);
        }
        free(rg), free(gl), free(gg);
        llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(ds);
        llmcl_tensor_destroy(loss);
    }
    free(s), free(t);
}

/*
 * The cross-entropy beside the divergence: a label whose logit is -inf makes its row +inf, the
 * others stay right; labels outside [0, V) fail by row and value and leave every output as it
 * was, in place too; without ce_weight they only mark ignored rows, as before.
 */
static void test_distill_hard_labels(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 3, v = 37, shape[2] = {n, v};
    th_rng rng = th_rng_new(12);
    double *s = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_F32);
    double *t = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_F32);
    s[5] = -INFINITY; /* row 0's label */
    const double yd[3] = {5, IGNORE, 9};
    const int64_t y[3] = {5, IGNORE, 9};
    llmcl_tensor *st = th_tensor_from(LLMCL_F32, 2, shape, s),
                 *tt = th_tensor_from(LLMCL_F32, 2, shape, t);
    llmcl_tensor *lab = th_tensor_from(LLMCL_I64, 1, &n, yd), *ds = th_tensor(LLMCL_F32, 2, shape);
    llmcl_distill_options o = opts_of(0.5, 1.0, 2, 1.0);
    o.ce_weight = 0.5f;
    llmcl_tensor *loss = loss_tensor(&o, n);
    TH_OK(llmcl_distill_forward(ctx, st, tt, lab, &o, loss, ds));
    double rl[3], *rg = th_alloc((size_t)(n * v) * sizeof *rg);
    const ref_distill_opts ro = ref_of(&o);
    ref_distill(s, t, y, n, v, &ro, rl, rg);
    assert_true(rl[0] == INFINITY && isfinite(rl[2]));
    double *gl = th_download_new(loss), *gg = th_download_new(ds);
    TH_ASSERT_CLOSE("-inf label loss", rl, gl, 3, loss_tol);
    TH_ASSERT_CLOSE("-inf label dstudent", rg, gg, (size_t)(n * v),
                    th_grad_tol(LLMCL_F32, rg, (size_t)(n * v)));
    free(rg), free(gl), free(gg);

    const double bad[2][3] = {{5, IGNORE, 37}, {-1, 2, 3}};
    const char *named[2] = {"labels[2] = 37", "labels[0] = -1"};
    for (int k = 0; k < 2; ++k) {
        llmcl_tensor *lb = th_tensor_from(k ? LLMCL_I64 : LLMCL_I32, 1, &n, bad[k]);
        th_poison(loss);
        TH_FAILS(llmcl_distill_forward(ctx, st, tt, lb, &o, loss, st),
                 LLMCL_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(llmcl_last_error(ctx), named[k]));
        double *after = th_download_new(st), *l = th_download_new(loss);
        assert_memory_equal(after, s, (size_t)(n * v) * sizeof *s);
        for (int64_t i = 0; i < n; ++i)
            assert_true(isnan(l[i]));
        free(after), free(l);
        o.ce_weight = 0.0f; /* a mask only */
        TH_OK(llmcl_distill_forward(ctx, st, tt, lb, &o, loss, ds));
        o.ce_weight = 0.5f;
        llmcl_tensor_destroy(lb);
    }
    free(s), free(t);
    llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(lab);
    llmcl_tensor_destroy(ds), llmcl_tensor_destroy(loss);
}

/*
 * The first bad row where one work-item of distill_count meets several: bad labels at rows 5 + k
 * WG for every power-of-two WG up to 1024, so that some work-item sees row 5 and later ones.
 */
static void test_distill_first_bad_label(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 1100, v = 10, shape[2] = {n, v};
    th_rng rng = th_rng_new(13);
    double *s = th_new_normal(&rng, (size_t)(n * v), 1.0, LLMCL_F32);
    double *y = th_alloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; ++i)
        y[i] = (double)th_randint(&rng, 0, v);
    for (int64_t k = 0; 5 + k < n; k = k ? 2 * k : 32) /* 0, 32, 64, ..., 1024 */
        y[5 + k] = (double)v;
    llmcl_tensor *st = th_tensor_from(LLMCL_F32, 2, shape, s);
    llmcl_tensor *tt = th_tensor_from(LLMCL_F32, 2, shape, s);
    llmcl_tensor *lab = th_tensor_from(LLMCL_I64, 1, &n, y);
    llmcl_distill_options o = opts_of(0.5, 1.0, 0, 1.0);
    o.ce_weight = 0.5f;
    llmcl_tensor *loss = loss_tensor(&o, n);
    TH_FAILS(llmcl_distill_forward(ctx, st, tt, lab, &o, loss, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    if (!strstr(llmcl_last_error(ctx), "labels[5] = 10"))
        fail_msg("expected the first bad row, labels[5] = 10: %s", llmcl_last_error(ctx));
    llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(lab);
    llmcl_tensor_destroy(loss);
    free(s), free(y);
}

/*
 * Rows of a wider buffer, at element offsets that leave them unaligned (the scalar chunks) and
 * aligned: student columns [1, 1 + v) of [n, v + 9], teacher [0, v) of [n, v + 8], the gradient
 * into a third view; the padding must stay poisoned.
 */
static void test_distill_strided(void **state)
{
    (void)state;
    const int64_t n = 6, v = 203;
    for (int shift = 0; shift < 2; ++shift) {
        th_rng rng = th_rng_new(20 + shift);
        const int64_t ws = v + 8 + shift, wshape[2] = {n, ws}, vshape[2] = {n, v};
        const int64_t vstr[2] = {ws, 1};
        llmcl_tensor *sb = th_tensor(LLMCL_BF16, 2, wshape), *tb = th_tensor(LLMCL_F32, 2, wshape);
        llmcl_tensor *db = th_tensor(LLMCL_BF16, 2, wshape);
        llmcl_tensor *sv, *tv, *dv;
        TH_OK(llmcl_tensor_view(sb, 2, vshape, vstr, shift, &sv));
        TH_OK(llmcl_tensor_view(tb, 2, vshape, vstr, 0, &tv));
        TH_OK(llmcl_tensor_view(db, 2, vshape, vstr, 8, &dv));
        double *s = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_BF16);
        double *t = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_F32);
        th_upload(sv, s);
        th_upload(tv, t);
        const llmcl_distill_options o = opts_of(0.5, 1.5, 1, 1.0);
        llmcl_tensor *loss = loss_tensor(&o, n);
        TH_OK(llmcl_distill_forward(th_ctx(), sv, tv, NULL, &o, loss, dv));
        double rl, got, *rg = th_alloc((size_t)(n * v) * sizeof *rg);
        const ref_distill_opts ro = ref_of(&o);
        ref_distill(s, t, NULL, n, v, &ro, &rl, rg);
        th_download(loss, &got);
        TH_ASSERT_CLOSE("strided loss", &rl, &got, 1, loss_tol);
        double *gg = th_download_new(dv), *whole = th_download_new(db);
        TH_ASSERT_CLOSE("strided dstudent", rg, gg, (size_t)(n * v),
                        th_grad_tol(LLMCL_BF16, rg, (size_t)(n * v)));
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < ws; ++j)
                if (j < 8 || j >= 8 + v)
                    assert_true(isnan(whole[i * ws + j]));
        free(s), free(t), free(rg), free(gg), free(whole);
        llmcl_tensor_destroy(sv), llmcl_tensor_destroy(tv), llmcl_tensor_destroy(dv);
        llmcl_tensor_destroy(sb), llmcl_tensor_destroy(tb), llmcl_tensor_destroy(db);
        llmcl_tensor_destroy(loss);
    }
}

/* The same inputs give the same bits, call after call (every sum in a fixed order). */
static void test_distill_repeat(void **state)
{
    (void)state;
    th_rng rng = th_rng_new(30);
    const int64_t n = 16, v = 4099, shape[2] = {n, v};
    double *s = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_BF16);
    double *t = th_new_normal(&rng, (size_t)(n * v), 2.0, LLMCL_BF16);
    llmcl_tensor *st = th_tensor_from(LLMCL_BF16, 2, shape, s),
                 *tt = th_tensor_from(LLMCL_BF16, 2, shape, t);
    llmcl_tensor *ds = th_tensor(LLMCL_BF16, 2, shape);
    const llmcl_distill_options o = opts_of(0.5, 1.0, 0, 1.0);
    llmcl_tensor *loss = loss_tensor(&o, n);
    double *first = NULL, l0 = 0.0;
    for (int k = 0; k < 3; ++k) {
        th_poison(ds);
        TH_OK(llmcl_distill_forward(th_ctx(), st, tt, NULL, &o, loss, ds));
        double l, *g = th_download_new(ds);
        th_download(loss, &l);
        if (!first) {
            first = g, l0 = l;
            continue;
        }
        assert_memory_equal(&l, &l0, sizeof l);
        assert_memory_equal(g, first, (size_t)(n * v) * sizeof *g);
        free(g);
    }
    free(first), free(s), free(t);
    llmcl_tensor_destroy(st), llmcl_tensor_destroy(tt), llmcl_tensor_destroy(ds);
    llmcl_tensor_destroy(loss);
}

/* Where loops are cut short: rows within the budget run, longer ones are refused by name. */
static void test_distill_loop_limit(void **state)
{
    (void)state;
    th_loop_limit("400");
    const dcase ok = {40, 300, LLMCL_F32, LLMCL_F32, 0.5, 1.0, 0, 3, false, 1.0, 0.0};
    run_case(&ok, 40);
    const dcase hard = {40, 300, LLMCL_F32, LLMCL_F32, 0.5, 2.0, 0, 3, false, 1.0, 1.0};
    run_case(&hard, 41);
    const int64_t shape[2] = {2, 200000};
    llmcl_tensor *s = th_tensor(LLMCL_F32, 2, shape), *t = th_tensor(LLMCL_F32, 2, shape);
    const llmcl_distill_options o = {0};
    llmcl_tensor *loss = loss_tensor(&o, 2);
    TH_FAILS(llmcl_distill_forward(th_ctx(), s, t, NULL, &o, loss, NULL), LLMCL_ERROR_UNSUPPORTED);
    assert_non_null(strstr(llmcl_last_error(th_ctx()), "V = 200000"));
    llmcl_tensor_destroy(s), llmcl_tensor_destroy(t), llmcl_tensor_destroy(loss);
    th_loop_limit(NULL);
}

static void test_distill_bad_args(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t shape[2] = {4, 10}, other[2] = {4, 11}, rows5[2] = {5, 10}, n = 4, one = 1;
    llmcl_tensor *s = th_tensor(LLMCL_F32, 2, shape), *t = th_tensor(LLMCL_BF16, 2, shape);
    llmcl_tensor *ds = th_tensor(LLMCL_F32, 2, shape), *loss = th_tensor(LLMCL_F32, 1, &one);
    llmcl_tensor *t11 = th_tensor(LLMCL_F32, 2, other), *t5 = th_tensor(LLMCL_F32, 2, rows5);
    llmcl_tensor *loss4 = th_tensor(LLMCL_F32, 1, &n), *lossb = th_tensor(LLMCL_BF16, 1, &one);
    llmcl_tensor *labf = th_tensor(LLMCL_F32, 1, &n), *lab5 = th_tensor(LLMCL_I64, 1, &rows5[0]);
    llmcl_tensor *dsb = th_tensor(LLMCL_BF16, 2, shape), *half;
    const int64_t hshape[2] = {4, 5};
    TH_OK(llmcl_tensor_view(s, 2, hshape, NULL, 3, &half));
    const llmcl_distill_options ok = {0};
    llmcl_distill_options o;

    TH_FAILS(llmcl_distill_forward(NULL, s, t, NULL, &ok, loss, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_distill_forward(ctx, NULL, t, NULL, &ok, loss, ds),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_distill_forward(ctx, s, NULL, NULL, &ok, loss, ds),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, NULL, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    const float bad_beta[] = {-0.1f, 1.5f, NAN}, bad_tau[] = {-1.0f, INFINITY, NAN};
    for (int i = 0; i < 3; ++i) {
        o = ok, o.beta = bad_beta[i];
        TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds),
                 LLMCL_ERROR_INVALID_ARGUMENT);
        o = ok, o.temperature = bad_tau[i];
        TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds),
                 LLMCL_ERROR_INVALID_ARGUMENT);
    }
    o = ok, o.reduction = (llmcl_ce_reduction)7;
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    o = ok, o.grad_scale = INFINITY;
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    const float bad_ce[] = {-0.5f, INFINITY, NAN};
    for (int i = 0; i < 3; ++i) {
        o = ok, o.ce_weight = bad_ce[i];
        TH_FAILS(llmcl_distill_forward(ctx, s, t, lab5, &o, loss, ds),
                 LLMCL_ERROR_INVALID_ARGUMENT);
    }
    o = ok, o.ce_weight = 1.0f; /* the cross-entropy needs its targets */
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "needs labels"));
    TH_FAILS(llmcl_distill_forward(ctx, s, t11, NULL, &ok, loss, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, s, t5, NULL, &ok, loss, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, loss4, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    o = ok, o.reduction = LLMCL_CE_NONE;
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, lossb, ds), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, labf, &ok, loss, ds), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, lab5, &ok, loss, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, loss, dsb), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, loss, t11), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, half, t, NULL, &ok, loss, ds), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, loss, half), LLMCL_ERROR_SHAPE_MISMATCH);
    /* outputs over inputs: loss over the student, dstudent over the teacher or shifted a row */
    llmcl_tensor *s_first, *rows0, *rows1;
    TH_OK(llmcl_tensor_view(s, 1, &one, NULL, 7, &s_first));
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &ok, s_first, ds),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_distill_forward(ctx, t5, t5, NULL, &ok, loss, t5), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_tensor_view(t5, 2, shape, NULL, 0, &rows0));
    TH_OK(llmcl_tensor_view(t5, 2, shape, NULL, 10, &rows1));
    TH_FAILS(llmcl_distill_forward(ctx, rows0, t, NULL, &ok, loss, rows1),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_distill_forward(ctx, rows0, t, NULL, &ok, loss, rows0)); /* in place */
    /* a failed call leaves its outputs as they were */
    double got;
    th_poison(loss);
    o = ok, o.beta = 2.0f;
    TH_FAILS(llmcl_distill_forward(ctx, s, t, NULL, &o, loss, ds), LLMCL_ERROR_INVALID_ARGUMENT);
    th_download(loss, &got);
    assert_true(isnan(got));

    llmcl_tensor *all[] = {s,    t,    ds,  loss, t11,     t5,    loss4, lossb,
                           labf, lab5, dsb, half, s_first, rows0, rows1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

/* ---- the linear form ---- */

typedef struct lcase {
    llmcl_dtype dt, tdt;
    int64_t n, h, ht, v, chunk_rows;
    double beta, tau;
    int reduction, ignore_every;
    bool dh, dw, accumulate;
    double hw; /* ce_weight */
} lcase;

/* a [n, k] x b [m, k]^T into out [n, m], in double. */
static void ref_product_bt(const double *a, const double *b, int64_t n, int64_t m, int64_t k,
                           double *out)
{
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; ++p)
                acc += a[i * k + p] * b[j * k + p];
            out[i * m + j] = acc;
        }
}

/* GEMM results in f32 over many terms: slack relative to the largest entry, plus the 16-bit
   rounding of the dlogits the gradient products saw. */
static th_tol mat_tol(const double *ref, size_t n, llmcl_dtype dt)
{
    const double u = dt == LLMCL_BF16 ? 1.0 / 256 : dt == LLMCL_F16 ? 1.0 / 2048 : 0.0;
    return (th_tol){(1e-4 + 2 * u) * th_max_abs(ref, n) + 1e-7, 1e-3 + 2 * u};
}

static void run_linear(const lcase *c, uint64_t seed)
{
    th_rng rng = th_rng_new(seed);
    const int64_t n = c->n, h = c->h, ht = c->ht, v = c->v;
    const int64_t hs[2] = {n, h}, ws[2] = {v, h}, ths[2] = {n, ht}, tws[2] = {v, ht};
    double *hid = th_new_normal(&rng, (size_t)(n * h), 1.0, c->dt);
    double *w = th_new_normal(&rng, (size_t)(v * h), 0.3, c->dt);
    double *th = th_new_normal(&rng, (size_t)(n * ht), 1.0, c->tdt);
    double *tw = th_new_normal(&rng, (size_t)(v * ht), 0.3, c->tdt);
    double *dw0 = th_new_normal(&rng, (size_t)(v * h), 0.1, LLMCL_F32);
    int64_t *y = th_alloc((size_t)n * sizeof *y);
    llmcl_tensor *lab =
        c->ignore_every >= 0 ? make_labels(&rng, n, v, c->ignore_every, LLMCL_I64, y) : NULL;
    llmcl_tensor *ht_ = th_tensor_from(c->dt, 2, hs, hid), *wt = th_tensor_from(c->dt, 2, ws, w);
    llmcl_tensor *tht = th_tensor_from(c->tdt, 2, ths, th),
                 *twt = th_tensor_from(c->tdt, 2, tws, tw);
    llmcl_tensor *dh = c->dh ? th_tensor(LLMCL_F32, 2, hs) : NULL;
    llmcl_tensor *dwt = c->dw ? th_tensor_from(LLMCL_F32, 2, ws, dw0) : NULL;
    llmcl_distill_options o = opts_of(c->beta, c->tau, c->reduction, 1.0);
    o.chunk_rows = c->chunk_rows;
    o.accumulate_weight_grad = c->accumulate;
    o.ce_weight = (float)c->hw;
    llmcl_tensor *loss = loss_tensor(&o, n);
    TH_OK(llmcl_linear_distill_forward(th_ctx(), ht_, wt, tht, twt, lab, &o, loss, dh, dwt));

    double *sl = th_alloc((size_t)(n * v) * sizeof *sl),
           *tl = th_alloc((size_t)(n * v) * sizeof *tl);
    double *g = th_alloc((size_t)(n * v) * sizeof *g);
    ref_product_bt(hid, w, n, v, h, sl);
    ref_product_bt(th, tw, n, v, ht, tl);
    const ref_distill_opts ro = ref_of(&o);
    const size_t nl = (size_t)llmcl_tensor_numel(loss);
    double *rl = th_alloc(nl * sizeof *rl);
    ref_distill(sl, tl, lab ? y : NULL, n, v, &ro, rl, g);
    double *gl = th_download_new(loss);
    TH_ASSERT_CLOSE("linear loss", rl, gl, nl, (th_tol){1e-4, 1e-3});
    if (dh) {
        double *rdh = th_alloc((size_t)(n * h) * sizeof *rdh), *got = th_download_new(dh);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t k = 0; k < h; ++k) {
                double acc = 0.0;
                for (int64_t j = 0; j < v; ++j)
                    acc += g[i * v + j] * w[j * h + k];
                rdh[i * h + k] = acc;
            }
        TH_ASSERT_CLOSE("linear dhidden", rdh, got, (size_t)(n * h),
                        mat_tol(rdh, (size_t)(n * h), c->dt));
        free(rdh), free(got);
    }
    if (dwt) {
        double *rdw = th_alloc((size_t)(v * h) * sizeof *rdw), *got = th_download_new(dwt);
        for (int64_t j = 0; j < v; ++j)
            for (int64_t k = 0; k < h; ++k) {
                double acc = c->accumulate ? dw0[j * h + k] : 0.0;
                for (int64_t i = 0; i < n; ++i)
                    acc += g[i * v + j] * hid[i * h + k];
                rdw[j * h + k] = acc;
            }
        TH_ASSERT_CLOSE("linear dweight", rdw, got, (size_t)(v * h),
                        mat_tol(rdw, (size_t)(v * h), c->dt));
        free(rdw), free(got);
    }
    free(hid), free(w), free(th), free(tw), free(dw0), free(y), free(sl), free(tl), free(g);
    free(rl), free(gl);
    llmcl_tensor *all[] = {lab, ht_, wt, tht, twt, dh, dwt, loss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

static void test_linear_distill(void **state)
{
    (void)state;
    static const lcase cases[] = {
        /* dt, tdt, n, h, ht, v, chunk_rows, beta, tau, red, ignore_every, dh, dw, accumulate,
           ce_weight */
        {LLMCL_F32, LLMCL_F32, 37, 24, 40, 203, 0, 0.0, 1.0, 0, 3, true, true, false, 0.0},
        {LLMCL_F32, LLMCL_F32, 37, 24, 40, 203, 8, 0.5, 2.0, 1, -1, true, true, true, 0.0},
        {LLMCL_F32, LLMCL_BF16, 29, 16, 48, 130, 7, 1.0, 1.0, 2, 2, true, false, false, 0.0},
        {LLMCL_BF16, LLMCL_BF16, 37, 40, 24, 301, 16, 0.5, 1.0, 0, 4, true, true, false, 0.0},
        {LLMCL_BF16, LLMCL_F32, 21, 32, 32, 77, 0, 0.0, 3.0, 0, -1, false, true, true, 0.0},
        {LLMCL_F16, LLMCL_F16, 13, 16, 16, 64, 5, 0.2, 1.0, 1, 0, true, true, false, 0.0},
        {LLMCL_BF16, LLMCL_BF16, 9, 24, 24, 50, 4, 0.5, 1.0, 0, 3, false, false, false, 0.0},
        {LLMCL_F32, LLMCL_F32, 37, 24, 40, 203, 8, 0.0, 1.0, 0, 3, true, true, true, 1.0},
        {LLMCL_BF16, LLMCL_BF16, 37, 40, 24, 301, 16, 0.5, 2.0, 0, 4, true, true, false, 0.25},
        {LLMCL_F32, LLMCL_BF16, 29, 16, 48, 130, 7, 1.0, 1.0, 2, 2, true, false, false, 2.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_linear(&cases[i], 200 + i);
}

/* Each row of x [n, v] replaced by its log-softmax. */
static void log_softmax_rows(double *x, int64_t n, int64_t v)
{
    for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < v; ++j)
            m = fmax(m, x[i * v + j]);
        for (int64_t j = 0; j < v; ++j)
            sum += exp(x[i * v + j] - m);
        for (int64_t j = 0; j < v; ++j)
            x[i * v + j] -= m + log(sum);
    }
}

/* The linear form gives the same bits call after call, over several chunks, and log-probabilities
   (a fixed point of log-softmax) give what their logits give. */
static void test_linear_repeat(void **state)
{
    (void)state;
    th_rng rng = th_rng_new(300);
    const int64_t n = 45, h = 32, v = 300, hs[2] = {n, h}, ws[2] = {v, h};
    double *hid = th_new_normal(&rng, (size_t)(n * h), 1.0, LLMCL_BF16);
    double *w = th_new_normal(&rng, (size_t)(v * h), 0.3, LLMCL_BF16);
    double *th = th_new_normal(&rng, (size_t)(n * h), 1.0, LLMCL_BF16);
    llmcl_tensor *ht = th_tensor_from(LLMCL_BF16, 2, hs, hid),
                 *wt = th_tensor_from(LLMCL_BF16, 2, ws, w);
    llmcl_tensor *tht = th_tensor_from(LLMCL_BF16, 2, hs, th), *dh = th_tensor(LLMCL_F32, 2, hs);
    llmcl_tensor *dw = th_tensor(LLMCL_F32, 2, ws);
    llmcl_distill_options o = opts_of(0.5, 1.0, 0, 1.0);
    o.chunk_rows = 16;
    llmcl_tensor *loss = loss_tensor(&o, n);
    double l0 = 0.0, *dh0 = NULL, *dw0 = NULL;
    for (int k = 0; k < 2; ++k) {
        th_poison(dh), th_poison(dw);
        TH_OK(llmcl_linear_distill_forward(th_ctx(), ht, wt, tht, wt, NULL, &o, loss, dh, dw));
        double l, *gh = th_download_new(dh), *gw = th_download_new(dw);
        th_download(loss, &l);
        if (k == 0) {
            l0 = l, dh0 = gh, dw0 = gw;
            continue;
        }
        assert_memory_equal(&l, &l0, sizeof l);
        assert_memory_equal(gh, dh0, (size_t)(n * h) * sizeof *gh);
        assert_memory_equal(gw, dw0, (size_t)(v * h) * sizeof *gw);
        free(gh), free(gw);
    }

    /* log-probabilities of random logits against the logits themselves */
    const int64_t shape[2] = {n, v};
    double *s = th_new_normal(&rng, (size_t)(n * v), 3.0, LLMCL_F32);
    double *t = th_new_normal(&rng, (size_t)(n * v), 3.0, LLMCL_F32);
    llmcl_tensor *st = th_tensor_from(LLMCL_F32, 2, shape, s),
                 *tt = th_tensor_from(LLMCL_F32, 2, shape, t);
    const llmcl_distill_options lo = opts_of(0.0, 1.0, 0, 1.0);
    double from_logits, from_logp;
    TH_OK(llmcl_distill_forward(th_ctx(), st, tt, NULL, &lo, loss, NULL));
    th_download(loss, &from_logits);
    log_softmax_rows(s, n, v);
    log_softmax_rows(t, n, v);
    th_upload(st, s), th_upload(tt, t);
    TH_OK(llmcl_distill_forward(th_ctx(), st, tt, NULL, &lo, loss, NULL));
    th_download(loss, &from_logp);
    TH_ASSERT_CLOSE("log-probabilities", &from_logits, &from_logp, 1, loss_tol);

    free(hid), free(w), free(th), free(dh0), free(dw0), free(s), free(t);
    llmcl_tensor *all[] = {ht, wt, tht, dh, dw, loss, st, tt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

static void test_linear_bad_args(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t hs[2] = {6, 8}, ws[2] = {20, 8}, ths[2] = {6, 12}, tws[2] = {20, 12};
    const int64_t h7[2] = {7, 12}, w21[2] = {21, 12}, one = 1;
    llmcl_tensor *h = th_tensor(LLMCL_BF16, 2, hs), *w = th_tensor(LLMCL_BF16, 2, ws);
    llmcl_tensor *th = th_tensor(LLMCL_F32, 2, ths), *tw = th_tensor(LLMCL_F32, 2, tws);
    llmcl_tensor *th7 = th_tensor(LLMCL_F32, 2, h7), *tw21 = th_tensor(LLMCL_F32, 2, w21);
    llmcl_tensor *tw16 = th_tensor(LLMCL_BF16, 2, tws), *w32 = th_tensor(LLMCL_F32, 2, ws);
    llmcl_tensor *h32 = th_tensor(LLMCL_F32, 2, hs);
    llmcl_tensor *dh = th_tensor(LLMCL_F32, 2, hs), *dw = th_tensor(LLMCL_F32, 2, ws);
    llmcl_tensor *dh16 = th_tensor(LLMCL_BF16, 2, hs), *loss = th_tensor(LLMCL_F32, 1, &one);
    const llmcl_distill_options ok = {0};
    llmcl_distill_options o = ok;
    TH_FAILS(llmcl_linear_distill_forward(NULL, h, w, th, tw, NULL, &ok, loss, dh, dw),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th7, tw, NULL, &ok, loss, dh, dw),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw21, NULL, &ok, loss, dh, dw),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw16, NULL, &ok, loss, dh, dw),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w32, th, tw, NULL, &ok, loss, dh, dw),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw, NULL, &ok, loss, dh16, dw),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw, NULL, &ok, loss, dh, dh),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw, NULL, &ok, loss, th, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, w32, NULL, &ok, loss, dh, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h32, w32, th, tw, NULL, &ok, loss, NULL, w32),
             LLMCL_ERROR_INVALID_ARGUMENT);
    o.chunk_rows = -1;
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw, NULL, &o, loss, dh, dw),
             LLMCL_ERROR_INVALID_ARGUMENT);
    /* an out-of-range label under ce_weight: nothing written, the weight gradient included */
    const double yd[6] = {1, 2, IGNORE, 20, 0, 3};
    const int64_t six = 6;
    llmcl_tensor *lab = th_tensor_from(LLMCL_I64, 1, &six, yd);
    o = ok, o.ce_weight = 1.0f, o.accumulate_weight_grad = 1;
    th_poison(dh), th_poison(dw), th_poison(loss);
    TH_FAILS(llmcl_linear_distill_forward(ctx, h, w, th, tw, lab, &o, loss, dh, dw),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "labels[3] = 20"));
    llmcl_tensor *outs[] = {dh, dw, loss};
    for (int k = 0; k < 3; ++k) {
        double *got = th_download_new(outs[k]);
        for (int64_t i = 0; i < llmcl_tensor_numel(outs[k]); ++i)
            assert_true(isnan(got[i]));
        free(got);
    }
    llmcl_tensor *all[] = {h, w, th, tw, th7, tw21, tw16, w32, h32, dh, dw, dh16, loss, lab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_gradient),        cmocka_unit_test(test_distill_cases),
        cmocka_unit_test(test_distill_edges),       cmocka_unit_test(test_distill_ninf),
        cmocka_unit_test(test_distill_hard_labels),
        cmocka_unit_test(test_distill_first_bad_label), cmocka_unit_test(test_distill_strided),
        cmocka_unit_test(test_distill_repeat),      cmocka_unit_test(test_distill_loop_limit),
        cmocka_unit_test(test_distill_bad_args),    cmocka_unit_test(test_linear_distill),
        cmocka_unit_test(test_linear_repeat),       cmocka_unit_test(test_linear_bad_args),
    };
    return TH_RUN(tests);
}
