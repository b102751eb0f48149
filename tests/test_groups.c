/* test_groups.c — replica groups of several ranks (desc.outer): every synchronizing step averages
   the gradients within each group only. 4 ranks in 2 groups of 2 — thread-ranks on the CPU
   backend (no argument; and 6 thread-ranks in 2 groups of 3), or with "env" the ranks a launcher
   started (ddprun -n 4, or mpirun -n 4 with the MPI build: build/mpi/test_groups). Every rank's
   data differs, and any rank can make any rank's (test_value), so each checks locally:
   - after a step it holds its group's average, bit for bit the arithmetic ddp.h promises (the
     members' values added in float in rank order, divided by the group size; bf16 gradients and
     a bf16 wire: the bf16 values added in float, rounded once), within a float64 bound, and not
     the other group's nor the world's average;
   - DiLoCo with H = 2: after step 1 the two groups' parameters differ and each group's ranks hold
     the same bits; after step 2 (the outer sync) every rank holds the same; step 3 averages
     within the groups again (buckets after the world-wide outer exchange).
   Configurations: fp32 and bf16 parameters, an fp32 model on a bf16 wire, in place and through
   the staging slots (DDP_STAGED_GRADS=1; the CPU backend's only), one group of all 4 ranks
   (group_size = world: the world's average, as without groups), and streaming DiLoCo whose
   exchange is in flight on its own thread during step 3 (the replicas meet after it). A bucket
   of more than 1 MiB takes several in-place chunks and staging slots. */
#include "testlib.h"

#define MAXW 6
#define NPARAM 3
static const size_t sizes[NPARAM] = { 300001, 5003, 1000 };   /* reverse order: a small bucket first, then >1 MiB */

/* delay: streaming DiLoCo, one fragment, its exchange on its own thread for 1 step (the merge
   after step 3; step 3's buckets wait for it);
   world: ranks (4; 6 = 2 groups of 3, thread-ranks only: a divisor that is no power of two, the
   in-place average's path for 3+ members) */
typedef struct config { const char *name; int bf16, bf16_wire, staged, group_size, delay, world; } config;
static const config configs[] = {
    { "fp32", 0, 0, 0, 2, 0, 4 },        { "bf16", 1, 0, 0, 2, 0, 4 },        { "fp32_bf16wire", 0, 1, 0, 2, 0, 4 },
    { "fp32_staged", 0, 0, 1, 2, 0, 4 }, { "bf16_staged", 1, 0, 1, 2, 0, 4 }, { "fp32_one_group", 0, 0, 0, 4, 0, 4 },
    { "bf16_one_group", 1, 0, 0, 4, 0, 4 }, { "bf16_streaming_delay1", 1, 0, 0, 2, 1, 4 },
    { "fp32_groups_of_3", 0, 0, 0, 3, 0, 6 }, { "bf16_groups_of_3", 1, 0, 0, 3, 0, 6 }, { "fp32_staged_groups_of_3", 0, 0, 1, 3, 0, 6 },
};

/* Rank r's gradient of parameter p at step t, as the program writes it (bf16 parameters: rounded). */
static float grad_value(const config *c, int r, int t, int p, size_t j) {
    float v = test_value((uint64_t)(1000 + 100 * r + 10 * t + p), j);
    return c->bf16 ? ddp__from_bf16(ddp__to_bf16(v)) : v;
}

#define TOTAL (300001 + 5003 + 1000)

/* The average of ranks [first, first + n) of element i (v[s]: rank s's values of the step, all
   parameters one after another): as it goes on the wire, added in rank order in float, divided,
   rounded as it comes back. */
static float expected(const config *c, float *const *v, int first, int n, size_t i) {
    float sum = 0, x;
    int s;
    for (s = 0; s < n; s++) {
        x = v[first + s][i];
        if (c->bf16_wire) x = ddp__from_bf16(ddp__to_bf16(x));
        sum = s == 0 ? x : sum + x;
    }
    sum = sum / (float)n;
    return c->bf16 || c->bf16_wire ? ddp__from_bf16(ddp__to_bf16(sum)) : sum;
}

