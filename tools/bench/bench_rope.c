/*
 * bench_rope.c: llmcl-bench rows for rope.cl. RoPE forward and backward in place on q [B, Hq, T, D]
 * and k [B, Hk, T, D] in bf16 with f32 cos/sin tables [T, D/2], and forward with angles computed
 * from positions. The unfused baseline is Hugging Face's eager apply_rotary_pos_emb built from the
 * library's elementwise kernels: x * cos + rotate_half(x) * sin with tables broadcast to x's shape
 * (rotate_half as two strided copies, its sign folded into the sin table), then a copy back in
 * place. The fused kernel is checked against ref/rope_ref.c at a small size first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "rope_ref.h"

/* One of q or k with what the unfused baseline needs. */
typedef struct rope_side {
    llmcl_tensor *x, *x_lo, *x_hi; /* the tensor and views of its two halves of D */
    llmcl_tensor *t1, *t2, *t2_lo, *t2_hi;
    llmcl_tensor *cos_full, *sin_fwd, *sin_bwd; /* bf16 tables broadcast to x's shape */
} rope_side;

typedef struct rope_bench {
    rope_side s[2];
    llmcl_tensor *cos, *sin, *pos;
    llmcl_rope_options tables, positions;
    bool backward_baseline;
} rope_bench;

static llmcl_status fused_fwd(llmcl_ctx *ctx, void *arg)
{
    rope_bench *r = arg;
    return llmcl_rope_forward(ctx, r->s[0].x, r->s[1].x, &r->tables);
}

static llmcl_status fused_bwd(llmcl_ctx *ctx, void *arg)
{
    rope_bench *r = arg;
    return llmcl_rope_backward(ctx, r->s[0].x, r->s[1].x, &r->tables);
}

static llmcl_status fused_fwd_pos(llmcl_ctx *ctx, void *arg)
{
    rope_bench *r = arg;
    return llmcl_rope_forward(ctx, r->s[0].x, r->s[1].x, &r->positions);
}

static llmcl_status unfused(llmcl_ctx *ctx, void *arg)
{
    rope_bench *r = arg;
    llmcl_status st = LLMCL_OK;
    for (int i = 0; i < 2 && st == LLMCL_OK; ++i) {
        rope_side *s = &r->s[i];
        st = llmcl_copy(ctx, s->x, s->t1);
        if (st == LLMCL_OK)
            st = llmcl_mul(ctx, s->cos_full, s->t1);
        if (st == LLMCL_OK)
            st = llmcl_copy(ctx, s->x_hi, s->t2_lo);
        if (st == LLMCL_OK)
            st = llmcl_copy(ctx, s->x_lo, s->t2_hi);
        if (st == LLMCL_OK)
            st = llmcl_mul(ctx, r->backward_baseline ? s->sin_bwd : s->sin_fwd, s->t2);
        if (st == LLMCL_OK)
            st = llmcl_axpy(ctx, 1.0f, s->t2, s->t1);
        if (st == LLMCL_OK)
            st = llmcl_copy(ctx, s->t1, s->x);
    }
    return st;
}

static llmcl_status unfused_fwd(llmcl_ctx *ctx, void *arg)
{
    ((rope_bench *)arg)->backward_baseline = false;
    return unfused(ctx, arg);
}

static llmcl_status unfused_bwd(llmcl_ctx *ctx, void *arg)
{
    ((rope_bench *)arg)->backward_baseline = true;
    return unfused(ctx, arg);
}

static void rope_bench_free(rope_bench *r)
{
    for (int i = 0; i < 2; ++i) {
        rope_side *s = &r->s[i];
        llmcl_tensor *ts[] = {s->x_lo, s->x_hi, s->x,        s->t2_lo,   s->t2_hi,
                              s->t1,   s->t2,   s->cos_full, s->sin_fwd, s->sin_bwd};
        for (size_t j = 0; j < sizeof ts / sizeof ts[0]; ++j)
            llmcl_tensor_destroy(ts[j]);
    }
    llmcl_tensor_destroy(r->cos);
    llmcl_tensor_destroy(r->sin);
    llmcl_tensor_destroy(r->pos);
}

