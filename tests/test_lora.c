/*
 * test_lora.c: llmcl-train's LoRA and Hugging Face interop (tools/llmcl-train/model.c, hf.c). One
 * adapted projection's output and gradients against a double reference of
 * y = x W^T + s (x A^T) B^T;
 * a whole model with B = 0 giving the base model's loss and logits bit for bit, and after one AdamW
 * step a new loss with the base weights bit-identical; LoRA gradients the same bits with activation
 * checkpointing (full, ops, every 2nd layer) and offload; export then --init-from giving the same bits (f32) or the bf16
 * rounding, and the config read back; a merged export equal to W + s B A; every adapter's
 * gradients against the merged model's weight gradients (dB = s dW' A^T, dA = s B^T dW').
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "hf.h"
#include "model.h"
#include "optimizer.h"

static const char *fixture_path(const char *file)
{
    static char path[1024];
    const char *dir = getenv("LLMCL_TEST_DATA_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    return path;
}

/* The untied fixture's shape (test_train's), with LoRA on targets. */
static model_config small_config(llmcl_dtype dt, int rank, unsigned targets)
{
    return (model_config){.vocab = 64, .dim = 64, .layers = 2, .heads = 2, .kv_heads = 1, .ffn = 96,
                          .max_seq = 16, .norm_eps = 1e-5f, .rope_theta = 500000,
                          .rope_llama3_factor = 32, .dtype = dt, .lora_rank = rank,
                          .lora_alpha = 2.0f * rank, .lora_targets = targets,
                          .lora_dtype = LLMCL_F32};
}

/* Base weights from the fixture, and the fixture's batch. */
static model *fixture_model(const model_config *cfg, llmcl_safetensors *st, int recompute,
                            bool offload)
{
    model *m = NULL;
    TH_OK(model_create(th_ctx(), cfg, 7, &m));
    TH_OK(model_alloc_acts(m, 2, 16, recompute, offload));
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].kind < P_LORA_A)
            TH_OK(llmcl_safetensors_load(m->ctx, st, m->params[i].name,
                                         model_param_value(&m->params[i])));
    TH_OK(model_sync_compute(m));
    return m;
}

static const int32_t *fixture_ints(llmcl_safetensors *st, const char *name)
{
    llmcl_safetensors_info info;
    TH_OK(llmcl_safetensors_find(st, name, &info));
    return info.data;
}

/* Random values into a parameter (its master, then its compute copy; a 16-bit base its copy). */
static void randomize(model *m, const model_param *p, uint64_t seed, double scale)
{
    th_rng r = th_rng_new(seed);
    double *x = th_alloc((size_t)p->numel * sizeof *x);
    th_fill_normal(&r, x, (size_t)p->numel, scale);
    th_upload(model_param_value(p), x);
    free(x);
    TH_OK(model_sync_compute(m));
}

static double *download(const llmcl_tensor *t, int64_t n)
{
    double *x = th_alloc((size_t)n * sizeof *x);
    th_download(t, x);
    return x;
}

/* c[M, N] = sum_k a[i, k] b[k, j] with a and b given by element strides. */
static void ref_mm(const double *a, int64_t as0, int64_t as1, const double *b, int64_t bs0,
                   int64_t bs1, double *c, int64_t M, int64_t N, int64_t K, double alpha)
{
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
                s += a[i * as0 + k * as1] * b[k * bs0 + j * bs1];
            c[i * N + j] = alpha * s;
        }
}

static double max_abs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; ++i)
        m = fmax(m, fabs(x[i]));
    return m;
}

static void check(const char *what, const double *ref, const double *got, size_t n, llmcl_dtype dt)
{
    const double r = dt == LLMCL_F32 ? 1e-5 : 2e-2;
    TH_ASSERT_CLOSE(what, ref, got, n, (th_tol){r * max_abs(ref, n) + 1e-7, r});
}

typedef struct proj_dims {
    int64_t n, r, in, out; /* tokens, the adapters' rank, the projection's widths */
} proj_dims;

typedef struct proj_ref {
    double *y, *dx, *dA, *dB;
} proj_ref;

