/*
 * fuzz_safetensors.c: libFuzzer harness of the safetensors reader (src/runtime/safetensors.c).
 * The input is a whole file: llmcl_safetensors_open parses and checks its header, then every
 * tensor is looked up by name and its metadata read. What the reader accepts must hold what its
 * API promises (docs in include/llmcl.h): each tensor's bytes inside the file, its byte count the
 * product of its shape and dtype, the tensors tiling the data section in order. A violation is a
 * silent wrong acceptance and aborts, as a crash would.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_temp.h"
#include "llmcl.h"
#include "src/runtime/safetensors.h"

#define EXPECT(cond)                                                                             \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz_safetensors: accepted a file that breaks: %s\n", #cond);       \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

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
        const llmcl__st_dtype *d = llmcl__st_dtype_by_name(info.dtype_name);
        EXPECT(d != NULL);
        /* the size in bits, saturated far past any file's (a later 0 still empties it) */
        const unsigned __int128 cap = (unsigned __int128)1 << 100;
        unsigned __int128 bits = (unsigned __int128)d->bits;
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
