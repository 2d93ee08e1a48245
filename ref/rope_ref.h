/*
 * rope_ref.h: rotary position embedding in double, the CPU reference of rope.cl (shared by
 * tests/test_rope.c and llmcl-bench).
 */
#ifndef LLMCL_ROPE_REF_H
#define LLMCL_ROPE_REF_H

#include <stdint.h>

/* Llama 3 frequency scaling; factor 0 turns it off. */
typedef struct rope_ref_llama3 {
    double factor, low_freq_factor, high_freq_factor, original_max_position;
} rope_ref_llama3;

/* inv_freq[i] = 1 / theta^(2i / rotary_dim) for i < rotary_dim / 2, Llama 3-scaled if l3 is on. */
void rope_ref_inv_freq(double *inv, int64_t rotary_dim, double theta, const rope_ref_llama3 *l3);

/*
 * cos/sin tables [n, pairs] of the angles pos[j] * inv[i]. With f32_angle, inv and the product are
 * rounded to float first, as the kernels (and Hugging Face) compute the angle; cos and sin are then
 * exact of that angle.
 */
void rope_ref_tables(double *cos_t, double *sin_t, const double *pos, int64_t n, const double *inv,
                     int64_t pairs, int f32_angle);

/*
 * Rotates x, contiguous [B, H, T, D], in place over its first rotary_dim elements. Tables are
 * [T, rotary_dim/2] (batch_tables 0) or [B, T, rotary_dim/2]. interleaved: pairs (2i, 2i+1), else
 * (i, i + rotary_dim/2). inverse: the backward rotation.
 */
void rope_ref_apply(double *x, int64_t B, int64_t H, int64_t T, int64_t D, int64_t rotary_dim,
                    int interleaved, const double *cos_t, const double *sin_t, int batch_tables,
                    int inverse);

#endif
