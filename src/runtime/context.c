/*
 * context.c: creating and destroying contexts (own OpenCL objects or an application's), the queue,
 * the cache folder and memory limit taken from the environment, and the context's accessors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tune_db.h"

/* The cache folder from the environment; one too long for cache_dir fails rather than being cut
   to another folder's name. */
static llmcl_status choose_cache_dir(llmcl_ctx *ctx)
{
    const char *dir = llmcl__getenv("LLMCL_CACHE_DIR");
    const char *xdg = llmcl__getenv("XDG_CACHE_HOME");
    const char *home = llmcl__getenv("HOME");
    int n = 0;
    if (dir && strcmp(dir, "off") == 0)
        ctx->cache_dir[0] = '\0';
    else if (dir)
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", dir);
    else if (xdg)
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/llmcl", xdg);
    else if (home)
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/.cache/llmcl", home);
    else
        ctx->cache_dir[0] = '\0';
    LLMCL__REQUIRE(ctx, n < (int)sizeof ctx->cache_dir, LLMCL_ERROR_INVALID_ARGUMENT,
                   "the cache folder from %s is %d bytes long; at most %d",
                   dir ? "LLMCL_CACHE_DIR" : xdg ? "XDG_CACHE_HOME" : "HOME", n,
                   (int)sizeof ctx->cache_dir - 1);
    int64_t binaries = 1;
    LLMCL__TRY(llmcl__env_int(ctx, "LLMCL_CACHE_BINARIES", 0, 1, false, "0 or 1", &binaries,
                              NULL));
    ctx->cache_binaries = binaries == 1;
    return LLMCL_OK;
}

static llmcl_status ctx_init(llmcl_ctx *ctx, cl_platform_id platform)
{
    cl_command_queue_properties props = 0;
    LLMCL__CL(ctx, clGetCommandQueueInfo(ctx->queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL));
    ctx->queue_profiling = (props & CL_QUEUE_PROFILING_ENABLE) != 0;
    LLMCL__TRY(choose_cache_dir(ctx));
    int64_t limit = 0; /* none */
    LLMCL__TRY(llmcl__env_int(ctx, "LLMCL_MEMORY_LIMIT", 0, INT64_MAX, true,
                              "a byte count such as 1073741824 or 1G", &limit, NULL));
    ctx->memory.limit_bytes = (uint64_t)limit;
    LLMCL__TRY(llmcl__device_probe(ctx, platform, ctx->device, &ctx->info));
    if (ctx->info.has_wgmma)
        ctx->tma = llmcl__tma_open(ctx->device);
    ctx->info.has_tma = ctx->tma != NULL;
    ctx->tune_db = llmcl__tune_db_create(ctx);
    llmcl__log("context on '%s' (%s), cache %s", ctx->info.name, ctx->info.platform_name,
               ctx->cache_dir[0] ? ctx->cache_dir : "off");
    return LLMCL_OK;
}

/* Context creation failures are reported on the thread's slot: copy the context's message there. */
static llmcl_status fail_create(llmcl_ctx *ctx, llmcl_status st)
{
    LLMCL__FAIL(NULL, st, "context creation failed: %s", ctx->last_error);
    llmcl_ctx_destroy(ctx);
    return st;
}

/* A context of the library's own on device. */
static llmcl_status ctx_create_on(cl_platform_id platform, cl_device_id device, llmcl_ctx **out)
{
    llmcl_ctx *ctx = calloc(1, sizeof *ctx);
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "context");
    cl_int err;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    ctx->device = device;
    clRetainDevice(device);
    ctx->context = clCreateContext(props, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return fail_create(ctx, llmcl__fail_cl(ctx, err, "clCreateContext", __FILE__, __LINE__));
    ctx->queue = clCreateCommandQueue(ctx->context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS)
        return fail_create(ctx, llmcl__fail_cl(ctx, err, "clCreateCommandQueue", __FILE__, __LINE__));
    llmcl_status st = ctx_init(ctx, platform);
    if (st != LLMCL_OK)
        return fail_create(ctx, st);
    *out = ctx;
    return LLMCL_OK;
}

