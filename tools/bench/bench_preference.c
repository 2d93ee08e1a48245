/*
 * bench_preference.c: llmcl-bench rows for the preference losses on the output projection, at a
 * 1B model's head (H 2048) on B 4 pairs of T 1024 positions (8192, the first quarter of each
 * sequence a prompt that is not scored) with bf16 hidden states and weight: DPO's loss and
 * gradients (dhidden, dweight in f32) on given reference log-probabilities, the log-probabilities
 * alone (a reference model's pass), both again with bf16 logits (shape `L16`, logits_dtype),
 * ORPO with its supervised term (nll_weight 1), then DPO at an 8B model's head (H 4096). TFLOP/s
 * of the products a step needs whichever form runs: 6 N V H with the gradients (the logits,
 * dhidden and dweight), 2 N V H for the log-probabilities alone; with their peak memory. DPO and
 * ORPO on a small f32 problem with a bias are checked against the double reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "cross_entropy_ref.h"
#include "preference_ref.h"
#include "util/util.h"

typedef struct pref_bench {
    llmcl_tensor *h, *w, *bias, *labels, *ref, *loss, *logps, *dh, *dw, *db;
    llmcl_pref_options o;
} pref_bench;

static void bench_free(pref_bench *b)
{
    llmcl_tensor *all[] = {b->h,    b->w,     b->bias, b->labels, b->ref,
                           b->loss, b->logps, b->dh,   b->dw,     b->db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

/* The loss, each sequence's log-probability and the gradients; DPO reads ref_logps. */
static llmcl_status op_train(llmcl_ctx *ctx, void *arg)
{
    pref_bench *b = arg;
    const llmcl_tensor *ref = b->o.loss == LLMCL_PREF_DPO ? b->ref : NULL;
    return llmcl_linear_preference_forward(ctx, b->h, b->w, b->bias, b->labels, ref, &b->o,
                                           b->loss, b->logps, b->dh, b->dw, b->db);
}

/* The log-probabilities alone, as a reference model's pass computes them. */
static llmcl_status op_logps(llmcl_ctx *ctx, void *arg)
{
    pref_bench *b = arg;
    return llmcl_linear_preference_forward(ctx, b->h, b->w, b->bias, b->labels, NULL, &b->o, NULL,
                                           b->logps, NULL, NULL, NULL);
}

/* hidden [2 pairs, t, h] and weight [v, h] (and bias [v]) of dtype dt, labels [2 pairs, t] the
   first t / 4 of each sequence not scored, ref_logps [2 pairs], and the f32 outputs. */
static llmcl_status setup(llmcl_ctx *ctx, pref_bench *b, llmcl_dtype dt, int64_t pairs, int64_t t,
                          int64_t h, int64_t v, int bias)
{
    const int64_t hs[3] = {2 * pairs, t, h}, ws[2] = {v, h}, seqs = 2 * pairs, one = 1;
    TRY(bench_new_random(ctx, dt, 3, hs, 1, &b->h));
    TRY(bench_new_random(ctx, dt, 2, ws, 2, &b->w));
    TRY(bench_new_labels(ctx, 2, hs, v, t / 4, &b->labels)); /* hs's first two: [2 pairs, t] */
    TRY(bench_new_random(ctx, LLMCL_F32, 1, &seqs, 3, &b->ref));
    TRY(llmcl_tensor_create(ctx, LLMCL_F32, 1, &one, &b->loss));
    TRY(llmcl_tensor_create(ctx, LLMCL_F32, 1, &seqs, &b->logps));
    TRY(llmcl_tensor_create(ctx, LLMCL_F32, 3, hs, &b->dh));
    TRY(llmcl_tensor_create(ctx, LLMCL_F32, 2, ws, &b->dw));
    if (bias) {
        TRY(bench_new_random(ctx, dt, 1, &v, 4, &b->bias));
        TRY(llmcl_tensor_create(ctx, LLMCL_F32, 1, &v, &b->db));
    }
    return LLMCL_OK;
}

/* An f32 tensor's n values as doubles. */
static llmcl_status fetch(const llmcl_tensor *t, int64_t n, double *out)
{
    float *f = malloc((size_t)n * sizeof *f);
    llmcl_status st = f ? llmcl_tensor_download(t, f, (size_t)n * sizeof *f)
                        : LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    for (int64_t i = 0; st == LLMCL_OK && i < n; ++i)
        out[i] = f[i];
    free(f);
    return st;
}

/* Every |want - got| within 1e-4 of want's largest magnitude (plus 1e-6). */
static int close_to(const double *want, const double *got, int64_t n)
{
    double m = 0, err = 0;
    for (int64_t i = 0; i < n; ++i)
        m = fmax(m, fabs(want[i])), err = fmax(err, fabs(want[i] - got[i]));
    return err <= 1e-4 * m + 1e-6;
}

/* f32 hidden [4, 8, 16], weight [300, 16] and bias with the loss o (beta 0.1, its default
   log-probabilities) against ref_preference: loss, logps, dhidden, dweight, dbias. 1 matched. */