/* y = x W^T + s (x A^T) B^T and its gradients for dy, in double. */
static void projection_ref(const proj_dims *g, const double *x, const double *dy, const double *W,
                           const double *A, const double *B, double s, proj_ref *o)
{
    const int64_t N = g->n, R = g->r, in = g->in, out = g->out;
    const size_t d = sizeof(double);
    double *u = th_alloc((size_t)(N * R) * d), *du = th_alloc((size_t)(N * R) * d),
           *t = th_alloc((size_t)(N * (out > in ? out : in)) * d);
    o->y = th_alloc((size_t)(N * out) * d), o->dx = th_alloc((size_t)(N * in) * d);
    o->dA = th_alloc((size_t)(R * in) * d), o->dB = th_alloc((size_t)(out * R) * d);
    ref_mm(x, in, 1, A, 1, in, u, N, R, in, 1);         /* u = x A^T */
    ref_mm(x, in, 1, W, 1, in, o->y, N, out, in, 1);    /* x W^T */
    ref_mm(u, R, 1, B, 1, R, t, N, out, R, s);          /* s u B^T */
    for (int64_t i = 0; i < N * out; ++i)
        o->y[i] += t[i];
    ref_mm(dy, 1, out, u, R, 1, o->dB, out, R, N, s);   /* dB = s dy^T u */
    ref_mm(dy, out, 1, B, R, 1, du, N, R, out, s);      /* du = s dy B */
    ref_mm(du, 1, R, x, in, 1, o->dA, R, in, N, 1);     /* dA = du^T x */
    ref_mm(dy, out, 1, W, in, 1, o->dx, N, in, out, 1); /* dy W */
    ref_mm(du, R, 1, A, in, 1, t, N, in, R, 1);         /* du A */
    for (int64_t i = 0; i < N * in; ++i)
        o->dx[i] += t[i];
    free(u), free(du), free(t);
}

/* Only p's adapters have gradients: every other trainable element stays zero. */
static void expect_other_grads_zero(model *m, const model_param *p)
{
    double *rest = download(m->trainable.grad, m->trainable.total);
    double other = 0;
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *q = &m->params[i];
        for (int64_t j = 0; q->trainable && q != p->lora_a && q != p->lora_b && j < q->numel; ++j)
            other += fabs(rest[q->offset + j]);
    }
    assert_true(other == 0);
    free(rest);
}

/* One adapted projection (layer 0's o_proj: in = 64, out = 64) driven by a known dy. */
static void check_projection(llmcl_dtype dt)
{
    printf("one projection, %s\n", llmcl_dtype_name(dt));
    const model_config cfg = small_config(dt, 4, (1u << P_WO) | (1u << P_WUP));
    model *m = NULL;
    TH_OK(model_create(th_ctx(), &cfg, 3, &m));
    const int64_t N = 24, R = 4;
    model_param *p = model_find(m, "model.layers.0.mlp.up_proj.weight");
    assert_non_null(p);
    assert_non_null(p->lora_a);
    assert_false(p->trainable);
    assert_null(p->grad);
    const int64_t out = p->shape[0], in = p->shape[1];
    randomize(m, p->lora_b, 11, 0.3); /* B = 0 would leave dA zero */
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));

    th_rng r = th_rng_new(5);
    const int64_t xs[2] = {N, in}, ys[2] = {N, out}, us[2] = {N, R};
    double *x = th_alloc((size_t)(N * in) * sizeof *x);
    double *dy = th_alloc((size_t)(N * out) * sizeof *dy);
    th_fill_normal(&r, x, (size_t)(N * in), 1.0);
    th_fill_normal(&r, dy, (size_t)(N * out), 1.0);
    th_round_all(dt, x, (size_t)(N * in));
    th_round_all(dt, dy, (size_t)(N * out));
    llmcl_tensor *tx = th_tensor_from(dt, 2, xs, x), *tdy = th_tensor_from(dt, 2, ys, dy);
    llmcl_tensor *ty = th_tensor(dt, 2, ys), *tdx = th_tensor(dt, 2, xs);
    llmcl_tensor *tu = th_tensor(dt, 2, us), *tdu = th_tensor(dt, 2, us);
    th_poison(ty), th_poison(tdx), th_poison(tu), th_poison(tdu);
    TH_OK(model_proj_forward(m, p, tx, 0, ty, tu));
    TH_OK(model_proj_backward(m, p, tdy, tx, tu, 0, tdx, tdu));

    /* the reference from the weights as the products saw them (the compute copies) */
    double *W = download(p->w, out * in), *A = download(p->lora_a->w, R * in),
           *B = download(p->lora_b->w, out * R);
    const proj_dims dims = {N, R, in, out};
    proj_ref ref;
    projection_ref(&dims, x, dy, W, A, B, m->lora_scale, &ref);
    double *gy = download(ty, N * out), *gdx = download(tdx, N * in),
           *gdA = download(p->lora_a->grad, R * in), *gdB = download(p->lora_b->grad, out * R);
    check("y", ref.y, gy, (size_t)(N * out), dt);
    check("dx", ref.dx, gdx, (size_t)(N * in), dt);
    check("dA", ref.dA, gdA, (size_t)(R * in), dt);
    check("dB", ref.dB, gdB, (size_t)(out * R), dt);
    expect_other_grads_zero(m, p);

    llmcl_tensor *ts[] = {tx, tdy, ty, tdx, tu, tdu};
    for (int i = 0; i < 6; ++i)
        llmcl_tensor_destroy(ts[i]);
    double *frees[] = {x, dy, W, A, B, ref.y, ref.dx, ref.dA, ref.dB, gy, gdx, gdA, gdB};
    for (int i = 0; i < 13; ++i)
        free(frees[i]);
    model_destroy(m);
}

