/*
 * preference.cl: the preference losses' terms (DPO, IPO, SimPO, CPO, ORPO; the formulas are in
 * include/llmcl.h) between the passes of a linear cross-entropy. Host side:
 * src/runtime/ops/preference.c.
 *   pref_count  the chosen sequences' scored positions (the supervised term's divisor)
 *   pref_seq    one work-group a sequence: from the positions' cross-entropies -logp_i, the sum of
 *               the scored positions' logp and their number
 *   pref_pairs  a work-item a pair: each sequence's pi, the pair's term, and each sequence's
 *               upstream gradient of its positions' cross-entropies
 *   pref_loss   the pairs' terms and the supervised term into the loss, in a fixed order
 *   pref_rows   each position's upstream gradient, its sequence's
 * The chunked form runs pref_seq, pref_pairs and pref_rows once a chunk of whole pairs, between
 * the chunk's cross-entropies and its gradient; the fused form once, between the fused
 * cross-entropy's forward and backward.
 *
 * With L the loss, CE_i = -logp_i and s position i's sequence, the backward's upstream gradient
 * is g_i = d(gs L)/dCE_i = -gs dL/dpi_s a_s + gs [s chosen] nll_weight / N_c, where a_s is 1 for
 * summed log-probabilities and 1 / n_s for averaged ones (0 when n_s is 0), and N_c the chosen
 * sequences' scored positions; ignored positions get no gradient from the backward whatever g_i.
 * Where a factor of 0 (a sigmoid's tail, eps 0, nll_weight 0) meets an infinity, the product is 0.
 *
 * Defines: LABEL_DT (I32, I64; default I64). Tunable: WG the work-group size (a power of two,
 * default 256).
 */

#ifndef LABEL_DT
#define LABEL_DT I64
#endif
#ifndef WG
#define WG 256
#endif

typedef STORAGE(LABEL_DT) label_t;

/* The losses, as llmcl_pref_loss numbers them. */
#define PREF_DPO 0
#define PREF_IPO 1
#define PREF_SIMPO 2
#define PREF_CPO 3
#define PREF_ORPO 4

/*
 * A pair's sequences: stacked (B chosen, then B rejected: the caller's layout) or interleaved
 * (pair p's chosen then its rejected: the chunked form's copy, whose chunks hold whole pairs).
 */
#define CHOSEN(p) (inter ? 2 * (p) : (p))
#define REJECTED(p) (inter ? 2 * (p) + 1 : B + (p))

/* One work-group of WG: nc[0] = the chosen sequences' scored positions. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
pref_count(const __global label_t *labels, ulong loff, long B, long T, int inter,
           long ignore_index, __global float *nc)
{
    __local float scratch[WG];
    float count = 0.0f;
    for (long i = get_local_id(0); i < B * T; i += WG) {
        const long row = CHOSEN(i / T) * T + i % T;
        count += LOAD(LABEL_DT, labels, loff + row) != ignore_index ? 1.0f : 0.0f;
    }
    count = wg_sum(count, scratch);
    if (get_local_id(0) == 0)
        nc[0] = count;
}

/*
 * Work-group s - s0 for sequence s: seq[2 s] = sum of logp_i = -ce[i] over its scored positions,
 * seq[2 s + 1] their number (exact as a float up to 2^24 positions).
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
pref_seq(const __global label_t *labels, ulong loff, long T, long ignore_index,
         const __global float *ce, long s0, __global float *seq)
{
    __local float scratch[WG];
    const long s = s0 + get_group_id(0);
    float sum = 0.0f, count = 0.0f;
    for (long t = get_local_id(0); t < T; t += WG) {
        const bool scored = LOAD(LABEL_DT, labels, loff + s * T + t) != ignore_index;
        sum -= scored ? ce[s * T + t] : 0.0f;
        count += scored ? 1.0f : 0.0f;
    }
    sum = wg_sum(sum, scratch);
    count = wg_sum(count, scratch);
    if (get_local_id(0) == 0) {
        seq[2 * s] = sum;
        seq[2 * s + 1] = count;
    }
}

/* softplus(z) = log(1 + e^z), without overflow. */
inline float softplus(float z) { return fmax(z, 0.0f) + log1p(exp(-fabs(z))); }

