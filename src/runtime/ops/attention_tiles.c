/*
 * attention_tiles.c: which kernel set runs an attention call (llmcl__attn_arch) and the
 * parameters of its kernels (llmcl__attn_config): a function per set, attn_portable_config,
 * attn_mma_config and attn_wgmma_config, each with its defaults, the tunables it reads and the
 * limits its tiles must fit (local memory, work-group size). The tuning database's values
 * override the defaults; a file entry that does not fit falls back to them, an override that does
 * not fit is an error (so that the tuner rejects such candidates). The head dim is the size key.
 */
#include <stdio.h>
#include <string.h>

#include "src/runtime/ops/attention.h"

/* ---- which set runs a call ---- */

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

/* Whether the device's wgmma kernels take this call (D 64, 128 and 256, where mma.sync's would
   run). */
static bool attn_wgmma_fits(const llmcl_ctx *ctx, const attn_geom *g)
{
    return ctx->info.has_wgmma && (g->D == 64 || g->D == 128 || g->D == 256);
}

attn_arch llmcl__attn_arch(const llmcl_ctx *ctx, const attn_geom *g, bool forward)
{
    if (!attn_mma_fits(ctx, g, forward))
        return ATTN_ARCH_PORTABLE;
    return attn_wgmma_fits(ctx, g) ? ATTN_ARCH_WGMMA : ATTN_ARCH_MMA;
}

/* ---- the portable kernels (attention_portable.cl) ---- */

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
 * attn_bwd_pre's PRE_WG, PRE_LANES, PRE_ROWS and PRE_VEC. On a GPU a row's PRE_VEC-wide chunks go
 * to up to 32 work-items (one contiguous run of the row a warp) in groups of 256, each with 4 rows'
 * loads in flight; on a CPU, whose work-items of a group run one after another, a work-item a row
 * in groups of 64. At most the device's work-group size. PRE_VEC is the rows' alignment's, not a
 * tunable.
 */
static llmcl_status attn_pre_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                    const char *cls, llmcl__params *p, size_t *wg)
{
    const long max_wg = (long)ctx->info.max_work_group_size;
    const int vec = g->pre_vec8 ? 8 : 4;
    const size_t chunks = (size_t)g->D / (size_t)vec;
    const long lanes = ctx->info.is_gpu ? (long)llmcl__pow2_floor(chunks < 32 ? chunks : 32) : 1;
    const long w = ctx->info.is_gpu ? 256 : 64;
    llmcl__param_set(p, "PRE_LANES", lanes <= max_wg ? lanes : 1);
    llmcl__param_set(p, "PRE_WG", w <= max_wg ? w : (long)llmcl__pow2_floor((size_t)max_wg));
    llmcl__param_set(p, "PRE_ROWS", ctx->info.is_gpu ? 4 : 1);
    const llmcl__tune_lookup lookup = llmcl__params_lookup(ctx, k->key, g->dtype, cls, p);
    llmcl__param_set(p, "PRE_VEC", vec);
    llmcl__params_record(&lookup, p);
    const long wg_size = llmcl__param_get(p, "PRE_WG", 64), l = llmcl__param_get(p, "PRE_LANES", 1);
    const long rows = llmcl__param_get(p, "PRE_ROWS", 1);
    LLMCL__REQUIRE(ctx, wg_size >= 1 && wg_size <= max_wg, LLMCL_ERROR_UNSUPPORTED,
                   "attention: PRE_WG %ld is outside [1, %ld]", wg_size, max_wg);
    LLMCL__REQUIRE(ctx, l >= 1 && l == (long)llmcl__pow2_floor((size_t)l) && wg_size % l == 0,
                   LLMCL_ERROR_UNSUPPORTED,
                   "attention: PRE_LANES %ld is not a power of two that divides PRE_WG %ld", l,
                   wg_size);
    LLMCL__REQUIRE(ctx, rows >= 1 && rows <= 16, LLMCL_ERROR_UNSUPPORTED,
                   "attention: PRE_ROWS %ld is outside [1, 16]", rows);
    /* the rows' partial sums in local memory where no warp shuffle sums them */
    const uint64_t part = 4u * (uint64_t)rows * (uint64_t)wg_size;
    LLMCL__REQUIRE(ctx, part <= ctx->info.local_mem_static_bytes, LLMCL_ERROR_UNSUPPORTED,
                   "attention: PRE_ROWS %ld x PRE_WG %ld take %llu bytes of local memory, past "
                   "the device's %llu",
                   rows, wg_size, (unsigned long long)part,
                   (unsigned long long)ctx->info.local_mem_static_bytes);
    *wg = (size_t)wg_size;
    return LLMCL_OK;
}

