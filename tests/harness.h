/*
 * harness.h: what every cmocka test executable shares. One context per process on the device the
 * LLMCL_PLATFORM / LLMCL_DEVICE variables select (exit 77, a skip, when there is none), seeded random
 * inputs, poisoned outputs, dtype rounding, and an abs + rel comparison against double references.
 */
#ifndef LLMCL_TEST_HARNESS_H
#define LLMCL_TEST_HARNESS_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "llmcl.h"
#include "util/util.h"

/* The shared context, created on first use. Exits 77 when no usable device exists. */
llmcl_ctx *th_ctx(void);

/* Releases the shared context; cmocka group teardowns call it (or the process exits). */
int th_teardown(void **state);

/*
 * --mma-sync (the suites' second run of the tensor-core tests, matmul_mma_sync,
 * cross_entropy_mma_sync and attention_mma_sync): the kernels on mma.sync where wgmma would run
 * (LLMCL_WGMMA=0). --cp-async (matmul_cp_async, cross_entropy_cp_async, attention_cp_async):
 * wgmma's copies by cp.async where TMA would make them (LLMCL_TMA=0). Each exits 77, a skip, where
 * its run would repeat the plain one: on devices without wgmma, or without TMA for --cp-async.
 */
void th_kernel_option(int argc, char **argv);

/*
 * Sets LLMCL_LOOP_LIMIT (NULL: unsets it) and releases the shared context, so that the next
 * th_ctx() has that loop limit: the launchers then split long loops on any device as they must
 * where the device cuts loops short (rusticl's llvmpipe).
 */
void th_loop_limit(const char *value);

/* LLMCL_TEST_FILTER, where set: only the tests whose names match it run (cmocka's * and ?). */
void th_filter_tests(void);

/* Runs a cmocka group with th_ctx() created first (so a missing device skips the whole file). */
#define TH_RUN(tests)                                                                             \
    (th_ctx(), th_filter_tests(), cmocka_run_group_tests((tests), NULL, th_teardown))

/* ---- random inputs from fixed seeds (util.h's xoshiro256**) ---- */

typedef util_rng th_rng;

th_rng th_rng_new(uint64_t seed);
double th_uniform(th_rng *r, double lo, double hi);
double th_normal(th_rng *r);
int64_t th_randint(th_rng *r, int64_t lo, int64_t hi); /* in [lo, hi) */
void th_fill_uniform(th_rng *r, double *x, size_t n, double lo, double hi);
void th_fill_normal(th_rng *r, double *x, size_t n, double scale);

/* n new values (th_alloc'd), uniform in [lo, hi) or normal with sd scale, rounded to what dt
   stores: a kernel's random inputs as the device and its reference both see them. */
double *th_new_uniform(th_rng *r, size_t n, double lo, double hi, llmcl_dtype dt);
double *th_new_normal(th_rng *r, size_t n, double scale, llmcl_dtype dt);

/* ---- dtypes ---- */

/* x rounded to what dtype stores (round-to-nearest-even for bf16 and f16, truncation for ints). */
double th_round(llmcl_dtype dtype, double x);

/* x rounded in place, so references see exactly the inputs the device sees. */
void th_round_all(llmcl_dtype dtype, double *x, size_t n);

/* ---- tensors ---- */

/* A new contiguous tensor, poisoned. Asserts on failure. */
llmcl_tensor *th_tensor(llmcl_dtype dtype, int ndim, const int64_t *shape);

/* A new contiguous tensor holding values rounded to dtype. */
llmcl_tensor *th_tensor_from(llmcl_dtype dtype, int ndim, const int64_t *shape, const double *values);

/* Fills every byte of t's whole buffer with 0xFF: NaN for floats, -1 for integers. */
void th_poison(llmcl_tensor *t);

/* Uploads / downloads numel values converted from / to double (strides honoured). */
void th_upload(llmcl_tensor *t, const double *values);
/* The linear products' inputs xs[k] (ns[k] values, NULL: none) rounded to multiples of 1/16,
   exact in every 16-bit dtype, then uploaded into ts[k]: products of a few of them are exact in
   f32, so a 16-bit result rounds as its reference does. */
void th_upload_sixteenths(int count, double *const *xs, const size_t *ns, llmcl_tensor *const *ts);
void th_download(const llmcl_tensor *t, double *values);
/* A new array of t's numel values (free() it). */
double *th_download_new(const llmcl_tensor *t);
/* The largest |x[i]|. */
double th_max_abs(const double *x, size_t n);

/* ---- comparisons ---- */

typedef struct th_tol {
    double atol, rtol;
} th_tol;

/* Default tolerance for outputs stored in dtype, with f32 math inside. */
th_tol th_tol_for(llmcl_dtype dtype);
/* Gradients over many terms stored in dtype: slack relative to the largest |ref|, plus dtype's
   rounding. */
th_tol th_grad_tol(llmcl_dtype dtype, const double *ref, size_t n);

/*
 * Counts elements with |got - ref| > atol + rtol * |ref| (a NaN in got fails unless ref is NaN; inf
 * must match exactly). Prints the first few failures and the largest difference.
 */
size_t th_compare(const char *what, const double *ref, const double *got, size_t n, th_tol tol);

/* The tolerance is variadic so that a compound literal such as (th_tol){0, 0} can be passed. */
#define TH_ASSERT_CLOSE(what, ref, got, n, ...)                                                   \
    assert_int_equal(th_compare((what), (ref), (got), (n), (__VA_ARGS__)), 0)

/* Asserts a call succeeded, printing llmcl_last_error() when it did not. */
#define TH_OK(expr) th_check_status((expr), LLMCL_OK, #expr, __FILE__, __LINE__)

/* Asserts a call failed with exactly `expected` and left a non-empty message. */
#define TH_FAILS(expr, expected) th_check_status((expr), (expected), #expr, __FILE__, __LINE__)

void th_check_status(llmcl_status got, llmcl_status expected, const char *expr, const char *file,
                     int line);

/* Whether kernel has launched at (dtype, class or size key cls): 0 or 1. */
int th_launched(const char *kernel, llmcl_dtype dt, const char *cls);

/* The parameters of kernel's last launch at (dtype, class or size key cls) into buf; asserts it
   launched. */
void th_params_used(const char *kernel, llmcl_dtype dt, const char *cls, char *buf, size_t n);

/* Asserts kernel's last launch at (dtype, cls) was built with every NAME=VALUE of set. */
void th_assert_launched_with(const char *kernel, llmcl_dtype dt, const char *cls, const char *set);

/* How many entries of folder dir have names that start with prefix. */
int th_files_starting(const char *dir, const char *prefix);

/* Loads a tuning file of the given JSON text into the shared context (through a temporary file). */
void th_tune_db_load_text(const char *json);

/* calloc that asserts. */
void *th_alloc(size_t bytes);

#endif
