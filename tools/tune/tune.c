/*
 * tune.c: llmcl-tune's engine. For one kernel at one dtype and shape: run the reference
 * configuration (the launcher's defaults), then each candidate of the parameter space forced with
 * llmcl_tune_override(); drop those over device limits, failing to build, adjusted by the launcher
 * or differing from the reference; time the rest (warm-up, median of repeats, rotated buffer sets
 * with profiling events). Also writes the JSON tuning file. Uses only the public API.
 */
#include "tune.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "util/util.h"

#define MAX_SETS 8

/* ---- parsing the table's strings ---- */

typedef struct space {
    int n;
    char names[TUNE_MAX_PARAMS][32];
    int counts[TUNE_MAX_PARAMS];
    long values[TUNE_MAX_PARAMS][TUNE_MAX_VALUES];
} space;

static bool parse_space(const char *text, space *s)
{
    memset(s, 0, sizeof *s);
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            ++p;
        if (*p == '\0')
            break;
        if (s->n == TUNE_MAX_PARAMS)
            return false;
        size_t n = strcspn(p, "=");
        if (p[n] != '=' || n == 0 || n >= 32)
            return false;
        memcpy(s->names[s->n], p, n);
        p += n + 1;
        for (;;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || s->counts[s->n] == TUNE_MAX_VALUES)
                return false;
            s->values[s->n][s->counts[s->n]++] = v;
            p = end;
            if (*p != ',')
                break;
            ++p;
        }
        if (*p != ' ' && *p != '\0')
            return false;
        ++s->n;
    }
    return s->n > 0;
}

int tune_restrict_space(const char *table, const char *restrict_to, char *out, size_t n)
{
    space t, r;
    if (!parse_space(table, &t) || !parse_space(restrict_to, &r))
        return -1;
    int used = 0;
    for (int i = 0; i < r.n; ++i)
        for (int j = 0; j < t.n; ++j)
            if (strcmp(r.names[i], t.names[j]) == 0) {
                t.counts[j] = r.counts[i];
                memcpy(t.values[j], r.values[i], sizeof t.values[j]);
                used |= 1 << i;
            }
    size_t len = 0;
    for (int j = 0; j < t.n && len < n; ++j) {
        len += (size_t)snprintf(out + len, n - len, "%s%s=", j ? " " : "", t.names[j]);
        for (int v = 0; v < t.counts[j] && len < n; ++v)
            len += (size_t)snprintf(out + len, n - len, "%s%ld", v ? "," : "", t.values[j][v]);
    }
    return len < n ? used : -1;
}

long tune_space_size(const tune_kernel *k)
{
    space s;
    if (!parse_space(k->params, &s))
        return -1;
    long total = 1; /* at most TUNE_MAX_VALUES ^ TUNE_MAX_PARAMS = 2^48 */
    for (int i = 0; i < s.n; ++i)
        total *= s.counts[i];
    return total;
}

