/*
 * rope.c: the host side of rope.cl, llmcl_rope_forward and llmcl_rope_backward. Validates q, k and
 * the angle source (tables or positions), reads both tensors' dimensions through the layout as
 * (b, h, t, d) strides, picks the widest aligned vector width, and launches one kernel that rotates
 * the heads of q and k together.
 */
#include <math.h>
#include <stdio.h>

#include "../internal.h"

/* A q or k view read through the layout: sizes and element strides as (b, h, t, d). */
typedef struct rope_view {
    int64_t n[4];
    int64_t s[4];
} rope_view;

enum { RB, RH, RT, RD };

static rope_view rope_view_of(const llmcl_tensor *t, llmcl_rope_layout layout)
{
    /* axis of the tensor holding b, h, t, d */
    static const int axes[2][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}};
    rope_view v;
    for (int i = 0; i < 4; ++i) {
        v.n[i] = t->shape[axes[layout][i]];
        v.s[i] = t->strides[axes[layout][i]];
    }
    return v;
}

/*
 * Whether a written view maps distinct indices to distinct elements (a sufficient test): taken by
 * increasing stride, each stride reaches past everything the smaller dimensions span.
 */
static bool rope_no_self_overlap(const rope_view *v)
{
    for (int i = 0; i < 4; ++i)
        if (v->n[i] == 0)
            return true; /* empty: nothing is written */
    int order[4] = {0, 1, 2, 3};
    for (int i = 1; i < 4; ++i)
        for (int j = i; j > 0 && v->s[order[j]] < v->s[order[j - 1]]; --j) {
            const int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int64_t extent = 1;
    for (int i = 0; i < 4; ++i) {
        const int a = order[i];
        if (v->n[a] <= 1)
            continue;
        if (v->s[a] < extent)
            return false;
        extent += v->s[a] * (v->n[a] - 1);
    }
    return true;
}

/*
 * Whether q and k, on one buffer, are disjoint sets of heads of one packed view: the same
 * strides, offsets a whole number of head strides apart, head ranges that do not meet, and all
 * heads fitting inside every larger stride (so a head range never spills into another token or
 * batch). A packed QKV projection's q and k views pass; anything less regular is refused.
 */
static bool rope_disjoint_heads(const llmcl_tensor *q, const rope_view *vq, const llmcl_tensor *k,
                                const rope_view *vk)
{
    for (int i = 0; i < 4; ++i)
        if (vq->s[i] != vk->s[i])
            return false;
    const int64_t sh = vq->s[RH], diff = k->offset - q->offset;
    if (sh <= 0 || diff % sh != 0)
        return false;
    const int64_t k0 = diff / sh;
    if (!(k0 >= vq->n[RH] || k0 + vk->n[RH] <= 0))
        return false;
    const int64_t lo = k0 < 0 ? k0 : 0;
    const int64_t hi = k0 + vk->n[RH] > vq->n[RH] ? k0 + vk->n[RH] : vq->n[RH];
    for (int i = 0; i < 4; ++i) {
        if (i == RH || vq->n[i] <= 1)
            continue;
        if (vq->s[i] > sh && vq->s[i] < (hi - lo) * sh)
            return false;
        if (vq->s[i] < sh && vq->s[i] * vq->n[i] > sh)
            return false;
    }
    return true;
}

static llmcl_status check_table(llmcl_ctx *ctx, const llmcl_tensor *t, const char *name,
                                const rope_view *vq, int64_t pairs)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, t, name, 1u << LLMCL_F32, 2, 3));
    const int nd = t->ndim;
    LLMCL__REQUIRE(ctx,
                   t->shape[nd - 1] == pairs && t->shape[nd - 2] == vq->n[RT] &&
                       (nd == 2 || t->shape[0] == vq->n[RB]),
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s is %s; expected [T, rotary_dim/2] = [%lld, %lld] or [B, T, rotary_dim/2] = "
                   "[%lld, %lld, %lld]",
                   name, llmcl__shape_text(t).s, (long long)vq->n[RT], (long long)pairs, (long long)vq->n[RB],
                   (long long)vq->n[RT], (long long)pairs);
    LLMCL__REQUIRE(ctx, t->strides[nd - 1] == 1 || pairs == 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: the last dimension must be unit-stride (stride %lld)", name,
                   (long long)t->strides[nd - 1]);
    return LLMCL_OK;
}

