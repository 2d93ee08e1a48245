/*
 * cross_entropy.cl: the cross-entropy family. Softmax cross-entropy over a vocabulary of V classes
 * with ignore_index, label smoothing, z-loss, logit softcap and per-class weights (the formulas are
 * in include/llmcl.h), in three forms that share the row formulas below:
 *   ce_prepare            labels -> stats: first bad label, non-ignored count and weight sum
 *   ce_rows               materialised logits, one work-group per row: online LSE, then dlogits
 *   ce_partial/ce_combine/ce_grad   the same with the vocabulary split over several work-groups
 *   ce_fold               merges a vocabulary chunk's partials from the tensor-core logits product
 *                         (matmul.cl's MM_CE epilogues do this family's row math on tensor cores:
 *                         the LSE partials in the forward, the dlogits in the backward)
 *   ce_finish             per-row terms -> loss (mean/sum reduced in a fixed order, or per row)
 *   ce_colsum, ce_scale   helpers of the chunked linear path and of backward scaling
 *   cce_fwd, cce_coefs, cce_bwd_dh, cce_bwd_dw   the fully fused path: hidden x W^T tiles in local
 *                         memory, never stored; dhidden and dW recomputed, deterministic
 *
 * Stats buffer (int[4]): [0] first row whose label is out of range (-1: none), [1] non-ignored
 * count, [2] as_int(sum of the weights of non-ignored targets), [3] as_int(sum of all class
 * weights). Every kernel after ce_prepare returns at once when [0] >= 0, so a bad label writes
 * nothing (in-place logits stay intact).
 *
 * Per-row terms for a non-ignored row with label y, x_j the (soft-capped) logits, w_j the class
 * weights (1 without), S_w = sum_j w_j, eps the smoothing, zs the z-loss scale:
 *   ce = (1-eps) w_y (lse - x_y) + eps/V (S_w lse - sum_j w_j x_j),   z = zs lse^2
 *   d(c ce + cz z)/dx_j = A p_j - B [j == y] - C w_j,
 *   A = c((1-eps) w_y + eps S_w / V) + 2 zs lse cz,  B = c (1-eps) w_y,  C = c eps / V
 * times 1 - (x_j/cap)^2 with a softcap. c, cz: 1/(weight sum), 1/count for mean (0 when that
 * divisor is 0), 1 for sum and none, times the upstream gradient where one is given and the
 * options' grad_scale (gs) in the gradients.
 *
 * -inf logits (include/llmcl.h has the results): the online LSE starts its running max at -FLT_MAX,
 * not -inf, so that a -inf logit adds exp(-inf) = 0 wherever it comes, never exp(-inf + inf); a row
 * of -inf logits then ends with sum 0 and lse = -FLT_MAX + log 0 = -inf. Such a row has p = 0
 * (lse_p) and A = B = C = 0. In the terms and the reduction a factor of 0 (eps 0 or 1, a weight of
 * 0, zs 0, a divisor of 0) zeroes its term even when the other factor is infinite.
 *
 * Options that change the math are runtime flags (so one program serves them all; the branches are
 * uniform): CE_WEIGHT per-class weights (f32 [V]), CE_SMOOTH label smoothing, CE_CAP softcap,
 * CE_BIAS the fused path's bias [V].
 *
 * Tunables (all kernels build standalone with the defaults):
 *   DT         storage of logits / hidden / W: F32, BF16, F16 (default F32)
 *   DX_DT      storage of the dlogits the row kernels write (default DT): the linear forms write
 *              16-bit dlogits of f32 logits straight into the products' operand
 *   LABEL_DT   I32 or I64 (default I64)
 *   WG         work-group size of the row kernels: a power of two in [32, max work-group size]
 *              (default 256; ce_prepare and ce_finish use it too)
 *   UNROLL     8-element chunks loaded per loop trip in the row kernels: 1, 2, 4 (default 2)
 *   T          fused path tile edge (rows and vocab): 16, 32, 64, 128 (default 32)
 *   BK         fused path k-slice held in local memory: 8, 16, 32 (default 16)
 *   TM, TN     fused path register tile per work-item: 1, 2, 4, 8 (default 4, 4); T % TM == 0,
 *              T % TN == 0, BK <= T, T <= (T/TM)(T/TN) = the work-group size
 *              <= max work-group size; local memory of cce_bwd_* 4 (T*T + 2*BK*(T+4))
 *              bytes and of cce_fwd 4 (2*BK*(T+4) + 3*T*T/TN) bytes <= the device's.
 *
 * Tuning keys (src/runtime/ops/cross_entropy.c): "ce_rows" (WG, UNROLL; shape class from V; every
 * ce_* kernel and cce_coefs build with them), "ce_split" (SPLIT, host side: work-groups per row,
 * class from the row count), "cce_fwd", "cce_bwd_dh", "cce_bwd_dw" (T, BK, TM, TN; classes from V,
 * N and V) and "cce_split" (SPLIT, host side: vocabulary splits of cce_fwd, class from N / T).
 */

#ifndef DT
#define DT F32
#endif
#ifndef DX_DT
#define DX_DT DT
#endif
#ifndef LABEL_DT
#define LABEL_DT I64
#endif
#ifndef WG
#define WG 256
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#ifndef T
#define T 32
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif

