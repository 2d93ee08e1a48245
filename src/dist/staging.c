/*
 * staging.c: the NCCL transport's staging layout, chunk by chunk (staging.h).
 */
#include <limits.h>

#include "staging.h"

size_t staging_slice(uint64_t chunk_bytes, size_t es, int world, size_t cap, size_t align)
{
    size_t n = cap;
    if (chunk_bytes) {
        const size_t peers = world > 1 ? (size_t)world - 1 : 1;
        const size_t asked = (size_t)chunk_bytes / es / peers;
        n = asked < n ? asked : n;
    }
    if (n > align)
        n -= n % align;
    return n < 1 ? 1 : n;
}

staging_layout staging_layout_of(int world, size_t shard, size_t es, bool exchange,
                                 uint64_t chunk_bytes, size_t align, size_t piece)
{
    staging_layout l = {.shard = shard, .piece = piece,
                        .unit = (size_t)world * es * (exchange ? 2 : 1)};
    const size_t per = staging_slice(chunk_bytes, es, world, piece / l.unit, align);
    l.per = per < shard ? per : shard;
    l.per_piece = piece / (l.unit * l.per);
    l.n = (shard + l.per - 1) / l.per;
    return l;
}

size_t staging_chunk_len(const staging_layout *l, size_t k)
{
    return l->shard - k * l->per < l->per ? l->shard - k * l->per : l->per;
}

size_t staging_chunk_at(const staging_layout *l, size_t k)
{
    return k / l->per_piece * l->piece + k % l->per_piece * l->unit * l->per;
}

size_t staging_bytes(const staging_layout *l)
{
    return staging_chunk_at(l, l->n - 1) + l->unit * staging_chunk_len(l, l->n - 1);
}

void staging_measure_piece(uint64_t bytes, int world, uint64_t *unit, int *count)
{
    const uint64_t piece = bytes / (uint64_t)world;
    *unit = piece <= INT_MAX ? 1 : (piece + INT_MAX - 1) / INT_MAX;
    *count = (int)(piece / *unit);
}
