/*
 * test_attention.c: flash attention forward (O, LSE) and backward (dQ, dK, dV) against naive
 * attention in double (ref/attention_ref.c), for every option: causal with Tq = Tk, Tq < Tk
 * and Tq > Tk, sliding windows (narrow, one-sided, wider than T, with causal), softcap, custom
 * scale, GQA and MQA, both layouts, every head dim (the multiples of 8 from 8 to 256), T = 1,
 * varlen batches with sequences of length 1, a causal or windowed key range that ends on a key
 * tile's first key, f32 / bf16 / f16 storage; plus determinism, extra
 * memory, tuning overrides and files, and every bad-input path. Sequence lengths span several
 * tiles on every device, but in the loop over every head dim.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "harness.h"

typedef struct attn_case {
    llmcl_dtype dtype;
    int B, Hq, Hkv, D, Tq, Tk;
    bool bthd;                  /* [B, T, H, D] storage seen as [B, H, T, D] through strides */
    bool packed;                /* q, k, v side by side in the rows of one [B, T, Hq + 2 Hkv, D]
                                   buffer, and dq, dk, dv in another (llmcl-train's layout) */
    int pad;                    /* dense [B, H, T, D] views starting pad elements into storage */
    const int32_t *cu_q, *cu_k; /* varlen offsets (B + 1 each), or NULL */
    llmcl_attention_opts opts;  /* cu_seqlens are filled in by the runner */
} attn_case;

/* A device Q-like (heads = Hq) or K-like tensor of the case's layout, plus the storage it views. */
typedef struct attn_io {
    llmcl_tensor *base, *t;
} attn_io;

static attn_ref_cfg ref_cfg(const attn_case *c)
{
    attn_ref_cfg r = {c->B, c->Hq, c->Hkv, c->D, c->Tq, c->Tk, c->cu_q, c->cu_k,
                      c->opts.causal, -1, -1, c->opts.softcap, c->opts.scale};
    if (c->opts.use_window) {
        r.window_left = c->opts.window_left;
        r.window_right = c->opts.window_right;
    }
    return r;
}

static attn_io io_new(const attn_case *c, int heads, int T, int64_t total, const double *values)
{
    attn_io io = {0};
    if (c->cu_q) {
        const int64_t shape[3] = {total, heads, c->D};
        io.base = th_tensor(c->dtype, 3, shape);
        io.t = io.base;
    } else if (c->bthd) {
        const int64_t store[4] = {c->B, T, heads, c->D}, shape[4] = {c->B, heads, T, c->D};
        const int64_t strides[4] = {(int64_t)T * heads * c->D, c->D, (int64_t)heads * c->D, 1};
        io.base = th_tensor(c->dtype, 4, store);
        TH_OK(llmcl_tensor_view(io.base, 4, shape, strides, 0, &io.t));
    } else if (c->pad) {
        const int64_t n = (int64_t)c->B * heads * T * c->D, store = n + c->pad;
        const int64_t shape[4] = {c->B, heads, T, c->D};
        const int64_t strides[4] = {(int64_t)heads * T * c->D, (int64_t)T * c->D, c->D, 1};
        io.base = th_tensor(c->dtype, 1, &store);
        TH_OK(llmcl_tensor_view(io.base, 4, shape, strides, c->pad, &io.t));
    } else {
        const int64_t shape[4] = {c->B, heads, T, c->D};
        io.base = th_tensor(c->dtype, 4, shape);
        io.t = io.base;
    }
    if (values)
        th_upload(io.t, values);
    return io;
}

/* Heads [head0, head0 + heads) of packed [B, T, W / D, D] storage as [B, heads, T, D]; the
   storage is not the io's own. */
static attn_io io_packed(const attn_case *c, llmcl_tensor *store, int head0, int heads,
                         const double *values)
{
    const int64_t w = llmcl_tensor_dim(store, 2) * c->D;
    const int64_t shape[4] = {c->B, heads, c->Tq, c->D};
    const int64_t strides[4] = {(int64_t)c->Tq * w, c->D, w, 1};
    attn_io io = {0};
    TH_OK(llmcl_tensor_view(store, 4, shape, strides, (int64_t)head0 * c->D, &io.t));
    if (values)
        th_upload(io.t, values);
    return io;
}

static void io_free(attn_io io)
{
    if (io.t != io.base)
        llmcl_tensor_destroy(io.t);
    llmcl_tensor_destroy(io.base);
}

static th_tol tol_out(llmcl_dtype dt)
{
    return dt == LLMCL_F32 ? (th_tol){2e-5, 1e-4} : dt == LLMCL_BF16 ? (th_tol){1e-2, 1e-2}
                                                                       : (th_tol){2e-3, 2e-3};
}

static th_tol tol_grad(llmcl_dtype dt)
{
    return dt == LLMCL_F32 ? (th_tol){1e-4, 1e-3} : dt == LLMCL_BF16 ? (th_tol){2e-2, 2e-2}
                                                                       : (th_tol){4e-3, 4e-3};
}

/* The device buffers and host values of one case. */
typedef struct attn_run {
    attn_case c;
    attn_ref_cfg cfg;
    int64_t nq, nk, nl, total_q, total_k;
    double *q, *k, *v, *dout;
    attn_io dq_, dk_, dv_, q_, k_, v_, o_, do_;
    llmcl_tensor *lse, *cu_q, *cu_k;
    llmcl_tensor *qkv, *dqkv; /* a packed case's storage */
} attn_run;

static llmcl_tensor *cu_tensor(const int32_t *cu, int B)
{
    double *x = th_alloc(sizeof(double) * (size_t)(B + 1));
    for (int i = 0; i <= B; ++i)
        x[i] = cu[i];
    const int64_t shape[1] = {B + 1};
    llmcl_tensor *t = th_tensor_from(LLMCL_I32, 1, shape, x);
    free(x);
    return t;
}

static void run_setup(attn_run *r, const attn_case *c, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->cfg = ref_cfg(c);
    r->nq = attn_ref_q_numel(&r->cfg);
    r->nk = attn_ref_k_numel(&r->cfg);
    r->nl = attn_ref_lse_numel(&r->cfg);
    r->total_q = r->nq / ((int64_t)c->Hq * c->D);
    r->total_k = r->nk / ((int64_t)c->Hkv * c->D);
    th_rng rng = th_rng_new(seed);
    r->q = th_alloc(sizeof(double) * (size_t)r->nq);
    r->dout = th_alloc(sizeof(double) * (size_t)r->nq);
    r->k = th_alloc(sizeof(double) * (size_t)r->nk);
    r->v = th_alloc(sizeof(double) * (size_t)r->nk);
    th_fill_normal(&rng, r->q, (size_t)r->nq, 1.0);
    th_fill_normal(&rng, r->k, (size_t)r->nk, 1.0);
    th_fill_normal(&rng, r->v, (size_t)r->nk, 1.0);
    th_fill_normal(&rng, r->dout, (size_t)r->nq, 1.0);
    th_round_all(c->dtype, r->q, (size_t)r->nq);
    th_round_all(c->dtype, r->k, (size_t)r->nk);
    th_round_all(c->dtype, r->v, (size_t)r->nk);
    th_round_all(c->dtype, r->dout, (size_t)r->nq);

    if (c->packed) {
        const int64_t shape[4] = {c->B, c->Tq, c->Hq + 2 * c->Hkv, c->D};
        r->qkv = th_tensor(c->dtype, 4, shape);
        r->dqkv = th_tensor(c->dtype, 4, shape);
        r->q_ = io_packed(c, r->qkv, 0, c->Hq, r->q);
        r->k_ = io_packed(c, r->qkv, c->Hq, c->Hkv, r->k);
        r->v_ = io_packed(c, r->qkv, c->Hq + c->Hkv, c->Hkv, r->v);
        r->dq_ = io_packed(c, r->dqkv, 0, c->Hq, NULL);
        r->dk_ = io_packed(c, r->dqkv, c->Hq, c->Hkv, NULL);
        r->dv_ = io_packed(c, r->dqkv, c->Hq + c->Hkv, c->Hkv, NULL);
    } else {
        r->q_ = io_new(c, c->Hq, c->Tq, r->total_q, r->q);
        r->k_ = io_new(c, c->Hkv, c->Tk, r->total_k, r->k);
        r->v_ = io_new(c, c->Hkv, c->Tk, r->total_k, r->v);
        r->dq_ = io_new(c, c->Hq, c->Tq, r->total_q, NULL);
        r->dk_ = io_new(c, c->Hkv, c->Tk, r->total_k, NULL);
        r->dv_ = io_new(c, c->Hkv, c->Tk, r->total_k, NULL);
    }
    r->do_ = io_new(c, c->Hq, c->Tq, r->total_q, r->dout);
    r->o_ = io_new(c, c->Hq, c->Tq, r->total_q, NULL);
    if (c->cu_q) {
        const int64_t shape[2] = {c->Hq, r->total_q};
        r->lse = th_tensor(LLMCL_F32, 2, shape);
        r->cu_q = cu_tensor(c->cu_q, c->B);
        r->cu_k = cu_tensor(c->cu_k, c->B);
        r->c.opts.cu_seqlens_q = r->cu_q;
        r->c.opts.cu_seqlens_k = r->cu_k;
    } else {
        const int64_t shape[3] = {c->B, c->Hq, c->Tq};
        r->lse = th_tensor(LLMCL_F32, 3, shape);
    }
}

static void run_free(attn_run *r)
{
    attn_io ios[] = {r->q_, r->k_, r->v_, r->do_, r->o_, r->dq_, r->dk_, r->dv_};
    for (size_t i = 0; i < sizeof ios / sizeof *ios; ++i)
        io_free(ios[i]);
    llmcl_tensor_destroy(r->qkv);
    llmcl_tensor_destroy(r->dqkv);
    llmcl_tensor_destroy(r->lse);
    llmcl_tensor_destroy(r->cu_q);
    llmcl_tensor_destroy(r->cu_k);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->dout);
}

static llmcl_status run_forward(attn_run *r)
{
    return llmcl_attention_forward(th_ctx(), r->q_.t, r->k_.t, r->v_.t, &r->c.opts, r->o_.t, r->lse);
}

static llmcl_status run_backward(attn_run *r)
{
    return llmcl_attention_backward(th_ctx(), r->q_.t, r->k_.t, r->v_.t, r->o_.t, r->lse,
                                    r->do_.t, &r->c.opts, r->dq_.t, r->dk_.t, r->dv_.t);
}

static void compare(const char *what, const llmcl_tensor *t, const double *ref, int64_t n, th_tol tol)
{
    double *got = th_alloc(sizeof(double) * (size_t)n);
    th_download(t, got);
    TH_ASSERT_CLOSE(what, ref, got, (size_t)n, tol);
    free(got);
}

/* Downloads a tensor's raw storage. */
static void *raw(const llmcl_tensor *t)
{
    const size_t bytes = (size_t)llmcl_tensor_numel(t) * llmcl_dtype_size(llmcl_tensor_dtype(t));
    void *h = th_alloc(bytes);
    TH_OK(llmcl_tensor_download(t, h, bytes));
    return h;
}

