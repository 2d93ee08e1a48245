/*
 * train.c: llmcl-train, a Llama-style decoder trained end to end on llmcl: options, the training
 * loop (gradient accumulation, global-norm clipping, warmup + cosine learning rate, the fused
 * AdamW), held-out evaluation, the progress line and a greedy sample at the end; a Hugging Face
 * checkpoint in (--init-from, its config.json setting the shape) and out (--export), LoRA; with
 * --zero under mpiexec, ZeRO over MPI ranks (zero.h), each rank training on its slice of the batch;
 * with --offload-optimizer the masters and moments in pinned host memory (offload_state.h); with
 * --teacher distillation from a frozen model, with --preference a preference loss (DPO, IPO,
 * SimPO, CPO, ORPO) on pairs, against a frozen reference model for DPO and IPO.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "data.h"
#include "hf.h"
#include "model.h"
#include "offload_state.h"
#include "optimizer.h"
#include "util.h"
#ifdef LLMCL_TRAIN_MPI
#include <mpi.h>

#include "zero.h"
#endif

/* Shape options that an --init-from config.json also sets, and LoRA's that --init-adapter's
   adapter_config.json sets. */
enum { OPT_DIM, OPT_LAYERS, OPT_HEADS, OPT_KV_HEADS, OPT_FFN, OPT_VOCAB, OPT_UNTIED, OPT_ROPE_THETA,
       OPT_ROPE_LLAMA3, OPT_LORA, OPT_LORA_ALPHA, OPT_LORA_TARGETS, OPT_ARCH, OPT_HEAD_DIM,
       OPT_WINDOW };
/* getopt_long's values of options past the letters, which are all taken. */
enum {
    LONG_DATA_FORMAT = 256,
    LONG_OPTIMIZER_IN_BACKWARD,
    LONG_ZERO_GROUP_LAYERS,
    LONG_ZERO_REDUCE_DTYPE,
    LONG_CE_LOGITS,
    LONG_INIT_ADAPTER,
    LONG_EXPORT_SHARD_GB,
    LONG_ARCH,
    LONG_HEAD_DIM,
    LONG_SLIDING_WINDOW,
    LONG_PACKING,
    LONG_TEACHER,
    LONG_DISTILL_ALPHA,
    LONG_DISTILL_BETA,
    LONG_DISTILL_TEMPERATURE,
    LONG_PREFERENCE,
    LONG_PREF_BETA,
    LONG_PREF_GAMMA,
    LONG_PREF_LABEL_SMOOTHING,
    LONG_PREF_NLL_WEIGHT,
    LONG_REF
};

typedef struct options {
    model_config model;
    const char *data, *val;
    data_format data_format;
    data_packing packing;
    bool packing_given;    /* --packing was given (--preference packs nothing) */
    int batch, seq, accum, steps, warmup; /* warmup -1 until set: not given */
    float lr, min_lr_frac, weight_decay, clip, beta1, beta2, eps;
    int eval_every, eval_batches, log_every, sample_tokens;
    const char *prompt;
    int recompute;         /* model.h's RECOMPUTE_NONE, RECOMPUTE_OPS, a layer interval, or
                              RECOMPUTE_AUTO until pick_recompute replaces it */
    int offload, profile;
    int offload_optimizer;
    double offload_chunk_mib;
    bool vocab_given;      /* the vocabulary is set: by --vocab or by config.json */
    int llama_vocab;       /* a Llama preset: its vocabulary is Llama 3's tokenizer's */
    unsigned given;        /* shape options given explicitly: bits (1u << OPT_DIM) ... */
    const char *init_from, *init_adapter, *export_dir, *dump_logits;
    const char *teacher;   /* --teacher: a Hugging Face checkpoint to distill from */
    const char *ref;       /* --ref: DPO's and IPO's reference model (NULL: the starting one) */
    double pref_beta, pref_gamma, pref_smoothing, pref_nll; /* --pref-*: NAN where not given */
    llmcl_dtype export_dtype;
    double export_shard_gb;
    bool export_opts_given; /* --export-dtype or --export-shard-gb, which need --export */
    bool lora_dtype_given;
    int lora_merge;
    int max_positions;     /* config.json's max_position_embeddings; 0: the run's --seq */
    const char *save, *resume;
    int save_every, save_on_interrupt;
    uint64_t seed;
    double peak_tflops;
} options;

static void usage(FILE *f)
{
    fputs("usage: llmcl-train [options]\n"
          "Trains a Llama-style decoder on llmcl's kernels. Without --data it trains a tiny model on a\n"
          "built-in corpus, small enough for a CPU OpenCL device.\n"
          "data:\n"
          "  --data FILE          text (byte-level tokens), an llm.c token file (.bin), or\n"
          "                       tokenized examples in JSON Lines (.jsonl: input_ids, and what\n"
          "                       learns by labels of -100, completion_mask or assistant_masks;\n"
          "                       packed into rows of --seq, each attending only to itself; a\n"
          "                       step's loss the mean over the targets that learn); a pattern\n"
          "                       ('train_*.bin', quoted) reads llm.c shards as one stream in name\n"
          "                       order, mapped rather than read into memory\n"
          "  --val FILE           held-out data, or a pattern (default: the last 5% of --data's\n"
          "                       tokens, or of its examples)\n"
          "  --data-format F      auto (default: a file named .bin or that starts with llm.c's\n"
          "                       magic must be an llm.c token file, one named .jsonl holds\n"
          "                       examples, any other is text), text, llmc or jsonl\n"
          "  --packing P          how examples fill the rows: bfd (default: best fit decreasing,\n"
          "                       the rows then in the file's order of their first examples) or\n"
          "                       greedy (in file order, a row ended where the next does not fit)\n"
          "model:\n"
          "  --preset NAME        tiny (default), llama-1b (Llama-3.2-1B's shape) or llama-8b\n"
          "                       (Llama-3-8B's: 8.0B parameters, untied, batch 1 x 8192)\n"
          "  --arch NAME          llama (default), mistral, qwen2 (q, k and v biases) or qwen3\n"
          "                       (q and k RMSNorms per head): the layers and the config.json\n"
          "                       that --export writes\n"
          "  --dim N --layers N --heads N --kv-heads N --ffn N --vocab N\n"
          "  --head-dim N         the heads' width (default dim / heads)\n"
          "  --sliding-window W   each token attends to itself and the W - 1 before it, in every\n"
          "                       layer (mistral, qwen2, qwen3; default 0: the whole sequence)\n"
          "  --untied             a separate output head (default: tied to the embeddings)\n"
          "  --rope-theta X       RoPE base (default 10000; llama-1b 500000)\n"
          "  --rope-llama3 X      Llama 3 RoPE scaling factor (0: off)\n"
          "  --dtype T            bf16 (default), f16 or f32 compute; master weights are f32\n"
          "  --init-from PATH     start from a Hugging Face checkpoint of LlamaForCausalLM,\n"
          "                       MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM: a\n"
          "                       folder (config.json + model.safetensors or its shards' index;\n"
          "                       the config sets the architecture and shape, options that\n"
          "                       contradict it are errors) or one .safetensors file (the options\n"
          "                       set them)\n",
          f);
    fputs("distillation (the chunked cross-entropy's path; under --zero the teacher whole on\n"
          "every rank):\n"
          "  --teacher PATH       a Hugging Face checkpoint of the same vocabulary, frozen, whose\n"
          "                       forward on each micro-batch comes first: the loss becomes\n"
          "                       (1 - A) CE + A T^2 D, D the divergence of its token\n"
          "                       distribution from the student's, both from one pass over f32\n"
          "                       logits (llmcl_linear_distill_forward with ce_weight); the\n"
          "                       held-out loss stays the cross-entropy\n"
          "  --distill-alpha A    D's weight in (0, 1] (default 0.5)\n"
          "  --distill-beta B     0: forward KL (default), 1: reverse KL, between: their\n"
          "                       generalised Jensen-Shannon divergence (0.5: JSD)\n"
          "  --distill-temperature T   both distributions at temperature T (default 1)\n",
          f);
    fputs("preference training (TRL's DPOTrainer, CPOTrainer and ORPOTrainer): --data is a\n"
          ".jsonl of tokenized pairs (prompt_input_ids, chosen_input_ids, rejected_input_ids),\n"
          "each sequence the prompt + a completion, cut to --seq or padded, its completion\n"
          "scored; a micro-batch of --batch B pairs is 2B sequences, the B chosen then the B\n"
          "rejected; a step's loss is the mean over its pairs (a supervised term's over its\n"
          "chosen completions' tokens), whatever --accum and --zero:\n"
          "  --preference LOSS    dpo, ipo (against a reference model), simpo, cpo or orpo\n"
          "                       (without one), through llmcl_linear_preference_forward on the\n"
          "                       head; each log line adds TRL's rewards/chosen, /rejected,\n"
          "                       /accuracies and /margins, beta (pi - ref) of the sequences'\n"
          "                       log-probabilities (ref 0 without a reference); the held-out\n"
          "                       loss is the same loss\n"
          "  --pref-beta F        the losses' beta (default 0.1; ORPO's lambda)\n"
          "  --pref-gamma F       SimPO's target margin (default 0.5, TRL's simpo_gamma)\n"
          "  --pref-label-smoothing F  dpo, simpo, cpo: the share in [0, 0.5] of flipped\n"
          "                       preferences (default 0)\n"
          "  --pref-nll-weight F  the chosen completions' mean cross-entropy added at weight F\n"
          "                       (TRL's rpo_alpha, cpo_alpha; default 1 for orpo, its supervised\n"
          "                       term, and cpo, as TRL's; 0 for the others)\n"
          "  --ref PATH           dpo, ipo: the reference model, a Hugging Face checkpoint folder\n"
          "                       of the same vocabulary, frozen (default: the starting model\n"
          "                       loaded a second time, --init-from's and --init-adapter's or the\n"
          "                       seeded one; under --zero whole on every rank; with --lora and\n"
          "                       no --init-adapter the policy itself with its adapters off,\n"
          "                       the same model, no second copy)\n",
          f);
    fputs("LoRA (base weights, embeddings and norms frozen; adapters trained):\n"
          "  --lora R             adapters of rank R (0: off, full fine-tuning)\n"
          "  --lora-alpha A       scale A / R (default A = R)\n"
          "  --lora-targets LIST  of q,k,v,o,gate,up,down (default: all seven)\n"
          "  --lora-dtype T       f32 (default: f32 masters, products in the compute dtype) or\n"
          "                       bf16 (bf16 adapters only, stochastic rounding; bf16 models;\n"
          "                       not under --zero)\n"
          "  --init-adapter DIR   start the adapters from a PEFT LoRA adapter (adapter_config.json\n"
          "                       + adapter_model.safetensors) of --init-from's model, or without\n"
          "                       --init-from of the local folder its base_model_name_or_path\n"
          "                       names; its config sets --lora, --lora-alpha and --lora-targets\n"
          "                       (options that contradict it are errors; use_rslora becomes\n"
          "                       alpha sqrt(R); lora_dropout is not applied)\n"
          "training:\n"
          "  --batch B --seq T    micro-batch of B sequences of T tokens\n"
          "  --accum K            micro-batches per step (gradient accumulation)\n"
          "  --steps N --lr X --min-lr F (fraction of lr at the end) --warmup N\n"
          "                       (lr default 3e-3; the llama presets 3e-4; warmup default 20,\n"
          "                       a tenth of --steps for runs of 20 steps or fewer)\n"
          "  --weight-decay X --clip X (global gradient norm; 0: off) --beta1 X --beta2 X --eps X\n"
          "  --recompute[=FORM]   activation checkpointing: the backward recomputes what the\n"
          "                       forward did not keep. full (the default): each layer keeps\n"
          "                       only its input; N: so do the layers l with (l + 1) % N = 0\n"
          "                       (every Nth, torchtitan's selective_ac_option = N), the others\n"
          "                       keep all; ops: every layer keeps its products' and attention's\n"
          "                       outputs, and its RMSNorms and SwiGLU are recomputed; auto:\n"
          "                       the first of none, ops, 2 and full that fits the device\n"
          "                       memory beside the weights, gradients and optimizer state\n"
          "  --offload            with --recompute, keep the layer inputs in pinned host memory\n"
          "  --offload-optimizer  keep the f32 master weights and AdamW moments (12 bytes a\n"
          "                       parameter) in pinned host memory and stream them through the\n"
          "                       device for each step (bf16 or f16 models; not with LoRA or --zero)\n"
          "  --offload-chunk-mib X  state per chunk of that stream (default 256, at most an\n"
          "                       eighth of the state); two chunks are on the device at a time\n"
          "  --optimizer-in-backward  AdamW updates each layer group as soon as the backward has\n"
          "                       its gradients, so that the gradients of one group at a time\n"
          "                       are on the device (a tied embedding's apart): the same bits as\n"
          "                       the update after the backward, in less memory; needs --clip 0\n"
          "                       and --accum 1 (not with --zero, --offload-optimizer or\n"
          "                       --lora-dtype bf16)\n"
          "  --seed N\n",
          f);
    fputs("  --zero S             under mpiexec -n N: ZeRO stage 1, 2 or 3 over the N ranks, each\n"
          "                       on its own --batch (the step's batch is N x --batch); checkpoints\n"
          "                       become folders that resume on any number of ranks; with --lora\n"
          "                       the adapters are sharded and the base is whole on every rank\n"
          "  --zero-group-layers K  K consecutive layers in each group that ZeRO gathers and\n"
          "                       reduces at once: fewer, larger collectives; auto (default):\n"
          "                       the most whose group is no larger than the embedding's (no\n"
          "                       more memory)\n"
          "  --zero-reduce-dtype T  the gradients on the wire: f32 (default) or bf16 (half the\n"
          "                       bytes; the ranks' bf16 parts summed in f32, and stages 2-3\n"
          "                       keep their gradient shard in bf16)\n"
          "output:\n"
          "  --eval-every N --eval-batches N (default 4; at most the held-out data's, which\n"
          "                       each evaluation reads once) --log-every N\n"
          "  --sample N           greedy tokens generated at the end (0: none)\n"
          "  --prompt TEXT        the sample's start (byte-level data)\n"
          "  --peak-tflops X      the device peak for MFU (default: measured)\n"
          "  --ce-chunk-mib N     scratch of the cross-entropy per chunk of tokens (default 3072):\n"
          "                       larger chunks, fewer and larger products\n"
          "  --ce-logits T        the training steps' logits: f32 (default) or the model's\n"
          "                       16-bit dtype, rounded as PyTorch's autocast rounds them (half\n"
          "                       the bytes; loss and gradients those of the rounded logits;\n"
          "                       under --preference the reference's logps too)\n"
          "  --fused-ce           the fused cross-entropy in chunks of the vocabulary: a forward,\n"
          "                       then a backward that computes the logits again (a product more,\n"
          "                       and --ce-chunk-mib can be as small as 64)\n"
          "  --profile            after training, one more step with each op timed on its own:\n"
          "                       its kernel time split by op family (a --teacher's forward\n"
          "                       one row); then one without waits:\n"
          "                       how much of its span no kernel ran\n"
          "checkpoints (safetensors: f32 weights under Hugging Face names, AdamW moments, step):\n"
          "  --save FILE          written at the end (and every --save-every N steps)\n"
          "  --save-on-interrupt  Ctrl-C writes --save before exiting\n"
          "  --resume FILE        continue from a checkpoint of the same model shape (with LoRA:\n"
          "                       adapters only, the same --init-from must give the base)\n"
          "export (Hugging Face's layout, at the end of the run):\n"
          "  --export DIR         model.safetensors + config.json; with LoRA PEFT's\n"
          "                       adapter_model.safetensors + adapter_config.json\n"
          "  --export-dtype T     bf16 (default) or f32\n"
          "  --export-shard-gb X  a model past X GB (10^9 bytes; default 5, as save_pretrained's\n"
          "                       max_shard_size) goes into shards with Hugging Face's index\n"
          "  --lora-merge         with LoRA: export W + (alpha / R) B A as a whole model instead\n"
          "  --dump-logits FILE   (checks) the f32 logits of the first held-out batch at the end,\n"
          "                       with its tokens and loss, as safetensors\n",
          f);
}

