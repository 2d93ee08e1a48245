/*
 * program.c: kernel sources, build options, and the two-level program cache.
 *
 * A family's source is common.cl, the preludes its entry in the family table declares, and its own
 * files, joined in that order.
 *
 * In memory, programs are kept per context keyed by (family, options); a family's source is fixed
 * for the context's life. On disk, program binaries live in the cache folder under a 128-bit hash of
 * source, options, device name, driver version, platform version and library version. An entry holds
 * a header (magic, the key hash, the descriptor text it was made for, the binary's length and
 * checksum) and the binary; it is written to a temporary file and renamed, and any entry that does
 * not check out in every field is ignored and rebuilt. PoCL keeps its own cache, and llmcl stores
 * no binaries there while it is on (keeps_binaries).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "embedded.h"
#include "internal.h"

#define MAX_KERNELS_PER_PROGRAM 32
#define ENTRY_MAGIC "LLMCLPB1"

typedef struct cached_kernel {
    char name[64];
    cl_kernel kernel;
} cached_kernel;

struct llmcl__program {
    llmcl__program *next;
    char family[32];
    char *options;
    XXH64_hash_t options_hash; /* compared first: options of one family share long prefixes */
    cl_program program;
    int n_kernels;
    cached_kernel kernels[MAX_KERNELS_PER_PROGRAM];
};

typedef struct family_source {
    char *text;
    size_t len;
} family_source;

/* ---- sources ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = '\0';
                *len = (size_t)n;
            } else {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    return buf;
}

/* The source file name.cl, from LLMCL_KERNEL_DIR or embedded. */
static llmcl_status load_one(llmcl_ctx *ctx, const char *name, family_source *out)
{
    const char *dir = llmcl__getenv("LLMCL_KERNEL_DIR");
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.cl", dir, name);
        out->text = read_file(path, &out->len);
        LLMCL__REQUIRE(ctx, out->text, LLMCL_ERROR_KERNEL_NOT_FOUND,
                       "cannot read kernel source '%s' (LLMCL_KERNEL_DIR=%s): %s", path, dir,
                       strerror(errno));
        return LLMCL_OK;
    }
    for (const llmcl__embedded_source *s = llmcl__embedded_sources; s->family; ++s)
        if (strcmp(s->family, name) == 0) {
            out->text = malloc(s->size + 1);
            LLMCL__REQUIRE(ctx, out->text, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "kernel source");
            memcpy(out->text, s->data, s->size);
            out->text[s->size] = '\0';
            out->len = s->size;
            return LLMCL_OK;
        }
    return LLMCL__FAIL(ctx, LLMCL_ERROR_KERNEL_NOT_FOUND, "no kernel source '%s.cl' in this build",
                       name);
}

/* The tensor-core block (mma.cl): a prelude that only devices with tensor cores get; elsewhere the
   families' portable kernels run. */
#define TENSOR_CORE_PRELUDE "mma"
#define MAX_PRELUDES 3
#define MAX_FAMILY_FILES 4
#define MAX_PARTS (1 + MAX_PRELUDES + MAX_FAMILY_FILES)

/*
 * Each kernel family's sources, in build order after common.cl (which every family gets): the
 * preludes it builds on (shared .cl files that are no family of their own), then its own files.
 * Its kernel keys are in include/llmcl_kernels.h, which its launcher and llmcl-tune share.
 */
typedef struct family_entry {
    const char *family;
    const char *preludes[MAX_PRELUDES];
    const char *files[MAX_FAMILY_FILES];
} family_entry;

static const family_entry families[] = {
    {LLMCL_FAMILY_ELEMENTWISE, {"vec_io"}, {"elementwise"}},
    {LLMCL_FAMILY_NORM, {"vec_io"}, {"norm"}},
    {LLMCL_FAMILY_ROPE, {"vec_io"}, {"rope"}},
    {LLMCL_FAMILY_GLU, {"vec_io"}, {"glu"}},
    {LLMCL_FAMILY_ATTENTION,
     {"vec_io", TENSOR_CORE_PRELUDE},
     {"attention_common", "attention_portable", "attention_mma", "attention_wgmma"}},
    {LLMCL_FAMILY_CROSS_ENTROPY, {"ce_logit", "row_io"}, {"cross_entropy"}},
    {LLMCL_FAMILY_DISTILL, {"row_io"}, {"distill"}},
    {LLMCL_FAMILY_PREFERENCE, {"row_io"}, {"preference"}},
    {LLMCL_FAMILY_MATMUL, {"vec_io", "ce_logit", TENSOR_CORE_PRELUDE}, {"matmul"}},
    {LLMCL_FAMILY_EMBEDDING, {NULL}, {"embedding"}},
    {LLMCL_FAMILY_OPTIM, {"vec_io"}, {"optim"}},
    {LLMCL_FAMILY_CEILINGS, {TENSOR_CORE_PRELUDE}, {"ceilings"}},
};

