/*
 * attention_wgmma.cl: flash attention's wgmma kernels (Hopper, sm_90a: mma.cl's block),
 * attn_fwd_wgmma, attn_bwd_dq_wgmma, attn_bwd_dkdv_wgmma and attn_bwd_dq_ds_wgmma, for D 64, 128
 * and 256 (the last two below). They share
 * attention_mma.cl's softmax, P/dS math, mask and stores (their accumulators hold the same lanes'
 * elements as mma.sync's), which that file compiles for them. Everything is under LLMCL_NV_WGMMA,
 * and each kernel builds only when asked for: elsewhere this file is empty.
 *
 * A warpgroup owns 64 rows of the score tiles: query rows (BLOCK_M of them a work-group) in the
 * forward and dQ, keys (BLOCK_N) in dK/dV, whose score tiles are transposed; the other side's
 * tiles (keys, or queries) stream through local memory. Every tile sits in wgmma's layout: rows
 * of queries or keys, D in atoms of 64 columns, so each score product (S = Q K^T, dP = dO V^T;
 * S^T = K Q^T, dP^T = V dO^T) reads k-major operands, and each accumulating product (O += P V,
 * dQ += dS K; dV += P^T dO, dK += dS^T Q) takes its A from the score accumulators as registers
 * and reads its B mn-major.
 *
 * At D 256 only 64 x 64 tiles fit local memory, and a lane's registers hold one D-wide accumulator
 * beside the score tiles. dK/dV then pairs two warpgroups on each 64 keys (DKDV_PAIR), as
 * FlashAttention-3 splits its backward's products: the first computes S^T and P^T and accumulates
 * dV, the second dP^T and dK, taking P^T (times the logit's derivative) from the first through
 * local memory on two mbarriers. A tile still costs four products (attn_bwd_dkdv_mma, in two
 * launches past D 128, costs five).
 *
 * The backward costs seven products a tile where dQ recomputes S and dP (attn_bwd_dq_wgmma). With
 * DS_STORE (D 64 and 128, TMA), dK/dV also writes the dS it computes, rounded to 16 bits as dQ's
 * product takes it, into a scratch of whole query-by-key tiles; attn_bwd_dq_ds_wgmma then runs
 * dQ = dS K alone, a product that reads each dS tile once, on blocks of DS_BM (128) queries, so
 * that two warpgroups share each K tile. dQ's blocks read the key tiles where a query of theirs
 * that exists sees a key (attn_key_range), and dK/dV walks, for each key tile, whole blocks
 * around the queries that see it, writing zeros where the mask hides a pair: dQ reads nothing
 * that dK/dV did not write, but past the sequence (TMA's zeros). Five products a tile, for T x T
 * 16-bit values a head through memory: the launcher runs the heads in parts that fit the scratch
 * it may take.
 *
 * Tunables (-D), beside attention_common.cl's:
 *   D         64, 128 or 256.
 *   BLOCK_M, BLOCK_N  64 or 128: their wgmma shapes.
 *   STAGES    attn_fwd_wgmma: its buffers of K and V, 3 to 5; attn_bwd_dkdv_wgmma: its buffers
 *             of Q and dO, 2, or 3 with TMA (the producer then copies two tiles ahead). Default
 *             2 there; attn_bwd_dq_wgmma double-buffers its streamed tiles.
 *   TMA       1, the tiles arrive by Hopper's TMA, issued by producer work-items after the
 *             warpgroups (below); 0, every work-item copies them by cp.async. Default 0.
 *   PERSIST   attn_fwd_wgmma with TMA, nonzero: its work-groups (the launcher's PERSIST a compute
 *             unit) each walk several items, the next item's copies landing under this one's
 *             last products and stores. Default 0: a work-group an item.
 *   FWD_S_ALWAYS  attn_fwd_wgmma: 1, every tile issues an S (below). Default 1 but at D 128.
 *   DS_STORE  attn_bwd_dkdv_wgmma, 1: it stores dS (needs TMA, D 64 or 128). Default 0.
 *   DS_BM     with DS_STORE: attn_bwd_dq_ds_wgmma's query block, a multiple of BLOCK_M (128).
 *   DS_SLABS  with DS_STORE: dK/dV's local slabs of dS a warpgroup, 2 to 4 (default 2; the
 *             launcher's 3 at D 128). With 2 a warpgroup waits before it writes a slab for the
 *             store that read it two tiles before; with more, for the store of DS_SLABS - 2 tiles
 *             before, right after it issues its own, which saves a barrier a tile.
 *   STAGES    attn_bwd_dq_ds_wgmma: its buffers of K and dS tiles, 2 to 4 (TMA only; its
 *             BLOCK_M is DS_BM, its BLOCK_N dK/dV's).
 */

#if defined(LLMCL_NV_MMA) && defined(LLMCL_NV_WGMMA) &&                                            \
    (defined(ATTN_KERNEL_FWD_WGMMA) || defined(ATTN_KERNEL_BWD_DQ_WGMMA) ||                        \
     defined(ATTN_KERNEL_BWD_DKDV_WGMMA) || defined(ATTN_KERNEL_BWD_DQ_DS_WGMMA))
#if (D != 64 && D != 128 && D != 256) || (BLOCK_N != 64 && BLOCK_N != 128) ||                     \
    (BLOCK_M != 64 && BLOCK_M != 128)
#error "attn_*_wgmma: D 64, 128 or 256, BLOCK_M and BLOCK_N 64 or 128"
#endif
#ifdef ATTN_KERNEL_BWD_DKDV_WGMMA
#if defined(ATTN_KERNEL_FWD_WGMMA) || defined(ATTN_KERNEL_BWD_DQ_WGMMA)
#error "attn_bwd_dkdv_wgmma's score tiles are transposed: it builds alone"
#endif
#define WG_ROWS BLOCK_N /* score rows of a work-group: keys */
#define WG_COLS BLOCK_M /* score columns of a streamed tile: queries */
#define DKDV_PAIR (D > 128)
#if DKDV_PAIR && BLOCK_N != 64
#error "attn_bwd_dkdv_wgmma past D = 128: BLOCK_N 64, a pair of warpgroups"
#endif
#else
#define WG_ROWS BLOCK_M
#define WG_COLS BLOCK_N
#define DKDV_PAIR 0
#endif
#define WG_THREADS ((DKDV_PAIR ? 4 : 2) * WG_ROWS) /* a warpgroup per 64 rows, or a pair */
#define WG_TILE_BYTES (WG_COLS * D * 2) /* one streamed tile */
LLMCL_WG_MMA_SS(attn_wg_qk_BF16, "bf16", WG_COLS, "0", "0")
LLMCL_WG_MMA_SS(attn_wg_qk_F16, "f16", WG_COLS, "0", "0")
LLMCL_WG_MMA_RS(attn_wg_pv_BF16, "bf16", D, "1")
LLMCL_WG_MMA_RS(attn_wg_pv_F16, "f16", D, "1")
#if WG_COLS == 128
LLMCL_WG_MMA_SS(attn_wg_qk64_BF16, "bf16", 64, "0", "0")
LLMCL_WG_MMA_SS(attn_wg_qk64_F16, "f16", 64, "0", "0")
#endif

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

/* k-step ks (16 of D) of warpgroup wg's 64 rows of the resident tile at qa, as wgmma's A. */
inline ulong attn_wg_rows_desc(uint qa, int wg, int ks)
{
    return wg_desc(qa + ks / 4 * WG_ROWS * 128 + wg * 64 * 128 + ks % 4 * 32, 16, 1024);
}

/* k-step ks of the streamed tile at kt from its row r0, as wgmma's B. */
inline ulong attn_wg_cols_desc(uint kt, int r0, int ks)
{
    return wg_desc(kt + ks / 4 * WG_COLS * 128 + r0 * 128 + ks % 4 * 32, 16, 1024);
}

/*
 * Issues s = warpgroup wg's 64 rows of the resident tile at qa (Q or dO; K or V in dK/dV) times
 * the streamed tile at kt (K or V; Q or dO), transposed; s += that without overwrite.
 */
__attribute__((always_inline)) inline void attn_wg_scores(float *s, uint qa, uint kt, int wg,
                                                          bool overwrite)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
        LLMCL_CAT(attn_wg_qk_, IO_DT)(s, attn_wg_rows_desc(qa, wg, ks),
                                      attn_wg_cols_desc(kt, 0, ks), ks > 0 || !overwrite);
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

