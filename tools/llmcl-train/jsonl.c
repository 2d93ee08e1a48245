/*
 * jsonl.c: the line walk, checked integers and token sequences that examples.c and pairs.c share
 * (jsonl.h).
 */
#include "jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util.h"

void jsonl_each(const char *path, int fd, int64_t len,
                void (*add)(void *arg, json_t *value, jsonl_where at), void *arg)
{
    const char *text = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (text == MAP_FAILED)
        die("cannot map %s: %s", path, strerror(errno));
    jsonl_where at = {path, 0};
    for (const char *line = text, *end = text + len; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const size_t n = (size_t)((nl ? nl : end) - line);
        ++at.line;
        size_t blank = 0;
        while (blank < n && memchr(" \t\r", line[blank], 3)) /* NUL is no blank */
            ++blank;
        if (blank < n) { /* blank lines are skipped, as JSON Lines readers do */
            json_error_t err;
            json_t *value = json_loadb(line, n, JSON_REJECT_DUPLICATES, &err);
            if (!value)
                die("%s:%ld: not valid JSON: %s (column %d)", path, at.line, err.text,
                    err.column);
            add(arg, value, at);
            json_decref(value);
        }
        line += n + 1;
    }
    munmap((void *)text, (size_t)len);
}

int32_t jsonl_int_at(json_t *a, size_t i, const char *key, bool ignored_ok, jsonl_where at)
{
    json_t *v = json_array_get(a, i);
    json_int_t x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_boolean(v))
        x = json_is_true(v);
    else
        die("%s:%ld: %s[%zu] is not an integer", at.path, at.line, key, i);
    if ((x < 0 || x > INT32_MAX) && !(ignored_ok && x == JSONL_IGNORED))
        die("%s:%ld: %s[%zu] is %lld; expected %sa value in [0, 2^31)", at.path, at.line, key, i,
            (long long)x, ignored_ok ? "-100 or " : "");
    return (int32_t)x;
}

/* Room for need elements of elem bytes at *p (capacity *cap), doubling. */
static void grow(void **p, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap)
        return;
    int64_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    *p = realloc(*p, (size_t)c * elem);
    if (!*p)
        die("out of host memory for the examples");
    *cap = c;
}

void jsonl_seq_begin(jsonl_seqs *s, size_t len)
{
    grow((void **)&s->ids, &s->cap_ids, s->n + (int64_t)len, sizeof *s->ids);
    grow((void **)&s->targets, &s->cap_targets, s->n + (int64_t)len, sizeof *s->targets);
    s->open = s->n;
}

void jsonl_seq_token(jsonl_seqs *s, int32_t id, int32_t learned)
{
    s->max_id = id > s->max_id ? id : s->max_id;
    s->max_id = learned > s->max_id ? learned : s->max_id;
    /* token i's target is what position i + 1 says: shifted one place back */
    if (s->n > s->open)
        s->targets[s->n - 1] = learned;
    s->ids[s->n] = id;
    s->targets[s->n++] = JSONL_IGNORED;
}

int64_t jsonl_seq_end(jsonl_seqs *s)
{
    if (s->n == s->open)
        return 0;
    grow((void **)&s->starts, &s->cap_starts, s->count + 2, sizeof *s->starts);
    s->starts[s->count++] = s->open;
    return s->n - s->open;
}

void jsonl_seqs_finish(jsonl_seqs *s, const char *path, const char *what, token_data *out)
{
    if (s->count == 0)
        die("%s holds no %s", path, what);
    s->starts[s->count] = s->n;
    /* the ids bound the vocabulary; one of 2^31 - 1 leaves no int above it, and is refused as
       outside the largest */
    const int vocab = s->max_id < INT32_MAX ? s->max_id + 1 : INT32_MAX;
    data_set_examples(out, path, s->ids, s->targets, s->n, s->starts, s->count, vocab);
}
