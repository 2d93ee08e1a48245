/*
 * optim.c: host launchers of optim.cl, llmcl_adamw_step and llmcl_grad_norm, and the accumulator
 * of squares (llmcl_sumsq) whose partials the norm's final sum adds in call order. Each launcher
 * validates every argument, groups the tensors by the buffers they view (one launch per group),
 * writes one table of all tensors into a device buffer created from host memory (no transfer
 * waits on the queue), builds every group's kernel, and only then enqueues.
 *
 * Tuning keys (dtype: the first tensor's param dtype for adamw, its grad dtype for grad_norm; shape
 * class: llmcl__shape_class of the call's element count): adamw and grad_norm, both WG, UNROLL
 * and GPC. One set per call keeps the chunking, and so the order in which grad_norm sums, the same
 * however the tensors group into buffers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../internal.h"

/* One tensor's operands, in the order of the table's first fields (optim.cl's T_PARAM ... T_V). */
enum { OP_PARAM, OP_MASTER, OP_GRAD, OP_M, OP_V, N_OPS };
enum { T_NUMEL = N_OPS, T_CHUNK, T_BASE, T_SLOT, T_DECAY, T_FIELDS };

static const char *const op_names[N_OPS] = {"param", "master", "grad", "m", "v"};

typedef struct entry {
    const llmcl_tensor *op[N_OPS]; /* NULL where absent */
    bool decay;
} entry;

/* The tensors that share their buffers and dtypes: one launch. */
typedef struct group {
    int lead;         /* the entry whose buffers and dtypes the group has */
    int first, count; /* its rows of the table */
    int64_t n_chunks;
    bool aligned; /* every offset a multiple of 4 elements */
    cl_kernel kernel;
} group;

typedef struct plan {
    llmcl__params p;
    int64_t chunk; /* elements: WG * UNROLL * 4 */
    size_t wg;
    long gpc;
    int n_groups, n_rows;
    group *groups;
    int64_t *table; /* T_FIELDS per non-empty tensor, group after group */
    int64_t total_chunks;
} plan;

static void plan_free(plan *pl)
{
    free(pl->groups);
    free(pl->table);
}

