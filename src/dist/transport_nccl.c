/*
 * transport_nccl.c: the NCCL transport (transport.h) on NVIDIA GPUs. NVIDIA's OpenCL and CUDA
 * share device memory (shared_mem.h): each channel has a staging range that CUDA allocates and
 * OpenCL imports, into which the compute queue copies what an op sends and from which it copies
 * what the op brings, and NCCL runs on the range's CUDA addresses. The data that llmcl_dist keeps
 * stays in OpenCL's own buffers: NVIDIA's OpenCL imports no allocation larger than 256 MiB, and
 * a staged copy costs a fraction of NCCL's time (device memory copies at about 4 TB/s, NVLink at
 * 0.4). libcuda.so.1 and libnccl.so.2 are loaded at run time; nothing here is needed to build.
 *
 * Ordering, with neither queue waiting for the host:
 *   - OpenCL -> NCCL: the compute queue writes a sequence number into a flag range after an op's
 *     copies into staging (clEnqueueFillBuffer), and the CUDA stream waits on the device until the
 *     flag reaches it (cuStreamWaitValue32) before the NCCL call;
 *   - NCCL -> OpenCL: a CUDA event is recorded after the call, and a helper thread of this
 *     transport completes an OpenCL user event once it has; complete() makes the compute queue
 *     wait for that user event, then copy the result out of staging. CUDA's host functions may
 *     not call into the driver, which NVIDIA's OpenCL does, so the user event is completed from
 *     the helper thread.
 * The helper thread polls the events in issue order (one stream: they complete in that order),
 * and watches NCCL: an asynchronous error, or an op that takes longer than LLMCL_NCCL_TIMEOUT
 * seconds (default 600), aborts the communicator, fails the user events (the compute queue is
 * released, its commands fail) and the next dist call reports it. The abort frees the
 * communicator, so it waits for the calling thread's NCCL calls in flight (a lock), after which
 * no call is made on it.
 *
 * NVIDIA's OpenCL runs its kernels in a CUDA context of its own, and kernels of two contexts take
 * turns on the GPU, so NCCL's kernels cannot run beside llmcl's. NCCL 2.28's collectives on the
 * copy engines can: with the communicator's CTA policy NCCL_CTA_POLICY_ZERO and every staging
 * piece registered as a symmetric window (ncclCommWindowRegister), ncclAllGather and ncclAlltoAll
 * run as copies between the GPUs, no kernel. On them a reduce-scatter exchanges the blocks
 * (ncclAlltoAll) and sum_parts adds the parts from staging in f32 in rank order on the device,
 * as under MPI.
 * Where NCCL is older, the ranks span hosts (NCCL runs copy engines within one) or
 * LLMCL_NCCL_CE=0, its kernels run instead: a reduce-scatter of f32 is ncclReduceScatter in
 * place, one of bf16 an exchange too, as NCCL would round every partial sum to bf16. Either way
 * collectives run between the compute by default (llmcl__dist_nccl_create says why). Staging
 * holds an op chunk by chunk (staging.h), so that no call crosses a piece. Every NCCL call is
 * made by the thread that calls llmcl_dist, in program order, the same on every rank. The CUDA
 * calls run in the device's primary CUDA context, pushed around each call so that the
 * application's current context is left alone.
 */
#undef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "shared_mem.h"
#include "staging.h"
#include "transport.h"

/* ---- NCCL's API (nccl.h, 2.x), loaded at run time ---- */

typedef void *nccl_comm;
typedef void *nccl_window;
typedef struct nccl_unique_id {
    char internal[128];
} nccl_unique_id;
enum { NCCL_OK = 0, NCCL_IN_PROGRESS = 7 };
enum { NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };
enum { NCCL_WIN_COLL_SYMMETRIC = 1, NCCL_CTA_POLICY_ZERO = 2 };

/* ncclConfig_t as NCCL 2.28 lays it out (ncclConfig_v22800); NCCL reads the fields that size and
   version cover. */
typedef struct nccl_config {
    size_t size;
    unsigned int magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
    int split_share, traffic_class;
    const char *comm_name;
    int collnet_enable, cta_policy, shrink_share, nvls_ctas, channels_per_net_peer,
        nvlink_centric_sched;
} nccl_config;

#define NCCL_CE_VERSION 22800 /* 2.28: collectives on the copy engines */

