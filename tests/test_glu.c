/*
 * test_glu.c: SwiGLU / GeGLU (llmcl_glu_forward, llmcl_glu_backward) and the activations alone
 * against the double references in ref/glu_ref.c: every activation and dtype, separate and
 * packed gate/up, odd row lengths, strided rows (vector-aligned and not), in-place variants, and
 * bad inputs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "glu_ref.h"
#include "harness.h"

static const llmcl_dtype DTYPES[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};
static const llmcl_activation ACTS[] = {LLMCL_ACT_SILU, LLMCL_ACT_GELU_TANH, LLMCL_ACT_GELU_ERF};

/*
 * A [n, cols] matrix: contiguous when pad and off are 0, else a view of rows cols + pad apart
 * starting off elements into a poisoned 1-D buffer (whose gaps must stay untouched).
 */
typedef struct mat {
    llmcl_tensor *base, *t;
    int64_t n, cols, pad, off;
} mat;

static mat mat_new(llmcl_dtype dt, int64_t n, int64_t cols, int64_t pad, int64_t off,
                   const double *values)
{
    mat m = {NULL, NULL, n, cols, pad, off};
    const int64_t shape[2] = {n, cols};
    if (pad == 0 && off == 0) {
        m.t = th_tensor(dt, 2, shape);
    } else {
        const int64_t total = n * (cols + pad) + off;
        m.base = th_tensor(dt, 1, &total);
        const int64_t strides[2] = {cols + pad, 1};
        TH_OK(llmcl_tensor_view(m.base, 2, shape, strides, off, &m.t));
    }
    if (values)
        th_upload(m.t, values);
    return m;
}

/* The gaps of a strided matrix still hold the poison (NaN). */
static void mat_check_gaps(const mat *m)
{
    if (!m->base)
        return;
    const int64_t total = m->n * (m->cols + m->pad) + m->off;
    double *all = th_alloc((size_t)total * sizeof(double));
    th_download(m->base, all);
    size_t touched = 0;
    for (int64_t j = 0; j < total; ++j) {
        const int64_t rel = j - m->off, row = rel / (m->cols + m->pad);
        const bool inside = rel >= 0 && row < m->n && rel % (m->cols + m->pad) < m->cols;
        if (!inside && !isnan(all[j]))
            ++touched;
    }
    free(all);
    assert_int_equal(touched, 0);
}

static void mat_free(mat *m)
{
    llmcl_tensor_destroy(m->t);
    llmcl_tensor_destroy(m->base);
}

/* Activations and their products in f32 lose a few ulps beyond the output's rounding. */
static th_tol glu_tol(llmcl_dtype dt)
{
    th_tol t = th_tol_for(dt);
    if (dt == LLMCL_F32) {
        t.atol = fmax(t.atol, 2e-6);
        t.rtol = fmax(t.rtol, 2e-5);
    }
    return t;
}

/* Random gate and up values rounded to dt; gate spans the activations' curved region. */
static void fill_inputs(uint64_t seed, llmcl_dtype dt, double *g, double *u, double *dy, size_t n)
{
    th_rng r = th_rng_new(seed);
    th_fill_normal(&r, g, n, 2.5);
    th_fill_uniform(&r, u, n, -2.0, 2.0);
    if (dy)
        th_fill_normal(&r, dy, n, 1.0);
    th_round_all(dt, g, n);
    th_round_all(dt, u, n);
    if (dy)
        th_round_all(dt, dy, n);
}

/* Interleaves rows of a and b into [n, 2 cols] (the packed gate | up layout), or splits back. */
static void pack_rows(const double *a, const double *b, double *packed, int64_t n, int64_t cols)
{
    for (int64_t r = 0; r < n; ++r) {
        memcpy(packed + r * 2 * cols, a + r * cols, (size_t)cols * sizeof(double));
        memcpy(packed + r * 2 * cols + cols, b + r * cols, (size_t)cols * sizeof(double));
    }
}

