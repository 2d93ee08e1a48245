/*
 * preference_ref.c: the preference losses in double, straight from llmcl.h's formulas: the
 * log-softmax of each row, each sequence's pi, each pair's term and its derivatives with respect
 * to the pair's chosen and rejected pi, then each position's upstream gradient g_i of -logp_i,
 * and d loss / d z_ij = g_i (softmax_ij - [j == y_i]). A factor of 0 zeroes an infinite term
 * (sigmoid's tails: ORPO's pair whose chosen pi is 0 counts 0 and gives no gradient); ORPO with
 * both pi of a pair 0 has no log odds ratio (inf - inf) and gives NaN.
 */
#include "preference_ref.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* a b, but 0 when a is 0 even if b is infinite. */
static double mul0(double a, double b) { return a == 0.0 ? 0.0 : a * b; }

static double sigmoid(double z)
{
    return z >= 0.0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
}

/* log sigmoid(z) without overflow. */
static double log_sigmoid(double z) { return z >= 0.0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }

/* log(1 - e^c) for c <= 0, accurate near 0 (expm1) and far below (log1p); -inf at c = 0. */
static double log1mexp(double c)
{
    return c > -0.6931471805599453 ? log(-expm1(c)) : log1p(-exp(c));
}

/* d / dc of c - log(1 - e^c) = 1 / (1 - e^c); +inf at c = 0. */
static double odds_slope(double c) { return c == 0.0 ? INFINITY : 1.0 / -expm1(c); }

/* The smoothed logistic loss -(1 - eps) log sigmoid(z) - eps log sigmoid(-z), and its slope. */
static double smoothed(double z, double eps, double *slope)
{
    *slope = -mul0(1.0 - eps, sigmoid(-z)) + mul0(eps, sigmoid(z));
    return -mul0(1.0 - eps, log_sigmoid(z)) - mul0(eps, log_sigmoid(-z));
}

/* One pair's term from its chosen and rejected pi (c, r) and the reference's (rc, rr); its
   derivatives with respect to c and r into dc and dr. */
static double pair_term(const ref_pref_opts *o, double c, double r, double rc, double rr,
                        double *dc, double *dr)
{
    double z, slope, term;
    switch (o->loss) {
    case 0: /* DPO */
        z = o->beta * ((c - rc) - (r - rr));
        term = smoothed(z, o->eps, &slope);
        *dc = o->beta * slope, *dr = -o->beta * slope;
        return term;
    case 1: { /* IPO */
        const double d = (c - rc) - (r - rr) - 1.0 / (2.0 * o->beta);
        *dc = 2.0 * d, *dr = -2.0 * d;
        return d * d;
    }
    case 2: /* SimPO */
    case 3: /* CPO */
        z = o->beta * (c - r) - (o->loss == 2 ? o->gamma : 0.0);
        term = smoothed(z, o->eps, &slope);
        *dc = o->beta * slope, *dr = -o->beta * slope;
        return term;
    default: /* ORPO: z is the log odds ratio */
        z = (c - r) - log1mexp(c) + log1mexp(r);
        slope = -o->beta * sigmoid(-z);
        *dc = mul0(slope, odds_slope(c)), *dr = mul0(slope, -odds_slope(r));
        return -o->beta * log_sigmoid(z);
    }
}

int64_t ref_preference(const double *logits, const int64_t *labels, int64_t b, int64_t t,
                       int64_t v, const ref_pref_opts *o, const double *ref_logps, double *loss,
                       double *logps, double *dlogits)
{
    const int64_t n = 2 * b * t, ns = 2 * b;
    for (int64_t i = 0; i < n; ++i)
        if (labels[i] != o->ignore_index && (labels[i] < 0 || labels[i] >= v))
            return i;
    double *lse = calloc((size_t)n + 1, sizeof *lse), *lp = calloc((size_t)n + 1, sizeof *lp);
    double *pi = calloc((size_t)ns + 1, sizeof *pi), *cnt = calloc((size_t)ns + 1, sizeof *cnt);
    double *dpi = calloc((size_t)ns + 1, sizeof *dpi);
    double nll = 0.0, n_chosen = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double *x = logits + i * v;
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < v; ++j)
            m = fmax(m, x[j]);
        for (int64_t j = 0; j < v && m != -INFINITY; ++j)
            s += exp(x[j] - m);
        lse[i] = m + log(s);
        if (labels[i] == o->ignore_index)
            continue;
        lp[i] = lse[i] == -INFINITY ? -INFINITY : x[labels[i]] - lse[i];
        pi[i / t] += lp[i];
        cnt[i / t] += 1.0;
        if (i / t < b) {
            nll -= lp[i];
            n_chosen += 1.0;
        }
    }
    for (int64_t s = 0; s < ns && o->average; ++s)
        pi[s] = cnt[s] != 0.0 ? pi[s] / cnt[s] : 0.0;
    double total = 0.0;
    for (int64_t p = 0; p < b; ++p) {
        const bool with_ref = ref_logps && o->loss <= 1;
        const double rc = with_ref ? ref_logps[p] : 0.0, rr = with_ref ? ref_logps[b + p] : 0.0;
        double dc, dr;
        total += pair_term(o, pi[p], pi[b + p], rc, rr, &dc, &dr);
        dpi[p] = dc / (double)b;
        dpi[b + p] = dr / (double)b;
    }
    const double nll_mean = n_chosen != 0.0 ? nll / n_chosen : 0.0;
    if (loss)
        *loss = total / (double)b + mul0(o->nll_weight, nll_mean);
    for (int64_t s = 0; logps && s < ns; ++s)
        logps[s] = pi[s];
    for (int64_t i = 0; dlogits && i < n; ++i) {
        const int64_t s = i / t, y = labels[i];
        double *d = dlogits + i * v;
        double g = 0.0; /* d loss / d (-logp_i) */
        if (y != o->ignore_index) {
            g = -(o->average ? dpi[s] / cnt[s] : dpi[s]);
            if (s < b)
                g += mul0(o->nll_weight, 1.0 / n_chosen);
            g *= o->grad_scale;
        }
        for (int64_t j = 0; j < v; ++j) {
            const double p = lse[i] == -INFINITY ? 0.0 : exp(logits[i * v + j] - lse[i]);
            d[j] = mul0(g, p - (j == y ? 1.0 : 0.0));
        }
    }
    free(lse), free(lp), free(pi), free(cnt), free(dpi);
    return -1;
}
