/* zero.c: the model's parameters in an llmcl_dist under --zero (zero.h). */
#include "zero.h"

#include <stdlib.h>

#include "util.h"

int zero_group(const model *m, const model_param *p)
{
    if (p->layer >= 0)
        return p->layer + 1;
    return p->kind == P_EMBED ? 0 : model_head_group(m);
}

llmcl_status zero_attach(model *m, int stage)
{
    zero *z = xcalloc(1, sizeof *z);
    z->w32 = xcalloc((size_t)m->n_params, sizeof *z->w32);
    m->zero = z;
    const llmcl_dist_opts o = {.stage = stage, .param_dtype = m->cfg.dtype};
    TRY(llmcl_dist_create(m->ctx, MPI_COMM_WORLD, &o, &z->dist));
    /* groups in one run each, as llmcl_dist wants; the layout interleaves group 0's tensors */
    const int groups = m->cfg.layers + (m->cfg.tied ? 1 : 2);
    for (int g = 0; g < groups; ++g)
        for (int i = 0; i < m->n_params; ++i) {
            const model_param *p = &m->params[i];
            if (zero_group(m, p) == g)
                TRY(llmcl_dist_add_param(z->dist, p->name, g, p->ndim, p->shape, p->is_norm));
        }
    TRY(llmcl_dist_setup(z->dist));
    for (int i = 0; m->cfg.dtype != LLMCL_F32 && i < m->n_params; ++i)
        if (m->params[i].is_norm)
            TRY(llmcl_tensor_create(m->ctx, LLMCL_F32, 1, &m->params[i].numel, &z->w32[i]));
    return LLMCL_OK;
}

void zero_detach(model *m)
{
    zero *z = m->zero;
    if (!z)
        return;
    for (int i = 0; i < m->n_params; ++i)
        llmcl_tensor_destroy(z->w32[i]);
    free(z->w32);
    llmcl_dist_destroy(z->dist);
    free(z);
    m->zero = NULL;
}

llmcl_status zero_init_param(model *m, const model_param *p, const float *host)
{
    return llmcl_dist_init_param(m->zero->dist, p->name, host);
}

llmcl_status zero_open(model *m, int group, int mode)
{
    zero *z = m->zero;
    if (mode & GROUP_PARAMS)
        TRY(llmcl_dist_gather(z->dist, group));
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (zero_group(m, p) != group)
            continue;
        if (mode & GROUP_PARAMS) {
            TRY(llmcl_dist_param(z->dist, p->name, &p->w));
            if (z->w32[i]) { /* the gather buffer is read by this cast before its release */
                TRY(llmcl_cast(m->ctx, p->w, z->w32[i]));
                p->w = z->w32[i];
            }
        }
        if (mode & GROUP_GRADS)
            TRY(llmcl_dist_grad(z->dist, p->name, &p->grad));
    }
    return LLMCL_OK;
}

llmcl_status zero_close(model *m, int group, int mode)
{
    zero *z = m->zero;
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (zero_group(m, p) != group)
            continue;
        if (mode & GROUP_PARAMS)
            p->w = NULL;
        if (mode & GROUP_GRADS)
            p->grad = NULL;
    }
    if (mode & GROUP_GRADS)
        TRY(llmcl_dist_grads_ready(z->dist, group));
    if (mode & GROUP_PARAMS)
        TRY(llmcl_dist_release(z->dist, group));
    return LLMCL_OK;
}
