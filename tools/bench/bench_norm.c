/*
 * bench_norm.c: llmcl-bench rows for the norm family (RMSNorm, residual + RMSNorm, LayerNorm;
 * forward, backward, and RMSNorm forward + backward) in bf16 at the N = 8192 x H = 4096.
 *
 * Each row's baseline is the same computation unfused, one memory pass per step, as a framework
 * without fusion runs it: the library's copy, axpy and mul (with stride-0 views broadcasting w and
 * b over rows) plus the steps the library has no kernel for (row reductions, row-broadcast scales,
 * column sums), written below as plain OpenCL C and built on the context's own device. Outputs are
 * checked against ref/norm_ref.c on the first rows.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "norm_ref.h"

/* The unfused steps; T is the storage type, one work-item per element or a work-group per row. */
static const char *baseline_src =
    "#ifdef BF16\n"
    "typedef ushort T;\n"
    "float LD(const __global T *p, long i) { return as_float((uint)p[i] << 16); }\n"
    "void ST(__global T *p, long i, float f) { uint u = as_uint(f);\n"
    "  p[i] = (T)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
    "#else\n"
    "typedef float T;\n"
    "float LD(const __global T *p, long i) { return p[i]; }\n"
    "void ST(__global T *p, long i, float f) { p[i] = f; }\n"
    "#endif\n"
    "#define WG 256\n"
    "float row_reduce(float s, __local float *sc) {\n"
    "  const int l = get_local_id(0); sc[l] = s; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  for (int k = WG / 2; k > 0; k >>= 1) { if (l < k) sc[l] += sc[l + k];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE); }\n"
    "  return sc[0]; }\n"
    /* out[row] = sum(a * b) * scale (b_is_one: sum(a)), or rsqrt of that + eps with rsq. */
    "__kernel void bl_row_dot(const __global T *a, const __global T *b, int b_is_one,\n"
    "    __global float *out, int H, float scale, int rsq, float eps) {\n"
    "  __local float sc[WG]; const long row = get_group_id(1); float s = 0.0f;\n"
    "  for (int i = get_local_id(0); i < H; i += WG)\n"
    "    s += LD(a, row * H + i) * (b_is_one ? 1.0f : LD(b, row * H + i));\n"
    "  s = row_reduce(s, sc) * scale;\n"
    "  if (get_local_id(0) == 0) out[row] = rsq ? rsqrt(s + eps) : s; }\n"
    /* rstd[row] of (x - mean[row]). */
    "__kernel void bl_row_var_rstd(const __global T *x, const __global float *mean,\n"
    "    __global float *rstd, int H, float eps) {\n"
    "  __local float sc[WG]; const long row = get_group_id(1); float s = 0.0f;\n"
    "  for (int i = get_local_id(0); i < H; i += WG) {\n"
    "    const float d = LD(x, row * H + i) - mean[row]; s += d * d; }\n"
    "  s = row_reduce(s, sc);\n"
    "  if (get_local_id(0) == 0) rstd[row] = rsqrt(s / H + eps); }\n"
    /* y = (x - mean[row]) * s[row], mean optional. */
    "__kernel void bl_row_scale(const __global T *x, const __global float *mean, int centered,\n"
    "    const __global float *s, __global T *y, long n, int H) {\n"
    "  const long i = get_global_id(0); if (i >= n) return; const long row = i / H;\n"
    "  ST(y, i, (LD(x, i) - (centered ? mean[row] : 0.0f)) * s[row]); }\n"
    /* RMSNorm dx from m = dy * w and dot = sum(m * x). */
    "__kernel void bl_rms_dx(const __global T *m, const __global T *x, const __global float *rstd,\n"
    "    const __global float *dot, __global T *dx, long n, int H) {\n"
    "  const long i = get_global_id(0); if (i >= n) return; const long row = i / H;\n"
    "  const float rs = rstd[row];\n"
    "  ST(dx, i, rs * (LD(m, i) - LD(x, i) * rs * rs * dot[row] / H)); }\n"
    /* LayerNorm dx from g = dy * w, xh and the row means of g and g * xh. */
    "__kernel void bl_ln_dx(const __global T *g, const __global T *xh, const __global float *rstd,\n"
    "    const __global float *m1, const __global float *m2, __global T *dx, long n, int H) {\n"
    "  const long i = get_global_id(0); if (i >= n) return; const long row = i / H;\n"
    "  ST(dx, i, rstd[row] * (LD(g, i) - m1[row] - LD(xh, i) * m2[row])); }\n"
    /* out[c] = sum over rows of a[row, c]. */
    "__kernel void bl_col_sum(const __global T *a, __global T *out, long N, int H) {\n"
    "  const int c = get_global_id(0); if (c >= H) return; float s = 0.0f;\n"
    "  for (long r = 0; r < N; ++r) s += LD(a, r * H + c);\n"
    "  ST(out, c, s); }\n";