static bool upload_bf16(bench_env *env, llmcl_tensor *t, const double *v, size_t n)
{
    uint16_t *buf = malloc(n * sizeof(uint16_t));
    if (!buf)
        return bench_fail(env, "rope: host buffer", LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    for (size_t i = 0; i < n; ++i)
        buf[i] = llmcl_f32_to_bf16((float)v[i]);
    llmcl_status st = llmcl_tensor_upload(t, buf, n * sizeof(uint16_t));
    free(buf);
    return st == LLMCL_OK || bench_fail(env, "rope: upload", st);
}

static bool upload_f32(bench_env *env, llmcl_tensor *t, const double *v, size_t n)
{
    float *buf = malloc(n * sizeof(float));
    if (!buf)
        return bench_fail(env, "rope: host buffer", LLMCL_ERROR_OUT_OF_HOST_MEMORY);
    for (size_t i = 0; i < n; ++i)
        buf[i] = (float)v[i];
    llmcl_status st = llmcl_tensor_upload(t, buf, n * sizeof(float));
    free(buf);
    return st == LLMCL_OK || bench_fail(env, "rope: upload", st);
}

/*
 * Tensors for q (side 0) and k (side 1), [B, H, T, D] bf16 holding hq (qv) and kv values when
 * given, tables and positions; with baseline, the unfused baseline's tensors too.
 */
static bool rope_bench_init(bench_env *env, rope_bench *r, int64_t B, int64_t Hq, int64_t Hk,
                            int64_t T, int64_t D, const double *qv, const double *kv, bool baseline)
{
    llmcl_ctx *ctx = env->ctx;
    memset(r, 0, sizeof *r);
    const int64_t P = D / 2;
    double *pos = malloc((size_t)T * sizeof(double)), *inv = malloc((size_t)P * sizeof(double));
    double *c = malloc((size_t)(T * P) * sizeof(double)),
           *s = malloc((size_t)(T * P) * sizeof(double));
    bool ok = pos && inv && c && s;
    for (int64_t t = 0; ok && t < T; ++t)
        pos[t] = (double)t;
    if (ok) {
        rope_ref_inv_freq(inv, D, 10000.0, NULL);
        rope_ref_tables(c, s, pos, T, inv, P, 0);
    }
    const int64_t tshape[2] = {T, P};
    ok = ok && llmcl_tensor_create(ctx, LLMCL_F32, 2, tshape, &r->cos) == LLMCL_OK &&
         llmcl_tensor_create(ctx, LLMCL_F32, 2, tshape, &r->sin) == LLMCL_OK &&
         llmcl_tensor_create(ctx, LLMCL_I32, 1, &T, &r->pos) == LLMCL_OK &&
         upload_f32(env, r->cos, c, (size_t)(T * P)) && upload_f32(env, r->sin, s, (size_t)(T * P));
    int32_t *ip = ok ? malloc((size_t)T * sizeof(int32_t)) : NULL;
    for (int64_t t = 0; ip && t < T; ++t)
        ip[t] = (int32_t)t;
    ok = ok && ip && llmcl_tensor_upload(r->pos, ip, (size_t)T * sizeof(int32_t)) == LLMCL_OK;
    free(ip);
    r->tables.cos = r->cos;
    r->tables.sin = r->sin;
    r->positions.positions = r->pos;

    for (int i = 0; ok && i < 2; ++i) {
        rope_side *sd = &r->s[i];
        const int64_t H = i ? Hk : Hq, shape[4] = {B, H, T, D}, n = B * H * T * D;
        const int64_t half[4] = {B, H, T, P}, st[4] = {H * T * D, T * D, D, 1};
        ok = llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->x) == LLMCL_OK;
        const double *v = i ? kv : qv;
        double *rnd = NULL;
        if (ok && !v) { /* bounded pseudo-random values */
            rnd = malloc((size_t)n * sizeof(double));
            uint32_t h = 12345u + (uint32_t)i;
            for (int64_t j = 0; rnd && j < n; ++j) {
                h = h * 1664525u + 1013904223u;
                rnd[j] = (double)(h >> 8) / 16777216.0 - 0.5;
            }
            v = rnd;
        }
        ok = ok && v && upload_bf16(env, sd->x, v, (size_t)n);
        free(rnd);
        if (!ok || !baseline)
            continue;
        /* tables broadcast over (B, H): cos | cos, -sin | sin (forward), sin | -sin (backward) */
        double *cf = malloc((size_t)n * sizeof(double)), *sf = malloc((size_t)n * sizeof(double));
        double *sb = malloc((size_t)n * sizeof(double));
        ok = cf && sf && sb;
        for (int64_t j = 0; ok && j < n; ++j) {
            const int64_t d = j % D, t = (j / D) % T, idx = t * P + d % P;
            cf[j] = c[idx];
            sf[j] = d < P ? -s[idx] : s[idx];
            sb[j] = -sf[j];
        }
        ok = ok && llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->t1) == LLMCL_OK &&
             llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->t2) == LLMCL_OK &&
             llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->cos_full) == LLMCL_OK &&
             llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->sin_fwd) == LLMCL_OK &&
             llmcl_tensor_create(ctx, LLMCL_BF16, 4, shape, &sd->sin_bwd) == LLMCL_OK &&
             llmcl_tensor_view(sd->x, 4, half, st, 0, &sd->x_lo) == LLMCL_OK &&
             llmcl_tensor_view(sd->x, 4, half, st, P, &sd->x_hi) == LLMCL_OK &&
             llmcl_tensor_view(sd->t2, 4, half, st, 0, &sd->t2_lo) == LLMCL_OK &&
             llmcl_tensor_view(sd->t2, 4, half, st, P, &sd->t2_hi) == LLMCL_OK &&
             upload_bf16(env, sd->cos_full, cf, (size_t)n) &&
             upload_bf16(env, sd->sin_fwd, sf, (size_t)n) &&
             upload_bf16(env, sd->sin_bwd, sb, (size_t)n);
        free(cf), free(sf), free(sb);
    }
    free(pos), free(inv), free(c), free(s);
    return ok || bench_fail(env, "rope: setup", LLMCL_ERROR_OUT_OF_DEVICE_MEMORY);
}

