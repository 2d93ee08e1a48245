/*
 * collectives.c: reduce-scatter and all-gather of device buffers, staged through pinned host
 * memory, because NVIDIA's OpenCL has no GPU-aware MPI. An op goes through three stages, each
 * overlapping the kernels on the compute queue:
 *   1. a marker on the compute queue, then a device-to-host copy on the copy queue waiting on it;
 *   2. once the copy is done, a nonblocking MPI collective on the pinned buffer;
 *   3. once MPI is done, a host-to-device copy on the copy queue; the compute queue waits for it
 *      (an event barrier, never clFinish) only when the result is needed.
 * Nothing blocks the host until a result is needed: llmcl__dist_progress polls events and MPI
 * requests from every dist call. MPI requires collectives in the same order on every rank, so an
 * op enters MPI only after every op issued before it: the issue order is the program's, identical
 * on every rank, whatever the copies' timing.
 */
#include <stdlib.h>
#include <string.h>

#include "dist.h"

static llmcl_status pinned_create(llmcl_dist *d, size_t bytes, dist_pinned *out)
{
    cl_int err;
    out->bytes = bytes;
    out->mem = clCreateBuffer(d->ctx->context, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE,
                              bytes ? bytes : 1, NULL, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clCreateBuffer (pinned host staging)", __FILE__,
                              __LINE__);
    out->host = clEnqueueMapBuffer(d->copyq, out->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                   bytes ? bytes : 1, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clEnqueueMapBuffer (pinned host staging)", __FILE__,
                              __LINE__);
    return LLMCL_OK;
}

static void pinned_destroy(llmcl_dist *d, dist_pinned *p)
{
    if (p->host)
        clEnqueueUnmapMemObject(d->copyq, p->mem, p->host, 0, NULL, NULL);
    if (p->mem) {
        clFinish(d->copyq);
        clReleaseMemObject(p->mem);
    }
    memset(p, 0, sizeof *p);
}

llmcl_status llmcl__dist_channels_create(llmcl_dist *d)
{
    const size_t rs = (size_t)d->max_group * llmcl_dtype_size(d->opts.reduce_dtype);
    const size_t ag = (size_t)d->max_group * llmcl_dtype_size(d->opts.param_dtype);
    for (int s = 0; s < DIST_SLOTS; ++s) {
        LLMCL__TRY(pinned_create(d, rs, &d->reduce_host[s]));
        LLMCL__TRY(pinned_create(d, ag, &d->gather_host[s]));
        d->reduce_op[s].host = d->reduce_host[s].host;
        d->gather_op[s].host = d->gather_host[s].host;
    }
    return LLMCL_OK;
}

static void release_event(cl_event *e)
{
    if (*e)
        clReleaseEvent(*e);
    *e = NULL;
}

void llmcl__dist_channels_destroy(llmcl_dist *d)
{
    for (int s = 0; s < DIST_SLOTS; ++s) {
        dist_op *ops[2] = {&d->reduce_op[s], &d->gather_op[s]};
        for (int k = 0; k < 2; ++k) {
            if (ops[k]->state == OP_MPI)
                MPI_Wait(&ops[k]->req, MPI_STATUS_IGNORE);
            release_event(&ops[k]->d2h);
            release_event(&ops[k]->h2d);
            release_event(&ops[k]->dst_free);
            memset(ops[k], 0, sizeof *ops[k]);
        }
        pinned_destroy(d, &d->reduce_host[s]);
        pinned_destroy(d, &d->gather_host[s]);
    }
}

llmcl_status llmcl__dist_marker(llmcl_dist *d, cl_event *out)
{
    LLMCL__CL(d->ctx, clEnqueueMarkerWithWaitList(d->ctx->queue, 0, NULL, out));
    /* Without a flush the marker may never reach the device while the copy queue waits on it. */
    LLMCL__CL(d->ctx, clFlush(d->ctx->queue));
    return LLMCL_OK;
}

