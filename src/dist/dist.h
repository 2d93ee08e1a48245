/*
 * dist.h: the private state of llmcl_dist, shared by dist.c (object, layout, setup), collectives.c
 * (staged nonblocking collectives through pinned host memory), zero.c (the stages' hooks and the
 * step) and checkpoint.c (sharded checkpoints that reshard).
 */
#ifndef LLMCL_DIST_PRIVATE_H
#define LLMCL_DIST_PRIVATE_H

#include <stdbool.h>

#include "llmcl_dist.h"
#include "../runtime/internal.h"

/* Every parameter starts at a multiple of this many elements; groups pad to world times it. */
#define DIST_ALIGN 16
/* Two of each: one in use while the other's communication runs. */
#define DIST_SLOTS 2
#define DIST_NAME_MAX 128

typedef struct dist_param {
    char name[DIST_NAME_MAX];
    int group, ndim, no_weight_decay;
    int64_t shape[LLMCL_MAX_DIMS];
    int64_t numel;
    int64_t offset;      /* in its group's flat layout */
    llmcl_tensor *param; /* views handed out, NULL until asked for (or made) */
    llmcl_tensor *grad;
} dist_param;

typedef struct dist_group {
    int first, count;  /* its parameters */
    int64_t numel;     /* padded to world * DIST_ALIGN */
    int64_t shard;     /* numel / world */
    int64_t flat_off;  /* in the full layout (stage 1-2 params, stage 1 grads) */
    int64_t shard_off; /* in the rank's shard */
    int slot;          /* stage 3: gather buffer holding it, -1 */
    bool gathered;     /* stage 3: between gather and release */
    int bucket;        /* stages 2-3: bucket accumulating its gradients, -1 */
} dist_group;

/* A pinned host buffer, mapped once for the dist's life. */
typedef struct dist_pinned {
    cl_mem mem;
    char *host;
    size_t bytes;
} dist_pinned;

enum { OP_REDUCE, OP_GATHER };

/* Chunks of one op in flight: the copy out of one, the exchange of another and the copy back of a
   third overlap, with one to spare. */
#define DIST_DEPTH 4
/* llmcl_dist_opts.chunk_bytes when 0. */
#define DIST_CHUNK_BYTES (1u << 20)

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
 * device (h2d queue). A group is P blocks of `shard` elements, block q rank q's; chunk c is the
 * elements [c piece, (c + 1) piece) of every block. Chunks enter MPI in issue order (seq, then
 * chunk), the same program order on every rank, as MPI requires of collectives.
 */
typedef struct dist_op {
    int kind, group;
    bool active;                      /* started, not yet completed */
    uint64_t seq;                     /* issue order among ops with chunks */
    int64_t chunks;                   /* 0 on one rank: nothing to exchange */
    int64_t copied, exchanged, landed; /* chunks copied out (enqueued), in MPI, copied back */
    int64_t shard, piece;             /* elements of a block; of a block in one chunk */
    int depth;                        /* slots: DIST_DEPTH, fewer if no shard needs them all */
    size_t es;
    cl_mem src, dst;
    size_t src_off, dst_off;          /* bytes: src's block 0 (reduce; src == dst) or the rank's
                                         shard (gather); dst's block 0 */
    cl_event ready;                   /* the source may be read after this */
    cl_event dst_free;                /* dst may be written after this (NULL: at once) */
    MPI_Datatype type;
    dist_pinned host;                 /* the slots' areas */
    int *args;                        /* the slots' MPI arguments */
    dist_slot slot[DIST_DEPTH];
} dist_op;

struct llmcl_dist {
    llmcl_ctx *ctx;
    MPI_Comm comm;
    int rank, world;
    llmcl_dist_opts opts;
    cl_command_queue d2hq, h2dq; /* copies to and from host memory, one direction each */
    MPI_Datatype wire_type, param_type;

    int n_params, cap_params, n_groups;
    dist_param *params;
    dist_group *groups;
    bool ready; /* set up */
    int64_t numel, padded, shard, max_group;