#define NTX (T / TN)
#define NTY (T / TM)
#define TWG (NTX * NTY)
/* Row pitch of the k-slices in local memory: 4 floats of padding spread the transposed stores of
   cce_tile over the banks and keep rows 16-byte aligned. */
#define LDT (T + 4)
/* A work-item's rows and columns within a tile: contiguous runs, so local loads can be vectors. */
#define RI(i) (ty * TM + (i))
#define CJ(j) (tx * TN + (j))

#define LOCAL_ALIGNED __attribute__((aligned(16)))

typedef STORAGE(DT) st_t;
typedef STORAGE(DX_DT) dx_t;
typedef STORAGE(LABEL_DT) label_t;

#define LABEL(p, i) LOAD(LABEL_DT, p, i)

#define LOAD8(p, i) LLMCL_CAT(load8_, DT)((p), (i))
#define STORE8DX(p, i, v) LLMCL_CAT(store8_, DX_DT)((p), (i), (v))

/* 1.0 in lane d of eight, 0 elsewhere. */
inline float8 lane_onehot(int d)
{
    return convert_float8(-((int8)(0, 1, 2, 3, 4, 5, 6, 7) == (int8)d));
}

#define WEIGHT1(j) ((flags & CE_WEIGHT) ? weight[woff + (j)] : 1.0f)
#define WEIGHT8(j) ((flags & CE_WEIGHT) ? vload8(0, weight + woff + (j)) : (float8)1.0f)

/* ---- shared row formulas ---- */

/* c and cz (see the header) from the stats and the reduction (0 mean, 1 sum, 2 none). */
inline float2 ce_scales(const __global int *stats, int reduction)
{
    if (reduction != 0)
        return (float2)(1.0f, 1.0f);
    const float dw = as_float(stats[2]), dn = (float)stats[1];
    return (float2)(dw != 0.0f ? 1.0f / dw : 0.0f, dn != 0.0f ? 1.0f / dn : 0.0f);
}

/* (A, B, C) of a non-ignored row; 0 when its logits are all -inf (its gradient is 0). */
inline float3 ce_coefs(float lse, float wy, float sw, long V, float eps, float zs, float2 c)
{
    if (lse == -INFINITY)
        return (float3)(0.0f);
    const float e = eps / (float)V;
    return (float3)(c.x * ((1.0f - eps) * wy + e * sw) + 2.0f * zs * lse * c.y,
                    c.x * (1.0f - eps) * wy, c.x * e);
}

/*
 * (ce, z) of a non-ignored row; ws = sum_j w_j x_j (used only with smoothing). A row of -inf logits
 * has lse - x_j = +inf: its p_j are 0 like those of any -inf logit.
 */
inline float2 ce_terms(float lse, float xy, float ws, float wy, float sw, long V, float eps,
                       float zs)
{
    const bool all_ninf = lse == -INFINITY;
    const float ty = all_ninf ? INFINITY : lse - xy, ts = all_ninf ? INFINITY : sw * lse - ws;
    return (float2)(mul0((1.0f - eps) * wy, ty) + mul0(eps / (float)V, ts), mul0(zs, lse * lse));
}

/* The lse of p_j = exp(x_j - lse): +inf on a row of -inf logits, so that p is 0, not exp(NaN). */
inline float lse_p(float lse)
{
    return lse == -INFINITY ? INFINITY : lse;
}

/* Online logsumexp state of one work-item: running max m (from -FLT_MAX), sum of exp(x - m), and
   sum w_j x_j (a class of weight 0 adds 0 even where its logit is -inf). */
#define ACC1(xv, wv)                                                                              \
    do {                                                                                          \
        const float x_ = (xv);                                                                    \
        if (x_ > m) {                                                                             \
            s *= exp(m - x_);                                                                     \
            m = x_;                                                                               \
        }                                                                                         \
        s += exp(x_ - m);                                                                         \
        if (flags & CE_SMOOTH)                                                                     \
            ws += mul0(wv, x_);                                                                   \
    } while (0)

#define ACC8(xv, wv)                                                                              \
    do {                                                                                          \
        const float8 x_ = (xv);                                                                   \
        const float mc_ = hmax8(x_);                                                              \
        if (mc_ > m) {                                                                            \
            s *= exp(m - mc_);                                                                    \
            m = mc_;                                                                              \
        }                                                                                         \
        s += hsum8(exp(x_ - m));                                                                  \
        if (flags & CE_SMOOTH)                                                                     \
            ws += hsum8(select((float8)0.0f, (wv) * x_, (wv) != 0.0f));                           \
    } while (0)

/*
 * A row of V elements starting at element `base` splits into a scalar head up to 8-element
 * alignment, nk aligned chunks of 8 and a scalar tail (< 8). Split `sp` of `ns` owns chunks
 * [k0, k1); split 0 also owns the head and split ns-1 the tail.
 */
typedef struct ce_span {
    long h, nk, k0, k1;
} ce_span;

inline ce_span ce_span_of(long base, long V, long sp, long ns)
{
    ce_span r;
    r.h = min((8 - (base & 7)) & 7, V);
    r.nk = (V - r.h) >> 3;
    const long per = (r.nk + ns - 1) / ns;
    r.k0 = min(sp * per, r.nk);
    r.k1 = min(r.k0 + per, r.nk);
    return r;
}