#if WG_COLS == 128
/*
 * Half hf (64 columns) of attn_wg_scores: s (32 floats) = warpgroup wg's 64 rows of the tile at
 * qa times columns 64 hf .. 64 hf + 63 of the streamed tile at kt, transposed.
 */
__attribute__((always_inline)) inline void attn_wg_scores_half(float *s, uint qa, uint kt, int wg,
                                                               int hf)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
        LLMCL_CAT(attn_wg_qk64_, IO_DT)(s, attn_wg_rows_desc(qa, wg, ks),
                                        attn_wg_cols_desc(kt, 64 * hf, ks), ks > 0);
}

/* Issues o += the 64 columns of half hf of P (its four A fragments a) times rows of vt. */
__attribute__((always_inline)) inline void attn_wg_pv_half(float *o, const uint4 *a, uint vt,
                                                           int hf)
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
        LLMCL_CAT(attn_wg_pv_, IO_DT)(o, a[j],
                                      wg_desc(vt + (4 * hf + j) * 16 * 128, WG_COLS * 128, 1024));
}
#endif

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
 * P and dS in p4 and ds4 (n tiles each) from the score products in s and dp (attn_p_ds_tiles:
 * l4 and d4 hold each element's query statistics), once they are waited for: S's group with at
 * most `behind` groups after it (dP's and those committed after dP), then dP's. Without a
 * softcap, P's exponentials run under dP's product.
 */
__attribute__((always_inline)) inline void attn_wg_p_ds_n(float4 *p4, float4 *ds4, float *s,
                                                          float *dp, int n, int behind,
                                                          const float4 *l4, const float4 *d4,
                                                          float scale, float softcap)
{
    wg_wait(behind);
    attn_wg_acc4(p4, s, n);
    if (softcap <= 0.0f) {
#pragma unroll
        for (int j = 0; j < n; ++j)
            p4[j] = attn_exp4(p4[j] * (scale * M_LOG2E_F) - l4[j]);
    }
    wg_wait(behind - 1);
    attn_wg_acc4(ds4, dp, n);
    if (softcap > 0.0f) {
        attn_p_ds_tiles(p4, ds4, l4, d4, n, scale, softcap);
    } else {
#pragma unroll
        for (int j = 0; j < n; ++j)
            ds4[j] = p4[j] * (ds4[j] - d4[j]) * scale; /* attn_p_ds_tiles's */
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
    wg_fence();
    attn_wg_scores(s, qa, kt, wg, 1);
    wg_commit();
    attn_wg_scores(dp, da, vt, wg, 1);
    wg_commit();
    attn_wg_p_ds_n(p4, ds4, s, dp, WG_COLS / 8, 1, l4, d4, scale, softcap);
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

#ifndef TMA
#define TMA 0
#endif
#if TMA
/*
 * The copies by TMA: a producer work-item after the warpgroups makes the work-group's tensor maps
 * from the host's template (nv_tma.c) in its six global slots, copies the resident tiles (Q, and
 * dO, in the forward and dQ; K and V in dK/dV) on one barrier, then streams the others into their
 * buffers, each on a barrier of its own, once every warpgroup work-item has released the tile
 * that held the buffer (an "empty" barrier a buffer). Rows past a sequence arrive as zeros, as
 * cp.async's copies write them. With two warpgroups the producers are a warpgroup that lowers its
 * registers to 24, so that the two beside it may hold 240 (setmaxnreg: 384 work-items enter with
 * 168); with one, a warp.
 */
#define ATTN_TMA_PARAMS , ulong16 tma_map, __global ulong16 *tma_slots
#if (defined(DS_STORE) && DS_STORE) || (defined(PERSIST) && PERSIST)
#define ATTN_TMA_SLOTS 16 /* dS's maps (attn_ds_send), or a persistent kernel's three sets of \
                             items' maps: as attention.c allocates them */
#else
#define ATTN_TMA_SLOTS 8 /* as attention.c allocates them */
#endif
#ifdef ATTN_KERNEL_BWD_DQ_DS_WGMMA
#define PRODUCERS 32 /* its warpgroups need few registers: none to take from the producers */
#else
#define PRODUCERS (WG_THREADS == 256 ? 128 : 32)
#endif

/* The box of `rows` rows at row y of the map, D wide, into dst in atoms of 64 columns. */
__attribute__((always_inline)) inline void attn_tma_rows(uint dst, ulong map, int y, int rows,
                                                         uint bar)
{
    wg_bar_expect(bar, rows * D * 2);
#pragma unroll
    for (int a = 0; a < D / 64; ++a)
        wg_tma_load(dst + a * rows * 128, map, 64 * a, y, bar);
}

/* The map of WG_ROWS-row boxes over the n rows of a head at x, rows ld apart, in slot, and the
   copy of rows r0 .. r0 + WG_ROWS into dst on bar. */
__attribute__((always_inline)) inline void attn_tma_resident(__global ulong16 *slot, ulong16 tmpl,
                                                             const __global io_t *x, long ld,
                                                             int n, int r0, uint dst, uint bar)
{
    attn_tma_rows(dst, wg_tma_map(slot, tmpl, x, D, n, 2 * ld, 64, WG_ROWS), r0, WG_ROWS, bar);
}

/*
 * Tile p of a stream of K and V tiles: WG_COLS (BLOCK_N) rows from row y of the maps mk and mv
 * into buffer p % stages of those at ka and va (on its barriers at kbar and vbar), once the
 * buffer's previous tile is released (its empty barrier).
 */
__attribute__((always_inline)) inline void attn_tma_kv_tile(int p, int stages, uint ka, uint va,
                                                            ulong mk, ulong mv, int y, uint kbar,
                                                            uint vbar, uint empty)
{
    const int s = p % stages;
    if (p >= stages)
        wg_bar_wait(empty + 8 * s, (p / stages + 1) & 1);
    attn_tma_rows(ka + s * WG_TILE_BYTES, mk, y, WG_COLS, kbar + 8 * s);
    attn_tma_rows(va + s * WG_TILE_BYTES, mv, y, WG_COLS, vbar + 8 * s);
}

/*
 * dQ's stream: K's and V's nt tiles from row n_lo (of tk, in the maps made in slots), tile p
 * into buffer p % stages.
 */
__attribute__((always_inline)) inline void
attn_tma_stream(__global ulong16 *slots, ulong16 tmpl, const __global io_t *kh, long sk_t,
                const __global io_t *vh, long sv_t, int n_lo, int tk, int nt, int stages, uint ka,
                uint va, uint kbar, uint vbar, uint empty)
{
    if (nt == 0)
        return;
    const ulong mk = wg_tma_map(slots, tmpl, kh, D, tk, 2 * sk_t, 64, WG_COLS);
    const ulong mv = wg_tma_map(slots + 1, tmpl, vh, D, tk, 2 * sv_t, 64, WG_COLS);
    for (int p = 0; p < nt; ++p)
        attn_tma_kv_tile(p, stages, ka, va, mk, mv, n_lo + p * WG_COLS, kbar, vbar, empty);
}

/*
 * The barriers at bars: the resident tiles' (one arrival a tile), then `sets` sets of `stages`
 * full ones (`arrivals` each: K's and V's, or dK/dV's query tiles), then the empty ones of the
 * buffers. Every work-item passes the work-group barrier after them; then the producers give
 * their registers away.
 */
__attribute__((always_inline)) inline void attn_tma_init(uint bars, int resident, int sets,
                                                         int arrivals, int stages, int lid)
{
    if (lid == WG_THREADS) {
        wg_bar_init(bars, resident);
        for (int i = 0; i < sets * stages; ++i)
            wg_bar_init(bars + 8 + 8 * i, arrivals);
        for (int s = 0; s < stages; ++s)
            wg_bar_init(bars + 8 + 8 * (sets * stages + s), WG_THREADS);
        wg_bar_init_fence();
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if PRODUCERS == 128 && defined(ATTN_KERNEL_BWD_DKDV_WGMMA) && defined(DS_STORE) && DS_STORE && \
    D == 64
    /* the producers that also send dS spill at 24 (ptxas on NVIDIA's PTX: 68 bytes), not at 56,
       and the warpgroups need no more than 224 */
    WG_PRODUCER_REGISTERS_TO(lid >= WG_THREADS, 56, 224);
#elif PRODUCERS == 128
    WG_PRODUCER_REGISTERS(lid >= WG_THREADS);
#endif
}

/* The work-group's map slots. */
#define ATTN_TMA_MY_SLOTS (tma_slots + ATTN_TMA_SLOTS * (long)get_group_id(0))

/* Waits for tile n's copy on its buffer's barrier among the `stages` at bars. */
#define ATTN_TMA_WAIT(bars, n, stages)                                                            \
    wg_bar_wait((bars) + 8 * ((n) % (stages)), ((n) / (stages)) & 1)
#else
#define ATTN_TMA_PARAMS
#define PRODUCERS 0
#endif

/*
 * A persistent kernel's items (PERSIST): work-group g of G takes the k-th of its items at rank
 * k G + g of the kernel's order, every other round backwards, so that with items sorted by
 * weight each work-group gets as much work as the others. Without PERSIST, G is the item count
 * and every work-group takes one.
 */
inline ulong attn_item_rank(uint k, uint g, uint G)
{
    return (ulong)k * G + (k % 2 ? G - 1 - g : g);
}

#ifdef ATTN_KERNEL_FWD_WGMMA
/*
 * attn_fwd_wgmma: the forward on Hopper's wgmma, FlashAttention-3's schedule: a warpgroup per 64
 * query rows (a warp 16 of them, as in attn_fwd_mma, whose softmax and stores it shares), P from
 * S's accumulators into wgmma's A registers, STAGES buffers of K and V. Step n issues S of tile
 * n + 1, then O += P V of tile n, and runs tile n + 1's softmax while the latter runs; O's rescale
 * waits for it.
 *
 * The copies, by cp.async (TMA 0): at the top of step n, once the barrier shows every warpgroup
 * done with tile n - 1, all work-items issue those of tile n + STAGES - 1 into its buffer.
 * By TMA (TMA 1, above): no barrier of the whole work-group runs inside the loop, and S waits
 * only for its K.
 */
#if STAGES < 3 || STAGES > 5
#error "attn_fwd_wgmma: STAGES 3 to 5"
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#if PERSIST && !TMA
#error "attn_fwd_wgmma: PERSIST needs TMA"
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

/* The forward's k-th item: a query tile of a (batch, head), in attn_place_at's order (the
   heaviest first under a causal mask). */
#define FWD_ITEM(k, at, sq, m0)                                                                   \
    const uint rank_ = (uint)attn_item_rank((k), g0, ng);                                         \
    const attn_place at = attn_place_at(rank_, ntiles, nbh, hq, true);                            \
    const attn_seq sq = attn_seq_of(at.b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);      \
    const int m0 = at.tile * BLOCK_M
#define FWD_QH(at, sq) (q + attn_row(q_off, sq_b, sq_h, sq_t, (at).b, (at).h, (sq).q0))
#define FWD_KH(at, sq) (k + attn_row(k_off, sk_b, sk_h, sk_t, (at).b, (at).h / group, (sq).k0))
#define FWD_VH(at, sq) (v + attn_row(v_off, sv_b, sv_h, sv_t, (at).b, (at).h / group, (sq).k0))

#if TMA
#if PERSIST
#define FWD_MAP_SETS 3 /* a set of maps is remade three items on: see the producer */
#else
#define FWD_MAP_SETS 1
#endif
/*
 * The forward's producer (one work-item): for each item of the work-group, Q into qs on qbar,
 * once the warpgroups have released the item before's (qfree: they have waited for its last
 * S), and its nt K and V tiles into the STAGES buffers in one stream over all items (tile p of the
 * stream into buffer p % STAGES once released), the item's first tile before its Q so that it
 * lands under the item before's last products. Maps: Q's, K's and V's of an item in one of
 * FWD_MAP_SETS sets in turn; when item i's maps are made, the warpgroups have released item i - 2's
 * Q, so every copy of item i - 3 has landed and its set is free.
 */
#define FWD_PRODUCE()                                                                             \
    do {                                                                                          \
        __global ulong16 *slots = ATTN_TMA_MY_SLOTS;                                              \
        int done = 0, p = 0;                                                                      \
        for (uint kk = 0; attn_item_rank(kk, g0, ng) < items; ++kk) {                              \
            FWD_ITEM(kk, at, sq, m0);                                                             \
            if (m0 >= sq.tq)                                                                      \
                continue;                                                                         \
            int n_lo, n_hi;                                                                       \
            attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);                      \
            const int nt = attn_tile_count(n_lo, n_hi, BLOCK_N);                                 \
            __global ulong16 *set = slots + 3 * (done % FWD_MAP_SETS);                           \
            const ulong mq = wg_tma_map(set, tma_map, FWD_QH(at, sq), D, sq.tq, 2 * sq_t, 64,     \
                                        WG_ROWS);                                                 \
            ulong mk = 0, mv = 0; /* no key tile (no key at all, maybe): no map of K and V */   \
            if (nt > 0) {                                                                         \
                mk = wg_tma_map(set + 1, tma_map, FWD_KH(at, sq), D, sq.tk, 2 * sk_t, 64,         \
                                WG_COLS);                                                         \
                mv = wg_tma_map(set + 2, tma_map, FWD_VH(at, sq), D, sq.tk, 2 * sv_t, 64,         \
                                WG_COLS);                                                         \
                attn_tma_kv_tile(p++, STAGES, ka, va, mk, mv, n_lo, kbar, vbar, empty);           \
            }                                                                                     \
            if (done > 0)                                                                         \
                wg_bar_wait(qfree, (done - 1) & 1);                                               \
            attn_tma_rows(qa, mq, m0, WG_ROWS, qbar);                                             \
            for (int t = 1; t < nt; ++t)                                                          \
                attn_tma_kv_tile(p++, STAGES, ka, va, mk, mv, n_lo + t * WG_COLS, kbar, vbar,     \
                                 empty);                                                          \
            ++done;                                                                               \
        }                                                                                         \
    } while (0)
#endif

/*
 * Whether the forward issues every tile's S unconditionally (the last tile an S of its own K that
 * nothing reads), on a warp index the compiler knows to be uniform, with S's first k-step
 * overwriting the accumulators: ptxas makes a warpgroup wait for its wgmma before a product that a
 * branch may skip, or before registers that other instructions wrote (8% of the forward at D 64,
 * 4% at D 256, on the H200). D 128's forward, held at 168 registers by its producer warpgroup,
 * slowed down with each of the three (the unconditional S spills): there the last tile issues
 * none, on zeros written first.
 */
#ifndef FWD_S_ALWAYS
#define FWD_S_ALWAYS (D != 128)
#endif
#if FWD_S_ALWAYS
#define FWD_S_ZEROS()
#else
#define FWD_S_ZEROS()                                                                             \
    do {                                                                                          \
        _Pragma("unroll") for (int i_ = 0; i_ < BLOCK_N / 2; ++i_)                                \
            s[i_] = 0.0f;                                                                         \
    } while (0)
#endif

__kernel __attribute__((reqd_work_group_size(WG_THREADS + PRODUCERS, 1, 1))) void
attn_fwd_wgmma(ATTN_FWD_PARAMS ATTN_TMA_PARAMS)
{
    __local ushort qs[BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort ks[STAGES * BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort vs[STAGES * BLOCK_N * D] __attribute__((aligned(1024)));
    const int lid = get_local_id(0), warp = FWD_S_ALWAYS ? wg_uniform(lid / 32) : lid / 32;
    const int lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const uint nbh = (uint)nb * hq, ntiles = (tq_all + BLOCK_M - 1) / BLOCK_M, items = ntiles * nbh;
    const uint g0 = get_group_id(0), ng = get_num_groups(0);
    const uint qa = mma_smem(qs), ka = mma_smem(ks), va = mma_smem(vs);
#define WG_K(n) (ka + (n) % STAGES * WG_TILE_BYTES)
#define WG_V(n) (va + (n) % STAGES * WG_TILE_BYTES)
#if TMA
    __local ulong bars[2 + 3 * STAGES];
    const uint qbar = mma_smem(bars), kbar = qbar + 8, vbar = kbar + 8 * STAGES;
    const uint empty = vbar + 8 * STAGES, qfree = empty + 8 * STAGES;
    if (lid == WG_THREADS)
        wg_bar_init(qfree, WG_THREADS); /* attn_tma_init's fence and barrier follow */
    attn_tma_init(qbar, 1, 2, 1, STAGES, lid);
    if (warp >= WG_THREADS / 32) {
        if (lid == WG_THREADS)
            FWD_PRODUCE();
        return;
    }
    int done = 0, p0 = 0; /* items done, and their K and V tiles: the stream's position */
#endif
    const int wg = warp / 4;
    for (uint kk = 0; attn_item_rank(kk, g0, ng) < items; ++kk) {
        FWD_ITEM(kk, at, sq, m0);
        if (m0 >= sq.tq)
            continue;
        int n_lo, n_hi;
        attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
        const int nt = attn_tile_count(n_lo, n_hi, BLOCK_N);
#if TMA
        wg_bar_wait(qbar, done & 1);
#define FWD_T(n) (p0 + (n)) /* tile n's place in the stream */
#else
        const __global io_t *kh = FWD_KH(at, sq), *vh = FWD_VH(at, sq);
        attn_copy_rows(qa, FWD_QH(at, sq) + m0 * sq_t, sq_t, BLOCK_M, sq.tq - m0, lid, WG_THREADS,
                       1);
        for (int n = 0; n < STAGES - 1; ++n) {
            if (n < nt)
                attn_wg_kv(WG_K(n), WG_V(n), kh, sk_t, vh, sv_t, n_lo + n * BLOCK_N, sq.tk, lid);
            mma_cp_commit();
        }
        wg_copies_landed(STAGES - 2);
#define FWD_T(n) (n)
#endif

        const int r0 = m0 + 16 * warp + g; /* the lane's rows: r0 and r0 + 8 */
        float acc[D / 2], s[BLOCK_N / 2], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
        uint4 pf[BLOCK_N / 16];
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            acc[i] = 0.0f;
        if (nt > 0) {
            FWD_S_ZEROS();
#if TMA
            ATTN_TMA_WAIT(kbar, FWD_T(0), STAGES);
#endif
            wg_fence();
            attn_wg_scores(s, qa, WG_K(FWD_T(0)), wg, FWD_S_ALWAYS);
            wg_commit();
            wg_wait(0);
            float alpha[2]; /* O is still zero */
            attn_wg_softmax(s, alpha, mrow, lrow, pf, r0, n_lo, m0, sq, scale, softcap, wl, wr,
                            t4);
        }
#if TMA
        if (nt <= 1)
            wg_bar_arrive(qfree); /* every S of the item has been waited for: Q is free */
#endif
        for (int n = 0; n < nt; ++n) {
            const bool more = n + 1 < nt;
#if TMA
            if (more)
                ATTN_TMA_WAIT(kbar, FWD_T(n + 1), STAGES);
#else
            wg_copies_landed(STAGES - 3); /* tile n + 1 is in */
            const int next = n + STAGES - 1;
            if (next < nt)
                attn_wg_kv(WG_K(next), WG_V(next), kh, sk_t, vh, sv_t, n_lo + next * BLOCK_N,
                           sq.tk, lid);
            mma_cp_commit();
#endif
            FWD_S_ZEROS();
            wg_fence();
#if FWD_S_ALWAYS
            attn_wg_scores(s, qa, WG_K(FWD_T(more ? n + 1 : n)), wg, 1); /* the last: unused */
#else
            if (more)
                attn_wg_scores(s, qa, WG_K(FWD_T(n + 1)), wg, 0);
#endif
            wg_commit(); /* empty after the last tile without FWD_S_ALWAYS */
#if TMA
            ATTN_TMA_WAIT(vbar, FWD_T(n), STAGES);
#endif
            attn_wg_pv(acc, pf, WG_V(FWD_T(n)));
            wg_commit();
            float alpha[2] = {1.0f, 1.0f};
            uint4 pn[BLOCK_N / 16];
            wg_wait(1);
#if TMA
            if (n + 2 == nt)
                wg_bar_arrive(qfree); /* the item's last S has been waited for */
#endif
            if (more) {
                attn_wg_softmax(s, alpha, mrow, lrow, pn, r0, n_lo + (n + 1) * BLOCK_N, m0, sq,
                                scale, softcap, wl, wr, t4);
            }
            wg_wait(0);
#if TMA
            wg_bar_arrive(empty + 8 * (FWD_T(n) % STAGES)); /* K and V of tile n are read */
#endif
#pragma unroll
            for (int i = 0; i < D / 2; ++i)
                wg_keep_f(acc + i);
#pragma unroll
            for (int j = 0; j < BLOCK_N / 16; ++j) {
                wg_keep_u4(pf + j); /* P of tile n stayed in its registers until now */
                if (more)
                    pf[j] = pn[j];
            }
            /* Most tiles move no maximum past the slack: their D / 2 multiplies a lane are issue
               slots the softmax needs (the products have been waited for, so this branch does
               not serialise them). */
            if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
                for (int e = 0; e < MMA_OT; ++e) {
                    acc[4 * e] *= alpha[0];
                    acc[4 * e + 1] *= alpha[0];
                    acc[4 * e + 2] *= alpha[1];
                    acc[4 * e + 3] *= alpha[1];
                }
            }
        }
#undef FWD_T
        float4 acc4[MMA_OT];
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e)
            acc4[e] = (float4)(acc[4 * e], acc[4 * e + 1], acc[4 * e + 2], acc[4 * e + 3]);
        attn_fwd_store(o, attn_row(o_off, so_b, so_h, so_t, at.b, at.h, sq.q0), so_t, lse,
                       lse_off + at.b * sl_b + at.h * sl_h + sq.q0, acc4, mrow, lrow, r0, sq.tq,
                       t4);
#if TMA
        ++done;
        p0 += nt;
#endif
    }
#undef WG_K
#undef WG_V
}
#undef FWD_VH
#undef FWD_KH
#undef FWD_QH
#undef FWD_ITEM
#endif

#ifdef ATTN_KERNEL_BWD_DQ_WGMMA
/*
 * attn_bwd_dq_wgmma: attn_bwd_dq_mma on wgmma. Q and dO stay in local memory, K and V tiles are
 * double-buffered (the next tile's copy, issued by cp.async once the barrier shows every warpgroup
 * done with the buffer, or by TMA once they release it, runs under this tile's three products).
 * Per tile: S = Q K^T and dP = dO V^T, P and dS in registers, dQ += dS K with dS as A registers.
 */
__kernel __attribute__((reqd_work_group_size(WG_THREADS + PRODUCERS, 1, 1))) void
attn_bwd_dq_wgmma(ATTN_DQ_PARAMS ATTN_TMA_PARAMS)
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
    const __global io_t *qh = q + attn_row(q_off, sq_b, sq_h, sq_t, b, h, sq.q0);
    const __global io_t *dh = dout + attn_row(do_off, sd_b, sd_h, sd_t, b, h, sq.q0);
    const __global io_t *kh = k + attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const __global io_t *vh = v + attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const uint qa = mma_smem(qs), da = mma_smem(ds), ka = mma_smem(ks), va = mma_smem(vs);
    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    const int nt = attn_tile_count(n_lo, n_hi, BLOCK_N);

#if TMA
    __local ulong bars[1 + 3 * 2];
    const uint qbar = mma_smem(bars), kbar = qbar + 8, vbar = kbar + 16, empty = vbar + 16;
    attn_tma_init(qbar, 2, 2, 1, 2, lid);
    if (lid >= WG_THREADS) {
        __global ulong16 *slots = ATTN_TMA_MY_SLOTS;
        if (lid == WG_THREADS) {
            attn_tma_resident(slots, tma_map, qh, sq_t, sq.tq, m0, qa, qbar);
            attn_tma_resident(slots + 1, tma_map, dh, sd_t, sq.tq, m0, da, qbar);
            attn_tma_stream(slots + 2, tma_map, kh, sk_t, vh, sv_t, n_lo, sq.tk, nt, 2, ka, va,
                            kbar, vbar, empty);
        }
        return;
    }
#else
    attn_copy_rows(qa, qh + m0 * sq_t, sq_t, BLOCK_M, sq.tq - m0, lid, WG_THREADS, 1);
    attn_copy_rows(da, dh + m0 * sd_t, sd_t, BLOCK_M, sq.tq - m0, lid, WG_THREADS, 1);
    if (nt > 0)
        attn_wg_kv(ka, va, kh, sk_t, vh, sv_t, n_lo, sq.tk, lid);
    mma_cp_commit();
#endif

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
#if TMA
    wg_bar_wait(qbar, 0); /* Q and dO are in */
#endif

    for (int n = 0; n < nt; ++n) {
        const int n0 = n_lo + n * BLOCK_N;
        const uint kt = ka + n % 2 * WG_TILE_BYTES, vt = va + n % 2 * WG_TILE_BYTES;
#if TMA
        ATTN_TMA_WAIT(kbar, n, 2);
        ATTN_TMA_WAIT(vbar, n, 2);
#else
        wg_copies_landed(0); /* tile n is in */
        if (n + 1 < nt)
            attn_wg_kv(ka + (n + 1) % 2 * WG_TILE_BYTES, va + (n + 1) % 2 * WG_TILE_BYTES, kh,
                       sk_t, vh, sv_t, n0 + BLOCK_N, sq.tk, lid);
        mma_cp_commit();
#endif
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
#if TMA
        wg_bar_arrive(empty + 8 * (n % 2)); /* K and V of tile n are read */
#endif
        attn_wg_keep(acc, dsf);
    }
#if !TMA
    mma_cp_wait(0); /* with no key tile, Q's and dO's copies: none may land after the exit */
#endif

    float4 acc4[MMA_OT];
    attn_wg_acc4(acc4, acc, MMA_OT);
    attn_acc_store(dq, attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0), sg_t, acc4, r0, sq.tq, t4);
}
#endif

#ifdef ATTN_KERNEL_BWD_DKDV_WGMMA
#ifndef STAGES
#define STAGES 2
#endif
#if STAGES < 2 || STAGES > 3 || (STAGES == 3 && !TMA)
#error "attn_bwd_dkdv_wgmma: STAGES 2, or 3 with TMA"
#endif
#ifndef DS_STORE
#define DS_STORE 0
#endif
/*
 * On 128-query tiles, each tile's products in two halves of 64 queries: the second half's S^T
 * and dP^T run under the first half's P, dS, dV and dK, and a lane holds the score accumulators
 * of one half at a time (at D 64 those of a whole tile overflow its 240 registers).
 */
#ifndef DKDV_HALVES
#define DKDV_HALVES (WG_COLS == 128 && !DKDV_PAIR)
#endif
/* Half hf of a tile: P^T and dS^T of its 64 queries from s and dp, masked, into pf and sf. */
#define DKDV_HALF(hf, s, dp)                                                                      \
    do {                                                                                          \
        float4 l4_[MMA_MT / 2], d4_[MMA_MT / 2], st4_[MMA_MT / 2], dpt4_[MMA_MT / 2];             \
        _Pragma("unroll") for (int j_ = 0; j_ < MMA_MT / 2; ++j_) {                               \
            const int col_ = 64 * (hf) + j_ * 8 + 2 * t4;                                         \
            const float2 l_ = vload2(0, ls + col_), d_ = vload2(0, ds + col_);                    \
            l4_[j_] = (float4)(l_, l_);                                                           \
            d4_[j_] = (float4)(d_, d_);                                                           \
        }                                                                                         \
        attn_wg_p_ds_n(st4_, dpt4_, s, dp, MMA_MT / 2, 1 + (hf), l4_, d4_, scale, softcap);       \
        const int mh_ = m0 + 64 * (hf);                                                           \
        if (attn_tile_masked(mh_, 64, n0, BLOCK_N, sq.tq, sq.tk, wl, wr)) {                       \
            attn_mask_tiles(st4_, MMA_MT / 2, 0.0f, c0, mh_, true, sq, wl, wr, t4);               \
            attn_mask_tiles(dpt4_, MMA_MT / 2, 0.0f, c0, mh_, true, sq, wl, wr, t4);              \
        }                                                                                         \
        _Pragma("unroll") for (int j_ = 0; j_ < 4; ++j_) {                                        \
            pf[4 * (hf) + j_] = attn_acc_to_a(st4_[2 * j_], st4_[2 * j_ + 1]);                    \
            sf[4 * (hf) + j_] = attn_acc_to_a(dpt4_[2 * j_], dpt4_[2 * j_ + 1]);                  \
        }                                                                                         \
    } while (0)
#ifndef DS_SLABS
#define DS_SLABS 2
#endif
#if DS_STORE && (DKDV_PAIR || !TMA || !defined(DS_BM) || DS_BM % BLOCK_M || DS_SLABS < 2 ||      \
                 DS_SLABS > 4)
#error "attn_bwd_dkdv_wgmma: DS_STORE needs TMA, D 64 or 128, DS_BM a multiple of BLOCK_M and \
DS_SLABS 2 to 4"
#endif
#if DS_STORE
/*
 * The scratch of dS: query head p of the part's at ds_scratch + ds_off + p ds_h, its query rows
 * ds_t elements apart; the grid covers the part's nbh (batch, KV head) pairs from bh0.
 */
#define ATTN_DS_PARAMS                                                                            \
    , __global io_t *ds_scratch, ulong ds_off, long ds_h, long ds_t, int bh0, int nbh
#define DS_SLAB (BLOCK_M * 128) /* a warpgroup's 64 keys of a dS tile in local memory */

/*
 * Tile t's dS, the transpose of the warpgroup's dS^T fragments sf (its 64 keys by BLOCK_M
 * queries), to the scratch, in two steps around the issue of the tile's products (which read sf:
 * writing it out first leaves the products undisturbed). attn_ds_write: stmatrix's transposing
 * form writes it to the local slab at buf as BLOCK_M query rows of 64 keys in TMA's 128-byte
 * swizzle. attn_ds_send: the warpgroup's first work-item stores the slab by TMA, whose copy runs
 * on under the next tile. Each warpgroup has DS_SLABS slabs, used in turn, and four map slots, one
 * for each query head (dsh, the head's dS) in turn: with GQA groups of up to four heads no map is
 * made again, so no store waits for those before it.
 */
__attribute__((always_inline)) inline void attn_ds_write(const uint4 *sf, uint buf, int wg,
                                                         int lid)
{
    const int lane = lid & 31, mat = lane >> 3, r = lane & 7;
#if DS_SLABS == 2
    if ((lid & 127) == 0)
        wg_bulk_read(1); /* the store from this slab, two tiles back, has read it */
    wg_named_barrier(1 + wg, 128);
#endif
    /* matrix mat holds keys 8 (mat & 1) on and queries 8 (mat >> 1) on of the warp's 16 x 16 */
    const uint chunk = 2 * ((lid >> 5) & 3) + (mat & 1);
#pragma unroll
    for (int j = 0; j < BLOCK_M / 16; ++j) {
        const uint row = 16 * j + 8 * (mat >> 1) + r;
        wg_stmatrix4_trans(buf + row * 128 + ((chunk ^ r) << 4), sf[j].x, sf[j].y, sf[j].z,
                           sf[j].w);
    }
    wg_proxy_fence();
}

__attribute__((always_inline)) inline void
attn_ds_send(uint buf, int wg, int lid, __global ulong16 *slots, ulong16 tmpl,
             const __global io_t *dsh, long ds_t, int head, bool new_head, attn_seq sq, int m0,
             int n0)
{
    wg_named_barrier(1 + wg, 128);
    __global ulong16 *slot = slots + 4 * wg + head % 4;
    if ((lid & 127) == 0) {
        if (new_head) {
            if (head >= 4)
                wg_bulk_done(); /* no store in flight reads the slot's map */
            wg_tma_map(slot, tmpl, dsh, sq.tk, sq.tq, 2 * ds_t, 64, BLOCK_M);
        }
        wg_tma_store_hint((ulong)slot, n0 + 64 * wg, m0, buf, wg_l2_evict_first());
        wg_bulk_commit();
#if DS_SLABS > 2
        wg_bulk_read(DS_SLABS - 2); /* the last store from the slab of two tiles on has read it */
#endif
    }
}
#else
#define ATTN_DS_PARAMS
#endif
/*
 * attn_bwd_dkdv_wgmma: attn_bwd_dkdv_mma on wgmma, for BLOCK_N keys (a warpgroup per 64) over
 * every query head of the group and every query tile of BLOCK_M rows, in the same fixed order. K
 * and V stay in local memory; Q and dO tiles (and their rows' statistics) go through STAGES
 * buffers, the next tile's copy issued by cp.async once the barrier shows every warpgroup done with
 * its buffer, or by TMA once they release it (ATTN_TMA_QTILES). Per tile:
 * S^T = K Q^T and dP^T = V dO^T, P^T and dS^T in registers, dV += P^T dO and dK += dS^T Q with
 * P^T and dS^T as A registers (in the two warpgroups of a pair past D 128).
 */
#if TMA
/*
 * The producer warp's copies of dK/dV's nt query tiles (tile t: rows WG_M0(t) of query head
 * WG_HEAD(t)) into buffer t % STAGES, once the warpgroups release it: Q's and dO's rows by TMA
 * from lane 0 (a map a head, made when the walk reaches the head, in one of STAGES slots a tensor
 * by the head's number: a head's tiles are all released before the walk, STAGES heads on, remakes
 * its maps, so no copy in flight reads a map being remade), the rows' statistics by every lane;
 * each lane then arrives on the buffer's barrier, which also waits for the bytes.
 */
#define ATTN_TMA_QTILES(slots, q_of, do_of, qa, da, lse2s, dls, full, empty)                     \
    for (int t = 0; t < nt; ++t) {                                                                \
        const int h_ = WG_HEAD(t), m_ = WG_M0(t), st_ = t % STAGES;                               \
        if (t >= STAGES)                                                                          \
            wg_bar_wait((empty) + 8 * st_, (t / STAGES + 1) & 1);                                 \
        if (lane == 0) {                                                                          \
            __global ulong16 *sl_ = (slots) + 2 * ((t / ntiles) % STAGES);                        \
            if (t % ntiles == 0) {                                                                \
                wg_tma_map(sl_, tma_map, q_of(h_), D, sq.tq, 2 * sq_t, 64, WG_COLS);               \
                wg_tma_map(sl_ + 1, tma_map, do_of(h_), D, sq.tq, 2 * sd_t, 64, WG_COLS);          \
            }                                                                                     \
            attn_tma_rows((qa) + st_ * WG_TILE_BYTES, (ulong)sl_, m_, WG_COLS, (full) + 8 * st_); \
            attn_tma_rows((da) + st_ * WG_TILE_BYTES, (ulong)(sl_ + 1), m_, WG_COLS,              \
                          (full) + 8 * st_);                                                      \
        }                                                                                         \
        attn_dkdv_stats((lse2s) + st_ * BLOCK_M, (dls) + st_ * BLOCK_M, lse + lse_off,            \
                        delta + delta_off, lb + h_ * sl_h, m_, sq.tq, lane, 32);                  \
        wg_bar_arrive((full) + 8 * st_);                                                          \
    }
#endif

#if DKDV_PAIR
/*
 * A pair's tile t up to its accumulating product's A registers af. Warpgroup 0 computes S^T and
 * P^T, and hands P^T's factor (attn_p_g_tiles) to warpgroup 1 through g_buf (a float4 a lane and
 * 8-query tile, on mbarrier g_full) once warpgroup 1 has read tile t - 1's (g_free); warpgroup 1
 * computes dP^T and dS^T = factor (dP^T - delta).
 */
__attribute__((always_inline)) inline void
attn_wg_pair_a(uint4 *af, int wg, int lid, int t, uint ka, uint va, uint qt, uint dt,
               const float4 *l4, const float4 *d4, bool masked, int c0, int m0, attn_seq sq,
               int wl, int wr, int t4, float scale, float softcap, __local float4 *g_buf,
               uint g_full, uint g_free)
{
    float x[WG_COLS / 2];
    wg_fence();
    attn_wg_scores(x, wg ? va : ka, wg ? dt : qt, 0, 1); /* S^T = K Q^T, or dP^T = V dO^T */
    wg_commit();
    wg_wait(0);
    float4 x4[MMA_MT], g4[MMA_MT];
    attn_wg_acc4(x4, x, MMA_MT);
    __local float4 *mine = g_buf + lid % 128;
    if (wg == 0) {
        attn_p_g_tiles(x4, g4, l4, MMA_MT, scale, softcap);
        if (masked) {
            attn_mask_tiles(x4, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
            attn_mask_tiles(g4, MMA_MT, 0.0f, c0, m0, true, sq, wl, wr, t4);
        }
        if (t > 0)
            wg_bar_wait(g_free, (t - 1) & 1);
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j)
            mine[128 * j] = g4[j];
        wg_bar_arrive(g_full);
    } else {
        wg_bar_wait(g_full, t & 1);
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j)
            x4[j] = mine[128 * j] * (x4[j] - d4[j]);
        wg_bar_arrive(g_free);
    }
#pragma unroll
    for (int j = 0; j < BLOCK_M / 16; ++j)
        af[j] = attn_acc_to_a(x4[2 * j], x4[2 * j + 1]);
}
#endif