static const family_entry *family_entry_of(const char *family)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; ++i)
        if (strcmp(families[i].family, family) == 0)
            return &families[i];
    return NULL;
}

/* The names of a family's source files in build order, its own from names[*own] on; returns how
   many. */
static int family_parts(const llmcl_ctx *ctx, const family_entry *f, const char *names[MAX_PARTS],
                        int *own)
{
    int n = 0;
    names[n++] = "common";
    for (int i = 0; i < MAX_PRELUDES && f->preludes[i]; ++i)
        if (strcmp(f->preludes[i], TENSOR_CORE_PRELUDE) != 0 || ctx->info.has_mma)
            names[n++] = f->preludes[i];
    *own = n;
    for (int i = 0; i < MAX_FAMILY_FILES && f->files[i]; ++i)
        names[n++] = f->files[i];
    return n;
}

llmcl_status llmcl__kernel_source(llmcl_ctx *ctx, const char *family, char **out, size_t *len)
{
    const family_entry *f = family_entry_of(family);
    LLMCL__REQUIRE(ctx, f, LLMCL_ERROR_KERNEL_NOT_FOUND, "no kernel family '%s' in this build",
                   family);
    const char *names[MAX_PARTS];
    int own;
    const int n = family_parts(ctx, f, names, &own);
    family_source parts[MAX_PARTS] = {{0}};
    /* the family's own files first, so that a family missing from LLMCL_KERNEL_DIR is the one
       named */
    llmcl_status st = LLMCL_OK;
    for (int k = 0; k < n && st == LLMCL_OK; ++k) {
        const int i = (own + k) % n;
        st = load_one(ctx, names[i], &parts[i]);
    }
    static const char sep[] = "\n#line 1\n";
    size_t total = 0;
    for (int i = 0; i < n; ++i)
        total += parts[i].len + sizeof sep;
    *out = st == LLMCL_OK ? malloc(total + 1) : NULL;
    if (*out) {
        *len = 0;
        for (int i = 0; i < n; ++i) {
            if (i > 0) {
                memcpy(*out + *len, sep, sizeof sep - 1);
                *len += sizeof sep - 1;
            }
            memcpy(*out + *len, parts[i].text, parts[i].len);
            *len += parts[i].len;
        }
        (*out)[*len] = '\0';
    }
    for (int i = 0; i < n; ++i)
        free(parts[i].text);
    LLMCL__TRY(st);
    LLMCL__REQUIRE(ctx, *out, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "kernel source");
    return LLMCL_OK;
}

/* ---- options ---- */

/*
 * Every launch defines its options afresh, about twenty of them, and snprintf's format parser was
 * most of a small launch's host time; so the items are written by copying, each once, in place.
 */
static void define_pair(llmcl__defines *d, const char *name, const char *value)
{
    if (d->n >= LLMCL__MAX_DEFINES)
        return;
    char *s = d->items[d->n++];
    const size_t cap = sizeof d->items[0];
    llmcl__copy_text(s, cap, name);
    if (value) {
        const size_t n = strlen(s);
        if (n + 1 < cap) {
            s[n] = '=';
            llmcl__copy_text(s + n + 1, cap - n - 1, value);
        }
    }
}

void llmcl__define_int(llmcl__defines *d, const char *name, long long value)
{
    char digits[24];
    char *p = digits + sizeof digits;
    unsigned long long v = value < 0 ? 0ull - (unsigned long long)value : (unsigned long long)value;
    *--p = '\0';
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (value < 0)
        *--p = '-';
    define_pair(d, name, p);
}

void llmcl__define_str(llmcl__defines *d, const char *name, const char *value)
{
    define_pair(d, name, value);
}

void llmcl__define_flag(llmcl__defines *d, const char *name) { define_pair(d, name, NULL); }

const char *llmcl__dtype_macro(llmcl_dtype dtype)
{
    static const char *names[] = {"F32", "BF16", "F16", "I32", "I64"};
    return (unsigned)dtype < LLMCL_DTYPE_COUNT ? names[dtype] : "INVALID";
}

