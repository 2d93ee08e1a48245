/*
 * test_device.c: device selection through LLMCL_PLATFORM / LLMCL_DEVICE and by node-local index,
 * the capability probe (the loop limit included), contexts built on an application's own OpenCL
 * objects, and the tensor-core rate's guards.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Sets or unsets a variable for one call, restoring the previous value after. */
typedef struct saved_env {
    char name[32];
    char *value;
} saved_env;

static saved_env env_set(const char *name, const char *value)
{
    saved_env s = {.value = NULL};
    snprintf(s.name, sizeof s.name, "%s", name);
    const char *old = getenv(name);
    if (old)
        s.value = strdup(old);
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return s;
}

static void env_restore(saved_env *s)
{
    if (s->value)
        setenv(s->name, s->value, 1);
    else
        unsetenv(s->name);
    free(s->value);
}

static void test_probe(void **state)
{
    (void)state;
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    assert_non_null(info);
    assert_true(strlen(info->name) > 0);
    assert_true(info->compute_units > 0);
    assert_true(info->local_mem_bytes >= 16 * 1024);
    assert_true(info->local_mem_static_bytes >= info->local_mem_bytes);
    assert_true(info->max_work_group_size >= 64);
    assert_true(info->max_alloc_bytes > 0 && info->max_alloc_bytes <= info->global_mem_bytes);
    assert_true(info->cl_c_major >= 1);
    assert_true(info->simd_width >= 1);
    if (info->vendor_id == LLMCL_VENDOR_NVIDIA)
        assert_true(info->nv_cc_major >= 3);
    else
        assert_int_equal(info->has_inline_ptx, 0);
    /* tensor cores need inline PTX and sm_80; on an NVIDIA GPU of sm_80 or later they must probe */
    assert_true(!info->has_mma || (info->has_inline_ptx && info->nv_cc_major >= 8));
    if (info->has_inline_ptx && info->nv_cc_major >= 8)
        assert_int_equal(info->has_mma, 1);
    llmcl_device_info again;
    TH_OK(llmcl_device_probe(llmcl_ctx_cl_device(th_ctx()), &again));
    assert_string_equal(again.name, info->name);
    assert_int_equal(again.has_inline_ptx, info->has_inline_ptx);
    assert_int_equal(again.has_mma, info->has_mma);
    assert_int_equal(again.has_fp64, info->has_fp64);
    /* the loop probe: Mesa's llvmpipe (rusticl on CPUs) ends loops after 65535 iterations (its
       LP_MAX_TGSI_LOOP_ITERATIONS), PoCL and NVIDIA's GPUs run them in full */
    assert_true(again.loop_limit == info->loop_limit);
    if (strstr(info->name, "llvmpipe"))
        assert_int_equal(info->loop_limit, 65535);
    else if (info->vendor_id == LLMCL_VENDOR_POCL || info->vendor_id == LLMCL_VENDOR_NVIDIA)
        assert_int_equal(info->loop_limit, 0);
    TH_FAILS(llmcl_device_probe(NULL, &again), LLMCL_ERROR_INVALID_ARGUMENT);
    /* LLMCL_LOOP_LIMIT lowers the limit (never raises it); a bad value fails the context */
    const uint64_t measured = info->loop_limit;
    th_loop_limit("1000");
    assert_true(llmcl_ctx_device_info(th_ctx())->loop_limit == 1000);
    th_loop_limit("1000000000");
    assert_true(llmcl_ctx_device_info(th_ctx())->loop_limit == (measured ? measured : 1000000000));
    th_loop_limit("10x"); /* not through TH_FAILS: it would create the shared context */
    llmcl_ctx *bad = NULL;
    assert_int_equal(llmcl_ctx_create(&bad), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_null(bad);
    assert_non_null(strstr(llmcl_last_error(NULL), "LLMCL_LOOP_LIMIT"));
    th_loop_limit(NULL);
}

static void test_select_by_name_substring(void **state)
{
    (void)state;
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    char upper[64];
    snprintf(upper, sizeof upper, "%.12s", info->name);
    for (char *p = upper; *p; ++p)
        *p = (char)((*p >= 'a' && *p <= 'z') ? *p - 32 : *p);
    saved_env d = env_set("LLMCL_DEVICE", upper);
    cl_platform_id platform;
    cl_device_id device;
    TH_OK(llmcl_device_select(&platform, &device));
    char name[256];
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
    assert_memory_equal(name, info->name, 12);
    env_restore(&d);
}

static void test_select_no_match(void **state)
{
    (void)state;
    cl_platform_id platform;
    cl_device_id device;
    saved_env d = env_set("LLMCL_DEVICE", "no-such-device-xyz");
    assert_int_equal(llmcl_device_select(&platform, &device), LLMCL_ERROR_NO_DEVICE);
    const char *msg = llmcl_last_error(NULL);
    assert_non_null(strstr(msg, "no-such-device-xyz"));
    assert_non_null(strstr(msg, llmcl_ctx_device_info(th_ctx())->name)); /* lists what exists */
    llmcl_ctx *ctx = NULL;
    assert_int_equal(llmcl_ctx_create(&ctx), LLMCL_ERROR_NO_DEVICE);
    assert_null(ctx);
    env_restore(&d);
    saved_env p = env_set("LLMCL_PLATFORM", "99");
    assert_int_equal(llmcl_device_select(&platform, &device), LLMCL_ERROR_NO_DEVICE);
    env_restore(&p);
    assert_int_equal(llmcl_device_select(NULL, &device), LLMCL_ERROR_INVALID_ARGUMENT);
}

static void test_select_by_index(void **state)
{
    (void)state;
    /* the selected device's platform, by name, then device index 0 of it exists */
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    saved_env p = env_set("LLMCL_PLATFORM", info->platform_name);
    saved_env d = env_set("LLMCL_DEVICE", "0");
    cl_platform_id platform;
    cl_device_id device;
    TH_OK(llmcl_device_select(&platform, &device));
    char pname[256];
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    assert_string_equal(pname, info->platform_name);
    env_restore(&d);
    env_restore(&p);
}

/* The first platform with a device whose `param` string contains `needle` (lower case), or NULL. */
static cl_platform_id platform_with(cl_platform_info param, const char *needle)
{
    cl_platform_id ps[16];
    cl_uint np = 0;
    clGetPlatformIDs(16, ps, &np);
    for (cl_uint i = 0; i < np && i < 16; ++i) {
        char text[512] = "", low[512];
        cl_uint nd = 0;
        clGetPlatformInfo(ps[i], param, sizeof text, text, NULL);
        for (size_t j = 0; j <= strlen(text); ++j)
            low[j] = (char)((text[j] >= 'A' && text[j] <= 'Z') ? text[j] + 32 : text[j]);
        if (strstr(low, needle) && clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) ==
                                       CL_SUCCESS && nd > 0)
            return ps[i];
    }
    return NULL;
}

