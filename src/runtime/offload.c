/*
 * offload.c: the host offload engine. Saved tensors go to a pool of pinned host memory on a second
 * in-order queue (the copy queue) and come back into new device tensors; the compute queue (the
 * context's) and the copy queue are ordered only by events, markers and barriers, so the host never
 * waits on the compute path. The pool is a first-fit free list over pinned chunks that are mapped
 * once. Handles carry the engine's serial, a slot and its generation; a released slot drains (keeps
 * its pinned block and device temporaries) until the copies that use them have completed, which
 * is polled, never waited for, except when the pool is full. A handle can also stay in the pool as
 * persistent state, copied into and out of the caller's device buffers (save_into, prefetch_into).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define POOL_ALIGN 256 /* bytes; keeps every block aligned for DMA */
#define MAX_SLOTS 65535

typedef struct chunk {
    cl_mem mem;
    char *host; /* mapped once, for the engine's life */
    uint64_t bytes;
} chunk;

typedef struct block {
    uint32_t chunk;
    uint64_t offset, bytes;
} block;

typedef enum slot_state { SLOT_FREE = 0, SLOT_LIVE, SLOT_DRAINING } slot_state;

typedef struct slot {
    slot_state state;
    uint32_t generation;
    llmcl_dtype dtype;
    int ndim;
    int64_t shape[LLMCL_MAX_DIMS];
    uint64_t bytes;            /* of data; the block is rounded up */
    block blk;
    cl_event saved;            /* the device-to-host copy */
    cl_event loaded;           /* the latest host-to-device copy, or NULL */
    bool loaded_counted;       /* its time is in the statistics */
    bool loaded_last;          /* the latest copy of the slot is `loaded`, not `saved` */
    llmcl_tensor *source;      /* what the save's copy reads, held until it completes */
    llmcl_tensor *prefetched;  /* waiting for restore, or NULL */
} slot;

/*
 * A copy that its slot replaced by a newer one (save_into, prefetch_into) before it was counted:
 * its time is added, and a save's source freed, once it completes.
 */
typedef struct retired {
    cl_event copy;
    llmcl_tensor *source; /* what a save read; NULL for a host-to-device copy */
} retired;

/* One barrier on the compute queue: when the queue reached it, and the copy it waited for. */
typedef struct probe {
    cl_event arrive, copy;
} probe;

struct llmcl_offload {
    llmcl_ctx *ctx;
    cl_command_queue copyq;
    uint32_t serial;
    chunk *chunks;
    uint32_t n_chunks;
    block *free; /* sorted by (chunk, offset), neighbours merged */
    size_t n_free, cap_free;
    slot *slots;
    uint32_t n_slots, cap_slots;
    probe *probes;
    size_t n_probes, cap_probes;
    retired *retired;
    size_t n_retired, cap_retired;
    llmcl_offload_stats stats;
};

static atomic_uint next_serial;

/* ---- pinned host memory ---- */

llmcl_status llmcl__pinned_alloc(llmcl_ctx *ctx, cl_command_queue queue, uint64_t bytes,
                                 cl_mem *mem, void **host)
{
    cl_int err;
    *mem = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, (size_t)bytes,
                          NULL, &err);
    if (err != CL_SUCCESS)
        return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                           "pinned host buffer of %llu bytes: clCreateBuffer returned %s",
                           (unsigned long long)bytes, llmcl_status_str(err));
    *host = clEnqueueMapBuffer(queue, *mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, (size_t)bytes,
                               0, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        clReleaseMemObject(*mem);
        *mem = NULL;
        return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                           "mapping a pinned host buffer of %llu bytes: %s",
                           (unsigned long long)bytes, llmcl_status_str(err));
    }
    return LLMCL_OK;
}

void llmcl__pinned_free(cl_command_queue queue, cl_mem mem, void *host)
{
    clEnqueueUnmapMemObject(queue, mem, host, 0, NULL, NULL);
    clFinish(queue);
    clReleaseMemObject(mem);
}

