/* test_outer.c — the outer sync (desc.outer: periodic averaging, DiLoCo, streaming DiLoCo) proved
   right, ranks as threads of one process:
   1. against tests/support/outer_reference.py, a float64 reference of the algorithm that carries
      for every value a bound on ddp.h's float32 error (its docstring derives it): 2 and 3 groups,
      inner AdamW and the program's own SGD, outer Nesterov, fragments and their schedule, delay
      and mix, fp32, bf16 and int8 blockwise wires; every rank's parameters after every step
      within the bound. Groups of 2 ranks SKIP while ddp_init refuses them (it says why).
   2. exact properties: one group with AVERAGE = plain training bit for bit (1 rank, and 2 ranks
      in one group); groups of one rank, the program's own SGD, H = 1, AVERAGE = DDP within a
      float32 rounding bound derived below; every rank's parameters the same bits right after
      each DiLoCo sync (and not between: the groups train apart); streaming: each fragment sent,
      in flight and merged at the steps the schedule states (ddp_outer_state), and that
      fragment's parameters the same bits on every rank right after its merge.
   3. bad input refused by name: group_size not dividing the ranks, inner_steps 0, more
      fragments than the model's blocks (at ddp_commit), delay_steps >= H / F, AVERAGE with an
      lr, ranks with different outer settings (DDP_ERR_MISMATCH at ddp_commit), ddp_outer_step
      without an update, ddp_consume_grads twice without ddp_outer_step, a NaN outer lr.
   The reference needs /usr/bin/python3 (or $OUTER_PYTHON) with numpy; without it part 1 SKIPs.
   Run from the repository root: build/test_outer */
#include "testlib.h"

enum { NPARAM = 3, COUNT = 144, MAXRANKS = 8, MAXSTEPS = 16 };
static const int sizes[NPARAM] = { 37, 50, 23 };
static const int offsets[NPARAM] = { 0, 48, 112 };   /* ddp.h's flat layout: 16-float boundaries */

/* One configuration of the outer sync and of the inner training (outer_reference.py's CONFIG). */
typedef struct config {
    const char *name;
    ddp_outer_mode mode;
    int S, G, H, F, delay, qb, steps;
    float mix, lr, mom;        /* lr, mom 0: the defaults (0.7, 0.9; AVERAGE 1, 0) */
    ddp_outer_wire wire;
    int sgd;                   /* inner optimizer: 1 the program's own SGD, 0 ddp_adamw_step */
} config;

/* What a run of thread-ranks brings back. */
typedef struct run_result {
    float params[MAXRANKS][MAXSTEPS][COUNT];
    int64_t syncs[MAXRANKS][MAXSTEPS];
    int in_flight[MAXRANKS][MAXSTEPS];
    ddp_result init_r[MAXRANKS], r[MAXRANKS];
    char error[MAXRANKS][1024];
} run_result;

typedef struct job { test_rank_fn fn; const config *c; run_result *res; } job;

static const char *mode_name(ddp_outer_mode m) {
    return m == DDP_OUTER_AVERAGE ? "average" : m == DDP_OUTER_DILOCO ? "diloco" : m == DDP_OUTER_STREAMING ? "streaming" : "off";
}
/* DDP_WIRE_DEFAULT is FP32 for AVERAGE, else BF16 (ddp_outer_wire's comment) */
static const char *wire_name(ddp_outer_mode m, ddp_outer_wire w) {
    if (w == DDP_WIRE_DEFAULT) w = m == DDP_OUTER_AVERAGE ? DDP_WIRE_FP32 : DDP_WIRE_BF16;
    return w == DDP_WIRE_FP32 ? "fp32" : w == DDP_WIRE_INT8 ? "int8" : "bf16";
}

/* The outer settings of a config, as a program sets them. */
static ddp_outer outer_of(const config *c) {
    ddp_outer o;
    memset(&o, 0, sizeof o);
    o.mode = c->mode;
    if (c->mode == DDP_OUTER_OFF) return o;
    o.group_size = c->S;
    o.inner_steps = c->H;
    o.lr = c->lr;
    o.momentum = c->mom;
    if (c->mode == DDP_OUTER_STREAMING) { o.fragments = c->F; o.delay_steps = c->delay; o.mix = c->mix; }
    o.wire = c->wire;
    o.quant_block = c->qb;
    return o;
}

/* The model: three parameters, initial value of flat element i 0.5 * test_value(77, i). */
static ddp_result open_model(ddp_context *ddp, int ids[NPARAM]) {
    float init[COUNT];   /* read at ddp_commit: one buffer for all */
    int k, i;
    ddp_result r;
    for (k = 0; k < NPARAM; k++) {
        for (i = 0; i < sizes[k]; i++) init[offsets[k] + i] = 0.5f * test_value(77, (uint64_t)(offsets[k] + i));
        if ((r = ddp_register_param(ddp, k == 0 ? "p0" : k == 1 ? "p1" : "p2", (size_t)sizes[k], k == 1 ? DDP_NO_DECAY : 0,
                                    init + offsets[k], &ids[k])) != DDP_OK)
            return r;
    }
    return ddp_commit(ddp);
}

/* Inner step t of rank `rank`: the gradient p * p / 2 - target (own autograd: ddp_grad_ready,
   ddp_finish), then AdamW (which takes the outer step) or the program's SGD and ddp_outer_step. */
