/*
 * llmcl-info: lists OpenCL platforms and devices, marks the one llmcl selects (LLMCL_PLATFORM /
 * LLMCL_DEVICE), and shows its probed capabilities.
 */
#include <stdio.h>
#include <string.h>

#include "llmcl.h"

static const char *vendor_name(llmcl_vendor v)
{
    static const char *names[] = {"other", "NVIDIA", "AMD", "Intel", "PoCL", "Mesa"};
    return (unsigned)v < sizeof names / sizeof names[0] ? names[v] : "?";
}

static void print_devices(cl_device_id selected)
{
    cl_platform_id platforms[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS || np == 0) {
        printf("no OpenCL platforms found (is an ICD installed under /etc/OpenCL/vendors?)\n");
        return;
    }
    int global = 0;
    for (cl_uint p = 0; p < np && p < 16; ++p) {
        char pname[256] = "?", pver[256] = "?";
        clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
        clGetPlatformInfo(platforms[p], CL_PLATFORM_VERSION, sizeof pver, pver, NULL);
        printf("platform %u: %s (%s)\n", p, pname, pver);
        cl_device_id devices[64];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 64, devices, &nd) != CL_SUCCESS)
            nd = 0;
        if (nd == 0)
            printf("    (no devices)\n");
        for (cl_uint d = 0; d < nd && d < 64; ++d, ++global) {
            char dname[256] = "?";
            cl_device_type type = 0;
            clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof dname, dname, NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            printf("  %s device %u (index %d): %s [%s]\n", devices[d] == selected ? "*" : " ", d,
                   global, dname, (type & CL_DEVICE_TYPE_GPU) ? "GPU" : (type & CL_DEVICE_TYPE_CPU) ? "CPU" : "other");
        }
    }
}

static void print_info(const llmcl_device_info *i)
{
    printf("\nselected device\n");
    printf("  name                 %s\n", i->name);
    printf("  vendor               %s (%s)\n", i->vendor, vendor_name(i->vendor_id));
    printf("  platform             %s, %s\n", i->platform_name, i->platform_version);
    printf("  device / driver      %s / %s\n", i->device_version, i->driver_version);
    printf("  OpenCL C             %d.%d\n", i->cl_c_major, i->cl_c_minor);
    printf("  type                 %s\n", i->is_gpu ? "GPU" : "not a GPU");
    printf("  compute units        %u\n", i->compute_units);
    printf("  global memory        %.2f GiB (largest allocation %.2f GiB)\n",
           (double)i->global_mem_bytes / (1 << 30), (double)i->max_alloc_bytes / (1 << 30));
    printf("  local memory         %llu KiB%s\n", (unsigned long long)(i->local_mem_bytes >> 10),
           i->local_mem_is_dedicated ? "" : " (emulated in global memory)");
    if (i->local_mem_static_bytes != i->local_mem_bytes)
        printf("  local arrays         %llu KiB (a kernel's __local arrays may take more)\n",
               (unsigned long long)(i->local_mem_static_bytes >> 10));
    printf("  max work-group       %zu\n", i->max_work_group_size);
    printf("  SIMD width           %d\n", i->simd_width);
    printf("  fp16 arithmetic      %s (16-bit storage works regardless)\n", i->has_fp16 ? "yes" : "no");
    printf("  fp64                 %s\n", i->has_fp64 ? "yes" : "no");
    printf("  subgroups            %s\n", i->has_subgroups ? "yes" : "no");
    if (i->nv_cc_major)
        printf("  compute capability   %d.%d\n", i->nv_cc_major, i->nv_cc_minor);
    printf("  inline PTX           %s\n", i->has_inline_ptx ? "yes (NVIDIA fast paths on)" : "no");
    printf("  tensor cores         %s\n", i->has_mma ? "yes (mma.sync, ldmatrix, cp.async)" : "no");
    printf("  wgmma (sm_90a)       %s\n", i->has_wgmma ? "yes (PTX retargeted to sm_90a)" : "no");
    printf("  TMA copies           %s\n", i->has_tma ? "yes (tensor maps from libcuda)" : "no");
    if (i->loop_limit)
        printf("  loop limit           %llu iterations a work-item (longer work is split)\n",
               (unsigned long long)i->loop_limit);
    else
        printf("  loop limit           none\n");
}

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: llmcl-info\n"
               "Lists OpenCL devices and shows the capabilities of the one llmcl selects.\n"
               "LLMCL_PLATFORM and LLMCL_DEVICE (an index or a name substring) choose it.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "llmcl-info: unknown option %s (it takes none; --help)\n", argv[1]);
        return 2;
    }
    printf("llmcl %s\n\n", llmcl_version());
    cl_platform_id platform = NULL;
    cl_device_id device = NULL;
    llmcl_status st = llmcl_device_select(&platform, &device);
    print_devices(st == LLMCL_OK ? device : NULL);
    if (st != LLMCL_OK) {
        fprintf(stderr, "\nllmcl-info: %s\n", llmcl_last_error(NULL));
        return 1;
    }
    llmcl_device_info info;
    st = llmcl_device_probe(device, &info);
    if (st != LLMCL_OK) {
        fprintf(stderr, "llmcl-info: %s\n", llmcl_last_error(NULL));
        return 1;
    }
    print_info(&info);
    return 0;
}
