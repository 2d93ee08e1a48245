/*
 * zero.c: the ZeRO stages' hooks into a training loop (gather, release, parameter and gradient
 * views, grads_ready, zero_grads) and the sharded optimizer step.
 *
 * Stage 1 adds the backward's gradients into full f32 buffers and reduce-scatters them in the step.
 * Stages 2 and 3 add them into one of two f32 buckets the size of the largest group, reduce-scatter
 * a bucket as soon as its group is ready and add the rank's part into the gradient shard; a bucket
 * is reused two groups later, after its reduction has landed. The transport (transport.h) moves
 * the blocks and sums the P ranks' parts of this rank's block in rank order into the shard
 * (llmcl__dist_sum_blocks where they land in the buffer). Stage 3 gathers a group's
 * parameters into one of two gather buffers and prefetches the next group into the other. Stages
 * 1 and 2 all-gather the updated parameters at the end of the step, under the compute of the
 * next forward where the collectives run under the compute (gather waits for its group's).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "transport.h"

#define FAULT(call, expr)                                                                         \
    do {                                                                                          \
        llmcl_status fault_st = (expr);                                                           \
        if (fault_st != LLMCL_OK)                                                                 \
            return llmcl__dist_fault(d, (call), fault_st);                                        \
    } while (0)

static llmcl_status check_group(llmcl_dist *d, int group)
{
    LLMCL__REQUIRE(d->ctx, d->ready, LLMCL_ERROR_INVALID_ARGUMENT, "call llmcl_dist_setup first");
    LLMCL__REQUIRE(d->ctx, group >= 0 && group < d->n_groups, LLMCL_ERROR_INVALID_ARGUMENT,
                   "group %d is not in [0, %d)", group, d->n_groups);
    return LLMCL_OK;
}

/* Two temporary views, freed together. */
typedef struct views {
    llmcl_tensor *a, *b;
} views;

static void views_free(views *v)
{
    llmcl_tensor_destroy(v->a);
    llmcl_tensor_destroy(v->b);
}

/* ---- reductions ---- */

/* Group g's f32 gradients on channel ch, from element *off: a bucket (stages 2-3) or the group's
   part of the full gradients (stage 1). */
static llmcl_tensor *group_grads(llmcl_dist *d, int ch, const dist_group *g, int64_t *off)
{
    *off = 0;
    return d->opts.stage == 1 ? g->grads : d->bucket[ch];
}

/* What a reduce-scatter exchanges in place: the f32 gradients, or their bf16 copy for the wire. */
static llmcl_tensor *reduce_buffer(llmcl_dist *d, int ch, const dist_group *g, int64_t *off)
{
    if (d->opts.reduce_dtype == LLMCL_F32)
        return group_grads(d, ch, g, off);
    *off = 0;
    return d->wire[ch];
}

llmcl_status llmcl__dist_sum_blocks(llmcl_dist *d, int channel, const dist_group *g,
                                    const llmcl_tensor *buf, int64_t off, llmcl_tensor *dst,
                                    float beta)
{
    (void)channel;
    const int64_t shape[2] = {d->world, g->shard}, strides[2] = {g->shard, 1};
    llmcl_tensor *parts = NULL;
    llmcl_status st = llmcl_tensor_view(buf, 2, shape, strides, off, &parts);
    if (st == LLMCL_OK)
        st = llmcl_sum_rows(d->ctx, parts, beta, dst);
    llmcl_tensor_destroy(parts);
    return st;
}

llmcl_status llmcl__dist_finish_reduce(llmcl_dist *d, int ch)
{
    const int group = d->transport->ops->busy(d, OP_REDUCE, ch);
    if (group < 0)
        return LLMCL_OK;
    const dist_group *g = &d->groups[group];
    LLMCL__TRY(llmcl__dist_complete(d, OP_REDUCE, ch));
    /* The ranks' parts of this rank's block summed into the gradient shard (stages 2-3:
       micro-batches accumulate there) or over the rank's own part (stage 1). */
    int64_t off;
    const llmcl_tensor *buf = reduce_buffer(d, ch, g, &off);
    llmcl_tensor *dst = NULL;
    llmcl_status st = d->opts.stage == 1
                          ? llmcl__dist_view(g->grads, d->rank * g->shard, g->shard, &dst)
                          : llmcl__dist_view(d->grad_shard, g->shard_off, g->shard, &dst);
    if (st == LLMCL_OK)
        st = d->transport->ops->sum_parts(d, ch, g, buf, off, dst,
                                          d->opts.stage == 1 ? 0.0f : 1.0f);
    llmcl_tensor_destroy(dst);
    return st;
}