typedef struct nccl_lib {
    void *so;
    char path[256];
    int version;
    int (*get_version)(int *);
    int (*get_unique_id)(nccl_unique_id *);
    int (*comm_init_rank)(nccl_comm *, int, nccl_unique_id, int);
    int (*comm_init_rank_config)(nccl_comm *, int, nccl_unique_id, int, nccl_config *);
    int (*window_register)(nccl_comm, void *, size_t, nccl_window *, int);
    int (*window_deregister)(nccl_comm, nccl_window);
    int (*all_to_all)(const void *, void *, size_t, int, nccl_comm, CUstream);
    int (*comm_finalize)(nccl_comm);
    int (*comm_destroy)(nccl_comm);
    int (*comm_abort)(nccl_comm);
    int (*comm_async_error)(nccl_comm, int *);
    const char *(*error_string)(int);
    int (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
    int (*all_gather)(const void *, void *, size_t, int, nccl_comm, CUstream);
    int (*send)(const void *, size_t, int, int, nccl_comm, CUstream);
    int (*recv)(void *, size_t, int, int, nccl_comm, CUstream);
    int (*group_start)(void);
    int (*group_end)(void);
} nccl_lib;

#define NC_SYM(fn, name)                                                                          \
    do {                                                                                          \
        void *sym_ = dlsym(nc->so, (name));                                                       \
        memcpy(&nc->fn, &sym_, sizeof sym_);                                                      \
    } while (0)

/* The library LLMCL_NCCL names, else libnccl.so.2 then libnccl.so; why says what was tried. */
static bool nccl_load(nccl_lib *nc, char *why, size_t why_len)
{
    memset(nc, 0, sizeof *nc);
    const char *env = llmcl__getenv("LLMCL_NCCL");
    const char *names[] = {env, env ? NULL : "libnccl.so.2", env ? NULL : "libnccl.so"};
    size_t len = (size_t)snprintf(why, why_len, "NCCL did not load:");
    for (int i = 0; i < 3 && !nc->so; ++i) {
        if (!names[i])
            continue;
        nc->so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        const char *e = nc->so ? NULL : dlerror();
        if (e && len < why_len)
            len += (size_t)snprintf(why + len, why_len - len, " %s%s (%s);",
                                    env ? "LLMCL_NCCL=" : "", names[i], e);
        if (nc->so)
            snprintf(nc->path, sizeof nc->path, "%s", names[i]);
    }
    if (!nc->so) {
        if (len < why_len)
            snprintf(why + len, why_len - len,
                     " install NCCL (the CUDA toolkit, or pip's nvidia-nccl-cu12/cu13) and put "
                     "it on the library path, or name it in LLMCL_NCCL");
        return false;
    }
    NC_SYM(get_version, "ncclGetVersion");
    NC_SYM(get_unique_id, "ncclGetUniqueId");
    NC_SYM(comm_init_rank, "ncclCommInitRank");
    NC_SYM(comm_finalize, "ncclCommFinalize");
    NC_SYM(comm_destroy, "ncclCommDestroy");
    NC_SYM(comm_abort, "ncclCommAbort");
    NC_SYM(comm_async_error, "ncclCommGetAsyncError");
    NC_SYM(error_string, "ncclGetErrorString");
    NC_SYM(reduce_scatter, "ncclReduceScatter");
    NC_SYM(all_gather, "ncclAllGather");
    NC_SYM(send, "ncclSend");
    NC_SYM(recv, "ncclRecv");
    NC_SYM(group_start, "ncclGroupStart");
    NC_SYM(group_end, "ncclGroupEnd");
    NC_SYM(comm_init_rank_config, "ncclCommInitRankConfig");
    NC_SYM(window_register, "ncclCommWindowRegister");
    NC_SYM(window_deregister, "ncclCommWindowDeregister");
    NC_SYM(all_to_all, "ncclAlltoAll");
    if (!nc->get_version || !nc->get_unique_id || !nc->comm_init_rank || !nc->comm_destroy ||
        !nc->comm_abort || !nc->comm_async_error || !nc->error_string || !nc->reduce_scatter ||
        !nc->all_gather || !nc->send || !nc->recv || !nc->group_start || !nc->group_end ||
        nc->get_version(&nc->version) != NCCL_OK) {
        snprintf(why, why_len, "%s lacks NCCL 2's functions", nc->path);
        dlclose(nc->so);
        nc->so = NULL;
        return false;
    }
    return true;
}

/* ---- the transport's state ---- */

/* An op on a channel: what it copies back once NCCL is done, and the user event that says so. */
typedef struct nccl_op {
    int group; /* -1: idle */
    int kind, type;    /* NCCL's type of the elements */
    cl_mem buf;        /* the dist's buffer and the group's first byte in it */
    size_t buf_off;
    size_t numel, es;  /* the group's elements, their size */
    cl_event landed;
} nccl_op;

/* An op the helper thread waits for: its CUDA event and its user event (one reference each). */
typedef struct pending {
    CUevent done;
    cl_event landed;
    double since;
} pending;

#define PENDING_CAP 256

typedef struct nccl_transport {
    dist_transport base;
    llmcl__cuda cu;
    nccl_lib nc;
    shared_api api;
    CUstream stream;
    nccl_comm comm;
    bool ce; /* collectives on the copy engines: NCCL 2.28's, every rank on one host */
    shared_range flag; /* the sequence number the compute queue has reached */
    uint32_t seq;
    nccl_op op[2][DIST_SLOTS];          /* [OP_REDUCE / OP_GATHER][channel] */
    shared_range staging[2][DIST_SLOTS];
    double timeout_s;

    /* the helper thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake, drained;
    /* held while the calling thread issues NCCL calls: the helper's abort, which frees the
       communicator, falls between them, never under one that has passed the failure check */
    pthread_mutex_t issue;
    pending queue[PENDING_CAP];
    uint64_t head, tail; /* queue[head % CAP] is the oldest */
    bool stop;
    atomic_int failed;
    char failure[256];
} nccl_transport;

static nccl_transport *nccl_of(const llmcl_dist *d)
{
    return (nccl_transport *)d->transport;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The primary context around the driver and NCCL calls of the calling thread. */
static bool enter(nccl_transport *t)
{
    return t->cu.ctx_push(t->api.context) == CUDA_OK;
}

static void leave(nccl_transport *t)
{
    CUcontext prev;
    t->cu.ctx_pop(&prev);
}

static llmcl_status cuda_fail(llmcl_dist *d, const char *what, CUresult r)
{
    return LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "%s failed: %s (%d)", what,
                       llmcl__cuda_error(&nccl_of(d)->cu, r), r);
}

static llmcl_status nccl_fail(llmcl_dist *d, const char *what, int r)
{
    return LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "%s failed: %s (%d)", what,
                       nccl_of(d)->nc.error_string(r), r);
}

/* ---- the helper thread ---- */

/* Records the first failure and aborts the communicator, which ends NCCL's kernels. A caller
   stuck inside an NCCL call past ABORT_WAIT_S (a peer gone while it connects) holds the issue
   lock; the abort goes ahead without it, since NCCL's abort flag is what unblocks that call. */
#define ABORT_WAIT_S 10
static void fail_async(nccl_transport *t, const char *fmt, const char *detail)
{
    if (atomic_exchange(&t->failed, 1))
        return;
    snprintf(t->failure, sizeof t->failure, fmt, detail);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ABORT_WAIT_S;
    const bool held = pthread_mutex_timedlock(&t->issue, &until) == 0;
    t->nc.comm_abort(t->comm);
    if (held)
        pthread_mutex_unlock(&t->issue);
}

