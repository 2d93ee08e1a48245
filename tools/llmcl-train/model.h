/*
 * model.h: a decoder-only Llama-style transformer on llmcl's public API. Token embedding,
 * RMSNorm, RoPE (optionally with Llama 3 scaling), grouped-query causal attention, a SwiGLU MLP,
 * a tied or untied output head and the fused linear cross-entropy; the backward of all of it.
 * Mistral's, Qwen2's and Qwen3's variants are the same layers with biases, q and k norms, another
 * head dimension or a sliding window (model_config).
 *
 * Parameters live in flat device buffers, every tensor a view into them: the compute copy (bf16 or
 * f32), f32 master weights, f32 gradients and the two f32 moments. Norm weights have no compute
 * copy: they are used in f32 from the master buffer. Two such sets: the trainable one (one AdamW
 * launch updates it all) and the frozen one, which has no gradients or moments. Without LoRA every
 * weight is trainable; with LoRA (model_config.lora_rank > 0) the base weights are frozen, as PEFT
 * freezes them (embeddings and norms included), and the trainable set holds the adapters: per
 * adapted projection y = x W^T, A [r, in] and B [out, r], and y = x W^T + (alpha / r) (x A^T) B^T.
 * Under --offload-optimizer the trainable set's masters and moments live in pinned host memory
 * (offload_state.h), and each norm keeps an f32 copy of its weights on the device. In a 16-bit
 * model the frozen set keeps no masters (a LoRA base, a teacher, a reference): its matrices are
 * their 16-bit copy alone and each vector an f32 tensor of its own.
 */
#ifndef LLMCL_TRAIN_MODEL_H
#define LLMCL_TRAIN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmcl.h"

#define ZERO_GROUP_LAYERS_AUTO (-1) /* --zero-group-layers auto */

/* The Hugging Face architecture a model reads and writes as (config.json's model_type). */
typedef enum model_arch { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3, ARCH_COUNT } model_arch;

