/*
 * kernels.c: what llmcl-tune tunes. One tune_kernel entry per kernel key (llmcl_kernels.h's
 * LLMCL_KEY_*, which its launcher looks up and the tuning files name), each with its parameter
 * space, the dims whose product is the launcher's size key, representative shapes, its tensors and
 * a small function that calls the op. A family adds its kernels here; tune.h documents the fields.
 */
#include <stdio.h>
#include <string.h>

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

static llmcl_status run_sum_rows(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_sum_rows(ctx, t[0], 1.0f, t[1]);
}

/* ---- optim.cl: WG, UNROLL, GPC; one tensor; the size key is the element count ---- */

#define OPTIM_PARAMS "WG=64,128,256,512,1024 UNROLL=1,2,4,8 GPC=0,4,8,16"
#define OPTIM_SHAPES "N=268435456,O=1;N=16777216,O=1"
#define OPTIM_SMALL "N=4194304,O=1;N=262144,O=1"

/* A 16-bit param without master rounds stochastically: the bits depend on the seed, the step
 * and the element's index only, so every candidate must reproduce them. */
static llmcl_status run_adamw(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_adamw_tensor a = {t[0], NULL, t[1], t[2], t[3], 0};
    const llmcl_adamw_opts o = {.lr = 1e-3f, .weight_decay = 0.1f, .step = 1, .seed = 1};
    return llmcl_adamw_step(ctx, &a, 1, &o);
}

static llmcl_status run_grad_norm(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_tensor *g = t[0];
    return llmcl_grad_norm(ctx, &g, 1, 0, t[1]);
}

/* ---- rope.cl: in place on q [B, HQ, T, D] and k [B, HK, T, D]; size key (D / 2) * (HQ + HK) ---- */

#define ROPE_PARAMS "WG=64,128,256,512,1024 VEC=4,8 HPT=1,2,4,8 ORDER=0,1 HINT=0,1,2,3"
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

#define GLU_PARAMS "WG=64,128,256,512,1024 VEC=4,8 UNROLL=1,2,4 HINT=0,1,2,3"
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
 * ---- attention_*.cl: tiles BLOCK_M, BLOCK_N, TM, TN, LF32, UNROLL, PIPE, TILE_RUN (and KV_SEP for
 * the forward, KF32 for dQ, PRE_WG and PRE_LANES for the delta pass); the size key is the head
 * dim D. Q, K and V are views of one [B, H + 2K, T, D] tensor, and dK, dV the contiguous
 * [B, K, T, D] halves of one [B, 2K, T, D] buffer, to stay within TUNE_MAX_TENSORS. The backward's
 * O and LSE come from a forward on the same Q, K and V (derive_inputs): on random ones P's rows
 * summed to thousands, and candidates that only round delta differently (attention_bwd_pre's
 * PRE_LANES) fell outside the tolerance where dQ's terms cancel.
 */

#define ATTN_TILES                                                                                \
    "BLOCK_M=16,32,64,128 BLOCK_N=8,16,32,64 TM=1,2,4,8 TN=1,2,4,8 LF32=0,1,2 UNROLL=0,2,4,8 "     \
    "PIPE=0,1 TILE_RUN=1,8"
#define ATTN_FWD_TILES ATTN_TILES " KV_SEP=0,1"
#define ATTN_DQ_TILES ATTN_TILES " KF32=0,1"
#define ATTN_SHAPES                                                                               \
    "B=4,H=32,K=8,QKV=48,KV2=16,T=4096,D=128;B=4,H=32,K=8,QKV=48,KV2=16,T=4096,D=64"
#define ATTN_SMALL "B=1,H=4,K=2,QKV=8,KV2=4,T=256,D=128;B=1,H=4,K=2,QKV=8,KV2=4,T=256,D=64"

/* The tensor-core kernels (attn_*_mma) tile by warps of 16 rows (WM x 16 in the forward, which
   may read Q's fragments from local memory each step: QREG 0); only devices with tensor cores run
   them. */
#define ATTN_MMA_TILES "BLOCK_M=16,32,64,128 BLOCK_N=16,32,64,128"
#define ATTN_FWD_MMA_TILES ATTN_MMA_TILES " WM=1,2 QREG=0,1 STAGES=1,2"
/* The attn_*_wgmma kernels: a warpgroup per 64 query rows (keys in dK/dV), on devices with wgmma,
   at D 64, 128 and 256 (where every tensor-core call takes them there; attn_*_mma then tune on
   the other devices) */