/* Takes the issue lock unless the communicator has failed (then false, the lock not held). */
static bool issue_begin(nccl_transport *t)
{
    pthread_mutex_lock(&t->issue);
    if (!atomic_load(&t->failed))
        return true;
    pthread_mutex_unlock(&t->issue);
    return false;
}

/* CL_COMPLETE once e's CUDA event has completed; negative after a failure. */
static cl_int wait_pending(nccl_transport *t, const pending *e)
{
    for (;;) {
        if (atomic_load(&t->failed))
            return -1;
        const CUresult r = t->cu.event_query(e->done);
        if (r == CUDA_OK)
            return CL_COMPLETE;
        if (r != CUDA_ERROR_NOT_READY) {
            fail_async(t, "waiting for an NCCL call: %s", llmcl__cuda_error(&t->cu, r));
            continue;
        }
        int async = NCCL_OK;
        t->nc.comm_async_error(t->comm, &async);
        if (async != NCCL_OK && async != NCCL_IN_PROGRESS) {
            fail_async(t, "NCCL reported an asynchronous error: %s", t->nc.error_string(async));
            continue;
        }
        if (now_s() - e->since > t->timeout_s) {
            char s[64];
            snprintf(s, sizeof s, "%g", t->timeout_s);
            fail_async(t, "an NCCL call took longer than LLMCL_NCCL_TIMEOUT=%s s (a rank that "
                          "stopped taking part, or a hang in NCCL)", s);
            continue;
        }
        const struct timespec nap = {0, 10000};
        nanosleep(&nap, NULL);
    }
}