static void test_projection_f32(void **state)
{
    (void)state;
    check_projection(LLMCL_F32);
}

static void test_projection_bf16(void **state)
{
    (void)state;
    check_projection(LLMCL_BF16);
}

/* Loss and logits of the fixture's batch. */
static void forward(model *m, llmcl_safetensors *st, float *loss, float *logits)
{
    const int32_t *ids = fixture_ints(st, "input_ids"), *targets = fixture_ints(st, "targets");
    TH_OK(model_forward(m, ids, targets, 2, 16, true));
    TH_OK(llmcl_tensor_download(m->loss, loss, sizeof *loss));
    const int64_t shape[2] = {32, m->cfg.vocab};
    llmcl_tensor *t = th_tensor(LLMCL_F32, 2, shape);
    TH_OK(model_logits(m, 0, 32, t));
    TH_OK(llmcl_tensor_download(t, logits, (size_t)(32 * m->cfg.vocab) * sizeof *logits));
    llmcl_tensor_destroy(t);
}

/* The frozen parameters' bytes, each in its own tensor (16-bit matrices, f32 vectors, or f32
   masters and their compute copy), one after another. */
static void *frozen_bytes(const model *m, size_t *bytes)
{
    const param_set *s = &m->frozen;
    const size_t n = (size_t)s->total;
    size_t at = 0;
    unsigned char *h = th_alloc(n * 6 + 1);
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        const llmcl_tensor *ts[2] = {model_param_value(p), p->master ? p->w16 : NULL};
        for (int k = 0; k < 2 && !p->trainable; ++k) {
            if (!ts[k])
                continue;
            const size_t b = (size_t)p->numel * llmcl_dtype_size(llmcl_tensor_dtype(ts[k]));
            TH_OK(llmcl_tensor_download(ts[k], h + at, b));
            at += b;
        }
    }
    *bytes = at;
    return h;
}

static void check_zero_b(llmcl_dtype dt)
{
    printf("B = 0 is the base model, %s\n", llmcl_dtype_name(dt));
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(fixture_path("train_fixture_untied.safetensors"), &st));
    const model_config base_cfg = small_config(dt, 0, 0), lora_cfg = small_config(dt, 8, LORA_ALL_TARGETS);
    model *base = fixture_model(&base_cfg, st, RECOMPUTE_NONE, false);
    model *lora = fixture_model(&lora_cfg, st, RECOMPUTE_NONE, false);
    const size_t nl = (size_t)32 * 64;
    float lb, ll, *gb = th_alloc(nl * sizeof *gb), *gl = th_alloc(nl * sizeof *gl);
    forward(base, st, &lb, gb);
    forward(lora, st, &ll, gl);
    printf("loss %.7f base, %.7f with zero adapters\n", lb, ll);
    assert_memory_equal(&lb, &ll, sizeof lb);
    assert_memory_equal(gb, gl, nl * sizeof *gb);

    /* one step: B moves, the loss with it; frozen weights keep every bit */
    size_t bytes;
    void *before = frozen_bytes(lora, &bytes);
    optimizer opt;
    const adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .clip = 1.0f};
    TH_OK(optimizer_create(lora, &hp, &opt));
    assert_int_equal(opt.count, 2 * 7 * 2);
    TH_OK(llmcl_fill(lora->ctx, lora->trainable.grad, 0.0));
    forward(lora, st, &ll, gl);
    TH_OK(model_backward(lora, 2, 16));
    optimizer_prepare(&opt, 1e-2f, 1, 1, false);
    TH_OK(optimizer_step(&opt));
    float after_loss;
    forward(lora, st, &after_loss, gl);
    printf("after one step %.7f\n", after_loss);
    assert_true(after_loss < ll - 1e-4);
    size_t bytes2;
    void *after = frozen_bytes(lora, &bytes2);
    assert_int_equal(bytes, bytes2);
    assert_memory_equal(before, after, bytes);

    free(before), free(after), free(gb), free(gl);
    optimizer_destroy(&opt);
    model_destroy(base);
    model_destroy(lora);
    llmcl_safetensors_close(st);
}

