/*
 * attention.c: host launcher of src/cl/attention_*.cl, flash attention forward and backward.
 * Validates every argument, folds the options into one mask band (wl, wr), picks the kernel set
 * for the device and the call (llmcl__attn_arch) and each kernel's parameters
 * (llmcl__attn_config, attention_tiles.c), and enqueues attn_fwd, or attn_bwd_pre +
 * attn_bwd_dkdv + attn_bwd_dq, in the set's versions. Where the device cuts loops short, a
 * portable kernel's walk runs in several launches that resume from a saved state
 * (llmcl__attn_split, attention_split.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/runtime/ops/attention.h"

/* Every kernel of the attention family: a row each, which the launcher asks by set and pass. */
static const attn_kernel attn_kernels[] = {
    {"attn_fwd", "ATTN_KERNEL_FWD", LLMCL_KEY_ATTENTION_FWD, ATTN_ARCH_PORTABLE, ATTN_PASS_FWD},
    {"attn_bwd_pre", "ATTN_KERNEL_BWD_PRE", LLMCL_KEY_ATTENTION_BWD_PRE, ATTN_ARCH_PORTABLE,
     ATTN_PASS_PRE},
    {"attn_bwd_dq", "ATTN_KERNEL_BWD_DQ", LLMCL_KEY_ATTENTION_BWD_DQ, ATTN_ARCH_PORTABLE,
     ATTN_PASS_DQ},
    {"attn_bwd_dkdv", "ATTN_KERNEL_BWD_DKDV", LLMCL_KEY_ATTENTION_BWD_DKDV, ATTN_ARCH_PORTABLE,
     ATTN_PASS_DKDV},
    {"attn_fwd_mma", "ATTN_KERNEL_FWD_MMA", LLMCL_KEY_ATTENTION_FWD_MMA, ATTN_ARCH_MMA,
     ATTN_PASS_FWD},
    {"attn_bwd_dq_mma", "ATTN_KERNEL_BWD_DQ_MMA", LLMCL_KEY_ATTENTION_BWD_DQ_MMA, ATTN_ARCH_MMA,
     ATTN_PASS_DQ},
    {"attn_bwd_dkdv_mma", "ATTN_KERNEL_BWD_DKDV_MMA", LLMCL_KEY_ATTENTION_BWD_DKDV_MMA,
     ATTN_ARCH_MMA, ATTN_PASS_DKDV},
    {"attn_fwd_wgmma", "ATTN_KERNEL_FWD_WGMMA", LLMCL_KEY_ATTENTION_FWD_WGMMA, ATTN_ARCH_WGMMA,
     ATTN_PASS_FWD},
    {"attn_bwd_dq_wgmma", "ATTN_KERNEL_BWD_DQ_WGMMA", LLMCL_KEY_ATTENTION_BWD_DQ_WGMMA,
     ATTN_ARCH_WGMMA, ATTN_PASS_DQ},
    {"attn_bwd_dkdv_wgmma", "ATTN_KERNEL_BWD_DKDV_WGMMA", LLMCL_KEY_ATTENTION_BWD_DKDV_WGMMA,
     ATTN_ARCH_WGMMA, ATTN_PASS_DKDV},
    {"attn_bwd_dq_ds_wgmma", "ATTN_KERNEL_BWD_DQ_DS_WGMMA", LLMCL_KEY_ATTENTION_BWD_DQ_DS_WGMMA,
     ATTN_ARCH_WGMMA, ATTN_PASS_DQ_DS},
};

/* The kernel of set arch that computes pass (the backward's delta pass is portable alone). */
static const attn_kernel *attn_kernel_of(attn_pass pass, attn_arch arch)
{
    for (size_t i = 0; i < sizeof attn_kernels / sizeof attn_kernels[0]; ++i)
        if (attn_kernels[i].pass == pass && attn_kernels[i].arch == arch)
            return &attn_kernels[i];
    return NULL;
}

/* Whether t's offset and strides (past the unit-stride last one) are multiples of n elements. */
static bool attn_aligned(const llmcl_tensor *t, int64_t n)
{
    bool ok = t->offset % n == 0;
    for (int i = 0; i + 1 < t->ndim; ++i)
        ok = ok && t->strides[i] % n == 0;
    return ok;
}

/* ---- validation ---- */

/* FlashAttention-2's head dims: the multiples of 8 up to 256. */
static bool attn_head_dim_ok(int64_t d) { return d % 8 == 0 && d >= 8 && d <= 256; }

/* Unit stride on the last dimension and no negative strides: what the kernels' addressing needs. */
static llmcl_status attn_check_layout(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name)
{
    for (int i = 0; i < t->ndim; ++i)
        LLMCL__REQUIRE(ctx, t->strides[i] >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "attention: %s has a negative stride on axis %d", name, i);
    LLMCL__REQUIRE(ctx, t->strides[t->ndim - 1] == 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: %s needs a unit stride on its last axis (got %lld)", name,
                   (long long)t->strides[t->ndim - 1]);
    return LLMCL_OK;
}

/* t has ref's shape and dtype and a usable layout. */
static llmcl_status attn_check_like(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                    const llmcl_tensor *ref, const char *ref_name)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, t, name, LLMCL__FLOAT_DTYPES, ref->ndim, ref->ndim));
    LLMCL__REQUIRE(ctx, t->dtype == ref->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "attention: %s is %s but %s is %s; they must match", name,
                   llmcl_dtype_name(t->dtype), ref_name, llmcl_dtype_name(ref->dtype));
    LLMCL__TRY(llmcl__check_same_shape(ctx, t, name, ref, ref_name));
    return attn_check_layout(ctx, t, name);
}

/*
 * Checks the offsets of a cu_seqlens tensor: i32 [B + 1], starting at 0, non-decreasing, ending at
 * total; those of `given` (the caller's host copy) where set, else the tensor's read back. Sets
 * *max_len to the longest sequence.
 */