static ddp_result inner_step(ddp_context *ddp, const int ids[NPARAM], int t, int rank, int sgd, int outer) {
    ddp_adamw opt;
    ddp_result r;
    int k, i;
    for (k = 0; k < NPARAM; k++) {
        const float *p = ddp_param(ddp, ids[k]);
        float *g = ddp_grad(ddp, ids[k]);
        for (i = 0; i < sizes[k]; i++)
            g[i] = p[i] * p[i] * 0.5f - test_value((uint64_t)(1000 * t + 100000 * rank + 1), (uint64_t)(offsets[k] + i));
        if ((r = ddp_grad_ready(ddp, ids[k])) != DDP_OK) return r;
    }
    if ((r = ddp_finish(ddp)) != DDP_OK) return r;
    if (!sgd) {
        memset(&opt, 0, sizeof opt);
        opt.lr = 0.02f;
        opt.weight_decay = 0.1f;
        return ddp_adamw_step(ddp, &opt, NULL);
    }
    if ((r = ddp_consume_grads(ddp)) != DDP_OK) return r;
    {
        size_t n, j;
        float *p = ddp_flat_params(ddp, &n);
        const float *g = ddp_flat_grads(ddp, NULL);
        for (j = 0; j < n; j++) p[j] -= 0.1f * g[j];
    }
    return outer ? ddp_outer_step(ddp) : DDP_OK;
}

/* One thread-rank of a config's run: every step's parameters and outer state recorded. */
static void train_rank(test_rank *self) {
    const job *jb = (const job *)self->shared;
    const config *c = jb->c;
    run_result *res = jb->res;
    ddp_context *ddp = NULL;
    ddp_desc d = test_desc(self);
    int ids[NPARAM], t, me = self->rank;
    ddp_result r;
    d.outer = outer_of(c);
    if ((r = ddp_init(&ddp, &d)) == DDP_OK) r = open_model(ddp, ids);
    res->init_r[me] = r;
    for (t = 0; r == DDP_OK && t < c->steps; t++) {
        ddp_outer_status s;
        size_t n;
        const float *p;
        if ((r = inner_step(ddp, ids, t, me, c->sgd, c->mode != DDP_OUTER_OFF)) != DDP_OK) break;
        p = ddp_flat_params(ddp, &n);
        if (n != COUNT) { r = DDP_ERR_INVALID_STATE; snprintf(res->error[me], sizeof res->error[me], "%zu floats, not %d", n, COUNT); break; }
        memcpy(res->params[me][t], p, sizeof res->params[me][t]);
        s = ddp_outer_state(ddp);
        res->syncs[me][t] = s.syncs;
        res->in_flight[me][t] = s.in_flight;
    }
    if (r != DDP_OK && !res->error[me][0]) snprintf(res->error[me], sizeof res->error[me], "%s", ddp ? ddp_last_error(ddp) : ddp_last_error(NULL));
    res->r[me] = r;
    ddp_shutdown(ddp);
}

/* Runs c on its S * G thread-ranks. Returns 1 when every rank trained, 0 when ddp_init refused
   groups of several ranks (*skip_why set), -1 on a failure (printed). */
static int run_config(const config *c, run_result *res, const char *name, char *skip_why, size_t skip_cap) {
    test_rank ranks[MAXRANKS];
    job jb;
    int world = c->S * c->G, r;
    memset(res, 0, sizeof *res);
    jb.fn = train_rank; jb.c = c; jb.res = res;
    test_run_ranks(world, (void **)&jb, ranks);
    for (r = 0; r < world; r++)
        if (res->r[r] != DDP_OK) {
            if (res->init_r[r] != DDP_OK && strstr(res->error[r], "not built (yet)")) {
                snprintf(skip_why, skip_cap, "%s", res->error[r]);
                return 0;
            }
            printf("FAIL %s: rank %d: %s\n", name, r, res->error[r]);
            test_failures++;
            return -1;
        }
    return 1;
}

/* ---------------- 1. against the float64 reference ---------------- */

static void config_text(const config *c, char *out, size_t cap) {
    size_t len = (size_t)snprintf(out, cap, "mode=%s,S=%d,G=%d,H=%d,F=%d,delay=%d,mix=%.9g,wire=%s,qb=%d,inner=%s,steps=%d",
                                  mode_name(c->mode), c->S, c->G, c->H, c->F ? c->F : 1, c->delay, c->mix, wire_name(c->mode, c->wire),
                                  c->qb ? c->qb : 64, c->sgd ? "sgd" : "adamw", c->steps);
    if (c->lr != 0) len += (size_t)snprintf(out + len, cap - len, ",lr=%.9g", c->lr);
    if (c->mom != 0) snprintf(out + len, cap - len, ",mom=%.9g", c->mom);
}

static const config reference_configs[] = {
    /* name                                   mode                 S  G  H  F dly qb  steps mix   lr    mom   wire           sgd */
    { "diloco_3groups_adamw_bf16",             DDP_OUTER_DILOCO,    1, 3, 4, 1, 0, 0,  13, 0.0f, 0,    0,    DDP_WIRE_BF16, 0 },
    { "diloco_2groups_sgd_int8_block20",       DDP_OUTER_DILOCO,    1, 2, 3, 1, 0, 20, 10, 0.0f, 0.5f, 0.8f, DDP_WIRE_INT8, 1 },
    { "diloco_3groups_adamw_fp32_delta",       DDP_OUTER_DILOCO,    1, 3, 3, 1, 0, 0,  8,  0.0f, 0,    0,    DDP_WIRE_FP32, 0 },
    { "average_3groups_adamw",                 DDP_OUTER_AVERAGE,   1, 3, 3, 1, 0, 0,  8,  0.0f, 0,    0,    DDP_WIRE_DEFAULT, 0 },
    { "streaming_3groups_F3_delay1_mix_bf16",  DDP_OUTER_STREAMING, 1, 3, 6, 3, 1, 0,  14, 0.5f, 0,    0,    DDP_WIRE_BF16, 0 },
    { "streaming_2groups_F3_H8_int8_sgd",      DDP_OUTER_STREAMING, 1, 2, 8, 3, 1, 24, 15, 0.25f, 0,   0,    DDP_WIRE_INT8, 1 },
    { "streaming_2groups_F2_delay0_int8",      DDP_OUTER_STREAMING, 1, 2, 4, 2, 0, 64, 9,  0.0f, 0,    0,    DDP_WIRE_INT8, 0 },
    /* groups of 2 ranks (SKIP while ddp_init refuses them) */
    { "diloco_2groups_of_2_adamw_bf16",        DDP_OUTER_DILOCO,    2, 2, 3, 1, 0, 0,  7,  0.0f, 0,    0,    DDP_WIRE_BF16, 0 },
    { "streaming_2groups_of_2_F2_delay1_int8", DDP_OUTER_STREAMING, 2, 2, 4, 2, 1, 16, 9,  0.5f, 0,    0,    DDP_WIRE_INT8, 1 },
};
enum { NREF = sizeof reference_configs / sizeof reference_configs[0] };

