/*
 * ceilings.c: the device's own ceilings, measured in the same run as a benchmark so that kernel
 * figures can be given as a ratio: copy bandwidth (the library's copy kernel), fp32 FMA rate and,
 * on NVIDIA tensor cores, the bf16 mma.sync rate; and the pinned host link each way, for the
 * offload engine. Each is the best of several timed runs after a warm-up.
 */
#include "internal.h"

#define CEILING_RUNS 5
#define FMA_CHAINS 16 /* four float4 chains per work-item */

/* Best kernel time of CEILING_RUNS timed runs of op, after one untimed run. */
static llmcl_status best_of(llmcl_ctx *ctx, llmcl_status (*op)(llmcl_ctx *, void *), void *arg,
                            double *best_ms)
{
    LLMCL__REQUIRE(ctx, ctx->queue_profiling, LLMCL_ERROR_UNSUPPORTED,
                   "measuring a ceiling needs a profiling queue");
    LLMCL__REQUIRE(ctx, !ctx->profiling, LLMCL_ERROR_INVALID_ARGUMENT,
                   "a profile region is open; end it before measuring ceilings");
    LLMCL__TRY(op(ctx, arg));
    *best_ms = 1e30;
    for (int r = 0; r < CEILING_RUNS; ++r) {
        LLMCL__TRY(llmcl_profile_begin(ctx));
        llmcl_status st = op(ctx, arg);
        llmcl_profile prof;
        llmcl_status st2 = llmcl_profile_end(ctx, &prof);
        LLMCL__TRY(st);
        LLMCL__TRY(st2);
        if (prof.kernel_ms < *best_ms)
            *best_ms = prof.kernel_ms;
    }
    return LLMCL_OK;
}

typedef struct copy_arg {
    llmcl_tensor *src, *dst;
} copy_arg;

static llmcl_status copy_op(llmcl_ctx *ctx, void *arg)
{
    copy_arg *c = arg;
    return llmcl_copy(ctx, c->src, c->dst);
}

llmcl_status llmcl_measure_copy_bandwidth(llmcl_ctx *ctx, uint64_t bytes, double *gbs)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, gbs, LLMCL_ERROR_INVALID_ARGUMENT, "gbs must not be NULL");
    LLMCL__REQUIRE(ctx, bytes >= 1024, LLMCL_ERROR_INVALID_ARGUMENT,
                   "copy size %llu is too small to measure bandwidth", (unsigned long long)bytes);
    const int64_t n = (int64_t)(bytes / 8); /* bytes read + written = 2 * 4 * n */
    copy_arg c = {0};
    double ms = 0;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &c.src), done);
    LLMCL__TRY_GOTO(st, llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &c.dst), done);
    LLMCL__TRY_GOTO(st, llmcl_fill(ctx, c.src, 1.5), done);
    LLMCL__TRY_GOTO(st, best_of(ctx, copy_op, &c, &ms), done);
    *gbs = (double)n * 8.0 / (ms * 1e-3) * 1e-9;
done:
    llmcl_tensor_destroy(c.src);
    llmcl_tensor_destroy(c.dst);
    return st;
}

typedef struct rate_arg {
    cl_kernel kernel;
    size_t global, local;
    llmcl_tensor *out;
    int32_t iters;
    bool fma; /* fma_peak takes the chains' coefficients too */
} rate_arg;

static llmcl_status rate_op(llmcl_ctx *ctx, void *arg)
{
    rate_arg *f = arg;
    llmcl__args a = llmcl__args_begin(ctx, f->kernel);
    llmcl__arg(&a, sizeof(cl_mem), &f->out->mem);
    llmcl__arg_i32(&a, f->iters);
    if (f->fma) {
        /* x -> 0.999 x + 0.001 keeps the chains bounded: no value becomes inf or denormal */
        llmcl__arg_f32(&a, 0.999f);
        llmcl__arg_f32(&a, 0.001f);
    }
    return llmcl__launch(&a, 1, &f->global, &f->local);
}

/* Best time of `kernel` over groups work-groups of wg; *ms on success. */
static llmcl_status time_rate(llmcl_ctx *ctx, const char *kernel, size_t wg, size_t groups,
                              int32_t iters, bool fma, double *ms)
{
    llmcl__defines d = {0};
    llmcl__define_int(&d, "WG", (long long)wg);
    rate_arg f = {.local = wg, .global = groups * wg, .iters = iters, .fma = fma};
    LLMCL__TRY(llmcl__kernel(ctx, LLMCL_FAMILY_CEILINGS, &d, kernel, &f.kernel));
    const int64_t n = (int64_t)f.global;
    LLMCL__TRY(llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &f.out));
    llmcl_status st = best_of(ctx, rate_op, &f, ms);
    llmcl_tensor_destroy(f.out);
    return st;
}

