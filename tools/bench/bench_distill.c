/*
 * bench_distill.c: llmcl-bench rows for the distillation losses. On materialised bf16 logits
 * (GB/s over the student's and the teacher's logits read once, plus the gradient written in
 * place): the loss alone and with the gradient, at beta 0.5 (two walks of a row, three with the
 * gradient) and 0 (one, and two), and at beta 0 with the cross-entropy on random labels beside
 * it (ce_weight 1, what llmcl-train --teacher runs). The linear form at an 8B model's head
 * (TFLOP/s of its products: both logits, dhidden and dweight) at the default scratch budget
 * (2 GiB) and at 256 MiB, with its peak memory, and at the default with the cross-entropy. A
 * small problem is checked against the double reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "distill_ref.h"

typedef struct distill_bench {
    llmcl_tensor *s, *t, *loss;
    llmcl_tensor *h, *w, *th, *tw, *dh, *dw;
    llmcl_tensor *labels; /* NULL: every row counts, no cross-entropy */
    llmcl_distill_options o;
} distill_bench;

static void bench_free(distill_bench *b)
{
    llmcl_tensor *all[] = {b->s, b->t, b->loss, b->h, b->w, b->th, b->tw, b->dh, b->dw, b->labels};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

static llmcl_status op_loss(llmcl_ctx *ctx, void *arg)
{
    distill_bench *b = arg;
    return llmcl_distill_forward(ctx, b->s, b->t, b->labels, &b->o, b->loss, NULL);
}

static llmcl_status op_grad(llmcl_ctx *ctx, void *arg)
{
    distill_bench *b = arg;
    return llmcl_distill_forward(ctx, b->s, b->t, b->labels, &b->o, b->loss, b->s);
}

static llmcl_status op_linear(llmcl_ctx *ctx, void *arg)
{
    distill_bench *b = arg;
    return llmcl_linear_distill_forward(ctx, b->h, b->w, b->th, b->tw, b->labels, &b->o, b->loss,
                                        b->dh, b->dw);
}

static llmcl_status new_random(llmcl_ctx *ctx, llmcl_dtype dt, int64_t r, int64_t c, uint64_t seed,
                               llmcl_tensor **out)
{
    return bench_new_random(ctx, dt, 2, (const int64_t[2]){r, c}, seed, out);
}

static llmcl_status download_f32(const llmcl_tensor *t, float *out)
{
    return llmcl_tensor_download(t, out, (size_t)llmcl_tensor_numel(t) * sizeof *out);
}

/* f32 logits [5, 1001] at beta 0.5 and tau 2 against ref_distill: 1 matched, 0 not. */
static int check_small(bench_env *env)
{
    enum { N = 5, V = 1001 };
    distill_bench b = {.o = {.beta = 0.5f, .temperature = 2.0f}};
    const int64_t one = 1;
    float *hs = malloc(2 * N * V * sizeof *hs), *hg = malloc(N * V * sizeof *hg), loss = NAN;
    double *s = malloc(2 * N * V * sizeof *s), *g = malloc(N * V * sizeof *g), rl = NAN;
    llmcl_tensor *ds = NULL;
    int ok = 0;
    if (hs && hg && s && g && new_random(env->ctx, LLMCL_F32, N, V, 5, &b.s) == LLMCL_OK &&
        new_random(env->ctx, LLMCL_F32, N, V, 6, &b.t) == LLMCL_OK &&
        new_random(env->ctx, LLMCL_F32, N, V, 7, &ds) == LLMCL_OK &&
        llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss) == LLMCL_OK &&
        llmcl_distill_forward(env->ctx, b.s, b.t, NULL, &b.o, b.loss, ds) == LLMCL_OK &&
        download_f32(b.s, hs) == LLMCL_OK && download_f32(b.t, hs + N * V) == LLMCL_OK &&
        download_f32(ds, hg) == LLMCL_OK && download_f32(b.loss, &loss) == LLMCL_OK) {
        for (int i = 0; i < 2 * N * V; ++i)
            s[i] = hs[i];
        const ref_distill_opts ro = {0.5, 2.0, 0, -100, 1.0, 0.0};
        ref_distill(s, s + N * V, NULL, N, V, &ro, &rl, g);
        double gmax = 0.0, gerr = 0.0;
        for (int i = 0; i < N * V; ++i)
            gmax = fmax(gmax, fabs(g[i])), gerr = fmax(gerr, fabs(g[i] - hg[i]));
        ok = fabs(loss - rl) <= 1e-5 + 1e-4 * fabs(rl) && gerr <= 1e-4 * gmax;
    }
    free(hs), free(hg), free(s), free(g);
    llmcl_tensor_destroy(ds);
    bench_free(&b);
    return ok;
}

