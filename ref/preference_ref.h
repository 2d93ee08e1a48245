/* preference_ref.h: CPU reference in double for preference.cl (formulas in llmcl.h). */
#ifndef LLMCL_PREFERENCE_REF_H
#define LLMCL_PREFERENCE_REF_H

#include <stdint.h>

typedef struct ref_pref_opts {
    int loss;             /* 0 DPO, 1 IPO, 2 SimPO, 3 CPO, 4 ORPO (llmcl_pref_loss) */
    double beta, gamma;   /* beta > 0; gamma SimPO's margin */
    double eps;           /* label smoothing of DPO, SimPO and CPO */
    double nll_weight;    /* the chosen sequences' cross-entropy added, times this */
    int average;          /* 1: pi is the mean of a sequence's scored logp; 0: their sum */
    int64_t ignore_index; /* labels equal to it are not scored */
    double grad_scale;    /* the gradient is that of grad_scale x the loss */
} ref_pref_opts;

/*
 * The preference loss of logits [2b t, v] (row-major; sequence s is rows [s t, (s + 1) t), b
 * chosen sequences then their b rejected ones) with labels [2b t]; ref_logps [2b] or NULL (zeros;
 * only DPO and IPO read it). Writes loss (1 value, when non-NULL), logps [2b] (each sequence's pi,
 * when non-NULL) and, when dlogits is non-NULL, the gradient of grad_scale x the loss [2b t, v].
 * Returns the first row whose label is out of range and not ignored (nothing written then), or -1.
 */
int64_t ref_preference(const double *logits, const int64_t *labels, int64_t b, int64_t t,
                       int64_t v, const ref_pref_opts *o, const double *ref_logps, double *loss,
                       double *logps, double *dlogits);

#endif