/* WG, UNROLL and GPC for the call: the given defaults, then the tuning database, then checks. */
static llmcl_status plan_params(llmcl_ctx *ctx, const char *key, llmcl_dtype dtype, int64_t numel,
                                long unroll_default, long gpc_default, plan *pl)
{
    const size_t max_wg = ctx->info.max_work_group_size;
    llmcl__param_set(&pl->p, "WG", max_wg < 256 ? (long)max_wg : 256);
    llmcl__param_set(&pl->p, "UNROLL", unroll_default);
    llmcl__param_set(&pl->p, "GPC", gpc_default);
    char cls[16];
    llmcl__shape_class(numel > 0 ? numel : 1, cls);
    llmcl__params_lookup(ctx, key, dtype, cls, &pl->p);
    const long wg = llmcl__param_get(&pl->p, "WG", 256);
    const long unroll = llmcl__param_get(&pl->p, "UNROLL", 4);
    pl->gpc = llmcl__param_get(&pl->p, "GPC", 0);
    LLMCL__REQUIRE(ctx, wg >= 1 && (size_t)wg <= ctx->info.max_work_group_size,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: tuned WG %ld is not in [1, %zu]", key, wg,
                   ctx->info.max_work_group_size);
    LLMCL__REQUIRE(ctx, unroll == 1 || unroll == 2 || unroll == 4 || unroll == 8,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: tuned UNROLL %ld is not 1, 2, 4 or 8", key,
                   unroll);
    LLMCL__REQUIRE(ctx, pl->gpc >= 0 && pl->gpc <= 64, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: tuned GPC %ld is not in [0, 64]", key, pl->gpc);
    pl->wg = (size_t)wg;
    pl->chunk = (int64_t)wg * unroll * 4;
    return LLMCL_OK;
}

/* Same buffers and dtypes for every operand: the two entries can share a launch. */
static bool same_buffers(const entry *a, const entry *b)
{
    for (int k = 0; k < N_OPS; ++k) {
        if (!a->op[k] != !b->op[k])
            return false;
        if (a->op[k] && (a->op[k]->mem != b->op[k]->mem || a->op[k]->dtype != b->op[k]->dtype))
            return false;
    }
    return true;
}

/* Where a tensor starts in the whole call. */
typedef struct call_pos {
    int64_t elem, chunk;
} call_pos;

/*
 * Groups the non-empty entries and writes the table: every tensor's offsets, numel, first chunk in
 * its group, and first element and first chunk in the call (which do not depend on the grouping).
 */

static llmcl_status plan_groups(llmcl_ctx *ctx, const entry *e, int n, plan *pl)
{
    int *group_of = malloc((size_t)n * sizeof *group_of);
    call_pos *pos = malloc((size_t)n * sizeof *pos);
    pl->groups = calloc((size_t)n, sizeof *pl->groups);
    pl->table = malloc((size_t)n * T_FIELDS * sizeof *pl->table);
    if (!group_of || !pos || !pl->groups || !pl->table) {
        free(group_of);
        free(pos);
        return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "optimizer tables for %d tensors", n);
    }
    call_pos at = {0, 0};
    for (int i = 0; i < n; ++i) {
        const int64_t numel = llmcl_tensor_numel(e[i].op[OP_GRAD]);
        pos[i] = at;
        at.elem += numel;
        at.chunk += llmcl__div_up(numel, pl->chunk);
        group_of[i] = -1;
        if (numel == 0)
            continue;
        int g = 0;
        while (g < pl->n_groups && !same_buffers(&e[pl->groups[g].lead], &e[i]))
            ++g;
        if (g == pl->n_groups)
            pl->groups[pl->n_groups++] = (group){.lead = i, .aligned = true};
        group_of[i] = g;
    }
    for (int g = 0; g < pl->n_groups; ++g) {
        group *gr = &pl->groups[g];
        gr->first = pl->n_rows;
        for (int i = gr->lead; i < n; ++i) {
            if (group_of[i] != g)
                continue;
            int64_t *row = pl->table + (size_t)pl->n_rows++ * T_FIELDS;
            for (int k = 0; k < N_OPS; ++k) {
                row[k] = e[i].op[k] ? e[i].op[k]->offset : 0;
                gr->aligned = gr->aligned && row[k] % 4 == 0;
            }
            row[T_NUMEL] = llmcl_tensor_numel(e[i].op[OP_GRAD]);
            row[T_CHUNK] = gr->n_chunks;
            row[T_BASE] = pos[i].elem;
            row[T_SLOT] = pos[i].chunk;
            row[T_DECAY] = e[i].decay;
            gr->n_chunks += llmcl__div_up(row[T_NUMEL], pl->chunk);
            gr->count++;
        }
    }
    pl->total_chunks = at.chunk;
    free(group_of);
    free(pos);
    return LLMCL_OK;
}

/* Passes of a loop that halves n down to 1 (a binary search, a work-group sum), with its exit. */
static int64_t halvings(int64_t n)
{
    int64_t passes = 1;
    for (int64_t x = 1; x < n; x *= 2)
        ++passes;
    return passes;
}

/*
 * The work-groups of a launch over n_chunks: one per chunk, or at most GPC per compute unit; and
 * where the device cuts loops short, enough that a group's chunks stay within the budget
 * (llmcl__loop_budget's count: a chunk's find_tensor search over the table, its UNROLL loops, the
 * tail's loop and grad_norm's work-group sum).
 */
static size_t plan_global(const llmcl_ctx *ctx, const plan *pl, int64_t n_chunks)
{
    const int64_t all = n_chunks > 0 ? n_chunks : 1;
    int64_t groups = all;
    const int64_t cap = (int64_t)ctx->info.compute_units * pl->gpc;
    if (pl->gpc > 0 && groups > cap)
        groups = cap;
    const int64_t budget = llmcl__loop_budget(ctx);
    if (budget != INT64_MAX) {
        const int64_t u = pl->chunk / (4 * (int64_t)pl->wg);
        const int64_t trip =
            1 + halvings(pl->n_rows) + 2 * (u + 1) + 4 * u + 1 + halvings((int64_t)pl->wg);
        const int64_t most = (budget - 1) / trip; /* chunks a group may take */
        if (llmcl__div_up(all, groups) > most)
            groups = llmcl__div_up(all, most);
    }
    return (size_t)groups * pl->wg;
}

/* The table (of at least one row) on the device, counted in the memory statistics. */
static uint64_t table_bytes(const plan *pl) { return (uint64_t)pl->n_rows * T_FIELDS * sizeof(int64_t); }

static llmcl_status table_upload(llmcl_ctx *ctx, const plan *pl, cl_mem *out)
{
    return llmcl__buffer_alloc_init(ctx, table_bytes(pl), pl->table, out);
}

/* ---- validation ---- */

