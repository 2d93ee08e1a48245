/*
 * jsonl.h: what llmcl-train's readers of tokenized JSON Lines share (examples.c's supervised
 * fine-tuning examples, pairs.c's preference pairs): the walk over a mapped file's lines, each
 * object handed on with its line for the messages; the checked integers of a line's arrays; and
 * the token sequences read so far, each token with its target, that become a token_data's
 * examples (data.h).
 */
#ifndef LLMCL_TRAIN_JSONL_H
#define LLMCL_TRAIN_JSONL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "data.h"

#define JSONL_IGNORED (-100) /* a target that learns nothing, as transformers' labels say */

/* One line's place, for messages. */
typedef struct jsonl_where {
    const char *path;
    long line;
} jsonl_where;

/*
 * Calls add(arg, obj, at) for the parsed value of each line of the file fd (len bytes, mapped
 * rather than copied) that is not blank, in order. Dies naming the line of one that is not valid
 * JSON (duplicate keys included).
 */
void jsonl_each(const char *path, int fd, int64_t len,
                void (*add)(void *arg, json_t *value, jsonl_where at), void *arg);

/* Entry i of the array a (called key in messages): an integer in [0, 2^31), or -100 where
   ignored_ok; booleans read as 0 and 1 (masks). Anything else ends the run naming it. */
int32_t jsonl_int_at(json_t *a, size_t i, const char *key, bool ignored_ok, jsonl_where at);

/* Token sequences: their ids end to end, each token's target, where each sequence starts. */
typedef struct jsonl_seqs {
    int32_t *ids, *targets;
    int64_t n, cap_ids, cap_targets;
    int64_t *starts;
    int64_t count, cap_starts;
    int64_t open;   /* the first token of the sequence being added */
    int32_t max_id; /* the largest id or target so far */
} jsonl_seqs;

/* Starts a sequence of at most len tokens. */
void jsonl_seq_begin(jsonl_seqs *s, size_t len);

/* Appends id to the open sequence; the token before it (where there is one) learns `learned`,
   JSONL_IGNORED where it learns nothing. A sequence's last token learns nothing. */
void jsonl_seq_token(jsonl_seqs *s, int32_t id, int32_t learned);

/* Closes the open sequence: its count of tokens (0: none was appended, and none is recorded). */
int64_t jsonl_seq_end(jsonl_seqs *s);

/* The sequences as out's examples (data_set_examples), which take the arrays over; dies saying
   that path holds no `what` (e.g. "examples (one JSON object a line, with \"input_ids\")"). */
void jsonl_seqs_finish(jsonl_seqs *s, const char *path, const char *what, token_data *out);

#endif
