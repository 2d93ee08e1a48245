/*
 * zero.h: llmcl-train under --zero (built only with MPI): the model's parameters live in an
 * llmcl_dist over MPI_COMM_WORLD instead of the model's own flat buffers, sharded by ZeRO stage 1,
 * 2 or 3. model.c opens a layer group before it computes with it and closes it after, which is
 * where llmcl_dist gathers (stage 3) and reduce-scatters gradients (stages 2, 3).
 *
 * Groups, in forward order: 0 holds the embedding; group l + 1 holds layer l; the final norm and
 * the head make the head group (model_head_group), the last one, L + 1, with an untied head, so
 * that no group holds two vocabulary-sized matrices: llmcl_dist's buckets, gather buffers and
 * NCCL staging are sized by the largest group (Llama-3-8B's embedding and head together would
 * double them, 1.05B elements). A
 * tied head is the embedding: the head group is then group 0, used at both ends of the forward:
 * the forward opens it for the embedding, then again for the final norm and the head (with its
 * gradients, which the forward's cross-entropy writes), and keeps it open into the backward's
 * start (the final norm), so stage 3 gathers it twice a micro-batch. Its gradients are reduced
 * in two parts: the head's and the final norm's before the layers' backward, the embedding's
 * after it (a reduction is a sum, so the parts add up in the gradient shard).
 *
 * With --zero-group-layers K the dist's groups hold K consecutive layers each (the embedding's
 * and the head's stay alone): model.c still opens and closes a layer at a time, and the dist
 * group is gathered at its first layer's open, released and reduced once all its layers have
 * closed, so a step makes about K times fewer collectives, each K times larger. The buckets and
 * gather buffers are the size of the largest group, so where the embedding is the largest (the
 * presets' 1B model up to K 4, the 8B up to K 2) they cost no memory; --zero-group-layers auto,
 * the default, takes the largest such K.
 *
 * Norm weights are registered like every other parameter; in a 16-bit model their compute copy is
 * 16-bit, and since llmcl_rmsnorm wants f32 weights beside an f32 weight gradient, opening a group
 * casts each norm weight into an f32 copy that the model computes with.
 *
 * Under LoRA the dist holds the trained parameters alone, the adapters (f32 masters): the frozen
 * base stays in the model's frozen set, whole on every rank, as data-parallel PEFT keeps it. Its
 * groups are then the layers' only (--zero-group-layers auto puts them all in one: the adapters
 * are a small part of the model), and opening the embedding's or the head's group does nothing.
 */
#ifndef LLMCL_TRAIN_ZERO_H
#define LLMCL_TRAIN_ZERO_H

#include "llmcl_dist.h"
#include "model.h"

struct zero {
    llmcl_dist *dist;
    llmcl_tensor **w32; /* per parameter: the f32 copy of a 16-bit model's norm weight, or NULL */
    int64_t (*kept)[2]; /* per parameter: the elements [lo, hi) of its values that this rank keeps */
    int layers;         /* layers a dist group holds (--zero-group-layers) */
    /* per dist group: gathered and not yet released; its model groups closed since the gather
       (parameters) and since its last reduction (gradients) */
    bool *open;
    int *params_closed, *grads_closed;
};

/* Registers m's parameters with a new dist of `stage` and sets it up (collective). */
llmcl_status zero_attach(model *m, int stage);

/* Frees the dist (collective). */
void zero_detach(model *m);

/*
 * The elements [lo, hi) of parameter i's values that this rank keeps, so that init_params draws
 * none that the rank would drop: under stage 3 those in its shard, from the layout that
 * llmcl_dist_setup documents (all of them where llmcl_dist_info shows another); under stages 1
 * and 2, which keep the full parameters, all of them.
 */
void zero_kept(const model *m, int i, int64_t *lo, int64_t *hi);

/* Sets a parameter from host f32 values (every rank passes the same, at least in the elements
   that zero_kept gives). */
llmcl_status zero_init_param(model *m, const model_param *p, const float *host);

/* The f32 masters of n parameters into hosts (NULL entries: gathered, not copied); collective:
   llmcl_dist_get_params. */
llmcl_status zero_get_params(model *m, int n, const model_param *const *ps, float *const *hosts);

/* Opens group for use (mode: GROUP_PARAMS and/or GROUP_GRADS; collective): gathers it, points the
   parameters' w and grad at the dist's views, valid until zero_close. */
llmcl_status zero_open(model *m, int group, int mode);

/* Closes group: its gradients are complete (GROUP_GRADS), its parameters released (GROUP_PARAMS). */
llmcl_status zero_close(model *m, int group, int mode);

/*
 * --profile's time in llmcl_dist: zero_clock before a dist call, zero_timed around its status
 * after it. When m->profiling, the queue is idle before the call (every op waits for its kernels
 * then), and zero_timed waits for what the call enqueued, so the wall time between the two, added
 * to m->prof_zero_ms, is the call's: its collectives, copies, sums and handoffs.
 */
double zero_clock(const model *m);
llmcl_status zero_timed(model *m, double t0, llmcl_status st);

#endif
