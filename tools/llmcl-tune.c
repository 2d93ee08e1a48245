/*
 * llmcl-tune: tunes llmcl's kernels on the selected device (LLMCL_PLATFORM / LLMCL_DEVICE, or
 * --platform / --device) and writes a tuning file the runtime reads (docs/TUNING.md). The engine is
 * in tools/tune/tune.c, the kernels and their parameter spaces in tools/tune/kernels.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tune.h"
#include "util/util.h"

#define MAX_CASES 512
#define MAX_FILTERS 32

typedef struct plan_case {
    const tune_kernel *k;
    llmcl_dtype dtype;
    char shape[96];
    tune_kernel restricted; /* k with --space applied; k points here then */
    char space[TUNE_TEXT * 2];
} plan_case;

typedef struct progress {
    bool tty;
    double start, deadline; /* deadline 0: none */
    int case_index, n_cases;
    const plan_case *pc;
    long units_done, units_total; /* candidates over all cases */
    int case_total;
    int last_done;
} progress;

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: llmcl-tune [options]\n"
        "Tunes kernels on the device LLMCL_PLATFORM / LLMCL_DEVICE select and prints best against\n"
        "default times; --output writes a tuning file that the runtime loads from LLMCL_TUNE_DB "
        "or\n"
        "<cache dir>/tuning*.json.\n"
        "  --kernel NAME       a kernel key or family (repeatable; default: all)\n"
        "  --shape SPEC        tune at this shape, e.g. R=4096,C=4096 (default: representative)\n"
        "  --dtype LIST        dtypes, e.g. f32,bf16 (default: each kernel's)\n"
        "  --quick             bounded search for CI: one shape and dtype, 12 candidates, 5 reps\n"
        "  --max-time SECONDS  stop the whole run after this long (cases share the time)\n"
        "  --max-candidates N  candidates per case (a fixed sample; 0: all)\n"
        "  --space SPEC        search only these values, e.g. \"TM=4,8 TN=2,4\"; parameters\n"
        "                      it does not name keep the kernel's list (see --list)\n"
        "  --reps N            timed runs per candidate, 1 to 64 (median kept)\n"
        "  --warmup N          untimed runs first, 0 to 1000\n"
        "  --output FILE       write the tuning file (temporary file, then rename)\n"
        "  --merge             keep FILE's entries for this device that are not retuned\n"
        "  --for-platform      write FILE for any device of this platform and type (for shipped\n"
        "                      defaults such as data/tuning/pocl_cpu.json)\n"
        "  --platform P        as LLMCL_PLATFORM (index or name substring)\n"
        "  --device D          as LLMCL_DEVICE\n"
        "  --list              list the kernels and their parameter spaces\n"
        "  --verbose           print each candidate's time, or why it was dropped\n");
}

static void fmt_time(double s, char *out, size_t n)
{
    if (s < 0 || s > 360000)
        snprintf(out, n, "?");
    else if (s >= 60)
        snprintf(out, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(out, n, "%ds", (int)(s + 0.5));
}

static void on_progress(void *arg, int done, int total)
{
    progress *p = arg;
    p->case_total = total;
    p->units_done += done - p->last_done;
    p->last_done = done;
    if (!p->tty)
        return;
    double elapsed = util_now_s() - p->start;
    double frac = p->units_total > 0 ? (double)p->units_done / (double)p->units_total : 0;
    frac = frac > 1 ? 1 : frac;
    double eta = frac > 0.01 ? elapsed / frac - elapsed : -1;
    if (p->deadline > 0 && (eta < 0 || util_now_s() + eta > p->deadline))
        eta = p->deadline - util_now_s();
    char bar[31], eta_s[16];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; ++i)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fmt_time(eta, eta_s, sizeof eta_s);
    fprintf(stderr, "\r[%s] %3d%% case %d/%d %-16.16s %-4s cand %d/%d ETA %-8s", bar,
            (int)(frac * 100), p->case_index + 1, p->n_cases, p->pc->k->key,
            llmcl_dtype_name(p->pc->dtype), done, total, eta_s);
    fflush(stderr);
}

static bool kernel_selected(const tune_kernel *k, char **filters, int n)
{
    if (n == 0)
        return true;
    for (int i = 0; i < n; ++i)
        if (strcmp(filters[i], k->key) == 0 || strcmp(filters[i], k->family) == 0)
            return true;
    return false;
}

static bool parse_dtypes(const char *list, unsigned *mask)
{
    *mask = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int d = 0; d < LLMCL_DTYPE_COUNT; ++d)
            if (strcasecmp(t, llmcl_dtype_name((llmcl_dtype)d)) == 0)
                found = d;
        if (found < 0)
            return false;
        *mask |= 1u << found;
    }
    return *mask != 0;
}

