/* profile.c: timing regions built on OpenCL profiling events of the kernels the context enqueues. */
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
    return LLMCL_OK;
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
    for (size_t i = 0; i < ctx->n_events && err == CL_SUCCESS; ++i) {
        cl_ulong start = 0, end = 0;
        err = clGetEventProfilingInfo(ctx->events[i], CL_PROFILING_COMMAND_START, sizeof start,
                                      &start, NULL);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ctx->events[i], CL_PROFILING_COMMAND_END, sizeof end, &end,
                                          NULL);
        total += end - start;
        first = start < first ? start : first;
        last = end > last ? end : last;
    }
    out->launches = (uint32_t)ctx->n_events;
    drop_events(ctx);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(ctx, err, "reading profiling events", __FILE__, __LINE__);
    out->kernel_ms = (double)total * 1e-6;
    out->span_ms = out->launches ? (double)(last - first) * 1e-6 : 0.0;
    return LLMCL_OK;
}
