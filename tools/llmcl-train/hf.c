/* hf.c: Hugging Face checkpoints and PEFT adapters read into llmcl-train (hf.h), JSON through
   jansson; hf_export.c writes them. */
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

/* Dies unless every tensor of the shards is in the one that weight_map puts it in: a name in two
   shards, or in a shard that weight_map does not give it, would load from whichever shard was
   opened first (a stale shard of another export beside the new ones, say). */
static void check_index(const hf_checkpoint *c, const char *dir, const char *index,
                        const json_t *map)
{
    for (int f = 0; f < c->n_files; ++f)
        for (int64_t i = 0; i < llmcl_safetensors_count(c->files[f]); ++i) {
            const char *name = llmcl_safetensors_name(c->files[f], i);
            const json_t *file = json_object_get(map, name);
            char path[2200];
            if (file)
                snprintf(path, sizeof path, "%s/%s", dir, json_string_value(file));
            if (!file || strcmp(path, c->file_names[f]) != 0)
                die("%s: %s holds %.160s, which weight_map %s%s", index, c->file_names[f], name,
                    file ? "puts in " : "does not name", file ? json_string_value(file) : "");
        }
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
    check_index(c, dir, index, map);
    json_decref(root);
}

void hf_open(const char *path, hf_checkpoint *out)
{
    *out = (hf_checkpoint){0};
    snprintf(out->path, sizeof out->path, "%s", path);
    if (!path_is_dir(path)) {
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

char *hf_adapter_base(const hf_checkpoint *c)
{
    const char *config = c->config;
    json_t *root = load_json(config);
    const json_t *base = json_object_get(root, "base_model_name_or_path");
    if (!json_is_string(base) || !json_string_length(base))
        die("--init-adapter adapts a base model: give it with --init-from (%s names none)",
            config);
    if (!exists(json_string_value(base)))
        die("--init-adapter adapts a base model: give it with --init-from (%s names %.300s, "
            "which is not a file or folder here)", config, json_string_value(base));
    char *found = strdup(json_string_value(base));
    json_decref(root);
    if (!found)
        die("out of host memory");
    return found;
}

void hf_open_adapter(const char *path, hf_checkpoint *out)
{
    *out = (hf_checkpoint){.adapter = true};
    snprintf(out->path, sizeof out->path, "%s", path);
    if (!path_is_dir(path))
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
        die("%s: %s must be \"%s\" for llmcl-train's models", path, key, want);
}

/* model_type: llama, mistral, qwen2 or qwen3 (absent: llama, as before other types came). */
static model_arch read_arch(const json_t *root, const char *path)
{
    const json_t *v = json_object_get(root, "model_type");
    if (!v || json_is_null(v))
        return ARCH_LLAMA;
    for (int a = 0; a < ARCH_COUNT; ++a)
        if (json_is_string(v) && strcmp(json_string_value(v), model_arch_name(a)) == 0)
            return a;
    die("%s: model_type %.60s: llmcl-train reads \"llama\", \"mistral\", \"qwen2\" and "
        "\"qwen3\" (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
        path, json_is_string(v) ? json_string_value(v) : "that is not a string");
}

/*
 * The sliding window that every layer has (0: none) as transformers derives it. Mistral: its
 * sliding_window (4096 where absent, MistralConfig's default). Qwen2 and Qwen3: layer_types where
 * given, else use_sliding_window with the layers from max_window_layers on (28 where absent). A
 * window on some layers only is refused.
 */
static int read_window(const json_t *root, model_arch arch, int layers, const char *path)
{
    if (arch == ARCH_LLAMA)
        return 0;
    const json_t *w = json_object_get(root, "sliding_window");
    const int window = w && json_is_null(w) ? 0 : integer(root, "sliding_window", 4096, path);
    if (arch == ARCH_MISTRAL)
        return window;
    const json_t *types = json_object_get(root, "layer_types");
    int sliding = 0;
    if (json_is_array(types)) {
        size_t i;
        const json_t *t;
        json_array_foreach(types, i, t) {
            const char *name = json_is_string(t) ? json_string_value(t) : "";
            if (strcmp(name, "sliding_attention") != 0 && strcmp(name, "full_attention") != 0)
                die("%s: layer_types holds \"%.60s\": llmcl-train knows full_attention and "
                    "sliding_attention", path, name);
            sliding += strcmp(name, "sliding_attention") == 0;
        }
        if (json_array_size(types) != (size_t)layers)
            die("%s: layer_types names %zu layers where num_hidden_layers is %d", path,
                json_array_size(types), layers);
    } else if (boolean(root, "use_sliding_window", false, path)) {
        const int from = integer(root, "max_window_layers", 28, path);
        sliding = from < layers ? layers - from : 0;
    }
    if (sliding > 0 && (sliding < layers || window == 0))
        die("%s: a sliding window on %d of %d layers: llmcl-train gives every layer the same "
            "attention", path, sliding, layers);
    return sliding ? window : 0;
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
    const model_arch arch = read_arch(root, p);
    const bool qwen = arch == ARCH_QWEN2 || arch == ARCH_QWEN3;
    require_string(root, "hidden_act", "silu", p);
    if (boolean(root, "mlp_bias", false, p))
        die("%s: biases in the MLP are not supported", p);
    /* Qwen2's q, k and v always have biases and o none, Mistral's none: both ignore the key */
    const bool attention_bias = (arch == ARCH_LLAMA || arch == ARCH_QWEN3) &&
                                boolean(root, "attention_bias", false, p);
    cfg->arch = arch;
    cfg->qkv_bias = arch == ARCH_QWEN2 || attention_bias;
    cfg->o_bias = attention_bias;
    cfg->qk_norm = arch == ARCH_QWEN3;
    /* absent keys take the defaults of the architecture's config class */
    cfg->vocab = integer(root, "vocab_size", qwen ? 151936 : 32000, p);
    cfg->dim = integer(root, "hidden_size", 4096, p);
    cfg->ffn = integer(root, "intermediate_size",
                       qwen ? 22016 : arch == ARCH_MISTRAL ? 14336 : 11008, p);
    cfg->layers = integer(root, "num_hidden_layers", 32, p);
    cfg->heads = integer(root, "num_attention_heads", 32, p);
    cfg->kv_heads =
        integer(root, "num_key_value_heads", arch == ARCH_MISTRAL ? 8 : cfg->heads, p);
    cfg->sliding_window = read_window(root, arch, cfg->layers, p);
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
    *max_positions = integer(root, "max_position_embeddings",
                             qwen ? 32768 : arch == ARCH_MISTRAL ? 4096 * 32 : 2048, p);
    const int split = cfg->heads > 0 ? cfg->dim / cfg->heads : 0;
    const int head_dim = integer(root, "head_dim", arch == ARCH_QWEN3 ? 128 : split, p);
    if (head_dim < 1)
        die("%s: head_dim must be >= 1", p);
    /* 0: dim / heads, which model_config_error then checks */
    cfg->head_dim = (int64_t)head_dim * cfg->heads == cfg->dim ? 0 : head_dim;
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
        die("%s: bias must be \"none\": llmcl-train trains no biases beside the adapters", p);
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

/* Room for the longest shape a file may hold: "[", then each dimension's 20 characters and ", ",
   then "]". */
#define SHAPE_TEXT (LLMCL_SAFETENSORS_MAX_DIMS * 22 + 2)

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t at = 0;
    util_appendf(buf, len, &at, "[");
    for (int i = 0; i < ndim; ++i)
        util_appendf(buf, len, &at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    util_appendf(buf, len, &at, "]");
}

/* The file of c holding name, or -1. */
static int find(const hf_checkpoint *c, const char *name, llmcl_safetensors_info *info)
{
    for (int i = 0; i < c->n_files; ++i)
        if (llmcl_safetensors_find(c->files[i], name, info) == LLMCL_OK)
            return i;
    return -1;
}

/* p from c into its value (model_param_value), or through host (numel floats) where the
   masters are not one device tensor: into the image of the offloaded layout, or under --zero into
   llmcl_dist's shards (the trained parameters'). */
static void load_param(model *m, const hf_checkpoint *c, const model_param *p, float *host)
{
    llmcl_safetensors_info info;
    const int f = find(c, p->name, &info);
    if (f < 0)
        die_finally(c->refused, "%s %s: missing tensor %s", option(c), c->path, p->name);
    char want[SHAPE_TEXT], got[SHAPE_TEXT];
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
        CHECK(llmcl_safetensors_load(m->ctx, c->files[f], p->name, model_param_value(p)), m->ctx);
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
        die_finally(c->refused, "%s %s: %s: tensors that llmcl-train's model of this config "
                    "does not use (%s would be dropped)", option(c), c->path, names,
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
