/*
 * fuzz_tune_db.c: libFuzzer harness of the tuning database's file reader (src/runtime/tune_db.c).
 * The input is a tuning file (docs/TUNING.md): llmcl_tune_db_load reads it into a context of the
 * default device (PoCL's CPU device where there is no GPU), then the kernels its entries name are
 * looked up at their own class and at others, as a launcher's query would. Public API only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "fuzz_temp.h"
#include "llmcl.h"

static llmcl_ctx *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("LLMCL_TUNE_DB", "off", 1); /* the input alone, not the user's files */
    if (llmcl_ctx_create(&ctx) != LLMCL_OK) {
        fprintf(stderr, "fuzz_tune_db: no OpenCL device: %s\n", llmcl_last_error(NULL));
        exit(1);
    }
    return 0;
}

/* One entry's key at its own class and at others; an answer that fills buf is a defect. */
static void look_up(const char *kernel, const char *dtype, const char *cls)
{
    llmcl_dtype dt = LLMCL_F32;
    for (int d = 0; dtype && d < LLMCL_DTYPE_COUNT; ++d)
        if (strcmp(dtype, llmcl_dtype_name((llmcl_dtype)d)) == 0)
            dt = (llmcl_dtype)d;
    const char *shapes[] = {cls, "*", "p10", "4096"};
    for (int i = 0; i < 4; ++i) {
        char buf[1024];
        int launched = 0;
        if (shapes[i] && llmcl_tune_params_get(ctx, kernel, dt, shapes[i], buf, sizeof buf,
                                               &launched) == LLMCL_OK &&
            strlen(buf) >= sizeof buf)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (!fuzz_write_temp(data, size, ".json", path))
        return 0;
    if (llmcl_tune_db_clear(ctx) != LLMCL_OK)
        abort();
    if (llmcl_tune_db_load(ctx, path) == LLMCL_OK) {
        json_t *root = json_loadb((const char *)data, size, 0, NULL);
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(root, "entries"), i, e)
        {
            const char *kernel = json_string_value(json_object_get(e, "kernel"));
            if (kernel && i < 16)
                look_up(kernel, json_string_value(json_object_get(e, "dtype")),
                        json_string_value(json_object_get(e, "shape_class")));
        }
        json_decref(root);
    }
    if (strlen(llmcl_tune_db_warnings(ctx)) >= 8192)
        abort();
    unlink(path);
    return 0;
}
