/*
 * test_tune.c: the tuning database and the tuner. Parsing (valid files and their precedence,
 * malformed and foreign files, unknown keys, missing fields, another device), loading from
 * LLMCL_TUNE_DB and the cache directory, overrides reaching real launches, launchers reporting the
 * values they settled on (clamped, or their defaults for an entry that does not fit), the tuner's
 * rejection of planted bad candidates (build failure, limits, wrong results), inputs derived
 * before the reference reaching every buffer set, and llmcl-tune
 * --quick end to end: its file is valid, a context picks it up, and the launches use its
 * parameters. The tuner's kernel table and the built-in tuning files name only the kernel keys and
 * families of llmcl_kernels.h. The tools' whole-or-absent file writes (util_replace_file) and
 * the medians their timings report (util_median), and their text appended to a buffer, cut at its
 * end (util_appendf).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"
#include "tune.h"

static char tmp_dir[64];

static const char *tmp_path(const char *name)
{
    static char paths[8][256];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The device's name as a JSON string literal. */
static const char *dev_name_json(void)
{
    static char buf[512];
    json_t *s = json_string(llmcl_ctx_device_info(th_ctx())->name);
    char *text = json_dumps(s, JSON_ENCODE_ANY);
    snprintf(buf, sizeof buf, "%s", text);
    free(text);
    json_decref(s);
    return buf;
}

/* A tuning file for device (a JSON object literal) with the given entries (a JSON array body). */
static const char *write_db(const char *name, const char *device, const char *entries)
{
    const char *path = tmp_path(name);
    char text[8192];
    snprintf(text, sizeof text,
             "{\"format\": \"llmcl-tuning\", \"version\": 1, \"device\": %s, \"entries\": [%s]}",
             device, entries);
    write_text(path, text);
    return path;
}

static const char *this_device(void)
{
    static char buf[640];
    snprintf(buf, sizeof buf, "{\"name\": %s}", dev_name_json());
    return buf;
}

/* The parameters of kernel at (dtype, shape) as text, and whether a launch used them. */
static const char *params_of(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dt, const char *shape,
                             int *launched)
{
    static char buf[256];
    TH_OK(llmcl_tune_params_get(ctx, kernel, dt, shape, buf, sizeof buf, launched));
    return buf;
}

#define ASSERT_PARAMS(ctx, kernel, dt, shape, want)                                                \
    assert_string_equal(params_of((ctx), (kernel), (dt), (shape), NULL), (want))

/* Whether a "NAME=VALUE ..." list holds tok as a whole item. */
static bool has_token(const char *list, const char *tok)
{
    const size_t n = strlen(tok);
    for (const char *p = strstr(list, tok); p; p = strstr(p + 1, tok))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static llmcl_ctx *ctx_with_env(const char *name, const char *value)
{
    setenv(name, value, 1);
    llmcl_ctx *ctx = NULL;
    llmcl_status st = llmcl_ctx_create(&ctx);
    unsetenv(name);
    TH_OK(st);
    return ctx;
}

/* ---- parsing ---- */

static void test_valid_precedence(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    TH_OK(llmcl_tune_db_clear(ctx));
    char cls_dev[256];
    snprintf(cls_dev, sizeof cls_dev, "{\"name\": \"*\", \"type\": \"%s\"}",
             info->is_gpu ? "gpu" : "cpu");
    /* Loaded from the most to the least specific device, so only specificity can order them. */
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("exact.json", this_device(),
                      "{\"kernel\": \"tst\", \"params\": {\"VEC\": 3}},"
                      "{\"kernel\": \"tst\", \"dtype\": \"f32\", \"params\": {\"ROWS\": 4}},"
                      "{\"kernel\": \"tst\", \"dtype\": \"f32\", \"shape_class\": \"p10\", "
                      "\"params\": {\"WG\": 5}},"
                      "{\"kernel\": \"tst\", \"dtype\": \"f32\", \"shape_class\": \"p14\", "
                      "\"params\": {\"WG\": 6}}")));
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("class.json", cls_dev,
                      "{\"kernel\": \"tst\", \"params\": {\"WG\": 2, \"VEC\": 2}}")));
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("any.json", "{\"name\": \"*\"}",
                      "{\"kernel\": \"tst\", \"dtype\": \"*\", \"shape_class\": \"*\","
                      " \"params\": {\"WG\": 1, \"VEC\": 1, \"ROWS\": 1}}")));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "ROWS=4 VEC=3 WG=5");
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "1024", "ROWS=4 VEC=3 WG=5"); /* a size key: class p10 */
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p11", "ROWS=4 VEC=3 WG=5");  /* nearest tuned class */
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p13", "ROWS=4 VEC=3 WG=6");
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p16", "ROWS=4 VEC=3 WG=6");
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p17", "ROWS=4 VEC=3 WG=2"); /* too far from any */
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "*", "ROWS=4 VEC=3 WG=2");
    ASSERT_PARAMS(ctx, "tst", LLMCL_BF16, "p10", "ROWS=1 VEC=3 WG=2");
    ASSERT_PARAMS(ctx, "other", LLMCL_F32, "p10", "");
    /* At equal specificity the later file wins. */
    TH_OK(llmcl_tune_db_load(ctx, write_db("later.json", this_device(),
                                           "{\"kernel\": \"tst\", \"dtype\": \"f32\", "
                                           "\"shape_class\": \"p10\", \"params\": {\"WG\": 7}}")));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "ROWS=4 VEC=3 WG=7");
    /* Overrides beat every file, replace each other, and go away. */
    TH_OK(llmcl_tune_override(ctx, "tst", LLMCL_BF16, "*", "WG=9"));
    TH_OK(llmcl_tune_override(ctx, "tst", LLMCL_BF16, "*", "WG=10, ROWS=8"));
    ASSERT_PARAMS(ctx, "tst", LLMCL_BF16, "p10", "ROWS=8 VEC=3 WG=10");
    TH_OK(llmcl_tune_override(ctx, "tst", LLMCL_BF16, "*", NULL));
    ASSERT_PARAMS(ctx, "tst", LLMCL_BF16, "p10", "ROWS=1 VEC=3 WG=2");
    TH_OK(llmcl_tune_override(ctx, "tst", LLMCL_F32, "p10", "WG=11"));
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "ROWS=4 VEC=3 WG=7");
    assert_string_equal(llmcl_tune_db_warnings(ctx), "");
    TH_OK(llmcl_tune_db_clear(ctx));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "");
}

/* llmcl_tune_db_reset: loaded files and overrides go, LLMCL_TUNE_DB's files (read anew) return. */
static void test_reset_reloads_startup_files(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    const char *env = write_db("env.json", this_device(),
                               "{\"kernel\": \"tst\", \"params\": {\"WG\": 12}}");
    TH_OK(llmcl_tune_db_load(ctx, write_db("loaded.json", this_device(),
                                           "{\"kernel\": \"tst\", \"params\": {\"VEC\": 4}}")));
    TH_OK(llmcl_tune_override(ctx, "tst", LLMCL_F32, "*", "ROWS=2"));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "ROWS=2 VEC=4");
    const char *outer = getenv("LLMCL_TUNE_DB");
    char *saved = outer ? strdup(outer) : NULL;
    setenv("LLMCL_TUNE_DB", env, 1);
    llmcl_status st = llmcl_tune_db_reset(ctx);
    unsetenv("LLMCL_TUNE_DB");
    TH_OK(st);
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "WG=12");
    st = llmcl_tune_db_reset(ctx); /* without it now: the built-in files alone */
    if (saved)
        setenv("LLMCL_TUNE_DB", saved, 1);
    free(saved);
    TH_OK(st);
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "");
    TH_FAILS(llmcl_tune_db_reset(NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_tune_db_clear(ctx));
}

