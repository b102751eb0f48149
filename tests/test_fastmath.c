/* test_fastmath.c — the NaN guard survives -Ofast / -ffast-math. Built (tests/run.sh, the
   Makefile) with gcc -Ofast and clang -Ofast, ddp.h's implementation inside this file, and run
   under ddprun -n 2: a NaN (or Inf) in ONE rank's gradient must give DDP_ERR_NONFINITE on every
   rank with the parameters unchanged everywhere (skip_nonfinite: a skipped step, unchanged too),
   for fp32 and bf16 parameters; a NaN hyperparameter or descriptor field is still refused.
   Under -ffinite-math-only isfinite() folds to 1: this file first shows that it does here, so
   the test proves the guard does not rest on it.
   Run: build/ddprun -n 2 build/test_fastmath_gcc   (and _clang; -n 1 works too) */
#include "testlib.h"
#include <math.h>

#ifndef __FAST_MATH__
#error "test_fastmath.c is meant to be built with -Ofast or -ffast-math"
#endif

enum { NA = 3000, NB = 37, NC = 5000 };

/* A NaN the compiler cannot see coming. */
static float runtime_nan(void) { volatile float z = 0.0f; return z / z; }
static float runtime_inf(void) { volatile float z = 0.0f; return 1.0f / z; }

typedef struct run { ddp_context *ddp; int ids[3]; const char *name; } run;

static int open_run(run *t, ddp_dtype dtype, int skip_nonfinite, int shard) {
    static float init[NA + NB + NC];
    ddp_desc d;
    ddp_result r;
    int i;
    static const char *names[3] = { "a.weight", "b.bias", "c.weight" };
    static const size_t counts[3] = { NA, NB, NC };
    size_t at = 0;
    memset(&d, 0, sizeof d);
    d.param_dtype = dtype;
    d.skip_nonfinite = skip_nonfinite;
    d.shard_optimizer = shard;
    d.bucket_cap_mb = 0.01;        /* several buckets */
    d.first_bucket_mb = 0.01;
    for (i = 0; i < NA + NB + NC; i++) init[i] = test_value(7, (uint64_t)i);
    if ((r = ddp_init(&t->ddp, &d)) != DDP_OK) {
        printf("FAIL fastmath_init: %s\n", ddp_last_error(t->ddp));
        ddp_shutdown(t->ddp);
        return 0;
    }
    for (i = 0; i < 3; i++) {
        if (ddp_register_param(t->ddp, names[i], counts[i], i == 1 ? DDP_NO_DECAY : 0, init + at, &t->ids[i]) != DDP_OK) break;
        at += counts[i];
    }
    if (i < 3 || ddp_commit(t->ddp) != DDP_OK) {
        printf("FAIL fastmath_commit: %s\n", ddp_last_error(t->ddp));
        ddp_shutdown(t->ddp);
        return 0;
    }
    return 1;
}

/* This rank's gradients, written the way an own-autograd program does (zero, fill, mark ready,
   finish); `poison` >= 0 puts `bad` at that element of parameter 2 on the last rank only. */
static ddp_result backward(run *t, int step, long poison, float bad) {
    int rank = ddp_rank(t->ddp), world = ddp_world_size(t->ddp), i;
    ddp_result r;
    if ((r = ddp_zero_grad(t->ddp)) != DDP_OK) return r;
    for (i = 2; i >= 0; i--) {
        size_t n = ddp_param_count(t->ddp, t->ids[i]), k;
        if (ddp_config(t->ddp)->param_dtype == DDP_DTYPE_BF16) {
            ddp_bf16 *g = ddp_grad_bf16(t->ddp, t->ids[i]);
            for (k = 0; k < n; k++) {
                float v = test_value(100 + (uint64_t)(step * 8 + rank), (uint64_t)(i * 10000) + k);
                uint32_t u;
                if (i == 2 && (long)k == poison && rank == world - 1) v = bad;
                memcpy(&u, &v, 4);
                g[k] = (ddp_bf16)(u >> 16);
            }
        } else {
            float *g = ddp_grad(t->ddp, t->ids[i]);
            for (k = 0; k < n; k++) g[k] = test_value(100 + (uint64_t)(step * 8 + rank), (uint64_t)(i * 10000) + k);
            if (i == 2 && poison >= 0 && rank == world - 1) g[poison] = bad;
        }
        if ((r = ddp_grad_ready(t->ddp, t->ids[i])) != DDP_OK) return r;
    }
    return ddp_finish(t->ddp);
}