/*
 * The cross-entropy's chunk scratch: 4096 tokens of f32 logits and their bf16 copy at the 1B
 * preset's vocabulary. Fewer chunks read and write the head's f32 weight gradient fewer times:
 * on the H200 (docs/PERFORMANCE.md) the 1B preset ran 57.1k tokens/s with 2048-token chunks,
 * 57.8k with these (1.5 GB more at its peak, which stays below torch.compile's on the same model)
 * and 58.3k with one chunk of 8192 (4.5 GB more). Small chunks cost more: the fused form took
 * 101 ms a step with the library's 64 MiB and 57 ms with 1 GiB.
 */
#define TRAIN_CE_CHUNK_BYTES (3072ull << 20)

/*
 * --offload-optimizer's chunk of state: a 256 MiB copy takes about 10 ms at 25 GB/s, long beside a
 * copy's fixed cost, and the two chunks on the device cost 512 MiB, 3% of the 1B preset's 15 GB of
 * state.
 */
#define TRAIN_OFFLOAD_CHUNK_MIB 256

/*
 * The Llama presets' peak learning rate: Llama 3's for its 8B model, and the PyTorch yardstick's
 * (tools/llmcl-train/yardstick.py). The tiny model's 3e-3 made the 8B preset's loss jump from
 * 12.6 to 24 in its second step.
 */
#define LLAMA_PEAK_LR 3e-4f

static void preset(options *o, const char *name)
{
    o->llama_vocab = strncmp(name, "llama-", 6) == 0;
    if (strcmp(name, "tiny") == 0) {
        o->model = (model_config){.vocab = 256, .dim = 128, .layers = 4, .heads = 4, .kv_heads = 2,
                                  .ffn = 384, .tied = 1, .norm_eps = 1e-5f, .rope_theta = 10000,
                                  .dtype = LLMCL_BF16};
        o->batch = 8, o->seq = 64;
    } else if (strcmp(name, "llama-1b") == 0) {
        o->model = (model_config){.vocab = 128256, .dim = 2048, .layers = 16, .heads = 32,
                                  .kv_heads = 8, .ffn = 8192, .tied = 1, .norm_eps = 1e-5f,
                                  .rope_theta = 500000, .rope_llama3_factor = 32,
                                  .dtype = LLMCL_BF16};
        o->batch = 4, o->seq = 2048, o->lr = LLAMA_PEAK_LR;
    } else if (strcmp(name, "llama-8b") == 0) {
        o->model = (model_config){.vocab = 128256, .dim = 4096, .layers = 32, .heads = 32,
                                  .kv_heads = 8, .ffn = 14336, .tied = 0, .norm_eps = 1e-5f,
                                  .rope_theta = 500000, .dtype = LLMCL_BF16};
        o->batch = 1, o->seq = 8192, o->lr = LLAMA_PEAK_LR;
    } else {
        die("unknown --preset %s (tiny, llama-1b, llama-8b)", name);
    }
    o->model.ce_chunk_bytes = TRAIN_CE_CHUNK_BYTES;
}

static llmcl_dtype parse_dtype(const char *name, const char *s, bool f16)
{
    if (strcmp(s, "bf16") == 0)
        return LLMCL_BF16;
    if (f16 && strcmp(s, "f16") == 0)
        return LLMCL_F16;
    if (strcmp(s, "f32") == 0)
        return LLMCL_F32;
    die("--%s %s: expected bf16%s or f32", name, s, f16 ? ", f16" : "");
}

/* --arch: the architecture and what its layers have beside Llama's. */
static void set_arch(model_config *c, const char *name)
{
    int a = 0;
    while (a < ARCH_COUNT && strcmp(name, model_arch_name(a)) != 0)
        ++a;
    if (a == ARCH_COUNT)
        die("--arch %s: expected llama, mistral, qwen2 or qwen3", name);
    c->arch = a;
    c->qkv_bias = a == ARCH_QWEN2;
    c->o_bias = 0;
    c->qk_norm = a == ARCH_QWEN3;
}

/* A comma-separated list of q, k, v, o, gate, up, down as model.h's target bits. */
static unsigned parse_targets(const char *s)
{
    static const char *names[] = {"q", "k", "v", "o", "gate", "up", "down"};
    static const int kinds[] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};
    unsigned bits = 0;
    for (const char *p = s; *p;) {
        const size_t len = strcspn(p, ",");
        int i = 0;
        while (i < 7 && !(strlen(names[i]) == len && strncmp(p, names[i], len) == 0))
            ++i;
        if (i == 7)
            die("--lora-targets %s: '%.*s' is not one of q, k, v, o, gate, up, down", s,
                (int)len, p);
        bits |= 1u << kinds[i];
        p += len + (p[len] == ',');
    }
    if (!bits)
        die("--lora-targets: name at least one projection");
    return bits;
}

static long parse_int(const char *name, const char *s, long lo, long hi)
{
    long v;
    if (!util_parse_long(s, lo, hi, &v))
        die("--%s %s: expected an integer in [%ld, %ld]", name, s, lo, hi);
    return v;
}

/* A number in [lo, hi]; hi at most FLT_MAX, since most options' values end up in a float. */
static double parse_num(const char *name, const char *s, double lo, double hi)
{
    double v;
    if (util_parse_double(s, lo, hi, &v))
        return v;
    if (hi == FLT_MAX)
        die("--%s %s: expected a number >= %g (and below %g)", name, s, lo, hi);
    die("--%s %s: expected a number in [%g, %g]", name, s, lo, hi);
}

/* --zero-group-layers: auto or a count of layers. */
static int parse_group_layers(const char *s)
{
    if (strcmp(s, "auto") == 0)
        return ZERO_GROUP_LAYERS_AUTO;
    long v;
    if (!util_parse_long(s, 1, 1 << 20, &v))
        die("--zero-group-layers %s: expected auto or a count of layers from 1 to %d", s, 1 << 20);
    return (int)v;
}

/* --recompute=auto, which pick_recompute turns into one of model.h's forms. */
enum { RECOMPUTE_AUTO = -2 };

/*
 * --recompute's form (model.h): full, also without a value, ops, auto or a layer interval N >= 1.
 * next: the argument after a bare --recompute, which getopt would otherwise report as stray.
 */
static int parse_recompute(const char *s, const char *next)
{
    if (!s) {
        if (next && (strcmp(next, "full") == 0 || strcmp(next, "ops") == 0 ||
                     strcmp(next, "auto") == 0 || isdigit((unsigned char)next[next[0] == '-'])))
            die("--recompute takes its form after '=': --recompute=%s", next);
        return RECOMPUTE_FULL;
    }
    if (strcmp(s, "full") == 0)
        return RECOMPUTE_FULL;
    if (strcmp(s, "ops") == 0)
        return RECOMPUTE_OPS;
    if (strcmp(s, "auto") == 0)
        return RECOMPUTE_AUTO;
    long v;
    if (!util_parse_long(s, 1, 4096, &v))
        die("--recompute=%s: expected full, ops, auto or a layer interval N from 1 to 4096 (the "
            "layers l with (l + 1) %% N = 0 are recomputed)", s);
    return (int)v;
}

/* An unknown option, or one without its value: one line and exit status 2, as getopt's users do. */
__attribute__((noreturn)) static void bad_option(const char *arg)
{
    if (optopt)
        fprintf(stderr, "llmcl-train: %s needs a value (see --help)\n", arg);
    else
        fprintf(stderr, "llmcl-train: unknown option '%s' (see --help)\n", arg);
    exit(2);
}

/* Outputs that would overwrite each other, or the checkpoint a run resumes (which only --save may
   replace), refused. */
static void check_paths_apart(const options *o)
{
    const char *option[] = {"--save", "--export", "--dump-logits", "--resume"};
    const char *path[] = {o->save, o->export_dir, o->dump_logits, o->resume};
    for (int i = 0; i < 3; ++i)
        for (int j = i + 1; j < 4; ++j)
            if (path[i] && path[j] && !(i == 0 && j == 3) && same_place(path[i], path[j]))
                die("%s and %s both name %s", option[i], option[j], path[j]);
}

/* The files a run writes, checked before it trains (util.h), and --resume's checkpoint found. */
static void check_paths(const options *o)
{
    const bool zero = o->model.zero_stage > 0;
    if (o->save)
        check_output_path("--save", o->save, zero ? OUTPUT_FOLDER_REPLACED : OUTPUT_FILE);
    if (o->export_dir)
        check_output_path("--export", o->export_dir, OUTPUT_FOLDER_FILLED);
    if (o->dump_logits)
        check_output_path("--dump-logits", o->dump_logits, OUTPUT_FILE);
    check_paths_apart(o);
    if (!o->resume || access(o->resume, F_OK) == 0)
        return;
    const int err = errno;
    char old[4200]; /* llmcl_dist_load's fallback: "ck/" names ck, beside ck.old */
    size_t len = strlen(o->resume);
    while (len > 1 && o->resume[len - 1] == '/')
        --len;
    snprintf(old, sizeof old, "%.*s.old", (int)len, o->resume);
    if (!zero || access(old, F_OK) != 0)
        die("--resume %s: %s", o->resume, strerror(err));
}

/* --teacher and its options: their ranges, and what it does not serve: the fused cross-entropy and
   16-bit logits (both losses come from one pass over f32 logits). */
