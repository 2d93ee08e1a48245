/*
 * matmul.cl: c = alpha op(a) op(b) + beta c_in + bias with f32 accumulation (llmcl_matmul); c_in
 * is c itself or another tensor laid out like it.
 *   mm_tiled    portable: T x T output tiles from k-slices in local memory, TM x TN a work-item
 *   mm_mma      NVIDIA tensor cores (mma.cl): BM x BN tiles, WM x WN warps, a STAGES-deep cp.async
 *               pipeline of BK-wide slices, mma.sync m16n8k16 into f32 registers
 *   mm_wgmma    Hopper's wgmma (sm_90a, mma.cl): BM x BN tiles, a warpgroup each 64 WG_MB rows,
 *               both operands read by wgmma from 128-byte swizzled local tiles
 *   mm_reduce   split K: sums the f32 slices in slice order and applies the epilogue
 *   mm_bias     c += bias after a CLBlast GEMM
 *
 * Every operand arrives as element offset and strides of op's logical shape, so transposes and
 * views need no copies: A(m, k) = a[aoff + z sab + m sam + k sak], B(k, n) = b[boff + z sbb +
 * k sbk + n sbn], C(m, n) = c[coff + z scb + m scm + n scn] for batch entry z (a stride 0
 * broadcasts a 2-D operand). The addend C_in(m, n) = cin[coff + cid + z scb + m scm + n scn]
 * (cid: its offset less c's, 0 when it is c). bias_mode: 0 none, 1 bias[n] (a row bias), 2 bias[m].
 *
 * Grid: dimension 0 the output tiles, 1 the batch, 2 the K slices. With SPLITK each slice
 * writes its raw sums to ws[((slice * batch + z) * M + m) * N + n] and mm_reduce finishes; the
 * order of every sum is fixed, so results are the same bits run after run.
 *
 * Tunables:
 *   DT          a and b: F32, BF16, F16 (mm_mma: BF16, F16)
 *   C_DT        c: F32 or DT;  BIAS_DT  bias: F32 or DT;  MM_BIAS  0: no bias (bias_mode 0 is
 *               then a constant, and the epilogue carries no bias code)
 *   A_KC, B_KC  1 when A's (B's) unit stride runs along k: chooses the loads (mm_tiled) and the
 *               tile layout and ldmatrix form (mm_mma, which needs a unit stride along m or k of
 *               A and along k or n of B)
 *   SPLITK      1: write raw slice sums to ws
 *   RVEC        mm_reduce: elements of c a work-item, 1 or 4 (aligned runs along n)
 *   mm_tiled:   T (tile edge, default 64), BK (k-slice, 16), TM, TN (per work-item, 4 x 4);
 *               T % TM == T % TN == 0, (T/TM)(T/TN) >= T work-items, BK <= T
 *   mm_mma:     BM, BN (64, 128 or 256), BK (32 or 64: an even number of k16 steps), WM x WN warps, each owning a
 *               (BM/WM) x (BN/WN) block, a multiple of 16 x 16; STAGES 2..4;
 *               GROUP_M: tile rows a group walks column by column (L2 reuse);
 *               ALIGN_A, ALIGN_B: offsets and leading strides are multiples of 8 elements, so
 *               tiles move by cp.async (else by element loads). Local memory
 *               STAGES (BM + BN) BK 2 bytes: 48 KiB for 128 x 128 x 32 in 3 stages, 144 KiB
 *               for 256 x 128 x 64.
 *   MM_WGMMA    1: build mm_wgmma (BK 64, WN 1, WM = BM / (16 WG_MB) warps) instead of mm_mma;
 *               BN 64, 128, 192 or 256; WG_MB: m64 blocks a warpgroup, 1 or 2: its lanes
 *               hold WG_MB BN / 2 accumulators, 192 at most; MM_TMA: copies by Hopper's TMA
 *               from maps made of the tensor-map template the host passes (nv_tma.c), else by
 *               cp.async; MM_WS 1 (with MM_TMA): producers after the warpgroups issue the
 *               copies (a warp; a warpgroup beside two of WG_MB 2); MM_TMA_STORE 1 (with
 *               MM_TMA, a 16-bit C or an f32 one of BN a multiple of 128, no split, no MM_CE):
 *               the plain epilogue of tiles inside C goes through BM x BN x 2 bytes of local
 *               memory and TMA's stores
 *   MM_PRELOAD  mm_wgmma with alpha 1, C's rows runs of aligned pairs: each tile's accumulators
 *               start from beta C_in (mm_wg_preload), the epilogue adding none
 *   MM_CE       mm_mma or mm_wgmma as the fused cross-entropy's logits product (below): 1 the
 *               forward's LSE partials, 2 the backward's dlogits; LABEL_DT the labels' storage
 *               (I32 or I64); CE_SLOT the columns of a row that one LSE partial covers
 *   MM_SUMSQ    mm_wgmma into an f32 C, unsplit: each warp also writes the sum of the squares of
 *               the values it stored in a tile to sumsq[first + (z tiles + tile) NT / 32 + warp]
 *               (llmcl_matmul's opts->sumsq, the gradient norm's partials)
 *   MM_EXT      mm_wgmma with MM_TMA, unsplit and 2-D: the product goes on along K with a second
 *               pair, A2(m, k) = a2[a2off + m sa2m + k sa2k] and B2(k, n) = b2[b2off + k sb2k +
 *               n sb2n] for k < K2 (llmcl_matmul's a_ext and b_ext), laid out as A and B; each
 *               tile's walk takes its slices after A's and B's, into the same accumulators
 */

#ifndef DT
#define DT F32
#endif
#ifndef C_DT
#define C_DT DT
#endif
#ifndef RVEC
#define RVEC 1
#endif
#ifndef BIAS_DT
#define BIAS_DT DT
#endif
#ifndef A_KC
#define A_KC 1
#endif
#ifndef B_KC
#define B_KC 0
#endif
#ifndef SPLITK
#define SPLITK 0
#endif
#ifndef T
#define T 64
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef WM
#define WM 2
#endif
#ifndef WN
#define WN 2
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef ALIGN_A
#define ALIGN_A 0
#endif
#ifndef ALIGN_B
#define ALIGN_B 0
#endif
#ifndef MM_CE
#define MM_CE 0
#endif
#ifndef LABEL_DT
#define LABEL_DT I64
#endif
#ifndef MM_WGMMA
#define MM_WGMMA 0
#endif
#ifndef CE_SLOT
#define CE_SLOT 64
#endif
#ifndef WG_MB
#define WG_MB 1
#endif
#ifndef MM_WS
#define MM_WS 0
#endif
#ifndef MM_TMA
#define MM_TMA 0
#endif
#ifndef MM_TMA_STORE
#define MM_TMA_STORE 0
#endif
#ifndef MM_BIAS
#define MM_BIAS 1
#endif
#ifndef MM_EXT
#define MM_EXT 0
#endif
#ifndef MM_SUMSQ
#define MM_SUMSQ 0
#endif

typedef STORAGE(DT) ab_t;
typedef STORAGE(C_DT) c_t;
typedef STORAGE(BIAS_DT) bias_t;
typedef STORAGE(LABEL_DT) label_t;

/* The arguments every product kernel takes, in one order. */
#define MM_PARAMS                                                                                 \
    const __global ab_t *a, ulong aoff, long sam, long sak, long sab, const __global ab_t *b,     \
        ulong boff, long sbk, long sbn, long sbb, __global c_t *c, ulong coff, long scm,          \
        long scn, long scb, const __global c_t *cin, long cid, const __global bias_t *bias,       \
        ulong biasoff, long sbias,                                                                \
        int bias_mode, long M, long N, long K, long kslice, float alpha, float beta,              \
        __global float *ws

/*
 * One output element: alpha acc + bias + beta c_in (c_in unread when beta is 0), or with SPLITK
 * the raw sum into the slice's workspace. Returns what it stored.
 */
inline float mm_out(__global c_t *c, long coff, long scm, long scn, const __global c_t *cin,
                   long cid, const __global bias_t *bias, long sbias, int bias_mode, float alpha,
                   float beta, __global float *ws, long wsoff, long N, long m, long n, float acc)
{
    if (SPLITK) {
        ws[wsoff + m * N + n] = acc;
        return acc;
    }
    float v = alpha * acc;
    if (bias_mode)
        v += LOAD(BIAS_DT, bias, (bias_mode == 1 ? n : m) * sbias);
    const long ci = coff + m * scm + n * scn;
    if (beta != 0.0f)
        v += beta * LOAD(C_DT, cin, ci + cid);
    STORE(C_DT, c, ci, v);
    return v;
}

/* The slice's K range and workspace offset of this work-group. */
#define MM_SLICE()                                                                                \
    bias_mode = MM_BIAS ? bias_mode : 0;                                                          \
    const long z = get_group_id(1), sl = get_group_id(2);                                         \
    const long k_lo = sl * kslice, k_hi = min(K, k_lo + kslice);                                  \
    const long wsoff = (sl * get_num_groups(1) + z) * M * N;                                      \
    a += aoff + z * sab;                                                                          \
    b += boff + z * sbb;                                                                          \
    coff += z * scb;                                                                              \
    bias += biasoff

/* ---- portable ---- */

#define NTX (T / TN)
#define NTY (T / TM)
#define TWG (NTX * NTY)
/* 4 floats of padding spread the transposed tile stores over the banks and keep rows aligned. */
#define LDT (T + 4)

