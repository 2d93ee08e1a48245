/*
 * device.c: device selection from LLMCL_PLATFORM / LLMCL_DEVICE, and the capability probe that
 * kernels choose their paths from.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#define CL_DEVICE_WARP_SIZE_NV 0x4003
#define CL_DEVICE_WAVEFRONT_WIDTH_AMD 0x4043

typedef struct device_entry {
    cl_platform_id platform;
    cl_device_id device;
    int platform_index, device_index; /* device_index: within its platform */
    /* what LLMCL_PLATFORM is matched against, in falling priority (see platform_field) */
    char platform_name[256], platform_vendor[256], platform_version[256];
    char device_name[256];
    cl_device_type type;
} device_entry;

/* PoCL's platform name is "Portable Computing Language"; people call it pocl, as its vendor and
   version strings do. A name match beats a vendor match beats a version match, so that "cuda"
   picks NVIDIA's "NVIDIA CUDA" even where PoCL's version string lists its CUDA backend. */
enum { PLATFORM_FIELDS = 3 };

static bool is_index(const char *s)
{
    for (const char *p = s; *p; ++p)
        if (!isdigit((unsigned char)*p))
            return false;
    return *s != '\0';
}

static bool contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            ++i;
        if (i == n)
            return true;
    }
    return n == 0;
}

/* Every device of every platform, in platform order; platforms without devices contribute none. */
static int list_devices(device_entry *out, int cap)
{
    cl_platform_id platforms[MAX_PLATFORMS];
    cl_uint np = 0;
    if (clGetPlatformIDs(MAX_PLATFORMS, platforms, &np) != CL_SUCCESS)
        return 0;
    int n = 0;
    for (cl_uint p = 0; p < np && p < MAX_PLATFORMS; ++p) {
        cl_device_id devices[MAX_DEVICES];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, MAX_DEVICES, devices, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < MAX_DEVICES && n < cap; ++d, ++n) {
            device_entry *e = &out[n];
            memset(e, 0, sizeof *e);
            e->platform = platforms[p];
            e->device = devices[d];
            e->platform_index = (int)p;
            e->device_index = (int)d;
            clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof e->platform_name,
                              e->platform_name, NULL);
            clGetPlatformInfo(platforms[p], CL_PLATFORM_VENDOR, sizeof e->platform_vendor,
                              e->platform_vendor, NULL);
            clGetPlatformInfo(platforms[p], CL_PLATFORM_VERSION, sizeof e->platform_version,
                              e->platform_version, NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof e->device_name, e->device_name, NULL);
            clGetDeviceInfo(devices[d], CL_DEVICE_TYPE, sizeof e->type, &e->type, NULL);
        }
    }
    return n;
}

static const char *platform_field(const device_entry *e, int field)
{
    return field == 0 ? e->platform_name : field == 1 ? e->platform_vendor : e->platform_version;
}

/* An index selects by position (every field pass agrees); a name is tried on one field a pass. */
static bool platform_matches(const device_entry *e, const char *sel, int field)
{
    if (!sel)
        return true;
    return is_index(sel) ? e->platform_index == atoi(sel)
                         : contains_nocase(platform_field(e, field), sel);
}

/* Without LLMCL_PLATFORM a device index counts across all platforms, as llmcl-info lists them. */
static bool device_matches(const device_entry *e, int global_index, const char *platform_sel,
                           const char *sel)
{
    if (!sel)
        return true;
    if (is_index(sel))
        return (platform_sel ? e->device_index : global_index) == atoi(sel);
    return contains_nocase(e->device_name, sel);
}

static llmcl_status no_match(const device_entry *list, int n, const char *psel, const char *dsel)
{
    char avail[LLMCL__ERR_LEN / 2] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof avail - 1; ++i)
        len += (size_t)snprintf(avail + len, sizeof avail - len,
                                "%s[%d] platform %d '%s' / '%s' / '%s': '%s'", i ? "; " : "", i,
                                list[i].platform_index, list[i].platform_name,
                                list[i].platform_vendor, list[i].platform_version,
                                list[i].device_name);
    return LLMCL__FAIL(NULL, LLMCL_ERROR_NO_DEVICE,
                       "no device matches LLMCL_PLATFORM=%s LLMCL_DEVICE=%s (LLMCL_PLATFORM is "
                       "matched against each platform's name / vendor / version); available: %s",
                       psel ? psel : "(unset)", dsel ? dsel : "(unset)", n ? avail : "none");
}