static void logits_rows(bench_env *env, int check)
{
    const int64_t n = env->small ? 256 : 8192, v = env->small ? 32000 : 128256, one = 1;
    distill_bench b = {0};
    llmcl_status st = new_random(env->ctx, LLMCL_BF16, n, v, 1, &b.s);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, LLMCL_BF16, n, v, 2, &b.t);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss);
    if (st != LLMCL_OK) {
        bench_fail(env, "distillation logits", st);
        bench_free(&b);
        return;
    }
    char shape[48], kl_shape[48];
    snprintf(shape, sizeof shape, "N%lld V%lld beta .5", (long long)n, (long long)v);
    snprintf(kl_shape, sizeof kl_shape, "N%lld V%lld beta 0", (long long)n, (long long)v);
    const double in = 2.0 * 2.0 * (double)n * (double)v, out = 2.0 * (double)n * (double)v;
    bench_add_timed(env, "distill", "fwd", "bf16", shape, in, op_loss, NULL, &b, check);
    bench_add_timed(env, "distill", "fwd+bwd", "bf16", shape, in + out, op_grad, NULL, &b, check);
    b.o.beta = 0.0f;
    bench_add_timed(env, "distill", "fwd", "bf16", kl_shape, in, op_loss, NULL, &b, check);
    bench_add_timed(env, "distill", "fwd+bwd", "bf16", kl_shape, in + out, op_grad, NULL, &b,
                    check);
    if ((st = bench_new_labels(env->ctx, 1, &n, v, 0, &b.labels)) != LLMCL_OK) {
        bench_fail(env, "distillation labels", st);
        bench_free(&b);
        return;
    }
    b.o.ce_weight = 1.0f;
    snprintf(kl_shape, sizeof kl_shape, "N%lld V%lld beta 0 +ce", (long long)n, (long long)v);
    bench_add_timed(env, "distill", "fwd+bwd", "bf16", kl_shape, in + out + 4.0 * (double)n,
                    op_grad, NULL, &b, check);
    bench_free(&b);
}

static void linear_row(bench_env *env)
{
    const int64_t n = env->small ? 256 : 8192, h = env->small ? 256 : 4096;
    const int64_t v = env->small ? 4096 : 128256, one = 1;
    const llmcl_dtype dt = llmcl_ctx_device_info(env->ctx)->has_mma ? LLMCL_BF16 : LLMCL_F32;
    distill_bench b = {.o = {.beta = 0.5f}};
    llmcl_status st = new_random(env->ctx, dt, n, h, 3, &b.h);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, dt, v, h, 4, &b.w);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, dt, n, h, 5, &b.th);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, dt, v, h, 6, &b.tw);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, LLMCL_F32, n, h, 7, &b.dh);
    if (st == LLMCL_OK)
        st = new_random(env->ctx, LLMCL_F32, v, h, 8, &b.dw);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b.loss);
    if (st != LLMCL_OK) {
        bench_fail(env, "linear distillation", st);
        bench_free(&b);
        return;
    }
    bench_row r = {.kernel = "linear_distill",
                   .direction = "fwd+bwd",
                   .bytes = 0,
                   .flops = 8.0 * (double)n * (double)v * (double)h,
                   .on_mma = dt != LLMCL_F32,
                   .check = -1};
    snprintf(r.dtype, sizeof r.dtype, "%s", llmcl_dtype_name(dt));
    /* the default scratch budget (2 GiB: 1664 tokens a chunk at V 128256), then 256 MiB */
    for (int k = 0; k < 2; ++k) {
        b.o.chunk_bytes = k ? 256ull << 20 : 0;
        snprintf(r.shape, sizeof r.shape, "N%lld H%lld V%lld b.5%s", (long long)n, (long long)h,
                 (long long)v, k ? " 256M" : "");
        bench_add_op(env, &r, op_linear, NULL, &b);
    }
    /* forward KL with the cross-entropy, as llmcl-train --teacher runs it */
    if ((st = bench_new_labels(env->ctx, 1, &n, v, 0, &b.labels)) != LLMCL_OK) {
        bench_fail(env, "linear distillation labels", st);
        bench_free(&b);
        return;
    }
    b.o = (llmcl_distill_options){.ce_weight = 1.0f};
    snprintf(r.shape, sizeof r.shape, "N%lld H%lld V%lld b0 +ce", (long long)n, (long long)h,
             (long long)v);
    bench_add_op(env, &r, op_linear, NULL, &b);
    bench_free(&b);
}

void bench_distill(bench_env *env)
{
    const int check = check_small(env);
    logits_rows(env, check);
    linear_row(env);
}