static void unpack_rows(const double *packed, double *a, double *b, int64_t n, int64_t cols)
{
    for (int64_t r = 0; r < n; ++r) {
        memcpy(a + r * cols, packed + r * 2 * cols, (size_t)cols * sizeof(double));
        memcpy(b + r * cols, packed + r * 2 * cols + cols, (size_t)cols * sizeof(double));
    }
}

typedef struct glu_case {
    int64_t n, cols;
    bool packed;
    int64_t pad, off; /* strided rows when non-zero */
    int in_place;     /* forward: out over gate; backward: dgate over gate, dup over up */
} glu_case;

static void run_forward(llmcl_dtype dt, llmcl_activation act, const glu_case *c, uint64_t seed)
{
    llmcl_ctx *ctx = th_ctx();
    const size_t ne = (size_t)(c->n * c->cols);
    double *g = th_alloc(ne * sizeof(double)), *u = th_alloc(ne * sizeof(double));
    double *ref = th_alloc(ne * sizeof(double)), *got = th_alloc(ne * sizeof(double));
    double *packed = th_alloc(2 * ne * sizeof(double));
    fill_inputs(seed, dt, g, u, NULL, ne);
    glu_ref_forward(act, g, u, ref, ne);

    mat mg, mu = {0}, mo;
    if (c->packed) {
        pack_rows(g, u, packed, c->n, c->cols);
        mg = mat_new(dt, c->n, 2 * c->cols, c->pad, c->off, packed);
    } else {
        mg = mat_new(dt, c->n, c->cols, c->pad, c->off, g);
        mu = mat_new(dt, c->n, c->cols, c->pad, c->off, u);
    }
    if (c->in_place && !c->packed)
        mo = mg;
    else
        mo = mat_new(dt, c->n, c->cols, c->pad, c->off, NULL);
    TH_OK(llmcl_glu_forward(ctx, act, mg.t, c->packed ? NULL : mu.t, mo.t));
    th_download(mo.t, got);
    TH_ASSERT_CLOSE("glu forward", ref, got, ne, glu_tol(dt));
    mat_check_gaps(&mo);
    if (!c->in_place || c->packed)
        mat_free(&mo);
    mat_free(&mg);
    if (!c->packed)
        mat_free(&mu);
    free(g), free(u), free(ref), free(got), free(packed);
}

static void run_backward(llmcl_dtype dt, llmcl_activation act, const glu_case *c, uint64_t seed)
{
    llmcl_ctx *ctx = th_ctx();
    const size_t ne = (size_t)(c->n * c->cols);
    double *g = th_alloc(ne * sizeof(double)), *u = th_alloc(ne * sizeof(double));
    double *dy = th_alloc(ne * sizeof(double));
    double *rdg = th_alloc(ne * sizeof(double)), *rdu = th_alloc(ne * sizeof(double));
    double *gdg = th_alloc(ne * sizeof(double)), *gdu = th_alloc(ne * sizeof(double));
    double *packed = th_alloc(2 * ne * sizeof(double));
    fill_inputs(seed, dt, g, u, dy, ne);
    glu_ref_backward(act, dy, g, u, rdg, rdu, ne);

    mat mdy = mat_new(dt, c->n, c->cols, c->pad, c->off, dy);
    if (c->packed) {
        pack_rows(g, u, packed, c->n, c->cols);
        mat mx = mat_new(dt, c->n, 2 * c->cols, c->pad, c->off, packed);
        mat mdx = c->in_place ? mx : mat_new(dt, c->n, 2 * c->cols, c->pad, c->off, NULL);
        TH_OK(llmcl_glu_backward(ctx, act, mdy.t, mx.t, NULL, mdx.t, NULL));
        th_download(mdx.t, packed);
        unpack_rows(packed, gdg, gdu, c->n, c->cols);
        mat_check_gaps(&mdx);
        if (!c->in_place)
            mat_free(&mdx);
        mat_free(&mx);
    } else {
        mat mg = mat_new(dt, c->n, c->cols, c->pad, c->off, g);
        mat mu = mat_new(dt, c->n, c->cols, c->pad, c->off, u);
        /* in_place 2 writes dgate over dout instead of over gate */
        mat mdg = c->in_place == 1   ? mg
                  : c->in_place == 2 ? mdy
                                     : mat_new(dt, c->n, c->cols, c->pad, c->off, NULL);
        mat mdu = c->in_place ? mu : mat_new(dt, c->n, c->cols, c->pad, c->off, NULL);
        TH_OK(llmcl_glu_backward(ctx, act, mdy.t, mg.t, mu.t, mdg.t, mdu.t));
        th_download(mdg.t, gdg);
        th_download(mdu.t, gdu);
        mat_check_gaps(&mdg);
        mat_check_gaps(&mdu);
        if (!c->in_place)
            mat_free(&mdg), mat_free(&mdu);
        mat_free(&mg), mat_free(&mu);
    }
    TH_ASSERT_CLOSE("glu backward dgate", rdg, gdg, ne, glu_tol(dt));
    TH_ASSERT_CLOSE("glu backward dup", rdu, gdu, ne, glu_tol(dt));
    mat_free(&mdy);
    free(g), free(u), free(dy), free(rdg), free(rdu), free(gdg), free(gdu), free(packed);
}

