/* data.c: token files, the byte-level tokenizer, the built-in corpus and the loader (data.h). */
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

static bool named_bin(const char *path)
{
    const size_t n = strlen(path);
    return n >= 4 && strcmp(path + n - 4, ".bin") == 0;
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
    if (format == DATA_TEXT)
        die("%s: a pattern names llm.c token files (--data-format text reads one file)", pattern);
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

data_format data_format_parse(const char *s)
{
    static const char *const names[] = {"auto", "text", "llmc"};
    for (int f = DATA_AUTO; f <= DATA_LLMC; ++f)
        if (strcmp(s, names[f]) == 0)
            return (data_format)f;
    die("--data-format %s: expected auto, text or llmc", s);
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
    unsigned char head[4];
    const int64_t got = read_head(fd, path, head, sizeof head);
    if (format == DATA_LLMC ||
        (format == DATA_AUTO && (named_bin(path) || llmc_magic(head, got))))
        map_llmc(path, fd, len, out);
    else
        load_text(path, fd, len, out);
    close(fd);
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

void data_check_vocab(const token_data *d, int vocab)
{
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
    const int64_t nval = (int64_t)((double)d->n * fraction);
    *val = *d;
    val->owns = false;
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
    if (d->owns)
        free(d->shards);
    *d = (token_data){0};
}

/* ---- loader ---- */

void loader_init(loader *l, const token_data *d, int b, int t, int rank, int world)
{
    const int64_t need = (int64_t)b * t * world + 1;
    if (d->n < need)
        die("%s holds %lld tokens: a batch of %d x %d tokens on %d rank(s) needs at least %lld "
            "(shorten --seq or --batch)",
            d->source, (long long)d->n, b, t, world, (long long)need);
    *l = (loader){d, b, t, rank, world, (int64_t)rank * b * t};
}

int64_t loader_tell(const loader *l) { return l->pos - (int64_t)l->rank * l->b * l->t; }

void loader_seek(loader *l, int64_t pos) { l->pos = pos + (int64_t)l->rank * l->b * l->t; }

void loader_next(loader *l, int32_t *ids, int32_t *targets)
{
    const int64_t span = (int64_t)l->b * l->t;
    if (loader_tell(l) + span * l->world + 1 > l->d->n)
        l->pos = (int64_t)l->rank * span;
    for (int64_t i = 0; i < span; ++i)
        ids[i] = data_token(l->d, l->pos + i);
    memmove(targets, ids + 1, (size_t)(span - 1) * sizeof *targets);
    targets[span - 1] = data_token(l->d, l->pos + span);
    l->pos += span * l->world;
}
