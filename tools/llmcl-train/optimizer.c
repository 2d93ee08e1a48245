/* optimizer.c: AdamW over a model's trainable set through llmcl's multi-tensor step
   (optimizer.h); frozen weights have neither gradients nor moments. */
#include "optimizer.h"

#include <stdlib.h>

#include "offload_state.h"
#include "util.h"
#ifdef LLMCL_TRAIN_MPI
#include "zero.h"
#endif

llmcl_status optimizer_create(model *m, const adamw_hparams *hp, optimizer *out)
{
    *out = (optimizer){.m = m, .hp = *hp};
    out->tensors = xcalloc((size_t)m->n_params, sizeof *out->tensors);
    out->grads = xcalloc((size_t)m->n_params, sizeof *out->grads);
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (!p->trainable || m->zero) /* under --zero llmcl_dist holds the state */
            continue;
        /* 16-bit models: AdamW updates the master and writes the rounded copy in the same pass;
           bf16-only adapters (no master) are rounded stochastically. Offloaded masters and
           moments: the tensors are slices of a chunk, made for each (step_chunk). */
        if (!m->trainable.offloaded)
            out->tensors[out->count] = (llmcl_adamw_tensor){
                .param = p->w16 ? p->w16 : p->master, .master = p->w16 ? p->master : NULL,
                .grad = p->grad, .m = p->m, .v = p->v, .no_weight_decay = p->is_norm};
        out->grads[out->count++] = p->grad;
    }
    const int64_t one = 1;
    return llmcl_tensor_create(m->ctx, LLMCL_F32, 1, &one, &out->grad_norm);
}

void optimizer_destroy(optimizer *o)
{
    free(o->tensors);
    free(o->grads);
    llmcl_tensor_destroy(o->grad_norm);
    *o = (optimizer){0};
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
    TRY(llmcl_dist_step(d, &z, &o->zero_norm));
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
                                      .no_weight_decay = p->is_norm};
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

llmcl_status optimizer_step(optimizer *o)
{
    model *m = o->m;
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_step(o, &o->step, o->micro);
#endif
    if (o->step.grad_norm || o->norm_wanted)
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
