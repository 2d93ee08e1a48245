/* checkpoint.c: llmcl-train's checkpoints in safetensors (checkpoint.h). */
#include "checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define CHECKPOINT_FORMAT "llmcl-train checkpoint 1"

static char why_buf[512];

/* The model's shape as metadata entries, in a fixed order. */
typedef struct shape_entry {
    const char *key;
    char value[64];
} shape_entry;

static int shape_entries(const model_config *c, shape_entry e[10])
{
    const char *keys[] = {"vocab", "dim", "layers", "heads", "kv_heads", "ffn", "tied",
                          "norm_eps", "rope_theta", "rope_llama3_factor"};
    const double vals[] = {c->vocab, c->dim, c->layers, c->heads, c->kv_heads, c->ffn, c->tied,
                           c->norm_eps, c->rope_theta, c->rope_llama3_factor};
    for (int i = 0; i < 10; ++i) {
        e[i].key = keys[i];
        snprintf(e[i].value, sizeof e[i].value, "%.9g", vals[i]);
    }
    return 10;
}

static llmcl_status add_state(llmcl_safetensors_writer *w, const model_param *p)
{
    char name[128];
    TRY(llmcl_safetensors_writer_add_tensor(w, p->name, p->master));
    snprintf(name, sizeof name, "optimizer.m.%s", p->name);
    TRY(llmcl_safetensors_writer_add_tensor(w, name, p->m));
    snprintf(name, sizeof name, "optimizer.v.%s", p->name);
    return llmcl_safetensors_writer_add_tensor(w, name, p->v);
}

static llmcl_status write_checkpoint(llmcl_safetensors_writer *w, model *m, const train_state *s)
{
    char num[32];
    TRY(llmcl_safetensors_writer_metadata(w, "format", CHECKPOINT_FORMAT));
    shape_entry e[10];
    for (int i = 0, n = shape_entries(&m->cfg, e); i < n; ++i)
        TRY(llmcl_safetensors_writer_metadata(w, e[i].key, e[i].value));
    snprintf(num, sizeof num, "%" PRId64, s->step);
    TRY(llmcl_safetensors_writer_metadata(w, "step", num));
    snprintf(num, sizeof num, "%" PRId64, s->data_pos);
    TRY(llmcl_safetensors_writer_metadata(w, "data_pos", num));
    for (int i = 0; i < m->n_params; ++i)
        TRY(add_state(w, &m->params[i]));
    return llmcl_safetensors_writer_finish(w);
}

llmcl_status checkpoint_save(model *m, const train_state *s, const char *path)
{
    llmcl_safetensors_writer *w = NULL;
    llmcl_status st = llmcl_safetensors_writer_create(path, &w);
    if (st == LLMCL_OK)
        st = write_checkpoint(w, m, s);
    llmcl_safetensors_writer_destroy(w);
    return st;
}

/* The checkpoint's format and shape against m's; a message in why_buf when they differ. */
static llmcl_status check_compatible(const llmcl_safetensors *st, const model *m, const char *path)
{
    const char *format = llmcl_safetensors_metadata(st, "format");
    if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0) {
        snprintf(why_buf, sizeof why_buf, "%s is not an llmcl-train checkpoint (format '%s')",
                 path, format ? format : "none");
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    shape_entry e[10];
    for (int i = 0, n = shape_entries(&m->cfg, e); i < n; ++i) {
        const char *v = llmcl_safetensors_metadata(st, e[i].key);
        if (!v || strcmp(v, e[i].value) != 0) {
            snprintf(why_buf, sizeof why_buf,
                     "%s holds a model of another shape: %s is %s there and %s here", path,
                     e[i].key, v ? v : "missing", e[i].value);
            return LLMCL_ERROR_SHAPE_MISMATCH;
        }
    }
    static const char *prefixes[] = {"", "optimizer.m.", "optimizer.v."};
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        for (int k = 0; k < 3; ++k) {
            char name[128];
            llmcl_safetensors_info info;
            snprintf(name, sizeof name, "%s%s", prefixes[k], p->name);
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

static int64_t meta_int(const llmcl_safetensors *st, const char *key)
{
    const char *v = llmcl_safetensors_metadata(st, key);
    return v ? strtoll(v, NULL, 10) : -1;
}

static llmcl_status load_state(model *m, const llmcl_safetensors *st)
{
    char name[128];
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        TRY(llmcl_safetensors_load(m->ctx, st, p->name, p->master));
        snprintf(name, sizeof name, "optimizer.m.%s", p->name);
        TRY(llmcl_safetensors_load(m->ctx, st, name, p->m));
        snprintf(name, sizeof name, "optimizer.v.%s", p->name);
        TRY(llmcl_safetensors_load(m->ctx, st, name, p->v));
    }
    return model_sync_compute(m);
}

llmcl_status checkpoint_load(model *m, const char *path, train_state *s, const char **why)
{
    llmcl_safetensors *st = NULL;
    *why = why_buf;
    llmcl_status status = llmcl_safetensors_open(path, &st);
    if (status != LLMCL_OK) {
        snprintf(why_buf, sizeof why_buf, "%s", llmcl_last_error(NULL));
        return status;
    }
    status = check_compatible(st, m, path);
    const int64_t step = meta_int(st, "step"), pos = meta_int(st, "data_pos");
    if (status == LLMCL_OK && (step < 0 || pos < 0)) {
        snprintf(why_buf, sizeof why_buf, "%s lacks its step or data position", path);
        status = LLMCL_ERROR_INVALID_ARGUMENT;
    }
    if (status == LLMCL_OK) {
        status = load_state(m, st);
        if (status != LLMCL_OK)
            snprintf(why_buf, sizeof why_buf, "%s: %s", path, llmcl_last_error(m->ctx));
    }
    if (status == LLMCL_OK)
        *s = (train_state){step, pos};
    llmcl_safetensors_close(st);
    return status;
}
