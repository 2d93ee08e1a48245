/*
 * staging.h: how the NCCL transport lays an op out in its staging range (transport_nccl.c), a
 * range made of pieces that are each one OpenCL buffer and one NCCL window (shared_mem.h). The op
 * goes chunk by chunk, a chunk inside one piece, so that no NCCL call crosses a piece: chunk k
 * holds the k-th slice of every rank's block, back to back in rank order, and for an exchange
 * as many slices received after them. A slice's length follows staging_slice, the rule by which
 * the MPI transport sizes its chunks too, and staging_measure_piece how its
 * llmcl_dist_measure_transport counts a rank's piece. Pure arithmetic, tested on its own
 * (tests/test_staging.c).
 */
#ifndef LLMCL_DIST_STAGING_H
#define LLMCL_DIST_STAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct staging_layout {
    size_t shard;     /* elements of a block */
    size_t per;       /* elements of a block's slice in a full chunk */
    size_t unit;      /* staging bytes for an element of a slice: P x es, twice for an exchange */
    size_t piece;     /* bytes of a piece */
    size_t per_piece; /* chunks in a piece */
    size_t n;         /* chunks */
} staging_layout;

/*
 * Elements of a block's slice in one chunk: chunk_bytes (0: no bound) over the slices a chunk
 * sends to the other ranks (world - 1, at least 1) in elements of es bytes, at most cap, at
 * least 1, and a multiple of align where longer, so that with shards that are multiples of align
 * every slice starts aligned.
 */
size_t staging_slice(uint64_t chunk_bytes, size_t es, int world, size_t cap, size_t align);

/*
 * The layout of an op on world ranks whose blocks hold shard (> 0) elements of es bytes. A slice
 * is as long as a piece of piece bytes allows, or as chunk_bytes allows where it is set (at most
 * chunk_bytes to the other ranks each way in one chunk, as under MPI), at least 1 element and a
 * multiple of align where longer. One element of every slice (unit bytes) must fit in a piece.
 */
staging_layout staging_layout_of(int world, size_t shard, size_t es, bool exchange,
                                 uint64_t chunk_bytes, size_t align, size_t piece);

/* Elements of chunk k's slices. */
size_t staging_chunk_len(const staging_layout *l, size_t k);

/* Chunk k's first byte in the range. */
size_t staging_chunk_at(const staging_layout *l, size_t k);

/* The bytes of staging the layout needs; a smaller shard's layout needs no more. */
size_t staging_bytes(const staging_layout *l);

/*
 * A rank's piece of bytes over world ranks (bytes / world, rounded down) for the MPI transport's
 * llmcl_dist_measure_transport, as *count elements of *unit bytes each, since MPI's counts are
 * ints: unit 1 where the piece is at most INT_MAX bytes, else the fewest bytes that bring count
 * within INT_MAX (the piece then rounded down to whole units, a few bytes of gigabytes).
 */
void staging_measure_piece(uint64_t bytes, int world, uint64_t *unit, int *count);

#endif /* LLMCL_DIST_STAGING_H */