/* Starts the reduce-scatter of group's gradients on channel ch, cast first for a bf16 wire. */
static llmcl_status reduce_group(llmcl_dist *d, int ch, int group)
{
    const dist_group *g = &d->groups[group];
    int64_t off, grads_off;
    llmcl_tensor *buf = reduce_buffer(d, ch, g, &off);
    llmcl_tensor *grads = group_grads(d, ch, g, &grads_off);
    if (buf != grads) {
        views v = {0};
        llmcl_status st = llmcl__dist_view(grads, grads_off, g->numel, &v.a);
        if (st == LLMCL_OK)
            st = llmcl__dist_view(buf, off, g->numel, &v.b);
        if (st == LLMCL_OK)
            st = llmcl_cast(d->ctx, v.a, v.b);
        views_free(&v);
        LLMCL__TRY(st);
    }
    return d->transport->ops->reduce_start(d, ch, group, buf, off);
}

/*
 * Stages 1-2: waits until group's updated parameters have landed. The step's all-gathers run in
 * group order, DIST_SLOTS at a time: group k on channel k % DIST_SLOTS, and each one that lands
 * starts the group DIST_SLOTS after it on its channel, after the kernels enqueued by then.
 */
static llmcl_status gather_until(llmcl_dist *d, int group)
{
    while (d->gathered_upto <= group) {
        const int s = d->gathered_upto % DIST_SLOTS, next = d->gathered_upto + DIST_SLOTS;
        LLMCL__TRY(llmcl__dist_complete(d, OP_GATHER, s));
        d->gathered_upto = d->gathered_upto + 1 < d->n_groups ? d->gathered_upto + 1 : INT_MAX;
        if (next < d->n_groups)
            LLMCL__TRY(d->transport->ops->gather_start(d, s, next, d->groups[next].params, 0,
                                                       NULL));
    }
    return LLMCL_OK;
}

llmcl_status llmcl__dist_drain(llmcl_dist *d)
{
    LLMCL__TRY(gather_until(d, d->n_groups - 1));
    for (int s = 0; s < DIST_SLOTS; ++s)
        LLMCL__TRY(llmcl__dist_finish_reduce(d, s));
    for (int s = 0; s < DIST_SLOTS; ++s)
        LLMCL__TRY(llmcl__dist_complete(d, OP_GATHER, s));
    return LLMCL_OK;
}

/* Stages 2-3: a zeroed bucket for group's gradients and the views into it. */
static llmcl_status assign_bucket(llmcl_dist *d, int group)
{
    dist_group *g = &d->groups[group];
    const int b = d->next_bucket;
    for (int k = 0; k < d->n_groups; ++k)
        LLMCL__REQUIRE(d->ctx, d->groups[k].bucket != b, LLMCL_ERROR_INVALID_ARGUMENT,
                       "gradients of group %d asked for while groups %d and another are not "
                       "ready: at most %d groups' gradients may be open at once",
                       group, k, DIST_SLOTS);
    d->next_bucket = (b + 1) % DIST_SLOTS;
    LLMCL__TRY(llmcl__dist_finish_reduce(d, b));
    llmcl_tensor *zero = NULL;
    llmcl_status st = llmcl__dist_view(d->bucket[b], 0, g->numel, &zero);
    if (st == LLMCL_OK)
        st = llmcl_fill(d->ctx, zero, 0.0);
    llmcl_tensor_destroy(zero);
    LLMCL__TRY(st);
    for (int i = g->first; i < g->first + g->count; ++i) {
        dist_param *p = &d->params[i];
        llmcl_tensor_destroy(p->grad);
        p->grad = NULL;
        LLMCL__TRY(llmcl_tensor_view(d->bucket[b], p->ndim, p->shape, NULL, p->offset, &p->grad));
    }
    g->bucket = b;
    return LLMCL_OK;
}

