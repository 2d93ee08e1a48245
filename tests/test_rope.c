/*
 * test_rope.c: llmcl_rope_forward / llmcl_rope_backward against the double reference in
 * ref/rope_ref.c: both styles and layouts, GQA (Hq != Hk, k absent), every angle source
 * (shared and per-batch tables, shared i32 and per-batch i64 positions, Llama 3 scaling), partial
 * rotary, padded strides and packed QKV views, odd sizes, large positions, and bad inputs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rope_ref.h"

static const llmcl_dtype DTYPES[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};

enum src { SRC_TABLE, SRC_TABLE_BATCH, SRC_POS_I32, SRC_POS_I64_BATCH };

typedef struct rope_case {
    int64_t B, Hq, Hk, T, D, rd; /* Hk 0: no k */
    llmcl_rope_layout layout;
    llmcl_rope_style style;
    enum src src;
    double theta;
    rope_ref_llama3 l3;
    int64_t pad; /* extra elements per D row in the storage (strided views, gaps checked) */
} rope_case;

/*
 * A q or k tensor in the case's layout: contiguous, or with pad each row of D a view into a
 * larger poisoned buffer whose gaps must stay untouched.
 */
typedef struct qk {
    llmcl_tensor *base, *t;
    int64_t dims[4]; /* tensor shape in its layout */
    int64_t total;
} qk;

static void dims_of(const rope_case *c, int64_t H, int64_t dims[4])
{
    dims[0] = c->B;
    dims[1] = c->layout == LLMCL_ROPE_BHTD ? H : c->T;
    dims[2] = c->layout == LLMCL_ROPE_BHTD ? c->T : H;
    dims[3] = c->D;
}

/* Between [B, H, T, D] order (the reference's) and the layout's order, both contiguous. */
static void relayout(const rope_case *c, int64_t H, const double *src, double *dst, bool to_layout)
{
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < c->T; ++t) {
                const int64_t bhtd = ((b * H + h) * c->T + t) * c->D;
                const int64_t lay =
                    c->layout == LLMCL_ROPE_BHTD ? bhtd : ((b * c->T + t) * H + h) * c->D;
                const double *s = src + (to_layout ? bhtd : lay);
                double *d = dst + (to_layout ? lay : bhtd);
                memcpy(d, s, (size_t)c->D * sizeof(double));
            }
}

static qk qk_new(llmcl_dtype dt, const rope_case *c, int64_t H, const double *bhtd)
{
    qk m = {0};
    dims_of(c, H, m.dims);
    const size_t n = (size_t)(c->B * H * c->T * c->D);
    double *lay = th_alloc(n * sizeof(double));
    relayout(c, H, bhtd, lay, true);
    if (c->pad == 0) {
        m.t = th_tensor(dt, 4, m.dims);
    } else {
        const int64_t dp = c->D + c->pad;
        m.total = m.dims[0] * m.dims[1] * m.dims[2] * dp;
        m.base = th_tensor(dt, 1, &m.total);
        const int64_t strides[4] = {m.dims[1] * m.dims[2] * dp, m.dims[2] * dp, dp, 1};
        TH_OK(llmcl_tensor_view(m.base, 4, m.dims, strides, 0, &m.t));
    }
    th_upload(m.t, lay);
    free(lay);
    return m;
}

static void qk_read(const qk *m, const rope_case *c, int64_t H, double *bhtd)
{
    const size_t n = (size_t)(c->B * H * c->T * c->D);
    double *lay = th_alloc(n * sizeof(double));
    th_download(m->t, lay);
    relayout(c, H, lay, bhtd, false);
    free(lay);
}

static void qk_check_gaps(const qk *m, const rope_case *c)
{
    if (!m->base)
        return;
    double *all = th_alloc((size_t)m->total * sizeof(double));
    th_download(m->base, all);
    size_t touched = 0;
    for (int64_t j = 0; j < m->total; ++j)
        if (j % (c->D + c->pad) >= c->D && !isnan(all[j]))
            ++touched;
    free(all);
    assert_int_equal(touched, 0);
}

static void qk_free(qk *m)
{
    llmcl_tensor_destroy(m->t);
    llmcl_tensor_destroy(m->base);
}

/* Angles in f32 accumulate |pos| * 2^-23 of error; outputs are O(1) here. */
static th_tol rope_tol(llmcl_dtype dt, const rope_case *c)
{
    th_tol t = th_tol_for(dt);
    if (c->src >= SRC_POS_I32) {
        const double max_pos = 2.0 * (double)c->T + 5.0;
        t.atol = fmax(t.atol, 16.0 * max_pos * 1.2e-7);
    }
    t.atol = fmax(t.atol, dt == LLMCL_F32 ? 2e-6 : 0.0);
    return t;
}

