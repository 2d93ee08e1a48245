/*
 * norm.c: host launchers for the norm family (src/cl/norm.cl): RMSNorm, fused residual add +
 * RMSNorm and LayerNorm, forward and backward. Each entry validates every argument first, picks
 * the kernel's geometry (work-items per row, rows per work-group, register cache, vector width)
 * from the row length and the device, lets the tuning database override it, then enqueues.
 *
 * Tuning keys (dtype = activations' dtype, shape class = llmcl__shape_class(H)):
 *   rmsnorm_fwd, residual_rmsnorm_fwd, layernorm_fwd:  WG, ROWS, CACHE
 *   rmsnorm_bwd, residual_rmsnorm_bwd, layernorm_bwd:  WG, ROWS, CACHE, GROUPS_PER_CU
 *   norm_dw_reduce:                                    FX, FY
 */
#include <limits.h>
#include <string.h>

#include "../internal.h"

#define NORM_ACT_DIMS 4
#define NORM_MAX_ACTS 4 /* activations of one call: x, residual, r, y or dy, dr, x, dx */

/*
 * The validated geometry of one call. Rows come in blocks of `inner`: row r is row r % inner of
 * block r / inner (norm.cl's ROW_OFF), each activation with its own strides (norm_rows). Leading
 * dimensions that flatten into one stride make one block: inner = n_rows.
 */
typedef struct norm_shape {
    llmcl_ctx *ctx;
    llmcl_dtype xdt, wdt;
    int64_t n_rows, inner;
    int H;
    int split;    /* the leading axis whose stride steps between blocks; -1: one block */
    bool aligned; /* every row base and w 16-byte aligned: VEC = 8 is allowed */
    int n_acts;
    const llmcl_tensor *acts[NORM_MAX_ACTS];
    const char *act_names[NORM_MAX_ACTS];
} norm_shape;

/* An activation's element strides between the rows of a block and between blocks. */
typedef struct norm_rows {
    int64_t stride, ostride;
} norm_rows;

/*
 * The leading axes after which t's rows cannot flatten: bit a where axis a's stride is not the
 * next non-unit axis's stride times its size (unit axes have no stride to keep). The last
 * dimension is the row itself.
 */
static unsigned row_breaks(const llmcl_tensor *t)
{
    unsigned breaks = 0;
    int in = -1; /* the next non-unit leading axis inwards */
    for (int i = t->ndim - 2; i >= 0; --i) {
        if (t->shape[i] == 1)
            continue;
        if (in >= 0 && t->strides[i] != t->strides[in] * t->shape[in])
            breaks |= 1u << i;
        in = i;
    }
    return breaks;
}

static int lowest_bit(unsigned v)
{
    int i = 0;
    while (!(v & 1u))
        v >>= 1, ++i;
    return i;
}

/* t's strides in the call's layout (norm_layout): a block's stride is t's own at the split. */
static norm_rows rows_of(const norm_shape *s, const llmcl_tensor *t)
{
    norm_rows r = {s->H, 0};
    for (int i = t->ndim - 2; i >= 0; --i)
        if (t->shape[i] != 1) {
            r.stride = t->strides[i];
            break;
        }
    r.ostride = s->split >= 0 ? t->strides[s->split] : s->inner * r.stride;
    return r;
}

/* A row base 16-byte aligned in every row: the offset, and each stride that is ever stepped. */
static bool aligned16(const norm_shape *s, const llmcl_tensor *t)
{
    const int64_t es = (int64_t)llmcl_dtype_size(t->dtype);
    const norm_rows r = rows_of(s, t);
    return (t->offset * es) % 16 == 0 && (s->inner == 1 || (r.stride * es) % 16 == 0) &&
           (s->inner == s->n_rows || (r.ostride * es) % 16 == 0);
}

/*
 * The call's two-level layout from all its activations (same shape, their own strides): every
 * tensor splits its leading axes where any of them breaks, one that flattens there taking its
 * stride at the split as the block stride. Breaks at two axes would need three levels.
 */
static llmcl_status norm_layout(norm_shape *s)
{
    unsigned all = 0;
    const char *first = NULL;
    for (int k = 0; k < s->n_acts; ++k) {
        const unsigned b = row_breaks(s->acts[k]);
        const char *name = s->act_names[k];
        if (b & (b - 1)) {
            return LLMCL__FAIL(s->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                               "%s (shape %s): its leading dimensions need three levels of row "
                               "strides; norm ops take one or two",
                               name, llmcl__shape_text(s->acts[k]).s);
        }
        if (b && all && b != all)
            return LLMCL__FAIL(s->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                               "%s breaks its rows after axis %d but %s after axis %d: that "
                               "needs three levels of row strides; norm ops take one or two",
                               first, lowest_bit(all), name, lowest_bit(b));
        if (b && !all)
            first = name;
        all |= b;
    }
    s->split = all ? lowest_bit(all) : -1;
    s->inner = s->n_rows;
    if (s->split >= 0) {
        const llmcl_tensor *t = s->acts[0];
        s->inner = 1;
        for (int i = s->split + 1; i < t->ndim - 1; ++i)
            s->inner *= t->shape[i];
    }
    for (int k = 0; k < s->n_acts; ++k)
        s->aligned = s->aligned && aligned16(s, s->acts[k]);
    return LLMCL_OK;
}

