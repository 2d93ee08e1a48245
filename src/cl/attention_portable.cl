/*
 * attention_portable.cl: flash attention's portable kernels, forward and backward, as tiled
 * OpenCL C 1.2 for any device (after attention_common.cl, whose header gives the layout and the
 * mask).
 *
 * Every kernel arranges its work-items as RT x CT over a (rows x cols) tile of scores: work-item
 * (ty, tx) owns rows ty + a * RT and columns tx + b * CT of it (TM x TN of them in attn_fwd and
 * attn_bwd_dq, TN x TM in attn_bwd_dkdv, whose rows are keys), so the score tile is an outer
 * product accumulated in registers over d, and the same work-item owns its rows' output over
 * the 4-wide column groups 4 (tx + e * CT) of D. These register-tile products are the places an mma
 * path would take over. Every operand read is 4 wide (along d in the score products, along the
 * output's columns in the accumulating ones): a GPU's local memory serves a vector read in the
 * time of a scalar one, so the register tiles do 4x the FMAs per read. Operand rows are padded to
 * D + 4 elements (aligned, conflict-free vector reads). Score tiles sit transposed (a key's row
 * holds the work-items' TM query rows contiguously, ty * TM + a for query row ty + a * RT) so the
 * accumulating products read them 4 wide too.
 *
 *   attn_fwd       one work-group per (BLOCK_M query rows, b * Hq + h); online softmax over K/V
 *                  tiles of BLOCK_N keys; tiles outside the mask's band are skipped.
 *   attn_bwd_pre   delta = rowsum(dO * O), f32 in LSE's layout; PRE_LANES work-items a row.
 *   attn_bwd_dq    one work-group per (BLOCK_M query rows, b * Hq + h): dQ = dS . K over K tiles.
 *   attn_bwd_dkdv  one work-group per (BLOCK_N keys, b * Hkv + hk): dV = P^T . dO and
 *                  dK = dS^T . Q over every query head of the KV head's group and its query tiles.
 *
 * Tunables (-D), beside attention_common.cl's:
 *   D         any multiple of 4 x the work-item columns (see TM, TN); the launcher picks columns
 *             that divide D / 4 (at most 2, 4 and 6 at D 8, 16 and 24, which narrows the tiles'
 *             keys).
 *   BLOCK_M   query rows per tile (attn_fwd, attn_bwd_dq: work-group rows; attn_bwd_dkdv: columns).
 *   BLOCK_N   keys per tile (attn_fwd, attn_bwd_dq: columns; attn_bwd_dkdv: work-group rows).
 *   TM, TN    register tile: query rows and keys per work-item. BLOCK_M % TM == 0,
 *             BLOCK_N % TN == 0, and D divisible by 4 x the column count (BLOCK_N / TN for
 *             attn_fwd and attn_bwd_dq, BLOCK_M / TM for attn_bwd_dkdv). Work-group size
 *             (BLOCK_M / TM) * (BLOCK_N / TN).
 *   LF32      1: operand tiles are converted to f32 once, when staged into local memory (no
 *             conversion in the inner loops; 4-byte elements); 0: they stay in the storage format
 *             (half the local memory with 16-byte storage, larger tiles fit); 2: the Q side (Q,
 *             dO) in f32, the K side (K, V) as stored. Default 0.
 *   KV_SEP    attn_fwd only. 1: K and V tiles get separate local buffers and load together (one
 *             global-load wait per tile, one barrier fewer); 0: they share one. Default 0.
 *   UNROLL    unroll factor of the register-tile products' loops over d and over a tile's keys or
 *             queries: 0 leaves it to the compiler (default), n >= 1 asks for n.
 *   KF32      attn_bwd_dq only. 1: its K tile, which both of its products read, is f32 in local
 *             memory whatever LF32 says (no conversion in the inner loops). Default 0.
 *   PIPE      1: the next tile's operands are fetched into registers during the current tile's
 *             computation and stored to local memory after it, so that their latency is hidden
 *             (attn_fwd: V under the softmax, the next K under P.V; attn_bwd_dq: the next V under
 *             dS, the next K under dQ; attn_bwd_dkdv: the next dO under dS and dV, the next Q
 *             under dK). Costs registers. Not with KV_SEP 1 (the launcher then passes 0). Default 0.
 *   PRE_WG    work-group size of attn_bwd_pre (up to the device maximum), a multiple of
 *             PRE_LANES.
 *   PRE_LANES attn_bwd_pre's work-items a row (a power of two), each summing every PRE_LANES-th
 *             PRE_VEC-wide chunk of it, so that a row is read as one run: with a work-item a row,
 *             a warp's reads fell on 32 rows a row stride apart.
 *   PRE_ROWS  attn_bwd_pre's rows a work-item, their loads all issued before their sums.
 *   PRE_VEC   attn_bwd_pre's chunk: 8 elements (16-byte loads of 16-bit rows; O's and dO's
 *             offsets and strides multiples of 8) or 4 (set by the launcher, not a tunable).
 *   SPLIT     defined (attn_fwd, attn_bwd_dq, attn_bwd_dkdv): a launch takes steps it_begin to
 *             it_end of each work-group's walk (its key tiles in attn_fwd and attn_bwd_dq, its
 *             (query head, query tile) pairs in attn_bwd_dkdv), for devices that cut long loops
 *             short. A launch past the first resumes from the state that the one before saved
 *             in st, an f32 row a query (a key in attn_bwd_dkdv) at attn_row(st_off, st_b, st_h,
 *             st_t, ...): attn_fwd's D accumulators of O, then the running maximum and sum of each
 *             of its CT work-item columns; attn_bwd_dq's D of dQ; attn_bwd_dkdv's D of dK, then
 *             D of dV. The launch with `last` set writes the outputs. The same steps run in the
 *             same order as in one launch: the same bits.
 *   ALIGNED4  1 (set by the launcher): every offset and stride of Q, K, V, dO (and in the
 *             backward O) is a multiple of 4 elements, so tiles load as whole vectors.
 * Under LLMCL_NV_PTX, attn_fwd takes its rows' running maxima with warp shuffles (no barrier)
 * when BLOCK_N / TN is a power of two and the work-group a multiple of 32; same results.
 * Local memory: operand tiles of (D+4)-element rows (EQ bytes an element on the Q side, EK on the
 * K side: 4 where LF32 makes them f32, else the storage's) and f32 score tiles. attn_fwd
 * (BLOCK_M EQ + (1 + KV_SEP) BLOCK_N EK)(D+4) + 4 BLOCK_N (BLOCK_M + 4) + 4 BLOCK_M BLOCK_N / TN;
 * attn_bwd_dq (2 BLOCK_M EQ + BLOCK_N (EK + EKQ))(D+4) + 4 BLOCK_N (BLOCK_M + 4), where EKQ, its
 * K tile's, is 4 with KF32 and else EK; attn_bwd_dkdv 2 (BLOCK_M EQ + BLOCK_N EK)(D+4) +
 * 4 (2 BLOCK_M (BLOCK_N + 4) + 2 BLOCK_M).
 */