/* ---- small helpers ---- */

/* Grows a dynamic array to hold one more element; false when out of memory. */
static bool grow(void **items, size_t size, size_t n, size_t *cap)
{
    if (n < *cap)
        return true;
    const size_t want = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, want * size);
    if (!p)
        return false;
    *items = p;
    *cap = want;
    return true;
}

static bool complete(cl_event ev)
{
    cl_int status = CL_COMPLETE;
    if (ev)
        clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    return status <= CL_COMPLETE; /* negative: failed, which also ends the command */
}

static double event_ms(cl_event ev)
{
    cl_ulong start = 0, end = 0;
    if (clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) !=
            CL_SUCCESS ||
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) != CL_SUCCESS)
        return 0.0;
    return end > start ? (double)(end - start) * 1e-6 : 0.0;
}

/* ---- the pool: first fit over a sorted free list ---- */

static void pool_put(llmcl_offload *off, block b)
{
    size_t i = 0;
    while (i < off->n_free && (off->free[i].chunk < b.chunk ||
                               (off->free[i].chunk == b.chunk && off->free[i].offset < b.offset)))
        ++i;
    block *prev = i > 0 && off->free[i - 1].chunk == b.chunk &&
                          off->free[i - 1].offset + off->free[i - 1].bytes == b.offset
                      ? &off->free[i - 1]
                      : NULL;
    block *next = i < off->n_free && off->free[i].chunk == b.chunk &&
                          b.offset + b.bytes == off->free[i].offset
                      ? &off->free[i]
                      : NULL;
    off->stats.pinned_in_use -= b.bytes;
    if (prev && next) {
        prev->bytes += b.bytes + next->bytes;
        memmove(next, next + 1, (off->n_free - i - 1) * sizeof *next);
        --off->n_free;
    } else if (prev) {
        prev->bytes += b.bytes;
    } else if (next) {
        next->offset = b.offset;
        next->bytes += b.bytes;
    } else {
        /* one entry per gap between blocks in use: the capacity reserved at creation suffices */
        memmove(&off->free[i + 1], &off->free[i], (off->n_free - i) * sizeof b);
        off->free[i] = b;
        ++off->n_free;
    }
}

static bool pool_take(llmcl_offload *off, uint64_t bytes, block *out)
{
    for (size_t i = 0; i < off->n_free; ++i) {
        block *f = &off->free[i];
        if (f->bytes < bytes)
            continue;
        *out = (block){f->chunk, f->offset, bytes};
        f->offset += bytes;
        f->bytes -= bytes;
        if (f->bytes == 0) {
            memmove(f, f + 1, (off->n_free - i - 1) * sizeof *f);
            --off->n_free;
        }
        off->stats.pinned_in_use += bytes;
        if (off->stats.pinned_in_use > off->stats.peak_pinned_in_use)
            off->stats.peak_pinned_in_use = off->stats.pinned_in_use;
        return true;
    }
    return false;
}

static uint64_t largest_free(const llmcl_offload *off)
{
    uint64_t best = 0;
    for (size_t i = 0; i < off->n_free; ++i)
        best = off->free[i].bytes > best ? off->free[i].bytes : best;
    return best;
}

static char *block_host(const llmcl_offload *off, block b)
{
    return off->chunks[b.chunk].host + b.offset;
}

/* ---- completion, polled ---- */

/* Adds the latest host-to-device copy's time once it has completed. */
static void count_loaded(llmcl_offload *off, slot *s)
{
    if (s->loaded && !s->loaded_counted && complete(s->loaded)) {
        off->stats.restore_ms += event_ms(s->loaded);
        s->loaded_counted = true;
    }
}

