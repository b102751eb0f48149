/* test_groups_shard.c — the sharded optimizer (ZeRO-1) within replica groups: 4 thread-ranks in
   2 groups of 2 (CPU backend), or with "env" the ranks a launcher started (mpirun -n 4 with the
   MPI build: build/mpi/test_groups_shard). Each configuration trains 6 steps twice, with
   shard_optimizer off and on, and every rank compares, bit for bit, its parameters and (through
   ddp_gather_to_host, so from its group's owners) AdamW's m and v with the unsharded run's:
   - DiLoCo H = 2 and streaming DiLoCo (2 fragments, H = 4, one step in flight, mix 0.5);
   - clipping on (the norm is the group's: each group's blocks exchanged among its ranks);
   - skip_nonfinite with a NaN in group 1's gradients at step 5 only: group 1 skips, group 0
     steps, and both go on in step (the skipping group still gathers, so the exchanges agree);
   - in place (the parameters in the shared segment) and staged (DDP_STAGED_GRADS=1: the parts
     by broadcast among the group), CPU backend only.
   - checkpoints: a sharded run saved mid-way (DiLoCo between syncs; streaming with a fragment in
     flight; each group's m and v from its own members) and loaded by a sharded and by an
     unsharded run, which finish with the same bits.
   Each with fp32 and with bf16 parameters (the fp32 master in parts within the group, gathered
   among it for the outer step; the bf16 working copies compared too). And: groups of one rank
   take shard_optimizer as a no-op (nothing to shard across: m and v whole). ZeRO-3 within the
   groups (the _z3 configurations: DDP_SHARD_PARAMETERS in the sharded runs, the same two units
   in every run): the same comparisons, the outer step gathering the group's parts of the
   parameters; in groups of one rank too (trained, and the parameters whole); and a lone write of
   parameters in groups of two refused by name, ddp_scatter_from_host reaching every part. The
   MPI build runs every configuration but the staged ones (the staging slots are the CPU
   backend's), ZeRO-3 included: its gathers on a duplicate of the replica group's communicator. */
#include "testlib.h"

#define W 4
#define NPARAM 2
#define STEPS 6
static const size_t sizes[NPARAM] = { 70001, 3003 };   /* buckets of several 1024-float parts */
#define TOTAL (70001 + 3003)

/* z3: the sharded runs at DDP_SHARD_PARAMETERS (ZeRO-3 within the groups: the parameters in parts
   too, gathered among the group for the outer step; every run of the config declares the same
   two units, so every level has the same buckets) */
typedef struct config { const char *name; int streaming, staged, bf16, z3, one; } config;   /* one: groups of one rank */
static const config configs[] = { { "diloco", 0, 0, 0, 0, 0 },      { "streaming", 1, 0, 0, 0, 0 },      { "diloco_staged", 0, 1, 0, 0, 0 },
                                  { "diloco_bf16", 0, 0, 1, 0, 0 }, { "streaming_bf16", 1, 0, 1, 0, 0 }, { "streaming_bf16_staged", 1, 1, 1, 0, 0 },
                                  { "diloco_z3", 0, 0, 0, 1, 0 },   { "streaming_z3", 1, 0, 0, 1, 0 },   { "streaming_bf16_z3", 1, 0, 1, 1, 0 },
                                  { "diloco_z3_groups_of_one", 0, 0, 0, 1, 1 }, { "streaming_bf16_z3_groups_of_one", 1, 0, 1, 1, 1 } };

/* Rank r's gradient of element i at step t: group 1's are NaN at step 5 (skip_nonfinite; after the checkpoint: the file holds one AdamW step count, rank 0's). */
static float grad_value(int r, int t, size_t i) {
    if (t == 5 && r >= 2 && i == 17) return NAN;
    return test_value((uint64_t)(500 + 10 * r + t), i);
}

static uint64_t got_hash[4][W][4];   /* [run][rank][params (the fp32 master), m, v, bf16 working copies]: run 0 unsharded, 1 sharded, 2 and 3 resumed */
static char ckpt_path[256];

