/*
 * fuzz_hf_config.c: libFuzzer harness of llmcl-train's Hugging Face readers (tools/llmcl-train/
 * hf.c): config.json (hf_read_config), model.safetensors.index.json (hf_open of a folder, which
 * opens the shards its weight_map names) and PEFT's adapter_config.json (hf_read_adapter_config).
 * The first input byte picks which (modulo 3); the rest is the file.
 * The folder holds two small valid shards, a.safetensors and b.safetensors, for the index to name.
 * The readers end the program on a bad file (util.c's die): fuzz_trap.c turns that into a return.
 * A config accepted must describe what hf.h promises: a model llmcl-train can build from it once
 * its shape passes model_config_error, so finite, positive RoPE and RMSNorm constants; an adapter
 * config accepted, a rank from 1 to 65536, a finite positive alpha and some of the seven targets.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_trap.h"
#include "hf.h"

static char dir[64];

static void write_file(const char *name, const void *data, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* One f32 tensor called name holding 1.0f. */
static void write_shard(const char *file, const char *name)
{
    char header[128];
    const int n = snprintf(header, sizeof header,
                           "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                           name);
    unsigned char bytes[256] = {(unsigned char)n};
    memcpy(bytes + 8, header, (size_t)n);
    const float one = 1.0f;
    memcpy(bytes + 8 + n, &one, sizeof one);
    write_file(file, bytes, 8 + (size_t)n + sizeof one);
}

static void unlink_in_folder(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void remove_folder(void)
{
    const char *names[] = {"a.safetensors", "b.safetensors", "config.json",
                           "model.safetensors.index.json", "adapter_config.json"};
    for (int i = 0; i < 5; ++i)
        unlink_in_folder(names[i]);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_trap_init();
    snprintf(dir, sizeof dir, "/tmp/llmcl-fuzz-hf-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(remove_folder);
    write_shard("a.safetensors", "model.embed_tokens.weight");
    write_shard("b.safetensors", "model.norm.weight");
    return 0;
}

typedef struct job {
    hf_checkpoint ck;
    model_config cfg;
    int max_positions;
    bool read;
} job;

static void read_config(void *arg)
{
    job *j = arg;
    j->read = hf_read_config(&j->ck, &j->cfg, &j->max_positions);
}

static void read_adapter_config(void *arg)
{
    job *j = arg;
    hf_read_adapter_config(&j->ck, &j->cfg);
    j->read = true;
}

static void open_folder(void *arg)
{
    job *j = arg;
    hf_open(dir, &j->ck);
}

static void close_folder(void *arg) { hf_close(&((job *)arg)->ck); }

static void check_adapter_config(const uint8_t *data, size_t size)
{
    job j = {0};
    write_file("adapter_config.json", data, size);
    snprintf(j.ck.config, sizeof j.ck.config, "%s/adapter_config.json", dir);
    j.ck.adapter = true;
    if (fuzz_trap_run(read_adapter_config, NULL, &j) && j.read) {
        const model_config *c = &j.cfg;
        if (!(c->lora_rank >= 1 && c->lora_rank <= 1 << 16 && isfinite(c->lora_alpha) &&
              c->lora_alpha > 0 && c->lora_targets && !(c->lora_targets & ~LORA_ALL_TARGETS))) {
            fprintf(stderr, "fuzz_hf_config: accepted r %d, lora_alpha %g, targets %#x\n",
                    c->lora_rank, (double)c->lora_alpha, c->lora_targets);
            abort();
        }
    }
    unlink_in_folder("adapter_config.json");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] % 3 == 2) {
        check_adapter_config(data + 1, size - 1);
        return 0;
    }
    job j = {0};
    if (data[0] % 3 == 1) {
        write_file("model.safetensors.index.json", data + 1, size - 1);
        if (fuzz_trap_run(open_folder, close_folder, &j)) {
            if (j.ck.n_files < 1 || j.ck.config[0])
                abort();
            hf_close(&j.ck);
        }
        unlink_in_folder("model.safetensors.index.json");
        return 0;
    }
    write_file("config.json", data + 1, size - 1);
    snprintf(j.ck.config, sizeof j.ck.config, "%s/config.json", dir);
    if (fuzz_trap_run(read_config, NULL, &j) && j.read) {
        const model_config *c = &j.cfg;
        if (!(isfinite(c->norm_eps) && c->norm_eps >= 0 && isfinite(c->rope_theta) &&
              c->rope_theta > 0 && isfinite(c->rope_llama3_factor) && c->rope_llama3_factor >= 0 &&
              j.max_positions >= 0)) {
            fprintf(stderr, "fuzz_hf_config: accepted rms_norm_eps %g, rope_theta %g, llama3 "
                    "factor %g, max_position_embeddings %d\n", (double)c->norm_eps,
                    c->rope_theta, c->rope_llama3_factor, j.max_positions);
            abort();
        }
    }
    unlink_in_folder("config.json"); /* or hf_open would read it with the next index */
    return 0;
}