/* Stage 1: the source bytes to the pinned buffer, after the kernels enqueued so far. */
static llmcl_status copy_in(llmcl_dist *d, dist_op *op, const llmcl_tensor *src, size_t src_byte,
                            size_t bytes, size_t host_byte)
{
    cl_event ready;
    LLMCL__TRY(llmcl__dist_marker(d, &ready));
    cl_int err = clEnqueueReadBuffer(d->copyq, src->mem, CL_FALSE, src_byte, bytes,
                                     op->host + host_byte, 1, &ready, &op->d2h);
    clReleaseEvent(ready);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clEnqueueReadBuffer (to host staging)", __FILE__,
                              __LINE__);
    LLMCL__CL(d->ctx, clFlush(d->copyq));
    op->state = OP_COPY_IN;
    op->seq = d->next_seq++;
    return LLMCL_OK;
}

llmcl_status llmcl__dist_reduce_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off, int64_t count, const llmcl_tensor *dst,
                                      int64_t dst_off)
{
    dist_op *op = &d->reduce_op[channel];
    const size_t es = llmcl_dtype_size(src->dtype);
    op->kind = OP_REDUCE;
    op->group = group;
    op->dst = dst->mem;
    op->dst_off = (size_t)(dst->offset + dst_off) * es;
    op->dst_bytes = (size_t)(count / d->world) * es;
    LLMCL__TRY(copy_in(d, op, src, (size_t)(src->offset + src_off) * es, (size_t)count * es, 0));
    return llmcl__dist_progress(d);
}

llmcl_status llmcl__dist_gather_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off, const llmcl_tensor *dst, int64_t dst_off,
                                      cl_event dst_free)
{
    dist_op *op = &d->gather_op[channel];
    const dist_group *g = &d->groups[group];
    const size_t es = llmcl_dtype_size(src->dtype);
    op->kind = OP_GATHER;
    op->group = group;
    op->dst = dst->mem;
    op->dst_off = (size_t)(dst->offset + dst_off) * es;
    op->dst_bytes = (size_t)g->numel * es;
    if (dst_free)
        clRetainEvent(dst_free);
    op->dst_free = dst_free;
    /* In place: the rank's part goes where the all-gather expects it. */
    LLMCL__TRY(copy_in(d, op, src, (size_t)(src->offset + src_off) * es, (size_t)g->shard * es,
                       (size_t)(d->rank * g->shard) * es));
    return llmcl__dist_progress(d);
}

/* Stage 2: the collective on the pinned buffer, in issue order. */
static llmcl_status start_mpi(llmcl_dist *d, dist_op *op)
{
    int rc;
    if (op->kind == OP_REDUCE) {
        const int n = (int)(op->dst_bytes / llmcl_dtype_size(d->opts.reduce_dtype));
        const MPI_Op sum = d->opts.reduce_dtype == LLMCL_F32 ? MPI_SUM : d->bf16_sum;
        rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, op->host, n, d->wire_type, sum, d->comm,
                                       &op->req);
    } else {
        const int n = (int)d->groups[op->group].shard;
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, op->host, n, d->param_type,
                            d->comm, &op->req);
    }
    release_event(&op->d2h);
    LLMCL__REQUIRE(d->ctx, rc == MPI_SUCCESS, LLMCL_ERROR_MPI, "%s of group %d failed (MPI %d)",
                   op->kind == OP_REDUCE ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather",
                   op->group, rc);
    op->state = OP_MPI;
    d->next_mpi_seq++;
    return LLMCL_OK;
}

