/*
 * test_tensor.c: tensor creation, wraps and views, strided upload and download, accessors, memory
 * accounting (current, peak, limits, out-of-memory), profiling regions, and every bad argument.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void test_create_and_accessors(void **state)
{
    (void)state;
    const int64_t shape[] = {2, 3, 5, 7};
    llmcl_tensor *t = th_tensor(LLMCL_BF16, 4, shape);
    assert_int_equal(llmcl_tensor_dtype(t), LLMCL_BF16);
    assert_int_equal(llmcl_tensor_ndim(t), 4);
    assert_int_equal(llmcl_tensor_numel(t), 210);
    assert_int_equal(llmcl_tensor_dim(t, 2), 5);
    assert_int_equal(llmcl_tensor_dim(t, 4), -1);
    assert_int_equal(llmcl_tensor_stride(t, 0), 105);
    assert_int_equal(llmcl_tensor_stride(t, 3), 1);
    assert_int_equal(llmcl_tensor_offset(t), 0);
    assert_true(llmcl_tensor_is_contiguous(t));
    assert_ptr_equal(llmcl_tensor_ctx(t), th_ctx());
    assert_non_null(llmcl_tensor_cl_mem(t));
    llmcl_tensor_destroy(t);
    llmcl_tensor_destroy(NULL);
    llmcl_ctx_destroy(NULL);
    llmcl_tensor *s = NULL;
    TH_OK(llmcl_tensor_create(th_ctx(), LLMCL_F32, 0, NULL, &s)); /* a scalar */
    assert_int_equal(llmcl_tensor_numel(s), 1);
    llmcl_tensor_destroy(s);
    assert_int_equal(llmcl_dtype_size(LLMCL_I64), 8);
    assert_int_equal(llmcl_dtype_size(LLMCL_DTYPE_COUNT), 0);
    assert_string_equal(llmcl_dtype_name(LLMCL_BF16), "bf16");
}

static void test_upload_download_every_dtype(void **state)
{
    (void)state;
    const int64_t shape[] = {3, 37};
    th_rng r = th_rng_new(5);
    double x[111], got[111];
    for (int dt = 0; dt < LLMCL_DTYPE_COUNT; ++dt) {
        for (int i = 0; i < 111; ++i)
            x[i] = th_round((llmcl_dtype)dt, th_uniform(&r, -1000, 1000));
        llmcl_tensor *t = th_tensor_from((llmcl_dtype)dt, 2, shape, x);
        th_download(t, got);
        TH_ASSERT_CLOSE("round trip", x, got, 111, (th_tol){0, 0});
        llmcl_tensor_destroy(t);
    }
}

static void test_views_and_strides(void **state)
{
    (void)state;
    /* a transposed view of a 4x6 matrix: shape [6, 4], strides [1, 6] */
    const int64_t shape[] = {4, 6}, tshape[] = {6, 4}, tstrides[] = {1, 6};
    double x[24], got[24], ref[24];
    for (int i = 0; i < 24; ++i)
        x[i] = i + 1;
    llmcl_tensor *t = th_tensor_from(LLMCL_F32, 2, shape, x), *v = NULL;
    TH_OK(llmcl_tensor_view(t, 2, tshape, tstrides, 0, &v));
    assert_false(llmcl_tensor_is_contiguous(v));
    th_download(v, got);
    for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 4; ++j)
            ref[i * 4 + j] = x[j * 6 + i];
    TH_ASSERT_CLOSE("transposed download", ref, got, 24, (th_tol){0, 0});
    /* upload through the view writes the transposed positions */
    for (int i = 0; i < 24; ++i)
        got[i] = -(double)i;
    th_upload(v, got);
    th_download(t, x);
    for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 4; ++j)
            assert_true(x[j * 6 + i] == -(double)(i * 4 + j));
    llmcl_tensor_destroy(t); /* the view keeps the buffer alive */
    th_download(v, got);
    assert_true(got[5] == -5.0);
    llmcl_tensor_destroy(v);
}

