/*
 * glu.c: the host side of glu.cl. llmcl_glu_forward / llmcl_glu_backward (SwiGLU, GeGLU, separate
 * or packed gate/up) and llmcl_activation_forward / llmcl_activation_backward (the activation
 * alone). Each call validates its tensors, views them as rows, picks the vector width and whether
 * rows are vector-aligned, and launches one kernel over a 2-D grid of columns x rows.
 */
#include <stdio.h>

#include "../internal.h"

/* One tensor operand as the kernels see it: buffer, element offset, row stride. */
typedef struct glu_operand {
    cl_mem mem;
    int64_t off, rs;
} glu_operand;

/* Rows of t as an operand; `shift` columns to the right (the up half of a packed tensor). */
static llmcl_status operand(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name, int64_t shift,
                            llmcl__rows *rows, glu_operand *op)
{
    LLMCL__TRY(llmcl__as_rows(ctx, t, name, rows));
    op->mem = t->mem;
    op->off = t->offset + shift;
    op->rs = rows->n_rows > 1 ? rows->row_stride : 0;
    return LLMCL_OK;
}

/* An output's rows may not overlap each other (a stride-0 or overlapping-row view is a race). */
static llmcl_status check_output_rows(llmcl_ctx *ctx, const llmcl__rows *r, const char *name)
{
    LLMCL__REQUIRE(ctx, r->n_rows <= 1 || r->row_stride >= r->row_len, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: row stride %lld is shorter than its rows (%lld): rows would overlap", name,
                   (long long)r->row_stride, (long long)r->row_len);
    return LLMCL_OK;
}

/* An output may be exactly an input (in place) or share no byte with it. */
static llmcl_status check_alias(llmcl_ctx *ctx, const llmcl_tensor *out, const char *on,
                                const llmcl_tensor *in, const char *in_name)
{
    LLMCL__REQUIRE(ctx, !in || llmcl__same_view(out, in) || !llmcl__overlaps(out, in),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s overlaps %s without being the same view (only exact in-place is allowed)",
                   on, in_name);
    return LLMCL_OK;
}

static llmcl_status check_dtype(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                const llmcl_tensor *ref, const char *ref_name)
{
    LLMCL__REQUIRE(ctx, t->dtype == ref->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s is %s but %s is %s: all GLU tensors share one dtype", name,
                   llmcl_dtype_name(t->dtype), ref_name, llmcl_dtype_name(ref->dtype));
    return LLMCL_OK;
}

/* Leading dimensions equal, last dimension of `packed` twice that of `half`. */
static llmcl_status check_packed(llmcl_ctx *ctx, const llmcl_tensor *packed, const char *pn,
                                 const llmcl_tensor *half, const char *hn)
{
    bool ok = packed->ndim == half->ndim &&
              packed->shape[packed->ndim - 1] == 2 * half->shape[half->ndim - 1];
    for (int i = 0; ok && i < packed->ndim - 1; ++i)
        ok = packed->shape[i] == half->shape[i];
    if (!ok) {
        return LLMCL__FAIL(ctx, LLMCL_ERROR_SHAPE_MISMATCH,
                           "packed %s %s must be %s %s with its last dimension doubled (gate | up)",
                           pn, llmcl__shape_text(packed).s, hn, llmcl__shape_text(half).s);
    }
    return LLMCL_OK;
}

static llmcl_status check_act(llmcl_ctx *ctx, llmcl_activation act)
{
    LLMCL__REQUIRE(ctx,
                   act == LLMCL_ACT_SILU || act == LLMCL_ACT_GELU_TANH || act == LLMCL_ACT_GELU_ERF,
                   LLMCL_ERROR_INVALID_ARGUMENT, "act %d is not an llmcl_activation", (int)act);
    return LLMCL_OK;
}

/*
 * Where the device cuts loops short, at least as many column groups (of all0) as keep a
 * work-item's loops within the budget (llmcl__loop_budget's count): its trips over the rows
 * (row_items apart), and in each its trips over the columns, each with UNROLL loads and updates,
 * element loops of VEC where rows are not vector-aligned (up to five operands) and the row's tail.
 */
