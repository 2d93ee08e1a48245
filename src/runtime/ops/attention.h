/*
 * attention.h: what the attention launcher's files share (attention.c: checks, builds and launches;
 * attention_tiles.c: the tiles of each architecture's kernels; attention_split.c: the portable
 * kernels' walks within the device's loop budget). Private to src/runtime/ops/attention*.c.
 */
#ifndef LLMCL_OPS_ATTENTION_H
#define LLMCL_OPS_ATTENTION_H

#include "src/runtime/internal.h"

/* The kernel sets of src/cl/attention_*.cl, one file each. */
typedef enum attn_arch {
    ATTN_ARCH_PORTABLE, /* attention_portable.cl: any device */
    ATTN_ARCH_MMA,      /* attention_mma.cl: mma.sync, NVIDIA from sm_80 */
    ATTN_ARCH_WGMMA     /* attention_wgmma.cl: wgmma, Hopper */
} attn_arch;

/* What a kernel computes. */
typedef enum attn_pass {
    ATTN_PASS_FWD,  /* O and LSE, a work-group per query tile */
    ATTN_PASS_PRE,  /* the backward's delta = rowsum(dO * O) */
    ATTN_PASS_DQ,   /* dQ, a work-group per query tile */
    ATTN_PASS_DKDV, /* dK and dV, a work-group per key tile */
    ATTN_PASS_DQ_DS /* dQ from the dS that dK/dV stored (wgmma only) */
} attn_pass;

/* A kernel: its name in the .cl, the define that builds it alone, its tuning key, its set and its
   pass (a row of attention.c's table). */
typedef struct attn_kernel {
    const char *name, *define, *key;
    attn_arch arch;
    attn_pass pass;
} attn_kernel;

/* The query block of attn_bwd_dq_ds_wgmma (attention_wgmma.cl's DS_BM): two warpgroups. */
#define ATTN_DS_BM 128

/*
 * The backward's stored dS (attention_wgmma.cl's DS_STORE): the scratch, its query heads' and rows'
 * strides, dK/dV's key tile (dQ's kernel reads dS in the same tiles), and the part of the call a
 * launch covers: (batch, KV head) pairs bh0 .. bh0 + nbh - 1, whose query heads are the scratch's
 * in order.
 */
typedef struct attn_ds {
    const llmcl_tensor *scratch;
    int64_t ds_h, ds_t;
    int bn;
    int bh0, nbh;
} attn_ds;

/* Everything the kernels need to know about one call, validated. */
typedef struct attn_geom {
    bool varlen;
    llmcl_dtype dtype;
    int B, Hq, Hkv, D;
    int Tq, Tk; /* dense lengths, or the longest sequence in varlen mode */
    int wl, wr; /* mask band around the diagonal, causal folded in; -1 unbounded */
    float scale, softcap;
    const llmcl_tensor *cu_q, *cu_k;
    bool aligned4;  /* every offset and stride of the loaded operands a multiple of 4 elements */
    bool aligned8;  /* ... of 8 elements: 16-byte rows for cp.async */
    bool pre_vec8;  /* O's and dO's offsets and strides multiples of 8: attn_bwd_pre's PRE_VEC 8 */
    attn_arch bwd;  /* the backward's kernel set */
    int dkdv_part;  /* past D = 128: which of dK (2) and dV (1) attn_bwd_dkdv_mma takes */
    bool split;     /* a portable kernel's walk spans launches (SPLIT): see llmcl__attn_split */
    const attn_ds *ds; /* dK/dV stores dS, and dQ's kernel reads it; NULL: dQ recomputes it */
} attn_geom;

/* A kernel's tiles (the portable kernels read all of them, the tensor-core ones bm, bn, run). */
typedef struct attn_tiles {
    int bm, bn, tm, tn;
    int lf32;   /* operand tiles in f32 in local memory: 1 all, 2 the Q side */
    int kvsep;  /* attn_fwd: separate K and V buffers */
    int unroll; /* unroll factor of the products' loops, 0 the compiler's choice */
    int pipe;   /* stage the next tile's operands through registers */
    int kf32;   /* attn_bwd_dq: its K tile in f32 */
    int run;    /* grid order: runs of this many tiles of one head (TILE_RUN) */
} attn_tiles;

/* How a portable kernel's walk runs: `per` of its `steps` a launch, in `launches`. */
typedef struct attn_split {
    int64_t steps, per, launches;
} attn_split;

/*
 * attention_tiles.c. The set that runs a call's forward (forward) or backward on this device:
 * the tensor-core sets where they fit the dtype, head dim and alignment, else the portable one.
 */
attn_arch llmcl__attn_arch(const llmcl_ctx *ctx, const attn_geom *g, bool forward);

/* Kernel k's parameters into p (the tuning database's over the heuristic defaults), its tiles
   (for the tiled kernels) and its work-group size. */
llmcl_status llmcl__attn_config(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                                llmcl__params *p, attn_tiles *tiles, size_t *wg);

/* attention_split.c. The split of portable kernel k's walk with tiles t within the device's loop
   budget: one launch where it fits, else launches of as many steps as fit; refused where not one
   step fits. */
llmcl_status llmcl__attn_split(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                               attn_tiles t, attn_split *out);

#endif