static void list_kernels(void)
{
    printf("%-20s %-14s %-10s %s\n", "kernel", "family", "size key",
           "parameter space (candidates)");
    for (const tune_kernel *k = tune_kernels; k->key; ++k)
        printf("%-20s %-14s %-10s %s (%ld)\n", k->key, k->family,
               k->size_key_fn ? "(function)" : k->size_key, k->params,
               tune_space_size(k));
}

/* The cases to run: kernels x dtypes x shapes, bounded by --quick. */
static int plan(const llmcl_device_info *info, char **filters, int n_filters, unsigned dtype_mask,
                const char *shape, bool quick, plan_case *out)
{
    int n = 0;
    for (const tune_kernel *k = tune_kernels; k->key; ++k) {
        if (!kernel_selected(k, filters, n_filters) || (k->runs_on && !k->runs_on(info)))
            continue;
        unsigned mask = dtype_mask ? dtype_mask & k->dtypes : k->dtypes;
        if (quick && !dtype_mask)
            mask &= ~(mask - 1); /* the first dtype only */
        const char *shapes = shape ? shape : info->is_gpu ? k->shapes : k->small_shapes;
        for (int d = 0; d < LLMCL_DTYPE_COUNT; ++d) {
            if (!(mask & (1u << d)))
                continue;
            for (const char *s = shapes; *s && n < MAX_CASES;) {
                size_t len = strcspn(s, ";");
                out[n] = (plan_case){.k = k, .dtype = (llmcl_dtype)d};
                snprintf(out[n].shape, sizeof out[n].shape, "%.*s", (int)len, s);
                ++n;
                if (quick)
                    break;
                s += len + (s[len] == ';');
            }
        }
    }
    return n;
}

/* Applies --space to every case; false (with a message) when it is malformed or names a
 * parameter that no selected kernel has. */
static bool restrict_cases(plan_case *cases, int n, const char *space)
{
    int used = 0;
    for (int i = 0; i < n; ++i) {
        plan_case *c = &cases[i];
        const int u = tune_restrict_space(c->k->params, space, c->space, sizeof c->space);
        if (u < 0) {
            fprintf(stderr, "llmcl-tune: bad --space \"%s\" (NAME=V1,V2 ...)\n", space);
            return false;
        }
        used |= u;
        c->restricted = *c->k;
        c->restricted.params = c->space;
        c->k = &c->restricted;
    }
    int named = 0;
    for (const char *p = space; *p; ++p)
        named += *p == '=';
    if (n > 0 && used != (1 << named) - 1) {
        fprintf(stderr, "llmcl-tune: --space \"%s\" names a parameter no selected kernel has\n",
                space);
        return false;
    }
    return true;
}

/* Where the runtime does not run the defaults at a case now (its tuning files: an entry of this
   class, or of the nearest one), what it runs, and the best's gain against it. */
static void print_now(const tune_result *r)
{
    if (strcmp(r->now_params, r->default_params) == 0)
        return;
    if (r->now_ms <= 0) {
        printf("  now, with the tuning files a new context loads: %s, which failed\n",
               r->now_params);
        return;
    }
    printf("  now, with the tuning files a new context loads: %s %.4f ms (the best: %.2fx)\n",
           r->now_params, r->now_ms, r->best_ms > 0 ? r->now_ms / r->best_ms : 1.0);
}

static void print_table(const tune_result *res, int n)
{
    printf("\n%-16s %-5s %-18s %-5s %-22s %10s %-22s %10s %8s  %s\n", "kernel", "dtype", "shape",
           "class", "default", "ms", "best", "ms", "speedup", "timed/tried; rejected");
    for (int i = 0; i < n; ++i) {
        const tune_result *r = &res[i];
        if (!r->ok) {
            printf("%-16s %-5s %-18s %-5s FAILED: %s\n", r->kernel->key, llmcl_dtype_name(r->dtype),
                   r->shape, r->shape_class, r->error);
            continue;
        }
        char rejected[128] = "";
        static const char *names[TUNE_REJ_COUNT] = {"limits", "build", "wrong", "adjusted",
                                                    "error"};
        size_t len = 0;
        for (int j = 0; j < TUNE_REJ_COUNT; ++j)
            if (r->rejected[j])
                util_appendf(rejected, sizeof rejected, &len, " %s %d", names[j], r->rejected[j]);
        printf("%-16s %-5s %-18s %-5s %-22s %10.4f %-22s %10.4f %7.2fx  %d/%d;%s\n", r->kernel->key,
               llmcl_dtype_name(r->dtype), r->shape, r->shape_class, r->default_params,
               r->default_ms,
               strcmp(r->best_params, r->default_params) ? r->best_params : "(default)", r->best_ms,
               r->best_ms > 0 ? r->default_ms / r->best_ms : 1.0, r->timed, r->tried,
               rejected[0] ? rejected : " none");
        print_now(r);
    }
}