static llmcl_status grads_ready(llmcl_dist *d, int group)
{
    LLMCL__TRY(check_group(d, group));
    LLMCL__TRY(d->transport->ops->progress(d));
    if (d->opts.stage == 1)
        return LLMCL_OK;
    dist_group *g = &d->groups[group];
    if (g->bucket < 0) /* no gradient asked for: its zeros still take part, as on other ranks */
        LLMCL__TRY(assign_bucket(d, group));
    const int b = g->bucket;
    g->bucket = -1;
    LLMCL__TRY(reduce_group(d, b, group));
    return d->overlap ? LLMCL_OK : llmcl__dist_finish_reduce(d, b);
}

llmcl_status llmcl_dist_grads_ready(llmcl_dist *d, int group)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    FAULT("llmcl_dist_grads_ready", grads_ready(d, group));
    return LLMCL_OK;
}

static llmcl_status zero_grads(llmcl_dist *d)
{
    LLMCL__REQUIRE(d->ctx, d->ready, LLMCL_ERROR_INVALID_ARGUMENT, "call llmcl_dist_setup first");
    /* Reductions still in flight would land after the zeros. */
    for (int s = 0; s < DIST_SLOTS; ++s)
        LLMCL__TRY(llmcl__dist_finish_reduce(d, s));
    if (d->opts.stage > 1)
        return llmcl_fill(d->ctx, d->grad_shard, 0.0);
    for (int k = 0; k < d->n_groups; ++k)
        LLMCL__TRY(llmcl_fill(d->ctx, d->groups[k].grads, 0.0));
    return LLMCL_OK;
}

llmcl_status llmcl_dist_zero_grads(llmcl_dist *d)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    FAULT("llmcl_dist_zero_grads", zero_grads(d));
    return LLMCL_OK;
}

llmcl_status llmcl_dist_grad(llmcl_dist *d, const char *name, llmcl_tensor **view)
{
    dist_param *p;
    LLMCL__TRY(llmcl__dist_lookup(d, name, view, &p));
    if (d->opts.stage > 1 && d->groups[p->group].bucket < 0)
        FAULT("llmcl_dist_grad", assign_bucket(d, p->group));
    *view = p->grad;
    return LLMCL_OK;
}

/* ---- stage 3 parameters ---- */

/* A gather buffer for group: not holding a gathered group, nor `keep` if another is free. */
static int free_slot(const llmcl_dist *d, int keep)
{
    int found = -1;
    for (int s = 0; s < DIST_SLOTS; ++s) {
        const int held = d->slot_group[s];
        if (held >= 0 && d->groups[held].gathered)
            continue;
        if (found < 0 || d->slot_group[found] == keep)
            found = s;
    }
    return found;
}

/* Starts the all-gather of group into slot s (evicting what it held): this rank's shard is copied
   into its block on the compute queue, past the kernels that read the slot before. */
static llmcl_status fetch(llmcl_dist *d, int group, int s)
{
    LLMCL__TRY(llmcl__dist_complete(d, OP_GATHER, s));
    if (d->slot_group[s] >= 0)
        d->groups[d->slot_group[s]].slot = -1;
    d->slot_group[s] = group;
    dist_group *g = &d->groups[group];
    g->slot = s;
    const size_t es = llmcl_dtype_size(d->opts.param_dtype);
    const llmcl_tensor *from = d->param_shard, *to = d->slot[s];
    LLMCL__CL(d->ctx, clEnqueueCopyBuffer(d->ctx->queue, from->mem, to->mem,
                                          (size_t)(from->offset + g->shard_off) * es,
                                          (size_t)(to->offset + d->rank * g->shard) * es,
                                          (size_t)g->shard * es, 0, NULL, NULL));
    return d->transport->ops->gather_start(d, s, group, to, 0, d->slot_free[s]);
}

static llmcl_status slot_views(llmcl_dist *d, const dist_group *g)
{
    for (int i = g->first; i < g->first + g->count; ++i) {
        dist_param *p = &d->params[i];
        llmcl_tensor_destroy(p->param);
        p->param = NULL;
        LLMCL__TRY(llmcl_tensor_view(d->slot[g->slot], p->ndim, p->shape, NULL, p->offset,
                                     &p->param));
    }
    return LLMCL_OK;
}

/* Up through the forward; down once a group at or below the last one comes again. */
static int next_direction(const llmcl_dist *d, int group)
{
    if (d->last_gathered < 0 || group > d->last_gathered)
        return 1;
    return group < d->last_gathered ? -1 : -d->direction;
}

