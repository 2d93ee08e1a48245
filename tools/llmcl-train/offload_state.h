/*
 * offload_state.h: the optimizer state of llmcl-train in pinned host memory
 * (--offload-optimizer). The trainable set's f32 masters and AdamW moments, 12 bytes a parameter,
 * live in an llmcl_offload engine's pool, one handle per chunk of the set's flat layout holding
 * [master | m | v] of its elements. Two device buffers of one chunk each take the chunks in turn:
 * while the GPU works on chunk i, chunk i + 1 comes in and chunk i - 1 goes back, on the engine's
 * copy queue, ordered with the compute queue by events only. The device keeps the compute copy and
 * the gradients, and the two buffers.
 */
#ifndef LLMCL_TRAIN_OFFLOAD_STATE_H
#define LLMCL_TRAIN_OFFLOAD_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "llmcl.h"

typedef struct offload_state offload_state;

/*
 * State for a layout of total elements (a multiple of 64), all zero, in chunks of at most
 * chunk_bytes of state and about an eighth of the layout (a multiple of 64 elements, at least 64).
 * Borrows ctx. *out is NULL on failure.
 */
llmcl_status offload_state_create(llmcl_ctx *ctx, int64_t total, uint64_t chunk_bytes,
                                  offload_state **out);

/* Waits for the copies in flight and frees everything. Accepts NULL. */
void offload_state_destroy(offload_state *s);

/* Elements per chunk (the last may have fewer), the number of chunks, and the engine. */
int64_t offload_state_chunk(const offload_state *s);
int offload_state_chunks(const offload_state *s);
llmcl_offload *offload_state_engine(offload_state *s);

/*
 * What offload_state_stream does with a chunk on the device: elements [at, at + len) of the
 * layout, their masters, m and v as f32 [len] views (borrowed for the call). It enqueues work and
 * returns its status.
 */
typedef llmcl_status (*offload_state_fn)(void *arg, int64_t at, int64_t len, llmcl_tensor *master,
                                         llmcl_tensor *m, llmcl_tensor *v);

/*
 * Calls fn on every chunk in layout order, the next chunk coming in meanwhile; with write_back
 * each chunk goes back over its own pinned block after fn (which updated it). Never waits on the
 * host.
 */
llmcl_status offload_state_stream(offload_state *s, bool write_back, offload_state_fn fn,
                                  void *arg);

/*
 * Host images of the whole layout, total f32 each. write replaces the state (m or v NULL: zeros)
 * and returns once it has read the images; read copies the state out (a NULL image is skipped) and
 * returns once it is there. Both wait on the host.
 */
llmcl_status offload_state_write(offload_state *s, const float *master, const float *m,
                                 const float *v);
llmcl_status offload_state_read(offload_state *s, float *master, float *m, float *v);

#endif
