/*
 * safetensors.c: the safetensors reader. The file is mapped read-only; the JSON header is parsed
 * with jansson and checked completely at open, so that lookups and loads afterwards only index into
 * the mapping. Tensor names and "__metadata__" values stay inside the parsed JSON, which lives as
 * long as the reader. The writer is in safetensors_write.c; the format's dtypes are here.
 */
#include "src/runtime/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"

/* In the reference implementation's order of rising alignment, which its writer sorts by. */
static const llmcl__st_dtype st_dtypes[] = {
    {"BOOL", 8, LLMCL_DTYPE_COUNT},     {"F4", 4, LLMCL_DTYPE_COUNT},
    {"F6_E2M3", 6, LLMCL_DTYPE_COUNT},  {"F6_E3M2", 6, LLMCL_DTYPE_COUNT},
    {"U8", 8, LLMCL_DTYPE_COUNT},       {"I8", 8, LLMCL_DTYPE_COUNT},
    {"F8_E5M2", 8, LLMCL_DTYPE_COUNT},  {"F8_E4M3", 8, LLMCL_DTYPE_COUNT},
    {"F8_E8M0", 8, LLMCL_DTYPE_COUNT},  {"I16", 16, LLMCL_DTYPE_COUNT},
    {"U16", 16, LLMCL_DTYPE_COUNT},     {"F16", 16, LLMCL_F16},
    {"BF16", 16, LLMCL_BF16},           {"I32", 32, LLMCL_I32},
    {"U32", 32, LLMCL_DTYPE_COUNT},     {"F32", 32, LLMCL_F32},
    {"C64", 64, LLMCL_DTYPE_COUNT},     {"F64", 64, LLMCL_DTYPE_COUNT},
    {"I64", 64, LLMCL_I64},             {"U64", 64, LLMCL_DTYPE_COUNT},
};
#define N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

const llmcl__st_dtype *llmcl__st_dtype_by_name(const char *name)
{
    for (int i = 0; i < N_DTYPES; ++i)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return &st_dtypes[i];
    return NULL;
}

const llmcl__st_dtype *llmcl__st_dtype_of(llmcl_dtype dtype)
{
    for (int i = 0; i < N_DTYPES; ++i)
        if (st_dtypes[i].dtype == dtype && dtype != LLMCL_DTYPE_COUNT)
            return &st_dtypes[i];
    return NULL;
}

int llmcl__st_dtype_rank(const llmcl__st_dtype *d) { return (int)(d - st_dtypes); }

/* ---- the reader ---- */

typedef struct st_entry {
    const char *name; /* a key of the parsed header */
    const llmcl__st_dtype *dtype;
    int ndim;
    int64_t shape[LLMCL_SAFETENSORS_MAX_DIMS];
    uint64_t begin, end; /* from the start of the data section */
} st_entry;

struct llmcl_safetensors {
    char *path;
    const unsigned char *map; /* the whole file */
    size_t map_len;
    uint64_t data_start; /* 8 + header length */
    json_t *root;
    json_t *metadata; /* borrowed from root; NULL when absent */
    st_entry *entries; /* in offset order */
    int64_t count;
};