/* Frees what a slot holds; its handle is already invalid. */
static void slot_clear(llmcl_offload *off, slot *s)
{
    llmcl_tensor_destroy(s->source);
    llmcl_tensor_destroy(s->prefetched);
    llmcl__release_event(&s->saved);
    llmcl__release_event(&s->loaded);
    pool_put(off, s->blk);
    *s = (slot){.generation = s->generation};
}

/* The slot's latest copy: the copy queue is in order, so every earlier one has ended with it. */
static cl_event latest(const slot *s) { return s->loaded_last ? s->loaded : s->saved; }

/* Adds the time of each retired copy that has completed and frees its source. */
static void reap_retired(llmcl_offload *off)
{
    size_t kept = 0;
    for (size_t i = 0; i < off->n_retired; ++i) {
        retired *r = &off->retired[i];
        if (!complete(r->copy)) {
            off->retired[kept++] = *r;
            continue;
        }
        *(r->source ? &off->stats.save_ms : &off->stats.restore_ms) += event_ms(r->copy);
        llmcl_tensor_destroy(r->source);
        clReleaseEvent(r->copy);
    }
    off->n_retired = kept;
}

/* Room for the two copies a slot may retire, taken before anything is enqueued. */
static llmcl_status reserve_retired(llmcl_offload *off)
{
    for (int i = 0; i < 2; ++i)
        LLMCL__REQUIRE(off->ctx,
                       grow((void **)&off->retired, sizeof *off->retired, off->n_retired + (size_t)i,
                            &off->cap_retired),
                       LLMCL_ERROR_OUT_OF_HOST_MEMORY, "offload copy table");
    return LLMCL_OK;
}

/* Lets the slot take a new save: its current one, if not counted yet, is retired. */
static void retire_save(llmcl_offload *off, slot *s)
{
    if (s->source)
        off->retired[off->n_retired++] = (retired){s->saved, s->source};
    else
        llmcl__release_event(&s->saved);
    s->saved = NULL;
    s->source = NULL;
}

/* The same for a new host-to-device copy. */
static void retire_load(llmcl_offload *off, slot *s)
{
    count_loaded(off, s);
    if (s->loaded && !s->loaded_counted)
        off->retired[off->n_retired++] = (retired){s->loaded, NULL};
    else
        llmcl__release_event(&s->loaded);
    s->loaded = NULL;
}

/* Adds each completed copy's time once, then drops what completed copies no longer need. */
static void reap(llmcl_offload *off)
{
    reap_retired(off);
    for (uint32_t i = 0; i < off->n_slots; ++i) {
        slot *s = &off->slots[i];
        if (s->state == SLOT_FREE)
            continue;
        if (s->source && complete(s->saved)) {
            off->stats.save_ms += event_ms(s->saved);
            llmcl_tensor_destroy(s->source);
            s->source = NULL;
        }
        count_loaded(off, s);
        if (s->state == SLOT_DRAINING && !s->source && complete(s->loaded))
            slot_clear(off, s);
    }
    size_t kept = 0;
    for (size_t i = 0; i < off->n_probes; ++i) {
        probe *p = &off->probes[i];
        if (!complete(p->arrive) || !complete(p->copy)) {
            off->probes[kept++] = *p;
            continue;
        }
        cl_ulong reached = 0, copied = 0;
        if (clGetEventProfilingInfo(p->arrive, CL_PROFILING_COMMAND_END, sizeof reached, &reached,
                                    NULL) == CL_SUCCESS &&
            clGetEventProfilingInfo(p->copy, CL_PROFILING_COMMAND_END, sizeof copied, &copied,
                                    NULL) == CL_SUCCESS &&
            copied > reached)
            off->stats.stall_ms += (double)(copied - reached) * 1e-6;
        clReleaseEvent(p->arrive);
        clReleaseEvent(p->copy);
    }
    off->n_probes = kept;
}

