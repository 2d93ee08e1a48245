/*
 * fuzz_token_file.c: libFuzzer harness of llmcl-train's data file reader
 * (tools/llmcl-train/data.c): llm.c's token files (a 1024-byte header of int32, magic 20240520
 * with uint16 tokens or 20240801 with uint32 tokens) and text. The first input byte picks
 * --data-format (auto, text, llmc) and whether the file is named *.bin (which auto reads as
 * tokens); the rest is the file. data_load ends the program on a bad file (util.c's die):
 * fuzz_trap.c turns that into a return. What it accepts must be what data.h promises: n tokens,
 * each a non-negative int32.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "fuzz_temp.h"
#include "fuzz_trap.h"

typedef struct job {
    const char *path;
    data_format format;
    token_data out;
} job;

static void load(void *arg)
{
    job *j = arg;
    data_load(j->path, j->format, &j->out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_trap_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an empty file dies with its FILE open, which is the end of the program anyway */
    if (size < 2)
        return 0;
    char path[64];
    if (!fuzz_write_temp(data + 1, size - 1, data[0] & 4 ? ".bin" : ".txt", path))
        return 0;
    job j = {.path = path, .format = (data_format)(data[0] % 3)};
    if (fuzz_trap_run(load, NULL, &j)) {
        const token_data *d = &j.out;
        if (d->n < 0 || (d->n > 0 && !d->tokens) || d->vocab < 1)
            abort();
        for (int64_t i = 0; i < d->n; ++i)
            if (d->tokens[i] < 0)
                abort();
        if (d->byte_level && d->n != (int64_t)size - 1)
            abort();
        data_free(&j.out);
    }
    unlink(path);
    return 0;
}