static llmcl_status attn_check_cu(llmcl_ctx *ctx, const llmcl_tensor *cu, const int32_t *given,
                                  const char *name, int64_t batch, int64_t total, int *max_len)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, cu, name, 1u << LLMCL_I32, 1, 1));
    LLMCL__REQUIRE(ctx, cu->shape[0] == batch + 1, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: %s has %lld offsets; cu_seqlens_q has %lld (both B + 1)", name,
                   (long long)cu->shape[0], (long long)(batch + 1));
    /* the kernels index the offsets from the view's start, one after another */
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(cu), LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: %s must be contiguous", name);
    int32_t *h = malloc(sizeof(int32_t) * (size_t)cu->shape[0]);
    LLMCL__REQUIRE(ctx, h, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "attention: %s: no host memory", name);
    llmcl_status st = LLMCL_OK;
    if (given)
        memcpy(h, given, sizeof(int32_t) * (size_t)cu->shape[0]);
    else
        st = llmcl_tensor_download(cu, h, sizeof(int32_t) * (size_t)cu->shape[0]);
    if (st != LLMCL_OK) {
        free(h);
        return st;
    }
    int64_t bad = -1;
    *max_len = 0;
    for (int64_t b = 0; b < batch && bad < 0; ++b) {
        if (h[b + 1] < h[b])
            bad = b;
        else if (h[b + 1] - h[b] > *max_len)
            *max_len = h[b + 1] - h[b];
    }
    const int32_t first = h[0], last = h[batch];
    free(h);
    LLMCL__REQUIRE(ctx, first == 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: %s[0] is %d; offsets start at 0", name, (int)first);
    LLMCL__REQUIRE(ctx, bad < 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: %s decreases after entry %lld; offsets must not decrease", name,
                   (long long)bad);
    LLMCL__REQUIRE(ctx, last == total, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: %s ends at %d but the packed tensor has %lld rows", name, (int)last,
                   (long long)total);
    return LLMCL_OK;
}

/* The options' numbers: window bounds, softcap, scale and the dS budget. */
static llmcl_status attn_check_opts(llmcl_ctx *ctx, const llmcl_attention_opts *opts)
{
    LLMCL__REQUIRE(ctx, opts->window_left >= -1 && opts->window_right >= -1,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: window_left %d / window_right %d must be >= -1", opts->window_left,
                   opts->window_right);
    LLMCL__REQUIRE(ctx, isfinite(opts->softcap) && opts->softcap >= 0,
                   LLMCL_ERROR_INVALID_ARGUMENT, "attention: softcap %g must be finite and >= 0",
                   (double)opts->softcap);
    LLMCL__REQUIRE(ctx, isfinite(opts->scale) && opts->scale >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: scale %g must be finite and >= 0", (double)opts->scale);
    LLMCL__REQUIRE(ctx, opts->ds_bytes >= -1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: ds_bytes %lld must be -1 (none), 0 (the default) or a byte count",
                   (long long)opts->ds_bytes);
    return LLMCL_OK;
}

/*
 * Packed sequences: B + 1 offsets each for q's tq and k's tk rows (host copies both or neither);
 * B and the longest sequences into g.
 */
static llmcl_status attn_check_varlen(llmcl_ctx *ctx, const llmcl_attention_opts *opts, int64_t tq,
                                      int64_t tk, attn_geom *g)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, g->cu_q, "cu_seqlens_q", 1u << LLMCL_I32, 1, 1));
    const int64_t batch = g->cu_q->shape[0] - 1;
    LLMCL__REQUIRE(ctx, batch >= 1 && batch < INT32_MAX, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: cu_seqlens_q needs B + 1 >= 2 offsets");
    LLMCL__REQUIRE(ctx, !opts->cu_seqlens_q_host == !opts->cu_seqlens_k_host,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: cu_seqlens_q_host and cu_seqlens_k_host must be both set or "
                   "both NULL");
    LLMCL__TRY(attn_check_cu(ctx, g->cu_q, opts->cu_seqlens_q_host, "cu_seqlens_q", batch, tq,
                             &g->Tq));
    LLMCL__TRY(attn_check_cu(ctx, g->cu_k, opts->cu_seqlens_k_host, "cu_seqlens_k", batch, tk,
                             &g->Tk));
    g->B = (int)batch;
    return LLMCL_OK;
}

