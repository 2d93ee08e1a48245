/*
 * offload_state.c: the optimizer state streamed between pinned host memory and two device buffers
 * (offload_state.h). Chunk c always goes through buffer c % 2. The engine's copy queue is in
 * order, so a chunk coming into a buffer follows the copy that took the buffer's previous chunk
 * back, and prefetch_into waits for the kernels enqueued before it; the compute queue waits for a
 * chunk's arrival at a fence. The host waits only in write and read.
 */
#include "offload_state.h"

#include <stdlib.h>

#include "util.h"

#define ROWS 3 /* master, m, v */

struct offload_state {
    llmcl_ctx *ctx;
    llmcl_offload *off;
    int64_t total, chunk;
    int n_chunks;
    llmcl_offload_handle *h;      /* per chunk */
    llmcl_tensor *buf[2];         /* f32 [ROWS x chunk] each */
    llmcl_offload_handle user[2]; /* the handle whose copy last used each buffer (0: none) */
};

static int64_t chunk_len(const offload_state *s, int c)
{
    const int64_t left = s->total - (int64_t)c * s->chunk;
    return left < s->chunk ? left : s->chunk;
}

/* Chunk c's [master | m | v] in its buffer: the view a handle is copied from and into. */
static llmcl_tensor *chunk_view(const offload_state *s, int c)
{
    return tensor_slice(s->buf[c % 2], 0, ROWS * chunk_len(s, c));
}

/* Starts copying chunk c into its buffer. */
static llmcl_status load(offload_state *s, int c)
{
    llmcl_tensor *v = chunk_view(s, c);
    const llmcl_status st = llmcl_offload_prefetch_into(s->off, s->h[c], v);
    llmcl_tensor_destroy(v);
    s->user[c % 2] = s->h[c];
    return st;
}

/* Chunk c's buffer back over its pinned block. */
static llmcl_status store(offload_state *s, int c)
{
    llmcl_tensor *v = chunk_view(s, c);
    const llmcl_status st = llmcl_offload_save_into(s->off, v, s->h[c]);
    llmcl_tensor_destroy(v);
    s->user[c % 2] = s->h[c];
    return st;
}

/*
 * The pool: the state's bytes (every block a multiple of 3 x 64 x 4 bytes, so the pool's 256-byte
 * rounding wastes none), and where the pool needs several pinned buffers, each at most the
 * device's largest allocation, a block more per buffer, since a block never spans two and each may
 * leave less than one unused at its end.
 */
static uint64_t pool_bytes(const offload_state *s)
{
    const uint64_t state = (uint64_t)s->total * ROWS * sizeof(float);
    const uint64_t block = (uint64_t)s->chunk * ROWS * sizeof(float);
    const uint64_t most = llmcl_ctx_device_info(s->ctx)->max_alloc_bytes / 256 * 256;
    if (state <= most || block >= most) /* one buffer; or no buffer holds a block at all */
        return state;
    const uint64_t buffers = (state + most - block - 1) / (most - block);
    return state + buffers * block;
}

/* The engine, its pool, the two buffers and a zero handle per chunk. */
static llmcl_status build(offload_state *s)
{
    const int64_t rows = ROWS * s->chunk;
    TRY(llmcl_offload_create(s->ctx, pool_bytes(s), &s->off));
    for (int k = 0; k < 2; ++k)
        TRY(llmcl_tensor_create(s->ctx, LLMCL_F32, 1, &rows, &s->buf[k]));
    TRY(llmcl_fill(s->ctx, s->buf[0], 0.0));
    for (int c = 0; c < s->n_chunks; ++c) { /* every chunk saved from the same zeros */
        llmcl_tensor *v = chunk_view(s, c);
        const llmcl_status st = llmcl_offload_save(s->off, v, &s->h[c]);
        llmcl_tensor_destroy(v);
        TRY(st);
    }
    s->user[0] = s->h[s->n_chunks - 1]; /* the copy queue is in order: the last save ends last */
    return LLMCL_OK;
}