/* A run: shard_optimizer off or on; run 2 saves after step `save_at` (streaming: a fragment in
   flight) and stops; run 3 (sharded) and run 4 (unsharded, hashed into slot 2) load that file
   and train the remaining steps. */
static ddp_result train(ddp_desc d, const config *c, int shard, int *rank_out, int run) {
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    int ids[NPARAM], units[NPARAM], p, t, rank, which, save_at = c->streaming ? 2 : 3, slot = run == 4 ? 2 : run;
    size_t j, i, n;
    ddp_result r;
    float *buf = NULL;
    char name[128];
    d.outer.mode = c->streaming ? DDP_OUTER_STREAMING : DDP_OUTER_DILOCO;
    d.outer.group_size = c->one ? 1 : 2;
    d.outer.inner_steps = c->streaming ? 4 : 2;
    if (c->streaming) { d.outer.fragments = 2; d.outer.delay_steps = 1; d.outer.mix = 0.5f; }
    d.shard_optimizer = shard;
    d.shard = shard && c->z3 ? DDP_SHARD_PARAMETERS : DDP_SHARD_DEFAULT;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.skip_nonfinite = 1;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f;
    opt.max_grad_norm = 50.0f;
    if ((r = ddp_init(&ctx, &d)) != DDP_OK) goto out;
    rank = *rank_out = ddp_rank(ctx);
    if (!(buf = (float *)malloc(TOTAL * sizeof(float)))) { r = DDP_ERR_OUT_OF_MEMORY; goto out; }
    for (p = 0; p < NPARAM; p++) {
        char pn[16];
        float *init = buf + (p ? sizes[0] : 0);   /* read at commit */
        for (j = 0; j < sizes[p]; j++) init[j] = 0.5f * test_value((uint64_t)(3 + p), j);
        snprintf(pn, sizeof pn, "p%d", p);
        if ((r = ddp_register_param(ctx, pn, sizes[p], 0, init, &ids[p])) != DDP_OK) goto out;
        if (c->z3 && (r = ddp_register_unit(ctx, pn, ids[p], 1, &units[p])) != DDP_OK) goto out;
    }
    if ((r = ddp_commit(ctx)) != DDP_OK) goto out;
    if (run >= 3 && (r = ddp_load(ctx, ckpt_path, NULL, 0, NULL, NULL, NULL)) != DDP_OK) goto out;
    for (t = run >= 3 ? save_at + 1 : 1; t <= STEPS; t++) {
        if ((r = ddp_zero_grad(ctx)) != DDP_OK) goto out;
        for (p = NPARAM - 1; p >= 0; p--) {
            for (j = 0; j < sizes[p]; j++) {
                float g = grad_value(rank, t, (p ? sizes[0] : 0) + j);
                if (c->bf16) ddp_grad_bf16(ctx, ids[p])[j] = ddp__to_bf16(g);
                else ddp_grad(ctx, ids[p])[j] = g;
            }
            if ((r = ddp_grad_ready(ctx, ids[p])) != DDP_OK) goto out;
        }
        if ((r = ddp_finish(ctx)) != DDP_OK) goto out;
        if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) goto out;
        if (run == 2 && t == save_at) {
            ddp_outer_status st = ddp_outer_state(ctx);
            snprintf(name, sizeof name, "groups_shard_%s_rank%d_saved_%s", c->name, rank, c->streaming ? "in_flight" : "between_syncs");
            verdict(c->streaming ? st.in_flight >= 0 : st.in_flight < 0 && st.inner_steps % 2, name, "in flight %d, inner %lld",
                    st.in_flight, (long long)st.inner_steps);
            r = ddp_save(ctx, ckpt_path, NULL, 0);
            goto out;
        }
    }
    if (run < 2) {
        ddp_outer_status st = ddp_outer_state(ctx);
        int64_t *step = NULL;
        /* sharded: m is in parts (all of it is refused here); group 1 skipped step 5 */
        ddp_result whole = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, buf, TOTAL);
        ddp_adamw_state(ctx, NULL, NULL, &step);
        snprintf(name, sizeof name, "groups_shard_%s_%s_rank%d_layout_and_skip", c->name, shard ? "on" : "off", rank);
        verdict((whole == DDP_OK) == (!shard || c->one) && step && *step == (rank < 2 ? STEPS : STEPS - 1), name,
                "copy of all of m: %s, step %lld", ddp_result_string(whole), step ? (long long)*step : -1LL);
        snprintf(name, sizeof name, "groups_shard_%s_%s_rank%d_synced", c->name, shard ? "on" : "off", rank);
        verdict(st.syncs >= 2 && st.groups == (c->one ? W : 2), name, "syncs %lld, groups %d", (long long)st.syncs, st.groups);
    }
    /* every rank gathers every buffer to itself in turn: each part from its owner in its group */
    for (which = 0; which < 3; which++) {
        ddp_buffer b = which == 0 ? DDP_PARAMS : which == 1 ? DDP_ADAM_M : DDP_ADAM_V;
        int root;
        for (root = 0; root < ddp_world_size(ctx); root++) {
            if ((r = ddp_gather_to_host(ctx, b, 0, buf, TOTAL, root)) != DDP_OK) goto out;
            if (root == rank) got_hash[slot][rank][which] = test_hash(buf, TOTAL * sizeof(float));
        }
    }
    /* ZeRO-3: the working copies are there while the units are gathered (from the group's parts) */
    for (p = 0; p < NPARAM && c->z3; p++) if ((r = ddp_unit_gather(ctx, units[p])) != DDP_OK) goto out;
    if (c->bf16) got_hash[slot][rank][3] = test_hash(ddp_flat_params_bf16(ctx, NULL), TOTAL * sizeof(ddp_bf16));
    for (p = 0; p < NPARAM && c->z3; p++) if ((r = ddp_unit_release(ctx, units[p])) != DDP_OK) goto out;
    if (c->z3 && shard && ddp_config(ctx)->shard != DDP_SHARD_PARAMETERS) {
        printf("FAIL groups_shard_%s_rank%d: the level is %d, not DDP_SHARD_PARAMETERS\n", c->name, rank, (int)ddp_config(ctx)->shard);
        test_failures++;
    }
    (void)i; (void)n;