/* The entry of list that LLMCL_PLATFORM and LLMCL_DEVICE select, -1 if none. */
static int select_entry(const device_entry *list, int n, const char *psel, const char *dsel)
{
    int chosen = -1;
    for (int field = 0; field < PLATFORM_FIELDS && chosen < 0; ++field)
        for (int i = 0; i < n && chosen < 0; ++i)
            if (platform_matches(&list[i], psel, field) &&
                device_matches(&list[i], i, psel, dsel) &&
                (psel || dsel || (list[i].type & CL_DEVICE_TYPE_GPU)))
                chosen = i;
    for (int i = 0; i < n && chosen < 0 && !psel && !dsel; ++i)
        chosen = i; /* no GPU anywhere: the first device */
    return chosen;
}

/* The (index mod N)-th of the N devices of chosen's platform and kind (GPU or not). */
static int nth_like(const device_entry *list, int n, int chosen, int index)
{
    const bool gpu = (list[chosen].type & CL_DEVICE_TYPE_GPU) != 0;
    int like[MAX_DEVICES], count = 0;
    for (int i = 0; i < n; ++i)
        if (list[i].platform == list[chosen].platform &&
            ((list[i].type & CL_DEVICE_TYPE_GPU) != 0) == gpu)
            like[count++] = i;
    return like[index % count];
}

static llmcl_status select_device(int index, cl_platform_id *platform, cl_device_id *device)
{
    LLMCL__REQUIRE(NULL, platform && device, LLMCL_ERROR_INVALID_ARGUMENT,
                   "platform and device must not be NULL");
    device_entry list[MAX_DEVICES];
    const int n = list_devices(list, MAX_DEVICES);
    const char *psel = llmcl__getenv("LLMCL_PLATFORM");
    const char *dsel = llmcl__getenv("LLMCL_DEVICE");
    int chosen = select_entry(list, n, psel, dsel);
    if (chosen < 0)
        return no_match(list, n, psel, dsel);
    if (index >= 0 && !dsel)
        chosen = nth_like(list, n, chosen, index);
    *platform = list[chosen].platform;
    *device = list[chosen].device;
    llmcl__log("selected '%s' on platform '%s'", list[chosen].device_name,
               list[chosen].platform_name);
    return LLMCL_OK;
}

llmcl_status llmcl_device_select(cl_platform_id *platform, cl_device_id *device)
{
    return select_device(-1, platform, device);
}

llmcl_status llmcl_device_select_local(int index, cl_platform_id *platform, cl_device_id *device)
{
    LLMCL__REQUIRE(NULL, index >= 0, LLMCL_ERROR_INVALID_ARGUMENT, "index %d is negative", index);
    return select_device(index, platform, device);
}

