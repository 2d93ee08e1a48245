/*
 * test_safetensors.c: safetensors files. The committed fixture (written as Hugging Face's writer
 * lays files out, tests/data/make_safetensors_fixture.py) reads correctly; llmcl's writer produces
 * the reference writer's bytes exactly; host and device tensors of every dtype round-trip
 * bit-exact, with metadata, scalars and zero-size dimensions; loads convert among f32, bf16 and
 * f16; and every malformed file and bad argument fails with its status and a message naming the
 * problem.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static char tmp_dir[256];

/* A path inside this run's temporary folder. */
static const char *tmp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    return path;
}

/* Asserts a reader or writer call succeeded; their errors are in llmcl_last_error(NULL). */
#define ST_OK(expr)                                                                               \
    do {                                                                                          \
        llmcl_status st_s = (expr);                                                               \
        if (st_s != LLMCL_OK)                                                                     \
            fail_msg("%s: %s", #expr, llmcl_last_error(NULL));                                   \
    } while (0)

/* Asserts got == expected and that the message (ctx's, or the thread's) contains each part. */
static void expect_error(llmcl_status got, llmcl_status expected, const llmcl_ctx *ctx,
                         const char *part1, const char *part2)
{
    const char *msg = llmcl_last_error(ctx);
    if (got != expected)
        fail_msg("returned %s, expected %s; message: %s", llmcl_status_str(got),
                 llmcl_status_str(expected), msg);
    if (part1 && !strstr(msg, part1))
        fail_msg("message lacks \"%s\": %s", part1, msg);
    if (part2 && !strstr(msg, part2))
        fail_msg("message lacks \"%s\": %s", part2, msg);
}

static unsigned char *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = th_alloc(*len + 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void write_whole(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
}

/* A file: the length (n, or the header's own when n < 0), the header, data_len bytes of data. */
static void make_file(const char *path, const char *header, int64_t n, size_t data_len)
{
    const size_t hlen = strlen(header), len = 8 + hlen + data_len;
    unsigned char *buf = th_alloc(len);
    const uint64_t declared = n < 0 ? (uint64_t)hlen : (uint64_t)n;
    for (int i = 0; i < 8; ++i)
        buf[i] = (unsigned char)(declared >> (8 * i));
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; ++i)
        buf[8 + hlen + i] = (unsigned char)(i * 7 + 1);
    write_whole(path, buf, len);
    free(buf);
}

/* The reference writer's bytes: length, header padded with spaces to 8 bytes, data. */
static void expect_reference_bytes(const char *path, const char *header, const void *data,
                                   size_t data_len)
{
    const size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    size_t len;
    unsigned char *got = read_whole(path, &len);
    assert_int_equal(len, 8 + padded + data_len);
    for (int i = 0; i < 8; ++i)
        assert_int_equal(got[i], (unsigned char)((uint64_t)padded >> (8 * i)));
    got[8 + padded] = '\0';
    char *want = th_alloc(padded + 1);
    memcpy(want, header, hlen);
    memset(want + hlen, ' ', padded - hlen);
    assert_string_equal((char *)got + 8, want);
    if (data_len)
        assert_memory_equal(got + 8 + padded, data, data_len);
    free(want);
    free(got);
}

static void random_bytes(th_rng *r, void *p, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        ((unsigned char *)p)[i] = (unsigned char)th_randint(r, 0, 256);
}

/* ---- the committed fixtures ---- */

/*
 * One fixture file: fixture.safetensors comes from the standard-library writer in
 * make_safetensors_fixture.py, fixture_torch.safetensors from Hugging Face's own
 * safetensors.torch.save_file (the same script with --torch, run where PyTorch exists).
 */
static void check_fixture(const char *file)
{
    char path[1024];
    const char *dir = getenv("LLMCL_TEST_DATA_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    printf("%s\n", file);
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));
    const char *order[] = {"step", "empty", "model.norm.weight", "model.embed.weight",
                           "lm_head.bias", "mask"};
    assert_int_equal(llmcl_safetensors_count(st), 6);
    for (int i = 0; i < 6; ++i)
        assert_string_equal(llmcl_safetensors_name(st, i), order[i]);
    assert_null(llmcl_safetensors_name(st, 6));
    assert_null(llmcl_safetensors_name(st, -1));
    assert_string_equal(llmcl_safetensors_metadata(st, "format"), "pt");
    assert_null(llmcl_safetensors_metadata(st, "absent"));

    llmcl_safetensors_info info;
    ST_OK(llmcl_safetensors_find(st, "model.norm.weight", &info));
    const float norm[4] = {1.0f, 0.1f, -3.5f, 1e-3f};
    assert_int_equal(info.dtype, LLMCL_F32);
    assert_int_equal(info.ndim, 1);
    assert_int_equal(info.shape[0], 4);
    assert_int_equal(info.bytes, 16);
    assert_memory_equal(info.data, norm, 16);

    ST_OK(llmcl_safetensors_find(st, "lm_head.bias", &info));
    const uint16_t *h = info.data;
    assert_string_equal(info.dtype_name, "F16");
    assert_true(llmcl_f16_to_f32(h[0]) == 0.5f && llmcl_f16_to_f32(h[1]) == -1.5f &&
                llmcl_f16_to_f32(h[2]) == 65504.0f);

    ST_OK(llmcl_safetensors_find(st, "step", &info));
    int64_t step;
    memcpy(&step, info.data, 8);
    assert_int_equal(info.ndim, 0);
    assert_int_equal(step, 42);

    ST_OK(llmcl_safetensors_find(st, "empty", &info));
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[0], 0);
    assert_int_equal(info.bytes, 0);

    ST_OK(llmcl_safetensors_find(st, "mask", &info));
    const unsigned char mask[5] = {0, 1, 2, 3, 255};
    assert_int_equal(info.dtype, LLMCL_DTYPE_COUNT);
    assert_string_equal(info.dtype_name, "U8");
    assert_memory_equal(info.data, mask, 5);

    /* the bf16 weight into a bf16 and an f32 tensor */
    const double embed[6] = {1.0, -2.0, 0.5, 3.25, -0.125, 100.0};
    const int64_t shape[2] = {2, 3};
    double got[6];
    for (int dt = LLMCL_F32; dt <= LLMCL_BF16; ++dt) {
        llmcl_tensor *t = th_tensor((llmcl_dtype)dt, 2, shape);
        TH_OK(llmcl_safetensors_load(th_ctx(), st, "model.embed.weight", t));
        th_download(t, got);
        TH_ASSERT_CLOSE("fixture bf16 weight", embed, got, 6, (th_tol){0, 0});
        llmcl_tensor_destroy(t);
    }
    llmcl_tensor *u8 = th_tensor(LLMCL_I32, 1, (int64_t[]){5});
    expect_error(llmcl_safetensors_load(th_ctx(), st, "mask", u8), LLMCL_ERROR_UNSUPPORTED_DTYPE,
                 th_ctx(), "'mask' is U8", NULL);
    llmcl_tensor_destroy(u8);
    llmcl_safetensors_close(st);
}