typedef struct model_config {
    int vocab, dim, layers, heads, kv_heads, ffn;
    int head_dim;             /* 0: dim / heads (Qwen3's and Mistral-Nemo's differ) */
    int max_seq;
    int tied;                 /* the output head is the embedding matrix */
    model_arch arch;
    int qkv_bias;             /* q, k and v projections add a bias (Qwen2's) */
    int o_bias;               /* the output projection adds one (Llama's attention_bias) */
    int qk_norm;              /* each head of q and k goes through an RMSNorm of its own weights
                                 before RoPE (Qwen3's q_norm and k_norm) */
    int sliding_window;       /* > 0: a query sees itself and the sliding_window - 1 keys before
                                 it (Mistral's), in every layer */
    float norm_eps;
    double rope_theta;
    double rope_llama3_factor; /* > 0: Llama 3 scaling with Llama 3.1's other constants */
    llmcl_dtype dtype;        /* compute dtype of matrices and activations: bf16, f16 or f32 */
    uint64_t ce_chunk_bytes;  /* the cross-entropy's scratch for one chunk of tokens (of the
                                 vocabulary with fused_ce; llmcl_ce_options.chunk_bytes); 0: the
                                 library's */
    llmcl_dtype ce_logits_dtype; /* the training steps' chunked cross-entropy keeps its logits
                                    in f32 (the default) or in the model's 16-bit dtype, as
                                    PyTorch's autocast does (llmcl_ce_options.logits_dtype) */
    int fused_ce;             /* training steps use the fused cross-entropy (forward, then a
                                 backward that recomputes the logits): less scratch, a product
                                 more; 0: one pass over chunks of tokens with the gradients */
    int lora_rank;            /* > 0: LoRA adapters of this rank, the base weights frozen */
    float lora_alpha;         /* the adapters' scale is lora_alpha / lora_rank */
    unsigned lora_targets;    /* the adapted projections: bit (1u << P_WQ) ... (1u << P_WDOWN) */
    llmcl_dtype lora_dtype;   /* f32: adapters keep f32 masters (their products still run in the
                                 compute dtype, as under autocast); bf16: adapters are bf16 only,
                                 AdamW rounds them stochastically (needs a bf16 model) */
    int zero_stage;           /* > 0: the parameters sharded over MPI_COMM_WORLD by ZeRO stage
                                 1, 2 or 3 (zero.h; llmcl-train built with MPI; under LoRA the
                                 adapters, the base whole on every rank) */
    int zero_group_layers;    /* under zero_stage: consecutive layers in one llmcl_dist group
                                 (0, unset, or ZERO_GROUP_LAYERS_AUTO: the most that cost no
                                 memory, zero.c) */
    llmcl_dtype zero_reduce_dtype; /* under zero_stage: the gradients on the wire, f32 (0, the
                                      default) or bf16 (llmcl_dist_opts.reduce_dtype) */
    uint64_t offload_chunk_bytes; /* > 0: the trainable set's masters and moments in pinned host
                                     memory, streamed through the device in chunks of this many
                                     bytes (offload_state.h; a 16-bit model, no LoRA, no ZeRO) */
    int frozen;               /* no parameter trains (a teacher, a reference): no gradients and
                                 no optimizer state, the weights kept as LoRA keeps its base */
    float distill_alpha;      /* > 0: a training step's loss is (1 - alpha) CE + alpha tau^2 D,
                                 D the divergence of llmcl_linear_distill_forward from
                                 model.teacher's distribution (model_set_teacher) */
    float distill_beta;       /* D's beta: 0 the forward KL, 1 the reverse, 0.5 the JSD */
    float distill_temperature; /* D's tau (0: 1) */
    int preference;           /* a training step's and an evaluation's loss is pref's
                                 llmcl_linear_preference_forward on batches of 2B rows, B chosen
                                 sequences then their B rejected ones; DPO and IPO take
                                 model.ref's per-sequence logps (model_set_ref, or a LoRA
                                 model's own base: model_set_self_ref) */
    llmcl_pref_options pref;  /* its loss and hyperparameters; the model sets grad_scale,
                                 accumulate_weight_grad and chunk_bytes */
    int optimizer_in_backward; /* the backward hands each layer group to model.on_group_grads
                                  as soon as its gradients are final, and the gradient buffer
                                  holds one group at a time (no ZeRO, no offloaded optimizer
                                  state, no bf16-only adapters) */
} model_config;

/* A readable reason why cfg is unusable, or NULL. */
const char *model_config_error(const model_config *cfg);

/* Whether cfg's preference loss compares with a reference model's logps: DPO and IPO. */
bool model_pref_takes_ref(const model_config *cfg);

/* The head dimension: cfg->head_dim, else dim / heads. */
int model_config_head_dim(const model_config *cfg);

/* The architectures' names in config.json: "llama", "mistral", "qwen2", "qwen3". */
const char *model_arch_name(model_arch arch);

/* Parameters per tensor kind: Llama's, then what other architectures add (biases, q and k norms),
   then the adapters' two kinds. A layer lays its own out as model.c's layout_params says. */
enum { P_EMBED, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_WO, P_MLP_NORM, P_WGATE, P_WUP, P_WDOWN, P_FINAL_NORM,
       P_HEAD, P_BQ, P_BK, P_BV, P_BO, P_QNORM, P_KNORM, P_LORA_A, P_LORA_B, P_KINDS };

/* Every projection LoRA may adapt, as model_config.lora_targets bits. */
#define LORA_ALL_TARGETS                                                                          \
    ((1u << P_WQ) | (1u << P_WK) | (1u << P_WV) | (1u << P_WO) | (1u << P_WGATE) | (1u << P_WUP) | \
     (1u << P_WDOWN))

/* The projections LoRA may adapt, by kind: "q_proj", ... ("" for the others). */
const char *model_module_name(int kind);

typedef struct offload_state offload_state;

/*
 * Flat device buffers that a set of parameters views. Under --offload-optimizer the trainable
 * set's masters and moments are in pinned host memory instead (offloaded; master, m and v NULL).
 * With optimizer_in_backward the trainable set's gradients are laid out by layer group instead
 * (model.c's group_grad_layout): grad holds grad_total elements.
 */
