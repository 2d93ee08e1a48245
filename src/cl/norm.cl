/*
 * norm.cl: RMSNorm (with an optional fused residual add) and LayerNorm, forward and backward, and
 * the second-stage reduction of the weight gradients. Host side: src/runtime/ops/norm.c.
 *
 * Layout: a tensor is a set of rows of H elements (unit stride) in blocks of `inner` rows: row rr
 * starts (rr / inner) * ostride + (rr % inner) * stride elements in (ROW_OFF), stride and ostride
 * each tensor's own, inner shared by all; rows of one stride are one block (inner = n_rows). rstd
 * and mean are indexed by rr (contiguous). A work-group is WG x ROWS work-items: WG work-items
 * share one row, ROWS rows per work-group (ROWS > 1 for short rows). A row is read in chunks of
 * VEC elements; work-item lid owns chunks lid, lid + WG, ...; its first CACHE chunks stay in
 * registers between the row reduction and the write, so a row that fits (H <= WG * VEC * CACHE) is
 * read from memory once. Chunks past the cache are read again from global memory (a slower path
 * for very long rows); the H % VEC tail is scalar.
 *
 * Backward kernels are persistent: get_num_groups(1) * ROWS row slots walk the rows with a fixed
 * stride. A slot keeps its current row (dy, x [, dr]) in registers as stored (bf16 packed two to a
 * register) and loads its next row before the current row's reduction, so loads stay in flight
 * across the barriers. Each slot accumulates its dw (and db) contributions in registers, then
 * writes them as one row of a [slots, part_stride] f32 partial buffer; part_stride is H rounded up
 * to a multiple of 8, so every partial row is 32-byte aligned for the 8-wide stores whatever H is.
 * norm_dw_reduce then sums the slots in a fixed order: the result is deterministic for a given slot
 * count and does not use atomics.
 *
 * Dtype macros: X_DT for activations (x, residual, r, y, dy, dr, dx), W_DT for w, b, dw, db; rstd
 * and mean are f32.
 *
 * Tunables (all kernels unless noted):
 *   WG     work-items per row: 1..max work-group size, WG * ROWS <= max work-group size.
 *   ROWS   rows per work-group: >= 1.
 *   VEC    1 or 8. 8 needs every row base 16-byte aligned (the host checks) and uses 16-byte loads
 *          for 16-bit storage (two for f32); 1 is the scalar path for any alignment.
 *   CACHE  chunks per work-item kept in registers: 1..16 (the backward keeps four raw arrays of
 *          them, this row's and the next row's dy and x, plus the dw sums in f32: registers are
 *          what limits CACHE there; on the H100 WG=128 CACHE=4 is best for H = 4096).
 *   FX, FY norm_dw_reduce only: FX work-items of four columns x FY slot lanes per work-group,
 *          FX * FY <= max size.
 * Feature switches: RMS_CAST_LLAMA (llama casting, else gemma), HAS_RES (residual add in the
 * forward), HAS_DR (an incoming gradient added to dx in the backward), HAS_B (LayerNorm bias).
 * NORM_KERNEL (1 rmsnorm_fwd, 2 rmsnorm_bwd, 3 layernorm_fwd, 4 layernorm_bwd, 5 norm_dw_reduce)
 * compiles only that kernel, so a build (and a program binary for the disk cache) holds one kernel;
 * 0 or unset builds every kernel.
 */

#ifndef NORM_KERNEL
#define NORM_KERNEL 0
#endif
#define NORM_BUILDS(k) (NORM_KERNEL == 0 || NORM_KERNEL == (k))

#ifndef X_DT
#define X_DT F32
#endif
#ifndef W_DT
#define W_DT F32
#endif
#ifndef WG
#define WG 256
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef CACHE
#define CACHE 4
#endif
#ifndef FX
#define FX 8
#endif
#ifndef FY
#define FY 32
#endif

/* Values rounded to a storage type and back, as a cast to the input dtype would do. */
inline float round_F32(float v) { return v; }
inline float round_BF16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
inline float round_F16(float v)
{
    ushort h;
    vstore_half_rte(v, 0, (__private half *)&h);
    return vload_half(0, (const __private half *)&h);
}

inline float8 round8_F32(float8 v) { return v; }
#define round8_BF16 bf16x8_round
inline float8 round8_F16(float8 v)
{
    ushort8 h;
    vstore_half8_rte(v, 0, (__private half *)&h);
    return vload_half8(0, (const __private half *)&h);
}

