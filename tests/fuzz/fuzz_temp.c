/* fuzz_temp.c: a fuzz input as a temporary file (fuzz_temp.h). */
#define _DEFAULT_SOURCE /* mkstemps */
#include "fuzz_temp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool fuzz_write_temp(const uint8_t *data, size_t size, const char *suffix, char path[64])
{
    snprintf(path, 64, "/tmp/llmcl-fuzz-XXXXXX%s", suffix);
    const int fd = mkstemps(path, (int)strlen(suffix));
    if (fd < 0)
        return false;
    size_t done = 0;
    while (done < size) {
        const ssize_t n = write(fd, data + done, size - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    close(fd);
    if (done < size)
        unlink(path);
    return done == size;
}