/* The names people use for the implementations select them, whatever each platform calls itself:
   PoCL is "Portable Computing Language" (vendor "The pocl project"), NVIDIA's is "NVIDIA CUDA",
   Mesa's are "rusticl" and "Clover" (vendor "Mesa..."). Where PoCL's version string lists a CUDA
   backend, "cuda" must still pick NVIDIA's platform by its name. */
static void test_select_platform_aliases(void **state)
{
    (void)state;
    static const struct {
        const char *sel;
        cl_platform_info param;
        const char *needle;
    } cases[] = {
        {"pocl", CL_PLATFORM_NAME, "portable computing language"},
        {"PoCL", CL_PLATFORM_NAME, "portable computing language"},
        {"nvidia", CL_PLATFORM_NAME, "nvidia"},
        {"cuda", CL_PLATFORM_NAME, "nvidia cuda"},
        {"rusticl", CL_PLATFORM_NAME, "rusticl"},
        {"mesa", CL_PLATFORM_VENDOR, "mesa"},
    };
    int found = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        const cl_platform_id want = platform_with(cases[c].param, cases[c].needle);
        saved_env p = env_set("LLMCL_PLATFORM", cases[c].sel);
        saved_env d = env_set("LLMCL_DEVICE", NULL);
        cl_platform_id platform = NULL;
        cl_device_id device = NULL;
        const llmcl_status st = llmcl_device_select(&platform, &device);
        if (want) {
            ++found;
            TH_OK(st);
            if (platform != want)
                fail_msg("LLMCL_PLATFORM=%s selected another platform", cases[c].sel);
        } else {
            assert_int_equal(st, LLMCL_ERROR_NO_DEVICE);
            assert_non_null(strstr(llmcl_last_error(NULL), "name / vendor / version"));
        }
        env_restore(&d);
        env_restore(&p);
    }
    assert_true(found > 0); /* the platform under test answers to one of its usual names */
}

