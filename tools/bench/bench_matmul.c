/*
 * bench_matmul.c: llmcl-bench rows for llmcl_matmul: a square bf16 GEMM (8192^3), the linear
 * layers of Llama-3-8B at 8192 tokens (4096->4096, 4096->14336, 14336->4096) and those of
 * Llama-3.2-1B (2048->2048, 2048->512, 2048->8192, 8192->2048), then the stacked projections that
 * llmcl-train's presets run instead of q, k, v and gate, up apart (1B: 2048->3072 and
 * 2048->16384; 8B: 4096->6144 and 4096->28672), each as the forward y = x w^T, dx = dy w and
 * dw += dy^T x (f32, beta 1), in TFLOP/s against the device's tensor-core rate where they ran on
 * tensor cores, else its fp32 FMA rate. Then LoRA's six products of an adapter of rank 16 on a
 * 1B projection (2048 wide) and the three that a group's stacked adapters share at rank 48
 * (llmcl-train's q, k and v), which are memory-bound: their rows give GB/s too; then the forward
 * and dX products of the rank-16 adapter's projection with the adapter inside them, as llmcl-train
 * runs them (opts.a_ext, b_ext: y = [x, u] [W, B]^T, dx = [dy, du] [W; A]). CPU devices run
 * the same shapes divided by 16 (LoRA's ranks kept). Each output is checked at 256 sampled
 * elements against double dot products of the downloaded operands. tools/bench/yardstick_matmul.py
 * times PyTorch on the same shapes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct mm_bench {
    llmcl_tensor *a, *b, *c, *a2, *b2; /* a2, b2: opts.a_ext, b_ext, or NULL */
    llmcl_matmul_opts opts;
    float beta;
} mm_bench;

static llmcl_status op_matmul(llmcl_ctx *ctx, void *arg)
{
    mm_bench *m = arg;
    return llmcl_matmul(ctx, 1.0f, m->a, m->b, m->beta, m->c, &m->opts);
}

/* A tensor's values as f32 on the host (16-bit types converted). */
static float *host_f32(const llmcl_tensor *t)
{
    const int64_t n = llmcl_tensor_numel(t);
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    const size_t es = llmcl_dtype_size(dt);
    void *raw = malloc((size_t)n * es);
    float *f = malloc((size_t)n * sizeof *f);
    if (!raw || !f || llmcl_tensor_download(t, raw, (size_t)n * es) != LLMCL_OK) {
        free(raw);
        free(f);
        return NULL;
    }
    for (int64_t i = 0; i < n; ++i)
        f[i] = dt == LLMCL_F32    ? ((float *)raw)[i]
               : dt == LLMCL_BF16 ? llmcl_bf16_to_f32(((uint16_t *)raw)[i])
                                  : llmcl_f16_to_f32(((uint16_t *)raw)[i]);
    free(raw);
    return f;
}

/*
 * c (row-major [M, N], from beta 0) against sum_k op(a)[m][k] op(b)[k][n] in double at 256 sampled
 * elements, within f32 summation error plus c's rounding.
 */
static int check_sampled(const mm_bench *m, int64_t M, int64_t N, int64_t K, int64_t K2)
{
    float *a = host_f32(m->a), *b = host_f32(m->b), *c = host_f32(m->c);
    float *a2 = K2 ? host_f32(m->a2) : NULL, *b2 = K2 ? host_f32(m->b2) : NULL;
    int ok = a && b && c && (!K2 || (a2 && b2));
    const double rtol = llmcl_tensor_dtype(m->c) == LLMCL_F32 ? 1e-5 : 1e-2;
    uint64_t x = 12345;
    for (int s = 0; ok && s < 256; ++s) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t i = (int64_t)((x >> 33) % (uint64_t)M), j = (int64_t)((x >> 13) % (uint64_t)N);
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K + K2; ++k) {
            const bool ext = k >= K;
            const int64_t kk = ext ? k - K : k, ka = ext ? K2 : K;
            const float *pa = ext ? a2 : a, *pb = ext ? b2 : b;
            const double av = m->opts.trans_a ? pa[kk * M + i] : pa[i * ka + kk];
            const double bv = m->opts.trans_b ? pb[j * ka + kk] : pb[kk * N + j];
            ref += av * bv;
            mag += fabs(av * bv);
        }
        ok = fabs(c[i * N + j] - ref) <=
             1e-6 * sqrt((double)(K + K2)) * mag + rtol * fabs(ref) + 1e-6;
        if (!ok)
            fprintf(stderr, "llmcl-bench: matmul c[%lld, %lld] = %g, expected %g\n", (long long)i,
                    (long long)j, c[i * N + j], ref);
    }
    free(a);
    free(b);
    free(c);
    free(a2);
    free(b2);
    return ok;
}

