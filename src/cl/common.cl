/*
 * common.cl: prepended by the runtime to every kernel family. Storage types and their conversions,
 * vector loads and stores, and work-group reductions. What only some families use is a prelude
 * of its own, which the runtime puts after this file for the families that declare it
 * (src/runtime/program.c's family table): mma.cl, vec_io.cl, ce_logit.cl.
 *
 * Storage is selected per tensor with a dtype macro (F32, BF16, F16, I32, I64) that the runtime
 * passes as -D options, e.g. -DX_DT=BF16; kernels then write STORAGE(X_DT), LOAD(X_DT, p, i) and
 * STORE(X_DT, p, i, v). 16-bit types are stored as ushort: bf16 is bit arithmetic with
 * round-to-nearest-even (vectors through sm_80's paired cvt on NVIDIA), f16 goes through core
 * vload_half/vstore_half_rte, so neither needs cl_khr_fp16. Math is always f32.
 *
 * The runtime defines LLMCL_NV_PTX where NVIDIA's inline PTX builds, and LLMCL_NV_BF16_CVT where
 * it also has cvt.rn.bf16x2.f32 (compute capability 8.0 or later).
 */

#define LLMCL_CAT_(a, b) a##b
#define LLMCL_CAT(a, b) LLMCL_CAT_(a, b)

typedef float storage_F32;
typedef ushort storage_BF16;
typedef ushort storage_F16;
typedef int storage_I32;
typedef long storage_I64;

#define STORAGE(DT) LLMCL_CAT(storage_, DT)
#define LOAD(DT, p, i) LLMCL_CAT(load_, DT)((p), (i))
#define STORE(DT, p, i, v) LLMCL_CAT(store_, DT)((p), (i), (v))
#define LOAD4(DT, p, i) LLMCL_CAT(load4_, DT)((p), (i))
#define STORE4(DT, p, i, v) LLMCL_CAT(store4_, DT)((p), (i), (v))

inline float bf16_to_f32(ushort h) { return as_float((uint)h << 16); }

inline ushort f32_to_bf16(float f)
{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x0040u); /* keep NaN a NaN: set the quiet bit */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

inline float2 bf16x2_to_f32(ushort2 h) { return as_float2(convert_uint2(h) << 16); }
inline float4 bf16x4_to_f32(ushort4 h) { return as_float4(convert_uint4(h) << 16); }

/*
 * Eight bf16 packed two to a 32-bit word (element 2k in the low half of word k), as 16-byte loads
 * and stores move them: a uint4 takes four registers where a ushort8 may take eight.
 */
inline float8 bf16x8_packed_to_f32(uint4 r)
{
    return as_float8(convert_uint8(as_ushort8(r)) << 16);
}

#ifdef LLMCL_NV_BF16_CVT
/* NVIDIA sm_80+: one instruction rounds two floats (nearest even; a NaN becomes the canonical
 * NaN), where the bit arithmetic takes about six per element. */
inline uint bf16x2_rn(float lo, float hi)
{
    uint r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
inline ushort2 f32x2_to_bf16(float2 f) { return as_ushort2(bf16x2_rn(f.x, f.y)); }
inline ushort4 f32x4_to_bf16(float4 f)
{
    return as_ushort4((uint2)(bf16x2_rn(f.x, f.y), bf16x2_rn(f.z, f.w)));
}
/* Two floats to f16 (nearest even) in one instruction as well. */
inline uint f32x2_to_f16_packed(float2 f)
{
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f.y), "f"(f.x));
    return r;
}
inline uint4 f32x8_to_bf16_packed(float8 f)
{
    return (uint4)(bf16x2_rn(f.s0, f.s1), bf16x2_rn(f.s2, f.s3), bf16x2_rn(f.s4, f.s5),
                   bf16x2_rn(f.s6, f.s7));
}
/* Eight values rounded to bf16 and back to f32, as a cast to bf16 would do. */
inline float8 bf16x8_round(float8 f) { return bf16x8_packed_to_f32(f32x8_to_bf16_packed(f)); }
#else
/* Rounding (nearest even, NaN kept a quiet NaN) leaves the bf16 bits in the upper half of each
 * word: that is the rounded f32 value, and packing takes one shift and one or a pair. */