static void test_fixture(void **state)
{
    (void)state;
    check_fixture("fixture.safetensors");
    check_fixture("fixture_torch.safetensors");
}

/* ---- llmcl's writer against bytes laid out as the reference writer lays them out ---- */

static void test_reference_layout(void **state)
{
    (void)state;
    const char *path = tmp_path("ref.safetensors");
    llmcl_safetensors_writer *w = NULL;

    /* one f32 tensor: the header is 64 bytes, so no padding */
    const float attn[6] = {0, 1, 2, 3, 4, 5};
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "attn.0", LLMCL_F32, 3, (int64_t[]){1, 2, 3}, attn));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    expect_reference_bytes(path, "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],"
                                 "\"data_offsets\":[0,24]}}", attn, sizeof attn);

    /* no tensors, with and without metadata */
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    expect_reference_bytes(path, "{}", NULL, 0);
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_metadata(w, "framework", "pt"));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    expect_reference_bytes(path, "{\"__metadata__\":{\"framework\":\"pt\"}}", NULL, 0);

    /* every llmcl dtype, added out of order: falling alignment, then name */
    const uint16_t f16[2] = {0x3c00, 0xc000}, bf16[2] = {0x3f80, 0x4000};
    const float f32 = 1.5f;
    const int32_t i32 = -7;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "b", LLMCL_F16, 1, (int64_t[]){2}, f16));
    ST_OK(llmcl_safetensors_writer_add_host(w, "a", LLMCL_BF16, 2, (int64_t[]){1, 2}, bf16));
    ST_OK(llmcl_safetensors_writer_add_host(w, "c", LLMCL_F32, 0, NULL, &f32));
    ST_OK(llmcl_safetensors_writer_add_host(w, "z", LLMCL_I32, 1, (int64_t[]){1}, &i32));
    ST_OK(llmcl_safetensors_writer_add_host(w, "w", LLMCL_I64, 1, (int64_t[]){0}, NULL));
    ST_OK(llmcl_safetensors_writer_add_host(w, "A", LLMCL_F32, 2, (int64_t[]){0, 3}, NULL));
    ST_OK(llmcl_safetensors_writer_metadata(w, "format", "pt"));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    unsigned char data[16];
    memcpy(data, &f32, 4);
    memcpy(data + 4, &i32, 4);
    memcpy(data + 8, bf16, 4);
    memcpy(data + 12, f16, 4);
    expect_reference_bytes(path,
                           "{\"__metadata__\":{\"format\":\"pt\"},"
                           "\"w\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[0,0]},"
                           "\"A\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                           "\"c\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                           "\"z\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                           "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]},"
                           "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[12,16]}}",
                           data, sizeof data);
    assert_int_equal(th_files_starting(tmp_dir, "ref.safetensors.tmp"), 0);
}