/* Host wait for the copies of released slots, so that their blocks return to the pool. */
static void drain(llmcl_offload *off)
{
    for (uint32_t i = 0; i < off->n_slots; ++i) {
        slot *s = &off->slots[i];
        if (s->state != SLOT_DRAINING)
            continue;
        cl_event last = latest(s);
        clWaitForEvents(1, &last);
    }
    reap(off);
}

/* ---- handles ---- */

static llmcl_offload_handle make_handle(const llmcl_offload *off, uint32_t index)
{
    return (llmcl_offload_handle){((uint64_t)off->serial << 48) | ((uint64_t)index << 32) |
                                  off->slots[index].generation};
}

static llmcl_status find_slot(llmcl_offload *off, llmcl_offload_handle h, slot **out)
{
    const uint32_t serial = (uint32_t)(h.id >> 48), index = (uint32_t)(h.id >> 32) & 0xffffu;
    const uint32_t generation = (uint32_t)h.id;
    llmcl_ctx *ctx = off->ctx;
    LLMCL__REQUIRE(ctx, h.id != 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "the offload handle is zero: it was not returned by llmcl_offload_save");
    LLMCL__REQUIRE(ctx, serial == off->serial, LLMCL_ERROR_INVALID_ARGUMENT,
                   "offload handle %#llx belongs to another offload engine",
                   (unsigned long long)h.id);
    LLMCL__REQUIRE(ctx, index < off->n_slots && off->slots[index].state == SLOT_LIVE &&
                            off->slots[index].generation == generation,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "offload handle %#llx was released (or never issued by this engine)",
                   (unsigned long long)h.id);
    *out = &off->slots[index];
    return LLMCL_OK;
}

static llmcl_status new_slot(llmcl_offload *off, uint32_t *index)
{
    for (uint32_t i = 0; i < off->n_slots; ++i)
        if (off->slots[i].state == SLOT_FREE) {
            *index = i;
            return LLMCL_OK;
        }
    LLMCL__REQUIRE(off->ctx, off->n_slots < MAX_SLOTS, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "an offload engine holds at most %d handles", MAX_SLOTS);
    size_t cap = off->cap_slots;
    LLMCL__REQUIRE(off->ctx, grow((void **)&off->slots, sizeof *off->slots, off->n_slots, &cap),
                   LLMCL_ERROR_OUT_OF_HOST_MEMORY, "offload handle table");
    off->cap_slots = (uint32_t)cap;
    *index = off->n_slots++;
    off->slots[*index] = (slot){.generation = 0};
    return LLMCL_OK;
}

/* ---- compute-queue barriers ---- */

/*
 * Later work on the compute queue waits for copy. A marker just before the barrier tells when the
 * queue reached it, for the stall statistic.
 */
static llmcl_status wait_on_compute(llmcl_offload *off, cl_event copy)
{
    llmcl_ctx *ctx = off->ctx;
    if (complete(copy))
        return LLMCL_OK;
    cl_event arrive = NULL;
    if (ctx->queue_profiling && grow((void **)&off->probes, sizeof *off->probes, off->n_probes,
                                     &off->cap_probes))
        LLMCL__CL(ctx, clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, &arrive));
    cl_int err = clEnqueueBarrierWithWaitList(ctx->queue, 1, &copy, NULL);
    if (arrive) {
        clRetainEvent(copy);
        off->probes[off->n_probes++] = (probe){arrive, copy};
    }
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(ctx, err, "clEnqueueBarrierWithWaitList", __FILE__, __LINE__);
    return LLMCL_OK;
}

/* ---- the API ---- */

