/* cross_entropy_ref.c: CPU references in double for cross_entropy.cl, written from PyTorch's
 * definition (log-softmax, nll with weights, smoothing over all classes) rather than the kernels'
 * rearranged coefficients, with llmcl.h's rules for -inf logits: a term with a factor of 0 is 0,
 * and a row of -inf logits has lse -inf, -log p_j = +inf and a zero gradient. */
#include <math.h>
#include <stdlib.h>

#include "cross_entropy_ref.h"

/* a b, but 0 when a is 0 even if b is infinite. */
static double mul0(double a, double b) { return a == 0.0 ? 0.0 : a * b; }

/* -log p of logit x in a row of logsumexp l: +inf on a row of -inf logits (l = -inf). */
static double neg_log_p(double x, double l) { return l == -INFINITY ? INFINITY : l - x; }

int64_t ref_cross_entropy(const double *logits, const int64_t *labels, int64_t n, int64_t v,
                          const ref_ce_opts *o, double *loss, double *zloss, double *lse,
                          double *dlogits)
{
    for (int64_t i = 0; i < n; ++i)
        if (labels[i] != o->ignore_index && (labels[i] < 0 || labels[i] >= v))
            return i;
    const size_t nv = v > 0 ? (size_t)v : 1, nn = n > 0 ? (size_t)n : 1;
    double *x = malloc(nv * sizeof *x), *ce = calloc(nn, sizeof *ce), *z = calloc(nn, sizeof *z);
    double dw = 0.0, dn = 0.0, sw = 0.0;
    for (int64_t j = 0; j < v; ++j)
        sw += o->weight ? o->weight[j] : 1.0;
    for (int64_t i = 0; i < n; ++i) {
        if (labels[i] == o->ignore_index)
            continue;
        dn += 1.0;
        dw += o->weight ? o->weight[labels[i]] : 1.0;
    }
    const double c = o->reduction == 0 ? (dw != 0.0 ? 1.0 / dw : 0.0) : 1.0;
    const double cz = o->reduction == 0 ? (dn != 0.0 ? 1.0 / dn : 0.0) : 1.0;
    double total_ce = 0.0, total_z = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double *zr = logits + i * v;
        double mx = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < v; ++j) {
            x[j] = o->cap > 0.0 ? o->cap * tanh(zr[j] / o->cap) : zr[j];
            mx = fmax(mx, x[j]);
        }
        for (int64_t j = 0; j < v && mx != -INFINITY; ++j)
            s += exp(x[j] - mx);
        const double l = mx + log(s);
        lse[i] = l;
        const int64_t y = labels[i];
        const int live = y != o->ignore_index;
        if (live) {
            const double wy = o->weight ? o->weight[y] : 1.0;
            double smooth = 0.0;
            for (int64_t j = 0; j < v; ++j)
                smooth += mul0(o->weight ? o->weight[j] : 1.0, neg_log_p(x[j], l));
            ce[i] = mul0((1.0 - o->eps) * wy, neg_log_p(x[y], l)) +
                    mul0(o->eps / (double)v, smooth);
            z[i] = mul0(o->zs, l * l);
        }
        total_ce += ce[i];
        total_z += z[i];
        if (!dlogits)
            continue;
        for (int64_t j = 0; j < v; ++j) {
            double g = 0.0;
            if (live && l != -INFINITY) {
                const double p = exp(x[j] - l), wj = o->weight ? o->weight[j] : 1.0;
                const double wy = o->weight ? o->weight[y] : 1.0;
                const double d_nll = wy * (p - (j == y ? 1.0 : 0.0));
                const double d_smooth = sw * p - wj;
                const double d_z = 2.0 * o->zs * l * p;
                g = c * ((1.0 - o->eps) * d_nll + o->eps / (double)v * d_smooth) + cz * d_z;
                if (o->cap > 0.0)
                    g *= 1.0 - (x[j] / o->cap) * (x[j] / o->cap);
            }
            dlogits[i * v + j] = g;
        }
    }
    if (o->reduction == 2) {
        for (int64_t i = 0; i < n; ++i) {
            loss[i] = ce[i] + z[i];
            zloss[i] = z[i];
        }
    } else {
        loss[0] = mul0(c, total_ce) + mul0(cz, total_z);
        zloss[0] = mul0(cz, total_z);
    }
    free(x);
    free(ce);
    free(z);
    return -1;
}

void ref_linear(const double *hidden, const double *w, const double *bias, int64_t n, int64_t h,
                int64_t v, double *logits)
{
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < v; ++j) {
            double s = bias ? bias[j] : 0.0;
            for (int64_t k = 0; k < h; ++k)
                s += hidden[i * h + k] * w[j * h + k];
            logits[i * v + j] = s;
        }
}

void ref_linear_backward(const double *g, const double *hidden, const double *w, int64_t n,
                         int64_t h, int64_t v, double *dhidden, double *dw, double *dbias)
{
    for (int64_t i = 0; i < n * h; ++i)
        dhidden[i] = 0.0;
    for (int64_t i = 0; i < v * h; ++i)
        dw[i] = 0.0;
    for (int64_t j = 0; j < v; ++j)
        dbias[j] = 0.0;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < v; ++j) {
            const double gij = g[i * v + j];
            if (gij == 0.0)
                continue;
            dbias[j] += gij;
            for (int64_t k = 0; k < h; ++k) {
                dhidden[i * h + k] += gij * w[j * h + k];
                dw[j * h + k] += gij * hidden[i * h + k];
            }
        }
}