static void assert_same_bits(const llmcl_tensor *t, const void *before, const char *what)
{
    void *now = raw(t);
    const size_t bytes = (size_t)llmcl_tensor_numel(t) * llmcl_dtype_size(llmcl_tensor_dtype(t));
    if (memcmp(now, before, bytes) != 0)
        fail_msg("%s differs between two runs", what);
    free(now);
}

/* The outputs of a case's forward and backward as stored, to compare runs bit for bit. */
typedef struct attn_bits {
    void *t[5]; /* o, lse, dq, dk, dv */
} attn_bits;

/*
 * Forward and backward of one case against the double reference; with `bits`, their outputs as
 * stored are kept there, or compared bit for bit with those already kept there (then freed).
 */
static void check_case_bits(attn_case c, uint64_t seed, attn_bits *bits)
{
    attn_run r;
    run_setup(&r, &c, seed);
    double *o = th_alloc(sizeof(double) * (size_t)r.nq), *lse = th_alloc(sizeof(double) * (size_t)r.nl);
    double *dq = th_alloc(sizeof(double) * (size_t)r.nq);
    double *dk = th_alloc(sizeof(double) * (size_t)r.nk), *dv = th_alloc(sizeof(double) * (size_t)r.nk);
    attn_ref_forward(&r.cfg, r.q, r.k, r.v, o, lse);
    attn_ref_backward(&r.cfg, r.q, r.k, r.v, r.dout, dq, dk, dv);

    TH_OK(run_forward(&r));
    compare("o", r.o_.t, o, r.nq, tol_out(c.dtype));
    compare("lse", r.lse, lse, r.nl, (th_tol){1e-4, 1e-5});
    TH_OK(run_backward(&r));
    compare("dq", r.dq_.t, dq, r.nq, tol_grad(c.dtype));
    compare("dk", r.dk_.t, dk, r.nk, tol_grad(c.dtype));
    compare("dv", r.dv_.t, dv, r.nk, tol_grad(c.dtype));
    const llmcl_tensor *outs[5] = {r.o_.t, r.lse, r.dq_.t, r.dk_.t, r.dv_.t};
    static const char *const names[5] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5 && bits; ++i) {
        if (bits->t[i]) {
            assert_same_bits(outs[i], bits->t[i], names[i]);
            free(bits->t[i]);
            bits->t[i] = NULL;
        } else {
            bits->t[i] = raw(outs[i]);
        }
    }

    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    run_free(&r);
}

static void check_case(attn_case c, uint64_t seed) { check_case_bits(c, seed, NULL); }

/* Whether backwards at head dim d over tk keys store dS here by default (the wgmma kernels with
   TMA at D 128, and at D 64 up to 2048 keys; at D 64 past them where a budget is set). */
static bool stores_ds(int d, int tk)
{
    const llmcl_device_info *in = llmcl_ctx_device_info(th_ctx());
    return in->has_wgmma && in->has_tma && (d == 128 || (d == 64 && tk <= 2048));
}

/* The case as it comes (dS stored where the device does that), then with dQ recomputing S. */
static void check_both(attn_case c, uint64_t seed)
{
    check_case(c, seed);
    if (stores_ds(c.D, c.Tk) && c.opts.ds_bytes == 0) {
        c.opts.ds_bytes = -1;
        check_case(c, seed);
    }
}

/* The forward of one case against the double reference. */
static void check_forward_case(attn_case c, uint64_t seed)
{
    attn_run r;
    run_setup(&r, &c, seed);
    double *o = th_alloc(sizeof(double) * (size_t)r.nq);
    double *lse = th_alloc(sizeof(double) * (size_t)r.nl);
    attn_ref_forward(&r.cfg, r.q, r.k, r.v, o, lse);
    TH_OK(run_forward(&r));
    compare("o", r.o_.t, o, r.nq, tol_out(c.dtype));
    compare("lse", r.lse, lse, r.nl, (th_tol){1e-4, 1e-5});
    free(o);
    free(lse);
    run_free(&r);
}

/* The case's forward runs and its backward fails with status, its message naming `word`. */
static void check_backward_refused(attn_case c, uint64_t seed, llmcl_status status,
                                   const char *word)
{
    attn_run r;
    run_setup(&r, &c, seed);
    TH_OK(run_forward(&r));
    TH_FAILS(run_backward(&r), status);
    assert_non_null(strstr(llmcl_last_error(th_ctx()), word));
    run_free(&r);
}

static attn_case dense(llmcl_dtype dt, int B, int Hq, int Hkv, int D, int Tq, int Tk)
{
    return (attn_case){.dtype = dt, .B = B, .Hq = Hq, .Hkv = Hkv, .D = D, .Tq = Tq, .Tk = Tk};
}

static attn_case windowed(attn_case c, int left, int right)
{
    c.opts.use_window = 1;
    c.opts.window_left = left;
    c.opts.window_right = right;
    return c;
}

static attn_case causal(attn_case c)
{
    c.opts.causal = 1;
    return c;
}

static attn_case scaled(attn_case c, float scale)
{
    c.opts.scale = scale;
    return c;
}

static void test_full(void **state)
{
    (void)state;
    check_case(dense(LLMCL_F32, 2, 2, 2, 64, 137, 137), 1);
    check_case(dense(LLMCL_F32, 1, 2, 2, 64, 61, 150), 2);
}

static void test_causal(void **state)
{
    (void)state;
    const attn_case cases[] = {
        causal(dense(LLMCL_F32, 2, 2, 2, 64, 133, 133)),
        causal(dense(LLMCL_F32, 1, 2, 2, 64, 47, 141)), /* Tq < Tk: bottom-right diagonal */
        causal(dense(LLMCL_F32, 1, 2, 2, 64, 141, 47)), /* Tq > Tk: the first rows see nothing */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
        check_case(cases[i], 10 + i);
}

static void test_window(void **state)
{
    (void)state;
    const attn_case base = dense(LLMCL_F32, 1, 2, 2, 64, 150, 150);
    const attn_case cases[] = {
        windowed(base, 20, 7),
        windowed(base, 9, -1),
        windowed(base, -1, 0),
        windowed(base, 500, 500),                     /* wider than T: full attention */
        causal(windowed(base, 33, -1)),               /* sliding-window causal */
        causal(windowed(dense(LLMCL_F32, 1, 2, 2, 64, 70, 150), 5, 3)), /* Tq < Tk */
        windowed(dense(LLMCL_F32, 1, 2, 2, 64, 150, 40), 3, 2), /* rows that see no key */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
        check_case(cases[i], 20 + i);
}

/*
 * The last key a tile of queries sees starting a key tile of its own: the key range's end (and the
 * query range's, for dK and dV) one past it. Causal with Tk = Tq + 1 and a window of one each side
 * put that key at a multiple of any tile size, for the first query tiles' last rows.
 */
static void test_tile_edge_ranges(void **state)
{
    (void)state;
    const attn_case cases[] = {
        causal(dense(LLMCL_F32, 1, 2, 2, 64, 100, 101)),
        windowed(dense(LLMCL_F32, 1, 2, 2, 64, 130, 130), 1, 1),
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
        check_case(cases[i], 30 + i);
}

static void test_softcap_scale(void **state)
{
    (void)state;
    attn_case c = causal(dense(LLMCL_F32, 1, 2, 2, 64, 129, 129));
    c.opts.softcap = 1.5f;
    c.opts.scale = 0.4f; /* large enough that the cap bends the logits */
    check_case(c, 30);
    c.opts.softcap = 0;
    c.opts.scale = 0.05f;
    check_case(c, 31);
    c = windowed(dense(LLMCL_F32, 1, 2, 1, 64, 90, 100), 12, 12);
    c.opts.softcap = 30;
    check_case(c, 32);
}

/*
 * How many of attention_fwd, attention_bwd_dq and attention_bwd_dkdv (suffix "") or of their
 * tensor-core versions (suffix "_mma" or "_wgmma") ran in dt at head dim d's shape class.
 */
static int attn_kernels_ran(const char *suffix, llmcl_dtype dt, int d)
{
    static const char *const keys[3] = {"attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"};
    char key[64], cls[16];
    snprintf(cls, sizeof cls, "%d", d);
    int ran = 0;
    for (int i = 0; i < 3; ++i) {
        snprintf(key, sizeof key, "%s%s", keys[i], suffix);
        ran += th_launched(key, dt, cls);
    }
    return ran;
}

/*
 * The head dims the tiles were measured at and the ones models use beside them (Phi-2's 80,
 * DeepSeek's 192), several of whose quarters the launcher's power-of-two column counts do not
 * divide: causal with GQA and an odd T, not causal with Tq < Tk, and a varlen batch at D = 112.
 * Then the head dims of tiny models, 8, 16 and 24, whose quarters (2, 4, 6) cap the work-item
 * columns and with them the tiles' keys: the same two cases in the dtype test_every_head_dim
 * builds them in, and a varlen f16 batch at D = 16. Below 32, the tensor cores' floor, 16-bit
 * calls run the portable kernels on every device (classes p3 and p4 hold D 8 and 16 alone).
 */
static void test_head_dims(void **state)
{
    (void)state;
    const int dims[] = {32, 40, 64, 80, 96, 112, 128, 160, 192, 256};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; ++i) {
        check_case(causal(dense(LLMCL_F32, 1, 2, 1, dims[i], 75, 75)), 140 + i);
        check_case(dense(LLMCL_BF16, 1, 2, 2, dims[i], 33, 70), 160 + i);
    }
    static const int32_t cu[] = {0, 1, 37, 70};
    attn_case c = causal(dense(LLMCL_F16, 3, 4, 2, 112, 0, 0));
    c.cu_q = c.cu_k = cu;
    check_case(c, 180);

    for (int d = 8; d <= 24; d += 8) {
        const llmcl_dtype dt = d % 16 ? LLMCL_BF16 : LLMCL_F32;
        check_case(causal(dense(dt, 1, 2, 1, d, 75, 75)), 180 + d);
        check_case(dense(dt, 1, 2, 2, d, 33, 70), 181 + d);
    }
    c.D = 16;
    check_case(c, 182);
    const llmcl_dtype small_dt[2] = {LLMCL_BF16, LLMCL_F16};
    const int small_d[2] = {8, 16};
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(attn_kernels_ran("", small_dt[i], small_d[i]), 3);
        assert_int_equal(attn_kernels_ran("_mma", small_dt[i], small_d[i]), 0);
        assert_int_equal(attn_kernels_ran("_wgmma", small_dt[i], small_d[i]), 0);
    }
}

/*
 * Every head dim the API takes, with the launcher's own tiles, at a size where the builds are the
 * cost: each builds and matches the reference forward and backward. f32 and bf16 alternate (they
 * leave the tiles different local memory), so that test_head_dims's dims reuse its programs.
 */
static void test_every_head_dim(void **state)
{
    (void)state;
    for (int d = 8; d <= 256; d += 8)
        check_case(causal(dense(d % 16 ? LLMCL_BF16 : LLMCL_F32, 1, 2, 1, d, 7, 7)), 200 + d);
}

/* Whether calls of dt at D = 64 take the tensor-core kernels on this device. */
static bool on_tensor_cores(llmcl_dtype dt)
{
    return llmcl_ctx_device_info(th_ctx())->has_mma && dt != LLMCL_F32;
}

/* Whether the tensor-core kernels at head dim d are wgmma's on this device (D 64, 128 and 256,
   sm_90). */
static bool on_wgmma(int d)
{
    return llmcl_ctx_device_info(th_ctx())->has_wgmma && (d == 64 || d == 128 || d == 256);
}

/* Teardown of the tests that force tiles: no override outlives them, even when they fail. */
static int clear_overrides(void **state)
{
    (void)state;
    return llmcl_tune_override(th_ctx(), NULL, LLMCL_F32, NULL, NULL) != LLMCL_OK;
}

/*
 * Non-default tiles as the tuner forces them, each against the double reference: f32 Q-side tiles
 * with K and V as stored (LF32 2) and 8 x 4 register tiles, all operands f32 with separate K and V
 * buffers (LF32 1, KV_SEP 1), and unrolled loops; the first and last sets stage the next tiles
 * through registers (PIPE) and hold dQ's K tile in f32 (KF32); the fourth stages with 12
 * work-items, which do not span whole rows and leave the last piece partly past the tile. The
 * first, third and fourth order the grid in runs of 3, 2 and 100 tiles of a head (TILE_RUN: runs
 * that leave a shorter last run, and one longer than any head's tile count). The cases span
 * several key and query tiles, GQA and a varlen batch (the pipelined loops cross sequence and
 * head boundaries). Every set fits 32 KiB of local memory at D 64 with f32 storage. Last, a
 * TILE_RUN of 0 is refused, and one whose runs over every head overflow the kernels' 32-bit
 * work-group counts.
 */
static void test_tunables(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    static const char *const sets[][3] = {
        {"BLOCK_M=32 BLOCK_N=32 TM=8 TN=4 LF32=2 UNROLL=2 PIPE=1 TILE_RUN=3",
         "BLOCK_M=16 BLOCK_N=32 TM=4 TN=4 LF32=2 KF32=1 PIPE=1 TILE_RUN=3",
         "BLOCK_M=16 BLOCK_N=16 TM=4 TN=4 LF32=2 PIPE=1 TILE_RUN=3"},
        {"BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 LF32=1 KV_SEP=1", "BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 LF32=1",
         "BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 LF32=1 UNROLL=2"},
        {"BLOCK_M=32 BLOCK_N=32 TM=8 TN=2 UNROLL=4 PIPE=1 TILE_RUN=2",
         "BLOCK_M=16 BLOCK_N=32 TM=2 TN=4 KF32=1 PIPE=1 TILE_RUN=2",
         "BLOCK_M=16 BLOCK_N=32 TM=4 TN=4 UNROLL=2 PIPE=1 TILE_RUN=2"},
        {"BLOCK_M=12 BLOCK_N=16 TM=4 TN=4 PIPE=1 TILE_RUN=100",
         "BLOCK_M=12 BLOCK_N=16 TM=4 TN=4 PIPE=1 TILE_RUN=100",
         "BLOCK_M=16 BLOCK_N=12 TM=4 TN=4 PIPE=1 TILE_RUN=100"}};
    static const char *const keys[3] = {"attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"};
    static const int32_t cu[] = {0, 1, 40, 45, 110};
    const llmcl_dtype dts[2] = {LLMCL_BF16, LLMCL_F32};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; ++i)
        for (int d = 0; d < 2; ++d) {
            for (int k = 0; k < 3; ++k)
                TH_OK(llmcl_tune_override(ctx, keys[k], dts[d], "*", sets[i][k]));
            check_case(causal(dense(dts[d], 1, 4, 2, 64, 77, 77)), 70 + i);
            check_case(dense(dts[d], 2, 2, 1, 64, 33, 50), 80 + i);
            attn_case c = causal(dense(dts[d], 4, 4, 2, 64, 0, 0));
            c.cu_q = c.cu_k = cu;
            check_case(c, 85 + i);
            /* the launches used the set (16-bit calls run on tensor cores where there are) */
            for (int k = 0; k < 3 && !on_tensor_cores(dts[d]); ++k)
                th_assert_launched_with(keys[k], dts[d], "p6", sets[i][k]);
            TH_OK(llmcl_tune_override(ctx, NULL, dts[d], NULL, NULL));
        }

    /* PIPE stages K and V through one buffer: with KV_SEP the forward launches without it. */
    TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*",
                              "BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 KV_SEP=1 PIPE=1"));
    check_case(dense(LLMCL_F32, 1, 2, 1, 64, 40, 40), 89);
    th_assert_launched_with("attention_fwd", LLMCL_F32, "p6", "KV_SEP=1 PIPE=0");

    TH_OK(llmcl_tune_override(ctx, "attention_bwd_dkdv", LLMCL_F32, "*",
                              "BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 TILE_RUN=0"));
    check_backward_refused(dense(LLMCL_F32, 1, 2, 1, 64, 40, 40), 90, LLMCL_ERROR_UNSUPPORTED,
                           "TILE_RUN");
    TH_OK(llmcl_tune_override(ctx, "attention_bwd_dkdv", LLMCL_F32, "*",
                              "BLOCK_M=16 BLOCK_N=16 TM=2 TN=2 TILE_RUN=2147483647"));
    /* 3 KV heads in all */
    check_backward_refused(dense(LLMCL_F32, 3, 2, 1, 64, 40, 40), 91, LLMCL_ERROR_OVERFLOW,
                           "TILE_RUN");
}

