/* test_hybrid.c — hybrid sharding (ddp_desc.shard_group): AdamW's state in parts within each
   group of S consecutive ranks, replicated across the groups, every step synchronizing the
   world. Thread-ranks on the CPU backend: 4 ranks in 2 groups of 2, and 6 ranks in 3 groups of
   2 and in 2 groups of 3 (a division by 6; parts split three ways). Each configuration trains
   STEPS steps unsharded and hybrid, and every rank compares, bit for bit, its parameters after
   EVERY step (the CPU backend adds every rank's gradient in rank order either way, so hybrid
   gives unsharded's bits) and, at the end, m and v (through ddp_gather_to_host: each part from
   its holder in the root's group) with the unsharded run's, and the averaged gradients of steps 1
   and 2 (clipping and Adam's scale invariance would hide a wrongly scaled average in the
   parameters). Every step: 2 micro-steps of
   accumulation (sync off, then on), clipping by the global norm (which clips), an unused
   parameter (find_unused), and at step 4 a NaN in one rank's gradients (skip_nonfinite: every
   rank skips). fp32 and bf16 parameters (the fp32 master in parts; its bf16 working copies
   compared every step), in place and staged (DDP_STAGED_GRADS=1: no gradient segment).
   Checkpoints: the hybrid run saved after step 3 and loaded by an unsharded and by a hybrid run
   of the same world, which finish with the unsharded run's bits, and by 2 unsharded ranks (another
   world size), which hold the saved state; an unsharded file resumed hybrid ends with the
   unsharded bits too. ZeRO-3 within the groups (the z3_ configurations, DDP_SHARD_PARAMETERS, two
   units in every run of them): the parameters hashed every step are the gathered units' views,
   read from the group's parts, and must give the same bits. Then the bad inputs, each refused by name.
   With "env" (tests/test_hybrid.sh: mpirun across 2 namespace hosts x 2 ranks, the MPI build
   build/mpi/test_hybrid, a shard group a host): fp32 parameters give the unsharded hierarchical
   MPI run's bits every step (the hosts' sums added in host order either way); bf16 parameters
   (the unsharded MPI path adds every rank in rank order, hybrid the hosts' sums) are the same
   bits on every rank every step, their averaged gradients within a derived bound of the exact
   average (check_average), and they resume bit for bit. */
#include "testlib.h"

#define MAXW 6
#define NPARAM 3
#define STEPS 5
static const size_t sizes[NPARAM] = { 70001, 3003, 100 };   /* p2 never gets a gradient (find_unused) */
#define TOTAL (70001 + 3003 + 100)
/* the flat layout: each parameter starts on 16 floats (the manual's MEMORY LAYOUT) */
static const size_t offs[NPARAM] = { 0, 70016, 70016 + 3008 };
#define FLAT (70016 + 3008 + 112)

typedef struct config { const char *name; int world, group, bf16, staged, z3; } config;
static const config configs[] = {
    { "w4_g2_fp32", 4, 2, 0, 0, 0 }, { "w4_g2_bf16", 4, 2, 1, 0, 0 }, { "w4_g2_fp32_staged", 4, 2, 0, 1, 0 },
    { "w6_g2_fp32", 6, 2, 0, 0, 0 }, { "w6_g3_bf16", 6, 3, 1, 0, 0 },
    /* ZeRO-3 within the groups: two units (p0; p1 + p2) in every run of the config, so every level
       has the same buckets; the parameters hashed every step are the gathered units' views */
    { "z3_w4_g2_fp32", 4, 2, 0, 0, 1 }, { "z3_w4_g2_bf16", 4, 2, 1, 0, 1 }, { "z3_w6_g2_fp32", 6, 2, 0, 0, 1 },
    { "z3_w6_g3_bf16", 6, 3, 1, 0, 1 },
};

static float grad_value(int r, int t, int micro, size_t i) {
    if (t == 4 && r == 1 && micro == 1 && i == 70001 + 17) return NAN;   /* skip_nonfinite: step 4 everywhere */
    return test_value((uint64_t)(700 + 10 * r + t + 1000 * micro), i);
}

