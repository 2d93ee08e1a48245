/*
 * optimizer.h: llmcl-train's optimizer: every trainable parameter of a model in one
 * llmcl_adamw_step call (the trainable set's flat buffers make it one launch), global-norm
 * clipping read on the device, and the hyperparameters of a run. Under --offload-optimizer one
 * call per chunk of the masters and moments streamed through the device (offload_state.h), after
 * the one norm of all gradients.
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
} optimizer;

llmcl_status optimizer_create(model *m, const adamw_hparams *hp, optimizer *out);
void optimizer_destroy(optimizer *o);

/*
 * Sets the coming step: learning rate lr, its number (from 1), the micro-batches whose gradients
 * it sums (each a mean loss, so they are scaled by 1 / micro); norm: optimizer_last_norm will be
 * asked for its gradients' norm, which the step then computes even without clipping (a read of
 * every gradient, skipped on the steps that print nothing).
 */
void optimizer_prepare(optimizer *o, float lr, int64_t step, int micro, bool norm);

/*
 * The step prepared, on the accumulated gradients, clipped to hp.clip. Under --zero:
 * llmcl_dist_step (collective) on the gradients summed over the ranks, scaled by
 * 1 / (micro x ranks), then llmcl_dist_zero_grads.
 */
llmcl_status optimizer_step(optimizer *o);

/* The global norm of the last step's gradients, scaled as the update saw them (waits). */
llmcl_status optimizer_last_norm(optimizer *o, double *norm);

#endif
