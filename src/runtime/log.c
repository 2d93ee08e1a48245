/* log.c: opt-in logging to stderr (LLMCL_LOG=1) and environment access. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *llmcl__getenv(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

bool llmcl__log_enabled(void) { return llmcl__log_level() > 0; }

int llmcl__log_level(void)
{
    const char *v = llmcl__getenv("LLMCL_LOG");
    if (!v || strcmp(v, "0") == 0)
        return 0;
    const int n = atoi(v);
    return n > 0 ? n : 1;
}

void llmcl__log(const char *fmt, ...)
{
    if (!llmcl__log_enabled())
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("[llmcl] ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
