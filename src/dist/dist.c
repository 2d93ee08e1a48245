/*
 * dist.c: the llmcl_dist object: creation over a duplicated communicator and the choice of its
 * transport, parameter registration, the sharded layout (groups flattened, padded and split evenly
 * over the ranks), the cross-rank check of the parameter set, the allocations of each stage, and
 * initial values.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "transport.h"

dist_param *llmcl__dist_find(llmcl_dist *d, const char *name)
{
    for (int i = 0; name && i < d->n_params; ++i)
        if (strcmp(d->params[i].name, name) == 0)
            return &d->params[i];
    return NULL;
}

llmcl_status llmcl__dist_lookup(llmcl_dist *d, const char *name, const void *out,
                                dist_param **p)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    LLMCL__REQUIRE(d->ctx, d->ready && out, LLMCL_ERROR_INVALID_ARGUMENT,
                   "call llmcl_dist_setup first; the output must not be NULL");
    *p = llmcl__dist_find(d, name);
    LLMCL__REQUIRE(d->ctx, *p, LLMCL_ERROR_INVALID_ARGUMENT, "no parameter '%s'",
                   name ? name : "(null)");
    return LLMCL_OK;
}

llmcl_status llmcl__dist_fault(llmcl_dist *d, const char *call, llmcl_status st)
{
    if (st == LLMCL_OK || d->opts.return_on_error)
        return st;
    /* The other ranks would wait forever in their next collective: end the job, saying why. */
    fprintf(stderr, "llmcl_dist: rank %d of %d: %s: %s: %s\n", d->rank, d->world, call,
            llmcl_status_str(st), llmcl_last_error(d->ctx));
    fflush(stderr);
    MPI_Abort(d->comm, 1);
    return st;
}

llmcl_status llmcl__dist_agree(llmcl_dist *d, llmcl_status st)
{
    int mine = st, all = st;
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, d->comm) != MPI_SUCCESS)
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allreduce of the ranks' status failed");
    if (all != LLMCL_OK && st == LLMCL_OK)
        return LLMCL__FAIL(d->ctx, (llmcl_status)all, "another rank failed with %s",
                           llmcl_status_str(all));
    return (llmcl_status)all;
}

llmcl_status llmcl__dist_view(const llmcl_tensor *t, int64_t off, int64_t count, llmcl_tensor **out)
{
    return llmcl_tensor_view(t, 1, &count, NULL, off, out);
}

bool llmcl__dist_segment(const llmcl_dist *d, const dist_param *p, int64_t *lo, int64_t *hi)
{
    const dist_group *g = &d->groups[p->group];
    const int64_t s0 = d->rank * g->shard, s1 = s0 + g->shard;
    *lo = p->offset > s0 ? p->offset : s0;
    *hi = p->offset + p->numel < s1 ? p->offset + p->numel : s1;
    return *lo < *hi;
}

MPI_Datatype llmcl__dist_mpi_type(llmcl_dtype dt)
{
    return dt == LLMCL_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

llmcl_status llmcl__dist_marker(llmcl_dist *d, cl_event *out)
{
    LLMCL__CL(d->ctx, clEnqueueMarkerWithWaitList(d->ctx->queue, 0, NULL, out));
    /* Without a flush the marker may never reach the device while another queue waits on it. */
    LLMCL__CL(d->ctx, clFlush(d->ctx->queue));
    return LLMCL_OK;
}

llmcl_status llmcl__dist_complete(llmcl_dist *d, int kind, int channel)
{
    return d->transport->ops->complete(d, kind, channel);
}

const char *llmcl_dist_transport_name(llmcl_dist_transport t)
{
    switch (t) {
    case LLMCL_DIST_TRANSPORT_AUTO: return "auto";
    case LLMCL_DIST_TRANSPORT_MPI: return "mpi";
    case LLMCL_DIST_TRANSPORT_NCCL: return "nccl";
    }
    return "?";
}

llmcl_status llmcl_dist_ctx_create(MPI_Comm comm, llmcl_ctx **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_MPI, "MPI_Comm_split_type (the ranks of a node)");
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return llmcl_ctx_create_local(local, out);
}

