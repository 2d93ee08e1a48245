/* hf_export.c: llmcl-train's model written in Hugging Face's layout (hf.h's hf_export):
   model.safetensors and config.json, or PEFT's adapter files, JSON through jansson. */
#define _DEFAULT_SOURCE /* realpath */
#include "hf.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "offload_state.h"
#include "util.h"

/*
 * An export's files are written under temporary names beside their places (NAME.tmp.PID) and
 * renamed into place only once every one is whole, in the order written: the model's files, the
 * index, the config. So a failure while writing (a full disk, a write error) leaves an earlier
 * export in the folder as it was, and the temporary files are removed as the program exits. The
 * renames are one after another, not one atomic step: a reader at that moment, or a run killed
 * between them, may find some files new and some old. (A new folder swapped in whole, as
 * llmcl_dist's checkpoint is, would drop whatever else the user keeps in the folder, a tokenizer
 * say, and would need its parent to be writable.)
 */
typedef struct staged_files {
    char **tmp, **final; /* each file's temporary path and its place */
    int n;
} staged_files;

static staged_files staged;

/* The temporary files not renamed into place (a failed export's), as the program exits. */
static void remove_staged(void)
{
    for (int i = 0; i < staged.n; ++i)
        unlink(staged.tmp[i]);
}

static char *path_in(const char *dir, const char *name, const char *suffix)
{
    const size_t len = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *path = xmalloc(len);
    snprintf(path, len, "%s/%s%s", dir, name, suffix);
    return path;
}

/* The temporary path to write dir/name at, which commit_staged renames into place. */
static const char *stage(const char *dir, const char *name)
{
    static bool at_exit;
    if (!at_exit)
        at_exit = atexit(remove_staged) == 0;
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)getpid());
    staged.tmp = realloc(staged.tmp, (size_t)(staged.n + 1) * sizeof *staged.tmp);
    staged.final = realloc(staged.final, (size_t)(staged.n + 1) * sizeof *staged.final);
    if (!staged.tmp || !staged.final)
        die("out of host memory");
    staged.tmp[staged.n] = path_in(dir, name, suffix);
    staged.final[staged.n] = path_in(dir, name, "");
    return staged.tmp[staged.n++];
}

/* Every staged file, each whole, into its place. */
static void commit_staged(void)
{
    for (int i = 0; i < staged.n; ++i)
        if (rename(staged.tmp[i], staged.final[i]) != 0)
            die("--export: cannot rename %s to %s: %s (the files before it are this export's, "
                "those after it an earlier one's: export again)", staged.tmp[i],
                staged.final[i], strerror(errno));
    for (int i = 0; i < staged.n; ++i)
        free(staged.tmp[i]), free(staged.final[i]);
    free(staged.tmp);
    free(staged.final);
    staged = (staged_files){0};
}

/* The tensors of one file, their host data freed after the writer finishes. */
typedef struct export_file {
    llmcl_safetensors_writer *w;
    void **bufs;
    int n;
} export_file;

/*
 * The f32 values of n parameters into new host buffers (NULL where the rank does not write): from
 * image when the masters are offloaded, else model_params_get's (under --zero one gather of each
 * llmcl_dist group, which every rank joins).
 */
static void download_f32(model *m, const model_param **ps, int n, const float *image, bool writes,
                         float **hosts)
{
    for (int i = 0; i < n; ++i)
        hosts[i] = writes ? xmalloc((size_t)ps[i]->numel * sizeof **hosts) : NULL;
    if (!image) {
        model_params_get(m, n, ps, hosts);
        return;
    }
    for (int i = 0; i < n; ++i)
        memcpy(hosts[i], image + ps[i]->offset, (size_t)ps[i]->numel * sizeof **hosts);
}

/* An f32 device tensor of p's shape holding host. */
static llmcl_tensor *f32_tensor(model *m, const model_param *p, const float *host)
{
    llmcl_tensor *t = NULL;
    CHECK(llmcl_tensor_create(m->ctx, LLMCL_F32, p->ndim, p->shape, &t), m->ctx);
    if (host)
        CHECK(llmcl_tensor_upload(t, host, (size_t)p->numel * sizeof *host), m->ctx);
    return t;
}

/* W + s B A in f32 on the device, from p's frozen weights (the compute copy the adapters trained
   on, widened where it is 16-bit) and its adapters' f32 values on the host (which under --zero
   come from the dist). */
