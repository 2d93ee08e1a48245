/*
 * optim.cl: a multi-tensor AdamW step and a deterministic global gradient norm.
 *
 * One launch covers a group of tensors that are views of the same buffers (one buffer each for
 * params, masters, grads, m and v). The host passes a table with one entry of T_FIELDS longs per
 * tensor (element offsets into each buffer, numel, ...) and cuts every tensor into chunks of
 * CHUNK = WG * UNROLL * 4 elements. Work-groups take chunks in a grid-stride loop and find a
 * chunk's tensor by binary search over the table's first-chunk column. A chunk never spans two
 * tensors, so every chunk but a tensor's last is full and takes the 4-wide path without bounds
 * checks; each work-item loads all of its UNROLL vectors before it computes and stores.
 *
 * adamw: torch.optim.AdamW's single-tensor update in its order of operations (w *= 1 - lr wd;
 * m.lerp_(g, 1 - b1); v = v b2 + (1 - b2) g g; w += -lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)),
 * with g = grad * grad_scale, times min(1, max_norm / (grad_scale * norm + 1e-6)) under HAS_CLIP,
 * the norm of the unscaled gradients read from the device. With HAS_MASTER the update runs on the f32 master and param receives it rounded
 * to nearest; without, a 16-bit param is rounded stochastically: the random bits are a splitmix64
 * hash of a key (from the seed and the step) and the element's index in the whole call, so a
 * result repeats run after run and does not depend on how tensors group into buffers.
 *
 * grad_norm_partial: each chunk's sum of squares (a fixed tree in local memory) into partials at
 * the chunk's index in the whole call (T_SLOT), so the bits depend neither on the grouping nor on
 * the grid. grad_norm_final: one work-group sums the partials in a fixed order.
 *
 * Defines: P_DT (param storage; adamw), G_DT (grad storage), HAS_MASTER, HAS_CLIP, STOCHASTIC (a
 * 16-bit param without master) with P_IS_BF16 where it is bf16, ALIGNED (every offset in the table
 * a multiple of 4 elements: aligned vector accesses).
 * Tunables (keys adamw, grad_norm):
 *   WG      work-group size (any value the device allows)
 *   UNROLL  4-element vectors per work-item per chunk: 1, 2, 4 or 8 (launcher default 4; adamw on
 *           CPUs 2)
 *   GPC     work-groups per compute unit that the grid is capped at: 0 (one per chunk) or 1 to 64
 *           (launcher default 0; grad_norm 8 on non-NVIDIA GPUs, 4 on CPUs). A launch parameter.
 */
#ifndef WG
#define WG 256
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#define CHUNK ((long)WG * UNROLL * 4)

/* Fields of a table entry; optim.c writes the same layout. */
#define T_PARAM 0
#define T_MASTER 1
#define T_GRAD 2
#define T_M 3
#define T_V 4
#define T_NUMEL 5
#define T_CHUNK 6 /* the tensor's first chunk in this launch */
#define T_BASE 7  /* its first element's index in the whole call: the rounding counter */
#define T_SLOT 8  /* its first chunk's index in the whole call: where its partials go */
#define T_DECAY 9 /* 1: weight decay applies */
#define T_FIELDS 10

/* The entry of the tensor that holds chunk c: the last one whose first chunk is <= c. */
inline __global const long *find_tensor(__global const long *table, int n, long c)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table[mid * T_FIELDS + T_CHUNK] <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    return table + lo * T_FIELDS;
}

/* Four elements at p + i: with ALIGNED, vec_io.cl's 4-element-aligned accesses, which the compiler
 * can issue as single loads and stores; otherwise common.cl's element-aligned forms. */
#ifdef ALIGNED
#define LOADV(DT, p, i) LLMCL_CAT(load4a_, DT)((p), (i))
#define STOREV(DT, p, i, v) LLMCL_CAT(store4a_, DT)((p), (i), (v))
#else
#define LOADV(DT, p, i) LOAD4(DT, p, i)
#define STOREV(DT, p, i, v) STORE4(DT, p, i, v)
#endif

/* The first n (1 to 4) elements at p + i, zeros after. */
#define LOAD_PART(DT, p, i, n)                                                                    \
    (float4)(LOAD(DT, p, i), (n) > 1 ? LOAD(DT, p, (i) + 1) : 0.0f,                               \
             (n) > 2 ? LOAD(DT, p, (i) + 2) : 0.0f, (n) > 3 ? LOAD(DT, p, (i) + 3) : 0.0f)
