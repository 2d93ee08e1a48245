/*
 * test_train.c: llmcl-train's model and optimizer against the independent PyTorch reference
 * (tools/llmcl-train/reference.py, computed in float64). For each fixture (tied and untied output
 * head) and compute dtype (f32, bf16), from the fixture's weights and batch: the logits, the mean
 * cross-entropy and every parameter's gradient, without and with activation checkpointing in
 * each form and offload (which must give the same bits), and the losses of ten AdamW steps with
 * clipping and weight decay. The recompute forms on a model of 5 layers: the losses and weights of
 * three AdamW steps, bit for bit those without, and the peak of device memory in the order that
 * each form's kept buffers give. The initial weights: each parameter's values its own counter-based stream's, the
 * same bits whatever the split into pieces or threads; Normal(0, 0.02) matrices, unit norms, LoRA A
 * uniform in +-1/sqrt(in) and B zero.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy_ref.h"
#include "distill_ref.h"
#include "harness.h"
#include "model.h"
#include "optimizer.h"
#include "util.h"

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

/* An entry that only some fixtures have, else absent. */
static double meta_or(const llmcl_safetensors *st, const char *key, double absent)
{
    const char *v = llmcl_safetensors_metadata(st, key);
    return v ? atof(v) : absent;
}

static model_arch fixture_arch(const llmcl_safetensors *st)
{
    const char *v = llmcl_safetensors_metadata(st, "arch");
    for (int a = 0; v && a < ARCH_COUNT; ++a)
        if (strcmp(v, model_arch_name(a)) == 0)
            return a;
    assert_null(v);
    return ARCH_LLAMA;
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
                           .rope_llama3_factor = meta(st, "rope_llama3_factor"), .dtype = dt,
                           .arch = fixture_arch(st),
                           .head_dim = (int)meta_or(st, "head_dim", 0),
                           .qkv_bias = (int)meta_or(st, "qkv_bias", 0),
                           .o_bias = (int)meta_or(st, "o_bias", 0),
                           .qk_norm = (int)meta_or(st, "qk_norm", 0),
                           .sliding_window = (int)meta_or(st, "sliding_window", 0)};
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
        TH_OK(llmcl_safetensors_load(m->ctx, f->st, m->params[i].name,
                                     model_param_value(&m->params[i])));
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

/*
 * A gradient's tolerance: rel_max_tol, but a bias's takes its weight's largest gradient as the
 * scale. A bias is a weight column whose input is 1, so its gradient sums as many 16-bit rounded
 * dy as the weight's does, and as much rounding, while cancellation can leave the sum itself far
 * smaller (a bf16 k bias's 3.4e-4 against a largest 5.5e-3 on rusticl).
 */
static th_tol grad_tol(const fixture *f, llmcl_dtype dt, const char *param, const double *ref,
                       size_t n)
{
    const char *bias = strstr(param, ".bias");
    if (!bias || bias[5])
        return rel_max_tol(dt, ref, n);
    char weight[160];
    snprintf(weight, sizeof weight, "grad.%.*s.weight", (int)(bias - param), param);
    llmcl_safetensors_info info;
    TH_OK(llmcl_safetensors_find(f->st, weight, &info));
    const size_t nw = (size_t)(info.bytes / sizeof(float));
    double *w = fixture_doubles(f, weight, nw);
    const th_tol t = rel_max_tol(dt, w, nw);
    free(w);
    return t;
}

