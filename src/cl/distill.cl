/*
 * distill.cl: distillation losses between a student's and a teacher's logits over V classes, the
 * generalised Jensen-Shannon divergence of Liger Kernel's JSD (forward KL at beta 0, reverse KL
 * at beta 1) at a temperature. The formulas are in include/llmcl.h. Host side:
 * src/runtime/ops/distill.c.
 *   distill_count   labels -> stats[0], the rows that count (the mean's divisor), and with HARD
 *                   stats[1], the first row whose label is outside [0, V) (-1: none)
 *   distill_rows    one work-group per row: both LSEs online, the row's divergence, the gradient
 *   distill_finish  per-row divergences -> the loss (mean or sum in a fixed order)
 *
 * Within a row, with X and Y the student's and the teacher's log-probabilities (logits times
 * 1 / tau minus their LSE), q = exp(X), p = exp(Y) and log m = log(beta p + (1 - beta) q), class j
 * adds l_j to the row's divergence and g_j = dl/dX_j to its gradient:
 *   mode 0 (beta 0)  l = p (Y - X),  g = -p
 *   mode 1 (beta 1)  l = q (X - Y),  g = l + q
 *   mode 2           l = beta p (Y - log m) + (1 - beta) q (X - log m),
 *                    g = (1 - beta) q (X - log m)
 * and the gradient on the student's logits is c gs / tau (g_j - q_j S), S = sum_j g_j, c = 1 /
 * count for the mean (0 when nothing counts), else 1. The first walk of a row takes both LSEs
 * online, and with them both KLs as weighted means (KL(p || q) = sum_j p_j (xt_j - xs_j) + lse_s
 * - lse_t, xs and xt the scaled logits), so that modes 0 and 1 have their loss there; their
 * gradients, c gs / tau (q - p) and c gs / tau q (X - Y - KL) (sum_j q_j = 1), take a second walk.
 * Mode 2 walks a second time for its loss and S, and a third for the gradient.
 * With HARD the row adds hw (lse_1 - z_y), the cross-entropy of the student's logits z at
 * temperature 1 against its label y weighed hw, and the gradient c gs hw (softmax(z) - [j == y]),
 * in the same walks: lse_1 is a third online state of the first walk (HARD 1), or the student's
 * own LSE where tau is 1 (HARD 2).
 * A factor of 0 (p or q of a -inf logit) zeroes its term even where the other factor is infinite,
 * so classes past V are read as -inf logits on both sides and add nothing: every walk is in
 * chunks of eight.
 *
 * Defines: MODE (0, 1, 2: each program holds one form); S_DT, T_DT, DS_DT the storage of
 * student, teacher and dstudent (F32, BF16, F16; default F32, S_DT, S_DT); LABEL_DT (I32, I64);
 * ALIGNED (host side: 1 where every row of student, teacher and dstudent starts on 16 bytes, so
 * whole chunks are single 16-byte accesses); HARD (0 none, 1, 2: the cross-entropy term above).
 * Tunables: WG the work-group size (a power of two, default 256); UNROLL chunks of eight loaded
 * per loop trip (1, 2, 4; default 2). Tuning key "distill_rows" (WG, UNROLL; shape class from V).
 */

#ifndef S_DT
#define S_DT F32
#endif
#ifndef T_DT
#define T_DT S_DT
#endif
#ifndef DS_DT
#define DS_DT S_DT
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
#ifndef ALIGNED
#define ALIGNED 1
#endif
#ifndef MODE
#define MODE 2
#endif
#ifndef HARD
#define HARD 0
#endif

typedef STORAGE(S_DT) s_t;
typedef STORAGE(T_DT) t_t;
typedef STORAGE(DS_DT) ds_t;
typedef STORAGE(LABEL_DT) label_t;

/*
 * Elements j0 .. j0 + 7 of the row at element base of p, -inf past V; and their store. Lanes past
 * V load element V - 1 and drop it, so that the loads take no branch.
 */
#define LANE_IN(DT, k) select(-INFINITY, LOAD(DT, p, base + min(j0 + (k), V - 1)), j0 + (k) < V)
#define LANE_OUT(DT, k, c)                                                                        \
    if (j0 + (k) < V)                                                                             \
        STORE(DT, p, base + j0 + (k), v.c);