out:
    if (r != DDP_OK)
        printf("FAIL groups_shard_%s_%s_rank%d: %s: %s\n", c->name, shard ? "on" : "off", d.rank, ddp_result_string(r),
               ddp_last_error(ctx));
    free(buf);
    {
        ddp_result s = ddp_shutdown(ctx);
        if (r == DDP_OK) r = s;
    }
    return r;
}

static void compare(const config *c, int rank) {
    char name[128];
    static const char *what[4] = { "params", "m", "v", "bf16_working_copies" };
    static const char *runs[4] = { "", "sharded", "unsharded_resumed_from_sharded", "sharded_resumed" };
    int k, run;
    for (run = 1; run < 4; run++)
        for (k = 0; k < (c->bf16 ? 4 : 3); k++) {
            snprintf(name, sizeof name, "groups_shard_%s_rank%d_%s_%s_equal_unsharded_bits", c->name, rank, runs[run], what[k]);
            verdict(got_hash[0][rank][k] == got_hash[run][rank][k], name, "hash %016llx, %016llx unsharded",
                    (unsigned long long)got_hash[run][rank][k], (unsigned long long)got_hash[0][rank][k]);
        }
}

/* The four runs of a configuration on this rank. */
static int runs(ddp_desc d, const config *c, int *rank) {
    return train(d, c, 0, rank, 0) == DDP_OK && train(d, c, 1, rank, 1) == DDP_OK && train(d, c, 1, rank, 2) == DDP_OK &&
           train(d, c, 1, rank, 3) == DDP_OK && train(d, c, 0, rank, 4) == DDP_OK;
}