/* Accumulates this work-item's share of split sp of a row into m, s, ws. */
#define SCAN_ROW(x, base, V, sp, ns)                                                              \
    do {                                                                                          \
        const ce_span sn_ = ce_span_of((base), (V), (sp), (ns));                                  \
        const long lid_ = get_local_id(0);                                                        \
        if ((sp) == 0 && lid_ < sn_.h)                                                            \
            ACC1(CAP(LOAD(DT, x, (base) + lid_)), WEIGHT1(lid_));                                 \
        if ((sp) == (ns) - 1 && lid_ < 8) {                                                       \
            const long j_ = sn_.h + 8 * sn_.nk + lid_;                                            \
            if (j_ < (V))                                                                         \
                ACC1(CAP(LOAD(DT, x, (base) + j_)), WEIGHT1(j_));                                 \
        }                                                                                         \
        for (long k_ = sn_.k0 + lid_; k_ < sn_.k1; k_ += (long)WG * UNROLL) {                     \
            float8 v_[UNROLL];                                                                    \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long kk_ = k_ + (long)u_ * WG;                                              \
                if (kk_ < sn_.k1)                                                                 \
                    v_[u_] = LOAD8(x, (base) + sn_.h + 8 * kk_);                                  \
            }                                                                                     \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long kk_ = k_ + (long)u_ * WG;                                              \
                if (kk_ < sn_.k1)                                                                 \
                    ACC8(CAP(v_[u_]), WEIGHT8(sn_.h + 8 * kk_));                                  \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* dlogits of one element j of a row (coefficients q, label y). */
#define GRAD1(x, base, dx, dbase, j, q, lse, y)                                                   \
    STORE(DX_DT, dx, (dbase) + (j),                                                               \
          ce_dlogit(flags, cap, CAP(LOAD(DT, x, (base) + (j))), q, lse, WEIGHT1(j), (j) == (y)))

/* Writes dlogits for this work-item's share of split sp of a row (coefficients q, label y). */
#define GRAD_ROW(x, base, dx, dbase, V, sp, ns, q, lse, y)                                        \
    do {                                                                                          \
        const ce_span sn_ = ce_span_of((base), (V), (sp), (ns));                                  \
        const long lid_ = get_local_id(0);                                                        \
        if ((sp) == 0 && lid_ < sn_.h)                                                            \
            GRAD1(x, base, dx, dbase, lid_, q, lse, y);                                           \
        const long t_ = sn_.h + 8 * sn_.nk + lid_;                                                \
        if ((sp) == (ns) - 1 && lid_ < 8 && t_ < (V))                                             \
            GRAD1(x, base, dx, dbase, t_, q, lse, y);                                             \
        /* UNROLL chunks loaded before any is stored: a work-item's chunks are distinct, so this  \
           is safe in place and keeps more loads in flight. Last block first: the scan just read \
           the row front to back, so its tail is what the L2 cache still holds. */                \
        const long step_ = (long)WG * UNROLL;                                                     \
        for (long b_ = (sn_.k1 - sn_.k0 + step_ - 1) / step_ - 1; b_ >= 0; --b_) {                \
            const long k_ = sn_.k0 + b_ * step_ + lid_;                                           \
            float8 v_[UNROLL];                                                                    \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long kk_ = k_ + (long)u_ * WG;                                              \
                if (kk_ < sn_.k1)                                                                 \
                    v_[u_] = LOAD8(x, (base) + sn_.h + 8 * kk_);                                  \
            }                                                                                     \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long kk_ = k_ + (long)u_ * WG, j_ = sn_.h + 8 * kk_;                        \
                if (kk_ >= sn_.k1)                                                                \
                    break;                                                                        \
                const float8 xc_ = CAP(v_[u_]);                                                   \
                float8 g_ = (q).x * exp(xc_ - (lse)) - (q).z * WEIGHT8(j_);                       \
                const long d_ = (y) - j_;                                                         \
                if ((ulong)d_ < 8)                                                                \
                    g_ -= (q).y * lane_onehot((int)d_);                                           \
                STORE8DX(dx, (dbase) + j_, g_ * CAP_DERIV(xc_));                                  \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* ---- integer work-group reductions for ce_prepare ---- */

LLMCL_WG_REDUCE_T(wg_min_long, long, min, )
LLMCL_WG_REDUCE_T(wg_sum_long, long, LLMCL_ADD, )

/* One work-group of WG (a power of two): validates labels, counts and sums weights. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
ce_prepare(int flags, const __global label_t *labels, ulong loff, long n, long V, long ignore_index,
           const __global float *weight, ulong woff, __global int *stats)
{
    __local long lscratch[WG];
    __local float fscratch[WG];
    const int lid = get_local_id(0);
    long bad = LONG_MAX, count = 0;
    float wsum = 0.0f, wall = 0.0f;
    for (long i = lid; i < n; i += WG) {
        const long y = LABEL(labels, loff + i);
        if (y == ignore_index)
            continue;
        /* one unsigned compare: rusticl's llvmpipe (LLVM 15) folds y < 0 || y >= V wrongly when
           y is a sign-extended int */
        if ((ulong)y >= (ulong)V) {
            bad = min(bad, i);
            continue;
        }
        ++count;
        wsum += WEIGHT1(y);
    }
    if (flags & CE_WEIGHT)
        for (long j = lid; j < V; j += WG)
            wall += weight[woff + j];
    bad = wg_min_long(bad, lscratch);
    count = wg_sum_long(count, lscratch);
    wsum = wg_sum(wsum, fscratch);
    wall = wg_sum(wall, fscratch);
    if (lid == 0) {
        stats[0] = bad == LONG_MAX ? -1 : (int)bad;
        stats[1] = (int)count;
        stats[2] = as_int((flags & CE_WEIGHT) ? wsum : (float)count);
        stats[3] = as_int((flags & CE_WEIGHT) ? wall : (float)V);
    }
}

