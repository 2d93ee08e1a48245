/*
 * safetensors_write.c: the safetensors writer. Adding a tensor records its name, dtype, shape and
 * where its bytes are (host memory or a device tensor, both borrowed); finish lays the file out as
 * the reference writer does, builds the header with jansson and streams the data into a temporary
 * file of its own that is renamed into place, so no more than one bounded piece of a device tensor
 * is ever in host memory at once.
 */
#include "src/runtime/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"

typedef struct st_item {
    char *name;
    const llmcl__st_dtype *dtype;
    int ndim;
    int64_t shape[LLMCL_SAFETENSORS_MAX_DIMS];
    uint64_t bytes, begin;
    const void *host;          /* one of host and tensor */
    const llmcl_tensor *tensor;
} st_item;

struct llmcl_safetensors_writer {
    char *path;
    json_t *metadata; /* an object of strings, in the order added */
    st_item *items;
    size_t n_items, cap_items;
    bool finished;
};

llmcl_status llmcl_safetensors_writer_create(const char *path, llmcl_safetensors_writer **out)
{
    LLMCL__REQUIRE(NULL, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    LLMCL__REQUIRE(NULL, path && *path, LLMCL_ERROR_INVALID_ARGUMENT, "path must not be empty");
    llmcl_safetensors_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = strdup(path);
        w->metadata = json_object();
    }
    if (!w || !w->path || !w->metadata) {
        llmcl_safetensors_writer_destroy(w);
        return LLMCL__FAIL(NULL, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors writer");
    }
    *out = w;
    return LLMCL_OK;
}

void llmcl_safetensors_writer_destroy(llmcl_safetensors_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_items; ++i)
        free(w->items[i].name);
    free(w->items);
    json_decref(w->metadata);
    free(w->path);
    free(w);
}