static void check_distill(options *o)
{
    model_config *c = &o->model;
    const bool given = c->distill_alpha || c->distill_beta || c->distill_temperature;
    if (!o->teacher) {
        if (given)
            die("--distill-alpha, --distill-beta and --distill-temperature need --teacher PATH");
        return;
    }
    if (!c->distill_alpha)
        c->distill_alpha = 0.5f;
    if (!c->distill_temperature)
        c->distill_temperature = 1.0f;
    if (c->distill_alpha > 1 || c->distill_beta > 1)
        die("--distill-alpha must be in (0, 1] and --distill-beta in [0, 1]");
    if (c->fused_ce)
        die("--teacher runs on the chunked cross-entropy's path: not with --fused-ce");
    if (c->ce_logits_dtype != LLMCL_F32)
        die("--teacher computes the cross-entropy with the divergence, on f32 logits: not with "
            "--ce-logits %s",
            llmcl_dtype_name(c->ce_logits_dtype));
}

/* --preference's names, in llmcl_pref_loss's order, and as the start-up line writes them. */
static const char *const pref_options[] = {"dpo", "ipo", "simpo", "cpo", "orpo"};
static const char *const pref_names[] = {"DPO", "IPO", "SimPO", "CPO", "ORPO"};

static llmcl_pref_loss parse_pref_loss(const char *s)
{
    for (int k = LLMCL_PREF_DPO; k <= LLMCL_PREF_ORPO; ++k)
        if (strcmp(s, pref_options[k]) == 0)
            return (llmcl_pref_loss)k;
    die("--preference %s: expected dpo, ipo, simpo, cpo or orpo", s);
}

/* The rows of a micro-batch: --batch, or under --preference its pairs' two sequences each. */
static int batch_rows(const options *o) { return o->model.preference ? 2 * o->batch : o->batch; }

/* What --preference cannot combine with: a teacher, the options of another path to the head,
   data that is not one JSON Lines file of pairs, packing. */
static void check_preference_with(const options *o)
{
    const model_config *c = &o->model;
    if (o->teacher)
        die("--preference and --teacher do not combine: a step's loss is the preference loss or "
            "the distillation's");
    if (c->fused_ce)
        die("--preference computes its loss through the fused cross-entropy's passes already: "
            "leave out --fused-ce");
    if (!o->data)
        die("--preference trains on tokenized preference pairs: give --data FILE.jsonl (one "
            "object a line with prompt_input_ids, chosen_input_ids and rejected_input_ids)");
    if (o->data_format == DATA_TEXT || o->data_format == DATA_LLMC)
        die("--preference reads preference pairs in JSON Lines: not --data-format %s",
            o->data_format == DATA_TEXT ? "text" : "llmc");
    if (o->packing_given)
        die("--packing packs examples; under --preference each sequence of a pair has a row of "
            "its own");
}

/* --preference's options: their ranges and the losses that take them; then TRL's defaults. */
static void check_preference(options *o)
{
    model_config *c = &o->model;
    const bool given = o->ref || !isnan(o->pref_beta) || !isnan(o->pref_gamma) ||
                       !isnan(o->pref_smoothing) || !isnan(o->pref_nll);
    if (!c->preference) {
        if (given)
            die("--ref, --pref-beta, --pref-gamma, --pref-label-smoothing and --pref-nll-weight "
                "need --preference dpo|ipo|simpo|cpo|orpo");
        return;
    }
    check_preference_with(o);
    const llmcl_pref_loss loss = c->pref.loss;
    const char *name = pref_options[loss];
    if (o->ref && !model_pref_takes_ref(c))
        die("--ref: --preference %s takes no reference model (dpo and ipo do)", name);
    if (!isnan(o->pref_gamma) && loss != LLMCL_PREF_SIMPO)
        die("--pref-gamma is SimPO's target margin: not with --preference %s", name);
    if (o->pref_beta == 0)
        die("--pref-beta must be > 0");
    if (o->pref_smoothing > 0.5)
        die("--pref-label-smoothing must be in [0, 0.5]");
    if (o->pref_smoothing > 0 && loss != LLMCL_PREF_DPO && loss != LLMCL_PREF_SIMPO &&
        loss != LLMCL_PREF_CPO)
        die("--pref-label-smoothing: --preference %s takes none (dpo, simpo and cpo do)", name);
    /* ORPO's supervised term is part of the loss; CPO's is TRL's default (cpo_alpha 1) */
    const bool supervised = loss == LLMCL_PREF_ORPO || loss == LLMCL_PREF_CPO;
    c->pref = (llmcl_pref_options){
        .loss = loss,
        .beta = isnan(o->pref_beta) ? 0.1f : (float)o->pref_beta,
        .gamma = loss != LLMCL_PREF_SIMPO ? 0.0f : isnan(o->pref_gamma) ? 0.5f
                                                                        : (float)o->pref_gamma,
        .label_smoothing = isnan(o->pref_smoothing) ? 0.0f : (float)o->pref_smoothing,
        .nll_weight = !isnan(o->pref_nll) ? (float)o->pref_nll : supervised ? 1.0f : 0.0f};
    o->data_format = DATA_PAIRS;
}

/* A model option's value (optarg): given on the command line, it must agree with config.json. */
static int given_int(options *o, int opt, const char *name, long lo, long hi)
{
    o->given |= 1u << opt;
    return (int)parse_int(name, optarg, lo, hi);
}

static double given_num(options *o, int opt, const char *name, double lo)
{
    o->given |= 1u << opt;
    return parse_num(name, optarg, lo, FLT_MAX);
}

/* One option from getopt_long (c, with optarg) into o; 'C' may look at the next argument. */
static void apply_option(options *o, int c, int argc, char **argv)
{
    switch (c) {
    case 'D': o->data = optarg; break;
    case LONG_DATA_FORMAT: o->data_format = data_format_parse(optarg); break;
    case LONG_PACKING:
        o->packing = data_packing_parse(optarg);
        o->packing_given = true;
        break;
    case LONG_PREFERENCE:
        o->model.pref.loss = parse_pref_loss(optarg);
        o->model.preference = 1;
        break;
    case LONG_PREF_BETA: o->pref_beta = parse_num("pref-beta", optarg, 0, FLT_MAX); break;
    case LONG_PREF_GAMMA: o->pref_gamma = parse_num("pref-gamma", optarg, 0, FLT_MAX); break;
    case LONG_PREF_LABEL_SMOOTHING:
        o->pref_smoothing = parse_num("pref-label-smoothing", optarg, 0, FLT_MAX);
        break;
    case LONG_PREF_NLL_WEIGHT:
        o->pref_nll = parse_num("pref-nll-weight", optarg, 0, FLT_MAX);
        break;
    case LONG_REF: o->ref = optarg; break;
    case LONG_TEACHER: o->teacher = optarg; break;
    case LONG_DISTILL_ALPHA:
        o->model.distill_alpha = (float)parse_num("distill-alpha", optarg, 0, FLT_MAX);
        if (!o->model.distill_alpha)
            die("--distill-alpha 0 leaves nothing to distill: give A in (0, 1]");
        break;
    case LONG_DISTILL_BETA:
        o->model.distill_beta = (float)parse_num("distill-beta", optarg, 0, FLT_MAX);
        break;
    case LONG_DISTILL_TEMPERATURE:
        o->model.distill_temperature =
            (float)parse_num("distill-temperature", optarg, 0, FLT_MAX);
        if (!o->model.distill_temperature)
            die("--distill-temperature must be > 0");
        break;
    case LONG_OPTIMIZER_IN_BACKWARD: o->model.optimizer_in_backward = 1; break;
    case LONG_ZERO_GROUP_LAYERS:
        o->model.zero_group_layers = parse_group_layers(optarg);
        break;
    case LONG_CE_LOGITS:
        o->model.ce_logits_dtype = parse_dtype("ce-logits", optarg, true);
        break;
    case LONG_INIT_ADAPTER: o->init_adapter = optarg; break;
    case LONG_ARCH:
        set_arch(&o->model, optarg);
        o->given |= 1u << OPT_ARCH;
        break;
    case LONG_HEAD_DIM: o->model.head_dim = given_int(o, OPT_HEAD_DIM, "head-dim", 1, 4096); break;
    case LONG_SLIDING_WINDOW:
        o->model.sliding_window = given_int(o, OPT_WINDOW, "sliding-window", 0, 1 << 30);
        break;
    case LONG_EXPORT_SHARD_GB:
        o->export_shard_gb = parse_num("export-shard-gb", optarg, 1e-9, FLT_MAX);
        o->export_opts_given = true;
        break;
    case LONG_ZERO_REDUCE_DTYPE:
        o->model.zero_reduce_dtype = parse_dtype("zero-reduce-dtype", optarg, false);
        break;
    case 'V': o->val = optarg; break;
    case 'P': break;
    case 'd': o->model.dim = given_int(o, OPT_DIM, "dim", 1, 1 << 20); break;
    case 'L': o->model.layers = given_int(o, OPT_LAYERS, "layers", 1, 4096); break;
    case 'H': o->model.heads = given_int(o, OPT_HEADS, "heads", 1, 4096); break;
    case 'K': o->model.kv_heads = given_int(o, OPT_KV_HEADS, "kv-heads", 1, 4096); break;
    case 'F': o->model.ffn = given_int(o, OPT_FFN, "ffn", 1, 1 << 22); break;
    case 'v':
        o->model.vocab = given_int(o, OPT_VOCAB, "vocab", 2, 1 << 24);
        o->vocab_given = true;
        break;
    case 'u':
        o->model.tied = 0;
        o->given |= 1u << OPT_UNTIED;
        break;
    case 'r': o->model.rope_theta = given_num(o, OPT_ROPE_THETA, "rope-theta", 1); break;
    case 'R': o->model.rope_llama3_factor = given_num(o, OPT_ROPE_LLAMA3, "rope-llama3", 0); break;
    case 't': o->model.dtype = parse_dtype("dtype", optarg, true); break;
    case 'i': o->init_from = optarg; break;
    case 'x': o->export_dir = optarg; break;
    case 'X':
        o->export_dtype = parse_dtype("export-dtype", optarg, false);
        o->export_opts_given = true;
        break;
    case 'k': o->model.lora_rank = given_int(o, OPT_LORA, "lora", 0, 1 << 16); break;
    case 'A': o->model.lora_alpha = (float)given_num(o, OPT_LORA_ALPHA, "lora-alpha", 0); break;
    case 'G':
        o->model.lora_targets = parse_targets(optarg);
        o->given |= 1u << OPT_LORA_TARGETS;
        break;
    case 'U':
        o->model.lora_dtype = parse_dtype("lora-dtype", optarg, false);
        o->lora_dtype_given = true;
        break;
    case 'M': o->lora_merge = 1; break;
    case 'J': o->dump_logits = optarg; break;
    case 'z': o->model.zero_stage = (int)parse_int("zero", optarg, 1, 3); break;
    case 'b': o->batch = (int)parse_int("batch", optarg, 1, 1 << 20); break;
    case 's': o->seq = (int)parse_int("seq", optarg, 1, 1 << 22); break;
    case 'a': o->accum = (int)parse_int("accum", optarg, 1, 1 << 20); break;
    case 'n': o->steps = (int)parse_int("steps", optarg, 0, 1 << 30); break;
    case 'l': o->lr = (float)parse_num("lr", optarg, 0, FLT_MAX); break;
    case 'm': o->min_lr_frac = (float)parse_num("min-lr", optarg, 0, 1); break;
    case 'w': o->warmup = (int)parse_int("warmup", optarg, 0, 1 << 30); break;
    case 'W': o->weight_decay = (float)parse_num("weight-decay", optarg, 0, FLT_MAX); break;
    case 'c': o->clip = (float)parse_num("clip", optarg, 0, FLT_MAX); break;
    case '1': o->beta1 = (float)parse_num("beta1", optarg, 0, FLT_MAX); break;
    case '2': o->beta2 = (float)parse_num("beta2", optarg, 0, FLT_MAX); break;
    case 'e': o->eps = (float)parse_num("eps", optarg, 0, FLT_MAX); break;
    case 'C':
        o->recompute = parse_recompute(optarg, optind < argc ? argv[optind] : NULL);
        break;
    case 'O': o->offload = 1; break;
    case 'f': o->offload_optimizer = 1; break;
    case 'N':
        o->offload_chunk_mib = parse_num("offload-chunk-mib", optarg, 0.001, FLT_MAX);
        break;
    case 'Q': o->profile = 1; break;
    case 'j': o->model.fused_ce = 1; break;
    case 'q':
        o->model.ce_chunk_bytes =
            (uint64_t)parse_int("ce-chunk-mib", optarg, 1, 1 << 20) << 20;
        break;
    case 'S': o->seed = (uint64_t)parse_int("seed", optarg, 0, 1L << 62); break;
    case 'E': o->eval_every = (int)parse_int("eval-every", optarg, 0, 1 << 30); break;
    case 'B': o->eval_batches = (int)parse_int("eval-batches", optarg, 1, 1 << 20); break;
    case 'g': o->log_every = (int)parse_int("log-every", optarg, 1, 1 << 30); break;
    case 'o': o->sample_tokens = (int)parse_int("sample", optarg, 0, 1 << 20); break;
    case 'p': o->prompt = optarg; break;
    case 'T': o->peak_tflops = parse_num("peak-tflops", optarg, 0, FLT_MAX); break;
    case 'Y': o->save = optarg; break;
    case 'y': o->save_every = (int)parse_int("save-every", optarg, 0, 1 << 30); break;
    case 'I': o->save_on_interrupt = 1; break;
    case 'Z': o->resume = optarg; break;
    case 'h': usage(stdout); exit(0);
    default: bad_option(argv[optind - 1]);
    }
}

