/*
 * test_elementwise.c: fill, copy, cast, axpy, mul and sum_rows (with and without a local row)
 * against double references, on contiguous and strided tensors of odd sizes in every dtype, grids
 * widened where the device cuts loops short, plus their bad-input paths.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elementwise_ref.h"
#include "harness.h"

static const llmcl_dtype float_types[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};
static const llmcl_dtype all_types[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16, LLMCL_I32, LLMCL_I64};

typedef struct shape_case {
    int ndim;
    int64_t shape[4];
} shape_case;

static const shape_case shapes[] = {
    {1, {1}}, {1, {7}}, {1, {4097}}, {3, {3, 5, 7}}, {4, {2, 3, 4, 5}}, {2, {64, 33}},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static size_t numel_of(const shape_case *s)
{
    size_t n = 1;
    for (int i = 0; i < s->ndim; ++i)
        n *= (size_t)s->shape[i];
    return n;
}

static double *random_values(llmcl_dtype dt, size_t n, uint64_t seed)
{
    th_rng r = th_rng_new(seed);
    double *x = th_alloc(n * sizeof *x);
    const bool is_int = dt == LLMCL_I32 || dt == LLMCL_I64;
    for (size_t i = 0; i < n; ++i)
        x[i] = is_int ? (double)th_randint(&r, -100000, 100000) : th_uniform(&r, -4.0, 4.0);
    th_round_all(dt, x, n);
    return x;
}

/*
 * A strided view of a shape: a larger parent whose last dimension is padded by 3 elements and whose
 * first dimension is doubled (every other slice used), offset by 5. The gaps are poisoned.
 */
typedef struct strided {
    llmcl_tensor *parent, *view;
    size_t parent_n;
} strided;

static strided make_strided(llmcl_dtype dt, const shape_case *s)
{
    int64_t pshape[4] = {0}, strides[4] = {0};
    for (int i = 0; i < s->ndim; ++i)
        pshape[i] = s->shape[i];
    pshape[s->ndim - 1] += 3;
    pshape[0] *= 2;
    int64_t st = 1;
    for (int i = s->ndim - 1; i >= 0; --i) {
        strides[i] = st;
        st *= pshape[i];
    }
    strides[0] *= 2;
    pshape[0] += 1; /* room for the offset */
    strided r = {0};
    r.parent = th_tensor(dt, s->ndim, pshape);
    r.parent_n = (size_t)llmcl_tensor_numel(r.parent);
    TH_OK(llmcl_tensor_view(r.parent, s->ndim, s->shape, strides, 5, &r.view));
    if (numel_of(s) > 1)
        assert_int_equal(llmcl_tensor_is_contiguous(r.view), 0);
    return r;
}

static void free_strided(strided *s)
{
    llmcl_tensor_destroy(s->view);
    llmcl_tensor_destroy(s->parent);
}

/* Every parent element outside the view is still NaN (poison) or -1 for integers. */
static void assert_gaps_untouched(const strided *s, llmcl_dtype dt)
{
    double *all = th_alloc(s->parent_n * sizeof *all);
    th_download(s->parent, all);
    const size_t vn = (size_t)llmcl_tensor_numel(s->view);
    unsigned char *in_view = th_alloc(s->parent_n);
    const int nd = llmcl_tensor_ndim(s->view);
    for (size_t i = 0; i < vn; ++i) {
        size_t rem = i, off = (size_t)llmcl_tensor_offset(s->view);
        for (int d = nd - 1; d >= 0; --d) {
            off += (rem % (size_t)llmcl_tensor_dim(s->view, d)) * (size_t)llmcl_tensor_stride(s->view, d);
            rem /= (size_t)llmcl_tensor_dim(s->view, d);
        }
        in_view[off] = 1;
    }
    const bool is_int = dt == LLMCL_I32 || dt == LLMCL_I64;
    for (size_t i = 0; i < s->parent_n; ++i)
        if (!in_view[i] && !(is_int ? all[i] == -1.0 : isnan(all[i])))
            fail_msg("element %zu outside the view was written (%g)", i, all[i]);
    free(in_view);
    free(all);
}

static void test_fill(void **state)
{
    (void)state;
    for (size_t t = 0; t < 5; ++t)
        for (size_t s = 0; s < N_SHAPES; ++s) {
            const llmcl_dtype dt = all_types[t];
            const size_t n = numel_of(&shapes[s]);
            const double value = (dt == LLMCL_I32 || dt == LLMCL_I64) ? -123457.0 : 3.14159;
            double *ref = th_alloc(n * sizeof *ref), *got = th_alloc(n * sizeof *got);
            for (size_t i = 0; i < n; ++i)
                ref[i] = th_round(dt, value);
            llmcl_tensor *x = th_tensor(dt, shapes[s].ndim, shapes[s].shape);
            TH_OK(llmcl_fill(th_ctx(), x, value));
            th_download(x, got);
            TH_ASSERT_CLOSE("fill", ref, got, n, (th_tol){0, 0});
            strided v = make_strided(dt, &shapes[s]);
            TH_OK(llmcl_fill(th_ctx(), v.view, value));
            th_download(v.view, got);
            TH_ASSERT_CLOSE("fill strided", ref, got, n, (th_tol){0, 0});
            assert_gaps_untouched(&v, dt);
            free_strided(&v);
            llmcl_tensor_destroy(x);
            free(ref);
            free(got);
        }
}