static int cmp_define(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorted -D options, the device's -cl-std, then LLMCL_BUILD_OPTIONS. */
static char *build_options(const llmcl_ctx *ctx, const llmcl__defines *user)
{
    const char *items[LLMCL__MAX_DEFINES + 4];
    int n_items = 0;
    for (int i = 0; user && i < user->n; ++i)
        items[n_items++] = user->items[i];
    if (ctx->info.has_inline_ptx)
        items[n_items++] = "LLMCL_NV_PTX";
    if (ctx->info.has_inline_ptx && ctx->info.nv_cc_major >= 8)
        items[n_items++] = "LLMCL_NV_BF16_CVT";
    if (ctx->info.has_mma)
        items[n_items++] = "LLMCL_NV_MMA";
    if (ctx->info.has_wgmma)
        items[n_items++] = "LLMCL_NV_WGMMA";
    qsort(items, (size_t)n_items, sizeof items[0], cmp_define);
    const char *extra = llmcl__getenv("LLMCL_BUILD_OPTIONS");
    size_t cap = (size_t)n_items * 100 + 64 + (extra ? strlen(extra) : 0);
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t len = 0;
    for (int i = 0; i < n_items; ++i) {
        const size_t n = strlen(items[i]);
        memcpy(s + len, "-D", 2);
        memcpy(s + len + 2, items[i], n);
        s[len + 2 + n] = ' ';
        len += n + 3;
    }
    len += (size_t)snprintf(s + len, cap - len, "-cl-std=CL%d.%d", ctx->info.cl_c_major,
                            ctx->info.cl_c_minor);
    if (extra)
        snprintf(s + len, cap - len, " %s", extra);
    return s;
}

/* ---- disk cache ---- */

typedef struct disk_key {
    XXH128_hash_t hash;
    char path[1200];
    char *descriptor; /* what the entry was made for, stored in it and compared on load */
} disk_key;

/*
 * Whether the disk cache keeps this device's binaries. Not PoCL's while its own kernel cache is on
 * (POCL_KERNEL_CACHE unset, or starting with 1 as PoCL reads it): that cache already keeps the
 * front end's output, keyed by the preprocessed source, options and device, and each kernel that a
 * launch compiled; and asking PoCL for a binary compiles every kernel of the program once more, as
 * generic work-group functions that no launch uses (a launch compiles its own, specialised to its
 * local size). That second compile was most of a cold test run's time.
 */
static bool keeps_binaries(const llmcl_ctx *ctx)
{
    if (!ctx->cache_binaries)
        return false;
    const char *pocl_cache = llmcl__getenv("POCL_KERNEL_CACHE");
    return ctx->info.vendor_id != LLMCL_VENDOR_POCL || (pocl_cache && pocl_cache[0] != '1');
}

static bool disk_key_make(const llmcl_ctx *ctx, const char *source, size_t source_len,
                          const char *options, disk_key *k)
{
    if (!ctx->cache_dir[0] || !keeps_binaries(ctx))
        return false;
    XXH64_hash_t src_hash = XXH3_64bits(source, source_len);
    size_t cap = strlen(options) + 1200;
    k->descriptor = malloc(cap);
    if (!k->descriptor)
        return false;
    snprintf(k->descriptor, cap, "source %016llx\noptions %s\ndevice %s\ndriver %s\nplatform %s\nllmcl %s\n",
             (unsigned long long)src_hash, options, ctx->info.name, ctx->info.driver_version,
             ctx->info.platform_version, llmcl_version());
    k->hash = XXH3_128bits(k->descriptor, strlen(k->descriptor));
    snprintf(k->path, sizeof k->path, "%s/%016llx%016llx.bin", ctx->cache_dir,
             (unsigned long long)k->hash.high64, (unsigned long long)k->hash.low64);
    return true;
}

typedef struct entry_header {
    char magic[8];
    uint64_t hash_high, hash_low;
    uint64_t descriptor_len;
    uint64_t binary_len;
    uint64_t binary_checksum;
} entry_header;

/* The binary stored for k, or NULL when absent or invalid (*rejected set for a bad entry). */
static unsigned char *disk_read(const disk_key *k, size_t *len, bool *rejected)
{
    size_t n = 0;
    unsigned char *buf = (unsigned char *)read_file(k->path, &n);
    *rejected = buf != NULL;
    if (!buf)
        return NULL;
    entry_header h;
    const size_t dlen = strlen(k->descriptor);
    /* lengths compared by what remains, never summed: a binary_len of 2^64 - 1 would wrap */
    bool ok = n >= sizeof h + dlen;
    if (ok) {
        memcpy(&h, buf, sizeof h);
        ok = memcmp(h.magic, ENTRY_MAGIC, 8) == 0 && h.hash_high == k->hash.high64 &&
             h.hash_low == k->hash.low64 && h.descriptor_len == dlen &&
             h.binary_len > 0 && h.binary_len == n - sizeof h - dlen &&
             memcmp(buf + sizeof h, k->descriptor, dlen) == 0 &&
             XXH3_64bits(buf + sizeof h + dlen, h.binary_len) == h.binary_checksum;
    }
    if (!ok) {
        free(buf);
        return NULL;
    }
    memmove(buf, buf + sizeof h + dlen, h.binary_len);
    *len = h.binary_len;
    *rejected = false;
    return buf;
}

static void make_dirs(const char *dir)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; ++p)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