/* ---- round trips ---- */

typedef struct host_case {
    const char *name;
    llmcl_dtype dtype;
    int ndim;
    int64_t shape[4];
} host_case;

static void test_round_trip_host(void **state)
{
    (void)state;
    const host_case cases[] = {
        {"w.f32", LLMCL_F32, 3, {3, 5, 7}}, {"w.bf16", LLMCL_BF16, 2, {11, 13}},
        {"w.f16", LLMCL_F16, 1, {29}},      {"ids", LLMCL_I32, 2, {2, 9}},
        {"pos", LLMCL_I64, 1, {5}},         {"scalar", LLMCL_F32, 0, {0}},
        {"none", LLMCL_BF16, 2, {0, 4}},    {"none2", LLMCL_F16, 3, {4, 0, 2}},
        {"\xc3\xa9t\xc3\xa9", LLMCL_F16, 1, {3}}, /* "été": a UTF-8 name */
    };
    enum { N = sizeof cases / sizeof cases[0] };
    void *data[N];
    size_t bytes[N];
    th_rng r = th_rng_new(18);
    const char *path = tmp_path("host.safetensors");
    llmcl_safetensors_writer *w = NULL;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    for (int i = 0; i < N; ++i) {
        bytes[i] = llmcl_dtype_size(cases[i].dtype);
        for (int d = 0; d < cases[i].ndim; ++d)
            bytes[i] *= (size_t)cases[i].shape[d];
        data[i] = th_alloc(bytes[i] + 1);
        random_bytes(&r, data[i], bytes[i]); /* any bits, NaN patterns included */
        ST_OK(llmcl_safetensors_writer_add_host(w, cases[i].name, cases[i].dtype, cases[i].ndim,
                                                cases[i].shape, data[i]));
    }
    ST_OK(llmcl_safetensors_writer_metadata(w, "format", "pt"));
    ST_OK(llmcl_safetensors_writer_metadata(w, "note", "h\xc3\xa9llo \"quoted\"\n"));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);

    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));
    assert_int_equal(llmcl_safetensors_count(st), N);
    assert_string_equal(llmcl_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(llmcl_safetensors_metadata(st, "note"), "h\xc3\xa9llo \"quoted\"\n");
    for (int i = 0; i < N; ++i) {
        llmcl_safetensors_info info;
        ST_OK(llmcl_safetensors_find(st, cases[i].name, &info));
        assert_int_equal(info.dtype, cases[i].dtype);
        assert_int_equal(info.ndim, cases[i].ndim);
        for (int d = 0; d < cases[i].ndim; ++d)
            assert_int_equal(info.shape[d], cases[i].shape[d]);
        assert_int_equal(info.bytes, bytes[i]);
        if (bytes[i]) {
            assert_memory_equal(info.data, data[i], bytes[i]);
            /* the reference layout keeps every tensor aligned to its element size */
            assert_int_equal((uintptr_t)info.data % llmcl_dtype_size(info.dtype), 0);
        }
        free(data[i]);
    }
    llmcl_safetensors_close(st);
}