/*
 * The portable kernels' parameters: attn_bwd_pre's PRE_WG and PRE_LANES (attn_pre_config); the
 * tiled kernels' BLOCK_M, BLOCK_N, TM, TN, LF32, UNROLL, PIPE and TILE_RUN, attn_fwd's KV_SEP and
 * attn_bwd_dq's KF32, from attn_default_tiles and the tuning database (PIPE off with KV_SEP).
 * Work-groups of (BLOCK_M / TM) x (BLOCK_N / TN) work-items.
 */
static llmcl_status attn_portable_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                         const char *cls, llmcl__params *p, attn_tiles *tiles,
                                         size_t *wg)
{
    if (k->pass == ATTN_PASS_PRE)
        return attn_pre_config(ctx, g, k, cls, p, wg);
    const attn_tiles def = attn_default_tiles(ctx, k->pass, g->D, g->dtype);
    attn_tiles t;
    const char *why;
    llmcl__tune_lookup lookup;
    for (int round = 0;; ++round) { /* the files' entries, then the defaults where they misfit */
        attn_tiles_to_params(k->pass, def, p);
        lookup = round == 0 ? llmcl__params_lookup(ctx, k->key, g->dtype, cls, p)
                            : llmcl__params_lookup_overrides(ctx, k->key, g->dtype, cls, p);
        t = attn_tiles_of_params(k->pass, p);
        if (t.kvsep && t.pipe) { /* PIPE stages K and V through one buffer: none with KV_SEP */
            t.pipe = 0;
            llmcl__param_set(p, "PIPE", 0);
        }
        why = attn_tiles_invalid(ctx, k->pass, g->D, g->dtype, t);
        if (!why || round == 1 || !lookup.tuned)
            break;
        llmcl__log("tuning: %s tiles BLOCK_M=%d BLOCK_N=%d TM=%d TN=%d do not fit D=%d (%s); "
                   "the defaults are used",
                   k->name, t.bm, t.bn, t.tm, t.tn, g->D, why);
    }
    LLMCL__REQUIRE(ctx, !why, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s tiles BLOCK_M=%d BLOCK_N=%d TM=%d TN=%d LF32=%d with D=%d: %s",
                   k->name, t.bm, t.bn, t.tm, t.tn, t.lf32, g->D, why);
    llmcl__params_record(&lookup, p);
    *tiles = t;
    *wg = (size_t)(t.bm / t.tm) * (size_t)(t.bn / t.tn);
    return LLMCL_OK;
}

/* ---- the mma.sync kernels (attention_mma.cl) ---- */

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
 * The mma.sync kernels' parameters: BLOCK_M query rows and BLOCK_N keys, multiples of 16, a warp
 * per 16 rows (16 keys in attn_bwd_dkdv_mma, where BLOCK_N <= 2 BLOCK_M; WM x 16 rows in
 * attn_fwd_mma, which also reads WM and STAGES, 1 or 2, and QREG, 0 or 1), within local memory and
 * the work-group limit; the defaults keep the registers of D = 128 in bounds. Past D = 128 the
 * backward keeps its operands in local memory (Q and dO beside K and V in dQ, K and V beside the
 * stages in dK/dV): 48 KiB take 16 x 16 tiles (16 x 32 in the dV launch), the 226 KiB of local
 * arrays on sm_90 64 x 16 for dQ and 32 x 64 for dK/dV. Past D = 96 dK/dV keeps K and V in local
 * memory as well, where 48 KiB take 16 x 32 tiles. Tuned values that do not fit give way to the
 * defaults, with any override's values kept.
 */
