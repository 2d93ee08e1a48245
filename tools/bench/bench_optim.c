/*
 * bench_optim.c: llmcl-bench rows for optim.cl. A llama-like parameter set (per layer four [h, h]
 * attention matrices, three [h, f] MLP matrices and two norm weights) of about 1B parameters, 3.2M
 * with --small, as views of one flat buffer per operand, so each call is one launch. Rows:
 *   adamw f32:       f32 params, PyTorch's fused AdamW case: 28 bytes a parameter (param, m and v
 *                    read and written, grad read);
 *   adamw bf16+m:    bf16 params with f32 master weights, f32 grads: 30 bytes (master, m and v read
 *                    and written, grad read, param written);
 *   grad_norm f32:   the global norm of the f32 grads: 4 bytes (each read once).
 * Each is checked on a sample (a matrix and a norm weight) against ref/optim_ref.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "optim_ref.h"

enum { P, MS, G, M, V, N_OPS };
#define PER_LAYER 9
#define SAMPLE_MATRIX 0
#define SAMPLE_NORM 7

typedef struct optim_bench {
    int n;
    int64_t total;
    llmcl_tensor *flat[N_OPS];
    llmcl_tensor **views[N_OPS];
    llmcl_adamw_tensor *list;
    llmcl_adamw_opts opts;
    llmcl_tensor *norm;
} optim_bench;

static llmcl_status run_adamw(llmcl_ctx *ctx, void *arg)
{
    optim_bench *b = arg;
    return llmcl_adamw_step(ctx, b->list, b->n, &b->opts);
}

static llmcl_status run_norm(llmcl_ctx *ctx, void *arg)
{
    optim_bench *b = arg;
    return llmcl_grad_norm(ctx, (const llmcl_tensor *const *)b->views[G], b->n, 0, b->norm);
}

static void optim_free(optim_bench *b)
{
    for (int op = 0; op < N_OPS; ++op) {
        for (int i = 0; b->views[op] && i < b->n; ++i)
            llmcl_tensor_destroy(b->views[op][i]);
        free(b->views[op]);
        llmcl_tensor_destroy(b->flat[op]);
    }
    free(b->list);
    llmcl_tensor_destroy(b->norm);
}

/* Tensor i's shape: [h, h] x 4, [h, f] x 3, [h] x 2 per layer. */
static void layer_shape(int i, int64_t h, int64_t f, int *ndim, int64_t shape[2])
{
    const int k = i % PER_LAYER;
    *ndim = k < 7 ? 2 : 1;
    shape[0] = h;
    shape[1] = k < 4 ? h : f;
}

/* L layers; params pdt, with f32 masters when master; m and v zero, the rest random. */
static bool optim_init(bench_env *env, optim_bench *b, llmcl_dtype pdt, bool master)
{
    const int64_t h = env->small ? 256 : 2048, f = env->small ? 704 : 5632;
    const int layers = env->small ? 4 : 20;
    *b = (optim_bench){.n = layers * PER_LAYER};
    b->opts = (llmcl_adamw_opts){.lr = 1e-3f, .weight_decay = 0.1f, .step = 1, .seed = 1};
    for (int i = 0; i < b->n; ++i) {
        int nd;
        int64_t s[2];
        layer_shape(i, h, f, &nd, s);
        b->total += nd == 2 ? s[0] * s[1] : s[0];
    }
    const int64_t one = 1;
    llmcl_status st = llmcl_tensor_create(env->ctx, LLMCL_F32, 1, &one, &b->norm);
    b->list = calloc((size_t)b->n, sizeof *b->list);
    if (!b->list)
        st = LLMCL_ERROR_OUT_OF_HOST_MEMORY;
    for (int op = 0; op < N_OPS && st == LLMCL_OK; ++op) {
        if (op == MS && !master)
            continue;
        const llmcl_dtype dt = op == P ? pdt : LLMCL_F32;
        st = llmcl_tensor_create(env->ctx, dt, 1, &b->total, &b->flat[op]);
        b->views[op] = calloc((size_t)b->n, sizeof(llmcl_tensor *));
        if (!b->views[op])
            st = LLMCL_ERROR_OUT_OF_HOST_MEMORY;
        int64_t off = 0;
        for (int i = 0; i < b->n && st == LLMCL_OK; ++i) {
            int nd;
            int64_t s[2];
            layer_shape(i, h, f, &nd, s);
            st = llmcl_tensor_view(b->flat[op], nd, s, NULL, off, &b->views[op][i]);
            off += nd == 2 ? s[0] * s[1] : s[0];
        }
        if (st == LLMCL_OK)
            st = op == M || op == V ? llmcl_fill(env->ctx, b->flat[op], 0.0)
                                    : bench_upload_random(b->flat[op], 11 + (uint64_t)op);
    }
    if (st == LLMCL_OK && master)
        st = llmcl_cast(env->ctx, b->flat[MS], b->flat[P]);
    if (st != LLMCL_OK)
        return bench_fail(env, "optim: setup", st);
    for (int i = 0; i < b->n; ++i)
        b->list[i] = (llmcl_adamw_tensor){b->views[P][i], master ? b->views[MS][i] : NULL,
                                          b->views[G][i], b->views[M][i], b->views[V][i],
                                          i % PER_LAYER >= 7};
    return true;
}