static llmcl_status check_opts(llmcl_ctx *ctx, const llmcl_dist_opts *o)
{
    LLMCL__REQUIRE(ctx, o, LLMCL_ERROR_INVALID_ARGUMENT, "opts must not be NULL");
    LLMCL__REQUIRE(ctx, o->stage >= 1 && o->stage <= 3, LLMCL_ERROR_INVALID_ARGUMENT,
                   "stage %d is not 1, 2 or 3", o->stage);
    LLMCL__REQUIRE(ctx, o->param_dtype == LLMCL_F32 || o->param_dtype == LLMCL_BF16 ||
                            o->param_dtype == LLMCL_F16,
                   LLMCL_ERROR_UNSUPPORTED_DTYPE, "param_dtype must be f32, bf16 or f16");
    LLMCL__REQUIRE(ctx, o->reduce_dtype == LLMCL_F32 || o->reduce_dtype == LLMCL_BF16,
                   LLMCL_ERROR_UNSUPPORTED_DTYPE, "reduce_dtype must be f32 or bf16");
    /* MPI's counts and displacements are ints: a chunk's pieces must fit. */
    LLMCL__REQUIRE(ctx, o->chunk_bytes <= (1u << 30), LLMCL_ERROR_INVALID_ARGUMENT,
                   "chunk_bytes %llu is over 1 GiB", (unsigned long long)o->chunk_bytes);
    LLMCL__REQUIRE(ctx, o->transport >= LLMCL_DIST_TRANSPORT_AUTO &&
                            o->transport <= LLMCL_DIST_TRANSPORT_NCCL,
                   LLMCL_ERROR_INVALID_ARGUMENT, "transport %d is not auto, mpi or nccl",
                   (int)o->transport);
    LLMCL__REQUIRE(ctx,
                   o->overlap >= LLMCL_DIST_OVERLAP_AUTO && o->overlap <= LLMCL_DIST_OVERLAP_OFF,
                   LLMCL_ERROR_INVALID_ARGUMENT, "overlap %d is not auto, on or off",
                   (int)o->overlap);
    return LLMCL_OK;
}

/* Whether collectives run under the compute: opts, else LLMCL_DIST_OVERLAP, else the transport's
   choice. */
static llmcl_status resolve_overlap(llmcl_dist *d)
{
    const char *env = llmcl__getenv("LLMCL_DIST_OVERLAP");
    if (d->opts.overlap != LLMCL_DIST_OVERLAP_AUTO)
        d->overlap = d->opts.overlap == LLMCL_DIST_OVERLAP_ON;
    else if (!env)
        d->overlap = d->transport->overlaps;
    else if (strcmp(env, "on") == 0 || strcmp(env, "off") == 0)
        d->overlap = strcmp(env, "on") == 0;
    else
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                           "LLMCL_DIST_OVERLAP=%s is not on or off", env);
    return LLMCL_OK;
}

/* The transport asked for: opts, else LLMCL_DIST_TRANSPORT. */
static llmcl_status wanted_transport(llmcl_ctx *ctx, const llmcl_dist_opts *o,
                                     llmcl_dist_transport *out)
{
    *out = o->transport;
    const char *env = llmcl__getenv("LLMCL_DIST_TRANSPORT");
    if (*out != LLMCL_DIST_TRANSPORT_AUTO || !env)
        return LLMCL_OK;
    for (int t = LLMCL_DIST_TRANSPORT_AUTO; t <= LLMCL_DIST_TRANSPORT_NCCL; ++t)
        if (strcmp(env, llmcl_dist_transport_name((llmcl_dist_transport)t)) == 0) {
            *out = (llmcl_dist_transport)t;
            return LLMCL_OK;
        }
    return LLMCL__FAIL(ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                       "LLMCL_DIST_TRANSPORT=%s is not auto, mpi or nccl", env);
}

/*
 * The NCCL transport's settings from the environment, checked whatever the transport, so that a
 * bad value fails alike on every machine: LLMCL_NCCL_CE, and LLMCL_NCCL_TIMEOUT into
 * d->nccl_timeout_s (600 s unset), a positive, finite number of seconds whole: "5x" is refused,
 * not read as 5.
 */