#ifndef TM
#define TM 2
#endif
#ifndef TN
#define TN 2
#endif
#ifndef PRE_WG
#define PRE_WG 64
#endif
#ifndef PRE_LANES
#define PRE_LANES 1
#endif
#ifndef PRE_ROWS
#define PRE_ROWS 1
#endif
#ifndef PRE_VEC
#define PRE_VEC 4
#endif
#ifndef LF32
#define LF32 0
#endif
#ifndef KV_SEP
#define KV_SEP 0
#endif
#ifndef UNROLL
#define UNROLL 0
#endif
#ifndef PIPE
#define PIPE 0
#endif
#ifndef KF32
#define KF32 0
#endif
#if PIPE && KV_SEP
#error "PIPE stages K and V through one buffer: it needs KV_SEP 0"
#endif
#ifndef ALIGNED4
#define ALIGNED4 0
#endif

/* The products' loops: UNROLL's pragma, or none. */
#define ATTN_STR(x) #x
#define ATTN_PRAGMA(x) _Pragma(ATTN_STR(x))
#if UNROLL > 0
#define PRODUCT_LOOP ATTN_PRAGMA(unroll UNROLL)
#else
#define PRODUCT_LOOP
#endif

#define DP (D + 4)       /* padded local row of a D-wide operand */
#define PM (BLOCK_M + 4) /* padded local row of a transposed score tile with BLOCK_M queries */
#define PN (BLOCK_N + 4) /* padded local row of a transposed score tile with BLOCK_N keys */

/* attn_fwd and attn_bwd_dq: rows are queries, columns keys. */
#define RT (BLOCK_M / TM)
#define CT (BLOCK_N / TN)
#define DT4 (D / (4 * CT)) /* 4-wide output column groups per work-item */
/* attn_bwd_dkdv: rows are keys, columns queries. */
#define RT_KV (BLOCK_N / TN)
#define CT_KV (BLOCK_M / TM)
#define DT4_KV (D / (4 * CT_KV))

#define IO4_F32 float4
#define IO4_BF16 ushort4
#define IO4_F16 ushort4
typedef LLMCL_CAT(IO4_, IO_DT) io4_t;

/* The arguments of a SPLIT launch, after a portable kernel's parameters. */
#ifdef SPLIT
#define ATTN_SPLIT_PARAMS                                                                          \
    , __global float *st, ulong st_off, long st_b, long st_h, long st_t, int it_begin, int it_end, \
        int last
#else
#define ATTN_SPLIT_PARAMS
#endif

/*
 * Reads of 4 elements at i, a multiple of 4, of a 16-byte aligned tile whose rows are multiples of
 * 4 elements: whole-vector accesses. (vload4 promises only the element's alignment, and NVIDIA's
 * compiler then splits it into four scalar reads.)
 */
inline float4 lread4_F32(const __local float *p, int i) { return *(const __local float4 *)(p + i); }

/*
 * Operand tiles sit in local memory in their storage format (16-bit storage halves the local
 * memory a tile needs, so larger tiles fit), or in f32 (converted once, when staged): the Q side
 * (Q, dO) with LF32 >= 1, the K side (K, V) with LF32 == 1. LREADQ4 and LREADK4 read 4 consecutive
 * elements of a tile of that side as f32; attn_load_q and attn_load_k stage tiles.
 */
#define LT_F32 float
#define LT_BF16 ushort
#define LT_F16 ushort
typedef LLMCL_CAT(LT_, IO_DT) lraw_t;

/* Two packed words, two integer operations per pair: the inner loops convert every operand read. */
inline float4 lread4_BF16(const __local ushort *p, int i)
{
    const uint2 w = *(const __local uint2 *)(p + i);
    return as_float4((uint4)(w.x << 16, w.x & 0xffff0000u, w.y << 16, w.y & 0xffff0000u));
}
inline float4 lread4_F16(const __local ushort *p, int i)
{
    return vload_half4(0, (const __local half *)(p + i));
}

/* Operand tiles and transposed score tiles: 16-byte aligned for the vector reads. */
#define LOCAL_TILE(type, name, n) __local type name[n] __attribute__((aligned(16)))

/*
 * 4 consecutive elements of a global operand: with ALIGNED4 (every offset and stride of Q, K, V, dO
 * and O a multiple of 4 elements) one vector load, else vload4, which NVIDIA splits into scalar
 * loads.
 */
#if ALIGNED4
#define GLOAD4(p) (*(const __global io4_t *)(p))
#else
#define GLOAD4(p) vload4(0, (p))
#endif
inline float4 io4_to_f32_F32(float4 x) { return x; }
inline float4 io4_to_f32_BF16(ushort4 x) { return bf16x4_to_f32(x); }
inline float4 io4_to_f32_F16(ushort4 x) { return vload_half4(0, (const __private half *)&x); }

/* nrows x D rows of src (row stride rs, zeros past valid) into dst with padded rows: as f32, or
 * as stored. */
inline void attn_load_tile_f32(__local float *dst, const __global io_t *src, long base, long rs,
                               int valid, int nrows, int lid, int nthreads)
{
    for (int idx = lid; idx < nrows * (D / 4); idx += nthreads) {
        const int r = idx / (D / 4), c = (idx - r * (D / 4)) * 4;
        float4 x = 0.0f;
        if (r < valid)
            x = LLMCL_CAT(io4_to_f32_, IO_DT)(GLOAD4(src + base + (long)r * rs + c));
        *(__local float4 *)(dst + r * DP + c) = x;
    }
}
inline void attn_load_tile_raw(__local lraw_t *dst, const __global io_t *src, long base, long rs,
                               int valid, int nrows, int lid, int nthreads)
{
    for (int idx = lid; idx < nrows * (D / 4); idx += nthreads) {
        const int r = idx / (D / 4), c = (idx - r * (D / 4)) * 4;
        io4_t x = 0; /* zero bits are 0.0 in every storage format */
        if (r < valid)
            x = GLOAD4(src + base + (long)r * rs + c);
        *(__local io4_t *)(dst + r * DP + c) = x;
    }
}