/* Every activation and dtype on shapes that exercise vector bodies, tails and several rows. */
static void test_forward_all(void **state)
{
    (void)state;
    const glu_case cases[] = {
        {5, 7, false, 0, 0, 0},   {3, 4097, false, 0, 0, 0}, {64, 1, false, 0, 0, 0},
        {33, 96, false, 0, 0, 0}, {4, 7, true, 0, 0, 0},     {6, 256, true, 0, 0, 0},
    };
    uint64_t seed = 1;
    for (size_t d = 0; d < 3; ++d)
        for (size_t a = 0; a < 3; ++a)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
                run_forward(DTYPES[d], ACTS[a], &cases[i], seed++);
}

static void test_backward_all(void **state)
{
    (void)state;
    const glu_case cases[] = {
        {5, 7, false, 0, 0, 0},   {3, 4097, false, 0, 0, 0}, {64, 1, false, 0, 0, 0},
        {33, 96, false, 0, 0, 0}, {4, 7, true, 0, 0, 0},     {6, 256, true, 0, 0, 0},
    };
    uint64_t seed = 100;
    for (size_t d = 0; d < 3; ++d)
        for (size_t a = 0; a < 3; ++a)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
                run_backward(DTYPES[d], ACTS[a], &cases[i], seed++);
}

/* Row strides and offsets: multiples of the vector width (aligned path) and not (vload + tail). */
static void test_strided(void **state)
{
    (void)state;
    const glu_case cases[] = {
        {9, 64, false, 8, 16, 0}, {9, 64, true, 8, 8, 0},     {7, 13, false, 3, 5, 0},
        {7, 40, true, 1, 1, 0},   {2, 1000, false, 24, 8, 0},
    };
    uint64_t seed = 200;
    for (size_t d = 0; d < 3; ++d)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            run_forward(DTYPES[d], LLMCL_ACT_SILU, &cases[i], seed++);
            run_backward(DTYPES[d], LLMCL_ACT_GELU_TANH, &cases[i], seed++);
        }
}

static void test_in_place(void **state)
{
    (void)state;
    const glu_case cases[] = {
        {6, 100, false, 0, 0, 1},
        {6, 100, true, 0, 0, 1},
        {5, 33, false, 3, 5, 1},
        {4, 64, false, 0, 0, 2},
    };
    uint64_t seed = 300;
    for (size_t d = 0; d < 3; ++d)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            if (cases[i].in_place == 1)
                run_forward(DTYPES[d], LLMCL_ACT_GELU_ERF, &cases[i], seed++);
            run_backward(DTYPES[d], LLMCL_ACT_SILU, &cases[i], seed++);
        }
}