#define ATTN_WGMMA_TILES "BLOCK_M=64,128 BLOCK_N=64,128 TMA=0,1"
#define ATTN_FWD_WGMMA_TILES ATTN_WGMMA_TILES " STAGES=3,4,5 PERSIST=0,1,2,3"
#define ATTN_DKDV_WGMMA_TILES ATTN_WGMMA_TILES " STAGES=2,3 DS_SLABS=2,3,4"
#define ATTN_FWD_TENSORS                                                                          \
    {{"qkv", TUNE_IN, "B,QKV,T,D"}, {"o", TUNE_OUT, "B,H,T,D"},                                   \
     {"lse", TUNE_OUT, "B,H,T", TUNE_DT(LLMCL_F32)}}

/* mma.sync's products (and attention's at the tuned shapes) run where the device has no wgmma (or
   LLMCL_WGMMA=0 turned it off). */
static bool has_mma_sync_products(const llmcl_device_info *info)
{
    return info->has_mma && !info->has_wgmma;
}

static bool has_wgmma(const llmcl_device_info *info) { return info->has_wgmma; }

/* Views of rows [first, first + n) of axis 1 of a contiguous [B, N, T, D] tensor. */
static llmcl_status attn_head_view(llmcl_tensor *base, const tune_case *c, int64_t first,
                                   int64_t n, llmcl_tensor **out)
{
    const int64_t b = tune_dim(c, "B"), t = tune_dim(c, "T"), d = tune_dim(c, "D");
    const int64_t heads = llmcl_tensor_dim(base, 1);
    const int64_t shape[4] = {b, n, t, d}, strides[4] = {heads * t * d, t * d, d, 1};
    return llmcl_tensor_view(base, 4, shape, strides, first * t * d, out);
}

/* Contiguous [B, K, T, D] half number `half` of a [B, 2K, T, D] buffer. */
static llmcl_status attn_half_view(llmcl_tensor *base, const tune_case *c, int64_t half,
                                   llmcl_tensor **out)
{
    const int64_t b = tune_dim(c, "B"), k = tune_dim(c, "K"), t = tune_dim(c, "T");
    const int64_t d = tune_dim(c, "D");
    const int64_t shape[4] = {b, k, t, d}, strides[4] = {k * t * d, t * d, d, 1};
    return llmcl_tensor_view(base, 4, shape, strides, half * b * k * t * d, out);
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
        (dkv && ((st = attn_half_view(dkv, c, 0, &v->dk)) ||
                 (st = attn_half_view(dkv, c, 1, &v->dv)))))
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

/*
 * ---- norm.cl: rows of C; the size key is the row length. Tensors past TUNE_MAX_TENSORS are
 * packed in pairs ([TWO = 2, ...]) and split with views. rstd and mean hold random values in the
 * backward: the outputs are then no gradients, but every candidate must reproduce the reference.
 */

#define NORM_FWD_PARAMS "WG=32,64,128,256,512,1024 ROWS=1,2,4 CACHE=1,2,4,8"
#define NORM_BWD_PARAMS "WG=64,128,256,512,1024 ROWS=1,2 CACHE=1,2,4 GROUPS_PER_CU=1,2,3,4"
#define NORM_SHAPES "TWO=2,R=8192,C=4096;TWO=2,R=4096,C=8192"
#define NORM_SMALL "TWO=2,R=256,C=4096"

/* The case's value of parameter name, or fallback where the space has no such parameter. */
static long case_param(const tune_case *c, const char *name, long fallback)
{
    for (int i = 0; i < c->n_params; ++i)
        if (strcmp(c->param_names[i], name) == 0)
            return c->values[i];
    return fallback;
}

/* WG * ROWS work-items in one work-group. */
static bool norm_fits(const llmcl_device_info *info, const tune_case *c, char *why, size_t len)
{
    const long wg = case_param(c, "WG", 1), rows = case_param(c, "ROWS", 1);
    if ((size_t)(wg * rows) <= info->max_work_group_size)
        return true;
    snprintf(why, len, "WG * ROWS = %ld exceeds the work-group limit %zu", wg * rows,
             info->max_work_group_size);
    return false;
}

/* Item i of a tensor packed as [2, ...]. */
static llmcl_status norm_half(llmcl_tensor *pair, int i, llmcl_tensor **out)
{
    const int nd = llmcl_tensor_ndim(pair) - 1;
    int64_t shape[LLMCL_MAX_DIMS];
    for (int d = 0; d < nd; ++d)
        shape[d] = llmcl_tensor_dim(pair, d + 1);
    return llmcl_tensor_view(pair, nd, shape, NULL, i * (llmcl_tensor_numel(pair) / 2), out);
}

static llmcl_status run_rmsnorm_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_rmsnorm_forward(ctx, t[0], t[1], t[2], t[3], NULL);
}

static llmcl_status run_rmsnorm_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_rmsnorm_backward(ctx, t[0], t[1], t[2], t[3], t[4], t[5], NULL);
}

