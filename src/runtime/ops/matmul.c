/*
 * matmul.c: the host side of matmul.cl (llmcl_matmul). Checks the tensors, describes every operand
 * as an element offset and strides of op's logical shape (so transposes and views cost nothing),
 * picks the path (tensor cores, CLBlast, the portable kernel), its tiles and the K split, and
 * launches.
 */
#include <clblast_c.h>
#include <limits.h>
#include <stdio.h>

#include "../internal.h"

/* The split-K scratch stays below this unless the caller asks for the split. */
#define MM_AUTO_SPLIT_BYTES (256ull << 20)

/* mm_wgmma's default tiles, STAGES (BM + BN) 64 2 bytes of local memory (192 or 224 KiB), leave
   one group a compute unit; the K split heuristic counts two of the other kernels'. */
#define WG_RESIDENT 1
/* 256 x 192 tiles' rate against 128 x 256's with the producer warp, both by TMA (H200, 8192^3:
   716 / 797 TFLOP/s; on the H100 without the producer warp 735 / 682) */
#define WG_LARGE_RATE 0.90
#define MM_RESIDENT 2

/* An operand as the kernels see it: offset, strides of its logical (rows, cols), batch stride. */
typedef struct mm_operand {
    const llmcl_tensor *t;
    int64_t off, s0, s1, sb;
} mm_operand;

typedef struct mm_problem {
    llmcl_ctx *ctx;
    int64_t M, N, K, batch;
    mm_operand a, b, c; /* A (m, k), B (k, n), C (m, n) */
    int64_t K2;         /* the product's K continued by A2 (m, k) B2 (k, n): opts a_ext, b_ext */
    mm_operand a2, b2;
    const llmcl_tensor *cin; /* the addend that beta scales, laid out as C (NULL: C itself) */
    const llmcl_tensor *bias;
    int bias_mode; /* 0 none, 1 bias[n], 2 bias[m] */
    int64_t sbias;
    float alpha, beta;
    llmcl_matmul_opts o;
} mm_problem;

/* The last two dimensions of t (transposed with trans) and its batch stride (0 when 2-D). */
static mm_operand operand_of(const llmcl_tensor *t, int trans)
{
    const int r = t->ndim - 2;
    mm_operand o = {.t = t, .off = t->offset, .sb = t->ndim == 3 ? t->strides[0] : 0};
    int64_t rows = t->shape[r], cols = t->shape[r + 1];
    o.s0 = t->strides[r];
    o.s1 = t->strides[r + 1];
    if (trans) {
        const int64_t s = o.s0, n = rows;
        o.s0 = o.s1;
        o.s1 = s;
        rows = cols;
        cols = n;
    }
    /* a dimension of extent 1 may take any stride: give it the unit one the other lacks */
    if (rows == 1 && o.s1 != 1)
        o.s0 = 1;
    else if (cols == 1 && o.s0 != 1)
        o.s1 = 1;
    return o;
}

static int64_t rows_of(const llmcl_tensor *t, int trans) { return t->shape[t->ndim - 2 + !!trans]; }
static int64_t cols_of(const llmcl_tensor *t, int trans) { return t->shape[t->ndim - 1 - !!trans]; }

