/* test_shard.c — ZeRO-1 (ddp_desc.shard_optimizer): sharded ≡ unsharded, bit for bit.
   Each configuration trains the same parameters twice in one process group of N ranks, first
   unsharded, then sharded, with gradients made on each rank from its parameters (so any
   difference in the parameters shows in every later step): fp32 buckets, accumulation with
   find_unused (rank 0 leaves a parameter without gradient on some steps) and skip_nonfinite (a
   NaN on the last rank at one step), bf16 buckets, and the staged path (DDP_STAGED_GRADS: the
   parameters travel by broadcast instead of through the shared segment). Every step: the global
   norm bit for bit equal to the unsharded one, the parameters equal on every rank and equal to
   the unsharded run's. At the end m and v gathered to a root (ddp_gather_to_host) equal the
   unsharded ones; each rank holds a disjoint part, all parts together cover the flat buffer,
   balanced within world * 1024 floats a bucket; a host copy outside the part is refused by
   name; ddp_scatter_from_host puts a root's m into the owners. Bad combinations are refused by
   name. Run: build/ddprun -n N build/test_shard   (N = 1..4) */
#include "testlib.h"

enum { NPARAMS = 7, STEPS = 8, MAXN = 12000 };
static const size_t sizes[NPARAMS] = { 9000, 50, 6000, 3000, 700, 12000, 1 };
static const unsigned flags[NPARAMS] = { 0, DDP_NO_DECAY, 0, 0, DDP_NO_DECAY, 0, 0 };

typedef struct config {
    const char *name;
    int micro, find_unused, nan_step, bf16, staged;
} config;

typedef struct run_result {
    float norm[STEPS];
    uint64_t hash[STEPS];
    float *params, *m, *v;
    size_t count;
} run_result;

static int rank, world;

/* tests/test_zero2.c includes this file for its harness (TEST_SHARD_HARNESS_ONLY: no main), trains
   at another level (`shard`: 0 unsharded, 1 ZeRO-1, or a ddp_shard level above OPTIMIZER), names
   its checks with its own prefix and looks at each step through step_hook. */
static const char *test_prefix = "shard";
static void (*step_hook)(ddp_context *ddp, const int *ids, int shard, int step);

static ddp_result open_group(const config *c, int shard, ddp_context **out, int *ids) {
    ddp_desc d;
    ddp_result r;
    int k;
    memset(&d, 0, sizeof d);
    d.bucket_cap_mb = 0.05;      /* about 13000 floats: several buckets, parts of 1024-float grains */
    d.first_bucket_mb = 0.01;
    d.find_unused = c->find_unused;
    d.skip_nonfinite = c->nan_step >= 0;
    d.reduce_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    if (shard > 1) d.shard = (ddp_shard)shard;
    else d.shard_optimizer = shard;
    if ((r = ddp_init(out, &d)) != DDP_OK) return r;
    for (k = 0; k < NPARAMS; k++) {
        static float init[NPARAMS][MAXN];   /* one each: ddp_commit reads them */
        char name[32];
        size_t i;
        for (i = 0; i < sizes[k]; i++) init[k][i] = 0.5f * test_value(77 + (uint64_t)k, i);
        snprintf(name, sizeof name, "p%d", k);
        if ((r = ddp_register_param(*out, name, sizes[k], flags[k], init[k], &ids[k])) != DDP_OK) return r;
    }
    return ddp_commit(*out);
}

/* A gradient that depends on the parameter (any difference propagates), the rank, the step and
   the micro-step; some steps small (no clipping), most large (clipped). */
static void make_grad(ddp_context *ddp, int id, int k, int step, int micro, int nan) {
    const float *p = ddp_param(ddp, id);
    float *g = ddp_grad(ddp, id), scale = step % 3 == 0 ? 0.01f : 1.0f;
    size_t i;
    for (i = 0; i < sizes[k]; i++)
        g[i] += scale * tanhf(1.7f * p[i] + test_value(1000 * (uint64_t)step + 10 * (uint64_t)micro + 100000 * (uint64_t)rank,
                                                       (uint64_t)k * 100000 + i));
    if (nan) g[sizes[k] / 2] = NAN;
}