static void expect_rejected(llmcl_ctx *ctx, const char *path, llmcl_status st, const char *needle)
{
    TH_FAILS(llmcl_tune_db_load(ctx, path), st);
    if (strstr(llmcl_last_error(ctx), needle) == NULL)
        fail_msg("loading %s: expected \"%s\" in \"%s\"", path, needle, llmcl_last_error(ctx));
    assert_non_null(strstr(llmcl_tune_db_warnings(ctx), path));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p10", "WG=3"); /* what was loaded before still holds */
}

static void test_malformed_and_foreign(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    TH_OK(llmcl_tune_db_load(ctx, write_db("base.json", this_device(),
                                           "{\"kernel\": \"tst\", \"params\": {\"WG\": 3}}")));
    const char *p = tmp_path("bad1.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"version\": 1, \"entries\": [");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "malformed JSON at line 1");
    p = tmp_path("empty.json");
    write_text(p, "");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "malformed JSON");
    p = tmp_path("dup.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"format\": \"llmcl-tuning\"}");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "duplicate");
    p = tmp_path("array.json");
    write_text(p, "[1, 2, 3]");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "not a tuning file");
    p = tmp_path("clblast.json"); /* someone else's JSON */
    write_text(p, "{\"kernel_families\": {\"xgemm\": {\"best_parameters\": \"MWG=64\"}}}");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "not a tuning file");
    p = tmp_path("future.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"version\": 99, \"device\": {\"name\": \"*\"}, "
                  "\"entries\": []}");
    expect_rejected(ctx, p, LLMCL_ERROR_TUNE_DB, "\"version\"");
    expect_rejected(ctx, tmp_path("missing.json"), LLMCL_ERROR_IO, "cannot open");
    /* A file for another device, or another vendor, platform or device type. */
    expect_rejected(ctx, write_db("other.json", "{\"name\": \"No Such Device 9000\"}", ""),
                    LLMCL_ERROR_TUNE_DB, "No Such Device 9000");
    expect_rejected(
        ctx, write_db("vendor.json", "{\"name\": \"*\", \"vendor\": \"No Such Vendor\"}", ""),
        LLMCL_ERROR_TUNE_DB, "No Such Vendor");
    expect_rejected(
        ctx, write_db("platform.json", "{\"name\": \"*\", \"platform\": \"No Such Platform\"}", ""),
        LLMCL_ERROR_TUNE_DB, "No Such Platform");
    const bool gpu = llmcl_ctx_device_info(ctx)->is_gpu;
    expect_rejected(ctx,
                    write_db("type.json",
                             gpu ? "{\"name\": \"*\", \"type\": \"cpu\"}"
                                 : "{\"name\": \"*\", \"type\": \"gpu\"}",
                             ""),
                    LLMCL_ERROR_TUNE_DB, "device type");
    TH_FAILS(llmcl_tune_db_load(ctx, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_db_load(NULL, p), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_tune_db_clear(ctx));
}

static void test_unknown_keys_ignored(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    char dev[640];
    snprintf(dev, sizeof dev, "{\"name\": %s, \"memory_gib\": 80, \"notes\": [1, 2]}",
             dev_name_json());
    const char *p = tmp_path("unknown.json");
    char text[2048];
    snprintf(
        text, sizeof text,
        "{\"format\": \"llmcl-tuning\", \"version\": 1, \"comment\": \"from the future\","
        " \"device\": %s, \"tuner\": {\"anything\": true}, \"entries\": ["
        "{\"kernel\": \"tst\", \"dtype\": \"BF16\", \"params\": {\"WG\": 64}, \"time_ms\": 1.5,"
        " \"extra\": {\"nested\": null}}]}",
        dev);
    write_text(p, text);
    TH_OK(llmcl_tune_db_load(ctx, p));
    ASSERT_PARAMS(ctx, "tst", LLMCL_BF16, "p3", "WG=64");
    assert_string_equal(llmcl_tune_db_warnings(ctx), "");
    TH_OK(llmcl_tune_db_clear(ctx));
}

static void test_missing_fields(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    const char *p = tmp_path("nodevice.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"version\": 1, \"entries\": []}");
    TH_FAILS(llmcl_tune_db_load(ctx, p), LLMCL_ERROR_TUNE_DB);
    assert_non_null(strstr(llmcl_last_error(ctx), "\"device\""));
    p = tmp_path("noname.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"version\": 1, \"device\": {\"vendor\": \"x\"}, "
                  "\"entries\": []}");
    TH_FAILS(llmcl_tune_db_load(ctx, p), LLMCL_ERROR_TUNE_DB);
    p = tmp_path("noentries.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"version\": 1, \"device\": {\"name\": \"*\"}}");
    TH_FAILS(llmcl_tune_db_load(ctx, p), LLMCL_ERROR_TUNE_DB);
    assert_non_null(strstr(llmcl_last_error(ctx), "\"entries\""));
    p = tmp_path("noversion.json");
    write_text(p, "{\"format\": \"llmcl-tuning\", \"device\": {\"name\": \"*\"}, \"entries\": []}");
    TH_FAILS(llmcl_tune_db_load(ctx, p), LLMCL_ERROR_TUNE_DB);
    /* Bad entries are skipped with a warning naming them; the good ones in the file still apply. */
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("entries.json", this_device(),
                      "{\"kernel\": \"tst\"},"
                      "{\"params\": {\"WG\": 1}},"
                      "{\"kernel\": \"tst\", \"params\": {\"WG\": \"big\"}},"
                      "{\"kernel\": \"tst\", \"params\": {\"wg\": 8}},"
                      "{\"kernel\": \"tst\", \"dtype\": \"f64\", \"params\": {\"WG\": 8}},"
                      "{\"kernel\": \"tst\", \"shape_class\": \"huge\", \"params\": {\"WG\": 8}},"
                      "7,"
                      "{\"kernel\": \"tst\", \"params\": {\"WG\": 32}}")));
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p5", "WG=32");
    const char *w = llmcl_tune_db_warnings(ctx);
    for (int i = 0; i <= 6; ++i) {
        char needle[32];
        snprintf(needle, sizeof needle, "entry %d skipped", i);
        if (strstr(w, needle) == NULL)
            fail_msg("no \"%s\" in warnings:\n%s", needle, w);
    }
    assert_null(strstr(w, "entry 7 skipped"));
    TH_OK(llmcl_tune_db_clear(ctx));
}

/* Found while writing tests/fuzz/fuzz_tune_db: a class spelled with leading zeros past 15
   characters was cut to "p00000000000000", class p0, and applied to sizes near 1, not its own. */
static void test_shape_class_spellings(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("classes.json", this_device(),
                      "{\"kernel\": \"tsc\", \"shape_class\": \"p000000000000000020\","
                      " \"params\": {\"WG\": 8}},"
                      "{\"kernel\": \"tsc\", \"shape_class\": \"p07\","
                      " \"params\": {\"WG\": 16}}")));
    ASSERT_PARAMS(ctx, "tsc", LLMCL_F32, "p20", "WG=8");
    ASSERT_PARAMS(ctx, "tsc", LLMCL_F32, "1048576", "WG=8");
    ASSERT_PARAMS(ctx, "tsc", LLMCL_F32, "p7", "WG=16");
    ASSERT_PARAMS(ctx, "tsc", LLMCL_F32, "p1", "");
    assert_string_equal(llmcl_tune_db_warnings(ctx), "");
    TH_OK(llmcl_tune_db_clear(ctx));
}

