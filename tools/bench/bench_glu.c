/*
 * bench_glu.c: llmcl-bench rows for glu.cl. SwiGLU forward, backward and both, and GeGLU (tanh
 * form) forward and backward, on separate gate and up tensors [N, I] in bf16. The unfused baseline
 * is what an eager framework runs: the activation alone (llmcl_activation_forward/backward) plus
 * the library's elementwise llmcl_copy and llmcl_mul. Each fused kernel is checked against
 * ref/glu_ref.c at a small size first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "glu_ref.h"

typedef struct glu_bench {
    llmcl_activation act;
    llmcl_tensor *gate, *up, *out, *dout, *dgate, *dup, *tmp_a;
} glu_bench;

static llmcl_status fused_fwd(llmcl_ctx *ctx, void *arg)
{
    glu_bench *g = arg;
    return llmcl_glu_forward(ctx, g->act, g->gate, g->up, g->out);
}

static llmcl_status fused_bwd(llmcl_ctx *ctx, void *arg)
{
    glu_bench *g = arg;
    return llmcl_glu_backward(ctx, g->act, g->dout, g->gate, g->up, g->dgate, g->dup);
}

static llmcl_status fused_both(llmcl_ctx *ctx, void *arg)
{
    llmcl_status st = fused_fwd(ctx, arg);
    return st != LLMCL_OK ? st : fused_bwd(ctx, arg);
}

/* out = act(gate); out *= up */
static llmcl_status unfused_fwd(llmcl_ctx *ctx, void *arg)
{
    glu_bench *g = arg;
    llmcl_status st = llmcl_activation_forward(ctx, g->act, g->gate, g->out);
    return st != LLMCL_OK ? st : llmcl_mul(ctx, g->up, g->out);
}

/* dup = dout * act(gate); dgate = act'(gate) * (dout * up) */
static llmcl_status unfused_bwd(llmcl_ctx *ctx, void *arg)
{
    glu_bench *g = arg;
    llmcl_status st = llmcl_activation_forward(ctx, g->act, g->gate, g->dup);
    if (st == LLMCL_OK)
        st = llmcl_mul(ctx, g->dout, g->dup);
    if (st == LLMCL_OK)
        st = llmcl_copy(ctx, g->dout, g->tmp_a);
    if (st == LLMCL_OK)
        st = llmcl_mul(ctx, g->up, g->tmp_a);
    if (st == LLMCL_OK)
        st = llmcl_activation_backward(ctx, g->act, g->gate, g->tmp_a, g->dgate);
    return st;
}

static llmcl_status unfused_both(llmcl_ctx *ctx, void *arg)
{
    llmcl_status st = unfused_fwd(ctx, arg);
    return st != LLMCL_OK ? st : unfused_bwd(ctx, arg);
}

static void glu_bench_free(glu_bench *g)
{
    llmcl_tensor *ts[] = {g->gate, g->up, g->out, g->dout, g->dgate, g->dup, g->tmp_a};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; ++i)
        llmcl_tensor_destroy(ts[i]);
}

/* Tensors of [n, cols] in dtype; inputs hold bounded pseudo-random values. */
static bool glu_bench_init(bench_env *env, glu_bench *g, llmcl_activation act, llmcl_dtype dt,
                           int64_t n, int64_t cols, double **host)
{
    const int64_t shape[2] = {n, cols};
    const size_t ne = (size_t)(n * cols), es = llmcl_dtype_size(dt);
    *g = (glu_bench){.act = act};
    llmcl_tensor **all[] = {&g->gate, &g->up, &g->out, &g->dout, &g->dgate, &g->dup, &g->tmp_a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
        llmcl_status st = llmcl_tensor_create(env->ctx, dt, 2, shape, all[i]);
        if (st != LLMCL_OK)
            return bench_fail(env, "glu: tensor_create", st);
    }
    uint16_t *buf = malloc(ne * es);
    if (!buf)
        return bench_fail(env, "glu: host buffer", LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    llmcl_tensor *inputs[3] = {g->gate, g->up, g->dout};
    for (int t = 0; t < 3; ++t) {
        uint32_t s = 0x9e3779b9u * (uint32_t)(t + 1);
        for (size_t i = 0; i < ne; ++i) {
            s = s * 1664525u + 1013904223u;
            const float v = ((float)(s >> 8) / 16777216.0f - 0.5f) * (t == 0 ? 8.0f : 2.0f);
            if (host)
                host[t][i] = dt == LLMCL_BF16 ? llmcl_bf16_to_f32(llmcl_f32_to_bf16(v)) : v;
            if (dt == LLMCL_BF16)
                buf[i] = llmcl_f32_to_bf16(v);
            else
                ((float *)buf)[i] = v;
        }
        llmcl_status st = llmcl_tensor_upload(inputs[t], buf, ne * es);
        if (st != LLMCL_OK) {
            free(buf);
            return bench_fail(env, "glu: upload", st);
        }
    }
    free(buf);
    return true;
}

/* Downloads a bf16 tensor as doubles. */
static bool download_bf16(bench_env *env, const llmcl_tensor *t, double *out, size_t n)
{
    uint16_t *buf = malloc(n * sizeof(uint16_t));
    llmcl_status st =
        buf ? llmcl_tensor_download(t, buf, n * sizeof(uint16_t)) : LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; st == LLMCL_OK && i < n; ++i)
        out[i] = llmcl_bf16_to_f32(buf[i]);
    free(buf);
    return st == LLMCL_OK || bench_fail(env, "glu: download", st);
}

