/*
 * test_matmul.c: llmcl_matmul against the double reference for every transpose combination, dtype,
 * alpha, beta, bias, stride and batch layout, at sizes that are not tile multiples; the split-K
 * path against the plain one, vocabulary-sized K (more slices where the device cuts loops short);
 * the tensor-core path where the device has one (skipped with a message elsewhere) and the
 * portable kernel's tunables; a separate addend c_in (read in place or copied, never changed);
 * the squares of c gathered for the gradient norm (opts.sumsq); the product continued along K
 * (opts.a_ext, b_ext) against one product over the joined operands; every bad input, with c left
 * intact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "matmul_ref.h"

/* ---- operands in any layout ---- */

/*
 * A tensor of view shape [batch,] rows x cols holding v[z][r][c], stored row-major or
 * column-major with pad elements after each stored line, offset elements into a buffer whose
 * other elements hold random values (kept in *fill so a test can check them afterwards).
 */
typedef struct mm_tensor {
    llmcl_tensor *view, *storage;
    double *fill; /* the storage as uploaded */
    int64_t n_storage, batch, rows, cols, ld, per, offset;
    int colmajor, batched;
} mm_tensor;

static int64_t mm_index(const mm_tensor *t, int64_t z, int64_t r, int64_t c)
{
    return t->offset + z * t->per + (t->colmajor ? c * t->ld + r : r * t->ld + c);
}

static mm_tensor mm_make(th_rng *rng, llmcl_dtype dt, int batched, int64_t batch, int64_t rows,
                         int64_t cols, int colmajor, int64_t pad, int64_t offset, const double *v)
{
    mm_tensor t = {.batch = batched ? batch : 1, .rows = rows, .cols = cols, .offset = offset,
                   .colmajor = colmajor, .batched = batched};
    t.ld = (colmajor ? rows : cols) + pad;
    t.per = (colmajor ? cols : rows) * t.ld;
    t.n_storage = offset + t.batch * t.per + 1;
    t.fill = th_alloc((size_t)t.n_storage * sizeof *t.fill);
    th_fill_uniform(rng, t.fill, (size_t)t.n_storage, -3.0, 3.0);
    th_round_all(dt, t.fill, (size_t)t.n_storage);
    for (int64_t z = 0; z < t.batch; ++z)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
                t.fill[mm_index(&t, z, r, c)] = v[(z * rows + r) * cols + c];
    t.storage = th_tensor_from(dt, 1, &t.n_storage, t.fill);
    const int64_t shape[3] = {t.batch, rows, cols};
    const int64_t strides[3] = {t.per, colmajor ? 1 : t.ld, colmajor ? t.ld : 1};
    TH_OK(llmcl_tensor_view(t.storage, batched ? 3 : 2, shape + !batched, strides + !batched,
                            offset, &t.view));
    return t;
}

static void mm_free(mm_tensor *t)
{
    llmcl_tensor_destroy(t->view);
    llmcl_tensor_destroy(t->storage);
    free(t->fill);
}

/* Values of t's view out of its storage, and a check that nothing outside the view changed. */
static double *mm_read(const mm_tensor *t)
{
    double *all = th_alloc((size_t)t->n_storage * sizeof *all);
    th_download(t->storage, all);
    bool *inside = th_alloc((size_t)t->n_storage);
    const size_t n = (size_t)(t->batch * t->rows * t->cols);
    double *v = th_alloc(n * sizeof *v);
    for (int64_t z = 0; z < t->batch; ++z)
        for (int64_t r = 0; r < t->rows; ++r)
            for (int64_t c = 0; c < t->cols; ++c) {
                const int64_t i = mm_index(t, z, r, c);
                inside[i] = true;
                v[(z * t->rows + r) * t->cols + c] = all[i];
            }
    for (int64_t i = 0; i < t->n_storage; ++i)
        if (!inside[i] && !(all[i] == t->fill[i]))
            fail_msg("storage element %lld outside the output view changed: %g -> %g",
                     (long long)i, t->fill[i], all[i]);
    free(inside);
    free(all);
    return v;
}

/* op-logical values [batch][rows][cols] from view values (transposed when trans). */
static double *op_values(const double *v, int64_t batch, int64_t rows, int64_t cols, int trans)
{
    double *o = th_alloc((size_t)(batch * rows * cols) * sizeof *o);
    for (int64_t z = 0; z < batch; ++z)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
                o[(z * rows + r) * cols + c] =
                    trans ? v[(z * cols + c) * rows + r] : v[(z * rows + r) * cols + c];
    return o;
}

/* ---- one product against the reference ---- */

typedef struct mm_case {
    int64_t m, n, k, batch;
    llmcl_dtype dt, cdt, biasdt;
    int trans_a, trans_b;
    int a_batched, b_batched;      /* with batch > 1 */
    int a_col, b_col, c_col;       /* column-major storage of the view */
    int64_t pad, offset;           /* extra per stored line, elements before each view */
    int aligned;                   /* 1: b and c at the view's offset too (else 3 and 5 further),
                                      so that 8-element aligned offsets give TMA its copies */
    double alpha, beta;
    int bias;                      /* 0 none, 1 row bias [N], 2 column bias [M] */
    int split_k;
    int addend;                    /* what beta scales: ADDEND_C (c) or a c_in below */
    llmcl_sumsq *sumsq;            /* opts.sumsq */
    int ext;                       /* 1: K goes on for k2 more in opts.a_ext and b_ext */
    int64_t k2;
} mm_case;

/* opts.c_in: none; beside c in storage of its own, laid out alike at 8 or 1 elements further
   (the kernels read it in place); laid out otherwise (copied into c first); c's own view. */
enum { ADDEND_C, ADDEND_ALIKE, ADDEND_SHIFTED, ADDEND_OTHER, ADDEND_SELF };

/*
 * Products of 16-bit inputs are exact in f32; f32 sums of K terms in any order stay within a few
 * units of 2^-24 times sqrt(K) of the largest output's sum of magnitudes (the worst case, K units,
 * never comes near with random signs); the output rounds once to its dtype.
 */
static th_tol mm_tol(const mm_case *c, double magnitude)
{
    const double sum = 6e-8 * (8.0 + 4.0 * sqrt((double)(c->k + c->k2)));
    return (th_tol){sum * magnitude + 1e-30, th_tol_for(c->cdt).rtol};
}

/*
 * The tensor of op(a)'s columns [k0, k0 + k) (a) or of op(b)'s rows [k0, k0 + k), out of the
 * operand's values joined along K (op(a) [za][m][kk], op(b) [zb][kk][n]), laid out as the case
 * asks: the first pair's operands and, for a product continued along K, the second's.
 */
static mm_tensor k_range(th_rng *rng, const mm_case *c, const double *v, int64_t kk, int64_t k0,
                         int64_t k, bool a)
{
    const int64_t z = (a ? c->a_batched : c->b_batched) ? c->batch : 1;
    const int64_t rows = a ? c->m : k, cols = a ? k : c->n;
    double *part = th_alloc((size_t)(z * rows * cols) * sizeof *part + 1);
    for (int64_t i = 0; i < z; ++i)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j)
                part[(i * rows + r) * cols + j] =
                    a ? v[(i * c->m + r) * kk + k0 + j] : v[(i * kk + k0 + r) * c->n + j];
    /* the view's shape is op's transposed where trans is set */
    const int trans = a ? c->trans_a : c->trans_b;
    double *view = op_values(part, z, trans ? cols : rows, trans ? rows : cols, trans);
    const mm_tensor t = mm_make(rng, c->dt, a ? c->a_batched : c->b_batched, c->batch,
                                trans ? cols : rows, trans ? rows : cols, a ? c->a_col : c->b_col,
                                c->pad, c->offset + (a || c->aligned ? 0 : 3), view);
    free(part);
    free(view);
    return t;
}

/* A bias of the case's dtype and length (n by row, m by column); its values in *values. */
static llmcl_tensor *mm_bias(th_rng *rng, const mm_case *c, double **values)
{
    const int64_t len = c->bias == 1 ? c->n : c->m;
    *values = th_alloc((size_t)len * sizeof **values);
    th_fill_uniform(rng, *values, (size_t)len, -4.0, 4.0);
    th_round_all(c->biasdt, *values, (size_t)len);
    return th_tensor_from(c->biasdt, 1, &len, *values);
}

/* The double reference of alpha a b + beta c_in (+ bias) over the joined K, and its tolerance
   from the largest magnitude the sums pass through. */
static double *mm_reference(const mm_case *c, const double *av, const double *bv,
                            const double *cv, const double *biasv, th_tol *tol)
{
    const int64_t b = c->batch, m = c->m, n = c->n, kk = c->k + c->k2, len = b * m * n;
    double *ref = th_alloc((size_t)len * sizeof *ref), *mag = th_alloc((size_t)len * sizeof *mag);
    memcpy(ref, cv, (size_t)len * sizeof *ref);
    matmul_ref(b, m, n, kk, c->alpha, av, c->a_batched, bv, c->b_batched, c->beta, biasv, c->bias,
               ref);
    matmul_ref_abs(b, m, n, kk, av, c->a_batched, bv, c->b_batched, mag);
    double big = 1e-30;
    for (int64_t i = 0; i < len; ++i)
        big = fmax(big, fabs(c->alpha) * mag[i] + (c->beta != 0.0 ? fabs(c->beta * cv[i]) : 0.0));
    *tol = mm_tol(c, big);
    free(mag);
    return ref;
}

/* Runs the case and returns the output values (view order) with the reference in *ref_out and
   its tolerance in *tol (neither computed where ref_out is NULL). */