typedef struct param_set {
    int64_t total;              /* elements, every tensor at a 64-element boundary */
    int64_t grad_total;         /* elements of grad */
    llmcl_tensor *compute;      /* the 16-bit copy the forward uses; NULL for f32 */
    llmcl_tensor *master;       /* f32 weights; NULL for bf16-only adapters */
    llmcl_tensor *grad, *m, *v; /* f32; NULL for the frozen set */
    offload_state *offloaded;   /* the masters and moments on the host, or NULL */
} param_set;

typedef struct model_param model_param;
struct model_param {
    char name[96];         /* Hugging Face LlamaForCausalLM name, PEFT's for adapters */
    int kind, layer;
    int ndim;
    int64_t shape[2];
    int64_t numel, offset; /* elements; offset into its set's flat buffers */
    bool is_vector;        /* 1-D (norm weights, biases): used in f32, no weight decay */
    bool trainable;        /* in the trainable set: grad, m and v exist */
    llmcl_tensor *w;       /* what the forward computes with (a view of compute or master; a
                              norm's own f32 copy when the masters are offloaded) */
    llmcl_tensor *master, *grad, *m, *v; /* f32 views (NULL where the set has no such buffer) */
    llmcl_tensor *w16;     /* view of the 16-bit compute buffer, NULL for norms and f32 models */
    model_param *lora_a, *lora_b; /* a projection's adapter, or NULL */
    model_param *bias;     /* a projection's bias, or NULL */
    bool grad_summed;      /* its gradient's squares went to grad_sumsq (optimizer_step clears) */
};

/* Op families for the per-family split of a step's kernel time. */
enum { F_MATMUL_FWD, F_MATMUL_DX, F_MATMUL_DW, F_ATTENTION_FWD, F_ATTENTION_BWD, F_NORM, F_ROPE,
       F_GLU, F_CROSS_ENTROPY_FWD, F_CROSS_ENTROPY_BWD, F_EMBEDDING_FWD, F_EMBEDDING_BWD,
       F_ELEMENTWISE, F_OPTIMIZER, F_FAMILIES };

typedef struct layer_acts layer_acts;
typedef struct zero zero;

/*
 * Layer groups, in forward order: 0 holds the embedding; group l + 1 holds layer l (its adapters
 * too); the final norm and the head make the head group (model_head_group), group 0 with a tied
 * head, else the last, L + 1. ZeRO gathers and reduces by group (zero.h), and
 * optimizer_in_backward updates by group.
 */
/* What a layer group is opened for under --zero: its parameters (w), its gradients (grad). */
enum { GROUP_PARAMS = 1, GROUP_GRADS = 2 };

