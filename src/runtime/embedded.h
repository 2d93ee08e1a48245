/* embedded.h: the kernel sources that scripts/embed_cl.py compiles into the library. */
#ifndef LLMCL_EMBEDDED_H
#define LLMCL_EMBEDDED_H

#include <stddef.h>

typedef struct llmcl__embedded_source {
    const char *family; /* file stem: "common", "norm", ... */
    const unsigned char *data;
    size_t size;
} llmcl__embedded_source;

/* Terminated by an entry whose family is NULL. */
extern const llmcl__embedded_source llmcl__embedded_sources[];

#endif