static double *mm_run(const mm_case *c, uint64_t seed, double **ref_out, th_tol *tol)
{
    th_rng rng = th_rng_new(seed);
    const int64_t b = c->batch, m = c->m, n = c->n, k = c->k, k2 = c->k2, kk = k + k2;
    const int64_t za = c->a_batched ? b : 1, zb = c->b_batched ? b : 1;
    const int64_t na = za * m * kk, nb = zb * kk * n;
    /* the operands joined along K: a's columns then a_ext's, b's rows then b_ext's */
    double *av = th_alloc((size_t)na * sizeof *av), *bv = th_alloc((size_t)nb * sizeof *bv);
    double *cv = th_alloc((size_t)(b * m * n) * sizeof *cv), *biasv = NULL;
    th_fill_uniform(&rng, av, (size_t)na, -1.0, 1.0);
    th_fill_uniform(&rng, bv, (size_t)nb, -1.0, 1.0);
    th_round_all(c->dt, av, (size_t)na);
    th_round_all(c->dt, bv, (size_t)nb);
    th_fill_uniform(&rng, cv, (size_t)(b * m * n), -2.0, 2.0);
    th_round_all(c->cdt, cv, (size_t)(b * m * n));
    const bool apart = c->addend >= ADDEND_ALIKE && c->addend <= ADDEND_OTHER;
    double *c_start = th_alloc((size_t)(b * m * n) * sizeof *c_start);
    for (int64_t i = 0; i < b * m * n; ++i) /* poison what the call must not read */
        c_start[i] = c->beta == 0.0 || apart ? NAN : cv[i];

    mm_tensor ta = k_range(&rng, c, av, kk, 0, k, true), tb = k_range(&rng, c, bv, kk, 0, k, false);
    const int64_t c_off = c->offset + (c->aligned ? 0 : 5);
    mm_tensor tc = mm_make(&rng, c->cdt, b > 1, b, m, n, c->c_col, c->pad, c_off, c_start);
    mm_tensor tin = {0};
    if (apart)
        tin = mm_make(&rng, c->cdt, b > 1, b, m, n, c->c_col ^ (c->addend == ADDEND_OTHER),
                      c->pad, c_off + (c->addend == ADDEND_SHIFTED ? 1 : 8), cv);
    llmcl_tensor *bias = c->bias ? mm_bias(&rng, c, &biasv) : NULL;
    mm_tensor ta2 = {0}, tb2 = {0};
    if (c->ext) {
        ta2 = k_range(&rng, c, av, kk, k, k2, true);
        tb2 = k_range(&rng, c, bv, kk, k, k2, false);
    }
    const llmcl_matmul_opts opts = {.trans_a = c->trans_a,
                                    .trans_b = c->trans_b,
                                    .bias = bias,
                                    .bias_mode = c->bias == 2 ? LLMCL_MATMUL_BIAS_COL
                                                              : LLMCL_MATMUL_BIAS_ROW,
                                    .split_k = c->split_k,
                                    .c_in = apart                   ? tin.view
                                            : c->addend == ADDEND_SELF ? tc.view
                                                                       : NULL,
                                    .sumsq = c->sumsq,
                                    .a_ext = ta2.view,
                                    .b_ext = tb2.view};
    TH_OK(llmcl_matmul(th_ctx(), (float)c->alpha, ta.view, tb.view, (float)c->beta, tc.view, &opts));
    double *got = mm_read(&tc);
    if (apart) { /* an input: every element as it was */
        double *kept = mm_read(&tin);
        for (int64_t i = 0; i < b * m * n; ++i)
            if (!(kept[i] == cv[i]))
                fail_msg("c_in changed at %lld: %g -> %g", (long long)i, cv[i], kept[i]);
        free(kept);
        mm_free(&tin);
    }
    if (ref_out)
        *ref_out = mm_reference(c, av, bv, cv, biasv, tol);

    mm_free(&ta);
    mm_free(&tb);
    mm_free(&tc);
    if (c->ext) {
        mm_free(&ta2);
        mm_free(&tb2);
    }
    llmcl_tensor_destroy(bias);
    free(av);
    free(bv);
    free(cv);
    free(c_start);
    free(biasv);
    return got;
}

static void mm_check(const char *what, const mm_case *c, uint64_t seed)
{
    double *ref, *got;
    th_tol tol;
    got = mm_run(c, seed, &ref, &tol);
    char label[192];
    snprintf(label, sizeof label,
             "%s: %s->%s %lldx%lldx%lld%s%lld b%lld ta%d tb%d a%d%d b%d%d c%d pad%lld alpha %g "
             "beta %g bias %d split %d addend %d",
             what, llmcl_dtype_name(c->dt), llmcl_dtype_name(c->cdt), (long long)c->m,
             (long long)c->n, (long long)c->k, c->ext ? "+" : " ", (long long)c->k2,
             (long long)c->batch, c->trans_a, c->trans_b,
             c->a_batched, c->a_col, c->b_batched, c->b_col, c->c_col, (long long)c->pad, c->alpha,
             c->beta, c->bias, c->split_k, c->addend);
    TH_ASSERT_CLOSE(label, ref, got, (size_t)(c->batch * c->m * c->n), tol);
    free(ref);
    free(got);
}

static mm_case plain(llmcl_dtype dt, int64_t m, int64_t n, int64_t k)
{
    return (mm_case){.m = m, .n = n, .k = k, .batch = 1, .dt = dt, .cdt = dt, .biasdt = dt,
                     .alpha = 1.0};
}

static const llmcl_dtype float_dtypes[] = {LLMCL_F32, LLMCL_BF16, LLMCL_F16};

/* ---- tests ---- */

/* Every transpose combination and dtype at sizes that are not tile multiples, K = 1 included. */
static void test_transposes(void **state)
{
    (void)state;
    static const int64_t sizes[][3] = {{1, 1, 1}, {7, 17, 1}, {17, 7, 129}, {129, 17, 7},
                                       {33, 65, 300}};
    for (int d = 0; d < 3; ++d)
        for (int t = 0; t < 4; ++t)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
                mm_case c = plain(float_dtypes[d], sizes[s][0], sizes[s][1], sizes[s][2]);
                c.trans_a = t & 1;
                c.trans_b = t >> 1;
                c.cdt = s % 2 ? c.dt : LLMCL_F32;
                mm_check("transposes", &c, 100 + 10 * d + t + 1000 * s);
            }
}

/* alpha, beta != 0 (c read and scaled), bias along rows and columns in f32 and a's dtype. */
static void test_alpha_beta_bias(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d)
        for (int v = 0; v < 4; ++v) {
            mm_case c = plain(float_dtypes[d], 37, 45, 70);
            c.alpha = v == 0 ? 0.0 : -0.75;
            c.beta = v == 1 ? 0.0 : 1.5;
            c.bias = v % 3;
            c.biasdt = v == 3 ? LLMCL_F32 : c.dt;
            c.cdt = v % 2 ? LLMCL_F32 : c.dt;
            c.trans_b = v == 2;
            mm_check("alpha/beta/bias", &c, 200 + 10 * d + v);
        }
}

/* Padded lines, offsets, column-major views of every operand, batches and broadcast operands. */
static void test_layouts_and_batches(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d)
        for (int v = 0; v < 6; ++v) {
            mm_case c = plain(float_dtypes[d], 19 + v, 23, 41);
            c.cdt = v % 2 ? LLMCL_F32 : c.dt;
            c.pad = v % 3 == 0 ? 5 : 8;
            c.offset = v % 2 ? 8 : 3;
            c.a_col = v & 1;
            c.b_col = (v >> 1) & 1;
            c.c_col = v == 5;
            c.trans_a = v == 3;
            c.batch = v >= 2 ? 3 : 1;
            c.a_batched = c.batch > 1 && v != 4;
            c.b_batched = c.batch > 1 && v != 2;
            c.beta = v == 4 ? 0.5 : 0.0;
            c.bias = v == 5 ? 1 : 0;
            mm_check("layouts", &c, 300 + 10 * d + v);
        }
}

/* The case run twice from the same inputs: the same bits both times, close to the reference. */
static void mm_check_repeats(const char *what, const mm_case *c, uint64_t seed)
{
    double *ref, *got1, *got2;
    th_tol tol;
    got1 = mm_run(c, seed, &ref, &tol);
    got2 = mm_run(c, seed, NULL, NULL);
    const size_t n = (size_t)(c->batch * c->m * c->n);
    assert_memory_equal(got1, got2, n * sizeof *got1);
    TH_ASSERT_CLOSE(what, ref, got1, n, tol);
    free(ref);
    free(got1);
    free(got2);
}

/* Long K over few output tiles: the split-K path, explicit and automatic, against one slice and
   against itself (the same bits on every run). */
