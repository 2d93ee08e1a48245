/* cross_entropy_ref.h: CPU references in double for cross_entropy.cl (formulas in llmcl.h). */
#ifndef LLMCL_CROSS_ENTROPY_REF_H
#define LLMCL_CROSS_ENTROPY_REF_H

#include <stdint.h>

typedef struct ref_ce_opts {
    int64_t ignore_index;
    int reduction;        /* 0 mean, 1 sum, 2 none */
    double eps, zs, cap;  /* label smoothing, z-loss scale, softcap (0: off) */
    const double *weight; /* class weights [v] or NULL */
} ref_ce_opts;

/*
 * Cross-entropy of logits [n, v] (row-major). Writes loss and zloss (1 value, or n for none), lse
 * [n] and, when dlogits is non-NULL, the gradient of the reduced loss [n, v]. Returns the first row
 * whose label is out of range and not ignored (nothing written then), or -1.
 */
int64_t ref_cross_entropy(const double *logits, const int64_t *labels, int64_t n, int64_t v,
                          const ref_ce_opts *o, double *loss, double *zloss, double *lse,
                          double *dlogits);

/* logits [n, v] = hidden [n, h] x w [v, h]^T (+ bias [v] when non-NULL). */
void ref_linear(const double *hidden, const double *w, const double *bias, int64_t n, int64_t h,
                int64_t v, double *logits);

/* From the logit gradient g [n, v]: dhidden = g x w, dw = g^T x hidden, dbias = column sums. */
void ref_linear_backward(const double *g, const double *hidden, const double *w, int64_t n,
                         int64_t h, int64_t v, double *dhidden, double *dw, double *dbias);

#endif