/* ---- loading at context creation ---- */

static void test_env_and_cache_dir(void **state)
{
    (void)state;
    /* LLMCL_TUNE_DB: files and folders, ':'-separated. */
    const char *a =
        write_db("env-a.json", this_device(), "{\"kernel\": \"tst\", \"params\": {\"WG\": 16}}");
    char sub[128], list[512];
    snprintf(sub, sizeof sub, "%s/envdir", tmp_dir);
    mkdir(sub, 0700);
    write_db("envdir/b.json", this_device(), "{\"kernel\": \"tst2\", \"params\": {\"VEC\": 2}}");
    snprintf(list, sizeof list, "%s:%s", a, sub);
    llmcl_ctx *ctx = ctx_with_env("LLMCL_TUNE_DB", list);
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p4", "WG=16");
    ASSERT_PARAMS(ctx, "tst2", LLMCL_F32, "p4", "VEC=2");
    assert_string_equal(llmcl_tune_db_warnings(ctx), "");
    llmcl_ctx_destroy(ctx);

    /* A bad or foreign file there: a warning, the defaults, and a working context. */
    write_text(tmp_path("garbage.json"), "not json at all");
    const char *other = write_db("other.json", "{\"name\": \"Some Other GPU\"}",
                                 "{\"kernel\": \"copy\", \"params\": {\"WG\": 1}}");
    snprintf(list, sizeof list, "%s:%s", tmp_path("garbage.json"), other);
    ctx = ctx_with_env("LLMCL_TUNE_DB", list);
    const char *w = llmcl_tune_db_warnings(ctx);
    assert_non_null(strstr(w, "garbage.json ignored: malformed JSON"));
    assert_non_null(strstr(w, "Some Other GPU"));
    int64_t n = 1000;
    llmcl_tensor *x = NULL, *y = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &x));
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &y));
    TH_OK(llmcl_fill(ctx, x, 2.0));
    TH_OK(llmcl_copy(ctx, x, y));
    TH_OK(llmcl_ctx_finish(ctx));
    llmcl_tensor_destroy(x);
    llmcl_tensor_destroy(y);
    llmcl_ctx_destroy(ctx);

    /* <cache dir>/tuning*.json; other names there are not read. */
    char cache[128];
    snprintf(cache, sizeof cache, "%s/cache", tmp_dir);
    mkdir(cache, 0700);
    write_db("cache/tuning-mine.json", this_device(),
             "{\"kernel\": \"tst\", \"params\": {\"WG\": 48}}");
    write_db("cache/notes.json", this_device(), "{\"kernel\": \"tst3\", \"params\": {\"WG\": 1}}");
    write_db("cache/tuning-other.json", "{\"name\": \"Some Other GPU\"}",
             "{\"kernel\": \"tst\", \"params\": {\"WG\": 1}}");
    ctx = ctx_with_env("LLMCL_CACHE_DIR", cache);
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p4", "WG=48");
    ASSERT_PARAMS(ctx, "tst3", LLMCL_F32, "p4", "");
    assert_string_equal(llmcl_tune_db_warnings(ctx),
                        ""); /* other devices' files are normal there */
    llmcl_ctx_destroy(ctx);

    /* every file of a folder (only 256 were read, those readdir gave first), in name order: the
       last of 300 wins where all set one key */
    snprintf(sub, sizeof sub, "%s/many", tmp_dir);
    mkdir(sub, 0700);
    for (int i = 0; i < 300; ++i) {
        char name[64], entries[160];
        snprintf(name, sizeof name, "many/tuning-%03d.json", i);
        snprintf(entries, sizeof entries,
                 "{\"kernel\": \"tst\", \"params\": {\"WG\": %d}}, "
                 "{\"kernel\": \"own%03d\", \"params\": {\"VEC\": 2}}",
                 i + 1, i);
        write_db(name, this_device(), entries);
    }
    ctx = ctx_with_env("LLMCL_CACHE_DIR", sub);
    ASSERT_PARAMS(ctx, "tst", LLMCL_F32, "p4", "WG=300");
    for (int i = 0; i < 300; ++i) {
        char own[16];
        snprintf(own, sizeof own, "own%03d", i);
        ASSERT_PARAMS(ctx, own, LLMCL_F32, "p4", "VEC=2");
    }
    llmcl_ctx_destroy(ctx);

    /* LLMCL_TUNE_DB=off: no database at all, not even the built-in one. */
    ctx = ctx_with_env("LLMCL_TUNE_DB", "off");
    ASSERT_PARAMS(ctx, "copy", LLMCL_F32, "p22", "");
    llmcl_ctx_destroy(ctx);
    /* The built-in file for PoCL's CPU device has tuned elementwise entries. */
    if (strstr(llmcl_ctx_device_info(th_ctx())->platform_name, "Portable Computing Language")) {
        ctx = ctx_with_env("LLMCL_CACHE_DIR", "off");
        assert_string_not_equal(params_of(ctx, "copy", LLMCL_F32, "p22", NULL), "");
        llmcl_ctx_destroy(ctx);
    }
}

/* ---- parameters reaching launches ---- */

static void run_copy_n(llmcl_ctx *ctx, int64_t n)
{
    llmcl_tensor *x = NULL, *y = NULL;
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &x));
    TH_OK(llmcl_tensor_create(ctx, LLMCL_F32, 1, &n, &y));
    TH_OK(llmcl_fill(ctx, x, 1.0));
    TH_OK(llmcl_copy(ctx, x, y));
    TH_OK(llmcl_ctx_finish(ctx));
    llmcl_tensor_destroy(x);
    llmcl_tensor_destroy(y);
}

static void test_override_reaches_launch(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    int launched = -1;
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, "1000", &launched), "");
    assert_int_equal(launched, 0);
    run_copy_n(ctx, 1000);
    char defaults[256];
    snprintf(defaults, sizeof defaults, "%s", params_of(ctx, "copy", LLMCL_F32, "1000", &launched));
    assert_int_equal(launched, 1);
    assert_non_null(strstr(defaults, "WG="));

    TH_OK(llmcl_tune_override(ctx, "copy", LLMCL_F32, "1000", "WG=64"));
    run_copy_n(ctx, 1000);
    /* only WG changes: the other tunables keep the launcher's defaults */
    char want[256];
    const char *wg = strstr(defaults, "WG=");
    const char *rest = strchr(wg, ' ');
    snprintf(want, sizeof want, "%.*sWG=64%s", (int)(wg - defaults), defaults, rest ? rest : "");
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, "p10", &launched), want);
    assert_int_equal(launched, 1);
    /* Names the kernel lacks and work-group sizes out of range do not reach the build. */
    TH_OK(llmcl_tune_override(ctx, "copy", LLMCL_F32, "1000", "WG=0 NOT_A_TUNABLE=3"));
    run_copy_n(ctx, 1000);
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, "p10", NULL), defaults);
    char huge[64];
    snprintf(huge, sizeof huge, "WG=%zu", 2 * llmcl_ctx_device_info(ctx)->max_work_group_size);
    TH_OK(llmcl_tune_override(ctx, "copy", LLMCL_F32, "1000", huge));
    run_copy_n(ctx, 1000);
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, "p10", NULL), defaults);

    /* Bad arguments. */
    char buf[4];
    TH_FAILS(llmcl_tune_params_get(NULL, "copy", LLMCL_F32, "p10", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, NULL, LLMCL_F32, "p10", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, "copy", LLMCL_DTYPE_COUNT, "p10", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, "copy", LLMCL_F32, "big", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, "copy", LLMCL_F32, "-5", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, "copy", LLMCL_F32, "p10", NULL, 8, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_params_get(ctx, "copy", LLMCL_F32, "p10", buf, sizeof buf, NULL),
             LLMCL_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmcl_last_error(ctx), "buf holds 4 bytes"));
    TH_FAILS(llmcl_tune_override(ctx, "copy", LLMCL_F32, "p10", "WG"),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_override(ctx, "copy", LLMCL_F32, "p10", "WG=abc"),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_override(ctx, "copy", LLMCL_F32, "p10", "wg=64"),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_override(ctx, "", LLMCL_F32, "p10", "WG=64"), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_override(NULL, "copy", LLMCL_F32, "p10", "WG=64"),
             LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_tune_shape_class(0, huge), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_OK(llmcl_tune_shape_class(4097, huge));
    assert_string_equal(huge, "p13");
    TH_OK(llmcl_tune_db_clear(ctx));
}

