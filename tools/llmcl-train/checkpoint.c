/* checkpoint.c: llmcl-train's checkpoints in safetensors (checkpoint.h). */
#include "checkpoint.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "offload_state.h"
#include "util.h"
#ifdef LLMCL_TRAIN_MPI
#include "zero.h"
#endif

#define CHECKPOINT_FORMAT "llmcl-train checkpoint 1"
#define ZERO_FORMAT "llmcl-train zero checkpoint 1"

static char why_buf[512], from_buf[4200];

/*
 * Elements [at, at + n) of the frozen set's layout as f32 values: its masters (an f32 model's),
 * else each frozen parameter's own values widened, 0 between parameters, as the masters held
 * them. A base loaded from a 16-bit checkpoint so hashes as it did when its masters were kept.
 */
static void frozen_values(model *m, int64_t at, int64_t n, float *host)
{
    if (m->frozen.master) {
        llmcl_tensor *v = tensor_slice(m->frozen.master, at, n);
        tensor_download_f32(v, host, n);
        llmcl_tensor_destroy(v);
        return;
    }
    memset(host, 0, (size_t)n * sizeof *host);
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        int64_t first;
        const int64_t k = p->trainable ? 0 : model_param_within(p, at, n, &first);
        if (k == 0)
            continue;
        llmcl_tensor *v = tensor_slice(model_param_value(p), first - p->offset, k);
        tensor_download_f32(v, host + (first - at), k);
        llmcl_tensor_destroy(v);
    }
}

/* A 64-bit hash of the frozen set's f32 weights, read from the device once per model. */
static uint64_t frozen_fingerprint(model *m)
{
    if (m->frozen_fingerprint)
        return m->frozen_fingerprint;
    const int64_t piece = 1 << 22;
    float *host = xmalloc((size_t)piece * sizeof *host);
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t at = 0; at < m->frozen.total; at += piece) {
        const int64_t n = m->frozen.total - at < piece ? m->frozen.total - at : piece;
        frozen_values(m, at, n, host);
        for (int64_t i = 0; i < n; ++i) { /* multiply-xorshift per word: order and value matter */
            uint32_t word;
            memcpy(&word, &host[i], sizeof word);
            h = (h ^ word) * 0xff51afd7ed558ccdull, h ^= h >> 32;
        }
    }
    free(host);
    m->frozen_fingerprint = h ? h : 1;
    return m->frozen_fingerprint;
}

/* The model's shape as metadata entries, in a fixed order. An entry with a value for absent is
   written only where it differs from it, and a file without it has that value: checkpoints from
   before the entry came, of Llama models, read as they did. */
typedef struct shape_entry {
    const char *key;
    char value[64];
    bool optional;   /* absent holds what a file without the entry has */
    char absent[16];
} shape_entry;

enum { SHAPE_ENTRIES = 24 };

/* What an architecture adds to a Llama model's layers. */
static int arch_entries(const model *m, shape_entry *e)
{
    const model_config *c = &m->cfg;
    const char *keys[] = {"head_dim", "qkv_bias", "o_bias", "qk_norm", "sliding_window"};
    const int vals[] = {m->head_dim, c->qkv_bias, c->o_bias, c->qk_norm, c->sliding_window};
    e[0] = (shape_entry){.key = "arch", .optional = true, .absent = "llama"};
    snprintf(e[0].value, sizeof e[0].value, "%s", model_arch_name(c->arch));
    for (int i = 0; i < 5; ++i) {
        e[i + 1] = (shape_entry){.key = keys[i], .optional = true, .absent = "0"};
        snprintf(e[i + 1].value, sizeof e[i + 1].value, "%d", vals[i]);
    }
    snprintf(e[1].absent, sizeof e[1].absent, "%d", c->dim / c->heads);
    return 6;
}

/* The base entries, the architecture's, then with LoRA its own (a LoRA checkpoint also names the
   fingerprint of the frozen weights, which it does not hold: see checkpoint.h). */
