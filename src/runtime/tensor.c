/*
 * tensor.c: tensors (owned allocations, wraps of an application's cl_mem, and views), their
 * validation, accessors, and host upload/download honouring strides.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const size_t dtype_sizes[LLMCL_DTYPE_COUNT] = {4, 2, 2, 4, 8};
static const char *dtype_names[LLMCL_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32", "i64"};

const char *llmcl_dtype_name(llmcl_dtype dtype)
{
    return (unsigned)dtype < LLMCL_DTYPE_COUNT ? dtype_names[dtype] : "invalid";
}

size_t llmcl_dtype_size(llmcl_dtype dtype)
{
    return (unsigned)dtype < LLMCL_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

/* Checks shape and strides and computes the element extent the view reaches past its offset. */
static llmcl_status check_layout(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t offset, int64_t *extent)
{
    LLMCL__REQUIRE(ctx, (unsigned)dtype < LLMCL_DTYPE_COUNT, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "dtype %d is not an llmcl_dtype", (int)dtype);
    LLMCL__REQUIRE(ctx, ndim >= 0 && ndim <= LLMCL_MAX_DIMS, LLMCL_ERROR_INVALID_ARGUMENT,
                   "ndim %d is outside 0..%d", ndim, LLMCL_MAX_DIMS);
    LLMCL__REQUIRE(ctx, ndim == 0 || shape, LLMCL_ERROR_INVALID_ARGUMENT, "shape must not be NULL");
    LLMCL__REQUIRE(ctx, offset >= 0, LLMCL_ERROR_INVALID_ARGUMENT, "offset %lld is negative",
                   (long long)offset);
    const int64_t limit = INT64_MAX / 8;
    int64_t numel = 1, reach = 0;
    for (int i = 0; i < ndim; ++i) {
        LLMCL__REQUIRE(ctx, shape[i] >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "shape[%d] = %lld is negative", i, (long long)shape[i]);
        const int64_t stride = strides ? strides[i] : 0;
        LLMCL__REQUIRE(ctx, stride >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "strides[%d] = %lld is negative", i, (long long)stride);
        LLMCL__REQUIRE(ctx, shape[i] == 0 || numel <= limit / shape[i], LLMCL_ERROR_OVERFLOW,
                       "the element count overflows at axis %d", i);
        numel *= shape[i];
        if (shape[i] > 0) {
            LLMCL__REQUIRE(ctx, stride <= limit / shape[i] && reach <= limit - stride * (shape[i] - 1),
                           LLMCL_ERROR_OVERFLOW, "the strided extent overflows at axis %d", i);
            reach += stride * (shape[i] - 1);
        }
    }
    LLMCL__REQUIRE(ctx, offset <= limit - reach, LLMCL_ERROR_OVERFLOW, "offset + extent overflows");
    *extent = numel == 0 ? 0 : (strides ? reach + 1 : numel);
    return LLMCL_OK;
}

static void set_layout(llmcl_tensor *t, int ndim, const int64_t *shape, const int64_t *strides)
{
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        t->shape[i] = shape[i];
        t->strides[i] = strides ? strides[i] : s;
        s *= shape[i];
    }
}

/* A new tensor of its own buffer: a scratch one's from the context's cache when one fits. */
static llmcl_status tensor_new(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim, const int64_t *shape,
                               bool scratch, llmcl_tensor **out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int64_t extent;
    LLMCL__TRY(check_layout(ctx, dtype, ndim, shape, NULL, 0, &extent));
    llmcl_tensor *t = calloc(1, sizeof *t);
    LLMCL__REQUIRE(ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "tensor");
    t->capacity = (uint64_t)extent * dtype_sizes[dtype];
    if (!scratch || !llmcl__cache_take(ctx, t->capacity, &t->mem, &t->capacity)) {
        const llmcl_status st = llmcl__buffer_alloc(ctx, t->capacity, &t->mem);
        if (st != LLMCL_OK) {
            free(t);
            return st;
        }
    }
    t->ctx = ctx;
    t->owns = true;
    t->scratch = scratch;
    t->dtype = dtype;
    set_layout(t, ndim, shape, NULL);
    *out = t;
    return LLMCL_OK;
}

llmcl_status llmcl_tensor_create(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim, const int64_t *shape,
                                 llmcl_tensor **out)
{
    return tensor_new(ctx, dtype, ndim, shape, false, out);
}

