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

/* ---- elementwise.cl: WG, GPC (copy: UNROLL, HINT too); the size key is the element count ---- */

#define EW_WG "WG=32,64,128,256,512,1024 GPC=0,4,8,16"
#define COPY_PARAMS "WG=128,256,512,1024 GPC=0,8,16 UNROLL=1,2,4,8 HINT=0,1,2,3"
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

/* ---- rope.cl: in place on q [B, HQ, T, D] and k [B, HK, T, D]; size key (D / 2) * (HQ + HK) ---- */

#define ROPE_PARAMS "WG=64,128,256,512,1024 VEC=4,8 HPT=1,2,4,8 ORDER=0,1 HINT=0,1,2,3 CVT=0,1"
#define ROPE_SHAPES "B=4,HQ=32,HK=8,T=2048,D=128,P=64;B=1,HQ=32,HK=8,T=4096,D=64,P=32"
#define ROPE_SMALL "B=1,HQ=8,HK=2,T=256,D=128,P=64"

static int64_t rope_size_key(const tune_case *c)
{
    return tune_dim(c, "D") / 2 * (tune_dim(c, "HQ") + tune_dim(c, "HK"));
}

static llmcl_status run_rope(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    llmcl_rope_options o = {0};
    o.cos = t[2];
    o.sin = t[3];
    return llmcl_rope_forward(ctx, t[0], t[1], &o);
}

static llmcl_status run_rope_pos(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    llmcl_rope_options o = {0};
    o.positions = t[2];
    return llmcl_rope_forward(ctx, t[0], t[1], &o);
}

/* ---- glu.cl: rows of I; the size key is the row length ---- */

#define GLU_PARAMS "WG=64,128,256,512,1024 VEC=4,8 UNROLL=1,2,4 HINT=0,1,2,3 CVT=0,1"
#define GLU_SHAPES "N=8192,I=14336;N=4096,I=4096"
#define GLU_SMALL "N=256,I=1408"

static llmcl_status run_glu_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_glu_forward(ctx, LLMCL_ACT_SILU, t[0], t[1], t[2]);
}

static llmcl_status run_glu_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_glu_backward(ctx, LLMCL_ACT_SILU, t[0], t[1], t[2], t[3], t[4]);
}

/*
 * ---- attention.cl: tiles BLOCK_M, BLOCK_N, TM, TN (PRE_WG for the delta pass); the size key is
 * the head dim D. Q, K and V are views of one [B, H + 2K, T, D] tensor (and dK, dV of one
 * [B, 2K, T, D]) to stay within TUNE_MAX_TENSORS. The backward runs on random O and LSE: its
 * outputs are then no gradients, but every candidate must still reproduce the reference's.
 */

#define ATTN_TILES "BLOCK_M=16,32,64,128 BLOCK_N=8,16,32,64 TM=1,2,4,8 TN=1,2,4,8"
#define ATTN_SHAPES                                                                               \
    "B=4,H=32,K=8,QKV=48,KV2=16,T=4096,D=128;B=4,H=32,K=8,QKV=48,KV2=16,T=4096,D=64"
#define ATTN_SMALL "B=1,H=4,K=2,QKV=8,KV2=4,T=256,D=128;B=1,H=4,K=2,QKV=8,KV2=4,T=256,D=64"

/* Views of rows [first, first + n) of axis 1 of a contiguous [B, N, T, D] tensor. */
static llmcl_status attn_head_view(llmcl_tensor *base, const tune_case *c, int64_t first,
                                   int64_t n, llmcl_tensor **out)
{
    const int64_t b = tune_dim(c, "B"), t = tune_dim(c, "T"), d = tune_dim(c, "D");
    const int64_t heads = llmcl_tensor_dim(base, 1);
    const int64_t shape[4] = {b, n, t, d}, strides[4] = {heads * t * d, t * d, d, 1};
    return llmcl_tensor_view(base, 4, shape, strides, first * t * d, out);
}

/* The tensors of one attention call: q, k, v, dk, dv are views, destroyed by attn_views_free. */
typedef struct attn_views {
    llmcl_tensor *q, *k, *v, *dk, *dv;
} attn_views;

static void attn_views_free(attn_views *v)
{
    llmcl_tensor_destroy(v->q);
    llmcl_tensor_destroy(v->k);
    llmcl_tensor_destroy(v->v);
    llmcl_tensor_destroy(v->dk);
    llmcl_tensor_destroy(v->dv);
}

static llmcl_status attn_views_make(llmcl_tensor *qkv, llmcl_tensor *dkv, const tune_case *c,
                                    attn_views *v)
{
    const int64_t h = tune_dim(c, "H"), k = tune_dim(c, "K");
    *v = (attn_views){0};
    llmcl_status st;
    if ((st = attn_head_view(qkv, c, 0, h, &v->q)) || (st = attn_head_view(qkv, c, h, k, &v->k)) ||
        (st = attn_head_view(qkv, c, h + k, k, &v->v)) ||
        (dkv && ((st = attn_head_view(dkv, c, 0, k, &v->dk)) ||
                 (st = attn_head_view(dkv, c, k, k, &v->dv)))))
        attn_views_free(v);
    return st;
}