#if VEC == 8
typedef float8 vf;
#define VLOAD(DT, p, i) LLMCL_CAT(load8_, DT)((p), (i))
#define VSTORE(DT, p, i, v) LLMCL_CAT(store8_, DT)((p), (i), (v))
#define VROUND(DT, v) LLMCL_CAT(round8_, DT)(v)
#define VDOT(a, b) (dot((a).lo, (b).lo) + dot((a).hi, (b).hi))
#elif VEC == 1
typedef float vf;
#define VLOAD(DT, p, i) LOAD(DT, p, i)
#define VSTORE(DT, p, i, v) STORE(DT, p, i, v)
#define VROUND(DT, v) LLMCL_CAT(round_, DT)(v)
#define VDOT(a, b) ((a) * (b))
#else
#error "VEC must be 1 or 8"
#endif
#define SROUND(DT, v) LLMCL_CAT(round_, DT)(v)

/*
 * Raw chunks: register caches hold rows as stored, so bf16 rows take half the registers of f32
 * ones (f16 is converted on load: vload_half from private memory would spill).
 * RAW(DT) is the chunk type, RLOAD loads one, UNRAW converts it to f32.
 */
#if VEC == 8
typedef float8 raw_F32;
typedef uint4 raw_BF16; /* element 2i in the low half of word i: ushort8 would take 8 registers */
typedef float8 raw_F16;
inline uint4 rload_BF16(const __global ushort *p, long i)
{
    return *(const __global uint4 *)(p + i);
}
#define unraw_BF16 bf16x8_masked_to_f32
#define RLOAD_F32 load8_F32
#define RLOAD_F16 load8_F16
#else
typedef float raw_F32;
typedef ushort raw_BF16;
typedef float raw_F16;
inline ushort rload_BF16(const __global ushort *p, long i) { return p[i]; }
inline float unraw_BF16(ushort r) { return bf16_to_f32(r); }
#define RLOAD_F32 load_F32
#define RLOAD_F16 load_F16
#endif
#define unraw_F32(r) (r)
#define unraw_F16(r) (r)
#define RLOAD_BF16 rload_BF16
#define RAW(DT) LLMCL_CAT(raw_, DT)
#define RLOAD(DT, p, j) LLMCL_CAT(RLOAD_, DT)((p), (long)(j) * VEC)
#define UNRAW(DT, r) LLMCL_CAT(unraw_, DT)(r)

#define X_T STORAGE(X_DT)
#define W_T STORAGE(W_DT)

/*
 * Element offset of row rr (see Layout): in a [N, heads, d] view of a wider [N, W] buffer, row rr
 * is head rr % inner of token rr / inner. Every row address goes through here. The launcher
 * defines BLOCKS only where a call has more than one block: a 64-bit division per row address
 * made the H200's residual RMSNorm backward a third slower, so one block keeps rr * stride.
 */
#ifdef BLOCKS
inline long row_off(long rr, long inner, long stride, long ostride)
{
    const long o = rr / inner;
    return o * ostride + (rr - o * inner) * stride;
}
#define ROW_OFF(t, rr) row_off((rr), inner, t##_stride, t##_ostride)
#else
#define ROW_OFF(t, rr) ((rr) * t##_stride)
#endif

/* The normalised value times the weight; llama casting rounds x * rstd to the input dtype first. */
#ifdef RMS_CAST_LLAMA
#define RMS_Y(RND, v, rs, wo) (RND(X_DT, (v) * (rs)) * (wo))
#define RMS_M(RND, dy, wo) RND(X_DT, (dy) * (wo))
#define RMS_N(RND, v, rs) RND(X_DT, (v) * (rs))
#else
#define RMS_Y(RND, v, rs, wo) ((v) * (rs) * (wo))
#define RMS_M(RND, dy, wo) ((dy) * (wo))
#define RMS_N(RND, v, rs) ((v) * (rs))
#endif

/*
 * A row's sums over the work-group. Where warps reduce with shuffles, each warp's first lane writes
 * its sums into one half of sc, and a slot's rows alternate halves, so a row takes one barrier: a
 * warp that writes row i + 2's sums has passed row i + 1's barrier, which every warp reached after
 * reading row i's. The forward kernels take each half once (LayerNorm's mean, then its variance):
 * one barrier a sum, where wg_sum takes two. sc holds WG floats (WG / 8 on that path).
 */
