/*
 * llmcl_kernels.h: the names of llmcl's kernels in its tuning API, spelled once (llmcl.h includes
 * this file). A kernel family is one file of the library's OpenCL C kernels, src/cl/<family>.cl:
 * the file LLMCL_KERNEL_DIR is read for, and what llmcl_build_log() and llmcl-tune --kernel name.
 * A kernel key is a kernel's (or a launch form's) entry in the tuning database: what
 * llmcl_tune_params_get() and llmcl_tune_override() take and what the "kernel" of a tuning file
 * says (docs/TUNING.md). Each family's .cl header lists its keys' tunables and size keys.
 *
 * The library's launchers and llmcl-tune's kernel table use these macros, and tests/test_tune.c
 * checks the built-in tuning files' keys against LLMCL_KERNEL_KEYS, which lists every key with
 * its family as X(family, key).
 */
#ifndef LLMCL_KERNELS_H
#define LLMCL_KERNELS_H

#define LLMCL_FAMILY_ELEMENTWISE "elementwise"
#define LLMCL_KEY_FILL "fill"
#define LLMCL_KEY_COPY "copy"
#define LLMCL_KEY_CAST "cast" /* keyed by the destination's dtype */
#define LLMCL_KEY_AXPY "axpy"
#define LLMCL_KEY_MUL "mul"
#define LLMCL_KEY_SUM_ROWS "sum_rows"

#define LLMCL_FAMILY_NORM "norm"
#define LLMCL_KEY_RMSNORM_FWD "rmsnorm_fwd"
#define LLMCL_KEY_RESIDUAL_RMSNORM_FWD "residual_rmsnorm_fwd"
#define LLMCL_KEY_LAYERNORM_FWD "layernorm_fwd"
#define LLMCL_KEY_RMSNORM_BWD "rmsnorm_bwd"
#define LLMCL_KEY_RESIDUAL_RMSNORM_BWD "residual_rmsnorm_bwd"
#define LLMCL_KEY_LAYERNORM_BWD "layernorm_bwd"
#define LLMCL_KEY_NORM_DW_REDUCE "norm_dw_reduce"

#define LLMCL_FAMILY_ROPE "rope"
#define LLMCL_KEY_ROPE "rope"         /* with cos and sin tables */
#define LLMCL_KEY_ROPE_POS "rope_pos" /* from positions */

#define LLMCL_FAMILY_GLU "glu"
#define LLMCL_KEY_GLU_FWD "glu_fwd"
#define LLMCL_KEY_GLU_BWD "glu_bwd"
#define LLMCL_KEY_ACT_FWD "act_fwd" /* the activation alone (llmcl_activation_forward) */
#define LLMCL_KEY_ACT_BWD "act_bwd"

#define LLMCL_FAMILY_ATTENTION "attention"
#define LLMCL_KEY_ATTENTION_FWD "attention_fwd"
#define LLMCL_KEY_ATTENTION_BWD_PRE "attention_bwd_pre"
#define LLMCL_KEY_ATTENTION_BWD_DQ "attention_bwd_dq"
#define LLMCL_KEY_ATTENTION_BWD_DKDV "attention_bwd_dkdv"
#define LLMCL_KEY_ATTENTION_FWD_MMA "attention_fwd_mma"
#define LLMCL_KEY_ATTENTION_BWD_DQ_MMA "attention_bwd_dq_mma"
#define LLMCL_KEY_ATTENTION_BWD_DKDV_MMA "attention_bwd_dkdv_mma"
#define LLMCL_KEY_ATTENTION_FWD_WGMMA "attention_fwd_wgmma"
#define LLMCL_KEY_ATTENTION_BWD_DQ_WGMMA "attention_bwd_dq_wgmma"
#define LLMCL_KEY_ATTENTION_BWD_DKDV_WGMMA "attention_bwd_dkdv_wgmma"
#define LLMCL_KEY_ATTENTION_BWD_DQ_DS_WGMMA "attention_bwd_dq_ds_wgmma"

#define LLMCL_FAMILY_CROSS_ENTROPY "cross_entropy"
#define LLMCL_KEY_CE_ROWS "ce_rows"
#define LLMCL_KEY_CE_SPLIT "ce_split" /* host side: work-groups a row */
#define LLMCL_KEY_CCE_FWD "cce_fwd"
#define LLMCL_KEY_CCE_BWD_DH "cce_bwd_dh"
#define LLMCL_KEY_CCE_BWD_DW "cce_bwd_dw"
#define LLMCL_KEY_CCE_SPLIT "cce_split" /* host side: vocabulary splits of cce_fwd */

#define LLMCL_FAMILY_DISTILL "distill"
#define LLMCL_KEY_DISTILL_ROWS "distill_rows"

