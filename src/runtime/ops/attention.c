/*
 * attention.c: host launcher of src/cl/attention_*.cl, flash attention forward and backward.
 * Validates every argument, folds the options into one mask band (wl, wr), picks the tiles for the
 * device's local memory and work-group limits (the tuning database may override them), and
 * enqueues attn_fwd, or attn_bwd_pre + attn_bwd_dkdv + attn_bwd_dq (their tensor-core versions
 * where they fit, and on wgmma where the device has it). Where the device cuts loops short, a
 * portable kernel's walk runs in several launches that resume from a saved state (attn_split_of).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "src/runtime/internal.h"

/* The kernel sets of src/cl/attention_*.cl, one file each. */
typedef enum attn_arch {
    ATTN_ARCH_PORTABLE, /* attention_portable.cl: any device */
    ATTN_ARCH_MMA,      /* attention_mma.cl: mma.sync, NVIDIA from sm_80 */
    ATTN_ARCH_WGMMA     /* attention_wgmma.cl: wgmma, Hopper */
} attn_arch;

/* What a kernel computes. */
typedef enum attn_pass {
    ATTN_PASS_FWD,  /* O and LSE, a work-group per query tile */
    ATTN_PASS_PRE,  /* the backward's delta = rowsum(dO * O) */
    ATTN_PASS_DQ,   /* dQ, a work-group per query tile */
    ATTN_PASS_DKDV  /* dK and dV, a work-group per key tile */
} attn_pass;

/* A kernel: its name in the .cl, the define that builds it alone, its tuning key, its set and its
   pass. */
typedef struct attn_kernel {
    const char *name, *define, *key;
    attn_arch arch;
    attn_pass pass;
} attn_kernel;

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
};

/* The kernel of set arch that computes pass (the backward's delta pass is portable alone). */
static const attn_kernel *attn_kernel_of(attn_pass pass, attn_arch arch)
{
    for (size_t i = 0; i < sizeof attn_kernels / sizeof attn_kernels[0]; ++i)
        if (attn_kernels[i].pass == pass && attn_kernels[i].arch == arch)
            return &attn_kernels[i];
    return NULL;
}

/* Everything the kernels need to know about one call, validated. */
typedef struct attn_geom {
    bool varlen;
    llmcl_dtype dtype;
    int B, Hq, Hkv, D;
    int Tq, Tk; /* dense lengths, or the longest sequence in varlen mode */
    int wl, wr; /* mask band around the diagonal, causal folded in; -1 unbounded */
    float scale, softcap;
    const llmcl_tensor *cu_q, *cu_k;
    bool aligned4; /* every offset and stride of the loaded operands a multiple of 4 elements */
    bool aligned8; /* ... of 8 elements: 16-byte rows for cp.async */
    attn_arch bwd; /* the backward's kernel set */
    int dkdv_part; /* past D = 128: which of dK (2) and dV (1) attn_bwd_dkdv_mma takes */
    bool split;    /* a portable kernel's walk spans launches (SPLIT): see attn_split_of */
} attn_geom;

/* Whether t's offset and strides (past the unit-stride last one) are multiples of n elements. */
static bool attn_aligned(const llmcl_tensor *t, int64_t n)
{
    bool ok = t->offset % n == 0;
    for (int i = 0; i + 1 < t->ndim; ++i)
        ok = ok && t->strides[i] % n == 0;
    return ok;
}

typedef struct attn_strides {
    int64_t b, h, t;
} attn_strides;

typedef struct attn_tiles {
    int bm, bn, tm, tn;
    int lf32;  /* operand tiles in f32 in local memory: 1 all, 2 the Q side */
    int kvsep; /* attn_fwd: separate K and V buffers */
    int unroll; /* unroll factor of the products' loops, 0 the compiler's choice */
    int pipe;   /* stage the next tile's operands through registers */
    int kf32;   /* attn_bwd_dq: its K tile in f32 */
    int run;    /* grid order: runs of this many tiles of one head (TILE_RUN) */
} attn_tiles;

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
 * Reads the offsets of a cu_seqlens tensor back and checks them: i32 [B + 1], starting at 0,
 * non-decreasing, ending at total. Sets *max_len to the longest sequence.
 */
