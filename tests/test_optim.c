/*
 * test_optim.c: llmcl_adamw_step and llmcl_grad_norm against double references. Five tensors of
 * odd sizes go through each call: every param and grad dtype with and without master weights,
 * weight decay on some tensors, a gradient scale, clipping by a norm computed on the device, three
 * consecutive steps; beta1 below 0.5, an eps that matters and clipping that does not bind;
 * stochastic rounding (neighbours, bias, repeatability); separate buffers
 * against views of one flat buffer per operand; tuned chunkings; grids widened where the device cuts
 * loops short; and every bad input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim_ref.h"

enum { P, MS, G, M, V, N_OPS };
#define N_T 5

/* Tensor i of a set: odd sizes, one of them 3-D; 4099 spans a full chunk and a partial one. */
static const int ndims[N_T] = {1, 1, 1, 1, 3};
static const int64_t shapes[N_T][3] = {{1}, {7}, {1000}, {4099}, {3, 5, 7}};

static size_t numel(int i)
{
    size_t n = 1;
    for (int d = 0; d < ndims[i]; ++d)
        n *= (size_t)shapes[i][d];
    return n;
}

static const float LR = 1e-2f, WD = 0.1f, SCALE = 0.5f;

/* One optimizer state: each operand of every tensor, separate or views of one flat buffer. */
typedef struct set {
    llmcl_dtype pdt, gdt;
    bool master;
    llmcl_tensor *t[N_OPS][N_T];
    llmcl_tensor *flat[N_OPS];
} set;

static llmcl_dtype op_dtype(const set *s, int op)
{
    return op == P ? s->pdt : op == G ? s->gdt : LLMCL_F32;
}

static set set_make(llmcl_dtype pdt, llmcl_dtype gdt, bool master, bool flat)
{
    set s = {.pdt = pdt, .gdt = gdt, .master = master};
    int64_t total = 0;
    for (int i = 0; i < N_T; ++i)
        total += (int64_t)numel(i);
    for (int op = 0; op < N_OPS; ++op) {
        if (op == MS && !master)
            continue;
        if (flat)
            s.flat[op] = th_tensor(op_dtype(&s, op), 1, &total);
        int64_t off = 0;
        for (int i = 0; i < N_T; ++i) {
            if (flat)
                TH_OK(llmcl_tensor_view(s.flat[op], ndims[i], shapes[i], NULL, off, &s.t[op][i]));
            else
                s.t[op][i] = th_tensor(op_dtype(&s, op), ndims[i], shapes[i]);
            off += (int64_t)numel(i);
        }
    }
    return s;
}

static void set_free(set *s)
{
    for (int op = 0; op < N_OPS; ++op) {
        for (int i = 0; i < N_T; ++i)
            llmcl_tensor_destroy(s->t[op][i]);
        llmcl_tensor_destroy(s->flat[op]);
    }
}

/* Weights in [-1, 1), m around 0, v positive; a master holds the weights, param their rounding. */
static void set_init(set *s, uint64_t seed)
{
    th_rng r = th_rng_new(seed);
    for (int i = 0; i < N_T; ++i) {
        const size_t n = numel(i);
        double *w = th_alloc(n * sizeof *w), *m = th_alloc(n * sizeof *m), *v = th_alloc(n * sizeof *v);
        th_fill_uniform(&r, w, n, -1.0, 1.0);
        th_fill_normal(&r, m, n, 0.1);
        th_fill_uniform(&r, v, n, 1e-4, 1e-2);
        th_round_all(LLMCL_F32, w, n);
        th_upload(s->t[P][i], w);
        if (s->master)
            th_upload(s->t[MS][i], w);
        th_upload(s->t[M][i], m);
        th_upload(s->t[V][i], v);
        free(w);
        free(m);
        free(v);
    }
}

static void set_grads(set *s, uint64_t seed)
{
    th_rng r = th_rng_new(seed);
    for (int i = 0; i < N_T; ++i) {
        double *g = th_alloc(numel(i) * sizeof *g);
        th_fill_normal(&r, g, numel(i), 1.0);
        th_upload(s->t[G][i], g);
        free(g);
    }
}

static llmcl_adamw_tensor *set_list(const set *s)
{
    static llmcl_adamw_tensor list[N_T];
    for (int i = 0; i < N_T; ++i)
        list[i] = (llmcl_adamw_tensor){s->t[P][i], s->t[MS][i], s->t[G][i], s->t[M][i], s->t[V][i],
                                       i % 2};
    return list;
}

static const llmcl_tensor *const *set_grad_list(const set *s) { return (const llmcl_tensor *const *)s->t[G]; }

/* Every operand of every tensor, downloaded: x[op][i]. */
typedef struct snapshot {
    double *x[N_OPS][N_T];
} snapshot;

