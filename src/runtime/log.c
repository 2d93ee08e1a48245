/* log.c: opt-in logging to stderr (LLMCL_LOG=1), environment access and temporary file names. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

const char *llmcl__getenv(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* The variable's value, with *set (where given) saying whether there is one. */
static const char *env_value(const char *name, bool *set)
{
    const char *text = llmcl__getenv(name);
    if (set)
        *set = text != NULL;
    return text;
}

llmcl_status llmcl__env_int(llmcl_ctx *ctx, const char *name, int64_t lo, int64_t hi, bool units,
                            const char *what, int64_t *out, bool *set)
{
    const char *text = env_value(name, set);
    if (!text)
        return LLMCL_OK;
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    int shift = 0;
    if (units && end != text) {
        const int u = toupper((unsigned char)*end);
        shift = u == 'K' ? 10 : u == 'M' ? 20 : u == 'G' ? 30 : 0;
        end += shift != 0;
    }
    LLMCL__REQUIRE(ctx,
                   end != text && *end == '\0' && errno == 0 && v >= lo && v <= (hi >> shift),
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s='%s' is not %s", name, text, what);
    *out = (int64_t)v << shift;
    return LLMCL_OK;
}

llmcl_status llmcl__env_positive(llmcl_ctx *ctx, const char *name, const char *what, double *out,
                                 bool *set)
{
    const char *text = env_value(name, set);
    if (!text)
        return LLMCL_OK;
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    LLMCL__REQUIRE(ctx, end != text && *end == '\0' && errno == 0 && isfinite(v) && v > 0.0,
                   LLMCL_ERROR_INVALID_ARGUMENT, "%s='%s' is not %s", name, text, what);
    *out = v;
    return LLMCL_OK;
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

void llmcl__temp_path(char *out, size_t cap, const char *path)
{
    static atomic_uint calls;
    snprintf(out, cap, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&calls, 1u));
}