enum { K_DOT, K_VAR, K_SCALE, K_RMS_DX, K_LN_DX, K_COL, K_COUNT };

typedef struct nb {
    bench_env *env;
    int64_t N, H;
    llmcl_tensor *x, *res, *r, *y, *w, *b, *rstd, *mean, *dy, *dr, *dx, *dw, *db;
    llmcl_tensor *wb, *bb;   /* w and b broadcast over rows (stride 0) */
    llmcl_tensor *m, *t;     /* baseline temporaries [N, H] */
    llmcl_tensor *s1, *s2;   /* baseline per-row f32 */
    cl_program prog;
    cl_kernel k[K_COUNT];
    double raw_ms; /* baseline kernels' own time in the current run */
    cl_int raw_err;
} nb;

/* ---- the fused ops ---- */

static const llmcl_rmsnorm_options rms_opt = {.eps = 1e-6f, .casting = LLMCL_RMSNORM_CAST_LLAMA};

static llmcl_status rms_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_rmsnorm_forward(ctx, s->x, s->w, s->y, s->rstd, &rms_opt);
}

static llmcl_status rms_bwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_rmsnorm_backward(ctx, s->dy, s->x, s->w, s->rstd, s->dx, s->dw, &rms_opt);
}

static llmcl_status rms_fwd_bwd(llmcl_ctx *ctx, void *arg)
{
    llmcl_status st = rms_fwd(ctx, arg);
    return st == LLMCL_OK ? rms_bwd(ctx, arg) : st;
}

static llmcl_status res_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_residual_rmsnorm_forward(ctx, s->x, s->res, s->w, s->r, s->y, s->rstd, &rms_opt);
}

static llmcl_status res_bwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_residual_rmsnorm_backward(ctx, s->dy, s->dr, s->r, s->w, s->rstd, s->dx, s->dw,
                                           &rms_opt);
}

static llmcl_status ln_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_layernorm_forward(ctx, s->x, s->w, s->b, s->y, s->mean, s->rstd, NULL);
}

static llmcl_status ln_bwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    return llmcl_layernorm_backward(ctx, s->dy, s->x, s->w, s->mean, s->rstd, s->dx, s->dw, s->db);
}

/* ---- the unfused baselines ---- */

/* Enqueues one baseline kernel with the given arguments and adds its profiled time. */
static void raw(nb *s, int kid, size_t n_elems_or_rows, bool per_row, int nargs, ...)
{
    if (s->raw_err != CL_SUCCESS)
        return;
    cl_kernel k = s->k[kid];
    va_list ap;
    va_start(ap, nargs);
    for (int i = 0; i < nargs; ++i) {
        const size_t size = va_arg(ap, size_t);
        const void *v = va_arg(ap, const void *);
        if (s->raw_err == CL_SUCCESS)
            s->raw_err = clSetKernelArg(k, (cl_uint)i, size, v);
    }
    va_end(ap);
    if (s->raw_err != CL_SUCCESS)
        return;
    cl_command_queue q = llmcl_ctx_cl_queue(s->env->ctx);
    cl_event ev;
    if (per_row) {
        const size_t local[2] = {256, 1}, global[2] = {256, n_elems_or_rows};
        s->raw_err = clEnqueueNDRangeKernel(q, k, 2, NULL, global, local, 0, NULL, &ev);
    } else {
        const size_t global = (n_elems_or_rows + 255) / 256 * 256;
        s->raw_err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &ev);
    }
    if (s->raw_err != CL_SUCCESS)
        return;
    cl_ulong t0 = 0, t1 = 0;
    s->raw_err = clWaitForEvents(1, &ev);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    clReleaseEvent(ev);
    s->raw_ms += (double)(t1 - t0) * 1e-6;
}

