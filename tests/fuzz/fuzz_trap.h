/*
 * fuzz_trap.h: runs one of llmcl-train's readers, which end the program through util.c's die(),
 * inside a libFuzzer harness. The harness is linked with ld's --wrap for exit, malloc, calloc,
 * realloc and free (tests/fuzz/meson.build): while a body runs, exit() returns to fuzz_trap_run
 * instead, and the memory that the dying reader still held (its own and jansson's) is freed, so
 * that a refused input costs nothing and LeakSanitizer sees only the leaks of inputs accepted.
 */
#ifndef LLMCL_FUZZ_TRAP_H
#define LLMCL_FUZZ_TRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Routes jansson's allocations through the tracked malloc; call once, before any parse. */
void fuzz_trap_init(void);

/*
 * Runs body(arg). Returns true when it returned, false when it called exit() (a refusal): then
 * cleanup(arg), when not NULL, has released what the reader's output owns (files, mappings), and
 * every allocation of the body not freed since is freed.
 */
bool fuzz_trap_run(void (*body)(void *arg), void (*cleanup)(void *arg), void *arg);

#endif