/* The options that do not combine, or need another, die naming it; derived values are set. */
static void check_options(options *o)
{
    if (o->beta1 >= 1 || o->beta2 >= 1)
        die("--beta1 and --beta2 must be below 1");
    if (o->offload && !o->recompute)
        die("--offload moves the layer inputs that --recompute keeps: give both");
    if (o->offload_chunk_mib && !o->offload_optimizer)
        die("--offload-chunk-mib sizes the stream of --offload-optimizer: give both");
    if (o->offload_optimizer && o->model.zero_stage)
        die("--offload-optimizer and --zero do not combine: ZeRO already shards the optimizer "
            "state over the ranks");
    if (o->offload_optimizer)
        o->model.offload_chunk_bytes =
            (uint64_t)((o->offload_chunk_mib ? o->offload_chunk_mib : TRAIN_OFFLOAD_CHUNK_MIB) *
                       1048576.0);
    if (o->model.optimizer_in_backward && o->clip > 0)
        die("--optimizer-in-backward updates each layer group before the others have gradients, "
            "so it cannot clip by their global norm: give --clip 0");
    if (o->model.optimizer_in_backward && o->accum > 1)
        die("--optimizer-in-backward updates each layer group with the gradients of one "
            "micro-batch: give --accum 1");
    check_distill(o);
    check_preference(o);
    if ((o->save_every || o->save_on_interrupt) && !o->save)
        die("--save-every and --save-on-interrupt need --save FILE");
    const bool lora_opts =
        o->lora_dtype_given || (o->given & (1u << OPT_LORA_ALPHA | 1u << OPT_LORA_TARGETS));
    if ((o->lora_merge || lora_opts) && !o->model.lora_rank && !o->init_adapter)
        die("--lora-merge, --lora-alpha, --lora-targets and --lora-dtype concern LoRA adapters: "
            "give --lora R or --init-adapter DIR");
    if (o->export_opts_given && !o->export_dir)
        die("--export-dtype and --export-shard-gb shape an export: give --export DIR");
    if (o->model.lora_rank && o->model.lora_alpha == 0)
        o->model.lora_alpha = (float)o->model.lora_rank;
    o->model.max_seq = o->seq;
    check_paths(o);
}

static void parse_options(int argc, char **argv, options *o)
{
    *o = (options){.accum = 1, .steps = 200, .warmup = -1, .lr = 3e-3f, .min_lr_frac = 0.1f,
                   .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                   .eval_every = 50, .eval_batches = 4, .log_every = 10, .sample_tokens = 200,
                   .prompt = "The cat", .seed = 1337, .export_dtype = LLMCL_BF16,
                   .export_shard_gb = 5, .pref_beta = NAN, .pref_gamma = NAN,
                   .pref_smoothing = NAN, .pref_nll = NAN};
    preset(o, "tiny");
    static const struct option longs[] = {
        {"data", 1, 0, 'D'}, {"val", 1, 0, 'V'}, {"preset", 1, 0, 'P'}, {"dim", 1, 0, 'd'},
        {"layers", 1, 0, 'L'}, {"heads", 1, 0, 'H'}, {"kv-heads", 1, 0, 'K'}, {"ffn", 1, 0, 'F'},
        {"vocab", 1, 0, 'v'}, {"untied", 0, 0, 'u'}, {"rope-theta", 1, 0, 'r'},
        {"rope-llama3", 1, 0, 'R'}, {"dtype", 1, 0, 't'}, {"batch", 1, 0, 'b'}, {"seq", 1, 0, 's'},
        {"accum", 1, 0, 'a'}, {"steps", 1, 0, 'n'}, {"lr", 1, 0, 'l'}, {"min-lr", 1, 0, 'm'},
        {"warmup", 1, 0, 'w'}, {"weight-decay", 1, 0, 'W'}, {"clip", 1, 0, 'c'},
        {"beta1", 1, 0, '1'}, {"beta2", 1, 0, '2'}, {"eps", 1, 0, 'e'},
        {"recompute", optional_argument, 0, 'C'}, {"offload", 0, 0, 'O'}, {"profile", 0, 0, 'Q'},
        {"ce-chunk-mib", 1, 0, 'q'}, {"fused-ce", 0, 0, 'j'},
        {"seed", 1, 0, 'S'}, {"eval-every", 1, 0, 'E'}, {"eval-batches", 1, 0, 'B'},
        {"log-every", 1, 0, 'g'}, {"sample", 1, 0, 'o'}, {"prompt", 1, 0, 'p'},
        {"peak-tflops", 1, 0, 'T'}, {"save", 1, 0, 'Y'}, {"save-every", 1, 0, 'y'},
        {"save-on-interrupt", 0, 0, 'I'}, {"resume", 1, 0, 'Z'}, {"help", 0, 0, 'h'},
        {"init-from", 1, 0, 'i'}, {"export", 1, 0, 'x'}, {"export-dtype", 1, 0, 'X'},
        {"lora", 1, 0, 'k'}, {"lora-alpha", 1, 0, 'A'}, {"lora-targets", 1, 0, 'G'},
        {"lora-dtype", 1, 0, 'U'}, {"lora-merge", 0, 0, 'M'}, {"dump-logits", 1, 0, 'J'},
        {"zero", 1, 0, 'z'}, {"offload-optimizer", 0, 0, 'f'}, {"offload-chunk-mib", 1, 0, 'N'},
        {"data-format", 1, 0, LONG_DATA_FORMAT},
        {"optimizer-in-backward", 0, 0, LONG_OPTIMIZER_IN_BACKWARD},
        {"zero-group-layers", 1, 0, LONG_ZERO_GROUP_LAYERS},
        {"zero-reduce-dtype", 1, 0, LONG_ZERO_REDUCE_DTYPE}, {"ce-logits", 1, 0, LONG_CE_LOGITS},
        {"init-adapter", 1, 0, LONG_INIT_ADAPTER},
        {"export-shard-gb", 1, 0, LONG_EXPORT_SHARD_GB}, {"arch", 1, 0, LONG_ARCH},
        {"head-dim", 1, 0, LONG_HEAD_DIM}, {"sliding-window", 1, 0, LONG_SLIDING_WINDOW},
        {"packing", 1, 0, LONG_PACKING}, {"teacher", 1, 0, LONG_TEACHER},
        {"distill-alpha", 1, 0, LONG_DISTILL_ALPHA}, {"distill-beta", 1, 0, LONG_DISTILL_BETA},
        {"distill-temperature", 1, 0, LONG_DISTILL_TEMPERATURE},
        {"preference", 1, 0, LONG_PREFERENCE}, {"pref-beta", 1, 0, LONG_PREF_BETA},
        {"pref-gamma", 1, 0, LONG_PREF_GAMMA},
        {"pref-label-smoothing", 1, 0, LONG_PREF_LABEL_SMOOTHING},
        {"pref-nll-weight", 1, 0, LONG_PREF_NLL_WEIGHT}, {"ref", 1, 0, LONG_REF},
        {0, 0, 0, 0}};
    opterr = 0; /* bad_option says it in one line */
    int c;
    /* a preset first, so that the other options refine it whatever their order; read as the
       second pass reads it (--preset=NAME, an abbreviation) */
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1)
        if (c == 'P')
            preset(o, optarg);
    optind = 0; /* a new scan (glibc, musl) */
    o->model.lora_targets = LORA_ALL_TARGETS;
    o->model.lora_dtype = LLMCL_F32;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1)
        apply_option(o, c, argc, argv);
    if (optind < argc)
        die("unexpected argument '%s' (see --help)", argv[optind]);
    check_options(o);
}

/* One shape field from config.json: an explicit option must agree with it. */
static void from_config(const options *o, int opt, const char *option, const char *key,
                        double given, double config, const char *path)
{
    if ((o->given & (1u << opt)) && given != config)
        die("--%s %g conflicts with %s = %g in %s", option, given, key, config, path);
}

/* The shape of --init-from's config.json, where it has one, over the preset's. */
static void apply_config(options *o, const hf_checkpoint *ck)
{
    model_config hc = o->model;
    if (!hf_read_config(ck, &hc, &o->max_positions))
        return;
    const model_config *mc = &o->model;
    const char *p = ck->config;
    from_config(o, OPT_DIM, "dim", "hidden_size", mc->dim, hc.dim, p);
    from_config(o, OPT_LAYERS, "layers", "num_hidden_layers", mc->layers, hc.layers, p);
    from_config(o, OPT_HEADS, "heads", "num_attention_heads", mc->heads, hc.heads, p);
    from_config(o, OPT_KV_HEADS, "kv-heads", "num_key_value_heads", mc->kv_heads, hc.kv_heads, p);
    from_config(o, OPT_FFN, "ffn", "intermediate_size", mc->ffn, hc.ffn, p);
    from_config(o, OPT_VOCAB, "vocab", "vocab_size", mc->vocab, hc.vocab, p);
    if ((o->given & (1u << OPT_UNTIED)) && hc.tied)
        die("--untied conflicts with tie_word_embeddings = true in %s", p);
    from_config(o, OPT_ROPE_THETA, "rope-theta", "rope_theta", mc->rope_theta, hc.rope_theta, p);
    from_config(o, OPT_ROPE_LLAMA3, "rope-llama3", "rope_scaling.factor", mc->rope_llama3_factor,
                hc.rope_llama3_factor, p);
    if ((o->given & (1u << OPT_ARCH)) && mc->arch != hc.arch)
        die("--arch %s conflicts with model_type = %s in %s", model_arch_name(mc->arch),
            model_arch_name(hc.arch), p);
    from_config(o, OPT_HEAD_DIM, "head-dim", "head_dim", model_config_head_dim(mc),
                model_config_head_dim(&hc), p);
    from_config(o, OPT_WINDOW, "sliding-window", "the sliding window", mc->sliding_window,
                hc.sliding_window, p);
    if (o->seq > o->max_positions)
        die("--seq %d exceeds max_position_embeddings = %d in %s", o->seq, o->max_positions, p);
    o->model = hc;
    o->vocab_given = true; /* the model's vocabulary, whatever the token file's format says */
}

/* LoRA's rank, alpha and targets from --init-adapter's adapter_config.json; explicit options must
   agree with it. */
static void apply_adapter_config(options *o, const hf_checkpoint *ad)
{
    model_config ac = o->model;
    hf_read_adapter_config(ad, &ac);
    const model_config *mc = &o->model;
    const char *p = ad->config;
    from_config(o, OPT_LORA, "lora", "r", mc->lora_rank, ac.lora_rank, p);
    from_config(o, OPT_LORA_ALPHA, "lora-alpha", "lora_alpha (times sqrt(r) with use_rslora)",
                mc->lora_alpha, ac.lora_alpha, p);
    if ((o->given & (1u << OPT_LORA_TARGETS)) && mc->lora_targets != ac.lora_targets)
        die("--lora-targets conflicts with target_modules in %s", p);
    o->model = ac;
}

/* What the model has beside a Llama model's layers, for the start-up line ("" for Llama's). */
static void describe_arch(const model_config *c, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    if (c->arch != ARCH_LLAMA)
        util_appendf(buf, len, &n, ", %s", model_arch_name(c->arch));
    if (c->head_dim && c->head_dim * c->heads != c->dim)
        util_appendf(buf, len, &n, ", head dim %d", c->head_dim);
    if (c->qkv_bias || c->o_bias)
        util_appendf(buf, len, &n, ", %s biases", c->o_bias ? "q, k, v and o" : "q, k and v");
    if (c->qk_norm)
        util_appendf(buf, len, &n, ", q and k norms");
    if (c->sliding_window)
        util_appendf(buf, len, &n, ", sliding window %d", c->sliding_window);
}

/* ---- the learning rate: linear warmup, then cosine down to min_lr_frac * lr ---- */

static float learning_rate(const options *o, int step)
{
    if (step < o->warmup)
        return o->lr * (float)(step + 1) / (float)o->warmup;
    const int span = o->steps - o->warmup;
    const double progress = span > 0 ? (double)(step - o->warmup) / span : 1.0;
    const double cosine = 0.5 * (1.0 + cos(3.141592653589793 * (progress > 1 ? 1 : progress)));
    return (float)(o->lr * (o->min_lr_frac + (1.0 - o->min_lr_frac) * cosine));
}

/* ---- the pieces of a step ---- */

/* TRL's metrics of a preference loss, summed over the pairs of a step or of an evaluation: a
   pair's rewards are beta (pi - ref) of its chosen and of its rejected sequence, pi a sequence's
   logps in the loss's sum or average and ref the reference model's (0 without one). */