static llmcl_status read_nccl_env(llmcl_dist *d)
{
    const char *ce = llmcl__getenv("LLMCL_NCCL_CE");
    LLMCL__REQUIRE(d->ctx, !ce || strcmp(ce, "0") == 0 || strcmp(ce, "1") == 0,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "LLMCL_NCCL_CE=%s is not 0 (NCCL's kernels) or 1 (its copy engines where it "
                   "can)", ce);
    d->nccl_timeout_s = 600.0;
    return llmcl__env_positive(d->ctx, "LLMCL_NCCL_TIMEOUT",
                               "a positive number of seconds such as 600", &d->nccl_timeout_s,
                               NULL);
}

/*
 * The transport (collective): NCCL where asked for or where automatic finds every rank able to run
 * it, else MPI. Every rank takes part in each step whatever it found so far, so that all decide
 * alike.
 */
static llmcl_status choose_transport(llmcl_dist *d, llmcl_status st)
{
    llmcl_dist_transport want = LLMCL_DIST_TRANSPORT_AUTO;
    if (st == LLMCL_OK)
        st = read_nccl_env(d);
    if (st == LLMCL_OK)
        st = wanted_transport(d->ctx, &d->opts, &want);
    st = llmcl__dist_agree(d, st);
    if (st != LLMCL_OK)
        return st;
    if (want != LLMCL_DIST_TRANSPORT_MPI) {
        static const char prefix[] = "NCCL not used: ";
        char *why = d->transport_detail + sizeof prefix - 1;
        st = llmcl__dist_nccl_create(d, why, sizeof d->transport_detail - sizeof prefix + 1);
        if (st != LLMCL_ERROR_UNSUPPORTED || want == LLMCL_DIST_TRANSPORT_NCCL)
            return st;
        memcpy(d->transport_detail, prefix, sizeof prefix - 1);
    } else {
        snprintf(d->transport_detail, sizeof d->transport_detail, "asked for");
    }
    return llmcl__dist_agree(d, llmcl__dist_mpi_create(d));
}

llmcl_status llmcl_dist_create(llmcl_ctx *ctx, MPI_Comm comm, const llmcl_dist_opts *opts,
                               llmcl_dist **out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    llmcl_status st = check_opts(ctx, opts);
    llmcl_dist *d = st == LLMCL_OK ? calloc(1, sizeof *d) : NULL;
    if (st == LLMCL_OK && !d)
        st = LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "llmcl_dist");
    /* Duplicate even on failure, so that every rank makes the same collective calls. */
    MPI_Comm dup = MPI_COMM_NULL;
    if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS && st == LLMCL_OK)
        st = LLMCL__FAIL(ctx, LLMCL_ERROR_MPI, "MPI_Comm_dup failed");
    if (d) {
        d->ctx = ctx;
        d->comm = dup;
        d->opts = *opts;
        d->last_gathered = -1;
        d->direction = 1;
        d->gathered_upto = INT_MAX;
        for (int s = 0; s < DIST_SLOTS; ++s)
            d->slot_group[s] = -1;
        MPI_Comm_rank(dup, &d->rank);
        MPI_Comm_size(dup, &d->world);
        st = choose_transport(d, st);
        if (st == LLMCL_OK)
            st = llmcl__dist_agree(d, resolve_overlap(d));
        if (st != LLMCL_OK) {
            llmcl_dist_destroy(d);
            return st;
        }
        if (d->rank == 0)
            llmcl__log("llmcl_dist: %s transport (%s), collectives %s the compute",
                       llmcl_dist_transport_name(d->transport->kind), d->transport_detail,
                       d->overlap ? "under" : "between");
        *out = d;
        return LLMCL_OK;
    }
    /* Still take part in the agreement the other ranks are waiting in. */
    int mine = st, all;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, dup);
    MPI_Comm_free(&dup);
    return st;
}