/* The fused forward, backward and positions forward at a small size against the reference. */
static int rope_check(bench_env *env)
{
    const int64_t B = 2, Hq = 4, Hk = 2, T = 33, D = 128, P = D / 2;
    const size_t nq = (size_t)(B * Hq * T * D), nk = (size_t)(B * Hk * T * D);
    double *h = calloc(4 * (nq + nk) + 4 * (size_t)(T * P) + (size_t)(T + P), sizeof(double));
    if (!h)
        return 0;
    double *q = h, *k = q + nq, *rq = k + nk, *rk = rq + nq, *gq = rk + nk, *gk = gq + nq;
    double *c = gk + nk, *s = c + T * P, *inv = s + T * P, *pos = inv + P;
    uint32_t x = 777u;
    for (size_t i = 0; i < nq + nk; ++i) {
        x = x * 1664525u + 1013904223u;
        q[i] = llmcl_bf16_to_f32(llmcl_f32_to_bf16((float)((double)(x >> 8) / 8388608.0 - 1.0)));
    }
    for (int64_t t = 0; t < T; ++t)
        pos[t] = (double)t;
    rope_ref_inv_freq(inv, D, 10000.0, NULL);
    rope_ref_tables(c, s, pos, T, inv, P, 0);
    for (int64_t i = 0; i < T * P; ++i) /* the device's tables are f32 */
        c[i] = (float)c[i], s[i] = (float)s[i];

    rope_bench r;
    int ok = 0;
    if (rope_bench_init(env, &r, B, Hq, Hk, T, D, q, k, false)) {
        bench_op ops[3] = {fused_fwd, fused_bwd, fused_fwd_pos};
        const int inverse[3] = {0, 1, 0};
        ok = 1;
        memcpy(rq, q, (nq + nk) * sizeof(double));
        for (int o = 0; o < 3 && ok; ++o) {
            /* the kernels run one after another on the same tensors, so does the reference */
            rope_ref_apply(rq, B, Hq, T, D, D, 0, c, s, 0, inverse[o]);
            rope_ref_apply(rk, B, Hk, T, D, D, 0, c, s, 0, inverse[o]);
            uint16_t *buf = malloc((nq + nk) * sizeof(uint16_t));
            ok = buf && ops[o](env->ctx, &r) == LLMCL_OK &&
                 llmcl_tensor_download(r.s[0].x, buf, nq * sizeof(uint16_t)) == LLMCL_OK &&
                 llmcl_tensor_download(r.s[1].x, buf + nq, nk * sizeof(uint16_t)) == LLMCL_OK;
            for (size_t i = 0; ok && i < nq + nk; ++i) {
                gq[i] = llmcl_bf16_to_f32(buf[i]);
                if (!(fabs(gq[i] - rq[i]) <= 1e-2 + 1.6e-2 * fabs(rq[i])))
                    ok = 0;
                rq[i] = gq[i]; /* continue from the device's rounded values */
            }
            free(buf);
        }
        rope_bench_free(&r);
    }
    free(h);
    return ok;
}

void bench_rope(bench_env *env)
{
    const int64_t B = env->small ? 1 : 4, Hq = env->small ? 8 : 32, Hk = env->small ? 2 : 8;
    const int64_t T = env->small ? 256 : 2048, D = 128;
    const int check = rope_check(env);
    rope_bench r;
    if (!rope_bench_init(env, &r, B, Hq, Hk, T, D, NULL, NULL, true)) {
        rope_bench_free(&r);
        return;
    }
    char shape[48];
    snprintf(shape, sizeof shape, "q%lldx%lldx%lldx%lld k%lld", (long long)B, (long long)Hq,
             (long long)T, (long long)D, (long long)Hk);
    /* bytes: q and k read and written in place, plus the angle source read once */
    const double qk = 2.0 * (double)(B * (Hq + Hk) * T * D) * 2.0;
    const double tables = 2.0 * (double)(T * D / 2) * 4.0, positions = (double)T * 4.0;
    bench_add_timed(env, LLMCL_KEY_ROPE, "fwd", "bf16", shape, qk + tables, fused_fwd, unfused_fwd,
                    &r, check);
    bench_add_timed(env, LLMCL_KEY_ROPE, "bwd", "bf16", shape, qk + tables, fused_bwd, unfused_bwd,
                    &r, check);
    bench_add_timed(env, "rope(positions)", "fwd", "bf16", shape, qk + positions, fused_fwd_pos,
                    unfused_fwd, &r, check);
    rope_bench_free(&r);
}
