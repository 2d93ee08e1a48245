/*
 * test_preference.c: llmcl_linear_preference_forward against the double reference
 * (ref/preference_ref.c on ref_linear's logits, its logit gradient through ref_linear_backward):
 * the reference's gradient against central differences and its terms against TRL's formulas
 * written out; then DPO (with reference logps and label smoothing), IPO, SimPO (with gamma), CPO
 * and ORPO (with the chosen sequences' NLL) in f32, bf16 and f16, with and without a bias, the
 * loss's own logps and the other, odd sizes (T 7 and 13, V 1001, H 40 and 72, B 1 to 3),
 * ignored prompt prefixes and padding, sequences with nothing scored, another ignore_index, I32
 * and I64 labels, accumulated weight gradients, grad_scale, subsets of the gradients, in tiles
 * and in vocabulary chunks, each case run twice in one of them for its bits; ORPO's log odds
 * near pi = 0; the logps-only call; a strided hidden; long sequences under a low loop limit; and
 * every bad argument, each leaving the outputs as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy_ref.h"
#include "harness.h"
#include "preference_ref.h"

#define IGNORE (-100)
/* The chunked form's widths in tests: odd, so chunk edges cross the 8-class vector groups and the
   last chunk is partial; wider on the larger vocabularies, whose 28 chunks of 37 took seconds on
   llvmpipe. */
#define CHUNK 37
#define WIDE_CHUNK 251

/* The loss and the logps sum up to 2B T f32 log-probabilities (PoCL and llvmpipe stay within a
   tenth of these). */
static const th_tol loss_tol = {2e-5, 5e-5};
static const th_tol logps_tol = {2e-5, 2e-5};

/* ---- the reference ---- */

static const ref_pref_opts ref_cases[5] = {
    /* loss, beta, gamma, eps, nll_weight, average, ignore_index, grad_scale */
    {0, 0.7, 0.0, 0.2, 0.5, 0, IGNORE, 1.5},
    {1, 0.3, 0.0, 0.0, 0.0, 1, IGNORE, 1.5},
    {2, 1.5, 0.4, 0.1, 0.0, 1, IGNORE, 1.5},
    {3, 0.8, 0.0, 0.15, 1.0, 0, IGNORE, 1.5},
    {4, 0.6, 0.0, 0.0, 1.0, 1, IGNORE, 1.5},
};

/* The gradient against central differences of the loss, each loss in both logps modes, with a
   chosen sequence that scores nothing (pi 0: ORPO's pair then counts 0). */
static void test_ref_gradient(void **state)
{
    (void)state;
    enum { B = 2, T = 3, V = 5, N = 2 * B * T };
    const int64_t y[N] = {IGNORE, 1,      4,      /* chosen 0 */
                          IGNORE, IGNORE, IGNORE, /* chosen 1: nothing scored */
                          0,      2,      IGNORE, /* rejected 0 */
                          3,      3,      1};     /* rejected 1 */
    const double refl[2 * B] = {-3.0, -5.0, -4.0, -2.0};
    th_rng rng = th_rng_new(1);
    double x[N * V], g[N * V], pi[2 * B], loss, lp, lm;
    th_fill_uniform(&rng, x, N * V, -3, 3);
    for (int k = 0; k < 10; ++k) {
        ref_pref_opts o = ref_cases[k % 5];
        o.average = k < 5 ? o.average : !o.average;
        assert_int_equal(ref_preference(x, y, B, T, V, &o, refl, &loss, pi, g), -1);
        assert_true(isfinite(loss));
        assert_true(pi[1] == 0.0);
        for (int64_t i = 0; i < N * V; ++i) {
            const double h = 1e-6, keep = x[i];
            x[i] = keep + h;
            ref_preference(x, y, B, T, V, &o, refl, &lp, NULL, NULL);
            x[i] = keep - h;
            ref_preference(x, y, B, T, V, &o, refl, &lm, NULL, NULL);
            x[i] = keep;
            const double fd = o.grad_scale * (lp - lm) / (2 * h);
            if (fabs(fd - g[i]) > 1e-6 * fmax(1.0, fabs(fd)))
                fail_msg("loss %d average %d: d/dx[%lld] %.12g, finite differences %.12g", o.loss,
                         o.average, (long long)i, g[i], fd);
        }
        /* nothing flows into the rows that score nothing, nor into ORPO's second pair (its
           chosen pi is 0: the term is 0 whatever the rejected sequence) */
        for (int64_t i = T * V; i < 2 * T * V; ++i)
            assert_true(g[i] == 0.0);
        for (int64_t i = 3 * T * V; o.loss == 4 && i < 4 * T * V; ++i)
            assert_true(g[i] == 0.0);
    }
}

static double log_sig(double z) { return -log1p(exp(-z)); }

/* -(1 - eps) log sigmoid(z) - eps log sigmoid(-z) */
static double smooth_ls(double z, double eps)
{
    return -(1 - eps) * log_sig(z) - eps * log_sig(-z);
}

/*
 * The terms against llmcl.h's formulas written out, on one pair of one position over two classes:
 * logits [a, 0] with target 0 give pi = log sigmoid(a), whose odds are e^a, so ORPO's log odds
 * ratio is a - a' exactly, near pi = 0 too (a = 20: pi = -2e-9). A chosen sequence
 * that scores nothing makes ORPO's term 0, a rejected one +inf; a bad label writes nothing.
 */