static void test_copy(void **state)
{
    (void)state;
    for (size_t t = 0; t < 5; ++t)
        for (size_t s = 0; s < N_SHAPES; ++s) {
            const llmcl_dtype dt = all_types[t];
            const shape_case *sc = &shapes[s];
            const size_t n = numel_of(sc);
            double *x = random_values(dt, n, 100 + s), *got = th_alloc(n * sizeof *got);
            llmcl_tensor *src = th_tensor_from(dt, sc->ndim, sc->shape, x);
            llmcl_tensor *dst = th_tensor(dt, sc->ndim, sc->shape);
            TH_OK(llmcl_copy(th_ctx(), src, dst));
            th_download(dst, got);
            TH_ASSERT_CLOSE("copy", x, got, n, (th_tol){0, 0});
            /* contiguous -> strided -> contiguous */
            strided v = make_strided(dt, sc);
            TH_OK(llmcl_copy(th_ctx(), src, v.view));
            th_poison(dst);
            TH_OK(llmcl_copy(th_ctx(), v.view, dst));
            th_download(dst, got);
            TH_ASSERT_CLOSE("copy strided", x, got, n, (th_tol){0, 0});
            assert_gaps_untouched(&v, dt);
            free_strided(&v);
            llmcl_tensor_destroy(src);
            llmcl_tensor_destroy(dst);
            free(x);
            free(got);
        }
}

/*
 * A view of `shape` in a poisoned parent: rows `pitch` elements apart, each outer dimension `gap`
 * elements beyond the one inside it, starting at element `offset`.
 */
static strided pitched(llmcl_dtype dt, int ndim, const int64_t *shape, int64_t pitch, int64_t gap,
                       int64_t offset)
{
    int64_t strides[4] = {0};
    strides[ndim - 1] = 1;
    if (ndim >= 2)
        strides[ndim - 2] = pitch;
    for (int i = ndim - 3; i >= 0; --i)
        strides[i] = strides[i + 1] * shape[i + 1] + gap;
    int64_t extent = offset + 1;
    for (int i = 0; i < ndim; ++i)
        extent += (shape[i] - 1) * strides[i];
    strided r = {0};
    r.parent = th_tensor(dt, 1, &extent);
    r.parent_n = (size_t)extent;
    TH_OK(llmcl_tensor_view(r.parent, ndim, shape, strides, offset, &r.view));
    return r;
}

typedef struct pitch_case {
    int ndim;
    int64_t shape[4];
    int64_t pitch[2], gap[2], offset[2]; /* two layouts of the shape */
} pitch_case;

/*
 * Copies between row-pitched views, whose rows start and end on 16-, 8- or 4-byte boundaries
 * (a bf16 row of 12 elements is 8-byte words, one of 6 is 4-byte words) or on none (pitch 11, or
 * a misaligned offset), so that copy_strided runs over words of each size and over elements:
 * contiguous to the first layout, to the second, and back, every gap left poisoned.
 */
static void test_copy_rows(void **state)
{
    (void)state;
    static const pitch_case cases[] = {
        {2, {37, 64}, {72, 80}, {0, 0}, {8, 16}},   {2, {19, 12}, {16, 24}, {0, 0}, {4, 8}},
        {2, {5, 6}, {10, 8}, {0, 0}, {2, 6}},       {2, {9, 8}, {11, 8}, {0, 0}, {0, 8}},
        {2, {9, 8}, {16, 8}, {0, 0}, {8, 3}},       {3, {3, 7, 40}, {48, 40}, {8, 16}, {8, 0}},
        {4, {2, 3, 4, 24}, {32, 24}, {16, 8}, {16, 32}}, {2, {1, 16}, {16, 24}, {0, 0}, {2, 4}},
    };
    for (size_t t = 0; t < 5; ++t)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
            const llmcl_dtype dt = all_types[t];
            const pitch_case *pc = &cases[c];
            const shape_case sc = {pc->ndim, {pc->shape[0], pc->shape[1], pc->shape[2], pc->shape[3]}};
            const size_t n = numel_of(&sc);
            double *x = random_values(dt, n, 900 + c), *got = th_alloc(n * sizeof *got);
            llmcl_tensor *src = th_tensor_from(dt, pc->ndim, pc->shape, x);
            llmcl_tensor *dst = th_tensor(dt, pc->ndim, pc->shape);
            strided a = pitched(dt, pc->ndim, pc->shape, pc->pitch[0], pc->gap[0], pc->offset[0]);
            strided b = pitched(dt, pc->ndim, pc->shape, pc->pitch[1], pc->gap[1], pc->offset[1]);
            TH_OK(llmcl_copy(th_ctx(), src, a.view));
            TH_OK(llmcl_copy(th_ctx(), a.view, b.view));
            th_download(b.view, got);
            TH_ASSERT_CLOSE("copy between pitched views", x, got, n, (th_tol){0, 0});
            TH_OK(llmcl_copy(th_ctx(), b.view, dst));
            th_download(dst, got);
            TH_ASSERT_CLOSE("copy from a pitched view", x, got, n, (th_tol){0, 0});
            assert_gaps_untouched(&a, dt);
            assert_gaps_untouched(&b, dt);
            free_strided(&a);
            free_strided(&b);
            llmcl_tensor_destroy(src);
            llmcl_tensor_destroy(dst);
            free(x);
            free(got);
        }
}

/*
 * copy_words under forced tunables (as the tuner sets them): words per pass, a capped grid that
 * loops, an uncapped one, and the cache hints; sizes that leave partial passes.
 */
