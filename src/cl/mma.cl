/*
 * mma.cl: the tensor-core block, a prelude (src/runtime/program.c's family table) of the families
 * that multiply matrices on NVIDIA tensor cores through inline PTX, which the runtime puts after
 * common.cl on devices with tensor cores. Everything is under LLMCL_NV_MMA, which the runtime
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

/*
 * The same chunk in wgmma's layout (the sm_90a block below), whose rows are 8 chunks (R a multiple
 * of 8): a longer row is cut into atoms of 8 chunks, each atom's `rows` rows stored together.
 */
inline uint wg_chunk(uint r, uint c, uint rows)
{
    return (c >> 3) * rows * 8u + r * 8u + ((c & 7u) ^ (r & 7u));
}

/* The chunk in either layout: atoms 1 for wgmma's. */
inline uint mma_tile_chunk(uint r, uint c, uint R, uint rows, int atoms)
{
    return atoms ? wg_chunk(r, c, rows) : mma_chunk(r, c, R);
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
 * local address dst (in wgmma's layout where atoms is 1), with zeros past rows_valid rows and
 * cols_valid columns; nt work-items share it. aligned (src and ld multiples of 8 elements):
 * cp.async, complete after mma_cp_wait; else element loads, complete on return.
 */
inline void mma_load_tile(uint dst, const __global ushort *src, long ld, int rows, int R,
                          int rows_valid, int cols_valid, int tid, int nt, int aligned, int atoms)
{
    for (int id = tid; id < rows * R; id += nt) {
        const int r = id / R, c = id % R;
        const int left = r < rows_valid ? clamp(cols_valid - c * 8, 0, 8) : 0;
        const __global ushort *p = src + (long)r * ld + c * 8;
        const uint d = dst + mma_tile_chunk(r, c, R, rows, atoms) * 16u;
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
 * elements: work-item tid copies chunks tid + i nr, which share one chunk column (nr, the
 * work-items that take part, is nt rounded down to a multiple of R), so one pointer walks them by
 * a fixed row step and nothing is bounds-checked.
 */
inline void mma_copy_tile(uint dst, const __global ushort *src, long ld, int rows, int R, int tid,
                          int nt, int atoms)
{
    const int nr = nt / R * R, c = tid % R, r0 = tid / R, step = nt / R;
    const __global ushort *p = src + (long)r0 * ld + c * 8;
    const long pstep = (long)step * ld;
    if (tid >= nr)
        return;
    for (int i = 0; i < (rows * R + nr - 1) / nr; ++i, p += pstep)
        if ((rows * R) % nr == 0 || tid + i * nr < rows * R)
            mma_cp16(dst + mma_tile_chunk(r0 + i * step, c, R, rows, atoms) * 16u, p, 16u);
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

/*
 * The sm_90a block: wgmma, Hopper's warpgroup matrix multiply, which reads both operands from
 * local memory. NVIDIA's OpenCL compiles for sm_90 and rejects sm_90a's instructions, but it builds
 * PTX whose target says sm_90a when that PTX is handed back as a program binary. So these
 * instructions are written as PTX comments that start with "// @sm90a "; where the runtime defines
 * LLMCL_NV_WGMMA (compute capability 9.0, and a probe built that way ran), it builds the program,
 * retargets the PTX to sm_90a with the markers removed, and builds that (program.c). The inline
 * asm operands are substituted inside the comments, so the retargeted instructions name the
 * right registers.
 *
 * Operand tiles use wgmma's 128-byte swizzle: rows of 128 bytes (64 16-bit elements), chunk c of
 * row r at c ^ (r % 8) within each 8-row, 1024-byte block. A tile whose rows are longer is cut into
 * atoms of 64 columns, each atom's rows stored together (wg_chunk). A k-major operand (unit stride
 * along k, BK = 64) is then rows of one k slice; an mn-major one (unit stride along m or n) is atoms
 * of 64 m or n by BK rows of k, which wgmma reads transposed.
 */
#ifdef LLMCL_NV_WGMMA

/*
 * The matrix descriptor of a 128-byte swizzled operand at local address addr (1024-byte aligned
 * blocks): lbo, the bytes between atoms along m or n (mn-major only), sbo, the bytes between 8-row
 * blocks.
 */
inline ulong wg_desc(uint addr, uint lbo, uint sbo)
{
    return (ulong)((addr & 0x3FFFFu) >> 4) | (ulong)(lbo >> 4) << 16 | (ulong)(sbo >> 4) << 32 |
           (ulong)1 << 62;
}

/* Local memory written by the work-items (cp.async included) becomes visible to wgmma's reads. */
inline void wg_proxy_fence(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/*
 * Every work-item's cp.async copies but those of its n (a constant, 0..3) newest groups have
 * landed, and wgmma may read them: each waits for its own, makes them visible to wgmma's proxy,
 * then the barrier waits for all.
 */
inline void wg_copies_landed(int n)
{
    mma_cp_wait(n);
    wg_proxy_fence();
    barrier(CLK_LOCAL_MEM_FENCE);
}

/*
 * x as lane 0 of the warp has it. Where every lane's x is the same, this tells the compiler so:
 * ptxas serialises a kernel's wgmma behind any that a branch it cannot prove uniform may skip.
 */
inline int wg_uniform(int x)
{
    int r;
    asm volatile("shfl.sync.idx.b32 %0, %1, 0, 0x1f, 0xffffffff;" : "=r"(r) : "r"(x));
    return r;
}

/* Orders the accumulators' register writes before the wgmma that follow. */
inline void wg_fence(void) { asm volatile("// @sm90a wgmma.fence.sync.aligned;" ::: "memory"); }

inline void wg_commit(void)
{
    asm volatile("// @sm90a wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* Waits until at most n (0, 1 or 2) committed wgmma groups of the warpgroup are still running. */
inline void wg_wait(int n)
{
    if (n <= 0)
        asm volatile("// @sm90a wgmma.wait_group.sync.aligned 0;" ::: "memory");
    else if (n == 1)
        asm volatile("// @sm90a wgmma.wait_group.sync.aligned 1;" ::: "memory");
    else
        asm volatile("// @sm90a wgmma.wait_group.sync.aligned 2;" ::: "memory");
}

/*
 * Accumulator operands of the m64nN shapes the kernels use (N / 2 f32 registers a lane): WG_LIST_N
 * names them in the instruction (WG_Rc lists %16c .. %16c+15), WG_OPS_N binds d[0 .. N / 2) to
 * them, and WG_SS_N and WG_RS_N name the operands that follow: A's descriptor and B's, or A's four
 * registers and B's descriptor.
 */
#define WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_R3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define WG_R5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_R6 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define WG_R7 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_LIST_64 WG_R0 ", " WG_R1
#define WG_LIST_128 WG_LIST_64 ", " WG_R2 ", " WG_R3
#define WG_LIST_192 WG_LIST_128 ", " WG_R4 ", " WG_R5
#define WG_LIST_256 WG_LIST_192 ", " WG_R6 ", " WG_R7
#define WG_D8(i)                                                                                  \
    "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),         \
        "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WG_D32(i) WG_D8(i), WG_D8((i) + 8), WG_D8((i) + 16), WG_D8((i) + 24)
#define WG_OPS_64 WG_D32(0)
#define WG_OPS_128 WG_OPS_64, WG_D32(32)
#define WG_OPS_192 WG_OPS_128, WG_D32(64)
#define WG_OPS_256 WG_OPS_192, WG_D32(96)
#define WG_SS_64 "%32, %33"
#define WG_SS_128 "%64, %65"
#define WG_SS_192 "%96, %97"
#define WG_SS_256 "%128, %129"
#define WG_SS_ACC_64 "%34"
#define WG_SS_ACC_128 "%66"
#define WG_SS_ACC_192 "%98"
#define WG_SS_ACC_256 "%130"
#define WG_RS_64 "{%32, %33, %34, %35}, %36"
#define WG_RS_128 "{%64, %65, %66, %67}, %68"
#define WG_RS_192 "{%96, %97, %98, %99}, %100"
#define WG_RS_256 "{%128, %129, %130, %131}, %132"

/*
 * NAME(d, da, db, acc): d (64 x N, f32, in the accumulator layout: lane 4 g + t of warp w of the
 * warpgroup holds rows 16 w + g and + 8 of columns 8 j + 2 t, + 1 in d[4 j .. 4 j + 3], as
 * mma.sync's m16n8 tiles) += A (64 x 16, descriptor da) B (16 x N, db), or with acc 0 d = A B,
 * which needs no zeros written to d first (registers that other instructions write just before a
 * wgmma make ptxas wait for the wgmma before them); TY bf16 or f16, TA and TB the transpose flags
 * ("1": the operand is mn-major); N 64, 128, 192 or 256 (a macro is expanded).
 */
#define LLMCL_WG_MMA_SS(NAME, TY, N, TA, TB) LLMCL_WG_MMA_SS_(NAME, TY, N, TA, TB)
#define LLMCL_WG_MMA_SS_(NAME, TY, N, TA, TB)                                                     \
    inline void NAME(float *d, ulong da, ulong db, int acc)                                       \
    {                                                                                             \
        asm volatile("// @sm90a { .reg .pred p; setp.ne.b32 p, " WG_SS_ACC_##N ", 0; "             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" WG_LIST_##N \
                     "}, " WG_SS_##N ", p, 1, 1, " TA ", " TB "; }"                               \
                     : WG_OPS_##N                                                                 \
                     : "l"(da), "l"(db), "r"(acc));                                               \
    }

/*
 * The same with A from registers: a is the warp's 16 rows of A as an mma.sync A fragment
 * (mma_frag_a's layout, which is also an accumulator tile pair's, attn_acc_to_a); N as above.
 * wgmma reads a until the group's wait: a later value must not take its registers before then.
 */
#define LLMCL_WG_MMA_RS(NAME, TY, N, TB) LLMCL_WG_MMA_RS_(NAME, TY, N, TB)
#define LLMCL_WG_MMA_RS_(NAME, TY, N, TB)                                                         \
    inline void NAME(float *d, uint4 a, ulong db)                                                 \
    {                                                                                             \
        asm volatile("// @sm90a { .reg .pred p; setp.ne.b32 p, 1, 0; "                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" WG_LIST_##N \
                     "}, " WG_RS_##N ", p, 1, 1, " TB "; }"                                       \
                     : WG_OPS_##N                                                                 \
                     : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(db));                          \
    }

/*
 * Hopper's TMA: copies of whole tiles that complete on an mbarrier in local memory (one 64-bit
 * word at local address bar), which counts both arrivals and the bytes the copies deliver.
 * wg_bar_wait(bar, parity) returns once the barrier's phase of that parity (its use number u,
 * parity u % 2) has completed.
 */
inline void wg_bar_init(uint bar, uint count)
{
    asm volatile("// @sm90a mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count)
                 : "memory");
}
/* Makes the barriers' initialisation visible to the copies (the async proxy). */
inline void wg_bar_init_fence(void)
{
    asm volatile("// @sm90a fence.mbarrier_init.release.cluster;" ::: "memory");
}
inline void wg_bar_expect(uint bar, uint bytes)
{
    asm volatile("// @sm90a mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
inline void wg_bar_arrive(uint bar)
{
    asm volatile("// @sm90a mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
inline void wg_bar_wait(uint bar, uint parity)
{
    uint done = 0;
    while (!done)
        asm volatile("// @sm90a { .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], "
                     "%2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}

/* The box at (x, y) (x the inner coordinate) of the tensor map at global address map to dst. */
inline void wg_tma_load(uint dst, ulong map, int x, int y, uint bar)
{
    asm volatile("// @sm90a cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
                 "complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}

/*
 * An L2 policy for copies of data that is read or written once (the backward's stored dS): its
 * lines go first, so that it does not displace the tiles that other work-groups read again.
 */
inline ulong wg_l2_evict_first(void)
{
    ulong policy = 0;
    asm volatile("// @sm90a createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "+l"(policy));
    return policy;
}

/* wg_tma_load with an L2 policy. */
inline void wg_tma_load_hint(uint dst, ulong map, int x, int y, uint bar, ulong policy)
{
    asm volatile("// @sm90a cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
                 "complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(bar), "l"(policy)
                 : "memory");
}

/*
 * TMA's stores: the box at (x, y) of the tensor map at global address map from local address src,
 * in the issuing work-item's bulk group; the map's sizes clip the box. A work-item commits its
 * stores as a group, and waits until all but its n (0 to 2) newest groups have read their local
 * memory (which may then be written again), or until all have completed.
 */
inline void wg_tma_store(ulong map, int x, int y, uint src)
{
    asm volatile("// @sm90a cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], "
                 "[%3];" ::"l"(map),
                 "r"(x), "r"(y), "r"(src)
                 : "memory");
}
/* wg_tma_store with an L2 policy. */
inline void wg_tma_store_hint(ulong map, int x, int y, uint src, ulong policy)
{
    asm volatile("// @sm90a cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint "
                 "[%0, {%1, %2}], [%3], %4;" ::"l"(map),
                 "r"(x), "r"(y), "r"(src), "l"(policy)
                 : "memory");
}
inline void wg_bulk_commit(void)
{
    asm volatile("// @sm90a cp.async.bulk.commit_group;" ::: "memory");
}
inline void wg_bulk_read(int n)
{
    if (n <= 0)
        asm volatile("// @sm90a cp.async.bulk.wait_group.read 0;" ::: "memory");
    else if (n == 1)
        asm volatile("// @sm90a cp.async.bulk.wait_group.read 1;" ::: "memory");
    else
        asm volatile("// @sm90a cp.async.bulk.wait_group.read 2;" ::: "memory");
}
inline void wg_bulk_done(void)
{
    asm volatile("// @sm90a cp.async.bulk.wait_group 0;" ::: "memory");
}

/* Four 8 x 8 matrices of 16-bit pairs to local memory: lane l holds row l / 4, columns 2 (l % 4)
   and 2 (l % 4) + 1 of matrix i in ri; lanes 8 i .. 8 i + 7 give the addresses of its rows. */
inline void wg_stmatrix4(uint addr, uint r0, uint r1, uint r2, uint r3)
{
    asm volatile("// @sm90a stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::
                     "r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* The same, each matrix transposed: lanes 8 i .. 8 i + 7 give the addresses of its columns. */
inline void wg_stmatrix4_trans(uint addr, uint r0, uint r1, uint r2, uint r3)
{
    asm volatile("// @sm90a stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* Named barrier id (1 to 15) of count work-items, whole warps: one warpgroup meets alone. */
inline void wg_named_barrier(uint id, uint count)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* Sets field (with its ordinal) of the tensor map at global address map to value. */
#define WG_TMA_SET(field, ord, value)                                                             \
    asm volatile("// @sm90a tensormap.replace.tile." field ".global.b1024.b32 [%0], " #ord ", %1;" \
                 ::"l"(map), "r"(value)                                                           \
                 : "memory")

/* Makes the tensor map at global address map, released by a work-item of the work-group before a
   barrier, visible to this work-item's copies. */
inline void wg_tma_acquire(ulong map)
{
    asm volatile("// @sm90a fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map)
                 : "memory");
}

/*
 * The host's template (nv_tma.c) written to slot and set to copy boxes of box_inner x box_outer
 * from the inner x outer elements at base, rows stride_bytes apart; fenced, so that the copies
 * read it as written. Returns slot's address.
 */
inline ulong wg_tma_map(__global ulong16 *slot, ulong16 tmpl, const __global void *base,
                        uint inner, uint outer, ulong stride_bytes, uint box_inner,
                        uint box_outer)
{
    const ulong map = (ulong)slot;
    *slot = tmpl;
    asm volatile("// @sm90a tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;"
                 ::"l"(map), "l"((ulong)base)
                 : "memory");
    asm volatile("// @sm90a tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %1;"
                 ::"l"(map), "l"(stride_bytes)
                 : "memory");
    WG_TMA_SET("global_dim", 0, inner);
    WG_TMA_SET("global_dim", 1, outer);
    WG_TMA_SET("box_dim", 0, box_inner);
    WG_TMA_SET("box_dim", 1, box_outer);
    asm volatile("// @sm90a fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
    wg_tma_acquire(map);
    return map;
}

/*
 * Hopper's register reallocation between warpgroups ("inc" or "dec" to N, a multiple of 8 from 24
 * to 256): every work-item of the warpgroup runs it. The JIT honours it only where the PTX states
 * the kernel's register count at entry, which program.c's retargeting adds (.maxnreg).
 */
#define WG_SETMAXNREG(DIR, N)                                                                     \
    asm volatile("// @sm90a setmaxnreg." DIR ".sync.aligned.u32 " #N ";" ::: "memory")

/*
 * A producer warpgroup beside two that multiply (384 work-items entering with 168 registers
 * each): the producers give theirs away down to low, the others take them up to high (at most
 * 240 with low 24: the multiprocessor's 64 Ki registers hold 128 low and 256 high).
 */
#define WG_PRODUCER_REGISTERS_TO(producer, low, high)                                             \
    if (producer)                                                                                 \
        WG_SETMAXNREG("dec", low);                                                                \
    else                                                                                          \
        WG_SETMAXNREG("inc", high)
#define WG_PRODUCER_REGISTERS(producer) WG_PRODUCER_REGISTERS_TO(producer, 24, 240)

/*
 * Orders the compiler's reads and writes of x after the wgmma.wait that precedes this: wgmma's
 * registers look written (or read) at its issue to the compiler, which could otherwise move their
 * next access above the wait.
 */
inline void wg_keep_f(float *x) { asm volatile("" : "+f"(*x)::"memory"); }
inline void wg_keep_u4(uint4 *x)
{
    asm volatile("" : "+r"(x->x), "+r"(x->y), "+r"(x->z), "+r"(x->w)::"memory");
}

#endif
