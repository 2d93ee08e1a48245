/* elementwise_ref.h: CPU references in double for elementwise.cl. */
#ifndef LLMCL_ELEMENTWISE_REF_H
#define LLMCL_ELEMENTWISE_REF_H

#include <stddef.h>

/* y[i] += alpha * x[i] */
void ref_axpy(double alpha, const double *x, double *y, size_t n);

/* y[i] *= x[i] */
void ref_mul(const double *x, double *y, size_t n);

#endif
