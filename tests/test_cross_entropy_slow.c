/*
 * test_cross_entropy_slow.c (suite 'slow'): 64-bit indexing of the cross-entropy kernels. Views
 * into one bf16 buffer of more than 2^31 elements place a second row past element 2^31 (byte 2^32),
 * for the logits of path 1 (single and split vocabulary) and the hidden rows of path 3. Skipped on
 * devices that cannot allocate 4 GiB in one buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy_ref.h"
#include "harness.h"

#define FAR ((int64_t)1 << 31)

static llmcl_tensor *big_buffer(void)
{
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = FAR + 4096;
    if (llmcl_ctx_device_info(ctx)->max_alloc_bytes < (uint64_t)n * 2)
        return NULL;
    llmcl_tensor *t = NULL;
    return llmcl_tensor_create(ctx, LLMCL_BF16, 1, &n, &t) == LLMCL_OK ? t : NULL;
}

static void test_far_logits(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_tensor *big = big_buffer();
    if (!big)
        skip();
    const int64_t v = 1003, shape[2] = {2, v}, strides[2] = {FAR + 8, 1}, one = 1;
    th_rng rng = th_rng_new(5);
    double x[2 * 1003], g[2 * 1003], rg[2 * 1003], rl, rz, lse[2];
    const int64_t y[2] = {17, 990};
    for (int splits = 0; splits <= 3; splits += 3) {
        th_fill_uniform(&rng, x, 2 * v, -4, 4);
        th_round_all(LLMCL_BF16, x, 2 * v);
        llmcl_tensor *view,
            *ty = th_tensor_from(LLMCL_I64, 1, (const int64_t[]){2}, (const double[]){17, 990});
        TH_OK(llmcl_tensor_view(big, 2, shape, strides, 3, &view));
        th_upload(view, x);
        llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one);
        const llmcl_ce_options o = {.reduction = LLMCL_CE_SUM, .vocab_splits = splits};
        TH_OK(llmcl_cross_entropy_forward(ctx, view, ty, &o, tl, NULL, NULL, view));
        double got;
        th_download(tl, &got);
        th_download(view, g);
        const ref_ce_opts ro = {-100, 1, 0, 0, 0, NULL};
        ref_cross_entropy(x, y, 2, v, &ro, &rl, &rz, lse, rg);
        TH_ASSERT_CLOSE("far loss", &rl, &got, 1, ((th_tol){1e-4, 1e-4}));
        TH_ASSERT_CLOSE("far dlogits", rg, g, (size_t)(2 * v), ((th_tol){1e-2, 1.6e-2}));
        llmcl_tensor_destroy(view), llmcl_tensor_destroy(ty), llmcl_tensor_destroy(tl);
    }
    llmcl_tensor_destroy(big);
}

static void test_far_hidden(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    llmcl_tensor *big = big_buffer();
    if (!big)
        skip();
    const int64_t n = 2, h = 40, v = 77, hshape[2] = {n, h}, strides[2] = {FAR + 8, 1};
    const int64_t wshape[2] = {v, h}, one = 1;
    th_rng rng = th_rng_new(6);
    double hid[80], w[77 * 40], lg[2 * 77], g[2 * 77], lse[2], rl, rz;
    th_fill_uniform(&rng, hid, 80, -1, 1);
    th_fill_uniform(&rng, w, 77 * 40, -1, 1);
    th_round_all(LLMCL_BF16, hid, 80);
    th_round_all(LLMCL_BF16, w, 77 * 40);
    const int64_t y[2] = {5, 70};
    llmcl_tensor *view, *tw = th_tensor_from(LLMCL_BF16, 2, wshape, w);
    llmcl_tensor *ty = th_tensor_from(LLMCL_I64, 1, &n, (const double[]){5, 70});
    TH_OK(llmcl_tensor_view(big, 2, hshape, strides, 1, &view));
    th_upload(view, hid);
    llmcl_tensor *tl = th_tensor(LLMCL_F32, 1, &one), *tlse = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *dh = th_tensor(LLMCL_F32, 2, hshape), *dw = th_tensor(LLMCL_F32, 2, wshape);
    double got, gdh[80], rdh[80], rdw[77 * 40], rdb[77];
    const ref_ce_opts ro = {-100, 0, 0, 0, 0, NULL};
    ref_linear(hid, w, NULL, n, h, v, lg);
    ref_cross_entropy(lg, y, n, v, &ro, &rl, &rz, lse, g);
    ref_linear_backward(g, hid, w, n, h, v, rdh, rdw, rdb);
    /* both fused forms; chunks round the gradient to bf16 for their products */
    for (int form = 0; form < 2; ++form) {
        const llmcl_ce_options o = {.vocab_chunk = form ? 31 : -1};
        TH_OK(llmcl_fused_cross_entropy_forward(ctx, view, tw, NULL, ty, &o, tl, NULL, tlse));
        TH_OK(llmcl_fused_cross_entropy_backward(ctx, view, tw, NULL, ty, tlse, NULL, &o, dh, dw,
                                                 NULL));
        th_download(tl, &got);
        th_download(dh, gdh);
        TH_ASSERT_CLOSE("far fused loss", &rl, &got, 1, ((th_tol){1e-4, 1e-4}));
        const th_tol tol = form ? (th_tol){2e-3, 1e-2} : (th_tol){1e-5, 1e-3};
        TH_ASSERT_CLOSE(form ? "far fused dhidden, chunks" : "far fused dhidden, tiles", rdh, gdh,
                        80, tol);
    }
    llmcl_tensor_destroy(view), llmcl_tensor_destroy(tw), llmcl_tensor_destroy(ty);
    llmcl_tensor_destroy(tl), llmcl_tensor_destroy(tlse), llmcl_tensor_destroy(dh);
    llmcl_tensor_destroy(dw), llmcl_tensor_destroy(big);
}

int main(void)
{
    /* exit 77 (a skip meson reports) where the device cannot hold the buffer past 2^31 elements */
    if (llmcl_ctx_device_info(th_ctx())->max_alloc_bytes < (uint64_t)(FAR + 4096) * 2) {
        fprintf(stderr, "skipping: the device's largest allocation is too small\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_far_logits),
        cmocka_unit_test(test_far_hidden),
    };
    return TH_RUN(tests);
}
