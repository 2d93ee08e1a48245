/*
 * matmul_ref.h: the matrix multiply in double, the CPU reference of matmul.cl (shared by
 * tests/test_matmul.c and llmcl-bench). Operands are dense logical arrays: a [batch][M][K],
 * b [batch][K][N], c [batch][M][N], each with a batch of 1 (one matrix for every entry) when its
 * *_batched flag is 0.
 */
#ifndef LLMCL_MATMUL_REF_H
#define LLMCL_MATMUL_REF_H

#include <stdint.h>

/*
 * c = alpha a b + beta c + bias; bias_mode 0 none, 1 bias[n], 2 bias[m]; beta 0 ignores c's
 * contents (NaN included), as llmcl_matmul does.
 */
void matmul_ref(int64_t batch, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                int a_batched, const double *b, int b_batched, double beta, const double *bias,
                int bias_mode, double *c);

/* sum_k |a[m][k]| |b[k][n]| per output element: the scale of its rounding error. */
void matmul_ref_abs(int64_t batch, int64_t m, int64_t n, int64_t k, const double *a, int a_batched,
                    const double *b, int b_batched, double *out);

#endif