/*
 * One work-group per row of logits x (row r of this launch is global row row0 + r for labels, lse
 * and the per-row terms rows[row] = ce, rows[n_total + row] = z). With grad set the same work-group
 * then writes dlogits into dx, which may be x itself: every element is read by the work-item that
 * overwrites it, and the target logit before any write.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
ce_rows(int flags, __global st_t *x, ulong xoff, long xstride, long V,
        const __global label_t *labels, ulong loff, long row0, const __global float *weight,
        ulong woff, const __global int *stats, int reduction, float gs, long ignore_index,
        float eps, float zs, float cap, __global float *lse_out, ulong lseoff, __global float *rows,
        long n_total, int grad, __global dx_t *dx, ulong dxoff, long dxstride)
{
    __local float scratch[WG];
    if (stats[0] >= 0)
        return;
    const long r = get_group_id(0), row = row0 + r;
    const long base = xoff + r * xstride;
    const long y = LABEL(labels, loff + row);
    const bool live = y != ignore_index;
    const float xy = live ? CAP(LOAD(DT, x, base + y)) : 0.0f;

    float m = -FLT_MAX, s = 0.0f, ws = 0.0f;
    SCAN_ROW(x, base, V, 0, 1);
    const float mx = wg_max(m, scratch);
    const float sum = wg_sum(s * exp(m - mx), scratch);
    ws = wg_sum(ws, scratch);
    const float lse = mx + log(sum);
    const float wy = live ? WEIGHT1(y) : 0.0f, sw = as_float(stats[3]);
    if (get_local_id(0) == 0) {
        const float2 t = live ? ce_terms(lse, xy, ws, wy, sw, V, eps, zs) : (float2)(0.0f);
        lse_out[lseoff + row] = lse;
        rows[row] = t.x;
        rows[n_total + row] = t.y;
    }
    if (grad) {
        const float3 q = live ? ce_coefs(lse, wy, sw, V, eps, zs, gs * ce_scales(stats, reduction))
                              : (float3)(0.0f);
        const float lp = lse_p(lse);
        GRAD_ROW(x, base, dx, dxoff + r * dxstride, V, 0, 1, q, lp, y);
    }
}

/*
 * Split vocabulary, pass 1: work-group (split, r) writes part[(r nslots + slot0 + split) 3 +
 * {m, s, ws}] (slot0 > 0: the fused path's later vocabulary chunks).
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
ce_partial(int flags, const __global st_t *x, ulong xoff, long xstride, long V,
           const __global float *weight, ulong woff, const __global int *stats, float cap,
           __global float *part, long slot0, long nslots)
{
    __local float scratch[WG];
    if (stats[0] >= 0)
        return;
    const long sp = get_group_id(0), ns = get_num_groups(0), r = get_group_id(1);
    const long base = xoff + r * xstride;
    float m = -FLT_MAX, s = 0.0f, ws = 0.0f;
    SCAN_ROW(x, base, V, sp, ns);
    const float mx = wg_max(m, scratch);
    const float sum = wg_sum(s * exp(m - mx), scratch);
    ws = wg_sum(ws, scratch);
    if (get_local_id(0) == 0) {
        __global float *p = part + (r * nslots + slot0 + sp) * 3;
        p[0] = mx;
        p[1] = sum;
        p[2] = ws;
    }
}

/* ns online-LSE partials (max, sum, sum w x) at p, three floats each, merged in order. */
inline float3 ce_merge(const __global float *p, long ns)
{
    float mx = -INFINITY;
    for (long i = 0; i < ns; ++i)
        mx = fmax(mx, p[i * 3]);
    float sum = 0.0f, ws = 0.0f;
    for (long i = 0; i < ns; ++i) {
        sum += p[i * 3 + 1] * exp(p[i * 3] - mx);
        ws += p[i * 3 + 2];
    }
    return (float3)(mx, sum, ws);
}

/*
 * The tensor-core forward's chunks: row r's ns partials of one vocabulary chunk (from the logits
 * product's epilogue) merged into slot `slot` of the row's nslots in part, for ce_combine.
 */
__kernel void ce_fold(const __global float *chunk, long ns, long nrows, const __global int *stats,
                      __global float *part, long slot, long nslots)
{
    const long r = get_global_id(0);
    if (r >= nrows || stats[0] >= 0)
        return;
    const float3 t = ce_merge(chunk + r * ns * 3, ns);
    vstore3(t, 0, part + (r * nslots + slot) * 3);
}

/*
 * Split vocabulary, pass 2: one work-item per row combines its ns partials into the LSE and the
 * per-row terms. The target logit comes from x (materialised logits) or, with xy_buf, from xyb
 * indexed by the global row (the fused path, where it is already capped and biased).
 */