static model *fixture_model(const fixture *f, int recompute, bool offload)
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
        TH_ASSERT_CLOSE(name, gref, g[i], n, grad_tol(&f, dt, m->params[i].name, gref, n));
        free(gref);
    }

    /* activation checkpointing recomputes the same kernels on the same inputs, and offloading
       brings them back bit for bit: the same gradients exactly, in every form (of 2 layers, the
       second recomputed whole with --recompute=2) */
    static const int forms[] = {RECOMPUTE_FULL, RECOMPUTE_OPS, 2};
    for (size_t r = 0; r < sizeof forms / sizeof forms[0]; ++r)
        for (int off = 0; off < 2; ++off) {
            model *mr = fixture_model(&f, forms[r], off);
            TH_OK(llmcl_fill(mr->ctx, mr->trainable.grad, 0.0));
            TH_OK(model_forward(mr, f.ids, f.targets, f.b, f.t, true));
            double **gr = gradients(mr);
            for (int i = 0; i < m->n_params; ++i)
                assert_memory_equal(g[i], gr[i], (size_t)m->params[i].numel * sizeof *g[i]);
            free_gradients(mr, gr);
            model_destroy(mr);
        }

    /* grads_fresh: every gradient's first write replaces it (NaN poison must not survive), with
       the same bits as adding to zeroed gradients */
    model *mf = fixture_model(&f, false, false);
    TH_OK(llmcl_fill(mf->ctx, mf->trainable.grad, NAN));
    mf->grads_fresh = true;
    TH_OK(model_forward(mf, f.ids, f.targets, f.b, f.t, true));
    double **gf = gradients(mf);
    assert_false(mf->grads_fresh);
    for (int i = 0; i < m->n_params; ++i)
        assert_memory_equal(g[i], gf[i], (size_t)m->params[i].numel * sizeof *g[i]);
    free_gradients(mf, gf);
    model_destroy(mf);

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
        optimizer_prepare(&opt, f.lr, s + 1, 1, false);
        TH_OK(optimizer_step(&opt));
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

/*
 * Packed documents (llmcl-train's examples): a batch of 2 x 16 tokens holding four documents and
 * a row's padding, each attending only to itself from position 0, some positions learning
 * nothing. Each document's logits must be those of the document run alone, and the gradients
 * those of the mean over every target that learns: the documents' own, each weighted by its share
 * of the targets (ce_grad_scale). The ops form recomputes them bit for bit.
 */
/* Five documents packed into 32 tokens, the third of them padding; the second learns nothing
   from its first two tokens. */
#define DOCS 5
static const int32_t doc_offsets[DOCS + 1] = {0, 5, 12, 16, 29, 32};
static const bool doc_padding[DOCS] = {false, false, true, false, false};

typedef struct packing {
    int32_t ids[32], targets[32], pos[32];
    int counted[DOCS], total; /* the tokens that learn, by document and in all */
} packing;

static packing pack_documents(const fixture *f)
{
    packing p = {.total = 0};
    for (int d = 0; d < DOCS; ++d)
        for (int i = doc_offsets[d]; i < doc_offsets[d + 1]; ++i) {
            const bool learns = !doc_padding[d] && i + 1 < doc_offsets[d + 1] && !(d == 1 && i < 7);
            p.ids[i] = doc_padding[d] ? 0 : f->ids[i];
            p.targets[i] = learns ? f->ids[i + 1] : -100;
            p.pos[i] = i - doc_offsets[d];
            p.counted[d] += learns;
            p.total += learns;
        }
    return p;
}

/* Document d run alone: its logits must be the packed run's rows, and its loss and gradients
   (added to m's) count with its share of the learning tokens. Returns its share of the loss. */
static double document_alone(model *m, const fixture *f, const packing *p, int d,
                             const double *packed)
{
    const int at = doc_offsets[d], len = doc_offsets[d + 1] - at;
    m->ce_grad_scale = (float)p->counted[d] / (float)p->total;
    TH_OK(model_forward(m, p->ids + at, p->targets + at, 1, len, true));
    double l, *alone = th_alloc((size_t)len * f->cfg.vocab * sizeof *alone);
    th_download(m->loss, &l);
    const int64_t ashape[2] = {len, f->cfg.vocab};
    llmcl_tensor *al = th_tensor(LLMCL_F32, 2, ashape);
    TH_OK(model_logits(m, 0, len, al));
    th_download(al, alone);
    const size_t nl = (size_t)len * f->cfg.vocab;
    TH_ASSERT_CLOSE("a document's logits", alone, packed + (size_t)at * f->cfg.vocab, nl,
                    rel_max_tol(LLMCL_F32, alone, nl));
    TH_OK(model_backward(m, 1, len));
    llmcl_tensor_destroy(al);
    free(alone);
    return l * p->counted[d] / p->total;
}

/* The packed run under op-level recomputation: the same gradients, bit for bit. */
static void check_documents_recomputed(fixture *f, const packing *p, double **g)
{
    model *mo = fixture_model(f, RECOMPUTE_OPS, false);
    TH_OK(llmcl_fill(mo->ctx, mo->trainable.grad, 0.0));
    TH_OK(model_set_documents(mo, p->pos, doc_offsets, DOCS, f->b, f->t));
    TH_OK(model_forward(mo, p->ids, p->targets, f->b, f->t, true));
    double **go = gradients(mo);
    for (int i = 0; i < mo->n_params; ++i)
        assert_memory_equal(g[i], go[i], (size_t)mo->params[i].numel * sizeof *g[i]);
    free_gradients(mo, go);
    model_destroy(mo);
}