static llmcl_status attn_mma_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                    const char *cls, llmcl__params *p, attn_tiles *tiles,
                                    size_t *wg)
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
    long bm, bn, wm, qreg, stages;
    bool ok;
    llmcl__tune_lookup lookup;
    for (int round = 0;; ++round) { /* the files' entries, then the defaults where they misfit */
        attn_mma_params_set(p, fwd, def_m, def_n, def_wm, def_qreg, def_stages);
        lookup = round == 0 ? llmcl__params_lookup(ctx, k->key, g->dtype, cls, p)
                            : llmcl__params_lookup_overrides(ctx, k->key, g->dtype, cls, p);
        bm = llmcl__param_get(p, "BLOCK_M", def_m), bn = llmcl__param_get(p, "BLOCK_N", def_n);
        wm = fwd ? llmcl__param_get(p, "WM", def_wm) : 1;
        qreg = fwd ? llmcl__param_get(p, "QREG", def_qreg) : 1;
        stages = fwd ? llmcl__param_get(p, "STAGES", def_stages) : 1;
        const long warps = (dkdv ? bn : bm) / (16 * wm);
        ok = bm >= 16 && bm % 16 == 0 && bn >= 16 && bn % 16 == 0 && (wm == 1 || wm == 2) &&
             (qreg == 0 || qreg == 1) && (stages == 1 || stages == 2) &&
             (dkdv ? bn : bm) % (16 * wm) == 0 &&
             (size_t)warps * 32 <= ctx->info.max_work_group_size &&
             attn_mma_local_bytes(g, pass, bm, bn, stages) <= local && (!dkdv || bn <= 2 * bm);
        if (ok || round == 1 || !lookup.tuned)
            break;
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
    *wg = (size_t)((dkdv ? bn : bm) / (16 * wm)) * 32;
    return LLMCL_OK;
}

/* ---- the wgmma kernels (attention_wgmma.cl) ---- */

/* Whether dK/dV pairs two warpgroups on each 64 keys (attention_wgmma.cl's DKDV_PAIR). */
static bool attn_wg_pair(const attn_geom *g, attn_pass pass)
{
    return pass == ATTN_PASS_DKDV && g->D > 128;
}

/* Local bytes of a wgmma kernel: the forward's Q and STAGES of K and V, dQ's Q and dO and two
   stages of K and V, dK/dV's K and V and STAGES of Q and dO with their rows' statistics (and a
   pair's float4 a lane and 8 queries, with two mbarriers; or, storing dS, `slabs` slabs of bm
   rows of 64 keys a warpgroup); rows of D 16-bit elements; with TMA, an mbarrier for the resident
   tiles and three a stage (two in dK/dV). dQ from dS: STAGES of a K tile and a dS tile. */
static uint64_t attn_wg_local_bytes(const attn_geom *g, attn_pass pass, long bm, long bn,
                                    long stages, bool tma, long slabs)
{
    if (pass == ATTN_PASS_DKDV)
        return 2u * (uint64_t)g->D * (uint64_t)(2 * bn + 2 * stages * bm) +
               8u * (uint64_t)(stages * bm) + (tma ? 8u * (uint64_t)(1 + 2 * stages) : 0) +
               (attn_wg_pair(g, pass) ? 256u * (uint64_t)bm + 16u : 0) +
               (g->ds ? 2u * 128u * (uint64_t)(slabs * bm) : 0);
    if (pass == ATTN_PASS_DQ_DS)
        return 2u * (uint64_t)stages * (uint64_t)(bn * g->D + bm * bn) +
               8u * (uint64_t)(1 + 2 * stages);
    const long rows = pass == ATTN_PASS_FWD ? bm + 2 * stages * bn : 2 * bm + 4 * bn;
    return 2u * (uint64_t)g->D * (uint64_t)rows + (tma ? 8u * (uint64_t)(1 + 3 * stages) : 0);
}