__kernel __attribute__((reqd_work_group_size(WG_THREADS + PRODUCERS, 1, 1))) void
attn_bwd_dkdv_wgmma(ATTN_DKDV_PARAMS ATTN_DS_PARAMS ATTN_TMA_PARAMS)
{
    __local ushort ks[BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort vs[BLOCK_N * D] __attribute__((aligned(1024)));
    __local ushort qs[STAGES * BLOCK_M * D] __attribute__((aligned(1024)));
    __local ushort dos[STAGES * BLOCK_M * D] __attribute__((aligned(1024)));
    __local float lse2s[STAGES * BLOCK_M], dls[STAGES * BLOCK_M];
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
#if DS_STORE
    __local ushort dss[DS_SLABS * DS_SLAB] __attribute__((aligned(1024)));
    const attn_place at = attn_place_in(bh0, nbh, hkv, false);
#else
    const attn_place at = attn_place_of(nb, hkv, false);
#endif
    const int b = at.b, hk = at.h;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int n0 = at.tile * BLOCK_N;
    if (n0 >= sq.tk)
        return;
    const uint ka = mma_smem(ks), va = mma_smem(vs), qa = mma_smem(qs), da = mma_smem(dos);
    const __global io_t *kh = k + attn_row(k_off, sk_b, sk_h, sk_t, b, hk, sq.k0);
    const __global io_t *vh = v + attn_row(v_off, sv_b, sv_h, sv_t, b, hk, sq.k0);
    const long lb = b * sl_b + sq.q0; /* the batch entry's first row of lse and delta */
    int m_lo, m_hi;
    attn_query_range(n0, BLOCK_N, sq.tq, sq.tk, wl, wr, &m_lo, &m_hi);
#if DS_STORE
    if (m_hi > m_lo) { /* whole blocks of dQ's, up to the last tile with a query */
        m_lo = m_lo / DS_BM * DS_BM;
        m_hi = min((m_hi + DS_BM - 1) / DS_BM * DS_BM, (sq.tq + BLOCK_M - 1) / BLOCK_M * BLOCK_M);
    }
#endif
    const int ntiles = attn_tile_count(m_lo, m_hi, BLOCK_M), nt = group * ntiles;
    /* Tile t: query head hk group + t / ntiles, queries from m0 */
#define WG_HEAD(t) (hk * group + (t) / ntiles)
#define WG_M0(t) (m_lo + (t) % ntiles * BLOCK_M)
#define WG_Q(h) (q + attn_row(q_off, sq_b, sq_h, sq_t, b, (h), sq.q0))
#define WG_DO(h) (dout + attn_row(do_off, sd_b, sd_h, sd_t, b, (h), sq.q0))
#if DKDV_PAIR
    __local float4 g_buf[MMA_MT * 128];
    __local ulong g_bars[2];
    const uint g_full = mma_smem(g_bars), g_free = g_full + 8;
    if (lid == 0) { /* the work-group barrier before the first tile orders these */
        wg_bar_init(g_full, 128);
        wg_bar_init(g_free, 128);
    }
#endif
#if TMA
    __local ulong bars[1 + 2 * STAGES];
    const uint kvbar = mma_smem(bars), full = kvbar + 8, empty = full + 8 * STAGES;
    attn_tma_init(kvbar, 2, 1, 32 + 2, STAGES, lid); /* the warp's statistics, two copies a tile */
    if (lid >= WG_THREADS) {
        __global ulong16 *slots = ATTN_TMA_MY_SLOTS;
        if (lid == WG_THREADS) {
            attn_tma_resident(slots, tma_map, kh, sk_t, sq.tk, n0, ka, kvbar);
            attn_tma_resident(slots + 1, tma_map, vh, sv_t, sq.tk, n0, va, kvbar);
        }
        if (lid < WG_THREADS + 32)
            ATTN_TMA_QTILES(slots + 2, WG_Q, WG_DO, qa, da, lse2s, dls, full, empty);
        return;
    }
    wg_bar_wait(kvbar, 0);
#else
    attn_copy_rows(ka, kh + n0 * sk_t, sk_t, BLOCK_N, sq.tk - n0, lid, WG_THREADS, 1);
    attn_copy_rows(va, vh + n0 * sv_t, sv_t, BLOCK_N, sq.tk - n0, lid, WG_THREADS, 1);
#define WG_STAGE(t)                                                                               \
    do {                                                                                          \
        const int h_ = WG_HEAD(t), m_ = WG_M0(t), st_ = (t) % STAGES;                             \
        attn_wg_kv(qa + st_ * WG_TILE_BYTES, da + st_ * WG_TILE_BYTES, WG_Q(h_), sq_t, WG_DO(h_), \
                   sd_t, m_, sq.tq, lid);                                                         \
        attn_dkdv_stats(lse2s + st_ * BLOCK_M, dls + st_ * BLOCK_M, lse + lse_off,                \
                        delta + delta_off, lb + h_ * sl_h, m_, sq.tq, lid, WG_THREADS);           \
    } while (0)
    if (nt > 0)
        WG_STAGE(0);
    mma_cp_commit();
#endif

    const int wg = warp / 4, c0 = n0 + 16 * (DKDV_PAIR ? warp % 4 : warp) + g; /* c0, c0 + 8 */
#if DKDV_PAIR
    float acc[D / 2]; /* dV in warpgroup 0, dK in 1 */
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        acc[i] = 0.0f;
#else
    float gk[D / 2], gv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        gk[i] = gv[i] = 0.0f;
#endif
    for (int t = 0; t < nt; ++t) {
        const int m0 = WG_M0(t);
        const uint qt = qa + t % STAGES * WG_TILE_BYTES, dt = da + t % STAGES * WG_TILE_BYTES;
#if TMA
        ATTN_TMA_WAIT(full, t, STAGES); /* Q's, dO's and their statistics */
#else
        wg_copies_landed(0); /* tile t is in (K and V with the first) */
        if (t + 1 < nt)
            WG_STAGE(t + 1);
        mma_cp_commit();
#endif
        const __local float *ls = lse2s + t % STAGES * BLOCK_M, *ds = dls + t % STAGES * BLOCK_M;
#if !DKDV_HALVES
        float4 l4[MMA_MT], d4[MMA_MT];
#pragma unroll
        for (int j = 0; j < MMA_MT; ++j) {
            const float2 l = vload2(0, ls + j * 8 + 2 * t4), d = vload2(0, ds + j * 8 + 2 * t4);
            l4[j] = (float4)(l, l);
            d4[j] = (float4)(d, d);
        }
#endif
#if DKDV_PAIR
        uint4 af[BLOCK_M / 16];
        attn_wg_pair_a(af, wg, lid, t, ka, va, qt, dt, l4, d4,
                       attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr), c0, m0,
                       sq, wl, wr, t4, scale, softcap, g_buf, g_full, g_free);
        wg_fence();
        attn_wg_pv(acc, af, wg ? qt : dt); /* dV += P^T dO, or dK += dS^T Q */
#elif DKDV_HALVES
        uint4 pf[BLOCK_M / 16], sf[BLOCK_M / 16];
        float s0[32], dp0[32], s1[32], dp1[32];
        wg_fence();
        attn_wg_scores_half(s0, ka, qt, wg, 0);
        wg_commit();
        attn_wg_scores_half(dp0, va, dt, wg, 0);
        wg_commit();
        /* DKDV_HALF(hf) waits for its S^T with 1 + hf groups still running: its dP^T, and in
           the second half the first half's dV and dK */
        DKDV_HALF(0, s0, dp0);
        wg_fence();
        attn_wg_scores_half(s1, ka, qt, wg, 1);
        wg_commit();
        attn_wg_scores_half(dp1, va, dt, wg, 1);
        wg_commit();
        attn_wg_pv_half(gv, pf, dt, 0);
        attn_wg_pv_half(gk, sf, qt, 0);
        wg_commit();
        DKDV_HALF(1, s1, dp1);
#if DS_STORE
        const uint slab = mma_smem(dss) + (DS_SLABS * wg + t % DS_SLABS) * DS_SLAB;
        attn_ds_write(sf, slab, wg, lid);
#endif
        wg_fence();
        attn_wg_pv_half(gv, pf + 4, dt, 1);
        attn_wg_pv_half(gk, sf + 4, qt, 1);
#else
        float4 st4[MMA_MT], dpt4[MMA_MT];
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
#if DS_STORE
        const uint slab = mma_smem(dss) + (DS_SLABS * wg + t % DS_SLABS) * DS_SLAB;
        attn_ds_write(sf, slab, wg, lid);
#endif
        wg_fence();
        attn_wg_pv(gv, pf, dt);
        attn_wg_pv(gk, sf, qt);
#endif
        wg_commit();
#if DS_STORE
        const long ds_head = (long)b * hkv * group + WG_HEAD(t) - (long)bh0 * group;
        attn_ds_send(slab, wg, lid, ATTN_TMA_MY_SLOTS + 8, tma_map,
                     ds_scratch + ds_off + ds_head * ds_h, ds_t, t / ntiles, t % ntiles == 0, sq,
                     m0, n0);
#endif
        wg_wait(0);
#if TMA
        wg_bar_arrive(empty + 8 * (t % STAGES)); /* tile t's buffer is read */
#endif
#if DKDV_PAIR
        attn_wg_keep(acc, af);
#else
        attn_wg_keep(gv, pf);
        attn_wg_keep(gk, sf);
#endif
    }
#if !TMA
    mma_cp_wait(0); /* with no query tile, K's and V's copies: none may land after the exit */
#undef WG_STAGE
#endif
#if DS_STORE
    if ((lid & 127) == 0)
        wg_bulk_done(); /* the stores have read their slabs before the work-group ends */
#endif
#undef WG_DO
#undef WG_Q
#undef WG_M0
#undef WG_HEAD

#if DKDV_PAIR
    float4 acc4[MMA_OT];
    attn_wg_acc4(acc4, acc, MMA_OT);
    if (wg == 0)
        attn_acc_store(dv, attn_row(dv_off, sgv_b, sgv_h, sgv_t, b, hk, sq.k0), sgv_t, acc4, c0,
                       sq.tk, t4);
    else
        attn_acc_store(dk, attn_row(dk_off, sgk_b, sgk_h, sgk_t, b, hk, sq.k0), sgk_t, acc4, c0,
                       sq.tk, t4);
#else
    float4 gk4[MMA_OT], gv4[MMA_OT];
    attn_wg_acc4(gk4, gk, MMA_OT);
    attn_wg_acc4(gv4, gv, MMA_OT);
    attn_dkdv_store(dk, attn_row(dk_off, sgk_b, sgk_h, sgk_t, b, hk, sq.k0), sgk_t, dv,
                    attn_row(dv_off, sgv_b, sgv_h, sgv_t, b, hk, sq.k0), sgv_t, gk4, gv4, c0,
                    sq.tk, t4);
#endif
}
#endif