static llmcl_status attn_check_cu(llmcl_ctx *ctx, const llmcl_tensor *cu, const char *name,
                                  int64_t batch, int64_t total, int *max_len)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, cu, name, 1u << LLMCL_I32, 1, 1));
    LLMCL__REQUIRE(ctx, cu->shape[0] == batch + 1, LLMCL_ERROR_SHAPE_MISMATCH,
                   "attention: %s has %lld offsets; cu_seqlens_q has %lld (both B + 1)", name,
                   (long long)cu->shape[0], (long long)(batch + 1));
    int32_t *h = malloc(sizeof(int32_t) * (size_t)cu->shape[0]);
    LLMCL__REQUIRE(ctx, h, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "attention: %s: no host memory", name);
    const llmcl_status st = llmcl_tensor_download(cu, h, sizeof(int32_t) * (size_t)cu->shape[0]);
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
    LLMCL__REQUIRE(ctx, opts->window_left >= -1 && opts->window_right >= -1,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: window_left %d / window_right %d must be >= -1", opts->window_left,
                   opts->window_right);
    LLMCL__REQUIRE(ctx, isfinite(opts->softcap) && opts->softcap >= 0,
                   LLMCL_ERROR_INVALID_ARGUMENT, "attention: softcap %g must be finite and >= 0",
                   (double)opts->softcap);
    LLMCL__REQUIRE(ctx, isfinite(opts->scale) && opts->scale >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "attention: scale %g must be finite and >= 0", (double)opts->scale);

    g->dtype = q->dtype;
    g->D = (int)d;
    g->Hq = (int)hq;
    g->Hkv = (int)hkv;
    g->cu_q = opts->cu_seqlens_q;
    g->cu_k = opts->cu_seqlens_k;
    if (g->varlen) {
        LLMCL__TRY(llmcl__check_tensor(ctx, g->cu_q, "cu_seqlens_q", 1u << LLMCL_I32, 1, 1));
        const int64_t batch = g->cu_q->shape[0] - 1;
        LLMCL__REQUIRE(ctx, batch >= 1 && batch < INT32_MAX, LLMCL_ERROR_SHAPE_MISMATCH,
                       "attention: cu_seqlens_q needs B + 1 >= 2 offsets");
        LLMCL__TRY(attn_check_cu(ctx, g->cu_q, "cu_seqlens_q", batch, tq, &g->Tq));
        LLMCL__TRY(attn_check_cu(ctx, g->cu_k, "cu_seqlens_k", batch, tk, &g->Tk));
        g->B = (int)batch;
    } else {
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

/* ---- tiles ---- */

/* Columns of a kernel's work-item grid: they split D among the work-items of a row. */
static int attn_cols(attn_pass pass, attn_tiles t)
{
    return pass == ATTN_PASS_DKDV ? t.bm / t.tm : t.bn / t.tn;
}

/* Local memory of a kernel in bytes, as attention_portable.cl's header lists it. */
static uint64_t attn_local_bytes(attn_pass pass, int d, llmcl_dtype dtype, attn_tiles t)
{
    const uint64_t dp = (uint64_t)d + 4, m = (uint64_t)t.bm, n = (uint64_t)t.bn;
    const uint64_t eq = t.lf32 >= 1 ? 4 : llmcl_dtype_size(dtype);
    const uint64_t ek = t.lf32 == 1 ? 4 : llmcl_dtype_size(dtype);
    const uint64_t ekq = t.kf32 ? 4 : ek; /* attn_bwd_dq's K tile */
    if (pass == ATTN_PASS_FWD)
        return (m * eq + n * (1 + (uint64_t)t.kvsep) * ek) * dp + 4 * n * (m + 4) +
               4 * m * (n / (uint64_t)t.tn);
    if (pass == ATTN_PASS_DQ)
        return (2 * m * eq + n * (ek + ekq)) * dp + 4 * n * (m + 4);
    return 2 * (m * eq + n * ek) * dp + 4 * (2 * m * (n + 4) + 2 * m);
}

/* Why tiles t cannot run the portable kernel of pass on this device, or NULL when they can. */
static const char *attn_tiles_invalid(const llmcl_ctx *ctx, attn_pass pass, int d,
                                      llmcl_dtype dtype, attn_tiles t)
{
    if (t.bm < 1 || t.bn < 1 || t.tm < 1 || t.tn < 1 || t.bm % t.tm || t.bn % t.tn)
        return "BLOCK_M % TM and BLOCK_N % TN must be 0";
    if (t.lf32 < 0 || t.lf32 > 2)
        return "LF32 must be 0, 1 or 2";
    if (t.kvsep != 0 && t.kvsep != 1)
        return "KV_SEP must be 0 or 1";
    if (t.pipe != 0 && t.pipe != 1)
        return "PIPE must be 0 or 1";
    if (t.kf32 != 0 && t.kf32 != 1)
        return "KF32 must be 0 or 1";
    if (t.unroll < 0 || t.unroll > 64)
        return "UNROLL must lie in [0, 64]";
    if (t.run < 1)
        return "TILE_RUN must be at least 1";
    const int cols = attn_cols(pass, t);
    if (cols > 32 || d % (4 * cols))
        return "4 x the work-item columns must divide D, and the columns be at most 32";
    if ((size_t)(t.bm / t.tm) * (size_t)(t.bn / t.tn) > ctx->info.max_work_group_size)
        return "the work-group exceeds the device's maximum";
    if (attn_local_bytes(pass, d, dtype, t) > ctx->info.local_mem_static_bytes)
        return "the tiles exceed the device's local memory";
    return NULL;
}

/*
 * t with its work-item columns set to the divisor of D / 4 nearest them by ratio (the smaller on a
 * tie), at most 32, and its tile's columns with them: the register tile stays, and the work-group
 * and the tile change by the same factor. The nearest rather than the largest below: D / 4 = 2p
 * with p prime (D = 88: 22) has no divisor between 2 and p, and 2 columns would leave work-groups
 * of a few work-items.
 */
static attn_tiles attn_fit_cols(attn_pass pass, int d, attn_tiles t)
{
    const int want = attn_cols(pass, t);
    int best = 1, best_hi = want, best_lo = 1; /* best's ratio to want: best_hi / best_lo */
    for (int c = 2; c <= 32; ++c) {
        const int hi = c > want ? c : want, lo = c > want ? want : c;
        if ((d / 4) % c == 0 && hi * best_lo < best_hi * lo) {
            best = c;
            best_hi = hi;
            best_lo = lo;
        }
    }
    if (pass == ATTN_PASS_DKDV)
        t.bm = best * t.tm;
    else
        t.bn = best * t.tn;
    return t;
}

/*
 * The heuristic tiles: the first candidate that fits the device. Larger tiles reuse each operand
 * loaded to local memory more; larger register tiles (TM x TN) do more FMAs per local-memory read,
 * which bounds the fp32 path on GPUs. The backward kernels hold four operand tiles. NVIDIA's list
 * starts with the tiles measured best on an H100 (48 KiB of local memory, bf16, D = 128), with
 * PIPE: there the next tile's loads in flight under computation gained 7-10% per kernel, and dQ's
 * K tile in f32 (KF32) another 3% of the backward. Every list runs the grid tile-major
 * (TILE_RUN 1): on the H100 the heaviest causal tiles of every head first cut the backward by 8%.
 * The work-item columns of the lists are powers of two from 4 to 32. For D a multiple of 32 the
 * 8-column candidates divide D / 4 and a candidate that does not is passed over for the next (the
 * H100's figures rest on these choices). For other D the portable candidates take the column
 * count nearest theirs that divides D / 4 (attn_fit_cols); NVIDIA's, measured at D = 128, are
 * taken only where they fit as they stand.
 */
static attn_tiles attn_default_tiles(const llmcl_ctx *ctx, attn_pass pass, int d,
                                     llmcl_dtype dtype)
{
    static const attn_tiles nv_fwd = {32, 64, 8, 2, 2, 0, 2, 1, 0, 1}; /* f32 Q tiles */
    static const attn_tiles nv_dq = {32, 32, 4, 4, 0, 0, 0, 1, 1, 1};     /* f32 K tiles */
    static const attn_tiles nv_dkdv = {32, 32, 4, 4, 0, 0, 2, 1, 0, 1};
    /* Portable lists: plain tiles (operands as stored, one K/V buffer, no hints, no staging). */
#define ATTN_PLAIN(bm, bn, tm, tn) {bm, bn, tm, tn, 0, 0, 0, 0, 0, 1}
    static const attn_tiles fwd[] = {
        ATTN_PLAIN(64, 64, 4, 4), ATTN_PLAIN(64, 32, 4, 4), ATTN_PLAIN(32, 32, 4, 4),
        ATTN_PLAIN(32, 32, 2, 2), ATTN_PLAIN(32, 16, 2, 2), ATTN_PLAIN(16, 16, 2, 2),
        ATTN_PLAIN(16, 8, 2, 1),  ATTN_PLAIN(8, 8, 1, 1),   ATTN_PLAIN(8, 4, 1, 1),
        ATTN_PLAIN(4, 4, 1, 1)};
    static const attn_tiles bwd[] = {
        ATTN_PLAIN(64, 32, 4, 2), ATTN_PLAIN(32, 32, 4, 4), ATTN_PLAIN(32, 32, 2, 2),
        ATTN_PLAIN(32, 16, 2, 2), ATTN_PLAIN(16, 16, 2, 2), ATTN_PLAIN(16, 8, 2, 1),
        ATTN_PLAIN(8, 8, 1, 1),   ATTN_PLAIN(8, 4, 1, 1),   ATTN_PLAIN(4, 4, 1, 1)};
#undef ATTN_PLAIN
    const bool nvidia = ctx->info.vendor_id == LLMCL_VENDOR_NVIDIA;
    if (nvidia) {
        const attn_tiles nv =
            pass == ATTN_PASS_FWD ? nv_fwd : pass == ATTN_PASS_DQ ? nv_dq : nv_dkdv;
        if (!attn_tiles_invalid(ctx, pass, d, dtype, nv))
            return nv;
    }
    const attn_tiles *list = pass == ATTN_PASS_FWD ? fwd : bwd;
    const size_t n = pass == ATTN_PASS_FWD ? sizeof fwd / sizeof *fwd : sizeof bwd / sizeof *bwd;
    /* Mesa 22.3 (rusticl) gets 4 x 4 register blocks wrong for some shapes that PoCL and NVIDIA
       get right: dK in attn_bwd_dkdv, and rows of O and the LSE left unwritten in attn_fwd
       (docs/PORTABILITY.md): 2 x 2 there, in every kernel. */
    const bool small_blocks = ctx->info.vendor_id == LLMCL_VENDOR_MESA;
    attn_tiles t = list[0];
    for (size_t i = 0; i < n; ++i) {
        if (small_blocks && (list[i].tm > 2 || list[i].tn > 2))
            continue;
        t = d % 32 ? attn_fit_cols(pass, d, list[i]) : list[i];
        if (!attn_tiles_invalid(ctx, pass, d, dtype, t))
            break;
    }
    t.pipe = nvidia; /* no local memory of its own: the tiles still fit */
    return t;
}

/* Tiles as tuning parameters and back. */
static void attn_tiles_to_params(attn_pass pass, attn_tiles t, llmcl__params *p)
{
    llmcl__param_set(p, "BLOCK_M", t.bm);
    llmcl__param_set(p, "BLOCK_N", t.bn);
    llmcl__param_set(p, "TM", t.tm);
    llmcl__param_set(p, "TN", t.tn);
    llmcl__param_set(p, "LF32", t.lf32);
    llmcl__param_set(p, "UNROLL", t.unroll);
    llmcl__param_set(p, "PIPE", t.pipe);
    llmcl__param_set(p, "TILE_RUN", t.run);
    if (pass == ATTN_PASS_FWD)
        llmcl__param_set(p, "KV_SEP", t.kvsep);
    if (pass == ATTN_PASS_DQ)
        llmcl__param_set(p, "KF32", t.kf32);
}

static attn_tiles attn_tiles_of_params(attn_pass pass, const llmcl__params *p)
{
    return (attn_tiles){(int)llmcl__param_get(p, "BLOCK_M", 0),
                        (int)llmcl__param_get(p, "BLOCK_N", 0),
                        (int)llmcl__param_get(p, "TM", 0),
                        (int)llmcl__param_get(p, "TN", 0),
                        (int)llmcl__param_get(p, "LF32", 0),
                        pass == ATTN_PASS_FWD ? (int)llmcl__param_get(p, "KV_SEP", 0) : 0,
                        (int)llmcl__param_get(p, "UNROLL", 0),
                        (int)llmcl__param_get(p, "PIPE", 0),
                        pass == ATTN_PASS_DQ ? (int)llmcl__param_get(p, "KF32", 0) : 0,
                        (int)llmcl__param_get(p, "TILE_RUN", 1)};
}

/*
 * The tiles of a tiled kernel: the heuristic defaults, then the tuning database. A file entry
 * tuned for a neighbouring head dim may not fit this one; the defaults then stand. Overrides that
 * do not fit are errors, so that the tuner rejects such candidates.
 */
static llmcl_status attn_tiles_get(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                   const char *cls, llmcl__params *p, attn_tiles *tiles)
{
    const attn_tiles def = attn_default_tiles(ctx, k->pass, g->D, g->dtype);
    attn_tiles_to_params(k->pass, def, p);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, k->key, g->dtype, cls, p);
    attn_tiles t = attn_tiles_of_params(k->pass, p);
    if (t.kvsep && t.pipe) { /* PIPE stages K and V through one buffer: no staging with KV_SEP */
        t.pipe = 0;
        llmcl__param_set(p, "PIPE", 0);
    }
    const char *why = attn_tiles_invalid(ctx, k->pass, g->D, g->dtype, t);
    if (why && !lookup.overridden) {
        llmcl__log("tuning: %s tiles BLOCK_M=%d BLOCK_N=%d TM=%d TN=%d do not fit D=%d (%s); "
                   "the defaults are used",
                   k->name, t.bm, t.bn, t.tm, t.tn, g->D, why);
        t = def;
        attn_tiles_to_params(k->pass, t, p);
        why = attn_tiles_invalid(ctx, k->pass, g->D, g->dtype, t);
    }
    LLMCL__REQUIRE(ctx, !why, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s tiles BLOCK_M=%d BLOCK_N=%d TM=%d TN=%d LF32=%d with D=%d: %s",
                   k->name, t.bm, t.bn, t.tm, t.tn, t.lf32, g->D, why);
    llmcl__params_record(&lookup, p);
    *tiles = t;
    return LLMCL_OK;
}

