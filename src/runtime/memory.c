/*
 * memory.c: device allocations with accounting. Every buffer the library allocates goes through
 * llmcl__buffer_alloc, which enforces the context's cap and the device's limits and reports any
 * failure as out of device memory; current and peak bytes are readable through the API. Freed
 * scratch buffers wait in the context's cache for the next op of the same size.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Counts bytes as in use again (a new buffer, or one taken from the cache) and moves the peaks. */
static void count_in_use(llmcl_memory_stats *m, uint64_t bytes)
{
    m->current_bytes += bytes;
    if (m->current_bytes > m->peak_bytes)
        m->peak_bytes = m->current_bytes;
    if (m->current_bytes + m->cached_bytes > m->peak_reserved_bytes)
        m->peak_reserved_bytes = m->current_bytes + m->cached_bytes;
}

llmcl_status llmcl__buffer_alloc(llmcl_ctx *ctx, uint64_t bytes, cl_mem *out)
{
    return llmcl__buffer_alloc_init(ctx, bytes, NULL, out);
}

/* Whether size more bytes fit under the context's limit and the device's memory (the cache is
   emptied first where that makes room). */
static llmcl_status check_room(llmcl_ctx *ctx, uint64_t size)
{
    llmcl_memory_stats *m = &ctx->memory;
    const uint64_t held = m->current_bytes + m->cached_bytes + size;
    if (m->cached_bytes && ((m->limit_bytes && held > m->limit_bytes) ||
                            held > ctx->info.global_mem_bytes))
        llmcl__cache_drain(ctx);
    LLMCL__REQUIRE(ctx, !m->limit_bytes || m->current_bytes + size <= m->limit_bytes,
                   LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                   "allocating %llu bytes would exceed the memory limit (%llu of %llu bytes in use)",
                   (unsigned long long)size, (unsigned long long)m->current_bytes,
                   (unsigned long long)m->limit_bytes);
    LLMCL__REQUIRE(ctx, size <= ctx->info.max_alloc_bytes, LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                   "allocating %llu bytes exceeds the device's largest single allocation (%llu)",
                   (unsigned long long)size, (unsigned long long)ctx->info.max_alloc_bytes);
    LLMCL__REQUIRE(ctx, m->current_bytes + size <= ctx->info.global_mem_bytes,
                   LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                   "allocating %llu bytes exceeds the device's memory (%llu of %llu bytes in use)",
                   (unsigned long long)size, (unsigned long long)m->current_bytes,
                   (unsigned long long)ctx->info.global_mem_bytes);
    return LLMCL_OK;
}

llmcl_status llmcl__buffer_adopt(llmcl_ctx *ctx, uint64_t bytes)
{
    LLMCL__TRY(check_room(ctx, bytes));
    count_in_use(&ctx->memory, bytes);
    return LLMCL_OK;
}

llmcl_status llmcl__buffer_alloc_init(llmcl_ctx *ctx, uint64_t bytes, const void *init, cl_mem *out)
{
    const uint64_t size = bytes ? bytes : 1; /* OpenCL refuses empty buffers */
    llmcl_memory_stats *m = &ctx->memory;
    LLMCL__TRY(check_room(ctx, size));
    cl_int err;
    const cl_mem_flags flags = CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0);
    cl_mem mem = clCreateBuffer(ctx->context, flags, (size_t)size, (void *)init, &err);
    if (err != CL_SUCCESS && m->cached_bytes) {
        llmcl__cache_drain(ctx);
        mem = clCreateBuffer(ctx->context, flags, (size_t)size, (void *)init, &err);
    }
    if (err != CL_SUCCESS)
        return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                           "clCreateBuffer of %llu bytes failed (%s)", (unsigned long long)size,
                           llmcl_status_str(err));
    count_in_use(m, size);
    *out = mem;
    return LLMCL_OK;
}

void llmcl__buffer_free(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes)
{
    clReleaseMemObject(mem);
    ctx->memory.current_bytes -= bytes ? bytes : 1;
}

bool llmcl__cache_take(llmcl_ctx *ctx, uint64_t bytes, cl_mem *mem, uint64_t *got)
{
    const uint64_t need = bytes ? bytes : 1;
    int best = -1;
    for (int i = 0; i < ctx->n_cached; ++i)
        if (ctx->cache[i].bytes >= need && ctx->cache[i].bytes - need <= need / 8 &&
            (best < 0 || ctx->cache[i].bytes < ctx->cache[best].bytes))
            best = i;
    if (best < 0)
        return false;
    *mem = ctx->cache[best].mem;
    *got = ctx->cache[best].bytes;
    ctx->cache[best] = ctx->cache[--ctx->n_cached];
    ctx->memory.cached_bytes -= *got;
    count_in_use(&ctx->memory, *got);
    return true;
}

bool llmcl__cache_put(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes)
{
    if (ctx->n_cached == LLMCL__CACHE_SLOTS)
        return false;
    const uint64_t held = bytes ? bytes : 1;
    ctx->cache[ctx->n_cached].mem = mem;
    ctx->cache[ctx->n_cached++].bytes = held;
    ctx->memory.current_bytes -= held;
    ctx->memory.cached_bytes += held;
    return true;
}

void llmcl__cache_drain(llmcl_ctx *ctx)
{
    for (int i = 0; i < ctx->n_cached; ++i)
        clReleaseMemObject(ctx->cache[i].mem);
    ctx->n_cached = 0;
    ctx->memory.cached_bytes = 0;
}

llmcl_status llmcl_memory_release_cached(llmcl_ctx *ctx)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    llmcl__cache_drain(ctx);
    return LLMCL_OK;
}

llmcl_status llmcl_memory_stats_get(const llmcl_ctx *ctx, llmcl_memory_stats *out)
{
    LLMCL__REQUIRE(NULL, ctx && out, LLMCL_ERROR_INVALID_ARGUMENT, "ctx and out must not be NULL");
    *out = ctx->memory;
    return LLMCL_OK;
}

llmcl_status llmcl_memory_reset_peak(llmcl_ctx *ctx)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    ctx->memory.peak_bytes = ctx->memory.current_bytes;
    ctx->memory.peak_reserved_bytes = ctx->memory.current_bytes + ctx->memory.cached_bytes;
    return LLMCL_OK;
}

llmcl_status llmcl_memory_set_limit(llmcl_ctx *ctx, uint64_t bytes)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    llmcl__cache_drain(ctx); /* the cap then holds from the next allocation on */
    ctx->memory.limit_bytes = bytes;
    return LLMCL_OK;
}
