/*
 * nv_tma.c: tensor-map templates for Hopper's TMA copies (cp.async.bulk.tensor, mma.cl), encoded
 * once by the CUDA driver's cuTensorMapEncodeTiled. NVIDIA's OpenCL has no call that makes a map,
 * so at context creation the runtime opens libcuda.so.1 (the driver NVIDIA's OpenCL runs on),
 * encodes one 2-D map a dtype (bf16, f16 and f32, whose maps only the products' stores use) in
 * the OpenCL device's primary CUDA context, and lets that context and the library go: a retained
 * context holds ~0.5 GiB of device memory. The kernels write the template to global memory and
 * set its address, sizes, row stride and box there (tensormap.replace), so the host never needs a
 * buffer's device address. Where the library, the device or the encoder is missing, or
 * LLMCL_TMA=0, the kernels keep cp.async.
 */
#include <string.h>

#include "cuda_driver.h"

enum {
    CU_MAP_FLOAT16 = 6,
    CU_MAP_FLOAT32 = 7,
    CU_MAP_BFLOAT16 = 9,
    CU_SWIZZLE_128B = 3,
    CU_L2_PROMOTE_128B = 2
};

struct llmcl__tma {
    uint64_t bf16[16], f16[16], f32[16];
};

/*
 * The template of dtype dt (CUDA's map type) of `size`-byte elements: 64 rows of 128 bytes, in
 * boxes of that size with wgmma's 128-byte swizzle, 128-byte L2 promotion and zeros outside, for a
 * placeholder address. The kernel replaces every size and the address.
 */
static bool encode_template(const llmcl__cuda *cu, int dt, uint32_t size, uint64_t map[16])
{
    const uint64_t dims[2] = {128 / size, 64}, strides[1] = {128};
    const uint32_t box[2] = {128 / size, 64}, unit[2] = {1, 1};
    return cu->tensor_map_encode(map, dt, 2, (void *)(uintptr_t)0x10000, dims, strides, box, unit,
                                 0, CU_SWIZZLE_128B, CU_L2_PROMOTE_128B, 0) == CUDA_OK;
}

/* The templates, encoded in device's primary CUDA context (made and dropped here). */
static bool encode_templates(const llmcl__cuda *cu, cl_device_id device, llmcl__tma *t)
{
    if (!cu->primary_retain || !cu->primary_release || !cu->ctx_push || !cu->ctx_pop ||
        !cu->tensor_map_encode)
        return false;
    const int cu_device = llmcl__cuda_device_of(cu, device);
    CUcontext context, prev;
    if (cu_device < 0 || cu->primary_retain(&context, cu_device) != CUDA_OK)
        return false;
    bool ok = cu->ctx_push(context) == CUDA_OK;
    if (ok) {
        ok = encode_template(cu, CU_MAP_BFLOAT16, 2, t->bf16) &&
             encode_template(cu, CU_MAP_FLOAT16, 2, t->f16) &&
             encode_template(cu, CU_MAP_FLOAT32, 4, t->f32);
        cu->ctx_pop(&prev);
    }
    cu->primary_release(cu_device);
    return ok;
}

llmcl__tma *llmcl__tma_open(cl_device_id device)
{
    const char *v = llmcl__getenv("LLMCL_TMA");
    if (v && strcmp(v, "0") == 0)
        return NULL;
    llmcl__cuda cu;
    char why[256];
    if (!llmcl__cuda_open(&cu, why, sizeof why))
        return NULL;
    llmcl__tma *t = calloc(1, sizeof *t);
    if (t && !encode_templates(&cu, device, t)) {
        free(t);
        t = NULL;
    }
    llmcl__cuda_close(&cu);
    return t;
}

void llmcl__tma_close(llmcl__tma *t) { free(t); }

const uint64_t *llmcl__tma_template(const llmcl__tma *t, llmcl_dtype dt)
{
    return dt == LLMCL_F16 ? t->f16 : dt == LLMCL_F32 ? t->f32 : t->bf16;
}