/* Checks q, k, v and opts, and fills g. */
static llmcl_status attn_check_inputs(llmcl_ctx *ctx, const llmcl_tensor *q, const llmcl_tensor *k,
                                      const llmcl_tensor *v, const llmcl_attention_opts *opts,
                                      attn_geom *g)
{
    static const llmcl_attention_opts defaults = {0};
    if (!opts)
        opts = &defaults;
    *g = (attn_geom){0};
    LLMCL__REQUIRE(ctx, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "attention: ctx is NULL");
    LLMCL__REQUIRE(ctx, (opts->cu_seqlens_q == NULL) == (opts->cu_seqlens_k == NULL),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: cu_seqlens_q and cu_seqlens_k must be both set or both NULL");
    g->varlen = opts->cu_seqlens_q != NULL;
    const int nd = g->varlen ? 3 : 4;
    LLMCL__TRY(llmcl__check_tensor(ctx, q, "q", LLMCL__FLOAT_DTYPES, nd, nd));
    LLMCL__TRY(attn_check_layout(ctx, q, "q"));
    LLMCL__TRY(llmcl__check_tensor(ctx, k, "k", LLMCL__FLOAT_DTYPES, nd, nd));
    LLMCL__TRY(attn_check_layout(ctx, k, "k"));
    LLMCL__TRY(attn_check_like(ctx, v, "v", k, "k"));
    LLMCL__REQUIRE(ctx, k->dtype == q->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "attention: k is %s but q is %s; they must match", llmcl_dtype_name(k->dtype),
                   llmcl_dtype_name(q->dtype));

    /* Dense [B, H, T, D]; varlen [total, H, D]. */
    const int ax_h = 1, ax_t = g->varlen ? 0 : 2, ax_d = nd - 1;
    const int64_t d = q->shape[ax_d], hq = q->shape[ax_h], hkv = k->shape[ax_h];
    const int64_t tq = q->shape[ax_t], tk = k->shape[ax_t];
    LLMCL__REQUIRE(ctx, attn_head_dim_ok(d), LLMCL_ERROR_UNSUPPORTED,
                   "attention: head dim %lld is unsupported (a multiple of 8 from 8 to 256)",
                   (long long)d);
    LLMCL__REQUIRE(ctx, k->shape[ax_d] == d, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: k's head dim %lld differs from q's %lld", (long long)k->shape[ax_d],
                   (long long)d);
    LLMCL__REQUIRE(ctx, hkv > 0 && hq % hkv == 0, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: q has %lld heads, not a multiple of k's %lld", (long long)hq,
                   (long long)hkv);
    LLMCL__REQUIRE(ctx, g->varlen || q->shape[0] == k->shape[0], LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: q has batch %lld but k has %lld", (long long)q->shape[0],
                   (long long)k->shape[0]);
    LLMCL__REQUIRE(ctx, tq < INT32_MAX && tk < INT32_MAX && hq < INT32_MAX, LLMCL_ERROR_OVERFLOW,
                   "attention: sequence lengths and head counts must fit in 31 bits");
    LLMCL__TRY(attn_check_opts(ctx, opts));

    g->dtype = q->dtype;
    g->D = (int)d;
    g->Hq = (int)hq;
    g->Hkv = (int)hkv;
    g->cu_q = opts->cu_seqlens_q;
    g->cu_k = opts->cu_seqlens_k;
    if (g->varlen)
        LLMCL__TRY(attn_check_varlen(ctx, opts, tq, tk, g));
    else {
        LLMCL__REQUIRE(ctx, q->shape[0] < INT32_MAX, LLMCL_ERROR_OVERFLOW,
                       "attention: batch %lld must fit in 31 bits", (long long)q->shape[0]);
        g->B = (int)q->shape[0];
        g->Tq = (int)tq;
        g->Tk = (int)tk;
    }
    LLMCL__REQUIRE(ctx, (int64_t)g->B * g->Hq < INT32_MAX, LLMCL_ERROR_OVERFLOW,
                   "attention: B * Hq must fit in 31 bits");

    g->wl = opts->use_window ? opts->window_left : -1;
    g->wr = opts->use_window ? opts->window_right : -1;
    if (opts->causal)
        g->wr = 0; /* a window can only narrow causal's right bound, which is already 0 */
    g->scale = opts->scale > 0 ? opts->scale : (float)(1.0 / sqrt((double)g->D));
    g->softcap = opts->softcap;
    return LLMCL_OK;
}

/* lse is f32 [B, Hq, Tq] (varlen [Hq, total_q]), contiguous like the backward's delta. */
static llmcl_status attn_check_lse(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *q,
                                   const llmcl_tensor *lse)
{
    const int nd = g->varlen ? 2 : 3;
    LLMCL__TRY(llmcl__check_tensor(ctx, lse, "lse", 1u << LLMCL_F32, nd, nd));
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(lse), LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: lse must be contiguous");
    const bool ok = g->varlen ? lse->shape[0] == g->Hq && lse->shape[1] == q->shape[0]
                              : lse->shape[0] == g->B && lse->shape[1] == g->Hq &&
                                    lse->shape[2] == g->Tq;
    LLMCL__REQUIRE(ctx, ok, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: lse must be %s = [%lld, %lld%s%lld]", g->varlen ? "[Hq, total_q]" : "[B, Hq, Tq]",
                   (long long)(g->varlen ? g->Hq : g->B), (long long)(g->varlen ? q->shape[0] : g->Hq),
                   g->varlen ? "" : ", ", g->varlen ? 0LL : (long long)g->Tq);
    return LLMCL_OK;
}

/* Outputs must not overlap the inputs or each other. */
static llmcl_status attn_check_disjoint(llmcl_ctx *ctx, const llmcl_tensor *const *outs,
                                        const char *const *out_names, int n_out,
                                        const llmcl_tensor *const *ins,
                                        const char *const *in_names, int n_in)
{
    for (int i = 0; i < n_out; ++i) {
        for (int j = 0; j < n_in; ++j)
            LLMCL__REQUIRE(ctx, !llmcl__overlaps(outs[i], ins[j]), LLMCL_ERROR_INVALID_ARGUMENT,
                           "attention: output %s overlaps input %s", out_names[i], in_names[j]);
        for (int j = 0; j < i; ++j)
            LLMCL__REQUIRE(ctx, !llmcl__overlaps(outs[i], outs[j]), LLMCL_ERROR_INVALID_ARGUMENT,
                           "attention: outputs %s and %s overlap", out_names[i], out_names[j]);
    }
    return LLMCL_OK;
}

/* ---- builds ---- */

/* The kernel built with llmcl__attn_config's parameters p. */
static llmcl_status attn_build(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                               const llmcl__params *p, cl_kernel *out)
{
    llmcl__defines defs = {0};
    llmcl__define_int(&defs, "D", g->D);
    llmcl__define_str(&defs, "IO_DT", llmcl__dtype_macro(g->dtype));
    llmcl__define_flag(&defs, k->define);
    llmcl__define_flag(&defs, "ATTN_ONE_KERNEL");
    if (k->arch == ATTN_ARCH_MMA && k->pass == ATTN_PASS_DKDV && g->dkdv_part)
        llmcl__define_int(&defs, "DKDV_PART", g->dkdv_part);
    if (k->pass == ATTN_PASS_DKDV && g->ds) {
        llmcl__define_int(&defs, "DS_STORE", 1);
        llmcl__define_int(&defs, "DS_BM", ATTN_DS_BM);
    }
    llmcl__define_int(&defs, "ALIGNED4", g->aligned4);
    if (g->varlen)
        llmcl__define_flag(&defs, "VARLEN");
    if (g->split)
        llmcl__define_flag(&defs, "SPLIT");
    llmcl__params_define(p, &defs);
    /*
     * The kernels declare reqd_work_group_size, so the compiler fits its register use to wg.
     * CL_KERNEL_WORK_GROUP_SIZE is not consulted: rusticl reports 32 for kernels that run at 256.
     */
    return llmcl__kernel(ctx, LLMCL_FAMILY_ATTENTION, &defs, k->name, out);
}

/* That portable kernel k's walk fits the device's loop budget, split where it must be: the
   backward checks its kernels before its first launch. */
static llmcl_status attn_check_split(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k)
{
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    attn_split split;
    LLMCL__TRY(llmcl__attn_config(ctx, g, k, &p, &t, &wg));
    return llmcl__attn_split(ctx, g, k, t, &split);
}

/* ---- launches ---- */

/* A tensor's (batch, head, row) strides. */
typedef struct attn_strides {
    int64_t b, h, t;
} attn_strides;

static attn_strides attn_strides_of(const attn_geom *g, const llmcl_tensor *t)
{
    if (g->varlen)
        return (attn_strides){0, t->strides[1], t->strides[0]};
    return (attn_strides){t->strides[0], t->strides[1], t->strides[2]};
}

/* LSE and delta: (b, h) strides; the row index is added to them. */
static attn_strides attn_lse_strides(const attn_geom *g, const llmcl_tensor *lse)
{
    if (g->varlen)
        return (attn_strides){0, lse->strides[0], 1};
    return (attn_strides){lse->strides[0], lse->strides[1], 1};
}

static void attn_arg_strides(llmcl__args *a, attn_strides s, bool with_t)
{
    llmcl__arg_i64(a, s.b);
    llmcl__arg_i64(a, s.h);
    if (with_t)
        llmcl__arg_i64(a, s.t);
}

/* A cu_seqlens tensor, or a NULL buffer in dense mode (the kernels then never read it). */
static void attn_arg_cu(llmcl__args *a, const llmcl_tensor *cu)
{
    if (cu) {
        llmcl__arg_tensor(a, cu);
        return;
    }
    const cl_mem none = NULL;
    llmcl__arg(a, sizeof none, &none);
    llmcl__arg_i64(a, 0);
}

/* The trailing scalars of every tiled kernel: logit scale, softcap and the mask band. */
static void attn_arg_mask(llmcl__args *a, const attn_geom *g)
{
    llmcl__arg_f32(a, g->scale);
    llmcl__arg_f32(a, g->softcap);
    llmcl__arg_i32(a, g->wl);
    llmcl__arg_i32(a, g->wr);
}

/* A tiled kernel's launch: the kernel, its tensors in argument order (lse and delta among them)
   and its grid. */
typedef struct attn_launch {
    cl_kernel kern;
    const llmcl_tensor *const *ts;
    int n, heads;
    const llmcl_tensor *lse, *delta;
    size_t global, wg;
} attn_launch;

/*
 * The arguments of a tiled kernel (attn_fwd, attn_bwd_dq, attn_bwd_dkdv and their tensor-core
 * versions) in their common order: the tensors, cu_seqlens, lengths, batch size, heads and group
 * size, the (b, h, t) strides of every tensor but lse and delta, lse's strides and the mask.
 */
static llmcl__args attn_args_tiled(llmcl_ctx *ctx, const attn_geom *g, const attn_launch *l)
{
    llmcl__args a = llmcl__args_begin(ctx, l->kern);
    for (int i = 0; i < l->n; ++i)
        llmcl__arg_tensor(&a, l->ts[i]);
    attn_arg_cu(&a, g->cu_q);
    attn_arg_cu(&a, g->cu_k);
    llmcl__arg_i32(&a, g->Tq);
    llmcl__arg_i32(&a, g->Tk);
    llmcl__arg_i32(&a, g->B);
    llmcl__arg_i32(&a, l->heads);
    llmcl__arg_i32(&a, g->Hq / g->Hkv);
    for (int i = 0; i < l->n; ++i)
        if (l->ts[i] != l->lse && l->ts[i] != l->delta)
            attn_arg_strides(&a, attn_strides_of(g, l->ts[i]), true);
    attn_arg_strides(&a, attn_lse_strides(g, l->lse), false);
    attn_arg_mask(&a, g);
    return a;
}

/*
 * A portable kernel's walk in split.launches launches (SPLIT), each resuming from the state the
 * one before saved: an f32 row of `row` floats a query of each head (a key of each KV head in
 * attn_bwd_dkdv), of `len` rows a head (the longest sequence, or varlen's packed rows), in
 * lse's order.
 */
static llmcl_status attn_launch_split(llmcl_ctx *ctx, const attn_geom *g, const attn_launch *l,
                                      attn_split split, int64_t row, int64_t len)
{
    const int64_t numel = (g->varlen ? 1 : (int64_t)g->B) * l->heads * len * row;
    llmcl_tensor *st;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &numel, "attention split state", &st));
    llmcl_status status = LLMCL_OK;
    for (int64_t i = 0; i < split.launches && status == LLMCL_OK; ++i) {
        const int64_t begin = i * split.per, end = begin + split.per;
        llmcl__args a = attn_args_tiled(ctx, g, l);
        llmcl__arg_tensor(&a, st);
        llmcl__arg_i64(&a, g->varlen ? 0 : l->heads * len * row);
        llmcl__arg_i64(&a, len * row);
        llmcl__arg_i64(&a, row);
        llmcl__arg_i32(&a, (int32_t)begin);
        llmcl__arg_i32(&a, (int32_t)(end < split.steps ? end : split.steps));
        llmcl__arg_i32(&a, i + 1 == split.launches);
        status = llmcl__launch(&a, 1, &l->global, &l->wg);
    }
    llmcl_tensor_destroy(st);
    return status;
}