/* The activation alone: y = act(x) (also in place) and dx = dy * act'(x). */
static void test_activation(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t shape[3] = {3, 5, 37};
    const size_t ne = 3 * 5 * 37;
    double *x = th_alloc(ne * sizeof(double)), *dy = th_alloc(ne * sizeof(double));
    double *u = th_alloc(ne * sizeof(double)), *ref = th_alloc(ne * sizeof(double));
    double *got = th_alloc(ne * sizeof(double));
    uint64_t seed = 400;
    for (size_t d = 0; d < 3; ++d)
        for (size_t a = 0; a < 3; ++a) {
            const llmcl_dtype dt = DTYPES[d];
            fill_inputs(seed++, dt, x, u, dy, ne);
            llmcl_tensor *tx = th_tensor_from(dt, 3, shape, x), *ty = th_tensor(dt, 3, shape);
            llmcl_tensor *tdy = th_tensor_from(dt, 3, shape, dy), *tdx = th_tensor(dt, 3, shape);

            glu_ref_forward(ACTS[a], x, NULL, ref, ne);
            TH_OK(llmcl_activation_forward(ctx, ACTS[a], tx, ty));
            th_download(ty, got);
            TH_ASSERT_CLOSE("activation forward", ref, got, ne, glu_tol(dt));

            glu_ref_backward(ACTS[a], dy, x, NULL, ref, NULL, ne);
            TH_OK(llmcl_activation_backward(ctx, ACTS[a], tx, tdy, tdx));
            th_download(tdx, got);
            TH_ASSERT_CLOSE("activation backward", ref, got, ne, glu_tol(dt));
            TH_OK(llmcl_activation_backward(ctx, ACTS[a], tx, tdy, tdy)); /* dx over dy */
            th_download(tdy, got);
            TH_ASSERT_CLOSE("activation backward in place", ref, got, ne, glu_tol(dt));

            glu_ref_forward(ACTS[a], x, NULL, ref, ne);
            TH_OK(llmcl_activation_forward(ctx, ACTS[a], tx, tx)); /* y over x */
            th_download(tx, got);
            TH_ASSERT_CLOSE("activation forward in place", ref, got, ne, glu_tol(dt));

            llmcl_tensor_destroy(tx), llmcl_tensor_destroy(ty);
            llmcl_tensor_destroy(tdy), llmcl_tensor_destroy(tdx);
        }
    free(x), free(dy), free(u), free(ref), free(got);
}

/* Extreme gates: saturated activations stay finite and exact (no inf * 0, no NaN). */
static void test_extremes(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const double g[8] = {-200.0, -88.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 200.0};
    const double u[8] = {1.5, -2.0, 0.5, 3.0, 1.0, -1.0, 2.0, -0.5};
    const int64_t shape[2] = {1, 8};
    double ref[8], got[8], rdu[8], gdu[8];
    for (size_t a = 0; a < 3; ++a) {
        llmcl_tensor *tg = th_tensor_from(LLMCL_F32, 2, shape, g);
        llmcl_tensor *tu = th_tensor_from(LLMCL_F32, 2, shape, u);
        llmcl_tensor *to = th_tensor(LLMCL_F32, 2, shape), *tdu = th_tensor(LLMCL_F32, 2, shape);
        glu_ref_forward(ACTS[a], g, u, ref, 8);
        TH_OK(llmcl_glu_forward(ctx, ACTS[a], tg, tu, to));
        th_download(to, got);
        TH_ASSERT_CLOSE("glu forward extremes", ref, got, 8, glu_tol(LLMCL_F32));
        glu_ref_backward(ACTS[a], u, g, u, ref, rdu, 8);
        TH_OK(llmcl_glu_backward(ctx, ACTS[a], tu, tg, tu, to, tdu));
        th_download(to, got);
        th_download(tdu, gdu);
        TH_ASSERT_CLOSE("glu backward extremes dgate", ref, got, 8, glu_tol(LLMCL_F32));
        TH_ASSERT_CLOSE("glu backward extremes dup", rdu, gdu, 8, glu_tol(LLMCL_F32));
        llmcl_tensor_destroy(tg), llmcl_tensor_destroy(tu);
        llmcl_tensor_destroy(to), llmcl_tensor_destroy(tdu);
    }
}

