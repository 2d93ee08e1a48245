/*
 * llmcl.h: the public API of llmcl, OpenCL C kernels for training large language models.
 *
 * A context (llmcl_ctx) binds one OpenCL device and queue. Tensors live on that device. Ops enqueue
 * kernels on the context's queue and return when enqueued; llmcl_ctx_finish() waits. Every function
 * returns an llmcl_status; on failure llmcl_last_error() tells why. A context is not thread-safe:
 * use one per thread. Unless a comment says otherwise, functions borrow their pointer arguments for
 * the duration of the call only.
 */
#ifndef LLMCL_H
#define LLMCL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#include "llmcl_kernels.h"
#include "llmcl_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LLMCL_BUILDING) && defined(__GNUC__)
#define LLMCL_API __attribute__((visibility("default")))
#else
#define LLMCL_API
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Status codes. OpenCL's own negative codes pass through unchanged; llmcl's are below -1000.       */

#define LLMCL_STATUS_LIST(X)                                                                      \
    X(LLMCL_OK, 0, "success")                                                                     \
    X(LLMCL_ERROR_INVALID_ARGUMENT, -1001, "invalid argument")                                    \
    X(LLMCL_ERROR_SHAPE_MISMATCH, -1002, "shape mismatch")                                        \
    X(LLMCL_ERROR_UNSUPPORTED_DTYPE, -1003, "unsupported dtype")                                  \
    X(LLMCL_ERROR_OUT_OF_DEVICE_MEMORY, -1004, "out of device memory")                            \
    X(LLMCL_ERROR_OUT_OF_HOST_MEMORY, -1005, "out of host memory")                                \
    X(LLMCL_ERROR_BUILD_FAILURE, -1006, "kernel build failure")                                   \
    X(LLMCL_ERROR_NO_DEVICE, -1007, "no matching OpenCL device")                                  \
    X(LLMCL_ERROR_DEVICE_MISMATCH, -1008, "tensors belong to different contexts")                 \
    X(LLMCL_ERROR_OVERFLOW, -1009, "size overflow")                                               \
    X(LLMCL_ERROR_UNSUPPORTED, -1010, "unsupported on this device or configuration")              \
    X(LLMCL_ERROR_IO, -1011, "file input/output error")                                           \
    X(LLMCL_ERROR_MPI, -1012, "MPI failure")                                                      \
    X(LLMCL_ERROR_TUNE_DB, -1013, "invalid tuning database")                                      \
    X(LLMCL_ERROR_KERNEL_NOT_FOUND, -1014, "kernel source not found")                             \
    X(LLMCL_ERROR_BAD_FILE, -1015, "malformed file")                                              \
    X(LLMCL_ERROR_NCCL, -1016, "NCCL or CUDA failure")

typedef enum llmcl_status {
#define LLMCL_STATUS_ENUM(name, value, text) name = value,
    LLMCL_STATUS_LIST(LLMCL_STATUS_ENUM)
#undef LLMCL_STATUS_ENUM
} llmcl_status;

/* A fixed description of a status code, llmcl's or OpenCL's ("CL_OUT_OF_RESOURCES"). */
LLMCL_API const char *llmcl_status_str(int status);

/* The library version as "MAJOR.MINOR.PATCH". */
LLMCL_API const char *llmcl_version(void);

/* ---------------------------------------------------------------------------------------------- */
/* Devices.                                                                                       */

typedef enum llmcl_vendor {
    LLMCL_VENDOR_OTHER = 0,
    LLMCL_VENDOR_NVIDIA,
    LLMCL_VENDOR_AMD,
    LLMCL_VENDOR_INTEL,
    LLMCL_VENDOR_POCL,
    LLMCL_VENDOR_MESA,
} llmcl_vendor;

/* Capabilities probed once per device; kernels choose their paths from these. */
typedef struct llmcl_device_info {
    char name[256];
    char vendor[256];
    char driver_version[128];
    char device_version[128];
    char opencl_c_version[128];
    char platform_name[256];
    char platform_version[256];
    llmcl_vendor vendor_id;
    int is_gpu;                 /* CL_DEVICE_TYPE_GPU */
    int cl_c_major, cl_c_minor; /* OpenCL C version the device compiles */
    uint32_t compute_units;
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;
    uint64_t local_mem_bytes;   /* CL_DEVICE_LOCAL_MEM_SIZE: what local kernel arguments may take */
    uint64_t local_mem_static_bytes; /* what __local arrays declared in a kernel may take: more than
                                        local_mem_bytes on NVIDIA sm_70 and later (the shared memory
                                        a block may opt into), which llmcl's kernels use */
    int local_mem_is_dedicated; /* CL_LOCAL, not emulated in global memory */
    size_t max_work_group_size;
    int has_fp16;       /* cl_khr_fp16 arithmetic; 16-bit storage works without it */
    int has_fp64;       /* cl_khr_fp64 */
    int has_subgroups;  /* cl_khr_subgroups or cl_intel_subgroups */
    int simd_width;     /* warp or wavefront width where known, else 1 */
    int nv_cc_major;    /* NVIDIA compute capability, 0 elsewhere */
    int nv_cc_minor;
    int has_inline_ptx; /* an inline PTX test kernel built (NVIDIA only) */
    int has_mma;        /* tensor cores through inline PTX: compute capability 8.0 or later and a
                           kernel with mma.sync, ldmatrix and cp.async built (NVIDIA only) */
    int has_wgmma;      /* Hopper's wgmma: compute capability 9.0, and a wgmma kernel, built as PTX
                           retargeted to sm_90a, gave the right product (NVIDIA only) */
    int has_tma;        /* Hopper's TMA copies for wgmma: the CUDA driver (libcuda.so.1) encodes
                           tensor maps for this device (NVIDIA only; LLMCL_TMA=0 turns it off) */
    uint64_t loop_limit; /* where the device cuts loops short, the iterations one work-item may
                            run in one launch, all its loops together (each loop it reaches adds
                            its iterations plus one): 65535 on Mesa's llvmpipe (rusticl on CPUs),
                            measured by a probe kernel; 0 where none was found (2^20 iterations
                            ran); LLMCL_LOOP_LIMIT lowers it. llmcl's launchers split work to
                            stay within it, or refuse */
} llmcl_device_info;

/*
 * Picks the device that llmcl_ctx_create() would use. LLMCL_PLATFORM and LLMCL_DEVICE take an index
 * or a case-insensitive substring of the name; a platform substring is tried on every platform's
 * name, then its vendor, then its version string (so "pocl" finds "Portable Computing Language",
 * "mesa" finds rusticl, "cuda" finds "NVIDIA CUDA"). Without them, the first GPU, else the first
 * device; with LLMCL_PLATFORM alone, that platform's first device. LLMCL_ERROR_NO_DEVICE when
 * nothing matches; llmcl_last_error(NULL) then lists what exists with the strings that were
 * tried.
 */
LLMCL_API llmcl_status llmcl_device_select(cl_platform_id *platform, cl_device_id *device);

/*
 * As llmcl_device_select, but where LLMCL_DEVICE is unset, the device is number (index mod N) of
 * the N devices of the same platform and kind (GPUs, or else the other devices) as the one it
 * picks: for one process a GPU, index is the process's rank on its node. index must be >= 0.
 */
LLMCL_API llmcl_status llmcl_device_select_local(int index, cl_platform_id *platform,
                                                 cl_device_id *device);

/* Probes a device's capabilities (builds a tiny program on NVIDIA to test inline PTX). */
LLMCL_API llmcl_status llmcl_device_probe(cl_device_id device, llmcl_device_info *info);

/* ---------------------------------------------------------------------------------------------- */
/* Contexts.                                                                                      */

typedef struct llmcl_ctx llmcl_ctx;

/* Creates a context on the device llmcl_device_select() picks, with its own profiling queue. */
LLMCL_API llmcl_status llmcl_ctx_create(llmcl_ctx **out);

/* The same on the device llmcl_device_select_local(index) picks. */
LLMCL_API llmcl_status llmcl_ctx_create_local(int index, llmcl_ctx **out);

/*
 * Creates a context on an application's OpenCL objects; all three are retained, not owned. The
 * queue must run in order (an op's kernels follow one another in it; an out-of-order queue is
 * refused). Pass a queue created with CL_QUEUE_PROFILING_ENABLE to use the llmcl_profile_* calls.
 */
LLMCL_API llmcl_status llmcl_ctx_create_from_cl(cl_context context, cl_device_id device,
                                                cl_command_queue queue, llmcl_ctx **out);

/* Releases everything the context holds; tensors must be destroyed first. Accepts NULL. */
LLMCL_API void llmcl_ctx_destroy(llmcl_ctx *ctx);

/* Waits for all work enqueued on the context's queue. */
LLMCL_API llmcl_status llmcl_ctx_finish(llmcl_ctx *ctx);

/*
 * The detail of the last failure on ctx (which argument, which shape, the OpenCL call), or with ctx
 * NULL the last failure on this thread that had no context (context creation). Never NULL.
 */
LLMCL_API const char *llmcl_last_error(const llmcl_ctx *ctx);

/* The build log and options of the last kernel build that failed on ctx, or "". */
LLMCL_API const char *llmcl_build_log(const llmcl_ctx *ctx);

LLMCL_API const llmcl_device_info *llmcl_ctx_device_info(const llmcl_ctx *ctx);
LLMCL_API cl_context llmcl_ctx_cl_context(const llmcl_ctx *ctx);
LLMCL_API cl_device_id llmcl_ctx_cl_device(const llmcl_ctx *ctx);
LLMCL_API cl_command_queue llmcl_ctx_cl_queue(const llmcl_ctx *ctx);

/* Program cache counters since the context was created, for tests and tools. */
typedef struct llmcl_cache_stats {
    uint64_t memory_hits;  /* program found in the in-memory cache */
    uint64_t disk_hits;    /* program loaded from a binary in LLMCL_CACHE_DIR (never on PoCL
                              while its own kernel cache is on: that cache keeps the builds) */
    uint64_t disk_rejects; /* disk entries ignored as truncated, corrupt or foreign */
    uint64_t builds;       /* programs compiled from source */
} llmcl_cache_stats;

LLMCL_API llmcl_status llmcl_cache_stats_get(const llmcl_ctx *ctx, llmcl_cache_stats *out);

/* The on-disk program cache folder in use, or "" when disabled (LLMCL_CACHE_DIR=off). */
LLMCL_API const char *llmcl_cache_dir(const llmcl_ctx *ctx);

/* ---------------------------------------------------------------------------------------------- */
/* Memory accounting: bytes of device memory the library allocated on this context.              */

/*
 * Ops keep the scratch buffers they free for the next op that needs as many bytes (up to an
 * eighth fewer): creating and freeing a buffer costs the host milliseconds a step on NVIDIA's
 * OpenCL (8 ms for 1.5 GB).
 * current and peak count the bytes in use, as PyTorch's memory_allocated does; cached counts the
 * scratch held for reuse, and peak_reserved the peak of both, as memory_reserved does. The cache
 * empties itself before an allocation would fail or pass the limit.
 */
typedef struct llmcl_memory_stats {
    uint64_t current_bytes;
    uint64_t peak_bytes;
    uint64_t limit_bytes;         /* 0: no limit beyond the device's own */
    uint64_t cached_bytes;        /* freed scratch held for reuse */
    uint64_t peak_reserved_bytes; /* peak of current + cached */
} llmcl_memory_stats;

LLMCL_API llmcl_status llmcl_memory_stats_get(const llmcl_ctx *ctx, llmcl_memory_stats *out);

/* Sets the peaks to the current values, so that the next peaks measure one region. */
LLMCL_API llmcl_status llmcl_memory_reset_peak(llmcl_ctx *ctx);

/* Frees the cached scratch buffers (after the queue has finished with them). */
LLMCL_API llmcl_status llmcl_memory_release_cached(llmcl_ctx *ctx);

/*
 * Caps the bytes the library may hold on ctx, in use and cached (0 removes the cap;
 * LLMCL_MEMORY_LIMIT sets it at creation). An allocation past the cap fails with
 * LLMCL_ERROR_OUT_OF_DEVICE_MEMORY.
 */
LLMCL_API llmcl_status llmcl_memory_set_limit(llmcl_ctx *ctx, uint64_t bytes);