enum { RUN_PLAIN, RUN_HYBRID, RUN_SAVE, RUN_LOAD_PLAIN, RUN_LOAD_HYBRID, RUN_LOAD_OTHER_WORLD,
       RUN_SAVE_PLAIN, RUN_LOAD_HYBRID_FROM_PLAIN, RUNS };   /* the last two: an unsharded file resumed hybrid */
static uint64_t step_hash[RUNS][MAXW][STEPS + 1];   /* the working parameters after each step */
static uint64_t end_hash[RUNS][MAXW][3];            /* params (the fp32 master), m, v, gathered */
static uint64_t grad_hash[RUNS][3];                 /* the averaged gradients of steps 1 and 2, gathered to rank 0 (clipping
                                                       and Adam would hide a wrong scale in the parameters) */
static char ckpt_path[256], plain_ckpt_path[256];
static int env_mode;
static float *final_params[RUNS];   /* env: this rank's gathered parameters at the end of each run */
static const config *current;
static int current_run;

/* The state every rank gathers to itself (each part from its holder). */
static ddp_result gather_state(ddp_context *ctx, float *buf, uint64_t out[3]) {
    int which, root, rank = ddp_rank(ctx);
    ddp_result r;
    for (which = 0; which < 3; which++)
        for (root = 0; root < ddp_world_size(ctx); root++) {
            ddp_buffer b = which == 0 ? DDP_PARAMS : which == 1 ? DDP_ADAM_M : DDP_ADAM_V;
            if ((r = ddp_gather_to_host(ctx, b, 0, buf, FLAT, root)) != DDP_OK) return r;
            if (root == rank) out[which] = test_hash(buf, FLAT * sizeof(float));
            if (root == rank && which == 0 && final_params[current_run]) memcpy(final_params[current_run], buf, FLAT * sizeof(float));
        }
    return DDP_OK;
}

/* env, bf16: the averaged gradients of step t (every part from its holder, to rank 0) against
   the exact average, in double, of the bf16 gradients the ranks wrote (each rank's two
   micro-steps added as the training loop adds them). Hybrid on the MPI backend sums 4 exact
   values in float (3 roundings, each at most 2^-24 of the sum of magnitudes S), divides by 4
   (exact) and rounds once to bf16 (at most 2^-8 relative): |avg - exact| <= 2^-8 (|exact| + e) + e,
   e = 3 * 2^-24 * S / 4. A part averaged over one host only, or summed twice, is off by the order
   of the gradients themselves. */
static ddp_result check_average(ddp_context *ctx, const config *c, int t, float *buf) {
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx), s, bad = -1;
    size_t i;
    char name[160];
    double worst = 0, worst_bound = 0;
    ddp_result r = ddp_gather_to_host(ctx, DDP_GRADS, 0, buf, FLAT, 0);
    if (r != DDP_OK || rank != 0) return r;
    for (i = 0; i < TOTAL; i++) {   /* i: the element's index in the test's own numbering (grad_value) */
        double exact = 0, mag = 0, e, bound, d;
        int p = i < sizes[0] ? 0 : i < sizes[0] + sizes[1] ? 1 : 2;
        size_t at = offs[p] + (i - (p == 0 ? 0 : p == 1 ? sizes[0] : sizes[0] + sizes[1]));
        for (s = 0; s < world && p < 2; s++) {   /* p2 gets no gradient: zeros */
            ddp_bf16 b = ddp__to_bf16(grad_value(s, t, 0, i));
            double x = ddp__from_bf16(ddp__to_bf16(ddp__from_bf16(b) + grad_value(s, t, 1, i)));
            exact += x;
            mag += fabs(x);
        }
        exact /= world;
        e = 3.0 * ldexp(1.0, -24) * mag / world;
        bound = ldexp(1.0, -8) * (fabs(exact) + e) + e;
        d = fabs((double)buf[at] - exact);
        if (!(d <= bound)) { bad = (int)at; worst = d; worst_bound = bound; break; }
    }
    snprintf(name, sizeof name, "hybrid_%s_step%d_averaged_gradients_within_bound_of_exact", c->name, t);
    verdict(bad < 0, name, "element %d: %.9g, exact %.9g, off by %g, bound %g", bad, bad >= 0 ? buf[bad] : 0.0,
            bad >= 0 ? buf[bad] - worst : 0.0, worst, worst_bound);
    return DDP_OK;
}