/* Deliberately wrong references (outer_reference.py's MUTANTS), each against a config where
   its error shows: ddp.h's run must fall outside each one's bound, or the comparison could not
   see that kind of error. */
static const struct { const char *mutant, *config, *what; } mutants[] = {
    { "heavy_ball", "diloco_3groups_adamw_bf16", "heavy-ball momentum instead of Nesterov" },
    { "offsets_f_times_H_over_F", "streaming_2groups_F3_H8_int8_sgd", "fragment offsets f * (H / F) instead of f * H / F" },
    { "no_delay", "streaming_3groups_F3_delay1_mix_bf16", "merges at the send step, ignoring delay_steps" },
    { "no_mix", "streaming_2groups_F3_H8_int8_sgd", "ignores mix" },
    { "bf16_truncated", "diloco_3groups_adamw_bf16", "truncates to bf16 instead of rounding to nearest even" },
    { "int8_over_128", "diloco_2groups_sgd_int8_block20", "scales int8 blocks by max / 128" },
    { "unaligned_fragments", "streaming_2groups_F2_delay0_int8", "cuts fragments without 16-float alignment" },
    { "no_division_by_groups", "average_3groups_adamw", "sums the groups without dividing by their number" },
};
enum { NMUT = sizeof mutants / sizeof mutants[0] };

/* ddp.h's run of config c against reference values `at` (per step, per group: the values, then
   their bounds): how many values are outside, the worst error / bound, and the bound's spread. */
typedef struct cmp { int bad, first_t, first_r, first_i, loose, n; double worst, bound_sum, err_sum, bound_max; } cmp;
static cmp compare(const config *c, const run_result *res, const double *at) {
    cmp m;
    int t, r, k;
    memset(&m, 0, sizeof m);
    for (t = 0; t < c->steps; t++)
        for (r = 0; r < c->S * c->G; r++) {
            const double *want = at + ((size_t)t * c->G + (size_t)(r / c->S)) * 2 * COUNT, *bound = want + COUNT;
            for (k = 0; k < COUNT; k++) {
                double err = fabs((double)res->params[r][t][k] - want[k]);
                if (bound[k] > 0) { m.bound_sum += bound[k]; m.err_sum += err; m.n++; }
                if (bound[k] > m.bound_max) m.bound_max = bound[k];
                m.loose += bound[k] > 1e-5;
                if (err > bound[k] && !m.bad++) { m.first_t = t; m.first_i = k; m.first_r = r; }
                if (bound[k] > 0 && err / bound[k] > m.worst) m.worst = err / bound[k];
            }
        }
    return m;
}

