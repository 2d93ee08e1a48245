/* data.c: token files, the byte-level tokenizer, the built-in corpus, and the loader that cuts
   windows of a stream, packs examples into rows or lays pairs out as rows (data.h). */
#include "data.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define LLMC_MAGIC_GPT2 20240520
#define LLMC_MAGIC_LLAMA3 20240801

#define LLMC_HEADER_BYTES 1024 /* 256 int32 */

/* An open regular, non-empty file (its size in *len), or the run stops saying what path is. */
static int open_file(const char *path, int64_t *len)
{
    const int fd = open(path, O_RDONLY);
    if (fd < 0)
        die("cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        die("cannot read %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        die("%s is a folder: give a text file or an llm.c token file (.bin)", path);
    if (!S_ISREG(sb.st_mode))
        die("%s is not a regular file: give a text file or an llm.c token file (.bin)", path);
    if (sb.st_size == 0)
        die("%s is empty", path);
    *len = sb.st_size;
    return fd;
}

/* Up to len bytes from the start of fd into buf; how many it read. */
static int64_t read_head(int fd, const char *path, void *buf, int64_t len)
{
    int64_t got = 0;
    while (got < len) {
        const ssize_t r = pread(fd, (char *)buf + got, (size_t)(len - got), got);
        if (r < 0)
            die("cannot read %s: %s", path, strerror(errno));
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

/* Whether the first bytes are one of llm.c's magics (a little-endian int32). */
static bool llmc_magic(const unsigned char *buf, int64_t len)
{
    int32_t magic;
    if (len < (int64_t)sizeof magic)
        return false;
    memcpy(&magic, buf, sizeof magic);
    return magic == LLMC_MAGIC_GPT2 || magic == LLMC_MAGIC_LLAMA3;
}

static bool named(const char *path, const char *ext)
{
    const size_t n = strlen(path), e = strlen(ext);
    return n >= e && strcmp(path + n - e, ext) == 0;
}

/* Appends n tokens of width bytes at `at` to d's stream: mem is the mapping of map_len bytes that
   holds them, or (map_len 0) their array; d owns it from here. */
static void add_shard(token_data *d, const char *name, void *mem, size_t map_len,
                      const unsigned char *at, int64_t n, int width)
{
    d->shards = realloc(d->shards, (size_t)(d->n_shards + 1) * sizeof *d->shards);
    if (!d->shards)
        die("out of host memory");
    token_shard *s = &d->shards[d->n_shards++];
    *s = (token_shard){.at = at, .mem = mem, .map_len = map_len, .first = d->n, .n = n,
                       .width = width};
    snprintf(s->name, sizeof s->name, "%s", name);
    d->n += n;
}

/* n int32 tokens in memory (text, the built-in corpus) as a shard of d, which takes them over. */
static void add_array(token_data *d, const char *name, int32_t *tokens, int64_t n)
{
    add_shard(d, name, tokens, 0, (const unsigned char *)tokens, n, 4);
    d->vocab = 256;
    d->byte_level = 1;
}

/* llm.c's token file fd, whole and valid, mapped as a shard of d, or the run stops saying what is
   wrong. Returns its magic. */
static int32_t map_llmc(const char *path, int fd, int64_t len, token_data *d)
{
    int32_t header[256] = {0};
    if (len < LLMC_HEADER_BYTES)
        die("%s: %lld bytes, shorter than the 1024-byte header of an llm.c token file (give "
            "--data-format text if it is text)", path, (long long)len);
    read_head(fd, path, header, sizeof header);
    const int gpt2 = header[0] == LLMC_MAGIC_GPT2, llama3 = header[0] == LLMC_MAGIC_LLAMA3;
    if (!gpt2 && !llama3)
        die("%s: starts with %d, not an llm.c token file's magic (%d or %d): damaged, or give "
            "--data-format text if it is text", path, header[0], LLMC_MAGIC_GPT2,
            LLMC_MAGIC_LLAMA3);
    if ((gpt2 && header[1] != 1) || (llama3 && header[1] != 7))
        die("%s: llm.c token file of unknown version %d for magic %d", path, header[1], header[0]);
    const int64_t n = header[2], width = gpt2 ? 2 : 4;
    if (n < 0 || LLMC_HEADER_BYTES + n * width != len)
        die("%s: the header announces %lld tokens of %lld bytes but the file holds %lld bytes "
            "after it (truncated or corrupt)",
            path, (long long)n, (long long)width, (long long)(len - LLMC_HEADER_BYTES));
    void *map = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        die("cannot map %s: %s", path, strerror(errno));
    add_shard(d, path, map, (size_t)len, (const unsigned char *)map + LLMC_HEADER_BYTES, n,
              (int)width);
    d->vocab = gpt2 ? 50257 : 128256;
    return header[0];
}

/* A text file's bytes as the tokens of a shard of d. */
static void load_text(const char *path, int fd, int64_t len, token_data *d)
{
    unsigned char *buf = xmalloc((size_t)len);
    if (read_head(fd, path, buf, len) != len)
        die("cannot read %s: shorter than its size", path);
    int32_t *tokens = xmalloc((size_t)len * sizeof *tokens);
    for (int64_t i = 0; i < len; ++i)
        tokens[i] = buf[i];
    free(buf);
    add_array(d, path, tokens, len);
}

/* The files that pattern names, as llm.c shards of one format. */
static void load_pattern(const char *pattern, data_format format, token_data *d)
{
    if (format == DATA_TEXT || format == DATA_JSONL)
        die("%s: a pattern names llm.c token files (--data-format text or jsonl reads one file)",
            pattern);
    if (format == DATA_PAIRS)
        die("%s: a pattern names llm.c token files; --preference reads one JSON Lines file of "
            "tokenized pairs", pattern);
    glob_t g;
    const int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH)
        die("%s matches no file", pattern);
    if (r != 0)
        die("%s: cannot list the files it names", pattern);
    int32_t magic = 0;
    for (size_t i = 0; i < g.gl_pathc; ++i) {
        int64_t len;
        const int fd = open_file(g.gl_pathv[i], &len);
        const int32_t m = map_llmc(g.gl_pathv[i], fd, len, d);
        close(fd);
        if (i > 0 && m != magic)
            die("%s: magic %d where %s has %d: the shards of one stream need one format",
                g.gl_pathv[i], m, g.gl_pathv[0], magic);
        magic = m;
    }
    snprintf(d->source, sizeof d->source, "%s (%zu files)", pattern, g.gl_pathc);
    globfree(&g);
}

data_packing data_packing_parse(const char *s)
{
    if (strcmp(s, "bfd") == 0)
        return PACK_BFD;
    if (strcmp(s, "greedy") == 0)
        return PACK_GREEDY;
    die("--packing %s: expected bfd or greedy", s);
}

data_format data_format_parse(const char *s)
{
    static const char *const names[] = {"auto", "text", "llmc", "jsonl"};
    for (int f = DATA_AUTO; f <= DATA_JSONL; ++f)
        if (strcmp(s, names[f]) == 0)
            return (data_format)f;
    die("--data-format %s: expected auto, text, llmc or jsonl", s);
}

void data_load(const char *path, data_format format, token_data *out)
{
    *out = (token_data){.owns = true};
    snprintf(out->source, sizeof out->source, "%s", path);
    if (strpbrk(path, "*?[")) {
        load_pattern(path, format, out);
        return;
    }
    int64_t len = 0;
    const int fd = open_file(path, &len);
    if (format == DATA_JSONL || (format == DATA_AUTO && named(path, ".jsonl"))) {
        examples_load(path, fd, len, out);
        close(fd);
        return;
    }
    unsigned char head[4];
    const int64_t got = read_head(fd, path, head, sizeof head);
    if (format == DATA_PAIRS) {
        if (llmc_magic(head, got))
            die("%s is an llm.c token file; --preference reads tokenized pairs in JSON Lines "
                "(prompt_input_ids, chosen_input_ids, rejected_input_ids)", path);
        pairs_load(path, fd, len, out);
        close(fd);
        return;
    }
    if (format == DATA_LLMC ||
        (format == DATA_AUTO && (named(path, ".bin") || llmc_magic(head, got))))
        map_llmc(path, fd, len, out);
    else
        load_text(path, fd, len, out);
    close(fd);
}

void data_set_examples(token_data *out, const char *name, int32_t *ids, int32_t *targets,
                       int64_t n, int64_t *starts, int64_t n_examples, int vocab)
{
    add_shard(out, name, ids, 0, (const unsigned char *)ids, n, 4);
    out->targets = targets;
    out->starts = starts;
    out->n_examples = n_examples;
    out->vocab = vocab;
    out->vocab_bound = true;
}

/* The shard holding stream position g (a binary search of their firsts). */
static const token_shard *shard_of(const token_data *d, int64_t g)
{
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (d->shards[mid].first <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &d->shards[lo];
}

/* Token j of shard s as stored: uint16, or 32 bits (uint32, or int32 from memory). */
static uint32_t shard_token(const token_shard *s, int64_t j)
{
    const unsigned char *p = s->at + j * s->width;
    if (s->width == 2) {
        uint16_t v;
        memcpy(&v, p, sizeof v); /* little-endian hosts, as llm.c writes */
        return v;
    }
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

int32_t data_token(const token_data *d, int64_t i)
{
    const token_shard *s = shard_of(d, d->begin + i);
    return (int32_t)shard_token(s, d->begin + i - s->first);
}

/* Example k for messages: "example 3", or a pair's "pair 2's rejected sequence". */
static void name_example(const token_data *d, int64_t k, char *buf, size_t len)
{
    if (d->pairs)
        snprintf(buf, len, "pair %lld's %s sequence", (long long)k / 2 + 1,
                 k % 2 ? "rejected" : "chosen");
    else
        snprintf(buf, len, "example %lld", (long long)k + 1);
}

/* Dies naming the example that holds or learns a token outside [0, vocab). */
static void check_examples_vocab(const token_data *d, int vocab)
{
    const int32_t *ids = (const int32_t *)d->shards[0].at;
    char name[64];
    for (int64_t k = d->ex_begin; k < d->ex_begin + d->n_examples; ++k) {
        name_example(d, k, name, sizeof name);
        for (int64_t i = d->starts[k]; i < d->starts[k + 1]; ++i)
            if (ids[i] >= vocab)
                die("%s: %s holds token %d, outside the model's vocabulary of %d (set --vocab)",
                    d->shards[0].name, name, ids[i], vocab);
        for (int64_t i = d->starts[k]; i < d->starts[k + 1]; ++i)
            if (d->targets[i] >= vocab)
                die("%s: %s learns %d, outside the model's vocabulary of %d (set --vocab)",
                    d->shards[0].name, name, d->targets[i], vocab);
    }
}

void data_check_vocab(const token_data *d, int vocab)
{
    if (d->targets) {
        check_examples_vocab(d, vocab);
        return;
    }
    const int64_t end = d->begin + d->n;
    for (int k = 0; k < d->n_shards; ++k) { /* shard by shard: one pass over the files */
        const token_shard *s = &d->shards[k];
        const int64_t lo = s->first > d->begin ? s->first : d->begin,
                      hi = s->first + s->n < end ? s->first + s->n : end;
        for (int64_t g = lo; g < hi; ++g) {
            const uint32_t v = shard_token(s, g - s->first);
            if (v >= (uint32_t)vocab)
                die("%s: token %lld is %u, outside the model's vocabulary of %d (set --vocab)",
                    s->name, (long long)(g - s->first), v, vocab);
        }
    }
}

/* ---- the built-in corpus ---- */

static const char *subjects[] = {"the cat", "a dog", "the old man", "my sister", "the little bird",
                                 "a farmer", "the teacher", "our neighbour", "the baker",
                                 "a young girl", "the king", "my friend"};
static const char *verbs[] = {"sees", "likes", "finds", "carries", "paints", "wants", "cleans",
                              "follows", "remembers", "buys"};
static const char *objects[] = {"the red ball", "a small house", "the green tree", "an old book",
                                "the blue boat", "a warm loaf of bread", "the tall tower",
                                "a yellow kite", "the quiet garden", "a silver coin"};
static const char *places[] = {"", " in the morning", " near the river", " every day",
                               " after dinner", " in the rain", " at the market", " on sunday"};

#define PICK(r, list) (list)[util_rng_next(r) % (sizeof(list) / sizeof((list)[0]))]

void data_builtin(uint64_t seed, int64_t bytes, token_data *out)
{
    *out = (token_data){.owns = true};
    snprintf(out->source, sizeof out->source, "built-in corpus (seed %llu)",
             (unsigned long long)seed);
    int32_t *tokens = xmalloc((size_t)bytes * sizeof *tokens);
    util_rng r = util_rng_new(seed);
    char sentence[256];
    int64_t n = 0;
    int in_paragraph = 0;
    while (n < bytes) {
        const int len = snprintf(sentence, sizeof sentence, "%s%s %s %s%s.",
                                 in_paragraph ? " " : "", PICK(&r, subjects), PICK(&r, verbs),
                                 PICK(&r, objects), PICK(&r, places));
        sentence[in_paragraph ? 1 : 0] = (char)toupper((unsigned char)sentence[in_paragraph ? 1 : 0]);
        for (int i = 0; i < len && n < bytes; ++i)
            tokens[n++] = (unsigned char)sentence[i];
        in_paragraph = util_rng_next(&r) % 5 != 0;
        if (!in_paragraph && n < bytes)
            tokens[n++] = '\n';
    }
    add_array(out, out->source, tokens, n);
}

void data_split(token_data *d, double fraction, token_data *val)
{
    *val = *d;
    val->owns = false;
    /* the messages about the held-out part name it as such, not as the training data */
    snprintf(val->source, sizeof val->source, "the held-out end of %.200s", d->source);
    if (d->targets) {
        const int64_t per = d->pairs ? 2 : 1, units = d->n_examples / per; /* pairs whole */
        int64_t nval = (int64_t)((double)units * fraction);
        if (nval == 0 && units > 1)
            nval = 1;
        nval *= per;
        val->ex_begin = d->ex_begin + d->n_examples - nval;
        val->n_examples = nval;
        d->n_examples -= nval;
        val->begin = d->starts[val->ex_begin];
        val->n = d->starts[val->ex_begin + nval] - val->begin;
        d->n -= val->n;
        return;
    }
    const int64_t nval = (int64_t)((double)d->n * fraction);
    val->begin = d->begin + d->n - nval;
    val->n = nval;
    d->n -= nval;
}

void data_free(token_data *d)
{
    for (int i = 0; d->owns && i < d->n_shards; ++i) {
        if (d->shards[i].map_len)
            munmap(d->shards[i].mem, d->shards[i].map_len);
        else
            free(d->shards[i].mem);
    }
    if (d->owns) {
        free(d->shards);
        free(d->targets);
        free(d->starts);
    }
    *d = (token_data){0};
}

/* ---- loader ---- */

void batch_init(token_batch *batch, int b, int t)
{
    const size_t n = (size_t)b * (size_t)t;
    *batch = (token_batch){.b = b, .t = t, .ids = xmalloc(n * sizeof(int32_t)),
                           .targets = xmalloc(n * sizeof(int32_t)),
                           .pos = xmalloc(n * sizeof(int32_t)),
                           .doc_offsets = xmalloc((n + 1) * sizeof(int32_t))};
}

void batch_free(token_batch *batch)
{
    free(batch->ids);
    free(batch->targets);
    free(batch->pos);
    free(batch->doc_offsets);
    *batch = (token_batch){0};
}

/* Tokens of example k that a row of t holds: the whole example, or its first t. */
static int64_t kept(const token_data *d, int64_t k, int t)
{
    const int64_t len = d->starts[k + 1] - d->starts[k];
    return len < t ? len : t;
}

/* Targets that learn among example k's first `len` tokens (the last kept token learns nothing). */
static int64_t counted(const token_data *d, int64_t k, int64_t len)
{
    int64_t c = 0;
    for (int64_t i = d->starts[k]; i < d->starts[k] + len - 1; ++i)
        c += d->targets[i] != -100;
    return c;
}

/* Greedy in file order: the next example starts a new row where the current one lacks room. */
static void pack_greedy(loader *l, int64_t *row_of)
{
    const token_data *d = l->d;
    int64_t used = l->t;
    for (int64_t k = 0; k < d->n_examples; ++k) {
        const int64_t len = kept(d, d->ex_begin + k, l->t);
        if (used + len > l->t) {
            ++l->n_rows;
            used = 0;
        }
        used += len;
        row_of[k] = l->n_rows - 1;
    }
}

/* qsort's order of (key, index) pairs, ascending. */
static int pair_order(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The least room r >= need among rows, by the bitset of rooms that some row has; -1: none. */
static int64_t least_room(const uint64_t *has, int64_t need, int64_t t)
{
    for (int64_t w = need / 64; w <= t / 64; ++w) {
        uint64_t bits = has[w];
        if (w == need / 64)
            bits &= ~0ull << (need % 64);
        if (bits)
            return w * 64 + __builtin_ctzll(bits);
    }
    return -1;
}

/* Best fit decreasing: longest first, each into the row with the least room that holds it (rows
   with the same room kept as stacks); then rows ordered by their first example in the file. */
static void pack_bfd(loader *l, int64_t *row_of)
{
    const token_data *d = l->d;
    const int64_t n = d->n_examples, t = l->t;
    int64_t(*order)[2] = xmalloc((size_t)n * sizeof *order);
    for (int64_t k = 0; k < n; ++k) {
        order[k][0] = -kept(d, d->ex_begin + k, l->t); /* the longest first */
        order[k][1] = k;
    }
    qsort(order, (size_t)n, sizeof *order, pair_order);
    int64_t *top = xmalloc((size_t)(t + 1) * sizeof *top), *below = xmalloc((size_t)n * sizeof *below);
    uint64_t *has = calloc((size_t)(t / 64 + 1), sizeof *has);
    int64_t *first = xmalloc((size_t)n * sizeof *first);
    if (!has)
        die("out of host memory");
    for (int64_t r = 0; r <= t; ++r)
        top[r] = -1;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = -order[i][0], k = order[i][1], room = least_room(has, len, t);
        int64_t row = room;
        if (room >= 0) { /* off its stack */
            row = top[room];
            top[room] = below[row];
            if (top[room] < 0)
                has[room / 64] &= ~(1ull << (room % 64));
        } else {
            row = l->n_rows++;
            first[row] = k;
        }
        const int64_t left = (room >= 0 ? room : t) - len;
        below[row] = top[left];
        top[left] = row;
        has[left / 64] |= 1ull << (left % 64);
        first[row] = k < first[row] ? k : first[row];
        row_of[k] = row;
    }
    /* renumber the rows by their first example, so that they follow the file */
    int64_t(*rank)[2] = xmalloc((size_t)l->n_rows * sizeof *rank);
    for (int64_t r = 0; r < l->n_rows; ++r) {
        rank[r][0] = first[r];
        rank[r][1] = r;
    }
    qsort(rank, (size_t)l->n_rows, sizeof *rank, pair_order);
    for (int64_t r = 0; r < l->n_rows; ++r)
        first[rank[r][1]] = r;
    for (int64_t k = 0; k < n; ++k)
        row_of[k] = first[row_of[k]];
    free(order), free(top), free(below), free(has), free(first), free(rank);
}

/* Packs the view's examples into rows (as d->packing says), each row's examples in file order. */
static void pack_rows(loader *l)
{
    const token_data *d = l->d;
    const int64_t n = d->n_examples;
    int64_t *row_of = xmalloc((size_t)n * sizeof *row_of);
    if (d->packing == PACK_GREEDY)
        pack_greedy(l, row_of);
    else
        pack_bfd(l, row_of);
    l->row_first = calloc((size_t)l->n_rows + 1, sizeof *l->row_first);
    l->row_counted = calloc((size_t)l->n_rows, sizeof *l->row_counted);
    l->row_examples = xmalloc((size_t)n * sizeof *l->row_examples);
    if (!l->row_first || !l->row_counted)
        die("out of host memory");
    int64_t tokens = 0;
    for (int64_t k = 0; k < n; ++k) {
        const int64_t e = d->ex_begin + k, len = kept(d, e, l->t);
        ++l->row_first[row_of[k] + 1];
        l->row_counted[row_of[k]] += counted(d, e, len);
        l->truncated += len < d->starts[e + 1] - d->starts[e];
        tokens += len;
    }
    for (int64_t r = 0; r < l->n_rows; ++r)
        l->row_first[r + 1] += l->row_first[r];
    int64_t *at = xmalloc((size_t)l->n_rows * sizeof *at);
    memcpy(at, l->row_first, (size_t)l->n_rows * sizeof *at);
    for (int64_t k = 0; k < n; ++k) /* in file order within each row */
        l->row_examples[at[row_of[k]]++] = d->ex_begin + k;
    free(at);
    free(row_of);
    l->fill = (double)tokens / ((double)l->n_rows * l->t);
}

/* Pairs: row r is pair r, unpacked, counting the targets of its chosen sequence (a supervised
   term's); what --seq cuts, leaves unscored and pads. */
static void pair_rows(loader *l)
{
    const token_data *d = l->d;
    int64_t tokens = 0;
    l->n_rows = d->n_examples / 2;
    l->row_counted = calloc((size_t)l->n_rows, sizeof *l->row_counted);
    if (!l->row_counted)
        die("out of host memory");
    for (int64_t e = d->ex_begin; e < d->ex_begin + d->n_examples; ++e) {
        const int64_t len = kept(d, e, l->t), c = counted(d, e, len);
        if ((e - d->ex_begin) % 2 == 0)
            l->row_counted[(e - d->ex_begin) / 2] = c;
        l->truncated += len < d->starts[e + 1] - d->starts[e];
        l->unscored += c == 0;
        tokens += len;
    }
    l->fill = (double)tokens / ((double)d->n_examples * l->t);
}

void loader_init(loader *l, const token_data *d, int b, int t, int rank, int world)
{
    *l = (loader){.d = d, .b = b, .t = t, .rank = rank, .world = world};
    if (d->targets) {
        if (d->n_examples == 0)
            die("%s: no %s left for this split (give more, or --val)", d->source,
                d->pairs ? "pairs" : "examples");
        if (d->pairs)
            pair_rows(l);
        else
            pack_rows(l);
        l->pos = (int64_t)rank * b;
        return;
    }
    const int64_t need = (int64_t)b * t * world + 1;
    if (d->n < need)
        die("%s holds %lld tokens: a batch of %d x %d tokens on %d rank(s) needs at least %lld "
            "(shorten --seq or --batch)",
            d->source, (long long)d->n, b, t, world, (long long)need);
    l->pos = (int64_t)rank * b * t;
}

void loader_free(loader *l)
{
    free(l->row_examples);
    free(l->row_first);
    free(l->row_counted);
    l->row_examples = l->row_first = l->row_counted = NULL;
}

/* Tokens (stream) or rows (examples) that one rank's micro-batch takes. */
static int64_t unit_span(const loader *l) { return l->d->targets ? l->b : (int64_t)l->b * l->t; }

int64_t loader_tell(const loader *l) { return l->pos - l->rank * unit_span(l); }

bool loader_seek(loader *l, int64_t pos)
{
    /* a stream's position lies within its tokens; the examples' rows repeat, so theirs only stays
       far enough below int64's end for the steps that add to it */
    const int64_t limit = l->d->targets ? INT64_MAX / 4 : l->d->n;
    if (pos < 0 || pos > limit)
        return false;
    l->pos = pos + l->rank * unit_span(l);
    return true;
}

int64_t loader_micro_batches(const loader *l)
{
    const int64_t per_batch = unit_span(l) * l->world;
    if (l->d->targets)
        return (l->n_rows + per_batch - 1) / per_batch;
    return (l->d->n - 1) / per_batch;
}

int64_t loader_counted_ahead(const loader *l, int micro)
{
    const int64_t rows = (int64_t)micro * l->b * l->world, at = loader_tell(l);
    if (!l->d->targets)
        return rows * l->t;
    int64_t c = 0;
    for (int64_t r = at; r < at + rows; ++r)
        c += l->row_counted[r % l->n_rows];
    return c;
}

/* Example k's tokens that a row keeps into out from token `at`, from position 0 (the last kept
   one learns nothing); how many. */
static int64_t put_example(const loader *l, int64_t k, int64_t at, token_batch *out)
{
    const token_data *d = l->d;
    const int64_t len = kept(d, k, l->t), s = d->starts[k];
    for (int64_t j = 0; j < len; ++j) {
        out->ids[at + j] = data_token(d, s + j - d->begin);
        out->targets[at + j] = j < len - 1 ? d->targets[s + j] : -100;
        out->pos[at + j] = (int32_t)j;
    }
    return len;
}

/* Padding from token `at` to `end`: token 0, learning nothing, from position 0. */
static void put_padding(int64_t at, int64_t end, token_batch *out)
{
    for (int64_t j = 0; at + j < end; ++j) {
        out->ids[at + j] = 0;
        out->targets[at + j] = -100;
        out->pos[at + j] = (int32_t)j;
    }
}

/* Row r of the packed examples into row i of out: each example a document from position 0, the
   rest one document of padding. */
static void fill_row(const loader *l, int64_t r, int i, token_batch *out)
{
    int64_t at = (int64_t)i * l->t;
    const int64_t row_end = at + l->t;
    for (int64_t i = l->row_first[r]; i < l->row_first[r + 1]; ++i) {
        out->doc_offsets[out->docs++] = (int32_t)at;
        at += put_example(l, l->row_examples[i], at, out);
    }
    out->counted += l->row_counted[r];
    if (at < row_end)
        out->doc_offsets[out->docs++] = (int32_t)at;
    put_padding(at, row_end, out);
}

/* The next b pairs: chosen sequences in rows 0 to b - 1, the rejected ones in rows b to 2b - 1,
   each one sequence from position 0 padded at its end (which a causal model's earlier positions
   never see). */
static void next_pairs(loader *l, token_batch *out)
{
    for (int i = 0; i < 2 * l->b; ++i) {
        const int64_t pair = (l->pos + i % l->b) % l->n_rows, at = (int64_t)i * l->t;
        const int64_t k = l->d->ex_begin + 2 * pair + (i >= l->b);
        put_padding(at + put_example(l, k, at, out), at + l->t, out);
        out->counted += i < l->b ? l->row_counted[pair] : 0;
    }
    l->pos += (int64_t)l->b * l->world;
}

void loader_next(loader *l, token_batch *out)
{
    out->docs = 0;
    out->counted = 0;
    if (l->d->pairs) {
        next_pairs(l, out);
        return;
    }
    if (l->d->targets) {
        for (int i = 0; i < l->b; ++i)
            fill_row(l, (l->pos + i) % l->n_rows, i, out);
        out->doc_offsets[out->docs] = l->b * l->t;
        l->pos += (int64_t)l->b * l->world;
        return;
    }
    const int64_t span = (int64_t)l->b * l->t;
    if (loader_tell(l) + span * l->world + 1 > l->d->n)
        l->pos = (int64_t)l->rank * span;
    for (int64_t i = 0; i < span; ++i)
        out->ids[i] = data_token(l->d, l->pos + i);
    memmove(out->targets, out->ids + 1, (size_t)(span - 1) * sizeof *out->targets);
    out->targets[span - 1] = data_token(l->d, l->pos + span);
    out->counted = span;
    l->pos += span * l->world;
}
