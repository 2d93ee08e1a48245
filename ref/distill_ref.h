/* distill_ref.h: CPU references in double for distill.cl (formulas in llmcl.h). */
#ifndef LLMCL_DISTILL_REF_H
#define LLMCL_DISTILL_REF_H

#include <stdint.h>

typedef struct ref_distill_opts {
    double beta, tau;     /* beta in [0, 1], temperature > 0 */
    int reduction;        /* 0 mean, 1 sum, 2 none */
    int64_t ignore_index; /* rows whose label equals it count for nothing */
    double grad_scale;    /* the gradient is that of grad_scale x the loss */
    double ce_weight;     /* each row adds ce_weight x the student's cross-entropy (tau 1) */
} ref_distill_opts;

/*
 * The generalised JSD of student and teacher logits [n, v] (row-major), plus the weighted
 * cross-entropy; labels [n] or NULL (every row counts; no cross-entropy). Writes loss (1 value, or
 * n for none) and, when dstudent is non-NULL, the gradient of the reduced loss with respect to the
 * student's logits [n, v].
 */
void ref_distill(const double *student, const double *teacher, const int64_t *labels, int64_t n,
                 int64_t v, const ref_distill_opts *o, double *loss, double *dstudent);

#endif
