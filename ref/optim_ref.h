/* optim_ref.h: CPU references in double for optim.cl (AdamW, the global gradient norm). */
#ifndef LLMCL_OPTIM_REF_H
#define LLMCL_OPTIM_REF_H

#include <stddef.h>
#include <stdint.h>

typedef struct ref_adamw_hp {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;
} ref_adamw_hp;

/*
 * One torch.optim.AdamW step on n elements, in place on w, m and v: g is the gradient already
 * multiplied by every scale (grad_scale, the clip coefficient). decay: 0 skips the weight decay.
 */
void ref_adamw(double *w, double *m, double *v, const double *g, size_t n, const ref_adamw_hp *hp,
               int decay);

/* torch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6)). */
double ref_clip_coef(double norm, double max_norm);

/* The sum of squares of x. */
double ref_sum_squares(const double *x, size_t n);

#endif
