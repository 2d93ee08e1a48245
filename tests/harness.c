/* harness.c: the shared test helpers declared in harness.h. */
#include "harness.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static llmcl_ctx *shared_ctx;

llmcl_ctx *th_ctx(void)
{
    if (shared_ctx)
        return shared_ctx;
    llmcl_status st = llmcl_ctx_create(&shared_ctx);
    if (st != LLMCL_OK) {
        fprintf(stderr, "skipping: no usable OpenCL device (%s)\n", llmcl_last_error(NULL));
        exit(77);
    }
    return shared_ctx;
}

void th_kernel_option(int argc, char **argv)
{
    if (argc < 2)
        return;
    if (strcmp(argv[1], "--cp-async") == 0) {
        /* asks a context whether the device has TMA, then gives the tests one without it */
        if (!llmcl_ctx_device_info(th_ctx())->has_tma)
            exit(77);
        th_teardown(NULL);
        setenv("LLMCL_TMA", "0", 1);
        return;
    }
    if (strcmp(argv[1], "--mma-sync") != 0)
        return;
    setenv("LLMCL_WGMMA", "0", 1);
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    if (!info->has_mma || info->nv_cc_major != 9 || info->nv_cc_minor != 0)
        exit(77);
}

void th_filter_tests(void)
{
    const char *pattern = getenv("LLMCL_TEST_FILTER");
    if (pattern && *pattern)
        cmocka_set_test_filter(pattern);
}

int th_teardown(void **state)
{
    (void)state;
    llmcl_ctx_destroy(shared_ctx);
    shared_ctx = NULL;
    return 0;
}

void th_loop_limit(const char *value)
{
    th_teardown(NULL);
    if (value)
        setenv("LLMCL_LOOP_LIMIT", value, 1);
    else
        unsetenv("LLMCL_LOOP_LIMIT");
}

/* ---- random numbers ---- */

th_rng th_rng_new(uint64_t seed) { return util_rng_new(seed); }

double th_uniform(th_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * util_bits_to_unit(util_rng_next(r));
}

double th_normal(th_rng *r)
{
    double u = th_uniform(r, 1e-300, 1.0), v = th_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t th_randint(th_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(util_rng_next(r) % (uint64_t)(hi - lo));
}

void th_fill_uniform(th_rng *r, double *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = th_uniform(r, lo, hi);
}

void th_fill_normal(th_rng *r, double *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = scale * th_normal(r);
}

/* ---- dtypes ---- */

double th_round(llmcl_dtype dtype, double x)
{
    switch (dtype) {
    case LLMCL_F32:
        return (float)x;
    case LLMCL_BF16:
        return llmcl_bf16_to_f32(llmcl_f32_to_bf16((float)x));
    case LLMCL_F16:
        return llmcl_f16_to_f32(llmcl_f32_to_f16((float)x));
    case LLMCL_I32:
        return (double)(int32_t)x;
    case LLMCL_I64:
        return (double)(int64_t)x;
    default:
        fail_msg("th_round: bad dtype %d", (int)dtype);
        return 0;
    }
}

void th_round_all(llmcl_dtype dtype, double *x, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = th_round(dtype, x[i]);
}

void th_upload_sixteenths(int count, double *const *xs, const size_t *ns, llmcl_tensor *const *ts)
{
    for (int k = 0; k < count; ++k) {
        if (!xs[k])
            continue;
        for (size_t i = 0; i < ns[k]; ++i)
            xs[k][i] = round(xs[k][i] * 16) / 16;
        th_upload(ts[k], xs[k]);
    }
}

double *th_new_uniform(th_rng *r, size_t n, double lo, double hi, llmcl_dtype dt)
{
    double *x = th_alloc(n * sizeof *x);
    th_fill_uniform(r, x, n, lo, hi);
    th_round_all(dt, x, n);
    return x;
}

double *th_new_normal(th_rng *r, size_t n, double scale, llmcl_dtype dt)
{
    double *x = th_alloc(n * sizeof *x);
    th_fill_normal(r, x, n, scale);
    th_round_all(dt, x, n);
    return x;
}

/* ---- tensors ---- */

void *th_alloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    assert_non_null(p);
    return p;
}