static ddp_result train(const config *c, int shard, run_result *out) {
    ddp_context *ddp;
    ddp_adamw opt;
    ddp_result r;
    int ids[NPARAMS], step, u, k;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f;
    if ((r = open_group(c, shard, &ddp, ids)) != DDP_OK) { printf("FAIL %s_open: %s\n", c->name, ddp_last_error(ddp)); ddp_shutdown(ddp); return r; }
    for (step = 0; step < STEPS; step++) {
        if ((r = ddp_zero_grad(ddp)) != DDP_OK) break;
        for (u = 0; u < c->micro && r == DDP_OK; u++) {
            ddp_set_sync(ddp, u == c->micro - 1);
            for (k = NPARAMS - 1; k >= 0 && r == DDP_OK; k--) {
                if (c->find_unused && k == NPARAMS - 1 && rank == 0 && step % 2 == 0) continue;
                make_grad(ddp, ids[k], k, step, u, step == c->nan_step && u == 0 && k == 2 && rank == world - 1);
                r = ddp_grad_ready(ddp, ids[k]);
            }
            if (r == DDP_OK) r = ddp_finish(ddp);
        }
        if (r == DDP_OK) r = ddp_adamw_step(ddp, &opt, &out->norm[step]);
        if (r != DDP_OK) break;
        if (step_hook) step_hook(ddp, ids, shard, step);
        {
            size_t n;
            const float *p = ddp_flat_params(ddp, &n);
            uint64_t mine = test_hash(p, n * sizeof(float)), rank0 = mine;
            float differ;
            ddp_broadcast(ddp, &rank0, sizeof rank0, 0);
            differ = (float)(mine != rank0);
            ddp_allreduce(ddp, &differ, 1, DDP_SUM);
            if (differ != 0) {
                printf("FAIL %s_shard%d_ranks%d_identical: the parameters differ between ranks after step %d\n", c->name, shard, world, step);
                test_failures++;
            }
            out->hash[step] = mine;
        }
    }
    if (r != DDP_OK) { printf("FAIL %s_shard%d_train: %s\n", c->name, shard, ddp_last_error(ddp)); ddp_shutdown(ddp); return r; }
    {
        size_t n;
        const float *p = ddp_flat_params(ddp, &n);
        out->count = n;
        out->params = (float *)malloc(n * sizeof(float));
        out->m = (float *)calloc(n, sizeof(float));
        out->v = (float *)calloc(n, sizeof(float));
        memcpy(out->params, p, n * sizeof(float));
        /* the moments, on every rank (each is the gather's root once) */
        for (k = 0; k < world && r == DDP_OK; k++) {
            float *m = (float *)malloc(n * sizeof(float)), *v = (float *)malloc(n * sizeof(float));
            r = ddp_gather_to_host(ddp, DDP_ADAM_M, 0, rank == k ? m : NULL, n, k);
            if (r == DDP_OK) r = ddp_gather_to_host(ddp, DDP_ADAM_V, 0, rank == k ? v : NULL, n, k);
            if (rank == k) { memcpy(out->m, m, n * sizeof(float)); memcpy(out->v, v, n * sizeof(float)); }
            free(m); free(v);
        }
        if (r != DDP_OK) printf("FAIL %s_shard%d_gather: %s\n", c->name, shard, ddp_last_error(ddp));
    }
    if (r == DDP_OK && shard && c->micro == 1 && !c->bf16 && !c->staged) {
        /* the parts: disjoint, covering, balanced; outside refused by name; scatter to owners */
        size_t n = out->count, i, mine = 0, lo = n, hi = 0;
        float *held = (float *)calloc(n, sizeof(float)), *src = (float *)malloc(n * sizeof(float)), x, counts[2];
        int bad = 0, refused_ok = 1, buckets = ddp_num_buckets(ddp);
        for (i = 0; i < n; i++) {
            ddp_result q = ddp_copy_to_host(ddp, DDP_ADAM_M, i, &x, 1);
            if (q == DDP_OK) {
                held[i] = 1; mine++;
                if (memcmp(&x, &out->m[i], sizeof x)) bad++;
                if (i < lo) lo = i;
                if (i > hi) hi = i;
            } else if (q != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_last_error(ddp), "not all held by rank")) refused_ok = 0;
        }
        ddp_allreduce(ddp, held, n, DDP_SUM);
        for (i = 0; i < n; i++) if (held[i] != 1.0f) bad++;
        counts[0] = (float)mine; counts[1] = -(float)mine;
        {   /* the spread of the parts' sizes: max - min over the ranks */
            float mx = counts[0], mn = counts[0];
            int s;
            for (s = 0; s < world; s++) {
                float a = counts[0];
                ddp_broadcast(ddp, &a, sizeof a, s);
                if (a > mx) mx = a;
                if (a < mn) mn = a;
            }
            verdict(bad == 0 && refused_ok && mx - mn <= (float)(world * 1024 * buckets), "shard_parts_disjoint_covering_balanced",
                    "%d wrong or uncovered floats, refusal message %s, part sizes %g..%g (%d buckets)", bad,
                    refused_ok ? "ok" : "wrong", mn, mx, buckets);
        }
        if (world > 1) {
            size_t outside = (lo == 0) ? hi + 1 : 0;   /* a range that starts in this rank's part and leaves it */
            ddp_result q = ddp_copy_to_host(ddp, DDP_ADAM_V, outside ? hi : lo - 1, src, 2);
            verdict(q == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "AdamW's v") && strstr(ddp_last_error(ddp), "rank"),
                    "shard_copy_outside_part_refused", "%s: %s", ddp_result_string(q), ddp_last_error(ddp));
        }
        for (i = 0; i < n; i++) src[i] = test_value(4242, i);
        r = ddp_scatter_from_host(ddp, DDP_ADAM_M, 0, rank == world - 1 ? src : NULL, n, world - 1);
        bad = 0;
        for (i = 0; i < n && r == DDP_OK; i++)
            if (ddp_copy_to_host(ddp, DDP_ADAM_M, i, &x, 1) == DDP_OK && memcmp(&x, &src[i], sizeof x)) bad++;
        if (r == DDP_OK) {
            float *back = (float *)malloc(n * sizeof(float));
            r = ddp_gather_to_host(ddp, DDP_ADAM_M, 100, rank == 0 ? back : NULL, n - 200, 0);
            if (r == DDP_OK && rank == 0 && memcmp(back, src + 100, (n - 200) * sizeof(float))) bad++;
            free(back);
        }
        verdict(r == DDP_OK && bad == 0, "shard_scatter_then_gather_m", "%s, %d mismatches: %s", ddp_result_string(r), bad,
                ddp_last_error(ddp));
        free(held); free(src);
        r = DDP_OK;
    }
    ddp_shutdown(ddp);
    return r;
}