/*
 * The tensor-core kernels: bf16 or f16 on a device with tensor cores, a head dim that is a multiple
 * of 16 (the mma's k) from 32 to 256, and loaded operands whose rows start on 16 bytes for
 * cp.async. Other calls, the head dims 8 to 24 of tiny models among them, take the portable
 * kernels (LLMCL_LOG says so).
 */
static bool attn_mma_fits(const llmcl_ctx *ctx, const attn_geom *g, bool forward)
{
    const bool fits = ctx->info.has_mma && g->dtype != LLMCL_F32 && g->D % 16 == 0 &&
                      g->D >= 32 && g->D <= 256 && g->aligned8;
    if (!fits && ctx->info.has_mma)
        llmcl__log("attention: the portable %s runs (%s, D=%d, %s)",
                   forward ? "forward" : "backward", llmcl_dtype_name(g->dtype), g->D,
                   g->aligned8 ? "rows aligned" : "offsets or strides not multiples of 8");
    return fits;
}

/* A tensor-core kernel's tile parameters into p (the forward's WM, QREG and STAGES too). */
static void attn_mma_params_set(llmcl__params *p, bool fwd, long bm, long bn, long wm, long qreg,
                                long stages)
{
    llmcl__param_set(p, "BLOCK_M", bm);
    llmcl__param_set(p, "BLOCK_N", bn);
    if (fwd) {
        llmcl__param_set(p, "WM", wm);
        llmcl__param_set(p, "QREG", qreg);
        llmcl__param_set(p, "STAGES", stages);
    }
}