static void check_documents(const char *file)
{
    printf("%s: packed documents\n", file);
    fixture f = fixture_open(file, LLMCL_F32);
    assert_int_equal(f.b * f.t, 32);
    const packing p = pack_documents(&f);
    const int64_t lshape[2] = {32, f.cfg.vocab};
    llmcl_tensor *logits = th_tensor(LLMCL_F32, 2, lshape);
    double *packed = th_alloc((size_t)32 * f.cfg.vocab * sizeof *packed), loss;
    model *m = fixture_model(&f, RECOMPUTE_NONE, false);
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
    TH_OK(model_set_documents(m, p.pos, doc_offsets, DOCS, f.b, f.t));
    TH_OK(model_forward(m, p.ids, p.targets, f.b, f.t, true));
    th_download(m->loss, &loss);
    TH_OK(model_logits(m, 0, 32, logits));
    th_download(logits, packed);
    double **g = gradients(m);

    /* each document alone, its gradients added with its weight */
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
    TH_OK(model_set_documents(m, NULL, NULL, 0, f.b, f.t));
    double ref_loss = 0;
    for (int d = 0; d < DOCS; ++d)
        if (!doc_padding[d])
            ref_loss += document_alone(m, &f, &p, d, packed);
    printf("loss %.6f, the documents' %.6f\n", loss, ref_loss);
    assert_true(fabs(loss - ref_loss) <= 1e-5 * (1 + fabs(ref_loss)));
    for (int i = 0; i < m->n_params; ++i) {
        const size_t n = (size_t)m->params[i].numel;
        double *gd = th_alloc(n * sizeof *gd);
        th_download(m->params[i].grad, gd);
        TH_ASSERT_CLOSE(m->params[i].name, gd, g[i], n, rel_max_tol(LLMCL_F32, gd, n));
        free(gd);
    }
    check_documents_recomputed(&f, &p, g);
    free_gradients(m, g);
    model_destroy(m);
    free(packed);
    llmcl_tensor_destroy(logits);
    llmcl_safetensors_close(f.st);
}

static void test_documents(void **state)
{
    (void)state;
    check_documents("train_fixture_untied.safetensors");
    check_documents("train_fixture_qwen3.safetensors");
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

/* Qwen3's layers with all that other architectures add to Llama's: biases on q, k, v and o, the q
   and k norms, a head dimension other than dim / heads, a sliding window. */
static void test_qwen3_f32(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_qwen3.safetensors", LLMCL_F32);
    check_adamw("train_fixture_qwen3.safetensors", LLMCL_F32);
}

static void test_qwen3_bf16(void **state)
{
    (void)state;
    check_forward_backward("train_fixture_qwen3.safetensors", LLMCL_BF16);
    check_adamw("train_fixture_qwen3.safetensors", LLMCL_BF16);
}

/* ---- activation checkpointing's forms ---- */

enum { FORM_B = 2, FORM_T = 16, FORM_STEPS = 3 };

/* What one form's run gave: each step's loss, the final master weights, the step's peak. */
typedef struct form_run {
    double loss[FORM_STEPS];
    double *masters;
    size_t n_masters;
    uint64_t acts_bytes, peak_bytes; /* its activations' device memory; the steps' peak */
} form_run;

/* FORM_STEPS AdamW steps from seed 3's weights on one batch, activations in form recompute. */
static form_run run_form(const model_config *cfg, const int32_t *ids, const int32_t *targets,
                         int recompute, bool offload)
{
    form_run r = {0};
    llmcl_memory_stats before, after;
    model *m = NULL;
    TH_OK(model_create(th_ctx(), cfg, 3, &m));
    TH_OK(llmcl_memory_stats_get(m->ctx, &before));
    TH_OK(model_alloc_acts(m, FORM_B, FORM_T, recompute, offload));
    TH_OK(llmcl_memory_stats_get(m->ctx, &after));
    r.acts_bytes = after.current_bytes - before.current_bytes;
    assert_int_equal(model_acts_bytes(m, FORM_B, FORM_T, recompute, offload), r.acts_bytes);
    const adamw_hparams hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .clip = 1.0f};
    optimizer opt;
    TH_OK(optimizer_create(m, &hp, &opt));
    TH_OK(llmcl_memory_reset_peak(m->ctx));
    for (int s = 0; s < FORM_STEPS; ++s) {
        TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
        TH_OK(model_forward(m, ids, targets, FORM_B, FORM_T, true));
        th_download(m->loss, &r.loss[s]);
        TH_OK(model_backward(m, FORM_B, FORM_T));
        optimizer_prepare(&opt, 3e-3f, s + 1, 1, false);
        TH_OK(optimizer_step(&opt));
    }
    TH_OK(llmcl_memory_stats_get(m->ctx, &after));
    r.peak_bytes = after.peak_bytes;
    r.n_masters = (size_t)m->trainable.total;
    r.masters = th_alloc(r.n_masters * sizeof *r.masters);
    th_download(m->trainable.master, r.masters);
    char what[160];
    model_recompute_describe(m, what, sizeof what);
    printf("%s%s: activations %llu bytes, peak %llu\n", what[0] ? what : "no recompute",
           offload ? " + offload" : "", (unsigned long long)r.acts_bytes,
           (unsigned long long)r.peak_bytes);
    optimizer_destroy(&opt);
    model_destroy(m);
    return r;
}

