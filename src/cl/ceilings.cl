/*
 * ceilings.cl: kernels that measure the device's arithmetic rates. fma_peak: each work-item runs
 * 16 independent fp32 FMA chains in registers, so throughput rather than latency bounds it.
 * mma_peak (NVIDIA tensor cores, mma.cl): each warp runs 8 independent bf16 mma.sync m16n8k16
 * chains on register operands, the ceiling of kernels built on the tensor-core block.
 *
 * Tunables:
 *   WG   work-group size
 */
#ifndef WG
#define WG 256
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fma_peak(__global float *out, int iters, float a, float b)
{
    const float seed = (float)get_global_id(0) * 1e-7f;
    float4 x0 = (float4)(seed, seed + 1.0f, seed + 2.0f, seed + 3.0f);
    float4 x1 = x0 + 4.0f, x2 = x0 + 8.0f, x3 = x0 + 12.0f;
    for (int i = 0; i < iters; ++i) {
        x0 = fma(x0, (float4)a, (float4)b);
        x1 = fma(x1, (float4)a, (float4)b);
        x2 = fma(x2, (float4)a, (float4)b);
        x3 = fma(x3, (float4)a, (float4)b);
    }
    const float4 s = x0 + x1 + x2 + x3;
    out[get_global_id(0)] = s.x + s.y + s.z + s.w;
}

#ifdef LLMCL_NV_MMA
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void mma_peak(__global float *out, int iters)
{
    const uint l = get_local_id(0);
    const uint4 a = (uint4)(0x3f803f80u + l, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
    const uint2 b = (uint2)(0x3c003c00u, 0x3c003c00u + l);
    float4 c[8];
    for (int j = 0; j < 8; ++j)
        c[j] = (float4)((float)j);
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            c[j] = mma_16816_BF16(c[j], a, b);
    float4 s = (float4)(0.0f);
    for (int j = 0; j < 8; ++j)
        s += c[j];
    out[get_global_id(0)] = s.x + s.y + s.z + s.w;
}
#endif
