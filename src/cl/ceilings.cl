/*
 * ceilings.cl: a kernel that measures the device's fp32 FMA rate: each work-item runs CHAINS
 * independent FMA chains in registers, so throughput rather than latency bounds it.
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