/* The work-groups of a launch of `items` items: at most PERSIST a compute unit where the kernel
   is persistent (its work-groups walk the items), else one an item. */
static size_t attn_groups(const llmcl_ctx *ctx, size_t items, int64_t persist)
{
    const size_t most = (size_t)persist * ctx->info.compute_units;
    return persist > 0 && items > most ? most : items;
}

/*
 * A wgmma kernel's launch with TMA: after its arguments a, the template and the 128-byte map slots
 * of each work-group, as attention_wgmma.cl's ATTN_TMA_SLOTS counts them: 16 where the kernel
 * takes more maps (dK/dV storing dS, a persistent kernel's sets of items' maps), else 8.
 */
static llmcl_status attn_launch_tma(llmcl_ctx *ctx, llmcl_dtype dtype, llmcl__args *a,
                                    size_t global, size_t wg, bool more_maps)
{
    const int64_t words = (int64_t)(global / wg) * (more_maps ? 16 : 8) * 32;
    llmcl_tensor *maps;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &words, "attention tensor maps", &maps));
    llmcl__arg(a, 16 * sizeof(uint64_t), llmcl__tma_template(ctx->tma, dtype));
    llmcl__arg(a, sizeof maps->mem, &maps->mem);
    const llmcl_status st = llmcl__launch(a, 1, &global, &wg);
    llmcl_tensor_destroy(maps); /* OpenCL keeps it until the kernel is done */
    return st;
}

