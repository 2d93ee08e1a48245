/*
 * attention_common.cl: what flash attention's three kernel sets share, first of the attention
 * family's files (src/runtime/program.c's family table), after common.cl and mma.cl:
 *
 *   attention_common.cl   the layout, the mask, the grid order, the shared tunables;
 *   attention_portable.cl the portable kernels (attn_fwd, attn_bwd_pre, attn_bwd_dq,
 *                         attn_bwd_dkdv): fp32 register tiles over local-memory tiles, any device;
 *   attention_mma.cl      the mma.sync kernels (attn_*_mma) and the fragment-level softmax, P/dS
 *                         math and stores that the wgmma kernels share (NVIDIA, LLMCL_NV_MMA);
 *   attention_wgmma.cl    the wgmma kernels (attn_*_wgmma; Hopper, LLMCL_NV_WGMMA).
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
 * Every kernel's math is f32 and every reduction runs in a fixed order (deterministic, no atomics):
 * dK and dV of a KV head are summed over its group's query heads inside one work-group.
 *
 * Defines that every set reads (each set's file lists its own tunables):
 *   D         head dim (the launcher takes the multiples of 8 from 8 to 256).
 *   IO_DT     storage of Q, K, V, O, dO, dQ, dK, dV: F32, BF16 or F16 (the tensor-core sets: BF16
 *             or F16).
 *   BLOCK_M   query rows per tile; BLOCK_N keys per tile.
 *   TILE_RUN  grid order of the tiled kernels: runs of TILE_RUN tiles of one head, every head's
 *             run before the next (1: tile-major, the heaviest tiles of every head first; the
 *             tile count: head-major). Default 1; the tensor-core kernels run with 1.
 *   VARLEN    defined: packed sequences through cu_q / cu_k.
 *   ATTN_KERNEL_<NAME>  build only kernel attn_<name> (ATTN_KERNEL_FWD_MMA: attn_fwd_mma), as the
 *             launcher does: a kernel's local arrays are sized by the tiles of the one launched.
 *             With none defined (a standalone build) every portable and mma.sync kernel builds;
 *             a wgmma kernel only when named (D 64, 128 or 256, BLOCK_M and BLOCK_N 64 or 128).
 *   ATTN_ONE_KERNEL  defined by the launcher beside ATTN_KERNEL_<NAME>: a name this file does not
 *             know then fails the build instead of building every kernel.
 */

#if !defined(ATTN_KERNEL_FWD) && !defined(ATTN_KERNEL_BWD_PRE) && !defined(ATTN_KERNEL_BWD_DQ) &&  \
    !defined(ATTN_KERNEL_BWD_DKDV) && !defined(ATTN_KERNEL_FWD_MMA) &&                             \
    !defined(ATTN_KERNEL_BWD_DQ_MMA) && !defined(ATTN_KERNEL_BWD_DKDV_MMA) &&                      \
    !defined(ATTN_KERNEL_FWD_WGMMA) && !defined(ATTN_KERNEL_BWD_DQ_WGMMA) &&                       \
    !defined(ATTN_KERNEL_BWD_DKDV_WGMMA) && !defined(ATTN_KERNEL_BWD_DQ_DS_WGMMA)
#ifdef ATTN_ONE_KERNEL
#error "ATTN_ONE_KERNEL without an ATTN_KERNEL_<NAME> of attention_common.cl's list"
#endif
#define ATTN_KERNEL_FWD
#define ATTN_KERNEL_BWD_PRE
#define ATTN_KERNEL_BWD_DQ
#define ATTN_KERNEL_BWD_DKDV
#define ATTN_KERNEL_FWD_MMA
#define ATTN_KERNEL_BWD_DQ_MMA
#define ATTN_KERNEL_BWD_DKDV_MMA
#endif

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

#ifndef TILE_RUN
#define TILE_RUN 1
#endif

typedef STORAGE(IO_DT) io_t;

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

/* The place of item g of the ntiles x nbh in that order (a persistent kernel's item). */
inline attn_place attn_place_at(uint g, uint ntiles, uint nbh, int heads, bool last_first)
{
    const uint run0 = g / (nbh * TILE_RUN) * TILE_RUN, len = min((uint)TILE_RUN, ntiles - run0);
    const uint r = g - run0 * nbh, bh = r / len, ti = run0 + r - bh * len;
    const attn_place p = {last_first ? ntiles - 1 - ti : ti, bh / heads, bh % heads};
    return p;
}

inline attn_place attn_place_of(int nb, int heads, bool last_first)
{
    const uint nbh = nb * heads;
    return attn_place_at(get_group_id(0), (uint)get_num_groups(0) / nbh, nbh, heads, last_first);
}

/*
 * The same on a grid that covers places bh0 .. bh0 + nbh - 1 of the (batch, head) pairs in
 * order (a part of the call, as the backward's stored dS runs: attention_wgmma.cl).
 */
inline attn_place attn_place_in(int bh0, int nbh, int heads, bool last_first)
{
    attn_place p = attn_place_of(nbh, 1, last_first);
    const int bh = bh0 + p.b;
    p.b = bh / heads;
    p.h = bh % heads;
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

/* The tiles of `size` rows that cover rows [lo, hi), from lo. */
inline int attn_tile_count(int lo, int hi, int size)
{
    return lo < hi ? (hi - lo + size - 1) / size : 0;
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
