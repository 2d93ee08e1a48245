/*
 * attention.cl: flash attention, forward and backward, as portable tiled OpenCL C 1.2.
 *
 * Q is [B, Hq, Tq, D] and K, V are [B, Hkv, Tk, D] through strides (unit stride on D); query head h
 * reads KV head h / (Hq / Hkv). With VARLEN defined, sequence b of a packed batch spans rows
 * cu_q[b] .. cu_q[b+1] of Q (and cu_k of K, V), and the batch strides are unused. LSE is f32 with
 * element (b, h, t) at lse_off + b * sl_b + h * sl_h + start + t (start is cu_q[b] or 0).
 *
 * Masking: query i of a sequence sees key j when rel = j - i - (tk - tq) lies in [-wl, wr], each
 * bound ignored when negative. The launcher folds causal into wr (FlashAttention's bottom-right
 * alignment). A row that sees no key gets O = 0 and LSE = -inf, and zero gradients.
 * Logits: s = x * scale, or softcap * tanh(x * scale / softcap) when softcap > 0 (x = q . k).
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
 * accumulating products read them 4 wide too. Math is f32 and every reduction runs in a fixed
 * order (deterministic, no atomics).
 *
 *   attn_fwd       one work-group per (BLOCK_M query rows, b * Hq + h); online softmax over K/V
 *                  tiles of BLOCK_N keys; tiles outside the mask's band are skipped.
 *   attn_bwd_pre   delta = rowsum(dO * O), f32 in LSE's layout; PRE_WG work-items per group.
 *   attn_bwd_dq    one work-group per (BLOCK_M query rows, b * Hq + h): dQ = dS . K over K tiles.
 *   attn_bwd_dkdv  one work-group per (BLOCK_N keys, b * Hkv + hk): dV = P^T . dO and
 *                  dK = dS^T . Q over every query head of the KV head's group and its query tiles.
 *
 * Tunables (-D):
 *   D         head dim: any multiple of 4 x the work-item columns (see TM, TN); the launcher
 *             takes the multiples of 8 from 8 to 256 and picks columns that divide D / 4 (at
 *             most 2, 4 and 6 at D 8, 16 and 24, which narrows the tiles' keys).
 *   IO_DT     storage of Q, K, V, O, dO, dQ, dK, dV: F32, BF16 or F16.
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
 *   TILE_RUN  grid order of the tiled kernels: runs of TILE_RUN tiles of one head, every head's
 *             run before the next (1: tile-major, the heaviest tiles of every head first; the
 *             tile count: head-major). Default 1.
 *   PRE_WG    work-group size of attn_bwd_pre (any value up to the device maximum).
 *   WM        attn_fwd_mma only: 16-row query tiles a warp takes (1 or 2; BLOCK_M a multiple of
 *             16 WM). Two tiles share each K and V fragment read from local memory. Default 1.
 *   QREG      attn_fwd_mma only. 1: Q's fragments stay in registers; 0: they are read from the
 *             staged Q tile each step, which leaves the registers to two tiles a warp at D = 128.
 *             Default 1.
 *   STAGES    attn_fwd_mma: 2: K and V tiles are double-buffered, the next ones loading under
 *             the whole step (one barrier a step); 1: one buffer each. Default 1. attn_fwd_wgmma:
 *             its buffers of K and V, 3 to 5 (attn_bwd_dq_wgmma double-buffers them).
 *   VARLEN    defined: packed sequences through cu_q / cu_k.
 *   SPLIT     defined (attn_fwd, attn_bwd_dq, attn_bwd_dkdv): a launch takes steps it_begin to
 *             it_end of each work-group's walk (its key tiles in attn_fwd and attn_bwd_dq, its
 *             (query head, query tile) pairs in attn_bwd_dkdv), for devices that cut long loops
 *             short. A launch past the first resumes from the state that the one before saved
 *             in st, an f32 row a query (a key in attn_bwd_dkdv) at attn_row(st_off, st_b, st_h,
 *             st_t, ...): attn_fwd's D accumulators of O, then the running maximum and sum of each
 *             of its CT work-item columns; attn_bwd_dq's D of dQ; attn_bwd_dkdv's D of dK, then
 *             D of dV. The launch with `last` set writes the outputs. The same steps run in the
 *             same order as in one launch: the same bits.
 *   ALIGNED4  1 (set by the launcher): every offset and stride of Q, K, V and dO is a multiple of
 *             4 elements, so tiles load as whole vectors.
 *   ATTN_ONLY 1 attn_fwd, 2 attn_bwd_pre, 3 attn_bwd_dq, 4 attn_bwd_dkdv, 5 attn_fwd_mma,
 *             6 attn_bwd_dkdv_mma, 7 attn_bwd_dq_mma: build only that kernel (a kernel's local
 *             arrays are sized by the tiles of the one launched); unset: all but 8 and 9.
 *             8 attn_fwd_wgmma, 9 attn_bwd_dq_wgmma: only when asked for (D, BLOCK_M and BLOCK_N
 *             64 or 128: their wgmma shapes).
 * Under LLMCL_NV_PTX, attn_fwd takes its rows' running maxima with warp shuffles (no barrier)
 * when BLOCK_N / TN is a power of two and the work-group a multiple of 32; same results.
 * Local memory: operand tiles of (D+4)-element rows (EQ bytes an element on the Q side, EK on the
 * K side: 4 where LF32 makes them f32, else the storage's) and f32 score tiles. attn_fwd
 * (BLOCK_M EQ + (1 + KV_SEP) BLOCK_N EK)(D+4) + 4 BLOCK_N (BLOCK_M + 4) + 4 BLOCK_M BLOCK_N / TN;
 * attn_bwd_dq (2 BLOCK_M EQ + BLOCK_N (EK + EKQ))(D+4) + 4 BLOCK_N (BLOCK_M + 4), where EKQ, its
 * K tile's, is 4 with KF32 and else EK; attn_bwd_dkdv 2 (BLOCK_M EQ + BLOCK_N EK)(D+4) +
 * 4 (2 BLOCK_M (BLOCK_N + 4) + 2 BLOCK_M).
 */

#ifndef D
#define D 64
#endif
#ifndef IO_DT
#define IO_DT F32
#endif
#ifndef BLOCK_M
#define BLOCK_M 16
#endif
#ifndef BLOCK_N
#define BLOCK_N 16
#endif
#ifndef TM
#define TM 2
#endif
#ifndef TN
#define TN 2
#endif
#ifndef PRE_WG
#define PRE_WG 64
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
#ifndef TILE_RUN
#define TILE_RUN 1
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

typedef STORAGE(IO_DT) io_t;
#define IO4_F32 float4
#define IO4_BF16 ushort4
#define IO4_F16 ushort4
typedef LLMCL_CAT(IO4_, IO_DT) io4_t;

/* The kernels' parameters: one list a pass (forward, dQ, dK/dV) for its portable and tensor-core
   kernels alike. */
#define ATTN_FWD_PARAMS                                                                            \
    const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,                      \
    const __global io_t *v, ulong v_off, __global io_t *o, ulong o_off, __global float *lse,       \
    ulong lse_off, const __global int *cu_q, ulong cu_q_off, const __global int *cu_k,             \
    ulong cu_k_off, int tq_all, int tk_all, int nb, int hq, int group, long sq_b, long sq_h,       \
    long sq_t, long sk_b, long sk_h, long sk_t, long sv_b, long sv_h, long sv_t, long so_b,        \
    long so_h, long so_t, long sl_b, long sl_h, float scale, float softcap, int wl, int wr
#define ATTN_DQ_PARAMS                                                                             \
    const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,                      \
    const __global io_t *v, ulong v_off, const __global io_t *dout, ulong do_off,                  \
    const __global float *lse, ulong lse_off, const __global float *delta, ulong delta_off,        \
    __global io_t *dq, ulong dq_off, const __global int *cu_q, ulong cu_q_off,                     \
    const __global int *cu_k, ulong cu_k_off, int tq_all, int tk_all, int nb, int hq,              \
    int group, long sq_b, long sq_h, long sq_t, long sk_b, long sk_h, long sk_t, long sv_b,        \
    long sv_h, long sv_t, long sd_b, long sd_h, long sd_t, long sg_b, long sg_h, long sg_t,        \
    long sl_b, long sl_h, float scale, float softcap, int wl, int wr
#define ATTN_DKDV_PARAMS                                                                           \
    const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,                      \
    const __global io_t *v, ulong v_off, const __global io_t *dout, ulong do_off,                  \
    const __global float *lse, ulong lse_off, const __global float *delta, ulong delta_off,        \
    __global io_t *dk, ulong dk_off, __global io_t *dv, ulong dv_off, const __global int *cu_q,    \
    ulong cu_q_off, const __global int *cu_k, ulong cu_k_off, int tq_all, int tk_all, int nb,      \
    int hkv, int group, long sq_b, long sq_h, long sq_t, long sk_b, long sk_h, long sk_t,          \
    long sv_b, long sv_h, long sv_t, long sd_b, long sd_h, long sd_t, long sgk_b, long sgk_h,      \
    long sgk_t, long sgv_b, long sgv_h, long sgv_t, long sl_b, long sl_h, float scale,             \
    float softcap, int wl, int wr

/* The arguments of a SPLIT launch, after a portable kernel's parameters. */
#ifdef SPLIT
#define ATTN_SPLIT_PARAMS                                                                          \
    , __global float *st, ulong st_off, long st_b, long st_h, long st_t, int it_begin, int it_end, \
        int last