/* Device tensors of random bits (contiguous and a transposed view) out and back in, bit-exact. */
static void test_round_trip_device(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t shape[2] = {37, 129}, tshape[2] = {129, 37}, tstrides[2] = {1, 129};
    const size_t n = 37 * 129;
    th_rng r = th_rng_new(7);
    const char *path = tmp_path("device.safetensors");
    for (int dt = LLMCL_F32; dt <= LLMCL_F16; ++dt) {
        const size_t es = llmcl_dtype_size((llmcl_dtype)dt);
        unsigned char *bits = th_alloc(n * es), *got = th_alloc(n * es), *ref_t = th_alloc(n * es);
        random_bytes(&r, bits, n * es);
        llmcl_tensor *t = th_tensor((llmcl_dtype)dt, 2, shape), *view = NULL;
        TH_OK(llmcl_tensor_upload(t, bits, n * es));
        TH_OK(llmcl_tensor_view(t, 2, tshape, tstrides, 0, &view));
        llmcl_safetensors_writer *w = NULL;
        ST_OK(llmcl_safetensors_writer_create(path, &w));
        ST_OK(llmcl_safetensors_writer_add_tensor(w, "m", t));
        ST_OK(llmcl_safetensors_writer_add_tensor(w, "m.T", view));
        ST_OK(llmcl_safetensors_writer_finish(w));
        llmcl_safetensors_writer_destroy(w);

        llmcl_safetensors *st = NULL;
        ST_OK(llmcl_safetensors_open(path, &st));
        llmcl_tensor *back = th_tensor((llmcl_dtype)dt, 2, shape);
        TH_OK(llmcl_safetensors_load(ctx, st, "m", back));
        TH_OK(llmcl_tensor_download(back, got, n * es));
        assert_memory_equal(got, bits, n * es);
        /* the transposed view was written as a contiguous [129, 37] tensor */
        for (size_t i = 0; i < 129; ++i)
            for (size_t j = 0; j < 37; ++j)
                memcpy(ref_t + (i * 37 + j) * es, bits + (j * 129 + i) * es, es);
        llmcl_safetensors_info info;
        ST_OK(llmcl_safetensors_find(st, "m.T", &info));
        assert_memory_equal(info.data, ref_t, n * es);
        /* loading it into a strided dst (the transposed view of a poisoned tensor) */
        llmcl_tensor *dst = th_tensor((llmcl_dtype)dt, 2, shape), *dst_t = NULL;
        TH_OK(llmcl_tensor_view(dst, 2, tshape, tstrides, 0, &dst_t));
        TH_OK(llmcl_safetensors_load(ctx, st, "m.T", dst_t));
        TH_OK(llmcl_tensor_download(dst, got, n * es));
        assert_memory_equal(got, bits, n * es);
        llmcl_safetensors_close(st);
        llmcl_tensor_destroy(dst_t);
        llmcl_tensor_destroy(dst);
        llmcl_tensor_destroy(back);
        llmcl_tensor_destroy(view);
        llmcl_tensor_destroy(t);
        free(bits);
        free(got);
        free(ref_t);
    }
}

/* A tensor larger than one 16 MiB piece, written and converted on load piece by piece. */
static void test_pieces(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const int64_t n = 9 * 1000 * 1000 + 17; /* 18 MB of bf16, 36 MB as f32 */
    uint16_t *bits = th_alloc((size_t)n * 2);
    float *got = th_alloc((size_t)n * 4);
    th_rng r = th_rng_new(3);
    for (int64_t i = 0; i < n; ++i)
        bits[i] = llmcl_f32_to_bf16((float)th_uniform(&r, -8, 8));
    llmcl_tensor *t = th_tensor(LLMCL_BF16, 1, &n), *f = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_tensor_upload(t, bits, (size_t)n * 2));
    const char *path = tmp_path("pieces.safetensors");
    llmcl_safetensors_writer *w = NULL;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_tensor(w, "big", t));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));
    llmcl_safetensors_info info;
    ST_OK(llmcl_safetensors_find(st, "big", &info));
    assert_memory_equal(info.data, bits, (size_t)n * 2);
    TH_OK(llmcl_safetensors_load(ctx, st, "big", f));
    TH_OK(llmcl_tensor_download(f, got, (size_t)n * 4));
    for (int64_t i = 0; i < n; ++i)
        if (got[i] != llmcl_bf16_to_f32(bits[i]))
            fail_msg("element %lld: %g, expected %g", (long long)i, got[i],
                     llmcl_bf16_to_f32(bits[i]));
    llmcl_safetensors_close(st);
    llmcl_tensor_destroy(t);
    llmcl_tensor_destroy(f);
    unlink(path);
    free(bits);
    free(got);
}

