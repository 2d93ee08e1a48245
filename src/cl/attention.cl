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
 * columns tx + e * CT of D. These register-tile products are the places an mma path would take
 * over. Operands sit in local memory with padded rows (conflict-free reads); math is f32 and every
 * reduction runs in a fixed order (deterministic, no atomics).
 *
 *   attn_fwd       one work-group per (BLOCK_M query rows, b * Hq + h); online softmax over K/V
 *                  tiles of BLOCK_N keys; tiles outside the mask's band are skipped.
 *   attn_bwd_pre   delta = rowsum(dO * O), f32 in LSE's layout; PRE_WG work-items per group.
 *   attn_bwd_dq    one work-group per (BLOCK_M query rows, b * Hq + h): dQ = dS . K over K tiles.
 *   attn_bwd_dkdv  one work-group per (BLOCK_N keys, b * Hkv + hk): dV = P^T . dO and
 *                  dK = dS^T . Q over every query head of the KV head's group and its query tiles.
 *
 * Tunables (-D):
 *   D         head dim: 32, 64, 96, 128 or 256 (any multiple of 4 and of CT works).
 *   IO_DT     storage of Q, K, V, O, dO, dQ, dK, dV: F32, BF16 or F16.
 *   BLOCK_M   query rows per tile (attn_fwd, attn_bwd_dq: work-group rows; attn_bwd_dkdv: columns).
 *   BLOCK_N   keys per tile (attn_fwd, attn_bwd_dq: columns; attn_bwd_dkdv: work-group rows).
 *   TM, TN    register tile: query rows and keys per work-item. BLOCK_M % TM == 0,
 *             BLOCK_N % TN == 0, and D divisible by the column count (BLOCK_N / TN for attn_fwd and
 *             attn_bwd_dq, BLOCK_M / TM for attn_bwd_dkdv). Work-group size (BLOCK_M/TM)*(BLOCK_N/TN).
 *   PRE_WG    work-group size of attn_bwd_pre (any value up to the device maximum).
 *   VARLEN    defined: packed sequences through cu_q / cu_k.
 *   ATTN_ONLY 1 attn_fwd, 2 attn_bwd_pre, 3 attn_bwd_dq, 4 attn_bwd_dkdv: build only that kernel
 *             (a kernel's local arrays are sized by the tiles of the one launched); unset: all.
 * Local memory: operand tiles of (D+1)-element rows in the storage format (E bytes an element) and
 * f32 score tiles. attn_fwd (BLOCK_M + BLOCK_N)(D+1) E + 4 BLOCK_M (BLOCK_N + 1 + BLOCK_N / TN);
 * attn_bwd_dq 2 (BLOCK_M + BLOCK_N)(D+1) E + 4 BLOCK_M (BLOCK_N + 1); attn_bwd_dkdv
 * 2 (BLOCK_M + BLOCK_N)(D+1) E + 4 (2 BLOCK_N (BLOCK_M + 1) + 2 BLOCK_M).
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

#define DP (D + 1)        /* padded local row of a D-wide operand */
#define NP (BLOCK_N + 1)  /* padded local row of a score tile with BLOCK_N columns */
#define MP (BLOCK_M + 1)  /* padded local row of a score tile with BLOCK_M columns */

/* attn_fwd and attn_bwd_dq: rows are queries, columns keys. */
#define RT (BLOCK_M / TM)
#define CT (BLOCK_N / TN)
#define DT (D / CT)
/* attn_bwd_dkdv: rows are keys, columns queries. */
#define RT_KV (BLOCK_N / TN)
#define CT_KV (BLOCK_M / TM)
#define DT_KV (D / CT_KV)

typedef STORAGE(IO_DT) io_t;

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
 * Operand tiles stay in local memory in their storage format (16-bit storage halves the local
 * memory a tile needs, so larger tiles fit); LREAD converts an element to f32.
 */
#define LT_F32 float
#define LT_BF16 ushort
#define LT_F16 ushort
#define LT4_F32 float4
#define LT4_BF16 ushort4
#define LT4_F16 ushort4
typedef LLMCL_CAT(LT_, IO_DT) lt_t;
typedef LLMCL_CAT(LT4_, IO_DT) lt4_t;

inline float lread_F32(const __local float *p, int i) { return p[i]; }
inline float lread_BF16(const __local ushort *p, int i) { return as_float((uint)p[i] << 16); }
inline float lread_F16(const __local ushort *p, int i)
{
    return vload_half(i, (const __local half *)p);
}
#define LREAD(p, i) LLMCL_CAT(lread_, IO_DT)((p), (i))

/* nrows x D rows of src (row stride rs, zeros past valid) into dst with padded rows. */
inline void attn_load_tile(__local lt_t *dst, const __global io_t *src, long base, long rs,
                           int valid, int nrows, int lid, int nthreads)
{
    for (int idx = lid; idx < nrows * (D / 4); idx += nthreads) {
        const int r = idx / (D / 4), c = (idx - r * (D / 4)) * 4;
        lt4_t x = 0; /* zero bits are 0.0 in every storage format */
        if (r < valid)
            x = vload4(0, src + base + (long)r * rs + c);
        __local lt_t *d = dst + r * DP + c;
        d[0] = x.x;
        d[1] = x.y;
        d[2] = x.z;
        d[3] = x.w;
    }
}

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
__kernel __attribute__((reqd_work_group_size(RT * CT, 1, 1))) void
attn_fwd(const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,
         const __global io_t *v, ulong v_off, __global io_t *o, ulong o_off, __global float *lse,
         ulong lse_off, const __global int *cu_q, ulong cu_q_off, const __global int *cu_k,
         ulong cu_k_off, int tq_all, int tk_all, int hq, int group, long sq_b, long sq_h,
         long sq_t, long sk_b, long sk_h, long sk_t, long sv_b, long sv_h, long sv_t, long so_b,
         long so_h, long so_t, long sl_b, long sl_h, float scale, float softcap, int wl, int wr)
{
    __local lt_t qs[BLOCK_M * DP];
    __local lt_t kvs[BLOCK_N * DP]; /* K, then V, of the current tile */
    __local float ps[BLOCK_M * NP];
    __local float red[BLOCK_M * CT];

    const int lid = get_local_id(0), tx = lid % CT, ty = lid / CT;
    const int bh = get_group_id(1), b = bh / hq, h = bh - b * hq, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    /* Last query tiles first: under a causal mask they have the most keys (shorter tail). */
    const int m0 = (get_num_groups(0) - 1 - get_group_id(0)) * BLOCK_M;
    if (m0 >= sq.tq)
        return;

    const long qb = q_off + b * sq_b + h * sq_h + (sq.q0 + m0) * sq_t;
    const long kb = k_off + b * sk_b + hk * sk_h + sq.k0 * sk_t;
    const long vb = v_off + b * sv_b + hk * sv_h + sq.k0 * sv_t;
    attn_load_tile(qs, q, qb, sq_t, sq.tq - m0, BLOCK_M, lid, RT * CT);

    float acc[TM][DT], m[TM], l[TM];
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int e = 0; e < DT; ++e)
            acc[a][e] = 0.0f;
    }

    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    for (int n0 = n_lo; n0 < n_hi; n0 += BLOCK_N) {
        barrier(CLK_LOCAL_MEM_FENCE);
        attn_load_tile(kvs, k, kb + n0 * sk_t, sk_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TM][TN];
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c)
                s[a][c] = 0.0f;
        for (int d = 0; d < D; ++d) {
            float qa[TM], kc[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a)
                qa[a] = LREAD(qs, (ty + a * RT) * DP + d);
#pragma unroll
            for (int c = 0; c < TN; ++c)
                kc[c] = LREAD(kvs, (tx + c * CT) * DP + d);
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int c = 0; c < TN; ++c)
                    s[a][c] = fma(qa[a], kc[c], s[a][c]);
        }

        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
