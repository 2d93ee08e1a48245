/*
 * test_errors.c: status codes and their text, last-error messages, build failures with their log,
 * kernel sources read from LLMCL_KERNEL_DIR, and the library's silence unless LLMCL_LOG is set.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static void test_status_strings(void **state)
{
    (void)state;
    const int codes[] = {LLMCL_OK, LLMCL_ERROR_INVALID_ARGUMENT, LLMCL_ERROR_SHAPE_MISMATCH,
                         LLMCL_ERROR_UNSUPPORTED_DTYPE, LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                         LLMCL_ERROR_OUT_OF_HOST_MEMORY, LLMCL_ERROR_BUILD_FAILURE,
                         LLMCL_ERROR_NO_DEVICE, LLMCL_ERROR_DEVICE_MISMATCH, LLMCL_ERROR_OVERFLOW,
                         LLMCL_ERROR_UNSUPPORTED, LLMCL_ERROR_IO, LLMCL_ERROR_MPI,
                         LLMCL_ERROR_TUNE_DB, LLMCL_ERROR_KERNEL_NOT_FOUND,
                         LLMCL_ERROR_BAD_FILE, LLMCL_ERROR_NCCL};
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; ++i) {
        const char *s = llmcl_status_str(codes[i]);
        assert_true(strlen(s) > 3);
        for (size_t j = 0; j < i; ++j)
            assert_string_not_equal(s, llmcl_status_str(codes[j]));
    }
    assert_string_equal(llmcl_status_str(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
    assert_string_equal(llmcl_status_str(CL_INVALID_KERNEL_ARGS), "CL_INVALID_KERNEL_ARGS");
    assert_string_equal(llmcl_status_str(-123456), "unknown status");
    assert_string_equal(llmcl_version(), LLMCL_VERSION_STRING);
}

static void test_messages_name_the_argument(void **state)
{
    (void)state;
    const int64_t s3[] = {3}, s4[] = {2, 2};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 1, s3), *b = th_tensor(LLMCL_F32, 2, s4);
    TH_FAILS(llmcl_copy(th_ctx(), a, b), LLMCL_ERROR_SHAPE_MISMATCH);
    const char *msg = llmcl_last_error(th_ctx());
    assert_non_null(strstr(msg, "src"));
    assert_non_null(strstr(msg, "[3]"));
    assert_non_null(strstr(msg, "[2, 2]"));
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
}

static char kernel_dir[64];

/* A copy of the real kernel sources with elementwise.cl replaced by `body`. */
static void write_kernel_dir(const char *body)
{
    const char *src_dir = getenv("LLMCL_KERNEL_DIR_FOR_TESTS");
    assert_non_null(src_dir);
    snprintf(kernel_dir, sizeof kernel_dir, "/tmp/llmcl-kdir-XXXXXX");
    assert_non_null(mkdtemp(kernel_dir));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s'/common.cl '%s'/", src_dir, kernel_dir);
    assert_int_equal(system(cmd), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/elementwise.cl", kernel_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
}

static void remove_kernel_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", kernel_dir);
    assert_int_equal(system(cmd), 0);
}

static void test_build_failure_keeps_log(void **state)
{
    (void)state;
    write_kernel_dir("__kernel void fill_contig(__global float *x) { this is not C; }\n");
    setenv("LLMCL_KERNEL_DIR", kernel_dir, 1);
    setenv("LLMCL_CACHE_DIR", "off", 1);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    assert_string_equal(llmcl_build_log(ctx), "");
    const int64_t shape[] = {16};
    llmcl_tensor *t = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, shape, &t));
    assert_int_equal(llmcl_fill(ctx, t, 1.0), LLMCL_ERROR_BUILD_FAILURE);
    assert_non_null(strstr(llmcl_last_error(ctx), "elementwise"));
    const char *log = llmcl_build_log(ctx);
    assert_non_null(strstr(log, "options: "));
    assert_non_null(strstr(log, "-DDT=F32"));
    assert_true(strlen(strstr(log, "log:\n")) > 6); /* the compiler said something */
    llmcl_tensor_destroy(t);
    llmcl_ctx_destroy(ctx);
    unsetenv("LLMCL_KERNEL_DIR");
    unsetenv("LLMCL_CACHE_DIR");
    remove_kernel_dir();
}

static void test_kernel_dir_overrides_embedded(void **state)
{
    (void)state;
    /* a fill that writes 42 whatever it is asked: proves the source came from the folder */
    write_kernel_dir("__kernel void fill_contig(__global float *dst, ulong off, long n, float fv,"
                     " long iv) { long i = get_global_id(0); if (i < n) dst[off + i] = 42.0f; }\n");
    setenv("LLMCL_KERNEL_DIR", kernel_dir, 1);
    setenv("LLMCL_CACHE_DIR", "off", 1);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    const int64_t shape[] = {10};
    llmcl_tensor *t = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, shape, &t));
    TH_OK(llmcl_fill(ctx, t, 1.0));
    float host[10];
    TH_OK(llmcl_tensor_download(t, host, sizeof host));
    for (int i = 0; i < 10; ++i)
        assert_true(host[i] == 42.0f);
    /* a family the folder lacks */
    TH_OK(llmcl_ctx_finish(ctx));
    double gbs;
    char ceil_path[128];
    snprintf(ceil_path, sizeof ceil_path, "%s/ceilings.cl", kernel_dir);
    remove(ceil_path);
    assert_int_equal(llmcl_measure_fma_rate(ctx, &gbs), LLMCL_ERROR_KERNEL_NOT_FOUND);
    assert_non_null(strstr(llmcl_last_error(ctx), "ceilings.cl"));
    llmcl_tensor_destroy(t);
    llmcl_ctx_destroy(ctx);
    unsetenv("LLMCL_KERNEL_DIR");
    unsetenv("LLMCL_CACHE_DIR");
    remove_kernel_dir();
}

/* Runs a failing call with stderr redirected; returns how many bytes the library printed. */
static long stderr_bytes_of_failure(void)
{
    fflush(stderr);
    const int saved = dup(2);
    char path[] = "/tmp/llmcl-stderr-XXXXXX";
    const int fd = mkstemp(path);
    dup2(fd, 2);
    const int64_t s3[] = {3}, s4[] = {4};
    llmcl_tensor *a = NULL, *b = NULL;
    llmcl_ctx *ctx = NULL;
    llmcl_ctx_create(&ctx);
    llmcl_tensor_create(ctx, LLMCL_F32, 1, s3, &a);
    llmcl_tensor_create(ctx, LLMCL_F32, 1, s4, &b);
    llmcl_copy(ctx, a, b);
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
    llmcl_ctx_destroy(ctx);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    const long size = lseek(fd, 0, SEEK_END);
    close(fd);
    remove(path);
    return size;
}

static void test_silent_unless_logging(void **state)
{
    (void)state;
    unsetenv("LLMCL_LOG");
    assert_int_equal(stderr_bytes_of_failure(), 0);
    setenv("LLMCL_LOG", "1", 1);
    assert_true(stderr_bytes_of_failure() > 0);
    unsetenv("LLMCL_LOG");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_messages_name_the_argument),
        cmocka_unit_test(test_build_failure_keeps_log),
        cmocka_unit_test(test_kernel_dir_overrides_embedded),
        cmocka_unit_test(test_silent_unless_logging),
    };
    return TH_RUN(tests);
}
