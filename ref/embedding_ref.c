/* embedding_ref.c: token embeddings in double (see embedding_ref.h). */
#include "embedding_ref.h"

void embedding_ref_forward(const int64_t *ids, int64_t n, const double *w, int64_t h, double *out)
{
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < h; ++j)
            out[i * h + j] = w[ids[i] * h + j];
}

void embedding_ref_backward(const int64_t *ids, int64_t n, const double *dout, int64_t h,
                            double *dw)
{
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < h; ++j)
            dw[ids[i] * h + j] += dout[i * h + j];
}