static void test_reference(void) {
    char cmd[8192], path[] = "/tmp/test_outer_refXXXXXX", text[256];
    const char *py = getenv("OUTER_PYTHON"), *script = getenv("OUTER_REFERENCE");
    static run_result res[NREF];
    size_t start[NREF + NMUT], total = 0, len;
    int ran[NREF], i, j, fd, rc;
    double *ref = NULL;
    FILE *f;
    if (!py || !*py) py = "/usr/bin/python3";
    if (!script || !*script) script = "tests/support/outer_reference.py";
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", py);
    if (access(script, R_OK) != 0 || system(cmd) != 0) {
        printf("SKIP outer_reference: needs %s with numpy and %s (run from the repository root)\n", py, script);
        return;
    }
    /* the reference first: the one fork of this process comes before any thread-rank exists */
    if ((fd = mkstemp(path)) < 0) { verdict(0, "outer_reference", "mkstemp: %s", strerror(errno)); return; }
    close(fd);
    len = (size_t)snprintf(cmd, sizeof cmd, "%s %s %s", py, script, path);
    for (i = 0; i < NREF + NMUT; i++) {
        const config *c = NULL;
        if (i < NREF) c = &reference_configs[i];
        else for (j = 0; j < NREF; j++) if (!strcmp(reference_configs[j].name, mutants[i - NREF].config)) c = &reference_configs[j];
        if (!c) { verdict(0, "outer_reference", "mutant %s: no config %s", mutants[i - NREF].mutant, mutants[i - NREF].config); return; }
        config_text(c, text, sizeof text);
        len += (size_t)snprintf(cmd + len, sizeof cmd - len, " %s%s%s", text, i < NREF ? "" : ",mutant=", i < NREF ? "" : mutants[i - NREF].mutant);
        start[i] = total;
        total += (size_t)c->steps * (size_t)c->G * 2 * COUNT;
    }
    rc = system(cmd);
    ref = (double *)malloc(total * sizeof(double));
    f = fopen(path, "rb");
    if (rc != 0 || !ref || !f || fread(ref, sizeof(double), total, f) != total) {
        verdict(0, "outer_reference", "the reference did not run (%s: status %d)", cmd, rc);
        if (f) fclose(f);
        remove(path);
        free(ref);
        return;
    }
    fclose(f);
    remove(path);
    for (i = 0; i < NREF; i++) {
        const config *c = &reference_configs[i];
        char name[128], why[1100];
        cmp m;
        int got;
        snprintf(name, sizeof name, "outer_reference_%s", c->name);
        ran[i] = 0;
        if ((got = run_config(c, &res[i], name, why, sizeof why)) == 0) {
            printf("SKIP %s: groups of %d ranks: ddp_init refuses them: %s\n", name, c->S, why);
            continue;
        }
        if (got < 0) continue;
        ran[i] = 1;
        m = compare(c, &res[i], ref + start[i]);
        if (m.bad) {
            const double *want = ref + start[i] + ((size_t)m.first_t * c->G + (size_t)(m.first_r / c->S)) * 2 * COUNT;
            verdict(0, name, "%d values outside the bound; first: step %d rank %d element %d: %.9g, reference %.9g, bound %.3g",
                    m.bad, m.first_t + 1, m.first_r, m.first_i, (double)res[i].params[m.first_r][m.first_t][m.first_i],
                    want[m.first_i], want[COUNT + m.first_i]);
            continue;
        }
        printf("  (%s: worst error %.3g of its bound; bound mean %.3g, largest %.3g, above 1e-5 at %d of %d values "
               "(a wire rounding boundary within reach); mean error %.3g)\n", name, m.worst, m.n ? m.bound_sum / m.n : 0.0,
               m.bound_max, m.loose, m.n, m.n ? m.err_sum / m.n : 0.0);
        /* Where a wire rounding boundary is within reach the bound must take a whole quantum
           (~1e-4 here), as large as an error of the algorithm: such values must stay few. */
        verdict(m.loose * 20 <= m.n, name, "the derived bound is above 1e-5 at %d of %d values: too loose to check the "
                "algorithm", m.loose, m.n);
    }
    for (i = 0; i < NMUT; i++) {
        char name[128];
        cmp m;
        for (j = 0; j < NREF; j++) if (!strcmp(reference_configs[j].name, mutants[i].config)) break;
        snprintf(name, sizeof name, "outer_reference_catches_%s", mutants[i].mutant);
        if (!ran[j]) { printf("SKIP %s: %s did not run\n", name, mutants[i].config); continue; }
        m = compare(&reference_configs[j], &res[j], ref + start[NREF + i]);
        if (m.bad) printf("  (%s: %d of %d values outside the bound of a reference that %s)\n", name, m.bad, m.n, mutants[i].what);
        verdict(m.bad > 0, name, "ddp.h's %s run is within the bound of a reference that %s: the comparison cannot see that "
                "error", mutants[i].config, mutants[i].what);
    }
    free(ref);
}

/* ---------------- 2. exact properties ---------------- */

/* One group with AVERAGE (lr 1, momentum 0, fp32 wire: the parameters themselves travel and a
   group of one averages to itself) changes nothing: the same bits as outer off. */
static void test_one_group_is_plain(int world) {
    static run_result plain, avg;
    config c;
    char name[96], why[600];
    int r, same = 1;
    memset(&c, 0, sizeof c);
    c.S = world; c.G = 1; c.H = 3; c.steps = 8;
    snprintf(name, sizeof name, "outer_one_group_average_is_plain_training_%d_rank%s", world, world > 1 ? "s" : "");
    c.mode = DDP_OUTER_OFF;
    if (run_config(&c, &plain, name, why, sizeof why) != 1) return;
    c.mode = DDP_OUTER_AVERAGE;
    if (run_config(&c, &avg, name, why, sizeof why) != 1) return;
    for (r = 0; r < world; r++)
        same &= memcmp(plain.params[r], avg.params[r], sizeof plain.params[r]) == 0;
    verdict(same && avg.syncs[0][c.steps - 1] == c.steps / c.H, name, "bits differ from outer off (%d), or %lld syncs, not %d",
            !same, (long long)avg.syncs[0][c.steps - 1], c.steps / c.H);
}

/* Groups of one rank, the program's own SGD (p -= lr g), H = 1, AVERAGE: every step averages
   the parameters after one SGD step from the same start, which is DDP's step on the averaged
   gradient, up to float32 rounding. The bound, per element, as a running error analysis
   (u = 2^-24; test_outer's model g_r(p) = p^2/2 - c_r, so |g_r(a) - g_r(b)| <= |a - b| (|a| + |a - b|)):
   E' = E + lr E (|p| + E) + e_ddp + e_avg, where
     e_ddp = lr (gamma_{G+1} mean|g_r| + 2 u mean(|p|^2/2 + |g_r|)) + u lr |gbar| + u |p'|
             (g_r computed with 2 roundings, averaged with G + 1, the product and the update),
     e_avg = lr 2 u mean(|p|^2/2 + |g_r|) + mean(u lr |g_r| + u |p_r'|) + gamma_G mean|p_r'|
             (each rank's own g_r and update, then G - 1 additions and the division),
   with every |.| taken from the DDP run plus E (the other run is within E of it). */
