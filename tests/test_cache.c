/*
 * test_cache.c: the two-level program cache. Each test uses its own LLMCL_CACHE_DIR and fresh
 * contexts: a build writes an entry, a new context loads it, other options build anew, truncated,
 * corrupt and foreign entries are ignored and rebuilt, "off" writes nothing, binaries off
 * (LLMCL_CACHE_BINARIES=0) keep none, and contexts on
 * several threads at once (one each, as llmcl.h asks) build and store one program. These run with
 * PoCL's own kernel cache off, where llmcl keeps PoCL's binaries too.
 * With --pocl-kernel-cache (the suite's cache_pocl), PoCL's cache on as it is by default: llmcl
 * stores nothing and each kernel launched is compiled once (skipped on other platforms).
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static char cache_dir[64];

static void make_cache_dir(void)
{
    snprintf(cache_dir, sizeof cache_dir, "/tmp/llmcl-cache-XXXXXX");
    assert_non_null(mkdtemp(cache_dir));
    setenv("LLMCL_CACHE_DIR", cache_dir, 1);
}

static bool remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0;
}

static void remove_cache_dir(void)
{
    assert_true(remove_dir(cache_dir));
    unsetenv("LLMCL_CACHE_DIR");
}

/* Entries (*.bin) in the cache folder; names of the first `cap` go to names. */
static int list_entries(char names[][512], int cap)
{
    DIR *d = opendir(cache_dir);
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".bin") == 0) {
            if (n < cap)
                snprintf(names[n], 512, "%s/%s", cache_dir, e->d_name);
            ++n;
        } else if (e->d_name[0] != '.') {
            fail_msg("stray file in the cache: %s", e->d_name); /* temp files must be renamed */
        }
    }
    closedir(d);
    return n;
}

/* In a fresh context: fill a tensor of dtype with 3 and check it; returns the cache counters. */
static llmcl_cache_stats run_fill(llmcl_dtype dtype)
{
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    const int64_t shape[] = {1000};
    llmcl_tensor *t = NULL;
    TH_OK(llmcl_tensor_create(ctx, dtype, 1, shape, &t));
    TH_OK(llmcl_fill(ctx, t, 3.0));
    TH_OK(llmcl_fill(ctx, t, 3.0)); /* the second launch is a memory hit */
    double *got = th_alloc(1000 * sizeof *got);
    const size_t es = llmcl_dtype_size(dtype);
    unsigned char *raw = th_alloc(1000 * es);
    TH_OK(llmcl_tensor_download(t, raw, 1000 * es));
    for (int i = 0; i < 1000; ++i) {
        float f;
        if (dtype == LLMCL_F32)
            memcpy(&f, raw + 4 * i, 4);
        else
            f = llmcl_bf16_to_f32((uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8));
        assert_true(f == 3.0f);
    }
    llmcl_cache_stats s;
    TH_OK(llmcl_cache_stats_get(ctx, &s));
    free(raw);
    free(got);
    llmcl_tensor_destroy(t);
    llmcl_ctx_destroy(ctx);
    return s;
}

static void test_hit_after_build(void **state)
{
    (void)state;
    make_cache_dir();
    llmcl_cache_stats s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1);
    assert_int_equal(s.disk_hits, 0);
    assert_int_equal(s.memory_hits, 1);
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 1);
    s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 0);
    assert_int_equal(s.disk_hits, 1);
    assert_int_equal(s.disk_rejects, 0);
    /* other options (another dtype define) are another entry */
    s = run_fill(LLMCL_BF16);
    assert_int_equal(s.builds, 1);
    assert_int_equal(list_entries(names, 4), 2);
    remove_cache_dir();
}

enum { THREADS = 4 };

/* One thread's fresh context: a fill of 1000 f32 with 3, checked; what failed, or NULL. run_fill's
   work without its asserts, which belong to cmocka's thread. */
static void *fill_on_thread(void *why)
{
    llmcl_ctx *ctx = NULL;
    llmcl_tensor *t = NULL;
    const int64_t shape[] = {1000};
    float got[1000];
    const char *failed = NULL;
    if (llmcl_ctx_create(&ctx) != LLMCL_OK)
        failed = "llmcl_ctx_create";
    else if (llmcl_tensor_create(ctx, LLMCL_F32, 1, shape, &t) != LLMCL_OK ||
             llmcl_fill(ctx, t, 3.0) != LLMCL_OK ||
             llmcl_tensor_download(t, got, sizeof got) != LLMCL_OK)
        failed = "a fill";
    for (int i = 0; failed == NULL && i < 1000; ++i)
        if (got[i] != 3.0f)
            failed = "a wrong value";
    if (failed)
        snprintf(why, 512, "%s: %s", failed, ctx ? llmcl_last_error(ctx) : llmcl_last_error(NULL));
    llmcl_tensor_destroy(t);
    llmcl_ctx_destroy(ctx);
    return failed ? why : NULL;
}

