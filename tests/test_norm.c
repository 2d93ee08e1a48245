/*
 * test_norm.c: RMSNorm, fused residual + RMSNorm and LayerNorm against the double references in
 * ref/norm_ref.c: every dtype pairing, both casting modes, offsets 0 and 1, odd row lengths
 * (1, 7, 4097), rows padded and misaligned, per-head rows (two levels of row strides, each tensor
 * its own), rows longer than the register cache, in-place variants, llama casting's y bit for
 * bit (the stored rounding of x times rstd), bitwise determinism of the
 * weight gradients, row slots within a device's loop limit, and every rejected argument.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "norm_ref.h"

/* ---- helpers ---- */

/* An activation [n, H] as a view into a larger poisoned buffer: lead elements before, pad after each row. */
typedef struct act {
    llmcl_tensor *base, *t;
} act;

static act act_new(llmcl_dtype dt, int64_t n, int64_t H, int64_t pad, int64_t lead)
{
    act a;
    const int64_t total = lead + n * (H + pad);
    a.base = th_tensor(dt, 1, &total);
    const int64_t shape[2] = {n, H}, strides[2] = {H + pad, 1};
    TH_OK(llmcl_tensor_view(a.base, 2, shape, strides, lead, &a.t));
    return a;
}

static act act_from(llmcl_dtype dt, int64_t n, int64_t H, int64_t pad, int64_t lead,
                    const double *v)
{
    act a = act_new(dt, n, H, pad, lead);
    th_upload(a.t, v);
    return a;
}

static void act_free(act a)
{
    llmcl_tensor_destroy(a.t);
    llmcl_tensor_destroy(a.base);
}



static double *get(const llmcl_tensor *t, size_t n)
{
    double *v = th_alloc(n * sizeof *v);
    th_download(t, v);
    return v;
}

/* Gradients involve cancellation (m - x * c), so their absolute tolerance is wider than outputs'. */
static th_tol tol_for(llmcl_dtype dt)
{
    switch (dt) {
    case LLMCL_BF16:
        return (th_tol){3e-2, 2e-2};
    case LLMCL_F16:
        return (th_tol){4e-3, 4e-3};
    default:
        return (th_tol){2e-4, 1e-4};
    }
}

/* Weight gradients sum n rows: scale the absolute part with sqrt(n). */
static th_tol tol_sum(llmcl_dtype xdt, llmcl_dtype wdt, int64_t n)
{
    th_tol a = tol_for(xdt), b = tol_for(wdt);
    return (th_tol){a.atol * sqrt((double)n), a.rtol > b.rtol ? a.rtol : b.rtol};
}

/* ---- RMSNorm ---- */

typedef struct rms_case {
    llmcl_dtype xdt, wdt;
    int64_t n, H, pad, lead;
    llmcl_rmsnorm_casting cast;
    float offset;
    bool in_place; /* y over x in the forward, dx over dy in the backward */
} rms_case;

static void run_rms(const rms_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(1000 + (uint64_t)c->H * 7 + (uint64_t)c->n);
    const int64_t n = c->n, H = c->H;
    const size_t N = (size_t)(n * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    double *dy = th_new_normal(&rng, N, 1.0, c->xdt);
    const int llama = c->cast == LLMCL_RMSNORM_CAST_LLAMA;
    const llmcl_rmsnorm_options o = {.eps = 1e-5f, .offset = c->offset, .casting = c->cast};

    act tx = act_from(c->xdt, n, H, c->pad, c->lead, x);
    act ty = act_new(c->xdt, n, H, c->pad, c->lead);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w);
    llmcl_tensor *trs = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *out = c->in_place ? tx.t : ty.t;
    TH_OK(llmcl_rmsnorm_forward(ctx, tx.t, tw, out, trs, &o));

    double *y_ref = th_alloc(N * sizeof(double)), *rs_ref = th_alloc((size_t)n * sizeof(double));
    norm_ref_rmsnorm_fwd(x, NULL, NULL, w, y_ref, rs_ref, n, H, 1e-5, c->offset, llama, c->xdt);
    double *y = get(out, N), *rs = get(trs, (size_t)n);
    TH_ASSERT_CLOSE("rmsnorm y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("rmsnorm rstd", rs_ref, rs, (size_t)n, tol_for(LLMCL_F32));
    if (c->in_place)
        th_upload(tx.t, x);

    act tdy = act_from(c->xdt, n, H, c->pad, c->lead, dy);
    act tdx = act_new(c->xdt, n, H, c->pad, c->lead);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H);
    llmcl_tensor *dxt = c->in_place ? tdy.t : tdx.t;
    TH_OK(llmcl_rmsnorm_backward(ctx, tdy.t, tx.t, tw, trs, dxt, tdw, &o));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_rmsnorm_bwd(dy, NULL, x, w, rs_ref, dx_ref, dw_ref, n, H, c->offset, llama, c->xdt);
    double *dx = get(dxt, N), *dw = get(tdw, (size_t)H);
    TH_ASSERT_CLOSE("rmsnorm dx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("rmsnorm dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, n));

    act_free(tx), act_free(ty), act_free(tdy), act_free(tdx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw);
    free(x), free(w), free(dy), free(y_ref), free(rs_ref), free(y), free(rs);
    free(dx_ref), free(dw_ref), free(dx), free(dw);
}

static const llmcl_rmsnorm_casting LLAMA = LLMCL_RMSNORM_CAST_LLAMA;
static const llmcl_rmsnorm_casting GEMMA = LLMCL_RMSNORM_CAST_GEMMA;

static void test_rmsnorm_dtypes(void **state)
{
    (void)state;
    /* Each dtype with its own-dtype weight (llama, offset 0) and an f32 weight (gemma, offset 1). */
    const llmcl_dtype dts[3] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};
    for (int i = 0; i < 3; ++i)
        for (int gemma = 0; gemma < 2; ++gemma) {
            const rms_case c = {dts[i], gemma ? LLMCL_F32 : dts[i], 24, 1024, 0, 0,
                                gemma ? GEMMA : LLAMA, gemma ? 1.0f : 0.0f, false};
            run_rms(&c);
        }
}