/* An activation: float dtype, up to 4-D, a unit-stride last dimension; recorded for the layout. */
static llmcl_status check_rows(norm_shape *s, const llmcl_tensor *t, const char *name)
{
    LLMCL__TRY(llmcl__check_tensor(s->ctx, t, name, LLMCL__FLOAT_DTYPES, 1, NORM_ACT_DIMS));
    const int last = t->ndim - 1;
    LLMCL__REQUIRE(s->ctx, t->strides[last] == 1 || t->shape[last] == 1,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: the last dimension must have unit stride (has %lld)", name,
                   (long long)t->strides[last]);
    s->acts[s->n_acts] = t;
    s->act_names[s->n_acts++] = name;
    return LLMCL_OK;
}

/* The first activation tensor fixes dtype, N and H; the others must agree. */
static llmcl_status check_first(llmcl_ctx *ctx, const llmcl_tensor *x, const char *name,
                                norm_shape *s)
{
    LLMCL__REQUIRE(ctx, ctx != NULL, LLMCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    s->ctx = ctx;
    s->n_acts = 0;
    LLMCL__TRY(check_rows(s, x, name));
    const int64_t H = x->shape[x->ndim - 1];
    int64_t n = 1;
    for (int i = 0; i < x->ndim - 1; ++i)
        n *= x->shape[i];
    LLMCL__REQUIRE(ctx, n >= 1 && H >= 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s is empty (%lld rows of %lld)", name, (long long)n, (long long)H);
    LLMCL__REQUIRE(ctx, H <= INT_MAX / 2, LLMCL_ERROR_OVERFLOW,
                   "%s: row length %lld is too long", name, (long long)H);
    s->xdt = x->dtype;
    s->n_rows = n;
    s->H = (int)H;
    s->aligned = true;
    return LLMCL_OK;
}

static llmcl_status check_act(norm_shape *s, const llmcl_tensor *t, const char *name,
                              const llmcl_tensor *x, const char *xname)
{
    LLMCL__TRY(check_rows(s, t, name));
    LLMCL__REQUIRE(s->ctx, t->dtype == s->xdt, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s is %s but %s is %s", name, llmcl_dtype_name(t->dtype), xname,
                   llmcl_dtype_name(s->xdt));
    return llmcl__check_same_shape(s->ctx, t, name, x, xname);
}

/* w, b, dw, db: 1-D [H], unit stride, f32 or the activations' dtype, all alike. */
static llmcl_status check_param(norm_shape *s, const llmcl_tensor *t, const char *name, bool first)
{
    LLMCL__TRY(llmcl__check_tensor(s->ctx, t, name, LLMCL__FLOAT_DTYPES, 1, 1));
    if (first) {
        LLMCL__REQUIRE(s->ctx, t->dtype == LLMCL_F32 || t->dtype == s->xdt,
                       LLMCL_ERROR_UNSUPPORTED_DTYPE, "%s is %s: it must be f32 or %s", name,
                       llmcl_dtype_name(t->dtype), llmcl_dtype_name(s->xdt));
        s->wdt = t->dtype;
    }
    LLMCL__REQUIRE(s->ctx, t->dtype == s->wdt, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s is %s but w is %s", name, llmcl_dtype_name(t->dtype),
                   llmcl_dtype_name(s->wdt));
    LLMCL__REQUIRE(s->ctx, t->shape[0] == s->H, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s has %lld elements but rows have H = %d", name, (long long)t->shape[0], s->H);
    LLMCL__REQUIRE(s->ctx, t->strides[0] == 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s must have unit stride (stride %lld)", name, (long long)t->strides[0]);
    s->aligned = s->aligned && (t->offset * (int64_t)llmcl_dtype_size(t->dtype)) % 16 == 0;
    return LLMCL_OK;
}

/* rstd, mean: contiguous f32 with one element per row. */
static llmcl_status check_stat(norm_shape *s, const llmcl_tensor *t, const char *name)
{
    LLMCL__TRY(llmcl__check_tensor(s->ctx, t, name, 1u << LLMCL_F32, 1, LLMCL_MAX_DIMS));
    LLMCL__REQUIRE(s->ctx, llmcl_tensor_is_contiguous(t), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s must be contiguous", name);
    LLMCL__REQUIRE(s->ctx, llmcl_tensor_numel(t) == s->n_rows, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s has %lld elements but there are %lld rows", name,
                   (long long)llmcl_tensor_numel(t), (long long)s->n_rows);
    return LLMCL_OK;
}

/* out must not overlap in, unless in-place is allowed and they are the same view. */
static llmcl_status check_disjoint(llmcl_ctx *ctx, const llmcl_tensor *out, const char *on,
                                   const llmcl_tensor *in, const char *in_name, bool in_place_ok)
{
    if (out == NULL || in == NULL)
        return LLMCL_OK;
    if (in_place_ok && llmcl__same_view(out, in))
        return LLMCL_OK;
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(out, in), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s overlaps %s%s", on, in_name,
                   in_place_ok ? " without being the same view" : "");
    return LLMCL_OK;
}

/* ---- geometry ---- */

typedef struct norm_geom {
    llmcl__params p;
    int vec;
    size_t wg, rows;
} norm_geom;

/*
 * The call's row layout (norm_layout), then the launch's shape. Heuristic defaults: about four
 * chunks per work-item (two in the backward on CPUs), so a row lives in registers; short rows
 * share a work-group (WG * ROWS about 128 work-items). On the H100 (bf16,
 * H = 4096, llmcl-tune 2026-11-22) the backward's best is WG=128 CACHE=4 with two work-groups per
 * compute unit: fewer, fuller work-items per row beat more rows in flight, as every row costs a
 * work-group reduction.
 */
static llmcl_status norm_geometry(norm_shape *s, const char *key, int cache_max, bool bwd,
                                  norm_geom *g)
{
    LLMCL__TRY(norm_layout(s));
    llmcl_ctx *ctx = s->ctx;
    const size_t max_wg = ctx->info.max_work_group_size < 1024 ? ctx->info.max_work_group_size
                                                               : 1024;
    g->vec = s->aligned && s->H >= 8 ? 8 : 1;
    const int64_t nv = llmcl__div_up(s->H, g->vec);
    const int64_t per_item = bwd && !ctx->info.is_gpu ? 2 : 4;
    size_t wg = llmcl__pow2_ceil((size_t)llmcl__div_up(nv, per_item));
    if (wg > max_wg)
        wg = max_wg;
    size_t rows = wg < 128 ? 128 / wg : 1;
    if (rows > max_wg / wg)
        rows = max_wg / wg;
    long cache = (long)llmcl__pow2_ceil((size_t)llmcl__div_up(nv, (int64_t)wg));
    if (cache > cache_max)
        cache = cache_max;

    memset(&g->p, 0, sizeof g->p);
    llmcl__param_set(&g->p, "WG", (long)wg);
    llmcl__param_set(&g->p, "ROWS", (long)rows);
    llmcl__param_set(&g->p, "CACHE", cache);
    if (bwd)
        llmcl__param_set(&g->p, "GROUPS_PER_CU", ctx->info.is_gpu ? 2 : 1);
    char cls[16];
    llmcl__shape_class(s->H, cls);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, key, s->xdt, cls, &g->p);

    long pwg = llmcl__param_get(&g->p, "WG", 0), prows = llmcl__param_get(&g->p, "ROWS", 0);
    const long pcache = llmcl__param_get(&g->p, "CACHE", 0);
    /* A file's entry of the nearest class (where H's own has none) may be for longer rows:
       work-items past this row's chunks would idle, so WG halves while half of it still covers
       the row, and ROWS doubles, so that the work-group keeps the entry's size (on the H200 the
       H 4096 entries' 128 work-items a row, halved alone, ran the rows of 2048 a row a
       work-group of 64, slower than two rows; an override is used as given). */
    while (!lookup.overridden && pwg > 32 && (pwg / 2) * pcache >= nv)
        pwg /= 2, prows *= 2;
    llmcl__param_set(&g->p, "WG", pwg);
    llmcl__param_set(&g->p, "ROWS", prows);
    llmcl__params_record(&lookup, &g->p);
    LLMCL__REQUIRE(ctx,
                   pwg >= 1 && prows >= 1 && (size_t)(pwg * prows) <= ctx->info.max_work_group_size &&
                       pcache >= 1 && pcache <= 16 &&
                       (!bwd || llmcl__param_get(&g->p, "GROUPS_PER_CU", 0) >= 1),
                   LLMCL_ERROR_TUNE_DB,
                   "%s: invalid parameters WG=%ld ROWS=%ld CACHE=%ld (max work-group %zu)", key, pwg,
                   prows, pcache, ctx->info.max_work_group_size);
    g->wg = (size_t)pwg;
    g->rows = (size_t)prows;
    return LLMCL_OK;
}

/* Kernel numbers for NORM_KERNEL in norm.cl: a build holds only the kernel it is for. */
enum { K_RMS_FWD = 1, K_RMS_BWD, K_LN_FWD, K_LN_BWD, K_DW_REDUCE };

static void norm_defines(const norm_shape *s, const norm_geom *g, int kernel, llmcl__defines *d)
{
    memset(d, 0, sizeof *d);
    llmcl__define_int(d, "NORM_KERNEL", kernel);
    llmcl__define_str(d, "X_DT", llmcl__dtype_macro(s->xdt));
    llmcl__define_str(d, "W_DT", llmcl__dtype_macro(s->wdt));
    llmcl__define_int(d, "VEC", g->vec);
    if (s->inner != s->n_rows) /* rows in blocks: norm.cl's ROW_OFF divides */
        llmcl__define_flag(d, "BLOCKS");
    llmcl__params_define(&g->p, d);
}

static void rms_defines(const llmcl_rmsnorm_options *o, llmcl__defines *d)
{
    if (o->casting == LLMCL_RMSNORM_CAST_LLAMA)
        llmcl__define_flag(d, "RMS_CAST_LLAMA");
}

static llmcl_status rms_options(llmcl_ctx *ctx, const llmcl_rmsnorm_options *opt,
                                llmcl_rmsnorm_options *o)
{
    static const llmcl_rmsnorm_options defaults = {0};
    *o = opt ? *opt : defaults;
    if (o->eps == 0.0f)
        o->eps = 1e-6f;
    LLMCL__REQUIRE(ctx, o->eps > 0.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "rmsnorm eps must be positive (%g)", (double)o->eps);
    LLMCL__REQUIRE(ctx,
                   o->casting == LLMCL_RMSNORM_CAST_LLAMA || o->casting == LLMCL_RMSNORM_CAST_GEMMA,
                   LLMCL_ERROR_INVALID_ARGUMENT, "unknown rmsnorm casting mode %d", (int)o->casting);
    return LLMCL_OK;
}

/* ---- launches ---- */

static llmcl_status launch_rows(llmcl__args *a, const norm_geom *g, size_t groups)
{
    const size_t local[2] = {g->wg, g->rows};
    const size_t global[2] = {g->wg, groups * g->rows};
    return llmcl__launch(a, 2, global, local);
}

/* An activation's arguments: buffer, offset, then its strides within and between blocks. */
static void arg_act(llmcl__args *a, const norm_shape *s, const llmcl_tensor *t)
{
    const norm_rows r = rows_of(s, t);
    llmcl__arg_tensor(a, t);
    llmcl__arg_i64(a, r.stride);
    llmcl__arg_i64(a, r.ostride);
}

/* The arguments every row kernel ends with: n_rows, inner (a block's rows), H. */
static void arg_rows(llmcl__args *a, const norm_shape *s)
{
    llmcl__arg_i64(a, s->n_rows);
    llmcl__arg_i64(a, s->inner);
    llmcl__arg_i32(a, s->H);
}

/*
 * Loop passes (llmcl__loop_budget's count) of a work-item for one row: its register-cached chunks
 * (a loop of CACHE), the chunks past the cache and the scalar tail (WG apart), and two work-group
 * sums; the backward's row slot adds the next row's prefetch. An upper bound for RMSNorm and
 * LayerNorm alike (LayerNorm's forward reads a row three times).
 */
static int64_t row_passes(const norm_shape *s, const norm_geom *g, bool bwd)
{
    const int64_t wg = (int64_t)g->wg, cache = llmcl__param_get(&g->p, "CACHE", 1);
    const int64_t nv = s->H / g->vec, tail = llmcl__div_up(s->H - nv * g->vec, wg);
    const int64_t chunks = nv > cache * wg ? llmcl__div_up(nv - cache * wg, wg) : 0;
    int64_t sum = 1; /* a work-group sum: its halvings and the exit */
    for (int64_t w = 1; w < wg; w *= 2)
        ++sum;
    if (bwd)
        return 1 + 4 * (cache + 1) + 2 * (chunks + 1) + 2 * (tail + 1) + 2 * sum;
    return 3 * (cache + 1) + 3 * (chunks + 1) + 3 * (tail + 1) + 2 * sum;
}

/* A forward row's loops within the device's loop budget (a long row with few work-items). */
static llmcl_status check_fwd_loops(const norm_shape *s, const norm_geom *g, const char *key)
{
    return llmcl__check_loops(s->ctx, row_passes(s, g, false), "%s: rows of H = %d with WG %zu",
                              key, s->H, g->wg);
}

/*
 * Work-groups of a persistent backward kernel: enough to fill the device, at most one per block;
 * and where the device cuts loops short, enough that no row slot walks more rows than its loops'
 * budget allows (the slot's set-up, its rows, its partial row's write).
 */
static llmcl_status bwd_groups(const norm_shape *s, const norm_geom *g, const char *key,
                               size_t *groups)
{
    const int64_t blocks = llmcl__div_up(s->n_rows, (int64_t)g->rows);
    const int64_t fill =
        (int64_t)s->ctx->info.compute_units * llmcl__param_get(&g->p, "GROUPS_PER_CU", 1);
    int64_t n = blocks < fill ? blocks : fill;
    const int64_t budget = llmcl__loop_budget(s->ctx);
    if (budget != INT64_MAX) {
        const int64_t cache = llmcl__param_get(&g->p, "CACHE", 1);
        const int64_t fixed = llmcl__div_up(s->H, (int64_t)g->wg) + 1 + 2 * (cache + 1) + 1;
        const int64_t per_row = row_passes(s, g, true);
        LLMCL__TRY(llmcl__check_loops(s->ctx, fixed + per_row, "%s: rows of H = %d with WG %zu",
                                      key, s->H, g->wg));
        const int64_t most = (budget - fixed) / per_row; /* rows a slot may take */
        if (llmcl__div_up(blocks, n) > most)
            n = llmcl__div_up(blocks, most);
    }
    LLMCL__REQUIRE(s->ctx, n * (int64_t)g->rows <= INT_MAX, LLMCL_ERROR_OVERFLOW,
                   "%s: %lld rows need more row slots than an int counts", key,
                   (long long)s->n_rows);
    *groups = (size_t)n;
    return LLMCL_OK;
}

/* Partial rows of the backward: H rounded up to 8 floats, so that 8-wide stores stay aligned. */
static int64_t part_stride(const norm_shape *s) { return llmcl__div_up(s->H, 8) * 8; }

typedef struct dw_reduce {
    cl_kernel kernel;
    size_t local[3], global[2]; /* the launch adds z: 1, or 2 with db */
} dw_reduce;

static llmcl_status dw_reduce_prepare(const norm_shape *s, dw_reduce *r)
{
    llmcl_ctx *ctx = s->ctx;
    llmcl__params p = {0};
    const size_t max_wg = ctx->info.max_work_group_size;
    llmcl__param_set(&p, "FX", max_wg >= 8 ? 8 : (long)max_wg);
    llmcl__param_set(&p, "FY", max_wg >= 256 ? 32 : (long)(max_wg / 8 > 0 ? max_wg / 8 : 1));
    char cls[16];
    llmcl__shape_class(s->H, cls);
    llmcl__params_lookup(ctx, LLMCL_KEY_NORM_DW_REDUCE, s->wdt, cls, &p);
    const long fx = llmcl__param_get(&p, "FX", 0), fy = llmcl__param_get(&p, "FY", 0);
    LLMCL__REQUIRE(ctx, fx >= 1 && fy >= 1 && (size_t)(fx * fy) <= max_wg, LLMCL_ERROR_TUNE_DB,
                   "norm_dw_reduce: invalid parameters FX=%ld FY=%ld (max work-group %zu)", fx, fy,
                   max_wg);
    llmcl__defines d = {0};
    llmcl__define_str(&d, "W_DT", llmcl__dtype_macro(s->wdt));
    llmcl__define_int(&d, "NORM_KERNEL", K_DW_REDUCE);
    llmcl__params_define(&p, &d);
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_NORM, &d, "norm_dw_reduce", &r->kernel));
    r->local[0] = (size_t)fx;
    r->local[1] = (size_t)fy;
    r->local[2] = 1;
    r->global[0] = (size_t)llmcl__div_up(llmcl__div_up(s->H, 4), fx) * (size_t)fx;
    r->global[1] = (size_t)fy;
    return LLMCL_OK;
}

/* Sums the slots' partial rows into dw, and with db (LayerNorm's bias) the n_slots rows after
   them into db, in one launch. */
static llmcl_status dw_reduce_launch(const norm_shape *s, const dw_reduce *r,
                                     const llmcl_tensor *part, int n_slots, llmcl_tensor *dw,
                                     llmcl_tensor *db)
{
    const size_t global[3] = {r->global[0], r->global[1], db ? 2 : 1};
    llmcl__args a = llmcl__args_begin(s->ctx, r->kernel);
    llmcl__arg_tensor(&a, part);
    llmcl__arg_i64(&a, part_stride(s));
    llmcl__arg_i32(&a, n_slots);
    llmcl__arg_i32(&a, s->H);
    llmcl__arg_tensor(&a, dw);
    llmcl__arg_tensor(&a, db ? db : dw);
    return llmcl__launch(&a, 3, global, r->local);
}

/* ---- RMSNorm ---- */

static llmcl_status rms_forward(llmcl_ctx *ctx, const llmcl_tensor *x, const llmcl_tensor *res,
                                const llmcl_tensor *w, llmcl_tensor *r, llmcl_tensor *y,
                                llmcl_tensor *rstd, const llmcl_rmsnorm_options *opt)
{
    norm_shape s;
    llmcl_rmsnorm_options o;
    LLMCL__TRY(check_first(ctx, x, "x", &s));
    LLMCL__TRY(rms_options(ctx, opt, &o));
    if (res) {
        LLMCL__TRY(check_act(&s, res, "residual", x, "x"));
        LLMCL__TRY(check_act(&s, r, "r", x, "x"));
    }
    LLMCL__TRY(check_param(&s, w, "w", true));
    LLMCL__TRY(check_act(&s, y, "y", x, "x"));
    LLMCL__TRY(check_stat(&s, rstd, "rstd"));
    if (res) {
        LLMCL__TRY(check_disjoint(ctx, r, "r", x, "x", true));
        LLMCL__TRY(check_disjoint(ctx, r, "r", res, "residual", true));
        LLMCL__TRY(check_disjoint(ctx, r, "r", w, "w", false));
        LLMCL__TRY(check_disjoint(ctx, y, "y", r, "r", false));
        LLMCL__TRY(check_disjoint(ctx, y, "y", res, "residual", true));
        LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", r, "r", false));
        LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", res, "residual", false));
    }
    LLMCL__TRY(check_disjoint(ctx, y, "y", x, "x", true));
    LLMCL__TRY(check_disjoint(ctx, y, "y", w, "w", false));
    LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", x, "x", false));
    LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", y, "y", false));
    LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", w, "w", false));

    norm_geom g;
    const char *key = res ? LLMCL_KEY_RESIDUAL_RMSNORM_FWD : LLMCL_KEY_RMSNORM_FWD;
    LLMCL__TRY(norm_geometry(&s, key, 8, false, &g));
    LLMCL__TRY(check_fwd_loops(&s, &g, key));
    llmcl__defines d;
    norm_defines(&s, &g, K_RMS_FWD, &d);
    rms_defines(&o, &d);
    if (res)
        llmcl__define_flag(&d, "HAS_RES");
    cl_kernel k;
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_NORM, &d, "rmsnorm_fwd", &k));

    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_act(&a, &s, x);
    if (res) {
        arg_act(&a, &s, res);
        arg_act(&a, &s, r);
    }
    llmcl__arg_tensor(&a, w);
    arg_act(&a, &s, y);
    llmcl__arg_tensor(&a, rstd);
    arg_rows(&a, &s);
    llmcl__arg_f32(&a, o.eps);
    llmcl__arg_f32(&a, o.offset);
    return launch_rows(&a, &g, (size_t)llmcl__div_up(s.n_rows, (int64_t)g.rows));
}

