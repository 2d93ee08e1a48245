/*
 * optimizer.h: llmcl-train's optimizer: every trainable parameter of a model in one
 * llmcl_adamw_step call (the trainable set's flat buffers make it one launch), global-norm
 * clipping read on the device, and the hyperparameters of a run. Under --offload-optimizer one
 * call per chunk of the masters and moments streamed through the device (offload_state.h), after
 * the one norm of all gradients. With the model's optimizer_in_backward one call per layer group,
 * made from inside model_backward as soon as the group's gradients are final, after which the
 * group's gradients are zeroed for the next group that uses their memory; no clipping then, since
 * the global norm needs every gradient first.
 */
#ifndef LLMCL_TRAIN_OPTIMIZER_H
#define LLMCL_TRAIN_OPTIMIZER_H

#include "model.h"

typedef struct adamw_hparams {
    float beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; 0: off */
    uint64_t seed;
} adamw_hparams;

typedef struct optimizer {
    model *m;
    adamw_hparams hp;
    int count;                  /* trainable tensors */
    llmcl_adamw_tensor *tensors; /* the step's; with offloaded state a chunk's, made per chunk */
    const llmcl_tensor **grads;
    llmcl_tensor *grad_norm; /* f32 [1]: the norm of the accumulated gradients */
    float zero_norm;         /* under --zero: the last step's norm, from llmcl_dist_step */
    llmcl_adamw_opts step;   /* the step that optimizer_prepare set */
    int micro;               /* its micro-batches */
    bool norm_wanted;        /* optimizer_last_norm follows it */
    /* with optimizer_in_backward: per group its tensors, tensors[first[g]] on, count[g] of them,
       and the norm of its gradients (a view of group_norms, f32 [groups]) */
    int *first, *group_count;
    llmcl_tensor *group_norms, **group_norm;
    /* the squares of the gradients that weight gradient products finish (model's grad_sumsq),
       on one rank with the update after the backward, NULL otherwise; with it the list of the
       gradients no product finished, made for each norm */
    llmcl_sumsq *sumsq;
    const llmcl_tensor **unsummed;
} optimizer;

/*
 * The optimizer of m's trainable set. With m->cfg.optimizer_in_backward it sets m->on_group_grads
 * (hp->clip must then be 0: the run ends otherwise).
 */
llmcl_status optimizer_create(model *m, const adamw_hparams *hp, optimizer *out);
void optimizer_destroy(optimizer *o);

/*
 * Sets the coming step: learning rate lr, its number (from 1), the micro-batches whose gradients
 * it sums (each a mean loss, so they are scaled by 1 / micro); norm: optimizer_last_norm will be
 * asked for its gradients' norm, which the step then computes even without clipping (a read of
 * every gradient, skipped on the steps that print nothing).
 */
void optimizer_prepare(optimizer *o, float lr, int64_t step, int micro, bool norm);

/* What the prepared step's last micro-batch gives the model's grad_sumsq: the accumulator where
   the step takes the gradients' norm and o has one, else NULL. */
llmcl_sumsq *optimizer_norm_sumsq(const optimizer *o);

/*
 * The step prepared, on the accumulated gradients, clipped to hp.clip. Under --zero:
 * llmcl_dist_step (collective) on the gradients summed over the ranks, scaled by
 * 1 / (micro x ranks), then llmcl_dist_zero_grads. With optimizer_in_backward the backward has
 * updated every group (micro must be 1): this only completes the norm, from the groups' norms.
 */
llmcl_status optimizer_step(optimizer *o);

/* The global norm of the last step's gradients, scaled as the update saw them (waits). */
llmcl_status optimizer_last_norm(optimizer *o, double *norm);

#endif