/* ---------------------------------------------------------------------------------------------- */
/* Host offload: device tensors saved to pinned host memory and restored, on a second queue.      */
/*
 * Made for activation checkpointing: the forward saves each layer's input and drops it from the
 * device, the backward restores the inputs in reverse order with prefetch a layer or two ahead.
 *
 * An engine (llmcl_offload) owns a pool of pinned host memory (CL_MEM_ALLOC_HOST_PTR buffers,
 * mapped once, as many as the device's largest allocation needs) and a second in-order command
 * queue for copies on the context's device. Copies and the context's queue (the compute queue) are
 * ordered only through events, and the host never waits for either in save (unless the pool is
 * full), prefetch, restore, fence or release:
 *   save     marker on the compute queue (after the kernel that produced t); the device-to-host
 *            copy waits for it on the copy queue.
 *   prefetch host-to-device copy into a new device tensor on the copy queue (after the save's copy,
 *            the copy queue being in order).
 *   restore  barrier on the compute queue that waits for that copy, so later kernels read the
 *            restored tensor only once it has arrived.
 *   fence    barrier on the compute queue that waits for a handle's copies: call it before a kernel
 *            overwrites the saved tensor's memory.
 * A handle can also hold persistent state, such as an optimizer's moments streamed through a few
 * device buffers: prefetch_into copies it into the caller's device tensor and save_into copies a
 * device tensor back over it, neither allocating anything.
 * The engine must be destroyed before its context. Not thread-safe, like the context.
 */

/*
 * Pinned host link bandwidth in GB/s each way, device to host (d2h) and host to device (h2d): the
 * best of several timed copies of `bytes` between a device buffer and a mapped
 * CL_MEM_ALLOC_HOST_PTR buffer on the context's queue (profiling events; needs a profiling queue).
 */
LLMCL_API llmcl_status llmcl_measure_host_bandwidth(llmcl_ctx *ctx, uint64_t bytes, double *d2h_gbs,
                                                    double *h2d_gbs);

typedef struct llmcl_tensor llmcl_tensor; /* declared again with the tensors below (C11) */
typedef struct llmcl_offload llmcl_offload;

/*
 * A saved tensor. Opaque: the engine's serial, a slot and the slot's generation, so a released,
 * foreign (another engine's) or zero-initialised handle is refused with
 * LLMCL_ERROR_INVALID_ARGUMENT instead of reaching another tensor's data.
 */
typedef struct llmcl_offload_handle {
    uint64_t id;
} llmcl_offload_handle;

typedef struct llmcl_offload_stats {
    uint64_t bytes_saved;      /* device to host, every save enqueued */
    uint64_t bytes_restored;   /* host to device, every prefetch enqueued */
    double save_ms;            /* sum of the completed device-to-host copies' own times */
    double restore_ms;         /* sum of the completed host-to-device copies' own times */
    double stall_ms;           /* time the compute queue waited at the engine's barriers (restore,
                                  fence): per barrier, the copy's end minus the moment the compute
                                  queue reached the barrier, if positive, from profiling events;
                                  barriers whose events have not completed are not counted yet, and
                                  nothing is counted on a compute queue without profiling */
    uint32_t copies_in_flight; /* copies enqueued and not complete when the stats were read */
    uint32_t live_handles;     /* saved and not released */
    uint64_t pinned_bytes;     /* the pool's size */
    uint64_t pinned_in_use;    /* bytes held by live handles or by copies still reading them */
    uint64_t peak_pinned_in_use;
} llmcl_offload_stats;

/*
 * Creates an engine on ctx with a pinned pool of pool_bytes (> 0). The pool is allocated and mapped
 * here and reused until llmcl_offload_destroy; each save takes its bytes rounded up to 256.
 * Borrows ctx for the engine's life.
 */
LLMCL_API llmcl_status llmcl_offload_create(llmcl_ctx *ctx, uint64_t pool_bytes,
                                            llmcl_offload **out);

/*
 * Waits for the engine's copies in flight (the copy queue only), then frees everything: the pool,
 * the copy queue, tensors prefetched and not restored, and every handle still live (they become
 * invalid). Tensors returned by restore are the caller's and stay valid. Accepts NULL.
 */
LLMCL_API void llmcl_offload_destroy(llmcl_offload *off);

/*
 * Starts copying t (any dtype, shape and strides, at least one element, on the engine's context)
 * to the pool and returns its handle; never waits. Reads t once all work enqueued on the compute
 * queue before the call has finished. A strided (non-contiguous) t is first packed by llmcl_copy
 * into a contiguous temporary on the compute queue (device memory, counted, held until the copy
 * ends); the copy then reads that temporary, so t itself is free as soon as save returns.
 * A contiguous t is read in place: t may be destroyed at once (the engine keeps its buffer alive
 * until the copy ends), but a kernel that writes its memory must come after
 * llmcl_offload_fence(off, handle). LLMCL_ERROR_OUT_OF_HOST_MEMORY when the pool has no free block
 * large enough (the message gives sizes); released blocks whose copies are still in flight are
 * waited for (a host wait on the copy queue only) before that is reported.
 */
LLMCL_API llmcl_status llmcl_offload_save(llmcl_offload *off, const llmcl_tensor *t,
                                          llmcl_offload_handle *out);

/*
 * Makes work enqueued on the compute queue after this call wait until every copy of h enqueued so
 * far has ended (the save's read of its source, and the latest save_into or prefetch_into), without
 * blocking the host: call before overwriting a contiguous saved tensor's memory, and before reading
 * the destination of llmcl_offload_prefetch_into.
 */
LLMCL_API llmcl_status llmcl_offload_fence(llmcl_offload *off, llmcl_offload_handle h);

/*
 * Copies t over h's saved data, which h keeps (h stays valid and the pool's block is reused): for
 * state that lives in the pool and is updated on the device. t: on the engine's context, the dtype
 * and element count of the saved tensor (any shape and strides; a strided t is packed first, as by
 * save). The copy reads t once the work enqueued on the compute queue before the call has finished,
 * and follows h's earlier copies (a prefetch enqueued before still reads the old data); never
 * waits. A contiguous t is read in place: llmcl_offload_fence(off, h) before a kernel overwrites
 * it. LLMCL_ERROR_SHAPE_MISMATCH for another dtype or size.
 */
LLMCL_API llmcl_status llmcl_offload_save_into(llmcl_offload *off, const llmcl_tensor *t,
                                               llmcl_offload_handle h);

/*
 * Starts copying the saved data into a new contiguous device tensor (shape and dtype of the saved
 * tensor, allocated through the context's accounting) on the copy queue; never waits. Does nothing
 * if a prefetched tensor is already waiting for restore.
 */
LLMCL_API llmcl_status llmcl_offload_prefetch(llmcl_offload *off, llmcl_offload_handle h);

/*
 * Starts copying h's saved data into dst, the caller's device tensor (contiguous, the dtype and
 * element count of the saved tensor), on the copy queue; allocates nothing and never waits. The
 * copy starts once the work enqueued on the compute queue before the call has finished (that work
 * may still read or write dst) and after every copy enqueued before it (a save_into still reading
 * dst included). Work on the compute queue that reads dst must follow llmcl_offload_fence(off, h).
 * With two or more device buffers in turn, a loop copies the next handle in while the compute
 * queue works on the current one and the previous one goes back by save_into.
 */
LLMCL_API llmcl_status llmcl_offload_prefetch_into(llmcl_offload *off, llmcl_offload_handle h,
                                                   llmcl_tensor *dst);

/*
 * Returns the saved data as a contiguous device tensor, prefetching first if needed, and makes work
 * enqueued on the compute queue after this call wait for its copy (a barrier, not a host wait).
 * *out is the caller's (llmcl_tensor_destroy). The handle stays valid: restoring it again copies
 * the data again.
 */
LLMCL_API llmcl_status llmcl_offload_restore(llmcl_offload *off, llmcl_offload_handle h,
                                             llmcl_tensor **out);

/*
 * Invalidates the handle and returns its pinned memory to the pool, once the copies that use it
 * have ended (never waits); frees a prefetched tensor that was not restored.
 */
LLMCL_API llmcl_status llmcl_offload_release(llmcl_offload *off, llmcl_offload_handle h);

/*
 * Waits on the host for every copy the engine has enqueued (and so for the compute queue's work up
 * to the last save), then frees what released handles held. For tests, checkpoints and exact
 * statistics; a training loop does not need it.
 */
LLMCL_API llmcl_status llmcl_offload_finish(llmcl_offload *off);

/* Reads the engine's counters (never waits; see llmcl_offload_stats for what is counted when). */
LLMCL_API llmcl_status llmcl_offload_stats_get(llmcl_offload *off, llmcl_offload_stats *out);

/* ---------------------------------------------------------------------------------------------- */
/* Timing with OpenCL profiling events.                                                           */

typedef struct llmcl_profile {
    double kernel_ms;  /* sum of the kernels' own execution times */
    double span_ms;    /* first kernel start to last kernel end */
    uint32_t launches; /* kernels enqueued in the region */
} llmcl_profile;

/* Starts recording every kernel the context enqueues. Needs a profiling queue. */
LLMCL_API llmcl_status llmcl_profile_begin(llmcl_ctx *ctx);

/* Waits for the recorded kernels and reports their times; ends the region. Where LLMCL_LOG was 3 at
   llmcl_profile_begin it also logs the region's kernels by name (launches, time), the most time
   first. */
LLMCL_API llmcl_status llmcl_profile_end(llmcl_ctx *ctx, llmcl_profile *out);

/* ---------------------------------------------------------------------------------------------- */
/* Tensors: up to 4-D, element strides, 64-bit sizes and offsets.                                */

typedef enum llmcl_dtype {
    LLMCL_F32 = 0,
    LLMCL_BF16, /* 16-bit storage, converted in kernels with round-to-nearest-even */
    LLMCL_F16,  /* 16-bit storage through vload_half/vstore_half_rte: works without cl_khr_fp16 */
    LLMCL_I32,
    LLMCL_I64,
    LLMCL_DTYPE_COUNT
} llmcl_dtype;

#define LLMCL_MAX_DIMS 4

typedef struct llmcl_tensor llmcl_tensor;

LLMCL_API const char *llmcl_dtype_name(llmcl_dtype dtype);
LLMCL_API size_t llmcl_dtype_size(llmcl_dtype dtype); /* 0 for an invalid dtype */

/* Allocates a contiguous row-major tensor; its contents are undefined. */
LLMCL_API llmcl_status llmcl_tensor_create(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim,
                                           const int64_t *shape, llmcl_tensor **out);

/*
 * Wraps an application's buffer (retained, not owned, not counted in memory accounting). strides are
 * in elements (NULL: contiguous); offset is in elements. The view must lie inside the buffer. A
 * sub-buffer overlaps another of its parent, or the parent wrapped, where their bytes meet: the
 * ops refuse such outputs as they refuse overlapping views.
 */
LLMCL_API llmcl_status llmcl_tensor_wrap(llmcl_ctx *ctx, cl_mem buffer, llmcl_dtype dtype, int ndim,
                                         const int64_t *shape, const int64_t *strides,
                                         int64_t offset, llmcl_tensor **out);

/*
 * A view of base's storage with its own shape, strides and offset (in elements of base's dtype).
 * Where the ops speak of tensors that overlap, they mean views that may share an element: views
 * interleaved in one buffer that keep apart, such as heads side by side in its rows, do not.
 */
LLMCL_API llmcl_status llmcl_tensor_view(const llmcl_tensor *base, int ndim, const int64_t *shape,
                                         const int64_t *strides, int64_t offset,
                                         llmcl_tensor **out);

/* Frees an owned tensor or drops a view or wrap. Accepts NULL. */
LLMCL_API void llmcl_tensor_destroy(llmcl_tensor *t);

/*
 * Copies numel elements between host memory (contiguous, row-major, in the tensor's dtype) and the
 * tensor, honouring its strides. bytes must equal numel * dtype size. Both block until done.
 */
LLMCL_API llmcl_status llmcl_tensor_upload(llmcl_tensor *t, const void *host, size_t bytes);
LLMCL_API llmcl_status llmcl_tensor_download(const llmcl_tensor *t, void *host, size_t bytes);

