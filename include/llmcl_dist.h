/*
 * llmcl_dist.h: sharded training over MPI (ZeRO stages 1, 2 and 3), part of libllmcl when it was
 * built with MPI (MPICH). pkg-config: `pkg-config --cflags --libs llmcl-dist`.
 *
 * The application initialises MPI and hands llmcl a communicator; every rank has its own llmcl_ctx
 * (its own device). A parameter set, named tensors in layer groups, is registered on every rank in
 * the same order, then flattened group by group and partitioned evenly across the ranks, with
 * padding: each rank owns 1/world of every group (its shard). Every rank keeps its shard of the f32
 * master weights and of AdamW's m and v. Stage 1 also keeps the full compute-dtype parameters and
 * the full f32 gradients; stage 2 keeps the full parameters and only its shard of the gradients,
 * reduce-scattered group by group while the backward runs; stage 3 also shards the parameters and
 * all-gathers a group before its forward and its backward (the next group prefetched).
 *
 * A training step, for every micro-batch:
 *   forward:  for g = 0 .. groups-1: gather(g); compute with llmcl_dist_param views; release(g)
 *   backward: for g = groups-1 .. 0: gather(g); add gradients into llmcl_dist_grad views (+=);
 *             grads_ready(g); release(g)
 * then llmcl_dist_step, then llmcl_dist_zero_grads. grads_ready starts the reduction of stages 2
 * and 3. release matters to stage 3 only; gather to every stage, since under stages 1 and 2 it
 * waits for the group's updated parameters where the step's all-gathers run under the compute.
 *
 * Gradients are summed over the ranks (not averaged): with every rank's loss a mean over its own
 * micro-batch, pass llmcl_adamw_opts.grad_scale = 1 / (micro-batches * world size).
 *
 * Collective calls (marked so) must be made by every rank of the communicator in the same order
 * with the same arguments, as MPI collectives are.
 *
 * The data moves through one of two transports, chosen when the dist is created (MPI stays the
 * control plane either way: setup, agreement, norms, checkpoints, abort):
 *   - NCCL, GPU to GPU, where every rank's device is an NVIDIA GPU whose OpenCL imports memory
 *     that CUDA allocates (cl_khr_external_memory_opaque_fd), libcuda.so.1 and libnccl.so.2 load
 *     (LLMCL_NCCL=PATH names the library, else libnccl.so.2 and libnccl.so are tried), and no two
 *     ranks share a GPU. Each channel stages its collective in device memory that CUDA's virtual
 *     memory API allocates and OpenCL imports (the compute queue copies in and out of it); each
 *     NCCL call runs on a CUDA stream of the rank's GPU, waits on the device for the kernels
 *     enqueued before it (a flag the compute queue writes, cuStreamWaitValue32), and the compute
 *     queue waits for its result through a user event that a helper thread completes when the
 *     call's CUDA event has: the host never waits around a collective. The helper thread also
 *     watches for NCCL's asynchronous errors and for calls that take longer than LLMCL_NCCL_TIMEOUT
 *     seconds (default 600); either aborts the communicator (ncclCommAbort) and fails the next
 *     dist call. With NCCL 2.28 or later and every rank on one host, NCCL moves the data on the
 *     GPUs' copy engines, no kernel (NCCL_CTA_POLICY_ZERO, the staging registered as symmetric
 *     windows; LLMCL_NCCL_CE=0 turns this off): ncclAllGather, and for a reduce-scatter
 *     ncclAlltoAll of the blocks, summed in f32 on the device in rank order as MPI does, so the
 *     results are the MPI transport's. Otherwise NCCL's kernels run: an f32 reduce-scatter sums
 *     in NCCL (ncclReduceScatter), a bf16 one exchanges the blocks (ncclSend, ncclRecv) and sums
 *     them on the device. NVIDIA's OpenCL runs kernels in a CUDA context of its own, which takes
 *     turns on the GPU with NCCL's kernels, so communication adds to the step rather than running
 *     beside the kernels.
 *   - Host-staged MPI everywhere else (PoCL, rusticl, AMD, Intel): each collective is a pipeline of
 *     chunks (chunk_bytes), each chunk copied from the device, exchanged with MPI_Ialltoallv and
 *     copied back while the next is copied out, on two copy queues beside the compute queue; the
 *     sums run on the device, in rank order (llmcl_sum_rows). A rank's own part of a group never
 *     leaves the device. Pinned host memory: at most 32 x chunk_bytes (less for small groups, none
 *     on one rank), llmcl_dist_info.host_bytes.
 * llmcl_dist_opts.transport, else LLMCL_DIST_TRANSPORT=auto|mpi|nccl, picks one; automatic picks
 * NCCL where every rank can run it, else MPI, and llmcl_dist_info says which runs and why.
 * Results do not depend on timing: the same world size and transport give the same bits run after
 * run (NCCL's kernels sum in an order fixed by their algorithm for a given world, size and
 * topology, so with them the two transports agree to rounding; on the copy engines they agree bit
 * for bit).
 *
 * Errors go to llmcl_last_error(ctx) of the dist's context. Calls that take part in a training step
 * (gather, release, grads_ready, zero_grads, step) cannot leave the other ranks waiting: when one
 * fails on a rank, that rank prints "llmcl_dist: rank R of N: <call>: <status>: <detail>" to
 * stderr (the library's one print outside LLMCL_LOG, since the job ends) and calls MPI_Abort on the
 * communicator, unless llmcl_dist_opts.return_on_error is set. create, setup, save and load agree
 * on their outcome across the ranks and return the same status everywhere instead.
 */