/* Non-default tunables (as the tuner forces them): vector widths, unrolling (the H200's entries'
 * two vectors a work-item in groups of 512 among them), small groups, cache hints; aligned rows,
 * in place too, where 16-bit vectors are held as stored until the math. */
static void test_tunables(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *params[] = {"VEC=1 UNROLL=1 WG=64", "VEC=2 UNROLL=4 WG=32 HINT=3",
                            "VEC=4 UNROLL=2 WG=128 HINT=1", "VEC=8 UNROLL=4 WG=256 HINT=2",
                            "VEC=8 UNROLL=1 WG=512 HINT=3", "VEC=4 UNROLL=1 WG=64 HINT=3",
                            "VEC=8 UNROLL=2 WG=512 HINT=0"};
    const glu_case cases[] = {
        {5, 4097, false, 0, 0, 0}, {9, 64, true, 8, 8, 0}, {3, 13, false, 3, 5, 0},
        {6, 100, false, 0, 0, 1}, {7, 96, false, 8, 0, 1}};
    uint64_t seed = 500;
    for (size_t i = 0; i < sizeof params / sizeof params[0]; ++i)
        for (size_t d = 0; d < 2; ++d) {
            TH_OK(llmcl_tune_override(ctx, "glu_fwd", DTYPES[d], "*", params[i]));
            TH_OK(llmcl_tune_override(ctx, "glu_bwd", DTYPES[d], "*", params[i]));
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
                run_forward(DTYPES[d], LLMCL_ACT_SILU, &cases[c], seed++);
                run_backward(DTYPES[d], LLMCL_ACT_GELU_ERF, &cases[c], seed++);
            }
        }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
}

/*
 * A loop limit of 200 on any device (rusticl's llvmpipe cuts loops at 65535): one work-item a
 * group over 200,000 elements, whose grid the launcher then widens past its usual cap.
 */
static void test_loop_limit(void **state)
{
    (void)state;
    th_loop_limit("200");
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_override(ctx, "glu_fwd", LLMCL_F32, "*", "VEC=1 UNROLL=1 WG=1"));
    TH_OK(llmcl_tune_override(ctx, "glu_bwd", LLMCL_F32, "*", "VEC=1 UNROLL=1 WG=1"));
    const glu_case c = {20, 10000, false, 0, 0, 0};
    run_forward(LLMCL_F32, LLMCL_ACT_SILU, &c, 700);
    run_backward(LLMCL_F32, LLMCL_ACT_SILU, &c, 701);
    th_loop_limit(NULL);
}