LLMCL_API llmcl_dtype llmcl_tensor_dtype(const llmcl_tensor *t);
LLMCL_API int llmcl_tensor_ndim(const llmcl_tensor *t);
LLMCL_API int64_t llmcl_tensor_dim(const llmcl_tensor *t, int axis);    /* -1 if out of range */
LLMCL_API int64_t llmcl_tensor_stride(const llmcl_tensor *t, int axis); /* in elements */
LLMCL_API int64_t llmcl_tensor_offset(const llmcl_tensor *t);           /* in elements */
LLMCL_API int64_t llmcl_tensor_numel(const llmcl_tensor *t);
LLMCL_API int llmcl_tensor_is_contiguous(const llmcl_tensor *t);
LLMCL_API cl_mem llmcl_tensor_cl_mem(const llmcl_tensor *t); /* borrowed */
LLMCL_API llmcl_ctx *llmcl_tensor_ctx(const llmcl_tensor *t);

/* Host conversions with the same rounding the kernels use (round-to-nearest-even, NaN kept). */
LLMCL_API uint16_t llmcl_f32_to_bf16(float x);
LLMCL_API float llmcl_bf16_to_f32(uint16_t x);
LLMCL_API uint16_t llmcl_f32_to_f16(float x);
LLMCL_API float llmcl_f16_to_f32(uint16_t x);

/* ---------------------------------------------------------------------------------------------- */
/* Elementwise kernels. Any shape and strides; outputs may not overlap inputs unless identical.  */

/* t[...] = value, converted to t's dtype (integers truncate toward zero; a value whose truncation
   lies outside an integer dtype's range is refused, LLMCL_ERROR_INVALID_ARGUMENT). */
LLMCL_API llmcl_status llmcl_fill(llmcl_ctx *ctx, llmcl_tensor *t, double value);

/* dst = src; same dtype and shape. */
LLMCL_API llmcl_status llmcl_copy(llmcl_ctx *ctx, const llmcl_tensor *src, llmcl_tensor *dst);

/* dst = src converted between f32, bf16 and f16; same shape. */
LLMCL_API llmcl_status llmcl_cast(llmcl_ctx *ctx, const llmcl_tensor *src, llmcl_tensor *dst);

/* y += alpha * x; same floating dtype and shape; math in f32. */
LLMCL_API llmcl_status llmcl_axpy(llmcl_ctx *ctx, float alpha, const llmcl_tensor *x,
                                  llmcl_tensor *y);

/* y = x * y, elementwise; same floating dtype and shape (a building block for unfused baselines). */
LLMCL_API llmcl_status llmcl_mul(llmcl_ctx *ctx, const llmcl_tensor *x, llmcl_tensor *y);

/*
 * y = (x[0] + x[1] + ... + x[R-1]) + beta * y for x of shape [R, n] (unit-stride rows, any row
 * stride) and a contiguous y of shape [n]: the rows summed in row order in f32, then beta * y
 * added, rounded once to y's dtype; beta = 0 leaves y unread. x and y may differ in dtype (f32,
 * bf16, f16). y may be one of x's rows (when the rows do not overlap), any other overlap is
 * refused. The order is fixed, so the bits do not depend on the device's grid: llmcl_dist sums the
 * ranks' blocks of a reduce-scatter with it.
 */
LLMCL_API llmcl_status llmcl_sum_rows(llmcl_ctx *ctx, const llmcl_tensor *x, float beta,
                                      llmcl_tensor *y);

/*
 * llmcl_sum_rows with x's row local_row read from local instead (a contiguous [n] tensor of x's
 * dtype; x's own bytes there are not read): the parts of a reduce-scatter summed where the
 * received ones lie in one buffer and the rank's own part stayed in another. y may be local
 * itself; any other overlap with it is refused.
 */
LLMCL_API llmcl_status llmcl_sum_rows_local(llmcl_ctx *ctx, const llmcl_tensor *x,
                                            int64_t local_row, const llmcl_tensor *local,
                                            float beta, llmcl_tensor *y);

/* ---------------------------------------------------------------------------------------------- */
/* Device ceilings, measured on the context's device for benchmark ratios.                       */

/* Copy bandwidth in GB/s (bytes read + written) of a large f32 copy with the library's kernel. */
LLMCL_API llmcl_status llmcl_measure_copy_bandwidth(llmcl_ctx *ctx, uint64_t bytes, double *gbs);

/* fp32 FMA rate in TFLOP/s (2 FLOPs per FMA) of independent FMA chains in registers. */
LLMCL_API llmcl_status llmcl_measure_fma_rate(llmcl_ctx *ctx, double *tflops);

/*
 * Tensor-core rate in TFLOP/s of independent bf16 mma.sync m16n8k16 chains in registers (f32
 * accumulation): the ceiling of llmcl's tensor-core kernels. LLMCL_ERROR_UNSUPPORTED where
 * llmcl_device_info.has_mma is 0.
 */
LLMCL_API llmcl_status llmcl_measure_mma_rate(llmcl_ctx *ctx, double *tflops);

/* ---------------------------------------------------------------------------------------------- */
/* Normalisation, RoPE and gated linear units (norm.cl, rope.cl, glu.cl).                        */

/* ---- RMSNorm and LayerNorm (norm.cl) ---- */

/*
 * Shapes shared by the norm ops: x is any tensor of up to 4 dimensions whose last dimension (H,
 * unit stride) is normalised. Its leading dimensions (N rows in all) merge where stride[k] ==
 * stride[k+1] * shape[k+1] (size-1 ones always do) into one level of rows with one row stride, or
 * into two: O blocks of I rows, row o * I + i at o * block stride + i * row stride. So rows may be
 * padded, or per head: q as a [T, heads, d] view, strides (W, d, 1), of a [T, W] buffer of q, k
 * and v side by side. Activations (x, residual, r, y, dy, dr, dx) are f32, bf16 or f16, all of x's
 * dtype and shape, each with its own strides; all split into blocks after the same dimension, where
 * any of them needs to (one that merges there has block stride I * row stride). A call that needs
 * three levels is refused (LLMCL_ERROR_INVALID_ARGUMENT). w, b, dw and db are 1-D [H], unit
 * stride, f32 or x's dtype (all four alike); rstd and mean are contiguous f32 with N elements (any
 * shape), row o * I + i's at that index. Math is in f32. Weight gradients are deterministic:
 * per-row-slot partial sums in a scratch buffer (slots * H floats, freed once the kernels finish),
 * summed in a fixed order by a second kernel; no atomics. Outputs may not overlap inputs or each
 * other except where a comment allows an in-place pairing (the same view exactly).
 */

/* RMSNorm casting, as in Hugging Face transformers and Liger Kernel. */
typedef enum llmcl_rmsnorm_casting {
    LLMCL_RMSNORM_CAST_LLAMA = 0, /* x * rstd rounded to x's dtype, then times (w + offset) */
    LLMCL_RMSNORM_CAST_GEMMA,     /* all in f32, rounded once when stored */
} llmcl_rmsnorm_casting;

/* RMSNorm options; a zero-initialised struct (or NULL) gives the defaults. */
typedef struct llmcl_rmsnorm_options {
    float eps;                     /* added to mean(x^2); 0 means the default 1e-6 */
    float offset;                  /* added to w: 0 for Llama (default), 1 for Gemma */
    llmcl_rmsnorm_casting casting; /* default LLMCL_RMSNORM_CAST_LLAMA */
} llmcl_rmsnorm_options;

/*
 * y = x * rstd * (w + offset), rstd = 1 / sqrt(mean(x^2) + eps) per row. Reads x, w; writes y (x's
 * dtype) and rstd. y may be x itself (in place).
 */
LLMCL_API llmcl_status llmcl_rmsnorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x,
                                             const llmcl_tensor *w, llmcl_tensor *y,
                                             llmcl_tensor *rstd, const llmcl_rmsnorm_options *opt);

/*
 * The RMSNorm backward from the forward's x and rstd: writes dx and dw (overwritten, not
 * accumulated). Reads dy, x, w, rstd. dx may be dy itself (in place).
 */
LLMCL_API llmcl_status llmcl_rmsnorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy,
                                              const llmcl_tensor *x, const llmcl_tensor *w,
                                              const llmcl_tensor *rstd, llmcl_tensor *dx,
                                              llmcl_tensor *dw, const llmcl_rmsnorm_options *opt);

/*
 * Fused residual add and RMSNorm in one pass: r = x + residual (rounded to x's dtype), then y =
 * rmsnorm(r). Reads x, residual, w; writes r, y, rstd. r may be x or residual itself (in place);
 * y may be x or residual when r is neither.
 */
LLMCL_API llmcl_status llmcl_residual_rmsnorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x,
                                                      const llmcl_tensor *residual,
                                                      const llmcl_tensor *w, llmcl_tensor *r,
                                                      llmcl_tensor *y, llmcl_tensor *rstd,
                                                      const llmcl_rmsnorm_options *opt);

/*
 * The backward of the fused residual RMSNorm. dr (may be NULL) is the gradient reaching r through
 * the residual stream (the next block's residual add); the result drx = rmsnorm_backward(dy) + dr
 * is the gradient of both x and residual. So a Llama block's backward chains: drx of block l+1
 * is the dr of block l. Reads dy, dr, r, w, rstd; writes drx and dw (overwritten). drx may be dy or
 * dr itself (in place).
 */
LLMCL_API llmcl_status llmcl_residual_rmsnorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy,
                                                       const llmcl_tensor *dr,
                                                       const llmcl_tensor *r, const llmcl_tensor *w,
                                                       const llmcl_tensor *rstd, llmcl_tensor *drx,
                                                       llmcl_tensor *dw,
                                                       const llmcl_rmsnorm_options *opt);

/* LayerNorm options; a zero-initialised struct (or NULL) gives the defaults. */
typedef struct llmcl_layernorm_options {
    float eps; /* added to the variance; 0 means the default 1e-5 */
} llmcl_layernorm_options;

/*
 * y = (x - mean) * rstd * w + b per row, with the biased variance. b may be NULL (no bias). Reads x,
 * w, b; writes y (x's dtype), mean and rstd. y may be x itself (in place).
 */
LLMCL_API llmcl_status llmcl_layernorm_forward(llmcl_ctx *ctx, const llmcl_tensor *x,
                                               const llmcl_tensor *w, const llmcl_tensor *b,
                                               llmcl_tensor *y, llmcl_tensor *mean,
                                               llmcl_tensor *rstd,
                                               const llmcl_layernorm_options *opt);

/*
 * The LayerNorm backward from the forward's x, mean and rstd: writes dx, dw and, when db is not
 * NULL, db (overwritten). Reads dy, x, w, mean, rstd. dx may be dy itself (in place).
 */
LLMCL_API llmcl_status llmcl_layernorm_backward(llmcl_ctx *ctx, const llmcl_tensor *dy,
                                                const llmcl_tensor *x, const llmcl_tensor *w,
                                                const llmcl_tensor *mean, const llmcl_tensor *rstd,
                                                llmcl_tensor *dx, llmcl_tensor *dw,
                                                llmcl_tensor *db);

/* ---- RoPE (rope.cl) ---- */

typedef enum llmcl_rope_style {
    LLMCL_ROPE_HALF = 0,    /* Hugging Face / GPT-NeoX: element i pairs with i + rotary_dim/2 */
    LLMCL_ROPE_INTERLEAVED, /* GPT-J / original: element 2i pairs with 2i + 1 */
} llmcl_rope_style;

typedef enum llmcl_rope_layout {
    LLMCL_ROPE_BHTD = 0, /* q is [B, Hq, T, D], k is [B, Hk, T, D] */
    LLMCL_ROPE_BTHD,     /* q is [B, T, Hq, D], k is [B, T, Hk, D] */
} llmcl_rope_layout;

/*
 * Options of llmcl_rope_forward / llmcl_rope_backward; a zeroed struct is the default (half-split,
 * BHTD, full rotary, theta 10000, no scaling) but names no angle source: set either the tables or
 * the positions.
 *
 * Pair i (0 <= i < rotary_dim/2) turns by angle pos * inv_freq[i]:
 *   x' = x cos - y sin,  y' = y cos + x sin  (backward: the inverse, sin negated)
 * where (x, y) are elements (i, i + rotary_dim/2) for LLMCL_ROPE_HALF and (2i, 2i + 1) for
 * LLMCL_ROPE_INTERLEAVED. Elements from rotary_dim to D are left untouched.
 *
 * Angles from tables: cos and sin are f32 [T, rotary_dim/2] (shared by the batch) or
 * [B, T, rotary_dim/2] (per batch), any strides with a unit last stride. Hugging Face's
 * [B, T, rotary_dim] tables (cat(freqs, freqs)) fit as a view of their first rotary_dim/2 columns.
 *
 * Angles computed in the kernel: from positions, i32 or i64 [T] (shared) or [B, T] (per-batch
 * position ids), and inv_freq[i] = 1 / theta^(2i / rotary_dim), optionally rescaled as Llama 3.1
 * does (Hugging Face rope_type "llama3"). As in Hugging Face, inv_freq and the angle pos * inv_freq
 * are f32 and cos/sin are taken of that f32 angle with precise argument reduction: the angle's own
 * error, about |pos| * 2^-23 radians, dominates at large positions.
 */