/*
 * A tiled kernel: attn_bwd_dkdv (and its tensor-core versions) runs a work-group per key tile of a
 * KV head, the others per query tile of a query head, on a flat grid that the kernels read
 * tile-major (attn_place_of), over the whole call or, storing dS, over the part's pairs. A
 * portable kernel whose walk passes the device's loop budget runs in launches of parts of it
 * (llmcl__attn_split).
 */
static llmcl_status attn_launch_tiled(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                      const llmcl_tensor *const *ts, int n,
                                      const llmcl_tensor *lse, const llmcl_tensor *delta)
{
    llmcl__params p = {0};
    attn_tiles t;
    attn_launch l = {.ts = ts, .n = n, .lse = lse, .delta = delta};
    LLMCL__TRY(llmcl__attn_config(ctx, g, k, &p, &t, &l.wg));
    attn_split split = {0, 0, 1};
    if (k->arch == ATTN_ARCH_PORTABLE)
        LLMCL__TRY(llmcl__attn_split(ctx, g, k, t, &split));
    attn_geom gs = *g;
    gs.split = split.launches > 1;
    LLMCL__TRY(attn_build(ctx, &gs, k, &p, &l.kern));
    const bool by_keys = k->pass == ATTN_PASS_DKDV;
    l.heads = by_keys ? g->Hkv : g->Hq;
    const int64_t tiles = by_keys ? llmcl__div_up(g->Tk, t.bn) : llmcl__div_up(g->Tq, t.bm);
    /* The kernels count work-groups, and runs of TILE_RUN tiles of every head, in 32 bits. */
    LLMCL__REQUIRE(ctx, (tiles > t.run ? tiles : t.run) * g->B * l.heads <= UINT32_MAX,
                   LLMCL_ERROR_OVERFLOW,
                   "attention: %lld tiles (TILE_RUN %d) x %d heads x batch %d exceed 2^32",
                   (long long)tiles, t.run, l.heads, g->B);
    l.global = (size_t)tiles * (g->ds ? (size_t)g->ds->nbh : (size_t)g->B * (size_t)l.heads) * l.wg;
    if (gs.split) {
        llmcl__log("attention: %s at D=%d, Tq=%d, Tk=%d in %lld launches of %lld of its %lld "
                   "steps (loop limit %llu)",
                   k->name, g->D, g->Tq, g->Tk, (long long)split.launches, (long long)split.per,
                   (long long)split.steps, (unsigned long long)ctx->info.loop_limit);
        const llmcl_tensor *rows_of = by_keys ? ts[1] : ts[0]; /* k or q */
        const int64_t row = k->pass == ATTN_PASS_FWD  ? g->D + 2 * (t.bn / t.tn)
                            : k->pass == ATTN_PASS_DQ ? g->D
                                                      : 2 * g->D;
        const int64_t len = g->varlen ? rows_of->shape[0] : by_keys ? g->Tk : g->Tq;
        return attn_launch_split(ctx, g, &l, split, row, len);
    }
    const int64_t persist = k->pass == ATTN_PASS_FWD ? llmcl__param_get(&p, "PERSIST", 0) : 0;
    l.global = attn_groups(ctx, l.global / l.wg, persist) * l.wg;
    llmcl__args a = attn_args_tiled(ctx, g, &l);
    if (llmcl__param_get(&p, "TMA", 0) == 0)
        return llmcl__launch(&a, 1, &l.global, &l.wg);
    if (g->ds) { /* dK/dV storing dS: the scratch and the part (ATTN_DS_PARAMS, in KV heads) */
        llmcl__arg_tensor(&a, g->ds->scratch);
        llmcl__arg_i64(&a, g->ds->ds_h);
        llmcl__arg_i64(&a, g->ds->ds_t);
        llmcl__arg_i32(&a, g->ds->bh0);
        llmcl__arg_i32(&a, g->ds->nbh);
    }
    return attn_launch_tma(ctx, g->dtype, &a, l.global, l.wg, g->ds || persist > 0);
}