static void *helper_main(void *arg)
{
    nccl_transport *t = arg;
    /* Wake-ups of 10 us, not the default slack of 50 us: this thread's latency is the ops'. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    t->cu.ctx_set_current(t->api.context);
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->head == t->tail && !t->stop)
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->head == t->tail)
            break;
        pending e = t->queue[t->head % PENDING_CAP];
        pthread_mutex_unlock(&t->lock);
        const cl_int status = wait_pending(t, &e);
        clSetUserEventStatus(e.landed, status);
        clReleaseEvent(e.landed);
        t->cu.event_destroy(e.done);
        pthread_mutex_lock(&t->lock);
        t->head++;
        pthread_cond_broadcast(&t->drained);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* Hands e to the helper thread (waiting while its queue is full). */
static void push_pending(nccl_transport *t, pending e)
{
    pthread_mutex_lock(&t->lock);
    while (t->tail - t->head == PENDING_CAP)
        pthread_cond_wait(&t->drained, &t->lock);
    t->queue[t->tail++ % PENDING_CAP] = e;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
}

/* Waits until the helper thread has seen every op through. */
static void wait_helper(nccl_transport *t)
{
    pthread_mutex_lock(&t->lock);
    while (t->head != t->tail)
        pthread_cond_wait(&t->drained, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

/* ---- staging, chunk by chunk (staging.h) ---- */

/* A reduce-scatter that exchanges the blocks, so that sum_parts sums them (see the top). */
static bool exchanges(const nccl_transport *t, int kind, size_t es)
{
    return kind == OP_REDUCE && (t->ce || es == 2);
}

static staging_layout layout_of(const llmcl_dist *d, int kind, size_t shard, size_t es)
{
    return staging_layout_of(d->world, shard, es, exchanges(nccl_of(d), kind, es),
                             d->opts.chunk_bytes, DIST_ALIGN, SHARED_PIECE_BYTES);
}

/* Copies block q's slice of chunk k between the op's buffer and staging: what is sent (slot 0)
   or what was received (slot 1). */
static llmcl_status copy_slice(llmcl_dist *d, const nccl_op *op, const shared_range *r,
                               const staging_layout *l, size_t k, int q, int slot, bool into_range)
{
    const size_t len = staging_chunk_len(l, k);
    const size_t slice = ((size_t)slot * (size_t)d->world + (size_t)q) * len * op->es;
    const size_t at = staging_chunk_at(l, k) + slice;
    const size_t off = op->buf_off + ((size_t)q * l->shard + k * l->per) * op->es;
    return shared_range_copy(d->ctx, r, at, op->buf, off, len * op->es, into_range);
}

/* Copies what op sends into staging: every block for NCCL's reduce-scatter; the other ranks'
   for an exchange, whose own part stays in the buffer, where sum_parts reads it (ncclAlltoAll's
   slice to this rank carries stale bytes that nothing reads); this rank's for a gather. */
static llmcl_status stage_in(llmcl_dist *d, const nccl_op *op, const shared_range *r,
                             const staging_layout *l)
{
    const bool all = op->kind == OP_REDUCE && !exchanges(nccl_of(d), op->kind, op->es);
    for (size_t k = 0; k < l->n; ++k)
        for (int q = 0; q < d->world; ++q)
            if (all || (q == d->rank) == (op->kind == OP_GATHER))
                LLMCL__TRY(copy_slice(d, op, r, l, k, q, 0, true));
    return LLMCL_OK;
}

/* Copies the other ranks' blocks that a gather brought into the buffer. */
static llmcl_status gather_out(llmcl_dist *d, const nccl_op *op, const shared_range *r,
                               const staging_layout *l)
{
    for (size_t k = 0; k < l->n; ++k)
        for (int q = 0; q < d->world; ++q)
            if (q != d->rank)
                LLMCL__TRY(copy_slice(d, op, r, l, k, q, 0, false));
    return LLMCL_OK;
}

/* rows x len elements of dt at byte at of r, which lie in one piece, as a tensor of rows. */
static llmcl_status wrap_staging(llmcl_dist *d, const shared_range *r, size_t at, llmcl_dtype dt,
                                 int64_t rows, int64_t len, llmcl_tensor **out)
{
    const shared_piece *p = r->piece;
    while (at >= p->at + p->bytes)
        ++p;
    const int64_t shape[2] = {rows, len}, strides[2] = {len, 1};
    return llmcl_tensor_wrap(d->ctx, p->mem, dt, 2, shape, strides,
                             (int64_t)((at - p->at) / llmcl_dtype_size(dt)), out);
}

/*
 * Sums chunk by chunk straight from staging into dst: for an exchange the P parts received, this
 * rank's own from its block of buf; for NCCL's reduce-scatter the sum it left in this rank's
 * slice.
 */
static llmcl_status nccl_sum_parts(llmcl_dist *d, int channel, const dist_group *g,
                                   const llmcl_tensor *buf, int64_t off, llmcl_tensor *dst,
                                   float beta)
{
    const nccl_op *op = &nccl_of(d)->op[OP_REDUCE][channel];
    const shared_range *r = &nccl_of(d)->staging[OP_REDUCE][channel];
    const bool ex = exchanges(nccl_of(d), OP_REDUCE, op->es);
    const staging_layout l = layout_of(d, OP_REDUCE, (size_t)g->shard, op->es);
    llmcl_status st = LLMCL_OK;
    for (size_t k = 0; k < l.n && st == LLMCL_OK; ++k) {
        const size_t len = staging_chunk_len(&l, k), at = staging_chunk_at(&l, k);
        const size_t slice = len * op->es, from = (size_t)(ex ? d->world : d->rank) * slice;
        const int64_t first = (int64_t)(k * l.per), n = (int64_t)len;
        llmcl_tensor *parts = NULL, *mine = NULL, *into = NULL;
        st = wrap_staging(d, r, at + from, buf->dtype, ex ? d->world : 1, n, &parts);
        if (st == LLMCL_OK) /* a view's offset counts from its buffer's start */
            st = llmcl__dist_view(dst, llmcl_tensor_offset(dst) + first, n, &into);
        if (st == LLMCL_OK && ex)
            st = llmcl__dist_view(buf, llmcl_tensor_offset(buf) + off + d->rank * g->shard + first,
                                  n, &mine);
        if (st == LLMCL_OK)
            st = ex ? llmcl_sum_rows_local(d->ctx, parts, d->rank, mine, beta, into)
                    : llmcl_sum_rows(d->ctx, parts, beta, into);
        llmcl_tensor_destroy(parts);
        llmcl_tensor_destroy(mine);
        llmcl_tensor_destroy(into);
    }
    return st;
}

/* ---- ops ---- */

static llmcl_status nccl_progress(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    if (atomic_load(&t->failed))
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "%s", t->failure);
    return LLMCL_OK;
}

/* Chunk k's exchange: ncclAlltoAll (NCCL 2.28), else a send and a receive for every rank. */
static int nccl_exchange(llmcl_dist *d, const nccl_op *op, CUdeviceptr s, size_t len)
{
    nccl_transport *t = nccl_of(d);
    const size_t slice = len * op->es;
    const CUdeviceptr recv = s + (CUdeviceptr)((size_t)d->world * slice);
    if (t->nc.all_to_all)
        return t->nc.all_to_all((void *)s, (void *)recv, len, op->type, t->comm, t->stream);
    int r = t->nc.group_start();
    for (int q = 0; q < d->world && r == NCCL_OK; ++q) {
        if (q == d->rank)
            continue; /* its own part stays in the buffer (stage_in) */
        const CUdeviceptr at = (CUdeviceptr)((size_t)q * slice);
        r = t->nc.send((void *)(s + at), len, op->type, q, t->comm, t->stream);
        if (r == NCCL_OK)
            r = t->nc.recv((void *)(recv + at), len, op->type, q, t->comm, t->stream);
    }
    const int end = t->nc.group_end();
    return r != NCCL_OK ? r : end;
}

/* The NCCL calls of op, a chunk each, in place in staging but for an exchange's receipts. */
static int nccl_calls(llmcl_dist *d, const nccl_op *op, const shared_range *r,
                      const staging_layout *l)
{
    nccl_transport *t = nccl_of(d);
    int nr = NCCL_OK;
    for (size_t k = 0; k < l->n && nr == NCCL_OK; ++k) {
        const size_t len = staging_chunk_len(l, k);
        const CUdeviceptr s = r->base + (CUdeviceptr)staging_chunk_at(l, k);
        const CUdeviceptr mine = s + (CUdeviceptr)((size_t)d->rank * len * op->es);
        if (op->kind == OP_GATHER)
            nr = t->nc.all_gather((void *)mine, (void *)s, len, op->type, t->comm, t->stream);
        else if (exchanges(t, op->kind, op->es))
            nr = nccl_exchange(d, op, s, len);
        else
            nr = t->nc.reduce_scatter((void *)s, (void *)mine, len, op->type, NCCL_SUM, t->comm,
                                      t->stream);
    }
    return nr;
}

/*
 * One op: copies into staging on the compute queue, the flag, then on the stream a wait for the
 * flag, the NCCL calls and an event, which the helper thread turns into op->landed.
 */
static llmcl_status start(llmcl_dist *d, int kind, int channel, int group,
                          const llmcl_tensor *buf, int64_t off)
{
    nccl_transport *t = nccl_of(d);
    LLMCL__TRY(nccl_progress(d));
    nccl_op *op = &t->op[kind][channel];
    const shared_range *s = &t->staging[kind][channel];
    const size_t shard = (size_t)d->groups[group].shard;
    const llmcl_dtype dt = buf->dtype;
    *op = (nccl_op){.group = -1, .kind = kind, .buf = buf->mem, .numel = shard * (size_t)d->world,
                    .es = llmcl_dtype_size(dt),
                    .type = dt == LLMCL_F32    ? NCCL_FLOAT32
                            : dt == LLMCL_BF16 ? NCCL_BFLOAT16
                                               : NCCL_FLOAT16};
    op->buf_off = (size_t)(buf->offset + off) * op->es;
    const staging_layout l = layout_of(d, kind, shard, op->es);
    LLMCL__TRY(stage_in(d, op, s, &l));
    const uint32_t seq = ++t->seq;
    LLMCL__CL(d->ctx, clEnqueueFillBuffer(d->ctx->queue, t->flag.piece[0].mem, &seq, sizeof seq,
                                          0, sizeof seq, 0, NULL, NULL));
    LLMCL__CL(d->ctx, clFlush(d->ctx->queue));
    cl_int err;
    cl_event landed = clCreateUserEvent(d->ctx->context, &err);
    LLMCL__CL(d->ctx, err);
    pending e = {.landed = landed, .since = now_s()};
    const bool issuing = issue_begin(t);
    if (!issuing || !enter(t)) {
        if (issuing)
            pthread_mutex_unlock(&t->issue);
        clSetUserEventStatus(landed, -1);
        clReleaseEvent(landed);
        return issuing ? LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed")
                       : nccl_progress(d);
    }
    CUresult r = t->cu.stream_wait_value32(t->stream, t->flag.base, seq, CU_STREAM_WAIT_VALUE_GEQ);
    const int nr = r == CUDA_OK ? nccl_calls(d, op, s, &l) : NCCL_OK;
    if (r == CUDA_OK && nr == NCCL_OK)
        r = t->cu.event_create(&e.done, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_OK && nr == NCCL_OK)
        r = t->cu.event_record(e.done, t->stream);
    leave(t);
    pthread_mutex_unlock(&t->issue);
    if (r != CUDA_OK || nr != NCCL_OK) {
        clSetUserEventStatus(landed, -1);
        clReleaseEvent(landed);
        return nr != NCCL_OK ? nccl_fail(d, kind == OP_REDUCE ? "the reduce-scatter's NCCL call"
                                                               : "ncclAllGather", nr)
                             : cuda_fail(d, "ordering an NCCL call", r);
    }
    clRetainEvent(landed); /* the helper's reference; op->landed is the compute queue's */
    push_pending(t, e);
    op->group = group;
    op->landed = landed;
    return LLMCL_OK;
}

static llmcl_status nccl_reduce_start(llmcl_dist *d, int channel, int group,
                                      const llmcl_tensor *buf, int64_t off)
{
    return start(d, OP_REDUCE, channel, group, buf, off);
}

/* dst_free needs no wait here: the copies into staging and the flag follow the kernels enqueued
   before, which include the ones that read the buffer. */
static llmcl_status nccl_gather_start(llmcl_dist *d, int channel, int group,
                                      const llmcl_tensor *buf, int64_t off, cl_event dst_free)
{
    (void)dst_free;
    return start(d, OP_GATHER, channel, group, buf, off);
}

static llmcl_status nccl_complete(llmcl_dist *d, int kind, int channel)
{
    nccl_transport *t = nccl_of(d);
    nccl_op *op = &t->op[kind][channel];
    if (op->group < 0)
        return LLMCL_OK;
    op->group = -1;
    const cl_int err = clEnqueueBarrierWithWaitList(d->ctx->queue, 1, &op->landed, NULL);
    llmcl__release_event(&op->landed);
    LLMCL__CL(d->ctx, err);
    LLMCL__TRY(nccl_progress(d));
    if (kind == OP_REDUCE)
        return LLMCL_OK; /* sum_parts reads the parts from staging */
    const staging_layout l = layout_of(d, kind, op->numel / (size_t)d->world, op->es);
    return gather_out(d, op, &t->staging[kind][channel], &l);
}

static int nccl_busy(const llmcl_dist *d, int kind, int channel)
{
    return nccl_of(d)->op[kind][channel].group;
}

/* Each piece of r as a symmetric window of its own (every rank registers the same ranges in the
   same order), so that NCCL runs the collectives on it with the copy engines. */
static llmcl_status register_windows(llmcl_dist *d, shared_range *r)
{
    nccl_transport *t = nccl_of(d);
    if (!issue_begin(t))
        return nccl_progress(d);
    const bool entered = enter(t);
    int nr = NCCL_OK;
    for (int i = 0; i < r->n && nr == NCCL_OK && entered; ++i)
        nr = t->nc.window_register(t->comm, (void *)(r->base + (CUdeviceptr)r->piece[i].at),
                                   r->piece[i].bytes, &r->piece[i].window,
                                   NCCL_WIN_COLL_SYMMETRIC);
    if (entered)
        leave(t);
    pthread_mutex_unlock(&t->issue);
    LLMCL__REQUIRE(d->ctx, entered, LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
    return nr == NCCL_OK ? LLMCL_OK : nccl_fail(d, "ncclCommWindowRegister", nr);
}

static void deregister_windows(nccl_transport *t, shared_range *r)
{
    const bool issuing = issue_begin(t), live = issuing && enter(t);
    for (int i = 0; i < r->n; ++i) {
        if (r->piece[i].window && live)
            t->nc.window_deregister(t->comm, r->piece[i].window);
        r->piece[i].window = NULL;
    }
    if (live)
        leave(t);
    if (issuing)
        pthread_mutex_unlock(&t->issue);
}

/* Staging for the largest group on every channel; the ranks agree before registering it. */
static llmcl_status nccl_setup(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    const size_t shard = (size_t)d->max_group / (size_t)d->world;
    const size_t es[2] = {llmcl_dtype_size(d->opts.reduce_dtype),
                          llmcl_dtype_size(d->opts.param_dtype)};
    llmcl_status st = LLMCL_OK;
    for (int k = 0; k < 2; ++k) {
        const staging_layout l = layout_of(d, k, shard, es[k]);
        for (int c = 0; c < DIST_SLOTS && st == LLMCL_OK; ++c) {
            st = shared_range_create(d->ctx, &t->api, staging_bytes(&l), &t->staging[k][c]);
            t->base.device_bytes += t->staging[k][c].bytes;
            t->op[k][c].group = -1;
        }
    }
    st = llmcl__dist_agree(d, st);
    for (int k = 0; k < 2 && t->ce; ++k)
        for (int c = 0; c < DIST_SLOTS && st == LLMCL_OK; ++c)
            st = register_windows(d, &t->staging[k][c]);
    return st;
}

/* Nothing may use the staging ranges once the compute queue and the stream are done. */
static void nccl_quiesce(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    clFinish(d->ctx->queue);
    wait_helper(t);
    if (enter(t)) {
        t->cu.stream_synchronize(t->stream);
        leave(t);
    }
}

static void nccl_release(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    for (int k = 0; k < 2; ++k)
        for (int c = 0; c < DIST_SLOTS; ++c) {
            llmcl__release_event(&t->op[k][c].landed);
            t->op[k][c].group = -1;
            deregister_windows(t, &t->staging[k][c]);
            shared_range_destroy(d->ctx, &t->api, &t->staging[k][c]);
        }
    t->base.device_bytes = t->flag.bytes;
}

/* The helper thread, the communicator, the flag, the stream and the libraries. */
static void teardown(llmcl_dist *d, nccl_transport *t)
{
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stop = true;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->thread, NULL);
        t->thread_started = false;
    }
    /* A communicator that failed was aborted already. */
    if (t->comm && !atomic_load(&t->failed) && enter(t)) {
        if (t->nc.comm_finalize && t->nc.comm_finalize(t->comm) == NCCL_OK)
            t->nc.comm_destroy(t->comm);
        else
            t->nc.comm_abort(t->comm);
        leave(t);
    }
    t->comm = NULL;
    if (t->flag.piece)
        shared_range_destroy(d->ctx, &t->api, &t->flag);
    if (t->stream && enter(t)) {
        t->cu.stream_destroy(t->stream);
        leave(t);
    }
    t->stream = NULL;
    if (t->api.context)
        t->cu.primary_release(t->api.device);
    t->api.context = NULL;
    if (t->nc.so)
        dlclose(t->nc.so);
    t->nc.so = NULL;
    llmcl__cuda_close(&t->cu);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->issue);
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->drained);
}

