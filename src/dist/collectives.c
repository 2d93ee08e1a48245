/*
 * collectives.c: reduce-scatter and all-gather of device buffers through pinned host memory
 * (NVIDIA's OpenCL has no GPU-aware MPI), each a pipeline of chunks. A group is P blocks of
 * `shard` elements, block q rank q's; a chunk takes the same range of every block through three
 * stages:
 *   1. device -> pinned host on the d2h queue: the pieces this rank sends (a reduce-scatter: its
 *      gradients of the other ranks' blocks; an all-gather: its own block, for every other rank);
 *   2. MPI_Ialltoallv: a piece to every other rank, one from every other rank, none to itself;
 *   3. pinned host -> device on the h2d queue: the pieces received, into their blocks.
 * So the copy out of one chunk, the exchange of another and the copy back of a third overlap (two
 * queues: both directions of the link at once), and a rank's own block never crosses the link
 * (an all-gather copies it on the device). MPI only moves data: MPICH's reduce-scatter sums on the
 * CPU through its shared-memory buffers, several times slower than its all-to-all, so the sum runs
 * on the device once the op is complete (llmcl_sum_rows over the P blocks in rank order, zero.c)
 * and the bits do not depend on MPI's algorithms.
 *
 * Nothing blocks the host until a result is needed: llmcl__dist_progress polls events and MPI
 * requests from every dist call. MPI requires collectives in the same order on every rank, so
 * chunks enter MPI in issue order, op by op and chunk by chunk: the program's order, the same on
 * every rank whatever the copies' timing. The copies out are enqueued in that order too, so that
 * a later op's copy, waiting in the in-order d2h queue for its kernels, never holds up an earlier
 * op's chunks. A wait blocks on the oldest step of this pipeline: everything after it waits for it.
 */
#include <stdlib.h>
#include <string.h>

#include "dist.h"

static llmcl_status pinned_create(llmcl_dist *d, size_t bytes, dist_pinned *out)
{
    cl_int err;
    out->bytes = bytes;
    out->mem = clCreateBuffer(d->ctx->context, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, bytes,
                              NULL, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clCreateBuffer (pinned host staging)", __FILE__,
                              __LINE__);
    out->host = clEnqueueMapBuffer(d->d2hq, out->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                   bytes, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clEnqueueMapBuffer (pinned host staging)", __FILE__,
                              __LINE__);
    return LLMCL_OK;
}

static void pinned_destroy(llmcl_dist *d, dist_pinned *p)
{
    if (p->mem) {
        /* copies still in flight use the memory */
        clFinish(d->d2hq);
        clFinish(d->h2dq);
        if (p->host)
            clEnqueueUnmapMemObject(d->d2hq, p->mem, p->host, 0, NULL, NULL);
        clFinish(d->d2hq);
        clReleaseMemObject(p->mem);
    }
    memset(p, 0, sizeof *p);
}

/* Elements of a block in one chunk: chunk_bytes over the pieces a chunk receives (P - 1), at most
   the largest shard, at least 1; a multiple of DIST_ALIGN where it can be, so that with the shards
   (multiples of it too) every copy starts aligned on the device and in host memory. */
static int64_t piece_for(const llmcl_dist *d, size_t es)
{
    const int64_t peers = d->world > 1 ? d->world - 1 : 1;
    const int64_t piece = (int64_t)(d->opts.chunk_bytes / es) / peers;
    const int64_t max = d->max_group / d->world;
    const int64_t capped = piece < max ? piece : max;
    if (capped > DIST_ALIGN)
        return capped - capped % DIST_ALIGN;
    return capped > 1 ? capped : 1;
}

/* The other ranks in rank order: the j-th is rank j, or j + 1 from this rank on. */
static int peer(const llmcl_dist *d, int j)
{
    return j + (j >= d->rank);
}

/* An op's pinned slots and the MPI arguments that stay fixed: piece j of a slot is the j-th other
   rank's. An all-gather sends its one piece to every rank. */
