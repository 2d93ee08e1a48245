/*
 * util.h: what every part of llmcl-train shares: fatal errors with llmcl's message, output paths
 * checked before a run, checked allocation, sizes for people, counter-based random streams, a loop
 * over threads, 1-D slices of device tensors and safetensors values read into host memory; and,
 * through util/util.h, what it shares with the tests and the other tools (TRY, the xoshiro256**
 * sequence, the monotonic clock).
 */
#ifndef LLMCL_TRAIN_UTIL_H
#define LLMCL_TRAIN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmcl.h"
#include "util/util.h"

/* Whether path names a folder. */
bool path_is_dir(const char *path);

/* Prints "llmcl-train: <message>" to stderr and exits with status 1. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/*
 * die(), with finish() (may be NULL) called between the message and the exit: under MPI, for a
 * failure that every rank has agreed on, MPI_Finalize, so that each rank exits 1 with its message
 * instead of mpiexec killing the ranks still running once the first has exited.
 */
void die_finally(void (*finish)(void), const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Dies naming the call, the status and llmcl's last error on ctx when expr failed. */
#define CHECK(expr, ctx) check_status((expr), (ctx), #expr, __FILE__, __LINE__)
void check_status(llmcl_status st, const llmcl_ctx *ctx, const char *expr, const char *file,
                  int line);

/* What an output path will be: a file written through PATH.tmp and a rename (--save,
   --dump-logits); a checkpoint folder replaced through renames of PATH.tmp and PATH.old beside
   it (--save under --zero: an existing folder must be one, or empty); a folder created where
   missing and written into (--export). */
typedef enum output_kind { OUTPUT_FILE, OUTPUT_FOLDER_REPLACED, OUTPUT_FOLDER_FILLED } output_kind;

/* Dies, naming option, path and the system's reason, unless path can be written as kind says: so
   that a run fails at its start rather than after its training. */
void check_output_path(const char *option, const char *path, output_kind kind);

/* Whether paths a and b name one place: one name in one folder, however each spells the folder. */
bool same_place(const char *a, const char *b);

void *xmalloc(size_t bytes);
void *xcalloc(size_t n, size_t size);

/*
 * Counter-based random numbers (the initial weights): value j of a stream is a pure function of
 * the stream's key and j, so that any range of it can be drawn on its own, by any thread, with
 * the same bits. Stream `stream` of seed: key = rng_stream(seed, stream).
 */
uint64_t rng_stream(uint64_t seed, uint64_t stream);

/* out[k] = scale z, z the standard normal value `from + k` of the stream, for k < n (Box-Muller:
   values 2i and 2i + 1 share a pair of uniforms). */
void rng_normal_fill(uint64_t key, int64_t from, int64_t n, double scale, float *out);

/* out[k] = the uniform value `from + k` of the stream in [lo, hi), for k < n. */
void rng_uniform_fill(uint64_t key, int64_t from, int64_t n, double lo, double hi, float *out);

/*
 * body(arg, lo, hi) over pieces of [begin, end) that cover it, on up to the online processors'
 * count of threads (at most 32), each piece at least grain elements: a range shorter than 2 grain
 * runs on the caller's thread alone. Returns when every piece is done.
 */
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  void (*body)(void *arg, int64_t lo, int64_t hi), void *arg);

/* A size for people: "2.30 GiB", or "12.5 MiB" below 1 GiB. */
void format_bytes(double bytes, char *buf, size_t len);

/* A 1-D view of n elements of contiguous t from its element at (dies on a bad range). */
llmcl_tensor *tensor_slice(const llmcl_tensor *t, int64_t at, int64_t n);

/* The n f32 values host into t (f32, bf16 or f16: rounded to nearest even, as llmcl_cast), and t's
   n values widened into host. Each dies on failure. */
void tensor_upload_f32(llmcl_tensor *t, const float *host, int64_t n);
void tensor_download_f32(const llmcl_tensor *t, float *host, int64_t n);

/*
 * The n values of the tensor called name in st (f32, bf16 or f16, checked by the caller) as f32
 * in host memory, converted as llmcl_safetensors_load converts them.
 */
void safetensors_to_host(const llmcl_safetensors *st, const char *name, float *host, int64_t n);

#endif