/* f32, bf16 and f16 convert into each other on load with the library's rounding. */
static void test_load_converts(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    enum { N = 301 };
    float x[N];
    uint16_t as_bf16[N], as_f16[N];
    int32_t ids[3] = {1, 2, 3};
    th_rng r = th_rng_new(11);
    for (int i = 0; i < N; ++i) {
        x[i] = (float)th_uniform(&r, -70000, 70000) / (float)(1 + i % 50);
        as_bf16[i] = llmcl_f32_to_bf16(x[i]);
        as_f16[i] = llmcl_f32_to_f16(x[i]);
    }
    const char *path = tmp_path("convert.safetensors");
    const int64_t n = N;
    llmcl_safetensors_writer *w = NULL;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "f32", LLMCL_F32, 1, &n, x));
    ST_OK(llmcl_safetensors_writer_add_host(w, "bf16", LLMCL_BF16, 1, &n, as_bf16));
    ST_OK(llmcl_safetensors_writer_add_host(w, "ids", LLMCL_I32, 1, (int64_t[]){3}, ids));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));

    uint16_t got16[N];
    float got32[N];
    llmcl_tensor *tb = th_tensor(LLMCL_BF16, 1, &n), *th = th_tensor(LLMCL_F16, 1, &n);
    llmcl_tensor *tf = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_safetensors_load(ctx, st, "f32", tb));
    TH_OK(llmcl_tensor_download(tb, got16, sizeof got16));
    assert_memory_equal(got16, as_bf16, sizeof got16);
    TH_OK(llmcl_safetensors_load(ctx, st, "f32", th));
    TH_OK(llmcl_tensor_download(th, got16, sizeof got16));
    assert_memory_equal(got16, as_f16, sizeof got16);
    TH_OK(llmcl_safetensors_load(ctx, st, "bf16", tf));
    TH_OK(llmcl_tensor_download(tf, got32, sizeof got32));
    for (int i = 0; i < N; ++i)
        assert_true(got32[i] == llmcl_bf16_to_f32(as_bf16[i]));
    TH_OK(llmcl_safetensors_load(ctx, st, "bf16", th)); /* through f32, which holds bf16 exactly */
    TH_OK(llmcl_tensor_download(th, got16, sizeof got16));
    for (int i = 0; i < N; ++i)
        assert_int_equal(got16[i], llmcl_f32_to_f16(llmcl_bf16_to_f32(as_bf16[i])));

    /* integers load only into their own dtype */
    llmcl_tensor *f3 = th_tensor(LLMCL_F32, 1, (int64_t[]){3}), *i3 = th_tensor(LLMCL_I32, 1, &n);
    expect_error(llmcl_safetensors_load(ctx, st, "ids", f3), LLMCL_ERROR_UNSUPPORTED_DTYPE, ctx,
                 "'ids' is I32 but dst is f32", NULL);
    expect_error(llmcl_safetensors_load(ctx, st, "f32", i3), LLMCL_ERROR_UNSUPPORTED_DTYPE, ctx,
                 "'f32' is F32 but dst is i32", NULL);
    llmcl_tensor_destroy(f3);
    llmcl_tensor_destroy(i3);
    llmcl_tensor_destroy(tb);
    llmcl_tensor_destroy(th);
    llmcl_tensor_destroy(tf);
    llmcl_safetensors_close(st);
}

/* ---- errors ---- */

static void test_load_and_find_errors(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const float x[15] = {0};
    const char *path = tmp_path("errors.safetensors");
    llmcl_safetensors_writer *w = NULL;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 2, (int64_t[]){3, 5}, x));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));

    llmcl_tensor *t53 = th_tensor(LLMCL_F32, 2, (int64_t[]){5, 3});
    llmcl_tensor *t15 = th_tensor(LLMCL_F32, 1, (int64_t[]){15});
    expect_error(llmcl_safetensors_load(ctx, st, "x", t53), LLMCL_ERROR_SHAPE_MISMATCH, ctx,
                 "shape [3, 5] in the file", "dst has shape [5, 3]");
    expect_error(llmcl_safetensors_load(ctx, st, "x", t15), LLMCL_ERROR_SHAPE_MISMATCH, ctx,
                 "[3, 5]", "[15]");
    expect_error(llmcl_safetensors_load(ctx, st, "y", t15), LLMCL_ERROR_INVALID_ARGUMENT, ctx,
                 "no tensor named 'y'", "errors.safetensors");
    expect_error(llmcl_safetensors_load(ctx, st, "x", NULL), LLMCL_ERROR_INVALID_ARGUMENT, ctx,
                 "dst must not be NULL", NULL);
    llmcl_safetensors_info info;
    expect_error(llmcl_safetensors_find(st, "y", &info), LLMCL_ERROR_INVALID_ARGUMENT, NULL,
                 "no tensor named 'y'", "errors.safetensors");
    expect_error(llmcl_safetensors_find(NULL, "x", &info), LLMCL_ERROR_INVALID_ARGUMENT, NULL,
                 "must not be NULL", NULL);
    assert_int_equal(llmcl_safetensors_count(NULL), -1);
    assert_null(llmcl_safetensors_name(NULL, 0));
    assert_null(llmcl_safetensors_metadata(st, "format"));
    llmcl_safetensors_close(NULL);
    llmcl_tensor_destroy(t53);
    llmcl_tensor_destroy(t15);
    llmcl_safetensors_close(st);

    llmcl_safetensors *none = (llmcl_safetensors *)1;
    expect_error(llmcl_safetensors_open(tmp_path("absent.safetensors"), &none), LLMCL_ERROR_IO,
                 NULL, "cannot open", "absent.safetensors");
    assert_null(none);
    expect_error(llmcl_safetensors_open(tmp_dir, &none), LLMCL_ERROR_IO, NULL,
                 "not a readable regular file", NULL);
}