/*
 * Overrides at D = 80, whose quarter, 20, takes work-item columns that are no power of two: 10, 5
 * and 10 columns, staged (PIPE; dK/dV's 50 work-items do not span whole rows of Q and dO), with
 * f32 Q-side tiles and dQ's K tile in f32, against the double reference with GQA over several
 * tiles.
 */
static void test_tunables_other_head_dim(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    static const char *const set[3] = {"BLOCK_M=16 BLOCK_N=20 TM=4 TN=2 LF32=2 PIPE=1",
                                       "BLOCK_M=16 BLOCK_N=20 TM=2 TN=4 KF32=1 PIPE=1",
                                       "BLOCK_M=20 BLOCK_N=10 TM=2 TN=2 PIPE=1 TILE_RUN=2"};
    static const char *const keys[3] = {"attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"};
    for (int k = 0; k < 3; ++k)
        TH_OK(llmcl_tune_override(ctx, keys[k], LLMCL_F32, "p7", set[k]));
    check_case(causal(dense(LLMCL_F32, 1, 4, 2, 80, 77, 77)), 75);
    for (int k = 0; k < 3; ++k)
        th_assert_launched_with(keys[k], LLMCL_F32, "p7", set[k]);
}

/*
 * A tuning file's tiles for D = 128 (class p7) reach D = 32 as the nearest tuned class, D = 80 in
 * the same class and D = 160 as the nearest, but their 16 work-item columns divide none of their
 * quarters: the launcher keeps its defaults, the tiles it launches with no file, and an override
 * of another tunable keeps its value beside them, as with no file (the H100's shipped D 128 entry
 * once made test_persistent_forward's PERSIST override at D 256 fail). The same tiles as an
 * explicit override are refused, so that the tuner never times a substitute.
 */
static void test_tuned_tiles_for_other_head_dim(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    const int dims[] = {80, 160};
    const char *const cls[] = {"p7", "p8"};
    static const char *const partial = "UNROLL=2"; /* an override that leaves the tiles */
    char defaults[2][256], with_partial[2][256];
    for (int i = 0; i < 2; ++i) {
        check_case(dense(LLMCL_F32, 1, 2, 1, dims[i], 40, 40), 62 + i);
        th_params_used("attention_fwd", LLMCL_F32, cls[i], defaults[i], sizeof defaults[i]);
        TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*", partial));
        check_case(dense(LLMCL_F32, 1, 2, 1, dims[i], 40, 40), 62 + i);
        th_params_used("attention_fwd", LLMCL_F32, cls[i], with_partial[i],
                       sizeof with_partial[i]);
        assert_non_null(strstr(with_partial[i], partial));
        TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*", NULL));
    }
    th_tune_db_load_text("{\"format\": \"llmcl-tuning\", \"version\": 1, "
                         "\"device\": {\"name\": \"*\"}, "
                         "\"entries\": [{\"kernel\": \"attention_fwd\", \"dtype\": \"f32\", "
                         "\"shape_class\": \"p7\", \"params\": {\"BLOCK_M\": 16, "
                         "\"BLOCK_N\": 16, \"TM\": 4, \"TN\": 1}}]}");
    check_case(dense(LLMCL_F32, 1, 2, 1, 32, 40, 40), 60);
    for (int i = 0; i < 2; ++i) {
        check_case(dense(LLMCL_F32, 1, 2, 1, dims[i], 40, 40), 62 + i);
        char used[256];
        th_params_used("attention_fwd", LLMCL_F32, cls[i], used, sizeof used);
        assert_string_equal(used, defaults[i]);
        /* a partial override keeps its values; the misfit file's tiles give way to the defaults */
        TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*", partial));
        check_case(dense(LLMCL_F32, 1, 2, 1, dims[i], 40, 40), 62 + i);
        th_params_used("attention_fwd", LLMCL_F32, cls[i], used, sizeof used);
        assert_string_equal(used, with_partial[i]);
        TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*", NULL));
    }

    TH_OK(llmcl_tune_override(ctx, "attention_fwd", LLMCL_F32, "*",
                              "BLOCK_M=16 BLOCK_N=16 TM=4 TN=1"));
    const int refused[] = {32, 80};
    for (int i = 0; i < 2; ++i) {
        const attn_case c = dense(LLMCL_F32, 1, 2, 1, refused[i], 40, 40);
        attn_run r;
        run_setup(&r, &c, 61);
        TH_FAILS(run_forward(&r), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(ctx), "columns"));
        run_free(&r);
    }
    TH_OK(llmcl_tune_db_clear(ctx));
}

/*
 * attn_bwd_pre's rows split over PRE_LANES work-items: more lanes than a row has chunks (D 8),
 * chunks that do not divide evenly among them (D 72) and whole warps of lanes (D 128), in
 * work-groups that are no power of two, several rows a work-item (PRE_ROWS) that the sequences'
 * ends cut short, over varlen rows, in 8-wide chunks and, off 16-byte alignment, 4-wide ones;
 * every delta reaches dQ and dK. Lanes that are no power of two or do not divide the group, and
 * rows outside [1, 16], are refused.
 */
