/*
 * examples.c: tokenized examples from JSON Lines (data.h), the form that Hugging Face datasets'
 * to_json writes for a tokenized supervised fine-tuning set: one object a line with "input_ids"
 * and, optionally, "labels" (-100 where nothing is learned, as transformers' models read them),
 * TRL's "completion_mask", transformers' "assistant_masks" and "attention_mask". Position i of an
 * example learns labels[i + 1] (input_ids[i + 1] without labels) unless that is -100 or a mask is
 * 0 there; positions whose attention_mask is 0 are padding and are dropped.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "data.h"
#include "util.h"

#define IGNORED (-100)

/* The examples read so far: tokens, their targets, and where each example starts. */
typedef struct example_set {
    int32_t *ids, *targets;
    int64_t n, cap_ids, cap_targets;
    int64_t *starts;
    int64_t n_examples, cap_examples;
    int32_t max_id;
} example_set;

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

/* One JSON Lines line's place, for messages. */
typedef struct where {
    const char *path;
    long line;
} where;

/* key's array, of the length of input_ids (len), or NULL when the object has no such key. */
static json_t *same_length(json_t *obj, const char *key, size_t len, where at)
{
    json_t *a = json_object_get(obj, key);
    if (!a || json_is_null(a))
        return NULL;
    if (!json_is_array(a))
        die("%s:%ld: \"%s\" is not an array", at.path, at.line, key);
    if (json_array_size(a) != len)
        die("%s:%ld: \"%s\" has %zu entries where input_ids has %zu", at.path, at.line, key,
            json_array_size(a), len);
    return a;
}

/* Entry i of an array of integers in [0, 2^31), or -100 where ignored_ok; else the run stops
   naming it. Booleans read as 0 and 1 (masks). */
static int32_t int_at(json_t *a, size_t i, const char *key, bool ignored_ok, where at)
{
    json_t *v = json_array_get(a, i);
    json_int_t x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_boolean(v))
        x = json_is_true(v);
    else
        die("%s:%ld: %s[%zu] is not an integer", at.path, at.line, key, i);
    if ((x < 0 || x > INT32_MAX) && !(ignored_ok && x == IGNORED))
        die("%s:%ld: %s[%zu] is %lld; expected %sa value in [0, 2^31)", at.path, at.line, key, i,
            (long long)x, ignored_ok ? "-100 or " : "");
    return (int32_t)x;
}

/* A mask's entry: 0 or 1 (false or true). */
static bool mask_at(json_t *a, size_t i, const char *key, where at)
{
    const int32_t v = int_at(a, i, key, false, at);
    if (v > 1)
        die("%s:%ld: %s[%zu] is %d; a mask holds 0 or 1", at.path, at.line, key, i, (int)v);
    return v == 1;
}

/* Appends the example of one parsed line. */
static void add_example(example_set *s, json_t *obj, where at)
{
    if (!json_is_object(obj))
        die("%s:%ld: not a JSON object (each line holds one example)", at.path, at.line);
    json_t *ids = json_object_get(obj, "input_ids");
    if (!json_is_array(ids))
        die("%s:%ld: no \"input_ids\" array (the examples must be tokenized)", at.path, at.line);
    const size_t len = json_array_size(ids);
    json_t *labels = same_length(obj, "labels", len, at),
           *attention = same_length(obj, "attention_mask", len, at);
    json_t *masks[2] = {same_length(obj, "completion_mask", len, at),
                        same_length(obj, "assistant_masks", len, at)};
    static const char *const mask_names[2] = {"completion_mask", "assistant_masks"};
    grow((void **)&s->ids, &s->cap_ids, s->n + (int64_t)len, sizeof *s->ids);
    grow((void **)&s->targets, &s->cap_targets, s->n + (int64_t)len, sizeof *s->targets);
    const int64_t first = s->n;
    for (size_t i = 0; i < len; ++i) {
        if (attention && !mask_at(attention, i, "attention_mask", at))
            continue;
        const int32_t id = int_at(ids, i, "input_ids", false, at);
        int32_t target = labels ? int_at(labels, i, "labels", true, at) : id;
        for (int k = 0; k < 2; ++k)
            if (masks[k] && !mask_at(masks[k], i, mask_names[k], at))
                target = IGNORED;
        s->max_id = id > s->max_id ? id : s->max_id;
        s->max_id = target > s->max_id ? target : s->max_id;
        /* token i's target is what position i + 1 says: shifted one place back */
        if (s->n > first)
            s->targets[s->n - 1] = target;
        s->ids[s->n] = id;
        s->targets[s->n++] = IGNORED;
    }
    if (s->n == first)
        die("%s:%ld: the example has no tokens%s", at.path, at.line,
            attention ? " (its attention_mask is all 0)" : "");
    grow((void **)&s->starts, &s->cap_examples, s->n_examples + 2, sizeof *s->starts);
    s->starts[s->n_examples++] = first;
}

void examples_load(const char *path, int fd, int64_t len, token_data *out)
{
    const char *text = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (text == MAP_FAILED)
        die("cannot map %s: %s", path, strerror(errno));
    example_set s = {0};
    where at = {path, 0};
    for (const char *line = text, *end = text + len; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const size_t n = (size_t)((nl ? nl : end) - line);
        ++at.line;
        size_t blank = 0;
        while (blank < n && strchr(" \t\r", line[blank]))
            ++blank;
        if (blank < n) { /* blank lines are skipped, as JSON Lines readers do */
            json_error_t err;
            json_t *obj = json_loadb(line, n, JSON_REJECT_DUPLICATES, &err);
            if (!obj)
                die("%s:%ld: not valid JSON: %s (column %d)", path, at.line, err.text,
                    err.column);
            add_example(&s, obj, at);
            json_decref(obj);
        }
        line += n + 1;
    }
    munmap((void *)text, (size_t)len);
    if (s.n_examples == 0)
        die("%s holds no examples (one JSON object a line, with \"input_ids\")", path);
    s.starts[s.n_examples] = s.n;
    data_set_examples(out, path, s.ids, s.targets, s.n, s.starts, s.n_examples, s.max_id + 1);
}