/* "R=4096,C=4096" into the case's dims. */
static bool parse_shape(const char *text, tune_case *c)
{
    c->n_dims = 0;
    const char *p = text;
    while (*p) {
        size_t n = strcspn(p, "=");
        if (p[n] != '=' || n == 0 || n >= sizeof c->dim_names[0] || c->n_dims == TUNE_MAX_DIMS)
            return false;
        memcpy(c->dim_names[c->n_dims], p, n);
        c->dim_names[c->n_dims][n] = '\0';
        char *end;
        long long v = strtoll(p + n + 1, &end, 10);
        if (end == p + n + 1 || v < 1 || (*end != ',' && *end != '\0'))
            return false;
        c->dims[c->n_dims++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return c->n_dims > 0;
}

int64_t tune_dim(const tune_case *c, const char *name)
{
    for (int i = 0; i < c->n_dims; ++i)
        if (strcmp(c->dim_names[i], name) == 0)
            return c->dims[i];
    return -1;
}

/* The product of the dims named in "A*B" (or "A,B"), or -1 when one is missing. */
static int64_t dims_product(const tune_case *c, const char *list, int64_t *shape, int *ndim)
{
    int64_t prod = 1;
    int n = 0;
    const char *p = list;
    while (*p) {
        char name[8];
        size_t len = strcspn(p, "*,");
        if (len == 0 || len >= sizeof name || n == LLMCL_MAX_DIMS)
            return -1;
        memcpy(name, p, len);
        name[len] = '\0';
        int64_t d = tune_dim(c, name);
        if (d < 1)
            return -1;
        if (shape)
            shape[n] = d;
        ++n;
        prod *= d;
        p += len + (p[len] != '\0');
    }
    if (ndim)
        *ndim = n;
    return n ? prod : -1;
}

const tune_kernel *tune_find(const tune_kernel *table, const char *key)
{
    for (const tune_kernel *k = table; k->key; ++k)
        if (strcmp(k->key, key) == 0)
            return k;
    return NULL;
}

/* ---- parameter text ---- */

/* The value of name in "A=1 B=2", or false. */
static bool text_get(const char *text, const char *name, long *out)
{
    size_t n = strlen(name);
    for (const char *p = text; *p;) {
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            *out = strtol(p + n + 1, NULL, 10);
            return true;
        }
        p += strcspn(p, " ");
        p += *p == ' ';
    }
    return false;
}

/* "A=1 B=2" with name's value replaced; the names are already present. */
static void text_set(char *text, size_t size, const char *name, long v)
{
    char out[TUNE_TEXT] = "";
    size_t n = strlen(name), len = 0;
    for (const char *p = text; *p;) {
        size_t w = strcspn(p, " ");
        if (strncmp(p, name, n) == 0 && p[n] == '=')
            len +=
                (size_t)snprintf(out + len, sizeof out - len, "%s%s=%ld", len ? " " : "", name, v);
        else
            len +=
                (size_t)snprintf(out + len, sizeof out - len, "%s%.*s", len ? " " : "", (int)w, p);
        if (len >= sizeof out)
            len = sizeof out - 1;
        p += w;
        p += *p == ' ';
    }
    snprintf(text, size, "%s", out);
}

/* ---- host data in storage dtypes ---- */

static void to_storage(llmcl_dtype dt, double v, unsigned char *dst)
{
    switch (dt) {
    case LLMCL_F32: {
        float f = (float)v;
        memcpy(dst, &f, 4);
        break;
    }
    case LLMCL_BF16: {
        uint16_t h = llmcl_f32_to_bf16((float)v);
        memcpy(dst, &h, 2);
        break;
    }
    case LLMCL_F16: {
        uint16_t h = llmcl_f32_to_f16((float)v);
        memcpy(dst, &h, 2);
        break;
    }
    case LLMCL_I32: {
        int32_t i = (int32_t)v;
        memcpy(dst, &i, 4);
        break;
    }
    default: {
        int64_t i = (int64_t)v;
        memcpy(dst, &i, 8);
        break;
    }
    }
}

static double from_storage(llmcl_dtype dt, const unsigned char *src)
{
    switch (dt) {
    case LLMCL_F32: {
        float f;
        memcpy(&f, src, 4);
        return f;
    }
    case LLMCL_BF16: {
        uint16_t h;
        memcpy(&h, src, 2);
        return llmcl_bf16_to_f32(h);
    }
    case LLMCL_F16: {
        uint16_t h;
        memcpy(&h, src, 2);
        return llmcl_f16_to_f32(h);
    }
    case LLMCL_I32: {
        int32_t i;
        memcpy(&i, src, 4);
        return i;
    }
    default: {
        int64_t i;
        memcpy(&i, src, 8);
        return (double)i;
    }
    }
}

/* ---- the buffers of a case ---- */

typedef struct bufs {
    int n_tensors, n_sets;
    llmcl_tensor *t[MAX_SETS][TUNE_MAX_TENSORS];
    llmcl_dtype dtype[TUNE_MAX_TENSORS];
    size_t bytes[TUNE_MAX_TENSORS];
    unsigned char *host[TUNE_MAX_TENSORS]; /* set 0's initial contents */
    unsigned char *ref[TUNE_MAX_TENSORS];  /* the reference's outputs */
    unsigned char *got;                    /* scratch for downloads */
} bufs;

static void bufs_free(bufs *b)
{
    for (int s = 0; s < b->n_sets; ++s)
        for (int i = 0; i < b->n_tensors; ++i)
            llmcl_tensor_destroy(b->t[s][i]);
    for (int i = 0; i < b->n_tensors; ++i) {
        free(b->host[i]);
        free(b->ref[i]);
    }
    free(b->got);
    memset(b, 0, sizeof *b);
}

static llmcl_status fail(tune_result *r, llmcl_status st, const char *fmt, const char *detail)
{
    snprintf(r->error, sizeof r->error, fmt, detail);
    return st;
}

/* The kernel's derived inputs, computed on set 0, as the host copies and every set's inputs. */
static llmcl_status bufs_derive_inputs(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c,
                                       bufs *b, tune_result *r)
{
    llmcl_status st = k->derive_inputs(ctx, b->t[0], c);
    for (int i = 0; i < b->n_tensors && st == LLMCL_OK; ++i) {
        if (k->tensors[i].role != TUNE_IN)
            continue;
        st = llmcl_tensor_download(b->t[0][i], b->host[i], b->bytes[i]);
        for (int s = 1; s < b->n_sets && st == LLMCL_OK; ++s)
            st = llmcl_tensor_upload(b->t[s][i], b->host[i], b->bytes[i]);
    }
    return st == LLMCL_OK ? LLMCL_OK
                          : fail(r, st, "deriving the inputs: %s", llmcl_last_error(ctx));
}

static llmcl_status bufs_create(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c,
                                const tune_options *o, bufs *b, tune_result *r)
{
    memset(b, 0, sizeof *b);
    size_t set_bytes = 0, largest = 0;
    int64_t shapes[TUNE_MAX_TENSORS][LLMCL_MAX_DIMS];
    int ndims[TUNE_MAX_TENSORS];
    uint64_t seed = 42;
    for (int i = 0; i < TUNE_MAX_TENSORS && k->tensors[i].name; ++i) {
        const tune_tensor_spec *ts = &k->tensors[i];
        b->dtype[i] = ts->fixed_dtype ? (llmcl_dtype)(ts->fixed_dtype - 1) : c->dtype;
        int64_t numel = dims_product(c, ts->dims, shapes[i], &ndims[i]);
        if (numel < 1)
            return fail(r, LLMCL_ERROR_INVALID_ARGUMENT, "tensor %s: a dim of the shape is missing",
                        ts->name);
        b->bytes[i] = (size_t)numel * llmcl_dtype_size(b->dtype[i]);
        set_bytes += b->bytes[i];
        largest = b->bytes[i] > largest ? b->bytes[i] : largest;
        b->host[i] = malloc(b->bytes[i]);
        b->ref[i] = malloc(b->bytes[i]);
        b->n_tensors = i + 1;
        if (!b->host[i] || !b->ref[i])
            return fail(r, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory for %s", ts->name);
        int64_t hi = ts->init == TUNE_INIT_INDEX ? tune_dim(c, ts->index_dim) : 0;
        if (ts->init == TUNE_INIT_INDEX && hi < 1)
            return fail(r, LLMCL_ERROR_INVALID_ARGUMENT, "tensor %s: bad index_dim", ts->name);
        size_t es = llmcl_dtype_size(b->dtype[i]);
        for (int64_t j = 0; j < numel; ++j) {
            double v;
            if (ts->init == TUNE_INIT_INDEX)
                v = (double)(util_splitmix64(&seed) % (uint64_t)hi);
            else if (ts->init == TUNE_INIT_NEAR_ONE)
                v = 0.9 + 0.2 * util_bits_to_unit(util_splitmix64(&seed));
            else /* Box-Muller */
                v = sqrt(-2.0 * log(1.0 - util_bits_to_unit(util_splitmix64(&seed)))) *
                    cos(6.283185307179586 * util_bits_to_unit(util_splitmix64(&seed)));
            to_storage(b->dtype[i], v, b->host[i] + (size_t)j * es);
        }
    }
    b->got = malloc(largest);
    if (!b->got)
        return fail(r, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory%s", "");
    /* Enough sets that consecutive runs do not find their data in a cache, within a memory cap. */
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    uint64_t cap = info->global_mem_bytes / 4;
    b->n_sets = (int)((o->rotate_bytes + set_bytes - 1) / set_bytes);
    b->n_sets = b->n_sets < 1 ? 1 : b->n_sets > MAX_SETS ? MAX_SETS : b->n_sets;
    while (b->n_sets > 1 && (uint64_t)b->n_sets * set_bytes > cap)
        --b->n_sets;
    for (int s = 0; s < b->n_sets; ++s)
        for (int i = 0; i < b->n_tensors; ++i) {
            llmcl_status st =
                llmcl_tensor_create(ctx, b->dtype[i], ndims[i], shapes[i], &b->t[s][i]);
            if (st == LLMCL_OK)
                st = llmcl_tensor_upload(b->t[s][i], b->host[i], b->bytes[i]);
            if (st != LLMCL_OK)
                return fail(r, st, "creating the tensors: %s", llmcl_last_error(ctx));
        }
    return k->derive_inputs ? bufs_derive_inputs(ctx, k, c, b, r) : LLMCL_OK;
}

/* Restores set 0's inputs and poisons its outputs (0xFF bytes: NaN or -1). */
static llmcl_status bufs_reset(const tune_kernel *k, bufs *b)
{
    for (int i = 0; i < b->n_tensors; ++i) {
        const unsigned char *src = b->host[i];
        if (k->tensors[i].role == TUNE_OUT) {
            memset(b->got, 0xFF, b->bytes[i]);
            src = b->got;
        }
        llmcl_status st = llmcl_tensor_upload(b->t[0][i], src, b->bytes[i]);
        if (st != LLMCL_OK)
            return st;
    }
    return LLMCL_OK;
}

static void dtype_tol(llmcl_dtype dt, double *atol, double *rtol)
{
    switch (dt) {
    case LLMCL_F32:
        *atol = 1e-5, *rtol = 1e-4;
        break;
    case LLMCL_BF16:
        *atol = 1e-2, *rtol = 1.6e-2;
        break;
    case LLMCL_F16:
        *atol = 1e-3, *rtol = 2e-3;
        break;
    default:
        *atol = 0, *rtol = 0;
        break;
    }
}

/* The root mean square of the finite values of n elements of dtype dt at p. */
static double rms_of(llmcl_dtype dt, const unsigned char *p, size_t n)
{
    const size_t es = llmcl_dtype_size(dt);
    double sum = 0;
    size_t finite = 0;
    for (size_t j = 0; j < n; ++j) {
        const double v = from_storage(dt, p + j * es);
        if (isfinite(v)) {
            sum += v * v;
            ++finite;
        }
    }
    return finite ? sqrt(sum / (double)finite) : 0.0;
}

/* Downloads set 0's outputs into ref (save) or compares them with ref; false with why on a
 * mismatch. */
static bool outputs(llmcl_ctx *ctx, const tune_kernel *k, bufs *b, bool save, char *why, size_t n)
{
    double scale = k->tol_scale > 0 ? k->tol_scale : 1.0;
    for (int i = 0; i < b->n_tensors; ++i) {
        if (k->tensors[i].role == TUNE_IN)
            continue;
        unsigned char *dst = save ? b->ref[i] : b->got;
        if (llmcl_tensor_download(b->t[0][i], dst, b->bytes[i]) != LLMCL_OK) {
            snprintf(why, n, "download of %s failed: %s", k->tensors[i].name,
                     llmcl_last_error(ctx));
            return false;
        }
        /* Most candidates only reorder the same arithmetic: the same bytes need no tolerance. */
        if (save || memcmp(b->ref[i], b->got, b->bytes[i]) == 0)
            continue;
        double atol, rtol;
        dtype_tol(b->dtype[i], &atol, &rtol);
        size_t es = llmcl_dtype_size(b->dtype[i]), numel = b->bytes[i] / es, bad = 0, first = 0;
        if (k->tol_rms)
            atol = fmax(atol, rtol * rms_of(b->dtype[i], b->ref[i], numel));
        double worst = 0;
        for (size_t j = 0; j < numel; ++j) {
            double want = from_storage(b->dtype[i], b->ref[i] + j * es);
            double got = from_storage(b->dtype[i], b->got + j * es);
            double d = fabs(got - want);
            bool ok = isnan(want)
                          ? isnan(got)
                          : (isinf(want) ? got == want : d <= scale * (atol + rtol * fabs(want)));
            if (!ok) {
                first = bad++ ? first : j;
                worst = isnan(d) || d > worst ? d : worst;
            }
        }
        if (bad) {
            snprintf(
                why, n,
                "%s: %zu of %zu values differ from the reference (first at %zu, max diff %.3g)",
                k->tensors[i].name, bad, numel, first, worst);
            return false;
        }
    }
    return true;
}

/* ---- running and timing ---- */

/*
 * Failures that mean "this candidate does not fit": the device refused the launch, or the launcher
 * refused the values (the reference ran on the same tensors, so its arguments are fine).
 */
static bool is_limit_error(llmcl_status st)
{
    return st == CL_INVALID_WORK_GROUP_SIZE || st == CL_INVALID_WORK_ITEM_SIZE ||
           st == CL_OUT_OF_RESOURCES || st == CL_INVALID_KERNEL_ARGS || st == CL_INVALID_ARG_SIZE ||
           st == LLMCL_ERROR_UNSUPPORTED || st == LLMCL_ERROR_INVALID_ARGUMENT;
}

/*
 * Median kernel time of o->reps runs after o->warmup, rotating over the buffer sets. Stops early,
 * returning the minimum seen and setting *stopped (if not NULL), when three runs all exceed
 * cutoff_ms (0: no cutoff).
 */
static llmcl_status measure(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c, const bufs *b,
                            const tune_options *o, double cutoff_ms, double *ms, bool *stopped)
{
    if (stopped)
        *stopped = false;
    int next = 0;
    for (int w = 0; w < o->warmup; ++w, ++next)
        TRY(k->run(ctx, b->t[next % b->n_sets], c));
    double t[64];
    int reps = o->reps < 1 ? 1 : o->reps > 64 ? 64 : o->reps, n = 0;
    for (; n < reps; ++n, ++next) {
        llmcl_profile prof;
        TRY(llmcl_profile_begin(ctx));
        const double t0 = util_now_s();
        llmcl_status st = k->run(ctx, b->t[next % b->n_sets], c);
        llmcl_status st2 = llmcl_profile_end(ctx, &prof);
        TRY(st != LLMCL_OK ? st : st2);
        /*
         * Some drivers (rusticl on llvmpipe) stamp every event 1 ns long: when events claim under
         * a thousandth of the host's wall time, time with the host clock instead.
         */
        const double wall_ms = 1e3 * (util_now_s() - t0);
        t[n] = prof.kernel_ms > 1e-3 * wall_ms ? prof.kernel_ms : wall_ms;
        if (cutoff_ms > 0 && n == 2 && t[0] > cutoff_ms && t[1] > cutoff_ms && t[2] > cutoff_ms) {
            n = 3;
            if (stopped)
                *stopped = true;
            break;
        }
    }
    util_sort_doubles(t, (size_t)n);
    *ms = n == 3 && cutoff_ms > 0 && t[0] > cutoff_ms ? t[0] : t[n / 2];
    return LLMCL_OK;
}

/* One checked run of set 0 with the current override; the status of the op or of the queue. */
static llmcl_status check_run(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c, bufs *b)
{
    TRY(bufs_reset(k, b));
    TRY(k->run(ctx, b->t[0], c));
    return llmcl_ctx_finish(ctx);
}

tune_options tune_default_options(const llmcl_device_info *info, bool quick)
{
    tune_options o = {0};
    o.quick = quick;
    o.warmup = quick ? 1 : 3;
    o.reps = quick ? 5 : 15;
    o.max_candidates = quick ? 12 : 0;
    o.rotate_bytes = info && info->is_gpu ? (256u << 20) : (64u << 20);
    return o;
}

static void reject(const tune_options *o, tune_result *r, tune_reject why, const char *params,
                   const char *detail)
{
    if (o->trace)
        fprintf(o->trace, "  %s: dropped: %s\n", params, detail);
    r->rejected[why]++;
    char *dst = r->last_reject[why];
    dst[0] = '\0';
    const char *parts[3] = {params, ": ", detail};
    size_t len = 0;
    for (int i = 0; i < 3; ++i) { /* truncated, not overflowing: messages can be long */
        size_t n = strlen(parts[i]);
        n = n < TUNE_TEXT - 1 - len ? n : TUNE_TEXT - 1 - len;
        memcpy(dst + len, parts[i], n);
        len += n;
        dst[len] = '\0';
    }
}

static bool is_wg_name(const char *n)
{
    size_t len = strlen(n);
    return strcmp(n, "WG") == 0 || strncmp(n, "WG_", 3) == 0 ||
           (len > 3 && strcmp(n + len - 3, "_WG") == 0);
}

/* Whether the open-addressed set of cap slots (-1: empty) holds v; adds it where it does not. */
static bool seen_before(long *set, long cap, long v)
{
    long at = (long)((uint64_t)v * 0x9E3779B97F4A7C15ull % (uint64_t)cap);
    for (; set[at] >= 0; at = (at + 1) % cap)
        if (set[at] == v)
            return true;
    set[at] = v;
    return false;
}

/* max of a space too large to enumerate, drawn without repeats (Floyd's sampling). */
static long *sample_order(long total, int max)
{
    const long cap = 2L * max + 1;
    long *idx = malloc((size_t)max * sizeof *idx), *set = malloc((size_t)cap * sizeof *set);
    if (idx && set) {
        uint64_t seed = 7;
        for (long i = 0; i < cap; ++i)
            set[i] = -1;
        for (long j = total - max, n = 0; j < total; ++j, ++n) {
            long pick = (long)(util_splitmix64(&seed) % (uint64_t)(j + 1));
            if (seen_before(set, cap, pick)) { /* then j, which no earlier draw could reach */
                pick = j;
                seen_before(set, cap, j);
            }
            idx[n] = pick;
        }
    } else {
        free(idx);
        idx = NULL;
    }
    free(set);
    return idx;
}

long *tune_candidate_order(long total, int max, long *count)
{
    if (total < 1 || (total > TUNE_MAX_SPACE && max < 1))
        return NULL;
    if (total > TUNE_MAX_SPACE) {
        *count = max < total ? max : total;
        return sample_order(total, (int)*count);
    }
    long *idx = malloc((size_t)total * sizeof *idx);
    if (idx == NULL)
        return NULL;
    for (long i = 0; i < total; ++i)
        idx[i] = i;
    uint64_t seed = 7;
    for (long i = total - 1; i > 0; --i) {
        long j = (long)(util_splitmix64(&seed) % (uint64_t)(i + 1));
        long t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    *count = max > 0 && total > max ? max : total;
    return idx;
}

/*
 * What the runtime runs at this case now, with the tuning files a new context loads (a nearest
 * class's entry among them, and the launcher's adjustments of it), and its time: where it is not
 * the defaults, a new entry's gain is against it. The case's result keeps 0 ms if the op fails.
 */
static void time_now(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c, bufs *b,
                     const tune_options *o, tune_result *r)
{
    if (check_run(ctx, k, c, b) != LLMCL_OK ||
        llmcl_tune_params_get(ctx, k->key, r->dtype, c->shape_class, r->now_params,
                              sizeof r->now_params, NULL) != LLMCL_OK ||
        measure(ctx, k, c, b, o, 0, &r->now_ms, NULL) != LLMCL_OK)
        r->now_ms = 0;
}

/* The case's parameter space, dims and shape class from the table's strings and the shape given. */
static llmcl_status case_setup(const tune_kernel *k, const char *shape, space *sp, tune_case *c,
                               tune_result *r)
{
    if (!parse_space(k->params, sp))
        return fail(r, LLMCL_ERROR_INVALID_ARGUMENT, "bad params in the table: \"%s\"", k->params);
    if (!parse_shape(shape, c))
        return fail(r, LLMCL_ERROR_INVALID_ARGUMENT, "bad shape \"%s\" (NAME=SIZE,...)", shape);
    int64_t key = k->size_key_fn ? k->size_key_fn(c) : dims_product(c, k->size_key, NULL, NULL);
    if (key < 1)
        return fail(r, LLMCL_ERROR_INVALID_ARGUMENT, "no size key from this shape (%s)",
                    k->size_key ? k->size_key : "size_key_fn");
    llmcl_tune_shape_class(key, c->shape_class);
    snprintf(r->shape_class, sizeof r->shape_class, "%s", c->shape_class);
    c->n_params = sp->n;
    for (int i = 0; i < sp->n; ++i)
        c->param_names[i] = sp->names[i];
    return LLMCL_OK;
}

/*
 * The reference: the launcher's own defaults, run, kept as the outputs every candidate must match,
 * looked up (the table's tunables must be the kernel's) and timed. It starts as the best.
 */
static llmcl_status time_reference(llmcl_ctx *ctx, const tune_kernel *k, tune_case *c, bufs *b,
                                   const space *sp, const tune_options *o, tune_result *r)
{
    llmcl_status st = check_run(ctx, k, c, b);
    if (st != LLMCL_OK)
        return fail(r, st, "the reference configuration failed: %s", llmcl_last_error(ctx));
    char why[512];
    if (!outputs(ctx, k, b, true, why, sizeof why))
        return fail(r, LLMCL_ERROR_IO, "%s", why);
    int launched = 0;
    st = llmcl_tune_params_get(ctx, k->key, r->dtype, c->shape_class, r->default_params,
                               sizeof r->default_params, &launched);
    if (st != LLMCL_OK || !launched) {
        snprintf(r->error, sizeof r->error,
                 "the op did not look up kernel %s at class %s: check the table's key and size_key",
                 k->key, c->shape_class);
        return st != LLMCL_OK ? st : LLMCL_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < sp->n; ++i)
        if (!text_get(r->default_params, sp->names[i], &c->values[i])) {
            snprintf(r->error, sizeof r->error, "kernel %s has no tunable %s (it has: %s)", k->key,
                     sp->names[i], r->default_params);
            return LLMCL_ERROR_INVALID_ARGUMENT;
        }
    st = measure(ctx, k, c, b, o, 0, &r->default_ms, NULL);
    if (st != LLMCL_OK)
        return fail(r, st, "timing the reference failed: %s", llmcl_last_error(ctx));
    snprintf(r->best_params, sizeof r->best_params, "%s", r->default_params);
    r->best_ms = r->default_ms;
    return LLMCL_OK;
}

/*
 * Candidate `index` of the space by mixed radix: its values and text into c, and the defaults
 * with its values written over them into full. False where it is the defaults themselves.
 */
static bool candidate_params(const space *sp, long index, const char *defaults, tune_case *c,
                             char *full, size_t size)
{
    snprintf(full, size, "%s", defaults);
    size_t len = 0;
    bool is_default = true;
    for (long i = 0, rest = index; i < sp->n; ++i) {
        c->values[i] = sp->values[i][rest % sp->counts[i]];
        rest /= sp->counts[i];
        long dv = 0;
        text_get(defaults, sp->names[i], &dv);
        is_default = is_default && dv == c->values[i];
        text_set(full, size, sp->names[i], c->values[i]);
        util_appendf(c->params_text, sizeof c->params_text, &len, "%s%s=%ld", len ? " " : "",
                     sp->names[i], c->values[i]);
    }
    return !is_default;
}

/* Whether the candidate in c fits the device's work-group size and the kernel's own limits. */
static bool candidate_fits(const llmcl_device_info *info, const tune_kernel *k, const space *sp,
                           const tune_case *c, char *why, size_t size)
{
    for (int i = 0; i < sp->n; ++i)
        if (is_wg_name(sp->names[i]) &&
            (c->values[i] < 1 || (size_t)c->values[i] > info->max_work_group_size)) {
            snprintf(why, size, "%s=%ld exceeds the device's work-group size %zu", sp->names[i],
                     c->values[i], info->max_work_group_size);
            return false;
        }
    return k->fits == NULL || k->fits(info, c, why, size);
}

/*
 * The candidate in c forced: run, its parameters checked as the launcher used them and its outputs
 * against the reference's, then timed (cut short past 1.5x the best); the best so far if faster.
 * A candidate that fails any step is rejected with the reason.
 */
static void try_candidate(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c, bufs *b,
                          const char *full, const tune_options *o, tune_result *r)
{
    char why[512];
    llmcl_tune_override(ctx, k->key, r->dtype, c->shape_class, c->params_text);
    llmcl_status st = check_run(ctx, k, c, b);
    if (st != LLMCL_OK) {
        tune_reject kind = st == LLMCL_ERROR_BUILD_FAILURE ? TUNE_REJ_BUILD
                           : is_limit_error(st)            ? TUNE_REJ_LIMITS
                                                           : TUNE_REJ_ERROR;
        reject(o, r, kind, c->params_text, llmcl_last_error(ctx));
        return;
    }
    char used[TUNE_TEXT];
    if (llmcl_tune_params_get(ctx, k->key, r->dtype, c->shape_class, used, sizeof used, NULL) !=
            LLMCL_OK ||
        strcmp(used, full) != 0) {
        snprintf(why, sizeof why, "the launcher used %s", used);
        reject(o, r, TUNE_REJ_ADJUSTED, c->params_text, why);
        return;
    }
    if (!outputs(ctx, k, b, false, why, sizeof why)) {
        reject(o, r, TUNE_REJ_WRONG, c->params_text, why);
        return;
    }
    double ms;
    bool stopped;
    st = measure(ctx, k, c, b, o, 1.5 * r->best_ms, &ms, &stopped);
    if (st != LLMCL_OK) {
        reject(o, r, is_limit_error(st) ? TUNE_REJ_LIMITS : TUNE_REJ_ERROR, c->params_text,
               llmcl_last_error(ctx));
        return;
    }
    r->timed++;
    if (o->trace)
        fprintf(o->trace, "  %s: %.4f ms%s\n", c->params_text, ms,
                stopped ? " (stopped early: slower than 1.5x the best)" : "");
    if (ms < r->best_ms) {
        r->best_ms = ms;
        snprintf(r->best_params, sizeof r->best_params, "%s", full);
    }
}

/* The space's candidates in their sampled order, until the case's seconds run out. */
static llmcl_status search_space(llmcl_ctx *ctx, const tune_kernel *k, tune_case *c, bufs *b,
                                 const space *sp, const tune_options *o, tune_result *r)
{
    long count;
    const long total = tune_space_size(k);
    if (total > TUNE_MAX_SPACE && o->max_candidates <= 0) {
        snprintf(r->error, sizeof r->error,
                 "the space holds more than %d candidates: give --max-candidates N to sample N "
                 "of them, or a narrower --space", TUNE_MAX_SPACE);
        return LLMCL_ERROR_INVALID_ARGUMENT;
    }
    long *order = tune_candidate_order(total, o->max_candidates, &count);
    if (order == NULL)
        return fail(r, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "out of host memory%s", "");
    r->candidates = (int)count;
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    const double start = util_now_s();
    for (long ci = 0; ci < count; ++ci) {
        if (o->progress)
            o->progress(o->progress_arg, (int)ci, (int)count);
        if (o->case_seconds > 0 && util_now_s() - start > o->case_seconds)
            break;
        char full[TUNE_TEXT], why[512];
        if (!candidate_params(sp, order[ci], r->default_params, c, full, sizeof full))
            continue;
        r->tried++;
        if (candidate_fits(info, k, sp, c, why, sizeof why))
            try_candidate(ctx, k, c, b, full, o, r);
        else
            reject(o, r, TUNE_REJ_LIMITS, c->params_text, why);
    }
    if (o->progress)
        o->progress(o->progress_arg, (int)count, (int)count);
    free(order);
    return LLMCL_OK;
}

/*
 * Confirms the winner against the defaults in alternating rounds: a busy host drifts, and the
 * search compared times taken minutes apart. Keeps the defaults unless the winner is clearly
 * faster than noise.
 */
static void confirm_best(llmcl_ctx *ctx, const tune_kernel *k, const tune_case *c, const bufs *b,
                         const tune_options *o, tune_result *r)
{
    if (strcmp(r->best_params, r->default_params) != 0) {
        double td = 1e300, tb = 1e300, t;
        for (int round = 0; round < 3; ++round) {
            llmcl_tune_override(ctx, k->key, r->dtype, c->shape_class, NULL);
            if (measure(ctx, k, c, b, o, 0, &t, NULL) == LLMCL_OK)
                td = t < td ? t : td;
            llmcl_tune_override(ctx, k->key, r->dtype, c->shape_class, r->best_params);
            if (measure(ctx, k, c, b, o, 0, &t, NULL) == LLMCL_OK)
                tb = t < tb ? t : tb;
        }
        if (td < 1e300 && tb < 1e300) {
            r->default_ms = td;
            r->best_ms = tb;
        }
    }
    if (r->best_ms > 0.97 * r->default_ms) {
        snprintf(r->best_params, sizeof r->best_params, "%s", r->default_params);
        r->best_ms = r->default_ms;
    }
}

llmcl_status tune_run_case(llmcl_ctx *ctx, const tune_kernel *k, llmcl_dtype dtype,
                           const char *shape, const tune_options *o, tune_result *r)
{
    memset(r, 0, sizeof *r);
    r->kernel = k;
    r->dtype = dtype;
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    tune_case c = {.dtype = dtype};
    space sp;
    TRY(case_setup(k, shape, &sp, &c, r));

    TRY(llmcl_tune_db_reset(ctx));
    bufs b;
    llmcl_status st = bufs_create(ctx, k, &c, o, &b, r);
    if (st == LLMCL_OK) {
        time_now(ctx, k, &c, &b, o, r);
        st = llmcl_tune_db_clear(ctx);
    }
    if (st == LLMCL_OK)
        st = time_reference(ctx, k, &c, &b, &sp, o, r);
    if (st == LLMCL_OK)
        st = search_space(ctx, k, &c, &b, &sp, o, r);
    if (st == LLMCL_OK) {
        confirm_best(ctx, k, &c, &b, o, r);
        r->ok = true;
    }
    llmcl_tune_override(ctx, k->key, dtype, c.shape_class[0] ? c.shape_class : "*", NULL);
    bufs_free(&b);
    return st;
}

static json_t *params_json(const char *text)
{
    json_t *o = json_object();
    for (const char *p = text; *p;) {
        size_t w = strcspn(p, " "), eq = strcspn(p, "=");
        if (eq < w) {
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)eq, p);
            json_object_set_new(o, name, json_integer(strtol(p + eq + 1, NULL, 10)));
        }
        p += w;
        p += *p == ' ';
    }
    return o;
}

static bool same_entry(json_t *e, const tune_result *r)
{
    const char *k = json_string_value(json_object_get(e, "kernel"));
    const char *d = json_string_value(json_object_get(e, "dtype"));
    const char *s = json_string_value(json_object_get(e, "shape_class"));
    return k && d && s && strcmp(k, r->kernel->key) == 0 &&
           strcasecmp(d, llmcl_dtype_name(r->dtype)) == 0 && strcmp(s, r->shape_class) == 0;
}

static bool dump_json(FILE *f, void *root)
{
    return json_dumpf(root, f, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) == 0;
}

/*
 * The entries of the file at path that a merge keeps: *old NULL where there is no file. False
 * with why where the file is not a tuning file of this device's, whose entries an overwrite would
 * lose (the runtime matches device names ignoring case, and so does this).
 */
static bool merge_base(const char *path, const llmcl_device_info *info, const tune_options *o,
                       json_t **old, char *why, size_t why_len)
{
    *old = NULL;
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return true;
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        snprintf(why, why_len, "cannot merge into %s: line %d: %s", path, err.line, err.text);
        return false;
    }
    const char *name = json_string_value(json_object_get(json_object_get(root, "device"), "name"));
    const char *want = o->for_platform ? "*" : info->name;
    if (!name || strcasecmp(name, want) != 0 || !json_is_array(json_object_get(root, "entries"))) {
        snprintf(why, why_len,
                 "cannot merge into %s: it holds %s%s%s, not entries for '%s' (write another file)",
                 path, name ? "the tuning of '" : "no tuning file's device and entries",
                 name ? name : "", name ? "'" : "", want);
        json_decref(root);
        return false;
    }
    *old = root;
    return true;
}

bool tune_merge_check(const char *path, llmcl_ctx *ctx, const tune_options *o, char *why,
                      size_t why_len)
{
    json_t *old;
    const bool ok = merge_base(path, llmcl_ctx_device_info(ctx), o, &old, why, why_len);
    json_decref(old);
    return ok;
}

/* Held from reading the file to renaming its successor over it: two tuners merging into one file
   at once would otherwise each keep the other's entries out. PATH.lock stays, as lock files do. */
static int merge_lock(const char *path, char *why, size_t why_len)
{
    char lock_path[4200];
    snprintf(lock_path, sizeof lock_path, "%s.lock", path);
    const int fd = open(lock_path, O_RDWR | O_CREAT, 0644);
    struct flock whole = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fd >= 0 && fcntl(fd, F_SETLKW, &whole) == 0)
        return fd;
    snprintf(why, why_len, "cannot lock %s: %s", lock_path, strerror(errno));
    if (fd >= 0)
        close(fd);
    return -1;
}

