/*
 * test_cross_entropy.c: the three cross-entropy forms against double references for every option
 * and reduction (materialised logits, chunked linear with CLBlast, fully fused tiles), their edge
 * cases (all tokens ignored, logits of +-1e4, -inf logits, V not a multiple of a tile, N = 1,
 * V = 1, bad labels, the first of several bad labels named), agreement between the forms, memory
 * bounds, and the bad-argument paths.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy_ref.h"
#include "harness.h"

/* ---- helpers ---- */

/* Labels in [0, v) with about one in `ignore_every` rows set to ignore (0: none). */
static int64_t *make_labels(th_rng *rng, int64_t n, int64_t v, int ignore_every, int64_t ignore)
{
    int64_t *y = th_alloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; ++i)
        y[i] = (ignore_every && th_randint(rng, 0, ignore_every) == 0) ? ignore
                                                                       : th_randint(rng, 0, v);
    return y;
}

static llmcl_tensor *labels_tensor(llmcl_dtype dt, const int64_t *y, int64_t n)
{
    double *d = th_alloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; ++i)
        d[i] = (double)y[i];
    llmcl_tensor *t = th_tensor_from(dt, 1, &n, d);
    free(d);
    return t;
}


/* References never give NaN, so that th_compare (where NaN matches NaN) rejects any NaN output. */
static void assert_no_nan(const double *x, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        assert_false(isnan(x[i]));
}

/*
 * Where a case puts -inf: in the logits of every row (path 1) or in the bias (paths 2 and 3), at
 * columns start, start + every, ... below end (every 0: none). Labels that land there move to the
 * next finite column; `rows` adds the NINF_* cases.
 */
typedef struct ninf_spec {
    int64_t start, end, every;
    int rows;
} ninf_spec;

enum {
    NINF_TARGET = 1,      /* row 0's label on column start: +inf loss, finite gradient */
    NINF_ROW = 2,         /* row 1 entirely -inf (path 1) */
    NINF_ROW_IGNORED = 4, /* row 2 entirely -inf and ignored (path 1) */
    NINF_ZERO_WEIGHT = 8, /* class weight 0 on the -inf columns */
};

static bool ninf_col(const ninf_spec *m, int64_t j)
{
    return m->every && j >= m->start && j < m->end && (j - m->start) % m->every == 0;
}

/* Applies m to x (nx rows of v: logits, or a bias with nx = 1), labels y [n] and weights w. */
static void ninf_apply(const ninf_spec *m, double *x, int64_t nx, int64_t v, int64_t *y, int64_t n,
                       int64_t ignore, double *w)
{
    for (int64_t j = 0; j < v; ++j) {
        if (!ninf_col(m, j))
            continue;
        for (int64_t i = 0; i < nx; ++i)
            x[i * v + j] = -INFINITY;
        if (w && (m->rows & NINF_ZERO_WEIGHT))
            w[j] = 0.0;
    }
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < v && y[i] != ignore && ninf_col(m, y[i]); ++k)
            y[i] = (y[i] + 1) % v;
    if (m->rows & NINF_TARGET)
        y[0] = m->start;
    for (int r = 1; r <= 2; ++r) {
        if (!(m->rows & (r == 1 ? NINF_ROW : NINF_ROW_IGNORED)))
            continue;
        for (int64_t j = 0; j < v; ++j)
            x[r * v + j] = -INFINITY;
        y[r] = r == 2 ? ignore : y[r] == ignore ? 0 : y[r];
    }
}

/* Loss values: f32 math over V terms. */
static const th_tol loss_tol = {1e-4, 2e-4};

/* ---- the reference itself: its gradient against central differences of its loss ---- */

static void test_ref_gradient(void **state)
{
    (void)state;
    const int64_t n = 3, v = 5;
    th_rng rng = th_rng_new(1);
    double x[15], w[5], g[15], loss[3], z[3], lse[3];
    th_fill_uniform(&rng, x, 15, -3, 3);
    th_fill_uniform(&rng, w, 5, 0.5, 2);
    const int64_t y[3] = {1, -100, 4};
    for (int red = 0; red < 3; ++red) {
        const ref_ce_opts o = {-100, red, 0.1, 0.01, 2.5, w};
        ref_cross_entropy(x, y, n, v, &o, loss, z, lse, g);
        for (int k = 0; k < 15; ++k) {
            double lp[3], lm[3];
            const double x0 = x[k], h = 1e-6;
            x[k] = x0 + h;
            ref_cross_entropy(x, y, n, v, &o, lp, z, lse, NULL);
            x[k] = x0 - h;
            ref_cross_entropy(x, y, n, v, &o, lm, z, lse, NULL);
            x[k] = x0;
            double fd = 0.0;
            for (int i = 0; i < (red == 2 ? 3 : 1); ++i)
                fd += (lp[i] - lm[i]) / (2 * h);
            assert_true(fabs(fd - g[k]) < 1e-6);
        }
    }
}

/* ---- path 1: materialised logits ---- */

typedef struct ce_case {
    llmcl_dtype dt, label_dt;
    int reduction;
    float eps, zs, cap;
    bool weighted;
    int grad; /* 0 none, 1 in place, 2 separate */
    int splits;
    int64_t n, v;
    double scale; /* logits uniform in [-scale, scale] */
    int ignore_every;
    int64_t ignore; /* ignore_index (use_ignore_index set when != -100) */
} ce_case;

/* Case c on logits x [n, v] (rounded to c->dt), labels y and class weights w (or NULL). */
static void check_case(const ce_case *c, const double *x, const int64_t *y, const double *w)
{
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = c->n, v = c->v, nv = n * v, shape[2] = {n, v};
    const int nl = c->reduction == 2 ? (int)n : 1;
    double *rl = th_alloc((size_t)n * sizeof *rl), *rz = th_alloc((size_t)n * sizeof *rz);
    double *rlse = th_alloc((size_t)n * sizeof *rlse), *rg = th_alloc((size_t)nv * sizeof *rg);
    const ref_ce_opts ro = {c->ignore, c->reduction, c->eps, c->zs, c->cap, w};
    assert_int_equal(ref_cross_entropy(x, y, n, v, &ro, rl, rz, rlse, rg), -1);
    assert_no_nan(rl, (size_t)nl), assert_no_nan(rz, (size_t)nl);
    assert_no_nan(rlse, (size_t)n), assert_no_nan(rg, (size_t)nv);

    llmcl_tensor *tx = th_tensor_from(c->dt, 2, shape, x);
    llmcl_tensor *ty = labels_tensor(c->label_dt, y, n);
    llmcl_tensor *tw = w ? th_tensor_from(LLMCL_F32, 1, &v, w) : NULL;
    const int64_t ln = nl;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &ln), *tz = th_tensor(LLMCL_F32, 1, &ln);
    llmcl_tensor *tlse = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *tg = c->grad == 2 ? th_tensor(c->dt, 2, shape) : c->grad == 1 ? tx : NULL;
    llmcl_ce_options o = {.use_ignore_index = c->ignore != -100,
                          .ignore_index = c->ignore,
                          .reduction = (llmcl_ce_reduction)c->reduction,
                          .label_smoothing = c->eps,
                          .lse_square_scale = c->zs,
                          .softcap = c->cap,
                          .weight = tw,
                          .vocab_splits = c->splits};
    TH_OK(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, tz, tlse, tg));
    double *gl = th_download_new(tl), *gz = th_download_new(tz), *glse = th_download_new(tlse);
    TH_ASSERT_CLOSE("loss", rl, gl, (size_t)nl, loss_tol);
    TH_ASSERT_CLOSE("z_loss", rz, gz, (size_t)nl, loss_tol);
    TH_ASSERT_CLOSE("lse", rlse, glse, (size_t)n, loss_tol);
    if (tg) {
        double *gg = th_download_new(tg);
        /* f32 resolves lse only to |logits| x 2^-24: p carries that relative error */
        th_tol tol = th_grad_tol(c->dt, rg, (size_t)nv);
        tol.rtol += c->scale * 2.4e-7;
        tol.atol += c->scale * 2.4e-7 * th_max_abs(rg, (size_t)nv);
        TH_ASSERT_CLOSE("dlogits", rg, gg, (size_t)nv, tol);
        free(gg);
    }
    if (c->grad == 2) {
        double *x2 = th_download_new(tx); /* a separate gradient leaves the logits alone */
        TH_ASSERT_CLOSE("logits untouched", x, x2, (size_t)nv, (th_tol){0, 0});
        free(x2);
        llmcl_tensor_destroy(tg);
    }
    free(gl), free(gz), free(glse);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(ty), llmcl_tensor_destroy(tw);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tz), llmcl_tensor_destroy(tlse);
    free(rl), free(rz), free(rlse), free(rg);
}

/* Case c on random inputs from seed, with -inf placed by m (NULL: none). */
static void run_case(const ce_case *c, const ninf_spec *m, uint64_t seed)
{
    th_rng rng = th_rng_new(seed);
    const int64_t n = c->n, v = c->v;
    double *x = th_new_uniform(&rng, (size_t)(n * v), -c->scale, c->scale, c->dt);
    double *w = c->weighted ? th_new_uniform(&rng, (size_t)v, 0.25, 2.0, LLMCL_F32) : NULL;
    int64_t *y = make_labels(&rng, n, v, c->ignore_every, c->ignore);
    if (m)
        ninf_apply(m, x, n, v, y, n, c->ignore, w);
    check_case(c, x, y, w);
    free(x), free(w), free(y);
}