typedef struct model {
    llmcl_ctx *ctx;
    model_config cfg;
    int head_dim;
    int n_params;
    model_param *params;   /* the base weights in layout order, then the adapters */
    int *index;            /* the parameter of (layer + 1, kind) in params, -1 where none */
    param_set trainable, frozen;
    float lora_scale;      /* lora_alpha / lora_rank */
    uint64_t frozen_fingerprint; /* checkpoint.c's hash of the frozen weights; 0: not yet taken */
    zero *zero;            /* with zero_stage: the parameters' owner; w and grad are its views,
                              set only while their layer group is open (zero.h) */
    /* with optimizer_in_backward: called by model_backward once group's gradients are final
       (what it returns fails the backward), and per group the span of trainable.grad that holds
       its gradients (NULL where it has none) */
    llmcl_status (*on_group_grads)(void *arg, int group);
    void *on_group_grads_arg;
    llmcl_tensor **group_grads;
    /* the trainable gradients hold no sum yet: each one's first write in the next forward and
       backward replaces it (the caller's alternative to zeroing them), and model_backward clears
       this for the micro-batches that follow */
    bool grads_fresh;
    /* where set (the last micro-batch of a step that takes the gradients' norm), each weight
       gradient product adds the squares of the gradient it finishes, and marks its param */
    llmcl_sumsq *grad_sumsq;
    /* the cross-entropy's gradients are those of ce_grad_scale x the batch's mean loss (0: 1):
       the weight of a micro-batch in a step's mean over every target that learns */
    float ce_grad_scale;
    /* with distill_alpha: the teacher, whose forward on the same batch comes first (its final
       hidden states and head), and the distillation's loss before its weight */
    struct model *teacher;
    llmcl_tensor *kd_loss;
    /* with preference: the reference model of DPO and IPO (NULL for the others, and for a LoRA
       model that serves as its own, self_ref), whose forward on the same batch comes first, its
       per-sequence logps [2B] (ref_logps), and the model's own (pref_logps), which the trainer's
       rewards read */
    struct model *ref;
    bool self_ref;
    bool adapters_off; /* during self_ref's pass: the forward applies no adapter */
    llmcl_tensor *ref_logps, *pref_logps;
    /* with preference: the supervised term (cfg.pref.nll_weight, a mean over the batch's chosen
       targets) weighs this many times more (0: 1), the batch's share of a step's chosen targets,
       so that micro-batches and ranks add up to the mean over all of them, where the pairs'
       term, B pairs in every batch, weighs alike */
    float pref_nll_scale;

    /* activations for micro-batches of up to max_b x max_t tokens */
    int max_b, max_t;
    int recompute;         /* model_alloc_acts's form: RECOMPUTE_NONE, _OPS or every Nth layer */
    llmcl_offload *off;    /* with recompute: layer inputs go to pinned host memory */
    llmcl_offload_handle *saved; /* per layer: its input on the host, while a backward follows */
    llmcl_tensor **xs;     /* residual stream [N, dim]: layers + 1 tensors, or a ring of two when
                              offloading */
    layer_acts *acts;      /* per layer the buffers it keeps (none for a layer recomputed whole),
                              then at [layers] those that recomputation rebuilds, where no later
                              layer lends its own */
    int rebuilt;           /* the index in acts of the buffers that recomputation writes into */
    llmcl_tensor *hfinal, *rstd_final, *lse_ce, *loss, *ids, *targets, *positions;
    llmcl_tensor *dres, *dh, *dh32, *da, *dattn, *dnorm_w, *logits_last;
    llmcl_tensor *dqkv;    /* d(q), d(k) and d(v) side by side in a row [N, (heads + 2 kv_heads) d] */
    llmcl_tensor *du;      /* an adapter's d(x A^T) [N, rank] */
    llmcl_tensor *ones;    /* N ones, with biases: a bias's gradient is ones^T dy */
    /* packed documents (model_set_documents): each token's position [N], the documents' offsets
       [docs + 1] on the device and on the host; docs 0: every row one sequence */
    llmcl_tensor *doc_pos, *doc_offsets;
    int32_t *doc_offsets_host;
    int docs;

    /* profiling: every op a profiling region of its own (so each waits for its kernels), its
       kernel time added to prof_ms of its family */
    bool profiling;
    double prof_ms[F_FAMILIES];
    double prof_zero_ms; /* under --zero: the wall time of llmcl_dist's calls (zero.h) */
    double prof_ref_ms;  /* with self_ref: the kernel time of its reference's pass */
} model;

const char *model_family_name(int family);

/* Opens a profiling region when m->profiling; the end adds its kernel time to the family's and
   passes st through. */
void model_prof_begin(model *m);
llmcl_status model_prof_end(model *m, int family, llmcl_status st);

/* The status of expr, an op whose kernels' time goes to family's when profiling. */
#define MODEL_PROF(m, family, expr) model_prof_end((m), (family), (model_prof_begin(m), (expr)))

/*
 * Creates the parameters, initialised from seed as Llama does (normal(0, 0.02), norms 1) and the
 * adapters as PEFT does (A uniform in +-1/sqrt(in), which is kaiming_uniform_(a = sqrt(5)); B zero,
 * so the adapted model starts as the base model). With cfg->zero_stage they go into an llmcl_dist
 * (collective), and every call below that computes is collective too.
 */
llmcl_status model_create(llmcl_ctx *ctx, const model_config *cfg, uint64_t seed, model **out);

