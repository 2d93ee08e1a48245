/*
 * fuzz_safetensors.c: libFuzzer harness of the safetensors reader (src/runtime/safetensors.c).
 * The input is a whole file: llmcl_safetensors_open parses and checks its header, then every
 * tensor is looked up by name and its metadata read. What the reader accepts must hold what its
 * API promises (docs in include/llmcl.h): each tensor's bytes inside the file, its byte count the
 * product of its shape and its dtype's width (the safetensors format's, tabled here, not the
 * reader's), the tensors tiling the data section in order. Small tensors of llmcl's dtypes are
 * then loaded into a context of the default device (PoCL's CPU device where there is no GPU):
 * in their own dtype the device must hold the file's bytes, and a load of the wrong shape must be
 * refused with dst untouched. A violation is a silent wrong acceptance and aborts, as a crash
 * would.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_temp.h"
#include "llmcl.h"

#define EXPECT(cond)                                                                             \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz_safetensors: accepted a file that breaks: %s\n", #cond);       \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

/* Bits an element of each dtype the safetensors format names, 0 for a name it does not. */
static unsigned dtype_bits(const char *name)
{
    static const struct {
        const char *name;
        unsigned bits;
    } table[] = {{"BOOL", 8},     {"F4", 4},       {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
                 {"I8", 8},       {"F8_E5M2", 8},  {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
                 {"U16", 16},     {"F16", 16},     {"BF16", 16},   {"I32", 32},    {"U32", 32},
                 {"F32", 32},     {"C64", 64},     {"F64", 64},    {"I64", 64},    {"U64", 64}};
    for (size_t i = 0; name && i < sizeof table / sizeof table[0]; ++i)
        if (strcmp(table[i].name, name) == 0)
            return table[i].bits;
    return 0;
}

static llmcl_ctx *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (llmcl_ctx_create(&ctx) != LLMCL_OK) {
        fprintf(stderr, "fuzz_safetensors: no OpenCL device: %s\n", llmcl_last_error(NULL));
        exit(1);
    }
    return 0;
}

#define MAX_LOAD_ELEMENTS 4096

/* A tensor of llmcl's dtypes and at most 4 dimensions, loaded into its own dtype and shape: the
   device holds the file's bytes. Then into one element more: refused, the poison left alone. */
static void check_load(const llmcl_safetensors *st, const char *name,
                       const llmcl_safetensors_info *info)
{
    int64_t n = 1;
    for (int k = 0; k < info->ndim; ++k)
        n = info->shape[k] > MAX_LOAD_ELEMENTS ? MAX_LOAD_ELEMENTS + 1 : n * info->shape[k];
    if (info->dtype == LLMCL_DTYPE_COUNT || info->ndim < 1 || info->ndim > LLMCL_MAX_DIMS ||
        n < 1 || n > MAX_LOAD_ELEMENTS)
        return;
    static unsigned char got[(MAX_LOAD_ELEMENTS + 1) * 8], poison[(MAX_LOAD_ELEMENTS + 1) * 8];
    llmcl_tensor *t = NULL;
    EXPECT(llmcl_tensor_create(ctx, info->dtype, info->ndim, info->shape, &t) == LLMCL_OK);
    EXPECT(llmcl_safetensors_load(ctx, st, name, t) == LLMCL_OK);
    EXPECT(llmcl_tensor_download(t, got, info->bytes) == LLMCL_OK);
    EXPECT(memcmp(got, info->data, info->bytes) == 0);
    llmcl_tensor_destroy(t);
    const int64_t longer = n + 1;
    const size_t bytes = (size_t)longer * llmcl_dtype_size(info->dtype);
    memset(poison, 0x5a, bytes);
    EXPECT(llmcl_tensor_create(ctx, info->dtype, 1, &longer, &t) == LLMCL_OK);
    EXPECT(llmcl_tensor_upload(t, poison, bytes) == LLMCL_OK);
    EXPECT(llmcl_safetensors_load(ctx, st, name, t) == LLMCL_ERROR_SHAPE_MISMATCH);
    EXPECT(llmcl_tensor_download(t, got, bytes) == LLMCL_OK);
    EXPECT(memcmp(got, poison, bytes) == 0);
    llmcl_tensor_destroy(t);
}

static void check(const llmcl_safetensors *st, const uint8_t *data, size_t size)
{
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i)
        header = (header << 8) | data[i];
    EXPECT(header <= size - 8);
    const uint64_t data_len = size - 8 - header;
    const int64_t count = llmcl_safetensors_count(st);
    EXPECT(count >= 0);
    uint64_t pos = 0; /* names come in offset order */
    for (int64_t i = 0; i < count; ++i) {
        const char *name = llmcl_safetensors_name(st, i);
        EXPECT(name != NULL);
        llmcl_safetensors_info info;
        EXPECT(llmcl_safetensors_find(st, name, &info) == LLMCL_OK);
        EXPECT(info.ndim >= 0 && info.ndim <= LLMCL_SAFETENSORS_MAX_DIMS);
        EXPECT(dtype_bits(info.dtype_name) != 0);
        /* the size in bits, saturated far past any file's (a later 0 still empties it) */
        const unsigned __int128 cap = (unsigned __int128)1 << 100;
        unsigned __int128 bits = (unsigned __int128)dtype_bits(info.dtype_name);
        for (int k = 0; k < info.ndim; ++k) {
            EXPECT(info.shape[k] >= 0);
            const unsigned __int128 dim = (unsigned __int128)info.shape[k];
            bits = dim != 0 && bits > cap / dim ? cap : bits * dim;
        }
        EXPECT(bits % 8 == 0 && bits / 8 == info.bytes);
        EXPECT(info.offset == pos && info.bytes <= data_len - info.offset);
        /* the mapping holds the file's bytes there: compare a few */
        if (info.bytes)
            EXPECT(memcmp(info.data, data + 8 + header + info.offset,
                          info.bytes < 64 ? (size_t)info.bytes : 64) == 0);
        pos = info.offset + info.bytes;
        check_load(st, name, &info);
    }
    EXPECT(pos == data_len);
    const char *format = llmcl_safetensors_metadata(st, "format");
    if (format)
        EXPECT(strlen(format) < size);
    EXPECT(llmcl_safetensors_name(st, count) == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (!fuzz_write_temp(data, size, ".safetensors", path))
        return 0;
    llmcl_safetensors *st = NULL;
    const llmcl_status status = llmcl_safetensors_open(path, &st);
    if (status == LLMCL_OK) {
        check(st, data, size);
        llmcl_safetensors_close(st);
    } else {
        EXPECT(st == NULL && llmcl_last_error(NULL)[0] != '\0');
    }
    unlink(path);
    return 0;
}