static llmcl_status fit_loops(llmcl_ctx *ctx, const char *key, int64_t n_rows, int64_t row_items,
                              int64_t all0, long unroll, long vec, int64_t *groups0)
{
    const int64_t budget = llmcl__loop_budget(ctx);
    if (budget == INT64_MAX)
        return LLMCL_OK;
    const int64_t rows = llmcl__div_up(n_rows, row_items);
    const int64_t trip = 1 + 2 * (unroll + 1) + unroll * (5 * (vec + 1) + vec + 1);
    const int64_t most = ((budget - 1) / rows - 2) / trip; /* column trips a row may take */
    LLMCL__TRY(llmcl__check_loops(ctx, rows * (2 + trip) + 1, "%s: %lld rows", key,
                                  (long long)n_rows));
    if (llmcl__div_up(all0, *groups0) > most)
        *groups0 = llmcl__div_up(all0, most);
    return LLMCL_OK;
}

/* The launch's tunables: the defaults, then a tuning entry for the row length; checked, with VEC
   and UNROLL returned. */
static llmcl_status glu_params(llmcl_ctx *ctx, const char *key, llmcl_dtype dtype, int64_t cols,
                               llmcl__params *p, long *vec, long *unroll)
{
    /* NVIDIA (measured on an H100, docs/PERFORMANCE.md): groups of 128 and streaming stores move
     * 3.0 TB/s on SwiGLU forward where 256 and plain stores move 2.96. */
    const bool nv = ctx->info.vendor_id == LLMCL_VENDOR_NVIDIA;
    llmcl__param_set(p, "WG", nv ? 128 : 256);
    llmcl__param_set(p, "VEC", dtype == LLMCL_F32 ? 4 : 8);
    llmcl__param_set(p, "UNROLL", 1);
    llmcl__param_set(p, "HINT", nv ? 2 : 0);
    char cls[16];
    llmcl__shape_class(cols, cls);
    llmcl__params_lookup(ctx, key, dtype, cls, p);
    *vec = llmcl__param_get(p, "VEC", 4);
    *unroll = llmcl__param_get(p, "UNROLL", 1);
    const long hint = llmcl__param_get(p, "HINT", 0);
    LLMCL__REQUIRE(ctx,
                   (*vec == 1 || *vec == 2 || *vec == 4 || *vec == 8) && *unroll >= 1 &&
                       *unroll <= 8 && hint >= 0 && hint <= 3,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: tuned VEC %ld, UNROLL %ld or HINT %ld out of range",
                   key, *vec, *unroll, hint);
    return LLMCL_OK;
}

/* The rows as the kernel walks them, and what the operands allow it to assume. */
typedef struct glu_layout {
    int64_t n_rows, cols;
    bool aligned, noalias;
} glu_layout;

/*
 * Rows that follow each other in every operand make one long row (a flat 1-D launch; their row
 * strides become 0). Aligned: every row starts on a vector; noalias: no output is an input.
 */
static glu_layout layout_of(glu_operand *ops, int n_ops, int n_in, int64_t n_rows, int64_t cols,
                            long vec)
{
    glu_layout l = {.n_rows = n_rows, .cols = cols, .noalias = true};
    bool flat = n_rows > 1;
    for (int i = 0; i < n_ops; ++i)
        flat = flat && ops[i].rs == cols;
    if (flat) {
        l.cols *= n_rows;
        l.n_rows = 1;
        for (int i = 0; i < n_ops; ++i)
            ops[i].rs = 0;
    }
    l.aligned = l.cols % vec == 0;
    for (int i = 0; i < n_ops; ++i) {
        l.aligned = l.aligned && ops[i].off % vec == 0 && ops[i].rs % vec == 0;
        for (int j = n_in; i < n_in && j < n_ops; ++j)
            l.noalias = l.noalias && ops[i].mem != ops[j].mem;
    }
    return l;
}

static llmcl_status glu_build(llmcl_ctx *ctx, const char *kname, llmcl_activation act,
                              bool has_up, llmcl_dtype dtype, const glu_layout *l, long vec,
                              const llmcl__params *p, cl_kernel *kernel)
{
    llmcl__defines d = {0};
    llmcl__define_str(&d, "DT", llmcl__dtype_macro(dtype));
    llmcl__define_int(&d, "ACT", (long long)act);
    llmcl__define_int(&d, "HAS_UP", has_up);
    llmcl__define_int(&d, "ALIGNED", l->aligned);
    llmcl__define_int(&d, "NOALIAS", l->noalias);
    llmcl__define_int(&d, "RAW16", l->aligned && vec == 8);
    llmcl__define_int(&d, "FAST", dtype != LLMCL_F32);
    llmcl__params_define(p, &d);
    return llmcl__kernel(ctx, LLMCL_FAMILY_GLU, &d, kname, kernel);
}

