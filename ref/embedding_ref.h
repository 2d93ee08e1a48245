/*
 * embedding_ref.h: token embeddings in double, the CPU reference of embedding.cl (shared by
 * tests/test_embedding.c and llmcl-train's tests).
 */
#ifndef LLMCL_EMBEDDING_REF_H
#define LLMCL_EMBEDDING_REF_H

#include <stdint.h>

/* out[i, :] = w[ids[i], :] for n ids, rows of h. */
void embedding_ref_forward(const int64_t *ids, int64_t n, const double *w, int64_t h, double *out);

/* dw[ids[i], :] += dout[i, :] for n ids, in increasing i. */
void embedding_ref_backward(const int64_t *ids, int64_t n, const double *dout, int64_t h,
                            double *dw);

#endif