enum { SHARED_N = 1 << 18 };

/* path written with one f32 tensor "x" of SHARED_N copies of value; whether finish succeeded. */
static bool write_filled(const char *path, float value)
{
    float *x = th_alloc(SHARED_N * sizeof *x);
    for (int i = 0; i < SHARED_N; ++i)
        x[i] = value;
    llmcl_safetensors_writer *w = NULL;
    const int64_t shape[1] = {SHARED_N};
    bool ok = llmcl_safetensors_writer_create(path, &w) == LLMCL_OK &&
              llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 1, shape, x) == LLMCL_OK &&
              llmcl_safetensors_writer_finish(w) == LLMCL_OK;
    llmcl_safetensors_writer_destroy(w);
    free(x);
    return ok;
}

/* Asserts path holds one writer's file whole: its size, and "x" all 1s or all 2s. */
static void expect_one_writer_whole(const char *path)
{
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));
    llmcl_safetensors_info info;
    ST_OK(llmcl_safetensors_find(st, "x", &info));
    llmcl_safetensors_close(st);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    float *x = th_alloc(SHARED_N * sizeof *x);
    assert_int_equal(fseek(f, -(long)(SHARED_N * sizeof *x), SEEK_END), 0);
    assert_int_equal(fread(x, sizeof *x, SHARED_N, f), SHARED_N);
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
    assert_true(x[0] == 1.0f || x[0] == 2.0f);
    for (int i = 0; i < SHARED_N; ++i)
        if (x[i] != x[0])
            fail_msg("x[%d] = %g in a file whose x[0] is %g: two writers mixed", i, x[i], x[0]);
    free(x);
}

/* Two processes finishing writers of one path again and again: every finish succeeds and the file
   is always one of them whole, as each writes a temporary file of its own. */
static void test_concurrent_writers(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", tmp_path("shared.safetensors"));
    const pid_t child = fork();
    assert_true(child >= 0);
    bool ok = true;
    for (int i = 0; i < 40 && ok; ++i)
        ok = write_filled(path, child == 0 ? 1.0f : 2.0f);
    if (child == 0)
        _exit(ok ? 0 : 1);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (!ok)
        fail_msg("a finish failed beside another process's: %s", llmcl_last_error(NULL));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    expect_one_writer_whole(path);
    assert_int_equal(th_files_starting(tmp_dir, "shared.safetensors.tmp"), 0);
}

static void test_writer_errors(void **state)
{
    (void)state;
    const float x[4] = {0};
    const int64_t s4[1] = {4};
    llmcl_safetensors_writer *w = NULL;
    const char *path = tmp_path("writer.safetensors");
    unlink(path);
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 1, s4, x));
    expect_error(llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 1, s4, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "'x' was already added", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "__metadata__", LLMCL_F32, 1, s4, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "cannot name a tensor", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "bad\xff", LLMCL_F32, 1, s4, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "not UTF-8", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "d", LLMCL_DTYPE_COUNT, 1, s4, x),
                 LLMCL_ERROR_UNSUPPORTED_DTYPE, NULL, "is not an llmcl_dtype", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "n", LLMCL_F32, 1, (int64_t[]){-1}, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "shape[0] = -1 is negative", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "n", LLMCL_F32, 9, s4, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "ndim 9", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "n", LLMCL_F32, 1, s4, NULL),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "data is NULL", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "n", LLMCL_F32, 2,
                                                   (int64_t[]){INT64_MAX / 2, 8}, x),
                 LLMCL_ERROR_OVERFLOW, NULL, "too large", NULL);
    expect_error(llmcl_safetensors_writer_add_tensor(w, "n", NULL), LLMCL_ERROR_INVALID_ARGUMENT,
                 NULL, "must not be NULL", NULL);
    ST_OK(llmcl_safetensors_writer_metadata(w, "k", "v"));
    expect_error(llmcl_safetensors_writer_metadata(w, "k", "v2"), LLMCL_ERROR_INVALID_ARGUMENT,
                 NULL, "'k' was already given", NULL);
    ST_OK(llmcl_safetensors_writer_finish(w));
    expect_error(llmcl_safetensors_writer_finish(w), LLMCL_ERROR_INVALID_ARGUMENT, NULL,
                 "already finished", NULL);
    expect_error(llmcl_safetensors_writer_add_host(w, "y", LLMCL_F32, 1, s4, x),
                 LLMCL_ERROR_INVALID_ARGUMENT, NULL, "already finished", NULL);
    llmcl_safetensors_writer_destroy(w);
    llmcl_safetensors_writer_destroy(NULL);

    /* an unfinished writer leaves no file; a failed finish leaves no temporary file */
    const char *unfinished = tmp_path("unfinished.safetensors");
    ST_OK(llmcl_safetensors_writer_create(unfinished, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 1, s4, x));
    llmcl_safetensors_writer_destroy(w);
    assert_int_equal(access(unfinished, F_OK), -1);
    ST_OK(llmcl_safetensors_writer_create(tmp_path("no/such/dir.safetensors"), &w));
    expect_error(llmcl_safetensors_writer_finish(w), LLMCL_ERROR_IO, NULL, "cannot create",
                 "no/such/dir.safetensors.tmp");
    llmcl_safetensors_writer_destroy(w);
    expect_error(llmcl_safetensors_writer_create("", &w), LLMCL_ERROR_INVALID_ARGUMENT, NULL,
                 "path must not be empty", NULL);
    assert_null(w);
}

