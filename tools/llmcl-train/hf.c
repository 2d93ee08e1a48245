/* hf.c: Hugging Face checkpoints in and out of llmcl-train (hf.h), JSON through jansson. */
#include "hf.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "offload_state.h"
#include "util.h"

/* ---- opening ---- */

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The option that named c, for messages. */
static const char *option(const hf_checkpoint *c)
{
    return c->adapter ? "--init-adapter" : "--init-from";
}

static void add_file(hf_checkpoint *c, const char *path)
{
    for (int i = 0; i < c->n_files; ++i)
        if (strcmp(c->file_names[i], path) == 0)
            return;
    llmcl_safetensors *st = NULL;
    if (llmcl_safetensors_open(path, &st) != LLMCL_OK)
        die("%s: %s", option(c), llmcl_last_error(NULL));
    c->files = realloc(c->files, (size_t)(c->n_files + 1) * sizeof *c->files);
    c->file_names = realloc(c->file_names, (size_t)(c->n_files + 1) * sizeof *c->file_names);
    if (!c->files || !c->file_names)
        die("out of host memory");
    c->files[c->n_files] = st;
    c->file_names[c->n_files++] = strdup(path);
}

static json_t *load_json(const char *path)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        die("%s: %s (line %d)", path, err.text, err.line);
    if (!json_is_object(root))
        die("%s: not a JSON object", path);
    return root;
}

/* The shards that model.safetensors.index.json's weight_map names, each opened once. */
static void open_index(hf_checkpoint *c, const char *dir, const char *index)
{
    json_t *root = load_json(index);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map))
        die("%s: no weight_map object", index);
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        char path[2200];
        if (!json_is_string(file) || strchr(json_string_value(file), '/'))
            die("%s: %s maps to something other than a file name of the folder", index, name);
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(file));
        add_file(c, path);
    }
    if (c->n_files == 0) /* else every tensor would be reported missing, not the index */
        die("%s: weight_map names no tensors", index);
    json_decref(root);
}

void hf_open(const char *path, hf_checkpoint *out)
{
    *out = (hf_checkpoint){0};
    snprintf(out->path, sizeof out->path, "%s", path);
    if (!is_dir(path)) {
        if (!exists(path))
            die("--init-from %s: no such file or folder", path);
        add_file(out, path);
        return;
    }
    char file[1100];
    snprintf(out->config, sizeof out->config, "%s/config.json", path);
    if (!exists(out->config))
        out->config[0] = '\0';
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    if (exists(file)) {
        add_file(out, file);
        return;
    }
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
    if (!exists(file))
        die("--init-from %s: the folder holds neither model.safetensors nor "
            "model.safetensors.index.json", path);
    open_index(out, path, file);
}

void hf_open_adapter(const char *path, hf_checkpoint *out)
{
    *out = (hf_checkpoint){.adapter = true};
    snprintf(out->path, sizeof out->path, "%s", path);
    if (!is_dir(path))
        die("--init-adapter %s: not a folder (PEFT saves an adapter as a folder with "
            "adapter_config.json and adapter_model.safetensors)", path);
    snprintf(out->config, sizeof out->config, "%s/adapter_config.json", path);
    if (!exists(out->config))
        die("--init-adapter %s: the folder holds no adapter_config.json", path);
    char file[1100];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", path);
    if (!exists(file))
        die("--init-adapter %s: the folder holds no adapter_model.safetensors (PEFT's pickled "
            "adapter_model.bin is not read: save with safe_serialization=True)", path);
    add_file(out, file);
}

void hf_close(hf_checkpoint *c)
{
    for (int i = 0; i < c->n_files; ++i) {
        llmcl_safetensors_close(c->files[i]);
        free(c->file_names[i]);
    }
    free(c->files);
    free(c->file_names);
    *c = (hf_checkpoint){0};
}

/* ---- config.json ---- */

static double number(const json_t *root, const char *key, double absent, const char *path)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return absent;
    if (!json_is_number(v))
        die("%s: %s is not a number", path, key);
    return json_number_value(v);
}