__kernel __attribute__((reqd_work_group_size(TWG, 1, 1))) void mm_tiled(MM_PARAMS)
{
    __local float As[BK * LDT] __attribute__((aligned(16)));
    __local float Bs[BK * LDT] __attribute__((aligned(16)));
    MM_SLICE();
    const int lid = get_local_id(0), tx = lid % NTX, ty = lid / NTX;
    const long ntn = (N + T - 1) / T, tile = get_group_id(0);
    const long m0 = (tile / ntn) * T, n0 = (tile % ntn) * T;
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;
    for (long k0 = k_lo; k0 < k_hi; k0 += BK) {
        /* consecutive work-items walk each operand's unit-stride dimension */
        for (int e = lid; e < T * BK; e += TWG) {
            const int am = A_KC ? e / BK : e % T, ak = A_KC ? e % BK : e / T;
            const int bn = B_KC ? e / BK : e % T, bk = B_KC ? e % BK : e / T;
            const long m = m0 + am, n = n0 + bn, ka = k0 + ak, kb = k0 + bk;
            As[ak * LDT + am] = m < M && ka < k_hi ? LOAD(DT, a, m * sam + ka * sak) : 0.0f;
            Bs[bk * LDT + bn] = n < N && kb < k_hi ? LOAD(DT, b, kb * sbk + n * sbn) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM], bv[TN];
            LDS_RUN(av, TM, As + kk * LDT + ty * TM);
            LDS_RUN(bv, TN, Bs + kk * LDT + tx * TN);
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {
            const long m = m0 + ty * TM + i, n = n0 + tx * TN + j;
            if (m < M && n < N)
                mm_out(c, coff, scm, scn, cin, cid, bias, sbias, bias_mode, alpha, beta, ws,
                       wsoff, N, m, n, acc[i][j]);
        }
}

/* ---- split K and CLBlast helpers ---- */

/*
 * RVEC consecutive elements of a row of c a work-item over (n / RVEC, m, z): the slices' sums in
 * slice order, then the epilogue. RVEC 4 where c's and the addend's rows are runs along n aligned
 * to four elements and N is a multiple of 4 (the launcher checks): one access of four elements
 * each, and a quarter of the work-groups, whose launches bound a kernel this light.
 */
#if RVEC == 4
typedef float4 rvec_t;
#define RV_LOAD(DT, p, i) LLMCL_CAT(load4a_, DT)((p), (i))
#define RV_STORE(DT, p, i, v) LLMCL_CAT(store4a_, DT)((p), (i), (v))
#define RV_BIAS(p, i, s)                                                                          \
    ((float4)(LOAD(BIAS_DT, p, i), LOAD(BIAS_DT, p, (i) + (s)), LOAD(BIAS_DT, p, (i) + 2 * (s)),  \
              LOAD(BIAS_DT, p, (i) + 3 * (s))))
#else
typedef float rvec_t;
#define RV_LOAD(DT, p, i) LOAD(DT, p, i)
#define RV_STORE(DT, p, i, v) STORE(DT, p, i, v)
#define RV_BIAS(p, i, s) LOAD(BIAS_DT, p, i)
#endif

__kernel void mm_reduce(__global c_t *c, ulong coff, long scm, long scn, long scb,
                        const __global c_t *cin, long cid, const __global bias_t *bias,
                        ulong biasoff, long sbias, int bias_mode, long M, long N, long nslices,
                        long batch, float alpha, float beta, const __global float *ws)
{
    const long n = get_global_id(0) * RVEC, m = get_global_id(1), z = get_global_id(2);
    if (n >= N || m >= M)
        return;
    rvec_t acc = 0.0f;
    for (long s = 0; s < nslices; ++s)
        acc += RV_LOAD(F32, ws, ((s * batch + z) * M + m) * N + n);
    rvec_t v = alpha * acc;
    if (bias_mode == 1)
        v += RV_BIAS(bias, biasoff + n * sbias, sbias);
    else if (bias_mode == 2)
        v += LOAD(BIAS_DT, bias, biasoff + m * sbias);
    const long ci = coff + z * scb + m * scm + n * scn;
    if (beta != 0.0f)
        v += beta * RV_LOAD(C_DT, cin, ci + cid);
    RV_STORE(C_DT, c, ci, v);
}

/* c[m, n] += bias (after a CLBlast GEMM, which has no bias), over (n, m, z). */
__kernel void mm_bias(__global c_t *c, ulong coff, long scm, long scn, long scb,
                      const __global bias_t *bias, ulong biasoff, long sbias, int bias_mode,
                      long M, long N)
{
    const long n = get_global_id(0), m = get_global_id(1), z = get_global_id(2);
    if (n >= N || m >= M)
        return;
    const long ci = coff + z * scb + m * scm + n * scn;
    STORE(C_DT, c, ci,
          LOAD(C_DT, c, ci) + LOAD(BIAS_DT, bias, biasoff + (bias_mode == 1 ? n : m) * sbias));
}

/* ---- NVIDIA tensor cores (built with MM_MMA, where the runtime defines LLMCL_NV_MMA) ---- */

#if defined(LLMCL_NV_MMA) && defined(MM_MMA)

#define NT (32 * WM * WN)
#define WTM (BM / WM)
#define WTN (BN / WN)
#define MI (WTM / 16)
#define NI (WTN / 8)
#define STAGE_A (BM * BK * 2)
#define STAGE_B (BN * BK * 2)
#define MMA LLMCL_CAT(mma_16816_, DT)
/* mm_wgmma's tiles are in wgmma's layout (mma.cl) */
#define MM_ATOMS MM_WGMMA

/*
 * The A and B tiles from k0 into the stage at local address sa, asynchronously where aligned; the
 * fast copy where a tile lies wholly inside its matrix.
 */
inline void mm_load_stage(uint sa, const __global ushort *a, long sam, long sak,
                          const __global ushort *b, long sbk, long sbn, long M, long N, long m0,
                          long n0, long k0, long k_hi, int tid)
{
    const int kv = (int)min((long)BK, k_hi - k0);
    const int mv = (int)min((long)BM, M - m0), nv = (int)min((long)BN, N - n0);
    const uint sb = sa + STAGE_A;
    if (ALIGN_A && ALIGN_B && kv == BK && mv == BM && nv == BN) {
        if (A_KC)
            mma_copy_tile(sa, a + m0 * sam + k0, sam, BM, BK / 8, tid, NT, MM_ATOMS);
        else
            mma_copy_tile(sa, a + k0 * sak + m0, sak, BK, BM / 8, tid, NT, MM_ATOMS);
        if (B_KC)
            mma_copy_tile(sb, b + n0 * sbn + k0, sbn, BN, BK / 8, tid, NT, MM_ATOMS);
        else
            mma_copy_tile(sb, b + k0 * sbk + n0, sbk, BK, BN / 8, tid, NT, MM_ATOMS);
        return;
    }
    if (A_KC)
        mma_load_tile(sa, a + m0 * sam + k0, sam, BM, BK / 8, mv, kv, tid, NT, ALIGN_A, MM_ATOMS);
    else
        mma_load_tile(sa, a + k0 * sak + m0, sak, BK, BM / 8, kv, mv, tid, NT, ALIGN_A, MM_ATOMS);
    if (B_KC)
        mma_load_tile(sb, b + n0 * sbn + k0, sbn, BN, BK / 8, nv, kv, tid, NT, ALIGN_B, MM_ATOMS);
    else
        mma_load_tile(sb, b + k0 * sbk + n0, sbk, BK, BN / 8, kv, nv, tid, NT, ALIGN_B, MM_ATOMS);
}

/* The fragments of k16 step ks of the stage at sa: MI of A, NI / 2 pairs of B. */
inline void mm_frags(uint sa, int ks, int wm, int wn, int lane, uint4 *af, uint4 *bf)
{
    for (int i = 0; i < MI; ++i)
        af[i] = mma_frag_a(sa, wm * WTM + i * 16, ks * 16, A_KC ? BK / 8 : BM / 8, A_KC, lane);
    for (int j = 0; j < NI / 2; ++j)
        bf[j] = mma_frag_b2(sa + STAGE_A, wn * WTN + j * 16, ks * 16, B_KC ? BK / 8 : BN / 8, B_KC,
                            lane);
}

/*
 * The epilogue: each warp passes its f32 sums through its own slice of local memory (free once
 * the main loop is done), EPI_R rows of its block at a time, then takes four consecutive columns
 * of one row a lane, so that it writes whole rows instead of the fragments' scattered pairs: one
 * vector store where the tile lies inside C with rows of 4-element aligned vectors (the
 * workspace's rows with SPLITK), else four checked element stores. Only warp barriers: the sums
 * leave the registers fragment row by fragment row, as the direct stores did. Rows are EPI_LD
 * floats apart, so the float2 stores of a half-warp meet every bank once.
 */
#define EPI_LD (WTN + 8)
#define EPI_R (WM * WN * 16 * EPI_LD * 4 <= STAGES * (STAGE_A + STAGE_B) ? 16 : 8)

/* Four consecutive elements at p + i, which is 4-element aligned, as one vector access. */
inline float4 mm_load4_F32(const __global float *p, long i)
{
    return *(const __global float4 *)(p + i);
}
inline float4 mm_load4_BF16(const __global ushort *p, long i)
{
    return bf16x4_to_f32(as_ushort4(*(const __global uint2 *)(p + i)));
}
inline float4 mm_load4_F16(const __global ushort *p, long i) { return load4_F16(p, i); }
inline void mm_store4_F32(__global float *p, long i, float4 v) { *(__global float4 *)(p + i) = v; }
inline void mm_store4_BF16(__global ushort *p, long i, float4 v)
{
    *(__global ushort4 *)(p + i) = f32x4_to_bf16(v);
}
inline void mm_store4_F16(__global ushort *p, long i, float4 v) { store4_F16(p, i, v); }
#define MM_LOAD4(DT, p, i) LLMCL_CAT(mm_load4_, DT)((p), (i))
#define MM_STORE4(DT, p, i, v) LLMCL_CAT(mm_store4_, DT)((p), (i), (v))

/* Columns n .. n + 3 of row m, 4-element aligned: alpha acc + bias + beta c_in in mm_out's
   order, or the raw sums. */
inline void mm_out4(__global c_t *c, long coff, long scm, const __global c_t *cin, long cid,
                    const __global bias_t *bias, long sbias, int bias_mode, float alpha,
                    float beta, __global float *ws, long wsoff, long N, long m, long n, float4 acc)
{
    if (SPLITK) {
        *(__global float4 *)(ws + wsoff + m * N + n) = acc;
        return;
    }
    float4 v = alpha * acc;
    if (bias_mode == 1)
        v += (float4)(LOAD(BIAS_DT, bias, n * sbias), LOAD(BIAS_DT, bias, (n + 1) * sbias),
                      LOAD(BIAS_DT, bias, (n + 2) * sbias), LOAD(BIAS_DT, bias, (n + 3) * sbias));
    else if (bias_mode == 2)
        v += LOAD(BIAS_DT, bias, m * sbias);
    const long ci = coff + m * scm + n;
    if (beta != 0.0f)
        v += beta * MM_LOAD4(C_DT, cin, ci + cid);
    MM_STORE4(C_DT, c, ci, v);
}

/* The EPI_R rows of the warp's slice at ws_at (EPI_LD floats a row, WTN columns) to C
   rows from m, columns from n. */
__attribute__((always_inline)) inline void
mm_epilogue_rows(uint ws_at, int lane, __global c_t *c, long coff, long scm, long scn,
                 const __global c_t *cin, long cid, const __global bias_t *bias, long sbias,
                 int bias_mode, float alpha, float beta, __global float *ws, long wsoff, long M,
                 long N, long m, long n, bool vec)
{
#pragma unroll
    for (int q = 0; q < EPI_R * WTN / 4 / 32; ++q) {
        const int id = q * 32 + lane, r = id / (WTN / 4), c4 = id % (WTN / 4);
        float4 v;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(ws_at + (uint)(r * EPI_LD + c4 * 4) * 4u)
                     : "memory");
        const long mm = m + r, nn = n + c4 * 4;
        if (vec) {
            mm_out4(c, coff, scm, cin, cid, bias, sbias, bias_mode, alpha, beta, ws, wsoff, N,
                    mm, nn, v);
            continue;
        }
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (mm < M && nn + k < N)
                mm_out(c, coff, scm, scn, cin, cid, bias, sbias, bias_mode, alpha, beta, ws,
                       wsoff, N, mm, nn + k, e[k]);
    }
}