static void nccl_destroy(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    nccl_release(d);
    teardown(d, t);
    free(t);
    d->transport = NULL;
}

/* ncclReduceScatter and ncclAllGather in place on one range, back to back on the stream. */
static llmcl_status nccl_measure(llmcl_dist *d, uint64_t bytes, int reps, double *reduce_gbs,
                                 double *gather_gbs)
{
    nccl_transport *t = nccl_of(d);
    const size_t count = (size_t)(bytes / 4 / (uint64_t)d->world);
    shared_range b;
    /* a communicator that failed was aborted, and freed with it */
    llmcl_status st = nccl_progress(d);
    if (st == LLMCL_OK)
        st = shared_range_create(d->ctx, &t->api, (size_t)bytes, &b);
    const bool made = st == LLMCL_OK;
    const cl_int done = made ? clFinish(d->ctx->queue) : CL_SUCCESS;
    if (done != CL_SUCCESS)
        st = llmcl__fail_cl(d->ctx, done, "clFinish", __FILE__, __LINE__);
    /* a rank without its buffers or its communicator says so before the barriers that the others
       wait in */
    st = llmcl__dist_agree(d, st);
    if (st != LLMCL_OK) {
        if (made)
            shared_range_destroy(d->ctx, &t->api, &b);
        return st;
    }
    double secs[2] = {0.0, 0.0};
    int nr = NCCL_OK;
    const bool entered = enter(t);
    CUresult r = entered ? CUDA_OK : -1;
    const CUdeviceptr mine = b.base + (CUdeviceptr)((size_t)d->rank * count * 4);
    for (int k = 0; k < 2 && r == CUDA_OK && nr == NCCL_OK; ++k)
        for (int i = -1; i < reps && r == CUDA_OK && nr == NCCL_OK; ++i) {
            MPI_Barrier(d->comm);
            const double t0 = now_s();
            nr = k == 0 ? t->nc.reduce_scatter((void *)b.base, (void *)mine, count, NCCL_FLOAT32,
                                               NCCL_SUM, t->comm, t->stream)
                        : t->nc.all_gather((void *)mine, (void *)b.base, count, NCCL_FLOAT32,
                                           t->comm, t->stream);
            if (nr == NCCL_OK)
                r = t->cu.stream_synchronize(t->stream);
            if (i >= 0)
                secs[k] += now_s() - t0;
        }
    if (entered)
        leave(t);
    shared_range_destroy(d->ctx, &t->api, &b);
    if (nr != NCCL_OK)
        return nccl_fail(d, "timing NCCL", nr);
    if (r != CUDA_OK)
        return cuda_fail(d, "timing NCCL", r);
    const double moved = (double)count * 4.0 * d->world;
    *reduce_gbs = moved * reps / secs[0] * 1e-9;
    *gather_gbs = moved * reps / secs[1] * 1e-9;
    return LLMCL_OK;
}

