/*
 * bench_offload.c: llmcl-bench rows for the host offload engine. The host link each way (the
 * pinned ceiling measured at start), then one training step of L checkpointed layers shaped like
 * Llama-3-8B's MLP at 8192 tokens (RMSNorm, x W1^T, then W2^T back to the hidden size; bf16),
 * run twice: keeping every layer input on the device, and offloading them (forward: save each
 * input, fence before its buffer is overwritten; backward: restore in reverse with prefetch
 * distance 2, recomputing the layer from its input). Rows: save and restore throughput against the
 * host link, and the offloaded step against the on-device step (wall clock to the end of the
 * step's work); a line reports the overhead, the stall and the device memory saved. The check
 * compares the weight gradients of the two steps bit for bit. CPU devices run a tiny version.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "util/util.h"

#define MAX_LAYERS 32
#define PREFETCH 2

typedef struct ob {
    int64_t T, H, F;
    int L;
    llmcl_tensor *x0, *dtop;               /* the step's input, the gradient arriving at the top */
    llmcl_tensor *wn, *w1, *w2;            /* shared by every layer: only time and memory matter */
    llmcl_tensor *dwn, *dw1, *dw2;
    llmcl_tensor *y, *rstd, *a, *da, *dy;  /* per-layer temporaries */
    llmcl_tensor *dbuf[2];                 /* gradient flowing down, ping-pong */
    llmcl_offload *off;
} ob;

static const llmcl_rmsnorm_options norm_opt = {.eps = 1e-6f};

static llmcl_status layer_forward(llmcl_ctx *ctx, ob *b, const llmcl_tensor *x, llmcl_tensor *out)
{
    const llmcl_matmul_opts wt = {.trans_b = 1};
    TRY(llmcl_rmsnorm_forward(ctx, x, b->wn, b->y, b->rstd, &norm_opt));
    TRY(llmcl_matmul(ctx, 1.0f, b->y, b->w1, 0.0f, b->a, &wt));
    return out ? llmcl_matmul(ctx, 1.0f, b->a, b->w2, 0.0f, out, &wt) : LLMCL_OK;
}

/* Recomputes the layer from x, then its backward: dx from dout, dw1 and dw2 accumulated. */
static llmcl_status layer_backward(llmcl_ctx *ctx, ob *b, const llmcl_tensor *x,
                                   const llmcl_tensor *dout, llmcl_tensor *dx)
{
    const llmcl_matmul_opts ta = {.trans_a = 1};
    TRY(layer_forward(ctx, b, x, NULL));
    TRY(llmcl_matmul(ctx, 1.0f, dout, b->w2, 0.0f, b->da, NULL));
    TRY(llmcl_matmul(ctx, 1.0f, dout, b->a, 1.0f, b->dw2, &ta));
    TRY(llmcl_matmul(ctx, 1.0f, b->da, b->w1, 0.0f, b->dy, NULL));
    TRY(llmcl_matmul(ctx, 1.0f, b->da, b->y, 1.0f, b->dw1, &ta));
    return llmcl_rmsnorm_backward(ctx, b->dy, x, b->wn, b->rstd, dx, b->dwn, &norm_opt);
}

static const llmcl_tensor *dout_of(const ob *b, int i)
{
    return i == b->L - 1 ? b->dtop : b->dbuf[(i + 1) % 2];
}

static llmcl_status new_activation(llmcl_ctx *ctx, const ob *b, llmcl_tensor **out)
{
    const int64_t shape[] = {b->T, b->H};
    return llmcl_tensor_create(ctx, LLMCL_BF16, 2, shape, out);
}

static llmcl_status zero_grads(llmcl_ctx *ctx, ob *b)
{
    TRY(llmcl_fill(ctx, b->dw1, 0.0));
    return llmcl_fill(ctx, b->dw2, 0.0);
}

/* The step with every layer input kept on the device. */
static llmcl_status step_on_device(llmcl_ctx *ctx, void *arg)
{
    ob *b = arg;
    llmcl_tensor *x[MAX_LAYERS + 1] = {b->x0};
    llmcl_status st;
    TRY_GOTO(st, zero_grads(ctx, b), done);
    for (int i = 0; i < b->L; ++i) {
        TRY_GOTO(st, new_activation(ctx, b, &x[i + 1]), done);
        TRY_GOTO(st, layer_forward(ctx, b, x[i], x[i + 1]), done);
    }
    for (int i = b->L - 1; i >= 0; --i)
        TRY_GOTO(st, layer_backward(ctx, b, x[i], dout_of(b, i), b->dbuf[i % 2]), done);
done:
    for (int i = 1; i <= b->L; ++i)
        llmcl_tensor_destroy(x[i]);
    return st;
}