static llmcl_status rms_backward(llmcl_ctx *ctx, const llmcl_tensor *dy, const llmcl_tensor *dr,
                                 const llmcl_tensor *x, const char *xname, const llmcl_tensor *w,
                                 const llmcl_tensor *rstd, llmcl_tensor *dx, const char *dxname,
                                 llmcl_tensor *dw, const llmcl_rmsnorm_options *opt)
{
    norm_shape s;
    llmcl_rmsnorm_options o;
    LLMCL__TRY(check_first(ctx, dy, "dy", &s));
    LLMCL__TRY(rms_options(ctx, opt, &o));
    if (dr)
        LLMCL__TRY(check_act(&s, dr, "dr", dy, "dy"));
    LLMCL__TRY(check_act(&s, x, xname, dy, "dy"));
    LLMCL__TRY(check_param(&s, w, "w", true));
    LLMCL__TRY(check_stat(&s, rstd, "rstd"));
    LLMCL__TRY(check_act(&s, dx, dxname, dy, "dy"));
    LLMCL__TRY(check_param(&s, dw, "dw", false));
    LLMCL__TRY(check_disjoint(ctx, dx, dxname, dy, "dy", true));
    LLMCL__TRY(check_disjoint(ctx, dx, dxname, dr, "dr", true));
    LLMCL__TRY(check_disjoint(ctx, dx, dxname, x, xname, false));
    LLMCL__TRY(check_disjoint(ctx, dx, dxname, w, "w", false));
    LLMCL__TRY(check_disjoint(ctx, dx, dxname, rstd, "rstd", false));
    const llmcl_tensor *ins[] = {dy, dr, x, w, rstd, dx};
    const char *in_names[] = {"dy", "dr", xname, "w", "rstd", dxname};
    for (int i = 0; i < 6; ++i)
        LLMCL__TRY(check_disjoint(ctx, dw, "dw", ins[i], in_names[i], false));

    norm_geom g;
    const char *key = dr ? LLMCL_KEY_RESIDUAL_RMSNORM_BWD : LLMCL_KEY_RMSNORM_BWD;
    LLMCL__TRY(norm_geometry(&s, key, 4, true, &g));
    llmcl__defines d;
    norm_defines(&s, &g, K_RMS_BWD, &d);
    rms_defines(&o, &d);
    if (dr)
        llmcl__define_flag(&d, "HAS_DR");
    cl_kernel k;
    dw_reduce red;
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_NORM, &d, "rmsnorm_bwd", &k));
    LLMCL__TRY(dw_reduce_prepare(&s, &red));

    size_t groups;
    LLMCL__TRY(bwd_groups(&s, &g, key, &groups));
    const int n_slots = (int)(groups * g.rows);
    llmcl_tensor *part = NULL;
    const int64_t pshape[2] = {n_slots, part_stride(&s)};
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 2, pshape, "rmsnorm dw partial sums", &part));

    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_act(&a, &s, dy);
    if (dr)
        arg_act(&a, &s, dr);
    arg_act(&a, &s, x);
    llmcl__arg_tensor(&a, w);
    llmcl__arg_tensor(&a, rstd);
    arg_act(&a, &s, dx);
    llmcl__arg_tensor(&a, part);
    llmcl__arg_i64(&a, part_stride(&s));
    arg_rows(&a, &s);
    llmcl__arg_f32(&a, o.offset);
    llmcl_status st = launch_rows(&a, &g, groups);
    if (st == LLMCL_OK)
        st = dw_reduce_launch(&s, &red, part, n_slots, dw, NULL);
    llmcl_tensor_destroy(part); /* OpenCL keeps the buffer alive until the kernels finish */
    return st;
}

