/*
 * test_offload.c: the host offload engine and the host link measurement. Bit-exact round trips
 * (every dtype, strided views), restores out of order with many handles in flight, ordering with
 * kernels on the compute queue (a kernel writes, save, restore, a kernel reads), the pool limit,
 * statistics, every bad input, and destroying an engine with copies in flight. Persistent state:
 * handles streamed through a ring of two device buffers by prefetch_into and save_into, round after
 * round, without allocating anything.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define POOL (64u << 20)

static llmcl_offload *engine(uint64_t pool_bytes)
{
    llmcl_offload *off = NULL;
    TH_OK(llmcl_offload_create(th_ctx(), pool_bytes, &off));
    return off;
}

/* Random bytes (NaN and denormal patterns included) uploaded to t's elements. */
static unsigned char *random_bytes(llmcl_tensor *t, uint64_t seed)
{
    const size_t n = (size_t)llmcl_tensor_numel(t) * llmcl_dtype_size(llmcl_tensor_dtype(t));
    unsigned char *h = th_alloc(n);
    th_rng r = th_rng_new(seed);
    for (size_t i = 0; i < n; ++i)
        h[i] = (unsigned char)th_randint(&r, 0, 256);
    TH_OK(llmcl_tensor_upload(t, h, n));
    return h;
}

/* t's elements, row-major, downloaded. */
static unsigned char *contents(const llmcl_tensor *t)
{
    const size_t n = (size_t)llmcl_tensor_numel(t) * llmcl_dtype_size(llmcl_tensor_dtype(t));
    unsigned char *h = th_alloc(n);
    TH_OK(llmcl_tensor_download(t, h, n));
    return h;
}

/* Restores h and checks a contiguous tensor of dtype and shape holding exactly want. */
static void assert_restores_as(llmcl_offload *off, llmcl_offload_handle h, llmcl_dtype dtype,
                               int ndim, const int64_t *shape, const unsigned char *want)
{
    llmcl_tensor *r = NULL;
    TH_OK(llmcl_offload_restore(off, h, &r));
    assert_int_equal(llmcl_tensor_dtype(r), dtype);
    assert_int_equal(llmcl_tensor_ndim(r), ndim);
    for (int d = 0; d < ndim; ++d)
        assert_int_equal(llmcl_tensor_dim(r, d), shape[d]);
    assert_true(llmcl_tensor_is_contiguous(r));
    unsigned char *got = contents(r);
    const size_t n = (size_t)llmcl_tensor_numel(r) * llmcl_dtype_size(llmcl_tensor_dtype(r));
    assert_memory_equal(got, want, n);
    free(got);
    llmcl_tensor_destroy(r);
}

/* The same with like's dtype and shape. */
static void assert_restores(llmcl_offload *off, llmcl_offload_handle h, const llmcl_tensor *like,
                            const unsigned char *want)
{
    int64_t shape[LLMCL_MAX_DIMS];
    for (int d = 0; d < llmcl_tensor_ndim(like); ++d)
        shape[d] = llmcl_tensor_dim(like, d);
    assert_restores_as(off, h, llmcl_tensor_dtype(like), llmcl_tensor_ndim(like), shape, want);
}

static void test_round_trip_every_dtype(void **state)
{
    (void)state;
    llmcl_offload *off = engine(POOL);
    const int64_t shape[] = {3, 1037};
    for (int dt = 0; dt < LLMCL_DTYPE_COUNT; ++dt) {
        llmcl_tensor *t = th_tensor((llmcl_dtype)dt, 2, shape);
        unsigned char *want = random_bytes(t, 10 + (uint64_t)dt);
        llmcl_offload_handle h;
        TH_OK(llmcl_offload_save(off, t, &h));
        llmcl_tensor_destroy(t); /* allowed at once: the engine holds the buffer until the copy */
        assert_restores_as(off, h, (llmcl_dtype)dt, 2, shape, want);
        TH_OK(llmcl_offload_release(off, h));
        free(want);
    }
    llmcl_offload_destroy(off);
}