/* A tuned case as the file's entry. */
static json_t *entry_json(const tune_result *r)
{
    json_t *e = json_object();
    json_object_set_new(e, "kernel", json_string(r->kernel->key));
    json_object_set_new(e, "dtype", json_string(llmcl_dtype_name(r->dtype)));
    json_object_set_new(e, "shape_class", json_string(r->shape_class));
    json_object_set_new(e, "shape", json_string(r->shape));
    json_object_set_new(e, "params", params_json(r->best_params));
    json_object_set_new(e, "time_ms", json_real(r->best_ms));
    json_object_set_new(e, "default_params", params_json(r->default_params));
    json_object_set_new(e, "default_ms", json_real(r->default_ms));
    json_object_set_new(e, "speedup", json_real(r->best_ms > 0 ? r->default_ms / r->best_ms : 1));
    if (strcmp(r->now_params, r->default_params) != 0 && r->now_ms > 0) {
        json_object_set_new(e, "now_params", params_json(r->now_params));
        json_object_set_new(e, "now_ms", json_real(r->now_ms));
    }
    json_object_set_new(e, "candidates", json_integer(r->candidates));
    json_object_set_new(e, "timed", json_integer(r->timed));
    json_t *rej = json_object();
    static const char *names[TUNE_REJ_COUNT] = {"limits", "build", "wrong", "adjusted", "error"};
    for (int j = 0; j < TUNE_REJ_COUNT; ++j)
        json_object_set_new(rej, names[j], json_integer(r->rejected[j]));
    json_object_set_new(e, "rejected", rej);
    return e;
}