/*
 * Register staging (PIPE): each work-item fetches its pieces of a tile of `rows` rows from global
 * memory into registers early and puts them into local memory later, so that the loads' latency
 * passes under computation. With `threads` work-items a tile takes NSTAGE(rows, threads) pieces
 * each; 16-bit elements stay packed in pairs (half the registers of a ushort4).
 */
#define NSTAGE(rows, threads) (((rows) * (D / 4) + (threads)-1) / (threads))
#define NSTAGE_KEYS NSTAGE(BLOCK_N, RT * CT)          /* attn_fwd, attn_bwd_dq: K, V tiles */
#define NSTAGE_QUERIES NSTAGE(BLOCK_M, RT_KV * CT_KV) /* attn_bwd_dkdv: Q, dO tiles */
#define STAGE_F32 float4
#define STAGE_BF16 uint2
#define STAGE_F16 uint2
typedef LLMCL_CAT(STAGE_, IO_DT) stage_t;
#define AS_STAGE_F32(x) (x)
#define AS_STAGE_BF16(x) as_uint2(x)
#define AS_STAGE_F16(x) as_uint2(x)
#define AS_IO4_F32(x) (x)
#define AS_IO4_BF16(x) as_ushort4(x)
#define AS_IO4_F16(x) as_ushort4(x)

/*
 * The staging helpers are static: they are only ever inlined with a constant nstage, and a copy
 * with an external name, kept with nstage unknown, made clang warn on every build that its loop
 * could not be unrolled.
 */
static inline void attn_fetch(stage_t *st, int nstage, int rows, int threads,
                              const __global io_t *src, long base, long rs, int valid, int lid)
{
    /*
     * When the work-group spans whole rows, a work-item's pieces lie `step` rows apart in one
     * column and one pointer advances by a stride: a compiler that hoists each piece's own offset
     * out of the tile loop would hold one 64-bit offset a piece in registers.
     */
    const bool whole = threads % (D / 4) == 0;
    const int step = threads / (D / 4), r0 = lid / (D / 4);
    const __global io_t *p = src + base + (long)r0 * rs + (lid - r0 * (D / 4)) * 4;
#pragma unroll
    for (int u = 0; u < nstage; ++u) {
        const int idx = lid + u * threads, r = whole ? r0 + u * step : idx / (D / 4);
        if (!whole)
            p = src + base + (long)r * rs + (idx - r * (D / 4)) * 4;
        stage_t x = 0;
        if (r < valid && r < rows)
#if ALIGNED4
            x = *(const __global stage_t *)p;
#else
            x = LLMCL_CAT(AS_STAGE_, IO_DT)(vload4(0, p));
#endif
        st[u] = x;
        if (whole)
            p += step * rs;
    }
}

/* The staged pieces of attn_fetch into a tile with padded rows: as f32, or as stored. */
static inline void attn_put_f32(__local float *dst, const stage_t *st, int nstage, int rows,
                                int threads, int lid)
{
#pragma unroll
    for (int u = 0; u < nstage; ++u) {
        const int idx = lid + u * threads, r = idx / (D / 4), c = (idx - r * (D / 4)) * 4;
        if (r < rows)
            *(__local float4 *)(dst + r * DP + c) =
                LLMCL_CAT(io4_to_f32_, IO_DT)(LLMCL_CAT(AS_IO4_, IO_DT)(st[u]));
    }
}
static inline void attn_put_raw(__local lraw_t *dst, const stage_t *st, int nstage, int rows,
                                int threads, int lid)
{
#pragma unroll
    for (int u = 0; u < nstage; ++u) {
        const int idx = lid + u * threads, r = idx / (D / 4), c = (idx - r * (D / 4)) * 4;
        if (r < rows)
            *(__local stage_t *)(dst + r * DP + c) = st[u];
    }
}

#if LF32 >= 1
typedef float lq_t;
#define LREADQ4(p, i) lread4_F32((p), (i))
#define attn_load_q attn_load_tile_f32
#define attn_put_q attn_put_f32
#else
typedef lraw_t lq_t;
#define LREADQ4(p, i) LLMCL_CAT(lread4_, IO_DT)((p), (i))
#define attn_load_q attn_load_tile_raw
#define attn_put_q attn_put_raw
#endif
#if LF32 == 1
typedef float lk_t;
#define LREADK4(p, i) lread4_F32((p), (i))
#define attn_load_k attn_load_tile_f32
#define attn_put_k attn_put_f32
#else
typedef lraw_t lk_t;
#define LREADK4(p, i) LLMCL_CAT(lread4_, IO_DT)((p), (i))
#define attn_load_k attn_load_tile_raw
#define attn_put_k attn_put_raw
#endif

/* Staging of the K and V tiles of attn_fwd and attn_bwd_dq, and the Q and dO tiles of
 * attn_bwd_dkdv. */
inline void attn_fetch_keys(stage_t *st, const __global io_t *src, long base, long rs, int valid,
                            int lid)
{
    attn_fetch(st, NSTAGE_KEYS, BLOCK_N, RT * CT, src, base, rs, valid, lid);
}
inline void attn_put_keys(__local lk_t *dst, const stage_t *st, int lid)
{
    attn_put_k(dst, st, NSTAGE_KEYS, BLOCK_N, RT * CT, lid);
}
inline void attn_fetch_queries(stage_t *st, const __global io_t *src, long base, long rs,
                               int valid, int lid)
{
    attn_fetch(st, NSTAGE_QUERIES, BLOCK_M, RT_KV * CT_KV, src, base, rs, valid, lid);
}
inline void attn_put_queries(__local lq_t *dst, const stage_t *st, int lid)
{
    attn_put_q(dst, st, NSTAGE_QUERIES, BLOCK_M, RT_KV * CT_KV, lid);
}

/* attn_bwd_dq's K tile: f32 with KF32, else as the K side. */
#if KF32 || LF32 == 1
typedef float lkdq_t;
#define LREADKDQ4(p, i) lread4_F32((p), (i))
#define attn_load_kdq attn_load_tile_f32
#define attn_put_kdq attn_put_f32
#else
typedef lk_t lkdq_t;
#define LREADKDQ4(p, i) LREADK4((p), (i))
#define attn_load_kdq attn_load_k
#define attn_put_kdq attn_put_k
#endif