inline float2 row_sum2(float2 v, __local float *sc, int side)
{
#ifdef LLMCL_NV_PTX
    if (WG % 32 == 0) {
        const int lid = get_local_id(0);
        __local float *h = sc + side * (WG / 16);
        v.x = warp_sum(v.x);
        v.y = warp_sum(v.y);
        if ((lid & 31) == 0)
            vstore2(v, lid >> 5, h);
        barrier(CLK_LOCAL_MEM_FENCE);
        float2 t = vload2(0, h);
        for (int i = 1; i < WG / 32; ++i)
            t += vload2(i, h);
        return t;
    }
#endif
    const float a = wg_sum(v.x, sc);
    return (float2)(a, wg_sum(v.y, sc));
}

inline float row_sum(float v, __local float *sc, int side)
{
#ifdef LLMCL_NV_PTX
    if (WG % 32 == 0)
        return row_sum2((float2)(v, 0.0f), sc, side).x;
#endif
    return wg_sum(v, sc);
}

/* ---- RMSNorm forward, optionally r = round(x + residual) first ------------------------------ */

#ifdef HAS_RES
#define RES_ARGS                                                                                  \
    const __global X_T *res, ulong res_off, long res_stride, long res_ostride, __global X_T *r,    \
        ulong r_off, long r_stride, long r_ostride,
#else
#define RES_ARGS
#endif

#if NORM_BUILDS(1)
__kernel __attribute__((reqd_work_group_size(WG, ROWS, 1))) void
rmsnorm_fwd(const __global X_T *x, ulong x_off, long x_stride, long x_ostride,
            RES_ARGS const __global W_T *w, ulong w_off, __global X_T *y, ulong y_off,
            long y_stride, long y_ostride, __global float *rstd, ulong rstd_off, long n_rows,
            long inner, int H, float eps, float offset)
{
    __local float scratch[WG * ROWS];
    __local float *sc = scratch + get_local_id(1) * WG;
    const int lid = get_local_id(0);
    const long row = get_global_id(1);
    const bool live = row < n_rows;
    const long rr = live ? row : n_rows - 1; /* dead rows join the barriers on a valid row */
    const int nv = H / VEC;

    x += x_off + ROW_OFF(x, rr);
    y += y_off + ROW_OFF(y, rr);
    w += w_off;
#ifdef HAS_RES
    res += res_off + ROW_OFF(res, rr);
    r += r_off + ROW_OFF(r, rr);
    /* Reads after the first pass come from r: r may overwrite x or residual in place. */
#define IN_V(j) VROUND(X_DT, VLOAD(X_DT, x, (j) * VEC) + VLOAD(X_DT, res, (j) * VEC))
#define IN_S(i) SROUND(X_DT, LOAD(X_DT, x, i) + LOAD(X_DT, res, i))
#define AGAIN_V(j) VLOAD(X_DT, r, (j) * VEC)
#define AGAIN_S(i) LOAD(X_DT, r, i)
    /* The register cache holds r = round(x + residual) in f32, x alone as stored. */
#define CACHE_T vf
#define CACHE_IN(j) IN_V(j)
#define CACHE_VAL(c) (c)
#else
#define CACHE_T RAW(X_DT)
#define CACHE_IN(j) RLOAD(X_DT, x, j)
#define CACHE_VAL(c) UNRAW(X_DT, c)
#define IN_V(j) VLOAD(X_DT, x, (j) * VEC)
#define IN_S(i) LOAD(X_DT, x, i)
#define AGAIN_V(j) VLOAD(X_DT, x, (j) * VEC)
#define AGAIN_S(i) LOAD(X_DT, x, i)
#endif

    /* w is loaded with the row, so its latency hides behind the reduction. */
    CACHE_T c[CACHE];
    RAW(W_DT) wr[CACHE];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv) {
            wr[k] = RLOAD(W_DT, w, j);
            c[k] = CACHE_IN(j);
            const vf v = CACHE_VAL(c[k]);
#ifdef HAS_RES
            if (live)
                VSTORE(X_DT, r, j * VEC, v);
#endif
            ss += VDOT(v, v);
        }
    }
    for (int j = lid + CACHE * WG; j < nv; j += WG) {
        const vf v = IN_V(j);
#ifdef HAS_RES
        if (live)
            VSTORE(X_DT, r, j * VEC, v);
#endif
        ss += VDOT(v, v);
    }
    for (int i = nv * VEC + lid; i < H; i += WG) {
        const float v = IN_S(i);
#ifdef HAS_RES
        if (live)
            STORE(X_DT, r, i, v);
#endif
        ss += v * v;
    }
    ss = row_sum(ss, sc, 0);
    const float rs = rsqrt(ss / (float)H + eps);
    if (!live)
        return;
    if (lid == 0)
        rstd[rstd_off + row] = rs;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv)
            VSTORE(X_DT, y, j * VEC,
                   RMS_Y(VROUND, CACHE_VAL(c[k]), rs, UNRAW(W_DT, wr[k]) + offset));
    }
    for (int j = lid + CACHE * WG; j < nv; j += WG)
        VSTORE(X_DT, y, j * VEC, RMS_Y(VROUND, AGAIN_V(j), rs, VLOAD(W_DT, w, j * VEC) + offset));
    for (int i = nv * VEC + lid; i < H; i += WG)
        STORE(X_DT, y, i, RMS_Y(SROUND, AGAIN_S(i), rs, LOAD(W_DT, w, i) + offset));