static void free_tensors(llmcl_dist *d)
{
    for (int i = 0; i < d->n_params; ++i) {
        llmcl_tensor_destroy(d->params[i].param);
        llmcl_tensor_destroy(d->params[i].grad);
        d->params[i].param = d->params[i].grad = NULL;
    }
    for (int k = 0; k < d->n_groups; ++k) {
        llmcl_tensor_destroy(d->groups[k].params);
        llmcl_tensor_destroy(d->groups[k].grads);
        d->groups[k].params = d->groups[k].grads = NULL;
    }
    llmcl_tensor *all[] = {d->master, d->m, d->v, d->norm, d->param_shard, d->grad_shard};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
    d->master = d->m = d->v = d->norm = NULL;
    d->param_shard = d->grad_shard = NULL;
    for (int s = 0; s < DIST_SLOTS; ++s) {
        llmcl_tensor_destroy(d->bucket[s]);
        llmcl_tensor_destroy(d->wire[s]);
        llmcl_tensor_destroy(d->slot[s]);
        d->bucket[s] = d->wire[s] = d->slot[s] = NULL;
        if (d->slot_free[s])
            clReleaseEvent(d->slot_free[s]);
        d->slot_free[s] = NULL;
    }
}

/* Everything setup made: nothing may use the buffers any more. */
static void free_setup(llmcl_dist *d)
{
    if (d->transport)
        d->transport->ops->quiesce(d);
    free_tensors(d);
    if (d->transport)
        d->transport->ops->release(d);
}

void llmcl_dist_destroy(llmcl_dist *d)
{
    if (!d)
        return;
    if (d->ready)
        llmcl__dist_drain(d);
    free_setup(d);
    if (d->transport)
        d->transport->ops->destroy(d);
    MPI_Comm_free(&d->comm);
    free(d->params);
    free(d->groups);
    free(d);
}