static llmcl_status op_create(llmcl_dist *d, dist_op *op, int kind, llmcl_dtype dt,
                              MPI_Datatype type)
{
    const int P = d->world;
    op->kind = kind;
    op->es = llmcl_dtype_size(dt);
    op->type = type;
    op->piece = piece_for(d, op->es);
    /* Slots beyond the chunks of the largest shard would never be used. */
    const int64_t chunks = llmcl__div_up(d->max_group / P, op->piece);
    op->depth = chunks < 1 ? 1 : chunks < DIST_DEPTH ? (int)chunks : DIST_DEPTH;
    if (P == 1)
        return LLMCL_OK; /* nothing to exchange */
    const size_t recv = (size_t)(P - 1) * (size_t)op->piece * op->es;
    const size_t send = kind == OP_REDUCE ? recv : (size_t)op->piece * op->es;
    op->args = calloc((size_t)(3 * P * op->depth), sizeof *op->args);
    LLMCL__REQUIRE(d->ctx, op->args, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "MPI arguments");
    LLMCL__TRY(pinned_create(d, (size_t)op->depth * (send + recv), &op->host));
    for (int k = 0; k < op->depth; ++k) {
        dist_slot *s = &op->slot[k];
        s->send = op->host.host + k * (send + recv);
        s->recv = s->send + send;
        s->counts = op->args + 3 * P * k;
        s->sdispls = s->counts + P;
        s->rdispls = s->sdispls + P;
        for (int j = 0; j < P - 1; ++j) {
            s->sdispls[peer(d, j)] = kind == OP_REDUCE ? (int)(j * op->piece) : 0;
            s->rdispls[peer(d, j)] = (int)(j * op->piece);
        }
    }
    return LLMCL_OK;
}

llmcl_status llmcl__dist_channels_create(llmcl_dist *d)
{
    for (int s = 0; s < DIST_SLOTS; ++s) {
        LLMCL__TRY(op_create(d, &d->reduce_op[s], OP_REDUCE, d->opts.reduce_dtype, d->wire_type));
        LLMCL__TRY(op_create(d, &d->gather_op[s], OP_GATHER, d->opts.param_dtype, d->param_type));
    }
    return LLMCL_OK;
}

/* Chunk c's slot. */
static dist_slot *slot_of(dist_op *op, int64_t c)
{
    return &op->slot[c % op->depth];
}

static void op_destroy(llmcl_dist *d, dist_op *op)
{
    for (int64_t c = op->landed; op->active && c < op->exchanged; ++c)
        MPI_Wait(&slot_of(op, c)->req, MPI_STATUS_IGNORE);
    for (int k = 0; k < DIST_DEPTH; ++k) {
        llmcl__release_event(&op->slot[k].d2h);
        llmcl__release_event(&op->slot[k].h2d);
    }
    llmcl__release_event(&op->ready);
    llmcl__release_event(&op->dst_free);
    pinned_destroy(d, &op->host);
    free(op->args);
    memset(op, 0, sizeof *op);
}

void llmcl__dist_channels_destroy(llmcl_dist *d)
{
    for (int s = 0; s < DIST_SLOTS; ++s) {
        op_destroy(d, &d->reduce_op[s]);
        op_destroy(d, &d->gather_op[s]);
    }
}

llmcl_status llmcl__dist_marker(llmcl_dist *d, cl_event *out)
{
    LLMCL__CL(d->ctx, clEnqueueMarkerWithWaitList(d->ctx->queue, 0, NULL, out));
    /* Without a flush the marker may never reach the device while a copy queue waits on it. */
    LLMCL__CL(d->ctx, clFlush(d->ctx->queue));
    return LLMCL_OK;
}

/* Elements of a block in chunk c (the last one may be short). */
static int64_t chunk_len(const dist_op *op, int64_t c)
{
    const int64_t rest = op->shard - c * op->piece;
    return rest < op->piece ? rest : op->piece;
}

/* The op's chunks and its place in the issue order; its copies wait for the kernels so far. */
static llmcl_status op_start(llmcl_dist *d, dist_op *op, int group, cl_mem src, size_t src_off,
                             cl_mem dst, size_t dst_off)
{
    op->group = group;
    op->shard = d->groups[group].shard;
    op->chunks = d->world > 1 ? llmcl__div_up(op->shard, op->piece) : 0;
    op->copied = op->exchanged = op->landed = 0;
    op->src = src;
    op->src_off = src_off;
    op->dst = dst;
    op->dst_off = dst_off;
    op->active = true;
    if (op->chunks == 0)
        return LLMCL_OK;
    op->seq = d->next_seq++;
    LLMCL__TRY(llmcl__dist_marker(d, &op->ready));
    return llmcl__dist_progress(d);
}

llmcl_status llmcl__dist_reduce_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off)
{
    dist_op *op = &d->reduce_op[channel];
    const size_t at = (size_t)(src->offset + src_off) * op->es;
    return op_start(d, op, group, src->mem, at, src->mem, at);
}

llmcl_status llmcl__dist_gather_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off, const llmcl_tensor *dst, int64_t dst_off,
                                      cl_event dst_free)
{
    dist_op *op = &d->gather_op[channel];
    const dist_group *g = &d->groups[group];
    const size_t from = (size_t)(src->offset + src_off) * op->es;
    const size_t to = (size_t)(dst->offset + dst_off) * op->es;
    const size_t own = to + (size_t)(d->rank * g->shard) * op->es;
    /* On the compute queue, which is past the kernels that read dst before (they were released). */
    if (src->mem != dst->mem || from != own)
        LLMCL__CL(d->ctx, clEnqueueCopyBuffer(d->ctx->queue, src->mem, dst->mem, from, own,
                                              (size_t)g->shard * op->es, 0, NULL, NULL));
    if (dst_free)
        clRetainEvent(dst_free);
    op->dst_free = dst_free;
    return op_start(d, op, group, src->mem, from, dst->mem, to);
}