bool llmcl__has_extension(const char *exts, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(exts, name); p; p = strstr(p + 1, name))
        if ((p == exts || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static llmcl_vendor classify_vendor(const char *platform_name, const char *vendor)
{
    if (contains_nocase(platform_name, "Portable Computing Language") ||
        contains_nocase(platform_name, "pocl"))
        return LLMCL_VENDOR_POCL;
    if (contains_nocase(platform_name, "rusticl") || contains_nocase(platform_name, "clover") ||
        contains_nocase(platform_name, "mesa"))
        return LLMCL_VENDOR_MESA;
    if (contains_nocase(vendor, "nvidia"))
        return LLMCL_VENDOR_NVIDIA;
    if (contains_nocase(vendor, "advanced micro devices") || contains_nocase(vendor, "amd"))
        return LLMCL_VENDOR_AMD;
    if (contains_nocase(vendor, "intel"))
        return LLMCL_VENDOR_INTEL;
    return LLMCL_VENDOR_OTHER;
}

/* Whether the device's compiler takes src. */
static bool source_builds(cl_context context, cl_device_id device, const char *src)
{
    cl_int err;
    cl_program prog = clCreateProgramWithSource(context, 1, &src, NULL, &err);
    if (err != CL_SUCCESS)
        return false;
    bool ok = clBuildProgram(prog, 1, &device, "", NULL, NULL) == CL_SUCCESS;
    clReleaseProgram(prog);
    return ok;
}

/* Builds a kernel with an inline PTX shuffle: NVIDIA's compiler accepts it only where PTX works. */
static bool inline_ptx_builds(cl_context context, cl_device_id device)
{
    static const char *src =
        "__kernel void probe(__global float *x) {\n"
        "  float v = x[get_global_id(0)], t;\n"
        "  asm volatile(\"shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;\" : \"=f\"(t) : \"f\"(v));\n"
        "  x[get_global_id(0)] = t;\n"
        "}\n";
    return source_builds(context, device, src);
}

/*
 * The shared memory a block may opt into, by NVIDIA compute capability (CUDA's
 * cudaDevAttrMaxSharedMemoryPerBlockOptin), less 1 KiB for what the compiler adds; 0 where unknown.
 * NVIDIA's OpenCL reports 48 KiB as CL_DEVICE_LOCAL_MEM_SIZE and holds local kernel arguments to it,
 * but builds and runs kernels whose __local arrays take up to this much (measured on the H100).
 */
static uint64_t nv_optin_local_bytes(int major, int minor)
{
    const uint64_t kib = major == 7 ? (minor == 5 ? 64 : 96)
                         : major == 8 ? (minor == 0 || minor == 7 ? 163 : 99)
                         : major == 9 || major == 10 ? 227
                         : major >= 11 ? 99
                                       : 0;
    return kib > 1 ? (kib - 1) * 1024 : 0;
}

/* Whether a kernel with a __local array of `bytes` builds. */
static bool static_local_builds(cl_context context, cl_device_id device, uint64_t bytes)
{
    char src[512];
    snprintf(src, sizeof src,
             "__kernel void probe(__global uint *x) {\n"
             "  __local uint s[%llu];\n"
             "  const uint n = %llu, l = get_local_id(0);\n"
             "  for (uint i = l; i < n; i += get_local_size(0)) s[i] = x[i];\n"
             "  barrier(CLK_LOCAL_MEM_FENCE);\n"
             "  x[l] = s[n - 1 - l];\n"
             "}\n",
             (unsigned long long)(bytes / 4), (unsigned long long)(bytes / 4));
    return source_builds(context, device, src);
}

/* The tensor-core block's instructions (mma.cl): NVIDIA's compiler takes them for sm_80 and later. */
static bool mma_builds(cl_context context, cl_device_id device)
{
    static const char *src =
        "__kernel void probe(__global const ushort *a, __global float *c) {\n"
        "  __local ushort s[256] __attribute__((aligned(16)));\n"
        "  const uint l = get_local_id(0), sa = (uint)(size_t)(s + (l % 16) * 16);\n"
        "  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, 16;\" :: \"r\"(sa),\n"
        "               \"l\"(a + (l % 16) * 16));\n"
        "  asm volatile(\"cp.async.commit_group;\");\n"
        "  asm volatile(\"cp.async.wait_group 0;\");\n"
        "  barrier(CLK_LOCAL_MEM_FENCE);\n"
        "  uint a0, a1, a2, a3;\n"
        "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\"\n"
        "               : \"=r\"(a0), \"=r\"(a1), \"=r\"(a2), \"=r\"(a3) : \"r\"(sa));\n"
        "  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;\n"
        "  asm(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, \"\n"
        "      \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2),\n"
        "      \"+f\"(d3) : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"r\"(a0), \"r\"(a1));\n"
        "  c[l] = d0 + d1 + d2 + d3;\n"
        "}\n";
    return source_builds(context, device, src);
}

/* LLMCL_WGMMA=0 keeps the kernels on mma.sync (to compare, or should a driver break the route). */
static bool wgmma_switched_off(void)
{
    const char *v = llmcl__getenv("LLMCL_WGMMA");
    return v && strcmp(v, "0") == 0;
}

/* Releases what a probe that runs a kernel made; any of them may be NULL. */
static void probe_release(cl_mem a, cl_mem b, cl_command_queue q, cl_kernel k, cl_program prog)
{
    if (a)
        clReleaseMemObject(a);
    if (b)
        clReleaseMemObject(b);
    if (q)
        clReleaseCommandQueue(q);
    if (k)
        clReleaseKernel(k);
    if (prog)
        clReleaseProgram(prog);
}

/*
 * Whether wgmma runs through PTX retargeted to sm_90a (mma.cl): one warpgroup multiplies a 64 x 64
 * tile of ones by an 8 x 64 tile whose row n holds n + 1, from 128-byte swizzled local tiles (the
 * layout's permutation leaves such rows alike), and every work-item checks its four sums, 16 (n + 1).
 */
static bool wgmma_runs(cl_context context, cl_device_id device)
{
    static const char *src =
        "__kernel __attribute__((reqd_work_group_size(128, 1, 1)))\n"
        "void probe(__global int *ok) {\n"
        "  __local ushort s[72 * 64] __attribute__((aligned(1024)));\n"
        "  const uint l = get_local_id(0), t = l % 4;\n"
        "  for (uint i = l; i < 72 * 64; i += 128) /* bf16 1.0, then n + 1 */\n"
        "    s[i] = i < 64 * 64 ? 0x3f80 : as_uint((float)((i - 64 * 64) / 64 + 1)) >> 16;\n"
        "  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
        "  barrier(CLK_LOCAL_MEM_FENCE);\n"
        "  const uint a = (uint)(size_t)s, b = a + 64 * 128;\n"
        "  const ulong da = (ulong)(a >> 4) | 1 << 16 | (ulong)64 << 32 | (ulong)1 << 62;\n"
        "  const ulong db = (ulong)(b >> 4) | 1 << 16 | (ulong)64 << 32 | (ulong)1 << 62;\n"
        "  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;\n"
        "  asm volatile(\"" LLMCL__SM90A_MARKER "wgmma.fence.sync.aligned;\" ::: \"memory\");\n"
        "  asm volatile(\"" LLMCL__SM90A_MARKER "{ .reg .pred p; setp.ne.b32 p, %6, 0; \"\n"
        "    \"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0; }\"\n"
        "    : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3) : \"l\"(da), \"l\"(db), \"r\"(1));\n"
        "  asm volatile(\"" LLMCL__SM90A_MARKER "wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
        "  asm volatile(\"" LLMCL__SM90A_MARKER "wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n"
        "  const float want = 16.0f * (2 * t + 1);\n"
        "  ok[l] = d0 == want && d1 == want + 16.0f && d2 == d0 && d3 == d1;\n"
        "}\n";
    cl_int err;
    cl_program built = clCreateProgramWithSource(context, 1, &src, NULL, &err);
    if (err != CL_SUCCESS)
        return false;
    char *ptx = clBuildProgram(built, 1, &device, "", NULL, NULL) == CL_SUCCESS
                    ? llmcl__program_text(built)
                    : NULL;
    clReleaseProgram(built);
    cl_program prog = ptx ? llmcl__nv_retarget_sm90a(context, device, ptx) : NULL;
    free(ptx);
    cl_kernel k = prog ? clCreateKernel(prog, "probe", &err) : NULL;
    cl_command_queue q = k ? clCreateCommandQueue(context, device, 0, &err) : NULL;
    cl_mem buf = q ? clCreateBuffer(context, CL_MEM_READ_WRITE, 128 * sizeof(cl_int), NULL, &err)
                   : NULL;
    cl_int ok[128] = {0};
    const size_t n = 128;
    bool runs = buf && clSetKernelArg(k, 0, sizeof buf, &buf) == CL_SUCCESS &&
                clEnqueueNDRangeKernel(q, k, 1, NULL, &n, &n, 0, NULL, NULL) == CL_SUCCESS &&
                clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof ok, ok, 0, NULL, NULL) == CL_SUCCESS;
    for (int i = 0; runs && i < 128; ++i)
        runs = ok[i] == 1;
    probe_release(buf, NULL, q, k, prog);
    return runs;
}

/* Trips of the loop probe: far past llvmpipe's 65535, a millisecond where loops run in full. */
#define LOOP_PROBE_TRIPS (1 << 20)

/*
 * Where the device ends loops early (info.loop_limit), else 0: one work-item sums a loop of
 * LOOP_PROBE_TRIPS trips over values it loads, which no compiler can fold away, and reports how
 * many trips ran. Mesa's llvmpipe stops every loop of a kernel invocation once they have made
 * 65535 passes together, a guard against endless loops (docs/PORTABILITY.md has the rule).
 */
static uint64_t loop_limit(cl_context context, cl_device_id device)
{
    static const char *src =
        "__kernel void probe(__global const int *one, __global long *trips, long n) {\n"
        "  long acc = 0;\n"
        "  for (long i = 0; i < n; ++i)\n"
        "    acc += one[i & 1];\n"
        "  trips[0] = acc;\n"
        "}\n";
    const cl_int ones[2] = {1, 1};
    const cl_long n = LOOP_PROBE_TRIPS;
    cl_long trips = n;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(context, 1, &src, NULL, &err);
    bool ok = err == CL_SUCCESS && clBuildProgram(prog, 1, &device, "", NULL, NULL) == CL_SUCCESS;
    cl_kernel k = ok ? clCreateKernel(prog, "probe", &err) : NULL;
    cl_command_queue q = k ? clCreateCommandQueue(context, device, 0, &err) : NULL;
    cl_mem in = q ? clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ones,
                                   (void *)ones, &err)
                  : NULL;
    cl_mem out = in ? clCreateBuffer(context, CL_MEM_WRITE_ONLY, sizeof trips, NULL, &err) : NULL;
    const size_t one = 1;
    ok = out && clSetKernelArg(k, 0, sizeof in, &in) == CL_SUCCESS &&
         clSetKernelArg(k, 1, sizeof out, &out) == CL_SUCCESS &&
         clSetKernelArg(k, 2, sizeof n, &n) == CL_SUCCESS &&
         clEnqueueNDRangeKernel(q, k, 1, NULL, &one, &one, 0, NULL, NULL) == CL_SUCCESS &&
         clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof trips, &trips, 0, NULL, NULL) == CL_SUCCESS;
    probe_release(out, in, q, k, prog);
    return ok && trips > 0 && trips < n ? (uint64_t)trips : 0;
}