__kernel void ce_combine(int flags, const __global float *part, long ns, long nrows,
                         const __global st_t *x, ulong xoff, long xstride, int xy_buf,
                         const __global float *xyb, const __global label_t *labels, ulong loff,
                         long row0, const __global float *weight, ulong woff,
                         const __global int *stats, long V, long ignore_index, float eps, float zs,
                         float cap, __global float *lse_out, ulong lseoff, __global float *rows,
                         long n_total)
{
    const long r = get_global_id(0);
    if (r >= nrows || stats[0] >= 0)
        return;
    const long row = row0 + r;
    const float3 merged = ce_merge(part + r * ns * 3, ns);
    const float lse = merged.x + log(merged.y), ws = merged.z;
    const long y = LABEL(labels, loff + row);
    float2 t = (float2)(0.0f);
    if (y != ignore_index) {
        const float xy = xy_buf ? xyb[row] : CAP(LOAD(DT, x, xoff + r * xstride + y));
        t = ce_terms(lse, xy, ws, WEIGHT1(y), as_float(stats[3]), V, eps, zs);
    }
    lse_out[lseoff + row] = lse;
    rows[row] = t.x;
    rows[n_total + row] = t.y;
}

/* Split vocabulary, pass 3: work-group (split, r) writes dlogits of its share of row r. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
ce_grad(int flags, const __global st_t *x, ulong xoff, long xstride, long V,
        const __global label_t *labels, ulong loff, long row0, const __global float *weight,
        ulong woff, const __global int *stats, int reduction, float gs, long ignore_index,
        float eps, float zs, float cap, const __global float *lse_in, ulong lseoff,
        __global dx_t *dx, ulong dxoff, long dxstride)
{
    if (stats[0] >= 0)
        return;
    const long sp = get_group_id(0), ns = get_num_groups(0), r = get_group_id(1);
    const long row = row0 + r;
    const long y = LABEL(labels, loff + row);
    const float lse = lse_in[lseoff + row];
    const float3 q = y != ignore_index ? ce_coefs(lse, WEIGHT1(y), as_float(stats[3]), V, eps, zs,
                                                  gs * ce_scales(stats, reduction))
                                       : (float3)(0.0f);
    const float lp = lse_p(lse);
    GRAD_ROW(x, xoff + r * xstride, dx, dxoff + r * dxstride, V, sp, ns, q, lp, y);
}

/*
 * One work-group of WG (a power of two): the loss from the per-row terms. reduction 0 (mean) and 1
 * (sum) write loss[0] and zloss[0]; 2 (none) writes loss[i] = ce_i + z_i and zloss[i] = z_i.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
ce_finish(const __global float *rows, long n, const __global int *stats, int reduction,
          __global float *loss, ulong lossoff, __global float *zloss, ulong zoff, int has_z)
{
    __local float scratch[WG];
    if (stats[0] >= 0)
        return;
    const int lid = get_local_id(0);
    if (reduction == 2) {
        for (long i = lid; i < n; i += WG) {
            loss[lossoff + i] = rows[i] + rows[n + i];
            if (has_z)
                zloss[zoff + i] = rows[n + i];
        }
        return;
    }
    float ce = 0.0f, z = 0.0f;
    for (long i = lid; i < n; i += WG) {
        ce += rows[i];
        z += rows[n + i];
    }
    ce = wg_sum(ce, scratch);
    z = wg_sum(z, scratch);
    if (lid == 0) {
        const float2 c = ce_scales(stats, reduction);
        loss[lossoff] = mul0(c.x, ce) + z * c.y;
        if (has_z)
            zloss[zoff] = z * c.y;
    }
}

/* ---- helpers of the chunked linear path ---- */

/*
 * acc[j] (+)= sum_r g[r, j] over a [rows, V] block of dlogits, rows in order: deterministic.
 * Blocks of rows summed by launches one after the other, each accumulating, give the same bits.
 */
__kernel void ce_colsum(const __global dx_t *g, ulong goff, long nrows, long V,
                        __global float *acc, ulong aoff, int accumulate)
{
    const long j = get_global_id(0);
    if (j >= V)
        return;
    float s = accumulate ? acc[aoff + j] : 0.0f;
    for (long r = 0; r < nrows; ++r)
        s += LOAD(DX_DT, g, goff + r * V + j);
    acc[aoff + j] = s;
}

/* y[i] *= g[0] for n contiguous elements (the backward-scaling helper). */
__kernel void ce_scale(__global st_t *y, ulong yoff, long n, const __global float *g, ulong goff)
{
    const long i = get_global_id(0);
    if (i < n)
        STORE(DT, y, yoff + i, LOAD(DT, y, yoff + i) * g[goff]);
}

/* ---- fused path in vocabulary chunks (logits of one chunk at a time, from llmcl_matmul) ---- */

/* The capped target logit of each row whose label falls in the chunk x [nrows, vc] of classes
   from v0 (x biased), into xyb[row]. */
__kernel void ce_pick(int flags, const __global st_t *x, ulong xoff, long xstride, long v0,
                      long vc, const __global label_t *labels, ulong loff, long nrows,
                      long ignore_index, const __global int *stats, float cap,
                      __global float *xyb)
{
    const long r = get_global_id(0);
    if (r >= nrows || stats[0] >= 0)
        return;
    const long y = LABEL(labels, loff + r);
    if (y != ignore_index && (ulong)(y - v0) < (ulong)vc) /* one compare, as in ce_prepare */
        xyb[r] = CAP(LOAD(DT, x, xoff + r * xstride + y - v0));
}