llmcl_status llmcl_dist_add_param(llmcl_dist *d, const char *name, int group, int ndim,
                                  const int64_t *shape, int no_weight_decay)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    llmcl_ctx *ctx = d->ctx;
    LLMCL__REQUIRE(ctx, !d->ready, LLMCL_ERROR_INVALID_ARGUMENT,
                   "llmcl_dist_add_param after llmcl_dist_setup");
    LLMCL__REQUIRE(ctx, name && *name && strlen(name) < DIST_NAME_MAX, LLMCL_ERROR_INVALID_ARGUMENT,
                   "name must be 1 to %d bytes", DIST_NAME_MAX - 1);
    LLMCL__REQUIRE(ctx, !llmcl__dist_find(d, name), LLMCL_ERROR_INVALID_ARGUMENT,
                   "parameter '%s' registered twice", name);
    const int prev = d->n_params ? d->params[d->n_params - 1].group : -1;
    LLMCL__REQUIRE(ctx, group == (prev < 0 ? 0 : prev) || group == prev + 1,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s': group %d after group %d (groups run 0, 1, 2, ... in registration order)",
                   name, group, prev);
    LLMCL__REQUIRE(ctx, ndim >= 1 && ndim <= LLMCL_MAX_DIMS && shape, LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s': ndim %d is not in [1, %d]", name, ndim, LLMCL_MAX_DIMS);
    int64_t numel = 1;
    for (int k = 0; k < ndim; ++k) {
        LLMCL__REQUIRE(ctx, shape[k] >= 1 && numel <= INT64_MAX / shape[k],
                       LLMCL_ERROR_INVALID_ARGUMENT, "'%s': dimension %d is %" PRId64, name, k,
                       shape[k]);
        numel *= shape[k];
    }
    if (d->n_params == d->cap_params) {
        const int cap = d->cap_params ? 2 * d->cap_params : 16;
        dist_param *p = realloc(d->params, (size_t)cap * sizeof *p);
        LLMCL__REQUIRE(ctx, p, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "parameter table");
        d->params = p;
        d->cap_params = cap;
    }
    dist_param *p = &d->params[d->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->group = group;
    p->ndim = ndim;
    p->no_weight_decay = no_weight_decay != 0;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->numel = numel;
    return LLMCL_OK;
}

/* *sum += add (both non-negative); false where the sum would pass INT64_MAX (and UB). */
static bool add_checked(int64_t *sum, int64_t add)
{
    if (add > INT64_MAX - *sum)
        return false;
    *sum += add;
    return true;
}

/* *n rounded up to a multiple of unit (both positive); false where that would pass INT64_MAX. */
static bool round_up_checked(int64_t *n, int64_t unit)
{
    if (*n > INT64_MAX - (unit - 1))
        return false;
    *n = llmcl__div_up(*n, unit) * unit;
    return true;
}

/* Offsets of the parameters in their groups and of the groups in the full and shard layouts.
   add_param takes up to INT64_MAX elements a parameter: every sum is checked. */
static llmcl_status layout(llmcl_dist *d)
{
    d->n_groups = d->n_params ? d->params[d->n_params - 1].group + 1 : 0;
    d->groups = calloc((size_t)(d->n_groups ? d->n_groups : 1), sizeof *d->groups);
    LLMCL__REQUIRE(d->ctx, d->groups, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "group table");
    const int64_t quantum = (int64_t)DIST_ALIGN * d->world;
    for (int i = 0; i < d->n_params; ++i) {
        dist_param *p = &d->params[i];
        dist_group *g = &d->groups[p->group];
        if (g->count++ == 0)
            g->first = i;
        p->offset = g->numel;
        int64_t aligned = p->numel;
        LLMCL__REQUIRE(d->ctx,
                       round_up_checked(&aligned, DIST_ALIGN) && add_checked(&g->numel, aligned) &&
                           add_checked(&d->numel, p->numel),
                       LLMCL_ERROR_OVERFLOW,
                       "'%s' (%" PRId64 " elements): its group or all the parameters, padded, "
                       "pass 2^63 - 1 elements", p->name, p->numel);
    }
    for (int k = 0; k < d->n_groups; ++k) {
        dist_group *g = &d->groups[k];
        LLMCL__REQUIRE(d->ctx, round_up_checked(&g->numel, quantum) &&
                                   add_checked(&d->padded, g->numel),
                       LLMCL_ERROR_OVERFLOW,
                       "group %d padded to a multiple of %" PRId64 " elements, or all the groups, "
                       "pass 2^63 - 1 elements", k, quantum);
        g->shard = g->numel / d->world;
        g->shard_off = d->shard;
        g->slot = g->bucket = -1;
        d->shard += g->shard; /* at most padded / world */
        if (g->numel > d->max_group)
            d->max_group = g->numel;
    }
    /* MPI counts are ints: a group's shard must fit (2^31 elements a rank per group). */
    LLMCL__REQUIRE(d->ctx, d->max_group / d->world <= INT32_MAX, LLMCL_ERROR_OVERFLOW,
                   "a group of %" PRId64 " elements is too large for %d ranks (split it)",
                   d->max_group, d->world);
    return LLMCL_OK;
}

/* A hash of everything that must agree across ranks. */
static llmcl_status set_hash(const llmcl_dist *d, uint64_t *out)
{
    XXH64_state_t *s = XXH64_createState();
    LLMCL__REQUIRE(d->ctx, s, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "a hash state");
    XXH64_reset(s, 0);
    /* The chunk size too: it sets every chunk's MPI call. */
    const int64_t head[4] = {d->opts.stage, d->opts.param_dtype, d->opts.reduce_dtype,
                             (int64_t)d->opts.chunk_bytes};
    XXH64_update(s, head, sizeof head);
    for (int i = 0; i < d->n_params; ++i) {
        const dist_param *p = &d->params[i];
        XXH64_update(s, p->name, strlen(p->name) + 1);
        const int64_t fields[3] = {p->group, p->ndim, p->no_weight_decay};
        XXH64_update(s, fields, sizeof fields);
        XXH64_update(s, p->shape, (size_t)p->ndim * sizeof *p->shape);
    }
    *out = XXH64_digest(s);
    XXH64_freeState(s);
    return LLMCL_OK;
}

/* One all-gather of every rank's hash; every rank sees the same list, so all decide alike. */
static llmcl_status check_same_set(llmcl_dist *d)
{
    uint64_t mine = 0;
    llmcl_status st = set_hash(d, &mine);
    uint64_t *all = st == LLMCL_OK ? malloc((size_t)d->world * sizeof *all) : NULL;
    if (st == LLMCL_OK && !all)
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "hashes");
    /* A rank without its hash or the table says so before the gather, which the others join. */
    st = llmcl__dist_agree(d, st);
    if (st == LLMCL_OK &&
        MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, d->comm) != MPI_SUCCESS)
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allgather of the parameter set hashes");
    for (int r = 1; st == LLMCL_OK && r < d->world; ++r)
        if (all[r] != all[0])
            st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                             "llmcl_dist_setup: rank %d registered a different parameter set, "
                             "stage, dtypes or chunk size than rank 0 (hash %016" PRIx64
                             " against %016" PRIx64 "; this is rank %d, %d parameters)",
                             r, all[r], all[0], d->rank, d->n_params);
    free(all);
    return st;
}

