/*
 * cuda_driver.c: libcuda.so.1 opened at run time (cuda_driver.h), and the CUDA device behind an
 * OpenCL device, found by PCI address.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_driver.h"

/* cl_nv_device_attribute_query */
enum { CL_PCI_BUS_NV = 0x4008, CL_PCI_SLOT_NV = 0x4009, CL_PCI_DOMAIN_NV = 0x400A };

/* A driver function into fn (a function pointer): ISO C has no cast from dlsym's object pointer. */
#define CU_SYM(fn, name)                                                                          \
    do {                                                                                          \
        void *sym_ = dlsym(cu->lib, (name));                                                      \
        memcpy(&cu->fn, &sym_, sizeof sym_);                                                      \
    } while (0)

static void resolve(llmcl__cuda *cu)
{
    CU_SYM(init, "cuInit");
    CU_SYM(device_count, "cuDeviceGetCount");
    CU_SYM(device_get, "cuDeviceGet");
    CU_SYM(device_attribute, "cuDeviceGetAttribute");
    CU_SYM(primary_retain, "cuDevicePrimaryCtxRetain");
    CU_SYM(primary_release, "cuDevicePrimaryCtxRelease_v2");
    CU_SYM(ctx_push, "cuCtxPushCurrent_v2");
    CU_SYM(ctx_pop, "cuCtxPopCurrent_v2");
    CU_SYM(ctx_set_current, "cuCtxSetCurrent");
    CU_SYM(error_string, "cuGetErrorString");
    CU_SYM(tensor_map_encode, "cuTensorMapEncodeTiled");
    CU_SYM(mem_granularity, "cuMemGetAllocationGranularity");
    CU_SYM(mem_create, "cuMemCreate");
    CU_SYM(mem_release, "cuMemRelease");
    CU_SYM(mem_export, "cuMemExportToShareableHandle");
    CU_SYM(mem_reserve, "cuMemAddressReserve");
    CU_SYM(mem_free_address, "cuMemAddressFree");
    CU_SYM(mem_map, "cuMemMap");
    CU_SYM(mem_unmap, "cuMemUnmap");
    CU_SYM(mem_set_access, "cuMemSetAccess");
    CU_SYM(stream_create, "cuStreamCreate");
    CU_SYM(stream_destroy, "cuStreamDestroy_v2");
    CU_SYM(stream_synchronize, "cuStreamSynchronize");
    CU_SYM(stream_wait_value32, "cuStreamWaitValue32_v2");
    CU_SYM(event_create, "cuEventCreate");
    CU_SYM(event_destroy, "cuEventDestroy_v2");
    CU_SYM(event_record, "cuEventRecord");
    CU_SYM(event_query, "cuEventQuery");
}

bool llmcl__cuda_open(llmcl__cuda *cu, char *why, size_t why_len)
{
    memset(cu, 0, sizeof *cu);
    cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        const char *e = dlerror();
        snprintf(why, why_len, "libcuda.so.1 (the NVIDIA driver) did not load: %s",
                 e ? e : "not found");
        return false;
    }
    resolve(cu);
    const CUresult r = cu->init ? cu->init(0) : -1;
    if (r != CUDA_OK) {
        snprintf(why, why_len, "cuInit failed (%d)", r);
        llmcl__cuda_close(cu);
        return false;
    }
    return true;
}

void llmcl__cuda_close(llmcl__cuda *cu)
{
    if (cu->lib)
        dlclose(cu->lib);
    memset(cu, 0, sizeof *cu);
}

int llmcl__cuda_device_of(const llmcl__cuda *cu, cl_device_id device)
{
    int n = 0;
    if (!cu->device_count || !cu->device_get || !cu->device_attribute ||
        cu->device_count(&n) != CUDA_OK || n < 1)
        return -1;
    cl_uint bus, slot, domain;
    const bool known =
        clGetDeviceInfo(device, CL_PCI_BUS_NV, sizeof bus, &bus, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_SLOT_NV, sizeof slot, &slot, NULL) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_PCI_DOMAIN_NV, sizeof domain, &domain, NULL) == CL_SUCCESS;
    if (!known)
        return n == 1 && cu->device_get(&n, 0) == CUDA_OK ? n : -1;
    for (int i = 0; i < n; ++i) {
        int d, b, s, m;
        if (cu->device_get(&d, i) == CUDA_OK &&
            cu->device_attribute(&b, CU_ATTR_PCI_BUS, d) == CUDA_OK &&
            cu->device_attribute(&s, CU_ATTR_PCI_DEVICE, d) == CUDA_OK &&
            cu->device_attribute(&m, CU_ATTR_PCI_DOMAIN, d) == CUDA_OK && (cl_uint)b == bus &&
            (cl_uint)s == slot && (cl_uint)m == domain)
            return d;
    }
    return -1;
}

const char *llmcl__cuda_error(const llmcl__cuda *cu, CUresult r)
{
    const char *s = NULL;
    if (cu->error_string && cu->error_string(r, &s) == CUDA_OK && s)
        return s;
    return "unknown CUDA error";
}