/* The groups' replicas differ between syncs and meet at one: guard that the comparison above
   compares trained, group-dependent values (group 0 and 1 differ in m after the skip). */
static void groups_differ(const config *c, int rank) {
    char name[128];
    int other = (rank + 2) % W;
    snprintf(name, sizeof name, "groups_shard_%s_rank%d_groups_m_differ", c->name, rank);
    verdict(got_hash[1][rank][1] != got_hash[1][other][1], name, "rank %d and %d (other group) hold the same m", rank, other);
}

/* Groups of one rank: shard_optimizer is a no-op (nothing to shard across). */
static void refusals(ddp_desc d, int rank) {
    ddp_context *ctx = NULL;
    char name[128];
    ddp_result r;
    d.outer.mode = DDP_OUTER_DILOCO;
    d.outer.inner_steps = 2;
    d.shard_optimizer = 1;
    d.log_level = DDP_LOG_OFF;
    d.outer.group_size = 1;   /* every rank its own group: nothing to shard across */
    d.param_dtype = DDP_DTYPE_FP32;
    if ((r = ddp_init(&ctx, &d)) == DDP_OK) {
        float x[2048];
        int id, ok;
        size_t k;
        for (k = 0; k < 2048; k++) x[k] = (float)k;
        if ((r = ddp_register_param(ctx, "x", 2048, 0, x, &id)) == DDP_OK && (r = ddp_commit(ctx)) == DDP_OK) {
            /* m whole on every rank: a copy of all of it is not refused ("not all held by rank R") */
            ok = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, x, 2048) == DDP_OK;
            snprintf(name, sizeof name, "groups_shard_groups_of_one_not_sharded_rank%d", rank);
            verdict(ok, name, "%s", ddp_last_error(ctx));
        }
    }
    if (r != DDP_OK) {
        printf("FAIL groups_shard_groups_of_one_rank%d: %s: %s\n", rank, ddp_result_string(r), ddp_last_error(ctx));
        test_failures++;
    }
    ddp_shutdown(ctx);
    /* ZeRO-3: groups of one hold everything (the unit gathers this rank's own values); groups of
       two: a lone write of parameters is refused by name (the outer copy must follow on every
       rank), the collective write reaches every rank's parts and their gathered view */
    for (int kase = 0; kase < 3; kase++) {   /* groups of one, fp32 and bf16; groups of two, fp32 */
        float x[4096], y[4096];
        int id, u, ok, size = kase < 2 ? 1 : 2;
        size_t k;
        ctx = NULL;
        d.outer.group_size = size;
        d.param_dtype = kase == 1 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
        d.shard = DDP_SHARD_PARAMETERS;
        for (k = 0; k < 4096; k++) x[k] = (float)k;
        if ((r = ddp_init(&ctx, &d)) == DDP_OK && (r = ddp_register_param(ctx, "x", 4096, 0, x, &id)) == DDP_OK &&
            (r = ddp_register_unit(ctx, "x", id, 1, &u)) == DDP_OK && (r = ddp_commit(ctx)) == DDP_OK) {
            if (size == 1) {
                ok = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, y, 4096) == DDP_OK && ddp_unit_gather(ctx, u) == DDP_OK;
                for (k = 0; k < 4096 && ok; k++)   /* small integers: exact in bf16 up to 256, rounded to even above */
                    ok = (kase ? ddp__from_bf16(ddp_param_bf16(ctx, id)[k]) : ddp_param(ctx, id)[k]) ==
                         (kase ? ddp__from_bf16(ddp__to_bf16(x[k])) : x[k]);
                ok = ok && ddp_unit_release(ctx, u) == DDP_OK && ddp_copy_to_host(ctx, DDP_PARAMS, 0, y, 4096) == DDP_OK &&
                     !memcmp(x, y, sizeof x);   /* the fp32 parameters (bf16: the master) whole on every rank */
                snprintf(name, sizeof name, "groups_shard_z3_groups_of_one_%s_not_sharded_rank%d", kase ? "bf16" : "fp32", rank);
                verdict(ok, name, "%s", ddp_last_error(ctx));
            } else {
                ddp_result lone = ddp_copy_from_host(ctx, DDP_PARAMS, rank % 2 ? 2048 : 0, x, 16);
                snprintf(name, sizeof name, "groups_shard_z3_groups_of_two_lone_parameter_write_refused_rank%d", rank);
                verdict(lone == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ctx), "cannot write parameters alone") &&
                        strstr(ddp_last_error(ctx), "ddp_scatter_from_host"), name, "%s: %s", ddp_result_string(lone),
                        ddp_last_error(ctx));
                for (k = 0; k < 4096; k++) y[k] = -(float)k;
                ok = ddp_scatter_from_host(ctx, DDP_PARAMS, 0, y, 4096, 0) == DDP_OK && ddp_unit_gather(ctx, u) == DDP_OK &&
                     !memcmp(ddp_param(ctx, id), y, sizeof y) && ddp_unit_release(ctx, u) == DDP_OK;
                snprintf(name, sizeof name, "groups_shard_z3_groups_of_two_scatter_reaches_every_part_rank%d", rank);
                verdict(ok, name, "%s", ddp_last_error(ctx));
            }
        } else {
            printf("FAIL groups_shard_z3_groups_of_%d_rank%d: %s: %s\n", size, rank, ddp_result_string(r), ddp_last_error(ctx));
            test_failures++;
        }
        ddp_shutdown(ctx);
    }
}