/* Builds the angle source for the case, in opt and in the reference's tables. */
typedef struct angles {
    llmcl_tensor *cos, *sin, *pos;
    double *rcos, *rsin; /* [B, T, pairs] */
} angles;

static angles angles_new(const rope_case *c, uint64_t seed, llmcl_rope_options *opt)
{
    angles a = {0};
    const int64_t pairs = c->rd / 2, bt = c->B * c->T;
    a.rcos = th_alloc((size_t)(bt * pairs) * sizeof(double));
    a.rsin = th_alloc((size_t)(bt * pairs) * sizeof(double));
    th_rng r = th_rng_new(seed);
    double *pos = th_alloc((size_t)bt * sizeof(double));
    const bool per_batch = c->src == SRC_TABLE_BATCH || c->src == SRC_POS_I64_BATCH;
    /* shared: 0..T-1 shifted by a few; per batch: a random offset per batch (packed sequences) */
    for (int64_t b = 0; b < c->B; ++b) {
        const int64_t shift = per_batch ? th_randint(&r, 0, c->T + 5) : 3;
        for (int64_t t = 0; t < c->T; ++t)
            pos[b * c->T + t] = (double)(t + shift);
    }
    double *inv = th_alloc((size_t)pairs * sizeof(double));
    rope_ref_inv_freq(inv, c->rd, c->theta, &c->l3);
    rope_ref_tables(a.rcos, a.rsin, pos, bt, inv, pairs, c->src >= SRC_POS_I32);

    memset(opt, 0, sizeof *opt);
    opt->layout = c->layout;
    opt->style = c->style;
    opt->rotary_dim = c->rd == c->D ? 0 : c->rd;
    if (c->src == SRC_TABLE || c->src == SRC_TABLE_BATCH) {
        /* tables are f32: the reference uses exactly what the device reads */
        th_round_all(LLMCL_F32, a.rcos, (size_t)(bt * pairs));
        th_round_all(LLMCL_F32, a.rsin, (size_t)(bt * pairs));
        const int64_t s3[3] = {c->B, c->T, pairs};
        const int nd = per_batch ? 3 : 2;
        a.cos = th_tensor_from(LLMCL_F32, nd, per_batch ? s3 : s3 + 1, a.rcos);
        a.sin = th_tensor_from(LLMCL_F32, nd, per_batch ? s3 : s3 + 1, a.rsin);
        opt->cos = a.cos;
        opt->sin = a.sin;
        if (!per_batch) /* the reference indexes [B, T, pairs]: repeat the shared table */
            for (int64_t b = 1; b < c->B; ++b) {
                memcpy(a.rcos + b * c->T * pairs, a.rcos, (size_t)(c->T * pairs) * sizeof(double));
                memcpy(a.rsin + b * c->T * pairs, a.rsin, (size_t)(c->T * pairs) * sizeof(double));
            }
    } else {
        const int64_t s2[2] = {c->B, c->T};
        a.pos = per_batch ? th_tensor_from(LLMCL_I64, 2, s2, pos)
                          : th_tensor_from(LLMCL_I32, 1, s2 + 1, pos);
        opt->positions = a.pos;
        opt->theta = c->theta == 10000.0 ? 0.0 : c->theta;
        opt->llama3_factor = c->l3.factor;
        opt->llama3_low_freq_factor = c->l3.low_freq_factor;
        opt->llama3_high_freq_factor = c->l3.high_freq_factor;
        opt->llama3_original_max_position = c->l3.original_max_position;
    }
    free(pos);
    free(inv);
    return a;
}

static void angles_free(angles *a)
{
    llmcl_tensor_destroy(a->cos);
    llmcl_tensor_destroy(a->sin);
    llmcl_tensor_destroy(a->pos);
    free(a->rcos);
    free(a->rsin);
}