#ifndef LLMCL_DIST_H
#define LLMCL_DIST_H

#include <mpi.h>

#include "llmcl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmcl_dist llmcl_dist;

/* The data plane. */
typedef enum llmcl_dist_transport {
    LLMCL_DIST_TRANSPORT_AUTO = 0, /* NCCL where every rank can run it, else MPI */
    LLMCL_DIST_TRANSPORT_MPI,      /* host-staged MPI */
    LLMCL_DIST_TRANSPORT_NCCL,     /* NCCL on device memory shared with CUDA */
} llmcl_dist_transport;

/* "auto", "mpi" or "nccl"; "?" for other values. */
LLMCL_API const char *llmcl_dist_transport_name(llmcl_dist_transport t);

/*
 * Whether collectives run under the compute. On: stages 2-3 reduce-scatter a group while the
 * backward goes on, stage 3 gathers the next group while the current one computes, stages 1-2
 * all-gather the updated parameters while the next forward runs the groups before. Off: the compute
 * queue waits for each collective as soon as it starts, so the device runs nothing else meanwhile.
 * The results are the same bits either way. The transport's choice: on for MPI; off for NCCL, whose
 * kernels and OpenCL's run in two CUDA contexts that take turns on the GPU (on its copy engines,
 * which run beside OpenCL's kernels, steps under the compute still measured slower).
 */
typedef enum llmcl_dist_overlap {
    LLMCL_DIST_OVERLAP_AUTO = 0, /* LLMCL_DIST_OVERLAP=on|off if set, else the transport's choice */
    LLMCL_DIST_OVERLAP_ON,
    LLMCL_DIST_OVERLAP_OFF,
} llmcl_dist_overlap;

/* Options of llmcl_dist_create. A zero-initialised struct with stage set gives the defaults. */
typedef struct llmcl_dist_opts {
    int stage;                /* 1, 2 or 3 */
    llmcl_dtype param_dtype;  /* the compute copy: f32 (default), bf16 or f16 */
    llmcl_dtype reduce_dtype; /* the gradients on the wire: f32 (default) or bf16 (the ranks' bf16
                                 parts summed in f32 on the device; stages 2 and 3 then keep their
                                 gradient shard in bf16) */
    int return_on_error;      /* 1: a failing step call returns its status instead of MPI_Abort */
    uint64_t chunk_bytes;     /* collectives move in chunks of at most this many bytes each way
                                 (at most 1 GiB; the same on every rank). MPI: through host
                                 memory, so that copies to the host, MPI and copies back overlap
                                 (0: 1 MiB). NCCL: a call a chunk (0: as large as its staging's
                                 pieces allow) */
    llmcl_dist_transport transport; /* AUTO (0): LLMCL_DIST_TRANSPORT if set, else automatic */
    llmcl_dist_overlap overlap;     /* AUTO (0): LLMCL_DIST_OVERLAP if set, else the transport's */
} llmcl_dist_opts;

