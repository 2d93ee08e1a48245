/*
 * test_large.c (suite 'slow'): a bf16 tensor of more than 2^31 elements: fill, copy, axpy and a
 * cast to f16 and back reach its last elements, and strided views at offsets past 2^31 upload and
 * download correctly. Needs three 4 GiB allocations; skipped (exit 77) on devices that allow less,
 * such as PoCL's CPU device (2 GiB).
 */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

#define BIG (((int64_t)1 << 31) + 37)

static void test_beyond_2_pow_31(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = BIG;
    llmcl_tensor *a = NULL, *b = NULL, *tail_a = NULL, *tail_b = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_BF16, 1, &n, &a));
    TH_OK(llmcl_tensor_create(ctx, LLMCL_BF16, 1, &n, &b));
    TH_OK(llmcl_fill(ctx, a, 1.5));
    /* distinct values in the last 64 elements, written through a view past 2^31 */
    const int64_t tail = 64, off = n - tail;
    TH_OK(llmcl_tensor_view(a, 1, &tail, NULL, off, &tail_a));
    TH_OK(llmcl_tensor_view(b, 1, &tail, NULL, off, &tail_b));
    double vals[64], got[64], ref[64];
    for (int i = 0; i < 64; ++i)
        vals[i] = th_round(LLMCL_BF16, 0.25 * i - 3);
    th_upload(tail_a, vals);
    TH_OK(llmcl_copy(ctx, a, b));
    th_download(tail_b, got);
    TH_ASSERT_CLOSE("copy tail", vals, got, 64, (th_tol){0, 0});
    TH_OK(llmcl_axpy(ctx, 2.0f, a, b)); /* b = 3 a */
    th_download(tail_b, got);
    for (int i = 0; i < 64; ++i)
        ref[i] = th_round(LLMCL_BF16, 3 * vals[i]);
    TH_ASSERT_CLOSE("axpy tail", ref, got, 64, (th_tol){0, 0});
    /* a strided view whose elements straddle 2^31 and run into the tail written above */
    llmcl_tensor *sv = NULL;
    const int64_t sn = 16, stride = 8, start = ((int64_t)1 << 31) - 100;
    TH_OK(llmcl_tensor_view(b, 1, &sn, &stride, start, &sv));
    th_download(sv, got);
    for (int64_t i = 0; i < sn; ++i) {
        const int64_t idx = start + i * stride;
        ref[i] = idx >= off ? th_round(LLMCL_BF16, 3 * vals[idx - off]) : 4.5; /* 3 * 1.5 */
    }
    TH_ASSERT_CLOSE("strided view across 2^31", ref, got, (size_t)sn, (th_tol){0, 0});
    llmcl_tensor_destroy(sv);
    /* a (1.5, then the tail) to f16 and back into b: both casts over every element; the values
       are exact in both dtypes */
    llmcl_tensor *h = NULL, *hv = NULL, *bv = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F16, 1, &n, &h));
    TH_OK(llmcl_fill(ctx, b, -7.0));
    TH_OK(llmcl_cast(ctx, a, h));
    TH_OK(llmcl_cast(ctx, h, b));
    TH_OK(llmcl_tensor_view(h, 1, &sn, &stride, start, &hv));
    TH_OK(llmcl_tensor_view(b, 1, &sn, &stride, start, &bv));
    for (int64_t i = 0; i < sn; ++i) {
        const int64_t idx = start + i * stride;
        ref[i] = idx >= off ? vals[idx - off] : 1.5;
    }
    th_download(hv, got);
    TH_ASSERT_CLOSE("cast to f16 across 2^31", ref, got, (size_t)sn, (th_tol){0, 0});
    th_download(bv, got);
    TH_ASSERT_CLOSE("cast back to bf16 across 2^31", ref, got, (size_t)sn, (th_tol){0, 0});
    th_download(tail_b, got);
    TH_ASSERT_CLOSE("cast tail", vals, got, 64, (th_tol){0, 0});
    llmcl_tensor_destroy(hv);
    llmcl_tensor_destroy(bv);
    llmcl_tensor_destroy(h);
    llmcl_tensor_destroy(tail_a);
    llmcl_tensor_destroy(tail_b);
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
}

int main(void)
{
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    if (info->max_alloc_bytes < (uint64_t)BIG * 2 || info->global_mem_bytes < (uint64_t)BIG * 7) {
        fprintf(stderr, "skipping: the device allows %llu-byte allocations of %llu bytes in all\n",
                (unsigned long long)info->max_alloc_bytes, (unsigned long long)info->global_mem_bytes);
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_beyond_2_pow_31)};
    return TH_RUN(tests);
}
