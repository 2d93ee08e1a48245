/* glu_ref.c: see glu_ref.h. Straight formulas in double. */
#include "glu_ref.h"

#include <math.h>

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715
#define INV_SQRT_2PI 0.39894228040143267794

double glu_ref_act(llmcl_activation act, double x)
{
    switch (act) {
    case LLMCL_ACT_SILU: return x / (1.0 + exp(-x));
    case LLMCL_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(GELU_K0 * (x + GELU_K1 * x * x * x)));
    case LLMCL_ACT_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    }
    return NAN;
}

double glu_ref_act_grad(llmcl_activation act, double x)
{
    switch (act) {
    case LLMCL_ACT_SILU: {
        const double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 + x * (1.0 - s));
    }
    case LLMCL_ACT_GELU_TANH: {
        const double t = tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * x * x);
    }
    case LLMCL_ACT_GELU_ERF:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * INV_SQRT_2PI;
    }
    return NAN;
}

void glu_ref_forward(llmcl_activation act, const double *g, const double *u, double *o, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        o[i] = glu_ref_act(act, g[i]) * (u ? u[i] : 1.0);
}

void glu_ref_backward(llmcl_activation act, const double *dy, const double *g, const double *u,
                      double *dg, double *du, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        const double da = glu_ref_act_grad(act, g[i]);
        if (u) {
            const double a = glu_ref_act(act, g[i]);
            dg[i] = dy[i] * u[i] * da;
            du[i] = dy[i] * a;
        } else {
            dg[i] = dy[i] * da;
        }
    }
}