#else
#define ATTN_SPLIT_PARAMS
#endif

/*
 * A tiled kernel's work-group on its flat grid: runs of TILE_RUN consecutive tiles of one (batch,
 * head) pair, every pair's run before the next run of tiles (the last run may be shorter).
 * Work-groups start in grid order, so with the heaviest tiles first (the last query tiles, the
 * first key tiles, under a causal mask) the lightest form the tail: ordered by head alone, a late
 * head's heaviest tiles would run alone at the end. Longer runs keep a head's K/V (or Q/dO) in
 * the cache for more of the work-groups that read it.
 */
typedef struct attn_place {
    int tile, b, h;
} attn_place;

inline attn_place attn_place_of(int nb, int heads, bool last_first)
{
    const uint nbh = nb * heads, ntiles = (uint)get_num_groups(0) / nbh, g = get_group_id(0);
    const uint run0 = g / (nbh * TILE_RUN) * TILE_RUN, len = min((uint)TILE_RUN, ntiles - run0);
    const uint r = g - run0 * nbh, bh = r / len, ti = run0 + r - bh * len;
    const attn_place p = {last_first ? ntiles - 1 - ti : ti, bh / heads, bh % heads};
    return p;
}

/* Element offset of row `row` of head h of sequence b. */
inline long attn_row(long off, long s_b, long s_h, long s_t, int b, int h, int row)
{
    return off + b * s_b + h * s_h + row * s_t;
}

/* Per-sequence geometry of a work-group: row offsets and lengths of its queries and keys. */
typedef struct attn_seq {
    int q0, k0, tq, tk;
} attn_seq;

inline attn_seq attn_seq_of(int b, int tq, int tk, const __global int *cu_q, const __global int *cu_k)
{
    attn_seq s = {0, 0, tq, tk};
#ifdef VARLEN
    s.q0 = cu_q[b];
    s.tq = cu_q[b + 1] - s.q0;
    s.k0 = cu_k[b];
    s.tk = cu_k[b + 1] - s.k0;
#endif
    return s;
}

inline bool attn_visible(int i, int j, int tq, int tk, int wl, int wr)
{
    const int rel = j - i - (tk - tq);
    return i < tq && j < tk && (wl < 0 || rel >= -wl) && (wr < 0 || rel <= wr);
}

/* Whether any (query, key) pair of the tile [m0, m0 + nm) x [n0, n0 + nn) needs the mask. */
inline bool attn_tile_masked(int m0, int nm, int n0, int nn, int tq, int tk, int wl, int wr)
{
    const int diag = tk - tq;
    return m0 + nm > tq || n0 + nn > tk || (wr >= 0 && n0 + nn - 1 - m0 - diag > wr) ||
           (wl >= 0 && n0 - (m0 + nm - 1) - diag < -wl);
}

/* Keys [*lo, *hi) that queries [m0, m0 + nm) can see, aligned down to BLOCK_N at lo. */
inline void attn_key_range(int m0, int nm, int tq, int tk, int wl, int wr, int *lo, int *hi)
{
    const int diag = tk - tq;
    int l = 0, h = tk;
    if (wl >= 0)
        l = max(0, m0 + diag - wl);
    if (wr >= 0)
        h = min(tk, m0 + nm - 1 + diag + wr + 1);
    *lo = l / BLOCK_N * BLOCK_N;
    *hi = h;
}

/* Queries [*lo, *hi) that can see keys [n0, n0 + nn), aligned down to BLOCK_M at lo. */
inline void attn_query_range(int n0, int nn, int tq, int tk, int wl, int wr, int *lo, int *hi)
{
    const int diag = tk - tq;
    int l = 0, h = tq;
    if (wr >= 0)
        l = max(0, n0 - diag - wr);
    if (wl >= 0)
        h = min(tq, n0 + nn - 1 - diag + wl + 1);
    *lo = l / BLOCK_M * BLOCK_M;
    *hi = h;
}

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
 * 4 consecutive elements of a global operand: with ALIGNED4 (every offset and stride of Q, K, V and
 * dO a multiple of 4 elements) one vector load, else vload4, which NVIDIA splits into scalar loads.
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