/*
 * n (TM or TN) consecutive floats of a transposed score tile into x; 4 wide where n and the tile's
 * row pitch are multiples of 4 (then p is 16-byte aligned).
 */
inline void attn_read_col(float *x, const __local float *p, int n, int pitch)
{
    if (n % 4 == 0 && pitch % 4 == 0) {
        for (int u = 0; u < n; u += 4) {
            const float4 y = lread4_F32(p, u);
            x[u] = y.x;
            x[u + 1] = y.y;
            x[u + 2] = y.z;
            x[u + 3] = y.w;
        }
    } else {
        for (int u = 0; u < n; ++u)
            x[u] = p[u];
    }
}

/* acc + a . b, the four products in order: one 4-deep step of a score product. */
inline float attn_dot4(float4 a, float4 b, float acc)
{
    acc = fma(a.x, b.x, acc);
    acc = fma(a.y, b.y, acc);
    acc = fma(a.z, b.z, acc);
    return fma(a.w, b.w, acc);
}

/*
 * The accumulating register-tile products (attn_fwd's P.V, attn_bwd_dq's dS.K, attn_bwd_dkdv's
 * P^T.dO and dS^T.Q), one definition per kernel: acc[ROWS][COLS4] += over the tile's N rows j,
 * w's row j (a transposed score tile of row pitch WP, this work-item's ROWS scores from w[0])
 * times x's row j (an operand tile of element type XT, this work-item's 4-wide column groups from
 * x[0], CTS groups apart, read by READ4).
 */
#define ATTN_ACCUMULATE(NAME, ROWS, COLS4, CTS, WP, N, XT, READ4)                                 \
    inline void NAME(float4 acc[ROWS][COLS4], const __local float *w, const __local XT *x)       \
    {                                                                                             \
        PRODUCT_LOOP                                                                              \
        for (int j = 0; j < (N); ++j, w += (WP), x += DP) {                                       \
            float wa[ROWS];                                                                       \
            float4 xc[COLS4];                                                                     \
            attn_read_col(wa, w, ROWS, WP);                                                       \
            ATTN_PRAGMA(unroll)                                                                   \
            for (int e = 0; e < (COLS4); ++e)                                                     \
                xc[e] = READ4(x, 4 * e * (CTS));                                                  \
            ATTN_PRAGMA(unroll)                                                                   \
            for (int a = 0; a < (ROWS); ++a)                                                      \
                for (int e = 0; e < (COLS4); ++e)                                                 \
                    acc[a][e] = fma((float4)(wa[a]), xc[e], acc[a][e]);                           \
        }                                                                                         \
    }

#ifdef SPLIT
/*
 * A SPLIT launch's state, one definition per kernel: the work-item's accumulators x[a][e], at the
 * state rows a * RSTEP after p's (`pitch` floats apart) and their columns 4 (c0 + e * CSTEP),
 * saved (save) or loaded; the rows from `valid` on lie past the sequence.
 */
#define ATTN_STATE(NAME, ROWS, COLS4, RSTEP, CSTEP)                                               \
    inline void NAME(float4 x[ROWS][COLS4], bool save, __global float *p, long pitch, int valid,  \
                     int c0)                                                                      \
    {                                                                                             \
        for (int a = 0; a < (ROWS); ++a) {                                                        \
            if (a * (RSTEP) >= valid)                                                             \
                continue;                                                                         \
            for (int e = 0; e < (COLS4); ++e) {                                                   \
                __global float *y = p + a * (RSTEP) * pitch + 4 * (c0 + e * (CSTEP));             \
                if (save)                                                                         \
                    vstore4(x[a][e], 0, y);                                                       \
                else                                                                              \
                    x[a][e] = vload4(0, y);                                                       \
            }                                                                                     \
        }                                                                                         \
    }
#endif

/* attn_fwd's rows of CT work-items are consecutive lanes of one warp: shuffles find their maxima. */
#if defined(LLMCL_NV_PTX) && (CT & (CT - 1)) == 0 && (RT * CT) % 32 == 0
#define ATTN_SHFL 1
#else
#define ATTN_SHFL 0
#endif

/* The logit of a raw product x, natural-log units. */
inline float attn_logit(float x, float scale, float softcap)
{
    return softcap > 0.0f ? softcap * tanh(x * (scale / softcap)) : x * scale;
}

/* d logit / d x at logit s (softcap's derivative included). */
inline float attn_dlogit(float s, float scale, float softcap)
{
    if (softcap > 0.0f) {
        const float t = s / softcap;
        return scale * (1.0f - t * t);
    }
    return scale;
}

#ifdef ATTN_KERNEL_FWD
ATTN_ACCUMULATE(attn_fwd_pv, TM, DT4, CT, PM, BLOCK_N, lk_t, LREADK4) /* P.V into O */
#ifdef SPLIT
ATTN_STATE(attn_fwd_acc_state, TM, DT4, RT, CT)

/* attn_fwd's state: its O accumulators, then its running maxima and sums (a column each of CT). */
inline void attn_fwd_state(float4 acc[TM][DT4], float *m, float *l, bool save, __global float *p,
                           long pitch, int valid, int tx)
{
    attn_fwd_acc_state(acc, save, p, pitch, valid, tx);
    for (int a = 0; a < TM; ++a) {
        if (a * RT >= valid)
            continue;
        __global float *y = p + a * RT * pitch + D + tx;
        if (save) {
            y[0] = m[a];
            y[CT] = l[a];
        } else {
            m[a] = y[0];
            l[a] = y[CT];
        }
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(RT * CT, 1, 1))) void
attn_fwd(ATTN_FWD_PARAMS ATTN_SPLIT_PARAMS)
{
    LOCAL_TILE(lq_t, qs, BLOCK_M * DP);
#if KV_SEP
    LOCAL_TILE(lk_t, kvs, BLOCK_N * DP); /* K of the current tile */
    LOCAL_TILE(lk_t, vs, BLOCK_N * DP);  /* V of the current tile */
#else
    LOCAL_TILE(lk_t, kvs, BLOCK_N * DP); /* K, then V, of the current tile */
#define vs kvs
#endif
    LOCAL_TILE(float, pst, BLOCK_N * PM); /* P^T */
    __local float red[BLOCK_M * CT];

    const int lid = get_local_id(0), tx = lid % CT, ty = lid / CT;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M;
    if (m0 >= sq.tq)
        return;

    const long qb = attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0);
    const long kb = attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const long vb = attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    attn_load_q(qs, q, qb, sq_t, sq.tq - m0, BLOCK_M, lid, RT * CT);

    float4 acc[TM][DT4];
    float m[TM], l[TM];
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int e = 0; e < DT4; ++e)
            acc[a][e] = 0.0f;
    }

    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