#ifdef ATTN_KERNEL_BWD_DQ_DS_WGMMA
#ifndef STAGES
#define STAGES 2
#endif
#ifndef PERSIST
#define PERSIST 0
#endif
#if !TMA || STAGES < 2 || STAGES > 4 || D > 128
#error "attn_bwd_dq_ds_wgmma: TMA, STAGES 2 to 4, D 64 or 128"
#endif
LLMCL_WG_MMA_SS(attn_wg_dsk_BF16, "bf16", D, "0", "1")
LLMCL_WG_MMA_SS(attn_wg_dsk_F16, "f16", D, "0", "1")
#define DQ_K_BYTES (BLOCK_N * D * 2)        /* a K tile */
#define DQ_DS_BYTES (BLOCK_M * BLOCK_N * 2) /* a dS tile: BLOCK_M queries by BLOCK_N keys */

/*
 * attn_bwd_dq_ds_wgmma: dQ = dS K from the dS that attn_bwd_dkdv_wgmma stored (DS_STORE), for
 * BLOCK_M query rows of one head (a warpgroup per 64) over the same key tiles. A producer warp
 * streams each tile's K and dS by TMA into STAGES buffers; the warpgroups read both from local
 * memory (dS as A, K-major; K as B, mn-major), with one tile's products in flight while the next
 * is issued. Arguments as ATTN_DS_PARAMS, in query heads: the items are nbh (batch, query head)
 * pairs from bh0, whose dS are the scratch's heads in order, by query blocks. Head-major, a
 * head's heaviest blocks first: the work-groups in flight read the K of few KV heads (a KV
 * head's query heads are consecutive), which then stays in L2. With PERSIST the work-groups walk
 * several items each (attn_item_rank), the K and dS tiles of all of them in one stream through
 * the buffers, so that an item's first tiles land under the last products and the stores of the
 * one before; its maps are in one of DQ_MAP_SETS sets in turn.
 */
