/*
 * transport_nccl.c: the NCCL transport (transport.h) on NVIDIA GPUs. NVIDIA's OpenCL and CUDA
 * share device memory: a buffer that crosses ranks is allocated by CUDA's virtual memory API
 * (cuMemCreate, exportable as an opaque file descriptor), mapped for the rank's GPU, and imported
 * into OpenCL (cl_khr_external_memory_opaque_fd), so that OpenCL kernels and NCCL work on the same
 * bytes. libcuda.so.1 and libnccl.so.2 are loaded at run time; nothing here is needed to build.
 *
 * Ordering, with neither queue waiting for the host:
 *   - OpenCL -> NCCL: the compute queue writes a sequence number into a flag buffer after the
 *     kernels that produce an op's input (clEnqueueFillBuffer), and the op's CUDA stream waits on
 *     the device until the flag reaches it (cuStreamWaitValue32) before the NCCL call;
 *   - NCCL -> OpenCL: a CUDA event is recorded after the call, and a helper thread of this
 *     transport completes an OpenCL user event once it has; complete() makes the compute queue
 *     wait for that user event. CUDA's host functions may not call into the driver, which
 *     NVIDIA's OpenCL does, so the user event is completed from the helper thread.
 * The helper thread polls the events in issue order (one stream: they complete in that order),
 * and watches NCCL: an asynchronous error, or an op that takes longer than LLMCL_NCCL_TIMEOUT
 * seconds (default 600), aborts the communicator, fails the user events (the compute queue is
 * released, its commands fail) and the next dist call reports it.
 *
 * Every NCCL call is made by the thread that calls llmcl_dist, in program order, the same on
 * every rank. The CUDA calls run in the device's primary CUDA context, pushed around each call so
 * that the application's current context is left alone.
 */
#undef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <CL/cl_ext.h>
#include <xxhash.h>

#include "../runtime/cuda_driver.h"
#include "transport.h"

/* ---- NCCL's API (nccl.h, 2.x), loaded at run time ---- */

typedef void *nccl_comm;
typedef struct nccl_unique_id {
    char internal[128];
} nccl_unique_id;
enum { NCCL_OK = 0, NCCL_IN_PROGRESS = 7 };
enum { NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };

typedef struct nccl_lib {
    void *so;
    char path[256];
    int version;
    int (*get_version)(int *);
    int (*get_unique_id)(nccl_unique_id *);
    int (*comm_init_rank)(nccl_comm *, int, nccl_unique_id, int);
    int (*comm_finalize)(nccl_comm);
    int (*comm_destroy)(nccl_comm);
    int (*comm_abort)(nccl_comm);
    int (*comm_async_error)(nccl_comm, int *);
    const char *(*error_string)(int);
    int (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
    int (*all_gather)(const void *, void *, size_t, int, nccl_comm, CUstream);
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
    if (!nc->get_version || !nc->get_unique_id || !nc->comm_init_rank || !nc->comm_destroy ||
        !nc->comm_abort || !nc->comm_async_error || !nc->error_string || !nc->reduce_scatter ||
        !nc->all_gather || nc->get_version(&nc->version) != NCCL_OK) {
        snprintf(why, why_len, "%s lacks NCCL 2's functions", nc->path);
        dlclose(nc->so);
        nc->so = NULL;
        return false;
    }
    return true;
}

static int nccl_type(llmcl_dtype dt)
{
    return dt == LLMCL_F32 ? NCCL_FLOAT32 : dt == LLMCL_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT16;
}

/* ---- the transport's state ---- */

/* Device memory of CUDA's, imported into OpenCL. */
typedef struct shared_buf {
    cl_mem mem;
    CUdeviceptr ptr;
    size_t bytes;
} shared_buf;

/* An op on a channel: the group in flight and the user event its result is ordered by. */
typedef struct nccl_op {
    int group; /* -1: idle */
    cl_event landed;
} nccl_op;

/* An op the helper thread waits for: its CUDA event and its user event (one reference each). */
typedef struct pending {
    CUevent done;
    cl_event landed;
    double since;
} pending;

#define PENDING_CAP 256

/*
 * NVIDIA's OpenCL (driver 580.159) faults inside clCreateBufferWithProperties when the imported
 * allocation is larger than this: 2.47 GB did on the H200, smaller ones import. alloc refuses
 * larger buffers with a message instead.
 */
#define IMPORT_MAX ((size_t)INT32_MAX)

typedef struct nccl_transport {
    dist_transport base;
    llmcl__cuda cu;
    nccl_lib nc;
    clEnqueueAcquireExternalMemObjectsKHR_fn acquire;
    clEnqueueReleaseExternalMemObjectsKHR_fn release;
    cl_mem (*create_buffer)(cl_context, const cl_mem_properties *, cl_mem_flags, size_t, void *,
                            cl_int *);
    int cu_device;
    CUcontext cu_ctx;
    CUstream stream;
    nccl_comm comm;
    size_t granularity;
    shared_buf flag;   /* the sequence number the compute queue has reached */
    uint32_t seq;
    shared_buf *bufs;  /* what alloc made */
    int n_bufs, cap_bufs;
    nccl_op reduce[DIST_SLOTS];
    nccl_op *gather;   /* a channel a group, at least DIST_SLOTS */
    int n_gather;
    double timeout_s;

    /* the helper thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake, drained;
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
    return t->cu.ctx_push(t->cu_ctx) == CUDA_OK;
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

/* Records the first failure and aborts the communicator, which ends NCCL's kernels. */
static void fail_async(nccl_transport *t, const char *fmt, const char *detail)
{
    if (atomic_exchange(&t->failed, 1))
        return;
    snprintf(t->failure, sizeof t->failure, fmt, detail);
    t->nc.comm_abort(t->comm);
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
            snprintf(s, sizeof s, "%.0f", t->timeout_s);
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
    t->cu.ctx_set_current(t->cu_ctx);
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

/* ---- shared memory ---- */

/* bytes (a multiple of the granularity) of CUDA memory on the rank's GPU, imported into OpenCL
   and acquired by the compute queue for the buffer's life. */
static llmcl_status share(llmcl_dist *d, size_t bytes, shared_buf *out)
{
    nccl_transport *t = nccl_of(d);
    llmcl__cuda *cu = &t->cu;
    memset(out, 0, sizeof *out);
    cu_mem_allocation_prop prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {CU_MEM_LOCATION_TYPE_DEVICE, t->cu_device},
    };
    const cu_mem_access_desc access = {{CU_MEM_LOCATION_TYPE_DEVICE, t->cu_device},
                                       CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h;
    int fd = -1;
    LLMCL__REQUIRE(d->ctx, enter(t), LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
    CUresult r = cu->mem_create(&h, bytes, &prop, 0);
    const char *what = "cuMemCreate";
    if (r == CUDA_OK) {
        r = cu->mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        what = "cuMemExportToShareableHandle";
        if (r == CUDA_OK && (r = cu->mem_reserve(&out->ptr, bytes, t->granularity, 0, 0)) != 0)
            what = "cuMemAddressReserve";
        if (r == CUDA_OK && (r = cu->mem_map(out->ptr, bytes, 0, h, 0)) != CUDA_OK)
            what = "cuMemMap";
        if (r == CUDA_OK && (r = cu->mem_set_access(out->ptr, bytes, &access, 1)) != CUDA_OK)
            what = "cuMemSetAccess";
        /* The mapping holds the memory from here on. */
        cu->mem_release(h);
    }
    leave(t);
    if (r != CUDA_OK) {
        if (out->ptr) {
            cu->mem_unmap(out->ptr, bytes);
            cu->mem_free_address(out->ptr, bytes);
        }
        if (fd >= 0)
            close(fd);
        if (r == 2) /* CUDA_ERROR_OUT_OF_MEMORY */
            return LLMCL__FAIL(d->ctx, LLMCL_ERROR_OUT_OF_DEVICE_MEMORY,
                               "%s of %zu bytes for NCCL: out of device memory", what, bytes);
        return cuda_fail(d, what, r);
    }
    out->bytes = bytes;
    /* On success the file descriptor belongs to OpenCL, as an import's does in CUDA and Vulkan. */
    const cl_mem_properties props[] = {CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR,
                                       (cl_mem_properties)fd, 0};
    cl_int err;
    out->mem = t->create_buffer(d->ctx->context, props, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err == CL_SUCCESS)
        err = t->acquire(d->ctx->queue, 1, &out->mem, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        if (out->mem)
            clReleaseMemObject(out->mem);
        else
            close(fd);
        cu->mem_unmap(out->ptr, bytes);
        cu->mem_free_address(out->ptr, bytes);
        memset(out, 0, sizeof *out);
        return llmcl__fail_cl(d->ctx, err,
                              "importing CUDA memory into OpenCL (clCreateBufferWithProperties, "
                              "clEnqueueAcquireExternalMemObjectsKHR)",
                              __FILE__, __LINE__);
    }
    return LLMCL_OK;
}

/* Gives the CUDA memory back, once its cl_mem is released. */
static void unshare(nccl_transport *t, shared_buf *b)
{
    if (!b->ptr)
        return;
    t->cu.mem_unmap(b->ptr, b->bytes);
    t->cu.mem_free_address(b->ptr, b->bytes);
    memset(b, 0, sizeof *b);
}

static size_t round_up(size_t n, size_t unit)
{
    return (n + unit - 1) / unit * unit;
}

static llmcl_status nccl_alloc(llmcl_dist *d, llmcl_dtype dt, int64_t n, llmcl_tensor **out)
{
    nccl_transport *t = nccl_of(d);
    *out = NULL;
    if (t->n_bufs == t->cap_bufs) {
        const int cap = t->cap_bufs ? 2 * t->cap_bufs : 8;
        shared_buf *b = realloc(t->bufs, (size_t)cap * sizeof *b);
        LLMCL__REQUIRE(d->ctx, b, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "shared buffer table");
        t->bufs = b;
        t->cap_bufs = cap;
    }
    shared_buf *b = &t->bufs[t->n_bufs];
    const size_t bytes = round_up((size_t)n * llmcl_dtype_size(dt), t->granularity);
    LLMCL__REQUIRE(d->ctx, bytes <= IMPORT_MAX, LLMCL_ERROR_UNSUPPORTED,
                   "the NCCL transport needs a buffer of %zu bytes (%lld %s elements: a group's "
                   "parameters or gradients), more than the %zu bytes that NVIDIA's OpenCL can "
                   "import from CUDA: register smaller groups, or use LLMCL_DIST_TRANSPORT=mpi",
                   bytes, (long long)n, llmcl_dtype_name(dt), IMPORT_MAX);
    LLMCL__TRY(share(d, bytes, b));
    t->n_bufs++;
    /* Released by the tensor; the CUDA memory goes at release(). */
    LLMCL__TRY(llmcl__tensor_adopt(d->ctx, b->mem, bytes, dt, n, out));
    return llmcl_fill(d->ctx, *out, 0.0);
}

/* The device address of element off of t, a buffer alloc made. */
static CUdeviceptr address_of(const nccl_transport *t, const llmcl_tensor *buf, int64_t off)
{
    for (int i = 0; i < t->n_bufs; ++i)
        if (t->bufs[i].mem == buf->mem)
            return t->bufs[i].ptr +
                   (CUdeviceptr)((buf->offset + off) * (int64_t)llmcl_dtype_size(buf->dtype));
    return 0;
}

/* ---- ops ---- */

static nccl_op *op_of(const llmcl_dist *d, int kind, int channel)
{
    nccl_transport *t = nccl_of(d);
    return kind == OP_REDUCE ? &t->reduce[channel] : &t->gather[channel];
}

static llmcl_status nccl_progress(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    if (atomic_load(&t->failed))
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "%s", t->failure);
    return LLMCL_OK;
}

typedef struct nccl_call {
    int kind;
    CUdeviceptr buf; /* block 0 */
    size_t count;    /* elements of a block */
    int type;
} nccl_call;

/* One op: the stream waits for the compute queue's flag, runs the call and records its event;
   the helper thread turns the event into op->landed. */
static llmcl_status start(llmcl_dist *d, nccl_op *op, int group, const nccl_call *c)
{
    nccl_transport *t = nccl_of(d);
    LLMCL__TRY(nccl_progress(d));
    LLMCL__REQUIRE(d->ctx, c->buf, LLMCL_ERROR_INVALID_ARGUMENT,
                   "internal: a buffer the NCCL transport did not allocate");
    const uint32_t seq = ++t->seq;
    LLMCL__CL(d->ctx, clEnqueueFillBuffer(d->ctx->queue, t->flag.mem, &seq, sizeof seq, 0,
                                          sizeof seq, 0, NULL, NULL));
    LLMCL__CL(d->ctx, clFlush(d->ctx->queue));
    cl_int err;
    cl_event landed = clCreateUserEvent(d->ctx->context, &err);
    LLMCL__CL(d->ctx, err);
    pending e = {.landed = landed, .since = now_s()};
    const size_t es = c->type == NCCL_FLOAT32 ? 4 : 2;
    const CUdeviceptr mine = c->buf + (CUdeviceptr)((size_t)d->rank * c->count * es);
    LLMCL__REQUIRE(d->ctx, enter(t), LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
    CUresult r = t->cu.stream_wait_value32(t->stream, t->flag.ptr, seq, CU_STREAM_WAIT_VALUE_GEQ);
    int nr = NCCL_OK;
    if (r == CUDA_OK)
        nr = c->kind == OP_REDUCE
                 ? t->nc.reduce_scatter((void *)c->buf, (void *)mine, c->count, c->type, NCCL_SUM,
                                        t->comm, t->stream)
                 : t->nc.all_gather((void *)mine, (void *)c->buf, c->count, c->type, t->comm,
                                    t->stream);
    if (r == CUDA_OK && nr == NCCL_OK)
        r = t->cu.event_create(&e.done, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_OK && nr == NCCL_OK)
        r = t->cu.event_record(e.done, t->stream);
    leave(t);
    if (r != CUDA_OK || nr != NCCL_OK) {
        clSetUserEventStatus(landed, -1);
        clReleaseEvent(landed);
        return nr != NCCL_OK ? nccl_fail(d, c->kind == OP_REDUCE ? "ncclReduceScatter"
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
    const nccl_call c = {OP_REDUCE, address_of(nccl_of(d), buf, off),
                         (size_t)d->groups[group].shard, nccl_type(buf->dtype)};
    return start(d, &nccl_of(d)->reduce[channel], group, &c);
}

/* dst_free needs no wait here: the stream waits for the kernels enqueued before, which include
   the ones that read the buffer. */
static llmcl_status nccl_gather_start(llmcl_dist *d, int channel, int group,
                                      const llmcl_tensor *buf, int64_t off, cl_event dst_free)
{
    (void)dst_free;
    const nccl_call c = {OP_GATHER, address_of(nccl_of(d), buf, off),
                         (size_t)d->groups[group].shard, nccl_type(buf->dtype)};
    return start(d, &nccl_of(d)->gather[channel], group, &c);
}

static llmcl_status nccl_complete(llmcl_dist *d, int kind, int channel)
{
    nccl_op *op = op_of(d, kind, channel);
    if (op->group < 0)
        return LLMCL_OK;
    op->group = -1;
    const cl_int err = clEnqueueBarrierWithWaitList(d->ctx->queue, 1, &op->landed, NULL);
    llmcl__release_event(&op->landed);
    LLMCL__CL(d->ctx, err);
    return nccl_progress(d);
}

static int nccl_channels(const llmcl_dist *d, int kind)
{
    return kind == OP_REDUCE ? DIST_SLOTS : nccl_of(d)->n_gather;
}

static int nccl_busy(const llmcl_dist *d, int kind, int channel)
{
    return op_of(d, kind, channel)->group;
}

static llmcl_status nccl_setup(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    t->n_gather = d->n_groups > DIST_SLOTS ? d->n_groups : DIST_SLOTS;
    t->gather = calloc((size_t)t->n_gather, sizeof *t->gather);
    LLMCL__REQUIRE(d->ctx, t->gather, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "gather channels");
    for (int k = 0; k < t->n_gather; ++k)
        t->gather[k].group = -1;
    for (int k = 0; k < DIST_SLOTS; ++k)
        t->reduce[k].group = -1;
    return LLMCL_OK;
}

/* The buffers may be freed once the compute queue and the stream are done with them. */
static void nccl_quiesce(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    for (int i = 0; i < t->n_bufs; ++i)
        t->release(d->ctx->queue, 1, &t->bufs[i].mem, 0, NULL, NULL);
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
    for (int i = 0; i < t->n_bufs; ++i)
        unshare(t, &t->bufs[i]);
    t->n_bufs = 0;
    for (int k = 0; t->gather && k < t->n_gather; ++k)
        llmcl__release_event(&t->gather[k].landed);
    for (int k = 0; k < DIST_SLOTS; ++k)
        llmcl__release_event(&t->reduce[k].landed);
    free(t->gather);
    t->gather = NULL;
    t->n_gather = 0;
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
    if (t->flag.mem) {
        t->release(d->ctx->queue, 1, &t->flag.mem, 0, NULL, NULL);
        clFinish(d->ctx->queue);
        llmcl__buffer_free(d->ctx, t->flag.mem, t->flag.bytes);
        unshare(t, &t->flag);
    }
    if (t->stream && enter(t)) {
        t->cu.stream_destroy(t->stream);
        leave(t);
    }
    t->stream = NULL;
    if (t->cu_ctx)
        t->cu.primary_release(t->cu_device);
    t->cu_ctx = NULL;
    if (t->nc.so)
        dlclose(t->nc.so);
    t->nc.so = NULL;
    llmcl__cuda_close(&t->cu);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->drained);
}

static void nccl_destroy(llmcl_dist *d)
{
    nccl_transport *t = nccl_of(d);
    nccl_release(d);
    teardown(d, t);
    free(t->bufs);
    free(t);
    d->transport = NULL;
}

/* ncclReduceScatter and ncclAllGather in place on one buffer, back to back on the stream. */
static llmcl_status nccl_measure(llmcl_dist *d, uint64_t bytes, int reps, double *reduce_gbs,
                                 double *gather_gbs)
{
    nccl_transport *t = nccl_of(d);
    const size_t count = (size_t)(bytes / 4 / (uint64_t)d->world);
    LLMCL__REQUIRE(d->ctx, round_up((size_t)bytes, t->granularity) <= IMPORT_MAX,
                   LLMCL_ERROR_UNSUPPORTED, "at most %zu bytes under NCCL", IMPORT_MAX);
    shared_buf b;
    LLMCL__TRY(share(d, round_up((size_t)bytes, t->granularity), &b));
    double secs[2] = {0.0, 0.0};
    int nr = NCCL_OK;
    const bool entered = enter(t);
    CUresult r = entered ? CUDA_OK : -1;
    const CUdeviceptr mine = b.ptr + (CUdeviceptr)((size_t)d->rank * count * 4);
    for (int k = 0; k < 2 && r == CUDA_OK && nr == NCCL_OK; ++k)
        for (int i = -1; i < reps && r == CUDA_OK && nr == NCCL_OK; ++i) {
            MPI_Barrier(d->comm);
            const double t0 = now_s();
            nr = k == 0 ? t->nc.reduce_scatter((void *)b.ptr, (void *)mine, count, NCCL_FLOAT32,
                                               NCCL_SUM, t->comm, t->stream)
                        : t->nc.all_gather((void *)mine, (void *)b.ptr, count, NCCL_FLOAT32,
                                           t->comm, t->stream);
            if (nr == NCCL_OK)
                r = t->cu.stream_synchronize(t->stream);
            if (i >= 0)
                secs[k] += now_s() - t0;
        }
    if (entered)
        leave(t);
    t->release(d->ctx->queue, 1, &b.mem, 0, NULL, NULL);
    clFinish(d->ctx->queue);
    clReleaseMemObject(b.mem);
    unshare(t, &b);
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
    .sums = true,
    .setup = nccl_setup,
    .alloc = nccl_alloc,
    .channels = nccl_channels,
    .busy = nccl_busy,
    .reduce_start = nccl_reduce_start,
    .gather_start = nccl_gather_start,
    .complete = nccl_complete,
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
    CL_EXT_FN(t->acquire, platform, "clEnqueueAcquireExternalMemObjectsKHR");
    CL_EXT_FN(t->release, platform, "clEnqueueReleaseExternalMemObjectsKHR");
    /* OpenCL 3.0's; looked up in the loaded ICD loader, so that older loaders still link. */
    void *loader = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *create = loader ? dlsym(loader, "clCreateBufferWithProperties") : NULL;
    memcpy(&t->create_buffer, &create, sizeof create);
    if (loader)
        dlclose(loader);
    if (!t->acquire || !t->release || !t->create_buffer) {
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
    t->cu_device = llmcl__cuda_device_of(cu, d->ctx->device);
    if (t->cu_device < 0) {
        snprintf(why, why_len, "no CUDA device has '%s''s PCI address", d->ctx->info.name);
        return false;
    }
    CUresult r = cu->primary_retain(&t->cu_ctx, t->cu_device);
    if (r != CUDA_OK) {
        t->cu_ctx = NULL;
        snprintf(why, why_len, "cuDevicePrimaryCtxRetain: %s", llmcl__cuda_error(cu, r));
        return false;
    }
    const cu_mem_allocation_prop prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {CU_MEM_LOCATION_TYPE_DEVICE, t->cu_device},
    };
    if (!enter(t)) {
        snprintf(why, why_len, "cuCtxPushCurrent failed");
        return false;
    }
    r = cu->mem_granularity(&t->granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
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

/* Everything this rank needs, the flag buffer (the import's test) included; why if not. */
static bool local_side(llmcl_dist *d, nccl_transport *t, char *why, size_t why_len)
{
    if (!nccl_load(&t->nc, why, why_len) || !opencl_side(d, t, why, why_len) ||
        !cuda_side(d, t, why, why_len))
        return false;
    const llmcl_status st = share(d, t->granularity, &t->flag);
    if (st == LLMCL_OK && llmcl__buffer_adopt(d->ctx, t->flag.bytes) == LLMCL_OK)
        return true;
    snprintf(why, why_len, "sharing CUDA memory with OpenCL failed: %s", llmcl_last_error(d->ctx));
    if (st == LLMCL_OK) {
        t->release(d->ctx->queue, 1, &t->flag.mem, 0, NULL, NULL);
        clFinish(d->ctx->queue);
        clReleaseMemObject(t->flag.mem);
        unshare(t, &t->flag);
    }
    return false;
}

/* What each rank tells the others. */
typedef struct rank_report {
    int ok;
    int pci[3]; /* domain, bus, device of its GPU */
    uint64_t host;
    char why[224];
} rank_report;

/* Whether every rank can run NCCL on a GPU of its own; the first reason against it in why. */
static llmcl_status all_sides(llmcl_dist *d, nccl_transport *t, bool ok, char *why,
                              size_t why_len)
{
    rank_report mine = {.ok = ok};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    mine.host = XXH64(host, strlen(host), 0);
    snprintf(mine.why, sizeof mine.why, "%s", ok ? "" : why);
    if (ok) {
        t->cu.device_attribute(&mine.pci[0], CU_ATTR_PCI_DOMAIN, t->cu_device);
        t->cu.device_attribute(&mine.pci[1], CU_ATTR_PCI_BUS, t->cu_device);
        t->cu.device_attribute(&mine.pci[2], CU_ATTR_PCI_DEVICE, t->cu_device);
    }
    rank_report *all = calloc((size_t)d->world, sizeof *all);
    LLMCL__REQUIRE(d->ctx, all, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "rank reports");
    if (MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, d->comm) !=
        MPI_SUCCESS) {
        free(all);
        return LLMCL__FAIL(d->ctx, LLMCL_ERROR_MPI, "MPI_Allgather of the ranks' NCCL support");
    }
    llmcl_status st = LLMCL_OK;
    for (int r = 0; r < d->world && st == LLMCL_OK; ++r) {
        if (!all[r].ok) {
            snprintf(why, why_len, "rank %d: %s", r, all[r].why);
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
    if (r == NCCL_OK) {
        if (!enter(t))
            return LLMCL__FAIL(d->ctx, LLMCL_ERROR_NCCL, "cuCtxPushCurrent failed");
        r = t->nc.comm_init_rank(&t->comm, d->world, msg.id, d->rank);
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
    const char *timeout = llmcl__getenv("LLMCL_NCCL_TIMEOUT");
    t->timeout_s = timeout ? atof(timeout) : 600.0;
    LLMCL__REQUIRE(d->ctx, t->timeout_s > 0.0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "LLMCL_NCCL_TIMEOUT=%s is not a positive number of seconds", timeout);
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
    pthread_mutex_init(&t->lock, NULL);
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
    t->base.granularity = t->granularity;
    snprintf(d->transport_detail, sizeof d->transport_detail,
             "NCCL %d.%d.%d (%.160s), CUDA device %d", t->nc.version / 10000,
             t->nc.version / 100 % 100, t->nc.version % 100, t->nc.path, t->cu_device);
    return LLMCL_OK;
}