/*
 * A context for this rank (collective): on LLMCL_DEVICE's device where it is set, else on device
 * L mod N of the devices llmcl_ctx_create picks from (llmcl_ctx_create_local), L being the rank's
 * index among the ranks of its node (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED): one GPU a rank
 * on a host with one rank per GPU.
 */
LLMCL_API llmcl_status llmcl_dist_ctx_create(MPI_Comm comm, llmcl_ctx **out);

/*
 * Creates a dist on ctx (borrowed for the dist's life) over comm (duplicated, so llmcl's messages
 * never mix with the application's) and picks its transport (above). Collective. A transport that
 * was asked for and cannot run fails on every rank with LLMCL_ERROR_UNSUPPORTED, saying why. The
 * MPI transport adds two command queues on ctx's device for the copies to and from host memory;
 * NCCL retains the device's primary CUDA context (about 0.5 GiB of device memory) and NCCL's own
 * buffers, which llmcl's memory statistics do not count.
 */
LLMCL_API llmcl_status llmcl_dist_create(llmcl_ctx *ctx, MPI_Comm comm,
                                         const llmcl_dist_opts *opts, llmcl_dist **out);

/* Waits for outstanding communication and frees everything. Collective. Accepts NULL. */
LLMCL_API void llmcl_dist_destroy(llmcl_dist *d);

/*
 * Registers a parameter (name copied, at most 127 bytes) in layer group `group`: groups in forward
 * order, 0 first, each registered in one run (group equal to the previous one or one more).
 * no_weight_decay: 1 for norm weights and biases. Before llmcl_dist_setup only.
 */
LLMCL_API llmcl_status llmcl_dist_add_param(llmcl_dist *d, const char *name, int group, int ndim,
                                            const int64_t *shape, int no_weight_decay);

/*
 * Lays the parameters out and allocates (collective). Every group is flattened in registration
 * order (each parameter starting at a multiple of 16 elements) and padded to a multiple of 16 x
 * world elements; rank r owns elements [r, r + 1) x padded / world of every group. A hash of the
 * parameter set (names, shapes, groups, weight decay flags), the stage, the dtypes and the chunk
 * size is compared
 * across ranks with one MPI_Allgather: a difference fails setup on every rank with
 * LLMCL_ERROR_INVALID_ARGUMENT naming the ranks. A layout that passes 2^63 - 1 elements, or a
 * group whose shard passes 2^31 - 1 (MPI's counts), fails with LLMCL_ERROR_OVERFLOW. Device
 * memory, all through llmcl_tensor_create (so llmcl_memory_stats_get counts it), with S the
 * rank's shard, F the padded total, G the largest padded group (llmcl_dist_info), p the param
 * dtype's size and w the reduce dtype's:
 *   every stage: master, m, v 12 S; the global norm 4 bytes; with bf16 reduction, 2 x 2 G (wire)
 *   stage 1: params p F; gradients 4 F
 *   stage 2: params p F; gradient shard w S; two f32 gradient buckets 2 x 4 G
 *   stage 3: param shard p S; gradient shard w S; buckets 2 x 4 G; two gather buffers 2 x p G
 * So stage 3 with bf16 params and bf16 reduction holds (2 + 2 + 12) S + 16 G + 4 bytes. NCCL adds
 * its staging (llmcl_dist_info.transport_bytes): for each of two reduce channels w G bytes (2 w G
 * where the blocks are exchanged: bf16 reduction, or NCCL on the copy engines), for each of two
 * gather channels p G, each rounded up to CUDA's allocation granularity (2 MiB on the H200), and
 * one such unit for the flag that orders NCCL after the kernels. Every element starts at 0.
 */
