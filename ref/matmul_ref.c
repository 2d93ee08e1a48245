/* matmul_ref.c: the matrix multiply in double (see matmul_ref.h). */
#include <math.h>
#include <stdlib.h>

#include "matmul_ref.h"

/*
 * row[j] = sum_k f(a[k]) f(b[k][j]) with f the identity or fabs, row by row of b: contiguous reads
 * that the compiler vectorises, where a column walk of b would miss the cache at each k.
 */
static void row_times(const double *a, const double *b, int64_t n, int64_t k, int absolute,
                      double *row)
{
    for (int64_t j = 0; j < n; ++j)
        row[j] = 0.0;
    for (int64_t i = 0; i < k; ++i) {
        const double ai = absolute ? fabs(a[i]) : a[i];
        const double *bi = b + i * n;
        if (absolute)
            for (int64_t j = 0; j < n; ++j)
                row[j] += ai * fabs(bi[j]);
        else
            for (int64_t j = 0; j < n; ++j)
                row[j] += ai * bi[j];
    }
}

void matmul_ref(int64_t batch, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                int a_batched, const double *b, int b_batched, double beta, const double *bias,
                int bias_mode, double *c)
{
    double *row = malloc((size_t)(n > 0 ? n : 1) * sizeof *row);
    if (!row)
        abort();
    for (int64_t z = 0; z < batch; ++z) {
        const double *az = a + (a_batched ? z * m * k : 0), *bz = b + (b_batched ? z * k * n : 0);
        double *cz = c + z * m * n;
        for (int64_t i = 0; i < m; ++i) {
            row_times(az + i * k, bz, n, k, 0, row);
            for (int64_t j = 0; j < n; ++j) {
                double v = alpha * row[j];
                if (bias_mode)
                    v += bias[bias_mode == 1 ? j : i];
                if (beta != 0.0)
                    v += beta * cz[i * n + j];
                cz[i * n + j] = v;
            }
        }
    }
    free(row);
}

void matmul_ref_abs(int64_t batch, int64_t m, int64_t n, int64_t k, const double *a, int a_batched,
                    const double *b, int b_batched, double *out)
{
    for (int64_t z = 0; z < batch; ++z)
        for (int64_t i = 0; i < m; ++i)
            row_times(a + (a_batched ? z * m * k : 0) + i * k, b + (b_batched ? z * k * n : 0),
                      n, k, 1, out + (z * m + i) * n);
}