static void test_bad_layouts(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_tensor *t = NULL;
    const int64_t neg[] = {2, -1}, ok[] = {4, 4}, huge[] = {INT64_MAX / 4, 8};
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 2, neg, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 5, ok, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_create(ctx, (llmcl_dtype)17, 2, ok, &t), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 2, huge, &t), LLMCL_ERROR_OVERFLOW);
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 2, NULL, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 2, ok, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_int_equal(llmcl_tensor_create(NULL, LLMCL_F32, 2, ok, &t), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_null(t);

    llmcl_tensor *base = th_tensor(LLMCL_F32, 2, ok), *v = NULL;
    const int64_t big[] = {5, 4}, strides[] = {4, 1}, negs[] = {-4, 1};
    TH_FAILS(llmcl_tensor_view(base, 2, big, strides, 0, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_view(base, 2, ok, strides, 1, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_view(base, 2, ok, negs, 12, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_view(base, 2, ok, strides, -1, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tensor_wrap(ctx, NULL, LLMCL_F32, 2, ok, NULL, 0, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    /* a wrap past the end of the application's buffer */
    cl_int err;
    cl_mem small = clCreateBuffer(llmcl_ctx_cl_context(ctx), CL_MEM_READ_WRITE, 60, NULL, &err);
    TH_FAILS(llmcl_tensor_wrap(ctx, small, LLMCL_F32, 2, ok, NULL, 0, &v), LLMCL_ERROR_INVALID_ARGUMENT);
    clReleaseMemObject(small);

    float host[16];
    TH_FAILS(llmcl_tensor_upload(base, host, 60), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_tensor_download(base, host, 68), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_tensor_upload(base, NULL, 64), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_int_equal(llmcl_tensor_upload(NULL, host, 64), LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor_destroy(base);
}

static void test_memory_accounting(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_memory_stats m0, m;
    TH_OK(llmcl_memory_stats_get(ctx, &m0));
    TH_OK(llmcl_memory_reset_peak(ctx));
    const int64_t a_shape[] = {1000}, b_shape[] = {3000};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 1, a_shape), *b = th_tensor(LLMCL_BF16, 1, b_shape);
    TH_OK(llmcl_memory_stats_get(ctx, &m));
    assert_int_equal(m.current_bytes - m0.current_bytes, 4000 + 6000);
    llmcl_tensor_destroy(b);
    TH_OK(llmcl_memory_stats_get(ctx, &m));
    assert_int_equal(m.current_bytes - m0.current_bytes, 4000);
    assert_int_equal(m.peak_bytes - m0.current_bytes, 10000);
    TH_OK(llmcl_memory_reset_peak(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &m));
    assert_int_equal(m.peak_bytes, m.current_bytes);
    /* views and wraps do not count */
    llmcl_tensor *v = NULL;
    TH_OK(llmcl_tensor_view(a, 1, a_shape, NULL, 0, &v));
    llmcl_memory_stats mv;
    TH_OK(llmcl_memory_stats_get(ctx, &mv));
    assert_int_equal(mv.current_bytes, m.current_bytes);
    llmcl_tensor_destroy(v);

    /* a cap: the allocation past it fails as out of memory and nothing is held */
    TH_OK(llmcl_memory_set_limit(ctx, m.current_bytes + 8000));
    llmcl_tensor *c = NULL;
    const int64_t c_shape[] = {2001};
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 1, c_shape, &c), LLMCL_ERROR_OUT_OF_DEVICE_MEMORY);
    assert_null(c);
    TH_OK(llmcl_memory_stats_get(ctx, &mv));
    assert_int_equal(mv.current_bytes, m.current_bytes);
    const int64_t d_shape[] = {2000};
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, d_shape, &c));
    llmcl_tensor_destroy(c);
    TH_OK(llmcl_memory_set_limit(ctx, 0));

    /* more than the device's largest allocation */
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    const int64_t e_shape[] = {(int64_t)(info->max_alloc_bytes / 4) + 1024};
    TH_FAILS(llmcl_tensor_create(ctx, LLMCL_F32, 1, e_shape, &c), LLMCL_ERROR_OUT_OF_DEVICE_MEMORY);
    llmcl_tensor_destroy(a);
    TH_OK(llmcl_memory_stats_get(ctx, &m));
    assert_int_equal(m.current_bytes, m0.current_bytes);
}

/* An op's scratch buffer is kept for the next op of its size, counted as cached, not in use. */
static void test_scratch_cache(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_memory_release_cached(ctx));
    llmcl_memory_stats m0, m1, m2;
    TH_OK(llmcl_memory_stats_get(ctx, &m0));
    assert_int_equal(m0.cached_bytes, 0);
    TH_OK(llmcl_memory_reset_peak(ctx));
    const int64_t as[2] = {7, 300}, bs[2] = {300, 5}, cs[2] = {7, 5};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 2, as), *b = th_tensor(LLMCL_F32, 2, bs),
                 *c = th_tensor(LLMCL_F32, 2, cs);
    TH_OK(llmcl_fill(ctx, a, 0.5));
    TH_OK(llmcl_fill(ctx, b, 2.0));
    const llmcl_matmul_opts split = {.split_k = 3}; /* three f32 slices of c in a scratch */
    const uint64_t slices = 3 * 7 * 5 * 4, tensors = (7 * 300 + 300 * 5 + 7 * 5) * 4;
    TH_OK(llmcl_matmul(ctx, 1.0f, a, b, 0.0f, c, &split));
    TH_OK(llmcl_memory_stats_get(ctx, &m1));
    assert_int_equal(m1.current_bytes - m0.current_bytes, tensors);
    assert_int_equal(m1.cached_bytes, slices);
    assert_int_equal(m1.peak_reserved_bytes - m0.current_bytes, tensors + slices);
    /* the second product takes the cached buffer: nothing new is allocated */
    TH_OK(llmcl_matmul(ctx, 1.0f, a, b, 0.0f, c, &split));
    TH_OK(llmcl_memory_stats_get(ctx, &m2));
    assert_int_equal(m2.cached_bytes, slices);
    assert_int_equal(m2.peak_reserved_bytes, m1.peak_reserved_bytes);
    double got[35];
    th_download(c, got);
    for (int i = 0; i < 35; ++i)
        assert_true(got[i] == 300.0);
    /* a cap empties the cache; so does the call */
    TH_OK(llmcl_memory_set_limit(ctx, m2.current_bytes + slices));
    TH_OK(llmcl_memory_stats_get(ctx, &m2));
    assert_int_equal(m2.cached_bytes, 0);
    TH_OK(llmcl_matmul(ctx, 1.0f, a, b, 0.0f, c, &split));
    TH_OK(llmcl_memory_set_limit(ctx, 0));
    TH_OK(llmcl_memory_release_cached(ctx));
    TH_OK(llmcl_memory_stats_get(ctx, &m2));
    assert_int_equal(m2.cached_bytes, 0);
    llmcl_tensor_destroy(a), llmcl_tensor_destroy(b), llmcl_tensor_destroy(c);
    TH_OK(llmcl_memory_stats_get(ctx, &m2));
    assert_int_equal(m2.current_bytes, m0.current_bytes);
}

static void test_profiling(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_profile p;
    TH_FAILS(llmcl_profile_end(ctx, &p), LLMCL_ERROR_INVALID_ARGUMENT);
    const int64_t shape[] = {100000};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 1, shape), *b = th_tensor(LLMCL_F32, 1, shape);
    TH_OK(llmcl_profile_begin(ctx));
    TH_OK(llmcl_fill(ctx, a, 1.0));
    TH_OK(llmcl_copy(ctx, a, b));
    TH_OK(llmcl_axpy(ctx, 2.0f, a, b));
    TH_OK(llmcl_profile_end(ctx, &p));
    assert_int_equal(p.launches, 3);
    assert_true(p.kernel_ms >= 0 && p.span_ms >= 0);
    /* Mesa 22's rusticl reports near-zero event times (docs/PORTABILITY.md) */
    if (llmcl_ctx_device_info(ctx)->vendor_id != LLMCL_VENDOR_MESA)
        assert_true(p.kernel_ms > 0 && p.span_ms >= p.kernel_ms * 0.5);
    TH_OK(llmcl_profile_begin(ctx));
    TH_OK(llmcl_profile_end(ctx, &p));
    assert_int_equal(p.launches, 0);
    assert_true(p.kernel_ms == 0);
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
}

static void test_ceilings(void **state)
{
    (void)state;
    double gbs = 0, tflops = 0;
    TH_OK(llmcl_measure_copy_bandwidth(th_ctx(), 8 << 20, &gbs));
    assert_true(gbs > 0.1);
    TH_OK(llmcl_measure_fma_rate(th_ctx(), &tflops));
    assert_true(tflops > 1e-3);
    TH_FAILS(llmcl_measure_copy_bandwidth(th_ctx(), 16, &gbs), LLMCL_ERROR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_accessors),
        cmocka_unit_test(test_upload_download_every_dtype),
        cmocka_unit_test(test_views_and_strides),
        cmocka_unit_test(test_bad_layouts),
        cmocka_unit_test(test_memory_accounting),
        cmocka_unit_test(test_scratch_cache),
        cmocka_unit_test(test_profiling),
        cmocka_unit_test(test_ceilings),
    };
    return TH_RUN(tests);
}