#if PERSIST
#define DQ_MAP_SETS 3
#else
#define DQ_MAP_SETS 1
#endif
#define DQ_ITEM(kk, b, h, sq, m0)                                                                 \
    const uint rank_ = (uint)attn_item_rank((kk), g0, ng), bh_ = bh0 + rank_ / ntq;               \
    const int b = bh_ / hq, h = bh_ % hq;                                                         \
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);         \
    const int m0 = (ntq - 1 - rank_ % ntq) * BLOCK_M
/* The keys that the block's existing rows see (the tiles dK/dV wrote), in tiles */
#define DQ_TILES(sq, m0, n_lo, nt)                                                                \
    int n_lo, n_hi_;                                                                              \
    attn_key_range(m0, min(BLOCK_M, (sq).tq - (m0)), (sq).tq, (sq).tk, wl, wr, &n_lo, &n_hi_);    \
    const int nt = attn_tile_count(n_lo, n_hi_, BLOCK_N)

/*
 * The producer's stream: before it remakes a set of maps, the copies that used it last (item i -
 * DQ_MAP_SETS's, whose last tile is `last` of the set) have landed, which the warpgroups' release
 * of that tile shows. Tile j's release is awaited before tile j + STAGES's copy; a later tile's
 * is awaited here (its phase is the barrier's current or last one: tile j + STAGES is not yet
 * issued).
 */