#ifdef LLMCL_NV_PTX
/* The maximum, and the sum, over groups of `lanes` consecutive lanes of a warp (a power of two). */
#define ATTN_LANES(NAME, OP)                                                                      \
    inline float NAME(float v, int lanes)                                                         \
    {                                                                                             \
        for (int o = 1; o < lanes; o <<= 1) {                                                     \
            float t;                                                                              \
            asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"                       \
                         : "=f"(t)                                                                \
                         : "f"(v), "r"(o));                                                       \
            v = OP(v, t);                                                                         \
        }                                                                                         \
        return v;                                                                                 \
    }
ATTN_LANES(attn_lanes_max, fmax)
ATTN_LANES(attn_lanes_sum, LLMCL_ADD)
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

#if !defined(ATTN_ONLY) || ATTN_ONLY == 1
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

#if defined(LLMCL_NV_MMA) && (!defined(ATTN_ONLY) || ATTN_ONLY >= 5)
/*
 * The tensor-core kernels (mma.cl; bf16 or f16, D a multiple of 16 from 32 to 128, and to 256 for
 * the forward; every offset and stride of the loaded operands a multiple of 8 elements) follow
 * FlashAttention-2.
 *
 * attn_fwd_mma: a work-group of BLOCK_M / (16 WM) warps takes BLOCK_M query rows, each warp WM
 * tiles of 16 of them, with their Q fragments in registers (QREG) or read from the staged Q tile.
 * K and V tiles of BLOCK_N keys pass through swizzled local tiles by cp.async: V's copy runs under
 * S = Q K^T and the softmax, the next K's under O += P V. S and O accumulate in f32 registers; P
 * goes from S's accumulators into A fragments (rounded to the storage dtype, as FlashAttention
 * does) without touching local memory. A lane holds rows g and g + 8 of each of its warp's tiles:
 * quad shuffles give the rows' maxima, and the sums stay per lane until the end.
 */
/* Local rows padded to a power of two of 16-byte chunks (the swizzle's), D a multiple of 16 */
#define MMA_DP (D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256)
#define MMA_RD (MMA_DP / 8)
#define MMA_NT (BLOCK_N / 8) /* 8-key column tiles of S */
#define MMA_OT (D / 8)       /* 8-wide column tiles of O */
#define MMA_KV_BYTES (BLOCK_N * MMA_DP * 2) /* one K or V tile in local memory */
#define MMA_THREADS (32 * (BLOCK_M / 16)) /* a warp per 16 query rows (per 16 keys in dK/dV) */
#define MMA_K_THREADS (32 * (BLOCK_N / 16))
/* Past D = 128 the backward holds no D-wide operand in registers: they stay in local memory */
#define MMA_WIDE (D > 128)
#define attn_mma LLMCL_CAT(mma_16816_, IO_DT)

inline uint attn_pack2_BF16(float lo, float hi) { return bf16x2_rn(lo, hi); }
inline uint attn_pack2_F16(float lo, float hi)
{
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#define attn_pack2 LLMCL_CAT(attn_pack2_, IO_DT)

/* 2^x by the hardware's approximation (ex2.approx, a few ulp; subnormal results flush to zero): P
   is rounded to 16 bits next, so the exact exp2's longer sequence buys nothing, as FlashAttention's
   fast-math builds know. */
inline float attn_exp2(float x)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
inline float4 attn_exp4(float4 x)
{
    return (float4)(attn_exp2(x.x), attn_exp2(x.y), attn_exp2(x.z), attn_exp2(x.w));
}

/*
 * rows x D elements from src (row stride ld) into the swizzled tile at dst (in wgmma's layout where
 * atoms is 1), zeros past valid rows; nt work-items share the copy. Complete after mma_cp_commit
 * and mma_cp_wait.
 */
inline void attn_copy_rows(uint dst, const __global ushort *src, long ld, int rows, int valid,
                           int lid, int nt, int atoms)
{
    if (D == MMA_DP && valid >= rows)
        mma_copy_tile(dst, src, ld, rows, MMA_RD, lid, nt, atoms);
    else
        mma_load_tile(dst, src, ld, rows, MMA_RD, clamp(valid, 0, rows), D, lid, nt, 1, atoms);
}

/* The same in mma.sync's layout (mma.cl). */
inline void attn_mma_tile(uint dst, const __global ushort *src, long ld, int rows, int valid,
                          int lid, int nt)
{
    attn_copy_rows(dst, src, ld, rows, valid, lid, nt, 0);
}

/* acc[0] and acc[1], two adjacent 16 x 8 tiles, += a times b2's two B fragments. */
__attribute__((always_inline)) inline void attn_mma_pair(float4 *acc, uint4 a, uint4 b2)
{
    acc[0] = attn_mma(acc[0], a, b2.xy);
    acc[1] = attn_mma(acc[1], a, b2.zw);
}

/*
 * One k-step of a warp's product: acc[0..cols) (8-wide column tiles, cols even) += a (16 rows x the
 * 16 k at k0) times the B operand of the local tile: its rows are n with k along them (k_contig 1:
 * S = Q K^T and its kin) or its rows are k (0: O += P V and its kin).
 */
inline void attn_mma_step(float4 *acc, uint4 a, uint tile, int k0, int cols, int k_contig,
                          int lane)
{
#pragma unroll
    for (int j = 0; j < cols; j += 2)
        attn_mma_pair(acc + j, a, mma_frag_b2(tile, j * 8, k0, MMA_RD, k_contig, lane));
}

/*
 * The A fragment of 16 rows x 16 columns of a matrix held in two 16 x 8 accumulator tiles (the
 * lane's (g, 2t..) and (g + 8, 2t..) of columns 0-7 in lo, of columns 8-15 in hi), rounded to the
 * storage dtype: how P and dS feed the next product without a trip through local memory.
 */
inline uint4 attn_acc_to_a(float4 lo, float4 hi)
{
    return (uint4)(attn_pack2(lo.x, lo.y), attn_pack2(lo.z, lo.w), attn_pack2(hi.x, hi.y),
                   attn_pack2(hi.z, hi.w));
}

/*
 * Sets the elements of n 16 x 8 accumulator tiles that the mask hides to fill. The lane's element
 * e of tile j sits at (a0 + 8 (e >> 1), b0 + 8 j + 2 t4 + (e & 1)); a is the query and b the key,
 * or the reverse when keys_rows (the transposed tiles of attn_bwd_dkdv_mma).
 */
__attribute__((always_inline)) inline void attn_mask_tiles(float4 *x, int n, float fill, int a0,
                                                           int b0, bool keys_rows, attn_seq sq,
                                                           int wl, int wr, int t4)
{
#pragma unroll
    for (int j = 0; j < n; ++j) {
        float v[4] = {x[j].x, x[j].y, x[j].z, x[j].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int a = a0 + 8 * (e >> 1), b = b0 + 8 * j + 2 * t4 + (e & 1);
            if (!(keys_rows ? attn_visible(b, a, sq.tq, sq.tk, wl, wr)
                            : attn_visible(a, b, sq.tq, sq.tk, wl, wr)))
                v[e] = fill;
        }
        x[j] = (float4)(v[0], v[1], v[2], v[3]);
    }
}

/*
 * P and dS of n accumulator tiles in place: s (raw Q K^T products) becomes P and dp (dO V^T)
 * becomes dS = P (dP - delta) times the logit's derivative; lse2 (log2 units) and dl are each
 * element's query statistics. The softcap takes one uniform branch for the whole tile, and the
 * mask is applied by the caller on the tiles that need it.
 */
__attribute__((always_inline)) inline void attn_p_ds_tiles(float4 *s, float4 *dp,
                                                           const float4 *lse2, const float4 *dl,
                                                           int n, float scale, float softcap)
{
    if (softcap > 0.0f) {
        const float in = scale / softcap, out = softcap * M_LOG2E_F;
#pragma unroll
        for (int j = 0; j < n; ++j) {
            const float4 t = tanh(s[j] * in); /* the logit over softcap */
            const float4 p = attn_exp4(out * t - lse2[j]);
            dp[j] = p * (dp[j] - dl[j]) * (scale * (1.0f - t * t));
            s[j] = p;
        }
    } else {
#pragma unroll
        for (int j = 0; j < n; ++j) {
            const float4 p = attn_exp4(s[j] * (scale * M_LOG2E_F) - lse2[j]);
            dp[j] = p * (dp[j] - dl[j]) * scale;
            s[j] = p;
        }
    }
}

#if defined(LLMCL_NV_WGMMA) && defined(ATTN_ONLY) && ATTN_ONLY >= 8
/*
 * The wgmma kernels (Hopper, sm_90a: mma.cl's block), attn_fwd_wgmma, attn_bwd_dq_wgmma and
 * attn_bwd_dkdv_wgmma, for D 64 and 128. A warpgroup owns 64 rows of the score tiles: query rows
 * (BLOCK_M of them a work-group) in the forward and dQ, keys (BLOCK_N) in dK/dV, whose score
 * tiles are transposed; the other side's tiles (keys, or queries) stream through local memory.
 * BLOCK_M and BLOCK_N are 64 or 128: their wgmma shapes. Every tile sits in wgmma's layout: rows
 * of queries or keys, D in atoms of 64 columns, so each score product (S = Q K^T, dP = dO V^T;
 * S^T = K Q^T, dP^T = V dO^T) reads k-major operands, and each accumulating product (O += P V,
 * dQ += dS K; dV += P^T dO, dK += dS^T Q) takes its A from the score accumulators as registers
 * and reads its B mn-major.
 */
#if (D != 64 && D != 128) || (BLOCK_N != 64 && BLOCK_N != 128) || (BLOCK_M != 64 && BLOCK_M != 128)
#error "attn_*_wgmma: D, BLOCK_M and BLOCK_N 64 or 128"
#endif
#if ATTN_ONLY == 10
#define WG_ROWS BLOCK_N /* score rows of a work-group: keys */
#define WG_COLS BLOCK_M /* score columns of a streamed tile: queries */
#else
#define WG_ROWS BLOCK_M
#define WG_COLS BLOCK_N
#endif
#define WG_THREADS (2 * WG_ROWS)        /* a warpgroup per 64 rows */
#define WG_TILE_BYTES (WG_COLS * D * 2) /* one streamed tile */
LLMCL_WG_MMA_SS(attn_wg_qk_BF16, "bf16", WG_COLS, "0", "0")
LLMCL_WG_MMA_SS(attn_wg_qk_F16, "f16", WG_COLS, "0", "0")
LLMCL_WG_MMA_RS(attn_wg_pv_BF16, "bf16", D, "1")
LLMCL_WG_MMA_RS(attn_wg_pv_F16, "f16", D, "1")

/*
 * Rows n0 .. n0 + WG_COLS of two streamed operands (K and V, or Q and dO) into the buffers at kt
 * and vt, zeros past n_all.
 */
__attribute__((always_inline)) inline void
attn_wg_kv(uint kt, uint vt, const __global io_t *k, long sk_t, const __global io_t *v, long sv_t,
           int n0, int n_all, int lid)
{
    attn_copy_rows(kt, k + n0 * sk_t, sk_t, WG_COLS, n_all - n0, lid, WG_THREADS, 1);
    attn_copy_rows(vt, v + n0 * sv_t, sv_t, WG_COLS, n_all - n0, lid, WG_THREADS, 1);
}

/*
 * Issues s += warpgroup wg's 64 rows of the resident tile at qa (Q or dO; K or V in dK/dV) times
 * the streamed tile at kt (K or V; Q or dO), transposed.
 */
__attribute__((always_inline)) inline void attn_wg_scores(float *s, uint qa, uint kt, int wg)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        const uint atom = ks / 4, col = ks % 4 * 32;
        const ulong dq = wg_desc(qa + atom * WG_ROWS * 128 + wg * 64 * 128 + col, 16, 1024);
        const ulong dk = wg_desc(kt + atom * WG_COLS * 128 + col, 16, 1024);
        LLMCL_CAT(attn_wg_qk_, IO_DT)(s, dq, dk);
    }
}

/*
 * Issues o += P (the warp's A fragments pf, 16 score columns each) times the streamed tile at vt
 * (V or K; dO or Q).
 */
__attribute__((always_inline)) inline void attn_wg_pv(float *o, const uint4 *pf, uint vt)
{
#pragma unroll
    for (int j = 0; j < WG_COLS / 16; ++j)
        LLMCL_CAT(attn_wg_pv_, IO_DT)(o, pf[j], wg_desc(vt + j * 16 * 128, WG_COLS * 128, 1024));
}

/* n float4 from the accumulator registers x, once the wgmma that wrote them was waited for. */
__attribute__((always_inline)) inline void attn_wg_acc4(float4 *y, float *x, int n)
{
#pragma unroll
    for (int j = 0; j < n; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            wg_keep_f(x + 4 * j + e);
        y[j] = (float4)(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
    }
}

/*
 * The backward's two score products of one tile, issued and waited for: warpgroup wg's rows of
 * the resident tiles at qa and da times the streamed ones at kt and vt, transposed (S and dP, or
 * S^T and dP^T), into P and dS (attn_p_ds_tiles: l4 and d4 hold each element's query statistics).
 */
__attribute__((always_inline)) inline void attn_wg_p_ds(float4 *p4, float4 *ds4, uint qa, uint kt,
                                                        uint da, uint vt, int wg,
                                                        const float4 *l4, const float4 *d4,
                                                        float scale, float softcap)
{
    float s[WG_COLS / 2], dp[WG_COLS / 2];
#pragma unroll
    for (int i = 0; i < WG_COLS / 2; ++i)
        s[i] = dp[i] = 0.0f;
    wg_fence();
    attn_wg_scores(s, qa, kt, wg);
    attn_wg_scores(dp, da, vt, wg);
    wg_commit();
    wg_wait(0);
    attn_wg_acc4(p4, s, WG_COLS / 8);
    attn_wg_acc4(ds4, dp, WG_COLS / 8);
    attn_p_ds_tiles(p4, ds4, l4, d4, WG_COLS / 8, scale, softcap);
}

/*
 * After the wait for an accumulating product: its accumulators o (D / 2) and its A fragments a
 * (WG_COLS / 16), which stayed in their registers until then, are the compiler's again.
 */
__attribute__((always_inline)) inline void attn_wg_keep(float *o, uint4 *a)
{
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        wg_keep_f(o + i);
#pragma unroll
    for (int j = 0; j < WG_COLS / 16; ++j)
        wg_keep_u4(a + j);
}
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 5 || ATTN_ONLY == 8
#ifndef WM
#define WM 1 /* 16-row tiles a warp of attn_fwd_mma takes */
#endif
#ifndef QREG
#define QREG 1 /* attn_fwd_mma keeps Q's fragments in registers; 0: reads them each step */
#endif
#ifndef STAGES
#define STAGES 1
#endif
#define MMA_FWD_THREADS (MMA_THREADS / WM)

/*
 * A row's running maximum moves only when a tile's maximum passes it by more than this (log2
 * units): until then P takes values up to 2^8, harmless in f32 sums and in 16-bit P (whose
 * precision is relative), and the O accumulators need no rescaling, which otherwise costs two
 * multiplies per score at D = 128. The sums and O share the stale maximum, so O / l and the LSE are
 * the same (FlashAttention-4 rescales lazily too).
 */
#define ATTN_MAX_SLACK 8.0f

/*
 * The online softmax of one 16-row tile's scores s (raw products in; P as A fragments out for
 * O += P V), rows r0 and r0 + 8 of the lane: the running maxima and sums move on, and alpha gets
 * the factors by which the rows' O accumulators must be rescaled (attn_rescale; 1 where a maximum
 * stayed). The softcap and the mask take uniform branches, so the common tile pays a multiply, a
 * maximum, an exp2 and a sum per score.
 */
__attribute__((always_inline)) inline void
attn_fwd_softmax(float4 *s, float *alpha, float *mrow, float *lrow, uint4 *pf, int r0, int n0,
                 bool masked, attn_seq sq, float scale, float softcap, int wl, int wr, int t4)
{
    if (softcap > 0.0f) {
        const float in = scale / softcap, out = softcap * M_LOG2E_F;
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
            s[j] = out * tanh(s[j] * in);
    } else {
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
            s[j] *= scale * M_LOG2E_F;
    }
    if (masked)
        attn_mask_tiles(s, MMA_NT, -INFINITY, r0, n0, false, sq, wl, wr, t4);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < MMA_NT; ++j) {
        mx[0] = fmax(mx[0], fmax(s[j].x, s[j].y));
        mx[1] = fmax(mx[1], fmax(s[j].z, s[j].w));
    }
    float mu[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = attn_lanes_max(mx[i], 4);
        alpha[i] = 1.0f;
        if (mn > mrow[i] + ATTN_MAX_SLACK) { /* also the first visible key: mrow is -inf */
            alpha[i] = attn_exp2(mrow[i] - mn);
            mrow[i] = mn;
        }
        mu[i] = mrow[i] == -INFINITY ? 0.0f : mrow[i]; /* a row with no key yet: p = 0 */
        lrow[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < MMA_NT; ++j) {
        s[j] = (float4)(attn_exp2(s[j].x - mu[0]), attn_exp2(s[j].y - mu[0]),
                        attn_exp2(s[j].z - mu[1]), attn_exp2(s[j].w - mu[1]));
        lrow[0] += s[j].x + s[j].y;
        lrow[1] += s[j].z + s[j].w;
    }
#pragma unroll
    for (int j = 0; j < BLOCK_N / 16; ++j)
        pf[j] = attn_acc_to_a(s[2 * j], s[2 * j + 1]);
}

/* A 16-row tile's O accumulators times the factors attn_fwd_softmax found for its two rows. */
__attribute__((always_inline)) inline void attn_rescale(float4 *acc, const float *alpha)
{
    if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e)
            acc[e] *= (float4)(alpha[0], alpha[0], alpha[1], alpha[1]);
    }
}