static void test_delta_lanes(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    static const char *const sets[] = {"PRE_LANES=1 PRE_WG=32", "PRE_LANES=4 PRE_WG=96",
                                       "PRE_LANES=8 PRE_WG=64 PRE_ROWS=3",
                                       "PRE_LANES=32 PRE_WG=256 PRE_ROWS=4"};
    static const int dims[] = {8, 72, 128};
    static const char *const cls[] = {"p3", "p7", "p7"};
    static const int32_t cu[] = {0, 1, 40, 45, 110};
    const llmcl_dtype dts[2] = {LLMCL_BF16, LLMCL_F32};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; ++i)
        for (int d = 0; d < 2; ++d) {
            TH_OK(llmcl_tune_override(ctx, "attention_bwd_pre", dts[d], "*", sets[i]));
            for (int j = 0; j < 3; ++j) {
                attn_case c = causal(dense(dts[d], 4, 4, 2, dims[j], 0, 0));
                c.cu_q = c.cu_k = cu;
                check_case(c, 100 + (int)i * 3 + j);
                th_assert_launched_with("attention_bwd_pre", dts[d], cls[j], sets[i]);
                th_assert_launched_with("attention_bwd_pre", dts[d], cls[j], "PRE_VEC=8");
            }
            attn_case c = causal(dense(dts[d], 2, 4, 2, 72, 45, 45));
            c.pad = 4; /* rows 8 bytes (f32: 16) off 16-byte alignment: 4-wide chunks */
            check_case(c, 120 + (int)i);
            th_assert_launched_with("attention_bwd_pre", dts[d], "p7", "PRE_VEC=4");
        }
    static const char *const refused[] = {"PRE_LANES=3 PRE_WG=48", "PRE_LANES=64 PRE_WG=32",
                                          "PRE_ROWS=0", "PRE_ROWS=17"};
    for (int i = 0; i < 4; ++i) {
        TH_OK(llmcl_tune_override(ctx, "attention_bwd_pre", LLMCL_F32, "*", refused[i]));
        check_backward_refused(dense(LLMCL_F32, 1, 2, 1, 64, 40, 40), 99,
                               LLMCL_ERROR_UNSUPPORTED, i < 2 ? "PRE_LANES" : "PRE_ROWS");
    }
    /* rows' partial sums past the local memory, where the device's work-groups are that large */
    const llmcl_device_info *in = llmcl_ctx_device_info(ctx);
    const size_t wg = in->max_work_group_size;
    if (16u * 4u * wg > in->local_mem_static_bytes) {
        char set[64];
        snprintf(set, sizeof set, "PRE_ROWS=16 PRE_WG=%zu PRE_LANES=1", wg);
        TH_OK(llmcl_tune_override(ctx, "attention_bwd_pre", LLMCL_F32, "*", set));
        check_backward_refused(dense(LLMCL_F32, 1, 2, 1, 64, 40, 40), 99,
                               LLMCL_ERROR_UNSUPPORTED, "local memory");
    }
}

static void test_gqa_mqa(void **state)
{
    (void)state;
    check_case(causal(dense(LLMCL_F32, 2, 6, 2, 64, 77, 77)), 50);
    check_case(dense(LLMCL_F32, 1, 4, 1, 64, 70, 97), 51);
}

static void test_layout_bthd(void **state)
{
    (void)state;
    attn_case c = causal(dense(LLMCL_F32, 2, 4, 2, 64, 99, 99));
    c.bthd = true;
    check_case(c, 60);
    c = windowed(dense(LLMCL_BF16, 1, 3, 1, 128, 40, 81), 10, 4);
    c.bthd = true;
    check_case(c, 61);
}

/*
 * q, k and v heads side by side in the rows of one buffer, and the gradients likewise in another:
 * outputs interleaved with each other but disjoint. dK and dV views that share half a head's
 * columns are refused, the buffer intact.
 */
static void test_packed_heads(void **state)
{
    (void)state;
    attn_case c = causal(dense(LLMCL_BF16, 2, 4, 2, 64, 77, 77));
    c.packed = true;
    check_case(c, 64);
    c = causal(dense(LLMCL_F32, 1, 6, 2, 40, 33, 33));
    c.packed = true;
    check_case(c, 65);
    c = causal(dense(LLMCL_BF16, 1, 4, 1, 128, 130, 130));
    c.packed = true;
    check_case(c, 66);

    c = causal(dense(LLMCL_F32, 1, 2, 1, 64, 20, 20));
    c.packed = true;
    attn_run r;
    run_setup(&r, &c, 67);
    TH_OK(run_forward(&r));
    const int64_t w = 4 * 64, shape[4] = {1, 1, 20, 64}, strides[4] = {20 * w, 64, w, 1};
    llmcl_tensor *dv_half = NULL;
    TH_OK(llmcl_tensor_view(r.dqkv, 4, shape, strides, 2 * 64 + 32, &dv_half));
    void *before = raw(r.dqkv);
    TH_FAILS(llmcl_attention_backward(th_ctx(), r.q_.t, r.k_.t, r.v_.t, r.o_.t, r.lse, r.do_.t,
                                      &r.c.opts, r.dq_.t, r.dk_.t, dv_half),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(th_ctx()), "overlap"));
    assert_same_bits(r.dqkv, before, "dqkv");
    free(before);
    llmcl_tensor_destroy(dv_half);
    run_free(&r);
}

/* Views that start 1 or 2 elements into their storage: tiles load element by element. */
static void test_unaligned_views(void **state)
{
    (void)state;
    for (int pad = 1; pad <= 2; ++pad) {
        attn_case c = causal(dense(LLMCL_BF16, 2, 4, 2, 64, 45, 45));
        c.pad = pad;
        check_case(c, 90 + pad);
        c = dense(LLMCL_F32, 1, 2, 1, 32, 20, 37);
        c.pad = pad;
        check_case(c, 95 + pad);
    }
}

static void test_t1(void **state)
{
    (void)state;
    check_case(dense(LLMCL_F32, 2, 2, 2, 64, 1, 1), 70);
    check_case(causal(dense(LLMCL_F32, 2, 4, 2, 64, 1, 1)), 71);
    check_case(causal(dense(LLMCL_F32, 1, 2, 2, 64, 1, 90)), 72); /* decode */
    check_case(causal(dense(LLMCL_F32, 1, 2, 2, 64, 90, 1)), 73);
}

/*
 * The cases the tensor-core kernels make risky, in bf16 and f16 at head dims 32, 64, 96, 128 and
 * 256 (and 48, 80, 112 and 192 once each): lengths that are no multiple of a tile (1, 17, 333,
 * and 4095 once),
 * Tq != Tk under the causal mask, a window narrower than a tile (and one that leaves most keys
 * unseen: key tiles with no query tile to visit), GQA, [B, T, H, D] storage, varlen
 * with sequences of length 0 and 1, forced smaller tiles (GQA across several key and query tiles;
 * the wgmma kernels' copies both by TMA, with a producer warpgroup or warp, and by cp.async),
 * a softcap at D 256 and a view that is not 8-element aligned (the portable kernels then run). On a
 * device with tensor cores the tuning report says which kernels ran (wgmma's at D 64, 128 and
 * 256 where the device has it, at D 256 on the one tile that fits, 64 x 64: with forced tiles,
 * 333 keys run the forward's pipeline past its stages); elsewhere the portable ones run the bf16
 * cases at D 64.
 */
static const char *const mma_keys[3] = {"attention_fwd_mma", "attention_bwd_dq_mma",
                                        "attention_bwd_dkdv_mma"};
static const char *const wgmma_keys[3] = {"attention_fwd_wgmma", "attention_bwd_dq_wgmma",
                                          "attention_bwd_dkdv_wgmma"};

/* The three kernels' tuning keys at head dim d, and d as a shape class. */
static const char *const *fast_keys(int d, char cls[16])
{
    snprintf(cls, 16, "%d", d);
    return on_wgmma(d) ? wgmma_keys : mma_keys;
}

/* The shapes that reach every edge of the tiles, on the kernels the defaults pick. */
static void fast_path_cases(llmcl_dtype dt, int d, int di)
{
    static const int32_t cu[] = {0, 0, 1, 71, 72, 140};
    char cls[16];
    const char *const *keys = fast_keys(d, cls);
    attn_case cases[] = {
        causal(dense(dt, 1, 2, 1, d, 1, 1)),
        causal(dense(dt, 2, 4, 2, d, 17, 17)),
        causal(dense(dt, 1, 4, 1, d, 333, 333)),
        causal(dense(dt, 1, 2, 2, d, 17, 100)),
        causal(dense(dt, 1, 2, 2, d, 100, 17)),
        windowed(dense(dt, 1, 2, 1, d, 150, 150), 5, 0),
        /* keys 0-77 seen by no query: key tiles with no query tile, dK = dV = 0 */
        windowed(dense(dt, 1, 2, 1, d, 17, 100), 5, 0),
        dense(dt, 2, 2, 2, d, 70, 70),
        causal(dense(dt, 5, 4, 2, d, 0, 0)),
    };
    cases[7].bthd = true;
    cases[8].cu_q = cases[8].cu_k = cu;
    /* Logits of standard deviation sqrt(D): rows' maxima move past the softmax's slack on later
       key tiles, so O is rescaled in the middle of the walk. The forward only: the backward's
       bf16 O would take delta past the tolerance at such logits. */
    check_forward_case(scaled(causal(dense(dt, 1, 2, 1, d, 200, 200)), 1.0f), 380 + di);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        check_both(cases[i], 300 + 10 * di + i);
        for (int kk = 0; kk < 3; ++kk)
            assert_int_equal(th_launched(keys[kk], dt, cls), on_tensor_cores(dt));
        if (stores_ds(d, cases[i].Tk))
            assert_int_equal(th_launched("attention_bwd_dq_ds_wgmma", dt, cls), 1);
    }
}

/* Each kernel forced to other tiles than its default, which the kernels then launch with. */
static void fast_path_forced_tiles(llmcl_ctx *ctx, llmcl_dtype dt, int d, int di)
{
    static const char *const mma_sets[3] = {"BLOCK_M=32 BLOCK_N=16 WM=1 QREG=1 STAGES=2",
                                            "BLOCK_M=16 BLOCK_N=32", "BLOCK_M=16 BLOCK_N=32"};
    static const char *const wgmma_sets[3] = {"BLOCK_M=128 BLOCK_N=64 STAGES=4",
                                              "BLOCK_M=128 BLOCK_N=128", "BLOCK_M=64 BLOCK_N=64"};
    static const char *const wgmma_wide_sets[3] = {
        "BLOCK_M=64 BLOCK_N=64 STAGES=3", "BLOCK_M=64 BLOCK_N=64", "BLOCK_M=64 BLOCK_N=64"};
    /* past D = 128 the backward's 16 x 16 tiles, the ones that fit 48 KiB (the defaults are
       larger where a kernel's local arrays may take more, as on sm_90) */
    static const char *const wide_sets[3] = {"BLOCK_M=32 BLOCK_N=16 WM=1 QREG=0 STAGES=2",
                                             "BLOCK_M=16 BLOCK_N=16", "BLOCK_M=16 BLOCK_N=16"};
    char cls[16];
    const char *const *keys = fast_keys(d, cls);
    const bool wgmma = on_wgmma(d);
    const char *const *sets = wgmma ? (d > 128 ? wgmma_wide_sets : wgmma_sets)
                              : d > 128 ? wide_sets
                                        : mma_sets;
    for (int kk = 0; kk < 3; ++kk)
        TH_OK(llmcl_tune_override(ctx, keys[kk], dt, "*", sets[kk]));
    check_both(causal(dense(dt, 1, 2, 1, d, 77, 77)), 350 + di);
    check_both(dense(dt, 1, 4, 2, d, 45, 90), 360 + di);
    if (wgmma)
        check_both(causal(dense(dt, 1, 2, 1, d, 333, 333)), 365 + di);
    for (int kk = 0; kk < 3 && on_tensor_cores(dt); ++kk)
        th_assert_launched_with(keys[kk], dt, cls, sets[kk]);
}

