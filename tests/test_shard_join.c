/* test_shard_join.c — uneven inputs (ddp_join) at every sharded level, ranks as threads of one
   process, on the CPU backend and on the NCCL backend run on the host emulation (tests/fakegpu,
   built like test_bf16_params.c). Rank r runs batches[r] micro-batches (every `accum` of them a
   synchronizing step, the last ones of a rank that runs out mid-window pending when it joins),
   then ddp_join; a joined rank answers the others' steps and, sharded, steps its own parts with
   the options the lowest rank with data sends. Each case runs the same program unsharded (the
   reference: its replicas are synced by ddp_join's broadcast), then at ZeRO-1, ZeRO-2 and (CPU)
   ZeRO-3, and checks that after every rank returned from ddp_join:
   - every rank's parameters, m and v gathered whole (ddp_gather_to_host, each rank the root in
     turn) and its step count are bit-identical to the unsharded run's;
   - the gradients depend on the parameters read in the forward (under ZeRO-3 from the gathered
     units), so a joined rank's part that missed a step would show in every later step;
   - a checkpoint saved after the join (ZeRO-2, ZeRO-3) loads into an unsharded 1-rank context
     with the reference's parameters, m, v and step.
   Cases: 2, 3 and 4 ranks; fp32 parameters, DIVIDE_BY_WORLD, no accumulation, the lowest rank
   joining first (the options come from another root); bf16 parameters, DIVIDE_BY_ACTIVE,
   accumulation (joins with pending micro-steps), a NaN step skipped (skip_nonfinite); clipping
   always engaged; weight decay with a DDP_NO_DECAY parameter. One rank: ddp_join returns at once.
   Hybrid sharding (4 ranks in shard groups of 2) and the CPU backend's staging slots
   (DDP_STAGED_GRADS=1, 3 ranks) at ZeRO-1 and ZeRO-2.
   A root whose ddp_adamw_step fails (bad options) makes the joined rank's ddp_join fail, naming it.
   Refusals: DDP_SHARD_PARAMETERS with uneven_inputs on NCCL, shard_accumulate with uneven_inputs,
   replica groups (desc.outer) with uneven_inputs.
   Run: build/test_shard_join */
#include "testlib.h"
#include "fakegpu/fakegpu.h"
#include <math.h>

#define MAX_WORLD 4
#define NP 3
static const size_t sizes[NP] = { 3000, 17, 2100 };   /* several buckets and norm blocks, a part boundary inside a parameter */
#define TOTAL (3000 + 17 + 2100 + 64)                 /* the flat buffer's floats, padding included, at most */

static struct {
    ddp_backend backend;
    ddp_shard level;
    ddp_join_mode mode;
    int bf16, accum, nan, world, group;
    int batches[MAX_WORLD];
    const char *ckpt;             /* save after the join */
} cfg;

typedef struct out {
    ddp_result r;
    char err[DDP__ERR_MAX];
    size_t count;
    float p[TOTAL], m[TOTAL], v[TOTAL];   /* gathered whole on this rank */
    int64_t step;
    int local_ok;                 /* ZeRO-1/2: this rank's own parameters (working copies) = the gathered ones */
} out;
static out res[MAX_WORLD], ref[MAX_WORLD];
static int staged;                /* DDP_STAGED_GRADS=1: the CPU backend's staging slots, no segment (no ZeRO-3 there) */

static float init[NP][3000];   /* read at ddp_commit: one array a parameter, filled before any rank starts */

/* The gradient of micro-batch t on rank r: data plus a pull toward zero of the parameter read */
static float grad_value(int t, int r, int id, size_t i, float p) {
    if (cfg.nan && t == cfg.accum + 1 && r == 1 && id == 2 && i == 5) return NAN;   /* rank 1 has data there */
    return 0.25f * test_value((uint64_t)(900 + t * 16 + r * 4 + id), i) + 0.5f * p;
}

static float param_at(ddp_context *ctx, int id, size_t i) {
    return cfg.bf16 ? ddp__from_bf16(ddp_param_bf16(ctx, id)[i]) : ddp_param(ctx, id)[i];
}

