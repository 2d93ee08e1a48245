/*
 * tune_db.c: the tuning database (CLBlast's model: device -> kernel -> dtype -> shape class ->
 * parameters, with a wildcard default at each level). Files are JSON read with jansson; a file that
 * is malformed, foreign or for another device is skipped with a warning, never fatal. Lookups apply
 * every matching entry from the least to the most specific, so a specific entry overrides only the
 * parameters it sets. docs/TUNING.md describes the format.
 */
#include "src/runtime/tune_db.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <jansson.h>

#define ANY_DTYPE (-1)
#define WARN_CAP 8192
#define MAX_USED 4096
#define MAX_CLASS_DISTANCE 2 /* in powers of two */

/* How an entry's device was matched: higher is more specific. Overrides sit above every file. */
enum { DEV_ANY = 0, DEV_CLASS = 1, DEV_NAME = 2, DEV_OVERRIDE = 3 };

typedef struct tune_entry {
    char kernel[48];
    int dtype;            /* ANY_DTYPE or an llmcl_dtype */
    char shape_class[16]; /* "" for any */
    int device_level;
    int order; /* load order: at equal specificity the later source wins */
    llmcl__params params;
} tune_entry;

typedef struct tune_used {
    char kernel[48];
    int dtype;
    char shape_class[16];
    llmcl__params params;
} tune_used;

struct llmcl__tune_db {
    tune_entry *entries;
    size_t n, cap;
    tune_used *used;
    size_t n_used, cap_used;
    int next_order;
    char warnings[WARN_CAP];
};

/* ---- warnings ---- */

static void warn(llmcl__tune_db *db, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(llmcl__tune_db *db, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    llmcl__log("tuning: %s", line);
    size_t len = strlen(db->warnings);
    if (len + 2 < WARN_CAP)
        snprintf(db->warnings + len, WARN_CAP - len, "%s\n", line);
}

/* ---- small parsers ---- */

static bool same_ci(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; ++hay)
        if (strncasecmp(hay, needle, n) == 0)
            return true;
    return n == 0;
}

/* "f32", "bf16", ... (any case) or "*"; false for anything else. */
static bool parse_dtype(const char *s, int *out)
{
    if (strcmp(s, "*") == 0) {
        *out = ANY_DTYPE;
        return true;
    }
    for (int d = 0; d < LLMCL_DTYPE_COUNT; ++d)
        if (same_ci(s, llmcl_dtype_name((llmcl_dtype)d))) {
            *out = d;
            return true;
        }
    return false;
}

/* The exponent k of a class "p<k>", or -1. */
static int class_exponent(const char *cls)
{
    if (cls[0] != 'p' || !isdigit((unsigned char)cls[1]))
        return -1;
    char *end;
    long k = strtol(cls + 1, &end, 10);
    return (*end == '\0' && k >= 0 && k < 64) ? (int)k : -1;
}

/*
 * A shape argument as the class stored in entries: "*" or "" -> "" (any), "p<k>" as is, a decimal
 * size key -> its class. False when it is none of these.
 */
static bool normalise_class(const char *shape, char out[16])
{
    if (shape == NULL || shape[0] == '\0' || strcmp(shape, "*") == 0) {
        out[0] = '\0';
        return true;
    }
    const int k = class_exponent(shape);
    if (k >= 0) {
        /* rewritten, not copied: "p020" is class p20, and a copy of "p000000000000000020" would
           be cut to 15 characters, another class */
        snprintf(out, 16, "p%d", k);
        return true;
    }
    char *end;
    errno = 0;
    long long key = strtoll(shape, &end, 10);
    if (errno != 0 || *end != '\0' || end == shape || key < 1)
        return false;
    llmcl__shape_class(key, out);
    return true;
}