/* Whether attn_bwd_dkdv_mma keeps K and V in local tiles (its DKDV_KV_LOCAL). */
static bool attn_dkdv_kv_local(const attn_geom *g) { return g->D > 96; }

/* Local bytes of a tensor-core kernel's tiles: dK/dV double-buffers its Q and dO tiles, past
   D = 96 beside K and V (K alone in the dV launch), past D = 128 its row statistics staying
   global; dQ double-buffers its K and V tiles, past D = 128 beside dO's as well as Q's; the
   forward has Q and STAGES of K and V. Rows are padded to a power of two of 16-byte chunks. */
static uint64_t attn_mma_local_bytes(const attn_geom *g, attn_pass pass, long bm, long bn,
                                     long stages)
{
    const bool widest = g->D > 128, kv_local = attn_dkdv_kv_local(g);
    const uint64_t d2 = 2u * llmcl__pow2_ceil((size_t)g->D);
    if (pass == ATTN_PASS_DKDV)
        return d2 * (4 * (uint64_t)bm +
                     (kv_local ? (uint64_t)(g->dkdv_part == 1 ? 1 : 2) * bn : 0)) +
               (widest ? 0 : 16u * (uint64_t)bm);
    if (pass == ATTN_PASS_DQ)
        return d2 * (uint64_t)((widest ? 2 : 1) * bm + 4 * bn);
    return d2 * (uint64_t)(bm + 2 * stages * bn);
}

/*
 * The tiles of a tensor-core kernel: BLOCK_M query rows and BLOCK_N keys, multiples of 16, a warp
 * per 16 rows (16 keys in attn_bwd_dkdv_mma; WM x 16 rows in attn_fwd_mma), within local memory and
 * the work-group limit; the defaults keep the registers of D = 128 in bounds. Past D = 128 the
 * backward keeps its operands in local memory (Q and dO beside K and V in dQ, K and V beside the
 * stages in dK/dV): 48 KiB take 16 x 16 tiles (16 x 32 in the dV launch), the 226 KiB of local
 * arrays on sm_90 64 x 16 for dQ and 32 x 64 for dK/dV. Past D = 96 dK/dV keeps K and V in local
 * memory as well, where 48 KiB take 16 x 32 tiles. Tuned values that do not fit fall back to the
 * defaults unless overridden.
 */