/* dK/dV's three buffers of Q and dO (wgmma with TMA, D <= 128): the walk wraps them. */
static void fast_path_three_buffers(llmcl_ctx *ctx, llmcl_dtype dt, int d, int di)
{
    char cls[16];
    const char *const *keys = fast_keys(d, cls);
    const char *three =
        d > 64 ? "BLOCK_M=64 BLOCK_N=128 STAGES=3" : "BLOCK_M=128 BLOCK_N=128 STAGES=3";
    TH_OK(llmcl_tune_override(ctx, NULL, dt, NULL, NULL));
    TH_OK(llmcl_tune_override(ctx, keys[2], dt, "*", three));
    check_both(causal(dense(dt, 1, 8, 2, d, 333, 333)), 390 + di);
    check_both(dense(dt, 2, 4, 1, d, 300, 140), 395 + di);
    th_assert_launched_with(keys[2], dt, cls, three);
}

/* The wgmma kernels' other copies: cp.async where TMA is the default. */
static void fast_path_other_copies(llmcl_ctx *ctx, llmcl_dtype dt, int d, int di, bool tma)
{
    char cls[16];
    const char *const *keys = fast_keys(d, cls);
    const char *other[3] = {tma ? "BLOCK_M=64 BLOCK_N=128 STAGES=3 TMA=0"
                                : "BLOCK_M=64 BLOCK_N=128 STAGES=3",
                            tma ? "BLOCK_M=64 BLOCK_N=64 TMA=0" : "BLOCK_M=64",
                            tma ? "BLOCK_M=128 BLOCK_N=128 TMA=0" : "BLOCK_M=128"};
    if (d > 128) /* the one tile that fits */
        for (int kk = 0; kk < 3; ++kk)
            other[kk] = tma ? "BLOCK_M=64 BLOCK_N=64 TMA=0" : "BLOCK_M=64 BLOCK_N=64";
    for (int kk = 0; kk < 3; ++kk)
        TH_OK(llmcl_tune_override(ctx, keys[kk], dt, "*", other[kk]));
    check_both(causal(dense(dt, 1, 2, 1, d, 333, 333)), 375 + di);
    check_both(dense(dt, 1, 4, 2, d, 45, 90), 380 + di);
    for (int kk = 0; kk < 3; ++kk)
        th_assert_launched_with(keys[kk], dt, cls, other[kk]);
}

/* A tuned set that kernel cannot run: the forward (or the backward, for kernel kk > 0) is
   refused with a message that names why. */
static void expect_refused(llmcl_ctx *ctx, llmcl_dtype dt, int d, int kk, const char *set,
                           uint64_t seed, const char *why)
{
    char cls[16];
    const char *const *keys = fast_keys(d, cls);
    attn_case bad = causal(dense(dt, 1, 2, 1, d, 17, 17));
    bad.opts.ds_bytes = -1; /* dQ's own kernel runs where dS is not stored */
    TH_OK(llmcl_tune_override(ctx, NULL, dt, NULL, NULL));
    TH_OK(llmcl_tune_override(ctx, keys[kk], dt, "*", set));
    attn_run r;
    run_setup(&r, &bad, seed);
    if (kk > 0)
        TH_OK(run_forward(&r));
    TH_FAILS(kk == 0 ? run_forward(&r) : run_backward(&r), LLMCL_ERROR_UNSUPPORTED);
    assert_non_null(strstr(llmcl_last_error(ctx), why));
    run_free(&r);
}

/* The wgmma kernels' sets refused: TMA other than 0 and 1 or without the device's TMA, dK/dV's
   STAGES other than 2 (or 3 with TMA), and past D 128 dK/dV's BLOCK_N other than 64. */
static void fast_path_refusals(llmcl_ctx *ctx, llmcl_dtype dt, int d, int di, bool tma)
{
    for (int kk = 0; kk < 3; ++kk)
        expect_refused(ctx, dt, d, kk, tma ? "TMA=2" : "TMA=1", 385 + di, "TMA");
    expect_refused(ctx, dt, d, 2, tma ? "STAGES=4" : "STAGES=3", 398 + di,
                   "STAGES 2, or 3 with TMA");
    if (d > 128) /* past D 128 dK/dV's pair of warpgroups takes 64 keys */
        expect_refused(ctx, dt, d, 2, "BLOCK_M=64 BLOCK_N=128", 403 + di,
                       "BLOCK_N 64 past D = 128");
}

/* The head dims that only the mma kernels run, D 256 with a softcap, a long sequence one short
   of a tile multiple and rows that are not 16-byte aligned. */
static void fast_path_other_shapes(bool mma)
{
    /* the other multiples of 16: local rows padded to a power of two of 16-byte chunks */
    for (int d = 48; d <= 112 && mma; d += 32) {
        char cls[16];
        snprintf(cls, sizeof cls, "%d", d);
        check_both(causal(dense(LLMCL_BF16, 1, 4, 2, d, 70, 70)), 370 + d);
        for (int kk = 0; kk < 3; ++kk)
            th_assert_launched_with(mma_keys[kk], LLMCL_BF16, cls, "BLOCK_M=");
    }
    /* D = 192 (local rows padded to 256, the backward's operands in local memory), and D = 256
       with a softcap, as Gemma 2 runs it */
    if (mma) {
        check_both(causal(dense(LLMCL_BF16, 1, 4, 2, 192, 70, 70)), 572);
        attn_case c = causal(dense(LLMCL_BF16, 1, 4, 2, 256, 90, 90));
        c.opts.softcap = 5;
        check_both(c, 573);
        for (int kk = 0; kk < 3; ++kk)
            th_assert_launched_with(mma_keys[kk], LLMCL_BF16, "192", "BLOCK_M=");
    }
    /* a long sequence one short of a tile multiple: 64 key tiles through the pipelines */
    check_both(causal(dense(LLMCL_BF16, 1, 1, 1, 64, 4095, 4095)), 574);
    attn_case c = causal(dense(LLMCL_BF16, 1, 2, 1, 64, 40, 40));
    c.pad = 4; /* 4 elements into the storage: not 16-byte rows */
    check_both(c, 369);
}

static void test_fast_path(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    /* Without tensor cores the portable kernels run these cases: one head dim and dtype covers
       them there (the other dims and f16 have their own tests) and keeps CI's cold builds few. */
    const bool mma = llmcl_ctx_device_info(ctx)->has_mma;
    const bool tma = llmcl_ctx_device_info(ctx)->has_tma;
    const int dims[] = {64, 32, 96, 128, 256};
    for (int di = 0; di < (mma ? 5 : 1); ++di)
        for (int f16 = 0; f16 < (mma ? 2 : 1); ++f16) {
            const llmcl_dtype dt = f16 ? LLMCL_F16 : LLMCL_BF16;
            const int d = dims[di];
            fast_path_cases(dt, d, di);
            fast_path_forced_tiles(ctx, dt, d, di);
            if (on_wgmma(d) && tma && d <= 128)
                fast_path_three_buffers(ctx, dt, d, di);
            if (on_wgmma(d)) {
                fast_path_other_copies(ctx, dt, d, di, tma);
                fast_path_refusals(ctx, dt, d, di, tma);
            }
            TH_OK(llmcl_tune_override(ctx, NULL, dt, NULL, NULL));
        }
    fast_path_other_shapes(mma);
}

static void test_16bit(void **state)
{
    (void)state;
    attn_case c = causal(dense(LLMCL_BF16, 2, 4, 2, 128, 111, 111));
    check_case(c, 80);
    c = windowed(dense(LLMCL_BF16, 1, 2, 2, 64, 90, 120), 30, -1);
    c.opts.softcap = 5;
    check_case(c, 81);
    c = causal(dense(LLMCL_F16, 1, 4, 2, 64, 100, 100));
    check_case(c, 82);
}

static void test_varlen(void **state)
{
    (void)state;
    static const int32_t cu_a[] = {0, 1, 18, 23, 24, 154};
    static const int32_t cu_q[] = {0, 3, 4, 24, 24, 100}, cu_k[] = {0, 10, 11, 18, 19, 150};
    static const int32_t cu_k0[] = {0, 10, 10, 18, 19, 150}; /* sequence 1: a query, no key */
    attn_case c = dense(LLMCL_F32, 5, 2, 2, 64, 0, 0);
    c.cu_q = c.cu_k = cu_a;
    check_case(c, 90);
    c = causal(c);
    check_case(c, 91);
    c.cu_q = cu_q;
    c.cu_k = cu_k;
    check_case(c, 92); /* Tq != Tk per sequence, an empty query sequence */
    c.cu_k = cu_k0;
    check_case(c, 95); /* and an empty key sequence under a query */
    c.cu_k = cu_k;
    c = windowed(c, 4, 6);
    c.opts.causal = 0;
    c.opts.softcap = 2;
    check_case(c, 93);
    c = causal(dense(LLMCL_BF16, 5, 4, 1, 128, 0, 0));
    c.cu_q = c.cu_k = cu_a;
    check_case(c, 94);
    c.cu_q = cu_q;
    c.cu_k = cu_k;
    c.opts.cu_seqlens_q_host = cu_q; /* validated on the host: no read-back */
    c.opts.cu_seqlens_k_host = cu_k;
    check_case(c, 96);
}

static void test_determinism(void **state)
{
    (void)state;
    const llmcl_dtype dts[] = {LLMCL_F32, LLMCL_BF16};
    for (size_t i = 0; i < 2; ++i) {
        const attn_case c = causal(dense(dts[i], 2, 8, 2, 64, 130, 130));
        attn_run r;
        run_setup(&r, &c, 100 + i);
        TH_OK(run_forward(&r));
        TH_OK(run_backward(&r));
        void *o = raw(r.o_.t), *lse = raw(r.lse), *dq = raw(r.dq_.t), *dk = raw(r.dk_.t),
             *dv = raw(r.dv_.t);
        th_poison(r.o_.base);
        th_poison(r.dq_.base);
        th_poison(r.dk_.base);
        th_poison(r.dv_.base);
        TH_OK(run_forward(&r));
        TH_OK(run_backward(&r));
        assert_same_bits(r.o_.t, o, "o");
        assert_same_bits(r.lse, lse, "lse");
        assert_same_bits(r.dq_.t, dq, "dq");
        assert_same_bits(r.dk_.t, dk, "dk");
        assert_same_bits(r.dv_.t, dv, "dv");
        free(o);
        free(lse);
        free(dq);
        free(dk);
        free(dv);
        run_free(&r);
    }
}

/* The device memory a call held at its peak beyond what was allocated before it; asserts that it
   freed all of it. */