static void test_zero_b_f32(void **state)
{
    (void)state;
    check_zero_b(LLMCL_F32);
}

static void test_zero_b_bf16(void **state)
{
    (void)state;
    check_zero_b(LLMCL_BF16);
}

/* Adapter gradients of the fixture's batch (B random so that every gradient is nonzero). */
static double *lora_gradients(llmcl_safetensors *st, int recompute, bool offload)
{
    const model_config cfg = small_config(LLMCL_BF16, 8, LORA_ALL_TARGETS);
    model *m = fixture_model(&cfg, st, recompute, offload);
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].kind == P_LORA_B)
            randomize(m, &m->params[i], 100 + i, 0.05);
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
    const int32_t *ids = fixture_ints(st, "input_ids"), *targets = fixture_ints(st, "targets");
    TH_OK(model_forward(m, ids, targets, 2, 16, true));
    TH_OK(model_backward(m, 2, 16));
    double *g = download(m->trainable.grad, m->trainable.total);
    model_destroy(m);
    return g;
}

static void test_recompute_same_bits(void **state)
{
    (void)state;
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(fixture_path("train_fixture_untied.safetensors"), &st));
    const model_config cfg = small_config(LLMCL_BF16, 8, LORA_ALL_TARGETS);
    model *m = NULL;
    TH_OK(model_create(th_ctx(), &cfg, 1, &m));
    const size_t n = (size_t)m->trainable.total;
    model_destroy(m);
    double *g = lora_gradients(st, RECOMPUTE_NONE, false);
    assert_true(max_abs(g, n) > 0);
    /* the ops form keeps the adapters' x A^T with the products' outputs; --recompute=2
       recomputes the second of the 2 layers whole */
    static const int forms[] = {RECOMPUTE_FULL, RECOMPUTE_OPS, 2};
    for (size_t r = 0; r < sizeof forms / sizeof forms[0]; ++r)
        for (int off = 0; off < 2; ++off) {
            double *gr = lora_gradients(st, forms[r], off);
            assert_memory_equal(g, gr, n * sizeof *g);
            free(gr);
        }
    free(g);
    llmcl_safetensors_close(st);
}

/*
 * The adapters' gradients of the whole model with adapted_kinds against the merged model's: with
 * W' = W + s B A the same function, dB = s dW' A^T and dA = s B^T dW', where dW' is the gradient
 * of the merged model (no adapters, base trained) at W'. f32.
 */
