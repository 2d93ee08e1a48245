/* optim_ref.c: CPU references in double for optim.cl. */
#include "optim_ref.h"

#include <math.h>

void ref_adamw(double *w, double *m, double *v, const double *g, size_t n, const ref_adamw_hp *hp,
               int decay)
{
    const double bc1 = 1.0 - pow(hp->beta1, (double)hp->step);
    const double bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
    for (size_t i = 0; i < n; ++i) {
        if (decay)
            w[i] *= 1.0 - hp->lr * hp->weight_decay;
        m[i] = hp->beta1 * m[i] + (1.0 - hp->beta1) * g[i];
        v[i] = hp->beta2 * v[i] + (1.0 - hp->beta2) * g[i] * g[i];
        w[i] -= hp->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + hp->eps);
    }
}

double ref_clip_coef(double norm, double max_norm)
{
    const double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

double ref_sum_squares(const double *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; ++i)
        s += x[i] * x[i];
    return s;
}
