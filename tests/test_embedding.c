/*
 * test_embedding.c: llmcl_embedding_forward / backward against the double reference: every dtype,
 * I32 and I64 ids, strided ids and rows, repeated ids (the backward's owners), odd widths, one id,
 * no ids, more positions than rusticl's loops run (blocks of them there), determinism,
 * out-of-range ids (negative, V, huge; I32 and I64) refused before anything is written, and bad
 * arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedding_ref.h"
#include "harness.h"

static int64_t *random_ids(th_rng *rng, int64_t n, int64_t v)
{
    int64_t *ids = th_alloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int64_t i = 0; i < n; ++i)
        ids[i] = th_randint(rng, 0, v);
    return ids;
}

/* ids as a 1-D tensor of dtype dt with element stride `stride` (a view of a larger buffer). */
static llmcl_tensor *ids_tensor(llmcl_dtype dt, const int64_t *ids, int64_t n, int64_t stride,
                                llmcl_tensor **base)
{
    const int64_t total = n * stride + 1;
    double *vals = th_alloc((size_t)total * sizeof *vals);
    for (int64_t i = 0; i < total; ++i)
        vals[i] = 7; /* between the ids: a valid id that must not be read */
    for (int64_t i = 0; i < n; ++i)
        vals[1 + i * stride] = (double)ids[i];
    *base = th_tensor_from(dt, 1, &total, vals);
    llmcl_tensor *view = NULL;
    TH_OK(llmcl_tensor_view(*base, 1, &n, &stride, 1, &view));
    free(vals);
    return view;
}

typedef struct emb_case {
    llmcl_dtype dt, id_dt;
    int64_t n, v, h, id_stride, row_pad;
} emb_case;

static void run_case(const emb_case *c, uint64_t seed)
{
    llmcl_ctx *ctx = th_ctx();
    th_rng rng = th_rng_new(seed);
    const int64_t n = c->n, v = c->v, h = c->h, rs = h + c->row_pad, nrows = n ? n : 1;
    int64_t *ids = random_ids(&rng, n, v);
    double *w = th_alloc((size_t)(v * h) * sizeof *w), *dout = th_alloc((size_t)(nrows * rs) * 8);
    double *dw0 = th_alloc((size_t)(v * h) * sizeof *dw0);
    th_fill_uniform(&rng, w, (size_t)(v * h), -1, 1);
    th_round_all(c->dt, w, (size_t)(v * h));
    th_fill_uniform(&rng, dout, (size_t)(nrows * rs), -1, 1);
    th_round_all(c->dt, dout, (size_t)(nrows * rs));
    th_fill_uniform(&rng, dw0, (size_t)(v * h), -1, 1);
    th_round_all(LLMCL_F32, dw0, (size_t)(v * h));

    llmcl_tensor *ibase, *tids = ids_tensor(c->id_dt, ids, n, c->id_stride, &ibase);
    const int64_t ws[2] = {v, h}, obase[2] = {nrows, rs}, os[2] = {n, h}, ost[2] = {rs, 1};
    llmcl_tensor *tw = th_tensor_from(c->dt, 2, ws, w);
    llmcl_tensor *outb = th_tensor(c->dt, 2, obase), *out = NULL;
    TH_OK(llmcl_tensor_view(outb, 2, os, ost, 0, &out));
    TH_OK(llmcl_embedding_forward(ctx, tids, tw, out));
    double *ref = th_alloc((size_t)(n * h + 1) * sizeof *ref), *got = th_alloc((size_t)(n * h + 1) * 8);
    embedding_ref_forward(ids, n, w, h, ref);
    th_download(out, got);
    TH_ASSERT_CLOSE("forward", ref, got, (size_t)(n * h), (th_tol){0, 0});

    llmcl_tensor *dob = th_tensor_from(c->dt, 2, obase, dout), *tdo = NULL;
    TH_OK(llmcl_tensor_view(dob, 2, os, ost, 0, &tdo));
    double *dref = th_alloc((size_t)(v * h) * sizeof *dref), *dgot = th_alloc((size_t)(v * h) * 8);
    memcpy(dref, dw0, (size_t)(v * h) * sizeof *dref);
    double *dense = th_alloc((size_t)(n * h + 1) * sizeof *dense);
    for (int64_t i = 0; i < n; ++i)
        memcpy(dense + i * h, dout + i * rs, (size_t)h * sizeof *dense);
    embedding_ref_backward(ids, n, dense, h, dref);
    llmcl_tensor *tdw = th_tensor_from(LLMCL_F32, 2, ws, dw0);
    TH_OK(llmcl_embedding_backward(ctx, tids, tdo, tdw));
    th_download(tdw, dgot);
    /* each row sums about n / v values in f32: 2^-24 a value, and 1e-6 for short rows */
    const double per_row = (double)n / (double)(v ? v : 1), tol = fmax(1e-6, 6e-8 * per_row);
    TH_ASSERT_CLOSE("backward", dref, dgot, (size_t)(v * h), (th_tol){tol, tol});
    /* the same bits again from the same start */
    double *again = th_alloc((size_t)(v * h) * sizeof *again);
    th_upload(tdw, dw0);
    TH_OK(llmcl_embedding_backward(ctx, tids, tdo, tdw));
    th_download(tdw, again);
    assert_memory_equal(dgot, again, (size_t)(v * h) * sizeof *again);

    free(ids), free(w), free(dout), free(dw0), free(ref), free(got), free(dref), free(dgot);
    free(dense), free(again);
    llmcl_tensor_destroy(tids), llmcl_tensor_destroy(ibase), llmcl_tensor_destroy(tw);
    llmcl_tensor_destroy(out), llmcl_tensor_destroy(outb), llmcl_tensor_destroy(tdo);
    llmcl_tensor_destroy(dob), llmcl_tensor_destroy(tdw);
}