/* One operand: on ctx, a dtype in mask, contiguous, and shaped like `like` when given. */
static llmcl_status check_operand(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                  unsigned mask, const llmcl_tensor *like, const char *like_name)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, t, name, mask, 0, LLMCL_MAX_DIMS));
    if (like)
        LLMCL__TRY(llmcl__check_same_shape(ctx, t, name, like, like_name));
    LLMCL__REQUIRE(ctx, llmcl_tensor_is_contiguous(t), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s must be contiguous", name);
    return LLMCL_OK;
}

/* The bytes a contiguous tensor covers, named for messages; writes: the op writes it. */
typedef struct span {
    cl_mem mem;
    uint64_t lo, hi;
    bool writes;
    char name[40];
} span;

static void span_add(span *s, int *n, const llmcl_tensor *t, bool writes, const char *name)
{
    const uint64_t es = llmcl_dtype_size(t->dtype);
    const uint64_t numel = (uint64_t)llmcl_tensor_numel(t);
    if (numel == 0)
        return;
    span *p = &s[(*n)++];
    p->mem = llmcl__root_mem(t);
    p->lo = llmcl__root_byte(t);
    p->hi = p->lo + numel * es;
    p->writes = writes;
    snprintf(p->name, sizeof p->name, "%s", name);
}

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->mem != y->mem)
        return (uintptr_t)x->mem < (uintptr_t)y->mem ? -1 : 1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/*
 * No span that is written overlaps another span. Sorted by buffer and start, a span overlaps an
 * earlier one exactly when it starts before the farthest end so far (of any earlier span if it is
 * written, of the written ones if it is only read).
 */
static llmcl_status check_spans(llmcl_ctx *ctx, span *s, int n)
{
    qsort(s, (size_t)n, sizeof *s, span_cmp);
    const span *far_all = NULL, *far_written = NULL;
    for (int i = 0; i < n; ++i) {
        if (i > 0 && s[i].mem != s[i - 1].mem)
            far_all = far_written = NULL;
        const span *hit = s[i].writes ? far_all : far_written;
        LLMCL__REQUIRE(ctx, !hit || hit->hi <= s[i].lo, LLMCL_ERROR_INVALID_ARGUMENT,
                       "%s overlaps %s", s[i].name, hit ? hit->name : "");
        if (!far_all || s[i].hi > far_all->hi)
            far_all = &s[i];
        if (s[i].writes && (!far_written || s[i].hi > far_written->hi))
            far_written = &s[i];
    }
    return LLMCL_OK;
}

/* ---- AdamW ---- */

/* The options with their defaults filled in, checked as torch.optim.AdamW checks them. */
static llmcl_status adamw_options(llmcl_ctx *ctx, const llmcl_adamw_opts *o, llmcl_adamw_opts *r)
{
    LLMCL__REQUIRE(ctx, o, LLMCL_ERROR_INVALID_ARGUMENT, "opts must not be NULL");
    *r = *o;
    r->beta1 = o->beta1 != 0.0f ? o->beta1 : 0.9f;
    r->beta2 = o->beta2 != 0.0f ? o->beta2 : 0.999f;
    r->eps = o->eps != 0.0f ? o->eps : 1e-8f;
    r->grad_scale = o->grad_scale != 0.0f ? o->grad_scale : 1.0f;
    LLMCL__REQUIRE(ctx, isfinite(r->lr) && r->lr >= 0.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "lr must be finite and >= 0 (%g)", (double)r->lr);
    LLMCL__REQUIRE(ctx, r->beta1 >= 0.0f && r->beta1 < 1.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "beta1 must be in [0, 1) (%g)", (double)r->beta1);
    LLMCL__REQUIRE(ctx, r->beta2 >= 0.0f && r->beta2 < 1.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "beta2 must be in [0, 1) (%g)", (double)r->beta2);
    LLMCL__REQUIRE(ctx, isfinite(r->eps) && r->eps > 0.0f, LLMCL_ERROR_INVALID_ARGUMENT,
                   "eps must be finite and > 0 (%g)", (double)r->eps);
    LLMCL__REQUIRE(ctx, isfinite(r->weight_decay) && r->weight_decay >= 0.0f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "weight_decay must be finite and >= 0 (%g)",
                   (double)r->weight_decay);
    LLMCL__REQUIRE(ctx, r->step >= 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "step must be >= 1 (%lld): it counts from 1", (long long)r->step);
    LLMCL__REQUIRE(ctx, isfinite(r->grad_scale) && r->grad_scale > 0.0f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "grad_scale must be finite and > 0 (%g)",
                   (double)r->grad_scale);
    LLMCL__REQUIRE(ctx, isfinite(r->max_grad_norm) && r->max_grad_norm >= 0.0f,
                   LLMCL_ERROR_INVALID_ARGUMENT, "max_grad_norm must be finite and >= 0 (%g)",
                   (double)r->max_grad_norm);
    LLMCL__REQUIRE(ctx, r->max_grad_norm == 0.0f || r->grad_norm, LLMCL_ERROR_INVALID_ARGUMENT,
                   "max_grad_norm %g needs opts->grad_norm (llmcl_grad_norm's output)",
                   (double)r->max_grad_norm);
    if (r->grad_norm) {
        LLMCL__TRY(check_operand(ctx, r->grad_norm, "opts->grad_norm", 1u << LLMCL_F32, NULL, NULL));
        LLMCL__REQUIRE(ctx, llmcl_tensor_numel(r->grad_norm) == 1, LLMCL_ERROR_SHAPE_MISMATCH,
                       "opts->grad_norm must have one element (it has %lld)",
                       (long long)llmcl_tensor_numel(r->grad_norm));
    }
    return LLMCL_OK;
}