static snapshot snapshot_get(const set *s)
{
    snapshot st = {0};
    for (int op = 0; op < N_OPS; ++op)
        for (int i = 0; i < N_T && s->t[op][0]; ++i) {
            st.x[op][i] = th_alloc(numel(i) * sizeof(double));
            th_download(s->t[op][i], st.x[op][i]);
        }
    return st;
}

static void snapshot_free(snapshot *st)
{
    for (int op = 0; op < N_OPS; ++op)
        for (int i = 0; i < N_T; ++i)
            free(st->x[op][i]);
}

static void assert_same_snapshot(const snapshot *a, const snapshot *b)
{
    for (int op = 0; op < N_OPS; ++op)
        for (int i = 0; i < N_T && a->x[op][i]; ++i)
            TH_ASSERT_CLOSE("bit-equal state", a->x[op][i], b->x[op][i], numel(i), (th_tol){0, 0});
}

/* The gap between the 16-bit neighbours around x. */
static double gap16(llmcl_dtype dt, double x)
{
    int e;
    frexp(fabs(x), &e);
    const int lowest = dt == LLMCL_BF16 ? -126 : -14, mant = dt == LLMCL_BF16 ? 7 : 10;
    return ldexp(1.0, (e - 1 > lowest ? e - 1 : lowest) - mant);
}

/* Every got[i] is one of the two 16-bit neighbours of the exact update ref[i]. */
static void assert_neighbours(llmcl_dtype dt, const double *ref, const double *got, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - ref[i]) <= gap16(dt, ref[i]) + 1e-6 * fabs(ref[i])))
            fail_msg("element %zu: %.9g is not a %s neighbour of %.9g", i, got[i],
                     llmcl_dtype_name(dt), ref[i]);
}

/*
 * One step on the device against the reference computed from the device's state before it:
 * m, v and master to f32 tolerance, param the rounding of master, or the f32 update, or one of the
 * stochastic rounding's two neighbours; grads unchanged.
 */
static void check_step(set *s, const llmcl_adamw_opts *o, double clip)
{
    snapshot before = snapshot_get(s);
    TH_OK(llmcl_adamw_step(th_ctx(), set_list(s), N_T, o));
    snapshot after = snapshot_get(s);
    const ref_adamw_hp hp = {o->lr, o->beta1 ? o->beta1 : 0.9f, o->beta2 ? o->beta2 : 0.999f,
                             o->eps ? o->eps : 1e-8f, o->weight_decay, o->step};
    const int wop = s->master ? MS : P;
    for (int i = 0; i < N_T; ++i) {
        const size_t n = numel(i);
        double *g = th_alloc(n * sizeof *g);
        for (size_t j = 0; j < n; ++j)
            g[j] = before.x[G][i][j] * (o->grad_scale ? o->grad_scale : 1.0f) * clip;
        ref_adamw(before.x[wop][i], before.x[M][i], before.x[V][i], g, n, &hp, i % 2 == 0);
        const th_tol f32 = th_tol_for(LLMCL_F32);
        TH_ASSERT_CLOSE("m", before.x[M][i], after.x[M][i], n, f32);
        TH_ASSERT_CLOSE("v", before.x[V][i], after.x[V][i], n, f32);
        TH_ASSERT_CLOSE("grad unchanged", after.x[G][i], before.x[G][i], n, (th_tol){0, 0});
        if (s->master) {
            TH_ASSERT_CLOSE("master", before.x[MS][i], after.x[MS][i], n, f32);
            for (size_t j = 0; j < n; ++j)
                g[j] = th_round(s->pdt, after.x[MS][i][j]);
            TH_ASSERT_CLOSE("param = master rounded", g, after.x[P][i], n, (th_tol){0, 0});
        } else if (s->pdt == LLMCL_F32) {
            TH_ASSERT_CLOSE("param", before.x[P][i], after.x[P][i], n, f32);
        } else {
            assert_neighbours(s->pdt, before.x[P][i], after.x[P][i], n);
        }
        free(g);
    }
    snapshot_free(&before);
    snapshot_free(&after);
}

/* The norm of the set's grads on the device, checked against the reference. */
static double device_norm(const set *s, llmcl_tensor *out, int squared)
{
    th_poison(out);
    TH_OK(llmcl_grad_norm(th_ctx(), set_grad_list(s), N_T, squared, out));
    double got, ss = 0.0;
    th_download(out, &got);
    for (int i = 0; i < N_T; ++i) {
        double *g = th_alloc(numel(i) * sizeof *g);
        th_download(s->t[G][i], g);
        ss += ref_sum_squares(g, numel(i));
        free(g);
    }
    const double want = squared ? ss : sqrt(ss);
    TH_ASSERT_CLOSE("grad norm", &want, &got, 1, (th_tol){0, 1e-5});
    return got;
}

