/* elementwise_ref.h: CPU references in double for elementwise.cl. */
#ifndef LLMCL_ELEMENTWISE_REF_H
#define LLMCL_ELEMENTWISE_REF_H

#include <stddef.h>

/* y[i] += alpha * x[i] */
void ref_axpy(double alpha, const double *x, double *y, size_t n);

/* y[i] *= x[i] */
void ref_mul(const double *x, double *y, size_t n);

/* y[i] = (x[0][i] + ... + x[rows-1][i]) + beta y[i], row q at x + q stride (beta 0: y unread) */
void ref_sum_rows(const double *x, size_t rows, size_t stride, double beta, double *y, size_t n);

#endif