static const dist_transport_ops nccl_ops = {
    .setup = nccl_setup,
    .busy = nccl_busy,
    .reduce_start = nccl_reduce_start,
    .gather_start = nccl_gather_start,
    .complete = nccl_complete,
    .sum_parts = nccl_sum_parts,
    .progress = nccl_progress,
    .quiesce = nccl_quiesce,
    .release = nccl_release,
    .destroy = nccl_destroy,
    .measure = nccl_measure,
};

/* ---- creation ---- */

/* An OpenCL extension function into fn (a function pointer). */
#define CL_EXT_FN(fn, platform, name)                                                             \
    do {                                                                                          \
        void *f_ = clGetExtensionFunctionAddressForPlatform((platform), (name));                  \
        memcpy(&(fn), &f_, sizeof f_);                                                            \
    } while (0)

/* OpenCL's side: an NVIDIA device that imports opaque file descriptors, and the entry points. */
static bool opencl_side(llmcl_dist *d, nccl_transport *t, char *why, size_t why_len)
{
    const llmcl_ctx *ctx = d->ctx;
    if (ctx->info.vendor_id != LLMCL_VENDOR_NVIDIA) {
        snprintf(why, why_len, "'%s' is not an NVIDIA GPU", ctx->info.name);
        return false;
    }
    char exts[8192] = "";
    clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, sizeof exts - 1, exts, NULL);
    if (!llmcl__has_extension(exts, "cl_khr_external_memory_opaque_fd")) {
        snprintf(why, why_len,
                 "'%s': the driver's OpenCL lacks cl_khr_external_memory_opaque_fd (it cannot "
                 "import memory that CUDA allocates)",
                 ctx->info.name);
        return false;
    }
    cl_platform_id platform;
    clGetDeviceInfo(ctx->device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    CL_EXT_FN(t->api.acquire, platform, "clEnqueueAcquireExternalMemObjectsKHR");
    CL_EXT_FN(t->api.release, platform, "clEnqueueReleaseExternalMemObjectsKHR");
    /* OpenCL 3.0's; looked up in the loaded ICD loader, so that older loaders still link. */
    void *loader = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *create = loader ? dlsym(loader, "clCreateBufferWithProperties") : NULL;
    memcpy(&t->api.create_buffer, &create, sizeof create);
    if (loader)
        dlclose(loader);
    if (!t->api.acquire || !t->api.release || !t->api.create_buffer) {
        snprintf(why, why_len,
                 "the OpenCL ICD loader or driver lacks clCreateBufferWithProperties or "
                 "clEnqueueAcquire/ReleaseExternalMemObjectsKHR");
        return false;
    }
    return true;
}