/* op(a) [M, K] and op(b) [K, N] (K2 columns and rows of a2 and b2 where k2 is set) in dt. */
static llmcl_status operands(llmcl_ctx *ctx, mm_bench *m, int64_t M, int64_t N, int64_t K,
                             bool k2, llmcl_dtype dt, int trans_a, int trans_b)
{
    const int64_t as[2] = {trans_a ? K : M, trans_a ? M : K};
    const int64_t bs[2] = {trans_b ? N : K, trans_b ? K : N};
    llmcl_tensor **a = k2 ? &m->a2 : &m->a, **b = k2 ? &m->b2 : &m->b;
    llmcl_status st;
    if ((st = llmcl_tensor_create(ctx, dt, 2, as, a)) ||
        (st = llmcl_tensor_create(ctx, dt, 2, bs, b)) || (st = bench_upload_random(*a, 1 + 2 * k2)))
        return st;
    return bench_upload_random(*b, 2 + 2 * k2);
}

/* One row: c [M, N] = op(a) op(b) (+ op(a2) op(b2) of K2 where K2 > 0) with a, b in dt; c in
   cdt; beta as the row asks. by_bytes: the row also counts its bytes (a and b read, c written,
   and read where beta is not 0). */
static void bench_one(bench_env *env, const char *dir, int64_t M, int64_t N, int64_t K,
                      int64_t K2, llmcl_dtype dt, llmcl_dtype cdt, int trans_a, int trans_b,
                      float beta, bool by_bytes)
{
    llmcl_ctx *ctx = env->ctx;
    mm_bench m = {.opts = {.trans_a = trans_a, .trans_b = trans_b}};
    const int64_t cs[2] = {M, N};
    llmcl_status st = operands(ctx, &m, M, N, K, false, dt, trans_a, trans_b);
    if (st == LLMCL_OK && K2 > 0)
        st = operands(ctx, &m, M, N, K2, true, dt, trans_a, trans_b);
    m.opts.a_ext = m.a2;
    m.opts.b_ext = m.b2;
    if (st || (st = llmcl_tensor_create(ctx, cdt, 2, cs, &m.c)) || (st = op_matmul(ctx, &m))) {
        bench_fail(env, "matmul setup", st);
    } else {
        const int check = check_sampled(&m, M, N, K, K2);
        m.beta = beta;
        char shape[48];
        snprintf(shape, sizeof shape, "%lldx%lldx%lld%s%s", (long long)M, (long long)N,
                 (long long)(K + K2), trans_a ? " aT" : "", trans_b ? " bT" : "");
        const double c_bytes = (double)M * N * llmcl_dtype_size(cdt) * (beta != 0.0f ? 2 : 1);
        bench_row r = {.bytes = by_bytes
                                    ? (double)(M + N) * (K + K2) * llmcl_dtype_size(dt) + c_bytes
                                    : 0,
                       .check = check};
        snprintf(r.kernel, sizeof r.kernel, "matmul");
        snprintf(r.direction, sizeof r.direction, "%s", dir);
        snprintf(r.dtype, sizeof r.dtype, "%s", llmcl_dtype_name(dt));
        snprintf(r.shape, sizeof r.shape, "%s", shape);
        r.flops = 2.0 * M * N * (K + K2);
        r.on_mma = llmcl_ctx_device_info(ctx)->has_mma && dt != LLMCL_F32;
        r.ms = bench_time(env, op_matmul, &m);
        r.peak_mib = bench_peak_mib(env, op_matmul, &m);
        if (r.ms > 0)
            bench_add(env, &r);
    }
    llmcl_tensor_destroy(m.a);
    llmcl_tensor_destroy(m.b);
    llmcl_tensor_destroy(m.a2);
    llmcl_tensor_destroy(m.b2);
    llmcl_tensor_destroy(m.c);
}