static float *merged_f32(model *m, const model_param *p, const float *a_host, const float *b_host)
{
    llmcl_tensor *w = f32_tensor(m, p, NULL), *a = f32_tensor(m, p->lora_a, a_host),
                 *b = f32_tensor(m, p->lora_b, b_host);
    CHECK(llmcl_cast(m->ctx, model_param_value(p), w), m->ctx);
    CHECK(llmcl_matmul(m->ctx, m->lora_scale, b, a, 1.0f, w, NULL), m->ctx);
    float *host = xmalloc((size_t)p->numel * sizeof *host);
    CHECK(llmcl_tensor_download(w, host, (size_t)p->numel * sizeof *host), m->ctx);
    llmcl_tensor_destroy(w);
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
    return host;
}

/* Adds name with the f32 values host (taken over) in dtype. */
static void add(export_file *f, const char *name, const model_param *p, float *host, llmcl_dtype dt)
{
    void *data = host;
    if (dt == LLMCL_BF16) {
        uint16_t *h16 = xmalloc((size_t)p->numel * sizeof *h16);
        for (int64_t i = 0; i < p->numel; ++i)
            h16[i] = llmcl_f32_to_bf16(host[i]);
        free(host);
        data = h16;
    }
    f->bufs = realloc(f->bufs, (size_t)(f->n + 1) * sizeof *f->bufs);
    if (!f->bufs)
        die("out of host memory");
    f->bufs[f->n++] = data;
    CHECK(llmcl_safetensors_writer_add_host(f->w, name, dt, p->ndim, p->shape, data), NULL);
}

static void finish(export_file *f)
{
    CHECK(llmcl_safetensors_writer_metadata(f->w, "format", "pt"), NULL);
    CHECK(llmcl_safetensors_writer_finish(f->w), NULL);
    llmcl_safetensors_writer_destroy(f->w);
    for (int i = 0; i < f->n; ++i)
        free(f->bufs[i]);
    free(f->bufs);
}

static bool dump_json(FILE *f, void *root)
{
    return json_dumpf(root, f, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) == 0;
}

/* root as dir/name, staged (whole or not at all: util_replace_file). */
static void write_json(json_t *root, const char *dir, const char *name)
{
    char why[2600];
    if (!util_replace_file(stage(dir, name), dump_json, root, why, sizeof why))
        die("--export: %s", why);
    json_decref(root);
}

/* The shortest decimal that reads back as the same float, as a JSON number. */
static json_t *float_json(float x)
{
    char buf[32];
    for (int digits = 1; digits <= 9; ++digits) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x)
            break;
    }
    return json_real(strtod(buf, NULL));
}

/* The architecture's own keys: biases and the sliding window as its config class names them. */
static void write_arch_keys(const model_config *c, json_t *r)
{
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3)
        json_object_set_new(r, "attention_bias", json_boolean(c->o_bias));
    if (c->arch == ARCH_LLAMA)
        json_object_set_new(r, "mlp_bias", json_false());
    if (c->arch == ARCH_MISTRAL)
        json_object_set_new(r, "sliding_window",
                            c->sliding_window ? json_integer(c->sliding_window) : json_null());
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3) { /* a window on all layers or on none */
        json_object_set_new(r, "use_sliding_window", json_boolean(c->sliding_window > 0));
        json_object_set_new(r, "sliding_window",
                            c->sliding_window ? json_integer(c->sliding_window) : json_null());
        json_object_set_new(r, "max_window_layers",
                            json_integer(c->sliding_window ? 0 : c->layers));
    }
}

