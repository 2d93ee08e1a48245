/* zero.c: the model's parameters in an llmcl_dist under --zero (zero.h). */
#include "zero.h"

#include <stdlib.h>

#include "util.h"

/* Elements a parameter starts on in its group (llmcl_dist_setup's layout). */
#define DIST_ALIGN 16

static int64_t dist_aligned(int64_t numel)
{
    return (numel + DIST_ALIGN - 1) / DIST_ALIGN * DIST_ALIGN;
}

/* Under LoRA the dist holds the adapters alone, the trained parameters; the frozen base stays in
   the model's frozen set on every rank. So its dist groups are the layers' (merged by z->layers),
   and the embedding's and head's groups have none. */
static bool in_dist(const model_param *p) { return p->trainable; }

/* The dist group of the first layer group. */
static int layers_base(const model *m) { return m->cfg.lora_rank > 0 ? 0 : 1; }

/* The dist group of model group g (-1: none): layers merged by z->layers, the others alone. */
static int dist_group(const model *m, int g)
{
    const int k = m->zero->layers, last = (m->cfg.layers - 1) / k + layers_base(m);
    if (g >= 1 && g <= m->cfg.layers)
        return (g - 1) / k + layers_base(m);
    if (m->cfg.lora_rank > 0)
        return -1;
    return g == 0 ? 0 : last + 1;
}

/* Model groups (layers, or the embedding's or head's group) in dist group dg. */
static int dist_members(const model *m, int dg)
{
    const int k = m->zero->layers, j = dg - layers_base(m), last = (m->cfg.layers - 1) / k;
    if (j < 0 || j > last)
        return 1;
    return j < last ? k : m->cfg.layers - last * k;
}

static int dist_groups(const model *m)
{
    return m->cfg.lora_rank > 0 ? (m->cfg.layers - 1) / m->zero->layers + 1
                                : dist_group(m, model_groups(m) - 1) + 1;
}

static int param_group(const model *m, const model_param *p)
{
    return dist_group(m, model_group(m, p));
}

/*
 * z->kept under stage 3, from the layout that llmcl_dist_setup documents: each group's parameters
 * in registration order, each at a multiple of 16 elements, the group padded to a multiple of
 * 16 x world and split evenly over the ranks. Where the padded sizes that it gives differ from
 * info's (a library with another layout), every element of every parameter instead.
 */
static void find_kept(model *m, int groups, const llmcl_dist_info *info)
{
    int64_t (*kept)[2] = m->zero->kept, padded = 0, largest = 0;
    for (int g = 0; g < groups; ++g) {
        int64_t at = 0;
        for (int i = 0; i < m->n_params; ++i)
            if (in_dist(&m->params[i]) && param_group(m, &m->params[i]) == g) {
                kept[i][0] = at; /* the parameter's offset in its group, for now */
                at += dist_aligned(m->params[i].numel);
            }
        const int64_t quantum = (int64_t)DIST_ALIGN * info->world,
                      numel = (at + quantum - 1) / quantum * quantum, shard = numel / info->world,
                      s0 = info->rank * shard, s1 = s0 + shard;
        for (int i = 0; i < m->n_params; ++i)
            if (in_dist(&m->params[i]) && param_group(m, &m->params[i]) == g) {
                const int64_t off = kept[i][0], end = off + m->params[i].numel;
                kept[i][0] = s0 > off ? s0 - off : 0;
                kept[i][1] = (s1 < end ? s1 : end) - off;
                if (kept[i][1] < kept[i][0])
                    kept[i][0] = kept[i][1] = 0;
            }
        padded += numel;
        largest = numel > largest ? numel : largest;
    }
    if (padded == info->padded_numel && largest == info->max_group)
        return;
    for (int i = 0; i < m->n_params; ++i)
        if (in_dist(&m->params[i]))
            kept[i][0] = 0, kept[i][1] = m->params[i].numel;
}

/*
 * --zero-group-layers auto: the most layers whose group is no larger than the largest of the
 * others (the embedding's, or an untied head's), which sizes llmcl_dist's buffers, so that the
 * merged groups cost no memory; 1 where a layer is the larger. Under LoRA, whose adapters are a
 * small part of the model, every layer in one group: one gather and one reduction a step.
 */
static int auto_group_layers(const model *m)
{
    if (m->cfg.lora_rank > 0)
        return m->cfg.layers;
    const int n = model_groups(m);
    int64_t *size = xcalloc((size_t)n, sizeof *size), other = 0;
    for (int i = 0; i < m->n_params; ++i)
        size[model_group(m, &m->params[i])] += dist_aligned(m->params[i].numel);
    for (int g = 0; g < n; ++g)
        if ((g == 0 || g > m->cfg.layers) && size[g] > other)
            other = size[g];
    const int64_t k = size[1] > 0 ? other / size[1] : 1;
    free(size);
    return k < 1 ? 1 : k > m->cfg.layers ? m->cfg.layers : (int)k;
}