/*
 * dlogits of the chunk x [nrows, vc] of classes from v0 into dx (x itself, in place, or a buffer
 * of DX_DT with x's layout), from cce_coefs' per-row coefficients (upstream gradient folded in);
 * work-group (split, r). woff already points at the chunk's first class weight.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
cce_chunk_grad(int flags, __global st_t *x, ulong xoff, long xstride, long v0, long vc,
               const __global label_t *labels, ulong loff, const __global float *weight,
               ulong woff, const __global int *stats, float cap, const __global float *coef,
               __global dx_t *dx)
{
    if (stats[0] >= 0)
        return;
    const long sp = get_group_id(0), ns = get_num_groups(0), r = get_group_id(1);
    const float4 c = vload4(r, coef);
    const long y = LABEL(labels, loff + r) - v0;
    GRAD_ROW(x, xoff + r * xstride, dx, xoff + r * xstride, vc, sp, ns, c.xyz, c.w, y);
}

/* ---- fully fused path: logits tiles of hidden [N, H] x W [V, H]^T in local memory ---- */

/*
 * acc[i][j] += sum over kk < BK of a[kk * lda + RI(i)] * b[kk * ldb + CJ(j)]: one BK-deep slice of a
 * tile product from local memory, both operands stored k-major.
 */
inline void cce_slice_fma(float acc[TM][TN], const __local float *a, int lda,
                          const __local float *b, int ldb)
{
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    for (int kk = 0; kk < BK; ++kk) {
        float x[TM], y[TN];
        LDS_RUN(x, TM, a + kk * lda + RI(0));
        LDS_RUN(y, TN, b + kk * ldb + CJ(0));
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j)
                acc[i][j] = fma(x[i], y[j], acc[i][j]);
    }
}

inline void cce_zero(float acc[TM][TN])
{
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;
}

/*
 * acc[i][j] = sum_k hid[r0 + ty + i NTY, k] w[v0 + tx + j NTX, k] for this work-item's TM x TN
 * sub-tile of the T x T tile; rows past N and columns past V read zeros.
 */
