/*
 * transport.h: the data plane of llmcl_dist, the seam between the ZeRO stages (zero.c) and what
 * moves a group's blocks between the ranks. MPI stays the control plane (setup, agreement, norms,
 * checkpoints, abort); a transport moves the data:
 *   - transport_mpi.c: host-staged MPI, a pipeline of chunks through pinned host memory, for every
 *     OpenCL device (PoCL, rusticl, AMD, Intel, NVIDIA without NCCL);
 *   - transport_nccl.c: NCCL on NVIDIA, GPU to GPU through staging ranges of device memory that
 *     CUDA allocates and OpenCL imports (shared_mem.h).
 *
 * An op runs on one of DIST_SLOTS channels of its kind. A reduce-scatter of group g starts from
 * the group's P blocks of `shard` elements (block q rank q's) in a buffer of the dist's and ends in
 * sum_parts, which adds the P ranks' parts of this rank's block wherever the transport left them;
 * a gather fills the other ranks' blocks of such a buffer, this rank's block being in place
 * already.
 * Both start after the kernels enqueued so far on the compute queue, and complete() makes the
 * compute queue wait for the result: the host waits only where a transport cannot go on without
 * it.
 */
#ifndef LLMCL_DIST_TRANSPORT_H
#define LLMCL_DIST_TRANSPORT_H

#include "dist.h"

enum { OP_REDUCE, OP_GATHER };

typedef struct dist_transport_ops {
    /* After the layout: the channels and anything else sized by it. */
    llmcl_status (*setup)(llmcl_dist *d);
    /* The group in flight on a channel, or -1. */
    int (*busy)(const llmcl_dist *d, int kind, int channel);
    /* Starts a reduce-scatter of group's blocks in buf from element off (in place). */
    llmcl_status (*reduce_start)(llmcl_dist *d, int channel, int group, const llmcl_tensor *buf,
                                 int64_t off);
    /*
     * Starts the all-gather of group into buf from element off (this rank's block already in
     * place), written once dst_free (may be NULL) has completed.
     */
    llmcl_status (*gather_start)(llmcl_dist *d, int channel, int group, const llmcl_tensor *buf,
                                 int64_t off, cl_event dst_free);
    /* The compute queue waits for the channel's op, which is idle afterwards; idle: returns. */
    llmcl_status (*complete)(llmcl_dist *d, int kind, int channel);
    /*
     * After complete(OP_REDUCE, channel), on the compute queue: dst = (the P ranks' parts of this
     * rank's block of g, summed in rank order in f32) + beta dst. buf and off are the ones the
     * reduce-scatter started on; dst (the block's elements) may be this rank's block of buf.
     */
    llmcl_status (*sum_parts)(llmcl_dist *d, int channel, const dist_group *g,
                              const llmcl_tensor *buf, int64_t off, llmcl_tensor *dst, float beta);
    /* Advances what can go on without waiting, and reports a failure seen in the background. */
    llmcl_status (*progress)(llmcl_dist *d);
    /* Waits until nothing in flight uses the buffers, so that they may be freed. */
    void (*quiesce)(llmcl_dist *d);
    /* After the buffers' tensors are destroyed: frees what setup made. */
    void (*release)(llmcl_dist *d);
    /* Frees the transport (d->transport becomes NULL). */
    void (*destroy)(llmcl_dist *d);
    /* For llmcl_dist_measure_transport: one call of each collective on raw buffers. */
    llmcl_status (*measure)(llmcl_dist *d, uint64_t bytes, int reps, double *reduce_gbs,
                            double *gather_gbs);
} dist_transport_ops;

struct dist_transport {
    const dist_transport_ops *ops;
    llmcl_dist_transport kind;
    bool overlaps;         /* llmcl_dist_overlap's AUTO: whether its collectives run under the
                              compute */
    uint64_t host_bytes;   /* pinned host staging (llmcl_dist_info.host_bytes) */
    uint64_t device_bytes; /* device memory of its own (llmcl_dist_info.transport_bytes) */
};

/* sum_parts where the parts lie in buf's P blocks of g from element off, in rank order. */
llmcl_status llmcl__dist_sum_blocks(llmcl_dist *d, int channel, const dist_group *g,
                                    const llmcl_tensor *buf, int64_t off, llmcl_tensor *dst,
                                    float beta);

/* Host-staged MPI, for any device: d->transport (freed by its destroy, also after a failure). */
llmcl_status llmcl__dist_mpi_create(llmcl_dist *d);

/*
 * NCCL into d->transport where every rank's device can share memory with CUDA and NCCL loads
 * (collective). Otherwise LLMCL_ERROR_UNSUPPORTED on every rank, d->transport NULL and the reason
 * (the first failing rank's) in why (why_len bytes); other failures return their status, also
 * on every rank.
 */
llmcl_status llmcl__dist_nccl_create(llmcl_dist *d, char *why, size_t why_len);

#endif /* LLMCL_DIST_TRANSPORT_H */
