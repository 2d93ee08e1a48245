/*
 * model.c: the Llama-style model of llmcl-train (see model.h): parameter layout and
 * initialisation, activation buffers, forward, backward and greedy next-token prediction, every
 * step an llmcl call. Activations are views of buffers sized for the largest micro-batch, so the
 * same buffers serve training, evaluation and sampling.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload_state.h"
#include "util.h"
#ifdef LLMCL_TRAIN_MPI
#include "zero.h"
#endif

struct layer_acts {
    llmcl_tensor *h1, *rstd1, *o, *lse, *xmid, *h2, *rstd2, *act;
    llmcl_tensor *qkv; /* q, k and v side by side in a row, as the stacked projections write them */
    llmcl_tensor *gu;  /* gate and up likewise */
    llmcl_tensor *qkn, *rstd_qk; /* with qk_norm: q and k normalised and rotated side by side in
                                    a row (qkv keeps them as projected), and their rstd, q's
                                    heads' then k's */
    llmcl_tensor *u[P_KINDS]; /* x A^T [N, rank x adapters], at a group's first adapted kind */
};

/* ---- per-family kernel time (model->profiling) ---- */

static const char *family_names[F_FAMILIES] = {
    "matmul y=xW^T", "matmul dx=dyW", "matmul dW+=dy^Tx", "attention fwd", "attention bwd",
    "norm",          "rope",          "glu",              "cross_entropy fwd", "cross_entropy bwd",
    "embedding fwd", "embedding bwd", "elementwise",      "optimizer"};

const char *model_family_name(int family) { return family_names[family]; }

void model_prof_begin(model *m)
{
    if (m->profiling)
        CHECK(llmcl_profile_begin(m->ctx), m->ctx);
}

llmcl_status model_prof_end(model *m, int family, llmcl_status st)
{
    if (!m->profiling)
        return st;
    llmcl_profile p;
    CHECK(llmcl_profile_end(m->ctx, &p), m->ctx);
    m->prof_ms[family] += p.kernel_ms;
    return st;
}

/* An op's status, its kernels' time added to its family's when profiling. */
#define PROF(family, expr) MODEL_PROF(m, family, expr)
#define OP(family, expr) TRY(PROF(family, expr))

/* ---- configuration ---- */

/* The sizes: every count positive, the heads dividing the width and the query heads. */
static const char *shape_error(const model_config *c)
{
    static char msg[256];
    if (c->vocab < 2 || c->dim < 1 || c->layers < 1 || c->heads < 1 || c->kv_heads < 1 ||
        c->ffn < 1 || c->max_seq < 1)
        return "vocab must be >= 2 and dim, layers, heads, kv-heads, ffn and seq >= 1";
    if (c->head_dim < 0 || (c->head_dim == 0 && c->dim % c->heads)) {
        snprintf(msg, sizeof msg, "%d heads do not divide the width %d: give --head-dim",
                 c->heads, c->dim);
        return msg;
    }
    if (c->heads % c->kv_heads) {
        snprintf(msg, sizeof msg, "%d key/value heads do not divide the %d query heads",
                 c->kv_heads, c->heads);
        return msg;
    }
    const int d = model_config_head_dim(c);
    if (d % 8 || d < 8 || d > 256) {
        char from[64] = "";
        if (!c->head_dim)
            snprintf(from, sizeof from, " (width %d / %d heads)", c->dim, c->heads);
        snprintf(msg, sizeof msg, "head dimension %d%s must be a multiple of 8 from 8 to 256", d,
                 from);
        return msg;
    }
    return NULL;
}

/* The architecture, with the layers and RoPE scaling its config.json can describe, and the
   dtype. */
static const char *layers_error(const model_config *c)
{
    if ((unsigned)c->arch >= ARCH_COUNT || c->sliding_window < 0)
        return "the architecture must be llama, mistral, qwen2 or qwen3, and the sliding "
               "window >= 0";
    /* what each architecture's config.json can say, so that an export says what was trained */
    const bool all_biases = c->qkv_bias == c->o_bias;
    if ((c->arch == ARCH_LLAMA && (!all_biases || c->qk_norm || c->sliding_window)) ||
        (c->arch == ARCH_MISTRAL && (c->qkv_bias || c->o_bias || c->qk_norm)) ||
        (c->arch == ARCH_QWEN2 && (!c->qkv_bias || c->o_bias || c->qk_norm)) ||
        (c->arch == ARCH_QWEN3 && (!all_biases || !c->qk_norm)))
        return "the layers differ from the architecture's: llama has biases on q, k, v and o or "
               "none and no sliding window; mistral no biases; qwen2 biases on q, k and v; qwen3 "
               "q and k norms and biases on q, k, v and o or none";
    /* an export writes max_position_embeddings as 8192 times it (an int), which --init-from
       reads up to 2^30 */
    if (!(c->rope_llama3_factor >= 0 && c->rope_llama3_factor <= 131072))
        return "the Llama 3 RoPE factor (--rope-llama3, config.json's rope_scaling.factor) must "
               "be from 0 (off) to 131072: an export's max_position_embeddings is 8192 times it";
    if (c->dtype != LLMCL_F32 && c->dtype != LLMCL_BF16 && c->dtype != LLMCL_F16)
        return "dtype must be f32, bf16 or f16";
    return NULL;
}

/* LoRA, ZeRO, offload and the losses' options, and the combinations they refuse. */
static const char *options_error(const model_config *c)
{
    if (c->lora_rank < 0 || (c->lora_rank > 0 && !(c->lora_alpha > 0)))
        return "the LoRA rank must be >= 0 and its alpha > 0";
    if (c->lora_rank > 0 && (c->lora_targets == 0 || (c->lora_targets & ~LORA_ALL_TARGETS)))
        return "LoRA needs one or more targets among q, k, v, o, gate, up, down";
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return "the ZeRO stage must be 1, 2 or 3";
#ifndef LLMCL_TRAIN_MPI
    if (c->zero_stage)
        return "--zero needs llmcl-train built with MPI (MPICH was not found at setup)";
#endif
    if (c->zero_group_layers < ZERO_GROUP_LAYERS_AUTO ||
        ((c->zero_group_layers > 1 || c->zero_group_layers == ZERO_GROUP_LAYERS_AUTO) &&
         !c->zero_stage))
        return "--zero-group-layers needs --zero and a count of 1 or more, or auto";
    if (c->zero_reduce_dtype != LLMCL_F32 && (c->zero_reduce_dtype != LLMCL_BF16 || !c->zero_stage))
        return "--zero-reduce-dtype needs --zero, and f32 or bf16";
    if (c->ce_logits_dtype != LLMCL_F32 && (c->ce_logits_dtype != c->dtype || c->fused_ce))
        return "--ce-logits takes f32, or the model's 16-bit dtype without --fused-ce";
    if (c->zero_stage && c->lora_rank && c->lora_dtype != LLMCL_F32)
        return "--lora-dtype bf16 keeps no f32 masters, which --zero's optimizer updates: give "
               "f32 adapters (the default) under --zero";
    if (c->lora_rank > 0 && c->lora_dtype != LLMCL_F32 &&
        (c->lora_dtype != LLMCL_BF16 || c->dtype != LLMCL_BF16))
        return "the LoRA dtype must be f32, or bf16 with a bf16 model (--dtype bf16)";
    if (c->offload_chunk_bytes && c->dtype == LLMCL_F32)
        return "--offload-optimizer moves the f32 master weights to the host, and an f32 model "
               "computes with them: give --dtype bf16 or f16";
    if (c->offload_chunk_bytes && c->lora_rank)
        return "--offload-optimizer is for full training: with LoRA the optimizer state is the "
               "adapters' and small";
    if (c->optimizer_in_backward && c->zero_stage)
        return "--optimizer-in-backward and --zero do not combine: ZeRO updates each rank's shard "
               "after the gradients are reduced";
    if (c->optimizer_in_backward && c->offload_chunk_bytes)
        return "--optimizer-in-backward and --offload-optimizer do not combine: the offloaded "
               "state streams through the device in layout order after the backward";
    if (c->preference && (c->fused_ce || c->distill_alpha > 0))
        return "a preference loss computes its own head (the chunked or fused cross-entropy's "
               "passes): not with --fused-ce or distillation";
    if (c->optimizer_in_backward && c->lora_rank > 0 && c->lora_dtype != LLMCL_F32)
        return "--optimizer-in-backward needs f32 adapters (--lora-dtype f32): bf16 adapters' "
               "stochastic rounding counts elements across the whole step's update";
    return NULL;
}

const char *model_config_error(const model_config *c)
{
    const char *e = shape_error(c);
    if (!e)
        e = layers_error(c);
    return e ? e : options_error(c);
}

int model_config_head_dim(const model_config *c)
{
    return c->head_dim ? c->head_dim : c->dim / c->heads;
}

const char *model_arch_name(model_arch arch)
{
    static const char *const names[ARCH_COUNT] = {"llama", "mistral", "qwen2", "qwen3"};
    return (unsigned)arch < ARCH_COUNT ? names[arch] : "";
}

/* ---- layer groups: under --zero (zero.h) parameters exist while their group is open ---- */

int model_head_group(const model *m)
{
    return m->cfg.tied ? 0 : m->cfg.layers + 1;
}

int model_groups(const model *m) { return m->cfg.layers + (m->cfg.tied ? 1 : 2); }

int model_group(const model *m, const model_param *p)
{
    if (p->layer >= 0)
        return p->layer + 1;
    return p->kind == P_EMBED ? 0 : model_head_group(m);
}

static llmcl_status group_open(model *m, int group, int mode)
{
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_open(m, group, mode);
#endif
    (void)m, (void)group, (void)mode;
    return LLMCL_OK;
}

static llmcl_status group_close(model *m, int group, int mode)
{
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_close(m, group, mode);
#endif
    (void)m, (void)group, (void)mode;
    return LLMCL_OK;
}

/* The backward's word that group's gradients are final (optimizer_in_backward's update). */
static llmcl_status group_grads_final(model *m, int group)
{
    return m->on_group_grads ? m->on_group_grads(m->on_group_grads_arg, group) : LLMCL_OK;
}

/* ---- views, collected per call and dropped at its end ---- */

typedef struct arena {
    llmcl_tensor *t[512];
    int n;
} arena;

static void arena_clear(arena *a)
{
    for (int i = 0; i < a->n; ++i)
        llmcl_tensor_destroy(a->t[i]);
    a->n = 0;
}

static llmcl_tensor *view(arena *a, const llmcl_tensor *base, int ndim, const int64_t *shape,
                          const int64_t *strides, int64_t offset)
{
    if (a->n == (int)(sizeof a->t / sizeof a->t[0]))
        die("model: too many views in one call");
    llmcl_tensor *v = NULL;
    CHECK(llmcl_tensor_view(base, ndim, shape, strides, offset, &v), llmcl_tensor_ctx(base));
    a->t[a->n++] = v;
    return v;
}

/* The first n rows of a 2-D buffer. */
static llmcl_tensor *rows(arena *a, const llmcl_tensor *t, int64_t n)
{
    const int64_t shape[2] = {n, llmcl_tensor_dim(t, 1)};
    return view(a, t, 2, shape, NULL, llmcl_tensor_offset(t));
}

/* The first n elements of a 1-D buffer. */
static llmcl_tensor *head(arena *a, const llmcl_tensor *t, int64_t n)
{
    return view(a, t, 1, &n, NULL, llmcl_tensor_offset(t));
}

/* Columns [col, col + n_cols) of the first n rows of a 2-D buffer. */
static llmcl_tensor *cols(arena *a, const llmcl_tensor *t, int64_t n, int64_t col, int64_t n_cols)
{
    const int64_t shape[2] = {n, n_cols}, strides[2] = {llmcl_tensor_dim(t, 1), 1};
    return view(a, t, 2, shape, strides, llmcl_tensor_offset(t) + col);
}

/* The h heads of d from column col of rows [N = b t, width] as [b, h, t, d] (attention's view of
   [b, t, h, d] storage). */
static llmcl_tensor *bhtd(arena *a, const llmcl_tensor *t, int64_t col, int b, int tt, int h,
                          int d)
{
    const int64_t w = llmcl_tensor_dim(t, 1);
    const int64_t shape[4] = {b, h, tt, d}, strides[4] = {tt * w, d, w, 1};
    return view(a, t, 4, shape, strides, llmcl_tensor_offset(t) + col);
}

/* The same heads as [b, t, h, d] (RoPE's layout). */
static llmcl_tensor *bthd(arena *a, const llmcl_tensor *t, int64_t col, int b, int tt, int h,
                          int d)
{
    const int64_t w = llmcl_tensor_dim(t, 1);
    const int64_t shape[4] = {b, tt, h, d}, strides[4] = {tt * w, w, d, 1};
    return view(a, t, 4, shape, strides, llmcl_tensor_offset(t) + col);
}

/* ---- parameters ---- */

static const char *kind_name[P_LORA_A] = {
    "model.embed_tokens.weight",       "input_layernorm.weight", "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight",   "mlp.up_proj.weight",
    "mlp.down_proj.weight",            "model.norm.weight",      "lm_head.weight",
    "self_attn.q_proj.bias",           "self_attn.k_proj.bias",  "self_attn.v_proj.bias",
    "self_attn.o_proj.bias",           "self_attn.q_norm.weight", "self_attn.k_norm.weight",
};

const char *model_module_name(int kind)
{
    static const char *names[P_KINDS] = {[P_WQ] = "q_proj",       [P_WK] = "k_proj",
                                         [P_WV] = "v_proj",       [P_WO] = "o_proj",
                                         [P_WGATE] = "gate_proj", [P_WUP] = "up_proj",
                                         [P_WDOWN] = "down_proj"};
    return kind >= 0 && kind < P_KINDS && names[kind] ? names[kind] : "";
}

