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

void ref_sum_rows(const double *x, size_t rows, size_t stride, double beta, double *y, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        double s = 0.0;
        for (size_t q = 0; q < rows; ++q)
            s += x[q * stride + i];
        y[i] = beta != 0.0 ? s + beta * y[i] : s;
    }
}