#define DEF_CHUNK_IO(DT, ST)                                                                      \
    inline float8 chunk_##DT(const __global ST *p, long base, long j0, long V)                    \
    {                                                                                             \
        if (ALIGNED && j0 + 8 <= V)                                                               \
            return load8_##DT(p, base + j0);                                                      \
        return (float8)(LANE_IN(DT, 0), LANE_IN(DT, 1), LANE_IN(DT, 2), LANE_IN(DT, 3),           \
                        LANE_IN(DT, 4), LANE_IN(DT, 5), LANE_IN(DT, 6), LANE_IN(DT, 7));          \
    }                                                                                             \
    inline void chunk_store_##DT(__global ST *p, long base, long j0, long V, float8 v)            \
    {                                                                                             \
        if (ALIGNED && j0 + 8 <= V) {                                                             \
            store8_##DT(p, base + j0, v);                                                         \
            return;                                                                               \
        }                                                                                         \
        LANE_OUT(DT, 0, s0) LANE_OUT(DT, 1, s1) LANE_OUT(DT, 2, s2) LANE_OUT(DT, 3, s3)           \
        LANE_OUT(DT, 4, s4) LANE_OUT(DT, 5, s5) LANE_OUT(DT, 6, s6) LANE_OUT(DT, 7, s7)           \
    }
DEF_CHUNK_IO(F32, float)
DEF_CHUNK_IO(BF16, ushort)
DEF_CHUNK_IO(F16, ushort)

#define S_CHUNK(j0) LLMCL_CAT(chunk_, S_DT)(s, sbase, (j0), V)
#define T_CHUNK(j0) LLMCL_CAT(chunk_, T_DT)(t, tbase, (j0), V)
#define DS_STORE(j0, v) LLMCL_CAT(chunk_store_, DS_DT)(ds, dsbase, (j0), V, (v))

inline float8 mul0_8(float8 a, float8 b)
{
    return select(a * b, (float8)(0.0f), a == (float8)(0.0f));
}

/*
 * Online logsumexp of eight more values x with a weighted sum: running max m (from -FLT_MAX),
 * l = sum exp(x - m) and a = sum exp(x - m) d, rescaled together when m grows (a class of
 * probability 0 adds nothing to a, even where d is infinite).
 */
inline void online8(float *m, float *l, float *a, float8 x, float8 d)
{
    const float mc = hmax8(x);
    if (mc > *m) {
        const float r = exp(*m - mc);
        *l *= r;
        *a *= r;
        *m = mc;
    }
    const float8 e = exp(x - *m);
    *l += hsum8(e);
    *a += hsum8(mul0_8(e, d));
}

/* The online logsumexp (m, l) alone, of the hard term's logits at temperature 1. */
inline void online8_lse(float *m, float *l, float8 x)
{
    const float mc = hmax8(x);
    if (mc > *m) {
        *l *= exp(*m - mc);
        *m = mc;
    }
    *l += hsum8(exp(x - *m));
}

/* Three online states merged, (m, l, a) in (s0, s1, s2) and (s3, s4, s5), (m, l) in (s6, s7): the
   larger m, the sums rescaled to it. */
inline float8 merge_states(float8 x, float8 y)
{
    const float ms = fmax(x.s0, y.s0), mt = fmax(x.s3, y.s3), m1 = fmax(x.s6, y.s6);
    const float2 rs = exp((float2)(x.s0, y.s0) - ms), rt = exp((float2)(x.s3, y.s3) - mt);
    const float2 r1 = exp((float2)(x.s6, y.s6) - m1);
    return (float8)(ms, x.s1 * rs.x + y.s1 * rs.y, x.s2 * rs.x + y.s2 * rs.y, mt,
                    x.s4 * rt.x + y.s4 * rt.y, x.s5 * rt.x + y.s5 * rt.y, m1,
                    x.s7 * r1.x + y.s7 * r1.y);
}

/*
 * Both streams' online states merged over the work-group in one tree, in a fixed order; and two
 * sums in one. One loop of barriers for six values: PoCL's work-group compiler took minutes over
 * a kernel of eight reductions.
 */
LLMCL_WG_REDUCE_T(wg_merge_states, float8, merge_states, )
LLMCL_WG_REDUCE_T(wg_sum2, float2, LLMCL_ADD, )

/* (lse_s, as / ls, lse_t, at / lt, lse_1) of the merged states. */
inline float8 online_merge(float8 st, __local float8 *sc)
{
    const float8 r = wg_merge_states(st, sc);
    return (float8)(r.s0 + log(r.s1), r.s2 / r.s1, r.s3 + log(r.s4), r.s5 / r.s4,
                    r.s6 + log(r.s7), 0.0f, 0.0f, 0.0f);
}