static void param_shape(const model_config *c, int kind, int64_t shape[2], int *ndim)
{
    const int64_t d = model_config_head_dim(c), q = (int64_t)c->heads * d,
                  kv = (int64_t)c->kv_heads * d;
    const int64_t shapes[P_LORA_A][2] = {
        {c->vocab, c->dim}, {c->dim, 0}, {q, c->dim},   {kv, c->dim},   {kv, c->dim},
        {c->dim, q},        {c->dim, 0}, {c->ffn, c->dim}, {c->ffn, c->dim}, {c->dim, c->ffn},
        {c->dim, 0},        {c->vocab, c->dim}, {q, 0}, {kv, 0}, {kv, 0}, {c->dim, 0}, {d, 0},
        {d, 0},
    };
    shape[0] = shapes[kind][0];
    shape[1] = shapes[kind][1];
    *ndim = shape[1] ? 2 : 1;
}

/* Where m->index keeps the parameter of kind in layer (-1 for the global ones). */
static int *index_at(model *m, int kind, int layer)
{
    return &m->index[(layer + 1) * P_KINDS + kind];
}

/* Appends a parameter to its set's layout: a base weight (base NULL) or an adapter of base. */
static model_param *add_param(model *m, int kind, int layer, const model_param *base)
{
    model_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->layer = layer;
    if (base) { /* A [r, in], B [out, r] under PEFT's names */
        const char *block = base->kind < P_MLP_NORM ? "self_attn" : "mlp";
        snprintf(p->name, sizeof p->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight",
                 layer, block, model_module_name(base->kind), kind == P_LORA_A ? 'A' : 'B');
        p->ndim = 2;
        p->shape[0] = kind == P_LORA_A ? m->cfg.lora_rank : base->shape[0];
        p->shape[1] = kind == P_LORA_A ? base->shape[1] : m->cfg.lora_rank;
    } else {
        if (layer >= 0)
            snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, kind_name[kind]);
        else
            snprintf(p->name, sizeof p->name, "%s", kind_name[kind]);
        param_shape(&m->cfg, kind, p->shape, &p->ndim);
    }
    p->numel = p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1);
    p->is_vector = p->ndim == 1;
    p->trainable = !m->cfg.frozen && (base || m->cfg.lora_rank == 0);
    param_set *s = p->trainable ? &m->trainable : &m->frozen;
    p->offset = s->total;
    /* 128-byte aligned views for the fast paths; but k's and v's biases follow q's directly, so
       that the stacked product adds them as one (a bias needs no alignment) */
    s->total += kind == P_BQ || kind == P_BK ? p->numel : (p->numel + 63) / 64 * 64;
    if (!base)
        *index_at(m, kind, layer) = (int)(p - m->params);
    return p;
}

/* Whether a layer of c has parameters of kind (a Llama layer's nine, and what c adds). */
static bool layer_has(const model_config *c, int kind)
{
    if (kind >= P_BQ && kind <= P_BV)
        return c->qkv_bias;
    if (kind == P_BO)
        return c->o_bias;
    if (kind == P_QNORM || kind == P_KNORM)
        return c->qk_norm;
    return kind >= P_ATTN_NORM && kind <= P_WDOWN;
}

/* A layer's kinds in layout order: a Llama layer's, with the biases of q, k and v after v's
   weights (one bias vector for the stacked product), then the q and k norms, o's bias after o. */
static const int layer_order[] = {P_ATTN_NORM, P_WQ, P_WK, P_WV, P_BQ, P_BK, P_BV, P_QNORM,
                                  P_KNORM, P_WO, P_BO, P_MLP_NORM, P_WGATE, P_WUP, P_WDOWN};

/* Every base weight in layout order, then each layer's adapters: its A's one after another, then
   its B's, so that the A's of q, k and v (and of gate and up) lie side by side and their products
   stack (stacked_adapters). A Llama model's layout, which the initial values follow, is the one
   it had before other architectures came. */
static void layout_params(model *m)
{
    const model_config *c = &m->cfg;
    const int targets = __builtin_popcount(c->lora_targets);
    const int per_layer = (int)(sizeof layer_order / sizeof *layer_order) + 2 * targets;
    m->params = xcalloc((size_t)(c->layers * per_layer + 3), sizeof *m->params);
    m->index = xmalloc((size_t)(c->layers + 1) * P_KINDS * sizeof *m->index);
    for (int i = 0; i < (c->layers + 1) * P_KINDS; ++i)
        m->index[i] = -1;
    add_param(m, P_EMBED, -1, NULL);
    for (int l = 0; l < c->layers; ++l)
        for (size_t i = 0; i < sizeof layer_order / sizeof *layer_order; ++i)
            if (layer_has(c, layer_order[i]))
                add_param(m, layer_order[i], l, NULL);
    add_param(m, P_FINAL_NORM, -1, NULL);
    if (!c->tied)
        add_param(m, P_HEAD, -1, NULL);
    const int n_base = m->n_params;
    for (int i = 0; i < n_base; ++i) {
        model_param *p = &m->params[i];
        if (p->layer < 0 || p->kind < P_WQ || p->kind > P_WO)
            continue;
        const int bias = *index_at(m, p->kind == P_WO ? P_BO : p->kind - P_WQ + P_BQ, p->layer);
        p->bias = bias >= 0 ? &m->params[bias] : NULL;
    }
    for (int l = 0; c->lora_rank > 0 && l < c->layers; ++l)
        for (int kind = P_LORA_A; kind <= P_LORA_B; ++kind)
            for (int i = 0; i < n_base; ++i) {
                model_param *p = &m->params[i];
                if (p->layer == l && (c->lora_targets & (1u << p->kind))) {
                    model_param *adapter = add_param(m, kind, l, p);
                    *(kind == P_LORA_A ? &p->lora_a : &p->lora_b) = adapter;
                }
            }
}

/* p's view of a flat buffer of its set, at element offset (its own, but for group-laid grads). */
static llmcl_tensor *param_view(const model_param *p, llmcl_tensor *flat, int64_t offset)
{
    if (!flat)
        return NULL;
    llmcl_tensor *v = NULL;
    CHECK(llmcl_tensor_view(flat, p->ndim, p->shape, NULL, offset, &v), llmcl_tensor_ctx(flat));
    return v;
}

/* Ends the run: n elements of dt did not fit on the device; what names a parameter set's buffer,
   NULL an activation or scratch buffer. Says why and what to change. */
__attribute__((noreturn)) static void no_room(llmcl_ctx *ctx, const char *what, llmcl_dtype dt,
                                              int64_t n)
{
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    const char *fix = what ? "train a smaller model (--layers, --dim, --ffn, --vocab), shard it "
                             "over ranks with --zero 3 under mpiexec, or use a device that allows "
                             "larger buffers"
                           : "shorten --batch or --seq, or keep fewer activations with --recompute "
                             "(--recompute=auto takes the first form that fits)";
    char size[32], most[32], used[32];
    format_bytes((double)n * (double)llmcl_dtype_size(dt), size, sizeof size);
    if (!what)
        what = "an activation buffer";
    if ((double)n * (double)llmcl_dtype_size(dt) > (double)info->max_alloc_bytes) {
        format_bytes((double)info->max_alloc_bytes, most, sizeof most);
        die("cannot allocate %s: %lld %s elements, %s in one buffer, beyond this device's largest "
            "allocation of %s: %s", what, (long long)n, llmcl_dtype_name(dt), size, most, fix);
    }
    llmcl_memory_stats ms = {0};
    llmcl_memory_stats_get(ctx, &ms);
    format_bytes((double)ms.current_bytes, used, sizeof used);
    format_bytes((double)(ms.limit_bytes ? ms.limit_bytes : info->global_mem_bytes), most,
                 sizeof most);
    die("cannot allocate %s of %s: %s of the device's %s%s are in use: %s", what, size, used, most,
        ms.limit_bytes ? " (LLMCL_MEMORY_LIMIT)" : "", fix);
}

/* A device tensor, or the end of the run naming it (no_room). */
static llmcl_tensor *named_tensor(llmcl_ctx *ctx, const char *what, llmcl_dtype dt, int ndim,
                                  int64_t d0, int64_t d1)
{
    const int64_t shape[2] = {d0, d1};
    llmcl_tensor *t = NULL;
    const llmcl_status st = llmcl_tensor_create(ctx, dt, ndim, shape, &t);
    if (st == LLMCL_ERROR_OUT_OF_DEVICE_MEMORY)
        no_room(ctx, what, dt, ndim == 1 ? d0 : d0 * d1);
    CHECK(st, ctx);
    return t;
}

static llmcl_tensor *new_tensor(llmcl_ctx *ctx, llmcl_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    return named_tensor(ctx, NULL, dt, ndim, d0, d1);
}

/*
 * A set's buffers: compute (16-bit models), master (unless bf16-only), grads and moments; with
 * offload_bytes the masters and moments in pinned host memory instead (all zero there too).
 */
static void set_alloc(llmcl_ctx *ctx, param_set *s, llmcl_dtype compute, bool master, bool train,
                      uint64_t offload_bytes)
{
    if (s->total == 0)
        return;
    const char *set = train ? "the trainable parameters'" : "the frozen parameters'";
    char what[128];
    if (compute != LLMCL_F32) {
        snprintf(what, sizeof what, "%s %s weights", set, llmcl_dtype_name(compute));
        s->compute = named_tensor(ctx, what, compute, 1, s->total, 0);
    }
    if (offload_bytes)
        CHECK(offload_state_create(ctx, s->total, offload_bytes, &s->offloaded), ctx);
    else if (master) { /* zeros between tensors too, so the checkpoints' fingerprint is repeatable */
        snprintf(what, sizeof what, "%s f32 master weights", set);
        s->master = named_tensor(ctx, what, LLMCL_F32, 1, s->total, 0);
        CHECK(llmcl_fill(ctx, s->master, 0.0), ctx);
    }
    if (!train)
        return;
    llmcl_tensor **state[] = {&s->grad, &s->m, &s->v};
    static const char *const names[] = {"gradients", "AdamW first moments",
                                        "AdamW second moments"};
    for (int i = 0; i < (offload_bytes ? 1 : 3); ++i) {
        snprintf(what, sizeof what, "%s f32 %s", set, names[i]);
        *state[i] = named_tensor(ctx, what, LLMCL_F32, 1, i == 0 ? s->grad_total : s->total, 0);
        CHECK(llmcl_fill(ctx, *state[i], 0.0), ctx);
    }
}

static void set_free(param_set *s)
{
    llmcl_tensor *all[] = {s->compute, s->master, s->grad, s->m, s->v};
    for (int i = 0; i < 5; ++i)
        llmcl_tensor_destroy(all[i]);
    offload_state_destroy(s->offloaded);
}

void model_param_set(model *m, const model_param *p, const float *host)
{
#ifdef LLMCL_TRAIN_MPI
    if (m->zero && p->trainable) {
        CHECK(zero_init_param(m, p, host), m->ctx);
        return;
    }
#else
    (void)m;
#endif
    tensor_upload_f32(model_param_value(p), host, p->numel);
}

/*
 * Initial values: Normal(0, 0.02) matrices and unit norm weights (then the adapters: A uniform in
 * +-1/sqrt(in), B zero). Value j of parameter i is value j of the counter-based stream (seed, i)
 * (util.h) rather than the next draw of one sequence: drawn one after another on one thread, the
 * 8B preset's 8 billion values took three minutes before its first step, on every rank of a
 * --zero job. So drawn, the values do not depend on how many threads fill a parameter, or in what
 * order, and a --zero 3 rank draws only the part of each parameter that it keeps (zero_kept).
 */
typedef struct param_fill {
    const model_param *p;
    uint64_t key;  /* the parameter's stream */
    float *values; /* its numel values, element j at values[j] */
} param_fill;

/* Elements [lo, hi) of a parameter's initial values: parallel_for's body. */
static void fill_values(void *arg, int64_t lo, int64_t hi)
{
    const param_fill *f = arg;
    const model_param *p = f->p;
    float *out = f->values + lo;
    const double bound = 1.0 / sqrt((double)p->shape[1]);
    if (p->kind >= P_BQ && p->kind <= P_BO)
        memset(out, 0, (size_t)(hi - lo) * sizeof *out);
    else if (p->is_vector)
        for (int64_t j = 0; j < hi - lo; ++j)
            out[j] = 1.0f;
    else if (p->kind == P_LORA_A)
        rng_uniform_fill(f->key, lo, hi - lo, -bound, bound, out);
    else if (p->kind == P_LORA_B)
        memset(out, 0, (size_t)(hi - lo) * sizeof *out);
    else
        rng_normal_fill(f->key, lo, hi - lo, 0.02, out);
}

/*
 * Each parameter filled on several threads, then uploaded from one host buffer that they share
 * (the largest parameter's size, so that its pages are mapped once). Offloaded masters are filled
 * into a host image of the layout instead (zeros between tensors, as on the device), which then
 * goes to pinned memory.
 */
static void init_params(model *m, uint64_t seed)
{
    offload_state *off = m->trainable.offloaded; /* all weights are trainable then: no LoRA */
    int64_t largest = 0;
    for (int i = 0; i < m->n_params; ++i)
        largest = m->params[i].numel > largest ? m->params[i].numel : largest;
    float *image = off ? xcalloc((size_t)m->trainable.total, sizeof *image) : NULL;
    float *buffer = image ? NULL : xmalloc((size_t)largest * sizeof *buffer);
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        param_fill f = {p, rng_stream(seed, (uint64_t)i), image ? image + p->offset : buffer};
        int64_t lo = 0, hi = p->numel;
#ifdef LLMCL_TRAIN_MPI
        if (m->zero)
            zero_kept(m, i, &lo, &hi);
#endif
        parallel_for(lo, hi, 1 << 16, fill_values, &f);
        if (!image)
            model_param_set(m, p, buffer);
    }
    if (image)
        CHECK(offload_state_write(off, image, NULL, NULL), m->ctx);
    free(image);
    free(buffer);
}