/* Contexts on THREADS threads build the same program into an empty cache at once: each runs, the
   cache holds its one entry whole (no temporary file is left), and the next context loads it. */
static void test_contexts_on_threads(void **state)
{
    (void)state;
    make_cache_dir();
    pthread_t threads[THREADS];
    char why[THREADS][512];
    for (int i = 0; i < THREADS; ++i)
        assert_int_equal(pthread_create(&threads[i], NULL, fill_on_thread, why[i]), 0);
    for (int i = 0; i < THREADS; ++i) {
        void *failed = NULL;
        assert_int_equal(pthread_join(threads[i], &failed), 0);
        if (failed)
            fail_msg("thread %d: %s", i, (const char *)failed);
    }
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 1);
    llmcl_cache_stats s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 0);
    assert_int_equal(s.disk_hits, 1);
    assert_int_equal(s.disk_rejects, 0);
    remove_cache_dir();
}

static void overwrite(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = th_alloc(*len);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

/* A damaged entry is rejected, rebuilt and rewritten, so the run after it hits again. */
static void expect_rejected_then_healed(llmcl_dtype dtype)
{
    llmcl_cache_stats s = run_fill(dtype);
    assert_int_equal(s.disk_rejects, 1);
    assert_int_equal(s.builds, 1);
    s = run_fill(dtype);
    assert_int_equal(s.disk_hits, 1);
    assert_int_equal(s.disk_rejects, 0);
}

static void test_bad_entries_are_rebuilt(void **state)
{
    (void)state;
    make_cache_dir();
    run_fill(LLMCL_F32);
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 1);
    size_t len;
    unsigned char *good = slurp(names[0], &len);

    overwrite(names[0], good, len / 2); /* truncated */
    expect_rejected_then_healed(LLMCL_F32);

    unsigned char *bad = th_alloc(len);
    memcpy(bad, good, len);
    bad[len - 10] ^= 0x5a; /* one flipped byte in the binary: checksum */
    overwrite(names[0], bad, len);
    expect_rejected_then_healed(LLMCL_F32);

    memset(bad, 0x33, len); /* garbage */
    overwrite(names[0], bad, len);
    expect_rejected_then_healed(LLMCL_F32);

    overwrite(names[0], "", 0); /* empty */
    expect_rejected_then_healed(LLMCL_F32);

    /* the header alone and 4 bytes, its binary length the one that makes header + descriptor +
       binary wrap to the file's size in 64 bits: the descriptor must not be read past the file
       (an ASan build sees it) */
    uint64_t dlen;
    memcpy(&dlen, good + 24, sizeof dlen); /* after the magic and the hash's two halves */
    assert_true(dlen > 4);
    const uint64_t wrapped = (uint64_t)0 - (dlen - 4);
    memcpy(bad, good, 52);
    memcpy(bad + 32, &wrapped, sizeof wrapped);
    overwrite(names[0], bad, 52);
    expect_rejected_then_healed(LLMCL_F32);

    /* a foreign entry: the bf16 program's file under the f32 program's name */
    run_fill(LLMCL_BF16);
    assert_int_equal(list_entries(names, 4), 2);
    size_t l0, l1;
    unsigned char *e0 = slurp(names[0], &l0), *e1 = slurp(names[1], &l1);
    overwrite(names[0], e1, l1);
    overwrite(names[1], e0, l0);
    expect_rejected_then_healed(LLMCL_F32);
    expect_rejected_then_healed(LLMCL_BF16);
    free(e0);
    free(e1);
    free(bad);
    free(good);
    remove_cache_dir();
}

static void test_disabled(void **state)
{
    (void)state;
    make_cache_dir();
    setenv("LLMCL_CACHE_DIR", "off", 1);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    assert_string_equal(llmcl_cache_dir(ctx), "");
    llmcl_ctx_destroy(ctx);
    llmcl_cache_stats s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1);
    s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1);
    assert_int_equal(s.disk_hits, 0);
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 0);
    remove_cache_dir();
}

/* LLMCL_CACHE_BINARIES=0 (the tuner's setting): the folder stays in use (its tuning files load)
   but keeps no programs; values other than 0 and 1 fail the context, as does a folder's name too
   long to hold. */