llmcl_status offload_state_create(llmcl_ctx *ctx, int64_t total, uint64_t chunk_bytes,
                                  offload_state **out)
{
    offload_state *s = xcalloc(1, sizeof *s);
    s->ctx = ctx;
    s->total = total;
    /* at most an eighth of the layout, so that the two buffers hold a quarter of the state at
       most (a small model's would otherwise take more device memory than the state itself) */
    const int64_t budget = (int64_t)(chunk_bytes / (ROWS * sizeof(float))) / 64 * 64;
    const int64_t eighth = (total / 8 + 63) / 64 * 64;
    s->chunk = budget < eighth ? budget : eighth;
    s->chunk = s->chunk < 64 ? 64 : s->chunk;
    s->n_chunks = (int)((total + s->chunk - 1) / s->chunk);
    s->h = xcalloc((size_t)s->n_chunks, sizeof *s->h);
    const llmcl_status st = build(s);
    if (st != LLMCL_OK) {
        offload_state_destroy(s);
        s = NULL;
    }
    *out = s;
    return st;
}

void offload_state_destroy(offload_state *s)
{
    if (!s)
        return;
    llmcl_offload_destroy(s->off);
    for (int k = 0; k < 2; ++k)
        llmcl_tensor_destroy(s->buf[k]);
    free(s->h);
    free(s);
}

int64_t offload_state_chunk(const offload_state *s) { return s->chunk; }
int offload_state_chunks(const offload_state *s) { return s->n_chunks; }
llmcl_offload *offload_state_engine(offload_state *s) { return s->off; }

/* fn on chunk c, once it is in its buffer; then back to the pool with write_back. */
static llmcl_status visit(offload_state *s, int c, bool write_back, offload_state_fn fn, void *arg)
{
    const int64_t len = chunk_len(s, c);
    llmcl_tensor *rows[ROWS];
    for (int r = 0; r < ROWS; ++r)
        rows[r] = tensor_slice(s->buf[c % 2], r * len, len);
    llmcl_status st = llmcl_offload_fence(s->off, s->h[c]);
    if (st == LLMCL_OK)
        st = fn(arg, (int64_t)c * s->chunk, len, rows[0], rows[1], rows[2]);
    if (st == LLMCL_OK && write_back)
        st = store(s, c);
    for (int r = 0; r < ROWS; ++r)
        llmcl_tensor_destroy(rows[r]);
    return st;
}

llmcl_status offload_state_stream(offload_state *s, bool write_back, offload_state_fn fn,
                                  void *arg)
{
    TRY(load(s, 0));
    for (int c = 0; c < s->n_chunks; ++c) {
        /* into the other buffer, behind the copy that takes its chunk back */
        if (c + 1 < s->n_chunks)
            TRY(load(s, c + 1));
        TRY(visit(s, c, write_back, fn, arg));
    }
    return LLMCL_OK;
}

/* Row r of chunk c from host image src (NULL: zeros) into its buffer. */
static llmcl_status put_row(offload_state *s, int c, int r, const float *src)
{
    const int64_t len = chunk_len(s, c);
    llmcl_tensor *v = tensor_slice(s->buf[c % 2], r * len, len);
    const llmcl_status st = src ? llmcl_tensor_upload(v, src + (int64_t)c * s->chunk,
                                                      (size_t)len * sizeof *src)
                                : llmcl_fill(s->ctx, v, 0.0);
    llmcl_tensor_destroy(v);
    return st;
}

llmcl_status offload_state_write(offload_state *s, const float *master, const float *m,
                                 const float *v)
{
    const float *src[ROWS] = {master, m, v};
    for (int c = 0; c < s->n_chunks; ++c) {
        /* the buffer's last copy must have read it before the host overwrites it */
        if (s->user[c % 2].id)
            TRY(llmcl_offload_fence(s->off, s->user[c % 2]));
        for (int r = 0; r < ROWS; ++r)
            TRY(put_row(s, c, r, src[r]));
        TRY(store(s, c));
    }
    return LLMCL_OK;
}

llmcl_status offload_state_read(offload_state *s, float *master, float *m, float *v)
{
    float *dst[ROWS] = {master, m, v};
    for (int c = 0; c < s->n_chunks; ++c) {
        const int64_t len = chunk_len(s, c);
        TRY(load(s, c));
        TRY(llmcl_offload_fence(s->off, s->h[c]));
        for (int r = 0; r < ROWS; ++r) {
            if (!dst[r])
                continue;
            llmcl_tensor *row = tensor_slice(s->buf[c % 2], r * len, len);
            const llmcl_status st = llmcl_tensor_download(row, dst[r] + (int64_t)c * s->chunk,
                                                          (size_t)len * sizeof *dst[r]);
            llmcl_tensor_destroy(row);
            TRY(st);
        }
    }
    return LLMCL_OK;
}