static void disk_write(const llmcl_ctx *ctx, const disk_key *k, const unsigned char *bin, size_t len)
{
    make_dirs(ctx->cache_dir);
    char tmp[1300];
    llmcl__temp_path(tmp, sizeof tmp, k->path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    entry_header h = {.hash_high = k->hash.high64,
                      .hash_low = k->hash.low64,
                      .descriptor_len = strlen(k->descriptor),
                      .binary_len = len,
                      .binary_checksum = XXH3_64bits(bin, len)};
    memcpy(h.magic, ENTRY_MAGIC, 8);
    bool ok = fwrite(&h, sizeof h, 1, f) == 1 &&
              fwrite(k->descriptor, 1, h.descriptor_len, f) == h.descriptor_len &&
              fwrite(bin, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, k->path) != 0)
        remove(tmp);
}

static unsigned char *program_binary(cl_program prog, size_t *len)
{
    size_t size = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS ||
        size == 0)
        return NULL;
    unsigned char *bin = malloc(size);
    if (bin && clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
        free(bin);
        return NULL;
    }
    *len = size;
    return bin;
}

/* ---- building ---- */

/* A program built from a binary (NVIDIA: PTX); NULL if the driver refuses it. */
static cl_program program_from_binary(cl_context context, cl_device_id device,
                                      const unsigned char *bin, size_t len)
{
    cl_int status, err;
    cl_program prog = clCreateProgramWithBinary(context, 1, &device, &len, &bin, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS ||
        clBuildProgram(prog, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
        if (prog)
            clReleaseProgram(prog);
        return NULL;
    }
    return prog;
}

char *llmcl__program_text(cl_program prog)
{
    size_t len = 0;
    unsigned char *bin = program_binary(prog, &len);
    char *text = bin ? realloc(bin, len + 1) : NULL;
    if (!text) {
        free(bin);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* Removes every `mark` from s, in place. */
static void remove_all(char *s, const char *mark)
{
    const size_t n = strlen(mark);
    char *w = s;
    for (const char *r = s; *r;)
        if (strncmp(r, mark, n) == 0)
            r += n;
        else
            *w++ = *r++;
    *w = '\0';
}

unsigned llmcl__nv_item_registers(size_t work_items)
{
    const size_t quads = (work_items + 127) / 128; /* warps per quarter of the multiprocessor */
    const size_t per = quads > 0 ? 16384 / (quads * 32) / 8 * 8 : 255;
    return per < 255 ? (unsigned)per : 255;
}

/*
 * After each kernel's ".reqntid X, Y, Z" line, ".maxnreg R": the most registers that X Y Z
 * work-items can hold (llmcl__nv_item_registers). The JIT ignores setmaxnreg (warning C7508) unless
 * the PTX states the register count at entry, which NVIDIA's front end leaves out. A new string,
 * or NULL without memory.
 */
static char *with_maxnreg(const char *ptx)
{
    static const char key[] = "\n.reqntid ";
    size_t n = 0;
    for (const char *p = strstr(ptx, key); p; p = strstr(p + 1, key))
        ++n;
    char *out = malloc(strlen(ptx) + 24 * n + 1), *w = out;
    if (!out)
        return NULL;
    for (const char *r = ptx;;) {
        const char *p = strstr(r, key), *eol = p ? strchr(p + 1, '\n') : NULL;
        if (!eol) {
            strcpy(w, r);
            return out;
        }
        memcpy(w, r, (size_t)(eol - r));
        w += eol - r;
        unsigned x = 1, y = 1, z = 1;
        sscanf(p + sizeof key - 1, "%u, %u, %u", &x, &y, &z);
        w += sprintf(w, "\n.maxnreg %u", llmcl__nv_item_registers((size_t)x * y * z));
        r = eol;
    }
}

cl_program llmcl__nv_retarget_sm90a(cl_context context, cl_device_id device, const char *ptx)
{
    static const char from[] = "\n.target sm_90,";
    const char *target = strstr(ptx, from);
    char *text = target ? malloc(strlen(ptx) + 2) : NULL;
    cl_program prog = NULL;
    if (text) {
        const size_t head = (size_t)(target - ptx) + sizeof from - 2; /* up to "sm_90" */
        memcpy(text, ptx, head);
        text[head] = 'a';
        strcpy(text + head + 1, ptx + head);
        remove_all(text, LLMCL__SM90A_MARKER);
        if (strstr(text, "setmaxnreg")) {
            char *stated = with_maxnreg(text);
            free(text);
            text = stated;
        }
    }
    if (text)
        prog = program_from_binary(context, device, (const unsigned char *)text,
                                   strlen(text) + 1);
    free(text);
    return prog;
}

/*
 * A program whose PTX holds sm_90a instructions behind their markers (mma.cl) is rebuilt from
 * that PTX retargeted to sm_90a; prog is released then. NULL with *st set on failure.
 */
static cl_program retarget_if_marked(llmcl_ctx *ctx, const char *family, const char *options,
                                     cl_program prog, llmcl_status *st)
{
    char *ptx = ctx->info.has_wgmma ? llmcl__program_text(prog) : NULL;
    if (!ptx || !strstr(ptx, LLMCL__SM90A_MARKER)) {
        free(ptx);
        return prog;
    }
    cl_program out = llmcl__nv_retarget_sm90a(ctx->context, ctx->device, ptx);
    free(ptx);
    clReleaseProgram(prog);
    if (!out)
        *st = LLMCL__FAIL(ctx, LLMCL_ERROR_BUILD_FAILURE,
                          "building kernel family '%s' with '%s' for sm_90a failed", family,
                          options);
    return out;
}

static void keep_build_log(llmcl_ctx *ctx, cl_program prog, const char *family, const char *options)
{
    size_t n = 0;
    clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    size_t cap = n + strlen(options) + strlen(family) + 64;
    free(ctx->build_log);
    ctx->build_log = malloc(cap);
    if (!ctx->build_log)
        return;
    int head = snprintf(ctx->build_log, cap, "family: %s\noptions: %s\nlog:\n", family, options);
    if (clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, n, ctx->build_log + head,
                              NULL) != CL_SUCCESS)
        ctx->build_log[head] = '\0';
}

/*
 * LLMCL_LOG=2 also prints the compiler's output of successful builds from source: its warnings,
 * and with -cl-nv-verbose NVIDIA's register report. Taken before an sm_90a rebuild, which replaces
 * the program and its log.
 */
static void log_build_output(const llmcl_ctx *ctx, cl_program prog, const char *family,
                             const char *options)
{
    const char *level = llmcl__getenv("LLMCL_LOG");
    size_t n = 0;
    if (!level || strcmp(level, "2") != 0 ||
        clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS)
        return;
    char *text = malloc(n + 1);
    if (text && clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, n, text, NULL) ==
                    CL_SUCCESS) {
        text[n] = '\0';
        llmcl__log("build log of %s [%s]:\n%s", family, options, text);
    }
    free(text);
}

static cl_program try_disk(llmcl_ctx *ctx, const disk_key *k)
{
    size_t len = 0;
    bool rejected = false;
    unsigned char *bin = disk_read(k, &len, &rejected);
    cl_program prog = NULL;
    if (bin) {
        prog = program_from_binary(ctx->context, ctx->device, bin, len);
        rejected = !prog;
        free(bin);
    }
    if (rejected) {
        ctx->cache_stats.disk_rejects++;
        llmcl__log("ignored bad cache entry %s", k->path);
    }
    return prog;
}

static llmcl_status build_program(llmcl_ctx *ctx, const char *family, const char *options,
                                  cl_program *out)
{
    char *source = NULL;
    size_t len = 0;
    LLMCL__TRY(llmcl__kernel_source(ctx, family, &source, &len));
    disk_key key = {0};
    bool use_disk = disk_key_make(ctx, source, len, options, &key);
    cl_program prog = use_disk ? try_disk(ctx, &key) : NULL;
    llmcl_status st = LLMCL_OK;
    if (prog) {
        ctx->cache_stats.disk_hits++;
        llmcl__log("disk cache hit: %s [%s]", family, options);
    } else {
        cl_int err;
        const char *src = source;
        prog = clCreateProgramWithSource(ctx->context, 1, &src, &len, &err);
        if (err != CL_SUCCESS) {
            st = llmcl__fail_cl(ctx, err, "clCreateProgramWithSource", __FILE__, __LINE__);
        } else if ((err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL)) != CL_SUCCESS) {
            keep_build_log(ctx, prog, family, options);
            st = LLMCL__FAIL(ctx, LLMCL_ERROR_BUILD_FAILURE,
                             "building kernel family '%s' with '%s' failed (%s); see llmcl_build_log()",
                             family, options, llmcl_status_str(err));
            clReleaseProgram(prog);
            prog = NULL;
        } else {
            log_build_output(ctx, prog, family, options);
            prog = retarget_if_marked(ctx, family, options, prog, &st);
        }
        if (prog) {
            ctx->cache_stats.builds++;
            llmcl__log("built %s [%s]", family, options);
            size_t blen = 0;
            unsigned char *bin = use_disk ? program_binary(prog, &blen) : NULL;
            if (bin)
                disk_write(ctx, &key, bin, blen);
            free(bin);
        }
    }
    free(key.descriptor);
    free(source);
    *out = prog;
    return st;
}