static ddp_result train(ddp_desc d, const config *c, int run) {
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    int ids[NPARAM], units[2], p, t, micro, rank = d.rank;
    int hybrid = run == RUN_HYBRID || run == RUN_SAVE || run == RUN_LOAD_HYBRID || run == RUN_LOAD_HYBRID_FROM_PLAIN;
    int loads = run == RUN_LOAD_PLAIN || run == RUN_LOAD_HYBRID || run == RUN_LOAD_OTHER_WORLD || run == RUN_LOAD_HYBRID_FROM_PLAIN;
    int first = loads ? 4 : 1, last = run == RUN_SAVE || run == RUN_SAVE_PLAIN ? 3 : run == RUN_LOAD_OTHER_WORLD ? 0 : STEPS;
    size_t j;
    ddp_result r;
    float *buf = NULL;
    char name[160];
    d.shard = !hybrid ? DDP_SHARD_NONE : c->z3 ? DDP_SHARD_PARAMETERS : DDP_SHARD_OPTIMIZER;
    d.shard_group = hybrid ? c->group : 0;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.skip_nonfinite = 1;
    d.find_unused = 1;
    d.bucket_cap_mb = 0.1;   /* several buckets: p0 alone, p1 + p2 */
    d.first_bucket_mb = 0.05;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f;
    opt.weight_decay = 0.1f;
    opt.max_grad_norm = 20.0f;   /* the summed micro-steps' norm is ~ 100: clips */
    if ((r = ddp_init(&ctx, &d)) != DDP_OK) goto out;
    rank = ddp_rank(ctx);
    if (!(buf = (float *)malloc(FLAT * sizeof(float)))) { r = DDP_ERR_OUT_OF_MEMORY; goto out; }
    for (p = 0; p < NPARAM; p++) {
        char pn[16];
        float *init = buf + (p == 0 ? 0 : p == 1 ? sizes[0] : sizes[0] + sizes[1]);
        for (j = 0; j < sizes[p]; j++) init[j] = 0.5f * test_value((uint64_t)(7 + p), j);
        snprintf(pn, sizeof pn, "p%d", p);
        if ((r = ddp_register_param(ctx, pn, sizes[p], 0, init, &ids[p])) != DDP_OK) goto out;
    }
    if (c->z3 && ((r = ddp_register_unit(ctx, "u0", ids[0], 1, &units[0])) != DDP_OK ||
                  (r = ddp_register_unit(ctx, "u1", ids[1], 2, &units[1])) != DDP_OK)) goto out;
    if ((r = ddp_commit(ctx)) != DDP_OK) goto out;
    if (loads && (r = ddp_load(ctx, run == RUN_LOAD_HYBRID_FROM_PLAIN ? plain_ckpt_path : ckpt_path, NULL, 0, NULL, NULL,
                               NULL)) != DDP_OK) goto out;
    for (t = first; t <= last; t++) {
        if ((r = ddp_zero_grad(ctx)) != DDP_OK) goto out;
        for (micro = 0; micro < 2; micro++) {
            ddp_set_sync(ctx, micro == 1);
            for (p = 1; p >= 0; p--) {   /* p2: no gradient */
                size_t base = p ? sizes[0] : 0;
                for (j = 0; j < sizes[p]; j++) {
                    float g = grad_value(rank, t, micro, base + j);
                    if (c->bf16) ddp_grad_bf16(ctx, ids[p])[j] = ddp__to_bf16(ddp__from_bf16(ddp_grad_bf16(ctx, ids[p])[j]) + g);
                    else ddp_grad(ctx, ids[p])[j] += g;
                }
                if ((r = ddp_grad_ready(ctx, ids[p])) != DDP_OK) goto out;
            }
            if ((r = ddp_finish(ctx)) != DDP_OK) goto out;
        }
        if (env_mode && c->bf16 && run == RUN_HYBRID && t <= 2 && (r = check_average(ctx, c, t, buf)) != DDP_OK) goto out;
        if ((run == RUN_PLAIN || run == RUN_HYBRID) && t <= 2) {
            if ((r = ddp_gather_to_host(ctx, DDP_GRADS, 0, buf, FLAT, 0)) != DDP_OK) goto out;
            if (rank == 0) grad_hash[run][t] = test_hash(buf, FLAT * sizeof(float));
        }
        if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) goto out;
        /* ZeRO-3: the parameters are there only while their units are gathered (from the group's
           members' parts); below PARAMETERS gather and release do nothing */
        if (c->z3 && ((r = ddp_unit_gather(ctx, units[0])) != DDP_OK || (r = ddp_unit_gather(ctx, units[1])) != DDP_OK)) goto out;
        step_hash[run][rank][t] = c->bf16 ? test_hash(ddp_flat_params_bf16(ctx, NULL), FLAT * sizeof(ddp_bf16))
                                  : test_hash(ddp_flat_params(ctx, NULL), FLAT * sizeof(float));
        if (c->z3 && ((r = ddp_unit_release(ctx, units[0])) != DDP_OK || (r = ddp_unit_release(ctx, units[1])) != DDP_OK)) goto out;
    }
    if ((r = gather_state(ctx, buf, end_hash[run][rank])) != DDP_OK) goto out;
    if (run == RUN_SAVE || run == RUN_SAVE_PLAIN) r = ddp_save(ctx, run == RUN_SAVE ? ckpt_path : plain_ckpt_path, NULL, 0);
    if (env_mode) {   /* every rank's step hashes against rank 0's: the same bits everywhere */
        uint64_t zero[STEPS + 1];
        memcpy(zero, step_hash[run][rank], sizeof zero);
        if ((r = ddp_broadcast(ctx, zero, sizeof zero, 0)) != DDP_OK) goto out;
        snprintf(name, sizeof name, "hybrid_%s_run%d_rank%d_every_step_same_bits_as_rank0", c->name, run, rank);
        verdict(!memcmp(zero + first, step_hash[run][rank] + first, sizeof(uint64_t) * (size_t)(last - first + 1)) || last < first,
                name, "parameters differ from rank 0's");
    }
    if (run == RUN_HYBRID) {
        int64_t *step = NULL;
        /* m in parts of the shard group: all of it is not this rank's */
        ddp_result whole = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, buf, FLAT);
        ddp_adamw_state(ctx, NULL, NULL, &step);
        snprintf(name, sizeof name, "hybrid_%s_rank%d_m_in_parts_step_skipped", c->name, rank);
        verdict(whole == DDP_ERR_INVALID_ARGUMENT && step && *step == STEPS - 1, name, "copy of all of m: %s, step %lld",
                ddp_result_string(whole), step ? (long long)*step : -1LL);
        if (c->z3) {   /* the level held (not resolved down) and the units released after each step's hash */
            snprintf(name, sizeof name, "hybrid_%s_rank%d_sharded_parameters_units_released", c->name, rank);
            verdict(ddp_config(ctx)->shard == DDP_SHARD_PARAMETERS && ddp_unit_gathered(ctx, units[0]) == 0 &&
                    ddp_unit_gathered(ctx, units[1]) == 0, name, "shard %d, gathered %d %d", (int)ddp_config(ctx)->shard,
                    ddp_unit_gathered(ctx, units[0]), ddp_unit_gathered(ctx, units[1]));
        }
    }