llmcl_status llmcl_rmsnorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x, const llmcl_tensor *w,
                                   llmcl_tensor *y, llmcl_tensor *rstd,
                                   const llmcl_rmsnorm_options *opt)
{
    return rms_forward(ctx, x, NULL, w, NULL, y, rstd, opt);
}

llmcl_status llmcl_rmsnorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy, const llmcl_tensor *x,
                                    const llmcl_tensor *w, const llmcl_tensor *rstd,
                                    llmcl_tensor *dx, llmcl_tensor *dw,
                                    const llmcl_rmsnorm_options *opt)
{
    return rms_backward(ctx, dy, NULL, x, "x", w, rstd, dx, "dx", dw, opt);
}

llmcl_status llmcl_residual_rmsnorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x,
                                            const llmcl_tensor *residual, const llmcl_tensor *w,
                                            llmcl_tensor *r, llmcl_tensor *y, llmcl_tensor *rstd,
                                            const llmcl_rmsnorm_options *opt)
{
    LLMCL__REQUIRE(ctx, residual != NULL, LLMCL_ERROR_INVALID_ARGUMENT, "residual is NULL");
    return rms_forward(ctx, x, residual, w, r, y, rstd, opt);
}

llmcl_status llmcl_residual_rmsnorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy,
                                             const llmcl_tensor *dr, const llmcl_tensor *r,
                                             const llmcl_tensor *w, const llmcl_tensor *rstd,
                                             llmcl_tensor *drx, llmcl_tensor *dw,
                                             const llmcl_rmsnorm_options *opt)
{
    return rms_backward(ctx, dy, dr, r, "r", w, rstd, drx, "drx", dw, opt);
}

