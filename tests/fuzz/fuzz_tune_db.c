/*
 * fuzz_tune_db.c: libFuzzer harness of the tuning database's file reader (src/runtime/tune_db.c).
 * The input is a tuning file (docs/TUNING.md): llmcl_tune_db_load reads it into a context, then
 * the kernels its entries name are looked up as llmcl_tune_params_get and a launch would. The
 * reader needs only the context's device description, so the context is one filled in here for
 * PoCL's CPU device (data/tuning/pocl_cpu.json's), with no OpenCL objects: no device is needed.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "fuzz_temp.h"
#include "llmcl.h"
#include "src/runtime/internal.h"
#include "src/runtime/tune_db.h"

static llmcl_ctx *fake_ctx(void)
{
    llmcl_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        abort();
    llmcl_device_info *d = &ctx->info;
    snprintf(d->name, sizeof d->name, "pthread-skylake-avx512-Intel(R) Xeon(R) Processor");
    snprintf(d->vendor, sizeof d->vendor, "GenuineIntel");
    snprintf(d->platform_name, sizeof d->platform_name, "Portable Computing Language");
    snprintf(d->driver_version, sizeof d->driver_version, "3.1+debian");
    d->max_work_group_size = 4096;
    /* no tune_db: llmcl_tune_db_load makes an empty one, without the built-in files */
    return ctx;
}

/* Looks up one entry's key both ways: as the public query and as a launcher with tunables. */
static void look_up(llmcl_ctx *ctx, const char *kernel, const char *dtype, const char *cls)
{
    if (strlen(kernel) == 0 || strlen(kernel) >= 48)
        return;
    llmcl_dtype dt = LLMCL_F32;
    for (int d = 0; dtype && d < LLMCL_DTYPE_COUNT; ++d)
        if (strcmp(dtype, llmcl_dtype_name((llmcl_dtype)d)) == 0)
            dt = (llmcl_dtype)d;
    const char *shapes[] = {cls, "*", "p10", "4096"};
    for (int i = 0; i < 4; ++i) {
        char buf[1024];
        int launched = 0;
        if (shapes[i] && llmcl_tune_params_get(ctx, kernel, dt, shapes[i], buf, sizeof buf,
                                               &launched) == LLMCL_OK && strlen(buf) >= sizeof buf)
            abort();
    }
    llmcl__params p = {0};
    llmcl__param_set(&p, "WG", 64);
    llmcl__param_set(&p, "TILE", 16);
    char key[16];
    llmcl_tune_shape_class(4096, key);
    llmcl__params_lookup(ctx, kernel, dt, key, &p);
    const long wg = llmcl__param_get(&p, "WG", LONG_MIN);
    if (wg < 1 || (unsigned long)wg > ctx->info.max_work_group_size) {
        fprintf(stderr, "fuzz_tune_db: a launch got WG=%ld outside [1, %zu]\n", wg,
                ctx->info.max_work_group_size);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (!fuzz_write_temp(data, size, ".json", path))
        return 0;
    llmcl_ctx *ctx = fake_ctx();
    if (llmcl_tune_db_load(ctx, path) == LLMCL_OK) {
        json_t *root = json_loadb((const char *)data, size, 0, NULL);
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(root, "entries"), i, e)
        {
            const char *kernel = json_string_value(json_object_get(e, "kernel"));
            if (kernel && i < 16)
                look_up(ctx, kernel, json_string_value(json_object_get(e, "dtype")),
                        json_string_value(json_object_get(e, "shape_class")));
        }
        json_decref(root);
    }
    if (strlen(llmcl_tune_db_warnings(ctx)) >= 8192)
        abort();
    llmcl__tune_db_destroy(ctx->tune_db);
    free(ctx);
    unlink(path);
    return 0;
}