static void test_ref_formulas(void **state)
{
    (void)state;
    const double a = 1.3, ar = -0.4, rc = -0.9, rr = -1.1;
    const double x[4] = {a, 0.0, ar, 0.0}, refl[2] = {rc, rr};
    const int64_t y[2] = {0, 0};
    const double c = log_sig(a), r = log_sig(ar);
    double loss, pi[2], g[4];
    for (int k = 0; k < 5; ++k) {
        ref_pref_opts o = ref_cases[k];
        o.grad_scale = 1.0;
        const double beta = o.beta, eps = o.eps, nll = o.nll_weight;
        const double want[5] = {
            smooth_ls(beta * ((c - rc) - (r - rr)), eps) - nll * c,
            pow((c - rc) - (r - rr) - 1 / (2 * beta), 2) - nll * c,
            smooth_ls(beta * (c - r) - o.gamma, eps) - nll * c,
            smooth_ls(beta * (c - r), eps) - nll * c,
            -beta * log_sig(a - ar) - nll * c,
        };
        assert_int_equal(ref_preference(x, y, 1, 1, 2, &o, refl, &loss, pi, g), -1);
        assert_true(fabs(loss - want[k]) < 1e-12);
        assert_true(fabs(pi[0] - c) < 1e-15 && fabs(pi[1] - r) < 1e-15);
        if (k == 4) /* d loss / d a = -beta sigmoid(a' - a) - nll sigmoid(-a) */
            assert_true(fabs(g[0] - (-beta / (1 + exp(a - ar)) - nll / (1 + exp(a)))) < 1e-12);
    }
    /* ORPO near pi = 0 */
    const double x20[4] = {20.0, 0.0, 18.0, 0.0};
    ref_pref_opts orpo = ref_cases[4];
    assert_int_equal(ref_preference(x20, y, 1, 1, 2, &orpo, NULL, &loss, pi, g), -1);
    assert_true(pi[0] < 0.0 && pi[0] > -1e-8);
    assert_true(fabs(loss - (-orpo.beta * log_sig(2.0) - orpo.nll_weight * pi[0])) < 1e-7);
    for (int j = 0; j < 4; ++j)
        assert_true(isfinite(g[j]));
    /* ORPO with a chosen sequence that scores nothing: 0, no gradient; a rejected one: +inf */
    const int64_t none_chosen[2] = {IGNORE, 0}, none_rejected[2] = {0, IGNORE};
    assert_int_equal(ref_preference(x, none_chosen, 1, 1, 2, &orpo, NULL, &loss, pi, g), -1);
    assert_true(loss == 0.0 && pi[0] == 0.0 && fabs(pi[1] - r) < 1e-15);
    for (int j = 0; j < 4; ++j)
        assert_true(g[j] == 0.0);
    assert_int_equal(ref_preference(x, none_rejected, 1, 1, 2, &orpo, NULL, &loss, pi, NULL), -1);
    assert_true(loss == INFINITY);
    /* bad labels: the first bad row, nothing written */
    const int64_t bad1[2] = {0, 2}, bad0[2] = {-1, 0};
    loss = 123.0, pi[0] = pi[1] = 123.0;
    assert_int_equal(ref_preference(x, bad1, 1, 1, 2, &orpo, NULL, &loss, pi, g), 1);
    assert_int_equal(ref_preference(x, bad0, 1, 1, 2, &orpo, NULL, &loss, pi, g), 0);
    assert_true(loss == 123.0 && pi[0] == 123.0 && pi[1] == 123.0);
    orpo.ignore_index = -1; /* -1 now ignored, and -100 out of range */
    assert_int_equal(ref_preference(x, bad0, 1, 1, 2, &orpo, NULL, &loss, pi, g), -1);
    const int64_t old_ignore[2] = {0, IGNORE};
    assert_int_equal(ref_preference(x, old_ignore, 1, 1, 2, &orpo, NULL, &loss, pi, g), 1);
}

/* ---- the op against the reference ---- */

typedef struct pcase {
    llmcl_dtype dt, ldt; /* hidden's, the labels' */
    llmcl_pref_loss loss;
    int64_t b, t, h, v;
    float beta, gamma, eps, nll;
    llmcl_pref_logps logps;
    bool bias, ref; /* a bias; ref_logps */
    int ignore;     /* 0 every label scored; 1 prompt prefixes and padding; 2 those and sequences
                       that score nothing (ORPO: the first chosen; the others: the first and the
                       last); 3 those and the last sequence (rejected) scoring nothing */
    int64_t ignore_index;
    bool accumulate;
    float gs;     /* grad_scale */
    int grads;    /* 1 dhidden, 2 dweight, 4 dbias (with a bias) */
    double peak;  /* > 0: the weight times this, every target its row's argmax (pi near 0) */
} pcase;

/* One problem: inputs in double (rounded to their dtypes) and on the device. */
typedef struct pproblem {
    int64_t b, t, h, v, n; /* n = 2 b t rows */
    double *hid, *w, *bias, *logits, *refl, *dw0, *db0;
    int64_t *y;
    llmcl_tensor *th, *tw, *tb, *ty, *tref;
} pproblem;

static bool resolve_average(const pcase *c)
{
    if (c->logps != LLMCL_PREF_LOGPS_DEFAULT)
        return c->logps == LLMCL_PREF_LOGPS_AVERAGE;
    return c->loss == LLMCL_PREF_IPO || c->loss == LLMCL_PREF_SIMPO || c->loss == LLMCL_PREF_ORPO;
}

static ref_pref_opts ref_of(const pcase *c)
{
    return (ref_pref_opts){
        .loss = (int)c->loss,
        .beta = c->beta != 0.0f ? c->beta : 0.1f,
        .gamma = c->gamma,
        .eps = c->eps,
        .nll_weight = c->nll,
        .average = resolve_average(c),
        .ignore_index = c->ignore_index,
        .grad_scale = c->gs != 0.0f ? c->gs : 1.0f,
    };
}

static llmcl_pref_options opts_of(const pcase *c, int64_t vocab_chunk)
{
    return (llmcl_pref_options){
        .loss = c->loss,
        .beta = c->beta,
        .gamma = c->gamma,
        .label_smoothing = c->eps,
        .nll_weight = c->nll,
        .logps = c->logps,
        .use_ignore_index = c->ignore_index != IGNORE,
        .ignore_index = c->ignore_index,
        .grad_scale = c->gs,
        .accumulate_weight_grad = c->accumulate,
        .chunk_bytes = 0,
        .vocab_chunk = vocab_chunk,
    };
}



/* Labels [2b, t] by c's pattern: targets uniform in [0, v), or each row's argmax with c->peak. */
static void make_labels(const pcase *c, th_rng *rng, pproblem *p)
{
    const int64_t ns = 2 * p->b, t = p->t;
    for (int64_t s = 0; s < ns; ++s) {
        const int64_t prefix = c->ignore ? th_randint(rng, 0, t / 2 + 1) : 0;
        const int64_t pad = c->ignore ? th_randint(rng, 0, 3) : 0;
        const bool first = c->ignore == 2 && s == 0;
        const bool last =
            s == ns - 1 && (c->ignore == 3 || (c->ignore == 2 && c->loss != LLMCL_PREF_ORPO));
        const bool none = first || last;
        for (int64_t k = 0; k < t; ++k) {
            const int64_t i = s * t + k;
            int64_t target = th_randint(rng, 0, p->v);
            if (c->peak > 0.0)
                for (int64_t j = 0; j < p->v; ++j)
                    if (p->logits[i * p->v + j] > p->logits[i * p->v + target])
                        target = j;
            const bool scored = !none && k >= prefix && (k < t - pad || k == prefix);
            p->y[i] = scored ? target : c->ignore_index;
        }
    }
}

