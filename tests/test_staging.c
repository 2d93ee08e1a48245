/*
 * test_staging.c: the NCCL transport's staging layout (src/dist/staging.c), which only NVIDIA GPUs
 * with NCCL run, checked here on its own over ranks, element sizes, exchanges, chunk sizes, piece
 * sizes and shards: the chunks cover every block exactly once, none crosses a piece or overlaps
 * another, chunk_bytes bounds them, and a smaller shard's layout fits in a larger one's staging;
 * the slice rule that the MPI transport's chunks follow too; and the MPI transport's pieces for
 * llmcl_dist_measure_transport, in ints of units up to 16 GiB.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../src/dist/staging.h"

enum { ALIGN = 16 };

/* Every property of one layout; returns its staging bytes. */
static size_t check_layout(int world, size_t shard, size_t es, bool exchange, uint64_t chunk,
                           size_t piece)
{
    const staging_layout l = staging_layout_of(world, shard, es, exchange, chunk, ALIGN, piece);
    assert_true(l.n >= 1 && l.per >= 1 && l.per <= shard);
    assert_int_equal(l.unit, (size_t)world * es * (exchange ? 2 : 1));
    if (chunk) {
        const size_t peers = world > 1 ? (size_t)world - 1 : 1;
        const size_t asked = (size_t)chunk / es / peers;
        assert_true(l.per <= (asked > 1 ? asked : 1));
    }
    if (l.per < shard && l.per > ALIGN)
        assert_int_equal(l.per % ALIGN, 0);
    size_t covered = 0, end = 0;
    for (size_t k = 0; k < l.n; ++k) {
        const size_t len = staging_chunk_len(&l, k), at = staging_chunk_at(&l, k);
        assert_true(len >= 1 && len <= l.per);
        assert_true(at >= end); /* in order, no overlap */
        end = at + l.unit * len;
        assert_int_equal(at / piece, (end - 1) / piece); /* inside one piece */
        covered += len;
    }
    assert_int_equal(covered, shard);
    assert_int_equal(staging_bytes(&l), end);
    return end;
}

static void test_every_layout(void **state)
{
    (void)state;
    const int worlds[] = {1, 2, 3, 4, 7, 8, 64};
    const size_t sizes[] = {2, 4};
    const uint64_t chunks[] = {0, 28, 1000, 1u << 20};
    const size_t pieces[] = {4096, 65536, (size_t)256 << 20};
    const size_t shards[] = {1, 2, 15, 16, 17, 1000, 4096, 100003, (size_t)1 << 20};
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; ++w)
        for (size_t e = 0; e < 2; ++e)
            for (int ex = 0; ex < 2; ++ex)
                for (size_t c = 0; c < sizeof chunks / sizeof *chunks; ++c)
                    for (size_t p = 0; p < sizeof pieces / sizeof *pieces; ++p) {
                        const size_t unit = (size_t)worlds[w] * sizes[e] * (ex ? 2 : 1);
                        if (unit > pieces[p])
                            continue;
                        for (size_t s = 0; s < sizeof shards / sizeof *shards; ++s) {
                            const size_t shard = shards[s];
                            const size_t bytes = check_layout(worlds[w], shard, sizes[e], ex,
                                                              chunks[c], pieces[p]);
                            const size_t smaller[] = {1, shard / 2 + 1, shard - 1};
                            for (int i = 0; i < 3; ++i)
                                if (smaller[i] >= 1 && smaller[i] <= shard)
                                    assert_true(check_layout(worlds[w], smaller[i], sizes[e], ex,
                                                             chunks[c], pieces[p]) <= bytes);
                        }
                    }
}

/* A group whose blocks fit in a piece is one chunk: staging holds exactly its bytes (twice for
   an exchange), the figure llmcl_dist.h's memory formulas give. */