    /* every stage: the rank's shard of the optimizer state */
    llmcl_tensor *master, *m, *v, *norm;
    llmcl_tensor *params_full, *grads_full; /* stages 1-2 / stage 1 */
    llmcl_tensor *param_shard, *grad_shard; /* stage 3 / stages 2-3 */
    llmcl_tensor *bucket[DIST_SLOTS];       /* stages 2-3: f32 gradients of one group */
    llmcl_tensor *wire[DIST_SLOTS];         /* bf16 reduction: the gradients cast for the wire */
    llmcl_tensor *slot[DIST_SLOTS];         /* stage 3: gathered parameters of one group */
    int slot_group[DIST_SLOTS];             /* the group a slot holds (valid data), -1 */
    cl_event slot_free[DIST_SLOTS];         /* marker after the kernels that read it */
    int next_bucket, last_gathered, direction;

    dist_op reduce_op[DIST_SLOTS], gather_op[DIST_SLOTS];
    uint64_t next_seq, next_mpi_seq;

    llmcl_adamw_opts last; /* hyperparameters and step of the last step, for save */
};

/* ---- dist.c ---- */

dist_param *llmcl__dist_find(llmcl_dist *d, const char *name);

/* The registered parameter called name, for the entry points that take one: d set up, out (the
   caller's output) not NULL, and the name known, each refused with its own message. */
llmcl_status llmcl__dist_lookup(llmcl_dist *d, const char *name, const void *out,
                                dist_param **p);

/*
 * A failure inside a training step: MPI_Abort with the rank and the error, or the status returned
 * when opts.return_on_error is set.
 */
llmcl_status llmcl__dist_fault(llmcl_dist *d, const char *call, llmcl_status st);

/* The minimum of st over the ranks: every rank fails when one does. Collective. */
llmcl_status llmcl__dist_agree(llmcl_dist *d, llmcl_status st);

/* A 1-D view of count elements of t's buffer starting at element off. */
llmcl_status llmcl__dist_view(const llmcl_tensor *t, int64_t off, int64_t count, llmcl_tensor **out);

/* The part [lo, hi) of param p (offsets in its group) inside this rank's slice; false if empty. */
bool llmcl__dist_segment(const llmcl_dist *d, const dist_param *p, int64_t *lo, int64_t *hi);

/* ---- collectives.c ---- */

llmcl_status llmcl__dist_channels_create(llmcl_dist *d);
void llmcl__dist_channels_destroy(llmcl_dist *d);

/*
 * Starts the exchange of a reduce-scatter of group: the P blocks of src (wire dtype) from element
 * src_off, after the kernels enqueued so far. Each block of another rank goes to that rank, and
 * that rank's part of this rank's block comes back in its place, so that once the op completes
 * src holds the P ranks' parts of this rank's block in rank order, for llmcl_sum_rows. The rank's
 * own block never leaves the device.
 */
llmcl_status llmcl__dist_reduce_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off);

/*
 * Starts the all-gather of group's shard (param dtype) from src at element src_off into dst at
 * dst_off (the whole group), written once dst_free (may be NULL) has completed. The rank's own
 * shard is copied on the device (not at all when src is already its place in dst).
 */
llmcl_status llmcl__dist_gather_start(llmcl_dist *d, int channel, int group, const llmcl_tensor *src,
                                      int64_t src_off, const llmcl_tensor *dst, int64_t dst_off,
                                      cl_event dst_free);

/* Advances every op as far as it goes without waiting. */
llmcl_status llmcl__dist_progress(llmcl_dist *d);

/*
 * Completes op (waiting as needed) and makes the compute queue wait for its result; the op is
 * idle afterwards. An idle op returns at once.
 */
llmcl_status llmcl__dist_complete(llmcl_dist *d, dist_op *op);

/* Marks the compute queue's position: an event completing after the kernels enqueued so far. */
llmcl_status llmcl__dist_marker(llmcl_dist *d, cl_event *out);

/* ---- zero.c ---- */

/* Completes the reduce-scatter of a bucket and adds it into the gradient shard (stages 2-3). */
llmcl_status llmcl__dist_finish_reduce(llmcl_dist *d, int bucket);

/* Waits for all communication and folds every pending reduction in. */
llmcl_status llmcl__dist_drain(llmcl_dist *d);

/* Rebuilds the compute copy from the master shard (after init or load). */
llmcl_status llmcl__dist_refresh_params(llmcl_dist *d);

#endif /* LLMCL_DIST_PRIVATE_H */