inline void mm_st_shared2(uint at, float x, float y)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(x), "f"(y) : "memory");
}

/*
 * The fused cross-entropy's logits product (llmcl__matmul_ce): C's rows are tokens, its columns
 * the classes of one vocabulary chunk from class v0 (labels, weight and coef already point at the
 * launch's first row and class), and the epilogue turns each logit x = alpha acc + bias, capped,
 * into
 *   MM_CE 1: the online-LSE partial (max, sum of exp(x - max), sum w x with smoothing) of each
 *            row's slots of CE_SLOT columns, part[(m nslots + n / CE_SLOT) 3 + {0, 1, 2}] with
 *            nslots = ceil(N / CE_SLOT), and the row's target logit, xyb[m], from the lane that
 *            holds it;
 *   MM_CE 2: its dlogit (ce_dlogit with coef[m] = (A, B, C, lse_p)), stored to C.
 * So neither pass stores f32 logits, and the backward's dlogits leave in the products' dtype.
 */
typedef struct mm_ce {
    int flags;
    float cap;
    const __global label_t *labels;
    long v0, ignore;
    const __global float *weight, *coef;
    __global float *part, *xyb;
} mm_ce;

#if MM_CE && (WTN % CE_SLOT || CE_SLOT > 128)
#error "the cross-entropy epilogue reduces each slot of a row within one pass of 32 lanes"
#endif

/* The lanes that share one slot of a row in the cross-entropy epilogue, four columns each. */
#define EPI_LANES (CE_SLOT / 4)

/* The EPI_R rows of the warp's slice at ws_at through the cross-entropy epilogue (MM_CE). */
__attribute__((always_inline)) inline void
mm_ce_rows(uint ws_at, int lane, const mm_ce *ce, __global c_t *c, long coff, long scm, long scn,
           const __global bias_t *bias, long sbias, int bias_mode, float alpha, long M, long N,
           long m, long n, bool vec)
{
    const int flags = ce->flags;
    const float cap = ce->cap;
#pragma unroll 1
    for (int q = 0; q < EPI_R * WTN / 4 / 32; ++q) {
        const int id = q * 32 + lane, r = id / (WTN / 4), c4 = id % (WTN / 4);
        const long mm = m + r, nn = n + c4 * 4;
        const bool row_ok = mm < M;
        /* the row's global loads before the (volatile) local one, so that they overlap */
        const long label = row_ok ? LOAD(LABEL_DT, ce->labels, mm) : ce->ignore;
#if MM_CE != 1
        const float4 cf = row_ok ? vload4(mm, ce->coef) : (float4)(0.0f);
#endif
        float4 v;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(ws_at + (uint)(r * EPI_LD + c4 * 4) * 4u)
                     : "memory");
        const long y = label == ce->ignore ? -1 : label - ce->v0;
        const float e[4] = {v.x, v.y, v.z, v.w};
        float x[4], w[4];
        bool ok[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            ok[k] = row_ok && nn + k < N;
            float t = alpha * e[k];
            if (bias_mode == 1 && ok[k])
                t += LOAD(BIAS_DT, bias, (nn + k) * sbias);
            x[k] = CAP(t);
            /* the forward reads class weights only for smoothing's sum; the constant test comes
               first: clang (NVIDIA's compiler) warns of a constant on the right of && */
            const bool weighs = (MM_CE != 1 || (flags & CE_SMOOTH)) && (flags & CE_WEIGHT);
            w[k] = weighs && ok[k] ? ce->weight[nn + k] : 1.0f;
        }
#if MM_CE == 1
        float mx = -FLT_MAX;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (ok[k])
                mx = fmax(mx, x[k]);
        mx = warp_max_in(mx, EPI_LANES);
        float s = 0.0f, ws = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (ok[k]) {
                s += exp(x[k] - mx);
                if ((flags & CE_SMOOTH) && w[k] != 0.0f)
                    ws += w[k] * x[k];
            }
        s = warp_sum_in(s, EPI_LANES);
        if (flags & CE_SMOOTH)
            ws = warp_sum_in(ws, EPI_LANES);
        if (row_ok && c4 % EPI_LANES == 0 && nn < N) { /* a slot wholly past N is none */
            __global float *p = ce->part + (mm * ((N + CE_SLOT - 1) / CE_SLOT) + nn / CE_SLOT) * 3;
            p[0] = mx;
            p[1] = s;
            p[2] = ws;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (ok[k] && nn + k == y)
                ce->xyb[mm] = x[k];
#else
        float4 g;
        g.x = ce_dlogit(flags, cap, x[0], cf.xyz, cf.w, w[0], nn == y);
        g.y = ce_dlogit(flags, cap, x[1], cf.xyz, cf.w, w[1], nn + 1 == y);
        g.z = ce_dlogit(flags, cap, x[2], cf.xyz, cf.w, w[2], nn + 2 == y);
        g.w = ce_dlogit(flags, cap, x[3], cf.xyz, cf.w, w[3], nn + 3 == y);
        if (vec) {
            MM_STORE4(C_DT, c, coff + mm * scm + nn, g);
            continue;
        }
        const float gk[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (ok[k])
                STORE(C_DT, c, coff + mm * scm + (nn + k) * scn, gk[k]);
#endif
    }
}

/* Pass (i, h) of the epilogue: the warp's fragment rows i 16 + h 8 .. + EPI_R into its slice. */
__attribute__((always_inline)) inline void mm_stage_rows(float4 acc[MI][NI], uint ws_at, int g,
                                                         int t, int i, int h)
{
#pragma unroll
    for (int j = 0; j < NI; ++j) {
        const uint at = ws_at + (uint)(g * EPI_LD + j * 8 + 2 * t) * 4u;
        if (EPI_R == 16) {
            mm_st_shared2(at, acc[i][j].x, acc[i][j].y);
            mm_st_shared2(at + 8u * EPI_LD * 4u, acc[i][j].z, acc[i][j].w);
        } else if (h == 0) {
            mm_st_shared2(at, acc[i][j].x, acc[i][j].y);
        } else {
            mm_st_shared2(at, acc[i][j].z, acc[i][j].w);
        }
    }
}

__attribute__((always_inline)) inline void
mm_epilogue(float4 acc[MI][NI], uint base, int wm, int wn, int lane, int warp, __global c_t *c,
            long coff, long scm, long scn, const __global c_t *cin, long cid,
            const __global bias_t *bias, long sbias, int bias_mode,
            float alpha, float beta, __global float *ws, long wsoff, long M, long N, long m0,
            long n0, const mm_ce *ce)
{
    const int g = lane >> 2, t = lane & 3;
    const bool vec = m0 + BM <= M && n0 + BN <= N &&
                     (SPLITK ? (N & 3) == 0 : scn == 1 && ((coff | scm | cid) & 3) == 0);
    const uint ws_at = base + (uint)(warp * EPI_R * EPI_LD) * 4u;
    const long mw = m0 + wm * WTM, nw = n0 + wn * WTN;
    mma_cp_wait(0);
    barrier(CLK_LOCAL_MEM_FENCE); /* every warp is done with the stages */
    if (MM_CE) {
        /* One copy of the cross-entropy rows in a rolled loop: unrolled like the plain epilogue,
           its copies outgrew the instruction cache (the forward 34 -> 23 ms on the H100). */
#pragma unroll 1
        for (int p = 0; p < MI * (16 / EPI_R); ++p) {
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int h = 0; h < 16 / EPI_R; ++h)
                    if (p == i * (16 / EPI_R) + h)
                        mm_stage_rows(acc, ws_at, g, t, i, h);
            asm volatile("bar.warp.sync -1;" ::: "memory");
            mm_ce_rows(ws_at, lane, ce, c, coff, scm, scn, bias, sbias, bias_mode, alpha, M, N,
                       mw + p * EPI_R, nw, vec);
            asm volatile("bar.warp.sync -1;" ::: "memory");
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 16 / EPI_R; ++h) {
            mm_stage_rows(acc, ws_at, g, t, i, h);
            asm volatile("bar.warp.sync -1;" ::: "memory");
            mm_epilogue_rows(ws_at, lane, c, coff, scm, scn, cin, cid, bias, sbias, bias_mode,
                             alpha, beta, ws, wsoff, M, N, mw + i * 16 + h * 8, nw, vec);
            asm volatile("bar.warp.sync -1;" ::: "memory");
        }
}

/*
 * Output tile order: groups of GROUP_M tile rows, column by column inside a group, so that the
 * work-groups resident at once share their A rows and B columns in L2.
 */
inline void mm_tile_origin(long M, long N, int pid, long *m0, long *n0)
{
    const int ntm = (int)((M + BM - 1) / BM), ntn = (int)((N + BN - 1) / BN);
    const int per_group = GROUP_M * ntn, first = pid / per_group * GROUP_M;
    const int rows = min(ntm - first, GROUP_M), in_group = pid % per_group;
    *m0 = (long)(first + in_group % rows) * BM;
    *n0 = (long)(in_group / rows) * BN;
}

/* The cross-entropy epilogue's kernel arguments after MM_PARAMS, and its state from them; a bad
   label (stats[0] >= 0) fails the op, which then writes nothing. */
#if MM_CE
#define MM_CE_PARAMS                                                                              \
    , int flags, float cap, const __global label_t *labels, ulong loff, long v0,                  \
        long ignore_index, const __global float *weight, ulong woff, const __global int *stats,   \
        const __global float *coef, __global float *part, __global float *xyb
#define MM_CE_CHECK()                                                                             \
    if (stats[0] >= 0)                                                                            \
    return
#define MM_CE_STATE()                                                                             \
    const mm_ce ce = {flags, cap, labels + loff, v0, ignore_index, weight + woff, coef, part, xyb}
#else
#define MM_CE_PARAMS
#define MM_CE_CHECK() (void)0
#define MM_CE_STATE() const mm_ce ce = {0}
#endif

/*
 * Pipeline: tile kt + STAGES - 1 is requested at the top of step kt into the stage that tile
 * kt - 1 used; fragments are double-buffered in registers, so the ldmatrix of k16 step ks + 1
 * overlaps the mma of step ks; the one barrier of a step sits before its last k16 step, when
 * every warp has read all of its stage and the next tile must have landed. BK / 16 is even, so
 * the register buffer of each k16 step is known at compile time.
 */
#if !MM_WGMMA
__kernel __attribute__((reqd_work_group_size(NT, 1, 1))) void mm_mma(MM_PARAMS MM_CE_PARAMS)
{
    __local uint4 smem[STAGES * (STAGE_A + STAGE_B) / 16];
    MM_CE_CHECK();
    MM_CE_STATE();
    MM_SLICE();
    const uint base = mma_smem(smem);
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    long m0, n0;
    mm_tile_origin(M, N, get_group_id(0), &m0, &n0);
    const int nk = (int)((k_hi - k_lo + BK - 1) / BK);
#define KS (BK / 16)
#define STAGE(i) (base + ((i) % STAGES) * (STAGE_A + STAGE_B))

    float4 acc[MI][NI];
    for (int i = 0; i < MI; ++i)
        for (int j = 0; j < NI; ++j)
            acc[i][j] = (float4)(0.0f);

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk)
            mm_load_stage(STAGE(s), a, sam, sak, b, sbk, sbn, M, N, m0, n0, k_lo + (long)s * BK,
                          k_hi, tid);
        mma_cp_commit();
    }
    mma_cp_wait(STAGES - 2);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint4 af[2][MI], bf[2][NI / 2];
    mm_frags(STAGE(0), 0, wm, wn, lane, af[0], bf[0]);
    for (int kt = 0; kt < nk; ++kt) {
        const int next = kt + STAGES - 1;
        if (next < nk)
            mm_load_stage(STAGE(next), a, sam, sak, b, sbk, sbn, M, N, m0, n0,
                          k_lo + (long)next * BK, k_hi, tid);
        mma_cp_commit();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            if (ks == KS - 1) {
                mma_cp_wait(STAGES - 2);
                barrier(CLK_LOCAL_MEM_FENCE);
                mm_frags(STAGE(kt + 1), 0, wm, wn, lane, af[(ks + 1) & 1], bf[(ks + 1) & 1]);
            } else {
                mm_frags(STAGE(kt), ks + 1, wm, wn, lane, af[(ks + 1) & 1], bf[(ks + 1) & 1]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI / 2; ++j) {
                    acc[i][2 * j] = MMA(acc[i][2 * j], af[ks & 1][i], bf[ks & 1][j].xy);
                    acc[i][2 * j + 1] = MMA(acc[i][2 * j + 1], af[ks & 1][i], bf[ks & 1][j].zw);
                }
        }
    }