static void test_copy_tunables(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *params[] = {"UNROLL=8 GPC=1 WG=32 HINT=3", "UNROLL=2 GPC=0 WG=64 HINT=1",
                            "UNROLL=4 GPC=16 WG=128 HINT=2", "UNROLL=1 GPC=2 WG=256"};
    const int64_t sizes[] = {8, 4104, 100000};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; ++i) {
        TH_OK(llmcl_tune_override(ctx, "copy", LLMCL_F32, "*", params[i]));
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            const int64_t n = sizes[s];
            double *x = random_values(LLMCL_F32, (size_t)n, 700 + s);
            double *got = th_alloc((size_t)n * sizeof *got);
            llmcl_tensor *src = th_tensor_from(LLMCL_F32, 1, &n, x);
            llmcl_tensor *dst = th_tensor(LLMCL_F32, 1, &n);
            TH_OK(llmcl_copy(ctx, src, dst));
            th_download(dst, got);
            TH_ASSERT_CLOSE("copy tuned", x, got, (size_t)n, (th_tol){0, 0});
            llmcl_tensor_destroy(src);
            llmcl_tensor_destroy(dst);
            free(x);
            free(got);
        }
    }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
}

static void test_cast(void **state)
{
    (void)state;
    for (size_t a = 0; a < 3; ++a)
        for (size_t b = 0; b < 3; ++b)
            for (size_t s = 0; s < N_SHAPES; ++s) {
                const llmcl_dtype from = float_types[a], to = float_types[b];
                const shape_case *sc = &shapes[s];
                const size_t n = numel_of(sc);
                double *x = random_values(from, n, 7 * s + a), *ref = th_alloc(n * sizeof *ref);
                double *got = th_alloc(n * sizeof *got);
                for (size_t i = 0; i < n; ++i)
                    ref[i] = th_round(to, x[i]); /* x is exact in f32, so one rounding */
                llmcl_tensor *src = th_tensor_from(from, sc->ndim, sc->shape, x);
                llmcl_tensor *dst = th_tensor(to, sc->ndim, sc->shape);
                TH_OK(llmcl_cast(th_ctx(), src, dst));
                th_download(dst, got);
                TH_ASSERT_CLOSE("cast", ref, got, n, (th_tol){0, 0});
                strided v = make_strided(to, sc);
                TH_OK(llmcl_cast(th_ctx(), src, v.view));
                th_download(v.view, got);
                TH_ASSERT_CLOSE("cast strided", ref, got, n, (th_tol){0, 0});
                assert_gaps_untouched(&v, to);
                free_strided(&v);
                llmcl_tensor_destroy(src);
                llmcl_tensor_destroy(dst);
                free(x);
                free(ref);
                free(got);
            }
}

/* bf16 rounding of special values through the device: ties to even, NaN, infinities, subnormals. */
static void test_cast_special_values(void **state)
{
    (void)state;
    const float vals[] = {1.0f + 0x1p-8f,          /* tie, rounds down to even 1.0 */
                          1.0f + 3 * 0x1p-8f,      /* tie, rounds up to even */
                          1.0f + 0x1p-8f + 0x1p-20f, /* above the tie: rounds up */
                          NAN, -NAN, INFINITY, -INFINITY, 0x1p-130f, -0x1p-140f, 3.0e38f,
                          -0.0f, 65504.0f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f};
    const size_t n = sizeof vals / sizeof vals[0];
    const int64_t shape[] = {(int64_t)n};
    llmcl_tensor *src = NULL, *bf = th_tensor(LLMCL_BF16, 1, shape), *hf = th_tensor(LLMCL_F16, 1, shape);
    TH_OK(llmcl_tensor_create(th_ctx(), LLMCL_F32, 1, shape, &src));
    TH_OK(llmcl_tensor_upload(src, vals, sizeof vals));
    TH_OK(llmcl_cast(th_ctx(), src, bf));
    TH_OK(llmcl_cast(th_ctx(), src, hf));
    uint16_t gb[32], gh[32];
    TH_OK(llmcl_tensor_download(bf, gb, n * 2));
    TH_OK(llmcl_tensor_download(hf, gh, n * 2));
    for (size_t i = 0; i < n; ++i) {
        const uint16_t eb = llmcl_f32_to_bf16(vals[i]), eh = llmcl_f32_to_f16(vals[i]);
        if (isnan(vals[i])) {
            assert_true(isnan(llmcl_bf16_to_f32(gb[i])));
            assert_true(isnan(llmcl_f16_to_f32(gh[i])));
        } else {
            if (gb[i] != eb)
                fail_msg("bf16 of %a: device 0x%04x, host 0x%04x", (double)vals[i], gb[i], eb);
            if (gh[i] != eh)
                fail_msg("f16 of %a: device 0x%04x, host 0x%04x", (double)vals[i], gh[i], eh);
        }
    }
    assert_int_equal(gb[0], 0x3f80);
    assert_int_equal(gb[1], 0x3f82);
    assert_int_equal(gb[2], 0x3f81);
    assert_int_equal(gh[12], 0x7c00); /* 65520 overflows f16 */
    llmcl_tensor_destroy(src);
    llmcl_tensor_destroy(bf);
    llmcl_tensor_destroy(hf);
}