static pproblem make_problem(const pcase *c, uint64_t seed)
{
    pproblem p = {.b = c->b, .t = c->t, .h = c->h, .v = c->v, .n = 2 * c->b * c->t};
    th_rng rng = th_rng_new(seed);
    const int64_t n = p.n, h = p.h, v = p.v;
    const double ws = 0.5 * (c->peak > 0.0 ? c->peak : 1.0);
    p.hid = th_new_normal(&rng, (size_t)(n * h), 1.0, c->dt);
    p.w = th_new_uniform(&rng, (size_t)(v * h), -ws, ws, c->dt);
    p.bias = c->bias ? th_new_uniform(&rng, (size_t)v, -1, 1, c->dt) : NULL;
    p.dw0 = th_new_uniform(&rng, (size_t)(v * h), -0.1, 0.1, LLMCL_F32);
    p.db0 = th_new_uniform(&rng, (size_t)v, -0.1, 0.1, LLMCL_F32);
    p.logits = th_alloc((size_t)(n * v) * sizeof *p.logits);
    ref_linear(p.hid, p.w, p.bias, n, h, v, p.logits);
    p.y = th_alloc((size_t)n * sizeof *p.y);
    make_labels(c, &rng, &p);
    if (c->ref) { /* the policy's own pi moved by a few nats: pairs on both sides of the margin */
        const ref_pref_opts ro = ref_of(c);
        p.refl = th_alloc((size_t)(2 * p.b) * sizeof *p.refl);
        assert_int_equal(ref_preference(p.logits, p.y, p.b, p.t, v, &ro, NULL, NULL, p.refl, NULL),
                         -1);
        for (int64_t s = 0; s < 2 * p.b; ++s)
            p.refl[s] = th_round(LLMCL_F32, p.refl[s] + th_uniform(&rng, -3, 3));
    }
    const int64_t hs[3] = {2 * p.b, p.t, h}, ws2[2] = {v, h}, ys[2] = {2 * p.b, p.t};
    const int64_t ns = 2 * p.b;
    p.th = th_tensor_from(c->dt, 3, hs, p.hid);
    p.tw = th_tensor_from(c->dt, 2, ws2, p.w);
    p.tb = c->bias ? th_tensor_from(c->dt, 1, &v, p.bias) : NULL;
    double *yd = th_alloc((size_t)n * sizeof *yd);
    for (int64_t i = 0; i < n; ++i)
        yd[i] = (double)p.y[i];
    p.ty = th_tensor_from(c->ldt, 2, ys, yd);
    free(yd);
    p.tref = c->ref ? th_tensor_from(LLMCL_F32, 1, &ns, p.refl) : NULL;
    return p;
}

static void free_problem(pproblem *p)
{
    free(p->hid), free(p->w), free(p->bias), free(p->logits), free(p->refl), free(p->dw0);
    free(p->db0), free(p->y);
    llmcl_tensor_destroy(p->th), llmcl_tensor_destroy(p->tw), llmcl_tensor_destroy(p->tb);
    llmcl_tensor_destroy(p->ty), llmcl_tensor_destroy(p->tref);
}

/* The expected outputs: loss, logps [2b], and the gradients of grad_scale x the loss (plus dw0
   and db0 when accumulating). */
typedef struct pexpect {
    double loss, *logps, *dh, *dw, *db;
} pexpect;

static pexpect reference(const pcase *c, const pproblem *p)
{
    const int64_t n = p->n, h = p->h, v = p->v;
    const ref_pref_opts ro = ref_of(c);
    pexpect e = {0.0, NULL, NULL, NULL, NULL};
    e.logps = th_alloc((size_t)(2 * p->b) * sizeof *e.logps);
    e.dh = th_alloc((size_t)(n * h) * sizeof *e.dh);
    e.dw = th_alloc((size_t)(v * h) * sizeof *e.dw);
    e.db = th_alloc((size_t)v * sizeof *e.db);
    double *g = th_alloc((size_t)(n * v) * sizeof *g);
    assert_int_equal(
        ref_preference(p->logits, p->y, p->b, p->t, v, &ro, p->refl, &e.loss, e.logps, g), -1);
    assert_true(isfinite(e.loss) || (c->ignore == 3 && e.loss == INFINITY));
    ref_linear_backward(g, p->hid, p->w, n, h, v, e.dh, e.dw, e.db);
    for (int64_t i = 0; c->accumulate && i < v * h; ++i)
        e.dw[i] += p->dw0[i];
    for (int64_t j = 0; c->accumulate && j < v; ++j)
        e.db[j] += p->db0[j];
    free(g);
    return e;
}

static void free_expect(pexpect *e) { free(e->logps), free(e->dh), free(e->dw), free(e->db); }

/*
 * GEMM results in f32 over H or 2B T terms: slack relative to the largest entry. Products that saw
 * the logit gradient rounded to a 16-bit gdt (the chunked form's) get twice that rounding on top.
 */
static th_tol mat_tol(const double *ref, size_t n, llmcl_dtype gdt)
{
    const double u = gdt == LLMCL_BF16 ? 1.0 / 256 : gdt == LLMCL_F16 ? 1.0 / 2048 : 0.0;
    return (th_tol){(1e-4 + 2 * u) * th_max_abs(ref, n) + 1e-7, 1e-3 + 2 * u};
}

/* The outputs of one call, each NULL where not asked for. */
typedef struct pouts {
    llmcl_tensor *loss, *logps, *dh, *dw, *db;
} pouts;

static pouts make_outs(const pcase *c, const pproblem *p, bool loss, bool logps, int grads)
{
    const int64_t one = 1, ns = 2 * p->b, hs[3] = {2 * p->b, p->t, p->h}, ws[2] = {p->v, p->h};
    return (pouts){
        .loss = loss ? th_tensor(LLMCL_F32, 1, &one) : NULL,
        .logps = logps ? th_tensor(LLMCL_F32, 1, &ns) : NULL,
        .dh = grads & 1 ? th_tensor(LLMCL_F32, 3, hs) : NULL,
        .dw = grads & 2 ? th_tensor(LLMCL_F32, 2, ws) : NULL,
        .db = grads & 4 && c->bias ? th_tensor(LLMCL_F32, 1, &p->v) : NULL,
    };
}

/* Poisons every output, then refills the weight gradients that accumulate. */
static void reset_outs(const pcase *c, const pproblem *p, const pouts *o)
{
    llmcl_tensor *all[] = {o->loss, o->logps, o->dh, o->dw, o->db};
    for (int k = 0; k < 5; ++k)
        if (all[k])
            th_poison(all[k]);
    if (c->accumulate && o->dw)
        th_upload(o->dw, p->dw0);
    if (c->accumulate && o->db)
        th_upload(o->db, p->db0);
}

static void free_outs(pouts *o)
{
    llmcl_tensor_destroy(o->loss), llmcl_tensor_destroy(o->logps), llmcl_tensor_destroy(o->dh);
    llmcl_tensor_destroy(o->dw), llmcl_tensor_destroy(o->db);
}

static llmcl_status call(const pproblem *p, const llmcl_pref_options *o, const pouts *out)
{
    return llmcl_linear_preference_forward(th_ctx(), p->th, p->tw, p->tb, p->ty, p->tref, o,
                                           out->loss, out->logps, out->dh, out->dw, out->db);
}

/* Every output of out against e; gdt the dtype of the logit gradient the products saw, bdt that
   of those dbias summed. */
static void check_outs_as(const pproblem *p, const pexpect *e, const pouts *out, llmcl_dtype gdt,
                          llmcl_dtype bdt)
{
    const size_t nh = (size_t)(p->n * p->h), vh = (size_t)(p->v * p->h), ns = (size_t)(2 * p->b);
    if (out->loss) {
        double got;
        th_download(out->loss, &got);
        TH_ASSERT_CLOSE("loss", &e->loss, &got, 1, loss_tol);
    }
    if (out->logps) {
        double *got = th_download_new(out->logps);
        TH_ASSERT_CLOSE("logps", e->logps, got, ns, logps_tol);
        free(got);
    }
    if (out->dh) {
        double *got = th_download_new(out->dh);
        TH_ASSERT_CLOSE("dhidden", e->dh, got, nh, mat_tol(e->dh, nh, gdt));
        free(got);
    }
    if (out->dw) {
        double *got = th_download_new(out->dw);
        TH_ASSERT_CLOSE("dweight", e->dw, got, vh, mat_tol(e->dw, vh, gdt));
        free(got);
    }
    if (out->db) {
        double *got = th_download_new(out->db);
        TH_ASSERT_CLOSE("dbias", e->db, got, (size_t)p->v, mat_tol(e->db, (size_t)p->v, bdt));
        free(got);
    }
}

