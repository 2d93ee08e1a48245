/*
 * fuzz_trap.c: exit() as a return to the harness, with the dying reader's memory freed
 * (fuzz_trap.h). Only the harness's own thread is tracked: libFuzzer's threads allocate too.
 */
#include "fuzz_trap.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);
void __real_exit(int status) __attribute__((noreturn));

static jmp_buf jump;
static volatile bool armed;
static pthread_t owner;

/* The body's live allocations, newest last (frees are mostly of recent ones). */
static void **live;
static size_t n_live, cap_live;

static bool tracking(void) { return armed && pthread_equal(pthread_self(), owner); }

static void remember(void *p)
{
    if (!p)
        return;
    if (n_live == cap_live) {
        size_t cap = cap_live ? 2 * cap_live : 1024;
        void **grown = __real_realloc(live, cap * sizeof *grown);
        if (!grown) {
            fputs("fuzz_trap: out of memory\n", stderr);
            abort();
        }
        live = grown;
        cap_live = cap;
    }
    live[n_live++] = p;
}

/* Whether p was the body's. */
static bool forget(void *p)
{
    for (size_t i = n_live; p && i-- > 0;)
        if (live[i] == p) {
            live[i] = live[--n_live];
            return true;
        }
    return false;
}

void *__wrap_malloc(size_t size)
{
    void *p = __real_malloc(size);
    if (tracking())
        remember(p);
    return p;
}

void *__wrap_calloc(size_t n, size_t size)
{
    void *p = __real_calloc(n, size);
    if (tracking())
        remember(p);
    return p;
}

void *__wrap_realloc(void *p, size_t size)
{
    /* a block from before the body stays the caller's, wherever it moves */
    const bool track = tracking() && (!p || forget(p));
    void *q = __real_realloc(p, size);
    if (track && q)
        remember(q);
    else if (track && size != 0)
        remember(p); /* a failed realloc leaves p allocated; realloc(p, 0) may free it */
    return q;
}

void __wrap_free(void *p)
{
    if (tracking())
        forget(p);
    __real_free(p);
}

void __wrap_exit(int status)
{
    if (tracking())
        longjmp(jump, 1);
    __real_exit(status);
}

/* jansson is a shared library: its calls to malloc are not wrapped, these are. */
static void *json_alloc(size_t size) { return malloc(size); }
static void json_release(void *p) { free(p); }

void fuzz_trap_init(void) { json_set_alloc_funcs(json_alloc, json_release); }

bool fuzz_trap_run(void (*body)(void *arg), void (*cleanup)(void *arg), void *arg)
{
    n_live = 0;
    owner = pthread_self();
    if (setjmp(jump) == 0) {
        armed = true;
        body(arg);
        armed = false;
        n_live = 0; /* accepted: what is still allocated is the caller's, or a leak */
        return true;
    }
    if (cleanup)
        cleanup(arg); /* still armed: what it frees is forgotten */
    armed = false;
    for (size_t i = 0; i < n_live; ++i)
        __real_free(live[i]);
    n_live = 0;
    return false;
}