typedef struct pref_stats {
    double pairs, chosen, rejected, correct, logps_chosen, logps_rejected;
} pref_stats;

typedef struct trainer {
    llmcl_ctx *ctx;
    options o;
    model *m;
    model *teacher;        /* --teacher's model, or NULL */
    model *ref;            /* DPO's and IPO's reference model, or NULL */
    pref_stats stats;      /* under --preference: the last step that took its stats */
    token_data train, val;
    loader tl;
    token_batch batch;
    llmcl_tensor *loss_sum;
    optimizer opt;
    double peak_tflops;
    int rank, world;       /* the MPI job under --zero; 0 and 1 otherwise */
    bool stop;             /* under --zero: some rank was interrupted, as of the last all-reduce */
    int saved_at;          /* the step of the last save, -1 before the first */
} trainer;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Ctrl-C sets interrupted, every time (a second one during the save must not kill it), and the
   calls it lands in resume. signal() would be System V's here, reset after the first. */
static void catch_sigint(void)
{
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/*
 * The mean of x over the ranks. Under --zero one all-reduce, which also tells every rank whether
 * any was interrupted, so that all stop after the same step instead of leaving the others waiting.
 */
static double rank_mean(trainer *tr, double x)
{
    if (!tr->o.model.zero_stage)
        return x;
#ifdef LLMCL_TRAIN_MPI
    double v[2] = {x, interrupted};
    if (MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allreduce failed");
    tr->stop = v[1] > 0;
    x = v[0] / tr->world;
#endif
    return x;
}

/* Whether to stop: Ctrl-C here, or under --zero on any rank (as of the last all-reduce). */
static bool stopping(const trainer *tr)
{
    return tr->o.model.zero_stage ? tr->stop : interrupted;
}

static void load_data(trainer *tr)
{
    options *o = &tr->o;
    if (o->data)
        data_load(o->data, o->data_format, &tr->train);
    else
        data_builtin(o->seed, 400000, &tr->train);
    if (o->val)
        data_load(o->val, o->data_format, &tr->val);
    else
        data_split(&tr->train, 0.05, &tr->val);
    /* the tokenizer's, as its format says (JSON Lines say none: a Llama preset keeps Llama 3's) */
    if (!o->vocab_given && !tr->train.byte_level && !(tr->train.vocab_bound && o->llama_vocab))
        o->model.vocab = tr->train.vocab;
    data_check_vocab(&tr->train, o->model.vocab);
    data_check_vocab(&tr->val, o->model.vocab);
    if (o->packing_given && !tr->train.targets)
        die("--packing packs the examples of a JSON Lines file; %s is a stream of tokens",
            tr->train.source);
    tr->train.packing = tr->val.packing = o->packing;
}

/*
 * --recompute=auto: the first form, in the order that keeps the most (none, ops, every 2nd layer,
 * full: each keeps fewer activations and recomputes more than the one before; ops keeps fewer
 * than every 3rd or 4th layer at the presets' shapes and recomputes only the cheap ops), whose
 * activations fit in the device memory that the model's other buffers leave, less a step's
 * scratch (the cross-entropy's chunk, and 256 MiB for the products' K split and the norms' partial
 * sums) and, on the device's whole memory (no LLMCL_MEMORY_LIMIT, which caps llmcl's own), a 64th
 * of it for what lies outside llmcl's accounting (the driver's context, NCCL's own buffers). Full
 * when none fits, whose allocation then says what to change. Prints what each form it tried needs.
 */
static int pick_recompute(trainer *tr)
{
    const options *o = &tr->o;
    const model_config *c = &o->model;
    llmcl_memory_stats ms = {0};
    llmcl_memory_stats_get(tr->ctx, &ms);
    const uint64_t cap =
        ms.limit_bytes ? ms.limit_bytes : llmcl_ctx_device_info(tr->ctx)->global_mem_bytes;
    const size_t ce_elem = c->ce_logits_dtype == LLMCL_F32 ? 4 + llmcl_dtype_size(c->dtype)
                                                           : llmcl_dtype_size(c->ce_logits_dtype);
    const uint64_t ce_all =
        (uint64_t)batch_rows(o) * (uint64_t)o->seq * (uint64_t)c->vocab * ce_elem;
    const uint64_t ce_budget = c->ce_chunk_bytes ? c->ce_chunk_bytes : 256ull << 20;
    const uint64_t outside = ms.limit_bytes ? 0 : cap / 64;
    const uint64_t scratch = (ce_all < ce_budget ? ce_all : ce_budget) + (256ull << 20) + outside;
    const uint64_t left = cap > ms.current_bytes + scratch ? cap - ms.current_bytes - scratch : 0;
    static const int forms[] = {RECOMPUTE_NONE, RECOMPUTE_OPS, 2, RECOMPUTE_FULL};
    static const char *const names[] = {"none", "ops", "2", "full"};
    char left_s[32], text[256] = "";
    size_t used = 0;
    int pick = RECOMPUTE_FULL;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; ++i) {
        if ((forms[i] == RECOMPUTE_NONE && o->offload) || (forms[i] == 2 && c->layers < 2))
            continue; /* with offload every layer's input leaves; 2 needs two layers */
        char need[32];
        const uint64_t bytes =
            model_acts_bytes(tr->m, batch_rows(o), o->seq, forms[i], o->offload);
        format_bytes((double)bytes, need, sizeof need);
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s %s", used ? ", " : "",
                                 names[i], need);
        if (bytes <= left) {
            pick = forms[i];
            break;
        }
    }
    format_bytes((double)left, left_s, sizeof left_s);
    printf("activations by --recompute=auto: %s, of %s left\n", text, left_s);
    return pick;
}

static void setup_optimizer(trainer *tr)
{
    const options *o = &tr->o;
    const adamw_hparams hp = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                              .weight_decay = o->weight_decay, .clip = o->clip, .seed = o->seed};
    CHECK(optimizer_create(tr->m, &hp, &tr->opt), tr->ctx);
    const int64_t one = 1;
    CHECK(llmcl_tensor_create(tr->ctx, LLMCL_F32, 1, &one, &tr->loss_sum), tr->ctx);
}

/* The loader's next micro-batch into tr->batch, its documents (where it packs examples) set. */
static llmcl_status next_batch(trainer *tr, loader *l)
{
    token_batch *bt = &tr->batch;
    loader_next(l, bt);
    model *frozen[2] = {tr->teacher, tr->ref};
    for (int i = 0; i < 2; ++i)
        if (frozen[i])
            TRY(model_set_documents(frozen[i], bt->pos, bt->doc_offsets, bt->docs, bt->b, bt->t));
    return model_set_documents(tr->m, bt->pos, bt->doc_offsets, bt->docs, bt->b, bt->t);
}

/* The student's forward; where a backward follows under --teacher, the teacher's comes first, and
   under a preference loss with a reference the reference's, always (the held-out loss needs it). */
static llmcl_status batch_forward(trainer *tr, bool backward_follows)
{
    const token_batch *bt = &tr->batch;
    if (tr->teacher && backward_follows)
        TRY(model_hidden_forward(tr->teacher, bt->ids, bt->b, bt->t));
    if (tr->ref)
        TRY(model_hidden_forward(tr->ref, bt->ids, bt->b, bt->t));
    return model_forward(tr->m, bt->ids, bt->targets, bt->b, bt->t, backward_follows);
}

/* The activations of a frozen model (a teacher, a reference) for the trainer's micro-batches:
   each layer keeps only its input, since nothing goes backward through it. */
static void frozen_acts(trainer *tr, model *f)
{
    CHECK(model_alloc_acts(f, batch_rows(&tr->o), tr->o.seq, RECOMPUTE_FULL, false), tr->ctx);
}

/*
 * --teacher's or --ref's model (option names it): its checkpoint's shape and architecture, the
 * trainer's compute dtype, frozen, whole on every rank under --zero. Made before the trained
 * model's activations, so that --recompute=auto counts its memory.
 */
static model *frozen_model(trainer *tr, const char *path, const char *option)
{
    const options *o = &tr->o;
    hf_checkpoint ck = {0};
    hf_open(path, &ck);
    model_config c = {.dtype = o->model.dtype, .norm_eps = o->model.norm_eps,
                      .max_seq = o->seq, .ce_chunk_bytes = o->model.ce_chunk_bytes,
                      .frozen = 1};
    int max_positions = 0;
    if (!hf_read_config(&ck, &c, &max_positions))
        die("%s %s: a folder with config.json is needed for the model's shape", option, path);
    const char *bad = model_config_error(&c);
    if (bad)
        die("%s %s: %s", option, path, bad);
    model *f = NULL;
    CHECK(model_create(tr->ctx, &c, o->seed, &f), tr->ctx);
    hf_load(f, &ck);
    hf_close(&ck);
    frozen_acts(tr, f);
    return f;
}

/*
 * DPO's and IPO's default reference: the starting model a second time, frozen, whole on every
 * rank (TRL's ref_model None): init's weights and adapter's adapters where given (NULL: none),
 * else the same seeded initialisation, each parameter's stream its own. (A LoRA policy whose
 * adapters start fresh is its own reference instead: model_set_self_ref.)
 */
static model *starting_reference(trainer *tr, const hf_checkpoint *init,
                                 const hf_checkpoint *adapter)
{
    model_config c = tr->o.model;
    c.frozen = 1;
    c.zero_stage = c.zero_group_layers = 0;
    c.zero_reduce_dtype = LLMCL_F32;
    c.offload_chunk_bytes = 0;
    c.optimizer_in_backward = 0;
    c.preference = 0;
    c.pref = (llmcl_pref_options){0};
    c.lora_dtype = LLMCL_F32;
    model *ref = NULL;
    CHECK(model_create(tr->ctx, &c, tr->o.seed, &ref), tr->ctx);
    if (init)
        hf_load(ref, init);
    if (adapter)
        hf_load_adapters(ref, adapter);
    frozen_acts(tr, ref);
    return ref;
}

/* Adds the pairs of the last forward to s: the policy's and the reference's logps, read back. */
static void pref_stats_add(trainer *tr, pref_stats *s)
{
    const model *m = tr->m;
    const int b = tr->o.batch, n = 2 * b;
    float *pi = xcalloc(2 * (size_t)n, sizeof *pi), *ref = pi + n;
    CHECK(llmcl_tensor_download(m->pref_logps, pi, (size_t)n * sizeof *pi), tr->ctx);
    if (m->ref || m->self_ref)
        CHECK(llmcl_tensor_download(m->ref_logps, ref, (size_t)n * sizeof *ref), tr->ctx);
    const double beta = tr->o.model.pref.beta;
    for (int p = 0; p < b; ++p) {
        const double chosen = beta * ((double)pi[p] - ref[p]),
                     rejected = beta * ((double)pi[b + p] - ref[b + p]);
        s->chosen += chosen;
        s->rejected += rejected;
        s->correct += chosen > rejected;
        s->logps_chosen += pi[p];
        s->logps_rejected += pi[b + p];
    }
    s->pairs += b;
    free(pi);
}

/* The metrics' means over the pairs (of every rank: collective under --zero), as TRL names them. */
static void pref_stats_format(trainer *tr, const pref_stats *s, char *buf, size_t len)
{
    double v[6] = {s->pairs, s->chosen, s->rejected, s->correct, s->logps_chosen,
                   s->logps_rejected};
    for (int i = 0; i < 6; ++i)
        v[i] = rank_mean(tr, v[i]);
    const double n = v[0] > 0 ? v[0] : 1;
    snprintf(buf, len,
             "rewards/chosen %.4f | rewards/rejected %.4f | rewards/accuracies %.4f | "
             "rewards/margins %.4f | logps/chosen %.4f | logps/rejected %.4f",
             v[1] / n, v[2] / n, v[3] / n, (v[1] - v[2]) / n, v[4] / n, v[5] / n);
}

/* Mean loss over every target that learns in eval_batches micro-batches of the held-out data
   (each rank its slice of them); under --preference over their pairs (the supervised term over
   their chosen targets, as a training step's), the metrics going to ps. */
static double evaluate(trainer *tr, pref_stats *ps)
{
    const options *o = &tr->o;
    model *m = tr->m;
    loader vl;
    loader_init(&vl, &tr->val, o->batch, o->seq, tr->rank, tr->world);
    const int64_t all = loader_counted_ahead(&vl, o->eval_batches);
    double sum = 0, counted = 0;
    for (int i = 0; i < o->eval_batches; ++i) {
        CHECK(next_batch(tr, &vl), tr->ctx);
        const double weight = m->cfg.preference ? 1.0 : (double)tr->batch.counted;
        m->pref_nll_scale = all ? (float)((double)tr->batch.counted * o->eval_batches *
                                          tr->world / (double)all)
                                : 1.0f;
        CHECK(batch_forward(tr, false), tr->ctx);
        float loss;
        CHECK(llmcl_tensor_download(m->loss, &loss, sizeof loss), tr->ctx);
        sum += loss * weight;
        counted += weight;
        if (m->cfg.preference)
            pref_stats_add(tr, ps);
    }
    loader_free(&vl);
    sum = rank_mean(tr, sum);
    counted = rank_mean(tr, counted);
    return counted > 0 ? sum / counted : 0.0;
}