/*
 * Stores rows r0 and r0 + 8 of O (the lane's of a 16-row tile's accumulators acc, over their sums
 * lrow) at o + ob and their LSE at lse + lb, rows past tq skipped.
 */
__attribute__((always_inline)) inline void
attn_fwd_store(__global io_t *o, long ob, long so_t, __global float *lse, long lb,
               const float4 *acc, const float *mrow, const float *lrow, int r0, int tq, int t4)
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + i * 8;
        const float lr = attn_lanes_sum(lrow[i], 4);
        if (row >= tq)
            continue;
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e) {
            const float2 x = (i ? acc[e].zw : acc[e].xy) * inv;
            /* rows start on 8 elements (the fast path's condition): a pair is one 32-bit store */
            *(__global uint *)(o + ob + row * so_t + e * 8 + 2 * t4) = attn_pack2(x.x, x.y);
        }
        if (t4 == 0)
            lse[lb + row] = lr > 0.0f ? (mrow[i] + log2(lr)) * M_LN2_F : -INFINITY;
    }
}

#if !defined(ATTN_ONLY) || ATTN_ONLY == 5
/*
 * attn_fwd_mma: WM 16-row tiles a warp (WM = 2 halves the local-memory reads of K and V per
 * product, which bound one tile a warp); Q's fragments stay in registers (QREG) or are read from
 * the staged Q tile each step, which frees the registers two tiles a warp need at D = 128.
 */
__kernel __attribute__((reqd_work_group_size(MMA_FWD_THREADS, 1, 1))) void
attn_fwd_mma(ATTN_FWD_PARAMS)
{
    __local ushort qs[BLOCK_M * MMA_DP] __attribute__((aligned(128)));
    __local ushort ks[STAGES * BLOCK_N * MMA_DP] __attribute__((aligned(128)));
    __local ushort vs[STAGES * BLOCK_N * MMA_DP] __attribute__((aligned(128)));
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M, w0 = warp * 16 * WM; /* the warp's first row in the tile */
    if (m0 >= sq.tq)
        return;
    const long qb = attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0);
    const long kb = attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const long vb = attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const uint qa = mma_smem(qs), ka = mma_smem(ks), va = mma_smem(vs);

    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    attn_mma_tile(qa, q + qb, sq_t, BLOCK_M, sq.tq - m0, lid, MMA_FWD_THREADS);
    if (n_lo < n_hi) {
        attn_mma_tile(ka, k + kb + n_lo * sk_t, sk_t, BLOCK_N, sq.tk - n_lo, lid, MMA_FWD_THREADS);
        if (STAGES > 1)
            attn_mma_tile(va, v + vb + n_lo * sv_t, sv_t, BLOCK_N, sq.tk - n_lo, lid,
                          MMA_FWD_THREADS);
    }
    mma_cp_commit();
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#if QREG
    uint4 qf[WM][D / 16];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            qf[i][kk] = mma_frag_a(qa, w0 + 16 * i, kk * 16, MMA_RD, 1, lane);
#endif

    float4 acc[WM][MMA_OT];
    float mrow[WM][2], lrow[WM][2];
#pragma unroll
    for (int i = 0; i < WM; ++i) {
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e)
            acc[i][e] = 0.0f;
        mrow[i][0] = mrow[i][1] = -INFINITY;
        lrow[i][0] = lrow[i][1] = 0.0f;
    }
    const int r0 = m0 + w0 + g; /* this lane's rows: r0 + 16 i and r0 + 16 i + 8 */

    /*
     * STAGES 1: V's copy runs under S and the softmax, the next K's under O += P V, with a wait and
     * a barrier before each product. STAGES 2: the next K and V load into the other stage under
     * the whole step, with one wait and one barrier a step.
     */
    for (int n0 = n_lo, st = 0; n0 < n_hi; n0 += BLOCK_N, st ^= STAGES - 1) {
        const uint kt = ka + st * MMA_KV_BYTES, vt = va + st * MMA_KV_BYTES;
        const bool more = n0 + BLOCK_N < n_hi;
        if (STAGES == 1)
            attn_mma_tile(va, v + vb + n0 * sv_t, sv_t, BLOCK_N, sq.tk - n0, lid, MMA_FWD_THREADS);
        else if (more) {
            const uint nx = (st ^ 1) * MMA_KV_BYTES;
            attn_mma_tile(ka + nx, k + kb + (n0 + BLOCK_N) * sk_t, sk_t, BLOCK_N,
                          sq.tk - n0 - BLOCK_N, lid, MMA_FWD_THREADS);
            attn_mma_tile(va + nx, v + vb + (n0 + BLOCK_N) * sv_t, sv_t, BLOCK_N,
                          sq.tk - n0 - BLOCK_N, lid, MMA_FWD_THREADS);
        }
        mma_cp_commit();

        float4 s[WM][MMA_NT];
#pragma unroll
        for (int i = 0; i < WM; ++i)
#pragma unroll
            for (int j = 0; j < MMA_NT; ++j)
                s[i][j] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint4 a[WM];
#pragma unroll
            for (int i = 0; i < WM; ++i)
#if QREG
                a[i] = qf[i][kk];
#else
                a[i] = mma_frag_a(qa, w0 + 16 * i, kk * 16, MMA_RD, 1, lane);
#endif
#pragma unroll
            for (int j = 0; j < MMA_NT; j += 2) {
                const uint4 kb2 = mma_frag_b2(kt, j * 8, kk * 16, MMA_RD, 1, lane);
#pragma unroll
                for (int i = 0; i < WM; ++i)
                    attn_mma_pair(s[i] + j, a[i], kb2);
            }
        }

        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
        uint4 pf[WM][BLOCK_N / 16];