void model_params_get(model *m, int n, const model_param *const *ps, float *const *hosts)
{
#ifdef LLMCL_TRAIN_MPI
    if (m->zero) { /* the trained ones from the dist, in one call on every rank */
        const model_param **dist = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *dist);
        float **to = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *to);
        int k = 0;
        for (int i = 0; i < n; ++i)
            if (ps[i]->trainable)
                dist[k] = ps[i], to[k++] = hosts[i];
        const llmcl_status st = zero_get_params(m, k, dist, to);
        free(dist);
        free(to);
        CHECK(st, m->ctx);
    }
#endif
    for (int i = 0; i < n; ++i) {
        const model_param *p = ps[i];
        if ((m->zero && p->trainable) || !hosts[i])
            continue;
        tensor_download_f32(model_param_value(p), hosts[i], p->numel);
    }
}

int64_t model_param_within(const model_param *p, int64_t at, int64_t len, int64_t *first)
{
    const int64_t lo = p->offset > at ? p->offset : at;
    const int64_t hi = p->offset + p->numel < at + len ? p->offset + p->numel : at + len;
    *first = lo;
    return hi > lo ? hi - lo : 0;
}

llmcl_tensor *model_param_value(const model_param *p) { return p->master ? p->master : p->w; }

llmcl_status model_norms_from(model *m, int64_t at, int64_t len, const llmcl_tensor *master)
{
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        int64_t first;
        const int64_t n = p->is_vector ? model_param_within(p, at, len, &first) : 0;
        if (n == 0)
            continue;
        llmcl_tensor *from = tensor_slice(master, first - at, n);
        llmcl_tensor *to = tensor_slice(p->w, first - p->offset, n);
        const llmcl_status st = llmcl_copy(m->ctx, from, to);
        llmcl_tensor_destroy(from);
        llmcl_tensor_destroy(to);
        TRY(st);
    }
    return LLMCL_OK;
}

/* A chunk of offloaded masters rounded into the compute copy and copied into the norms'. */
static llmcl_status sync_chunk(void *arg, int64_t at, int64_t len, llmcl_tensor *master,
                               llmcl_tensor *mom, llmcl_tensor *var)
{
    model *m = arg;
    (void)mom, (void)var;
    llmcl_tensor *compute = tensor_slice(m->trainable.compute, at, len);
    const llmcl_status st = llmcl_cast(m->ctx, master, compute);
    llmcl_tensor_destroy(compute);
    TRY(st);
    return model_norms_from(m, at, len, master);
}

llmcl_status model_sync_compute(model *m)
{
    if (m->trainable.offloaded) /* then the loop below finds no trainable master */
        TRY(offload_state_stream(m->trainable.offloaded, false, sync_chunk, m));
    param_set *sets[] = {&m->trainable, &m->frozen};
    for (int i = 0; i < 2; ++i)
        if (sets[i]->compute && sets[i]->master)
            TRY(llmcl_cast(m->ctx, sets[i]->master, sets[i]->compute));
    return LLMCL_OK;
}

/*
 * With optimizer_in_backward: where each trainable parameter's gradient lies in trainable.grad
 * (grad_at, per parameter) and each group's span of it (span, per group: first element, count).
 * A group's gradients live from its backward to its update, so the groups take turns in one
 * shared span, the largest group's size, which each update leaves zero for the next. A tied
 * head's group 0 alone keeps a span of its own: its gradients are written at both ends of the
 * backward (the head's by the forward's cross-entropy, the embedding's last). Every gradient still
 * starts at a multiple of 64 elements. Returns the buffer's size in elements.
 */
static int64_t group_grad_layout(const model *m, int64_t *grad_at, int64_t (*span)[2])
{
    const int groups = model_groups(m);
    for (int g = 0; g < groups; ++g)
        span[g][0] = span[g][1] = 0;
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        const int g = model_group(m, p);
        if (!p->trainable)
            continue;
        grad_at[i] = span[g][1];
        span[g][1] += (p->numel + 63) / 64 * 64;
    }
    const int64_t own = m->cfg.tied ? span[0][1] : 0;
    int64_t shared = 0;
    for (int g = m->cfg.tied ? 1 : 0; g < groups; ++g) {
        span[g][0] = own;
        shared = span[g][1] > shared ? span[g][1] : shared;
    }
    for (int i = 0; i < m->n_params; ++i)
        grad_at[i] += m->params[i].trainable ? span[model_group(m, &m->params[i])][0] : 0;
    return own + shared;
}

/* Each group's span of the group-laid gradients, for the update that zeroes it after use. */
static void group_grad_views(model *m, int64_t (*span)[2])
{
    m->group_grads = xcalloc((size_t)model_groups(m), sizeof *m->group_grads);
    for (int g = 0; g < model_groups(m); ++g)
        if (span[g][1] > 0)
            CHECK(llmcl_tensor_view(m->trainable.grad, 1, &span[g][1], NULL, span[g][0],
                                    &m->group_grads[g]),
                  m->ctx);
}

/* The two sets' buffers and every parameter's views into them. */
static void alloc_params(model *m)
{
    const model_config *cfg = &m->cfg;
    const bool lora = cfg->lora_rank > 0;
    int64_t *grad_at = xcalloc((size_t)m->n_params, sizeof *grad_at);
    int64_t(*span)[2] = xcalloc((size_t)model_groups(m), sizeof *span);
    for (int i = 0; i < m->n_params; ++i)
        grad_at[i] = m->params[i].offset;
    m->trainable.grad_total = cfg->optimizer_in_backward ? group_grad_layout(m, grad_at, span)
                                                         : m->trainable.total;
    if (!cfg->zero_stage) /* else an llmcl_dist holds them */
        set_alloc(m->ctx, &m->trainable, cfg->dtype, !lora || cfg->lora_dtype == LLMCL_F32, true,
                  cfg->offload_chunk_bytes);
    /* frozen weights (a LoRA base, a teacher's, a reference's) compute with their 16-bit copy
       alone: the matrices keep no f32 masters (4 bytes a parameter), only the vectors are f32 */
    set_alloc(m->ctx, &m->frozen, cfg->dtype, cfg->dtype == LLMCL_F32, false, 0);
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        param_set *s = p->trainable ? &m->trainable : &m->frozen;
        p->master = param_view(p, s->master, p->offset);
        p->grad = param_view(p, s->grad, grad_at[i]);
        p->m = param_view(p, s->m, p->offset);
        p->v = param_view(p, s->v, p->offset);
        p->w16 = param_view(p, s->compute, p->offset);
        if (p->is_vector && (s->offloaded || (s->compute && !s->master))) /* used in f32, and
                                                     the masters are on the host or nowhere */
            p->w = new_tensor(m->ctx, LLMCL_F32, 1, p->numel, 0);
        else
            p->w = param_view(p, p->is_vector || !p->w16 ? s->master : s->compute, p->offset);
    }
    if (cfg->optimizer_in_backward && m->trainable.grad)
        group_grad_views(m, span);
    free(grad_at);
    free(span);
}

/* Under --zero: the trained parameters in an llmcl_dist instead (the trainable set stays empty;
   under LoRA the frozen set holds the base, alloc_params's). */
static void attach_zero(model *m)
{
#ifdef LLMCL_TRAIN_MPI
    CHECK(zero_attach(m, m->cfg.zero_stage), m->ctx);
#else
    (void)m;
    die("--zero needs llmcl-train built with MPI");
#endif
}

llmcl_status model_create(llmcl_ctx *ctx, const model_config *cfg, uint64_t seed, model **out)
{
    model *m = xcalloc(1, sizeof *m);
    m->ctx = ctx;
    m->cfg = *cfg;
    m->head_dim = model_config_head_dim(cfg);
    m->lora_scale = cfg->lora_rank > 0 ? cfg->lora_alpha / (float)cfg->lora_rank : 0.0f;
    layout_params(m);
    if (!cfg->zero_stage || cfg->lora_rank > 0)
        alloc_params(m);
    if (cfg->zero_stage)
        attach_zero(m);
    init_params(m, seed);
    CHECK(model_sync_compute(m), ctx);
    *out = m;
    return LLMCL_OK;
}

model_param *model_find(model *m, const char *name)
{
    for (int i = 0; i < m->n_params; ++i)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

int64_t model_param_count(const model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; ++i)
        n += m->params[i].numel;
    return n;
}

int64_t model_trainable_count(const model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; ++i)
        n += m->params[i].trainable ? m->params[i].numel : 0;
    return n;
}

double model_flops_per_token(const model *m, int t)
{
    /* the input embedding is a gather; with a tied head its matrix multiplies once, as the head */
    const model_config *c = &m->cfg;
    double flops = 6.0 * c->layers * (double)t * c->heads * m->head_dim;
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        if (!(p->kind == P_EMBED && !c->tied))
            flops += (p->trainable ? 6.0 : 4.0) * (double)p->numel;
    }
    return flops;
}

/* The parameter of kind in layer (-1 for the global ones), NULL where the model has none; the
   tied head is the embedding. */
static model_param *param(model *m, int kind, int layer)
{
    if (kind == P_HEAD && m->cfg.tied)
        kind = P_EMBED;
    const int i = *index_at(m, kind, layer);
    return i >= 0 ? &m->params[i] : NULL;
}

/* ---- activations ---- */

/* The first projection of kind's group, which reads one input with it: q for q, k and v; gate for
   gate and up; o and down alone. */
static int group_first(int kind)
{
    return kind >= P_WQ && kind <= P_WV ? P_WQ : kind == P_WUP ? P_WGATE : kind;
}

static int group_size(int first) { return first == P_WQ ? 3 : first == P_WGATE ? 2 : 1; }

/*
 * The adapters of a group keep their x A^T side by side in one buffer, held by the group's first
 * adapted projection (*first; -1 when none is adapted): returns how many adapted projections of
 * kind's group come before kind (its column in rank-wide steps) and *count how many there are.
 */
static int adapter_col(const model_config *c, int kind, int *first, int *count)
{
    const int g = group_first(kind);
    int before = 0;
    *first = -1;
    *count = 0;
    for (int k = g; c->lora_rank > 0 && k < g + group_size(g); ++k) {
        if (!(c->lora_targets & (1u << k)))
            continue;
        if (*first < 0)
            *first = k;
        before += k < kind;
        ++*count;
    }
    return before;
}

/*
 * A layer's buffers as slots, so that a mask says which of them a layer keeps; the adapters' x A^T
 * last, one slot per projection from P_WQ to P_WDOWN, of which a group's first adapted one holds
 * the group's (adapter_col).
 */
enum { S_H1, S_RSTD1, S_QKV, S_O, S_LSE, S_XMID, S_H2, S_RSTD2, S_GU, S_ACT, S_QKN, S_RSTDQK,
       S_U, SLOTS = S_U + P_WDOWN - P_WQ + 1 };
#define ALL_SLOTS ((1u << SLOTS) - 1)
/* What the ops form rebuilds: the RMSNorms' outputs and rstd (the q and k norms' rotated too), and
   SwiGLU's product. */
#define CHEAP_SLOTS                                                                           \
    ((1u << S_H1) | (1u << S_RSTD1) | (1u << S_H2) | (1u << S_RSTD2) | (1u << S_ACT) |       \
     (1u << S_QKN) | (1u << S_RSTDQK))

static void slots_of(layer_acts *A, llmcl_tensor **s[SLOTS])
{
    llmcl_tensor **named[S_U] = {&A->h1,    &A->rstd1, &A->qkv, &A->o,   &A->lse,
                                 &A->xmid,  &A->h2,    &A->rstd2, &A->gu, &A->act,
                                 &A->qkn,   &A->rstd_qk};
    for (int i = 0; i < S_U; ++i)
        s[i] = named[i];
    for (int k = P_WQ; k <= P_WDOWN; ++k)
        s[S_U + k - P_WQ] = &A->u[k];
}

/* The slots that layer l keeps from its forward to its backward under recompute form `form`. */
static unsigned kept_slots_in(int form, int l)
{
    if (form == RECOMPUTE_OPS)
        return ALL_SLOTS & ~CHEAP_SLOTS;
    return form > 0 && (l + 1) % form == 0 ? 0 : ALL_SLOTS;
}

static unsigned kept_slots(const model *m, int l) { return kept_slots_in(m->recompute, l); }

/* The form that model_alloc_acts allocates for: offload keeps no layer whole. */
static int form_of(int recompute, bool offload)
{
    return recompute == RECOMPUTE_NONE && offload ? RECOMPUTE_FULL : recompute;
}

/* A buffer's element type and shape: [d0] where d1 is 0, else [d0, d1]. */
typedef struct buf_spec {
    llmcl_dtype dt;
    int64_t d0, d1;
} buf_spec;

static uint64_t spec_bytes(buf_spec s)
{
    return (uint64_t)s.d0 * (uint64_t)(s.d1 ? s.d1 : 1) * llmcl_dtype_size(s.dt);
}

static llmcl_tensor *spec_tensor(model *m, buf_spec s)
{
    return new_tensor(m->ctx, s.dt, s.d1 ? 2 : 1, s.d0, s.d1);
}

/* A slot's buffer for b x t tokens; false for the x A^T of a projection without an adapter, and
   for the q and k norms' buffers without them. */