inline void cce_tile(const __global st_t *hid, ulong hoff, long hs, long N, long H,
                     const __global st_t *w, ulong wo, long wst, long V, long r0, long v0,
                     __local float *As, __local float *Bs, float acc[TM][TN])
{
    const int lid = get_local_id(0);
    cce_zero(acc);
    for (long k0 = 0; k0 < H; k0 += BK) {
        for (int e = lid; e < T * BK; e += TWG) {
            const int mm = e / BK, kk = e % BK;
            const long k = k0 + kk;
            As[kk * LDT + mm] =
                (r0 + mm < N && k < H) ? LOAD(DT, hid, hoff + (r0 + mm) * hs + k) : 0.0f;
            Bs[kk * LDT + mm] =
                (v0 + mm < V && k < H) ? LOAD(DT, w, wo + (v0 + mm) * wst + k) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        cce_slice_fma(acc, As, LDT, Bs, LDT);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

#define BIAS(v) ((flags & CE_BIAS) ? LOAD(DT, bias, boff + (v)) : 0.0f)

/*
 * Forward: work-group (split, row tile) scans its share of the vocabulary tiles with an online LSE
 * per row and writes part[(row * ns + split) * 3 + {m, s, ws}]; the work-group that owns a row's
 * target column writes its (biased, capped) logit to xyb[row].
 */
__kernel __attribute__((reqd_work_group_size(TWG, 1, 1))) void
cce_fwd(int flags, const __global st_t *hid, ulong hoff, long hs, long N, long H,
        const __global st_t *w, ulong wo, long wst, long V, const __global st_t *bias, ulong boff,
        const __global label_t *labels, ulong loff, const __global float *weight, ulong woff,
        const __global int *stats, long ignore_index, float cap, __global float *part,
        __global float *xyb)
{
    __local float As[BK * LDT] LOCAL_ALIGNED, Bs[BK * LDT] LOCAL_ALIGNED;
    __local float red[3 * T * NTX];
    if (stats[0] >= 0)
        return;
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    const long sp = get_group_id(0), ns = get_num_groups(0), r0 = get_group_id(1) * (long)T;
    const long nvt = (V + T - 1) / T, per = (nvt + ns - 1) / ns;
    const long t0 = min(sp * per, nvt), t1 = min(t0 + per, nvt);
    long y[TM];
    float m[TM], s[TM], ws[TM];
    for (int i = 0; i < TM; ++i) {
        const long row = r0 + RI(i);
        y[i] = row < N ? LABEL(labels, loff + row) : -1;
        if (y[i] == ignore_index)
            y[i] = -1;
        m[i] = -FLT_MAX;
        s[i] = 0.0f;
        ws[i] = 0.0f;
    }
    for (long vt = t0; vt < t1; ++vt) {
        const long v0 = vt * T;
        float acc[TM][TN];
        cce_tile(hid, hoff, hs, N, H, w, wo, wst, V, r0, v0, As, Bs, acc);
        for (int i = 0; i < TM; ++i) {
            float mt = -INFINITY;
            for (int j = 0; j < TN; ++j) {
                const long v = v0 + CJ(j);
                acc[i][j] = v < V ? CAP(acc[i][j] + BIAS(v)) : -INFINITY;
                mt = fmax(mt, acc[i][j]);
                if (v == y[i])
                    xyb[r0 + RI(i)] = acc[i][j];
            }
            if (mt > m[i]) {
                s[i] *= exp(m[i] - mt);
                m[i] = mt;
            }
            for (int j = 0; j < TN; ++j) {
                const long v = v0 + CJ(j);
                if (v < V) {
                    s[i] += exp(acc[i][j] - m[i]);
                    if (flags & CE_SMOOTH)
                        ws[i] += mul0(WEIGHT1(v), acc[i][j]);
                }
            }
        }
    }
    for (int i = 0; i < TM; ++i) {
        const int mm = RI(i);
        red[(0 * T + mm) * NTX + tx] = m[i];
        red[(1 * T + mm) * NTX + tx] = s[i];
        red[(2 * T + mm) * NTX + tx] = ws[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < T && r0 + lid < N) {
        float mx = -INFINITY, sum = 0.0f, wsum = 0.0f;
        for (int t = 0; t < NTX; ++t)
            mx = fmax(mx, red[lid * NTX + t]);
        for (int t = 0; t < NTX; ++t) {
            sum += red[(T + lid) * NTX + t] * exp(red[lid * NTX + t] - mx);
            wsum += red[(2 * T + lid) * NTX + t];
        }
        __global float *p = part + ((r0 + lid) * ns + sp) * 3;
        p[0] = mx;
        p[1] = sum;
        p[2] = wsum;
    }
}

/*
 * Backward, per row: coef[row * 4 + {0..3}] = (A, B, C, lse_p(lse)) with the upstream gradient
 * folded in (g: a scalar, or per row for reduction none; has_g 0 means 1).
 */
__kernel void cce_coefs(int flags, long n, long V, const __global label_t *labels, ulong loff,
                        const __global float *weight, ulong woff, const __global int *stats,
                        int reduction, float gs, long ignore_index, float eps, float zs,
                        const __global float *lse_in, ulong lseoff, const __global float *g,
                        ulong goff, int has_g, __global float *coef)
{
    const long row = get_global_id(0);
    if (row >= n || stats[0] >= 0)
        return;
    const long y = LABEL(labels, loff + row);
    const float lse = lse_in[lseoff + row];
    float3 q = (float3)(0.0f);
    if (y != ignore_index) {
        float2 c = gs * ce_scales(stats, reduction);
        if (has_g)
            c *= g[goff + (reduction == 2 ? row : 0)];
        q = ce_coefs(lse, WEIGHT1(y), as_float(stats[3]), V, eps, zs, c);
    }
    coef[row * 4 + 0] = q.x;
    coef[row * 4 + 1] = q.y;
    coef[row * 4 + 2] = q.z;
    coef[row * 4 + 3] = lse_p(lse);
}

/*
 * The gradient tile G (w.r.t. the pre-cap logits) of rows r0.. and vocabulary v0.. into Gs[m * T +
 * n], or Gs[n * T + m] when transposed (so that each consumer reads contiguous runs); zero outside
 * [N, V]. Returns whether any entry must be kept: with filter > 0 a tile whose
 * probabilities are all below filter and that holds no target is skipped (exact when filter is 0).
 */
inline bool cce_grad_tile(int flags, const __global st_t *hid, ulong hoff, long hs, long N, long H,
                          const __global st_t *w, ulong wo, long wst, long V,
                          const __global st_t *bias, ulong boff, const __global label_t *labels,
                          ulong loff, const __global float *weight, ulong woff,
                          const __global float *coef, float cap, float filter, long r0, long v0,
                          __local float *As, __local float *Bs, __local float *Gs,
                          int transposed, __local int *keep)
{
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    float acc[TM][TN];
    cce_tile(hid, hoff, hs, N, H, w, wo, wst, V, r0, v0, As, Bs, acc);
    if (lid == 0)
        *keep = filter <= 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    bool mine = false;
    for (int i = 0; i < TM; ++i) {
        const int mm = RI(i);
        const long row = r0 + mm;
        float4 q = (float4)(0.0f);
        long y = -1;
        if (row < N) {
            q = vload4(row, coef);
            y = LABEL(labels, loff + row);
        }
        for (int j = 0; j < TN; ++j) {
            const int nn = CJ(j);
            const long v = v0 + nn;
            float g = 0.0f;
            if (row < N && v < V) {
                const float xc = CAP(acc[i][j] + BIAS(v));
                const float p = exp(xc - q.w);
                g = q.x * p - q.z * WEIGHT1(v);
                if (v == y) {
                    g -= q.y;
                    mine = true;
                }
                g *= CAP_DERIV(xc);
                mine |= p >= filter || q.z != 0.0f;
            }
            Gs[transposed ? nn * T + mm : mm * T + nn] = g;
        }
    }
    if (mine && filter > 0.0f)
        *keep = 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    return *keep != 0;
}

/*
 * dhidden: work-group per row tile, over the vocabulary tiles [vt0, vt1) in order; dh (f32 [N, H],
 * zeroed first) += G x W. Each work-item owns its elements of the tile's rows, so the
 * read-modify-write needs no atomics and its order is fixed: launches over consecutive ranges of
 * vocabulary tiles (where the device cuts long loops short) give the same bits as one over all.
 */
__kernel __attribute__((reqd_work_group_size(TWG, 1, 1))) void
cce_bwd_dh(int flags, const __global st_t *hid, ulong hoff, long hs, long N, long H,
           const __global st_t *w, ulong wo, long wst, long V, const __global st_t *bias,
           ulong boff, const __global label_t *labels, ulong loff, const __global float *weight,
           ulong woff, const __global int *stats, const __global float *coef, float cap,
           float filter, long vt0, long vt1, __global float *dh, ulong dhoff, long dhs)
{
    __local float As[BK * LDT] LOCAL_ALIGNED, Bs[BK * LDT] LOCAL_ALIGNED, Gs[T * T] LOCAL_ALIGNED;
    __local int keep;
    if (stats[0] >= 0)
        return;
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    const long r0 = get_group_id(0) * (long)T;
    for (long vt = vt0; vt < vt1; ++vt) {
        const long v0 = vt * T;
        if (!cce_grad_tile(flags, hid, hoff, hs, N, H, w, wo, wst, V, bias, boff, labels, loff,
                           weight, woff, coef, cap, filter, r0, v0, As, Bs, Gs, 1, &keep))
            continue;
        for (long h0 = 0; h0 < H; h0 += T) {
            float acc[TM][TN];
            cce_zero(acc);
            for (int k0 = 0; k0 < T; k0 += BK) {
                for (int e = lid; e < T * BK; e += TWG) {
                    const int kk = e / T, hh = e % T;
                    const long v = v0 + k0 + kk, h = h0 + hh;
                    Bs[kk * T + hh] = (v < V && h < H) ? LOAD(DT, w, wo + v * wst + h) : 0.0f;
                }
                barrier(CLK_LOCAL_MEM_FENCE);
                cce_slice_fma(acc, Gs + k0 * T, T, Bs, T);
                barrier(CLK_LOCAL_MEM_FENCE);
            }
            for (int i = 0; i < TM; ++i) {
                const long row = r0 + RI(i);
                for (int j = 0; j < TN; ++j) {
                    const long h = h0 + CJ(j);
                    if (row < N && h < H)
                        dh[dhoff + row * dhs + h] += acc[i][j];
                }
            }
        }
    }
}

/*
 * dW and dbias: work-group per vocabulary tile, over the row tiles [rt0, rt1) in order; dw (f32
 * [V, H], zeroed first unless accumulating) += G^T x hidden and dbias[v] = sum over those rows of
 * G (has_db 1) or += it (has_db 2), both owned by this work-group (each only when its has_ flag is
 * set). Consecutive ranges of row tiles (where the device cuts long loops short) run as launches
 * one after the other, the later ones adding to dbias.
 */
__kernel __attribute__((reqd_work_group_size(TWG, 1, 1))) void
cce_bwd_dw(int flags, const __global st_t *hid, ulong hoff, long hs, long N, long H,
           const __global st_t *w, ulong wo, long wst, long V, const __global st_t *bias,
           ulong boff, const __global label_t *labels, ulong loff, const __global float *weight,
           ulong woff, const __global int *stats, const __global float *coef, float cap,
           float filter, long rt0, long rt1, int has_dw, __global float *dw, ulong dwoff,
           long dws, int has_db, __global float *db, ulong dboff)
{
    __local float As[BK * LDT] LOCAL_ALIGNED, Bs[BK * LDT] LOCAL_ALIGNED, Gs[T * T] LOCAL_ALIGNED;
    __local int keep;
    if (stats[0] >= 0)
        return;
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    const long v0 = get_group_id(0) * (long)T;
    float dbias = 0.0f;
    for (long rt = rt0; rt < rt1; ++rt) {
        const long r0 = rt * T;
        if (!cce_grad_tile(flags, hid, hoff, hs, N, H, w, wo, wst, V, bias, boff, labels, loff,
                           weight, woff, coef, cap, filter, r0, v0, As, Bs, Gs, 0, &keep))
            continue;
        if (lid < T)
            for (int mm = 0; mm < T; ++mm)
                dbias += Gs[mm * T + lid];
        for (long h0 = 0; has_dw && h0 < H; h0 += T) {
            float acc[TM][TN];
            cce_zero(acc);
            for (int k0 = 0; k0 < T; k0 += BK) {
                for (int e = lid; e < T * BK; e += TWG) {
                    const int kk = e / T, hh = e % T;
                    const long row = r0 + k0 + kk, h = h0 + hh;
                    As[kk * T + hh] =
                        (row < N && h < H) ? LOAD(DT, hid, hoff + row * hs + h) : 0.0f;
                }
                barrier(CLK_LOCAL_MEM_FENCE);
                cce_slice_fma(acc, Gs + k0 * T, T, As, T);
                barrier(CLK_LOCAL_MEM_FENCE);
            }
            for (int i = 0; i < TM; ++i) {
                const long v = v0 + RI(i);
                for (int j = 0; j < TN; ++j) {
                    const long h = h0 + CJ(j);
                    if (v < V && h < H)
                        dw[dwoff + v * dws + h] += acc[i][j];
                }
            }
        }
    }
    if (has_db && lid < T && v0 + lid < V)
        db[dboff + v0 + lid] = (has_db == 2 ? db[dboff + v0 + lid] : 0.0f) + dbias;
}