/*
 * One optimizer step over accum micro-batches. With stats, also its mean loss and gradient norm,
 * read from the device: the one host wait a step has besides the uploads of its tokens (which wait
 * for the step before). The steps that print, evaluate or save ask for them; the others run on
 * without waiting, and their time counts in the next step that waits. Under --zero every step
 * asks: the mean is an all-reduce that also spreads Ctrl-C to every rank.
 */
static void train_step(trainer *tr, int step, bool stats, double *loss, double *norm)
{
    const options *o = &tr->o;
    model *m = tr->m;
    llmcl_ctx *ctx = tr->ctx;
    optimizer_prepare(&tr->opt, learning_rate(o, step), step + 1, o->accum, stats);
    /* the first micro-batch writes the gradients rather than adding to them, which saves
       zeroing them (a pass over 4 bytes a parameter); llmcl_dist zeroes its own after each step,
       the update in the backward each group's after its update */
    m->grads_fresh = !m->zero && !m->cfg.optimizer_in_backward;
    CHECK(MODEL_PROF(m, F_ELEMENTWISE, llmcl_fill(ctx, tr->loss_sum, 0.0)), ctx);
    tr->stats = (pref_stats){0};
    /* the step's loss is the mean over every target that learns in it, on every rank: each
       micro-batch's mean weighs by its share of them (exactly 1 where every token learns) */
    const int64_t step_counted = loader_counted_ahead(&tr->tl, o->accum);
    for (int k = 0; k < o->accum; ++k) {
        CHECK(next_batch(tr, &tr->tl), ctx);
        const float share = step_counted ? (float)((double)tr->batch.counted * o->accum *
                                                   tr->world / (double)step_counted)
                                         : 1.0f;
        /* a preference loss: B pairs in every micro-batch weigh alike, its supervised term by
           the micro-batch's share of the step's chosen targets */
        m->ce_grad_scale = m->cfg.preference ? 1.0f : share;
        m->pref_nll_scale = share;
        CHECK(batch_forward(tr, true), ctx);
        CHECK(MODEL_PROF(m, F_ELEMENTWISE, llmcl_axpy(ctx, m->ce_grad_scale / (float)o->accum,
                                                      m->loss, tr->loss_sum)),
              ctx);
        /* the last micro-batch's weight gradient products sum their squares for the norm */
        m->grad_sumsq = k == o->accum - 1 ? optimizer_norm_sumsq(&tr->opt) : NULL;
        CHECK(model_backward(m, batch_rows(o), o->seq), ctx);
        m->grad_sumsq = NULL;
        /* the logps wait for this micro-batch's backward, which the next one's upload would */
        if (stats && m->cfg.preference)
            pref_stats_add(tr, &tr->stats);
    }
    CHECK(MODEL_PROF(m, F_OPTIMIZER, optimizer_step(&tr->opt)), ctx);
    if (!stats)
        return;
    float l;
    CHECK(llmcl_tensor_download(tr->loss_sum, &l, sizeof l), ctx);
    *loss = rank_mean(tr, l);
    CHECK(optimizer_last_norm(&tr->opt, norm), ctx);
}

/*
 * Leaves MPI where --zero joined it. Also how a failure that every rank has agreed on (a
 * collective call's status) ends the run: die_finally(finalize_mpi, ...) on every rank.
 */
static void finalize_mpi(void)
{
#ifdef LLMCL_TRAIN_MPI
    int on = 0;
    MPI_Initialized(&on);
    if (on)
        MPI_Finalize();
#endif
}

/* ---- output ---- */

/* The pairs: how many, the rows of a micro-batch, how full, and what --seq cut. */
static void print_pairs(const trainer *tr)
{
    const loader *l = &tr->tl;
    printf("pairs: %lld training and %lld held-out; a micro-batch of %d pairs is %d rows of %d "
           "tokens, the chosen sequences then the rejected (%.1f%% tokens, the rest padding)",
           (long long)tr->train.n_examples / 2, (long long)tr->val.n_examples / 2, l->b, 2 * l->b,
           l->t, 100.0 * l->fill);
    if (l->truncated)
        printf("; %lld sequences longer than --seq %d cut to their first %d tokens",
               (long long)l->truncated, l->t, l->t);
    if (l->unscored)
        printf("; %lld with no completion token within them", (long long)l->unscored);
    printf("\n");
}

/* How the examples pack: rows, how full, and what --seq cut. */
static void print_examples(const trainer *tr)
{
    const loader *l = &tr->tl;
    if (tr->train.pairs) {
        print_pairs(tr);
        return;
    }
    printf("examples: %lld training and %lld held-out, packed %s into %lld rows of %d tokens "
           "(%.1f%% tokens, the rest padding), each attending only to itself",
           (long long)tr->train.n_examples, (long long)tr->val.n_examples,
           tr->train.packing == PACK_GREEDY ? "in file order" : "best fit decreasing",
           (long long)l->n_rows, l->t, 100.0 * l->fill);
    if (l->truncated)
        printf("; %lld longer than --seq %d cut to their first %d tokens", (long long)l->truncated,
               l->t, l->t);
    printf("\n");
}

static void format_eta(double seconds, char *buf, size_t len)
{
    const long s = (long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, len, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else
        snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
}

static double device_mib(llmcl_ctx *ctx)
{
    llmcl_memory_stats ms;
    CHECK(llmcl_memory_stats_get(ctx, &ms), ctx);
    return (double)ms.current_bytes / (1024.0 * 1024.0);
}

/*
 * step_s: the mean time of the steps since the last line, those after the run's first; 0 when
 * there are none, on the first step's line, whose time (first_s) includes building the kernels
 * and would misstate the speed and the ETA.
 */
static void progress(trainer *tr, int step, double loss, double norm, double step_s,
                     double first_s)
{
    const options *o = &tr->o;
    char speed[128] = "", eta_s[32];
    if (step_s > 0) {
        const double tps = (double)batch_rows(o) * o->seq * o->accum * tr->world / step_s;
        size_t at = 0;
        util_appendf(speed, sizeof speed, &at, "%.1fk tok/s | ", tps / 1e3);
        if (tr->peak_tflops > 0)
            util_appendf(speed, sizeof speed, &at, "MFU %.1f%% | ",
                         100.0 * tps * model_flops_per_token(tr->m, o->seq) /
                             (tr->peak_tflops * 1e12 * tr->world));
        format_eta(step_s * (o->steps - step - 1), eta_s, sizeof eta_s);
    } else {
        snprintf(speed, sizeof speed, "first step %.1f s (includes building the kernels) | ",
                 first_s);
    }
    printf("step %5d/%d | loss %.4f | norm %.3f | lr %.2e | %smem %.1f MiB%s%s\n", step + 1,
           o->steps, loss, norm, learning_rate(o, step), speed, device_mib(tr->ctx),
           step_s > 0 ? " | ETA " : "", step_s > 0 ? eta_s : "");
    fflush(stdout);
}

static void print_token(const token_data *d, int32_t tok)
{
    if (d->byte_level)
        putchar(tok == '\n' || (tok >= 32 && tok < 127) ? tok : '?');
    else
        printf("[%d]", tok);
}

static void sample(trainer *tr)
{
    const options *o = &tr->o;
    const int max_t = o->seq;
    int32_t *ctx_ids = xmalloc((size_t)max_t * sizeof *ctx_ids);
    int t = 0;
    if (tr->train.byte_level)
        for (const char *p = o->prompt; *p && t < max_t - 1; ++p)
            ctx_ids[t++] = (unsigned char)*p;
    if (t == 0)
        ctx_ids[t++] = data_token(&tr->train, 0);
    printf("sample (greedy, %d tokens):\n", o->sample_tokens);
    for (int i = 0; i < t; ++i)
        print_token(&tr->train, ctx_ids[i]);
    for (int i = 0; i < o->sample_tokens; ++i) {
        int32_t next;
        CHECK(model_next_token(tr->m, ctx_ids, t, &next), tr->ctx);
        print_token(&tr->train, next);
        if (t == max_t) { /* slide the window: the model never saw longer contexts */
            memmove(ctx_ids, ctx_ids + 1, (size_t)(max_t - 1) * sizeof *ctx_ids);
            --t;
        }
        ctx_ids[t++] = next;
    }
    putchar('\n');
    free(ctx_ids);
}

/* A model's ops profiled from now on, its family times cleared; or no longer. */
static void set_profiling(model *m, bool on)
{
    if (on)
        memset(m->prof_ms, 0, sizeof m->prof_ms);
    m->profiling = on;
}

static double prof_total(const model *m)
{
    double total = 0;
    for (int f = 0; f < F_FAMILIES; ++f)
        total += m->prof_ms[f];
    return total;
}

/* One more step with every op a profiling region of its own: kernel time per op family, and the
   teacher's or the reference's forward as a row of its own. */
static void profile_step(trainer *tr, int step)
{
    model *m = tr->m, *frozen = tr->teacher ? tr->teacher : tr->ref;
    double loss, norm;
    m->prof_zero_ms = m->prof_ref_ms = 0.0;
    set_profiling(m, true);
    if (frozen)
        set_profiling(frozen, true);
    const double t0 = util_now_s();
    train_step(tr, step, true, &loss, &norm);
    const double wall = 1e3 * (util_now_s() - t0);
    set_profiling(m, false);
    const double frozen_ms = frozen ? prof_total(frozen) : m->prof_ref_ms;
    if (frozen)
        set_profiling(frozen, false);
    const double total = prof_total(m) + frozen_ms;
    printf("profile of one step (%.1f ms of kernels, %.1f ms wall with a wait after every op):\n",
           total, wall);
    if (frozen_ms > 0)
        printf("  %-18s %9.2f ms %5.1f%%\n", tr->teacher ? "teacher fwd" : "reference fwd",
               frozen_ms, 100.0 * frozen_ms / total);
    for (int f = 0; f < F_FAMILIES; ++f)
        if (m->prof_ms[f] > 0)
            printf("  %-18s %9.2f ms %5.1f%%\n", model_family_name(f), m->prof_ms[f],
                   100.0 * m->prof_ms[f] / total);
    if (m->zero)
        printf("  llmcl_dist's calls  %8.2f ms of the wall (gathers, reductions and the sharded "
               "step: its collectives, copies and sums, and AdamW)\n", m->prof_zero_ms);
}

/*
 * One more step as a single profiling region, with no wait between its ops: how much of the span
 * from its first kernel's start to its last kernel's end the kernels fill. The rest is time the
 * device ran no kernel: the host's enqueues falling behind, waits, copies.
 */
static void profile_span(trainer *tr, int step)
{
    llmcl_ctx *ctx = tr->ctx;
    double loss, norm;
    llmcl_profile p = {0};
    CHECK(llmcl_ctx_finish(ctx), ctx);
    const double t0 = util_now_s();
    CHECK(llmcl_profile_begin(ctx), ctx);
    train_step(tr, step, true, &loss, &norm);
    CHECK(llmcl_profile_end(ctx, &p), ctx);
    const double wall = 1e3 * (util_now_s() - t0), idle = p.span_ms - p.kernel_ms;
    printf("one step without waits: %.1f ms of kernels (%u launches) in a span of %.1f ms, no "
           "kernel running for %.1f ms of it (%.1f%%); %.1f ms wall\n",
           p.kernel_ms, p.launches, p.span_ms, idle, p.span_ms > 0 ? 100.0 * idle / p.span_ms : 0.0,
           wall);
}

/* After a run that kept nothing (the first run, without options): what to try next. */
static void next_steps(const options *o)
{
    printf("nothing was saved (no --save or --export)\n"
           "next: --save FILE keeps a checkpoint (--resume FILE continues it), --export DIR writes "
           "a Hugging Face model%s; llmcl-train --help lists every option\n",
           o->data ? "" : ", --data FILE trains on your own text, llm.c tokens or tokenized "
                          "examples (.jsonl)");
}

/* what: the engine's purpose, "offload" (layer inputs) or "optimizer offload". */
static void offload_summary(const char *what, llmcl_offload *off)
{
    llmcl_offload_stats s;
    CHECK(llmcl_offload_finish(off), NULL);
    CHECK(llmcl_offload_stats_get(off, &s), NULL);
    printf("%s: %.1f MiB to the host and %.1f MiB back (%.1f + %.1f ms of copies), the compute "
           "queue waited %.1f ms, %.1f MiB pinned\n",
           what, (double)s.bytes_saved / 1048576.0, (double)s.bytes_restored / 1048576.0,
           s.save_ms, s.restore_ms, s.stall_ms, (double)s.pinned_bytes / 1048576.0);
}

static void save(trainer *tr, int steps_done)
{
    const train_state s = {steps_done, loader_tell(&tr->tl)};
    const char *why;
    if (checkpoint_save(tr->m, &s, tr->o.save, &why) != LLMCL_OK)
        die_finally(finalize_mpi, "cannot save %s: %s", tr->o.save, why);
    printf("saved %s at step %d\n", tr->o.save, steps_done);
    tr->saved_at = steps_done;
}

/*
 * Whether the device's profiling events time its kernels, which the measured rates rely on:
 * Mesa's rusticl reads about 1 ns for any kernel (docs/PORTABILITY.md), so its measured peak was
 * 67108.9 TFLOP/s. One fill of 16 MiB, timed by its events and by the host's clock; a fill too
 * quick for the host's clock to judge (under 1 ms) passes.
 */
static bool profiling_timer_works(llmcl_ctx *ctx, double *event_ms, double *wall_ms)
{
    const int64_t n = 4 << 20;
    llmcl_tensor *t = NULL;
    llmcl_profile p = {0};
    if (llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &t) != LLMCL_OK)
        return true; /* no room for the check: the measurement's own errors will say */
    llmcl_status st = llmcl_fill(ctx, t, 0.0); /* builds the kernel */
    if (st == LLMCL_OK)
        st = llmcl_ctx_finish(ctx);
    const double t0 = util_now_s();
    if (st == LLMCL_OK)
        st = llmcl_profile_begin(ctx);
    if (st == LLMCL_OK) {
        st = llmcl_fill(ctx, t, 1.0);
        const llmcl_status end = llmcl_profile_end(ctx, &p);
        st = st == LLMCL_OK ? end : st;
    }
    *wall_ms = 1e3 * (util_now_s() - t0);
    *event_ms = p.kernel_ms;
    llmcl_tensor_destroy(t);
    return st != LLMCL_OK || *wall_ms < 1 || 10 * *event_ms >= *wall_ms;
}