/* No two elements of t share storage (a stride 0 or interleaved dimensions would race). */
static bool distinct_elements(const llmcl_tensor *t)
{
    int order[LLMCL_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; ++i)
        if (t->shape[i] > 1)
            order[n++] = i;
    for (int i = 1; i < n; ++i) /* by stride, ascending */
        for (int j = i; j > 0 && t->strides[order[j]] < t->strides[order[j - 1]]; --j) {
            const int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    int64_t reach = 1;
    for (int i = 0; i < n; ++i) {
        if (t->strides[order[i]] < reach)
            return false;
        reach = t->strides[order[i]] * t->shape[order[i]];
    }
    return true;
}

/*
 * opts->c_in: c's dtype and shape, and either c itself or storage apart from it. It becomes p->cin
 * unless it is c's own view; the kernels read it at c's strides (copy_addend handles the rest).
 */
static llmcl_status check_addend(mm_problem *p, const llmcl_tensor *cin)
{
    llmcl_ctx *ctx = p->ctx;
    const llmcl_tensor *c = p->c.t;
    LLMCL__TRY(llmcl__check_tensor(ctx, cin, "c_in", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__REQUIRE(ctx, cin->dtype == c->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "matmul: c_in is %s but c is %s; they must share a dtype",
                   llmcl_dtype_name(cin->dtype), llmcl_dtype_name(c->dtype));
    LLMCL__TRY(llmcl__check_same_shape(ctx, cin, "matmul: c_in", c, "c"));
    if (llmcl__same_view(cin, c))
        return LLMCL_OK;
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(c, cin), LLMCL_ERROR_INVALID_ARGUMENT,
                   "matmul: c overlaps c_in; c_in must be c itself or separate storage");
    p->cin = cin;
    return LLMCL_OK;
}

/*
 * opts->a_ext and b_ext: both or neither, a's dtype, batched as a and b may be, op(a_ext) [M, K2]
 * and op(b_ext) [K2, N], apart from c. They become p->a2, p->b2 and p->K2 (0: none, as for a K2
 * of 0).
 */
static llmcl_status check_ext(mm_problem *p, const llmcl_tensor *a)
{
    llmcl_ctx *ctx = p->ctx;
    const llmcl_matmul_opts *o = &p->o;
    const llmcl_tensor *ae = o->a_ext, *be = o->b_ext, *c = p->c.t;
    LLMCL__REQUIRE(ctx, !ae == !be, LLMCL_ERROR_INVALID_ARGUMENT,
                   "matmul: a_ext and b_ext go together; %s is NULL", ae ? "b_ext" : "a_ext");
    if (!ae)
        return LLMCL_OK;
    LLMCL__TRY(llmcl__check_tensor(ctx, ae, "a_ext", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__TRY(llmcl__check_tensor(ctx, be, "b_ext", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__REQUIRE(ctx, ae->dtype == a->dtype && be->dtype == a->dtype,
                   LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "matmul: a_ext is %s and b_ext %s; they must be a's dtype %s",
                   llmcl_dtype_name(ae->dtype), llmcl_dtype_name(be->dtype),
                   llmcl_dtype_name(a->dtype));
    LLMCL__REQUIRE(ctx, (ae->ndim == 2 || (c->ndim == 3 && ae->shape[0] == p->batch)) &&
                       (be->ndim == 2 || (c->ndim == 3 && be->shape[0] == p->batch)),
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: a_ext and b_ext must have c's batch %lld (or be 2-D)",
                   (long long)p->batch);
    p->K2 = cols_of(ae, o->trans_a);
    LLMCL__REQUIRE(ctx,
                   rows_of(ae, o->trans_a) == p->M && rows_of(be, o->trans_b) == p->K2 &&
                       cols_of(be, o->trans_b) == p->N,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: op(a_ext) of %s%s and op(b_ext) of %s%s must be [M, K2] and [K2, N] "
                   "with M = %lld and N = %lld",
                   llmcl__shape_text(ae).s, o->trans_a ? "^T" : "", llmcl__shape_text(be).s,
                   o->trans_b ? "^T" : "", (long long)p->M,
                   (long long)p->N);
    LLMCL__REQUIRE(ctx, p->K2 < INT_MAX, LLMCL_ERROR_OVERFLOW,
                   "matmul: a_ext's K2 must be below 2^31");
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(c, ae) && !llmcl__overlaps(c, be),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "matmul: c overlaps %s; the output must be separate storage",
                   llmcl__overlaps(c, ae) ? "a_ext" : "b_ext");
    if (p->K2 == 0)
        return LLMCL_OK;
    p->a2 = operand_of(ae, o->trans_a);
    p->b2 = operand_of(be, o->trans_b);
    return LLMCL_OK;
}

/* opts->bias: a row (N) or column (M) vector of f32 or a's dtype; into p. */
static llmcl_status check_bias(mm_problem *p, llmcl_dtype a_dtype)
{
    llmcl_ctx *ctx = p->ctx;
    const llmcl_matmul_opts *o = &p->o;
    const llmcl_tensor *bias = o->bias;
    LLMCL__REQUIRE(ctx, o->bias_mode == LLMCL_MATMUL_BIAS_ROW || o->bias_mode == LLMCL_MATMUL_BIAS_COL,
                   LLMCL_ERROR_INVALID_ARGUMENT, "matmul: bias_mode %d is not a llmcl_matmul_bias",
                   (int)o->bias_mode);
    LLMCL__TRY(llmcl__check_tensor(ctx, bias, "bias", LLMCL__FLOAT_DTYPES, 1, 1));
    LLMCL__REQUIRE(ctx, bias->dtype == LLMCL_F32 || bias->dtype == a_dtype,
                   LLMCL_ERROR_UNSUPPORTED_DTYPE, "matmul: bias is %s; it must be f32 or %s",
                   llmcl_dtype_name(bias->dtype), llmcl_dtype_name(a_dtype));
    const int64_t want = o->bias_mode == LLMCL_MATMUL_BIAS_ROW ? p->N : p->M;
    LLMCL__REQUIRE(ctx, bias->shape[0] == want, LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: bias has %lld elements; a %s bias needs %lld",
                   (long long)bias->shape[0],
                   o->bias_mode == LLMCL_MATMUL_BIAS_ROW ? "row (N)" : "column (M)",
                   (long long)want);
    p->bias = bias;
    p->bias_mode = o->bias_mode == LLMCL_MATMUL_BIAS_ROW ? 1 : 2;
    p->sbias = bias->strides[0];
    return LLMCL_OK;
}

static llmcl_status check_problem(mm_problem *p, const llmcl_tensor *a, const llmcl_tensor *b,
                                  llmcl_tensor *c, const llmcl_matmul_opts *opts)
{
    llmcl_ctx *ctx = p->ctx;
    p->o = opts ? *opts : (llmcl_matmul_opts){0};
    const llmcl_matmul_opts *o = &p->o;
    LLMCL__TRY(llmcl__check_tensor(ctx, a, "a", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__TRY(llmcl__check_tensor(ctx, b, "b", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__TRY(llmcl__check_tensor(ctx, c, "c", LLMCL__FLOAT_DTYPES, 2, 3));
    LLMCL__REQUIRE(ctx, b->dtype == a->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "matmul: a is %s but b is %s; they must share a dtype", llmcl_dtype_name(a->dtype),
                   llmcl_dtype_name(b->dtype));
    LLMCL__REQUIRE(ctx, c->dtype == LLMCL_F32 || c->dtype == a->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "matmul: c is %s; it must be f32 or a's dtype %s", llmcl_dtype_name(c->dtype),
                   llmcl_dtype_name(a->dtype));
    LLMCL__REQUIRE(ctx,
                   (o->trans_a == 0 || o->trans_a == 1) && (o->trans_b == 0 || o->trans_b == 1) &&
                       o->split_k >= 0,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "matmul: trans_a %d and trans_b %d must be 0 or 1 and split_k %d >= 0",
                   o->trans_a, o->trans_b, o->split_k);

    p->batch = c->ndim == 3 ? c->shape[0] : 1;
    LLMCL__REQUIRE(ctx, c->ndim == 3 || (a->ndim == 2 && b->ndim == 2), LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: a batched a or b needs a batched c [batch, M, N]");
    LLMCL__REQUIRE(ctx, (a->ndim == 2 || a->shape[0] == p->batch) &&
                       (b->ndim == 2 || b->shape[0] == p->batch),
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: a and b must have c's batch %lld (or be 2-D)", (long long)p->batch);
    p->M = rows_of(a, o->trans_a);
    p->K = cols_of(a, o->trans_a);
    p->N = cols_of(b, o->trans_b);
    LLMCL__REQUIRE(ctx, rows_of(b, o->trans_b) == p->K, LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: op(a) of %s%s has K = %lld but op(b) of %s%s has %lld rows",
                   llmcl__shape_text(a).s, o->trans_a ? "^T" : "", (long long)p->K,
                   llmcl__shape_text(b).s, o->trans_b ? "^T" : "",
                   (long long)rows_of(b, o->trans_b));
    LLMCL__REQUIRE(ctx, rows_of(c, 0) == p->M && cols_of(c, 0) == p->N, LLMCL_ERROR_SHAPE_MISMATCH,
                   "matmul: c is %s; op(a) op(b) is [%lld, %lld]", llmcl__shape_text(c).s, (long long)p->M,
                   (long long)p->N);
    LLMCL__REQUIRE(ctx, p->M < INT_MAX && p->N < INT_MAX && p->K < INT_MAX && p->batch < 65536,
                   LLMCL_ERROR_OVERFLOW,
                   "matmul: M, N and K must be below 2^31 and the batch below 65536");

    if (o->bias)
        LLMCL__TRY(check_bias(p, a->dtype));
    const llmcl_tensor *ins[] = {a, b, p->bias};
    const char *names[] = {"a", "b", "bias"};
    for (int i = 0; i < 3; ++i)
        LLMCL__REQUIRE(ctx, !ins[i] || !llmcl__overlaps(c, ins[i]), LLMCL_ERROR_INVALID_ARGUMENT,
                       "matmul: c overlaps %s; the output must be separate storage", names[i]);
    LLMCL__REQUIRE(ctx, distinct_elements(c), LLMCL_ERROR_INVALID_ARGUMENT,
                   "matmul: c's strides make elements share storage");

    p->a = operand_of(a, o->trans_a);
    p->b = operand_of(b, o->trans_b);
    p->c = operand_of(c, 0);
    LLMCL__TRY(check_ext(p, a));
    if (o->sumsq) {
        LLMCL__TRY(llmcl__sumsq_check(ctx, o->sumsq));
        LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(c), LLMCL_ERROR_INVALID_ARGUMENT,
                       "matmul: opts->sumsq needs a contiguous c");
    }
    return o->c_in ? check_addend(p, o->c_in) : LLMCL_OK;
}

/* ---- launches ---- */

/* An operand of one batch entry: its buffer and offset, then its strides. */
static void arg_operand_2d(llmcl__args *g, const mm_operand *o, bool rows_first)
{
    llmcl__arg_tensor(g, o->t);
    llmcl__arg_i64(g, rows_first ? o->s0 : o->s1);
    llmcl__arg_i64(g, rows_first ? o->s1 : o->s0);
}

static void arg_operand(llmcl__args *g, const mm_operand *o, bool rows_first)
{
    arg_operand_2d(g, o, rows_first);
    llmcl__arg_i64(g, o->sb);
}

/*
 * c; with `addend` the buffer that beta scales and its offset less c's (the kernels' cin and cid,
 * c's own where p->cin is NULL); then the bias (or c's buffer in its place) and bias_mode: the
 * epilogue's arguments.
 */
static void arg_epilogue(llmcl__args *g, const mm_problem *p, bool addend)
{
    arg_operand(g, &p->c, true);
    if (addend) {
        const llmcl_tensor *cin = p->cin ? p->cin : p->c.t;
        llmcl__arg(g, sizeof cin->mem, &cin->mem);
        llmcl__arg_i64(g, cin->offset - p->c.t->offset);
    }
    llmcl__arg_tensor(g, p->bias ? p->bias : p->c.t);
    llmcl__arg_i64(g, p->sbias);
    llmcl__arg_i32(g, p->bias_mode);
}

static void base_defines(const mm_problem *p, llmcl__defines *d)
{
    llmcl__define_str(d, "DT", llmcl__dtype_macro(p->a.t->dtype));
    llmcl__define_str(d, "C_DT", llmcl__dtype_macro(p->c.t->dtype));
    llmcl__define_str(d, "BIAS_DT", llmcl__dtype_macro(p->bias ? p->bias->dtype : LLMCL_F32));
    /* without a bias, mm_wgmma's 256 x 192 epilogue fits its registers (it spilled 52 bytes) */
    llmcl__define_int(d, "MM_BIAS", p->bias != NULL);
}

/*
 * An element-wise epilogue kernel (mm_reduce with the addend, mm_bias without) with its leading
 * arguments set: c, the bias, M and N, and rvec elements of a row of c a work-item. It runs over
 * (n / rvec, m, batch) with element_launch.
 */
static llmcl_status element_kernel(const mm_problem *p, const char *name, bool addend, int rvec,
                                   llmcl__args *g)
{
    llmcl__defines d = {0};
    base_defines(p, &d);
    llmcl__define_int(&d, "RVEC", rvec);
    cl_kernel k;
    LLMCL__TRY(llmcl__kernel(p->ctx, LLMCL_FAMILY_MATMUL, &d, name, &k));
    *g = llmcl__args_begin(p->ctx, k);
    arg_epilogue(g, p, addend);
    llmcl__arg_i64(g, p->M);
    llmcl__arg_i64(g, p->N);
    return LLMCL_OK;
}

static llmcl_status element_launch(const mm_problem *p, int rvec, llmcl__args *g)
{
    const size_t global[3] = {(size_t)llmcl__div_up(p->N, rvec), (size_t)p->M, (size_t)p->batch};
    const size_t local[3] = {64, 1, 1};
    return llmcl__launch(g, 3, global, local);
}

/* Whether c's rows and the addend's are runs along n that start on multiples of k elements. */
static bool rows_aligned(const mm_problem *p, int64_t k)
{
    const int64_t cin_off = p->cin ? p->cin->offset : p->c.off;
    return p->c.s1 == 1 && p->c.off % k == 0 && p->c.s0 % k == 0 &&
           (p->batch == 1 || p->c.sb % k == 0) && cin_off % k == 0;
}

/* Launches mm_reduce over the slices in ws. */
static llmcl_status reduce_slices(const mm_problem *p, int64_t slices, const llmcl_tensor *ws)
{
    const int rvec = p->N % 4 == 0 && rows_aligned(p, 4) ? 4 : 1;
    llmcl__args g;
    LLMCL__TRY(element_kernel(p, "mm_reduce", true, rvec, &g));
    llmcl__arg_i64(&g, slices);
    llmcl__arg_i64(&g, p->batch);
    llmcl__arg_f32(&g, p->alpha);
    llmcl__arg_f32(&g, p->beta);
    llmcl__arg(&g, sizeof ws->mem, &ws->mem);
    return element_launch(p, rvec, &g);
}

/*
 * Automatic K slices for `groups` output tiles on a GPU holding `slots` work-groups at once: the
 * count with the fewest waves per slice, ceil(groups s / slots) / s, among those that leave each
 * slice at least 8 k-steps and keep the f32 scratch within MM_AUTO_SPLIT_BYTES, and only when it
 * saves a tenth of the time (the slices' sums cost a pass over the output). 176 tiles on 264
 * slots run 0.67 of a wave unsplit and exactly two waves as three slices.
 */
static int64_t auto_slices(int64_t groups, int64_t slots, int64_t ksteps, uint64_t per_slice)
{
    if (groups >= 2 * slots)
        return 1;
    int64_t best = 1;
    double best_cost = (double)llmcl__div_up(groups, slots);
    for (int64_t s = 2; s <= slots && s <= ksteps / 8; ++s) {
        if (per_slice * (uint64_t)s > MM_AUTO_SPLIT_BYTES)
            break;
        const double cost = (double)llmcl__div_up(groups * s, slots) / (double)s;
        if (cost < best_cost - 1e-9) {
            best = s;
            best_cost = cost;
        }
    }
    return best_cost < 0.9 * (double)llmcl__div_up(groups, slots) ? best : 1;
}

/* Tiles a wave holds: `resident` work-groups a compute unit times the units. */
static int64_t wave_slots(const llmcl_ctx *ctx, int resident)
{
    return resident * (int64_t)ctx->info.compute_units;
}

/*
 * K slices: the caller's split_k, or on GPUs auto_slices with `resident` work-groups a compute
 * unit; then as many more as keep each slice within max_steps k-steps (0: any), where the device
 * cuts loops short. Returns the slice length (a multiple of bk).
 */
static int64_t k_slice(const mm_problem *p, int64_t tiles, int64_t bk, int resident,
                       int64_t max_steps, int64_t *slices)
{
    const int64_t ksteps = llmcl__div_up(p->K, bk) > 0 ? llmcl__div_up(p->K, bk) : 1;
    int64_t s = p->o.split_k;
    if (p->K2 > 0) /* the second pair's slices follow the first's in one walk */
        s = 1;
    else if (s == 0)
        s = p->ctx->info.is_gpu ? auto_slices(tiles * p->batch, wave_slots(p->ctx, resident),
                                              ksteps, (uint64_t)p->batch * p->M * p->N * 4)
                                : 1;
    s = s < ksteps ? s : ksteps;
    if (max_steps > 0 && llmcl__div_up(ksteps, s) > max_steps)
        s = llmcl__div_up(ksteps, max_steps);
    const int64_t len = llmcl__div_up(ksteps, s) * bk;
    *slices = llmcl__div_up(p->K, len) > 0 ? llmcl__div_up(p->K, len) : 1;
    return len;
}

/* The cross-entropy epilogue's arguments (MM_CE_PARAMS of mm_mma and mm_wgmma). */
static void arg_ce(llmcl__args *g, const llmcl__mm_ce *ce)
{
    llmcl__arg_i32(g, ce->flags);
    llmcl__arg_f32(g, ce->cap);
    llmcl__arg_tensor(g, ce->labels);
    llmcl__arg_i64(g, ce->v0);
    llmcl__arg_i64(g, ce->ignore_index);
    const cl_mem wmem = ce->weight ? ce->weight->mem : NULL;
    llmcl__arg(g, sizeof wmem, &wmem);
    llmcl__arg_i64(g, ce->weight ? ce->weight->offset + ce->v0 : 0);
    const cl_mem bufs[4] = {ce->stats, ce->coef, ce->part, ce->xyb};
    for (int i = 0; i < 4; ++i)
        llmcl__arg(g, sizeof bufs[i], &bufs[i]);
}

/* How a product kernel's work-groups occupy the device. */
typedef struct mm_launch {
    const char *name;
    size_t wg;       /* work-items a group */
    int64_t bk;      /* k-slice: K splits are multiples of it */
    int resident;        /* groups a compute unit holds at once (0: ask the built kernel) */
    bool persistent;     /* a group walks tiles in steps of the grid (mm_wgmma) */
    const uint64_t *tma;   /* the tensor-map template of A and B (MM_TMA), 16 words, or NULL */
    const uint64_t *tma_c; /* with tma: the template of C's dtype */
    int64_t maps;        /* with tma: the 128-byte tensor maps a work-group makes */
    int64_t max_steps;   /* k-steps a slice may take within the device's loop budget; 0: any */
    int64_t sumsq_warps; /* warps a tile whose epilogue can sum squares (MM_SUMSQ); 0: none */
} mm_launch;

/* The groups of `local` bytes of local memory each that one compute unit of an NVIDIA GPU holds:
   a unit has 2 KiB more than one group may declare (local_mem_static_bytes), and each group takes
   1 KiB more than it declares. */
static uint64_t groups_by_local(const llmcl_ctx *ctx, uint64_t local)
{
    return (ctx->info.local_mem_static_bytes + 2048) / (local + 1024);
}

/*
 * The groups of kernel `name` built with defines d that one compute unit of an NVIDIA GPU holds at
 * once: as many as its local memory (groups_by_local) and its registers (CL_KERNEL_WORK_GROUP_SIZE:
 * the largest group they allow) admit, at least one.
 */
static llmcl_status kernel_resident(const mm_problem *p, const llmcl__defines *d, const char *name,
                                    size_t wg, int *resident)
{
    llmcl__defines plain = *d;
    llmcl__define_int(&plain, "SPLITK", 0);
    cl_kernel k;
    LLMCL__TRY(llmcl__kernel(p->ctx, LLMCL_FAMILY_MATMUL, &plain, name, &k));
    cl_ulong local = 0;
    size_t regs_wg = 0;
    *resident = 1;
    if (clGetKernelWorkGroupInfo(k, p->ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local,
                                 NULL) != CL_SUCCESS ||
        clGetKernelWorkGroupInfo(k, p->ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof regs_wg,
                                 &regs_wg, NULL) != CL_SUCCESS)
        return LLMCL_OK;
    const uint64_t by_local = groups_by_local(p->ctx, local);
    const uint64_t by_regs = regs_wg / wg, n = by_local < by_regs ? by_local : by_regs;
    *resident = n > 1 ? (int)n : 1;
    return LLMCL_OK;
}

/*
 * With opts->sumsq, the partials of c's squares: slots a warp and tile from *first where the
 * kernel sums them in its epilogue (fused), else a pass over c once the product is enqueued.
 */
static llmcl_status sumsq_begin(const mm_problem *p, bool fused, int64_t slots, int64_t *first)
{
    *first = 0;
    if (!p->o.sumsq)
        return LLMCL_OK;
    if (fused)
        return llmcl__sumsq_reserve(p->o.sumsq, slots, first);
    return llmcl__sumsq_fit(p->ctx, p->o.sumsq, p->c.t);
}

static llmcl_status sumsq_end(const mm_problem *p, bool fused, int64_t first, llmcl_status st)
{
    if (!p->o.sumsq)
        return st;
    if (st == LLMCL_OK && !fused)
        st = llmcl__sumsq_add(p->ctx, p->o.sumsq, p->c.t);
    if (st != LLMCL_OK && fused)
        llmcl__sumsq_release(p->o.sumsq, first);
    return st;
}

/*
 * A product kernel over (tiles, batch, slices); with more than one slice into an f32 scratch that
 * mm_reduce then finishes. A persistent kernel over one batch entry and slice gets one group per
 * resident slot, at most one per tile.
 */
static llmcl_status run_tiles(const mm_problem *p, llmcl__defines *d, const mm_launch *l,
                              int64_t tiles, const llmcl__mm_ce *ce)
{
    int resident = l->resident;
    if (resident == 0)
        LLMCL__TRY(kernel_resident(p, d, l->name, l->wg, &resident));
    int64_t slices;
    const int64_t len = k_slice(p, tiles, l->bk, resident, l->max_steps, &slices);
    /* mm_reduce's loop over the slices */
    LLMCL__TRY(llmcl__check_loops(p->ctx, slices + 1, "matmul: K = %lld in %lld slices",
                                  (long long)p->K, (long long)slices));
    const int64_t slots = wave_slots(p->ctx, resident);
    const int64_t groups =
        l->persistent && p->batch * slices == 1 && slots < tiles ? slots : tiles;
    const bool fused = p->o.sumsq && l->sumsq_warps > 0 && slices == 1;
    int64_t first;
    LLMCL__TRY(sumsq_begin(p, fused, p->batch * tiles * l->sumsq_warps, &first));
    llmcl_tensor *ws = NULL, *maps = NULL;
    llmcl_status st = LLMCL_OK;
    if (slices > 1) {
        const int64_t n = slices * p->batch * p->M * p->N;
        st = llmcl__scratch(p->ctx, LLMCL_F32, 1, &n, "matmul split-K slices", &ws);
    }
    if (st == LLMCL_OK && l->tma) {
        const int64_t n = groups * p->batch * slices * l->maps * 32;
        st = llmcl__scratch(p->ctx, LLMCL_F32, 1, &n, "matmul tensor maps", &maps);
    }
    llmcl__define_int(d, "SPLITK", slices > 1);
    if (fused)
        llmcl__define_int(d, "MM_SUMSQ", 1);
    cl_kernel k;
    if (st == LLMCL_OK)
        st = llmcl__kernel(p->ctx, LLMCL_FAMILY_MATMUL, d, l->name, &k);
    if (st == LLMCL_OK) {
        llmcl__args g = llmcl__args_begin(p->ctx, k);
        arg_operand(&g, &p->a, true);
        arg_operand(&g, &p->b, true);
        arg_epilogue(&g, p, true);
        llmcl__arg_i64(&g, p->M);
        llmcl__arg_i64(&g, p->N);
        llmcl__arg_i64(&g, p->K);
        llmcl__arg_i64(&g, len);
        llmcl__arg_f32(&g, p->alpha);
        llmcl__arg_f32(&g, p->beta);
        cl_mem wmem = ws ? ws->mem : p->c.t->mem;
        llmcl__arg(&g, sizeof wmem, &wmem);
        if (ce)
            arg_ce(&g, ce);
        if (fused) {
            llmcl__arg(&g, sizeof p->o.sumsq->slots->mem, &p->o.sumsq->slots->mem);
            llmcl__arg_i64(&g, first);
        }
        if (l->tma) {
            llmcl__arg(&g, 16 * sizeof(uint64_t), l->tma);
            llmcl__arg(&g, 16 * sizeof(uint64_t), l->tma_c);
            llmcl__arg(&g, sizeof maps->mem, &maps->mem);
        }
        if (p->K2 > 0) { /* one batch entry (ext_fused) */
            arg_operand_2d(&g, &p->a2, true);
            arg_operand_2d(&g, &p->b2, true);
            llmcl__arg_i64(&g, p->K2);
        }
        const size_t global[3] = {(size_t)groups * l->wg, (size_t)p->batch, (size_t)slices};
        const size_t local[3] = {l->wg, 1, 1};
        st = llmcl__launch(&g, 3, global, local);
    }
    if (st == LLMCL_OK && slices > 1)
        st = reduce_slices(p, slices, ws);
    llmcl_tensor_destroy(ws); /* OpenCL keeps them until the kernels are done */
    llmcl_tensor_destroy(maps);
    return sumsq_end(p, fused, first, st);
}

/*
 * The size key of a product's tuning class: max(M, N), or the thin side where one side is at most
 * 64, so that thin outputs (LoRA's) never take tiles tuned for wide products of the same length.
 */
static int64_t mm_size_key(int64_t m, int64_t n)
{
    const int64_t thin = m < n ? m : n;
    return thin <= 64 ? thin : (m > n ? m : n);
}

/*
 * The database's tiles for key over the launcher's defaults in *t (classed by mm_size_key): a file
 * entry that does not fit gives way to the defaults, with any override's values kept; a forced
 * override that does not fit is an error (so that the tuner never times a substitute).
 * *recorded (where not NULL) receives the lookup, so that the launcher can record the values it
 * settles on.
 */
static llmcl_status pick_tiles(const mm_problem *p, const char *key,
                               bool (*fits)(const llmcl_ctx *, const llmcl__params *),
                               llmcl__params *t, llmcl__tune_lookup *recorded)
{
    const llmcl__params defaults = *t;
    char cls[16], text[256] = "";
    llmcl__shape_class(mm_size_key(p->M, p->N), cls);
    llmcl__tune_lookup lookup = llmcl__params_lookup(p->ctx, key, p->a.t->dtype, cls, t);
    bool ok = fits(p->ctx, t);
    if (!ok && lookup.tuned) {
        *t = defaults;
        lookup = llmcl__params_lookup_overrides(p->ctx, key, p->a.t->dtype, cls, t);
        ok = fits(p->ctx, t);
    }
    if (recorded)
        *recorded = lookup;
    if (ok)
        return LLMCL_OK;
    size_t n = 0;
    for (int i = 0; i < t->n && n < sizeof text; ++i)
        n += (size_t)snprintf(text + n, sizeof text - n, " %s=%ld", t->names[i], t->values[i]);
    LLMCL__REQUIRE(p->ctx, !lookup.overridden, LLMCL_ERROR_UNSUPPORTED,
                   "matmul: %s tiles%s do not fit the kernel or the device", key, text);
    *t = defaults;
    llmcl__params_record(&lookup, t);
    return LLMCL_OK;
}

static bool pow2_in(long v, long lo, long hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

/* The tensor-core tiles: BM, BN, BK, WM, WN, STAGES fit the kernel and the device. */
static bool mma_tiles_ok(const llmcl_ctx *ctx, const llmcl__params *t)
{
    const long bm = llmcl__param_get(t, "BM", 0), bn = llmcl__param_get(t, "BN", 0);
    const long bk = llmcl__param_get(t, "BK", 0), wm = llmcl__param_get(t, "WM", 0);
    const long wn = llmcl__param_get(t, "WN", 0), st = llmcl__param_get(t, "STAGES", 0);
    if (!pow2_in(bm, 64, 256) || !pow2_in(bn, 64, 256) || !pow2_in(bk, 32, 64) ||
        !pow2_in(wm, 1, 8) || !pow2_in(wn, 1, 8) || st < 2 || st > 4)
        return false;
    const long wtm = bm / wm, wtn = bn / wn;
    return wtm >= 16 && wtn >= 16 && wtm % 16 == 0 && wtn % 16 == 0 &&
           (size_t)(32 * wm * wn) <= ctx->info.max_work_group_size &&
           (uint64_t)st * (bm + bn) * bk * 2 <= ctx->info.local_mem_static_bytes;
}

/* The unit-stride dimension of an operand: 1 along k, 0 along m (A) or n (B), -1 neither. */
static int unit_dim(const mm_operand *o, bool k_is_cols)
{
    if ((k_is_cols ? o->s1 : o->s0) == 1)
        return 1;
    return (k_is_cols ? o->s0 : o->s1) == 1 ? 0 : -1;
}

/*
 * cp.async moves 16-byte chunks: offset, leading stride (the one that is not the unit stride) and
 * batch stride multiples of 8 elements.
 */
static bool aligned8(const mm_operand *o, int64_t batch, int kc, bool k_is_cols)
{
    const bool unit_along_cols = kc == (int)k_is_cols;
    const int64_t ld = unit_along_cols ? o->s0 : o->s1;
    return o->off % 8 == 0 && ld % 8 == 0 && (batch == 1 || o->sb % 8 == 0);
}

/*
 * The default tiles: 256 x 128 x 64 in three stages (large; 144 KiB of local arrays, which
 * NVIDIA's OpenCL grants on sm_90) read a quarter fewer bytes from L2 per product than
 * 128 x 128 x 32, which bound the kernel: 2.74 -> 2.41 ms at 8192^3 on the H100. With A
 * transposed (a weight gradient, dY^T X), whose fragments come through ldmatrix.trans, four
 * stages of 32-deep slices ran 1.5-2% faster on the H100 (398-401 -> 404-409 TFLOP/s at Llama's
 * dW shapes); with A as stored they ran 10% slower.
 */
static void mma_default_tiles(llmcl__params *t, bool large, int a_kc)
{
    const bool shallow = large && !a_kc;
    llmcl__param_set(t, "BM", large ? 256 : 128);
    llmcl__param_set(t, "BN", 128);
    llmcl__param_set(t, "BK", large && a_kc ? 64 : 32);
    llmcl__param_set(t, "WM", large ? 4 : 2);
    llmcl__param_set(t, "WN", 2);
    llmcl__param_set(t, "STAGES", shallow ? 4 : 3);
    llmcl__param_set(t, "GROUP_M", 8);
}

/* The tuning keys of the tensor-core products: A transposed (a weight gradient) tunes apart, since
   its best tiles differ (mma_default_tiles; for wgmma, docs/TUNING.md). */
static const char *mma_key(int a_kc) { return a_kc ? LLMCL_KEY_MM_MMA : LLMCL_KEY_MM_MMA_AT; }
static const char *wgmma_key(int a_kc)
{
    return a_kc ? LLMCL_KEY_MM_WGMMA : LLMCL_KEY_MM_WGMMA_AT;
}

/* The cross-entropy epilogue's defines, where there is one. */
static void define_ce(llmcl__defines *d, const llmcl__mm_ce *ce)
{
    if (!ce)
        return;
    llmcl__define_int(d, "MM_CE", ce->epilogue);
    llmcl__define_str(d, "LABEL_DT", llmcl__dtype_macro(ce->labels->dtype));
    llmcl__define_int(d, "CE_SLOT", LLMCL__MM_CE_SLOT);
}

/* The output tiles of BM x bn (the kernels index them in 32 bits), GROUP_M checked. */
static llmcl_status mma_tiles(const mm_problem *p, const llmcl__params *t, int64_t bn,
                              int64_t *tiles)
{
    const long group_m = llmcl__param_get(t, "GROUP_M", 8);
    LLMCL__REQUIRE(p->ctx, group_m >= 1, LLMCL_ERROR_UNSUPPORTED,
                   "matmul: GROUP_M %ld must be >= 1", group_m);
    *tiles = llmcl__div_up(p->M, llmcl__param_get(t, "BM", 128)) * llmcl__div_up(p->N, bn);
    LLMCL__REQUIRE(p->ctx, *tiles < INT_MAX / 2, LLMCL_ERROR_OVERFLOW,
                   "matmul: %lld output tiles overflow the kernel's 32-bit tile index",
                   (long long)*tiles);
    return LLMCL_OK;
}

/* The defines of a tensor-core product (mm_mma or mm_wgmma) with tiles t. */
static void mma_defines(const mm_problem *p, int a_kc, int b_kc, const llmcl__mm_ce *ce,
                        const llmcl__params *t, llmcl__defines *d)
{
    base_defines(p, d);
    llmcl__define_flag(d, "MM_MMA");
    llmcl__define_int(d, "A_KC", a_kc);
    llmcl__define_int(d, "B_KC", b_kc);
    llmcl__define_int(d, "ALIGN_A", aligned8(&p->a, p->batch, a_kc, true));
    llmcl__define_int(d, "ALIGN_B", aligned8(&p->b, p->batch, b_kc, false));
    define_ce(d, ce);
    llmcl__params_define(t, d);
}

/* With a cross-entropy epilogue (ce) the default tiles only: both give warps a multiple of
   LLMCL__MM_CE_SLOT columns. */
static llmcl_status run_mma(const mm_problem *p, int a_kc, int b_kc, const llmcl__mm_ce *ce)
{
    llmcl_ctx *ctx = p->ctx;
    llmcl__params t = {0};
    /* The large tiles where they fit and the output has two waves of them */
    mma_default_tiles(&t, true, a_kc);
    if (!mma_tiles_ok(ctx, &t) || llmcl__div_up(p->M, 256) * llmcl__div_up(p->N, 128) * p->batch <
                                      2 * (int64_t)ctx->info.compute_units)
        mma_default_tiles(&t, false, a_kc);
    if (!ce)
        LLMCL__TRY(pick_tiles(p, mma_key(a_kc), mma_tiles_ok, &t, NULL));
    int64_t tiles;
    LLMCL__TRY(mma_tiles(p, &t, llmcl__param_get(&t, "BN", 128), &tiles));
    llmcl__defines d = {0};
    mma_defines(p, a_kc, b_kc, ce, &t, &d);
    const size_t wg = 32 * (size_t)llmcl__param_get(&t, "WM", 2) * llmcl__param_get(&t, "WN", 2);
    const mm_launch l = {"mm_mma", wg, llmcl__param_get(&t, "BK", 32), MM_RESIDENT, false, NULL,
                         NULL, 0, 0, 0};
    return run_tiles(p, &d, &l, tiles, ce);
}

/* Local memory of mm_wgmma's stages: STAGES 64-deep slices of A's BM rows and B's BN, 16-bit. */
static uint64_t wgmma_stage_bytes(long bm, long bn, long stages)
{
    return (uint64_t)stages * (uint64_t)(bm + bn) * 64 * 2;
}

/*
 * mm_wgmma's work-group: 64 WG_MB-row warpgroups, and with MM_WS (TMA only) the producers: a warp,
 * or beside two warpgroups of 192 accumulators a lane, or of an f32 C stored by TMA (c32 and
 * MM_TMA_STORE), a warpgroup (matmul.cl says why).
 */
static size_t wgmma_work_items(const llmcl__params *t, bool tma, bool c32)
{
    const long mb = llmcl__param_get(t, "WG_MB", 1);
    const size_t nt = (size_t)(2 * llmcl__param_get(t, "BM", 0) / mb);
    if (!tma || !llmcl__param_get(t, "MM_WS", 0))
        return nt;
    const bool wide = mb == 2 || (c32 && llmcl__param_get(t, "MM_TMA_STORE", 0));
    return nt + (nt == 256 && wide ? 128 : 32);
}

/*
 * Whether a lane of mm_wgmma's warpgroups has the registers for its WG_MB x BN / 2 accumulators
 * and the 26 that a product takes beside them (ptxas needs 154 for 64 x 256's 128): its share of
 * the work-group's (llmcl__nv_item_registers), or the 240 that a producer warpgroup leaves them
 * (matmul.cl). 192 x 256 in blocks of 64 rows with a producer warp has 128, and NVIDIA's compiler
 * refuses it. An f32 C's producer warpgroup (MM_TMA_STORE) is left out of the count: it only adds
 * registers.
 */
static bool wgmma_registers_fit(const llmcl__params *t)
{
    const long mb = llmcl__param_get(t, "WG_MB", 1), bn = llmcl__param_get(t, "BN", 0);
    const size_t items = wgmma_work_items(t, true, false);
    const long per = items - wgmma_work_items(t, false, false) == 128
                         ? 240
                         : (long)llmcl__nv_item_registers(items);
    return mb * bn / 2 + 26 <= per;
}

/*
 * wgmma's tiles: BN 64, 128, 192 or 256 columns; WG_MB blocks of 64 rows a warpgroup (1 or 2,
 * with at most 192 accumulators a lane, and registers for them: wgmma_registers_fit), one to three
 * warpgroups; 64-deep slices in STAGES (3 to 6); MM_WS, MM_TMA_STORE and MM_PRELOAD 0 or 1,
 * MM_PRELOAD -1 leaving it to the launcher (the store and the preload take effect where
 * wgmma_stores_by_tma and wgmma_preloads say).
 */
static bool wgmma_tiles_ok(const llmcl_ctx *ctx, const llmcl__params *t)
{
    const long bm = llmcl__param_get(t, "BM", 0), bn = llmcl__param_get(t, "BN", 0);
    const long mb = llmcl__param_get(t, "WG_MB", 0), st = llmcl__param_get(t, "STAGES", 0);
    const long ws = llmcl__param_get(t, "MM_WS", 0);
    const long store = llmcl__param_get(t, "MM_TMA_STORE", 0);
    const long pre = llmcl__param_get(t, "MM_PRELOAD", 0);
    return bn > 0 && bn <= 256 && bn % 64 == 0 && (mb == 1 || mb == 2) && mb * bn <= 384 &&
           bm > 0 && (ws == 0 || ws == 1) && (store == 0 || store == 1) && pre >= -1 && pre <= 1 &&
           bm % (64 * mb) == 0 && bm / (64 * mb) <= 3 && st >= 3 && st <= 6 &&
           wgmma_work_items(t, true, true) <= ctx->info.max_work_group_size &&
           wgmma_registers_fit(t) &&
           wgmma_stage_bytes(bm, bn, st) <= ctx->info.local_mem_static_bytes;
}

/*
 * mm_wgmma's default tiles, in four stages: small, 128 x 256 (two warpgroups of 64 x 256), with
 * MM_WS's producer warp where the copies are TMA's: with work-item 0 issuing the copies between
 * its products, its warpgroup stalled whenever a stage was not yet free (H200, 8192 x 2048 x 2048:
 * 0.1129 -> 0.0972 ms), and it now passes 256 x 192 (8192^3: 797 against 716 TFLOP/s). Where
 * the small tiles' epilogue stores by TMA (store: wgmma_stores_by_tma), three stages leave local
 * memory for the tile (three ran as fast as four on the H200: 0.0977 against 0.0980 ms at
 * 8192 x 2048 x 2048, 0.7255 against 0.7369 at 8192 x 16384 x 2048). Large,
 * 256 x 192 (two warpgroups of 128 x 192, 22% fewer bytes read a product), where its waves fit
 * the output far better (wgmma_large), with a producer warpgroup that gives its registers to the
 * two that multiply (setmaxnreg): on the H200 8192^3 took 1.4267 ms with it against 1.536
 * without (different calls), the weight gradient of 3072 x 2048 into f32 0.1429 against 0.1600
 * (one call); the fused cross-entropy's forward, whose epilogue runs on these tiles, ran level
 * with it (14.73 against 14.79 ms at N 8192, H 4096, one call). Without TMA the copies are
 * cp.async's, which allocate in L1, and 256 x 192's 224 KiB of stages leave L1 too small (H100:
 * 610 -> 484 TFLOP/s); the cross-entropy backward's epilogue and a biased forward one take
 * 128 x 256 (192 accumulators a lane leave them too few registers).
 */
static void wgmma_default_tiles(llmcl__params *t, bool large, bool store)
{
    llmcl__param_set(t, "BM", large ? 256 : 128);
    llmcl__param_set(t, "BN", large ? 192 : 256);
    llmcl__param_set(t, "WG_MB", large ? 2 : 1);
    llmcl__param_set(t, "STAGES", store && !large ? 3 : 4);
    llmcl__param_set(t, "GROUP_M", 8);
    llmcl__param_set(t, "MM_WS", 1);
    llmcl__param_set(t, "MM_TMA_STORE", store && !large);
    llmcl__param_set(t, "MM_PRELOAD", -1);
}

/*
 * Thin outputs, such as LoRA's rank-wide products: at most 64 columns take 128 x 64 tiles, at
 * most 64 rows 64 x 128 (64 x 64 if both), in four stages with the epilogue's stores from the
 * registers, so that the tensor cores no longer multiply zeros for most of a 256-wide tile and
 * more tiles fill the device with fewer K slices. H200, `llmcl-tune` (bf16, the whole product):
 * x A^T of 8192 x 16 x 2048 0.0416 -> 0.0217 ms, the weight gradients 2048 x 16 x 8192 0.0369 ->
 * 0.0237 and 16 x 2048 x 8192 0.0325 -> 0.0235.
 *
 * Where the long side's 64-wide tiles alone fill half the compute units and K is at most 4096,
 * the tiles are 64 x 64 in six stages, which the waves leave unsplit: these products are bound by
 * the long operand's bytes, which a K split does not lessen, while its sums cost a launch of a
 * few microseconds. Longer walks gain more from 128 x 64's larger copies in a split than they pay
 * for it. H200, 8192 x 16 x 2048: 0.0287 ms as 128 x 64 in four slices, 0.0227 as 64 x 64 in one
 * (cuBLAS 0.0171); 8192 x 16 x 8192: 0.0537 and 0.0616 (cuBLAS 0.0441).
 */
static void wgmma_thin_tiles(const mm_problem *p, llmcl__params *t)
{
    const int64_t rows = p->M, cols = p->N;
    if (rows > 64 && cols > 64)
        return;
    const int64_t long_side = rows > cols ? rows : cols;
    const bool fills_half = llmcl__div_up(long_side, 64) >= (p->ctx->info.compute_units + 1) / 2;
    const bool square = long_side <= 64 || (p->K <= 4096 && fills_half);
    llmcl__param_set(t, "BM", square || rows <= 64 ? 64 : 128);
    llmcl__param_set(t, "BN", square || cols <= 64 ? 64 : 128);
    llmcl__param_set(t, "WG_MB", 1);
    llmcl__param_set(t, "STAGES", square ? 6 : 4);
    llmcl__param_set(t, "MM_TMA_STORE", 0);
}

/*
 * The tensor-map template for TMA copies of A and B (nv_tma.c; the kernel sets each operand's
 * sizes): NULL where there is none, the operands' rows or offsets are not 16-byte aligned, or a
 * size needs more than 31 bits.
 */
static const uint64_t *tma_template(const mm_problem *p, int a_kc, int b_kc)
{
    const llmcl__tma *t = p->ctx->tma;
    if (!t || !aligned8(&p->a, p->batch, a_kc, true) || !aligned8(&p->b, p->batch, b_kc, false) ||
        p->M >= INT_MAX || p->N >= INT_MAX || p->K >= INT_MAX)
        return NULL;
    return llmcl__tma_template(t, p->a.t->dtype);
}

/* One k-step of a tile of wgmma_default_tiles(large), in 128 x 256's multiply-add time. */
static double wgmma_tile_time(bool large)
{
    llmcl__params t = {0};
    wgmma_default_tiles(&t, large, false);
    return (double)(llmcl__param_get(&t, "BM", 0) * llmcl__param_get(&t, "BN", 0)) /
           (large ? WG_LARGE_RATE : 1.0);
}

/* The time of a rows x cols output's whole waves of wgmma_default_tiles(large), a k-step each. */
static double wgmma_waves_time(const llmcl_ctx *ctx, bool large, int64_t rows, int64_t cols)
{
    llmcl__params t = {0};
    wgmma_default_tiles(&t, large, false);
    const int64_t tiles = llmcl__div_up(rows, llmcl__param_get(&t, "BM", 0)) *
                          llmcl__div_up(cols, llmcl__param_get(&t, "BN", 0));
    return (double)llmcl__div_up(tiles, wave_slots(ctx, WG_RESIDENT)) * wgmma_tile_time(large);
}

/*
 * Whether a plain rows x cols product takes mm_wgmma's large tiles (TMA only): where their whole
 * waves take less time than 128 x 256's, at WG_LARGE_RATE times their rate. On the H200 only
 * outputs that 256 x 192 fills far better do, such as a 3072 x 2048 weight gradient (132 large
 * tiles: one wave of 132; 192 small ones: two waves, 0.2311 against 0.1841 ms).
 */
static bool wgmma_large(const llmcl_ctx *ctx, int64_t rows, int64_t cols)
{
    return ctx->tma &&
           wgmma_waves_time(ctx, true, rows, cols) < wgmma_waves_time(ctx, false, rows, cols);
}

/*
 * Whether mm_wgmma takes its large tiles for a rows x cols product with this epilogue: where
 * wgmma_large says so, for plain products and a forward cross-entropy epilogue without a bias,
 * which fit 256 x 192's registers; the others spill there (ptxas: 224-1056 bytes).
 */
static bool wgmma_takes_large(const llmcl_ctx *ctx, int64_t rows, int64_t cols,
                              llmcl__mm_epilogue epilogue, bool bias)
{
    const bool fits = epilogue == LLMCL__MM_PLAIN || (epilogue == LLMCL__MM_CE_FORWARD && !bias);
    return fits && wgmma_large(ctx, rows, cols);
}

/* The epilogue of a product: plain, or ce's. */
static llmcl__mm_epilogue epilogue_of(const llmcl__mm_ce *ce)
{
    return ce ? ce->epilogue : LLMCL__MM_PLAIN;
}

/* Local memory of mm_wgmma's tiles t: the stages, and with the TMA stores the BM x BN tile. */
static uint64_t wgmma_local_bytes(const llmcl__params *t, bool store)
{
    const long bm = llmcl__param_get(t, "BM", 0), bn = llmcl__param_get(t, "BN", 0);
    return wgmma_stage_bytes(bm, bn, llmcl__param_get(t, "STAGES", 4)) +
           (store ? (uint64_t)bm * (uint64_t)bn * 2 : 0);
}

/*
 * Whether mm_wgmma's plain epilogue stores tiles inside C by TMA (MM_TMA_STORE), where it may
 * (can_store: TMA's copies, no cross-entropy epilogue): where t asks for it, C is 16-bit or, in
 * quarters of the tile's columns, f32 with BN a multiple of 128, and the stages leave local memory
 * for BM x BN 16-bit elements (and the barriers). The kernel keeps the stores from registers for a
 * split along K.
 */
static bool wgmma_stores_by_tma(const llmcl_ctx *ctx, const llmcl__params *t, bool can_store,
                                llmcl_dtype c_dtype)
{
    return can_store && llmcl__param_get(t, "MM_TMA_STORE", 1) &&
           (c_dtype != LLMCL_F32 || llmcl__param_get(t, "BN", 0) % 128 == 0) &&
           wgmma_local_bytes(t, true) + 1024 <= ctx->info.local_mem_static_bytes;
}

/*
 * Whether mm_wgmma's tiles start their accumulators from beta C_in (MM_PRELOAD, matmul.cl): where
 * alpha is 1, C's rows are runs of pairs that stay aligned in every batch entry, and t asks for it,
 * or, untuned, where each work-group takes one tile of the large ones, whose addend would
 * otherwise be read by every tile's epilogue at once, at the end. On the H200 a 3072 x 2048 x 8192
 * weight gradient into f32 with beta 1 took 0.154 ms with it against 0.166; products of several
 * tiles a work-group lost (4096 x 4096 x 8192: 0.448 against 0.377), and 128 x 256 tiles spilled.
 */
static bool wgmma_preloads(const mm_problem *p, const llmcl__mm_ce *ce, const llmcl__params *t,
                           int64_t tiles)
{
    if (ce || p->alpha != 1.0f || p->beta == 0.0f || !rows_aligned(p, 2))
        return false;
    const long asked = llmcl__param_get(t, "MM_PRELOAD", -1);
    if (asked >= 0)
        return asked == 1;
    return llmcl__param_get(t, "WG_MB", 1) == 2 && p->batch == 1 &&
           tiles <= wave_slots(p->ctx, WG_RESIDENT);
}

/* The product on Hopper's wgmma (mm_wgmma), with tiles from wgmma_default_tiles or tuning. */
static llmcl_status run_wgmma(const mm_problem *p, int a_kc, int b_kc, const llmcl__mm_ce *ce)
{
    const uint64_t *tma = tma_template(p, a_kc, b_kc);
    const bool can_store = tma && !ce;
    llmcl__params t = {0};
    wgmma_default_tiles(
        &t, wgmma_takes_large(p->ctx, p->M, p->N, epilogue_of(ce), p->bias != NULL), can_store);
    llmcl__tune_lookup lookup = {0};
    if (!ce) {
        wgmma_thin_tiles(p, &t);
        LLMCL__TRY(pick_tiles(p, wgmma_key(a_kc), wgmma_tiles_ok, &t, &lookup));
    }
    const int64_t bm = llmcl__param_get(&t, "BM", 0), bn = llmcl__param_get(&t, "BN", 0);
    const int64_t mb = llmcl__param_get(&t, "WG_MB", 1);
    int64_t tiles;
    LLMCL__TRY(mma_tiles(p, &t, bn, &tiles));
    const bool store = wgmma_stores_by_tma(p->ctx, &t, can_store, p->c.t->dtype);
    /* llmcl_tune_params_get reports what runs (the producers only with TMA's copies), but a
       preload left to the launcher stays -1, so that llmcl-tune's entries leave it so */
    llmcl__param_set(&t, "MM_TMA_STORE", store);
    llmcl__param_set(&t, "MM_WS", tma && llmcl__param_get(&t, "MM_WS", 0));
    if (p->K2 > 0)
        llmcl__param_set(&t, "MM_EXT", 1);
    const bool preload = wgmma_preloads(p, ce, &t, tiles);
    if (llmcl__param_get(&t, "MM_PRELOAD", -1) >= 0)
        llmcl__param_set(&t, "MM_PRELOAD", preload);
    llmcl__params_record(&lookup, &t);
    llmcl__param_set(&t, "MM_PRELOAD", preload);
    llmcl__defines d = {0};
    mma_defines(p, a_kc, b_kc, ce, &t, &d);
    llmcl__define_int(&d, "MM_WGMMA", 1);
    llmcl__define_int(&d, "BK", 64);
    llmcl__define_int(&d, "WM", bm / (16 * mb));
    llmcl__define_int(&d, "WN", 1);
    llmcl__define_int(&d, "MM_TMA", tma != NULL);
    const bool c32 = p->c.t->dtype == LLMCL_F32;
    const size_t wg = wgmma_work_items(&t, tma != NULL, c32);
    /* the built kernel is asked only where the stages leave local memory for a second group (a
       tuned 128 x 128 in three stages, 96 KiB; the defaults take 192 to 224 KiB): asking builds
       the unsplit kernel even for a launch split along K */
    const uint64_t local = wgmma_local_bytes(&t, store);
    const int resident = groups_by_local(p->ctx, local) > 1 ? 0 : WG_RESIDENT;
    /* A's and B's maps, A2's and B2's, and each warpgroup's of C */
    const int64_t maps = 2 + (p->K2 > 0 ? 2 : 0) + (store ? bm / (64 * mb) : 0);
    /* the warpgroups' warps sum an f32 c's squares in the epilogue (MM_SUMSQ) */
    const int64_t warps = c32 && !ce ? wgmma_work_items(&t, false, false) / 32 : 0;
    const uint64_t *tma_c = tma ? llmcl__tma_template(p->ctx->tma, p->c.t->dtype) : NULL;
    const mm_launch l = {"mm_wgmma", wg, 64, resident, true, tma, tma_c, maps, 0, warps};
    return run_tiles(p, &d, &l, tiles, ce);
}

/* wgmma where the device has it (every product measured faster, docs/PERFORMANCE.md), else
   mma.sync. */
static llmcl_status run_tensor_cores(const mm_problem *p, int a_kc, int b_kc,
                                     const llmcl__mm_ce *ce)
{
    return p->ctx->info.has_wgmma ? run_wgmma(p, a_kc, b_kc, ce) : run_mma(p, a_kc, b_kc, ce);
}

static bool tiled_ok(const llmcl_ctx *ctx, const llmcl__params *t)
{
    const long tt = llmcl__param_get(t, "T", 0), bk = llmcl__param_get(t, "BK", 0);
    const long tm = llmcl__param_get(t, "TM", 0), tn = llmcl__param_get(t, "TN", 0);
    if (tt < 1 || bk < 1 || tm < 1 || tn < 1 || tt % tm || tt % tn || bk > tt)
        return false;
    const long wg = (tt / tm) * (tt / tn);
    return wg >= tt && (size_t)wg <= ctx->info.max_work_group_size &&
           8u * (uint64_t)bk * (tt + 4) + 1024 <= ctx->info.local_mem_static_bytes;
}

/*
 * The k-steps one mm_tiled work-item may take within the device's loop budget (0: any), counted
 * as llmcl__loop_budget says: per step the step itself, the tile loads and BK multiply-adds, each
 * reading TM and TN values from local memory (LDS_RUN) into TM x TN products; and once the
 * accumulators' set-up and epilogue (TM x TN loops each) and the k loop's exit.
 */
static llmcl_status tiled_max_steps(const mm_problem *p, const llmcl__params *t, int64_t *out)
{
    const int64_t budget = llmcl__loop_budget(p->ctx);
    *out = 0;
    if (budget == INT64_MAX)
        return LLMCL_OK;
    const int64_t tt = llmcl__param_get(t, "T", 64), bk = llmcl__param_get(t, "BK", 16);
    const int64_t tm = llmcl__param_get(t, "TM", 4), tn = llmcl__param_get(t, "TN", 4);
    const int64_t twg = (tt / tm) * (tt / tn), tile = tm + 1 + tm * (tn + 1);
    const int64_t lds = (tm % 4 ? tm : tm / 4) + 1 + (tn % 4 ? tn : tn / 4) + 1;
    const int64_t fixed = 2 * tile + 1;
    const int64_t step = 1 + llmcl__div_up(tt * bk, twg) + 1 + bk + 1 + bk * (lds + tile);
    LLMCL__TRY(llmcl__check_loops(p->ctx, fixed + step, "matmul: mm_tiled with T %lld, BK %lld",
                                  (long long)tt, (long long)bk));
    *out = (budget - fixed) / step;
    return LLMCL_OK;
}

static llmcl_status run_tiled(const mm_problem *p)
{
    llmcl_ctx *ctx = p->ctx;
    llmcl__params t = {0};
    const bool gpu = ctx->info.is_gpu;
    llmcl__param_set(&t, "T", gpu ? 64 : 32);
    llmcl__param_set(&t, "BK", 16);
    llmcl__param_set(&t, "TM", 4);
    llmcl__param_set(&t, "TN", 4);
    LLMCL__TRY(pick_tiles(p, LLMCL_KEY_MM_TILED, tiled_ok, &t, NULL));
    const int64_t tt = llmcl__param_get(&t, "T", 64);
    const int64_t tiles = llmcl__div_up(p->M, tt) * llmcl__div_up(p->N, tt);
    llmcl__defines d = {0};
    base_defines(p, &d);
    llmcl__define_int(&d, "A_KC", unit_dim(&p->a, true) == 1);
    llmcl__define_int(&d, "B_KC", unit_dim(&p->b, false) == 1);
    llmcl__params_define(&t, &d);
    const size_t wg = (size_t)(tt / llmcl__param_get(&t, "TM", 4)) * (tt / llmcl__param_get(&t, "TN", 4));
    int64_t max_steps;
    LLMCL__TRY(tiled_max_steps(p, &t, &max_steps));
    const mm_launch l = {"mm_tiled", wg, llmcl__param_get(&t, "BK", 16), MM_RESIDENT, false, NULL,
                         NULL, 0, max_steps, 0};
    return run_tiles(p, &d, &l, tiles, NULL);
}

/* ---- CLBlast (f32, one matrix, row-major C) ---- */

static llmcl_status run_bias(const mm_problem *p)
{
    llmcl__args g;
    LLMCL__TRY(element_kernel(p, "mm_bias", false, 1, &g));
    return element_launch(p, 1, &g);
}

/* CLBlast's row-major view of a rows x cols operand: transposed or not, its leading dimension. */
static bool blas_view(const mm_operand *o, int64_t rows, int64_t cols, CLBlastTranspose *tr,
                      size_t *ld)
{
    if (o->s1 == 1 && o->s0 >= cols) {
        *tr = CLBlastTransposeNo;
        *ld = (size_t)o->s0;
        return true;
    }
    if (o->s0 == 1 && o->s1 >= rows) {
        *tr = CLBlastTransposeYes;
        *ld = (size_t)o->s1;
        return true;
    }
    return false;
}

/* The operands' CLBlast views: false where its layout does not allow the product. */
static bool blas_views(const mm_problem *p, CLBlastTranspose *ta, size_t *lda,
                       CLBlastTranspose *tb, size_t *ldb, size_t *ldc)
{
    CLBlastTranspose tc;
    return p->batch == 1 && blas_view(&p->a, p->M, p->K, ta, lda) &&
           blas_view(&p->b, p->K, p->N, tb, ldb) && blas_view(&p->c, p->M, p->N, &tc, ldc) &&
           tc == CLBlastTransposeNo;
}

/*
 * Where the kernels cannot read the addend in place (CLBlast, or c_in laid out unlike c):
 * c = c_in first, and beta scales c.
 */
static llmcl_status copy_addend(mm_problem *p, llmcl_tensor *c)
{
    LLMCL__TRY(llmcl_copy(p->ctx, p->cin, c));
    p->cin = NULL;
    return LLMCL_OK;
}

/*
 * Runs the product through CLBlast's SGEMM when the layout allows; *done says whether it did.
 * CLBlast scales C itself, so an addend apart from c is copied into c first.
 */
static llmcl_status run_clblast(mm_problem *p, llmcl_tensor *c, bool *done)
{
    llmcl_ctx *ctx = p->ctx;
    CLBlastTranspose ta, tb;
    size_t lda, ldb, ldc;
    *done = false;
    if (!blas_views(p, &ta, &lda, &tb, &ldb, &ldc))
        return LLMCL_OK;
    if (p->cin)
        LLMCL__TRY(copy_addend(p, c));
    cl_command_queue q = ctx->queue;
    size_t temp_bytes = 0;
    CLBlastStatusCode cs = CLBlastSGemmTempBufferSize(
        CLBlastLayoutRowMajor, ta, tb, (size_t)p->M, (size_t)p->N, (size_t)p->K, (size_t)p->a.off,
        lda, (size_t)p->b.off, ldb, (size_t)p->c.off, ldc, &q, &temp_bytes);
    llmcl_tensor *temp = NULL;
    if (cs == CLBlastSuccess && temp_bytes > 0) {
        const int64_t words = llmcl__div_up((int64_t)temp_bytes, 4);
        LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &words, "CLBlast GEMM temporary", &temp));
    }
    cl_event ev = NULL;
    if (cs == CLBlastSuccess)
        cs = CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, ta, tb, (size_t)p->M, (size_t)p->N,
                                        (size_t)p->K, p->alpha, p->a.t->mem, (size_t)p->a.off, lda,
                                        p->b.t->mem, (size_t)p->b.off, ldb, p->beta, p->c.t->mem,
                                        (size_t)p->c.off, ldc, &q, ctx->profiling ? &ev : NULL,
                                        temp ? temp->mem : NULL);
    llmcl_tensor_destroy(temp); /* OpenCL keeps it alive until the GEMM is done */
    if (cs != CLBlastSuccess) {
        if (cs > -1000)
            return llmcl__fail_cl(ctx, (cl_int)cs, "CLBlastSgemm", __FILE__, __LINE__);
        return LLMCL__FAIL(ctx, LLMCL_ERROR_UNSUPPORTED,
                           "CLBlastSgemm(%lld x %lld x %lld) failed with CLBlast status %d",
                           (long long)p->M, (long long)p->N, (long long)p->K, (int)cs);
    }
    *done = true;
    if (ctx->profiling && ev)
        LLMCL__TRY(llmcl__record_event(ctx, ev, "CLBlastSgemm"));
    return p->bias ? run_bias(p) : LLMCL_OK;
}

/* Whether products of dtype dt run on tensor cores here (mm_wgmma or mm_mma). */
static bool mma_available(const llmcl_ctx *ctx, llmcl_dtype dt)
{
    return ctx->info.has_mma && dt != LLMCL_F32;
}

llmcl__mm_plan llmcl__matmul_plan(const llmcl_ctx *ctx, llmcl_dtype dt, int64_t rows, int64_t cols,
                                  llmcl__mm_epilogue epilogue, bool bias)
{
    if (!mma_available(ctx, dt))
        return (llmcl__mm_plan){0};
    llmcl__params t = {0};
    const bool wgmma = ctx->info.has_wgmma;
    const bool large = wgmma && wgmma_takes_large(ctx, rows, cols, epilogue, bias);
    if (wgmma)
        wgmma_default_tiles(&t, large, false); /* run_wgmma's */
    else
        mma_default_tiles(&t, true, 1); /* run_mma's large tiles */
    const int64_t bm = llmcl__param_get(&t, "BM", 0), bn = llmcl__param_get(&t, "BN", 0);
    return (llmcl__mm_plan){wgmma ? "mm_wgmma" : "mm_mma", bm, bn,
                            wave_slots(ctx, wgmma ? WG_RESIDENT : MM_RESIDENT),
                            wgmma ? wgmma_tile_time(large) : (double)(bm * bn)};
}

/* Whether the addend has c's strides, which the kernels read it at. */
static bool addend_in_place(const mm_problem *p)
{
    const mm_operand in = operand_of(p->cin, 0);
    return in.s0 == p->c.s0 && in.s1 == p->c.s1 && (p->batch == 1 || in.sb == p->c.sb);
}

/*
 * Whether mm_wgmma walks the second pair after the first (MM_EXT): where it runs with TMA's
 * copies for both pairs, laid out alike, on one batch entry, with no split asked for.
 */
static bool ext_fused(const mm_problem *p, int a_kc, int b_kc)
{
    return p->ctx->info.has_wgmma && mma_available(p->ctx, p->a.t->dtype) && a_kc >= 0 &&
           b_kc >= 0 && p->batch == 1 && p->o.split_k <= 1 && p->K > 0 &&
           unit_dim(&p->a2, true) == a_kc && unit_dim(&p->b2, false) == b_kc &&
           tma_template(p, a_kc, b_kc) && aligned8(&p->a2, 1, a_kc, true) &&
           aligned8(&p->b2, 1, b_kc, false);
}

/* A checked problem on its path: with a second pair only where ext_fused says so. */
static llmcl_status run_problem(mm_problem *p, llmcl_tensor *c)
{
    if (p->beta == 0.0f)
        p->cin = NULL;
    if (p->cin && !addend_in_place(p))
        LLMCL__TRY(copy_addend(p, c));
    const llmcl_dtype dt = p->a.t->dtype;
    const int a_kc = unit_dim(&p->a, true), b_kc = unit_dim(&p->b, false);
    if (mma_available(p->ctx, dt) && a_kc >= 0 && b_kc >= 0)
        return run_tensor_cores(p, a_kc, b_kc, NULL);
    /* CLBlast's loops over K are its own: where loops are cut short, only a K that they pass
       well within the budget (on llvmpipe they ran K = 16 x 65535, failed at 4 x 10^6) */
    if (dt == LLMCL_F32 && p->o.split_k <= 1 && p->K > 0 && p->K <= llmcl__loop_budget(p->ctx)) {
        bool done;
        int64_t first;
        LLMCL__TRY(sumsq_begin(p, false, 0, &first));
        LLMCL__TRY(run_clblast(p, c, &done));
        if (done)
            return sumsq_end(p, false, 0, LLMCL_OK);
    }
    return run_tiled(p);
}

/*
 * op(x) (rows x K, or with `across` K x rows, read across) and op(x2) beside it along K, into a
 * scratch [.., rows, K + K2] whose rows run along K; 3-D where either is batched (a 2-D one then
 * repeated in every batch entry).
 */
static llmcl_status join_operand(llmcl_ctx *ctx, const mm_operand *x, const mm_operand *x2,
                                 bool across, int64_t batch, int64_t rows, int64_t K, int64_t K2,
                                 llmcl_tensor **out)
{
    const bool batched = batch > 1 && (x->sb != 0 || x2->sb != 0);
    const int nd = batched ? 3 : 2, first = batched ? 0 : 1;
    const int64_t shape[3] = {batch, rows, K + K2};
    LLMCL__TRY(llmcl__scratch(ctx, x->t->dtype, nd, shape + first, "matmul joined operand", out));
    const mm_operand *parts[2] = {x, x2};
    const int64_t widths[2] = {K, K2}, dst_strides[3] = {rows * (K + K2), K + K2, 1};
    llmcl_status st = LLMCL_OK;
    for (int i = 0; i < 2 && st == LLMCL_OK; ++i) {
        const mm_operand *o = parts[i];
        const int64_t part[3] = {batch, rows, widths[i]};
        const int64_t src_strides[3] = {o->sb, across ? o->s1 : o->s0, across ? o->s0 : o->s1};
        llmcl_tensor *src = NULL, *dst = NULL;
        if (widths[i] == 0)
            continue;
        st = llmcl_tensor_view(o->t, nd, part + first, src_strides + first, o->off, &src);
        if (st == LLMCL_OK)
            st = llmcl_tensor_view(*out, nd, part + first, dst_strides + first, i ? K : 0, &dst);
        if (st == LLMCL_OK)
            st = llmcl_copy(ctx, src, dst);
        llmcl_tensor_destroy(src);
        llmcl_tensor_destroy(dst);
    }
    if (st != LLMCL_OK) {
        llmcl_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

/*
 * The product continued along K where no kernel walks the second pair: op(a) beside op(a_ext) and
 * op(b) beside op(b_ext) in scratch, then one product over them (y = x w^T's layout), so that c
 * is rounded once and written once, as by mm_wgmma's walk.
 */
static llmcl_status run_joined(const mm_problem *p, llmcl_tensor *c)
{
    llmcl_tensor *a = NULL, *b = NULL;
    llmcl_status st = join_operand(p->ctx, &p->a, &p->a2, false, p->batch, p->M, p->K, p->K2, &a);
    if (st == LLMCL_OK)
        st = join_operand(p->ctx, &p->b, &p->b2, true, p->batch, p->N, p->K, p->K2, &b);
    if (st == LLMCL_OK) {
        llmcl_matmul_opts o = p->o;
        o.trans_a = 0;
        o.trans_b = 1;
        o.a_ext = o.b_ext = NULL;
        st = llmcl_matmul(p->ctx, p->alpha, a, b, p->beta, c, &o);
    }
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
    return st;
}

llmcl_status llmcl_matmul(llmcl_ctx *ctx, float alpha, const llmcl_tensor *a, const llmcl_tensor *b,
                          float beta, llmcl_tensor *c, const llmcl_matmul_opts *opts)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "matmul: ctx must not be NULL");
    mm_problem p = {.ctx = ctx, .alpha = alpha, .beta = beta};
    LLMCL__TRY(check_problem(&p, a, b, c, opts));
    if (p.M == 0 || p.N == 0 || p.batch == 0)
        return LLMCL_OK;
    if (p.K2 > 0 && !ext_fused(&p, unit_dim(&p.a, true), unit_dim(&p.b, false)))
        return run_joined(&p, c);
    return run_problem(&p, c);
}

/* ---- the fused cross-entropy's logits product ---- */

llmcl_status llmcl__matmul_ce(llmcl_ctx *ctx, const llmcl_tensor *a, const llmcl_tensor *b,
                              const llmcl_tensor *bias, llmcl_tensor *c, const llmcl__mm_ce *ce)
{
    mm_problem p = {.ctx = ctx, .M = a->shape[0], .N = b->shape[0], .K = a->shape[1], .batch = 1,
                    .alpha = 1.0f, .bias = bias, .bias_mode = bias ? 1 : 0,
                    .sbias = bias ? bias->strides[0] : 0, .o = {.split_k = 1}};
    p.a = operand_of(a, 0);
    p.b = operand_of(b, 1);
    /* the forward stores no C */
    p.c = operand_of(ce->epilogue == LLMCL__MM_CE_BACKWARD ? c : a, 0);
    const int a_kc = unit_dim(&p.a, true), b_kc = unit_dim(&p.b, false);
    LLMCL__REQUIRE(ctx,
                   mma_available(ctx, a->dtype) && a_kc >= 0 && b_kc >= 0 &&
                       p.M < INT_MAX && p.N < INT_MAX && p.K < INT_MAX,
                   LLMCL_ERROR_UNSUPPORTED,
                   "cross-entropy logits product: needs tensor cores, 16-bit operands with a unit "
                   "stride and sizes below 2^31");
    if (p.M == 0 || p.N == 0)
        return LLMCL_OK;
    return run_tensor_cores(&p, a_kc, b_kc, ce);
}
