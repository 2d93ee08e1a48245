/* profile.c: timing regions built on OpenCL profiling events of the kernels the context enqueues. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void drop_events(llmcl_ctx *ctx)
{
    for (size_t i = 0; i < ctx->n_events; ++i)
        clReleaseEvent(ctx->events[i]);
    ctx->n_events = 0;
}

llmcl_status llmcl_profile_begin(llmcl_ctx *ctx)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, ctx->queue_profiling, LLMCL_ERROR_UNSUPPORTED,
                   "the context's queue was created without CL_QUEUE_PROFILING_ENABLE");
    drop_events(ctx);
    ctx->profiling = true;
    ctx->profile_names = llmcl__log_level() >= 3;
    return LLMCL_OK;
}

/* One kernel's launches in a region: its name (an index of ctx->event_names), count and time. */
typedef struct kernel_time {
    size_t name;
    uint32_t launches;
    cl_ulong ns;
} kernel_time;

static int by_time_desc(const void *a, const void *b)
{
    const cl_ulong x = ((const kernel_time *)a)->ns, y = ((const kernel_time *)b)->ns;
    return (x < y) - (x > y);
}

/* LLMCL_LOG=3: the region's kernels by name, the most time first (ns[i]: event i's time). */
static void log_kernels(const llmcl_ctx *ctx, const cl_ulong *ns, double kernel_ms)
{
    kernel_time *k = calloc(ctx->n_events, sizeof *k);
    if (!k)
        return;
    size_t n = 0;
    for (size_t i = 0; i < ctx->n_events; ++i) {
        size_t j = 0;
        while (j < n && strcmp(ctx->event_names[k[j].name], ctx->event_names[i]) != 0)
            ++j;
        if (j == n)
            k[n++].name = i;
        k[j].launches++;
        k[j].ns += ns[i];
    }
    qsort(k, n, sizeof *k, by_time_desc);
    llmcl__log("profile region: %zu launch%s, %.4f ms of kernels", ctx->n_events,
               ctx->n_events == 1 ? "" : "es", kernel_ms);
    for (size_t j = 0; j < n; ++j)
        llmcl__log("  %-40s %10.4f ms %6u launch%s", ctx->event_names[k[j].name],
                   (double)k[j].ns * 1e-6, k[j].launches, k[j].launches == 1 ? "" : "es");
    free(k);
}

llmcl_status llmcl_profile_end(llmcl_ctx *ctx, llmcl_profile *out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    LLMCL__REQUIRE(ctx, ctx->profiling, LLMCL_ERROR_INVALID_ARGUMENT,
                   "llmcl_profile_end without llmcl_profile_begin");
    ctx->profiling = false;
    *out = (llmcl_profile){0};
    cl_int err = ctx->n_events ? clWaitForEvents((cl_uint)ctx->n_events, ctx->events) : CL_SUCCESS;
    cl_ulong first = UINT64_MAX, last = 0, total = 0;
    cl_ulong *ns = ctx->profile_names ? calloc(ctx->n_events + 1, sizeof *ns) : NULL;
    for (size_t i = 0; i < ctx->n_events && err == CL_SUCCESS; ++i) {
        cl_ulong start = 0, end = 0;
        err = clGetEventProfilingInfo(ctx->events[i], CL_PROFILING_COMMAND_START, sizeof start,
                                      &start, NULL);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ctx->events[i], CL_PROFILING_COMMAND_END, sizeof end, &end,
                                          NULL);
        total += end - start;
        if (ns)
            ns[i] = end - start;
        first = start < first ? start : first;
        last = end > last ? end : last;
    }
    out->launches = (uint32_t)ctx->n_events;
    if (ns && err == CL_SUCCESS)
        log_kernels(ctx, ns, (double)total * 1e-6);
    free(ns);
    drop_events(ctx);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(ctx, err, "reading profiling events", __FILE__, __LINE__);
    out->kernel_ms = (double)total * 1e-6;
    out->span_ms = out->launches ? (double)(last - first) * 1e-6 : 0.0;
    return LLMCL_OK;
}