static void test_split_k(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d) {
        mm_case c = plain(float_dtypes[d], 24, 40, 4095);
        c.cdt = LLMCL_F32;
        c.beta = 0.25;
        c.bias = 2;
        c.biasdt = LLMCL_F32;
        for (int split = 0; split <= 5; split += (split ? 2 : 1)) { /* 0 (auto), 1, 3, 5 */
            c.split_k = split;
            mm_check("split-K", &c, 400 + d);
        }
        c.split_k = 3;
        c.batch = 2;
        c.a_batched = c.b_batched = 1;
        mm_check_repeats("split-K batched", &c, 450 + d);
    }
    /* The slices' sum four elements a work-item where c's rows allow it (c at offset 8 = 3 + 5),
       else one: a row bias, 16-bit outputs, the addend 8 or 1 elements further, c's views shifted
       by 1 or padded by 2 (rows no longer aligned to four), N not a multiple of 4, column-major
       c. */
    for (int v = 0; v < 8; ++v) {
        mm_case c = plain(float_dtypes[v % 3], 29, v == 5 ? 42 : 40, 600);
        c.cdt = v % 2 ? c.dt : LLMCL_F32;
        c.bias = v % 3;
        c.biasdt = LLMCL_F32;
        c.beta = v == 2 ? 0.0 : 0.5;
        c.addend = v == 1 ? ADDEND_ALIKE : v == 6 ? ADDEND_SHIFTED : ADDEND_C;
        c.offset = v == 3 ? 4 : 3;
        c.pad = v == 4 ? 2 : 0;
        c.c_col = v == 7;
        c.split_k = 3;
        mm_check("split-K sums", &c, 460 + v);
    }
    /* Many tiles' slices at once, the edge tiles' ragged rows and columns included (on wgmma
       128 x 256 tiles: 3 x 3 of them in five slices): the same bits on every run. */
    mm_case c = plain(LLMCL_BF16, 300, 530, 4100);
    c.cdt = LLMCL_F32;
    c.beta = 1.0;
    c.split_k = 5;
    mm_check_repeats("split-K tiles", &c, 470);
    /* Two to eight slices over whole tiles (on wgmma 2 x 2 of 128 x 256) by TMA and ragged ones
       by cp.async (K 4100), A transposed as a weight gradient's, f32 and 16-bit outputs, a bias,
       beta 0 and 1, two batch entries; the same bits every run. */
    static const struct {
        int64_t m, n, k;
        int split, batch;
    } splits[] = {{256, 512, 4096, 2, 1}, {256, 512, 4096, 4, 1}, {300, 530, 4100, 8, 1},
                  {130, 270, 4100, 4, 2}};
    for (int v = 0; v < 4; ++v) {
        c = plain(LLMCL_BF16, splits[v].m, splits[v].n, splits[v].k);
        c.trans_a = v == 0;
        c.cdt = v == 1 ? LLMCL_BF16 : LLMCL_F32;
        c.beta = v == 2 ? 0.0 : 1.0;
        c.bias = v == 3;
        c.biasdt = LLMCL_F32;
        c.split_k = splits[v].split;
        c.batch = splits[v].batch;
        c.a_batched = c.b_batched = splits[v].batch > 1;
        mm_check_repeats("split-K slices", &c, 480 + v);
    }
}

/*
 * opts.c_in in every form, with the bias, the K split, batches, column-major outputs and beta 0
 * (c_in checked but not read). Where the device has tensor cores the 16-bit cases run on them;
 * test_tensor_cores adds output tiles inside C.
 */
static void test_addend(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d)
        for (int v = 0; v < 8; ++v) {
            mm_case c = plain(float_dtypes[d], 37 + v, 45, 70);
            c.addend = ADDEND_ALIKE + v % 4;
            c.beta = v == 7 ? 0.0 : v % 2 ? 1.0 : -0.5;
            c.cdt = v % 3 == 1 ? LLMCL_F32 : c.dt;
            c.bias = v % 3;
            c.trans_b = v >= 4;
            c.split_k = v == 2 || v == 5 ? 3 : 0;
            c.batch = v == 1 || v == 6 ? 2 : 1;
            c.a_batched = c.b_batched = c.batch > 1;
            c.c_col = v == 4;
            c.pad = v == 3 ? 5 : 0;
            mm_check("addend", &c, 560 + 10 * d + v);
        }
}

/* Edges: a sum over K = 0 (c = beta c + bias), one row, one column, M or N of 4095. */
static void test_edges(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d) {
        mm_case c = plain(float_dtypes[d], 5, 6, 0);
        c.beta = -2.0;
        c.bias = 1;
        mm_check("K = 0", &c, 500 + d);
        c = plain(float_dtypes[d], 1, 4095, 9);
        c.trans_b = 1;
        mm_check("M = 1", &c, 510 + d);
        c = plain(float_dtypes[d], 4095, 1, 17);
        c.trans_a = 1;
        mm_check("N = 1", &c, 520 + d);
        c = plain(float_dtypes[d], 3, 2, 4095);
        mm_check("long K", &c, 530 + d);
    }
    /* empty outputs are no work and no error */
    const int64_t s0[2] = {0, 4}, s1[2] = {4, 3}, s2[2] = {0, 3};
    llmcl_tensor *a = th_tensor(LLMCL_F32, 2, s0), *b = th_tensor(LLMCL_F32, 2, s1),
                 *c = th_tensor(LLMCL_F32, 2, s2);
    TH_OK(llmcl_matmul(th_ctx(), 1.0f, a, b, 0.0f, c, NULL));
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
    llmcl_tensor_destroy(c);
}

/*
 * Vocabulary-sized K (issue 35): rusticl's llvmpipe cut the portable kernel's k loop short (bf16
 * and f16 at K = 32001 summed 9709 terms, f32 in two slices 19418 of each), so the launcher takes
 * more slices where the device cuts loops, and f32 leaves CLBlast past the limit. Tall and skinny,
 * so that it takes little time anywhere; one case on other tiles, whose loops count otherwise.
 */
static void test_long_k(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d)
        for (int split = 0; split <= 2; split += 2) {
            mm_case c = plain(float_dtypes[d], 4, 24, 32001);
            c.cdt = split ? LLMCL_F32 : c.dt;
            c.trans_a = d == 1;
            c.split_k = split;
            mm_check("K 32001", &c, 600 + 10 * d + split);
        }
    mm_case c = plain(LLMCL_F32, 3, 17, 70000);
    mm_check("K 70000", &c, 640);
    c.split_k = 2;
    mm_check("K 70000", &c, 641);
    c = plain(LLMCL_BF16, 5, 9, 70000);
    c.trans_b = 1;
    c.cdt = LLMCL_F32;
    mm_check("K 70000", &c, 642);
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", "T=16 BK=8 TM=2 TN=2"));
    c = plain(LLMCL_F32, 5, 9, 70000);
    c.split_k = 3;
    mm_check("K 70000, T 16", &c, 643);
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", NULL));
    /* a limit of 2000 (3 k-steps of 16 a slice) on any device: the forced slices, f32 past
       CLBlast, and split_k asked for below what the limit needs */
    th_loop_limit("2000");
    for (int d = 0; d < 3; ++d) {
        c = plain(float_dtypes[d], 5, 9, 1001);
        c.cdt = LLMCL_F32;
        c.beta = 0.5;
        c.bias = 1;
        c.split_k = d;
        mm_check("K 1001, limit 2000", &c, 650 + d);
    }
    th_loop_limit(NULL);
}

/* A forced tile set that cannot run is an error, not a silent substitute (a batch of 2 with
   ndim 3, else one matrix). */
static void expect_refused(const char *key, llmcl_dtype dt, int ndim, const char *params)
{
    TH_OK(llmcl_tune_override(th_ctx(), key, dt, "*", params));
    const int64_t s[3] = {2, 64, 64};
    llmcl_tensor *a = th_tensor(dt, ndim, s + 3 - ndim), *b = th_tensor(dt, ndim, s + 3 - ndim),
                 *c = th_tensor(dt, ndim, s + 3 - ndim);
    TH_FAILS(llmcl_matmul(th_ctx(), 1.0f, a, b, 0.0f, c, NULL), LLMCL_ERROR_UNSUPPORTED);
    TH_OK(llmcl_tune_override(th_ctx(), key, dt, "*", NULL));
    llmcl_tensor_destroy(a);
    llmcl_tensor_destroy(b);
    llmcl_tensor_destroy(c);
}

/* The portable kernel's tunables (f32 batches run it on every device): tiles other than the
   defaults give the same products, and a forced set that cannot run is an error. */
static void test_tiled_tunables(void **state)
{
    (void)state;
    static const char *sets[] = {"T=16 BK=8 TM=2 TN=2", "T=32 BK=32 TM=2 TN=4",
                                 "T=64 BK=16 TM=8 TN=4", "T=8 BK=8 TM=1 TN=1"};
    mm_case c = plain(LLMCL_F32, 45, 70, 33);
    c.batch = 2;
    c.a_batched = c.b_batched = 1;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; ++i) {
        TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", sets[i]));
        c.trans_a = (int)i & 1;
        c.b_col = (int)(i >> 1) & 1;
        mm_check(sets[i], &c, 600 + i);
        char buf[128], got[136], want[16];
        int tile = 0;
        th_params_used("mm_tiled", LLMCL_F32, "45", buf, sizeof buf);
        sscanf(sets[i], "T=%d", &tile);
        snprintf(want, sizeof want, " T=%d ", tile);
        snprintf(got, sizeof got, " %s ", buf);
        assert_non_null(strstr(got, want));
    }
    expect_refused("mm_tiled", LLMCL_F32, 3, "T=64 BK=16 TM=3 TN=4");
}

/* The tiles a tiled f32 product of c launches with, as llmcl_tune_params_get reports them. */
static void tiled_params_used(mm_case *c, const char *what, uint64_t seed, char *buf, size_t n)
{
    mm_check(what, c, seed);
    th_params_used("mm_tiled", LLMCL_F32, "45", buf, n);
}

/* A file's tiles that cannot run (TM 3 does not divide T 64) give way to the defaults, also beside
   an override of another tunable, which keeps its value: the tiles launched are those of no
   file. */
static void test_tiled_file_misfit(void **state)
{
    (void)state;
    mm_case c = plain(LLMCL_F32, 45, 70, 33);
    c.batch = 2;
    c.a_batched = c.b_batched = 1;
    char defaults[128], partial[128], used[128];
    tiled_params_used(&c, "defaults", 610, defaults, sizeof defaults);
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", "BK=8"));
    tiled_params_used(&c, "BK=8", 611, partial, sizeof partial);
    assert_non_null(strstr(partial, "BK=8"));
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", NULL));

    th_tune_db_load_text("{\"format\": \"llmcl-tuning\", \"version\": 1, "
                         "\"device\": {\"name\": \"*\"}, "
                         "\"entries\": [{\"kernel\": \"mm_tiled\", \"dtype\": \"f32\", "
                         "\"shape_class\": \"*\", \"params\": {\"T\": 64, \"BK\": 16, "
                         "\"TM\": 3, \"TN\": 4}}]}");
    tiled_params_used(&c, "a misfit file", 612, used, sizeof used);
    assert_string_equal(used, defaults);
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", "BK=8"));
    tiled_params_used(&c, "a misfit file and BK=8", 613, used, sizeof used);
    assert_string_equal(used, partial);
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "*", NULL));
    TH_OK(llmcl_tune_db_reset(th_ctx()));
}