/* --profile's two steps, where every rank's device times its kernels by its profiling events
   (under --zero the steps are collective: the ranks decide alike). */
static void profile_run(trainer *tr, int step)
{
    double event_ms, wall_ms;
    const bool timed = profiling_timer_works(tr->ctx, &event_ms, &wall_ms);
    if (rank_mean(tr, timed ? 1.0 : 0.0) < 1.0) {
        if (timed)
            printf("no profile: another rank's device's profiling events do not time kernels\n");
        else
            printf("no profile: this device's profiling events time a %.1f ms fill at %.6f ms\n",
                   wall_ms, event_ms);
        return;
    }
    profile_step(tr, step);
    profile_span(tr, step + 1);
}

/*
 * The rate that MFU divides by: the given --peak-tflops, else the measured bf16 mma rate (tensor
 * cores) or fp32 FMA rate, described in what; 0 when it cannot be measured (no MFU then).
 */
static double peak_rate(llmcl_ctx *ctx, const options *o, char *what, size_t len)
{
    if (o->peak_tflops > 0) {
        snprintf(what, len, "given");
        return o->peak_tflops;
    }
    double tflops = 0, event_ms, wall_ms;
    if (!profiling_timer_works(ctx, &event_ms, &wall_ms)) {
        snprintf(what, len, "not measured: this device's profiling events time a %.1f ms fill at "
                 "%.6f ms; no MFU, give --peak-tflops", wall_ms, event_ms);
        return 0;
    }
    const bool mma = o->model.dtype != LLMCL_F32 && llmcl_ctx_device_info(ctx)->has_mma;
    const llmcl_status st = mma ? llmcl_measure_mma_rate(ctx, &tflops)
                                : llmcl_measure_fma_rate(ctx, &tflops);
    if (st != LLMCL_OK || !(tflops > 0) || !isfinite(tflops)) {
        snprintf(what, len, "not measured (%s): no MFU; give --peak-tflops",
                 st != LLMCL_OK ? llmcl_last_error(ctx) : "no rate");
        return 0;
    }
    snprintf(what, len, "measured %s rate", mma ? "bf16 mma" : "fp32 FMA");
    return tflops;
}

/* A rate in TFLOP/s with three significant digits, in GFLOP/s below 1 TFLOP/s (CPUs). */
static void format_rate(double tflops, char *buf, size_t len)
{
    if (tflops >= 1)
        snprintf(buf, len, "%.1f TFLOP/s", tflops);
    else
        snprintf(buf, len, "%.3g GFLOP/s", tflops * 1e3);
}

/* The logits of the first held-out batch, its tokens and its loss, for hf_check.py. Under --zero
   every rank runs the batch (stage 3's forward gathers) and rank 0 writes. */
static void dump_logits(trainer *tr)
{
    const options *o = &tr->o;
    loader vl;
    loader_init(&vl, &tr->val, o->batch, o->seq, 0, 1);
    CHECK(next_batch(tr, &vl), tr->ctx);
    loader_free(&vl);
    tr->m->pref_nll_scale = 1.0f; /* the batch alone */
    CHECK(batch_forward(tr, false), tr->ctx);
    const int64_t shape[3] = {batch_rows(o), o->seq, o->model.vocab};
    const int64_t rows[2] = {shape[0] * shape[1], shape[2]};
    llmcl_tensor *logits = NULL;
    CHECK(llmcl_tensor_create(tr->ctx, LLMCL_F32, 2, rows, &logits), tr->ctx);
    CHECK(model_logits(tr->m, 0, rows[0], logits), tr->ctx);
    float *host = xmalloc((size_t)(rows[0] * rows[1]) * sizeof *host), loss;
    CHECK(llmcl_tensor_download(logits, host, (size_t)(rows[0] * rows[1]) * sizeof *host), tr->ctx);
    CHECK(llmcl_tensor_download(tr->m->loss, &loss, sizeof loss), tr->ctx);
    if (tr->rank != 0) {
        llmcl_tensor_destroy(logits);
        free(host);
        return;
    }
    char num[32];
    snprintf(num, sizeof num, "%.9g", loss);
    llmcl_safetensors_writer *w = NULL;
    CHECK(llmcl_safetensors_writer_create(o->dump_logits, &w), NULL);
    CHECK(llmcl_safetensors_writer_metadata(w, "loss", num), NULL);
    CHECK(llmcl_safetensors_writer_add_host(w, "logits", LLMCL_F32, 3, shape, host), NULL);
    const token_batch *bt = &tr->batch;
    CHECK(llmcl_safetensors_writer_add_host(w, "input_ids", LLMCL_I32, 2, shape, bt->ids), NULL);
    CHECK(llmcl_safetensors_writer_add_host(w, "targets", LLMCL_I32, 2, shape, bt->targets), NULL);
    if (bt->docs) { /* packed examples: each token's position in its own */
        CHECK(llmcl_safetensors_writer_add_host(w, "position_ids", LLMCL_I32, 2, shape, bt->pos),
              NULL);
    }
    CHECK(llmcl_safetensors_writer_finish(w), NULL);
    llmcl_safetensors_writer_destroy(w);
    llmcl_tensor_destroy(logits);
    free(host);
    printf("logits of the first held-out batch (loss %s) in %s\n", num, o->dump_logits);
}

static void export_model(trainer *tr)
{
    const options *o = &tr->o;
    const hf_export_opts eo = {.dtype = o->export_dtype, .merge = o->lora_merge,
                               .max_positions = o->max_positions ? o->max_positions : o->seq,
                               .rank = tr->rank,
                               .base = o->init_from,
                               .shard_bytes = o->export_shard_gb < 9e9
                                                  ? (int64_t)(o->export_shard_gb * 1e9)
                                                  : INT64_MAX};
    hf_export(tr->m, o->export_dir, &eo);
    printf("exported %s to %s (%s)\n",
           o->model.lora_rank && !o->lora_merge ? "the LoRA adapters" : "the model", o->export_dir,
           llmcl_dtype_name(o->export_dtype));
}

static void print_lora(const model_config *c, int64_t trained)
{
    printf("LoRA: rank %d, alpha %g, %s adapters on", c->lora_rank, c->lora_alpha,
           llmcl_dtype_name(c->lora_dtype));
    for (int k = P_WQ; k <= P_WDOWN; ++k)
        if (c->lora_targets & (1u << k))
            printf(" %s", model_module_name(k));
    printf(": %.3fM trained parameters, the base frozen\n", (double)trained / 1e6);
}

static void print_offloaded(offload_state *s)
{
    llmcl_offload_stats st;
    CHECK(llmcl_offload_stats_get(offload_state_engine(s), &st), NULL);
    printf("optimizer state: %.1f MiB of masters and moments in pinned host memory, through the "
           "device in %d chunk(s) of up to %.2f MiB\n",
           (double)st.pinned_bytes / 1048576.0, offload_state_chunks(s),
           (double)offload_state_chunk(s) * 12 / 1048576.0);
}

static void print_in_backward(const model *m)
{
    printf("optimizer: AdamW on each layer group in the backward, as soon as its gradients are "
           "final; gradients %.2f MiB (%.2f MiB for all at once)\n",
           (double)m->trainable.grad_total * 4 / 1048576.0,
           (double)m->trainable.total * 4 / 1048576.0);
}

/*
 * The trained model's weights from --init-from and --init-adapter (opened by main, closed here),
 * then the frozen models: --teacher's, and a preference loss's reference, --ref's or the starting
 * model again while its files are open; where fresh adapters (B = 0) make the policy's base the
 * starting model, the policy itself with its adapters off.
 */
static void load_models(trainer *tr, hf_checkpoint *init, hf_checkpoint *adapter)
{
    const options *o = &tr->o;
    if (o->init_from) {
        init->refused = o->model.zero_stage ? finalize_mpi : NULL;
        hf_load(tr->m, init);
    }
    if (o->init_adapter)
        hf_load_adapters(tr->m, adapter);
    if (o->teacher)
        tr->teacher = frozen_model(tr, o->teacher, "--teacher");
    if (model_pref_takes_ref(&o->model) && o->ref)
        tr->ref = frozen_model(tr, o->ref, "--ref");
    else if (model_pref_takes_ref(&o->model) && o->model.lora_rank && !o->init_adapter)
        model_set_self_ref(tr->m);
    else if (model_pref_takes_ref(&o->model))
        tr->ref = starting_reference(tr, o->init_from ? init : NULL,
                                     o->init_adapter ? adapter : NULL);
    if (o->init_from)
        hf_close(init);
    if (o->init_adapter)
        hf_close(adapter);
}

/* The preference loss, its hyperparameters and its reference model, for the start-up lines. */
static void print_preference(const trainer *tr)
{
    const options *o = &tr->o;
    const llmcl_pref_options *p = &o->model.pref;
    const bool average = p->loss == LLMCL_PREF_IPO || p->loss == LLMCL_PREF_SIMPO ||
                         p->loss == LLMCL_PREF_ORPO;
    printf("preference: %s, beta %g", pref_names[p->loss], (double)p->beta);
    if (p->loss == LLMCL_PREF_SIMPO)
        printf(", gamma %g", (double)p->gamma);
    if (p->label_smoothing > 0)
        printf(", label smoothing %g", (double)p->label_smoothing);
    if (p->nll_weight > 0)
        printf(", the chosen completions' cross-entropy at weight %g", (double)p->nll_weight);
    printf("; logps %s over the completion", average ? "averaged" : "summed");
    if (tr->ref)
        printf("; reference %s, %.2fM parameters, frozen%s", o->ref ? o->ref : "the starting model",
               (double)model_param_count(tr->ref) / 1e6,
               o->model.zero_stage ? ", whole on every rank" : "");
    if (tr->m->self_ref)
        printf("; reference the starting model: the policy with its adapters off");
    printf("\n");
}

/*
 * Under --zero: MPI (MPICH's singleton init serves a run without mpiexec), this rank's place in
 * the job, and stdout for rank 0 alone, so that the job prints one progress line a step.
 */
static void join_job(trainer *tr, int *argc, char ***argv)
{
    tr->world = 1;
    if (!tr->o.model.zero_stage)
        return;
#ifdef LLMCL_TRAIN_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        die("MPI_Init failed");
    MPI_Comm_rank(MPI_COMM_WORLD, &tr->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tr->world);
    if (tr->rank != 0 && !freopen("/dev/null", "w", stdout))
        die("cannot silence rank %d's stdout", tr->rank);
#else
    (void)argc, (void)argv;
    die("--zero needs llmcl-train built with MPI (MPICH was not found at setup)");
#endif
}

/* Under --zero each rank takes its node-local device, unless LLMCL_DEVICE names one. */
static llmcl_status create_context(const trainer *tr, llmcl_ctx **out)
{
#ifdef LLMCL_TRAIN_MPI
    if (tr->o.model.zero_stage)
        return llmcl_dist_ctx_create(MPI_COMM_WORLD, out);
#else
    (void)tr;
#endif
    return llmcl_ctx_create(out);
}