static int check_small(bench_env *env, llmcl_pref_options o)
{
    enum { P = 2, S = 2 * P, T = 8, H = 16, V = 300, N = S * T };
    enum { ALL = 2 * (N + V) * H + 2 * V + 2 * S + 1 }; /* the elements of len below */
    /* the device's inputs and outputs in b's order, then the reference's outputs (want[4..8]),
       the logits and their gradient */
    const int64_t len[9] = {N * H, V * H, V, S, 1, S, N * H, V * H, V};
    pref_bench b = {.o = o};
    double *x = malloc((2 * ALL + 2 * N * V) * sizeof *x), *at[9], *want[9];
    int32_t y32[N];
    int64_t y[N];
    int ok = 0;
    if (x && setup(env->ctx, &b, LLMCL_F32, P, T, H, V, 1) == LLMCL_OK &&
        op_train(env->ctx, &b) == LLMCL_OK &&
        llmcl_tensor_download(b.labels, y32, sizeof y32) == LLMCL_OK) {
        const llmcl_tensor *t[9] = {b.h, b.w, b.bias, b.ref, b.loss, b.logps, b.dh, b.dw, b.db};
        llmcl_status st = LLMCL_OK;
        for (int i = 0; i < 9; ++i) {
            at[i] = i ? at[i - 1] + len[i - 1] : x;
            want[i] = i ? want[i - 1] + len[i - 1] : x + ALL;
            if (st == LLMCL_OK)
                st = fetch(t[i], len[i], at[i]);
        }
        for (int i = 0; i < N; ++i)
            y[i] = y32[i];
        const ref_pref_opts ro = {.loss = o.loss,
                                  .beta = 0.1,
                                  .nll_weight = o.nll_weight,
                                  .average = o.loss == LLMCL_PREF_ORPO,
                                  .ignore_index = -100,
                                  .grad_scale = 1.0};
        double *logits = x + 2 * ALL, *g = logits + N * V;
        const double *ref = o.loss == LLMCL_PREF_DPO ? at[3] : NULL;
        if (st == LLMCL_OK) {
            ref_linear(at[0], at[1], at[2], N, H, V, logits);
            ok = ref_preference(logits, y, P, T, V, &ro, ref, want[4], want[5], g) < 0;
        }
        if (ok)
            ref_linear_backward(g, at[0], at[1], N, H, V, want[6], want[7], want[8]);
        for (int i = 4; i < 9 && ok; ++i)
            ok = close_to(want[i], at[i], len[i]);
    }
    free(x);
    bench_free(&b);
    return ok;
}

/* Sets row r's kernel, direction, FLOPs and check, then times op on b into it. */
static void add_row(bench_env *env, bench_row *r, const char *kernel, const char *dir,
                    double flops, int check, bench_op op, pref_bench *b)
{
    snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
    snprintf(r->direction, sizeof r->direction, "%s", dir);
    r->flops = flops;
    r->check = check;
    bench_add_op(env, r, op, NULL, b);
}

/* Row r's shape: the pairs, positions, head width and vocabulary, then what sets it apart. */
static void set_shape(bench_row *r, int64_t pairs, int64_t t, int64_t h, int64_t v,
                      const char *what)
{
    snprintf(r->shape, sizeof r->shape, "B%lld T%lld H%lld V%lld%s", (long long)pairs,
             (long long)t, (long long)h, (long long)v, what);
}

/* DPO with its gradients at head width h; with `all`, the log-probabilities alone and ORPO. */
static void linear_rows(bench_env *env, int64_t h, int all, int check_dpo, int check_orpo)
{
    const int64_t pairs = env->small ? 2 : 4, t = env->small ? 64 : 1024;
    const int64_t v = env->small ? 4096 : 128256;
    pref_bench b = {0};
    llmcl_status st = setup(env->ctx, &b, LLMCL_BF16, pairs, t, h, v, 0);
    if (st != LLMCL_OK) {
        bench_fail(env, "linear preference", st);
        bench_free(&b);
        return;
    }
    const double gemm = 2.0 * (double)(2 * pairs * t) * (double)v * (double)h;
    bench_row r = {.dtype = "bf16", .on_mma = llmcl_ctx_device_info(env->ctx)->has_mma};
    set_shape(&r, pairs, t, h, v, "");
    /* TFLOP/s of the three products a step needs (logits, dhidden, dweight), whichever form */
    add_row(env, &r, "linear_pref_dpo", "fwd+bwd", 3 * gemm, check_dpo, op_train, &b);
    if (all) {
        add_row(env, &r, "linear_pref_logps", "fwd", gemm, check_dpo, op_logps, &b);
        bench_row half = r, fused = r;
        set_shape(&half, pairs, t, h, v, " L16");
        b.o.logits_dtype = LLMCL_BF16;
        add_row(env, &half, "linear_pref_dpo", "fwd+bwd", 3 * gemm, check_dpo, op_train, &b);
        add_row(env, &half, "linear_pref_logps", "fwd", gemm, check_dpo, op_logps, &b);
        b.o = (llmcl_pref_options){.chunk_bytes = 64ull << 20}; /* no pair fits: the fused form */
        set_shape(&fused, pairs, t, h, v, " 64M");
        add_row(env, &fused, "linear_pref_dpo", "fwd+bwd", 3 * gemm, check_dpo, op_train, &b);
        b.o = (llmcl_pref_options){.loss = LLMCL_PREF_ORPO, .nll_weight = 1.0f};
        add_row(env, &r, "linear_pref_orpo_nll1", "fwd+bwd", 3 * gemm, check_orpo, op_train, &b);
    }
    bench_free(&b);
}

void bench_preference(bench_env *env)
{
    const int dpo = check_small(env, (llmcl_pref_options){0});
    const int orpo =
        check_small(env, (llmcl_pref_options){.loss = LLMCL_PREF_ORPO, .nll_weight = 1.0f});
    linear_rows(env, env->small ? 256 : 2048, 1, dpo, orpo);
    linear_rows(env, env->small ? 512 : 4096, 0, dpo, orpo);
}
