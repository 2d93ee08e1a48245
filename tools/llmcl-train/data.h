/*
 * data.h: training tokens for llmcl-train. A byte-level tokenizer over any text file (vocabulary
 * 256), token files in llm.c's format (a header of 256 int32: magic 20240520 with version 1 for
 * uint16 tokens, or magic 20240801 with version 7 for uint32 tokens, then header[2] tokens), and a
 * built-in corpus generated from a fixed seed so that the default run needs no download. A pattern
 * (`data/fineweb_train_*.bin`, as llm.c's loaders take) names llm.c shards, read as one stream in
 * the order of their names. llm.c files are memory-mapped and read where they lie, so a dataset
 * larger than the host's memory trains. Tokenized examples in JSON Lines (examples.c: what a
 * supervised fine-tuning set holds, with the positions that learn nothing marked) are packed
 * whole into rows of t tokens, best fit decreasing or in file order, each example attending only
 * to itself from position 0. Tokenized preference pairs in JSON Lines (pairs.c: a prompt, a
 * chosen and a rejected completion, as TRL writes them) are not packed: a micro-batch of b pairs
 * is 2b rows, the b chosen sequences and then their b rejected ones, each row one sequence from
 * position 0, cut to t tokens or padded. A loader walks a stream's tokens in windows of
 * b x (t + 1), the packed rows or the pairs b at a time, each rank of a job at its own offset.
 */
#ifndef LLMCL_TRAIN_DATA_H
#define LLMCL_TRAIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One file's tokens: an llm.c file's, mapped (2 or 4 bytes each, little-endian), or int32 values
   in memory (text, the built-in corpus). */
typedef struct token_shard {
    const unsigned char *at; /* the first token */
    void *mem;               /* the mapping (map_len bytes) or, where map_len is 0, the array */
    size_t map_len;
    int64_t first, n;        /* the first token's place in the stream, and the count */
    int width;               /* bytes a token: 2 or 4 */
    char name[256];
} token_shard;

/* How examples pack into rows: best fit decreasing (longest first, each into the row with the
   least room that holds it; rows then in the order of their first example in the file), or
   greedy in file order (the next example starts a new row when the row it would end has no
   room). */
typedef enum data_packing { PACK_BFD, PACK_GREEDY } data_packing;

/* --packing's value; dies on another. */
data_packing data_packing_parse(const char *s);

/* A view of tokens [begin, begin + n) of a stream of shards; the view data_load or data_builtin
   made owns them, the held-out view that data_split makes of it shares them. */
typedef struct token_data {
    token_shard *shards;
    int n_shards;
    bool owns;
    int64_t begin, n;
    int vocab;       /* the tokenizer's vocabulary: 256 for bytes, from the format otherwise
                        (examples: the largest id or label + 1) */
    bool vocab_bound; /* vocab only bounds the ids: JSON Lines name no tokenizer */
    int byte_level;  /* tokens are bytes: samples print as text */
    char source[256];
    /* Examples (NULL for a stream): example k is the stream's tokens [starts[k], starts[k + 1]),
       and targets[i] is what token i learns (-100: nothing; an example's last token never learns).
       A view holds examples [ex_begin, ex_begin + n_examples). */
    int32_t *targets;
    int64_t *starts;
    int64_t ex_begin, n_examples;
    data_packing packing; /* how loaders pack the examples */
    bool pairs;           /* preference pairs: example 2k is pair k's prompt + chosen completion,
                             2k + 1 its prompt + rejected one (n_examples even) */
} token_data;

/* How a data file is read: auto takes a file named *.bin, or one that starts with an llm.c magic,
   as an llm.c token file, one named *.jsonl as examples and any other as text; text, llmc and
   jsonl force one reading. DATA_PAIRS (--preference, not a --data-format value) reads one file
   of preference pairs in JSON Lines. */
typedef enum data_format { DATA_AUTO, DATA_TEXT, DATA_LLMC, DATA_JSONL, DATA_PAIRS } data_format;

/* --data-format's value; dies on another. */
data_format data_format_parse(const char *s);

/*
 * Reads path as format says (llm.c tokens, or the bytes of a text file); a path with glob
 * characters (* ? [) is a pattern of llm.c files, all of one format, in the order of their names.
 * Dies with a clear message when a file is missing, a folder, unreadable or empty, or is to be an
 * llm.c token file and is not a whole, valid one, and when a pattern matches nothing or mixes
 * formats.
 */
void data_load(const char *path, data_format format, token_data *out);

/*
 * Tokenized examples from a JSON Lines file (examples.c): one object a line with "input_ids" and
 * optionally "labels", "completion_mask", "assistant_masks" and "attention_mask". Dies naming the
 * line of anything malformed. fd is the file open, len its size; it is mapped, not copied.
 */