#define DQ_PRODUCE()                                                                              \
    do {                                                                                          \
        __global ulong16 *slots = ATTN_TMA_MY_SLOTS;                                              \
        const ulong once = wg_l2_evict_first();                                                   \
        int done = 0, p = 0, last[DQ_MAP_SETS];                                                   \
        for (int i = 0; i < DQ_MAP_SETS; ++i)                                                     \
            last[i] = -1;                                                                         \
        for (uint kk = 0; attn_item_rank(kk, g0, ng) < items; ++kk) {                             \
            DQ_ITEM(kk, b, h, sq, m0);                                                            \
            if (m0 >= sq.tq)                                                                      \
                continue;                                                                         \
            DQ_TILES(sq, m0, n_lo, nt);                                                           \
            if (nt == 0)                                                                          \
                continue;                                                                         \
            const int set = done++ % DQ_MAP_SETS, j = last[set];                                  \
            if (j >= 0 && j >= p - STAGES)                                                        \
                wg_bar_wait(empty + 8 * (j % STAGES), (j / STAGES) & 1);                          \
            const ulong mk = wg_tma_map(slots + 2 * set, tma_map, DQ_KH(b, h, sq), D, sq.tk,      \
                                        2 * sk_t, 64, BLOCK_N);                                   \
            const ulong md = wg_tma_map(slots + 2 * set + 1, tma_map, DQ_DSH(b, h), sq.tk, sq.tq, \
                                        2 * ds_t, 64, BLOCK_M);                                   \
            for (int t = 0; t < nt; ++t, ++p) {                                                   \
                const int st = p % STAGES, n0 = n_lo + t * BLOCK_N;                               \
                const uint bar = full + 8 * st;                                                   \
                if (p >= STAGES)                                                                  \
                    wg_bar_wait(empty + 8 * st, (p / STAGES + 1) & 1);                            \
                wg_bar_expect(bar, DQ_K_BYTES + DQ_DS_BYTES);                                     \
                for (int a = 0; a < D / 64; ++a)                                                  \
                    wg_tma_load(ka + st * DQ_K_BYTES + a * BLOCK_N * 128, mk, 64 * a, n0, bar);   \
                for (int a = 0; a < BLOCK_N / 64; ++a)                                            \
                    wg_tma_load_hint(da + st * DQ_DS_BYTES + a * BLOCK_M * 128, md, n0 + 64 * a,  \
                                     m0, bar, once);                                              \
            }                                                                                     \
            last[set] = p - 1;                                                                    \
        }                                                                                         \
    } while (0)