static int shape_entries(model *m, shape_entry e[SHAPE_ENTRIES])
{
    const model_config *c = &m->cfg;
    const char *keys[] = {"vocab", "dim", "layers", "heads", "kv_heads", "ffn", "tied",
                          "norm_eps", "rope_theta", "rope_llama3_factor", "lora_rank",
                          "lora_alpha"};
    const double vals[] = {c->vocab, c->dim, c->layers, c->heads, c->kv_heads, c->ffn, c->tied,
                           c->norm_eps, c->rope_theta, c->rope_llama3_factor, c->lora_rank,
                           c->lora_alpha};
    int n = c->lora_rank > 0 ? 12 : 10;
    for (int i = 0; i < n; ++i) {
        e[i] = (shape_entry){.key = keys[i]};
        snprintf(e[i].value, sizeof e[i].value, "%.9g", vals[i]);
    }
    n += arch_entries(m, e + n);
    if (c->lora_rank == 0)
        return n;
    e[n] = (shape_entry){.key = "lora_targets"};
    for (int k = P_WQ; k <= P_WDOWN; ++k)
        if (c->lora_targets & (1u << k))
            snprintf(e[n].value + strlen(e[n].value), sizeof e[n].value - strlen(e[n].value),
                     "%s%s", e[n].value[0] ? "," : "", model_module_name(k));
    e[n + 1] = (shape_entry){.key = "lora_dtype"};
    snprintf(e[n + 1].value, sizeof e[n + 1].value, "%s", llmcl_dtype_name(c->lora_dtype));
    e[n + 2] = (shape_entry){.key = "base_fingerprint"};
    snprintf(e[n + 2].value, sizeof e[n + 2].value, "%016" PRIx64, frozen_fingerprint(m));
    return n + 3;
}

/* A trainable parameter's three tensors in a checkpoint: its weights and its two moments. */
enum { STATE_WEIGHTS, STATE_M, STATE_V, STATE_KINDS };
static const char *state_prefix[STATE_KINDS] = {"", "optimizer.m.", "optimizer.v."};

static void state_name(const model_param *p, int kind, char name[128])
{
    snprintf(name, 128, "%s%s", state_prefix[kind], p->name);
}

/* What a kind is saved from and loaded into on the device: the weights' master, else their 16-bit
   copy; the moments. */
static llmcl_tensor *state_tensor(const model_param *p, int kind)
{
    llmcl_tensor *t[STATE_KINDS] = {p->master ? p->master : p->w16, p->m, p->v};
    return t[kind];
}

/*
 * Under --offload-optimizer the masters and moments are read from pinned memory into host images
 * of the layout (12 bytes a trained parameter), which the writer borrows until it finishes.
 */
typedef struct host_state {
    float *image[STATE_KINDS];
} host_state;

static host_state host_state_alloc(const model *m)
{
    host_state h = {{NULL}};
    for (int k = 0; m->trainable.offloaded && k < STATE_KINDS; ++k)
        h.image[k] = xcalloc((size_t)m->trainable.total, sizeof(float));
    return h;
}

static void host_state_free(host_state *h)
{
    for (int k = 0; k < STATE_KINDS; ++k)
        free(h->image[k]);
}

static llmcl_status add_state(llmcl_safetensors_writer *w, const model_param *p,
                              const host_state *h)
{
    char name[128];
    for (int k = 0; k < STATE_KINDS; ++k) {
        state_name(p, k, name);
        TRY(h->image[k] ? llmcl_safetensors_writer_add_host(w, name, LLMCL_F32, p->ndim, p->shape,
                                                             h->image[k] + p->offset)
                        : llmcl_safetensors_writer_add_tensor(w, name, state_tensor(p, k)));
    }
    return LLMCL_OK;
}

/* The format, the model's shape, the step and the data position as metadata. */
static llmcl_status write_metadata(llmcl_safetensors_writer *w, model *m, const train_state *s,
                                   const char *format)
{
    char num[32];
    TRY(llmcl_safetensors_writer_metadata(w, "format", format));
    shape_entry e[SHAPE_ENTRIES];
    for (int i = 0, n = shape_entries(m, e); i < n; ++i)
        if (!e[i].optional || strcmp(e[i].value, e[i].absent) != 0)
            TRY(llmcl_safetensors_writer_metadata(w, e[i].key, e[i].value));
    snprintf(num, sizeof num, "%" PRId64, s->step);
    TRY(llmcl_safetensors_writer_metadata(w, "step", num));
    snprintf(num, sizeof num, "%" PRId64, s->data_pos);
    return llmcl_safetensors_writer_metadata(w, "data_pos", num);
}