#ifdef SPLIT
    __global float *sp = st + attn_row(st_off, st_b, st_h, st_t, b, h, sq.q0 + m0 + ty);
    if (it_begin > 0) /* resume where the launch before stopped */
        attn_fwd_state(acc, m, l, false, sp, st_t, sq.tq - m0 - ty, tx);
    const int walk = (n_hi - n_lo + BLOCK_N - 1) / BLOCK_N; /* the key tiles of every launch */
    n_hi = it_end < walk ? n_lo + it_end * BLOCK_N : n_hi;
    n_lo = it_begin < walk ? n_lo + it_begin * BLOCK_N : n_hi;
#endif
#if PIPE
    stage_t stage[NSTAGE_KEYS];
    if (n_lo < n_hi)
        attn_fetch_keys(stage, k, kb + n_lo * sk_t, sk_t, sq.tk - n_lo, lid);
#endif
    for (int n0 = n_lo; n0 < n_hi; n0 += BLOCK_N) {
        barrier(CLK_LOCAL_MEM_FENCE);
#if PIPE
        attn_put_keys(kvs, stage, lid);
#else
        attn_load_k(kvs, k, kb + n0 * sk_t, sk_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
#endif
#if KV_SEP
        attn_load_k(vs, v, vb + n0 * sv_t, sv_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TM][TN];
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c)
                s[a][c] = 0.0f;
        const __local lq_t *qrow = qs + ty * DP;
        const __local lk_t *krow = kvs + tx * DP;
        PRODUCT_LOOP
        for (int d = 0; d < D; d += 4, qrow += 4, krow += 4) {
            float4 qa[TM], kc[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a)
                qa[a] = LREADQ4(qrow, a * RT * DP);
#pragma unroll
            for (int c = 0; c < TN; ++c)
                kc[c] = LREADK4(krow, c * CT * DP);
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int c = 0; c < TN; ++c) {
                    s[a][c] = attn_dot4(qa[a], kc[c], s[a][c]);
                }
        }

#if PIPE
        attn_fetch_keys(stage, v, vb + n0 * sv_t, sv_t, sq.tk - n0, lid);
#endif
        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
        float pm[TM];
#pragma unroll
        for (int a = 0; a < TM; ++a) {
            pm[a] = -INFINITY;
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                float x = attn_logit(s[a][c], scale, softcap) * M_LOG2E_F;
                if (masked && !attn_visible(m0 + ty + a * RT, n0 + tx + c * CT, sq.tq, sq.tk, wl, wr))
                    x = -INFINITY;
                s[a][c] = x;
                pm[a] = fmax(pm[a], x);
            }
#if !ATTN_SHFL
            red[(ty + a * RT) * CT + tx] = pm[a];
#endif
        }
#if !ATTN_SHFL
        barrier(CLK_LOCAL_MEM_FENCE);
#endif

        for (int a = 0; a < TM; ++a) {
#if ATTN_SHFL
            const float mn = fmax(m[a], attn_lanes_max(pm[a], CT));
#else
            const int r = ty + a * RT;
            float mn = m[a];
            for (int t = 0; t < CT; ++t)
                mn = fmax(mn, red[r * CT + t]);
#endif
            const float mu = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet: p = 0 */
            const float alpha = exp2(m[a] - mu);
            float ls = 0.0f;
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const float p = exp2(s[a][c] - mu);
                ls += p;
                pst[(tx + c * CT) * PM + ty * TM + a] = p;
            }
            l[a] = l[a] * alpha + ls;
            m[a] = mn;
#pragma unroll
            for (int e = 0; e < DT4; ++e)
                acc[a][e] *= alpha;
        }
#if !KV_SEP
#if ATTN_SHFL
        barrier(CLK_LOCAL_MEM_FENCE); /* every work-item is done with K */
#endif
#if PIPE
        attn_put_keys(kvs, stage, lid);
#else
        attn_load_k(kvs, v, vb + n0 * sv_t, sv_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
#endif
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if PIPE
        const int n1 = n0 + BLOCK_N;
        if (n1 < n_hi)
            attn_fetch_keys(stage, k, kb + n1 * sk_t, sk_t, sq.tk - n1, lid);
#endif

        attn_fwd_pv(acc, pst + ty * TM, vs + 4 * tx);
    }

    /* Each work-item summed its own columns; the row sum adds the CT partials in a fixed order. */
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int a = 0; a < TM; ++a)
        red[(ty + a * RT) * CT + tx] = l[a];
    barrier(CLK_LOCAL_MEM_FENCE);
#ifdef SPLIT
    /* The next launch resumes from here. (Returning before these barriers, PoCL's work-items
       wrote rows past the sequence: of the state, and of O in the last launch.) */
    if (!last) {
        attn_fwd_state(acc, m, l, true, sp, st_t, sq.tq - m0 - ty, tx);
        return;
    }
#endif
    const long ob = attn_row(o_off, so_b, so_h, so_t, b, h, sq.q0 + m0);
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        const int r = ty + a * RT;
        if (m0 + r >= sq.tq)
            continue;
        float lr = 0.0f;
        for (int t = 0; t < CT; ++t)
            lr += red[r * CT + t];
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
#pragma unroll
        for (int e = 0; e < DT4; ++e)
            STORE4(IO_DT, o, ob + r * so_t + 4 * (tx + e * CT), acc[a][e] * inv);
        if (tx == 0)
            lse[lse_off + b * sl_b + h * sl_h + sq.q0 + m0 + r] =
                lr > 0.0f ? (m[a] + log2(lr)) * M_LN2_F : -INFINITY;
    }
}
#undef vs
#endif

#ifdef ATTN_KERNEL_BWD_PRE
/* The sum of PRE_LANES work-items' values of a row, in its lane 0 (each of PRE_ROWS rows). */
static void attn_pre_row_sums(float *v, __local float *part)
{
#if defined(LLMCL_NV_PTX) && PRE_LANES <= 32 && PRE_WG % 32 == 0
    (void)part;
#pragma unroll
    for (int i = 0; i < PRE_ROWS; ++i)
        v[i] = warp_sum_in(v[i], PRE_LANES);
#else
    const int lid = get_local_id(0);
    for (int i = 0; i < PRE_ROWS; ++i)
        part[i * PRE_WG + lid] = v[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid % PRE_LANES == 0)
        for (int i = 0; i < PRE_ROWS; ++i)
            for (int j = 1; j < PRE_LANES; ++j)
                v[i] += part[i * PRE_WG + lid + j];
#endif
}

