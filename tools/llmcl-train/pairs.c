/*
 * pairs.c: tokenized preference pairs from JSON Lines (data.h), as TRL's DPOTrainer, CPOTrainer
 * and ORPOTrainer tokenize a preference set: one object a line with "prompt_input_ids",
 * "chosen_input_ids" and "rejected_input_ids" (the completions without the prompt; other keys,
 * the texts say, are ignored). Pair k becomes examples 2k (prompt + chosen) and 2k + 1 (prompt +
 * rejected) of a token_data marked pairs: a position learns the next token where that token is
 * the completion's, nothing where it is the prompt's. The line walk and the sequences are
 * jsonl.c's, which examples.c shares.
 */
#include <stdbool.h>

#include "jsonl.h"
#include "util.h"

/* The array key of a pair's line, or the run stops naming the line. */
static json_t *ids_of(json_t *obj, const char *key, jsonl_where at)
{
    json_t *a = json_object_get(obj, key);
    if (!json_is_array(a))
        die("%s:%ld: no \"%s\" array (a preference pair holds prompt_input_ids, chosen_input_ids "
            "and rejected_input_ids, tokenized)", at.path, at.line, key);
    return a;
}

/* prompt + completion as one sequence: the positions before the completion's tokens learn them,
   the others nothing. */
static void add_sequence(jsonl_seqs *s, json_t *prompt, json_t *completion, const char *key,
                         jsonl_where at)
{
    const size_t lp = json_array_size(prompt), lc = json_array_size(completion);
    if (lc == 0)
        die("%s:%ld: \"%s\" is empty: each completion of a pair needs a token", at.path, at.line,
            key);
    jsonl_seq_begin(s, lp + lc);
    for (size_t i = 0; i < lp; ++i)
        jsonl_seq_token(s, jsonl_int_at(prompt, i, "prompt_input_ids", false, at), JSONL_IGNORED);
    for (size_t i = 0; i < lc; ++i) {
        const int32_t id = jsonl_int_at(completion, i, key, false, at);
        jsonl_seq_token(s, id, id);
    }
    jsonl_seq_end(s);
}

/* Appends the pair of one parsed line (jsonl_each's add): its chosen, then its rejected. */
static void add_pair(void *arg, json_t *obj, jsonl_where at)
{
    if (!json_is_object(obj))
        die("%s:%ld: not a JSON object (each line holds one preference pair)", at.path, at.line);
    if (!json_object_get(obj, "chosen_input_ids") && json_object_get(obj, "input_ids"))
        die("%s:%ld: an example (input_ids), not a preference pair: --preference trains on "
            "prompt_input_ids, chosen_input_ids and rejected_input_ids", at.path, at.line);
    json_t *prompt = ids_of(obj, "prompt_input_ids", at);
    json_t *chosen = ids_of(obj, "chosen_input_ids", at);
    json_t *rejected = ids_of(obj, "rejected_input_ids", at);
    add_sequence(arg, prompt, chosen, "chosen_input_ids", at);
    add_sequence(arg, prompt, rejected, "rejected_input_ids", at);
}

void pairs_load(const char *path, int fd, int64_t len, token_data *out)
{
    jsonl_seqs s = {0};
    jsonl_each(path, fd, len, add_pair, &s);
    jsonl_seqs_finish(&s, path,
                      "preference pairs (one JSON object a line, with prompt_input_ids, "
                      "chosen_input_ids and rejected_input_ids)",
                      out);
    out->pairs = true;
}