llmcl_status llmcl_ctx_create(llmcl_ctx **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    cl_platform_id platform;
    cl_device_id device;
    LLMCL__TRY(llmcl_device_select(&platform, &device));
    return ctx_create_on(platform, device, out);
}

llmcl_status llmcl_ctx_create_local(int index, llmcl_ctx **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    cl_platform_id platform;
    cl_device_id device;
    LLMCL__TRY(llmcl_device_select_local(index, &platform, &device));
    return ctx_create_on(platform, device, out);
}

llmcl_status llmcl_ctx_create_from_cl(cl_context context, cl_device_id device,
                                      cl_command_queue queue, llmcl_ctx **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    LLMCL__REQUIRE(NULL, context && device && queue, LLMCL_ERROR_INVALID_ARGUMENT,
                   "context, device and queue must all be given");
    cl_context qctx;
    cl_device_id qdev;
    LLMCL__CL(NULL, clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL));
    LLMCL__CL(NULL, clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL));
    LLMCL__REQUIRE(NULL, qctx == context && qdev == device, LLMCL_ERROR_DEVICE_MISMATCH,
                   "the queue belongs to another context or device");
    cl_command_queue_properties props = 0;
    LLMCL__CL(NULL, clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL));
    LLMCL__REQUIRE(NULL, !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "the queue must run in order: an op's kernels follow one another in it");
    cl_platform_id platform;
    LLMCL__CL(NULL, clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL));
    llmcl_ctx *ctx = calloc(1, sizeof *ctx);
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "context");
    ctx->context = context;
    ctx->device = device;
    ctx->queue = queue;
    clRetainContext(context);
    clRetainDevice(device);
    clRetainCommandQueue(queue);
    llmcl_status st = ctx_init(ctx, platform);
    if (st != LLMCL_OK)
        return fail_create(ctx, st);
    *out = ctx;
    return LLMCL_OK;
}

void llmcl_ctx_destroy(llmcl_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->queue)
        clFinish(ctx->queue);
    llmcl__cache_drain(ctx);
    for (size_t i = 0; i < ctx->n_events; ++i)
        clReleaseEvent(ctx->events[i]);
    free(ctx->events);
    free(ctx->event_names);
    llmcl__programs_release(ctx);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->context)
        clReleaseContext(ctx->context);
    if (ctx->device)
        clReleaseDevice(ctx->device);
    free(ctx->build_log);
    llmcl__tune_db_destroy(ctx->tune_db);
    llmcl__tma_close(ctx->tma);
    free(ctx);
}

llmcl_status llmcl_ctx_finish(llmcl_ctx *ctx)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__CL(ctx, clFinish(ctx->queue));
    return LLMCL_OK;
}

const char *llmcl_build_log(const llmcl_ctx *ctx)
{
    return (ctx && ctx->build_log) ? ctx->build_log : "";
}

const llmcl_device_info *llmcl_ctx_device_info(const llmcl_ctx *ctx) { return ctx ? &ctx->info : NULL; }
cl_context llmcl_ctx_cl_context(const llmcl_ctx *ctx) { return ctx ? ctx->context : NULL; }
cl_device_id llmcl_ctx_cl_device(const llmcl_ctx *ctx) { return ctx ? ctx->device : NULL; }
cl_command_queue llmcl_ctx_cl_queue(const llmcl_ctx *ctx) { return ctx ? ctx->queue : NULL; }
const char *llmcl_cache_dir(const llmcl_ctx *ctx) { return ctx ? ctx->cache_dir : ""; }

llmcl_status llmcl_cache_stats_get(const llmcl_ctx *ctx, llmcl_cache_stats *out)
{
    LLMCL__REQUIRE(NULL, ctx && out, LLMCL_ERROR_INVALID_ARGUMENT, "ctx and out must not be NULL");
    *out = ctx->cache_stats;
    return LLMCL_OK;
}