static void check_gradients_of_merged(unsigned adapted_kinds)
{
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(fixture_path("train_fixture_untied.safetensors"), &st));
    const model_config lora_cfg = small_config(LLMCL_F32, 8, adapted_kinds),
                       merged_cfg = small_config(LLMCL_F32, 0, 0);
    model *lora = fixture_model(&lora_cfg, st, RECOMPUTE_NONE, false);
    model *merged = fixture_model(&merged_cfg, st, RECOMPUTE_NONE, false);
    const double s = lora->lora_scale;
    for (int i = 0; i < lora->n_params; ++i) {
        model_param *p = &lora->params[i];
        if (p->kind == P_LORA_B)
            randomize(lora, p, 200 + i, 0.05);
    }
    for (int i = 0; i < lora->n_params; ++i) {
        const model_param *p = &lora->params[i];
        if (!p->lora_a)
            continue;
        const int64_t out = p->shape[0], in = p->shape[1], R = lora_cfg.lora_rank;
        double *W = download(model_param_value(p), out * in), *A = download(p->lora_a->w, R * in),
               *B = download(p->lora_b->w, out * R);
        double *BA = th_alloc((size_t)(out * in) * sizeof *BA);
        ref_mm(B, R, 1, A, in, 1, BA, out, in, R, s);
        for (int64_t j = 0; j < out * in; ++j)
            W[j] += BA[j];
        th_upload(model_find(merged, p->name)->master, W);
        free(W), free(A), free(B), free(BA);
    }
    TH_OK(model_sync_compute(merged));
    const int32_t *ids = fixture_ints(st, "input_ids"), *targets = fixture_ints(st, "targets");
    model *both[2] = {lora, merged};
    for (int k = 0; k < 2; ++k) {
        TH_OK(llmcl_fill(both[k]->ctx, both[k]->trainable.grad, 0.0));
        TH_OK(model_forward(both[k], ids, targets, 2, 16, true));
        TH_OK(model_backward(both[k], 2, 16));
    }
    int adapted = 0;
    for (int i = 0; i < lora->n_params; ++i) {
        const model_param *p = &lora->params[i];
        if (!p->lora_a)
            continue;
        const int64_t out = p->shape[0], in = p->shape[1], R = lora_cfg.lora_rank;
        double *dW = download(model_find(merged, p->name)->grad, out * in),
               *A = download(p->lora_a->w, R * in), *B = download(p->lora_b->w, out * R),
               *dA = th_alloc((size_t)(R * in) * sizeof *dA),
               *dB = th_alloc((size_t)(out * R) * sizeof *dB),
               *gA = download(p->lora_a->grad, R * in), *gB = download(p->lora_b->grad, out * R);
        ref_mm(dW, in, 1, A, 1, in, dB, out, R, in, s);  /* s dW' A^T */
        ref_mm(B, 1, R, dW, in, 1, dA, R, in, out, s);   /* s B^T dW' */
        char what[128];
        snprintf(what, sizeof what, "dB of %s", p->name);
        TH_ASSERT_CLOSE(what, dB, gB, (size_t)(out * R),
                        ((th_tol){1e-4 * max_abs(dB, out * R), 1e-3}));
        snprintf(what, sizeof what, "dA of %s", p->name);
        TH_ASSERT_CLOSE(what, dA, gA, (size_t)(R * in),
                        ((th_tol){1e-4 * max_abs(dA, R * in), 1e-3}));
        assert_true(max_abs(gA, R * in) > 0 && max_abs(gB, out * R) > 0);
        free(dW), free(A), free(B), free(dA), free(dB), free(gA), free(gB);
        ++adapted;
    }
    assert_int_equal(adapted, __builtin_popcount(adapted_kinds) * 2);
    model_destroy(lora);
    model_destroy(merged);
    llmcl_safetensors_close(st);
}

/* Every projection adapted: q, k and v, gate and up stacked around their adapters, and the
   adapters' own products stacked (one x A^T for a group, one dA and one dx); then q and v with k
   not adapted (stacked across the gap) and gate without up (alone). */
static void test_gradients_of_merged(void **state)
{
    (void)state;
    check_gradients_of_merged(LORA_ALL_TARGETS);
    check_gradients_of_merged((1u << P_WQ) | (1u << P_WV) | (1u << P_WGATE));
}

/* ---- Hugging Face export and --init-from ---- */