/*
 * LLMCL_LOOP_LIMIT=N lowers the loop limit to N (or sets it where the device has none), so that
 * the launchers' splitting of long loops runs, and is tested, on any device.
 */
static llmcl_status lower_loop_limit(llmcl_ctx *ctx, llmcl_device_info *info)
{
    int64_t n;
    bool set;
    LLMCL__TRY(llmcl__env_int(ctx, "LLMCL_LOOP_LIMIT", 1, INT64_MAX, false,
                              "a count of loop iterations such as 65535", &n, &set));
    if (set && (!info->loop_limit || (uint64_t)n < info->loop_limit))
        info->loop_limit = (uint64_t)n;
    return LLMCL_OK;
}

static void device_string(cl_device_id d, cl_device_info what, char *buf, size_t len)
{
    if (clGetDeviceInfo(d, what, len, buf, NULL) != CL_SUCCESS)
        snprintf(buf, len, "?");
}

static void probe_numbers(cl_device_id d, llmcl_device_info *info)
{
    cl_uint cu = 0;
    cl_ulong gmem = 0, alloc = 0, lmem = 0;
    cl_device_local_mem_type ltype = CL_GLOBAL;
    cl_device_type type = 0;
    cl_device_fp_config dbl = 0;
    clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gmem, &gmem, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof alloc, &alloc, NULL);
    clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
    clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_TYPE, sizeof ltype, &ltype, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof info->max_work_group_size,
                    &info->max_work_group_size, NULL);
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    clGetDeviceInfo(d, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof dbl, &dbl, NULL);
    info->compute_units = cu;
    info->global_mem_bytes = gmem;
    info->max_alloc_bytes = alloc;
    info->local_mem_bytes = lmem;
    info->local_mem_static_bytes = lmem;
    info->local_mem_is_dedicated = ltype == CL_LOCAL;
    info->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
    info->has_fp64 = dbl != 0;
}