static void check_binary(bool is_axpy)
{
    for (size_t t = 0; t < 3; ++t)
        for (size_t s = 0; s < N_SHAPES; ++s) {
            const llmcl_dtype dt = float_types[t];
            const shape_case *sc = &shapes[s];
            const size_t n = numel_of(sc);
            double *x = random_values(dt, n, 31 + s), *y = random_values(dt, n, 57 + s);
            double *ref = th_alloc(n * sizeof *ref), *got = th_alloc(n * sizeof *got);
            memcpy(ref, y, n * sizeof *ref);
            const float alpha = -0.75f;
            if (is_axpy)
                ref_axpy(alpha, x, ref, n);
            else
                ref_mul(x, ref, n);
            llmcl_tensor *tx = th_tensor_from(dt, sc->ndim, sc->shape, x);
            llmcl_tensor *ty = th_tensor_from(dt, sc->ndim, sc->shape, y);
            TH_OK(is_axpy ? llmcl_axpy(th_ctx(), alpha, tx, ty) : llmcl_mul(th_ctx(), tx, ty));
            th_download(ty, got);
            TH_ASSERT_CLOSE(is_axpy ? "axpy" : "mul", ref, got, n, th_tol_for(dt));
            strided v = make_strided(dt, sc);
            th_upload(v.view, y);
            TH_OK(is_axpy ? llmcl_axpy(th_ctx(), alpha, tx, v.view) : llmcl_mul(th_ctx(), tx, v.view));
            th_download(v.view, got);
            TH_ASSERT_CLOSE(is_axpy ? "axpy strided" : "mul strided", ref, got, n, th_tol_for(dt));
            assert_gaps_untouched(&v, dt);
            free_strided(&v);
            llmcl_tensor_destroy(tx);
            llmcl_tensor_destroy(ty);
            free(x);
            free(y);
            free(ref);
            free(got);
        }
}

static void test_axpy(void **state)
{
    (void)state;
    check_binary(true);
}

static void test_mul(void **state)
{
    (void)state;
    check_binary(false);
}

/* x [rows, n] at a row stride of n + 3 from element 5 of a poisoned parent: misaligned rows. */
static llmcl_tensor *rows_view(llmcl_dtype dt, int64_t rows, int64_t n, llmcl_tensor **parent)
{
    const int64_t total = 5 + rows * (n + 3), shape[2] = {rows, n}, strides[2] = {n + 3, 1};
    llmcl_tensor *x = NULL;
    *parent = th_tensor(dt, 1, &total);
    TH_OK(llmcl_tensor_view(*parent, 2, shape, strides, 5, &x));
    return x;
}

/* The f32 sum in row order that the kernel promises, bit for bit (beta 0 or 1: no rounding of
 * beta * y). */
static void expect_row_order(const double *x, size_t rows, size_t n, double beta, const double *y,
                             const double *got)
{
    for (size_t i = 0; i < n; ++i) {
        float s = (float)x[i];
        for (size_t q = 1; q < rows; ++q)
            s += (float)x[q * n + i];
        if (beta != 0.0)
            s += (float)y[i];
        if ((double)s != got[i])
            fail_msg("sum_rows: element %zu is %.9g, the f32 sum in row order %.9g", i, got[i],
                     (double)s);
    }
}

static void check_sum_rows(llmcl_dtype xt, llmcl_dtype yt, int64_t rows, int64_t n, double beta)
{
    const size_t nn = (size_t)n, all = (size_t)rows * nn;
    double *x = random_values(xt, all, 900 + (uint64_t)(rows * n)), *y = random_values(yt, nn, 77);
    double *ref = th_alloc(nn * sizeof *ref), *got = th_alloc(nn * sizeof *got);
    llmcl_tensor *parent = NULL, *tx = rows_view(xt, rows, n, &parent);
    th_upload(tx, x);
    llmcl_tensor *ty = beta != 0.0 ? th_tensor_from(yt, 1, &n, y) : th_tensor(yt, 1, &n);
    memcpy(ref, y, nn * sizeof *ref);
    ref_sum_rows(x, (size_t)rows, nn, beta, ref, nn);
    TH_OK(llmcl_sum_rows(th_ctx(), tx, (float)beta, ty));
    th_download(ty, got);
    char what[64];
    snprintf(what, sizeof what, "sum_rows %s -> %s, %lld x %lld, beta %g", llmcl_dtype_name(xt),
             llmcl_dtype_name(yt), (long long)rows, (long long)n, beta);
    TH_ASSERT_CLOSE(what, ref, got, nn, th_tol_for(yt));
    if (xt == LLMCL_F32 && yt == LLMCL_F32 && (beta == 0.0 || beta == 1.0))
        expect_row_order(x, (size_t)rows, nn, beta, y, got);
    /* the gaps between the rows are still poison */
    const int64_t total = llmcl_tensor_numel(parent);
    double *p = th_alloc((size_t)total * sizeof *p);
    th_download(parent, p);
    for (int64_t i = 0; i < total; ++i)
        if (i < 5 || (i - 5) % (n + 3) >= n)
            assert_true(isnan(p[i]));
    free(p);
    llmcl_tensor_destroy(tx);
    llmcl_tensor_destroy(parent);
    llmcl_tensor_destroy(ty);
    free(x);
    free(y);
    free(ref);
    free(got);
}

/* Rows of any dtype into y of any dtype, 1 to 5 rows of odd lengths, y read or not (beta 0). */
static void test_sum_rows(void **state)
{
    (void)state;
    const int64_t rows[] = {1, 2, 3, 5}, lengths[] = {1, 7, 1003, 4097};
    const double betas[] = {0.0, 1.0, -0.5};
    for (size_t a = 0; a < 3; ++a)
        for (size_t b = 0; b < 3; ++b)
            for (size_t r = 0; r < 4; ++r)
                for (size_t l = 0; l < 4; ++l)
                    check_sum_rows(float_types[a], float_types[b], rows[r], lengths[l],
                                   betas[(a + b + r + l) % 3]);
}

/*
 * Grids where the device cuts loops short (rusticl's llvmpipe: 65535 passes a work-item and
 * launch): with one work-item a group and one group a compute unit, a fill, a cast, an axpy and a
 * sum of 600,000 elements would loop far past the limit in each work-item, so the launcher widens
 * the grid; a sum over more rows than one work-item's loops run is refused there.
 */