#define STORE_PART(DT, p, i, n, v)                                                                \
    do {                                                                                          \
        STORE(DT, p, i, (v).x);                                                                   \
        if ((n) > 1)                                                                              \
            STORE(DT, p, (i) + 1, (v).y);                                                         \
        if ((n) > 2)                                                                              \
            STORE(DT, p, (i) + 2, (v).z);                                                         \
        if ((n) > 3)                                                                              \
            STORE(DT, p, (i) + 3, (v).w);                                                         \
    } while (0)

#ifdef P_DT
/* 32 random bits for element idx: splitmix64's output function on its idx-th state. */
inline uint sr_bits(ulong key, ulong idx)
{
    ulong z = key + idx * 0x9e3779b97f4a7c15ul;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ul;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebul;
    return (uint)((z ^ (z >> 31)) >> 32);
}

/*
 * x rounded to one of its two neighbouring 16-bit values, up with probability equal to its
 * distance from the lower one in units of the gap: the result is exact in P_DT, so the
 * round-to-nearest store keeps it.
 */
inline float sr_round(float x, uint r)
{
#ifdef P_IS_BF16
    /* llm.c's form: random low bits added to the magnitude, then truncated. NaN stays NaN. */
    const uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return x;
    return as_float((u + (r & 0xffffu)) & 0xffff0000u);
#else
    /* f16: the gap is 2^(e - 10) at binade e, and 2^-24 among subnormals; powers of two scale
     * exactly. Beyond 65504 the upper neighbour overflows to inf, as a rounding up would. */
    const int e = max((int)((as_uint(x) >> 23) & 0xffu) - 127, -14) - 10;
    const float q = x * as_float((uint)(127 - e) << 23);
    const float lo = floor(q);
    const float u01 = (float)(r >> 8) * 0x1p-24f;
    return (u01 < q - lo ? lo + 1.0f : lo) * as_float((uint)(127 + e) << 23);
#endif
}

typedef struct adamw_hp {
    float one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps;
} adamw_hp;

/* One AdamW update of four elements: returns the new w, updates m and v. */
inline float4 adamw4(float4 w, float4 g, float4 *m, float4 *v, float decay, const adamw_hp *h)
{
    w *= decay;
    /* torch's lerp_: from the nearer end, by the weight or by its complement */
    if (h->one_minus_beta1 < 0.5f)
        *m += h->one_minus_beta1 * (g - *m);
    else
        *m = g - (g - *m) * (1.0f - h->one_minus_beta1);
    *v = *v * h->beta2 + h->one_minus_beta2 * g * g;
    const float4 denom = sqrt(*v) / h->bc2_sqrt + h->eps;
    return w + h->neg_step_size * (*m / denom);
}

/* Four new weights, rounded stochastically where param is 16-bit and has no master. */
inline float4 param_values(float4 w, ulong key, ulong idx)
{
#ifdef STOCHASTIC
    return (float4)(sr_round(w.x, sr_bits(key, idx)), sr_round(w.y, sr_bits(key, idx + 1)),
                    sr_round(w.z, sr_bits(key, idx + 2)), sr_round(w.w, sr_bits(key, idx + 3)));
#else
    return w;
#endif
}

