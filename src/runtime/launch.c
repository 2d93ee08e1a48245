/*
 * launch.c: setting kernel arguments, a built kernel's work-group cap, enqueuing kernels (with
 * profiling events when a region is open), and the argument checks every op launcher shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

size_t llmcl__kernel_wg_cap(const llmcl_ctx *ctx, cl_kernel kernel, size_t wg)
{
    size_t most = ctx->info.max_work_group_size, kernel_wg = 0;
    if (clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kernel_wg,
                                 &kernel_wg, NULL) == CL_SUCCESS &&
        kernel_wg > 0 && kernel_wg < most)
        most = kernel_wg;
    if (wg > most)
        wg = most;
    return wg < 1 ? 1 : wg;
}

llmcl__args llmcl__args_begin(llmcl_ctx *ctx, cl_kernel kernel)
{
    return (llmcl__args){.ctx = ctx, .kernel = kernel};
}

void llmcl__arg(llmcl__args *a, size_t size, const void *value)
{
    cl_int err = clSetKernelArg(a->kernel, a->next, size, value);
    if (err != CL_SUCCESS && a->err == CL_SUCCESS) {
        a->err = err;
        a->err_index = a->next;
    }
    a->next++;
}

void llmcl__arg_local(llmcl__args *a, size_t bytes) { llmcl__arg(a, bytes, NULL); }

void llmcl__arg_tensor(llmcl__args *a, const llmcl_tensor *t)
{
    cl_ulong offset = (cl_ulong)t->offset;
    llmcl__arg(a, sizeof(cl_mem), &t->mem);
    llmcl__arg(a, sizeof offset, &offset);
}

void llmcl__arg_mem(llmcl__args *a, cl_mem mem, int64_t off)
{
    const cl_ulong o = (cl_ulong)off;
    llmcl__arg(a, sizeof mem, &mem);
    llmcl__arg(a, sizeof o, &o);
}

void llmcl__arg_i32(llmcl__args *a, int32_t v)
{
    cl_int x = v;
    llmcl__arg(a, sizeof x, &x);
}

void llmcl__arg_i64(llmcl__args *a, int64_t v)
{
    cl_long x = v;
    llmcl__arg(a, sizeof x, &x);
}

void llmcl__arg_f32(llmcl__args *a, float v)
{
    cl_float x = v;
    llmcl__arg(a, sizeof x, &x);
}

llmcl_status llmcl__record_event(llmcl_ctx *ctx, cl_event ev, const char *name)
{
    if (ctx->n_events == ctx->cap_events) {
        size_t cap = ctx->cap_events ? ctx->cap_events * 2 : 64;
        cl_event *grown = realloc(ctx->events, cap * sizeof *grown);
        if (grown)
            ctx->events = grown;
        char(*names)[LLMCL__EVENT_NAME_LEN] =
            grown ? realloc(ctx->event_names, cap * sizeof *names) : NULL;
        if (names)
            ctx->event_names = names;
        if (!grown || !names) {
            clReleaseEvent(ev);
            return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "profiling event list");
        }
        ctx->cap_events = cap;
    }
    if (ctx->profile_names)
        snprintf(ctx->event_names[ctx->n_events], LLMCL__EVENT_NAME_LEN, "%s", name);
    ctx->events[ctx->n_events++] = ev;
    return LLMCL_OK;
}

llmcl_status llmcl__launch(llmcl__args *a, cl_uint dims, const size_t *global, const size_t *local)
{
    llmcl_ctx *ctx = a->ctx;
    if (a->err != CL_SUCCESS) {
        char name[64] = "?";
        clGetKernelInfo(a->kernel, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
        return LLMCL__FAIL(ctx, (llmcl_status)a->err, "kernel %s: setting argument %u failed (%s)",
                           name, a->err_index, llmcl_status_str(a->err));
    }
    size_t g[3];
    for (cl_uint i = 0; i < dims; ++i) {
        g[i] = global[i];
        if (local && local[i])
            g[i] = (size_t)llmcl__div_up((int64_t)g[i], (int64_t)local[i]) * local[i];
        if (g[i] == 0)
            return LLMCL_OK; /* nothing to do: an empty tensor */
    }
    cl_event ev = NULL;
    LLMCL__CL(ctx, clEnqueueNDRangeKernel(ctx->queue, a->kernel, dims, NULL, g, local, 0, NULL,
                                          ctx->profiling ? &ev : NULL));
    if (!ctx->profiling)
        return LLMCL_OK;
    char name[LLMCL__EVENT_NAME_LEN] = "?";
    if (ctx->profile_names)
        clGetKernelInfo(a->kernel, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
    return llmcl__record_event(ctx, ev, name);
}

/* ---- argument checks ---- */