/* The tuning key of a tensor-core product: wgmma's where the device has it, else mma.sync's; a
   transposed A (a weight gradient) has its own. */
static const char *mma_key(int trans_a)
{
    if (llmcl_ctx_device_info(th_ctx())->has_wgmma)
        return trans_a ? "mm_wgmma_at" : "mm_wgmma";
    return trans_a ? "mm_mma_at" : "mm_mma";
}

/* set with name's value replaced by value (appended where set lacks it), in out */
static const char *with_param(const char *set, const char *name, long value, char *out, size_t n)
{
    const size_t len = strlen(name);
    size_t used = 0;
    for (const char *tok = set; *tok;) {
        const size_t tl = strcspn(tok, " ");
        if (!(tl > len && strncmp(tok, name, len) == 0 && tok[len] == '='))
            used += (size_t)snprintf(out + used, n - used, "%.*s ", (int)tl, tok);
        tok += tl + (tok[tl] == ' ');
    }
    snprintf(out + used, n - used, "%s=%ld", name, value);
    return out;
}

/*
 * That a forced wgmma set ran as asked, with its producers (MM_WS, 1 unless the set says 0) where
 * the copies were TMA's and none where they were cp.async's: the launcher reports what runs. tma:
 * the operands suit TMA, which runs where the device has it (not under --cp-async); without it
 * the epilogue stores from the registers whatever the set asks (MM_TMA_STORE 0).
 */
static void assert_wgmma_ran(const char *key, llmcl_dtype dt, const char *cls, const char *set,
                             int tma)
{
    char ws[192], stores[192];
    tma = tma && llmcl_ctx_device_info(th_ctx())->has_tma;
    const char *want = with_param(set, "MM_WS", tma && !strstr(set, "MM_WS=0"), ws, sizeof ws);
    if (!tma && strstr(set, "MM_TMA_STORE="))
        want = with_param(ws, "MM_TMA_STORE", 0, stores, sizeof stores);
    th_assert_launched_with(key, dt, cls, want);
}

/* Forced tile sets: wgmma's (BM x BN, WG_MB blocks of 64 rows a warpgroup, STAGES), or
   mma.sync's shapes. */
static const char *const wgmma_sets[8] = {
    "BM=64 BN=256 WG_MB=1 STAGES=3",
    "BM=128 BN=256 WG_MB=1 STAGES=4 GROUP_M=3 MM_WS=1",
    "BM=256 BN=192 WG_MB=2 STAGES=4 MM_WS=1",
    "BM=128 BN=192 WG_MB=1 STAGES=5",
    "BM=128 BN=192 WG_MB=2 STAGES=3 GROUP_M=1",
    "BM=192 BN=256 WG_MB=1 STAGES=4 MM_WS=0",
    "BM=128 BN=128 WG_MB=1 STAGES=3 MM_WS=1",
    "BM=128 BN=64 WG_MB=2 STAGES=3 GROUP_M=1"};
static const char *const mma_sets[8] = {"BM=64 BN=64 BK=32 WM=2 WN=2 STAGES=2",
                                       "BM=128 BN=256 BK=32 WM=2 WN=4 STAGES=2",
                                       "BM=256 BN=128 BK=32 WM=4 WN=2 STAGES=2",
                                       "BM=64 BN=128 BK=64 WM=1 WN=4 STAGES=2",
                                       "BM=128 BN=64 BK=32 WM=4 WN=1 STAGES=4 GROUP_M=3",
                                       "BM=256 BN=128 BK=32 WM=4 WN=2 STAGES=4", /* dW's default */
                                       "BM=128 BN=128 BK=64 WM=2 WN=2 STAGES=3",
                                       "BM=64 BN=256 BK=32 WM=1 WN=4 STAGES=3"};

/*
 * wgmma's epilogue through local memory and TMA's stores (rows on 16 bytes): tiles of one to three
 * warpgroups, of one or two blocks of 64 rows, inside C and (576 rows) past it, where the edge
 * tiles store from the registers; batched, with either bias, beta and c_in, and with beta 0 over a
 * poisoned C, so that every element must be written. 16-bit C here; f32 in check_tma_stores32.
 */
static void check_tma_stores(void)
{
    static const char *const sets[] = {
        "BM=128 BN=256 WG_MB=1 STAGES=3 MM_WS=1 MM_TMA_STORE=1",
        "BM=256 BN=128 WG_MB=2 STAGES=3 MM_TMA_STORE=1",
        "BM=192 BN=192 WG_MB=1 STAGES=3 MM_WS=1 MM_TMA_STORE=1",
        "BM=128 BN=64 WG_MB=1 STAGES=4 MM_TMA_STORE=1"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; ++i) {
        mm_case c = plain(i & 1 ? LLMCL_F16 : LLMCL_BF16, 576, 768, 200);
        c.trans_b = 1;
        c.trans_a = i == 3;
        c.batch = 2;
        c.a_batched = c.b_batched = 1;
        c.bias = 1 + (int)(i & 1);
        c.beta = i & 1 ? 0.5 : 0.0;
        c.addend = i == 1 ? ADDEND_ALIKE : ADDEND_C;
        c.offset = 8; /* every operand's: TMA's copies and stores */
        c.aligned = 1;
        const char *key = mma_key(c.trans_a);
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", sets[i]));
        mm_check(sets[i], &c, 850 + i);
        assert_wgmma_ran(key, c.dt, "768", sets[i], 1);
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", NULL));
    }
}

static double sumsq_total(llmcl_sumsq *s);

/* Runs c, which sums the squares of its output into s, and checks both against the reference. */
static void mm_check_squares(const char *what, mm_case *c, llmcl_sumsq *s, uint64_t seed)
{
    c->sumsq = s;
    double *ref, *got;
    th_tol tol;
    got = mm_run(c, seed, &ref, &tol);
    TH_ASSERT_CLOSE(what, ref, got, (size_t)(c->m * c->n), tol);
    double squares = 0.0;
    for (int64_t j = 0; j < c->m * c->n; ++j)
        squares += got[j] * got[j];
    const double total = sumsq_total(s);
    TH_ASSERT_CLOSE("squares of what the epilogue stored", &squares, &total, 1,
                    (th_tol){0, 2e-5});
    free(ref);
    free(got);
}

/*
 * check_tma_stores into f32, whose tiles go through local memory in quarters of their columns (BN
 * a multiple of 128; 192 stores from the registers, and the launcher says so), with the squares
 * of what the epilogue stored (opts.sumsq) summed beside it where the tile set has no bias.
 */
static void check_tma_stores32(void)
{
    static const char *const sets[] = {
        "BM=128 BN=256 WG_MB=1 STAGES=3 MM_WS=1 MM_TMA_STORE=1",
        "BM=256 BN=128 WG_MB=2 STAGES=3 MM_TMA_STORE=1",
        "BM=128 BN=128 WG_MB=1 STAGES=4 MM_WS=1 MM_TMA_STORE=1",
        "BM=128 BN=192 WG_MB=1 STAGES=3 MM_WS=1 MM_TMA_STORE=1"};
    llmcl_sumsq *s = NULL;
    TH_OK(llmcl_sumsq_create(th_ctx(), &s));
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; ++i) {
        mm_case c = plain(LLMCL_BF16, 576, i == 2 ? 640 : 768, 200);
        c.cdt = LLMCL_F32;
        c.trans_a = i == 2; /* a weight gradient's layout */
        c.trans_b = !c.trans_a;
        c.batch = i == 1 ? 2 : 1;
        c.a_batched = c.b_batched = c.batch > 1;
        c.bias = i == 1 ? 2 : 0;
        c.beta = i & 1 ? 0.0 : 1.0;
        c.addend = i == 2 ? ADDEND_ALIKE : ADDEND_C;
        c.offset = 8;
        c.aligned = 1;
        const char *key = mma_key(c.trans_a);
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", sets[i]));
        if (c.bias)
            mm_check(sets[i], &c, 860 + i);
        else
            mm_check_squares(sets[i], &c, s, 860 + i);
        char cls[16], unstored[192];
        TH_OK(llmcl_tune_shape_class(c.n > c.m ? c.n : c.m, cls));
        const char *want =
            i == 3 ? with_param(sets[i], "MM_TMA_STORE", 0, unstored, sizeof unstored) : sets[i];
        assert_wgmma_ran(key, c.dt, cls, want, 1);
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", NULL));
    }
    llmcl_sumsq_destroy(s);
}

/*
 * wgmma's accumulators started from beta C_in (MM_PRELOAD): large and small tiles asked for it
 * (128 x 256 also with an f32 C stored by TMA, beside a producer warpgroup), by TMA's copies and
 * by cp.async's, tiles past C's rows and columns (an odd N in rows padded to
 * an even stride, the last pair's single element), a weight gradient's transposed A into f32,
 * 16-bit outputs with an addend apart and a batch; where alpha is 2 or the addend's pairs are
 * not aligned the launcher refuses it, and the epilogue adds beta C_in as before. The launcher
 * reports which it ran. f32 outputs also sum their squares in the epilogue (opts.sumsq).
 */