static bool slot_spec(const model *m, int slot, int b, int t, buf_spec *s)
{
    const model_config *c = &m->cfg;
    const int64_t n = (int64_t)b * t, q = (int64_t)c->heads * m->head_dim,
                  kv = (int64_t)c->kv_heads * m->head_dim;
    const int64_t width[S_U] = {[S_H1] = c->dim,   [S_QKV] = q + 2 * kv, [S_O] = q,
                                [S_XMID] = c->dim, [S_H2] = c->dim,      [S_GU] = 2 * c->ffn,
                                [S_ACT] = c->ffn,  [S_QKN] = q + kv};
    if ((slot == S_QKN || slot == S_RSTDQK) && !c->qk_norm)
        return false;
    if (slot == S_RSTDQK)
        *s = (buf_spec){LLMCL_F32, n * (c->heads + c->kv_heads), 0};
    else if (slot == S_RSTD1 || slot == S_RSTD2)
        *s = (buf_spec){LLMCL_F32, n, 0};
    else if (slot == S_LSE)
        *s = (buf_spec){LLMCL_F32, (int64_t)b * c->heads * t, 0};
    else if (slot < S_U)
        *s = (buf_spec){c->dtype, n, width[slot]};
    else {
        int first, count;
        adapter_col(c, P_WQ + slot - S_U, &first, &count);
        if (first != P_WQ + slot - S_U)
            return false;
        *s = (buf_spec){c->dtype, n, (int64_t)count * c->lora_rank};
    }
    return true;
}

static void acts_alloc(model *m, layer_acts *A, unsigned slots, int b, int t)
{
    llmcl_tensor **s[SLOTS];
    slots_of(A, s);
    buf_spec spec;
    for (int i = 0; i < SLOTS; ++i)
        if ((slots & (1u << i)) && slot_spec(m, i, b, t, &spec))
            *s[i] = spec_tensor(m, spec);
}

/* The bytes of the slots in `slots` for b x t tokens. */
static uint64_t slots_bytes(const model *m, unsigned slots, int b, int t)
{
    uint64_t bytes = 0;
    buf_spec spec;
    for (int i = 0; i < SLOTS; ++i)
        if ((slots & (1u << i)) && slot_spec(m, i, b, t, &spec))
            bytes += spec_bytes(spec);
    return bytes;
}

static void acts_free(layer_acts *A)
{
    llmcl_tensor **s[SLOTS];
    slots_of(A, s);
    for (int i = 0; i < SLOTS; ++i) {
        llmcl_tensor_destroy(*s[i]);
        *s[i] = NULL;
    }
}

/* Layer l's buffers: those it keeps, and in place of the others those that recomputation writes. */
static layer_acts acts_of(model *m, int l)
{
    layer_acts A = m->acts[l];
    llmcl_tensor **own[SLOTS], **lent[SLOTS];
    slots_of(&A, own);
    slots_of(&m->acts[m->rebuilt], lent);
    for (int i = 0; i < SLOTS; ++i)
        if (!*own[i])
            *own[i] = *lent[i];
    return A;
}

/*
 * The slots that recomputation rebuilds under `form`, and in *holder the set that holds them: a set
 * of their own at acts[layers], or the last layer's when that layer keeps everything and comes after
 * every layer that rebuilds (its backward is done before theirs begin, and its forward writes its
 * buffers after theirs).
 */
static unsigned rebuilt_slots(int form, int layers, int *holder)
{
    unsigned rebuilt = 0;
    int last = -1; /* the last layer that rebuilds something */
    for (int l = 0; l < layers; ++l) {
        const unsigned kept = kept_slots_in(form, l);
        rebuilt |= ALL_SLOTS & ~kept;
        last = kept == ALL_SLOTS ? last : l;
    }
    *holder = rebuilt && last < layers - 1 ? layers - 1 : layers;
    return rebuilt;
}

/* Each layer's buffers as its form keeps them, and those that recomputation rebuilds. */
static void alloc_layer_acts(model *m, int b, int t)
{
    const int layers = m->cfg.layers;
    m->acts = xcalloc((size_t)layers + 1, sizeof *m->acts);
    for (int l = 0; l < layers; ++l)
        acts_alloc(m, &m->acts[l], kept_slots(m, l), b, t);
    const unsigned rebuilt = rebuilt_slots(m->recompute, layers, &m->rebuilt);
    if (m->rebuilt == layers)
        acts_alloc(m, &m->acts[layers], rebuilt, b, t);
}

static const char *ordinal(int n)
{
    if (n % 100 >= 11 && n % 100 <= 13)
        return "th";
    return n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
}

void model_recompute_describe(const model *m, char *buf, size_t len)
{
    const int r = m->recompute, layers = m->cfg.layers;
    if (r == RECOMPUTE_NONE)
        snprintf(buf, len, "%s", "");
    else if (r == RECOMPUTE_OPS)
        snprintf(buf, len, "selective activation checkpointing of ops (RMSNorms and SwiGLU "
                           "recomputed)");
    else if (r == RECOMPUTE_FULL)
        snprintf(buf, len, "full activation checkpointing");
    else
        snprintf(buf, len, "selective activation checkpointing of every %d%s layer (%d of %d "
                           "recomputed)", r, ordinal(r), layers / r, layers);
}

/* The columns of the adapters' du scratch: rank times the adapters of the most adapted group. */
static int64_t widest_adapters(const model_config *c)
{
    int widest = 1;
    for (int k = P_WQ; k <= P_WDOWN; ++k) {
        int first, count;
        adapter_col(c, k, &first, &count);
        widest = count > widest ? count : widest;
    }
    return (int64_t)widest * c->lora_rank;
}

bool model_pref_takes_ref(const model_config *c)
{
    return c->preference && (c->pref.loss == LLMCL_PREF_DPO || c->pref.loss == LLMCL_PREF_IPO);
}

/* The buffers every form has beside the stream and the layers': where each goes in m, its spec. */
enum { FIXED_BUFFERS = 22 };
static int fixed_buffers(model *m, int b, int t, llmcl_tensor **where[FIXED_BUFFERS],
                         buf_spec spec[FIXED_BUFFERS])
{
    const model_config *c = &m->cfg;
    const llmcl_dtype dt = c->dtype;
    const int64_t n = (int64_t)b * t, q = (int64_t)c->heads * m->head_dim,
                  kv = (int64_t)c->kv_heads * m->head_dim;
    const struct {
        llmcl_tensor **where;
        buf_spec spec;
        bool backward; /* read or written only by the backward: a frozen model has none */
    } all[FIXED_BUFFERS] = {{&m->hfinal, {dt, n, c->dim}, false},
                            {&m->rstd_final, {LLMCL_F32, n, 0}, false},
                            {&m->lse_ce, {LLMCL_F32, n, 0}, false},
                            {&m->loss, {LLMCL_F32, 1, 0}, false},
                            {&m->ids, {LLMCL_I32, n, 0}, false},
                            {&m->targets, {LLMCL_I32, n, 0}, false},
                            {&m->positions, {LLMCL_I32, t, 0}, false},
                            {&m->doc_pos, {LLMCL_I32, n, 0}, false},
                            {&m->doc_offsets, {LLMCL_I32, n + 1, 0}, false},
                            {&m->dres, {dt, n, c->dim}, true},
                            {&m->dh, {dt, n, c->dim}, true},
                            {&m->dh32, {LLMCL_F32, n, c->dim}, true},
                            {&m->da, {dt, n, c->ffn}, true},
                            {&m->dattn, {dt, n, q}, true},
                            {&m->dqkv, {dt, n, q + 2 * kv}, true},
                            {&m->dnorm_w, {LLMCL_F32, c->dim > m->head_dim ? c->dim
                                                                          : m->head_dim, 0}, true},
                            {&m->logits_last, {LLMCL_F32, 1, c->vocab}, false},
                            {&m->du, {dt, n, widest_adapters(c)}, true},
                            {&m->ones, {dt, n, 0}, true},
                            {&m->kd_loss, {LLMCL_F32, 1, 0}, false},
                            {&m->pref_logps, {LLMCL_F32, b, 0}, false},
                            {&m->ref_logps, {LLMCL_F32, b, 0}, false}};
    int count = 0;
    for (int i = 0; i < FIXED_BUFFERS; ++i) {
        if ((all[i].backward && c->frozen) || (all[i].where == &m->du && c->lora_rank == 0) ||
            (all[i].where == &m->ones && !c->qkv_bias && !c->o_bias) ||
            (all[i].where == &m->kd_loss && c->distill_alpha <= 0) ||
            (all[i].where == &m->pref_logps && !c->preference) ||
            (all[i].where == &m->ref_logps && !model_pref_takes_ref(c)))
            continue;
        where[count] = all[i].where;
        spec[count++] = all[i].spec;
    }
    return count;
}

/* One tensor of the residual stream. */
static buf_spec stream_spec(const model *m, int b, int t)
{
    return (buf_spec){m->cfg.dtype, (int64_t)b * t, m->cfg.dim};
}

/* Stream tensors: one per layer input and the output, or a ring of two where no backward reads
   a layer's input on the device again (offloading; a frozen model, which runs none). */
static int streams(const model *m, bool offload)
{
    return offload || m->cfg.frozen ? 2 : m->cfg.layers + 1;
}
static int stream_count(const model *m) { return streams(m, m->off != NULL); }

/* Drops the host copies of a forward that no backward consumed. */
static llmcl_status release_saved(model *m)
{
    for (int l = 0; m->saved && l < m->cfg.layers; ++l)
        if (m->saved[l].id) {
            TRY(llmcl_offload_release(m->off, m->saved[l]));
            m->saved[l].id = 0;
        }
    return LLMCL_OK;
}

static void free_acts(model *m)
{
    if (m->off) {
        release_saved(m);
        llmcl_offload_destroy(m->off);
    }
    for (int l = 0; m->xs && l < stream_count(m); ++l)
        llmcl_tensor_destroy(m->xs[l]);
    m->off = NULL;
    free(m->saved);
    m->saved = NULL;
    free(m->xs);
    m->xs = NULL;
    for (int l = 0; m->acts && l <= m->cfg.layers; ++l)
        acts_free(&m->acts[l]);
    free(m->acts);
    m->acts = NULL;
    llmcl_tensor **where[FIXED_BUFFERS];
    buf_spec spec[FIXED_BUFFERS];
    const int count = fixed_buffers(m, 1, 1, where, spec);
    for (int i = 0; i < count; ++i) {
        llmcl_tensor_destroy(*where[i]);
        *where[i] = NULL;
    }
    free(m->doc_offsets_host);
    m->doc_offsets_host = NULL;
    m->docs = 0;
}

uint64_t model_acts_bytes(model *m, int b, int t, int recompute, bool offload)
{
    const int layers = m->cfg.layers, form = form_of(recompute, offload);
    uint64_t bytes = (uint64_t)streams(m, offload) * spec_bytes(stream_spec(m, b, t));
    for (int l = 0; l < layers; ++l)
        bytes += slots_bytes(m, kept_slots_in(form, l), b, t);
    int holder;
    const unsigned rebuilt = rebuilt_slots(form, layers, &holder);
    if (holder == layers)
        bytes += slots_bytes(m, rebuilt, b, t);
    llmcl_tensor **where[FIXED_BUFFERS];
    buf_spec spec[FIXED_BUFFERS];
    const int count = fixed_buffers(m, b, t, where, spec);
    for (int i = 0; i < count; ++i)
        bytes += spec_bytes(spec[i]);
    return bytes;
}

llmcl_status model_alloc_acts(model *m, int b, int t, int recompute, bool offload)
{
    free_acts(m);
    llmcl_ctx *ctx = m->ctx;
    const model_config *c = &m->cfg;
    if (recompute < RECOMPUTE_OPS)
        die("model: recompute form %d is none of RECOMPUTE_NONE, _OPS or a layer interval >= 1",
            recompute);
    m->max_b = b;
    m->max_t = t;
    m->recompute = form_of(recompute, offload);
    if (offload) {
        /* every layer's input, each rounded up to the pool's 256-byte blocks */
        const uint64_t one = (spec_bytes(stream_spec(m, b, t)) + 255) / 256 * 256;
        TRY(llmcl_offload_create(ctx, one * (uint64_t)c->layers, &m->off));
        m->saved = xcalloc((size_t)c->layers, sizeof *m->saved);
    }
    m->xs = xcalloc((size_t)stream_count(m), sizeof *m->xs);
    for (int l = 0; l < stream_count(m); ++l)
        m->xs[l] = spec_tensor(m, stream_spec(m, b, t));
    alloc_layer_acts(m, b, t);
    llmcl_tensor **where[FIXED_BUFFERS];
    buf_spec spec[FIXED_BUFFERS];
    const int count = fixed_buffers(m, b, t, where, spec);
    for (int i = 0; i < count; ++i)
        *where[i] = spec_tensor(m, spec[i]);
    if (m->ones)
        CHECK(llmcl_fill(ctx, m->ones, 1.0), ctx);
    m->doc_offsets_host = xmalloc(((size_t)b * t + 1) * sizeof *m->doc_offsets_host);
    int32_t *pos = xmalloc((size_t)t * sizeof *pos);
    for (int i = 0; i < t; ++i)
        pos[i] = i;
    CHECK(llmcl_tensor_upload(m->positions, pos, (size_t)t * sizeof *pos), ctx);
    free(pos);
    return LLMCL_OK;
}

void model_destroy(model *m)
{
    if (!m)
        return;
    free_acts(m);
#ifdef LLMCL_TRAIN_MPI
    zero_detach(m); /* its views, which the parameters point at while a group is open, go too */
#endif
    for (int i = 0; i < m->n_params; ++i) {
        model_param *p = &m->params[i];
        llmcl_tensor *vs[] = {p->w, p->master, p->grad, p->m, p->v, p->w16};
        for (int j = 0; j < 6; ++j)
            llmcl_tensor_destroy(vs[j]);
    }
    for (int g = 0; m->group_grads && g < model_groups(m); ++g)
        llmcl_tensor_destroy(m->group_grads[g]);
    free(m->group_grads);
    free(m->params);
    free(m->index);
    set_free(&m->trainable);
    set_free(&m->frozen);
    free(m);
}

/* ---- building blocks ---- */

static llmcl_rmsnorm_options norm_opts(const model *m)
{
    return (llmcl_rmsnorm_options){.eps = m->cfg.norm_eps};
}