static llmcl_status write_checkpoint(llmcl_safetensors_writer *w, model *m, const train_state *s)
{
    TRY(write_metadata(w, m, s, CHECKPOINT_FORMAT));
    host_state h = host_state_alloc(m);
    llmcl_status st = LLMCL_OK;
    if (m->trainable.offloaded)
        st = offload_state_read(m->trainable.offloaded, h.image[STATE_WEIGHTS], h.image[STATE_M],
                                h.image[STATE_V]);
    for (int i = 0; st == LLMCL_OK && i < m->n_params; ++i)
        if (m->params[i].trainable)
            st = add_state(w, &m->params[i], &h);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_finish(w);
    host_state_free(&h);
    return st;
}

#ifdef LLMCL_TRAIN_MPI
/* What the --zero callbacks of llmcl_dist read and write besides the dist's own files. */
typedef struct zero_files {
    model *m;
    const train_state *saving; /* save: the state to write */
    train_state *loaded;       /* load: the state read */
    const char *dir; /* load: the folder asked for */
    bool elsewhere;  /* load: llmcl_dist found it in another folder, named in from_buf */
    bool failed;     /* the callback failed here: its reason is in why_buf */
} zero_files;

/* Rank 0: train.safetensors, the metadata of a one-file checkpoint, into the save's folder. */
static llmcl_status write_train_file(const char *folder, void *arg)
{
    zero_files *z = arg;
    llmcl_dist_info info;
    TRY(llmcl_dist_info_get(z->m->zero->dist, &info));
    if (info.rank != 0)
        return LLMCL_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/train.safetensors", folder);
    llmcl_safetensors_writer *w = NULL;
    llmcl_status st = llmcl_safetensors_writer_create(path, &w);
    if (st == LLMCL_OK)
        st = write_metadata(w, z->m, z->saving, ZERO_FORMAT);
    if (st == LLMCL_OK)
        st = llmcl_safetensors_writer_finish(w);
    llmcl_safetensors_writer_destroy(w);
    if (st != LLMCL_OK) {
        snprintf(why_buf, sizeof why_buf, "%s", llmcl_last_error(NULL));
        z->failed = true;
    }
    return st;
}

/*
 * Under --zero a checkpoint is a folder: llmcl_dist's shard files and manifest, which reshard onto
 * any number of ranks, and train.safetensors (no tensors) with the metadata of a one-file
 * checkpoint, written into the same temporary folder before llmcl_dist renames it into place, so
 * that a job killed while saving leaves the previous checkpoint or the new one, whole. The data
 * position is the whole job's (every rank derives its own from it), so a resume may use another
 * number of ranks.
 */
static llmcl_status zero_save(model *m, const train_state *s, const char *dir)
{
    zero_files z = {.m = m, .saving = s};
    const llmcl_status st = llmcl_dist_save_with(m->zero->dist, dir, write_train_file, &z);
    if (st != LLMCL_OK && !z.failed)
        snprintf(why_buf, sizeof why_buf, "%s", llmcl_last_error(m->ctx));
    return st;
}
#endif

llmcl_status checkpoint_save(model *m, const train_state *s, const char *path, const char **why)
{
    *why = why_buf;
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_save(m, s, path);
#endif
    llmcl_safetensors_writer *w = NULL;
    llmcl_status st = llmcl_safetensors_writer_create(path, &w);
    if (st == LLMCL_OK)
        st = write_checkpoint(w, m, s);
    llmcl_safetensors_writer_destroy(w);
    if (st != LLMCL_OK) /* the writer's message, else the device's */
        snprintf(why_buf, sizeof why_buf, "%s",
                 llmcl_last_error(NULL)[0] ? llmcl_last_error(NULL) : llmcl_last_error(m->ctx));
    return st;
}

