/*
 * examples.c: tokenized examples from JSON Lines (data.h), the form that Hugging Face datasets'
 * to_json writes for a tokenized supervised fine-tuning set: one object a line with "input_ids"
 * and, optionally, "labels" (-100 where nothing is learned, as transformers' models read them),
 * TRL's "completion_mask", transformers' "assistant_masks" and "attention_mask". Position i of an
 * example learns labels[i + 1] (input_ids[i + 1] without labels) unless that is -100 or a mask is
 * 0 there; positions whose attention_mask is 0 are padding and are dropped. The line walk and
 * the sequences are jsonl.c's, which pairs.c's preference pairs share.
 */
#include <stdbool.h>
#include <string.h>

#include "jsonl.h"
#include "util.h"

/* key's array, of the length of input_ids (len), or NULL when the object has no such key. */
static json_t *same_length(json_t *obj, const char *key, size_t len, jsonl_where at)
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

/* A mask's entry: 0 or 1 (false or true). */
static bool mask_at(json_t *a, size_t i, const char *key, jsonl_where at)
{
    const int32_t v = jsonl_int_at(a, i, key, false, at);
    if (v > 1)
        die("%s:%ld: %s[%zu] is %d; a mask holds 0 or 1", at.path, at.line, key, i, (int)v);
    return v == 1;
}

/* Appends the example of one parsed line to the sequences (jsonl_each's add). */
static void add_example(void *arg, json_t *obj, jsonl_where at)
{
    jsonl_seqs *s = arg;
    if (!json_is_object(obj))
        die("%s:%ld: not a JSON object (each line holds one example)", at.path, at.line);
    json_t *ids = json_object_get(obj, "input_ids");
    if (!json_is_array(ids) && json_object_get(obj, "chosen_input_ids"))
        die("%s:%ld: a preference pair (chosen_input_ids), not an example: train on pairs with "
            "--preference", at.path, at.line);
    if (!json_is_array(ids))
        die("%s:%ld: no \"input_ids\" array (the examples must be tokenized)", at.path, at.line);
    const size_t len = json_array_size(ids);
    json_t *labels = same_length(obj, "labels", len, at),
           *attention = same_length(obj, "attention_mask", len, at);
    json_t *masks[2] = {same_length(obj, "completion_mask", len, at),
                        same_length(obj, "assistant_masks", len, at)};
    static const char *const mask_names[2] = {"completion_mask", "assistant_masks"};
    jsonl_seq_begin(s, len);
    for (size_t i = 0; i < len; ++i) {
        if (attention && !mask_at(attention, i, "attention_mask", at))
            continue;
        const int32_t id = jsonl_int_at(ids, i, "input_ids", false, at);
        int32_t target = labels ? jsonl_int_at(labels, i, "labels", true, at) : id;
        for (int k = 0; k < 2; ++k)
            if (masks[k] && !mask_at(masks[k], i, mask_names[k], at))
                target = JSONL_IGNORED;
        jsonl_seq_token(s, id, target);
    }
    if (jsonl_seq_end(s) == 0)
        die("%s:%ld: the example has no tokens%s", at.path, at.line,
            attention ? " (its attention_mask is all 0)" : "");
}

void examples_load(const char *path, int fd, int64_t len, token_data *out)
{
    jsonl_seqs s = {0};
    jsonl_each(path, fd, len, add_example, &s);
    jsonl_seqs_finish(&s, path, "examples (one JSON object a line, with \"input_ids\")", out);
}