static uint64_t held_by(llmcl_status (*call)(attn_run *), attn_run *r)
{
    llmcl_memory_stats before, after;
    TH_OK(llmcl_ctx_finish(th_ctx()));
    TH_OK(llmcl_memory_stats_get(th_ctx(), &before));
    TH_OK(llmcl_memory_reset_peak(th_ctx()));
    TH_OK(call(r));
    TH_OK(llmcl_ctx_finish(th_ctx()));
    TH_OK(llmcl_memory_stats_get(th_ctx(), &after));
    assert_int_equal(after.current_bytes, before.current_bytes);
    return after.peak_bytes - before.current_bytes;
}

/* The backward holds one f32 per query row beyond its arguments, and frees it. */
static void test_extra_memory(void **state)
{
    (void)state;
    const attn_case c = causal(dense(LLMCL_F32, 2, 4, 2, 64, 300, 300));
    attn_run r;
    run_setup(&r, &c, 110);
    TH_OK(run_forward(&r));
    const uint64_t rows = 2 * 4 * 300 * sizeof(float);
    assert_true(held_by(run_backward, &r) <= rows + 4096);
    run_free(&r);
}

/* The memory a backward of case c holds beside what it held before, under LLMCL_ATTN_DS_MIB=mib
   (NULL: unset). */
static uint64_t held_with_budget(attn_case c, const char *mib, uint64_t seed)
{
    attn_run r;
    run_setup(&r, &c, seed);
    TH_OK(run_forward(&r));
    TH_OK(llmcl_memory_release_cached(th_ctx()));
    if (mib)
        setenv("LLMCL_ATTN_DS_MIB", mib, 1);
    const uint64_t held = held_by(run_backward, &r);
    unsetenv("LLMCL_ATTN_DS_MIB");
    run_free(&r);
    return held;
}

/* check_ds_parts' case and what it measures against: the pair's bytes, the rows and maps every
   backward holds, and whether the device stores dS where a budget is set. */
typedef struct ds_env {
    llmcl_ctx *ctx;
    attn_case c;
    int d;
    char cls[16];
    int64_t pair;        /* a pair's query heads' dS, bytes */
    uint64_t rows, maps; /* delta's rows and the tensor maps, bytes */
    bool stores;
} ds_env;

/* The budgets of one to six pairs, and dK/dV's two to four slabs of dS a warpgroup (four fit
   beside D 128's 64-query tiles, not D 64's 128-query ones): the same bits with each. */
static void ds_parts_same_bits(ds_env *e)
{
    attn_bits bits = {{NULL}};
    const int64_t parts[] = {e->pair, 2 * e->pair, 4 * e->pair + 1, 6 * e->pair};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; ++i) {
        e->c.opts.ds_bytes = parts[i];
        check_case_bits(e->c, 440 + e->d, &bits);
        if (e->stores) {
            assert_int_equal(th_launched("attention_bwd_dq_ds_wgmma", LLMCL_BF16, e->cls), 1);
            th_assert_launched_with("attention_bwd_dkdv_wgmma", LLMCL_BF16, e->cls,
                                    e->d == 128 ? "DS_SLABS=3" : "DS_SLABS=2");
        }
    }
    static const char *const slabs[] = {"DS_SLABS=2", "DS_SLABS=3", "DS_SLABS=4"};
    e->c.opts.ds_bytes = 6 * e->pair;
    for (int i = 0; i < (e->d == 128 ? 3 : 2); ++i) {
        TH_OK(llmcl_tune_override(e->ctx, "attention_bwd_dkdv_wgmma", LLMCL_BF16, "*", slabs[i]));
        check_case_bits(e->c, 440 + e->d, &bits);
        if (e->stores)
            th_assert_launched_with("attention_bwd_dkdv_wgmma", LLMCL_BF16, e->cls, slabs[i]);
        TH_OK(llmcl_tune_override(e->ctx, NULL, LLMCL_BF16, NULL, NULL));
    }
    for (int i = 0; i < 5; ++i)
        free(bits.t[i]);
}

/* A group of eight query heads (dK/dV's four map slots a warpgroup, each made twice), and the
   backward's peak with a budget of two pairs: the rows, the maps and (stored) the two pairs. */
static void ds_parts_memory(ds_env *e)
{
    attn_case mqa = causal(dense(LLMCL_BF16, 1, 8, 1, e->d, 150, 150));
    mqa.opts.ds_bytes = 8 * 150 * 152 * 2;
    check_case(mqa, 444 + e->d);
    attn_run r;
    e->c.opts.ds_bytes = 2 * e->pair;
    run_setup(&r, &e->c, 441);
    TH_OK(run_forward(&r));
    TH_OK(llmcl_memory_release_cached(e->ctx)); /* no larger buffer of the runs above to reuse */
    const uint64_t held = held_by(run_backward, &r);
    assert_true(held <= e->rows + e->maps + (e->stores ? 2 * (uint64_t)e->pair : 0));
    if (e->stores)
        assert_true(held >= 2 * (uint64_t)e->pair);
    run_free(&r);
}

/* No stored dS (a budget below a pair's, -1, LLMCL_ATTN_DS_MIB=0, or DS_SLABS 5, no form of
   dK/dV's, which recomputes as tuned tiles that leave no room for the slabs do): dQ's own kernel,
   and the peak of the other kernels alone. */
static void ds_not_stored(ds_env *e)
{
    for (int i = 0; i < 4; ++i) {
        e->c.opts.ds_bytes = i == 0 ? e->pair - 1 : i == 1 ? -1 : i == 2 ? 0 : 2 * e->pair;
        if (i == 2)
            setenv("LLMCL_ATTN_DS_MIB", "0", 1);
        if (i == 3)
            TH_OK(llmcl_tune_override(e->ctx, "attention_bwd_dkdv_wgmma", LLMCL_BF16, "*",
                                      "DS_SLABS=5"));
        TH_OK(llmcl_tune_override(e->ctx, "attention_bwd_dq_wgmma", LLMCL_BF16, "*",
                                  "BLOCK_M=64"));
        attn_run r;
        run_setup(&r, &e->c, 442);
        TH_OK(run_forward(&r));
        TH_OK(llmcl_memory_release_cached(e->ctx));
        assert_true(held_by(run_backward, &r) <= e->rows + e->maps);
        run_free(&r);
        unsetenv("LLMCL_ATTN_DS_MIB");
        if (on_wgmma(e->d))
            th_assert_launched_with("attention_bwd_dq_wgmma", LLMCL_BF16, e->cls, "BLOCK_M=64");
        TH_OK(llmcl_tune_override(e->ctx, NULL, LLMCL_BF16, NULL, NULL));
    }
}

/* The built-in budget takes at most a quarter of what the memory cap leaves: under a cap that
   leaves the backward two pairs' dS besides delta and the maps, none (all six pairs would not fit
   under it). */
static void ds_under_a_cap(ds_env *e)
{
    llmcl_memory_stats before, set;
    TH_OK(llmcl_memory_release_cached(e->ctx));
    TH_OK(llmcl_memory_stats_get(e->ctx, &before));
    attn_run r;
    run_setup(&r, &e->c, 445);
    TH_OK(run_forward(&r));
    TH_OK(llmcl_ctx_finish(e->ctx));
    TH_OK(llmcl_memory_stats_get(e->ctx, &set));
    TH_OK(llmcl_memory_set_limit(e->ctx,
                                 set.current_bytes + e->rows + e->maps + 2 * (uint64_t)e->pair));
    e->c.opts.ds_bytes = 0;
    TH_OK(run_backward(&r));
    TH_OK(llmcl_memory_set_limit(e->ctx, before.limit_bytes));
    run_free(&r);
}

/* LLMCL_ATTN_DS_MIB's budget where opts leave it to the default: 1 MiB holds one pair; the
   built-in budget's choice without it; at D 64 past 2048 keys, only the given budget's. */
static void ds_env_budget(ds_env *e)
{
    e->c.opts.ds_bytes = 0;
    attn_case wide = causal(dense(LLMCL_BF16, 1, 2, 1, e->d, 64, 2056));
    const uint64_t wide_pair = 2 * 64 * 2056 * 2, pair = (uint64_t)e->pair;
    for (int env = 0; env < 2; ++env) {
        const uint64_t held_env = held_with_budget(e->c, env ? "1" : NULL, 443);
        const bool stored = env ? e->stores : stores_ds(e->d, 150);
        assert_true(held_env <= e->rows + e->maps + (stored ? (uint64_t)(1 << 20) : 0));
        assert_true(stored ? held_env >= pair : held_env < pair);
        const uint64_t held_wide = held_with_budget(wide, env ? "1" : NULL, 449);
        const bool wide_stored = env ? e->stores : stores_ds(e->d, 2056);
        assert_true(wide_stored ? held_wide >= wide_pair : held_wide < wide_pair);
    }
}

/*
 * The stored dS in parts at head dim d (where the device stores it: elsewhere the same calls run
 * the other kernels and must agree all the same): a GQA batch of 2 x 3 KV heads, 2 query heads
 * each, with budgets for parts of 1, 2 and 4 (batch, KV head) pairs and for all six, each against
 * the reference and bit for bit with the others (a pair's work does not depend on its part), and
 * an MQA group of eight heads; its peak memory beside delta's rows is one part's dS (Tk rounded
 * up to 8) and the tensor maps. A budget below one pair's dS, -1, or LLMCL_ATTN_DS_MIB=0
 * recompute the scores in dQ's kernel, as the built-in budget does where a quarter of the memory
 * that the cap leaves holds no pair. LLMCL_ATTN_DS_MIB sets the budget where opts leave it to the
 * default, and stores at D 64 whatever the keys, where the built-in budget stores up to 2048.
 */
static void check_ds_parts(int d)
{
    const llmcl_device_info *in = llmcl_ctx_device_info(th_ctx());
    ds_env e = {.ctx = th_ctx(),
                .c = causal(dense(LLMCL_BF16, 2, 6, 3, d, 150, 150)),
                .d = d,
                .pair = 2 * 150 * 152 * 2,
                .rows = 2 * 6 * 150 * sizeof(float),
                .maps = 64 * 1024,
                .stores = in->has_wgmma && in->has_tma}; /* with a budget set */
    snprintf(e.cls, sizeof e.cls, "%d", d);
    ds_parts_same_bits(&e);
    ds_parts_memory(&e);
    ds_not_stored(&e);
    ds_under_a_cap(&e);
    ds_env_budget(&e);
}

/*
 * The built-in budget (LLMCL_ATTN_DS_MIB's here) declines parts whose dK/dV has fewer than 1.5
 * work-groups a compute unit, and stores dS in larger ones: 128 (batch, KV head) pairs of two
 * key tiles each (T 150, dK/dV's 128 keys at D 128), under the largest budget in MiB below the
 * line and the smallest at or above it. A part's dS is held through the backward where it
 * stores, and nothing of its size where it recomputes.
 */