static llmcl_status run_attention_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    attn_views v;
    llmcl_status st = attn_views_make(t[0], NULL, c, &v);
    const llmcl_attention_opts opts = {.causal = 1};
    if (st == LLMCL_OK)
        st = llmcl_attention_forward(ctx, v.q, v.k, v.v, &opts, t[1], t[2]);
    attn_views_free(&v);
    return st;
}

static llmcl_status run_attention_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    attn_views v;
    llmcl_status st = attn_views_make(t[0], t[5], c, &v);
    const llmcl_attention_opts opts = {.causal = 1};
    if (st == LLMCL_OK)
        st = llmcl_attention_backward(ctx, v.q, v.k, v.v, t[1], t[2], t[3], &opts, t[4], v.dk,
                                      v.dv);
    attn_views_free(&v);
    return st;
}

#define ATTN_BWD_TENSORS                                                                          \
    {{"qkv", TUNE_IN, "B,QKV,T,D"},                                                               \
     {"o", TUNE_IN, "B,H,T,D"},                                                                   \
     {"lse", TUNE_IN, "B,H,T", TUNE_DT(LLMCL_F32)},                                               \
     {"dout", TUNE_IN, "B,H,T,D"},                                                                \
     {"dq", TUNE_OUT, "B,H,T,D"},                                                                 \
     {"dkv", TUNE_OUT, "B,KV2,T,D"}}

const tune_kernel tune_kernels[] = {
    {.key = "fill", .family = "elementwise", .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"t", TUNE_OUT, "N"}},
     .run = run_fill},
    {.key = "copy", .family = "elementwise", .params = COPY_PARAMS, .dtypes = F32 | BF16,
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
    {.key = "rope", .family = "rope", .params = ROPE_PARAMS, .dtypes = F32 | BF16,
     .size_key_fn = rope_size_key, .shapes = ROPE_SHAPES, .small_shapes = ROPE_SMALL,
     .tensors = {{"q", TUNE_INOUT, "B,HQ,T,D"}, {"k", TUNE_INOUT, "B,HK,T,D"},
                 {"cos", TUNE_IN, "T,P", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE},
                 {"sin", TUNE_IN, "T,P", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE}},
     .run = run_rope},
    {.key = "rope_pos", .family = "rope", .params = ROPE_PARAMS, .dtypes = BF16,
     .size_key_fn = rope_size_key, .shapes = ROPE_SHAPES, .small_shapes = ROPE_SMALL,
     .tensors = {{"q", TUNE_INOUT, "B,HQ,T,D"}, {"k", TUNE_INOUT, "B,HK,T,D"},
                 {"pos", TUNE_IN, "T", TUNE_DT(LLMCL_I32), TUNE_INIT_INDEX, "T"}},
     .run = run_rope_pos},
    {.key = "glu_fwd", .family = "glu", .params = GLU_PARAMS, .dtypes = F32 | BF16,
     .size_key = "I", .shapes = GLU_SHAPES, .small_shapes = GLU_SMALL,
     .tensors = {{"gate", TUNE_IN, "N,I"}, {"up", TUNE_IN, "N,I"}, {"out", TUNE_OUT, "N,I"}},
     .run = run_glu_fwd},
    {.key = "glu_bwd", .family = "glu", .params = GLU_PARAMS, .dtypes = F32 | BF16,
     .size_key = "I", .shapes = GLU_SHAPES, .small_shapes = GLU_SMALL,
     .tensors = {{"dout", TUNE_IN, "N,I"}, {"gate", TUNE_IN, "N,I"}, {"up", TUNE_IN, "N,I"},
                 {"dgate", TUNE_OUT, "N,I"}, {"dup", TUNE_OUT, "N,I"}},
     .run = run_glu_bwd},
    {.key = "attention_fwd", .family = "attention", .params = ATTN_TILES, .dtypes = F32 | BF16,
     .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = {{"qkv", TUNE_IN, "B,QKV,T,D"},
                 {"o", TUNE_OUT, "B,H,T,D"},
                 {"lse", TUNE_OUT, "B,H,T", TUNE_DT(LLMCL_F32)}},
     .run = run_attention_fwd},
    {.key = "attention_bwd_dq", .family = "attention", .params = ATTN_TILES, .dtypes = F32 | BF16,
     .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd, .tol_scale = 4},
    {.key = "attention_bwd_dkdv", .family = "attention", .params = ATTN_TILES,
     .dtypes = F32 | BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd, .tol_scale = 4},
    {.key = "attention_bwd_pre", .family = "attention", .params = "PRE_WG=32,64,128,256",
     .dtypes = F32 | BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd, .tol_scale = 4},
    {0},
};
