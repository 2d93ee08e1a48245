/*
 * checkpoint.h: llmcl-train's checkpoints, one safetensors file: each parameter's f32 master
 * weights under its Hugging Face name (so the file is also a set of weights other tools read),
 * the AdamW moments as "optimizer.m.<name>" and "optimizer.v.<name>", and in "__metadata__" the
 * model's shape, the step and the data position. The file is complete or absent: the writer goes
 * through a temporary file renamed into place.
 */
#ifndef LLMCL_TRAIN_CHECKPOINT_H
#define LLMCL_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "model.h"

typedef struct train_state {
    int64_t step;     /* optimizer steps done */
    int64_t data_pos; /* the loader's position */
} train_state;

/* Writes m's weights and optimizer state with s to path. */
llmcl_status checkpoint_save(model *m, const train_state *s, const char *path);

/*
 * Loads path into m, which must have the checkpoint's shape: a missing or malformed file, another
 * format, or a model of another shape fails with a message naming the difference (in *why, static
 * storage) and leaves m untouched.
 */
llmcl_status checkpoint_load(model *m, const char *path, train_state *s, const char **why);

#endif
