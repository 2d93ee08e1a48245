/*
 * glu.cl: gated linear units (SwiGLU, GeGLU) forward and backward, and the activations alone.
 *
 * Every kernel walks a matrix of n_rows rows of `cols` elements; each tensor is a base pointer, an
 * element offset and a row stride (the last dimension is unit-stride). A packed [N, 2I] gate/up
 * tensor arrives as two such tensors on one buffer, the second offset by I, so the kernels have no
 * packed mode. Work-item (c, r) of a 2-D range handles VEC consecutive columns from c * VEC of row
 * r, striding over the grid in both dimensions (64-bit indices). Each work-item reads all its
 * inputs before it writes, so an output may be the same view as an input (in place).
 *
 * Defines (the launcher sets them):
 *   DT      storage of every tensor: F32, BF16 or F16 (math in f32).
 *   ACT     0 SiLU, 1 GELU tanh form, 2 GELU exact (erf).
 *   HAS_UP  1: glu_fwd gives act(g) * u, glu_bwd gives dg and du; 0: the activation alone,
 *           glu_fwd gives act(g), glu_bwd gives dg = dy * act'(g).
 *   FAST    1: native exp and reciprocal (the launcher sets it for 16-bit storage); 0: precise.
 *   ALIGNED 1: every row start is a multiple of VEC elements, so loads and stores are whole
 *           vectors (16 bytes for VEC 8 of 16-bit or VEC 4 of f32); 0: element-aligned vloadn
 *           with a scalar tail per row, for odd row lengths and strides.
 *   NOALIAS 1: no output shares a buffer with an input, so loads may take the read-only path.
 *   RAW16   1: bf16 vectors of 8 held as stored until the math (vec_io.cl's raw vectors): where
 *           ALIGNED and VEC is 8.
 * Tunables (kernel keys glu_fwd, glu_bwd, act_fwd, act_bwd; size key: the row length; rows that
 * follow each other in every operand are launched as one long row):
 *   VEC     columns per vector: 1, 2, 4 or 8 (default 8 for 16-bit storage, 4 for f32).
 *   UNROLL  vectors per work-item, all loaded before any is stored (16-bit vectors of 8 held as
 *           stored until the math): 1 to 8 (default 1).
 *   WG      work-group size, a launch parameter (the launcher splits it into columns x rows):
 *           32 to the device's maximum, a power of two (default 256; 128 on NVIDIA).
 *   HINT    NVIDIA only (LLMCL_NV_PTX), on aligned 16-byte vectors of bf16 or f32 (else ignored):
 *           bit 0: loads without L1 allocation, through the read-only path when NOALIAS
 *           (ld.global.nc.L1::no_allocate); bit 1: streaming stores (st.global.cs): 0 to 3
 *           (default 0; 2 on NVIDIA).
 */

#ifndef DT
#define DT F32
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef HAS_UP
#define HAS_UP 1
#endif
#ifndef ALIGNED
#define ALIGNED 0
#endif
#ifndef FAST
#define FAST 0
#endif
#ifndef VEC
#define VEC 8
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef HINT
#define HINT 0
#endif
#ifndef NOALIAS
#define NOALIAS 0
#endif

/* ---- VEC-wide loads and stores: aligned vector pointers, or vloadn where unaligned ---- */

#if VEC == 1
typedef float floatv;
#define VLOAD(p, i) LOAD(DT, p, i)
#define VSTORE(p, i, v) STORE(DT, p, i, v)
#else
typedef LLMCL_CAT(float, VEC) floatv;
#define VLOAD(p, i) LLMCL_CAT(vload_, DT)((p), (i))
#define VSTORE(p, i, v) LLMCL_CAT(vstore_, DT)((p), (i), (v))

#define bf16v_to_f32 LLMCL_CAT(LLMCL_CAT(bf16x, VEC), _to_f32)
#define f32v_to_bf16 LLMCL_CAT(LLMCL_CAT(f32x, VEC), _to_bf16)

#if ALIGNED
LLMCL_VEC_IO_ALIGNED()
#else
inline floatv vload_F32(const __global float *p, long i)
{
    return LLMCL_CAT(vload, VEC)(0, p + i);
}
inline floatv vload_BF16(const __global ushort *p, long i)
{
    return bf16v_to_f32(LLMCL_CAT(vload, VEC)(0, p + i));
}
/* f16 loads and stores go element by element: PoCL 3.1's vload_half8 and vstore_half8_rte use
 * aligned vector instructions and fault on addresses that are not 16-byte aligned. */
