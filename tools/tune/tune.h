/*
 * tune.h: the engine of llmcl-tune, separate from its command line so that tests can drive it.
 *
 * A kernel is tuned through its public op: the engine forces each candidate with
 * llmcl_tune_override(), runs the op, checks with llmcl_tune_params_get() that the launcher used
 * exactly the candidate, compares the outputs with those of the reference configuration (the
 * launcher's defaults), and times the survivors with profiling events. Adding a kernel to the tuner
 * is one tune_kernel entry in tools/tune/kernels.c (plus the small function that calls its op).
 */
#ifndef LLMCL_TUNE_H
#define LLMCL_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmcl.h"

#define TUNE_MAX_PARAMS 12
#define TUNE_MAX_VALUES 16
#define TUNE_MAX_SPACE 100000 /* candidates of a space that are enumerated; past it, sampled */
#define TUNE_MAX_TENSORS 6
#define TUNE_MAX_DIMS 8
#define TUNE_TEXT 256

typedef enum tune_role {
    TUNE_IN = 0, /* read only */
    TUNE_OUT,    /* written: compared with the reference */
    TUNE_INOUT,  /* read and written (y of axpy): re-uploaded before each check, compared */
} tune_role;

typedef enum tune_init {
    TUNE_INIT_NORMAL = 0, /* standard normal values */
    TUNE_INIT_NEAR_ONE,   /* uniform in [0.9, 1.1]: stays finite when an op repeats on itself */
    TUNE_INIT_INDEX,      /* integers uniform in [0, the size of dim `index_dim`) */
} tune_init;

/* A fixed dtype for a tensor; 0 means the case's dtype. */
#define TUNE_DT(d) ((int)(d) + 1)

typedef struct tune_tensor_spec {
    const char *name; /* NULL ends the list */
    tune_role role;
    const char *dims; /* shape as dim names of the case, outermost first: "R,C" */
    int fixed_dtype;  /* 0: the case's dtype; TUNE_DT(LLMCL_I64) and so on */
    tune_init init;
    const char *index_dim; /* TUNE_INIT_INDEX: values below this dim's size */
} tune_tensor_spec;

/* A case: one kernel at one dtype and shape, with the candidate being tried. */
typedef struct tune_case {
    llmcl_dtype dtype;
    int n_dims;
    char dim_names[TUNE_MAX_DIMS][8];
    int64_t dims[TUNE_MAX_DIMS];
    char shape_class[16];
    int n_params;
    const char *param_names[TUNE_MAX_PARAMS];
    long values[TUNE_MAX_PARAMS]; /* the candidate (or the reference's values) */
    char params_text[TUNE_TEXT];  /* the same as "NAME=VALUE ...", "" for the reference */
} tune_case;

/* The value of a dim of the case by name, or -1. */
int64_t tune_dim(const tune_case *c, const char *name);

typedef struct tune_kernel {
    const char *key;    /* the kernel key (an LLMCL_KEY_*) its launcher looks up */
    const char *family; /* its family (an LLMCL_FAMILY_*): --kernel accepts either */
    /* Candidate values per tunable: "WG=64,128,256 VEC=1,4". */
    const char *params;
    unsigned dtypes;          /* dtypes to tune at (--dtype picks among them): 1u << dtype */
    const char *size_key;     /* the dims whose product the launcher classes: "C" or "R*C" */
    /* Optional, instead of size_key: the launcher's size key when it is no product of dims. */
    int64_t (*size_key_fn)(const tune_case *c);
    const char *shapes;       /* representative shapes on a GPU: "R=4096,C=4096;R=1024,C=8192" */
    const char *small_shapes; /* the same on a CPU device */
    tune_tensor_spec tensors[TUNE_MAX_TENSORS];
    /* Runs the op once on tensors t (in the order of tensors[]). */
    llmcl_status (*run)(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c);
    /*
     * Optional: overwrites some inputs with values derived from the others (run once, before the
     * reference, with the launcher's defaults), which every buffer set then holds, so that the op
     * sees consistent operands rather than independent random ones.
     */
    llmcl_status (*derive_inputs)(llmcl_ctx *ctx, llmcl_tensor *const *t, const tune_case *c);
    /*
     * Optional: false, with the reason in why, when the candidate exceeds a device limit (local
     * memory, registers). Tunables named WG, WG_* or *_WG are checked against the device's maximum
     * work-group size without it.
     */
    bool (*fits)(const llmcl_device_info *info, const tune_case *c, char *why, size_t why_len);
    double tol_scale; /* multiplies the dtype's comparison tolerance; 0 means 1 */
    /*
     * Outputs are long sums (products): another order of summation moves an element by rounding
     * errors of the size of the sums it adds, not of the element, so an element's absolute
     * tolerance is at least the relative one of the output's RMS.
     */
    bool tol_rms;
    /* Optional: false on devices whose launcher never uses this kernel (its cases are skipped). */
    bool (*runs_on)(const llmcl_device_info *info);
} tune_kernel;

