/*
 * checkpoint.h: llmcl-train's checkpoints, one safetensors file: each trainable parameter's f32
 * master weights under its Hugging Face name (so the file is also a set of weights other tools
 * read), the AdamW moments as "optimizer.m.<name>" and "optimizer.v.<name>", and in "__metadata__"
 * the model's shape, the step and the data position. The file is complete or absent: the writer
 * goes through a temporary file renamed into place.
 *
 * A LoRA run saves only what it trains: the adapters under PEFT's names (bf16-only adapters in
 * bf16) with their moments. The frozen base weights are not in the file; a resume takes them from
 * the same --init-from again, and the metadata holds the LoRA settings and a 64-bit fingerprint of
 * the frozen f32 weights (a hash of their bits in layout order), so a resume on another base, or a
 * LoRA checkpoint resumed without LoRA (or the reverse), is refused.
 *
 * Under --zero (model.zero) the path is a folder instead: llmcl_dist's checkpoint (shard files and
 * manifest, resharded on load for any number of ranks) and train.safetensors with the metadata
 * alone, saved in one atomic step (llmcl_dist_save_with), so that a job killed while saving leaves
 * the previous checkpoint or the new one. Both calls are then collective and return the same
 * status on every rank. A one-file checkpoint and a folder are not interchangeable: resuming one
 * as the other is refused with a message saying so.
 */
#ifndef LLMCL_TRAIN_CHECKPOINT_H
#define LLMCL_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "model.h"

typedef struct train_state {
    int64_t step;     /* optimizer steps done */
    int64_t data_pos; /* the loader's position */
} train_state;

/* Writes m's weights and optimizer state with s to path; on failure the reason in *why (static
   storage). */
llmcl_status checkpoint_save(model *m, const train_state *s, const char *path, const char **why);

/*
 * Loads path into m, which must have the checkpoint's shape: a missing or malformed file, another
 * format, or a model of another shape fails with a message naming the difference (in *why, static
 * storage) and leaves m untouched. Those checks come before the first tensor is read, so only a
 * read that fails after them (the file cut short under it, the device) leaves m part-loaded.
 * *from names what was read: path, or under --zero path.old when a save into path was stopped
 * between its renames (llmcl_dist_load).
 */
llmcl_status checkpoint_load(model *m, const char *path, train_state *s, const char **from,
                             const char **why);

#endif
