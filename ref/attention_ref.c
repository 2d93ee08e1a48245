/*
 * attention_ref.c: naive attention in double (see attention_ref.h), one score row at a time.
 */
#include "attention_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct seq_geom {
    int64_t q0, k0; /* first row of the sequence in the packed tensors */
    int tq, tk;
} seq_geom;

static seq_geom seq_of(const attn_ref_cfg *c, int b)
{
    seq_geom s = {0, 0, c->Tq, c->Tk};
    if (c->cu_q) {
        s.q0 = c->cu_q[b];
        s.tq = c->cu_q[b + 1] - c->cu_q[b];
        s.k0 = c->cu_k[b];
        s.tk = c->cu_k[b + 1] - c->cu_k[b];
    }
    return s;
}

static int64_t total_q(const attn_ref_cfg *c) { return c->cu_q ? c->cu_q[c->B] : (int64_t)c->B * c->Tq; }
static int64_t total_k(const attn_ref_cfg *c) { return c->cu_k ? c->cu_k[c->B] : (int64_t)c->B * c->Tk; }

int64_t attn_ref_q_numel(const attn_ref_cfg *c) { return total_q(c) * c->Hq * c->D; }
int64_t attn_ref_k_numel(const attn_ref_cfg *c) { return total_k(c) * c->Hkv * c->D; }
int64_t attn_ref_lse_numel(const attn_ref_cfg *c) { return total_q(c) * c->Hq; }

/* Offset of row t of head h in sequence b, for a tensor with H heads and dense length T. */
static int64_t row_at(const attn_ref_cfg *c, int b, int h, int H, int T, int64_t start, int t)
{
    if (c->cu_q)
        return ((start + t) * H + h) * (int64_t)c->D;
    return (((int64_t)b * H + h) * T + t) * (int64_t)c->D;
}

static int64_t lse_at(const attn_ref_cfg *c, int b, int h, int64_t start, int t)
{
    if (c->cu_q)
        return (int64_t)h * total_q(c) + start + t;
    return ((int64_t)b * c->Hq + h) * c->Tq + t;
}

static int visible(const attn_ref_cfg *c, int i, int j, int tq, int tk)
{
    const int rel = j - i - (tk - tq);
    if (c->causal && rel > 0)
        return 0;
    if (c->window_left >= 0 && rel < -c->window_left)
        return 0;
    if (c->window_right >= 0 && rel > c->window_right)
        return 0;
    return 1;
}

static double scale_of(const attn_ref_cfg *c) { return c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->D); }

/*
 * Probabilities p[j] of query row qi against every key of the sequence (0 where masked), and
 * dlogit[j] = d logit / d (q . k). Returns the LSE (-inf when no key is visible).
 */
static double score_row(const attn_ref_cfg *c, const double *qi, const double *k, int b, int hk,
                        seq_geom s, int i, double *p, double *dlogit)
{
    const double scale = scale_of(c);
    double mx = -INFINITY;
    for (int j = 0; j < s.tk; ++j) {
        p[j] = -INFINITY;
        dlogit[j] = 0;
        if (!visible(c, i, j, s.tq, s.tk))
            continue;
        const double *kj = k + row_at(c, b, hk, c->Hkv, c->Tk, s.k0, j);
        double x = 0;
        for (int d = 0; d < c->D; ++d)
            x += qi[d] * kj[d];
        if (c->softcap > 0) {
            const double t = tanh(x * scale / c->softcap);
            p[j] = c->softcap * t;
            dlogit[j] = scale * (1 - t * t);
        } else {
            p[j] = x * scale;
            dlogit[j] = scale;
        }
        mx = fmax(mx, p[j]);
    }
    if (mx == -INFINITY) {
        for (int j = 0; j < s.tk; ++j)
            p[j] = 0;
        return -INFINITY;
    }
    double sum = 0;
    for (int j = 0; j < s.tk; ++j) {
        p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
        sum += p[j];
    }
    for (int j = 0; j < s.tk; ++j)
        p[j] /= sum;
    return mx + log(sum);
}

static int max_tk(const attn_ref_cfg *c)
{
    int m = c->Tk;
    for (int b = 0; c->cu_k && b < c->B; ++b)
        if (c->cu_k[b + 1] - c->cu_k[b] > m)
            m = c->cu_k[b + 1] - c->cu_k[b];
    return m > 0 ? m : 1;
}

void attn_ref_forward(const attn_ref_cfg *c, const double *q, const double *k, const double *v,
                      double *o, double *lse)
{
    double *p = malloc(sizeof(double) * 2 * max_tk(c));
    const int group = c->Hq / c->Hkv;
    for (int b = 0; b < c->B; ++b) {
        const seq_geom s = seq_of(c, b);
        for (int h = 0; h < c->Hq; ++h)
            for (int i = 0; i < s.tq; ++i) {
                const int64_t qo = row_at(c, b, h, c->Hq, c->Tq, s.q0, i);
                lse[lse_at(c, b, h, s.q0, i)] = score_row(c, q + qo, k, b, h / group, s, i, p, p + s.tk);
                for (int d = 0; d < c->D; ++d)
                    o[qo + d] = 0;
                /* key by key, each row of v read contiguously; a masked key adds nothing */
                for (int j = 0; j < s.tk; ++j) {
                    if (p[j] == 0)
                        continue;
                    const double *vj = v + row_at(c, b, h / group, c->Hkv, c->Tk, s.k0, j);
                    for (int d = 0; d < c->D; ++d)
                        o[qo + d] += p[j] * vj[d];
                }
            }
    }
    free(p);
}

void attn_ref_backward(const attn_ref_cfg *c, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv)
{
    const int tk_max = max_tk(c), group = c->Hq / c->Hkv;
    double *p = malloc(sizeof(double) * 3 * tk_max), *dl = p + tk_max, *dp = p + 2 * tk_max;
    memset(dq, 0, sizeof(double) * attn_ref_q_numel(c));
    memset(dk, 0, sizeof(double) * attn_ref_k_numel(c));
    memset(dv, 0, sizeof(double) * attn_ref_k_numel(c));
    for (int b = 0; b < c->B; ++b) {
        const seq_geom s = seq_of(c, b);
        for (int h = 0; h < c->Hq; ++h)
            for (int i = 0; i < s.tq; ++i) {
                const int hk = h / group;
                const int64_t qo = row_at(c, b, h, c->Hq, c->Tq, s.q0, i);
                score_row(c, q + qo, k, b, hk, s, i, p, dl);
                double delta = 0;
                /* keys of probability 0 (masked) add nothing to any sum below */
                for (int j = 0; j < s.tk; ++j) {
                    dp[j] = 0;
                    if (p[j] == 0)
                        continue;
                    const double *vj = v + row_at(c, b, hk, c->Hkv, c->Tk, s.k0, j);
                    for (int d = 0; d < c->D; ++d)
                        dp[j] += dout[qo + d] * vj[d];
                    delta += p[j] * dp[j];
                }
                for (int j = 0; j < s.tk; ++j) {
                    if (p[j] == 0)
                        continue;
                    const int64_t ko = row_at(c, b, hk, c->Hkv, c->Tk, s.k0, j);
                    const double ds = p[j] * (dp[j] - delta) * dl[j];
                    for (int d = 0; d < c->D; ++d) {
                        dq[qo + d] += ds * k[ko + d];
                        dk[ko + d] += ds * q[qo + d];
                        dv[ko + d] += p[j] * dout[qo + d];
                    }
                }
            }
    }
    free(p);
}