#undef IN_V
#undef IN_S
#undef AGAIN_V
#undef AGAIN_S
#undef CACHE_T
#undef CACHE_IN
#undef CACHE_VAL
}
#endif

/* ---- RMSNorm backward: dx = rstd * (m - x * rstd^2 * mean(m * x)) [+ dr], m = dy * (w + offset) */

#ifdef HAS_DR
#define DR_ARGS const __global X_T *dr, ulong dr_off, long dr_stride, long dr_ostride,
#define DR_V(j) +VLOAD(X_DT, drr, (j) * VEC)
#define DR_S(i) +LOAD(X_DT, drr, i)
#else
#define DR_ARGS
#define DR_V(j)
#define DR_S(i)
#endif

/*
 * Backward kernels: row slot r (of get_num_groups(1) * ROWS) takes rows r, r + step, ... While a
 * row is reduced, the loads of the slot's next row are already in flight (its cached chunks go into
 * the raw arrays n*, the current row's are c*), so the memory system never waits on a barrier.
 * Every work-item of a group runs the same number of iterations (dead rows clamp to a valid row
 * and skip their writes).
 */
#define SLOT_LOOP_BEGIN                                                                           \
    const long step = (long)get_num_groups(1) * ROWS;                                             \
    for (long row = get_group_id(1) * ROWS + get_local_id(1), base = get_group_id(1) * ROWS,      \
              turn = 0;                                                                           \
         base < n_rows; row += step, base += step, ++turn) {                                      \
        const int side = (int)(turn & 1); /* which half of the row sums' scratch */               \
        const bool live = row < n_rows;                                                           \
        const long rr = live ? row : n_rows - 1;                                                  \
        const long nrow = min(row + step, n_rows - 1); /* the prefetch target */                  \
        const bool more = base + step < n_rows;

#ifdef HAS_DR
#define DR_ADD(v, k) ((v) + UNRAW(X_DT, cdr[k]))
#else
#define DR_ADD(v, k) (v)
#endif

#if NORM_BUILDS(2)
__kernel __attribute__((reqd_work_group_size(WG, ROWS, 1))) void
rmsnorm_bwd(const __global X_T *dy, ulong dy_off, long dy_stride, long dy_ostride,
            DR_ARGS const __global X_T *x, ulong x_off, long x_stride, long x_ostride,
            const __global W_T *w, ulong w_off, const __global float *rstd, ulong rstd_off,
            __global X_T *dx, ulong dx_off, long dx_stride, long dx_ostride, __global float *part,
            ulong part_off, long part_stride, long n_rows, long inner, int H, float offset)
{
    __local float scratch[WG * ROWS];
    __local float *sc = scratch + get_local_id(1) * WG;
    const int lid = get_local_id(0);
    const int nv = H / VEC;
    w += w_off;
    rstd += rstd_off;
    dy += dy_off;
    x += x_off;
    dx += dx_off;
#ifdef HAS_DR
    dr += dr_off;
#endif

    /* The slot's partial row: register accumulators for cached chunks, memory for the rest. */
    __global float *pr = part + part_off + (get_group_id(1) * ROWS + get_local_id(1)) * part_stride;
    for (int i = min(CACHE * WG, nv) * VEC + lid; i < H; i += WG)
        pr[i] = 0.0f;
    RAW(W_DT) wc[CACHE];
    RAW(X_DT) ndy[CACHE], nx[CACHE];
#ifdef HAS_DR
    RAW(X_DT) ndr[CACHE];
#endif
    vf acc[CACHE];
    float nrs; /* the next row's rstd, loaded with its chunks */
    {
        const long r0 = min((long)(get_group_id(1) * ROWS + get_local_id(1)), n_rows - 1);
        nrs = rstd[r0];
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = min(lid + k * WG, nv - 1); /* chunks past the row load a valid one */
            wc[k] = RLOAD(W_DT, w, j);
            ndy[k] = RLOAD(X_DT, dy + ROW_OFF(dy, r0), j);
            nx[k] = RLOAD(X_DT, x + ROW_OFF(x, r0), j);
#ifdef HAS_DR
            ndr[k] = RLOAD(X_DT, dr + ROW_OFF(dr, r0), j);
#endif
            acc[k] = 0.0f;
        }
    }

    SLOT_LOOP_BEGIN
    const __global X_T *dyr = dy + ROW_OFF(dy, rr);
    const __global X_T *xr = x + ROW_OFF(x, rr);
#ifdef HAS_DR
    const __global X_T *drr = dr + ROW_OFF(dr, rr);
#endif
    __global X_T *dxr = dx + ROW_OFF(dx, rr);
    const float rs = nrs;

    RAW(X_DT) cdy[CACHE], cx[CACHE];
#ifdef HAS_DR
    RAW(X_DT) cdr[CACHE];
#endif
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        cdy[k] = ndy[k];
        cx[k] = nx[k];
#ifdef HAS_DR
        cdr[k] = ndr[k];
#endif
    }
    if (more) {
        nrs = rstd[nrow];
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = min(lid + k * WG, nv - 1);
            ndy[k] = RLOAD(X_DT, dy + ROW_OFF(dy, nrow), j);
            nx[k] = RLOAD(X_DT, x + ROW_OFF(x, nrow), j);
#ifdef HAS_DR
            ndr[k] = RLOAD(X_DT, dr + ROW_OFF(dr, nrow), j);
#endif
        }
    }

    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k)
        if (lid + k * WG < nv) {
            const vf wo = UNRAW(W_DT, wc[k]) + offset;
            d += VDOT(RMS_M(VROUND, UNRAW(X_DT, cdy[k]), wo), UNRAW(X_DT, cx[k]));
        }
    for (int j = lid + CACHE * WG; j < nv; j += WG)
        d += VDOT(RMS_M(VROUND, VLOAD(X_DT, dyr, j * VEC), VLOAD(W_DT, w, j * VEC) + offset),
                  VLOAD(X_DT, xr, j * VEC));
    for (int i = nv * VEC + lid; i < H; i += WG)
        d += RMS_M(SROUND, LOAD(X_DT, dyr, i), LOAD(W_DT, w, i) + offset) * LOAD(X_DT, xr, i);
    d = row_sum(d, sc, side);
    const float cf = d * rs * rs / (float)H;

    if (live) {
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = lid + k * WG;
            if (j < nv) {
                const vf g = UNRAW(X_DT, cdy[k]), v = UNRAW(X_DT, cx[k]);
                const vf m = RMS_M(VROUND, g, UNRAW(W_DT, wc[k]) + offset);
                VSTORE(X_DT, dxr, j * VEC, DR_ADD(rs * (m - v * cf), k));
                acc[k] += g * RMS_N(VROUND, v, rs);
            }
        }
        for (int j = lid + CACHE * WG; j < nv; j += WG) {
            const vf g = VLOAD(X_DT, dyr, j * VEC), v = VLOAD(X_DT, xr, j * VEC);
            const vf m = RMS_M(VROUND, g, VLOAD(W_DT, w, j * VEC) + offset);
            VSTORE(X_DT, dxr, j * VEC, rs * (m - v * cf) DR_V(j));
            VSTORE(F32, pr, j * VEC, VLOAD(F32, pr, j * VEC) + g * RMS_N(VROUND, v, rs));
        }
        for (int i = nv * VEC + lid; i < H; i += WG) {
            const float g = LOAD(X_DT, dyr, i), v = LOAD(X_DT, xr, i);
            const float m = RMS_M(SROUND, g, LOAD(W_DT, w, i) + offset);
            STORE(X_DT, dxr, i, rs * (m - v * cf) DR_S(i));
            pr[i] += g * RMS_N(SROUND, v, rs);
        }
    }
    }