static llmcl_status add_chunks(llmcl_offload *off, uint64_t pool_bytes)
{
    llmcl_ctx *ctx = off->ctx;
    const uint64_t max_chunk = ctx->info.max_alloc_bytes / POOL_ALIGN * POOL_ALIGN;
    /* pinned memory beyond the host's can never be had; the bound also keeps the count of
       chunks and the bookkeeping's sizes in range */
    const uint64_t host = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    LLMCL__REQUIRE(ctx, pool_bytes <= host, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "an offload pool of %llu bytes: this host has %llu",
                   (unsigned long long)pool_bytes, (unsigned long long)host);
    const uint64_t n = (pool_bytes - 1) / max_chunk + 1; /* pool_bytes > 0 */
    off->chunks = calloc((size_t)n, sizeof *off->chunks);
    /* one free block per gap between blocks in use, and a block per live handle at most */
    const uint64_t most_blocks = pool_bytes / POOL_ALIGN < MAX_SLOTS ? pool_bytes / POOL_ALIGN
                                                                     : MAX_SLOTS;
    off->cap_free = (size_t)most_blocks + n + 1;
    off->free = calloc(off->cap_free, sizeof *off->free);
    LLMCL__REQUIRE(ctx, off->chunks && off->free, LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "offload pool bookkeeping for %llu bytes", (unsigned long long)pool_bytes);
    for (uint64_t left = pool_bytes; left > 0; ++off->n_chunks) {
        chunk *c = &off->chunks[off->n_chunks];
        c->bytes = left < max_chunk ? left : max_chunk;
        void *host;
        LLMCL__TRY(llmcl__pinned_alloc(ctx, off->copyq, c->bytes, &c->mem, &host));
        c->host = host;
        off->free[off->n_free++] = (block){off->n_chunks, 0, c->bytes};
        left -= c->bytes;
    }
    off->stats.pinned_bytes = pool_bytes;
    return LLMCL_OK;
}

llmcl_status llmcl_offload_create(llmcl_ctx *ctx, uint64_t pool_bytes, llmcl_offload **out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    LLMCL__REQUIRE(ctx, pool_bytes > 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "the pinned pool needs at least one byte");
    llmcl_offload *off = calloc(1, sizeof *off);
    LLMCL__REQUIRE(ctx, off, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "offload engine");
    off->ctx = ctx;
    off->serial = atomic_fetch_add(&next_serial, 1) % 0xffffu + 1; /* never 0: 0 is no handle */
    cl_int err;
    /* always profiled: copy times and stalls come from its events */
    off->copyq = clCreateCommandQueue(ctx->context, ctx->device, CL_QUEUE_PROFILING_ENABLE, &err);
    llmcl_status st = err == CL_SUCCESS
                          ? add_chunks(off, pool_bytes)
                          : llmcl__fail_cl(ctx, err, "clCreateCommandQueue", __FILE__, __LINE__);
    if (st != LLMCL_OK) {
        llmcl_offload_destroy(off);
        return st;
    }
    *out = off;
    return LLMCL_OK;
}

void llmcl_offload_destroy(llmcl_offload *off)
{
    if (!off)
        return;
    if (off->copyq)
        clFinish(off->copyq);
    for (uint32_t i = 0; i < off->n_slots; ++i)
        if (off->slots[i].state != SLOT_FREE)
            slot_clear(off, &off->slots[i]);
    for (size_t i = 0; i < off->n_probes; ++i) {
        clReleaseEvent(off->probes[i].arrive);
        clReleaseEvent(off->probes[i].copy);
    }
    for (size_t i = 0; i < off->n_retired; ++i) {
        llmcl_tensor_destroy(off->retired[i].source);
        clReleaseEvent(off->retired[i].copy);
    }
    for (uint32_t i = 0; i < off->n_chunks; ++i)
        llmcl__pinned_free(off->copyq, off->chunks[i].mem, off->chunks[i].host);
    if (off->copyq)
        clReleaseCommandQueue(off->copyq);
    free(off->chunks);
    free(off->free);
    free(off->slots);
    free(off->probes);
    free(off->retired);
    free(off);
}