void examples_load(const char *path, int fd, int64_t len, token_data *out);

/*
 * Preference pairs from a JSON Lines file (pairs.c): one object a line with "prompt_input_ids",
 * "chosen_input_ids" and "rejected_input_ids"; out's examples 2k and 2k + 1 are pair k's prompt +
 * chosen and prompt + rejected, each position learning the next token where it is the
 * completion's (out->pairs set). Dies naming the line of anything malformed; fd and len as above.
 */
void pairs_load(const char *path, int fd, int64_t len, token_data *out);

/* out becomes the examples: n tokens ids with their targets, example k from starts[k] (starts
   holds n_examples + 1 entries, the last n); it takes the arrays over. */
void data_set_examples(token_data *out, const char *name, int32_t *ids, int32_t *targets,
                       int64_t n, int64_t *starts, int64_t n_examples, int vocab);

/* Token i of the view. */
int32_t data_token(const token_data *d, int64_t i);

/* Dies naming the file and place of the first token (or example's or pair's target) outside
   [0, vocab). */
void data_check_vocab(const token_data *d, int vocab);

/* The built-in corpus: simple English sentences from a small grammar, `bytes` long. */
void data_builtin(uint64_t seed, int64_t bytes, token_data *out);

/* Moves the last `fraction` of d's tokens (examples: of its examples, at least one where it has
   two; pairs: of its pairs, likewise) into val (a held-out split). */
void data_split(token_data *d, double fraction, token_data *val);

void data_free(token_data *d);

/* A micro-batch: b rows of t tokens, as the loader fills it. */
typedef struct token_batch {
    int b, t;               /* rows: 2 b' for a loader of b' pairs */
    int32_t *ids, *targets; /* b x t each; a target of -100 learns nothing */
    int32_t *pos;           /* b x t: each token's place in its example (examples only) */
    int32_t *doc_offsets;   /* docs + 1: where each example, and each row's padding, starts */
    int docs;               /* 0: windows of a stream or pairs, every row one sequence at
                               0..t-1 */
    int64_t counted;        /* the targets that learn; pairs: those of the chosen sequences (a
                               supervised term's) */
} token_batch;

void batch_init(token_batch *batch, int b, int t);
void batch_free(token_batch *batch);

/* Windows of b x t inputs and their next-token targets, rows of packed examples, or b pairs as 2 b
   rows. */
typedef struct loader {
    const token_data *d;
    int b, t, rank, world;
    int64_t pos; /* the next window's first token, or its first row */
    /* examples: row r packs examples row_examples[row_first[r] .. row_first[r + 1]), in file
       order, and counts row_counted[r] targets that learn (pairs: pair r's chosen sequence's) */
    int64_t *row_examples, *row_first, *row_counted, n_rows;
    int64_t truncated; /* examples (pairs: sequences) longer than t, cut to their first t */
    int64_t unscored;  /* pairs: sequences of which no position learns within t tokens */
    double fill;       /* the share of the rows' tokens that examples take (the rest pads) */
} loader;

/* A stream's: dies when the data holds fewer than b x t + 1 tokens. Examples: packs the rows.
   Pairs: b pairs a micro-batch (the batch b x 2 rows), row r of the loader pair r. */
void loader_init(loader *l, const token_data *d, int b, int t, int rank, int world);
void loader_free(loader *l);

/*
 * The next micro-batch: a stream's next window (wrapping to the start at the end of the data), or
 * the next b rows of packed examples (row r mod the rows' count, so a small set repeats), or the
 * next b pairs so (their chosen sequences in rows 0 to b - 1, their rejected ones after). The
 * ranks' windows of one step are consecutive, rank 0 first, so a job of N ranks at batch b reads
 * the rows that one rank reads at batch N b, in the same order; the ranks wrap together.
 */
void loader_next(loader *l, token_batch *out);

/* The targets that learn in the next `micro` micro-batches of the whole job (every rank's; pairs:
   of the chosen sequences), without moving: what a step's mean loss divides by (pairs: its
   supervised term's). */
int64_t loader_counted_ahead(const loader *l, int micro);

/* The whole job's micro-batches that read the data once before it repeats: a stream's whole
   windows, or as many as cover every row of examples or every pair (the last may repeat some). */
int64_t loader_micro_batches(const loader *l);

/* The whole job's position (rank 0's), which a checkpoint stores, and a seek to one: false,
   without moving, for a position that this data's loader never tells. */
int64_t loader_tell(const loader *l);
bool loader_seek(loader *l, int64_t pos);

#endif