static void test_ce_options(void **state)
{
    (void)state;
    const ce_case cases[] = {
        /* dt, label, red, eps, zs, cap, weighted, grad, splits, n, v, scale, ignore_every, ignore
         */
        {LLMCL_F32, LLMCL_I64, 0, 0, 0, 0, false, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F32, LLMCL_I32, 1, 0, 0, 0, false, 2, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F32, LLMCL_I64, 2, 0, 0, 0, false, 1, 0, 13, 1003, 4, 4, 7},
        {LLMCL_F32, LLMCL_I64, 0, 0.1f, 0, 0, false, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F32, LLMCL_I64, 0, 0, 1e-3f, 0, false, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F32, LLMCL_I64, 1, 0, 0, 3.0f, false, 2, 0, 13, 1003, 8, 4, -100},
        {LLMCL_F32, LLMCL_I64, 0, 0, 0, 0, true, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F32, LLMCL_I32, 0, 0.2f, 1e-2f, 5.0f, true, 1, 0, 13, 1003, 6, 3, -1},
        {LLMCL_F32, LLMCL_I32, 2, 0.2f, 1e-2f, 5.0f, true, 2, 3, 13, 1003, 6, 3, -1},
        {LLMCL_F32, LLMCL_I64, 0, 0.05f, 1e-4f, 0, true, 1, 5, 7, 2051, 4, 3, -100},
        {LLMCL_BF16, LLMCL_I64, 0, 0, 0, 0, false, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_BF16, LLMCL_I64, 1, 0.1f, 1e-3f, 4.0f, true, 1, 3, 9, 1003, 4, 4, -100},
        {LLMCL_BF16, LLMCL_I64, 2, 0, 0, 0, false, 2, 0, 9, 517, 4, 4, -100},
        {LLMCL_F16, LLMCL_I64, 0, 0, 0, 0, false, 1, 0, 13, 1003, 4, 4, -100},
        {LLMCL_F16, LLMCL_I64, 1, 0.1f, 1e-3f, 0, true, 2, 2, 9, 1003, 4, 4, -100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("case %zu\n", i);
        run_case(&cases[i], NULL, 100 + i);
    }
}

static void test_ce_edges(void **state)
{
    (void)state;
    const ce_case cases[] = {
        /* all ignored: loss 0, gradients 0, never NaN */
        {LLMCL_F32, LLMCL_I64, 0, 0.1f, 1e-3f, 0, true, 1, 0, 5, 300, 4, 1, -100},
        {LLMCL_F32, LLMCL_I64, 0, 0, 0, 0, false, 1, 3, 5, 300, 4, 1, -100},
        /* logits of +-1e4 */
        {LLMCL_F32, LLMCL_I64, 0, 0.1f, 1e-4f, 0, false, 1, 0, 6, 257, 1e4, 0, -100},
        {LLMCL_BF16, LLMCL_I64, 1, 0, 0, 0, false, 1, 2, 6, 257, 1e4, 0, -100},
        /* N = 1 with a large vocabulary: the split path chosen automatically or forced */
        {LLMCL_F32, LLMCL_I64, 0, 0, 1e-3f, 0, false, 1, 0, 1, 50001, 4, 0, -100},
        {LLMCL_BF16, LLMCL_I64, 2, 0.1f, 0, 0, false, 2, 7, 1, 50001, 4, 0, -100},
        /* V = 1 (loss 0 up to smoothing, gradient 0 without z-loss) and tiny V */
        {LLMCL_F32, LLMCL_I64, 0, 0, 0, 0, false, 1, 0, 4, 1, 4, 0, -100},
        {LLMCL_F32, LLMCL_I64, 1, 0, 1e-2f, 0, false, 2, 0, 4, 1, 4, 0, -100},
        {LLMCL_BF16, LLMCL_I64, 0, 0.1f, 0, 0, false, 1, 0, 5, 3, 4, 0, -100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("edge %zu\n", i);
        run_case(&cases[i], NULL, 200 + i);
    }
}

/*
 * Issue 12's first example: N(0,1) logits of V = 257 with every fifth column from 1 at -inf, label
 * 0, reduction none. The row kernel met the tail (column 256, -inf) first: exp(-inf + inf).
 */
static void test_ce_ninf_issue(void **state)
{
    (void)state;
    const ce_case c = {LLMCL_F32, LLMCL_I64, 2, 0, 0, 0, false, 2, 0, 1, 257, 4, 0, -100};
    const ninf_spec m = {1, 257, 5, 0};
    th_rng rng = th_rng_new(12);
    double x[257], rl, rz, rlse, rg[257];
    int64_t y = 0;
    th_fill_normal(&rng, x, 257, 1.0);
    th_round_all(LLMCL_F32, x, 257);
    ninf_apply(&m, x, 1, 257, &y, 1, -100, NULL);
    assert_int_equal(y, 0);
    const ref_ce_opts ro = {-100, 2, 0, 0, 0, NULL};
    ref_cross_entropy(x, &y, 1, 257, &ro, &rl, &rz, &rlse, rg);
    printf("loss %.4f\n", rl);
    assert_true(isfinite(rl) && isfinite(rlse));
    check_case(&c, x, &y, NULL);
}

/* 0 inf is 0: a -inf target of weight 0 adds nothing, and a mean over a weight sum of 0 is 0 even
   with an infinite term (PyTorch gives NaN for both). */
static void test_ce_ninf_zero_weight(void **state)
{
    (void)state;
    const int64_t y[2] = {0, 1};
    double x[2 * 16], w[16];
    th_rng rng = th_rng_new(13);
    th_fill_uniform(&rng, x, 2 * 16, -3, 3);
    th_round_all(LLMCL_F32, x, 2 * 16);
    for (int j = 0; j < 16; ++j)
        w[j] = j < 2 ? 0.0 : 1.0;
    x[0] = x[16 + 5] = -INFINITY; /* row 0: its target; row 1: a class of weight 1 */
    for (int k = 0; k < 6; ++k) {
        const float eps = k < 3 ? 0.0f : 0.1f;
        const ce_case c = {LLMCL_F32, LLMCL_I64, k % 3, eps, 0, 0, true, 1, 0, 2, 16, 3, 0, -100};
        check_case(&c, x, y, w);
    }
}

/* -inf logits at the start, middle and end of rows, inside and across chunks, work-group passes
   (WG 64 x 8 columns on CPUs) and vocabulary splits; -inf targets, smoothing, rows all -inf. */
static void test_ce_ninf(void **state)
{
    (void)state;
    const struct {
        ce_case c;
        ninf_spec m;
    } cases[] = {
        /* the issue's second example: the first half of V = 2003 */
        {{LLMCL_F32, LLMCL_I64, 2, 0, 0, 0, false, 1, 0, 3, 2003, 4, 0, -100}, {0, 1002, 1, 0}},
        /* start: the first work-group pass; the first 8 of V = 9 */
        {{LLMCL_F32, LLMCL_I64, 0, 0, 1e-3f, 0, false, 2, 0, 5, 1003, 4, 4, -100}, {0, 512, 1, 0}},
        {{LLMCL_F32, LLMCL_I64, 1, 0, 0, 0, false, 1, 0, 4, 9, 4, 0, -100}, {0, 8, 1, 0}},
        /* middle: split 1 of 3 exactly on row 0 (chunks 42 to 83), then across split boundaries */
        {{LLMCL_F32, LLMCL_I32, 1, 0, 0, 0, true, 1, 3, 5, 1003, 4, 0, -100}, {336, 672, 1, 0}},
        {{LLMCL_BF16, LLMCL_I64, 0, 0, 1e-3f, 0, false, 1, 5, 5, 2051, 4, 4, -100},
         {300, 1500, 2, 0}},
        /* end: the last chunk and the scalar tail; tails alone (V < 8 and V = 8k + 1) */
        {{LLMCL_F16, LLMCL_I64, 2, 0, 0, 0, false, 2, 0, 5, 1003, 4, 0, -100}, {992, 1003, 1, 0}},
        {{LLMCL_F32, LLMCL_I64, 2, 0, 0, 0, false, 1, 0, 3, 7, 4, 0, -100}, {4, 7, 1, 0}},
        {{LLMCL_BF16, LLMCL_I64, 0, 0, 0, 0, false, 1, 0, 4, 17, 4, 0, -100}, {1, 17, 2, 0}},
        /* -inf targets: +inf loss, finite gradients */
        {{LLMCL_F32, LLMCL_I64, 0, 0, 1e-3f, 0, true, 1, 0, 6, 257, 4, 0, -100},
         {1, 257, 5, NINF_TARGET}},
        {{LLMCL_BF16, LLMCL_I64, 2, 0, 0, 0, false, 2, 2, 6, 1003, 4, 0, -100},
         {1, 1003, 5, NINF_TARGET}},
        /* smoothing: +inf loss where a -inf column has a nonzero weight, finite without one */
        {{LLMCL_F32, LLMCL_I64, 0, 0.1f, 0, 0, true, 1, 0, 6, 257, 4, 0, -100}, {1, 257, 5, 0}},
        {{LLMCL_F16, LLMCL_I64, 1, 0.1f, 1e-3f, 0, true, 1, 3, 6, 1003, 4, 0, -100},
         {0, 600, 3, NINF_ZERO_WEIGHT}},
        /* rows all -inf beside normal rows: lse -inf, loss +inf unless ignored, gradient 0 */
        {{LLMCL_F32, LLMCL_I64, 0, 0, 1e-3f, 0, false, 1, 0, 6, 257, 4, 0, -100},
         {1, 257, 5, NINF_ROW | NINF_ROW_IGNORED}},
        {{LLMCL_BF16, LLMCL_I64, 2, 0.1f, 1e-3f, 0, true, 2, 3, 6, 1003, 4, 0, -100},
         {0, 0, 0, NINF_ROW | NINF_ROW_IGNORED}},
        {{LLMCL_F16, LLMCL_I64, 0, 0, 1e-3f, 0, true, 1, 0, 6, 257, 4, 0, -100},
         {0, 100, 1, NINF_ROW_IGNORED}},
        {{LLMCL_F32, LLMCL_I64, 0, 0.1f, 0, 0, true, 1, 2, 6, 1003, 4, 0, -100},
         {0, 0, 0, NINF_ROW_IGNORED}},
        /* softcap: -inf becomes -cap, so every result is finite */
        {{LLMCL_F32, LLMCL_I64, 0, 0.1f, 1e-3f, 5.0f, true, 1, 0, 6, 1003, 6, 0, -100},
         {0, 512, 1, NINF_ROW | NINF_TARGET}},
        {{LLMCL_BF16, LLMCL_I64, 2, 0, 0, 4.0f, false, 2, 3, 6, 1003, 6, 0, -100},
         {1, 1003, 3, NINF_ROW}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("-inf case %zu\n", i);
        run_case(&cases[i].c, &cases[i].m, 250 + i);
    }
}

/* The GPU's row-kernel shapes on any device: unrolled loads, other work-group sizes, forced splits.
 */
static void test_ce_tunables(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *params[] = {"WG=128 UNROLL=2", "WG=32 UNROLL=4"};
    for (int i = 0; i < 2; ++i) {
        TH_OK(llmcl_tune_override(ctx, "ce_rows", LLMCL_BF16, "*", params[i]));
        TH_OK(
            llmcl_tune_override(ctx, "ce_split", LLMCL_BF16, "*", i == 1 ? "SPLIT=3" : "SPLIT=1"));
        const ce_case c = {LLMCL_BF16, LLMCL_I64, 0, 0.1f, 1e-3f, 4.0f, true,
                           1,          0,         7, 5003, 4,     3,    -100};
        run_case(&c, NULL, 500 + i);
        /* -inf over the first trip of WG=128 UNROLL=2 (2048 columns) and split 0 of SPLIT=3 */
        const ce_case cn = {LLMCL_BF16, LLMCL_I64, 0, 0, 1e-3f, 0, true, 1, 0, 7, 5003, 4, 3, -100};
        const ninf_spec m = {0, 2048, 1, NINF_ROW_IGNORED};
        run_case(&cn, &m, 510 + i);
    }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_BF16, NULL, NULL));
}

/* A view with a row stride that is not a multiple of 8 elements: every row has its own head. */
static void test_ce_strided_rows(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 6, v = 301, ld = 311, pshape[2] = {n, ld}, shape[2] = {n, v};
    const int64_t strides[2] = {ld, 1};
    th_rng rng = th_rng_new(7);
    double *px = th_new_uniform(&rng, (size_t)(n * ld), -3, 3, LLMCL_BF16);
    double *x = th_alloc((size_t)(n * v) * sizeof *x);
    for (int64_t i = 0; i < n; ++i)
        memcpy(x + i * v, px + i * ld + 3, (size_t)v * sizeof *x);
    int64_t *y = make_labels(&rng, n, v, 0, -100);
    double rl, rz, rlse[6], *rg = th_alloc((size_t)(n * v) * sizeof *rg);
    const ref_ce_opts ro = {-100, 1, 0, 0, 0, NULL};
    ref_cross_entropy(x, y, n, v, &ro, &rl, &rz, rlse, rg);
    llmcl_tensor *parent = th_tensor_from(LLMCL_BF16, 2, pshape, px), *view;
    TH_OK(llmcl_tensor_view(parent, 2, shape, strides, 3, &view));
    llmcl_tensor *ty = labels_tensor(LLMCL_I64, y, n);
    const int64_t one = 1;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one);
    llmcl_ce_options o = {.reduction = LLMCL_CE_SUM};
    TH_OK(llmcl_cross_entropy_forward(ctx, view, ty, &o, tl, NULL, NULL, view));
    double gl, *gg = th_alloc((size_t)(n * v) * sizeof *gg), *gp = th_download_new(parent);
    th_download(tl, &gl);
    th_download(view, gg);
    TH_ASSERT_CLOSE("loss", &rl, &gl, 1, loss_tol);
    TH_ASSERT_CLOSE("dlogits", rg, gg, (size_t)(n * v),
                    th_grad_tol(LLMCL_BF16, rg, (size_t)(n * v)));
    for (int64_t i = 0; i < n; ++i) /* the gaps between rows are untouched */
        for (int64_t j = 0; j < ld; ++j)
            if (j < 3 || j >= 3 + v)
                assert_true(gp[i * ld + j] == px[i * ld + j]);
    llmcl_tensor_destroy(view), llmcl_tensor_destroy(parent), llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(tl);
    free(px), free(x), free(y), free(rg), free(gg), free(gp);
}