static llmcl_status alloc_zero(llmcl_dist *d, llmcl_dtype dt, int64_t n, llmcl_tensor **out)
{
    LLMCL__TRY(llmcl_tensor_create(d->ctx, dt, 1, &n, out));
    return llmcl_fill(d->ctx, *out, 0.0);
}

static llmcl_status allocate(llmcl_dist *d)
{
    const int stage = d->opts.stage;
    const llmcl_dtype pt = d->opts.param_dtype, rt = d->opts.reduce_dtype;
    const int64_t one = 1;
    LLMCL__TRY(alloc_zero(d, LLMCL_F32, d->shard, &d->master));
    LLMCL__TRY(alloc_zero(d, LLMCL_F32, d->shard, &d->m));
    LLMCL__TRY(alloc_zero(d, LLMCL_F32, d->shard, &d->v));
    LLMCL__TRY(llmcl_tensor_create(d->ctx, LLMCL_F32, 1, &one, &d->norm));
    for (int k = 0; stage < 3 && k < d->n_groups; ++k) {
        dist_group *g = &d->groups[k];
        LLMCL__TRY(alloc_zero(d, pt, g->numel, &g->params));
        if (stage == 1)
            LLMCL__TRY(alloc_zero(d, LLMCL_F32, g->numel, &g->grads));
    }
    if (stage == 3)
        LLMCL__TRY(alloc_zero(d, pt, d->shard, &d->param_shard));
    if (stage > 1)
        LLMCL__TRY(alloc_zero(d, rt, d->shard, &d->grad_shard));
    for (int s = 0; s < DIST_SLOTS; ++s) {
        if (stage > 1)
            LLMCL__TRY(alloc_zero(d, LLMCL_F32, d->max_group, &d->bucket[s]));
        if (rt != LLMCL_F32)
            LLMCL__TRY(alloc_zero(d, rt, d->max_group, &d->wire[s]));
        if (stage == 3)
            LLMCL__TRY(alloc_zero(d, pt, d->max_group, &d->slot[s]));
    }
    return LLMCL_OK;
}

/* Stages 1-2: the parameter and gradient views never move, so they are made once. */
static llmcl_status fixed_views(llmcl_dist *d)
{
    for (int i = 0; d->opts.stage < 3 && i < d->n_params; ++i) {
        dist_param *p = &d->params[i];
        const dist_group *g = &d->groups[p->group];
        LLMCL__TRY(llmcl_tensor_view(g->params, p->ndim, p->shape, NULL, p->offset, &p->param));
        if (d->opts.stage == 1)
            LLMCL__TRY(llmcl_tensor_view(g->grads, p->ndim, p->shape, NULL, p->offset, &p->grad));
    }
    return LLMCL_OK;
}