#define MEM(t) sizeof(cl_mem), &(cl_mem){llmcl_tensor_cl_mem(t)}
#define INT(v) sizeof(cl_int), &(cl_int){(v)}
#define LONG(v) sizeof(cl_long), &(cl_long){(v)}
#define FLT(v) sizeof(cl_float), &(cl_float){(v)}

static void bl_rms_fwd_on(nb *s, const llmcl_tensor *x)
{
    const int H = (int)s->H;
    raw(s, K_DOT, (size_t)s->N, true, 8, MEM(x), MEM(x), INT(0), MEM(s->s1), INT(H),
        FLT(1.0f / (float)H), INT(1), FLT(1e-6f));
    raw(s, K_SCALE, (size_t)(s->N * s->H), false, 7, MEM(x), MEM(s->s1), INT(0), MEM(s->s1),
        MEM(s->y), LONG(s->N * s->H), INT(H));
}

static void bl_rms_bwd_on(nb *s, const llmcl_tensor *x)
{
    const int H = (int)s->H;
    const long n = (long)(s->N * s->H);
    raw(s, K_DOT, (size_t)s->N, true, 8, MEM(s->m), MEM(x), INT(0), MEM(s->s2), INT(H), FLT(1.0f),
        INT(0), FLT(0.0f));
    raw(s, K_RMS_DX, (size_t)n, false, 7, MEM(s->m), MEM(x), MEM(s->rstd), MEM(s->s2), MEM(s->dx),
        LONG(n), INT(H));
    raw(s, K_SCALE, (size_t)n, false, 7, MEM(x), MEM(s->rstd), INT(0), MEM(s->rstd), MEM(s->t),
        LONG(n), INT(H));
}

static llmcl_status bl_rms_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    bl_rms_fwd_on(s, s->x);
    return llmcl_mul(ctx, s->wb, s->y);
}

/* m = dy * w; dx from m; dw = column sums of dy * x * rstd. */
static llmcl_status bl_rms_bwd_core(llmcl_ctx *ctx, nb *s, const llmcl_tensor *x)
{
    llmcl_status st = llmcl_copy(ctx, s->dy, s->m);
    if (st == LLMCL_OK)
        st = llmcl_mul(ctx, s->wb, s->m);
    if (st != LLMCL_OK)
        return st;
    bl_rms_bwd_on(s, x);
    st = llmcl_mul(ctx, s->dy, s->t);
    raw(s, K_COL, (size_t)s->H, false, 4, MEM(s->t), MEM(s->dw), LONG(s->N), INT((int)s->H));
    return st;
}

static llmcl_status bl_rms_bwd(llmcl_ctx *ctx, void *arg)
{
    return bl_rms_bwd_core(ctx, arg, ((nb *)arg)->x);
}

static llmcl_status bl_rms_fwd_bwd(llmcl_ctx *ctx, void *arg)
{
    llmcl_status st = bl_rms_fwd(ctx, arg);
    return st == LLMCL_OK ? bl_rms_bwd(ctx, arg) : st;
}

static llmcl_status bl_res_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    llmcl_status st = llmcl_copy(ctx, s->x, s->r);
    if (st == LLMCL_OK)
        st = llmcl_axpy(ctx, 1.0f, s->res, s->r);
    if (st != LLMCL_OK)
        return st;
    bl_rms_fwd_on(s, s->r);
    return llmcl_mul(ctx, s->wb, s->y);
}

static llmcl_status bl_res_bwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    llmcl_status st = bl_rms_bwd_core(ctx, s, s->r);
    return st == LLMCL_OK ? llmcl_axpy(ctx, 1.0f, s->dr, s->dx) : st;
}

static llmcl_status bl_ln_fwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    const int H = (int)s->H;
    const long n = (long)(s->N * s->H);
    raw(s, K_DOT, (size_t)s->N, true, 8, MEM(s->x), MEM(s->x), INT(1), MEM(s->mean), INT(H),
        FLT(1.0f / (float)H), INT(0), FLT(0.0f));
    raw(s, K_VAR, (size_t)s->N, true, 5, MEM(s->x), MEM(s->mean), MEM(s->rstd), INT(H),
        FLT(1e-5f));
    raw(s, K_SCALE, (size_t)n, false, 7, MEM(s->x), MEM(s->mean), INT(1), MEM(s->rstd), MEM(s->y),
        LONG(n), INT(H));
    llmcl_status st = llmcl_mul(ctx, s->wb, s->y);
    return st == LLMCL_OK ? llmcl_axpy(ctx, 1.0f, s->bb, s->y) : st;
}