#pragma unroll
        for (int a = 0; a < TM; ++a) {
            float pm = -INFINITY;
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                float x = attn_logit(s[a][c], scale, softcap) * M_LOG2E_F;
                if (masked && !attn_visible(m0 + ty + a * RT, n0 + tx + c * CT, sq.tq, sq.tk, wl, wr))
                    x = -INFINITY;
                s[a][c] = x;
                pm = fmax(pm, x);
            }
            red[(ty + a * RT) * CT + tx] = pm;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int a = 0; a < TM; ++a) {
            const int r = ty + a * RT;
            float mn = m[a];
            for (int t = 0; t < CT; ++t)
                mn = fmax(mn, red[r * CT + t]);
            const float mu = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet: p = 0 */
            const float alpha = exp2(m[a] - mu);
            float ls = 0.0f;
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const float p = exp2(s[a][c] - mu);
                ls += p;
                ps[r * NP + tx + c * CT] = p;
            }
            l[a] = l[a] * alpha + ls;
            m[a] = mn;
#pragma unroll
            for (int e = 0; e < DT; ++e)
                acc[a][e] *= alpha;
        }
        attn_load_tile(kvs, v, vb + n0 * sv_t, sv_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int j = 0; j < BLOCK_N; ++j) {
            float pa[TM], vc[DT];
#pragma unroll
            for (int a = 0; a < TM; ++a)
                pa[a] = ps[(ty + a * RT) * NP + j];
#pragma unroll
            for (int e = 0; e < DT; ++e)
                vc[e] = LREAD(kvs, j * DP + tx + e * CT);
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int e = 0; e < DT; ++e)
                    acc[a][e] = fma(pa[a], vc[e], acc[a][e]);
        }
    }

    /* Each work-item summed its own columns; the row sum adds the CT partials in a fixed order. */
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int a = 0; a < TM; ++a)
        red[(ty + a * RT) * CT + tx] = l[a];
    barrier(CLK_LOCAL_MEM_FENCE);
    const long ob = o_off + b * so_b + h * so_h + (sq.q0 + m0) * so_t;
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
        for (int e = 0; e < DT; ++e)
            STORE(IO_DT, o, ob + r * so_t + tx + e * CT, acc[a][e] * inv);
        if (tx == 0)
            lse[lse_off + b * sl_b + h * sl_h + sq.q0 + m0 + r] =
                lr > 0.0f ? (m[a] + log2(lr)) * M_LN2_F : -INFINITY;
    }
}
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
    const long ob = o_off + b * so_b + h * so_h + (q0 + t) * so_t;
    const long db = do_off + b * sd_b + h * sd_h + (q0 + t) * sd_t;
    float4 sum = (float4)(0.0f);
    for (int c = 0; c < D; c += 4)
        sum = fma(LOAD4(IO_DT, o, ob + c), LOAD4(IO_DT, dout, db + c), sum);
    delta[delta_off + b * sl_b + h * sl_h + q0 + t] = (sum.x + sum.y) + (sum.z + sum.w);
}
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 3
__kernel __attribute__((reqd_work_group_size(RT * CT, 1, 1))) void
attn_bwd_dq(const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,
            const __global io_t *v, ulong v_off, const __global io_t *dout, ulong do_off,
            const __global float *lse, ulong lse_off, const __global float *delta,
            ulong delta_off, __global io_t *dq, ulong dq_off, const __global int *cu_q,
            ulong cu_q_off, const __global int *cu_k, ulong cu_k_off, int tq_all, int tk_all,
            int hq, int group, long sq_b, long sq_h, long sq_t, long sk_b, long sk_h, long sk_t,
            long sv_b, long sv_h, long sv_t, long sd_b, long sd_h, long sd_t, long sg_b,
            long sg_h, long sg_t, long sl_b, long sl_h, float scale, float softcap, int wl, int wr)
{
    __local lt_t qs[BLOCK_M * DP];
    __local lt_t dos[BLOCK_M * DP];
    __local lt_t ks[BLOCK_N * DP];
    __local lt_t vs[BLOCK_N * DP];
    __local float dss[BLOCK_M * NP];

    const int lid = get_local_id(0), tx = lid % CT, ty = lid / CT;
    const int bh = get_group_id(1), b = bh / hq, h = bh - b * hq, hk = h / group;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    /* Last query tiles first: under a causal mask they have the most keys (shorter tail). */
    const int m0 = (get_num_groups(0) - 1 - get_group_id(0)) * BLOCK_M;
    if (m0 >= sq.tq)
        return;

    attn_load_tile(qs, q, q_off + b * sq_b + h * sq_h + (sq.q0 + m0) * sq_t, sq_t, sq.tq - m0,
                   BLOCK_M, lid, RT * CT);
    attn_load_tile(dos, dout, do_off + b * sd_b + h * sd_h + (sq.q0 + m0) * sd_t, sd_t,
                   sq.tq - m0, BLOCK_M, lid, RT * CT);
    const long kb = k_off + b * sk_b + hk * sk_h + sq.k0 * sk_t;
    const long vb = v_off + b * sv_b + hk * sv_h + sq.k0 * sv_t;

    /* LSE in log2 units; a row that saw no key (-inf) gets +inf so that every p is 0. */
    float lse2[TM], dl[TM], acc[TM][DT];
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
        for (int e = 0; e < DT; ++e)
            acc[a][e] = 0.0f;
    }

    int n_lo, n_hi;
    attn_key_range(m0, BLOCK_M, sq.tq, sq.tk, wl, wr, &n_lo, &n_hi);
    for (int n0 = n_lo; n0 < n_hi; n0 += BLOCK_N) {
        barrier(CLK_LOCAL_MEM_FENCE);
        attn_load_tile(ks, k, kb + n0 * sk_t, sk_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        attn_load_tile(vs, v, vb + n0 * sv_t, sv_t, sq.tk - n0, BLOCK_N, lid, RT * CT);
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[TM][TN], dp[TM][TN];
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c)
                s[a][c] = dp[a][c] = 0.0f;
        for (int d = 0; d < D; ++d) {
            float qa[TM], ga[TM], kc[TN], vc[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                qa[a] = LREAD(qs, (ty + a * RT) * DP + d);
                ga[a] = LREAD(dos, (ty + a * RT) * DP + d);
            }
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                kc[c] = LREAD(ks, (tx + c * CT) * DP + d);
                vc[c] = LREAD(vs, (tx + c * CT) * DP + d);
            }
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int c = 0; c < TN; ++c) {
                    s[a][c] = fma(qa[a], kc[c], s[a][c]);
                    dp[a][c] = fma(ga[a], vc[c], dp[a][c]);
                }
        }

        const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