inline floatv vload_F16(const __global ushort *p, long i)
{
    float a[VEC];
    for (int j = 0; j < VEC; ++j)
        a[j] = vload_half(i + j, (const __global half *)p);
    return LLMCL_CAT(vload, VEC)(0, a);
}
inline void vstore_F32(__global float *p, long i, floatv v)
{
    LLMCL_CAT(vstore, VEC)(v, 0, p + i);
}
inline void vstore_BF16(__global ushort *p, long i, floatv v)
{
    LLMCL_CAT(vstore, VEC)(f32v_to_bf16(v), 0, p + i);
}
inline void vstore_F16(__global ushort *p, long i, floatv v)
{
    float a[VEC];
    LLMCL_CAT(vstore, VEC)(v, 0, a);
    for (int j = 0; j < VEC; ++j)
        vstore_half_rte(a[j], i + j, (__global half *)p);
}
#endif
#endif

/* ---- activations: value, and derivative with the value as a by-product ---- */

#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f
#define SQRT1_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/*
 * FAST: native exp and reciprocal (a few ulps) where the output is 16-bit and its rounding (2^-9
 * for bf16, 2^-12 for f16) hides them, sparing the ALU work of the precise forms, which on a GPU
 * rivals the memory time; f32 outputs use the precise built-ins.
 */
#if FAST
#define EXP(x) native_exp(x)
#define RECIP(x) native_recip(x)
#else
#define EXP(x) exp(x)
#define RECIP(x) (1.0f / (x))
#endif

#if ACT == 0
inline floatv act_fwd(floatv x)
{
    return x * RECIP(1.0f + EXP(-x));
}
inline floatv act_bwd(floatv x, floatv *a)
{
    const floatv s = RECIP(1.0f + EXP(-x));
    *a = x * s;
    return s * (1.0f + x * (1.0f - s));
}
#elif ACT == 1
/*
 * 0.5 x (1 + tanh(u)) is x sigmoid(2 u): the forward takes SiLU's few operations, where a tanh
 * cost it a fifth of its time on the H200 (81% of copy). The backward takes s = sigmoid(2 u) and
 * s (1 - s) = e / (1 + e)^2 through e = exp(-2 |u|), which cannot overflow: in the tails
 * s (1 - s) comes out as the tiny (or zero) value it is, where 1 - s with an s that rounds to
 * 1 - ulp would be 6e-8, enough to spoil x^3-sized derivatives.
 */
inline floatv act_fwd(floatv x)
{
    return x * RECIP(1.0f + EXP(-2.0f * GELU_K0 * (x + GELU_K1 * x * x * x)));
}
inline floatv act_bwd(floatv x, floatv *a)
{
    const floatv u = GELU_K0 * (x + GELU_K1 * x * x * x);
    const floatv e = EXP(-2.0f * fabs(u));
    const floatv r = RECIP(1.0f + e);
    const floatv s = select(e * r, r, u >= 0.0f);
    *a = x * s;
    return s + 2.0f * GELU_K0 * x * e * r * r * (1.0f + 3.0f * GELU_K1 * x * x);
}
#else
inline floatv act_fwd(floatv x)
{
    return 0.5f * x * (1.0f + erf(x * SQRT1_2));
}
inline floatv act_bwd(floatv x, floatv *a)
{
    const floatv cdf = 0.5f * (1.0f + erf(x * SQRT1_2));
    *a = x * cdf;
    return cdf + x * INV_SQRT_2PI * EXP(-0.5f * x * x);
}
#endif

/* The scalar tail of a row when ALIGNED is 0 and cols is not a multiple of VEC. */
#if VEC == 1
#define TAIL_SLOTS(cols) 0
#else
#define TAIL_SLOTS(cols) (((cols) % VEC) ? 1 : 0)
#endif

/* Scalar versions for the tail, through the same vector functions when VEC is 1. */
#if VEC == 1
#define act_fwd1 act_fwd
#define act_bwd1 act_bwd
#else
inline float act_fwd1(float x)
{
    floatv a = act_fwd((floatv)x);
    return a.s0;
}
inline float act_bwd1(float x, float *a)
{
    floatv av;
    const floatv d = act_bwd((floatv)x, &av);
    *a = av.s0;
    return d.s0;
}
#endif

/*
 * Both kernels: a work-group takes a contiguous block of UNROLL * L vectors of each of its rows (L
 * its width in columns), item l vectors l, l + L, ..., l + (UNROLL - 1) L of the block, loading
 * all of them before storing any (each access coalesced, UNROLL loads in flight); blocks stride
 * over the grid. The item whose vector index equals `full` does the row's scalar tail.
 */