static int integer(const json_t *root, const char *key, int absent, const char *path)
{
    const double v = number(root, key, absent, path);
    if (v != floor(v) || v < 0 || v > 1 << 30)
        die("%s: %s = %g is not a count", path, key, v);
    return (int)v;
}

static bool boolean(const json_t *root, const char *key, bool absent, const char *path)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return absent;
    if (!json_is_boolean(v))
        die("%s: %s is not true or false", path, key);
    return json_is_true(v);
}

/* A string key that must hold one value (when present). */
static void require_string(const json_t *root, const char *key, const char *want, const char *path)
{
    const json_t *v = json_object_get(root, key);
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), want) != 0))
        die("%s: %s must be \"%s\" for llmcl-train's Llama model", path, key, want);
}

/*
 * RoPE's scaling: transformers 5 saves it with the base in "rope_parameters" (rope_type "default"
 * or "llama3"); earlier versions in "rope_scaling" (null, or llama3) beside "rope_theta". Llama 3
 * scaling must have Llama 3.1's constants. Returns the factor (0: none) and sets *theta.
 */
static double rope_scaling(const json_t *root, const char *path, double *theta)
{
    const json_t *rs = json_object_get(root, "rope_parameters");
    const char *key = "rope_parameters";
    if (rs && json_is_object(rs)) {
        *theta = number(rs, "rope_theta", *theta, path);
    } else {
        rs = json_object_get(root, "rope_scaling");
        key = "rope_scaling";
    }
    if (!rs || json_is_null(rs))
        return 0;
    const json_t *type = json_object_get(rs, "rope_type");
    if (!type)
        type = json_object_get(rs, "type");
    if (json_is_string(type) && strcmp(json_string_value(type), "default") == 0)
        return 0;
    if (!json_is_string(type) || strcmp(json_string_value(type), "llama3") != 0)
        die("%s: %s of a type other than default or llama3 is not supported", path, key);
    if (number(rs, "low_freq_factor", 1, path) != 1 ||
        number(rs, "high_freq_factor", 4, path) != 4 ||
        number(rs, "original_max_position_embeddings", 8192, path) != 8192)
        die("%s: llama3 rope_scaling needs low_freq_factor 1, high_freq_factor 4 and "
            "original_max_position_embeddings 8192 (Llama 3.1's)", path);
    const double factor = number(rs, "factor", 0, path);
    if (!(factor > 0))
        die("%s: rope_scaling.factor must be > 0", path);
    return factor;
}

bool hf_read_config(const hf_checkpoint *c, model_config *cfg, int *max_positions)
{
    if (!c->config[0])
        return false;
    const char *p = c->config;
    json_t *root = load_json(p);
    require_string(root, "model_type", "llama", p);
    require_string(root, "hidden_act", "silu", p);
    if (boolean(root, "attention_bias", false, p) || boolean(root, "mlp_bias", false, p))
        die("%s: biases in attention or MLP are not supported", p);
    /* absent keys take LlamaConfig's defaults */
    cfg->vocab = integer(root, "vocab_size", 32000, p);
    cfg->dim = integer(root, "hidden_size", 4096, p);
    cfg->ffn = integer(root, "intermediate_size", 11008, p);
    cfg->layers = integer(root, "num_hidden_layers", 32, p);
    cfg->heads = integer(root, "num_attention_heads", 32, p);
    cfg->kv_heads = integer(root, "num_key_value_heads", cfg->heads, p);
    /* a negative eps, one past float's range or a theta <= 0 (which --rope-theta refuses) would
       train on NaN */
    const double eps = number(root, "rms_norm_eps", 1e-6, p);
    if (!(eps >= 0 && eps <= FLT_MAX))
        die("%s: rms_norm_eps = %g is not a non-negative float", p, eps);
    cfg->norm_eps = (float)eps;
    cfg->rope_theta = number(root, "rope_theta", 10000, p);
    cfg->rope_llama3_factor = rope_scaling(root, p, &cfg->rope_theta);
    if (!(cfg->rope_theta > 0))
        die("%s: rope_theta = %g must be > 0", p, cfg->rope_theta);
    cfg->tied = boolean(root, "tie_word_embeddings", false, p);
    *max_positions = integer(root, "max_position_embeddings", 2048, p);
    const int head_dim = cfg->heads > 0 ? integer(root, "head_dim", cfg->dim / cfg->heads, p) : 0;
    if ((int64_t)head_dim * cfg->heads != cfg->dim) /* each up to 2^30: the product in 64 bits */
        die("%s: head_dim must be hidden_size / num_attention_heads", p);
    json_decref(root);
    return true;
}