/* Every tensor's operands, then no output overlapping anything else. */
static llmcl_status adamw_tensors(llmcl_ctx *ctx, const llmcl_adamw_tensor *ts, int count,
                                  const llmcl_tensor *grad_norm, entry *e)
{
    for (int i = 0; i < count; ++i) {
        const llmcl_adamw_tensor *t = &ts[i];
        char pn[40], name[40];
        snprintf(pn, sizeof pn, "tensors[%d].param", i);
        LLMCL__TRY(check_operand(ctx, t->param, pn, LLMCL__FLOAT_DTYPES, NULL, NULL));
        e[i] = (entry){.op = {t->param, t->master, t->grad, t->m, t->v}, .decay = !t->no_weight_decay};
        for (int k = OP_MASTER; k < N_OPS; ++k) {
            if (k == OP_MASTER && !t->master)
                continue;
            snprintf(name, sizeof name, "tensors[%d].%s", i, op_names[k]);
            const unsigned mask = k == OP_GRAD ? LLMCL__FLOAT_DTYPES : 1u << LLMCL_F32;
            LLMCL__TRY(check_operand(ctx, e[i].op[k], name, mask, t->param, pn));
        }
    }
    span *s = malloc(((size_t)count * N_OPS + 1) * sizeof *s);
    LLMCL__REQUIRE(ctx, s, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "overlap check of %d tensors", count);
    int n = 0;
    for (int i = 0; i < count; ++i)
        for (int k = 0; k < N_OPS; ++k)
            if (e[i].op[k]) {
                char name[40];
                snprintf(name, sizeof name, "tensors[%d].%s", i, op_names[k]);
                span_add(s, &n, e[i].op[k], k != OP_GRAD, name);
            }
    if (grad_norm)
        span_add(s, &n, grad_norm, false, "opts->grad_norm");
    const llmcl_status st = check_spans(ctx, s, n);
    free(s);
    return st;
}

/* splitmix64's output function: the stochastic-rounding key of (seed, step). */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static llmcl_status adamw_kernel(llmcl_ctx *ctx, const plan *pl, const entry *lead, bool aligned,
                                 bool clip, cl_kernel *k)
{
    llmcl__defines d = {0};
    const llmcl_dtype pdt = lead->op[OP_PARAM]->dtype;
    llmcl__define_str(&d, "P_DT", llmcl__dtype_macro(pdt));
    llmcl__define_str(&d, "G_DT", llmcl__dtype_macro(lead->op[OP_GRAD]->dtype));
    if (lead->op[OP_MASTER])
        llmcl__define_flag(&d, "HAS_MASTER");
    else if (pdt != LLMCL_F32)
        llmcl__define_flag(&d, "STOCHASTIC");
    if (pdt == LLMCL_BF16)
        llmcl__define_flag(&d, "P_IS_BF16");
    if (clip)
        llmcl__define_flag(&d, "HAS_CLIP");
    if (aligned)
        llmcl__define_flag(&d, "ALIGNED");
    llmcl__params_define(&pl->p, &d);
    return llmcl__kernel(ctx, LLMCL_FAMILY_OPTIM, &d, "adamw", k);
}