#if PRE_VEC == 8
typedef float8 pre_t;
#define PRE_LOAD(p, i) LLMCL_CAT(load8_, IO_DT)((p), (i))
#define PRE_HSUM(v) (PRE_HSUM4((v).lo) + PRE_HSUM4((v).hi))
#else
typedef float4 pre_t;
#define PRE_LOAD(p, i) LLMCL_CAT(io4_to_f32_, IO_DT)(GLOAD4((p) + (i)))
#define PRE_HSUM(v) PRE_HSUM4(v)
#endif
#define PRE_HSUM4(v) (((v).x + (v).y) + ((v).z + (v).w))
#define PRE_CHUNKS ((D / PRE_VEC + PRE_LANES - 1) / PRE_LANES) /* a lane's chunks of a row */

/*
 * A work-group covers PRE_ROWS passes of PRE_WG / PRE_LANES consecutive rows (so that each pass
 * reads one run of memory), and a work-item issues the loads of its PRE_ROWS rows before it sums
 * any: a row's few bytes a work-item are too little in flight to keep memory busy. Rows past the
 * sequence load its last row and store nothing.
 */
__kernel __attribute__((reqd_work_group_size(PRE_WG, 1, 1))) void
attn_bwd_pre(const __global io_t *o, ulong o_off, const __global io_t *dout, ulong do_off,
             __global float *delta, ulong delta_off, const __global int *cu_q, ulong cu_q_off,
             int tq_all, int hq, long so_b, long so_h, long so_t, long sd_b, long sd_h, long sd_t,
             long sl_b, long sl_h)
{
    __local float part[PRE_ROWS * PRE_WG];
    const int lid = get_local_id(0), lane = lid % PRE_LANES, pass = PRE_WG / PRE_LANES;
    const int t0 = get_group_id(0) * pass * PRE_ROWS + lid / PRE_LANES;
    const int bh = get_global_id(1), b = bh / hq, h = bh - b * hq;
    int q0 = 0, tq = tq_all;
#ifdef VARLEN
    q0 = cu_q[cu_q_off + b];
    tq = cu_q[cu_q_off + b + 1] - q0;
#endif
    if (get_group_id(0) * pass * PRE_ROWS >= tq) /* the whole work-group: past the sequence */
        return;
    long ob[PRE_ROWS], db[PRE_ROWS];
    pre_t sum[PRE_ROWS];
#pragma unroll
    for (int i = 0; i < PRE_ROWS; ++i) {
        const int t = q0 + min(t0 + i * pass, tq - 1);
        ob[i] = attn_row(o_off, so_b, so_h, so_t, b, h, t);
        db[i] = attn_row(do_off, sd_b, sd_h, sd_t, b, h, t);
        sum[i] = (pre_t)(0.0f);
    }
#pragma unroll
    for (int k = 0; k < PRE_CHUNKS; ++k) {
        const int c = PRE_VEC * (lane + k * PRE_LANES);
        if (c < D) {
#pragma unroll
            for (int i = 0; i < PRE_ROWS; ++i)
                sum[i] = fma(PRE_LOAD(o + ob[i], c), PRE_LOAD(dout + db[i], c), sum[i]);
        }
    }
    float row[PRE_ROWS];
#pragma unroll
    for (int i = 0; i < PRE_ROWS; ++i)
        row[i] = PRE_HSUM(sum[i]);
    attn_pre_row_sums(row, part);
#pragma unroll
    for (int i = 0; i < PRE_ROWS; ++i)
        if (t0 + i * pass < tq && lane == 0)
            delta[delta_off + b * sl_b + h * sl_h + q0 + t0 + i * pass] = row[i];
}
#endif

#ifdef ATTN_KERNEL_BWD_DQ
ATTN_ACCUMULATE(attn_dq_dsk, TM, DT4, CT, PM, BLOCK_N, lkdq_t, LREADKDQ4) /* dS.K into dQ */
#ifdef SPLIT
ATTN_STATE(attn_dq_state, TM, DT4, RT, CT) /* dQ's accumulators */
#endif

__kernel __attribute__((reqd_work_group_size(RT * CT, 1, 1))) void
attn_bwd_dq(ATTN_DQ_PARAMS ATTN_SPLIT_PARAMS)
{
    LOCAL_TILE(lq_t, qs, BLOCK_M * DP);
    LOCAL_TILE(lq_t, dos, BLOCK_M * DP);
    LOCAL_TILE(lkdq_t, ks, BLOCK_N * DP);
    LOCAL_TILE(lk_t, vs, BLOCK_N * DP);
    LOCAL_TILE(float, dsst, BLOCK_N * PM); /* dS^T */

    const int lid = get_local_id(0), tx = lid % CT, ty = lid / CT;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M;
    if (m0 >= sq.tq)
        return;

    attn_load_q(qs, q, attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, sq.tq - m0,
                BLOCK_M, lid, RT * CT);
    attn_load_q(dos, dout, attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0 + m0), sd_t,
                sq.tq - m0, BLOCK_M, lid, RT * CT);
    const long kb = attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const long vb = attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);

    /* LSE in log2 units; a row that saw no key (-inf) gets +inf so that every p is 0. */
    float lse2[TM], dl[TM];
    float4 acc[TM][DT4];
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        const int i = m0 + ty + a * RT;
        lse2[a] = INFINITY;
        dl[a] = 0.0f;
        if (i < sq.tq) {
            const long li = b * sl_b + h * sl_h + sq.q0 + i;
            const float x = lse[lse_off + li];
            lse2[a] = x == -INFINITY ? INFINITY : x * M_LOG2E_F;
            dl[a] = delta[delta_off + li];
        }
#pragma unroll
        for (int e = 0; e < DT4; ++e)
            acc[a][e] = 0.0f;
    }

    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
#ifdef SPLIT
    __global float *sp = st + attn_row(st_off, st_b, st_h, st_t, b, h, sq.q0 + m0 + ty);
    if (it_begin > 0) /* resume where the launch before stopped */
        attn_dq_state(acc, false, sp, st_t, sq.tq - m0 - ty, tx);
    const int walk = (n_hi - n_lo + BLOCK_N - 1) / BLOCK_N; /* the key tiles of every launch */
    n_hi = it_end < walk ? n_lo + it_end * BLOCK_N : n_hi;
    n_lo = it_begin < walk ? n_lo + it_begin * BLOCK_N : n_hi;