/* Out-of-range labels: a clear error naming the row, and nothing written. */
static void test_ce_bad_labels(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 8, v = 100, shape[2] = {n, v}, one = 1;
    th_rng rng = th_rng_new(9);
    double *x = th_new_uniform(&rng, (size_t)(n * v), -2, 2, LLMCL_F32);
    llmcl_tensor *tx = th_tensor_from(LLMCL_F32, 2, shape, x), *tl = th_tensor(LLMCL_F32, 1, &one);
    /* V, negative (not ignore_index) and huge labels, as I32 and I64 */
    const int64_t bad_values[] = {100, -5, -1, 1000000, INT32_MIN};
    for (int b = 0; b < 10; ++b) {
        int64_t *y = make_labels(&rng, n, v, 0, -100);
        y[5] = bad_values[b / 2];
        y[6] = 100;
        llmcl_tensor *ty = labels_tensor(b % 2 ? LLMCL_I32 : LLMCL_I64, y, n);
        TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, tl, NULL, NULL, tx),
                 LLMCL_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(llmcl_last_error(ctx), "labels[5]"));
        double *x2 = th_download_new(tx), l;
        th_download(tl, &l);
        assert_true(isnan(l)); /* still poisoned */
        TH_ASSERT_CLOSE("in-place logits intact", x, x2, (size_t)(n * v), (th_tol){0, 0});
        free(x2);
        llmcl_tensor_destroy(ty);
        free(y);
    }
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tl);
    free(x);
}

/*
 * The first bad row where one work-item of ce_prepare meets several: bad labels at rows 5 + k WG
 * for every power-of-two WG up to 1024, so that some work-item sees row 5 and later ones.
 */
static void test_ce_first_bad_label(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 1100, v = 10, shape[2] = {n, v}, one = 1;
    th_rng rng = th_rng_new(19);
    double *x = th_new_uniform(&rng, (size_t)(n * v), -2, 2, LLMCL_F32);
    llmcl_tensor *tx = th_tensor_from(LLMCL_F32, 2, shape, x), *tl = th_tensor(LLMCL_F32, 1, &one);
    int64_t *y = make_labels(&rng, n, v, 0, -100);
    for (int64_t k = 0; 5 + k < n; k = k ? 2 * k : 32) /* 0, 32, 64, ..., 1024 */
        y[5 + k] = v;
    llmcl_tensor *ty = labels_tensor(LLMCL_I64, y, n);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    if (!strstr(llmcl_last_error(ctx), "labels[5]"))
        fail_msg("expected the first bad row, labels[5]: %s", llmcl_last_error(ctx));
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tl), llmcl_tensor_destroy(ty);
    free(x), free(y);
}