static llmcl_status bl_ln_bwd(llmcl_ctx *ctx, void *arg)
{
    nb *s = arg;
    const int H = (int)s->H;
    const long n = (long)(s->N * s->H);
    raw(s, K_SCALE, (size_t)n, false, 7, MEM(s->x), MEM(s->mean), INT(1), MEM(s->rstd), MEM(s->t),
        LONG(n), INT(H));
    llmcl_status st = llmcl_copy(ctx, s->dy, s->m);
    if (st == LLMCL_OK)
        st = llmcl_mul(ctx, s->wb, s->m);
    if (st != LLMCL_OK)
        return st;
    raw(s, K_DOT, (size_t)s->N, true, 8, MEM(s->m), MEM(s->m), INT(1), MEM(s->s1), INT(H),
        FLT(1.0f / (float)H), INT(0), FLT(0.0f));
    raw(s, K_DOT, (size_t)s->N, true, 8, MEM(s->m), MEM(s->t), INT(0), MEM(s->s2), INT(H),
        FLT(1.0f / (float)H), INT(0), FLT(0.0f));
    raw(s, K_LN_DX, (size_t)n, false, 8, MEM(s->m), MEM(s->t), MEM(s->rstd), MEM(s->s1),
        MEM(s->s2), MEM(s->dx), LONG(n), INT(H));
    raw(s, K_COL, (size_t)s->H, false, 4, MEM(s->dy), MEM(s->db), LONG(s->N), INT(H));
    st = llmcl_mul(ctx, s->dy, s->t);
    raw(s, K_COL, (size_t)s->H, false, 4, MEM(s->t), MEM(s->dw), LONG(s->N), INT(H));
    return st;
}

/* Median time of a baseline: the library kernels' profiled time plus the raw kernels' own. */
static double time_baseline(nb *s, bench_op op)
{
    bench_env *env = s->env;
    double times[64];
    const int reps = env->reps < 64 ? env->reps : 64;
    for (int i = -env->warmup; i < reps; ++i) {
        llmcl_profile p;
        s->raw_ms = 0.0;
        if (llmcl_profile_begin(env->ctx) != LLMCL_OK)
            return -1;
        const llmcl_status st = op(env->ctx, s);
        if (llmcl_profile_end(env->ctx, &p) != LLMCL_OK || st != LLMCL_OK ||
            s->raw_err != CL_SUCCESS) {
            fprintf(stderr, "llmcl-bench: norm baseline failed (OpenCL %d): %s\n", s->raw_err,
                    llmcl_last_error(env->ctx));
            return -1;
        }
        if (i >= 0)
            times[i] = p.kernel_ms + s->raw_ms;
    }
    for (int i = 1; i < reps; ++i) /* insertion sort: a handful of values */
        for (int j = i; j > 0 && times[j] < times[j - 1]; --j) {
            const double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    return times[reps / 2];
}

/* ---- setup and checks ---- */

static llmcl_status upload_f32(bench_env *env, llmcl_tensor *t, const float *v)
{
    const int64_t n = llmcl_tensor_numel(t);
    llmcl_tensor *tmp = NULL;
    llmcl_status st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &n, &tmp);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(tmp, v, (size_t)n * sizeof(float));
    llmcl_tensor *flat = NULL;
    if (st == LLMCL_OK)
        st = llmcl_tensor_view(t, 1, &n, NULL, 0, &flat);
    if (st == LLMCL_OK)
        st = llmcl_cast(env->ctx, tmp, flat);
    llmcl_tensor_destroy(flat);
    llmcl_tensor_destroy(tmp);
    return st;
}

/* The first n values of t (any float dtype) as doubles. */
static double *download_head(bench_env *env, const llmcl_tensor *t, int64_t n)
{
    llmcl_tensor *head = NULL, *f = NULL;
    float *h = malloc((size_t)n * sizeof *h);
    double *out = malloc((size_t)n * sizeof *out);
    llmcl_status st = h && out ? LLMCL_OK : LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    if (st == LLMCL_OK)
        st = llmcl_tensor_view(t, 1, &n, NULL, 0, &head);
    if (st == LLMCL_OK)
        st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &n, &f);
    if (st == LLMCL_OK)
        st = llmcl_cast(env->ctx, head, f);
    if (st == LLMCL_OK)
        st = llmcl_tensor_download(f, h, (size_t)n * sizeof(float));
    for (int64_t i = 0; st == LLMCL_OK && i < n; ++i)
        out[i] = h[i];
    llmcl_tensor_destroy(head);
    llmcl_tensor_destroy(f);
    free(h);
    if (st != LLMCL_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static bool close_all(const double *ref, const double *got, int64_t n, double atol, double rtol)
{
    if (!got)
        return false;
    for (int64_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i])))
            return false;
    return true;
}