/* Forward against the reference, then backward, which must undo it. */
static void run_case(llmcl_dtype dt, const rope_case *c, uint64_t seed)
{
    llmcl_ctx *ctx = th_ctx();
    const size_t nq = (size_t)(c->B * c->Hq * c->T * c->D);
    const size_t nk = (size_t)(c->B * c->Hk * c->T * c->D);
    double *q = th_alloc(nq * sizeof(double)), *k = th_alloc((nk + 1) * sizeof(double));
    double *rq = th_alloc(nq * sizeof(double)), *rk = th_alloc((nk + 1) * sizeof(double));
    double *gq = th_alloc(nq * sizeof(double)), *gk = th_alloc((nk + 1) * sizeof(double));
    th_rng r = th_rng_new(seed);
    th_fill_uniform(&r, q, nq, -2.0, 2.0);
    th_fill_uniform(&r, k, nk, -2.0, 2.0);
    th_round_all(dt, q, nq);
    th_round_all(dt, k, nk);

    llmcl_rope_options opt;
    angles a = angles_new(c, seed + 1, &opt);
    qk tq = qk_new(dt, c, c->Hq, q), tk = {0};
    if (c->Hk)
        tk = qk_new(dt, c, c->Hk, k);

    memcpy(rq, q, nq * sizeof(double));
    memcpy(rk, k, nk * sizeof(double));
    const int interleaved = c->style == LLMCL_ROPE_INTERLEAVED;
    rope_ref_apply(rq, c->B, c->Hq, c->T, c->D, c->rd, interleaved, a.rcos, a.rsin, 1, 0);
    rope_ref_apply(rk, c->B, c->Hk, c->T, c->D, c->rd, interleaved, a.rcos, a.rsin, 1, 0);
    TH_OK(llmcl_rope_forward(ctx, tq.t, c->Hk ? tk.t : NULL, &opt));
    qk_read(&tq, c, c->Hq, gq);
    TH_ASSERT_CLOSE("rope forward q", rq, gq, nq, rope_tol(dt, c));
    if (c->Hk) {
        qk_read(&tk, c, c->Hk, gk);
        TH_ASSERT_CLOSE("rope forward k", rk, gk, nk, rope_tol(dt, c));
    }
    /* partial rotary: the elements past rotary_dim are bit-for-bit the inputs */
    size_t changed = 0;
    for (size_t i = 0; i < nq; ++i)
        if ((int64_t)(i % (size_t)c->D) >= c->rd && gq[i] != q[i])
            ++changed;
    assert_int_equal(changed, 0);

    /* backward on the device's own output: against the reference inverse of that output */
    memcpy(rq, gq, nq * sizeof(double));
    rope_ref_apply(rq, c->B, c->Hq, c->T, c->D, c->rd, interleaved, a.rcos, a.rsin, 1, 1);
    TH_OK(llmcl_rope_backward(ctx, tq.t, c->Hk ? tk.t : NULL, &opt));
    qk_read(&tq, c, c->Hq, gq);
    TH_ASSERT_CLOSE("rope backward dq", rq, gq, nq, rope_tol(dt, c));
    if (c->Hk) {
        memcpy(rk, gk, nk * sizeof(double));
        rope_ref_apply(rk, c->B, c->Hk, c->T, c->D, c->rd, interleaved, a.rcos, a.rsin, 1, 1);
        qk_read(&tk, c, c->Hk, gk);
        TH_ASSERT_CLOSE("rope backward dk", rk, gk, nk, rope_tol(dt, c));
        qk_check_gaps(&tk, c);
        qk_free(&tk);
    }
    qk_check_gaps(&tq, c);
    qk_free(&tq);
    angles_free(&a);
    free(q), free(k), free(rq), free(rk), free(gq), free(gk);
}

static const rope_ref_llama3 NO_L3 = {0};

/* Both styles, layouts and every angle source, in every dtype. */
static void test_sources_styles_layouts(void **state)
{
    (void)state;
    uint64_t seed = 1;
    for (size_t d = 0; d < 3; ++d)
        for (int layout = 0; layout < 2; ++layout)
            for (int style = 0; style < 2; ++style)
                for (int src = 0; src < 4; ++src) {
                    rope_case c = {
                        .B = 2, .Hq = 4, .Hk = 2, .T = 9, .D = 32, .rd = 32, .theta = 10000.0};
                    c.layout = (llmcl_rope_layout)layout;
                    c.style = (llmcl_rope_style)style;
                    c.src = (enum src)src;
                    run_case(DTYPES[d], &c, seed);
                    seed += 7;
                }
}

/*
 * Odd sizes: H = 1, 7 and 4097, T = 1, D small and odd-paired, k absent, partial rotary, huge D;
 * the head dims 8 and 16 of tiny models as llmcl-train rotates them (4 and 8 pairs, below the
 * default vector of 8 pairs at D = 8).
 */