static bool valid_param_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 32 || !(isupper((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (size_t i = 0; i < n; ++i)
        if (!(isupper((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_'))
            return false;
    return true;
}

/* Parses "NAME=VALUE NAME=VALUE" (spaces or commas between pairs). */
static bool parse_param_text(const char *text, llmcl__params *p, char *why, size_t why_len)
{
    memset(p, 0, sizeof *p);
    const char *s = text;
    for (;;) {
        while (*s == ' ' || *s == ',' || *s == '\t')
            ++s;
        if (*s == '\0')
            return true;
        char name[32];
        size_t n = strcspn(s, "=");
        if (s[n] != '=' || n >= sizeof name) {
            snprintf(why, why_len, "expected NAME=VALUE at \"%s\"", s);
            return false;
        }
        memcpy(name, s, n);
        name[n] = '\0';
        if (!valid_param_name(name)) {
            snprintf(why, why_len, "bad parameter name \"%s\" (A-Z, 0-9, _)", name);
            return false;
        }
        char *end;
        errno = 0;
        long v = strtol(s + n + 1, &end, 10);
        if (errno != 0 || end == s + n + 1 || (*end != '\0' && *end != ' ' && *end != ',')) {
            snprintf(why, why_len, "parameter %s needs an integer value", name);
            return false;
        }
        if (p->n == LLMCL__MAX_PARAMS && llmcl__param_get(p, name, LONG_MIN) == LONG_MIN) {
            snprintf(why, why_len, "more than %d parameters", LLMCL__MAX_PARAMS);
            return false;
        }
        llmcl__param_set(p, name, v);
        s = end;
    }
}

/* ---- entries ---- */

static bool add_entry(llmcl__tune_db *db, const tune_entry *e)
{
    if (db->n == db->cap) {
        size_t cap = db->cap ? 2 * db->cap : 64;
        tune_entry *grown = realloc(db->entries, cap * sizeof *grown);
        if (grown == NULL)
            return false;
        db->entries = grown;
        db->cap = cap;
    }
    db->entries[db->n++] = *e;
    return true;
}

/* How specific an entry is for a lookup of class cls, or -1 when it does not match. */
static long entry_score(const tune_entry *e, const char *kernel, int dtype, const char *cls)
{
    if (strcmp(e->kernel, kernel) != 0 || (e->dtype != ANY_DTYPE && e->dtype != dtype))
        return -1;
    long class_score;
    if (e->shape_class[0] == '\0')
        class_score = 0;
    else if (strcmp(e->shape_class, cls) == 0)
        class_score = 99;
    else {
        /*
         * A tuned neighbour within a factor of 4 beats no entry (the tuner covers representative
         * shapes only); farther away, the launcher's shape-aware heuristics know better.
         */
        int a = class_exponent(e->shape_class), b = class_exponent(cls);
        if (a < 0 || b < 0 || abs(a - b) > MAX_CLASS_DISTANCE)
            return -1;
        class_score = 98 - abs(a - b);
    }
    return e->device_level * 1000 + (e->dtype != ANY_DTYPE) * 100 + class_score;
}

typedef struct scored {
    long score;
    int order;
    const tune_entry *e;
} scored;

static int by_score(const void *pa, const void *pb)
{
    const scored *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score < b->score ? -1 : 1;
    return (a->order > b->order) - (a->order < b->order);
}

/* Work-group sizes by naming convention: WG, WG_* and *_WG. */
static bool is_wg_name(const char *n)
{
    size_t len = strlen(n);
    return strcmp(n, "WG") == 0 || strncmp(n, "WG_", 3) == 0 ||
           (len > 3 && strcmp(n + len - 3, "_WG") == 0);
}

/* Which kinds of entry set a value of p: an llmcl_tune_override, a file's. */
typedef struct applied {
    bool overridden, tuned;
} applied;

/*
 * Applies matching entries to p from least to most specific (the most specific applied last);
 * with overrides_only, the llmcl_tune_override entries alone. With info (a launch), only the
 * tunables the launcher declared are set, and work-group sizes outside [1, the device's maximum]
 * are ignored, so a database cannot break a launch that way.
 */
static applied apply_entries(const llmcl__tune_db *db, const char *kernel, int dtype,
                             const char *cls, llmcl__params *p, const llmcl_device_info *info,
                             bool overrides_only)
{
    scored stack[64];
    scored *list = db->n <= 64 ? stack : malloc(db->n * sizeof *list);
    applied a = {false, false};
    if (list == NULL)
        return a;
    size_t m = 0;
    for (size_t i = 0; i < db->n; ++i) {
        if (overrides_only && db->entries[i].device_level != DEV_OVERRIDE)
            continue;
        long s = entry_score(&db->entries[i], kernel, dtype, cls);
        if (s >= 0)
            list[m++] = (scored){s, db->entries[i].order, &db->entries[i]};
    }
    qsort(list, m, sizeof *list, by_score);
    for (size_t i = 0; i < m; ++i) {
        const llmcl__params *q = &list[i].e->params;
        for (int j = 0; j < q->n; ++j) {
            if (info && llmcl__param_get(p, q->names[j], LONG_MIN) == LONG_MIN) {
                llmcl__log("tuning: kernel %s has no tunable %s; ignored", kernel, q->names[j]);
                continue;
            }
            if (info && is_wg_name(q->names[j]) &&
                (q->values[j] < 1 || (unsigned long)q->values[j] > info->max_work_group_size)) {
                llmcl__log("tuning: %s %s=%ld is outside [1, %zu]; ignored", kernel, q->names[j],
                           q->values[j], info->max_work_group_size);
                continue;
            }
            llmcl__param_set(p, q->names[j], q->values[j]);
            if (list[i].e->device_level == DEV_OVERRIDE)
                a.overridden = true;
            else
                a.tuned = true;
        }
    }
    if (list != stack)
        free(list);
    return a;
}

static tune_used *find_used(const llmcl__tune_db *db, const char *kernel, int dtype,
                            const char *cls)
{
    for (size_t i = 0; i < db->n_used; ++i) {
        tune_used *u = &db->used[i];
        if (u->dtype == dtype && strcmp(u->kernel, kernel) == 0 && strcmp(u->shape_class, cls) == 0)
            return u;
    }
    return NULL;
}

static tune_used *record_used(llmcl__tune_db *db, const char *kernel, int dtype, const char *cls,
                              const llmcl__params *p)
{
    tune_used *u = find_used(db, kernel, dtype, cls);
    if (u == NULL) {
        if (db->n_used == MAX_USED)
            return NULL;
        if (db->n_used == db->cap_used) {
            size_t cap = db->cap_used ? 2 * db->cap_used : 32;
            tune_used *grown = realloc(db->used, cap * sizeof *grown);
            if (grown == NULL)
                return NULL;
            db->used = grown;
            db->cap_used = cap;
        }
        u = &db->used[db->n_used++];
        snprintf(u->kernel, sizeof u->kernel, "%s", kernel);
        u->dtype = dtype;
        snprintf(u->shape_class, sizeof u->shape_class, "%s", cls);
    }
    u->params = *p;
    return u;
}

llmcl__tune_lookup llmcl__tune_db_apply(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                        const char *shape_class, llmcl__params *p,
                                        bool overrides_only)
{
    llmcl__tune_db *db = ctx->tune_db;
    if (db == NULL)
        return (llmcl__tune_lookup){0};
    const char *cls = shape_class ? shape_class : "";
    const applied a = apply_entries(db, kernel, (int)dtype, cls, p, &ctx->info, overrides_only);
    const tune_used *u = record_used(db, kernel, (int)dtype, cls, p);
    if (u == NULL)
        return (llmcl__tune_lookup){.overridden = a.overridden, .tuned = a.tuned};
    return (llmcl__tune_lookup){a.overridden, a.tuned, db, (size_t)(u - db->used)};
}

void llmcl__tune_db_record(const llmcl__tune_lookup *lookup, const llmcl__params *p)
{
    if (lookup->db && lookup->slot < lookup->db->n_used)
        lookup->db->used[lookup->slot].params = *p;
}

/* ---- files ---- */

/* The device level at which a file's "device" object matches ctx's device, or -1 with why. */
static int match_device(const llmcl_device_info *info, json_t *dev, char *why, size_t why_len)
{
    const char *name = json_string_value(json_object_get(dev, "name"));
    const char *vendor = json_string_value(json_object_get(dev, "vendor"));
    const char *platform = json_string_value(json_object_get(dev, "platform"));
    const char *type = json_string_value(json_object_get(dev, "type"));
    if (vendor && !contains_ci(info->vendor, vendor)) {
        snprintf(why, why_len, "vendor \"%s\", this device's is \"%s\"", vendor, info->vendor);
        return -1;
    }
    if (platform && !contains_ci(info->platform_name, platform)) {
        snprintf(why, why_len, "platform \"%s\", this device's is \"%s\"", platform,
                 info->platform_name);
        return -1;
    }
    if (type && !same_ci(type, info->is_gpu ? "gpu" : "cpu")) {
        snprintf(why, why_len, "device type \"%s\", this device is a %s", type,
                 info->is_gpu ? "gpu" : "cpu");
        return -1;
    }
    if (strcmp(name, "*") != 0) {
        if (!same_ci(name, info->name)) {
            snprintf(why, why_len, "device \"%s\", this device is \"%s\"", name, info->name);
            return -1;
        }
        return DEV_NAME;
    }
    return (vendor || platform || type) ? DEV_CLASS : DEV_ANY;
}

/* One element of "entries": false (with why) when it is unusable. */
static bool parse_entry(json_t *je, int device_level, tune_entry *e, char *why, size_t why_len)
{
    memset(e, 0, sizeof *e);
    e->device_level = device_level;
    if (!json_is_object(je)) {
        snprintf(why, why_len, "not an object");
        return false;
    }
    json_t *jk = json_object_get(je, "kernel"), *jp = json_object_get(je, "params");
    json_t *jd = json_object_get(je, "dtype"), *js = json_object_get(je, "shape_class");
    if (!json_is_string(jk) || json_string_length(jk) == 0 ||
        json_string_length(jk) >= sizeof e->kernel) {
        snprintf(why, why_len, "missing or bad \"kernel\" (a string)");
        return false;
    }
    snprintf(e->kernel, sizeof e->kernel, "%s", json_string_value(jk));
    if (!json_is_object(jp)) {
        snprintf(why, why_len, "kernel %s: missing or bad \"params\" (an object)", e->kernel);
        return false;
    }
    e->dtype = ANY_DTYPE;
    if (jd && (!json_is_string(jd) || !parse_dtype(json_string_value(jd), &e->dtype))) {
        snprintf(why, why_len, "kernel %s: bad \"dtype\" (f32, bf16, f16, i32, i64 or *)",
                 e->kernel);
        return false;
    }
    if (js && (!json_is_string(js) || !normalise_class(json_string_value(js), e->shape_class))) {
        snprintf(why, why_len, "kernel %s: bad \"shape_class\" (p<k>, a size or *)", e->kernel);
        return false;
    }
    const char *name;
    json_t *jv;
    json_object_foreach(jp, name, jv)
    {
        if (!valid_param_name(name) || !json_is_integer(jv)) {
            snprintf(why, why_len, "kernel %s: parameter \"%s\" needs an A-Z name and an integer",
                     e->kernel, name);
            return false;
        }
        if (e->params.n == LLMCL__MAX_PARAMS) {
            snprintf(why, why_len, "kernel %s: more than %d parameters", e->kernel,
                     LLMCL__MAX_PARAMS);
            return false;
        }
        llmcl__param_set(&e->params, name, (long)json_integer_value(jv));
    }
    return true;
}

/*
 * Adds a parsed file's entries for this device. A file for another device is an error unless
 * foreign_ok (built-in and cache files serve many devices). Entries that cannot be used are
 * skipped with a warning; the rest still apply.
 */
static llmcl_status load_json(llmcl_ctx *ctx, json_t *root, const char *what, bool foreign_ok,
                              char *why, size_t why_len)
{
    llmcl__tune_db *db = ctx->tune_db;
    const char *format = json_string_value(json_object_get(root, "format"));
    json_t *jver = json_object_get(root, "version"), *dev = json_object_get(root, "device");
    json_t *entries = json_object_get(root, "entries");
    if (!json_is_object(root) || format == NULL || strcmp(format, LLMCL__TUNE_FORMAT) != 0) {
        snprintf(why, why_len, "not a tuning file (needs \"format\": \"%s\")", LLMCL__TUNE_FORMAT);
        return LLMCL_ERROR_TUNE_DB;
    }
    if (!json_is_integer(jver) || json_integer_value(jver) < 1 ||
        json_integer_value(jver) > LLMCL__TUNE_VERSION) {
        snprintf(why, why_len, "\"version\" must be an integer from 1 to %d", LLMCL__TUNE_VERSION);
        return LLMCL_ERROR_TUNE_DB;
    }
    if (!json_is_object(dev) || !json_is_string(json_object_get(dev, "name"))) {
        snprintf(why, why_len, "missing \"device\" object with a \"name\"");
        return LLMCL_ERROR_TUNE_DB;
    }
    if (!json_is_array(entries)) {
        snprintf(why, why_len, "missing \"entries\" array");
        return LLMCL_ERROR_TUNE_DB;
    }
    int level = match_device(&ctx->info, dev, why, why_len);
    if (level < 0) {
        if (foreign_ok) {
            llmcl__log("tuning: %s is for %s; skipped", what, why);
            return LLMCL_OK;
        }
        return LLMCL_ERROR_TUNE_DB;
    }
    const char *driver = json_string_value(json_object_get(dev, "driver_version"));
    if (level == DEV_NAME && driver && strcmp(driver, ctx->info.driver_version) != 0)
        llmcl__log("tuning: %s was tuned with driver %s, this one is %s", what, driver,
                   ctx->info.driver_version);
    int order = db->next_order++;
    size_t i;
    json_t *je;
    json_array_foreach(entries, i, je)
    {
        tune_entry e;
        char ewhy[256];
        if (!parse_entry(je, level, &e, ewhy, sizeof ewhy)) {
            warn(db, "%s: entry %zu skipped: %s", what, i, ewhy);
            continue;
        }
        e.order = order;
        if (!add_entry(db, &e)) {
            snprintf(why, why_len, "out of host memory");
            return LLMCL_ERROR_OUT_OF_HOST_MEMORY;
        }
    }
    return LLMCL_OK;
}

static llmcl_status load_text(llmcl_ctx *ctx, const char *text, size_t len, const char *what,
                              bool foreign_ok, char *why, size_t why_len)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL) {
        snprintf(why, why_len, "malformed JSON at line %d column %d: %s", err.line, err.column,
                 err.text);
        return LLMCL_ERROR_TUNE_DB;
    }
    llmcl_status st = load_json(ctx, root, what, foreign_ok, why, why_len);
    json_decref(root);
    return st;
}

static llmcl_status load_file(llmcl_ctx *ctx, const char *path, bool foreign_ok, char *why,
                              size_t why_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return LLMCL_ERROR_IO;
    }
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    llmcl_status st = LLMCL_OK;
    do {
        if (len + 65536 > cap) {
            cap = 2 * cap + 65536;
            char *grown = realloc(text, cap);
            if (grown == NULL) {
                st = LLMCL_ERROR_OUT_OF_HOST_MEMORY;
                snprintf(why, why_len, "out of host memory");
                break;
            }
            text = grown;
        }
        got = fread(text + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    if (st == LLMCL_OK && ferror(f)) {
        st = LLMCL_ERROR_IO;
        snprintf(why, why_len, "read error");
    }
    fclose(f);
    if (st == LLMCL_OK)
        st = load_text(ctx, text, len, path, foreign_ok, why, why_len);
    free(text);
    return st;
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        free(names[i]);
    free(names);
}

/* The names of dir's files `prefix*.json`, sorted, into *names (*n of them); false when out of host
   memory, with nothing listed: a part would depend on the order readdir gave. */
static bool list_json(DIR *d, const char *prefix, char ***names, size_t *n)
{
    size_t cap = 0;
    bool ok = true;
    *names = NULL;
    *n = 0;
    for (struct dirent *de; ok && (de = readdir(d)) != NULL;) {
        const size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0 || len <= 5 ||
            strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        if (*n == cap) {
            const size_t grown = cap ? 2 * cap : 64;
            char **more = realloc(*names, grown * sizeof **names);
            if (!(ok = more != NULL))
                break;
            *names = more;
            cap = grown;
        }
        if ((ok = ((*names)[*n] = strdup(de->d_name)) != NULL))
            ++*n;
    }
    if (!ok) {
        free_names(*names, *n);
        *names = NULL;
        *n = 0;
        return false;
    }
    if (*n > 1)
        qsort(*names, *n, sizeof **names, by_string);
    return true;
}

/* Loads dir/<prefix>*.json in name order, with warnings for bad files. */
static void load_dir(llmcl_ctx *ctx, const char *dir, const char *prefix, bool foreign_ok)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    char **names;
    size_t n;
    const bool listed = list_json(d, prefix, &names, &n);
    closedir(d);
    if (!listed)
        warn(ctx->tune_db, "%s: out of host memory listing its tuning files; none read", dir);
    for (size_t i = 0; i < n; ++i) {
        char path[2048], why[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (load_file(ctx, path, foreign_ok, why, sizeof why) != LLMCL_OK)
            warn(ctx->tune_db, "%s ignored: %s", path, why);
    }
    free_names(names, n);
}

/* A path from LLMCL_TUNE_DB: a file, or a folder whose *.json files are read. */
static void load_env_path(llmcl_ctx *ctx, const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        load_dir(ctx, path, "", false);
        return;
    }
    char why[512];
    if (load_file(ctx, path, false, why, sizeof why) != LLMCL_OK)
        warn(ctx->tune_db, "LLMCL_TUNE_DB file %s ignored: %s", path, why);
}

/* What a new context loads: the built-in files, the cache folder's, then LLMCL_TUNE_DB's. */
static void load_startup_files(llmcl_ctx *ctx)
{
    const char *env = llmcl__getenv("LLMCL_TUNE_DB");
    if (env && same_ci(env, "off"))
        return;
    for (const llmcl__embedded_source *s = llmcl__embedded_tuning; s->family; ++s) {
        char why[512];
        if (load_text(ctx, (const char *)s->data, s->size, s->family, true, why, sizeof why) !=
            LLMCL_OK)
            warn(ctx->tune_db, "built-in tuning file %s ignored: %s", s->family, why);
    }
    if (ctx->cache_dir[0])
        load_dir(ctx, ctx->cache_dir, "tuning", true);
    if (env) {
        char *list = strdup(env);
        char *save = NULL;
        for (char *p = list ? strtok_r(list, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save))
            load_env_path(ctx, p);
        free(list);
    }
}

llmcl__tune_db *llmcl__tune_db_create(llmcl_ctx *ctx)
{
    llmcl__tune_db *db = calloc(1, sizeof *db);
    if (db == NULL)
        return NULL;
    ctx->tune_db = db;
    load_startup_files(ctx);
    return db;
}

void llmcl__tune_db_destroy(llmcl__tune_db *db)
{
    if (db == NULL)
        return;
    free(db->entries);
    free(db->used);
    free(db);
}

/* ---- public API ---- */

static llmcl_status check_db(llmcl_ctx *ctx)
{
    LLMCL__REQUIRE(NULL, ctx != NULL, LLMCL_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    if (ctx->tune_db == NULL)
        ctx->tune_db = calloc(1, sizeof *ctx->tune_db);
    LLMCL__REQUIRE(ctx, ctx->tune_db != NULL, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "out of host memory for the tuning database");
    return LLMCL_OK;
}

static llmcl_status check_key(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                              const char *shape, char cls[16])
{
    LLMCL__REQUIRE(ctx, kernel != NULL && kernel[0] != '\0' && strlen(kernel) < 48,
                   LLMCL_ERROR_INVALID_ARGUMENT, "kernel must be a name of 1 to 47 characters");
    LLMCL__REQUIRE(ctx, (unsigned)dtype < LLMCL_DTYPE_COUNT, LLMCL_ERROR_INVALID_ARGUMENT,
                   "dtype %d is not an llmcl_dtype", (int)dtype);
    LLMCL__REQUIRE(ctx, normalise_class(shape, cls), LLMCL_ERROR_INVALID_ARGUMENT,
                   "shape \"%s\" is not a shape class p<k>, a positive size or *", shape);
    return LLMCL_OK;
}

static void params_text(const llmcl__params *p, char *buf, size_t size, size_t *needed)
{
    int idx[LLMCL__MAX_PARAMS];
    for (int i = 0; i < p->n; ++i)
        idx[i] = i;
    for (int i = 1; i < p->n; ++i) /* sorted by name, like the build options */
        for (int j = i; j > 0 && strcmp(p->names[idx[j - 1]], p->names[idx[j]]) > 0; --j) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    size_t len = 0;
    for (int i = 0; i < p->n; ++i) {
        int w = snprintf(buf ? buf + (len < size ? len : size) : NULL,
                         buf && len < size ? size - len : 0, "%s%s=%ld", i ? " " : "",
                         p->names[idx[i]], p->values[idx[i]]);
        len += (size_t)w;
    }
    if (buf && size && p->n == 0)
        buf[0] = '\0';
    *needed = len + 1;
}

llmcl_status llmcl_tune_params_get(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                   const char *shape, char *buf, size_t size, int *launched)
{
    LLMCL__TRY(check_db(ctx));
    char cls[16];
    LLMCL__TRY(check_key(ctx, kernel, dtype, shape, cls));
    LLMCL__REQUIRE(ctx, buf != NULL && size > 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "buf is NULL or size is 0");
    llmcl__params p = {0};
    const tune_used *u = find_used(ctx->tune_db, kernel, (int)dtype, cls);
    if (u)
        p = u->params;
    else
        apply_entries(ctx->tune_db, kernel, (int)dtype, cls, &p, NULL, false);
    if (launched)
        *launched = u != NULL;
    size_t needed;
    params_text(&p, buf, size, &needed);
    LLMCL__REQUIRE(ctx, needed <= size, LLMCL_ERROR_INVALID_ARGUMENT,
                   "buf holds %zu bytes, the parameters of %s need %zu", size, kernel, needed);
    return LLMCL_OK;
}

llmcl_status llmcl_tune_override(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                 const char *shape, const char *params)
{
    LLMCL__TRY(check_db(ctx));
    llmcl__tune_db *db = ctx->tune_db;
    if (kernel == NULL) {
        size_t m = 0;
        for (size_t i = 0; i < db->n; ++i)
            if (db->entries[i].device_level != DEV_OVERRIDE)
                db->entries[m++] = db->entries[i];
        db->n = m;
        return LLMCL_OK;
    }
    char cls[16];
    LLMCL__TRY(check_key(ctx, kernel, dtype, shape, cls));
    tune_entry e = {.dtype = (int)dtype, .device_level = DEV_OVERRIDE};
    snprintf(e.kernel, sizeof e.kernel, "%s", kernel);
    snprintf(e.shape_class, sizeof e.shape_class, "%s", cls);
    if (params != NULL) {
        char why[256];
        LLMCL__REQUIRE(ctx, parse_param_text(params, &e.params, why, sizeof why),
                       LLMCL_ERROR_INVALID_ARGUMENT, "params \"%s\": %s", params, why);
    }
    size_t m = 0; /* an override replaces the previous one for the same key */
    for (size_t i = 0; i < db->n; ++i) {
        const tune_entry *o = &db->entries[i];
        if (!(o->device_level == DEV_OVERRIDE && o->dtype == e.dtype &&
              strcmp(o->kernel, e.kernel) == 0 && strcmp(o->shape_class, e.shape_class) == 0))
            db->entries[m++] = *o;
    }
    db->n = m;
    if (params == NULL)
        return LLMCL_OK;
    e.order = db->next_order++;
    LLMCL__REQUIRE(ctx, add_entry(db, &e), LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "out of host memory for a tuning override");
    return LLMCL_OK;
}

llmcl_status llmcl_tune_db_load(llmcl_ctx *ctx, const char *path)
{
    LLMCL__TRY(check_db(ctx));
    LLMCL__REQUIRE(ctx, path != NULL && path[0] != '\0', LLMCL_ERROR_INVALID_ARGUMENT,
                   "path is NULL or empty");
    llmcl__tune_db *db = ctx->tune_db;
    size_t before = db->n;
    char why[512];
    llmcl_status st = load_file(ctx, path, false, why, sizeof why);
    if (st != LLMCL_OK) {
        db->n = before;
        warn(db, "%s ignored: %s", path, why);
        return LLMCL__FAIL(ctx, st, "tuning file %s: %s", path, why);
    }
    return LLMCL_OK;
}

llmcl_status llmcl_tune_db_clear(llmcl_ctx *ctx)
{
    LLMCL__TRY(check_db(ctx));
    ctx->tune_db->n = 0;
    ctx->tune_db->n_used = 0;
    ctx->tune_db->warnings[0] = '\0';
    return LLMCL_OK;
}

llmcl_status llmcl_tune_db_reset(llmcl_ctx *ctx)
{
    LLMCL__TRY(llmcl_tune_db_clear(ctx));
    load_startup_files(ctx);
    return LLMCL_OK;
}

const char *llmcl_tune_db_warnings(const llmcl_ctx *ctx)
{
    return ctx && ctx->tune_db ? ctx->tune_db->warnings : "";
}

llmcl_status llmcl_tune_shape_class(int64_t size_key, char out[16])
{
    LLMCL__REQUIRE(NULL, out != NULL && size_key >= 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "size_key %lld must be >= 1 and out non-NULL", (long long)size_key);
    llmcl__shape_class(size_key, out);
    return LLMCL_OK;
}
