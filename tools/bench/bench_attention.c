/*
 * bench_attention.c: llmcl-bench rows for flash attention. Forward and backward at B=4, Hq=32,
 * Hkv=8, T=4096, D=128, causal, bf16 (a smaller size on CPU devices), with TFLOP/s in
 * FlashAttention's convention (4 B Hq Tq Tk D, halved for causal; backward 2.5x the forward) and
 * peak memory; an f32 forward against a naive baseline (CLBlast SGEMM for Q.K^T, a masked
 * softmax kernel of this file, CLBlast SGEMM for P.V) at a size whose T x T scores fit in memory.
 * Outputs are checked against ref/attention_ref.c at a reduced size with the same options.
 * On GPUs, FlashAttention's sweep follows (tools/bench/yardstick_attention.py times PyTorch's
 * SDPA on the same shapes). LLMCL_BENCH_FULL=1 on a CPU device adds the T=2048, D=128 row.
 */
#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "bench.h"
#include "util/util.h"

typedef struct attn_shape {
    int B, Hq, Hkv, T, D;
    bool causal;
    llmcl_dtype dtype;
} attn_shape;

/* The tensors of one benchmark, dense [B, H, T, D]. */
typedef struct attn_state {
    attn_shape s;
    llmcl_tensor *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    llmcl_attention_opts opts;
} attn_state;

static double attn_flops(attn_shape s)
{
    const double f = 4.0 * s.B * s.Hq * (double)s.T * s.T * s.D;
    return s.causal ? f / 2 : f;
}

static void attn_state_free(attn_state *a)
{
    llmcl_tensor *all[] = {a->q, a->k, a->v, a->o, a->lse, a->dout, a->dq, a->dk, a->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        llmcl_tensor_destroy(all[i]);
    memset(a, 0, sizeof *a);
}

static llmcl_status attn_state_init(llmcl_ctx *ctx, attn_state *a, attn_shape s)
{
    memset(a, 0, sizeof *a);
    a->s = s;
    a->opts.causal = s.causal;
    const int64_t qs[4] = {s.B, s.Hq, s.T, s.D}, ks[4] = {s.B, s.Hkv, s.T, s.D};
    const int64_t ls[3] = {s.B, s.Hq, s.T};
    llmcl_status st;
    if ((st = llmcl_tensor_create(ctx, s.dtype, 4, qs, &a->q)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, ks, &a->k)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, ks, &a->v)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, qs, &a->o)) ||
        (st = llmcl_tensor_create(ctx, LLMCL_F32, 3, ls, &a->lse)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, qs, &a->dout)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, qs, &a->dq)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, ks, &a->dk)) ||
        (st = llmcl_tensor_create(ctx, s.dtype, 4, ks, &a->dv)) || (st = bench_upload_random(a->q, 1)) ||
        (st = bench_upload_random(a->k, 2)) || (st = bench_upload_random(a->v, 3)) ||
        (st = bench_upload_random(a->dout, 4)))
        attn_state_free(a);
    return st;
}

static llmcl_status op_fwd(llmcl_ctx *ctx, void *arg)
{
    attn_state *a = arg;
    return llmcl_attention_forward(ctx, a->q, a->k, a->v, &a->opts, a->o, a->lse);
}

static llmcl_status op_bwd(llmcl_ctx *ctx, void *arg)
{
    attn_state *a = arg;
    return llmcl_attention_backward(ctx, a->q, a->k, a->v, a->o, a->lse, a->dout, &a->opts, a->dq,
                                    a->dk, a->dv);
}

/* Downloads a tensor as doubles (contiguous, any float dtype). */
static double *download(const llmcl_tensor *t)
{
    const int64_t n = llmcl_tensor_numel(t);
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    const size_t es = llmcl_dtype_size(dt);
    unsigned char *h = malloc((size_t)n * es);
    double *x = malloc(sizeof(double) * (size_t)n);
    if (!h || !x || llmcl_tensor_download(t, h, (size_t)n * es) != LLMCL_OK) {
        free(h);
        free(x);
        return NULL;
    }
    for (int64_t i = 0; i < n; ++i) {
        float f;
        uint16_t b;
        if (es == 4)
            memcpy(&f, h + i * 4, 4);
        else {
            memcpy(&b, h + i * 2, 2);
            f = dt == LLMCL_BF16 ? llmcl_bf16_to_f32(b) : llmcl_f16_to_f32(b);
        }
        x[i] = f;
    }
    free(h);
    return x;
}