/* [j0 + k == y] for the eight classes from j0 (j0 - y fits an int: V < 2^31). */
inline float8 onehot8(long j0, long y)
{
    const int8 k = (int8)(0, 1, 2, 3, 4, 5, 6, 7) + (int)(j0 - y);
    return select((float8)(0.0f), (float8)(1.0f), k == (int8)(0));
}

/* The hard term's first-walk state, and its gradient added on eight classes of the student's
   logits z (fh = c gs hw); nothing without HARD. */
#if HARD == 1
#define HARD_STATE(z) online8_lse(&m1, &l1, (z))
#else
#define HARD_STATE(z)
#endif
#if HARD
#define PLUS_HARD_GRAD(z, j0) + fh * (exp((z) - lse_1) - onehot8((j0), y))
#else
#define PLUS_HARD_GRAD(z, j0)
#endif

/* Mode 2's l and g (the header) of eight classes; lb = log beta, l1b = log(1 - beta). */
inline float8 jsd8(float8 X, float8 Y, float beta, float lb, float l1b, float8 *g)
{
    const float8 q = exp(X), p = exp(Y);
    const float8 a = lb + Y, b = l1b + X, hi = fmax(a, b);
    const float8 lm = select(hi + log1p(exp(fmin(a, b) - hi)), (float8)(-INFINITY),
                             hi == (float8)(-INFINITY));
    const float8 gq = mul0_8(q, X - lm);
    *g = (1.0f - beta) * gq;
    return beta * mul0_8(p, Y - lm) + *g;
}

/*
 * A work-item's chunks of a row, UNROLL loaded before any is used, then BODY for each (with zs
 * the student's logits, xs, xt both scaled and j0 the chunk's first class); rev walks them last
 * first, so that a second walk starts on what the first left in the cache. NVIDIA's OpenCL C
 * takes no variadic macros: a BODY has no comma outside parentheses.
 */
#define FOR_CHUNKS(rev, BODY)                                                                     \
    do {                                                                                          \
        const long nb_ = (nk + (long)WG * UNROLL - 1) / ((long)WG * UNROLL);                      \
        for (long i_ = 0; i_ < nb_; ++i_) {                                                       \
            const long k_ = ((rev) ? nb_ - 1 - i_ : i_) * WG * UNROLL + get_local_id(0);          \
            float8 sv_[UNROLL], tv_[UNROLL];                                                      \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long kk_ = k_ + (long)u_ * WG;                                              \
                if (kk_ < nk) {                                                                   \
                    sv_[u_] = S_CHUNK(8 * kk_);                                                   \
                    tv_[u_] = T_CHUNK(8 * kk_);                                                   \
                }                                                                                 \
            }                                                                                     \
            _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                 \
            {                                                                                     \
                const long j0 = 8 * (k_ + (long)u_ * WG);                                         \
                if (j0 >= 8 * nk)                                                                 \
                    break;                                                                        \
                const float8 zs = sv_[u_], xs = zs * inv_tau, xt = tv_[u_] * inv_tau;             \
                BODY                                                                              \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/*
 * One work-group of WG: stats[0] = the rows whose label is not ignore_index (all without), and
 * with HARD stats[1] = the first row whose label is neither that nor in [0, V) (-1: none).
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
distill_count(int has_labels, const __global label_t *labels, ulong loff, long n, long V,
              long ignore_index, __global int *stats)
{
    __local int total, first_bad;
    if (get_local_id(0) == 0) {
        total = 0;
        first_bad = INT_MAX;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int count = 0, bad = INT_MAX; /* n < 2^31 (the host checks) */
    for (long i = get_local_id(0); i < n; i += WG) {
        const long y = has_labels ? LOAD(LABEL_DT, labels, loff + i) : 0;
        count += !has_labels || y != ignore_index;
        /* one unsigned compare: llvmpipe folds y < 0 || y >= V wrongly (cross_entropy.cl) */
        if (HARD && y != ignore_index && (ulong)y >= (ulong)V)
            bad = min(bad, (int)i);
    }
    atomic_add(&total, count); /* an integer sum and minimum: the same in any order */
    atomic_min(&first_bad, bad);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        stats[0] = total;
        stats[1] = first_bad == INT_MAX ? -1 : first_bad;
    }
}