static void check_preload(void)
{
    llmcl_sumsq *s = NULL;
    TH_OK(llmcl_sumsq_create(th_ctx(), &s));
    static const char *const sets[] = {
        "BM=256 BN=192 WG_MB=2 STAGES=4 MM_WS=1 MM_PRELOAD=1",
        "BM=128 BN=256 WG_MB=1 STAGES=4 MM_WS=1 MM_PRELOAD=1",
        "BM=128 BN=256 WG_MB=1 STAGES=3 MM_WS=1 MM_TMA_STORE=1 MM_PRELOAD=1"};
    for (int i = 0; i < 8; ++i) {
        mm_case c = plain(LLMCL_BF16, 576, i & 2 ? 701 : 768, 200);
        c.trans_a = i < 4;
        c.trans_b = i >= 4;
        c.cdt = i < 4 ? LLMCL_F32 : LLMCL_BF16;
        c.beta = i & 4 ? -0.5 : 1.0;
        c.pad = i & 2 ? 3 : 0;
        c.aligned = !(i & 2); /* TMA's copies where the lines are not padded */
        c.offset = c.aligned ? 8 : 1; /* C 5 further: its pairs aligned either way */
        c.alpha = i == 7 ? 2.0 : 1.0;
        c.addend = i == 5 ? ADDEND_ALIKE : i == 6 ? ADDEND_SHIFTED : ADDEND_C;
        if (i == 4) {
            c.batch = 2;
            c.a_batched = c.b_batched = 1;
        }
        const char *key = mma_key(c.trans_a), *set = i == 1 ? sets[2] : sets[i & 1];
        char cls[16];
        TH_OK(llmcl_tune_shape_class(c.n > c.m ? c.n : c.m, cls));
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", set));
        if (c.cdt == LLMCL_F32 && c.pad == 0) /* the epilogue's squares of what it stored */
            mm_check_squares(set, &c, s, 870 + (uint64_t)i);
        else
            mm_check(set, &c, 870 + (uint64_t)i);
        char want[160];
        assert_wgmma_ran(key, c.dt, cls, with_param(set, "MM_PRELOAD", i < 6, want, sizeof want),
                         c.aligned);
        TH_OK(llmcl_tune_override(th_ctx(), key, c.dt, "*", NULL));
    }
    llmcl_sumsq_destroy(s);
}

static void test_preload(void **state)
{
    (void)state;
    if (!llmcl_ctx_device_info(th_ctx())->has_wgmma)
        skip();
    check_preload();
}

/* Thin outputs are classed by their thin side: tiles forced at 8192's class do not reach an
   8192 x 16 product, and do reach 8192 x 100. */
static void test_thin_class(void **state)
{
    (void)state;
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "8192", "T=16 BK=8 TM=1 TN=1"));
    static const int64_t widths[] = {16, 100};
    for (int i = 0; i < 2; ++i) {
        mm_case c = plain(LLMCL_F32, 8192, widths[i], 24);
        c.batch = 2;
        c.a_batched = c.b_batched = 1;
        mm_check("thin class", &c, 640 + i);
        char buf[128], got[136];
        th_params_used("mm_tiled", LLMCL_F32, i == 0 ? "16" : "8192", buf, sizeof buf);
        snprintf(got, sizeof got, " %s ", buf);
        if (i == 0)
            assert_null(strstr(got, " T=16 "));
        else
            assert_non_null(strstr(got, " T=16 "));
    }
    TH_OK(llmcl_tune_override(th_ctx(), "mm_tiled", LLMCL_F32, "8192", NULL));
}

/* wgmma's thin tiles for outputs at most 64 wide or tall (LoRA's products): x A^T, and the two
   weight gradients; 64 x 64 where the long side's tiles fill half the device and K is short. */
static void check_thin_tiles(void)
{
    /* the shortest long side whose 64-wide tiles fill half the compute units */
    const int64_t fills = 64 * ((llmcl_ctx_device_info(th_ctx())->compute_units + 1) / 2);
    const struct {
        int64_t m, n, k;
        int trans_a;
        const char *tiles;
    } thin[] = {{300, 16, 2100, 0, "BM=128 BN=64 WG_MB=1 STAGES=4"},
                {300, 48, 2100, 1, "BM=128 BN=64 WG_MB=1 STAGES=4"},
                {16, 300, 2100, 1, "BM=64 BN=128 WG_MB=1 STAGES=4"},
                {40, 24, 2100, 0, "BM=64 BN=64 WG_MB=1 STAGES=6"},
                {fills, 16, 600, 0, "BM=64 BN=64 WG_MB=1 STAGES=6"},
                {fills - 64, 48, 600, 1, "BM=128 BN=64 WG_MB=1 STAGES=4"},
                {48, fills + 1, 600, 1, "BM=64 BN=64 WG_MB=1 STAGES=6"},
                {fills, 16, 4160, 0, "BM=128 BN=64 WG_MB=1 STAGES=4"}};
    /* each by cp.async's copies, then with sizes rounded up to 8 and every operand at an aligned
       offset, by TMA's */
    const size_t cases = sizeof thin / sizeof thin[0];
    for (size_t i = 0; i < 2 * cases; ++i) {
        const int aligned = i >= cases, r = aligned ? 7 : 0;
        mm_case c = plain(LLMCL_BF16, (thin[i % cases].m + r) & ~r, (thin[i % cases].n + r) & ~r,
                          (thin[i % cases].k + r) & ~r);
        c.aligned = aligned;
        c.offset = aligned ? 8 : 0;
        c.trans_a = thin[i % cases].trans_a;
        c.trans_b = !c.trans_a;
        c.cdt = c.trans_a ? LLMCL_F32 : LLMCL_BF16;
        c.beta = c.trans_a ? 1.0 : 0.0;
        mm_check(thin[i % cases].tiles, &c, 880 + (int)i);
        char size[16]; /* thin products are classed by their thin side */
        snprintf(size, sizeof size, "%lld", (long long)(c.m < c.n ? c.m : c.n));
        assert_wgmma_ran(mma_key(c.trans_a), LLMCL_BF16, size, thin[i % cases].tiles, aligned);
    }
    /* k-major thin sides that are no multiple of 8, aligned for TMA's copies (which take boxes
       of the side rounded up to 8 rows, not the tile's; a box one row short would leave C's last
       column or row stale); the path is not asserted, since these shapes' tiles are the
       launcher's choice */
    const int64_t odd[][3] = {
        {fills, 17, 600}, {300, 41, 2104}, {17, 300, 600}, {40, 23, 2104}, {9, 1, 64}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; ++i) {
        mm_case c = plain(LLMCL_BF16, odd[i][0], odd[i][1], odd[i][2]);
        c.aligned = 1;
        c.offset = 8;
        c.trans_b = 1;
        c.cdt = LLMCL_F32;
        mm_check("k-major thin sides by TMA", &c, 960 + (int)i);
    }
}

/* Every layout and dtype at sizes that cross tile edges, odd leading strides among them
   (operands that cp.async cannot move). */
static void tensor_core_layouts(void)
{
    static const int64_t sizes[][3] = {{257, 129, 1000}, {128, 128, 32}, {300, 77, 77}};
    for (int d = 1; d < 3; ++d)
        for (int t = 0; t < 4; ++t)
            for (int s = 0; s < 3; ++s) {
                mm_case c = plain(float_dtypes[d], sizes[s][0], sizes[s][1], sizes[s][2]);
                c.trans_a = t & 1;
                c.trans_b = t >> 1;
                c.cdt = s == 1 ? c.dt : LLMCL_F32;
                c.pad = s == 2 ? 3 : 0;
                c.split_k = 1;
                mm_check("tensor cores", &c, 700 + 100 * d + 10 * t + s);
                if (s == 0)
                    assert_int_equal(th_launched(mma_key(c.trans_a), c.dt, "257"), 1);
            }
}

/* Output tiles inside C: 16-bit rows 8-element aligned (C's offset is the case's plus 5), where
   wgmma's epilogue trades pairs across each quad to store 8 columns a lane, with biases and beta;
   16-bit rows only 2-element aligned, f32 rows and the K split's raw sums (the pairs' stores). */
static void tensor_core_tiles_inside_c(void)
{
    static const struct {
        int dt, f32_out, bias, split;
        double beta;
        int64_t offset;
        int addend;
    } inside[] = {{1, 0, 1, 1, 0.0, 3, ADDEND_C},       {2, 0, 1, 1, 0.5, 3, ADDEND_C},
                  {1, 0, 2, 1, 0.0, 3, ADDEND_C},       {2, 0, 2, 1, 0.5, 5, ADDEND_C},
                  {1, 1, 0, 1, 1.0, 3, ADDEND_C},       {2, 1, 1, 1, 0.5, 3, ADDEND_C},
                  {1, 1, 2, 1, 0.0, 7, ADDEND_C},       {1, 1, 0, 3, 1.0, 3, ADDEND_C},
                  {2, 0, 1, 2, 0.0, 3, ADDEND_C},       {1, 0, 0, 1, 1.0, 3, ADDEND_ALIKE},
                  {1, 0, 1, 1, 1.0, 3, ADDEND_SHIFTED}, {2, 1, 0, 1, 0.5, 3, ADDEND_SHIFTED},
                  {1, 1, 2, 3, 1.0, 3, ADDEND_ALIKE},   {1, 0, 0, 1, 1.0, 3, ADDEND_OTHER},
                  {2, 0, 0, 1, 1.0, 3, ADDEND_SELF}};
    for (size_t v = 0; v < sizeof inside / sizeof inside[0]; ++v) {
        mm_case c = plain(float_dtypes[inside[v].dt], 512, 768, 96);
        c.trans_b = 1;
        c.cdt = inside[v].f32_out ? LLMCL_F32 : c.dt;
        c.bias = inside[v].bias;
        c.beta = inside[v].beta;
        c.split_k = inside[v].split;
        c.offset = inside[v].offset;
        c.addend = inside[v].addend;
        mm_check("output tiles inside C", &c, 760 + (int)v);
    }
}