/* LoRA's products on a projection `width` wide at rank r, over `tokens` rows (adapter_forward
   and adapter_backward in tools/llmcl-train/model.c); all six, or with `shared` only those that
   a group's stacked adapters run once: u, dA and dx. */
static void bench_lora(bench_env *env, int64_t tokens, int64_t width, int64_t r, bool shared)
{
    const llmcl_dtype bf = LLMCL_BF16, f32 = LLMCL_F32;
    bench_one(env, "lora u", tokens, r, width, 0, bf, bf, 0, 1, 0.0f, true); /* u = x A^T */
    if (!shared) {
        bench_one(env, "lora up", tokens, width, r, 0, bf, bf, 0, 1, 1.0f, true); /* y += u B^T */
        bench_one(env, "lora dB", width, r, tokens, 0, bf, f32, 1, 0, 1.0f, true); /* dy^T u */
        bench_one(env, "lora du", tokens, r, width, 0, bf, bf, 0, 0, 0.0f, true);  /* du = dy B */
    }
    bench_one(env, "lora dA", r, width, tokens, 0, bf, f32, 1, 0, 1.0f, true); /* dA += du^T x */
    bench_one(env, "lora dx", tokens, width, r, 0, bf, bf, 0, 0, 1.0f, true);  /* dx += du A */
}

/* The rank-r adapter inside its projection's forward and dX products, as llmcl-train runs them:
   y = [x, u] [W, B]^T and dx = [dy, du] [W; A] (the forward and dX rows plus up and dx above). */
static void bench_lora_inside(bench_env *env, int64_t tokens, int64_t width, int64_t r)
{
    const llmcl_dtype bf = LLMCL_BF16;
    bench_one(env, "lora fwd+up", tokens, width, width, r, bf, bf, 0, 1, 0.0f, false);
    bench_one(env, "lora dX+dx", tokens, width, width, r, bf, bf, 0, 0, 0.0f, false);
}

void bench_matmul(bench_env *env)
{
    const int64_t div = env->small ? 16 : 1, tokens = 8192 / div;
    const llmcl_dtype bf = LLMCL_BF16;
    bench_one(env, "gemm", 8192 / div, 8192 / div, 8192 / div, 0, bf, bf, 0, 0, 0.0f, false);
    static const int64_t layers[][2] = {{4096, 4096},  {4096, 14336}, {14336, 4096},
                                        {2048, 2048},  {2048, 512},   {2048, 8192},
                                        {8192, 2048},  {2048, 3072},  {2048, 16384},
                                        {4096, 6144},  {4096, 28672}};
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; ++i) {
        const int64_t in = layers[i][0] / div, out = layers[i][1] / div;
        bench_one(env, "fwd", tokens, out, in, 0, bf, bf, 0, 1, 0.0f, false); /* x w^T */
        bench_one(env, "dX", tokens, in, out, 0, bf, bf, 0, 0, 0.0f, false);  /* dy w */
        bench_one(env, "dW", out, in, tokens, 0, bf, LLMCL_F32, 1, 0, 1.0f, false); /* dy^T x */
    }
    bench_lora(env, tokens, 2048 / div, 16, false);
    bench_lora(env, tokens, 2048 / div, 48, true);
    bench_lora_inside(env, tokens, 2048 / div, 16);
}
