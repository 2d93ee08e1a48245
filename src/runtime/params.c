/*
 * params.c: tuning parameters of one kernel launch. Launchers set heuristic defaults from the
 * device's capabilities, then llmcl__params_lookup lets the tuning database override them and
 * records the result; a launcher that changes the values after that records its final ones with
 * llmcl__params_record. The values become -D options of the build.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "tune_db.h"

void llmcl__param_set(llmcl__params *p, const char *name, long value)
{
    for (int i = 0; i < p->n; ++i)
        if (strcmp(p->names[i], name) == 0) {
            p->values[i] = value;
            return;
        }
    if (p->n < LLMCL__MAX_PARAMS) {
        llmcl__copy_text(p->names[p->n], sizeof p->names[0], name);
        p->values[p->n++] = value;
    }
}

long llmcl__param_get(const llmcl__params *p, const char *name, long fallback)
{
    for (int i = 0; i < p->n; ++i)
        if (strcmp(p->names[i], name) == 0)
            return p->values[i];
    return fallback;
}

llmcl__tune_lookup llmcl__params_lookup(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                        const char *shape_class, llmcl__params *p)
{
    return llmcl__tune_db_apply(ctx, kernel, dtype, shape_class, p, false);
}

llmcl__tune_lookup llmcl__params_lookup_overrides(llmcl_ctx *ctx, const char *kernel,
                                                  llmcl_dtype dtype, const char *shape_class,
                                                  llmcl__params *p)
{
    return llmcl__tune_db_apply(ctx, kernel, dtype, shape_class, p, true);
}

void llmcl__params_record(const llmcl__tune_lookup *lookup, const llmcl__params *p)
{
    llmcl__tune_db_record(lookup, p);
}

void llmcl__shape_class(int64_t key, char out[16])
{
    int k = 0;
    while (k < 62 && ((int64_t)1 << k) < key)
        ++k;
    snprintf(out, 16, "p%d", k);
}

void llmcl__params_define(const llmcl__params *p, llmcl__defines *d)
{
    for (int i = 0; i < p->n; ++i)
        llmcl__define_int(d, p->names[i], p->values[i]);
}