/* ---- adapter_config.json ---- */

/* A key that must be absent or say nothing: null, false, "", an empty list or object. */
static void require_unset(const json_t *root, const char *key, const char *what, const char *path)
{
    const json_t *v = json_object_get(root, key);
    const bool unset = !v || json_is_null(v) || json_is_false(v) ||
                       (json_is_string(v) && !json_string_length(v)) ||
                       (json_is_array(v) && !json_array_size(v)) ||
                       (json_is_object(v) && !json_object_size(v));
    if (!unset)
        die("%s: %s (%s) is not supported by llmcl-train's LoRA", path, key, what);
}

/* target_modules: a list of Llama's projections by their module names or by paths that end in
   them (PEFT matches either; it saves "all-linear" as every layer's paths), or "all-linear" (every
   linear layer but the output head). Paths that leave out some layers' modules leave their
   adapters out of the file, which hf_load_adapters then refuses as missing. */
static unsigned adapter_targets(const json_t *root, const char *path)
{
    const json_t *t = json_object_get(root, "target_modules");
    if (json_is_string(t) && strcmp(json_string_value(t), "all-linear") == 0)
        return LORA_ALL_TARGETS;
    if (!json_is_array(t) || json_array_size(t) == 0)
        die("%s: target_modules must be a list of module names or \"all-linear\" (a regular "
            "expression is not supported)", path);
    unsigned targets = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(t, i, v) {
        const char *name = json_is_string(v) ? json_string_value(v) : "";
        const char *module = strrchr(name, '.') ? strrchr(name, '.') + 1 : name;
        int kind = P_WQ; /* the kinds between are norms, whose module name is "" */
        while (kind <= P_WDOWN && !((LORA_ALL_TARGETS & (1u << kind)) &&
                                    strcmp(module, model_module_name(kind)) == 0))
            ++kind;
        if (kind > P_WDOWN)
            die("%s: target_modules names %.100s: llmcl-train adapts q_proj, k_proj, v_proj, "
                "o_proj, gate_proj, up_proj and down_proj (by name or by a path ending in one)",
                path, json_is_string(v) ? name : "something other than a name");
        targets |= 1u << kind;
    }
    return targets;
}

/* LoraConfig's keys that change the model beyond one rank, alpha and set of targets for every
   layer, and what each would add. */
static const char *const unsupported[][2] = {
    {"use_dora", "DoRA's magnitudes"},
    {"lora_bias", "a bias on B"},
    {"fan_in_fan_out", "GPT-2's transposed weights"},
    {"rank_pattern", "ranks per module"},
    {"alpha_pattern", "alphas per module"},
    {"layers_to_transform", "adapters on some layers"},
    {"layers_pattern", "adapters on some layers"},
    {"modules_to_save", "whole modules trained beside the adapters"},
    {"trainable_token_indices", "trained embedding rows"},
    {"target_parameters", "adapters on parameters"},
    {"layer_replication", "layers repeated"},
    {"use_qalora", "QALoRA's pooled inputs"},
};

