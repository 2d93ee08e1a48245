/* matmul_ref.c: the matrix multiply in double (see matmul_ref.h). */
#include <math.h>

#include "matmul_ref.h"

/* out = sum_k f(a[m][k]) f(b[k][n]) with f the identity or fabs. */
static double dot(const double *a, const double *b, int64_t n, int64_t k, int absolute)
{
    double s = 0.0;
    for (int64_t i = 0; i < k; ++i)
        s += absolute ? fabs(a[i]) * fabs(b[i * n]) : a[i] * b[i * n];
    return s;
}

void matmul_ref(int64_t batch, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                int a_batched, const double *b, int b_batched, double beta, const double *bias,
                int bias_mode, double *c)
{
    for (int64_t z = 0; z < batch; ++z) {
        const double *az = a + (a_batched ? z * m * k : 0), *bz = b + (b_batched ? z * k * n : 0);
        double *cz = c + z * m * n;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double v = alpha * dot(az + i * k, bz + j, n, k, 0);
                if (bias_mode)
                    v += bias[bias_mode == 1 ? j : i];
                if (beta != 0.0)
                    v += beta * cz[i * n + j];
                cz[i * n + j] = v;
            }
    }
}

void matmul_ref_abs(int64_t batch, int64_t m, int64_t n, int64_t k, const double *a, int a_batched,
                    const double *b, int b_batched, double *out)
{
    for (int64_t z = 0; z < batch; ++z)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                out[(z * m + i) * n + j] = dot(a + (a_batched ? z * m * k : 0) + i * k,
                                               b + (b_batched ? z * k * n : 0) + j, n, k, 1);
}