static void test_rmsnorm_row_lengths(void **state)
{
    (void)state;
    const rms_case cs[] = {
        {LLMCL_BF16, LLMCL_BF16, 300, 1, 0, 0, LLAMA, 0.0f, false},
        {LLMCL_BF16, LLMCL_BF16, 33, 7, 0, 0, LLAMA, 1.0f, false},
        {LLMCL_F32, LLMCL_F32, 17, 8, 0, 0, GEMMA, 0.0f, false},
        {LLMCL_F32, LLMCL_F32, 50, 64, 0, 0, GEMMA, 1.0f, false},
        {LLMCL_BF16, LLMCL_F32, 6, 4097, 0, 0, GEMMA, 0.0f, false},
        {LLMCL_BF16, LLMCL_BF16, 4, 8192, 0, 0, LLAMA, 0.0f, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_rms(&cs[i]);
}

static void test_rmsnorm_strided(void **state)
{
    (void)state;
    /* Padded aligned rows (vector path with a tail), padded misaligned rows, a misaligned start. */
    const rms_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 9, 1028, 4, 0, GEMMA, 0.0f, false},
        {LLMCL_BF16, LLMCL_F32, 9, 1030, 10, 0, LLAMA, 0.0f, false},
        {LLMCL_BF16, LLMCL_BF16, 9, 512, 3, 0, LLAMA, 1.0f, false},
        {LLMCL_F16, LLMCL_F16, 9, 512, 0, 1, GEMMA, 0.0f, false},
        {LLMCL_F32, LLMCL_F32, 5, 77, 51, 3, LLAMA, 0.0f, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_rms(&cs[i]);
}

static void test_rmsnorm_long_rows(void **state)
{
    (void)state;
    /* Longer than WG * VEC * CACHE (forward or backward): the re-read path, dw partials in memory. */
    const rms_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 2, 40000, 0, 0, GEMMA, 0.0f, false},
        {LLMCL_BF16, LLMCL_BF16, 3, 40003, 0, 0, LLAMA, 1.0f, false},
        {LLMCL_BF16, LLMCL_F32, 2, 66000, 0, 0, GEMMA, 0.0f, false},
    };
    for (size_t i = 0; i < 3; ++i)
        run_rms(&cs[i]);
}

static void test_rmsnorm_in_place(void **state)
{
    (void)state;
    const rms_case cs[] = {
        {LLMCL_BF16, LLMCL_BF16, 16, 2048, 0, 0, LLAMA, 0.0f, true},
        {LLMCL_F32, LLMCL_F32, 7, 4097, 0, 0, GEMMA, 1.0f, true},
        {LLMCL_F16, LLMCL_F32, 40, 40, 8, 0, LLAMA, 0.0f, true},
    };
    for (size_t i = 0; i < 3; ++i)
        run_rms(&cs[i]);
}

/*
 * Llama casting rounds x * rstd to bf16 before the weight: a difference of at most one bf16 unit
 * from rounding once, inside tol_for. Every y must be the reference's bits, but for the few that
 * f32's rstd may move across a rounding boundary; and the two castings must differ on enough
 * elements for that to tell them apart.
 */
static void test_rmsnorm_llama_cast_bits(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(4242);
    const int64_t n = 16, H = 512, shape[2] = {n, H};
    const size_t N = (size_t)(n * H);
    double *x = th_new_normal(&rng, N, 1.0, LLMCL_BF16);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, LLMCL_BF16);
    llmcl_tensor *tx = th_tensor_from(LLMCL_BF16, 2, shape, x);
    llmcl_tensor *tw = th_tensor_from(LLMCL_BF16, 1, &H, w);
    llmcl_tensor *ty = th_tensor(LLMCL_BF16, 2, shape);
    llmcl_tensor *trs = th_tensor(LLMCL_F32, 1, &n);
    const llmcl_rmsnorm_options o = {.eps = 1e-5f, .casting = LLMCL_RMSNORM_CAST_LLAMA};
    TH_OK(llmcl_rmsnorm_forward(ctx, tx, tw, ty, trs, &o));

    double *llama = th_alloc(N * sizeof(double)), *gemma = th_alloc(N * sizeof(double));
    double *rs = th_alloc((size_t)n * sizeof(double));
    norm_ref_rmsnorm_fwd(x, NULL, NULL, w, llama, rs, n, H, 1e-5, 0.0, 1, LLMCL_BF16);
    norm_ref_rmsnorm_fwd(x, NULL, NULL, w, gemma, rs, n, H, 1e-5, 0.0, 0, LLMCL_BF16);
    th_round_all(LLMCL_BF16, llama, N); /* y as stored */
    th_round_all(LLMCL_BF16, gemma, N);
    double *y = get(ty, N);
    size_t off = 0, apart = 0;
    for (size_t i = 0; i < N; ++i) {
        off += y[i] != llama[i];
        apart += gemma[i] != llama[i];
    }
    if (apart < N / 20)
        fail_msg("the castings differ on only %zu of %zu elements", apart, N);
    if (off > N / 200)
        fail_msg("llama casting: %zu of %zu y differ from the reference's bits (castings differ "
                 "on %zu)", off, N, apart);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tw), llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(trs);
    free(x), free(w), free(llama), free(gemma), free(rs), free(y);
}

/* A 3-D input with rstd shaped like the leading dimensions, and defaults from NULL options. */
static void test_rmsnorm_3d_defaults(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(77);
    const int64_t shape[3] = {2, 3, 96}, lead[2] = {2, 3}, H = 96;
    double *x = th_new_normal(&rng, 576, 2.0, LLMCL_BF16);
    double *w = th_new_uniform(&rng, 96, -1.0, 1.0, LLMCL_BF16);
    llmcl_tensor *tx = th_tensor_from(LLMCL_BF16, 3, shape, x);
    llmcl_tensor *tw = th_tensor_from(LLMCL_BF16, 1, &H, w);
    llmcl_tensor *ty = th_tensor(LLMCL_BF16, 3, shape);
    llmcl_tensor *trs = th_tensor(LLMCL_F32, 2, lead);
    TH_OK(llmcl_rmsnorm_forward(ctx, tx, tw, ty, trs, NULL));
    double y_ref[576], rs_ref[6], y[576];
    norm_ref_rmsnorm_fwd(x, NULL, NULL, w, y_ref, rs_ref, 6, 96, 1e-6, 0.0, 1, LLMCL_BF16);
    th_download(ty, y);
    TH_ASSERT_CLOSE("rmsnorm 3-d y", y_ref, y, 576, tol_for(LLMCL_BF16));
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tw), llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(trs);
    free(x), free(w);
}

/* Two backward runs give bitwise-identical dw (no atomics, fixed reduction order). */
static void test_rmsnorm_dw_deterministic(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(5);
    const int64_t n = 515, H = 256, shape[2] = {515, 256};
    double *x = th_new_normal(&rng, (size_t)(n * H), 1.0, LLMCL_F32);
    double *dy = th_new_normal(&rng, (size_t)(n * H), 1.0, LLMCL_F32);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, LLMCL_F32);
    llmcl_tensor *tx = th_tensor_from(LLMCL_F32, 2, shape, x);
    llmcl_tensor *tdy = th_tensor_from(LLMCL_F32, 2, shape, dy);
    llmcl_tensor *tw = th_tensor_from(LLMCL_F32, 1, &H, w);
    llmcl_tensor *ty = th_tensor(LLMCL_F32, 2, shape), *tdx = th_tensor(LLMCL_F32, 2, shape);
    llmcl_tensor *trs = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *dw1 = th_tensor(LLMCL_F32, 1, &H), *dw2 = th_tensor(LLMCL_F32, 1, &H);
    TH_OK(llmcl_rmsnorm_forward(ctx, tx, tw, ty, trs, NULL));
    TH_OK(llmcl_rmsnorm_backward(ctx, tdy, tx, tw, trs, tdx, dw1, NULL));
    TH_OK(llmcl_rmsnorm_backward(ctx, tdy, tx, tw, trs, tdx, dw2, NULL));
    float a[256], b[256];
    TH_OK(llmcl_tensor_download(dw1, a, sizeof a));
    TH_OK(llmcl_tensor_download(dw2, b, sizeof b));
    assert_memory_equal(a, b, sizeof a);
    llmcl_tensor_destroy(tx), llmcl_tensor_destroy(tdy), llmcl_tensor_destroy(tw);
    llmcl_tensor_destroy(ty), llmcl_tensor_destroy(tdx), llmcl_tensor_destroy(trs);
    llmcl_tensor_destroy(dw1), llmcl_tensor_destroy(dw2);
    free(x), free(dy), free(w);
}

