/*
 * bench_elementwise.c: llmcl-bench rows for copy, cast, axpy and fill at a size well past the
 * caches, each checked against the CPU reference; a row is named by its kernel key. One copy reads
 * a row-pitched view (a matrix's columns, as a slice of a wider buffer): the strided path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "elementwise_ref.h"

typedef struct ew_state {
    llmcl_tensor *a, *b;
    llmcl_tensor *a_parent; /* where a is a row-pitched view */
    const char *op;
} ew_state;

static llmcl_status run_op(llmcl_ctx *ctx, void *arg)
{
    ew_state *s = arg;
    if (strcmp(s->op, LLMCL_KEY_COPY) == 0)
        return llmcl_copy(ctx, s->a, s->b);
    if (strcmp(s->op, LLMCL_KEY_CAST) == 0)
        return llmcl_cast(ctx, s->a, s->b);
    if (strcmp(s->op, LLMCL_KEY_AXPY) == 0)
        return llmcl_axpy(ctx, 0.5f, s->a, s->b);
    return llmcl_fill(ctx, s->b, 0.25);
}

static float *host_values(int64_t n, float scale)
{
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n && x; ++i)
        x[i] = scale * (float)((i * 2654435761u) % 1000u) / 1000.0f - scale / 2;
    return x;
}

/* A contiguous tensor of t's shape. */
static llmcl_status create_like(bench_env *env, llmcl_dtype dtype, const llmcl_tensor *t,
                                llmcl_tensor **out)
{
    int64_t shape[LLMCL_MAX_DIMS];
    const int ndim = llmcl_tensor_ndim(t);
    for (int i = 0; i < ndim; ++i)
        shape[i] = llmcl_tensor_dim(t, i);
    return llmcl_tensor_create(env->ctx, dtype, ndim, shape, out);
}

/* Uploads f32 values into t of any float dtype and layout through an f32 tensor and a cast. */
static llmcl_status upload_as(bench_env *env, llmcl_tensor *t, const float *x, int64_t n)
{
    llmcl_tensor *tmp = NULL;
    llmcl_status st = create_like(env, LLMCL_F32, t, &tmp);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(tmp, x, (size_t)n * 4);
    if (st == LLMCL_OK)
        st = llmcl_cast(env->ctx, tmp, t);
    llmcl_tensor_destroy(tmp);
    return st;
}

static int check(bench_env *env, const char *op, const ew_state *s, const float *a, const float *b,
                 int64_t n)
{
    llmcl_tensor *out = NULL;
    float *got = malloc((size_t)n * sizeof *got);
    int ok = 0;
    if (got && create_like(env, LLMCL_F32, s->b, &out) == LLMCL_OK &&
        llmcl_cast(env->ctx, s->b, out) == LLMCL_OK &&
        llmcl_tensor_download(out, got, (size_t)n * 4) == LLMCL_OK) {
        const bool is16 = llmcl_tensor_dtype(s->a) != LLMCL_F32 || llmcl_tensor_dtype(s->b) != LLMCL_F32;
        const double tol = is16 ? 1e-2 : 1e-6;
        ok = 1;
        for (int64_t i = 0; i < n && ok; ++i) {
            double want = strcmp(op, LLMCL_KEY_FILL) == 0 ? 0.25 : a[i];
            if (strcmp(op, LLMCL_KEY_AXPY) == 0) {
                double y = b[i];
                ref_axpy(0.5, &(double){a[i]}, &y, 1);
                want = y;
            }
            ok = fabs(got[i] - want) <= tol + tol * fabs(want);
        }
    }
    llmcl_tensor_destroy(out);
    free(got);
    return ok;
}

/* The op's input: n elements, or where pitch is set a [n / cols, cols] view of rows pitch apart. */
static llmcl_status make_input(bench_env *env, ew_state *s, llmcl_dtype in, int64_t n, int64_t cols,
                               int64_t pitch)
{
    if (!pitch)
        return llmcl_tensor_create(env->ctx, in, 1, &n, &s->a);
    const int64_t shape[2] = {n / cols, cols}, strides[2] = {pitch, 1};
    const int64_t parent[2] = {n / cols, pitch};
    const llmcl_status st = llmcl_tensor_create(env->ctx, in, 2, parent, &s->a_parent);
    return st != LLMCL_OK ? st : llmcl_tensor_view(s->a_parent, 2, shape, strides, 0, &s->a);
}

static void bench_one(bench_env *env, const char *op, llmcl_dtype in, llmcl_dtype outt, int64_t n,
                      int64_t cols, int64_t pitch)
{
    ew_state s = {.op = op};
    float *a = host_values(n, 4.0f), *b = host_values(n, 2.0f);
    llmcl_status st = LLMCL_OK;
    if (!a || !b)
        st = LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    if (st == LLMCL_OK)
        st = make_input(env, &s, in, n, cols, pitch);
    if (st == LLMCL_OK)
        st = create_like(env, outt, s.a, &s.b);
    if (st == LLMCL_OK)
        st = upload_as(env, s.a, a, n);
    if (st == LLMCL_OK)
        st = upload_as(env, s.b, b, n);
    if (st != LLMCL_OK) {
        bench_fail(env, op, st);
    } else {
        bench_row r = {.peak_mib = -1, .check = -1};
        snprintf(r.kernel, sizeof r.kernel, "%s", op);
        snprintf(r.dtype, sizeof r.dtype, "%s", llmcl_dtype_name(outt));
        if (pitch)
            snprintf(r.shape, sizeof r.shape, "%lldx%lld pitch %lld", (long long)(n / cols),
                     (long long)cols, (long long)pitch);
        else
            snprintf(r.shape, sizeof r.shape, "%lld", (long long)n);
        /* the check runs once on fresh inputs; timing afterwards repeats the op */
        if (run_op(env->ctx, &s) == LLMCL_OK)
            r.check = check(env, op, &s, a, b, n);
        r.ms = bench_time(env, run_op, &s);
        const double in_bytes =
            strcmp(op, LLMCL_KEY_FILL) == 0 ? 0 : (double)n * (double)llmcl_dtype_size(in);
        const double extra =
            strcmp(op, LLMCL_KEY_AXPY) == 0 ? (double)n * (double)llmcl_dtype_size(outt) : 0;
        r.bytes = in_bytes + extra + (double)n * (double)llmcl_dtype_size(outt);
        bench_add(env, &r);
    }
    llmcl_tensor_destroy(s.a);
    llmcl_tensor_destroy(s.a_parent);
    llmcl_tensor_destroy(s.b);
    free(a);
    free(b);
}

void bench_elementwise(bench_env *env)
{
    const int64_t n = env->small ? (int64_t)4 << 20 : (int64_t)128 << 20;
    bench_one(env, LLMCL_KEY_COPY, LLMCL_F32, LLMCL_F32, n, 0, 0);
    bench_one(env, LLMCL_KEY_COPY, LLMCL_BF16, LLMCL_BF16, n, 0, 0);
    bench_one(env, LLMCL_KEY_COPY, LLMCL_BF16, LLMCL_BF16, n, 4096, 4096 + 64);
    bench_one(env, LLMCL_KEY_CAST, LLMCL_F32, LLMCL_BF16, n, 0, 0);
    bench_one(env, LLMCL_KEY_CAST, LLMCL_BF16, LLMCL_F32, n, 0, 0);
    bench_one(env, LLMCL_KEY_AXPY, LLMCL_BF16, LLMCL_BF16, n, 0, 0);
    bench_one(env, LLMCL_KEY_FILL, LLMCL_F32, LLMCL_BF16, n, 0, 0);
}