static void test_sgd_h1_is_ddp(int G) {
    static run_result ddp_run, avg;
    config c;
    char name[96], why[600];
    double E[COUNT], worst = 0, u = 1.0 / 16777216.0, lr = 0.1f;
    double gG1 = (G + 1) * u / (1 - (G + 1) * u), gG = G * u / (1 - G * u);
    float p0[COUNT];
    int t, k, r, bad = 0, first = -1;
    memset(&c, 0, sizeof c);
    c.S = 1; c.G = G; c.H = 1; c.steps = 10; c.sgd = 1;
    snprintf(name, sizeof name, "outer_sgd_h1_average_is_ddp_%d_groups", G);
    c.mode = DDP_OUTER_OFF;
    if (run_config(&c, &ddp_run, name, why, sizeof why) != 1) return;
    c.mode = DDP_OUTER_AVERAGE;
    if (run_config(&c, &avg, name, why, sizeof why) != 1) return;
    for (k = 0; k < COUNT; k++) { E[k] = 0; p0[k] = 0; }
    for (k = 0; k < NPARAM; k++)
        for (r = 0; r < sizes[k]; r++) p0[offsets[k] + r] = 0.5f * test_value(77, (uint64_t)(offsets[k] + r));
    for (t = 0; t < c.steps; t++)
        for (k = 0; k < COUNT; k++) {
            double p = fabs((double)(t ? ddp_run.params[0][t - 1][k] : p0[k])) + E[k], gsum = 0, rsum = 0, psum = 0, gbar = 0;
            double pn = fabs((double)ddp_run.params[0][t][k]) + E[k], e_ddp, e_avg, err;
            for (r = 0; r < G; r++) {
                double c_r = test_value((uint64_t)(1000 * t + 100000 * r + 1), (uint64_t)k), gr = fabs(p * p * 0.5) + fabs(c_r);
                gsum += gr;
                gbar += p * p * 0.5 - c_r;
                rsum += 2 * u * (p * p * 0.5 + gr);
                psum += pn + lr * gr;
            }
            gbar = fabs(gbar / G) + E[k] * p;
            e_ddp = lr * (gG1 * gsum / G + rsum / G) + u * lr * gbar + u * pn;
            e_avg = lr * rsum / G + (u * lr * gsum + u * psum) / G + gG * psum / G;
            E[k] = (E[k] + lr * E[k] * (p + E[k]) + e_ddp + e_avg) * (1 + 1e-6);
            err = fabs((double)avg.params[0][t][k] - (double)ddp_run.params[0][t][k]);
            for (r = 1; r < G; r++) if (memcmp(avg.params[r][t], avg.params[0][t], sizeof avg.params[0][t])) { bad++; first = -2; }
            if (err > E[k] && !bad++) first = t * COUNT + k;
            if (E[k] > 0 && err / E[k] > worst) worst = err / E[k];
        }
    if (!bad) printf("  (%s: worst difference %.3g of the float32 rounding bound)\n", name, worst);
    verdict(!bad, name, "%d values outside the float32 rounding bound or ranks apart; first: %s step %d element %d", bad,
            first == -2 ? "ranks apart at" : "", first >= 0 ? first / COUNT + 1 : -1, first >= 0 ? first % COUNT : -1);
}

/* DiLoCo (F = 1, no delay), 3 groups of one rank: right after every sync every rank holds the
   same bits, and between syncs the groups have trained apart. */
static void test_replicas_meet(void) {
    static run_result res;
    config c;
    char why[600];
    const char *name = "outer_diloco_replicas_equal_right_after_every_sync";
    int t, r, bad = 0, apart = 0, syncs_ok = 1;
    memset(&c, 0, sizeof c);
    c.mode = DDP_OUTER_DILOCO; c.S = 1; c.G = 3; c.H = 3; c.steps = 12; c.wire = DDP_WIRE_BF16;
    if (run_config(&c, &res, name, why, sizeof why) != 1) return;
    for (t = 0; t < c.steps; t++) {
        int synced = (t + 1) % c.H == 0, same = 1;
        for (r = 1; r < c.G; r++) same &= memcmp(res.params[r][t], res.params[0][t], sizeof res.params[0][t]) == 0;
        if (synced && !same) bad++;
        if (!synced && !same) apart++;
        for (r = 0; r < c.G; r++) syncs_ok &= res.syncs[r][t] == (t + 1) / c.H && res.in_flight[r][t] == -1;
    }
    verdict(!bad && apart == c.steps - c.steps / c.H && syncs_ok, name, "%d syncs left ranks apart; %d of %d steps between "
            "syncs had the groups apart; syncs counted right %d", bad, apart, c.steps - c.steps / c.H, syncs_ok);
}

/* Streaming: fragment f is sent after inner step t when (t + f * H / F) % H == 0, is in flight
   for delay steps, and merges after step t + delay; the expected steps below are worked out by
   hand from that rule. Right after a merge the fragment's floats are the same bits on every
   rank (mix 0). */
