/*
 * cuda_driver.h: the CUDA driver API, loaded at run time from libcuda.so.1 (the driver NVIDIA's
 * OpenCL runs on), for what OpenCL cannot do on NVIDIA devices: TMA tensor maps (nv_tma.c) and
 * device memory that OpenCL kernels and NCCL share (src/dist/transport_nccl.c). llmcl never links
 * against CUDA: the types and values below are the driver API's (cuda.h, CUDA 12 and 13), and a
 * function the installed driver lacks stays NULL.
 */
#ifndef LLMCL_CUDA_DRIVER_H
#define LLMCL_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    CUDA_OK = 0,
    CUDA_ERROR_NOT_READY = 600,
    CU_ATTR_PCI_BUS = 33,
    CU_ATTR_PCI_DEVICE = 34,
    CU_ATTR_PCI_DOMAIN = 50,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_STREAM_WAIT_VALUE_GEQ = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
};

typedef struct cu_mem_location {
    int type, id;
} cu_mem_location;

typedef struct cu_mem_allocation_prop {
    int type, requested_handle_types;
    cu_mem_location location;
    void *win32_handle_metadata;
    struct {
        unsigned char compression_type, gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} cu_mem_allocation_prop;

typedef struct cu_mem_access_desc {
    cu_mem_location location;
    int flags;
} cu_mem_access_desc;

/* The driver's functions that llmcl calls. */
typedef struct llmcl__cuda {
    void *lib;
    CUresult (*init)(unsigned);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_attribute)(int *, int, CUdevice);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*error_string)(CUresult, const char **);
    CUresult (*tensor_map_encode)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                                  const uint32_t *, const uint32_t *, int, int, int, int);
    CUresult (*mem_granularity)(size_t *, const cu_mem_allocation_prop *, int);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const cu_mem_allocation_prop *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_export)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
    CUresult (*mem_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*mem_free_address)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                        unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const cu_mem_access_desc *, size_t);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, uint32_t, unsigned);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_destroy)(CUevent);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
} llmcl__cuda;

/*
 * Opens libcuda.so.1, resolves every function above that the driver has and calls cuInit. False
 * with the reason in why (why_len bytes) where the library is missing or cuInit fails.
 */
bool llmcl__cuda_open(llmcl__cuda *cu, char *why, size_t why_len);

/* Closes the library (cu may be zeroed or already closed). */
void llmcl__cuda_close(llmcl__cuda *cu);

/* The CUDA device on the OpenCL device's PCI address; the only one where OpenCL cannot say; -1. */
int llmcl__cuda_device_of(const llmcl__cuda *cu, cl_device_id device);

/* The driver's name for a result, for messages. */
const char *llmcl__cuda_error(const llmcl__cuda *cu, CUresult r);

#endif /* LLMCL_CUDA_DRIVER_H */