/*
 * Every form, with and without offload, trains 5 layers (a multiple of neither 2 nor 3) to the
 * bits of the run that keeps everything, and allocates what model_acts_bytes says. Memory: --recompute=N keeps full activations for the
 * layers it does not recompute and rebuilds the others in the last layer's buffers when that layer
 * keeps all (5 % 2 and 5 % 3 are not 0), full rebuilds every layer in one set of its own, ops
 * drops the norms' and SwiGLU's outputs of every layer.
 */
static void check_forms(llmcl_dtype dt)
{
    const model_config cfg = {.vocab = 64, .dim = 64, .layers = 5, .heads = 2, .kv_heads = 1,
                              .ffn = 96, .max_seq = FORM_T, .norm_eps = 1e-5f,
                              .rope_theta = 10000, .tied = 1, .dtype = dt};
    int32_t ids[FORM_B * FORM_T], targets[FORM_B * FORM_T];
    uint32_t x = 12345;
    for (int i = 0; i < FORM_B * FORM_T; ++i) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)(x >> 8) % cfg.vocab;
        targets[i] = (int32_t)(x >> 20) % cfg.vocab;
    }
    static const int forms[] = {RECOMPUTE_NONE, 3, 2, RECOMPUTE_FULL, RECOMPUTE_OPS, 5};
    enum { NONE, N3, N2, FULL, OPS, N5, FORMS };
    form_run runs[FORMS];
    for (int f = 0; f < FORMS; ++f)
        for (int off = 0; off < (f == NONE ? 1 : 2); ++off) {
            form_run r = run_form(&cfg, ids, targets, forms[f], off);
            if (f == NONE) {
                assert_true(r.loss[FORM_STEPS - 1] < r.loss[0]); /* it trained */
                runs[f] = r;
                continue;
            }
            assert_memory_equal(runs[NONE].loss, r.loss, sizeof r.loss);
            assert_int_equal(runs[NONE].n_masters, r.n_masters);
            assert_memory_equal(runs[NONE].masters, r.masters, r.n_masters * sizeof *r.masters);
            if (off)
                free(r.masters);
            else
                runs[f] = r;
        }
    /* the activations alone, exactly: a layer set S = (none - full) / 4 */
    const uint64_t none = runs[NONE].acts_bytes, set = (none - runs[FULL].acts_bytes) / 4;
    assert_int_equal(none - runs[FULL].acts_bytes, 4 * set);
    assert_int_equal(runs[N2].acts_bytes, none - 2 * set); /* layers 1 and 3 */
    assert_int_equal(runs[N3].acts_bytes, none - set);     /* layer 2 */
    assert_int_equal(runs[N5].acts_bytes, none);           /* layer 4, in a set of its own */
    /* ops: 4 layers' norm outputs, rstd and SwiGLU product fewer (one set is rebuilt into) */
    const uint64_t n = FORM_B * FORM_T, cheap = n * (2 * cfg.dim + cfg.ffn) * llmcl_dtype_size(dt) +
                                                2 * n * sizeof(float);
    assert_int_equal(runs[OPS].acts_bytes, none - 4 * cheap);
    /* and the steps' peaks in the same order */
    assert_true(runs[NONE].peak_bytes > runs[N3].peak_bytes);
    assert_true(runs[N3].peak_bytes > runs[N2].peak_bytes);
    assert_true(runs[N2].peak_bytes > runs[FULL].peak_bytes);
    assert_true(runs[OPS].peak_bytes < runs[NONE].peak_bytes);
    for (int f = 0; f < FORMS; ++f)
        free(runs[f].masters);
}

