/*
 * norm_ref.h: CPU references in double for the norm family (RMSNorm, residual + RMSNorm,
 * LayerNorm), used by tests/test_norm.c and llmcl-bench. Rows are contiguous: n rows of H values.
 * xdt is the activations' storage dtype: the references round where the kernels' casting mode
 * rounds (llama casting, the residual sum), so they model the same computation.
 */
#ifndef LLMCL_NORM_REF_H
#define LLMCL_NORM_REF_H

#include <stdint.h>

#include "llmcl.h"

/* v rounded to dtype's storage (f32, bf16 or f16). */
double norm_ref_round(llmcl_dtype dtype, double v);

/*
 * RMSNorm forward. With res non-NULL: r = round(x + res) is written to r_out (when non-NULL) and
 * normalised instead of x. llama: round(x * rstd) to xdt before the weight; else all in double.
 */
void norm_ref_rmsnorm_fwd(const double *x, const double *res, double *r_out, const double *w,
                          double *y, double *rstd, int64_t n, int64_t H, double eps, double offset,
                          int llama, llmcl_dtype xdt);

/* RMSNorm backward from the forward's input x (or r) and saved rstd; dr (or NULL) is added to dx. */
void norm_ref_rmsnorm_bwd(const double *dy, const double *dr, const double *x, const double *w,
                          const double *rstd, double *dx, double *dw, int64_t n, int64_t H,
                          double offset, int llama, llmcl_dtype xdt);

/* LayerNorm forward; b may be NULL. */
void norm_ref_layernorm_fwd(const double *x, const double *w, const double *b, double *y,
                            double *mean, double *rstd, int64_t n, int64_t H, double eps);

/* LayerNorm backward from x and saved mean, rstd; db may be NULL. */
void norm_ref_layernorm_bwd(const double *dy, const double *x, const double *w, const double *mean,
                            const double *rstd, double *dx, double *dw, double *db, int64_t n,
                            int64_t H);

#endif