static llmcl_status adamw_launch(llmcl_ctx *ctx, const plan *pl, const group *g, const entry *lead,
                                 cl_mem table, const llmcl_adamw_opts *o)
{
    const double b1 = o->beta1, b2 = o->beta2, lr = o->lr;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2 = 1.0 - pow(b2, (double)o->step);
    const llmcl_tensor *master = lead->op[OP_MASTER] ? lead->op[OP_MASTER] : lead->op[OP_PARAM];
    const bool clip = o->max_grad_norm > 0.0f;
    const cl_mem norm = clip ? o->grad_norm->mem : table;
    const cl_ulong sr_key = mix64(o->seed ^ mix64((uint64_t)o->step));

    llmcl__args a = llmcl__args_begin(ctx, g->kernel);
    llmcl__arg(&a, sizeof(cl_mem), &lead->op[OP_PARAM]->mem);
    llmcl__arg(&a, sizeof(cl_mem), &master->mem);
    for (int k = OP_GRAD; k < N_OPS; ++k)
        llmcl__arg(&a, sizeof(cl_mem), &lead->op[k]->mem);
    llmcl__arg(&a, sizeof(cl_mem), &table);
    llmcl__arg_i64(&a, (int64_t)g->first * T_FIELDS);
    llmcl__arg_i32(&a, g->count);
    llmcl__arg_i64(&a, g->n_chunks);
    llmcl__arg_f32(&a, (float)(1.0 - b1));
    llmcl__arg_f32(&a, o->beta2);
    llmcl__arg_f32(&a, (float)(1.0 - b2));
    llmcl__arg_f32(&a, (float)(-lr / bc1));
    llmcl__arg_f32(&a, (float)sqrt(bc2));
    llmcl__arg_f32(&a, o->eps);
    llmcl__arg_f32(&a, (float)(1.0 - lr * (double)o->weight_decay));
    llmcl__arg_f32(&a, o->grad_scale);
    llmcl__arg(&a, sizeof(cl_mem), &norm);
    llmcl__arg_i64(&a, clip ? o->grad_norm->offset : 0);
    llmcl__arg_f32(&a, o->max_grad_norm);
    llmcl__arg(&a, sizeof sr_key, &sr_key);
    const size_t global = plan_global(ctx, pl, g->n_chunks);
    return llmcl__launch(&a, 1, &global, &pl->wg);
}

llmcl_status llmcl_adamw_step(llmcl_ctx *ctx, const llmcl_adamw_tensor *tensors, int count,
                              const llmcl_adamw_opts *opts)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, count >= 1, LLMCL_ERROR_INVALID_ARGUMENT, "count must be >= 1 (%d)", count);
    LLMCL__REQUIRE(ctx, tensors, LLMCL_ERROR_INVALID_ARGUMENT, "tensors must not be NULL");
    llmcl_adamw_opts o = {0};
    LLMCL__TRY(adamw_options(ctx, opts, &o));
    entry *e = malloc((size_t)count * sizeof *e);
    LLMCL__REQUIRE(ctx, e, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "entries of %d tensors", count);
    plan pl = {0};
    cl_mem table = NULL;
    llmcl_status st;
    LLMCL__TRY_GOTO(st, adamw_tensors(ctx, tensors, count, o.grad_norm, e), done);
    int64_t numel = 0;
    for (int i = 0; i < count; ++i)
        numel += llmcl_tensor_numel(e[i].op[OP_PARAM]);
    /* One work-group per chunk: on PoCL 6 to 8 times faster than a grid-stride loop (llmcl-tune),
     * and NVIDIA's copy is fastest in one pass too (elementwise.c). */
    const long unroll = ctx->info.is_gpu ? 4 : 2;
    LLMCL__TRY_GOTO(st,
                    plan_params(ctx, LLMCL_KEY_ADAMW, e[0].op[OP_PARAM]->dtype, numel, unroll, 0,
                                &pl),
                    done);
    LLMCL__TRY_GOTO(st, plan_groups(ctx, e, count, &pl), done);
    for (int g = 0; g < pl.n_groups; ++g)
        LLMCL__TRY_GOTO(st,
                        adamw_kernel(ctx, &pl, &e[pl.groups[g].lead], pl.groups[g].aligned,
                                     o.max_grad_norm > 0.0f, &pl.groups[g].kernel),
                        done);
    if (pl.n_groups > 0)
        LLMCL__TRY_GOTO(st, table_upload(ctx, &pl, &table), done);
    for (int g = 0; g < pl.n_groups; ++g)
        LLMCL__TRY_GOTO(st, adamw_launch(ctx, &pl, &pl.groups[g], &e[pl.groups[g].lead], table, &o),
                        done);