out:
    if (r != DDP_OK)
        printf("FAIL hybrid_%s_run%d_rank%d: %s: %s\n", c->name, run, rank, ddp_result_string(r), ddp_last_error(ctx));
    free(buf);
    {
        ddp_result s = ddp_shutdown(ctx);
        if (r == DDP_OK) r = s;
    }
    return r;
}

static void rank_main(test_rank *self) {
    ddp_desc d = test_desc(self);
    d.timeout_s = 60;
    d.backend = DDP_BACKEND_CPU;
    d.log_level = DDP_LOG_ERROR;
    if (train(d, current, current_run) != DDP_OK) test_failures++;
}

static void run_all(const config *c, int run, int world) {
    test_rank ranks[MAXW];
    void *shared[1] = { (void *)rank_main };
    current = c;
    current_run = run;
    test_run_ranks(world, shared, ranks);
}

/* The MPI backend's bf16 hybrid sums in another order than its unsharded path: how far apart
   two AdamW runs can be whose gradients differ. Each AdamW update moves a parameter by at most
   lr * (1 - beta1) / sqrt(1 - beta2) (Kingma and Ba, section 2.1, as 1 - beta1 > sqrt(1 - beta2)
   here) plus the decay lr * wd * |p| (|p| < 1 here), so after n steps each run is within
   n * that of the common start, and the two within twice it, plus one bf16 rounding of the
   working copy (2^-8 relative, |p| < 1). That bound holds whatever the gradients (Adam's step is
   bounded), so it only says the run is sane: what catches a wrong reduction is check_average. */
