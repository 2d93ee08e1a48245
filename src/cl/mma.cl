/*
 * mma.cl: the tensor-core block, prepended after common.cl to the families that multiply matrices
 * on NVIDIA tensor cores through inline PTX. Everything is under LLMCL_NV_MMA, which the runtime
 * defines where a probe kernel with these instructions built (compute capability 8.0 or later);
 * elsewhere this file is empty and the portable kernels run.
 *
 * Operand tiles sit in local memory in the layout the operand has in global memory: `rows` rows of
 * R 16-byte chunks (8 16-bit elements a chunk, R a power of two). Chunk c of row r is stored at
 * chunk r R + (c ^ x(r)), an XOR swizzle chosen so that the 8 rows one ldmatrix phase reads, and
 * the 8 chunks one cp.async phase writes, fall in 8 different 16-byte bank groups: no bank
 * conflicts and no padding: three stages of 128 x 32 tiles of A and B fill exactly 48 KiB, three
 * of 256 x 64 and 128 x 64 take 144 KiB of the 226 KiB a kernel's local arrays may have on sm_90.
 *
 * Fragments follow PTX's mma.m16n8k16 layouts (lane = 4 g + t): A (16 x 16, row) as four 32-bit
 * registers holding (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B (16 x 8, col) as two,
 * holding (k = 2t..2t+1, n = g) and (k = 2t+8.., n = g); the f32 accumulator of a 16 x 8 tile as a
 * float4 holding (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). ldmatrix reads a row-major operand
 * as is and a transposed one with .trans, so either storage order of A and B feeds the same mma.
 */

#ifdef LLMCL_NV_MMA

/* Chunk index of chunk c of row r in a swizzled tile of R chunks a row. */
inline uint mma_chunk(uint r, uint c, uint R)
{
    const uint x = R >= 8 ? (r & 7u) : ((r / (8u / R)) & (R - 1u));
    return r * R + (c ^ x);
}

/* The .shared address of a __local pointer. */
inline uint mma_smem(const __local void *p) { return (uint)(size_t)p; }

/*
 * 16 bytes to local address dst, asynchronously; bytes (0..16) come from src, the rest are zero
 * (bytes 0: src is not read). src must be 16-byte aligned. The copy allocates in L1 (.ca): on the
 * H100 the GEMM's loads moved 1.6x faster than through L2 alone (.cg), docs/PERFORMANCE.md.
 */
inline void mma_cp16(uint dst, const __global void *src, uint bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"((ulong)src),
                 "r"(bytes)
                 : "memory");
}

inline void mma_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Waits until at most n (a constant, 0..3) committed copy groups are still in flight. */
inline void mma_cp_wait(int n)
{
    if (n <= 0)
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    else if (n == 1)
        asm volatile("cp.async.wait_group 1;" ::: "memory");
    else if (n == 2)
        asm volatile("cp.async.wait_group 2;" ::: "memory");
    else
        asm volatile("cp.async.wait_group 3;" ::: "memory");
}

inline void mma_st16(uint dst, uint4 v)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

/*
 * Copies a tile of `rows` x 8R 16-bit elements (row r from src + r ld) into the swizzled tile at
 * local address dst, with zeros past rows_valid rows and cols_valid columns; nt work-items share
 * it. aligned (src and ld multiples of 8 elements): cp.async, complete after mma_cp_wait; else
 * element loads, complete on return.
 */
inline void mma_load_tile(uint dst, const __global ushort *src, long ld, int rows, int R,
                          int rows_valid, int cols_valid, int tid, int nt, int aligned)
{
    for (int id = tid; id < rows * R; id += nt) {
        const int r = id / R, c = id % R;
        const int left = r < rows_valid ? clamp(cols_valid - c * 8, 0, 8) : 0;
        const __global ushort *p = src + (long)r * ld + c * 8;
        const uint d = dst + mma_chunk(r, c, R) * 16u;
        if (aligned) {
            mma_cp16(d, left ? p : src, (uint)left * 2u);
        } else {
            ushort e[8];
            for (int i = 0; i < 8; ++i)
                e[i] = i < left ? p[i] : (ushort)0;
            mma_st16(d, (uint4)(e[0] | (uint)e[1] << 16, e[2] | (uint)e[3] << 16,
                                e[4] | (uint)e[5] << 16, e[6] | (uint)e[7] << 16));
        }
    }
}