static void test_ce_bad_args(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t shape[2] = {4, 10}, n = 4, one = 1, two = 2, eleven = 11;
    llmcl_tensor *tx = th_tensor(LLMCL_F32, 2, shape), *tb = th_tensor(LLMCL_BF16, 2, shape);
    llmcl_tensor *ty = th_tensor(LLMCL_I64, 1, &n), *tyf = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tl2 = th_tensor(LLMCL_F32, 1, &two);
    llmcl_tensor *tw = th_tensor(LLMCL_F32, 1, &eleven), *tyshort = th_tensor(LLMCL_I64, 1, &two);
    TH_OK(llmcl_fill(ctx, ty, 1));
    TH_FAILS(llmcl_cross_entropy_forward(NULL, tx, ty, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, NULL, ty, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, NULL, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, NULL, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    const llmcl_ce_options half = {.logits_dtype = LLMCL_BF16}; /* the linear form's option */
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tb, ty, &half, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, ty, ty, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, tyf, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, tyshort, NULL, tl, NULL, NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, tl2, NULL, NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, tl, NULL, NULL, tb),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, NULL, tl, tl, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_ce_options o = {.weight = tw};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    o = (llmcl_ce_options){.label_smoothing = 1.5f};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    o = (llmcl_ce_options){.softcap = -1.0f};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    o = (llmcl_ce_options){.reduction = (llmcl_ce_reduction)7};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    o = (llmcl_ce_options){.lse_square_scale = NAN};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    o = (llmcl_ce_options){.vocab_chunk = -2};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    /* a dlogits view that overlaps the logits without being them */
    llmcl_tensor *shifted;
    const int64_t vshape[2] = {3, 10};
    TH_OK(llmcl_tensor_view(tx, 2, vshape, NULL, 10, &shifted));
    llmcl_tensor *tx3;
    TH_OK(llmcl_tensor_view(tx, 2, vshape, NULL, 0, &tx3));
    llmcl_tensor *ty3 = th_tensor(LLMCL_I64, 1, (const int64_t[]){3});
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx3, ty3, NULL, tl, NULL, NULL, shifted),
             LLMCL_ERROR_INVALID_ARGUMENT);
    /* class weights inside dlogits or lse, which later rows would read after their writes */
    llmcl_tensor *dl = th_tensor(LLMCL_F32, 2, shape), *row0, *lse_in_row0;
    TH_OK(llmcl_tensor_view(dl, 1, (const int64_t[]){10}, NULL, 0, &row0));
    TH_OK(llmcl_tensor_view(dl, 1, &n, NULL, 2, &lse_in_row0));
    o = (llmcl_ce_options){.weight = row0};
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, NULL, dl),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "dlogits overlaps opts->weight"));
    TH_FAILS(llmcl_cross_entropy_forward(ctx, tx, ty, &o, tl, NULL, lse_in_row0, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "opts->weight"));
    llmcl_tensor_destroy(row0), llmcl_tensor_destroy(lse_in_row0), llmcl_tensor_destroy(dl);
    /* grad_scale */
    TH_FAILS(llmcl_cross_entropy_grad_scale(ctx, tl2, tx), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_cross_entropy_grad_scale(ctx, tl, ty), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    llmcl_tensor_destroy(shifted), llmcl_tensor_destroy(tx3), llmcl_tensor_destroy(ty3);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tb), llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(tyf), llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tl2);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(tyshort);
}

static void test_ce_grad_scale(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 1000, one = 1;
    th_rng rng = th_rng_new(3);
    double *x = th_new_uniform(&rng, (size_t)n, -1, 1, LLMCL_BF16), g = -2.5;
    llmcl_tensor *tx = th_tensor_from(LLMCL_BF16, 1, &n, x),
                 *tg = th_tensor_from(LLMCL_F32, 1, &one, &g);
    TH_OK(llmcl_cross_entropy_grad_scale(ctx, tg, tx));
    double *got = th_download_new(tx);
    for (int64_t i = 0; i < n; ++i)
        x[i] = th_round(LLMCL_BF16, x[i] * g);
    TH_ASSERT_CLOSE("scaled", x, got, (size_t)n, (th_tol){0, 0});
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tg);
    free(x), free(got);
}

/* ---- linear forms ---- */

typedef struct lin_problem {
    int64_t n, h, v;
    llmcl_dtype dt;
    double *hid, *w, *b, *cw; /* b and cw may be NULL */
    int64_t *y;
    llmcl_tensor *th, *tw, *tb, *tcw, *ty;
    llmcl_dtype ldt; /* the logits' storage (opts->logits_dtype); F32 unless a test sets it */
} lin_problem;

static lin_problem lin_make(uint64_t seed, int64_t n, int64_t h, int64_t v, llmcl_dtype dt,
                            bool bias, bool cweights, int ignore_every)
{
    lin_problem p = {.n = n, .h = h, .v = v, .dt = dt, .ldt = LLMCL_F32};
    th_rng rng = th_rng_new(seed);
    p.hid = th_new_uniform(&rng, (size_t)(n * h), -1, 1, dt);
    p.w = th_new_uniform(&rng, (size_t)(v * h), -0.5, 0.5, dt);
    p.b = bias ? th_new_uniform(&rng, (size_t)v, -1, 1, dt) : NULL;
    p.cw = cweights ? th_new_uniform(&rng, (size_t)v, 0.5, 1.5, LLMCL_F32) : NULL;
    p.y = make_labels(&rng, n, v, ignore_every, -100);
    const int64_t hs[2] = {n, h}, ws[2] = {v, h};
    p.th = th_tensor_from(dt, 2, hs, p.hid);
    p.tw = th_tensor_from(dt, 2, ws, p.w);
    p.tb = bias ? th_tensor_from(dt, 1, &v, p.b) : NULL;
    p.tcw = cweights ? th_tensor_from(LLMCL_F32, 1, &v, p.cw) : NULL;
    p.ty = labels_tensor(LLMCL_I64, p.y, n);
    return p;
}

static void lin_free(lin_problem *p)
{
    free(p->hid), free(p->w), free(p->b), free(p->cw), free(p->y);
    llmcl_tensor_destroy(p->th), llmcl_tensor_destroy(p->tw), llmcl_tensor_destroy(p->tb);
    llmcl_tensor_destroy(p->tcw), llmcl_tensor_destroy(p->ty);
}

/* The reference: loss (1 or n values) and, scaled by gscale (per row for none), the gradients. */
typedef struct lin_ref {
    double *loss, *z, *lse, *dh, *dw, *db;
} lin_ref;

static lin_ref lin_reference(const lin_problem *p, const ref_ce_opts *o, const double *gscale)
{
    const int64_t n = p->n, h = p->h, v = p->v;
    lin_ref r;
    double *logits = th_alloc((size_t)(n * v) * sizeof *logits);
    double *g = th_alloc((size_t)(n * v) * sizeof *g);
    r.loss = th_alloc((size_t)n * sizeof *r.loss);
    r.z = th_alloc((size_t)n * sizeof *r.z);
    r.lse = th_alloc((size_t)n * sizeof *r.lse);
    r.dh = th_alloc((size_t)(n * h) * sizeof *r.dh);
    r.dw = th_alloc((size_t)(v * h) * sizeof *r.dw);
    r.db = th_alloc((size_t)v * sizeof *r.db);
    ref_linear(p->hid, p->w, p->b, n, h, v, logits);
    if (p->ldt != LLMCL_F32)
        th_round_all(p->ldt, logits, (size_t)(n * v));
    assert_int_equal(ref_cross_entropy(logits, p->y, n, v, o, r.loss, r.z, r.lse, g), -1);
    if (gscale)
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < v; ++j)
                g[i * v + j] *= gscale[o->reduction == 2 ? i : 0];
    ref_linear_backward(g, p->hid, p->w, n, h, v, r.dh, r.dw, r.db);
    free(logits), free(g);
    return r;
}

static void lin_ref_free(lin_ref *r)
{
    free(r->loss), free(r->z), free(r->lse), free(r->dh), free(r->dw), free(r->db);
}

/*
 * GEMM results in f32 over H or N terms: slack relative to the largest entry. Gradient products
 * that saw dlogits rounded to a 16-bit gdt (path 2, as Liger's) get twice that rounding on top.
 */
static th_tol mat_tol(const double *ref, size_t n, llmcl_dtype gdt)
{
    const double u = gdt == LLMCL_BF16 ? 1.0 / 256 : gdt == LLMCL_F16 ? 1.0 / 2048 : 0.0;
    return (th_tol){(1e-4 + 2 * u) * th_max_abs(ref, n) + 1e-7, 1e-3 + 2 * u};
}

typedef struct lin_grads {
    llmcl_tensor *dh, *dw, *db;
} lin_grads;

static lin_grads lin_grads_new(const lin_problem *p, bool bias)
{
    const int64_t hs[2] = {p->n, p->h}, ws[2] = {p->v, p->h};
    return (lin_grads){th_tensor(LLMCL_F32, 2, hs), th_tensor(LLMCL_F32, 2, ws),
                       bias ? th_tensor(LLMCL_F32, 1, &p->v) : NULL};
}

/* gdt: the dtype of the dlogits the gradient products saw. */
static void lin_check(const lin_problem *p, const lin_ref *r, const lin_grads *g, llmcl_dtype gdt)
{
    double *dh = th_download_new(g->dh), *dw = th_download_new(g->dw);
    TH_ASSERT_CLOSE("dhidden", r->dh, dh, (size_t)(p->n * p->h),
                    mat_tol(r->dh, (size_t)(p->n * p->h), gdt));
    TH_ASSERT_CLOSE("dweight", r->dw, dw, (size_t)(p->v * p->h),
                    mat_tol(r->dw, (size_t)(p->v * p->h), gdt));
    if (g->db) {
        double *db = th_download_new(g->db);
        TH_ASSERT_CLOSE("dbias", r->db, db, (size_t)p->v, mat_tol(r->db, (size_t)p->v, p->ldt));
        free(db);
    }
    free(dh), free(dw);
}

static void lin_grads_free(lin_grads *g)
{
    llmcl_tensor_destroy(g->dh), llmcl_tensor_destroy(g->dw), llmcl_tensor_destroy(g->db);
}

typedef struct lin_case {
    llmcl_dtype dt;
    int reduction;
    float eps, zs, cap;
    bool bias, cweights;
    int64_t n, h, v;
    int64_t chunk_rows;
    uint64_t chunk_bytes;
    int splits;
} lin_case;