#pragma unroll
        for (int i = 0; i < WM; ++i) {
            float alpha[2];
            attn_fwd_softmax(s[i], alpha, mrow[i], lrow[i], pf[i], r0 + 16 * i, n0, masked, sq,
                             scale, softcap, wl, wr, t4);
            attn_rescale(acc[i], alpha);
        }

        if (STAGES == 1) {
            mma_cp_wait(0); /* V is in, and after the barrier no warp reads K any more */
            barrier(CLK_LOCAL_MEM_FENCE);
            if (more)
                attn_mma_tile(ka, k + kb + (n0 + BLOCK_N) * sk_t, sk_t, BLOCK_N,
                              sq.tk - n0 - BLOCK_N, lid, MMA_FWD_THREADS);
            mma_cp_commit();
        }
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j)
#pragma unroll
            for (int e = 0; e < MMA_OT; e += 2) {
                const uint4 vb2 = mma_frag_b2(vt, e * 8, j * 16, MMA_RD, 0, lane);
#pragma unroll
                for (int i = 0; i < WM; ++i)
                    attn_mma_pair(acc[i] + e, pf[i][j], vb2);
            }
        mma_cp_wait(0); /* the next tiles are in, and no warp reads this step's any more */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    const long ob = attn_row(o_off, so_b, so_h, so_t, b, h, sq.q0);
#pragma unroll
    for (int i = 0; i < WM; ++i)
        attn_fwd_store(o, ob, so_t, lse, lse_off + b * sl_b + h * sl_h + sq.q0, acc[i], mrow[i],
                       lrow[i], r0 + 16 * i, sq.tq, t4);
}
#endif

#if defined(LLMCL_NV_WGMMA) && defined(ATTN_ONLY) && ATTN_ONLY == 8
/*
 * attn_fwd_wgmma: the forward on Hopper's wgmma, FlashAttention-3's schedule without its producer
 * warps: a warpgroup per 64 query rows (a warp 16 of them, as in attn_fwd_mma, whose softmax and
 * stores it shares), P from S's accumulators into wgmma's A registers. STAGES buffers of K and V:
 * at the top of step n, once the barrier shows every warpgroup done with tile n - 1, all
 * work-items issue the copies of tile n + STAGES - 1 into its buffer. Step n issues S of tile
 * n + 1, then O += P V of tile n, and runs tile n + 1's softmax while the latter runs; O's rescale
 * waits for it.
 */
#if STAGES < 3 || STAGES > 5
#error "attn_fwd_wgmma: STAGES 3 to 5"
#endif

/* attn_fwd_softmax on scores s whose wgmma has been waited for. */
__attribute__((always_inline)) inline void
attn_wg_softmax(float *s, float *alpha, float *mrow, float *lrow, uint4 *pf, int r0, int n0,
                int m0, attn_seq sq, float scale, float softcap, int wl, int wr, int t4)
{
    float4 s4[MMA_NT];
    attn_wg_acc4(s4, s, MMA_NT);
    const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
    attn_fwd_softmax(s4, alpha, mrow, lrow, pf, r0, n0, masked, sq, scale, softcap, wl, wr, t4);
}

__kernel __attribute__((reqd_work_group_size(WG_THREADS, 1, 1))) void
attn_fwd_wgmma(ATTN_FWD_PARAMS)
{
    __local ushort qs[BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort ks[STAGES * BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort vs[STAGES * BLOCK_N * D] __attribute__((aligned(1024)));
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M;
    if (m0 >= sq.tq)
        return;
    const __global io_t *kh = k + attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const __global io_t *vh = v + attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const uint qa = mma_smem(qs), ka = mma_smem(ks), va = mma_smem(vs);
    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    const int nt = n_lo < n_hi ? (n_hi - n_lo + BLOCK_N - 1) / BLOCK_N : 0;
#define WG_K(n) (ka + (n) % STAGES * WG_TILE_BYTES)
#define WG_V(n) (va + (n) % STAGES * WG_TILE_BYTES)

    attn_copy_rows(qa, q + attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, BLOCK_M,
                   sq.tq - m0, lid, WG_THREADS, 1);
    for (int n = 0; n < STAGES - 1; ++n) {
        if (n < nt)
            attn_wg_kv(WG_K(n), WG_V(n), kh, sk_t, vh, sv_t, n_lo + n * BLOCK_N, sq.tk, lid);
        mma_cp_commit();
    }
    wg_copies_landed(STAGES - 2);

    const int wg = warp / 4, r0 = m0 + 16 * warp + g; /* the lane's rows: r0 and r0 + 8 */
    float acc[D / 2], s[BLOCK_N / 2], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    uint4 pf[BLOCK_N / 16];
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        acc[i] = 0.0f;
    if (nt > 0) {
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; ++i)
            s[i] = 0.0f;
        wg_fence();
        attn_wg_scores(s, qa, WG_K(0), wg);
        wg_commit();
        wg_wait(0);
        float alpha[2]; /* O is still zero */
        attn_wg_softmax(s, alpha, mrow, lrow, pf, r0, n_lo, m0, sq, scale, softcap, wl, wr, t4);
    }
    for (int n = 0; n < nt; ++n) {
        wg_copies_landed(STAGES - 3); /* tile n + 1 is in */
        const int next = n + STAGES - 1;
        if (next < nt)
            attn_wg_kv(WG_K(next), WG_V(next), kh, sk_t, vh, sv_t, n_lo + next * BLOCK_N, sq.tk,
                       lid);
        mma_cp_commit();
        const bool more = n + 1 < nt;
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; ++i)
            s[i] = 0.0f;
        wg_fence();
        if (more)
            attn_wg_scores(s, qa, WG_K(n + 1), wg);
        wg_commit(); /* empty after the last tile: ptxas serialises wgmma behind a conditional
                        wait or a conditional write of the accumulators */
        attn_wg_pv(acc, pf, WG_V(n));
        wg_commit();
        float alpha[2] = {1.0f, 1.0f};
        uint4 pn[BLOCK_N / 16];
        wg_wait(1);
        if (more) {
            attn_wg_softmax(s, alpha, mrow, lrow, pn, r0, n_lo + (n + 1) * BLOCK_N, m0, sq, scale,
                            softcap, wl, wr, t4);
        }
        wg_wait(0);
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            wg_keep_f(acc + i);
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j) {
            wg_keep_u4(pf + j); /* P of tile n stayed in its registers until now */
            if (more)
                pf[j] = pn[j];
        }
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e) {
            acc[4 * e] *= alpha[0];
            acc[4 * e + 1] *= alpha[0];
            acc[4 * e + 2] *= alpha[1];
            acc[4 * e + 3] *= alpha[1];
        }
    }
#undef WG_K
#undef WG_V

    float4 acc4[MMA_OT];
#pragma unroll
    for (int e = 0; e < MMA_OT; ++e)
        acc4[e] = (float4)(acc[4 * e], acc[4 * e + 1], acc[4 * e + 2], acc[4 * e + 3]);
    attn_fwd_store(o, attn_row(o_off, so_b, so_h, so_t, b, h, sq.q0), so_t, lse,
                   lse_off + b * sl_b + h * sl_h + sq.q0, acc4, mrow, lrow, r0, sq.tq, t4);
}
#endif
#endif

/* Row statistics of the backward in log2 units: lse (+inf where no key is seen, so p = 0). */
inline float attn_lse2(float x) { return x == -INFINITY ? INFINITY : x * M_LOG2E_F; }

/* Rows r0 and r0 + 8 of dQ (the lane's of a 16-row tile's accumulators acc) at dq + gb. */
__attribute__((always_inline)) inline void attn_dq_store(__global io_t *dq, long gb, long sg_t,
                                                         const float4 *acc, int r0, int tq, int t4)
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + 8 * i;
        if (row >= tq)
            continue;
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e) {
            const float2 x = i ? acc[e].zw : acc[e].xy;
            const long at_g = gb + row * sg_t + e * 8 + 2 * t4;
            STORE(IO_DT, dq, at_g, x.x);
            STORE(IO_DT, dq, at_g + 1, x.y);
        }
    }
}

#if !defined(ATTN_ONLY) || ATTN_ONLY == 7
/*
 * attn_bwd_dq_mma: dQ = dS K for BLOCK_M query rows of one head, a warp per 16 of them with their
 * Q and dO fragments in registers (staged once through local memory; past D = 128 read from
 * their local tiles at every step). Per tile of BLOCK_N keys:
 * S = Q K^T and dP = dO V^T on tensor cores, P and dS in registers, dS (rounded to the storage
 * dtype) into A fragments, dQ += dS K. K and V tiles are double-buffered: the next tile's copy
 * runs under the current tile's three products.
 */
__kernel __attribute__((reqd_work_group_size(MMA_THREADS, 1, 1))) void
attn_bwd_dq_mma(ATTN_DQ_PARAMS)
{
    __local ushort qs[(1 + MMA_WIDE) * BLOCK_M * MMA_DP] __attribute__((aligned(128)));
    __local ushort ks[2 * BLOCK_N * MMA_DP] __attribute__((aligned(128)));
    __local ushort vs[2 * BLOCK_N * MMA_DP] __attribute__((aligned(128)));
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M;
    if (m0 >= sq.tq)
        return;
    const long kb = attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const long vb = attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const uint qa = mma_smem(qs), ka = mma_smem(ks), va = mma_smem(vs);
    const uint da = qa + MMA_WIDE * BLOCK_M * MMA_DP * 2; /* dO's tile: Q's until Q is read */

    attn_mma_tile(qa, q + attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, BLOCK_M,
                  sq.tq - m0, lid, MMA_THREADS);
#if !MMA_WIDE
    uint4 qf[D / 16], df[D / 16];
    mma_cp_commit();
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        qf[kk] = mma_frag_a(qa, warp * 16, kk * 16, MMA_RD, 1, lane);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    attn_mma_tile(da, dout + attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0 + m0), sd_t, BLOCK_M,
                  sq.tq - m0, lid, MMA_THREADS);
    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    if (n_lo < n_hi) {
        attn_mma_tile(ka, k + kb + n_lo * sk_t, sk_t, BLOCK_N, sq.tk - n_lo, lid, MMA_THREADS);
        attn_mma_tile(va, v + vb + n_lo * sv_t, sv_t, BLOCK_N, sq.tk - n_lo, lid, MMA_THREADS);
    }
    mma_cp_commit();
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#if !MMA_WIDE
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        df[kk] = mma_frag_a(da, warp * 16, kk * 16, MMA_RD, 1, lane);
#endif

    const int r0 = m0 + warp * 16 + g; /* this lane's rows: r0 and r0 + 8 */
    const long lb = lse_off + b * sl_b + h * sl_h + sq.q0, db = delta_off + b * sl_b + h * sl_h + sq.q0;
    float lse2[2], dl[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + 8 * i;
        lse2[i] = row < sq.tq ? attn_lse2(lse[lb + row]) : INFINITY;
        dl[i] = row < sq.tq ? delta[db + row] : 0.0f;
    }
    float4 acc[MMA_OT];