static llmcl_status forward_offloaded(llmcl_ctx *ctx, ob *b, llmcl_offload_handle *h)
{
    llmcl_tensor *buf[2] = {NULL, NULL};
    const llmcl_tensor *x = b->x0;
    llmcl_status st;
    TRY_GOTO(st, new_activation(ctx, b, &buf[0]), done);
    TRY_GOTO(st, new_activation(ctx, b, &buf[1]), done);
    for (int i = 0; i < b->L; ++i) {
        TRY_GOTO(st, llmcl_offload_save(b->off, x, &h[i]), done);
        llmcl_tensor *out = buf[(i + 1) % 2];
        if (i >= 2) /* out held layer i-1's input, which may still be copying */
            TRY_GOTO(st, llmcl_offload_fence(b->off, h[i - 1]), done);
        TRY_GOTO(st, layer_forward(ctx, b, x, out), done);
        x = out;
    }
done:
    llmcl_tensor_destroy(buf[0]);
    llmcl_tensor_destroy(buf[1]);
    return st;
}

static llmcl_status backward_offloaded(llmcl_ctx *ctx, ob *b, llmcl_offload_handle *h)
{
    for (int i = b->L - 1; i >= b->L - PREFETCH && i >= 0; --i)
        TRY(llmcl_offload_prefetch(b->off, h[i]));
    for (int i = b->L - 1; i >= 0; --i) {
        if (i - PREFETCH >= 0)
            TRY(llmcl_offload_prefetch(b->off, h[i - PREFETCH]));
        llmcl_tensor *x;
        TRY(llmcl_offload_restore(b->off, h[i], &x));
        const llmcl_status st = layer_backward(ctx, b, x, dout_of(b, i), b->dbuf[i % 2]);
        llmcl_tensor_destroy(x);
        TRY(st);
        TRY(llmcl_offload_release(b->off, h[i]));
    }
    return LLMCL_OK;
}

/* The step with every layer input offloaded to the pinned pool. */
static llmcl_status step_offloaded(llmcl_ctx *ctx, void *arg)
{
    ob *b = arg;
    llmcl_offload_handle h[MAX_LAYERS] = {{0}};
    llmcl_status st = zero_grads(ctx, b);
    if (st == LLMCL_OK)
        st = forward_offloaded(ctx, b, h);
    if (st == LLMCL_OK)
        st = backward_offloaded(ctx, b, h);
    for (int i = 0; i < b->L && st != LLMCL_OK; ++i)
        llmcl_offload_release(b->off, h[i]); /* refuses the handles already released */
    return st;
}

static bool setup(bench_env *env, ob *b)
{
    llmcl_ctx *ctx = env->ctx;
    const int64_t th[] = {b->T, b->H}, tf[] = {b->T, b->F};
    const int64_t fh[] = {b->F, b->H}, hf[] = {b->H, b->F};
    llmcl_tensor **bf16_th[] = {&b->x0, &b->dtop, &b->y, &b->dy, &b->dbuf[0], &b->dbuf[1]};
    for (size_t i = 0; i < sizeof bf16_th / sizeof bf16_th[0]; ++i)
        if (llmcl_tensor_create(ctx, LLMCL_BF16, 2, th, bf16_th[i]) != LLMCL_OK)
            return bench_fail(env, "offload setup", LLMCL_OK);
    llmcl_status st = llmcl_tensor_create(ctx, LLMCL_BF16, 2, tf, &b->a);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 2, tf, &b->da);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 2, fh, &b->w1);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 2, fh, &b->dw1);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 2, hf, &b->w2);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 2, hf, &b->dw2);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 1, &b->H, &b->wn);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_BF16, 1, &b->H, &b->dwn);
    st = st ? st : llmcl_tensor_create(ctx, LLMCL_F32, 1, &b->T, &b->rstd);
    st = st ? st : bench_upload_random(b->x0, 1);
    st = st ? st : bench_upload_random(b->dtop, 2);
    st = st ? st : bench_upload_random(b->w1, 3);
    st = st ? st : bench_upload_random(b->w2, 4);
    st = st ? st : bench_upload_random(b->wn, 5);
    const uint64_t x_bytes = (uint64_t)(b->T * b->H) * 2;
    st = st ? st : llmcl_offload_create(ctx, (uint64_t)b->L * x_bytes, &b->off);
    return st == LLMCL_OK || bench_fail(env, "offload setup", st);
}