/* ---- LayerNorm ---- */

llmcl_status llmcl_layernorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x, const llmcl_tensor *w,
                                     const llmcl_tensor *b, llmcl_tensor *y, llmcl_tensor *mean,
                                     llmcl_tensor *rstd, const llmcl_layernorm_options *opt)
{
    norm_shape s;
    LLMCL__TRY(check_first(ctx, x, "x", &s));
    const float eps = opt && opt->eps != 0.0f ? opt->eps : 1e-5f;
    LLMCL__REQUIRE(ctx, eps > 0.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "layernorm eps must be positive (%g)", (double)eps);
    LLMCL__TRY(check_param(&s, w, "w", true));
    if (b)
        LLMCL__TRY(check_param(&s, b, "b", false));
    LLMCL__TRY(check_act(&s, y, "y", x, "x"));
    LLMCL__TRY(check_stat(&s, mean, "mean"));
    LLMCL__TRY(check_stat(&s, rstd, "rstd"));
    LLMCL__TRY(check_disjoint(ctx, y, "y", x, "x", true));
    const llmcl_tensor *ins[] = {w, b, x, y};
    const char *in_names[] = {"w", "b", "x", "y"};
    for (int i = 0; i < 4; ++i) {
        if (i < 2)
            LLMCL__TRY(check_disjoint(ctx, y, "y", ins[i], in_names[i], false));
        LLMCL__TRY(check_disjoint(ctx, mean, "mean", ins[i], in_names[i], false));
        LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", ins[i], in_names[i], false));
    }
    LLMCL__TRY(check_disjoint(ctx, rstd, "rstd", mean, "mean", false));

    norm_geom g;
    LLMCL__TRY(norm_geometry(&s, LLMCL_KEY_LAYERNORM_FWD, 8, false, &g));
    LLMCL__TRY(check_fwd_loops(&s, &g, LLMCL_KEY_LAYERNORM_FWD));
    llmcl__defines d;
    norm_defines(&s, &g, K_LN_FWD, &d);
    if (b)
        llmcl__define_flag(&d, "HAS_B");
    cl_kernel k;
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_NORM, &d, "layernorm_fwd", &k));

    llmcl__args a = llmcl__args_begin(ctx, k);
    arg_act(&a, &s, x);
    llmcl__arg_tensor(&a, w);
    if (b)
        llmcl__arg_tensor(&a, b);
    arg_act(&a, &s, y);
    llmcl__arg_tensor(&a, mean);
    llmcl__arg_tensor(&a, rstd);
    arg_rows(&a, &s);
    llmcl__arg_f32(&a, eps);
    return launch_rows(&a, &g, (size_t)llmcl__div_up(s.n_rows, (int64_t)g.rows));
}

