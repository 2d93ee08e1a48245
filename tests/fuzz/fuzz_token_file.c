/*
 * fuzz_token_file.c: libFuzzer harness of llmcl-train's data file reader
 * (tools/llmcl-train/data.c): llm.c's token files (a 1024-byte header of int32, magic 20240520
 * with uint16 tokens or 20240801 with uint32 tokens) and text. The first input byte picks
 * --data-format (auto, text, llmc) and whether the file is named *.bin (which auto reads as
 * tokens); the rest is the file. data_load ends the program on a bad file (util.c's die):
 * fuzz_trap.c turns that into a return. What it accepts must be what data.h promises: n tokens,
 * the file's bytes for text; data_check_vocab then refuses any beyond 2^31 - 1, and those it
 * passes read back as non-negative int32.
 */
#define _DEFAULT_SOURCE /* readlink's declaration under -std=c11 */
#include <dirent.h>
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

/* A refused file leaves the reader's descriptor open (the CLI exits then): close the ones on the
   input's file, or a long run would run out of them. */
static void close_leaked(void *arg)
{
    const job *j = arg;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        char link[64], target[128];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        const ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0 && (target[n] = '\0', strcmp(target, j->path) == 0))
            close(atoi(e->d_name));
    }
    closedir(dir);
}

static void check_vocab(void *arg)
{
    data_check_vocab(&((job *)arg)->out, INT32_MAX);
}

static void free_data(void *arg) { data_free(&((job *)arg)->out); }

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
    if (fuzz_trap_run(load, close_leaked, &j)) {
        const token_data *d = &j.out;
        if (d->n < 0 || d->n_shards != 1 || d->vocab < 1)
            abort();
        if (d->byte_level && d->n != (int64_t)size - 1)
            abort();
        for (int64_t i = 0; d->byte_level && i < d->n; ++i)
            if (data_token(d, i) != data[1 + i])
                abort();
        if (fuzz_trap_run(check_vocab, free_data, &j)) {
            for (int64_t i = 0; i < d->n; ++i)
                if (data_token(d, i) < 0)
                    abort();
            data_free(&j.out);
        }
    }
    unlink(path);
    return 0;
}