/* Rounds the f32 master weights into the compute copy (after loading or changing them). */
llmcl_status model_sync_compute(model *m);

/* The tensor that holds p's values: its master, else what the forward reads (its 16-bit copy, or
   a vector's own f32 tensor). */
llmcl_tensor *model_param_value(const model_param *p);

/*
 * Sets p from numel host f32 values: its model_param_value (rounded where that is 16-bit; the
 * compute copy of a master follows at model_sync_compute), or under --zero its shards, master and
 * compute copy (every rank passes the same values, at least in the part it keeps). Ends the
 * program on failure.
 */
void model_param_set(model *m, const model_param *p, const float *host);

/*
 * The f32 values of n parameters into hosts[i] (numel floats each): their model_param_value,
 * widened where it is 16-bit; under --zero gathered from every rank, each llmcl_dist group once,
 * where hosts[i] may be NULL on a rank that needs none (collective: every rank passes the same
 * parameters in the same order). Ends the program on failure.
 */
void model_params_get(model *m, int n, const model_param *const *ps, float *const *hosts);

/*
 * The part of p within elements [at, at + len) of its set's layout: returns how many of its
 * elements are there (0: none) and sets *first to the first one's place in the layout.
 */
int64_t model_param_within(const model_param *p, int64_t at, int64_t len, int64_t *first);

/*
 * Under --offload-optimizer: copies the norms' weights among elements [at, at + len) of the
 * trainable set from master (f32 [len], their masters on the device) into their f32 copies.
 */
llmcl_status model_norms_from(model *m, int64_t at, int64_t len, const llmcl_tensor *master);

/* The parameter called name (Hugging Face's or PEFT's), or NULL. */
model_param *model_find(model *m, const char *name);

/*
 * Activation checkpointing's forms (model_alloc_acts's recompute, llmcl-train's
 * --recompute[=full|ops|N]). N >= 1: the layers l with (l + 1) % N == 0 keep only their input and
 * are recomputed whole before their backward, the others keep everything (torchtitan's
 * selective_ac_option = N; N = 1, RECOMPUTE_FULL, is every layer). RECOMPUTE_OPS: every layer
 * keeps its products' outputs (q, k and v after RoPE, or as projected with qk_norm; xmid = x +
 * o Wo^T, gate, up, the adapters' x A^T) and attention's output with its LSE, and its RMSNorms
 * (the q and k norms with RoPE after them too) and SwiGLU are recomputed before its backward.
 */
enum { RECOMPUTE_NONE = 0, RECOMPUTE_FULL = 1, RECOMPUTE_OPS = -1 };

/*
 * Allocates activations for micro-batches of b x t tokens, only those that the recompute form
 * keeps (above); offload (with a form, RECOMPUTE_FULL when none is given) moves every layer's
 * input to pinned host memory during the forward and brings it back, one layer ahead, in the
 * backward.
 */
llmcl_status model_alloc_acts(model *m, int b, int t, int recompute, bool offload);

/* The device bytes that model_alloc_acts(m, b, t, recompute, offload) would allocate. */
uint64_t model_acts_bytes(model *m, int b, int t, int recompute, bool offload);

/* The recompute form in words ("" for none), for the trainer's start-up line. */
void model_recompute_describe(const model *m, char *buf, size_t len);

void model_destroy(model *m);

/* The number of parameters (the tied head counted once), and of those trained. */
int64_t model_param_count(const model *m);
int64_t model_trainable_count(const model *m);

/* Training FLOPs per token: 6 x trained and 4 x frozen parameters that multiply (no weight
   gradient), + causal attention, forward+backward. */
double model_flops_per_token(const model *m, int t);

/*
 * The projection p (a base matrix [out, in]) on x [N, in]: y = x w^T, or y = res + x w^T with a
 * residual res [N, out] (NULL: none; the matmul's addend, so res needs no copy into y first), and
 * with an adapter u = s x A^T [N, rank] (kept for the backward) and + u B^T in the same product.
 */
llmcl_status model_proj_forward(model *m, const model_param *p, const llmcl_tensor *x,
                                const llmcl_tensor *res, llmcl_tensor *y, llmcl_tensor *u);