static double bf16_bound(int steps) {
    double lr = 0.01, step_max = lr * (1 - 0.9) / sqrt(1 - 0.999) + lr * 0.1 * 1.0;
    return 2.0 * steps * step_max + 1.0 / 256;
}

static void compare_env_bf16(const config *c, int rank) {
    char name[160];
    double worst = 0, bound = bf16_bound(STEPS - 1);   /* one step is skipped everywhere */
    size_t i;
    int t, k;
    for (i = 0; i < FLAT; i++) {
        double d = fabs((double)final_params[RUN_HYBRID][i] - (double)final_params[RUN_PLAIN][i]);
        if (!(d <= worst)) worst = d;
    }
    snprintf(name, sizeof name, "hybrid_%s_mpi_rank%d_within_bound_of_unsharded", c->name, rank);
    verdict(worst <= bound, name, "largest difference %g, bound %g", worst, bound);
    for (t = 4; t <= STEPS; t++)
        if (step_hash[RUN_LOAD_HYBRID][rank][t] != step_hash[RUN_HYBRID][rank][t]) break;
    for (k = 0; k < 3; k++) if (end_hash[RUN_LOAD_HYBRID][rank][k] != end_hash[RUN_HYBRID][rank][k]) break;
    snprintf(name, sizeof name, "hybrid_%s_mpi_rank%d_resumed_equal_uninterrupted_bits", c->name, rank);
    verdict(t > STEPS && k == 3, name, "step %d or state %d differs", t, k);
}