/* out = act(g) * u (HAS_UP) or act(g). */
__kernel void glu_fwd(const __global STORAGE(DT) *g, ulong g_off, long g_rs,
                      const __global STORAGE(DT) *u, ulong u_off, long u_rs,
                      __global STORAGE(DT) *o, ulong o_off, long o_rs, long n_rows, long cols)
{
    const long full = cols / VEC, slots = full + TAIL_SLOTS(cols);
    const long l = get_local_size(0), step = get_global_size(0) * UNROLL;
    const long first = get_group_id(0) * l * UNROLL + get_local_id(0);
    for (long r = get_global_id(1); r < n_rows; r += get_global_size(1)) {
        const long gr = g_off + r * g_rs, ur = u_off + r * u_rs, orow = o_off + r * o_rs;
        for (long c0 = first; c0 < slots; c0 += step) {
            VRAW gv[UNROLL], uv[UNROLL];
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long c = c0 + j * l;
                if (c < full) {
                    gv[j] = VRAW_LOAD(g, gr + c * VEC);
#if HAS_UP
                    uv[j] = VRAW_LOAD(u, ur + c * VEC);
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long c = c0 + j * l;
                if (c < full) {
                    floatv y = act_fwd(VRAW_F32(gv[j]));
#if HAS_UP
                    y *= VRAW_F32(uv[j]);
#endif
                    VSTORE(o, orow + c * VEC, y);
                } else if (c == full) {
                    for (long i = full * VEC; i < cols; ++i) {
                        float y = act_fwd1(LOAD(DT, g, gr + i));
#if HAS_UP
                        y *= LOAD(DT, u, ur + i);
#endif
                        STORE(DT, o, orow + i, y);
                    }
                }
            }
        }
    }
}

/* dg = dy * u * act'(g), du = dy * act(g) (HAS_UP); or dg = dy * act'(g). */
__kernel void glu_bwd(const __global STORAGE(DT) *dy, ulong dy_off, long dy_rs,
                      const __global STORAGE(DT) *g, ulong g_off, long g_rs,
                      const __global STORAGE(DT) *u, ulong u_off, long u_rs,
                      __global STORAGE(DT) *dg, ulong dg_off, long dg_rs,
                      __global STORAGE(DT) *du, ulong du_off, long du_rs, long n_rows, long cols)
{
    const long full = cols / VEC, slots = full + TAIL_SLOTS(cols);
    const long l = get_local_size(0), step = get_global_size(0) * UNROLL;
    const long first = get_group_id(0) * l * UNROLL + get_local_id(0);
    for (long r = get_global_id(1); r < n_rows; r += get_global_size(1)) {
        const long yr = dy_off + r * dy_rs, gr = g_off + r * g_rs, ur = u_off + r * u_rs;
        const long dgr = dg_off + r * dg_rs, dur = du_off + r * du_rs;
        for (long c0 = first; c0 < slots; c0 += step) {
            VRAW dv[UNROLL], gv[UNROLL], uv[UNROLL];
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long c = c0 + j * l;
                if (c < full) {
                    dv[j] = VRAW_LOAD(dy, yr + c * VEC);
                    gv[j] = VRAW_LOAD(g, gr + c * VEC);
#if HAS_UP
                    uv[j] = VRAW_LOAD(u, ur + c * VEC);
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < UNROLL; ++j) {
                const long c = c0 + j * l;
                if (c < full) {
                    floatv a;
                    const floatv da = act_bwd(VRAW_F32(gv[j]), &a), d = VRAW_F32(dv[j]);
#if HAS_UP
                    VSTORE(dg, dgr + c * VEC, d * VRAW_F32(uv[j]) * da);
                    VSTORE(du, dur + c * VEC, d * a);
#else
                    VSTORE(dg, dgr + c * VEC, d * da);
#endif
                } else if (c == full) {
                    for (long i = full * VEC; i < cols; ++i) {
                        const float d = LOAD(DT, dy, yr + i);
                        float a;
                        const float da = act_bwd1(LOAD(DT, g, gr + i), &a);
#if HAS_UP
                        const float up = LOAD(DT, u, ur + i);
                        STORE(DT, dg, dgr + i, d * up * da);
                        STORE(DT, du, dur + i, d * a);
#else
                        STORE(DT, dg, dgr + i, d * da);
#endif
                    }
                }
            }
        }
    }
}
