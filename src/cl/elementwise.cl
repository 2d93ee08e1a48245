/*
 * elementwise.cl: fill, copy, cast, axpy and mul over tensors of any shape.
 *
 * Contiguous tensors take the *_contig kernels: a grid-stride loop over groups of 4 elements with
 * 16-byte-or-narrower vector accesses and a scalar tail. Other layouts take the *_strided kernels,
 * which map a linear index to up to 4-D coordinates (shape and strides padded to 4 from the front).
 * All indices are 64-bit.
 *
 * Defines: DT (storage of fill/copy, and of axpy/mul), SRC_DT and DST_DT (cast), DT_IS_INT (fill).
 * Tunables:
 *   WG   work-group size (any value the device allows; the launcher passes it as the local size)
 */
#ifndef WG
#define WG 256
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
    GRID_LOOP(i, n) {
#ifdef DT_IS_INT
        STORE(DT, dst, i, ivalue);
#else
        STORE(DT, dst, i, fvalue);
#endif
    }
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

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void copy_strided(__global const STORAGE(DT) *src, ulong src_off, long4 src_stride,
                  __global STORAGE(DT) *dst, ulong dst_off, long4 dst_stride, long n, long4 shape)
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

/* Byte copies in 16-byte words, for any dtype whose offsets and size are multiples of 16 bytes. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void copy_words(__global const uint4 *src, ulong src_off, __global uint4 *dst, ulong dst_off,
                long n)
{
    src += src_off;
    dst += dst_off;
    GRID_LOOP(i, n) {
        dst[i] = src[i];
    }
}

#ifdef SRC_DT
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void cast_contig(__global const STORAGE(SRC_DT) *src, ulong src_off, __global STORAGE(DST_DT) *dst,
                 ulong dst_off, long n)
{
    src += src_off;
    dst += dst_off;
    const long n4 = n / 4;
    GRID_LOOP(i, n4) {
        STORE4(DST_DT, dst, 4 * i, LOAD4(SRC_DT, src, 4 * i));
    }
    GRID_LOOP(i, n - 4 * n4) {
        STORE(DST_DT, dst, 4 * n4 + i, LOAD(SRC_DT, src, 4 * n4 + i));
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
        const long n4 = n / 4;                                                                    \
        GRID_LOOP(i, n4) {                                                                        \
            STORE4(DT, y, 4 * i, OP(LOAD4(DT, x, 4 * i), LOAD4(DT, y, 4 * i), alpha));            \
        }                                                                                         \
        GRID_LOOP(i, n - 4 * n4) {                                                                \
            const long j = 4 * n4 + i;                                                            \
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