static llmcl_adamw_opts base_opts(int64_t step)
{
    return (llmcl_adamw_opts){.lr = LR, .weight_decay = WD, .step = step, .grad_scale = SCALE,
                              .seed = 1234};
}

/* Three steps of one dtype combination; with clip, gradients clipped to about half. */
static void run_steps(set *s, bool clip, uint64_t seed)
{
    const int64_t one = 1;
    llmcl_tensor *norm = th_tensor(LLMCL_F32, 1, &one);
    set_init(s, seed);
    for (int step = 1; step <= 3; ++step) {
        set_grads(s, seed + (uint64_t)step);
        llmcl_adamw_opts o = base_opts(step);
        double coef = 1.0;
        if (clip) {
            const double nd = device_norm(s, norm, 0);
            o.grad_norm = norm;
            o.max_grad_norm = (float)(0.5 * SCALE * nd);
            coef = ref_clip_coef(SCALE * nd, o.max_grad_norm);
        }
        check_step(s, &o, coef);
    }
    llmcl_tensor_destroy(norm);
}

static const llmcl_dtype float_types[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};

static void test_adamw_combinations(void **state)
{
    (void)state;
    int k = 0;
    for (int p = 0; p < 3; ++p)
        for (int master = 0; master <= 1; ++master)
            for (int g = 0; g < 3; ++g, ++k) {
                set s = set_make(float_types[p], float_types[g], master, false);
                run_steps(&s, k % 2 == 0, 100 + (uint64_t)k);
                set_free(&s);
            }
}

/*
 * Hyperparameters away from the defaults that every other test uses: beta1 below 0.5 (m's lerp
 * from its other end), an eps that matters against sqrt(v) at step 1 (where it is added after the
 * bias correction), and clipping enabled with a max norm above the norm (the coefficient is then 1,
 * not max / norm). f32 throughout, every tensor of the set, one step each.
 */
static void test_adamw_hyperparameters(void **state)
{
    (void)state;
    const int64_t one = 1;
    llmcl_tensor *norm = th_tensor(LLMCL_F32, 1, &one);
    const struct {
        float beta1, beta2, eps;
        int64_t step;
        double max_over_norm; /* 0: no clipping */
    } cases[] = {{0.3f, 0.99f, 1e-8f, 2, 0.0}, /* 1 - beta1 >= 0.5 */
                 {0.9f, 0.999f, 1e-2f, 1, 0.0}, /* eps against sqrt(v) / sqrt(1 - beta2) */
                 {0.9f, 0.999f, 1e-8f, 3, 4.0}}; /* clipping on, not binding */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        set s = set_make(LLMCL_F32, LLMCL_F32, false, false);
        set_init(&s, 500 + c);
        set_grads(&s, 600 + c);
        llmcl_adamw_opts o = base_opts(cases[c].step);
        o.beta1 = cases[c].beta1;
        o.beta2 = cases[c].beta2;
        o.eps = cases[c].eps;
        double coef = 1.0;
        if (cases[c].max_over_norm > 0.0) {
            const double nd = device_norm(&s, norm, 0);
            o.grad_norm = norm;
            o.max_grad_norm = (float)(cases[c].max_over_norm * SCALE * nd);
            coef = ref_clip_coef(SCALE * nd, o.max_grad_norm);
            assert_true(coef == 1.0);
        }
        check_step(&s, &o, coef);
        set_free(&s);
    }
    llmcl_tensor_destroy(norm);
}

/* Views of flat buffers (one launch, unaligned offsets) give the bits of separate buffers. */
static void test_flat_matches_separate(void **state)
{
    (void)state;
    const struct {
        llmcl_dtype p, g;
        bool master;
    } cases[] = {{LLMCL_BF16, LLMCL_F32, false}, {LLMCL_BF16, LLMCL_BF16, true},
                 {LLMCL_F16, LLMCL_F16, false}, {LLMCL_F32, LLMCL_F32, false}};
    const int64_t one = 1;
    llmcl_tensor *na = th_tensor(LLMCL_F32, 1, &one), *nb = th_tensor(LLMCL_F32, 1, &one);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        set a = set_make(cases[c].p, cases[c].g, cases[c].master, false);
        set b = set_make(cases[c].p, cases[c].g, cases[c].master, true);
        set_init(&a, 7);
        set_init(&b, 7);
        for (int step = 1; step <= 2; ++step) {
            set_grads(&a, 70 + (uint64_t)step);
            set_grads(&b, 70 + (uint64_t)step);
            const double norm_a = device_norm(&a, na, 0), norm_b = device_norm(&b, nb, 0);
            assert_true(norm_a == norm_b);
            llmcl_adamw_opts oa = base_opts(step), ob = base_opts(step);
            oa.grad_norm = na;
            ob.grad_norm = nb;
            oa.max_grad_norm = ob.max_grad_norm = (float)(0.5 * SCALE * norm_a);
            TH_OK(llmcl_adamw_step(th_ctx(), set_list(&a), N_T, &oa));
            TH_OK(llmcl_adamw_step(th_ctx(), set_list(&b), N_T, &ob));
            snapshot sa = snapshot_get(&a), sb = snapshot_get(&b);
            assert_same_snapshot(&sa, &sb);
            snapshot_free(&sa);
            snapshot_free(&sb);
        }
        set_free(&a);
        set_free(&b);
    }
    llmcl_tensor_destroy(na);
    llmcl_tensor_destroy(nb);
}