#undef KS
#undef STAGE

    mm_epilogue(acc, base, wm, wn, lane, warp, c, coff, scm, scn, cin, cid, bias, sbias,
                bias_mode, alpha, beta, ws, wsoff, M, N, m0, n0, &ce);
}
#endif

/*
 * mm_wgmma: the product on Hopper's wgmma (sm_90a, LLMCL_NV_WGMMA). BM / (64 WG_MB) warpgroups
 * each own 64 WG_MB rows of a BM x BN output tile, whose WG_ACC f32 accumulators a lane holds
 * (128 x 256 tiles, or 256 x 192, which read 22% fewer bytes a product from L2: the H100 feeds
 * the tensor cores from L2 no faster than about 7 TB/s, docs/PERFORMANCE.md); BK is 64. Every
 * work-item issues the cp.async copies of a STAGES-deep pipeline, loads run STAGES - 2 slices
 * ahead, and each warpgroup keeps one slice's wgmma running while the next one is issued: the
 * barrier at the top of step kt, after every warpgroup has waited for its wgmma of slice kt - 2,
 * frees that slice's stage for the load of slice kt + STAGES - 2.
 *
 * Work-groups are persistent: one walks the tiles from its group id in steps of the grid, and
 * the copies of its next tile's first slices are in flight while it writes the current one
 * (the epilogue works from the registers, so the stages are free by then).
 */
#if MM_WGMMA && defined(LLMCL_NV_WGMMA)

#if BN % 64 || BN > 256 || WG_MB * BN > 384 || BK != 64 || WN != 1 || BM % (64 * WG_MB) || \
    STAGES < 3
#error "mm_wgmma: 64 WG_MB x BN tiles a warpgroup (BN 64 to 256 in steps of 64, 192 accumulators at most), BK 64, WN 1, three stages or more"
#endif

/* The accumulators of a lane: WG_MB blocks of 64 rows, BN / 2 each */
#define WG_ACC (WG_MB * BN / 2)

#define MM_WG_TA LLMCL_CAT(MM_WG_T, A_KC)
#define MM_WG_TB LLMCL_CAT(MM_WG_T, B_KC)
#define MM_WG_T0 "1"
#define MM_WG_T1 "0"
LLMCL_WG_MMA_SS(mm_wg_mma_BF16, "bf16", BN, MM_WG_TA, MM_WG_TB)
LLMCL_WG_MMA_SS(mm_wg_mma_F16, "f16", BN, MM_WG_TA, MM_WG_TB)

/* Adds warpgroup wg's product of k16 step ks of the stage at sa to d, block by block of 64 rows. */
inline void mm_wg_step(float *d, uint sa, int ks, int wg)
{
    const uint sb = sa + STAGE_A;
    const ulong db = B_KC ? wg_desc(sb + ks * 32, 16, 1024)
                          : wg_desc(sb + ks * 16 * 128, BK * 128, 1024);
#pragma unroll
    for (int i = 0; i < WG_MB; ++i) {
        const int blk = wg * WG_MB + i;
        const ulong da = A_KC ? wg_desc(sa + blk * 64 * 128 + ks * 32, 16, 1024)
                              : wg_desc(sa + blk * BK * 128 + ks * 16 * 128, BK * 128, 1024);
        LLMCL_CAT(mm_wg_mma_, DT)(d + i * (BN / 2), da, db, 1);
    }
}

/*
 * The epilogue works on the accumulators where wgmma leaves them: in each block of 64 rows, lane
 * (g, t) = (lane / 4, lane % 4) of the warpgroup's warp w holds row 16 w + g in d[4 j],
 * d[4 j + 1] and row 16 w + g + 8 in d[4 j + 2], d[4 j + 3], at columns 8 j + 2 t and
 * 8 j + 2 t + 1 (j < BN / 8). So a lane writes pairs, and a quad's four lanes 8 consecutive
 * columns of a row.
 */
#define MM_WG_PAIRS (BN / 8)
/* Pairs of columns whose loads of C are issued together before their stores. */
#define MM_WG_BATCH 8

/* Two consecutive elements at p + i, which is 2-element aligned, as one access. */
inline float2 mm_load2_F32(const __global float *p, long i)
{
    return *(const __global float2 *)(p + i);
}
inline float2 mm_load2_BF16(const __global ushort *p, long i)
{
    return bf16x2_to_f32(*(const __global ushort2 *)(p + i));
}
inline float2 mm_load2_F16(const __global ushort *p, long i)
{
    return vload_half2(0, (const __global half *)(p + i));
}
inline void mm_store2_F32(__global float *p, long i, float2 v) { *(__global float2 *)(p + i) = v; }
/* The 16-bit roundings are sm_80's paired instructions (common.cl): on the H100 the bf16 bit
   arithmetic cost a 128 x 256 tile about 20 us (GEMM 8192^3: 504 -> 601 TFLOP/s). */
inline void mm_store2_BF16(__global ushort *p, long i, float2 v)
{
    *(__global ushort2 *)(p + i) = f32x2_to_bf16(v);
}
inline void mm_store2_F16(__global ushort *p, long i, float2 v)
{
    *(__global uint *)(p + i) = f32x2_to_f16_packed(v);
}
#define MM_LOAD2(DT, p, i) LLMCL_CAT(mm_load2_, DT)((p), (i))
#define MM_STORE2(DT, p, i, v) LLMCL_CAT(mm_store2_, DT)((p), (i), (v))

/* The accumulator pair j of row half h (0: row g, 1: row g + 8). */
#define MM_WG_PAIR(d, h, j) ((float2)((d)[4 * (j) + 2 * (h)], (d)[4 * (j) + 2 * (h) + 1]))

/*
 * What the epilogue adds to alpha times pair j0 + j (j < count, a constant) of the lane's row mm
 * from column n: the bias and beta C_in, loaded a batch of pairs ahead of the stores, so that
 * their latencies overlap.
 */
__attribute__((always_inline)) inline void
mm_wg_adds(float2 *add, int j0, int count, long coff, long scm, const __global c_t *cin,
           long cid, const __global bias_t *bias, long sbias, int bias_mode, float beta, long mm,
           long n)
{
#pragma unroll
    for (int j = 0; j < count; ++j) {
        const long nn = n + 8 * (j0 + j);
        add[j] = (float2)(0.0f);
        if (bias_mode == 1)
            add[j] = (float2)(LOAD(BIAS_DT, bias, nn * sbias),
                              LOAD(BIAS_DT, bias, (nn + 1) * sbias));
        else if (bias_mode == 2)
            add[j] = (float2)(LOAD(BIAS_DT, bias, mm * sbias));
        if (beta != 0.0f)
            add[j] += beta * MM_LOAD2(C_DT, cin, coff + cid + mm * scm + nn);
    }
}

