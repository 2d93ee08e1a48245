/*
 * status.c: status codes and their text, the per-context and per-thread last-error messages, and
 * the library version.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char thread_error[LLMCL__ERR_LEN];

const char *llmcl_version(void) { return LLMCL_VERSION_STRING; }

static const char *cl_status_str(int status)
{
    switch (status) {
#define CASE(code)                                                                                \
    case code:                                                                                    \
        return #code;
        CASE(CL_DEVICE_NOT_FOUND) CASE(CL_DEVICE_NOT_AVAILABLE) CASE(CL_COMPILER_NOT_AVAILABLE)
        CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE) CASE(CL_OUT_OF_RESOURCES) CASE(CL_OUT_OF_HOST_MEMORY)
        CASE(CL_PROFILING_INFO_NOT_AVAILABLE) CASE(CL_MEM_COPY_OVERLAP) CASE(CL_IMAGE_FORMAT_MISMATCH)
        CASE(CL_IMAGE_FORMAT_NOT_SUPPORTED) CASE(CL_BUILD_PROGRAM_FAILURE) CASE(CL_MAP_FAILURE)
        CASE(CL_MISALIGNED_SUB_BUFFER_OFFSET) CASE(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        CASE(CL_COMPILE_PROGRAM_FAILURE) CASE(CL_LINKER_NOT_AVAILABLE) CASE(CL_LINK_PROGRAM_FAILURE)
        CASE(CL_DEVICE_PARTITION_FAILED) CASE(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
        CASE(CL_INVALID_VALUE) CASE(CL_INVALID_DEVICE_TYPE) CASE(CL_INVALID_PLATFORM)
        CASE(CL_INVALID_DEVICE) CASE(CL_INVALID_CONTEXT) CASE(CL_INVALID_QUEUE_PROPERTIES)
        CASE(CL_INVALID_COMMAND_QUEUE) CASE(CL_INVALID_HOST_PTR) CASE(CL_INVALID_MEM_OBJECT)
        CASE(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) CASE(CL_INVALID_IMAGE_SIZE) CASE(CL_INVALID_SAMPLER)
        CASE(CL_INVALID_BINARY) CASE(CL_INVALID_BUILD_OPTIONS) CASE(CL_INVALID_PROGRAM)
        CASE(CL_INVALID_PROGRAM_EXECUTABLE) CASE(CL_INVALID_KERNEL_NAME)
        CASE(CL_INVALID_KERNEL_DEFINITION) CASE(CL_INVALID_KERNEL) CASE(CL_INVALID_ARG_INDEX)
        CASE(CL_INVALID_ARG_VALUE) CASE(CL_INVALID_ARG_SIZE) CASE(CL_INVALID_KERNEL_ARGS)
        CASE(CL_INVALID_WORK_DIMENSION) CASE(CL_INVALID_WORK_GROUP_SIZE)
        CASE(CL_INVALID_WORK_ITEM_SIZE) CASE(CL_INVALID_GLOBAL_OFFSET) CASE(CL_INVALID_EVENT_WAIT_LIST)
        CASE(CL_INVALID_EVENT) CASE(CL_INVALID_OPERATION) CASE(CL_INVALID_GL_OBJECT)
        CASE(CL_INVALID_BUFFER_SIZE) CASE(CL_INVALID_MIP_LEVEL) CASE(CL_INVALID_GLOBAL_WORK_SIZE)
        CASE(CL_INVALID_PROPERTY) CASE(CL_INVALID_IMAGE_DESCRIPTOR) CASE(CL_INVALID_COMPILER_OPTIONS)
        CASE(CL_INVALID_LINKER_OPTIONS) CASE(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef CASE
    default:
        return NULL;
    }
}

const char *llmcl_status_str(int status)
{
    switch (status) {
#define LLMCL_STATUS_CASE(name, value, text)                                                      \
    case value:                                                                                   \
        return text;
        LLMCL_STATUS_LIST(LLMCL_STATUS_CASE)
#undef LLMCL_STATUS_CASE
    default:
        break;
    }
    const char *cl = cl_status_str(status);
    return cl ? cl : "unknown status";
}

const char *llmcl_last_error(const llmcl_ctx *ctx) { return ctx ? ctx->last_error : thread_error; }

static llmcl_status record(const llmcl_ctx *ctx, llmcl_status status, const char *file, int line,
                           const char *msg)
{
    /* The slot is the context's own scratch text; writing it does not change the context's state. */
    char *slot = ctx ? ((llmcl_ctx *)ctx)->last_error : thread_error;
    const char *base = strrchr(file, '/');
    snprintf(slot, LLMCL__ERR_LEN, "%s (%s:%d): %s", llmcl_status_str(status), base ? base + 1 : file,
             line, msg);
    if (llmcl__log_enabled())
        llmcl__log("error: %s", slot);
    return status;
}

llmcl_status llmcl__fail(const llmcl_ctx *ctx, llmcl_status status, const char *file, int line,
                         const char *fmt, ...)
{
    char msg[LLMCL__ERR_LEN - 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return record(ctx, status, file, line, msg);
}

llmcl_status llmcl__fail_cl(const llmcl_ctx *ctx, cl_int err, const char *expr, const char *file,
                            int line)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s returned %s (%d)", expr, llmcl_status_str(err), err);
    llmcl_status status = (err == CL_MEM_OBJECT_ALLOCATION_FAILURE) ? LLMCL_ERROR_OUT_OF_DEVICE_MEMORY
                                                                    : (llmcl_status)err;
    return record(ctx, status, file, line, msg);
}