inline float8 bf16x8_round(float8 f)
{
    const uint8 u = as_uint8(f);
    const uint8 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return as_float8(
        select(r, (u & 0xffff0000u) | 0x00400000u, (u & 0x7fffffffu) > 0x7f800000u));
}
inline ushort2 f32x2_to_bf16(float2 f) { return (ushort2)(f32_to_bf16(f.x), f32_to_bf16(f.y)); }
inline ushort4 f32x4_to_bf16(float4 f)
{
    return (ushort4)(f32_to_bf16(f.x), f32_to_bf16(f.y), f32_to_bf16(f.z), f32_to_bf16(f.w));
}
inline uint4 f32x8_to_bf16_packed(float8 f)
{
    const uint8 b = as_uint8(bf16x8_round(f));
    return (uint4)(b.s0 >> 16 | b.s1, b.s2 >> 16 | b.s3, b.s4 >> 16 | b.s5, b.s6 >> 16 | b.s7);
}
#endif

inline float8 bf16x8_to_f32(ushort8 h) { return bf16x8_packed_to_f32(as_uint4(h)); }
inline ushort8 f32x8_to_bf16(float8 f) { return as_ushort8(f32x8_to_bf16_packed(f)); }

inline float load_F32(const __global float *p, long i) { return p[i]; }
inline float load_BF16(const __global ushort *p, long i) { return bf16_to_f32(p[i]); }
inline float load_F16(const __global ushort *p, long i)
{
    return vload_half(i, (const __global half *)p);
}
inline void store_F32(__global float *p, long i, float v) { p[i] = v; }
inline void store_BF16(__global ushort *p, long i, float v) { p[i] = f32_to_bf16(v); }
inline void store_F16(__global ushort *p, long i, float v)
{
    vstore_half_rte(v, i, (__global half *)p);
}

/* Four consecutive elements from p + i; p + i needs only the element's alignment. */
inline float4 load4_F32(const __global float *p, long i) { return vload4(0, p + i); }
inline float4 load4_BF16(const __global ushort *p, long i) { return bf16x4_to_f32(vload4(0, p + i)); }
inline float4 load4_F16(const __global ushort *p, long i)
{
    return vload_half4(0, (const __global half *)(p + i));
}
inline void store4_F32(__global float *p, long i, float4 v) { vstore4(v, 0, p + i); }
inline void store4_BF16(__global ushort *p, long i, float4 v) { vstore4(f32x4_to_bf16(v), 0, p + i); }
inline void store4_F16(__global ushort *p, long i, float4 v)
{
    vstore_half4_rte(v, 0, (__global half *)(p + i));
}

/* n contiguous floats of local memory from p (16-byte aligned when n % 4 == 0) into dst[]. */
#define LDS_RUN(dst, n, p)                                                                        \
    do {                                                                                          \
        if ((n) % 4 == 0) {                                                                       \
            for (int q_ = 0; q_ < (n); q_ += 4) {                                                 \
                const float4 t_ = *(const __local float4 *)((p) + q_);                            \
                dst[q_] = t_.x;                                                                   \
                dst[q_ + 1] = t_.y;                                                               \
                dst[q_ + 2] = t_.z;                                                               \
                dst[q_ + 3] = t_.w;                                                               \
            }                                                                                     \
        } else {                                                                                  \
            for (int q_ = 0; q_ < (n); ++q_)                                                      \
                dst[q_] = (p)[q_];                                                                \
        }                                                                                         \
    } while (0)

/* Integers load as themselves; kernels on labels and positions use these. */
inline long load_I32(const __global int *p, long i) { return p[i]; }
inline long load_I64(const __global long *p, long i) { return p[i]; }
inline void store_I32(__global int *p, long i, long v) { p[i] = (int)v; }
inline void store_I64(__global long *p, long i, long v) { p[i] = v; }

#ifdef LLMCL_NV_PTX
/*
 * NVIDIA: 16-byte global accesses with cache hints. Streamed operands skip L1 allocation (through
 * the read-only path, .nc, only when nothing in the launch writes them); streaming stores (.cs)
 * mark lines as first to evict.
 */
