/*
 * elementwise.c: host launchers of elementwise.cl (fill, copy, cast, axpy, mul, sum_rows).
 * Contiguous operands take the vectorised kernels; any other layout takes the strided ones.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../internal.h"

/* Shape and strides as long4, padded with leading unit dimensions. */
static void pad4(const llmcl_tensor *t, cl_long4 *shape, cl_long4 *stride)
{
    for (int i = 0; i < 4; ++i) {
        const int axis = t->ndim - 4 + i;
        shape->s[i] = axis >= 0 ? t->shape[axis] : 1;
        stride->s[i] = axis >= 0 ? t->strides[axis] : 0;
    }
}

/* DT names the storage; integer dtypes also get DT_IS_INT so the float-only kernels compile out. */
static void define_dt(llmcl__defines *d, llmcl_dtype dtype)
{
    llmcl__define_str(d, "DT", llmcl__dtype_macro(dtype));
    if ((LLMCL__INT_DTYPES >> dtype) & 1u)
        llmcl__define_flag(d, "DT_IS_INT");
}

/* The contiguous kernels' vector: VW elements a work-item, whose accesses are aligned or not. */
typedef struct vector {
    int64_t vw;
    bool aligned;
} vector;

/*
 * VW 8 where every operand is 16-bit and its first element 16-byte aligned (buffers' bases are),
 * so that each moves in 16-byte words; else VW 4, ALIGNED where every operand's first element is
 * aligned to four elements' size. Defines VW and ALIGNED.
 */
static vector define_vector(llmcl__defines *d, const llmcl_tensor *a, const llmcl_tensor *b)
{
    const llmcl_tensor *ops[2] = {a, b};
    bool narrow = true, aligned4 = true, aligned8 = true;
    for (int i = 0; i < 2 && ops[i]; ++i) {
        narrow = narrow && llmcl_dtype_size(ops[i]->dtype) == 2;
        aligned4 = aligned4 && ops[i]->offset % 4 == 0;
        aligned8 = aligned8 && ops[i]->offset % 8 == 0;
    }
    const vector v = {narrow && aligned8 ? 8 : 4, aligned4};
    llmcl__define_int(d, "VW", v.vw);
    if (v.aligned)
        llmcl__define_flag(d, "ALIGNED");
    return v;
}

/* The work-group size and a grid-stride launch covering `items` work-items. */
typedef struct grid {
    size_t global, local;
} grid;

/*
 * At most GPC groups per compute unit (0: no cap, one pass over the items); where the device cuts
 * loops short, at least as many as keep a work-item's grid-stride trips within the budget
 * (llmcl__loop_budget's count): a kernel has up to two grid loops (a vector part and a tail),
 * each trip `trip` passes.
 */
static grid plan_grid(const llmcl_ctx *ctx, const llmcl__params *p, int64_t items, int64_t trip)
{
    const size_t wg = (size_t)llmcl__param_get(p, "WG", 256);
    const int64_t gpc = llmcl__param_get(p, "GPC", 8);
    const int64_t all = llmcl__div_up(items > 0 ? items : 1, (int64_t)wg);
    int64_t groups = all;
    const int64_t cap = (int64_t)ctx->info.compute_units * gpc;
    if (gpc > 0 && groups > cap)
        groups = cap;
    const int64_t budget = llmcl__loop_budget(ctx);
    if (budget != INT64_MAX) {
        const int64_t most = (budget / 2 - 1) / trip; /* trips a work-item may take */
        if (llmcl__div_up(all, groups) > most)
            groups = llmcl__div_up(all, most);
    }
    return (grid){(size_t)groups * wg, wg};
}

/*
 * The kernel `name` of key `key` with its parameters, and its grid for `items` work-items (of
 * UNROLL words each for copy_words, whose key alone has UNROLL and HINT), each grid-loop trip
 * `trip` loop passes (copy_words adds its two loops of UNROLL). `wide`: the kernel moves aligned
 * vectors (copy_words' words, or the contiguous kernels' ALIGNED ones).
 */
