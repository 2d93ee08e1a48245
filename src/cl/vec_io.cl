/*
 * vec_io.cl: a prelude of the families whose work-items stream consecutive elements of a row
 * (elementwise, norm, optim, glu, rope, matmul's split sums, attention's delta pass; the runtime
 * puts it after common.cl, src/runtime/program.c's family table).
 *
 * load8_DT(p, i) and store8_DT(p, i, v) (DT F32, BF16, F16): eight elements at p + i, which must
 * be 16-byte aligned, as f32 (16-byte accesses for 16-bit storage, two for f32). load4a_DT and
 * store4a_DT: four elements at p + i aligned to their whole size (one access of 16 or 8 bytes).
 *
 * VEC-wide accesses of a row in the storage dtype as f32 vectors: LLMCL_VEC_IO_ALIGNED() defines
 * vload_DT(p, i) and vstore_DT(p, i, v) (DT F32, BF16, F16) for element i a multiple of VEC:
 * whole-vector accesses, 16-byte ones (VEC 4 of f32, 8 of bf16) through ld16(p) and st16(p, v)
 * (below: uint4 from and to a 16-byte aligned global address, with the build's cache hints). The
 * family defines VEC (2, 4 or 8) and the vector type floatv before instantiating it.
 */

/*
 * Eight packed bf16 to f32 by shift and mask. bf16x8_packed_to_f32 (a convert) computes the same;
 * on the H100 this form makes rmsnorm_fwd 7% and layernorm_bwd 8% faster, the convert makes rope 7%
 * faster (docs/PERFORMANCE.md).
 */
inline float8 bf16x8_masked_to_f32(uint4 r)
{
    const uint4 lo = r << 16, hi = r & 0xffff0000u;
    return as_float8((uint8)(lo.x, hi.x, lo.y, hi.y, lo.z, hi.z, lo.w, hi.w));
}

inline float8 load8_F32(const __global float *p, long i)
{
    const __global float4 *q = (const __global float4 *)(p + i);
    return (float8)(q[0], q[1]);
}
inline float8 load8_BF16(const __global ushort *p, long i)
{
    return bf16x8_masked_to_f32(*(const __global uint4 *)(p + i));
}
inline float8 load8_F16(const __global ushort *p, long i)
{
    return vload_half8(0, (const __global half *)(p + i));
}
inline void store8_F32(__global float *p, long i, float8 v)
{
    __global float4 *q = (__global float4 *)(p + i);
    q[0] = v.lo;
    q[1] = v.hi;
}
inline void store8_BF16(__global ushort *p, long i, float8 v)
{
    *(__global uint4 *)(p + i) = f32x8_to_bf16_packed(v);
}
inline void store8_F16(__global ushort *p, long i, float8 v)
{
    vstore_half8_rte(v, 0, (__global half *)(p + i));
}

inline float4 load4a_F32(const __global float *p, long i)
{
    return *(const __global float4 *)(p + i);
}
inline float4 load4a_BF16(const __global ushort *p, long i)
{
    return bf16x4_to_f32(*(const __global ushort4 *)(p + i));
}
inline float4 load4a_F16(const __global ushort *p, long i)
{
    return vloada_half4(0, (const __global half *)(p + i));
}
inline void store4a_F32(__global float *p, long i, float4 v) { *(__global float4 *)(p + i) = v; }
inline void store4a_BF16(__global ushort *p, long i, float4 v)
{
    *(__global ushort4 *)(p + i) = f32x4_to_bf16(v);
}
inline void store4a_F16(__global ushort *p, long i, float4 v)
{
    vstorea_half4_rte(v, 0, (__global half *)(p + i));
}

/*
 * ld16 and st16: 16-byte accesses with NVIDIA's cache hints, as the build's HINT bits ask (bit 0:
 * loads that skip L1, through the read-only path where NOALIAS says that no output shares a buffer
 * with an input; bit 1: streaming stores), or plain ones. The launchers pass HINT and NOALIAS
 * where a family takes them; absent, they are 0, the families' defaults.
 */
#if defined(LLMCL_NV_PTX) && defined(HINT) && (HINT & 1) && defined(NOALIAS) && NOALIAS
#define ld16(p) ld16_nc_no_l1(p)
#elif defined(LLMCL_NV_PTX) && defined(HINT) && (HINT & 1)
#define ld16(p) ld16_no_l1(p)
#else
#define ld16(p) (*(const __global uint4 *)(p))
#endif
#if defined(LLMCL_NV_PTX) && defined(HINT) && (HINT & 2)
#define st16(p, v) st16_streaming((p), (v))
#else
#define st16(p, v) (*(__global uint4 *)(p) = (v))
#endif

