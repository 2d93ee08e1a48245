/*
 * row_io.cl: 8-element aligned loads and stores (16-byte accesses) of f32, bf16 and f16 rows, with
 * the horizontal reductions of eight lanes: a prelude of the families that walk vocabulary rows
 * (cross_entropy.cl, distill.cl, preference.cl; src/runtime/program.c's family table). Their
 * own, not vec_io.cl's: with vec_io's bf16 load (a uint8 built, then bitcast) the H200 ran the
 * cross-entropy's forward on logits at 1.23 ms where this one (the floats built one by one) runs
 * 0.77.
 */

inline float8 load8_F32(const __global float *p, long i)
{
    const __global float4 *q = (const __global float4 *)(p + i);
    return (float8)(q[0], q[1]);
}
inline float8 load8_BF16(const __global ushort *p, long i)
{
    const uint4 u = *(const __global uint4 *)(p + i);
    const uint4 lo = u << 16, hi = u & (uint4)0xffff0000u;
    return (float8)(as_float(lo.x), as_float(hi.x), as_float(lo.y), as_float(hi.y),
                    as_float(lo.z), as_float(hi.z), as_float(lo.w), as_float(hi.w));
}
inline float8 load8_F16(const __global ushort *p, long i)
{
    return vloada_half8(0, (const __global half *)(p + i));
}
inline void store8_F32(__global float *p, long i, float8 v)
{
    __global float4 *q = (__global float4 *)(p + i);
    q[0] = v.lo;
    q[1] = v.hi;
}
inline void store8_BF16(__global ushort *p, long i, float8 v)
{
    const uint4 lo =
        (uint4)(f32_to_bf16(v.s0), f32_to_bf16(v.s2), f32_to_bf16(v.s4), f32_to_bf16(v.s6));
    const uint4 hi =
        (uint4)(f32_to_bf16(v.s1), f32_to_bf16(v.s3), f32_to_bf16(v.s5), f32_to_bf16(v.s7));
    *(__global uint4 *)(p + i) = lo | (hi << 16);
}
inline void store8_F16(__global ushort *p, long i, float8 v)
{
    vstorea_half8_rte(v, 0, (__global half *)(p + i));
}

inline float hmax8(float8 v)
{
    const float4 a = fmax(v.lo, v.hi);
    return fmax(fmax(a.x, a.y), fmax(a.z, a.w));
}
inline float hsum8(float8 v)
{
    const float4 a = v.lo + v.hi;
    return (a.x + a.y) + (a.z + a.w);
}

/* a b, but 0 when a is 0 even if b is infinite. */
inline float mul0(float a, float b)
{
    return a != 0.0f ? a * b : 0.0f;
}