static void test_loop_limit(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    static const char *const keys[] = {"fill", "cast", "axpy", "sum_rows"};
    for (int i = 0; i < 4; ++i)
        TH_OK(llmcl_tune_override(ctx, keys[i], i == 1 ? LLMCL_BF16 : LLMCL_F32, "*",
                                  "WG=1 GPC=1"));
    const int64_t n = 600000;
    double *ref = th_alloc((size_t)n * sizeof *ref), *got = th_alloc((size_t)n * sizeof *got);
    for (int64_t i = 0; i < n; ++i)
        ref[i] = 2.5;
    llmcl_tensor *x = th_tensor(LLMCL_F32, 1, &n), *y = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *h = th_tensor(LLMCL_BF16, 1, &n);
    TH_OK(llmcl_fill(ctx, x, 2.5));
    th_download(x, got);
    TH_ASSERT_CLOSE("fill", ref, got, (size_t)n, (th_tol){0, 0});
    TH_OK(llmcl_cast(ctx, x, h));
    th_download(h, got);
    TH_ASSERT_CLOSE("cast", ref, got, (size_t)n, (th_tol){0, 0});
    TH_OK(llmcl_fill(ctx, y, 1.0));
    TH_OK(llmcl_axpy(ctx, 2.0f, x, y));
    for (int64_t i = 0; i < n; ++i)
        ref[i] = 6.0;
    th_download(y, got);
    TH_ASSERT_CLOSE("axpy", ref, got, (size_t)n, (th_tol){0, 0});
    check_sum_rows(LLMCL_F32, LLMCL_F32, 3, n, 1.0);
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_BF16, NULL, NULL));

    if (llmcl_ctx_device_info(ctx)->loop_limit) {
        const int64_t tall[2] = {40000, 1}, one = 1;
        llmcl_tensor *t = th_tensor(LLMCL_F32, 2, tall), *s = th_tensor(LLMCL_F32, 1, &one);
        TH_FAILS(llmcl_sum_rows(ctx, t, 0.0f, s), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(ctx), "40000 rows"));
        llmcl_tensor_destroy(t), llmcl_tensor_destroy(s);
    } else {
        check_sum_rows(LLMCL_F32, LLMCL_F32, 40000, 1, 0.0);
    }
    llmcl_tensor_destroy(x), llmcl_tensor_destroy(y), llmcl_tensor_destroy(h);
    /* a limit of 200 on any device, default grids */
    th_loop_limit("200");
    llmcl_tensor *z = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_fill(th_ctx(), z, 2.5));
    for (int64_t i = 0; i < n; ++i)
        ref[i] = 2.5;
    th_download(z, got);
    TH_ASSERT_CLOSE("fill, limit 200", ref, got, (size_t)n, (th_tol){0, 0});
    llmcl_tensor_destroy(z);
    check_sum_rows(LLMCL_BF16, LLMCL_F32, 5, n, 0.0);
    th_loop_limit(NULL);
    free(ref), free(got);
}

/* y as one of x's rows: each element is read before it is written. */
static void test_sum_rows_in_place(void **state)
{
    (void)state;
    const int64_t rows = 3, n = 1001;
    for (size_t t = 0; t < 2; ++t)
        for (int beta = 0; beta <= 1; ++beta) {
            const llmcl_dtype dt = float_types[t];
            double *x = random_values(dt, (size_t)(rows * n), 40 + t);
            double *ref = th_alloc((size_t)n * sizeof *ref);
            double *got = th_alloc((size_t)n * sizeof *got);
            memcpy(ref, x + 2 * n, (size_t)n * sizeof *ref);
            ref_sum_rows(x, (size_t)rows, (size_t)n, beta, ref, (size_t)n);
            llmcl_tensor *parent = NULL, *tx = rows_view(dt, rows, n, &parent), *row = NULL;
            th_upload(tx, x);
            TH_OK(llmcl_tensor_view(parent, 1, &n, NULL, 5 + 2 * (n + 3), &row));
            TH_OK(llmcl_sum_rows(th_ctx(), tx, (float)beta, row));
            th_download(row, got);
            TH_ASSERT_CLOSE("sum_rows into its last row", ref, got, (size_t)n, th_tol_for(dt));
            llmcl_tensor_destroy(row);
            llmcl_tensor_destroy(tx);
            llmcl_tensor_destroy(parent);
            free(x);
            free(ref);
            free(got);
        }
}

/*
 * llmcl_sum_rows_local: row q of x read from another tensor, x's own row there NaN (so a read of it
 * shows), into y or into that tensor itself; bit for bit the f32 sum in row order.
 */
static void check_sum_rows_local(llmcl_dtype dt, int64_t rows, int64_t n, int64_t q, int beta,
                                 bool into_local)
{
    const size_t nn = (size_t)n;
    double *x = random_values(dt, (size_t)rows * nn, 60 + (uint64_t)(rows * n + q));
    double *mine = random_values(dt, nn, 61), *y = random_values(LLMCL_F32, nn, 62);
    double *ref = th_alloc(nn * sizeof *ref), *got = th_alloc(nn * sizeof *got);
    double *sent = th_alloc((size_t)rows * nn * sizeof *sent);
    memcpy(sent, x, (size_t)rows * nn * sizeof *sent);
    for (size_t i = 0; i < nn; ++i) {
        sent[(size_t)q * nn + i] = NAN;
        x[(size_t)q * nn + i] = mine[i];
    }
    llmcl_tensor *parent = NULL, *tx = rows_view(dt, rows, n, &parent);
    th_upload(tx, sent);
    llmcl_tensor *local = th_tensor_from(dt, 1, &n, mine);
    llmcl_tensor *ty = into_local ? local : th_tensor_from(LLMCL_F32, 1, &n, y);
    memcpy(ref, into_local ? mine : y, nn * sizeof *ref);
    ref_sum_rows(x, (size_t)rows, nn, beta, ref, nn);
    TH_OK(llmcl_sum_rows_local(th_ctx(), tx, q, local, (float)beta, ty));
    th_download(ty, got);
    char what[96];
    snprintf(what, sizeof what, "sum_rows_local %s, %lld x %lld, row %lld, beta %d%s",
             llmcl_dtype_name(dt), (long long)rows, (long long)n, (long long)q, beta,
             into_local ? ", into local" : "");
    TH_ASSERT_CLOSE(what, ref, got, nn, th_tol_for(into_local ? dt : LLMCL_F32));
    if (dt == LLMCL_F32)
        expect_row_order(x, (size_t)rows, nn, beta, into_local ? mine : y, got);
    llmcl_tensor_destroy(tx);
    llmcl_tensor_destroy(parent);
    if (!into_local)
        llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(local);
    free(x), free(mine), free(y), free(ref), free(got), free(sent);
}