static void test_strided_views(void **state)
{
    (void)state;
    llmcl_offload *off = engine(POOL);
    const int64_t shape[] = {4, 6, 10};
    /* a transpose, padded rows, a 4-D view with a broadcast (stride 0) axis, a scalar */
    const int64_t t_shape[] = {10, 6}, t_strides[] = {1, 10};
    const int64_t p_shape[] = {4, 6, 7}, p_strides[] = {60, 10, 1};
    const int64_t b_shape[] = {2, 3, 2, 5}, b_strides[] = {60, 0, 20, 2};
    struct {
        int ndim;
        const int64_t *shape, *strides;
        int64_t offset;
    } views[] = {{2, t_shape, t_strides, 3}, {3, p_shape, p_strides, 2}, {4, b_shape, b_strides, 1},
                 {0, NULL, NULL, 17}};
    for (int dt = 0; dt < LLMCL_DTYPE_COUNT; ++dt)
        for (size_t v = 0; v < sizeof views / sizeof views[0]; ++v) {
            llmcl_tensor *base = th_tensor((llmcl_dtype)dt, 3, shape), *view = NULL;
            free(random_bytes(base, 100 + (uint64_t)(dt * 10) + v));
            TH_OK(llmcl_tensor_view(base, views[v].ndim, views[v].shape, views[v].strides,
                                    views[v].offset, &view));
            unsigned char *want = contents(view);
            llmcl_offload_handle h;
            TH_OK(llmcl_offload_save(off, view, &h));
            /* a strided view is packed on the compute queue: overwriting it needs no fence */
            if (llmcl_tensor_is_contiguous(view))
                TH_OK(llmcl_offload_fence(off, h));
            TH_OK(llmcl_fill(th_ctx(), base, 0.0));
            assert_restores(off, h, view, want);
            TH_OK(llmcl_offload_release(off, h));
            free(want);
            llmcl_tensor_destroy(view);
            llmcl_tensor_destroy(base);
        }
    llmcl_offload_destroy(off);
}

static void test_many_in_flight_out_of_order(void **state)
{
    (void)state;
    enum { N = 48 };
    llmcl_offload *off = engine(POOL);
    llmcl_tensor *t[N];
    unsigned char *want[N];
    llmcl_offload_handle h[N];
    uint64_t bytes = 0, pinned = 0;
    for (int i = 0; i < N; ++i) {
        const int64_t shape[] = {1 + i % 5, 97 * (i + 1)};
        t[i] = th_tensor((llmcl_dtype)(i % LLMCL_DTYPE_COUNT), 2, shape);
        want[i] = random_bytes(t[i], 1000 + (uint64_t)i);
        TH_OK(llmcl_offload_save(off, t[i], &h[i]));
        const uint64_t b =
            (uint64_t)llmcl_tensor_numel(t[i]) * llmcl_dtype_size(llmcl_tensor_dtype(t[i]));
        bytes += b;
        pinned += (b + 255) / 256 * 256;
    }
    llmcl_offload_stats s;
    TH_OK(llmcl_offload_finish(off));
    TH_OK(llmcl_offload_stats_get(off, &s));
    assert_int_equal(s.live_handles, N);
    assert_int_equal(s.copies_in_flight, 0);
    assert_int_equal(s.bytes_saved, bytes);
    assert_int_equal(s.bytes_restored, 0);
    assert_int_equal(s.pinned_in_use, pinned);
    assert_int_equal(s.peak_pinned_in_use, pinned);
    /* prefetch a few ahead, restore in a shuffled order, some twice */
    for (int i = 0; i < N; i += 7)
        TH_OK(llmcl_offload_prefetch(off, h[i]));
    th_rng r = th_rng_new(3);
    int order[N];
    for (int i = 0; i < N; ++i)
        order[i] = i;
    for (int i = N - 1; i > 0; --i) {
        const int j = (int)th_randint(&r, 0, i + 1), k = order[i];
        order[i] = order[j];
        order[j] = k;
    }
    for (int i = 0; i < N; ++i) {
        const int k = order[i];
        assert_restores(off, h[k], t[k], want[k]);
        if (k % 3 == 0)
            assert_restores(off, h[k], t[k], want[k]);
        TH_OK(llmcl_offload_release(off, h[k]));
        llmcl_tensor_destroy(t[k]);
        free(want[k]);
    }
    TH_OK(llmcl_offload_finish(off));
    TH_OK(llmcl_offload_stats_get(off, &s));
    assert_int_equal(s.live_handles, 0);
    assert_int_equal(s.pinned_in_use, 0);
    llmcl_offload_destroy(off);
}