LLMCL_API llmcl_status llmcl_dist_setup(llmcl_dist *d);

/* The layout after setup, for tests and accounting (element counts). */
typedef struct llmcl_dist_info {
    int rank, world, stage, groups, params;
    int64_t numel;         /* the parameters' elements, without padding */
    int64_t padded_numel;  /* F */
    int64_t shard_numel;   /* S = F / world */
    int64_t max_group;     /* G */
    uint64_t host_bytes;      /* pinned host staging buffers (MPI transport) */
    uint64_t transport_bytes; /* device memory of the transport's own, counted in the context's
                                 statistics beside the formulas of llmcl_dist_setup (NCCL's
                                 staging; 0 under MPI) */
    llmcl_dist_transport transport; /* the one that runs: MPI or NCCL */
    char transport_detail[256];     /* for logs: NCCL's version, library and CUDA device, or why
                                       the automatic choice is MPI */
    int overlap;                    /* 1: collectives run under the compute; 0: the compute
                                       waits for each (llmcl_dist_overlap) */
} llmcl_dist_info;

LLMCL_API llmcl_status llmcl_dist_info_get(const llmcl_dist *d, llmcl_dist_info *out);

/*
 * Sets a parameter from host f32 values (numel of them, row-major); every rank passes the same
 * values and keeps its shard (master exact, the compute copy rounded to nearest even). Stage 3
 * reads only the values of the rank's own part of the parameter (its elements in [r, r + 1) x
 * padded / world of the group, llmcl_dist_setup's layout), so a rank may leave the rest unset;
 * stages 1-2 read them all. Not collective; blocks until uploaded. Stage 3: refused
 * (LLMCL_ERROR_INVALID_ARGUMENT, nothing changed) while the parameter's group is gathered; the
 * next gather after its release brings the new values.
 */
LLMCL_API llmcl_status llmcl_dist_init_param(llmcl_dist *d, const char *name,
                                             const float *values);

/*
 * Copies a parameter's f32 master values, gathered from every rank, into values (numel floats).
 * Collective (one all-gather of the parameter's group). A rank that needs none may pass NULL
 * values; the group is gathered all the same.
 */
LLMCL_API llmcl_status llmcl_dist_get_param(llmcl_dist *d, const char *name, float *values);

/*
 * llmcl_dist_get_param for count parameters at once, gathering each of their groups once (in the
 * order the names first reach it) rather than once a parameter: values[i] receives names[i]'s
 * numel floats. A rank that needs none of them may pass NULL entries (rank 0 alone writing a
 * file, say); the groups are gathered all the same. Collective: every rank passes the same names
 * in the same order.
 */
LLMCL_API llmcl_status llmcl_dist_get_params(llmcl_dist *d, int count, const char *const *names,
                                             float *const *values);

/*
 * Stage 3: all-gathers group's parameters (unless still resident from the forward) and starts the
 * prefetch of the next group in the current direction (up in the forward, down once a group at or
 * below the last one is gathered again). Stages 1 and 2: makes the compute queue wait for the
 * group's part of the last step's all-gather, where it still runs (collectives under the compute:
 * the step starts the first two groups' and each gather the group two further on); otherwise
 * returns. Collective.
 */
LLMCL_API llmcl_status llmcl_dist_gather(llmcl_dist *d, int group);

/* Stage 3: the group's gather buffer may be reused once the kernels enqueued so far are done. */
LLMCL_API llmcl_status llmcl_dist_release(llmcl_dist *d, int group);

/*
 * A view of the full compute-dtype parameter, in the parameter's shape: borrowed (owned by d),
 * valid until the group's release (stage 3) or for d's life (stages 1 and 2). Read-only for the
 * model: llmcl_dist_step writes the parameters. Refused under stages 1 and 2 while the group's
 * part of the step's all-gather is still to land (collectives under the compute): call gather
 * first.
 */
LLMCL_API llmcl_status llmcl_dist_param(llmcl_dist *d, const char *name, llmcl_tensor **view);