llmcl_status llmcl__tensor_adopt(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes, llmcl_dtype dt,
                                 int64_t n, llmcl_tensor **out)
{
    *out = NULL;
    int64_t extent;
    LLMCL__TRY(check_layout(ctx, dt, 1, &n, NULL, 0, &extent));
    LLMCL__REQUIRE(ctx, (uint64_t)extent * dtype_sizes[dt] <= bytes, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%lld elements do not fit %llu bytes", (long long)n, (unsigned long long)bytes);
    llmcl_tensor *t = calloc(1, sizeof *t);
    LLMCL__REQUIRE(ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "tensor");
    const llmcl_status st = llmcl__buffer_adopt(ctx, bytes);
    if (st != LLMCL_OK) {
        free(t);
        return st;
    }
    t->ctx = ctx;
    t->mem = mem;
    t->owns = true;
    t->capacity = bytes;
    t->dtype = dt;
    set_layout(t, 1, &n, NULL);
    *out = t;
    return LLMCL_OK;
}

llmcl_status llmcl__scratch(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim, const int64_t *shape,
                            const char *what, llmcl_tensor **out)
{
    const llmcl_status st = tensor_new(ctx, dtype, ndim, shape, true, out);
    if (st == LLMCL_OK)
        return LLMCL_OK;
    char detail[LLMCL__ERR_LEN / 2];
    memcpy(detail, ctx->last_error, sizeof detail - 1);
    detail[sizeof detail - 1] = '\0';
    return LLMCL__FAIL(ctx, st, "scratch for %s: %s", what, detail);
}

static llmcl_status make_view(llmcl_ctx *ctx, cl_mem mem, uint64_t capacity, llmcl_dtype dtype,
                              int ndim, const int64_t *shape, const int64_t *strides, int64_t offset,
                              llmcl_tensor **out)
{
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    int64_t extent;
    LLMCL__TRY(check_layout(ctx, dtype, ndim, shape, strides, offset, &extent));
    const uint64_t end = (uint64_t)(offset + extent) * dtype_sizes[dtype];
    LLMCL__REQUIRE(ctx, extent == 0 || end <= capacity, LLMCL_ERROR_INVALID_ARGUMENT,
                   "the view reaches byte %llu but the buffer holds %llu bytes",
                   (unsigned long long)end, (unsigned long long)capacity);
    llmcl_tensor *t = calloc(1, sizeof *t);
    LLMCL__REQUIRE(ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "tensor");
    clRetainMemObject(mem);
    t->ctx = ctx;
    t->mem = mem;
    t->capacity = capacity;
    t->dtype = dtype;
    t->offset = offset;
    set_layout(t, ndim, shape, strides);
    *out = t;
    return LLMCL_OK;
}

llmcl_status llmcl_tensor_wrap(llmcl_ctx *ctx, cl_mem buffer, llmcl_dtype dtype, int ndim,
                               const int64_t *shape, const int64_t *strides, int64_t offset,
                               llmcl_tensor **out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, buffer, LLMCL_ERROR_INVALID_ARGUMENT, "buffer must not be NULL");
    size_t size = 0;
    cl_context owner = NULL;
    LLMCL__CL(ctx, clGetMemObjectInfo(buffer, CL_MEM_SIZE, sizeof size, &size, NULL));
    LLMCL__CL(ctx, clGetMemObjectInfo(buffer, CL_MEM_CONTEXT, sizeof owner, &owner, NULL));
    LLMCL__REQUIRE(ctx, owner == ctx->context, LLMCL_ERROR_DEVICE_MISMATCH,
                   "buffer belongs to another OpenCL context");
    cl_mem parent = NULL;
    size_t origin = 0;
    LLMCL__CL(ctx, clGetMemObjectInfo(buffer, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent,
                                      NULL));
    if (parent)
        LLMCL__CL(ctx, clGetMemObjectInfo(buffer, CL_MEM_OFFSET, sizeof origin, &origin, NULL));
    LLMCL__TRY(make_view(ctx, buffer, size, dtype, ndim, shape, strides, offset, out));
    (*out)->root = parent;
    (*out)->origin = origin;
    return LLMCL_OK;
}

llmcl_status llmcl_tensor_view(const llmcl_tensor *base, int ndim, const int64_t *shape,
                               const int64_t *strides, int64_t offset, llmcl_tensor **out)
{
    LLMCL__REQUIRE(NULL, base, LLMCL_ERROR_INVALID_ARGUMENT, "base must not be NULL");
    LLMCL__TRY(make_view(base->ctx, base->mem, base->capacity, base->dtype, ndim, shape, strides,
                         offset, out));
    (*out)->root = base->root;
    (*out)->origin = base->origin;
    return LLMCL_OK;
}

void llmcl_tensor_destroy(llmcl_tensor *t)
{
    if (!t)
        return;
    if (!t->owns)
        clReleaseMemObject(t->mem);
    else if (!(t->scratch && llmcl__cache_put(t->ctx, t->mem, t->capacity)))
        llmcl__buffer_free(t->ctx, t->mem, t->capacity);
    free(t);
}

llmcl_dtype llmcl_tensor_dtype(const llmcl_tensor *t) { return t ? t->dtype : LLMCL_DTYPE_COUNT; }
int llmcl_tensor_ndim(const llmcl_tensor *t) { return t ? t->ndim : -1; }
int64_t llmcl_tensor_offset(const llmcl_tensor *t) { return t ? t->offset : -1; }
cl_mem llmcl_tensor_cl_mem(const llmcl_tensor *t) { return t ? t->mem : NULL; }
llmcl_ctx *llmcl_tensor_ctx(const llmcl_tensor *t) { return t ? t->ctx : NULL; }