static llmcl_status gather(llmcl_dist *d, int group)
{
    LLMCL__TRY(check_group(d, group));
    LLMCL__TRY(d->transport->ops->progress(d));
    if (d->opts.stage < 3)
        return gather_until(d, group);
    dist_group *g = &d->groups[group];
    LLMCL__REQUIRE(d->ctx, !g->gathered, LLMCL_ERROR_INVALID_ARGUMENT,
                   "group %d gathered twice without release", group);
    if (g->slot < 0) {
        const int s = free_slot(d, d->last_gathered);
        LLMCL__REQUIRE(d->ctx, s >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "group %d: %d groups are gathered already (release one first)", group,
                       DIST_SLOTS);
        LLMCL__TRY(fetch(d, group, s));
    }
    g->gathered = true; /* its buffer is taken: the prefetch goes to the other one */
    d->direction = next_direction(d, group);
    d->last_gathered = group;
    /* The prefetch starts before the wait for this group, so that its chunks follow this group's
       through the host link without a gap. */
    const int next = group + d->direction;
    if (d->overlap && next >= 0 && next < d->n_groups && d->groups[next].slot < 0) {
        const int s = free_slot(d, group);
        if (s >= 0)
            LLMCL__TRY(fetch(d, next, s));
    }
    LLMCL__TRY(llmcl__dist_complete(d, OP_GATHER, g->slot));
    return slot_views(d, g);
}

llmcl_status llmcl_dist_gather(llmcl_dist *d, int group)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    FAULT("llmcl_dist_gather", gather(d, group));
    return LLMCL_OK;
}

static llmcl_status release(llmcl_dist *d, int group)
{
    LLMCL__TRY(check_group(d, group));
    LLMCL__TRY(d->transport->ops->progress(d));
    dist_group *g = &d->groups[group];
    if (d->opts.stage < 3)
        return LLMCL_OK;
    LLMCL__REQUIRE(d->ctx, g->gathered, LLMCL_ERROR_INVALID_ARGUMENT,
                   "group %d released without gather", group);
    g->gathered = false;
    /* The next gather into this buffer waits for the kernels that read it. */
    if (d->slot_free[g->slot])
        clReleaseEvent(d->slot_free[g->slot]);
    d->slot_free[g->slot] = NULL;
    return llmcl__dist_marker(d, &d->slot_free[g->slot]);
}

llmcl_status llmcl_dist_release(llmcl_dist *d, int group)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    FAULT("llmcl_dist_release", release(d, group));
    return LLMCL_OK;
}

llmcl_status llmcl_dist_param(llmcl_dist *d, const char *name, llmcl_tensor **view)
{
    dist_param *p;
    LLMCL__TRY(llmcl__dist_lookup(d, name, view, &p));
    LLMCL__REQUIRE(d->ctx, d->opts.stage < 3 || d->groups[p->group].gathered,
                   LLMCL_ERROR_INVALID_ARGUMENT, "'%s': its group %d is not gathered", name,
                   p->group);
    LLMCL__REQUIRE(d->ctx, d->gathered_upto > p->group, LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s': the step's all-gather of its group %d has not landed: call "
                   "llmcl_dist_gather(%d) first", name, p->group, p->group);
    *view = p->param;
    return LLMCL_OK;
}

/* ---- the step ---- */

/* The rank's part of the shard at param p's segment. */
static int64_t shard_at(const llmcl_dist *d, const dist_param *p, int64_t lo)
{
    const dist_group *g = &d->groups[p->group];
    return g->shard_off + lo - d->rank * g->shard;
}

/*
 * The global norm of the unscaled gradients: each rank's sum of squares, gathered, summed in rank
 * order in double on every rank (the same number everywhere, whatever MPI's algorithms), uploaded.
 */