/*
 * An f32 view, in the parameter's shape, that the backward adds its gradient into (for example
 * llmcl_matmul with beta = 1); it holds 0 or the sum of this step's earlier micro-batches (stage 1)
 * or 0 (stages 2 and 3: a bucket zeroed when the group's first view is asked for). Borrowed, owned
 * by d, valid until llmcl_dist_grads_ready(group).
 */
LLMCL_API llmcl_status llmcl_dist_grad(llmcl_dist *d, const char *name, llmcl_tensor **view);

/*
 * The group's gradients of this micro-batch are complete (enqueued): stages 2 and 3 start their
 * reduce-scatter now (chunks copied to the host after the kernels enqueued so far, exchanged with
 * MPI_Ialltoallv, copied back and summed on the device), overlapping with the rest of the
 * backward: every dist call moves the pipeline on.
 * A group's gradients may come in parts within one micro-batch (a tied embedding's from the head
 * before the layers' backward, from the embedding after them): after grads_ready, llmcl_dist_grad
 * opens a fresh zeroed bucket (stages 2-3) and the next grads_ready adds its reduction to the same
 * gradients. Collective.
 */
LLMCL_API llmcl_status llmcl_dist_grads_ready(llmcl_dist *d, int group);

/* Sets every gradient (stage 1) or the gradient shard (stages 2, 3) to 0. Collective. */
LLMCL_API llmcl_status llmcl_dist_zero_grads(llmcl_dist *d);

/*
 * One optimizer step (collective): finishes the reductions (stage 1 reduce-scatters now); with
 * opts->max_grad_norm > 0 or grad_norm not NULL on some rank (without clipping, one MPI_Allreduce
 * of an int finds out), the global gradient norm (llmcl_grad_norm squared on each shard, gathered
 * and summed in rank order: the same on every rank); llmcl_adamw_step on the shard (master, m, v
 * and the compute copy, with opts->grad_norm replaced by the global norm); then stages 1 and 2
 * all-gather the updated parameters (under the compute: starting with the first two groups, the
 * rest as the next forward's gather calls come). opts->step is remembered for llmcl_dist_save.
 * *grad_norm receives the norm of the scaled gradients; it may be NULL on any rank, whatever the
 * others pass (rank 0 alone logging the norm, say). Refused while a stage-3 group is gathered:
 * release it first.
 */
LLMCL_API llmcl_status llmcl_dist_step(llmcl_dist *d, const llmcl_adamw_opts *opts,
                                       float *grad_norm);

/*
 * Times the transport's own collectives on raw buffers of bytes each (collective): NCCL's
 * ncclReduceScatter and ncclAllGather back to back on its stream, or under MPI a bare MPI_Alltoall
 * and MPI_Allgather on host memory, reps times after one warm-up. GB/s by NCCL's algorithm
 * bandwidth: bytes (the whole buffer) over the time of one call. The yardstick for llmcl_dist's
 * own collectives (llmcl-bench --only dist).
 */
LLMCL_API llmcl_status llmcl_dist_measure_transport(llmcl_dist *d, uint64_t bytes, int reps,
                                                    double *reduce_scatter_gbs,
                                                    double *all_gather_gbs);