/* As check_outs_as, dbias summed from f32 logit gradients (16-bit logits' are their own). */
static void check_outs(const pproblem *p, const pexpect *e, const pouts *out, llmcl_dtype gdt)
{
    check_outs_as(p, e, out, gdt, LLMCL_F32);
}

/* Each output's bytes, to compare two runs bit for bit. */
typedef struct pbits {
    double *x[5];
} pbits;

static pbits take_bits(const pouts *o)
{
    const llmcl_tensor *all[] = {o->loss, o->logps, o->dh, o->dw, o->db};
    pbits b;
    for (int k = 0; k < 5; ++k)
        b.x[k] = all[k] ? th_download_new(all[k]) : NULL;
    return b;
}

static void assert_same_bits(const pouts *o, const pbits *a, const pbits *b)
{
    const llmcl_tensor *all[] = {o->loss, o->logps, o->dh, o->dw, o->db};
    for (int k = 0; k < 5; ++k)
        if (all[k])
            assert_memory_equal(a->x[k], b->x[k],
                                (size_t)llmcl_tensor_numel(all[k]) * sizeof *a->x[k]);
}

static void free_bits(pbits *b)
{
    for (int k = 0; k < 5; ++k)
        free(b->x[k]);
}

/*
 * Case c from seed in tiles (vocab_chunk -1), chunks of vocab_chunk classes, or (0) chunks of
 * whole pairs within chunk_bytes (0: the default) where one fits and the device's fused form
 * where none does, on poisoned outputs against the reference; with repeat, again for the same
 * bits.
 */
static void run_budget(const pcase *c, uint64_t seed, int64_t vocab_chunk, uint64_t chunk_bytes,
                       bool repeat)
{
    pproblem p = make_problem(c, seed);
    pexpect e = reference(c, &p);
    pouts out = make_outs(c, &p, true, true, c->grads);
    llmcl_pref_options o = opts_of(c, vocab_chunk);
    o.chunk_bytes = chunk_bytes;
    reset_outs(c, &p, &out);
    TH_OK(call(&p, &o, &out));
    /* chunks of classes or of pairs round the dlogits to 16-bit inputs' dtype; tiles do not */
    const bool chunks = vocab_chunk >= 0;
    check_outs(&p, &e, &out, chunks ? c->dt : LLMCL_F32);
    if (repeat) {
        pbits first = take_bits(&out);
        reset_outs(c, &p, &out);
        TH_OK(call(&p, &o, &out));
        pbits second = take_bits(&out);
        assert_same_bits(&out, &first, &second);
        free_bits(&first), free_bits(&second);
    }
    free_outs(&out);
    free_expect(&e);
    free_problem(&p);
}

static void run_case(const pcase *c, uint64_t seed, int64_t vocab_chunk, bool repeat)
{
    run_budget(c, seed, vocab_chunk, 0, repeat);
}

#define F32 LLMCL_F32
#define BF16 LLMCL_BF16
#define F16 LLMCL_F16
#define I32 LLMCL_I32
#define I64 LLMCL_I64
#define DEF LLMCL_PREF_LOGPS_DEFAULT
#define SUM LLMCL_PREF_LOGPS_SUM
#define AVG LLMCL_PREF_LOGPS_AVERAGE

static const pcase cases[] = {
    /* dt, ldt, loss, b, t, h, v, beta, gamma, eps, nll, logps, bias, ref, ignore, ignore_index,
       accumulate, gs, grads, peak */
    {F32, I64, LLMCL_PREF_DPO, 2, 7, 40, 1001, 0.1f, 0, 0, 0, DEF, false, true, 1, IGNORE, false,
     0, 7, 0},
    /* beta 0 (0.1), cDPO, RPO's NLL, accumulated, scaled, sequences that score nothing */
    {F32, I32, LLMCL_PREF_DPO, 3, 13, 40, 1001, 0, 0, 0.1f, 0.5f, DEF, true, true, 2, IGNORE, true,
     2.5f, 7, 0},
    {BF16, I64, LLMCL_PREF_DPO, 2, 7, 72, 1001, 0.5f, 0, 0.25f, 0, AVG, true, true, 1, -1, false,
     0, 7, 0},
    {F16, I32, LLMCL_PREF_DPO, 1, 7, 40, 333, 0.2f, 0, 0.5f, 0, DEF, true, true, 1, IGNORE, false,
     0, 7, 0},
    {F32, I64, LLMCL_PREF_IPO, 2, 7, 40, 517, 0.5f, 0, 0, 0, DEF, false, true, 2, IGNORE, false, 0,
     7, 0},
    {BF16, I32, LLMCL_PREF_IPO, 1, 13, 40, 1001, 0.1f, 0, 0, 1.0f, SUM, true, true, 1, 5, true,
     -0.5f, 7, 0},
    {F32, I64, LLMCL_PREF_SIMPO, 3, 7, 40, 1001, 2.0f, 0.5f, 0, 0, DEF, true, false, 1, IGNORE,
     false, 0, 7, 0},
    {BF16, I64, LLMCL_PREF_SIMPO, 2, 13, 72, 300, 0.1f, 1.2f, 0.1f, 0, SUM, false, false, 2,
     IGNORE, true, 0, 3, 0},
    {F32, I32, LLMCL_PREF_CPO, 2, 7, 40, 1001, 0.1f, 0, 0, 1.0f, DEF, false, false, 1, IGNORE,
     false, 0, 7, 0},
    {BF16, I64, LLMCL_PREF_CPO, 3, 13, 40, 777, 0.2f, 0, 0.1f, 1.0f, AVG, true, false, 2, IGNORE,
     false, -0.5f, 7, 0},
    /* B 1, both sequences scoring nothing: pi 0, the term log 2, no NLL, zero gradients */
    {F32, I64, LLMCL_PREF_CPO, 1, 7, 40, 64, 1.0f, 0, 0, 1.0f, DEF, true, false, 2, IGNORE, true,
     0, 7, 0},
    /* ORPO: the first chosen sequence scores nothing (its pair's term 0) */
    {F32, I64, LLMCL_PREF_ORPO, 2, 7, 40, 1001, 0.1f, 0, 0, 1.0f, DEF, true, false, 2, IGNORE,
     false, 0, 7, 0},
    {BF16, I32, LLMCL_PREF_ORPO, 3, 7, 72, 1001, 0.5f, 0, 0, 1.0f, SUM, false, false, 1, IGNORE,
     true, 3.0f, 7, 0},
    {F32, I64, LLMCL_PREF_ORPO, 1, 13, 40, 517, 1.0f, 0, 0, 1.0f, DEF, true, false, 1, IGNORE,
     false, 0, 5, 0},
    {BF16, I64, LLMCL_PREF_ORPO, 2, 7, 40, 300, 0.1f, 0, 0, 1.0f, DEF, false, false, 2, IGNORE,
     false, 0, 1, 0},
    /* ORPO near pi = 0: every target its row's argmax of peaked logits */
    {F32, I64, LLMCL_PREF_ORPO, 2, 7, 40, 64, 0.2f, 0, 0, 1.0f, DEF, true, false, 1, IGNORE,
     false, 0, 7, 4.0},
    {BF16, I64, LLMCL_PREF_ORPO, 1, 13, 40, 130, 1.0f, 0, 0, 0.5f, DEF, false, false, 0, IGNORE,
     false, 0, 7, 8.0},
};