static void test_embedding_cases(void **state)
{
    (void)state;
    static const emb_case cases[] = {
        /* dt, id_dt, n, v, h, id_stride, row_pad */
        {LLMCL_F32, LLMCL_I64, 37, 11, 40, 1, 0}, /* ids repeat: owners sum several rows */
        {LLMCL_BF16, LLMCL_I32, 300, 257, 33, 3, 5},
        {LLMCL_F16, LLMCL_I64, 64, 5, 300, 2, 1},
        {LLMCL_F32, LLMCL_I32, 1, 1, 1, 1, 0},
        {LLMCL_BF16, LLMCL_I64, 0, 9, 16, 1, 0},
        {LLMCL_F32, LLMCL_I64, 513, 1000, 7, 1, 0},
        {LLMCL_F32, LLMCL_I64, 3000, 3, 9, 1, 0},   /* ~1000 positions an id: the owner's list */
        {LLMCL_BF16, LLMCL_I32, 4500, 2, 5, 2, 3},  /* more than LIST (2048): the rescan */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        printf("case %zu: %s ids %s, n %lld, V %lld, H %lld\n", i, llmcl_dtype_name(cases[i].dt),
               llmcl_dtype_name(cases[i].id_dt), (long long)cases[i].n, (long long)cases[i].v,
               (long long)cases[i].h);
        run_case(&cases[i], 900 + i);
    }
}

/*
 * More positions than a device that cuts loops short runs in one launch (rusticl: the rescan of
 * an id past LIST positions looped over all 70000 and stopped at 65535), which the launcher then
 * takes in blocks. Elsewhere this is the rescan case above at a size whose owner checks (N^2 / 2
 * id loads) would only slow the suite down.
 */
static void test_embedding_blocks(void **state)
{
    (void)state;
    if (!llmcl_ctx_device_info(th_ctx())->loop_limit) {
        printf("skipped: this device runs loops in full\n");
        return;
    }
    const emb_case c = {LLMCL_F32, LLMCL_I64, 70000, 3, 4, 1, 0};
    run_case(&c, 950);
}

