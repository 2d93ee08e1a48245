/* fuzz_temp.h: a fuzz input as a file, for the parsers that take a path. */
#ifndef LLMCL_FUZZ_TEMP_H
#define LLMCL_FUZZ_TEMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Writes data to a new temporary file named from suffix ("" or ".bin", say) into path[64]; false
   when it cannot. The caller removes it. */
bool fuzz_write_temp(const uint8_t *data, size_t size, const char *suffix, char path[64]);

#endif