static llmcl_status get_kernel(llmcl_ctx *ctx, const char *key, llmcl_dtype dtype, int64_t n,
                               llmcl__defines *d, const char *name, bool wide, cl_kernel *k,
                               grid *g, int64_t items, int64_t trip)
{
    const bool words = strcmp(name, "copy_words") == 0;
    llmcl__params p = {0};
    size_t wg = ctx->info.max_work_group_size < 256 ? ctx->info.max_work_group_size : 256;
    llmcl__param_set(&p, "WG", (long)wg);
    /* NVIDIA: aligned vectors move fastest in one pass. On an H100 a copy so moved 2.98 TB/s
     * where a grid of 8 groups per compute unit looping over the data moved 2.79; on the H200 the
     * tuner chose one pass for most of the contiguous kernels (docs/PERFORMANCE.md). */
    const bool nv = ctx->info.vendor_id == LLMCL_VENDOR_NVIDIA;
    llmcl__param_set(&p, "GPC", ctx->info.is_gpu ? (wide && nv ? 0 : 8) : 4);
    if (words) {
        llmcl__param_set(&p, "UNROLL", 1);
        llmcl__param_set(&p, "HINT", 0);
    }
    char cls[16];
    llmcl__shape_class(n > 0 ? n : 1, cls);
    llmcl__params_lookup(ctx, key, dtype, cls, &p);
    const long gpc = llmcl__param_get(&p, "GPC", 8);
    LLMCL__REQUIRE(ctx, gpc >= 0 && gpc <= 64, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: tuned GPC %ld is not in [0, 64]", key, gpc);
    if (words) {
        const long unroll = llmcl__param_get(&p, "UNROLL", 1);
        const long hint = llmcl__param_get(&p, "HINT", 0);
        LLMCL__REQUIRE(ctx,
                       (unroll == 1 || unroll == 2 || unroll == 4 || unroll == 8) && hint >= 0 &&
                           hint <= 3,
                       LLMCL_ERROR_INVALID_ARGUMENT,
                       "%s: tuned UNROLL %ld or HINT %ld out of range", key, unroll, hint);
        items = llmcl__div_up(items, unroll);
        trip += 2 * (unroll + 1);
    }
    llmcl__params_define(&p, d);
    *g = plan_grid(ctx, &p, items, trip);
    return llmcl__kernel(ctx, LLMCL_FAMILY_ELEMENTWISE, d, name, k);
}

llmcl_status llmcl_fill(llmcl_ctx *ctx, llmcl_tensor *t, double value)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__TRY(llmcl__check_tensor(ctx, t, "t", LLMCL__ALL_DTYPES, 0, LLMCL_MAX_DIMS));
    const bool is_int = (LLMCL__INT_DTYPES >> t->dtype) & 1u;
    const double limit = t->dtype == LLMCL_I32 ? 0x1p31 : 0x1p63, whole = trunc(value);
    LLMCL__REQUIRE(ctx, !is_int || (whole >= -limit && whole < limit), LLMCL_ERROR_INVALID_ARGUMENT,
                   "fill value %g does not fit in %s", value, llmcl_dtype_name(t->dtype));
    const bool contig = llmcl_tensor_is_contiguous(t);
    const int64_t n = llmcl_tensor_numel(t);
    llmcl__defines d = {0};
    define_dt(&d, t->dtype);
    const vector v = contig && !is_int ? define_vector(&d, t, NULL) : (vector){1, false};
    cl_kernel k;
    grid g;
    LLMCL__TRY(get_kernel(ctx, LLMCL_KEY_FILL, t->dtype, n, &d,
                          contig ? "fill_contig" : "fill_strided", v.aligned, &k, &g,
                          llmcl__div_up(n, v.vw), 1));
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, t);
    llmcl__arg_i64(&a, n);
    if (!contig) {
        cl_long4 shape, stride;
        pad4(t, &shape, &stride);
        llmcl__arg(&a, sizeof shape, &shape);
        llmcl__arg(&a, sizeof stride, &stride);
    }
    llmcl__arg_f32(&a, (float)value);
    llmcl__arg_i64(&a, is_int ? (int64_t)value : 0);
    return llmcl__launch(&a, 1, &g.global, &g.local);
}

