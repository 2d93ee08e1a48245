/*
 * attention_split.c: the portable attention kernels within the device's loop budget
 * (llmcl__loop_budget; llvmpipe cuts a loop off after 65535 passes). It counts the loop passes of
 * a kernel's walk as attention_portable.cl writes them and, where a work-item's walk would pass
 * the budget, runs it in launches of as many steps as fit (SPLIT), each resuming from the state
 * that the launch before saved.
 */
#include "src/runtime/ops/attention.h"

/*
 * Loop passes (llmcl__loop_budget's count) of the portable kernels as attention_portable.cl
 * writes them: a loop of t trips makes t + 1, plus its body's passes on every trip; every loop
 * counts, the `#pragma unroll` ones and those under a condition too, for the work-item with the
 * most pieces of a shared copy (llvmpipe runs a loop as long as any lane of a batch does).
 */
static int64_t attn_loop(int64_t trips, int64_t body) { return trips + 1 + trips * body; }

/* Two nested loops with empty bodies inside: register-tile set-ups, stores, the score math. */
static int64_t attn_nest(int64_t outer, int64_t inner)
{
    return attn_loop(outer, attn_loop(inner, 0));
}

/* A tile of rows x D staged in 4-wide pieces by `threads` work-items (load, fetch or put). */
static int64_t attn_copy(int64_t rows, int d, int64_t threads)
{
    return attn_loop(llmcl__div_up(rows * (d / 4), threads), 0);
}

/* A score product over D (attn_fwd's S, the backward's S and dP): per 4 of D the rows' and the
   columns' operand reads and their rows x cols dot steps. */
static int64_t attn_score_loops(int d, int rows, int cols)
{
    return attn_loop(d / 4, attn_loop(rows, 0) + attn_loop(cols, 0) + attn_nest(rows, cols));
}

/* ATTN_ACCUMULATE over n score rows of pitch floats: per row attn_read_col's `rows` scores (4 wide
   where rows and the pitch allow), the cols4 operand reads and their rows x cols4 FMAs. */
static int64_t attn_accumulate_loops(int rows, int cols4, int pitch, int n)
{
    const int64_t col = attn_loop(rows % 4 == 0 && pitch % 4 == 0 ? rows / 4 : rows, 0);
    return attn_loop(n, col + attn_loop(cols4, 0) + attn_nest(rows, cols4));
}

/* A portable kernel's passes: once (`fixed`), a step of its walk (a key tile of attn_fwd and
   attn_bwd_dq, a (query head, query tile) pair of attn_bwd_dkdv), and what a SPLIT launch adds
   (its state loaded and saved). */
typedef struct attn_passes {
    int64_t fixed, step, split;
} attn_passes;

static attn_passes attn_passes_of(attn_pass pass, int d, attn_tiles t)
{
    const int pipe = t.pipe != 0;
    if (pass == ATTN_PASS_DKDV) {
        const int rt = t.bn / t.tn, ct = t.bm / t.tm, dt4 = d / (4 * ct), w = rt * ct;
        const int64_t qt = attn_copy(t.bm, d, w), acc = attn_nest(t.tn, dt4);
        return (attn_passes){
            .fixed = 2 * attn_copy(t.bn, d, w) + 2 * acc + 2 * pipe * qt + 1,
            .step = 1 + 2 * qt + attn_loop(llmcl__div_up(t.bm, w), 0) + 2 * attn_nest(t.tn, t.tm) +
                    attn_score_loops(d, t.tn, t.tm) + 2 * pipe * qt +
                    2 * attn_accumulate_loops(t.tn, dt4, t.bn + 4, t.bm),
            .split = 4 * acc};
    }
    const int rt = t.bm / t.tm, ct = t.bn / t.tn, dt4 = d / (4 * ct), w = rt * ct;
    const int64_t kv = attn_copy(t.bn, d, w), acc = attn_nest(t.tm, dt4);
    /* a step: K and V staged (PIPE: fetched, then put), the score tiles' set-up and math, the
       score product and the accumulating one */
    const int64_t step = 1 + (2 + 2 * pipe) * kv + 2 * attn_nest(t.tm, t.tn) +
                         attn_score_loops(d, t.tm, t.tn) +
                         attn_accumulate_loops(t.tm, dt4, t.bm + 4, t.bn);
    if (pass == ATTN_PASS_FWD) /* and the rows' running maxima and sums */
        return (attn_passes){
            .fixed = attn_copy(t.bm, d, w) + acc + pipe * kv + 1 + attn_loop(t.tm, 0) +
                     attn_loop(t.tm, attn_loop(ct, 0) + attn_loop(dt4, 0)),
            .step = step +
                    attn_loop(t.tm, attn_loop(ct, 0) + attn_loop(t.tn, 0) + attn_loop(dt4, 0)),
            .split = 2 * (acc + attn_loop(t.tm, 0))};
    return (attn_passes){/* attn_bwd_dq */
                         .fixed = 2 * attn_copy(t.bm, d, w) + 2 * acc + 2 * pipe * kv + 1,
                         .step = step,
                         .split = 2 * acc};
}

/* The most steps of `step` rows that a tile of `other` rows walks over a sequence of len rows:
   all of them, or those of a window's band. */
static int64_t attn_walk(int64_t len, int step, int other, int wl, int wr)
{
    int64_t n = llmcl__div_up(len, step);
    if (wl >= 0 && wr >= 0) {
        const int64_t band = llmcl__div_up((int64_t)other + wl + wr + step - 1, step);
        n = band < n ? band : n;
    }
    return n;
}

/* As many steps a launch as fit beside the state that a launch loads and saves (SPLIT). */
llmcl_status llmcl__attn_split(llmcl_ctx *ctx, const attn_geom *g, const attn_kernel *k,
                               attn_tiles t, attn_split *out)
{
    const int64_t budget = llmcl__loop_budget(ctx);
    const attn_passes p = attn_passes_of(k->pass, g->D, t);
    const int64_t group = g->Hq / g->Hkv;
    const int64_t steps = k->pass == ATTN_PASS_DKDV
                              ? group * attn_walk(g->Tq, t.bm, t.bn, g->wl, g->wr)
                              : attn_walk(g->Tk, t.bn, t.bm, g->wl, g->wr);
    *out = (attn_split){steps, steps, 1};
    if (p.fixed + steps * p.step <= budget)
        return LLMCL_OK;
    LLMCL__REQUIRE(ctx, steps <= INT32_MAX, LLMCL_ERROR_OVERFLOW,
                   "attention: %s's walk of %lld steps must fit in 31 bits", k->name,
                   (long long)steps);
    const int64_t fixed = p.fixed + p.split;
    LLMCL__TRY(llmcl__check_loops(ctx, fixed + p.step,
                                  "attention: %s at D = %d, Tq = %d, Tk = %d with tiles BLOCK_M=%d "
                                  "BLOCK_N=%d TM=%d TN=%d, one step of its walk",
                                  k->name, g->D, g->Tq, g->Tk, t.bm, t.bn, t.tm, t.tn));
    out->per = (budget - fixed) / p.step;
    out->launches = llmcl__div_up(steps, out->per);
    return LLMCL_OK;
}