/* RoPE over b x t tokens: at positions 0..t-1 in every row, or each document's own. */
static llmcl_rope_options rope_opts(const model *m, arena *a, int b, int t)
{
    const int64_t bt[2] = {b, t};
    return (llmcl_rope_options){.layout = LLMCL_ROPE_BTHD,
                                .positions = m->docs ? view(a, m->doc_pos, 2, bt, NULL, 0)
                                                     : head(a, m->positions, t),
                                .theta = m->cfg.rope_theta,
                                .llama3_factor = m->cfg.rope_llama3_factor};
}

/* y = x w^T. */
static llmcl_status linear(llmcl_ctx *ctx, const llmcl_tensor *x, const llmcl_tensor *w,
                           llmcl_tensor *y)
{
    const llmcl_matmul_opts o = {.trans_b = 1};
    return llmcl_matmul(ctx, 1.0f, x, w, 0.0f, y, &o);
}

/*
 * LoRA costs one thin product more than the base projection in the forward and three in the
 * backward. u = s x A^T, the scale s in the matmul's alpha, is kept from the forward (never
 * recomputed); the base product goes on along K with the adapter (the matmul's a_ext and b_ext):
 * y = [x, u] [W, B]^T, dx = [dy, du] [W; A], so that neither y nor dx is read and written a
 * second time (on the H200 those rank-16 updates ran at half the copy rate, 10% of the 1B
 * model's step); frozen base weights skip their weight-gradient product entirely. The adapters
 * of q, k and v (or gate and up) share their x A^T, dA and dx products where their A's lie side
 * by side (stacked_adapters).
 */
/* u = s x A^T for the adapters whose A's are aw (one, or stacked side by side). */
static llmcl_status adapter_u(model *m, const llmcl_tensor *x, const llmcl_tensor *aw,
                              llmcl_tensor *u)
{
    const llmcl_matmul_opts o = {.trans_b = 1};
    return PROF(F_MATMUL_FWD, llmcl_matmul(m->ctx, m->lora_scale, x, aw, 0.0f, u, &o));
}

/* Whether the forward applies p's adapter: not while the model serves as its own reference. */
static bool adapted(const model *m, const model_param *p) { return p->lora_a && !m->adapters_off; }

/* y = x W^T (+ res, + bias) and, where p is adapted, + u B^T in the same product. */
static llmcl_status proj_product(model *m, const model_param *p, const llmcl_tensor *x,
                                 const llmcl_tensor *res, llmcl_tensor *y, const llmcl_tensor *u)
{
    const bool lora = adapted(m, p);
    const llmcl_matmul_opts o = {.trans_b = 1,
                                 .c_in = res,
                                 .bias = p->bias ? p->bias->w : NULL,
                                 .a_ext = lora ? u : NULL,
                                 .b_ext = lora ? p->lora_b->w : NULL};
    return PROF(F_MATMUL_FWD, llmcl_matmul(m->ctx, 1.0f, x, p->w, res ? 1.0f : 0.0f, y, &o));
}

llmcl_status model_proj_forward(model *m, const model_param *p, const llmcl_tensor *x,
                                const llmcl_tensor *res, llmcl_tensor *y, llmcl_tensor *u)
{
    if (adapted(m, p))
        TRY(adapter_u(m, x, p->lora_a->w, u));
    return proj_product(m, p, x, res, y, u);
}

/* The weight gradients' beta: 0 where their write replaces them (grads_fresh), else 1. */
static float grad_beta(const model *m) { return m->grads_fresh ? 0.0f : 1.0f; }

/* The first half of p's adapter's backward from dy: dB += dy^T u, du = s dy B. */
static llmcl_status adapter_down(model *m, const model_param *p, const llmcl_tensor *dy,
                                 const llmcl_tensor *u, llmcl_tensor *du)
{
    const llmcl_matmul_opts t = {.trans_a = 1};
    OP(F_MATMUL_DW, llmcl_matmul(m->ctx, 1.0f, dy, u, grad_beta(m), p->lora_b->grad, &t));
    return PROF(F_MATMUL_DX, llmcl_matmul(m->ctx, m->lora_scale, dy, p->lora_b->w, 0.0f, du,
                                          NULL));
}

/* dA += du^T x, for one adapter or stacked ones (their gradients g and du side by side). */
static llmcl_status adapter_da(model *m, llmcl_tensor *g, const llmcl_tensor *du,
                               const llmcl_tensor *x)
{
    const llmcl_matmul_opts t = {.trans_a = 1};
    return PROF(F_MATMUL_DW, llmcl_matmul(m->ctx, 1.0f, du, x, grad_beta(m), g, &t));
}

/* dx = dy W (+ dx_beta dx) and, with du and the A's aw, + du A in the same product. */
static llmcl_status proj_dx(model *m, const llmcl_tensor *w, const llmcl_tensor *dy,
                            float dx_beta, llmcl_tensor *dx, const llmcl_tensor *du,
                            const llmcl_tensor *aw)
{
    const llmcl_matmul_opts o = {.a_ext = du, .b_ext = aw};
    return PROF(F_MATMUL_DX, llmcl_matmul(m->ctx, 1.0f, dy, w, dx_beta, dx, &o));
}

/* A bias's gradient from dy [N, out]: grad = ones^T dy (or +=), one thin product. */
static llmcl_status bias_backward(model *m, const model_param *bias, const llmcl_tensor *dy)
{
    arena a = {0};
    const int64_t ones_shape[2] = {1, llmcl_tensor_dim(dy, 0)}, grad_shape[2] = {1, bias->numel};
    llmcl_tensor *ones = view(&a, m->ones, 2, ones_shape, NULL, llmcl_tensor_offset(m->ones));
    llmcl_tensor *g = view(&a, bias->grad, 2, grad_shape, NULL, llmcl_tensor_offset(bias->grad));
    const llmcl_status st =
        PROF(F_MATMUL_DW, llmcl_matmul(m->ctx, 1.0f, ones, dy, grad_beta(m), g, NULL));
    arena_clear(&a);
    return st;
}

/* The backward of an adapter whose base product ran without it (stacked beside adapters whose A's
   lie apart): dB, du, dA, and dx += du A. */
static llmcl_status adapter_apart_backward(model *m, const model_param *p, const llmcl_tensor *dy,
                                           const llmcl_tensor *x, const llmcl_tensor *u,
                                           llmcl_tensor *dx, llmcl_tensor *du)
{
    TRY(adapter_down(m, p, dy, u, du));
    TRY(adapter_da(m, p->lora_a->grad, du, x));
    return dx ? proj_dx(m, p->lora_a->w, du, 1.0f, dx, NULL, NULL) : LLMCL_OK;
}

/* The base projection's backward with the adapters' du and A's (or NULL) in its dx product: dx,
   the weight's and the bias's gradients. */
static llmcl_status base_backward(model *m, model_param *p, const llmcl_tensor *dy,
                                  const llmcl_tensor *x, float dx_beta, llmcl_tensor *dx,
                                  const llmcl_tensor *du, const llmcl_tensor *aw)
{
    const llmcl_matmul_opts t = {.trans_a = 1, .sumsq = m->grad_sumsq};
    if (dx)
        TRY(proj_dx(m, p->w, dy, dx_beta, dx, du, aw));
    if (p->trainable) {
        OP(F_MATMUL_DW, llmcl_matmul(m->ctx, 1.0f, dy, x, grad_beta(m), p->grad, &t));
        p->grad_summed = m->grad_sumsq != NULL;
    }
    if (p->bias && p->bias->trainable)
        TRY(bias_backward(m, p->bias, dy));
    return LLMCL_OK;
}

llmcl_status model_proj_backward(model *m, model_param *p, const llmcl_tensor *dy,
                                 const llmcl_tensor *x, const llmcl_tensor *u, float dx_beta,
                                 llmcl_tensor *dx, llmcl_tensor *du)
{
    if (!p->lora_a)
        return base_backward(m, p, dy, x, dx_beta, dx, NULL, NULL);
    TRY(adapter_down(m, p, dy, u, du));
    TRY(base_backward(m, p, dy, x, dx_beta, dx, du, p->lora_a->w));
    return adapter_da(m, p->lora_a->grad, du, x);
}

/* The first n rows of layer activations A's u for the projection of kind (its columns of its
   group's buffer, adapter_col), or NULL without an adapter. */
static llmcl_tensor *u_rows(const model *m, arena *a, const layer_acts *A, int kind, int64_t n)
{
    int first, count;
    const int col = adapter_col(&m->cfg, kind, &first, &count);
    if (!(m->cfg.lora_targets & (1u << kind)) || first < 0 || !A->u[first])
        return NULL;
    const int64_t r = m->cfg.lora_rank;
    return cols(a, A->u[first], n, col * r, r);
}

/* The first n rows of the u buffer of the group that begins at first: its adapters' side by side
   (NULL without one). */
static llmcl_tensor *group_u(const model *m, arena *a, const layer_acts *A, int first, int64_t n)
{
    int f, count;
    adapter_col(&m->cfg, first, &f, &count);
    return f >= 0 && A->u[f] ? rows(a, A->u[f], n) : NULL;
}

/* The first n rows of the adapters' du scratch from adapter column col, count adapters wide (or
   NULL without LoRA). */
static llmcl_tensor *du_cols(model *m, arena *a, int64_t n, int col, int count)
{
    const int64_t r = m->cfg.lora_rank;
    return m->du ? cols(a, m->du, n, col * r, count * r) : NULL;
}

/* Where a norm's backward writes its weight gradient: the gradient itself where that write
   replaces it (grads_fresh), else m->dnorm_w's first elements, which norm_grad then adds. */
static llmcl_tensor *norm_dw(const model *m, arena *a, const model_param *p)
{
    return p->trainable && m->grads_fresh ? p->grad : head(a, m->dnorm_w, p->numel);
}

/* Adds a norm's weight gradient (left in m->dnorm_w by norm_dw) when the norm is trained and its
   gradient holds a sum. */
static llmcl_status norm_grad(model *m, arena *a, const model_param *p)
{
    if (!p->trainable || m->grads_fresh)
        return LLMCL_OK;
    return PROF(F_ELEMENTWISE, llmcl_axpy(m->ctx, 1.0f, head(a, m->dnorm_w, p->numel), p->grad));
}

/* ---- forward ---- */

/* tensors[0..n), all [rows, cols] or all vectors, as one [rows of all, cols] view (or one vector)
   where each begins in the buffer where the one before it ends, else NULL. */
static llmcl_tensor *stacked(arena *a, llmcl_tensor *const *tensors, int n)
{
    const llmcl_tensor *first = tensors[0];
    const int nd = llmcl_tensor_ndim(first);
    const int64_t width = nd == 2 ? llmcl_tensor_dim(first, 1) : 1;
    int64_t height = 0;
    for (int i = 0; i < n; ++i) {
        const llmcl_tensor *t = tensors[i];
        if (!t || llmcl_tensor_ndim(t) != nd || llmcl_tensor_dtype(t) != llmcl_tensor_dtype(first) ||
            llmcl_tensor_cl_mem(t) != llmcl_tensor_cl_mem(first) ||
            (nd == 2 && (llmcl_tensor_dim(t, 1) != width || llmcl_tensor_stride(t, 0) != width)) ||
            llmcl_tensor_stride(t, nd - 1) != 1 ||
            llmcl_tensor_offset(t) != llmcl_tensor_offset(first) + height * width)
            return NULL;
        height += llmcl_tensor_dim(t, 0);
    }
    const int64_t shape[2] = {height, width};
    return view(a, first, nd, shape, NULL, llmcl_tensor_offset(first));
}

/* The biases of the projections that stacked_proj stacks, as one (*out, which *bias then points
   at), or none where they have none; false where some have one and some not, or where they do
   not lie one after another. */
static bool stacked_bias(model *m, arena *a, int l, int first, int count, model_param *out,
                         model_param **bias)
{
    llmcl_tensor *w[3], *g[3];
    int n = 0;
    for (int i = 0; i < count; ++i) {
        const model_param *b = param(m, first + i, l)->bias;
        if (b)
            w[n] = b->w, g[n++] = b->grad;
    }
    *bias = NULL;
    if (n == 0)
        return true;
    if (n != count)
        return false;
    const model_param *b0 = param(m, first, l)->bias;
    *out = (model_param){.trainable = b0->trainable};
    out->w = stacked(a, w, n);
    out->grad = out->trainable && out->w ? stacked(a, g, n) : NULL;
    out->numel = out->w ? llmcl_tensor_dim(out->w, 0) : 0;
    *bias = out;
    return out->w && (!out->trainable || out->grad);
}

/*
 * The projections of kinds first .. first + count - 1 of layer l (q, k and v, or gate and up) read
 * one input and write their outputs side by side in a row. Where their base weights are all
 * trained or all frozen and lie one after another (and so their gradients), which the parameters'
 * layout gives unless a view is padded, *out becomes one base projection over the stacked weight:
 * one product of each kind instead of count, the input read once, dx written once, and the 1B
 * model's narrow k and v products (at half cuBLAS's rate alone on the H200) inside a wide one.
 * Their adapters, if any, then run one by one on their columns.
 */
static bool stacked_proj(model *m, arena *a, int l, int first, int count, model_param *out,
                         model_param *bias)
{
    llmcl_tensor *w[3], *g[3]; /* count is 2 or 3 */
    const model_param *p0 = param(m, first, l);
    for (int i = 0; i < count; ++i) {
        const model_param *p = param(m, first + i, l);
        if (p->trainable != p0->trainable)
            return false;
        w[i] = p->w;
        g[i] = p->grad;
    }
    *out = (model_param){.trainable = p0->trainable};
    out->w = stacked(a, w, count);
    out->grad = out->trainable && out->w ? stacked(a, g, count) : NULL;
    return out->w && (!out->trainable || out->grad) &&
           stacked_bias(m, a, l, first, count, bias, &out->bias);
}