#define LLMCL_FAMILY_PREFERENCE "preference"

#define LLMCL_FAMILY_MATMUL "matmul"
#define LLMCL_KEY_MM_WGMMA "mm_wgmma"
#define LLMCL_KEY_MM_WGMMA_AT "mm_wgmma_at" /* wgmma with a transposed */
#define LLMCL_KEY_MM_MMA "mm_mma"
#define LLMCL_KEY_MM_MMA_AT "mm_mma_at" /* mma.sync with a transposed */
#define LLMCL_KEY_MM_TILED "mm_tiled"

#define LLMCL_FAMILY_EMBEDDING "embedding"
#define LLMCL_KEY_EMB_CHECK "emb_check"
#define LLMCL_KEY_EMB_FWD "emb_fwd"
#define LLMCL_KEY_EMB_BWD "emb_bwd"

#define LLMCL_FAMILY_OPTIM "optim"
#define LLMCL_KEY_ADAMW "adamw"
#define LLMCL_KEY_GRAD_NORM "grad_norm"

/* The runtime's measurement kernels (llmcl_device_info's ceilings): no tunables in the database. */
#define LLMCL_FAMILY_CEILINGS "ceilings"

#define LLMCL_KERNEL_KEYS(X)                                                                      \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_FILL)                                                   \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_COPY)                                                   \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_CAST)                                                   \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_AXPY)                                                   \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_MUL)                                                    \
    X(LLMCL_FAMILY_ELEMENTWISE, LLMCL_KEY_SUM_ROWS)                                               \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_RMSNORM_FWD)                                                   \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_RESIDUAL_RMSNORM_FWD)                                          \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_LAYERNORM_FWD)                                                 \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_RMSNORM_BWD)                                                   \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_RESIDUAL_RMSNORM_BWD)                                          \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_LAYERNORM_BWD)                                                 \
    X(LLMCL_FAMILY_NORM, LLMCL_KEY_NORM_DW_REDUCE)                                                \
    X(LLMCL_FAMILY_ROPE, LLMCL_KEY_ROPE)                                                          \
    X(LLMCL_FAMILY_ROPE, LLMCL_KEY_ROPE_POS)                                                      \
    X(LLMCL_FAMILY_GLU, LLMCL_KEY_GLU_FWD)                                                        \
    X(LLMCL_FAMILY_GLU, LLMCL_KEY_GLU_BWD)                                                        \
    X(LLMCL_FAMILY_GLU, LLMCL_KEY_ACT_FWD)                                                        \
    X(LLMCL_FAMILY_GLU, LLMCL_KEY_ACT_BWD)                                                        \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_FWD)                                            \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_PRE)                                        \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DQ)                                         \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DKDV)                                       \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_FWD_MMA)                                        \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DQ_MMA)                                     \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DKDV_MMA)                                   \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_FWD_WGMMA)                                      \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DQ_WGMMA)                                   \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DKDV_WGMMA)                                 \
    X(LLMCL_FAMILY_ATTENTION, LLMCL_KEY_ATTENTION_BWD_DQ_DS_WGMMA)                                \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CE_ROWS)                                              \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CE_SPLIT)                                             \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CCE_FWD)                                              \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CCE_BWD_DH)                                           \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CCE_BWD_DW)                                           \
    X(LLMCL_FAMILY_CROSS_ENTROPY, LLMCL_KEY_CCE_SPLIT)                                            \
    X(LLMCL_FAMILY_DISTILL, LLMCL_KEY_DISTILL_ROWS)                                               \
    X(LLMCL_FAMILY_MATMUL, LLMCL_KEY_MM_WGMMA)                                                    \
    X(LLMCL_FAMILY_MATMUL, LLMCL_KEY_MM_WGMMA_AT)                                                 \
    X(LLMCL_FAMILY_MATMUL, LLMCL_KEY_MM_MMA)                                                      \
    X(LLMCL_FAMILY_MATMUL, LLMCL_KEY_MM_MMA_AT)                                                   \
    X(LLMCL_FAMILY_MATMUL, LLMCL_KEY_MM_TILED)                                                    \
    X(LLMCL_FAMILY_EMBEDDING, LLMCL_KEY_EMB_CHECK)                                                \
    X(LLMCL_FAMILY_EMBEDDING, LLMCL_KEY_EMB_FWD)                                                  \
    X(LLMCL_FAMILY_EMBEDDING, LLMCL_KEY_EMB_BWD)                                                  \
    X(LLMCL_FAMILY_OPTIM, LLMCL_KEY_ADAMW)                                                        \
    X(LLMCL_FAMILY_OPTIM, LLMCL_KEY_GRAD_NORM)

#endif /* LLMCL_KERNELS_H */