#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv)
            VSTORE(F32, pr, j * VEC, acc[k]);
    }
}
#endif

/* ---- LayerNorm forward: y = (x - mean) * rstd * w [+ b] ------------------------------------ */

#ifdef HAS_B
#define B_ARGS const __global W_T *b, ulong b_off,
#define B_V(j) +VLOAD(W_DT, b, (j) * VEC)
#define B_S(i) +LOAD(W_DT, b, i)
#define B_RAW(r) +UNRAW(W_DT, r)
#else
#define B_ARGS
#define B_V(j)
#define B_S(i)
#define B_RAW(r)
#endif

#if NORM_BUILDS(3)
__kernel __attribute__((reqd_work_group_size(WG, ROWS, 1))) void
layernorm_fwd(const __global X_T *x, ulong x_off, long x_stride, long x_ostride,
              const __global W_T *w, ulong w_off, B_ARGS __global X_T *y, ulong y_off,
              long y_stride, long y_ostride, __global float *mean, ulong mean_off,
              __global float *rstd, ulong rstd_off, long n_rows, long inner, int H, float eps)
{
    __local float scratch[WG * ROWS];
    __local float *sc = scratch + get_local_id(1) * WG;
    const int lid = get_local_id(0);
    const long row = get_global_id(1);
    const bool live = row < n_rows;
    const long rr = live ? row : n_rows - 1;
    const int nv = H / VEC;
    x += x_off + ROW_OFF(x, rr);
    y += y_off + ROW_OFF(y, rr);
    w += w_off;
#ifdef HAS_B
    b += b_off;
#endif

    /* The row is cached as stored; w (and b) are loaded with it, so their latency hides behind
     * the reductions. */
    RAW(X_DT) c[CACHE];
    RAW(W_DT) wr[CACHE];
#ifdef HAS_B
    RAW(W_DT) br[CACHE];
#endif
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv) {
            c[k] = RLOAD(X_DT, x, j);
            wr[k] = RLOAD(W_DT, w, j);
#ifdef HAS_B
            br[k] = RLOAD(W_DT, b, j);
#endif
            s += VDOT(UNRAW(X_DT, c[k]), (vf)1.0f);
        }
    }
    for (int j = lid + CACHE * WG; j < nv; j += WG)
        s += VDOT(VLOAD(X_DT, x, j * VEC), (vf)1.0f);
    for (int i = nv * VEC + lid; i < H; i += WG)
        s += LOAD(X_DT, x, i);
    const float mu = row_sum(s, sc, 0) / (float)H;

    /* The variance from deviations, not E[x^2] - mu^2: exact for rows with a large mean. */
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv) {
            const vf dv = UNRAW(X_DT, c[k]) - mu;
            q += VDOT(dv, dv);
        }
    }
    for (int j = lid + CACHE * WG; j < nv; j += WG) {
        const vf dv = VLOAD(X_DT, x, j * VEC) - mu;
        q += VDOT(dv, dv);
    }
    for (int i = nv * VEC + lid; i < H; i += WG) {
        const float dv = LOAD(X_DT, x, i) - mu;
        q += dv * dv;
    }
    const float rs = rsqrt(row_sum(q, sc, 1) / (float)H + eps);
    if (!live)
        return;
    if (lid == 0) {
        mean[mean_off + row] = mu;
        rstd[rstd_off + row] = rs;
    }
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv)
            VSTORE(X_DT, y, j * VEC,
                   (UNRAW(X_DT, c[k]) - mu) * rs * UNRAW(W_DT, wr[k]) B_RAW(br[k]));
    }
    for (int j = lid + CACHE * WG; j < nv; j += WG)
        VSTORE(X_DT, y, j * VEC,
               (VLOAD(X_DT, x, j * VEC) - mu) * rs * VLOAD(W_DT, w, j * VEC) B_V(j));
    for (int i = nv * VEC + lid; i < H; i += WG)
        STORE(X_DT, y, i, (LOAD(X_DT, x, i) - mu) * rs * LOAD(W_DT, w, i) B_S(i));
}
#endif