/* Small chunks and a capped grid: many chunks per tensor and per work-group. */
static void test_tuned_chunking(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_override(ctx, "adamw", LLMCL_BF16, "*", "WG=32 UNROLL=2 GPC=1"));
    TH_OK(llmcl_tune_override(ctx, "grad_norm", LLMCL_F32, "*", "WG=32 UNROLL=1 GPC=1"));
    set s = set_make(LLMCL_BF16, LLMCL_F32, true, true);
    run_steps(&s, true, 31);
    set_free(&s);
    th_assert_launched_with("adamw", LLMCL_BF16, "5212", "UNROLL=2");
    s = set_make(LLMCL_BF16, LLMCL_F32, false, false);
    run_steps(&s, false, 32);
    set_free(&s);
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
}

/*
 * Where the device cuts loops short (rusticl's llvmpipe: 65535 passes a work-item and launch),
 * grids capped at one small group a compute unit over 4 million elements: the launchers widen them
 * so that each group's chunks stay within the budget (with the CPU's default grid, the norm of a
 * 300-million-element gradient would have stopped short there). Elsewhere the same, as tuned.
 */
static void test_loop_limit(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    /* grad_norm's last work-group sums every chunk's partial: chunks of 32, not of 4 */
    TH_OK(llmcl_tune_override(ctx, "grad_norm", LLMCL_F32, "*", "WG=8 UNROLL=1 GPC=1"));
    TH_OK(llmcl_tune_override(ctx, "adamw", LLMCL_F32, "*", "WG=1 UNROLL=1 GPC=1"));
    const int64_t n = 4000000, one = 1;
    double *w = th_alloc((size_t)n * sizeof *w), *g = th_alloc((size_t)n * sizeof *g);
    double *m = th_alloc((size_t)n * sizeof *m), *v = th_alloc((size_t)n * sizeof *v);
    double *got = th_alloc((size_t)n * sizeof *got);
    th_rng r = th_rng_new(41);
    th_fill_normal(&r, w, (size_t)n, 1.0);
    th_fill_normal(&r, g, (size_t)n, 1.0);
    th_round_all(LLMCL_F32, w, (size_t)n), th_round_all(LLMCL_F32, g, (size_t)n);
    llmcl_tensor *tw = th_tensor_from(LLMCL_F32, 1, &n, w), *tg = th_tensor_from(LLMCL_F32, 1, &n, g);
    llmcl_tensor *tm = th_tensor(LLMCL_F32, 1, &n), *tv = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *out = th_tensor(LLMCL_F32, 1, &one);
    TH_OK(llmcl_fill(ctx, tm, 0.0)), TH_OK(llmcl_fill(ctx, tv, 0.0));
    TH_OK(llmcl_grad_norm(ctx, (const llmcl_tensor *const *)&tg, 1, 0, out));
    double norm;
    th_download(out, &norm);
    const double want = sqrt(ref_sum_squares(g, (size_t)n));
    TH_ASSERT_CLOSE("grad norm", &want, &norm, 1, (th_tol){0, 1e-5});
    const llmcl_adamw_tensor t = {tw, NULL, tg, tm, tv, 0};
    const llmcl_adamw_opts o = base_opts(1);
    TH_OK(llmcl_adamw_step(ctx, &t, 1, &o));
    const ref_adamw_hp hp = {o.lr, 0.9f, 0.999f, 1e-8f, o.weight_decay, 1};
    for (int64_t i = 0; i < n; ++i) {
        g[i] *= SCALE;
        m[i] = v[i] = 0.0;
    }
    ref_adamw(w, m, v, g, (size_t)n, &hp, true);
    th_download(tw, got);
    TH_ASSERT_CLOSE("param", w, got, (size_t)n, th_tol_for(LLMCL_F32));
    th_download(tv, got);
    TH_ASSERT_CLOSE("v", v, got, (size_t)n, th_tol_for(LLMCL_F32));
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    llmcl_tensor_destroy(tw), llmcl_tensor_destroy(tg), llmcl_tensor_destroy(tm);
    llmcl_tensor_destroy(tv), llmcl_tensor_destroy(out);
    free(w), free(g), free(m), free(v), free(got);
    /* a limit of 300 on any device, the default chunks and grids: three steps with clipping */
    th_loop_limit("300");
    set s = set_make(LLMCL_BF16, LLMCL_F32, true, true);
    run_steps(&s, true, 33);
    set_free(&s);
    th_loop_limit(NULL);
}

