/*
 * attention_mma.cl: flash attention's mma.sync kernels (attn_fwd_mma, attn_bwd_dq_mma,
 * attn_bwd_dkdv_mma) on mma.cl's tensor-core block, and the helpers at the level of a 16 x 8
 * accumulator tile (the online softmax, P and dS, the mask, the stores) that attention_wgmma.cl's
 * kernels share, whose accumulators hold the same lanes' elements. Everything is under
 * LLMCL_NV_MMA: elsewhere this file is empty (after attention_common.cl, whose header gives the
 * layout and the mask).
 *
 * The kernels (bf16 or f16, D a multiple of 16 from 32 to 128, and to 256 for the forward; every
 * offset and stride of the loaded operands a multiple of 8 elements) follow FlashAttention-2.
 *
 * attn_fwd_mma: a work-group of BLOCK_M / (16 WM) warps takes BLOCK_M query rows, each warp WM
 * tiles of 16 of them, with their Q fragments in registers (QREG) or read from the staged Q tile.
 * K and V tiles of BLOCK_N keys pass through swizzled local tiles by cp.async: V's copy runs under
 * S = Q K^T and the softmax, the next K's under O += P V. S and O accumulate in f32 registers; P
 * goes from S's accumulators into A fragments (rounded to the storage dtype, as FlashAttention
 * does) without touching local memory. A lane holds rows g and g + 8 of each of its warp's tiles:
 * quad shuffles give the rows' maxima, and the sums stay per lane until the end.
 *
 * Tunables (-D), beside attention_common.cl's (BLOCK_M and BLOCK_N multiples of 16: a warp per 16
 * query rows, per 16 keys in attn_bwd_dkdv_mma):
 *   WM        attn_fwd_mma only: 16-row query tiles a warp takes (1 or 2; BLOCK_M a multiple of
 *             16 WM). Two tiles share each K and V fragment read from local memory. Default 1.
 *   QREG      attn_fwd_mma only. 1: Q's fragments stay in registers; 0: they are read from the
 *             staged Q tile each step, which leaves the registers to two tiles a warp at D = 128.
 *             Default 1.
 *   STAGES    attn_fwd_mma: 2: K and V tiles are double-buffered, the next ones loading under
 *             the whole step (one barrier a step); 1: one buffer each. Default 1.
 *   DKDV_PART attn_bwd_dkdv_mma, set by the launcher past D = 128: 1 dV only, 2 dK only.
 *             Default 0: both.
 */

#if defined(LLMCL_NV_MMA) &&                                                                       \
    (defined(ATTN_KERNEL_FWD_MMA) || defined(ATTN_KERNEL_BWD_DQ_MMA) ||                            \
     defined(ATTN_KERNEL_BWD_DKDV_MMA) || defined(ATTN_KERNEL_FWD_WGMMA) ||                        \
     defined(ATTN_KERNEL_BWD_DQ_WGMMA) || defined(ATTN_KERNEL_BWD_DKDV_WGMMA) ||                   \
     defined(ATTN_KERNEL_BWD_DQ_DS_WGMMA))
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

/*
 * attn_p_ds_tiles's first half, for kernels whose dP is in another warpgroup: s becomes P, and g
 * the factor that takes dP - delta to dS (P times the logit's derivative).
 */
__attribute__((always_inline)) inline void attn_p_g_tiles(float4 *s, float4 *g, const float4 *lse2,
                                                          int n, float scale, float softcap)
{
    if (softcap > 0.0f) {
        const float in = scale / softcap, out = softcap * M_LOG2E_F;
#pragma unroll
        for (int j = 0; j < n; ++j) {
            const float4 t = tanh(s[j] * in);
            s[j] = attn_exp4(out * t - lse2[j]);
            g[j] = s[j] * (scale * (1.0f - t * t));
        }
    } else {
#pragma unroll
        for (int j = 0; j < n; ++j) {
            s[j] = attn_exp4(s[j] * (scale * M_LOG2E_F) - lse2[j]);
            g[j] = s[j] * scale;
        }
    }
}