/*
 * With MM_PRELOAD (alpha 1, beta not 0, C's rows runs of aligned pairs: the launcher's choice) the
 * lane's accumulators start from beta C_in, and the epilogue adds no addend: its loads are all in
 * flight at once, under the tile's first copies, where the epilogue's batches wait for theirs one
 * after another at the end. That pays where a work-group takes one tile (H200, a weight gradient
 * of 3072 x 2048 x 8192 into f32 on one wave of 256 x 192 tiles: 0.166 -> 0.154 ms), not where
 * the loads stall every tile's first product (4096 x 4096 x 8192: 0.377 -> 0.448). A define, not a
 * branch on the arguments: accumulators that a branch may leave zeroed or loaded made ptxas
 * serialise every wgmma (C7515). Not with a K split (its slices are summed later) or the
 * cross-entropy's epilogues.
 */
#ifndef MM_PRELOAD
#define MM_PRELOAD 0
#endif
#define MM_WG_PRELOAD (MM_PRELOAD && !SPLITK && !MM_CE)
__attribute__((always_inline)) inline void mm_wg_preload(float *d, const __global c_t *cin,
                                                         long ci, long scm, float beta, long M,
                                                         long N, long m, long n)
{
#pragma unroll
    for (int i = 0; i < WG_MB; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < MM_WG_PAIRS; ++j) {
                const long mm = m + 64 * i + 8 * h, nn = n + 8 * j, e = ci + mm * scm + nn;
                float2 v = (float2)(0.0f);
                if (mm < M && nn + 1 < N)
                    v = MM_LOAD2(C_DT, cin, e);
                else if (mm < M && nn < N)
                    v.x = LOAD(C_DT, cin, e);
                d[i * (BN / 2) + 4 * j + 2 * h] = beta * v.x;
                d[i * (BN / 2) + 4 * j + 2 * h + 1] = beta * v.y;
            }
}

#define MM_C16_F32 0
#define MM_C16_BF16 1
#define MM_C16_F16 1
#define MM_C16 LLMCL_CAT(MM_C16_, C_DT)
#if MM_C16
/* A pair as C's 16-bit type, packed in one word. */
inline uint mm_pack2_BF16(float2 v) { return as_uint(f32x2_to_bf16(v)); }
inline uint mm_pack2_F16(float2 v) { return f32x2_to_f16_packed(v); }
#define mm_pack2 LLMCL_CAT(mm_pack2_, C_DT)

inline uint mm_quad_xor(uint v, int k)
{
    uint r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(k));
    return r;
}

/*
 * Lane t of a quad holds w[u], columns 8 u + 2 t and 8 u + 2 t + 1 of a row (u < 4); returns the
 * four words of columns 8 t .. 8 t + 7 in order, a 4 x 4 transpose across the quad: in round k
 * lane t receives lane t ^ k's word u = t, which sits at position t ^ k. The selects keep the
 * lane-dependent indices out of private memory.
 */
inline uint4 mm_quad_transpose(uint w0, uint w1, uint w2, uint w3, int t)
{
#define MM_PICK(i) ((i) == 0 ? w0 : (i) == 1 ? w1 : (i) == 2 ? w2 : w3)
    const uint r0 = MM_PICK(t), r1 = mm_quad_xor(MM_PICK(t ^ 1), 1),
               r2 = mm_quad_xor(MM_PICK(t ^ 2), 2), r3 = mm_quad_xor(MM_PICK(t ^ 3), 3);
#undef MM_PICK
#define MM_FROM(m) (((m) ^ t) == 0 ? r0 : ((m) ^ t) == 1 ? r1 : ((m) ^ t) == 2 ? r2 : r3)
    return (uint4)(MM_FROM(0), MM_FROM(1), MM_FROM(2), MM_FROM(3));
#undef MM_FROM
}

/*
 * The plain epilogue's 16-bit rows where the tile lies inside C with 8-element aligned rows: each
 * quad trades its pairs (mm_quad_transpose) so that a lane stores 8 consecutive columns at once,
 * and a warp's store covers 64 contiguous bytes of each of its 8 rows, where the pairs' stores
 * covered 16: on the H200 the product 8192 x 2048 x 512 went from 0.057 to 0.041 ms and
 * 8192 x 2048 x 2048 from 0.128 to 0.114 (the same trade for f32 rows, float4 stores, ran slower).
 */
__attribute__((always_inline)) inline void
mm_wg_epilogue16(const float *d, int h, __global c_t *c, long coff, long scm,
                 const __global c_t *cin, long cid, const __global bias_t *bias, long sbias,
                 int bias_mode, float alpha, float beta, long mm, long n)
{
    const int t = get_local_id(0) & 3; /* n is the quad's first column plus 2 t */
    const long row = coff + mm * scm + n - 2 * t;
#pragma unroll
    for (int j0 = 0; j0 < MM_WG_PAIRS; j0 += MM_WG_BATCH) {
        float2 add[MM_WG_BATCH];
        mm_wg_adds(add, j0, MM_WG_BATCH, coff, scm, cin, cid, bias, sbias, bias_mode, beta, mm,
                   n);
        uint w[MM_WG_BATCH];
#pragma unroll
        for (int j = 0; j < MM_WG_BATCH; ++j)
            w[j] = mm_pack2(alpha * MM_WG_PAIR(d, h, j0 + j) + add[j]);
#pragma unroll
        for (int q = 0; q < MM_WG_BATCH; q += 4)
            *(__global uint4 *)(c + row + 8 * (j0 + q + t)) =
                mm_quad_transpose(w[q], w[q + 1], w[q + 2], w[q + 3], t);
    }
}
#endif

/* The plain epilogue by TMA's stores (MM_TMA_STORE), where it applies. */
#define MM_EPI_TMA                                                                                \
    (MM_TMA_STORE && MM_TMA && !MM_CE && !SPLITK && (MM_C16 || BN % 128 == 0))
#if MM_EPI_TMA
/* A warpgroup's slab of local memory: BN / 64 boxes of its 64 WG_MB rows by 128 bytes (64
   16-bit columns, 32 f32 ones), in the 128-byte swizzle (wg_chunk), which TMA's stores undo. */
#define MM_EPI_BOX (64 * WG_MB * 128)
#define MM_EPI_SLAB (BN / 64 * MM_EPI_BOX)

#if MM_C16
/*
 * The plain epilogue of a tile inside C through local memory: the warpgroup's lanes write their
 * rounded sums to its slab with stmatrix (the accumulators' layout is stmatrix's, and the swizzle
 * puts a matrix's 8 rows in distinct banks), then its first work-item stores the slab by TMA,
 * whose copies run on while the warpgroup multiplies its next tile (on the H200 the forward's
 * and dX's products ran 0-2.6% faster than with the stores from the registers). The slab is
 * written again only once the tile before's stores have read it. Row m and column n are the
 * lane's first, as for mm_wg_epilogue; (m0, n0) is the warpgroup's first.
 */
__attribute__((always_inline)) inline float
mm_wg_epilogue_tma(const float *d, uint slab, ulong map_c, int wg, long m0, long n0, long coff,
                   long scm, const __global c_t *cin, long cid, const __global bias_t *bias,
                   long sbias, int bias_mode, float alpha, float beta, long m, long n)
{
    const int tid = get_local_id(0), lane = tid & 31, mat = lane >> 3, r = lane & 7;
    if ((tid & 127) == 0)
        wg_bulk_read(0);
    wg_named_barrier(1 + wg, 128);
#pragma unroll
    for (int i = 0; i < WG_MB; ++i) {
        /* lanes 8 q .. 8 q + 7 address matrix q: pair j + q / 2 of row half q % 2 */
        const uint row = slab + (uint)(64 * i + 16 * ((tid >> 5) & 3) + 8 * (mat & 1) + r) * 128;
        const float *di = d + i * (BN / 2);
#pragma unroll
        for (int j0 = 0; j0 < MM_WG_PAIRS; j0 += MM_WG_BATCH) {
            float2 add0[MM_WG_BATCH], add1[MM_WG_BATCH];
            mm_wg_adds(add0, j0, MM_WG_BATCH, coff, scm, cin, cid, bias, sbias, bias_mode, beta,
                       m + 64 * i, n);
            mm_wg_adds(add1, j0, MM_WG_BATCH, coff, scm, cin, cid, bias, sbias, bias_mode, beta,
                       m + 64 * i + 8, n);
            uint w0[MM_WG_BATCH], w1[MM_WG_BATCH];
#pragma unroll
            for (int j = 0; j < MM_WG_BATCH; ++j) {
                w0[j] = mm_pack2(alpha * MM_WG_PAIR(di, 0, j0 + j) + add0[j]);
                w1[j] = mm_pack2(alpha * MM_WG_PAIR(di, 1, j0 + j) + add1[j]);
            }
#pragma unroll
            for (int q = 0; q < MM_WG_BATCH; q += 2) {
                const int j = j0 + q + (mat >> 1);
                wg_stmatrix4(row + (j >> 3) * MM_EPI_BOX + (((j & 7) ^ r) << 4), w0[q], w1[q],
                             w0[q + 1], w1[q + 1]);
            }
        }
    }
    wg_proxy_fence();
    wg_named_barrier(1 + wg, 128);
    if ((tid & 127) == 0) {
        for (int b = 0; b < BN / 64; ++b)
            wg_tma_store(map_c, (int)(n0 + 64 * b), (int)m0, slab + b * MM_EPI_BOX);
        wg_bulk_commit();
    }
    return 0.0f;
}
#else
/* The pairs of a lane's row in a quarter of the tile's columns. */
#define MM_EPI_PAIRS (BN / 32)

/*
 * The same for an f32 C, whose rows take twice the bytes: the slab holds half of them, so the
 * warpgroup writes its rows a quarter of their columns at a time, into the slab's halves in
 * turn, and the stores of one quarter read their half while the next is written to the other.
 * A lane writes its pairs with st.shared (in the swizzle a warp's 8 rows of 32 bytes take two
 * wavefronts, the fewest for 256 bytes). With MM_SUMSQ returns the sum of the squares of what it
 * stored.
 */