/*
 * Stochastic rounding of one large tensor whose exact update lies between two 16-bit values: each
 * result is one of them, their mean is the exact mean within 5 standard errors (rounding to
 * nearest would be off by the whole update), the same seed repeats the bits and another changes
 * them.
 */
static void sr_case(llmcl_dtype dt, float lr)
{
    const int64_t n = 1 << 16;
    double *w = th_alloc((size_t)n * sizeof *w), *g = th_alloc((size_t)n * sizeof *g);
    double *m = th_alloc((size_t)n * sizeof *m), *v = th_alloc((size_t)n * sizeof *v);
    double *got = th_alloc((size_t)n * sizeof *got), *first = th_alloc((size_t)n * sizeof *first);
    th_rng r = th_rng_new(5);
    th_fill_uniform(&r, g, (size_t)n, 0.5, 1.5);
    th_round_all(LLMCL_F32, g, (size_t)n);
    llmcl_tensor *tp = th_tensor(dt, 1, &n), *tg = th_tensor_from(LLMCL_F32, 1, &n, g);
    llmcl_tensor *tm = th_tensor(LLMCL_F32, 1, &n), *tv = th_tensor(LLMCL_F32, 1, &n);
    const llmcl_adamw_tensor list[] = {{tp, NULL, tg, tm, tv, 0}};
    for (int run = 0; run < 3; ++run) {
        for (int64_t i = 0; i < n; ++i)
            w[i] = 1.0, m[i] = v[i] = 0.0;
        th_upload(tp, w);
        th_upload(tm, m);
        th_upload(tv, v);
        const llmcl_adamw_opts o = {.lr = lr, .step = 1, .seed = run < 2 ? 42 : 43};
        TH_OK(llmcl_adamw_step(th_ctx(), list, 1, &o));
        th_download(tp, got);
        if (run == 0) {
            const ref_adamw_hp hp = {lr, 0.9f, 0.999f, 1e-8f, 0.0, 1};
            ref_adamw(w, m, v, g, (size_t)n, &hp, 0);
            assert_neighbours(dt, w, got, (size_t)n);
            const double gap = gap16(dt, w[0]);
            double bias = 0.0;
            for (int64_t i = 0; i < n; ++i)
                bias += got[i] - w[i];
            bias /= (double)n;
            const double p = (1.0 - w[0]) / gap;
            const double se = gap * sqrt(p * (1.0 - p) / (double)n);
            if (!(fabs(bias) < 5.0 * se))
                fail_msg("%s stochastic rounding is biased: mean error %g, standard error %g",
                         llmcl_dtype_name(dt), bias, se);
            memcpy(first, got, (size_t)n * sizeof *got);
        } else if (run == 1) {
            TH_ASSERT_CLOSE("same seed, same bits", first, got, (size_t)n, (th_tol){0, 0});
        } else {
            size_t differ = 0;
            for (int64_t i = 0; i < n; ++i)
                differ += got[i] != first[i];
            assert_true(differ > (size_t)n / 20);
        }
    }
    llmcl_tensor_destroy(tp);
    llmcl_tensor_destroy(tg);
    llmcl_tensor_destroy(tm);
    llmcl_tensor_destroy(tv);
    free(w);
    free(g);
    free(m);
    free(v);
    free(got);
    free(first);
}

static void test_stochastic_rounding(void **state)
{
    (void)state;
    sr_case(LLMCL_BF16, 1e-3f); /* 1 - 1e-3 between 1 - 2^-8 and 1 */
    sr_case(LLMCL_F16, 1e-4f);  /* 1 - 1e-4 between 1 - 2^-11 and 1 */
}