static const lin_case lin_cases[] = {
    /* dt, red, eps, zs, cap, bias, cweights, n, h, v, chunk_rows, chunk_bytes, splits */
    {LLMCL_F32, 0, 0, 0, 0, false, false, 37, 40, 301, 0, 0, 0},
    {LLMCL_F32, 1, 0.1f, 1e-3f, 0, true, false, 37, 40, 301, 8, 0, 3},
    {LLMCL_F32, 2, 0, 0, 4.0f, true, true, 29, 33, 130, 7, 0, 0},
    {LLMCL_BF16, 0, 0.1f, 1e-3f, 3.0f, true, true, 37, 40, 301, 0, 16384, 2},
    {LLMCL_BF16, 1, 0, 0, 0, false, false, 1, 24, 77, 0, 0, 0},
    {LLMCL_BF16, 0, 0, 1e-2f, 0, true, false, 20, 17, 65, 6, 0, 5},
    {LLMCL_F32, 0, 0, 0, 0, false, false, 9, 16, 1, 0, 0, 0},
};

static llmcl_ce_options lin_opts(const lin_case *c, const lin_problem *p)
{
    return (llmcl_ce_options){.reduction = (llmcl_ce_reduction)c->reduction,
                              .label_smoothing = c->eps,
                              .lse_square_scale = c->zs,
                              .softcap = c->cap,
                              .weight = p->tcw,
                              .vocab_splits = c->splits,
                              .chunk_rows = c->chunk_rows,
                              .chunk_bytes = c->chunk_bytes};
}

/* A problem of case c from seed with -inf placed in its bias by m (NULL: none). */
static lin_problem lin_make_case(const lin_case *c, const ninf_spec *m, uint64_t seed)
{
    lin_problem p = lin_make(seed, c->n, c->h, c->v, c->dt, c->bias, c->cweights, 5);
    if (m) {
        ninf_apply(m, p.b, 1, p.v, p.y, p.n, -100, p.cw);
        th_upload(p.tb, p.b);
        if (p.tcw)
            th_upload(p.tcw, p.cw);
        llmcl_tensor_destroy(p.ty);
        p.ty = labels_tensor(LLMCL_I64, p.y, p.n);
    }
    return p;
}

static void lin_ref_no_nan(const lin_problem *p, const lin_ref *r, int64_t nl)
{
    assert_no_nan(r->loss, (size_t)nl), assert_no_nan(r->z, (size_t)nl);
    assert_no_nan(r->lse, (size_t)p->n), assert_no_nan(r->dh, (size_t)(p->n * p->h));
    assert_no_nan(r->dw, (size_t)(p->v * p->h)), assert_no_nan(r->db, (size_t)p->v);
}

/*
 * Inputs of multiples of 1/16, exact in 16 bits, so that each logit (at most 40 products of
 * multiples of 2^-8, below 2^5) is exact in f32 and its rounding to 16 bits is the reference's;
 * most need 13 bits, so f32 logits would miss the reference by the rounding's size.
 */
static void lin_quantize(lin_problem *p)
{
    double *qs[] = {p->hid, p->w, p->b};
    const size_t ns[] = {(size_t)(p->n * p->h), (size_t)(p->v * p->h), (size_t)p->v};
    llmcl_tensor *ts[] = {p->th, p->tw, p->tb};
    th_upload_sixteenths(3, qs, ns, ts);
}

/* Path 2 on case c with its logits stored as ldt (opts->logits_dtype): 16-bit on quantized inputs
   (lin_quantize), against the reference on the rounded logits. */
static void run_linear(const lin_case *c, const ninf_spec *m, uint64_t seed, llmcl_dtype ldt)
{
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make_case(c, m, seed);
    if (ldt != LLMCL_F32)
        lin_quantize(&p);
    p.ldt = ldt;
    const ref_ce_opts ro = {-100, c->reduction, c->eps, c->zs, c->cap, p.cw};
    lin_ref r = lin_reference(&p, &ro, NULL);
    const int64_t nl = c->reduction == 2 ? c->n : 1;
    lin_ref_no_nan(&p, &r, nl);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &nl), *tz = th_tensor(LLMCL_F32, 1, &nl);
    lin_grads g = lin_grads_new(&p, c->bias);
    llmcl_ce_options o = lin_opts(c, &p);
    o.logits_dtype = ldt;
    TH_OK(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, tz, g.dh, g.dw,
                                             g.db));
    double *gl = th_download_new(tl), *gz = th_download_new(tz);
    TH_ASSERT_CLOSE("loss", r.loss, gl, (size_t)nl, loss_tol);
    TH_ASSERT_CLOSE("z_loss", r.z, gz, (size_t)nl, loss_tol);
    lin_check(&p, &r, &g, p.dt);
    /* loss only */
    TH_OK(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL, NULL, NULL,
                                             NULL));
    th_download(tl, gl);
    TH_ASSERT_CLOSE("loss only", r.loss, gl, (size_t)nl, loss_tol);
    free(gl), free(gz);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tz);
    lin_grads_free(&g);
    lin_ref_free(&r);
    lin_free(&p);
}

/* Path 2 with 16-bit logits (opts->logits_dtype) on both 16-bit dtypes. */
static void test_linear_logits16(void **state)
{
    (void)state;
    static const lin_case cases[] = {
        /* dt, red, eps, zs, cap, bias, cweights, n, h, v, chunk_rows, chunk_bytes, splits */
        {LLMCL_BF16, 2, 0, 0, 0, false, false, 37, 40, 301, 0, 0, 0},
        {LLMCL_BF16, 0, 0.1f, 1e-3f, 3.0f, true, true, 37, 40, 301, 8, 0, 2},
        {LLMCL_F16, 1, 0, 1e-2f, 0, true, false, 20, 17, 65, 6, 0, 5},
        {LLMCL_F16, 2, 0, 0, 0, false, false, 29, 33, 130, 0, 2 * 130 * 7, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_linear(&cases[i], NULL, 300 + i, cases[i].dt);
}

/* The chunked fused form's width in tests: odd, so chunk edges cross the 8-class vector groups
   and the last chunk is partial. */
#define FUSED_CHUNK 37

/* Path 3 on case c, with an upstream gradient from seed + 100, in tiles (vocab_chunk -1) or in
   chunks of vocab_chunk classes (0: chunks where the device has tensor cores). With a bias the
   backward runs again without dbias: on tensor cores its products' epilogue then writes the
   dlogits (with dbias they stay in f32 for the column sums). */
static void run_fused(const lin_case *c, const ninf_spec *m, uint64_t seed, int64_t vocab_chunk)
{
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make_case(c, m, seed);
    const int64_t nl = c->reduction == 2 ? c->n : 1;
    double *gs = th_alloc((size_t)nl * sizeof *gs);
    th_rng rng = th_rng_new(seed + 100);
    th_fill_uniform(&rng, gs, (size_t)nl, 0.5, 2.0);
    const ref_ce_opts ro = {-100, c->reduction, c->eps, c->zs, c->cap, p.cw};
    lin_ref r = lin_reference(&p, &ro, gs);
    lin_ref_no_nan(&p, &r, nl);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &nl), *tz = th_tensor(LLMCL_F32, 1, &nl);
    llmcl_tensor *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    llmcl_tensor *tgs = th_tensor_from(LLMCL_F32, 1, &nl, gs);
    lin_grads g = lin_grads_new(&p, c->bias);
    llmcl_ce_options o = lin_opts(c, &p);
    o.vocab_chunk = vocab_chunk;
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, tz, tlse));
    double *gl = th_download_new(tl), *gz = th_download_new(tz), *glse = th_download_new(tlse);
    TH_ASSERT_CLOSE("loss", r.loss, gl, (size_t)nl, loss_tol);
    TH_ASSERT_CLOSE("z_loss", r.z, gz, (size_t)nl, loss_tol);
    TH_ASSERT_CLOSE("lse", r.lse, glse, (size_t)p.n, loss_tol);
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, tgs, &o, g.dh,
                                             g.dw, g.db));
    const bool chunks =
        vocab_chunk > 0 || (vocab_chunk == 0 && llmcl_ctx_device_info(ctx)->has_mma);
    lin_check(&p, &r, &g, chunks ? p.dt : LLMCL_F32);
    if (c->bias) {
        lin_grads nb = lin_grads_new(&p, false);
        th_poison(nb.dh), th_poison(nb.dw);
        TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, tgs, &o, nb.dh,
                                                 nb.dw, NULL));
        lin_check(&p, &r, &nb, chunks ? p.dt : LLMCL_F32);
        lin_grads_free(&nb);
    }
    /* deterministic: a second backward is bit-identical */
    double *dh1 = th_download_new(g.dh), *dw1 = th_download_new(g.dw);
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, tgs, &o, g.dh,
                                             g.dw, g.db));
    double *dh2 = th_download_new(g.dh), *dw2 = th_download_new(g.dw);
    assert_memory_equal(dh1, dh2, (size_t)(p.n * p.h) * sizeof *dh1);
    assert_memory_equal(dw1, dw2, (size_t)(p.v * p.h) * sizeof *dw1);
    free(dh1), free(dw1), free(dh2), free(dw2);
    free(gl), free(gz), free(glse), free(gs);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tz), llmcl_tensor_destroy(tlse);
    llmcl_tensor_destroy(tgs);
    lin_grads_free(&g);
    lin_ref_free(&r);
    lin_free(&p);
}