llmcl_status llmcl_layernorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy,
                                      const llmcl_tensor *x, const llmcl_tensor *w,
                                      const llmcl_tensor *mean, const llmcl_tensor *rstd,
                                      llmcl_tensor *dx, llmcl_tensor *dw, llmcl_tensor *db)
{
    norm_shape s;
    LLMCL__TRY(check_first(ctx, dy, "dy", &s));
    LLMCL__TRY(check_act(&s, x, "x", dy, "dy"));
    LLMCL__TRY(check_param(&s, w, "w", true));
    LLMCL__TRY(check_stat(&s, mean, "mean"));
    LLMCL__TRY(check_stat(&s, rstd, "rstd"));
    LLMCL__TRY(check_act(&s, dx, "dx", dy, "dy"));
    LLMCL__TRY(check_param(&s, dw, "dw", false));
    if (db)
        LLMCL__TRY(check_param(&s, db, "db", false));
    LLMCL__TRY(check_disjoint(ctx, dx, "dx", dy, "dy", true));
    const llmcl_tensor *ins[] = {x, w, mean, rstd};
    const char *in_names[] = {"x", "w", "mean", "rstd"};
    for (int i = 0; i < 4; ++i)
        LLMCL__TRY(check_disjoint(ctx, dx, "dx", ins[i], in_names[i], false));
    const llmcl_tensor *all[] = {dy, x, w, mean, rstd, dx};
    const char *all_names[] = {"dy", "x", "w", "mean", "rstd", "dx"};
    for (int i = 0; i < 6; ++i) {
        LLMCL__TRY(check_disjoint(ctx, dw, "dw", all[i], all_names[i], false));
        LLMCL__TRY(check_disjoint(ctx, db, "db", all[i], all_names[i], false));
    }
    LLMCL__TRY(check_disjoint(ctx, db, "db", dw, "dw", false));

    norm_geom g;
    LLMCL__TRY(norm_geometry(&s, LLMCL_KEY_LAYERNORM_BWD, 4, true, &g));
    llmcl__defines d;
    norm_defines(&s, &g, K_LN_BWD, &d);
    if (db)
        llmcl__define_flag(&d, "HAS_B");
    cl_kernel k;
    dw_reduce red;
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_NORM, &d, "layernorm_bwd", &k));
    LLMCL__TRY(dw_reduce_prepare(&s, &red));

    size_t groups;
    LLMCL__TRY(bwd_groups(&s, &g, LLMCL_KEY_LAYERNORM_BWD, &groups));
    const int n_slots = (int)(groups * g.rows);
    /* One scratch tensor: dw partials in the first n_slots rows, db partials after them. */
    llmcl_tensor *part = NULL, *dbpart = NULL;
    const int64_t ps = part_stride(&s);
    const int64_t pshape[2] = {db ? 2 * (int64_t)n_slots : n_slots, ps};
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 2, pshape, "layernorm dw/db partial sums", &part));
    llmcl_status st = LLMCL_OK;
    if (db) {
        const int64_t half[2] = {n_slots, ps};
        st = llmcl_tensor_view(part, 2, half, NULL, (int64_t)n_slots * ps, &dbpart);
    }
    if (st == LLMCL_OK) {
        llmcl__args a = llmcl__args_begin(ctx, k);
        arg_act(&a, &s, dy);
        arg_act(&a, &s, x);
        llmcl__arg_tensor(&a, w);
        llmcl__arg_tensor(&a, mean);
        llmcl__arg_tensor(&a, rstd);
        arg_act(&a, &s, dx);
        llmcl__arg_tensor(&a, part);
        llmcl__arg_i64(&a, ps);
        if (db)
            llmcl__arg_tensor(&a, dbpart);
        arg_rows(&a, &s);
        st = launch_rows(&a, &g, groups);
    }
    if (st == LLMCL_OK)
        st = dw_reduce_launch(&s, &red, part, n_slots, dw, db);
    llmcl_tensor_destroy(dbpart);
    llmcl_tensor_destroy(part);
    return st;
}
