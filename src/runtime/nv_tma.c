/*
 * nv_tma.c: tensor maps for Hopper's TMA copies (cp.async.bulk.tensor, mma.cl), encoded by the
 * CUDA driver's cuTensorMapEncodeTiled. NVIDIA's OpenCL has no call that makes a map, so the
 * runtime opens libcuda.so.1 (the driver NVIDIA's OpenCL runs on) and keeps the OpenCL device's
 * primary CUDA context for the encoder, made current only around each call. A map is encoded on
 * the host for a placeholder address and passed to the kernel by value; the kernel points it at
 * its operand (tensormap.replace), so the host never needs a buffer's device address. Where the
 * library, the device or the encoder is missing, or LLMCL_TMA=0, the kernels keep cp.async.
 */
#include <dlfcn.h>
#include <string.h>

#include "internal.h"

/* The driver API's types and values used here (cuda.h, CUDA 12). */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_device_fn)(int *, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_release_fn)(int);
typedef int (*cu_push_fn)(void *);
typedef int (*cu_pop_fn)(void **);
typedef int (*cu_encode_fn)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                            const uint32_t *, const uint32_t *, int, int, int, int);
enum { CU_ATTR_PCI_BUS = 33, CU_ATTR_PCI_DEVICE = 34, CU_ATTR_PCI_DOMAIN = 50 };
enum { CU_MAP_FLOAT16 = 6, CU_MAP_BFLOAT16 = 9, CU_SWIZZLE_128B = 3, CU_L2_PROMOTE_128B = 2 };
/* cl_nv_device_attribute_query */
enum { CL_PCI_BUS_NV = 0x4008, CL_PCI_SLOT_NV = 0x4009, CL_PCI_DOMAIN_NV = 0x400A };

struct llmcl__tma {
    void *lib;
    int device;
    void *context;
    cu_release_fn release;
    cu_push_fn push;
    cu_pop_fn pop;
    cu_encode_fn encode;
};

/* A driver function into fn (a function pointer): ISO C has no cast from dlsym's object pointer. */
#define CU_SYM(lib, fn, name)                                                                     \
    do {                                                                                          \
        void *sym_ = dlsym((lib), (name));                                                        \
        memcpy(&(fn), &sym_, sizeof sym_);                                                        \
    } while (0)

/* The CUDA device on the OpenCL device's PCI address; the only one where OpenCL cannot say. */
static int cuda_device_of(void *lib, cl_device_id device)
{
    cu_count_fn count;
    cu_device_fn get;
    cu_attr_fn attr;
    CU_SYM(lib, count, "cuDeviceGetCount");
    CU_SYM(lib, get, "cuDeviceGet");
    CU_SYM(lib, attr, "cuDeviceGetAttribute");
    int n = 0;
    if (!count || !get || !attr || count(&n) != 0 || n < 1)
        return -1;
    cl_uint bus, slot, domain;
    const bool known =
        clGetDeviceInfo(device, CL_PCI_BUS_NV, sizeof bus, &bus, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_SLOT_NV, sizeof slot, &slot, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_DOMAIN_NV, sizeof domain, &domain, NULL) == CL_SUCCESS;
    if (!known)
        return n == 1 && get(&n, 0) == 0 ? n : -1;
    for (int i = 0; i < n; ++i) {
        int d, b, s, m;
        if (get(&d, i) == 0 && attr(&b, CU_ATTR_PCI_BUS, d) == 0 &&
            attr(&s, CU_ATTR_PCI_DEVICE, d) == 0 && attr(&m, CU_ATTR_PCI_DOMAIN, d) == 0 &&
            (cl_uint)b == bus && (cl_uint)s == slot && (cl_uint)m == domain)
            return d;
    }
    return -1;
}

llmcl__tma *llmcl__tma_open(cl_device_id device)
{
    const char *v = llmcl__getenv("LLMCL_TMA");
    if (v && strcmp(v, "0") == 0)
        return NULL;
    llmcl__tma *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!t->lib) {
        free(t);
        return NULL;
    }
    cu_init_fn init;
    cu_retain_fn retain;
    CU_SYM(t->lib, init, "cuInit");
    CU_SYM(t->lib, retain, "cuDevicePrimaryCtxRetain");
    CU_SYM(t->lib, t->release, "cuDevicePrimaryCtxRelease_v2");
    CU_SYM(t->lib, t->push, "cuCtxPushCurrent_v2");
    CU_SYM(t->lib, t->pop, "cuCtxPopCurrent_v2");
    CU_SYM(t->lib, t->encode, "cuTensorMapEncodeTiled");
    t->device = init && retain && t->release && t->push && t->pop && t->encode && init(0) == 0
                    ? cuda_device_of(t->lib, device)
                    : -1;
    uint64_t probe[16];
    if (t->device < 0 || retain(&t->context, t->device) != 0 ||
        !llmcl__tma_encode(t, LLMCL_BF16, 64, 64, 128, 64, 64, probe)) {
        llmcl__tma_close(t);
        return NULL;
    }
    return t;
}

void llmcl__tma_close(llmcl__tma *t)
{
    if (!t)
        return;
    if (t->context)
        t->release(t->device);
    dlclose(t->lib);
    free(t);
}

bool llmcl__tma_encode(llmcl__tma *t, llmcl_dtype dt, uint64_t inner, uint64_t outer,
                       uint64_t stride_bytes, uint32_t box_inner, uint32_t box_outer,
                       uint64_t map[16])
{
    const uint64_t dims[2] = {inner, outer}, strides[1] = {stride_bytes};
    const uint32_t box[2] = {box_inner, box_outer}, unit[2] = {1, 1};
    void *prev;
    if (t->push(t->context) != 0)
        return false;
    /* the address is the kernel's to set: any 16-byte aligned placeholder encodes */
    const int st = t->encode(map, dt == LLMCL_F16 ? CU_MAP_FLOAT16 : CU_MAP_BFLOAT16, 2,
                             (void *)(uintptr_t)0x10000, dims, strides, box, unit, 0,
                             CU_SWIZZLE_128B, CU_L2_PROMOTE_128B, 0);
    t->pop(&prev);
    return st == 0;
}