/* The launches under test_adjusted_values_recorded, on small shapes with any inputs. */
static void run_rope_pos(llmcl_ctx *ctx)
{
    const int64_t qs[4] = {1, 2, 4, 12}, ps[1] = {4}; /* 6 pairs: VEC 8 and 4 do not divide */
    double qv[96], pv[4] = {0, 1, 2, 3};
    th_rng r = th_rng_new(41);
    th_fill_normal(&r, qv, 96, 1.0);
    llmcl_tensor *q = th_tensor_from(LLMCL_F32, 4, qs, qv);
    llmcl_tensor *pos = th_tensor_from(LLMCL_I32, 1, ps, pv);
    const llmcl_rope_options o = {.positions = pos};
    TH_OK(llmcl_rope_forward(ctx, q, NULL, &o));
    llmcl_tensor_destroy(q);
    llmcl_tensor_destroy(pos);
}

/* RMSNorm's forward on 4 rows of H f32 values (8-wide chunks: H / 8 of them a row). */
static void run_rmsnorm(llmcl_ctx *ctx, int64_t H)
{
    const int64_t xs[2] = {4, H}, n = 4;
    llmcl_tensor *x = th_tensor(LLMCL_F32, 2, xs), *y = th_tensor(LLMCL_F32, 2, xs);
    llmcl_tensor *w = th_tensor(LLMCL_F32, 1, &H), *rstd = th_tensor(LLMCL_F32, 1, &n);
    TH_OK(llmcl_fill(ctx, x, 1.0));
    TH_OK(llmcl_fill(ctx, w, 1.0));
    TH_OK(llmcl_rmsnorm_forward(ctx, x, w, y, rstd, NULL));
    llmcl_tensor_destroy(x), llmcl_tensor_destroy(y), llmcl_tensor_destroy(w);
    llmcl_tensor_destroy(rstd);
}

/* M 20, N 24, K 8, a every other column of [20, 16]: no unit stride, the tiled kernel everywhere */
static void run_matmul_bf16(llmcl_ctx *ctx)
{
    const int64_t whole[2] = {20, 16}, as[2] = {20, 8}, a_strides[2] = {16, 2}, bs[2] = {8, 24},
                  cs[2] = {20, 24};
    double av[320], bv[192];
    th_rng r = th_rng_new(42);
    th_fill_normal(&r, av, 320, 1.0);
    th_fill_normal(&r, bv, 192, 1.0);
    llmcl_tensor *a_whole = th_tensor_from(LLMCL_BF16, 2, whole, av), *a = NULL;
    TH_OK(llmcl_tensor_view(a_whole, 2, as, a_strides, 0, &a));
    llmcl_tensor *b = th_tensor_from(LLMCL_BF16, 2, bs, bv);
    llmcl_tensor *c = th_tensor(LLMCL_F32, 2, cs);
    TH_OK(llmcl_matmul(ctx, 1.0f, a, b, 0.0f, c, NULL));
    llmcl_tensor *all[] = {a, a_whole, b, c};
    for (int i = 0; i < 4; ++i)
        llmcl_tensor_destroy(all[i]);
}

/* N 4 rows of V 100 classes: cross-entropy on logits, and fused in tiles from H 16. */
static void run_cross_entropy(llmcl_ctx *ctx)
{
    const int64_t ls[2] = {4, 100}, hs[2] = {4, 16}, ws[2] = {100, 16}, ns[1] = {4}, one = 1;
    double lv[400], hv[64], wv[1600], yv[4] = {3, 97, 50, 0};
    th_rng r = th_rng_new(43);
    th_fill_normal(&r, lv, 400, 1.0);
    th_fill_normal(&r, hv, 64, 1.0);
    th_fill_normal(&r, wv, 1600, 0.25);
    llmcl_tensor *logits = th_tensor_from(LLMCL_F32, 2, ls, lv);
    llmcl_tensor *hidden = th_tensor_from(LLMCL_F32, 2, hs, hv);
    llmcl_tensor *weight = th_tensor_from(LLMCL_F32, 2, ws, wv);
    llmcl_tensor *labels = th_tensor_from(LLMCL_I32, 1, ns, yv);
    llmcl_tensor *loss = th_tensor(LLMCL_F32, 1, &one), *lse = th_tensor(LLMCL_F32, 1, ns);
    TH_OK(llmcl_cross_entropy_forward(ctx, logits, labels, NULL, loss, NULL, NULL, NULL));
    const llmcl_ce_options tiles = {.vocab_chunk = -1};
    TH_OK(llmcl_fused_cross_entropy_forward(ctx, hidden, weight, NULL, labels, &tiles, loss, NULL,
                                            lse));
    llmcl_tensor *all[] = {logits, hidden, weight, labels, loss, lse};
    for (int i = 0; i < 6; ++i)
        llmcl_tensor_destroy(all[i]);
}

/*
 * Launchers that change looked-up values (clamp them to the shape, fall back to their defaults
 * from a file entry that does not fit, settle a host-side tunable) report the values they used,
 * not the ones the database gave them.
 */
/*
 * A norm entry tuned for longer rows, reached as the nearest class: the launch halves WG while
 * half still covers the row's chunks (no work-item idles) and doubles ROWS (the work-group keeps
 * the entry's size), and records what it used; at the entry's own class, and for an override, WG
 * and ROWS stay as given.
 */
static void test_norm_entry_for_longer_rows(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    TH_OK(llmcl_tune_db_load(
        ctx, write_db("norm.json", this_device(),
                      "{\"kernel\": \"rmsnorm_fwd\", \"dtype\": \"f32\", \"shape_class\": \"p12\", "
                      "\"params\": {\"WG\": 256, \"ROWS\": 1, \"CACHE\": 4}}")));
    run_rmsnorm(ctx, 1024); /* 128 chunks: 32 work-items of 4, 8 rows */
    const char *used = params_of(ctx, "rmsnorm_fwd", LLMCL_F32, "1024", NULL);
    assert_true(has_token(used, "WG=32") && has_token(used, "ROWS=8"));
    run_rmsnorm(ctx, 2048); /* 256 chunks: 64 work-items, 4 rows */
    used = params_of(ctx, "rmsnorm_fwd", LLMCL_F32, "2048", NULL);
    assert_true(has_token(used, "WG=64") && has_token(used, "ROWS=4"));
    run_rmsnorm(ctx, 8200); /* 1025 chunks: the entry's own 256 x 4 and more */
    used = params_of(ctx, "rmsnorm_fwd", LLMCL_F32, "8200", NULL);
    assert_true(has_token(used, "WG=256") && has_token(used, "ROWS=1"));
    TH_OK(llmcl_tune_override(ctx, "rmsnorm_fwd", LLMCL_F32, "*", "WG=256 ROWS=1 CACHE=4"));
    run_rmsnorm(ctx, 1024);
    used = params_of(ctx, "rmsnorm_fwd", LLMCL_F32, "1024", NULL);
    assert_true(has_token(used, "WG=256") && has_token(used, "ROWS=1"));
    TH_OK(llmcl_tune_override(ctx, NULL, LLMCL_F32, NULL, NULL));
    TH_OK(llmcl_tune_db_clear(ctx));
}