/* Shared checks of the two-operand ops: both valid, same shape, dst not partly overlapping src. */
static llmcl_status check_pair(llmcl_ctx *ctx, const llmcl_tensor *src, const char *sn,
                               unsigned src_dtypes, const llmcl_tensor *dst, const char *dn,
                               unsigned dst_dtypes)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__TRY(llmcl__check_tensor(ctx, src, sn, src_dtypes, 0, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, dst, dn, dst_dtypes, 0, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_same_shape(ctx, src, sn, dst, dn));
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(src, dst) || llmcl__same_view(src, dst),
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s and %s overlap without being the same view", sn,
                   dn);
    return LLMCL_OK;
}

/* Launches a two-operand strided kernel: (src, src_stride, dst, dst_stride, n, shape[, alpha]). */
static llmcl_status launch_strided(llmcl_ctx *ctx, cl_kernel k, const grid *g,
                                   const llmcl_tensor *src, llmcl_tensor *dst, const float *alpha)
{
    cl_long4 shape, sstride, dstride;
    pad4(src, &shape, &sstride);
    pad4(dst, &shape, &dstride);
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, src);
    llmcl__arg(&a, sizeof sstride, &sstride);
    llmcl__arg_tensor(&a, dst);
    llmcl__arg(&a, sizeof dstride, &dstride);
    llmcl__arg_i64(&a, llmcl_tensor_numel(src));
    llmcl__arg(&a, sizeof shape, &shape);
    if (alpha)
        llmcl__arg_f32(&a, *alpha);
    return llmcl__launch(&a, 1, &g->global, &g->local);
}

/* t's rows (its last dimension, unit-stride) start and end on multiples of `word` bytes. */
static bool rows_in_words(const llmcl_tensor *t, int64_t word)
{
    const int64_t es = (int64_t)llmcl_dtype_size(t->dtype);
    const int last = t->ndim - 1;
    if (t->ndim == 0 || t->strides[last] != 1 || (t->shape[last] * es) % word ||
        (t->offset * es) % word)
        return false;
    for (int i = 0; i < last; ++i)
        if (t->shape[i] > 1 && (t->strides[i] * es) % word)
            return false;
    return true;
}

/* The widest word, 16, 8 or 4 bytes and wider than an element, that both tensors' rows are made
 * of; 0 where there is none. */
static int64_t row_word(const llmcl_tensor *src, const llmcl_tensor *dst)
{
    for (int64_t word = 16; word > (int64_t)llmcl_dtype_size(src->dtype); word /= 2)
        if (rows_in_words(src, word) && rows_in_words(dst, word))
            return word;
    return 0;
}

/* t's shape and strides counted in words of `word` bytes (rows_in_words holds); its offset. */
static int64_t in_words(const llmcl_tensor *t, int64_t word, cl_long4 *shape, cl_long4 *stride)
{
    const int64_t es = (int64_t)llmcl_dtype_size(t->dtype);
    pad4(t, shape, stride);
    shape->s[3] = shape->s[3] * es / word;
    for (int i = 0; i < 3; ++i)
        stride->s[i] = shape->s[i] > 1 ? stride->s[i] * es / word : 0;
    return t->offset * es / word;
}

/* copy_strided over words: (src, src_stride, dst, dst_stride, n, shape) as launch_strided's. */
static llmcl_status launch_rows(llmcl_ctx *ctx, cl_kernel k, const grid *g, const llmcl_tensor *src,
                                llmcl_tensor *dst, int64_t word)
{
    cl_long4 shape, sstride, dstride;
    const int64_t soff = in_words(src, word, &shape, &sstride);
    const int64_t doff = in_words(dst, word, &shape, &dstride);
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_mem(&a, src->mem, soff);
    llmcl__arg(&a, sizeof sstride, &sstride);
    llmcl__arg_mem(&a, dst->mem, doff);
    llmcl__arg(&a, sizeof dstride, &dstride);
    llmcl__arg_i64(&a, shape.s[0] * shape.s[1] * shape.s[2] * shape.s[3]);
    llmcl__arg(&a, sizeof shape, &shape);
    return llmcl__launch(&a, 1, &g->global, &g->local);
}