#if defined(ATTN_KERNEL_FWD_MMA) || defined(ATTN_KERNEL_FWD_WGMMA)
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
 * stayed). The softcap and the mask take uniform branches, so the common tile pays a maximum,
 * one fused multiply-add into exp2 and a sum per score: the maximum is taken of the raw products
 * (scale > 0 keeps their order) and the logit scale folds into the exponent's fma.
 */
__attribute__((always_inline)) inline void
attn_fwd_softmax(float4 *s, float *alpha, float *mrow, float *lrow, uint4 *pf, int r0, int n0,
                 bool masked, attn_seq sq, float scale, float softcap, int wl, int wr, int t4)
{
    float c = scale * M_LOG2E_F; /* from s to log2 units */
    if (softcap > 0.0f) {
        const float in = scale / softcap, out = softcap * M_LOG2E_F;
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
            s[j] = out * tanh(s[j] * in);
        c = 1.0f;
    }
    if (masked)
        attn_mask_tiles(s, MMA_NT, -INFINITY, r0, n0, false, sq, wl, wr, t4);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < MMA_NT; ++j) {
        mx[0] = fmax(mx[0], fmax(s[j].x, s[j].y));
        mx[1] = fmax(mx[1], fmax(s[j].z, s[j].w));
    }
    float neg[2]; /* the rows' maxima, negated */
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = c * attn_lanes_max(mx[i], 4);
        alpha[i] = 1.0f;
        if (mn > mrow[i] + ATTN_MAX_SLACK) { /* also the first visible key: mrow is -inf */
            alpha[i] = attn_exp2(mrow[i] - mn);
            mrow[i] = mn;
        }
        neg[i] = mrow[i] == -INFINITY ? 0.0f : -mrow[i]; /* a row with no key yet: p = 0 */
        lrow[i] *= alpha[i];
    }
    const float4 cv = (float4)c, nv = (float4)(neg[0], neg[0], neg[1], neg[1]);
#pragma unroll
    for (int j = 0; j < MMA_NT; ++j) {
        s[j] = attn_exp4(fma(s[j], cv, nv));
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

#ifdef ATTN_KERNEL_FWD_MMA
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
#endif

/* Row statistics of the backward in log2 units: lse (+inf where no key is seen, so p = 0). */
inline float attn_lse2(float x) { return x == -INFINITY ? INFINITY : x * M_LOG2E_F; }

/*
 * Rows r0 and r0 + 8 (the lane's of a 16-row tile's D-wide accumulators acc: queries of dQ, keys
 * of dK or dV) at y + gb, rows sy_t apart, those past n skipped.
 */
__attribute__((always_inline)) inline void attn_acc_store(__global io_t *y, long gb, long sy_t,
                                                          const float4 *acc, int r0, int n, int t4)
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + 8 * i;
        if (row >= n)
            continue;
#pragma unroll
        for (int e = 0; e < MMA_OT; ++e) {
            const float2 x = i ? acc[e].zw : acc[e].xy;
            const long at_g = gb + row * sy_t + e * 8 + 2 * t4;
            STORE(IO_DT, y, at_g, x.x);
            STORE(IO_DT, y, at_g + 1, x.y);
        }
    }
}

#ifdef ATTN_KERNEL_BWD_DQ_MMA
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

    attn_acc_store(dq, attn_row(dq_off, sg_b, sg_h, sg_t, b, h, sq.q0), sg_t, acc, r0, sq.tq, t4);
}
#endif

#if defined(ATTN_KERNEL_BWD_DKDV_MMA) || defined(ATTN_KERNEL_BWD_DKDV_WGMMA)
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
#if defined(ATTN_KERNEL_BWD_DKDV_MMA) && MMA_WIDE && DKDV_PART == 0
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
    if (DKDV_K)
        attn_acc_store(dk, kgb, sgk_t, gk, c0, tk, t4);
    if (DKDV_V)
        attn_acc_store(dv, vgb, sgv_t, gv, c0, tk, t4);
}

#ifdef ATTN_KERNEL_BWD_DKDV_MMA
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
    const int ntiles = attn_tile_count(m_lo, m_hi, BLOCK_M);
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
#endif
#endif