/* The table in kernels.c, terminated by an entry whose key is NULL. */
extern const tune_kernel tune_kernels[];

typedef struct tune_options {
    bool quick;            /* bounded search for CI */
    int max_candidates;    /* candidates tried per case (a fixed-seed sample); 0: all */
    int warmup, reps;      /* runs before timing; timed runs (the median is kept) */
    double case_seconds;   /* stop trying candidates after this long in one case; 0: no limit */
    uint64_t rotate_bytes; /* rotate buffer sets until they span this many bytes */
    bool for_platform;     /* write the file for any device of this platform and type */
    FILE *trace;           /* a line per candidate (its time, or why it was dropped); NULL: none */
    /* Called after each candidate: done of total candidates of the current case. */
    void (*progress)(void *arg, int done, int total);
    void *progress_arg;
} tune_options;

/* Why candidates were dropped. */
typedef enum tune_reject {
    TUNE_REJ_LIMITS = 0, /* device limits (work-group size, local memory), launch refused */
    TUNE_REJ_BUILD,      /* the kernel did not build */
    TUNE_REJ_WRONG,      /* output differs from the reference beyond tolerance */
    TUNE_REJ_ADJUSTED,   /* the launcher did not use the candidate as given */
    TUNE_REJ_ERROR,      /* any other failure of the op */
    TUNE_REJ_COUNT
} tune_reject;

typedef struct tune_result {
    const tune_kernel *kernel;
    llmcl_dtype dtype;
    char shape[96]; /* "R=4096,C=4096" */
    char shape_class[16];
    char default_params[TUNE_TEXT];
    double default_ms;
    char now_params[TUNE_TEXT]; /* what the runtime runs with the files a new context loads */
    double now_ms;              /* 0: not measured (the op failed with them) */
    char best_params[TUNE_TEXT];
    double best_ms;
    int candidates;   /* in the space, after sampling */
    int tried, timed; /* tried: checked; timed: passed and timed */
    int rejected[TUNE_REJ_COUNT];
    char last_reject[TUNE_REJ_COUNT][TUNE_TEXT]; /* an example per kind, for messages */
    bool ok; /* false: the case itself failed (error holds why) */
    char error[512];
} tune_result;

/*
 * table's space with the parameters that restrict_to names ("NAME=V1,V2 ...") taking its values
 * instead, written to out. Returns a mask of the names the table has (bit i: the i-th name of
 * restrict_to), or -1 when either text is malformed or out is too small.
 */
int tune_restrict_space(const char *table, const char *restrict_to, char *out, size_t n);

/* Default options (full or quick) for a device. */
tune_options tune_default_options(const llmcl_device_info *info, bool quick);

/* Finds a kernel by key; NULL when none. */
const tune_kernel *tune_find(const tune_kernel *table, const char *key);

/* Number of candidates of a kernel's space (before sampling), or -1 when params is malformed. */
long tune_space_size(const tune_kernel *k);

/*
 * The candidates of a space of total to try, in order, by a fixed seed: the whole space shuffled,
 * of which the first *count (max where 0 < max < total, else total) run; past TUNE_MAX_SPACE, as
 * many drawn without repeats (max >= 1), the only way to search such a space. The caller frees
 * the order; NULL when total < 1, max < 1 past TUNE_MAX_SPACE or out of host memory.
 */
long *tune_candidate_order(long total, int max, long *count);

/*
 * Tunes kernel k at dtype and shape ("R=4096,C=4096") on ctx. Clears ctx's database first so the
 * reference is the launcher's heuristic default; leaves no override behind. The result says what
 * was tried, rejected and chosen; the status is not OK only for failures of the case itself.
 */
llmcl_status tune_run_case(llmcl_ctx *ctx, const tune_kernel *k, llmcl_dtype dtype,
                           const char *shape, const tune_options *o, tune_result *r);

/* Whether --merge could add to path: no file, or a tuning file of ctx's device (else why). */
bool tune_merge_check(const char *path, llmcl_ctx *ctx, const tune_options *o, char *why,
                      size_t why_len);

/*
 * Writes results as a tuning file for ctx's device (format in docs/TUNING.md). With merge, entries
 * of an existing file at path for the same device are kept unless retuned, under a lock
 * (PATH.lock) that other merges into path wait for; a file that is not one of this device's is
 * refused, not replaced. Writes a temporary file and renames it. Returns false with why on
 * failure.
 */
bool tune_write_json(const char *path, llmcl_ctx *ctx, const tune_result *results, int n,
                     const tune_options *o, bool merge, char *why, size_t why_len);

#endif