#endif
#if PIPE
    /* The next tile's V is fetched under dS, its K under the dQ product. */
    stage_t stage[NSTAGE_KEYS];
    if (n_lo < n_hi) {
        attn_load_kdq(ks, k, kb + n_lo * sk_t, sk_t, sq.tk - n_lo, BLOCK_N, lid, RT * CT);
        attn_load_k(vs, v, vb + n_lo * sv_t, sv_t, sq.tk - n_lo, BLOCK_N, lid, RT * CT);
    }
#endif
    for (int n0 = n_lo; n0 < n_hi; n0 += BLOCK_N) {
        barrier(CLK_LOCAL_MEM_FENCE);
#if !PIPE
        attn_load_kdq(ks, k, kb + n0 * sk_t, sk_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        attn_load_k(vs, v, vb + n0 * sv_t, sv_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif

        float s[TM][TN], dp[TM][TN];
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c)
                s[a][c] = dp[a][c] = 0.0f;
        const __local lq_t *qrow = qs + ty * DP, *grow = dos + ty * DP;
        const __local lkdq_t *krow = ks + tx * DP;
        const __local lk_t *vrow = vs + tx * DP;
        PRODUCT_LOOP
        for (int d = 0; d < D; d += 4, qrow += 4, grow += 4, krow += 4, vrow += 4) {
            float4 qa[TM], ga[TM], kc[TN], vc[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                qa[a] = LREADQ4(qrow, a * RT * DP);
                ga[a] = LREADQ4(grow, a * RT * DP);
            }
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                kc[c] = LREADKDQ4(krow, c * CT * DP);
                vc[c] = LREADK4(vrow, c * CT * DP);
            }
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int c = 0; c < TN; ++c) {
                    s[a][c] = attn_dot4(qa[a], kc[c], s[a][c]);
                    dp[a][c] = attn_dot4(ga[a], vc[c], dp[a][c]);
                }
        }

#if PIPE
        const int n1 = n0 + BLOCK_N;
        if (n1 < n_hi)
            attn_fetch_keys(stage, v, vb + n1 * sv_t, sv_t, sq.tk - n1, lid);
#endif
        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c) {
                const float x = attn_logit(s[a][c], scale, softcap);
                float ds = exp2(x * M_LOG2E_F - lse2[a]) * (dp[a][c] - dl[a]) *
                           attn_dlogit(x, scale, softcap);
                if (masked && !attn_visible(m0 + ty + a * RT, n0 + tx + c * CT, sq.tq, sq.tk, wl, wr))
                    ds = 0.0f;
                dsst[(tx + c * CT) * PM + ty * TM + a] = ds;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
#if PIPE
        if (n1 < n_hi) {
            attn_put_keys(vs, stage, lid);
            attn_fetch_keys(stage, k, kb + n1 * sk_t, sk_t, sq.tk - n1, lid);
        }
#endif

        attn_dq_dsk(acc, dsst + ty * TM, ks + 4 * tx);
#if PIPE
        barrier(CLK_LOCAL_MEM_FENCE);
        if (n1 < n_hi)
            attn_put_kdq(ks, stage, NSTAGE_KEYS, BLOCK_N, RT * CT, lid);
#endif
    }

#ifdef SPLIT
    if (!last) { /* the next launch resumes from here */
        attn_dq_state(acc, true, sp, st_t, sq.tq - m0 - ty, tx);
        return;
    }
#endif
    const long gb = attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0 + m0);
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        const int r = ty + a * RT;
        if (m0 + r < sq.tq)
            for (int e = 0; e < DT4; ++e)
                STORE4(IO_DT, dq, gb + r * sg_t + 4 * (tx + e * CT), acc[a][e]);
    }
}
#endif

#ifdef ATTN_KERNEL_BWD_DKDV
/* P^T.dO into dV and dS^T.Q into dK. */
ATTN_ACCUMULATE(attn_dkdv_accumulate, TN, DT4_KV, CT_KV, PN, BLOCK_M, lq_t, LREADQ4)
#ifdef SPLIT
ATTN_STATE(attn_dkdv_state, TN, DT4_KV, RT_KV, CT_KV) /* dK's or dV's accumulators */
#endif

__kernel __attribute__((reqd_work_group_size(RT_KV * CT_KV, 1, 1))) void
attn_bwd_dkdv(ATTN_DKDV_PARAMS ATTN_SPLIT_PARAMS)
{
    LOCAL_TILE(lk_t, ks, BLOCK_N * DP);
    LOCAL_TILE(lk_t, vs, BLOCK_N * DP);
    LOCAL_TILE(lq_t, qs, BLOCK_M * DP);
    LOCAL_TILE(lq_t, dos, BLOCK_M * DP);
    LOCAL_TILE(float, pst, BLOCK_M * PN);  /* P of the current tile, a query per row */
    LOCAL_TILE(float, dsst, BLOCK_M * PN); /* dS, gradient of the raw products */
    __local float lse2s[BLOCK_M], dls[BLOCK_M];

    const int lid = get_local_id(0), tx = lid % CT_KV, ty = lid / CT_KV;
    const int nthreads = RT_KV * CT_KV;
    const attn_place at = attn_place_of(nb, hkv, false);
    const int b = at.b, hk = at.h;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int n0 = at.tile * BLOCK_N;
    if (n0 >= sq.tk)
        return;

    attn_load_k(ks, k, attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0 + n0), sk_t, sq.tk - n0,
                BLOCK_N, lid, nthreads);
    attn_load_k(vs, v, attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0 + n0), sv_t, sq.tk - n0,
                BLOCK_N, lid, nthreads);

    float4 gk[TN][DT4_KV], gv[TN][DT4_KV];
#pragma unroll
    for (int r = 0; r < TN; ++r)
        for (int e = 0; e < DT4_KV; ++e)
            gk[r][e] = gv[r][e] = 0.0f;

    int m_lo, m_hi;
    attn_query_range(n0, BLOCK_N, sq.tq, sq.tk, wl, wr, &m_lo, &m_hi);
    /* The (query head of the group, query tile) pairs, flattened: tile t is head t / ntiles. */
    const int ntiles = attn_tile_count(m_lo, m_hi, BLOCK_M);
    const int nt = group * ntiles;
    int t_lo = 0, t_hi = nt; /* the pairs of this launch */
