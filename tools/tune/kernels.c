/*
 * kernels.c: what llmcl-tune tunes. One tune_kernel entry per kernel key (the key its launcher
 * passes to llmcl__params_lookup), each with its parameter space, the dims whose product is the
 * launcher's size key, representative shapes, its tensors and a small function that calls the op.
 * A family adds its kernels here; tune.h documents the fields.
 */
#include "tune.h"

#define F32 (1u << LLMCL_F32)
#define BF16 (1u << LLMCL_BF16)
#define F16 (1u << LLMCL_F16)

/* ---- elementwise.cl: one tunable, WG; the size key is the element count ---- */

#define EW_WG "WG=32,64,128,256,512,1024"
#define EW_SHAPES "N=67108864;N=4194304"
#define EW_SMALL "N=4194304;N=262144"

static llmcl_status run_fill(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_fill(ctx, t[0], 1.5);
}

static llmcl_status run_copy(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_copy(ctx, t[0], t[1]);
}

static llmcl_status run_cast(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_cast(ctx, t[0], t[1]);
}

static llmcl_status run_axpy(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_axpy(ctx, 0.5f, t[0], t[1]);
}

static llmcl_status run_mul(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_mul(ctx, t[0], t[1]);
}

const tune_kernel tune_kernels[] = {
    {.key = "fill", .family = "elementwise", .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"t", TUNE_OUT, "N"}},
     .run = run_fill},
    {.key = "copy", .family = "elementwise", .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N"}, {"dst", TUNE_OUT, "N"}},
     .run = run_copy},
    /* The dtype of a cast is its destination's: narrowing from f32, and widening from bf16. */
    {.key = "cast", .family = "elementwise", .params = EW_WG, .dtypes = BF16 | F16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N", TUNE_DT(LLMCL_F32)}, {"dst", TUNE_OUT, "N"}},
     .run = run_cast},
    {.key = "cast", .family = "elementwise", .params = EW_WG, .dtypes = F32,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N", TUNE_DT(LLMCL_BF16)}, {"dst", TUNE_OUT, "N"}},
     .run = run_cast},
    {.key = "axpy", .family = "elementwise", .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"x", TUNE_IN, "N"}, {"y", TUNE_INOUT, "N"}},
     .run = run_axpy},
    /* Both near one, so that y = x * y repeated stays finite and away from denormals. */
    {.key = "mul", .family = "elementwise", .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"x", TUNE_IN, "N", 0, TUNE_INIT_NEAR_ONE},
                 {"y", TUNE_INOUT, "N", 0, TUNE_INIT_NEAR_ONE}},
     .run = run_mul},
    {0},
};