/* Whether the kernels copy by TMA where the device has it (nv_tma.c). */
#define ATTN_WG_TMA_DEFAULT 1

/* The producer work-items with TMA: a warpgroup beside two (setmaxnreg), else a warp. */
static size_t attn_wg_producers(long consumers, bool tma)
{
    return tma ? (consumers == 256 ? 128 : 32) : 0;
}

/*
 * attn_bwd_dq_ds_wgmma's parameters: blocks of ATTN_DS_BM queries over dK/dV's key tiles (g->ds),
 * a producer warp, TMA, STAGES 2 to 4 buffers of K and dS, and PERSIST 0 to 4 work-groups a
 * compute unit that walk several items each (0: a work-group an item). STAGES default 3 at
 * D 128 (192 KiB; on the H200 0.83-0.88 ms at B4 T4096 against 1.09-1.17 with 2), 2 at D 64
 * (1.03 against 1.10); PERSIST as many work-groups as those stages let share a compute unit.
 */
static llmcl_status attn_dq_ds_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                      const char *cls, llmcl__params *p, attn_tiles *tiles,
                                      size_t *wg)
{
    const long bm = ATTN_DS_BM, bn = g->ds->bn, def_stages = g->D > 64 ? 3 : 2;
    const long def_persist = g->D > 64 ? 1 : 2; /* as many as share a compute unit */
    const uint64_t local = ctx->info.local_mem_static_bytes;
    long stages, persist;
    bool ok;
    llmcl__tune_lookup lookup;
    for (int round = 0;; ++round) { /* the files' entries, then the defaults where they misfit */
        llmcl__param_set(p, "STAGES", def_stages);
        llmcl__param_set(p, "PERSIST", def_persist);
        lookup = round == 0 ? llmcl__params_lookup(ctx, k->key, g->dtype, cls, p)
                            : llmcl__params_lookup_overrides(ctx, k->key, g->dtype, cls, p);
        stages = llmcl__param_get(p, "STAGES", def_stages);
        persist = llmcl__param_get(p, "PERSIST", def_persist);
        ok = stages >= 2 && stages <= 4 && persist >= 0 && persist <= 4 &&
             attn_wg_local_bytes(g, k->pass, bm, bn, stages, true, 0) <= local;
        if (ok || round == 1 || !lookup.tuned)
            break;
    }
    if (!ok && !lookup.overridden) { /* dK/dV's tiles leave room for two */
        stages = 2;
        ok = attn_wg_local_bytes(g, k->pass, bm, bn, stages, true, 0) <= local;
    }
    LLMCL__REQUIRE(ctx, ok, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s STAGES=%ld PERSIST=%ld with BLOCK_M=%ld, dK/dV's BLOCK_N=%ld "
                   "and D=%d needs STAGES 2 to 4 within %llu bytes of local memory and PERSIST "
                   "0 to 4",
                   k->name, stages, persist, bm, bn, g->D, (unsigned long long)local);
    llmcl__param_set(p, "STAGES", stages);
    llmcl__param_set(p, "PERSIST", persist);
    llmcl__param_set(p, "BLOCK_M", bm);
    llmcl__param_set(p, "BLOCK_N", bn);
    llmcl__param_set(p, "TMA", 1);
    llmcl__params_record(&lookup, p);
    *tiles = (attn_tiles){.bm = (int)bm, .bn = (int)bn, .tm = 64, .tn = (int)bn, .run = 1};
    *wg = (size_t)(2 * bm) + 32;
    return LLMCL_OK;
}