static void test_linear_ce(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof lin_cases / sizeof lin_cases[0]; ++i) {
        printf("linear case %zu\n", i);
        run_linear(&lin_cases[i], NULL, 300 + i, LLMCL_F32);
    }
}

static void test_fused_ce(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof lin_cases / sizeof lin_cases[0]; ++i) {
        printf("fused case %zu, tiles and chunks\n", i);
        run_fused(&lin_cases[i], NULL, 300 + i, -1);
        run_fused(&lin_cases[i], NULL, 300 + i, FUSED_CHUNK);
    }
}

/* Path 1 with opts->grad_scale gs: dlogits of the linear problem p's logits, against the
   reference's times gs; the loss unscaled. */
static void check_grad_scale_logits(const lin_problem *p, const ref_ce_opts *ro, float gs)
{
    llmcl_ctx *ctx = th_ctx();
    const int64_t nv = p->n * p->v, shape[2] = {p->n, p->v}, one = 1;
    double *x = th_alloc((size_t)nv * sizeof *x), *g = th_alloc((size_t)nv * sizeof *g);
    double loss, *rows = th_alloc((size_t)p->n * 3 * sizeof *rows);
    ref_linear(p->hid, p->w, p->b, p->n, p->h, p->v, x);
    th_round_all(p->dt, x, (size_t)nv);
    assert_int_equal(ref_cross_entropy(x, p->y, p->n, p->v, ro, rows, rows + p->n,
                                       rows + 2 * p->n, g),
                     -1);
    loss = rows[0];
    for (int64_t i = 0; i < nv; ++i)
        g[i] *= gs;
    llmcl_tensor *tx = th_tensor_from(p->dt, 2, shape, x), *tg = th_tensor(p->dt, 2, shape);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one);
    th_poison(tg);
    const llmcl_ce_options o = {.reduction = (llmcl_ce_reduction)ro->reduction,
                                .label_smoothing = (float)ro->eps,
                                .lse_square_scale = (float)ro->zs,
                                .softcap = (float)ro->cap,
                                .weight = p->tcw,
                                .grad_scale = gs};
    TH_OK(llmcl_cross_entropy_forward(ctx, tx, p->ty, &o, tl, NULL, NULL, tg));
    double *gl = th_download_new(tl), *gg = th_download_new(tg);
    TH_ASSERT_CLOSE("loss (unscaled)", &loss, gl, 1, loss_tol);
    TH_ASSERT_CLOSE("dlogits x grad_scale", g, gg, (size_t)nv, th_grad_tol(p->dt, g, (size_t)nv));
    free(x), free(g), free(rows), free(gl), free(gg);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tg), llmcl_tensor_destroy(tl);
}

/*
 * opts->grad_scale on the three forms: the gradients are those of grad_scale x the loss (a
 * training loop's weight for a micro-batch), the loss is not scaled; a non-finite scale is refused.
 */
static void test_opts_grad_scale(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const float gs = -1.75f;
    const int64_t one = 1;
    const size_t picks[] = {0, 1, 3}; /* f32 mean; f32 sum, bias, smoothing; bf16 mean, weights */
    for (size_t k = 0; k < sizeof picks / sizeof picks[0]; ++k) {
        const lin_case *c = &lin_cases[picks[k]];
        printf("grad_scale case %zu\n", picks[k]);
        lin_problem p = lin_make_case(c, NULL, 900 + k);
        const ref_ce_opts ro = {-100, c->reduction, c->eps, c->zs, c->cap, p.cw};
        const double gsd = gs;
        lin_ref r = lin_reference(&p, &ro, &gsd);
        llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
        llmcl_ce_options o = lin_opts(c, &p);
        o.grad_scale = gs;
        lin_grads g = lin_grads_new(&p, c->bias);
        TH_OK(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL, g.dh,
                                                 g.dw, g.db));
        double *gl = th_download_new(tl);
        TH_ASSERT_CLOSE("linear loss (unscaled)", r.loss, gl, 1, loss_tol);
        lin_check(&p, &r, &g, p.dt);
        for (int64_t chunk = -1; chunk <= FUSED_CHUNK; chunk += FUSED_CHUNK + 1) {
            th_poison(g.dh), th_poison(g.dw);
            o.vocab_chunk = chunk;
            TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL,
                                                    tlse));
            TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &o,
                                                     g.dh, g.dw, g.db));
            lin_check(&p, &r, &g, chunk > 0 ? p.dt : LLMCL_F32);
        }
        check_grad_scale_logits(&p, &ro, gs);
        free(gl);
        llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
        lin_grads_free(&g);
        lin_ref_free(&r);
        lin_free(&p);
    }
    lin_problem p = lin_make_case(&lin_cases[0], NULL, 910);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one);
    llmcl_ce_options o = lin_opts(&lin_cases[0], &p);
    o.grad_scale = NAN;
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL, NULL,
                                                NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "grad_scale"));
    llmcl_tensor_destroy(tl);
    lin_free(&p);
}

/*
 * -inf bias entries on paths 2 and 3 (the only way a logit of theirs is -inf): the issue's example,
 * the fused path's T = 32 tiles covered whole, straddled and the last partial one, -inf targets,
 * smoothing, softcap, and every class -inf.
 */
static void test_linear_ninf(void **state)
{
    (void)state;
    const struct {
        lin_case c;
        ninf_spec m;
    } cases[] = {
        /* dt, red, eps, zs, cap, bias, cweights, n, h, v, chunk_rows, chunk_bytes, splits */
        /* the issue's example: the first 300 of 1000 classes, with the z-loss */
        {{LLMCL_F32, 0, 0, 1e-3f, 0, true, false, 9, 40, 1000, 0, 0, 0}, {0, 300, 1, 0}},
        /* tile 2 exactly, tiles 2 and 3 straddled, the last partial tile */
        {{LLMCL_F32, 1, 0, 0, 0, true, false, 37, 40, 301, 8, 0, 3}, {64, 96, 1, 0}},
        {{LLMCL_BF16, 0, 0, 1e-3f, 0, true, true, 37, 40, 301, 0, 0, 2}, {80, 120, 1, 0}},
        {{LLMCL_F16, 2, 0, 0, 0, true, false, 29, 33, 301, 7, 0, 0}, {288, 301, 1, 0}},
        /* a -inf target: +inf loss, finite gradients */
        {{LLMCL_F32, 0, 0, 1e-3f, 0, true, true, 20, 17, 130, 0, 0, 0}, {1, 130, 2, NINF_TARGET}},
        /* smoothing: +inf loss, finite where the -inf classes weigh 0 */
        {{LLMCL_F32, 0, 0.1f, 0, 0, true, false, 20, 17, 130, 0, 0, 0}, {3, 100, 7, 0}},
        {{LLMCL_BF16, 2, 0.1f, 1e-3f, 0, true, true, 20, 17, 130, 6, 0, 0},
         {3, 100, 7, NINF_ZERO_WEIGHT}},
        /* softcap: -inf becomes -cap, the -inf target too */
        {{LLMCL_F32, 0, 0.1f, 1e-3f, 4.0f, true, true, 20, 17, 130, 0, 0, 0},
         {0, 130, 3, NINF_TARGET}},
        /* every class -inf: lse -inf, loss +inf, zero gradients */
        {{LLMCL_F32, 0, 0, 1e-3f, 0, true, false, 9, 16, 70, 0, 0, 0}, {0, 70, 1, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("-inf linear case %zu\n", i);
        run_linear(&cases[i].c, &cases[i].m, 700 + i, LLMCL_F32);
        printf("-inf fused case %zu, tiles and chunks\n", i);
        run_fused(&cases[i].c, &cases[i].m, 700 + i, -1);
        run_fused(&cases[i].c, &cases[i].m, 700 + i, FUSED_CHUNK);
    }
}

/* The GPU's default tiles on any device (64 x 64 with 4 x 4 per work-item; 32 x 32 with 2 x 2 for
   dhidden when row tiles are few). */
static void test_fused_gpu_tiles(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_override(ctx, "cce_fwd", LLMCL_F32, "*", "T=64 BK=16 TM=4 TN=4"));
    TH_OK(llmcl_tune_override(ctx, "cce_bwd_dw", LLMCL_F32, "*", "T=64 BK=16 TM=4 TN=4"));
    TH_OK(llmcl_tune_override(ctx, "cce_bwd_dh", LLMCL_F32, "*", "T=32 BK=16 TM=2 TN=2"));
    const lin_case *c = &lin_cases[2]; /* none, softcap, bias, class weights */
    lin_problem p = lin_make(600, 70, c->h, 200, LLMCL_F32, c->bias, c->cweights, 5);
    const ref_ce_opts ro = {-100, c->reduction, c->eps, c->zs, c->cap, p.cw};
    lin_ref r = lin_reference(&p, &ro, NULL);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &p.n), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    lin_grads g = lin_grads_new(&p, c->bias);
    llmcl_ce_options o = lin_opts(c, &p);
    o.vocab_chunk = -1; /* the tile kernels, whatever the device */
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL, tlse));
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &o, g.dh,
                                             g.dw, g.db));
    double *gl = th_download_new(tl);
    TH_ASSERT_CLOSE("loss", r.loss, gl, (size_t)p.n, loss_tol);
    lin_check(&p, &r, &g, LLMCL_F32);
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    free(gl);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
    lin_grads_free(&g);
    lin_ref_free(&r);
    lin_free(&p);
}