static void test_pref_tiles(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("case %zu in tiles\n", i);
        run_case(&cases[i], 100 + i, -1, i % 2 == 0);
    }
}

static void test_pref_chunks(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const int64_t chunk = cases[i].v > 600 ? WIDE_CHUNK : CHUNK;
        printf("case %zu in chunks of %lld classes\n", i, (long long)chunk);
        run_case(&cases[i], 100 + i, chunk, i % 2 == 1);
    }
    /* the device's own choice, and chunks wider than the vocabulary */
    run_case(&cases[1], 101, 0, true);
    run_case(&cases[11], 111, 0, false);
    run_case(&cases[6], 106, 4096, false);
}

/*
 * Chunks of whole pairs (the chunked linear cross-entropy with the pairs interleaved): a budget
 * of one pair a chunk, of two (B 3 leaves a last chunk of one), and one too small for a pair,
 * which falls back to the fused form.
 */
static void test_pref_pair_chunks(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const pcase *c = &cases[i];
        const uint64_t pair = (uint64_t)(2 * c->t) * (uint64_t)c->v * 6;
        printf("case %zu in chunks of one pair, two pairs, and none\n", i);
        run_budget(c, 700 + i, 0, pair, i % 2 == 0);
        run_budget(c, 700 + i, 0, 2 * pair, false);
        run_budget(c, 700 + i, 0, pair / 2, false);
    }
}

/*
 * Inputs of multiples of 1/16, exact in 16 bits, so that each logit (at most 72 products of
 * multiples of 2^-8, far below 2^16) is exact in f32 and its rounding to c's 16-bit dtype is the
 * reference's (test_cross_entropy's lin_quantize); then the logits the reference takes rounded.
 */
static void quantize_rounded(const pcase *c, pproblem *p)
{
    double *qs[] = {p->hid, p->w, p->bias};
    const size_t ns[] = {(size_t)(p->n * p->h), (size_t)(p->v * p->h), (size_t)p->v};
    llmcl_tensor *ts[] = {p->th, p->tw, p->tb};
    th_upload_sixteenths(3, qs, ns, ts);
    ref_linear(p->hid, p->w, p->bias, p->n, p->h, p->v, p->logits);
    th_round_all(c->dt, p->logits, (size_t)(p->n * p->v));
}

/*
 * 16-bit logits (opts->logits_dtype) on every 16-bit case, against the reference on the rounded
 * logits: chunks of one pair and the default budget, with the case's gradients and for the
 * logps alone (the reference model's pass, which then runs in chunks too); a budget too small
 * for a pair runs the fused form in f32, the same bits as logits_dtype F32.
 */
static void test_pref_logits16(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const pcase *c = &cases[i];
        if (c->dt == LLMCL_F32 || c->peak > 0.0)
            continue;
        printf("case %zu with %s logits\n", i, llmcl_dtype_name(c->dt));
        pproblem p = make_problem(c, 900 + i);
        quantize_rounded(c, &p);
        pexpect e = reference(c, &p);
        const uint64_t pair = (uint64_t)(2 * c->t) * (uint64_t)c->v * 2;
        const uint64_t budgets[2] = {pair, 0};
        pouts out = make_outs(c, &p, true, true, c->grads), logps = make_outs(c, &p, 0, 1, 0);
        for (int k = 0; k < 2; ++k) {
            llmcl_pref_options o = opts_of(c, 0);
            o.chunk_bytes = budgets[k], o.logits_dtype = c->dt;
            reset_outs(c, &p, &out);
            TH_OK(call(&p, &o, &out));
            check_outs_as(&p, &e, &out, c->dt, c->dt);
            th_poison(logps.logps);
            TH_OK(llmcl_linear_preference_forward(th_ctx(), p.th, p.tw, p.tb, p.ty, NULL, &o,
                                                  NULL, logps.logps, NULL, NULL, NULL));
            check_outs(&p, &e, &logps, c->dt);
        }
        llmcl_pref_options o = opts_of(c, 0);
        o.chunk_bytes = pair / 2;
        reset_outs(c, &p, &out);
        TH_OK(call(&p, &o, &out));
        pbits f32 = take_bits(&out);
        o.logits_dtype = c->dt;
        reset_outs(c, &p, &out);
        TH_OK(call(&p, &o, &out));
        pbits half = take_bits(&out);
        assert_same_bits(&out, &f32, &half);
        free_bits(&f32), free_bits(&half);
        free_outs(&out), free_outs(&logps);
        free_expect(&e);
        free_problem(&p);
    }
}

/*
 * The logps-only call (a reference model's pass: no loss, no gradients, no ref_logps even for
 * DPO) gives each loss's default logps; the gradients without the loss; the loss without the
 * gradients.
 */
static void test_pref_partial_outputs(void **state)
{
    (void)state;
    const pcase *dpo = &cases[1], *simpo = &cases[6];
    for (int k = 0; k < 2; ++k) {
        const pcase *c = k ? simpo : dpo;
        pproblem p = make_problem(c, 500 + k);
        pexpect e = reference(c, &p);
        pouts out = make_outs(c, &p, false, true, 0);
        llmcl_pref_options o = opts_of(c, -1);
        TH_OK(llmcl_linear_preference_forward(th_ctx(), p.th, p.tw, p.tb, p.ty, NULL, &o, NULL,
                                              out.logps, NULL, NULL, NULL));
        check_outs(&p, &e, &out, LLMCL_F32);
        o.vocab_chunk = WIDE_CHUNK;
        th_poison(out.logps);
        TH_OK(llmcl_linear_preference_forward(th_ctx(), p.th, p.tw, p.tb, p.ty, NULL, &o, NULL,
                                              out.logps, NULL, NULL, NULL));
        check_outs(&p, &e, &out, LLMCL_F32);
        free_outs(&out);

        /* gradients only, then the loss only */
        pouts grads = make_outs(c, &p, false, false, 7), loss = make_outs(c, &p, true, false, 0);
        reset_outs(c, &p, &grads);
        TH_OK(call(&p, &o, &grads));
        check_outs(&p, &e, &grads, c->dt);
        TH_OK(call(&p, &o, &loss));
        check_outs(&p, &e, &loss, LLMCL_F32);
        free_outs(&grads), free_outs(&loss);
        free_expect(&e);
        free_problem(&p);
    }
}

/* hidden as rows of a wider buffer ([2B, T, H] of [2B T, H + 5] at an offset of 3): the padding
   is neither read nor written. */