static void test_streaming_schedule(int H, int F, int delay, const int *send_step, const int *send_frag, int sends, int steps) {
    static run_result res;
    config c;
    char name[96], why[600];
    int t, r, bad = 0, units = COUNT / 16;
    memset(&c, 0, sizeof c);
    c.mode = DDP_OUTER_STREAMING; c.S = 1; c.G = 2; c.H = H; c.F = F; c.delay = delay; c.steps = steps;
    c.wire = DDP_WIRE_BF16;
    snprintf(name, sizeof name, "outer_streaming_schedule_H%d_F%d_delay%d", H, F, delay);
    if (run_config(&c, &res, name, why, sizeof why) != 1) return;
    for (t = 1; t <= steps; t++) {
        int64_t want_syncs = 0;
        int want_flight = -1, merged = -1, s;
        for (s = 0; s < sends; s++) {
            if (send_step[s] + delay <= t) want_syncs++;
            if (send_step[s] + delay == t) merged = send_frag[s];
            if (send_step[s] <= t && t < send_step[s] + delay) want_flight = send_frag[s];
        }
        for (r = 0; r < c.G; r++)
            if (res.syncs[r][t - 1] != want_syncs || res.in_flight[r][t - 1] != want_flight) {
                if (!bad++) printf("  (%s: after step %d rank %d: syncs %lld in flight %d; the schedule says %lld, %d)\n", name, t, r,
                                   (long long)res.syncs[r][t - 1], res.in_flight[r][t - 1], (long long)want_syncs, want_flight);
            }
        if (merged >= 0) {
            size_t lo = (size_t)(units * merged / F * 16), hi = (size_t)(units * (merged + 1) / F * 16);
            if (memcmp(res.params[0][t - 1] + lo, res.params[1][t - 1] + lo, (hi - lo) * sizeof(float))) {
                if (!bad++) printf("  (%s: fragment %d [%zu, %zu) merged after step %d differs across ranks)\n", name, merged, lo, hi, t);
            }
            if (!memcmp(res.params[0][t - 1], res.params[1][t - 1], sizeof res.params[0][t - 1]) && F > 1) {
                if (!bad++) printf("  (%s: after step %d every fragment is equal, not only fragment %d)\n", name, t, merged);
            }
        }
    }
    verdict(!bad, name, "%d steps off the schedule", bad);
}

/* bf16 parameters (fp32 master, bf16 working copies; inner AdamW, the gradients given in bf16):
   after every step every working copy is its master rounded (the merge rounds the copies of the
   floats it changed; a copy left behind would also fail the next ddp_adamw_step), and right
   after each DiLoCo sync the masters and the copies are the same bits on every rank. */
typedef struct bf16_job {
    test_rank_fn fn;
    float master[3][12][COUNT];
    ddp_bf16 copy[3][12][COUNT];
    int64_t syncs[3][12];
    int stale[3];
    ddp_result r[3];
    char error[3][1024];
} bf16_job;
enum { BF16_STEPS = 12, BF16_H = 4 };

static void bf16_rank(test_rank *self) {
    bf16_job *jb = (bf16_job *)self->shared;
    ddp_desc d = test_desc(self);
    ddp_context *ddp = NULL;
    ddp_adamw opt;
    int ids[NPARAM], t, k, i, me = self->rank;
    ddp_result r;
    d.param_dtype = DDP_DTYPE_BF16;
    d.outer.mode = DDP_OUTER_DILOCO;
    d.outer.group_size = 1;
    d.outer.inner_steps = BF16_H;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.02f;
    opt.weight_decay = 0.1f;
    if ((r = ddp_init(&ddp, &d)) == DDP_OK) r = open_model(ddp, ids);
    for (t = 0; r == DDP_OK && t < BF16_STEPS; t++) {
        size_t n;
        const float *master;
        const ddp_bf16 *copy;
        for (k = 0; k < NPARAM && r == DDP_OK; k++) {
            const ddp_bf16 *w = ddp_param_bf16(ddp, ids[k]);
            ddp_bf16 *g = ddp_grad_bf16(ddp, ids[k]);
            for (i = 0; i < sizes[k]; i++) {
                float p = ddp__from_bf16(w[i]);
                g[i] = ddp__to_bf16(p * p * 0.5f - test_value((uint64_t)(1000 * t + 100000 * me + 1), (uint64_t)(offsets[k] + i)));
            }
            r = ddp_grad_ready(ddp, ids[k]);
        }
        if (r == DDP_OK) r = ddp_finish(ddp);
        if (r == DDP_OK) r = ddp_adamw_step(ddp, &opt, NULL);
        if (r != DDP_OK) break;
        master = ddp_flat_params(ddp, &n);
        copy = ddp_flat_params_bf16(ddp, NULL);
        memcpy(jb->master[me][t], master, sizeof jb->master[me][t]);
        memcpy(jb->copy[me][t], copy, sizeof jb->copy[me][t]);
        for (i = 0; i < COUNT; i++) jb->stale[me] += copy[i] != ddp__to_bf16(master[i]);
        jb->syncs[me][t] = ddp_outer_state(ddp).syncs;
    }
    if (r != DDP_OK) snprintf(jb->error[me], sizeof jb->error[me], "%s", ddp ? ddp_last_error(ddp) : ddp_last_error(NULL));
    jb->r[me] = r;
    ddp_shutdown(ddp);
}

static void test_bf16_params(void) {
    static bf16_job jb;
    test_rank ranks[3];
    const char *name = "outer_diloco_bf16_parameters_copies_follow_the_master_and_meet";
    int t, r, bad = 0, stale = 0, apart = 0;
    memset(&jb, 0, sizeof jb);
    jb.fn = bf16_rank;
    test_run_ranks(3, (void **)&jb, ranks);
    for (r = 0; r < 3; r++)
        if (jb.r[r] != DDP_OK) { verdict(0, name, "rank %d: %s", r, jb.error[r]); return; }
    for (r = 0; r < 3; r++) stale += jb.stale[r];
    for (t = 0; t < BF16_STEPS; t++) {
        int synced = (t + 1) % BF16_H == 0, same = 1;
        for (r = 1; r < 3; r++)
            same &= !memcmp(jb.master[r][t], jb.master[0][t], sizeof jb.master[0][t]) &&
                    !memcmp(jb.copy[r][t], jb.copy[0][t], sizeof jb.copy[0][t]);
        if (synced && (!same || jb.syncs[0][t] != (t + 1) / BF16_H)) bad++;
        if (!synced && !same) apart++;
    }
    verdict(!bad && !stale && apart == BF16_STEPS - BF16_STEPS / BF16_H, name, "%d syncs left ranks apart or uncounted; %d "
            "working copies not their master rounded; apart between syncs %d of %d steps", bad, stale, apart,
            BF16_STEPS - BF16_STEPS / BF16_H);
}