static void probe_vendor_attributes(cl_device_id d, const char *exts, llmcl_device_info *info)
{
    info->simd_width = 1;
    if (llmcl__has_extension(exts, "cl_nv_device_attribute_query")) {
        cl_uint major = 0, minor = 0, warp = 0;
        clGetDeviceInfo(d, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL);
        clGetDeviceInfo(d, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof minor, &minor, NULL);
        clGetDeviceInfo(d, CL_DEVICE_WARP_SIZE_NV, sizeof warp, &warp, NULL);
        info->nv_cc_major = (int)major;
        info->nv_cc_minor = (int)minor;
        info->simd_width = warp ? (int)warp : 32;
    } else if (llmcl__has_extension(exts, "cl_amd_device_attribute_query")) {
        cl_uint wave = 0;
        if (clGetDeviceInfo(d, CL_DEVICE_WAVEFRONT_WIDTH_AMD, sizeof wave, &wave, NULL) == CL_SUCCESS &&
            wave)
            info->simd_width = (int)wave;
    }
}

llmcl_status llmcl__device_probe(llmcl_ctx *ctx, cl_platform_id platform, cl_device_id device,
                                 llmcl_device_info *info)
{
    memset(info, 0, sizeof *info);
    size_t ext_len = 0;
    LLMCL__CL(ctx, clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len));
    char *exts = calloc(ext_len + 1, 1);
    LLMCL__REQUIRE(ctx, exts, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "device extension string");
    clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, ext_len, exts, NULL);

    device_string(device, CL_DEVICE_NAME, info->name, sizeof info->name);
    device_string(device, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    device_string(device, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version);
    device_string(device, CL_DEVICE_VERSION, info->device_version, sizeof info->device_version);
    device_string(device, CL_DEVICE_OPENCL_C_VERSION, info->opencl_c_version,
                  sizeof info->opencl_c_version);
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof info->platform_name, info->platform_name, NULL);
    clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof info->platform_version,
                      info->platform_version, NULL);
    if (sscanf(info->opencl_c_version, "OpenCL C %d.%d", &info->cl_c_major, &info->cl_c_minor) != 2) {
        info->cl_c_major = 1;
        info->cl_c_minor = 2;
    }
    info->vendor_id = classify_vendor(info->platform_name, info->vendor);
    probe_numbers(device, info);
    probe_vendor_attributes(device, exts, info);
    info->has_fp16 = llmcl__has_extension(exts, "cl_khr_fp16");
    info->has_fp64 = info->has_fp64 || llmcl__has_extension(exts, "cl_khr_fp64");
    info->has_subgroups =
        llmcl__has_extension(exts, "cl_khr_subgroups") || llmcl__has_extension(exts, "cl_intel_subgroups");
    free(exts);

    cl_context context = ctx ? ctx->context : clCreateContext(NULL, 1, &device, NULL, NULL, NULL);
    if (context)
        info->loop_limit = loop_limit(context, device);
    LLMCL__TRY(lower_loop_limit(ctx, info));
    if (info->vendor_id == LLMCL_VENDOR_NVIDIA) {
        if (context)
            info->has_inline_ptx = inline_ptx_builds(context, device);
        if (context && info->has_inline_ptx && info->nv_cc_major >= 8)
            info->has_mma = mma_builds(context, device);
        /* sm_90a's instructions exist on compute capability 9.0 only */
        if (context && info->has_mma && info->nv_cc_major == 9 && info->nv_cc_minor == 0 &&
            !wgmma_switched_off())
            info->has_wgmma = wgmma_runs(context, device);
        const uint64_t optin = nv_optin_local_bytes(info->nv_cc_major, info->nv_cc_minor);
        if (context && optin > info->local_mem_bytes && static_local_builds(context, device, optin))
            info->local_mem_static_bytes = optin;
    }
    if (context && !ctx)
        clReleaseContext(context);
    return LLMCL_OK;
}