/* Stage 1 of the op's next chunk: the pieces this rank sends, into its slot's send area. */
static llmcl_status copy_out(llmcl_dist *d, dist_op *op)
{
    const int64_t c = op->copied;
    dist_slot *s = slot_of(op, c);
    const size_t len = (size_t)chunk_len(op, c) * op->es, at = (size_t)(c * op->piece) * op->es;
    const int pieces = op->kind == OP_REDUCE ? d->world - 1 : 1;
    for (int j = 0; j < pieces; ++j) {
        const size_t block = op->kind == OP_REDUCE ? (size_t)(peer(d, j) * op->shard) * op->es : 0;
        /* Only the first waits for the marker: the queue is in order. */
        const cl_int err = clEnqueueReadBuffer(
            d->d2hq, op->src, CL_FALSE, op->src_off + block + at, len,
            s->send + (size_t)(j * op->piece) * op->es, op->ready ? 1 : 0,
            op->ready ? &op->ready : NULL, j == pieces - 1 ? &s->d2h : NULL);
        if (err != CL_SUCCESS)
            return llmcl__fail_cl(d->ctx, err, "clEnqueueReadBuffer (to host staging)", __FILE__,
                                  __LINE__);
        llmcl__release_event(&op->ready);
    }
    op->copied++;
    return LLMCL_OK;
}

/* Stage 3 of the op's oldest exchanged chunk: the pieces received, into their blocks. */
static llmcl_status copy_back(llmcl_dist *d, dist_op *op)
{
    const int64_t c = op->landed;
    dist_slot *s = slot_of(op, c);
    const size_t len = (size_t)chunk_len(op, c) * op->es;
    for (int j = 0; j < d->world - 1; ++j) {
        const size_t at = (size_t)(peer(d, j) * op->shard + c * op->piece) * op->es;
        /* Only the first waits for the destination: the queue is in order. */
        const cl_int err = clEnqueueWriteBuffer(
            d->h2dq, op->dst, CL_FALSE, op->dst_off + at, len,
            s->recv + (size_t)(j * op->piece) * op->es, op->dst_free ? 1 : 0,
            op->dst_free ? &op->dst_free : NULL, j == d->world - 2 ? &s->h2d : NULL);
        if (err != CL_SUCCESS)
            return llmcl__fail_cl(d->ctx, err, "clEnqueueWriteBuffer (from host staging)",
                                  __FILE__, __LINE__);
        llmcl__release_event(&op->dst_free);
    }
    op->landed++;
    return LLMCL_OK;
}

static dist_op *op_at(llmcl_dist *d, int k)
{
    return k < DIST_SLOTS ? &d->reduce_op[k] : &d->gather_op[k - DIST_SLOTS];
}

/* The op issued seq-th among those with chunks, if it is still going. */
static dist_op *op_with_seq(llmcl_dist *d, uint64_t seq)
{
    for (int k = 0; k < 2 * DIST_SLOTS; ++k) {
        dist_op *op = op_at(d, k);
        if (op->active && op->chunks > 0 && op->seq == seq)
            return op;
    }
    return NULL;
}

/* Whether *e has completed (NULL counts as completed); released once it has. */
static llmcl_status poll_event(llmcl_dist *d, const dist_op *op, cl_event *e, bool *done)
{
    *done = true;
    if (!*e)
        return LLMCL_OK;
    cl_int status;
    LLMCL__CL(d->ctx, clGetEventInfo(*e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status,
                                     NULL));
    LLMCL__REQUIRE(d->ctx, status >= 0, LLMCL_ERROR_MPI,
                   "a copy of group %d through host memory failed (%s)", op->group,
                   llmcl_status_str(status));
    *done = status == CL_COMPLETE;
    if (*done)
        llmcl__release_event(e);
    return LLMCL_OK;
}

/* Stage 3 of every chunk whose exchange is done, oldest first within each op. */
static llmcl_status land(llmcl_dist *d)
{
    for (int k = 0; k < 2 * DIST_SLOTS; ++k) {
        dist_op *op = op_at(d, k);
        const int64_t before = op->landed;
        while (op->active && op->landed < op->exchanged) {
            int done = 0;
            LLMCL__REQUIRE(d->ctx, MPI_Test(&slot_of(op, op->landed)->req, &done,
                                            MPI_STATUS_IGNORE) == MPI_SUCCESS,
                           LLMCL_ERROR_MPI, "MPI_Test of group %d failed", op->group);
            if (!done)
                break;
            LLMCL__TRY(copy_back(d, op));
        }
        if (op->landed > before)
            LLMCL__CL(d->ctx, clFlush(d->h2dq));
    }
    return LLMCL_OK;
}

