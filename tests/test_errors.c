/*
 * test_errors.c: status codes and their text, last-error messages, build failures with their log,
 * kernel sources read from LLMCL_KERNEL_DIR, and the library's silence unless LLMCL_LOG is set
 * (at 2, the compiler's warnings of successful builds).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* The elementwise family's sources: the real common.cl and vec_io.cl (its prelude), and `body` as
   elementwise.cl. */
static void write_kernel_dir(const char *body)
{
    const char *src_dir = getenv("LLMCL_KERNEL_DIR_FOR_TESTS");
    assert_non_null(src_dir);
    snprintf(kernel_dir, sizeof kernel_dir, "/tmp/llmcl-kdir-XXXXXX");
    assert_non_null(mkdtemp(kernel_dir));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s'/common.cl '%s'/vec_io.cl '%s'/", src_dir, src_dir,
             kernel_dir);
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

/* What fn(arg) printed to stderr (the caller frees it). fn must not assert: a failed assertion
   would leave stderr redirected. */
static char *stderr_of(void (*fn)(void *), void *arg)
{
    fflush(stderr);
    const int saved = dup(2);
    char path[] = "/tmp/llmcl-stderr-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    const off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc((size_t)size + 1, 1);
    const bool read_all = text && pread(fd, text, (size_t)size, 0) == size;
    close(fd);
    remove(path);
    assert_true(read_all);
    return text;
}

static void failing_copy(void *unused)
{
    (void)unused;
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
}

static void test_silent_unless_logging(void **state)
{
    (void)state;
    unsetenv("LLMCL_LOG");
    char *out = stderr_of(failing_copy, NULL);
    assert_string_equal(out, "");
    free(out);
    setenv("LLMCL_LOG", "1", 1);
    out = stderr_of(failing_copy, NULL);
    assert_true(strlen(out) > 0);
    free(out);
    unsetenv("LLMCL_LOG");
}

typedef struct fill_call {
    llmcl_ctx *ctx;
    llmcl_tensor *t;
    llmcl_status status;
} fill_call;

static void fill_sevens(void *arg)
{
    fill_call *c = arg;
    c->status = llmcl_fill(c->ctx, c->t, 7.0);
}

/*
 * LLMCL_LOG=2 prints the build log of a build that succeeds with a warning (a constant on the
 * right of &&, which clang-based compilers report by default). On Hopper the kernel also holds an
 * instruction behind mma.cl's sm_90a marker, so that the program is rebuilt for sm_90a, whose log
 * would not hold the warning. The time and process id in a comment keep PoCL's own kernel cache
 * from serving an earlier build, whose log is empty.
 */
static void test_log_2_prints_build_warnings(void **state)
{
    (void)state;
    char body[1024];
    snprintf(body, sizeof body,
             "/* %ld %ld */\n"
             "__kernel void fill_contig(__global float *dst, ulong off, long n, float fv,\n"
             "                          long iv)\n"
             "{\n"
             "    const long i = get_global_id(0);\n"
             "#ifdef LLMCL_NV_WGMMA\n"
             "    asm volatile(\"// @sm90a membar.cta;\" ::: \"memory\");\n"
             "#endif\n"
             "    if (i < n && 4)\n"
             "        dst[off + i] = fv;\n"
             "}\n",
             (long)time(NULL), (long)getpid());
    write_kernel_dir(body);
    setenv("LLMCL_KERNEL_DIR", kernel_dir, 1);
    setenv("LLMCL_CACHE_DIR", "off", 1);
    fill_call c = {NULL, NULL, LLMCL_OK};
    TH_OK(llmcl_ctx_create(&c.ctx));
    const int64_t shape[] = {10};
    TH_OK(llmcl_tensor_create(c.ctx, LLMCL_F32, 1, shape, &c.t));
    setenv("LLMCL_LOG", "2", 1);
    char *out = stderr_of(fill_sevens, &c);
    unsetenv("LLMCL_LOG");
    TH_OK(c.status);
    float host[10];
    TH_OK(llmcl_tensor_download(c.t, host, sizeof host));
    for (int i = 0; i < 10; ++i)
        assert_true(host[i] == 7.0f);
    /* Mesa's rusticl (22.3) leaves warnings out of the build log */
    const bool keeps_warnings = llmcl_ctx_device_info(c.ctx)->vendor_id != LLMCL_VENDOR_MESA;
    const char *log = strstr(out, "build log of elementwise [");
    if (!log || (keeps_warnings && !strstr(log, "warning")))
        fprintf(stderr, "stderr with LLMCL_LOG=2:\n%s\n", out);
    assert_non_null(log);
    if (keeps_warnings)
        assert_non_null(strstr(log, "warning"));
    free(out);
    llmcl_tensor_destroy(c.t);
    llmcl_ctx_destroy(c.ctx);
    unsetenv("LLMCL_KERNEL_DIR");
    unsetenv("LLMCL_CACHE_DIR");
    remove_kernel_dir();
}