/* Counts outputs further than bf16 rounding plus f32 math from the reference. */
static size_t count_bad(const double *ref, const double *got, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - ref[i]) <= 1e-3 + 8e-3 * fabs(ref[i])))
            ++bad;
    return bad;
}

/* Fused forward and backward at a small size against the reference: 1 matched, 0 not. */
static int glu_check(bench_env *env, llmcl_activation act)
{
    const int64_t n = 67, cols = 1000;
    const size_t ne = (size_t)(n * cols);
    double *h = calloc(8 * ne, sizeof(double));
    double *host[3] = {h, h + ne, h + 2 * ne}, *ref = h + 3 * ne, *ref2 = h + 4 * ne;
    double *got = h + 5 * ne, *got2 = h + 6 * ne;
    glu_bench g;
    int ok = 0;
    if (h && glu_bench_init(env, &g, act, LLMCL_BF16, n, cols, host)) {
        bool fine = fused_fwd(env->ctx, &g) == LLMCL_OK && download_bf16(env, g.out, got, ne);
        glu_ref_forward(act, host[0], host[1], ref, ne);
        fine = fine && count_bad(ref, got, ne) == 0;
        fine = fine && fused_bwd(env->ctx, &g) == LLMCL_OK &&
               download_bf16(env, g.dgate, got, ne) && download_bf16(env, g.dup, got2, ne);
        glu_ref_backward(act, host[2], host[0], host[1], ref, ref2, ne);
        ok = fine && count_bad(ref, got, ne) == 0 && count_bad(ref2, got2, ne) == 0;
        glu_bench_free(&g);
    }
    free(h);
    return ok;
}

void bench_glu(bench_env *env)
{
    const int64_t n = env->small ? 256 : 8192, cols = env->small ? 1408 : 14336;
    const double e = (double)n * (double)cols * 2.0; /* bytes of one bf16 [N, I] tensor */
    char shape[48];
    snprintf(shape, sizeof shape, "N%lld I%lld", (long long)n, (long long)cols);

    static const struct {
        const char *name;
        llmcl_activation act;
    } kinds[] = {{"swiglu", LLMCL_ACT_SILU}, {"geglu(tanh)", LLMCL_ACT_GELU_TANH}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k) {
        const int check = glu_check(env, kinds[k].act);
        glu_bench g;
        if (!glu_bench_init(env, &g, kinds[k].act, LLMCL_BF16, n, cols, NULL))
            return;
        /* bytes: forward reads gate, up, writes out; backward reads dout, gate, up, writes two */
        const char *name = kinds[k].name;
        bench_add_timed(env, name, "fwd", "bf16", shape, 3 * e, fused_fwd, unfused_fwd, &g, check);
        bench_add_timed(env, name, "bwd", "bf16", shape, 5 * e, fused_bwd, unfused_bwd, &g, check);
        if (kinds[k].act == LLMCL_ACT_SILU)
            bench_add_timed(env, name, "fwd+bwd", "bf16", shape, 8 * e, fused_both, unfused_both,
                            &g, check);
        glu_bench_free(&g);
    }
}