#pragma unroll
    for (int e = 0; e < MMA_OT; ++e)
        acc[e] = 0.0f;

    for (int n0 = n_lo, stage = 0; n0 < n_hi; n0 += BLOCK_N, stage ^= 1) {
        const uint kt = ka + stage * MMA_KV_BYTES, vt = va + stage * MMA_KV_BYTES;
        if (n0 + BLOCK_N < n_hi) {
            const uint off = (stage ^ 1) * MMA_KV_BYTES;
            attn_mma_tile(ka + off, k + kb + (n0 + BLOCK_N) * sk_t, sk_t, BLOCK_N,
                          sq.tk - n0 - BLOCK_N, lid, MMA_THREADS);
            attn_mma_tile(va + off, v + vb + (n0 + BLOCK_N) * sv_t, sv_t, BLOCK_N,
                          sq.tk - n0 - BLOCK_N, lid, MMA_THREADS);
        }
        mma_cp_commit();
        float4 s[MMA_NT], dp[MMA_NT];
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
            s[j] = dp[j] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#if MMA_WIDE
            const uint4 qfrag = mma_frag_a(qa, warp * 16, kk * 16, MMA_RD, 1, lane);
            const uint4 dfrag = mma_frag_a(da, warp * 16, kk * 16, MMA_RD, 1, lane);
#else
            const uint4 qfrag = qf[kk], dfrag = df[kk];
#endif
            attn_mma_step(s, qfrag, kt, kk * 16, MMA_NT, 1, lane);
            attn_mma_step(dp, dfrag, vt, kk * 16, MMA_NT, 1, lane);
        }
        float4 l4[MMA_NT], d4[MMA_NT];
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j) {
            l4[j] = (float4)(lse2[0], lse2[0], lse2[1], lse2[1]);
            d4[j] = (float4)(dl[0], dl[0], dl[1], dl[1]);
        }
        attn_p_ds_tiles(s, dp, l4, d4, MMA_NT, scale, softcap);
        if (attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr))
            attn_mask_tiles(dp, MMA_NT, 0.0f, r0, n0, false, sq, wl, wr, t4);
        uint4 dsf[BLOCK_N / 16];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j)
            dsf[j] = attn_acc_to_a(dp[2 * j], dp[2 * j + 1]);
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j)
            attn_mma_step(acc, dsf[j], kt, j * 16, MMA_OT, 0, lane);
        mma_cp_wait(0); /* the next tile is in, and after the barrier no warp reads this one */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    attn_dq_store(dq, attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0), sg_t, acc, r0, sq.tq, t4);
}
#endif

#if defined(LLMCL_NV_WGMMA) && defined(ATTN_ONLY) && ATTN_ONLY == 9
/*
 * attn_bwd_dq_wgmma: attn_bwd_dq_mma on wgmma. Q and dO stay in local memory, K and V tiles are
 * double-buffered (the next tile's copy, issued once the barrier shows every warpgroup done with
 * the buffer, runs under this tile's three products). Per tile: S = Q K^T and dP = dO V^T, P and
 * dS in registers, dQ += dS K with dS as A registers.
 */
__kernel __attribute__((reqd_work_group_size(WG_THREADS, 1, 1))) void
attn_bwd_dq_wgmma(ATTN_DQ_PARAMS)
{
    __local ushort qs[BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort ds[BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort ks[2 * BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort vs[2 * BLOCK_N * D] __attribute__((aligned(1024)));
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hq, true);
    const int b = at.b, h = at.h, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int m0 = at.tile * BLOCK_M;
    if (m0 >= sq.tq)
        return;
    const __global io_t *kh = k + attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const __global io_t *vh = v + attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const uint qa = mma_smem(qs), da = mma_smem(ds), ka = mma_smem(ks), va = mma_smem(vs);
    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    const int nt = n_lo < n_hi ? (n_hi - n_lo + BLOCK_N - 1) / BLOCK_N : 0;

    attn_copy_rows(qa, q + attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, BLOCK_M,
                   sq.tq - m0, lid, WG_THREADS, 1);
    attn_copy_rows(da, dout + attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0 + m0), sd_t, BLOCK_M,
                   sq.tq - m0, lid, WG_THREADS, 1);
    if (nt > 0)
        attn_wg_kv(ka, va, kh, sk_t, vh, sv_t, n_lo, sq.tk, lid);
    mma_cp_commit();

    const int wg = warp / 4, r0 = m0 + 16 * warp + g; /* the lane's rows: r0 and r0 + 8 */
    const long lb = lse_off + b * sl_b + h * sl_h + sq.q0, db = delta_off + b * sl_b + h * sl_h + sq.q0;
    float lse2[2], dl[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + 8 * i;
        lse2[i] = row < sq.tq ? attn_lse2(lse[lb + row]) : INFINITY;
        dl[i] = row < sq.tq ? delta[db + row] : 0.0f;
    }
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        acc[i] = 0.0f;

    for (int n = 0; n < nt; ++n) {
        const int n0 = n_lo + n * BLOCK_N;
        const uint kt = ka + n % 2 * WG_TILE_BYTES, vt = va + n % 2 * WG_TILE_BYTES;
        wg_copies_landed(0); /* tile n is in */
        if (n + 1 < nt)
            attn_wg_kv(ka + (n + 1) % 2 * WG_TILE_BYTES, va + (n + 1) % 2 * WG_TILE_BYTES, kh,
                       sk_t, vh, sv_t, n0 + BLOCK_N, sq.tk, lid);
        mma_cp_commit();
        float4 s4[MMA_NT], dp4[MMA_NT], l4[MMA_NT], d4[MMA_NT];
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j) {
            l4[j] = (float4)(lse2[0], lse2[0], lse2[1], lse2[1]);
            d4[j] = (float4)(dl[0], dl[0], dl[1], dl[1]);
        }
        attn_wg_p_ds(s4, dp4, qa, kt, da, vt, wg, l4, d4, scale, softcap);
        if (attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr))
            attn_mask_tiles(dp4, MMA_NT, 0.0f, r0, n0, false, sq, wl, wr, t4);
        uint4 dsf[BLOCK_N / 16];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 16; ++j)
            dsf[j] = attn_acc_to_a(dp4[2 * j], dp4[2 * j + 1]);
        wg_fence();
        attn_wg_pv(acc, dsf, kt);
        wg_commit();
        wg_wait(0);
        attn_wg_keep(acc, dsf);
    }
    mma_cp_wait(0); /* with no key tile, Q's and dO's copies: none may land after the exit */

    float4 acc4[MMA_OT];
    attn_wg_acc4(acc4, acc, MMA_OT);
    attn_dq_store(dq, attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0), sg_t, acc4, r0, sq.tq, t4);
}
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 6 || ATTN_ONLY == 10
/*
 * attn_bwd_dkdv_mma: dK and dV for BLOCK_N keys of one KV head, a warp per 16 of them, over every
 * query head of the group and every query tile of BLOCK_M rows (fixed order: deterministic). Per
 * tile, on tensor cores: S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T in registers,
 * dV += P^T dO and dK += dS^T Q. Q and dO tiles are double-buffered: the next tile's copy runs
 * under the current tile's four products.
 *
 * Up to D = 96 the warp's K and V fragments stay in registers. Past it they are read from local
 * tiles at every step: beside the two D-wide accumulators they spilled, and at D = 128 the
 * backward ran 2.6% faster without them (on the H100; 2% slower at D = 64 and 96). Past D = 128
 * two D-wide accumulators do not fit a warp's registers at all, so a launch takes one of them
 * (DKDV_PART 1: dV from S^T alone, 2: dK), and the rows' statistics come from global memory
 * (their local copies would not fit beside the tiles).
 */
#ifndef DKDV_PART
#define DKDV_PART 0 /* 0: dK and dV; 1: dV only; 2: dK only */
#endif
#if MMA_WIDE && DKDV_PART == 0
#error "attn_bwd_dkdv_mma past D = 128 takes dK and dV in separate launches (DKDV_PART 1, 2)"
#endif
#define DKDV_V (DKDV_PART != 2)
#define DKDV_K (DKDV_PART != 1)
#define MMA_MT (BLOCK_M / 8) /* 8-query column tiles of S^T */
#define DKDV_KV_LOCAL (D > 96) /* K's and V's fragments read from local tiles */
#define MMA_DKDV_STAGE (2 * BLOCK_M * MMA_DP * 2) /* bytes of one stage: Q, then dO */