llmcl_status llmcl__check_tensor(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                 unsigned dtype_mask, int min_dim, int max_dim)
{
    LLMCL__REQUIRE(ctx, t, LLMCL_ERROR_INVALID_ARGUMENT, "%s must not be NULL", name);
    LLMCL__REQUIRE(ctx, t->ctx == ctx, LLMCL_ERROR_DEVICE_MISMATCH,
                   "%s belongs to another context", name);
    LLMCL__REQUIRE(ctx, (dtype_mask >> t->dtype) & 1u, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s has dtype %s, which this op does not take", name, llmcl_dtype_name(t->dtype));
    LLMCL__REQUIRE(ctx, t->ndim >= min_dim && t->ndim <= max_dim, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s has %d dimensions; expected %d to %d", name, t->ndim, min_dim, max_dim);
    return LLMCL_OK;
}

void llmcl__dims_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && n < len; ++i)
        n += (size_t)snprintf(buf + n, len - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

llmcl__shape_str llmcl__shape_text(const llmcl_tensor *t)
{
    llmcl__shape_str out;
    llmcl__dims_text(t->ndim, t->shape, out.s, sizeof out.s);
    return out;
}

llmcl_status llmcl__check_same_shape(llmcl_ctx *ctx, const llmcl_tensor *a, const char *an,
                                     const llmcl_tensor *b, const char *bn)
{
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; ++i)
        same = a->shape[i] == b->shape[i];
    if (same)
        return LLMCL_OK;
    return LLMCL__FAIL(ctx, LLMCL_ERROR_SHAPE_MISMATCH, "%s has shape %s but %s has shape %s", an,
                       llmcl__shape_text(a).s, bn, llmcl__shape_text(b).s);
}

llmcl_status llmcl__as_rows(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                            llmcl__rows *out)
{
    const int last = t->ndim - 1;
    LLMCL__REQUIRE(ctx, t->ndim >= 1, LLMCL_ERROR_SHAPE_MISMATCH, "%s has no dimensions", name);
    LLMCL__REQUIRE(ctx, t->strides[last] == 1 || t->shape[last] == 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: the last dimension must have unit stride (has %lld)", name,
                   (long long)t->strides[last]);
    out->row_len = t->shape[last];
    out->n_rows = 1;
    out->row_stride = t->ndim >= 2 ? t->strides[last - 1] : t->shape[last];
    /* Leading dimensions flatten when each outer stride is the inner stride times the inner size. */
    int64_t expect = out->row_stride;
    for (int i = last - 1; i >= 0; --i) {
        LLMCL__REQUIRE(ctx, t->shape[i] == 1 || t->strides[i] == expect, LLMCL_ERROR_INVALID_ARGUMENT,
                       "%s: dimensions 0..%d cannot be flattened into rows (stride %lld at axis %d)",
                       name, last - 1, (long long)t->strides[i], i);
        out->n_rows *= t->shape[i];
        if (t->shape[i] != 1)
            expect = t->strides[i] * t->shape[i];
    }
    if (out->n_rows <= 1)
        out->row_stride = out->row_len;
    return LLMCL_OK;
}

llmcl_status llmcl__check_vec(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                              unsigned dtype_mask, int64_t n)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, t, name, dtype_mask, 1, LLMCL_MAX_DIMS));
    LLMCL__REQUIRE(ctx, llmcl_tensor_numel(t) == n, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s has %lld elements; expected %lld", name, (long long)llmcl_tensor_numel(t),
                   (long long)n);
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(t), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s must be contiguous", name);
    return LLMCL_OK;
}

llmcl_status llmcl__check_grad(llmcl_ctx *ctx, const llmcl_tensor *ref, const char *ref_name,
                               const llmcl_tensor *grad, const char *name, llmcl__rows *rows)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, grad, name, 1u << LLMCL_F32, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_same_shape(ctx, ref, ref_name, grad, name));
    return llmcl__as_rows(ctx, grad, name, rows);
}

llmcl_status llmcl__check_label_stat(llmcl_ctx *ctx, cl_mem stats, size_t at,
                                     const llmcl_tensor *labels, int64_t v, int64_t ignore)
{
    cl_int bad = -1;
    LLMCL__CL(ctx, clEnqueueReadBuffer(ctx->queue, stats, CL_TRUE, at * sizeof bad, sizeof bad,
                                       &bad, 0, NULL, NULL));
    if (bad < 0)
        return LLMCL_OK;
    const size_t es = llmcl_dtype_size(labels->dtype);
    int64_t value = 0;
    int32_t v32 = 0;
    LLMCL__CL(ctx, clEnqueueReadBuffer(ctx->queue, labels->mem, CL_TRUE,
                                       (size_t)(labels->offset + bad) * es, es,
                                       es == 4 ? (void *)&v32 : (void *)&value, 0, NULL, NULL));
    if (es == 4)
        value = v32;
    return LLMCL__FAIL(ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                       "labels[%d] = %lld is outside [0, %lld) and is not ignore_index (%lld); "
                       "nothing was written",
                       (int)bad, (long long)value, (long long)v, (long long)ignore);
}