static bool close_all(const double *ref, const double *got, int64_t n, double atol, double rtol)
{
    for (int64_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i])))
            return false;
    return true;
}

/* Forward and backward at a reduced size with s's options against the double reference. */
static int attn_check(bench_env *env, attn_shape s)
{
    s.B = 1;
    s.Hq = s.Hq / s.Hkv * 2;
    s.Hkv = 2;
    s.T = s.T < 200 ? s.T : 200;
    attn_state a;
    if (attn_state_init(env->ctx, &a, s) != LLMCL_OK || op_fwd(env->ctx, &a) != LLMCL_OK ||
        op_bwd(env->ctx, &a) != LLMCL_OK)
        return 0;
    const attn_ref_cfg cfg = {s.B, s.Hq, s.Hkv, s.D, s.T, s.T, NULL, NULL, s.causal, -1, -1, 0, 0};
    double *in[4] = {download(a.q), download(a.k), download(a.v), download(a.dout)};
    double *got[4] = {download(a.o), download(a.dq), download(a.dk), download(a.dv)};
    const int64_t nq = attn_ref_q_numel(&cfg), nk = attn_ref_k_numel(&cfg);
    double *ref = malloc(sizeof(double) * (size_t)(3 * nq + 2 * nk + attn_ref_lse_numel(&cfg)));
    int ok = ref != NULL;
    for (int i = 0; i < 4; ++i)
        ok = ok && in[i] && got[i];
    if (ok) {
        double *o = ref, *dq = o + nq, *dk = dq + nq, *dv = dk + nk, *lse = dv + nk;
        attn_ref_forward(&cfg, in[0], in[1], in[2], o, lse);
        attn_ref_backward(&cfg, in[0], in[1], in[2], in[3], dq, dk, dv);
        const double tol = s.dtype == LLMCL_F32 ? 1e-4 : 2e-2;
        ok = close_all(o, got[0], nq, tol, tol) && close_all(dq, got[1], nq, tol, tol) &&
             close_all(dk, got[2], nk, tol, tol) && close_all(dv, got[3], nk, tol, tol);
    }
    for (int i = 0; i < 4; ++i) {
        free(in[i]);
        free(got[i]);
    }
    free(ref);
    attn_state_free(&a);
    return ok;
}

static void shape_str(char *out, size_t n, attn_shape s)
{
    snprintf(out, n, "%dx%d/%dx%dx%d%s", s.B, s.Hq, s.Hkv, s.T, s.D, s.causal ? " causal" : "");
}

/* Rows for the forward and backward of one shape. */
static void bench_shape(bench_env *env, attn_shape s, double baseline_ms)
{
    attn_state a;
    llmcl_status st = attn_state_init(env->ctx, &a, s);
    if (st != LLMCL_OK) {
        bench_fail(env, "attention setup", st);
        return;
    }
    const int check = attn_check(env, s);
    bench_row r = {.bytes = 0, .check = check};
    snprintf(r.kernel, sizeof r.kernel, "attention");
    snprintf(r.dtype, sizeof r.dtype, "%s", llmcl_dtype_name(s.dtype));
    shape_str(r.shape, sizeof r.shape, s);

    snprintf(r.direction, sizeof r.direction, "fwd");
    r.flops = attn_flops(s);
    r.baseline_ms = baseline_ms;
    r.peak_mib = bench_peak_mib(env, op_fwd, &a);
    r.ms = bench_time(env, op_fwd, &a);
    if (r.ms >= 0)
        bench_add(env, &r);

    snprintf(r.direction, sizeof r.direction, "bwd");
    r.flops = 2.5 * attn_flops(s);
    r.baseline_ms = 0;
    r.peak_mib = bench_peak_mib(env, op_bwd, &a);
    r.ms = bench_time(env, op_bwd, &a);
    if (r.ms >= 0)
        bench_add(env, &r);
    attn_state_free(&a);
}