static void test_recompute_forms_bf16(void **state)
{
    (void)state;
    check_forms(LLMCL_BF16);
}

static void test_recompute_forms_f32(void **state)
{
    (void)state;
    check_forms(LLMCL_F32);
}

/* ---- initial values ---- */

/* Counter-based streams: any split of a range gives the bits of the whole range drawn at once (so
   threads cannot change them), a range starting inside a Box-Muller pair included. */
static void test_streams_split(void **state)
{
    (void)state;
    enum { N = 1001 };
    static const int64_t cuts[] = {0, 1, 2, 5, 8, 9, 500, 999, 1000, N};
    const uint64_t key = rng_stream(42, 3);
    float whole[2][N], pieces[2][N];
    rng_normal_fill(key, 0, N, 0.5, whole[0]);
    rng_uniform_fill(key, 0, N, -2.0, 3.0, whole[1]);
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; ++c) {
        const int64_t lo = cuts[c], n = cuts[c + 1] - cuts[c];
        rng_normal_fill(key, lo, n, 0.5, pieces[0] + lo);
        rng_uniform_fill(key, lo, n, -2.0, 3.0, pieces[1] + lo);
    }
    assert_memory_equal(whole, pieces, sizeof whole);
    float other[N];
    rng_normal_fill(rng_stream(42, 4), 0, N, 0.5, other); /* another stream: other values */
    int same = 0;
    for (int j = 0; j < N; ++j)
        same += other[j] == whole[0][j];
    assert_true(same < 5);
}

static void count_piece(void *arg, int64_t lo, int64_t hi)
{
    unsigned char *seen = arg;
    for (int64_t j = lo; j < hi; ++j)
        ++seen[j];
}

/* parallel_for covers its range once, whatever the processors' count, and nothing else. */
static void test_parallel_for(void **state)
{
    (void)state;
    static const int64_t ranges[][3] = {{3, 300003, 1000}, {7, 7, 10}, {0, 19, 10}, {5, 6, 0}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; ++r) {
        const int64_t begin = ranges[r][0], end = ranges[r][1];
        unsigned char *seen = calloc((size_t)end + 3, 1);
        assert_non_null(seen);
        parallel_for(begin, end, ranges[r][2], count_piece, seen);
        for (int64_t j = 0; j < end + 3; ++j)
            if (seen[j] != (j >= begin && j < end)) {
                printf("range [%lld, %lld): element %lld seen %d times\n", (long long)begin,
                       (long long)end, (long long)j, seen[j]);
                fail();
            }
        free(seen);
    }
}

/* Mean, standard deviation and the fraction beyond 1 and 2 of it of a Normal(0, sigma) sample,
   and the correlation of neighbours (a Box-Muller pair's two values are independent). */
static void check_normal(const char *name, const double *x, int64_t n, double sigma)
{
    double sum = 0, sq = 0, beyond1 = 0, beyond2 = 0, lag = 0;
    for (int64_t j = 0; j < n; ++j) {
        sum += x[j], sq += x[j] * x[j];
        beyond1 += fabs(x[j]) > sigma, beyond2 += fabs(x[j]) > 2 * sigma;
        lag += j + 1 < n ? x[j] * x[j + 1] : 0;
    }
    const double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    const double corr = lag / sq, p1 = 0.31731050786291410, p2 = 0.04550026389635842,
                 rn = sqrt((double)n);
    printf("%s: %lld values, mean %.3g, sd %.5f, beyond 1 sd %.4f, beyond 2 sd %.4f, "
           "neighbours' correlation %.4f\n", name, (long long)n, mean, sd, beyond1 / (double)n,
           beyond2 / (double)n, corr);
    /* six standard errors each: a wrong distribution or scale misses by far more */
    assert_true(fabs(mean) <= 6 * sigma / rn);
    assert_true(fabs(corr) <= 6 / rn);
    assert_true(fabs(sd - sigma) <= 6 * sigma / sqrt(2.0 * (double)n));
    assert_true(fabs(beyond1 / (double)n - p1) <= 6 * sqrt(p1 * (1 - p1)) / rn);
    assert_true(fabs(beyond2 / (double)n - p2) <= 6 * sqrt(p2 * (1 - p2)) / rn);
}

