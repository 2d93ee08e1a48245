/*
 * distill_ref.c: the generalised Jensen-Shannon divergence in double, straight from its
 * definition: log-softmax of both rows, the divergence as KL terms of the mixture, and the
 * gradient through the softmax's Jacobian, dz_j = (g_j - q_j sum_k g_k) / tau; the weighted
 * cross-entropy from the student's log-softmax at temperature 1.
 */
#include "distill_ref.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* log_softmax(x / tau) of one row into out. */
static void log_softmax(const double *x, int64_t v, double tau, double *out)
{
    double m = -INFINITY;
    for (int64_t j = 0; j < v; ++j)
        m = fmax(m, x[j] / tau);
    double s = 0.0;
    for (int64_t j = 0; j < v; ++j)
        s += exp(x[j] / tau - m);
    const double lse = m + log(s);
    for (int64_t j = 0; j < v; ++j)
        out[j] = x[j] / tau - lse;
}

/* a (b - c), 0 when a is 0 whatever the difference. */
static double term(double a, double b, double c) { return a == 0.0 ? 0.0 : a * (b - c); }

/* One row: the divergence, and g_j = d divergence / d X_j into g. */
static double row_divergence(const double *X, const double *Y, int64_t v, double beta, double *g)
{
    double d = 0.0;
    for (int64_t j = 0; j < v; ++j) {
        const double q = exp(X[j]), p = exp(Y[j]);
        if (beta == 0.0) {
            d += term(p, Y[j], X[j]);
            g[j] = -p;
        } else if (beta == 1.0) {
            d += term(q, X[j], Y[j]);
            g[j] = term(q, X[j], Y[j]) + q;
        } else {
            const double m = beta * p + (1.0 - beta) * q, lm = log(m);
            d += beta * term(p, Y[j], lm) + (1.0 - beta) * term(q, X[j], lm);
            g[j] = (1.0 - beta) * term(q, X[j], lm);
        }
    }
    return d;
}

void ref_distill(const double *student, const double *teacher, const int64_t *labels, int64_t n,
                 int64_t v, const ref_distill_opts *o, double *loss, double *dstudent)
{
    double *X = malloc((size_t)v * sizeof *X), *Y = malloc((size_t)v * sizeof *Y);
    double *g = malloc((size_t)v * sizeof *g), *rows = malloc((size_t)n * sizeof *rows);
    double *Z = malloc((size_t)v * sizeof *Z);
    const bool hard = o->ce_weight != 0.0 && labels;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i)
        count += !labels || labels[i] != o->ignore_index;
    const double c = o->reduction == 0 ? (count ? 1.0 / (double)count : 0.0) : 1.0;
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const bool live = !labels || labels[i] != o->ignore_index;
        double *ds = dstudent ? dstudent + i * v : NULL;
        rows[i] = 0.0;
        if (!live) {
            for (int64_t j = 0; ds && j < v; ++j)
                ds[j] = 0.0;
            continue;
        }
        log_softmax(student + i * v, v, o->tau, X);
        log_softmax(teacher + i * v, v, o->tau, Y);
        rows[i] = row_divergence(X, Y, v, o->beta, g);
        if (hard) {
            log_softmax(student + i * v, v, 1.0, Z);
            rows[i] -= o->ce_weight * Z[labels[i]];
        }
        total += rows[i];
        if (!ds)
            continue;
        double sg = 0.0;
        for (int64_t j = 0; j < v; ++j)
            sg += g[j];
        for (int64_t j = 0; j < v; ++j) {
            ds[j] =
                o->grad_scale * c / o->tau * (g[j] - (X[j] == -INFINITY ? 0.0 : exp(X[j]) * sg));
            if (hard)
                ds[j] += o->grad_scale * c * o->ce_weight * (exp(Z[j]) - (j == labels[i]));
        }
    }
    if (o->reduction == 2)
        for (int64_t i = 0; i < n; ++i)
            loss[i] = rows[i];
    else
        loss[0] = o->reduction == 0 ? total * c : total;
    free(X);
    free(Y);
    free(g);
    free(Z);
    free(rows);
}
