/*
 * embedding.c: the host side of embedding.cl. llmcl_embedding_forward checks every id on the
 * device before it gathers rows; llmcl_embedding_backward adds each position's gradient to its
 * id's row through one owner per row (deterministic, no atomics), in blocks of positions where
 * the device cuts long loops short.
 */
#include <limits.h>

#include "../internal.h"

/* The ids as one flat sequence: 1-D with any stride, or contiguous of any shape. */
typedef struct emb_ids {
    const llmcl_tensor *t;
    int64_t n, stride;
} emb_ids;

/* The kernels' grid: rows of positions, capped so that the second dimension fits every device. */
#define EMB_MAX_GROUPS 65535

static llmcl_status check_ids(llmcl_ctx *ctx, const llmcl_tensor *ids, emb_ids *out)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, ids, "ids", LLMCL__INT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__REQUIRE(ctx, ids->ndim == 1 || llmcl_tensor_is_contiguous(ids),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "ids must be 1-D (any stride) or contiguous to flatten into positions");
    out->t = ids;
    out->n = llmcl_tensor_numel(ids);
    out->stride = ids->ndim == 1 ? ids->strides[0] : 1;
    LLMCL__REQUIRE(ctx, out->n <= INT_MAX, LLMCL_ERROR_OVERFLOW,
                   "%lld ids: at most 2^31 - 1 positions per call", (long long)out->n);
    return LLMCL_OK;
}

/* rows of t (name) must be n rows of h unit-stride elements. */
static llmcl_status check_rows(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name, int64_t n,
                               int64_t h, llmcl__rows *rows)
{
    LLMCL__TRY(llmcl__as_rows(ctx, t, name, rows));
    LLMCL__REQUIRE(ctx, rows->n_rows == n && rows->row_len == h, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s has %lld rows of %lld; expected %lld rows (one per id) of %lld", name,
                   (long long)rows->n_rows, (long long)rows->row_len, (long long)n, (long long)h);
    LLMCL__REQUIRE(ctx, n <= 1 || rows->row_stride >= h, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: rows overlap (row stride %lld < %lld)", name, (long long)rows->row_stride,
                   (long long)h);
    return LLMCL_OK;
}