/* Kernels write, save, restore, a kernel reads: every step must wait for the one before. */
static void test_ordering_with_kernels(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_offload *off = engine(POOL);
    const int64_t n = 4 << 20; /* 16 MiB of f32: copies long enough to be caught half-done */
    llmcl_tensor *x = th_tensor(LLMCL_F32, 1, &n), *y = th_tensor(LLMCL_F32, 1, &n), *r = NULL;
    float *got = th_alloc((size_t)n * sizeof *got);
    for (int round = 0; round < 3; ++round) {
        TH_OK(llmcl_fill(ctx, x, 3.0));
        TH_OK(llmcl_fill(ctx, y, 1.0 + round));
        TH_OK(llmcl_axpy(ctx, 2.0f, x, y)); /* y = 7 + round, written just before the save */
        llmcl_offload_handle h;
        TH_OK(llmcl_offload_save(off, y, &h));
        TH_OK(llmcl_offload_fence(off, h));
        TH_OK(llmcl_fill(ctx, y, -1.0)); /* after the fence: the copy has read y already */
        TH_OK(llmcl_offload_restore(off, h, &r));
        TH_OK(llmcl_axpy(ctx, 1.0f, x, r)); /* reads r: must wait for the host-to-device copy */
        TH_OK(llmcl_tensor_download(r, got, (size_t)n * sizeof *got));
        for (int64_t i = 0; i < n; ++i)
            if (got[i] != 10.0f + (float)round)
                fail_msg("round %d: element %lld is %g, expected %g", round, (long long)i,
                         (double)got[i], 10.0 + round);
        TH_OK(llmcl_tensor_download(y, got, (size_t)n * sizeof *got));
        assert_true(got[0] == -1.0f && got[n - 1] == -1.0f);
        llmcl_tensor_destroy(r);
        TH_OK(llmcl_offload_release(off, h));
    }
    TH_OK(llmcl_ctx_finish(ctx));
    llmcl_offload_stats s;
    TH_OK(llmcl_offload_stats_get(off, &s));
    assert_int_equal(s.bytes_saved, 3 * (uint64_t)n * 4);
    assert_int_equal(s.bytes_restored, 3 * (uint64_t)n * 4);
    assert_int_equal(s.copies_in_flight, 0);
    assert_true(s.save_ms > 0 && s.restore_ms > 0);
    /* each restore's barrier came before its copy was done: the queue waited. Mesa 22.3's rusticl
       stamps every command 0, 1, 2, 3 ns, so a 16 MiB copy that "took" 1 ns says so. */
    if (s.save_ms > 1e-3)
        assert_true(s.stall_ms > 0);
    else
        print_message("profiling timestamps are not real on this device: stall_ms not checked\n");
    free(got);
    llmcl_tensor_destroy(x);
    llmcl_tensor_destroy(y);
    llmcl_offload_destroy(off);
}

/* Handle h (the which-th) restored into buf: every element is `want`. */
static void expect_handle_holds(llmcl_offload *off, llmcl_offload_handle h, int which,
                                llmcl_tensor *buf, float want)
{
    const int64_t n = llmcl_tensor_numel(buf);
    float *got = th_alloc((size_t)n * sizeof *got);
    TH_OK(llmcl_offload_prefetch_into(off, h, buf));
    TH_OK(llmcl_offload_fence(off, h));
    TH_OK(llmcl_tensor_download(buf, got, (size_t)n * sizeof *got));
    for (int64_t j = 0; j < n; ++j)
        if (got[j] != want)
            fail_msg("handle %d: element %lld is %g, expected %g", which, (long long)j,
                     (double)got[j], (double)want);
    free(got);
}

/* A strided view of buf saved into h is packed first; restore gives it back contiguous. */
static void check_strided_save_into(llmcl_offload *off, llmcl_offload_handle h, llmcl_tensor *buf)
{
    const int64_t vshape[] = {512, 2048}, vstrides[] = {1, 512}, flat = 512 * 2048;
    llmcl_tensor *view = NULL;
    TH_OK(llmcl_tensor_view(buf, 2, vshape, vstrides, 0, &view));
    free(random_bytes(buf, 41));
    unsigned char *want = contents(view);
    TH_OK(llmcl_offload_save_into(off, view, h));
    TH_OK(llmcl_fill(th_ctx(), buf, 0.0)); /* the packed copy is what is read: no fence needed */
    assert_restores_as(off, h, LLMCL_F32, 1, &flat, want);
    free(want);
    llmcl_tensor_destroy(view);
}