/* A model's weights after model_create (the masters, or a 16-bit base's copy): each parameter's
   stream drawn on one thread. */
static void check_init(const model_config *cfg, uint64_t seed)
{
    model *m = NULL;
    TH_OK(model_create(th_ctx(), cfg, seed, &m));
    for (int i = 0; i < m->n_params; ++i) {
        const model_param *p = &m->params[i];
        const size_t n = (size_t)p->numel;
        const uint64_t key = rng_stream(seed, (uint64_t)i);
        const double bound = 1.0 / sqrt((double)p->shape[1]);
        float *want = th_alloc(n * sizeof *want);
        const bool zero = p->kind == P_LORA_B || (p->kind >= P_BQ && p->kind <= P_BO);
        if (p->is_vector || zero)
            for (size_t j = 0; j < n; ++j)
                want[j] = zero ? 0.0f : 1.0f;
        else if (p->kind == P_LORA_A)
            rng_uniform_fill(key, 0, p->numel, -bound, bound, want);
        else
            rng_normal_fill(key, 0, p->numel, 0.02, want);
        const llmcl_tensor *t = model_param_value(p); /* a 16-bit base: the values rounded */
        if (llmcl_tensor_dtype(t) == LLMCL_BF16)
            for (size_t j = 0; j < n; ++j)
                want[j] = (float)th_round(LLMCL_BF16, want[j]);
        double *got = th_alloc(n * sizeof *got);
        th_download(t, got);
        for (size_t j = 0; j < n; ++j)
            if (got[j] != want[j]) {
                printf("%s[%zu] = %.9g, its stream's value %.9g\n", p->name, j, got[j], want[j]);
                fail();
            }
        if (p->kind == P_EMBED)
            check_normal(p->name, got, p->numel, 0.02);
        if (p->kind == P_LORA_A) /* rounding to float is monotonic: within the bound's */
            for (size_t j = 0; j < n; ++j)
                assert_true(fabs(got[j]) <= (float)bound);
        free(got), free(want);
    }
    model_destroy(m);
}

/* The embedding of 512 x 1024 values is parted over the threads, the other tensors are not. */
static void test_initial_values(void **state)
{
    (void)state;
    model_config cfg = {.vocab = 512, .dim = 1024, .layers = 1, .heads = 8, .kv_heads = 4,
                        .ffn = 64, .max_seq = 16, .norm_eps = 1e-5f, .rope_theta = 10000,
                        .tied = 1, .dtype = LLMCL_F32};
    check_init(&cfg, 1337);
    cfg = (model_config){.vocab = 64, .dim = 64, .layers = 2, .heads = 2, .kv_heads = 1,
                         .ffn = 96, .max_seq = 16, .norm_eps = 1e-5f, .rope_theta = 10000,
                         .dtype = LLMCL_BF16, .lora_rank = 4, .lora_alpha = 8,
                         .lora_targets = LORA_ALL_TARGETS, .lora_dtype = LLMCL_F32};
    check_init(&cfg, 7);
    /* biases start at zero, the q and k norms at one */
    cfg = (model_config){.vocab = 64, .dim = 64, .layers = 2, .heads = 2, .kv_heads = 1,
                         .head_dim = 48, .ffn = 96, .max_seq = 16, .norm_eps = 1e-5f,
                         .rope_theta = 10000, .dtype = LLMCL_BF16, .arch = ARCH_QWEN3,
                         .qkv_bias = 1, .o_bias = 1, .qk_norm = 1};
    check_init(&cfg, 11);
}

/* The f32 logits [n, vocab] of m's last forward, on the host. */
static double *host_logits(model *m, int64_t n)
{
    const int64_t shape[2] = {n, m->cfg.vocab};
    llmcl_tensor *t = th_tensor(LLMCL_F32, 2, shape);
    TH_OK(model_logits(m, 0, n, t));
    double *x = th_download_new(t);
    llmcl_tensor_destroy(t);
    return x;
}