/* ---- fused residual add + RMSNorm ---- */

typedef struct res_case {
    llmcl_dtype xdt, wdt;
    int64_t n, H, pad;
    llmcl_rmsnorm_casting cast;
    bool with_dr;
    int r_over;   /* forward: 0 r separate, 1 r over residual, 2 r over x */
    int drx_over; /* backward: 0 separate, 1 over dy, 2 over dr */
} res_case;

static void run_residual(const res_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(3000 + (uint64_t)c->H + (uint64_t)c->r_over);
    const int64_t n = c->n, H = c->H;
    const size_t N = (size_t)(n * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt), *res = th_new_normal(&rng, N, 1.0, c->xdt);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    double *dy = th_new_normal(&rng, N, 1.0, c->xdt), *dr = th_new_normal(&rng, N, 1.0, c->xdt);
    const int llama = c->cast == LLMCL_RMSNORM_CAST_LLAMA;
    const llmcl_rmsnorm_options o = {.casting = c->cast};

    act tx = act_from(c->xdt, n, H, c->pad, 0, x), tres = act_from(c->xdt, n, H, c->pad, 0, res);
    act tr = act_new(c->xdt, n, H, c->pad, 0), ty = act_new(c->xdt, n, H, c->pad, 0);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w);
    llmcl_tensor *trs = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *r_out = c->r_over == 1 ? tres.t : c->r_over == 2 ? tx.t : tr.t;
    TH_OK(llmcl_residual_rmsnorm_forward(ctx, tx.t, tres.t, tw, r_out, ty.t, trs, &o));

    double *r_ref = th_alloc(N * sizeof(double)), *y_ref = th_alloc(N * sizeof(double));
    double *rs_ref = th_alloc((size_t)n * sizeof(double));
    norm_ref_rmsnorm_fwd(x, res, r_ref, w, y_ref, rs_ref, n, H, 1e-6, 0.0, llama, c->xdt);
    double *r = get(r_out, N), *y = get(ty.t, N), *rs = get(trs, (size_t)n);
    TH_ASSERT_CLOSE("residual r", r_ref, r, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("residual y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("residual rstd", rs_ref, rs, (size_t)n, tol_for(LLMCL_F32));

    act tdy = act_from(c->xdt, n, H, c->pad, 0, dy), tdr = act_from(c->xdt, n, H, c->pad, 0, dr);
    act tdrx = act_new(c->xdt, n, H, c->pad, 0);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H);
    llmcl_tensor *drx = c->drx_over == 1 ? tdy.t : c->drx_over == 2 ? tdr.t : tdrx.t;
    TH_OK(llmcl_residual_rmsnorm_backward(ctx, tdy.t, c->with_dr ? tdr.t : NULL, r_out, tw, trs,
                                          drx, tdw, &o));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_rmsnorm_bwd(dy, c->with_dr ? dr : NULL, r_ref, w, rs_ref, dx_ref, dw_ref, n, H, 0.0,
                         llama, c->xdt);
    double *dx = get(drx, N), *dw = get(tdw, (size_t)H);
    TH_ASSERT_CLOSE("residual drx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("residual dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, n));

    act_free(tx), act_free(tres), act_free(tr), act_free(ty);
    act_free(tdy), act_free(tdr), act_free(tdrx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw);
    free(x), free(res), free(w), free(dy), free(dr), free(r_ref), free(y_ref), free(rs_ref);
    free(r), free(y), free(rs), free(dx_ref), free(dw_ref), free(dx), free(dw);
}

static void test_residual_rmsnorm(void **state)
{
    (void)state;
    const res_case cs[] = {
        {LLMCL_BF16, LLMCL_BF16, 16, 1024, 0, LLAMA, true, 0, 0},
        {LLMCL_BF16, LLMCL_F32, 16, 1024, 0, GEMMA, false, 1, 1},
        {LLMCL_F32, LLMCL_F32, 9, 4097, 0, LLAMA, true, 2, 2},
        {LLMCL_F16, LLMCL_F16, 33, 7, 0, GEMMA, true, 1, 1},
        {LLMCL_F32, LLMCL_F32, 3, 40000, 0, GEMMA, true, 2, 0},
        {LLMCL_BF16, LLMCL_BF16, 4, 40008, 0, LLAMA, true, 2, 2},
        {LLMCL_F32, LLMCL_F32, 2, 66000, 0, GEMMA, true, 2, 1},
        {LLMCL_BF16, LLMCL_BF16, 2, 40003, 0, LLAMA, false, 1, 0},
        {LLMCL_BF16, LLMCL_BF16, 11, 520, 8, LLAMA, true, 1, 2},
        {LLMCL_F32, LLMCL_F32, 50, 1, 3, GEMMA, true, 0, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_residual(&cs[i]);
}

/* ---- LayerNorm ---- */

typedef struct ln_case {
    llmcl_dtype xdt, wdt;
    int64_t n, H, pad;
    bool bias, in_place;
} ln_case;

static void run_layernorm(const ln_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(5000 + (uint64_t)c->H * 3 + (uint64_t)c->n);
    const int64_t n = c->n, H = c->H;
    const size_t N = (size_t)(n * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt);
    for (size_t i = 0; i < N; ++i) /* a row mean well away from zero tests the two-pass variance */
        x[i] = th_round(c->xdt, x[i] + 3.0);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    double *b = th_new_uniform(&rng, (size_t)H, -1.0, 1.0, c->wdt);
    double *dy = th_new_normal(&rng, N, 1.0, c->xdt);

    act tx = act_from(c->xdt, n, H, c->pad, 0, x), ty = act_new(c->xdt, n, H, c->pad, 0);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w);
    llmcl_tensor *tb = c->bias ? th_tensor_from(c->wdt, 1, &H, b) : NULL;
    llmcl_tensor *tmu = th_tensor(LLMCL_F32, 1, &n), *trs = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_layernorm_forward(ctx, tx.t, tw, tb, ty.t, tmu, trs, NULL));

    double *y_ref = th_alloc(N * sizeof(double)), *mu_ref = th_alloc((size_t)n * sizeof(double));
    double *rs_ref = th_alloc((size_t)n * sizeof(double));
    norm_ref_layernorm_fwd(x, w, c->bias ? b : NULL, y_ref, mu_ref, rs_ref, n, H, 1e-5);
    double *y = get(ty.t, N), *mu = get(tmu, (size_t)n), *rs = get(trs, (size_t)n);
    TH_ASSERT_CLOSE("layernorm y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("layernorm mean", mu_ref, mu, (size_t)n, tol_for(LLMCL_F32));
    TH_ASSERT_CLOSE("layernorm rstd", rs_ref, rs, (size_t)n, tol_for(LLMCL_F32));

    act tdy = act_from(c->xdt, n, H, c->pad, 0, dy), tdx = act_new(c->xdt, n, H, c->pad, 0);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H);
    llmcl_tensor *tdb = c->bias ? th_tensor(c->wdt, 1, &H) : NULL;
    llmcl_tensor *dxt = c->in_place ? tdy.t : tdx.t;
    TH_OK(llmcl_layernorm_backward(ctx, tdy.t, tx.t, tw, tmu, trs, dxt, tdw, tdb));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    double *db_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_layernorm_bwd(dy, x, w, mu_ref, rs_ref, dx_ref, dw_ref, c->bias ? db_ref : NULL, n, H);
    double *dx = get(dxt, N), *dw = get(tdw, (size_t)H);
    TH_ASSERT_CLOSE("layernorm dx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("layernorm dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, n));
    if (c->bias) {
        double *db = get(tdb, (size_t)H);
        TH_ASSERT_CLOSE("layernorm db", db_ref, db, (size_t)H, tol_sum(c->xdt, c->wdt, n));
        free(db);
    }

    act_free(tx), act_free(ty), act_free(tdy), act_free(tdx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(tb), llmcl_tensor_destroy(tmu);
    llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw), llmcl_tensor_destroy(tdb);
    free(x), free(w), free(b), free(dy), free(y_ref), free(mu_ref), free(rs_ref), free(y);
    free(mu), free(rs), free(dx_ref), free(dw_ref), free(db_ref), free(dx), free(dw);
}