typedef struct llmcl_rope_options {
    llmcl_rope_layout layout; /* how q's and k's dimensions read; any strides, D unit-stride */
    llmcl_rope_style style;
    int64_t rotary_dim;       /* leading elements of D that rotate; even, <= D; 0 means D */
    const llmcl_tensor *cos;  /* tables (borrowed), both or neither */
    const llmcl_tensor *sin;
    const llmcl_tensor *positions; /* without tables (borrowed) */
    double theta;                  /* frequency base; 0 means 10000 */
    /* Llama 3 scaling, on when llama3_factor > 0; the other three then default (when 0) to Llama
     * 3.1's 1, 4 and 8192. */
    double llama3_factor;
    double llama3_low_freq_factor;
    double llama3_high_freq_factor;
    double llama3_original_max_position;
} llmcl_rope_options;

/*
 * Rotates q and, when k is not NULL, k in place. q and k share dtype (f32, bf16, f16), B, T and D;
 * Hq and Hk may differ (GQA). q and k may be views of one packed QKV buffer as long as they share
 * no element. Reads and writes q and k; reads the tables or positions named in opt (NULL: defaults).
 */
LLMCL_API llmcl_status llmcl_rope_forward(llmcl_ctx *ctx, llmcl_tensor *q, llmcl_tensor *k,
                                          const llmcl_rope_options *opt);

/* The gradient through RoPE: rotates dq and dk (k NULL allowed) back in place, same options. */
LLMCL_API llmcl_status llmcl_rope_backward(llmcl_ctx *ctx, llmcl_tensor *dq, llmcl_tensor *dk,
                                           const llmcl_rope_options *opt);

/* ---- GLU (glu.cl) ---- */

typedef enum llmcl_activation {
    LLMCL_ACT_SILU = 0,  /* x * sigmoid(x): SwiGLU */
    LLMCL_ACT_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GeGLU, tanh form */
    LLMCL_ACT_GELU_ERF,  /* 0.5 x (1 + erf(x / sqrt(2))): GeGLU, exact */
} llmcl_activation;

/*
 * Gated linear unit: out = act(gate) * up, elementwise over rows of I (f32, bf16, f16; f32 math).
 * Two layouts:
 *   separate: gate, up and out of one shape [..., I];
 *   packed:   up NULL, gate [..., 2I] holding gate in columns [0, I) and up in [I, 2I) (the
 *             output of one fused gate/up projection), out [..., I].
 * Any leading dimensions that flatten into rows with one stride; the last dimension unit-stride.
 * out may be the same view as gate or up (in place); otherwise it may not overlap them.
 * Reads gate and up, writes out.
 */
LLMCL_API llmcl_status llmcl_glu_forward(llmcl_ctx *ctx, llmcl_activation act,
                                         const llmcl_tensor *gate, const llmcl_tensor *up,
                                         llmcl_tensor *out);

/*
 * The gradient of llmcl_glu_forward, recomputing act(gate):
 *   dgate = dout * up * act'(gate),  dup = dout * act(gate).
 * Separate: dgate and dup have gate's shape. Packed: up and dup NULL, gate and dgate [..., 2I],
 * dgate receiving dgate in columns [0, I) and dup in [I, 2I). Each output may be the same view as
 * one input (in place: dgate over gate, dup over up, packed dgate over packed gate, or either over
 * dout); otherwise outputs overlap nothing. Reads dout, gate, up; writes dgate, dup.
 */
LLMCL_API llmcl_status llmcl_glu_backward(llmcl_ctx *ctx, llmcl_activation act,
                                          const llmcl_tensor *dout, const llmcl_tensor *gate,
                                          const llmcl_tensor *up, llmcl_tensor *dgate,
                                          llmcl_tensor *dup);

/*
 * The activation alone, y = act(x), same shape (rows as above); y may be the same view as x.
 * With llmcl_mul it builds the unfused GLU that llmcl-bench compares against.
 */
LLMCL_API llmcl_status llmcl_activation_forward(llmcl_ctx *ctx, llmcl_activation act,
                                                const llmcl_tensor *x, llmcl_tensor *y);

/* dx = dy * act'(x), same shape; dx may be the same view as dy or x. Reads x, dy; writes dx. */
LLMCL_API llmcl_status llmcl_activation_backward(llmcl_ctx *ctx, llmcl_activation act,
                                                 const llmcl_tensor *x, const llmcl_tensor *dy,
                                                 llmcl_tensor *dx);

/* ---------------------------------------------------------------------------------------------- */
/* Attention (attention_*.cl).                                                                    */

/*
 * Options of flash attention. A zero-initialised struct is full (non-causal) attention with scale
 * 1/sqrt(D) over dense batches.
 *
 * Masking aligns the causal diagonal bottom-right as FlashAttention >= 2.1 does: query i of a
 * sequence with tq queries and tk keys sees key j when j <= i + tk - tq. With use_window, it also
 * needs i + tk - tq - window_left <= j <= i + tk - tq + window_right (a negative bound is
 * unbounded), FlashAttention's window_size = (left, right); causal then caps window_right at 0. A
 * query that sees no key (causal with tq > tk, or a narrow window) gets O = 0, LSE = -inf and
 * zero gradients.
 *
 * Varlen (cu_seqlens_q and cu_seqlens_k both set, i32 [B + 1] and contiguous, FlashAttention's
 * varlen API): sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of a packed Q
 * [total_q, Hq, D] and rows cu_seqlens_k[b] .. cu_seqlens_k[b+1] of K, V [total_k, Hkv, D]; each
 * sequence attends only within itself. The offsets must start at 0, never decrease (empty
 * sequences are allowed) and end at total_q (total_k). They are read back to the host to be
 * validated, so varlen calls wait for the queue up to that point, unless the caller also gives
 * them in host memory
 * (cu_seqlens_q_host and cu_seqlens_k_host, B + 1 each): those are validated instead and nothing
 * waits. The two copies must then hold the same offsets, as a training loop that uploads its own
 * does; the kernels read the device's.
 */
typedef struct llmcl_attention_opts {
    int causal;
    int use_window;        /* 0: no sliding window; else window_left / window_right apply */
    int window_left;       /* keys before the diagonal a query sees; -1: unbounded */
    int window_right;      /* keys after the diagonal a query sees; -1: unbounded */
    float softcap;         /* > 0: logits = softcap * tanh(logits / softcap); 0: off */
    float scale;           /* logit scale; 0: 1 / sqrt(D) */
    const llmcl_tensor *cu_seqlens_q; /* borrowed; NULL with cu_seqlens_k NULL: dense batches */
    const llmcl_tensor *cu_seqlens_k;
    const int32_t *cu_seqlens_q_host; /* optional, borrowed: the same offsets on the host */
    const int32_t *cu_seqlens_k_host;
    /* The backward's stored dS (llmcl_attention_backward): at most this many bytes of device
       memory, at D 64 and 128; 0: the default, LLMCL_ATTN_DS_MIB MiB at D 64 and 128 where that
       is set, else at D 128 and at D 64 up to 2048 keys, 4 GiB and at most a quarter of the
       memory left under the context's cap or the device's; -1: none */
    int64_t ds_bytes;
} llmcl_attention_opts;

/*
 * Flash attention forward: o = softmax(mask(logits(q . k^T))) . v with the softmax computed online
 * in f32 over key tiles; memory stays linear in T (no T x T scores are stored).
 *
 * Dense: q and o [B, Hq, Tq, D], k and v [B, Hkv, Tk, D], any strides with a unit stride on D (so
 * [B, T, H, D] storage is a strided view), lse f32 [B, Hq, Tq] with a unit last stride. Varlen:
 * q, o [total_q, Hq, D], k, v [total_k, Hkv, D], lse [Hq, total_q]. Hq must be a multiple of Hkv
 * (GQA, MQA): query head h reads KV head h / (Hq / Hkv). D is a multiple of 8 from 8 to 256, as in
 * FlashAttention-2 (others fail with LLMCL_ERROR_UNSUPPORTED). q, k, v, o share one dtype: f32,
 * bf16 or f16; math is f32.
 *
 * On devices with tensor cores (llmcl_device_info.has_mma), bf16 and f16 calls whose D is a
 * multiple of 16 from 32 to 256 and whose q, k, v (and dout) offsets and strides
 * are multiples of 8 elements run on them: the products take 16-bit inputs with f32
 * accumulation, so P (and in the backward dS) is rounded to q's dtype before its product, as
 * FlashAttention does, and the softmax's exponentials use the hardware approximation. Where the
 * device has Hopper's wgmma (llmcl_device_info.has_wgmma), calls at D 64 and 128 run on it. Other
 * calls (f32, D below 32 or an odd multiple of 8, operands not 8-element aligned) run the portable
 * kernels, and with LLMCL_LOG set the log says so. llmcl_tune_params_get with a kernel's key says
 * whether it ran: "attention_fwd_wgmma", "attention_fwd_mma" or "attention_fwd" (and the
 * backward's *_bwd_dq* and *_bwd_dkdv* keys).
 *
 * Reads q, k, v (and the cu_seqlens); writes o and lse (natural-log sum of exponentials per
 * query row, kept for the backward). opts may be NULL (the defaults). o and lse must not overlap
 * the inputs or each other. Extra device memory where the wgmma kernels copy by TMA
 * (llmcl_device_info.has_tma): six 128-byte tensor maps a work-group (768 bytes per 128 or 64
 * query rows of each head), counted in memory accounting and freed once the kernel is done; the
 * backward's kernels take as many a work-group.
 */
LLMCL_API llmcl_status llmcl_attention_forward(llmcl_ctx *ctx, const llmcl_tensor *q,
                                               const llmcl_tensor *k, const llmcl_tensor *v,
                                               const llmcl_attention_opts *opts, llmcl_tensor *o,
                                               llmcl_tensor *lse);

/*
 * Flash attention backward: dq, dk and dv from dout, given the forward's q, k, v, o and lse and the
 * same opts. Recomputes the probabilities tile by tile from q, k and lse; dk and dv are summed over
 * the query heads that share a KV head inside the kernel, in a fixed order, so results are the same
 * bits on every run (no atomics). Extra device memory: one f32 per query row (delta =
 * rowsum(dout * o)), counted in memory accounting and freed before returning.
 *
 * Where the wgmma kernels run with TMA at D 128 (and at D 64 up to 2048 keys, or where
 * opts->ds_bytes or LLMCL_ATTN_DS_MIB sets a budget), the
 * dK/dV kernel also stores dS (the logits' gradient, rounded to q's dtype as dq's product takes
 * it), and dq is then a product of it with k: five tile products where recomputing the scores
 * takes seven, for Tq x Tk values of 2 bytes a query head (Tk rounded up to 8) through device
 * memory. The heads run in parts of whole KV-head groups whose dS fits the budget, in a scratch
 * buffer counted in memory accounting and kept in the context's cache; where one group does not
 * fit, or with ds_bytes -1, dq recomputes the scores, as it does under the default budget where
 * parts would leave the device underused (fewer than two of dK/dV's work-groups a compute unit).
 * Either way the bits repeat run after run.
 *
 * Shapes as in llmcl_attention_forward; dout and dq are shaped like q, dk and dv like k, all in
 * q's dtype. Reads q, k, v, o, lse, dout; writes dq, dk, dv, which must not overlap the inputs or
 * each other.
 */
LLMCL_API llmcl_status llmcl_attention_backward(llmcl_ctx *ctx, const llmcl_tensor *q,
                                                const llmcl_tensor *k, const llmcl_tensor *v,
                                                const llmcl_tensor *o, const llmcl_tensor *lse,
                                                const llmcl_tensor *dout,
                                                const llmcl_attention_opts *opts,
                                                llmcl_tensor *dq, llmcl_tensor *dk,
                                                llmcl_tensor *dv);

/* ---------------------------------------------------------------------------------------------- */
/* Matrix multiply (matmul.cl).                                                                   */