static void teardown(ob *b)
{
    llmcl_offload_destroy(b->off);
    llmcl_tensor *all[] = {b->x0, b->dtop, b->wn, b->w1, b->w2, b->dwn, b->dw1, b->dw2, b->y,
                           b->rstd, b->a, b->da, b->dy, b->dbuf[0], b->dbuf[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        llmcl_tensor_destroy(all[i]);
}

/* The weight gradients after a step, downloaded. */
static unsigned char *grads(const ob *b, size_t *bytes)
{
    const size_t n1 = (size_t)(b->F * b->H) * 2;
    unsigned char *h = malloc(2 * n1);
    if (h && (llmcl_tensor_download(b->dw1, h, n1) != LLMCL_OK ||
              llmcl_tensor_download(b->dw2, h + n1, n1) != LLMCL_OK)) {
        free(h);
        return NULL;
    }
    *bytes = 2 * n1;
    return h;
}

/* Adds row r with its labels. */
static void add_row(bench_env *env, const char *kernel, const char *dir, const char *dtype,
                    const char *shape, bench_row r)
{
    snprintf(r.kernel, sizeof r.kernel, "%s", kernel);
    snprintf(r.direction, sizeof r.direction, "%s", dir);
    snprintf(r.dtype, sizeof r.dtype, "%s", dtype);
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    bench_add(env, &r);
}

/* The on-device and offloaded steps, their comparison rows and the summary line. */
static void bench_steps(bench_env *env, ob *b)
{
    size_t gbytes = 0;
    const double dev_ms = bench_wall_time(env, step_on_device, b, 5);
    unsigned char *want = dev_ms > 0 ? grads(b, &gbytes) : NULL;
    const double dev_peak = bench_peak_mib(env, step_on_device, b);
    const double off_ms = bench_wall_time(env, step_offloaded, b, 5);
    unsigned char *got = off_ms > 0 ? grads(b, &gbytes) : NULL;
    llmcl_offload_stats s0, s1; /* over the one step that measures the peak */
    llmcl_offload_stats_get(b->off, &s0);
    const double off_peak = bench_peak_mib(env, step_offloaded, b);
    llmcl_offload_finish(b->off);
    llmcl_offload_stats_get(b->off, &s1);
    if (!want || !got || dev_peak < 0 || off_peak < 0) {
        free(want);
        free(got);
        bench_fail(env, "the offload steps", LLMCL_OK);
        return;
    }
    const int check = memcmp(want, got, gbytes) == 0;
    char shape[48];
    snprintf(shape, sizeof shape, "L=%d T=%lld H=%lld F=%lld", b->L, (long long)b->T,
             (long long)b->H, (long long)b->F);
    const double saved = (double)(s1.bytes_saved - s0.bytes_saved);
    const double restored = (double)(s1.bytes_restored - s0.bytes_restored);
    add_row(env, "offload save", "d2h", "bf16", shape,
            (bench_row){.ms = s1.save_ms - s0.save_ms, .bytes = saved,
                        .link_gbs = env->host_d2h_gbs, .peak_mib = -1, .check = -1});
    add_row(env, "offload restore", "h2d", "bf16", shape,
            (bench_row){.ms = s1.restore_ms - s0.restore_ms, .bytes = restored,
                        .link_gbs = env->host_h2d_gbs, .peak_mib = -1, .check = -1});
    add_row(env, "offload step", "fwd+bwd", "bf16", shape,
            (bench_row){.ms = off_ms, .baseline_ms = dev_ms, .peak_mib = off_peak, .check = check});
    add_row(env, "on-device step", "fwd+bwd", "bf16", shape,
            (bench_row){.ms = dev_ms, .peak_mib = dev_peak, .check = -1});
    printf("offload: step %.2f ms offloaded vs %.2f ms on device (%+.1f%%), stall %.3f ms a step, "
           "device memory saved %.1f MiB (peak %.1f -> %.1f MiB), prefetch distance %d\n",
           off_ms, dev_ms, 100.0 * (off_ms - dev_ms) / dev_ms, s1.stall_ms - s0.stall_ms,
           dev_peak - off_peak, dev_peak, off_peak, PREFETCH);
    fflush(stdout);
    free(want);
    free(got);
}

void bench_offload(bench_env *env)
{
    /* the host link itself: the pinned ceilings measured at start */
    const double bytes = env->host_bytes;
    add_row(env, "host link", "d2h", "-", "pinned",
            (bench_row){.ms = bytes / env->host_d2h_gbs * 1e-6, .bytes = bytes,
                        .link_gbs = env->host_d2h_gbs, .peak_mib = -1, .check = -1});
    add_row(env, "host link", "h2d", "-", "pinned",
            (bench_row){.ms = bytes / env->host_h2d_gbs * 1e-6, .bytes = bytes,
                        .link_gbs = env->host_h2d_gbs, .peak_mib = -1, .check = -1});
    ob b = env->small ? (ob){.T = 256, .H = 128, .F = 256, .L = 6}
                      : (ob){.T = 8192, .H = 4096, .F = 14336, .L = 16};
    if (setup(env, &b))
        bench_steps(env, &b);
    teardown(&b);
}