void hf_read_adapter_config(const hf_checkpoint *c, model_config *cfg)
{
    const char *p = c->config;
    json_t *root = load_json(p);
    const json_t *type = json_object_get(root, "peft_type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "LORA") != 0)
        die("%s: peft_type must be \"LORA\"", p);
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; ++i)
        require_unset(root, unsupported[i][0], unsupported[i][1], p);
    const json_t *bias = json_object_get(root, "bias");
    if (bias && !json_is_null(bias) &&
        (!json_is_string(bias) || strcmp(json_string_value(bias), "none") != 0))
        die("%s: bias must be \"none\": llmcl-train's Llama model has no biases", p);
    /* absent keys take LoraConfig's defaults */
    const int r = integer(root, "r", 8, p);
    if (r < 1 || r > 1 << 16)
        die("%s: r = %d must be from 1 to 65536", p, r);
    const double alpha = number(root, "lora_alpha", 8, p);
    const double as_r = boolean(root, "use_rslora", false, p) ? alpha * sqrt(r) : alpha;
    if (!(as_r > 0 && as_r <= FLT_MAX))
        die("%s: lora_alpha = %g must be a positive float", p, alpha);
    cfg->lora_rank = r;
    cfg->lora_alpha = (float)as_r;
    cfg->lora_targets = adapter_targets(root, p);
    json_decref(root);
}

/* ---- loading ---- */

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    int at = snprintf(buf, len, "[");
    for (int i = 0; i < ndim; ++i)
        at += snprintf(buf + at, len - (size_t)at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + at, len - (size_t)at, "]");
}

/* The file of c holding name, or -1. */
static int find(const hf_checkpoint *c, const char *name, llmcl_safetensors_info *info)
{
    for (int i = 0; i < c->n_files; ++i)
        if (llmcl_safetensors_find(c->files[i], name, info) == LLMCL_OK)
            return i;
    return -1;
}

/* p from c into its master (bf16 adapters: their weights), or through host (numel floats) where the
   masters are not one device tensor: into the image of the offloaded layout, or under --zero into
   llmcl_dist's shards (the trained parameters'). */
static void load_param(model *m, const hf_checkpoint *c, const model_param *p, float *host)
{
    llmcl_safetensors_info info;
    const int f = find(c, p->name, &info);
    if (f < 0)
        die_finally(c->refused, "%s %s: missing tensor %s", option(c), c->path, p->name);
    char want[64], got[64];
    shape_text(p->ndim, p->shape, want, sizeof want);
    shape_text(info.ndim, info.shape, got, sizeof got);
    if (strcmp(want, got) != 0)
        die_finally(c->refused, "%s %s: %s is %s there, the model expects %s", option(c),
                    c->file_names[f], p->name, got, want);
    if (info.dtype != LLMCL_F32 && info.dtype != LLMCL_BF16 && info.dtype != LLMCL_F16)
        die_finally(c->refused, "%s %s: %s is %s, not f32, bf16 or f16", option(c),
                    c->file_names[f], p->name, info.dtype_name);
    if (host) {
        safetensors_to_host(c->files[f], p->name, host, p->numel);
        if (m->zero)
            model_param_set(m, p, host);
    } else
        CHECK(llmcl_safetensors_load(m->ctx, c->files[f], p->name, p->master ? p->master : p->w16),
              m->ctx);
}

/* Whether the model reads the tensor called name from a checkpoint (an adapter). */
static bool consumed(model *m, const hf_checkpoint *c, const char *name)
{
    const model_param *p = model_find(m, name);
    if (p || c->adapter)
        return p && (p->kind >= P_LORA_A) == c->adapter;
    /* transformers ignores both: a tied head's stored copy (where config.json ties it; hf_load
       refuses it otherwise) and RoPE's frequencies, which early Llama checkpoints saved */
    const char *freq = ".rotary_emb.inv_freq";
    const size_t n = strlen(name), k = strlen(freq);
    return (m->cfg.tied && c->config[0] && strcmp(name, "lm_head.weight") == 0) ||
           (n > k && strcmp(name + n - k, freq) == 0);
}