/* Where a bias is added: to every row (bias[N], a linear layer's bias) or down every column (bias[M]). */
typedef enum llmcl_matmul_bias {
    LLMCL_MATMUL_BIAS_ROW = 0, /* c[i, j] += bias[j] */
    LLMCL_MATMUL_BIAS_COL,     /* c[i, j] += bias[i] */
} llmcl_matmul_bias;

typedef struct llmcl_sumsq llmcl_sumsq; /* the optimizer's below */

/* Options of llmcl_matmul. A zero-initialised struct (or NULL) gives the defaults. */
typedef struct llmcl_matmul_opts {
    int trans_a, trans_b;         /* 1: op(a) = a^T, op(b) = b^T; 0: as stored */
    const llmcl_tensor *bias;     /* optional, borrowed: 1-D, f32 or a's dtype, any stride */
    llmcl_matmul_bias bias_mode;  /* default LLMCL_MATMUL_BIAS_ROW */
    int split_k;                  /* slices of K summed in a fixed order by a second kernel;
                                     0: chosen from the shape and the device; 1: off */
    const llmcl_tensor *c_in;     /* optional, borrowed: the addend that beta scales in place of
                                     c (cuBLASLt's C beside D); c's dtype and shape */
    llmcl_sumsq *sumsq;           /* optional: gathers the sum of the squares of the values
                                     written to c (c contiguous), for llmcl_grad_norm_sumsq */
    const llmcl_tensor *a_ext;    /* optional, borrowed, with b_ext: the product goes on along
                                     K, op(a) op(b) + op(a_ext) op(b_ext) (below) */
    const llmcl_tensor *b_ext;
} llmcl_matmul_opts;

/*
 * c = alpha op(a) op(b) + beta c + bias, with f32 accumulation (beta 0: c is not read, so it may
 * hold anything; the bias is not scaled by alpha). With opts->c_in, c = alpha op(a) op(b) +
 * beta c_in + bias: c is only written, so a residual x + f(x) needs no copy of x first (c_in is
 * read at c's strides in the epilogue; one laid out otherwise, or the CLBlast path, copies it into
 * c first). c_in is c itself or storage apart from c; it may overlap a, b or the bias.
 *
 * op(a) is [M, K] and op(b) is [K, N]: a is [M, K] (or [K, M] with trans_a), b is [K, N] (or [N, K]
 * with trans_b). The three products of a linear layer y = x w^T + b with w [out, in]:
 *   y = x w^T        llmcl_matmul(ctx, 1, x, w, 0, y, {.trans_b = 1, .bias = b})
 *   dx = dy w        llmcl_matmul(ctx, 1, dy, w, 0, dx, NULL)
 *   dw += dy^T x     llmcl_matmul(ctx, 1, dy, x, 1, dw, {.trans_a = 1})
 * Batched: c [batch, M, N] with a and b each [batch, ., .] or 2-D (the same matrix for every batch
 * entry). Every tensor may have any element strides (views of per-head slices, transposed storage);
 * the fast paths want a unit stride along one of each operand's two matrix dimensions.
 *
 * a and b share one dtype: f32, bf16 or f16. c is f32 or a's dtype; the bias (opts->bias, bias_mode
 * picks its length N or M) is f32 or a's dtype. Reads a, b, the bias and (beta != 0) c or c_in;
 * writes c, which must not overlap a, b, a_ext, b_ext, the bias or a separate c_in
 * (LLMCL_ERROR_INVALID_ARGUMENT),
 * nor itself (no stride 0).
 *
 * Paths: on NVIDIA devices of compute capability 8.0 and later, bf16 and f16 run on tensor cores:
 * Hopper's wgmma where the device has it (llmcl_device_info.has_wgmma, sm_90), else mma.sync with
 * ldmatrix, both fed by a cp.async pipeline; f32 runs in f32 (never tf32) through CLBlast where
 * the layout allows, and everything else through a portable tiled kernel. split_k > 1 (or the
 * automatic choice for shapes with few output tiles and a long K)
 * computes K slices into an f32 scratch of split_k * batch * M * N floats, counted in memory
 * accounting and freed when the call returns; results are the same bits run after run. Where the
 * device cuts loops short (llmcl_device_info.loop_limit: rusticl on llvmpipe) the portable kernel
 * takes more slices than asked when one slice's loops would pass the limit (about 2000 of K in
 * each with the default tiles), and f32 takes CLBlast only for K within the limit.
 * llmcl_tune_params_get(ctx, "mm_wgmma", "mm_wgmma_at" (wgmma with a transposed), "mm_mma",
 * "mm_mma_at" (mma.sync with a transposed) or "mm_tiled", ...) reports the parameters of the path
 * that ran; for wgmma's, MM_WS is 1 only where the producers ran (TMA's copies), MM_TMA_STORE and
 * a forced MM_PRELOAD say whether the stores and the preload were taken, and MM_PRELOAD -1 that
 * the launcher chose.
 *
 * opts->sumsq adds the squares of c's new values to a llmcl_sumsq, so that a weight gradient's
 * share of the global norm costs no pass over it: mm_wgmma into an f32 c, unsplit, sums them in
 * its epilogue (a partial per warp and tile); every other path sums c after the product. c must
 * be contiguous. On failure the accumulator holds what it held before.
 *
 * opts->a_ext and opts->b_ext (both or neither) continue the product along K: c = alpha (op(a)
 * op(b) + op(a_ext) op(b_ext)) + beta c_in + bias, as if a_ext lay beside a and b_ext below b in
 * one product of K + K2, where op(a_ext) is [M, K2] and op(b_ext) [K2, N] (trans_a and trans_b
 * apply to them too, K2 >= 0; their dtype is a's, their batch rules a's and b's). A LoRA
 * projection is y = [x, s u] [W, B]^T, its input gradient dx = [dy, du] [W; A], without
 * reading and writing the output a second time. mm_wgmma takes the second pair's slices after
 * each tile's first, into the same accumulators, where both pairs have TMA's copies, one unit
 * stride alike, and c is 2-D and unsplit (llmcl_tune_params_get then reports MM_EXT 1); every
 * other path copies op(a) beside op(a_ext) and op(b) beside op(b_ext) into scratch ((M + N)
 * (K + K2) elements a batch entry, counted in memory accounting and freed when the call returns)
 * and runs one product over them. Either way c is written once, rounded once.
 */
LLMCL_API llmcl_status llmcl_matmul(llmcl_ctx *ctx, float alpha, const llmcl_tensor *a,
                                    const llmcl_tensor *b, float beta, llmcl_tensor *c,
                                    const llmcl_matmul_opts *opts);

/* ---------------------------------------------------------------------------------------------- */
/* Cross-entropy (cross_entropy.cl).                                                              */
/*
 * Softmax cross-entropy over V classes in three forms: on materialised logits [N, V]; fused with
 * the output projection and chunked over tokens (Liger's approach, llmcl_matmul); and fully fused,
 * never holding all N x V logits (Cut Cross-Entropy's aim: chunks of the vocabulary through
 * llmcl_matmul, or hidden x W^T tiles in local memory).
 *
 * For row i with label y_i (rows with y_i == ignore_index are ignored: loss 0, gradient 0), z_ij the
 * logits, x_ij = cap tanh(z_ij / cap) with a softcap (else z_ij), lse_i = log sum_j exp(x_ij), w_j
 * the class weights (1 without), S_w = sum_j w_j, eps = label_smoothing, zs = lse_square_scale:
 *   ce_i = (1 - eps) w_{y_i} (lse_i - x_{i,y_i}) + (eps / V) sum_j w_j (lse_i - x_ij)
 *   z_i  = zs lse_i^2                           (the z-loss; not weighted)
 * which is PyTorch's cross_entropy(weight, label_smoothing) plus Liger's z-loss. Reductions:
 *   mean: loss = sum_i ce_i / D_w + sum_i z_i / D_n,  z_loss = sum_i z_i / D_n, where D_n counts
 *         the non-ignored rows and D_w sums w_{y_i} over them (D_w = D_n without weights: PyTorch's
 *         weighted mean). A term whose divisor is 0 is 0, so an all-ignored batch gives loss 0
 *         (PyTorch gives NaN) and zero gradients.
 *   sum:  loss = sum_i (ce_i + z_i),  z_loss = sum_i z_i
 *   none: loss_i = ce_i + z_i,  z_loss_i = z_i  (0 on ignored rows)
 * Gradients are those of the reduced loss; for none, of sum_i loss_i (an upstream gradient of
 * ones). With upstream gradient g != 1 multiply them by g: llmcl_cross_entropy_grad_scale(), or the
 * grad_loss argument of the fused backward. Per element:
 *   dloss/dz_ij = (A_i p_ij - B_i [j == y_i] - C_i w_j) (1 - (x_ij / cap)^2 with a softcap)
 *   p_ij = exp(x_ij - lse_i), A_i = c ((1-eps) w_{y_i} + eps S_w / V) + 2 zs lse_i c_z,
 *   B_i = c (1-eps) w_{y_i}, C_i = c eps / V; c = 1/D_w and c_z = 1/D_n for mean (0 when the
 *   divisor is 0), 1 otherwise.
 * -inf logits (masked classes) follow PyTorch: p_ij = 0, so the gradient at a -inf logit is
 * -B_i [j == y_i] - C_i w_j, 0 unless it is the target or smoothing is on, and the loss stays
 * finite unless the target is -inf (ce_i = +inf, finite gradient) or, with smoothing, a class of
 * nonzero weight is -inf (ce_i = +inf). A row whose logits are all -inf has lse_i = -inf, ce_i =
 * +inf (as a -inf target), z_i = +inf if zs > 0, and a zero gradient; ignored, it adds nothing.
 * Where PyTorch would multiply 0 by an infinity and give NaN, a factor of 0 (w_j, w_{y_i}, 1 - eps,
 * eps, zs, or a mean's 1/D_w) makes its term 0: a -inf class of weight 0 adds nothing, even with
 * smoothing. A softcap maps -inf to -cap, so every result is finite then. +inf and NaN logits give
 * NaN.
 * Labels are I32 or I64. A label outside [0, V) that is not ignore_index fails the call with
 * LLMCL_ERROR_INVALID_ARGUMENT naming the first such row; the check runs on the device before any
 * output is written, and nothing is written then (in-place logits stay intact). Reading that flag
 * back makes each call wait for its own kernels.
 */

typedef enum llmcl_ce_reduction {
    LLMCL_CE_MEAN = 0, /* over non-ignored rows (weighted, see above) */
    LLMCL_CE_SUM,
    LLMCL_CE_NONE, /* one loss per row */
} llmcl_ce_reduction;

/* Options shared by the three forms. A zero-initialised struct gives the defaults. */
typedef struct llmcl_ce_options {
    int use_ignore_index; /* 0: ignore_index is -100 (PyTorch's default); 1: use the field below */
    int64_t ignore_index;
    llmcl_ce_reduction reduction; /* default mean */
    float label_smoothing;        /* eps in [0, 1]; default 0 */
    float lse_square_scale;       /* z-loss scale zs >= 0; default 0 */
    float softcap;                /* > 0: logits become cap tanh(z / cap); 0: off */
    const llmcl_tensor *weight;   /* optional f32 [V] class weights, borrowed; NULL: all 1 */
    int vocab_splits;      /* work-groups per row across the vocabulary; 0: chosen by size */
    uint64_t chunk_bytes;  /* chunked linear CE: scratch budget per chunk; 0: 256 MiB */
    int64_t chunk_rows;    /* chunked linear CE: tokens per chunk; 0: from chunk_bytes */
    float grad_filter;     /* fused backward in tiles: skip tiles whose probabilities are all
                              below this and that hold no target (never with smoothing); 0: off,
                              exact. The chunked form computes every gradient. */
    int64_t vocab_chunk;   /* fused path: > 0 runs it in vocabulary chunks of this many classes;
                              0: chunks where the device has tensor cores (classes from
                              chunk_bytes, default 64 MiB), tiles elsewhere; -1: tiles */
    int accumulate_weight_grad; /* linear and fused forms: 1 adds dweight and dbias to the
                                   tensors' contents (gradient accumulation over micro-batches, an
                                   output head tied to the embeddings); 0 overwrites them. dhidden
                                   is always overwritten. */
    float grad_scale;         /* the gradients (dlogits, dhidden, dweight, dbias) are those of
                                 grad_scale x the loss; the loss itself is not scaled. 0: 1.
                                 A training loop that weighs micro-batches by their counted
                                 rows (a mean over a whole step's targets) sets it per call */
    llmcl_dtype logits_dtype; /* chunked linear form: the logits' storage, LLMCL_F32 (the
                                 default) or hidden's 16-bit dtype, which rounds them as PyTorch's
                                 autocast does, moves half the bytes and holds the dlogits in
                                 their place; the other forms take LLMCL_F32 only */
} llmcl_ce_options;