llmcl_status llmcl_dist_setup(llmcl_dist *d)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    LLMCL__REQUIRE(d->ctx, !d->ready, LLMCL_ERROR_INVALID_ARGUMENT, "llmcl_dist_setup called twice");
    llmcl_status st = check_same_set(d);
    if (st == LLMCL_OK)
        st = layout(d);
    if (st == LLMCL_OK)
        st = allocate(d);
    if (st == LLMCL_OK)
        st = fixed_views(d);
    /* Only together: the NCCL transport's setup registers its staging with every rank. */
    st = llmcl__dist_agree(d, st);
    if (st == LLMCL_OK)
        st = d->transport->ops->setup(d);
    if (st == LLMCL_OK)
        st = llmcl_ctx_finish(d->ctx);
    st = llmcl__dist_agree(d, st);
    if (st != LLMCL_OK) {
        free_setup(d);
        free(d->groups);
        d->groups = NULL;
        d->n_groups = 0;
        d->numel = d->padded = d->shard = d->max_group = 0;
        return st;
    }
    d->ready = true;
    if (d->rank == 0)
        llmcl__log("llmcl_dist: stage %d, %d ranks, %d parameters in %d groups, %" PRId64
                   " elements (%" PRId64 " padded, %" PRId64 " a rank)",
                   d->opts.stage, d->world, d->n_params, d->n_groups, d->numel, d->padded, d->shard);
    return LLMCL_OK;
}

llmcl_status llmcl_dist_info_get(const llmcl_dist *d, llmcl_dist_info *out)
{
    LLMCL__REQUIRE(NULL, d && out, LLMCL_ERROR_INVALID_ARGUMENT, "d and out must not be NULL");
    *out = (llmcl_dist_info){
        .rank = d->rank, .world = d->world, .stage = d->opts.stage, .groups = d->n_groups,
        .params = d->n_params, .numel = d->numel, .padded_numel = d->padded,
        .shard_numel = d->shard, .max_group = d->max_group,
        .host_bytes = d->transport->host_bytes, .transport_bytes = d->transport->device_bytes,
        .transport = d->transport->kind, .overlap = d->overlap,
    };
    snprintf(out->transport_detail, sizeof out->transport_detail, "%s", d->transport_detail);
    return LLMCL_OK;
}

/* values[lo - p->offset, hi - p->offset) converted to dt, uploaded into t at element at. */
static llmcl_status upload_part(llmcl_dist *d, llmcl_tensor *t, int64_t at, const float *values,
                                int64_t count)
{
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    const size_t es = llmcl_dtype_size(dt);
    void *buf = dt == LLMCL_F32 ? (void *)values : malloc((size_t)count * es);
    LLMCL__REQUIRE(d->ctx, buf, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "conversion buffer");
    for (int64_t i = 0; dt != LLMCL_F32 && i < count; ++i)
        ((uint16_t *)buf)[i] = dt == LLMCL_BF16 ? llmcl_f32_to_bf16(values[i])
                                                : llmcl_f32_to_f16(values[i]);
    llmcl_tensor *view = NULL;
    llmcl_status st = llmcl__dist_view(t, at, count, &view);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(view, buf, (size_t)count * es);
    llmcl_tensor_destroy(view);
    if (buf != values)
        free(buf);
    return st;
}

llmcl_status llmcl_dist_init_param(llmcl_dist *d, const char *name, const float *values)
{
    dist_param *p;
    LLMCL__TRY(llmcl__dist_lookup(d, name, values, &p));
    const dist_group *g = &d->groups[p->group];
    /* A gathered group's views are in use: they would keep the old values until the next step. */
    LLMCL__REQUIRE(d->ctx, !g->gathered, LLMCL_ERROR_INVALID_ARGUMENT,
                   "'%s': its group %d is gathered: release it before llmcl_dist_init_param",
                   name, p->group);
    LLMCL__TRY(llmcl__dist_drain(d));
    if (d->opts.stage < 3)
        LLMCL__TRY(upload_part(d, g->params, p->offset, values, p->numel));
    int64_t lo, hi;
    if (llmcl__dist_segment(d, p, &lo, &hi)) {
        const int64_t at = g->shard_off + lo - d->rank * g->shard;
        LLMCL__TRY(upload_part(d, d->master, at, values + (lo - p->offset), hi - lo));
        if (d->opts.stage == 3)
            LLMCL__TRY(upload_part(d, d->param_shard, at, values + (lo - p->offset), hi - lo));
    }
    /* Gathered copies of the old values are stale now. */
    if (g->slot >= 0) {
        d->slot_group[g->slot] = -1;
        d->groups[p->group].slot = -1;
    }
    return LLMCL_OK;
}