static void test_layernorm(void **state)
{
    (void)state;
    const ln_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 24, 1024, 0, true, false},
        {LLMCL_BF16, LLMCL_BF16, 24, 1024, 0, true, true},
        {LLMCL_BF16, LLMCL_F32, 24, 768, 0, false, false},
        {LLMCL_F16, LLMCL_F16, 24, 768, 0, true, false},
        {LLMCL_F32, LLMCL_F32, 300, 1, 0, true, false},
        {LLMCL_F32, LLMCL_F32, 33, 7, 0, false, true},
        {LLMCL_BF16, LLMCL_BF16, 6, 4097, 0, true, false},
        {LLMCL_F32, LLMCL_F32, 2, 40000, 0, true, false},
        {LLMCL_BF16, LLMCL_F32, 3, 40003, 0, false, false},
        {LLMCL_F32, LLMCL_F32, 9, 1028, 4, true, false},
        {LLMCL_BF16, LLMCL_BF16, 9, 515, 6, true, true},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_layernorm(&cs[i]);
}

/*
 * Backward on 16-byte-aligned rows (8-wide path) whose length is not a multiple of 4: the dw / db
 * partial rows must stay aligned too (NVIDIA faults on a misaligned 16-byte store; x86 does not).
 */
static void test_norm_bwd_aligned_odd_rows(void **state)
{
    (void)state;
    const rms_case rc[] = {
        {LLMCL_BF16, LLMCL_F32, 33, 1030, 10, 0, LLAMA, 0.0f, false},
        {LLMCL_F32, LLMCL_F32, 33, 1034, 2, 0, GEMMA, 1.0f, true},
    };
    for (size_t i = 0; i < 2; ++i)
        run_rms(&rc[i]);
    const res_case sc = {LLMCL_BF16, LLMCL_BF16, 33, 1030, 10, LLAMA, true, 0, 0};
    run_residual(&sc);
    const ln_case lc[] = {
        {LLMCL_BF16, LLMCL_BF16, 33, 1030, 10, true, false},
        {LLMCL_F32, LLMCL_F32, 33, 1030, 2, true, false},
    };
    for (size_t i = 0; i < 2; ++i)
        run_layernorm(&lc[i]);
}

/*
 * The weight gradients' second stage at shapes other than its default: lanes of four columns that
 * do not divide H (H % 4 == 2 and 3), slot lanes that do not divide the slots or outnumber them,
 * and LayerNorm's db summed in the same launch as dw.
 */
static void test_norm_dw_reduce_shapes(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *shapes[] = {"FX=1 FY=1", "FX=3 FY=5", "FX=16 FY=64"};
    const rms_case rc = {LLMCL_BF16, LLMCL_BF16, 37, 1030, 10, 0, LLAMA, 0.0f, false};
    const ln_case lc[] = {
        {LLMCL_BF16, LLMCL_F32, 37, 1031, 1, true, false},
        {LLMCL_F32, LLMCL_F32, 19, 7, 0, true, false},
    };
    for (size_t i = 0; i < 3; ++i) {
        TH_OK(llmcl_tune_override(ctx, "norm_dw_reduce", LLMCL_F32, "*", shapes[i]));
        TH_OK(llmcl_tune_override(ctx, "norm_dw_reduce", LLMCL_BF16, "*", shapes[i]));
        run_rms(&rc);
        run_layernorm(&lc[0]);
        run_layernorm(&lc[1]);
    }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
}

/*
 * Where the device cuts loops short (rusticl's llvmpipe: 65535 passes a work-item and launch), the
 * backward's row slots take few enough rows each (two slots a compute unit walked thousands of
 * rows, and dw came out short), and a row too long for one work-item's loops is refused. One
 * work-item a row on misaligned rows (scalar chunks) makes every row cost hundreds of passes at a
 * small size; on other devices the same cases run as they are.
 */
static void test_norm_loop_limit(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *one = "WG=1 ROWS=1 CACHE=1 GROUPS_PER_CU=1";
    TH_OK(llmcl_tune_override(ctx, "rmsnorm_fwd", LLMCL_F32, "*", "WG=1 ROWS=1 CACHE=1"));
    TH_OK(llmcl_tune_override(ctx, "rmsnorm_bwd", LLMCL_F32, "*", one));
    TH_OK(llmcl_tune_override(ctx, "layernorm_fwd", LLMCL_F32, "*", "WG=1 ROWS=1 CACHE=1"));
    TH_OK(llmcl_tune_override(ctx, "layernorm_bwd", LLMCL_F32, "*", one));
    const rms_case rc = {LLMCL_F32, LLMCL_F32, 8192, 512, 0, 1, GEMMA, 0.0f, false};
    run_rms(&rc);
    const ln_case lc = {LLMCL_F32, LLMCL_F32, 8192, 512, 1, true, false};
    run_layernorm(&lc);
    const rms_case row = {LLMCL_F32, LLMCL_F32, 1, 600000, 0, 0, GEMMA, 0.0f, false};
    if (!llmcl_ctx_device_info(ctx)->loop_limit) {
        run_rms(&row);
    } else {
        const int64_t H = row.H;
        llmcl_tensor *x = th_tensor(LLMCL_F32, 2, (const int64_t[2]){1, H});
        llmcl_tensor *y = th_tensor(LLMCL_F32, 2, (const int64_t[2]){1, H});
        llmcl_tensor *w = th_tensor(LLMCL_F32, 1, &H), *rs = th_tensor(LLMCL_F32, 1, &row.n);
        TH_FAILS(llmcl_rmsnorm_forward(ctx, x, w, y, rs, NULL), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(ctx), "H = 600000"));
        llmcl_tensor_destroy(x), llmcl_tensor_destroy(y), llmcl_tensor_destroy(w);
        llmcl_tensor_destroy(rs);
    }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    /* a limit of 3000 on any device, default geometry: about 95 rows a slot */
    th_loop_limit("3000");
    const rms_case rl = {LLMCL_BF16, LLMCL_F32, 2000, 1024, 0, 0, LLAMA, 1.0f, false};
    run_rms(&rl);
    const ln_case ll = {LLMCL_F32, LLMCL_F32, 2000, 1030, 2, true, false};
    run_layernorm(&ll);
    th_loop_limit(NULL);
}