/*
 * Cross-entropy on logits [..., V] (f32, bf16 or f16; leading dimensions flattened to N rows, unit
 * stride along V) with labels (I32 or I64, N elements, contiguous). Writes loss (f32, 1 element
 * for mean and sum, N for none, contiguous); optionally z_loss (same layout as loss), lse (f32, N
 * elements: each row's logsumexp of the capped logits, ignored rows included) and dlogits (the
 * gradient, in logits' dtype: either logits itself, same view, for in place, or a separate tensor
 * of the same shape that does not overlap it). No output may overlap an input, opts->weight
 * included (LLMCL_ERROR_INVALID_ARGUMENT). Reads logits once for the LSE and once more for the
 * gradient; extra memory is O(N) (O(N x splits) when the vocabulary is split).
 */
LLMCL_API llmcl_status llmcl_cross_entropy_forward(llmcl_ctx *ctx, const llmcl_tensor *logits,
                                                   const llmcl_tensor *labels,
                                                   const llmcl_ce_options *opts,
                                                   llmcl_tensor *loss, llmcl_tensor *z_loss,
                                                   llmcl_tensor *lse, llmcl_tensor *dlogits);

/*
 * grad *= grad_loss[0] (grad_loss f32 with one element, on the device; grad f32, bf16 or f16,
 * contiguous): scales gradients computed with an upstream gradient of 1 (Liger's backward).
 */
LLMCL_API llmcl_status llmcl_cross_entropy_grad_scale(llmcl_ctx *ctx, const llmcl_tensor *grad_loss,
                                                      llmcl_tensor *grad);

/*
 * Linear cross-entropy chunked over tokens: logits = hidden [N, H] x weight [V, H]^T (+ bias [V]),
 * hidden, weight and bias of one dtype (f32, bf16, f16; unit stride along H), then the loss as
 * llmcl_cross_entropy_forward with the gradients computed in the same call: dhidden (f32 [N, H]),
 * dweight (f32 [V, H]) and dbias (f32 [V]), each optional (all NULL: loss only). The gradients are
 * those of the loss with an upstream gradient of 1 (see llmcl_cross_entropy_grad_scale). Per chunk
 * of tokens, through llmcl_matmul (tensor cores where the device has them): the f32 logits with
 * the bias, the row kernel writing dlogits (in place, or rounded to hidden's dtype when that is
 * 16-bit, as Liger does, straight into the 16-bit copy unless dbias needs the f32 values), then
 * dhidden = dlogits x W and dweight += dlogits^T x hidden, and dbias += column sums (in order,
 * deterministic). Extra device memory: one chunk of f32 logits
 * (and of 16-bit dlogits when gradients of 16-bit inputs are asked for), or of 16-bit logits with
 * opts->logits_dtype (the loss and the gradients then those of the rounded logits, the dlogits
 * written in place and dbias summed from them), within opts->chunk_bytes
 * (default 256 MiB; a budget of 128 tokens or more is taken in whole multiples of 128) unless
 * opts->chunk_rows overrides it, plus O(N).
 */
LLMCL_API llmcl_status llmcl_linear_cross_entropy_forward(
    llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
    const llmcl_tensor *bias, const llmcl_tensor *labels, const llmcl_ce_options *opts,
    llmcl_tensor *loss, llmcl_tensor *z_loss, llmcl_tensor *dhidden, llmcl_tensor *dweight,
    llmcl_tensor *dbias);

/*
 * Fully fused linear cross-entropy, forward: the same loss as llmcl_linear_cross_entropy_forward
 * without ever holding all N x V logits, in one of two forms (opts->vocab_chunk):
 *   chunks (the default where the device has tensor cores): the logits of one chunk of classes at
 *     a time, for all rows, folded into a running LSE per row and chunk. On tensor cores with
 *     16-bit hidden and weight the logits product's epilogue reduces each row's logits to LSE
 *     partials, so no logits are stored (extra memory the partials, 12 bytes a row per 64
 *     classes of a chunk); otherwise the chunk's f32 logits come from llmcl_matmul (extra memory
 *     one chunk of them). The chunk width comes from opts->chunk_bytes (default 64 MiB) unless
 *     vocab_chunk gives it;
 *   tiles (elsewhere): every logit computed in a T x T tile of local memory (fp32 FMA); extra
 *     memory O(N x splits), splits being the work-groups per row tile across the vocabulary
 *     (opts->vocab_splits, or chosen from N and the compute units).
 * Writes loss, optionally z_loss, and lse (f32, N elements, required: the backward reads it).
 */
LLMCL_API llmcl_status llmcl_fused_cross_entropy_forward(
    llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
    const llmcl_tensor *bias, const llmcl_tensor *labels, const llmcl_ce_options *opts,
    llmcl_tensor *loss, llmcl_tensor *z_loss, llmcl_tensor *lse);

/*
 * Fully fused backward: recomputes the logits from hidden, weight, bias and the forward's lse to
 * write dhidden (f32 [N, H]), dweight (f32 [V, H]) and dbias (f32 [V]), each optional, in the
 * forward's form: in chunks, per chunk the logits again, the gradient G (in place, or written
 * rounded to hidden's dtype when that is 16-bit), dbias of its classes and the products
 * dhidden += G W[chunk] and dweight[chunk] = G^T hidden (extra memory one chunk of f32 logits
 * and of G; on tensor cores with 16-bit inputs and no dbias the logits product's epilogue writes
 * G itself, and the chunk holds only G); in tiles, one work-group per row tile over every vocabulary tile for dhidden and one
 * per vocabulary tile over every row tile for dweight and dbias (extra memory O(N)).
 * Deterministic, no atomics.
 * grad_loss (f32 on the device: 1 element, or N for reduction none) is the upstream gradient; NULL
 * means 1. opts must match the forward's.
 */
LLMCL_API llmcl_status llmcl_fused_cross_entropy_backward(
    llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
    const llmcl_tensor *bias, const llmcl_tensor *labels, const llmcl_tensor *lse,
    const llmcl_tensor *grad_loss, const llmcl_ce_options *opts, llmcl_tensor *dhidden,
    llmcl_tensor *dweight, llmcl_tensor *dbias);

/* ---------------------------------------------------------------------------------------------- */
/* Distillation losses (distill.cl).                                                              */
/*
 * The generalised Jensen-Shannon divergence between a student's and a teacher's token
 * distributions, Liger Kernel's JSD and fused linear JSD: for row i with student logits s_i and
 * teacher logits t_i over V classes, tau the temperature, X = log_softmax(s_i / tau) and Y =
 * log_softmax(t_i / tau) (q = exp X, p = exp Y), and beta in [0, 1]:
 *   beta = 0:  d_i = KL(p || q) = sum_j p_j (Y_j - X_j)              (forward KL)
 *   beta = 1:  d_i = KL(q || p) = sum_j q_j (X_j - Y_j)              (reverse KL)
 *   else:      d_i = beta KL(p || m) + (1 - beta) KL(q || m),  m = beta p + (1 - beta) q
 * (beta 0.5 is the Jensen-Shannon divergence). Log-probabilities serve as logits (log_softmax
 * leaves them as they are at tau 1), so the log-probability inputs of Liger's JSD give its
 * results. No tau^2 factor is applied: Hinton's scaling is the caller's (grad_scale scales the
 * gradients, the loss is scaled by hand). Rows whose label is ignore_index count for nothing:
 * d_i = 0 and a zero gradient. Reductions: mean over the rows that count (Liger's batchmean; 0
 * when none does), sum, none (d_i per row).
 * Gradients are those of the reduced loss (for none, of sum_i d_i), times grad_scale, with respect
 * to the student's logits (the teacher's get none):
 *   dloss/ds_ij = c / tau (g_ij - q_ij sum_k g_ik),  g = dd_i/dX: beta 0: -p; beta 1: q (X - Y + 1);
 *   else (1 - beta) q (X - log m); c = 1 / count for the mean, else 1
 * (beta 0: c / tau (q_ij - p_ij)). With ce_weight w > 0 (Liger's weight_hard_loss beside a
 * soft loss of weight 1) each row that counts adds w ce_i, ce_i = -log_softmax(s_i)_{y_i} the
 * cross-entropy of the student's logits at temperature 1 against its label, reduced with d_i, and
 * its gradient c w (softmax(s_i)_j - [j == y_i]), times grad_scale: the one pass over the
 * logits serves both losses, where a separate llmcl_cross_entropy_forward would read them, or
 * in the linear form recompute their product, again; the labels are then required, and one
 * outside [0, V) that is not ignore_index fails before anything is written. -inf logits follow
 * PyTorch: a class whose probability is 0 adds nothing to a term it multiplies, so a class -inf
 * on both sides adds nothing; a class with p > 0 where q = 0 makes the forward KL +inf (and q > 0
 * where p = 0 the reverse KL), and 0 < beta < 1 stays finite; a label's -inf logit makes its
 * cross-entropy +inf. A row whose logits are all -inf on either side, and +inf or NaN logits,
 * give NaN. Deterministic: every sum runs in a fixed order.
 */

/* Options of both forms. A zero-initialised struct gives the defaults. */
typedef struct llmcl_distill_options {
    float beta;                   /* in [0, 1]; default 0, the forward KL; 0.5 the JSD */
    float temperature;            /* tau > 0, finite; 0: 1 */
    llmcl_ce_reduction reduction; /* default mean */
    int use_ignore_index;         /* 0: ignore_index is -100; 1: use the field below */
    int64_t ignore_index;         /* labels equal to it mark rows that do not count */
    float grad_scale;             /* the gradients are those of grad_scale x the loss; 0: 1 */
    uint64_t chunk_bytes;         /* linear form: scratch budget per chunk; 0: 2 GiB */
    int64_t chunk_rows;           /* linear form: tokens per chunk; 0: from chunk_bytes */
    int accumulate_weight_grad;   /* linear form: 1 adds dweight to its contents (gradient
                                     accumulation), 0 overwrites it */
    float ce_weight;              /* >= 0: the loss adds ce_weight x the student's cross-entropy
                                     against the labels (above); 0: none */
} llmcl_distill_options;

/*
 * The divergence on materialised logits: student and teacher [..., V] (f32, bf16 or f16, each its
 * own; leading dimensions flattened to the same N rows, unit stride along V), labels optional (I32
 * or I64, N elements, contiguous; NULL: every row counts). Writes loss (f32, 1 element for mean
 * and sum, N for none, contiguous) and optionally dstudent (the gradient in student's dtype: either
 * student itself, same view, for in place, or a tensor of its shape that overlaps no input). Reads
 * both rows once for their LSEs and once more for the divergence, which writes the gradient at
 * beta 0; other betas read them a third time for it. Extra memory O(N).
 */
LLMCL_API llmcl_status llmcl_distill_forward(llmcl_ctx *ctx, const llmcl_tensor *student,
                                             const llmcl_tensor *teacher,
                                             const llmcl_tensor *labels,
                                             const llmcl_distill_options *opts,
                                             llmcl_tensor *loss, llmcl_tensor *dstudent);

/*
 * Linear distillation chunked over tokens (Liger's fused linear JSD): student logits = hidden
 * [N, H] x weight [V, H]^T and teacher logits = teacher_hidden [N, Ht] x teacher_weight [V, Ht]^T
 * (each pair of one float dtype, unit stride along H), then the divergence of
 * llmcl_distill_forward with the gradients computed in the same call: dhidden (f32 [N, H]) and
 * dweight (f32 [V, H]), each optional. Per chunk of tokens, through llmcl_matmul (tensor cores
 * where the device has them): both chunks' f32 logits, the row kernel writing the student's
 * dlogits (in place, or rounded to hidden's dtype when that is 16-bit), then dhidden = G W and
 * dweight (+)= G^T hidden. Extra device memory: two chunks of f32 logits (and one of 16-bit
 * dlogits for 16-bit inputs) within opts->chunk_bytes (default 2 GiB: 1664 tokens at V 128256,
 * whose weight-gradient products run at tensor-core speed where 128 tokens' do not) unless
 * opts->chunk_rows gives the tokens.
 */
