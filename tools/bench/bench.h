/*
 * bench.h: the interface between llmcl-bench's driver (bench.c) and the per-family benchmark files
 * (bench_<family>.c). A family runs its kernels at a representative size on the selected device,
 * checks the output against the CPU reference in ref/, times them with profiling events and
 * adds one table row per kernel and direction.
 */
#ifndef LLMCL_BENCH_H
#define LLMCL_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "llmcl.h"

typedef struct bench_env {
    llmcl_ctx *ctx;
    bool small;        /* a CPU device: shrink sizes so the whole run takes a minute or two */
    double copy_gbs;   /* device copy bandwidth measured at start, bytes read + written */
    double copy_bytes; /* the size of that copy (read + written) */
    double fma_tflops; /* device fp32 FMA rate measured at start */
    double mma_tflops; /* bf16 tensor-core rate measured at start, 0 without tensor cores */
    double host_d2h_gbs, host_h2d_gbs; /* pinned host link measured at start, each way */
    double host_bytes;                 /* the size those copies had */
    int warmup, reps;
    double settle_s; /* --settle: seconds each kernel-timed row runs before its timed runs */
} bench_env;

typedef struct bench_row {
    char kernel[40];     /* e.g. "rmsnorm" */
    char direction[12];  /* "fwd", "bwd", "fwd+bwd" or "" */
    char dtype[8];
    char shape[48];
    double ms;           /* median kernel time */
    double bytes;        /* bytes moved (inputs read once + outputs written once), or 0 */
    double flops;        /* FLOPs, or 0 */
    bool on_mma;         /* ran on tensor cores: TFLOP/s against the mma rate, not the FMA rate */
    double link_gbs;     /* host copies: the %copy column is of this host link bandwidth ('h') */
    double size_copy_gbs; /* memory-bound rows: the copy kernel's rate moving the same bytes */
    double peak_mib;     /* peak device memory during the op through llmcl accounting, or -1 */
    double baseline_ms;  /* the unfused or naive baseline's time, or 0 */
    int check;           /* 1 matched the reference, 0 failed, -1 not checked */
} bench_row;

/* Adds a row to the table (GB/s, ratios and TFLOP/s are derived from it). */
void bench_add(bench_env *env, const bench_row *row);

/* An op to time: returns a status; arg is the family's own state. */
typedef llmcl_status (*bench_op)(llmcl_ctx *ctx, void *arg);

/*
 * Median of env->reps runs of op, in milliseconds of kernel time, after env->warmup runs; with
 * --settle, after runs that fill env->settle_s, the median over five batches of runs enqueued back
 * to back (about 20 ms each, as the settling runs) of a batch's host time over its run count: the
 * device as busy as while it settled, without profiling events. Returns a negative value (and prints
 * llmcl_last_error) when op fails.
 */
double bench_time(bench_env *env, bench_op op, void *arg);

/*
 * Median wall time in milliseconds of min(env->reps, max_reps, 16) runs of op, each to the end of
 * its work (llmcl_ctx_finish), after one warm-up run and then runs that fill two seconds (or
 * --settle's, if longer), so that the device's clock has settled under its power cap: for ops with
 * work outside llmcl's profile (CLBlast, other queues). Returns a negative value when op fails.
 */
double bench_wall_time(bench_env *env, bench_op op, void *arg, int max_reps);

/* Peak device MiB held by the library while op runs once (beyond what was held before). */
double bench_peak_mib(bench_env *env, bench_op op, void *arg);

/*
 * Times op (and baseline, when not NULL) on arg, measures op's peak memory and adds the row; the
 * row is dropped when op fails. dtype and shape are the row's labels; check as in bench_row.
 */
void bench_add_timed(bench_env *env, const char *kernel, const char *dir, const char *dtype,
                     const char *shape, double bytes, bench_op op, bench_op baseline, void *arg,
                     int check);

/* The same for a row whose labels, bytes, FLOPs and check the caller has filled in: sets its ms,
   peak_mib and baseline_ms. */
void bench_add_op(bench_env *env, bench_row *row, bench_op op, bench_op baseline, void *arg);

/* Random values in [-1, 1) from a fixed seed, converted to the tensor's dtype (contiguous) and
   uploaded. */
llmcl_status bench_upload_random(llmcl_tensor *t, uint64_t seed);

/* A new tensor of dtype dt and the given shape holding bench_upload_random's values. */
llmcl_status bench_new_random(llmcl_ctx *ctx, llmcl_dtype dt, int ndim, const int64_t *shape,
                              uint64_t seed, llmcl_tensor **out);

/* A new I32 tensor of the given shape holding labels in [0, v) from a fixed-seed generator, the
   first `prompt` of each row along the last dimension -100 (ignore_index: not scored). */
llmcl_status bench_new_labels(llmcl_ctx *ctx, int ndim, const int64_t *shape, int64_t v,
                              int64_t prompt, llmcl_tensor **out);

/* Prints a failure detail for a family's setup error and returns false. */
bool bench_fail(bench_env *env, const char *what, llmcl_status st);

/* Families: each adds its rows. */
void bench_elementwise(bench_env *env);
void bench_norm(bench_env *env);
void bench_rope(bench_env *env);
void bench_glu(bench_env *env);
void bench_attention(bench_env *env);
void bench_cross_entropy(bench_env *env);
void bench_distill(bench_env *env);
void bench_preference(bench_env *env);
void bench_matmul(bench_env *env);
void bench_offload(bench_env *env);
void bench_optim(bench_env *env);
#ifdef LLMCL_BENCH_DIST
void bench_dist(bench_env *env); /* built with MPI; run under mpiexec */
#endif

#endif