/*
 * Work-groups of wg work-items, columns first: narrow rows leave room for several rows. Beyond
 * 2048 groups a compute unit over columns, or 65535 over rows (some devices cap the second
 * dimension), the kernel strides over the grid; where loops are cut short, fit_loops widens it.
 */
static llmcl_status glu_grid(llmcl_ctx *ctx, const char *key, const glu_layout *l, size_t wg,
                             long vec, long unroll, size_t local[2], size_t global[2])
{
    const int64_t slots = l->cols / vec + (l->cols % vec ? 1 : 0);
    size_t l0 = llmcl__pow2_ceil((size_t)llmcl__div_up(slots, unroll));
    if (l0 > wg)
        l0 = wg;
    size_t l1 = wg / l0;
    if ((int64_t)l1 > l->n_rows)
        l1 = (size_t)l->n_rows;
    const int64_t all0 = llmcl__div_up(slots, (int64_t)l0 * unroll);
    int64_t groups0 = all0;
    const int64_t max_groups0 =
        (int64_t)(ctx->info.compute_units ? ctx->info.compute_units : 1) * 2048;
    if (groups0 > max_groups0)
        groups0 = max_groups0;
    int64_t groups1 = llmcl__div_up(l->n_rows, (int64_t)l1);
    if (groups1 > 65535)
        groups1 = 65535;
    LLMCL__TRY(fit_loops(ctx, key, l->n_rows, (int64_t)groups1 * l1, all0, unroll, vec, &groups0));
    local[0] = l0;
    local[1] = l1;
    global[0] = (size_t)groups0 * l0;
    global[1] = (size_t)groups1 * l1;
    return LLMCL_OK;
}

/*
 * Launches glu_fwd (3 operands: g, u, o) or glu_bwd (5: dy, g, u, dg, du) over n_rows x cols;
 * the first n_in operands are inputs, the rest outputs. Unused operands repeat a used one.
 */
static llmcl_status glu_launch(llmcl_ctx *ctx, const char *key, const char *kname,
                               llmcl_activation act, bool has_up, llmcl_dtype dtype,
                               glu_operand *ops, int n_ops, int n_in, int64_t n_rows, int64_t cols)
{
    if (n_rows == 0 || cols == 0)
        return LLMCL_OK;
    llmcl__params p = {0};
    long vec, unroll;
    LLMCL__TRY(glu_params(ctx, key, dtype, cols, &p, &vec, &unroll));
    const glu_layout l = layout_of(ops, n_ops, n_in, n_rows, cols, vec);
    cl_kernel kernel;
    LLMCL__TRY(glu_build(ctx, kname, act, has_up, dtype, &l, vec, &p, &kernel));
    const size_t wg = llmcl__kernel_wg_cap(ctx, kernel, (size_t)llmcl__param_get(&p, "WG", 256));
    size_t local[2], global[2];
    LLMCL__TRY(glu_grid(ctx, key, &l, wg, vec, unroll, local, global));

    llmcl__args a = llmcl__args_begin(ctx, kernel);
    for (int i = 0; i < n_ops; ++i) {
        const cl_ulong off = (cl_ulong)ops[i].off;
        llmcl__arg(&a, sizeof(cl_mem), &ops[i].mem);
        llmcl__arg(&a, sizeof off, &off);
        llmcl__arg_i64(&a, ops[i].rs);
    }
    llmcl__arg_i64(&a, l.n_rows);
    llmcl__arg_i64(&a, l.cols);
    return llmcl__launch(&a, 2, global, local);
}