/* Mixed dtypes (one launch each), an empty tensor, squared or not; repeat runs bit-equal. */
static void test_grad_norm(void **state)
{
    (void)state;
    const llmcl_dtype dts[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16, LLMCL_F32, LLMCL_BF16, LLMCL_F32};
    const int64_t sizes[] = {1, 7, 1000, 4099, 9000, 0};
    const int n = 6;
    llmcl_tensor *g[6];
    double ss = 0.0;
    th_rng r = th_rng_new(9);
    for (int i = 0; i < n; ++i) {
        double *x = th_alloc(((size_t)sizes[i] + 1) * sizeof *x);
        th_fill_normal(&r, x, (size_t)sizes[i], 2.0);
        th_round_all(dts[i], x, (size_t)sizes[i]);
        ss += ref_sum_squares(x, (size_t)sizes[i]);
        g[i] = th_tensor_from(dts[i], 1, &sizes[i], x);
        free(x);
    }
    const int64_t one = 1;
    llmcl_tensor *out = th_tensor(LLMCL_F32, 1, &one);
    llmcl_memory_stats m0, m1;
    TH_OK(llmcl_memory_reset_peak(th_ctx()));
    TH_OK(llmcl_memory_stats_get(th_ctx(), &m0));
    for (int squared = 0; squared <= 1; ++squared) {
        double got[2];
        for (int run = 0; run < 2; ++run) {
            th_poison(out);
            TH_OK(llmcl_grad_norm(th_ctx(), (const llmcl_tensor *const *)g, n, squared, out));
            th_download(out, &got[run]);
        }
        const double want = squared ? ss : sqrt(ss);
        TH_ASSERT_CLOSE("grad norm", &want, &got[0], 1, (th_tol){0, 1e-5});
        assert_true(got[0] == got[1]);
        /* through an empty accumulator: the same partials in the same order, the same bits */
        llmcl_sumsq *acc = NULL;
        TH_OK(llmcl_sumsq_create(th_ctx(), &acc));
        th_poison(out);
        TH_OK(llmcl_grad_norm_sumsq(th_ctx(), acc, (const llmcl_tensor *const *)g, n, squared, out));
        double via;
        th_download(out, &via);
        assert_true(via == got[0]);
        llmcl_sumsq_destroy(acc);
    }
    TH_OK(llmcl_memory_stats_get(th_ctx(), &m1));
    assert_true(m1.current_bytes == m0.current_bytes);
    assert_true(m1.peak_bytes > m0.current_bytes); /* partials and table were counted */
    /* only empty tensors: a norm of zero */
    double zero;
    th_poison(out);
    TH_OK(llmcl_grad_norm(th_ctx(), (const llmcl_tensor *const *)&g[5], 1, 0, out));
    th_download(out, &zero);
    assert_true(zero == 0.0);
    for (int i = 0; i < n; ++i)
        llmcl_tensor_destroy(g[i]);
    llmcl_tensor_destroy(out);
}

/* ---- bad inputs: each fails with its status and leaves every tensor as it was ---- */

static void assert_unchanged(const set *s, const snapshot *ref)
{
    snapshot now = snapshot_get(s);
    assert_same_snapshot(ref, &now);
    snapshot_free(&now);
}

#define ADAMW_FAILS(list, count, opts, status)                                                    \
    do {                                                                                          \
        TH_FAILS(llmcl_adamw_step(th_ctx(), (list), (count), (opts)), (status));                  \
        assert_unchanged(&s, &snap);                                                              \
    } while (0)

