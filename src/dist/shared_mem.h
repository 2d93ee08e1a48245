/*
 * shared_mem.h: device memory that CUDA allocates and NVIDIA's OpenCL imports, so that OpenCL
 * kernels and copies and CUDA's libraries (NCCL) work on the same bytes. A range is one contiguous
 * span of CUDA virtual addresses, mapped from pieces of at most SHARED_PIECE_BYTES each: every
 * piece is exported as an opaque file descriptor and imported as an OpenCL buffer of its own
 * (cl_khr_external_memory_opaque_fd), which the context's queue acquires for the range's life.
 * CUDA sees one buffer, OpenCL as many as there are pieces.
 */
#ifndef LLMCL_DIST_SHARED_MEM_H
#define LLMCL_DIST_SHARED_MEM_H

/* OpenCL 3.0's declarations: a file including this defines CL_TARGET_OPENCL_VERSION 300 first. */
#include <CL/cl_ext.h>

#include "../runtime/cuda_driver.h"

/*
 * The largest piece: NVIDIA's OpenCL (driver 580.159, H200) imports CUDA allocations of 256 MiB and
 * faults (SIGSEGV inside clCreateBufferWithProperties) on 512 MiB and more.
 */
#define SHARED_PIECE_BYTES ((size_t)256 << 20)

/* What an import needs: the driver, the GPU and its context, and OpenCL's entry points. */
typedef struct shared_api {
    const llmcl__cuda *cu;
    CUcontext context; /* pushed around the driver calls */
    int device;
    size_t granularity;
    clEnqueueAcquireExternalMemObjectsKHR_fn acquire;
    clEnqueueReleaseExternalMemObjectsKHR_fn release;
    cl_mem (*create_buffer)(cl_context, const cl_mem_properties *, cl_mem_flags, size_t, void *,
                            cl_int *);
} shared_api;

typedef struct shared_piece {
    cl_mem mem;       /* NULL until imported */
    size_t at, bytes; /* its bytes in the range */
    bool mapped;
    void *window;     /* NCCL's registration of the piece (transport_nccl.c), or NULL */
} shared_piece;

typedef struct shared_range {
    CUdeviceptr base;
    size_t bytes;
    int n;
    shared_piece *piece;
} shared_range;

/*
 * A zeroed range of at least bytes (rounded up to the granularity), counted in ctx's memory
 * statistics. Where CUDA or the import fails, nothing is left behind.
 */
llmcl_status shared_range_create(llmcl_ctx *ctx, const shared_api *api, size_t bytes,
                                 shared_range *out);

/* Gives the range back: the caller has made sure that nothing uses it any more. */
void shared_range_destroy(llmcl_ctx *ctx, const shared_api *api, shared_range *r);

/*
 * Enqueues on ctx's queue a copy of len bytes between byte at of the range and byte buf_off of
 * buf: into the range (into_range) or out of it, a copy a piece it touches.
 */
llmcl_status shared_range_copy(llmcl_ctx *ctx, const shared_range *r, size_t at, cl_mem buf,
                               size_t buf_off, size_t len, bool into_range);

#endif /* LLMCL_DIST_SHARED_MEM_H */