/* Host copies of the first rows of the inputs, rounded to bf16 as the device holds them. */
typedef struct host_in {
    int64_t n, H;
    double *x, *res, *w, *b, *dy, *dr;
} host_in;

/* Runs op on row views of the first rows and compares outputs with the reference. */
static int check_family(nb *s, const host_in *h, const char *family)
{
    const int64_t n = h->n, H = h->H, nH = n * H;
    const int64_t shape[2] = {n, H};
    nb v = *s;
    llmcl_tensor **views[] = {&v.x, &v.res, &v.r, &v.y, &v.dy, &v.dr, &v.dx, &v.rstd, &v.mean};
    llmcl_status st = LLMCL_OK;
    for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i) {
        const bool stat = i >= 7;
        llmcl_tensor *base = *views[i];
        *views[i] = NULL;
        if (st == LLMCL_OK)
            st = llmcl_tensor_view(base, stat ? 1 : 2, stat ? &n : shape, NULL, 0, views[i]);
    }
    int ok = 0;
    double *ry = malloc((size_t)nH * sizeof(double)), *rr = malloc((size_t)nH * sizeof(double));
    double *rdx = malloc((size_t)nH * sizeof(double)), *rdw = malloc((size_t)H * sizeof(double));
    double *rdb = malloc((size_t)H * sizeof(double)), *rmu = malloc((size_t)n * sizeof(double));
    double *rrs = malloc((size_t)n * sizeof(double));
    const double at = 3e-2, rt = 2e-2, atw = 3e-2 * sqrt((double)n);
    if (st == LLMCL_OK && ry && rr && rdx && rdw && rdb && rmu && rrs) {
        if (strcmp(family, "rmsnorm") == 0 && rms_fwd_bwd(s->env->ctx, &v) == LLMCL_OK) {
            norm_ref_rmsnorm_fwd(h->x, NULL, NULL, h->w, ry, rrs, n, H, 1e-6, 0.0, 1, LLMCL_BF16);
            norm_ref_rmsnorm_bwd(h->dy, NULL, h->x, h->w, rrs, rdx, rdw, n, H, 0.0, 1, LLMCL_BF16);
        } else if (strcmp(family, "residual") == 0 && res_fwd(s->env->ctx, &v) == LLMCL_OK &&
                   res_bwd(s->env->ctx, &v) == LLMCL_OK) {
            norm_ref_rmsnorm_fwd(h->x, h->res, rr, h->w, ry, rrs, n, H, 1e-6, 0.0, 1, LLMCL_BF16);
            norm_ref_rmsnorm_bwd(h->dy, h->dr, rr, h->w, rrs, rdx, rdw, n, H, 0.0, 1, LLMCL_BF16);
        } else if (strcmp(family, "layernorm") == 0 && ln_fwd(s->env->ctx, &v) == LLMCL_OK &&
                   ln_bwd(s->env->ctx, &v) == LLMCL_OK) {
            norm_ref_layernorm_fwd(h->x, h->w, h->b, ry, rmu, rrs, n, H, 1e-5);
            norm_ref_layernorm_bwd(h->dy, h->x, h->w, rmu, rrs, rdx, rdw, rdb, n, H);
        } else {
            st = LLMCL_ERROR_INVALID_ARGUMENT;
        }
    }
    if (st == LLMCL_OK) {
        double *y = download_head(s->env, v.y, nH), *dx = download_head(s->env, v.dx, nH);
        double *dw = download_head(s->env, s->dw, H);
        ok = close_all(ry, y, nH, at, rt) && close_all(rdx, dx, nH, at, rt) &&
             close_all(rdw, dw, H, atw, rt);
        if (ok && strcmp(family, "residual") == 0) {
            double *r = download_head(s->env, v.r, nH);
            ok = close_all(rr, r, nH, at, rt);
            free(r);
        }
        if (ok && strcmp(family, "layernorm") == 0) {
            double *db = download_head(s->env, s->db, H);
            ok = close_all(rdb, db, H, atw, rt);
            free(db);
        }
        free(y), free(dx), free(dw);
    }
    for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i)
        llmcl_tensor_destroy(*views[i]);
    free(ry), free(rr), free(rdx), free(rdw), free(rdb), free(rmu), free(rrs);
    return ok;
}

