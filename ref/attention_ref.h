/*
 * attention_ref.h: naive attention in double on the CPU, the reference for the attention kernels'
 * forward (O, LSE) and backward (dQ, dK, dV). It recomputes the full score rows itself, so the
 * backward is checked against exact math, not against the device's forward.
 *
 * Layouts are canonical: dense tensors are [B, H, T, D] row-major; with cu_q/cu_k set (varlen),
 * [total_T, H, D]. LSE is [B, Hq, Tq], or [Hq, total_Tq] in varlen mode. Masking follows
 * llmcl_attention_opts: causal aligned bottom-right, windows (-1 unbounded), softcap, scale.
 */
#ifndef LLMCL_ATTENTION_REF_H
#define LLMCL_ATTENTION_REF_H

#include <stdint.h>

typedef struct attn_ref_cfg {
    int B, Hq, Hkv, D;
    int Tq, Tk;             /* dense lengths; ignored in varlen mode */
    const int32_t *cu_q;    /* B + 1 offsets, or NULL (dense) */
    const int32_t *cu_k;
    int causal;
    int window_left, window_right; /* -1: unbounded */
    double softcap;                /* 0: off */
    double scale;                  /* 0: 1 / sqrt(D) */
} attn_ref_cfg;

/* Elements of Q (or O, dO, dQ) and of K (or V, dK, dV), and rows of LSE, for cfg. */
int64_t attn_ref_q_numel(const attn_ref_cfg *cfg);
int64_t attn_ref_k_numel(const attn_ref_cfg *cfg);
int64_t attn_ref_lse_numel(const attn_ref_cfg *cfg);

/* o and lse from q, k, v. A query that sees no key gets o = 0 and lse = -inf. */
void attn_ref_forward(const attn_ref_cfg *cfg, const double *q, const double *k, const double *v,
                      double *o, double *lse);

/* dq, dk, dv from q, k, v and dout (dk, dv summed over the query heads sharing a KV head). */
void attn_ref_backward(const attn_ref_cfg *cfg, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv);

#endif