/*
 * The Q and dO tiles of BLOCK_M queries from m0 of head h into the stage at local address qa (by
 * cp.async, complete after mma_cp_wait).
 */
inline void attn_dkdv_stage(uint qa, const __global io_t *q, ulong q_off,
                            const __global io_t *dout, ulong do_off, int b, int h, int m0,
                            attn_seq sq, long sq_b, long sq_h, long sq_t, long sd_b, long sd_h,
                            long sd_t, int lid)
{
    attn_mma_tile(qa, q + attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0 + m0), sq_t, BLOCK_M,
                  sq.tq - m0, lid, MMA_K_THREADS);
    attn_mma_tile(qa + BLOCK_M * MMA_DP * 2, dout + attn_row(do_off, sd_b, sd_h, sd_t, b, h,
                  sq.q0 + m0), sd_t, BLOCK_M, sq.tq - m0, lid, MMA_K_THREADS);
}

/*
 * The log2 LSE and delta of the BLOCK_M queries from m0 at lse + at and delta + at (at: the
 * head's first query), +inf and 0 past the sequence, into a stage's ls and ds (plain stores by nt
 * work-items, visible after the next barrier).
 */
inline void attn_dkdv_stats(__local float *ls, __local float *ds, const __global float *lse,
                            const __global float *delta, long at, int m0, int tq, int lid, int nt)
{
    for (int i = lid; i < BLOCK_M; i += nt) {
        const bool in = m0 + i < tq;
        ls[i] = in ? attn_lse2(lse[at + m0 + i]) : INFINITY;
        ds[i] = in ? delta[at + m0 + i] : 0.0f;
    }
}

/* The same statistics of the lane's columns of S^T, straight from global memory. */
inline void attn_dkdv_lane_stats(float4 *l4, float4 *d4, const __global float *lse,
                                 const __global float *delta, long at, int m0, int tq, int t4)
{
#pragma unroll
    for (int j = 0; j < MMA_MT; ++j) {
        float l[2], d[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int row = m0 + j * 8 + 2 * t4 + e;
            l[e] = row < tq ? attn_lse2(lse[at + row]) : INFINITY;
            d[e] = row < tq ? (DKDV_K ? delta[at + row] : 0.0f) : 0.0f;
        }
        l4[j] = (float4)(l[0], l[1], l[0], l[1]);
        d4[j] = (float4)(d[0], d[1], d[0], d[1]);
    }
}

/*
 * Keys c0 and c0 + 8 of dK and dV (the lane's of a 16-key tile's accumulators gk and gv) at
 * dk + kgb and dv + vgb, keys past tk skipped.
 */
__attribute__((always_inline)) inline void
attn_dkdv_store(__global io_t *dk, long kgb, long sgk_t, __global io_t *dv, long vgb, long sgv_t,
                const float4 *gk, const float4 *gv, int c0, int tk, int t4)
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int key = c0 + 8 * i;
        if (key >= tk)
            continue;
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e) {
            const float2 x = i ? gk[e].zw : gk[e].xy, y = i ? gv[e].zw : gv[e].xy;
            const long ak = kgb + key * sgk_t + e * 8 + 2 * t4, av = vgb + key * sgv_t + e * 8 + 2 * t4;
            if (DKDV_K) {
                STORE(IO_DT, dk, ak, x.x);
                STORE(IO_DT, dk, ak + 1, x.y);
            }
            if (DKDV_V) {
                STORE(IO_DT, dv, av, y.x);
                STORE(IO_DT, dv, av + 1, y.y);
            }
        }
    }
}

#if !defined(ATTN_ONLY) || ATTN_ONLY == 6
__kernel __attribute__((reqd_work_group_size(MMA_K_THREADS, 1, 1))) void
attn_bwd_dkdv_mma(ATTN_DKDV_PARAMS)
{
    /* Two stages of Q and dO tiles, one after the other; K and V pass through them at the start
       on their way to registers, or stay in their own tiles past D = 96 */
    __local ushort qd[4 * BLOCK_M * MMA_DP] __attribute__((aligned(128)));
#if DKDV_KV_LOCAL
    __local ushort kvs[(1 + DKDV_K) * BLOCK_N * MMA_DP] __attribute__((aligned(128)));
#endif
#if !MMA_WIDE
    __local float lse2s[2 * BLOCK_M], dls[2 * BLOCK_M];
#endif
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hkv, false);
    const int b = at.b, hk = at.h;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int n0 = at.tile * BLOCK_N;
    if (n0 >= sq.tk)
        return;
    const uint qd0 = mma_smem(qd);
    const long kr = attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0 + n0);
    const long vr = attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0 + n0);

#if DKDV_KV_LOCAL
    const uint ka = mma_smem(kvs), va = ka + BLOCK_N * MMA_DP * 2;
    attn_mma_tile(ka, k + kr, sk_t, BLOCK_N, sq.tk - n0, lid, MMA_K_THREADS);
    if (DKDV_K)
        attn_mma_tile(va, v + vr, sv_t, BLOCK_N, sq.tk - n0, lid, MMA_K_THREADS);
#else
    uint4 kf[D / 16], vf[D / 16];
    attn_mma_tile(qd0, k + kr, sk_t, BLOCK_N, sq.tk - n0, lid, MMA_K_THREADS);
    mma_cp_commit();
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        kf[kk] = mma_frag_a(qd0, warp * 16, kk * 16, MMA_RD, 1, lane);
    barrier(CLK_LOCAL_MEM_FENCE);
    attn_mma_tile(qd0, v + vr, sv_t, BLOCK_N, sq.tk - n0, lid, MMA_K_THREADS);
    mma_cp_commit();
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        vf[kk] = mma_frag_a(qd0, warp * 16, kk * 16, MMA_RD, 1, lane);
    barrier(CLK_LOCAL_MEM_FENCE); /* no warp reads K or V from local memory any more */
#endif

    float4 gk[MMA_OT], gv[MMA_OT];
#pragma unroll
    for (int e = 0; e < MMA_OT; ++e)
        gk[e] = gv[e] = 0.0f;
    const int c0 = n0 + warp * 16 + g; /* this lane's keys: c0 and c0 + 8 */
    const long lb = b * sl_b + sq.q0; /* the batch entry's first row of lse and delta */
    int m_lo, m_hi;
    attn_query_range(n0, BLOCK_N, sq.tq, sq.tk, wl, wr, &m_lo, &m_hi);
    const int ntiles = m_hi > m_lo ? (m_hi - m_lo + BLOCK_M - 1) / BLOCK_M : 0;
    if (ntiles > 0) {
        attn_dkdv_stage(qd0, q, q_off, dout, do_off, b, hk * group, m_lo, sq, sq_b, sq_h, sq_t,
                        sd_b, sd_h, sd_t, lid);
#if !MMA_WIDE
        attn_dkdv_stats(lse2s, dls, lse + lse_off, delta + delta_off, lb + hk * group * sl_h,
                        m_lo, sq.tq, lid, MMA_K_THREADS);
#endif
    }
    mma_cp_commit();
    for (int t = 0; t < group * ntiles; ++t) {
        const int gi = t / ntiles, m0 = m_lo + (t - gi * ntiles) * BLOCK_M;
        const int stage = t & 1, next = t + 1, gn = next / ntiles;
        /* The next tile's copies run under this tile's products */
        if (next < group * ntiles) {
            const int mn = m_lo + (next - gn * ntiles) * BLOCK_M;
            attn_dkdv_stage(qd0 + (stage ^ 1) * MMA_DKDV_STAGE, q, q_off, dout, do_off, b,
                            hk * group + gn, mn, sq, sq_b, sq_h, sq_t, sd_b, sd_h, sd_t, lid);
#if !MMA_WIDE
            attn_dkdv_stats(lse2s + (stage ^ 1) * BLOCK_M, dls + (stage ^ 1) * BLOCK_M,
                            lse + lse_off, delta + delta_off, lb + (hk * group + gn) * sl_h, mn,
                            sq.tq, lid, MMA_K_THREADS);
#endif
        }
        mma_cp_commit();
        mma_cp_wait(1);
        barrier(CLK_LOCAL_MEM_FENCE);
        const uint qa = qd0 + stage * MMA_DKDV_STAGE, da = qa + BLOCK_M * MMA_DP * 2;

        float4 st[MMA_MT], dpt[MMA_MT];
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j)
            st[j] = dpt[j] = 0.0f;
        /* The products interleave by hand here: through attn_mma_step, one product after the
           other, this kernel spilled 124 bytes at D = 128 on the H100 instead of 96. */
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#if DKDV_KV_LOCAL
            const uint4 kfrag = mma_frag_a(ka, warp * 16, kk * 16, MMA_RD, 1, lane);
            const uint4 vfrag =
                DKDV_K ? mma_frag_a(va, warp * 16, kk * 16, MMA_RD, 1, lane) : kfrag;
#else
            const uint4 kfrag = kf[kk], vfrag = vf[kk];
#endif
#pragma unroll
            for (int j = 0; j < MMA_MT; j += 2) {
                attn_mma_pair(st + j, kfrag, mma_frag_b2(qa, j * 8, kk * 16, MMA_RD, 1, lane));
                if (DKDV_K)
                    attn_mma_pair(dpt + j, vfrag,
                                  mma_frag_b2(da, j * 8, kk * 16, MMA_RD, 1, lane));
            }
        }
        float4 l4[MMA_MT], d4[MMA_MT];
#if MMA_WIDE
        attn_dkdv_lane_stats(l4, d4, lse + lse_off, delta + delta_off,
                             lb + (hk * group + gi) * sl_h, m0, sq.tq, t4);