int64_t llmcl__loop_budget(const llmcl_ctx *ctx)
{
    return ctx->info.loop_limit ? (int64_t)ctx->info.loop_limit : INT64_MAX;
}

llmcl_status llmcl__check_loops(llmcl_ctx *ctx, int64_t passes, const char *fmt, ...)
{
    if (passes <= llmcl__loop_budget(ctx))
        return LLMCL_OK;
    char what[LLMCL__ERR_LEN / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return LLMCL__FAIL(ctx, LLMCL_ERROR_UNSUPPORTED,
                       "%s: its loops would run %lld iterations in one work-item, past the %llu "
                       "that this device runs before it cuts loops short (llmcl_device_info."
                       "loop_limit)",
                       what, (long long)passes, (unsigned long long)ctx->info.loop_limit);
}

llmcl_status llmcl_device_probe(cl_device_id device, llmcl_device_info *info)
{
    LLMCL__REQUIRE(NULL, device && info, LLMCL_ERROR_INVALID_ARGUMENT,
                   "device and info must not be NULL");
    cl_platform_id platform;
    LLMCL__CL(NULL, clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL));
    LLMCL__TRY(llmcl__device_probe(NULL, platform, device, info));
    llmcl__tma *tma = info->has_wgmma ? llmcl__tma_open(device) : NULL;
    info->has_tma = tma != NULL;
    llmcl__tma_close(tma);
    return LLMCL_OK;
}