/* Gradient filtering: off is exact (above); on, small skipped probabilities change little. */
static void test_fused_filter(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make(77, 40, 32, 500, LLMCL_F32, false, false, 0);
    for (int64_t i = 0; i < p.n * p.h; ++i) /* peaked softmax: most tiles fall below the filter */
        p.hid[i] *= 8.0;
    th_upload(p.th, p.hid);
    const ref_ce_opts ro = {-100, 0, 0, 0, 0, NULL};
    lin_ref r = lin_reference(&p, &ro, NULL);
    const int64_t one = 1;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    lin_grads g = lin_grads_new(&p, false);
    llmcl_ce_options o = {.grad_filter = 1e-6f, .vocab_chunk = -1}; /* filtering skips tiles */
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, NULL, p.ty, &o, tl, NULL, tlse));
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, NULL, p.ty, tlse, NULL, &o, g.dh,
                                             g.dw, NULL));
    double *dh = th_download_new(g.dh);
    const th_tol tol = {1e-5 * th_max_abs(r.dh, (size_t)(p.n * p.h)) * 40, 1e-3};
    TH_ASSERT_CLOSE("filtered dhidden", r.dh, dh, (size_t)(p.n * p.h), tol);
    free(dh);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
    lin_grads_free(&g);
    lin_ref_free(&r);
    lin_free(&p);
}

/*
 * Path 3 in chunks at a size where the tensor-core logits products take their large tiles (256 x
 * 128, at least two waves of them on an H100): the default chunks, with every option; and at 576
 * x 6750 without a bias, where the forward's product takes wgmma's 256 x 192 tiles on an H100 with
 * TMA (one wave of them against two of 128 x 256). Where the device has no tensor cores the chunks
 * run on the portable products, which the cases above test.
 */
static void test_fused_large_tiles(void **state)
{
    (void)state;
    if (!llmcl_ctx_device_info(th_ctx())->has_mma) {
        printf("skipped: no tensor cores on this device\n");
        return;
    }
    const lin_case c = {LLMCL_BF16, 0, 0.1f, 1e-3f, 5.0f, true, true, 1100, 72, 7000, 0, 0, 0};
    run_fused(&c, NULL, 811, 0);
    const lin_case plain = {LLMCL_BF16, 1, 0, 0, 0, false, false, 1100, 72, 7000, 0, 0, 0};
    run_fused(&plain, NULL, 812, 0);
    const lin_case wide = {LLMCL_BF16, 0, 0.1f, 1e-3f, 5.0f, false, true, 576, 72, 6750, 0, 0, 0};
    run_fused(&wide, NULL, 813, 0);
}

/*
 * Vocabulary-sized V (issue 35): rusticl's llvmpipe cut the tiles' backward short from V = 8191 on
 * (cce_bwd_dh walks every vocabulary tile in one loop), and the linear form's dhidden product sums
 * over V. Tall and skinny: a few rows, a small H, V = 32003 in tiles, in chunks and through the
 * linear form. Then a hidden size whose tile sums alone pass llvmpipe's loop limit: the default
 * runs in chunks there, and tiles asked for are refused.
 */
static void test_long_vocab(void **state)
{
    (void)state;
    const lin_case c = {LLMCL_F32, 0, 0.1f, 0, 0, true, false, 5, 16, 32003, 0, 0, 0};
    run_fused(&c, NULL, 850, -1);
    const lin_case b = {LLMCL_BF16, 1, 0, 1e-3f, 0, true, true, 5, 16, 32003, 0, 0, 0};
    run_fused(&b, NULL, 851, 4099);
    run_linear(&c, NULL, 852, LLMCL_F32);
    const lin_case wide = {LLMCL_F32, 0, 0, 0, 0, false, false, 3, 2500, 40, 0, 0, 0};
    run_fused(&wide, NULL, 853, 0);
    llmcl_ctx *ctx = th_ctx();
    if (!llmcl_ctx_device_info(ctx)->loop_limit)
        return;
    lin_problem p = lin_make(854, wide.n, wide.h, wide.v, LLMCL_F32, false, false, 0);
    const int64_t one = 1;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    const llmcl_ce_options o = {.vocab_chunk = -1};
    TH_FAILS(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, NULL, p.ty, &o, tl, NULL, tlse),
             LLMCL_ERROR_UNSUPPORTED);
    assert_non_null(strstr(llmcl_last_error(ctx), "2500 columns"));
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
    lin_free(&p);
}

/*
 * Loop limits on any device: 20000 runs the tiles' backward in ranges of about 12 tiles (dhidden
 * over 63 vocabulary tiles, dweight over 13 row tiles); 1000, below one tile's sums, runs the
 * default in chunks, whose products split K and whose dbias sums 2000 rows in blocks.
 */
static void test_low_loop_limit(void **state)
{
    (void)state;
    th_loop_limit("20000");
    const lin_case c = {LLMCL_F32, 0, 0.1f, 0, 2.0f, true, true, 400, 16, 2003, 0, 0, 0};
    run_fused(&c, NULL, 860, -1);
    th_loop_limit("1000");
    const lin_case d = {LLMCL_F32, 1, 0, 1e-3f, 0, true, false, 2000, 16, 50, 0, 0, 0};
    run_fused(&d, NULL, 861, 0);
    run_linear(&d, NULL, 862, LLMCL_F32);
    th_loop_limit(NULL);
}

/* The linear form (vocab_chunk 0) or the fused form (tiles -1, chunks > 0) into g with opts o. */
static void lin_grads_run(const lin_problem *p, llmcl_ce_options o, int64_t vocab_chunk,
                          const lin_grads *g)
{
    llmcl_ctx *ctx = th_ctx();
    const int64_t one = 1;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p->n);
    if (vocab_chunk == 0) {
        TH_OK(llmcl_linear_cross_entropy_forward(ctx, p->th, p->tw, p->tb, p->ty, &o, tl, NULL,
                                                 g->dh, g->dw, g->db));
    } else {
        o.vocab_chunk = vocab_chunk;
        TH_OK(llmcl_fused_cross_entropy_forward(ctx, p->th, p->tw, p->tb, p->ty, &o, tl, NULL,
                                                tlse));
        TH_OK(llmcl_fused_cross_entropy_backward(ctx, p->th, p->tw, p->tb, p->ty, tlse, NULL, &o,
                                                 g->dh, g->dw, g->db));
    }
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
}

/* accumulate_weight_grad adds dweight and dbias to what they hold; dhidden is still overwritten. */
static void test_accumulate(void **state)
{
    (void)state;
    const int64_t chunks[] = {0, -1, FUSED_CHUNK};
    for (int dti = 0; dti < 2; ++dti) {
        lin_problem p = lin_make(61 + dti, 23, 40, 131, dti ? LLMCL_BF16 : LLMCL_F32, true, false, 4);
        const size_t nh = (size_t)(p.n * p.h), nw = (size_t)(p.v * p.h), nv = (size_t)p.v;
        th_rng rng = th_rng_new(62);
        double *pw = th_new_uniform(&rng, nw, -1, 1, LLMCL_F32);
        double *pb = th_new_uniform(&rng, nv, -1, 1, LLMCL_F32);
        for (int ci = 0; ci < 3; ++ci) {
            printf("%s, vocab_chunk %lld\n", llmcl_dtype_name(p.dt), (long long)chunks[ci]);
            const llmcl_ce_options base = {.label_smoothing = 0.1f};
            lin_grads g = lin_grads_new(&p, true), ga = lin_grads_new(&p, true);
            lin_grads_run(&p, base, chunks[ci], &g);
            llmcl_ce_options acc = base;
            acc.accumulate_weight_grad = 1;
            th_poison(ga.dh);
            th_upload(ga.dw, pw), th_upload(ga.db, pb);
            lin_grads_run(&p, acc, chunks[ci], &ga);
            double *dh = th_download_new(g.dh), *dw = th_download_new(g.dw), *db = th_download_new(g.db);
            double *dha = th_download_new(ga.dh), *dwa = th_download_new(ga.dw), *dba = th_download_new(ga.db);
            for (size_t i = 0; i < nw; ++i)
                dw[i] += pw[i];
            for (size_t i = 0; i < nv; ++i)
                db[i] += pb[i];
            TH_ASSERT_CLOSE("dhidden", dh, dha, nh, (th_tol){0, 0});
            TH_ASSERT_CLOSE("dweight accumulated", dw, dwa, nw, (th_tol){1e-6, 1e-6});
            TH_ASSERT_CLOSE("dbias accumulated", db, dba, nv, (th_tol){1e-6, 1e-6});
            free(dh), free(dw), free(db), free(dha), free(dwa), free(dba);
            lin_grads_free(&g), lin_grads_free(&ga);
        }
        free(pw), free(pb);
        lin_free(&p);
    }
}

