/*
 * safetensors.h: what the safetensors reader (safetensors.c) and writer (safetensors_write.c)
 * share: the format's dtypes and the size of the host pieces that transfers go through.
 */
#ifndef LLMCL_SAFETENSORS_H
#define LLMCL_SAFETENSORS_H

#include "llmcl.h"

/* Header lengths above this are refused, as by the reference implementation. */
#define LLMCL__ST_MAX_HEADER 100000000ull

/* Host staging between the file and a device tensor is bounded by this many bytes. */
#define LLMCL__ST_PIECE_BYTES ((size_t)16 << 20)

typedef struct llmcl__st_dtype {
    const char *name;  /* as written in headers: "BF16" */
    int bits;          /* per element: 4 and 6 for the packed micro-floats */
    llmcl_dtype dtype; /* LLMCL_DTYPE_COUNT when llmcl has no such dtype */
} llmcl__st_dtype;

/* The dtype called name, or NULL. */
const llmcl__st_dtype *llmcl__st_dtype_by_name(const char *name);

/* The format's dtype for an llmcl dtype (NULL for an invalid one). */
const llmcl__st_dtype *llmcl__st_dtype_of(llmcl_dtype dtype);

/*
 * The dtype's place in the reference implementation's order of rising alignment; its writer puts
 * tensors of higher rank first.
 */
int llmcl__st_dtype_rank(const llmcl__st_dtype *d);

#endif /* LLMCL_SAFETENSORS_H */