/*
 * Distillation from a teacher (the untied fixture's weights, frozen) into a student of the same
 * shape from seed 3: the loss (1 - alpha) CE + alpha tau^2 D and the head's gradient against the
 * double references on both models' logits, at a mix and at the divergence alone.
 */
static void check_distill(float alpha, float beta, float tau)
{
    printf("alpha %g, beta %g, tau %g\n", alpha, beta, tau);
    fixture f = fixture_open("train_fixture_untied.safetensors", LLMCL_F32);
    model_config tc = f.cfg, sc = f.cfg;
    tc.frozen = 1;
    sc.distill_alpha = alpha, sc.distill_beta = beta, sc.distill_temperature = tau;
    model *teacher = fixture_model(&(fixture){.st = f.st, .cfg = tc, .b = f.b, .t = f.t},
                                   RECOMPUTE_FULL, false);
    model *m = NULL;
    TH_OK(model_create(th_ctx(), &sc, 3, &m));
    TH_OK(model_alloc_acts(m, f.b, f.t, RECOMPUTE_NONE, false));
    model_set_teacher(m, teacher);
    TH_OK(llmcl_fill(m->ctx, m->trainable.grad, 0.0));
    TH_OK(model_hidden_forward(teacher, f.ids, f.b, f.t));
    TH_OK(model_forward(m, f.ids, f.targets, f.b, f.t, true));
    double loss;
    th_download(m->loss, &loss);

    const int64_t n = (int64_t)f.b * f.t, v = f.cfg.vocab, dim = f.cfg.dim;
    double *zs = host_logits(m, n), *zt = host_logits(teacher, n);
    double *gce = th_alloc((size_t)(n * v) * sizeof *gce), *gkd = th_alloc((size_t)(n * v) * 8);
    int64_t *y = th_alloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; ++i)
        y[i] = f.targets[i];
    double ce, z, kd, *lse = th_alloc((size_t)n * sizeof *lse);
    const ref_ce_opts co = {.ignore_index = -100};
    assert_true(ref_cross_entropy(zs, y, n, v, &co, &ce, &z, lse, gce) < 0);
    const ref_distill_opts dop = {beta, tau, 0, -100, 1.0, 0.0};
    ref_distill(zs, zt, y, n, v, &dop, &kd, gkd);
    const double want = (1 - alpha) * ce + alpha * tau * tau * kd;
    printf("loss %.6f, reference %.6f (CE %.6f, D %.6f)\n", loss, want, ce, kd);
    assert_true(fabs(loss - want) <= 1e-5 * (1 + fabs(want)));

    /* the head's gradient: G^T h, G the mixed logits gradient, h the final hidden states */
    const int64_t hs[2] = {n, dim};
    llmcl_tensor *ht = th_tensor(LLMCL_F32, 2, hs);
    TH_OK(llmcl_copy(m->ctx, m->hfinal, ht));
    double *h = th_download_new(ht), *want_g = th_alloc((size_t)(v * dim) * sizeof *want_g);
    for (int64_t j = 0; j < v; ++j)
        for (int64_t k = 0; k < dim; ++k) {
            double acc = 0;
            for (int64_t i = 0; i < n; ++i)
                acc += ((1 - alpha) * gce[i * v + j] + alpha * tau * tau * gkd[i * v + j]) *
                       h[i * dim + k];
            want_g[j * dim + k] = acc;
        }
    double *got = th_download_new(model_find(m, "lm_head.weight")->grad);
    TH_ASSERT_CLOSE("lm_head gradient", want_g, got, (size_t)(v * dim),
                    rel_max_tol(LLMCL_F32, want_g, (size_t)(v * dim)));
    free(zs), free(zt), free(gce), free(gkd), free(y), free(lse), free(h), free(want_g), free(got);
    llmcl_tensor_destroy(ht);
    model_destroy(m);
    model_destroy(teacher);
    llmcl_safetensors_close(f.st);
}

/*
 * A frozen bf16 model (a teacher, a reference) keeps no f32 masters: each matrix is its bf16 copy
 * alone, the checkpoint's values rounded to nearest even, and each vector an f32 tensor of its
 * own, the values exact; it holds no gradient buffers and two stream tensors; its logits are a
 * trained bf16 model's of the same weights, bit for bit. A LoRA model's frozen base keeps no
 * masters either.
 */