/* What the save's copy reads: a view holding t's buffer, or a contiguous copy of a strided t. */
static llmcl_status save_source(llmcl_offload *off, const llmcl_tensor *t, llmcl_tensor **out)
{
    if (llmcl_tensor_is_contiguous(t))
        return llmcl_tensor_view(t, t->ndim, t->shape, t->strides, t->offset, out);
    /* not a scratch tensor: the copy queue reads it, and the cache serves the compute queue */
    LLMCL__TRY(llmcl_tensor_create(off->ctx, t->dtype, t->ndim, t->shape, out));
    llmcl_status st = llmcl_copy(off->ctx, t, *out);
    if (st != LLMCL_OK) {
        llmcl_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

/* A pool block for bytes; waits for released blocks' copies once before giving up. */
static llmcl_status take_block(llmcl_offload *off, uint64_t bytes, block *out)
{
    const uint64_t want = (uint64_t)llmcl__div_up((int64_t)bytes, POOL_ALIGN) * POOL_ALIGN;
    if (pool_take(off, want, out))
        return LLMCL_OK;
    drain(off);
    LLMCL__REQUIRE(off->ctx, pool_take(off, want, out), LLMCL_ERROR_OUT_OF_HOST_MEMORY,
                   "the offload pool is exhausted: saving %llu bytes needs a free block of %llu; "
                   "%llu of %llu pinned bytes are in use, the largest free block is %llu bytes",
                   (unsigned long long)bytes, (unsigned long long)want,
                   (unsigned long long)off->stats.pinned_in_use,
                   (unsigned long long)off->stats.pinned_bytes,
                   (unsigned long long)largest_free(off));
    return LLMCL_OK;
}

/* A marker after everything enqueued on the compute queue so far, for the copy queue to wait on. */
static llmcl_status compute_marker(llmcl_offload *off, cl_event *out)
{
    llmcl_ctx *ctx = off->ctx;
    LLMCL__CL(ctx, clEnqueueMarkerWithWaitList(ctx->queue, 0, NULL, out));
    /* the copy queue waits on this marker, so the compute queue must reach the device */
    const cl_int err = clFlush(ctx->queue);
    if (err == CL_SUCCESS)
        return LLMCL_OK;
    clReleaseEvent(*out);
    return llmcl__fail_cl(ctx, err, "clFlush", __FILE__, __LINE__);
}

/*
 * Enqueues the device-to-host copy of s->source after everything enqueued on the compute queue;
 * s->saved must be free (a new slot, or retire_save).
 */
static llmcl_status start_save(llmcl_offload *off, slot *s)
{
    llmcl_ctx *ctx = off->ctx;
    cl_event produced;
    LLMCL__TRY(compute_marker(off, &produced));
    const size_t start = (size_t)s->source->offset * llmcl_dtype_size(s->dtype);
    cl_int err = clEnqueueReadBuffer(off->copyq, s->source->mem, CL_FALSE, start, (size_t)s->bytes,
                                     block_host(off, s->blk), 1, &produced, &s->saved);
    clReleaseEvent(produced);
    if (err == CL_SUCCESS)
        err = clFlush(off->copyq);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(ctx, err, "enqueueing the save's copy", __FILE__, __LINE__);
    s->loaded_last = false;
    off->stats.bytes_saved += s->bytes;
    return LLMCL_OK;
}

/*
 * Enqueues the host-to-device copy of s's data into dst (contiguous, s's bytes), after the compute
 * queue's work so far when dst may be in use there; it becomes the slot's latest copy. The copy
 * queue is in order, so it also follows every copy enqueued before (the save that filled the
 * block, or one that still reads dst).
 */
static llmcl_status start_load(llmcl_offload *off, slot *s, const llmcl_tensor *dst,
                               bool after_compute)
{
    llmcl_ctx *ctx = off->ctx;
    cl_event produced = NULL, loaded = NULL;
    if (after_compute)
        LLMCL__TRY(compute_marker(off, &produced));
    const size_t start = (size_t)dst->offset * llmcl_dtype_size(s->dtype);
    cl_int err = clEnqueueWriteBuffer(off->copyq, dst->mem, CL_FALSE, start, (size_t)s->bytes,
                                      block_host(off, s->blk), produced ? 1 : 0,
                                      produced ? &produced : NULL, &loaded);
    if (produced)
        clReleaseEvent(produced);
    if (err == CL_SUCCESS)
        err = clFlush(off->copyq);
    if (err != CL_SUCCESS) {
        if (loaded)
            clReleaseEvent(loaded);
        return llmcl__fail_cl(ctx, err, "enqueueing the host-to-device copy", __FILE__, __LINE__);
    }
    retire_load(off, s);
    s->loaded = loaded;
    s->loaded_counted = false;
    s->loaded_last = true;
    off->stats.bytes_restored += s->bytes;
    return LLMCL_OK;
}

llmcl_status llmcl_offload_save(llmcl_offload *off, const llmcl_tensor *t,
                                llmcl_offload_handle *out)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    llmcl_ctx *ctx = off->ctx;
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = (llmcl_offload_handle){0};
    LLMCL__TRY(llmcl__check_tensor(ctx, t, "t", LLMCL__ALL_DTYPES, 0, LLMCL_MAX_DIMS));
    const int64_t numel = llmcl_tensor_numel(t);
    LLMCL__REQUIRE(ctx, numel > 0, LLMCL_ERROR_INVALID_ARGUMENT, "t has no elements to save");
    reap(off);
    uint32_t index = 0;
    LLMCL__TRY(new_slot(off, &index));
    slot *s = &off->slots[index];
    s->bytes = (uint64_t)numel * llmcl_dtype_size(t->dtype);
    s->dtype = t->dtype;
    s->ndim = t->ndim;
    memcpy(s->shape, t->shape, sizeof s->shape);
    LLMCL__TRY(take_block(off, s->bytes, &s->blk));
    llmcl_status st;
    LLMCL__TRY_GOTO(st, save_source(off, t, &s->source), fail);
    LLMCL__TRY_GOTO(st, start_save(off, s), fail);
    s->state = SLOT_LIVE;
    *out = make_handle(off, index);
    return LLMCL_OK;
fail:
    /* nothing was enqueued that reads the block: give it back at once */
    slot_clear(off, s);
    return st;
}

/* A live slot for h, and t of its saved tensor's dtype and size (for the _into calls). */
static llmcl_status slot_like(llmcl_offload *off, llmcl_offload_handle h, const llmcl_tensor *t,
                              const char *name, slot **out)
{
    llmcl_ctx *ctx = off->ctx;
    LLMCL__TRY(find_slot(off, h, out));
    LLMCL__TRY(llmcl__check_tensor(ctx, t, name, LLMCL__ALL_DTYPES, 0, LLMCL_MAX_DIMS));
    const slot *s = *out;
    const int64_t numel = llmcl_tensor_numel(t);
    LLMCL__REQUIRE(ctx, t->dtype == s->dtype && (uint64_t)numel * llmcl_dtype_size(t->dtype) ==
                                                    s->bytes,
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s (%s, %lld elements) is not of the saved tensor's dtype and size (%s, %llu "
                   "elements)", name, llmcl_dtype_name(t->dtype), (long long)numel,
                   llmcl_dtype_name(s->dtype),
                   (unsigned long long)(s->bytes / llmcl_dtype_size(s->dtype)));
    /* room to retire the slot's copies, so that nothing fails once a copy is enqueued */
    return reserve_retired(off);
}

llmcl_status llmcl_offload_save_into(llmcl_offload *off, const llmcl_tensor *t,
                                     llmcl_offload_handle h)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    slot *s;
    LLMCL__TRY(slot_like(off, h, t, "t", &s));
    reap(off);
    llmcl_tensor *source;
    LLMCL__TRY(save_source(off, t, &source));
    retire_save(off, s);
    s->source = source;
    return start_save(off, s);
}