static void test_adjusted_values_recorded(void **state)
{
    (void)state;
    llmcl_ctx *ctx = th_ctx();
    TH_OK(llmcl_tune_db_clear(ctx));
    run_matmul_bf16(ctx);
    run_cross_entropy(ctx);
    char mm_defaults[256], rows_defaults[256], tile_defaults[256];
    snprintf(mm_defaults, sizeof mm_defaults, "%s",
             params_of(ctx, "mm_tiled", LLMCL_BF16, "24", NULL));
    snprintf(rows_defaults, sizeof rows_defaults, "%s",
             params_of(ctx, "ce_rows", LLMCL_F32, "100", NULL));
    snprintf(tile_defaults, sizeof tile_defaults, "%s",
             params_of(ctx, "cce_fwd", LLMCL_F32, "100", NULL));

    TH_OK(llmcl_tune_override(ctx, "rope_pos", LLMCL_F32, "*", "VEC=8"));
    TH_OK(llmcl_tune_override(ctx, "ce_rows", LLMCL_F32, "*", "WG=48"));
    TH_OK(llmcl_tune_override(ctx, "ce_split", LLMCL_F32, "*", "SPLIT=0"));
    TH_OK(llmcl_tune_override(ctx, "cce_split", LLMCL_F32, "*", "SPLIT=0"));
    const char *misfits =
        "{\"kernel\": \"mm_tiled\", \"params\": {\"T\": 48, \"BK\": 16, \"TM\": 5, \"TN\": 4}},"
        "{\"kernel\": \"cce_fwd\", \"params\": {\"T\": 48, \"BK\": 16, \"TM\": 5, \"TN\": 4}}";
    TH_OK(llmcl_tune_db_load(ctx, write_db("misfits.json", this_device(), misfits)));
    run_rope_pos(ctx);
    run_matmul_bf16(ctx);
    run_cross_entropy(ctx);

    int launched = 0;
    assert_true(has_token(params_of(ctx, "rope_pos", LLMCL_F32, "12", &launched), "VEC=2"));
    assert_int_equal(launched, 1);
    assert_string_not_equal(mm_defaults, "");
    assert_string_not_equal(rows_defaults, "");
    assert_string_not_equal(tile_defaults, "");
    assert_string_equal(params_of(ctx, "mm_tiled", LLMCL_BF16, "24", NULL), mm_defaults);
    assert_string_equal(params_of(ctx, "ce_rows", LLMCL_F32, "100", NULL), rows_defaults);
    assert_string_equal(params_of(ctx, "ce_split", LLMCL_F32, "4", NULL), "SPLIT=1");
    assert_string_equal(params_of(ctx, "cce_fwd", LLMCL_F32, "100", NULL), tile_defaults);
    assert_string_equal(params_of(ctx, "cce_split", LLMCL_F32, "1", NULL), "SPLIT=1");
    TH_OK(llmcl_tune_db_clear(ctx));
}

/* ---- the tuner rejects planted bad candidates ---- */

/* WG=96 gives a wrong result: one output element overwritten after the copy. */
static llmcl_status run_planted(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    llmcl_status st = llmcl_copy(ctx, t[0], t[1]);
    if (st != LLMCL_OK || c->values[0] != 96)
        return st;
    int64_t one = 1;
    llmcl_tensor *v = NULL;
    st = llmcl_tensor_view(t[1], 1, &one, NULL, 7, &v);
    if (st == LLMCL_OK)
        st = llmcl_fill(ctx, v, 1234.0);
    llmcl_tensor_destroy(v);
    return st;
}

/* WG=112 "needs" more local memory than the device has. */
static bool fits_planted(const llmcl_device_info *info, const tune_case *c, char *why, size_t n)
{
    if (c->values[0] != 112)
        return true;
    snprintf(why, n, "planted: needs %llu bytes of local memory",
             (unsigned long long)info->local_mem_bytes + 1);
    return false;
}

static const tune_kernel planted = {
    .key = "copy",
    .family = "elementwise",
    .params = "WG=32,48,64,96,112,1000000",
    .dtypes = 1u << LLMCL_F32,
    .size_key = "N",
    .shapes = "N=65536",
    .small_shapes = "N=65536",
    .tensors = {{"src", TUNE_IN, "N"}, {"dst", TUNE_OUT, "N"}},
    .run = run_planted,
    .fits = fits_planted,
};

/* A kernel directory whose elementwise.cl fails to build with WG=48 (and only then). */
static void planted_kernel_dir(char *dir, size_t n)
{
    const char *src = getenv("LLMCL_KERNEL_DIR_FOR_TESTS");
    assert_non_null(src);
    snprintf(dir, n, "%s/kernels", tmp_dir);
    mkdir(dir, 0700);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s'/*.cl '%s'/", src, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/elementwise.cl", dir);
    FILE *f = fopen(cmd, "r");
    assert_non_null(f);
    static char body[1 << 20];
    size_t len = fread(body, 1, sizeof body - 1, f);
    fclose(f);
    body[len] = '\0';
    f = fopen(cmd, "w");
    assert_non_null(f);
    fprintf(f, "#if defined(WG) && WG == 48\n#error planted build failure\n#endif\n%s", body);
    fclose(f);
}

static void test_tuner_rejects_planted(void **state)
{
    (void)state;
    char dir[128];
    planted_kernel_dir(dir, sizeof dir);
    setenv("LLMCL_CACHE_DIR", "off", 1);
    llmcl_ctx *ctx = ctx_with_env("LLMCL_KERNEL_DIR", dir);
    setenv("LLMCL_KERNEL_DIR", dir, 1); /* sources are read at build time */
    tune_options o = tune_default_options(llmcl_ctx_device_info(ctx), true);
    o.reps = 3;
    tune_result r;
    llmcl_status st = tune_run_case(ctx, &planted, LLMCL_F32, "N=65536", &o, &r);
    unsetenv("LLMCL_KERNEL_DIR");
    unsetenv("LLMCL_CACHE_DIR");
    if (st != LLMCL_OK)
        fail_msg("case failed: %s", r.error);
    assert_true(r.ok);
    assert_int_equal(r.candidates, 6);
    assert_int_equal(r.tried, 6); /* the default (256 here) is not among them */
    assert_int_equal(r.rejected[TUNE_REJ_BUILD], 1);
    assert_non_null(strstr(r.last_reject[TUNE_REJ_BUILD], "WG=48"));
    assert_non_null(strstr(llmcl_build_log(ctx), "planted build failure"));
    assert_int_equal(r.rejected[TUNE_REJ_LIMITS], 2); /* 112 (fits) and 1000000 (work-group size) */
    assert_int_equal(r.rejected[TUNE_REJ_WRONG], 1);
    assert_non_null(strstr(r.last_reject[TUNE_REJ_WRONG], "WG=96"));
    assert_int_equal(r.rejected[TUNE_REJ_ADJUSTED] + r.rejected[TUNE_REJ_ERROR], 0);
    assert_int_equal(r.timed, 2);
    assert_true(r.default_ms > 0 && r.best_ms > 0 && r.best_ms <= r.default_ms);
    /* the winner is the default or one of the two timed candidates (the other tunables as given) */
    assert_true(strcmp(r.best_params, r.default_params) == 0 || has_token(r.best_params, "WG=32") ||
                has_token(r.best_params, "WG=64"));
    /* No override is left behind. */
    run_copy_n(ctx, 65536);
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, "p16", NULL), r.default_params);

    /* A table entry naming a tunable the launcher lacks fails the case with a clear message. */
    tune_kernel wrong = planted;
    wrong.params = "NOPE=1,2";
    assert_int_not_equal(tune_run_case(ctx, &wrong, LLMCL_F32, "N=4096", &o, &r), LLMCL_OK);
    assert_non_null(strstr(r.error, "has no tunable NOPE"));
    wrong = planted;
    wrong.key = "not_a_kernel";
    assert_int_not_equal(tune_run_case(ctx, &wrong, LLMCL_F32, "N=4096", &o, &r), LLMCL_OK);
    assert_non_null(strstr(r.error, "did not look up kernel not_a_kernel"));
    assert_int_not_equal(tune_run_case(ctx, &planted, LLMCL_F32, "M=4096", &o, &r), LLMCL_OK);
    llmcl_ctx_destroy(ctx);
}