/* ---- the naive baseline: S = Q.K^T (CLBlast), P = masked softmax(S) (below), O = P.V ---- */

static const char *const softmax_src =
    "__kernel void softmax_rows(__global float *s, int t, int causal, float scale)\n"
    "{\n"
    "    __local float red[256];\n"
    "    const int lid = get_local_id(0), n = get_local_size(0);\n"
    "    const long row = get_group_id(0);\n"
    "    const int i = (int)(row % t), hi = causal ? i + 1 : t;\n"
    "    __global float *x = s + row * t;\n"
    "    float m = -INFINITY;\n"
    "    for (int j = lid; j < hi; j += n) m = fmax(m, x[j] * scale);\n"
    "    red[lid] = m; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int w = n / 2; w > 0; w /= 2) {\n"
    "        if (lid < w) red[lid] = fmax(red[lid], red[lid + w]);\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    m = red[0]; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    float sum = 0.0f;\n"
    "    for (int j = lid; j < hi; j += n) sum += exp(x[j] * scale - m);\n"
    "    red[lid] = sum; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int w = n / 2; w > 0; w /= 2) {\n"
    "        if (lid < w) red[lid] += red[lid + w];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    const float inv = 1.0f / red[0];\n"
    "    for (int j = lid; j < t; j += n) x[j] = j < hi ? exp(x[j] * scale - m) * inv : 0.0f;\n"
    "}\n";

/* Median wall time in ms of the three baseline steps, or -1 when something fails. */
static double naive_baseline_ms(bench_env *env, attn_state *a)
{
    const attn_shape s = a->s;
    const int g = s.Hq / s.Hkv;
    cl_context cx = llmcl_ctx_cl_context(env->ctx);
    cl_device_id dev = llmcl_ctx_cl_device(env->ctx);
    cl_command_queue queue = llmcl_ctx_cl_queue(env->ctx);
    const size_t s_elems = (size_t)s.B * s.Hq * s.T * s.T;
    cl_int err;
    cl_mem sbuf = clCreateBuffer(cx, CL_MEM_READ_WRITE, s_elems * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS)
        return -1;
    const char *src = softmax_src;
    cl_program prog = clCreateProgramWithSource(cx, 1, &src, NULL, &err);
    cl_kernel kern = NULL;
    if (err == CL_SUCCESS && clBuildProgram(prog, 1, &dev, "", NULL, NULL) == CL_SUCCESS)
        kern = clCreateKernel(prog, "softmax_rows", &err);
    const float scale = 1.0f / sqrtf((float)s.D);
    const cl_int t = s.T, causal = s.causal;
    cl_mem q = llmcl_tensor_cl_mem(a->q), k = llmcl_tensor_cl_mem(a->k);
    cl_mem v = llmcl_tensor_cl_mem(a->v), o = llmcl_tensor_cl_mem(a->o);
    const size_t wg = 256, global = s_elems / (size_t)s.T * wg, qkv_rows = (size_t)g * s.T;
    double times[64];
    int n = 0, runs = env->warmup + (env->reps < 64 ? env->reps : 64);
    for (int r = 0; kern && r < runs; ++r) {
        clFinish(queue);
        const double t0 = util_now_s();
        /* One batch per (b, KV head): its g query heads are one [g T, D] matrix. */
        CLBlastStatusCode c1 = CLBlastSgemmStridedBatched(
            CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, qkv_rows, (size_t)s.T,
            (size_t)s.D, 1.0f, q, 0, (size_t)s.D, qkv_rows * s.D, k, 0, (size_t)s.D,
            (size_t)s.T * s.D, 0.0f, sbuf, 0, (size_t)s.T, qkv_rows * s.T, (size_t)s.B * s.Hkv,
            &queue, NULL);
        clSetKernelArg(kern, 0, sizeof sbuf, &sbuf);
        clSetKernelArg(kern, 1, sizeof t, &t);
        clSetKernelArg(kern, 2, sizeof causal, &causal);
        clSetKernelArg(kern, 3, sizeof scale, &scale);
        cl_int e2 = clEnqueueNDRangeKernel(queue, kern, 1, NULL, &global, &wg, 0, NULL, NULL);
        CLBlastStatusCode c3 = CLBlastSgemmStridedBatched(
            CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, qkv_rows, (size_t)s.D,
            (size_t)s.T, 1.0f, sbuf, 0, (size_t)s.T, qkv_rows * s.T, v, 0, (size_t)s.D,
            (size_t)s.T * s.D, 0.0f, o, 0, (size_t)s.D, qkv_rows * s.D, (size_t)s.B * s.Hkv,
            &queue, NULL);
        clFinish(queue);
        const double ms = 1e3 * (util_now_s() - t0);
        if (c1 != CLBlastSuccess || e2 != CL_SUCCESS || c3 != CLBlastSuccess) {
            n = 0;
            break;
        }
        if (r >= env->warmup)
            times[n++] = ms;
    }
    if (kern)
        clReleaseKernel(kern);
    if (prog)
        clReleaseProgram(prog);
    clReleaseMemObject(sbuf);
    return n ? util_median(times, (size_t)n) : -1;
}