llmcl_status llmcl_offload_fence(llmcl_offload *off, llmcl_offload_handle h)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    slot *s;
    LLMCL__TRY(find_slot(off, h, &s));
    return wait_on_compute(off, latest(s));
}

llmcl_status llmcl_offload_prefetch(llmcl_offload *off, llmcl_offload_handle h)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    slot *s;
    LLMCL__TRY(find_slot(off, h, &s));
    if (s->prefetched)
        return LLMCL_OK;
    reap(off);
    LLMCL__TRY(reserve_retired(off));
    llmcl_tensor *t;
    LLMCL__TRY(llmcl_tensor_create(off->ctx, s->dtype, s->ndim, s->shape, &t));
    const llmcl_status st = start_load(off, s, t, false); /* t is new: nothing uses it yet */
    if (st != LLMCL_OK) {
        llmcl_tensor_destroy(t);
        return st;
    }
    s->prefetched = t;
    return LLMCL_OK;
}

llmcl_status llmcl_offload_prefetch_into(llmcl_offload *off, llmcl_offload_handle h,
                                         llmcl_tensor *dst)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    slot *s;
    LLMCL__TRY(slot_like(off, h, dst, "dst", &s));
    LLMCL__REQUIRE(off->ctx, llmcl_tensor_is_contiguous(dst), LLMCL_ERROR_INVALID_ARGUMENT,
                   "dst must be contiguous");
    reap(off);
    return start_load(off, s, dst, true);
}