llmcl_status llmcl_attention_forward(llmcl_ctx *ctx, const llmcl_tensor *q, const llmcl_tensor *k,
                                     const llmcl_tensor *v, const llmcl_attention_opts *opts,
                                     llmcl_tensor *o, llmcl_tensor *lse)
{
    attn_geom g;
    LLMCL__TRY(attn_check_inputs(ctx, q, k, v, opts, &g));
    LLMCL__TRY(attn_check_like(ctx, o, "o", q, "q"));
    LLMCL__TRY(attn_check_lse(ctx, &g, q, lse));
    const llmcl_tensor *outs[] = {o, lse}, *ins[] = {q, k, v};
    const char *out_names[] = {"o", "lse"}, *in_names[] = {"q", "k", "v"};
    LLMCL__TRY(attn_check_disjoint(ctx, outs, out_names, 2, ins, in_names, 3));
    g.aligned4 = attn_aligned(q, 4) && attn_aligned(k, 4) && attn_aligned(v, 4);
    g.aligned8 = attn_aligned(q, 8) && attn_aligned(k, 8) && attn_aligned(v, 8);
    if ((int64_t)g.B * g.Hq * g.Tq == 0)
        return LLMCL_OK;
    const llmcl_tensor *ts[] = {q, k, v, o, lse};
    return attn_launch_tiled(ctx, &g, attn_kernel_of(ATTN_PASS_FWD, llmcl__attn_arch(ctx, &g, true)),
                             ts, 5, lse, NULL);
}

static llmcl_status attn_launch_pre(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *o,
                                    const llmcl_tensor *dout, llmcl_tensor *delta)
{
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    const attn_kernel *k = attn_kernel_of(ATTN_PASS_PRE, ATTN_ARCH_PORTABLE);
    LLMCL__TRY(llmcl__attn_config(ctx, g, k, &p, &t, &wg));
    /* PRE_LANES work-items a row, each with one loop over its share of D */
    LLMCL__TRY(llmcl__check_loops(ctx, g->D / 4 + 1, "attention: attn_bwd_pre at D = %d", g->D));
    const int64_t rows = (int64_t)wg / llmcl__param_get(&p, "PRE_LANES", 1) *
                         llmcl__param_get(&p, "PRE_ROWS", 1); /* a work-group's */
    cl_kernel kern;
    LLMCL__TRY(attn_build(ctx, g, k, &p, &kern));
    llmcl__args a = llmcl__args_begin(ctx, kern);
    llmcl__arg_tensor(&a, o);
    llmcl__arg_tensor(&a, dout);
    llmcl__arg_tensor(&a, delta);
    attn_arg_cu(&a, g->cu_q);
    llmcl__arg_i32(&a, g->Tq);
    llmcl__arg_i32(&a, g->Hq);
    attn_arg_strides(&a, attn_strides_of(g, o), true);
    attn_arg_strides(&a, attn_strides_of(g, dout), true);
    attn_arg_strides(&a, attn_lse_strides(g, delta), false);
    const size_t global[2] = {(size_t)llmcl__div_up(g->Tq, rows) * wg, (size_t)g->B * g->Hq};
    const size_t local[2] = {wg, 1};
    return llmcl__launch(&a, 2, global, local);
}

static llmcl_status attn_launch_dq(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *q,
                                   const llmcl_tensor *k, const llmcl_tensor *v,
                                   const llmcl_tensor *dout, const llmcl_tensor *lse,
                                   const llmcl_tensor *delta, llmcl_tensor *dq)
{
    const llmcl_tensor *ts[] = {q, k, v, dout, lse, delta, dq};
    return attn_launch_tiled(ctx, g, attn_kernel_of(ATTN_PASS_DQ, g->bwd), ts, 7, lse, delta);
}

static llmcl_status attn_launch_dkdv(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *q,
                                     const llmcl_tensor *k, const llmcl_tensor *v,
                                     const llmcl_tensor *dout, const llmcl_tensor *lse,
                                     const llmcl_tensor *delta, llmcl_tensor *dk, llmcl_tensor *dv)
{
    const llmcl_tensor *ts[] = {q, k, v, dout, lse, delta, dk, dv};
    const attn_kernel *kern = attn_kernel_of(ATTN_PASS_DKDV, g->bwd);
    if (g->bwd != ATTN_ARCH_MMA || g->D <= 128)
        return attn_launch_tiled(ctx, g, kern, ts, 8, lse, delta);
    /* Past D = 128 a warp's registers hold one D-wide accumulator: dV, then dK */
    attn_geom part = *g;
    for (part.dkdv_part = 1; part.dkdv_part <= 2; ++part.dkdv_part)
        LLMCL__TRY(attn_launch_tiled(ctx, &part, kern, ts, 8, lse, delta));
    return LLMCL_OK;
}

/* dQ = dS K over the part's query heads (attn_bwd_dq_ds_wgmma), from the dS of g->ds. */
static llmcl_status attn_launch_dq_ds(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *k,
                                      llmcl_tensor *dq)
{
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    const attn_kernel *kd = attn_kernel_of(ATTN_PASS_DQ_DS, ATTN_ARCH_WGMMA);
    LLMCL__TRY(llmcl__attn_config(ctx, g, kd, &p, &t, &wg));
    cl_kernel kern;
    LLMCL__TRY(attn_build(ctx, g, kd, &p, &kern));
    const attn_ds *ds = g->ds;
    const int group = g->Hq / g->Hkv;
    llmcl__args a = llmcl__args_begin(ctx, kern);
    llmcl__arg_tensor(&a, k);
    llmcl__arg_tensor(&a, ds->scratch);
    llmcl__arg_tensor(&a, dq);
    attn_arg_cu(&a, g->cu_q);
    attn_arg_cu(&a, g->cu_k);
    llmcl__arg_i32(&a, g->Tq);
    llmcl__arg_i32(&a, g->Tk);
    llmcl__arg_i32(&a, g->Hq);
    llmcl__arg_i32(&a, group);
    attn_arg_strides(&a, attn_strides_of(g, k), true);
    attn_arg_strides(&a, attn_strides_of(g, dq), true);
    llmcl__arg_i64(&a, ds->ds_h);
    llmcl__arg_i64(&a, ds->ds_t);
    llmcl__arg_i32(&a, ds->bh0 * group);
    llmcl__arg_i32(&a, ds->nbh * group);
    llmcl__arg_i32(&a, g->wl);
    llmcl__arg_i32(&a, g->wr);
    const size_t items = (size_t)llmcl__div_up(g->Tq, t.bm) * (size_t)ds->nbh * group;
    const int64_t persist = llmcl__param_get(&p, "PERSIST", 0);
    return attn_launch_tma(ctx, g->dtype, &a, attn_groups(ctx, items, persist) * wg, wg,
                           persist > 0);
}