__attribute__((always_inline)) inline float
mm_wg_epilogue_tma(const float *d, uint slab, ulong map_c, int wg, long m0, long n0, long coff,
                   long scm, const __global c_t *cin, long cid, const __global bias_t *bias,
                   long sbias, int bias_mode, float alpha, float beta, long m, long n)
{
    const int tid = get_local_id(0), t = tid & 3, g = (tid >> 2) & 7;
    float2 sq[4] = {(float2)(0.0f), (float2)(0.0f), (float2)(0.0f), (float2)(0.0f)};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint part = slab + (q & 1) * (MM_EPI_SLAB / 2);
        if ((tid & 127) == 0)
            wg_bulk_read(1);
        wg_named_barrier(1 + wg, 128);
#pragma unroll
        for (int i = 0; i < WG_MB; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint row = part + (uint)(64 * i + 16 * ((tid >> 5) & 3) + 8 * h + g) * 128;
                float2 add[MM_EPI_PAIRS];
                mm_wg_adds(add, q * MM_EPI_PAIRS, MM_EPI_PAIRS, coff, scm, cin, cid, bias, sbias,
                           bias_mode, beta, m + 64 * i + 8 * h, n);
#pragma unroll
                for (int j = 0; j < MM_EPI_PAIRS; ++j) {
                    const float2 v =
                        alpha * MM_WG_PAIR(d + i * (BN / 2), h, q * MM_EPI_PAIRS + j) + add[j];
                    sq[j & 3] += v * v;
                    /* box j / 4; the pair's 16-byte chunk of the row, 2 (j % 4) + t / 2 */
                    const uint chunk = (uint)((2 * (j & 3) + (t >> 1)) ^ g);
                    mm_st_shared2(row + (j >> 2) * MM_EPI_BOX + chunk * 16 + (t & 1) * 8, v.x,
                                  v.y);
                }
            }
        wg_proxy_fence();
        wg_named_barrier(1 + wg, 128);
        if ((tid & 127) == 0) {
            for (int b = 0; b < BN / 128; ++b)
                wg_tma_store(map_c, (int)(n0 + q * (BN / 4) + 32 * b), (int)m0,
                             part + b * MM_EPI_BOX);
            wg_bulk_commit();
        }
    }
    const float2 total = (sq[0] + sq[1]) + (sq[2] + sq[3]);
    return MM_SUMSQ ? total.x + total.y : 0.0f;
}
#endif
#endif

/*
 * Plain epilogue of the lane's row m + 8 h from column n: mm_out's sums, pairs at a time where
 * the tile lies inside C with 2-element aligned rows (16-bit rows aligned to 8 elements:
 * mm_wg_epilogue16). With MM_SUMSQ returns the sum of the squares of what it stored.
 */
__attribute__((always_inline)) inline float
mm_wg_epilogue(const float *d, int h, __global c_t *c, long coff, long scm, long scn,
               const __global c_t *cin, long cid, const __global bias_t *bias, long sbias,
               int bias_mode, float alpha, float beta, __global float *ws, long wsoff, long M,
               long N, long m, long n, bool inside)
{
    const bool vec =
        inside && (SPLITK ? (N & 1) == 0 : scn == 1 && ((coff | scm | cid) & 1) == 0);
    const long mm = m + 8 * h;
#if MM_C16 && !SPLITK
    if (vec && ((coff | scm) & 7) == 0) {
        mm_wg_epilogue16(d, h, c, coff, scm, cin, cid, bias, sbias, bias_mode, alpha, beta, mm,
                         n);
        return 0.0f;
    }
#endif
    /* the squares in eight partial sums: one chain of adds through every value cost the H200's
       weight gradients' products 5-10% of their time, two chains 2% */
    float2 sq[4] = {(float2)(0.0f), (float2)(0.0f), (float2)(0.0f), (float2)(0.0f)};
#pragma unroll
    for (int j0 = 0; j0 < MM_WG_PAIRS; j0 += MM_WG_BATCH) {
        float2 add[MM_WG_BATCH] = {0};
        if (vec && !SPLITK)
            mm_wg_adds(add, j0, MM_WG_BATCH, coff, scm, cin, cid, bias, sbias, bias_mode, beta,
                       mm, n);
#pragma unroll
        for (int j = 0; j < MM_WG_BATCH; ++j) {
            const long nn = n + 8 * (j0 + j);
            const float2 acc = MM_WG_PAIR(d, h, j0 + j);
            if (vec && SPLITK) {
                *(__global float2 *)(ws + wsoff + mm * N + nn) = acc;
            } else if (vec) {
                const float2 v = alpha * acc + add[j];
                MM_STORE2(C_DT, c, coff + mm * scm + nn, v);
                sq[(j0 + j) & 3] += v * v;
            } else {
                if (mm < M && nn < N) {
                    const float v = mm_out(c, coff, scm, scn, cin, cid, bias, sbias, bias_mode,
                                           alpha, beta, ws, wsoff, N, mm, nn, acc.x);
                    sq[0].x += v * v;
                }
                if (mm < M && nn + 1 < N) {
                    const float v = mm_out(c, coff, scm, scn, cin, cid, bias, sbias, bias_mode,
                                           alpha, beta, ws, wsoff, N, mm, nn + 1, acc.y);
                    sq[0].y += v * v;
                }
            }
        }
    }
    const float2 total = (sq[0] + sq[1]) + (sq[2] + sq[3]);
    return MM_SUMSQ ? total.x + total.y : 0.0f;
}

/*
 * The cross-entropy epilogues take exponentials with native_exp (ex2.approx of x log2(e), as
 * Triton's exp does: relative errors of |x| 2^-24 and a few ulp, where exp's correct rounding
 * costs about a dozen instructions each: 0.5 ms of path 3's forward on the H100).
 *
 * They index a lane's columns from its first, nl = n0 + 2 t: pair j's element e is column
 * nl + 8 j + e, inside C when 8 j + e < left (the columns from nl on, at most BN, 0 for a row
 * past M), and the row's target when 8 j + e == yq. Small constants against two per-row values
 * keep the 128 columns' tests out of the registers the accumulators need.
 */
typedef struct mm_ce_row {
    long m;    /* the row; m < M when left > 0 */
    int left;  /* columns of C from the lane's first on within the tile (0 past M) */
    int yq;    /* the target's column from the lane's first (-1: elsewhere or none) */
} mm_ce_row;

inline mm_ce_row mm_ce_row_of(const mm_ce *ce, long m, long M, long N, long nl)
{
    mm_ce_row r = {m, 0, -1};
    if (m >= M)
        return r;
    r.left = (int)clamp(N - nl, 0L, (long)BN);
    const long label = LOAD(LABEL_DT, ce->labels, m);
    const long y = label == ce->ignore ? -1 : label - ce->v0 - nl;
    r.yq = y >= 0 && y < BN ? (int)y : -1;
    return r;
}

/*
 * The capped logits CAP(alpha acc + bias[n]) in place (bias_mode 1: the classes' bias), ahead of
 * the cross-entropy epilogues: the lane's two rows share its columns' bias, loaded once, a batch
 * of pairs at a time (the compiler fence keeps all 64 loads from being hoisted into registers),
 * and the cap is a pass of its own under a uniform branch.
 */
__attribute__((always_inline)) inline void mm_wg_ce_logits(float *d, const mm_ce *ce,
                                                           const __global bias_t *bias,
                                                           long sbias, int bias_mode, float alpha,
                                                           long N, long nl)
{
    const int flags = ce->flags;
    const float cap = ce->cap;
    const int left = bias_mode == 1 ? (int)clamp(N - nl, 0L, (long)BN) : 0;
#pragma unroll
    for (int j0 = 0; j0 < MM_WG_PAIRS; j0 += MM_WG_BATCH) {
        float b[2 * MM_WG_BATCH];
#pragma unroll
        for (int k = 0; k < 2 * MM_WG_BATCH; ++k) {
            const int off = 8 * (j0 + k / 2) + k % 2;
            b[k] = off < left ? LOAD(BIAS_DT, bias, (nl + off) * sbias) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 2 * MM_WG_BATCH; ++k) {
            const int i = 4 * (j0 + k / 2) + k % 2;
            d[i] = alpha * d[i] + b[k];
            d[i + 2] = alpha * d[i + 2] + b[k];
        }
        asm volatile("" ::: "memory");
    }
    if (flags & CE_CAP) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)
            d[i] = CAP(d[i]);
    }
}

/*
 * MM_CE 1 from the registers, slot s of row half h: the LSE partial of the lane's CE_SLOT / 4
 * logits reduced over its quad, and the target logit into *xt where the lane holds it. The
 * columns past N are masked by selects, not branches: a branch around each logit split the
 * code into blocks of one exp each, which could not overlap. Smoothing's weighted sum, which
 * may load class weights, is a pass of its own.
 */
__attribute__((always_inline)) inline void
mm_wg_ce_slot(const float *d, int h, int s, const mm_ce *ce, const mm_ce_row *r, int t, long N,
              long nl, float *xt)
{
    const int flags = ce->flags;
    float mx = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < CE_SLOT / 4; ++k) {
        const int j = s * (CE_SLOT / 8) + k / 2, off = 8 * j + k % 2;
        const float x = d[4 * j + 2 * h + k % 2];
        mx = fmax(mx, off < r->left ? x : -FLT_MAX);
        *xt = off == r->yq ? x : *xt;
    }
    mx = warp_max_in(mx, 4);
    float sum = 0.0f, ws = 0.0f;
#pragma unroll
    for (int k = 0; k < CE_SLOT / 4; ++k) {
        const int j = s * (CE_SLOT / 8) + k / 2, off = 8 * j + k % 2;
        const float e = native_exp(d[4 * j + 2 * h + k % 2] - mx);
        sum += off < r->left ? e : 0.0f;
    }
    sum = warp_sum_in(sum, 4);
    if (flags & CE_SMOOTH) {
#pragma unroll
        for (int k = 0; k < CE_SLOT / 4; ++k) {
            const int j = s * (CE_SLOT / 8) + k / 2, off = 8 * j + k % 2;
            /* the forward reads class weights only for smoothing's sum */
            const float w = (flags & CE_WEIGHT) && off < r->left ? ce->weight[nl + off] : 1.0f;
            if (off < r->left && w != 0.0f)
                ws += w * d[4 * j + 2 * h + k % 2];
        }
        ws = warp_sum_in(ws, 4);
    }
    const long slot0 = nl - 2 * t + s * CE_SLOT;
    if (r->left > 0 && t == 0 && slot0 < N) { /* a slot wholly past N is none */
        __global float *p = ce->part + (r->m * ((N + CE_SLOT - 1) / CE_SLOT) + slot0 / CE_SLOT) * 3;
        p[0] = mx;
        p[1] = sum;
        p[2] = ws;
    }
}