/* Whether the average's bits are the rank-order float sum's. Not on the MPI backend's host
   groups across hosts without replica groups: there an fp32 bucket adds the hosts' sums in host
   order (>>mpi; without groups, as always): the float64 bound only. */
static int rank_order_bits(ddp_context *ctx, const config *c) {
#ifdef DDP_MPI
    const char *flat = getenv("DDP_MPI_FLAT");
    if (c->group_size == c->world && !c->bf16 && !c->bf16_wire && !(flat && !strcmp(flat, "1")) &&
        ddp_config(ctx)->local_world_size < c->world)
        return 0;
#endif
    (void)ctx; (void)c;
    return 1;
}

/* One synchronizing step's gradients, then the checks of the average. */
static void step_and_check(ddp_context *ctx, const config *c, const int *ids, int t, const char *tag) {
    int rank = ddp_rank(ctx), S = c->group_size, first = rank / S * S, other = (first + S) % c->world, p, s, W = c->world;
    int exact = rank_order_bits(ctx, c);
    size_t j, i, bad = 0, same_other = 0, same_world = 0, far = 0;
    float *v[MAXW];
    char name[160];
    ddp_result r = DDP_ERR_OUT_OF_MEMORY;
    double worst = 0;
    for (s = 0; s < MAXW; s++) v[s] = NULL;
    for (s = 0; s < W; s++) {
        if (!(v[s] = (float *)malloc(TOTAL * sizeof(float)))) goto fail;
        for (i = 0, p = 0; p < NPARAM; p++) for (j = 0; j < sizes[p]; j++) v[s][i++] = grad_value(c, s, t, p, j);
    }
    if ((r = ddp_zero_grad(ctx)) != DDP_OK) goto fail;
    for (p = NPARAM - 1; p >= 0; p--) {
        size_t at = p == 0 ? 0 : p == 1 ? sizes[0] : sizes[0] + sizes[1];
        for (j = 0; j < sizes[p]; j++) {
            if (c->bf16) ddp_grad_bf16(ctx, ids[p])[j] = ddp__to_bf16(v[rank][at + j]);
            else ddp_grad(ctx, ids[p])[j] = v[rank][at + j];
        }
        if ((r = ddp_grad_ready(ctx, ids[p])) != DDP_OK) goto fail;
    }
    if ((r = ddp_finish(ctx)) != DDP_OK) goto fail;
    {   /* stragglers: who this rank waited for is a member of its group */
        ddp_step_stats st = ddp_last_step_stats(ctx);
        snprintf(name, sizeof name, "groups_%s_%s_rank%d_slowest_rank_in_group", c->name, tag, rank);
        verdict(st.slowest_rank >= first && st.slowest_rank < first + S, name, "slowest_rank %d, the group is ranks %d..%d",
                st.slowest_rank, first, first + S - 1);
    }
    for (i = 0, p = 0; p < NPARAM; p++)
        for (j = 0; j < sizes[p]; j++, i++) {
            float got = c->bf16 ? ddp__from_bf16(ddp_grad_bf16(ctx, ids[p])[j]) : ddp_grad(ctx, ids[p])[j];
            float want = expected(c, v, first, S, i);
            double avg = 0, mag = 0, err;
            for (s = first; s < first + S; s++) { avg += (double)v[s][i] / S; mag += fabs((double)v[s][i]) / S; }
            /* fp32: one rounding per addition and one of the quotient; bf16: the result's 2^-8 relative
               (and with a bf16 wire each value's) */
            err = fabs((double)got - avg);
            if (err > worst) worst = err;
            if (err > mag * (c->bf16 || c->bf16_wire ? 3.0 / 256 : (S + 1) * 1.2e-7)) far++;
            if (exact && memcmp(&got, &want, sizeof got)) bad++;
            if (S < W && got == expected(c, v, other, S, i)) same_other++;
            if (S < W && got == expected(c, v, 0, W, i)) same_world++;
        }
    snprintf(name, sizeof name, "groups_%s_%s_rank%d_group_average_bits%s", c->name, tag, rank, exact ? "" : "_host_order");
    verdict(!bad, name, "%zu of %d values are not the float average of ranks %d..%d", bad, TOTAL, first, first + S - 1);
    snprintf(name, sizeof name, "groups_%s_%s_rank%d_group_average_within_float64_bound", c->name, tag, rank);
    verdict(!far, name, "%zu values beyond the bound (worst %g)", far, worst);
    if (S < W) {
        snprintf(name, sizeof name, "groups_%s_%s_rank%d_not_the_other_groups_nor_the_worlds", c->name, tag, rank);
        /* two independent averages agree by chance on a few values at most (bf16: a few more) */
        verdict(same_other < TOTAL / 8 && same_world < TOTAL / 8, name, "%zu values equal the other group's, %zu the "
                "world's average (of %d)", same_other, same_world, TOTAL);
    }
    for (s = 0; s < MAXW; s++) free(v[s]);
    return;
fail:
    printf("FAIL groups_%s_%s_rank%d_step: %s: %s\n", c->name, tag, rank, ddp_result_string(r), ddp_last_error(ctx));
    test_failures++;
    for (s = 0; s < MAXW; s++) free(v[s]);
}