/* sigmoid(z), without overflow. */
inline float sigmoid(float z)
{
    const float e = exp(-fabs(z));
    return z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

/* log(1 - e^x) for x <= 0 (-inf at 0), accurate at both ends. */
inline float log1mexp(float x) { return x > -0.6931472f ? log(-expm1(x)) : log1p(-exp(x)); }

/*
 * One pair's term and its derivatives by the chosen and rejected pi, (term, d/dc, d/dr): c and r
 * the policy's pi, rc and rr the reference's (0 where the loss takes none).
 */
inline float3 pair_term(int loss, float c, float r, float rc, float rr, float beta, float gamma,
                        float eps)
{
    if (loss == PREF_IPO) {
        const float u = (c - rc) - (r - rr) - 0.5f / beta;
        return (float3)(u * u, 2.0f * u, -2.0f * u);
    }
    if (loss == PREF_ORPO) {
        /* pi <= 0 in exact arithmetic; rounding must not push it past log1mexp's domain */
        c = fmin(c, 0.0f);
        r = fmin(r, 0.0f);
        const float o = (c - r) - log1mexp(c) + log1mexp(r);
        const float w = beta * sigmoid(-o); /* dterm/do = -w */
        /* do/dc = 1 / (1 - e^c), do/dr = -1 / (1 - e^r) */
        return (float3)(beta * softplus(-o), mul0(w, 1.0f / expm1(c)), mul0(w, -1.0f / expm1(r)));
    }
    const float z = loss == PREF_DPO    ? beta * ((c - rc) - (r - rr))
                    : loss == PREF_SIMPO ? beta * (c - r) - gamma
                                         : beta * (c - r);
    /* ls(z) = (1 - eps) softplus(-z) + eps softplus(z) */
    const float term = mul0(1.0f - eps, softplus(-z)) + mul0(eps, softplus(z));
    const float dz = -(1.0f - eps) * sigmoid(-z) + eps * sigmoid(z);
    return (float3)(term, beta * dz, -beta * dz);
}

/* a sequence's pi from its sum and count, and the factor a_s its positions' logp take */
inline float2 seq_pi(const __global float *seq, long s, int average)
{
    const float sum = seq[2 * s], n = seq[2 * s + 1];
    if (!average)
        return (float2)(sum, 1.0f);
    return n > 0.0f ? (float2)(sum / n, 1.0f / n) : (float2)(0.0f);
}

/*
 * Pairs [p0, p0 + np), a work-item each: terms[p], logps (the caller's order, has_logps) and the
 * upstream gradient coef[s] of each of their sequences' positions (has_coef); nc[0] the chosen
 * sequences' scored positions, ref the reference's pi in the caller's order (has_ref).
 */
__kernel void pref_pairs(int loss, int average, long B, long p0, long np, int inter, float beta,
                         float gamma, float eps, float nll_weight, float gs,
                         const __global float *seq, const __global float *nc, int has_ref,
                         const __global float *ref, ulong refoff, int has_logps,
                         __global float *logps, ulong lpoff, __global float *terms, int has_coef,
                         __global float *coef)
{
    const long i = get_global_id(0), p = p0 + i;
    if (i >= np)
        return;
    const float2 c = seq_pi(seq, CHOSEN(p), average), r = seq_pi(seq, REJECTED(p), average);
    const float rc = has_ref ? ref[refoff + p] : 0.0f;
    const float rr = has_ref ? ref[refoff + B + p] : 0.0f;
    const float3 t = pair_term(loss, c.x, r.x, rc, rr, beta, gamma, eps);
    terms[p] = t.x;
    if (has_logps) {
        logps[lpoff + p] = c.x;
        logps[lpoff + B + p] = r.x;
    }
    if (has_coef) {
        const float nll_grad = nc[0] > 0.0f ? nll_weight / nc[0] : 0.0f;
        coef[CHOSEN(p)] = gs * (mul0(c.y, -t.y / (float)B) + nll_grad);
        coef[REJECTED(p)] = gs * mul0(r.y, -t.z / (float)B);
    }
}

/*
 * One work-group of WG: loss[lossoff] = the mean of the B pairs' terms plus nll_weight times the
 * chosen sequences' mean cross-entropy per scored position, sums in a fixed order.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
pref_loss(long B, int inter, float nll_weight, const __global float *seq,
          const __global float *nc, const __global float *terms, __global float *loss,
          ulong lossoff)
{
    __local float scratch[WG];
    float sum = 0.0f, nll = 0.0f;
    for (long p = get_local_id(0); p < B; p += WG) {
        sum += terms[p];
        nll -= seq[2 * CHOSEN(p)];
    }
    sum = wg_sum(sum, scratch);
    nll = wg_sum(nll, scratch);
    if (get_local_id(0) == 0)
        loss[lossoff] = sum / (float)B + (nc[0] > 0.0f ? mul0(nll_weight, nll / nc[0]) : 0.0f);
}

/* g[r0 + i] = coef[(r0 + i) / T] for the n positions from r0. */
__kernel void pref_rows(long r0, long n, long T, const __global float *coef, __global float *g)
{
    const long i = get_global_id(0);
    if (i < n)
        g[r0 + i] = coef[(r0 + i) / T];
}