static void test_shapes(void **state)
{
    (void)state;
    const rope_case cases[] = {
        {1, 1, 1, 1, 2, 2, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_TABLE, 10000.0, NO_L3, 0},
        {3, 7, 1, 5, 6, 6, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_POS_I32, 10000.0, NO_L3, 0},
        {2, 8, 2, 9, 8, 8, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_POS_I32, 10000.0, NO_L3, 0},
        {2, 4, 2, 9, 16, 16, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_POS_I32, 10000.0, NO_L3, 0},
        {1, 3, 1, 6, 8, 8, LLMCL_ROPE_BHTD, LLMCL_ROPE_INTERLEAVED, SRC_TABLE, 10000.0, NO_L3, 0},
        {2, 7, 0, 11, 64, 64, LLMCL_ROPE_BHTD, LLMCL_ROPE_INTERLEAVED, SRC_TABLE, 10000.0, NO_L3,
         0},
        {1, 5, 3, 4, 64, 24, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_TABLE_BATCH, 10000.0, NO_L3, 0},
        {2, 3, 3, 6, 40, 10, LLMCL_ROPE_BHTD, LLMCL_ROPE_INTERLEAVED, SRC_POS_I64_BATCH, 500000.0,
         NO_L3, 0},
        {1, 33, 7, 3, 128, 128, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_TABLE, 10000.0, NO_L3, 0},
        {2, 2, 1, 3, 4097 * 2, 4096, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_POS_I32, 10000.0, NO_L3,
         0},
        {1, 1, 4097, 2, 4, 4, LLMCL_ROPE_BTHD, LLMCL_ROPE_INTERLEAVED, SRC_TABLE, 10000.0, NO_L3,
         0},
        /* cos/sin of 2^18 pairs exceed half of any device's local memory: computed per item */
        {1, 1, 1, 2, 524290, 524288, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_POS_I32, 10000.0, NO_L3,
         0},
    };
    uint64_t seed = 1000;
    for (size_t d = 0; d < 3; ++d)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
            run_case(DTYPES[d], &cases[i], seed++);
}

/* Rows padded in storage (offsets and strides not multiples of the vector width, and multiples). */
static void test_strided(void **state)
{
    (void)state;
    const rope_case cases[] = {
        {2, 4, 2, 5, 32, 32, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_TABLE, 10000.0, NO_L3, 3},
        {2, 4, 2, 5, 32, 16, LLMCL_ROPE_BTHD, LLMCL_ROPE_INTERLEAVED, SRC_POS_I32, 10000.0, NO_L3,
         8},
        {1, 3, 1, 7, 16, 16, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_TABLE_BATCH, 10000.0, NO_L3, 1},
    };
    uint64_t seed = 2000;
    for (size_t d = 0; d < 3; ++d)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
            run_case(DTYPES[d], &cases[i], seed++);
}

/* Llama 3 frequency scaling: theta 500000 and rotary_dim 64 give wavelengths in all three bands. */
static void test_llama3(void **state)
{
    (void)state;
    const rope_ref_llama3 l3 = {8.0, 1.0, 4.0, 8192.0};
    const rope_ref_llama3 l3b = {32.0, 2.0, 8.0, 4096.0};
    const rope_case cases[] = {
        {2, 4, 2, 12, 64, 64, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_POS_I32, 500000.0, l3, 0},
        {2, 4, 2, 12, 64, 64, LLMCL_ROPE_BTHD, LLMCL_ROPE_INTERLEAVED, SRC_POS_I64_BATCH, 500000.0,
         l3b, 0},
    };
    double inv[32], plain[32];
    rope_ref_inv_freq(inv, 64, 500000.0, &l3);
    rope_ref_inv_freq(plain, 64, 500000.0, &NO_L3);
    int scaled = 0, kept = 0, between = 0;
    for (int i = 0; i < 32; ++i) {
        scaled += fabs(inv[i] - plain[i] / 8.0) < 1e-15 * plain[i];
        kept += inv[i] == plain[i];
        between += inv[i] < plain[i] && inv[i] > plain[i] / 8.0;
    }
    assert_true(scaled > 0 && kept > 0 && between > 0);
    uint64_t seed = 3000;
    for (size_t d = 0; d < 3; ++d)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
            run_case(DTYPES[d], &cases[i], seed++);
}

/*
 * Large positions need full argument reduction in sin/cos: with rotary_dim 2 inv_freq is exactly
 * 1, so the f32 angle is the position itself and the result is exact up to f32 rounding.
 */