/* A loop limit of 6000 on any device: the backward in blocks of about 1070 positions. */
static void test_embedding_low_limit(void **state)
{
    (void)state;
    th_loop_limit("6000");
    const emb_case cases[] = {
        {LLMCL_F32, LLMCL_I64, 3000, 3, 9, 1, 0},
        {LLMCL_BF16, LLMCL_I32, 4500, 2, 5, 2, 3},
        {LLMCL_F16, LLMCL_I64, 2500, 700, 33, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_case(&cases[i], 960 + i);
    th_loop_limit(NULL);
}

/*
 * An id out of range fails naming it, and neither out nor dweight changes: negative ids, V and huge
 * ids, as I32 and I64 (rusticl once let negative I32 ids through, read the row before the table
 * and wrote the one before dweight).
 */
static void test_embedding_bad_ids(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 20, v = 6, h = 8, ws[2] = {v, h}, os[2] = {n, h};
    const double bads[] = {-1, -5, 6, 1000000, 2147483647.0, -2147483648.0, 1099511627776.0,
                           -1099511627776.0};
    const llmcl_dtype id_dts[2] = {LLMCL_I32, LLMCL_I64};
    for (int d = 0; d < 2; ++d)
        for (size_t b = 0; b < sizeof bads / sizeof bads[0]; ++b) {
            if (id_dts[d] == LLMCL_I32 && fabs(bads[b]) > 2147483648.0)
                continue;
            double ids[20], w[48], before[160], after[160];
            for (int i = 0; i < n; ++i)
                ids[i] = i % v;
            ids[13] = bads[b];
            ids[17] = -5;
            for (int i = 0; i < v * h; ++i)
                w[i] = i * 0.25;
            llmcl_tensor *tids = th_tensor_from(id_dts[d], 1, &n, ids);
            llmcl_tensor *tw = th_tensor_from(LLMCL_F32, 2, ws, w);
            llmcl_tensor *out = th_tensor(LLMCL_F32, 2, os);
            llmcl_tensor *tdw = th_tensor_from(LLMCL_F32, 2, ws, w);
            th_download(out, before);
            TH_FAILS(llmcl_embedding_forward(ctx, tids, tw, out), LLMCL_ERROR_INVALID_ARGUMENT);
            assert_non_null(strstr(llmcl_last_error(ctx), "ids[13]"));
            th_download(out, after);
            assert_memory_equal(before, after, sizeof before); /* still the poison: NaN bits */
            TH_FAILS(llmcl_embedding_backward(ctx, tids, out, tdw), LLMCL_ERROR_INVALID_ARGUMENT);
            double dw[48];
            th_download(tdw, dw);
            assert_memory_equal(dw, w, sizeof dw);
            llmcl_tensor_destroy(tids), llmcl_tensor_destroy(tw), llmcl_tensor_destroy(out);
            llmcl_tensor_destroy(tdw);
        }
}

/*
 * The case: i32 ids {1, 2, -1, 4, 0, 5} into an [11, 8] table, with dweight a view after
 * a guard row that must stay intact.
 */
static void test_embedding_negative_i32(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 6, v = 11, h = 8, ws[2] = {v, h}, os[2] = {n, h}, all = (v + 1) * h;
    const double ids[6] = {1, 2, -1, 4, 0, 5};
    double w[88], g[96], dout[48], got[96];
    for (int i = 0; i < v * h; ++i)
        w[i] = i;
    for (int i = 0; i < all; ++i)
        g[i] = -i;
    for (int i = 0; i < n * h; ++i)
        dout[i] = 1;
    llmcl_tensor *tids = th_tensor_from(LLMCL_I32, 1, &n, ids);
    llmcl_tensor *tw = th_tensor_from(LLMCL_F32, 2, ws, w), *out = th_tensor(LLMCL_F32, 2, os);
    llmcl_tensor *tdo = th_tensor_from(LLMCL_F32, 2, os, dout);
    llmcl_tensor *guarded = th_tensor_from(LLMCL_F32, 1, &all, g), *tdw = NULL;
    const int64_t st[2] = {h, 1};
    TH_OK(llmcl_tensor_view(guarded, 2, ws, st, h, &tdw));
    TH_FAILS(llmcl_embedding_forward(ctx, tids, tw, out), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "ids[2] = -1"));
    TH_FAILS(llmcl_embedding_backward(ctx, tids, tdo, tdw), LLMCL_ERROR_INVALID_ARGUMENT);
    th_download(guarded, got);
    assert_memory_equal(got, g, sizeof got);
    llmcl_tensor_destroy(tids), llmcl_tensor_destroy(tw), llmcl_tensor_destroy(out);
    llmcl_tensor_destroy(tdo), llmcl_tensor_destroy(tdw), llmcl_tensor_destroy(guarded);
}

static void test_embedding_bad_args(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 4, v = 5, h = 8, ws[2] = {v, h}, os[2] = {n, h}, bad_os[2] = {n, h + 1};
    const double ids[4] = {0, 1, 2, 3};
    llmcl_tensor *tids = th_tensor_from(LLMCL_I32, 1, &n, ids);
    llmcl_tensor *fids = th_tensor(LLMCL_F32, 1, &n);
    llmcl_tensor *tw = th_tensor(LLMCL_F32, 2, ws), *wb = th_tensor(LLMCL_BF16, 2, ws);
    llmcl_tensor *out = th_tensor(LLMCL_F32, 2, os), *wide = th_tensor(LLMCL_F32, 2, bad_os);
    llmcl_tensor *outb = th_tensor(LLMCL_BF16, 2, os), *dwb = th_tensor(LLMCL_BF16, 2, ws);
    TH_FAILS(llmcl_embedding_forward(NULL, tids, tw, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_embedding_forward(ctx, NULL, tw, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_embedding_forward(ctx, fids, tw, out), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_embedding_forward(ctx, tids, wb, out), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_embedding_forward(ctx, tids, tw, wide), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_embedding_forward(ctx, tids, tw, tw), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_embedding_backward(ctx, tids, out, dwb), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    TH_FAILS(llmcl_embedding_backward(ctx, tids, wide, tw), LLMCL_ERROR_SHAPE_MISMATCH);
    TH_FAILS(llmcl_embedding_backward(ctx, tids, NULL, tw), LLMCL_ERROR_INVALID_ARGUMENT);
    /* a 2-D view of ids that is not contiguous cannot flatten */
    llmcl_tensor *ids2 = NULL;
    const int64_t s2[2] = {2, 2}, st2[2] = {1, 2};
    TH_OK(llmcl_tensor_view(tids, 2, s2, st2, 0, &ids2));
    TH_FAILS(llmcl_embedding_forward(ctx, ids2, tw, out), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_embedding_forward(ctx, tids, wb, outb));
    llmcl_tensor_destroy(tids), llmcl_tensor_destroy(fids), llmcl_tensor_destroy(tw);
    llmcl_tensor_destroy(wb), llmcl_tensor_destroy(out), llmcl_tensor_destroy(wide);
    llmcl_tensor_destroy(outb), llmcl_tensor_destroy(dwb), llmcl_tensor_destroy(ids2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_cases),
        cmocka_unit_test(test_embedding_blocks),
        cmocka_unit_test(test_embedding_low_limit),
        cmocka_unit_test(test_embedding_bad_ids),
        cmocka_unit_test(test_embedding_negative_i32),
        cmocka_unit_test(test_embedding_bad_args),
    };
    return TH_RUN(tests);
}