/*
 * Six handles of state streamed through two device buffers for three rounds, as an optimizer
 * streams its moments: the next handle comes in while a kernel adds 1 to the current one, which
 * then goes back over its own data. Copies of 4 MiB, long enough to be caught half-done.
 */
static void test_state_streamed_through_a_ring(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_offload *off = engine(POOL);
    enum { HANDLES = 6, ROUNDS = 3 };
    const int64_t n = 1 << 20;
    llmcl_tensor *ring[2] = {th_tensor(LLMCL_F32, 1, &n), th_tensor(LLMCL_F32, 1, &n)};
    llmcl_tensor *one = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_fill(ctx, one, 1.0));
    llmcl_offload_handle h[HANDLES];
    for (int i = 0; i < HANDLES; ++i) { /* handle i starts at 10 i */
        if (i >= 2)
            TH_OK(llmcl_offload_fence(off, h[i - 2])); /* its save has read the buffer */
        TH_OK(llmcl_fill(ctx, ring[i % 2], 10.0 * i));
        TH_OK(llmcl_offload_save(off, ring[i % 2], &h[i]));
    }
    llmcl_offload_stats before;
    llmcl_memory_stats mem_before, mem_after;
    TH_OK(llmcl_offload_stats_get(off, &before));
    TH_OK(llmcl_memory_stats_get(ctx, &mem_before));
    for (int r = 0; r < ROUNDS; ++r) {
        TH_OK(llmcl_offload_prefetch_into(off, h[0], ring[0]));
        for (int i = 0; i < HANDLES; ++i) {
            if (i + 1 < HANDLES) /* into the buffer of i - 1, whose save_into is ahead of it */
                TH_OK(llmcl_offload_prefetch_into(off, h[i + 1], ring[(i + 1) % 2]));
            TH_OK(llmcl_offload_fence(off, h[i]));
            TH_OK(llmcl_axpy(ctx, 1.0f, one, ring[i % 2]));
            TH_OK(llmcl_offload_save_into(off, ring[i % 2], h[i]));
        }
    }
    TH_OK(llmcl_memory_stats_get(ctx, &mem_after));
    assert_int_equal(mem_after.peak_bytes, mem_before.peak_bytes); /* nothing allocated */
    for (int i = 0; i < HANDLES; ++i)
        expect_handle_holds(off, h[i], i, ring[0], 10.0f * i + ROUNDS);
    TH_OK(llmcl_offload_finish(off));
    llmcl_offload_stats s;
    TH_OK(llmcl_offload_stats_get(off, &s));
    const uint64_t bytes = (uint64_t)n * 4, copies = (uint64_t)HANDLES * ROUNDS;
    assert_int_equal(s.bytes_saved - before.bytes_saved, copies * bytes);
    assert_int_equal(s.bytes_restored - before.bytes_restored, (copies + HANDLES) * bytes);
    assert_int_equal(s.pinned_in_use, before.pinned_in_use); /* the same blocks all along */
    assert_int_equal(s.live_handles, HANDLES);
    assert_int_equal(s.copies_in_flight, 0);
    assert_true(s.save_ms >= before.save_ms && s.restore_ms > 0);
    check_strided_save_into(off, h[0], ring[1]);
    for (int i = 0; i < HANDLES; ++i)
        TH_OK(llmcl_offload_release(off, h[i]));
    llmcl_tensor_destroy(one);
    llmcl_tensor_destroy(ring[0]);
    llmcl_tensor_destroy(ring[1]);
    llmcl_offload_destroy(off);
}