static void test_large_positions(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t T = 64, shape[4] = {1, 1, T, 4};
    double x[4 * 64], ref[4 * 64], got[4 * 64], pos[64];
    th_rng r = th_rng_new(77);
    th_fill_uniform(&r, x, 4 * T, -1.0, 1.0);
    for (int64_t t = 0; t < T; ++t)
        pos[t] = (double)(16777216 - 1 - t * 104729);
    th_round_all(LLMCL_F32, x, 4 * T);
    llmcl_tensor *q = th_tensor_from(LLMCL_F32, 4, shape, x);
    llmcl_tensor *p = th_tensor_from(LLMCL_I64, 1, &T, pos);
    llmcl_rope_options opt = {0};
    opt.positions = p;
    opt.rotary_dim = 2;
    TH_OK(llmcl_rope_forward(ctx, q, NULL, &opt));
    th_download(q, got);
    memcpy(ref, x, sizeof ref);
    for (int64_t t = 0; t < T; ++t) {
        const double c = cos(pos[t]), s = sin(pos[t]);
        ref[t * 4] = x[t * 4] * c - x[t * 4 + 1] * s;
        ref[t * 4 + 1] = x[t * 4 + 1] * c + x[t * 4] * s;
    }
    TH_ASSERT_CLOSE("rope large positions", ref, got, 4 * (size_t)T, ((th_tol){1e-6, 1e-5}));
    llmcl_tensor_destroy(q);
    llmcl_tensor_destroy(p);
}

/* q and k as disjoint head ranges of one packed [B, T, Hq + 2 Hk, D] QKV buffer; v untouched. */
static void test_packed_qkv(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    for (int layout = 0; layout < 2; ++layout) {
        const int64_t B = 2, T = 5, Hq = 4, Hk = 2, Ht = Hq + 2 * Hk, D = 16;
        /* BTHD: [B, T, Ht, D]; BHTD: [B, Ht, T, D] */
        const int64_t full[4] = {B, layout ? T : Ht, layout ? Ht : T, D};
        const size_t n = (size_t)(B * T * Ht * D);
        double *x = th_alloc(n * sizeof(double)), *got = th_alloc(n * sizeof(double));
        th_rng r = th_rng_new(555 + (uint64_t)layout);
        th_fill_uniform(&r, x, n, -1.0, 1.0);
        th_round_all(LLMCL_BF16, x, n);
        llmcl_tensor *qkv = th_tensor_from(LLMCL_BF16, 4, full, x), *q, *k, *kq;
        const int64_t st[4] = {full[1] * full[2] * D, full[2] * D, D, 1};
        const int64_t hs = layout ? D : T * D; /* head stride */
        const int64_t qs[4] = {B, layout ? T : Hq, layout ? Hq : T, D};
        const int64_t ks[4] = {B, layout ? T : Hk, layout ? Hk : T, D};
        TH_OK(llmcl_tensor_view(qkv, 4, qs, st, 0, &q));
        TH_OK(llmcl_tensor_view(qkv, 4, ks, st, Hq * hs, &k));
        TH_OK(llmcl_tensor_view(qkv, 4, ks, st, (Hq - 1) * hs, &kq)); /* shares q's last head */
        const int64_t s1 = T;
        double pos[5] = {0, 1, 2, 3, 4};
        llmcl_tensor *p = th_tensor_from(LLMCL_I32, 1, &s1, pos);
        llmcl_rope_options opt = {0};
        opt.layout = layout ? LLMCL_ROPE_BTHD : LLMCL_ROPE_BHTD;
        opt.positions = p;
        TH_FAILS(llmcl_rope_forward(ctx, q, kq, &opt), LLMCL_ERROR_INVALID_ARGUMENT);
        TH_OK(llmcl_rope_forward(ctx, q, k, &opt));
        th_download(qkv, got);

        /* reference on the whole buffer read as [B, Ht, T, D]: rotate heads < Hq + Hk */
        rope_case c = {.B = B, .Hq = Ht, .T = T, .D = D, .rd = D, .theta = 10000.0};
        c.layout = opt.layout;
        double *bhtd = th_alloc(n * sizeof(double)), *gb = th_alloc(n * sizeof(double));
        double inv[8], rc[5 * 8], rs[5 * 8];
        relayout(&c, Ht, x, bhtd, false);
        relayout(&c, Ht, got, gb, false);
        rope_ref_inv_freq(inv, D, 10000.0, NULL);
        rope_ref_tables(rc, rs, pos, T, inv, D / 2, 1);
        for (int64_t b = 0; b < B; ++b)
            rope_ref_apply(bhtd + b * Ht * T * D, 1, Hq + Hk, T, D, D, 0, rc, rs, 0, 0);
        TH_ASSERT_CLOSE("packed qkv (v untouched)", bhtd, gb, n, th_tol_for(LLMCL_BF16));
        llmcl_tensor_destroy(q), llmcl_tensor_destroy(k), llmcl_tensor_destroy(kq);
        llmcl_tensor_destroy(qkv), llmcl_tensor_destroy(p);
        free(x), free(got), free(bhtd), free(gb);
    }
}

