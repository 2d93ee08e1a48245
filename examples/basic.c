/*
 * basic.c: the smallest llmcl program. Opens a context on the selected device, moves data to it,
 * runs two kernels (axpy in bf16, then a cast to f32) and reads the result back.
 *
 *   cc basic.c $(pkg-config --cflags --libs llmcl) -o basic && ./basic
 */
#include <stdio.h>

#include <llmcl.h>

#define CHECK(ctx, expr)                                                                          \
    do {                                                                                          \
        llmcl_status s_ = (expr);                                                                 \
        if (s_ != LLMCL_OK) {                                                                     \
            fprintf(stderr, "%s failed: %s\n", #expr, llmcl_last_error(ctx));                     \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

int main(void)
{
    llmcl_ctx *ctx = NULL;
    CHECK(NULL, llmcl_ctx_create(&ctx));
    printf("llmcl %s on %s\n", llmcl_version(), llmcl_ctx_device_info(ctx)->name);

    enum { N = 8 };
    const int64_t shape[] = {N};
    uint16_t x[N], y[N];
    for (int i = 0; i < N; ++i) {
        x[i] = llmcl_f32_to_bf16((float)i);
        y[i] = llmcl_f32_to_bf16(100.0f);
    }
    llmcl_tensor *tx = NULL, *ty = NULL, *out = NULL;
    CHECK(ctx, llmcl_tensor_create(ctx, LLMCL_BF16, 1, shape, &tx));
    CHECK(ctx, llmcl_tensor_create(ctx, LLMCL_BF16, 1, shape, &ty));
    CHECK(ctx, llmcl_tensor_create(ctx, LLMCL_F32, 1, shape, &out));
    CHECK(ctx, llmcl_tensor_upload(tx, x, sizeof x));
    CHECK(ctx, llmcl_tensor_upload(ty, y, sizeof y));
    CHECK(ctx, llmcl_axpy(ctx, 0.5f, tx, ty)); /* y = 100 + 0.5 * i */
    CHECK(ctx, llmcl_cast(ctx, ty, out));
    float result[N];
    CHECK(ctx, llmcl_tensor_download(out, result, sizeof result));
    int ok = 1;
    for (int i = 0; i < N; ++i) {
        printf("%g ", result[i]);
        ok &= result[i] == 100.0f + 0.5f * (float)i;
    }
    printf("\n%s\n", ok ? "ok" : "WRONG");

    llmcl_tensor_destroy(tx);
    llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(out);
    llmcl_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