static void check_ds_default_parts(void)
{
    llmcl_ctx *ctx = th_ctx();
    if (!stores_ds(128, 150))
        return;
    const int64_t cus = llmcl_ctx_device_info(ctx)->compute_units;
    const attn_case c = causal(dense(LLMCL_BF16, 4, 32, 32, 128, 150, 150));
    const int64_t pair = 150 * 152 * 2, tiles = 2, total = 4 * 32;
    int64_t mib = 1; /* the first budget whose parts store */
    while (2 * ((mib << 20) / pair) * tiles < 3 * cus)
        ++mib;
    if (mib == 1 || (mib << 20) / pair >= total)
        return; /* no budget of whole MiB below the line, or one part takes every pair */
    for (int64_t m = mib - 1; m <= mib; ++m) {
        char text[32];
        snprintf(text, sizeof text, "%lld", (long long)m);
        setenv("LLMCL_ATTN_DS_MIB", text, 1);
        attn_run r;
        run_setup(&r, &c, 446);
        TH_OK(run_forward(&r));
        TH_OK(llmcl_memory_release_cached(ctx));
        const uint64_t held = held_by(run_backward, &r);
        unsetenv("LLMCL_ATTN_DS_MIB");
        const uint64_t part = (uint64_t)((m << 20) / pair * pair);
        if (m < mib)
            assert_true(held < part);
        else
            assert_true(held >= part);
        run_free(&r);
    }
}

/*
 * dQ from the stored dS by persistent work-groups (attn_bwd_dq_ds_wgmma's PERSIST): 160 items
 * (two rounds on 132 compute units at PERSIST 1), 1024 (four rounds and more, so that each set
 * of maps is remade), and blocks with no key to see (causal, Tq > Tk); against the reference,
 * and bit for bit a work-group an item's.
 */
static void check_dq_ds_persist(int d)
{
    llmcl_ctx *ctx = th_ctx();
    const llmcl_device_info *in = llmcl_ctx_device_info(ctx);
    if (!in->has_wgmma || !in->has_tma)
        return; /* no stored dS: the portable kernels would only repeat check_ds_parts */
    attn_case cases[] = {
        causal(dense(LLMCL_BF16, 2, 16, 4, d, 520, 520)),
        causal(dense(LLMCL_BF16, 8, 64, 8, d, 130, 130)),
        causal(dense(LLMCL_BF16, 4, 64, 8, d, 300, 17)),
    };
    char cls[16];
    snprintf(cls, sizeof cls, "%d", d);
    static const char *const sets[] = {"PERSIST=0", "PERSIST=1", "PERSIST=2"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; ++c) {
        cases[c].opts.ds_bytes = 64 << 20;
        attn_bits bits = {{NULL}};
        for (int i = 0; i < 3; ++i) {
            TH_OK(llmcl_tune_override(ctx, "attention_bwd_dq_ds_wgmma", LLMCL_BF16, "*",
                                      sets[i]));
            check_case_bits(cases[c], 490 + 10 * c + d, &bits);
            th_assert_launched_with("attention_bwd_dq_ds_wgmma", LLMCL_BF16, cls, sets[i]);
            TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_BF16, NULL, NULL));
        }
        for (int i = 0; i < 5; ++i)
            free(bits.t[i]);
    }
}

static void test_ds_parts(void **state)
{
    (void)state;
    check_ds_parts(64);
    check_ds_parts(128);
    check_dq_ds_persist(64);
    check_dq_ds_persist(128);
    check_ds_default_parts();
}

/*
 * The persistent forward (PERSIST work-groups a compute unit walk the items, three rounds and
 * more here): items with no key to see (causal, Tq > Tk), varlen sequences of length 0 and 1
 * (items past them skipped) and a sequence of queries with no key, a window; against the double
 * reference, and bit for bit the forward of a work-group an item.
 */
static void test_persistent_forward(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const llmcl_device_info *in = llmcl_ctx_device_info(ctx);
    if (!in->has_wgmma || !in->has_tma)
        skip();
    static const int32_t cu[] = {0, 0, 1, 71, 72, 140}, cu_k0[] = {0, 5, 5, 80, 81, 150};
    static const char *const sets[] = {"PERSIST=0", "PERSIST=1", "PERSIST=2"};
    const int dims[] = {64, 128, 256};
    for (int di = 0; di < 3; ++di) {
        const int d = dims[di];
        char cls[16];
        snprintf(cls, sizeof cls, "%d", d);
        attn_case cases[] = {
            causal(dense(LLMCL_BF16, 4, 16, 4, d, 520, 520)),
            causal(dense(LLMCL_BF16, 4, 64, 8, d, 100, 17)),
            causal(dense(LLMCL_BF16, 5, 64, 8, d, 0, 0)),
            windowed(dense(LLMCL_BF16, 2, 64, 8, d, 300, 300), 5, 0),
            dense(LLMCL_BF16, 5, 64, 8, d, 0, 0),
        };
        cases[2].cu_q = cases[2].cu_k = cu;
        cases[4].cu_q = cu;
        cases[4].cu_k = cu_k0; /* queries whose sequence has no key: items with no map of K */
        for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
            attn_run r;
            run_setup(&r, &cases[i], 470 + 10 * di + i);
            double *o = th_alloc(sizeof(double) * (size_t)r.nq);
            double *lse = th_alloc(sizeof(double) * (size_t)r.nl);
            attn_ref_forward(&r.cfg, r.q, r.k, r.v, o, lse);
            void *o0 = NULL, *lse0 = NULL;
            for (int j = 0; j < 3; ++j) {
                TH_OK(llmcl_tune_override(ctx, "attention_fwd_wgmma", LLMCL_BF16, "*", sets[j]));
                th_poison(r.o_.base);
                th_poison(r.lse);
                TH_OK(run_forward(&r));
                th_assert_launched_with("attention_fwd_wgmma", LLMCL_BF16, cls, sets[j]);
                if (j == 0) {
                    compare("o", r.o_.t, o, r.nq, tol_out(LLMCL_BF16));
                    compare("lse", r.lse, lse, r.nl, (th_tol){1e-4, 1e-5});
                    o0 = raw(r.o_.t);
                    lse0 = raw(r.lse);
                } else {
                    assert_same_bits(r.o_.t, o0, "o");
                    assert_same_bits(r.lse, lse0, "lse");
                }
                TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_BF16, NULL, NULL));
            }
            free(o0);
            free(lse0);
            free(o);
            free(lse);
            run_free(&r);
        }
    }
    /* more work-groups a compute unit than the kernel takes, or without TMA: refused */
    static const char *const refused[] = {"PERSIST=5", "PERSIST=1 TMA=0"};
    for (int i = 0; i < 2; ++i) {
        const attn_case c = causal(dense(LLMCL_BF16, 1, 2, 1, 128, 40, 40));
        attn_run r;
        run_setup(&r, &c, 479);
        TH_OK(llmcl_tune_override(ctx, "attention_fwd_wgmma", LLMCL_BF16, "*", refused[i]));
        TH_FAILS(run_forward(&r), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(ctx), "PERSIST"));
        TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_BF16, NULL, NULL));
        run_free(&r);
    }
}

/* Every byte of t as th_poison left it: a refused call wrote nothing there. */
static void assert_poisoned(const llmcl_tensor *t, const char *what)
{
    const size_t bytes = (size_t)llmcl_tensor_numel(t) * llmcl_dtype_size(llmcl_tensor_dtype(t));
    unsigned char *now = raw(t);
    for (size_t i = 0; i < bytes; ++i)
        if (now[i] != 0xFF)
            fail_msg("%s was written by a refused call (byte %zu)", what, i);
    free(now);
}

/* Tiles for the three portable kernels in f32 (forward, dQ, dK/dV), or none (NULL): the
   defaults again. */
static void f32_tiles(const char *const *sets)
{
    static const char *const keys[3] = {"attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"};
    TH_OK(llmcl_tune_override(th_ctx(), NULL, LLMCL_F32, NULL, NULL));
    for (int k = 0; k < 3 && sets; ++k)
        TH_OK(llmcl_tune_override(th_ctx(), keys[k], LLMCL_F32, "*", sets[k]));
}

/*
 * Loop limits (issue 35): where a device cuts loops short (rusticl's llvmpipe, 65535 passes a
 * work-item and launch), a portable kernel's walk (attn_fwd's and attn_bwd_dq's key tiles,
 * attn_bwd_dkdv's query tiles of every head of the group) runs in launches that resume from a
 * saved state. A limit of 5000 splits them on any device: causal GQA over several tiles, Tq < Tk,
 * and a varlen GQA batch under a window with test_tunables' staged tiles of 12 work-items (PIPE;
 * their programs without the split are built by then), each against the reference and bit for
 * bit against the same case without a limit (the same steps in the same order); the forward's
 * state shows in its memory peak. A limit of 200, below one step, is refused before anything
 * runs, the outputs left as they were.
 */
static void test_loop_limit(void **state)
{
    (void)state;
    static const int32_t cu[] = {0, 5, 205, 300};
    attn_case cases[3] = {causal(dense(LLMCL_F32, 1, 4, 2, 64, 333, 333)),
                          dense(LLMCL_F32, 2, 2, 1, 64, 90, 250),
                          windowed(dense(LLMCL_F32, 3, 4, 2, 64, 0, 0), 120, 30)};
    cases[2].cu_q = cases[2].cu_k = cu;
    static const char *const staged[3] = {"BLOCK_M=12 BLOCK_N=16 TM=4 TN=4 PIPE=1 TILE_RUN=100",
                                          "BLOCK_M=12 BLOCK_N=16 TM=4 TN=4 PIPE=1 TILE_RUN=100",
                                          "BLOCK_M=16 BLOCK_N=12 TM=4 TN=4 PIPE=1 TILE_RUN=100"};
    attn_bits bits[3] = {0};
    const char *const limits[2] = {NULL, "5000"};
    for (int pass = 0; pass < 2; ++pass) {
        th_loop_limit(limits[pass]);
        for (int i = 0; i < 3; ++i) {
            f32_tiles(i == 2 ? staged : NULL);
            check_case_bits(cases[i], 410 + i, &bits[i]);
        }
        f32_tiles(NULL);
    }
    attn_run r;
    run_setup(&r, &cases[0], 410);
    assert_true(held_by(run_forward, &r) >= (uint64_t)4 * 333 * 64 * sizeof(float));
    run_free(&r);

    th_loop_limit("200");
    llmcl_ctx *ctx = th_ctx();
    run_setup(&r, &cases[0], 420);
    TH_FAILS(run_forward(&r), LLMCL_ERROR_UNSUPPORTED);
    assert_non_null(strstr(llmcl_last_error(ctx), "attn_fwd"));
    assert_non_null(strstr(llmcl_last_error(ctx), "past the 200"));
    assert_poisoned(r.o_.t, "o");
    assert_poisoned(r.lse, "lse");
    TH_FAILS(run_backward(&r), LLMCL_ERROR_UNSUPPORTED);
    assert_non_null(strstr(llmcl_last_error(ctx), "attn_bwd_"));
    assert_poisoned(r.dq_.t, "dq");
    assert_poisoned(r.dk_.t, "dk");
    assert_poisoned(r.dv_.t, "dv");
    run_free(&r);
    th_loop_limit(NULL);
}

