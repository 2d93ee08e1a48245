/* data.c: token files, the byte-level tokenizer, the built-in corpus and the loader (data.h). */
#include "data.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

#define LLMC_MAGIC_GPT2 20240520
#define LLMC_MAGIC_LLAMA3 20240801

#define LLMC_HEADER_BYTES 1024 /* 256 int32 */

static unsigned char *read_file(const char *path, int64_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0)
        die("cannot read %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        die("%s is a folder: give a text file or an llm.c token file (.bin)", path);
    if (!S_ISREG(sb.st_mode))
        die("%s is not a regular file: give a text file or an llm.c token file (.bin)", path);
    if (sb.st_size == 0)
        die("%s is empty", path);
    unsigned char *buf = xmalloc((size_t)sb.st_size);
    if (fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size)
        die("cannot read %s: %s", path, ferror(f) ? strerror(errno) : "shorter than its size");
    fclose(f);
    *len = sb.st_size;
    return buf;
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

/* llm.c's token file in buf, whole and valid, or the run stops saying what is wrong. */
static void load_llmc(const char *path, const unsigned char *buf, int64_t len, token_data *out)
{
    int32_t header[256];
    if (len < LLMC_HEADER_BYTES)
        die("%s: %lld bytes, shorter than the 1024-byte header of an llm.c token file (give "
            "--data-format text if it is text)", path, (long long)len);
    memcpy(header, buf, sizeof header);
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
    out->tokens = xmalloc((size_t)n * sizeof *out->tokens);
    const unsigned char *p = buf + LLMC_HEADER_BYTES;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t v = 0;
        memcpy(&v, p + i * width, (size_t)width); /* little-endian hosts, as llm.c writes */
        if (v > INT32_MAX)
            die("%s: token %lld is %u, beyond int32", path, (long long)i, v);
        out->tokens[i] = (int32_t)v;
    }
    out->n = n;
    out->vocab = gpt2 ? 50257 : 128256;
    out->byte_level = 0;
}

static void load_text(const unsigned char *buf, int64_t len, token_data *out)
{
    out->tokens = xmalloc((size_t)len * sizeof *out->tokens);
    for (int64_t i = 0; i < len; ++i)
        out->tokens[i] = buf[i];
    out->n = len;
    out->vocab = 256;
    out->byte_level = 1;
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
    memset(out, 0, sizeof *out);
    snprintf(out->source, sizeof out->source, "%s", path);
    int64_t len = 0;
    unsigned char *buf = read_file(path, &len);
    if (format == DATA_LLMC ||
        (format == DATA_AUTO && (named_bin(path) || llmc_magic(buf, len))))
        load_llmc(path, buf, len, out);
    else
        load_text(buf, len, out);
    free(buf);
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
    memset(out, 0, sizeof *out);
    snprintf(out->source, sizeof out->source, "built-in corpus (seed %llu)",
             (unsigned long long)seed);
    out->tokens = xmalloc((size_t)bytes * sizeof *out->tokens);
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
            out->tokens[n++] = (unsigned char)sentence[i];
        in_paragraph = util_rng_next(&r) % 5 != 0;
        if (!in_paragraph && n < bytes)
            out->tokens[n++] = '\n';
    }
    out->n = n;
    out->vocab = 256;
    out->byte_level = 1;
}

void data_split(token_data *d, double fraction, token_data *val)
{
    const int64_t nval = (int64_t)((double)d->n * fraction);
    *val = *d;
    val->tokens = xmalloc((size_t)(nval ? nval : 1) * sizeof *val->tokens);
    memcpy(val->tokens, d->tokens + d->n - nval, (size_t)nval * sizeof *val->tokens);
    val->n = nval;
    d->n -= nval;
}

void data_free(token_data *d)
{
    free(d->tokens);
    d->tokens = NULL;
    d->n = 0;
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
    memcpy(ids, l->d->tokens + l->pos, (size_t)span * sizeof *ids);
    memcpy(targets, l->d->tokens + l->pos + 1, (size_t)span * sizeof *targets);
    l->pos += span * l->world;
}