static bool build_baselines(nb *s)
{
    cl_context c = llmcl_ctx_cl_context(s->env->ctx);
    cl_device_id d = llmcl_ctx_cl_device(s->env->ctx);
    cl_int err;
    s->prog = clCreateProgramWithSource(c, 1, &baseline_src, NULL, &err);
    if (err == CL_SUCCESS)
        err = clBuildProgram(s->prog, 1, &d, "-DBF16", NULL, NULL);
    static const char *names[K_COUNT] = {"bl_row_dot", "bl_row_var_rstd", "bl_row_scale",
                                         "bl_rms_dx",  "bl_ln_dx",        "bl_col_sum"};
    for (int i = 0; i < K_COUNT && err == CL_SUCCESS; ++i)
        s->k[i] = clCreateKernel(s->prog, names[i], &err);
    if (err != CL_SUCCESS)
        fprintf(stderr, "llmcl-bench: norm baselines failed to build (OpenCL %d)\n", err);
    return err == CL_SUCCESS;
}

static void add_row(nb *s, const char *kernel, const char *dir, bench_op op, bench_op base,
                    double bytes, int check)
{
    bench_row r = {.check = check};
    snprintf(r.kernel, sizeof r.kernel, "%s", kernel);
    snprintf(r.direction, sizeof r.direction, "%s", dir);
    snprintf(r.dtype, sizeof r.dtype, "bf16");
    snprintf(r.shape, sizeof r.shape, "%lldx%lld", (long long)s->N, (long long)s->H);
    r.ms = bench_time(s->env, op, s);
    r.bytes = bytes;
    r.peak_mib = bench_peak_mib(s->env, op, s);
    r.baseline_ms = base ? time_baseline(s, base) : 0.0;
    if (r.ms > 0)
        bench_add(s->env, &r);
}

/* The bench's tensors by kind: bf16 activations [N, H], bf16 weights [H] and f32 row
   statistics [N]. */
typedef struct nb_lists {
    llmcl_tensor **acts[9], **vecs[4], **stats[4];
} nb_lists;

static nb_lists tensor_lists(nb *s)
{
    return (nb_lists){
        .acts = {&s->x, &s->res, &s->r, &s->y, &s->dy, &s->dr, &s->dx, &s->m, &s->t},
        .vecs = {&s->w, &s->b, &s->dw, &s->db},
        .stats = {&s->rstd, &s->mean, &s->s1, &s->s2},
    };
}

/* Every tensor, and the weights and biases viewed as [N, H] rows of stride 0. */
static llmcl_status create_tensors(nb *s)
{
    const nb_lists l = tensor_lists(s);
    const int64_t shape[2] = {s->N, s->H}, bstrides[2] = {0, 1};
    llmcl_status st = LLMCL_OK;
    for (size_t i = 0; i < 9 && st == LLMCL_OK; ++i)
        st = llmcl_tensor_create(s->env->ctx, LLMCL_BF16, 2, shape, l.acts[i]);
    for (size_t i = 0; i < 4 && st == LLMCL_OK; ++i)
        st = llmcl_tensor_create(s->env->ctx, LLMCL_BF16, 1, &s->H, l.vecs[i]);
    for (size_t i = 0; i < 4 && st == LLMCL_OK; ++i)
        st = llmcl_tensor_create(s->env->ctx, LLMCL_F32, 1, &s->N, l.stats[i]);
    if (st == LLMCL_OK)
        st = llmcl_tensor_view(s->w, 2, shape, bstrides, 0, &s->wb);
    if (st == LLMCL_OK)
        st = llmcl_tensor_view(s->b, 2, shape, bstrides, 0, &s->bb);
    return st;
}

/* Inputs: normal-ish values from a fixed-seed LCG, uploaded; the reference sees the first h->n
   rows rounded to bf16. hv holds N x H floats. */