#else
        const __local float *ls = lse2s + stage * BLOCK_M, *ds = dls + stage * BLOCK_M;
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j) {
            const float2 l = vload2(0, ls + j * 8 + 2 * t4), d = vload2(0, ds + j * 8 + 2 * t4);
            l4[j] = (float4)(l, l);
            d4[j] = (float4)(d, d);
        }
#endif
        attn_p_ds_tiles(st, dpt, l4, d4, MMA_MT, scale, softcap); /* P^T and dS^T */
        if (attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr)) {
            if (DKDV_V)
                attn_mask_tiles(st, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
            if (DKDV_K)
                attn_mask_tiles(dpt, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
        }
#pragma unroll
        for (int j = 0; j < BLOCK_M / 16; ++j) {
            const uint4 pf = attn_acc_to_a(st[2 * j], st[2 * j + 1]);
            const uint4 sf = attn_acc_to_a(dpt[2 * j], dpt[2 * j + 1]);
#pragma unroll
            for (int e = 0; e < MMA_OT; e += 2) {
                if (DKDV_V)
                    attn_mma_pair(gv + e, pf, mma_frag_b2(da, e * 8, j * 16, MMA_RD, 0, lane));
                if (DKDV_K)
                    attn_mma_pair(gk + e, sf, mma_frag_b2(qa, e * 8, j * 16, MMA_RD, 0, lane));
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* no warp reads this stage any more: the next copy may */
    }
    mma_cp_wait(0); /* with no query tile, K's and V's copies: none may land after the exit */

    attn_dkdv_store(dk, attn_row(dk_off, sgk_b, sgk_h, sgk_t, b, hk, sq.k0), sgk_t, dv,
                    attn_row(dv_off, sgv_b, sgv_h, sgv_t, b, hk, sq.k0), sgv_t, gk, gv, c0, sq.tk,
                    t4);
}
#endif

#if defined(LLMCL_NV_WGMMA) && defined(ATTN_ONLY) && ATTN_ONLY == 10
/*
 * attn_bwd_dkdv_wgmma: attn_bwd_dkdv_mma on wgmma, for BLOCK_N keys (a warpgroup per 64) over
 * every query head of the group and every query tile of BLOCK_M rows, in the same fixed order. K
 * and V stay in local memory; Q and dO tiles (and their rows' statistics) are double-buffered, the
 * next tile's copy issued once the barrier shows every warpgroup done with its buffer. Per tile:
 * S^T = K Q^T and dP^T = V dO^T, P^T and dS^T in registers, dV += P^T dO and dK += dS^T Q with
 * P^T and dS^T as A registers.
 */
__kernel __attribute__((reqd_work_group_size(WG_THREADS, 1, 1))) void
attn_bwd_dkdv_wgmma(ATTN_DKDV_PARAMS)
{
    __local ushort ks[BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort vs[BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort qs[2 * BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort dos[2 * BLOCK_M * D] __attribute__((aligned(1024)));
    __local float lse2s[2 * BLOCK_M], dls[2 * BLOCK_M];
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const attn_place at = attn_place_of(nb, hkv, false);
    const int b = at.b, hk = at.h;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int n0 = at.tile * BLOCK_N;
    if (n0 >= sq.tk)
        return;
    const uint ka = mma_smem(ks), va = mma_smem(vs), qa = mma_smem(qs), da = mma_smem(dos);
    attn_copy_rows(ka, k + attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0 + n0), sk_t, BLOCK_N,
                   sq.tk - n0, lid, WG_THREADS, 1);
    attn_copy_rows(va, v + attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0 + n0), sv_t, BLOCK_N,
                   sq.tk - n0, lid, WG_THREADS, 1);
    const long lb = b * sl_b + sq.q0; /* the batch entry's first row of lse and delta */
    int m_lo, m_hi;
    attn_query_range(n0, BLOCK_N, sq.tq, sq.tk, wl, wr, &m_lo, &m_hi);
    const int ntiles = m_hi > m_lo ? (m_hi - m_lo + BLOCK_M - 1) / BLOCK_M : 0, nt = group * ntiles;
    /* Tile t: query head hk group + t / ntiles, queries from m0 */
#define WG_HEAD(t) (hk * group + (t) / ntiles)
#define WG_M0(t) (m_lo + (t) % ntiles * BLOCK_M)
#define WG_STAGE(t)                                                                               \
    do {                                                                                          \
        const int h_ = WG_HEAD(t), m_ = WG_M0(t), st_ = (t) % 2;                                  \
        attn_wg_kv(qa + st_ * WG_TILE_BYTES, da + st_ * WG_TILE_BYTES,                            \
                   q + attn_row(q_off, sq_b, sq_h, sq_t, b, h_, sq.q0), sq_t,                      \
                   dout + attn_row(do_off, sd_b, sd_h, sd_t, b, h_, sq.q0), sd_t, m_, sq.tq, lid); \
        attn_dkdv_stats(lse2s + st_ * BLOCK_M, dls + st_ * BLOCK_M, lse + lse_off,                \
                        delta + delta_off, lb + h_ * sl_h, m_, sq.tq, lid, WG_THREADS);           \
    } while (0)
    if (nt > 0)
        WG_STAGE(0);
    mma_cp_commit();

    const int wg = warp / 4, c0 = n0 + 16 * warp + g; /* the lane's keys: c0 and c0 + 8 */
    float gk[D / 2], gv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        gk[i] = gv[i] = 0.0f;
    for (int t = 0; t < nt; ++t) {
        const int m0 = WG_M0(t);
        const uint qt = qa + t % 2 * WG_TILE_BYTES, dt = da + t % 2 * WG_TILE_BYTES;
        wg_copies_landed(0); /* tile t is in (K and V with the first) */
        if (t + 1 < nt)
            WG_STAGE(t + 1);
        mma_cp_commit();
        float4 st4[MMA_MT], dpt4[MMA_MT], l4[MMA_MT], d4[MMA_MT];
        const __local float *ls = lse2s + t % 2 * BLOCK_M, *ds = dls + t % 2 * BLOCK_M;
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j) {
            const float2 l = vload2(0, ls + j * 8 + 2 * t4), d = vload2(0, ds + j * 8 + 2 * t4);
            l4[j] = (float4)(l, l);
            d4[j] = (float4)(d, d);
        }
        attn_wg_p_ds(st4, dpt4, ka, qt, va, dt, wg, l4, d4, scale, softcap); /* P^T and dS^T */
        if (attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr)) {
            attn_mask_tiles(st4, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
            attn_mask_tiles(dpt4, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
        }
        uint4 pf[BLOCK_M / 16], sf[BLOCK_M / 16];
#pragma unroll
        for (int j = 0; j < BLOCK_M / 16; ++j) {
            pf[j] = attn_acc_to_a(st4[2 * j], st4[2 * j + 1]);
            sf[j] = attn_acc_to_a(dpt4[2 * j], dpt4[2 * j + 1]);
        }
        wg_fence();
        attn_wg_pv(gv, pf, dt);
        attn_wg_pv(gk, sf, qt);
        wg_commit();
        wg_wait(0);
        attn_wg_keep(gv, pf);
        attn_wg_keep(gk, sf);
    }
    mma_cp_wait(0); /* with no query tile, K's and V's copies: none may land after the exit */
#undef WG_STAGE
#undef WG_M0
#undef WG_HEAD

    float4 gk4[MMA_OT], gv4[MMA_OT];
    attn_wg_acc4(gk4, gk, MMA_OT);
    attn_wg_acc4(gv4, gv, MMA_OT);
    attn_dkdv_store(dk, attn_row(dk_off, sgk_b, sgk_h, sgk_t, b, hk, sq.k0), sgk_t, dv,
                    attn_row(dv_off, sgv_b, sgv_h, sgv_t, b, hk, sq.k0), sgv_t, gk4, gv4, c0,
                    sq.tk, t4);
}
#endif
#endif
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 2
__kernel void attn_bwd_pre(const __global io_t *o, ulong o_off, const __global io_t *dout,
                           ulong do_off, __global float *delta, ulong delta_off,
                           const __global int *cu_q, ulong cu_q_off, int tq_all, int hq,
                           long so_b, long so_h, long so_t, long sd_b, long sd_h, long sd_t,
                           long sl_b, long sl_h)
{
    const int t = get_global_id(0), bh = get_global_id(1), b = bh / hq, h = bh - b * hq;
    int q0 = 0, tq = tq_all;
#ifdef VARLEN
    q0 = cu_q[cu_q_off + b];
    tq = cu_q[cu_q_off + b + 1] - q0;
#endif
    if (t >= tq)
        return;
    const long ob = attn_row(o_off, so_b, so_h, so_t, b, h, q0 + t);
    const long db = attn_row(do_off, sd_b, sd_h, sd_t, b, h, q0 + t);
    float4 sum = (float4)(0.0f);
    for (int c = 0; c < D; c += 4)
        sum = fma(LOAD4(IO_DT, o, ob + c), LOAD4(IO_DT, dout, db + c), sum);
    delta[delta_off + b * sl_b + h * sl_h + q0 + t] = (sum.x + sum.y) + (sum.z + sum.w);
}
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 3
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

#if !defined(ATTN_ONLY) || ATTN_ONLY == 4
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
    const int ntiles = m_hi > m_lo ? (m_hi - m_lo + BLOCK_M - 1) / BLOCK_M : 0;
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