static void compare(const config *c, int only) {
    char name[160];
    static const char *what[3] = { "params", "m", "v" };
    int rank, t, k, run;
    for (rank = 0; rank < c->world; rank++) {
        if (only >= 0 && rank != only) continue;
        int steps_ok = 1, bad_t = 0;
        for (t = 1; t <= STEPS; t++)
            if (step_hash[RUN_HYBRID][rank][t] != step_hash[RUN_PLAIN][rank][t] ||
                (only < 0 && step_hash[RUN_PLAIN][rank][t] != step_hash[RUN_PLAIN][0][t])) { steps_ok = 0; bad_t = t; break; }
        snprintf(name, sizeof name, "hybrid_%s_rank%d_every_step_equal_unsharded_bits", c->name, rank);
        verdict(steps_ok, name, "step %d differs", bad_t);
        if (rank == 0) {
            snprintf(name, sizeof name, "hybrid_%s_averaged_gradients_steps_1_2_equal_unsharded_bits", c->name);
            verdict(grad_hash[RUN_HYBRID][1] == grad_hash[RUN_PLAIN][1] && grad_hash[RUN_HYBRID][2] == grad_hash[RUN_PLAIN][2] &&
                    grad_hash[RUN_PLAIN][1] != 0, name, "hashes %016llx %016llx, unsharded %016llx %016llx",
                    (unsigned long long)grad_hash[RUN_HYBRID][1], (unsigned long long)grad_hash[RUN_HYBRID][2],
                    (unsigned long long)grad_hash[RUN_PLAIN][1], (unsigned long long)grad_hash[RUN_PLAIN][2]);
        }
        for (run = RUN_HYBRID; run <= RUN_LOAD_HYBRID; run++) {
            if (run == RUN_SAVE) continue;
            for (k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "hybrid_%s_rank%d_%s_%s_equal_unsharded_bits", c->name, rank,
                         run == RUN_HYBRID ? "hybrid" : run == RUN_LOAD_PLAIN ? "unsharded_resumed_from_hybrid"
                                                                             : "hybrid_resumed", what[k]);
                verdict(end_hash[run][rank][k] == end_hash[RUN_PLAIN][rank][k], name, "hash %016llx, %016llx unsharded",
                        (unsigned long long)end_hash[run][rank][k], (unsigned long long)end_hash[RUN_PLAIN][rank][k]);
            }
        }
        for (t = 4; t <= STEPS; t++)
            if (step_hash[RUN_LOAD_HYBRID][rank][t] != step_hash[RUN_PLAIN][rank][t]) break;
        snprintf(name, sizeof name, "hybrid_%s_rank%d_resumed_every_step_equal", c->name, rank);
        verdict(t > STEPS, name, "step %d differs", t);
        if (only >= 0) continue;   /* env: the MPI runs take no unsharded file */
        for (t = 4; t <= STEPS; t++)
            if (step_hash[RUN_LOAD_HYBRID_FROM_PLAIN][rank][t] != step_hash[RUN_PLAIN][rank][t]) break;
        for (k = 0; k < 3; k++) if (end_hash[RUN_LOAD_HYBRID_FROM_PLAIN][rank][k] != end_hash[RUN_PLAIN][rank][k]) break;
        snprintf(name, sizeof name, "hybrid_%s_rank%d_unsharded_file_resumed_hybrid_equal_unsharded_bits", c->name, rank);
        verdict(t > STEPS && k == 3, name, "step %d or state %d differs", t, k);
    }
    for (rank = 0; rank < 2 && only < 0; rank++)
        for (k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "hybrid_%s_loaded_by_2_ranks_rank%d_%s_equal_saved", c->name, rank, what[k]);
            verdict(end_hash[RUN_LOAD_OTHER_WORLD][rank][k] == end_hash[RUN_SAVE][0][k], name, "hash %016llx, %016llx saved",
                    (unsigned long long)end_hash[RUN_LOAD_OTHER_WORLD][rank][k], (unsigned long long)end_hash[RUN_SAVE][0][k]);
        }
}

/* ---- bad input, each refused by name; the two edges (1 and the world) accepted ---- */
typedef struct bad_case { const char *name, *needle; int world, group, shard, outer_size, uneven; ddp_result want; } bad_case;
static const bad_case bad[] = {
    { "not_a_divisor", "does not divide", 4, 3, DDP_SHARD_OPTIMIZER, 0, 0, DDP_ERR_INVALID_ARGUMENT },
    { "above_the_world", "does not divide", 2, 4, DDP_SHARD_OPTIMIZER, 0, 0, DDP_ERR_INVALID_ARGUMENT },
    { "unsharded", "shard is DDP_SHARD_NONE", 4, 2, DDP_SHARD_NONE, 0, 0, DDP_ERR_INVALID_ARGUMENT },
    { "outer_other_size", "outer.group_size", 4, 4, DDP_SHARD_OPTIMIZER, 2, 0, DDP_ERR_INVALID_ARGUMENT },
    { "uneven_inputs", NULL, 4, 2, DDP_SHARD_OPTIMIZER, 0, 1, DDP_OK },   /* runs: tests/test_shard_join.c */
    { "outer_same_size", NULL, 4, 2, DDP_SHARD_OPTIMIZER, 2, 0, DDP_OK },
    { "one_rank_groups_is_ddp", NULL, 4, 1, DDP_SHARD_OPTIMIZER, 0, 0, DDP_OK },
    { "the_world_is_plain_sharding", NULL, 4, 4, DDP_SHARD_OPTIMIZER, 0, 0, DDP_OK },
    /* ranks 2 and 3 without shard_group: told at ddp_commit (the layout check), by name */
    { "ranks_disagree", "shard_group", 4, 2, DDP_SHARD_OPTIMIZER, 0, 0, DDP_ERR_MISMATCH },
};
static const bad_case *bad_now;