static void test_adamw_bad_inputs(void **state)
{
    (void)state;
    set s = set_make(LLMCL_BF16, LLMCL_F32, true, true);
    set_init(&s, 3);
    set_grads(&s, 4);
    snapshot snap = snapshot_get(&s);
    llmcl_adamw_tensor l[N_T];
    const llmcl_adamw_opts good = base_opts(1);
    llmcl_adamw_opts o = good;
    const int64_t one = 1, two = 2, n7 = 7, n14 = 14;
    llmcl_tensor *norm = th_tensor(LLMCL_F32, 1, &one), *norm2 = th_tensor(LLMCL_F32, 1, &two);
    llmcl_tensor *norm_bf = th_tensor(LLMCL_BF16, 1, &one), *i32 = th_tensor(LLMCL_I32, 1, &n7);
    llmcl_tensor *m_bf = th_tensor(LLMCL_BF16, 1, &n7), *wide = th_tensor(LLMCL_F32, 1, &n14);
    llmcl_tensor *strided = NULL, *short_grad = NULL, *m_inside = NULL;
    TH_OK(llmcl_tensor_view(wide, 1, &n7, &two, 0, &strided));
    TH_OK(llmcl_tensor_view(s.flat[M], 1, &n7, NULL, 10, &m_inside)); /* within tensor 2's m */
    TH_OK(llmcl_tensor_view(wide, 1, &(int64_t){6}, NULL, 0, &short_grad));
    llmcl_ctx *other = NULL;
    TH_OK(llmcl_ctx_create(&other));
    llmcl_tensor *foreign = NULL;
    TH_OK(llmcl_tensor_create(other, LLMCL_F32, 1, &n7, &foreign));

#define RESET() (memcpy(l, set_list(&s), sizeof l), o = good)
    RESET();
    TH_FAILS(llmcl_adamw_step(NULL, l, N_T, &o), LLMCL_ERROR_INVALID_ARGUMENT);
    ADAMW_FAILS(NULL, N_T, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    ADAMW_FAILS(l, 0, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    ADAMW_FAILS(l, -1, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    ADAMW_FAILS(l, N_T, NULL, LLMCL_ERROR_INVALID_ARGUMENT);
    /* operands of the last tensor, so that the earlier ones would have been updated */
    const struct {
        int op;
        llmcl_tensor *t;
        llmcl_status st;
    } bad_ops[] = {
        {P, NULL, LLMCL_ERROR_INVALID_ARGUMENT},       {G, NULL, LLMCL_ERROR_INVALID_ARGUMENT},
        {M, NULL, LLMCL_ERROR_INVALID_ARGUMENT},       {V, NULL, LLMCL_ERROR_INVALID_ARGUMENT},
        {P, i32, LLMCL_ERROR_UNSUPPORTED_DTYPE},       {G, i32, LLMCL_ERROR_UNSUPPORTED_DTYPE},
        {M, m_bf, LLMCL_ERROR_UNSUPPORTED_DTYPE},      {MS, m_bf, LLMCL_ERROR_UNSUPPORTED_DTYPE},
        {G, short_grad, LLMCL_ERROR_SHAPE_MISMATCH},   {V, wide, LLMCL_ERROR_SHAPE_MISMATCH},
        {G, strided, LLMCL_ERROR_INVALID_ARGUMENT},    {M, foreign, LLMCL_ERROR_DEVICE_MISMATCH},
    };
    for (size_t c = 0; c < sizeof bad_ops / sizeof bad_ops[0]; ++c) {
        RESET();
        /* tensor 1 has 7 elements, the size of the bad tensors */
        llmcl_adamw_tensor *t = &l[1];
        llmcl_tensor **slot[N_OPS] = {&t->param, &t->master, (llmcl_tensor **)&t->grad, &t->m, &t->v};
        *slot[bad_ops[c].op] = bad_ops[c].t;
        ADAMW_FAILS(l, N_T, &o, bad_ops[c].st);
    }
    /* overlaps: m within another tensor's m, v on m, grad on master, the norm on m */
    RESET();
    l[1].m = m_inside;
    ADAMW_FAILS(l, N_T, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    RESET();
    l[1].v = l[1].m;
    ADAMW_FAILS(l, N_T, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    RESET();
    l[1].grad = l[1].master;
    ADAMW_FAILS(l, N_T, &o, LLMCL_ERROR_INVALID_ARGUMENT);
    RESET();
    o.max_grad_norm = 1.0f;
    o.grad_norm = s.t[M][0];
    ADAMW_FAILS(l, N_T, &o, LLMCL_ERROR_INVALID_ARGUMENT); /* overlaps m of tensor 0 */
    /* options */
    const struct {
        llmcl_adamw_opts o;
        llmcl_status st;
    } bad_opts[] = {
        {{.lr = -1e-3f, .step = 1}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = NAN, .step = 1}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 0}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = -5}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .beta1 = 1.0f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .beta1 = -0.1f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .beta2 = 1.5f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .eps = -1e-8f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .weight_decay = -0.1f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .grad_scale = -1.0f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .grad_scale = INFINITY}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .max_grad_norm = -1.0f, .grad_norm = norm},
         LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .max_grad_norm = 1.0f}, LLMCL_ERROR_INVALID_ARGUMENT},
        {{.lr = 1e-3f, .step = 1, .max_grad_norm = 1.0f, .grad_norm = norm2},
         LLMCL_ERROR_SHAPE_MISMATCH},
        {{.lr = 1e-3f, .step = 1, .max_grad_norm = 1.0f, .grad_norm = norm_bf},
         LLMCL_ERROR_UNSUPPORTED_DTYPE},
        {{.lr = 1e-3f, .step = 1, .max_grad_norm = 1.0f, .grad_norm = foreign},
         LLMCL_ERROR_DEVICE_MISMATCH},
    };
    for (size_t c = 0; c < sizeof bad_opts / sizeof bad_opts[0]; ++c) {
        RESET();
        ADAMW_FAILS(l, N_T, &bad_opts[c].o, bad_opts[c].st);
    }
#undef RESET
    snapshot_free(&snap);
    set_free(&s);
    llmcl_tensor *ts[] = {norm, norm2, norm_bf, i32, m_bf, strided, short_grad, m_inside, wide};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
    llmcl_tensor_destroy(foreign);
    llmcl_ctx_destroy(other);
}