/* The command line's choices. */
typedef struct cli {
    char *filters[MAX_FILTERS];
    int n_filters, max_cand, reps, warmup;
    const char *shape, *output, *space;
    unsigned dtype_mask;
    bool quick, merge, for_platform, verbose;
    double max_time;
} cli;

/* A bad command line's message (with the usage where asked); returns the exit status, 2. */
static int bad_usage(bool with_usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llmcl-tune: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (with_usage)
        usage(stderr);
    return 2;
}

/* One option that takes the value v into c; an exit status where it is wrong, else -1. */
static int parse_valued(cli *c, const char *a, char *v)
{
    if (strcmp(a, "--kernel") == 0) {
        if (c->n_filters == MAX_FILTERS)
            return bad_usage(false, "at most %d --kernel options", MAX_FILTERS);
        c->filters[c->n_filters++] = v;
    } else if (strcmp(a, "--shape") == 0) {
        const size_t most = sizeof ((plan_case *)0)->shape - 1;
        for (const char *s = v; *s; s += strcspn(s, ";") + (s[strcspn(s, ";")] == ';'))
            if (strcspn(s, ";") > most) /* cut, it would parse as another shape */
                return bad_usage(false, "--shape: a shape of more than %zu characters", most);
        c->shape = v;
    } else if (strcmp(a, "--output") == 0)
        c->output = v;
    else if (strcmp(a, "--dtype") == 0) {
        if (!parse_dtypes(v, &c->dtype_mask))
            return bad_usage(false, "bad --dtype %s (f32, bf16, f16, ...)", v);
    } else if (strcmp(a, "--max-time") == 0) {
        if (!util_parse_double(v, 1e-3, 7 * 86400.0, &c->max_time))
            return bad_usage(false, "--max-time %s: expected seconds, 0.001 to a week", v);
    } else if (strcmp(a, "--space") == 0)
        c->space = v;
    else if (strcmp(a, "--max-candidates") == 0 || strcmp(a, "--reps") == 0 ||
             strcmp(a, "--warmup") == 0) {
        const bool cand = strcmp(a, "--max-candidates") == 0, rep = strcmp(a, "--reps") == 0;
        const long lo = rep ? 1 : 0, hi = rep ? 64 : cand ? 1000000 : 1000;
        long n;
        if (!util_parse_long(v, lo, hi, &n))
            return bad_usage(false, "%s %s: expected a whole number from %ld to %ld", a, v, lo,
                             hi);
        *(cand ? &c->max_cand : rep ? &c->reps : &c->warmup) = (int)n;
    } else if (strcmp(a, "--platform") == 0)
        setenv("LLMCL_PLATFORM", v, 1);
    else if (strcmp(a, "--device") == 0)
        setenv("LLMCL_DEVICE", v, 1);
    else
        return bad_usage(true, "unknown option %s", a);
    return -1;
}

/* The command line into c; an exit status where the run ends here (help, a list, an error),
   else -1. Every --kernel must name a kernel or a family. */
static int parse_cli(int argc, char **argv, cli *c)
{
    *c = (cli){.max_cand = -1, .reps = -1, .warmup = -1};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0)
            c->quick = true;
        else if (strcmp(a, "--merge") == 0)
            c->merge = true;
        else if (strcmp(a, "--for-platform") == 0)
            c->for_platform = true;
        else if (strcmp(a, "--verbose") == 0)
            c->verbose = true;
        else if (strcmp(a, "--list") == 0) {
            list_kernels();
            return 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (v == NULL)
            return bad_usage(true, "unknown option or missing value: %s", a);
        else {
            const int rc = parse_valued(c, a, v);
            if (rc >= 0)
                return rc;
            ++i;
        }
    }
    for (int i = 0; i < c->n_filters; ++i) {
        bool known = false;
        for (const tune_kernel *k = tune_kernels; k->key; ++k)
            known = known || strcmp(c->filters[i], k->key) == 0 ||
                    strcmp(c->filters[i], k->family) == 0;
        if (!known)
            return bad_usage(false, "no kernel or family named %s (see --list)", c->filters[i]);
    }
    return -1;
}

/* The engine's options: the device's defaults, with what the command line set. */
static tune_options options_of(const llmcl_device_info *info, const cli *c)
{
    tune_options o = tune_default_options(info, c->quick);
    if (c->max_cand >= 0)
        o.max_candidates = c->max_cand;
    if (c->reps > 0)
        o.reps = c->reps;
    if (c->warmup >= 0)
        o.warmup = c->warmup;
    o.for_platform = c->for_platform;
    o.trace = c->verbose ? stdout : NULL;
    return o;
}

/* A case's result on a log (on a terminal the progress line says it), and with
   LLMCL_TUNE_VERBOSE an example of each kind of rejection. */
