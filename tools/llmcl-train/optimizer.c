/* optimizer.c: AdamW over a model's trainable set through llmcl's multi-tensor step
   (optimizer.h); frozen weights have neither gradients nor moments. */
#include "optimizer.h"

#include <stdlib.h>

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
           bf16-only adapters (no master) are rounded stochastically */
        out->tensors[out->count] = (llmcl_adamw_tensor){.param = p->w16 ? p->w16 : p->master,
                                                        .master = p->w16 ? p->master : NULL,
                                                        .grad = p->grad, .m = p->m, .v = p->v,
                                                        .no_weight_decay = p->is_norm};
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

llmcl_status optimizer_step(optimizer *o, float lr, int64_t step, int micro)
{
    model *m = o->m;
    const llmcl_adamw_opts ao = {.lr = lr, .beta1 = o->hp.beta1, .beta2 = o->hp.beta2,
                                 .eps = o->hp.eps, .weight_decay = o->hp.weight_decay,
                                 .step = step, .grad_scale = 1.0f / (float)micro,
                                 .grad_norm = o->hp.clip > 0 ? o->grad_norm : NULL,
                                 .max_grad_norm = o->hp.clip, .seed = o->hp.seed};
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_step(o, &ao, micro);
#endif
    TRY(llmcl_grad_norm(m->ctx, o->grads, o->count, 0, o->grad_norm));
    return llmcl_adamw_step(m->ctx, o->tensors, o->count, &ao);
}

llmcl_status optimizer_last_norm(optimizer *o, int micro, double *norm)
{
    if (o->m->zero) {
        *norm = o->zero_norm;
        return LLMCL_OK;
    }
    float g = 0;
    TRY(llmcl_tensor_download(o->grad_norm, &g, sizeof g));
    *norm = g / micro;
    return LLMCL_OK;
}