/* Each tile set by cp.async's copies (B and C 3 and 5 elements off A), then with every operand's
   lines and offsets on 16 bytes, where wgmma's copies are TMA's (MM_WS only runs there). */
static void tensor_core_sets(bool wgmma)
{
    const char *const *sets = wgmma ? wgmma_sets : mma_sets;
    for (size_t i = 0; i < 2 * (sizeof mma_sets / sizeof mma_sets[0]); ++i) {
        const int aligned = (int)i >= 8, set = (int)i % 8;
        mm_case c = aligned ? plain(LLMCL_BF16, 344, 648, 200) : plain(LLMCL_BF16, 333, 650, 200);
        c.aligned = aligned;
        c.offset = aligned ? 8 : 0;
        c.trans_a = set & 1;
        const char *key = mma_key(c.trans_a);
        TH_OK(llmcl_tune_override(th_ctx(), key, LLMCL_BF16, "*", sets[set]));
        c.trans_b = (set >> 1) & 1;
        c.cdt = LLMCL_F32;
        c.split_k = 1;
        mm_check(sets[set], &c, 800 + i);
        if (wgmma)
            assert_wgmma_ran(key, LLMCL_BF16, "650", sets[set], aligned);
        else
            th_assert_launched_with(key, LLMCL_BF16, "650", sets[set]);
        TH_OK(llmcl_tune_override(th_ctx(), key, LLMCL_BF16, "*", NULL));
    }
}

/* Tile sets past the device's shared memory or registers: refused. */
static void tensor_core_refusals(bool wgmma)
{
    if (!wgmma) {
        expect_refused("mm_mma", LLMCL_BF16, 2, "BM=256 BN=256 BK=64 WM=2 WN=2 STAGES=4");
        return;
    }
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=256 BN=256 WG_MB=1 STAGES=3");
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=128 BN=256 WG_MB=1 STAGES=2");
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=192 BN=256 WG_MB=1 STAGES=5"); /* 280 KiB */
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=256 BN=256 WG_MB=2 STAGES=3"); /* 256 acc */
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=128 BN=160 WG_MB=1 STAGES=3");
    /* three warpgroups of 128 accumulators a lane beside a producer warp: 128 registers */
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=192 BN=256 WG_MB=1 STAGES=3 MM_WS=1");
    expect_refused("mm_wgmma", LLMCL_BF16, 2, "BM=128 BN=256 WG_MB=1 STAGES=4 MM_WS=2");
}

/* The tensor-core path (NVIDIA sm_80+; wgmma on sm_90, mma.sync when the suite runs again with
   LLMCL_WGMMA=0). */
static void test_tensor_cores(void **state)
{
    (void)state;
    if (!llmcl_ctx_device_info(th_ctx())->has_mma) {
        print_message("no tensor cores on this device: the portable path ran the other tests\n");
        skip();
    }
    const bool wgmma = llmcl_ctx_device_info(th_ctx())->has_wgmma;
    tensor_core_layouts();
    tensor_core_tiles_inside_c();
    tensor_core_sets(wgmma);
    if (wgmma) {
        check_tma_stores();
        check_tma_stores32();
        check_thin_tiles();
    }
    tensor_core_refusals(wgmma);
}

/* sqrt of the norm of what s gathered, as the device sums it (s is then empty) */
static double sumsq_total(llmcl_sumsq *s)
{
    const int64_t one = 1;
    llmcl_tensor *out = th_tensor(LLMCL_F32, 1, &one);
    th_poison(out);
    TH_OK(llmcl_grad_norm_sumsq(th_ctx(), s, NULL, 0, 1, out));
    double v;
    th_download(out, &v);
    llmcl_tensor_destroy(out);
    return v;
}

/*
 * opts.sumsq over several products into one accumulator: f32 outputs of 16-bit inputs (wgmma's
 * epilogue where the device has it: edge tiles, a weight gradient's transposed A, a batch, beta
 * with an addend, a bias), and the paths that sum c after the product (the K split, a 16-bit c,
 * f32 inputs). Against the double sum of the squares of the values c received; each product
 * against the reference; the same calls repeat bit for bit; a reset forgets.
 */
static void test_sumsq(void **state)
{
    (void)state;
    mm_case cases[8];
    for (int i = 0; i < 8; ++i) {
        static const int64_t sz[8][3] = {{257, 129, 1000}, {512, 768, 96}, {300, 77, 77},
                                         {128, 384, 2000}, {200, 300, 64}, {512, 768, 96},
                                         {37, 45, 70},     {1, 1, 3}};
        cases[i] = plain(i == 6 ? LLMCL_F32 : i == 4 ? LLMCL_F16 : LLMCL_BF16, sz[i][0],
                         sz[i][1], sz[i][2]);
        cases[i].cdt = i == 5 ? LLMCL_BF16 : LLMCL_F32;
        cases[i].split_k = i == 3 ? 3 : 1;
    }
    cases[0].trans_a = 1;
    cases[1].trans_b = 1;
    cases[1].beta = 1.0;
    cases[1].addend = ADDEND_ALIKE;
    cases[2].batch = 2;
    cases[2].a_batched = cases[2].b_batched = 1;
    cases[4].alpha = -0.5;
    cases[4].bias = 1;
    cases[4].biasdt = LLMCL_F32;
    double totals[2];
    llmcl_sumsq *s = NULL;
    TH_OK(llmcl_sumsq_create(th_ctx(), &s));
    for (int run = 0; run < 2; ++run) {
        double want = 0.0;
        for (int i = 0; i < 8; ++i) {
            cases[i].sumsq = s;
            double *ref;
            th_tol tol;
            double *got = mm_run(&cases[i], 1200 + i, &ref, &tol);
            const size_t n = (size_t)(cases[i].batch * cases[i].m * cases[i].n);
            TH_ASSERT_CLOSE("sumsq's product", ref, got, n, tol);
            for (size_t j = 0; j < n; ++j)
                want += got[j] * got[j];
            free(ref);
            free(got);
        }
        totals[run] = sumsq_total(s);
        TH_ASSERT_CLOSE("sum of squares of the products", &want, &totals[run], 1,
                        (th_tol){0, 2e-5});
        assert_true(sumsq_total(s) == 0.0); /* the sum emptied it */
    }
    assert_true(totals[0] == totals[1]);
    cases[2].sumsq = s;
    double *ref, *got;
    th_tol tol;
    got = mm_run(&cases[2], 1202, &ref, &tol);
    free(ref);
    free(got);
    llmcl_sumsq_reset(s);
    assert_true(sumsq_total(s) == 0.0);
    llmcl_sumsq_destroy(s);
    llmcl_sumsq_destroy(NULL);
}

/*
 * The accumulator grows past its first storage with partials in it (grad_norm's chunks of 32:
 * a product's 53 partials, then 6250 of one tensor), and its sum covers both.
 */
static void test_sumsq_growth(void **state)
{
    (void)state;
    TH_OK(llmcl_tune_override(th_ctx(), "grad_norm", LLMCL_F32, "*", "WG=8 UNROLL=1 GPC=1"));
    TH_OK(llmcl_tune_override(th_ctx(), "grad_norm", LLMCL_BF16, "*", "WG=8 UNROLL=1 GPC=1"));
    llmcl_sumsq *s = NULL;
    TH_OK(llmcl_sumsq_create(th_ctx(), &s));
    mm_case c = plain(LLMCL_F32, 37, 45, 70);
    c.sumsq = s;
    double *ref, *got, want = 0.0;
    th_tol tol;
    got = mm_run(&c, 1300, &ref, &tol);
    for (int i = 0; i < 37 * 45; ++i)
        want += got[i] * got[i];
    free(ref);
    free(got);
    const int64_t big = 200000, one = 1;
    double *x = th_alloc((size_t)big * sizeof *x);
    th_rng r = th_rng_new(1301);
    th_fill_uniform(&r, x, (size_t)big, -1.0, 1.0);
    for (int64_t i = 0; i < big; ++i)
        want += x[i] * x[i];
    llmcl_tensor *g = th_tensor_from(LLMCL_F32, 1, &big, x), *out = th_tensor(LLMCL_F32, 1, &one);
    const llmcl_tensor *list[] = {g};
    th_poison(out);
    TH_OK(llmcl_grad_norm_sumsq(th_ctx(), s, list, 1, 0, out));
    double norm;
    th_download(out, &norm);
    want = sqrt(want);
    TH_ASSERT_CLOSE("norm over a grown accumulator", &want, &norm, 1, (th_tol){0, 2e-5});
    TH_OK(llmcl_tune_override(th_ctx(), "grad_norm", LLMCL_F32, "*", NULL));
    TH_OK(llmcl_tune_override(th_ctx(), "grad_norm", LLMCL_BF16, "*", NULL));
    llmcl_sumsq_destroy(s);
    llmcl_tensor_destroy(g);
    llmcl_tensor_destroy(out);
    free(x);
}

/* ---- bad input: a clear status, and c untouched ---- */

/*
 * The product continued along K (opts.a_ext, b_ext) against the double reference of one product
 * over the joined operands, at one rounding of c on every path: every dtype and transpose with
 * alpha, beta, the bias and f32 outputs at sizes off the tiles (the operands joined in scratch);
 * K2 of 0 and a first K of 0; batches (a 2-D pair repeated) and a K split; then 16-bit operands
 * whose rows suit TMA, which on a GPU with it take the second pair in one mm_wgmma walk (MM_EXT,
 * asserted there) in LoRA's forms: y = x W^T + u B^T with a residual addend and dx = dy W + du A.
 */