llmcl_status llmcl_copy(llmcl_ctx *ctx, const llmcl_tensor *src, llmcl_tensor *dst)
{
    LLMCL__TRY(check_pair(ctx, src, "src", LLMCL__ALL_DTYPES, dst, "dst", LLMCL__ALL_DTYPES));
    LLMCL__REQUIRE(ctx, src->dtype == dst->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "copy needs equal dtypes (src %s, dst %s); use llmcl_cast",
                   llmcl_dtype_name(src->dtype), llmcl_dtype_name(dst->dtype));
    if (llmcl__same_view(src, dst))
        return LLMCL_OK;
    const int64_t n = llmcl_tensor_numel(src);
    const int64_t es = (int64_t)llmcl_dtype_size(src->dtype);
    const bool contig = llmcl_tensor_is_contiguous(src) && llmcl_tensor_is_contiguous(dst);
    const bool words = contig && (n * es) % 16 == 0 && (src->offset * es) % 16 == 0 &&
                       (dst->offset * es) % 16 == 0;
    llmcl__defines d = {0};
    define_dt(&d, src->dtype);
    cl_kernel k;
    grid g;
    if (words) {
        const int64_t nw = n * es / 16;
        LLMCL__TRY(
            get_kernel(ctx, LLMCL_KEY_COPY, src->dtype, n, &d, "copy_words", true, &k, &g, nw, 1));
        llmcl__args a = llmcl__args_begin(ctx, k);
        llmcl__arg(&a, sizeof(cl_mem), &src->mem);
        llmcl__arg_i64(&a, src->offset * es / 16);
        llmcl__arg(&a, sizeof(cl_mem), &dst->mem);
        llmcl__arg_i64(&a, dst->offset * es / 16);
        llmcl__arg_i64(&a, nw);
        return llmcl__launch(&a, 1, &g.global, &g.local);
    }
    if (contig) {
        LLMCL__TRY(
            get_kernel(ctx, LLMCL_KEY_COPY, src->dtype, n, &d, "copy_elems", false, &k, &g, n, 1));
        llmcl__args a = llmcl__args_begin(ctx, k);
        llmcl__arg_tensor(&a, src);
        llmcl__arg_tensor(&a, dst);
        llmcl__arg_i64(&a, n);
        return llmcl__launch(&a, 1, &g.global, &g.local);
    }
    const int64_t word = row_word(src, dst);
    if (word) {
        llmcl__define_str(&d, "COPY_T", word == 16 ? "uint4" : word == 8 ? "uint2" : "uint");
        LLMCL__TRY(get_kernel(ctx, LLMCL_KEY_COPY, src->dtype, n, &d, "copy_strided", false, &k,
                              &g, n * es / word, 1));
        return launch_rows(ctx, k, &g, src, dst, word);
    }
    LLMCL__TRY(
        get_kernel(ctx, LLMCL_KEY_COPY, src->dtype, n, &d, "copy_strided", false, &k, &g, n, 1));
    return launch_strided(ctx, k, &g, src, dst, NULL);
}

llmcl_status llmcl_cast(llmcl_ctx *ctx, const llmcl_tensor *src, llmcl_tensor *dst)
{
    LLMCL__TRY(check_pair(ctx, src, "src", LLMCL__FLOAT_DTYPES, dst, "dst", LLMCL__FLOAT_DTYPES));
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(src, dst) || src->dtype == dst->dtype,
                   LLMCL_ERROR_INVALID_ARGUMENT, "cast between dtypes cannot run in place");
    if (src->dtype == dst->dtype)
        return llmcl_copy(ctx, src, dst);
    const int64_t n = llmcl_tensor_numel(src);
    const bool contig = llmcl_tensor_is_contiguous(src) && llmcl_tensor_is_contiguous(dst);
    llmcl__defines d = {0};
    llmcl__define_str(&d, "SRC_DT", llmcl__dtype_macro(src->dtype));
    llmcl__define_str(&d, "DST_DT", llmcl__dtype_macro(dst->dtype));
    const vector v = contig ? define_vector(&d, src, dst) : (vector){1, false};
    cl_kernel k;
    grid g;
    LLMCL__TRY(get_kernel(ctx, LLMCL_KEY_CAST, dst->dtype, n, &d,
                          contig ? "cast_contig" : "cast_strided", v.aligned, &k, &g,
                          llmcl__div_up(n, v.vw), 1));
    if (!contig)
        return launch_strided(ctx, k, &g, src, dst, NULL);
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, src);
    llmcl__arg_tensor(&a, dst);
    llmcl__arg_i64(&a, n);
    return llmcl__launch(&a, 1, &g.global, &g.local);
}