/*
 * The same copy for a tile that lies wholly inside its matrix, with src and ld multiples of 8
 * elements: work-item tid copies chunks tid + i nt, which share one chunk column (nt is a multiple
 * of R), so one pointer walks them by a fixed row step and nothing is bounds-checked.
 */
inline void mma_copy_tile(uint dst, const __global ushort *src, long ld, int rows, int R, int tid,
                          int nt)
{
    const int c = tid % R, r0 = tid / R, step = nt / R;
    const __global ushort *p = src + (long)r0 * ld + c * 8;
    const long pstep = (long)step * ld;
    for (int i = 0; i < (rows * R + nt - 1) / nt; ++i, p += pstep)
        if ((rows * R) % nt == 0 || tid + i * nt < rows * R)
            mma_cp16(dst + mma_chunk(r0 + i * step, c, R) * 16u, p, 16u);
}

/* Four 8 x 8 matrices of 16-bit elements from local memory into the mma fragment registers. */
#define LLMCL_LDSM(NAME, FORM)                                                                    \
    inline uint4 NAME(uint addr)                                                                  \
    {                                                                                             \
        uint4 r;                                                                                  \
        asm volatile("ldmatrix.sync.aligned.m8n8.x4" FORM ".shared.b16 {%0, %1, %2, %3}, [%4];"  \
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)                                 \
                     : "r"(addr));                                                                \
        return r;                                                                                 \
    }
LLMCL_LDSM(mma_ldsm_x4, "")
LLMCL_LDSM(mma_ldsm_x4_trans, ".trans")

/*
 * The A fragment (16 x 16) at rows m0, columns k0 of the A tile at local address tile: k_contig
 * tiles have rows of m (R chunks of k), the others rows of k (R chunks of m).
 */
inline uint4 mma_frag_a(uint tile, int m0, int k0, int R, int k_contig, int lane)
{
    if (k_contig)
        return mma_ldsm_x4(tile + mma_chunk(m0 + (lane & 15), (k0 >> 3) + (lane >> 4), R) * 16u);
    const int j = lane >> 3;
    return mma_ldsm_x4_trans(
        tile + mma_chunk(k0 + (lane & 7) + (j >> 1) * 8, (m0 >> 3) + (j & 1), R) * 16u);
}

/*
 * B fragments of two 16 x 8 tiles, columns n0 (.xy) and n0 + 8 (.zw), rows k0, of the B tile at
 * local address tile: k_contig tiles have rows of n (R chunks of k), the others rows of k.
 */
inline uint4 mma_frag_b2(uint tile, int n0, int k0, int R, int k_contig, int lane)
{
    const int j = lane >> 3, i = lane & 7;
    if (k_contig)
        return mma_ldsm_x4(tile + mma_chunk(n0 + i + (j >> 1) * 8, (k0 >> 3) + (j & 1), R) * 16u);
    return mma_ldsm_x4_trans(tile + mma_chunk(k0 + i + (j & 1) * 8, (n0 >> 3) + (j >> 1), R) * 16u);
}

/* c + a b on a 16 x 8 x 16 tile (bf16 or f16 inputs, f32 accumulation): mma_16816_BF16/_F16. */
#define LLMCL_MMA_16816(DT, TY)                                                                   \
    inline float4 mma_16816_##DT(float4 c, uint4 a, uint2 b)                                      \
    {                                                                                             \
        float x = c.x, y = c.y, z = c.z, w = c.w;                                                 \
        asm("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, "         \
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                       \
            : "+f"(x), "+f"(y), "+f"(z), "+f"(w)                                                  \
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));                        \
        return (float4)(x, y, z, w);                                                              \
    }
LLMCL_MMA_16816(BF16, "bf16")
LLMCL_MMA_16816(F16, "f16")

#endif