/* The whole group's f32 masters from every rank: one all-gather. host holds g->numel floats. */
static llmcl_status gather_master(llmcl_dist *d, const dist_group *g, float *host)
{
    llmcl_tensor *view = NULL;
    float *mine = host + d->rank * g->shard;
    llmcl_status st = llmcl__dist_view(d->master, g->shard_off, g->shard, &view);
    if (st == LLMCL_OK)
        st = llmcl_tensor_download(view, mine, (size_t)g->shard * sizeof(float));
    llmcl_tensor_destroy(view);
    /* Take part even after a local failure, then agree: no rank is left waiting. */
    if (MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, (int)g->shard, MPI_FLOAT,
                      d->comm) != MPI_SUCCESS && st == LLMCL_OK)
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allgather of a group's masters");
    return llmcl__dist_agree(d, st);
}

/* values may be NULL on a rank (get_params' rule): refusing it there would leave the others in
   the gather. */
llmcl_status llmcl_dist_get_param(llmcl_dist *d, const char *name, float *values)
{
    return llmcl_dist_get_params(d, 1, &name, &values);
}

/* Gathers group gi once and copies every parameter of names[first...] in it; marks them done. */
static llmcl_status get_group(llmcl_dist *d, int gi, int first, int count, dist_param **ps,
                              float *const *values)
{
    const dist_group *g = &d->groups[gi];
    float *host = malloc((size_t)g->numel * sizeof *host);
    /* a rank without the buffer says so before the gather, which every rank must join */
    llmcl_status st = llmcl__dist_agree(
        d, host ? LLMCL_OK
                : LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "a group of %lld floats",
                              (long long)g->numel));
    if (st == LLMCL_OK)
        st = gather_master(d, g, host);
    for (int j = first; j < count; ++j)
        if (ps[j] && ps[j]->group == gi) {
            if (st == LLMCL_OK && values[j])
                memcpy(values[j], host + ps[j]->offset, (size_t)ps[j]->numel * sizeof(float));
            ps[j] = NULL;
        }
    free(host);
    return st;
}

llmcl_status llmcl_dist_get_params(llmcl_dist *d, int count, const char *const *names,
                                   float *const *values)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    LLMCL__REQUIRE(d->ctx, d->ready && count >= 0 && (count == 0 || (names && values)),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "call llmcl_dist_setup first; names and values must not be NULL (count %d)",
                   count);
    dist_param **ps = calloc((size_t)count + 1, sizeof *ps);
    llmcl_status st = ps ? LLMCL_OK
                         : LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "%d parameters",
                                       count);
    for (int i = 0; i < count && st == LLMCL_OK; ++i)
        if (!(ps[i] = llmcl__dist_find(d, names[i])))
            st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_INVALID_ARGUMENT, "no parameter '%s'",
                             names[i] ? names[i] : "(null)");
    /* a rank that cannot take part says so before the group gathers, which the others join */
    st = llmcl__dist_agree(d, st);
    for (int i = 0; i < count && st == LLMCL_OK; ++i)
        if (ps[i])
            st = get_group(d, ps[i]->group, i, count, ps, values);
    free(ps);
    return st;
}

llmcl_status llmcl_dist_measure_transport(llmcl_dist *d, uint64_t bytes, int reps,
                                          double *reduce_scatter_gbs, double *all_gather_gbs)
{
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_INVALID_ARGUMENT, "d must not be NULL");
    LLMCL__REQUIRE(d->ctx, reduce_scatter_gbs && all_gather_gbs && reps >= 1 &&
                               bytes >= 4 * (uint64_t)d->world && bytes <= (1ull << 34),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "outputs must not be NULL, reps >= 1, bytes in [4 x ranks, 16 GiB] (got %llu)",
                   (unsigned long long)bytes);
    LLMCL__TRY(llmcl__dist_drain(d));
    return llmcl__dist_agree(d, d->transport->ops->measure(d, bytes, reps, reduce_scatter_gbs,
                                                            all_gather_gbs));
}