/* CUDA's side: the driver's functions, the device, its primary context and a stream. */
static bool cuda_side(llmcl_dist *d, nccl_transport *t, char *why, size_t why_len)
{
    llmcl__cuda *cu = &t->cu;
    if (!llmcl__cuda_open(cu, why, why_len))
        return false;
    if (!cu->primary_retain || !cu->primary_release || !cu->ctx_push || !cu->ctx_pop ||
        !cu->ctx_set_current || !cu->mem_granularity || !cu->mem_create || !cu->mem_release ||
        !cu->mem_export || !cu->mem_reserve || !cu->mem_free_address || !cu->mem_map ||
        !cu->mem_unmap || !cu->mem_set_access || !cu->stream_create || !cu->stream_destroy ||
        !cu->stream_synchronize || !cu->stream_wait_value32 || !cu->event_create ||
        !cu->event_destroy || !cu->event_record || !cu->event_query) {
        snprintf(why, why_len, "libcuda.so.1 lacks the virtual memory or stream functions "
                               "(a driver for CUDA 12 or later is needed)");
        return false;
    }
    t->api.cu = cu;
    t->api.device = llmcl__cuda_device_of(cu, d->ctx->device);
    if (t->api.device < 0) {
        snprintf(why, why_len, "no CUDA device has '%s''s PCI address", d->ctx->info.name);
        return false;
    }
    CUresult r = cu->primary_retain(&t->api.context, t->api.device);
    if (r != CUDA_OK) {
        t->api.context = NULL;
        snprintf(why, why_len, "cuDevicePrimaryCtxRetain: %s", llmcl__cuda_error(cu, r));
        return false;
    }
    const cu_mem_allocation_prop prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {CU_MEM_LOCATION_TYPE_DEVICE, t->api.device},
    };
    if (!enter(t)) {
        snprintf(why, why_len, "cuCtxPushCurrent failed");
        return false;
    }
    r = cu->mem_granularity(&t->api.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r == CUDA_OK)
        r = cu->stream_create(&t->stream, CU_STREAM_NON_BLOCKING);
    leave(t);
    if (r != CUDA_OK) {
        t->stream = NULL;
        snprintf(why, why_len, "CUDA (granularity, stream): %s", llmcl__cuda_error(cu, r));
        return false;
    }
    return true;
}

/* Everything this rank needs, the flag range (the import's test) included; why if not. */
static bool local_side(llmcl_dist *d, nccl_transport *t, char *why, size_t why_len)
{
    if (!nccl_load(&t->nc, why, why_len) || !opencl_side(d, t, why, why_len) ||
        !cuda_side(d, t, why, why_len))
        return false;
    t->ce = t->ce && t->nc.version >= NCCL_CE_VERSION && t->nc.comm_init_rank_config &&
            t->nc.window_register && t->nc.window_deregister && t->nc.all_to_all;
    if (shared_range_create(d->ctx, &t->api, t->api.granularity, &t->flag) == LLMCL_OK) {
        t->base.device_bytes = t->flag.bytes;
        return true;
    }
    snprintf(why, why_len, "sharing CUDA memory with OpenCL failed: %s", llmcl_last_error(d->ctx));
    return false;
}

/* What each rank tells the others. */
typedef struct rank_report {
    int ok, ce;
    int version; /* NCCL's, which picks the calls every rank must make alike */
    int pci[3]; /* domain, bus, device of its GPU */
    uint64_t host;
    char why[224];
} rank_report;

/* Whether every rank can run NCCL on a GPU of its own; the first reason against it in why. */
static llmcl_status all_sides(llmcl_dist *d, nccl_transport *t, bool ok, char *why,
                              size_t why_len)
{
    rank_report mine = {.ok = ok, .ce = t->ce, .version = ok ? t->nc.version : 0};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    mine.host = XXH64(host, strlen(host), 0);
    snprintf(mine.why, sizeof mine.why, "%s", ok ? "" : why);
    if (ok) {
        t->cu.device_attribute(&mine.pci[0], CU_ATTR_PCI_DOMAIN, t->api.device);
        t->cu.device_attribute(&mine.pci[1], CU_ATTR_PCI_BUS, t->api.device);
        t->cu.device_attribute(&mine.pci[2], CU_ATTR_PCI_DEVICE, t->api.device);
    }
    rank_report *all = calloc((size_t)d->world, sizeof *all);
    /* a rank without the table says so before the gather, which the others join */
    LLMCL__TRY(llmcl__dist_agree(
        d, all ? LLMCL_OK : LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "rank reports")));
    if (MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, d->comm) !=
        MPI_SUCCESS) {
        free(all);
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allgather of the ranks' NCCL support");
    }
    llmcl_status st = LLMCL_OK;
    for (int r = 0; r < d->world; ++r)
        t->ce = t->ce && all[r].ce && all[r].host == all[0].host;
    for (int r = 0; r < d->world && st == LLMCL_OK; ++r) {
        if (!all[r].ok) {
            snprintf(why, why_len, "rank %d: %s", r, all[r].why);
            st = LLMCL_ERROR_UNSUPPORTED;
        } else if (all[r].version != all[0].version && all[0].ok) {
            snprintf(why, why_len, "rank %d runs NCCL %d, rank 0 NCCL %d: every rank needs one "
                     "version (the calls it makes depend on it)", r, all[r].version,
                     all[0].version);
            st = LLMCL_ERROR_UNSUPPORTED;
        }
        for (int q = 0; q < r && st == LLMCL_OK; ++q)
            if (all[q].host == all[r].host && !memcmp(all[q].pci, all[r].pci, sizeof all[q].pci)) {
                snprintf(why, why_len,
                         "ranks %d and %d share the GPU at PCI %04x:%02x:%02x (NCCL needs a GPU "
                         "a rank: leave LLMCL_DEVICE unset or give each rank its own)",
                         q, r, all[r].pci[0], all[r].pci[1], all[r].pci[2]);
                st = LLMCL_ERROR_UNSUPPORTED;
            }
    }
    free(all);
    return st;
}

