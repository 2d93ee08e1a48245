/*
 * norm_ref.c: double-precision references for RMSNorm, residual + RMSNorm and LayerNorm (see
 * norm_ref.h). Straightforward loops over rows: clarity over speed.
 */
#include "norm_ref.h"

#include <math.h>

double norm_ref_round(llmcl_dtype dtype, double v)
{
    switch (dtype) {
    case LLMCL_BF16:
        return llmcl_bf16_to_f32(llmcl_f32_to_bf16((float)v));
    case LLMCL_F16:
        return llmcl_f16_to_f32(llmcl_f32_to_f16((float)v));
    default:
        return (float)v;
    }
}

void norm_ref_rmsnorm_fwd(const double *x, const double *res, double *r_out, const double *w,
                          double *y, double *rstd, int64_t n, int64_t H, double eps, double offset,
                          int llama, llmcl_dtype xdt)
{
    for (int64_t row = 0; row < n; ++row) {
        const double *xr = x + row * H;
        double ss = 0.0;
        for (int64_t i = 0; i < H; ++i) {
            double v = xr[i];
            if (res) {
                v = norm_ref_round(xdt, v + res[row * H + i]);
                if (r_out)
                    r_out[row * H + i] = v;
            }
            ss += v * v;
        }
        const double rs = 1.0 / sqrt(ss / (double)H + eps);
        rstd[row] = rs;
        for (int64_t i = 0; i < H; ++i) {
            const double v = res ? norm_ref_round(xdt, xr[i] + res[row * H + i]) : xr[i];
            const double nv = llama ? norm_ref_round(xdt, v * rs) : v * rs;
            y[row * H + i] = nv * (w[i] + offset);
        }
    }
}

void norm_ref_rmsnorm_bwd(const double *dy, const double *dr, const double *x, const double *w,
                          const double *rstd, double *dx, double *dw, int64_t n, int64_t H,
                          double offset, int llama, llmcl_dtype xdt)
{
    for (int64_t i = 0; i < H; ++i)
        dw[i] = 0.0;
    for (int64_t row = 0; row < n; ++row) {
        const double *g = dy + row * H, *xr = x + row * H;
        const double rs = rstd[row];
        double d = 0.0;
        for (int64_t i = 0; i < H; ++i) {
            const double m = g[i] * (w[i] + offset);
            d += (llama ? norm_ref_round(xdt, m) : m) * xr[i];
        }
        const double cf = d * rs * rs / (double)H;
        for (int64_t i = 0; i < H; ++i) {
            double m = g[i] * (w[i] + offset);
            if (llama)
                m = norm_ref_round(xdt, m);
            dx[row * H + i] = rs * (m - xr[i] * cf) + (dr ? dr[row * H + i] : 0.0);
            const double nv = llama ? norm_ref_round(xdt, xr[i] * rs) : xr[i] * rs;
            dw[i] += g[i] * nv;
        }
    }
}

void norm_ref_layernorm_fwd(const double *x, const double *w, const double *b, double *y,
                            double *mean, double *rstd, int64_t n, int64_t H, double eps)
{
    for (int64_t row = 0; row < n; ++row) {
        const double *xr = x + row * H;
        double s = 0.0, q = 0.0;
        for (int64_t i = 0; i < H; ++i)
            s += xr[i];
        const double mu = s / (double)H;
        for (int64_t i = 0; i < H; ++i)
            q += (xr[i] - mu) * (xr[i] - mu);
        const double rs = 1.0 / sqrt(q / (double)H + eps);
        mean[row] = mu;
        rstd[row] = rs;
        for (int64_t i = 0; i < H; ++i)
            y[row * H + i] = (xr[i] - mu) * rs * w[i] + (b ? b[i] : 0.0);
    }
}

void norm_ref_layernorm_bwd(const double *dy, const double *x, const double *w, const double *mean,
                            const double *rstd, double *dx, double *dw, double *db, int64_t n,
                            int64_t H)
{
    for (int64_t i = 0; i < H; ++i) {
        dw[i] = 0.0;
        if (db)
            db[i] = 0.0;
    }
    for (int64_t row = 0; row < n; ++row) {
        const double *g = dy + row * H, *xr = x + row * H;
        const double mu = mean[row], rs = rstd[row];
        double s1 = 0.0, s2 = 0.0;
        for (int64_t i = 0; i < H; ++i) {
            s1 += g[i] * w[i];
            s2 += g[i] * w[i] * (xr[i] - mu) * rs;
        }
        s1 /= (double)H;
        s2 /= (double)H;
        for (int64_t i = 0; i < H; ++i) {
            const double xh = (xr[i] - mu) * rs;
            dx[row * H + i] = rs * (g[i] * w[i] - s1 - xh * s2);
            dw[i] += g[i] * xh;
            if (db)
                db[i] += g[i];
        }
    }
}