static void compare(const config *c, const run_result *a, const run_result *b) {
    int step, first_norm = -1, first_hash = -1;
    char name[128];
    for (step = STEPS - 1; step >= 0; step--) {
        if (memcmp(&a->norm[step], &b->norm[step], sizeof(float)) && !(isnan(a->norm[step]) && isnan(b->norm[step]))) first_norm = step;
        if (a->hash[step] != b->hash[step]) first_hash = step;
    }
    snprintf(name, sizeof name, "%s_%s_ranks%d_norm_bitwise", test_prefix, c->name, world);
    verdict(first_norm < 0, name, "step %d: unsharded norm %.9g, sharded %.9g", first_norm, first_norm < 0 ? 0 : a->norm[first_norm],
            first_norm < 0 ? 0 : b->norm[first_norm]);
    snprintf(name, sizeof name, "%s_%s_ranks%d_params_bitwise_every_step", test_prefix, c->name, world);
    verdict(first_hash < 0 && a->count == b->count && !memcmp(a->params, b->params, a->count * sizeof(float)), name,
            "first step that differs: %d", first_hash);
    snprintf(name, sizeof name, "%s_%s_ranks%d_m_v_gathered_bitwise", test_prefix, c->name, world);
    verdict(a->count == b->count && !memcmp(a->m, b->m, a->count * sizeof(float)) && !memcmp(a->v, b->v, a->count * sizeof(float)),
            name, "m or v differ from the unsharded run's");
    if (c->nan_step >= 0) {
        snprintf(name, sizeof name, "%s_%s_ranks%d_nonfinite_step_skipped", test_prefix, c->name, world);
        verdict(isnan(b->norm[c->nan_step]) && b->hash[c->nan_step] == b->hash[c->nan_step - 1], name,
                "norm %g at the NaN step; parameters %s", b->norm[c->nan_step],
                b->hash[c->nan_step] == b->hash[c->nan_step - 1] ? "unchanged" : "changed");
    }
}