/*
 * The forward's PERSIST where its copies are by TMA: as many work-groups a compute unit as its
 * default tiles let share one, one past D = 64 and three at D = 64 (on the H200, B4 Hq32 T4096
 * D128: 1.106 -> 0.935 ms; T2048 D64: 0.239 -> 0.221, T4096 D64 level; at D 64 one or two a
 * compute unit were slower, 0.92-1.51 against 0.81 ms).
 */
static long attn_fwd_persist(const attn_geom *g, long tma)
{
    return tma != 1 ? 0 : g->D > 64 ? 1 : 3;
}

/*
 * The wgmma kernels' parameters: BLOCK_M 64 or 128 query rows, BLOCK_N 64 or 128 keys (a
 * warpgroup of 128 work-items per 64 queries, or keys in dK/dV); the forward's STAGES 3 to 5
 * buffers of K and V, dK/dV's 2 (or 3 with TMA) of Q and dO; TMA 1 (copies by TMA, with producer
 * work-items) or 0 (by cp.async); the forward's PERSIST work-groups a compute unit that walk its
 * items (0: a work-group an item; TMA only; -1, or none tuned: attn_fwd_persist's), dK/dV's
 * DS_SLABS where it stores dS. The
 * defaults, tuned on the H100: the forward at D = 128 two warpgroups on 128 x 128 tiles in 3
 * stages (224 KiB), at D = 64 one on 64 x 64 tiles, three work-groups to a multiprocessor, which
 * overlap one's softmax with another's products (1.14x over 128 x 128); dQ one warpgroup on
 * 64 x 64 tiles; dK/dV two on 128 keys over 64-query tiles at D = 128 (128-query tiles spill:
 * the backward 6.41 against 5.16 ms), over 128-query tiles at D = 64 (1.13x); 64 x 64 where the
 * larger tiles do not fit (every kernel at D = 256, where dK/dV pairs two warpgroups on 64 keys).
 * On the H200: DS_SLABS 3 at D = 128, 2 at D = 64, and the forward persistent (attn_fwd_persist).
 * Tuned values that do not fit give way to the defaults, with any override's values kept.
 */