static void test_sum_rows_local(void **state)
{
    (void)state;
    const int64_t rows[] = {1, 2, 3, 5}, lengths[] = {1, 7, 4097};
    for (size_t t = 0; t < 3; ++t)
        for (size_t r = 0; r < 4; ++r)
            for (size_t l = 0; l < 3; ++l)
                for (int64_t q = 0; q < rows[r]; q += rows[r] > 2 ? rows[r] / 2 : 1)
                    check_sum_rows_local(float_types[t], rows[r], lengths[l], q,
                                         (int)((t + r + l + (size_t)q) % 2), (r + l) % 2 == 1);
    /* bad inputs: the row, the local tensor, and an overlap with y that is not local itself */
    llmcl_ctx *ctx = th_ctx();
    const int64_t s24[] = {2, 4}, s4[] = {4}, s5[] = {5}, s8[] = {8};
    llmcl_tensor *m = th_tensor(LLMCL_F32, 2, s24), *y = th_tensor(LLMCL_F32, 1, s4);
    llmcl_tensor *h = th_tensor(LLMCL_BF16, 1, s4), *b = th_tensor(LLMCL_F32, 1, s5);
    llmcl_tensor *big = th_tensor(LLMCL_F32, 1, s8), *v1 = NULL, *v2 = NULL;
    TH_OK(llmcl_tensor_view(big, 1, s4, NULL, 0, &v1));
    TH_OK(llmcl_tensor_view(big, 1, s4, NULL, 2, &v2));
    TH_FAILS(llmcl_sum_rows_local(ctx, m, 2, y, 0.0f, y), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_sum_rows_local(ctx, m, -1, y, 0.0f, y), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_sum_rows_local(ctx, m, 0, NULL, 0.0f, y), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_sum_rows_local(ctx, m, 0, h, 0.0f, y), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_sum_rows_local(ctx, m, 0, b, 0.0f, y), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_sum_rows_local(ctx, m, 1, v1, 1.0f, v2), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "overlaps local"));
    TH_FAILS(llmcl_sum_rows_local(NULL, m, 0, y, 0.0f, y), LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor *ts[] = {m, y, h, b, v1, v2, big};
    for (size_t i = 0; i < 7; ++i)
        llmcl_tensor_destroy(ts[i]);
}

static void test_in_place_and_empty(void **state)
{
    (void)state;
    const int64_t shape[] = {33};
    double x[33], got[33], ref[33];
    th_rng r = th_rng_new(9);
    th_fill_uniform(&r, x, 33, -2, 2);
    th_round_all(LLMCL_F32, x, 33);
    llmcl_tensor *t = th_tensor_from(LLMCL_F32, 1, shape, x);
    TH_OK(llmcl_axpy(th_ctx(), 2.0f, t, t)); /* y += 2y */
    th_download(t, got);
    for (int i = 0; i < 33; ++i)
        ref[i] = 3 * x[i];
    TH_ASSERT_CLOSE("axpy in place", ref, got, 33, th_tol_for(LLMCL_F32));
    TH_OK(llmcl_copy(th_ctx(), t, t));
    const int64_t empty[] = {4, 0};
    llmcl_tensor *e1 = th_tensor(LLMCL_BF16, 2, empty), *e2 = th_tensor(LLMCL_BF16, 2, empty);
    TH_OK(llmcl_fill(th_ctx(), e1, 1.0));
    TH_OK(llmcl_copy(th_ctx(), e1, e2));
    TH_OK(llmcl_axpy(th_ctx(), 1.0f, e1, e2));
    TH_OK(llmcl_ctx_finish(th_ctx()));
    llmcl_tensor_destroy(e1);
    llmcl_tensor_destroy(e2);
    llmcl_tensor_destroy(t);
}

/* Fills the view of parent at element offset off; checks that only the view's elements changed. */
static void expect_fill_in_view(llmcl_tensor *parent, llmcl_tensor *view, int64_t off,
                                llmcl_dtype dt)
{
    const size_t total = (size_t)llmcl_tensor_numel(parent), n = (size_t)llmcl_tensor_numel(view);
    double *before = th_alloc(total * sizeof *before), *after = th_alloc(total * sizeof *after);
    th_download(parent, before);
    TH_OK(llmcl_fill(th_ctx(), view, -2.5));
    th_download(parent, after);
    for (size_t i = 0; i < total; ++i) {
        const bool in = i >= (size_t)off && i < (size_t)off + n;
        const double want = in ? th_round(dt, -2.5) : before[i];
        if (after[i] != want && !(isnan(want) && isnan(after[i])))
            fail_msg("fill of a view at offset %lld: element %zu is %g, not %g", (long long)off, i,
                     after[i], want);
    }
    free(before);
    free(after);
}

