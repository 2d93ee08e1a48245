/*
 * internal.h: the runtime's private types and helpers, shared by src/runtime/ and the op launchers
 * in src/runtime/ops/. Nothing here is exported from libllmcl.
 */
#ifndef LLMCL_INTERNAL_H
#define LLMCL_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include "llmcl.h"

#define LLMCL__ERR_LEN 4096
#define LLMCL__EVENT_NAME_LEN 64

typedef struct llmcl__program llmcl__program;
typedef struct llmcl__tune_db llmcl__tune_db;

/* Scratch buffers a context keeps for reuse (llmcl_memory_stats). */
#define LLMCL__CACHE_SLOTS 32

struct llmcl_ctx {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
    llmcl_device_info info;
    bool queue_profiling;

    llmcl__program *programs; /* in-memory program cache, a list */
    char cache_dir[1024];     /* "" when the disk cache is off */
    bool cache_binaries;      /* LLMCL_CACHE_BINARIES: the folder keeps programs (else only its
                                 tuning files are read) */
    llmcl_cache_stats cache_stats;

    llmcl_memory_stats memory;
    struct {
        cl_mem mem;
        uint64_t bytes;
    } cache[LLMCL__CACHE_SLOTS]; /* freed scratch buffers, memory.cached_bytes in all */
    int n_cached;

    bool profiling;
    bool profile_names; /* the open region logs its kernels by name (LLMCL_LOG=3 at its begin) */
    cl_event *events;
    char (*event_names)[LLMCL__EVENT_NAME_LEN]; /* each event's kernel, where profile_names */
    size_t n_events, cap_events;

    llmcl__tune_db *tune_db;
    struct llmcl__tma *tma; /* where info.has_tma */

    char last_error[LLMCL__ERR_LEN];
    char *build_log; /* of the last failed build, malloc'd */
};

struct llmcl_tensor {
    llmcl_ctx *ctx;
    cl_mem mem;
    bool owns;         /* allocated by the library, counted in ctx->memory */
    bool scratch;      /* an op's temporary: its buffer goes to the context's cache */
    uint64_t capacity; /* bytes of mem */
    llmcl_dtype dtype;
    int ndim;
    int64_t shape[LLMCL_MAX_DIMS];
    int64_t strides[LLMCL_MAX_DIMS];
    int64_t offset;
    cl_mem root;       /* where mem is an application's sub-buffer, its parent; else NULL */
    uint64_t origin;   /* mem's first byte in root */
};

/* ---- errors ---- */