static void test_pref_strided_hidden(void **state)
{
    (void)state;
    const pcase *c = &cases[6];
    pproblem p = make_problem(c, 600);
    pexpect e = reference(c, &p);
    const int64_t wide = p.h + 5, bs[2] = {p.n, wide};
    const int64_t hs[3] = {2 * p.b, p.t, p.h}, strides[3] = {p.t * wide, wide, 1};
    llmcl_tensor *buf = th_tensor(c->dt, 2, bs), *view;
    TH_OK(llmcl_tensor_view(buf, 3, hs, strides, 3, &view));
    th_upload(view, p.hid);
    double *before = th_download_new(buf);
    llmcl_tensor_destroy(p.th);
    p.th = view;
    pouts out = make_outs(c, &p, true, true, 7);
    for (int64_t chunk = -1; chunk <= WIDE_CHUNK; chunk += WIDE_CHUNK + 1) {
        const llmcl_pref_options o = opts_of(c, chunk);
        reset_outs(c, &p, &out);
        TH_OK(call(&p, &o, &out));
        check_outs(&p, &e, &out, chunk > 0 ? c->dt : LLMCL_F32);
    }
    double *after = th_download_new(buf);
    assert_memory_equal(before, after, (size_t)(p.n * wide) * sizeof *after);
    free(before), free(after);
    free_outs(&out);
    free_expect(&e);
    free_problem(&p);
    llmcl_tensor_destroy(buf);
}

/*
 * Devices that cut loops short, on long sequences: LLMCL_LOOP_LIMIT 1000 iterations (below one
 * sequence's 1500 positions and the bias's 3000 rows) in chunks, and 20000 in tiles (whose
 * backward refuses 1000: below one tile's sums, as llmcl_fused_cross_entropy_backward's).
 */
static void test_pref_loop_limit(void **state)
{
    (void)state;
    static const pcase long_seqs[] = {
        {F32, I64, LLMCL_PREF_ORPO, 1, 1500, 16, 50, 0.1f, 0, 0, 1.0f, DEF, true, false, 1,
         IGNORE, false, 0, 7, 0},
        {F32, I32, LLMCL_PREF_DPO, 1, 1500, 16, 50, 0.1f, 0, 0.1f, 0.5f, DEF, true, true, 2,
         IGNORE, true, 0, 7, 0},
    };
    th_loop_limit("1000");
    run_case(&long_seqs[0], 800, CHUNK, true);
    run_case(&long_seqs[1], 801, CHUNK, false);
    th_loop_limit("20000");
    run_case(&long_seqs[0], 802, -1, false);
    run_case(&long_seqs[1], 803, -1, true);
}

/* Back to the device's own loop limit, whether the test passed or not. */
static int reset_loop_limit(void **state)
{
    (void)state;
    th_loop_limit(NULL);
    return 0;
}

/*
 * ORPO's rejected sequence that scores nothing has pi 0 and infinite odds: its pair's term, and
 * so the loss, is +inf, while the gradients stay finite (no position of that sequence takes one;
 * the chosen side's factor is finite).
 */
static void test_pref_orpo_infinite(void **state)
{
    (void)state;
    static const pcase inf_cases[] = {
        {F32, I64, LLMCL_PREF_ORPO, 2, 7, 40, 64, 0.1f, 0, 0, 1.0f, DEF, true, false, 3, IGNORE,
         false, 0, 7, 0},
        {BF16, I32, LLMCL_PREF_ORPO, 1, 13, 40, 130, 0.5f, 0, 0, 0.0f, SUM, false, false, 3,
         IGNORE, true, 0, 3, 0},
    };
    for (int k = 0; k < 2; ++k) {
        run_case(&inf_cases[k], 900 + k, -1, false);
        run_case(&inf_cases[k], 900 + k, CHUNK, false);
    }
}

/* ---- bad arguments ---- */

/* A valid f32 call (DPO, B 1, T 3, H 8, V 20, a bias, ref_logps) and its outputs: dweight holds
   values (accumulated into), the others are poisoned. */
typedef struct bad_fixture {
    llmcl_tensor *h, *w, *b, *y, *ref, *loss, *logps, *dh, *dw, *db;
    double dw0[160];
} bad_fixture;

static bad_fixture bad_make(void)
{
    const int64_t hs[3] = {2, 3, 8}, ws[2] = {20, 8}, ys[2] = {2, 3}, v = 20, two = 2, one = 1;
    th_rng rng = th_rng_new(700);
    double hid[48], w[160], b[20];
    const double y[6] = {1, 7, IGNORE, IGNORE, 19, 0}, refl[2] = {-6.0, -7.0};
    th_fill_normal(&rng, hid, 48, 1.0);
    th_fill_uniform(&rng, w, 160, -0.5, 0.5);
    th_fill_uniform(&rng, b, 20, -1.0, 1.0);
    bad_fixture f = {
        .h = th_tensor_from(LLMCL_F32, 3, hs, hid),
        .w = th_tensor_from(LLMCL_F32, 2, ws, w),
        .b = th_tensor_from(LLMCL_F32, 1, &v, b),
        .y = th_tensor_from(LLMCL_I64, 2, ys, y),
        .ref = th_tensor_from(LLMCL_F32, 1, &two, refl),
        .loss = th_tensor(LLMCL_F32, 1, &one),
        .logps = th_tensor(LLMCL_F32, 1, &two),
        .dh = th_tensor(LLMCL_F32, 3, hs),
        .dw = th_tensor(LLMCL_F32, 2, ws),
        .db = th_tensor(LLMCL_F32, 1, &v),
        .dw0 = {0},
    };
    th_fill_uniform(&rng, f.dw0, 160, -1.0, 1.0);
    th_round_all(LLMCL_F32, f.dw0, 160);
    th_upload(f.dw, f.dw0);
    return f;
}

static void bad_free(bad_fixture *f)
{
    llmcl_tensor *all[] = {f->h, f->w, f->b, f->y, f->ref, f->loss, f->logps, f->dh, f->dw, f->db};
    for (int k = 0; k < 10; ++k)
        llmcl_tensor_destroy(all[k]);
}

/* What a failed call must leave: the poison, and dweight's values. */
static void assert_untouched(const bad_fixture *f)
{
    llmcl_tensor *poisoned[] = {f->loss, f->logps, f->dh, f->db};
    for (int k = 0; k < 4; ++k) {
        double *got = th_download_new(poisoned[k]);
        for (int64_t i = 0; i < llmcl_tensor_numel(poisoned[k]); ++i)
            assert_true(isnan(got[i]));
        free(got);
    }
    double *dw = th_download_new(f->dw);
    assert_memory_equal(dw, f->dw0, sizeof f->dw0);
    free(dw);
}

/* One call that must fail with `want` and write nothing. */
#define BAD(want, h, w, b, y, ref, o, loss, logps, dh, dw, db)                                    \
    do {                                                                                          \
        TH_FAILS(llmcl_linear_preference_forward(ctx, h, w, b, y, ref, o, loss, logps, dh, dw,    \
                                                 db),                                             \
                 want);                                                                           \
        assert_untouched(&f);                                                                     \
    } while (0)

