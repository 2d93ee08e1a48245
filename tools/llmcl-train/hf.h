/*
 * hf.h: Hugging Face interoperability of llmcl-train. Reads a checkpoint of LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM (one decoder, with biases, q and k
 * norms, another head dimension or a sliding window where the architecture has them: model.h's
 * model_config), a model.safetensors file or a folder with config.json and model.safetensors or
 * the shards of model.safetensors.index.json, into a model, and a PEFT LoRA adapter
 * (adapter_config.json and adapter_model.safetensors) onto it; exports one: model.safetensors and
 * a config.json in its architecture's layout, or, for a LoRA run, PEFT's
 * adapter_model.safetensors and adapter_config.json, or the adapters merged into the weights.
 *
 * RoPE: the model rotates each head's pairs (i, i + d/2), Hugging Face's rotate_half convention,
 * on q/k weights in Hugging Face's layout, so the weights move to and from Hugging Face files
 * unchanged. Meta's original checkpoints (consolidated.*.pth) rotate interleaved pairs (2i, 2i+1);
 * transformers' convert_llama_weights_to_hf.py permutes the rows of q_proj and k_proj of each head
 * (row 2i + j becomes row i + j d/2) when converting, so such weights must go through it first.
 *
 * Errors here are a user's files or options: they end the program with a message naming the file,
 * the tensor or the key (util.h's die).
 */
#ifndef LLMCL_TRAIN_HF_H
#define LLMCL_TRAIN_HF_H

#include <stdbool.h>

#include "model.h"

typedef struct hf_checkpoint {
    bool adapter;           /* a PEFT adapter (hf_open_adapter), not a model */
    char path[1024];        /* as given */
    char config[1100];      /* its config.json (adapter_config.json), "" when there is none */
    int n_files;
    llmcl_safetensors **files; /* the single file or every shard */
    char **file_names;
    void (*refused)(void);  /* run before a refusal of its tensors exits: under --zero, where
                               every rank reads the same files and refuses alike, leaving MPI */
} hf_checkpoint;

/* Opens path: a .safetensors file (no config: the options give the shape) or a folder. A
   folder's index must put each tensor of its shards in the shard that holds it, and no other
   shard may hold it too (else it dies naming both). */
void hf_open(const char *path, hf_checkpoint *out);
void hf_close(hf_checkpoint *c);

/*
 * The model shape in c's config.json (the defaults of its architecture's config class for absent
 * keys) into cfg's shape and architecture fields (arch, head_dim, biases, q and k norms, sliding
 * window), and max_position_embeddings into *max_positions. Returns false when c has no config.
 * Dies on a config that llmcl-train's model cannot express (a model type other than llama,
 * mistral, qwen2 and qwen3, another activation, MLP biases, rope scaling other than llama3 with
 * Llama 3.1's constants, a sliding window on some layers only).
 */
bool hf_read_config(const hf_checkpoint *c, model_config *cfg, int *max_positions);

/*
 * Loads every base weight of m from c (converting bf16, f16 or f32 to the f32 masters, then the
 * compute copy; under --zero into each rank's shards, every rank reading c). A tensor missing, of
 * another shape or of a non-float dtype ends the program naming it, and so does an lm_head.weight
 * for a tied head unless config.json ties it (then it is ignored, as transformers does), and so do
 * tensors that the model would not use (biases of a config without them, say: a few named, then a
 * count)
 * except RoPE's saved rotary_emb.inv_freq.
 */
void hf_load(model *m, const hf_checkpoint *c);

/* Opens the PEFT LoRA adapter in the folder path: adapter_config.json and
   adapter_model.safetensors, as PEFT's save_pretrained and --export of a LoRA run write them. */
void hf_open_adapter(const char *path, hf_checkpoint *out);

/* The base model that the opened adapter c names (adapter_config.json's base_model_name_or_path),
   as a path to give --init-from; dies where it names none, or nothing on this machine (a Hugging
   Face Hub id, say). The caller frees it. */
char *hf_adapter_base(const hf_checkpoint *c);

/*
 * adapter_config.json's rank (r), lora_alpha and target_modules (a list of Llama's seven
 * projections, or "all-linear") into cfg's LoRA fields. With use_rslora, whose scale is
 * alpha / sqrt(r), alpha becomes alpha sqrt(r), the same scale as alpha / r. Dies on what the
 * model cannot express: another peft_type, DoRA, QALoRA, biases, fan_in_fan_out, per-module ranks
 * and alphas, adapters on some layers only, repeated layers, modules_to_save, trained token rows,
 * a regular expression as target_modules.
 */
void hf_read_adapter_config(const hf_checkpoint *c, model_config *cfg);

/*
 * Loads every adapter of m (a LoRA model of the config's rank and targets) from c, into its f32
 * master or its bf16 weights. A tensor missing, of another shape or dtype, and a tensor the model
 * would not use (DoRA's magnitudes, another module's adapter, a bias) end the program naming it.
 */
void hf_load_adapters(model *m, const hf_checkpoint *c);

typedef struct hf_export_opts {
    llmcl_dtype dtype;  /* LLMCL_BF16 or LLMCL_F32 */
    bool merge;         /* LoRA: W + s B A into model.safetensors instead of the adapters */
    int max_positions;  /* config.json's max_position_embeddings */
    int rank;           /* under --zero: every rank gathers the parameters, rank 0 writes */
    const char *base;   /* --init-from, for an adapter's base_model_name_or_path (or NULL) */
    int64_t shard_bytes; /* the model in files of at most this many bytes of tensors, with
                            Hugging Face's index, where it needs more than one (0: one file) */
} hf_export_opts;

/*
 * Writes m into the folder dir (created if needed): model.safetensors and config.json (or, past
 * o->shard_bytes, model-00001-of-0000N.safetensors ... and model.safetensors.index.json, as
 * save_pretrained shards; an earlier export's files of the other form are removed once these are
 * in place), or with
 * LoRA and no merge adapter_model.safetensors and adapter_config.json (PEFT's names; the base is
 * whatever --init-from gave, so base_model_name_or_path is null). The files are renamed into place
 * only once all are written: a failure leaves an earlier export as it was (hf_export.c's staged
 * files). Under --zero collective: every rank calls it, and o->rank 0 writes.
 */
void hf_export(model *m, const char *dir, const hf_export_opts *o);

#endif