/* Every rank's hash of its parameters (the fp32 master; bf16: and the working copies). */
static int param_hashes(ddp_context *ctx, const config *c, uint64_t *all) {
    size_t n = 0;
    int s;
    uint64_t mine;
    const float *p = ddp_flat_params(ctx, &n);
    mine = test_hash(p, n * sizeof(float));
    if (c->bf16) {
        const ddp_bf16 *w = ddp_flat_params_bf16(ctx, &n);
        mine ^= test_hash(w, n * sizeof(ddp_bf16)) * 31;
    }
    for (s = 0; s < ddp_world_size(ctx) && s < MAXW; s++) {
        all[s] = mine;
        if (ddp_broadcast(ctx, &all[s], sizeof all[s], s) != DDP_OK) return 0;
    }
    return 1;
}

/* One configuration on this rank: init (desc given), three steps, the checks. */
static void run_config(ddp_desc d, const config *c) {
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    ddp_outer_status st;
    uint64_t h[MAXW];
    int ids[NPARAM], p, s, rank, S = c->group_size, first, ok;
    char name[160];
    ddp_result r;
    float *init[NPARAM] = { NULL, NULL, NULL };   /* read at commit */
    d.outer.mode = c->delay ? DDP_OUTER_STREAMING : DDP_OUTER_DILOCO;
    d.outer.group_size = S;
    d.outer.inner_steps = 2;
    d.outer.delay_steps = c->delay;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.reduce_dtype = c->bf16_wire ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f;
    if ((r = ddp_init(&ctx, &d)) != DDP_OK) goto fail;
    rank = ddp_rank(ctx);
    first = rank / S * S;
    for (p = 0; p < NPARAM; p++) {
        size_t j;
        char pn[16];
        if (!(init[p] = (float *)malloc(sizes[p] * sizeof(float)))) { r = DDP_ERR_OUT_OF_MEMORY; goto fail; }
        for (j = 0; j < sizes[p]; j++) init[p][j] = 0.5f * test_value((uint64_t)(7 + p), j);
        snprintf(pn, sizeof pn, "p%d", p);
        if ((r = ddp_register_param(ctx, pn, sizes[p], 0, init[p], &ids[p])) != DDP_OK) goto fail;
    }
    r = ddp_commit(ctx);
    for (p = 0; p < NPARAM; p++) { free(init[p]); init[p] = NULL; }
    if (r != DDP_OK) goto fail;
    st = ddp_outer_state(ctx);
    snprintf(name, sizeof name, "groups_%s_rank%d_layout", c->name, rank);
    verdict(st.groups == c->world / S && st.group == rank / S && st.group_size == S && st.group_rank == rank % S &&
            ddp_world_size(ctx) == c->world && ddp_num_buckets(ctx) >= 2 && ddp_config(ctx)->backend == d.backend, name,
            "groups %d group %d size %d index %d, world %d, %d bucket(s), backend %s", st.groups, st.group, st.group_size,
            st.group_rank, ddp_world_size(ctx), ddp_num_buckets(ctx), ddp_backend_name(ctx));
    /* step 1: averaged within the groups; the groups' parameters part */
    step_and_check(ctx, c, ids, 1, "step1");
    if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) goto fail;
    if (!param_hashes(ctx, c, h)) { r = DDP_ERR_BACKEND; goto fail; }
    for (ok = 1, s = 0; s < c->world; s++) ok &= (s / S == rank / S) == (h[s] == h[rank]);
    snprintf(name, sizeof name, "groups_%s_rank%d_inner_step_replicas_equal_within_group_only", c->name, rank);
    verdict(ok, name, "parameter hashes %016llx %016llx %016llx %016llx (groups of %d)", (unsigned long long)h[0],
            (unsigned long long)h[1], (unsigned long long)h[2], (unsigned long long)h[3], S);
    /* step 2: the outer sync (H = 2) makes every replica the same (with a delay: after step 3, the
       exchange in flight meanwhile); step 3 averages within the groups again, after the world-wide
       exchange (with a delay: its buckets wait for the exchange on the other thread) */
    step_and_check(ctx, c, ids, 2, "step2");
    if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) goto fail;
    if (c->delay) {
        st = ddp_outer_state(ctx);
        snprintf(name, sizeof name, "groups_%s_rank%d_fragment_in_flight_after_step2", c->name, rank);
        verdict(st.in_flight == 0 && st.syncs == 0, name, "in flight %d, syncs %lld", st.in_flight, (long long)st.syncs);
        step_and_check(ctx, c, ids, 3, "step3");
        if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) goto fail;
    }
    st = ddp_outer_state(ctx);
    if (!param_hashes(ctx, c, h)) { r = DDP_ERR_BACKEND; goto fail; }
    for (ok = st.syncs == 1, s = 0; s < c->world; s++) ok &= h[s] == h[0];
    snprintf(name, sizeof name, "groups_%s_rank%d_outer_sync_replicas_equal", c->name, rank);
    verdict(ok, name, "syncs %lld, parameter hashes %016llx %016llx %016llx %016llx", (long long)st.syncs,
            (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2], (unsigned long long)h[3]);
    if (!c->delay) step_and_check(ctx, c, ids, 3, "step3");
    (void)first;
    r = ddp_shutdown(ctx);
    snprintf(name, sizeof name, "groups_%s_rank%d_shutdown", c->name, rank);
    verdict(r == DDP_OK, name, "%s", ddp_result_string(r));
    return;