/*
 * ---- LayerNorm backward: with xh = (x - mean) * rstd and g = dy * w,
 * dx = rstd * (g - mean(g) - xh * mean(g * xh)), dw = sum dy * xh, db = sum dy.
 */

#ifdef HAS_B
#define DB_ARGS __global float *dbpart, ulong dbpart_off,
#else
#define DB_ARGS
#endif

#if NORM_BUILDS(4)
__kernel __attribute__((reqd_work_group_size(WG, ROWS, 1))) void
layernorm_bwd(const __global X_T *dy, ulong dy_off, long dy_stride, long dy_ostride,
              const __global X_T *x, ulong x_off, long x_stride, long x_ostride,
              const __global W_T *w, ulong w_off, const __global float *mean, ulong mean_off,
              const __global float *rstd, ulong rstd_off, __global X_T *dx, ulong dx_off,
              long dx_stride, long dx_ostride, __global float *part, ulong part_off,
              long part_stride, DB_ARGS long n_rows, long inner, int H)
{
    __local float scratch[WG * ROWS];
    __local float *sc = scratch + get_local_id(1) * WG;
    const int lid = get_local_id(0);
    const int nv = H / VEC;
    w += w_off;
    mean += mean_off;
    rstd += rstd_off;
    dy += dy_off;
    x += x_off;
    dx += dx_off;
    const long slot_row = (get_group_id(1) * ROWS + get_local_id(1)) * part_stride;
    __global float *pr = part + part_off + slot_row;
#ifdef HAS_B
    __global float *pb = dbpart + dbpart_off + slot_row;
#endif
    for (int i = min(CACHE * WG, nv) * VEC + lid; i < H; i += WG) {
        pr[i] = 0.0f;
#ifdef HAS_B
        pb[i] = 0.0f;
#endif
    }
    RAW(W_DT) wc[CACHE];
    RAW(X_DT) ndy[CACHE], nx[CACHE];
    vf acc[CACHE];
#ifdef HAS_B
    vf accb[CACHE];
#endif
    float nmu, nrs; /* the next row's mean and rstd, loaded with its chunks */
    {
        const long r0 = min((long)(get_group_id(1) * ROWS + get_local_id(1)), n_rows - 1);
        nmu = mean[r0];
        nrs = rstd[r0];
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = min(lid + k * WG, nv - 1);
            wc[k] = RLOAD(W_DT, w, j);
            ndy[k] = RLOAD(X_DT, dy + ROW_OFF(dy, r0), j);
            nx[k] = RLOAD(X_DT, x + ROW_OFF(x, r0), j);
            acc[k] = 0.0f;
#ifdef HAS_B
            accb[k] = 0.0f;
#endif
        }
    }

    SLOT_LOOP_BEGIN
    const __global X_T *dyr = dy + ROW_OFF(dy, rr);
    const __global X_T *xr = x + ROW_OFF(x, rr);
    __global X_T *dxr = dx + ROW_OFF(dx, rr);
    const float mu = nmu, rs = nrs;

    RAW(X_DT) cdy[CACHE], cx[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        cdy[k] = ndy[k];
        cx[k] = nx[k];
    }
    if (more) {
        nmu = mean[nrow];
        nrs = rstd[nrow];
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = min(lid + k * WG, nv - 1);
            ndy[k] = RLOAD(X_DT, dy + ROW_OFF(dy, nrow), j);
            nx[k] = RLOAD(X_DT, x + ROW_OFF(x, nrow), j);
        }
    }

    /* x_hat = x rstd - mean rstd: one fma an element */
    const float nmr = -mu * rs;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; ++k)
        if (lid + k * WG < nv) {
            const vf gw = UNRAW(X_DT, cdy[k]) * UNRAW(W_DT, wc[k]);
            s1 += VDOT(gw, (vf)1.0f);
            s2 += VDOT(gw, fma(UNRAW(X_DT, cx[k]), (vf)rs, (vf)nmr));
        }
    for (int j = lid + CACHE * WG; j < nv; j += WG) {
        const vf gw = VLOAD(X_DT, dyr, j * VEC) * VLOAD(W_DT, w, j * VEC);
        s1 += VDOT(gw, (vf)1.0f);
        s2 += VDOT(gw, fma(VLOAD(X_DT, xr, j * VEC), (vf)rs, (vf)nmr));
    }
    for (int i = nv * VEC + lid; i < H; i += WG) {
        const float gw = LOAD(X_DT, dyr, i) * LOAD(W_DT, w, i);
        s1 += gw;
        s2 += gw * fma(LOAD(X_DT, xr, i), rs, nmr);
    }
    const float2 m = row_sum2((float2)(s1, s2), sc, side) / (float)H;
    /* dx = rstd (g w - m1 - x_hat m2) = rstd g w - (x_hat rstd m2 + rstd m1): two fmas */
    const float rm1 = rs * m.x, rm2 = rs * m.y;

    if (live) {
#pragma unroll
        for (int k = 0; k < CACHE; ++k) {
            const int j = lid + k * WG;
            if (j < nv) {
                const vf g = UNRAW(X_DT, cdy[k]);
                const vf xh = fma(UNRAW(X_DT, cx[k]), (vf)rs, (vf)nmr);
                VSTORE(X_DT, dxr, j * VEC,
                       fma((vf)rs, g * UNRAW(W_DT, wc[k]), -fma(xh, (vf)rm2, (vf)rm1)));
                acc[k] += g * xh;
#ifdef HAS_B
                accb[k] += g;
#endif
            }
        }
        for (int j = lid + CACHE * WG; j < nv; j += WG) {
            const vf g = VLOAD(X_DT, dyr, j * VEC);
            const vf xh = fma(VLOAD(X_DT, xr, j * VEC), (vf)rs, (vf)nmr);
            VSTORE(X_DT, dxr, j * VEC,
                   fma((vf)rs, g * VLOAD(W_DT, w, j * VEC), -fma(xh, (vf)rm2, (vf)rm1)));
            VSTORE(F32, pr, j * VEC, VLOAD(F32, pr, j * VEC) + g * xh);
#ifdef HAS_B
            VSTORE(F32, pb, j * VEC, VLOAD(F32, pb, j * VEC) + g);
#endif
        }
        for (int i = nv * VEC + lid; i < H; i += WG) {
            const float g = LOAD(X_DT, dyr, i);
            const float xh = fma(LOAD(X_DT, xr, i), rs, nmr);
            STORE(X_DT, dxr, i, fma(rs, g * LOAD(W_DT, w, i), -fma(xh, rm2, rm1)));
            pr[i] += g * xh;
#ifdef HAS_B
            pb[i] += g;
#endif
        }
    }
    }