/* axpy and mul: y = op(x, y). */
static llmcl_status binary(llmcl_ctx *ctx, const char *op, float alpha, const llmcl_tensor *x,
                           llmcl_tensor *y)
{
    LLMCL__TRY(check_pair(ctx, x, "x", LLMCL__FLOAT_DTYPES, y, "y", LLMCL__FLOAT_DTYPES));
    LLMCL__REQUIRE(ctx, x->dtype == y->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "x is %s but y is %s; both must have one dtype", llmcl_dtype_name(x->dtype),
                   llmcl_dtype_name(y->dtype));
    const int64_t n = llmcl_tensor_numel(x);
    const bool contig = llmcl_tensor_is_contiguous(x) && llmcl_tensor_is_contiguous(y);
    llmcl__defines d = {0};
    define_dt(&d, x->dtype);
    const vector v = contig ? define_vector(&d, x, y) : (vector){1, false};
    char name[32];
    snprintf(name, sizeof name, "%s_%s", op, contig ? "contig" : "strided");
    cl_kernel k;
    grid g;
    LLMCL__TRY(
        get_kernel(ctx, op, x->dtype, n, &d, name, v.aligned, &k, &g, llmcl__div_up(n, v.vw), 1));
    if (!contig)
        return launch_strided(ctx, k, &g, x, y, &alpha);
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, x);
    llmcl__arg_tensor(&a, y);
    llmcl__arg_i64(&a, n);
    llmcl__arg_f32(&a, alpha);
    return llmcl__launch(&a, 1, &g.global, &g.local);
}

llmcl_status llmcl_axpy(llmcl_ctx *ctx, float alpha, const llmcl_tensor *x, llmcl_tensor *y)
{
    return binary(ctx, LLMCL_KEY_AXPY, alpha, x, y);
}

llmcl_status llmcl_mul(llmcl_ctx *ctx, const llmcl_tensor *x, llmcl_tensor *y)
{
    return binary(ctx, LLMCL_KEY_MUL, 0.0f, x, y);
}

/* y is exactly one row of x, whose rows do not overlap: sum_rows may then run in place. Offsets
   count elements of each tensor's own dtype, so only a y of x's dtype compares with them. */
static bool is_row_of(const llmcl_tensor *x, const llmcl_tensor *y)
{
    const int64_t d = y->offset - x->offset, stride = x->strides[0];
    return y->mem == x->mem && y->dtype == x->dtype && stride > 0 && stride >= x->shape[1] &&
           d >= 0 && d % stride == 0 && d / stride < x->shape[0];
}

/* local is one contiguous row of x's dtype and length, and y overlaps it only by being it. */
static llmcl_status check_local(llmcl_ctx *ctx, const llmcl_tensor *x, int64_t local_row,
                                const llmcl_tensor *local, const llmcl_tensor *y)
{
    LLMCL__REQUIRE(ctx, local, LLMCL_ERROR_INVALID_ARGUMENT, "local must not be NULL");
    LLMCL__REQUIRE(ctx, local_row >= 0 && local_row < x->shape[0], LLMCL_ERROR_INVALID_ARGUMENT,
                   "local_row %lld is not a row of x's %lld", (long long)local_row,
                   (long long)x->shape[0]);
    LLMCL__TRY(llmcl__check_tensor(ctx, local, "local", LLMCL__FLOAT_DTYPES, 1, 1));
    LLMCL__REQUIRE(ctx, local->dtype == x->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "local is %s but x is %s; both must have one dtype",
                   llmcl_dtype_name(local->dtype), llmcl_dtype_name(x->dtype));
    LLMCL__REQUIRE(ctx, local->shape[0] == x->shape[1], LLMCL_ERROR_SHAPE_MISMATCH,
                   "local has %lld elements but x's rows have %lld", (long long)local->shape[0],
                   (long long)x->shape[1]);
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(local), LLMCL_ERROR_INVALID_ARGUMENT,
                   "local must be contiguous");
    const bool same = local->mem == y->mem && local->offset == y->offset &&
                      local->dtype == y->dtype;
    LLMCL__REQUIRE(ctx, same || !llmcl__overlaps(local, y), LLMCL_ERROR_INVALID_ARGUMENT,
                   "y overlaps local without being it");
    return LLMCL_OK;
}