static void test_binaries_off(void **state)
{
    (void)state;
    make_cache_dir();
    setenv("LLMCL_CACHE_BINARIES", "0", 1);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    assert_string_equal(llmcl_cache_dir(ctx), cache_dir);
    llmcl_ctx_destroy(ctx);
    llmcl_cache_stats s = run_fill(LLMCL_F32);
    s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1);
    assert_int_equal(s.disk_hits, 0);
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 0);
    setenv("LLMCL_CACHE_BINARIES", "yes", 1);
    assert_int_equal(llmcl_ctx_create(&ctx), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(NULL), "LLMCL_CACHE_BINARIES"));
    unsetenv("LLMCL_CACHE_BINARIES");
    char longer[1100];
    memset(longer, 'd', sizeof longer - 1);
    longer[0] = '/', longer[sizeof longer - 1] = '\0';
    setenv("LLMCL_CACHE_DIR", longer, 1);
    assert_int_equal(llmcl_ctx_create(&ctx), LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(NULL), "the cache folder from LLMCL_CACHE_DIR"));
    remove_cache_dir();
}

static void test_default_location(void **state)
{
    (void)state;
    unsetenv("LLMCL_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/tmp/llmcl-xdg-test", 1);
    llmcl_ctx *ctx = NULL;
    TH_OK(llmcl_ctx_create(&ctx));
    assert_string_equal(llmcl_cache_dir(ctx), "/tmp/llmcl-xdg-test/llmcl");
    llmcl_ctx_destroy(ctx);
    unsetenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (home) {
        char want[512];
        snprintf(want, sizeof want, "%s/.cache/llmcl", home);
        TH_OK(llmcl_ctx_create(&ctx));
        assert_string_equal(llmcl_cache_dir(ctx), want);
        llmcl_ctx_destroy(ctx);
    }
}

/* Files named *.so under dir: the kernels PoCL has compiled, one for each work-group function. */
static int count_compiled_kernels(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.so' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    assert_int_equal(pclose(p), 0);
    return n;
}

/* PoCL's kernel cache for --pocl-kernel-cache, of this process alone so that it starts empty. */
static char pocl_dir[64];

/*
 * PoCL's kernel cache keeps the build, so llmcl stores nothing; and asking PoCL for a binary would
 * compile every kernel of the program once more, for nothing, as generic work-group functions:
 * one fill launched leaves one compiled kernel beside what context creation compiles (the loop
 * limit's probe), and the next context compiles none.
 */
static void test_pocl_compiles_once(void **state)
{
    (void)state;
    make_cache_dir();
    llmcl_ctx *bare = NULL;
    TH_OK(llmcl_ctx_create(&bare));
    llmcl_ctx_destroy(bare);
    const int at_creation = count_compiled_kernels(pocl_dir);
    llmcl_cache_stats s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1);
    assert_int_equal(count_compiled_kernels(pocl_dir), at_creation + 1);
    char names[4][512];
    assert_int_equal(list_entries(names, 4), 0);
    s = run_fill(LLMCL_F32);
    assert_int_equal(s.builds, 1); /* from source again: PoCL's cache has the front end's output */
    assert_int_equal(s.disk_hits, 0);
    assert_int_equal(count_compiled_kernels(pocl_dir), at_creation + 1);
    remove_cache_dir();
    assert_true(remove_dir(pocl_dir));
}

static int run_with_pocl_kernel_cache(void)
{
    snprintf(pocl_dir, sizeof pocl_dir, "/tmp/llmcl-pocl-cache-XXXXXX");
    if (!mkdtemp(pocl_dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("POCL_CACHE_DIR", pocl_dir, 1); /* PoCL reads it once, when the first context starts it */
    unsetenv("POCL_KERNEL_CACHE");
    if (llmcl_ctx_device_info(th_ctx())->vendor_id != LLMCL_VENDOR_POCL) {
        fprintf(stderr, "skipping: the device is not PoCL's\n");
        return remove_dir(pocl_dir) ? 77 : 1; /* PoCL may have started there all the same */
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pocl_compiles_once)};
    return TH_RUN(tests);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--pocl-kernel-cache") == 0)
        return run_with_pocl_kernel_cache();
    setenv("POCL_KERNEL_CACHE", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_after_build),
        cmocka_unit_test(test_contexts_on_threads),
        cmocka_unit_test(test_bad_entries_are_rebuilt),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_binaries_off),
        cmocka_unit_test(test_default_location),
    };
    return TH_RUN(tests);
}