/* The three forms agree with each other on the same problem. */
static void test_paths_agree(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make(55, 33, 48, 257, LLMCL_F32, true, true, 4);
    double *logits = th_alloc((size_t)(p.n * p.v) * sizeof *logits);
    ref_linear(p.hid, p.w, p.b, p.n, p.h, p.v, logits);
    th_round_all(LLMCL_F32, logits, (size_t)(p.n * p.v));
    const int64_t one = 1, ls[2] = {p.n, p.v};
    llmcl_tensor *tx = th_tensor_from(LLMCL_F32, 2, ls, logits);
    llmcl_tensor *l1 = th_tensor(LLMCL_F32, 1, &one), *l2 = th_tensor(LLMCL_F32, 1, &one);
    llmcl_tensor *l3 = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    const llmcl_ce_options o = {
        .label_smoothing = 0.05f, .lse_square_scale = 1e-3f, .softcap = 6.0f, .weight = p.tcw};
    lin_grads g2 = lin_grads_new(&p, true), g3 = lin_grads_new(&p, true);
    TH_OK(llmcl_cross_entropy_forward(ctx, tx, p.ty, &o, l1, NULL, NULL, NULL));
    TH_OK(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, l2, NULL, g2.dh,
                                             g2.dw, g2.db));
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, l3, NULL, tlse));
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &o, g3.dh,
                                             g3.dw, g3.db));
    double a, b, c;
    th_download(l1, &a), th_download(l2, &b), th_download(l3, &c);
    TH_ASSERT_CLOSE("path 2 vs path 1", &a, &b, 1, loss_tol);
    TH_ASSERT_CLOSE("path 3 vs path 1", &a, &c, 1, loss_tol);
    double *dh2 = th_download_new(g2.dh), *dh3 = th_download_new(g3.dh), *dw2 = th_download_new(g2.dw),
           *dw3 = th_download_new(g3.dw);
    TH_ASSERT_CLOSE("dhidden 3 vs 2", dh2, dh3, (size_t)(p.n * p.h),
                    mat_tol(dh2, (size_t)(p.n * p.h), LLMCL_F32));
    TH_ASSERT_CLOSE("dweight 3 vs 2", dw2, dw3, (size_t)(p.v * p.h),
                    mat_tol(dw2, (size_t)(p.v * p.h), LLMCL_F32));
    free(dh2), free(dh3), free(dw2), free(dw3), free(logits);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(l1), llmcl_tensor_destroy(l2);
    llmcl_tensor_destroy(l3), llmcl_tensor_destroy(tlse);
    lin_grads_free(&g2), lin_grads_free(&g3);
    lin_free(&p);
}

/* Peak extra memory: the fused form O(N + V), the chunked form within its budget. */
static void test_memory(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make(66, 256, 64, 4000, LLMCL_BF16, true, false, 0);
    const int64_t one = 1;
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    lin_grads g = lin_grads_new(&p, true);
    llmcl_memory_stats ms;

    TH_OK(llmcl_memory_reset_peak(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &ms));
    const uint64_t base = ms.current_bytes;
    const llmcl_ce_options tiles = {.vocab_chunk = -1};
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &tiles, tl, NULL, tlse));
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &tiles, g.dh,
                                             g.dw, g.db));
    TH_OK(llmcl_ctx_finish(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &ms));
    const uint64_t fused = ms.peak_bytes - base, nv_bytes = (uint64_t)p.n * p.v * 4;
    printf("fused in tiles: %llu bytes extra (N x V f32 would be %llu)\n",
           (unsigned long long)fused, (unsigned long long)nv_bytes);
    assert_true(fused <= 64 * (uint64_t)(p.n + p.v) + 4096);
    assert_int_equal(ms.current_bytes, base);

    /* in chunks: one chunk of f32 logits and its 16-bit copy */
    const llmcl_ce_options chunks = {.vocab_chunk = 500};
    TH_OK(llmcl_memory_reset_peak(ctx));
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &chunks, tl, NULL, tlse));
    TH_OK(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &chunks,
                                             g.dh, g.dw, g.db));
    TH_OK(llmcl_ctx_finish(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &ms));
    const uint64_t in_chunks = ms.peak_bytes - base;
    printf("fused in chunks of 500 classes: %llu bytes extra\n", (unsigned long long)in_chunks);
    assert_true(in_chunks <= (uint64_t)p.n * 500 * 6 + 64 * (uint64_t)(p.n + p.v) + 4096);
    assert_int_equal(ms.current_bytes, base);

    const uint64_t budget = 1u << 20;
    const llmcl_ce_options o = {.chunk_bytes = budget};
    TH_OK(llmcl_memory_reset_peak(ctx));
    TH_OK(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &o, tl, NULL, g.dh, g.dw,
                                             g.db));
    TH_OK(llmcl_ctx_finish(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &ms));
    const uint64_t chunked = ms.peak_bytes - base;
    printf("chunked: %llu bytes extra for a budget of %llu\n", (unsigned long long)chunked,
           (unsigned long long)budget);
    assert_true(chunked <= budget + 64 * (uint64_t)(p.n + p.v) + 4096);
    assert_true(chunked < nv_bytes);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
    lin_grads_free(&g);
    lin_free(&p);
}

static void test_linear_bad_args(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    lin_problem p = lin_make(88, 6, 8, 20, LLMCL_F32, true, false, 0);
    const int64_t one = 1, ws[2] = {20, 9}, hb[2] = {6, 8};
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &p.n);
    llmcl_tensor *wbad = th_tensor(LLMCL_F32, 2, ws), *hbf = th_tensor(LLMCL_BF16, 2, hb);
    lin_grads g = lin_grads_new(&p, true);
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, wbad, NULL, p.ty, NULL, tl, NULL, NULL,
                                                NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, hbf, p.tw, NULL, p.ty, NULL, tl, NULL, NULL,
                                                NULL, NULL),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, NULL, tl, NULL, hbf,
                                                NULL, NULL),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, NULL, tl, NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, tlse, NULL, g.dh,
                                                NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, NULL, g.dw,
                                                NULL, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    /* 16-bit logits: only in the chunked linear form, and only in hidden's 16-bit dtype */
    const llmcl_ce_options half = {.logits_dtype = LLMCL_BF16}, ints = {.logits_dtype = LLMCL_I32};
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &half, tl, NULL, g.dh,
                                                NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "logits_dtype"));
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &ints, tl, NULL, g.dh,
                                                NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &half, tl, NULL, tlse),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &half,
                                                g.dh, g.dw, g.db),
             LLMCL_ERROR_INVALID_ARGUMENT);
    /* class weights that are a gradient output, which later chunks would read after its writes */
    const llmcl_ce_options in_dbias = {.weight = g.db, .chunk_rows = 2};
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, p.ty, &in_dbias, tl, NULL,
                                                NULL, NULL, g.db),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "dbias overlaps opts->weight"));
    TH_FAILS(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, p.ty, tlse, NULL, &in_dbias,
                                                g.dh, g.dw, g.db),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "dbias overlaps opts->weight"));
    /* out-of-range labels: every form refuses and writes nothing */
    p.y[3] = 20;
    llmcl_tensor *ybad = labels_tensor(LLMCL_I64, p.y, p.n);
    TH_FAILS(llmcl_linear_cross_entropy_forward(ctx, p.th, p.tw, p.tb, ybad, NULL, tl, NULL, g.dh,
                                                NULL, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fused_cross_entropy_forward(ctx, p.th, p.tw, p.tb, ybad, NULL, tl, NULL, tlse),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fused_cross_entropy_backward(ctx, p.th, p.tw, p.tb, ybad, tlse, NULL, NULL, g.dh,
                                                g.dw, g.db),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "labels[3]"));
    double l, *dh = th_download_new(g.dh);
    th_download(tl, &l);
    assert_true(isnan(l) && isnan(dh[0]));
    free(dh);
    llmcl_tensor_destroy(ybad), llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse);
    llmcl_tensor_destroy(wbad), llmcl_tensor_destroy(hbf);
    lin_grads_free(&g);
    lin_free(&p);
}

int main(int argc, char **argv)
{
    th_kernel_option(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_gradient),    cmocka_unit_test(test_ce_options),
        cmocka_unit_test(test_ce_edges),        cmocka_unit_test(test_ce_ninf_issue),
        cmocka_unit_test(test_ce_ninf),         cmocka_unit_test(test_ce_ninf_zero_weight),
        cmocka_unit_test(test_ce_tunables),
        cmocka_unit_test(test_ce_strided_rows), cmocka_unit_test(test_ce_bad_labels),
        cmocka_unit_test(test_ce_first_bad_label),
        cmocka_unit_test(test_ce_bad_args),     cmocka_unit_test(test_ce_grad_scale),
        cmocka_unit_test(test_linear_ce),       cmocka_unit_test(test_linear_logits16),
        cmocka_unit_test(test_fused_ce),        cmocka_unit_test(test_opts_grad_scale),
        cmocka_unit_test(test_linear_ninf),
        cmocka_unit_test(test_fused_gpu_tiles), cmocka_unit_test(test_fused_filter),
        cmocka_unit_test(test_fused_large_tiles), cmocka_unit_test(test_long_vocab),
        cmocka_unit_test(test_low_loop_limit),
        cmocka_unit_test(test_paths_agree),     cmocka_unit_test(test_accumulate),     cmocka_unit_test(test_memory),
        cmocka_unit_test(test_linear_bad_args),
    };
    return TH_RUN(tests);
}