static void test_frozen_bf16(void **state)
{
    (void)state;
    fixture f = fixture_open("train_fixture_untied.safetensors", LLMCL_BF16);
    model *trained = fixture_model(&f, RECOMPUTE_NONE, false);
    f.cfg.frozen = 1;
    model *frozen = fixture_model(&f, RECOMPUTE_FULL, false);
    assert_null(frozen->frozen.master);
    /* nor gradient buffers, and its residual stream is a ring of two */
    assert_true(f.cfg.layers > 1);
    assert_null(frozen->dh32), assert_null(frozen->dres), assert_null(frozen->dqkv);
    const uint64_t n = (uint64_t)f.b * f.t, d = (uint64_t)f.cfg.dim,
                   q = (uint64_t)f.cfg.heads * frozen->head_dim,
                   kv = (uint64_t)f.cfg.kv_heads * frozen->head_dim;
    const uint64_t grads = n * (2 * d + 2 * d + 4 * d + 2 * (uint64_t)f.cfg.ffn + 2 * q +
                                2 * (q + 2 * kv)), /* dres, dh, dh32, da, dattn, dqkv */
        streams = (uint64_t)(f.cfg.layers - 1) * n * d * 2;
    assert_true(model_acts_bytes(frozen, f.b, f.t, RECOMPUTE_FULL, false) + grads + streams <=
                model_acts_bytes(trained, f.b, f.t, RECOMPUTE_FULL, false));
    for (int i = 0; i < frozen->n_params; ++i) {
        const model_param *p = &frozen->params[i];
        assert_int_equal(llmcl_tensor_dtype(model_param_value(p)),
                         p->is_vector ? LLMCL_F32 : LLMCL_BF16);
        float *want = th_alloc((size_t)p->numel * sizeof *want);
        float *got = th_alloc((size_t)p->numel * sizeof *got);
        safetensors_to_host(f.st, p->name, want, p->numel);
        model_params_get(frozen, 1, &p, &got);
        for (int64_t j = 0; j < p->numel; ++j) {
            const float w = p->is_vector ? want[j] : (float)th_round(LLMCL_BF16, want[j]);
            assert_memory_equal(&w, &got[j], sizeof w);
        }
        free(want), free(got);
    }
    TH_OK(model_hidden_forward(frozen, f.ids, f.b, f.t));
    TH_OK(model_forward(trained, f.ids, f.targets, f.b, f.t, false));
    double *zf = host_logits(frozen, (int64_t)n), *zt = host_logits(trained, (int64_t)n);
    assert_memory_equal(zf, zt, (size_t)(n * (uint64_t)f.cfg.vocab) * sizeof *zf);
    free(zf), free(zt);
    model_destroy(frozen);
    model_destroy(trained);
    /* so is a LoRA model's base, while its adapters keep theirs */
    model_config lc = f.cfg;
    lc.frozen = 0, lc.lora_rank = 4, lc.lora_alpha = 4, lc.lora_targets = LORA_ALL_TARGETS;
    lc.lora_dtype = LLMCL_F32;
    model *lora = NULL;
    TH_OK(model_create(th_ctx(), &lc, 1, &lora));
    assert_null(lora->frozen.master);
    assert_non_null(lora->trainable.master);
    model_destroy(lora);
    llmcl_safetensors_close(f.st);
}

static void test_distill(void **state)
{
    (void)state;
    check_distill(0.7f, 0.5f, 2.0f);
    check_distill(1.0f, 0.0f, 1.0f);
    check_distill(0.25f, 1.0f, 1.5f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_f32),
        cmocka_unit_test(test_untied_f32),
        cmocka_unit_test(test_tied_bf16),
        cmocka_unit_test(test_untied_bf16),
        cmocka_unit_test(test_qwen3_f32),
        cmocka_unit_test(test_qwen3_bf16),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_recompute_forms_bf16),
        cmocka_unit_test(test_recompute_forms_f32),
        cmocka_unit_test(test_streams_split),
        cmocka_unit_test(test_parallel_for),
        cmocka_unit_test(test_initial_values),
        cmocka_unit_test(test_frozen_bf16),
        cmocka_unit_test(test_distill),
    };
    return TH_RUN(tests);
}