static llmcl_status attn_mma_tiles_get(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                       const char *cls, llmcl__params *p, attn_tiles *tiles)
{
    const attn_pass pass = k->pass;
    const bool dkdv = pass == ATTN_PASS_DKDV, fwd = pass == ATTN_PASS_FWD, wide = g->D > 64,
               widest = g->D > 128;
    const uint64_t local = ctx->info.local_mem_static_bytes;
    /*
     * The forward (tuned on the H100): two 16-row tiles a warp up to D = 128, Q's fragments read
     * from local memory past D = 64, double-buffered K and V tiles where they fit beside Q. Past
     * D = 128, and for the forward's second K and V stage at D = 128, the larger tiles need more
     * than 48 KiB, which NVIDIA's OpenCL grants a kernel's local arrays on sm_90; elsewhere the
     * tiles that fit 48 KiB.
     */
    long def_m = dkdv && wide ? 32 : 64, def_n = pass == ATTN_PASS_DQ && wide ? 32 : 64;
    long def_stages = fwd && !wide ? 2 : 1;
    if (fwd) {
        def_m = wide && !widest ? 128 : 64, def_n = widest ? 16 : wide ? 32 : 64;
        if (widest && attn_mma_local_bytes(g, pass, 128, 32, 1) <= local)
            def_m = 128, def_n = 32;
        if (wide && !widest && attn_mma_local_bytes(g, pass, 128, 32, 2) <= local)
            def_stages = 2;
    } else if (widest) {
        const long big_m = dkdv ? 32 : 64, big_n = dkdv ? 64 : 16;
        def_m = 16, def_n = g->dkdv_part == 1 ? 32 : 16; /* the dV launch keeps no V tile */
        if (attn_mma_local_bytes(g, pass, big_m, big_n, 1) <= local)
            def_m = big_m, def_n = big_n;
    } else if (dkdv && attn_dkdv_kv_local(g) &&
               attn_mma_local_bytes(g, pass, def_m, def_n, 1) > local) {
        def_m = 16, def_n = 32; /* K and V in local memory beside the stages, within 48 KiB */
    }
    const long def_wm = fwd && !widest ? 2 : 1, def_qreg = !(fwd && wide);
    attn_mma_params_set(p, fwd, def_m, def_n, def_wm, def_qreg, def_stages);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, k->key, g->dtype, cls, p);
    long bm = llmcl__param_get(p, "BLOCK_M", def_m), bn = llmcl__param_get(p, "BLOCK_N", def_n);
    long wm = fwd ? llmcl__param_get(p, "WM", def_wm) : 1;
    long qreg = fwd ? llmcl__param_get(p, "QREG", def_qreg) : 1;
    long stages = fwd ? llmcl__param_get(p, "STAGES", def_stages) : 1;
    const uint64_t bytes = attn_mma_local_bytes(g, pass, bm, bn, stages);
    const long warps = (dkdv ? bn : bm) / (16 * wm);
    bool ok = bm >= 16 && bm % 16 == 0 && bn >= 16 && bn % 16 == 0 && (wm == 1 || wm == 2) &&
              (qreg == 0 || qreg == 1) && (stages == 1 || stages == 2) &&
              (dkdv ? bn : bm) % (16 * wm) == 0 &&
              (size_t)warps * 32 <= ctx->info.max_work_group_size &&
              bytes <= local && (!dkdv || bn <= 2 * bm);
    if (!ok && !lookup.overridden) {
        bm = def_m, bn = def_n, wm = def_wm, qreg = def_qreg, stages = def_stages, ok = true;
        attn_mma_params_set(p, fwd, bm, bn, wm, qreg, stages);
    }
    LLMCL__REQUIRE(ctx, ok, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s tiles BLOCK_M=%ld BLOCK_N=%ld WM=%ld QREG=%ld STAGES=%ld with "
                   "D=%d need multiples of 16 (of 16 WM rows), WM and STAGES 1 or 2, QREG 0 or 1, "
                   "at most %zu work-items and %llu bytes of local memory%s",
                   k->name, bm, bn, wm, qreg, stages, g->D,
                   ctx->info.max_work_group_size,
                   (unsigned long long)local, dkdv ? ", and BLOCK_N <= 2 BLOCK_M" : "");
    llmcl__params_record(&lookup, p);
    *tiles = (attn_tiles){.bm = (int)bm, .bn = (int)bn, .tm = (int)(16 * wm), .tn = (int)bn,
                          .run = 1};
    return LLMCL_OK;
}

/* Whether the device's wgmma kernels take this call (D 64 and 128, where mma.sync's would run). */
static bool attn_wgmma_fits(const llmcl_ctx *ctx, const attn_geom *g)
{
    return ctx->info.has_wgmma && (g->D == 64 || g->D == 128);
}

/* The set that runs a call's forward (forward) or backward: wgmma, mma.sync or portable. */
static attn_arch attn_arch_of(const llmcl_ctx *ctx, const attn_geom *g, bool forward)
{
    if (!attn_mma_fits(ctx, g, forward))
        return ATTN_ARCH_PORTABLE;
    return attn_wgmma_fits(ctx, g) ? ATTN_ARCH_WGMMA : ATTN_ARCH_MMA;
}

/* Local bytes of a wgmma kernel: the forward's Q and STAGES of K and V, dQ's Q and dO and two
   stages of K and V, dK/dV's K and V and two stages of Q and dO with their rows' statistics;
   rows of D 16-bit elements. */