static char *temp_dir(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/test_lora.XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dir(const char *dir)
{
    const char *files[] = {"model.safetensors", "config.json", "adapter_model.safetensors",
                           "adapter_config.json"};
    char path[256];
    for (int i = 0; i < 4; ++i) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* A model read back from dir through hf_read_config and hf_load, as --init-from does. */
static model *reload(const char *dir, llmcl_dtype dt, int *max_positions)
{
    hf_checkpoint ck;
    hf_open(dir, &ck);
    model_config cfg = {.dtype = dt};
    assert_true(hf_read_config(&ck, &cfg, max_positions));
    cfg.max_seq = 16;
    model *m = NULL;
    TH_OK(model_create(th_ctx(), &cfg, 99, &m));
    hf_load(m, &ck);
    hf_close(&ck);
    return m;
}

static void test_export_round_trip(void **state)
{
    (void)state;
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(fixture_path("train_fixture_untied.safetensors"), &st));
    const model_config cfg = small_config(LLMCL_BF16, 0, 0);
    model *m = fixture_model(&cfg, st, RECOMPUTE_NONE, false);
    for (int e = 0; e < 2; ++e) {
        const llmcl_dtype edt = e ? LLMCL_BF16 : LLMCL_F32;
        char *dir = temp_dir();
        const hf_export_opts eo = {.dtype = edt, .max_positions = 131072};
        hf_export(m, dir, &eo);
        int max_pos = 0;
        model *r = reload(dir, LLMCL_BF16, &max_pos);
        printf("export %s: read back\n", llmcl_dtype_name(edt));
        assert_int_equal(max_pos, 131072);
        const model_config *a = &m->cfg, *b = &r->cfg;
        assert_true(a->vocab == b->vocab && a->dim == b->dim && a->layers == b->layers &&
                    a->heads == b->heads && a->kv_heads == b->kv_heads && a->ffn == b->ffn &&
                    a->tied == b->tied && a->norm_eps == b->norm_eps &&
                    a->rope_theta == b->rope_theta &&
                    a->rope_llama3_factor == b->rope_llama3_factor);
        const size_t n = (size_t)m->trainable.total;
        float *x = th_alloc(n * 4), *y = th_alloc(n * 4);
        TH_OK(llmcl_tensor_download(m->trainable.master, x, n * 4));
        TH_OK(llmcl_tensor_download(r->trainable.master, y, n * 4));
        for (size_t i = 0; i < n && edt == LLMCL_BF16; ++i)
            x[i] = llmcl_bf16_to_f32(llmcl_f32_to_bf16(x[i]));
        assert_memory_equal(x, y, n * 4);
        free(x), free(y);
        model_destroy(r);
        remove_dir(dir);
    }
    model_destroy(m);
    llmcl_safetensors_close(st);
}

/* An exported tensor as f32 values. */
static double *exported(const char *file, const char *name, int64_t n)
{
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(file, &st));
    llmcl_safetensors_info info;
    TH_OK(llmcl_safetensors_find(st, name, &info));
    assert_int_equal(info.dtype, LLMCL_F32);
    assert_int_equal(info.bytes, n * 4);
    double *x = th_alloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; ++i)
        x[i] = ((const float *)info.data)[i];
    llmcl_safetensors_close(st);
    return x;
}

static void test_merged_and_adapter_export(void **state)
{
    (void)state;
    llmcl_safetensors *st = NULL;
    TH_OK(llmcl_safetensors_open(fixture_path("train_fixture_untied.safetensors"), &st));
    const model_config cfg = small_config(LLMCL_BF16, 4, (1u << P_WQ) | (1u << P_WDOWN));
    model *m = fixture_model(&cfg, st, RECOMPUTE_NONE, false);
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].kind == P_LORA_B)
            randomize(m, &m->params[i], 200 + i, 0.5);
    char *dir = temp_dir(), file[256];
    hf_export_opts eo = {.dtype = LLMCL_F32, .merge = true, .max_positions = 16};
    hf_export(m, dir, &eo);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        if (p->kind >= P_LORA_A)
            continue;
        double *got = exported(file, p->name, p->numel);
        double *w = download(model_param_value(p), p->numel);
        if (p->lora_a) { /* W + s B A on the host */
            const int64_t out = p->shape[0], in = p->shape[1], r = 4;
            double *A = download(p->lora_a->master, r * in);
            double *B = download(p->lora_b->master, out * r);
            double *ba = th_alloc((size_t)(out * in) * sizeof *ba);
            ref_mm(B, r, 1, A, in, 1, ba, out, in, r, m->lora_scale);
            for (int64_t j = 0; j < out * in; ++j)
                w[j] += ba[j];
            TH_ASSERT_CLOSE(p->name, w, got, (size_t)p->numel, (th_tol){1e-6, 1e-6});
            free(A), free(B), free(ba);
        } else {
            assert_memory_equal(w, got, (size_t)p->numel * sizeof *w);
        }
        free(got), free(w);
    }
    eo.merge = false; /* PEFT's adapter files: the adapters' f32 bits under their names */
    hf_export(m, dir, &eo);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    const model_param *a =
        model_find(m, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
    assert_non_null(a);
    double *got = exported(file, a->name, a->numel), *want = download(a->master, a->numel);
    assert_memory_equal(want, got, (size_t)a->numel * sizeof *got);
    free(got), free(want);
    remove_dir(dir);
    model_destroy(m);
    llmcl_safetensors_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_projection_f32),
        cmocka_unit_test(test_projection_bf16),
        cmocka_unit_test(test_zero_b_f32),
        cmocka_unit_test(test_zero_b_bf16),
        cmocka_unit_test(test_recompute_same_bits),
        cmocka_unit_test(test_gradients_of_merged),
        cmocka_unit_test(test_export_round_trip),
        cmocka_unit_test(test_merged_and_adapter_export),
    };
    return TH_RUN(tests);
}
