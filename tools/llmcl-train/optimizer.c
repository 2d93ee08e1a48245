/* optimizer.c: AdamW over a model's trainable set through llmcl's multi-tensor step
   (optimizer.h), all at once or group by group in the backward; frozen weights have neither
   gradients nor moments. */
#include "optimizer.h"

#include <stdlib.h>

#include "offload_state.h"
#include "util.h"
#ifdef LLMCL_TRAIN_MPI
#include "zero.h"
#endif

/*
 * Adds m's trainable parameter p to the step's tensors. 16-bit models: AdamW updates the master
 * and writes the rounded copy in the same pass; bf16-only adapters (no master) are rounded
 * stochastically. Offloaded masters and moments: the tensors are slices of a chunk, made for each
 * (step_chunk).
 */
static void add_tensor(optimizer *o, const model_param *p)
{
    if (!o->m->trainable.offloaded)
        o->tensors[o->count] = (llmcl_adamw_tensor){
            .param = p->w16 ? p->w16 : p->master, .master = p->w16 ? p->master : NULL,
            .grad = p->grad, .m = p->m, .v = p->v, .no_weight_decay = p->is_vector};
    o->grads[o->count++] = p->grad;
}

static llmcl_status group_update(void *arg, int group);

/*
 * optimizer_in_backward: the tensors in group order, each group's norm slot (zero for a group
 * with nothing to train, so that the norm of the slots is the global one), and the model's call.
 */
static llmcl_status by_groups(optimizer *o)
{
    model *m = o->m;
    const int64_t groups = model_groups(m);
    o->first = xcalloc((size_t)groups, sizeof *o->first);
    o->group_count = xcalloc((size_t)groups, sizeof *o->group_count);
    o->group_norm = xcalloc((size_t)groups, sizeof *o->group_norm);
    for (int g = 0; g < groups; ++g) {
        o->first[g] = o->count;
        for (int i = 0; i < m->n_params; ++i)
            if (m->params[i].trainable && model_group(m, &m->params[i]) == g)
                add_tensor(o, &m->params[i]);
        o->group_count[g] = o->count - o->first[g];
    }
    TRY(llmcl_tensor_create(m->ctx, LLMCL_F32, 1, &groups, &o->group_norms));
    TRY(llmcl_fill(m->ctx, o->group_norms, 0.0));
    for (int64_t g = 0, one = 1; g < groups; ++g)
        TRY(llmcl_tensor_view(o->group_norms, 1, &one, NULL, g, &o->group_norm[g]));
    m->on_group_grads = group_update;
    m->on_group_grads_arg = o;
    return LLMCL_OK;
}

llmcl_status optimizer_create(model *m, const adamw_hparams *hp, optimizer *out)
{
    *out = (optimizer){.m = m, .hp = *hp};
    out->tensors = xcalloc((size_t)m->n_params, sizeof *out->tensors);
    out->grads = xcalloc((size_t)m->n_params, sizeof *out->grads);
    const int64_t one = 1;
    TRY(llmcl_tensor_create(m->ctx, LLMCL_F32, 1, &one, &out->grad_norm));
    if (m->zero) /* under --zero llmcl_dist holds the state */
        return LLMCL_OK;
    if (m->cfg.optimizer_in_backward) {
        if (hp->clip > 0)
            die("optimizer: clipping by the global norm needs every gradient before the first "
                "update, which optimizer_in_backward makes in the backward");
        return by_groups(out);
    }
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].trainable)
            add_tensor(out, &m->params[i]);
    out->unsummed = xcalloc((size_t)m->n_params, sizeof *out->unsummed);
    return llmcl_sumsq_create(m->ctx, &out->sumsq);
}

void optimizer_destroy(optimizer *o)
{
    if (o->m && o->m->on_group_grads_arg == o)
        o->m->on_group_grads = NULL, o->m->on_group_grads_arg = NULL;
    for (int g = 0; o->group_norm && g < model_groups(o->m); ++g)
        llmcl_tensor_destroy(o->group_norm[g]);
    llmcl_tensor_destroy(o->group_norms);
    free(o->group_norm);
    free(o->first);
    free(o->group_count);
    free(o->tensors);
    free(o->grads);
    free(o->unsummed);
    llmcl_tensor_destroy(o->grad_norm);
    llmcl_sumsq_destroy(o->sumsq);
    *o = (optimizer){0};
}

/*
 * The prepared step's update of one group, from inside the backward: its gradients' norm when a
 * line will print it, AdamW, then its gradients zeroed (the memory's next group, or this group's
 * next step, accumulates into it). Each call a profiling region of the optimizer's row.
 */
static llmcl_status group_update(void *arg, int group)
{
    optimizer *o = arg;
    model *m = o->m;
    const int n = o->group_count[group];
    if (n == 0)
        return LLMCL_OK;
    if (o->norm_wanted)
        TRY(MODEL_PROF(m, F_OPTIMIZER, llmcl_grad_norm(m->ctx, o->grads + o->first[group], n, 0,
                                                       o->group_norm[group])));
    TRY(MODEL_PROF(m, F_OPTIMIZER,
                   llmcl_adamw_step(m->ctx, o->tensors + o->first[group], n, &o->step)));
    return MODEL_PROF(m, F_OPTIMIZER, llmcl_fill(m->ctx, m->group_grads[group], 0.0));
}