done:
    if (table) /* OpenCL keeps the buffer alive until the kernels finish */
        llmcl__buffer_free(ctx, table, table_bytes(&pl));
    plan_free(&pl);
    free(e);
    return st;
}

/* ---- the accumulator of squares ---- */

llmcl_status llmcl_sumsq_create(llmcl_ctx *ctx, llmcl_sumsq **out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "sumsq: ctx must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "sumsq: out must not be NULL");
    *out = calloc(1, sizeof **out);
    LLMCL__REQUIRE(ctx, *out, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "sumsq accumulator");
    (*out)->ctx = ctx;
    return LLMCL_OK;
}

void llmcl_sumsq_destroy(llmcl_sumsq *s)
{
    if (!s)
        return;
    llmcl_tensor_destroy(s->slots);
    free(s);
}

void llmcl_sumsq_reset(llmcl_sumsq *s)
{
    if (s)
        s->used = 0;
}

llmcl_status llmcl__sumsq_check(llmcl_ctx *ctx, const llmcl_sumsq *s)
{
    LLMCL__REQUIRE(ctx, s->ctx == ctx, LLMCL_ERROR_INVALID_ARGUMENT,
                   "sumsq: the accumulator belongs to another context");
    return LLMCL_OK;
}

/* Storage for at least `need` partials, the `used` ones so far copied over (in queue order). */
static llmcl_status sumsq_grow(llmcl_sumsq *s, int64_t need)
{
    llmcl_ctx *ctx = s->ctx;
    const int64_t have = s->slots ? s->slots->shape[0] : 0;
    if (need <= have)
        return LLMCL_OK;
    int64_t cap = have > 4096 ? have : 4096;
    while (cap < need)
        cap *= 2;
    llmcl_tensor *grown = NULL, *from = NULL, *to = NULL;
    LLMCL__TRY(llmcl__scratch(ctx, LLMCL_F32, 1, &cap, "grad_norm partial sums", &grown));
    llmcl_status st = LLMCL_OK;
    if (s->used > 0) {
        st = llmcl_tensor_view(s->slots, 1, &s->used, NULL, 0, &from);
        if (st == LLMCL_OK)
            st = llmcl_tensor_view(grown, 1, &s->used, NULL, 0, &to);
        if (st == LLMCL_OK)
            st = llmcl_copy(ctx, from, to);
    }
    llmcl_tensor_destroy(from);
    llmcl_tensor_destroy(to);
    if (st != LLMCL_OK) {
        llmcl_tensor_destroy(grown);
        return st;
    }
    llmcl_tensor_destroy(s->slots); /* OpenCL keeps it until the copy is done */
    s->slots = grown;
    return LLMCL_OK;
}

llmcl_status llmcl__sumsq_reserve(llmcl_sumsq *s, int64_t n, int64_t *first)
{
    LLMCL__REQUIRE(s->ctx, n >= 0 && s->used <= INT64_MAX / 2 - n, LLMCL_ERROR_OVERFLOW,
                   "sumsq: %lld partial sums more overflow the accumulator", (long long)n);
    LLMCL__TRY(sumsq_grow(s, s->used + n));
    *first = s->used;
    s->used += n;
    return LLMCL_OK;
}

void llmcl__sumsq_release(llmcl_sumsq *s, int64_t first)
{
    if (first < s->used)
        s->used = first;
}

/* ---- global gradient norm ---- */

static llmcl_status norm_tensors(llmcl_ctx *ctx, const llmcl_tensor *const *grads, int count,
                                 const llmcl_tensor *out, entry *e)
{
    for (int i = 0; i < count; ++i) {
        char name[40];
        snprintf(name, sizeof name, "grads[%d]", i);
        LLMCL__TRY(check_operand(ctx, grads[i], name, LLMCL__FLOAT_DTYPES, NULL, NULL));
        e[i] = (entry){.op = {[OP_GRAD] = grads[i]}};
    }
    if (!out) /* partials only */
        return LLMCL_OK;
    LLMCL__TRY(check_operand(ctx, out, "out", 1u << LLMCL_F32, NULL, NULL));
    LLMCL__REQUIRE(ctx, llmcl_tensor_numel(out) == 1, LLMCL_ERROR_SHAPE_MISMATCH,
                   "out must have one element (it has %lld)", (long long)llmcl_tensor_numel(out));
    span *s = malloc(((size_t)count + 1) * sizeof *s);
    LLMCL__REQUIRE(ctx, s, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "overlap check of %d tensors", count);
    int n = 0;
    for (int i = 0; i < count; ++i) {
        char name[40];
        snprintf(name, sizeof name, "grads[%d]", i);
        span_add(s, &n, grads[i], false, name);
    }
    span_add(s, &n, out, true, "out");
    const llmcl_status st = check_spans(ctx, s, n);
    free(s);
    return st;
}