/*
 * The budget of the stored dS: opts' ds_bytes, else LLMCL_ATTN_DS_MIB's MiB, else 4 GiB but at
 * most a quarter of the memory that the context's cap (or the device) leaves, so that a caller
 * who planned its memory without knowing of the scratch keeps room for what it allocates next.
 * *given: a budget the caller or the user gave, which stores dS at D 64 too.
 */
static llmcl_status attn_ds_budget(llmcl_ctx *ctx, const llmcl_attention_opts *opts,
                                   int64_t *bytes, bool *given)
{
    *bytes = opts ? opts->ds_bytes : 0;
    *given = *bytes > 0;
    if (*bytes != 0)
        return LLMCL_OK;
    int64_t mib;
    bool set;
    LLMCL__TRY(llmcl__env_int(ctx, "LLMCL_ATTN_DS_MIB", 0, INT64_MAX >> 20, false,
                              "a count of MiB such as 1024 (0: none)", &mib, &set));
    if (set) {
        *bytes = mib << 20;
        *given = *bytes > 0;
        return LLMCL_OK;
    }
    const llmcl_memory_stats *m = &ctx->memory;
    const uint64_t cap = m->limit_bytes ? m->limit_bytes : ctx->info.global_mem_bytes;
    const uint64_t quarter = cap > m->current_bytes ? (cap - m->current_bytes) / 4 : 0;
    *bytes = (int64_t)(quarter < (4ull << 30) ? quarter : 4ull << 30);
    return LLMCL_OK;
}

/* At D 64 the stores cost dK/dV about what dQ saves, so the built-in budget stores there only up
   to this many keys (on the H200 the backward's kernels: -5% at T 2048, +3% at T 4096;
   PERFORMANCE.md) */
#define ATTN_DS_D64_MAX_TK 2048

/*
 * Whether this backward stores dS: on the wgmma kernels at D 128, or at D 64 where the caller or
 * LLMCL_ATTN_DS_MIB gave a budget (given) or the keys are few (ATTN_DS_D64_MAX_TK), where dK/dV
 * copies by TMA and its slabs fit beside its tiles, and the budget holds one KV head's group. A
 * budget the caller did not give in opts (!asked) also needs the whole call or parts whose dK/dV
 * has 1.5 work-groups a compute unit: parts of fewer KV heads leave the device idle behind their
 * heaviest key tiles (on the H200 at T 16384 D 128, parts of one KV head, 0.97 work-groups a unit,
 * ran 38% slower than recomputing; parts of two, 1.94 a unit, 14% faster). Fills ds's layout and
 * dK/dV's key tile, and *pairs, the (batch, KV head) pairs a part takes (0: dQ recomputes the
 * scores).
 */
static llmcl_status attn_ds_plan(llmcl_ctx *ctx, const attn_geom *g, int64_t budget, bool given,
                                 bool asked, attn_ds *ds, int64_t *pairs)
{
    *pairs = 0;
    const bool d64 = g->D == 64 && (given || g->Tk <= ATTN_DS_D64_MAX_TK);
    if (g->bwd != ATTN_ARCH_WGMMA || !(g->D == 128 || d64) || !ctx->tma ||
        budget <= 0)
        return LLMCL_OK;
    const int64_t group = g->Hq / g->Hkv, ds_t = llmcl__div_up(g->Tk, 8) * 8;
    if ((int64_t)g->Tq * ds_t > budget / 2 / group)
        return LLMCL_OK;
    attn_geom with = *g;
    with.ds = ds;
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    if (llmcl__attn_config(ctx, &with, attn_kernel_of(ATTN_PASS_DKDV, g->bwd), &p, &t, &wg) !=
            LLMCL_OK ||
        llmcl__param_get(&p, "TMA", 0) != 1)
        return LLMCL_OK; /* tuned tiles that leave no room for the slabs, or cp.async: recompute */
    *ds = (attn_ds){.ds_h = (int64_t)g->Tq * ds_t, .ds_t = ds_t, .bn = t.bn};
    const int64_t total = (int64_t)g->B * g->Hkv;
    int64_t fit = budget / (2 * group * ds->ds_h);
    const int64_t blocks = llmcl__div_up(g->Tq, ATTN_DS_BM) * group; /* dQ's work-groups a pair */
    if (fit > INT32_MAX / blocks)
        fit = INT32_MAX / blocks; /* dQ's kernel counts its work-groups in 32 bits */
    if (!asked && fit < total &&
        2 * fit * llmcl__div_up(g->Tk, t.bn) < 3 * (int64_t)ctx->info.compute_units)
        return LLMCL_OK;
    *pairs = fit < total ? fit : total;
    return LLMCL_OK;
}