#ifndef TEST_SHARD_HARNESS_ONLY   /* test_zero2.c takes the harness above */
static void refusals(void) {
    ddp_context *ddp = NULL;
    ddp_desc d;
    ddp_result r;
    int ids[NPARAMS];
    config plain = { "mismatch", 1, 0, -1, 0, 0 };
    memset(&d, 0, sizeof d);
    d.shard_optimizer = 2;
    d.log_level = DDP_LOG_OFF;
    r = ddp_init(&ddp, &d);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ddp), "shard_optimizer 2"), "shard_bad_value_refused", "%s: %s",
            ddp_result_string(r), ddp_last_error(ddp));
    ddp_shutdown(ddp);
    /* uneven inputs run sharded (tests/test_shard_join.c) */
    setenv("DDP_SHARD_OPTIMIZER", "yes", 1);
    r = ddp_init(&ddp, NULL);
    verdict(r == DDP_ERR_BAD_ENV && strstr(ddp_last_error(ddp), "DDP_SHARD_OPTIMIZER='yes'"), "shard_bad_env_refused", "%s: %s",
            ddp_result_string(r), ddp_last_error(ddp));
    ddp_shutdown(ddp);
    unsetenv("DDP_SHARD_OPTIMIZER");
    if (world > 1) {   /* ranks that disagree: the commit names the option on every rank */
        r = open_group(&plain, rank == 0, &ddp, ids);
        verdict(r == DDP_ERR_MISMATCH && strstr(ddp_last_error(ddp), "shard_optimizer"), "shard_mismatch_between_ranks_refused",
                "%s: %s", ddp_result_string(r), ddp_last_error(ddp));
        ddp_shutdown(ddp);
    }
}

/* tests/support/zero_reference.py's problem (PyTorch's ZeroRedundancyOptimizer(AdamW) over gloo), sharded
   here, its final parameters against the file PyTorch wrote (SHARD_TORCH_REF): within
   2e-5 + 1e-4 |ref| (PyTorch rounds AdamW and the norm differently: ADAMW in ddp.h's manual). */