/* Dies naming the tensors of c that the model would drop (three, then a count): a Qwen2
   checkpoint's biases, another architecture's modules, adapters beside a base; in an adapter,
   DoRA's magnitudes, biases, another module's adapters. */
static void refuse_unused(model *m, const hf_checkpoint *c)
{
    char names[600] = "";
    int unused = 0;
    for (int f = 0; f < c->n_files; ++f)
        for (int64_t i = 0; i < llmcl_safetensors_count(c->files[f]); ++i) {
            const char *name = llmcl_safetensors_name(c->files[f], i);
            if (!consumed(m, c, name) && ++unused <= 3)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%.160s",
                         unused > 1 ? ", " : "", name);
        }
    if (unused > 3)
        snprintf(names + strlen(names), sizeof names - strlen(names), " and %d more", unused - 3);
    if (unused)
        die_finally(c->refused, "%s %s: %s: tensors that llmcl-train's Llama model does not use "
                    "(%s would be dropped)", option(c), c->path, names,
            c->adapter ? "DoRA's magnitudes, biases or other modules' adapters"
                       : "biases or another architecture's weights");
}

/* Under --zero, a host buffer for the largest parameter in the dist (the trained ones), else
   NULL. */
static float *dist_buffer(const model *m)
{
    int64_t largest = 0;
    for (int i = 0; m->zero && i < m->n_params; ++i)
        if (m->params[i].trainable && m->params[i].numel > largest)
            largest = m->params[i].numel;
    return largest ? xmalloc((size_t)largest * sizeof(float)) : NULL;
}

void hf_load(model *m, const hf_checkpoint *c)
{
    llmcl_safetensors_info info;
    /* with tie_word_embeddings, transformers ignores a stored lm_head.weight; without a config
       the model is tied only because no --untied was given */
    if (m->cfg.tied && !c->config[0] && find(c, "lm_head.weight", &info) >= 0)
        die_finally(c->refused, "--init-from %s holds lm_head.weight but the model ties its "
                    "head to the embeddings (give --untied)", c->path);
    refuse_unused(m, c);
    /* offloaded masters (no LoRA then: every base weight is trained) go through a host image,
       the moments starting at zero; under --zero each parameter through a host buffer */
    offload_state *off = m->trainable.offloaded;
    float *image = off ? xcalloc((size_t)m->trainable.total, sizeof *image) : NULL;
    float *buffer = dist_buffer(m);
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        if (p->kind < P_LORA_A)
            load_param(m, c, p, image ? image + p->offset : p->trainable ? buffer : NULL);
    }
    if (image)
        CHECK(offload_state_write(off, image, NULL, NULL), m->ctx);
    free(image);
    free(buffer);
    CHECK(model_sync_compute(m), m->ctx);
}

void hf_load_adapters(model *m, const hf_checkpoint *c)
{
    refuse_unused(m, c);
    float *buffer = dist_buffer(m);
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].kind >= P_LORA_A)
            load_param(m, c, &m->params[i], buffer);
    free(buffer);
    CHECK(model_sync_compute(m), m->ctx);
}

/* ---- export ---- */

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

/* W + s B A in f32 on the device (the adapters' masters, or their bf16 copies, into an f32 c). */
/* An f32 device tensor of p's shape holding host. */
static llmcl_tensor *f32_tensor(model *m, const model_param *p, const float *host)
{
    llmcl_tensor *t = NULL;
    CHECK(llmcl_tensor_create(m->ctx, LLMCL_F32, p->ndim, p->shape, &t), m->ctx);
    if (host)
        CHECK(llmcl_tensor_upload(t, host, (size_t)p->numel * sizeof *host), m->ctx);
    return t;
}

/* W + s B A in f32 on the device, from p's frozen master and its adapters' f32 values on the host
   (which under --zero come from the dist). */
