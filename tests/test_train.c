/*
 * test_train.c: llmcl-train's model and optimizer against the independent PyTorch reference
 * (tools/llmcl-train/reference.py, computed in float64). For each fixture (tied and untied output
 * head) and compute dtype (f32, bf16), from the fixture's weights and batch: the logits, the mean
 * cross-entropy and every parameter's gradient, without and with activation checkpointing and
 * offload (which must give the same bits), and the losses of ten AdamW steps with clipping and
 * weight decay.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model.h"
#include "optimizer.h"

typedef struct fixture {
    llmcl_safetensors *st;
    model_config cfg;
    int b, t, steps;
    adamw_hparams hp;
    float lr;
    const int32_t *ids, *targets;
} fixture;

static double meta(const llmcl_safetensors *st, const char *key)
{
    const char *v = llmcl_safetensors_metadata(st, key);
    assert_non_null(v);
    return atof(v);
}

static const void *tensor_data(const llmcl_safetensors *st, const char *name, uint64_t bytes)
{
    llmcl_safetensors_info info;
    TH_OK(llmcl_safetensors_find(st, name, &info));
    assert_int_equal(info.bytes, bytes);
    return info.data;
}

static fixture fixture_open(const char *file, llmcl_dtype dt)
{
    char path[1024];
    const char *dir = getenv("LLMCL_TEST_DATA_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    fixture f = {0};
    TH_OK(llmcl_safetensors_open(path, &f.st));
    const llmcl_safetensors *st = f.st;
    f.cfg = (model_config){.vocab = (int)meta(st, "vocab"), .dim = (int)meta(st, "dim"),
                           .layers = (int)meta(st, "layers"), .heads = (int)meta(st, "heads"),
                           .kv_heads = (int)meta(st, "kv_heads"), .ffn = (int)meta(st, "ffn"),
                           .tied = (int)meta(st, "tied"), .norm_eps = (float)meta(st, "norm_eps"),
                           .rope_theta = meta(st, "rope_theta"),
                           .rope_llama3_factor = meta(st, "rope_llama3_factor"), .dtype = dt};
    f.b = (int)meta(st, "batch");
    f.t = (int)meta(st, "seq");
    f.cfg.max_seq = f.t;
    f.steps = (int)meta(st, "steps");
    f.lr = (float)meta(st, "lr");
    f.hp = (adamw_hparams){.beta1 = (float)meta(st, "beta1"), .beta2 = (float)meta(st, "beta2"),
                           .eps = (float)meta(st, "eps"),
                           .weight_decay = (float)meta(st, "weight_decay"),
                           .clip = (float)meta(st, "clip")};
    const uint64_t n = (uint64_t)f.b * f.t * sizeof(int32_t);
    f.ids = tensor_data(st, "input_ids", n);
    f.targets = tensor_data(st, "targets", n);
    return f;
}

/* The fixture's weights in m's master buffer and its compute copy. */
static void load_weights(model *m, const fixture *f)
{
    for (int i = 0; i < m->n_params; ++i)
        TH_OK(llmcl_safetensors_load(m->ctx, f->st, m->params[i].name, m->params[i].master));
    TH_OK(model_sync_compute(m));
}

static double *as_doubles(const float *x, size_t n)
{
    double *d = th_alloc(n * sizeof *d);
    for (size_t i = 0; i < n; ++i)
        d[i] = x[i];
    return d;
}

static double *fixture_doubles(const fixture *f, const char *name, size_t n)
{
    return as_doubles(tensor_data(f->st, name, n * sizeof(float)), n);
}

static double max_abs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; ++i)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Gradients and logits: slack relative to the tensor's largest entry, per compute dtype. */
static th_tol rel_max_tol(llmcl_dtype dt, const double *ref, size_t n)
{
    const double r = dt == LLMCL_F32 ? 2e-4 : 6e-2;
    return (th_tol){r * max_abs(ref, n) + 1e-7, r};
}

static model *fixture_model(const fixture *f, bool recompute, bool offload)
{
    model *m = NULL;
    TH_OK(model_create(th_ctx(), &f->cfg, 1, &m));
    TH_OK(model_alloc_acts(m, f->b, f->t, recompute, offload));
    load_weights(m, f);
    return m;
}

/* Every gradient of the last forward (which started from zeroed gradients: the head's are
   written by the forward), downloaded into one host array per parameter. */
static double **gradients(model *m)
{
    TH_OK(model_backward(m, m->max_b, m->max_t));
    double **g = th_alloc((size_t)m->n_params * sizeof *g);
    for (int i = 0; i < m->n_params; ++i) {
        g[i] = th_alloc((size_t)m->params[i].numel * sizeof *g[i]);
        th_download(m->params[i].grad, g[i]);
    }
    return g;
}

static void free_gradients(model *m, double **g)
{
    for (int i = 0; i < m->n_params; ++i)
        free(g[i]);
    free(g);
}