#define LLMCL_VLD_F32_2(p) (*(const __global float2 *)(p))
#define LLMCL_VLD_F32_4(p) as_float4(ld16(p))
#define LLMCL_VLD_F32_8(p) (*(const __global float8 *)(p))
#define LLMCL_VST_F32_2(p, v) (*(__global float2 *)(p) = (v))
#define LLMCL_VST_F32_4(p, v) st16((p), as_uint4(v))
#define LLMCL_VST_F32_8(p, v) (*(__global float8 *)(p) = (v))
#define LLMCL_VLD_BF16_2(p) bf16x2_to_f32(*(const __global ushort2 *)(p))
#define LLMCL_VLD_BF16_4(p) bf16x4_to_f32(*(const __global ushort4 *)(p))
#define LLMCL_VLD_BF16_8(p) bf16x8_packed_to_f32(ld16(p))
#define LLMCL_VST_BF16_2(p, v) (*(__global ushort2 *)(p) = f32x2_to_bf16(v))
#define LLMCL_VST_BF16_4(p, v) (*(__global ushort4 *)(p) = f32x4_to_bf16(v))
#define LLMCL_VST_BF16_8(p, v) st16((p), f32x8_to_bf16_packed(v))
#define LLMCL_VEC_IO_ALIGNED()                                                                    \
    inline floatv vload_F32(const __global float *p, long i)                                      \
    {                                                                                             \
        return LLMCL_CAT(LLMCL_VLD_F32_, VEC)(p + i);                                             \
    }                                                                                             \
    inline floatv vload_BF16(const __global ushort *p, long i)                                    \
    {                                                                                             \
        return LLMCL_CAT(LLMCL_VLD_BF16_, VEC)(p + i);                                            \
    }                                                                                             \
    inline floatv vload_F16(const __global ushort *p, long i)                                     \
    {                                                                                             \
        return LLMCL_CAT(vloada_half, VEC)(0, (const __global half *)(p + i));                    \
    }                                                                                             \
    inline void vstore_F32(__global float *p, long i, floatv v)                                   \
    {                                                                                             \
        LLMCL_CAT(LLMCL_VST_F32_, VEC)(p + i, v);                                                 \
    }                                                                                             \
    inline void vstore_BF16(__global ushort *p, long i, floatv v)                                 \
    {                                                                                             \
        LLMCL_CAT(LLMCL_VST_BF16_, VEC)(p + i, v);                                                \
    }                                                                                             \
    inline void vstore_F16(__global ushort *p, long i, floatv v)                                  \
    {                                                                                             \
        LLMCL_CAT(LLMCL_CAT(vstorea_half, VEC), _rte)(v, 0, (__global half *)(p + i));            \
    }

/*
 * Raw vectors (glu, rope): what a work-item holds between its loads and its math. Where the
 * launcher defines RAW16 as 1 (bf16 in aligned vectors of 8 or 4), a vector stays as stored, a
 * uint4 or uint2 of half the registers of its f32 values, so that the vectors in flight leave room
 * for more work-groups, and converts where the math takes it; otherwise, and for f32 and f16, it
 * is the family's floatv from its VLOAD(p, i). VRAW is the type, VRAW_LOAD(p, i) the load and
 * VRAW_F32(r) the f32 vector.
 */
#if defined(RAW16) && RAW16 && VEC == 8
#define vraw_BF16 uint4
#define vraw_load_BF16(p, i) ld16((p) + (i))
#define vraw_f32_BF16 bf16x8_packed_to_f32
#elif defined(RAW16) && RAW16 && VEC == 4
#define vraw_BF16 uint2
#define vraw_load_BF16(p, i) (*(const __global uint2 *)((p) + (i)))
#define vraw_f32_BF16(r) bf16x4_to_f32(as_ushort4(r))
#else
#define vraw_BF16 floatv
#define vraw_load_BF16 VLOAD
#define vraw_f32_BF16(r) (r)
#endif
#define vraw_F32 floatv
#define vraw_F16 floatv
#define vraw_load_F32 VLOAD
#define vraw_load_F16 VLOAD
#define vraw_f32_F32(r) (r)
#define vraw_f32_F16(r) (r)
#define VRAW LLMCL_CAT(vraw_, DT)
#define VRAW_LOAD(p, i) LLMCL_CAT(vraw_load_, DT)((p), (i))
#define VRAW_F32(r) LLMCL_CAT(vraw_f32_, DT)(r)