llmcl_status llmcl_measure_fma_rate(llmcl_ctx *ctx, double *tflops)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, tflops, LLMCL_ERROR_INVALID_ARGUMENT, "tflops must not be NULL");
    const size_t wg = ctx->info.max_work_group_size < 256 ? ctx->info.max_work_group_size : 256;
    const size_t groups = (size_t)ctx->info.compute_units * (ctx->info.is_gpu ? 16 : 2);
    const int32_t iters = ctx->info.is_gpu ? 8192 : 512;
    double ms = 0;
    LLMCL__TRY(time_rate(ctx, "fma_peak", wg, groups, iters, true, &ms));
    *tflops = (double)(groups * wg) * iters * FMA_CHAINS * 2.0 / (ms * 1e-3) * 1e-12;
    return LLMCL_OK;
}

llmcl_status llmcl_measure_mma_rate(llmcl_ctx *ctx, double *tflops)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, tflops, LLMCL_ERROR_INVALID_ARGUMENT, "tflops must not be NULL");
    LLMCL__REQUIRE(ctx, ctx->info.has_mma, LLMCL_ERROR_UNSUPPORTED,
                   "this device has no tensor cores that llmcl can use (has_mma is 0)");
    const size_t wg = 256, groups = (size_t)ctx->info.compute_units * 8;
    const int32_t iters = 4096;
    double ms = 0;
    LLMCL__TRY(time_rate(ctx, "mma_peak", wg, groups, iters, false, &ms));
    /* 8 chains of 16 x 8 x 16 multiply-adds a warp each trip */
    const double flops = (double)(groups * wg / 32) * iters * 8 * (2.0 * 16 * 8 * 16);
    *tflops = flops / (ms * 1e-3) * 1e-12;
    return LLMCL_OK;
}

/* Best time of CEILING_RUNS copies between dev and the pinned host pointer, after one untimed. */
static llmcl_status time_host_copy(llmcl_ctx *ctx, cl_mem dev, void *host, size_t bytes,
                                   bool to_device, double *best_ms)
{
    *best_ms = 1e30;
    for (int r = 0; r <= CEILING_RUNS; ++r) {
        cl_event ev;
        cl_int err;
        if (to_device)
            err = clEnqueueWriteBuffer(ctx->queue, dev, CL_FALSE, 0, bytes, host, 0, NULL, &ev);
        else
            err = clEnqueueReadBuffer(ctx->queue, dev, CL_FALSE, 0, bytes, host, 0, NULL, &ev);
        if (err != CL_SUCCESS)
            return llmcl__fail_cl(ctx, err, "enqueueing a host copy", __FILE__, __LINE__);
        cl_ulong start = 0, end = 0;
        err = clWaitForEvents(1, &ev);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start,
                                          NULL);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
        clReleaseEvent(ev);
        if (err != CL_SUCCESS)
            return llmcl__fail_cl(ctx, err, "timing a host copy", __FILE__, __LINE__);
        const double ms = (double)(end - start) * 1e-6;
        if (r > 0 && ms < *best_ms)
            *best_ms = ms;
    }
    return LLMCL_OK;
}

llmcl_status llmcl_measure_host_bandwidth(llmcl_ctx *ctx, uint64_t bytes, double *d2h_gbs,
                                          double *h2d_gbs)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, d2h_gbs && h2d_gbs, LLMCL_ERROR_INVALID_ARGUMENT,
                   "d2h_gbs and h2d_gbs must not be NULL");
    LLMCL__REQUIRE(ctx, bytes >= 1024, LLMCL_ERROR_INVALID_ARGUMENT,
                   "copy size %llu is too small to measure bandwidth", (unsigned long long)bytes);
    LLMCL__REQUIRE(ctx, ctx->queue_profiling, LLMCL_ERROR_UNSUPPORTED,
                   "measuring a ceiling needs a profiling queue");
    const int64_t n = (int64_t)(bytes / 4);
    const size_t size = (size_t)n * 4;
    llmcl_tensor *dev = NULL;
    cl_mem pinned = NULL;
    void *host = NULL;
    double d2h_ms = 0, h2d_ms = 0;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &dev), done);
    LLMCL__TRY_GOTO(st, llmcl_fill(ctx, dev, 1.5), done);
    LLMCL__TRY_GOTO(st, llmcl__pinned_alloc(ctx, ctx->queue, size, &pinned, &host), done);
    LLMCL__TRY_GOTO(st, time_host_copy(ctx, dev->mem, host, size, false, &d2h_ms), done);
    LLMCL__TRY_GOTO(st, time_host_copy(ctx, dev->mem, host, size, true, &h2d_ms), done);
    *d2h_gbs = (double)size / (d2h_ms * 1e-3) * 1e-9;
    *h2d_gbs = (double)size / (h2d_ms * 1e-3) * 1e-9;
done:
    if (pinned)
        llmcl__pinned_free(ctx->queue, pinned, host);
    llmcl_tensor_destroy(dev);
    return st;
}