static uint64_t attn_wg_local_bytes(const attn_geom *g, attn_pass pass, long bm, long bn,
                                    long stages)
{
    if (pass == ATTN_PASS_DKDV)
        return 2u * (uint64_t)g->D * (uint64_t)(2 * bn + 4 * bm) + 16u * (uint64_t)bm;
    const long rows = pass == ATTN_PASS_FWD ? bm + 2 * stages * bn : 2 * bm + 4 * bn;
    return 2u * (uint64_t)g->D * (uint64_t)rows;
}

/*
 * The tiles of a wgmma kernel: BLOCK_M 64 or 128 query rows, BLOCK_N 64 or 128 keys (a warpgroup
 * per 64 queries, or keys in dK/dV); the forward's STAGES 3 to 5 buffers of K and V. The
 * defaults, tuned on the H100: the forward at D = 128 two warpgroups on 128 x 128 tiles in 3
 * stages (224 KiB), at D = 64 one on 64 x 64 tiles, three work-groups to a multiprocessor, which
 * overlap one's softmax with another's products (1.14x over 128 x 128); dQ one warpgroup on
 * 64 x 64 tiles; dK/dV two on 128 keys over 64-query tiles at D = 128 (128-query tiles spill:
 * the backward 6.41 against 5.16 ms), over 128-query tiles at D = 64 (1.13x); 64 x 64 where the
 * larger tiles do not fit. Tuned values that do not fit fall back to the defaults unless
 * overridden.
 */
static llmcl_status attn_wg_tiles_get(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                      const char *cls, llmcl__params *p, attn_tiles *tiles)
{
    const uint64_t local = ctx->info.local_mem_static_bytes;
    const attn_pass pass = k->pass;
    const bool fwd = pass == ATTN_PASS_FWD;
    long def_m = pass == ATTN_PASS_DKDV && g->D > 64 ? 64 : 128, def_n = 128;
    if (pass == ATTN_PASS_DQ || (fwd && g->D <= 64) ||
        attn_wg_local_bytes(g, pass, def_m, def_n, 3) > local)
        def_m = 64, def_n = 64;
    llmcl__param_set(p, "BLOCK_M", def_m);
    llmcl__param_set(p, "BLOCK_N", def_n);
    if (fwd)
        llmcl__param_set(p, "STAGES", 3);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, k->key, g->dtype, cls, p);
    long bm = llmcl__param_get(p, "BLOCK_M", def_m), bn = llmcl__param_get(p, "BLOCK_N", def_n);
    long stages = fwd ? llmcl__param_get(p, "STAGES", 3) : 2;
    bool ok = (bm == 64 || bm == 128) && (bn == 64 || bn == 128) &&
              (!fwd || (stages >= 3 && stages <= 5)) &&
              attn_wg_local_bytes(g, pass, bm, bn, stages) <= local;
    if (!ok && !lookup.overridden) {
        bm = def_m, bn = def_n, stages = fwd ? 3 : 2, ok = true;
        llmcl__param_set(p, "BLOCK_M", bm);
        llmcl__param_set(p, "BLOCK_N", bn);
        if (fwd)
            llmcl__param_set(p, "STAGES", stages);
    }
    char st[32] = "";
    if (fwd)
        snprintf(st, sizeof st, " STAGES=%ld", stages);
    LLMCL__REQUIRE(ctx, ok, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s tiles BLOCK_M=%ld BLOCK_N=%ld%s with D=%d need BLOCK_M and "
                   "BLOCK_N 64 or 128%s and at most %llu bytes of local memory",
                   k->name, bm, bn, st, g->D, fwd ? ", STAGES 3 to 5" : "",
                   (unsigned long long)local);
    llmcl__params_record(&lookup, p);
    *tiles = (attn_tiles){.bm = (int)bm, .bn = (int)bn, .tm = 64, .tn = (int)bn, .run = 1};
    return LLMCL_OK;
}

/* A kernel's tiles and work-group size, and its parameters in p; the head dim is the tuning size
   key. */
static llmcl_status attn_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                llmcl__params *p, attn_tiles *tiles, size_t *wg)
{
    char cls[16];
    llmcl__shape_class(g->D, cls);
    if (k->pass == ATTN_PASS_PRE) {
        llmcl__param_set(p, "PRE_WG", ctx->info.max_work_group_size >= 64 ? 64 : 1);
        llmcl__params_lookup(ctx, k->key, g->dtype, cls, p);
        const long w = llmcl__param_get(p, "PRE_WG", 64);
        LLMCL__REQUIRE(ctx, w >= 1 && (size_t)w <= ctx->info.max_work_group_size,
                       LLMCL_ERROR_UNSUPPORTED, "attention: PRE_WG %ld is outside [1, %zu]", w,
                       ctx->info.max_work_group_size);
        *wg = (size_t)w;
    } else if (k->arch == ATTN_ARCH_WGMMA) {
        LLMCL__TRY(attn_wg_tiles_get(ctx, g, k, cls, p, tiles));
        /* 128 work-items a warpgroup, one per 64 rows: queries, or keys in dK/dV */
        *wg = (size_t)(k->pass == ATTN_PASS_DKDV ? tiles->bn : tiles->bm) * 2;
    } else if (k->arch == ATTN_ARCH_MMA) {
        LLMCL__TRY(attn_mma_tiles_get(ctx, g, k, cls, p, tiles));
        *wg = (size_t)(k->pass == ATTN_PASS_DKDV ? tiles->bn / 16 : tiles->bm / tiles->tm) * 32;
    } else {
        LLMCL__TRY(attn_tiles_get(ctx, g, k, cls, p, tiles));
        *wg = (size_t)(tiles->bm / tiles->tm) * (size_t)(tiles->bn / tiles->tn);
    }
    return LLMCL_OK;
}