/* Stage 3: the result back to the device, once its destination is free. */
static llmcl_status copy_out(llmcl_dist *d, dist_op *op)
{
    /* From the start: a reduce-scatter in place leaves the rank's part first. */
    cl_int err = clEnqueueWriteBuffer(d->copyq, op->dst, CL_FALSE, op->dst_off, op->dst_bytes,
                                      op->host, op->dst_free ? 1 : 0,
                                      op->dst_free ? &op->dst_free : NULL, &op->h2d);
    release_event(&op->dst_free);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(d->ctx, err, "clEnqueueWriteBuffer (from host staging)", __FILE__,
                              __LINE__);
    LLMCL__CL(d->ctx, clFlush(d->copyq));
    op->state = OP_COPY_OUT;
    return LLMCL_OK;
}

static dist_op *op_with_seq(llmcl_dist *d, uint64_t seq)
{
    for (int s = 0; s < DIST_SLOTS; ++s) {
        if (d->reduce_op[s].state == OP_COPY_IN && d->reduce_op[s].seq == seq)
            return &d->reduce_op[s];
        if (d->gather_op[s].state == OP_COPY_IN && d->gather_op[s].seq == seq)
            return &d->gather_op[s];
    }
    return NULL;
}

/* Starts the next op's MPI part if its copy is done (or, with wait, once it is). */
static llmcl_status start_next(llmcl_dist *d, bool wait, bool *started)
{
    *started = false;
    dist_op *op = op_with_seq(d, d->next_mpi_seq);
    if (!op)
        return LLMCL_OK;
    if (wait)
        LLMCL__CL(d->ctx, clWaitForEvents(1, &op->d2h));
    cl_int status;
    LLMCL__CL(d->ctx, clGetEventInfo(op->d2h, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status,
                                     &status, NULL));
    LLMCL__REQUIRE(d->ctx, status >= 0, LLMCL_ERROR_MPI,
                   "the copy of group %d to host memory failed (%s)", op->group,
                   llmcl_status_str(status));
    if (status != CL_COMPLETE)
        return LLMCL_OK;
    *started = true;
    return start_mpi(d, op);
}

llmcl_status llmcl__dist_progress(llmcl_dist *d)
{
    bool started = true;
    while (started)
        LLMCL__TRY(start_next(d, false, &started));
    dist_op *all[2 * DIST_SLOTS];
    for (int s = 0; s < DIST_SLOTS; ++s) {
        all[2 * s] = &d->reduce_op[s];
        all[2 * s + 1] = &d->gather_op[s];
    }
    for (int k = 0; k < 2 * DIST_SLOTS; ++k) {
        if (all[k]->state != OP_MPI)
            continue;
        int done = 0;
        LLMCL__REQUIRE(d->ctx, MPI_Test(&all[k]->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS,
                       LLMCL_ERROR_MPI, "MPI_Test of group %d failed", all[k]->group);
        if (done)
            LLMCL__TRY(copy_out(d, all[k]));
    }
    return LLMCL_OK;
}

llmcl_status llmcl__dist_complete(llmcl_dist *d, dist_op *op)
{
    bool started = true;
    while (op->state == OP_COPY_IN && started)
        LLMCL__TRY(start_next(d, true, &started));
    LLMCL__REQUIRE(d->ctx, op->state != OP_COPY_IN, LLMCL_ERROR_MPI,
                   "internal: the op of group %d is out of issue order", op->group);
    if (op->state == OP_MPI) {
        LLMCL__REQUIRE(d->ctx, MPI_Wait(&op->req, MPI_STATUS_IGNORE) == MPI_SUCCESS,
                       LLMCL_ERROR_MPI, "MPI_Wait of group %d failed", op->group);
        LLMCL__TRY(copy_out(d, op));
    }
    if (op->state == OP_COPY_OUT) {
        cl_int err = clEnqueueBarrierWithWaitList(d->ctx->queue, 1, &op->h2d, NULL);
        release_event(&op->h2d);
        op->state = OP_IDLE;
        if (err != CL_SUCCESS)
            return llmcl__fail_cl(d->ctx, err, "clEnqueueBarrierWithWaitList", __FILE__, __LINE__);
    }
    return llmcl__dist_progress(d);
}