static llmcl_status find_program(llmcl_ctx *ctx, const char *family, const llmcl__defines *defines,
                                 llmcl__program **out)
{
    char *options = build_options(ctx, defines);
    LLMCL__REQUIRE(ctx, options, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "build options");
    const XXH64_hash_t hash = XXH3_64bits(options, strlen(options));
    for (llmcl__program *p = ctx->programs; p; p = p->next)
        if (p->options_hash == hash && strcmp(p->family, family) == 0 &&
            strcmp(p->options, options) == 0) {
            free(options);
            ctx->cache_stats.memory_hits++;
            *out = p;
            return LLMCL_OK;
        }
    llmcl__program *p = calloc(1, sizeof *p);
    if (!p) {
        free(options);
        return LLMCL__FAIL(ctx, LLMCL_ERROR_OUT_OF_HOST_MEMORY, "program cache entry");
    }
    llmcl_status st = build_program(ctx, family, options, &p->program);
    if (st != LLMCL_OK) {
        free(options);
        free(p);
        return st;
    }
    snprintf(p->family, sizeof p->family, "%s", family);
    p->options = options;
    p->options_hash = hash;
    p->next = ctx->programs;
    ctx->programs = p;
    *out = p;
    return LLMCL_OK;
}

llmcl_status llmcl__kernel(llmcl_ctx *ctx, const char *family, const llmcl__defines *defines,
                           const char *name, cl_kernel *out)
{
    llmcl__program *p = NULL;
    LLMCL__TRY(find_program(ctx, family, defines, &p));
    for (int i = 0; i < p->n_kernels; ++i)
        if (strcmp(p->kernels[i].name, name) == 0) {
            *out = p->kernels[i].kernel;
            return LLMCL_OK;
        }
    LLMCL__REQUIRE(ctx, p->n_kernels < MAX_KERNELS_PER_PROGRAM, LLMCL_ERROR_UNSUPPORTED,
                   "too many kernels from family '%s'", family);
    cl_int err;
    cl_kernel k = clCreateKernel(p->program, name, &err);
    if (err != CL_SUCCESS)
        return llmcl__fail_cl(ctx, err, "clCreateKernel", __FILE__, __LINE__);
    snprintf(p->kernels[p->n_kernels].name, sizeof p->kernels[0].name, "%s", name);
    p->kernels[p->n_kernels++].kernel = k;
    *out = k;
    return LLMCL_OK;
}

void llmcl__programs_release(llmcl_ctx *ctx)
{
    llmcl__program *p = ctx->programs;
    while (p) {
        llmcl__program *next = p->next;
        for (int i = 0; i < p->n_kernels; ++i)
            clReleaseKernel(p->kernels[i].kernel);
        clReleaseProgram(p->program);
        free(p->options);
        free(p);
        p = next;
    }
    ctx->programs = NULL;
}