/*
 * Where the device cuts loops short (rusticl's llvmpipe), sequences that passed its limit before
 * the split: T = 8192 at D = 32 (attn_fwd gave O from about 6450 of the 8192 keys; causal, at half
 * the work, the last query tiles and the first key tiles still walk all 512 tiles of the other
 * side), and a causal GQA group of 4 heads at D = 8, whose narrow tiles there (4 keys in attn_fwd
 * and attn_bwd_dq, 4 queries in attn_bwd_dkdv, over every head of the group) multiply the steps.
 * Elsewhere test_loop_limit's low limit runs the same launches.
 */
static void test_long_sequences(void **state)
{
    (void)state;
    if (!llmcl_ctx_device_info(th_ctx())->loop_limit)
        return;
    check_case(causal(dense(LLMCL_F32, 1, 1, 1, 32, 8192, 8192)), 430);
    check_case(causal(dense(LLMCL_BF16, 1, 4, 1, 8, 2048, 2048)), 431);
}

/* Every validation path; each failure must leave the outputs as they were. */
static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const attn_case c = dense(LLMCL_F32, 2, 4, 2, 64, 20, 24);
    attn_run r;
    run_setup(&r, &c, 120);
    TH_OK(run_forward(&r));
    TH_OK(llmcl_ctx_finish(ctx));
    llmcl_tensor *q = r.q_.t, *k = r.k_.t, *v = r.v_.t, *o = r.o_.t, *lse = r.lse, *dout = r.do_.t;
    llmcl_tensor *dq = r.dq_.t, *dk = r.dk_.t, *dv = r.dv_.t;
    th_poison(dq);
    void *o_before = raw(o), *dq_before = raw(dq);

    TH_FAILS(llmcl_attention_forward(NULL, q, k, v, NULL, o, lse), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_attention_forward(ctx, NULL, k, v, NULL, o, lse), LLMCL_ERROR_INVALID_ARGUMENT);

    /*
     * Head dims that are no multiple of 8, below 8 or above 256, refused with the rule in the
     * message; Hq not a multiple of Hkv; mismatched shapes and dtypes.
     */
    const int bad_dims[] = {36, 4, 264};
    for (size_t i = 0; i < sizeof bad_dims / sizeof *bad_dims; ++i) {
        const int64_t sq[4] = {2, 4, 20, bad_dims[i]}, sk[4] = {2, 2, 24, bad_dims[i]};
        llmcl_tensor *qd = th_tensor(LLMCL_F32, 4, sq), *kd = th_tensor(LLMCL_F32, 4, sk);
        TH_FAILS(llmcl_attention_forward(ctx, qd, kd, kd, NULL, o, lse), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(ctx), "a multiple of 8 from 8 to 256"));
        TH_FAILS(llmcl_attention_backward(ctx, qd, kd, kd, o, lse, dout, NULL, dq, dk, dv),
                 LLMCL_ERROR_UNSUPPORTED);
        llmcl_tensor_destroy(qd);
        llmcl_tensor_destroy(kd);
    }
    const int64_t s_q3[4] = {2, 3, 20, 64}, s_d48[4] = {2, 4, 20, 48}, s_k48[4] = {2, 2, 24, 48};
    const int64_t s_v25[4] = {2, 2, 25, 64}, s_b1[4] = {1, 2, 24, 64}, s_lse[3] = {2, 4, 21};
    llmcl_tensor *q3 = th_tensor(LLMCL_F32, 4, s_q3), *q48 = th_tensor(LLMCL_F32, 4, s_d48);
    llmcl_tensor *k48 = th_tensor(LLMCL_F32, 4, s_k48), *v25 = th_tensor(LLMCL_F32, 4, s_v25);
    llmcl_tensor *kb1 = th_tensor(LLMCL_F32, 4, s_b1), *lse21 = th_tensor(LLMCL_F32, 3, s_lse);
    const int64_t s_k[4] = {2, 2, 24, 64};
    llmcl_tensor *kbf = th_tensor(LLMCL_BF16, 4, s_k);
    TH_FAILS(llmcl_attention_forward(ctx, q3, k, v, NULL, q48, lse), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q48, k48, k48, NULL, o, lse), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q, k48, k48, NULL, o, lse), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v25, NULL, o, lse), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q, kb1, kb1, NULL, o, lse), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v, NULL, o, lse21), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_forward(ctx, q, kbf, v, NULL, o, lse), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v, NULL, q, lse), LLMCL_ERROR_INVALID_ARGUMENT);

    llmcl_attention_opts bad = {.use_window = 1, .window_left = -2, .window_right = 0};
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v, &bad, o, lse), LLMCL_ERROR_INVALID_ARGUMENT);
    bad = (llmcl_attention_opts){.softcap = -1};
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v, &bad, o, lse), LLMCL_ERROR_INVALID_ARGUMENT);
    bad = (llmcl_attention_opts){.scale = NAN};
    TH_FAILS(llmcl_attention_forward(ctx, q, k, v, &bad, o, lse), LLMCL_ERROR_INVALID_ARGUMENT);
    bad = (llmcl_attention_opts){.ds_bytes = -2};
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, &bad, dq, dk, dv),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "ds_bytes"));
    setenv("LLMCL_ATTN_DS_MIB", "1k", 1);
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, NULL, dq, dk, dv),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "LLMCL_ATTN_DS_MIB"));
    unsetenv("LLMCL_ATTN_DS_MIB");

    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, NULL, dq, v25, dv),
             LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, NULL, dq, dk, kbf),
             LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, NULL, dq, dk, dk),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse, dout, NULL, dout, dk, dv),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_attention_backward(ctx, q, k, v, o, lse21, dout, NULL, dq, dk, dv),
             LLMCL_ERROR_SHAPE_MISMATCH);

    assert_same_bits(o, o_before, "o after failed calls");
    assert_same_bits(dq, dq_before, "dq after failed calls");
    free(o_before);
    free(dq_before);
    llmcl_tensor *owned[] = {q3, q48, k48, v25, kb1, lse21, kbf};
    for (size_t i = 0; i < sizeof owned / sizeof *owned; ++i)
        llmcl_tensor_destroy(owned[i]);
    run_free(&r);
}

/*
 * Varlen offsets that decrease, do not start at 0, or exceed / miss the packed length, and offsets
 * that are not contiguous.
 */
static void test_bad_varlen(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    static const int32_t cu[] = {0, 5, 9, 16};
    attn_case c = dense(LLMCL_F32, 3, 2, 2, 32, 0, 0);
    c.cu_q = c.cu_k = cu;
    attn_run r;
    run_setup(&r, &c, 130);
    TH_OK(run_forward(&r));
    TH_OK(llmcl_ctx_finish(ctx));
    void *o_before = raw(r.o_.t);

    static const int32_t decreasing[] = {0, 9, 5, 16}, late[] = {1, 5, 9, 16}, past[] = {0, 5, 9, 17};
    static const int32_t short_[] = {0, 5, 9, 15}, two[] = {0, 16};
    const int32_t *bad[] = {decreasing, late, past, short_};
    const llmcl_status want[] = {LLMCL_ERROR_INVALID_ARGUMENT, LLMCL_ERROR_INVALID_ARGUMENT,
                                 LLMCL_ERROR_SHAPE_MISMATCH, LLMCL_ERROR_SHAPE_MISMATCH};
    for (size_t i = 0; i < 4; ++i) {
        llmcl_tensor *cb = cu_tensor(bad[i], 3);
        llmcl_attention_opts o1 = r.c.opts, o2 = r.c.opts;
        o1.cu_seqlens_q = cb;
        o2.cu_seqlens_k = cb;
        TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o1, r.o_.t, r.lse), want[i]);
        TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o2, r.o_.t, r.lse), want[i]);
        llmcl_tensor_destroy(cb);
    }
    llmcl_tensor *c2 = cu_tensor(two, 1);
    llmcl_attention_opts o3 = r.c.opts;
    o3.cu_seqlens_k = c2; /* a different batch size */
    TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o3, r.o_.t, r.lse),
             LLMCL_ERROR_SHAPE_MISMATCH);
    o3 = r.c.opts;
    o3.cu_seqlens_k = NULL;
    TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o3, r.o_.t, r.lse),
             LLMCL_ERROR_INVALID_ARGUMENT);
    for (size_t i = 0; i < 4; ++i) { /* the host copies are what is checked */
        o3 = r.c.opts;
        o3.cu_seqlens_q_host = bad[i];
        o3.cu_seqlens_k_host = cu;
        TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o3, r.o_.t, r.lse), want[i]);
    }
    o3 = r.c.opts;
    o3.cu_seqlens_q_host = cu; /* one host copy without the other */
    TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o3, r.o_.t, r.lse),
             LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor_destroy(c2);
    /* every other element of {0, 99, 5, 99, 9, 99, 16, 99}: good offsets that the kernels, which
       read them one after another, would see as 0, 99, 5, 99 */
    static const int32_t spread[] = {0, 99, 5, 99, 9, 99, 16, 99};
    llmcl_tensor *wide = cu_tensor(spread, 7), *every2;
    const int64_t four[1] = {4}, two_apart[1] = {2};
    TH_OK(llmcl_tensor_view(wide, 1, four, two_apart, 0, &every2));
    o3 = r.c.opts;
    o3.cu_seqlens_q = o3.cu_seqlens_k = every2;
    TH_FAILS(llmcl_attention_forward(ctx, r.q_.t, r.k_.t, r.v_.t, &o3, r.o_.t, r.lse),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "cu_seqlens_q must be contiguous"));
    llmcl_tensor_destroy(every2), llmcl_tensor_destroy(wide);
    assert_same_bits(r.o_.t, o_before, "o after failed varlen calls");
    free(o_before);
    run_free(&r);
}

int main(int argc, char **argv)
{
    th_kernel_option(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_tile_edge_ranges),
        cmocka_unit_test(test_fast_path),
        cmocka_unit_test(test_softcap_scale),
        cmocka_unit_test(test_head_dims),
        cmocka_unit_test(test_every_head_dim),
        cmocka_unit_test(test_gqa_mqa),
        cmocka_unit_test(test_layout_bthd),
        cmocka_unit_test(test_t1),
        cmocka_unit_test(test_16bit),
        cmocka_unit_test(test_varlen),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_extra_memory),
        cmocka_unit_test_teardown(test_ds_parts, clear_overrides),
        cmocka_unit_test_teardown(test_persistent_forward, clear_overrides),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_bad_varlen),
        cmocka_unit_test_teardown(test_tunables, clear_overrides),
        cmocka_unit_test_teardown(test_tunables_other_head_dim, clear_overrides),
        cmocka_unit_test_teardown(test_delta_lanes, clear_overrides),
        cmocka_unit_test(test_unaligned_views),
        cmocka_unit_test(test_packed_heads),
        cmocka_unit_test(test_tuned_tiles_for_other_head_dim),
        cmocka_unit_test(test_loop_limit), /* after test_tunables, whose programs it reuses */
        cmocka_unit_test(test_long_sequences),
    };
    return TH_RUN(tests);
}