static llmcl_status norm_kernel(llmcl_ctx *ctx, const plan *pl, llmcl_dtype gdt, bool aligned,
                                const char *name, cl_kernel *k)
{
    llmcl__defines d = {0};
    llmcl__define_str(&d, "G_DT", llmcl__dtype_macro(gdt));
    if (aligned)
        llmcl__define_flag(&d, "ALIGNED");
    llmcl__params_define(&pl->p, &d);
    return llmcl__kernel(ctx, LLMCL_FAMILY_OPTIM, &d, name, k);
}

static llmcl_status norm_launch(llmcl_ctx *ctx, const plan *pl, const group *g, const entry *lead,
                                cl_mem table, const llmcl_tensor *partials)
{
    llmcl__args a = llmcl__args_begin(ctx, g->kernel);
    llmcl__arg(&a, sizeof(cl_mem), &lead->op[OP_GRAD]->mem);
    llmcl__arg(&a, sizeof(cl_mem), &table);
    llmcl__arg_i64(&a, (int64_t)g->first * T_FIELDS);
    llmcl__arg_i32(&a, g->count);
    llmcl__arg_i64(&a, g->n_chunks);
    llmcl__arg(&a, sizeof(cl_mem), &partials->mem);
    const size_t global = plan_global(ctx, pl, g->n_chunks);
    return llmcl__launch(&a, 1, &global, &pl->wg);
}

static llmcl_status norm_final(llmcl_ctx *ctx, const plan *pl, cl_kernel k,
                               const llmcl_sumsq *s, llmcl_tensor *out, int squared)
{
    /* one work-group's loop over every partial sum, then its sum */
    LLMCL__TRY(llmcl__check_loops(ctx,
                                  llmcl__div_up(s->used, (int64_t)pl->wg) + 1 +
                                      halvings((int64_t)pl->wg),
                                  "grad_norm: %lld partial sums", (long long)s->used));
    llmcl__args a = llmcl__args_begin(ctx, k);
    llmcl__arg(&a, sizeof(cl_mem), &s->slots->mem);
    llmcl__arg_i64(&a, s->used);
    llmcl__arg_tensor(&a, out);
    llmcl__arg_i32(&a, squared != 0);
    return llmcl__launch(&a, 1, &pl->wg, &pl->wg);
}

/* The checked entries and plan of a norm over grads (count may be 0), its kernels built. */
static llmcl_status norm_plan(llmcl_ctx *ctx, const llmcl_tensor *const *grads, int count,
                              const llmcl_tensor *out, entry *e, plan *pl, cl_kernel *final)
{
    LLMCL__TRY(norm_tensors(ctx, grads, count, out, e));
    int64_t numel = 0;
    for (int i = 0; i < count; ++i)
        numel += llmcl_tensor_numel(grads[i]);
    /* A grid-stride loop amortises the work-group reductions on CPUs (twice as fast on PoCL). */
    const bool nv = ctx->info.vendor_id == LLMCL_VENDOR_NVIDIA;
    const long gpc = ctx->info.is_gpu ? (nv ? 0 : 8) : 4;
    const llmcl_dtype dt = count > 0 ? grads[0]->dtype : LLMCL_F32;
    LLMCL__TRY(plan_params(ctx, LLMCL_KEY_GRAD_NORM, dt, numel, 4, gpc, pl));
    if (count > 0)
        LLMCL__TRY(plan_groups(ctx, e, count, pl));
    for (int g = 0; g < pl->n_groups; ++g)
        LLMCL__TRY(norm_kernel(ctx, pl, e[pl->groups[g].lead].op[OP_GRAD]->dtype,
                               pl->groups[g].aligned, "grad_norm_partial", &pl->groups[g].kernel));
    if (!final)
        return LLMCL_OK;
    /* any program has the final kernel: the first group's saves a build */
    const bool aligned = pl->n_groups && pl->groups[0].aligned;
    return norm_kernel(ctx, pl, pl->n_groups ? e[pl->groups[0].lead].op[OP_GRAD]->dtype : dt,
                       aligned, "grad_norm_final", final);
}