/*
 * Its backward from dy [N, out]: dx = dy w (dx_beta 0) or dx += dy w (dx NULL: not wanted),
 * p->grad += dy^T x when p is trainable (its squares to m->grad_sumsq where set, and
 * p->grad_summed then set); with an adapter dB += dy^T u, du = s dy B (du [N, rank] scratch),
 * dA += du^T x and + du A in dx's product.
 */
llmcl_status model_proj_backward(model *m, model_param *p, const llmcl_tensor *dy,
                                 const llmcl_tensor *x, const llmcl_tensor *u, float dx_beta,
                                 llmcl_tensor *dx, llmcl_tensor *du);

/*
 * Forward over b x t tokens (ids and targets uploaded from host int32 arrays); writes the mean
 * cross-entropy into m->loss (on the device), or with cfg.preference the preference loss of the
 * b / 2 pairs (and each sequence's logps into m->pref_logps). With backward_follows it keeps
 * what the backward needs (offloading layer inputs where asked; under --zero the head's group
 * stays open for model_backward, which must come next); without, it is an evaluation.
 */
llmcl_status model_forward(model *m, const int32_t *ids, const int32_t *targets, int b, int t,
                           bool backward_follows);

/*
 * The documents of the b x t tokens of the forwards (and their backwards) that follow, until the
 * next call: pos gives each token's position in its document, offsets[0..docs] the documents'
 * bounds in the b t tokens (0 first, b t last, a row's bounds among them), and each document
 * attends only to itself (varlen attention). docs 0 (pos and offsets unused): every row is one
 * sequence at positions 0..t-1, which model_next_token always takes.
 */
llmcl_status model_set_documents(model *m, const int32_t *pos, const int32_t *offsets, int docs,
                                 int b, int t);

/*
 * Backward of the last forward: adds every trainable parameter's gradient to m->trainable.grad
 * (writes it, with grads_fresh set before the forward). With on_group_grads set, calls it for
 * each group as soon as the group's gradients are final: the head group (untied), layers L - 1
 * to 0's, then group 0.
 */
llmcl_status model_backward(model *m, int b, int t);

/* The forward up to the final hidden states (m->hfinal), no loss: a distillation teacher's. */
llmcl_status model_hidden_forward(model *m, const int32_t *ids, int b, int t);

/*
 * The teacher of m's distillation (cfg.distill_alpha > 0): a frozen model of the same vocabulary
 * whose activations take m's batches. Each training micro-batch runs model_hidden_forward on the
 * teacher before m's forward, which then reads the teacher's final hidden states.
 * Exits, saying why, where the two do not fit.
 */
void model_set_teacher(model *m, model *teacher);

/*
 * The reference model of m's preference loss (cfg.preference with DPO or IPO): a frozen model of
 * the same vocabulary whose activations take m's batches. Each forward of m (training and
 * evaluation) runs model_hidden_forward on the reference first; m's then takes its logps of the
 * batch's sequences. Exits, saying why, where the two do not fit.
 */
void model_set_ref(model *m, model *ref);

/*
 * A LoRA model as its own reference under DPO or IPO, in place of a second copy of its starting
 * model (TRL's reference for a PEFT model): each forward first runs the trunk with every adapter
 * off and takes that model's logps. Its adapters must start from B = 0 for it to be the starting
 * model. Exits, saying why, where m is not such a model.
 */
void model_set_self_ref(model *m);

/* out (f32 [rows, vocab]) = the logits of rows [row0, row0 + rows) of the last forward's tokens. */
llmcl_status model_logits(model *m, int64_t row0, int64_t rows, llmcl_tensor *out);

/* The next token after ids[0..t) by greedy decoding (the full forward over the prefix). */
llmcl_status model_next_token(model *m, const int32_t *ids, int t, int32_t *next);

/* The layer group of the final norm and the head: 0 with a tied head, else the last. */
int model_head_group(const model *m);

/* The number of layer groups, and the group of a parameter. */
int model_groups(const model *m);
int model_group(const model *m, const model_param *p);

#endif