/* LLMCL_MEMORY_LIMIT: a byte count with an optional binary unit; anything else, a negative count
   or one that overflows 63 bits once its unit applies fails the context. */
static void test_bad_memory_limit_env(void **state)
{
    (void)state;
    static const char *bad[] = {"12 bananas", "-1", "1T", "3MB", "9999999999G", "",
                                "99999999999999999999"};
    llmcl_ctx *ctx = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        saved_env m = env_set("LLMCL_MEMORY_LIMIT", bad[i]);
        const llmcl_status st = llmcl_ctx_create(&ctx);
        if (bad[i][0] == '\0') { /* empty is unset */
            TH_OK(st);
            llmcl_ctx_destroy(ctx);
            ctx = NULL;
        } else {
            assert_int_equal(st, LLMCL_ERROR_INVALID_ARGUMENT);
            assert_null(ctx);
            assert_non_null(strstr(llmcl_last_error(NULL), "LLMCL_MEMORY_LIMIT"));
        }
        env_restore(&m);
    }
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {{"3M", 3u << 20}, {"5k", 5u << 10}, {"2g", 2ull << 30}, {"4096", 4096}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; ++i) {
        saved_env m = env_set("LLMCL_MEMORY_LIMIT", good[i].text);
        TH_OK(llmcl_ctx_create(&ctx));
        llmcl_memory_stats ms;
        TH_OK(llmcl_memory_stats_get(ctx, &ms));
        assert_true(ms.limit_bytes == good[i].bytes);
        llmcl_ctx_destroy(ctx);
        env_restore(&m);
    }
}