__kernel __attribute__((reqd_work_group_size(WG_THREADS + PRODUCERS, 1, 1))) void
attn_bwd_dq_ds_wgmma(const __global io_t *k, ulong k_off, const __global io_t *ds_scratch,
                     ulong ds_off, __global io_t *dq, ulong dq_off, const __global int *cu_q,
                     ulong cu_q_off, const __global int *cu_k, ulong cu_k_off, int tq_all,
                     int tk_all, int hq, int group, long sk_b, long sk_h, long sk_t, long sg_b,
                     long sg_h, long sg_t, long ds_h, long ds_t, int bh0, int nbh, int wl,
                     int wr ATTN_TMA_PARAMS)
{
    __local ushort ks[STAGES * DQ_K_BYTES / 2] __attribute__((aligned(1024)));
    __local ushort dss[STAGES * DQ_DS_BYTES / 2] __attribute__((aligned(1024)));
    __local ulong bars[1 + 2 * STAGES];
    const int lid = get_local_id(0), warp = lid / 32, lane = lid % 32, g = lane >> 2, t4 = lane & 3;
    const uint ntq = (tq_all + BLOCK_M - 1) / BLOCK_M, items = ntq * nbh;
    const uint g0 = get_group_id(0), ng = get_num_groups(0);
#define DQ_KH(b, h, sq) (k + attn_row(k_off, sk_b, sk_h, sk_t, (b), (h) / group, (sq).k0))
#define DQ_DSH(b, h) (ds_scratch + ds_off + ((long)(b) * hq + (h) - bh0) * ds_h)
    const uint ka = mma_smem(ks), da = mma_smem(dss);
    const uint full = mma_smem(bars) + 8, empty = full + 8 * STAGES;
    attn_tma_init(full - 8, 1, 1, 1, STAGES, lid);
    if (lid >= WG_THREADS) {
        if (lid == WG_THREADS)
            DQ_PRODUCE();
        return;
    }

    const int wg = warp / 4;
    int p0 = 0; /* the stream's position: the tiles of the items before */
    for (uint kk = 0; attn_item_rank(kk, g0, ng) < items; ++kk) {
        DQ_ITEM(kk, b, h, sq, m0);
        if (m0 >= sq.tq)
            continue;
        DQ_TILES(sq, m0, n_lo, nt);
        const int r0 = m0 + 16 * warp + g; /* the lane's rows: r0 and r0 + 8 */
        float acc[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            acc[i] = 0.0f;
        for (int n = 0; n < nt; ++n) {
            const int pn = p0 + n;
            const uint kt = ka + pn % STAGES * DQ_K_BYTES, dt = da + pn % STAGES * DQ_DS_BYTES;
            ATTN_TMA_WAIT(full, pn, STAGES);
            wg_fence();
#pragma unroll
            for (int j = 0; j < BLOCK_N / 16; ++j) {
                const ulong a = wg_desc(dt + j / 4 * BLOCK_M * 128 + wg * 64 * 128 + j % 4 * 32,
                                        16, 1024);
                LLMCL_CAT(attn_wg_dsk_, IO_DT)(
                    acc, a, wg_desc(kt + j * 16 * 128, BLOCK_N * 128, 1024), 1);
            }
            wg_commit();
            wg_wait(1); /* tile n - 1's products are done: its buffers are free */
            if (n > 0)
                wg_bar_arrive(empty + 8 * ((pn - 1) % STAGES));
        }
        wg_wait(0);
        if (nt > 0)
            wg_bar_arrive(empty + 8 * ((p0 + nt - 1) % STAGES)); /* the item's last tile */
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            wg_keep_f(acc + i);
        p0 += nt;

        float4 acc4[MMA_OT];
        attn_wg_acc4(acc4, acc, MMA_OT);
        attn_acc_store(dq, attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0), sg_t, acc4, r0, sq.tq,
                       t4);
    }
#undef DQ_DSH
#undef DQ_KH
}
#undef DQ_TILES
#undef DQ_ITEM
#endif
#endif