llmcl_status llmcl_glu_forward(llmcl_ctx *ctx, llmcl_activation act, const llmcl_tensor *gate,
                               const llmcl_tensor *up, llmcl_tensor *out)
{
    if (!ctx)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_INVALID_ARGUMENT, "llmcl_glu_forward: ctx is NULL");
    LLMCL__TRY(check_act(ctx, act));
    LLMCL__TRY(llmcl__check_tensor(ctx, gate, "gate", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, out, "out", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(check_dtype(ctx, out, "out", gate, "gate"));
    if (up) {
        LLMCL__TRY(llmcl__check_tensor(ctx, up, "up", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
        LLMCL__TRY(check_dtype(ctx, up, "up", gate, "gate"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, gate, "gate", up, "up"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, gate, "gate", out, "out"));
    } else {
        LLMCL__TRY(check_packed(ctx, gate, "gate", out, "out"));
    }

    const int64_t cols = out->shape[out->ndim - 1];
    llmcl__rows rg, ru, ro;
    glu_operand ops[3];
    LLMCL__TRY(operand(ctx, gate, "gate", 0, &rg, &ops[0]));
    if (up)
        LLMCL__TRY(operand(ctx, up, "up", 0, &ru, &ops[1]));
    else
        LLMCL__TRY(operand(ctx, gate, "gate", cols, &ru, &ops[1]));
    LLMCL__TRY(operand(ctx, out, "out", 0, &ro, &ops[2]));
    LLMCL__TRY(check_output_rows(ctx, &ro, "out"));
    LLMCL__TRY(check_alias(ctx, out, "out", gate, "gate"));
    LLMCL__TRY(check_alias(ctx, out, "out", up, "up"));
    return glu_launch(ctx, LLMCL_KEY_GLU_FWD, "glu_fwd", act, true, out->dtype, ops, 3, 2,
                      ro.n_rows, cols);
}

llmcl_status llmcl_glu_backward(llmcl_ctx *ctx, llmcl_activation act, const llmcl_tensor *dout,
                                const llmcl_tensor *gate, const llmcl_tensor *up,
                                llmcl_tensor *dgate, llmcl_tensor *dup)
{
    if (!ctx)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_INVALID_ARGUMENT, "llmcl_glu_backward: ctx is NULL");
    LLMCL__TRY(check_act(ctx, act));
    LLMCL__TRY(llmcl__check_tensor(ctx, dout, "dout", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, gate, "gate", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, dgate, "dgate", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(check_dtype(ctx, gate, "gate", dout, "dout"));
    LLMCL__TRY(check_dtype(ctx, dgate, "dgate", dout, "dout"));
    LLMCL__REQUIRE(ctx, !up == !dup, LLMCL_ERROR_INVALID_ARGUMENT,
                   "up is %s but dup is %s: pass both (separate) or neither (packed gate)",
                   up ? "set" : "NULL", dup ? "set" : "NULL");
    if (up) {
        LLMCL__TRY(llmcl__check_tensor(ctx, up, "up", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
        LLMCL__TRY(llmcl__check_tensor(ctx, dup, "dup", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
        LLMCL__TRY(check_dtype(ctx, up, "up", dout, "dout"));
        LLMCL__TRY(check_dtype(ctx, dup, "dup", dout, "dout"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, gate, "gate", dout, "dout"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, up, "up", dout, "dout"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, dgate, "dgate", dout, "dout"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, dup, "dup", dout, "dout"));
    } else {
        LLMCL__TRY(check_packed(ctx, gate, "gate", dout, "dout"));
        LLMCL__TRY(llmcl__check_same_shape(ctx, dgate, "dgate", gate, "gate"));
    }

    const int64_t cols = dout->shape[dout->ndim - 1];
    llmcl__rows rows[5];
    glu_operand ops[5];
    LLMCL__TRY(operand(ctx, dout, "dout", 0, &rows[0], &ops[0]));
    LLMCL__TRY(operand(ctx, gate, "gate", 0, &rows[1], &ops[1]));
    LLMCL__TRY(operand(ctx, dgate, "dgate", 0, &rows[3], &ops[3]));
    LLMCL__TRY(check_output_rows(ctx, &rows[3], "dgate"));
    if (up) {
        LLMCL__TRY(operand(ctx, up, "up", 0, &rows[2], &ops[2]));
        LLMCL__TRY(operand(ctx, dup, "dup", 0, &rows[4], &ops[4]));
        LLMCL__TRY(check_output_rows(ctx, &rows[4], "dup"));
    } else {
        LLMCL__TRY(operand(ctx, gate, "gate", cols, &rows[2], &ops[2]));
        LLMCL__TRY(operand(ctx, dgate, "dgate", cols, &rows[4], &ops[4]));
    }
    const llmcl_tensor *ins[3] = {dout, gate, up};
    const char *in_names[3] = {"dout", "gate", "up"};
    for (int i = 0; i < 3; ++i) {
        LLMCL__TRY(check_alias(ctx, dgate, "dgate", ins[i], in_names[i]));
        if (dup)
            LLMCL__TRY(check_alias(ctx, dup, "dup", ins[i], in_names[i]));
    }
    LLMCL__REQUIRE(ctx, !dup || !llmcl__overlaps(dgate, dup), LLMCL_ERROR_INVALID_ARGUMENT,
                   "dgate and dup overlap");
    return glu_launch(ctx, LLMCL_KEY_GLU_BWD, "glu_bwd", act, true, dout->dtype, ops, 5, 3,
                      rows[0].n_rows, cols);
}

llmcl_status llmcl_activation_forward(llmcl_ctx *ctx, llmcl_activation act, const llmcl_tensor *x,
                                      llmcl_tensor *y)
{
    if (!ctx)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_INVALID_ARGUMENT,
                           "llmcl_activation_forward: ctx is NULL");
    LLMCL__TRY(check_act(ctx, act));
    LLMCL__TRY(llmcl__check_tensor(ctx, x, "x", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, y, "y", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(check_dtype(ctx, y, "y", x, "x"));
    LLMCL__TRY(llmcl__check_same_shape(ctx, x, "x", y, "y"));
    llmcl__rows rx, ry;
    glu_operand ops[3];
    LLMCL__TRY(operand(ctx, x, "x", 0, &rx, &ops[0]));
    LLMCL__TRY(operand(ctx, y, "y", 0, &ry, &ops[2]));
    LLMCL__TRY(check_output_rows(ctx, &ry, "y"));
    LLMCL__TRY(check_alias(ctx, y, "y", x, "x"));
    ops[1] = ops[0];
    return glu_launch(ctx, LLMCL_KEY_ACT_FWD, "glu_fwd", act, false, x->dtype, ops, 3, 2, ry.n_rows,
                      ry.row_len);
}

llmcl_status llmcl_activation_backward(llmcl_ctx *ctx, llmcl_activation act, const llmcl_tensor *x,
                                       const llmcl_tensor *dy, llmcl_tensor *dx)
{
    if (!ctx)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_INVALID_ARGUMENT,
                           "llmcl_activation_backward: ctx is NULL");
    LLMCL__TRY(check_act(ctx, act));
    LLMCL__TRY(llmcl__check_tensor(ctx, x, "x", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, dy, "dy", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(llmcl__check_tensor(ctx, dx, "dx", LLMCL__FLOAT_DTYPES, 1, LLMCL_MAX_DIMS));
    LLMCL__TRY(check_dtype(ctx, dy, "dy", x, "x"));
    LLMCL__TRY(check_dtype(ctx, dx, "dx", x, "x"));
    LLMCL__TRY(llmcl__check_same_shape(ctx, x, "x", dy, "dy"));
    LLMCL__TRY(llmcl__check_same_shape(ctx, x, "x", dx, "dx"));
    llmcl__rows rows[4];
    glu_operand ops[5];
    LLMCL__TRY(operand(ctx, dy, "dy", 0, &rows[0], &ops[0]));
    LLMCL__TRY(operand(ctx, x, "x", 0, &rows[1], &ops[1]));
    LLMCL__TRY(operand(ctx, dx, "dx", 0, &rows[3], &ops[3]));
    LLMCL__TRY(check_output_rows(ctx, &rows[3], "dx"));
    LLMCL__TRY(check_alias(ctx, dx, "dx", x, "x"));
    LLMCL__TRY(check_alias(ctx, dx, "dx", dy, "dy"));
    ops[2] = ops[1];
    ops[4] = ops[3];
    return glu_launch(ctx, LLMCL_KEY_ACT_BWD, "glu_bwd", act, false, x->dtype, ops, 5, 3,
                      rows[0].n_rows, rows[0].row_len);
}