/* The kernel `name`, its work-group size *wg and (emb_bwd) the positions *list an owner lists. */
static llmcl_status emb_kernel(llmcl_ctx *ctx, const char *name, llmcl_dtype id_dt, llmcl_dtype dt,
                               int64_t h, size_t *wg, int64_t *list, cl_kernel *k)
{
    llmcl__params p = {0};
    llmcl__param_set(&p, "WG", 256);
    char cls[16];
    llmcl__shape_class(h > 0 ? h : 1, cls);
    llmcl__params_lookup(ctx, name, dt, cls, &p);
    const long w = llmcl__param_get(&p, "WG", 256);
    LLMCL__REQUIRE(ctx, w >= 1 && (size_t)w <= ctx->info.max_work_group_size,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: tuned WG %ld out of range", name, w);
    llmcl__defines d = {0};
    llmcl__define_str(&d, "ID_DT", llmcl__dtype_macro(id_dt));
    llmcl__define_str(&d, "DT", llmcl__dtype_macro(dt));
    llmcl__params_define(&p, &d);
    *wg = (size_t)w;
    *list = llmcl__param_get(&p, "LIST", 2048);
    return llmcl__kernel(ctx, LLMCL_FAMILY_EMBEDDING, &d, name, k);
}

/* Both kernels' grid: a work-item per column of a row, a row of work-groups per position. */
static int64_t grid_rows(int64_t n) { return n < EMB_MAX_GROUPS ? n : EMB_MAX_GROUPS; }

static llmcl_status launch_rows(llmcl__args *a, int64_t n, int64_t h, size_t wg)
{
    const int64_t cols = llmcl__div_up(h, (int64_t)wg);
    const size_t global[2] = {(size_t)cols * wg, (size_t)grid_rows(n)}, local[2] = {wg, 1};
    return llmcl__launch(a, 2, global, local);
}

/* Positions [p0, p0 + n) of the ids. */
static void arg_ids(llmcl__args *a, const emb_ids *ids, int64_t p0, int64_t n)
{
    const cl_ulong offset = (cl_ulong)(ids->t->offset + p0 * ids->stride);
    llmcl__arg(a, sizeof(cl_mem), &ids->t->mem);
    llmcl__arg(a, sizeof offset, &offset);
    llmcl__arg_i64(a, ids->stride);
    llmcl__arg_i64(a, n);
}

/*
 * Loop passes (llmcl__loop_budget's count) of an emb_bwd work-item over a block of p positions,
 * one a row of work-groups (p <= EMB_MAX_GROUPS): the owner check and the scan that lists the
 * id's positions (WG a pass, with emb_scan's log2 WG doublings), then its column's sum over the
 * list (8 positions a pass, two inner loops of 8, a tail) or, past `list` positions, over all of
 * them; both sides counted, as the device runs both sides of a branch.
 */
static int64_t bwd_passes(int64_t p, int64_t wg, int64_t list)
{
    int64_t doublings = 0;
    for (int64_t d = 1; d < wg; d *= 2)
        ++doublings;
    const int64_t blocks = llmcl__div_up(p, wg);
    const int64_t scans = blocks + 1 + blocks * (doublings + 2) + 1;
    const int64_t sums = list / 8 * 19 + 1 + 8 + p + 1;
    return 2 + scans + 2 + sums;
}

/*
 * The positions one emb_bwd launch may take within the device's loop budget (all n without a
 * limit): blocks of them run one after the other, each adding its sums to dweight.
 */
static llmcl_status bwd_block(llmcl_ctx *ctx, int64_t n, size_t wg, int64_t list, int64_t *block)
{
    *block = n;
    if (llmcl__loop_budget(ctx) == INT64_MAX)
        return LLMCL_OK;
    int64_t lo = 0, hi = grid_rows(n);
    while (lo < hi) { /* the largest block that fits */
        const int64_t mid = hi - (hi - lo) / 2;
        if (bwd_passes(mid, (int64_t)wg, list) <= llmcl__loop_budget(ctx))
            lo = mid;
        else
            hi = mid - 1;
    }
    *block = lo;
    if (lo > 0)
        return LLMCL_OK;
    return llmcl__check_loops(ctx, bwd_passes(1, (int64_t)wg, list),
                              "embedding backward: WG %zu, LIST %lld", wg, (long long)list);
}

/* Fails naming the first id outside [0, v) (waits for the queue). */
static llmcl_status check_ids_on_device(llmcl_ctx *ctx, const emb_ids *ids, int64_t v)
{
    const int64_t one = 1;
    llmcl_tensor *flag = NULL;
    llmcl_status st;
    cl_kernel k;
    size_t wg;
    LLMCL__TRY_GOTO(st, llmcl__scratch(ctx, LLMCL_I32, 1, &one, "embedding id check", &flag), done);
    LLMCL__TRY_GOTO(st, llmcl_fill(ctx, flag, INT_MAX), done);
    int64_t list;
    LLMCL__TRY_GOTO(st,
                    emb_kernel(ctx, LLMCL_KEY_EMB_CHECK, ids->t->dtype, LLMCL_F32, 1, &wg, &list,
                               &k),
                    done);
    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_ids(&a, ids, 0, ids->n);
    llmcl__arg_i64(&a, v);
    llmcl__arg(&a, sizeof(cl_mem), &flag->mem);
    const size_t global = (size_t)ids->n;
    LLMCL__TRY_GOTO(st, llmcl__launch(&a, 1, &global, NULL), done);
    cl_int bad = INT_MAX;
    st = llmcl_tensor_download(flag, &bad, sizeof bad);
    if (st == LLMCL_OK && bad != INT_MAX) {
        int64_t value = 0;
        llmcl_tensor *one_id = NULL;
        const int64_t shape = 1, stride = 1;
        st = llmcl_tensor_view(ids->t, 1, &shape, &stride, ids->t->offset + bad * ids->stride,
                               &one_id);
        if (st == LLMCL_OK) {
            int32_t v32 = 0;
            const bool i32 = ids->t->dtype == LLMCL_I32;
            st = llmcl_tensor_download(one_id, i32 ? (void *)&v32 : (void *)&value,
                                       i32 ? sizeof v32 : sizeof value);
            value = i32 ? v32 : value;
        }
        llmcl_tensor_destroy(one_id);
        if (st == LLMCL_OK)
            st = LLMCL__FAIL(ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                             "ids[%d] = %lld is outside [0, %lld); nothing was written", (int)bad,
                             (long long)value, (long long)v);
    }
done:
    llmcl_tensor_destroy(flag);
    return st;
}

llmcl_status llmcl_embedding_forward(llmcl_ctx *ctx, const llmcl_tensor *ids,
                                     const llmcl_tensor *weight, llmcl_tensor *out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "llmcl_embedding_forward: ctx is NULL");
    emb_ids in;
    LLMCL__TRY(check_ids(ctx, ids, &in));
    LLMCL__TRY(llmcl__check_tensor(ctx, weight, "weight", LLMCL__FLOAT_DTYPES, 2, 2));
    LLMCL__TRY(llmcl__check_tensor(ctx, out, "out", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__REQUIRE(ctx, out->dtype == weight->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "out is %s but weight is %s: they must match", llmcl_dtype_name(out->dtype),
                   llmcl_dtype_name(weight->dtype));
    llmcl__rows wr, orows;
    LLMCL__TRY(llmcl__as_rows(ctx, weight, "weight", &wr));
    LLMCL__TRY(check_rows(ctx, out, "out", in.n, wr.row_len, &orows));
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(out, weight) && !llmcl__overlaps(out, ids),
                   LLMCL_ERROR_INVALID_ARGUMENT, "out overlaps weight or ids");
    if (in.n == 0 || wr.row_len == 0)
        return LLMCL_OK;
    LLMCL__TRY(check_ids_on_device(ctx, &in, wr.n_rows));

    /* emb_fwd's loop over a row of work-groups' positions, and over the columns (one pass) */
    LLMCL__TRY(llmcl__check_loops(ctx, 3 * llmcl__div_up(in.n, grid_rows(in.n)) + 1,
                                  "embedding forward: %lld ids", (long long)in.n));
    cl_kernel k;
    size_t wg;
    int64_t list;
    LLMCL__TRY(
        emb_kernel(ctx, LLMCL_KEY_EMB_FWD, ids->dtype, weight->dtype, wr.row_len, &wg, &list, &k));
    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_ids(&a, &in, 0, in.n);
    llmcl__arg_tensor(&a, weight);
    llmcl__arg_i64(&a, wr.row_stride);
    llmcl__arg_i64(&a, wr.row_len);
    llmcl__arg_tensor(&a, out);
    llmcl__arg_i64(&a, orows.row_stride);
    return launch_rows(&a, in.n, wr.row_len, wg);
}

llmcl_status llmcl_embedding_backward(llmcl_ctx *ctx, const llmcl_tensor *ids,
                                      const llmcl_tensor *dout, llmcl_tensor *dweight)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "llmcl_embedding_backward: ctx is NULL");
    emb_ids in;
    LLMCL__TRY(check_ids(ctx, ids, &in));
    LLMCL__TRY(llmcl__check_tensor(ctx, dout, "dout", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, dweight, "dweight", 1u << LLMCL_F32, 2, 2));
    llmcl__rows wr, drows;
    LLMCL__TRY(llmcl__as_rows(ctx, dweight, "dweight", &wr));
    LLMCL__TRY(check_rows(ctx, dout, "dout", in.n, wr.row_len, &drows));
    LLMCL__REQUIRE(ctx, wr.n_rows <= 1 || wr.row_stride >= wr.row_len, LLMCL_ERROR_INVALID_ARGUMENT,
                   "dweight: rows overlap (row stride %lld < %lld)", (long long)wr.row_stride,
                   (long long)wr.row_len);
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(dweight, dout) && !llmcl__overlaps(dweight, ids),
                   LLMCL_ERROR_INVALID_ARGUMENT, "dweight overlaps dout or ids");
    if (in.n == 0 || wr.row_len == 0)
        return LLMCL_OK;
    LLMCL__TRY(check_ids_on_device(ctx, &in, wr.n_rows));

    cl_kernel k;
    size_t wg;
    int64_t list, block;
    LLMCL__TRY(
        emb_kernel(ctx, LLMCL_KEY_EMB_BWD, ids->dtype, dout->dtype, wr.row_len, &wg, &list, &k));
    LLMCL__TRY(bwd_block(ctx, in.n, wg, list, &block));
    for (int64_t p0 = 0; p0 < in.n; p0 += block) {
        const int64_t count = in.n - p0 < block ? in.n - p0 : block;
        const cl_ulong doff = (cl_ulong)(dout->offset + p0 * drows.row_stride);
        llmcl__args a = llmcl__args_begin(ctx, k);
        arg_ids(&a, &in, p0, count);
        llmcl__arg(&a, sizeof(cl_mem), &dout->mem);
        llmcl__arg(&a, sizeof doff, &doff);
        llmcl__arg_i64(&a, drows.row_stride);
        llmcl__arg_i64(&a, wr.row_len);
        llmcl__arg_tensor(&a, dweight);
        llmcl__arg_i64(&a, wr.row_stride);
        /* a work-item a column: long lists of one id are the pole, not the owner checks */
        LLMCL__TRY(launch_rows(&a, count, wr.row_len, wg));
    }
    return LLMCL_OK;
}