static void test_k_ext(void **state)
{
    (void)state;
    for (int d = 0; d < 3; ++d)
        for (int t = 0; t < 4; ++t) {
            mm_case c = plain(float_dtypes[d], 37, 29, 45);
            c.ext = 1;
            c.k2 = 19;
            c.trans_a = t & 1;
            c.trans_b = t >> 1;
            c.alpha = t == 2 ? 1.0 : -0.75;
            c.beta = t % 2 ? 0.5 : 0.0;
            c.bias = t % 3;
            c.cdt = t == 3 ? LLMCL_F32 : c.dt;
            mm_check("K extension", &c, 1300 + 10 * d + t);
        }
    for (int v = 0; v < 4; ++v) {
        mm_case c = plain(float_dtypes[v % 3], 21, 33, v == 1 ? 0 : 40);
        c.ext = 1;
        c.k2 = v == 0 ? 0 : 23;
        c.beta = 1.0;
        c.batch = v == 2 ? 3 : 1;
        c.a_batched = v == 2;
        c.b_batched = v == 2;
        c.split_k = v == 3 ? 3 : 0;
        c.k = v == 3 ? 2100 : c.k;
        c.cdt = LLMCL_F32;
        mm_check("K extension edges", &c, 1350 + v);
    }
    const llmcl_device_info *info = llmcl_ctx_device_info(th_ctx());
    for (int v = 0; v < 9; ++v) {
        /* the last: more tiles than work-groups, so that each walks several */
        const bool forward = v % 2 == 0, many = v == 8;
        mm_case c = plain(v < 6 || many ? LLMCL_BF16 : LLMCL_F16, many ? 8192 : 304,
                          forward ? (many ? 640 : 264) : 256, forward ? (many ? 128 : 256) : 264);
        c.ext = 1;
        c.k2 = v % 4 < 2 ? 16 : 48;
        c.aligned = 1;
        c.offset = 8;
        c.trans_b = forward;
        c.trans_a = v == 5;
        c.beta = forward ? 1.0 : (v == 3 ? 1.0 : 0.0);
        c.addend = forward && v != 4 ? ADDEND_ALIKE : ADDEND_C;
        c.bias = v == 4 ? 1 : 0;
        c.cdt = v == 5 ? LLMCL_F32 : c.dt;
        c.alpha = v == 2 ? 0.5 : 1.0;
        mm_check(forward ? "K extension, LoRA's forward" : "K extension, LoRA's dx", &c,
                 1360 + v);
        if (info->has_wgmma && info->has_tma && c.dt == LLMCL_BF16)
            th_assert_launched_with(mma_key(c.trans_a), c.dt, many ? "8192" : "304", "MM_EXT=1");
    }
}

/* The product every bad-input case starts from, a (4 x 5) b (5 x 3) into c, and c's values, which
   no refused call may change. */
typedef struct bad_env {
    llmcl_ctx *ctx;
    llmcl_tensor *a, *b, *c;
    double *before;
    size_t n;
} bad_env;

/* got is want, with a message in llmcl_last_error(errs), and c as it was. */
static void expect_fail_in(bad_env *e, const llmcl_ctx *errs, llmcl_status want, llmcl_status got,
                           const char *what)
{
    if (got != want)
        fail_msg("%s: expected %s, got %s (%s)", what, llmcl_status_str(want),
                 llmcl_status_str(got), llmcl_last_error(errs));
    assert_true(strlen(llmcl_last_error(errs)) > 0);
    double *after = th_alloc(e->n * sizeof *after);
    th_download(e->c, after);
    for (size_t i = 0; i < e->n; ++i)
        if (!(after[i] == e->before[i]))
            fail_msg("%s: c changed at %zu", what, i);
    free(after);
}

static void expect_fail(bad_env *e, llmcl_status want, llmcl_status got, const char *what)
{
    expect_fail_in(e, th_ctx(), want, got, what);
}

static void destroy_all(llmcl_tensor **ts, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        llmcl_tensor_destroy(ts[i]);
}

/* No context or operand, inner dims, dtypes, ranks and batches that do not match, bad options. */
static void bad_operands(bad_env *e)
{
    llmcl_ctx *ctx = e->ctx;
    llmcl_tensor *a = e->a, *b = e->b, *c = e->c;
    const int64_t s45[2] = {4, 5}, s53[2] = {5, 3}, s63[2] = {6, 3}, s43[2] = {4, 3};
    const int64_t s243[3] = {2, 4, 3}, s345[3] = {3, 4, 5}, s4d[4] = {1, 1, 4, 3};
    llmcl_tensor *b63 = th_tensor(LLMCL_F32, 2, s63), *bbf = th_tensor(LLMCL_BF16, 2, s53);
    llmcl_tensor *abf = th_tensor(LLMCL_BF16, 2, s45), *ai = th_tensor(LLMCL_I32, 2, s45);
    llmcl_tensor *c3 = th_tensor(LLMCL_F32, 3, s243), *a3 = th_tensor(LLMCL_F32, 3, s345);
    llmcl_tensor *c4 = th_tensor(LLMCL_F32, 4, s4d);
    llmcl_tensor *cf16 = th_tensor(LLMCL_F16, 2, s43);

    /* without a context the message is the thread's, llmcl_last_error(NULL) */
    expect_fail_in(e, NULL, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(NULL, 1, a, b, 0, c, NULL),
                   "NULL ctx");
    assert_non_null(strstr(llmcl_last_error(NULL), "ctx must not be NULL"));
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, NULL, b, 0, c, NULL),
                "NULL a");
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, a, b63, 0, c, NULL),
                "inner dims");
    llmcl_matmul_opts tr = {.trans_a = 1};
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, a, b, 0, c, &tr),
                "transposed inner dims");
    expect_fail(e, LLMCL_ERROR_UNSUPPORTED_DTYPE, llmcl_matmul(ctx, 1, a, bbf, 0, c, NULL),
                "f32 x bf16");
    expect_fail(e, LLMCL_ERROR_UNSUPPORTED_DTYPE, llmcl_matmul(ctx, 1, ai, b, 0, c, NULL), "i32 a");
    /* f16 c for bf16 */
    TH_FAILS(llmcl_matmul(ctx, 1, abf, bbf, 0, cf16, NULL), LLMCL_ERROR_UNSUPPORTED_DTYPE);
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, a3, b, 0, c, NULL),
                "batched a, 2-D c");
    TH_FAILS(llmcl_matmul(ctx, 1, a3, b, 0, c3, NULL), LLMCL_ERROR_SHAPE_MISMATCH); /* batch 3, 2 */
    TH_FAILS(llmcl_matmul(ctx, 1, a, b, 0, c4, NULL), LLMCL_ERROR_SHAPE_MISMATCH);  /* 4-D c */
    llmcl_matmul_opts bad = {.trans_a = 2};
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, a, b, 0, c, &bad),
                "trans_a 2");
    bad = (llmcl_matmul_opts){.split_k = -1};
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, a, b, 0, c, &bad),
                "split_k -1");
    llmcl_tensor *made[] = {b63, bbf, abf, ai, c3, a3, c4, cf16};
    destroy_all(made, sizeof made / sizeof *made);
}

/* Biases of the wrong length, dtype, rank or mode. */
static void bad_bias(bad_env *e)
{
    llmcl_ctx *ctx = e->ctx;
    const int64_t n4 = 4, n3 = 3;
    llmcl_tensor *bias4 = th_tensor(LLMCL_F32, 1, &n4), *bias3h = th_tensor(LLMCL_F16, 1, &n3);
    llmcl_matmul_opts bad = {.bias = bias4};
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, e->a, e->b, 0, e->c, &bad),
                "row bias of M");
    bad = (llmcl_matmul_opts){.bias = bias3h};
    expect_fail(e, LLMCL_ERROR_UNSUPPORTED_DTYPE, llmcl_matmul(ctx, 1, e->a, e->b, 0, e->c, &bad),
                "f16 bias, f32 a");
    bad = (llmcl_matmul_opts){.bias = bias4, .bias_mode = (llmcl_matmul_bias)7};
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, e->a, e->b, 0, e->c, &bad),
                "bias_mode 7");
    bad = (llmcl_matmul_opts){.bias = e->c};
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, e->a, e->b, 0, e->c, &bad),
                "2-D bias");
    llmcl_tensor_destroy(bias4);
    llmcl_tensor_destroy(bias3h);
}

/* Addends of another dtype or shape (checked with beta 0 too), or sharing c's storage without
   being c's view; c's own view is c, and that product's c is the one later cases keep. */
static void bad_addends(bad_env *e)
{
    llmcl_ctx *ctx = e->ctx;
    llmcl_tensor *a = e->a, *b = e->b, *c = e->c;
    const int64_t s33[2] = {3, 3}, s35[2] = {3, 5}, s43[2] = {4, 3}, s53[2] = {5, 3};
    const int64_t s243[3] = {2, 4, 3};
    llmcl_tensor *in_bf = th_tensor(LLMCL_BF16, 2, s43), *in_53 = th_tensor(LLMCL_F32, 2, s53);
    llmcl_tensor *c3 = th_tensor(LLMCL_F32, 3, s243);
    llmcl_tensor *a35 = th_tensor(LLMCL_F32, 2, s35), *c_top = NULL, *c_low = NULL;
    llmcl_matmul_opts bad = {.c_in = in_bf};
    expect_fail(e, LLMCL_ERROR_UNSUPPORTED_DTYPE, llmcl_matmul(ctx, 1, a, b, 1, c, &bad),
                "bf16 c_in, f32 c");
    bad = (llmcl_matmul_opts){.c_in = in_53};
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, a, b, 1, c, &bad),
                "c_in of 5 x 3");
    bad = (llmcl_matmul_opts){.c_in = c3};
    expect_fail(e, LLMCL_ERROR_SHAPE_MISMATCH, llmcl_matmul(ctx, 1, a, b, 0, c, &bad),
                "3-D c_in, beta 0");
    TH_OK(llmcl_tensor_view(c, 2, s33, NULL, 0, &c_top));
    TH_OK(llmcl_tensor_view(c, 2, s33, NULL, 3, &c_low));
    bad = (llmcl_matmul_opts){.c_in = c_low}; /* c's rows 1-3 as the addend of rows 0-2 */
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, a35, b, 1, c_top, &bad),
                "c_in overlapping c");
    bad = (llmcl_matmul_opts){.c_in = c};
    TH_OK(llmcl_matmul(ctx, 1, a, b, 1, c, &bad));
    th_download(c, e->before);
    llmcl_tensor *made[] = {in_bf, in_53, c3, a35, c_top, c_low};
    destroy_all(made, sizeof made / sizeof *made);
}