/* Everything about one call that the launch needs, gathered by validation. */
typedef struct rope_call {
    rope_view vq, vk;
    int64_t pairs;
    bool tables;
    float theta, l3[6]; /* factor, low, high, original, low wavelength, high wavelength */
} rope_call;

/* A view q or k as the kernel walks it: D unit-stride, and no two elements at one address. */
static llmcl_status check_view(llmcl_ctx *ctx, const rope_view *v, const char *name)
{
    LLMCL__REQUIRE(ctx, v->s[RD] == 1 || v->n[RD] == 1, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: the D dimension must be unit-stride (stride %lld)", name,
                   (long long)v->s[RD]);
    LLMCL__REQUIRE(ctx, rope_no_self_overlap(v), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: its strides map several elements to one (it is written in place)", name);
    return LLMCL_OK;
}

/* k beside q: q's dtype, B, T and D, its own heads (distinct from q's where they share memory). */
static llmcl_status check_k(llmcl_ctx *ctx, const llmcl_tensor *q, const char *qn,
                            const llmcl_tensor *k, const char *kn, const llmcl_rope_options *o,
                            rope_call *c)
{
    const char *layout_name = o->layout == LLMCL_ROPE_BHTD ? "[B, H, T, D]" : "[B, T, H, D]";
    LLMCL__TRY(llmcl__check_tensor(ctx, k, kn, LLMCL__FLOAT_DTYPES, 4, 4));
    LLMCL__REQUIRE(ctx, k->dtype == q->dtype, LLMCL_ERROR_UNSUPPORTED_DTYPE,
                   "%s is %s but %s is %s: they must share a dtype", kn,
                   llmcl_dtype_name(k->dtype), qn, llmcl_dtype_name(q->dtype));
    c->vk = rope_view_of(k, o->layout);
    LLMCL__REQUIRE(ctx,
                   c->vk.n[RB] == c->vq.n[RB] && c->vk.n[RT] == c->vq.n[RT] &&
                       c->vk.n[RD] == c->vq.n[RD],
                   LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s %s and %s %s read as %s differ in B, T or D (only H may differ)", qn,
                   llmcl__shape_text(q).s, kn, llmcl__shape_text(k).s, layout_name);
    LLMCL__TRY(check_view(ctx, &c->vk, kn));
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(q, k) || rope_disjoint_heads(q, &c->vq, k, &c->vk),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s and %s overlap: they must be distinct heads (e.g. of a packed QKV view)", qn,
                   kn);
    return LLMCL_OK;
}