static void test_pool_limit(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_offload *off = engine(64 << 10);
    const int64_t n = 6000; /* 24000 bytes, 24064 in the pool */
    llmcl_tensor *t = th_tensor(LLMCL_F32, 1, &n);
    unsigned char *want = random_bytes(t, 7);
    llmcl_offload_handle a, b, c;
    TH_OK(llmcl_offload_save(off, t, &a));
    TH_OK(llmcl_offload_save(off, t, &b));
    TH_FAILS(llmcl_offload_save(off, t, &c), LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    assert_non_null(strstr(llmcl_last_error(ctx), "exhausted"));
    assert_true(c.id == 0);
    llmcl_offload_stats s;
    TH_OK(llmcl_offload_stats_get(off, &s));
    assert_int_equal(s.pinned_bytes, 64 << 10);
    assert_int_equal(s.pinned_in_use, 2 * 24064);
    assert_int_equal(s.live_handles, 2);
    /* releasing one frees its block, even with its copy possibly in flight */
    TH_OK(llmcl_offload_release(off, a));
    TH_OK(llmcl_offload_save(off, t, &c));
    assert_restores(off, b, t, want);
    assert_restores(off, c, t, want);
    const int64_t big = 20000;
    llmcl_tensor *too_big = th_tensor(LLMCL_F32, 1, &big);
    TH_FAILS(llmcl_offload_save(off, too_big, &a), LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    TH_OK(llmcl_offload_release(off, b));
    TH_OK(llmcl_offload_release(off, c));
    TH_OK(llmcl_offload_finish(off));
    TH_OK(llmcl_offload_stats_get(off, &s));
    assert_int_equal(s.pinned_in_use, 0);
    assert_int_equal(s.peak_pinned_in_use, 2 * 24064);
    assert_int_equal(s.live_handles, 0);
    /* the freed blocks merged back into one: the big tensor fits the whole pool now */
    const int64_t fits = 16384;
    llmcl_tensor *whole = th_tensor(LLMCL_F32, 1, &fits);
    TH_OK(llmcl_offload_save(off, whole, &a));
    free(want);
    llmcl_tensor_destroy(whole);
    llmcl_tensor_destroy(too_big);
    llmcl_tensor_destroy(t);
    llmcl_offload_destroy(off); /* with a live handle */
}

static void test_bad_inputs(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_offload *off = engine(1 << 20), *other = engine(1 << 20), *none = NULL;
    const int64_t n = 100, zero = 0;
    llmcl_tensor *t = th_tensor(LLMCL_BF16, 1, &n), *empty = NULL, *r = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &zero, &empty));
    llmcl_offload_handle h, foreign, null_handle = {0};
    llmcl_offload_stats s;
    TH_FAILS(llmcl_offload_create(NULL, 1, &none), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_create(ctx, 0, &none), LLMCL_ERROR_INVALID_ARGUMENT);
    /* a size past any host's memory (an underflowed one, say): its chunk count wrapped to 0 */
    TH_FAILS(llmcl_offload_create(ctx, UINT64_MAX, &none), LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    assert_non_null(strstr(llmcl_last_error(ctx), "this host has"));
    TH_FAILS(llmcl_offload_create(ctx, 1, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_null(none);
    TH_FAILS(llmcl_offload_save(NULL, t, &h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save(off, NULL, &h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save(off, t, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save(off, empty, &h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_restore(off, null_handle, &r), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "zero"));
    TH_OK(llmcl_offload_save(off, t, &h));
    TH_OK(llmcl_offload_save(other, t, &foreign));
    TH_FAILS(llmcl_offload_restore(off, foreign, &r), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "another offload engine"));
    TH_FAILS(llmcl_offload_release(other, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_restore(off, h, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_restore(NULL, h, &r), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch(NULL, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_fence(NULL, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_release(NULL, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_stats_get(off, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_stats_get(NULL, &s), LLMCL_ERROR_INVALID_ARGUMENT);
    /* released, released twice, a stale handle whose slot is in use again */
    TH_OK(llmcl_offload_release(off, h));
    TH_FAILS(llmcl_offload_restore(off, h, &r), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "released"));
    TH_FAILS(llmcl_offload_release(off, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch(off, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_fence(off, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save_into(off, t, h), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch_into(off, h, t), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_finish(NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_offload_finish(off)); /* h's slot is free again: the next save takes it */
    llmcl_offload_handle again;
    TH_OK(llmcl_offload_save(off, t, &again));
    assert_true(again.id != h.id);
    TH_FAILS(llmcl_offload_restore(off, h, &r), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_null(r);
    /* the _into calls: a live handle, and a tensor of its dtype and size (contiguous for dst) */
    const int64_t n2 = 2 * n;
    llmcl_tensor *longer = th_tensor(LLMCL_BF16, 1, &n2), *f32 = th_tensor(LLMCL_F32, 1, &n);
    TH_FAILS(llmcl_offload_save_into(NULL, t, again), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save_into(off, NULL, again), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_save_into(off, longer, again), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_offload_save_into(off, f32, again), LLMCL_ERROR_SHAPE_MISMATCH);
    assert_non_null(strstr(llmcl_last_error(ctx), "dtype and size"));
    TH_FAILS(llmcl_offload_save_into(off, t, foreign), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch_into(NULL, again, t), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch_into(off, again, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_offload_prefetch_into(off, again, f32), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_offload_prefetch_into(off, null_handle, t), LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor *half = NULL;
    const int64_t hshape[] = {n}, hstride[] = {2};
    TH_OK(llmcl_tensor_view(longer, 1, hshape, hstride, 0, &half));
    TH_FAILS(llmcl_offload_prefetch_into(off, again, half), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "contiguous"));
    llmcl_tensor_destroy(half);
    llmcl_tensor_destroy(longer);
    llmcl_tensor_destroy(f32);
    /* a tensor of another context */
    llmcl_ctx *ctx2 = NULL;
    TH_OK(llmcl_ctx_create(&ctx2));
    llmcl_tensor *t2 = NULL;
    TH_OK(llmcl_tensor_create(ctx2, LLMCL_F32, 1, &n, &t2));
    TH_FAILS(llmcl_offload_save(off, t2, &h), LLMCL_ERROR_DEVICE_MISMATCH);
    llmcl_tensor_destroy(t2);
    llmcl_ctx_destroy(ctx2);
    /* the engine still works after every refusal */
    unsigned char *want = random_bytes(t, 9);
    TH_OK(llmcl_offload_save(off, t, &h));
    assert_restores(off, h, t, want);
    free(want);
    llmcl_offload_destroy(off);
    llmcl_offload_destroy(other);
    llmcl_offload_destroy(NULL);
    llmcl_tensor_destroy(t);
    llmcl_tensor_destroy(empty);
}

static void test_destroy_with_copies_in_flight(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_memory_stats before, after;
    TH_OK(llmcl_memory_stats_get(ctx, &before));
    llmcl_offload *off = engine(POOL);
    const int64_t n = 2 << 20, shape[] = {1024, 1024}, strides[] = {1, 2048};
    llmcl_tensor *t = th_tensor(LLMCL_F32, 1, &n), *view = NULL;
    TH_OK(llmcl_tensor_view(t, 2, shape, strides, 0, &view));
    llmcl_offload_handle h[6];
    for (int i = 0; i < 6; ++i) {
        TH_OK(llmcl_fill(ctx, t, i));
        TH_OK(llmcl_offload_save(off, i % 2 ? view : t, &h[i]));
    }
    TH_OK(llmcl_offload_prefetch(off, h[0]));
    TH_OK(llmcl_offload_prefetch(off, h[1]));
    TH_OK(llmcl_offload_release(off, h[1]));
    llmcl_offload_destroy(off); /* saves, a prefetch and a released slot still copying */
    llmcl_tensor_destroy(view);
    llmcl_tensor_destroy(t);
    TH_OK(llmcl_ctx_finish(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &after));
    assert_int_equal(after.current_bytes, before.current_bytes);
}

static void test_host_bandwidth(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    double d2h = 0, h2d = 0;
    TH_OK(llmcl_measure_host_bandwidth(ctx, 8 << 20, &d2h, &h2d));
    assert_true(d2h > 0 && h2d > 0);
    TH_FAILS(llmcl_measure_host_bandwidth(NULL, 8 << 20, &d2h, &h2d), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_measure_host_bandwidth(ctx, 8 << 20, NULL, &h2d), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_measure_host_bandwidth(ctx, 100, &d2h, &h2d), LLMCL_ERROR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_dtype),
        cmocka_unit_test(test_strided_views),
        cmocka_unit_test(test_many_in_flight_out_of_order),
        cmocka_unit_test(test_ordering_with_kernels),
        cmocka_unit_test(test_state_streamed_through_a_ring),
        cmocka_unit_test(test_pool_limit),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_destroy_with_copies_in_flight),
        cmocka_unit_test(test_host_bandwidth),
    };
    return TH_RUN(tests);
}