/* Stage 1 into every free slot, in issue order: an op's copies only once the earlier op's are
   all enqueued. */
static llmcl_status fill_slots(llmcl_dist *d)
{
    bool any = false;
    for (uint64_t seq = d->next_mpi_seq; seq < d->next_seq; ++seq) {
        dist_op *op = op_with_seq(d, seq);
        if (!op)
            break;
        while (op->copied < op->chunks && op->copied - op->landed < op->depth) {
            LLMCL__TRY(copy_out(d, op));
            any = true;
        }
        if (op->copied < op->chunks)
            break;
    }
    if (any)
        LLMCL__CL(d->ctx, clFlush(d->d2hq));
    return LLMCL_OK;
}

/* Stage 2 in issue order: a chunk enters MPI once its copy out is done and its slot's receive area
   has been copied back from. */
static llmcl_status exchange(llmcl_dist *d)
{
    for (;;) {
        dist_op *op = op_with_seq(d, d->next_mpi_seq);
        if (!op || op->exchanged == op->copied)
            return LLMCL_OK;
        dist_slot *s = slot_of(op, op->exchanged);
        bool copied, recv_free;
        LLMCL__TRY(poll_event(d, op, &s->d2h, &copied));
        LLMCL__TRY(poll_event(d, op, &s->h2d, &recv_free));
        if (!copied || !recv_free)
            return LLMCL_OK;
        const int len = (int)chunk_len(op, op->exchanged);
        for (int q = 0; q < d->world; ++q)
            s->counts[q] = q == d->rank ? 0 : len;
        const int rc = MPI_Ialltoallv(s->send, s->counts, s->sdispls, op->type, s->recv,
                                      s->counts, s->rdispls, op->type, d->comm, &s->req);
        LLMCL__REQUIRE(d->ctx, rc == MPI_SUCCESS, LLMCL_ERROR_MPI,
                       "MPI_Ialltoallv of group %d, chunk %lld failed (MPI %d)", op->group,
                       (long long)op->exchanged, rc);
        if (++op->exchanged == op->chunks)
            d->next_mpi_seq++;
    }
}

llmcl_status llmcl__dist_progress(llmcl_dist *d)
{
    LLMCL__TRY(land(d));
    LLMCL__TRY(fill_slots(d));
    return exchange(d);
}

/* Blocks on what holds up the oldest unfinished op: its oldest exchange or, before that enters
   MPI, its copy out and its slot's last copy back. */
static llmcl_status wait_oldest(llmcl_dist *d)
{
    dist_op *op = NULL;
    for (int k = 0; k < 2 * DIST_SLOTS; ++k) {
        dist_op *o = op_at(d, k);
        if (o->active && o->landed < o->chunks && (!op || o->seq < op->seq))
            op = o;
    }
    LLMCL__REQUIRE(d->ctx, op, LLMCL_ERROR_MPI, "internal: no op to wait for");
    dist_slot *s = slot_of(op, op->landed);
    if (op->landed < op->exchanged) {
        LLMCL__REQUIRE(d->ctx, MPI_Wait(&s->req, MPI_STATUS_IGNORE) == MPI_SUCCESS,
                       LLMCL_ERROR_MPI, "MPI_Wait of group %d failed", op->group);
        return LLMCL_OK;
    }
    cl_event wait[2];
    cl_uint n = 0;
    if (s->d2h)
        wait[n++] = s->d2h;
    if (s->h2d)
        wait[n++] = s->h2d;
    if (n > 0)
        LLMCL__CL(d->ctx, clWaitForEvents(n, wait));
    return LLMCL_OK;
}

llmcl_status llmcl__dist_complete(llmcl_dist *d, dist_op *op)
{
    if (!op->active)
        return LLMCL_OK;
    LLMCL__TRY(llmcl__dist_progress(d));
    while (op->landed < op->chunks) {
        LLMCL__TRY(wait_oldest(d));
        LLMCL__TRY(llmcl__dist_progress(d));
    }
    op->active = false;
    llmcl__release_event(&op->dst_free);
    if (op->chunks == 0)
        return LLMCL_OK;
    /* The h2d queue is in order: its last chunk's copy back completes after all the others. */
    LLMCL__CL(d->ctx, clEnqueueBarrierWithWaitList(d->ctx->queue, 1,
                                                   &slot_of(op, op->chunks - 1)->h2d, NULL));
    return LLMCL_OK;
}