#ifdef LLMCL_TRAIN_MPI
/* Under --zero: gradients summed over the ranks, so the scale averages over them too; the norm
   (already scaled) kept for optimizer_last_norm. */
static llmcl_status zero_step(optimizer *o, const llmcl_adamw_opts *ao, int micro)
{
    llmcl_dist *d = o->m->zero->dist;
    llmcl_dist_info info;
    TRY(llmcl_dist_info_get(d, &info));
    llmcl_adamw_opts z = *ao;
    z.grad_scale = 1.0f / (float)(micro * info.world);
    z.grad_norm = NULL;
    const double t0 = zero_clock(o->m);
    TRY(zero_timed(o->m, t0, llmcl_dist_step(d, &z, &o->zero_norm)));
    return llmcl_dist_zero_grads(d);
}
#endif

/* A step's chunk of offloaded state: the optimizer and the step's options. */
typedef struct chunk_step {
    optimizer *o;
    const llmcl_adamw_opts *ao;
} chunk_step;

/*
 * AdamW over elements [at, at + len) of the trainable set, their masters and moments streamed in:
 * the slice of each tensor there, in layout order, so every element sees the arithmetic of the
 * step without offload (no stochastic rounding: a 16-bit model has masters), then the norms'
 * f32 copies.
 */
static llmcl_status step_chunk(void *arg, int64_t at, int64_t len, llmcl_tensor *master,
                               llmcl_tensor *mom, llmcl_tensor *var)
{
    const chunk_step *cs = arg;
    model *m = cs->o->m;
    const param_set *set = &m->trainable;
    llmcl_adamw_tensor *t = cs->o->tensors;
    int n = 0;
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        int64_t first;
        const int64_t count = model_param_within(p, at, len, &first);
        if (count == 0)
            continue;
        t[n++] = (llmcl_adamw_tensor){.param = tensor_slice(set->compute, first, count),
                                      .master = tensor_slice(master, first - at, count),
                                      .grad = tensor_slice(set->grad, first, count),
                                      .m = tensor_slice(mom, first - at, count),
                                      .v = tensor_slice(var, first - at, count),
                                      .no_weight_decay = p->is_vector};
    }
    llmcl_status st = llmcl_adamw_step(m->ctx, t, n, cs->ao);
    for (int i = 0; i < n; ++i) { /* the slices made above (grad is const only in the call) */
        llmcl_tensor *views[] = {t[i].param, t[i].master, (llmcl_tensor *)t[i].grad, t[i].m, t[i].v};
        for (int k = 0; k < 5; ++k)
            llmcl_tensor_destroy(views[k]);
    }
    return st == LLMCL_OK ? model_norms_from(m, at, len, master) : st;
}

void optimizer_prepare(optimizer *o, float lr, int64_t step, int micro, bool norm)
{
    o->step = (llmcl_adamw_opts){.lr = lr, .beta1 = o->hp.beta1, .beta2 = o->hp.beta2,
                                 .eps = o->hp.eps, .weight_decay = o->hp.weight_decay,
                                 .step = step, .grad_scale = 1.0f / (float)micro,
                                 .grad_norm = o->hp.clip > 0 ? o->grad_norm : NULL,
                                 .max_grad_norm = o->hp.clip, .seed = o->hp.seed};
    o->micro = micro;
    o->norm_wanted = norm;
}

llmcl_sumsq *optimizer_norm_sumsq(const optimizer *o)
{
    return o->step.grad_norm || o->norm_wanted ? o->sumsq : NULL;
}

/*
 * The global norm: the squares the weight gradient products gathered, then the gradients they
 * did not finish (embeddings, norms, adapters), each param's mark cleared for the next step.
 */
static llmcl_status gathered_norm(optimizer *o)
{
    model *m = o->m;
    int n = 0;
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (p->trainable && !p->grad_summed)
            o->unsummed[n++] = p->grad;
        p->grad_summed = false;
    }
    return llmcl_grad_norm_sumsq(m->ctx, o->sumsq, o->unsummed, n, 0, o->grad_norm);
}

llmcl_status optimizer_step(optimizer *o)
{
    model *m = o->m;
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_step(o, &o->step, o->micro);
#endif
    if (m->cfg.optimizer_in_backward) { /* sqrt(sum of the groups' squared norms) */
        const llmcl_tensor *norms = o->group_norms;
        return o->norm_wanted ? llmcl_grad_norm(m->ctx, &norms, 1, 0, o->grad_norm) : LLMCL_OK;
    }
    if (optimizer_norm_sumsq(o))
        TRY(gathered_norm(o));
    else if (o->step.grad_norm || o->norm_wanted)
        TRY(llmcl_grad_norm(m->ctx, o->grads, o->count, 0, o->grad_norm));
    if (m->trainable.offloaded) {
        chunk_step cs = {o, &o->step};
        return offload_state_stream(m->trainable.offloaded, true, step_chunk, &cs);
    }
    return llmcl_adamw_step(m->ctx, o->tensors, o->count, &o->step);
}

llmcl_status optimizer_last_norm(optimizer *o, double *norm)
{
    if (o->m->zero) {
        *norm = o->zero_norm;
        return LLMCL_OK;
    }
    float g = 0;
    TRY(llmcl_tensor_download(o->grad_norm, &g, sizeof g));
    *norm = g / o->micro;
    return LLMCL_OK;
}
