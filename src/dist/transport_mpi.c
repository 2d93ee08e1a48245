/*
 * transport_mpi.c: the host-staged MPI transport (transport.h), for every device: reduce-scatter
 * and all-gather of device buffers through pinned host memory, each a pipeline of chunks. A group
 * is P blocks of `shard` elements, block q rank q's; a chunk takes the same range of every block
 * through three stages:
 *   1. device -> pinned host on the d2h queue: the pieces this rank sends (a reduce-scatter: its
 *      gradients of the other ranks' blocks; an all-gather: its own block, for every other rank);
 *   2. MPI_Ialltoallv: a piece to every other rank, one from every other rank, none to itself;
 *   3. pinned host -> device on the h2d queue: the pieces received, into their blocks.
 * So the copy out of one chunk, the exchange of another and the copy back of a third overlap (two
 * queues: both directions of the link at once), and a rank's own block never crosses the link.
 * MPI only moves data: MPICH's reduce-scatter sums on the CPU through its shared-memory buffers,
 * several times slower than its all-to-all, so the sum runs on the device once the op is complete
 * (llmcl_sum_rows over the P blocks in rank order, zero.c) and the bits do not depend on MPI's
 * algorithms.
 *
 * Nothing blocks the host until a result is needed: progress polls events and MPI requests from
 * every dist call. MPI requires collectives in the same order on every rank, so chunks enter MPI
 * in issue order, op by op and chunk by chunk: the program's order, the same on every rank
 * whatever the copies' timing. The copies out are enqueued in that order too, so that a later
 * op's copy, waiting in the in-order d2h queue for its kernels, never holds up an earlier op's
 * chunks. A wait blocks on the oldest step of this pipeline: everything after it waits for it.
 */
#include <stdlib.h>
#include <string.h>

#include "staging.h"
#include "transport.h"

/* Chunks of one op in flight: the copy out of one, the exchange of another and the copy back of a
   third overlap, with one to spare. */
#define DIST_DEPTH 4

/* A pinned host buffer, mapped once for the transport's life. */
typedef struct dist_pinned {
    cl_mem mem;
    char *host;
    size_t bytes;
} dist_pinned;

/* A staging slot of an op: pinned send and receive areas for one chunk, and that chunk's state. */
typedef struct dist_slot {
    char *send, *recv;
    int *counts, *sdispls, *rdispls; /* MPI_Ialltoallv's arguments, which MPI reads until done */
    cl_event d2h;                    /* the chunk's pieces are in send */
    cl_event h2d;                    /* recv may be written again after this (outlives the op) */
    MPI_Request req;
} dist_slot;

/*
 * One collective, a pipeline of chunks: device -> pinned host (d2h queue) -> MPI_Ialltoallv ->
 * device (h2d queue). Chunk c is the elements [c piece, (c + 1) piece) of every block. Chunks
 * enter MPI in issue order (seq, then chunk), the same program order on every rank, as MPI
 * requires of collectives.
 */
typedef struct dist_op {
    int kind, group;
    bool active;                       /* started, not yet completed */
    uint64_t seq;                      /* issue order among ops with chunks */
    int64_t chunks;                    /* 0 on one rank: nothing to exchange */
    int64_t copied, exchanged, landed; /* chunks copied out (enqueued), in MPI, copied back */
    int64_t shard, piece;              /* elements of a block; of a block in one chunk */
    int depth;                         /* slots: DIST_DEPTH, fewer if no shard needs them all */
    size_t es;
    cl_mem buf;
    size_t src_off, dst_off;           /* bytes: what this rank sends from (a reduce: block 0; a
                                          gather: its own block); block 0 */
    cl_event ready;                    /* the source may be read after this */
    cl_event dst_free;                 /* buf may be written after this (NULL: at once) */
    MPI_Datatype type;
    dist_pinned host;                  /* the slots' areas */
    int *args;                         /* the slots' MPI arguments */
    dist_slot slot[DIST_DEPTH];
} dist_op;

typedef struct mpi_transport {
    dist_transport base;
    cl_command_queue d2hq, h2dq; /* copies to and from host memory, one direction each */
    dist_op reduce_op[DIST_SLOTS], gather_op[DIST_SLOTS];
    uint64_t next_seq, next_mpi_seq;
} mpi_transport;

static mpi_transport *mpi_of(const llmcl_dist *d)
{
    return (mpi_transport *)d->transport;
}

static llmcl_status pinned_create(llmcl_dist *d, size_t bytes, dist_pinned *out)
{
    cl_int err;
    out->bytes = bytes;
    out->mem = clCreateBuffer(d->ctx->context, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, bytes,
                              NULL, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clCreateBuffer (pinned host staging)", __FILE__,
                              __LINE__);
    out->host = clEnqueueMapBuffer(mpi_of(d)->d2hq, out->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
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
        clFinish(mpi_of(d)->d2hq);
        clFinish(mpi_of(d)->h2dq);
        if (p->host)
            clEnqueueUnmapMemObject(mpi_of(d)->d2hq, p->mem, p->host, 0, NULL, NULL);
        clFinish(mpi_of(d)->d2hq);
        clReleaseMemObject(p->mem);
    }
    memset(p, 0, sizeof *p);
}