/* A tensor (f32 or bf16) as doubles; NULL when the download fails. */
static double *fetch(const llmcl_tensor *t)
{
    const size_t n = (size_t)llmcl_tensor_numel(t), es = llmcl_dtype_size(llmcl_tensor_dtype(t));
    unsigned char *raw = malloc(n * es);
    double *x = malloc(n * sizeof *x);
    if (!raw || !x || llmcl_tensor_download(t, raw, n * es) != LLMCL_OK) {
        free(raw);
        free(x);
        return NULL;
    }
    for (size_t i = 0; i < n; ++i)
        x[i] = es == 4 ? ((const float *)raw)[i] : llmcl_bf16_to_f32(((const uint16_t *)raw)[i]);
    free(raw);
    return x;
}

static bool close_all(const double *ref, const double *got, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - ref[i]) <= 1e-5 + 1e-5 * fabs(ref[i])))
            return false;
    return true;
}

/* Tensor i before a step (master or param, and grad), and the reference after it. */
typedef struct sample {
    int i;
    size_t n;
    double *w, *g, *m, *v;
} sample;

static bool sample_before(optim_bench *b, int i, sample *s)
{
    const llmcl_adamw_tensor *t = &b->list[i];
    s->i = i;
    s->n = (size_t)llmcl_tensor_numel(t->param);
    s->w = fetch(t->master ? t->master : t->param);
    s->g = fetch(t->grad);
    s->m = calloc(s->n, sizeof(double)); /* m and v start at zero */
    s->v = calloc(s->n, sizeof(double));
    return s->w && s->g && s->m && s->v;
}

/* The device's tensor i after the step against the reference: m, v and weights to f32
 * tolerance, a bf16 param the rounding of its master. */
static bool sample_matches(optim_bench *b, sample *s)
{
    const llmcl_adamw_tensor *t = &b->list[s->i];
    const ref_adamw_hp hp = {b->opts.lr, 0.9f, 0.999f, 1e-8f, b->opts.weight_decay, 1};
    ref_adamw(s->w, s->m, s->v, s->g, s->n, &hp, !t->no_weight_decay);
    double *w = fetch(t->master ? t->master : t->param), *p = fetch(t->param);
    double *m = fetch(t->m), *v = fetch(t->v);
    bool ok = w && p && m && v && close_all(s->w, w, s->n) && close_all(s->m, m, s->n) &&
              close_all(s->v, v, s->n);
    for (size_t j = 0; ok && t->master && j < s->n; ++j)
        ok = p[j] == llmcl_bf16_to_f32(llmcl_f32_to_bf16((float)w[j]));
    free(w);
    free(p);
    free(m);
    free(v);
    return ok;
}

static void sample_free(sample *s)
{
    free(s->w);
    free(s->g);
    free(s->m);
    free(s->v);
}

/* One step from the initial state, checked on a matrix and a norm weight: 1 matched, 0 not. */
static int check_adamw(bench_env *env, optim_bench *b)
{
    sample s[2] = {{0}, {0}};
    bool ok = sample_before(b, SAMPLE_MATRIX, &s[0]) && sample_before(b, SAMPLE_NORM, &s[1]) &&
              run_adamw(env->ctx, b) == LLMCL_OK && sample_matches(b, &s[0]) &&
              sample_matches(b, &s[1]);
    sample_free(&s[0]);
    sample_free(&s[1]);
    return ok;
}

/* The norm of the two sampled grads against the reference: 1 matched, 0 not. */
static int check_norm(bench_env *env, optim_bench *b)
{
    const llmcl_tensor *grads[] = {b->views[G][SAMPLE_MATRIX], b->views[G][SAMPLE_NORM]};
    double ss = 0.0, got;
    for (int k = 0; k < 2; ++k) {
        double *g = fetch(grads[k]);
        if (!g)
            return 0;
        ss += ref_sum_squares(g, (size_t)llmcl_tensor_numel(grads[k]));
        free(g);
    }
    double *x;
    if (llmcl_grad_norm(env->ctx, grads, 2, 0, b->norm) != LLMCL_OK || !(x = fetch(b->norm)))
        return 0;
    got = x[0];
    free(x);
    return fabs(got - sqrt(ss)) <= 1e-5 * sqrt(ss);
}

static void bench_adamw(bench_env *env, llmcl_dtype pdt, bool master, const char *label,
                        double bytes_per_param, bool with_norm)
{
    optim_bench b;
    if (optim_init(env, &b, pdt, master)) {
        char shape[48];
        snprintf(shape, sizeof shape, "%lld params, %d tensors", (long long)b.total, b.n);
        const int check = check_adamw(env, &b);
        bench_add_timed(env, LLMCL_KEY_ADAMW, "", label, shape, bytes_per_param * (double)b.total,
                        run_adamw, NULL, &b, check);
        if (with_norm)
            bench_add_timed(env, LLMCL_KEY_GRAD_NORM, "", "f32", shape, 4.0 * (double)b.total,
                            run_norm, NULL, &b, check_norm(env, &b));
    }
    optim_free(&b);
}

void bench_optim(bench_env *env)
{
    bench_adamw(env, LLMCL_F32, false, "f32", 28.0, true);
    bench_adamw(env, LLMCL_BF16, true, "bf16+m", 30.0, false);
}