/* Empty tensors are valid and launch nothing. */
static void test_empty(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t s[2] = {0, 7}, s2[2] = {0, 14};
    llmcl_tensor *g = th_tensor(LLMCL_BF16, 2, s), *u = th_tensor(LLMCL_BF16, 2, s);
    llmcl_tensor *o = th_tensor(LLMCL_BF16, 2, s), *x = th_tensor(LLMCL_BF16, 2, s2);
    TH_OK(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, o));
    TH_OK(llmcl_glu_forward(ctx, LLMCL_ACT_GELU_ERF, x, NULL, o));
    TH_OK(llmcl_glu_backward(ctx, LLMCL_ACT_GELU_TANH, o, g, u, g, u));
    TH_OK(llmcl_activation_forward(ctx, LLMCL_ACT_SILU, g, o));
    llmcl_tensor_destroy(g), llmcl_tensor_destroy(u), llmcl_tensor_destroy(o);
    llmcl_tensor_destroy(x);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t s[2] = {4, 6}, s2[2] = {4, 12}, s_odd[2] = {4, 13}, s_other[2] = {4, 7};
    double vals[48];
    for (int i = 0; i < 48; ++i)
        vals[i] = 0.25 * (i % 9) - 1.0;
    llmcl_tensor *g = th_tensor_from(LLMCL_BF16, 2, s, vals);
    llmcl_tensor *u = th_tensor_from(LLMCL_BF16, 2, s, vals);
    llmcl_tensor *o = th_tensor(LLMCL_BF16, 2, s), *o2 = th_tensor(LLMCL_BF16, 2, s);
    llmcl_tensor *of32 = th_tensor(LLMCL_F32, 2, s), *oi32 = th_tensor(LLMCL_I32, 2, s);
    llmcl_tensor *other = th_tensor(LLMCL_BF16, 2, s_other);
    llmcl_tensor *x = th_tensor_from(LLMCL_BF16, 2, s2, vals);
    llmcl_tensor *x_odd = th_tensor(LLMCL_BF16, 2, s_odd), *dx = th_tensor(LLMCL_BF16, 2, s2);

    TH_FAILS(llmcl_glu_forward(NULL, LLMCL_ACT_SILU, g, u, o), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, NULL, u, o), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_forward(ctx, (llmcl_activation)7, g, u, o), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, other, o), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, other), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, of32), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, oi32), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    /* packed: the last dimension must be exactly twice out's */
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, x_odd, NULL, o), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, NULL, o), LLMCL_ERROR_SHAPE_MISMATCH);

    /* out overlapping gate without being it: a view shifted by one element */
    const int64_t tot = 4 * 6 + 1;
    llmcl_tensor *buf = th_tensor(LLMCL_BF16, 1, &tot), *va, *vb, *vzero;
    const int64_t st[2] = {6, 1}, st0[2] = {0, 1};
    TH_OK(llmcl_tensor_view(buf, 2, s, st, 0, &va));
    TH_OK(llmcl_tensor_view(buf, 2, s, st, 1, &vb));
    TH_OK(llmcl_tensor_view(buf, 2, s, st0, 0, &vzero));
    th_upload(va, vals);
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, va, u, vb), LLMCL_ERROR_INVALID_ARGUMENT);
    /* packed: out over the gate half of its own input overlaps without being the same view */
    const int64_t st_half[2] = {12, 1};
    llmcl_tensor *x_half;
    TH_OK(llmcl_tensor_view(x, 2, s, st_half, 0, &x_half));
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, x, NULL, x_half), LLMCL_ERROR_INVALID_ARGUMENT);
    /* an output whose rows all alias (row stride 0) */
    TH_FAILS(llmcl_glu_forward(ctx, LLMCL_ACT_SILU, g, u, vzero), LLMCL_ERROR_INVALID_ARGUMENT);

    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, g, u, o2, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, g, NULL, o2, o2),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, g, u, o2, o2),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, g, u, of32, o2),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, other, g, u, o, o2),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, x, NULL, o2, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, x, NULL, x_half, NULL),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, o, x, NULL, dx, o2),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_glu_backward(ctx, LLMCL_ACT_SILU, va, g, u, vb, o2),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_activation_forward(ctx, LLMCL_ACT_SILU, g, other), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_activation_forward(ctx, LLMCL_ACT_SILU, va, vb), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_activation_backward(ctx, LLMCL_ACT_SILU, g, u, of32),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);

    /* failed calls left their inputs as they were */
    double back[48];
    th_download(g, back);
    double expect[48];
    memcpy(expect, vals, sizeof expect);
    th_round_all(LLMCL_BF16, expect, 24);
    TH_ASSERT_CLOSE("gate after failures", expect, back, 24, (th_tol){0.0, 0.0});
    th_download(va, back);
    TH_ASSERT_CLOSE("overlapping view after failures", expect, back, 24, (th_tol){0.0, 0.0});

    llmcl_tensor *ts[] = {g, u, o, o2, of32, oi32, other, x_half, x, x_odd, dx, va, vb, vzero, buf};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_all), cmocka_unit_test(test_backward_all),
        cmocka_unit_test(test_strided),     cmocka_unit_test(test_in_place),
        cmocka_unit_test(test_activation),  cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_tunables),    cmocka_unit_test(test_empty),
        cmocka_unit_test(test_bad_inputs),     cmocka_unit_test(test_loop_limit),
    };
    return TH_RUN(tests);
}