/* A profiling region of two fills and an axpy on c's tensor (the profile's status in c). */
static void profiled_region(void *arg)
{
    fill_call *c = arg;
    llmcl_profile prof;
    c->status = llmcl_profile_begin(c->ctx);
    if (c->status == LLMCL_OK)
        c->status = llmcl_fill(c->ctx, c->t, 1.0);
    if (c->status == LLMCL_OK)
        c->status = llmcl_fill(c->ctx, c->t, 2.0);
    if (c->status == LLMCL_OK)
        c->status = llmcl_axpy(c->ctx, 0.5f, c->t, c->t);
    const llmcl_status end = llmcl_profile_end(c->ctx, &prof);
    if (c->status == LLMCL_OK)
        c->status = end;
    if (c->status == LLMCL_OK && prof.launches != 3)
        c->status = LLMCL_ERROR_INVALID_ARGUMENT;
}

/* LLMCL_LOG=3 lists a profiling region's kernels by name, the most time first; 1 and 2 do not. */
static void test_log_3_lists_region_kernels(void **state)
{
    (void)state;
    fill_call c = {NULL, NULL, LLMCL_OK};
    TH_OK(llmcl_ctx_create(&c.ctx));
    const int64_t shape[] = {4099};
    TH_OK(llmcl_tensor_create(c.ctx, LLMCL_F32, 1, shape, &c.t));
    profiled_region(&c); /* builds the kernels, so that the logs below hold no build lines */
    TH_OK(c.status);
    setenv("LLMCL_LOG", "2", 1);
    char *out = stderr_of(profiled_region, &c);
    TH_OK(c.status);
    assert_null(strstr(out, "profile region"));
    free(out);
    setenv("LLMCL_LOG", "3", 1);
    out = stderr_of(profiled_region, &c);
    unsetenv("LLMCL_LOG");
    TH_OK(c.status);
    const char *region = strstr(out, "profile region: 3 launches");
    if (!region || !strstr(out, "fill_contig") || !strstr(out, "axpy_contig"))
        fprintf(stderr, "stderr with LLMCL_LOG=3:\n%s\n", out);
    assert_non_null(region);
    const char *fill = strstr(region, "fill_contig");
    assert_non_null(fill);
    assert_non_null(strstr(fill, " 2 launches"));
    assert_non_null(strstr(region, "axpy_contig"));
    free(out);
    float host[4099];
    TH_OK(llmcl_tensor_download(c.t, host, sizeof host));
    assert_true(host[0] == 3.0f && host[4098] == 3.0f);
    llmcl_tensor_destroy(c.t);
    llmcl_ctx_destroy(c.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_messages_name_the_argument),
        cmocka_unit_test(test_build_failure_keeps_log),
        cmocka_unit_test(test_kernel_dir_overrides_embedded),
        cmocka_unit_test(test_silent_unless_logging),
        cmocka_unit_test(test_log_3_lists_region_kernels),
        cmocka_unit_test(test_log_2_prints_build_warnings),
    };
    return TH_RUN(tests);
}
