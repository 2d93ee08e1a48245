/*
 * test_safetensors_slow.c (suite 'slow'): 64-bit offsets in safetensors files. A sparse file holds
 * a 4 GiB + 8 byte U8 tensor (a hole: ftruncate, no writes) followed by a bf16 tensor whose data
 * starts past byte 2^32 of the data section; the reader must map, validate and find it, and load it
 * into device tensors bit-exact and converted. Only the header and the far tensor's 128 bytes are
 * written; the test prints the disk space the file really took. Skipped where the filesystem has
 * no sparse files of that size.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define PAD_BYTES (((uint64_t)1 << 32) + 8)
#define FAR_N 64

static char path[512];

/* Writes the header and the far tensor; the pad tensor's 4 GiB stay a hole. Returns 0 to skip. */
static int make_sparse_file(const uint16_t *far)
{
    char header[512];
    int n = snprintf(header, sizeof header,
                     "{\"__metadata__\":{\"format\":\"pt\"},"
                     "\"far\":{\"dtype\":\"BF16\",\"shape\":[8,8],\"data_offsets\":[%llu,%llu]},"
                     "\"pad\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
                     (unsigned long long)PAD_BYTES, (unsigned long long)(PAD_BYTES + 2 * FAR_N),
                     (unsigned long long)PAD_BYTES, (unsigned long long)PAD_BYTES);
    while (n % 8)
        header[n++] = ' ';
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    const off_t data_start = 8 + n, far_at = data_start + (off_t)PAD_BYTES;
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    int ok = pwrite(fd, len, 8, 0) == 8 && pwrite(fd, header, (size_t)n, 8) == n &&
             ftruncate(fd, far_at + 2 * FAR_N) == 0 &&
             pwrite(fd, far, 2 * FAR_N, far_at) == 2 * FAR_N;
    close(fd);
    return ok;
}

static void test_tensor_past_4gib(void **state)
{
    (void)state;
    uint16_t far[FAR_N], got[FAR_N];
    th_rng r = th_rng_new(4);
    for (int i = 0; i < FAR_N; ++i)
        far[i] = llmcl_f32_to_bf16((float)th_uniform(&r, -3, 3));
    if (!make_sparse_file(far)) {
        unlink(path);
        skip();
    }
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    printf("sparse file: %lld bytes long, %lld bytes on disk\n", (long long)sb.st_size,
           (long long)sb.st_blocks * 512);

    llmcl_safetensors *st = NULL;
    llmcl_status s = llmcl_safetensors_open(path, &st);
    if (s != LLMCL_OK)
        fail_msg("open: %s", llmcl_last_error(NULL));
    assert_int_equal(llmcl_safetensors_count(st), 2);
    assert_string_equal(llmcl_safetensors_name(st, 1), "far");
    assert_string_equal(llmcl_safetensors_metadata(st, "format"), "pt");
    llmcl_safetensors_info info;
    assert_int_equal(llmcl_safetensors_find(st, "pad", &info), LLMCL_OK);
    assert_true(info.bytes == PAD_BYTES);
    assert_true(info.shape[0] == (int64_t)PAD_BYTES);
    assert_int_equal(llmcl_safetensors_find(st, "far", &info), LLMCL_OK);
    assert_true(info.offset == PAD_BYTES);
    assert_memory_equal(info.data, far, sizeof far);

    const int64_t shape[2] = {8, 8};
    llmcl_tensor *b = th_tensor(LLMCL_BF16, 2, shape), *f = th_tensor(LLMCL_F32, 2, shape);
    TH_OK(llmcl_safetensors_load(th_ctx(), st, "far", b));
    TH_OK(llmcl_tensor_download(b, got, sizeof got));
    assert_memory_equal(got, far, sizeof far);
    float gotf[FAR_N];
    TH_OK(llmcl_safetensors_load(th_ctx(), st, "far", f));
    TH_OK(llmcl_tensor_download(f, gotf, sizeof gotf));
    for (int i = 0; i < FAR_N; ++i)
        assert_true(gotf[i] == llmcl_bf16_to_f32(far[i]));
    llmcl_tensor_destroy(b);
    llmcl_tensor_destroy(f);
    llmcl_safetensors_close(st);
    unlink(path);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/llmcl-st-sparse-%d.safetensors", base && *base ? base : "/tmp",
             (int)getpid());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tensor_past_4gib)};
    return TH_RUN(tests);
}