static void test_grad_norm_bad_inputs(void **state)
{
    (void)state;
    const int64_t one = 1, two = 2, n8 = 8, n4 = 4;
    llmcl_tensor *g = th_tensor_from(LLMCL_F32, 1, &n8, (double[8]){1, 2, 3, 4, 5, 6, 7, 8});
    llmcl_tensor *out = th_tensor(LLMCL_F32, 1, &one), *out2 = th_tensor(LLMCL_F32, 1, &two);
    llmcl_tensor *out_bf = th_tensor(LLMCL_BF16, 1, &one), *gi = th_tensor(LLMCL_I32, 1, &n8);
    llmcl_tensor *strided = NULL, *inside = NULL;
    TH_OK(llmcl_tensor_view(g, 1, &n4, &two, 0, &strided));
    TH_OK(llmcl_tensor_view(g, 1, &one, NULL, 3, &inside));
    llmcl_ctx *other = NULL;
    TH_OK(llmcl_ctx_create(&other));
    llmcl_tensor *foreign = NULL;
    TH_OK(llmcl_tensor_create(other, LLMCL_F32, 1, &n8, &foreign));
    const llmcl_tensor *ok[] = {g, g};
    const struct {
        const llmcl_tensor *a, *b;
        int count;
        llmcl_tensor *out;
        llmcl_status st;
    } cases[] = {
        {g, NULL, 2, out, LLMCL_ERROR_INVALID_ARGUMENT},
        {g, g, 0, out, LLMCL_ERROR_INVALID_ARGUMENT},
        {g, g, -3, out, LLMCL_ERROR_INVALID_ARGUMENT},
        {g, gi, 2, out, LLMCL_ERROR_UNSUPPORTED_DTYPE},
        {g, strided, 2, out, LLMCL_ERROR_INVALID_ARGUMENT},
        {g, foreign, 2, out, LLMCL_ERROR_DEVICE_MISMATCH},
        {g, g, 2, NULL, LLMCL_ERROR_INVALID_ARGUMENT},
        {g, g, 2, out2, LLMCL_ERROR_SHAPE_MISMATCH},
        {g, g, 2, out_bf, LLMCL_ERROR_UNSUPPORTED_DTYPE},
        {g, g, 2, inside, LLMCL_ERROR_INVALID_ARGUMENT},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        const llmcl_tensor *list[] = {cases[c].a, cases[c].b};
        th_poison(out);
        TH_FAILS(llmcl_grad_norm(th_ctx(), list, cases[c].count, 0, cases[c].out), cases[c].st);
        double x[8], o;
        th_download(g, x);
        for (int i = 0; i < 8; ++i)
            assert_true(x[i] == i + 1);
        th_download(out, &o);
        assert_true(isnan(o));
    }
    TH_FAILS(llmcl_grad_norm(NULL, ok, 2, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_grad_norm(th_ctx(), NULL, 2, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);

    /* llmcl_grad_norm_sumsq: the same checks, and its own; a failed call leaves the partials
       gathered before (one call's, here none) and out as they were */
    llmcl_sumsq *acc = NULL, *acc_other = NULL;
    TH_OK(llmcl_sumsq_create(th_ctx(), &acc));
    TH_OK(llmcl_sumsq_create(other, &acc_other));
    TH_FAILS(llmcl_sumsq_create(NULL, &acc_other), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_sumsq_create(th_ctx(), NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    th_poison(out);
    TH_FAILS(llmcl_grad_norm_sumsq(NULL, acc, ok, 2, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_grad_norm_sumsq(th_ctx(), NULL, ok, 2, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_grad_norm_sumsq(th_ctx(), acc_other, ok, 2, 0, out),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_grad_norm_sumsq(th_ctx(), acc, ok, -1, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_grad_norm_sumsq(th_ctx(), acc, NULL, 1, 0, out), LLMCL_ERROR_INVALID_ARGUMENT);
    for (size_t c = 3; c < sizeof cases / sizeof cases[0]; ++c) {
        const llmcl_tensor *list[] = {cases[c].a, cases[c].b};
        TH_FAILS(llmcl_grad_norm_sumsq(th_ctx(), acc, list, 2, 0, cases[c].out), cases[c].st);
    }
    double o0;
    th_download(out, &o0);
    assert_true(isnan(o0));
    TH_OK(llmcl_grad_norm_sumsq(th_ctx(), acc, NULL, 0, 0, out));
    th_download(out, &o0);
    assert_true(o0 == 0.0);
    TH_OK(llmcl_grad_norm_sumsq(th_ctx(), acc, ok, 1, 1, out));
    th_download(out, &o0);
    assert_true(o0 == 204.0);
    llmcl_sumsq_destroy(acc);
    llmcl_sumsq_destroy(acc_other);
    /* the same tensor twice is read twice: fine */
    TH_OK(llmcl_grad_norm(th_ctx(), ok, 2, 1, out));
    double o;
    th_download(out, &o);
    assert_true(o == 2.0 * 204.0);
    llmcl_tensor *ts[] = {g, out, out2, out_bf, gi, strided, inside, foreign};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
    llmcl_ctx_destroy(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_combinations),
        cmocka_unit_test(test_adamw_hyperparameters),
        cmocka_unit_test(test_flat_matches_separate),
        cmocka_unit_test(test_tuned_chunking),
        cmocka_unit_test(test_loop_limit),
        cmocka_unit_test(test_stochastic_rounding),
        cmocka_unit_test(test_grad_norm),
        cmocka_unit_test(test_adamw_bad_inputs),
        cmocka_unit_test(test_grad_norm_bad_inputs),
    };
    return TH_RUN(tests);
}