/* ---------------- 3. bad input ---------------- */

/* Parameters the program writes after ddp_commit (its own weights, the same on every rank) are
   the outer copy's too: with AdamW at lr 0 the parameters stay, and the outer step at H leaves
   them where the program put them (were the outer copy still the commit's values, DiLoCo would
   pull them back towards those). */
static float written_params[MAXRANKS][COUNT];
static void written_rank(test_rank *self) {
    ddp_context *ddp = NULL;
    ddp_desc d = test_desc(self);
    float vals[COUNT];
    int ids[NPARAM], t, i, k;
    ddp_adamw opt;
    ddp_result r;
    memset(&opt, 0, sizeof opt);   /* lr 0 */
    d.outer.mode = DDP_OUTER_DILOCO;
    d.outer.group_size = 1;
    d.outer.inner_steps = 2;
    d.outer.wire = DDP_WIRE_FP32;
    for (i = 0; i < COUNT; i++) vals[i] = 0.25f * test_value(5, (uint64_t)i);
    if ((r = ddp_init(&ddp, &d)) == DDP_OK) r = open_model(ddp, ids);
    if (r == DDP_OK) r = ddp_copy_from_host(ddp, DDP_PARAMS, 0, vals, COUNT);
    for (t = 0; r == DDP_OK && t < 2; t++) {
        for (k = 0; k < NPARAM && r == DDP_OK; k++) r = ddp_grad_ready(ddp, ids[k]);
        if (r == DDP_OK) r = ddp_finish(ddp);
        if (r == DDP_OK) r = ddp_adamw_step(ddp, &opt, NULL);
    }
    if (r == DDP_OK && ddp_outer_state(ddp).syncs != 1) r = DDP_ERR_INVALID_STATE;
    if (r == DDP_OK) r = ddp_copy_to_host(ddp, DDP_PARAMS, 0, written_params[self->rank], COUNT);
    if (r != DDP_OK) written_params[self->rank][0] = -1e30f;
    ddp_shutdown(ddp);
}

static void test_written_params(void) {
    void *shared[1];
    test_rank ranks[2];
    float vals[COUNT];
    int i, r, differ = 0;
    for (i = 0; i < COUNT; i++) vals[i] = 0.25f * test_value(5, (uint64_t)i);
    shared[0] = (void *)written_rank;
    test_run_ranks(2, shared, ranks);
    for (r = 0; r < 2; r++)
        for (i = 0; i < COUNT; i++) {
            int pad = (i >= 37 && i < 48) || (i >= 98 && i < 112) || i >= 135;   /* the layout's padding */
            if (!pad && memcmp(&vals[i], &written_params[r][i], sizeof(float))) differ++;
        }
    verdict(differ == 0, "outer_params_written_after_commit_are_the_outer_copy", "%d values moved at the outer step", differ);
}

static int contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

/* ddp_init (and ddp_commit) of one rank alone with these outer settings: the result and message. */
static ddp_result open_alone(const ddp_outer *o, char *msg, size_t cap, ddp_context **keep) {
    ddp_desc d;
    ddp_context *ddp = NULL;
    int ids[NPARAM];
    ddp_result r;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.log_level = DDP_LOG_OFF;
    d.outer = *o;
    if ((r = ddp_init(&ddp, &d)) == DDP_OK) r = open_model(ddp, ids);
    snprintf(msg, cap, "%s", r == DDP_OK ? "" : ddp ? ddp_last_error(ddp) : ddp_last_error(NULL));
    if (keep && r == DDP_OK) *keep = ddp;
    else ddp_shutdown(ddp);
    return r;
}

/* Each rank its own outer settings (rank 1's H one more): ddp_commit fails naming "outer". */
typedef struct mismatch_job { test_rank_fn fn; ddp_result r[2]; char msg[2][1024]; int group_size_3; } mismatch_job;
static void mismatch_rank(test_rank *self) {
    mismatch_job *jb = (mismatch_job *)self->shared;
    ddp_desc d = test_desc(self);
    ddp_context *ddp = NULL;
    int ids[NPARAM];
    ddp_result r;
    d.outer.mode = DDP_OUTER_DILOCO;
    d.outer.group_size = jb->group_size_3 ? 2 : 1;
    d.outer.inner_steps = 4 + (jb->group_size_3 ? 0 : self->rank);
    if ((r = ddp_init(&ddp, &d)) == DDP_OK) r = open_model(ddp, ids);
    if (self->rank < 2) {
        jb->r[self->rank] = r;
        snprintf(jb->msg[self->rank], sizeof jb->msg[0], "%s", ddp ? ddp_last_error(ddp) : ddp_last_error(NULL));
    }
    ddp_shutdown(ddp);
}