/*
 * The A's of the group's adapters stacked into *w (and with grads their gradients into *g), where
 * two or more lie one after another, which the parameters' layout gives (layout_params): then one
 * product reads x for all of them and one writes their share of dx, as for the base weights.
 * Returns how many adapters were stacked, 0 where they were not.
 */
static int stacked_adapters(model *m, arena *a, int l, int first, int count, bool grads,
                            llmcl_tensor **w, llmcl_tensor **g)
{
    llmcl_tensor *ws[3], *gs[3]; /* count is 2 or 3 */
    int n = 0;
    for (int i = 0; i < count; ++i) {
        const model_param *p = param(m, first + i, l);
        if (p->lora_a) {
            ws[n] = p->lora_a->w;
            gs[n++] = p->lora_a->grad;
        }
    }
    if (n < 2)
        return 0;
    *w = stacked(a, ws, n);
    *g = grads && *w ? stacked(a, gs, n) : NULL;
    return *w && (!grads || *g) ? n : 0;
}

/* Whether the forward applies an adapter of the group's projections. */
static bool group_adapted(model *m, int l, int first, int count)
{
    for (int i = 0; i < count; ++i)
        if (adapted(m, param(m, first + i, l)))
            return true;
    return false;
}

/*
 * y's n rows [x W_first^T, x W_first+1^T, ...] (stacked_proj's group): one product over the
 * stacked weights, or where adapters apply one a projection, each going on along K with its
 * adapter (the stacked product cannot: each adapter's u meets only its own columns).
 */
static llmcl_status group_forward(model *m, arena *a, int l, int first, int count,
                                  const layer_acts *A, llmcl_tensor *x, llmcl_tensor *y)
{
    const int64_t n = llmcl_tensor_dim(x, 0);
    model_param st, sb;
    llmcl_tensor *aw, *ag;
    const bool stack = stacked_proj(m, a, l, first, count, &st, &sb);
    if (stack && !group_adapted(m, l, first, count))
        return proj_product(m, &st, x, NULL, y, NULL);
    const int together =
        !m->adapters_off ? stacked_adapters(m, a, l, first, count, false, &aw, &ag) : 0;
    if (together) /* every adapter's u in one product, side by side in the group's buffer */
        TRY(adapter_u(m, x, aw, group_u(m, a, A, first, n)));
    int64_t col = 0;
    for (int i = 0; i < count; ++i) {
        const model_param *p = param(m, first + i, l);
        llmcl_tensor *yi = cols(a, y, n, col, p->shape[0]), *u = u_rows(m, a, A, first + i, n);
        TRY(together ? proj_product(m, p, x, NULL, yi, u)
                     : model_proj_forward(m, p, x, NULL, yi, u));
        col += p->shape[0];
    }
    return LLMCL_OK;
}

/* The columns of dy (the group's output gradients side by side in a row) of its projection i. */
static llmcl_tensor *member_dy(model *m, arena *a, int l, int first, int i, llmcl_tensor *dy)
{
    int64_t col = 0;
    for (int j = 0; j < i; ++j)
        col += param(m, first + j, l)->shape[0];
    return cols(a, dy, llmcl_tensor_dim(dy, 0), col, param(m, first + i, l)->shape[0]);
}

/* The group's backward where its base weights are not stacked: each projection's on its columns
   of dy, dx summed over them. */
static llmcl_status group_backward_apart(model *m, arena *a, int l, int first, int count,
                                         const layer_acts *A, llmcl_tensor *dy, llmcl_tensor *x,
                                         llmcl_tensor *dx, llmcl_tensor *du)
{
    const int64_t n = llmcl_tensor_dim(dy, 0);
    for (int i = 0; i < count; ++i) {
        model_param *p = param(m, first + i, l);
        p->grad_summed = false;
        TRY(model_proj_backward(m, p, member_dy(m, a, l, first, i, dy), x,
                                u_rows(m, a, A, first + i, n), i ? 1.0f : 0.0f, dx, du));
    }
    return LLMCL_OK;
}

/* The group's backward from dy, its output gradients side by side in a row: dx and the weights'
   gradients. */
static llmcl_status group_backward(model *m, arena *a, int l, int first, int count,
                                   const layer_acts *A, llmcl_tensor *dy, llmcl_tensor *x,
                                   llmcl_tensor *dx)
{
    const int64_t n = llmcl_tensor_dim(dy, 0);
    model_param st, sb;
    llmcl_tensor *aw, *ag, *du = du_cols(m, a, n, 0, 1);
    const bool stack = stacked_proj(m, a, l, first, count, &st, &sb);
    if (!stack)
        return group_backward_apart(m, a, l, first, count, A, dy, x, dx, du);
    const int together = stacked_adapters(m, a, l, first, count, true, &aw, &ag);
    /* the adapters' du before the stacked dx product, which then takes them along K: stacked
       ones each in its columns, one alone in du; several apart add du A after it */
    int adapters = 0, lone = -1;
    for (int i = 0; i < count; ++i)
        if (param(m, first + i, l)->lora_a)
            lone = adapters++ ? -1 : i;
    model_param *alone = !together && adapters == 1 ? param(m, first + lone, l) : NULL;
    for (int i = 0, k = 0; i < count; ++i) {
        const model_param *p = param(m, first + i, l);
        if (p->lora_a && (together || p == alone))
            TRY(adapter_down(m, p, member_dy(m, a, l, first, i, dy), u_rows(m, a, A, first + i, n),
                             together ? du_cols(m, a, n, k++, 1) : du));
    }
    const llmcl_tensor *ext_du = together ? du_cols(m, a, n, 0, together) : alone ? du : NULL;
    const llmcl_tensor *ext_aw = together ? aw : alone ? alone->lora_a->w : NULL;
    TRY(base_backward(m, &st, dy, x, 0.0f, dx, ext_du, ext_aw));
    for (int i = 0; i < count; ++i)
        param(m, first + i, l)->grad_summed = st.grad_summed;
    if (together || alone)
        return adapter_da(m, together ? ag : alone->lora_a->grad, ext_du, x);
    for (int i = 0; i < count; ++i) {
        const model_param *p = param(m, first + i, l);
        if (p->lora_a)
            TRY(adapter_apart_backward(m, p, member_dy(m, a, l, first, i, dy), x,
                                       u_rows(m, a, A, first + i, n), dx, du));
    }
    return LLMCL_OK;
}

/* Where k's and v's heads begin in a row of q, k and v side by side. */
static int64_t k_col(const model *m) { return (int64_t)m->cfg.heads * m->head_dim; }
static int64_t v_col(const model *m) { return k_col(m) + (int64_t)m->cfg.kv_heads * m->head_dim; }

/* An RMSNorm of kind (layer l's P_ATTN_NORM or P_MLP_NORM, or P_FINAL_NORM at -1): h and rstd of
   x's n rows. */
static llmcl_status norm_forward(model *m, arena *a, int kind, int l, llmcl_tensor *x,
                                 llmcl_tensor *h, llmcl_tensor *rstd, int64_t n)
{
    const llmcl_rmsnorm_options no = norm_opts(m);
    return PROF(F_NORM, llmcl_rmsnorm_forward(m->ctx, x, param(m, kind, l)->w, rows(a, h, n),
                                              head(a, rstd, n), &no));
}

/* The h heads of d from column col of the first n rows of a 2-D buffer, as [n, h, d]: the rows
   that the q and k norms normalise. */
static llmcl_tensor *nhd(arena *a, const llmcl_tensor *t, int64_t col, int64_t n, int h, int d)
{
    const int64_t shape[3] = {n, h, d}, strides[3] = {llmcl_tensor_dim(t, 1), d, 1};
    return view(a, t, 3, shape, strides, llmcl_tensor_offset(t) + col);
}

/* The rstd of the q norm's rows (k 0) or the k norm's (k 1) among A's rstd_qk for n tokens. */
static llmcl_tensor *rstd_qk(const model *m, arena *a, const layer_acts *A, int k, int64_t n)
{
    const int64_t len = n * (k ? m->cfg.kv_heads : m->cfg.heads);
    return view(a, A->rstd_qk, 1, &len, NULL,
                llmcl_tensor_offset(A->rstd_qk) + (k ? n * m->cfg.heads : 0));
}

/* The q and k norms' rows: q's heads (k 0) or k's (k 1) from column col of t. */
static llmcl_tensor *qk_rows(const model *m, arena *a, const llmcl_tensor *t, int k, int64_t n)
{
    return nhd(a, t, k ? k_col(m) : 0, n, k ? m->cfg.kv_heads : m->cfg.heads, m->head_dim);
}

/*
 * q and k as attention reads them: with qk_norm, q's and k's heads of the projections' qkv each
 * through its norm into qkn (qkv keeps them for the norms' backward); then RoPE in place. Returns
 * the buffer that holds them (qkv without the norms).
 */
static llmcl_status qk_forward(model *m, arena *a, int l, const layer_acts *A, int b, int t,
                               llmcl_tensor **qk)
{
    const model_config *c = &m->cfg;
    const int64_t n = (int64_t)b * t;
    const int d = m->head_dim;
    *qk = A->qkv;
    if (c->qk_norm) {
        const llmcl_rmsnorm_options no = norm_opts(m);
        for (int k = 0; k < 2; ++k)
            OP(F_NORM, llmcl_rmsnorm_forward(m->ctx, qk_rows(m, a, A->qkv, k, n),
                                             param(m, k ? P_KNORM : P_QNORM, l)->w,
                                             qk_rows(m, a, A->qkn, k, n), rstd_qk(m, a, A, k, n),
                                             &no));
        *qk = A->qkn;
    }
    const llmcl_rope_options ro = rope_opts(m, a, b, t);
    return PROF(F_ROPE, llmcl_rope_forward(m->ctx, bthd(a, *qk, 0, b, t, c->heads, d),
                                           bthd(a, *qk, k_col(m), b, t, c->kv_heads, d), &ro));
}

/* The q and k norms' backward, in place on dqkv's q and k columns, their weights' gradients. */
static llmcl_status qk_norm_backward(model *m, arena *a, int l, const layer_acts *A,
                                     llmcl_tensor *dqkv, int64_t n)
{
    const llmcl_rmsnorm_options no = norm_opts(m);
    for (int k = 0; k < 2; ++k) {
        model_param *w = param(m, k ? P_KNORM : P_QNORM, l);
        llmcl_tensor *dy = qk_rows(m, a, dqkv, k, n);
        OP(F_NORM, llmcl_rmsnorm_backward(m->ctx, dy, qk_rows(m, a, A->qkv, k, n), w->w,
                                          rstd_qk(m, a, A, k, n), dy, norm_dw(m, a, w), &no));
        TRY(norm_grad(m, a, w));
    }
    return LLMCL_OK;
}

/* Causal attention, within the sliding window where the model has one, and within each document
   where the batch packs several (their offsets checked on the host copy: no wait). */
static llmcl_attention_opts attention_opts(const model *m, arena *a)
{
    const int w = m->cfg.sliding_window;
    llmcl_attention_opts o = {.causal = 1, .use_window = w > 0, .window_left = w - 1,
                              .window_right = 0};
    if (m->docs) {
        o.cu_seqlens_q = o.cu_seqlens_k = head(a, m->doc_offsets, m->docs + 1);
        o.cu_seqlens_q_host = o.cu_seqlens_k_host = m->doc_offsets_host;
    }
    return o;
}

/* The h heads from column col of buf as attention reads them: [b, h, t, d] rows, or the b t
   tokens packed [N, h, d] when the batch holds documents. */
static llmcl_tensor *attn_heads(const model *m, arena *a, const llmcl_tensor *buf, int64_t col,
                                int b, int t, int h)
{
    return m->docs ? nhd(a, buf, col, (int64_t)b * t, h, m->head_dim)
                   : bhtd(a, buf, col, b, t, h, m->head_dim);
}

/* Attention's LSE of A: [b, heads, t], or [heads, N] packed. */
static llmcl_tensor *attn_lse(const model *m, arena *a, const layer_acts *A, int b, int t)
{
    const int64_t dense[3] = {b, m->cfg.heads, t}, packed[2] = {m->cfg.heads, (int64_t)b * t};
    return m->docs ? view(a, A->lse, 2, packed, NULL, 0) : view(a, A->lse, 3, dense, NULL, 0);
}

/* act = silu(gate) * up over n rows. */
static llmcl_status swiglu_forward(model *m, arena *a, const layer_acts *A, int64_t n)
{
    const int64_t ffn = m->cfg.ffn;
    return PROF(F_GLU, llmcl_glu_forward(m->ctx, LLMCL_ACT_SILU, cols(a, A->gu, n, 0, ffn),
                                         cols(a, A->gu, n, ffn, ffn), rows(a, A->act, n)));
}

