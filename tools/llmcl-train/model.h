/*
 * model.h: a decoder-only Llama-style transformer on llmcl's public API. Token embedding,
 * RMSNorm, RoPE (optionally with Llama 3 scaling), grouped-query causal attention, a SwiGLU MLP,
 * a tied or untied output head and the fused linear cross-entropy; the backward of all of it.
 *
 * Parameters live in flat device buffers, every tensor a view into them (so one AdamW launch
 * updates them all): the compute copy (bf16 or f32), f32 master weights, f32 gradients and the
 * two f32 moments. Norm weights have no compute copy: they are used in f32 from the master buffer.
 */
#ifndef LLMCL_TRAIN_MODEL_H
#define LLMCL_TRAIN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmcl.h"

typedef struct model_config {
    int vocab, dim, layers, heads, kv_heads, ffn;
    int max_seq;
    int tied;                 /* the output head is the embedding matrix */
    float norm_eps;
    double rope_theta;
    double rope_llama3_factor; /* > 0: Llama 3 scaling with Llama 3.1's other constants */
    llmcl_dtype dtype;        /* compute dtype of matrices and activations: bf16, f16 or f32 */
} model_config;

/* A readable reason why cfg is unusable, or NULL. */
const char *model_config_error(const model_config *cfg);

/* Parameters per tensor kind, in the order they are laid out. */
enum { P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_WO, P_MLP_NORM, P_WGATE, P_WUP, P_WDOWN, P_FINAL_NORM,
       P_HEAD, P_KINDS };

typedef struct model_param {
    char name[64];         /* Hugging Face LlamaForCausalLM name */
    int kind, layer;
    int ndim;
    int64_t shape[2];
    int64_t numel, offset; /* elements; offset into the flat buffers */
    bool is_norm;          /* f32 only, no weight decay */
    llmcl_tensor *w;       /* what the forward computes with (a view of compute or master) */
    llmcl_tensor *master, *grad, *m, *v; /* f32 views */
    llmcl_tensor *w16;     /* view of the 16-bit compute buffer, NULL for norms and f32 models */
} model_param;

/* Op families for the per-family split of a step's kernel time. */
enum { F_MATMUL, F_ATTENTION, F_NORM, F_ROPE, F_GLU, F_CROSS_ENTROPY, F_EMBEDDING, F_ELEMENTWISE,
       F_OPTIMIZER, F_FAMILIES };

typedef struct layer_acts layer_acts;

typedef struct model {
    llmcl_ctx *ctx;
    model_config cfg;
    int head_dim;
    int n_params;
    model_param *params;
    int64_t total;         /* elements in the flat buffers */
    llmcl_tensor *flat_compute, *flat_master, *flat_grad, *flat_m, *flat_v;

    /* activations for micro-batches of up to max_b x max_t tokens */
    int max_b, max_t;
    bool recompute;        /* activation checkpointing: keep layer inputs only */
    llmcl_offload *off;    /* with recompute: layer inputs go to pinned host memory */
    llmcl_offload_handle *saved; /* per layer: its input on the host, while a backward follows */
    llmcl_tensor **xs;     /* residual stream [N, dim]: layers + 1 tensors, or a ring of two when
                              offloading */
    layer_acts *acts;      /* one per layer, or one shared when recomputing */
    llmcl_tensor *hfinal, *rstd_final, *lse_ce, *loss, *ids, *targets, *positions;
    llmcl_tensor *dres, *dh, *dh32, *da, *dattn, *dq, *dk, *dv, *dnorm_w, *logits_last;

    /* profiling: every op a profiling region of its own (so each waits for its kernels), its
       kernel time added to prof_ms of its family */
    bool profiling;
    double prof_ms[F_FAMILIES];
} model;

const char *model_family_name(int family);

/* Opens a profiling region when m->profiling; the end adds its kernel time to the family's and
   passes st through. */
void model_prof_begin(model *m);
llmcl_status model_prof_end(model *m, int family, llmcl_status st);

/* Creates the parameters (initialised from seed as Llama does: normal(0, 0.02), norms 1). */
llmcl_status model_create(llmcl_ctx *ctx, const model_config *cfg, uint64_t seed, model **out);

/* Rounds the f32 master weights into the compute copy (after loading or changing them). */
llmcl_status model_sync_compute(model *m);

/*
 * Allocates activations for micro-batches of b x t tokens. recompute keeps only each layer's input
 * and recomputes the layer in the backward; offload (with recompute) moves those inputs to pinned
 * host memory during the forward and brings them back, one layer ahead, in the backward.
 */
llmcl_status model_alloc_acts(model *m, int b, int t, bool recompute, bool offload);

void model_destroy(model *m);

/* The number of parameters (the tied head counted once). */
int64_t model_param_count(const model *m);

/* Training FLOPs per token: 6 x (parameters that multiply) + causal attention, forward+backward. */
double model_flops_per_token(const model *m, int t);

/*
 * Forward over b x t tokens (ids and targets uploaded from host int32 arrays); writes the mean
 * cross-entropy into m->loss (on the device). With backward_follows it keeps what the backward
 * needs (offloading layer inputs where asked); without, it is an evaluation.
 */
llmcl_status model_forward(model *m, const int32_t *ids, const int32_t *targets, int b, int t,
                           bool backward_follows);

/* Backward of the last forward: adds every parameter's gradient to m->flat_grad. */
llmcl_status model_backward(model *m, int b, int t);

/* out (f32 [rows, vocab]) = the logits of rows [row0, row0 + rows) of the last forward's tokens. */
llmcl_status model_logits(model *m, int64_t row0, int64_t rows, llmcl_tensor *out);

/* The next token after ids[0..t) by greedy decoding (the full forward over the prefix). */
llmcl_status model_next_token(model *m, const int32_t *ids, int t, int32_t *next);

#endif