/*
 * Tables as strided views: Hugging Face's [T, rotary_dim] tables (cat(freqs, freqs)) through a view
 * of their first half, and views whose row stride and offset are not multiples of the vector width
 * (the element-aligned table loads).
 */
static void run_table_view(llmcl_dtype dt, int64_t row_stride, int64_t offset, uint64_t seed)
{
    llmcl_ctx *ctx = th_ctx();
    enum { T = 6, D = 16, P = 8, H = 3 };
    const int64_t shape[4] = {1, H, T, D};
    double x[H * T * D], ref[H * T * D], got[H * T * D], pos[T], inv[P], rc[T * P], rs[T * P];
    const size_t nt = (size_t)(T * row_stride + offset);
    double *hc = th_alloc(nt * sizeof(double)), *hs = th_alloc(nt * sizeof(double));
    th_rng r = th_rng_new(seed);
    th_fill_uniform(&r, x, H * T * D, -1.0, 1.0);
    th_round_all(dt, x, H * T * D);
    for (int64_t t = 0; t < T; ++t)
        pos[t] = (double)t;
    rope_ref_inv_freq(inv, D, 10000.0, NULL);
    rope_ref_tables(rc, rs, pos, T, inv, P, 0);
    th_round_all(LLMCL_F32, rc, T * P);
    th_round_all(LLMCL_F32, rs, T * P);
    for (size_t i = 0; i < nt; ++i) /* what the view must not read */
        hc[i] = hs[i] = 7.0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < row_stride - offset % row_stride && i < 2 * P; ++i) {
            hc[offset + t * row_stride + i] = rc[t * P + i % P];
            hs[offset + t * row_stride + i] = rs[t * P + i % P];
        }
    const int64_t tn = (int64_t)nt, vs[2] = {T, P}, vst[2] = {row_stride, 1};
    llmcl_tensor *tc = th_tensor_from(LLMCL_F32, 1, &tn, hc),
                 *tsn = th_tensor_from(LLMCL_F32, 1, &tn, hs);
    llmcl_tensor *vc, *vsn, *q = th_tensor_from(dt, 4, shape, x);
    TH_OK(llmcl_tensor_view(tc, 2, vs, vst, offset, &vc));
    TH_OK(llmcl_tensor_view(tsn, 2, vs, vst, offset, &vsn));
    llmcl_rope_options opt = {0};
    opt.cos = vc;
    opt.sin = vsn;
    TH_OK(llmcl_rope_forward(ctx, q, NULL, &opt));
    th_download(q, got);
    memcpy(ref, x, sizeof ref);
    rope_ref_apply(ref, 1, H, T, D, D, 0, rc, rs, 0, 0);
    TH_ASSERT_CLOSE("rope with table views", ref, got, (size_t)(H * T * D), th_tol_for(dt));
    llmcl_tensor_destroy(vc), llmcl_tensor_destroy(vsn), llmcl_tensor_destroy(tc);
    llmcl_tensor_destroy(tsn), llmcl_tensor_destroy(q);
    free(hc), free(hs);
}

static void test_table_views(void **state)
{
    (void)state;
    uint64_t seed = 90;
    for (size_t d = 0; d < 3; ++d) {
        run_table_view(DTYPES[d], 16, 0, seed++); /* HF's [T, rotary_dim] */
        run_table_view(DTYPES[d], 11, 3, seed++); /* unaligned rows */
    }
}

/* Non-default tunables (as the tuner forces them): heads per item, vector widths, group sizes
 * smaller than one token's items (the slot loop), both item orders and the cache hints. */