/* The product continued along K: one of the pair alone, K2, M or N that do not match, another
   dtype, a batched a_ext for a 2-D c, an a_ext inside c. */
static void bad_continuation(bad_env *e)
{
    const int64_t s42[2] = {4, 2}, s23e[2] = {2, 3}, s33e[2] = {3, 3}, s52[2] = {5, 2};
    const int64_t s24[2] = {2, 4}, s242[3] = {2, 4, 2};
    llmcl_tensor *x42 = th_tensor(LLMCL_F32, 2, s42), *x23 = th_tensor(LLMCL_F32, 2, s23e);
    llmcl_tensor *x33 = th_tensor(LLMCL_F32, 2, s33e), *x52 = th_tensor(LLMCL_F32, 2, s52);
    llmcl_tensor *x24 = th_tensor(LLMCL_F32, 2, s24), *x42h = th_tensor(LLMCL_BF16, 2, s42);
    llmcl_tensor *x242 = th_tensor(LLMCL_F32, 3, s242), *c_cols = NULL;
    const int64_t c_col_strides[2] = {3, 1};
    TH_OK(llmcl_tensor_view(e->c, 2, s42, c_col_strides, 0, &c_cols));
    const struct {
        const llmcl_tensor *ae, *be;
        llmcl_status want;
        const char *what;
    } ext_bad[] = {{x42, NULL, LLMCL_ERROR_INVALID_ARGUMENT, "a_ext without b_ext"},
                   {NULL, x23, LLMCL_ERROR_INVALID_ARGUMENT, "b_ext without a_ext"},
                   {x42, x33, LLMCL_ERROR_SHAPE_MISMATCH, "b_ext of K2 3 for a_ext's 2"},
                   {x52, x23, LLMCL_ERROR_SHAPE_MISMATCH, "a_ext of 5 rows for M 4"},
                   {x42, x24, LLMCL_ERROR_SHAPE_MISMATCH, "b_ext of 4 columns for N 3"},
                   {x42h, x23, LLMCL_ERROR_UNSUPPORTED_DTYPE, "bf16 a_ext, f32 a"},
                   {x242, x23, LLMCL_ERROR_SHAPE_MISMATCH, "batched a_ext, 2-D c"},
                   {c_cols, x23, LLMCL_ERROR_INVALID_ARGUMENT, "a_ext inside c"}};
    for (size_t i = 0; i < sizeof ext_bad / sizeof ext_bad[0]; ++i) {
        llmcl_matmul_opts bad = {.a_ext = ext_bad[i].ae, .b_ext = ext_bad[i].be};
        expect_fail(e, ext_bad[i].want, llmcl_matmul(e->ctx, 1, e->a, e->b, 1, e->c, &bad),
                    ext_bad[i].what);
    }
    llmcl_tensor *made[] = {x42, x23, x33, x52, x24, x42h, x242, c_cols};
    destroy_all(made, sizeof made / sizeof *made);
}

/* Outputs that overlap an input or themselves, and sizes past the kernels' 32-bit tile counts. */
static void bad_overlaps_and_sizes(bad_env *e)
{
    llmcl_ctx *ctx = e->ctx;
    const int64_t sq[2] = {4, 4}, s43[2] = {4, 3};
    llmcl_tensor *sqa = th_tensor(LLMCL_F32, 2, sq), *sqb = th_tensor(LLMCL_F32, 2, sq);
    llmcl_tensor *alias = NULL;
    TH_OK(llmcl_tensor_view(sqa, 2, sq, NULL, 0, &alias));
    TH_FAILS(llmcl_matmul(ctx, 1, sqa, sqb, 0, alias, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    TH_FAILS(llmcl_matmul(ctx, 1, sqa, sqb, 0, sqb, NULL), LLMCL_ERROR_INVALID_ARGUMENT);
    llmcl_tensor *row0 = NULL;
    const int64_t zero_stride[2] = {0, 1};
    TH_OK(llmcl_tensor_view(e->c, 2, s43, zero_stride, 0, &row0));
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT, llmcl_matmul(ctx, 1, e->a, e->b, 0, row0, NULL),
                "c with stride 0");

    const int64_t huge[2] = {(int64_t)1 << 31, 1}, one[2] = {1, 1}, hstr[2] = {0, 0};
    llmcl_tensor *ha = NULL, *hc = NULL, *ob = th_tensor(LLMCL_F32, 2, one);
    TH_OK(llmcl_tensor_view(e->a, 2, huge, hstr, 0, &ha));
    TH_OK(llmcl_tensor_view(e->c, 2, huge, hstr, 0, &hc));
    expect_fail(e, LLMCL_ERROR_OVERFLOW, llmcl_matmul(ctx, 1, ha, ob, 0, hc, NULL), "M = 2^31");
    llmcl_tensor *made[] = {sqa, sqb, alias, row0, ha, hc, ob};
    destroy_all(made, sizeof made / sizeof *made);
}

/* Another context's tensor and sum of squares, and a sum of squares of a c that is not
   contiguous; what the accumulator held before stays (one product's squares). */
static void bad_other_context(bad_env *e)
{
    llmcl_ctx *ctx = e->ctx;
    const int64_t s53[2] = {5, 3}, s43[2] = {4, 3};
    llmcl_ctx *other = NULL;
    TH_OK(llmcl_ctx_create(&other));
    llmcl_tensor *foreign = NULL;
    TH_OK(llmcl_tensor_create(other, LLMCL_F32, 2, s53, &foreign));
    expect_fail(e, LLMCL_ERROR_DEVICE_MISMATCH, llmcl_matmul(ctx, 1, e->a, foreign, 0, e->c, NULL),
                "foreign b");

    llmcl_sumsq *acc = NULL, *acc_other = NULL;
    TH_OK(llmcl_sumsq_create(ctx, &acc));
    TH_OK(llmcl_sumsq_create(other, &acc_other));
    const llmcl_matmul_opts with_sq = {.sumsq = acc}, with_other = {.sumsq = acc_other};
    llmcl_tensor *c_sq = th_tensor(LLMCL_F32, 2, s43);
    TH_OK(llmcl_matmul(ctx, 1, e->a, e->b, 0, c_sq, &with_sq));
    double cv[12], want_sq = 0.0;
    th_download(c_sq, cv);
    for (int i = 0; i < 12; ++i)
        want_sq += cv[i] * cv[i];
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT,
                llmcl_matmul(ctx, 1, e->a, e->b, 0, e->c, &with_other), "another context's sumsq");
    const int64_t s23[2] = {2, 3}, st23[2] = {6, 1};
    llmcl_tensor *c_gap = NULL, *a25 = th_tensor(LLMCL_F32, 2, (int64_t[2]){2, 5});
    TH_OK(llmcl_tensor_view(e->c, 2, s23, st23, 0, &c_gap));
    expect_fail(e, LLMCL_ERROR_INVALID_ARGUMENT,
                llmcl_matmul(ctx, 1, a25, e->b, 0, c_gap, &with_sq),
                "sumsq with a c that is not contiguous");
    const double got_sq = sumsq_total(acc);
    TH_ASSERT_CLOSE("sumsq kept", &want_sq, &got_sq, 1, (th_tol){0, 1e-6});
    llmcl_sumsq_destroy(acc);
    llmcl_sumsq_destroy(acc_other);
    llmcl_tensor *made[] = {c_sq, c_gap, a25, foreign};
    destroy_all(made, sizeof made / sizeof *made);
    llmcl_ctx_destroy(other);
}

static void test_bad_input(void **state)
{
    (void)state;
    th_rng rng = th_rng_new(900);
    const int64_t s45[2] = {4, 5}, s53[2] = {5, 3}, s43[2] = {4, 3};
    double vals[64];
    th_fill_uniform(&rng, vals, 64, -1, 1);
    bad_env e = {.ctx = th_ctx(),
                 .a = th_tensor_from(LLMCL_F32, 2, s45, vals),
                 .b = th_tensor_from(LLMCL_F32, 2, s53, vals),
                 .c = th_tensor_from(LLMCL_F32, 2, s43, vals),
                 .n = 12,
                 .before = th_alloc(12 * sizeof(double))};
    th_download(e.c, e.before);
    bad_operands(&e);
    bad_bias(&e);
    bad_addends(&e);
    bad_continuation(&e);
    bad_overlaps_and_sizes(&e);
    bad_other_context(&e);
    llmcl_tensor *made[] = {e.a, e.b, e.c};
    destroy_all(made, sizeof made / sizeof *made);
    free(e.before);
}

int main(int argc, char **argv)
{
    th_kernel_option(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transposes),        cmocka_unit_test(test_alpha_beta_bias),
        cmocka_unit_test(test_layouts_and_batches), cmocka_unit_test(test_split_k),
        cmocka_unit_test(test_addend),            cmocka_unit_test(test_edges),
        cmocka_unit_test(test_long_k),
        cmocka_unit_test(test_tiled_tunables),
        cmocka_unit_test(test_tiled_file_misfit),
        cmocka_unit_test(test_thin_class),
        cmocka_unit_test(test_tensor_cores),
        cmocka_unit_test(test_preload),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_sumsq_growth),
        cmocka_unit_test(test_k_ext),
        cmocka_unit_test(test_bad_input),
    };
    return TH_RUN(tests);
}