/* An application's sub-buffers of one buffer overlap where their bytes do, whatever their handles. */
static void test_sub_buffers(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    cl_uint align_bits = 0;
    assert_int_equal(clGetDeviceInfo(llmcl_ctx_cl_device(ctx), CL_DEVICE_MEM_BASE_ADDR_ALIGN,
                                     sizeof align_bits, &align_bits, NULL),
                     CL_SUCCESS);
    const size_t align = align_bits / 8, n = 2 * align / sizeof(float);
    cl_int err;
    cl_mem parent = clCreateBuffer(llmcl_ctx_cl_context(ctx), CL_MEM_READ_WRITE, 4 * align, NULL,
                                   &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem sub[3];
    llmcl_tensor *t[3];
    const size_t origins[3] = {0, align, 2 * align}; /* 0 and 1 share bytes; 0 and 2 do not */
    for (int i = 0; i < 3; ++i) {
        const cl_buffer_region region = {origins[i], 2 * align};
        sub[i] = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                   &region, &err);
        assert_int_equal(err, CL_SUCCESS);
        TH_OK(llmcl_tensor_wrap(ctx, sub[i], LLMCL_F32, 1, (const int64_t[]){(int64_t)n}, NULL, 0,
                                &t[i]));
    }
    TH_OK(llmcl_fill(ctx, t[0], 1.5));
    TH_FAILS(llmcl_copy(ctx, t[0], t[1]), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_axpy(ctx, 1.0f, t[1], t[0]), LLMCL_ERROR_INVALID_ARGUMENT);
    /* views keep their base's place: 0's float at byte `align` is 1's first */
    llmcl_tensor *first_of_1, *same_in_0;
    TH_OK(llmcl_tensor_view(t[1], 1, (const int64_t[]){1}, NULL, 0, &first_of_1));
    TH_OK(llmcl_tensor_view(t[0], 1, (const int64_t[]){1}, NULL, (int64_t)(align / 4),
                            &same_in_0));
    TH_FAILS(llmcl_copy(ctx, same_in_0, first_of_1), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_copy(ctx, t[0], t[2]));
    double *got = th_download_new(t[2]);
    for (size_t i = 0; i < n; ++i)
        assert_true(got[i] == 1.5);
    free(got);
    llmcl_tensor_destroy(first_of_1), llmcl_tensor_destroy(same_in_0);
    for (int i = 0; i < 3; ++i)
        llmcl_tensor_destroy(t[i]), clReleaseMemObject(sub[i]);
    clReleaseMemObject(parent);
}

static void test_application_objects(void **state)
{
    (void)state;
    cl_device_id dev = llmcl_ctx_cl_device(th_ctx());
    cl_int err;
    cl_context context = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_command_queue queue = clCreateCommandQueue(context, dev, 0, &err); /* no profiling */
    assert_int_equal(err, CL_SUCCESS);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create_from_cl(context, dev, queue, &ctx));
    assert_ptr_equal(llmcl_ctx_cl_queue(ctx), queue);
    /* the application's buffer, wrapped, filled by the library */
    cl_mem buf = clCreateBuffer(context, CL_MEM_READ_WRITE, 64 * sizeof(float), NULL, &err);
    const int64_t shape[] = {8, 8};
    llmcl_tensor *t = NULL;
    TH_OK(llmcl_tensor_wrap(ctx, buf, LLMCL_F32, 2, shape, NULL, 0, &t));
    TH_OK(llmcl_fill(ctx, t, 2.5));
    float host[64];
    assert_int_equal(clEnqueueReadBuffer(queue, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL),
                     CL_SUCCESS);
    for (int i = 0; i < 64; ++i)
        assert_true(host[i] == 2.5f);
    llmcl_memory_stats ms;
    TH_OK(llmcl_memory_stats_get(ctx, &ms));
    assert_int_equal(ms.current_bytes, 0); /* wrapped buffers are the application's */
    assert_int_equal(llmcl_profile_begin(ctx), LLMCL_ERROR_UNSUPPORTED);
    /* a buffer of the application's context cannot be wrapped into the shared test context */
    assert_int_equal(llmcl_tensor_wrap(th_ctx(), buf, LLMCL_F32, 2, shape, NULL, 0, &t),
                     LLMCL_ERROR_DEVICE_MISMATCH);
    llmcl_tensor_destroy(t);
    llmcl_ctx_destroy(ctx);
    /* the context retained, not owned, the application's objects */
    assert_int_equal(clReleaseMemObject(buf), CL_SUCCESS);
    assert_int_equal(clFinish(queue), CL_SUCCESS);
    /* a queue of another context is refused */
    assert_int_equal(llmcl_ctx_create_from_cl(llmcl_ctx_cl_context(th_ctx()), dev, queue, &ctx),
                     LLMCL_ERROR_DEVICE_MISMATCH);
    assert_int_equal(llmcl_ctx_create_from_cl(context, dev, NULL, &ctx), LLMCL_ERROR_INVALID_ARGUMENT);
    /* so is an out-of-order queue, where the device offers one */
    cl_command_queue unordered =
        clCreateCommandQueue(context, dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        assert_int_equal(llmcl_ctx_create_from_cl(context, dev, unordered, &ctx),
                         LLMCL_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(llmcl_last_error(NULL), "in order"));
        clReleaseCommandQueue(unordered);
    }
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
}

