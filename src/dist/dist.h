/*
 * dist.h: the private state of llmcl_dist, shared by dist.c (object, layout, setup, transport
 * choice), the transports (transport.h: host-staged MPI, NCCL), zero.c (the stages' hooks and the
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
/* llmcl_dist_opts.chunk_bytes when 0 under MPI (NCCL then takes chunks as large as its staging
   allows). */
#define DIST_CHUNK_BYTES (1u << 20)

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
    int64_t shard_off; /* in the rank's shard */
    int slot;          /* stage 3: gather buffer holding it, -1 */
    bool gathered;     /* stage 3: between gather and release */
    int bucket;        /* stages 2-3: bucket accumulating its gradients, -1 */
    llmcl_tensor *params; /* stages 1-2: the group's full compute-dtype parameters */
    llmcl_tensor *grads;  /* stage 1: the group's full f32 gradients */
} dist_group;

typedef struct dist_transport dist_transport;

struct llmcl_dist {
    llmcl_ctx *ctx;
    MPI_Comm comm;
    int rank, world;
    llmcl_dist_opts opts;
    dist_transport *transport;
    char transport_detail[256]; /* llmcl_dist_info.transport_detail */
    double nccl_timeout_s;      /* LLMCL_NCCL_TIMEOUT */

    int n_params, cap_params, n_groups;
    dist_param *params;
    dist_group *groups;
    bool ready;   /* set up */
    bool overlap; /* llmcl_dist_overlap resolved: collectives run under the compute */
    int64_t numel, padded, shard, max_group;

    /* every stage: the rank's shard of the optimizer state */
    llmcl_tensor *master, *m, *v, *norm;
    llmcl_tensor *param_shard, *grad_shard; /* stage 3 / stages 2-3 */
    llmcl_tensor *bucket[DIST_SLOTS];       /* stages 2-3: f32 gradients of one group */
    llmcl_tensor *wire[DIST_SLOTS];         /* bf16 reduction: the gradients cast for the wire */
    llmcl_tensor *slot[DIST_SLOTS];         /* stage 3: gathered parameters of one group */
    int slot_group[DIST_SLOTS];             /* the group a slot holds (valid data), -1 */
    cl_event slot_free[DIST_SLOTS];         /* marker after the kernels that read it */
    int next_bucket, last_gathered, direction;
    int gathered_upto; /* stages 1-2: groups below it hold the updated parameters, the rest are
                          being all-gathered in order (INT_MAX: none pending) */

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

/* ---- transports (transport.h) ---- */

/* The compute queue waits for the op on a channel (idle: nothing). */
llmcl_status llmcl__dist_complete(llmcl_dist *d, int kind, int channel);

/* Marks the compute queue's position: an event completing after the kernels enqueued so far. */
llmcl_status llmcl__dist_marker(llmcl_dist *d, cl_event *out);

/* MPI's type for elements of dt. */
MPI_Datatype llmcl__dist_mpi_type(llmcl_dtype dt);

/* ---- zero.c ---- */

/* Completes the reduce-scatter of a bucket and adds it into the gradient shard (stages 2-3). */
llmcl_status llmcl__dist_finish_reduce(llmcl_dist *d, int bucket);

/* Waits for all communication and folds every pending reduction in. */
llmcl_status llmcl__dist_drain(llmcl_dist *d);

/* Stage 3: the first group between gather and release, -1 if none. The calls that replace the
   shards (step, load) refuse while one is: they forget which gather buffer holds which group. */
int llmcl__dist_gathered(const llmcl_dist *d);

/* Rebuilds the compute copy from the master shard (after init or load). */
llmcl_status llmcl__dist_refresh_params(llmcl_dist *d);

#endif /* LLMCL_DIST_PRIVATE_H */