static llmcl_status run_residual_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_residual_rmsnorm_forward(ctx, t[0], t[1], t[2], t[3], t[4], t[5], NULL);
}

static llmcl_status run_residual_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    llmcl_tensor *dy = NULL, *dr = NULL;
    llmcl_status st = norm_half(t[0], 0, &dy);
    if (st == LLMCL_OK)
        st = norm_half(t[0], 1, &dr);
    if (st == LLMCL_OK)
        st = llmcl_residual_rmsnorm_backward(ctx, dy, dr, t[1], t[2], t[3], t[4], t[5], NULL);
    llmcl_tensor_destroy(dy);
    llmcl_tensor_destroy(dr);
    return st;
}

static llmcl_status run_layernorm_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_layernorm_forward(ctx, t[0], t[1], t[2], t[3], t[4], t[5], NULL);
}

static llmcl_status run_layernorm_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    llmcl_tensor *mean = NULL, *rstd = NULL, *dw = NULL, *db = NULL;
    llmcl_status st = norm_half(t[3], 0, &mean);
    if (st == LLMCL_OK)
        st = norm_half(t[3], 1, &rstd);
    if (st == LLMCL_OK)
        st = norm_half(t[5], 0, &dw);
    if (st == LLMCL_OK)
        st = norm_half(t[5], 1, &db);
    if (st == LLMCL_OK)
        st = llmcl_layernorm_backward(ctx, t[0], t[1], t[2], mean, rstd, t[4], dw, db);
    llmcl_tensor_destroy(mean);
    llmcl_tensor_destroy(rstd);
    llmcl_tensor_destroy(dw);
    llmcl_tensor_destroy(db);
    return st;
}

#define NORM_RMS_BWD_TENSORS                                                                      \
    {{"dy", TUNE_IN, "R,C"},                                                                      \
     {"x", TUNE_IN, "R,C"},                                                                       \
     {"w", TUNE_IN, "C"},                                                                         \
     {"rstd", TUNE_IN, "R", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE},                              \
     {"dx", TUNE_OUT, "R,C"},                                                                     \
     {"dw", TUNE_OUT, "C"}}

/*
 * ---- cross_entropy.cl: the row kernels of path 1 (size key V) and the fused tiles of path 3
 * (cce_fwd and cce_bwd_dw: V; cce_bwd_dh: N), and distill.cl's row kernel (V), whose walks over
 * a row take the same tunables. O is a dim of size 1 for the loss.
 */

#define CE_ROWS "WG=64,128,256,512,1024 UNROLL=1,2,4"
#define CE_ROW_SHAPES "N=4096,V=128256,O=1;N=4096,V=32000,O=1"
#define CE_ROW_SMALL "N=64,V=32000,O=1"
#define CCE_TILES "T=32,64,128 BK=8,16,32 TM=2,4,8 TN=2,4,8"
#define CCE_SHAPES "N=4096,H=2048,V=32768,O=1"
#define CCE_SMALL "N=128,H=256,V=2048,O=1"

static llmcl_status run_ce_rows(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_ce_options o = {0};
    return llmcl_cross_entropy_forward(ctx, t[0], t[1], &o, t[2], NULL, t[3], t[0]);
}

/* distill.cl's row kernel at the JSD (beta 0.5, a third walk for the gradient), in place. */
static llmcl_status run_distill_rows(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_distill_options o = {.beta = 0.5f};
    return llmcl_distill_forward(ctx, t[0], t[1], NULL, &o, t[2], t[0]);
}

static llmcl_status run_cce_fwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_ce_options o = {0};
    return llmcl_fused_cross_entropy_forward(ctx, t[0], t[1], NULL, t[2], &o, t[3], NULL, t[4]);
}

/* The backward needs a real LSE: the forward (fixed parameters) runs first on each call. */
static llmcl_status run_cce_bwd(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_ce_options o = {0};
    const int64_t one = 1;
    llmcl_tensor *loss = NULL;
    llmcl_status st = llmcl_tensor_create(ctx, LLMCL_F32, 1, &one, &loss);
    if (st == LLMCL_OK)
        st = llmcl_fused_cross_entropy_forward(ctx, t[0], t[1], NULL, t[2], &o, loss, NULL, t[3]);
    if (st == LLMCL_OK)
        st = llmcl_fused_cross_entropy_backward(ctx, t[0], t[1], NULL, t[2], t[3], NULL, &o, t[4],
                                                t[5], NULL);
    llmcl_tensor_destroy(loss);
    return st;
}