/*
 * Saves the optimizer state to the folder dir (collective): every rank writes
 * shard-NNNNN.safetensors (its rank in five digits) with "master", "m" and "v", its flat f32
 * shard; rank 0 writes
 * manifest.json (format, world size, stage, dtypes, step and AdamW hyperparameters of the last
 * llmcl_dist_step, the parameters with their shapes, groups and offsets, the groups' padded sizes,
 * and every shard file's size and xxHash64). The compute copy is not saved: it is the master
 * rounded.
 *
 * The save is one atomic step: everything goes into the folder "dir.tmp" (created afresh),
 * whose files and names rank 0 flushes to disk (fsync) once complete; then rank 0 moves an
 * existing dir to "dir.old", renames dir.tmp to dir and removes dir.old. A job killed at any
 * point leaves a whole checkpoint that llmcl_dist_load finds under the name dir (the previous
 * one, or the new one), except before the first save of dir completes: dir is always whole
 * (only the rename makes it), and dir.old is whole while dir is missing (between the two
 * renames), which llmcl_dist_load then reads instead. A dir.tmp is never the only copy and the
 * next save replaces it. dir must be absent, an empty folder or a checkpoint (holding
 * manifest.json: a folder of other files is refused, not replaced); the ranks agree on the
 * outcome, and a failed save leaves the previous checkpoint where llmcl_dist_load finds it.
 *
 * For tests, the environment variable LLMCL_TEST_SAVE_STOP=<stage> kills the process (SIGKILL)
 * where a save reaches that stage: "created" (rank 0: dir.tmp made, empty), "shards" (each rank:
 * its shard written), "manifest" (rank 0: manifest.json written), "files" (each rank: the
 * application's files written, llmcl_dist_save_with), "aside" (rank 0: dir moved to dir.old),
 * "renamed" (rank 0: dir.tmp renamed to dir, dir.old not yet removed).
 */
LLMCL_API llmcl_status llmcl_dist_save(llmcl_dist *d, const char *dir);

/*
 * The application's own files of a checkpoint folder (llmcl_dist_save_with, llmcl_dist_load_with):
 * called on every rank with the folder's path; returns LLMCL_OK or a failure status (then the
 * call fails on every rank with that status; the detail is the application's to keep).
 */
typedef llmcl_status (*llmcl_dist_files_fn)(const char *folder, void *user);

/*
 * llmcl_dist_save, with files(tmp, user) called on every rank once the shards and manifest are in
 * the temporary folder and before it is renamed into place, so that the application's files
 * (a trainer's step and data position, say) are part of the same atomic step. files writes its
 * files complete, in sub-folders if it likes (rank 0 flushes every file and folder under the
 * temporary folder before the rename; on other ranks, where another node may hold the disk, files
 * must flush its own: llmcl_safetensors_writer_finish does) and names none of them manifest.json
 * or shard-*.safetensors. A later save removes the whole folder it replaces, sub-folders too.
 * files may be NULL.
 */
LLMCL_API llmcl_status llmcl_dist_save_with(llmcl_dist *d, const char *dir,
                                            llmcl_dist_files_fn files, void *user);

/*
 * Loads a checkpoint saved by any world size and stage (collective) from dir, or from dir.old
 * when dir is missing (a save stopped between its two renames). The manifest must name exactly
 * the registered parameters with the same shapes; each rank checks the size and checksum of the
 * shard files it needs and reads from them (memory-mapped) only the ranges of its new shard.
 * Everything is validated, on every rank, before any state changes: a truncated, corrupt or
 * mismatched checkpoint fails on every rank (LLMCL_ERROR_BAD_FILE, LLMCL_ERROR_IO or
 * LLMCL_ERROR_INVALID_ARGUMENT) with the live state untouched. hyper (may be NULL) receives the
 * saved step and hyperparameters (lr, beta1, beta2, eps, weight_decay, grad_scale, max_grad_norm).
 * Refused in the same way (LLMCL_ERROR_INVALID_ARGUMENT, nothing read) while a stage-3 group is
 * gathered (between llmcl_dist_gather and llmcl_dist_release), as llmcl_dist_step is.
 */
LLMCL_API llmcl_status llmcl_dist_load(llmcl_dist *d, const char *dir, llmcl_adamw_opts *hyper);

/*
 * llmcl_dist_load, with files(folder, user) called on every rank first, with the folder that will
 * be read (dir or dir.old), to check and read the application's files before llmcl reads its own:
 * a failure of files on any rank fails the load on every rank, the live state untouched. files
 * may be NULL.
 */
LLMCL_API llmcl_status llmcl_dist_load_with(llmcl_dist *d, const char *dir,
                                            llmcl_adamw_opts *hyper, llmcl_dist_files_fn files,
                                            void *user);

#ifdef __cplusplus
}
#endif
#endif /* LLMCL_DIST_H */