llmcl_status zero_attach(model *m, int stage)
{
    zero *z = xcalloc(1, sizeof *z);
    z->w32 = xcalloc((size_t)m->n_params, sizeof *z->w32);
    z->kept = xcalloc((size_t)m->n_params, sizeof *z->kept);
    z->layers = m->cfg.zero_group_layers >= 1 ? m->cfg.zero_group_layers : auto_group_layers(m);
    m->zero = z;
    const int groups = dist_groups(m);
    z->open = xcalloc((size_t)groups, sizeof *z->open);
    z->params_closed = xcalloc((size_t)groups, sizeof *z->params_closed);
    z->grads_closed = xcalloc((size_t)groups, sizeof *z->grads_closed);
    const llmcl_dist_opts o = {.stage = stage, .param_dtype = m->cfg.dtype,
                               .reduce_dtype = m->cfg.zero_reduce_dtype};
    TRY(llmcl_dist_create(m->ctx, MPI_COMM_WORLD, &o, &z->dist));
    /* groups in one run each, as llmcl_dist wants; the layout interleaves group 0's tensors */
    for (int g = 0; g < groups; ++g)
        for (int i = 0; i < m->n_params; ++i) {
            const model_param *p = &m->params[i];
            if (in_dist(p) && param_group(m, p) == g)
                TRY(llmcl_dist_add_param(z->dist, p->name, g, p->ndim, p->shape, p->is_vector));
        }
    TRY(llmcl_dist_setup(z->dist));
    llmcl_dist_info info;
    TRY(llmcl_dist_info_get(z->dist, &info));
    for (int i = 0; i < m->n_params; ++i)
        z->kept[i][0] = 0, z->kept[i][1] = m->params[i].numel;
    if (stage == 3)
        find_kept(m, groups, &info);
    for (int i = 0; m->cfg.dtype != LLMCL_F32 && i < m->n_params; ++i)
        if (m->params[i].is_vector && in_dist(&m->params[i]))
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
    free(z->kept);
    free(z->open);
    free(z->params_closed);
    free(z->grads_closed);
    llmcl_dist_destroy(z->dist);
    free(z);
    m->zero = NULL;
}

void zero_kept(const model *m, int i, int64_t *lo, int64_t *hi)
{
    *lo = m->zero->kept[i][0];
    *hi = m->zero->kept[i][1];
}

llmcl_status zero_init_param(model *m, const model_param *p, const float *host)
{
    return llmcl_dist_init_param(m->zero->dist, p->name, host);
}

llmcl_status zero_get_params(model *m, int n, const model_param *const *ps,
                             float *const *hosts)
{
    const char **names = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *names);
    for (int i = 0; i < n; ++i)
        names[i] = ps[i]->name;
    const llmcl_status st = llmcl_dist_get_params(m->zero->dist, n, names, hosts);
    free(names);
    return st;
}

llmcl_status zero_open(model *m, int group, int mode)
{
    zero *z = m->zero;
    const int dg = dist_group(m, group);
    if (dg < 0)
        return LLMCL_OK;
    if ((mode & GROUP_PARAMS) && !z->open[dg]) {
        const double t0 = zero_clock(m);
        TRY(zero_timed(m, t0, llmcl_dist_gather(z->dist, dg)));
        z->open[dg] = true;
    }
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (!in_dist(p) || model_group(m, p) != group)
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
    const int dg = dist_group(m, group), members = dist_members(m, dg);
    if (dg < 0)
        return LLMCL_OK;
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        if (!in_dist(p) || model_group(m, p) != group)
            continue;
        if (mode & GROUP_PARAMS)
            p->w = NULL;
        if (mode & GROUP_GRADS)
            p->grad = NULL;
    }
    if ((mode & GROUP_GRADS) && ++z->grads_closed[dg] == members) {
        z->grads_closed[dg] = 0;
        const double t0 = zero_clock(m);
        TRY(zero_timed(m, t0, llmcl_dist_grads_ready(z->dist, dg)));
    }
    if ((mode & GROUP_PARAMS) && ++z->params_closed[dg] == members) {
        z->params_closed[dg] = 0;
        z->open[dg] = false;
        TRY(llmcl_dist_release(z->dist, dg));
    }
    return LLMCL_OK;
}

double zero_clock(const model *m)
{
    return m->profiling ? util_now_s() : 0.0;
}

llmcl_status zero_timed(model *m, double t0, llmcl_status st)
{
    if (!m->profiling || st != LLMCL_OK)
        return st;
    st = llmcl_ctx_finish(m->ctx);
    m->prof_zero_ms += 1e3 * (util_now_s() - t0);
    return st;
}