llmcl_status llmcl_offload_restore(llmcl_offload *off, llmcl_offload_handle h, llmcl_tensor **out)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    LLMCL__REQUIRE(off->ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    LLMCL__TRY(llmcl_offload_prefetch(off, h));
    slot *s;
    LLMCL__TRY(find_slot(off, h, &s));
    LLMCL__TRY(wait_on_compute(off, s->loaded));
    *out = s->prefetched;
    s->prefetched = NULL;
    return LLMCL_OK;
}

llmcl_status llmcl_offload_release(llmcl_offload *off, llmcl_offload_handle h)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    slot *s;
    LLMCL__TRY(find_slot(off, h, &s));
    s->state = SLOT_DRAINING;
    s->generation = s->generation == UINT32_MAX ? 1 : s->generation + 1;
    reap(off);
    return LLMCL_OK;
}

llmcl_status llmcl_offload_finish(llmcl_offload *off)
{
    LLMCL__REQUIRE(NULL, off, LLMCL_ERROR_INVALID_ARGUMENT, "off must not be NULL");
    LLMCL__CL(off->ctx, clFinish(off->copyq));
    /* rusticl may report an event complete a moment after clFinish returns: wait on each too,
       so that the statistics read next count nothing in flight */
    for (uint32_t i = 0; i < off->n_slots; ++i) {
        cl_event evs[2] = {off->slots[i].saved, off->slots[i].loaded};
        for (int k = 0; k < 2; ++k)
            if (evs[k])
                LLMCL__CL(off->ctx, clWaitForEvents(1, &evs[k]));
    }
    for (size_t i = 0; i < off->n_retired; ++i)
        LLMCL__CL(off->ctx, clWaitForEvents(1, &off->retired[i].copy));
    reap(off);
    return LLMCL_OK;
}

llmcl_status llmcl_offload_stats_get(llmcl_offload *off, llmcl_offload_stats *out)
{
    LLMCL__REQUIRE(NULL, off && out, LLMCL_ERROR_INVALID_ARGUMENT, "off and out must not be NULL");
    reap(off);
    *out = off->stats;
    for (uint32_t i = 0; i < off->n_slots; ++i) {
        const slot *s = &off->slots[i];
        out->copies_in_flight += (s->saved && !complete(s->saved)) +
                                 (s->loaded && !complete(s->loaded));
        out->live_handles += s->state == SLOT_LIVE;
    }
    out->copies_in_flight += (uint32_t)off->n_retired; /* reap kept only those not complete */
    return LLMCL_OK;
}