/* Elements of a block in one chunk (staging_slice): chunk_bytes (1 MiB if unset) over the pieces
   a chunk receives, at most the largest shard, aligned so that every copy starts aligned on the
   device and in host memory. */
static int64_t piece_for(const llmcl_dist *d, size_t es)
{
    const uint64_t chunk = d->opts.chunk_bytes ? d->opts.chunk_bytes : DIST_CHUNK_BYTES;
    return (int64_t)staging_slice(chunk, es, d->world, (size_t)(d->max_group / d->world),
                                  DIST_ALIGN);
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

static llmcl_status mpi_setup(llmcl_dist *d)
{
    mpi_transport *t = mpi_of(d);
    const MPI_Datatype wire = llmcl__dist_mpi_type(d->opts.reduce_dtype);
    const MPI_Datatype param = llmcl__dist_mpi_type(d->opts.param_dtype);
    for (int s = 0; s < DIST_SLOTS; ++s) {
        LLMCL__TRY(op_create(d, &t->reduce_op[s], OP_REDUCE, d->opts.reduce_dtype, wire));
        LLMCL__TRY(op_create(d, &t->gather_op[s], OP_GATHER, d->opts.param_dtype, param));
        t->base.host_bytes += t->reduce_op[s].host.bytes + t->gather_op[s].host.bytes;
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

static void mpi_quiesce(llmcl_dist *d)
{
    clFinish(mpi_of(d)->d2hq);
    clFinish(mpi_of(d)->h2dq);
}

static void mpi_release(llmcl_dist *d)
{
    mpi_transport *t = mpi_of(d);
    for (int s = 0; s < DIST_SLOTS; ++s) {
        op_destroy(d, &t->reduce_op[s]);
        op_destroy(d, &t->gather_op[s]);
    }
    t->base.host_bytes = 0;
}

static void mpi_destroy(llmcl_dist *d)
{
    mpi_transport *t = mpi_of(d);
    mpi_release(d);
    if (t->d2hq)
        clReleaseCommandQueue(t->d2hq);
    if (t->h2dq)
        clReleaseCommandQueue(t->h2dq);
    free(t);
    d->transport = NULL;
}

static llmcl_status mpi_progress(llmcl_dist *d);

/* Elements of a block in chunk c (the last one may be short). */
static int64_t chunk_len(const dist_op *op, int64_t c)
{
    const int64_t rest = op->shard - c * op->piece;
    return rest < op->piece ? rest : op->piece;
}

/* The op's chunks and its place in the issue order; its copies wait for the kernels so far. */
static llmcl_status op_start(llmcl_dist *d, dist_op *op, int group, cl_mem buf, size_t src_off,
                             size_t dst_off)
{
    op->group = group;
    op->shard = d->groups[group].shard;
    op->chunks = d->world > 1 ? llmcl__div_up(op->shard, op->piece) : 0;
    op->copied = op->exchanged = op->landed = 0;
    op->buf = buf;
    op->src_off = src_off;
    op->dst_off = dst_off;
    op->active = true;
    if (op->chunks == 0)
        return LLMCL_OK;
    op->seq = mpi_of(d)->next_seq++;
    LLMCL__TRY(llmcl__dist_marker(d, &op->ready));
    return mpi_progress(d);
}

static llmcl_status mpi_reduce_start(llmcl_dist *d, int channel, int group,
                                     const llmcl_tensor *buf, int64_t off)
{
    dist_op *op = &mpi_of(d)->reduce_op[channel];
    const size_t at = (size_t)(buf->offset + off) * op->es;
    return op_start(d, op, group, buf->mem, at, at);
}

static llmcl_status mpi_gather_start(llmcl_dist *d, int channel, int group,
                                     const llmcl_tensor *buf, int64_t off, cl_event dst_free)
{
    dist_op *op = &mpi_of(d)->gather_op[channel];
    const size_t to = (size_t)(buf->offset + off) * op->es;
    const size_t own = to + (size_t)(d->rank * d->groups[group].shard) * op->es;
    if (dst_free)
        clRetainEvent(dst_free);
    op->dst_free = dst_free;
    return op_start(d, op, group, buf->mem, own, to);
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
            mpi_of(d)->d2hq, op->buf, CL_FALSE, op->src_off + block + at, len,
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
            mpi_of(d)->h2dq, op->buf, CL_FALSE, op->dst_off + at, len,
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
    return k < DIST_SLOTS ? &mpi_of(d)->reduce_op[k] : &mpi_of(d)->gather_op[k - DIST_SLOTS];
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
            LLMCL__CL(d->ctx, clFlush(mpi_of(d)->h2dq));
    }
    return LLMCL_OK;
}

/* Stage 1 into every free slot, in issue order: an op's copies only once the earlier op's are
   all enqueued. */
static llmcl_status fill_slots(llmcl_dist *d)
{
    bool any = false;
    for (uint64_t seq = mpi_of(d)->next_mpi_seq; seq < mpi_of(d)->next_seq; ++seq) {
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
        LLMCL__CL(d->ctx, clFlush(mpi_of(d)->d2hq));
    return LLMCL_OK;
}

/* Stage 2 in issue order: a chunk enters MPI once its copy out is done and its slot's receive area
   has been copied back from. */
static llmcl_status exchange(llmcl_dist *d)
{
    for (;;) {
        dist_op *op = op_with_seq(d, mpi_of(d)->next_mpi_seq);
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
            mpi_of(d)->next_mpi_seq++;
    }
}

static llmcl_status mpi_progress(llmcl_dist *d)
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

static dist_op *channel_op(const llmcl_dist *d, int kind, int channel)
{
    mpi_transport *t = mpi_of(d);
    return kind == OP_REDUCE ? &t->reduce_op[channel] : &t->gather_op[channel];
}

static llmcl_status mpi_complete(llmcl_dist *d, int kind, int channel)
{
    dist_op *op = channel_op(d, kind, channel);
    if (!op->active)
        return LLMCL_OK;
    LLMCL__TRY(mpi_progress(d));
    while (op->landed < op->chunks) {
        LLMCL__TRY(wait_oldest(d));
        LLMCL__TRY(mpi_progress(d));
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

static int mpi_busy(const llmcl_dist *d, int kind, int channel)
{
    const dist_op *op = channel_op(d, kind, channel);
    return op->active ? op->group : -1;
}

/* Bare MPI on host memory: an all-to-all of bytes / P a pair (the exchange of a reduce-scatter of
   bytes) and an all-gather of bytes / P a rank, each piece count elements of a contiguous type of
   unit bytes (staging_measure_piece: 16 GiB over few ranks passes an int's count of bytes). */
static llmcl_status mpi_measure(llmcl_dist *d, uint64_t bytes, int reps, double *reduce_gbs,
                                double *gather_gbs)
{
    uint64_t unit;
    int count;
    staging_measure_piece(bytes, d->world, &unit, &count);
    const size_t piece = (size_t)unit * (size_t)count;
    char *send = calloc(2, piece * (size_t)d->world);
    /* every rank learns of one without its buffers before the barriers the others wait in */
    const llmcl_status st = llmcl__dist_agree(
        d, send ? LLMCL_OK
                : LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "%llu bytes",
                              (unsigned long long)bytes));
    if (st != LLMCL_OK) {
        free(send);
        return st;
    }
    char *recv = send + piece * (size_t)d->world;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous((int)unit, MPI_BYTE, &type);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&type);
    double t[2] = {0.0, 0.0};
    for (int i = -1; i < reps && rc == MPI_SUCCESS; ++i)
        for (int k = 0; k < 2 && rc == MPI_SUCCESS; ++k) {
            MPI_Barrier(d->comm);
            const double t0 = MPI_Wtime();
            rc = k == 0 ? MPI_Alltoall(send, count, type, recv, count, type, d->comm)
                        : MPI_Allgather(send, count, type, recv, count, type, d->comm);
            if (i >= 0)
                t[k] += MPI_Wtime() - t0;
        }
    if (type != MPI_DATATYPE_NULL)
        MPI_Type_free(&type);
    free(send);
    LLMCL__REQUIRE(d->ctx, rc == MPI_SUCCESS, LLMCL_ERROR_MPI, "MPI failed (%d)", rc);
    *reduce_gbs = (double)bytes * reps / t[0] * 1e-9;
    *gather_gbs = (double)bytes * reps / t[1] * 1e-9;
    return LLMCL_OK;
}

static const dist_transport_ops mpi_ops = {
    .setup = mpi_setup,
    .busy = mpi_busy,
    .reduce_start = mpi_reduce_start,
    .gather_start = mpi_gather_start,
    .complete = mpi_complete,
    .sum_parts = llmcl__dist_sum_blocks,
    .progress = mpi_progress,
    .quiesce = mpi_quiesce,
    .release = mpi_release,
    .destroy = mpi_destroy,
    .measure = mpi_measure,
};

llmcl_status llmcl__dist_mpi_create(llmcl_dist *d)
{
    mpi_transport *t = calloc(1, sizeof *t);
    LLMCL__REQUIRE(d->ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "MPI transport");
    t->base.ops = &mpi_ops;
    t->base.kind = LLMCL_DIST_TRANSPORT_MPI;
    t->base.overlaps = true; /* its copies and MPI leave the device free for the kernels */
    d->transport = &t->base;
    cl_int err;
    t->d2hq = clCreateCommandQueue(d->ctx->context, d->ctx->device, 0, &err);
    if (err == CL_SUCCESS)
        t->h2dq = clCreateCommandQueue(d->ctx->context, d->ctx->device, 0, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clCreateCommandQueue (copy queues)", __FILE__,
                              __LINE__);
    return LLMCL_OK;
}