static llmcl_status attn_wgmma_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                      const char *cls, llmcl__params *p, attn_tiles *tiles,
                                      size_t *wg)
{
    if (k->pass == ATTN_PASS_DQ_DS)
        return attn_dq_ds_config(ctx, g, k, cls, p, tiles, wg);
    const uint64_t local = ctx->info.local_mem_static_bytes;
    const attn_pass pass = k->pass;
    const bool fwd = pass == ATTN_PASS_FWD;
    const bool dkdv = pass == ATTN_PASS_DKDV, staged = fwd || dkdv; /* a STAGES tunable */
    const long def_stages = fwd ? 3 : 2, def_slabs = g->D == 128 ? 3 : 2;
    const bool slabbed = dkdv && g->ds; /* a DS_SLABS tunable */
    long def_m = dkdv && g->D > 64 ? 64 : 128, def_n = 128;
    const long def_tma = ctx->tma ? ATTN_WG_TMA_DEFAULT : 0;
    if (pass == ATTN_PASS_DQ || (fwd && g->D <= 64) ||
        attn_wg_local_bytes(g, pass, def_m, def_n, def_stages, def_tma, def_slabs) > local)
        def_m = 64, def_n = 64;
    const bool pair = attn_wg_pair(g, pass);
    long bm, bn, stages, tma, slabs, persist;
    bool ok;
    llmcl__tune_lookup lookup;
    for (int round = 0;; ++round) { /* the files' entries, then the defaults where they misfit */
        llmcl__param_set(p, "BLOCK_M", def_m);
        llmcl__param_set(p, "BLOCK_N", def_n);
        if (staged)
            llmcl__param_set(p, "STAGES", def_stages);
        llmcl__param_set(p, "TMA", def_tma);
        if (slabbed)
            llmcl__param_set(p, "DS_SLABS", def_slabs);
        if (fwd)
            llmcl__param_set(p, "PERSIST", -1); /* the default for the copies the lookup leaves */
        lookup = round == 0 ? llmcl__params_lookup(ctx, k->key, g->dtype, cls, p)
                            : llmcl__params_lookup_overrides(ctx, k->key, g->dtype, cls, p);
        bm = llmcl__param_get(p, "BLOCK_M", def_m), bn = llmcl__param_get(p, "BLOCK_N", def_n);
        stages = staged ? llmcl__param_get(p, "STAGES", def_stages) : 2;
        tma = llmcl__param_get(p, "TMA", def_tma);
        slabs = slabbed ? llmcl__param_get(p, "DS_SLABS", def_slabs) : 0;
        persist = fwd ? llmcl__param_get(p, "PERSIST", -1) : 0;
        if (persist == -1)
            persist = attn_fwd_persist(g, tma); /* none without TMA */
        ok = (bm == 64 || bm == 128) && (bn == 64 || (bn == 128 && !pair)) &&
             (!fwd || (stages >= 3 && stages <= 5)) &&
             (!dkdv || stages == 2 || (stages == 3 && tma == 1)) &&
             (tma == 0 || (tma == 1 && ctx->tma)) && (!slabbed || (slabs >= 2 && slabs <= 4)) &&
             persist >= 0 && persist <= 4 && (persist == 0 || tma == 1) &&
             attn_wg_local_bytes(g, pass, bm, bn, stages, tma, slabs) <= local;
        if (ok || round == 1 || !lookup.tuned)
            break;
    }
    if (fwd)
        llmcl__param_set(p, "PERSIST", persist);
    char st[48] = "";
    if (staged)
        snprintf(st, sizeof st, " STAGES=%ld", stages);
    if (slabbed)
        snprintf(st + strlen(st), sizeof st - strlen(st), " DS_SLABS=%ld", slabs);
    if (fwd)
        snprintf(st + strlen(st), sizeof st - strlen(st), " PERSIST=%ld", persist);
    LLMCL__REQUIRE(ctx, ok, LLMCL_ERROR_UNSUPPORTED,
                   "attention: %s tiles BLOCK_M=%ld BLOCK_N=%ld%s TMA=%ld with D=%d need BLOCK_M "
                   "and BLOCK_N 64 or 128%s%s, TMA 0 or 1 (1 where the device has TMA) and at "
                   "most %llu bytes of local memory",
                   k->name, bm, bn, st, tma, g->D, pair ? " (BLOCK_N 64 past D = 128)" : "",
                   fwd ? ", STAGES 3 to 5, PERSIST 0 to 4 (0 without TMA)"
                   : slabbed ? ", STAGES 2, or 3 with TMA, DS_SLABS 2 to 4"
                   : dkdv    ? ", STAGES 2, or 3 with TMA"
                             : "",
                   (unsigned long long)local);
    llmcl__params_record(&lookup, p);
    *tiles = (attn_tiles){.bm = (int)bm, .bn = (int)bn, .tm = 64, .tn = (int)bn, .run = 1};
    const long rows = dkdv ? bn : bm; /* a warpgroup per 64, or a pair */
    const long consumers = rows * (pair ? 4 : 2);
    *wg = (size_t)consumers + attn_wg_producers(consumers, tma == 1);
    return LLMCL_OK;
}

llmcl_status llmcl__attn_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                llmcl__params *p, attn_tiles *tiles, size_t *wg)
{
    char cls[16];
    llmcl__shape_class(g->D, cls);
    switch (k->arch) {
    case ATTN_ARCH_MMA:
        return attn_mma_config(ctx, g, k, cls, p, tiles, wg);
    case ATTN_ARCH_WGMMA:
        return attn_wgmma_config(ctx, g, k, cls, p, tiles, wg);
    default:
        return attn_portable_config(ctx, g, k, cls, p, tiles, wg);
    }
}
