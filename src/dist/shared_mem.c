/*
 * shared_mem.c: ranges of CUDA device memory imported into OpenCL piece by piece (shared_mem.h).
 */
#undef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared_mem.h"

static bool enter(const shared_api *api)
{
    return api->cu->ctx_push(api->context) == CUDA_OK;
}

static void leave(const shared_api *api)
{
    CUcontext prev;
    api->cu->ctx_pop(&prev);
}

/* Reserves the range's addresses and lays out its pieces (no memory yet). */
static llmcl_status plan(llmcl_ctx *ctx, const shared_api *api, size_t bytes, shared_range *r)
{
    memset(r, 0, sizeof *r);
    const size_t unit = api->granularity;
    r->bytes = (bytes + unit - 1) / unit * unit;
    const int n = (int)((r->bytes + SHARED_PIECE_BYTES - 1) / SHARED_PIECE_BYTES);
    r->piece = calloc((size_t)n, sizeof *r->piece);
    /* n only once the table exists: shared_range_destroy walks n pieces */
    LLMCL__REQUIRE(ctx, r->piece, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "%d pieces", n);
    r->n = n;
    for (int i = 0; i < r->n; ++i) {
        shared_piece *p = &r->piece[i];
        p->at = (size_t)i * SHARED_PIECE_BYTES;
        p->bytes = r->bytes - p->at < SHARED_PIECE_BYTES ? r->bytes - p->at : SHARED_PIECE_BYTES;
    }
    LLMCL__REQUIRE(ctx, enter(api), LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
    const CUresult res = api->cu->mem_reserve(&r->base, r->bytes, unit, 0, 0);
    leave(api);
    if (res == CUDA_OK)
        return LLMCL_OK;
    r->base = 0;
    return LLMCL__FAIL(ctx, LLMCL_ERROR_NCCL, "cuMemAddressReserve of %zu bytes: %s", r->bytes,
                       llmcl__cuda_error(api->cu, res));
}

/* The piece's memory, mapped at its place in the range, readable and writable there, and its
   descriptor in *fd (-1 if none). */
static CUresult map_piece(const shared_api *api, const shared_range *r, shared_piece *p, int *fd,
                          const char **what)
{
    const llmcl__cuda *cu = api->cu;
    const cu_mem_allocation_prop prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {CU_MEM_LOCATION_TYPE_DEVICE, api->device},
    };
    const cu_mem_access_desc access = {{CU_MEM_LOCATION_TYPE_DEVICE, api->device},
                                       CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h;
    *what = "cuMemCreate";
    CUresult res = cu->mem_create(&h, p->bytes, &prop, 0);
    if (res != CUDA_OK)
        return res;
    *what = "cuMemExportToShareableHandle";
    res = cu->mem_export(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (res == CUDA_OK) {
        *what = "cuMemMap";
        res = cu->mem_map(r->base + p->at, p->bytes, 0, h, 0);
        p->mapped = res == CUDA_OK;
    }
    if (res == CUDA_OK) {
        *what = "cuMemSetAccess";
        res = cu->mem_set_access(r->base + p->at, p->bytes, &access, 1);
    }
    /* The mapping holds the memory from here on. */
    cu->mem_release(h);
    return res;
}

/* Imports the descriptor as the piece's OpenCL buffer, acquired, counted and zeroed. On success
   the descriptor is OpenCL's, as an import's is in CUDA and Vulkan. */
static llmcl_status import_piece(llmcl_ctx *ctx, const shared_api *api, shared_piece *p, int fd)
{
    const cl_mem_properties props[] = {CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR,
                                       (cl_mem_properties)fd, 0};
    cl_int err;
    cl_mem mem = api->create_buffer(ctx->context, props, CL_MEM_READ_WRITE, p->bytes, NULL, &err);
    if (err != CL_SUCCESS || !mem) {
        close(fd);
        return llmcl__fail_cl(ctx, err, "clCreateBufferWithProperties (importing CUDA memory)",
                              __FILE__, __LINE__);
    }
    err = api->acquire(ctx->queue, 1, &mem, 0, NULL, NULL);
    const llmcl_status st = err == CL_SUCCESS
                                ? llmcl__buffer_adopt(ctx, p->bytes)
                                : llmcl__fail_cl(ctx, err, "clEnqueueAcquireExternalMemObjectsKHR",
                                                 __FILE__, __LINE__);
    if (st != LLMCL_OK) {
        clReleaseMemObject(mem);
        return st;
    }
    p->mem = mem;
    const uint32_t zero = 0;
    LLMCL__CL(ctx, clEnqueueFillBuffer(ctx->queue, mem, &zero, sizeof zero, 0, p->bytes, 0, NULL,
                                       NULL));
    return LLMCL_OK;
}

static llmcl_status add_piece(llmcl_ctx *ctx, const shared_api *api, const shared_range *r,
                              shared_piece *p)
{
    LLMCL__REQUIRE(ctx, enter(api), LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
    int fd = -1;
    const char *what = "";
    const CUresult res = map_piece(api, r, p, &fd, &what);
    leave(api);
    if (res != CUDA_OK) {
        if (fd >= 0)
            close(fd);
        return LLMCL__FAIL(ctx, res == 2 ? LLMCL_ERROR_OUT_OF_DEVICE_MEMORY : LLMCL_ERROR_NCCL,
                           "%s of %zu bytes for NCCL: %s", what, p->bytes,
                           llmcl__cuda_error(api->cu, res));
    }
    return import_piece(ctx, api, p, fd);
}

llmcl_status shared_range_create(llmcl_ctx *ctx, const shared_api *api, size_t bytes,
                                 shared_range *out)
{
    llmcl_status st = plan(ctx, api, bytes, out);
    for (int i = 0; st == LLMCL_OK && i < out->n; ++i)
        st = add_piece(ctx, api, out, &out->piece[i]);
    if (st != LLMCL_OK)
        shared_range_destroy(ctx, api, out);
    return st;
}

void shared_range_destroy(llmcl_ctx *ctx, const shared_api *api, shared_range *r)
{
    for (int i = 0; i < r->n; ++i)
        if (r->piece[i].mem)
            api->release(ctx->queue, 1, &r->piece[i].mem, 0, NULL, NULL);
    clFinish(ctx->queue);
    for (int i = 0; i < r->n; ++i)
        if (r->piece[i].mem)
            llmcl__buffer_free(ctx, r->piece[i].mem, r->piece[i].bytes);
    if (r->base && enter(api)) {
        for (int i = 0; i < r->n; ++i)
            if (r->piece[i].mapped)
                api->cu->mem_unmap(r->base + r->piece[i].at, r->piece[i].bytes);
        api->cu->mem_free_address(r->base, r->bytes);
        leave(api);
    }
    free(r->piece);
    memset(r, 0, sizeof *r);
}

llmcl_status shared_range_copy(llmcl_ctx *ctx, const shared_range *r, size_t at, cl_mem buf,
                               size_t buf_off, size_t len, bool into_range)
{
    for (int i = 0; i < r->n && len > 0; ++i) {
        const shared_piece *p = &r->piece[i];
        if (at >= p->at + p->bytes)
            continue;
        const size_t in = at - p->at, n = len < p->bytes - in ? len : p->bytes - in;
        LLMCL__CL(ctx, into_range ? clEnqueueCopyBuffer(ctx->queue, buf, p->mem, buf_off, in, n,
                                                        0, NULL, NULL)
                                  : clEnqueueCopyBuffer(ctx->queue, p->mem, buf, in, buf_off, n,
                                                        0, NULL, NULL));
        at += n;
        buf_off += n;
        len -= n;
    }
    LLMCL__REQUIRE(ctx, len == 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "internal: a copy past the end of a shared range");
    return LLMCL_OK;
}