void th_check_status(llmcl_status got, llmcl_status expected, const char *expr, const char *file,
                     int line)
{
    const char *msg = llmcl_last_error(th_ctx());
    if (got != expected && got == LLMCL_ERROR_BUILD_FAILURE)
        print_error("build log:\n%s\n", llmcl_build_log(th_ctx()));
    if (got != expected)
        fail_msg("%s:%d: %s returned %d (%s), expected %d (%s); last error: %s", file, line, expr,
                 (int)got, llmcl_status_str(got), (int)expected, llmcl_status_str(expected), msg);
    if (expected != LLMCL_OK && msg[0] == '\0' && llmcl_last_error(NULL)[0] == '\0')
        fail_msg("%s:%d: %s failed without a message", file, line, expr);
}

int th_launched(const char *kernel, llmcl_dtype dt, const char *cls)
{
    char used[256];
    int launched = 0;
    TH_OK(llmcl_tune_params_get(th_ctx(), kernel, dt, cls, used, sizeof used, &launched));
    return launched;
}

void th_params_used(const char *kernel, llmcl_dtype dt, const char *cls, char *buf, size_t n)
{
    int launched = 0;
    TH_OK(llmcl_tune_params_get(th_ctx(), kernel, dt, cls, buf, n, &launched));
    assert_int_equal(launched, 1);
}

void th_tune_db_load_text(const char *json)
{
    char path[] = "/tmp/llmcl-tune-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    const ssize_t n = write(fd, json, strlen(json));
    close(fd);
    assert_int_equal(n, (ssize_t)strlen(json));
    const llmcl_status st = llmcl_tune_db_load(th_ctx(), path);
    remove(path);
    TH_OK(st);
}

void th_assert_launched_with(const char *kernel, llmcl_dtype dt, const char *cls, const char *set)
{
    char used[256], want[128];
    th_params_used(kernel, dt, cls, used, sizeof used);
    snprintf(want, sizeof want, "%s", set);
    for (char *tok = strtok(want, " "); tok; tok = strtok(NULL, " "))
        if (strstr(used, tok) == NULL)
            fail_msg("%s launched with %s, not %s", kernel, used, set);
}

int th_files_starting(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

void th_poison(llmcl_tensor *t)
{
    cl_mem mem = llmcl_tensor_cl_mem(t);
    size_t size = 0;
    assert_int_equal(clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL), CL_SUCCESS);
    unsigned char *bytes = th_alloc(size);
    memset(bytes, 0xff, size);
    assert_int_equal(clEnqueueWriteBuffer(llmcl_ctx_cl_queue(th_ctx()), mem, CL_TRUE, 0, size, bytes,
                                          0, NULL, NULL),
                     CL_SUCCESS);
    free(bytes);
}

llmcl_tensor *th_tensor(llmcl_dtype dtype, int ndim, const int64_t *shape)
{
    llmcl_tensor *t = NULL;
    TH_OK(llmcl_tensor_create(th_ctx(), dtype, ndim, shape, &t));
    th_poison(t);
    return t;
}

llmcl_tensor *th_tensor_from(llmcl_dtype dtype, int ndim, const int64_t *shape, const double *values)
{
    llmcl_tensor *t = th_tensor(dtype, ndim, shape);
    th_upload(t, values);
    return t;
}