#ifdef SPLIT
    __global float *sp = st + attn_row(st_off, st_b, st_h, st_t, b, hk, sq.k0 + n0 + ty);
    if (it_begin > 0) { /* resume where the launch before stopped */
        attn_dkdv_state(gk, false, sp, st_t, sq.tk - n0 - ty, tx);
        attn_dkdv_state(gv, false, sp + D, st_t, sq.tk - n0 - ty, tx);
    }
    t_lo = min(nt, it_begin);
    t_hi = min(nt, it_end);
#endif
#if PIPE
    /* The next tile's dO is fetched under P, dS and the dV product, its Q under the dK product. */
    stage_t stage[NSTAGE_QUERIES];
    if (t_lo < t_hi) {
        const int g = t_lo / ntiles, m0 = m_lo + (t_lo - g * ntiles) * BLOCK_M, h = hk * group + g;
        attn_load_q(qs, q, attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, sq.tq - m0,
                    BLOCK_M, lid, nthreads);
        attn_load_q(dos, dout, attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0 + m0), sd_t,
                    sq.tq - m0, BLOCK_M, lid, nthreads);
    }
#endif
    for (int t = t_lo; t < t_hi; ++t) {
        const int g = t / ntiles, m0 = m_lo + (t - g * ntiles) * BLOCK_M, h = hk * group + g;
        const long lb = b * sl_b + h * sl_h + sq.q0;
        barrier(CLK_LOCAL_MEM_FENCE);
#if !PIPE
        attn_load_q(qs, q, attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, sq.tq - m0,
                    BLOCK_M, lid, nthreads);
        attn_load_q(dos, dout, attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0 + m0), sd_t,
                    sq.tq - m0, BLOCK_M, lid, nthreads);
#endif
        for (int i = lid; i < BLOCK_M; i += nthreads) {
            float x = INFINITY, y = 0.0f;
            if (m0 + i < sq.tq) {
                x = lse[lse_off + lb + m0 + i];
                x = x == -INFINITY ? INFINITY : x * M_LOG2E_F;
                y = delta[delta_off + lb + m0 + i];
            }
            lse2s[i] = x;
            dls[i] = y;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TN][TM], dp[TN][TM];
#pragma unroll
        for (int r = 0; r < TN; ++r)
            for (int c = 0; c < TM; ++c)
                s[r][c] = dp[r][c] = 0.0f;
        const __local lk_t *krow = ks + ty * DP, *vrow = vs + ty * DP;
        const __local lq_t *qrow = qs + tx * DP, *grow = dos + tx * DP;
        PRODUCT_LOOP
        for (int d = 0; d < D; d += 4, krow += 4, vrow += 4, qrow += 4, grow += 4) {
            float4 kr[TN], vr[TN], qc[TM], gc[TM];
#pragma unroll
            for (int r = 0; r < TN; ++r) {
                kr[r] = LREADK4(krow, r * RT_KV * DP);
                vr[r] = LREADK4(vrow, r * RT_KV * DP);
            }
#pragma unroll
            for (int c = 0; c < TM; ++c) {
                qc[c] = LREADQ4(qrow, c * CT_KV * DP);
                gc[c] = LREADQ4(grow, c * CT_KV * DP);
            }
#pragma unroll
            for (int r = 0; r < TN; ++r)
                for (int c = 0; c < TM; ++c) {
                    s[r][c] = attn_dot4(kr[r], qc[c], s[r][c]);
                    dp[r][c] = attn_dot4(vr[r], gc[c], dp[r][c]);
                }
        }

#if PIPE
        const int g1 = (t + 1) / ntiles, m1 = m_lo + (t + 1 - g1 * ntiles) * BLOCK_M;
        const int h1 = hk * group + g1;
        if (t + 1 < t_hi)
            attn_fetch_queries(stage, dout, attn_row(do_off, sd_b, sd_h, sd_t, b, h1, sq.q0 + m1),
                               sd_t, sq.tq - m1, lid);
#endif
        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
#pragma unroll
        for (int r = 0; r < TN; ++r)
            for (int c = 0; c < TM; ++c) {
                const int j = ty + r * RT_KV, i = tx + c * CT_KV;
                const float x = attn_logit(s[r][c], scale, softcap);
                float p = exp2(x * M_LOG2E_F - lse2s[i]);
                if (masked && !attn_visible(m0 + i, n0 + j, sq.tq, sq.tk, wl, wr))
                    p = 0.0f;
                pst[i * PN + ty * TN + r] = p;
                dsst[i * PN + ty * TN + r] = p * (dp[r][c] - dls[i]) * attn_dlogit(x, scale, softcap);
            }
        barrier(CLK_LOCAL_MEM_FENCE);

        attn_dkdv_accumulate(gv, pst + ty * TN, dos + 4 * tx);
#if PIPE
        barrier(CLK_LOCAL_MEM_FENCE); /* every work-item is done with dO */
        if (t + 1 < t_hi) {
            attn_put_queries(dos, stage, lid);
            attn_fetch_queries(stage, q, attn_row(q_off, sq_b, sq_h, sq_t, b, h1, sq.q0 + m1), sq_t,
                               sq.tq - m1, lid);
        }
#endif
        attn_dkdv_accumulate(gk, dsst + ty * TN, qs + 4 * tx);
#if PIPE
        barrier(CLK_LOCAL_MEM_FENCE); /* every work-item is done with Q */
        if (t + 1 < t_hi)
            attn_put_queries(qs, stage, lid);
#endif
    }

#ifdef SPLIT
    if (!last) { /* the next launch resumes from here */
        attn_dkdv_state(gk, true, sp, st_t, sq.tk - n0 - ty, tx);
        attn_dkdv_state(gv, true, sp + D, st_t, sq.tk - n0 - ty, tx);
        return;
    }
#endif
    const long kgb = attn_row(dk_off, sgk_b, sgk_h, sgk_t, b, hk, sq.k0 + n0);
    const long vgb = attn_row(dv_off, sgv_b, sgv_h, sgv_t, b, hk, sq.k0 + n0);
#pragma unroll
    for (int r = 0; r < TN; ++r) {
        const int j = ty + r * RT_KV;
        if (n0 + j < sq.tk)
            for (int e = 0; e < DT4_KV; ++e) {
                STORE4(IO_DT, dk, kgb + j * sgk_t + 4 * (tx + e * CT_KV), gk[r][e]);
                STORE4(IO_DT, dv, vgb + j * sgv_t + 4 * (tx + e * CT_KV), gv[r][e]);
            }
    }
}
#endif