/* A block's forward from x; xout (NULL when recomputing for the backward) receives its output. */
static llmcl_status layer_forward(model *m, arena *a, int l, const layer_acts *A, llmcl_tensor *x,
                                  llmcl_tensor *xout, int b, int t)
{
    llmcl_ctx *ctx = m->ctx;
    const model_config *c = &m->cfg;
    const int64_t n = (int64_t)b * t;
    llmcl_tensor *h1 = rows(a, A->h1, n), *xmid = rows(a, A->xmid, n), *h2 = rows(a, A->h2, n);
    TRY(norm_forward(m, a, P_ATTN_NORM, l, x, A->h1, A->rstd1, n));
    TRY(group_forward(m, a, l, P_WQ, 3, A, h1, rows(a, A->qkv, n)));
    llmcl_tensor *qk;
    TRY(qk_forward(m, a, l, A, b, t, &qk));
    const llmcl_attention_opts ao = attention_opts(m, a);
    OP(F_ATTENTION_FWD, llmcl_attention_forward(ctx, attn_heads(m, a, qk, 0, b, t, c->heads),
                                                attn_heads(m, a, qk, k_col(m), b, t, c->kv_heads),
                                                attn_heads(m, a, A->qkv, v_col(m), b, t,
                                                           c->kv_heads),
                                                &ao, attn_heads(m, a, A->o, 0, b, t, c->heads),
                                                attn_lse(m, a, A, b, t)));
    TRY(model_proj_forward(m, param(m, P_WO, l), rows(a, A->o, n), x, xmid,
                           u_rows(m, a, A, P_WO, n)));
    TRY(norm_forward(m, a, P_MLP_NORM, l, xmid, A->h2, A->rstd2, n));
    llmcl_tensor *act = rows(a, A->act, n);
    TRY(group_forward(m, a, l, P_WGATE, 2, A, h2, rows(a, A->gu, n)));
    TRY(swiglu_forward(m, a, A, n));
    const model_param *down = param(m, P_WDOWN, l);
    if (!xout) /* recomputing for the backward: of the last projection only its adapter's u */
        return down->lora_a ? adapter_u(m, act, down->lora_a->w, u_rows(m, a, A, P_WDOWN, n))
                            : LLMCL_OK;
    return model_proj_forward(m, down, act, xmid, xout, u_rows(m, a, A, P_WDOWN, n));
}

static llmcl_ce_options ce_opts(const model *m)
{
    return (llmcl_ce_options){.accumulate_weight_grad = !m->grads_fresh,
                              .chunk_bytes = m->cfg.ce_chunk_bytes,
                              .grad_scale = m->ce_grad_scale};
}

/* The stream tensor that holds layer l's input (l = layers: the last layer's output). */
static llmcl_tensor *stream(model *m, int l) { return m->xs[l % stream_count(m)]; }

/*
 * Block l's forward, offloading its input first when a backward follows. Its output overwrites
 * the ring slot of layer l-1's input, so that copy must have finished (a fence, not a host wait).
 */
static llmcl_status block_forward(model *m, arena *a, int l, int64_t n, int b, int t, bool save)
{
    llmcl_tensor *x = rows(a, stream(m, l), n);
    if (m->off && save)
        TRY(llmcl_offload_save(m->off, x, &m->saved[l]));
    if (m->off && l > 0 && m->saved[l - 1].id)
        TRY(llmcl_offload_fence(m->off, m->saved[l - 1]));
    const layer_acts A = acts_of(m, l);
    TRY(group_open(m, l + 1, GROUP_PARAMS));
    TRY(layer_forward(m, a, l, &A, x, rows(a, stream(m, l + 1), n), b, t));
    return group_close(m, l + 1, GROUP_PARAMS);
}

/*
 * Embedding, blocks and final norm over b x t tokens: m->hfinal holds the result. The head group
 * (the final norm's and the head's) is left open for the caller to close. targets (NULL: none)
 * go up with the ids, before any kernel of this forward is enqueued: an upload waits for the
 * queue, which is then as short as it gets (once the forward is enqueued, the wait would be for
 * all of it).
 */
static llmcl_status trunk_forward(model *m, arena *a, const int32_t *ids, const int32_t *targets,
                                  int b, int t, bool save)
{
    llmcl_ctx *ctx = m->ctx;
    const int64_t n = (int64_t)b * t;
    if (b > m->max_b || t > m->max_t || b < 1 || t < 1)
        die("model: %d x %d tokens exceed the activations' %d x %d", b, t, m->max_b, m->max_t);
    TRY(release_saved(m));
    llmcl_tensor *tids = head(a, m->ids, n);
    TRY(llmcl_tensor_upload(tids, ids, (size_t)n * sizeof *ids));
    if (targets)
        TRY(llmcl_tensor_upload(head(a, m->targets, n), targets, (size_t)n * sizeof *targets));
    TRY(group_open(m, 0, GROUP_PARAMS));
    OP(F_EMBEDDING_FWD,
       llmcl_embedding_forward(ctx, tids, param(m, P_EMBED, -1)->w, rows(a, stream(m, 0), n)));
    TRY(group_close(m, 0, GROUP_PARAMS));
    for (int l = 0; l < m->cfg.layers; ++l) {
        TRY(block_forward(m, a, l, n, b, t, save));
        arena_clear(a); /* views of one block at a time: a deep model's would overflow the arena */
    }
    TRY(group_open(m, model_head_group(m), GROUP_PARAMS));
    return norm_forward(m, a, P_FINAL_NORM, -1, rows(a, stream(m, m->cfg.layers), n), m->hfinal,
                        m->rstd_final, n);
}

/*
 * The loss of the batch in m->hfinal. When a backward follows and the model does not ask for the
 * fused form, one pass over chunks of tokens also writes the head's part of the gradients
 * (m->dh32 and the head's weight gradient, group 0's gradients opened here): three products of
 * the head where the fused form's forward and backward take four.
 */
static llmcl_status head_loss(model *m, arena *a, int64_t n, bool backward_follows)
{
    const llmcl_ce_options co = ce_opts(m);
    const model_param *headp = param(m, P_HEAD, -1);
    llmcl_tensor *hf = rows(a, m->hfinal, n), *tt = head(a, m->targets, n);
    if (!backward_follows || m->cfg.fused_ce)
        return PROF(F_CROSS_ENTROPY_FWD,
                    llmcl_fused_cross_entropy_forward(m->ctx, hf, headp->w, NULL, tt, &co, m->loss,
                                                      NULL, head(a, m->lse_ce, n)));
    TRY(group_open(m, model_head_group(m), GROUP_GRADS));
    llmcl_ce_options lco = co; /* the training step's own logits dtype (the fused form's: f32) */
    lco.logits_dtype = m->cfg.ce_logits_dtype;
    return PROF(F_CROSS_ENTROPY_FWD,
                llmcl_linear_cross_entropy_forward(m->ctx, hf, headp->w, NULL, tt, &lco, m->loss,
                                                   NULL, rows(a, m->dh32, n),
                                                   headp->trainable ? headp->grad : NULL, NULL));
}

/*
 * A training step's head under distillation: (1 - alpha) CE + alpha tau^2 D in one pass over the
 * logits, the divergence's call carrying the cross-entropy at weight (1 - alpha) / (alpha tau^2)
 * (Hinton's tau^2 the call's grad_scale): the student's logits product, its dhidden and its
 * head's gradient run once, not once for each part.
 */
static llmcl_status head_distill(model *m, arena *a, int64_t n)
{
    const model_config *c = &m->cfg;
    const float alpha = c->distill_alpha, tau = c->distill_temperature ? c->distill_temperature : 1;
    const float gs = m->ce_grad_scale ? m->ce_grad_scale : 1.0f, kd_weight = alpha * tau * tau;
    const model_param *headp = param(m, P_HEAD, -1), *theadp = param(m->teacher, P_HEAD, -1);
    TRY(group_open(m, model_head_group(m), GROUP_GRADS)); /* under --zero: the grads' views */
    const llmcl_distill_options dop = {.beta = c->distill_beta,
                                       .temperature = tau,
                                       .chunk_bytes = c->ce_chunk_bytes,
                                       .grad_scale = gs * kd_weight,
                                       .accumulate_weight_grad = !m->grads_fresh,
                                       .ce_weight = (1 - alpha) / kd_weight};
    OP(F_CROSS_ENTROPY_FWD,
       llmcl_linear_distill_forward(m->ctx, rows(a, m->hfinal, n), headp->w,
                                    rows(a, m->teacher->hfinal, n), theadp->w,
                                    head(a, m->targets, n), &dop, m->kd_loss, rows(a, m->dh32, n),
                                    headp->trainable ? headp->grad : NULL));
    OP(F_ELEMENTWISE, llmcl_fill(m->ctx, m->loss, 0.0));
    OP(F_ELEMENTWISE, llmcl_axpy(m->ctx, kd_weight, m->kd_loss, m->loss));
    return LLMCL_OK;
}

/*
 * A frozen model beside m (a teacher, a reference: `who`, m being `whose`): the same vocabulary,
 * whose distributions they compare token by token, and activations that take m's batches.
 */
static void check_frozen_fits(const model *m, const model *f, const char *who, const char *whose)
{
    if (f->cfg.vocab != m->cfg.vocab)
        die("the %s's vocabulary has %d tokens, the %s's %d: the losses compare their "
            "distributions token by token", who, f->cfg.vocab, whose, m->cfg.vocab);
    if (f->max_b < m->max_b || f->max_t < m->max_t)
        die("model: the %s's activations hold %d x %d tokens, the %s's batches %d x %d", who,
            f->max_b, f->max_t, whose, m->max_b, m->max_t);
}

void model_set_teacher(model *m, model *teacher)
{
    const model_config *c = &m->cfg, *tc = &teacher->cfg;
    if (c->distill_alpha <= 0 || !tc->frozen)
        die("model: a teacher needs distill_alpha > 0 on the student and a frozen model");
    check_frozen_fits(m, teacher, "teacher", "student");
    if (c->fused_ce)
        die("distillation runs on the chunked cross-entropy's path: not with --fused-ce");
    m->teacher = teacher;
}

/* The first b x t rows of a 2-D buffer as [b, t, width]: the preference loss's sequences. */
static llmcl_tensor *seqs(arena *a, const llmcl_tensor *t, int b, int tt)
{
    const int64_t shape[3] = {b, tt, llmcl_tensor_dim(t, 1)};
    return view(a, t, 3, shape, NULL, llmcl_tensor_offset(t));
}

/* The preference call's options for the model's batch: its loss, the supervised term's share,
   the chunks, the logits' dtype and the gradients' scale and accumulation. */
static llmcl_pref_options pref_opts(const model *m)
{
    llmcl_pref_options po = m->cfg.pref;
    po.nll_weight *= m->pref_nll_scale ? m->pref_nll_scale : 1.0f;
    po.chunk_bytes = m->cfg.ce_chunk_bytes;
    po.logits_dtype = m->cfg.ce_logits_dtype;
    po.grad_scale = m->ce_grad_scale ? m->ce_grad_scale : 1.0f;
    po.accumulate_weight_grad = !m->grads_fresh;
    return po;
}

/* The batch's b sequences' labels [b, t]. */
static llmcl_tensor *pref_labels(model *m, arena *a, int b, int t)
{
    const int64_t shape[2] = {b, t};
    return view(a, m->targets, 2, shape, NULL, llmcl_tensor_offset(m->targets));
}

/* m->ref_logps from the reference f's final hidden states and head (f is m->ref, or m itself
   with its adapters off): the same call with no loss and no gradients, in f's profile. */
static llmcl_status reference_logps(model *m, model *f, arena *a, int b, int t)
{
    const llmcl_pref_options po = pref_opts(m);
    return MODEL_PROF(f, F_CROSS_ENTROPY_FWD,
                      llmcl_linear_preference_forward(
                          m->ctx, seqs(a, f->hfinal, b, t), param(f, P_HEAD, -1)->w, NULL,
                          pref_labels(m, a, b, t), NULL, &po, NULL, head(a, m->ref_logps, b), NULL,
                          NULL, NULL));
}

/*
 * The head under a preference loss: the b rows are b / 2 chosen sequences, then their rejected
 * ones. DPO and IPO first take the reference's logps of each sequence (with a reference of its
 * own, here; as its own reference, before the trunk's forward); then one call gives the loss,
 * each sequence's logps and, where a backward follows, m->dh32 and the head's gradient
 * (accumulated after a step's first micro-batch), as head_distill's call does.
 */
static llmcl_status head_preference(model *m, arena *a, int b, int t, bool backward_follows)
{
    if (m->ref)
        TRY(reference_logps(m, m->ref, a, b, t));
    const llmcl_pref_options po = pref_opts(m);
    const model_param *headp = param(m, P_HEAD, -1);
    llmcl_tensor *dh = NULL, *dw = NULL;
    if (backward_follows) {
        TRY(group_open(m, model_head_group(m), GROUP_GRADS)); /* under --zero: the grads' views */
        dh = seqs(a, m->dh32, b, t);
        dw = headp->trainable ? headp->grad : NULL;
    }
    llmcl_tensor *ref_logps = m->ref || m->self_ref ? head(a, m->ref_logps, b) : NULL;
    return PROF(F_CROSS_ENTROPY_FWD,
                llmcl_linear_preference_forward(m->ctx, seqs(a, m->hfinal, b, t), headp->w, NULL,
                                                pref_labels(m, a, b, t), ref_logps, &po, m->loss,
                                                head(a, m->pref_logps, b), dh, dw, NULL));
}

/*
 * A LoRA policy as its own reference: the trunk with every adapter off, which is the starting
 * model while the adapters start from B = 0, and its logps into m->ref_logps; the batch's targets
 * go up here. Its kernels' time moves from the families to prof_ref_ms.
 */
static llmcl_status self_reference(model *m, arena *a, const int32_t *ids, const int32_t *targets,
                                   int b, int t)
{
    double families_ms[F_FAMILIES];
    memcpy(families_ms, m->prof_ms, sizeof families_ms);
    m->adapters_off = true;
    llmcl_status st = trunk_forward(m, a, ids, targets, b, t, false);
    if (st == LLMCL_OK)
        st = reference_logps(m, m, a, b, t);
    if (st == LLMCL_OK)
        st = group_close(m, model_head_group(m), GROUP_PARAMS);
    m->adapters_off = false;
    for (int f = 0; f < F_FAMILIES; ++f)
        m->prof_ref_ms += m->prof_ms[f] - families_ms[f];
    memcpy(m->prof_ms, families_ms, sizeof families_ms);
    arena_clear(a);
    return st;
}

void model_set_ref(model *m, model *ref)
{
    const model_config *c = &m->cfg, *rc = &ref->cfg;
    if (!model_pref_takes_ref(c) || !rc->frozen)
        die("model: a reference needs DPO or IPO on the policy and a frozen model");
    check_frozen_fits(m, ref, "reference model", "policy");
    m->ref = ref;
}

