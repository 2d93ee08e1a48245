/*
 * fuzz_checkpoint.c: libFuzzer harness of llmcl-train's checkpoint reader (tools/llmcl-train/
 * checkpoint.c) up to where it needs a device. checkpoint_load opens the file (the safetensors
 * reader), checks its format, the model's shape in its metadata and its tensors against the model
 * (check_compatible), reads the step and data position (read_state), then uploads the tensors.
 * The harness includes checkpoint.c to run the steps before the upload on a model that has its
 * configuration and parameter table but no tensors, so no device is needed. The first input byte
 * picks a full model or a LoRA one (the LoRA metadata, with a fingerprint already taken); the rest
 * is the file. What is accepted must carry a step and a data position written as whole decimals.
 */
#include "checkpoint.c"

#include <ctype.h>
#include <unistd.h>

#include "fuzz_temp.h"

/* A one-layer model of width 16 with two trainable parameters, and its LoRA variant. */
static void tiny_model(model *m, model_param params[2], bool lora)
{
    *m = (model){0};
    m->cfg = (model_config){.vocab = 8, .dim = 16, .layers = 1, .heads = 2, .kv_heads = 1,
                            .ffn = 32, .max_seq = 8, .tied = 1, .norm_eps = 1e-5f,
                            .rope_theta = 10000, .dtype = LLMCL_F32};
    if (lora) {
        m->cfg.lora_rank = 2;
        m->cfg.lora_alpha = 4;
        m->cfg.lora_targets = 1u << P_WQ;
        m->frozen_fingerprint = 0x0123456789abcdefull; /* as if taken from the device */
    }
    params[0] = (model_param){.name = "model.embed_tokens.weight", .kind = P_EMBED, .ndim = 2,
                              .shape = {8, 16}, .numel = 128, .trainable = !lora};
    params[1] = (model_param){.name = "model.norm.weight", .kind = P_FINAL_NORM, .ndim = 1,
                              .shape = {16}, .numel = 16, .trainable = true};
    m->params = params;
    m->n_params = 2;
}

/* A non-negative decimal, as checkpoint_save writes it. */
static bool whole_decimal(const char *s)
{
    if (!s || !*s)
        return false;
    for (; *s; ++s)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char path[64];
    if (!fuzz_write_temp(data + 1, size - 1, ".safetensors", path))
        return 0;
    model m;
    model_param params[2];
    tiny_model(&m, params, data[0] & 1);
    llmcl_safetensors *st = NULL;
    why_buf[0] = '\0';
    if (open_file(path, &st) == LLMCL_OK) {
        train_state s;
        if (check_compatible(st, &m, path) == LLMCL_OK && read_state(st, path, &s) == LLMCL_OK &&
            !(whole_decimal(llmcl_safetensors_metadata(st, "step")) &&
              whole_decimal(llmcl_safetensors_metadata(st, "data_pos")))) {
            fprintf(stderr, "fuzz_checkpoint: accepted step '%s' and data_pos '%s' as %lld, %lld\n",
                    llmcl_safetensors_metadata(st, "step"),
                    llmcl_safetensors_metadata(st, "data_pos"), (long long)s.step,
                    (long long)s.data_pos);
            abort();
        }
        llmcl_safetensors_close(st);
    } else if (why_buf[0] == '\0') {
        abort(); /* a refusal says why */
    }
    unlink(path);
    return 0;
}