/* Writes a file and expects open to fail with status and a message containing part. */
static void expect_bad(const char *header, int64_t n, size_t data_len, llmcl_status status,
                       const char *part)
{
    const char *path = tmp_path("bad.safetensors");
    make_file(path, header, n, data_len);
    llmcl_safetensors *st = (llmcl_safetensors *)1;
    expect_error(llmcl_safetensors_open(path, &st), status, NULL, part, "bad.safetensors");
    assert_null(st);
}

#define T(dt, shape, begin, end) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" \
    #begin "," #end "]}"

static void test_malformed_files(void **state)
{
    (void)state;
    const llmcl_status BAD = LLMCL_ERROR_BAD_FILE;
    const char *ok = "{\"a\":" T("F32", "[2]", 0, 8) "}";
    write_whole(tmp_path("bad.safetensors"), "\x01\x02\x03", 3);
    llmcl_safetensors *st = NULL;
    expect_error(llmcl_safetensors_open(tmp_path("bad.safetensors"), &st), BAD, NULL, "too short",
                 NULL);
    /* the header length */
    expect_bad(ok, 1000, 8, BAD, "header length 1000 runs past the end of the file");
    expect_bad(ok, INT64_MAX, 8, BAD, "above the limit of 100000000 bytes");
    expect_bad(ok, 100000001, 8, BAD, "above the limit");
    /* the JSON */
    expect_bad("{\"a\":", -1, 0, BAD, "not valid JSON");
    expect_bad("{\"a\":{}} x", -1, 0, BAD, "not valid JSON");
    expect_bad("{\"\xff\":1}", -1, 0, BAD, "not valid JSON");
    expect_bad("[1, 2]", -1, 0, BAD, "not an object");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 8) ",\"a\":" T("F32", "[2]", 8, 16) "}", -1, 16, BAD,
               "duplicate tensor name");
    expect_bad("{\"a\":[1]}", -1, 0, BAD, "tensor 'a' is not a JSON object");
    expect_bad("{\"__metadata__\":[]}", -1, 0, BAD, "\"__metadata__\" is not an object");
    expect_bad("{\"__metadata__\":{\"k\":1}}", -1, 0, BAD, "value of \"k\" is not a string");
    /* one tensor's description */
    expect_bad("{\"a\":" T("F128", "[2]", 0, 8) "}", -1, 8, BAD,
               "tensor 'a': unknown dtype \"F128\"");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, BAD, "\"(missing)\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", -1, 8, BAD,
               "\"shape\" is missing");
    expect_bad("{\"a\":" T("F32", "[-2]", 0, 8) "}", -1, 8, BAD, "shape[0] is not a non-negative");
    expect_bad("{\"a\":" T("F32", "[2.0]", 0, 8) "}", -1, 8, BAD, "shape[0] is not a non-negative");
    expect_bad("{\"a\":" T("F32", "[1,1,1,1,1,1,1,1,2]", 0, 8) "}", -1, 8, BAD,
               "has 9 dimensions");
    expect_bad("{\"a\":" T("F32", "[4611686018427387904,4]", 0, 8) "}", -1, 8, BAD,
               "overflows 64 bits");
    expect_bad("{\"a\":" T("F4", "[3]", 0, 2) "}", -1, 2, BAD, "do not fill whole bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", -1, 8, BAD,
               "not two non-negative integers");
    expect_bad("{\"a\":" T("F32", "[2]", -8, 0) "}", -1, 8, BAD, "not two non-negative integers");
    expect_bad("{\"a\":" T("F32", "[0]", 8, 0) "}", -1, 8, BAD, "end before they begin");
    expect_bad("{\"a\":" T("F32", "[2,2]", 0, 12) "}", -1, 12, BAD,
               "shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] hold 12");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 18446744073709551616) "}", -1, 8, BAD,
               "not valid JSON (too big integer");
    /* the offsets against the data and each other */
    expect_bad("{\"a\":" T("F32", "[4]", 16, 32) "}", -1, 20, BAD, "run past the end of the data");
    expect_bad(ok, -1, 6, BAD, "truncated data");
    expect_bad(ok, -1, 12, BAD, "trailing bytes");
    expect_bad("{\"a\":" T("F32", "[2]", 4, 12) "}", -1, 12, BAD, "a hole");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[2]", 12, 20) "}", -1, 20, BAD,
               "tensor 'b' begins at byte 12 but the data before it ends at 8: a hole");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[2]", 4, 12) "}", -1, 12, BAD,
               "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[2]", 0, 8) "}", -1, 8, BAD,
               "overlaps");
    expect_bad("{\"a\":" T("F32", "[2]", 0, 8) ",\"e\":" T("F32", "[0]", 4, 4) "}", -1, 8, BAD,
               "tensor 'e' (data_offsets [4, 4]) overlaps tensor 'a'");
    /* a file truncated after the writer made it */
    const float x[6] = {1, 2, 3, 4, 5, 6};
    const char *path = tmp_path("cut.safetensors");
    llmcl_safetensors_writer *w = NULL;
    ST_OK(llmcl_safetensors_writer_create(path, &w));
    ST_OK(llmcl_safetensors_writer_add_host(w, "x", LLMCL_F32, 1, (int64_t[]){6}, x));
    ST_OK(llmcl_safetensors_writer_finish(w));
    llmcl_safetensors_writer_destroy(w);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 3), 0);
    expect_error(llmcl_safetensors_open(path, &st), BAD, NULL, "tensor 'x'", "truncated data");
}