static void test_tunables(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *params[] = {"HPT=1 VEC=1 WG=32 ORDER=0", "HPT=3 VEC=2 WG=64 ORDER=1 HINT=1",
                            "HPT=8 VEC=8 WG=128 ORDER=0 HINT=3", "HPT=16 VEC=4 WG=1 ORDER=1",
                            "HPT=2 VEC=8 WG=16 ORDER=1 HINT=3",
                            "HPT=4 VEC=4 WG=256 ORDER=1 HINT=2"};
    const rope_case cases[] = {
        {2, 5, 3, 7, 32, 32, LLMCL_ROPE_BHTD, LLMCL_ROPE_HALF, SRC_TABLE, 10000.0, NO_L3, 0},
        {2, 5, 3, 7, 64, 48, LLMCL_ROPE_BTHD, LLMCL_ROPE_INTERLEAVED, SRC_POS_I64_BATCH, 10000.0,
         NO_L3, 0},
    };
    uint64_t seed = 4000;
    for (size_t i = 0; i < sizeof params / sizeof params[0]; ++i)
        for (size_t d = 0; d < 2; ++d) {
            TH_OK(llmcl_tune_override(ctx, "rope", DTYPES[d], "*", params[i]));
            TH_OK(llmcl_tune_override(ctx, "rope_pos", DTYPES[d], "*", params[i]));
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c)
                run_case(DTYPES[d], &cases[c], seed++);
        }
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
}

/*
 * A loop limit of 100 on any device (rusticl's llvmpipe cuts loops at 65535): one work-item a
 * group over 60,000 tokens, whose grid the launcher then widens past its usual cap.
 */
static void test_loop_limit(void **state)
{
    (void)state;
    th_loop_limit("100");
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_override(ctx, "rope_pos", LLMCL_F32, "*", "HPT=1 VEC=1 WG=1 ORDER=0"));
    const rope_case c = {1, 1, 1, 60000, 4, 4, LLMCL_ROPE_BTHD, LLMCL_ROPE_HALF, SRC_POS_I32,
                         10000.0, NO_L3, 0};
    run_case(LLMCL_F32, &c, 4500);
    th_loop_limit(NULL);
}