static const config *current;
static void rank_main(test_rank *self) {
    ddp_desc d = test_desc(self);
    d.timeout_s = 60;
    d.backend = DDP_BACKEND_CPU;
    d.log_level = DDP_LOG_ERROR;
    if (!current) { refusals(d, d.rank); return; }
    int rank;
    if (!runs(d, current, &rank)) test_failures++;
}

int main(int argc, char **argv) {
    size_t i;
    int env = argc > 1 && !strcmp(argv[1], "env");
    const char *dir = getenv("TMPDIR");
    char tag[64];
    /* every rank names the same file: a launcher's ranks by the job's port, thread-ranks by the pid */
    if (env) snprintf(tag, sizeof tag, "port%s", getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "");
    else snprintf(tag, sizeof tag, "pid%ld", (long)getpid());
    snprintf(ckpt_path, sizeof ckpt_path, "%s/ddp_groups_shard_%s.ckpt", dir && *dir ? dir : "/tmp", tag);
    for (i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const config *c = &configs[i];
        int rank;
#ifdef DDP_MPI
        if (c->staged) continue;   /* the staging slots are the CPU backend's */
#endif
        if (c->staged) setenv("DDP_STAGED_GRADS", "1", 1);
        memset(got_hash, 0, sizeof got_hash);
        if (env) {
            ddp_desc d;
            memset(&d, 0, sizeof d);
            d.timeout_s = 60;
            d.log_level = DDP_LOG_ERROR;
            d.backend = DDP_BACKEND_CPU;
#ifdef DDP_MPI
            d.backend = DDP_BACKEND_MPI;
#endif
            rank = 0;
            if (runs(d, c, &rank)) compare(c, rank);
            else test_failures++;
            if (i == 0) refusals(d, rank);   /* once */
        } else {
            test_rank ranks[W];
            void *shared[1] = { (void *)rank_main };
            current = c;
            test_run_ranks(W, shared, ranks);
            for (rank = 0; rank < W; rank++) { compare(c, rank); groups_differ(c, rank); }
        }
        if (c->staged) unsetenv("DDP_STAGED_GRADS");
    }
    if (!env) {
        test_rank ranks[W];
        void *shared[1] = { (void *)rank_main };
        current = NULL;
        test_run_ranks(W, shared, ranks);
    }
    if (env ? getenv("RANK") && !strcmp(getenv("RANK"), "0") : 1) remove(ckpt_path);
    return test_summary("test_groups_shard");
}