void model_set_self_ref(model *m)
{
    if (!model_pref_takes_ref(&m->cfg) || !m->cfg.lora_rank || m->ref)
        die("model: its own reference needs DPO or IPO, LoRA and no other reference");
    m->self_ref = true;
}

llmcl_status model_hidden_forward(model *m, const int32_t *ids, int b, int t)
{
    arena a = {0};
    llmcl_status st = trunk_forward(m, &a, ids, NULL, b, t, false);
    if (st == LLMCL_OK)
        st = group_close(m, model_head_group(m), GROUP_PARAMS);
    arena_clear(&a);
    return st;
}

llmcl_status model_forward(model *m, const int32_t *ids, const int32_t *targets, int b, int t,
                           bool backward_follows)
{
    arena a = {0};
    const int64_t n = (int64_t)b * t;
    llmcl_status st = m->self_ref ? self_reference(m, &a, ids, targets, b, t) : LLMCL_OK;
    if (st == LLMCL_OK)
        st = trunk_forward(m, &a, ids, m->self_ref ? NULL : targets, b, t, backward_follows);
    if (st == LLMCL_OK && m->cfg.preference)
        st = head_preference(m, &a, b, t, backward_follows);
    else if (st == LLMCL_OK && m->teacher && backward_follows)
        st = head_distill(m, &a, n);
    else if (st == LLMCL_OK)
        st = head_loss(m, &a, n, backward_follows);
    if (st == LLMCL_OK && !backward_follows)
        st = group_close(m, model_head_group(m), GROUP_PARAMS);
    arena_clear(&a);
    return st;
}

/* ---- backward ---- */

/*
 * The ops form's recomputation before layer l's backward: both RMSNorms (outputs and rstd) from the
 * input x and the kept xmid, the q and k norms and their RoPE from the kept projections, SwiGLU
 * from the kept gate and up. The same kernels on the same bits as in the forward, so the same bits
 * again.
 */
static llmcl_status layer_rebuild(model *m, arena *a, int l, const layer_acts *A, llmcl_tensor *x,
                                  int b, int t)
{
    const int64_t n = (int64_t)b * t;
    llmcl_tensor *qk;
    TRY(norm_forward(m, a, P_ATTN_NORM, l, x, A->h1, A->rstd1, n));
    if (m->cfg.qk_norm)
        TRY(qk_forward(m, a, l, A, b, t, &qk));
    TRY(norm_forward(m, a, P_MLP_NORM, l, rows(a, A->xmid, n), A->h2, A->rstd2, n));
    return swiglu_forward(m, a, A, n);
}

/* A block's backward: dres holds d(output) on entry and d(input) on return. */
static llmcl_status layer_backward(model *m, arena *a, int l, const layer_acts *A,
                                   llmcl_tensor *x, int b, int t)
{
    llmcl_ctx *ctx = m->ctx;
    const model_config *c = &m->cfg;
    const int64_t n = (int64_t)b * t;
    const int d = m->head_dim;
    const llmcl_rmsnorm_options no = norm_opts(m);
    llmcl_tensor *dres = rows(a, m->dres, n), *dh = rows(a, m->dh, n), *da = rows(a, m->da, n);
    llmcl_tensor *gu = rows(a, A->gu, n), *h2 = rows(a, A->h2, n);
    llmcl_tensor *gate = cols(a, A->gu, n, 0, c->ffn), *up = cols(a, A->gu, n, c->ffn, c->ffn);
    llmcl_tensor *du = du_cols(m, a, n, 0, 1);
    /* MLP */
    TRY(model_proj_backward(m, param(m, P_WDOWN, l), dres, rows(a, A->act, n),
                            u_rows(m, a, A, P_WDOWN, n), 0, da, du));
    OP(F_GLU, llmcl_glu_backward(ctx, LLMCL_ACT_SILU, da, gate, up, gate, up));
    TRY(group_backward(m, a, l, P_WGATE, 2, A, gu, h2, dh));
    OP(F_NORM, llmcl_residual_rmsnorm_backward(ctx, dh, dres, rows(a, A->xmid, n),
                                               param(m, P_MLP_NORM, l)->w, head(a, A->rstd2, n),
                                               dres, norm_dw(m, a, param(m, P_MLP_NORM, l)), &no));
    TRY(norm_grad(m, a, param(m, P_MLP_NORM, l)));
    /* attention */
    llmcl_tensor *h1 = rows(a, A->h1, n), *dqkv = rows(a, m->dqkv, n);
    TRY(model_proj_backward(m, param(m, P_WO, l), dres, rows(a, A->o, n),
                            u_rows(m, a, A, P_WO, n), 0, rows(a, m->dattn, n), du));
    const llmcl_attention_opts ao = attention_opts(m, a);
    llmcl_tensor *qk = c->qk_norm ? A->qkn : A->qkv;
    const int hq = c->heads, hkv = c->kv_heads;
    OP(F_ATTENTION_BWD,
       llmcl_attention_backward(
           ctx, attn_heads(m, a, qk, 0, b, t, hq), attn_heads(m, a, qk, k_col(m), b, t, hkv),
           attn_heads(m, a, A->qkv, v_col(m), b, t, hkv), attn_heads(m, a, A->o, 0, b, t, hq),
           attn_lse(m, a, A, b, t), attn_heads(m, a, m->dattn, 0, b, t, hq), &ao,
           attn_heads(m, a, dqkv, 0, b, t, hq), attn_heads(m, a, dqkv, k_col(m), b, t, hkv),
           attn_heads(m, a, dqkv, v_col(m), b, t, hkv)));
    const llmcl_rope_options ro = rope_opts(m, a, b, t);
    OP(F_ROPE, llmcl_rope_backward(ctx, bthd(a, dqkv, 0, b, t, c->heads, d),
                                   bthd(a, dqkv, k_col(m), b, t, c->kv_heads, d), &ro));
    if (c->qk_norm)
        TRY(qk_norm_backward(m, a, l, A, dqkv, n));
    TRY(group_backward(m, a, l, P_WQ, 3, A, dqkv, h1, dh));
    OP(F_NORM, llmcl_residual_rmsnorm_backward(ctx, dh, dres, x, param(m, P_ATTN_NORM, l)->w,
                                               head(a, A->rstd1, n), dres,
                                               norm_dw(m, a, param(m, P_ATTN_NORM, l)), &no));
    return norm_grad(m, a, param(m, P_ATTN_NORM, l));
}

/*
 * Block l's backward from its input: kept on the device, or brought back from the host with the
 * next block's input prefetched meanwhile. First recomputes the block when it kept only its input,
 * or what the ops form did not keep.
 */
static llmcl_status block_backward(model *m, arena *a, int l, int64_t n, int b, int t)
{
    llmcl_tensor *restored = NULL, *x;
    if (m->off) {
        if (l > 0)
            TRY(llmcl_offload_prefetch(m->off, m->saved[l - 1]));
        TRY(llmcl_offload_restore(m->off, m->saved[l], &restored));
        x = rows(a, restored, n);
    } else {
        x = rows(a, stream(m, l), n);
    }
    const layer_acts A = acts_of(m, l);
    const unsigned kept = kept_slots(m, l);
    llmcl_status st = group_open(m, l + 1, GROUP_PARAMS | GROUP_GRADS);
    if (st == LLMCL_OK && kept == 0)
        st = layer_forward(m, a, l, &A, x, NULL, b, t);
    else if (st == LLMCL_OK && kept != ALL_SLOTS)
        st = layer_rebuild(m, a, l, &A, x, b, t);
    if (st == LLMCL_OK)
        st = layer_backward(m, a, l, &A, x, b, t);
    if (st == LLMCL_OK)
        st = group_close(m, l + 1, GROUP_PARAMS | GROUP_GRADS);
    if (m->off) {
        arena_clear(a); /* the views of the restored tensor go before it */
        llmcl_tensor_destroy(restored);
        if (st == LLMCL_OK)
            st = llmcl_offload_release(m->off, m->saved[l]);
        m->saved[l].id = 0;
    }
    return st;
}

static llmcl_status backward(model *m, arena *a, int b, int t)
{
    llmcl_ctx *ctx = m->ctx;
    const int L = m->cfg.layers;
    const int64_t n = (int64_t)b * t;
    const llmcl_ce_options co = ce_opts(m);
    llmcl_tensor *hf = rows(a, m->hfinal, n), *dh32 = rows(a, m->dh32, n), *dres = rows(a, m->dres, n);
    model_param *headp = param(m, P_HEAD, -1), *fnorm = param(m, P_FINAL_NORM, -1);
    if (m->cfg.fused_ce) { /* the head group's parameters are still open from the forward */
        TRY(group_open(m, model_head_group(m), GROUP_GRADS));
        OP(F_CROSS_ENTROPY_BWD,
           llmcl_fused_cross_entropy_backward(ctx, hf, headp->w, NULL, head(a, m->targets, n),
                                              head(a, m->lse_ce, n), NULL, &co, dh32,
                                              headp->trainable ? headp->grad : NULL, NULL));
    }
    llmcl_tensor *dy = dh32;
    if (m->cfg.dtype != LLMCL_F32) {
        dy = rows(a, m->dh, n);
        OP(F_ELEMENTWISE, llmcl_cast(ctx, dh32, dy));
    }
    const llmcl_rmsnorm_options no = norm_opts(m);
    OP(F_NORM, llmcl_rmsnorm_backward(ctx, dy, rows(a, stream(m, L), n), fnorm->w,
                               head(a, m->rstd_final, n), dres, norm_dw(m, a, fnorm), &no));
    TRY(norm_grad(m, a, fnorm));
    TRY(group_close(m, model_head_group(m), GROUP_PARAMS | GROUP_GRADS));
    if (model_head_group(m) != 0) /* a tied head's group is final only after the embedding's */
        TRY(group_grads_final(m, model_head_group(m)));
    for (int l = L - 1; l >= 0; --l) {
        TRY(block_backward(m, a, l, n, b, t));
        arena_clear(a); /* views of one block at a time */
        TRY(group_grads_final(m, l + 1));
    }
    const model_param *embed = param(m, P_EMBED, -1);
    if (embed->trainable) {
        /* group 0's gradients (a second part where a tied head's came before the layers') */
        TRY(group_open(m, 0, GROUP_GRADS));
        /* the embedding's backward adds to the rows of the ids it meets: a fresh gradient starts
           from zero, unless a tied head's already holds the cross-entropy's */
        if (m->grads_fresh && !m->cfg.tied)
            OP(F_EMBEDDING_BWD, llmcl_fill(ctx, embed->grad, 0.0));
        OP(F_EMBEDDING_BWD, llmcl_embedding_backward(ctx, head(a, m->ids, n),
                                                     rows(a, m->dres, n), embed->grad));
        TRY(group_close(m, 0, GROUP_GRADS));
    }
    m->grads_fresh = false;
    return group_grads_final(m, 0);
}

llmcl_status model_backward(model *m, int b, int t)
{
    arena a = {0};
    const llmcl_status st = backward(m, &a, b, t);
    arena_clear(&a);
    return st;
}

/* ---- logits and sampling ---- */

/* model_logits with the head's group open. */
static llmcl_status head_logits(model *m, int64_t row0, int64_t rows, llmcl_tensor *out)
{
    arena a = {0};
    const int64_t shape[2] = {rows, m->cfg.dim};
    llmcl_tensor *h = view(&a, m->hfinal, 2, shape, NULL, row0 * m->cfg.dim);
    const llmcl_status st = linear(m->ctx, h, param(m, P_HEAD, -1)->w, out);
    arena_clear(&a);
    return st;
}

llmcl_status model_logits(model *m, int64_t row0, int64_t rows, llmcl_tensor *out)
{
    TRY(group_open(m, model_head_group(m), GROUP_PARAMS));
    TRY(head_logits(m, row0, rows, out));
    return group_close(m, model_head_group(m), GROUP_PARAMS);
}

llmcl_status model_set_documents(model *m, const int32_t *pos, const int32_t *offsets, int docs,
                                 int b, int t)
{
    const int64_t n = (int64_t)b * t;
    if (b > m->max_b || t > m->max_t || docs < 0 || docs > n ||
        (docs && (offsets[0] != 0 || offsets[docs] != n)))
        die("model: %d documents over %d x %d tokens (offsets from %d to %d) do not fit the "
            "activations' %d x %d", docs, b, t, docs ? offsets[0] : 0, docs ? offsets[docs] : 0,
            m->max_b, m->max_t);
    m->docs = docs;
    if (!docs)
        return LLMCL_OK;
    memcpy(m->doc_offsets_host, offsets, ((size_t)docs + 1) * sizeof *offsets);
    arena a = {0};
    llmcl_status st = llmcl_tensor_upload(head(&a, m->doc_pos, n), pos, (size_t)n * sizeof *pos);
    if (st == LLMCL_OK)
        st = llmcl_tensor_upload(head(&a, m->doc_offsets, docs + 1), offsets,
                                 ((size_t)docs + 1) * sizeof *offsets);
    arena_clear(&a);
    return st;
}

llmcl_status model_next_token(model *m, const int32_t *ids, int t, int32_t *next)
{
    m->docs = 0;
    arena a = {0};
    llmcl_status st = trunk_forward(m, &a, ids, NULL, 1, t, false);
    arena_clear(&a);
    TRY(st);
    TRY(head_logits(m, t - 1, 1, m->logits_last));
    TRY(group_close(m, model_head_group(m), GROUP_PARAMS));
    float *logits = xmalloc((size_t)m->cfg.vocab * sizeof *logits);
    st = llmcl_tensor_download(m->logits_last, logits, (size_t)m->cfg.vocab * sizeof *logits);
    int best = 0;
    for (int i = 1; i < m->cfg.vocab; ++i)
        if (logits[i] > logits[best])
            best = i;
    *next = best;
    free(logits);
    return st;
}