/* ---- per-head rows: two levels of row strides ---- */

/*
 * Qwen3's q/k norm: rows of d are heads of a token inside a wider row (q, k and v side by side), so
 * a tensor is a [n, heads, d] view with strides (W, d, 1) of an [n, W] buffer: rows at t * W + h *
 * d. Every tensor of a call has its own buffer and W; w == 0 is contiguous ([n, heads * d]).
 */
typedef struct hl {
    int64_t w, col; /* the buffer's row width and the view's first column */
} hl;

typedef struct heads_case {
    llmcl_dtype xdt, wdt;
    int64_t n, heads, d;
    int64_t batch; /* > 1: a 4-D view [batch, n / batch, heads, d] of the same buffer */
    llmcl_rmsnorm_casting cast;
    float offset;
    hl x, res, r, y, dy, dr, dx; /* RMSNorm and LayerNorm use x, y, dy, dx */
} heads_case;

static int64_t hl_width(const heads_case *c, hl l) { return l.w ? l.w : c->heads * c->d; }

/* The view of l in a new poisoned buffer, holding v (or left poisoned when v is NULL). */
static act heads_act(const heads_case *c, hl l, const double *v)
{
    const int64_t W = hl_width(c, l), bshape[2] = {c->n, W};
    act a;
    a.base = th_tensor(c->xdt, 2, bshape);
    if (c->batch > 1) {
        const int64_t t = c->n / c->batch;
        const int64_t shape[4] = {c->batch, t, c->heads, c->d}, strides[4] = {t * W, W, c->d, 1};
        TH_OK(llmcl_tensor_view(a.base, 4, shape, strides, l.col, &a.t));
    } else {
        const int64_t shape[3] = {c->n, c->heads, c->d}, strides[3] = {W, c->d, 1};
        TH_OK(llmcl_tensor_view(a.base, 3, shape, strides, l.col, &a.t));
    }
    if (v)
        th_upload(a.t, v);
    return a;
}

/* Bytes of t's buffer (rows of W elements) not poison outside columns [col, col + len). */
static size_t unpoisoned(const llmcl_tensor *t, int64_t W, int64_t col, int64_t len)
{
    const size_t es = llmcl_dtype_size(llmcl_tensor_dtype(t));
    const size_t bytes = (size_t)llmcl_tensor_numel(t) * es;
    unsigned char *b = th_alloc(bytes);
    TH_OK(llmcl_tensor_download(t, b, bytes));
    size_t bad = 0;
    for (size_t i = 0; i < bytes; ++i) {
        const int64_t c = (int64_t)(i / es) % W;
        bad += (c < col || c >= col + len) && b[i] != 0xff;
    }
    free(b);
    return bad;
}

/* An output's padding between its rows is still poison: nothing wrote past a row's d elements. */
static void assert_pad_kept(const heads_case *c, const act *a, hl l, const char *what)
{
    const size_t bad = unpoisoned(a->base, hl_width(c, l), l.col, c->heads * c->d);
    if (bad)
        fprintf(stderr, "%s: %zu padding bytes written\n", what, bad);
    assert_int_equal(bad, 0);
}

static void run_heads_rms(const heads_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(7000 + (uint64_t)c->d * 5 + (uint64_t)c->n);
    const int64_t R = c->n * c->heads, H = c->d;
    const size_t N = (size_t)(R * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt), *dy = th_new_normal(&rng, N, 1.0, c->xdt);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    const int llama = c->cast == LLMCL_RMSNORM_CAST_LLAMA;
    const llmcl_rmsnorm_options o = {.eps = 1e-5f, .offset = c->offset, .casting = c->cast};

    act tx = heads_act(c, c->x, x), ty = heads_act(c, c->y, NULL);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w), *trs = th_tensor(LLMCL_F32, 1, &R);
    TH_OK(llmcl_rmsnorm_forward(ctx, tx.t, tw, ty.t, trs, &o));
    double *y_ref = th_alloc(N * sizeof(double)), *rs_ref = th_alloc((size_t)R * sizeof(double));
    norm_ref_rmsnorm_fwd(x, NULL, NULL, w, y_ref, rs_ref, R, H, 1e-5, c->offset, llama, c->xdt);
    double *y = get(ty.t, N), *rs = get(trs, (size_t)R);
    TH_ASSERT_CLOSE("heads rmsnorm y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads rmsnorm rstd", rs_ref, rs, (size_t)R, tol_for(LLMCL_F32));
    assert_pad_kept(c, &ty, c->y, "heads rmsnorm y");

    act tdy = heads_act(c, c->dy, dy), tdx = heads_act(c, c->dx, NULL);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H);
    TH_OK(llmcl_rmsnorm_backward(ctx, tdy.t, tx.t, tw, trs, tdx.t, tdw, &o));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_rmsnorm_bwd(dy, NULL, x, w, rs_ref, dx_ref, dw_ref, R, H, c->offset, llama, c->xdt);
    double *dx = get(tdx.t, N), *dw = get(tdw, (size_t)H);
    TH_ASSERT_CLOSE("heads rmsnorm dx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads rmsnorm dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, R));
    assert_pad_kept(c, &tdx, c->dx, "heads rmsnorm dx");

    act_free(tx), act_free(ty), act_free(tdy), act_free(tdx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw);
    free(x), free(dy), free(w), free(y_ref), free(rs_ref), free(y), free(rs);
    free(dx_ref), free(dw_ref), free(dx), free(dw);
}

/*
 * RMSNorm over per-head rows: x with a break between tokens (q, or k from column 80 of a row of
 * 200), y and dx in other buffers of other widths, dy contiguous; the vector path (16-byte
 * aligned rows at both levels) and the scalar one (an odd width, a tail of d % 8), the break
 * coming from outputs alone, a 4-D view whose batch and token axes merge, a size-1 axis, and
 * Qwen3-like sizes where a backward row slot walks rows across many tokens.
 */