/* The ZeRO line: the stage, the ranks, the step's batch and the transport that runs. */
static void print_zero(const trainer *tr)
{
#ifdef LLMCL_TRAIN_MPI
    llmcl_dist_info in;
    CHECK(llmcl_dist_info_get(tr->m->zero->dist, &in), tr->ctx);
    printf("ZeRO stage %d over %d rank(s): the step's batch is %d x %d x %d; %d groups (%d "
           "layer(s) a group); %s gradients on the wire; %s transport (%s), collectives %s the "
           "compute\n",
           in.stage, tr->world, tr->world, tr->o.batch, tr->o.seq, in.groups, tr->m->zero->layers,
           llmcl_dtype_name(tr->m->cfg.zero_reduce_dtype), llmcl_dist_transport_name(in.transport),
           in.transport_detail, in.overlap ? "under" : "between");
#else
    (void)tr;
#endif
}

/* ORPO's odds are infinite for a completion that scores nothing (llmcl.h): its loss would be inf
   or NaN, so such pairs are refused rather than trained on. */
static void check_orpo_scored(const options *o, const loader *l)
{
    if (o->model.preference && o->model.pref.loss == LLMCL_PREF_ORPO && l->unscored)
        die("--preference orpo: %lld sequences of %s have no completion token within --seq %d, "
            "which makes ORPO's odds infinite: raise --seq, or leave those pairs out",
            (long long)l->unscored, l->d->source, o->seq);
}

/*
 * Everything before the first step: the checkpoints to start from, the data, the MPI job, the
 * context with its peak rate (where that came from into peak_what), the model with its activations
 * and the optimizer. Dies with a message on a bad configuration. Returns what to free at the end:
 * the base path that an adapter named, or NULL.
 */
static char *setup_run(trainer *tr, int *argc, char ***argv, char *peak_what, size_t len)
{
    options *o = &tr->o;
    hf_checkpoint init = {0};
    hf_checkpoint adapter = {0};
    char *adapter_base = NULL;
    if (o->init_adapter) {
        hf_open_adapter(o->init_adapter, &adapter);
        if (!o->init_from) /* as PEFT's AutoPeftModel finds it */
            o->init_from = adapter_base = hf_adapter_base(&adapter);
    }
    if (o->init_from) {
        hf_open(o->init_from, &init);
        apply_config(o, &init);
    }
    if (o->init_adapter)
        apply_adapter_config(o, &adapter);
    load_data(tr);
    const char *bad = model_config_error(&o->model);
    if (bad)
        die("bad model configuration: %s", bad);
    if (o->recompute > o->model.layers)
        die("--recompute=%d: no layer of the %d would be recomputed (those with (l + 1) %% %d = 0 "
            "are): give N from 1 to %d", o->recompute, o->model.layers, o->recompute,
            o->model.layers);
    /* MPI after the checks that each rank makes alone: a rank that exits before MPI_Init ends
       the job cleanly, one that exits after it while others still run gets them killed */
    join_job(tr, argc, argv);
    loader_init(&tr->tl, &tr->train, o->batch, o->seq, tr->rank, tr->world);
    check_orpo_scored(o, &tr->tl);
    if (o->eval_every || o->dump_logits) { /* short held-out data fails now, not after training */
        loader held;
        loader_init(&held, &tr->val, o->batch, o->seq, tr->rank, tr->world);
        check_orpo_scored(o, &held);
        const int64_t once = loader_micro_batches(&held);
        if (o->eval_every && o->eval_batches > once) { /* more would count some targets twice */
            printf("--eval-batches %d: the held-out data holds %lld micro-batches of the job; an "
                   "evaluation reads those\n", o->eval_batches, (long long)once);
            o->eval_batches = (int)once;
        }
        loader_free(&held);
    }
    if (o->warmup < 0) /* not given: a given one stands, even past the last step */
        o->warmup = o->steps > 20 ? 20 : o->steps / 10;

    CHECK(create_context(tr, &tr->ctx), NULL);
    tr->peak_tflops = peak_rate(tr->ctx, o, peak_what, len);
    llmcl_memory_reset_peak(tr->ctx); /* the run's peak, from here: not the rate probes' buffers */
    CHECK(model_create(tr->ctx, &o->model, o->seed, &tr->m), tr->ctx);
    load_models(tr, &init, &adapter);
    if (o->recompute == RECOMPUTE_AUTO) /* its account before the allocation, which may fail */
        o->recompute = pick_recompute(tr);
    CHECK(model_alloc_acts(tr->m, batch_rows(o), o->seq, o->recompute, o->offload), tr->ctx);
    if (tr->teacher)
        model_set_teacher(tr->m, tr->teacher);
    if (tr->ref)
        model_set_ref(tr->m, tr->ref);
    setup_optimizer(tr);
    batch_init(&tr->batch, batch_rows(o), o->seq);
    return adapter_base;
}

/* The run's header: the device, the model and what it trains, the teacher, the data. */
static void print_run(const trainer *tr, const char *peak_what)
{
    const options *o = &tr->o;
    const model_config *c = &o->model;
    char peak_s[32] = "", recompute[160], arch[160];
    if (tr->peak_tflops > 0)
        format_rate(tr->peak_tflops, peak_s, sizeof peak_s);
    model_recompute_describe(tr->m, recompute, sizeof recompute);
    const llmcl_device_info *info = llmcl_ctx_device_info(tr->ctx);
    printf("device: %s (%s), peak %s%s%s%s\n", info->name, info->platform_name, peak_s,
           peak_s[0] ? " (" : "", peak_what, peak_s[0] ? ")" : "");
    describe_arch(c, arch, sizeof arch);
    printf("model: %.2fM parameters, dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, %s%s, "
           "%s%s%s%s%s%s\n",
           (double)model_param_count(tr->m) / 1e6, c->dim, c->layers, c->heads, c->kv_heads,
           c->ffn, c->vocab, c->tied ? "tied head" : "untied head", arch,
           llmcl_dtype_name(c->dtype), c->ce_logits_dtype != LLMCL_F32 ? ", logits in " : "",
           c->ce_logits_dtype != LLMCL_F32 ? llmcl_dtype_name(c->ce_logits_dtype) : "",
           recompute[0] ? ", " : "", recompute, o->offload ? " with offload" : "");
    if (c->lora_rank)
        print_lora(c, model_trainable_count(tr->m));
    if (tr->m->trainable.offloaded)
        print_offloaded(tr->m->trainable.offloaded);
    if (c->optimizer_in_backward)
        print_in_backward(tr->m);
    if (c->zero_stage)
        print_zero(tr);
    if (o->init_from)
        printf("weights: %s%s%s\n", o->init_from, o->init_adapter ? ", adapters: " : "",
               o->init_adapter ? o->init_adapter : "");
    if (tr->teacher)
        printf("teacher: %s, %.2fM parameters, dim %d, %d layers; loss (1 - %g) CE + %g x %g^2 "
               "D(beta %g)\n",
               o->teacher, (double)model_param_count(tr->teacher) / 1e6, tr->teacher->cfg.dim,
               tr->teacher->cfg.layers, (double)c->distill_alpha, (double)c->distill_alpha,
               (double)c->distill_temperature, (double)c->distill_beta);
    if (c->preference)
        print_preference(tr);
    printf("data: %s, %lld training and %lld held-out tokens; batch %d x %d x %d\n",
           tr->train.source, (long long)tr->train.n, (long long)tr->val.n, batch_rows(o), o->seq,
           o->accum);
    if (tr->train.targets)
        print_examples(tr);
}

/* The step to start from: 0, or --resume's checkpoint's, with the data where it was. */
static int resume_step(trainer *tr)
{
    const char *resume = tr->o.resume;
    if (!resume)
        return 0;
    train_state s;
    const char *from, *why;
    if (checkpoint_load(tr->m, resume, &s, &from, &why) != LLMCL_OK)
        die_finally(finalize_mpi, "cannot resume: %s", why);
    if (!loader_seek(&tr->tl, s.data_pos))
        die_finally(finalize_mpi, "cannot resume: %s's data position %lld lies beyond the "
                    "training data (%s: other data than the run it continues?)", from,
                    (long long)s.data_pos, tr->train.source);
    printf("resumed from %s at step %d%s\n", from, (int)s.step,
           from != resume ? " (a save stopped between moving the old checkpoint aside and "
                            "renaming the new one into place)" : "");
    return (int)s.step;
}

/* The held-out loss after a step (with the preference losses' rewards). */
static void report_eval(trainer *tr, int step)
{
    const bool pref = tr->o.model.preference;
    pref_stats held = {0};
    char rewards[256] = "";
    const double loss_held = evaluate(tr, &held);
    if (pref)
        pref_stats_format(tr, &held, rewards, sizeof rewards);
    printf("step %5d/%d | held-out loss %.4f%s%s\n", step + 1, tr->o.steps, loss_held,
           pref ? " | " : "", rewards);
}

/*
 * The training steps from first, with their logs, evaluations and saves, until the last or a stop.
 * Time counts training steps, evaluations excluded, and the run's first step apart: it also builds
 * the kernels, which can take longer than the rest of a short run. The speed and the ETA take the
 * steps since the last line. Returns the step it stopped before.
 */
static int train_steps(trainer *tr, int first)
{
    const options *o = &tr->o;
    double interval_s = 0, first_s = 0;
    int step = first, interval_steps = 0;
    for (; step < o->steps && !stopping(tr); ++step) {
        double loss = 0, norm = 0;
        const bool logs = step % o->log_every == 0 || step + 1 == o->steps,
                   evals = o->eval_every && ((step + 1) % o->eval_every == 0 ||
                                             step + 1 == o->steps),
                   saves = o->save_every && (step + 1) % o->save_every == 0;
        /* a step whose time is taken alone, or that untimed work follows, waits for its end */
        const bool stats = step == first || logs || evals || saves || o->model.zero_stage;
        const double t0 = util_now_s();
        train_step(tr, step, stats, &loss, &norm);
        if (step == first)
            first_s = util_now_s() - t0;
        else
            interval_s += util_now_s() - t0, ++interval_steps;
        if (logs) {
            progress(tr, step, loss, norm, interval_steps ? interval_s / interval_steps : 0,
                     first_s);
            interval_s = 0, interval_steps = 0;
        }
        if (logs && o->model.preference) {
            char rewards[256];
            pref_stats_format(tr, &tr->stats, rewards, sizeof rewards);
            printf("step %5d/%d | %s\n", step + 1, o->steps, rewards);
        }
        if (evals)
            report_eval(tr, step);
        if (saves)
            save(tr, step + 1);
    }
    return step;
}

/*
 * After the steps: the last save (unless it was --save-every's), the export and the logits dump of
 * a run whose steps all ran, memory, then the sample of the model saved and the profile (its steps
 * train on), which a Ctrl-C skips. cut: the steps were cut short.
 */
static void finish_run(trainer *tr, int step, bool cut)
{
    const options *o = &tr->o;
    if (o->save && tr->saved_at != step && (!cut || o->save_on_interrupt))
        save(tr, step);
    if (o->export_dir && !cut)
        export_model(tr);
    if (o->dump_logits && !cut)
        dump_logits(tr);
    llmcl_memory_stats ms;
    CHECK(llmcl_memory_stats_get(tr->ctx, &ms), tr->ctx);
    printf("device memory: peak %.2f MiB in use, %.2f MiB with the ops' cached scratch (llmcl's "
           "accounting)\n",
           (double)ms.peak_bytes / 1048576.0, (double)ms.peak_reserved_bytes / 1048576.0);
    if (o->sample_tokens > 0 && !cut && !stopping(tr))
        sample(tr); /* every rank: under stage 3 the forward gathers */
    if (o->profile && !cut && !stopping(tr))
        profile_run(tr, step);
    if (tr->m->off)
        offload_summary("offload", tr->m->off);
    if (tr->m->trainable.offloaded)
        offload_summary("optimizer offload", offload_state_engine(tr->m->trainable.offloaded));
    if (cut)
        printf("interrupted at step %d\n", step);
    else if (stopping(tr) && (o->sample_tokens > 0 || o->profile))
        printf("interrupted after the last step: no sample or profile\n");
    if (!o->save && !o->export_dir)
        next_steps(o);
}

static void teardown(trainer *tr)
{
    batch_free(&tr->batch);
    loader_free(&tr->tl);
    optimizer_destroy(&tr->opt);
    llmcl_tensor_destroy(tr->loss_sum);
    model_destroy(tr->teacher);
    model_destroy(tr->ref);
    model_destroy(tr->m);
    data_free(&tr->train), data_free(&tr->val);
    llmcl_ctx_destroy(tr->ctx);
    finalize_mpi();
}

int main(int argc, char **argv)
{
    trainer tr = {.saved_at = -1};
    parse_options(argc, argv, &tr.o);
    char peak_what[1200];
    char *adapter_base = setup_run(&tr, &argc, &argv, peak_what, sizeof peak_what);
    print_run(&tr, peak_what);
    const int first = resume_step(&tr);
    catch_sigint();
    const int step = train_steps(&tr, first);
    finish_run(&tr, step, step < tr.o.steps);
    const bool stopped = stopping(&tr);
    teardown(&tr);
    free(adapter_base);
    return stopped ? 130 : 0;
}