/* A hash of this rank's parameters (with bf16: the master, sharded only this rank's parts, and
   the working copies), and whether every rank holds the same (fp32: the parameters; bf16: the
   working copies, which every rank holds whole). */
static uint64_t params_hash(run *t, int *same_everywhere) {
    size_t n, n16 = 0;
    const float *p = ddp_flat_params(t->ddp, &n);
    const ddp_bf16 *w = ddp_config(t->ddp)->param_dtype == DDP_DTYPE_BF16 ? ddp_flat_params_bf16(t->ddp, &n16) : NULL;
    uint64_t h = test_hash(p, n * sizeof(float)), shared = w ? test_hash(w, n16 * sizeof(ddp_bf16)) : h;
    float mine[2], all[2];
    if (w) h ^= shared * 31;
    mine[0] = (float)(shared & 0xffffff);
    mine[1] = (float)((shared >> 24) & 0xffffff);
    all[0] = mine[0]; all[1] = mine[1];
    *same_everywhere = 0;
    if (ddp_broadcast(t->ddp, all, sizeof all, 0) == DDP_OK)
        *same_everywhere = ddp_allreduce(t->ddp, mine, 2, DDP_SUM) == DDP_OK &&
                           mine[0] == all[0] * (float)ddp_world_size(t->ddp) && mine[1] == all[1] * (float)ddp_world_size(t->ddp);
    return h;
}

static void nonfinite_case(ddp_dtype dtype, int skip, int shard, float bad, const char *name) {
    run t;
    ddp_adamw opt;
    uint64_t before, after;
    int same_before, same_after, good = 1;
    ddp_result r;
    float norm = 0;
    char label[128];
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-2f; opt.weight_decay = 0.1f; opt.max_grad_norm = 1.0f;
    if (!open_run(&t, dtype, skip, shard)) return;
    /* one good step first: the state is not the initial one */
    if (backward(&t, 0, -1, 0) != DDP_OK || ddp_adamw_step(t.ddp, &opt, NULL) != DDP_OK) {
        printf("FAIL fastmath_%s: a finite step failed: %s\n", name, ddp_last_error(t.ddp));
        ddp_shutdown(t.ddp);
        return;
    }
    before = params_hash(&t, &same_before);
    if ((r = backward(&t, 1, 1234, bad)) != DDP_OK) good = 0;
    r = good ? ddp_adamw_step(t.ddp, &opt, &norm) : r;
    after = params_hash(&t, &same_after);
    snprintf(label, sizeof label, "fastmath_%s", name);
    if (skip)
        verdict(good && r == DDP_OK && before == after && same_after, label,
                "skip_nonfinite: result %s (%s), parameters %s, ranks %s", ddp_result_string(r), ddp_last_error(t.ddp),
                before == after ? "unchanged" : "CHANGED", same_after ? "equal" : "DIFFER");
    else
        verdict(good && r == DDP_ERR_NONFINITE && before == after && same_before && same_after &&
                ((strstr(ddp_last_error(t.ddp), "c.weight") && strstr(ddp_last_error(t.ddp), "element 1234")) ||
                 (shard && strstr(ddp_last_error(t.ddp), "in another rank's shard"))), label,
                "expected DDP_ERR_NONFINITE naming c.weight element 1234 with parameters unchanged on every rank; got %s "
                "(%s), parameters %s, ranks %s", ddp_result_string(r), ddp_last_error(t.ddp),
                before == after ? "unchanged" : "CHANGED", same_after ? "equal" : "DIFFER");
    /* the context goes on: a finite step after it is taken, alike everywhere */
    r = backward(&t, 2, -1, 0);
    if (r == DDP_OK) r = ddp_adamw_step(t.ddp, &opt, NULL);
    after = params_hash(&t, &same_after);
    snprintf(label, sizeof label, "fastmath_%s_then_finite_step", name);
    verdict(r == DDP_OK && after != before && same_after, label, "%s (%s), ranks %s", ddp_result_string(r),
            ddp_last_error(t.ddp), same_after ? "equal" : "DIFFER");
    ddp_shutdown(t.ddp);
}