#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
        const int j = lid + k * WG;
        if (j < nv) {
            VSTORE(F32, pr, j * VEC, acc[k]);
#ifdef HAS_B
            VSTORE(F32, pb, j * VEC, accb[k]);
#endif
        }
    }
}
#endif

/* ---- Second stage: dw[c] = sum over slots of part[slot, c], in a fixed order ---------------- */

/*
 * A work-item sums four adjacent columns over the slots ly, ly + FY, ... with 16-byte loads (the
 * partial rows are 32-byte aligned); the FY lanes' sums are then added in lane order. Work-groups
 * of z = 1 sum LayerNorm's db partials, the n_slots rows after the dw ones, into db.
 */
#if NORM_BUILDS(5)
__kernel __attribute__((reqd_work_group_size(FX, FY, 1))) void
norm_dw_reduce(const __global float *part, ulong part_off, long part_stride, int n_slots, int H,
               __global W_T *dw, ulong dw_off, __global W_T *db, ulong db_off)
{
    __local float4 sc[FY][FX];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const long c = (long)get_global_id(0) * 4;
    const __global float *p = part + part_off + get_group_id(2) * n_slots * part_stride + c;
    float4 s = 0.0f;
    if (c < H) {
#pragma unroll 4
        for (int j = ly; j < n_slots; j += FY)
            s += *(const __global float4 *)(p + j * part_stride);
    }
    sc[ly][lx] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ly == 0 && c < H) {
        float4 t = sc[0][lx];
        for (int k = 1; k < FY; ++k)
            t += sc[k][lx];
        __global W_T *out = get_group_id(2) ? db + db_off : dw + dw_off;
        const float v[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (c + k < H)
                STORE(W_DT, out, c + k, v[k]);
    }
}
#endif