static void test_refusals(void) {
    ddp_outer o;
    char msg[1024];
    ddp_result r;
    ddp_context *ddp = NULL;
    int ids[NPARAM];
    (void)ids;

    {   /* group_size 2 over 3 ranks */
        mismatch_job jb;
        test_rank ranks[3];
        memset(&jb, 0, sizeof jb);
        jb.fn = mismatch_rank; jb.group_size_3 = 1;
        test_run_ranks(3, (void **)&jb, ranks);
        verdict(jb.r[0] == DDP_ERR_INVALID_ARGUMENT && jb.r[1] == DDP_ERR_INVALID_ARGUMENT &&
                contains(jb.msg[1], "rank 1") && contains(jb.msg[1], "group_size 2 does not divide the 3 ranks"),
                "outer_refuses_group_size_not_dividing_the_ranks", "%d %d: %s", jb.r[0], jb.r[1], jb.msg[1]);
    }
    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_DILOCO;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(msg, "inner_steps is 0") && contains(msg, "rank 0"),
            "outer_refuses_inner_steps_0", "%d: %s", r, msg);

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_STREAMING; o.inner_steps = 20; o.fragments = 10;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(msg, "10 fragments") && contains(msg, "144 floats") &&
            contains(msg, "only 9 blocks"), "outer_refuses_more_fragments_than_blocks_at_commit", "%d: %s", r, msg);

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_STREAMING; o.inner_steps = 20; o.fragments = 9;   /* 9 blocks: one each, accepted */
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_OK, "outer_accepts_one_fragment_per_block", "%d: %s", r, msg);

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_STREAMING; o.inner_steps = 6; o.fragments = 2; o.delay_steps = 3;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(msg, "delay_steps 3") && contains(msg, "delay_steps < inner_steps / fragments"),
            "outer_refuses_delay_at_least_H_over_F", "%d: %s", r, msg);
    o.delay_steps = 2;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_OK, "outer_accepts_delay_below_H_over_F", "%d: %s", r, msg);

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_AVERAGE; o.inner_steps = 4; o.lr = 0.5f;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(msg, "AVERAGE is outer lr 1") && contains(msg, "lr 0.5"),
            "outer_refuses_average_with_an_lr", "%d: %s", r, msg);

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_DILOCO; o.inner_steps = 4; o.lr = NAN;
    r = open_alone(&o, msg, sizeof msg, NULL);
    verdict(r == DDP_ERR_INVALID_ARGUMENT && contains(msg, "outer.lr is nan"), "outer_refuses_nan_lr",
            "%d: %s", r, msg);

    {   /* rank 1's inner_steps differs: both ranks fail at ddp_commit naming the outer settings */
        mismatch_job jb;
        test_rank ranks[2];
        memset(&jb, 0, sizeof jb);
        jb.fn = mismatch_rank;
        test_run_ranks(2, (void **)&jb, ranks);
        verdict(jb.r[0] == DDP_ERR_MISMATCH && jb.r[1] == DDP_ERR_MISMATCH && contains(jb.msg[0], "outer") &&
                contains(jb.msg[1], "outer") && contains(jb.msg[0], "inner_steps 4") && contains(jb.msg[0], "inner_steps 5"),
                "outer_refuses_ranks_with_different_outer_settings", "%d %d: %s | %s", jb.r[0], jb.r[1], jb.msg[0], jb.msg[1]);
    }

    memset(&o, 0, sizeof o);
    o.mode = DDP_OUTER_DILOCO; o.inner_steps = 4;
    if (open_alone(&o, msg, sizeof msg, &ddp) == DDP_OK) {
        int k, ok;
        r = ddp_outer_step(ddp);   /* no update yet */
        ok = r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(ddp), "ddp_outer_step without an update");
        verdict(ok, "outer_refuses_outer_step_without_consume_grads", "%d: %s", r, ddp_last_error(ddp));
        ddp_shutdown(ddp);
        ddp = NULL;
        /* consume, update, a backward, consume again: the missing ddp_outer_step is named */
        if (open_alone(&o, msg, sizeof msg, &ddp) == DDP_OK) {
            ddp_grad_ready(ddp, 0); ddp_grad_ready(ddp, 1); ddp_grad_ready(ddp, 2);
            ddp_finish(ddp);
            r = ddp_consume_grads(ddp);
            for (k = 0; k < NPARAM; k++) ddp_grad_ready(ddp, k);
            if (r == DDP_OK) r = ddp_finish(ddp);
            if (r == DDP_OK) {
                r = ddp_consume_grads(ddp);
                verdict(r == DDP_ERR_INVALID_STATE && contains(ddp_last_error(ddp), "ddp_outer_step is missing"),
                        "outer_refuses_consume_grads_twice_without_outer_step", "%d: %s", r, ddp_last_error(ddp));
                ddp_outer_step(ddp);
                r = ddp_consume_grads(ddp);   /* the step taken: the same averages are still unused */
                verdict(r == DDP_OK, "outer_consume_grads_after_outer_step", "%d: %s", r, ddp_last_error(ddp));
            } else verdict(0, "outer_refuses_consume_grads_twice_without_outer_step", "setup: %s", ddp_last_error(ddp));
            ddp_shutdown(ddp);
        }
    } else verdict(0, "outer_refuses_outer_step_without_consume_grads", "setup: %s", msg);
}

int main(void) {
    static const int send6_step[] = { 2, 4, 6, 8, 10, 12, 14 }, send6_frag[] = { 2, 1, 0, 2, 1, 0, 2 };
    /* H 8, F 3: offsets f * 8 / 3 = 0, 2, 5 (not f * (8 / 3) = 0, 2, 4) */
    static const int send8_step[] = { 3, 6, 8, 11, 14, 16 }, send8_frag[] = { 2, 1, 0, 2, 1, 0 };
    test_reference();
    test_one_group_is_plain(1);
    test_one_group_is_plain(2);
    test_sgd_h1_is_ddp(2);
    test_sgd_h1_is_ddp(3);
    test_replicas_meet();
    test_bf16_params();
    test_streaming_schedule(6, 3, 1, send6_step, send6_frag, 7, 14);
    test_streaming_schedule(8, 3, 0, send8_step, send8_frag, 6, 16);
    test_written_params();
    test_refusals();
    return test_summary("test_outer");
}