/* config.json in the layout of the architecture's config class (LlamaConfig's, ...). */
static void write_config(const model *m, const char *dir, const hf_export_opts *o)
{
    static const char *const classes[ARCH_COUNT] = {"LlamaForCausalLM", "MistralForCausalLM",
                                                    "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    const model_config *c = &m->cfg;
    json_t *r = json_object();
    json_object_set_new(r, "architectures", json_pack("[s]", classes[c->arch]));
    json_object_set_new(r, "model_type", json_string(model_arch_name(c->arch)));
    json_object_set_new(r, "vocab_size", json_integer(c->vocab));
    json_object_set_new(r, "hidden_size", json_integer(c->dim));
    json_object_set_new(r, "intermediate_size", json_integer(c->ffn));
    json_object_set_new(r, "num_hidden_layers", json_integer(c->layers));
    json_object_set_new(r, "num_attention_heads", json_integer(c->heads));
    json_object_set_new(r, "num_key_value_heads", json_integer(c->kv_heads));
    json_object_set_new(r, "head_dim", json_integer(m->head_dim));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    /* transformers wants Llama 3 scaling's original context (8192) below the model's */
    const int positions = c->rope_llama3_factor > 0 && o->max_positions <= 8192
                              ? (int)(8192 * c->rope_llama3_factor)
                              : o->max_positions;
    json_object_set_new(r, "max_position_embeddings", json_integer(positions));
    json_object_set_new(r, "rms_norm_eps", float_json(c->norm_eps));
    json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
    json_t *scaling = json_null();
    if (c->rope_llama3_factor > 0)
        scaling = json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", c->rope_llama3_factor,
                            "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                            "original_max_position_embeddings", 8192, "rope_type", "llama3");
    json_object_set_new(r, "rope_scaling", scaling);
    write_arch_keys(c, r);
    json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tied));
    json_object_set_new(r, "torch_dtype",
                        json_string(o->dtype == LLMCL_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(r, "bos_token_id", json_null());
    json_object_set_new(r, "eos_token_id", json_null());
    write_json(r, dir, "config.json");
}

/* adapter_config.json as PEFT's LoraConfig writes it; the base, where --init-from gave one, as an
   absolute path, which --init-adapter (and PEFT's AutoPeftModel) then find on their own. */
static void write_adapter_config(const model *m, const char *dir, const char *base)
{
    char *full = base ? realpath(base, NULL) : NULL;
    const model_config *c = &m->cfg;
    json_t *targets = json_array();
    for (int k = P_WQ; k <= P_WDOWN; ++k)
        if (c->lora_targets & (1u << k))
            json_array_append_new(targets, json_string(model_module_name(k)));
    json_t *r = json_object();
    json_object_set_new(r, "peft_type", json_string("LORA"));
    json_object_set_new(r, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(r, "base_model_name_or_path", full ? json_string(full) : json_null());
    free(full);
    json_object_set_new(r, "r", json_integer(c->lora_rank));
    json_object_set_new(r, "lora_alpha", c->lora_alpha == floorf(c->lora_alpha)
                                             ? json_integer((json_int_t)c->lora_alpha)
                                             : float_json(c->lora_alpha));
    json_object_set_new(r, "target_modules", targets);
    json_object_set_new(r, "lora_dropout", json_real(0.0));
    json_object_set_new(r, "bias", json_string("none"));
    json_object_set_new(r, "fan_in_fan_out", json_false());
    json_object_set_new(r, "use_rslora", json_false());
    json_object_set_new(r, "init_lora_weights", json_true());
    json_object_set_new(r, "inference_mode", json_true());
    json_object_set_new(r, "modules_to_save", json_null());
    write_json(r, dir, "adapter_config.json");
}

/* A writer of dir/name, staged. */
static void writer(export_file *f, const char *dir, const char *name)
{
    *f = (export_file){0};
    CHECK(llmcl_safetensors_writer_create(stage(dir, name), &f->w), NULL);
}

/*
 * Which file each exported parameter goes to: Hugging Face's sharding (save_pretrained's
 * max_shard_size), in export order, a new file where the next tensor would take the current one
 * past shard_bytes (a tensor larger than that alone in its file). shard[i] for m->params[i], -1
 * where it is not exported; returns the number of files.
 */
static int plan_files(const model *m, bool adapters, llmcl_dtype dt, int64_t shard_bytes,
                      int *shard, int64_t *total)
{
    int files = 0;
    int64_t in_file = 0;
    *total = 0;
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        shard[i] = -1;
        if (adapters != (p->kind >= P_LORA_A))
            continue;
        const int64_t bytes = p->numel * (dt == LLMCL_BF16 ? 2 : 4);
        if (files == 0 || (in_file > 0 && in_file + bytes > shard_bytes))
            ++files, in_file = 0;
        shard[i] = files - 1;
        in_file += bytes;
        *total += bytes;
    }
    return files;
}

/* File k of files: the one file's name, or a shard's (model-00001-of-00004.safetensors). */
static void file_name(bool adapters, int k, int files, char name[64])
{
    if (files == 1)
        snprintf(name, 64, "%s", adapters ? "adapter_model.safetensors" : "model.safetensors");
    else
        snprintf(name, 64, "model-%05d-of-%05d.safetensors", k + 1, files);
}

/* model.safetensors.index.json: every tensor's file, and the bytes of them all. */
static void write_index(const model *m, const char *dir, const int *shard, int files,
                        int64_t total)
{
    json_t *map = json_object();
    for (int i = 0; i < m->n_params; ++i)
        if (shard[i] >= 0) {
            char name[64];
            file_name(false, shard[i], files, name);
            json_object_set_new(map, m->params[i].name, json_string(name));
        }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", map);
    write_json(root, dir, "model.safetensors.index.json");
}

/* Removes what an earlier export of the other form left in dir, once this one is in place: its
   one model.safetensors, or its index and shards (those of another count). */
static void remove_stale(const char *dir, int files)
{
    char path[2200];
    if (files > 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        unlink(path);
    }
    DIR *d = opendir(dir);
    if (!d)
        return;
    char keep[64];
    snprintf(keep, sizeof keep, "-of-%05d.safetensors", files);
    struct dirent *e;
    while ((e = readdir(d))) {
        int k, n, end = 0;
        if (sscanf(e->d_name, "model-%5d-of-%5d.safetensors%n", &k, &n, &end) == 2 &&
            end == (int)strlen(e->d_name) && (files == 1 || !strstr(e->d_name, keep))) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

/* One export's walk through the parameters: the files planned, the one being written. */
typedef struct export_walk {
    model *m;
    const char *dir;
    const hf_export_opts *o;
    bool writes, adapters;
    int *shard, files, open_file; /* each parameter's file; how many; the one open (-1: none) */
    export_file f;
    const float *image;       /* the offloaded masters, or NULL */
    const model_param **batch; /* a layer group's parameters, each merged one's adapters after it */
    float **hosts;
} export_walk;

/* The parameters of the layer group at *i (one gather under --zero), *i moved past them. */
static int collect_group(export_walk *w, int *i)
{
    model *m = w->m;
    const int group = model_group(m, &m->params[*i]);
    int n = 0;
    for (; *i < m->n_params && model_group(m, &m->params[*i]) == group; ++*i) {
        const model_param *p = &m->params[*i];
        if (w->adapters != (p->kind >= P_LORA_A))
            continue;
        w->batch[n++] = p;
        if (p->lora_a && w->o->merge) /* its adapters' values after it */
            w->batch[n++] = p->lora_a, w->batch[n++] = p->lora_b;
    }
    return n;
}

/* The batch's values into their files, a file finished before the next opens. */
static void write_batch(export_walk *w, int n)
{
    for (int k = 0; k < n; ++k) {
        const model_param *p = w->batch[k];
        float *values = w->hosts[k];
        if (p->lora_a && w->o->merge) { /* the two after it are its adapters' */
            values = merged_f32(w->m, p, w->hosts[k + 1], w->hosts[k + 2]);
            free(w->hosts[k]), free(w->hosts[k + 1]), free(w->hosts[k + 2]);
            k += 2;
        }
        const int k_file = w->shard[p - w->m->params];
        if (k_file != w->open_file) { /* the next file: the one before it is whole */
            char name[64];
            if (w->open_file >= 0)
                finish(&w->f);
            file_name(w->adapters, k_file, w->files, name);
            writer(&w->f, w->dir, name);
            w->open_file = k_file;
        }
        add(&w->f, p->name, p, values, w->o->dtype);
    }
}

void hf_export(model *m, const char *dir, const hf_export_opts *o)
{
    export_walk w = {.m = m, .dir = dir, .o = o, .writes = o->rank == 0, .open_file = -1};
    if (w.writes && mkdir(dir, 0755) != 0 && errno != EEXIST)
        die("--export: cannot create the folder %s: %s", dir, strerror(errno));
    if (w.writes && !path_is_dir(dir))
        die("--export %s: not a folder", dir);
    w.adapters = m->cfg.lora_rank > 0 && !o->merge;
    w.shard = xmalloc((size_t)m->n_params * sizeof *w.shard);
    int64_t total;
    w.files = plan_files(m, w.adapters, o->dtype,
                         w.adapters || o->shard_bytes <= 0 ? INT64_MAX : o->shard_bytes, w.shard,
                         &total);
    offload_state *off = m->trainable.offloaded; /* the masters from pinned memory, no LoRA */
    float *image = off ? xmalloc((size_t)m->trainable.total * sizeof *image) : NULL;
    if (image)
        CHECK(offload_state_read(off, image, NULL, NULL), m->ctx);
    w.image = image;
    w.batch = xmalloc((size_t)m->n_params * 3 * sizeof *w.batch);
    w.hosts = xmalloc((size_t)m->n_params * 3 * sizeof *w.hosts);
    for (int i = 0; i < m->n_params;) {
        const int n = collect_group(&w, &i);
        download_f32(m, w.batch, n, w.image, w.writes, w.hosts);
        if (w.writes)
            write_batch(&w, n);
    }
    free(w.batch);
    free(w.hosts);
    free(image);
    if (!w.writes) {
        free(w.shard);
        return;
    }
    finish(&w.f);
    if (w.files > 1)
        write_index(m, dir, w.shard, w.files, total);
    if (w.adapters)
        write_adapter_config(m, dir, o->base);
    else
        write_config(m, dir, o);
    commit_staged();
    if (!w.adapters)
        remove_stale(dir, w.files);
    free(w.shard);
}