int64_t llmcl__chunk_tokens(int64_t n, int64_t forced, uint64_t budget, uint64_t per_token)
{
    const int64_t tile = 128; /* the tensor-core products' row tile */
    int64_t c = forced ? forced : (int64_t)(budget / per_token);
    c = c < 1 ? 1 : c > n ? n : c;
    if (!forced && c < n && c >= tile)
        c -= c % tile;
    return c;
}

llmcl_status llmcl__rows_view(const llmcl_tensor *t, const llmcl__rows *r, int64_t r0,
                              int64_t rows, llmcl_tensor **out)
{
    const int64_t shape[2] = {rows, r->row_len}, strides[2] = {r->row_stride, 1};
    return llmcl_tensor_view(t, 2, shape, strides, t->offset + r0 * r->row_stride, out);
}

llmcl_status llmcl__head_view(const llmcl_tensor *t, int64_t rows, int64_t cols,
                              llmcl_tensor **out)
{
    const int64_t shape[2] = {rows, cols};
    return llmcl_tensor_view(t, 2, shape, NULL, t->offset, out);
}

cl_mem llmcl__root_mem(const llmcl_tensor *t) { return t->root ? t->root : t->mem; }

uint64_t llmcl__root_byte(const llmcl_tensor *t)
{
    return t->origin + (uint64_t)t->offset * llmcl_dtype_size(t->dtype);
}

/* The byte range [lo, hi) a view spans in its root buffer; empty views span nothing. */
static void byte_span(const llmcl_tensor *t, uint64_t *lo, uint64_t *hi)
{
    const size_t es = llmcl_dtype_size(t->dtype);
    int64_t first = t->offset, last = t->offset;
    for (int i = 0; i < t->ndim; ++i) {
        if (t->shape[i] == 0) {
            *lo = *hi = 0;
            return;
        }
        const int64_t reach = (t->shape[i] - 1) * t->strides[i];
        if (reach < 0)
            first += reach;
        else
            last += reach;
    }
    *lo = t->origin + (uint64_t)first * es;
    *hi = t->origin + (uint64_t)(last + 1) * es;
}

/*
 * Where every stride of t of at least `period` bytes is a whole number of periods and its other
 * dimensions stay inside one period from where t starts in its own, the bytes [*lo, *hi) of a
 * period that t's elements can occupy; else false.
 */
static bool span_in_period(const llmcl_tensor *t, int64_t period, int64_t *lo, int64_t *hi)
{
    const int64_t es = (int64_t)llmcl_dtype_size(t->dtype);
    int64_t reach = es;
    for (int i = 0; i < t->ndim; ++i) {
        const int64_t stride = t->strides[i] * es;
        if (t->shape[i] <= 1)
            continue;
        if (stride < 0 || (stride >= period && stride % period != 0))
            return false;
        if (stride < period)
            reach += (t->shape[i] - 1) * stride;
    }
    *lo = (int64_t)(llmcl__root_byte(t) % (uint64_t)period);
    *hi = *lo + reach;
    return *hi <= period;
}

bool llmcl__overlaps(const llmcl_tensor *a, const llmcl_tensor *b)
{
    if (llmcl__root_mem(a) != llmcl__root_mem(b))
        return false;
    uint64_t alo, ahi, blo, bhi;
    byte_span(a, &alo, &ahi);
    byte_span(b, &blo, &bhi);
    if (!(alo < bhi && blo < ahi))
        return false;
    /* Interleaved views, such as heads side by side in the rows of one buffer, share a period
       (a row) in which their elements keep to ranges that do not meet. */
    for (int i = 0; i < a->ndim; ++i) {
        const int64_t period = a->strides[i] * (int64_t)llmcl_dtype_size(a->dtype);
        int64_t la, ha, lb, hb;
        if (a->shape[i] > 1 && period > 0 && span_in_period(a, period, &la, &ha) &&
            span_in_period(b, period, &lb, &hb) && (ha <= lb || hb <= la))
            return false;
    }
    return true;
}

bool llmcl__same_view(const llmcl_tensor *a, const llmcl_tensor *b)
{
    if (a->mem != b->mem || a->offset != b->offset || a->ndim != b->ndim ||
        llmcl_dtype_size(a->dtype) != llmcl_dtype_size(b->dtype))
        return false;
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

size_t llmcl__pow2_ceil(size_t x)
{
    size_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

size_t llmcl__pow2_floor(size_t x)
{
    size_t p = 1;
    while (p * 2 <= x)
        p <<= 1;
    return p;
}