/* The sum of x's rows (row local_row from local where has_local) into y. */
static llmcl_status sum_rows(llmcl_ctx *ctx, const llmcl_tensor *x, bool has_local,
                             int64_t local_row, const llmcl_tensor *local, float beta,
                             llmcl_tensor *y)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__TRY(llmcl__check_tensor(ctx, x, "x", LLMCL__FLOAT_DTYPES, 2, 2));
    LLMCL__TRY(llmcl__check_tensor(ctx, y, "y", LLMCL__FLOAT_DTYPES, 1, 1));
    const int64_t rows = x->shape[0], n = x->shape[1];
    LLMCL__REQUIRE(ctx, y->shape[0] == n, LLMCL_ERROR_SHAPE_MISMATCH,
                   "y has %lld elements but x's rows have %lld", (long long)y->shape[0],
                   (long long)n);
    LLMCL__REQUIRE(ctx, rows >= 1 && rows <= INT32_MAX, LLMCL_ERROR_INVALID_ARGUMENT,
                   "x has %lld rows (1 to 2^31 - 1)", (long long)rows);
    LLMCL__REQUIRE(ctx, (n <= 1 || x->strides[1] == 1) && llmcl_tensor_is_contiguous(y),
                   LLMCL_ERROR_INVALID_ARGUMENT, "x's rows must be unit-stride and y contiguous");
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(x, y) || is_row_of(x, y), LLMCL_ERROR_INVALID_ARGUMENT,
                   "y overlaps x without being one of its rows");
    if (has_local)
        LLMCL__TRY(check_local(ctx, x, local_row, local, y));
    if (n == 0)
        return LLMCL_OK;
    /* each element's loop over the rows, one trip of the grid loop */
    LLMCL__TRY(llmcl__check_loops(ctx, 2 * (rows + 2), "sum_rows: %lld rows", (long long)rows));
    llmcl__defines d = {0};
    llmcl__define_str(&d, "SRC_DT", llmcl__dtype_macro(x->dtype));
    llmcl__define_str(&d, "DST_DT", llmcl__dtype_macro(y->dtype));
    cl_kernel k;
    grid g;
    LLMCL__TRY(get_kernel(ctx, LLMCL_KEY_SUM_ROWS, y->dtype, n, &d, "sum_rows", false, &k, &g,
                          llmcl__div_up(n, 4), 1 + rows));
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg_tensor(&a, x);
    llmcl__arg_i64(&a, x->strides[0]);
    llmcl__arg_i32(&a, (int32_t)rows);
    llmcl__arg_tensor(&a, has_local ? local : x);
    llmcl__arg_i32(&a, has_local ? (int32_t)local_row : -1);
    llmcl__arg_tensor(&a, y);
    llmcl__arg_i64(&a, n);
    llmcl__arg_f32(&a, beta);
    return llmcl__launch(&a, 1, &g.global, &g.local);
}

llmcl_status llmcl_sum_rows(llmcl_ctx *ctx, const llmcl_tensor *x, float beta, llmcl_tensor *y)
{
    return sum_rows(ctx, x, false, -1, NULL, beta, y);
}

llmcl_status llmcl_sum_rows_local(llmcl_ctx *ctx, const llmcl_tensor *x, int64_t local_row,
                                  const llmcl_tensor *local, float beta, llmcl_tensor *y)
{
    return sum_rows(ctx, x, true, local_row, local, beta, y);
}