/* The entries of the cases that ran, then those of old (a merge's file) that none retuned. */
static json_t *entries_json(const tune_result *results, int n, const json_t *old)
{
    json_t *entries = json_array();
    for (int i = 0; i < n; ++i)
        if (results[i].ok)
            json_array_append_new(entries, entry_json(&results[i]));
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(old, "entries"), i, e)
    {
        bool retuned = false;
        for (int j = 0; j < n && !retuned; ++j)
            retuned = results[j].ok && same_entry(e, &results[j]);
        if (!retuned)
            json_array_append(entries, e);
    }
    return entries;
}

/* The file's header: the device it matches (a class under --for-platform), the library, the
   date and how the tuner ran. */
static json_t *header_json(const llmcl_device_info *info, const tune_options *o)
{
    char date[32];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("llmcl-tuning"));
    json_object_set_new(root, "version", json_integer(1));
    json_t *dev = json_object();
    json_object_set_new(dev, "name", json_string(info->name));
    json_object_set_new(dev, "vendor", json_string(info->vendor));
    json_object_set_new(dev, "platform", json_string(info->platform_name));
    json_object_set_new(dev, "type", json_string(info->is_gpu ? "gpu" : "cpu"));
    json_object_set_new(dev, "driver_version", json_string(info->driver_version));
    json_object_set_new(dev, "device_version", json_string(info->device_version));
    if (o->for_platform) {
        /* A device-class default: matched by platform and type; the exact device is a record. */
        json_t *any = json_object();
        json_object_set_new(any, "name", json_string("*"));
        json_object_set_new(any, "platform", json_string(info->platform_name));
        json_object_set_new(any, "type", json_string(info->is_gpu ? "gpu" : "cpu"));
        json_object_set_new(root, "device", any);
        json_object_set_new(root, "tuned_on", dev);
    } else
        json_object_set_new(root, "device", dev);
    json_object_set_new(root, "library_version", json_string(llmcl_version()));
    json_object_set_new(root, "date", json_string(date));
    json_t *tuner = json_object();
    json_object_set_new(tuner, "quick", json_boolean(o->quick));
    json_object_set_new(tuner, "warmup", json_integer(o->warmup));
    json_object_set_new(tuner, "reps", json_integer(o->reps));
    json_object_set_new(tuner, "max_candidates", json_integer(o->max_candidates));
    json_object_set_new(root, "tuner", tuner);
    return root;
}

bool tune_write_json(const char *path, llmcl_ctx *ctx, const tune_result *results, int n,
                     const tune_options *o, bool merge, char *why, size_t why_len)
{
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    const int lock = merge ? merge_lock(path, why, why_len) : -1;
    json_t *old = NULL;
    if (merge && (lock < 0 || !merge_base(path, info, o, &old, why, why_len))) {
        if (lock >= 0)
            close(lock);
        return false;
    }
    json_t *root = header_json(info, o);
    json_object_set_new(root, "entries", entries_json(results, n, old));
    json_decref(old);
    const bool ok = util_replace_file(path, dump_json, root, why, why_len);
    json_decref(root);
    if (lock >= 0)
        close(lock);
    return ok;
}