static void test_rmsnorm_heads(void **state)
{
    (void)state;
    const heads_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 7, 3, 40, 0, LLAMA, 0.0f, .x = {200, 0}, .y = {136, 16},
         .dx = {136, 0}},
        {LLMCL_BF16, LLMCL_BF16, 7, 3, 40, 0, LLAMA, 0.0f, .x = {200, 80}, .y = {136, 0},
         .dx = {136, 8}},
        {LLMCL_BF16, LLMCL_F32, 7, 3, 36, 0, GEMMA, 1.0f, .x = {201, 1}, .y = {140, 0},
         .dy = {111, 3}, .dx = {137, 3}},
        {LLMCL_F32, LLMCL_F32, 9, 2, 40, 0, GEMMA, 0.0f, .y = {96, 8}, .dx = {88, 0}},
        {LLMCL_F32, LLMCL_F32, 8, 3, 40, 2, LLAMA, 0.0f, .x = {200, 0}, .dy = {128, 8},
         .dx = {136, 0}},
        {LLMCL_BF16, LLMCL_BF16, 7, 1, 40, 0, LLAMA, 0.0f, .x = {200, 0}, .dx = {136, 8}},
        {LLMCL_BF16, LLMCL_BF16, 300, 4, 128, 0, LLAMA, 0.0f, .x = {1024, 0}, .y = {1024, 512},
         .dy = {768, 256}, .dx = {1024, 0}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_heads_rms(&cs[i]);
}

static void run_heads_residual(const heads_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(8000 + (uint64_t)c->d + (uint64_t)c->n);
    const int64_t R = c->n * c->heads, H = c->d;
    const size_t N = (size_t)(R * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt), *res = th_new_normal(&rng, N, 1.0, c->xdt);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    double *dy = th_new_normal(&rng, N, 1.0, c->xdt), *dr = th_new_normal(&rng, N, 1.0, c->xdt);
    const int llama = c->cast == LLMCL_RMSNORM_CAST_LLAMA;
    const llmcl_rmsnorm_options o = {.casting = c->cast};

    act tx = heads_act(c, c->x, x), tres = heads_act(c, c->res, res);
    act tr = heads_act(c, c->r, NULL), ty = heads_act(c, c->y, NULL);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w), *trs = th_tensor(LLMCL_F32, 1, &R);
    TH_OK(llmcl_residual_rmsnorm_forward(ctx, tx.t, tres.t, tw, tr.t, ty.t, trs, &o));
    double *r_ref = th_alloc(N * sizeof(double)), *y_ref = th_alloc(N * sizeof(double));
    double *rs_ref = th_alloc((size_t)R * sizeof(double));
    norm_ref_rmsnorm_fwd(x, res, r_ref, w, y_ref, rs_ref, R, H, 1e-6, 0.0, llama, c->xdt);
    double *r = get(tr.t, N), *y = get(ty.t, N), *rs = get(trs, (size_t)R);
    TH_ASSERT_CLOSE("heads residual r", r_ref, r, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads residual y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads residual rstd", rs_ref, rs, (size_t)R, tol_for(LLMCL_F32));
    assert_pad_kept(c, &tr, c->r, "heads residual r");
    assert_pad_kept(c, &ty, c->y, "heads residual y");

    act tdy = heads_act(c, c->dy, dy), tdr = heads_act(c, c->dr, dr);
    act tdrx = heads_act(c, c->dx, NULL);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H);
    TH_OK(llmcl_residual_rmsnorm_backward(ctx, tdy.t, tdr.t, tr.t, tw, trs, tdrx.t, tdw, &o));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_rmsnorm_bwd(dy, dr, r_ref, w, rs_ref, dx_ref, dw_ref, R, H, 0.0, llama, c->xdt);
    double *dx = get(tdrx.t, N), *dw = get(tdw, (size_t)H);
    TH_ASSERT_CLOSE("heads residual drx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads residual dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, R));
    assert_pad_kept(c, &tdrx, c->dx, "heads residual drx");

    act_free(tx), act_free(tres), act_free(tr), act_free(ty);
    act_free(tdy), act_free(tdr), act_free(tdrx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw);
    free(x), free(res), free(w), free(dy), free(dr), free(r_ref), free(y_ref), free(rs_ref);
    free(r), free(y), free(rs), free(dx_ref), free(dw_ref), free(dx), free(dw);
}

/* The fused residual form with each of its seven activations in a layout of its own. */
static void test_residual_rmsnorm_heads(void **state)
{
    (void)state;
    const heads_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 7, 3, 40, 0, GEMMA, 0.0f, .x = {200, 0}, .r = {136, 0},
         .y = {136, 8}, .dr = {200, 40}, .dx = {136, 0}},
        {LLMCL_BF16, LLMCL_BF16, 7, 3, 40, 0, LLAMA, 0.0f, .x = {200, 80}, .res = {128, 0},
         .r = {136, 16}, .y = {144, 0}, .dy = {160, 40}, .dr = {200, 0}, .dx = {136, 0}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_heads_residual(&cs[i]);
}

static void run_heads_layernorm(const heads_case *c)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(9000 + (uint64_t)c->d + (uint64_t)c->n);
    const int64_t R = c->n * c->heads, H = c->d;
    const size_t N = (size_t)(R * H);
    double *x = th_new_normal(&rng, N, 1.0, c->xdt), *dy = th_new_normal(&rng, N, 1.0, c->xdt);
    for (size_t i = 0; i < N; ++i)
        x[i] = th_round(c->xdt, x[i] + 3.0);
    double *w = th_new_uniform(&rng, (size_t)H, 0.5, 1.5, c->wdt);
    double *b = th_new_uniform(&rng, (size_t)H, -1.0, 1.0, c->wdt);

    act tx = heads_act(c, c->x, x), ty = heads_act(c, c->y, NULL);
    llmcl_tensor *tw = th_tensor_from(c->wdt, 1, &H, w), *tb = th_tensor_from(c->wdt, 1, &H, b);
    llmcl_tensor *tmu = th_tensor(LLMCL_F32, 1, &R), *trs = th_tensor(LLMCL_F32, 1, &R);
    TH_OK(llmcl_layernorm_forward(ctx, tx.t, tw, tb, ty.t, tmu, trs, NULL));
    double *y_ref = th_alloc(N * sizeof(double)), *mu_ref = th_alloc((size_t)R * sizeof(double));
    double *rs_ref = th_alloc((size_t)R * sizeof(double));
    norm_ref_layernorm_fwd(x, w, b, y_ref, mu_ref, rs_ref, R, H, 1e-5);
    double *y = get(ty.t, N), *mu = get(tmu, (size_t)R), *rs = get(trs, (size_t)R);
    TH_ASSERT_CLOSE("heads layernorm y", y_ref, y, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads layernorm mean", mu_ref, mu, (size_t)R, tol_for(LLMCL_F32));
    TH_ASSERT_CLOSE("heads layernorm rstd", rs_ref, rs, (size_t)R, tol_for(LLMCL_F32));
    assert_pad_kept(c, &ty, c->y, "heads layernorm y");

    act tdy = heads_act(c, c->dy, dy), tdx = heads_act(c, c->dx, NULL);
    llmcl_tensor *tdw = th_tensor(c->wdt, 1, &H), *tdb = th_tensor(c->wdt, 1, &H);
    TH_OK(llmcl_layernorm_backward(ctx, tdy.t, tx.t, tw, tmu, trs, tdx.t, tdw, tdb));
    double *dx_ref = th_alloc(N * sizeof(double)), *dw_ref = th_alloc((size_t)H * sizeof(double));
    double *db_ref = th_alloc((size_t)H * sizeof(double));
    norm_ref_layernorm_bwd(dy, x, w, mu_ref, rs_ref, dx_ref, dw_ref, db_ref, R, H);
    double *dx = get(tdx.t, N), *dw = get(tdw, (size_t)H), *db = get(tdb, (size_t)H);
    TH_ASSERT_CLOSE("heads layernorm dx", dx_ref, dx, N, tol_for(c->xdt));
    TH_ASSERT_CLOSE("heads layernorm dw", dw_ref, dw, (size_t)H, tol_sum(c->xdt, c->wdt, R));
    TH_ASSERT_CLOSE("heads layernorm db", db_ref, db, (size_t)H, tol_sum(c->xdt, c->wdt, R));
    assert_pad_kept(c, &tdx, c->dx, "heads layernorm dx");

    act_free(tx), act_free(ty), act_free(tdy), act_free(tdx);
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(tb), llmcl_tensor_destroy(tmu);
    llmcl_tensor_destroy(trs), llmcl_tensor_destroy(tdw), llmcl_tensor_destroy(tdb);
    free(x), free(dy), free(w), free(b), free(y_ref), free(mu_ref), free(rs_ref), free(y);
    free(mu), free(rs), free(dx_ref), free(dw_ref), free(db_ref), free(dx), free(dw), free(db);
}