int64_t llmcl_tensor_dim(const llmcl_tensor *t, int axis)
{
    return (t && axis >= 0 && axis < t->ndim) ? t->shape[axis] : -1;
}

int64_t llmcl_tensor_stride(const llmcl_tensor *t, int axis)
{
    return (t && axis >= 0 && axis < t->ndim) ? t->strides[axis] : -1;
}

int64_t llmcl_tensor_numel(const llmcl_tensor *t)
{
    if (!t)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i)
        n *= t->shape[i];
    return n;
}

int llmcl_tensor_is_contiguous(const llmcl_tensor *t)
{
    if (!t)
        return 0;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return 0;
        expect *= t->shape[i];
    }
    return 1;
}

/* ---- host transfers ---- */

/* Element offset (from the start of the span) of logical element i in row-major order. */
static int64_t strided_index(const llmcl_tensor *t, int64_t i, int64_t base)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; --d) {
        off += (i % t->shape[d]) * t->strides[d];
        i /= t->shape[d];
    }
    return off + t->offset - base;
}

static llmcl_status check_transfer(const llmcl_tensor *t, const void *host, size_t bytes)
{
    LLMCL__REQUIRE(NULL, t, LLMCL_ERROR_INVALID_ARGUMENT, "tensor must not be NULL");
    const uint64_t want = (uint64_t)llmcl_tensor_numel(t) * dtype_sizes[t->dtype];
    LLMCL__REQUIRE(t->ctx, host || want == 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "host pointer must not be NULL");
    LLMCL__REQUIRE(t->ctx, bytes == want, LLMCL_ERROR_SHAPE_MISMATCH,
                   "host buffer has %zu bytes; the tensor holds %llu", bytes,
                   (unsigned long long)want);
    return LLMCL_OK;
}

/* The span [first, first + count) of elements a strided tensor touches, read to the host. */
static llmcl_status read_span(const llmcl_tensor *t, int64_t *first, int64_t *count, char **buf)
{
    int64_t reach = 0;
    for (int d = 0; d < t->ndim; ++d)
        reach += (t->shape[d] - 1) * t->strides[d];
    const size_t es = dtype_sizes[t->dtype];
    *first = t->offset;
    *count = reach + 1;
    *buf = malloc((size_t)*count * es);
    LLMCL__REQUIRE(t->ctx, *buf, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "staging buffer");
    cl_int err = clEnqueueReadBuffer(t->ctx->queue, t->mem, CL_TRUE, (size_t)*first * es,
                                     (size_t)*count * es, *buf, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        free(*buf);
        return llmcl__fail_cl(t->ctx, err, "clEnqueueReadBuffer", __FILE__, __LINE__);
    }
    return LLMCL_OK;
}

/* Copies between host (contiguous, row-major) and the tensor in either direction. */
static llmcl_status transfer(const llmcl_tensor *t, void *host, size_t bytes, bool to_device)
{
    const size_t es = dtype_sizes[t->dtype];
    if (bytes == 0)
        return LLMCL_OK;
    if (llmcl_tensor_is_contiguous(t)) {
        const size_t start = (size_t)t->offset * es;
        LLMCL__CL(t->ctx, to_device ? clEnqueueWriteBuffer(t->ctx->queue, t->mem, CL_TRUE, start,
                                                           bytes, host, 0, NULL, NULL)
                                    : clEnqueueReadBuffer(t->ctx->queue, t->mem, CL_TRUE, start,
                                                          bytes, host, 0, NULL, NULL));
        return LLMCL_OK;
    }
    /* Strided: stage the span; an upload is a read-modify-write so the gaps stay intact. */
    int64_t first, count;
    char *span;
    LLMCL__TRY(read_span(t, &first, &count, &span));
    const int64_t n = llmcl_tensor_numel(t);
    for (int64_t i = 0; i < n; ++i) {
        char *dev = span + strided_index(t, i, first) * es, *h = (char *)host + i * es;
        memcpy(to_device ? dev : h, to_device ? h : dev, es);
    }
    cl_int err = to_device ? clEnqueueWriteBuffer(t->ctx->queue, t->mem, CL_TRUE, (size_t)first * es,
                                                  (size_t)count * es, span, 0, NULL, NULL)
                           : CL_SUCCESS;
    free(span);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(t->ctx, err, "clEnqueueWriteBuffer", __FILE__, __LINE__);
    return LLMCL_OK;
}

llmcl_status llmcl_tensor_upload(llmcl_tensor *t, const void *host, size_t bytes)
{
    LLMCL__TRY(check_transfer(t, host, bytes));
    return transfer(t, (void *)host, bytes, true); /* host is only read when to_device */
}

llmcl_status llmcl_tensor_download(const llmcl_tensor *t, void *host, size_t bytes)
{
    LLMCL__TRY(check_transfer(t, host, bytes));
    return transfer(t, host, bytes, false);
}