/* Records a malformed-file error prefixed with the file's path. */
static llmcl_status bad(const llmcl_safetensors *st, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define BAD(st, ...) bad((st), __LINE__, __VA_ARGS__)

static llmcl_status bad(const llmcl_safetensors *st, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return llmcl__fail(NULL, LLMCL_ERROR_BAD_FILE, __FILE__, line, "%s: %s", st->path, msg);
}

static llmcl_status map_file(llmcl_safetensors *st)
{
    const int fd = open(st->path, O_RDONLY | O_CLOEXEC);
    LLMCL__REQUIRE(NULL, fd >= 0, LLMCL_ERROR_IO, "cannot open '%s': %s", st->path,
                   strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return LLMCL__FAIL(NULL, LLMCL_ERROR_IO, "'%s' is not a readable regular file", st->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return BAD(st, "%lld bytes: too short for the 8-byte header length", (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    close(fd); /* the mapping keeps the file */
    LLMCL__REQUIRE(NULL, map != MAP_FAILED, LLMCL_ERROR_IO, "cannot map '%s': %s", st->path,
                   strerror(map_errno));
    st->map = map;
    st->map_len = (size_t)sb.st_size;
    return LLMCL_OK;
}

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i)
        v = (v << 8) | p[i];
    return v;
}

static bool is_uint(const json_t *j) { return json_is_integer(j) && json_integer_value(j) >= 0; }

/* The element count times the element size, refusing counts that overflow or split a byte. */
static llmcl_status entry_bytes(const llmcl_safetensors *st, const st_entry *e, uint64_t *bytes)
{
    uint64_t numel = 1;
    for (int i = 0; i < e->ndim; ++i) {
        const uint64_t dim = (uint64_t)e->shape[i];
        if (dim != 0 && numel > UINT64_MAX / dim)
            return BAD(st, "tensor '%s': the element count overflows 64 bits", e->name);
        numel *= dim;
    }
    const uint64_t bits = (uint64_t)e->dtype->bits;
    if (numel > UINT64_MAX / bits)
        return BAD(st, "tensor '%s': the byte count overflows 64 bits", e->name);
    if (numel * bits % 8 != 0)
        return BAD(st, "tensor '%s': %llu elements of %s do not fill whole bytes", e->name,
                   (unsigned long long)numel, e->dtype->name);
    *bytes = numel * bits / 8;
    return LLMCL_OK;
}

static llmcl_status parse_shape(const llmcl_safetensors *st, st_entry *e, const json_t *js)
{
    if (!json_is_array(js))
        return BAD(st, "tensor '%s': \"shape\" is missing or not an array", e->name);
    if (json_array_size(js) > LLMCL_SAFETENSORS_MAX_DIMS)
        return BAD(st, "tensor '%s' has %zu dimensions; llmcl reads at most %d", e->name,
                   json_array_size(js), LLMCL_SAFETENSORS_MAX_DIMS);
    e->ndim = (int)json_array_size(js);
    for (int i = 0; i < e->ndim; ++i) {
        const json_t *d = json_array_get(js, (size_t)i);
        if (!is_uint(d))
            return BAD(st, "tensor '%s': shape[%d] is not a non-negative integer", e->name, i);
        e->shape[i] = json_integer_value(d);
    }
    return LLMCL_OK;
}

/* One tensor's dtype, shape and offsets, checked against each other and the data section. */
static llmcl_status parse_entry(const llmcl_safetensors *st, const char *name, const json_t *v,
                                st_entry *e)
{
    e->name = name;
    if (!json_is_object(v))
        return BAD(st, "tensor '%s' is not a JSON object", name);
    const char *dname = json_string_value(json_object_get(v, "dtype"));
    e->dtype = dname ? llmcl__st_dtype_by_name(dname) : NULL;
    if (!e->dtype)
        return BAD(st, "tensor '%s': unknown dtype \"%s\"", name, dname ? dname : "(missing)");
    LLMCL__TRY(parse_shape(st, e, json_object_get(v, "shape")));
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !is_uint(json_array_get(jo, 0)) ||
        !is_uint(json_array_get(jo, 1)))
        return BAD(st, "tensor '%s': \"data_offsets\" is not two non-negative integers", name);
    e->begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
    e->end = (uint64_t)json_integer_value(json_array_get(jo, 1));
    if (e->end < e->begin)
        return BAD(st, "tensor '%s': data_offsets [%llu, %llu] end before they begin", name,
                   (unsigned long long)e->begin, (unsigned long long)e->end);
    uint64_t bytes = 0;
    LLMCL__TRY(entry_bytes(st, e, &bytes));
    if (e->end - e->begin != bytes) {
        char shape[256];
        llmcl__dims_text(e->ndim, e->shape, shape, sizeof shape);
        return BAD(st, "tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] "
                   "hold %llu", name, shape, e->dtype->name, (unsigned long long)bytes,
                   (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)(e->end - e->begin));
    }
    const uint64_t data_len = st->map_len - st->data_start;
    if (e->end > data_len)
        return BAD(st, "tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                   "(%llu bytes after the header): offsets out of range or truncated data", name,
                   (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)data_len);
    return LLMCL_OK;
}

static llmcl_status check_metadata(const llmcl_safetensors *st, json_t *md)
{
    if (!json_is_object(md))
        return BAD(st, "\"__metadata__\" is not an object");
    const char *key;
    json_t *value;
    json_object_foreach(md, key, value)
    {
        if (!json_is_string(value))
            return BAD(st, "\"__metadata__\" value of \"%s\" is not a string", key);
    }
    return LLMCL_OK;
}

static llmcl_status parse_header(llmcl_safetensors *st)
{
    const uint64_t n = read_le64(st->map);
    if (n > LLMCL__ST_MAX_HEADER)
        return BAD(st, "header length %llu is above the limit of %llu bytes", (unsigned long long)n,
                   LLMCL__ST_MAX_HEADER);
    if (n > st->map_len - 8)
        return BAD(st, "header length %llu runs past the end of the file (%zu bytes)",
                   (unsigned long long)n, st->map_len);
    st->data_start = 8 + n;
    json_error_t err;
    st->root = json_loadb((const char *)st->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!st->root)
        return BAD(st, "the header is not valid JSON (%s, at byte %d of the header)%s", err.text,
                   err.position, strstr(err.text, "duplicate") ? ": a duplicate tensor name" : "");
    if (!json_is_object(st->root))
        return BAD(st, "the header is JSON but not an object");
    st->entries = calloc(json_object_size(st->root) + 1, sizeof *st->entries);
    LLMCL__REQUIRE(NULL, st->entries, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors entries");
    const char *key;
    json_t *value;
    json_object_foreach(st->root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0) {
            LLMCL__TRY(check_metadata(st, value));
            st->metadata = value;
        } else {
            LLMCL__TRY(parse_entry(st, key, value, &st->entries[st->count++]));
        }
    }
    return LLMCL_OK;
}

static int by_offsets(const void *pa, const void *pb)
{
    const st_entry *a = pa, *b = pb;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end)
        return a->end < b->end ? -1 : 1;
    return strcmp(a->name, b->name); /* empty tensors at one offset: a fixed order */
}

/* In offset order the tensors must tile the data section exactly, as the reference requires. */
static llmcl_status check_tiling(llmcl_safetensors *st)
{
    qsort(st->entries, (size_t)st->count, sizeof *st->entries, by_offsets);
    uint64_t pos = 0;
    for (int64_t i = 0; i < st->count; ++i) {
        const st_entry *e = &st->entries[i];
        if (e->begin > pos)
            return BAD(st, "tensor '%s' begins at byte %llu but the data before it ends at %llu: "
                       "a hole in the data", e->name, (unsigned long long)e->begin,
                       (unsigned long long)pos);
        if (e->begin < pos)
            return BAD(st, "tensor '%s' (data_offsets [%llu, %llu]) overlaps tensor '%s', which "
                       "ends at %llu", e->name, (unsigned long long)e->begin,
                       (unsigned long long)e->end, st->entries[i - 1].name,
                       (unsigned long long)pos);
        pos = e->end;
    }
    const uint64_t data_len = st->map_len - st->data_start;
    if (pos != data_len)
        return BAD(st, "the tensors' data ends at byte %llu but %llu bytes follow the header: "
                   "trailing bytes", (unsigned long long)pos, (unsigned long long)data_len);
    return LLMCL_OK;
}

llmcl_status llmcl_safetensors_open(const char *path, llmcl_safetensors **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    LLMCL__REQUIRE(NULL, path, LLMCL_ERROR_INVALID_ARGUMENT, "path must not be NULL");
    llmcl_safetensors *st = calloc(1, sizeof *st);
    LLMCL__REQUIRE(NULL, st, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors reader");
    llmcl_status status = LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    st->path = strdup(path);
    if (!st->path)
        goto fail;
    LLMCL__TRY_GOTO(status, map_file(st), fail);
    LLMCL__TRY_GOTO(status, parse_header(st), fail);
    LLMCL__TRY_GOTO(status, check_tiling(st), fail);
    *out = st;
    return LLMCL_OK;
fail:
    llmcl_safetensors_close(st);
    return status;
}

void llmcl_safetensors_close(llmcl_safetensors *st)
{
    if (!st)
        return;
    if (st->map)
        munmap((void *)st->map, st->map_len);
    json_decref(st->root);
    free(st->entries);
    free(st->path);
    free(st);
}

int64_t llmcl_safetensors_count(const llmcl_safetensors *st) { return st ? st->count : -1; }

const char *llmcl_safetensors_name(const llmcl_safetensors *st, int64_t i)
{
    return (st && i >= 0 && i < st->count) ? st->entries[i].name : NULL;
}

const char *llmcl_safetensors_metadata(const llmcl_safetensors *st, const char *key)
{
    return (st && key) ? json_string_value(json_object_get(st->metadata, key)) : NULL;
}

static const st_entry *lookup(const llmcl_safetensors *st, const char *name)
{
    for (int64_t i = 0; i < st->count; ++i)
        if (strcmp(st->entries[i].name, name) == 0)
            return &st->entries[i];
    return NULL;
}

llmcl_status llmcl_safetensors_find(const llmcl_safetensors *st, const char *name,
                                    llmcl_safetensors_info *out)
{
    LLMCL__REQUIRE(NULL, st && name && out, LLMCL_ERROR_INVALID_ARGUMENT,
                   "st, name and out must not be NULL");
    const st_entry *e = lookup(st, name);
    LLMCL__REQUIRE(NULL, e, LLMCL_ERROR_INVALID_ARGUMENT, "%s: no tensor named '%s'", st->path,
                   name);
    memset(out, 0, sizeof *out);
    out->dtype = e->dtype->dtype;
    out->dtype_name = e->dtype->name;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof e->shape);
    out->bytes = e->end - e->begin;
    out->offset = e->begin;
    out->data = st->map + st->data_start + e->begin;
    return LLMCL_OK;
}

/* ---- loading into a tensor ---- */

static float load_f32(llmcl_dtype dtype, const unsigned char *p)
{
    if (dtype == LLMCL_F32) {
        float x;
        memcpy(&x, p, sizeof x); /* the mapping need not be aligned */
        return x;
    }
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return dtype == LLMCL_BF16 ? llmcl_bf16_to_f32(h) : llmcl_f16_to_f32(h);
}

static void store_f32(llmcl_dtype dtype, unsigned char *p, float x)
{
    if (dtype == LLMCL_F32) {
        memcpy(p, &x, sizeof x);
        return;
    }
    const uint16_t h = dtype == LLMCL_BF16 ? llmcl_f32_to_bf16(x) : llmcl_f32_to_f16(x);
    memcpy(p, &h, sizeof h);
}

/*
 * Converts between float dtypes on the host, in pieces written straight into a contiguous dst; a
 * strided dst goes whole through llmcl_tensor_upload, which stages its span anyway.
 */
static llmcl_status upload_converted(llmcl_ctx *ctx, llmcl_dtype from, const unsigned char *src,
                                     llmcl_tensor *dst)
{
    const int64_t numel = llmcl_tensor_numel(dst);
    const size_t in_size = llmcl_dtype_size(from), out_size = llmcl_dtype_size(dst->dtype);
    const bool whole = !llmcl_tensor_is_contiguous(dst);
    const int64_t piece = whole ? numel : (int64_t)(LLMCL__ST_PIECE_BYTES / out_size);
    if (numel == 0)
        return LLMCL_OK;
    unsigned char *buf = malloc((size_t)(numel < piece ? numel : piece) * out_size);
    LLMCL__REQUIRE(ctx, buf, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "conversion buffer");
    llmcl_status status = LLMCL_OK;
    for (int64_t first = 0; first < numel && status == LLMCL_OK; first += piece) {
        const int64_t n = numel - first < piece ? numel - first : piece;
        for (int64_t i = 0; i < n; ++i)
            store_f32(dst->dtype, buf + i * out_size, load_f32(from, src + (first + i) * in_size));
        if (whole) {
            status = llmcl_tensor_upload(dst, buf, (size_t)n * out_size);
            continue;
        }
        const cl_int err = clEnqueueWriteBuffer(ctx->queue, dst->mem, CL_TRUE,
                                                (size_t)(dst->offset + first) * out_size,
                                                (size_t)n * out_size, buf, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            status = llmcl__fail_cl(ctx, err, "clEnqueueWriteBuffer", __FILE__, __LINE__);
    }
    free(buf);
    return status;
}

llmcl_status llmcl_safetensors_load(llmcl_ctx *ctx, const llmcl_safetensors *st, const char *name,
                                    llmcl_tensor *dst)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, st && name, LLMCL_ERROR_INVALID_ARGUMENT, "st and name must not be NULL");
    LLMCL__TRY(llmcl__check_tensor(ctx, dst, "dst", LLMCL__ALL_DTYPES, 0, LLMCL_MAX_DIMS));
    const st_entry *e = lookup(st, name);
    LLMCL__REQUIRE(ctx, e, LLMCL_ERROR_INVALID_ARGUMENT, "%s: no tensor named '%s'", st->path,
                   name);
    bool same = e->ndim == dst->ndim;
    for (int i = 0; same && i < e->ndim; ++i)
        same = e->shape[i] == dst->shape[i];
    if (!same) {
        char file_shape[256];
        llmcl__dims_text(e->ndim, e->shape, file_shape, sizeof file_shape);
        return LLMCL__FAIL(ctx, LLMCL_ERROR_SHAPE_MISMATCH,
                           "%s: tensor '%s' has shape %s in the file but dst has shape %s",
                           st->path, name, file_shape, llmcl__shape_text(dst).s);
    }
    const llmcl_dtype from = e->dtype->dtype;
    LLMCL__REQUIRE(ctx, from != LLMCL_DTYPE_COUNT, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s: tensor '%s' is %s, which no llmcl tensor holds", st->path, name,
                   e->dtype->name);
    const unsigned char *src = st->map + st->data_start + e->begin;
    if (from == dst->dtype)
        return llmcl_tensor_upload(dst, src, (size_t)(e->end - e->begin));
    const unsigned floats = LLMCL__FLOAT_DTYPES;
    LLMCL__REQUIRE(ctx, ((floats >> from) & 1u) && ((floats >> dst->dtype) & 1u),
                   LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s: tensor '%s' is %s but dst is %s; loads convert only among f32, bf16 and "
                   "f16", st->path, name, e->dtype->name, llmcl_dtype_name(dst->dtype));
    return upload_converted(ctx, from, src, dst);
}