/*
 * Row r of this launch is row row0 + r of the call (labels, rows[]). rows[row] = its divergence
 * (0 when ignored). With grad set the work-group then writes dstudent into ds, which may be s
 * itself: every element is read by the work-item that overwrites it.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
distill_rows(const __global s_t *s, ulong soff, long sstride, const __global t_t *t,
             ulong toff, long tstride, long V, int has_labels, const __global label_t *labels,
             ulong loff, long row0, long ignore_index, const __global int *stats, int reduction,
             float gs, float inv_tau, float beta, float hw, __global float *rows, ulong rowsoff,
             int grad, __global ds_t *ds, ulong dsoff, long dsstride)
{
    __local float8 scratch[WG];
    const long r = get_group_id(0), row = row0 + r, nk = (V + 7) / 8;
    const long sbase = soff + r * sstride, tbase = toff + r * tstride;
    const long dsbase = dsoff + r * dsstride;
    const long y = has_labels ? LOAD(LABEL_DT, labels, loff + row) : 0;
    const bool live = !has_labels || y != ignore_index;
    if (!live) {
        if (get_local_id(0) == 0)
            rows[rowsoff + row] = 0.0f;
        if (grad)
            for (long k = get_local_id(0); k < nk; k += WG)
                DS_STORE(8 * k, (float8)(0.0f));
        return;
    }

    /* the label's logit, read before any walk writes dstudent over the student's row */
    const float zy = HARD ? LOAD(S_DT, s, sbase + y) : 0.0f;
    /* Both LSEs, and the KLs as weighted means: KL(p || q) = sum_j p_j (xt_j - xs_j) + lse_s -
       lse_t, and KL(q || p) likewise, so that beta 0 and 1 have their loss in this one walk (and
       the hard term's LSE where it has its own). */
    float ms = -FLT_MAX, ls = 0.0f, as = 0.0f, mt = -FLT_MAX, lt = 0.0f, at = 0.0f;
    float m1 = -FLT_MAX, l1 = 0.0f;
    FOR_CHUNKS(false, {
        online8(&ms, &ls, &as, xs, xs - xt);
        online8(&mt, &lt, &at, xt, xt - xs);
        HARD_STATE(zs);
    });
    const float8 e = online_merge((float8)(ms, ls, as, mt, lt, at, m1, l1), scratch);
    const float lse_s = e.s0, lse_t = e.s2, lse_1 = HARD == 2 ? lse_s : e.s4;
    const float kl = MODE == 0 ? e.s3 + lse_s - lse_t : e.s1 + lse_t - lse_s;
    const float hard = HARD ? hw * (lse_1 - zy) : 0.0f;

    const int count = stats[0];
    const float c = reduction == 0 ? (count > 0 ? 1.0f / (float)count : 0.0f) : 1.0f;
    const float f = c * gs * inv_tau, fh = c * gs * hw;
#if MODE != 2
    if (get_local_id(0) == 0)
        rows[rowsoff + row] = kl + hard;
    /* beta 0: f (q - p); beta 1: f q (X - Y - KL), the header's g - q S with sum_j q_j = 1 */
    if (grad)
        FOR_CHUNKS(true, {
            const float8 q = exp(xs - lse_s);
            const float8 p = exp(xt - lse_t);
            DS_STORE(j0, f * (MODE == 0 ? q - p : mul0_8(q, (xs - lse_s) - (xt - lse_t) - kl))
                             PLUS_HARD_GRAD(zs, j0));
        });
#else
    const float lb = log(beta), l1b = log1p(-beta);
    float lsum = 0.0f, gsum = 0.0f;
    FOR_CHUNKS(true, {
        float8 g;
        lsum += hsum8(jsd8(xs - lse_s, xt - lse_t, beta, lb, l1b, &g));
        gsum += hsum8(g);
    });
    const float2 sums = wg_sum2((float2)(lsum, gsum), (__local float2 *)scratch);
    const float S = sums.y;
    if (get_local_id(0) == 0)
        rows[rowsoff + row] = sums.x + hard;
    if (grad)
        FOR_CHUNKS(false, {
            float8 g;
            jsd8(xs - lse_s, xt - lse_t, beta, lb, l1b, &g);
            DS_STORE(j0, f * (g - mul0_8(exp(xs - lse_s), (float8)(S))) PLUS_HARD_GRAD(zs, j0));
        });
#endif
}

/* One work-group of WG: loss = the sum of rows[0, n) in a fixed order, over count for the mean. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
distill_finish(const __global float *rows, long n, const __global int *stats, int reduction,
               __global float *loss, ulong lossoff)
{
    __local float scratch[WG];
    float a = 0.0f;
    for (long i = get_local_id(0); i < n; i += WG)
        a += rows[i];
    a = wg_sum(a, scratch);
    if (get_local_id(0) == 0) {
        const int count = stats[0];
        loss[lossoff] = reduction != 0 ? a : count > 0 ? a / (float)count : 0.0f;
    }
}