static llmcl_status global_norm(llmcl_dist *d, float *norm)
{
    const int n = d->opts.stage == 1 ? d->n_groups : 1;
    llmcl_tensor **grads = calloc((size_t)n, sizeof *grads);
    LLMCL__REQUIRE(d->ctx, grads, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "gradient list");
    llmcl_status st = LLMCL_OK;
    for (int k = 0; st == LLMCL_OK && k < n; ++k) {
        const dist_group *g = &d->groups[k];
        st = d->opts.stage == 1
                 ? llmcl__dist_view(g->grads, d->rank * g->shard, g->shard,
                                    &grads[k])
                 : llmcl__dist_view(d->grad_shard, 0, d->shard, &grads[k]);
    }
    float mine = 0.0f;
    if (st == LLMCL_OK)
        st = llmcl_grad_norm(d->ctx, (const llmcl_tensor *const *)grads, n, 1, d->norm);
    if (st == LLMCL_OK)
        st = llmcl_tensor_download(d->norm, &mine, sizeof mine);
    for (int k = 0; k < n; ++k)
        llmcl_tensor_destroy(grads[k]);
    free(grads);
    LLMCL__TRY(st);
    float *all = malloc((size_t)d->world * sizeof *all);
    LLMCL__REQUIRE(d->ctx, all, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "norms");
    if (MPI_Allgather(&mine, 1, MPI_FLOAT, all, 1, MPI_FLOAT, d->comm) != MPI_SUCCESS) {
        free(all);
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allgather of the gradient norms");
    }
    double sum = 0.0;
    for (int r = 0; r < d->world; ++r)
        sum += all[r];
    free(all);
    *norm = (float)sqrt(sum);
    return llmcl_tensor_upload(d->norm, norm, sizeof *norm);
}

/* The AdamW tensors of the rank's segments, as views (count may be 0: a shard of padding). */
static llmcl_status adamw_shard(llmcl_dist *d, const llmcl_adamw_opts *opts)
{
    llmcl_adamw_tensor *t = calloc((size_t)(d->n_params ? d->n_params : 1), sizeof *t);
    LLMCL__REQUIRE(d->ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "optimizer list");
    int n = 0;
    llmcl_status st = LLMCL_OK;
    for (int i = 0; st == LLMCL_OK && i < d->n_params; ++i) {
        const dist_param *p = &d->params[i];
        int64_t lo, hi;
        if (!llmcl__dist_segment(d, p, &lo, &hi))
            continue;
        const int64_t at = shard_at(d, p, lo), len = hi - lo;
        llmcl_adamw_tensor *e = &t[n++];
        llmcl_tensor *grad = NULL;
        e->no_weight_decay = p->no_weight_decay;
        const dist_group *g = &d->groups[p->group];
        st = d->opts.stage < 3 ? llmcl__dist_view(g->params, lo, len, &e->param)
                               : llmcl__dist_view(d->param_shard, at, len, &e->param);
        if (st == LLMCL_OK)
            st = d->opts.stage == 1 ? llmcl__dist_view(g->grads, lo, len, &grad)
                                    : llmcl__dist_view(d->grad_shard, at, len, &grad);
        e->grad = grad;
        if (st == LLMCL_OK)
            st = llmcl__dist_view(d->master, at, len, &e->master);
        if (st == LLMCL_OK)
            st = llmcl__dist_view(d->m, at, len, &e->m);
        if (st == LLMCL_OK)
            st = llmcl__dist_view(d->v, at, len, &e->v);
    }
    if (st == LLMCL_OK && n > 0)
        st = llmcl_adamw_step(d->ctx, t, n, opts);
    for (int i = 0; i < n; ++i) {
        llmcl_tensor_destroy(t[i].param);
        llmcl_tensor_destroy(t[i].master);
        llmcl_tensor_destroy((llmcl_tensor *)t[i].grad);
        llmcl_tensor_destroy(t[i].m);
        llmcl_tensor_destroy(t[i].v);
    }
    free(t);
    return st;
}

/*
 * Stages 1-2: every group's updated shard to every rank, in place in its full parameters. Where
 * the collectives run under the compute, the next forward's gather(g) waits for group g's alone,
 * so that the later groups' all-gathers run beside the earlier groups' forward.
 */
static llmcl_status gather_all(llmcl_dist *d)
{
    LLMCL__TRY(llmcl__dist_drain(d));
    for (int k = 0; k < DIST_SLOTS && k < d->n_groups; ++k)
        LLMCL__TRY(d->transport->ops->gather_start(d, k, k, d->groups[k].params, 0, NULL));
    d->gathered_upto = d->n_groups > 0 ? 0 : INT_MAX;
    return d->overlap ? LLMCL_OK : gather_until(d, d->n_groups - 1);
}