#pragma unroll
        for (int a = 0; a < TM; ++a)
            for (int c = 0; c < TN; ++c) {
                const float x = attn_logit(s[a][c], scale, softcap);
                float ds = exp2(x * M_LOG2E_F - lse2[a]) * (dp[a][c] - dl[a]) *
                           attn_dlogit(x, scale, softcap);
                if (masked && !attn_visible(m0 + ty + a * RT, n0 + tx + c * CT, sq.tq, sq.tk, wl, wr))
                    ds = 0.0f;
                dss[(ty + a * RT) * NP + tx + c * CT] = ds;
            }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int j = 0; j < BLOCK_N; ++j) {
            float sa[TM], kc[DT];
#pragma unroll
            for (int a = 0; a < TM; ++a)
                sa[a] = dss[(ty + a * RT) * NP + j];
#pragma unroll
            for (int e = 0; e < DT; ++e)
                kc[e] = LREAD(ks, j * DP + tx + e * CT);
#pragma unroll
            for (int a = 0; a < TM; ++a)
                for (int e = 0; e < DT; ++e)
                    acc[a][e] = fma(sa[a], kc[e], acc[a][e]);
        }
    }

    const long gb = dq_off + b * sg_b + h * sg_h + (sq.q0 + m0) * sg_t;