/* The fixture's call with options o, failing with want. */
#define BAD_OPTS(want, ref, o)                                                                    \
    BAD(want, f.h, f.w, f.b, f.y, ref, o, f.loss, f.logps, f.dh, f.dw, f.db)

static void test_pref_bad_options(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    bad_fixture f = bad_make();
    const llmcl_pref_options ok = {.accumulate_weight_grad = 1};
    llmcl_pref_options o = ok;
    const llmcl_status inv = LLMCL_ERROR_INVALID_ARGUMENT;
    /* DPO and IPO need ref_logps for a loss or a gradient; the others refuse it */
    BAD_OPTS(inv, NULL, &o);
    BAD(inv, f.h, f.w, f.b, f.y, NULL, &o, NULL, f.logps, f.dh, NULL, NULL);
    BAD(inv, f.h, f.w, f.b, f.y, NULL, &o, NULL, NULL, NULL, f.dw, NULL);
    o.loss = LLMCL_PREF_IPO;
    BAD_OPTS(inv, NULL, &o);
    for (int l = LLMCL_PREF_SIMPO; l <= LLMCL_PREF_ORPO; ++l) {
        o.loss = (llmcl_pref_loss)l;
        BAD_OPTS(inv, f.ref, &o);
        BAD(inv, f.h, f.w, f.b, f.y, f.ref, &o, NULL, f.logps, NULL, NULL, NULL);
    }
    /* beta > 0 and finite */
    const float bad_beta[] = {-0.1f, -INFINITY, INFINITY, NAN};
    for (int k = 0; k < 4; ++k) {
        o = ok, o.beta = bad_beta[k];
        BAD_OPTS(inv, f.ref, &o);
    }
    /* label smoothing in [0, 0.5], for DPO, SimPO and CPO only */
    const float bad_eps[] = {-0.01f, 0.51f, 1.0f, NAN};
    for (int k = 0; k < 4; ++k) {
        o = ok, o.label_smoothing = bad_eps[k];
        BAD_OPTS(inv, f.ref, &o);
        o.loss = LLMCL_PREF_CPO;
        BAD_OPTS(inv, NULL, &o);
    }
    o = ok, o.loss = LLMCL_PREF_IPO, o.label_smoothing = 0.1f;
    BAD_OPTS(inv, f.ref, &o);
    o.loss = LLMCL_PREF_ORPO;
    BAD_OPTS(inv, NULL, &o);
    /* gamma for SimPO only, finite */
    for (int l = LLMCL_PREF_DPO; l <= LLMCL_PREF_ORPO; ++l) {
        o = ok, o.loss = (llmcl_pref_loss)l, o.gamma = l == LLMCL_PREF_SIMPO ? INFINITY : 0.5f;
        BAD_OPTS(inv, l <= LLMCL_PREF_IPO ? f.ref : NULL, &o);
    }
    o = ok, o.loss = LLMCL_PREF_SIMPO, o.gamma = NAN;
    BAD_OPTS(inv, NULL, &o);
    /* nll_weight >= 0 and finite; grad_scale finite; vocab_chunk >= -1 */
    const float bad_nll[] = {-1.0f, INFINITY, NAN};
    for (int k = 0; k < 3; ++k) {
        o = ok, o.nll_weight = bad_nll[k];
        BAD_OPTS(inv, f.ref, &o);
    }
    o = ok, o.grad_scale = NAN;
    BAD_OPTS(inv, f.ref, &o);
    o = ok, o.vocab_chunk = -2;
    BAD_OPTS(inv, f.ref, &o);
    /* logits_dtype F32 or hidden's 16-bit dtype: f32 hidden takes no 16-bit logits */
    const llmcl_dtype bad_ldt[] = {LLMCL_BF16, LLMCL_F16, LLMCL_I32};
    for (int k = 0; k < 3; ++k) {
        o = ok, o.logits_dtype = bad_ldt[k];
        BAD_OPTS(inv, f.ref, &o);
        BAD(inv, f.h, f.w, f.b, f.y, NULL, &o, NULL, f.logps, NULL, NULL, NULL);
    }
    /* values outside the enums */
    o = ok, o.loss = (llmcl_pref_loss)5;
    BAD_OPTS(inv, NULL, &o);
    o = ok, o.loss = (llmcl_pref_loss)-1;
    BAD_OPTS(inv, f.ref, &o);
    o = ok, o.logps = (llmcl_pref_logps)3;
    BAD_OPTS(inv, f.ref, &o);
    o = ok, o.logps = (llmcl_pref_logps)-1;
    BAD_OPTS(inv, f.ref, &o);
    /* the edges that are allowed: beta 0 (0.1), eps 0.5, a negative gamma for SimPO */
    o = ok, o.label_smoothing = 0.5f;
    TH_OK(llmcl_linear_preference_forward(ctx, f.h, f.w, f.b, f.y, f.ref, &o, f.loss, f.logps,
                                          f.dh, f.dw, f.db));
    o = ok, o.loss = LLMCL_PREF_SIMPO, o.gamma = -0.5f, o.label_smoothing = 0.5f;
    TH_OK(llmcl_linear_preference_forward(ctx, f.h, f.w, f.b, f.y, NULL, &o, f.loss, f.logps,
                                          f.dh, f.dw, f.db));
    bad_free(&f);
}