/* The kernel built with attn_config's parameters p. */
static llmcl_status attn_build(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                               const llmcl__params *p, cl_kernel *out)
{
    llmcl__defines defs = {0};
    llmcl__define_int(&defs, "D", g->D);
    llmcl__define_str(&defs, "IO_DT", llmcl__dtype_macro(g->dtype));
    llmcl__define_flag(&defs, k->define);
    if (k->arch == ATTN_ARCH_MMA && k->pass == ATTN_PASS_DKDV && g->dkdv_part)
        llmcl__define_int(&defs, "DKDV_PART", g->dkdv_part);
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

/* ---- loop budgets ---- */

/*
 * Loop passes (llmcl__loop_budget's count) of the portable kernels as attention_portable.cl
 * writes them: a loop of t trips makes t + 1, plus its body's passes on every trip; every loop
 * counts, the `#pragma unroll` ones and those under a condition too, for the work-item with the
 * most pieces of a shared copy (llvmpipe runs a loop as long as any lane of a batch does).
 */
static int64_t attn_loop(int64_t trips, int64_t body) { return trips + 1 + trips * body; }

/* Two nested loops with empty bodies inside: register-tile set-ups, stores, the score math. */
static int64_t attn_nest(int64_t outer, int64_t inner)
{
    return attn_loop(outer, attn_loop(inner, 0));
}

/* A tile of rows x D staged in 4-wide pieces by `threads` work-items (load, fetch or put). */
static int64_t attn_copy(int64_t rows, int d, int64_t threads)
{
    return attn_loop(llmcl__div_up(rows * (d / 4), threads), 0);
}

/* A score product over D (attn_fwd's S, the backward's S and dP): per 4 of D the rows' and the
   columns' operand reads and their rows x cols dot steps. */
static int64_t attn_score_loops(int d, int rows, int cols)
{
    return attn_loop(d / 4, attn_loop(rows, 0) + attn_loop(cols, 0) + attn_nest(rows, cols));
}

/* ATTN_ACCUMULATE over n score rows of pitch floats: per row attn_read_col's `rows` scores (4 wide
   where rows and the pitch allow), the cols4 operand reads and their rows x cols4 FMAs. */
static int64_t attn_accumulate_loops(int rows, int cols4, int pitch, int n)
{
    const int64_t col = attn_loop(rows % 4 == 0 && pitch % 4 == 0 ? rows / 4 : rows, 0);
    return attn_loop(n, col + attn_loop(cols4, 0) + attn_nest(rows, cols4));
}

/* A portable kernel's passes: once (`fixed`), a step of its walk (a key tile of attn_fwd and
   attn_bwd_dq, a (query head, query tile) pair of attn_bwd_dkdv), and what a SPLIT launch adds
   (its state loaded and saved). */
typedef struct attn_passes {
    int64_t fixed, step, split;
} attn_passes;

static attn_passes attn_passes_of(attn_pass pass, int d, attn_tiles t)
{
    const int pipe = t.pipe != 0;
    if (pass == ATTN_PASS_DKDV) {
        const int rt = t.bn / t.tn, ct = t.bm / t.tm, dt4 = d / (4 * ct), w = rt * ct;
        const int64_t qt = attn_copy(t.bm, d, w), acc = attn_nest(t.tn, dt4);
        return (attn_passes){
            .fixed = 2 * attn_copy(t.bn, d, w) + 2 * acc + 2 * pipe * qt + 1,
            .step = 1 + 2 * qt + attn_loop(llmcl__div_up(t.bm, w), 0) + 2 * attn_nest(t.tn, t.tm) +
                    attn_score_loops(d, t.tn, t.tm) + 2 * pipe * qt +
                    2 * attn_accumulate_loops(t.tn, dt4, t.bn + 4, t.bm),
            .split = 4 * acc};
    }
    const int rt = t.bm / t.tm, ct = t.bn / t.tn, dt4 = d / (4 * ct), w = rt * ct;
    const int64_t kv = attn_copy(t.bn, d, w), acc = attn_nest(t.tm, dt4);
    /* a step: K and V staged (PIPE: fetched, then put), the score tiles' set-up and math, the
       score product and the accumulating one */
    const int64_t step = 1 + (2 + 2 * pipe) * kv + 2 * attn_nest(t.tm, t.tn) +
                         attn_score_loops(d, t.tm, t.tn) +
                         attn_accumulate_loops(t.tm, dt4, t.bm + 4, t.bn);
    if (pass == ATTN_PASS_FWD) /* and the rows' running maxima and sums */
        return (attn_passes){
            .fixed = attn_copy(t.bm, d, w) + acc + pipe * kv + 1 + attn_loop(t.tm, 0) +
                     attn_loop(t.tm, attn_loop(ct, 0) + attn_loop(dt4, 0)),
            .step = step +
                    attn_loop(t.tm, attn_loop(ct, 0) + attn_loop(t.tn, 0) + attn_loop(dt4, 0)),
            .split = 2 * (acc + attn_loop(t.tm, 0))};
    return (attn_passes){/* attn_bwd_dq */
                         .fixed = 2 * attn_copy(t.bm, d, w) + 2 * acc + 2 * pipe * kv + 1,
                         .step = step,
                         .split = 2 * acc};
}

/* The most steps of `step` rows that a tile of `other` rows walks over a sequence of len rows:
   all of them, or those of a window's band. */
static int64_t attn_walk(int64_t len, int step, int other, int wl, int wr)
{
    int64_t n = llmcl__div_up(len, step);
    if (wl >= 0 && wr >= 0) {
        const int64_t band = llmcl__div_up((int64_t)other + wl + wr + step - 1, step);
        n = band < n ? band : n;
    }
    return n;
}

/* How a portable kernel's walk runs: `per` of its `steps` a launch, in `launches`. */
typedef struct attn_split {
    int64_t steps, per, launches;
} attn_split;

/*
 * The split of portable kernel k with tiles t within the device's loop budget: one launch
 * where every work-item's walk fits, else launches of as many steps as fit beside the state they
 * load and save (SPLIT). Refused where not one step fits.
 */
static llmcl_status attn_split_of(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                  attn_tiles t, attn_split *out)
{
    const int64_t budget = llmcl__loop_budget(ctx);
    const attn_passes p = attn_passes_of(k->pass, g->D, t);
    const int64_t group = g->Hq / g->Hkv;
    const int64_t steps = k->pass == ATTN_PASS_DKDV
                              ? group * attn_walk(g->Tq, t.bm, t.bn, g->wl, g->wr)
                              : attn_walk(g->Tk, t.bn, t.bm, g->wl, g->wr);
    *out = (attn_split){steps, steps, 1};
    if (p.fixed + steps * p.step <= budget)
        return LLMCL_OK;
    LLMCL__REQUIRE(ctx, steps <= INT32_MAX, LLMCL_ERROR_OVERFLOW,
                   "attention: %s's walk of %lld steps must fit in 31 bits", k->name,
                   (long long)steps);
    const int64_t fixed = p.fixed + p.split;
    LLMCL__TRY(llmcl__check_loops(ctx, fixed + p.step,
                                  "attention: %s at D = %d, Tq = %d, Tk = %d with tiles BLOCK_M=%d "
                                  "BLOCK_N=%d TM=%d TN=%d, one step of its walk",
                                  k->name, g->D, g->Tq, g->Tk, t.bm, t.bn, t.tm, t.tn));
    out->per = (budget - fixed) / p.step;
    out->launches = llmcl__div_up(steps, out->per);
    return LLMCL_OK;
}

/* That portable kernel k's walk fits the device's loop budget, split where it must be: the
   backward checks its kernels before its first launch. */
static llmcl_status attn_check_split(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k)
{
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    attn_split split;
    LLMCL__TRY(attn_config(ctx, g, k, &p, &t, &wg));
    return attn_split_of(ctx, g, k, t, &split);
}

/* ---- launches ---- */

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

/*
 * A tiled kernel: attn_bwd_dkdv (and its tensor-core versions) runs a work-group per key tile of a
 * KV head, the others per query tile of a query head, on a flat grid that the kernels read
 * tile-major (attn_place_of). A portable kernel whose walk passes the device's loop budget runs
 * in launches of parts of it (attn_split_of).
 */
static llmcl_status attn_launch_tiled(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                      const llmcl_tensor *const *ts, int n,
                                      const llmcl_tensor *lse, const llmcl_tensor *delta)
{
    llmcl__params p = {0};
    attn_tiles t;
    attn_launch l = {.ts = ts, .n = n, .lse = lse, .delta = delta};
    LLMCL__TRY(attn_config(ctx, g, k, &p, &t, &l.wg));
    attn_split split = {0, 0, 1};
    if (k->arch == ATTN_ARCH_PORTABLE)
        LLMCL__TRY(attn_split_of(ctx, g, k, t, &split));
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
    l.global = (size_t)tiles * (size_t)g->B * (size_t)l.heads * l.wg;
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
    llmcl__args a = attn_args_tiled(ctx, g, &l);
    return llmcl__launch(&a, 1, &l.global, &l.wg);
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
    return attn_launch_tiled(ctx, &g, attn_kernel_of(ATTN_PASS_FWD, attn_arch_of(ctx, &g, true)),
                             ts, 5, lse, NULL);
}

static llmcl_status attn_launch_pre(llmcl_ctx *ctx, const attn_geom *g, const llmcl_tensor *o,
                                    const llmcl_tensor *dout, llmcl_tensor *delta)
{
    llmcl__params p = {0};
    attn_tiles t;
    size_t wg;
    const attn_kernel *k = attn_kernel_of(ATTN_PASS_PRE, ATTN_ARCH_PORTABLE);
    LLMCL__TRY(attn_config(ctx, g, k, &p, &t, &wg));
    /* a work-item a row, its one loop over D */
    LLMCL__TRY(llmcl__check_loops(ctx, g->D / 4 + 1, "attention: attn_bwd_pre at D = %d", g->D));
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
    const size_t global[2] = {(size_t)llmcl__div_up(g->Tq, (int64_t)wg) * wg, (size_t)g->B * g->Hq};
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
    g.aligned4 =
        attn_aligned(q, 4) && attn_aligned(k, 4) && attn_aligned(v, 4) && attn_aligned(dout, 4);
    g.aligned8 =
        attn_aligned(q, 8) && attn_aligned(k, 8) && attn_aligned(v, 8) && attn_aligned(dout, 8);
    g.bwd = attn_arch_of(ctx, &g, false);
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
    LLMCL__TRY_GOTO(st, attn_launch_pre(ctx, &g, o, dout, delta), done);
    if (keys)
        LLMCL__TRY_GOTO(st, attn_launch_dkdv(ctx, &g, q, k, v, dout, lse, delta, dk, dv), done);
    LLMCL__TRY_GOTO(st, attn_launch_dq(ctx, &g, q, k, v, dout, lse, delta, dq), done);
done:
    llmcl_tensor_destroy(delta);
    return st;
}