static void log_result(const progress *p, const tune_result *r)
{
    if (!p->tty) {
        if (r->ok)
            fprintf(stderr, "  %d candidates, %d timed; best %s %.4f ms, default %.4f ms%s\n",
                    r->candidates, r->timed, r->best_params, r->best_ms, r->default_ms,
                    strcmp(r->now_params, r->default_params) ? " (now otherwise: below)" : "");
        else
            fprintf(stderr, "  failed: %s\n", r->error);
    }
    for (int j = 0; j < TUNE_REJ_COUNT && getenv("LLMCL_TUNE_VERBOSE"); ++j)
        if (r->rejected[j])
            fprintf(stderr, "  rejected e.g. %s\n", r->last_reject[j]);
}

/*
 * The cases in order, each with an equal share of the time --max-time leaves, into results.
 * Returns how many ran; *failed counts those that failed.
 */
static int run_cases(llmcl_ctx *ctx, const plan_case *cases, int n, double max_time,
                     tune_options *o, tune_result *results, int *failed)
{
    progress p = {.tty = isatty(2), .start = util_now_s(), .n_cases = n};
    p.deadline = max_time > 0 ? p.start + max_time : 0;
    for (int i = 0; i < n; ++i) {
        long size = tune_space_size(cases[i].k);
        p.units_total += o->max_candidates > 0 && size > o->max_candidates ? o->max_candidates
                                                                             : size;
    }
    o->progress = on_progress;
    o->progress_arg = &p;
    int done = 0;
    *failed = 0;
    for (int i = 0; i < n; ++i) {
        double left = p.deadline > 0 ? p.deadline - util_now_s() : 0;
        if (p.deadline > 0 && left <= 0) {
            fprintf(stderr, "%sllmcl-tune: --max-time reached; %d of %d cases not run\n",
                    p.tty ? "\n" : "", n - i, n);
            break;
        }
        o->case_seconds = p.deadline > 0 ? left / (n - i) : 0;
        p.case_index = i;
        p.pc = &cases[i];
        p.last_done = 0;
        if (!p.tty)
            fprintf(stderr, "[%d/%d] %s %s %s\n", i + 1, n, cases[i].k->key,
                    llmcl_dtype_name(cases[i].dtype), cases[i].shape);
        tune_result *r = &results[done++];
        *failed += tune_run_case(ctx, cases[i].k, cases[i].dtype, cases[i].shape, o, r) != LLMCL_OK;
        log_result(&p, r);
    }
    if (p.tty)
        fprintf(stderr, "\n");
    return done;
}

int main(int argc, char **argv)
{
    cli c;
    const int rc_cli = parse_cli(argc, argv, &c);
    if (rc_cli >= 0)
        return rc_cli;
    /* Candidates would fill the program cache with binaries nobody reuses; the folder's tuning
       files still load, as they do for the runs that the tuner's "now" stands for. */
    setenv("LLMCL_CACHE_BINARIES", "0", 1);
    llmcl_ctx *ctx = NULL;
    llmcl_status st = llmcl_ctx_create(&ctx);
    if (st != LLMCL_OK) {
        fprintf(stderr, "llmcl-tune: %s: %s\n", llmcl_status_str(st), llmcl_last_error(NULL));
        return 1;
    }
    const llmcl_device_info *info = llmcl_ctx_device_info(ctx);
    tune_options o = options_of(info, &c);

    static plan_case cases[MAX_CASES];
    static tune_result results[MAX_CASES];
    int n = plan(info, c.filters, c.n_filters, c.dtype_mask, c.shape, c.quick, cases);
    if (c.space && !restrict_cases(cases, n, c.space)) {
        llmcl_ctx_destroy(ctx);
        return 2;
    }
    char why[512];
    if (c.output && c.merge && !tune_merge_check(c.output, ctx, &o, why, sizeof why)) {
        fprintf(stderr, "llmcl-tune: %s\n", why); /* before the tuning, not after */
        llmcl_ctx_destroy(ctx);
        return 1;
    }
    printf("llmcl-tune %s on %s (%s, driver %s): %d cases%s\n", llmcl_version(), info->name,
           info->platform_name, info->driver_version, n, c.quick ? ", quick" : "");
    fflush(stdout);
    int failed;
    const int done = run_cases(ctx, cases, n, c.max_time, &o, results, &failed);
    print_table(results, done);
    int rc = failed ? 1 : 0;
    if (c.output) {
        if (tune_write_json(c.output, ctx, results, done, &o, c.merge, why, sizeof why))
            printf("\nwrote %s (use it with LLMCL_TUNE_DB=%s)\n", c.output, c.output);
        else {
            fprintf(stderr, "llmcl-tune: %s\n", why);
            rc = 1;
        }
    }
    llmcl_ctx_destroy(ctx);
    return rc;
}