static void test_one_chunk(void **state)
{
    (void)state;
    const size_t piece = (size_t)256 << 20, shard = (size_t)30 << 20;
    const staging_layout l = staging_layout_of(2, shard, 4, false, 0, ALIGN, piece);
    assert_int_equal(l.n, 1);
    assert_int_equal(staging_chunk_at(&l, 0), 0);
    assert_int_equal(staging_bytes(&l), 2 * 4 * shard);
    const staging_layout x = staging_layout_of(2, shard / 2, 4, true, 0, ALIGN, piece);
    assert_int_equal(x.n, 1);
    assert_int_equal(staging_bytes(&x), 2 * 2 * 4 * (shard / 2));
}

/* The 1B preset's embedding group on two ranks, f32, exchanged: 131M elements a block take four
   chunks, each starting a piece, the last one shorter. */
static void test_pieces(void **state)
{
    (void)state;
    const size_t piece = (size_t)256 << 20, shard = 131334144;
    const staging_layout l = staging_layout_of(2, shard, 4, true, 0, ALIGN, piece);
    assert_int_equal(l.per, piece / 16);
    assert_int_equal(l.n, 8);
    for (size_t k = 0; k < l.n; ++k)
        assert_int_equal(staging_chunk_at(&l, k), k * piece);
    assert_int_equal(staging_bytes(&l), 7 * piece + 16 * (shard - 7 * l.per));
}

/* test_dist's small chunks: 28 bytes to each other rank, 7 f32 or 14 bf16 elements a slice. */
static void test_small_chunks(void **state)
{
    (void)state;
    const staging_layout f = staging_layout_of(2, 80, 4, true, 28, ALIGN, (size_t)256 << 20);
    assert_int_equal(f.per, 7);
    assert_int_equal(f.n, 12);
    assert_int_equal(staging_chunk_len(&f, 11), 3);
    const staging_layout h = staging_layout_of(3, 80, 2, false, 56, ALIGN, (size_t)256 << 20);
    assert_int_equal(h.per, 14);
}

/* The slice rule both transports size their chunks by. */
static void test_slice(void **state)
{
    (void)state;
    assert_int_equal(staging_slice(1u << 20, 4, 2, (size_t)1 << 30, ALIGN), 262144);
    assert_int_equal(staging_slice(1u << 20, 2, 5, (size_t)1 << 30, ALIGN), 131072);
    assert_int_equal(staging_slice(28, 4, 2, 1000, ALIGN), 7);
    assert_int_equal(staging_slice(0, 4, 2, 40, ALIGN), 32);
    assert_int_equal(staging_slice(1000, 4, 2, 40, ALIGN), 32);
    assert_int_equal(staging_slice(2, 4, 3, 40, ALIGN), 1);
    assert_int_equal(staging_slice(0, 4, 2, 0, ALIGN), 1);
}

/* llmcl_dist_measure_transport's pieces under MPI: whole pieces in ints of units, no unit
   larger than it must be, from a few bytes to 16 GiB on one rank. */
static void test_measure_piece(void **state)
{
    (void)state;
    static const struct {
        uint64_t bytes;
        int world;
        uint64_t unit;
        int count;
    } cases[] = {
        {64, 2, 1, 32},
        {(uint64_t)INT_MAX * 2, 2, 1, INT_MAX},
        {(uint64_t)INT_MAX + 1, 1, 2, (int)(((uint64_t)INT_MAX + 1) / 2)},
        {(uint64_t)1 << 34, 1, 9, (int)(((uint64_t)1 << 34) / 9)},
        {((uint64_t)1 << 34) + 3, 3, 3, (int)((((uint64_t)1 << 34) + 3) / 3 / 3)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        uint64_t unit;
        int count;
        staging_measure_piece(cases[i].bytes, cases[i].world, &unit, &count);
        assert_int_equal(unit, cases[i].unit);
        assert_int_equal(count, cases[i].count);
        const uint64_t piece = cases[i].bytes / (uint64_t)cases[i].world;
        assert_true(unit * (uint64_t)count <= piece && piece - unit * (uint64_t)count < unit);
        assert_true(unit == 1 || piece / (unit - 1) > INT_MAX);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_layout),
        cmocka_unit_test(test_one_chunk),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_small_chunks),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_measure_piece),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