void th_upload(llmcl_tensor *t, const double *values)
{
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    const size_t n = (size_t)llmcl_tensor_numel(t), es = llmcl_dtype_size(dt);
    unsigned char *buf = th_alloc(n * es);
    for (size_t i = 0; i < n; ++i) {
        const double v = values[i];
        if (dt == LLMCL_F32) {
            float f = (float)v;
            memcpy(buf + i * es, &f, es);
        } else if (dt == LLMCL_BF16 || dt == LLMCL_F16) {
            uint16_t h = dt == LLMCL_BF16 ? llmcl_f32_to_bf16((float)v) : llmcl_f32_to_f16((float)v);
            memcpy(buf + i * es, &h, es);
        } else if (dt == LLMCL_I32) {
            int32_t x = (int32_t)v;
            memcpy(buf + i * es, &x, es);
        } else {
            int64_t x = (int64_t)v;
            memcpy(buf + i * es, &x, es);
        }
    }
    TH_OK(llmcl_tensor_upload(t, buf, n * es));
    free(buf);
}

double *th_download_new(const llmcl_tensor *t)
{
    double *x = th_alloc((size_t)llmcl_tensor_numel(t) * sizeof *x);
    th_download(t, x);
    return x;
}

double th_max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        m = fmax(m, fabs(x[i]));
    return m;
}

void th_download(const llmcl_tensor *t, double *values)
{
    const llmcl_dtype dt = llmcl_tensor_dtype(t);
    const size_t n = (size_t)llmcl_tensor_numel(t), es = llmcl_dtype_size(dt);
    unsigned char *buf = th_alloc(n * es);
    TH_OK(llmcl_tensor_download(t, buf, n * es));
    for (size_t i = 0; i < n; ++i) {
        if (dt == LLMCL_F32) {
            float f;
            memcpy(&f, buf + i * es, es);
            values[i] = f;
        } else if (dt == LLMCL_BF16 || dt == LLMCL_F16) {
            uint16_t h;
            memcpy(&h, buf + i * es, es);
            values[i] = dt == LLMCL_BF16 ? llmcl_bf16_to_f32(h) : llmcl_f16_to_f32(h);
        } else if (dt == LLMCL_I32) {
            int32_t x;
            memcpy(&x, buf + i * es, es);
            values[i] = x;
        } else {
            int64_t x;
            memcpy(&x, buf + i * es, es);
            values[i] = (double)x;
        }
    }
    free(buf);
}

/* ---- comparisons ---- */

th_tol th_grad_tol(llmcl_dtype dtype, const double *ref, size_t n)
{
    const double m = th_max_abs(ref, n);
    switch (dtype) {
    case LLMCL_BF16:
        return (th_tol){8e-3 * m, 1.6e-2};
    case LLMCL_F16:
        return (th_tol){2e-3 * m, 4e-3};
    default:
        return (th_tol){2e-5 * m + 1e-12, 2e-4};
    }
}

th_tol th_tol_for(llmcl_dtype dtype)
{
    switch (dtype) {
    case LLMCL_BF16:
        return (th_tol){1e-2, 1.6e-2};
    case LLMCL_F16:
        return (th_tol){1e-3, 2e-3};
    case LLMCL_F32:
        return (th_tol){1e-5, 1e-5};
    default:
        return (th_tol){0, 0};
    }
}

size_t th_compare(const char *what, const double *ref, const double *got, size_t n, th_tol tol)
{
    size_t bad = 0, worst = 0;
    double worst_diff = 0;
    for (size_t i = 0; i < n; ++i) {
        const double r = ref[i], g = got[i];
        bool ok;
        if (isnan(r))
            ok = isnan(g);
        else if (isinf(r))
            ok = g == r;
        else
            ok = !isnan(g) && !isinf(g) && fabs(g - r) <= tol.atol + tol.rtol * fabs(r);
        const double diff = isnan(g) ? INFINITY : fabs(g - r);
        if (diff > worst_diff || (i == 0)) {
            worst_diff = diff;
            worst = i;
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s[%zu]: got %.9g, expected %.9g (diff %.3g, allowed %.3g)\n", what, i,
                    g, r, diff, tol.atol + tol.rtol * fabs(r));
    }
    if (bad)
        fprintf(stderr, "  %s: %zu of %zu values out of tolerance; largest difference %.3g at %zu\n",
                what, bad, n, worst_diff, worst);
    return bad;
}