/* ---- derived inputs ---- */

/* llmcl_copy's key as a tuner kernel over f32 [N] with its own run and derive_inputs hooks. */
static tune_kernel copy_kernel(const char *params,
                               llmcl_status (*run)(llmcl_ctx *, llmcl_tensor *const *,
                                                   const tune_case *),
                               llmcl_status (*derive)(llmcl_ctx *, llmcl_tensor *const *,
                                                      const tune_case *))
{
    return (tune_kernel){.key = "copy", .family = "elementwise", .params = params,
                         .dtypes = 1u << LLMCL_F32, .size_key = "N", .shapes = "N=4096",
                         .small_shapes = "N=4096",
                         .tensors = {{"src", TUNE_IN, "N"}, {"dst", TUNE_OUT, "N"}},
                         .run = run, .derive_inputs = derive};
}

/* One quick case of k at N 4096 on the suite's context; where it succeeds, its result is whole. */
static llmcl_status run_copy_case(const tune_kernel *k, tune_result *r)
{
    llmcl_ctx *ctx = th_ctx();
    tune_options o = tune_default_options(llmcl_ctx_device_info(ctx), true);
    o.reps = 3;
    const llmcl_status st = tune_run_case(ctx, k, LLMCL_F32, "N=4096", &o, r);
    if (st != LLMCL_OK)
        print_message("case failed: %s\n", r->error);
    else
        assert_true(r->ok);
    return st;
}

/* The source as derive_threes leaves it: every element 3. */
static llmcl_status derive_threes(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    return llmcl_fill(ctx, t[0], 3.0);
}

/* The copy, failing unless its source holds the derived values (whichever buffer set it gets). */
static llmcl_status run_on_threes(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    (void)c;
    const size_t n = (size_t)llmcl_tensor_numel(t[0]);
    float *host = th_alloc(n * sizeof *host);
    llmcl_status st = llmcl_tensor_download(t[0], host, n * sizeof *host);
    for (size_t i = 0; i < n && st == LLMCL_OK; ++i)
        st = host[i] == 3.0f ? LLMCL_OK : LLMCL_ERROR_INVALID_ARGUMENT;
    free(host);
    return st == LLMCL_OK ? llmcl_copy(ctx, t[0], t[1]) : st;
}

/*
 * A kernel's derive_inputs runs before the reference and its values reach every buffer set the
 * timing rotates through and every reset; without the hook the same run fails at the reference.
 */
static void test_tuner_derives_inputs(void **state)
{
    (void)state;
    tune_kernel k = copy_kernel("WG=64,128", run_on_threes, derive_threes);
    tune_result r;
    assert_int_equal(run_copy_case(&k, &r), LLMCL_OK);
    assert_int_equal(r.timed, 2);
    for (int i = 0; i < TUNE_REJ_COUNT; ++i)
        assert_int_equal(r.rejected[i], 0);
    k.derive_inputs = NULL;
    assert_int_not_equal(run_copy_case(&k, &r), LLMCL_OK);
    assert_non_null(strstr(r.error, "reference"));
}

/* ---- tolerance of long sums ---- */

/* Element 7 of the source is 0.01, a small element among standard normal ones. */
static llmcl_status derive_small_element(llmcl_ctx *ctx, llmcl_tensor *const *t,
                                         const tune_case *c)
{
    (void)c;
    int64_t one = 1;
    llmcl_tensor *v = NULL;
    llmcl_status st = llmcl_tensor_view(t[0], 1, &one, NULL, 7, &v);
    if (st == LLMCL_OK)
        st = llmcl_fill(ctx, v, 0.01);
    llmcl_tensor_destroy(v);
    return st;
}

/* The copy; WG=64 moves element 7 by 5e-5 (0.5% of it, 5e-5 of the output's RMS, as another
   order of summation may), WG=96 sets it to 1234. */
static llmcl_status run_moved(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c)
{
    llmcl_status st = llmcl_copy(ctx, t[0], t[1]);
    if (st != LLMCL_OK || (c->values[0] != 64 && c->values[0] != 96))
        return st;
    int64_t one = 1;
    llmcl_tensor *v = NULL;
    st = llmcl_tensor_view(t[1], 1, &one, NULL, 7, &v);
    if (st == LLMCL_OK)
        st = llmcl_fill(ctx, v, c->values[0] == 64 ? 0.01 + 5e-5 : 1234.0);
    llmcl_tensor_destroy(v);
    return st;
}

/*
 * A kernel whose outputs are long sums (tol_rms) accepts a small element moved by a fraction of
 * the output's RMS, which an element's own tolerance refuses, and still refuses a wrong value.
 */
static void test_tuner_tolerates_sums(void **state)
{
    (void)state;
    tune_kernel k = copy_kernel("WG=32,64,96", run_moved, derive_small_element);
    tune_result r;
    for (int sums = 0; sums < 2; ++sums) {
        k.tol_rms = sums;
        assert_int_equal(run_copy_case(&k, &r), LLMCL_OK);
        assert_int_equal(r.rejected[TUNE_REJ_WRONG], sums ? 1 : 2);
        assert_non_null(strstr(r.last_reject[TUNE_REJ_WRONG], "WG=96"));
        assert_int_equal(r.timed, sums ? 2 : 1);
    }
}

/* ---- llmcl-tune --quick end to end ---- */

static long entry_wg(json_t *e)
{
    json_t *wg = json_object_get(json_object_get(e, "params"), "WG");
    assert_true(json_is_integer(wg));
    return (long)json_integer_value(wg);
}

static int cmp_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* An entry's parameters as llmcl_tune_params_get renders them: "NAME=VALUE ..." sorted by name. */
static void entry_params_text(json_t *e, char *buf, size_t len)
{
    json_t *params = json_object_get(e, "params");
    const char *names[16];
    size_t n = 0;
    const char *key;
    json_t *value;
    json_object_foreach(params, key, value)
    {
        assert_true(n < 16 && json_is_integer(value));
        names[n++] = key;
    }
    qsort(names, n, sizeof names[0], cmp_text);
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n; ++i)
        used += (size_t)snprintf(buf + used, len - used, "%s%s=%lld", i ? " " : "", names[i],
                                 (long long)json_integer_value(json_object_get(params, names[i])));
}

/* --space: named parameters take the given values, the rest keep the table's, and malformed text
 * or too small an output is refused. */