LLMCL_API llmcl_status llmcl_linear_distill_forward(
    llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
    const llmcl_tensor *teacher_hidden, const llmcl_tensor *teacher_weight,
    const llmcl_tensor *labels, const llmcl_distill_options *opts, llmcl_tensor *loss,
    llmcl_tensor *dhidden, llmcl_tensor *dweight);

/* ---------------------------------------------------------------------------------------------- */
/* Preference losses (preference.cl).                                                             */
/*
 * Liger Kernel's fused linear preference losses, TRL's DPO, IPO, SimPO, CPO and ORPO, on the
 * output projection without holding the logits. hidden [2B, T, H] stacks B chosen sequences and
 * then their B rejected ones in the same order (pair p is sequences p and B + p); labels [2B, T]
 * holds each position's target, already shifted, and ignore_index where nothing is scored (the
 * prompt, padding). For sequence s, with logp_i = log_softmax(hidden_i weight^T + bias)[labels_i]
 * and n_s its scored positions, pi_s = sum_i logp_i (opts->logps sum) or that / n_s (average; 0
 * when n_s is 0). With c and r a pair's chosen and rejected pi, rc and rr the reference model's
 * (ref_logps), beta, gamma and eps from opts, and ls(z) = -(1 - eps) log sigmoid(z) - eps log
 * sigmoid(-z), a pair's term and the log-probabilities it takes by default are:
 *   DPO    ls(beta ((c - rc) - (r - rr)))                                    sum
 *   IPO    ((c - rc) - (r - rr) - 1 / (2 beta))^2                            average
 *   SimPO  ls(beta (c - r) - gamma)                                          average
 *   CPO    ls(beta (c - r))                                                  sum
 *   ORPO   -beta log sigmoid((c - r) - log(1 - e^c) + log(1 - e^r))          average
 * and loss = (1 / B) sum_p term_p + nll_weight x (sum of -logp_i over the chosen sequences' scored
 * positions) / (their number), the second term 0 when there are none: TRL's rpo_alpha, CPO's
 * alpha and ORPO's supervised term. ORPO's odds are infinite for a sequence whose pi is 0 (every
 * scored token certain); where a factor of 0 multiplies an infinity (sigmoid's tail) the term is 0.
 * Gradients (dhidden f32 of hidden's shape, dweight f32 [V, H], dbias f32 [V], each optional) are
 * those of grad_scale x loss. Deterministic: every sum runs in a fixed order.
 *
 * With gradients the call runs in one of two forms. Chunks of whole pairs (the default, where one
 * pair's logits fit opts->chunk_bytes, default 4 GiB: f32 ones with their 16-bit copy for 16-bit
 * inputs, or 16-bit ones with opts->logits_dtype): the pairs copied with each chosen sequence
 * beside its rejected one, then per chunk the logits product, each position's LSE and -logp_i,
 * the chunk's sequences' and pairs' terms (preference.cl), the dlogits with each position's
 * upstream gradient, and the dhidden and dweight products: three products of the head, as
 * llmcl_linear_cross_entropy_forward's. The fused form (where no pair fits, or opts->vocab_chunk
 * is not 0; f32 whatever opts->logits_dtype says): llmcl_fused_cross_entropy_forward (reduction
 * none), the terms, and llmcl_fused_cross_entropy_backward with each position's upstream
 * gradient, the logits never stored (opts->chunk_bytes and opts->vocab_chunk as in
 * llmcl_ce_options): four products. Without gradients (a reference model's logps) the chunks'
 * forward where opts->logits_dtype is 16-bit and a pair fits, else the fused forward alone.
 * Extra memory beyond the form's scratch: O(2B T), and in chunks a copy of hidden and, with
 * dhidden, an f32 dhidden.
 */

typedef enum llmcl_pref_loss {
    LLMCL_PREF_DPO = 0,
    LLMCL_PREF_IPO,
    LLMCL_PREF_SIMPO,
    LLMCL_PREF_CPO,
    LLMCL_PREF_ORPO,
} llmcl_pref_loss;

typedef enum llmcl_pref_logps {
    LLMCL_PREF_LOGPS_DEFAULT = 0, /* the loss's own (above) */
    LLMCL_PREF_LOGPS_SUM,
    LLMCL_PREF_LOGPS_AVERAGE,
} llmcl_pref_logps;

/* Options. A zero-initialised struct gives DPO at beta 0.1. */
typedef struct llmcl_pref_options {
    llmcl_pref_loss loss;       /* default DPO */
    float beta;                 /* > 0, finite; 0: 0.1 */
    float gamma;                /* SimPO's target margin, finite; the other losses take 0 */
    float label_smoothing;      /* eps in [0, 0.5]: DPO, SimPO and CPO (cDPO); the others 0 */
    float nll_weight;           /* >= 0: the chosen sequences' cross-entropy added; 0: none */
    llmcl_pref_logps logps;     /* sum or average over a sequence's scored positions */
    int use_ignore_index;       /* 0: ignore_index is -100; 1: use the field below */
    int64_t ignore_index;       /* labels equal to it are not scored */
    float grad_scale;           /* the gradients are those of grad_scale x the loss; 0: 1 */
    int accumulate_weight_grad; /* 1 adds dweight and dbias to their contents, 0 overwrites them */
    uint64_t chunk_bytes;       /* chunks of whole pairs' logits (0: 4 GiB), or the fused form's
                                   budget where no pair fits */
    int64_t vocab_chunk;        /* 0: chunks of pairs where one fits; else the fused form, as
                                   llmcl_ce_options' (-1 tiles, > 0 classes a chunk) */
    llmcl_dtype logits_dtype;   /* chunks' logits: LLMCL_F32 (the default) or hidden's 16-bit
                                   dtype, rounded as PyTorch's autocast rounds them, half the
                                   bytes, the dlogits in their place (llmcl_ce_options') */
} llmcl_pref_options;

/*
 * The preference loss above. hidden [2B, T, H] (f32, bf16 or f16, B >= 1, its first two
 * dimensions one run of rows, unit stride along H), weight [V, H] and bias [V] (optional) of
 * hidden's dtype, labels [2B, T] (I32 or I64, contiguous), ref_logps (f32 [2B], contiguous:
 * the reference model's pi, chosen then rejected, in this loss's sum or average) required by DPO
 * and IPO where loss or a gradient is asked for (reference-free: zeros), refused by the others.
 * Writes loss (f32, 1 element), logps (f32 [2B]: each sequence's pi) and the gradients, each
 * optional. A label outside [0, V) that is not ignore_index fails the call before anything is
 * written.
 */
LLMCL_API llmcl_status llmcl_linear_preference_forward(
    llmcl_ctx *ctx, const llmcl_tensor *hidden, const llmcl_tensor *weight,
    const llmcl_tensor *bias, const llmcl_tensor *labels, const llmcl_tensor *ref_logps,
    const llmcl_pref_options *opts, llmcl_tensor *loss, llmcl_tensor *logps,
    llmcl_tensor *dhidden, llmcl_tensor *dweight, llmcl_tensor *dbias);

/* ---------------------------------------------------------------------------------------------- */
/* safetensors files: Hugging Face's checkpoint format, read memory-mapped, written atomically.   */
/*
 * A file is an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" object of
 * strings), then the raw little-endian, row-major data; offsets count from the end of the header.
 *
 * Errors of the reader (except llmcl_safetensors_load) and of the writer go to
 * llmcl_last_error(NULL), naming the file, the tensor and what is wrong: LLMCL_ERROR_IO when the
 * file cannot be opened, mapped, written or renamed, LLMCL_ERROR_BAD_FILE for a malformed file.
 */

#define LLMCL_SAFETENSORS_MAX_DIMS 8

typedef struct llmcl_safetensors llmcl_safetensors;

/*
 * Opens path read-only and maps it (mmap): tensor data is never copied into the reader, so a 16 GB
 * file costs page cache, not twice the RAM. The whole header is validated up front, as the
 * reference implementation does: the header length within the file and at most 100,000,000 bytes;
 * valid UTF-8 JSON whose top level is an object; no duplicate names; every tensor an object with a
 * known dtype (BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16,
 * I32, U32, F32, C64, F64, I64, U64), a shape of at most LLMCL_SAFETENSORS_MAX_DIMS non-negative
 * integers and two integer offsets with begin <= end; end - begin equal to the element count times
 * the element size; and, taken in offset order, the tensors tiling the data section exactly: the
 * first begins at 0, each begins where the previous ends (no hole, no overlap) and the last ends at
 * the end of the file (no truncated data, no trailing bytes). Sizes and offsets are 64-bit.
 * "__metadata__", if present, must be an object of strings. On failure *out is NULL. As with any
 * mapping, another process truncating the file while it is open makes reads of the lost pages fault
 * (SIGBUS); the writer below never does that, it replaces files by renaming.
 */
LLMCL_API llmcl_status llmcl_safetensors_open(const char *path, llmcl_safetensors **out);

/* Unmaps the file and frees the reader; pointers it handed out become invalid. Accepts NULL. */
LLMCL_API void llmcl_safetensors_close(llmcl_safetensors *st);

/* The number of tensors (-1 for NULL). */
LLMCL_API int64_t llmcl_safetensors_count(const llmcl_safetensors *st);

/*
 * The name of tensor i, 0 <= i < count, in the order of their data in the file (the reference
 * implementation's order); NULL when i is out of range. Borrowed until close.
 */
LLMCL_API const char *llmcl_safetensors_name(const llmcl_safetensors *st, int64_t i);

/* One tensor of a file, as its header describes it. */
typedef struct llmcl_safetensors_info {
    llmcl_dtype dtype;      /* LLMCL_DTYPE_COUNT when llmcl has no such dtype (U8, F64, ...) */
    const char *dtype_name; /* as in the file: "BF16", "U8", ...; static */
    int ndim;               /* 0 for a scalar */
    int64_t shape[LLMCL_SAFETENSORS_MAX_DIMS];
    uint64_t bytes;   /* end - begin */
    uint64_t offset;  /* begin, from the start of the data section */
    const void *data; /* the raw bytes, borrowed from the mapping until close */
} llmcl_safetensors_info;

/*
 * Describes the tensor called name, whatever its dtype (raw bytes of any dtype are readable through
 * info.data). A name the file lacks gives LLMCL_ERROR_INVALID_ARGUMENT. Lookup is a linear scan.
 */
LLMCL_API llmcl_status llmcl_safetensors_find(const llmcl_safetensors *st, const char *name,
                                              llmcl_safetensors_info *out);

/* The value of key in the file's "__metadata__", or NULL when absent. Borrowed until close. */
LLMCL_API const char *llmcl_safetensors_metadata(const llmcl_safetensors *st, const char *key);

/*
 * Uploads the tensor called name into dst (on ctx, any strides), which must have exactly its shape
 * (LLMCL_ERROR_SHAPE_MISMATCH naming both). The same dtype copies the bits straight from the
 * mapping; between F32, BF16 and F16 the values are converted on the host with llmcl_f32_to_bf16
 * and its siblings (round-to-nearest-even, as llmcl_cast), in pieces of at most 16 MiB for a
 * contiguous dst (a strided dst takes one host buffer of its size). Integer dtypes load only into
 * their own dtype; dtypes llmcl has no tensor for give LLMCL_ERROR_UNSUPPORTED_DTYPE. Errors go to
 * ctx (llmcl_last_error(ctx)).
 */
LLMCL_API llmcl_status llmcl_safetensors_load(llmcl_ctx *ctx, const llmcl_safetensors *st,
                                              const char *name, llmcl_tensor *dst);

typedef struct llmcl_safetensors_writer llmcl_safetensors_writer;

/* A writer that will create path; the disk is untouched until llmcl_safetensors_writer_finish. */
LLMCL_API llmcl_status llmcl_safetensors_writer_create(const char *path,
                                                       llmcl_safetensors_writer **out);

/* Adds key = value to "__metadata__" (both copied; a key given twice is refused). */
LLMCL_API llmcl_status llmcl_safetensors_writer_metadata(llmcl_safetensors_writer *w,
                                                         const char *key, const char *value);

/*
 * Adds a tensor from host memory: contiguous row-major, ndim in 0..LLMCL_SAFETENSORS_MAX_DIMS, any
 * llmcl dtype. name and shape are copied; data is borrowed until finish (never copied, so a model
 * in host memory is not held twice). Names must be unique and not "__metadata__".
 */
LLMCL_API llmcl_status llmcl_safetensors_writer_add_host(llmcl_safetensors_writer *w,
                                                         const char *name, llmcl_dtype dtype,
                                                         int ndim, const int64_t *shape,
                                                         const void *data);