/* What the reference accepts beyond llmcl's writer: any header order, dtypes llmcl lacks. */
static void test_foreign_files(void **state)
{
    (void)state;
    const char *path = tmp_path("foreign.safetensors");
    make_file(path,
              "{ \"z\" : " T("C64", "[1]", 8, 16) ", \"a\":" T("F4", "[4]", 0, 2) ", \"b\":"
              T("F6_E2M3", "[4]", 2, 5) ", \"c\":" T("BOOL", "[3]", 5, 8) ",\"extra\":"
              "{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[16,18],\"note\":1}}      ",
              -1, 18);
    llmcl_safetensors *st = NULL;
    ST_OK(llmcl_safetensors_open(path, &st));
    const char *order[] = {"a", "b", "c", "z", "extra"};
    assert_int_equal(llmcl_safetensors_count(st), 5);
    for (int i = 0; i < 5; ++i)
        assert_string_equal(llmcl_safetensors_name(st, i), order[i]);
    llmcl_safetensors_info info;
    ST_OK(llmcl_safetensors_find(st, "b", &info));
    assert_string_equal(info.dtype_name, "F6_E2M3");
    assert_int_equal(info.dtype, LLMCL_DTYPE_COUNT);
    assert_int_equal(info.bytes, 3);
    assert_int_equal(info.offset, 2);
    llmcl_safetensors_close(st);
}

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/llmcl-st-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    static const char *files[] = {"ref.safetensors", "host.safetensors", "device.safetensors",
                                  "convert.safetensors", "errors.safetensors", "writer.safetensors",
                                  "bad.safetensors", "cut.safetensors", "foreign.safetensors",
                                  "shared.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i)
        unlink(tmp_path(files[i]));
    rmdir(tmp_dir);
    return th_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_reference_layout),
        cmocka_unit_test(test_round_trip_host),
        cmocka_unit_test(test_round_trip_device),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_load_converts),
        cmocka_unit_test(test_load_and_find_errors),
        cmocka_unit_test(test_concurrent_writers),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_foreign_files),
    };
    th_ctx();
    return cmocka_run_group_tests(tests, setup, teardown);
}