static void rank_main(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    int ids[NP], units[2], t, id, k, u, r = self->rank;
    size_t i, n = 0;
    out *o = cfg.level == DDP_SHARD_NONE ? &ref[r] : &res[r];
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f;
    opt.weight_decay = 0.1f;
    opt.max_grad_norm = 0.5f;   /* below every step's norm: clipping always on */
    d.backend = self->world == 1 ? DDP_BACKEND_SINGLE : cfg.backend;
    d.shard = cfg.level;
    d.uneven_inputs = cfg.mode;
    d.skip_nonfinite = cfg.nan;
    d.param_dtype = cfg.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.bucket_cap_mb = 0.008;   /* ~2000 floats: several buckets */
    if (cfg.level != DDP_SHARD_NONE) d.shard_group = cfg.group;
    o->r = ddp_init(&ctx, &d);
    for (id = 0; id < NP && o->r == DDP_OK; id++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", id);
        o->r = ddp_register_param(ctx, name, sizes[id], id == 1 ? DDP_NO_DECAY : 0, init[id], &ids[id]);
    }
    if (o->r == DDP_OK) o->r = ddp_register_unit(ctx, "u0", ids[0], 2, &units[0]);
    if (o->r == DDP_OK) o->r = ddp_register_unit(ctx, "u1", ids[2], 1, &units[1]);
    if (o->r == DDP_OK) o->r = ddp_commit(ctx);
    for (t = 0; t < cfg.batches[r] && o->r == DDP_OK; t++) {
        int sync = t % cfg.accum == cfg.accum - 1;
        if (t % cfg.accum == 0 && (o->r = ddp_zero_grad(ctx)) != DDP_OK) break;
        ddp_set_sync(ctx, sync);
        for (u = 0; u < 2 && o->r == DDP_OK; u++) {   /* the forward: each unit gathered, read, released */
            if ((o->r = ddp_unit_gather(ctx, units[u])) != DDP_OK) break;
            for (id = u ? 2 : 0; id < (u ? 3 : 2); id++)
                for (i = 0; i < sizes[id]; i++) {
                    float g = grad_value(t, r, id, i, param_at(ctx, id, i));
                    if (cfg.bf16) {
                        ddp_bf16 *gb = ddp_grad_bf16(ctx, id);
                        gb[i] = ddp__to_bf16(ddp__from_bf16(gb[i]) + g);
                    } else ddp_grad(ctx, id)[i] += g;
                }
            o->r = ddp_unit_release(ctx, units[u]);
        }
        for (id = NP - 1; id >= 0 && o->r == DDP_OK; id--) o->r = ddp_grad_ready(ctx, ids[id]);
        if (o->r == DDP_OK) o->r = ddp_finish(ctx);
        if (o->r == DDP_OK && sync) o->r = ddp_adamw_step(ctx, &opt, NULL);   /* the NaN step: skipped (skip_nonfinite), DDP_OK */
    }
    if (o->r == DDP_OK) o->r = ddp_join(ctx);
    if (o->r == DDP_OK) {
        float *flat = ddp_flat_params(ctx, &n);
        int64_t *step;
        ddp_bucket_info bi;
        (void)flat;
        ddp_adamw_state(ctx, NULL, NULL, &step);
        o->step = step ? *step : -1;
        for (k = 0; k < ddp_num_buckets(ctx) && o->r == DDP_OK; k++)   /* the flat buffer's end: the buckets' farthest */
            if ((o->r = ddp_bucket(ctx, k, &bi)) == DDP_OK && bi.offset + bi.count > o->count) o->count = bi.offset + bi.count;
    }
    for (k = 0; k < self->world && o->r == DDP_OK && o->count <= TOTAL; k++) {   /* each rank the root once */
        float *dp = k == r ? o->p : NULL, *dm = k == r ? o->m : NULL, *dv = k == r ? o->v : NULL;
        static float sink[MAX_WORLD][TOTAL];
        if (!dp) dp = dm = dv = sink[r];
        o->r = ddp_gather_to_host(ctx, DDP_PARAMS, 0, dp, o->count, k);
        if (o->r == DDP_OK) o->r = ddp_gather_to_host(ctx, DDP_ADAM_M, 0, dm, o->count, k);
        if (o->r == DDP_OK) o->r = ddp_gather_to_host(ctx, DDP_ADAM_V, 0, dv, o->count, k);
    }
    o->local_ok = 1;
    if (o->r == DDP_OK && cfg.level != DDP_SHARD_PARAMETERS)   /* ZeRO-1/2 (and unsharded): every rank holds the parameters whole */
        for (id = 0; id < NP; id++) {
            size_t at = (size_t)((cfg.bf16 ? (const char *)ddp_param_bf16(ctx, ids[id]) - (const char *)ddp_flat_params_bf16(ctx, NULL)
                                           : (const char *)ddp_param(ctx, ids[id]) - (const char *)ddp_flat_params(ctx, NULL)) /
                                 (cfg.bf16 ? sizeof(ddp_bf16) : sizeof(float)));
            for (i = 0; i < sizes[id]; i++) {
                o->local_ok &= cfg.bf16 ? ddp_param_bf16(ctx, ids[id])[i] == ddp__to_bf16(o->p[at + i])
                                        : ddp_param(ctx, ids[id])[i] == o->p[at + i];
            }
        }
    if (o->r == DDP_OK && cfg.ckpt) o->r = ddp_save(ctx, cfg.ckpt, NULL, 0);
    if (o->r != DDP_OK) snprintf(o->err, sizeof o->err, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void run(ddp_shard level) {
    void *shared[1] = { (void *)rank_main };
    test_rank ranks[MAX_WORLD];
    cfg.level = level;
    memset(level == DDP_SHARD_NONE ? ref : res, 0, sizeof res);
    fakegpu_reset();
    test_run_ranks(cfg.world, shared, ranks);
}

static const char *level_name(ddp_shard l) {
    return l == DDP_SHARD_OPTIMIZER ? "zero1" : l == DDP_SHARD_GRADIENTS ? "zero2" : l == DDP_SHARD_PARAMETERS ? "zero3" : "none";
}

/* The checkpoint saved after the sharded join, loaded into an unsharded context of one rank. */
static int load_unsharded(const char *path, char *why, size_t cap) {
    test_rank self;
    ddp_desc d;
    ddp_context *ctx = NULL;
    static float p[TOTAL], m[TOTAL], v[TOTAL];
    int id, ok, got;
    int64_t *step = NULL;
    ddp_result r;
    memset(&self, 0, sizeof self);
    self.world = 1;
    self.port = test_free_port();
    d = test_desc(&self);
    d.param_dtype = cfg.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.bucket_cap_mb = 0.008;
    r = ddp_init(&ctx, &d);
    for (id = 0; id < NP && r == DDP_OK; id++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", id);
        r = ddp_register_param(ctx, name, sizes[id], id == 1 ? DDP_NO_DECAY : 0, NULL, &got);
    }
    if (r == DDP_OK) r = ddp_commit(ctx);
    if (r == DDP_OK) r = ddp_load(ctx, path, NULL, 0, NULL, NULL, NULL);
    if (r == DDP_OK) r = ddp_copy_to_host(ctx, DDP_PARAMS, 0, p, ref[0].count);
    if (r == DDP_OK) r = ddp_copy_to_host(ctx, DDP_ADAM_M, 0, m, ref[0].count);
    if (r == DDP_OK) r = ddp_copy_to_host(ctx, DDP_ADAM_V, 0, v, ref[0].count);
    if (r == DDP_OK) r = ddp_adamw_state(ctx, NULL, NULL, &step);
    ok = r == DDP_OK && !memcmp(p, ref[0].p, ref[0].count * sizeof(float)) && !memcmp(m, ref[0].m, ref[0].count * sizeof(float)) &&
         !memcmp(v, ref[0].v, ref[0].count * sizeof(float)) && step && *step == ref[0].step;
    snprintf(why, cap, "%s: %s", ddp_result_string(r), r == DDP_OK ? "parameters, m, v or step differ from the unsharded run" : ddp_last_error(ctx));
    ddp_shutdown(ctx);
    return ok;
}

static void test_case(ddp_backend backend, int world, int group, int bf16, ddp_join_mode mode, int accum, int nan, const int *batches) {
    const ddp_shard levels[3] = { DDP_SHARD_OPTIMIZER, DDP_SHARD_GRADIENTS, DDP_SHARD_PARAMETERS };
    char name[160], path[64], why[DDP__ERR_MAX + 64];
    int l, r, ref_ok = 1;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = backend; cfg.world = world; cfg.bf16 = bf16; cfg.mode = mode; cfg.accum = accum; cfg.nan = nan; cfg.group = group;
    memcpy(cfg.batches, batches, sizeof cfg.batches);
    run(DDP_SHARD_NONE);
    for (r = 0; r < world; r++) ref_ok &= ref[r].r == DDP_OK && ref[r].count == ref[0].count && ref[0].count > 0 &&
                                          !memcmp(ref[r].p, ref[0].p, sizeof ref[0].p) && ref[r].step == ref[0].step;
    for (l = 0; l < 3; l++) {
        int same = ref_ok, ok = 1, local = 1, saved = 0;
        if (levels[l] == DDP_SHARD_PARAMETERS && (backend == DDP_BACKEND_NCCL || group || staged)) continue;   /* refused: test_refusals, test_hybrid */
        saved = world > 1 && levels[l] != DDP_SHARD_OPTIMIZER && !group && !staged;
        snprintf(path, sizeof path, "/tmp/ddp_shard_join_%d.ckpt", (int)getpid());
        cfg.ckpt = saved ? path : NULL;
        run(levels[l]);
        for (r = 0; r < world; r++) {
            ok &= res[r].r == DDP_OK;
            local &= res[r].local_ok;
            same &= res[r].count == ref[0].count && !memcmp(res[r].p, ref[0].p, sizeof ref[0].p) &&
                    !memcmp(res[r].m, ref[0].m, sizeof ref[0].m) && !memcmp(res[r].v, ref[0].v, sizeof ref[0].v) &&
                    res[r].step == ref[0].step;
        }
        snprintf(name, sizeof name, "shard_join_%s_%s_%s_%s_by_%s%s%s_%d_ranks", backend == DDP_BACKEND_NCCL ? "nccl_fake" : "cpu",
                 level_name(levels[l]), bf16 ? "bf16" : "fp32", accum > 1 ? "accum" : "plain",
                 mode == DDP_JOIN_DIVIDE_BY_ACTIVE ? "active" : "world", nan ? "_nan_skipped" : "",
                 group ? "_hybrid_groups_of_2" : staged ? "_staged" : "", world);
        verdict(ok && same && local, name, "results ok %d (%s), every rank's gathered parameters, m, v and step = the unsharded "
                "run's %d (reference ok %d, step %lld vs %lld), own parameters = gathered %d", ok,
                res[0].err[0] ? res[0].err : res[world - 1].err, same, ref_ok, (long long)res[0].step, (long long)ref[0].step, local);
        if (saved) {
            int loaded = ok && load_unsharded(path, why, sizeof why);
            snprintf(name, sizeof name, "shard_join_%s_%s_%d_ranks_checkpoint_loads_unsharded", backend == DDP_BACKEND_NCCL ? "nccl_fake" : "cpu",
                     level_name(levels[l]), world);
            verdict(loaded, name, "%s", ok ? why : "the sharded run failed");
            remove(path);
        }
    }
}

/* The root's ddp_adamw_step fails before its exchanges (a negative lr): the joined rank's
   ddp_join fails too, naming the root, instead of waiting for the step's exchanges. */
static void bad_options_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    int id;
    memset(&opt, 0, sizeof opt);
    opt.lr = -1;
    d.backend = DDP_BACKEND_CPU;
    d.shard = DDP_SHARD_OPTIMIZER;
    d.uneven_inputs = DDP_JOIN_DIVIDE_BY_WORLD;
    if ((self->result = ddp_init(&ctx, &d)) == DDP_OK &&
        (self->result = ddp_register_param(ctx, "p", 3000, 0, init[0], &id)) == DDP_OK && (self->result = ddp_commit(ctx)) == DDP_OK) {
        if (self->rank == 0) self->result = ddp_join(ctx);
        else {
            ddp_zero_grad(ctx);
            if ((self->result = ddp_grad_ready(ctx, id)) == DDP_OK && (self->result = ddp_finish(ctx)) == DDP_OK)
                self->result = ddp_adamw_step(ctx, &opt, NULL);
        }
    }
    snprintf(self->error, sizeof self->error, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void test_bad_options(void) {
    void *shared[1] = { (void *)bad_options_rank };
    test_rank ranks[2];
    test_run_ranks(2, shared, ranks);
    verdict(ranks[1].result == DDP_ERR_INVALID_ARGUMENT && strstr(ranks[1].error, "lr=-1") &&
            ranks[0].result == DDP_ERR_INVALID_STATE && strstr(ranks[0].error, "ddp_adamw_step of rank 1"),
            "shard_join_root_step_failure_named_on_the_joined_rank", "rank 0: %s: %s | rank 1: %s: %s", ddp_result_string(ranks[0].result),
            ranks[0].error, ddp_result_string(ranks[1].result), ranks[1].error);
}

/* What stays refused, by name. */
static void refusal_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    d.backend = cfg.backend;
    d.shard = cfg.level;
    d.shard_accumulate = cfg.accum;
    d.uneven_inputs = DDP_JOIN_DIVIDE_BY_WORLD;
    if (cfg.group) { d.outer.mode = DDP_OUTER_DILOCO; d.outer.group_size = cfg.group; d.outer.inner_steps = 2; }
    self->result = ddp_init(&ctx, &d);
    snprintf(self->error, sizeof self->error, "%s", ddp_last_error(ctx));
    ddp_shutdown(ctx);
}

static void test_refusals(void) {
    void *shared[1] = { (void *)refusal_rank };
    test_rank ranks[2];
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = DDP_BACKEND_NCCL; cfg.level = DDP_SHARD_PARAMETERS;
    fakegpu_reset();
    test_run_ranks(2, shared, ranks);
    verdict(ranks[0].result == DDP_ERR_INVALID_ARGUMENT && strstr(ranks[0].error, "DDP_SHARD_PARAMETERS with uneven_inputs") &&
            strstr(ranks[0].error, "nccl") && strstr(ranks[0].error, "gather is a collective"),
            "shard_join_nccl_zero3_refused_by_name", "%s: %s", ddp_result_string(ranks[0].result), ranks[0].error);
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = DDP_BACKEND_CPU; cfg.level = DDP_SHARD_GRADIENTS; cfg.accum = 1;
    test_run_ranks(2, shared, ranks);
    verdict(ranks[0].result == DDP_ERR_INVALID_ARGUMENT && strstr(ranks[0].error, "shard_accumulate 1 cannot be combined with uneven_inputs"),
            "shard_join_shard_accumulate_refused_by_name", "%s: %s", ddp_result_string(ranks[0].result), ranks[0].error);
    /* replica groups (desc.outer): refused with uneven inputs at every level, sharded or not */
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = DDP_BACKEND_CPU; cfg.level = DDP_SHARD_OPTIMIZER; cfg.group = 1;
    test_run_ranks(2, shared, ranks);
    verdict(ranks[0].result == DDP_ERR_INVALID_ARGUMENT && strstr(ranks[0].error, "replica groups") && strstr(ranks[0].error, "uneven_inputs"),
            "shard_join_replica_groups_refused_by_name", "%s: %s", ddp_result_string(ranks[0].result), ranks[0].error);
}

int main(void) {
    /* micro-batches per rank: the lowest rank joins first (the options come from rank 1), ranks join one by one */
    static const int plain[MAX_WORLD] = { 2, 5, 4, 3 }, accum[MAX_WORLD] = { 3, 8, 5, 6 }, one[MAX_WORLD] = { 4, 0, 0, 0 };
    int world, b, id;
    size_t i;
    for (id = 0; id < NP; id++)
        for (i = 0; i < sizes[id]; i++) init[id][i] = 0.5f * test_value((uint64_t)(70 + id), i);
    test_case(DDP_BACKEND_CPU, 1, 0, 0, DDP_JOIN_DIVIDE_BY_WORLD, 1, 0, one);
    for (b = 0; b < 2; b++)
        for (world = 2; world <= MAX_WORLD; world++) {
            ddp_backend be = b ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU;
            test_case(be, world, 0, 0, DDP_JOIN_DIVIDE_BY_WORLD, 1, 0, plain);
            test_case(be, world, 0, 1, DDP_JOIN_DIVIDE_BY_ACTIVE, 2, 1, accum);
        }
    /* hybrid sharding (shard_group 2 of 4 ranks): the parts within each group, the options world-wide */
    test_case(DDP_BACKEND_CPU, 4, 2, 0, DDP_JOIN_DIVIDE_BY_WORLD, 1, 0, plain);
    test_case(DDP_BACKEND_CPU, 4, 2, 1, DDP_JOIN_DIVIDE_BY_ACTIVE, 2, 1, accum);
    /* the CPU backend without its segment (staging slots): the parts travel by broadcast */
    setenv("DDP_STAGED_GRADS", "1", 1);
    staged = 1;
    test_case(DDP_BACKEND_CPU, 3, 0, 0, DDP_JOIN_DIVIDE_BY_WORLD, 1, 0, plain);
    test_case(DDP_BACKEND_CPU, 3, 0, 1, DDP_JOIN_DIVIDE_BY_ACTIVE, 2, 1, accum);
    staged = 0;
    unsetenv("DDP_STAGED_GRADS");
    test_bad_options();
    test_refusals();
    return test_summary("test_shard_join");
}