/* The f32 forward at a size whose scores fit, with the naive baseline's time beside it. */
static void bench_baseline(bench_env *env, attn_shape s)
{
    const uint64_t limit = llmcl_ctx_device_info(env->ctx)->max_alloc_bytes / 2;
    while (s.B > 1 && (uint64_t)s.B * s.Hq * s.T * s.T * sizeof(float) > limit)
        s.B /= 2;
    while ((uint64_t)s.B * s.Hq * s.T * s.T * sizeof(float) > limit)
        s.T /= 2;
    s.dtype = LLMCL_F32;
    attn_state a;
    const llmcl_status st = attn_state_init(env->ctx, &a, s);
    if (st != LLMCL_OK) {
        bench_fail(env, "attention baseline setup", st);
        return;
    }
    const double base = naive_baseline_ms(env, &a);
    attn_state_free(&a);
    bench_shape(env, s, base > 0 ? base : 0);
}

void bench_attention(bench_env *env)
{
    attn_shape s = {4, 32, 8, 4096, 128, true, LLMCL_BF16};
    if (env->small)
        s = (attn_shape){1, 8, 2, 512, 128, true, LLMCL_BF16};
    bench_shape(env, s, 0);
    s.T = env->small ? 256 : 2048;
    bench_baseline(env, s);
    if (!env->small) {
        /* FlashAttention's sweep: 16k tokens a batch at every length, other head dims, no mask. */
        static const attn_shape sweep[] = {
            {16, 32, 8, 1024, 128, true, LLMCL_BF16}, {8, 32, 8, 2048, 128, true, LLMCL_BF16},
            {2, 32, 8, 8192, 128, true, LLMCL_BF16},  {1, 32, 8, 16384, 128, true, LLMCL_BF16},
            {4, 32, 8, 4096, 64, true, LLMCL_BF16},   {2, 16, 4, 4096, 256, true, LLMCL_BF16},
            {4, 32, 8, 4096, 128, false, LLMCL_BF16},
        };
        for (size_t i = 0; i < sizeof sweep / sizeof *sweep; ++i)
            bench_shape(env, sweep[i], 0);
    }
    const char *full = getenv("LLMCL_BENCH_FULL");
    if (env->small && full && strcmp(full, "1") == 0) {
        /* The CPU size: one timed run, no warm-up (minutes on a 2-core host). */
        const int warmup = env->warmup, reps = env->reps;
        env->warmup = 0;
        env->reps = 1;
        bench_shape(env, (attn_shape){1, 32, 8, 2048, 128, true, LLMCL_BF16}, 0);
        env->warmup = warmup;
        env->reps = reps;
    }
}