int main(void) {
    volatile float nan_ = runtime_nan();
    /* the hazard is real in this build: isfinite() says a NaN is finite (else say so, still test) */
    printf("note: this build (%s) folds isfinite(NaN) to %d\n",
#ifdef __clang__
           "clang -Ofast",
#else
           "gcc -Ofast",
#endif
           isfinite(nan_) ? 1 : 0);
    nonfinite_case(DDP_DTYPE_FP32, 0, 0, runtime_nan(), "nan_fp32_nonfinite_everywhere_params_unchanged");
    nonfinite_case(DDP_DTYPE_FP32, 0, 0, runtime_inf(), "inf_fp32_nonfinite_everywhere_params_unchanged");
    nonfinite_case(DDP_DTYPE_FP32, 1, 0, runtime_nan(), "nan_fp32_skip_nonfinite_skipped_everywhere");
    nonfinite_case(DDP_DTYPE_BF16, 0, 0, runtime_nan(), "nan_bf16_nonfinite_everywhere_params_unchanged");
    nonfinite_case(DDP_DTYPE_BF16, 0, 0, -runtime_inf(), "inf_bf16_nonfinite_everywhere_params_unchanged");
    /* sharded (ZeRO-1): each rank checks its own part; the norm's blocks reach every rank */
    nonfinite_case(DDP_DTYPE_FP32, 0, 1, runtime_nan(), "nan_fp32_sharded_nonfinite_everywhere_params_unchanged");
    nonfinite_case(DDP_DTYPE_BF16, 0, 1, runtime_nan(), "nan_bf16_sharded_nonfinite_everywhere_params_unchanged");
    {   /* NaN options are refused by bits too: a NaN lr, a NaN timeout */
        run t;
        ddp_adamw opt;
        ddp_desc d;
        ddp_context *c = NULL;
        ddp_result r1 = DDP_OK, r2, r3 = DDP_OK;
        memset(&opt, 0, sizeof opt);
        if (open_run(&t, DDP_DTYPE_FP32, 0, 0)) {
            opt.lr = runtime_nan();
            if (backward(&t, 0, -1, 0) == DDP_OK) r1 = ddp_adamw_step(t.ddp, &opt, NULL);
            opt.lr = 1e-3f;
            opt.beta1 = runtime_nan();   /* not taken for 0 (the default 0.9): NaN != 0 may fold here */
            r3 = ddp_adamw_step(t.ddp, &opt, NULL);
            ddp_shutdown(t.ddp);
        }
        memset(&d, 0, sizeof d);
        d.timeout_s = runtime_nan();
        d.world_size = 1;
        r2 = ddp_init(&c, &d);
        verdict(r1 == DDP_ERR_INVALID_ARGUMENT && r2 == DDP_ERR_INVALID_ARGUMENT && r3 == DDP_ERR_INVALID_ARGUMENT,
                "fastmath_nan_options_refused", "adamw lr = NaN: %s; beta1 = NaN: %s; ddp_desc.timeout_s = NaN: %s",
                ddp_result_string(r1), ddp_result_string(r3), ddp_result_string(r2));
        ddp_shutdown(c);
    }
    return test_failures ? 1 : 0;
}
