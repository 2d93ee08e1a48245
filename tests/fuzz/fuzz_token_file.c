/*
 * fuzz_token_file.c: libFuzzer harness of llmcl-train's data file reader
 * (tools/llmcl-train/data.c): llm.c's token files (a 1024-byte header of int32, magic 20240520
 * with uint16 tokens or 20240801 with uint32 tokens), text, and tokenized examples in JSON
 * Lines (examples.c), and preference pairs in JSON Lines (pairs.c). The first input byte picks
 * --data-format (auto, text, llmc, jsonl; pairs where it has bit 32, as --preference reads them)
 * and whether the file is named *.bin or *.jsonl (which auto reads as tokens, as examples); the
 * rest is the file. data_load ends the program on a bad file (util.c's die): fuzz_trap.c turns that
 * into a return. What it accepts must be what data.h promises: n tokens, the file's bytes for
 * text; examples of at least one token each, whose last learns nothing and whose targets are
 * -100 or tokens; data_check_vocab then refuses any beyond 2^31 - 1, and those it passes read
 * back as non-negative int32. Accepted examples are then packed into rows of 8 (best fit
 * decreasing, or greedy where the first byte has bit 16): each example in exactly one row, no row
 * over 8 tokens; two batches of 2 rows load, their documents tiling the rows from position 0.
 * Accepted pairs (an even count of sequences, as examples) load as two batches of 2 pairs in 4
 * rows of 8, in the vocabulary, the targets that learn in the chosen rows counted.
 */
#define _DEFAULT_SOURCE /* readlink's declaration under -std=c11 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* A file refused after its mapping (examples: a bad line) leaves it mapped (the CLI exits then):
   unmap what maps the input's file, or a long run would run out of mappings. */
static void unmap_leaked(const char *path)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps)
        return;
    char line[512];
    uintptr_t found[16][2];
    int n = 0;
    while (n < 16 && fgets(line, sizeof line, maps)) {
        uintptr_t lo, hi;
        const char *name = strchr(line, '/');
        if (name && sscanf(line, "%lx-%lx", &lo, &hi) == 2 &&
            strncmp(name, path, strlen(path)) == 0 && name[strlen(path)] == '\n') {
            found[n][0] = lo;
            found[n++][1] = hi;
        }
    }
    fclose(maps);
    for (int i = 0; i < n; ++i)
        munmap((void *)found[i][0], found[i][1] - found[i][0]);
}

/* A refused file leaves the reader's descriptor open (the CLI exits then): close the ones on the
   input's file, or a long run would run out of them; and its mapping, where it had one. */
static void close_leaked(void *arg)
{
    const job *j = arg;
    unmap_leaked(j->path);
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

/* What data.h promises of examples. */
static void check_examples(const token_data *d)
{
    if (d->n_examples < 1 || d->starts[0] != 0 || d->starts[d->n_examples] != d->n)
        abort();
    for (int64_t k = 0; k < d->n_examples; ++k) {
        if (d->starts[k + 1] <= d->starts[k] || d->targets[d->starts[k + 1] - 1] != -100)
            abort();
        for (int64_t i = d->starts[k]; i < d->starts[k + 1]; ++i)
            if (d->targets[i] < -100 || (d->targets[i] < 0 && d->targets[i] != -100) ||
                d->targets[i] >= d->vocab || data_token(d, i) >= d->vocab)
                abort();
    }
}

/* Rows of 8 from the packed examples: every example in one row, in file order there; two batches
   of 2 rows whose documents tile them. */
static void check_packing(const token_data *d)
{
    loader l;
    token_batch bt;
    loader_init(&l, d, 2, 8, 0, 1);
    uint8_t *seen = calloc((size_t)d->n_examples, 1);
    if (!seen || l.row_first[0] != 0 || l.row_first[l.n_rows] != d->n_examples)
        abort();
    for (int64_t r = 0; r < l.n_rows; ++r) {
        int64_t used = 0;
        for (int64_t i = l.row_first[r]; i < l.row_first[r + 1]; ++i) {
            const int64_t k = l.row_examples[i], len = d->starts[k + 1] - d->starts[k];
            if (seen[k]++ || (i > l.row_first[r] && k <= l.row_examples[i - 1]))
                abort();
            used += len < 8 ? len : 8;
        }
        if (used == 0 || used > 8)
            abort();
    }
    free(seen);
    batch_init(&bt, 2, 8);
    for (int k = 0; k < 2; ++k) {
        const int64_t ahead = loader_counted_ahead(&l, 1);
        loader_next(&l, &bt);
        if (bt.docs < 2 || bt.doc_offsets[0] != 0 || bt.doc_offsets[bt.docs] != 16 ||
            bt.counted != ahead)
            abort();
        int64_t counted = 0;
        for (int doc = 0; doc < bt.docs; ++doc) {
            const int32_t a = bt.doc_offsets[doc], b = bt.doc_offsets[doc + 1];
            if (b <= a || (a < 8 && b > 8))
                abort();
            for (int32_t i = a; i < b; ++i) {
                if (bt.pos[i] != i - a || bt.ids[i] < 0 || bt.ids[i] >= d->vocab)
                    abort();
                counted += bt.targets[i] != -100;
            }
        }
        if (counted != bt.counted)
            abort();
    }
    batch_free(&bt);
    loader_free(&l);
}

/* Two batches of 2 pairs as 4 rows of 8 (the chosen sequences first, each row one sequence padded
   at its end): tokens and targets in the vocabulary, the chosen rows' learning targets counted. */
static void check_pairs(const token_data *d)
{
    loader l;
    token_batch bt;
    if (d->n_examples % 2)
        abort();
    loader_init(&l, d, 2, 8, 0, 1);
    batch_init(&bt, 4, 8);
    for (int k = 0; k < 2; ++k) {
        const int64_t ahead = loader_counted_ahead(&l, 1);
        loader_next(&l, &bt);
        int64_t counted = 0;
        for (int i = 0; i < 32; ++i) {
            if (bt.ids[i] < 0 || bt.ids[i] >= d->vocab || bt.targets[i] >= d->vocab)
                abort();
            counted += i < 16 && bt.targets[i] != -100;
        }
        if (bt.docs != 0 || counted != bt.counted || counted != ahead)
            abort();
    }
    batch_free(&bt);
    loader_free(&l);
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
    const char *name = data[0] & 8 ? ".jsonl" : data[0] & 4 ? ".bin" : ".txt";
    if (!fuzz_write_temp(data + 1, size - 1, name, path))
        return 0;
    job j = {.path = path, .format = data[0] & 32 ? DATA_PAIRS : (data_format)(data[0] % 4)};
    if (fuzz_trap_run(load, close_leaked, &j)) {
        const token_data *d = &j.out;
        if (d->n < 0 || d->n_shards != 1 || d->vocab < 1)
            abort();
        if (d->byte_level && d->n != (int64_t)size - 1)
            abort();
        for (int64_t i = 0; d->byte_level && i < d->n; ++i)
            if (data_token(d, i) != data[1 + i])
                abort();
        if (d->targets) {
            check_examples(d);
            j.out.packing = data[0] & 16 ? PACK_GREEDY : PACK_BFD;
            if (d->pairs)
                check_pairs(d);
            else
                check_packing(d);
        }
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