#ifdef HAS_MASTER
#define W_LOADV(i) LOADV(F32, ms, i)
#define W_LOAD_PART(i, n) LOAD_PART(F32, ms, i, n)
#else
#define W_LOADV(i) LOADV(P_DT, p, i)
#define W_LOAD_PART(i, n) LOAD_PART(P_DT, p, i, n)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void adamw(__global STORAGE(P_DT) *restrict param, __global float *restrict master,
           __global const STORAGE(G_DT) *restrict grad, __global float *restrict m_buf,
           __global float *restrict v_buf, __global const long *restrict table, ulong table_off,
           int n_tensors, long n_chunks, float one_minus_beta1, float beta2, float one_minus_beta2,
           float neg_step_size, float bc2_sqrt, float eps, float decay, float grad_scale,
           __global const float *restrict norm, ulong norm_off, float max_norm, ulong sr_key)
{
    table += table_off;
    const adamw_hp h = {one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps};
#ifdef HAS_CLIP
    /* torch's clip_grad_norm_ coefficient for the scaled gradients, whose norm is grad_scale
     * times that of the gradients given; a NaN norm gives NaN, as torch's clamp does */
    const float clip = max_norm / (grad_scale * norm[norm_off] + 1e-6f);
    grad_scale *= clip > 1.0f ? 1.0f : clip;
#endif
    const int lid = get_local_id(0);
    for (long c = get_group_id(0); c < n_chunks; c += get_num_groups(0)) {
        const __global long *t = find_tensor(table, n_tensors, c);
        __global STORAGE(P_DT) *p = param + t[T_PARAM];
        __global float *ms = master + t[T_MASTER];
        const __global STORAGE(G_DT) *gr = grad + t[T_GRAD];
        __global float *m = m_buf + t[T_M];
        __global float *v = v_buf + t[T_V];
        const long numel = t[T_NUMEL], base = t[T_BASE];
        const float dec = t[T_DECAY] ? decay : 1.0f;
        const long first = (c - t[T_CHUNK]) * CHUNK + 4 * lid;
        if ((c - t[T_CHUNK] + 1) * CHUNK <= numel) {
            float4 w[UNROLL], g[UNROLL], mv[UNROLL], vv[UNROLL];
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long i = first + j * 4 * WG;
                w[j] = W_LOADV(i);
                g[j] = LOADV(G_DT, gr, i) * grad_scale;
                mv[j] = LOADV(F32, m, i);
                vv[j] = LOADV(F32, v, i);
            }
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long i = first + j * 4 * WG;
                w[j] = adamw4(w[j], g[j], &mv[j], &vv[j], dec, &h);
                STOREV(F32, m, i, mv[j]);
                STOREV(F32, v, i, vv[j]);
#ifdef HAS_MASTER
                STOREV(F32, ms, i, w[j]);
#endif
                STOREV(P_DT, p, i, param_values(w[j], sr_key, (ulong)(base + i)));
            }
        } else {
            for (long i = first; i < numel; i += 4 * WG) {
                const long n = min(numel - i, 4l);
                float4 mv = LOAD_PART(F32, m, i, n), vv = LOAD_PART(F32, v, i, n);
                const float4 w = adamw4(W_LOAD_PART(i, n), LOAD_PART(G_DT, gr, i, n) * grad_scale,
                                        &mv, &vv, dec, &h);
                STORE_PART(F32, m, i, n, mv);
                STORE_PART(F32, v, i, n, vv);
#ifdef HAS_MASTER
                STORE_PART(F32, ms, i, n, w);
#endif
                const float4 pw = param_values(w, sr_key, (ulong)(base + i));
                STORE_PART(P_DT, p, i, n, pw);
            }
        }
    }
}
#endif

#ifdef G_DT
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void grad_norm_partial(__global const STORAGE(G_DT) *restrict grad,
                       __global const long *restrict table, ulong table_off, int n_tensors,
                       long n_chunks, __global float *restrict partials)
{
    table += table_off;
    __local float scratch[WG];
    const int lid = get_local_id(0);
    for (long c = get_group_id(0); c < n_chunks; c += get_num_groups(0)) {
        const __global long *t = find_tensor(table, n_tensors, c);
        const __global STORAGE(G_DT) *g = grad + t[T_GRAD];
        const long numel = t[T_NUMEL], first = (c - t[T_CHUNK]) * CHUNK;
        float s = 0.0f;
        if (first + CHUNK <= numel) {
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const float4 x = LOADV(G_DT, g, first + 4 * (j * WG + lid));
                s += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
            }
        } else {
            for (long i = first + lid; i < numel; i += WG) {
                const float x = LOAD(G_DT, g, i);
                s += x * x;
            }
        }
        s = wg_sum(s, scratch);
        if (lid == 0)
            partials[t[T_SLOT] + c - t[T_CHUNK]] = s;
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void grad_norm_final(__global const float *restrict partials, long n, __global float *restrict out,
                     ulong out_off, int squared)
{
    __local float scratch[WG];
    float s = 0.0f;
    for (long i = get_local_id(0); i < n; i += WG)
        s += partials[i];
    s = wg_sum(s, scratch);
    if (get_local_id(0) == 0)
        out[out_off] = squared ? s : sqrt(s);
}