/*
 * Contiguous views at element offsets that leave some operands 16-byte aligned and others not
 * (bf16 at 8 and 16, f32 at 4, 8 and 16): each mix must take a path that its alignment allows.
 */
static void test_offset_views(void **state)
{
    (void)state;
    const int64_t n = 1003, offsets[] = {1, 3, 6, 4, 8, 16};
    const size_t n_off = sizeof offsets / sizeof offsets[0];
    for (size_t t = 0; t < 3; ++t)
        for (size_t o = 0; o < n_off; ++o) {
            const llmcl_dtype dt = float_types[t];
            const int64_t total = n + 16;
            llmcl_tensor *px = th_tensor(dt, 1, &total), *py = th_tensor(dt, 1, &total);
            llmcl_tensor *pf = th_tensor(LLMCL_F32, 1, &total);
            llmcl_tensor *x = NULL, *y = NULL, *f = NULL;
            TH_OK(llmcl_tensor_view(px, 1, &n, NULL, offsets[o], &x));
            TH_OK(llmcl_tensor_view(py, 1, &n, NULL, offsets[(o + 1) % n_off], &y));
            TH_OK(llmcl_tensor_view(pf, 1, &n, NULL, offsets[(o + 2) % n_off], &f));
            double *vx = random_values(dt, (size_t)n, 400 + o), *vy = random_values(dt, (size_t)n, 500 + o);
            double *ref = th_alloc((size_t)n * sizeof *ref), *got = th_alloc((size_t)n * sizeof *got);
            th_upload(x, vx);
            th_upload(y, vy);
            memcpy(ref, vy, (size_t)n * sizeof *ref);
            ref_axpy(0.5, vx, ref, (size_t)n);
            TH_OK(llmcl_axpy(th_ctx(), 0.5f, x, y));
            th_download(y, got);
            TH_ASSERT_CLOSE("axpy at offsets", ref, got, (size_t)n, th_tol_for(dt));
            TH_OK(llmcl_cast(th_ctx(), y, f));
            th_download(f, ref);
            TH_ASSERT_CLOSE("cast at offsets", got, ref, (size_t)n, (th_tol){0, 0});
            TH_OK(llmcl_copy(th_ctx(), x, y));
            th_download(y, got);
            TH_ASSERT_CLOSE("copy at offsets", vx, got, (size_t)n, (th_tol){0, 0});
            expect_fill_in_view(py, y, offsets[(o + 1) % n_off], dt);
            llmcl_tensor *views[] = {x, y, f, px, py, pf};
            for (size_t i = 0; i < 6; ++i)
                llmcl_tensor_destroy(views[i]);
            free(vx);
            free(vy);
            free(ref);
            free(got);
        }
}

/* A [rows, n] view of cols [col, col + n) of storage with `width` elements a row. */
static llmcl_tensor *cols_view(llmcl_tensor *storage, int64_t rows, int64_t width, int64_t col,
                               int64_t n)
{
    const int64_t shape[2] = {rows, n}, strides[2] = {width, 1};
    llmcl_tensor *v = NULL;
    TH_OK(llmcl_tensor_view(storage, 2, shape, strides, col, &v));
    return v;
}

/*
 * Column blocks side by side in the rows of one buffer interleave without sharing an element:
 * axpy and copy between them run, and every other element keeps its value. A block that shares
 * columns with another is refused, the buffer intact.
 */
