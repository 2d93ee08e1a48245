/*
 * elementwise.cl: fill, copy, cast, axpy and mul over tensors of any shape, and sum_rows (the rows
 * of a matrix summed in order, one of them possibly from another buffer: llmcl_dist's sum of the
 * ranks' parts of a block).
 *
 * Contiguous tensors take the *_contig kernels: a grid-stride loop over groups of VW elements and a
 * scalar tail. VW is 8 where every operand is 16-bit and 16-byte aligned (one 16-byte access each),
 * else 4: with ALIGNED (every operand's first element aligned to four elements' size) one 16- or
 * 8-byte access, otherwise accesses that need only the element's alignment, which a compiler
 * cannot widen. Eight f32 a work-item would take two 16-byte accesses 32 bytes apart, which left
 * half of each warp's store sectors to another instruction: an f32 fill so ran at half the speed
 * on the H200. Other layouts take the *_strided kernels, which map a linear index to up to 4-D
 * coordinates (shape and strides padded to 4 from the front). A strided copy whose rows (a
 * unit-stride last dimension) start and end on 4-, 8- or 16-byte boundaries in both tensors moves
 * words of that size (COPY_T uint, uint2 or uint4): the index arithmetic, 64-bit divisions for up
 * to three dimensions, is paid once a word instead of once an element. On an H100 the element
 * copy of a row-pitched bf16 matrix moved 302 GB/s where a contiguous one moved 1300.
 * All indices are 64-bit.
 *
 * Defines: DT (storage of fill/copy, and of axpy/mul), COPY_T (copy_strided's unit, default DT's
 * storage), SRC_DT and DST_DT (cast, sum_rows), DT_IS_INT (fill), VW (4 or 8) and ALIGNED (the
 * contiguous kernels; fill of integers stays scalar).
 * Tunables (every kernel key: fill, copy, cast, axpy, mul, sum_rows):
 *   WG      work-group size (any value the device allows; the launcher passes it as the local size)
 *   GPC     work-groups per compute unit that the grid is capped at (grid-stride loops cover the
 *           rest): 0 (no cap: one pass) or 1 to 64 (default 8 on GPUs, 4 on CPUs; on NVIDIA 0
 *           for copy_words and the contiguous kernels' aligned vectors). A launch parameter.
 * Tunables of copy_words (key copy):
 *   UNROLL  16-byte words per work-item per pass, all loaded before any is stored: 1, 2, 4 or 8
 *           (default 1).
 *   HINT    NVIDIA only (LLMCL_NV_PTX), ignored elsewhere; bit 0: loads through the read-only path
 *           without L1 allocation (ld.global.nc.L1::no_allocate), bit 1: streaming stores
 *           (st.global.cs): 0 to 3 (default 0).
 */
#ifndef WG
#define WG 256
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef HINT
#define HINT 0
#endif
#ifndef VW
#define VW 4
#endif
#if VW == 8
typedef float8 floatw;
#define LOADW(DT, p, i) LLMCL_CAT(load8_, DT)((p), (i))
#define STOREW(DT, p, i, v) LLMCL_CAT(store8_, DT)((p), (i), (v))
#elif defined(ALIGNED)
typedef float4 floatw;
#define LOADW(DT, p, i) LLMCL_CAT(load4a_, DT)((p), (i))
#define STOREW(DT, p, i, v) LLMCL_CAT(store4a_, DT)((p), (i), (v))
#else
typedef float4 floatw;
#define LOADW(DT, p, i) LOAD4(DT, p, i)
#define STOREW(DT, p, i, v) STORE4(DT, p, i, v)
#endif

inline long strided_offset(long i, long4 shape, long4 stride)
{
    long off = (i % shape.w) * stride.w;
    i /= shape.w;
    off += (i % shape.z) * stride.z;
    i /= shape.z;
    off += (i % shape.y) * stride.y;
    i /= shape.y;
    return off + i * stride.x;
}

#define GRID_LOOP(i, n) for (long i = get_global_id(0); i < (n); i += get_global_size(0))