static float *merged_f32(model *m, const model_param *p, const float *a_host, const float *b_host)
{
    llmcl_tensor *w = f32_tensor(m, p, NULL), *a = f32_tensor(m, p->lora_a, a_host),
                 *b = f32_tensor(m, p->lora_b, b_host);
    CHECK(llmcl_copy(m->ctx, p->master, w), m->ctx);
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

static void write_json(json_t *root, const char *dir, const char *name)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) != 0)
        die("cannot write %s", path);
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

/* config.json in LlamaConfig's layout. */
static void write_config(const model *m, const char *dir, const hf_export_opts *o)
{
    const model_config *c = &m->cfg;
    json_t *r = json_object();
    json_object_set_new(r, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(r, "model_type", json_string("llama"));
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
    json_object_set_new(r, "attention_bias", json_false());
    json_object_set_new(r, "mlp_bias", json_false());
    json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tied));
    json_object_set_new(r, "torch_dtype",
                        json_string(o->dtype == LLMCL_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(r, "bos_token_id", json_null());
    json_object_set_new(r, "eos_token_id", json_null());
    write_json(r, dir, "config.json");
}

/* adapter_config.json as PEFT's LoraConfig writes it. */
static void write_adapter_config(const model *m, const char *dir)
{
    const model_config *c = &m->cfg;
    json_t *targets = json_array();
    for (int k = P_WQ; k <= P_WDOWN; ++k)
        if (c->lora_targets & (1u << k))
            json_array_append_new(targets, json_string(model_module_name(k)));
    json_t *r = json_object();
    json_object_set_new(r, "peft_type", json_string("LORA"));
    json_object_set_new(r, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(r, "base_model_name_or_path", json_null());
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

static void writer(export_file *f, const char *dir, const char *name)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = (export_file){0};
    CHECK(llmcl_safetensors_writer_create(path, &f->w), NULL);
}

void hf_export(model *m, const char *dir, const hf_export_opts *o)
{
    const bool writes = o->rank == 0;
    if (writes && mkdir(dir, 0755) != 0 && errno != EEXIST)
        die("--export: cannot create the folder %s: %s", dir, strerror(errno));
    if (writes && !is_dir(dir))
        die("--export %s: not a folder", dir);
    export_file f = {0};
    const bool adapters = m->cfg.lora_rank > 0 && !o->merge;
    if (writes)
        writer(&f, dir, adapters ? "adapter_model.safetensors" : "model.safetensors");
    offload_state *off = m->trainable.offloaded; /* the masters from pinned memory, no LoRA */
    float *image = off ? xmalloc((size_t)m->trainable.total * sizeof *image) : NULL;
    if (image)
        CHECK(offload_state_read(off, image, NULL, NULL), m->ctx);
    const model_param **batch = xmalloc((size_t)m->n_params * 3 * sizeof *batch);
    float **hosts = xmalloc((size_t)m->n_params * 3 * sizeof *hosts);
    for (int i = 0; i < m->n_params;) { /* a layer group at a time: one gather under --zero */
        const int group = model_group(m, &m->params[i]);
        int n = 0;
        for (; i < m->n_params && model_group(m, &m->params[i]) == group; ++i) {
            const model_param *p = &m->params[i];
            if (adapters != (p->kind >= P_LORA_A))
                continue;
            batch[n++] = p;
            if (p->lora_a && o->merge) /* its adapters' values after it */
                batch[n++] = p->lora_a, batch[n++] = p->lora_b;
        }
        download_f32(m, batch, n, image, writes, hosts);
        for (int k = 0; writes && k < n; ++k) {
            const model_param *p = batch[k];
            float *values = hosts[k];
            if (p->lora_a && o->merge) { /* the two after it are its adapters' */
                values = merged_f32(m, p, hosts[k + 1], hosts[k + 2]);
                free(hosts[k]), free(hosts[k + 1]), free(hosts[k + 2]);
                k += 2;
            }
            add(&f, p->name, p, values, o->dtype);
        }
    }
    free(batch);
    free(hosts);
    free(image);
    if (!writes)
        return;
    finish(&f);
    if (adapters)
        write_adapter_config(m, dir);
    else
        write_config(m, dir, o);
}