/* Records a formatted message on ctx (or the thread's slot when ctx is NULL) and returns status. */
llmcl_status llmcl__fail(const llmcl_ctx *ctx, llmcl_status status, const char *file, int line,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Maps an OpenCL error to a status (allocation failures become out-of-memory) and records it. */
llmcl_status llmcl__fail_cl(const llmcl_ctx *ctx, cl_int err, const char *expr, const char *file,
                            int line);

#define LLMCL__FAIL(ctx, status, ...) llmcl__fail((ctx), (status), __FILE__, __LINE__, __VA_ARGS__)

/* Returns an invalid-argument status (or the given one) when cond is false. */
#define LLMCL__REQUIRE(ctx, cond, status, ...)                                                    \
    do {                                                                                          \
        if (!(cond))                                                                              \
            return llmcl__fail((ctx), (status), __FILE__, __LINE__, __VA_ARGS__);                 \
    } while (0)

/* Runs an OpenCL call; on error records "#expr" and returns the mapped status. */
#define LLMCL__CL(ctx, expr)                                                                      \
    do {                                                                                          \
        cl_int llmcl__e = (expr);                                                                 \
        if (llmcl__e != CL_SUCCESS)                                                               \
            return llmcl__fail_cl((ctx), llmcl__e, #expr, __FILE__, __LINE__);                    \
    } while (0)

/* Propagates a failed status. */
#define LLMCL__TRY(expr)                                                                          \
    do {                                                                                          \
        llmcl_status llmcl__s = (expr);                                                           \
        if (llmcl__s != LLMCL_OK)                                                                 \
            return llmcl__s;                                                                      \
    } while (0)

/* Sets st and jumps to label on a failed status: for functions that must release resources. */
#define LLMCL__TRY_GOTO(st, expr, label)                                                          \
    do {                                                                                          \
        (st) = (expr);                                                                            \
        if ((st) != LLMCL_OK)                                                                     \
            goto label;                                                                           \
    } while (0)

/* ---- logging (LLMCL_LOG=1 prints to stderr; otherwise the library is silent) ---- */

bool llmcl__log_enabled(void);
/* LLMCL_LOG's level: 0 unset or "0", its number where it is one, else 1. */
int llmcl__log_level(void);
void llmcl__log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * src into dst[cap], cut to fit and always terminated: snprintf's "%s" without the cost of its
 * format parser, for what runs on every launch.
 */
static inline void llmcl__copy_text(char *dst, size_t cap, const char *src)
{
    const size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- files ---- */

/* The longest suffix llmcl__temp_path adds to a path, with its terminator. */
#define LLMCL__TEMP_SUFFIX_MAX 40

/*
 * path's temporary sibling for a write that is renamed into place, "<path>.tmp.<pid>.<n>" with n
 * counting the process's calls, so that writers of one path in other processes or threads never
 * share one; into out[cap], cut to fit.
 */
void llmcl__temp_path(char *out, size_t cap, const char *path);

/* ---- environment ---- */

/* The variable's value, or NULL when unset or empty. */
const char *llmcl__getenv(const char *name);

/*
 * The variable as a whole number in [lo, hi] (lo >= 0), with a binary unit (K, M or G, either
 * case) after it where `units`; *out keeps its value where the variable is unset, and *set (where
 * not NULL) says whether it was given. Anything else fails, naming the variable and what it should
 * be (`what`, e.g. "a count of MiB such as 1024"): "5x", "-1", or a value past hi once its unit is
 * applied.
 */
llmcl_status llmcl__env_int(llmcl_ctx *ctx, const char *name, int64_t lo, int64_t hi, bool units,
                            const char *what, int64_t *out, bool *set);

/* The variable as a positive, finite number, read whole as llmcl__env_int reads its own. */
llmcl_status llmcl__env_positive(llmcl_ctx *ctx, const char *name, const char *what, double *out,
                                 bool *set);

/* ---- device ---- */

llmcl_status llmcl__device_probe(llmcl_ctx *ctx, cl_platform_id platform, cl_device_id device,
                                 llmcl_device_info *info);

/* Whether the space-separated list exts names the extension name. */
bool llmcl__has_extension(const char *exts, const char *name);

/*
 * Loop budgets, for devices that cut long loops short (info.loop_limit: Mesa's llvmpipe). A
 * launcher counts the passes one work-item of its kernel makes through the ends of loops the way
 * such a device does (docs/PORTABILITY.md): every loop the work-item reaches adds its iterations
 * plus one, even one under a false condition, and nested loops add theirs each time they run.
 * Where the count passes the budget it splits the work, or refuses.
 */

/* The device's budget of loop passes for one work-item in one launch; INT64_MAX for no limit. */
int64_t llmcl__loop_budget(const llmcl_ctx *ctx);

/* LLMCL_ERROR_UNSUPPORTED naming what (printf-style), passes and the limit when passes exceed the
   budget; LLMCL_OK otherwise. */
llmcl_status llmcl__check_loops(llmcl_ctx *ctx, int64_t passes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- memory ---- */

/* Allocates a device buffer counted in ctx->memory; errors are reported as out of memory. */
llmcl_status llmcl__buffer_alloc(llmcl_ctx *ctx, uint64_t bytes, cl_mem *out);
void llmcl__buffer_free(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes);

/*
 * The same, holding a copy of bytes from init (at least 1 byte) taken at creation: small host
 * tables reach the device without a transfer on the queue, so nothing waits for it.
 */
llmcl_status llmcl__buffer_alloc_init(llmcl_ctx *ctx, uint64_t bytes, const void *init, cl_mem *out);

/*
 * Counts bytes of memory that another API allocated for this context's device (imported into
 * OpenCL) as in use, under the same limits; freed by llmcl__buffer_free.
 */
llmcl_status llmcl__buffer_adopt(llmcl_ctx *ctx, uint64_t bytes);

/* An owned 1-D tensor of n dt elements on mem (bytes of it), counted by llmcl__buffer_adopt. */
llmcl_status llmcl__tensor_adopt(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes, llmcl_dtype dt,
                                 int64_t n, llmcl_tensor **out);

/*
 * A scratch tensor for an op's temporaries, used on the context's queue only: its buffer comes
 * from the context's cache when one fits and goes back there when it is destroyed, so no view of
 * it may be used after that (the in-order queue runs what was enqueued before the next op that
 * takes the buffer). `what` names it in messages.
 */
llmcl_status llmcl__scratch(llmcl_ctx *ctx, llmcl_dtype dtype, int ndim, const int64_t *shape,
                            const char *what, llmcl_tensor **out);

/* A cached buffer of at least bytes (and at most an eighth more), counted as in use again;
   false: none. */
bool llmcl__cache_take(llmcl_ctx *ctx, uint64_t bytes, cl_mem *mem, uint64_t *got);

/* Keeps a freed scratch buffer for reuse; false (the caller frees it) when the cache is full. */
bool llmcl__cache_put(llmcl_ctx *ctx, cl_mem mem, uint64_t bytes);

/* Frees every cached buffer. */
void llmcl__cache_drain(llmcl_ctx *ctx);

/*
 * A pinned host buffer (CL_MEM_ALLOC_HOST_PTR), mapped once through queue for reading and writing;
 * not counted in ctx->memory (host memory). Failures are reported as out of host memory.
 * llmcl__pinned_free unmaps it, waits for queue and releases it.
 */
llmcl_status llmcl__pinned_alloc(llmcl_ctx *ctx, cl_command_queue queue, uint64_t bytes,
                                 cl_mem *mem, void **host);
void llmcl__pinned_free(cl_command_queue queue, cl_mem mem, void *host);

/* ---- kernel sources (embedded at build time; LLMCL_KERNEL_DIR overrides) ---- */

/* The source of family (an LLMCL_FAMILY_*) as program.c's family table assembles it: common.cl,
   the family's preludes, its own files. Caller frees *out. */
llmcl_status llmcl__kernel_source(llmcl_ctx *ctx, const char *family, char **out, size_t *len);

/* ---- build options: -D defines collected, then sorted into one string ---- */

#define LLMCL__MAX_DEFINES 48

typedef struct llmcl__defines {
    int n;
    char items[LLMCL__MAX_DEFINES][96]; /* "NAME=VALUE" or "NAME" */
} llmcl__defines;

void llmcl__define_int(llmcl__defines *d, const char *name, long long value);
void llmcl__define_str(llmcl__defines *d, const char *name, const char *value);
void llmcl__define_flag(llmcl__defines *d, const char *name);

/* The storage name a kernel expects for a dtype in DT macros: F32, BF16, F16, I32, I64. */
const char *llmcl__dtype_macro(llmcl_dtype dtype);

/* ---- programs and kernels (two-level cache) ---- */

/*
 * The kernel `name` of family built with the given defines, from the in-memory cache, the disk
 * cache or a fresh build. The kernel belongs to the cache; do not release it. Build failures return
 * LLMCL_ERROR_BUILD_FAILURE with the log in llmcl_build_log().
 */
llmcl_status llmcl__kernel(llmcl_ctx *ctx, const char *family, const llmcl__defines *defines,
                           const char *name, cl_kernel *out);

void llmcl__programs_release(llmcl_ctx *ctx);

/* ---- kernel arguments and launches ---- */

typedef struct llmcl__args {
    llmcl_ctx *ctx;
    cl_kernel kernel;
    cl_uint next;
    cl_int err;
    cl_uint err_index;
} llmcl__args;

llmcl__args llmcl__args_begin(llmcl_ctx *ctx, cl_kernel kernel);
void llmcl__arg(llmcl__args *a, size_t size, const void *value);
void llmcl__arg_local(llmcl__args *a, size_t bytes);
/* A tensor as two arguments: its buffer and its element offset (ulong). */
void llmcl__arg_tensor(llmcl__args *a, const llmcl_tensor *t);
/* A buffer and an element offset, as llmcl__arg_tensor passes a tensor (mem may be NULL). */
void llmcl__arg_mem(llmcl__args *a, cl_mem mem, int64_t off);
void llmcl__arg_i32(llmcl__args *a, int32_t v);
void llmcl__arg_i64(llmcl__args *a, int64_t v);
void llmcl__arg_f32(llmcl__args *a, float v);

/* wg within what the built kernel can run (its registers: CL_KERNEL_WORK_GROUP_SIZE) and the
   device allows, and at least 1. */
size_t llmcl__kernel_wg_cap(const llmcl_ctx *ctx, cl_kernel kernel, size_t wg);

/*
 * Enqueues the kernel once its arguments are set (reports the first failed argument by index).
 * global sizes are rounded up to multiples of local; local may be NULL. Records a profiling event
 * when a profile region is open.
 */
llmcl_status llmcl__launch(llmcl__args *a, cl_uint dims, const size_t *global, const size_t *local);

/* Keeps an event in the open profile region, with the name of what it timed (a kernel, a CLBlast
   call) where the region logs them; llmcl__launch calls it, and CLBlast's launcher. */
llmcl_status llmcl__record_event(llmcl_ctx *ctx, cl_event ev, const char *name);

/* ---- validation for op launchers ---- */

/* t non-NULL, on ctx, dtype allowed by mask (1u << dtype), ndim in [min_dim, max_dim]. */
llmcl_status llmcl__check_tensor(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                 unsigned dtype_mask, int min_dim, int max_dim);

/*
 * The shape as text, "[2, 3, 4]", for messages. llmcl__shape_text(t).s lives to the end of the full
 * expression, so a message argument formats it only when the message is raised: ops check their
 * shapes on every call, and formatting there was a measurable share of a launch's host time.
 */
typedef struct llmcl__shape_str {
    char s[96];
} llmcl__shape_str;
llmcl__shape_str llmcl__shape_text(const llmcl_tensor *t);
void llmcl__dims_text(int ndim, const int64_t *shape, char *buf, size_t len);

/* a and b have the same shape. */
llmcl_status llmcl__check_same_shape(llmcl_ctx *ctx, const llmcl_tensor *a, const char *an,
                                     const llmcl_tensor *b, const char *bn);

#define LLMCL__FLOAT_DTYPES ((1u << LLMCL_F32) | (1u << LLMCL_BF16) | (1u << LLMCL_F16))
#define LLMCL__INT_DTYPES ((1u << LLMCL_I32) | (1u << LLMCL_I64))
#define LLMCL__ALL_DTYPES (LLMCL__FLOAT_DTYPES | LLMCL__INT_DTYPES)

/*
 * The tensor as rows: all leading dimensions flattened into n_rows with one row stride, the last
 * dimension unit-stride of length row_len. Fails when the leading strides cannot be flattened.
 */
typedef struct llmcl__rows {
    int64_t n_rows, row_len, row_stride;
} llmcl__rows;

llmcl_status llmcl__as_rows(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                            llmcl__rows *out);

/* t checked as llmcl__check_tensor does (any rank), with n elements, contiguous. */
llmcl_status llmcl__check_vec(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                              unsigned dtype_mask, int64_t n);

/* grad an f32 tensor of ref's shape (a gradient output), seen as rows into *rows. */
llmcl_status llmcl__check_grad(llmcl_ctx *ctx, const llmcl_tensor *ref, const char *ref_name,
                               const llmcl_tensor *grad, const char *name, llmcl__rows *rows);

/*
 * Fails with the first out-of-range label where a kernel wrote its row into the int at index `at`
 * of stats (-1: none), naming the label's value; waits for the queue. The losses' message.
 */
llmcl_status llmcl__check_label_stat(llmcl_ctx *ctx, cl_mem stats, size_t at,
                                     const llmcl_tensor *labels, int64_t v, int64_t ignore);

/*
 * Tokens per chunk of a linear loss over n tokens (the cross-entropy's and the distillation's):
 * forced when > 0, else as many as budget holds at per_token bytes, in whole 128-token row tiles
 * of the products where it holds one or more (so that no chunk ends in a sliver of a tile);
 * always 1 to n.
 */
int64_t llmcl__chunk_tokens(int64_t n, int64_t forced, uint64_t budget, uint64_t per_token);

/* A 2-D view of rows [r0, r0 + rows) of t seen as the rows r. */
llmcl_status llmcl__rows_view(const llmcl_tensor *t, const llmcl__rows *r, int64_t r0,
                              int64_t rows, llmcl_tensor **out);

/* The first rows of a contiguous [*, cols] tensor (a scratch chunk) as a [rows, cols] view. */
llmcl_status llmcl__head_view(const llmcl_tensor *t, int64_t rows, int64_t cols,
                              llmcl_tensor **out);

/* The buffer that holds t's bytes, a sub-buffer's parent, and t's first byte in it: what overlap
   checks compare, so that two sub-buffers of one buffer meet where their bytes do. */
cl_mem llmcl__root_mem(const llmcl_tensor *t);
uint64_t llmcl__root_byte(const llmcl_tensor *t);

/* Whether two tensors may share an element: the same buffer, byte ranges that meet, and no period
   (one of a's strides) in which their elements keep apart. */
bool llmcl__overlaps(const llmcl_tensor *a, const llmcl_tensor *b);

/* Same buffer, offset, shape and strides: an exact in-place pairing. */
bool llmcl__same_view(const llmcl_tensor *a, const llmcl_tensor *b);

/* ---- NVIDIA: sm_90a programs and Hopper's TMA ---- */

/*
 * sm_90a's instructions are written in kernels as PTX comments behind this marker (mma.cl).
 * llmcl__nv_retarget_sm90a builds a program from ptx (a built program's llmcl__program_text) with
 * the target sm_90a and the markers removed; NULL where that fails.
 */
#define LLMCL__SM90A_MARKER "// @sm90a "
cl_program llmcl__nv_retarget_sm90a(cl_context context, cl_device_id device, const char *ptx);

/* The most registers (a multiple of 8, at most 255) that each of work_items work-items of one
   work-group holds on an NVIDIA multiprocessor: each of its four quarters holds a quarter of the
   65536 and every fourth warp, so 9 warps leave a lane what 12 would (168). */
unsigned llmcl__nv_item_registers(size_t work_items);

/* A built program's binary as NUL-terminated text (NVIDIA's is PTX), to free; NULL if none. */
char *llmcl__program_text(cl_program prog);

/*
 * Hopper's TMA (nv_tma.c): tensor-map templates for 2-D copies of bf16, f16 or f32 elements in
 * wgmma's 128-byte swizzle with zeros outside, encoded once by the CUDA driver, or NULL where they
 * cannot be had (no libcuda.so.1, no CUDA device on the OpenCL device's PCI address, LLMCL_TMA=0).
 * A kernel sets a template's address, sizes, row stride and box (mma.cl's wg_tma_map).
 */
typedef struct llmcl__tma llmcl__tma;
llmcl__tma *llmcl__tma_open(cl_device_id device);
void llmcl__tma_close(llmcl__tma *t);
const uint64_t *llmcl__tma_template(const llmcl__tma *t, llmcl_dtype dt);

/* ---- matmul's seam: tensor-core products with an epilogue (ops/matmul.c, for cross_entropy.c) */

/* What a product's epilogue does with its f32 sums; a cross-entropy one is matmul.cl's MM_CE. */
typedef enum llmcl__mm_epilogue {
    LLMCL__MM_PLAIN = 0,      /* c = a b^T (+ bias) */
    LLMCL__MM_CE_FORWARD = 1, /* the fused cross-entropy forward's LSE partials, c not stored */
    LLMCL__MM_CE_BACKWARD = 2 /* its dlogits, into c */
} llmcl__mm_epilogue;

/*
 * The plan of a 16-bit rows x cols tensor-core product with this epilogue (bias: with a class
 * bias) on this device, before any tuning: its kernel ("mm_wgmma" or "mm_mma"; NULL where products
 * of dt do not run on tensor cores here, which llmcl__matmul_ce refuses, and the rest 0), its
 * default output tile bm x bn, how many tiles run at once (slots) and one tile's time a k-step in
 * the units of the device's other tiles: what a caller sizing products in whole waves needs.
 * mm_wgmma's tiles are those it runs (a cross-entropy epilogue other than a bias-free forward
 * keeps 128 x 256); mm_mma's are the large tiles it takes where they fill two waves (for smaller
 * outputs it runs 128 x 128, which the plan leaves out).
 */
typedef struct llmcl__mm_plan {
    const char *kernel;
    int64_t bm, bn, slots;
    double tile_time;
} llmcl__mm_plan;
llmcl__mm_plan llmcl__matmul_plan(const llmcl_ctx *ctx, llmcl_dtype dt, int64_t rows, int64_t cols,
                                  llmcl__mm_epilogue epilogue, bool bias);

/* Columns of one LSE partial of the forward cross-entropy epilogue (a warp's slice of a tile
   holds one or more). */
#define LLMCL__MM_CE_SLOT 64

/*
 * A cross-entropy epilogue of c = a b^T + bias for one vocabulary chunk (matmul.cl, MM_CE):
 * LLMCL__MM_CE_FORWARD writes part[(row * slots + col / LLMCL__MM_CE_SLOT) * 3 + {max, sum exp,
 * sum w x}] (slots = ceil(N / LLMCL__MM_CE_SLOT)) and each row's target logit to xyb[row];
 * LLMCL__MM_CE_BACKWARD writes the dlogits from coef (A, B, C, lse_p a row) into c. Labels and
 * weight are those of the whole vocabulary; v0 is the chunk's first class.
 */
typedef struct llmcl__mm_ce {
    llmcl__mm_epilogue epilogue;
    int flags;
    float cap;
    const llmcl_tensor *labels, *weight; /* weight: f32 [V] or NULL */
    int64_t v0, ignore_index;
    cl_mem stats, coef, part, xyb;
} llmcl__mm_ce;

/* The product with its cross-entropy epilogue, on the kernel that llmcl__matmul_plan names:
   a [M, K] and b [N, K] (16-bit, unit stride along K), bias [N] or NULL, c [M, N] in a's dtype
   (the backward; the forward ignores it). */
llmcl_status llmcl__matmul_ce(llmcl_ctx *ctx, const llmcl_tensor *a, const llmcl_tensor *b,
                              const llmcl_tensor *bias, llmcl_tensor *c, const llmcl__mm_ce *ce);

/* ---- cross_entropy's seam: the chunked linear form with a hook (for preference.c) ---- */

/*
 * The chunked linear cross-entropy (llmcl_linear_cross_entropy_forward's path, reduction none)
 * for losses whose rows' upstream gradients depend on other rows' cross-entropies (the preference
 * losses: a sequence's sum): per chunk of tokens, whole multiples of align rows, after the
 * logits and each row's LSE and cross-entropy (ce[row], f32, indexed by the call's row), the
 * hook writes the chunk's upstream gradients g[r0 .. r0 + rows); then the dlogits, dbias,
 * dhidden and dweight as that form writes them. Without gradients the hook gets g NULL and only
 * reads the chunk's cross-entropies. A bad label fails before the first chunk.
 */
typedef llmcl_status (*llmcl__ce_rows_hook)(void *user, const llmcl_tensor *ce, llmcl_tensor *g,
                                            int64_t r0, int64_t rows);
llmcl_status llmcl__linear_ce_hooked(llmcl_ctx *ctx, const llmcl_tensor *hidden,
                                     const llmcl_tensor *weight, const llmcl_tensor *bias,
                                     const llmcl_tensor *labels, const llmcl_ce_options *opts,
                                     int64_t align, llmcl__ce_rows_hook hook, void *user,
                                     llmcl_tensor *g, llmcl_tensor *dhidden,
                                     llmcl_tensor *dweight, llmcl_tensor *dbias);

/* ---- the accumulator of squares (optim.c) ---- */

struct llmcl_sumsq {
    llmcl_ctx *ctx;
    llmcl_tensor *slots; /* f32 partial sums, NULL until the first */
    int64_t used;        /* slots holding partials, in call order */
};

/* LLMCL_ERROR_INVALID_ARGUMENT where s belongs to another context. */
llmcl_status llmcl__sumsq_check(llmcl_ctx *ctx, const llmcl_sumsq *s);
/* n slots at s's end for a call's partials (*first the first one's index), storage grown as
   needed; llmcl__sumsq_release(s, *first) gives them back where the call fails. */
llmcl_status llmcl__sumsq_reserve(llmcl_sumsq *s, int64_t n, int64_t *first);
void llmcl__sumsq_release(llmcl_sumsq *s, int64_t first);
/* Storage in s for llmcl__sumsq_add's partials of t, so that the add cannot fail for want of it. */
llmcl_status llmcl__sumsq_fit(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *t);
/* The squares of contiguous t's elements, as partials appended to s. */
llmcl_status llmcl__sumsq_add(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *t);

/* ---- tuning parameters ---- */

#define LLMCL__MAX_PARAMS 12

typedef struct llmcl__params {
    int n;
    char names[LLMCL__MAX_PARAMS][32];
    long values[LLMCL__MAX_PARAMS];
} llmcl__params;

void llmcl__param_set(llmcl__params *p, const char *name, long value);
long llmcl__param_get(const llmcl__params *p, const char *name, long fallback);

/*
 * What a lookup found: whether an explicit llmcl_tune_override took part and whether a file's
 * entry did (a launcher may replace file entries that do not fit the shape with its defaults, but
 * must report overrides that do not fit: llmcl__params_lookup_overrides), and which of the
 * database's records holds the values in use for its key (db NULL: none is kept). Valid while
 * the launcher that made it runs.
 */
typedef struct llmcl__tune_lookup {
    bool overridden, tuned;
    llmcl__tune_db *db;
    size_t slot;
} llmcl__tune_lookup;

/*
 * Overrides the launcher's heuristic defaults in p with the tuning database's entry for
 * (device, kernel, dtype, shape_class), where one exists, and records the result as the values
 * in use for that key (llmcl_tune_params_get).
 */
llmcl__tune_lookup llmcl__params_lookup(llmcl_ctx *ctx, const char *kernel, llmcl_dtype dtype,
                                        const char *shape_class, llmcl__params *p);

/*
 * As llmcl__params_lookup with the llmcl_tune_override entries alone: a launcher whose looked-up
 * values do not fit the shape puts its defaults back into p and calls this, so that the files'
 * entries give way to the defaults while an override, whole or partial, still applies.
 */
llmcl__tune_lookup llmcl__params_lookup_overrides(llmcl_ctx *ctx, const char *kernel,
                                                  llmcl_dtype dtype, const char *shape_class,
                                                  llmcl__params *p);

/*
 * Records p as the values in use for lookup's key: a launcher that changes looked-up values
 * (clamps them to the shape, falls back to its defaults, settles a host-side tunable) calls it
 * once they are final, so that llmcl_tune_params_get reports what the launch really uses.
 */
void llmcl__params_record(const llmcl__tune_lookup *lookup, const llmcl__params *p);

/* A tuning shape class for a size key: "p<k>" for the smallest 2^k >= key (key >= 1). */
void llmcl__shape_class(int64_t key, char out[16]);

/* Adds every parameter as a -D define. */
void llmcl__params_define(const llmcl__params *p, llmcl__defines *d);

/* Smallest power of two >= x (x >= 1). */
size_t llmcl__pow2_ceil(size_t x);

/* Largest power of two <= x (x >= 1). */
size_t llmcl__pow2_floor(size_t x);

/* ceil(a / b) for positive b. */
static inline int64_t llmcl__div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Releases *ev if it is set and clears it. */
static inline void llmcl__release_event(cl_event *ev)
{
    if (*ev)
        clReleaseEvent(*ev);
    *ev = NULL;
}

#endif /* LLMCL_INTERNAL_H */