static llmcl_status make_inputs(nb *s, host_in *h, float *hv)
{
    const int64_t H = s->H, NH = s->N * H, hn = h->n * H;
    double **hosts[] = {&h->x, &h->res, &h->dy, &h->dr};
    llmcl_tensor *dev[] = {s->x, s->res, s->dy, s->dr};
    uint64_t seed = 12345;
    llmcl_status st = LLMCL_OK;
    for (int k = 0; k < 4 && st == LLMCL_OK; ++k) {
        for (int64_t i = 0; i < NH; ++i) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            hv[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        }
        st = upload_f32(s->env, dev[k], hv);
        *hosts[k] = malloc((size_t)hn * sizeof(double));
        for (int64_t i = 0; *hosts[k] && i < hn; ++i)
            (*hosts[k])[i] = norm_ref_round(LLMCL_BF16, hv[i]);
    }
    double **hw[] = {&h->w, &h->b};
    llmcl_tensor *dw[] = {s->w, s->b};
    for (int k = 0; k < 2 && st == LLMCL_OK; ++k) {
        for (int64_t i = 0; i < H; ++i)
            hv[i] = k == 0 ? 0.5f + (float)((i * 37) % 101) / 100.0f : (float)((i * 13) % 7) / 7.0f;
        st = upload_f32(s->env, dw[k], hv);
        *hw[k] = malloc((size_t)H * sizeof(double));
        for (int64_t i = 0; *hw[k] && i < H; ++i)
            (*hw[k])[i] = norm_ref_round(LLMCL_BF16, hv[i]);
    }
    return st;
}

/* Each family checked against the reference, then timed beside its baseline: a row an op. */
static void measure(nb *s, const host_in *h)
{
    const double e = 2.0, vec = (double)s->H * e, rowf = (double)s->N * 4.0;
    const double act = (double)s->N * s->H * e;
    const int c_rms = check_family(s, h, "rmsnorm");
    const int c_res = check_family(s, h, "residual");
    const int c_ln = check_family(s, h, "layernorm");
    const double rf = 2 * act + vec + rowf, rb = 3 * act + 2 * vec + rowf;
    add_row(s, "rmsnorm", "fwd", rms_fwd, bl_rms_fwd, rf, c_rms);
    add_row(s, "rmsnorm", "bwd", rms_bwd, bl_rms_bwd, rb, c_rms);
    add_row(s, "rmsnorm", "fwd+bwd", rms_fwd_bwd, bl_rms_fwd_bwd, rf + rb, c_rms);
    add_row(s, "residual_rmsnorm", "fwd", res_fwd, bl_res_fwd, 4 * act + vec + rowf, c_res);
    add_row(s, "residual_rmsnorm", "bwd", res_bwd, bl_res_bwd, 4 * act + 2 * vec + rowf, c_res);
    add_row(s, "layernorm", "fwd", ln_fwd, bl_ln_fwd, 2 * act + 2 * vec + 2 * rowf, c_ln);
    add_row(s, "layernorm", "bwd", ln_bwd, bl_ln_bwd, 3 * act + 3 * vec + 2 * rowf, c_ln);
}

static void release(nb *s, host_in *h)
{
    const nb_lists l = tensor_lists(s);
    for (int i = 0; i < K_COUNT; ++i)
        if (s->k[i])
            clReleaseKernel(s->k[i]);
    if (s->prog)
        clReleaseProgram(s->prog);
    llmcl_tensor_destroy(s->wb);
    llmcl_tensor_destroy(s->bb);
    for (size_t i = 0; i < 9; ++i)
        llmcl_tensor_destroy(*l.acts[i]);
    for (size_t i = 0; i < 4; ++i) {
        llmcl_tensor_destroy(*l.vecs[i]);
        llmcl_tensor_destroy(*l.stats[i]);
    }
    free(h->x), free(h->res), free(h->dy), free(h->dr), free(h->w), free(h->b);
}

void bench_norm(bench_env *env)
{
    nb s = {.env = env, .N = env->small ? 256 : 8192, .H = env->small ? 1024 : 4096};
    host_in h = {.n = env->small ? 64 : 128, .H = s.H};
    llmcl_status st = create_tensors(&s);
    float *hv = malloc((size_t)(s.N * s.H) * sizeof *hv);
    const bool staged = hv != NULL;
    if (st == LLMCL_OK && staged)
        st = make_inputs(&s, &h, hv);
    free(hv);
    if (st != LLMCL_OK || !staged || !h.x || !h.res || !h.dy || !h.dr || !h.w || !h.b)
        bench_fail(env, "norm setup", st);
    else if (build_baselines(&s))
        measure(&s, &h);
    release(&s, &h);
}