/* dK, dV and dQ with dS stored, in parts of `pairs` (batch, KV head) pairs (attn_ds_plan). */
static llmcl_status attn_backward_stored(llmcl_ctx *ctx, const attn_geom *g, attn_ds *ds,
                                         int64_t pairs, const llmcl_tensor *q,
                                         const llmcl_tensor *k, const llmcl_tensor *v,
                                         const llmcl_tensor *dout, const llmcl_tensor *lse,
                                         const llmcl_tensor *delta, llmcl_tensor *dq,
                                         llmcl_tensor *dk, llmcl_tensor *dv)
{
    const int64_t total = (int64_t)g->B * g->Hkv, numel = pairs * (g->Hq / g->Hkv) * ds->ds_h;
    llmcl_tensor *scratch;
    LLMCL__TRY(llmcl__scratch(ctx, g->dtype, 1, &numel, "attention dS", &scratch));
    ds->scratch = scratch;
    attn_geom part = *g;
    part.ds = ds;
    llmcl_status st = LLMCL_OK;
    for (int64_t bh0 = 0; bh0 < total && st == LLMCL_OK; bh0 += pairs) {
        ds->bh0 = (int)bh0;
        ds->nbh = (int)(total - bh0 < pairs ? total - bh0 : pairs);
        st = attn_launch_dkdv(ctx, &part, q, k, v, dout, lse, delta, dk, dv);
        if (st == LLMCL_OK)
            st = attn_launch_dq_ds(ctx, &part, k, dq);
    }
    llmcl_tensor_destroy(scratch);
    return st;
}

llmcl_status llmcl_attention_backward(llmcl_ctx *ctx, const llmcl_tensor *q, const llmcl_tensor *k,
                                      const llmcl_tensor *v, const llmcl_tensor *o,
                                      const llmcl_tensor *lse, const llmcl_tensor *dout,
                                      const llmcl_attention_opts *opts, llmcl_tensor *dq,
                                      llmcl_tensor *dk, llmcl_tensor *dv)
{
    attn_geom g;
    LLMCL__TRY(attn_check_inputs(ctx, q, k, v, opts, &g));
    LLMCL__TRY(attn_check_like(ctx, o, "o", q, "q"));
    LLMCL__TRY(attn_check_like(ctx, dout, "dout", q, "q"));
    LLMCL__TRY(attn_check_lse(ctx, &g, q, lse));
    LLMCL__TRY(attn_check_like(ctx, dq, "dq", q, "q"));
    LLMCL__TRY(attn_check_like(ctx, dk, "dk", k, "k"));
    LLMCL__TRY(attn_check_like(ctx, dv, "dv", k, "k"));
    const llmcl_tensor *outs[] = {dq, dk, dv}, *ins[] = {q, k, v, o, lse, dout};
    const char *out_names[] = {"dq", "dk", "dv"}, *in_names[] = {"q", "k", "v", "o", "lse", "dout"};
    LLMCL__TRY(attn_check_disjoint(ctx, outs, out_names, 3, ins, in_names, 6));
    g.aligned4 = attn_aligned(q, 4) && attn_aligned(k, 4) && attn_aligned(v, 4) &&
                 attn_aligned(dout, 4) && attn_aligned(o, 4);
    g.aligned8 =
        attn_aligned(q, 8) && attn_aligned(k, 8) && attn_aligned(v, 8) && attn_aligned(dout, 8);
    g.pre_vec8 = attn_aligned(o, 8) && attn_aligned(dout, 8);
    g.bwd = llmcl__attn_arch(ctx, &g, false);
    if (g.bwd == ATTN_ARCH_PORTABLE) {
        LLMCL__TRY(attn_check_split(ctx, &g, attn_kernel_of(ATTN_PASS_DQ, g.bwd)));
        LLMCL__TRY(attn_check_split(ctx, &g, attn_kernel_of(ATTN_PASS_DKDV, g.bwd)));
    }

    /*
     * Empty sides: with no queries dk and dv come out zero from attn_bwd_dkdv's empty loops, and
     * with no keys dq from attn_bwd_dq's.
     */
    const bool rows = (int64_t)g.B * g.Hq * g.Tq > 0, keys = (int64_t)g.B * g.Hkv * g.Tk > 0;
    if (!rows && !keys)
        return LLMCL_OK;
    if (!rows)
        return attn_launch_dkdv(ctx, &g, q, k, v, dout, lse, lse, dk, dv); /* delta unread */

    /* delta = rowsum(dout * o), f32 in lse's (contiguous) layout: the only extra memory. */
    llmcl_tensor *delta = NULL;
    const int64_t dense_shape[3] = {g.B, g.Hq, g.Tq}, var_shape[2] = {g.Hq, q->shape[0]};
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, g.varlen ? 2 : 3, g.varlen ? var_shape : dense_shape,
                              "attention delta", &delta));
    llmcl_status st = LLMCL_OK;
    int64_t budget, pairs = 0;
    bool given;
    attn_ds ds = {0};
    LLMCL__TRY_GOTO(st, attn_ds_budget(ctx, opts, &budget, &given), done);
    if (keys)
        LLMCL__TRY_GOTO(st,
                        attn_ds_plan(ctx, &g, budget, given, opts && opts->ds_bytes > 0, &ds,
                                     &pairs),
                        done);
    LLMCL__TRY_GOTO(st, attn_launch_pre(ctx, &g, o, dout, delta), done);
    if (pairs > 0) {
        st = attn_backward_stored(ctx, &g, &ds, pairs, q, k, v, dout, lse, delta, dq, dk, dv);
        goto done;
    }
    if (keys)
        LLMCL__TRY_GOTO(st, attn_launch_dkdv(ctx, &g, q, k, v, dout, lse, delta, dk, dv), done);
    LLMCL__TRY_GOTO(st, attn_launch_dq(ctx, &g, q, k, v, dout, lse, delta, dq), done);
done:
    llmcl_tensor_destroy(delta);
    return st;
}
