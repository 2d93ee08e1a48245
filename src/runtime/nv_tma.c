/*
 * nv_tma.c: tensor-map templates for Hopper's TMA copies (cp.async.bulk.tensor, mma.cl), encoded
 * once by the CUDA driver's cuTensorMapEncodeTiled. NVIDIA's OpenCL has no call that makes a map,
 * so at context creation the runtime opens libcuda.so.1 (the driver NVIDIA's OpenCL runs on),
 * encodes one 2-D map of 16-bit elements a dtype in the OpenCL device's primary CUDA context, and
 * lets that context and the library go: a retained context holds ~0.5 GiB of device memory. The
 * kernels write the template to global memory and set its address, sizes, row stride and box
 * there (tensormap.replace), so the host never needs a buffer's device address. Where the library,
 * the device or the encoder is missing, or LLMCL_TMA=0, the kernels keep cp.async.
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
    uint64_t bf16[16], f16[16];
};

/* The driver functions used here. */
typedef struct cu_driver {
    cu_init_fn init;
    cu_count_fn count;
    cu_device_fn get;
    cu_attr_fn attr;
    cu_retain_fn retain;
    cu_release_fn release;
    cu_push_fn push;
    cu_pop_fn pop;
    cu_encode_fn encode;
} cu_driver;

/* A driver function into fn (a function pointer): ISO C has no cast from dlsym's object pointer. */
#define CU_SYM(lib, fn, name)                                                                     \
    do {                                                                                          \
        void *sym_ = dlsym((lib), (name));                                                        \
        memcpy(&(fn), &sym_, sizeof sym_);                                                        \
    } while (0)

/* The driver's functions from lib; false where one is missing or cuInit fails. */
static bool load_driver(void *lib, cu_driver *cu)
{
    CU_SYM(lib, cu->init, "cuInit");
    CU_SYM(lib, cu->count, "cuDeviceGetCount");
    CU_SYM(lib, cu->get, "cuDeviceGet");
    CU_SYM(lib, cu->attr, "cuDeviceGetAttribute");
    CU_SYM(lib, cu->retain, "cuDevicePrimaryCtxRetain");
    CU_SYM(lib, cu->release, "cuDevicePrimaryCtxRelease_v2");
    CU_SYM(lib, cu->push, "cuCtxPushCurrent_v2");
    CU_SYM(lib, cu->pop, "cuCtxPopCurrent_v2");
    CU_SYM(lib, cu->encode, "cuTensorMapEncodeTiled");
    return cu->init && cu->count && cu->get && cu->attr && cu->retain && cu->release && cu->push &&
           cu->pop && cu->encode && cu->init(0) == 0;
}

/* The CUDA device on the OpenCL device's PCI address; the only one where OpenCL cannot say. */
static int cuda_device_of(const cu_driver *cu, cl_device_id device)
{
    int n = 0;
    if (cu->count(&n) != 0 || n < 1)
        return -1;
    cl_uint bus, slot, domain;
    const bool known =
        clGetDeviceInfo(device, CL_PCI_BUS_NV, sizeof bus, &bus, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_SLOT_NV, sizeof slot, &slot, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_DOMAIN_NV, sizeof domain, &domain, NULL) == CL_SUCCESS;
    if (!known)
        return n == 1 && cu->get(&n, 0) == 0 ? n : -1;
    for (int i = 0; i < n; ++i) {
        int d, b, s, m;
        if (cu->get(&d, i) == 0 && cu->attr(&b, CU_ATTR_PCI_BUS, d) == 0 &&
            cu->attr(&s, CU_ATTR_PCI_DEVICE, d) == 0 && cu->attr(&m, CU_ATTR_PCI_DOMAIN, d) == 0 &&
            (cl_uint)b == bus && (cl_uint)s == slot && (cl_uint)m == domain)
            return d;
    }
    return -1;
}

/*
 * The template of dtype dt (CUDA's map type): 64 x 64 elements, 128-byte rows, in boxes of 64 x 64
 * with wgmma's 128-byte swizzle, 128-byte L2 promotion and zeros outside, for a placeholder
 * address. The kernel replaces every size and the address.
 */
static bool encode_template(const cu_driver *cu, int dt, uint64_t map[16])
{
    const uint64_t dims[2] = {64, 64}, strides[1] = {128};
    const uint32_t box[2] = {64, 64}, unit[2] = {1, 1};
    return cu->encode(map, dt, 2, (void *)(uintptr_t)0x10000, dims, strides, box, unit, 0,
                      CU_SWIZZLE_128B, CU_L2_PROMOTE_128B, 0) == 0;
}

/* The templates, encoded in device's primary CUDA context (made and dropped here). */
static bool encode_templates(void *lib, cl_device_id device, llmcl__tma *t)
{
    cu_driver cu;
    if (!load_driver(lib, &cu))
        return false;
    const int cu_device = cuda_device_of(&cu, device);
    void *context, *prev;
    if (cu_device < 0 || cu.retain(&context, cu_device) != 0)
        return false;
    bool ok = cu.push(context) == 0;
    if (ok) {
        ok = encode_template(&cu, CU_MAP_BFLOAT16, t->bf16) &&
             encode_template(&cu, CU_MAP_FLOAT16, t->f16);
        cu.pop(&prev);
    }
    cu.release(cu_device);
    return ok;
}

llmcl__tma *llmcl__tma_open(cl_device_id device)
{
    const char *v = llmcl__getenv("LLMCL_TMA");
    if (v && strcmp(v, "0") == 0)
        return NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return NULL;
    llmcl__tma *t = calloc(1, sizeof *t);
    if (t && !encode_templates(lib, device, t)) {
        free(t);
        t = NULL;
    }
    dlclose(lib);
    return t;
}

void llmcl__tma_close(llmcl__tma *t) { free(t); }

const uint64_t *llmcl__tma_template(const llmcl__tma *t, llmcl_dtype dt)
{
    return dt == LLMCL_F16 ? t->f16 : t->bf16;
}