#define LLMCL_LD16(NAME, LD)                                                                      \
    inline uint4 NAME(const __global void *p)                                                     \
    {                                                                                             \
        uint4 v;                                                                                  \
        asm volatile(LD ".v4.u32 {%0, %1, %2, %3}, [%4];"                                         \
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                 \
                     : "l"((ulong)p));                                                            \
        return v;                                                                                 \
    }
LLMCL_LD16(ld16_no_l1, "ld.global.L1::no_allocate")
LLMCL_LD16(ld16_nc_no_l1, "ld.global.nc.L1::no_allocate")
inline void st16_streaming(__global void *p, uint4 v)
{
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"((ulong)p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

/*
 * NVIDIA: butterfly shuffles within a warp of 32 (inline PTX; the driver has no cl_khr_subgroups).
 * The _in forms reduce within aligned groups of `width` lanes (a power of two up to 32).
 */
inline float warp_sum_in(float v, int width)
{
    for (int o = width / 2; o > 0; o >>= 1) {
        float t;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(t) : "f"(v), "r"(o));
        v += t;
    }
    return v;
}

inline float warp_max_in(float v, int width)
{
    for (int o = width / 2; o > 0; o >>= 1) {
        float t;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(t) : "f"(v), "r"(o));
        v = fmax(v, t);
    }
    return v;
}

inline float warp_sum(float v) { return warp_sum_in(v, 32); }
inline float warp_max(float v) { return warp_max_in(v, 32); }
#endif

/*
 * Work-group reductions over dimension 0, in a fixed order. Every work-item receives the result.
 * scratch holds at least get_local_size(0) values of T and may be reused right after the call
 * returns. LLMCL_WG_REDUCE_T makes one for any type and associative OP; LLMCL_WG_REDUCE one of
 * floats, where WARP_OP may reduce each warp first.
 */
#define LLMCL_WG_REDUCE_T(NAME, T, OP, WARP_OP)                                                   \
    inline T NAME(T v, __local T *scratch)                                                        \
    {                                                                                             \
        const uint lid = get_local_id(0), n = get_local_size(0);                                  \
        WARP_OP                                                                                   \
        scratch[lid] = v;                                                                         \
        barrier(CLK_LOCAL_MEM_FENCE);                                                             \
        for (uint s = (n & (n - 1)) ? (1u << (31 - clz(n))) : n / 2; s > 0; s >>= 1) {            \
            if (lid < s && lid + s < n)                                                           \
                scratch[lid] = OP(scratch[lid], scratch[lid + s]);                                \
            barrier(CLK_LOCAL_MEM_FENCE);                                                         \
        }                                                                                         \
        const T r = scratch[0];                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                             \
        return r;                                                                                 \
    }
#define LLMCL_WG_REDUCE(NAME, OP, WARP_OP) LLMCL_WG_REDUCE_T(NAME, float, OP, WARP_OP)

#define LLMCL_ADD(a, b) ((a) + (b))

#ifdef LLMCL_NV_PTX
/* Warps reduce with shuffles first, so the local-memory tree runs over n / 32 values. */
#define LLMCL_WARP_STAGE(WOP, OP)                                                                 \
    if ((n & 31u) == 0) {                                                                         \
        v = WOP(v);                                                                               \
        if ((lid & 31u) == 0)                                                                     \
            scratch[lid >> 5] = v;                                                                \
        barrier(CLK_LOCAL_MEM_FENCE);                                                             \
        float r = scratch[0];                                                                     \
        for (uint w = 1; w < (n >> 5); ++w)                                                       \
            r = OP(r, scratch[w]);                                                                \
        barrier(CLK_LOCAL_MEM_FENCE);                                                             \
        return r;                                                                                 \
    }
LLMCL_WG_REDUCE(wg_sum, LLMCL_ADD, LLMCL_WARP_STAGE(warp_sum, LLMCL_ADD))
LLMCL_WG_REDUCE(wg_max, fmax, LLMCL_WARP_STAGE(warp_max, fmax))
#else
LLMCL_WG_REDUCE(wg_sum, LLMCL_ADD, )
LLMCL_WG_REDUCE(wg_max, fmax, )
#endif