enum { TORCH_PARAMS = 5 };
static void torch_compare(const char *path) {
    static const size_t tsizes[TORCH_PARAMS] = { 9000, 50, 6000, 3000, 700 };
    static float init[TORCH_PARAMS][MAXN], ref[30000];   /* one init each: ddp_commit reads them */
    ddp_context *ddp;
    ddp_desc d;
    ddp_adamw opt;
    ddp_result r;
    int ids[TORCH_PARAMS], k, t, bad = 0;
    size_t i, at = 0, total = 0;
    double worst = 0;
    FILE *f = fopen(path, "rb");
    for (k = 0; k < TORCH_PARAMS; k++) total += tsizes[k];
    if (!f || fread(ref, sizeof(float), total, f) != total) {
        verdict(0, "shard_vs_pytorch_zero_redundancy_optimizer", "cannot read %zu floats from %s", total, path);
        if (f) fclose(f);
        return;
    }
    fclose(f);
    memset(&d, 0, sizeof d);
    d.shard_optimizer = 1;
    d.bucket_cap_mb = 0.05;
    d.first_bucket_mb = 0.01;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f;
    r = ddp_init(&ddp, &d);
    for (k = 0; k < TORCH_PARAMS && r == DDP_OK; k++) {
        char name[16];
        for (i = 0; i < tsizes[k]; i++) init[k][i] = 0.5f * test_value(77 + (uint64_t)k, i);
        snprintf(name, sizeof name, "p%d", k);
        r = ddp_register_param(ddp, name, tsizes[k], k % 2 ? DDP_NO_DECAY : 0, init[k], &ids[k]);
    }
    if (r == DDP_OK) r = ddp_commit(ddp);
    for (t = 0; t < STEPS && r == DDP_OK; t++) {
        float scale = t % 3 == 0 ? 0.01f : 1.0f;
        r = ddp_zero_grad(ddp);
        for (k = TORCH_PARAMS - 1; k >= 0 && r == DDP_OK; k--) {
            const float *p = ddp_param(ddp, ids[k]);
            float *g = ddp_grad(ddp, ids[k]);
            for (i = 0; i < tsizes[k]; i++)
                g[i] = (p[i] * p[i] * 0.5f - test_value(1000 * (uint64_t)t + 100000 * (uint64_t)rank, 100000 * (uint64_t)k + i)) * scale;
            r = ddp_grad_ready(ddp, ids[k]);
        }
        if (r == DDP_OK) r = ddp_finish(ddp);
        if (r == DDP_OK) r = ddp_adamw_step(ddp, &opt, NULL);
    }
    for (k = 0; k < TORCH_PARAMS && r == DDP_OK; k++) {
        const float *p = ddp_param(ddp, ids[k]);
        for (i = 0; i < tsizes[k]; i++, at++) {
            double err = fabs((double)p[i] - ref[at]), tol = 2e-5 + 1e-4 * fabs(ref[at]);
            if (err > tol) bad++;
            if (err / tol > worst) worst = err / tol;
        }
    }
    verdict(r == DDP_OK && bad == 0, "shard_vs_pytorch_zero_redundancy_optimizer", "%s; %d of %zu beyond 2e-5 + 1e-4|ref| "
            "(worst %.3g of it)", r == DDP_OK ? "trained" : ddp_last_error(ddp), bad, total, worst);
    printf("  (shard_vs_pytorch_zero_redundancy_optimizer: %d ranks, %d steps, worst %.3g of the tolerance)\n", world, STEPS, worst);
    ddp_shutdown(ddp);
}

int main(void) {
    static const config configs[] = {
        { "fp32_clip", 1, 0, -1, 0, 0 },
        { "accum3_find_unused_skip_nonfinite", 3, 1, 4, 0, 0 },
        { "bf16_accum2", 2, 0, -1, 1, 0 },
        { "staged_slots", 1, 0, -1, 0, 1 },
    };
    size_t i;
    if (test_probe(&rank, &world) != 0) return 1;
    if (getenv("SHARD_TORCH_REF")) {   /* tests/test_shard_torch.sh */
        torch_compare(getenv("SHARD_TORCH_REF"));
        return test_summary("test_shard");
    }
    for (i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        run_result a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        if (configs[i].staged) setenv("DDP_STAGED_GRADS", "1", 1);
        if (train(&configs[i], 0, &a) == DDP_OK && train(&configs[i], 1, &b) == DDP_OK) compare(&configs[i], &a, &b);
        else test_failures++;
        unsetenv("DDP_STAGED_GRADS");
        free(a.params); free(a.m); free(a.v); free(b.params); free(b.m); free(b.v);
    }
    refusals();
    return test_summary("test_shard");
}
#endif /* TEST_SHARD_HARNESS_ONLY */