#if MM_CE && BN / CE_SLOT != 4 && BN / CE_SLOT != 3
#error "mm_wgmma's forward epilogue takes three or four slots a row"
#endif

/* MM_CE 1 from the registers, row half h: its slots (each in its own call, so that d's indices
   stay constants), then the target logit. */
__attribute__((always_inline)) inline void
mm_wg_ce_partials(const float *d, int h, const mm_ce *ce, int t, long M, long N, long m, long nl)
{
    const mm_ce_row r = mm_ce_row_of(ce, m + 8 * h, M, N, nl);
    float xt = 0.0f;
    mm_wg_ce_slot(d, h, 0, ce, &r, t, N, nl, &xt);
    mm_wg_ce_slot(d, h, 1, ce, &r, t, N, nl, &xt);
    mm_wg_ce_slot(d, h, 2, ce, &r, t, N, nl, &xt);
#if BN / CE_SLOT == 4
    mm_wg_ce_slot(d, h, 3, ce, &r, t, N, nl, &xt);
#endif
    /* the lane's columns are 8 j and 8 j + 1 from its first */
    if (r.yq >= 0 && (r.yq & 6) == 0 && r.yq < r.left)
        ce->xyb[r.m] = xt;
}

/*
 * MM_CE 2 from the registers: each logit's dlogit (ce_dlogit_e), stored to C in pairs. `weighs`
 * is a constant at each call (class weights or none), so that neither form branches around
 * each logit for its weight.
 */
__attribute__((always_inline)) inline void
mm_wg_ce_dlogits(const float *d, int h, const mm_ce *ce, bool weighs, __global c_t *c, long coff,
                 long scm, long scn, long M, long N, long m, long nl, bool inside)
{
    const int flags = ce->flags;
    const float cap = ce->cap;
    const bool vec = inside && scn == 1 && ((coff | scm) & 1) == 0;
    const mm_ce_row r = mm_ce_row_of(ce, m + 8 * h, M, N, nl);
    const float4 cf = r.left > 0 ? vload4(r.m, ce->coef) : (float4)(0.0f);
    const long ci = coff + r.m * scm + nl * scn;
#pragma unroll
    for (int j = 0; j < MM_WG_PAIRS; ++j) {
        const float2 x = MM_WG_PAIR(d, h, j);
        const int off = 8 * j;
        const bool ok0 = off < r.left, ok1 = off + 1 < r.left;
        const float w0 = weighs && ok0 ? ce->weight[nl + off] : 1.0f;
        const float w1 = weighs && ok1 ? ce->weight[nl + off + 1] : 1.0f;
        const float2 e = (float2)(native_exp(x.x - cf.w), native_exp(x.y - cf.w));
        const float2 g = (float2)(ce_dlogit_e(flags, cap, x.x, e.x, cf.xyz, w0, off == r.yq),
                                  ce_dlogit_e(flags, cap, x.y, e.y, cf.xyz, w1, off + 1 == r.yq));
        if (vec) {
            MM_STORE2(C_DT, c, ci + off, g);
            continue;
        }
        if (ok0)
            STORE(C_DT, c, ci + off * scn, g.x);
        if (ok1)
            STORE(C_DT, c, ci + (off + 1) * scn, g.y);
    }
}

#if MM_TMA
/* The tensor-map templates (nv_tma.c) of A's and B's dtype and of C's, and a work-group's MM_MAPS
   global slots for its maps: A's, B's, with MM_EXT A2's and B2's, and with MM_EPI_TMA each
   warpgroup's of C (from slot MM_MAP_C). */
#define MM_TMA_PARAMS , ulong16 tma_map, ulong16 tma_map_c, __global ulong16 *tma_slots
#define MM_MAP_C (2 + 2 * MM_EXT)
#define MM_MAPS (MM_MAP_C + (MM_EPI_TMA ? NT / 128 : 0))

/* The rows of a k-major operand's box (kc) for a side of extent elements in tiles of tile. */
inline int mm_box_rows(bool kc, long extent, int tile)
{
    return kc && extent < tile ? ((int)extent + 7) & ~7 : tile;
}

/*
 * Thread 0's copies, by TMA, of slice p of its group's tiles (tile p / (nk + nk2) of the group's
 * walk, then its k-slice: A's and B's first nk, A2's and B2's (maps ext) the nk2 after) into stage
 * p % STAGES, once every work-item has released the stage's previous slice (empty) and with the
 * stage's full barrier expecting the boxes' bytes. A box's rows past M or N and its k past K (K2)
 * arrive as zeros. An mn-major operand comes in atoms of 64.
 */
inline void mm_tma_produce(int p, int nk, int nk2, int step, long k_lo, long M, long N, uint base,
                           uint full, uint empty, ulong map_a, ulong map_b, ulong2 ext)
{
    const int s = p % STAGES, slice = p % (nk + nk2);
    long m0, n0;
    mm_tile_origin(M, N, (int)get_group_id(0) + (p / (nk + nk2)) * step, &m0, &n0);
    const bool second = slice >= nk;
    const ulong ma = second ? ext.x : map_a, mb = second ? ext.y : map_b;
    const int k = second ? (slice - nk) * BK : (int)(k_lo + (long)slice * BK);
    const int m = (int)m0, n = (int)n0;
    const uint bar = full + 8 * s, sa = base + s * (STAGE_A + STAGE_B), sb = sa + STAGE_A;
    if (p >= STAGES)
        wg_bar_wait(empty + 8 * s, (p / STAGES + 1) & 1);
    wg_bar_expect(bar, (mm_box_rows(A_KC, M, BM) + mm_box_rows(B_KC, N, BN)) * BK * 2);
    if (A_KC)
        wg_tma_load(sa, ma, k, m, bar);
    else
        for (int i = 0; i < BM / 64; ++i)
            wg_tma_load(sa + i * BK * 128, ma, m + 64 * i, k, bar);
    if (B_KC)
        wg_tma_load(sb, mb, k, n, bar);
    else
        for (int i = 0; i < BN / 64; ++i)
            wg_tma_load(sb + i * BK * 128, mb, n + 64 * i, k, bar);
}
#else
#define MM_TMA_PARAMS
#endif

#if MM_EXT
#if !MM_TMA || SPLITK || MM_CE
#error "MM_EXT goes on along K by TMA's copies, in an unsplit product without MM_CE"
#endif
#define MM_EXT_PARAMS                                                                             \
    , const __global ab_t *a2, ulong a2off, long sa2m, long sa2k, const __global ab_t *b2,       \
        ulong b2off, long sb2k, long sb2n, long K2
#else
#define MM_EXT_PARAMS
#endif

/*
 * MM_SUMSQ: a warp's sum of squares of a tile, summed over its lanes in a fixed butterfly, stored
 * by its first lane at the tile's and warp's slot.
 */
#if MM_SUMSQ
#if MM_C16 || MM_CE || SPLITK
#error "MM_SUMSQ sums an f32 C of an unsplit product without the cross-entropy epilogue"
#endif
#define MM_SUMSQ_PARAMS , __global float *sumsq, long sumsq_first
#define MM_SUMSQ_STORE(sq)                                                                        \
    {                                                                                             \
        const float wsq = warp_sum(sq);                                                           \
        if (lane == 0)                                                                            \
            sumsq[sumsq_first + (z * ntiles + tile) * (NT / 32) + warp] = wsq;                    \
    }
#else
#define MM_SUMSQ_PARAMS
#define MM_SUMSQ_STORE(sq) (void)(sq)
#endif

/*
 * With MM_TMA the copies are Hopper's TMA: a stage's full barrier completes when its bytes have
 * landed, and its empty barrier when every warpgroup work-item's wgmma of it is done, which frees
 * it for the next copy. They bypass L1, which 256 x 192 tiles in four stages leave too small for
 * cp.async.ca's copies. Work-item 0 issues them (mm_tma_produce) STAGES - 1 slices ahead, between
 * its own products, and so only when the other warpgroups have caught up with it; with MM_WS a
 * producer warp of its own (the work-group's last) issues each as soon as its stage is free,
 * STAGES slices ahead, and runs on through the epilogues. A 288-wide work-group leaves a lane 168
 * registers (a multiprocessor's quarter holds three of its nine warps): two warpgroups of 128
 * accumulators a lane spill a little there (ptxas: 16 bytes into a 16-bit C, 124 into f32; a
 * producer warpgroup that gave them 240, spilling none, ran level on the H200), those of 192 far
 * more, and so does an f32 C's epilogue by TMA (clang's PTX at 168: 848 bytes against 240 from
 * the registers), so there the producers are a warpgroup that gives its registers to them
 * (setmaxnreg: 384 work-items enter with 168; 24 for the producers, 240 for the others), as in
 * attention_wgmma.cl.
 */