#define CCE_BWD_TENSORS                                                                           \
    {{"hidden", TUNE_IN, "N,H"},                                                                  \
     {"w", TUNE_IN, "V,H"},                                                                       \
     {"labels", TUNE_IN, "N", TUNE_DT(LLMCL_I64), TUNE_INIT_INDEX, "V"},                          \
     {"lse", TUNE_OUT, "N", TUNE_DT(LLMCL_F32)},                                                  \
     {"dhidden", TUNE_OUT, "N,H", TUNE_DT(LLMCL_F32)},                                            \
     {"dw", TUNE_OUT, "V,H", TUNE_DT(LLMCL_F32)}}

/*
 * ---- matmul.cl: c [Z, M, N] = a [Z, M, K] b [Z, N, K]^T (a linear layer's forward); size key
 * max(M, N), or the thin side where one is at most 64. mm_wgmma runs bf16 and f16 products on
 * devices with wgmma (sm_90), and mm_wgmma_at those with a transposed (weight gradients, c = a^T b
 * with a [Z, K, M]); elsewhere with tensor cores mm_mma and mm_mma_at run them; mm_tiled is tuned
 * on f32 batches, which every device runs on it (2-D f32 goes to CLBlast).
 */

#define MM_MMA_TILES                                                                              \
    "BM=64,128,256 BN=64,128,256 BK=32,64 WM=1,2,4 WN=1,2,4 STAGES=2,3,4 GROUP_M=4,8,16"
#define MM_MMA_SHAPES "Z=1,M=8192,N=8192,K=8192;Z=1,M=8192,N=14336,K=4096"
#define MM_MMA_AT_SHAPES "Z=1,M=4096,N=4096,K=8192;Z=1,M=14336,N=4096,K=8192"
#define MM_WGMMA_AT_TILES                                                                         \
    "BM=128,192,256 BN=128,192,256 WG_MB=1,2 STAGES=3,4 GROUP_M=8,16 MM_WS=0,1"
/* The forward's 16-bit outputs may store by TMA; the weight gradients' f32 ones never do. */
#define MM_WGMMA_TILES MM_WGMMA_AT_TILES " MM_TMA_STORE=0,1"
#define MM_TILED_TILES "T=16,32,64,128 BK=8,16,32 TM=1,2,4,8 TN=1,2,4,8"
#define MM_TILED_SHAPES "Z=2,M=2048,N=2048,K=2048"
#define MM_SMALL "Z=2,M=256,N=320,K=192"

/* As the launcher classes a product: max(M, N), or the thin side where one is at most 64. */
static int64_t mm_size_key(const tune_case *c)
{
    const int64_t m = tune_dim(c, "M"), n = tune_dim(c, "N"), thin = m < n ? m : n;
    return thin <= 64 ? thin : (m > n ? m : n);
}

static llmcl_status run_matmul(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_matmul_opts o = {.trans_b = 1};
    return llmcl_matmul(ctx, 1.0f, t[0], t[1], 0.0f, t[2], &o);
}

/* A weight gradient's product: c [Z, M, N] = a [Z, K, M]^T b [Z, K, N]. */
static llmcl_status run_matmul_at(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const llmcl_matmul_opts o = {.trans_a = 1};
    return llmcl_matmul(ctx, 1.0f, t[0], t[1], 0.0f, t[2], &o);
}

/*
 * wgmma's tiles (BM x BN x 64 in STAGES, WG_MB blocks of 64 rows a warpgroup) within the
 * accumulators a lane holds (192), one to three warpgroups and the device's local memory.
 */
static bool mm_wgmma_fits(const llmcl_device_info *info, const tune_case *c, char *why, size_t len)
{
    const long bm = case_param(c, "BM", 256), bn = case_param(c, "BN", 192);
    const long mb = case_param(c, "WG_MB", 2), stages = case_param(c, "STAGES", 4);
    const uint64_t local = (uint64_t)stages * (bm + bn) * 64 * 2;
    if (mb * bn > 384 || bm % (64 * mb) || bm / (64 * mb) > 3 ||
        local > info->local_mem_static_bytes) {
        snprintf(why, len, "%ld accumulators a lane, %ld warpgroups, %llu bytes of local memory",
                 mb * bn / 2, bm / (64 * mb), (unsigned long long)local);
        return false;
    }
    return true;
}

/* Tensor-core tiles within the warps' registers and the device's local memory. */
static bool mm_mma_fits(const llmcl_device_info *info, const tune_case *c, char *why, size_t len)
{
    long v[7] = {0};
    static const char *names[7] = {"BM", "BN", "BK", "WM", "WN", "STAGES", "GROUP_M"};
    for (int i = 0; i < c->n_params; ++i)
        for (int j = 0; j < 7; ++j)
            if (strcmp(c->param_names[i], names[j]) == 0)
                v[j] = c->values[i];
    const long wtm = v[0] / (v[3] ? v[3] : 1), wtn = v[1] / (v[4] ? v[4] : 1);
    const uint64_t local = (uint64_t)v[5] * (v[0] + v[1]) * v[2] * 2;
    if (wtm < 16 || wtn < 16 || wtm * wtn > 64 * 64 || local > info->local_mem_static_bytes ||
        (size_t)(32 * v[3] * v[4]) > info->max_work_group_size) {
        snprintf(why, len, "warp tile %ldx%ld, %llu bytes of local memory, %ld threads", wtm, wtn,
                 (unsigned long long)local, 32 * v[3] * v[4]);
        return false;
    }
    return true;
}