/*
 * Adds a device tensor (any strides), borrowed until finish, which downloads it then: a contiguous
 * tensor in pieces of at most 16 MiB, a strided one through one host buffer of its size.
 */
LLMCL_API llmcl_status llmcl_safetensors_writer_add_tensor(llmcl_safetensors_writer *w,
                                                           const char *name,
                                                           const llmcl_tensor *t);

/*
 * Writes the file as the reference writer does: tensors ordered by falling dtype alignment, then
 * name; compact JSON with "__metadata__" first; the header padded with spaces to a multiple of 8
 * bytes; then the data. It goes to a temporary file of its own beside path ("<path>.tmp.<pid>.<n>"),
 * is flushed to disk, then renamed onto path, so path holds either the old file or a whole new one,
 * also while other processes or threads write it; on failure the temporary file is removed. A
 * writer finishes once.
 */
LLMCL_API llmcl_status llmcl_safetensors_writer_finish(llmcl_safetensors_writer *w);

/* Frees the writer; an unfinished one leaves no file behind. Accepts NULL. */
LLMCL_API void llmcl_safetensors_writer_destroy(llmcl_safetensors_writer *w);

/* ---------------------------------------------------------------------------------------------- */
/* Embeddings (embedding.cl).                                                                     */

/*
 * out[i, :] = weight[ids[i], :]: ids (I32 or I64, N elements: 1-D with any stride, or contiguous
 * of any shape), weight [V, H] and out [N, H] of one dtype (f32, bf16, f16; unit stride along
 * H). An id outside [0, V) fails the call with LLMCL_ERROR_INVALID_ARGUMENT naming the first
 * such position, checked on the device before out is written (the call then waits for its
 * kernels).
 */
LLMCL_API llmcl_status llmcl_embedding_forward(llmcl_ctx *ctx, const llmcl_tensor *ids,
                                               const llmcl_tensor *weight, llmcl_tensor *out);

/*
 * dweight[v, :] += sum over positions i with ids[i] == v of dout[i, :], in increasing i: the same
 * bits run after run, no atomics. dout [N, H] (f32, bf16 or f16), dweight [V, H] f32 (accumulated
 * into, as a tied output head's gradient is). Rows of ids that do not occur are not touched. Each
 * position scans the ids before it to find whether it is its id's first occurrence, so the cost
 * grows as N^2 / H: fine for the tokens of a micro-batch (tens of thousands). Where the device
 * cuts long loops short (llmcl_device_info.loop_limit) the positions go in blocks (58,000 on
 * llvmpipe), each block's sums added to dweight in turn.
 */
LLMCL_API llmcl_status llmcl_embedding_backward(llmcl_ctx *ctx, const llmcl_tensor *ids,
                                                const llmcl_tensor *dout, llmcl_tensor *dweight);

/* ---------------------------------------------------------------------------------------------- */
/* Optimizer (optim.cl): a multi-tensor AdamW and a deterministic global gradient norm.           */

/*
 * One tensor of an AdamW step. param is what the model computes with (f32, bf16 or f16); master,
 * if not NULL, holds its f32 master weights: the update runs on master and param receives the
 * result rounded to its dtype in the same pass. Without master, an f32 param is updated directly
 * and a 16-bit one with stochastic rounding (llm.c's choice; opts->seed and the step fix the
 * random bits, so results repeat). grad (f32, bf16 or f16), m and v (f32) have param's shape.
 * All tensors contiguous. Tensors that are views of the same buffers (one flat buffer each for
 * params, masters, grads, m and v, as a sharded or flattened parameter set has) are updated in one
 * launch; others in one launch per set of buffers.
 */
typedef struct llmcl_adamw_tensor {
    llmcl_tensor *param;
    llmcl_tensor *master; /* optional */
    const llmcl_tensor *grad;
    llmcl_tensor *m, *v;
    int no_weight_decay; /* 1: skip the decoupled weight decay (norm weights, biases) */
} llmcl_adamw_tensor;

/* AdamW hyperparameters. A zero field takes the default given. */
typedef struct llmcl_adamw_opts {
    float lr;                /* learning rate; 0 is allowed and moves nothing */
    float beta1, beta2;      /* defaults 0.9, 0.999 */
    float eps;               /* default 1e-8 */
    float weight_decay;      /* decoupled: w -= lr * wd * w; default 0 */
    int64_t step;            /* 1-based step for the bias correction; required >= 1 */
    float grad_scale;        /* gradients are multiplied by this first (1 / micro-batches); 0: 1 */
    const llmcl_tensor *grad_norm; /* optional f32 [1] on the device: llmcl_grad_norm (not
                                      squared) of the gradients as given. With max_grad_norm > 0,
                                      gradients are further scaled by min(1, max_grad_norm /
                                      (grad_scale * norm + 1e-6)), torch's clip_grad_norm_ of the
                                      scaled gradients, computed on the device (no host wait) */
    float max_grad_norm;     /* 0: no clipping; > 0 needs grad_norm */
    uint64_t seed;           /* stochastic rounding of 16-bit params without master */
} llmcl_adamw_opts;

/*
 * One AdamW step (PyTorch's torch.optim.AdamW semantics) over count tensors:
 *   g = grad * scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   w = w - lr (wd w) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 * in f32, in the order of torch's single-tensor AdamW (w *= 1 - lr wd first, then m.lerp_,
 * v.mul_().addcmul_(), w.addcdiv_(m, sqrt(v) / sqrt(1 - b2^t) + eps, -lr / (1 - b1^t))). The
 * options are checked as torch checks them: lr, eps, weight_decay >= 0 (eps > 0), betas in [0, 1),
 * step >= 1, grad_scale > 0, all finite. Tensors with no elements are skipped. Stochastic rounding
 * counts elements across the whole call (tensor 0's first, then tensor 1's, ...), so the same
 * tensors give the same bits whether they are views of one buffer or separate buffers.
 * Reads grad (and grad_norm); writes param, master, m, v: none of these may overlap another
 * operand of the call (grads and grad_norm may be shared, being only read). Every argument is
 * validated before anything is enqueued; returns when enqueued.
 */
LLMCL_API llmcl_status llmcl_adamw_step(llmcl_ctx *ctx, const llmcl_adamw_tensor *tensors,
                                        int count, const llmcl_adamw_opts *opts);

/*
 * out[0] = sqrt(sum of squares of every element of every tensor) (squared != 0: the sum of
 * squares itself, for a sum across ranks), in f32 with a fixed order of summation: the same bits
 * run after run, and whether the tensors are views of one buffer or separate buffers (each chunk
 * of a tensor sums into its own partial, in a scratch counted in memory accounting; one
 * work-group then adds the partials in order). grads f32, bf16 or f16, contiguous, possibly
 * empty; out f32 with one element on the device, overlapping no grad. Returns when enqueued.
 */
LLMCL_API llmcl_status llmcl_grad_norm(llmcl_ctx *ctx, const llmcl_tensor *const *grads, int count,
                                       int squared, llmcl_tensor *out);

/*
 * A sum of squares gathered across calls: llmcl_matmul (opts->sumsq) and llmcl_grad_norm_sumsq
 * append partial sums to the accumulator's device storage in call order, and llmcl_grad_norm_sumsq
 * adds them all in that order, so that the same calls give the same bits run after run. The
 * storage grows as calls need it (the partials so far copied in queue order), is counted in memory
 * accounting, and is freed by llmcl_sumsq_destroy. An accumulator belongs to its context.
 */
LLMCL_API llmcl_status llmcl_sumsq_create(llmcl_ctx *ctx, llmcl_sumsq **out);
LLMCL_API void llmcl_sumsq_destroy(llmcl_sumsq *s);
/* Forgets the partials gathered so far (llmcl_grad_norm_sumsq does so after its sum). */
LLMCL_API void llmcl_sumsq_reset(llmcl_sumsq *s);

/*
 * llmcl_grad_norm over the partials s gathered and the count tensors in grads (count 0: s's alone;
 * grads may then be NULL): out[0] = sqrt(sum of squares) (squared != 0: the sum itself). Then s is
 * empty. The order of summation is fixed by the calls' order: a tensor's squares summed here or by
 * the product that wrote it differ only by rounding.
 */
LLMCL_API llmcl_status llmcl_grad_norm_sumsq(llmcl_ctx *ctx, llmcl_sumsq *s,
                                             const llmcl_tensor *const *grads, int count,
                                             int squared, llmcl_tensor *out);

/* ---------------------------------------------------------------------------------------------- */
/* Tuning database.                                                                               */

/*
 * Kernels take their tunables (work-group size, rows per work-group, vector width, tile sizes) from
 * a tuning database keyed device -> kernel -> dtype -> shape class, with a wildcard default at each
 * level; parameters no entry sets keep the launcher's heuristic defaults for the device. The
 * database of a context is, in rising priority: the built-in files (JSON files in data/tuning/,
 * compiled in), then <cache dir>/tuning*.json, then the files or folders in LLMCL_TUNE_DB
 * (':'-separated; "off" turns the whole database off), then llmcl_tune_db_load() and
 * llmcl_tune_override() in call order. The most specific match wins (exact device name, then
 * vendor/platform/type, then any device; then an exact dtype; then the exact shape class, the
 * nearest tuned class within a factor of 4, any class). A bad or foreign
 * file is skipped with a warning (llmcl_tune_db_warnings(); printed only with LLMCL_LOG=1).
 * docs/TUNING.md describes the file format and the llmcl-tune tool that writes it.
 *
 * Kernel keys ("rmsnorm_fwd", "copy", ...) are the LLMCL_KEY_* of llmcl_kernels.h
 * (LLMCL_KERNEL_KEYS lists them all); their tunables are listed in each .cl file's header.
 * A shape class is "p<k>" for the smallest power of two 2^k >= the kernel's size key (for example
 * its row length); where a function takes `shape`, it accepts a class, a size key in decimal
 * ("4096"), or "*" for any class.
 */

/*
 * Writes kernel's parameters for (dtype, shape) into buf as "NAME=VALUE NAME=VALUE ..." sorted by
 * name. When ctx has launched the kernel with that dtype and class, these are the values its last
 * launch built with (heuristic defaults, the database applied, then any clamping of the launcher to
 * the shape) and *launched is 1; otherwise they are only
 * the values the database would set (possibly none: "") and *launched is 0. launched may be NULL.
 * LLMCL_ERROR_INVALID_ARGUMENT when buf (size bytes) is too small.
 */
LLMCL_API llmcl_status llmcl_tune_params_get(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                             const char *shape, char *buf, size_t size,
                                             int *launched);

/*
 * Forces parameters ("NAME=VALUE ...", integers) for kernel at (dtype, shape) on ctx, above every
 * file; the next launches build with them (the tuner uses this to try candidates). A new override
 * for the same key replaces the old; params NULL removes it; kernel NULL removes every override.
 * Names the kernel does not have are ignored. Values are not validated here: a value the kernel
 * rejects makes its launch fail (a build failure or an OpenCL error).
 */
LLMCL_API llmcl_status llmcl_tune_override(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                           const char *shape, const char *params);

/*
 * Merges a tuning file over ctx's database (above everything loaded before it). A malformed file,
 * one in another format or one for another device fails with LLMCL_ERROR_TUNE_DB (LLMCL_ERROR_IO
 * when unreadable) and changes nothing; entries that are individually bad are skipped with a
 * warning while the rest load.
 */
LLMCL_API llmcl_status llmcl_tune_db_load(llmcl_ctx *ctx, const char *path);

/* Empties ctx's database (built-in entries and overrides included) and its warnings: heuristic
 * defaults only until something is loaded again. */
LLMCL_API llmcl_status llmcl_tune_db_clear(llmcl_ctx *ctx);

/* Empties ctx's database as llmcl_tune_db_clear does, then loads what a new context loads: the
 * built-in files, <cache dir>/tuning*.json and LLMCL_TUNE_DB's files, as they are now. */
LLMCL_API llmcl_status llmcl_tune_db_reset(llmcl_ctx *ctx);

/* The warnings about skipped tuning files and entries since ctx was created, one a line, or "". */
LLMCL_API const char *llmcl_tune_db_warnings(const llmcl_ctx *ctx);

/* The shape class ("p<k>") of a size key >= 1, as launchers compute it. */
LLMCL_API llmcl_status llmcl_tune_shape_class(int64_t size_key, char out[16]);

#ifdef __cplusplus
}
#endif
#endif /* LLMCL_H */