#pragma unroll
    for (int a = 0; a < TM; ++a) {
        const int r = ty + a * RT;
        if (m0 + r < sq.tq)
            for (int e = 0; e < DT; ++e)
                STORE(IO_DT, dq, gb + r * sg_t + tx + e * CT, acc[a][e]);
    }
}
#endif

#if !defined(ATTN_ONLY) || ATTN_ONLY == 4
__kernel __attribute__((reqd_work_group_size(RT_KV * CT_KV, 1, 1))) void
attn_bwd_dkdv(const __global io_t *q, ulong q_off, const __global io_t *k, ulong k_off,
              const __global io_t *v, ulong v_off, const __global io_t *dout, ulong do_off,
              const __global float *lse, ulong lse_off, const __global float *delta,
              ulong delta_off, __global io_t *dk, ulong dk_off, __global io_t *dv, ulong dv_off,
              const __global int *cu_q, ulong cu_q_off, const __global int *cu_k, ulong cu_k_off,
              int tq_all, int tk_all, int hkv, int group, long sq_b, long sq_h, long sq_t,
              long sk_b, long sk_h, long sk_t, long sv_b, long sv_h, long sv_t, long sd_b,
              long sd_h, long sd_t, long sgk_b, long sgk_h, long sgk_t, long sgv_b, long sgv_h,
              long sgv_t, long sl_b, long sl_h, float scale, float softcap, int wl, int wr)
{
    __local lt_t ks[BLOCK_N * DP];
    __local lt_t vs[BLOCK_N * DP];
    __local lt_t qs[BLOCK_M * DP];
    __local lt_t dos[BLOCK_M * DP];
    __local float pts[BLOCK_N * MP];  /* P^T of the current tile */
    __local float dsts[BLOCK_N * MP]; /* dS^T, gradient of the raw products */
    __local float lse2s[BLOCK_M], dls[BLOCK_M];

    const int lid = get_local_id(0), tx = lid % CT_KV, ty = lid / CT_KV;
    const int nthreads = RT_KV * CT_KV;
    const int bh = get_group_id(1), b = bh / hkv, hk = bh - b * hkv;
    const attn_seq sq = attn_seq_of(b, tq_all, tk_all, cu_q + cu_q_off, cu_k + cu_k_off);
    const int n0 = get_group_id(0) * BLOCK_N;
    if (n0 >= sq.tk)
        return;

    attn_load_tile(ks, k, k_off + b * sk_b + hk * sk_h + (sq.k0 + n0) * sk_t, sk_t, sq.tk - n0,
                   BLOCK_N, lid, nthreads);
    attn_load_tile(vs, v, v_off + b * sv_b + hk * sv_h + (sq.k0 + n0) * sv_t, sv_t, sq.tk - n0,
                   BLOCK_N, lid, nthreads);

    float gk[TN][DT_KV], gv[TN][DT_KV];
#pragma unroll
    for (int r = 0; r < TN; ++r)
        for (int e = 0; e < DT_KV; ++e)
            gk[r][e] = gv[r][e] = 0.0f;

    int m_lo, m_hi;
    attn_query_range(n0, BLOCK_N, sq.tq, sq.tk, wl, wr, &m_lo, &m_hi);
    for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        const long qb = q_off + b * sq_b + h * sq_h + sq.q0 * sq_t;
        const long db = do_off + b * sd_b + h * sd_h + sq.q0 * sd_t;
        const long lb = b * sl_b + h * sl_h + sq.q0;
        for (int m0 = m_lo; m0 < m_hi; m0 += BLOCK_M) {
            barrier(CLK_LOCAL_MEM_FENCE);
            attn_load_tile(qs, q, qb + m0 * sq_t, sq_t, sq.tq - m0, BLOCK_M, lid, nthreads);
            attn_load_tile(dos, dout, db + m0 * sd_t, sd_t, sq.tq - m0, BLOCK_M, lid, nthreads);
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
            for (int d = 0; d < D; ++d) {
                float kr[TN], vr[TN], qc[TM], gc[TM];
#pragma unroll
                for (int r = 0; r < TN; ++r) {
                    kr[r] = LREAD(ks, (ty + r * RT_KV) * DP + d);
                    vr[r] = LREAD(vs, (ty + r * RT_KV) * DP + d);
                }
#pragma unroll
                for (int c = 0; c < TM; ++c) {
                    qc[c] = LREAD(qs, (tx + c * CT_KV) * DP + d);
                    gc[c] = LREAD(dos, (tx + c * CT_KV) * DP + d);
                }
#pragma unroll
                for (int r = 0; r < TN; ++r)
                    for (int c = 0; c < TM; ++c) {
                        s[r][c] = fma(kr[r], qc[c], s[r][c]);
                        dp[r][c] = fma(vr[r], gc[c], dp[r][c]);
                    }
            }

            const bool masked = attn_tile_masked(m0, BLOCK_M, n0, BLOCK_N, sq.tq, sq.tk, wl, wr);
#pragma unroll
            for (int r = 0; r < TN; ++r)
                for (int c = 0; c < TM; ++c) {
                    const int j = ty + r * RT_KV, i = tx + c * CT_KV;
                    const float x = attn_logit(s[r][c], scale, softcap);
                    float p = exp2(x * M_LOG2E_F - lse2s[i]);
                    if (masked && !attn_visible(m0 + i, n0 + j, sq.tq, sq.tk, wl, wr))
                        p = 0.0f;
                    pts[j * MP + i] = p;
                    dsts[j * MP + i] = p * (dp[r][c] - dls[i]) * attn_dlogit(x, scale, softcap);
                }
            barrier(CLK_LOCAL_MEM_FENCE);

            for (int i = 0; i < BLOCK_M; ++i) {
                float pr[TN], sr[TN], gc[DT_KV], qc[DT_KV];
#pragma unroll
                for (int r = 0; r < TN; ++r) {
                    pr[r] = pts[(ty + r * RT_KV) * MP + i];
                    sr[r] = dsts[(ty + r * RT_KV) * MP + i];
                }
#pragma unroll
                for (int e = 0; e < DT_KV; ++e) {
                    gc[e] = LREAD(dos, i * DP + tx + e * CT_KV);
                    qc[e] = LREAD(qs, i * DP + tx + e * CT_KV);
                }
#pragma unroll
                for (int r = 0; r < TN; ++r)
                    for (int e = 0; e < DT_KV; ++e) {
                        gv[r][e] = fma(pr[r], gc[e], gv[r][e]);
                        gk[r][e] = fma(sr[r], qc[e], gk[r][e]);
                    }
            }
        }
    }

    const long kgb = dk_off + b * sgk_b + hk * sgk_h + (sq.k0 + n0) * sgk_t;
    const long vgb = dv_off + b * sgv_b + hk * sgv_h + (sq.k0 + n0) * sgv_t;
#pragma unroll
    for (int r = 0; r < TN; ++r) {
        const int j = ty + r * RT_KV;
        if (n0 + j < sq.tk)
            for (int e = 0; e < DT_KV; ++e) {
                STORE(IO_DT, dk, kgb + j * sgk_t + tx + e * CT_KV, gk[r][e]);
                STORE(IO_DT, dv, vgb + j * sgv_t + tx + e * CT_KV, gv[r][e]);
            }
    }
}
#endif