#define MM_TENSORS                                                                                \
    {{"a", TUNE_IN, "Z,M,K"}, {"b", TUNE_IN, "Z,N,K"}, {"c", TUNE_OUT, "Z,M,N"}}
/* A weight gradient's product writes f32, as llmcl-train's gradients are. */
#define MM_AT_TENSORS                                                                             \
    {{"a", TUNE_IN, "Z,K,M"},                                                                     \
     {"b", TUNE_IN, "Z,K,N"},                                                                     \
     {"c", TUNE_OUT, "Z,M,N", TUNE_DT(LLMCL_F32)}}

const tune_kernel tune_kernels[] = {
    {.key = LLMCL_KEY_FILL, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"t", TUNE_OUT, "N"}},
     .run = run_fill},
    {.key = LLMCL_KEY_COPY, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = COPY_PARAMS, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N"}, {"dst", TUNE_OUT, "N"}},
     .run = run_copy},
    /* The dtype of a cast is its destination's: narrowing from f32, and widening from bf16. */
    {.key = LLMCL_KEY_CAST, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = EW_WG, .dtypes = BF16 | F16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N", TUNE_DT(LLMCL_F32)}, {"dst", TUNE_OUT, "N"}},
     .run = run_cast},
    {.key = LLMCL_KEY_CAST, .family = LLMCL_FAMILY_ELEMENTWISE, .params = EW_WG, .dtypes = F32,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"src", TUNE_IN, "N", TUNE_DT(LLMCL_BF16)}, {"dst", TUNE_OUT, "N"}},
     .run = run_cast},
    {.key = LLMCL_KEY_AXPY, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"x", TUNE_IN, "N"}, {"y", TUNE_INOUT, "N"}},
     .run = run_axpy},
    /* Both near one, so that y = x * y repeated stays finite and away from denormals. */
    {.key = LLMCL_KEY_MUL, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = EW_SHAPES, .small_shapes = EW_SMALL,
     .tensors = {{"x", TUNE_IN, "N", 0, TUNE_INIT_NEAR_ONE},
                 {"y", TUNE_INOUT, "N", 0, TUNE_INIT_NEAR_ONE}},
     .run = run_mul},
    /* llmcl_dist's sum of two ranks' parts of a group's shard (a 4096 x 4096 weight, a smaller). */
    {.key = LLMCL_KEY_SUM_ROWS, .family = LLMCL_FAMILY_ELEMENTWISE,
     .params = EW_WG, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = "R=2,N=8388608;R=2,N=1048576",
     .small_shapes = "R=2,N=1048576;R=2,N=65536",
     .tensors = {{"x", TUNE_IN, "R,N"}, {"y", TUNE_INOUT, "N"}},
     .run = run_sum_rows},
    /* v near one: positive, as a second moment is */
    {.key = LLMCL_KEY_ADAMW, .family = LLMCL_FAMILY_OPTIM,
     .params = OPTIM_PARAMS, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = OPTIM_SHAPES, .small_shapes = OPTIM_SMALL,
     .tensors = {{"param", TUNE_INOUT, "N"},
                 {"grad", TUNE_IN, "N", TUNE_DT(LLMCL_F32)},
                 {"m", TUNE_INOUT, "N", TUNE_DT(LLMCL_F32)},
                 {"v", TUNE_INOUT, "N", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE}},
     .run = run_adamw},
    {.key = LLMCL_KEY_GRAD_NORM, .family = LLMCL_FAMILY_OPTIM,
     .params = OPTIM_PARAMS, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = OPTIM_SHAPES, .small_shapes = OPTIM_SMALL,
     .tensors = {{"grad", TUNE_IN, "N"}, {"out", TUNE_OUT, "O", TUNE_DT(LLMCL_F32)}},
     .run = run_grad_norm, .tol_scale = 10},
    {.key = LLMCL_KEY_ROPE, .family = LLMCL_FAMILY_ROPE,
     .params = ROPE_PARAMS, .dtypes = F32 | BF16,
     .size_key_fn = rope_size_key, .shapes = ROPE_SHAPES, .small_shapes = ROPE_SMALL,
     .tensors = {{"q", TUNE_INOUT, "B,HQ,T,D"}, {"k", TUNE_INOUT, "B,HK,T,D"},
                 {"cos", TUNE_IN, "T,P", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE},
                 {"sin", TUNE_IN, "T,P", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE}},
     .run = run_rope},
    {.key = LLMCL_KEY_ROPE_POS, .family = LLMCL_FAMILY_ROPE, .params = ROPE_PARAMS, .dtypes = BF16,
     .size_key_fn = rope_size_key, .shapes = ROPE_SHAPES, .small_shapes = ROPE_SMALL,
     .tensors = {{"q", TUNE_INOUT, "B,HQ,T,D"}, {"k", TUNE_INOUT, "B,HK,T,D"},
                 {"pos", TUNE_IN, "T", TUNE_DT(LLMCL_I32), TUNE_INIT_INDEX, "T"}},
     .run = run_rope_pos},
    {.key = LLMCL_KEY_GLU_FWD, .family = LLMCL_FAMILY_GLU,
     .params = GLU_PARAMS, .dtypes = F32 | BF16,
     .size_key = "I", .shapes = GLU_SHAPES, .small_shapes = GLU_SMALL,
     .tensors = {{"gate", TUNE_IN, "N,I"}, {"up", TUNE_IN, "N,I"}, {"out", TUNE_OUT, "N,I"}},
     .run = run_glu_fwd},
    {.key = LLMCL_KEY_GLU_BWD, .family = LLMCL_FAMILY_GLU,
     .params = GLU_PARAMS, .dtypes = F32 | BF16,
     .size_key = "I", .shapes = GLU_SHAPES, .small_shapes = GLU_SMALL,
     .tensors = {{"dout", TUNE_IN, "N,I"}, {"gate", TUNE_IN, "N,I"}, {"up", TUNE_IN, "N,I"},
                 {"dgate", TUNE_OUT, "N,I"}, {"dup", TUNE_OUT, "N,I"}},
     .run = run_glu_bwd},
    {.key = LLMCL_KEY_ATTENTION_FWD, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_FWD_TILES, .dtypes = F32 | BF16,
     .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_FWD_TENSORS, .run = run_attention_fwd},
    {.key = LLMCL_KEY_ATTENTION_BWD_DQ, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_DQ_TILES, .dtypes = F32 | BF16,
     .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4},
    {.key = LLMCL_KEY_ATTENTION_BWD_DKDV, .family = LLMCL_FAMILY_ATTENTION, .params = ATTN_TILES,
     .dtypes = F32 | BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4},
    {.key = LLMCL_KEY_ATTENTION_FWD_MMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_FWD_MMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_FWD_TENSORS, .run = run_attention_fwd, .runs_on = has_mma_sync_products},
    {.key = LLMCL_KEY_ATTENTION_FWD_WGMMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_FWD_WGMMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_FWD_TENSORS, .run = run_attention_fwd, .runs_on = has_wgmma},
    {.key = LLMCL_KEY_ATTENTION_BWD_DQ_MMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_MMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4,
     .runs_on = has_mma_sync_products},
    {.key = LLMCL_KEY_ATTENTION_BWD_DQ_WGMMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_WGMMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4,
     .runs_on = has_wgmma},
    {.key = LLMCL_KEY_ATTENTION_BWD_DKDV_MMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_MMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4,
     .runs_on = has_mma_sync_products},
    {.key = LLMCL_KEY_ATTENTION_BWD_DKDV_WGMMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = ATTN_DKDV_WGMMA_TILES,
     .dtypes = BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4,
     .runs_on = has_wgmma},
    /* dQ from the stored dS runs by default at D 128 alone */
    {.key = LLMCL_KEY_ATTENTION_BWD_DQ_DS_WGMMA, .family = LLMCL_FAMILY_ATTENTION,
     .params = "STAGES=2,3,4 PERSIST=0,1,2,3", .dtypes = BF16, .size_key = "D",
     .shapes = "B=4,H=32,K=8,QKV=48,KV2=16,T=4096,D=128",
     .small_shapes = "B=1,H=4,K=2,QKV=8,KV2=4,T=256,D=128",
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4,
     .runs_on = has_wgmma},
    {.key = LLMCL_KEY_ATTENTION_BWD_PRE, .family = LLMCL_FAMILY_ATTENTION,
     .params = "PRE_WG=32,64,128,256 PRE_LANES=1,4,8,16,32 PRE_ROWS=1,2,4,8",
     .dtypes = F32 | BF16, .size_key = "D", .shapes = ATTN_SHAPES, .small_shapes = ATTN_SMALL,
     .tensors = ATTN_BWD_TENSORS, .run = run_attention_bwd,
     .derive_inputs = run_attention_fwd, .tol_scale = 4},
    {.key = LLMCL_KEY_RMSNORM_FWD, .family = LLMCL_FAMILY_NORM,
     .params = NORM_FWD_PARAMS, .dtypes = F32 | BF16,
     .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = {{"x", TUNE_IN, "R,C"}, {"w", TUNE_IN, "C"}, {"y", TUNE_OUT, "R,C"},
                 {"rstd", TUNE_OUT, "R", TUNE_DT(LLMCL_F32)}},
     .run = run_rmsnorm_fwd, .fits = norm_fits},
    {.key = LLMCL_KEY_RESIDUAL_RMSNORM_FWD, .family = LLMCL_FAMILY_NORM, .params = NORM_FWD_PARAMS,
     .dtypes = F32 | BF16, .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = {{"x", TUNE_IN, "R,C"}, {"res", TUNE_IN, "R,C"}, {"w", TUNE_IN, "C"},
                 {"r", TUNE_OUT, "R,C"}, {"y", TUNE_OUT, "R,C"},
                 {"rstd", TUNE_OUT, "R", TUNE_DT(LLMCL_F32)}},
     .run = run_residual_fwd, .fits = norm_fits},
    {.key = LLMCL_KEY_LAYERNORM_FWD, .family = LLMCL_FAMILY_NORM,
     .params = NORM_FWD_PARAMS, .dtypes = F32 | BF16,
     .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = {{"x", TUNE_IN, "R,C"}, {"w", TUNE_IN, "C"}, {"b", TUNE_IN, "C"},
                 {"y", TUNE_OUT, "R,C"}, {"mean", TUNE_OUT, "R", TUNE_DT(LLMCL_F32)},
                 {"rstd", TUNE_OUT, "R", TUNE_DT(LLMCL_F32)}},
     .run = run_layernorm_fwd, .fits = norm_fits},
    /* Backward weight gradients sum rows in an order set by the slot count: compare loosely. */
    {.key = LLMCL_KEY_RMSNORM_BWD, .family = LLMCL_FAMILY_NORM,
     .params = NORM_BWD_PARAMS, .dtypes = F32 | BF16,
     .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = NORM_RMS_BWD_TENSORS, .run = run_rmsnorm_bwd, .fits = norm_fits, .tol_scale = 4},
    {.key = LLMCL_KEY_NORM_DW_REDUCE, .family = LLMCL_FAMILY_NORM,
     .params = "FX=4,8,16,32,64 FY=1,2,4,8,16,32,64",
     .dtypes = F32 | BF16, .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = NORM_RMS_BWD_TENSORS, .run = run_rmsnorm_bwd, .tol_scale = 4},
    {.key = LLMCL_KEY_RESIDUAL_RMSNORM_BWD, .family = LLMCL_FAMILY_NORM, .params = NORM_BWD_PARAMS,
     .dtypes = F32 | BF16, .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = {{"dy_dr", TUNE_IN, "TWO,R,C"}, {"r", TUNE_IN, "R,C"}, {"w", TUNE_IN, "C"},
                 {"rstd", TUNE_IN, "R", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE},
                 {"drx", TUNE_OUT, "R,C"}, {"dw", TUNE_OUT, "C"}},
     .run = run_residual_bwd, .fits = norm_fits, .tol_scale = 4},
    {.key = LLMCL_KEY_LAYERNORM_BWD, .family = LLMCL_FAMILY_NORM,
     .params = NORM_BWD_PARAMS, .dtypes = F32 | BF16,
     .size_key = "C", .shapes = NORM_SHAPES, .small_shapes = NORM_SMALL,
     .tensors = {{"dy", TUNE_IN, "R,C"}, {"x", TUNE_IN, "R,C"}, {"w", TUNE_IN, "C"},
                 {"stats", TUNE_IN, "TWO,R", TUNE_DT(LLMCL_F32), TUNE_INIT_NEAR_ONE},
                 {"dx", TUNE_OUT, "R,C"}, {"dwb", TUNE_OUT, "TWO,C"}},
     .run = run_layernorm_bwd, .fits = norm_fits, .tol_scale = 4},
    {.key = LLMCL_KEY_CE_ROWS, .family = LLMCL_FAMILY_CROSS_ENTROPY,
     .params = CE_ROWS, .dtypes = F32 | BF16,
     .size_key = "V", .shapes = CE_ROW_SHAPES, .small_shapes = CE_ROW_SMALL,
     .tensors = {{"logits", TUNE_INOUT, "N,V"},
                 {"labels", TUNE_IN, "N", TUNE_DT(LLMCL_I64), TUNE_INIT_INDEX, "V"},
                 {"loss", TUNE_OUT, "O", TUNE_DT(LLMCL_F32)},
                 {"lse", TUNE_OUT, "N", TUNE_DT(LLMCL_F32)}},
     .run = run_ce_rows},
    {.key = LLMCL_KEY_CCE_FWD, .family = LLMCL_FAMILY_CROSS_ENTROPY,
     .params = CCE_TILES, .dtypes = F32 | BF16,
     .size_key = "V", .shapes = CCE_SHAPES, .small_shapes = CCE_SMALL,
     .tensors = {{"hidden", TUNE_IN, "N,H"},
                 {"w", TUNE_IN, "V,H"},
                 {"labels", TUNE_IN, "N", TUNE_DT(LLMCL_I64), TUNE_INIT_INDEX, "V"},
                 {"loss", TUNE_OUT, "O", TUNE_DT(LLMCL_F32)},
                 {"lse", TUNE_OUT, "N", TUNE_DT(LLMCL_F32)}},
     .run = run_cce_fwd, .tol_scale = 4},
    {.key = LLMCL_KEY_CCE_BWD_DH, .family = LLMCL_FAMILY_CROSS_ENTROPY,
     .params = CCE_TILES, .dtypes = F32 | BF16,
     .size_key = "N", .shapes = CCE_SHAPES, .small_shapes = CCE_SMALL, .tensors = CCE_BWD_TENSORS,
     .run = run_cce_bwd, .tol_scale = 4},
    {.key = LLMCL_KEY_CCE_BWD_DW, .family = LLMCL_FAMILY_CROSS_ENTROPY,
     .params = CCE_TILES, .dtypes = F32 | BF16,
     .size_key = "V", .shapes = CCE_SHAPES, .small_shapes = CCE_SMALL, .tensors = CCE_BWD_TENSORS,
     .run = run_cce_bwd, .tol_scale = 4},
    {.key = LLMCL_KEY_DISTILL_ROWS, .family = LLMCL_FAMILY_DISTILL,
     .params = CE_ROWS, .dtypes = F32 | BF16,
     .size_key = "V", .shapes = CE_ROW_SHAPES, .small_shapes = CE_ROW_SMALL,
     .tensors = {{"student", TUNE_INOUT, "N,V"}, {"teacher", TUNE_IN, "N,V"},
                 {"loss", TUNE_OUT, "O", TUNE_DT(LLMCL_F32)}},
     .run = run_distill_rows},
    {.key = LLMCL_KEY_MM_WGMMA, .family = LLMCL_FAMILY_MATMUL,
     .params = MM_WGMMA_TILES, .dtypes = BF16 | F16,
     .size_key_fn = mm_size_key, .shapes = MM_MMA_SHAPES, .small_shapes = MM_SMALL,
     .tensors = MM_TENSORS, .run = run_matmul, .fits = mm_wgmma_fits, .tol_rms = true,
     .runs_on = has_wgmma},
    {.key = LLMCL_KEY_MM_WGMMA_AT, .family = LLMCL_FAMILY_MATMUL,
     .params = MM_WGMMA_AT_TILES, .dtypes = BF16 | F16,
     .size_key_fn = mm_size_key, .shapes = MM_MMA_AT_SHAPES, .small_shapes = MM_SMALL,
     .tensors = MM_AT_TENSORS, .run = run_matmul_at, .fits = mm_wgmma_fits, .tol_rms = true,
     .runs_on = has_wgmma},
    {.key = LLMCL_KEY_MM_MMA, .family = LLMCL_FAMILY_MATMUL,
     .params = MM_MMA_TILES, .dtypes = BF16 | F16,
     .size_key_fn = mm_size_key, .shapes = MM_MMA_SHAPES, .small_shapes = MM_SMALL,
     .tensors = MM_TENSORS, .run = run_matmul, .fits = mm_mma_fits, .tol_rms = true,
     .runs_on = has_mma_sync_products},
    {.key = LLMCL_KEY_MM_MMA_AT, .family = LLMCL_FAMILY_MATMUL,
     .params = MM_MMA_TILES, .dtypes = BF16 | F16,
     .size_key_fn = mm_size_key, .shapes = MM_MMA_AT_SHAPES, .small_shapes = MM_SMALL,
     .tensors = MM_AT_TENSORS, .run = run_matmul_at, .fits = mm_mma_fits, .tol_rms = true,
     .runs_on = has_mma_sync_products},
    {.key = LLMCL_KEY_MM_TILED, .family = LLMCL_FAMILY_MATMUL,
     .params = MM_TILED_TILES, .dtypes = F32,
     .size_key_fn = mm_size_key, .shapes = MM_TILED_SHAPES, .small_shapes = MM_SMALL,
     .tensors = MM_TENSORS, .run = run_matmul, .tol_rms = true},
    {0},
};