int llmcl__dist_gathered(const llmcl_dist *d)
{
    for (int k = 0; k < d->n_groups; ++k)
        if (d->groups[k].gathered)
            return k;
    return -1;
}

/* Stage 3: gathered copies are stale once the shards change. */
static void forget_slots(llmcl_dist *d)
{
    for (int s = 0; s < DIST_SLOTS; ++s) {
        if (d->slot_group[s] >= 0)
            d->groups[d->slot_group[s]].slot = -1;
        d->slot_group[s] = -1;
    }
    d->last_gathered = -1;
    d->direction = 1;
}

static llmcl_status reduce_all(llmcl_dist *d)
{
    for (int k = d->n_groups - 1; k >= 0; --k) {
        const int ch = d->next_bucket;
        d->next_bucket = (ch + 1) % DIST_SLOTS;
        LLMCL__TRY(llmcl__dist_finish_reduce(d, ch));
        LLMCL__TRY(reduce_group(d, ch, k));
    }
    return LLMCL_OK;
}

/*
 * Whether the step computes the global norm (its all-gather is collective): for clipping, which
 * every rank asks for alike, or where any rank wants the number, as a rank's grad_norm may be NULL
 * where another's is not (rank 0 alone logging it).
 */
static llmcl_status norm_wanted(llmcl_dist *d, const llmcl_adamw_opts *opts,
                                const float *grad_norm, bool *out)
{
    *out = opts->max_grad_norm > 0.0f;
    if (*out)
        return LLMCL_OK;
    int mine = grad_norm != NULL, any = 0;
    LLMCL__REQUIRE(d->ctx,
                   MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, d->comm) == MPI_SUCCESS,
                   LLMCL_ERROR_MPI, "MPI_Allreduce of the ranks' wish for the gradient norm");
    *out = any != 0;
    return LLMCL_OK;
}

static llmcl_status step(llmcl_dist *d, const llmcl_adamw_opts *opts, float *grad_norm)
{
    LLMCL__REQUIRE(d->ctx, d->ready && opts, LLMCL_ERROR_INVALID_ARGUMENT,
                   "call llmcl_dist_setup first; opts must not be NULL");
    const int held = llmcl__dist_gathered(d);
    LLMCL__REQUIRE(d->ctx, held < 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "group %d is still gathered: release it before the step", held);
    if (d->opts.stage == 1)
        LLMCL__TRY(reduce_all(d));
    LLMCL__TRY(llmcl__dist_drain(d));
    llmcl_adamw_opts o = *opts;
    o.grad_norm = NULL;
    bool want_norm;
    LLMCL__TRY(norm_wanted(d, opts, grad_norm, &want_norm));
    if (want_norm) {
        float norm;
        LLMCL__TRY(global_norm(d, &norm));
        if (opts->max_grad_norm > 0.0f)
            o.grad_norm = d->norm;
        if (grad_norm)
            *grad_norm = norm * (opts->grad_scale != 0.0f ? opts->grad_scale : 1.0f);
    }
    LLMCL__TRY(adamw_shard(d, &o));
    o.grad_norm = NULL;
    d->last = o;
    if (d->opts.stage == 3) {
        forget_slots(d);
        return LLMCL_OK;
    }
    return gather_all(d);
}

llmcl_status llmcl_dist_step(llmcl_dist *d, const llmcl_adamw_opts *opts, float *grad_norm)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    FAULT("llmcl_dist_step", step(d, opts, grad_norm));
    return LLMCL_OK;
}

/* The compute copy from the master shard: cast in place, then stages 1-2 gather it. */
llmcl_status llmcl__dist_refresh_params(llmcl_dist *d)
{
    if (d->opts.stage == 3) {
        forget_slots(d);
        return llmcl_cast(d->ctx, d->master, d->param_shard);
    }
    for (int k = 0; k < d->n_groups; ++k) {
        const dist_group *g = &d->groups[k];
        views v = {0};
        llmcl_status st = llmcl__dist_view(d->master, g->shard_off, g->shard, &v.a);
        if (st == LLMCL_OK)
            st = llmcl__dist_view(g->params, d->rank * g->shard, g->shard, &v.b);
        if (st == LLMCL_OK)
            st = llmcl_cast(d->ctx, v.a, v.b);
        views_free(&v);
        LLMCL__TRY(st);
    }
    return gather_all(d);
}