static bool device_is_gpu(cl_device_id device)
{
    cl_device_type type = 0;
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    return (type & CL_DEVICE_TYPE_GPU) != 0;
}

/* A rank's node-local index picks the (index mod N)-th of the N devices of the default one's
   platform and kind, unless LLMCL_DEVICE names a device, which every index then gets. */
static void test_select_local(void **state)
{
    (void)state;
    cl_platform_id p0, p1;
    cl_device_id d0, d1, dn;
    saved_env d = env_set("LLMCL_DEVICE", NULL);
    TH_OK(llmcl_device_select(&p0, &d0));
    TH_OK(llmcl_device_select_local(0, &p1, &d1));
    assert_ptr_equal(p1, p0);
    assert_ptr_equal(d1, d0);
    cl_device_id all[64];
    cl_uint n = 0, like = 0;
    clGetDeviceIDs(p0, CL_DEVICE_TYPE_ALL, 64, all, &n);
    const bool gpu = device_is_gpu(d0);
    for (cl_uint i = 0; i < n && i < 64; ++i)
        like += device_is_gpu(all[i]) == gpu;
    TH_OK(llmcl_device_select_local((int)like, &p1, &dn)); /* wraps around */
    assert_ptr_equal(dn, d0);
    llmcl_ctx *ctx = (llmcl_ctx *)&ctx;
    TH_OK(llmcl_ctx_create_local(0, &ctx));
    assert_ptr_equal(llmcl_ctx_cl_device(ctx), d0);
    llmcl_ctx_destroy(ctx);
    env_restore(&d);
    d = env_set("LLMCL_DEVICE", "0");
    TH_OK(llmcl_device_select(&p0, &d0));
    TH_OK(llmcl_device_select_local(5, &p1, &d1));
    assert_ptr_equal(d1, d0);
    env_restore(&d);
    TH_FAILS(llmcl_device_select_local(-1, &p1, &d1), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(NULL), "-1"));
    TH_FAILS(llmcl_device_select_local(0, NULL, &d1), LLMCL_ERROR_INVALID_ARGUMENT);
    ctx = (llmcl_ctx *)&ctx;
    TH_FAILS(llmcl_ctx_create_local(-1, &ctx), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_null(ctx);
    TH_FAILS(llmcl_ctx_create_local(0, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
}

/* The tensor-core rate: refused without tensor cores, a positive rate with them. */
static void test_mma_rate(void **state)
{
    (void)state;
    double tflops = -1.0;
    TH_FAILS(llmcl_measure_mma_rate(NULL, &tflops), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_measure_mma_rate(th_ctx(), NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    if (!llmcl_ctx_device_info(th_ctx())->has_mma) {
        TH_FAILS(llmcl_measure_mma_rate(th_ctx(), &tflops), LLMCL_ERROR_UNSUPPORTED);
        assert_non_null(strstr(llmcl_last_error(th_ctx()), "has_mma"));
        assert_true(tflops == -1.0);
        return;
    }
    TH_OK(llmcl_measure_mma_rate(th_ctx(), &tflops));
    assert_true(tflops > 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_select_by_name_substring),
        cmocka_unit_test(test_select_no_match),
        cmocka_unit_test(test_select_by_index),
        cmocka_unit_test(test_select_local),
        cmocka_unit_test(test_select_platform_aliases),
        cmocka_unit_test(test_bad_memory_limit_env),
        cmocka_unit_test(test_application_objects),
        cmocka_unit_test(test_sub_buffers),
        cmocka_unit_test(test_mma_rate),
    };
    return TH_RUN(tests);
}