static void test_restrict_space(void **state)
{
    (void)state;
    char out[128];
    assert_int_equal(tune_restrict_space("WG=64,128 TM=1,2,4 TN=1", "TM=8,4 XX=3", out, sizeof out),
                     1);
    assert_string_equal(out, "WG=64,128 TM=8,4 TN=1");
    assert_int_equal(tune_restrict_space("WG=64", "XX=3 WG=32", out, sizeof out), 2);
    assert_string_equal(out, "WG=32");
    assert_int_equal(tune_restrict_space("WG=64", "WG=", out, sizeof out), -1);
    assert_int_equal(tune_restrict_space("WG=64", "WG=1,2", out, 4), -1);
}

/* The header of a file llmcl-tune wrote, and its two entries (copy and axpy); returns copy's. */
static json_t *check_written_file(json_t *root)
{
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    assert_string_equal(json_string_value(json_object_get(root, "format")), "llmcl-tuning");
    assert_int_equal(json_integer_value(json_object_get(root, "version")), 1);
    json_t *dev = json_object_get(root, "device");
    assert_string_equal(json_string_value(json_object_get(dev, "name")), info->name);
    assert_string_equal(json_string_value(json_object_get(dev, "driver_version")),
                        info->driver_version);
    assert_string_equal(json_string_value(json_object_get(root, "library_version")),
                        llmcl_version());
    assert_int_equal(strlen(json_string_value(json_object_get(root, "date"))), 20);
    json_t *entries = json_object_get(root, "entries");
    assert_int_equal(json_array_size(entries), 2);
    json_t *copy = NULL;
    for (size_t i = 0; i < 2; ++i) {
        json_t *e = json_array_get(entries, i);
        const char *k = json_string_value(json_object_get(e, "kernel"));
        assert_true(strcmp(k, "copy") == 0 || strcmp(k, "axpy") == 0);
        copy = strcmp(k, "copy") == 0 ? e : copy;
        assert_string_equal(json_string_value(json_object_get(e, "dtype")), "f32");
        assert_true(json_number_value(json_object_get(e, "time_ms")) > 0);
        assert_true(json_number_value(json_object_get(e, "default_ms")) > 0);
        assert_true(json_is_object(json_object_get(e, "default_params")));
        assert_true(entry_wg(e) >= 1);
    }
    assert_non_null(copy);
    return copy;
}

/* A context reading `file` as LLMCL_TUNE_DB launches copy with the entry's parameters. */
static void expect_copy_launched_with(const char *file, json_t *copy)
{
    const char *cls = json_string_value(json_object_get(copy, "shape_class"));
    const char *shape = json_string_value(json_object_get(copy, "shape"));
    const int64_t n = strtoll(shape + 2, NULL, 10); /* "N=..." */
    llmcl_ctx *ctx = ctx_with_env("LLMCL_TUNE_DB", file);
    assert_string_equal(llmcl_tune_db_warnings(ctx), "");
    run_copy_n(ctx, n);
    char want[256];
    entry_params_text(copy, want, sizeof want);
    int launched = 0;
    assert_string_equal(params_of(ctx, "copy", LLMCL_F32, cls, &launched), want);
    assert_int_equal(launched, 1);
    llmcl_ctx_destroy(ctx);
}

/* --merge keeps the entries of the file that were not retuned: copy and axpy beside mul. */
/* The text of a small file, or "" where it cannot be read. */
static const char *read_text(const char *path)
{
    static char buf[256];
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    return buf;
}

static void check_merge(const char *exe, const char *out, const char *log)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --quick --kernel mul --merge --output '%s' >'%s' 2>&1", exe,
             out, log);
    assert_int_equal(system(cmd), 0);
    json_error_t err;
    json_t *root = json_load_file(out, 0, &err);
    assert_non_null(root);
    json_t *entries = json_object_get(root, "entries");
    assert_int_equal(json_array_size(entries), 3);
    int seen = 0;
    for (size_t i = 0; i < 3; ++i) {
        const char *k = json_string_value(json_object_get(json_array_get(entries, i), "kernel"));
        seen |=
            (strcmp(k, "copy") == 0) | (strcmp(k, "axpy") == 0) << 1 | (strcmp(k, "mul") == 0) << 2;
    }
    assert_int_equal(seen, 7);
    json_decref(root);
    /* a file --merge would overwrite without keeping it (not JSON, another device's) is refused
       before the tuning and left as it was */
    const char *bad[] = {"{\"entries\": [",
                         "{\"device\": {\"name\": \"Some Other GPU\"}, \"entries\": []}"};
    for (int i = 0; i < 2; ++i) {
        const char *path = tmp_path("merge-into.json");
        write_text(path, bad[i]);
        snprintf(cmd, sizeof cmd, "'%s' --quick --kernel mul --merge --output '%s' >'%s' 2>&1",
                 exe, path, log);
        assert_int_not_equal(system(cmd), 0);
        assert_string_equal(read_text(path), bad[i]);
        assert_non_null(strstr(read_text(log), "cannot merge into"));
    }
}

static void test_tool_end_to_end(void **state)
{
    (void)state;
    const char *exe = getenv("LLMCL_TUNE_EXE");
    if (exe == NULL || access(exe, X_OK) != 0) {
        print_message("LLMCL_TUNE_EXE not set or not executable: skipped\n");
        skip();
    }
    const char *out = tmp_path("e2e.json"), *log = tmp_path("e2e.log");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' --quick --kernel copy --kernel axpy --max-time 120 --output '%s' >'%s' 2>&1",
             exe, out, log);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s'", log);
        (void)system(cmd);
        fail_msg("llmcl-tune failed");
    }
    json_error_t err;
    json_t *root = json_load_file(out, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL)
        fail_msg("%s: %s", out, err.text);
    json_t *copy = check_written_file(root);
    /* The runtime picks the file up and the launch uses its parameters. */
    expect_copy_launched_with(out, copy);
    /* The same file with a value no default has: it must be the one in use. */
    const long odd = entry_wg(copy) == 96 ? 160 : 96;
    json_object_set_new(json_object_get(copy, "params"), "WG", json_integer(odd));
    const char *edited = tmp_path("e2e-edited.json");
    assert_int_equal(json_dump_file(root, edited, JSON_INDENT(2)), 0);
    expect_copy_launched_with(edited, copy);
    json_decref(root);
    check_merge(exe, out, log);
}

static bool write_new(FILE *f, void *arg)
{
    (void)arg;
    return fputs("new", f) >= 0;
}

/* Writes half and fails, as a JSON dump that runs out of memory would. */
static bool write_half_then_fail(FILE *f, void *arg)
{
    (void)arg;
    fputs("ne", f);
    return false;
}

/* The tools' medians: the middle of an odd count, the upper middle of an even one, whatever the
   order and with repeats; the times left sorted. */
static void test_median(void **state)
{
    (void)state;
    double one[1] = {3.5};
    assert_true(util_median(one, 1) == 3.5);
    double odd[5] = {9, -1, 4, 4, 2};
    assert_true(util_median(odd, 5) == 4);
    const double sorted[5] = {-1, 2, 4, 4, 9};
    assert_memory_equal(odd, sorted, sizeof sorted);
    double even[4] = {0.25, 8, 1, 0.5};
    assert_true(util_median(even, 4) == 1);
    double same[3] = {7, 7, 7};
    assert_true(util_median(same, 3) == 7);
}