/* The cos and sin tables: both, of one shape and strides, clear of q and k. */
static llmcl_status check_tables(llmcl_ctx *ctx, const char *fn, const llmcl_tensor *q,
                                 const char *qn, const llmcl_tensor *k, const char *kn,
                                 const llmcl_rope_options *o, const rope_call *c)
{
    LLMCL__REQUIRE(ctx, o->cos && o->sin, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: opt->%s is set but opt->%s is NULL: pass both tables", fn,
                   o->cos ? "cos" : "sin", o->cos ? "sin" : "cos");
    LLMCL__REQUIRE(ctx, !o->positions, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: pass either cos/sin tables or positions, not both", fn);
    LLMCL__TRY(check_table(ctx, o->cos, "opt->cos", &c->vq, c->pairs));
    LLMCL__TRY(check_table(ctx, o->sin, "opt->sin", &c->vq, c->pairs));
    const llmcl_tensor *ct = o->cos, *st = o->sin;
    LLMCL__REQUIRE(ctx, ct->ndim == st->ndim, LLMCL_ERROR_SHAPE_MISMATCH,
                   "%s: opt->cos and opt->sin differ in shape", fn);
    LLMCL__REQUIRE(ctx,
                   ct->strides[ct->ndim - 2] == st->strides[st->ndim - 2] &&
                       (ct->ndim == 2 || ct->shape[0] <= 1 || ct->strides[0] == st->strides[0]),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: opt->cos and opt->sin must have the same strides", fn);
    const llmcl_tensor *tabs[2] = {o->cos, o->sin};
    for (int i = 0; i < 2; ++i)
        LLMCL__REQUIRE(ctx, !llmcl__overlaps(tabs[i], q) && (!k || !llmcl__overlaps(tabs[i], k)),
                       LLMCL_ERROR_INVALID_ARGUMENT, "%s: opt->%s overlaps %s or %s", fn,
                       i ? "sin" : "cos", qn, kn);
    return LLMCL_OK;
}

/* Positions ([T] or [B, T], clear of q and k), theta, and Llama 3's scaling where it is asked. */
static llmcl_status check_positions(llmcl_ctx *ctx, const char *fn, const llmcl_tensor *q,
                                    const char *qn, const llmcl_tensor *k, const char *kn,
                                    const llmcl_rope_options *o, rope_call *c)
{
    const llmcl_tensor *p = o->positions;
    LLMCL__REQUIRE(ctx, p, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: no angle source: set opt->positions (or opt->cos and opt->sin)", fn);
    LLMCL__TRY(llmcl__check_tensor(ctx, p, "opt->positions", LLMCL__INT_DTYPES, 1, 2));
    LLMCL__REQUIRE(
        ctx, p->shape[p->ndim - 1] == c->vq.n[RT] && (p->ndim == 1 || p->shape[0] == c->vq.n[RB]),
        LLMCL_ERROR_SHAPE_MISMATCH,
        "%s: opt->positions is %s; expected [T] = [%lld] or [B, T] = [%lld, %lld]", fn,
        llmcl__shape_text(p).s,
        (long long)c->vq.n[RT], (long long)c->vq.n[RB], (long long)c->vq.n[RT]);
    LLMCL__REQUIRE(ctx, !llmcl__overlaps(p, q) && (!k || !llmcl__overlaps(p, k)),
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: opt->positions overlaps %s or %s", fn, qn,
                   kn);

    const double theta = o->theta != 0.0 ? o->theta : 10000.0;
    LLMCL__REQUIRE(ctx, theta > 0.0 && isfinite(theta), LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: theta %g must be finite and > 0", fn, o->theta);
    c->theta = (float)theta;
    c->l3[0] = 0.0f;
    if (o->llama3_factor == 0.0)
        return LLMCL_OK;
    const double f = o->llama3_factor;
    const double lo = o->llama3_low_freq_factor != 0.0 ? o->llama3_low_freq_factor : 1.0;
    const double hi = o->llama3_high_freq_factor != 0.0 ? o->llama3_high_freq_factor : 4.0;
    const double orig =
        o->llama3_original_max_position != 0.0 ? o->llama3_original_max_position : 8192.0;
    LLMCL__REQUIRE(ctx,
                   f > 0.0 && lo > 0.0 && hi > lo && orig > 0.0 && isfinite(f) && isfinite(hi) &&
                       isfinite(orig),
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: Llama 3 scaling needs factor > 0, 0 < low_freq_factor < "
                   "high_freq_factor and original_max_position > 0 (got %g, %g, %g, %g)",
                   fn, f, lo, hi, orig);
    const float l3[6] = {(float)f,    (float)lo,          (float)hi,
                         (float)orig, (float)(orig / lo), (float)(orig / hi)};
    for (int i = 0; i < 6; ++i)
        c->l3[i] = l3[i];
    return LLMCL_OK;
}

/* Every argument of a call (k may be NULL) checked, and what its launch needs gathered into c. */
static llmcl_status rope_validate(llmcl_ctx *ctx, const char *fn, const llmcl_tensor *q,
                                  const char *qn, const llmcl_tensor *k, const char *kn,
                                  const llmcl_rope_options *o, rope_call *c)
{
    LLMCL__TRY(llmcl__check_tensor(ctx, q, qn, LLMCL__FLOAT_DTYPES, 4, 4));
    LLMCL__REQUIRE(ctx, o->layout == LLMCL_ROPE_BHTD || o->layout == LLMCL_ROPE_BTHD,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: layout %d is not an llmcl_rope_layout", fn,
                   (int)o->layout);
    LLMCL__REQUIRE(ctx, o->style == LLMCL_ROPE_HALF || o->style == LLMCL_ROPE_INTERLEAVED,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s: style %d is not an llmcl_rope_style", fn,
                   (int)o->style);
    c->vq = rope_view_of(q, o->layout);
    LLMCL__TRY(check_view(ctx, &c->vq, qn));
    if (k)
        LLMCL__TRY(check_k(ctx, q, qn, k, kn, o, c));
    else {
        c->vk = c->vq;
        c->vk.n[RH] = 0;
    }

    const int64_t d = c->vq.n[RD];
    const int64_t rd = o->rotary_dim ? o->rotary_dim : d;
    LLMCL__REQUIRE(ctx, rd > 0 && rd <= d && rd % 2 == 0, LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: rotary_dim %lld must be even and in [2, D = %lld]", fn, (long long)rd,
                   (long long)d);
    c->pairs = rd / 2;
    LLMCL__REQUIRE(ctx,
                   c->vq.n[RB] * c->vq.n[RT] <= INT32_MAX && c->vq.n[RT] <= INT32_MAX &&
                       c->vq.n[RH] + c->vk.n[RH] <= INT32_MAX,
                   LLMCL_ERROR_OVERFLOW, "%s: B * T and Hq + Hk must fit in 32 bits", fn);
    c->tables = o->cos || o->sin;
    return c->tables ? check_tables(ctx, fn, q, qn, k, kn, o, c)
                     : check_positions(ctx, fn, q, qn, k, kn, o, c);
}

/* Whether v's offset and the strides of its non-trivial b, h, t dimensions are multiples of vec. */
static bool rope_aligned(const llmcl_tensor *t, const rope_view *v, int64_t vec)
{
    if (!t)
        return true;
    if (t->offset % vec)
        return false;
    for (int i = 0; i < 3; ++i)
        if (v->n[i] > 1 && v->s[i] % vec)
            return false;
    return true;
}

/*
 * Tokens per work-group: as many as fit the WG parameter (and the device), at least one; on SIMD
 * devices the most that fill whole warps, when some count does (80 slots: 2 tokens, 160 items,
 * rather than 3 tokens in 7.5 warps).
 */
static int64_t rope_tokens_per_group(const llmcl_ctx *ctx, int64_t wg, int64_t slots,
                                     int64_t n_tokens)
{
    if (wg > (int64_t)ctx->info.max_work_group_size)
        wg = (int64_t)ctx->info.max_work_group_size;
    int64_t tpw = wg / slots;
    if (tpw > n_tokens)
        tpw = n_tokens;
    if (tpw <= 1)
        return 1;
    const int64_t simd = ctx->info.simd_width > 1 ? ctx->info.simd_width : 1;
    for (int64_t t = tpw; t > 1 && simd > 1; --t)
        if ((t * slots) % simd == 0)
            return t;
    return tpw;
}

/* The launch's geometry, from the call and its parameters. */
typedef struct rope_plan {
    int64_t n_tokens, heads;
    long vec, hpt, order;
    int64_t head_groups, slots; /* slots: items per token */
    int64_t tpw;                /* tokens per group as the WG parameter allows */
    bool share;                 /* computed angles shared through local memory */
    uint64_t share_bytes;
} rope_plan;

/* The parameters: the device's defaults, then the tuning database's, VEC narrowed to what the
   tensors' alignment allows. */
static llmcl_status rope_params(llmcl_ctx *ctx, const char *fn, const llmcl_tensor *q,
                                const llmcl_tensor *k, const rope_call *c, int64_t heads,
                                llmcl__params *p)
{
    const llmcl_dtype dt = q->dtype;
    /* NVIDIA (measured on an H100 with [B, H, T, D], docs/PERFORMANCE.md): one head per item in
     * groups of 128, plain accesses. With tables, token order (ORDER 1): 2.6 TB/s where four heads
     * per item in head order moved 1.9. With computed angles, head order, a group's token angles
     * computed once into local memory: 2.5 TB/s where token order moved 2.2. Elsewhere four heads
     * per item, head order. */
    const bool nv = ctx->info.vendor_id == LLMCL_VENDOR_NVIDIA;
    const bool bhtd = c->vq.n[RT] > 1 && c->vq.s[RT] < c->vq.s[RH];
    llmcl__param_set(p, "WG", nv && bhtd ? 128 : 256);
    llmcl__param_set(p, "VEC", dt == LLMCL_F32 ? 4 : 8);
    llmcl__param_set(p, "HPT", nv ? 1 : 4);
    llmcl__param_set(p, "ORDER", nv && bhtd && c->tables);
    llmcl__param_set(p, "HINT", 0);
    char cls[16];
    llmcl__shape_class(c->pairs * heads, cls);
    const llmcl__tune_lookup lookup =
        llmcl__params_lookup(ctx, c->tables ? LLMCL_KEY_ROPE : LLMCL_KEY_ROPE_POS, dt, cls, p);

    long vec = llmcl__param_get(p, "VEC", 4);
    const long hpt = llmcl__param_get(p, "HPT", 4);
    const long order = llmcl__param_get(p, "ORDER", 0), hint = llmcl__param_get(p, "HINT", 0);
    LLMCL__REQUIRE(ctx,
                   (vec == 1 || vec == 2 || vec == 4 || vec == 8) && hpt >= 1 && hpt <= 16 &&
                       (order == 0 || order == 1) && hint >= 0 && hint <= 3,
                   LLMCL_ERROR_INVALID_ARGUMENT,
                   "%s: tuned VEC %ld, HPT %ld, ORDER %ld or HINT %ld out of range", fn, vec, hpt,
                   order, hint);
    while (vec > 1 &&
           (c->pairs % vec || !rope_aligned(q, &c->vq, vec) || !rope_aligned(k, &c->vk, vec)))
        vec /= 2;
    llmcl__param_set(p, "VEC", vec);
    llmcl__params_record(&lookup, p);
    return LLMCL_OK;
}

/* Items per token: every chunk of every head group (ORDER 0) or of one head group (ORDER 1).
   Computed angles are shared through local memory when the group's tokens fit in half of it; with
   ORDER 1 a group then loops over the head groups of its tokens. */
static rope_plan rope_plan_of(const llmcl_ctx *ctx, const rope_call *c, const llmcl__params *p)
{
    rope_plan s = {.n_tokens = c->vq.n[RB] * c->vq.n[RT], .heads = c->vq.n[RH] + c->vk.n[RH]};
    s.vec = llmcl__param_get(p, "VEC", 4);
    s.hpt = llmcl__param_get(p, "HPT", 4);
    s.order = llmcl__param_get(p, "ORDER", 0);
    s.head_groups = llmcl__div_up(s.heads, s.hpt);
    s.slots = (c->pairs / s.vec) * (s.order ? 1 : s.head_groups);
    s.tpw = rope_tokens_per_group(ctx, llmcl__param_get(p, "WG", 256), s.slots, s.n_tokens);
    s.share_bytes = 2 * sizeof(float) * (uint64_t)(s.tpw * c->pairs);
    s.share = !c->tables && s.share_bytes <= ctx->info.local_mem_bytes / 2;
    return s;
}

static llmcl_status rope_build(llmcl_ctx *ctx, const llmcl_rope_options *o, const rope_call *c,
                               llmcl_dtype dt, const rope_plan *s, const llmcl__params *p,
                               cl_kernel *kernel)
{
    const long vec = s->vec;
    llmcl__defines d = {0};
    llmcl__define_str(&d, "DT", llmcl__dtype_macro(dt));
    llmcl__define_int(&d, "STYLE", o->style == LLMCL_ROPE_INTERLEAVED);
    llmcl__define_int(&d, "SRC", !c->tables);
    llmcl__define_int(&d, "RAW16", vec >= 4);
    if (c->tables) {
        const llmcl_tensor *tabs[2] = {o->cos, o->sin};
        bool talign = true;
        for (int i = 0; i < 2; ++i) {
            const llmcl_tensor *t = tabs[i];
            talign = talign && t->offset % vec == 0 && t->strides[t->ndim - 2] % vec == 0 &&
                     (t->ndim == 2 || t->shape[0] <= 1 || t->strides[0] % vec == 0);
        }
        llmcl__define_int(&d, "TALIGNED", talign);
    } else {
        llmcl__define_str(&d, "POS_DT", llmcl__dtype_macro(o->positions->dtype));
    }
    llmcl__define_int(&d, "SHARE", s->share);
    llmcl__params_define(p, &d);
    return llmcl__kernel(ctx, LLMCL_FAMILY_ROPE, &d, "rope", kernel);
}

/*
 * The grid: tokens per group (*tpg) within what the built kernel allows, and groups, capped so
 * that each group's loops stay within the device's loop budget.
 */
static llmcl_status rope_grid(llmcl_ctx *ctx, const char *fn, cl_kernel kernel, const rope_call *c,
                              const rope_plan *s, const llmcl__params *p, size_t *global,
                              size_t *local, int64_t *tpg)
{
    const size_t wg = llmcl__kernel_wg_cap(ctx, kernel, (size_t)llmcl__param_get(p, "WG", 256));
    /* The kernel may allow fewer items than planned (registers): then as many tokens as fit, or
     * one token per group looping over its slots. */
    *tpg = s->tpw;
    if (s->tpw * s->slots > (int64_t)wg)
        *tpg = rope_tokens_per_group(ctx, (int64_t)wg, s->slots, s->n_tokens);
    *local = *tpg > 1 || s->slots <= (int64_t)wg ? (size_t)(*tpg * s->slots) : wg;
    const int64_t blocks =
        llmcl__div_up(s->n_tokens, *tpg) * (s->order && !s->share ? s->head_groups : 1);
    int64_t groups = blocks;
    const int64_t max_groups =
        (int64_t)(ctx->info.compute_units ? ctx->info.compute_units : 1) * 2048;
    if (groups > max_groups)
        groups = max_groups;
    const int64_t budget = llmcl__loop_budget(ctx);
    if (budget != INT64_MAX) {
        /* a block's loop passes (llmcl__loop_budget's count): the shared angles' loop and its
           slot loop; a slot's two loops of HPT heads (for every head group in token order with
           shared angles) and its angles' loop of VEC where they are not shared */
        const int64_t heads_loops = 2 * (s->hpt + 1);
        const int64_t per_slot =
            (s->order && s->share ? (s->head_groups + 1) * heads_loops : heads_loops) +
            (s->share ? 0 : s->vec + 1);
        const int64_t angles =
            s->share ? llmcl__div_up(*tpg * c->pairs, (int64_t)*local) + 1 : 0;
        const int64_t per_block =
            2 + angles + llmcl__div_up(s->slots, (int64_t)*local) * per_slot + 1;
        LLMCL__TRY(llmcl__check_loops(ctx, per_block + 1, "%s: %lld heads of %lld pairs", fn,
                                      (long long)s->heads, (long long)c->pairs));
        const int64_t most = (budget - 1) / per_block; /* blocks a group may take */
        if (llmcl__div_up(blocks, groups) > most)
            groups = llmcl__div_up(blocks, most);
    }
    *global = (size_t)groups * *local;
    return LLMCL_OK;
}

/* The kernel's arguments. Unused ones (tables or positions, k) get q's buffer: never read. */
static void rope_args(llmcl__args *a, const llmcl_tensor *q, const llmcl_tensor *k,
                      const llmcl_rope_options *o, const rope_call *c, const rope_plan *s,
                      int64_t tpg)
{
    const llmcl_tensor *kt = k ? k : q;
    const llmcl_tensor *ct = c->tables ? o->cos : q, *st = c->tables ? o->sin : q;
    const llmcl_tensor *pt = c->tables ? q : o->positions;
    const int64_t tsb =
        c->tables && o->cos->ndim == 3 && o->cos->shape[0] > 1 ? o->cos->strides[0] : 0;
    const int64_t tst = c->tables ? o->cos->strides[o->cos->ndim - 2] : 0;
    const int64_t psb = !c->tables && pt->ndim == 2 && pt->shape[0] > 1 ? pt->strides[0] : 0;
    const int64_t pst = !c->tables ? pt->strides[pt->ndim - 1] : 0;

    llmcl__arg_tensor(a, q);
    for (int i = 0; i < 3; ++i)
        llmcl__arg_i64(a, c->vq.s[i]);
    llmcl__arg_tensor(a, kt);
    for (int i = 0; i < 3; ++i)
        llmcl__arg_i64(a, c->vk.s[i]);
    llmcl__arg_i32(a, (int32_t)c->vq.n[RH]);
    llmcl__arg_i32(a, (int32_t)c->vk.n[RH]);
    llmcl__arg_i32(a, (int32_t)c->vq.n[RT]);
    llmcl__arg_i64(a, s->n_tokens);
    llmcl__arg_i32(a, (int32_t)c->pairs);
    llmcl__arg_i32(a, (int32_t)s->slots);
    llmcl__arg_i32(a, (int32_t)tpg);
    llmcl__arg_tensor(a, ct);
    llmcl__arg_tensor(a, st);
    llmcl__arg_i64(a, tsb);
    llmcl__arg_i64(a, tst);
    llmcl__arg_tensor(a, pt);
    llmcl__arg_i64(a, psb);
    llmcl__arg_i64(a, pst);
    llmcl__arg_f32(a, c->tables ? 0.0f : c->theta);
    for (int i = 0; i < 6; ++i)
        llmcl__arg_f32(a, c->tables ? 0.0f : c->l3[i]);
}

static llmcl_status rope_run(llmcl_ctx *ctx, const char *fn, llmcl_tensor *q, const char *qn,
                             llmcl_tensor *k, const char *kn, const llmcl_rope_options *opt,
                             float sign)
{
    if (!ctx)
        return LLMCL__FAIL(NULL, LLMCL_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    const llmcl_rope_options defaults = {0};
    const llmcl_rope_options *o = opt ? opt : &defaults;
    rope_call c;
    LLMCL__TRY(rope_validate(ctx, fn, q, qn, k, kn, o, &c));
    const int64_t heads = c.vq.n[RH] + c.vk.n[RH];
    if (c.vq.n[RB] * c.vq.n[RT] == 0 || heads == 0)
        return LLMCL_OK;

    llmcl__params p = {0};
    LLMCL__TRY(rope_params(ctx, fn, q, k, &c, heads, &p));
    const rope_plan s = rope_plan_of(ctx, &c, &p);
    cl_kernel kernel;
    LLMCL__TRY(rope_build(ctx, o, &c, q->dtype, &s, &p, &kernel));
    size_t global, local;
    int64_t tpg;
    LLMCL__TRY(rope_grid(ctx, fn, kernel, &c, &s, &p, &global, &local, &tpg));

    llmcl__args a = llmcl__args_begin(ctx, kernel);
    rope_args(&a, q, k, o, &c, &s, tpg);
    llmcl__arg_f32(&a, sign);
    llmcl__arg_local(&a, s.share ? (size_t)s.share_bytes : sizeof(float));
    return llmcl__launch(&a, 1, &global, &local);
}

llmcl_status llmcl_rope_forward(llmcl_ctx *ctx, llmcl_tensor *q, llmcl_tensor *k,
                                const llmcl_rope_options *opt)
{
    return rope_run(ctx, "llmcl_rope_forward", q, "q", k, "k", opt, 1.0f);
}

llmcl_status llmcl_rope_backward(llmcl_ctx *ctx, llmcl_tensor *dq, llmcl_tensor *dk,
                                 const llmcl_rope_options *opt)
{
    return rope_run(ctx, "llmcl_rope_backward", dq, "dq", dk, "dk", opt, -1.0f);
}