/* Empty tensors (no tokens, or no q heads) are valid and launch nothing. */
static void test_empty(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t sq[4] = {2, 3, 0, 8}, sk[4] = {2, 1, 0, 8}, t0 = 0, T = 4;
    const int64_t sq2[4] = {2, 0, 4, 8}, sk2[4] = {2, 2, 4, 8};
    const double pos[4] = {0, 1, 2, 3};
    llmcl_tensor *q = th_tensor(LLMCL_BF16, 4, sq), *k = th_tensor(LLMCL_BF16, 4, sk);
    llmcl_tensor *q2 = th_tensor(LLMCL_BF16, 4, sq2), *k2 = th_tensor(LLMCL_BF16, 4, sk2);
    llmcl_tensor *p0 = th_tensor(LLMCL_I32, 1, &t0), *p = th_tensor_from(LLMCL_I32, 1, &T, pos);
    llmcl_rope_options o = {0};
    o.positions = p0;
    TH_OK(llmcl_rope_forward(ctx, q, k, &o));
    o.positions = p;
    TH_OK(llmcl_rope_forward(ctx, q2, NULL, &o));
    TH_OK(llmcl_rope_backward(ctx, q2, k2, &o));
    llmcl_tensor *ts[] = {q, k, q2, k2, p0, p};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t B = 2, T = 4, D = 8;
    const int64_t sq[4] = {B, 3, T, D}, sk[4] = {B, 1, T, D}, sk_t[4] = {B, 1, T + 1, D};
    const int64_t sk_d[4] = {B, 1, T, D + 2}, sk_bthd[4] = {B, T, 1, D}, s3[3] = {B, T, D};
    const int64_t st[2] = {T, D / 2}, st_wide[2] = {T, D}, sbt[3] = {B, T, D / 2};
    const int64_t sp[1] = {T}, sp_bad[1] = {T + 1}, sp2[2] = {B + 1, T};
    double vals[2 * 3 * 4 * 8], pos[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7},
                                tab[2 * 4 * 8];
    for (int i = 0; i < 2 * 3 * 4 * 8; ++i)
        vals[i] = 0.125 * (i % 13) - 0.5;
    for (int i = 0; i < 2 * 4 * 8; ++i)
        tab[i] = 0.5;
    llmcl_tensor *q = th_tensor_from(LLMCL_BF16, 4, sq, vals), *k = th_tensor(LLMCL_BF16, 4, sk);
    llmcl_tensor *k_t = th_tensor(LLMCL_BF16, 4, sk_t), *k_d = th_tensor(LLMCL_BF16, 4, sk_d);
    llmcl_tensor *k_bthd = th_tensor(LLMCL_BF16, 4, sk_bthd), *k_f32 = th_tensor(LLMCL_F32, 4, sk);
    llmcl_tensor *q_i32 = th_tensor(LLMCL_I32, 4, sq), *q3 = th_tensor(LLMCL_BF16, 3, s3);
    llmcl_tensor *c = th_tensor_from(LLMCL_F32, 2, st, tab),
                 *s = th_tensor_from(LLMCL_F32, 2, st, tab);
    llmcl_tensor *c_wide = th_tensor_from(LLMCL_F32, 2, st_wide, tab);
    llmcl_tensor *c_bf16 = th_tensor_from(LLMCL_BF16, 2, st, tab);
    llmcl_tensor *c_b = th_tensor_from(LLMCL_F32, 3, sbt, tab);
    llmcl_tensor *p = th_tensor_from(LLMCL_I32, 1, sp, pos),
                 *p_bad = th_tensor_from(LLMCL_I32, 1, sp_bad, pos);
    llmcl_tensor *p_f32 = th_tensor_from(LLMCL_F32, 1, sp, pos),
                 *p2 = th_tensor_from(LLMCL_I64, 2, sp2, pos);

    llmcl_rope_options o = {0};
    o.positions = p;
    TH_FAILS(llmcl_rope_forward(NULL, q, k, &o), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_rope_forward(ctx, NULL, k, &o), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_rope_forward(ctx, q, k, NULL), LLMCL_ERROR_INVALID_ARGUMENT); /* no source */
    TH_FAILS(llmcl_rope_forward(ctx, q_i32, NULL, &o), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_rope_forward(ctx, q, k_f32, &o), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_rope_forward(ctx, q, k_t, &o), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_rope_forward(ctx, q, k_d, &o), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_rope_forward(ctx, q, k_bthd, &o), LLMCL_ERROR_SHAPE_MISMATCH); /* layout */
    TH_FAILS(llmcl_rope_backward(ctx, q, k_bthd, &o), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_rope_forward(ctx, q, q, &o), LLMCL_ERROR_INVALID_ARGUMENT); /* q is k */
    assert_int_not_equal(llmcl_rope_forward(ctx, q3, NULL, &o), LLMCL_OK);

    llmcl_rope_options b = o;
    b.rotary_dim = D + 2;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b.rotary_dim = 5;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b.rotary_dim = -2;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b = o;
    b.style = (llmcl_rope_style)5;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b = o;
    b.layout = (llmcl_rope_layout)9;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b = o;
    b.positions = NULL; /* missing positions */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b.positions = p_bad;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_SHAPE_MISMATCH);
    b.positions = p2; /* [B + 1, T] */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_SHAPE_MISMATCH);
    b.positions = p_f32;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    b = o;
    b.theta = -5.0;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);
    b = o;
    b.llama3_factor = 8.0;
    b.llama3_low_freq_factor = 4.0;
    b.llama3_high_freq_factor = 1.0;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &b), LLMCL_ERROR_INVALID_ARGUMENT);

    llmcl_rope_options t = {0};
    t.cos = c; /* sin missing */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    t.sin = s;
    t.positions = p; /* both sources */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    t.positions = NULL;
    t.cos = c_wide; /* [T, D], not [T, rotary_dim / 2] */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_SHAPE_MISMATCH);
    t.cos = c_bf16;
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    t.cos = c_b; /* cos per batch, sin shared */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_SHAPE_MISMATCH);
    t.cos = c;
    t.rotary_dim = 4; /* tables sized for rotary_dim 8 */
    TH_FAILS(llmcl_rope_forward(ctx, q, k, &t), LLMCL_ERROR_SHAPE_MISMATCH);

    /* failed calls left q as it was */
    double back[2 * 3 * 4 * 8];
    th_download(q, back);
    th_round_all(LLMCL_BF16, vals, 2 * 3 * 4 * 8);
    TH_ASSERT_CLOSE("q after failures", vals, back, 2 * 3 * 4 * 8, ((th_tol){0.0, 0.0}));

    llmcl_tensor *ts[] = {q, k,      k_t,    k_d, k_bthd, k_f32, q_i32, q3, c,
                          s, c_wide, c_bf16, c_b, p,      p_bad, p_f32, p2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sources_styles_layouts),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_strided),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_large_positions),
        cmocka_unit_test(test_packed_qkv),
        cmocka_unit_test(test_table_views),
        cmocka_unit_test(test_tunables),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_loop_limit),
    };
    return TH_RUN(tests);
}