/* The metadata's format and shape against m's; a message in why_buf when they differ. */
static llmcl_status check_shape(const llmcl_safetensors *st, model *m, const char *path,
                                const char *want)
{
    const char *format = llmcl_safetensors_metadata(st, "format");
    if (format && strcmp(format, want) != 0 &&
        (strcmp(format, ZERO_FORMAT) == 0 || strcmp(format, CHECKPOINT_FORMAT) == 0)) {
        snprintf(why_buf, sizeof why_buf,
                 "%s was written %s --zero: a one-file checkpoint and a --zero folder do not "
                 "resume as each other", path, strcmp(format, ZERO_FORMAT) == 0 ? "with" : "without");
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    if (!format || strcmp(format, want) != 0) {
        snprintf(why_buf, sizeof why_buf, "%s is not an llmcl-train checkpoint (format '%s')",
                 path, format ? format : "none");
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    const char *rank = llmcl_safetensors_metadata(st, "lora_rank");
    if ((rank && strcmp(rank, "0") != 0) != (m->cfg.lora_rank > 0)) {
        snprintf(why_buf, sizeof why_buf, "%s is %s LoRA checkpoint and this run %s LoRA", path,
                 rank ? "a" : "not a", m->cfg.lora_rank > 0 ? "uses" : "does not use");
        return LLMCL_ERROR_SHAPE_MISMATCH;
    }
    shape_entry e[SHAPE_ENTRIES];
    for (int i = 0, n = shape_entries(m, e); i < n; ++i) {
        const char *v = llmcl_safetensors_metadata(st, e[i].key);
        v = v || !e[i].optional ? v : e[i].absent;
        if (v && strcmp(e[i].key, "base_fingerprint") == 0 && strcmp(v, e[i].value) != 0) {
            snprintf(why_buf, sizeof why_buf,
                     "%s adapts other base weights (fingerprint %s there, %s here): give the "
                     "--init-from of the run that wrote it", path, v, e[i].value);
            return LLMCL_ERROR_SHAPE_MISMATCH;
        }
        if (!v || strcmp(v, e[i].value) != 0) {
            snprintf(why_buf, sizeof why_buf,
                     "%s holds a model of another shape: %s is %s there and %s here", path,
                     e[i].key, v ? v : "missing", e[i].value);
            return LLMCL_ERROR_SHAPE_MISMATCH;
        }
    }
    return LLMCL_OK;
}

/* The checkpoint's format, shape and tensors against m's; a message in why_buf when they differ. */
static llmcl_status check_compatible(const llmcl_safetensors *st, model *m, const char *path)
{
    TRY(check_shape(st, m, path, CHECKPOINT_FORMAT));
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        for (int k = 0; k < STATE_KINDS && p->trainable; ++k) {
            char name[128];
            llmcl_safetensors_info info;
            state_name(p, k, name);
            if (llmcl_safetensors_find(st, name, &info) != LLMCL_OK || info.ndim != p->ndim ||
                info.shape[0] != p->shape[0] || (p->ndim == 2 && info.shape[1] != p->shape[1]) ||
                (info.dtype != LLMCL_F32 && info.dtype != LLMCL_BF16 && info.dtype != LLMCL_F16)) {
                snprintf(why_buf, sizeof why_buf,
                         "%s lacks %s or holds it in another shape or a non-float dtype", path,
                         name);
                return LLMCL_ERROR_SHAPE_MISMATCH;
            }
        }
    }
    return LLMCL_OK;
}

/* A count that checkpoint_save wrote as decimal digits, or -1 for anything else: "12x", "",
   " 7" or one past int64 would otherwise resume at a step and data position the file never held. */
static int64_t meta_int(const llmcl_safetensors *st, const char *key)
{
    const char *v = llmcl_safetensors_metadata(st, key);
    if (!v || !isdigit((unsigned char)v[0]))
        return -1;
    char *end;
    errno = 0;
    const long long n = strtoll(v, &end, 10);
    return errno == 0 && *end == '\0' ? n : -1;
}

/* The trainable weights and moments from st into the device tensors, or when offloaded through
   host images (zeros between tensors, as on the device); then the compute copy. */
static llmcl_status load_state(model *m, const llmcl_safetensors *st)
{
    char name[128];
    host_state h = host_state_alloc(m);
    llmcl_status status = LLMCL_OK;
    for (int i = 0; status == LLMCL_OK && i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        for (int k = 0; k < STATE_KINDS && p->trainable && status == LLMCL_OK; ++k) {
            state_name(p, k, name);
            if (h.image[k])
                safetensors_to_host(st, name, h.image[k] + p->offset, p->numel);
            else
                status = llmcl_safetensors_load(m->ctx, st, name, state_tensor(p, k));
        }
    }
    if (status == LLMCL_OK && m->trainable.offloaded)
        status = offload_state_write(m->trainable.offloaded, h.image[STATE_WEIGHTS],
                                     h.image[STATE_M], h.image[STATE_V]);
    host_state_free(&h);
    return status == LLMCL_OK ? model_sync_compute(m) : status;
}

/* Opens path; the reason in why_buf when it cannot. */
static llmcl_status open_file(const char *path, llmcl_safetensors **st)
{
    const llmcl_status status = llmcl_safetensors_open(path, st);
    if (status != LLMCL_OK)
        snprintf(why_buf, sizeof why_buf, "%s", llmcl_last_error(NULL));
    return status;
}

/* The step and data position of an opened checkpoint whose shape passed. */
static llmcl_status read_state(const llmcl_safetensors *st, const char *path, train_state *s)
{
    *s = (train_state){meta_int(st, "step"), meta_int(st, "data_pos")};
    /* why_buf holds 512 bytes: the path is cut to fit (GCC warns of a --zero folder's 4200) */
    if (s->step < 0 || s->data_pos < 0) {
        snprintf(why_buf, sizeof why_buf, "%.400s lacks its step or data position", path);
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    if (s->step > INT_MAX) { /* --steps is an int */
        snprintf(why_buf, sizeof why_buf, "%.400s is at step %lld, beyond any run's --steps", path,
                 (long long)s->step);
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    return LLMCL_OK;
}

#ifdef LLMCL_TRAIN_MPI
/* Whether b names the folder a, give or take trailing slashes. */
static bool same_folder(const char *a, const char *b)
{
    const size_t n = strlen(a);
    return strncmp(a, b, n) == 0 && b[n + strspn(b + n, "/")] == '\0';
}

/* Every rank: train.safetensors of the folder llmcl_dist is about to load, its shape checked and
   its step and data position read. */
static llmcl_status read_train_file(const char *folder, void *arg)
{
    zero_files *z = arg;
    z->elsewhere = !same_folder(folder, z->dir);
    snprintf(from_buf, sizeof from_buf, "%s", folder);
    z->failed = true;
    if (!path_is_dir(folder)) {
        snprintf(why_buf, sizeof why_buf,
                 "%s is not a --zero checkpoint folder (a one-file checkpoint resumes without "
                 "--zero)", folder);
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/train.safetensors", folder);
    llmcl_safetensors *st = NULL;
    TRY(open_file(path, &st));
    llmcl_status status = check_shape(st, z->m, path, ZERO_FORMAT);
    if (status == LLMCL_OK)
        status = read_state(st, path, z->loaded);
    llmcl_safetensors_close(st);
    z->failed = status != LLMCL_OK;
    return status;
}

/* One agreed outcome on every rank: train.safetensors through llmcl_dist_load_with's callback. */
static llmcl_status zero_load(model *m, const char *dir, train_state *s, const char **from)
{
    train_state state;
    zero_files z = {.m = m, .loaded = &state, .dir = dir};
    const llmcl_status status = llmcl_dist_load_with(m->zero->dist, dir, NULL, read_train_file, &z);
    if (status != LLMCL_OK && !z.failed)
        snprintf(why_buf, sizeof why_buf, "%s: %s", dir, llmcl_last_error(m->ctx));
    if (status != LLMCL_OK)
        return status;
    *s = state;
    if (z.elsewhere)
        *from = from_buf;
    return LLMCL_OK;
}
#endif

llmcl_status checkpoint_load(model *m, const char *path, train_state *s, const char **from,
                             const char **why)
{
    llmcl_safetensors *st = NULL;
    *why = why_buf;
    *from = path;
#ifdef LLMCL_TRAIN_MPI
    if (m->zero)
        return zero_load(m, path, s, from);
#endif
    if (path_is_dir(path)) {
        snprintf(why_buf, sizeof why_buf,
                 "%s is a folder: a --zero checkpoint resumes under mpiexec with --zero", path);
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    TRY(open_file(path, &st));
    llmcl_status status = check_compatible(st, m, path);
    train_state state;
    if (status == LLMCL_OK)
        status = read_state(st, path, &state);
    if (status == LLMCL_OK) {
        status = load_state(m, st);
        if (status != LLMCL_OK)
            snprintf(why_buf, sizeof why_buf, "%s: %s", path, llmcl_last_error(m->ctx));
    }
    if (status == LLMCL_OK)
        *s = state;
    llmcl_safetensors_close(st);
    return status;
}