static void test_layernorm_heads(void **state)
{
    (void)state;
    const heads_case cs[] = {
        {LLMCL_F32, LLMCL_F32, 7, 3, 40, 0, LLAMA, 0.0f, .x = {200, 0}, .y = {136, 8},
         .dx = {136, 0}},
        {LLMCL_BF16, LLMCL_BF16, 7, 3, 40, 0, LLAMA, 0.0f, .x = {200, 80}, .y = {136, 0},
         .dx = {136, 16}},
        {LLMCL_BF16, LLMCL_F32, 8, 3, 36, 2, LLAMA, 0.0f, .x = {201, 1}, .dy = {111, 3},
         .dx = {137, 3}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; ++i)
        run_heads_layernorm(&cs[i]);
}

/*
 * Views whose rows need three levels of strides are refused before anything runs: a 4-D view with
 * padding after both its batch and token axes, and two views with one break each at different
 * axes. Outputs (and their padding) stay poisoned.
 */
static void test_norm_heads_three_levels(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t shape[4] = {2, 4, 3, 40}, H = 40, R = 24, W = 200, len = 2 * (4 * W + 64);
    double *v = th_alloc(24 * 40 * sizeof(double));
    for (int i = 0; i < 24 * 40; ++i)
        v[i] = (double)(i % 13) - 6.0;
    /* breaks after axes 0 and 1; breaks after axis 1 alone; after axis 0 alone */
    const int64_t s01[4] = {4 * W + 64, W, 40, 1}, s1[4] = {4 * W, W, 40, 1};
    const int64_t s0[4] = {4 * 120 + 8, 120, 40, 1};
    llmcl_tensor *bx = th_tensor(LLMCL_F32, 1, &len), *by = th_tensor(LLMCL_F32, 1, &len);
    llmcl_tensor *bdx = th_tensor(LLMCL_F32, 1, &len), *c = th_tensor(LLMCL_F32, 4, shape);
    llmcl_tensor *x3 = NULL, *x1 = NULL, *y0 = NULL, *y3 = NULL, *dx3 = NULL, *dx0 = NULL;
    TH_OK(llmcl_tensor_view(bx, 4, shape, s01, 0, &x3));
    TH_OK(llmcl_tensor_view(bx, 4, shape, s1, 0, &x1));
    TH_OK(llmcl_tensor_view(by, 4, shape, s0, 0, &y0));
    TH_OK(llmcl_tensor_view(by, 4, shape, s01, 0, &y3));
    TH_OK(llmcl_tensor_view(bdx, 4, shape, s01, 0, &dx3));
    TH_OK(llmcl_tensor_view(bdx, 4, shape, s0, 0, &dx0));
    th_upload(x1, v);
    th_upload(c, v);
    llmcl_tensor *w = th_tensor_from(LLMCL_F32, 1, &H, v), *rs = th_tensor(LLMCL_F32, 1, &R);
    llmcl_tensor *mu = th_tensor(LLMCL_F32, 1, &R), *dw = th_tensor(LLMCL_F32, 1, &H);

#define REFUSED(call)                                                                             \
    do {                                                                                          \
        TH_FAILS(call, LLMCL_ERROR_INVALID_ARGUMENT);                                             \
        assert_non_null(strstr(llmcl_last_error(ctx), "three levels"));                           \
    } while (0)
    REFUSED(llmcl_rmsnorm_forward(ctx, x3, w, c, rs, NULL));
    REFUSED(llmcl_rmsnorm_forward(ctx, x1, w, y0, rs, NULL));
    REFUSED(llmcl_rmsnorm_forward(ctx, c, w, y3, rs, NULL));
    REFUSED(llmcl_residual_rmsnorm_forward(ctx, x1, c, w, dx0, y0, rs, NULL));
    REFUSED(llmcl_layernorm_forward(ctx, x1, w, NULL, y0, mu, rs, NULL));
    REFUSED(llmcl_rmsnorm_backward(ctx, c, x1, w, rs, dx3, dw, NULL));
    REFUSED(llmcl_rmsnorm_backward(ctx, c, x1, w, rs, dx0, dw, NULL));
    REFUSED(llmcl_residual_rmsnorm_backward(ctx, c, x1, c, w, rs, dx0, dw, NULL));
    REFUSED(llmcl_layernorm_backward(ctx, x1, c, w, mu, rs, dx0, dw, NULL));
#undef REFUSED
    llmcl_tensor *outs[] = {by, bdx, rs, mu, dw};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i)
        assert_int_equal(unpoisoned(outs[i], 1, 0, 0), 0);

    llmcl_tensor *all[] = {bx, by, bdx, c, x3, x1, y0, y3, dx3, dx0, w, rs, mu, dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
    free(v);
}

/* ---- rejected arguments ---- */

static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(9);
    const int64_t n = 4, H = 16, shape[2] = {4, 16}, H2 = 17, n2 = 5, bigshape[2] = {4, 17};
    double *x = th_new_normal(&rng, 64, 1.0, LLMCL_BF16);
    llmcl_tensor *tx = th_tensor_from(LLMCL_BF16, 2, shape, x);
    llmcl_tensor *tw = th_tensor_from(LLMCL_BF16, 1, &H, x);
    llmcl_tensor *ty = th_tensor(LLMCL_BF16, 2, shape), *tdx = th_tensor(LLMCL_BF16, 2, shape);
    llmcl_tensor *y32 = th_tensor(LLMCL_F32, 2, shape), *ybig = th_tensor(LLMCL_BF16, 2, bigshape);
    llmcl_tensor *rs = th_tensor(LLMCL_F32, 1, &n), *rs5 = th_tensor(LLMCL_F32, 1, &n2);
    llmcl_tensor *rs16 = th_tensor(LLMCL_BF16, 1, &n), *w17 = th_tensor(LLMCL_BF16, 1, &H2);
    llmcl_tensor *w16 = th_tensor(LLMCL_F16, 1, &H), *dw = th_tensor(LLMCL_BF16, 1, &H);
    llmcl_tensor *dw32 = th_tensor(LLMCL_F32, 1, &H), *xi = th_tensor(LLMCL_I32, 2, shape);
    llmcl_tensor *mu = th_tensor(LLMCL_F32, 1, &n);
    const int64_t n3 = 3;
    llmcl_tensor *rs3 = th_tensor(LLMCL_F32, 1, &n3);
    /* A view overlapping x by half a row, and a strided weight. */
    llmcl_tensor *xtop = NULL, *xshift = NULL, *wstrided = NULL, *wbase = NULL;
    TH_OK(llmcl_tensor_view(tx, 2, (const int64_t[]){3, 16}, NULL, 0, &xtop));
    TH_OK(llmcl_tensor_view(tx, 2, (const int64_t[]){3, 16}, NULL, 8, &xshift));
    const int64_t wb = 32;
    wbase = th_tensor(LLMCL_BF16, 1, &wb);
    TH_OK(llmcl_tensor_view(wbase, 1, &H, (const int64_t[]){2}, 0, &wstrided));
    const llmcl_status INV = LLMCL_ERROR_INVALID_ARGUMENT, SHP = LLMCL_ERROR_SHAPE_MISMATCH,
                       DT = LLMCL_ERROR_UNSUPPORTED_DTYPE;

    TH_FAILS(llmcl_rmsnorm_forward(NULL, tx, tw, ty, rs, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, NULL, tw, ty, rs, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, NULL, ty, rs, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, NULL, rs, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ty, NULL, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, xi, tw, ty, rs, NULL), DT);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, y32, rs, NULL), DT);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ybig, rs, NULL), SHP);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, w17, ty, rs, NULL), SHP);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, w16, ty, rs, NULL), DT);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, wstrided, ty, rs, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ty, rs5, NULL), SHP);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ty, rs16, NULL), DT);
    const llmcl_rmsnorm_options neg = {.eps = -1.0f}, badcast = {.casting = 7};
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ty, rs, &neg), INV);
    TH_FAILS(llmcl_rmsnorm_forward(ctx, tx, tw, ty, rs, &badcast), INV);
    /* y overlapping x without being x: rejected before anything runs, x left intact. */
    TH_FAILS(llmcl_rmsnorm_forward(ctx, xtop, tw, xshift, rs3, NULL), INV);
    double after[64];
    th_download(tx, after);
    assert_memory_equal(after, x, sizeof after);

    TH_FAILS(llmcl_rmsnorm_backward(ctx, tx, tx, tw, rs, tdx, NULL, NULL), INV);
    TH_FAILS(llmcl_rmsnorm_backward(ctx, tx, tx, tw, rs, tdx, dw32, NULL), DT);
    TH_FAILS(llmcl_rmsnorm_backward(ctx, tx, tx, tw, rs, tx, dw, NULL), INV); /* dx over x */
    TH_FAILS(llmcl_rmsnorm_backward(ctx, tx, ybig, tw, rs, tdx, dw, NULL), SHP);
    TH_FAILS(llmcl_rmsnorm_backward(ctx, tx, tx, tw, rs, tdx, w17, NULL), SHP);

    TH_FAILS(llmcl_residual_rmsnorm_forward(ctx, tx, NULL, tw, ty, tdx, rs, NULL), INV);
    TH_FAILS(llmcl_residual_rmsnorm_forward(ctx, tx, ty, tw, NULL, tdx, rs, NULL), INV);
    TH_FAILS(llmcl_residual_rmsnorm_forward(ctx, tx, y32, tw, ty, tdx, rs, NULL), DT);
    TH_FAILS(llmcl_residual_rmsnorm_forward(ctx, tx, ty, tw, tdx, tdx, rs, NULL), INV); /* r = y */
    TH_FAILS(llmcl_residual_rmsnorm_backward(ctx, tx, ybig, ty, tw, rs, tdx, dw, NULL), SHP);
    TH_FAILS(llmcl_residual_rmsnorm_backward(ctx, tx, ty, ty, tw, rs, ty, dw, NULL), INV);

    TH_FAILS(llmcl_layernorm_forward(ctx, tx, tw, w17, ty, mu, rs, NULL), SHP);
    TH_FAILS(llmcl_layernorm_forward(ctx, tx, tw, NULL, ty, NULL, rs, NULL), INV);
    TH_FAILS(llmcl_layernorm_forward(ctx, tx, tw, NULL, ty, rs, rs, NULL), INV); /* mean = rstd */
    TH_FAILS(llmcl_layernorm_forward(ctx, tx, tw, w16, ty, mu, rs, NULL), DT);
    TH_FAILS(llmcl_layernorm_backward(ctx, tx, tx, tw, mu, rs, tdx, dw, dw), INV); /* db = dw */
    TH_FAILS(llmcl_layernorm_backward(ctx, tx, tx, tw, mu, rs5, tdx, dw, NULL), SHP);
    TH_FAILS(llmcl_layernorm_backward(ctx, tx, tx, tw, mu, rs, tdx, dw32, NULL), DT);

    llmcl_tensor *all[] = {tx, tw, ty, tdx, y32, ybig, rs, rs5, rs16, w17, w16, dw, dw32, xi, mu,
                           rs3, xtop, xshift, wstrided, wbase};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_dtypes),
        cmocka_unit_test(test_rmsnorm_row_lengths),
        cmocka_unit_test(test_rmsnorm_strided),
        cmocka_unit_test(test_rmsnorm_long_rows),
        cmocka_unit_test(test_rmsnorm_in_place),
        cmocka_unit_test(test_rmsnorm_llama_cast_bits),
        cmocka_unit_test(test_rmsnorm_3d_defaults),
        cmocka_unit_test(test_rmsnorm_dw_deterministic),
        cmocka_unit_test(test_residual_rmsnorm),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_norm_bwd_aligned_odd_rows),
        cmocka_unit_test(test_norm_dw_reduce_shapes),
        cmocka_unit_test(test_norm_loop_limit),
        cmocka_unit_test(test_rmsnorm_heads),
        cmocka_unit_test(test_residual_rmsnorm_heads),
        cmocka_unit_test(test_layernorm_heads),
        cmocka_unit_test(test_norm_heads_three_levels),
        cmocka_unit_test(test_bad_inputs),
    };
    return TH_RUN(tests);
}