fail:
    printf("FAIL groups_%s_rank%d: %s: %s\n", c->name, d.world_size ? d.rank : -1, ddp_result_string(r), ddp_last_error(ctx));
    test_failures++;
    for (p = 0; p < NPARAM; p++) free(init[p]);
    ddp_shutdown(ctx);
}

static const config *current;
static void rank_main(test_rank *self) {
    ddp_desc d = test_desc(self);
    d.timeout_s = 60;
    d.backend = DDP_BACKEND_CPU;
    run_config(d, current);
}

int main(int argc, char **argv) {
    size_t i;
    int env = argc > 1 && !strcmp(argv[1], "env");
    for (i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const config *c = &configs[i];
#ifdef DDP_MPI
        if (c->staged) continue;   /* the staging slots are the CPU backend's */
#endif
        if (env && c->world != 4) continue;   /* a launcher's 4 ranks */
        if (c->staged) setenv("DDP_STAGED_GRADS", "1", 1);
        if (env) {
            ddp_desc d;
            memset(&d, 0, sizeof d);
            d.timeout_s = 60;
            d.log_level = DDP_LOG_ERROR;
            d.backend = DDP_BACKEND_CPU;
#ifdef DDP_MPI
            d.backend = DDP_BACKEND_MPI;   /* under mpirun on one host too (AUTO would take the CPU backend) */
#endif
            run_config(d, c);
        } else {
            test_rank ranks[MAXW];
            void *shared[1] = { (void *)rank_main };
            current = c;
            test_run_ranks(c->world, shared, ranks);
        }
        if (c->staged) unsetenv("DDP_STAGED_GRADS");
    }
    return test_summary("test_groups");
}