static void bad_rank(test_rank *self) {
    const bad_case *b = bad_now;
    ddp_context *ctx = NULL;
    ddp_desc d = test_desc(self);
    ddp_result r;
    char name[160];
    d.backend = DDP_BACKEND_CPU;
    d.shard = (ddp_shard)b->shard;
    d.shard_group = b->group;
    if (b->outer_size) { d.outer.mode = DDP_OUTER_DILOCO; d.outer.group_size = b->outer_size; d.outer.inner_steps = 2; }
    if (b->uneven) d.uneven_inputs = DDP_JOIN_DIVIDE_BY_WORLD;
    if (b->want == DDP_ERR_MISMATCH && self->rank >= 2) d.shard_group = 0;
    r = ddp_init(&ctx, &d);
    snprintf(name, sizeof name, "hybrid_bad_input_%s_rank%d", b->name, self->rank);
    if (b->want == DDP_ERR_MISMATCH) {
        float x[64] = { 0 };
        int id;
        if (r == DDP_OK && (r = ddp_register_param(ctx, "x", 64, 0, x, &id)) == DDP_OK) r = ddp_commit(ctx);
        verdict(r == b->want && strstr(ddp_last_error(ctx), b->needle), name, "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
    } else if (b->want != DDP_OK) {
        verdict(r == b->want && strstr(ddp_last_error(ctx), b->needle) && strstr(ddp_last_error(ctx), "shard"), name, "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
    } else if (r != DDP_OK) {
        verdict(0, name, "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
    } else {
        /* accepted: m whole (a shard of one rank: DDP) or in parts (of the world, or of the replica group) */
        float x[4096];
        int id, whole;
        size_t k;
        for (k = 0; k < 4096; k++) x[k] = (float)k;
        if ((r = ddp_register_param(ctx, "x", 4096, 0, x, &id)) == DDP_OK && (r = ddp_commit(ctx)) == DDP_OK) {
            whole = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, x, 4096) == DDP_OK;
            verdict(whole == (b->group == 1) && ddp_config(ctx)->shard == (b->group == 1 ? DDP_SHARD_NONE : DDP_SHARD_OPTIMIZER),
                    name, "m whole %d, shard %d", whole, (int)ddp_config(ctx)->shard);
        } else verdict(0, name, "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
    }
    ddp_shutdown(ctx);
}

/* env: the ranks a launcher started (mpirun across hosts: tests/test_hybrid.sh), 4 in 2 groups. */
static int main_env(void) {
    static const config env_configs[] = { { "mpi_w4_g2_fp32", 4, 2, 0, 0, 0 }, { "mpi_w4_g2_bf16", 4, 2, 1, 0, 0 } };
    size_t i;
    int run, rank = atoi(getenv("RANK") ? getenv("RANK") : getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : "0");
    env_mode = 1;
    for (run = 0; run < RUNS; run++) final_params[run] = (float *)malloc(FLAT * sizeof(float));
    for (i = 0; i < sizeof env_configs / sizeof env_configs[0]; i++) {
        const config *c = &env_configs[i];
        ddp_desc d;
        int ok = 1;
        memset(&d, 0, sizeof d);
        d.timeout_s = 60;
        d.log_level = DDP_LOG_ERROR;
#ifdef DDP_MPI
        d.backend = DDP_BACKEND_MPI;
#else
        d.backend = DDP_BACKEND_CPU;
#endif
        memset(step_hash, 0, sizeof step_hash);
        memset(end_hash, 0, sizeof end_hash);
        memset(grad_hash, 0, sizeof grad_hash);
        current = c;
        for (run = RUN_PLAIN; run <= RUN_LOAD_HYBRID && ok; run++) {
            current_run = run;
            ok = train(d, c, run) == DDP_OK;
        }
        if (!ok) { test_failures++; continue; }
        if (c->bf16) compare_env_bf16(c, rank);
        else compare(c, rank);
    }
    if (rank == 0) remove(ckpt_path);
    for (run = 0; run < RUNS; run++) free(final_params[run]);
    return test_summary("test_hybrid");
}

/* env-refused: ranks placed so that a shard group is not one host's ranks (mpirun --map-by node):
   the MPI backend refuses hybrid sharding by name at commit, on every rank, no hang. */
static int main_env_refused(void) {
    ddp_context *ctx = NULL;
    ddp_desc d;
    float x[4096];
    int id;
    ddp_result r;
    memset(&d, 0, sizeof d);
    memset(x, 0, sizeof x);
    d.timeout_s = 60;
    d.log_level = DDP_LOG_OFF;
    d.shard = DDP_SHARD_OPTIMIZER;
    d.shard_group = 2;
    if ((r = ddp_init(&ctx, &d)) == DDP_OK && (r = ddp_register_param(ctx, "x", 4096, 0, x, &id)) == DDP_OK)
        r = ddp_commit(ctx);
    verdict(r != DDP_OK && (strstr(ddp_last_error(ctx), "needs every shard group to be one host's ranks") ||
                            strstr(ddp_last_error(ctx), "shard_group")), "hybrid_mpi_group_across_hosts_refused_by_name",
            "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
    ddp_shutdown(ctx);
#ifdef DDP_MPI
    {   /* ddp.h leaves MPI unfinalized after a failure (a lost peer would hang it); every peer here
           is alive and refused alike, so the test finalizes, and mpirun sees a clean exit */
        int up = 0, down = 0;
        MPI_Initialized(&up);
        MPI_Finalized(&down);
        if (up && !down) MPI_Finalize();
    }
#endif
    return test_summary("test_hybrid");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "env-refused")) return main_env_refused();
    size_t i;
    const char *dir = getenv("TMPDIR");
    if (argc > 1 && !strcmp(argv[1], "env")) {   /* every rank names the same file: the job's port */
        snprintf(ckpt_path, sizeof ckpt_path, "%s/ddp_hybrid_port%s.ckpt", dir && *dir ? dir : "/tmp",
                 getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "");
        return main_env();
    }
    snprintf(ckpt_path, sizeof ckpt_path, "%s/ddp_hybrid_pid%ld.ckpt", dir && *dir ? dir : "/tmp", (long)getpid());
    snprintf(plain_ckpt_path, sizeof plain_ckpt_path, "%s/ddp_hybrid_plain_pid%ld.ckpt", dir && *dir ? dir : "/tmp", (long)getpid());
    for (i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const config *c = &configs[i];
        memset(step_hash, 0, sizeof step_hash);
        memset(end_hash, 0, sizeof end_hash);
        memset(grad_hash, 0, sizeof grad_hash);
        if (c->staged) setenv("DDP_STAGED_GRADS", "1", 1);
        run_all(c, RUN_PLAIN, c->world);
        run_all(c, RUN_HYBRID, c->world);
        run_all(c, RUN_SAVE, c->world);
        run_all(c, RUN_LOAD_PLAIN, c->world);
        run_all(c, RUN_LOAD_HYBRID, c->world);
        run_all(c, RUN_LOAD_OTHER_WORLD, 2);
        run_all(c, RUN_SAVE_PLAIN, c->world);
        run_all(c, RUN_LOAD_HYBRID_FROM_PLAIN, c->world);
        if (c->staged) unsetenv("DDP_STAGED_GRADS");
        compare(c, -1);
    }
    remove(ckpt_path);
    remove(plain_ckpt_path);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_rank ranks[MAXW];
        void *shared[1] = { (void *)bad_rank };
        bad_now = &bad[i];
        test_run_ranks(bad[i].world, shared, ranks);
    }
    return test_summary("test_hybrid");
}