static int compare_longs(const void *a, const void *b)
{
    const long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Whether order holds n distinct candidates of [0, total). */
static bool distinct_within(const long *order, long n, long total)
{
    long *sorted = th_alloc((size_t)n * sizeof *sorted);
    memcpy(sorted, order, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_longs);
    bool ok = sorted[0] >= 0 && sorted[n - 1] < total;
    for (long i = 1; i < n && ok; ++i)
        ok = sorted[i] != sorted[i - 1];
    free(sorted);
    return ok;
}

/*
 * A space the tuner enumerates is shuffled whole, of which --max-candidates takes the first; one
 * past TUNE_MAX_SPACE is sampled without repeats, by a fixed seed, up to a draw of all of it, and
 * refused without a count to draw.
 */
static void test_candidate_order(void **state)
{
    (void)state;
    long count = -1;
    long *all = tune_candidate_order(10, 0, &count);
    assert_non_null(all);
    assert_int_equal(count, 10);
    assert_true(distinct_within(all, 10, 10));
    long *some = tune_candidate_order(10, 4, &count);
    assert_int_equal(count, 4);
    assert_memory_equal(some, all, 4 * sizeof *some);
    free(all), free(some);
    assert_null(tune_candidate_order(0, 4, &count));
    assert_null(tune_candidate_order(TUNE_MAX_SPACE + 1, 0, &count));

    const long huge = 1L << 40;
    long *drawn = tune_candidate_order(huge, 5000, &count);
    assert_int_equal(count, 5000);
    assert_true(distinct_within(drawn, count, huge));
    long *again = tune_candidate_order(huge, 5000, &count);
    assert_memory_equal(drawn, again, 5000 * sizeof *drawn);
    free(drawn), free(again);
    const long just_past = TUNE_MAX_SPACE + 1;
    long *every = tune_candidate_order(just_past, (int)just_past, &count);
    assert_int_equal(count, just_past);
    assert_true(distinct_within(every, count, just_past));
    free(every);
    every = tune_candidate_order(just_past, (int)just_past + 5, &count); /* more asked than held */
    assert_int_equal(count, just_past);
    assert_true(distinct_within(every, count, just_past));
    free(every);
}

/* Appended text stops at the buffer's end, and appends after it write nothing: each one's size
   once wrapped around past the end (llmcl-train's shape_text wrote past its buffer). */
static void test_appendf(void **state)
{
    (void)state;
    char buf[16];
    memset(buf, 'x', sizeof buf);
    size_t at = 0;
    util_appendf(buf, 8, &at, "[%d", 12);
    assert_string_equal(buf, "[12");
    assert_int_equal(at, 3);
    util_appendf(buf, 8, &at, ", %s", "3456789");
    assert_string_equal(buf, "[12, 34");
    assert_int_equal(at, 7);
    util_appendf(buf, 8, &at, "]");
    assert_string_equal(buf, "[12, 34");
    assert_int_equal(at, 7);
    assert_true(buf[8] == 'x'); /* nothing past the 8 bytes given */
    util_appendf(buf, 0, &at, "y"); /* no bytes: nothing written */
    assert_int_equal(at, 7);
}

static void test_replace_file(void **state)
{
    (void)state;
    char why[512];
    const char *path = tmp_path("replaced.json");
    write_text(path, "old");
    assert_true(util_replace_file(path, write_new, NULL, why, sizeof why));
    assert_string_equal(read_text(path), "new");
    assert_int_equal(th_files_starting(tmp_dir, "replaced.json"), 1);

    /* A writer that fails leaves the last good file, and nothing beside it. */
    why[0] = '\0';
    assert_false(util_replace_file(path, write_half_then_fail, NULL, why, sizeof why));
    assert_string_equal(read_text(path), "new");
    assert_non_null(strstr(why, "cannot write"));
    assert_int_equal(th_files_starting(tmp_dir, "replaced.json"), 1);

    /* A folder in the way: the rename fails, and the new file is removed. */
    const char *dir = tmp_path("a_folder.json");
    assert_int_equal(mkdir(dir, 0700), 0);
    write_text(tmp_path("a_folder.json/inside"), "x");
    assert_false(util_replace_file(dir, write_new, NULL, why, sizeof why));
    assert_non_null(strstr(why, "cannot rename"));
    assert_int_equal(th_files_starting(tmp_dir, "a_folder.json"), 1);

    /* No folder to write in. */
    assert_false(util_replace_file(tmp_path("missing/x.json"), write_new, NULL, why, sizeof why));
    assert_non_null(strstr(why, "cannot create"));
}

typedef struct known_key {
    const char *family, *key;
} known_key;

#define KNOWN_KEY(family, key) {family, key},
static const known_key known_keys[] = {LLMCL_KERNEL_KEYS(KNOWN_KEY)};

/* The family of a kernel key of llmcl_kernels.h, or NULL. */
static const char *family_of_key(const char *key)
{
    for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0]; ++i)
        if (strcmp(known_keys[i].key, key) == 0)
            return known_keys[i].family;
    return NULL;
}

static void test_tuner_spells_known_keys(void **state)
{
    (void)state;
    int n = 0;
    for (const tune_kernel *k = tune_kernels; k->key; ++k, ++n) {
        const char *family = family_of_key(k->key);
        if (!family || strcmp(family, k->family) != 0)
            fail_msg("llmcl-tune's kernel %s (%s) is not a key of llmcl_kernels.h's family %s",
                     k->key, k->family, family ? family : "(none)");
    }
    assert_true(n > 0);
}

/* Every entry of the built-in tuning files (data/tuning/) names a key of llmcl_kernels.h: an entry
   whose key no launcher looks up would never apply. */
static void test_builtin_files_spell_known_keys(void **state)
{
    (void)state;
    const char *dir_path = getenv("LLMCL_TUNING_DIR_FOR_TESTS");
    assert_non_null(dir_path);
    DIR *dir = opendir(dir_path);
    assert_non_null(dir);
    int files = 0, entries = 0;
    for (const struct dirent *e; (e = readdir(dir)) != NULL;) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        json_error_t err;
        json_t *root = json_load_file(path, 0, &err);
        if (!root)
            fail_msg("%s: %s", path, err.text);
        const json_t *list = json_object_get(root, "entries");
        for (size_t i = 0; i < json_array_size(list); ++i, ++entries) {
            const char *key = json_string_value(json_object_get(json_array_get(list, i), "kernel"));
            if (!key || !family_of_key(key))
                fail_msg("%s: entry %zu names kernel %s, no key of llmcl_kernels.h", path, i,
                         key ? key : "(none)");
        }
        json_decref(root);
        ++files;
    }
    closedir(dir);
    assert_true(files > 0 && entries > 0);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/llmcl-tune-test-XXXXXX");
    if (mkdtemp(tmp_dir) == NULL)
        return 1;
    unsetenv("LLMCL_TUNE_DB");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_precedence),
        cmocka_unit_test(test_reset_reloads_startup_files),
        cmocka_unit_test(test_malformed_and_foreign),
        cmocka_unit_test(test_unknown_keys_ignored),
        cmocka_unit_test(test_missing_fields),
        cmocka_unit_test(test_shape_class_spellings),
        cmocka_unit_test(test_env_and_cache_dir),
        cmocka_unit_test(test_override_reaches_launch),
        cmocka_unit_test(test_adjusted_values_recorded),
        cmocka_unit_test(test_norm_entry_for_longer_rows),
        cmocka_unit_test(test_tuner_rejects_planted),
        cmocka_unit_test(test_tuner_tolerates_sums),
        cmocka_unit_test(test_tuner_derives_inputs),
        cmocka_unit_test(test_restrict_space), cmocka_unit_test(test_candidate_order),
        cmocka_unit_test(test_tool_end_to_end),
        cmocka_unit_test(test_tuner_spells_known_keys),
        cmocka_unit_test(test_builtin_files_spell_known_keys),
        cmocka_unit_test(test_replace_file), cmocka_unit_test(test_median),
        cmocka_unit_test(test_appendf),
    };
    int rc = TH_RUN(tests);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        return 1;
    return rc;
}
