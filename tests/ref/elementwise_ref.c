/* elementwise_ref.c: CPU references in double for elementwise.cl. */
#include "elementwise_ref.h"

void ref_axpy(double alpha, const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        y[i] += alpha * x[i];
}

void ref_mul(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        y[i] *= x[i];
}