#ifdef DT
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fill_contig(__global STORAGE(DT) *dst, ulong dst_off, long n, float fvalue, long ivalue)
{
    dst += dst_off;
#ifdef DT_IS_INT
    GRID_LOOP(i, n) {
        STORE(DT, dst, i, ivalue);
    }
#else
    const long nw = n / VW;
    GRID_LOOP(i, nw) {
        STOREW(DT, dst, VW * i, (floatw)fvalue);
    }
    GRID_LOOP(i, n - VW * nw) {
        STORE(DT, dst, VW * nw + i, fvalue);
    }
#endif
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void fill_strided(__global STORAGE(DT) *dst, ulong dst_off, long n, long4 shape, long4 stride,
                  float fvalue, long ivalue)
{
    dst += dst_off;
    GRID_LOOP(i, n) {
#ifdef DT_IS_INT
        STORE(DT, dst, strided_offset(i, shape, stride), ivalue);
#else
        STORE(DT, dst, strided_offset(i, shape, stride), fvalue);
#endif
    }
}

/* COPY_T: the unit copied, an element, or a word where the launcher counts rows in words. */
#ifndef COPY_T
#define COPY_T STORAGE(DT)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void copy_strided(__global const COPY_T *src, ulong src_off, long4 src_stride,
                  __global COPY_T *dst, ulong dst_off, long4 dst_stride, long n, long4 shape)
{
    src += src_off;
    dst += dst_off;
    GRID_LOOP(i, n) {
        dst[strided_offset(i, shape, dst_stride)] = src[strided_offset(i, shape, src_stride)];
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void copy_elems(__global const STORAGE(DT) *src, ulong src_off, __global STORAGE(DT) *dst,
                ulong dst_off, long n)
{
    src += src_off;
    dst += dst_off;
    GRID_LOOP(i, n) {
        dst[i] = src[i];
    }
}
#endif

/* 16-byte words with NVIDIA's cache hints (HINT bits), or plain accesses. */
#if defined(LLMCL_NV_PTX) && (HINT & 1)
#define word_load(p) ld16_nc_no_l1(p)
#else
#define word_load(p) (*(p))
#endif
#if defined(LLMCL_NV_PTX) && (HINT & 2)
#define word_store(p, v) st16_streaming((p), (v))
#else
#define word_store(p, v) (*(p) = (v))
#endif

/*
 * Byte copies in 16-byte words, for any dtype whose offsets and size are multiples of 16 bytes.
 * A work-group moves a contiguous block of UNROLL * WG words per pass, item l taking words
 * l, l + WG, ...: each access is coalesced across the group, and all UNROLL loads are issued
 * before any store so that they are in flight at once. The grid strides over blocks.
 */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void copy_words(__global const uint4 *src, ulong src_off, __global uint4 *dst, ulong dst_off,
                long n)
{
    src += src_off;
    dst += dst_off;
    const long step = (long)get_num_groups(0) * WG * UNROLL;
    for (long i = (long)get_group_id(0) * WG * UNROLL + get_local_id(0); i < n; i += step) {
        uint4 v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; ++j)
            if (i + j * WG < n)
                v[j] = word_load(src + i + j * WG);
#pragma unroll
        for (int j = 0; j < UNROLL; ++j)
            if (i + j * WG < n)
                word_store(dst + i + j * WG, v[j]);
    }
}

#ifdef SRC_DT
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void cast_contig(__global const STORAGE(SRC_DT) *src, ulong src_off, __global STORAGE(DST_DT) *dst,
                 ulong dst_off, long n)
{
    src += src_off;
    dst += dst_off;
    const long nw = n / VW;
    GRID_LOOP(i, nw) {
        STOREW(DST_DT, dst, VW * i, LOADW(SRC_DT, src, VW * i));
    }
    GRID_LOOP(i, n - VW * nw) {
        STORE(DST_DT, dst, VW * nw + i, LOAD(SRC_DT, src, VW * nw + i));
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void cast_strided(__global const STORAGE(SRC_DT) *src, ulong src_off, long4 src_stride,
                  __global STORAGE(DST_DT) *dst, ulong dst_off, long4 dst_stride, long n, long4 shape)
{
    src += src_off;
    dst += dst_off;
    GRID_LOOP(i, n) {
        STORE(DST_DT, dst, strided_offset(i, shape, dst_stride),
              LOAD(SRC_DT, src, strided_offset(i, shape, src_stride)));
    }
}

/*
 * y = (x_0 + x_1 + ... + x_{rows-1}) + beta y over n elements, row q at x + q x_stride, but for
 * row local_row (-1: none), which is read from l instead: one order for every element, so the bits
 * never depend on the grid. beta 0 leaves y unread (it may hold poison). y may be one of the rows:
 * each element is read by the work-item that writes it.
 */
#define ROW4(q, i) ((q) == local_row ? LOAD4(SRC_DT, l, i) : LOAD4(SRC_DT, x, (q) * x_stride + (i)))
#define ROW1(q, i) ((q) == local_row ? LOAD(SRC_DT, l, i) : LOAD(SRC_DT, x, (q) * x_stride + (i)))

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void sum_rows(__global const STORAGE(SRC_DT) *x, ulong x_off, long x_stride, int rows,
              __global const STORAGE(SRC_DT) *l, ulong l_off, int local_row,
              __global STORAGE(DST_DT) *y, ulong y_off, long n, float beta)
{
    x += x_off;
    l += l_off;
    y += y_off;
    const long n4 = n / 4;
    GRID_LOOP(i, n4) {
        float4 s = ROW4(0, 4 * i);
        for (int q = 1; q < rows; ++q)
            s += ROW4(q, 4 * i);
        if (beta != 0.0f)
            s += beta * LOAD4(DST_DT, y, 4 * i);
        STORE4(DST_DT, y, 4 * i, s);
    }
    GRID_LOOP(i, n - 4 * n4) {
        const long j = 4 * n4 + i;
        float s = ROW1(0, j);
        for (int q = 1; q < rows; ++q)
            s += ROW1(q, j);
        if (beta != 0.0f)
            s += beta * LOAD(DST_DT, y, j);
        STORE(DST_DT, y, j, s);
    }
}
#endif

#if defined(DT) && !defined(DT_IS_INT)
/* The two binary ops share one kernel body; alpha is unused by mul. */
#define AXPY(x, y, alpha) ((alpha) * (x) + (y))
#define MUL(x, y, alpha) ((x) * (y))

#define BINARY_KERNELS(NAME, OP)                                                                  \
    __kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                                      \
    void NAME##_contig(__global const STORAGE(DT) *x, ulong x_off, __global STORAGE(DT) *y,        \
                       ulong y_off, long n, float alpha)                                          \
    {                                                                                             \
        x += x_off;                                                                               \
        y += y_off;                                                                               \
        const long nw = n / VW;                                                                   \
        GRID_LOOP(i, nw) {                                                                        \
            STOREW(DT, y, VW * i, OP(LOADW(DT, x, VW * i), LOADW(DT, y, VW * i), alpha));         \
        }                                                                                         \
        GRID_LOOP(i, n - VW * nw) {                                                               \
            const long j = VW * nw + i;                                                           \
            STORE(DT, y, j, OP(LOAD(DT, x, j), LOAD(DT, y, j), alpha));                           \
        }                                                                                         \
    }                                                                                             \
    __kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                                      \
    void NAME##_strided(__global const STORAGE(DT) *x, ulong x_off, long4 x_stride,                \
                        __global STORAGE(DT) *y, ulong y_off, long4 y_stride, long n, long4 shape, \
                        float alpha)                                                              \
    {                                                                                             \
        x += x_off;                                                                               \
        y += y_off;                                                                               \
        GRID_LOOP(i, n) {                                                                         \
            const long yi = strided_offset(i, shape, y_stride);                                   \
            STORE(DT, y, yi, OP(LOAD(DT, x, strided_offset(i, shape, x_stride)), LOAD(DT, y, yi), \
                                alpha));                                                          \
        }                                                                                         \
    }

BINARY_KERNELS(axpy, AXPY)
BINARY_KERNELS(mul, MUL)
#endif