/* Every chunk's partial sum into s's slots from its end, in the call's chunk order. */
static llmcl_status norm_partials(llmcl_ctx *ctx, plan *pl, const entry *e, llmcl_sumsq *s)
{
    int64_t first;
    LLMCL__TRY(llmcl__sumsq_reserve(s, pl->total_chunks, &first));
    for (int r = 0; r < pl->n_rows; ++r)
        pl->table[(size_t)r * T_FIELDS + T_SLOT] += first;
    cl_mem table = NULL;
    llmcl_status st = LLMCL_OK;
    if (pl->n_groups > 0)
        st = table_upload(ctx, pl, &table);
    for (int g = 0; st == LLMCL_OK && g < pl->n_groups; ++g)
        st = norm_launch(ctx, pl, &pl->groups[g], &e[pl->groups[g].lead], table, s->slots);
    if (table)
        llmcl__buffer_free(ctx, table, table_bytes(pl));
    if (st != LLMCL_OK)
        llmcl__sumsq_release(s, first);
    return st;
}

/* The partials of grads (and, with out, their final sum over s's) as one call. */
static llmcl_status norm_run(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *const *grads,
                             int count, int squared, llmcl_tensor *out)
{
    entry *e = malloc(((size_t)count + 1) * sizeof *e);
    LLMCL__REQUIRE(ctx, e, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "entries of %d tensors", count);
    plan pl = {0};
    cl_kernel final = NULL;
    const int64_t before = s->used;
    llmcl_status st = norm_plan(ctx, grads, count, out, e, &pl, out ? &final : NULL);
    if (st == LLMCL_OK)
        st = norm_partials(ctx, &pl, e, s);
    if (st == LLMCL_OK && out) /* the final kernel takes a buffer even with no partials */
        st = sumsq_grow(s, 1);
    if (st == LLMCL_OK && out)
        st = norm_final(ctx, &pl, final, s, out, squared);
    if (st != LLMCL_OK)
        llmcl__sumsq_release(s, before);
    else if (out)
        s->used = 0;
    plan_free(&pl);
    free(e);
    return st;
}

llmcl_status llmcl__sumsq_fit(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *t)
{
    plan pl = {0};
    LLMCL__TRY(plan_params(ctx, LLMCL_KEY_GRAD_NORM, t->dtype, llmcl_tensor_numel(t), 4, 0, &pl));
    return sumsq_grow(s, s->used + llmcl__div_up(llmcl_tensor_numel(t), pl.chunk));
}

llmcl_status llmcl__sumsq_add(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *t)
{
    return norm_run(ctx, s, &t, 1, 0, NULL);
}

llmcl_status llmcl_grad_norm(llmcl_ctx *ctx, const llmcl_tensor *const *grads, int count,
                             int squared, llmcl_tensor *out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, count >= 1, LLMCL_ERROR_INVALID_ARGUMENT, "count must be >= 1 (%d)", count);
    LLMCL__REQUIRE(ctx, grads, LLMCL_ERROR_INVALID_ARGUMENT, "grads must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    llmcl_sumsq s = {.ctx = ctx};
    const llmcl_status st = norm_run(ctx, &s, grads, count, squared, out);
    llmcl_tensor_destroy(s.slots); /* OpenCL keeps it until the kernels are done */
    return st;
}

llmcl_status llmcl_grad_norm_sumsq(llmcl_ctx *ctx, llmcl_sumsq *s, const llmcl_tensor *const *grads,
                                   int count, int squared, llmcl_tensor *out)
{
    LLMCL__REQUIRE(NULL, ctx, LLMCL_ERROR_INVALID_ARGUMENT, "ctx must not be NULL");
    LLMCL__REQUIRE(ctx, s, LLMCL_ERROR_INVALID_ARGUMENT, "s must not be NULL");
    LLMCL__TRY(llmcl__sumsq_check(ctx, s));
    LLMCL__REQUIRE(ctx, count >= 0, LLMCL_ERROR_INVALID_ARGUMENT, "count must be >= 0 (%d)", count);
    LLMCL__REQUIRE(ctx, count == 0 || grads, LLMCL_ERROR_INVALID_ARGUMENT,
                   "grads must not be NULL");
    LLMCL__REQUIRE(ctx, out, LLMCL_ERROR_INVALID_ARGUMENT, "out must not be NULL");
    return norm_run(ctx, s, grads, count, squared, out);
}