static llmcl_status check_open(const llmcl_safetensors_writer *w)
{
    LLMCL__REQUIRE(NULL, w, LLMCL_ERROR_INVALID_ARGUMENT, "writer must not be NULL");
    LLMCL__REQUIRE(NULL, !w->finished, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: the writer has already finished", w->path);
    return LLMCL_OK;
}

/* jansson refuses strings that are not UTF-8; the header must be UTF-8 JSON. */
static bool is_utf8(const char *s)
{
    json_t *probe = json_string(s);
    json_decref(probe);
    return probe != NULL;
}

llmcl_status llmcl_safetensors_writer_metadata(llmcl_safetensors_writer *w, const char *key,
                                               const char *value)
{
    LLMCL__TRY(check_open(w));
    LLMCL__REQUIRE(NULL, key && value, LLMCL_ERROR_INVALID_ARGUMENT,
                   "metadata key and value must not be NULL");
    LLMCL__REQUIRE(NULL, is_utf8(key) && is_utf8(value), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: metadata key '%s' or its value is not valid UTF-8", w->path, key);
    LLMCL__REQUIRE(NULL, !json_object_get(w->metadata, key), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: metadata key '%s' was already given", w->path, key);
    LLMCL__REQUIRE(NULL, json_object_set_new(w->metadata, key, json_string(value)) == 0,
                   LLMCL_ERROR_OUT_OF_HOST_MEMORY, "metadata");
    return LLMCL_OK;
}

/* Checks a new tensor's name, dtype, shape and data, and appends it with its byte count. */
static llmcl_status add_item(llmcl_safetensors_writer *w, const char *name, llmcl_dtype dtype,
                             int ndim, const int64_t *shape, const void *host,
                             const llmcl_tensor *tensor)
{
    LLMCL__TRY(check_open(w));
    LLMCL__REQUIRE(NULL, name, LLMCL_ERROR_INVALID_ARGUMENT, "name must not be NULL");
    LLMCL__REQUIRE(NULL, is_utf8(name) && strcmp(name, "__metadata__") != 0,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: '%s' cannot name a tensor (not UTF-8, or the metadata key)", w->path, name);
    for (size_t i = 0; i < w->n_items; ++i)
        LLMCL__REQUIRE(NULL, strcmp(w->items[i].name, name) != 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "%s: a tensor named '%s' was already added", w->path, name);
    const llmcl__st_dtype *d = llmcl__st_dtype_of(dtype);
    LLMCL__REQUIRE(NULL, d, LLMCL_ERROR_UNSUPPORTED_DTYPE, "%s: tensor '%s': dtype %d is not an "
                   "llmcl_dtype", w->path, name, (int)dtype);
    LLMCL__REQUIRE(NULL, ndim >= 0 && ndim <= LLMCL_SAFETENSORS_MAX_DIMS && (shape || ndim == 0),
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: tensor '%s': ndim %d outside 0..%d or shape "
                   "NULL", w->path, name, ndim, LLMCL_SAFETENSORS_MAX_DIMS);
    uint64_t bytes = (uint64_t)d->bits / 8;
    for (int i = 0; i < ndim; ++i) {
        LLMCL__REQUIRE(NULL, shape[i] >= 0, LLMCL_ERROR_INVALID_ARGUMENT,
                       "%s: tensor '%s': shape[%d] = %lld is negative", w->path, name, i,
                       (long long)shape[i]);
        LLMCL__REQUIRE(NULL, shape[i] == 0 || bytes <= (uint64_t)INT64_MAX / (uint64_t)shape[i],
                       LLMCL_ERROR_OVERFLOW, "%s: tensor '%s' is too large", w->path, name);
        bytes *= (uint64_t)shape[i];
    }
    LLMCL__REQUIRE(NULL, host || tensor || bytes == 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: tensor '%s': data is NULL", w->path, name);
    if (w->n_items == w->cap_items) {
        const size_t cap = w->cap_items ? 2 * w->cap_items : 16;
        st_item *items = realloc(w->items, cap * sizeof *items);
        LLMCL__REQUIRE(NULL, items, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors writer items");
        w->items = items;
        w->cap_items = cap;
    }
    st_item *it = &w->items[w->n_items];
    memset(it, 0, sizeof *it);
    it->name = strdup(name);
    LLMCL__REQUIRE(NULL, it->name, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "tensor name");
    ++w->n_items;
    it->dtype = d;
    it->ndim = ndim;
    for (int i = 0; i < ndim; ++i)
        it->shape[i] = shape[i];
    it->bytes = bytes;
    it->host = host;
    it->tensor = tensor;
    return LLMCL_OK;
}

llmcl_status llmcl_safetensors_writer_add_host(llmcl_safetensors_writer *w, const char *name,
                                               llmcl_dtype dtype, int ndim, const int64_t *shape,
                                               const void *data)
{
    return add_item(w, name, dtype, ndim, shape, data, NULL);
}

llmcl_status llmcl_safetensors_writer_add_tensor(llmcl_safetensors_writer *w, const char *name,
                                                 const llmcl_tensor *t)
{
    LLMCL__REQUIRE(NULL, t, LLMCL_ERROR_INVALID_ARGUMENT, "tensor must not be NULL");
    return add_item(w, name, t->dtype, t->ndim, t->shape, NULL, t);
}

/* ---- finish ---- */

/* The reference writer's order: falling dtype alignment, then name (bytewise). */
static int by_layout(const void *pa, const void *pb)
{
    const st_item *a = pa, *b = pb;
    const int ra = llmcl__st_dtype_rank(a->dtype), rb = llmcl__st_dtype_rank(b->dtype);
    if (ra != rb)
        return rb - ra;
    return strcmp(a->name, b->name);
}

static json_t *item_json(const st_item *it)
{
    json_t *shape = json_array();
    for (int i = 0; shape && i < it->ndim; ++i)
        if (json_array_append_new(shape, json_integer(it->shape[i])) != 0) {
            json_decref(shape);
            return NULL;
        }
    /* json_int_t is long long: offsets past 4 GiB survive. */
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", it->dtype->name, "shape", shape,
                     "data_offsets", (json_int_t)it->begin, (json_int_t)(it->begin + it->bytes));
}

/* The header text, compact JSON with "__metadata__" first, padded with spaces to 8 bytes. */
static llmcl_status header_text(const llmcl_safetensors_writer *w, char **out, size_t *len)
{
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && json_object_size(w->metadata) > 0)
        ok = json_object_set(root, "__metadata__", w->metadata) == 0;
    for (size_t i = 0; ok && i < w->n_items; ++i)
        ok = json_object_set_new(root, w->items[i].name, item_json(&w->items[i])) == 0;
    char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    LLMCL__REQUIRE(NULL, text, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors header");
    const size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    *out = realloc(text, padded + 1);
    if (!*out) {
        free(text);
        return LLMCL__FAIL(NULL, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "safetensors header");
    }
    memset(*out + n, ' ', padded - n);
    *len = padded;
    return LLMCL_OK;
}

static llmcl_status write_bytes(const llmcl_safetensors_writer *w, FILE *f, const void *p, size_t n)
{
    LLMCL__REQUIRE(NULL, n == 0 || fwrite(p, 1, n, f) == n, LLMCL_ERROR_IO,
                   "cannot write '%s' (its temporary file): %s", w->path, strerror(errno));
    return LLMCL_OK;
}

/* A failure inside the tensor's context, reported on the writer's slot with the tensor named. */
static llmcl_status download_failed(const llmcl_safetensors_writer *w, const st_item *it,
                                    llmcl_status status)
{
    return LLMCL__FAIL(NULL, status, "%s: downloading tensor '%s': %s", w->path, it->name,
                       llmcl_last_error(it->tensor->ctx));
}

/* Streams a device tensor: contiguous ones in pieces, strided ones whole. */
static llmcl_status write_tensor(const llmcl_safetensors_writer *w, FILE *f, const st_item *it)
{
    const llmcl_tensor *t = it->tensor;
    const bool whole = !llmcl_tensor_is_contiguous(t);
    const uint64_t piece = whole ? it->bytes : LLMCL__ST_PIECE_BYTES;
    if (it->bytes == 0)
        return LLMCL_OK;
    unsigned char *buf = malloc((size_t)(it->bytes < piece ? it->bytes : piece));
    LLMCL__REQUIRE(NULL, buf, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "%s: staging tensor '%s'", w->path,
                   it->name);
    const size_t start = (size_t)t->offset * llmcl_dtype_size(t->dtype);
    llmcl_status status = LLMCL_OK;
    for (uint64_t done = 0; done < it->bytes && status == LLMCL_OK; done += piece) {
        const size_t n = (size_t)(it->bytes - done < piece ? it->bytes - done : piece);
        if (whole) {
            status = llmcl_tensor_download(t, buf, n);
        } else {
            const cl_int err = clEnqueueReadBuffer(t->ctx->queue, t->mem, CL_TRUE, start + done, n,
                                                   buf, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                status = llmcl__fail_cl(t->ctx, err, "clEnqueueReadBuffer", __FILE__, __LINE__);
        }
        status = status != LLMCL_OK ? download_failed(w, it, status) : write_bytes(w, f, buf, n);
    }
    free(buf);
    return status;
}

static llmcl_status write_file(const llmcl_safetensors_writer *w, FILE *f, const char *header,
                               size_t header_len)
{
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
        len[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
    LLMCL__TRY(write_bytes(w, f, len, sizeof len));
    LLMCL__TRY(write_bytes(w, f, header, header_len));
    for (size_t i = 0; i < w->n_items; ++i) {
        const st_item *it = &w->items[i];
        LLMCL__TRY(it->tensor ? write_tensor(w, f, it)
                              : write_bytes(w, f, it->host, (size_t)it->bytes));
    }
    LLMCL__REQUIRE(NULL, fflush(f) == 0 && fsync(fileno(f)) == 0, LLMCL_ERROR_IO,
                   "cannot write '%s' (its temporary file): %s", w->path, strerror(errno));
    return LLMCL_OK;
}

llmcl_status llmcl_safetensors_writer_finish(llmcl_safetensors_writer *w)
{
    LLMCL__TRY(check_open(w));
    if (w->n_items > 1) /* items is NULL while empty */
        qsort(w->items, w->n_items, sizeof *w->items, by_layout);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_items; ++i) {
        w->items[i].begin = offset;
        offset += w->items[i].bytes;
    }
    const size_t tmp_len = strlen(w->path) + LLMCL__TEMP_SUFFIX_MAX;
    char *header = NULL, *tmp = malloc(tmp_len);
    size_t header_len = 0;
    LLMCL__REQUIRE(NULL, tmp, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "temporary path");
    llmcl__temp_path(tmp, tmp_len, w->path);
    llmcl_status status = header_text(w, &header, &header_len);
    if (status != LLMCL_OK) {
        free(tmp);
        return status;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f)
        status = LLMCL__FAIL(NULL, LLMCL_ERROR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    else
        status = write_file(w, f, header, header_len);
    if (f && fclose(f) != 0 && status == LLMCL_OK)
        status = LLMCL__FAIL(NULL, LLMCL_ERROR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    if (status == LLMCL_OK && rename(tmp, w->path) != 0)
        status = LLMCL__FAIL(NULL, LLMCL_ERROR_IO, "cannot rename '%s' to '%s': %s", tmp, w->path,
                             strerror(errno));
    if (status != LLMCL_OK && f)
        unlink(tmp);
    w->finished = status == LLMCL_OK;
    free(header);
    free(tmp);
    return status;
}