static void check_forward_backward(const char *file, llmcl_dtype dt)
{
    printf("%s, %s\n", file, llmcl_dtype_name(dt));
    fixture f = fixture_open(file, dt);
    model *m = fixture_model(&f, false, false);
    const size_t nlog = (size_t)f.b * f.t * f.cfg.vocab;
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
    TH_OK(model_forward(m, f.ids, f.targets, f.b, f.t, true));
    double loss, *ref_lossp = fixture_doubles(&f, "loss", 1), ref_loss = *ref_lossp;
    free(ref_lossp);
    th_download(m->loss, &loss);
    const double loss_tol = dt == LLMCL_F32 ? 1e-5 : 3e-2;
    printf("loss %.6f, reference %.6f\n", loss, ref_loss);
    assert_true(fabs(loss - ref_loss) <= loss_tol * (1 + fabs(ref_loss)));

    const int64_t lshape[2] = {(int64_t)f.b * f.t, f.cfg.vocab};
    llmcl_tensor *logits = th_tensor(LLMCL_F32, 2, lshape);
    TH_OK(model_logits(m, 0, lshape[0], logits));
    double *got = th_alloc(nlog * sizeof *got), *ref = fixture_doubles(&f, "logits", nlog);
    th_download(logits, got);
    TH_ASSERT_CLOSE("logits", ref, got, nlog, rel_max_tol(dt, ref, nlog));

    double **g = gradients(m);
    for (int i = 0; i < m->n_params; ++i) {
        char name[128];
        const size_t n = (size_t)m->params[i].numel;
        snprintf(name, sizeof name, "grad.%s", m->params[i].name);
        double *gref = fixture_doubles(&f, name, n);
        TH_ASSERT_CLOSE(name, gref, g[i], n, rel_max_tol(dt, gref, n));
        free(gref);
    }

    /* activation checkpointing recomputes the same kernels on the same inputs, and offloading
       brings them back bit for bit: the same gradients exactly */
    for (int off = 0; off < 2; ++off) {
        model *mr = fixture_model(&f, true, off);
        TH_OK(llmcl_fill(mr->ctx, mr->trainable.grad, 0.0));
        TH_OK(model_forward(mr, f.ids, f.targets, f.b, f.t, true));
        double **gr = gradients(mr);
        for (int i = 0; i < m->n_params; ++i)
            assert_memory_equal(g[i], gr[i], (size_t)m->params[i].numel * sizeof *g[i]);
        free_gradients(mr, gr);
        model_destroy(mr);
    }

    free_gradients(m, g);
    free(got), free(ref);
    llmcl_tensor_destroy(logits);
    model_destroy(m);
    llmcl_safetensors_close(f.st);
}

static void check_adamw(const char *file, llmcl_dtype dt)
{
    printf("%s, %s: AdamW\n", file, llmcl_dtype_name(dt));
    fixture f = fixture_open(file, dt);
    model *m = fixture_model(&f, false, false);
    optimizer opt;
    TH_OK(optimizer_create(m, &f.hp, &opt));
    double *ref = fixture_doubles(&f, "adamw_losses", (size_t)f.steps);
    double *got = th_alloc((size_t)f.steps * sizeof *got);
    for (int s = 0; s < f.steps; ++s) {
        TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
        TH_OK(model_forward(m, f.ids, f.targets, f.b, f.t, true));
        th_download(m->loss, &got[s]);
        TH_OK(model_backward(m, f.b, f.t));
        TH_OK(optimizer_step(&opt, f.lr, s + 1, 1));
    }
    printf("loss after %d steps %.6f, reference %.6f\n", f.steps, got[f.steps - 1],
           ref[f.steps - 1]);
    assert_true(ref[f.steps - 1] < ref[0] - 0.1); /* the reference itself learned something */
    /* Adam's first steps move every weight by about lr whatever its gradient's size, so a tiny
       gradient whose sign f32 (or bf16) rounding flips moves it the other way: the trajectories
       drift apart by more than one forward's rounding. A wrong update differs by far more. */
    TH_ASSERT_CLOSE("AdamW losses", ref, got, (size_t)f.steps,
                    dt == LLMCL_F32 ? (th_tol){5e-5, 5e-4} : (th_tol){3e-2, 5e-2});
    free(ref), free(got);
    optimizer_destroy(&opt);
    model_destroy(m);
    llmcl_safetensors_close(f.st);
}

static void test_tied_f32(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_tied.safetensors", LLMCL_F32);
    check_adamw("train_fixture_tied.safetensors", LLMCL_F32);
}

static void test_untied_f32(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_untied.safetensors", LLMCL_F32);
    check_adamw("train_fixture_untied.safetensors", LLMCL_F32);
}

static void test_tied_bf16(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_tied.safetensors", LLMCL_BF16);
    check_adamw("train_fixture_tied.safetensors", LLMCL_BF16);
}

static void test_untied_bf16(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_untied.safetensors", LLMCL_BF16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_f32),
        cmocka_unit_test(test_untied_f32),
        cmocka_unit_test(test_tied_bf16),
        cmocka_unit_test(test_untied_bf16),
    };
    return TH_RUN(tests);
}