static void test_interleaved_views(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    enum { ROWS = 5, WIDTH = 13 };
    const int64_t shape[2] = {ROWS, WIDTH};
    double init[ROWS * WIDTH], want[ROWS * WIDTH], got[ROWS * WIDTH];
    th_rng rng = th_rng_new(71);
    th_fill_normal(&rng, init, ROWS * WIDTH, 1.0);
    llmcl_tensor *store = th_tensor_from(LLMCL_F32, 2, shape, init);
    llmcl_tensor *a = cols_view(store, ROWS, WIDTH, 0, 4), *b = cols_view(store, ROWS, WIDTH, 4, 4);
    llmcl_tensor *c = cols_view(store, ROWS, WIDTH, 8, 4), *d = cols_view(store, ROWS, WIDTH, 2, 4);
    TH_OK(llmcl_axpy(ctx, 2.0f, a, b));
    TH_OK(llmcl_copy(ctx, a, c));
    memcpy(want, init, sizeof want);
    for (int r = 0; r < ROWS; ++r)
        for (int j = 0; j < 4; ++j) {
            want[r * WIDTH + 4 + j] = (float)(init[r * WIDTH + 4 + j] + 2.0 * init[r * WIDTH + j]);
            want[r * WIDTH + 8 + j] = init[r * WIDTH + j];
        }
    th_download(store, got);
    TH_ASSERT_CLOSE("store", want, got, ROWS * WIDTH, ((th_tol){1e-6, 1e-6}));
    memcpy(want, got, sizeof want);
    TH_FAILS(llmcl_copy(ctx, a, d), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "overlap"));
    th_download(store, got);
    assert_memory_equal(want, got, sizeof want);
    llmcl_tensor *views[] = {a, b, c, d, store};
    for (size_t i = 0; i < 5; ++i)
        llmcl_tensor_destroy(views[i]);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t s4[] = {4}, s5[] = {5}, s8[] = {8};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 1, s4), *b = th_tensor(LLMCL_F32, 1, s5);
    llmcl_tensor *h = th_tensor(LLMCL_BF16, 1, s4), *i32 = th_tensor(LLMCL_I32, 1, s4);
    llmcl_tensor *big = th_tensor(LLMCL_F32, 1, s8), *v1 = NULL, *v2 = NULL;
    TH_OK(llmcl_tensor_view(big, 1, s4, NULL, 0, &v1));
    TH_OK(llmcl_tensor_view(big, 1, s4, NULL, 2, &v2));

    TH_FAILS(llmcl_fill(NULL, a, 1.0), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fill(ctx, NULL, 1.0), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_fill(ctx, i32, 1e30), LLMCL_ERROR_INVALID_ARGUMENT);
    /* the integer dtype's own range, after truncation toward zero; outside it the tensor stays */
    const double i32_fits[] = {2147483647.9, -2147483648.9}, i32_not[] = {2147483648.0, 3e9,
                                                                          -2147483649.0, NAN};
    for (int i = 0; i < 2; ++i) {
        TH_OK(llmcl_fill(ctx, i32, i32_fits[i]));
        for (size_t k = 0; k < 4; ++k) {
            TH_FAILS(llmcl_fill(ctx, i32, i32_not[k]), LLMCL_ERROR_INVALID_ARGUMENT);
            assert_non_null(strstr(llmcl_last_error(ctx), "does not fit in i32"));
        }
        int32_t got[4];
        TH_OK(llmcl_tensor_download(i32, got, sizeof got));
        assert_int_equal(got[3], i == 0 ? INT32_MAX : INT32_MIN);
    }
    llmcl_tensor *i64 = th_tensor(LLMCL_I64, 1, s4);
    TH_OK(llmcl_fill(ctx, i64, -0x1p63));
    TH_FAILS(llmcl_fill(ctx, i64, 0x1p63), LLMCL_ERROR_INVALID_ARGUMENT);
    int64_t got64[4];
    TH_OK(llmcl_tensor_download(i64, got64, sizeof got64));
    assert_true(got64[0] == INT64_MIN);
    llmcl_tensor_destroy(i64);
    TH_FAILS(llmcl_copy(ctx, a, b), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_copy(ctx, a, h), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_copy(ctx, v1, v2), LLMCL_ERROR_INVALID_ARGUMENT); /* partial overlap */
    TH_FAILS(llmcl_cast(ctx, a, i32), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_cast(ctx, i32, a), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_axpy(ctx, 1.0f, a, h), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_axpy(ctx, 1.0f, a, b), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_axpy(ctx, 1.0f, i32, i32), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_mul(ctx, a, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    const int64_t s24[] = {2, 4}, s42[] = {4, 2}, st[] = {1, 2}, s2[] = {2};
    llmcl_tensor *m = th_tensor(LLMCL_F32, 2, s24), *two = th_tensor(LLMCL_F32, 1, s2);
    llmcl_tensor *rows_strided = NULL, *inside = NULL;
    TH_OK(llmcl_tensor_view(big, 2, s42, st, 0, &rows_strided));
    TH_OK(llmcl_tensor_view(m, 1, s4, NULL, 1, &inside));
    TH_FAILS(llmcl_sum_rows(ctx, a, 1.0f, a), LLMCL_ERROR_SHAPE_MISMATCH); /* x not 2-D */
    TH_FAILS(llmcl_sum_rows(ctx, m, 1.0f, b), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_sum_rows(ctx, rows_strided, 0.0f, two), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_sum_rows(ctx, m, 0.0f, inside), LLMCL_ERROR_INVALID_ARGUMENT); /* not a row */
    TH_FAILS(llmcl_sum_rows(ctx, m, 0.0f, i32), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    /* m's buffer wrapped as bf16 from its byte 8, mid row 0, though that offset (4 elements of
       another dtype) reads as the start of m's row 1 */
    llmcl_tensor *mid_row0 = NULL;
    TH_OK(llmcl_tensor_wrap(ctx, llmcl_tensor_cl_mem(m), LLMCL_BF16, 1, s4, NULL, 4, &mid_row0));
    TH_FAILS(llmcl_sum_rows(ctx, m, 0.0f, mid_row0), LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor_destroy(mid_row0);
    llmcl_tensor_destroy(inside);
    llmcl_tensor_destroy(rows_strided);
    llmcl_tensor_destroy(m);
    llmcl_tensor_destroy(two);

    /* a tensor of another context */
    llmcl_ctx *other = NULL;
    TH_OK(llmcl_ctx_create(&other));
    llmcl_tensor *foreign = NULL;
    TH_OK(llmcl_tensor_create(other, LLMCL_F32, 1, s4, &foreign));
    TH_FAILS(llmcl_copy(ctx, foreign, a), LLMCL_ERROR_DEVICE_MISMATCH);
    llmcl_tensor_destroy(foreign);
    llmcl_ctx_destroy(other);

    /* failed ops leave their inputs intact */
    double vals[4] = {1, 2, 3, 4}, got[4];
    th_upload(a, vals);
    TH_FAILS(llmcl_axpy(ctx, 1.0f, b, a), LLMCL_ERROR_SHAPE_MISMATCH);
    th_download(a, got);
    TH_ASSERT_CLOSE("input after failure", vals, got, 4, (th_tol){0, 0});

    llmcl_tensor *tensors[] = {a, b, h, i32, v1, v2, big};
    for (size_t i = 0; i < 7; ++i)
        llmcl_tensor_destroy(tensors[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_copy_rows),
        cmocka_unit_test(test_copy_tunables),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_cast_special_values),
        cmocka_unit_test(test_axpy),
        cmocka_unit_test(test_mul),
        cmocka_unit_test(test_sum_rows),
        cmocka_unit_test(test_sum_rows_in_place),
        cmocka_unit_test(test_sum_rows_local),
        cmocka_unit_test(test_loop_limit),
        cmocka_unit_test(test_in_place_and_empty),
        cmocka_unit_test(test_offset_views),
        cmocka_unit_test(test_interleaved_views),
        cmocka_unit_test(test_bad_inputs),
    };
    return TH_RUN(tests);
}