#if MM_TMA && MM_WS
#define MM_PRODUCER NT
#define MM_PRODUCERS (NT == 256 && (WG_MB == 2 || (MM_TMA_STORE && !MM_C16)) ? 128 : 32)
#else
#define MM_PRODUCER 0
#define MM_PRODUCERS 0
#endif
__kernel __attribute__((reqd_work_group_size(NT + MM_PRODUCERS, 1, 1))) void
mm_wgmma(MM_PARAMS MM_CE_PARAMS MM_SUMSQ_PARAMS MM_TMA_PARAMS MM_EXT_PARAMS)
{
    __local uint4 smem[STAGES * (STAGE_A + STAGE_B) / 16] __attribute__((aligned(1024)));
    MM_CE_CHECK();
    MM_SLICE();
    const uint base = mma_smem(smem);
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int ntiles = (int)(((M + BM - 1) / BM) * ((N + BN - 1) / BN));
    const int step = get_num_groups(0);
    const int nk = (int)((k_hi - k_lo + BK - 1) / BK);
#if MM_EXT
    const int nk2 = (int)((K2 + BK - 1) / BK);
#else
    const int nk2 = 0;
#endif
#define STAGE(i) (base + ((i) % STAGES) * (STAGE_A + STAGE_B))
#if MM_TMA
    __local ulong bars[2 * STAGES];
    const uint full = mma_smem(bars), empty = full + 8 * STAGES;
    const long gid = get_group_id(0) + get_num_groups(0) * (z + get_num_groups(1) * sl);
    const ulong map_a = (ulong)(tma_slots + MM_MAPS * gid), map_b = map_a + 128;
    /* A2's and B2's maps (MM_EXT), else A's and B's again */
    const ulong2 ext = MM_EXT ? (ulong2)(map_a + 256, map_a + 384) : (ulong2)(map_a, map_b);
    const int first = get_group_id(0);
    const int total = first < ntiles ? (ntiles - first + step - 1) / step * (nk + nk2) : 0;
    int p = 0, g = 0;
    /* A k-major operand comes in boxes of a tile's rows, or where it is narrower than its tile
       of its own rows rounded up to 8: TMA's zero fills of the rest cost time (LoRA's rank-16 B
       fills 16 of 64 rows), and the products of the stale rows left in local memory land only in
       C's rows and columns past M and N, which no epilogue stores or sums. An mn-major operand
       comes in atoms of 64. With a producer warp, the first work-item makes B's map beside the
       producer's of A, since a map takes about a microsecond (mostly its fences) before the
       first copy can start. */
    const int a_rows = mm_box_rows(A_KC, M, BM), b_rows = mm_box_rows(B_KC, N, BN);
#define MM_MAP_B()                                                                                \
    wg_tma_map(tma_slots + MM_MAPS * gid + 1, tma_map, b, B_KC ? K : N, B_KC ? N : K,             \
               2 * (B_KC ? sbn : sbk), 64, B_KC ? b_rows : 64)
    /* the second pair's maps, laid out as the first's */
#if MM_EXT
#define MM_MAP_EXT()                                                                              \
    wg_tma_map(tma_slots + MM_MAPS * gid + 2, tma_map, a2 + a2off, A_KC ? K2 : M, A_KC ? M : K2,  \
               2 * (A_KC ? sa2m : sa2k), 64, A_KC ? a_rows : 64);                                 \
    wg_tma_map(tma_slots + MM_MAPS * gid + 3, tma_map, b2 + b2off, B_KC ? K2 : N, B_KC ? N : K2,  \
               2 * (B_KC ? sb2n : sb2k), 64, B_KC ? b_rows : 64)
#else
#define MM_MAP_EXT()
#endif
    if (MM_PRODUCER && tid == 0) {
        MM_MAP_B();
        MM_MAP_EXT();
    }
    if (tid == MM_PRODUCER) {
        wg_tma_map(tma_slots + MM_MAPS * gid, tma_map, a, A_KC ? K : M, A_KC ? M : K,
                   2 * (A_KC ? sam : sak), 64, A_KC ? a_rows : 64);
        if (!MM_PRODUCER) {
            MM_MAP_B();
            MM_MAP_EXT();
        }
        for (int s = 0; s < STAGES; ++s) {
            wg_bar_init(full + 8 * s, 1);
            wg_bar_init(empty + 8 * s, NT);
        }
        wg_bar_init_fence();
        for (; !MM_PRODUCER && p < STAGES - 1 && p < total; ++p)
            mm_tma_produce(p, nk, nk2, step, k_lo, M, N, base, full, empty, map_a, map_b, ext);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if MM_PRODUCERS == 128
    WG_PRODUCER_REGISTERS(tid >= NT);
#endif
    if (MM_PRODUCER && tid >= NT) {
        if (tid == MM_PRODUCER) {
            wg_tma_acquire(map_b);
            if (MM_EXT) {
                wg_tma_acquire(ext.x);
                wg_tma_acquire(ext.y);
            }
        }
        for (; tid == MM_PRODUCER && p < total; ++p)
            mm_tma_produce(p, nk, nk2, step, k_lo, M, N, base, full, empty, map_a, map_b, ext);
        return;
    }
#if MM_EPI_TMA
    /* C's rows and start on 16 bytes, the addend's pairs aligned: each warpgroup's first
       work-item makes its own map of C, the one that stores through it, in boxes of 128 bytes
       by its rows */
    __local uint4 epi[BM * BN * 2 / 16] __attribute__((aligned(1024)));
    const long c_align = 16 / sizeof(c_t) - 1;
    const bool tma_c = scn == 1 && ((coff | scm) & c_align) == 0 && (cid & 1) == 0;
    ulong map_c = 0;
    if (tma_c && (tid & 127) == 0)
        map_c = wg_tma_map(tma_slots + MM_MAPS * gid + MM_MAP_C + wg, tma_map_c, c + coff, N, M,
                           sizeof(c_t) * scm, 128 / sizeof(c_t), 64 * WG_MB);
#endif
#define MM_WG_FIRST_SLICES(m0, n0, live)
#else
#define MM_WG_FIRST_SLICES(m0, n0, live)                                                          \
    for (int s = 0; s < STAGES - 2; ++s) {                                                        \
        if ((live) && s < nk)                                                                     \
            mm_load_stage(STAGE(s), a, sam, sak, b, sbk, sbn, M, N, m0, n0,                       \
                          k_lo + (long)s * BK, k_hi, tid);                                        \
        mma_cp_commit();                                                                          \
    }
#endif

    long m0, n0;
    mm_tile_origin(M, N, get_group_id(0), &m0, &n0);
    MM_WG_FIRST_SLICES(m0, n0, (int)get_group_id(0) < ntiles);
    for (int tile = get_group_id(0); tile < ntiles; tile += step) {
        float d[WG_ACC];
#if MM_WG_PRELOAD
        mm_wg_preload(d, cin, coff + cid, scm, beta, M, N,
                      m0 + wg * 64 * WG_MB + (warp & 3) * 16 + (lane >> 2), n0 + 2 * (lane & 3));
        const float beta_out = 0.0f; /* what the epilogue adds of C_in */
#else
#pragma unroll
        for (int i = 0; i < WG_ACC; ++i)
            d[i] = 0.0f;
        const float beta_out = beta;
#endif
        for (int kt = 0; kt < nk + nk2; ++kt) {
#if MM_TMA
            const uint sa = STAGE(g);
            wg_bar_wait(full + 8 * (g % STAGES), (g / STAGES) & 1);
#else
            const uint sa = STAGE(kt);
            wg_copies_landed(STAGES - 3);
            const int next = kt + STAGES - 2;
            if (next < nk)
                mm_load_stage(STAGE(next), a, sam, sak, b, sbk, sbn, M, N, m0, n0,
                              k_lo + (long)next * BK, k_hi, tid);
            mma_cp_commit();
#endif
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 16; ++ks)
                mm_wg_step(d, sa, ks, wg);
            wg_commit();
            wg_wait(1);
#if MM_TMA
            if (kt > 0) {
                wg_bar_arrive(empty + 8 * ((g - 1) % STAGES));
                if (!MM_PRODUCER && tid == 0 && p < total)
                    mm_tma_produce(p++, nk, nk2, step, k_lo, M, N, base, full, empty, map_a, map_b,
                                   ext);
            }
            ++g;
#endif
        }
        wg_wait(0);
#pragma unroll
        for (int i = 0; i < WG_ACC; ++i)
            wg_keep_f(d + i);
#if MM_TMA
        wg_bar_arrive(empty + 8 * ((g - 1) % STAGES));
        if (!MM_PRODUCER && tid == 0 && p < total)
            mm_tma_produce(p++, nk, nk2, step, k_lo, M, N, base, full, empty, map_a, map_b, ext);
#else
        barrier(CLK_LOCAL_MEM_FENCE); /* every warpgroup is done reading the stages */
#endif
        const long m = m0 + wg * 64 * WG_MB + (warp & 3) * 16 + (lane >> 2);
        const long n = n0 + 2 * (lane & 3);
        const bool inside = m0 + BM <= M && n0 + BN <= N;
#if MM_EPI_TMA
        const long wg_m0 = m0 + wg * 64 * WG_MB, wg_n0 = n0;
#endif
        if (tile + step < ntiles)
            mm_tile_origin(M, N, tile + step, &m0, &n0);
        MM_WG_FIRST_SLICES(m0, n0, tile + step < ntiles);
#if MM_EPI_TMA
        if (tma_c && inside) {
            const float stored_sq =
                mm_wg_epilogue_tma(d, mma_smem(epi) + wg * MM_EPI_SLAB, map_c, wg, wg_m0, wg_n0,
                                   coff, scm, cin, cid, bias, sbias, bias_mode, alpha, beta_out,
                                   m, n);
            MM_SUMSQ_STORE(stored_sq);
            continue;
        }
#endif
        /* each block's row half in its own call: a loop over the two was not unrolled (its body
           is large), and d, indexed by its counter, went to private memory */
#define MM_WG_OUT(i, h)                                                                           \
    if (MM_CE == 1)                                                                               \
        mm_wg_ce_partials(d + (i) * (BN / 2), h, &ce, lane & 3, M, N, m + 64 * (i), n);           \
    else if (MM_CE == 2 && (ce.flags & CE_WEIGHT))                                                \
        mm_wg_ce_dlogits(d + (i) * (BN / 2), h, &ce, true, c, coff, scm, scn, M, N,               \
                         m + 64 * (i), n, inside);                                                \
    else if (MM_CE == 2)                                                                          \
        mm_wg_ce_dlogits(d + (i) * (BN / 2), h, &ce, false, c, coff, scm, scn, M, N,              \
                         m + 64 * (i), n, inside);                                                \
    else                                                                                          \
        sq += mm_wg_epilogue(d + (i) * (BN / 2), h, c, coff, scm, scn, cin, cid, bias, sbias,     \
                             bias_mode, alpha, beta_out, ws, wsoff, M, N, m + 64 * (i), n,      \
                             inside)
        /* built after the main loop, from the arguments, rather than kept through it */
        MM_CE_STATE();
        float sq = 0.0f;
        if (MM_CE)
            mm_wg_ce_logits(d, &ce, bias, sbias, bias_mode, alpha, N, n);
        MM_WG_OUT(0, 0);
        MM_WG_OUT(0, 1);
#if WG_MB == 2
        if (MM_CE)
            mm_wg_ce_logits(d + BN / 2, &ce, bias, sbias, bias_mode, alpha, N, n);
        MM_WG_OUT(1, 0);
        MM_WG_OUT(1, 1);
#endif
#undef MM_WG_OUT
        MM_SUMSQ_STORE(sq);
    }
#if !MM_TMA
    mma_cp_wait(0);
#endif
#if MM_EPI_TMA
    if (tma_c && (tid & 127) == 0)
        wg_bulk_done();
#endif
#undef MM_WG_FIRST_SLICES
#undef MM_MAP_B
#undef MM_MAP_EXT
#undef STAGE
}
#endif

#endif