static void test_pref_bad_tensors(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    bad_fixture f = bad_make();
    const llmcl_pref_options ok = {.accumulate_weight_grad = 1}, *o = &ok;
    const llmcl_status inv = LLMCL_ERROR_INVALID_ARGUMENT, shape = LLMCL_ERROR_SHAPE_MISMATCH;
    const llmcl_status dtype = LLMCL_ERROR_UNSUPPORTED_DTYPE;
    /* missing arguments */
    TH_FAILS(llmcl_linear_preference_forward(NULL, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps,
                                             f.dh, f.dw, f.db),
             inv);
    assert_untouched(&f);
    BAD(inv, NULL, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(inv, f.h, NULL, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, NULL, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);

    /* shapes: an odd number of sequences, labels, weight, bias, ref_logps and each output */
    const int64_t h3[3] = {3, 3, 8}, y3[2] = {3, 3}, y24[2] = {2, 4}, h9[3] = {2, 3, 9};
    const int64_t w9[2] = {20, 9}, w21[2] = {21, 8}, v21 = 21, three = 3, two = 2;
    llmcl_tensor *hodd = th_tensor(LLMCL_F32, 3, h3), *yodd = th_tensor(LLMCL_I64, 2, y3);
    llmcl_tensor *y24t = th_tensor(LLMCL_I64, 2, y24), *h9t = th_tensor(LLMCL_F32, 3, h9);
    llmcl_tensor *w9t = th_tensor(LLMCL_F32, 2, w9), *w21t = th_tensor(LLMCL_F32, 2, w21);
    llmcl_tensor *v21t = th_tensor(LLMCL_F32, 1, &v21), *n3 = th_tensor(LLMCL_F32, 1, &three);
    llmcl_tensor *n2 = th_tensor(LLMCL_F32, 1, &two);
    BAD(shape, hodd, f.w, f.b, yodd, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, hodd, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, y24t, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, yodd, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, w9t, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, v21t, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, n3, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, f.ref, o, n2, f.logps, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, f.ref, o, f.loss, n3, f.dh, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, h9t, f.dw, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, w21t, f.db);
    BAD(shape, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, v21t);

    /* dtypes: hidden, weight and bias of one float dtype, integer labels, f32 for the rest */
    const int64_t hs[3] = {2, 3, 8}, ws[2] = {20, 8}, ys[2] = {2, 3}, v = 20;
    llmcl_tensor *hi32 = th_tensor(LLMCL_I32, 3, hs), *hbf = th_tensor(LLMCL_BF16, 3, hs);
    llmcl_tensor *wbf = th_tensor(LLMCL_BF16, 2, ws), *bbf = th_tensor(LLMCL_BF16, 1, &v);
    llmcl_tensor *yf = th_tensor(LLMCL_F32, 2, ys), *rbf = th_tensor(LLMCL_BF16, 1, &two);
    const int64_t one = 1;
    llmcl_tensor *lbf = th_tensor(LLMCL_BF16, 1, &one), *pf16 = th_tensor(LLMCL_F16, 1, &two);
    llmcl_tensor *dhbf = th_tensor(LLMCL_BF16, 3, hs), *dbbf = th_tensor(LLMCL_BF16, 1, &v);
    llmcl_tensor *wi32 = th_tensor(LLMCL_I32, 2, ws);
    BAD(dtype, hi32, wi32, NULL, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, hbf, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, wbf, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, bbf, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, yf, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, rbf, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, f.ref, o, lbf, f.logps, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, f.ref, o, f.loss, pf16, f.dh, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, dhbf, f.dw, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, wbf, f.db);
    BAD(dtype, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, dbbf);

    /* layouts: sequences and positions that are not one run of rows; strided labels */
    const int64_t tr[3] = {8, 16, 1}, ys2[2] = {2, 3}, ystr[2] = {6, 2};
    llmcl_tensor *hbuf = th_tensor(LLMCL_F32, 1, &(int64_t){48}), *htr, *ybuf, *ystrided;
    TH_OK(llmcl_tensor_view(hbuf, 3, hs, tr, 0, &htr));
    ybuf = th_tensor(LLMCL_I64, 1, &(int64_t){12});
    th_upload(ybuf, (const double[12]){1, 0, 7, 0, IGNORE, 0, IGNORE, 0, 19, 0, 0, 0});
    TH_OK(llmcl_tensor_view(ybuf, 2, ys2, ystr, 0, &ystrided));
    BAD(inv, htr, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, ystrided, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.db);

    /* overlaps: outputs over inputs (dweight over weight, dbias over bias, dhidden over hidden,
       logps over ref_logps) and over each other (loss inside logps' buffer) */
    llmcl_tensor *pair, *first, *head, *dwhead;
    llmcl_tensor *both = th_tensor(LLMCL_F32, 1, &three);
    TH_OK(llmcl_tensor_view(both, 1, &two, NULL, 1, &pair));
    TH_OK(llmcl_tensor_view(both, 1, &one, NULL, 2, &first));
    TH_OK(llmcl_tensor_view(f.dh, 1, &one, NULL, 5, &head));
    TH_OK(llmcl_tensor_view(f.dw, 1, &v, NULL, 0, &dwhead));
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.w, f.db);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, f.b);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.h, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.ref, f.dh, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, first, pair, f.dh, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, head, f.logps, f.dh, f.dw, f.db);
    BAD(inv, f.h, f.w, f.b, f.y, f.ref, o, f.loss, f.logps, f.dh, f.dw, dwhead);

    llmcl_tensor *all[] = {hodd, yodd, y24t,  h9t,  w9t,  w21t, v21t, n3,       n2,
                           hi32, hbf,  wbf,   bbf,  yf,   rbf,  lbf,  pf16,     dhbf,
                           dbbf, wi32, hbuf,  htr,  ybuf, pair, both, ystrided, first,
                           head, dwhead};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; ++k)
        llmcl_tensor_destroy(all[k]);
    bad_free(&f);
}

/* Labels outside [0, V) that are not ignore_index, I32 and I64, in tiles and chunks, with and
   without gradients: the call fails naming the label and writes nothing, not even logps. */
static void test_pref_bad_labels(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    bad_fixture f = bad_make();
    const int64_t ys[2] = {2, 3};
    const double bad[3][6] = {
        {1, 7, IGNORE, IGNORE, 20, 0}, /* V */
        {1, -1, 2, 3, 4, 5},           /* negative, not ignore_index */
        {1, 7, 2, 3, 4, 1000},         /* far above */
    };
    const char *named[3] = {"= 20", "= -1", "= 1000"};
    for (int k = 0; k < 6; ++k) {
        llmcl_tensor *y = th_tensor_from(k % 2 ? LLMCL_I32 : LLMCL_I64, 2, ys, bad[k % 3]);
        llmcl_pref_options o = {.accumulate_weight_grad = 1, .vocab_chunk = k < 3 ? -1 : CHUNK};
        BAD(LLMCL_ERROR_INVALID_ARGUMENT, f.h, f.w, f.b, y, f.ref, &o, f.loss, f.logps, f.dh, f.dw,
            f.db);
        assert_non_null(strstr(llmcl_last_error(ctx), "labels"));
        assert_non_null(strstr(llmcl_last_error(ctx), named[k % 3]));
        BAD(LLMCL_ERROR_INVALID_ARGUMENT, f.h, f.w, f.b, y, NULL, &o, NULL, f.logps, NULL, NULL,
            NULL);
        /* -100 is a label like any other once ignore_index is -1 */
        if (k % 3 == 1) {
            o.use_ignore_index = 1, o.ignore_index = -1;
            const double bad100[6] = {1, 2, IGNORE, 3, 4, 5};
            llmcl_tensor *y100 = th_tensor_from(LLMCL_I64, 2, ys, bad100);
            BAD(LLMCL_ERROR_INVALID_ARGUMENT, f.h, f.w, f.b, y100, f.ref, &o, f.loss, f.logps,
                f.dh, f.dw, f.db);
            llmcl_tensor_destroy(y100);
            TH_OK(llmcl_linear_preference_forward(ctx, f.h, f.w, f.b, y, f.ref, &o, NULL,
                                                  f.logps, NULL, NULL, NULL));
            th_poison(f.logps);
        }
        llmcl_tensor_destroy(y);
    }
    bad_free(&f);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_gradient),        cmocka_unit_test(test_ref_formulas),
        cmocka_unit_test(test_pref_tiles),          cmocka_unit_test(test_pref_chunks),
        cmocka_unit_test(test_pref_pair_chunks),    cmocka_unit_test(test_pref_logits16),
        cmocka_unit_test(test_pref_partial_outputs), cmocka_unit_test(test_pref_strided_hidden),
        cmocka_unit_test(test_pref_orpo_infinite),
        cmocka_unit_test_teardown(test_pref_loop_limit, reset_loop_limit),
        cmocka_unit_test(test_pref_bad_options),
        cmocka_unit_test(test_pref_bad_tensors),
        cmocka_unit_test(test_pref_bad_labels),
    };
    return TH_RUN(tests);
}