/* The communicator: rank 0's unique id to everyone, then ncclCommInitRank on every rank. */
static llmcl_status init_comm(llmcl_dist *d, nccl_transport *t, char *why, size_t why_len)
{
    struct {
        nccl_unique_id id;
        int status;
    } msg = {.status = NCCL_OK};
    if (d->rank == 0)
        msg.status = t->nc.get_unique_id(&msg.id);
    if (MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, d->comm) != MPI_SUCCESS)
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Bcast of NCCL's unique id");
    int r = msg.status;
    const bool entered = r == NCCL_OK && enter(t);
    /* NCCL's init waits for every rank: one that cannot enter its CUDA context says so first */
    const llmcl_status in = llmcl__dist_agree(
        d, r != NCCL_OK || entered
               ? LLMCL_OK
               : LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed"));
    if (in != LLMCL_OK) {
        if (entered)
            leave(t);
        return in;
    }
    if (r == NCCL_OK) {
        enum { UNDEF = INT_MIN }; /* NCCL_CONFIG_UNDEF_INT: NCCL's default */
        nccl_config config = {
            .size = sizeof config, .magic = 0xcafebeef, .version = NCCL_CE_VERSION,
            .blocking = UNDEF, .cga_cluster_size = UNDEF, .min_ctas = UNDEF, .max_ctas = UNDEF,
            .split_share = UNDEF, .traffic_class = UNDEF, .collnet_enable = UNDEF,
            .cta_policy = NCCL_CTA_POLICY_ZERO, .shrink_share = UNDEF, .nvls_ctas = UNDEF,
            .channels_per_net_peer = UNDEF, .nvlink_centric_sched = UNDEF};
        r = t->ce ? t->nc.comm_init_rank_config(&t->comm, d->world, msg.id, d->rank, &config)
                  : t->nc.comm_init_rank(&t->comm, d->world, msg.id, d->rank);
        leave(t);
    }
    llmcl_status st = LLMCL_OK;
    if (r != NCCL_OK) {
        t->comm = NULL;
        snprintf(why, why_len, "rank %d: %s: %s", d->rank,
                 msg.status != NCCL_OK ? "ncclGetUniqueId" : "ncclCommInitRank",
                 t->nc.error_string(r));
        st = LLMCL__FAIL(d->ctx, LLMCL_ERROR_UNSUPPORTED, "%s", why);
    }
    return llmcl__dist_agree(d, st);
}

static llmcl_status start_helper(llmcl_dist *d, nccl_transport *t)
{
    t->timeout_s = d->nccl_timeout_s;
    LLMCL__REQUIRE(d->ctx, pthread_create(&t->thread, NULL, helper_main, t) == 0,
                   LLMCL_ERROR_OUT_OF_HOST_MEMORY, "the NCCL transport's helper thread");
    t->thread_started = true;
    return LLMCL_OK;
}

llmcl_status llmcl__dist_nccl_create(llmcl_dist *d, char *why, size_t why_len)
{
    nccl_transport *t = calloc(1, sizeof *t);
    LLMCL__REQUIRE(d->ctx, t, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "NCCL transport");
    t->base.ops = &nccl_ops;
    t->base.kind = LLMCL_DIST_TRANSPORT_NCCL;
    const char *ce = llmcl__getenv("LLMCL_NCCL_CE"); /* checked by llmcl_dist_create */
    t->ce = !ce || strcmp(ce, "0") != 0;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->issue, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->drained, NULL);
    atomic_init(&t->failed, 0);
    d->transport = &t->base;
    why[0] = '\0';
    const bool ok = local_side(d, t, why, why_len);
    llmcl_status st = all_sides(d, t, ok, why, why_len);
    if (st == LLMCL_OK)
        st = init_comm(d, t, why, why_len);
    if (st == LLMCL_OK)
        st = llmcl__dist_agree(d, start_helper(d, t));
    if (st != LLMCL_OK) {
        if (st == LLMCL_ERROR_UNSUPPORTED)
            LLMCL__FAIL(d->ctx, st, "the NCCL transport cannot run: %s", why);
        teardown(d, t);
        free(t);
        d->transport = NULL;
        return st;
    }
    /* NVIDIA's OpenCL and NCCL run in two CUDA contexts, which the GPU time-slices: NCCL's
       kernels under the compute take turns with it, and spin through their turns while a peer
       computes (steps with them between the compute ran 5-39% faster). The copy engines do run
       beside the compute, but steps with them under it were still 0.5-2% slower
       (docs/PERFORMANCE.md). */
    t->base.overlaps = false;
    snprintf(d->transport_detail, sizeof d->transport_detail,
             "NCCL %d.%d.%d (%.140s), CUDA device %d, %s", t->nc.version / 10000,
             t->nc.version / 100 % 100, t->nc.version % 100, t->nc.path, t->api.device,
             t->ce ? "copy engines" : "kernels");
    return LLMCL_OK;
}
