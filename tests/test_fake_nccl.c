/* test_fake_nccl.c — ddp.h's NCCL backend RUN without a GPU: the implementation compiled by the
   C compiler with -DDDP_CUDA against tests/fakegpu (a host emulation of the CUDA runtime and of
   NCCL, ranks as threads of one process; see tests/fakegpu/fakegpu.h for what it emulates and
   what it does not). It proves the backend's host logic: set-up, buckets, the order of
   enqueues, the AdamW launches and their arguments, user collectives, host copies, stats,
   non-finite gradients, the watchdog, timeouts, aborts and shutdown. It proves nothing about
   the CUDA kernels on a GPU or about real NCCL.
   Checks:
   - training the MLP of tests/test_equivalence.c (tests/support/equivalence_model.h) on 1, 2
     and 3 thread-ranks on the NCCL backend ends with the same bits as the same training on the
     CPU backend (single for 1 rank), with accumulation, bf16 buckets, clipping and the norm read
     back on some steps; with NCCL's pre-multiplied ncclAvg, the same bits on 2 ranks and a
     stated bound on 3;
   - replica groups (desc.outer): groups of one rank, and 4 ranks in 2 groups of 2 (the buckets on
     a second communicator over the group's ranks, the exchange on the world's), DiLoCo and
     streaming, fp32 and bf16 buckets: every rank ends with the CPU backend's bits; a rank of one
     group that aborts fails every rank, the other group's too, by name; a group's communicator
     whose set-up never finishes is named with the group's ranks;
   - hybrid sharding (shard_group; 4 ranks in groups of 2, 6 in groups of 2 and of 3): the
     group's reduce-scatter and the part's allreduce across the groups on a third communicator:
     every step's averaged parts within a derived bound of the exact average, the same bits on
     every rank, the parameters near unsharded training's, exactly the parts' bytes across the
     groups and none on the world's communicator, both collectives on the timeline, fp32 and
     bf16 on the wire, bf16 parameters, clipping, accumulation; a failing cross-group
     communicator named;
   - user collectives on device and host buffers, host copies of every flat buffer, step stats;
   - non-finite gradients, named by the step with grad_norm_out, reported by the next without;
   - faults: an asynchronous NCCL error on one rank, a rank that aborts its communicator, a rank
     that stops, a GPU that stops (events never complete) — every rank fails with a named error
     within seconds, nothing hangs, shutdown is fast; set-up that completes late, that never
     completes (the timeout names the ranks), two ranks on one GPU;
   - the device address-space layer (ddp.h's >>nccl-vm) through the fake driver: holder counts,
     bytes, a failed map that changes nothing, a driver without virtual memory management named;
   - ZeRO-2 (DDP_SHARD_GRADIENTS) on 1-4 ranks: the same norms and parameters as unsharded, bit
     for bit (accumulation, an unused parameter, the bf16 wire, bf16 parameters, hybrid groups,
     DiLoCo groups), the device bytes after each step by formula from the parts and the
     granularity, checkpoints across levels, ddp_zero_grad on a full device named;
   - ZeRO-2's shard_accumulate on 1-4 ranks, 2-3 micro-steps: every step's norm and the
     parameters the CPU backend's shard_accumulate bits (fp32, the bf16 wire, bf16 parameters on
     bf16 and fp32 wires, an unused parameter, a NaN micro-step skipped, the tape); between
     micro-steps only the granules touching this rank's parts mapped (by formula), all zeros;
     ddp_set_sync maps the rest back (not after a tape's backward: ddp_backward does), on a full
     device named with nothing changed, then retried;
   - sharded parameters (ZeRO-3, DDP_SHARD_PARAMETERS): a model of three layers and a head, a
     unit each, on 1-4 ranks with the tape and with its own autograd, accumulation, bf16
     parameters, clipping, an unused parameter: every step's norm and the parameters the same bits
     as unsharded; ddp_param never moves; a gathered unit's granules all device memory, a released
     one's exactly those holding this rank's parts; a copy from released memory counted as misuse
     by the fake; >>zero3's misuse checks named; a checkpoint saved at PARAMETERS loads unsharded;
     within shard groups (4 ranks in groups of 2, 6 in groups of 3 and of 2) the norms and
     parameters of hybrid ZeRO-1 with the same groups, bit for bit; in DiLoCo replica groups of
     one rank those of unsharded, nothing released; in groups of several, refused by name;
   - the fake saw no misuse of the CUDA or NCCL API (wrong pointers, devices, destroyed handles)
     and nothing leaked (communicators, events, device memory). */
#include "testlib.h"
#include "support/equivalence_model.h"   /* test_equivalence.c's model, data and CPU ops */
#include "fakegpu/fakegpu.h"

#define MAX_WORLD 6   /* hybrid sharding: 6 ranks in groups of 2 and of 3 */

typedef struct result {
    ddp_result r, shut;
    int fail_step;
    char err[DDP__ERR_MAX];
    char logged[DDP__ERR_MAX];     /* the last error ddp.h logged for this rank (ddp_shutdown's own) */
    float *params;
    size_t count;
    uint64_t hash;
    int same_as_rank0;
    ddp_step_stats st;
    int buckets;
    double t_fail, t_shutdown;
} result;

/* What a training run does; set before the ranks start. */
static struct {
    ddp_backend backend;
    int micro, bf16, norm_every, steps;
    int shard;                     /* ddp_desc.shard_optimizer */
    double timeout_s;
    int abort_rank, abort_step;    /* that rank aborts its communicator before that step */
    int cancel_rank, cancel_step;  /* that rank calls ddp_cancel before that step */
    int hold_rank, hold_step;      /* that rank's GPU stops before that step */
    int stop_rank, stop_step;      /* that rank stops stepping (sleeps) at that step */
    int stop_fails;                /* ... after its communicator got an asynchronous error */
    int inject_comm_ms;
    int slow_shutdown_rank;        /* that rank's GPU events complete 0.4 s late from ddp_shutdown on */
    const char *timeline;          /* ddp_desc.timeline_path */
    int step_sleep_ms;             /* the host sleeps after each step (a host slower than its GPU) */
    ddp_outer outer;               /* ddp_desc.outer (replicas may differ at the end: streaming) */
    const char *save_path;         /* ddp_save there after step save_step - 1 */
    int save_step;
    const char *load_path;         /* ddp_load before the steps, which then begin at first_step */
    int first_step;
} cfg;
static result res[MAX_WORLD];

static double t_start;

/* ddp_shutdown frees the context: a failure there reaches the program only through the log. */
static void keep_errors(void *user, ddp_log_level level, int rank, const char *msg) {
    (void)user;
    if (level >= DDP_LOG_ERROR && rank >= 0 && rank < MAX_WORLD)
        snprintf(res[rank].logged, sizeof res[rank].logged, "%s", msg);
}

static void reset_cfg(void) {
    int r;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = DDP_BACKEND_NCCL;
    cfg.micro = 1;
    cfg.steps = STEPS;
    cfg.abort_rank = cfg.hold_rank = cfg.stop_rank = cfg.slow_shutdown_rank = cfg.cancel_rank = -1;
    for (r = 0; r < MAX_WORLD; r++) { free(res[r].params); memset(&res[r], 0, sizeof res[r]); }
}

static void train_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_desc d = test_desc(self);
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    ddp_context *ctx = NULL;
    mlp *m = (mlp *)calloc(1, sizeof *m);
    int step, n = GLOBAL_BATCH / self->world;
    double t0;
    d.backend = cfg.backend;
    d.bucket_cap_mb = 0.004;   /* several buckets for this small model */
    d.first_bucket_mb = 0.001;
    d.reduce_dtype = cfg.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.shard_optimizer = cfg.shard;
    d.outer = cfg.outer;
    d.inject_comm_latency_ms = cfg.inject_comm_ms;
    if (cfg.timeline) d.timeline_path = cfg.timeline;
    if (cfg.timeout_s > 0) d.timeout_s = cfg.timeout_s;
    out->fail_step = -1;
    out->r = ddp_init(&ctx, &d);
    if (out->r == DDP_OK) out->r = mlp_init(m, ctx);
    if (out->r == DDP_OK && cfg.load_path) out->r = ddp_load(ctx, cfg.load_path, NULL, 0, NULL, NULL, NULL);
    for (step = cfg.first_step; out->r == DDP_OK && step < cfg.steps; step++) {
        float norm = 0;
        if (self->rank == cfg.hold_rank && step == cfg.hold_step) fakegpu_hold_device(ctx->impl.gpu->device, 1);
        if (self->rank == cfg.abort_rank && step == cfg.abort_step) ddp__gpu_abort(ctx);   /* as the watchdog does */
        if (self->rank == cfg.cancel_rank && step == cfg.cancel_step) ddp_cancel(ctx);
        if (self->rank == cfg.stop_rank && step == cfg.stop_step) {
            if (cfg.stop_fails) fakegpu_inject_async_error(self->rank, -1, ncclSystemError);
            while (!ddp__failed(ctx)) usleep(1000);   /* a rank that hangs: until its peers give up */
            out->r = ddp__failed(ctx);
            break;
        }
        out->r = mlp_step_norm(m, step, self->rank * n, n, cfg.micro, cfg.norm_every && step % cfg.norm_every == 0 ? &norm : NULL);
        if (out->r != DDP_OK) out->fail_step = step;
        if (out->r == DDP_OK && cfg.save_path && step + 1 == cfg.save_step) out->r = ddp_save(ctx, cfg.save_path, NULL, 0);
        if (cfg.step_sleep_ms) usleep(1000 * cfg.step_sleep_ms);
    }
    out->t_fail = ddp__now() - t_start;
    if (out->r == DDP_OK) {
        ddp_flat_params(ctx, &out->count);
        out->params = (float *)malloc(out->count * sizeof(float));
        out->r = ddp_copy_to_host(ctx, DDP_PARAMS, 0, out->params, out->count);
        out->hash = test_hash(out->params, out->count * sizeof(float));
        if (out->r == DDP_OK && self->world > 1) {   /* a host-buffer broadcast and allreduce */
            uint64_t rank0 = out->hash;
            float differ;
            out->r = ddp_broadcast(ctx, &rank0, sizeof rank0, 0);
            differ = (float)(rank0 != out->hash);
            if (out->r == DDP_OK) out->r = ddp_allreduce(ctx, &differ, 1, DDP_SUM);
            out->same_as_rank0 = differ == 0;
        } else out->same_as_rank0 = 1;
        out->st = ddp_last_step_stats(ctx);
        out->buckets = ddp_num_buckets(ctx);
    }
    snprintf(out->err, sizeof out->err, "%s", ddp_last_error(ctx));
    if (self->rank == cfg.slow_shutdown_rank && ctx && ctx->be && ctx->be->id == DDP_BACKEND_NCCL) fakegpu_set_event_delay(ctx->impl.gpu->device, 0.4);
    t0 = ddp__now();
    out->shut = ddp_shutdown(ctx);
    out->t_shutdown = ddp__now() - t0;
    free(m);
}

static void run(int world, test_rank_fn fn) {
    void *shared[1];
    test_rank ranks[MAX_WORLD];
    shared[0] = (void *)fn;
    t_start = ddp__now();
    test_run_ranks(world, shared, ranks);
}

/* After every scenario: no misuse seen by the fake, nothing left behind. */
static void check_clean(const char *scenario) {
    char name[256];
    snprintf(name, sizeof name, "fake_%s_no_cuda_or_nccl_misuse", scenario);
    verdict(fakegpu_misuse_count() == 0, name, "%d misuse(s), first: %s", fakegpu_misuse_count(), fakegpu_misuse_first());
    snprintf(name, sizeof name, "fake_%s_nothing_leaked", scenario);
    verdict(fakegpu_live_comms() == 0 && fakegpu_live_events() == 0 && fakegpu_live_device_bytes() == 0, name,
            "%d communicator(s), %d event(s), %zu bytes of device memory left", fakegpu_live_comms(), fakegpu_live_events(),
            fakegpu_live_device_bytes());
}

/* ---- (a) training: NCCL backend == CPU backend, bit for bit ---- */
static int train(int world, ddp_backend backend, float **params, size_t *count, char *why, size_t cap) {
    int r, ok = 1;
    cfg.backend = backend;
    run(world, train_rank);
    for (r = 0; r < world; r++) {
        if (res[r].r != DDP_OK || res[r].shut != DDP_OK) {
            snprintf(why, cap, "rank %d: %s; ddp_shutdown %s%s%.400s", r, res[r].err, ddp_result_string(res[r].shut),
                     res[r].logged[0] ? ": " : "", res[r].logged);
            return 0;
        }
        if (!res[r].same_as_rank0 && cfg.outer.mode != DDP_OUTER_STREAMING) {   /* streaming: the groups differ between syncs */ snprintf(why, cap, "rank %d's parameters differ from rank 0's", r); ok = 0; }
    }
    *params = res[0].params;
    *count = res[0].count;
    res[0].params = NULL;
    return ok;
}

static void test_training_shard(int world, int micro, int bf16, int norm_every, int premul, int shard) {
    float *gpu = NULL, *cpu = NULL;
    size_t ng = 0, nc = 0, i, differ = 0;
    double worst = 0, tol_abs = 2e-6, tol_rel = 2e-5;
    char name[160], why[DDP__ERR_MAX + 64];
    ddp_step_stats st;
    int ok, buckets;
    fakegpu_reset();
    fakegpu_set_avg_premul(premul);
    reset_cfg();
    cfg.micro = micro; cfg.bf16 = bf16; cfg.norm_every = norm_every; cfg.shard = shard;
    snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s%s%s%s_trains", world, micro, bf16 ? "_bf16" : "",
             norm_every ? "_norm" : "", premul ? "_premul" : "", shard ? "_sharded" : "");
    why[0] = 0;
    ok = train(world, DDP_BACKEND_NCCL, &gpu, &ng, why, sizeof why);
    st = res[0].st;
    buckets = res[0].buckets;
    verdict(ok, name, "%s", why);
    if (!ok) { free(gpu); return; }
    reset_cfg();
    cfg.micro = micro; cfg.bf16 = bf16; cfg.norm_every = norm_every;
    if (!train(world, DDP_BACKEND_CPU, &cpu, &nc, why, sizeof why) || nc != ng) {
        verdict(0, name, "the CPU reference failed: %s", why);
        free(gpu); free(cpu);
        return;
    }
    for (i = 0; i < ng; i++) {
        double err = fabs((double)gpu[i] - cpu[i]), tol = tol_abs + tol_rel * fabs(cpu[i]);
        differ += memcmp(&gpu[i], &cpu[i], sizeof(float)) != 0;
        if (err / tol > worst) worst = err / tol;
    }
    if (premul && world > 2) {   /* x/3 rounded per rank, then summed: not the CPU's (sum)/3 */
        snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s_premul_avg_within_bound_of_cpu", world, micro, bf16 ? "_bf16" : "");
        verdict(worst <= 1, name, "worst %.3f of |err| <= %g + %g*|ref|", worst, tol_abs, tol_rel);
        printf("  (%s: %zu of %zu parameters differ from the CPU backend's; worst %.3f of the tolerance)\n", name, differ, ng, worst);
    } else {
        snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s%s%s%s_bitwise_equals_cpu_backend", world, micro, bf16 ? "_bf16" : "",
                 norm_every ? "_norm" : "", premul ? "_premul" : "", shard ? "_sharded" : "");
        verdict(differ == 0, name, "%zu of %zu parameters differ (worst %.3f of |err| <= %g + %g*|ref|)", differ, ng, worst,
                tol_abs, tol_rel);
    }
    snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s_stats", world, micro, bf16 ? "_bf16" : "");
    verdict(st.step == (int64_t)STEPS * micro && st.buckets_launched == buckets && buckets > 2 &&
            st.slowest_rank == -1 && st.straggler_wait_ms == 0, name,   /* NCCL cannot tell who arrived last */
            "step %lld (want %d), %d of %d buckets, slowest_rank %d", (long long)st.step, STEPS * micro, st.buckets_launched,
            buckets, st.slowest_rank);
    free(gpu);
    free(cpu);
    snprintf(name, sizeof name, "train_ranks%d_accum%d%s%s", world, micro, bf16 ? "_bf16" : "", shard ? "_sharded" : "");
    check_clean(name);
}

static void test_training(int world, int micro, int bf16, int norm_every, int premul) {
    test_training_shard(world, micro, bf16, norm_every, premul, 0);
}

/* ---- replica groups and their outer sync (>>outer). Groups of one rank: the NCCL backend's
   buckets move nothing; groups of several ranks: the buckets are averaged on the group's own
   communicator (ncclAvg over the group's ranks), while the exchange goes over the world's. Either
   way the exchange stages the parameters through host memory, and every rank's parameters are
   the CPU backend's bits (DiLoCo with 30 steps, H = 5: the replicas are equal at the end;
   streaming with a delayed, mixed fragment: they differ, each rank as on the CPU). A bucket
   averaged over the world instead of the group, or a group's ranks apart, would show. ---- */
static void test_training_outer(int world, int group, ddp_outer_mode mode, ddp_outer_wire wire, int fragments, int delay, float mix,
                                int bf16) {
    uint64_t hash[MAX_WORLD];
    float *gpu = NULL, *cpu = NULL;
    size_t n = 0;
    char name[160], why[DDP__ERR_MAX + 64], size[32] = "";
    int r, ok, differ = 0, apart = 0;
    ddp_outer o;
    memset(&o, 0, sizeof o);
    o.mode = mode; o.group_size = group; o.inner_steps = 5; o.wire = wire; o.fragments = fragments; o.delay_steps = delay; o.mix = mix;
    if (group > 1) snprintf(size, sizeof size, "_groups_of%d", group);
    snprintf(name, sizeof name, "fake_nccl_ranks%d%s_outer_mode%d_wire%d_f%d_delay%d%s_equals_cpu_backend", world, size, (int)mode,
             (int)wire, fragments, delay, bf16 ? "_bf16" : "");
    fakegpu_reset();
    reset_cfg();
    cfg.outer = o; cfg.bf16 = bf16;
    why[0] = 0;
    ok = train(world, DDP_BACKEND_NCCL, &gpu, &n, why, sizeof why);
    for (r = 0; r < world; r++) hash[r] = res[r].hash;
    if (!ok) { verdict(0, name, "%s", why); free(gpu); return; }
    reset_cfg();
    cfg.outer = o; cfg.bf16 = bf16;
    if (!train(world, DDP_BACKEND_CPU, &cpu, &n, why, sizeof why)) { verdict(0, name, "the CPU reference failed: %s", why); free(gpu); free(cpu); return; }
    for (r = 0; r < world; r++) differ += hash[r] != res[r].hash;
    for (r = 0; r < world; r++) apart += hash[r] != hash[r - r % group];   /* a group's ranks hold one replica */
    verdict(differ == 0 && apart == 0, name, "%d of %d ranks' parameters differ from the CPU backend's, %d from their group's "
            "first rank's", differ, world, apart);
    free(gpu);
    free(cpu);
    check_clean("outer");
}

/* The outer sync's checkpoint on the NCCL backend (parameters and moments in device memory):
   k steps, ddp_save, a new run, ddp_load, the rest, ends on every rank with the bits of a run
   that never stopped (streaming: a fragment in flight at the save). */
static void test_outer_resume(int world, ddp_outer_mode mode, ddp_outer_wire wire, int fragments, int delay, float mix, int k) {
    uint64_t hash[MAX_WORLD];
    char name[160], why[DDP__ERR_MAX + 64], path[64];
    int r, phase, ok = 1;
    ddp_outer o;
    memset(&o, 0, sizeof o);
    o.mode = mode; o.group_size = 1; o.inner_steps = 5; o.wire = wire; o.fragments = fragments; o.delay_steps = delay; o.mix = mix;
    snprintf(name, sizeof name, "fake_nccl_ranks%d_outer_mode%d_f%d_delay%d_saved_at_%d_resumes_bit_for_bit", world, (int)mode,
             fragments, delay, k);
    snprintf(path, sizeof path, "/tmp/ddp_fake_outer_ckpt.%d", (int)getpid());
    why[0] = 0;
    fakegpu_reset();
    for (phase = 0; phase < 3 && ok; phase++) {   /* straight; k steps and save; load and the rest */
        reset_cfg();
        cfg.outer = o;
        if (phase == 1) { cfg.steps = k; cfg.save_path = path; cfg.save_step = k; }
        if (phase == 2) { cfg.load_path = path; cfg.first_step = k; }
        run(world, train_rank);
        for (r = 0; r < world && ok; r++) {
            if (res[r].r != DDP_OK || res[r].shut != DDP_OK) {
                snprintf(why, sizeof why, "run %d, rank %d: %s", phase, r, res[r].err);
                ok = 0;
            } else if (phase == 0) hash[r] = res[r].hash;
            else if (phase == 2 && hash[r] != res[r].hash) {
                snprintf(why, sizeof why, "rank %d's parameters differ from the run that never stopped", r);
                ok = 0;
            }
        }
    }
    remove(path);
    verdict(ok, name, "%s", why);
    check_clean("outer_resume");
}

/* ---- sharded AdamW (shard_optimizer) on parameters large enough that every rank holds a part
   of most buckets (the MLP above is so small that the last rank holds every bucket: the
   reduce-and-broadcast tail path): NCCL sharded == CPU unsharded, bit for bit, every step's norm,
   the parameters, and m and v gathered to rank 0 ---- */
enum { SH_PARAMS = 5, SH_STEPS = 6, SH_MAX = 9000 };
static const size_t sh_sizes[SH_PARAMS] = { 9000, 50, 6000, 3000, 700 };

/* The sharding scenarios' parameters p0..p4 (sh_sizes; the odd ones without weight decay), their
   initial values in `init` (the same on every rank; ddp_commit reads them). */
static ddp_result sh_register(ddp_context *ctx, float init[SH_PARAMS][SH_MAX], int *ids) {
    ddp_result r = DDP_OK;
    int k;
    for (k = 0; k < SH_PARAMS && r == DDP_OK; k++) {
        char name[16];
        size_t i;
        for (i = 0; i < sh_sizes[k]; i++) init[k][i] = 0.5f * test_value(77 + (uint64_t)k, i);
        snprintf(name, sizeof name, "p%d", k);
        r = ddp_register_param(ctx, name, sh_sizes[k], k % 2 ? DDP_NO_DECAY : 0, init[k], &ids[k]);
    }
    return r;
}
static struct { float norm[MAX_WORLD][SH_STEPS]; float *params[MAX_WORLD], *m, *v; size_t count; ddp_result r[MAX_WORLD];
                char err[MAX_WORLD][DDP__ERR_MAX]; } sh;

static void shard_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    ddp_result r;
    int ids[SH_PARAMS], k, step, u;
    static float init[MAX_WORLD][SH_PARAMS][SH_MAX];   /* one each: ddp_commit reads them */
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f;
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;   /* ddp_shutdown's own failure, into res[].logged */
    d.backend = cfg.backend;
    d.shard_optimizer = cfg.shard;
    d.reduce_dtype = cfg.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.bucket_cap_mb = 0.05;
    d.first_bucket_mb = 0.01;
    r = ddp_init(&ctx, &d);
    if (r == DDP_OK) r = sh_register(ctx, init[self->rank], ids);
    if (r == DDP_OK) r = ddp_commit(ctx);
    for (step = 0; step < SH_STEPS && r == DDP_OK; step++) {
        r = ddp_zero_grad(ctx);
        for (u = 0; u < cfg.micro && r == DDP_OK; u++) {
            ddp_set_sync(ctx, u == cfg.micro - 1);
            for (k = SH_PARAMS - 1; k >= 0 && r == DDP_OK; k--) {
                const float *p = ddp_param(ctx, ids[k]);   /* device memory is host memory here */
                float *g = ddp_grad(ctx, ids[k]), scale = step % 3 == 0 ? 0.01f : 1.0f;
                size_t i;
                for (i = 0; i < sh_sizes[k]; i++)
                    g[i] += scale * tanhf(1.7f * p[i] + test_value(1000 * (uint64_t)step + 10 * (uint64_t)u + 100000 * (uint64_t)self->rank,
                                                                   (uint64_t)k * 100000 + i));
                r = ddp_grad_ready(ctx, ids[k]);
            }
            if (r == DDP_OK) r = ddp_finish(ctx);
        }
        if (r == DDP_OK) r = ddp_adamw_step(ctx, &opt, &sh.norm[self->rank][step]);
    }
    if (r == DDP_OK) {
        size_t n;
        ddp_flat_params(ctx, &n);
        sh.params[self->rank] = (float *)malloc(n * sizeof(float));
        r = ddp_copy_to_host(ctx, DDP_PARAMS, 0, sh.params[self->rank], n);
        if (self->rank == 0) { sh.count = n; sh.m = (float *)malloc(n * sizeof(float)); sh.v = (float *)malloc(n * sizeof(float)); }
        if (r == DDP_OK) r = ddp_gather_to_host(ctx, DDP_ADAM_M, 0, self->rank == 0 ? sh.m : NULL, n, 0);
        if (r == DDP_OK) r = ddp_gather_to_host(ctx, DDP_ADAM_V, 0, self->rank == 0 ? sh.v : NULL, n, 0);
    }
    sh.r[self->rank] = r;
    snprintf(sh.err[self->rank], sizeof sh.err[self->rank], "%s", ddp_last_error(ctx));
    if (ddp_shutdown(ctx) != DDP_OK && sh.r[self->rank] == DDP_OK) sh.r[self->rank] = DDP_ERR_BACKEND;
}

static void test_shard_parts(int world, int micro, int bf16) {
    float norm[SH_STEPS], *params = NULL, *m = NULL, *v = NULL;
    size_t count = 0;
    int pass, r, ok = 1, step;
    char name[160], why[DDP__ERR_MAX + 64];
    why[0] = 0;
    for (pass = 0; pass < 2; pass++) {   /* 0: the CPU backend unsharded, 1: NCCL sharded */
        fakegpu_reset();
        reset_cfg();
        cfg.backend = pass ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU;
        cfg.shard = pass; cfg.micro = micro; cfg.bf16 = bf16;
        memset(&sh, 0, sizeof sh);
        run(world, shard_rank);
        for (r = 0; r < world; r++) {
            if (sh.r[r] != DDP_OK && ok) {
                snprintf(why, sizeof why, "%s, rank %d: %s%s%.400s", pass ? "nccl" : "cpu", r, sh.err[r],
                         res[r].logged[0] ? "; ddp_shutdown: " : "", res[r].logged);
                ok = 0;
            }
            if (ok && r > 0 && memcmp(sh.params[r], sh.params[0], sh.count * sizeof(float))) {
                snprintf(why, sizeof why, "%s: rank %d's parameters differ from rank 0's", pass ? "nccl" : "cpu", r);
                ok = 0;
            }
        }
        if (ok && pass == 0) {
            memcpy(norm, sh.norm[0], sizeof norm);
            params = sh.params[0]; sh.params[0] = NULL;
            m = sh.m; v = sh.v; count = sh.count;
        } else if (ok) {
            for (step = 0; step < SH_STEPS && ok; step++)
                if (memcmp(&norm[step], &sh.norm[0][step], sizeof(float))) {
                    snprintf(why, sizeof why, "step %d: norm %.9g sharded on NCCL, %.9g on the CPU", step, sh.norm[0][step], norm[step]);
                    ok = 0;
                }
            if (ok && (sh.count != count || memcmp(params, sh.params[0], count * sizeof(float)))) { snprintf(why, sizeof why, "parameters differ"); ok = 0; }
            if (ok && (memcmp(m, sh.m, count * sizeof(float)) || memcmp(v, sh.v, count * sizeof(float)))) { snprintf(why, sizeof why, "m or v differ"); ok = 0; }
        }
        for (r = 0; r < world; r++) free(sh.params[r]);
        if (pass) { free(sh.m); free(sh.v); }
    }
    snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s_sharded_parts_norm_params_m_v_bitwise_equal_cpu_unsharded", world, micro,
             bf16 ? "_bf16" : "");
    verdict(ok, name, "%s", why);
    free(params); free(m); free(v);
    snprintf(name, sizeof name, "shard_parts_ranks%d_accum%d%s", world, micro, bf16 ? "_bf16" : "");
    check_clean(name);
}

/* ---- hybrid sharding (desc.shard_group = S): each bucket reduce-scattered (ncclSum) within the
   shard group, this rank's part allreduced (ncclSum) across the groups on a third communicator
   (the holders of the part: ranks s, s + S, ...), times 1/world. The sum's order is hierarchical
   (the group's, then the groups'), not the world's rank order, so the bits are not unsharded's:
   - every step, every rank's averaged part against the exact average (in double) of the
     gradients every rank wrote (the test recomputes them all: the parameters are the same on
     every rank). Each rank's value x_r enters exactly (fp32) or as the bf16 value the wire
     carries; any summation tree of W values rounds at most W - 1 times, each by at most u times
     the sum of magnitudes M (u = 2^-24 fp32; 2^-8 where a sum is rounded to bf16, + 2^-24 for
     the float sums in between), and the product by 1/W (rounded) adds two more roundings of the
     result: |avg - exact| <= (W - 1) (u_sum) M / W + 3 u |exact| (bf16 results: 2^-7 |exact|);
     a part summed within one group only, or twice, is off by the gradients' own size;
   - every holder of a part has the same bits, and every rank the same parameters;
   - the parameters against unsharded training on the CPU backend: two AdamW runs whose
     gradients differ move each parameter by at most lr (1 - b1) / sqrt(1 - b2) + lr wd |p| a
     step (Kingma and Ba 2.1; |p| < 1 here), so they lie within twice n of those of each other
     (bf16 parameters: plus one rounding of the working copy) — a sanity bound; the per-step
     gradient check above is the one that catches a wrong reduction;
   - the bytes: the cross-group communicator carries exactly each bucket's part a synchronizing
     step (count x the wire's element), and the world's communicator nothing during the steps
     (before, every bucket went whole over the world);
   - with a timeline, the comm lane holds both collectives of every bucket;
   fp32 on the wire and in the parameters, the parameters must also lie within 1e-5 of
   unsharded's (the averages differ by a few ulps; seen here: ~1e-7). ---- */
static struct {
    int S, micro, wire_bf16, param_bf16, timeline;
    int inject_rank, inject_step;          /* that rank's cross-group communicator fails before that step */
    float *params[MAX_WORLD], *avg[MAX_WORLD];   /* the final parameters; the last step's averaged gradients (own parts) */
    float norm[MAX_WORLD][SH_STEPS];
    size_t count[MAX_WORLD];               /* the flat buffer's floats, as each rank's ddp.h says (each its own: no race) */
    char bad[MAX_WORLD][400];              /* the first gradient outside its bound, per rank */
    double worst[MAX_WORLD];               /* the largest |avg - exact| / bound seen */
    unsigned long long cross[MAX_WORLD], expect[MAX_WORLD], world_bytes[MAX_WORLD], bucket_bytes[MAX_WORLD];
    int cross_ops[MAX_WORLD], expect_ops[MAX_WORLD];
    const char *tl_path;
} hy;

static void expect_failure(const char *name, int world, double within_s, const char *const *want);

static float hy_grad(float p, int step, int u, int rank, int k, size_t j) {
    float scale = step % 3 == 0 ? 0.01f : 1.0f;
    return scale * tanhf(1.7f * p + test_value(1000 * (uint64_t)step + 10 * (uint64_t)u + 100000 * (uint64_t)rank,
                                               (uint64_t)k * 100000 + j));
}

/* Rank `self`'s averaged parts of step `step` against the exact average of every rank's gradients. */
static ddp_result hy_check(ddp_context *ctx, test_rank *self, const int *ids, int step, float *buf) {
    int W = self->world, rr, u, k, b, me = self->rank;
    double ufl = ldexp(1.0, -24), usum = hy.wire_bf16 || hy.param_bf16 ? ldexp(1.0, -8) + ufl : ufl;
    double urel = hy.param_bf16 ? ldexp(1.0, -7) : hy.wire_bf16 ? ldexp(1.0, -7) : 3 * ufl;
    size_t n = hy.count[me], i, j;
    double *exact = (double *)calloc(n, sizeof(double)), *mag = (double *)calloc(n, sizeof(double));
    ddp_result r = DDP_OK;
    if (!exact || !mag) { free(exact); free(mag); return DDP_ERR_OUT_OF_MEMORY; }
    for (k = 0; k < SH_PARAMS; k++) {
        size_t off = hy.param_bf16 ? (size_t)(ddp_param_bf16(ctx, ids[k]) - ddp_flat_params_bf16(ctx, NULL))
                                   : (size_t)(ddp_param(ctx, ids[k]) - ddp_flat_params(ctx, NULL));
        for (j = 0; j < sh_sizes[k]; j++) {
            float p = hy.param_bf16 ? ddp__from_bf16(ddp_param_bf16(ctx, ids[k])[j]) : ddp_param(ctx, ids[k])[j];
            for (rr = 0; rr < W; rr++) {
                float acc = 0;
                double x;
                for (u = 0; u < hy.micro; u++) {   /* as the rank accumulated its micro-steps */
                    if (hy.param_bf16) acc = ddp__from_bf16(ddp__to_bf16(acc + hy_grad(p, step, u, rr, k, j)));
                    else acc += hy_grad(p, step, u, rr, k, j);
                }
                x = hy.wire_bf16 && !hy.param_bf16 ? ddp__from_bf16(ddp__to_bf16(acc)) : acc;   /* what the wire carries */
                exact[off + j] += x;
                mag[off + j] += fabs(x);
            }
        }
    }
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++) {
        const ddp__wire *w = &ctx->model.buckets[b].wire;
        if (w->hi == w->lo) continue;
        if ((r = ddp_copy_to_host(ctx, DDP_GRADS, w->lo, buf + w->lo, w->hi - w->lo)) != DDP_OK) break;
        for (i = w->lo; i < w->hi; i++) {
            double e = exact[i] / W, bound = (W - 1) * usum * mag[i] / W + urel * fabs(e), d = fabs((double)buf[i] - e);
            if (bound > 0 && d / bound > hy.worst[me]) hy.worst[me] = d / bound;
            if (!(d <= bound) && !hy.bad[me][0])
                snprintf(hy.bad[me], sizeof hy.bad[me], "step %d, element %zu (bucket %d): %.9g, exact %.9g, off by %g > bound %g",
                         step, i, b, buf[i], e, d, bound);
        }
    }
    free(exact); free(mag);
    return r;
}

static void hybrid_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    ddp_result r;
    int ids[SH_PARAMS], k, step, u, me = self->rank, nccl = cfg.backend == DDP_BACKEND_NCCL;
    unsigned long long world0 = 0, cross0 = 0;
    int ops0 = 0, ops1 = 0, b;
    float *buf = NULL;
    static float init[MAX_WORLD][SH_PARAMS][SH_MAX];   /* one each: ddp_commit reads them */
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f;   /* clips the steps of scale 1 (norm ~ 70) */
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    d.backend = cfg.backend;
    d.shard_optimizer = nccl;
    d.shard_group = nccl ? hy.S : 0;
    d.reduce_dtype = hy.wire_bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.param_dtype = hy.param_bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.bucket_cap_mb = 0.05;
    d.first_bucket_mb = 0.01;
    if (hy.tl_path && nccl) d.timeline_path = hy.tl_path;
    if (cfg.timeout_s > 0) d.timeout_s = cfg.timeout_s;
    out->fail_step = -1;
    r = ddp_init(&ctx, &d);
    for (k = 0; k < SH_PARAMS && r == DDP_OK; k++) {
        char name[16];
        size_t i;
        for (i = 0; i < sh_sizes[k]; i++) init[me][k][i] = 0.5f * test_value(77 + (uint64_t)k, i);
        snprintf(name, sizeof name, "p%d", k);
        r = ddp_register_param(ctx, name, sh_sizes[k], k % 2 ? DDP_NO_DECAY : 0, init[me][k], &ids[k]);
    }
    if (r == DDP_OK) r = ddp_commit(ctx);
    if (r == DDP_OK) {
        if (hy.param_bf16) ddp_flat_params_bf16(ctx, &hy.count[me]);
        else ddp_flat_params(ctx, &hy.count[me]);
        if (!(buf = (float *)calloc(hy.count[me], sizeof(float)))) r = DDP_ERR_OUT_OF_MEMORY;
    }
    if (r == DDP_OK && nccl) {   /* what the steps alone send */
        world0 = fakegpu_comm_bytes(ctx->impl.gpu->nccl, NULL);
        cross0 = fakegpu_comm_bytes(ctx->impl.gpu->cross, &ops0);
        for (b = 0; b < ctx->model.num_buckets; b++) {
            const ddp__wire *w = &ctx->model.buckets[b].wire;
            hy.expect[me] += (unsigned long long)SH_STEPS * (w->hi - w->lo) * (w->bytes / ctx->model.buckets[b].count);
            hy.expect_ops[me] += SH_STEPS * (w->hi > w->lo);
            hy.bucket_bytes[me] += (unsigned long long)SH_STEPS * w->bytes;
        }
    }
    for (step = 0; step < SH_STEPS && r == DDP_OK; step++) {
        if (me == hy.inject_rank && step == hy.inject_step) fakegpu_inject_comm_error(ctx->impl.gpu->cross, ncclSystemError);
        r = ddp_zero_grad(ctx);
        for (u = 0; u < hy.micro && r == DDP_OK; u++) {
            ddp_set_sync(ctx, u == hy.micro - 1);
            for (k = SH_PARAMS - 1; k >= 0 && r == DDP_OK; k--) {
                size_t i;
                for (i = 0; i < sh_sizes[k]; i++) {   /* device memory is host memory here */
                    if (hy.param_bf16) {
                        ddp_bf16 *g = ddp_grad_bf16(ctx, ids[k]);
                        g[i] = ddp__to_bf16(ddp__from_bf16(g[i]) + hy_grad(ddp__from_bf16(ddp_param_bf16(ctx, ids[k])[i]), step, u, me, k, i));
                    } else ddp_grad(ctx, ids[k])[i] += hy_grad(ddp_param(ctx, ids[k])[i], step, u, me, k, i);
                }
                r = ddp_grad_ready(ctx, ids[k]);
            }
            if (r == DDP_OK) r = ddp_finish(ctx);
        }
        if (r == DDP_OK && nccl) r = hy_check(ctx, self, ids, step, buf);
        if (r == DDP_OK) r = ddp_adamw_step(ctx, &opt, &hy.norm[me][step]);
        if (r != DDP_OK) out->fail_step = step;
    }
    out->t_fail = ddp__now() - t_start;
    if (r == DDP_OK && nccl) {
        hy.world_bytes[me] = fakegpu_comm_bytes(ctx->impl.gpu->nccl, NULL) - world0;
        hy.cross[me] = fakegpu_comm_bytes(ctx->impl.gpu->cross, &ops1) - cross0;
        hy.cross_ops[me] = ops1 - ops0;
        hy.avg[me] = buf; buf = NULL;
    }
    if (r == DDP_OK) {
        hy.params[me] = (float *)malloc(hy.count[me] * sizeof(float));
        if (hy.param_bf16) {   /* the working copies the program computes with, once every rank's gathers are done */
            size_t i;
            const ddp_bf16 *wc = ddp_flat_params_bf16(ctx, NULL);
            r = ddp_gather_to_host(ctx, DDP_PARAMS, 0, hy.params[me], hy.count[me], 0);   /* (a collective: after them) */
            for (i = 0; r == DDP_OK && i < hy.count[me]; i++) hy.params[me][i] = ddp__from_bf16(wc[i]);
        } else r = ddp_copy_to_host(ctx, DDP_PARAMS, 0, hy.params[me], hy.count[me]);
    }
    out->r = r;
    snprintf(out->err, sizeof out->err, "%s", ddp_last_error(ctx));
    free(buf);
    {
        double t0 = ddp__now();
        out->shut = ddp_shutdown(ctx);
        out->t_shutdown = ddp__now() - t0;
    }
}

static void hy_reset(int S, int micro, int wire_bf16, int param_bf16) {
    int r;
    for (r = 0; r < MAX_WORLD; r++) { free(hy.params[r]); free(hy.avg[r]); }
    memset(&hy, 0, sizeof hy);
    hy.S = S; hy.micro = micro; hy.wire_bf16 = wire_bf16; hy.param_bf16 = param_bf16;
    hy.inject_rank = -1;
}

static int hy_count(const char *path, const char *what) {
    char line[1024];
    int n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

static void test_hybrid(int world, int S, int micro, int wire_bf16, int param_bf16, int timeline) {
    float *ref = NULL, ref_norm[SH_STEPS];
    char name[200], tag[96], why[DDP__ERR_MAX + 200] = "", path[64] = "";
    int r, ok = 1, step, fd = -1;
    double worst = 0, worst_ratio = 0, lr = 0.01, bound = 2.0 * SH_STEPS * (lr * (1 - 0.9) / sqrt(1 - 0.999) + lr * 0.1) +
                                                     (param_bf16 ? 1.0 / 256 : 0);
    size_t i, count = 0;
    snprintf(tag, sizeof tag, "ranks%d_groups_of%d_accum%d%s%s", world, S, micro, wire_bf16 ? "_bf16_wire" : "",
             param_bf16 ? "_bf16_params" : "");
    /* the reference: unsharded, on the CPU backend */
    fakegpu_reset(); reset_cfg(); hy_reset(S, micro, wire_bf16, param_bf16);
    cfg.backend = DDP_BACKEND_CPU;
    run(world, hybrid_rank);
    for (r = 0; r < world && ok; r++)
        if (res[r].r != DDP_OK) { ok = 0; snprintf(why, sizeof why, "the CPU reference, rank %d: %s", r, res[r].err); }
    if (ok) { ref = hy.params[0]; hy.params[0] = NULL; count = hy.count[0]; memcpy(ref_norm, hy.norm[0], sizeof ref_norm); }
    /* hybrid on the NCCL backend */
    fakegpu_reset(); reset_cfg(); hy_reset(S, micro, wire_bf16, param_bf16);
    fakegpu_set_device_count(world);   /* a GPU a rank (the fake's default is 4) */
    if (timeline) {
        snprintf(path, sizeof path, "/tmp/ddp_fake_hy_XXXXXX");
        if ((fd = mkstemp(path)) >= 0) close(fd);
        hy.tl_path = path;
    }
    if (ok) run(world, hybrid_rank);
    for (r = 0; r < world && ok; r++)
        if (res[r].r != DDP_OK || res[r].shut != DDP_OK) {
            ok = 0;
            snprintf(why, sizeof why, "rank %d: %s; ddp_shutdown %s%s%.300s", r, res[r].err, ddp_result_string(res[r].shut),
                     res[r].logged[0] ? ": " : "", res[r].logged);
        }
    snprintf(name, sizeof name, "fake_nccl_hybrid_%s_trains", tag);
    verdict(ok, name, "%s", why);
    if (!ok) { free(ref); if (path[0]) unlink(path); return; }
    /* the averages, every step, every rank */
    why[0] = 0;
    for (r = 0; r < world; r++) {
        if (hy.worst[r] > worst_ratio) worst_ratio = hy.worst[r];
        if (hy.bad[r][0] && !why[0]) snprintf(why, sizeof why, "rank %d: %s", r, hy.bad[r]);
    }
    snprintf(name, sizeof name, "fake_nccl_hybrid_%s_every_steps_averaged_parts_within_bound_of_exact", tag);
    verdict(!why[0], name, "%s", why);
    printf("  (%s: worst |avg - exact| %.3f of the bound)\n", name, worst_ratio);
    /* one part's holders: the same bits; every rank: the same parameters */
    why[0] = 0;
    for (r = world - 1; r >= 0 && !why[0]; r--) {
        int h = r % S;   /* rank h: group 0's holder of the same part */
        if (memcmp(hy.params[r], hy.params[0], count * sizeof(float))) snprintf(why, sizeof why, "rank %d's parameters differ from rank 0's", r);
        else if (r != h && memcmp(hy.avg[r], hy.avg[h], count * sizeof(float)))
            snprintf(why, sizeof why, "rank %d's averaged part differs from rank %d's (the same part)", r, h);
    }
    snprintf(name, sizeof name, "fake_nccl_hybrid_%s_same_bits_on_every_rank", tag);
    verdict(!why[0], name, "%s", why);
    for (i = 0; i < count; i++) {
        double d = fabs((double)hy.params[0][i] - ref[i]);
        if (!(d <= worst)) worst = d;
    }
    why[0] = 0;
    if (!wire_bf16 && !param_bf16 && !(worst <= 1e-5))   /* fp32: the averages differ by ulps (seen: ~1e-7 here) */
        snprintf(why, sizeof why, "fp32: a parameter differs by more than 1e-5;");
    for (step = 0; step < SH_STEPS; step++) {
        double d = fabs((double)hy.norm[0][step] - ref_norm[step]) / ref_norm[step];
        if (!(d <= (wire_bf16 || param_bf16 ? 1e-2 : 1e-5)) && !why[0])
            snprintf(why, sizeof why, "step %d: norm %.9g hybrid, %.9g unsharded", step, hy.norm[0][step], ref_norm[step]);
    }
    snprintf(name, sizeof name, "fake_nccl_hybrid_%s_params_and_norm_within_bound_of_unsharded", tag);
    verdict(worst <= bound && !why[0], name, "%s largest parameter difference %g, bound %g", why, worst, bound);
    printf("  (%s: largest parameter difference %g, bound %g)\n", name, worst, bound);
    /* the bytes across the groups: the parts */
    why[0] = 0;
    for (r = 0; r < world && !why[0]; r++)
        if (hy.cross[r] != hy.expect[r] || hy.cross_ops[r] != hy.expect_ops[r] || hy.world_bytes[r] != 0 || hy.expect[r] == 0)
            snprintf(why, sizeof why, "rank %d: %llu bytes in %d collectives across the groups (want its parts: %llu in %d; the "
                     "buckets are %llu), %llu bytes on the world's communicator during the steps (want 0)", r, hy.cross[r],
                     hy.cross_ops[r], hy.expect[r], hy.expect_ops[r], hy.bucket_bytes[r], hy.world_bytes[r]);
    snprintf(name, sizeof name, "fake_nccl_hybrid_%s_sends_its_part_across_groups_not_the_bucket", tag);
    verdict(!why[0], name, "%s", why);
    printf("  (%s: rank 0 sends %llu bytes across the groups in %d steps; its buckets are %llu)\n", name, hy.cross[0], SH_STEPS,
           hy.bucket_bytes[0]);
    if (timeline) {   /* both collectives of every bucket on the comm lane */
        int rs = hy_count(path, "(shard group)"), cr = hy_count(path, "across the shard groups");
        snprintf(name, sizeof name, "fake_nccl_hybrid_%s_timeline_shows_both_collectives", tag);
        verdict(rs > 0 && rs == cr, name, "%d reduce-scatter and %d cross-group span(s) in %s", rs, cr, path);
        unlink(path);
    }
    free(ref);
    snprintf(name, sizeof name, "hybrid_%s", tag);
    check_clean(name);
}

/* The cross-group communicator fails (an asynchronous error on rank 1's): every rank fails
   within seconds, rank 1 naming that communicator, and nothing leaks. */
static void hybrid_cross_fails(void) {
    const char *want[3] = { "stopped because rank 1|rank 1 disconnected", "cross-group", "stopped because rank 1|rank 1 disconnected" };
    fakegpu_reset(); reset_cfg(); hy_reset(2, 1, 0, 0);
    hy.inject_rank = 1; hy.inject_step = 2;
    run(4, hybrid_rank);
    expect_failure("fake_nccl_hybrid_ranks4_groups_of2_cross_group_communicator_fails_named", 4, 5, want);
    hy_reset(2, 1, 0, 0);
}

/* Rank 3's third set-up (the cross-group communicator of part 1: ranks 1 and 3) never finishes:
   those two time out naming that communicator and its ranks, ranks 0 and 2 fail by name. */
static void hybrid_cross_init_never_completes(void) {
#define HY_PEER_LOST "stopped because rank 1|stopped because rank 3|rank 1 disconnected|rank 3 disconnected"
#define HY_TIMED_OUT "in NCCL's set-up of the cross-group communicator; rank(s) never started it: none; rank(s) that did not finish it: 1, 3;"
    const char *want[3] = { HY_PEER_LOST, HY_TIMED_OUT, HY_PEER_LOST "|" HY_TIMED_OUT };   /* the last: ranks 2 and 3 */
    fakegpu_reset(); reset_cfg(); hy_reset(2, 1, 0, 0);
    fakegpu_stall_init_on(3, 2);
    cfg.timeout_s = 2;
    run(4, hybrid_rank);
    expect_failure("fake_nccl_hybrid_ranks4_groups_of2_cross_setup_never_completes_timeout_names_its_ranks", 4, 6, want);
    hy_reset(2, 1, 0, 0);
#undef HY_PEER_LOST
#undef HY_TIMED_OUT
}

/* ---- ZeRO-2 (DDP_SHARD_GRADIENTS) on the NCCL backend: the gradients a device range whose
   granules outside this rank's parts go back at the end of each ddp_adamw_step ---- */
enum { Z2_STEPS = 6 };
static struct {
    ddp_shard shard;               /* ddp_desc.shard (0: the default, unsharded) */
    int micro, wire_bf16, params_bf16, unused, group;
    int acc;                       /* ddp_desc.shard_accumulate */
    int wire_fp32;                 /* reduce_dtype FP32 (with bf16 parameters: an fp32 wire) */
    int nan_step;                  /* >0: skip_nonfinite, and rank world-1's first micro-step of that step has a NaN */
    int tape;                      /* the backward is the tape's (ddp_tape_record, ddp_backward), else by hand */
    ddp_backend backend;           /* 0: NCCL (the CPU backend: shard_accumulate's reference) */
    int acc_oom;                   /* shard_accumulate: rank 0's device is full at step 2's second
                                      micro-step's ddp_set_sync: named, nothing changes, then retried */
    int outer_group;               /* >0: DiLoCo replica groups of that many ranks (desc.outer) */
    int oom_step;                  /* >0: rank 0's device is full at that step's ddp_zero_grad: refused by name, then retried */
    size_t gran;                   /* fakegpu_set_vm_granularity (0: the default) */
    const char *save_path;         /* ddp_save after step save_step - 1 */
    int save_step;
    const char *load_path;         /* ddp_load, then steps from first_step */
    int first_step;
} z2c;
static struct {
    float *params[MAX_WORLD], norm[MAX_WORLD][Z2_STEPS];
    size_t count;
    ddp_result r[MAX_WORLD];
    char err[MAX_WORLD][DDP__ERR_MAX];
    int bytes_checks[MAX_WORLD];   /* steps whose device bytes were checked */
    size_t grad_bytes[MAX_WORLD], kept[MAX_WORLD];   /* the gradients' mapped bytes: whole, after the last step */
    int oom_named;                 /* rank 0's ddp_zero_grad on a full device was refused by name, nothing changed */
    int micro_checks[MAX_WORLD];   /* shard_accumulate: micro-steps whose device bytes were checked */
} z2;

/* Granules of `gran` bytes touching this rank's part of any bucket: what stays mapped after a step. */
static size_t z2_part_granules(ddp_context *ctx, size_t es, size_t gran, size_t total_granules) {
    unsigned char *touched = (unsigned char *)calloc(total_granules + 1, 1);
    size_t lo, hi, i, n = 0;
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (hi > lo) for (i = lo * es / gran; i <= (hi * es - 1) / gran; i++) touched[i] = 1;
    }
    for (i = 0; i < total_granules; i++) n += touched[i];
    free(touched);
    return n;
}

/* Parameter k's gradient in micro-step u of step `step`, added where the backward writes it
   (device memory is host memory here); a NaN on the last rank with nan_step; none for p1 on
   odd steps with unused (find_unused). */
static void z2_write_grad(ddp_context *ctx, int id, int k, int step, int u, int rank, int world) {
    float scale = step % 3 == 0 ? 0.01f : 1.0f;
    size_t i;
    if (z2c.unused && k == 1 && step % 2) return;
    for (i = 0; i < sh_sizes[k]; i++) {
        float p = z2c.params_bf16 ? ddp__from_bf16(ddp_param_bf16(ctx, id)[i]) : ddp_param(ctx, id)[i];
        float v = scale * tanhf(1.7f * p + test_value(1000 * (uint64_t)step + 10 * (uint64_t)u + 100000 * (uint64_t)rank,
                                                      (uint64_t)k * 100000 + i));
        if (z2c.nan_step && z2c.nan_step == step && u == 0 && rank == world - 1 && k == 0 && i == 3) v = NAN;
        if (z2c.params_bf16) {
            ddp_bf16 *g = ddp_grad_bf16(ctx, id);
            g[i] = ddp__to_bf16(ddp__from_bf16(g[i]) + v);
        } else ddp_grad(ctx, id)[i] += v;
    }
}
typedef struct z2_op { ddp_context *ctx; int id, k, step, u, rank, world; } z2_op;
static void z2_backward_op(void *p) {
    const z2_op *a = (const z2_op *)p;
    z2_write_grad(a->ctx, a->id, a->k, a->step, a->u, a->rank, a->world);
}

static void z2_rank(test_rank *self) {
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    ddp_result r;
    int ids[SH_PARAMS], k, step, u, dev = -1;
    static float init[MAX_WORLD][SH_PARAMS][SH_MAX];
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = 5.0f;   /* clips the steps of scale 1, not those of 0.01 */
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    d.backend = z2c.backend ? z2c.backend : DDP_BACKEND_NCCL;
    d.shard = z2c.shard;
    d.shard_accumulate = z2c.acc;
    d.shard_group = z2c.shard == DDP_SHARD_GRADIENTS || z2c.shard == DDP_SHARD_OPTIMIZER ? z2c.group : 0;
    d.reduce_dtype = z2c.wire_bf16 ? DDP_DTYPE_BF16 : z2c.wire_fp32 ? DDP_DTYPE_FP32 : DDP_DTYPE_DEFAULT;
    d.skip_nonfinite = z2c.nan_step > 0;
    d.param_dtype = z2c.params_bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_DEFAULT;
    d.find_unused = z2c.unused;
    if (z2c.outer_group) { d.outer.mode = DDP_OUTER_DILOCO; d.outer.group_size = z2c.outer_group; d.outer.inner_steps = 2; }
    d.bucket_cap_mb = 0.05;
    d.first_bucket_mb = 0.01;
    r = ddp_init(&ctx, &d);
    if (r == DDP_OK) r = sh_register(ctx, init[self->rank], ids);
    if (r == DDP_OK) r = ddp_commit(ctx);
    if (r == DDP_OK && ctx->be->id == DDP_BACKEND_NCCL) dev = ctx->impl.gpu->device;
    if (r == DDP_OK && z2c.load_path) r = ddp_load(ctx, z2c.load_path, NULL, 0, NULL, NULL, NULL);
    for (step = z2c.first_step; step < Z2_STEPS && r == DDP_OK; step++) {
        size_t before = 0;
        if (z2c.oom_step && step == z2c.oom_step && self->rank == 0) {   /* nothing more fits on the device */
            size_t held = fakegpu_device_bytes(dev), mapped = ddp__gvm_mapped(ctx->impl.gpu->z2vm);
            fakegpu_set_device_memory(dev, held);
            r = ddp_zero_grad(ctx);
            fakegpu_set_device_memory(dev, 0);
            if (r != DDP_ERR_OUT_OF_MEMORY || !strstr(ddp_last_error(ctx), "out of memory") ||
                !strstr(ddp_last_error(ctx), "the gradients of bucket") || fakegpu_device_bytes(dev) != held ||
                ddp__gvm_mapped(ctx->impl.gpu->z2vm) != mapped) {
                snprintf(z2.err[0], sizeof z2.err[0], "ddp_zero_grad on a full device: %s (%.800s), device bytes %zu -> %zu",
                         ddp_result_string(r), ddp_last_error(ctx), held, fakegpu_device_bytes(dev));
                r = DDP_ERR_BACKEND;
                break;
            }
            z2.oom_named = 1;
        }
        r = ddp_zero_grad(ctx);
        before = dev >= 0 ? fakegpu_device_bytes(dev) : 0;
        for (u = 0; u < z2c.micro && r == DDP_OK; u++) {
            if (z2c.acc_oom && step == 2 && u == 1 && self->rank == 0) {   /* the released gradients cannot come back */
                size_t held = fakegpu_device_bytes(dev), mapped = ddp__gvm_mapped(ctx->impl.gpu->z2vm);
                fakegpu_set_device_memory(dev, held);
                ddp_set_sync(ctx, u == z2c.micro - 1);
                fakegpu_set_device_memory(dev, 0);
                if (!strstr(ddp_last_error(ctx), "out of memory") || !strstr(ddp_last_error(ctx), "the gradients of bucket") ||
                    fakegpu_device_bytes(dev) != held || ddp__gvm_mapped(ctx->impl.gpu->z2vm) != mapped || ddp__failed(ctx)) {
                    snprintf(z2.err[0], sizeof z2.err[0], "ddp_set_sync on a full device: %.800s (failed %d), device bytes %zu -> %zu",
                             ddp_last_error(ctx), (int)ddp__failed(ctx), held, fakegpu_device_bytes(dev));
                    r = DDP_ERR_BACKEND;
                    break;
                }
                z2.oom_named = 1;
            }
            ddp_set_sync(ctx, u == z2c.micro - 1);
            /* shard_accumulate: ddp_set_sync mapped back what the last micro-step released */
            if (z2c.acc && !z2c.tape && u > 0 && dev >= 0 && self->world > 1 && fakegpu_device_bytes(dev) != before) {
                snprintf(z2.err[self->rank], sizeof z2.err[self->rank], "step %d micro-step %d: device bytes %zu after "
                         "ddp_set_sync, want %zu (every gradient mapped again)", step, u, fakegpu_device_bytes(dev), before);
                r = DDP_ERR_BACKEND;
                break;
            }
            if (z2c.tape) {   /* the tape: one op a parameter, replayed last to first as the loop below */
                z2_op a;
                a.ctx = ctx; a.step = step; a.u = u; a.rank = self->rank; a.world = self->world;
                for (k = 0; k < SH_PARAMS && r == DDP_OK; k++) {
                    a.id = ids[k]; a.k = k;
                    r = ddp_tape_record(ctx, z2_backward_op, &a, sizeof a, &ids[k], 1);
                }
                /* the last micro-step's backward was the tape's: ddp_set_sync left the gradients
                   released, ddp_backward maps them before its first op */
                if (r == DDP_OK && z2c.acc && u > 0 && dev >= 0 && self->world > 1 && fakegpu_device_bytes(dev) == before) {
                    snprintf(z2.err[self->rank], sizeof z2.err[self->rank], "step %d micro-step %d (the tape): every gradient "
                             "mapped before ddp_backward (%zu device bytes): the forward ran with them", step, u, before);
                    r = DDP_ERR_BACKEND;
                    break;
                }
                if (r == DDP_OK) r = ddp_backward(ctx);
            } else {
                for (k = SH_PARAMS - 1; k >= 0 && r == DDP_OK; k--) {
                    z2_write_grad(ctx, ids[k], k, step, u, self->rank, self->world);
                    r = ddp_grad_ready(ctx, ids[k]);
                }
                if (r == DDP_OK) r = ddp_finish(ctx);
            }
            /* shard_accumulate, sync off: between micro-steps only the granules touching this
               rank's parts hold memory, and the rest of the gradients reads zeros */
            if (r == DDP_OK && z2c.acc && u < z2c.micro - 1 && dev >= 0 && self->world > 1) {
                size_t es = z2c.params_bf16 ? sizeof(ddp_bf16) : sizeof(float), gran = ctx->impl.gpu->z2vm->gran, i, nz = 0;
                size_t all = (ctx->flat.count * es + gran - 1) / gran, part = z2_part_granules(ctx, es, gran, all);
                size_t now = fakegpu_device_bytes(dev), mapped = ddp__gvm_mapped(ctx->impl.gpu->z2vm);
                const unsigned char *gb = (const unsigned char *)ctx->impl.gpu->z2vm->base;
                for (i = 0; i < ctx->impl.gpu->z2vm->bytes; i += gran) {   /* the mapped granules: zeros */
                    size_t j;
                    if (!ctx->impl.gpu->z2vm->refs[i / gran]) continue;
                    for (j = i; j < i + gran && j < ctx->flat.count * es; j++) nz += gb[j] != 0;
                }
                if (mapped != part * gran || before - now != (all - part) * gran || (gran == 4096 && part == all) || nz) {
                    snprintf(z2.err[self->rank], sizeof z2.err[self->rank], "step %d micro-step %d (sync off): %zu gradient "
                             "bytes mapped (want %zu granules of %zu touching this rank's parts), device bytes %zu -> %zu "
                             "(want a drop of %zu granules), %zu nonzero bytes left in the mapped gradients", step, u, mapped,
                             part, gran, before, now, all - part, nz);
                    r = DDP_ERR_BACKEND;
                    break;
                }
                z2.micro_checks[self->rank]++;
            }
        }
        if (r == DDP_OK) r = ddp_adamw_step(ctx, &opt, &z2.norm[self->rank][step]);
        if (r == DDP_ERR_NONFINITE && z2c.nan_step && z2c.nan_step == step) r = DDP_OK;   /* skipped, named: the run goes on */
        /* ZeRO-2 on several ranks: after the step only the granules touching this rank's parts
           stay mapped; the drop from ddp_zero_grad's (everything mapped) is the rest, exactly
           (step 0 allocates AdamW's state: from step 1 on) */
        if (r == DDP_OK && z2c.shard == DDP_SHARD_GRADIENTS && dev >= 0 && ctx->impl.gpu->z2vm && step > z2c.first_step) {
            size_t es = z2c.params_bf16 ? sizeof(ddp_bf16) : sizeof(float), gran = ctx->impl.gpu->z2vm->gran;
            size_t all = (ctx->flat.count * es + gran - 1) / gran, part = z2_part_granules(ctx, es, gran, all);
            size_t after = fakegpu_device_bytes(dev), mapped = ddp__gvm_mapped(ctx->impl.gpu->z2vm);
            if (mapped != part * gran || before - after != (all - part) * gran || gran != (z2c.gran ? z2c.gran : (size_t)64 << 10) ||
                (gran == 4096 && part == all)) {   /* small granules: something must go */
                snprintf(z2.err[self->rank], sizeof z2.err[self->rank], "step %d: %zu gradient bytes mapped after the step (want "
                         "%zu granules of %zu touching this rank's parts), device bytes %zu -> %zu (want a drop of %zu = %zu "
                         "granules of %zu not touching a part)", step, mapped, part, gran, before, after, (all - part) * gran,
                         all - part, all);
                r = DDP_ERR_BACKEND;
                break;
            }
            z2.bytes_checks[self->rank]++;
            z2.grad_bytes[self->rank] = all * gran;
            z2.kept[self->rank] = mapped;
        }
        if (r == DDP_OK && z2c.save_path && step + 1 == z2c.save_step) r = ddp_save(ctx, z2c.save_path, NULL, 0);
    }
    if (r == DDP_OK) {
        size_t n = ctx->flat.count;   /* (ddp_flat_params counts the master's parts with bf16 parameters) */
        z2.params[self->rank] = (float *)calloc(n, sizeof(float));
        if (self->rank == 0) z2.count = n;
        r = ddp_gather_to_host(ctx, DDP_PARAMS, 0, self->rank == 0 ? z2.params[0] : NULL, n, 0);
    }
    z2.r[self->rank] = r;
    if (!z2.err[self->rank][0]) snprintf(z2.err[self->rank], sizeof z2.err[self->rank], "%s", ddp_last_error(ctx));
    if (ddp_shutdown(ctx) != DDP_OK && z2.r[self->rank] == DDP_OK) z2.r[self->rank] = DDP_ERR_BACKEND;
}

/* One run of z2_rank with z2c as set; rank 0's gathered parameters and norms returned (NULL: failed, why said). */
static float *z2_run(int world, float *norms, size_t *count, char *why, size_t cap) {
    float *p;
    int r;
    fakegpu_reset();
    reset_cfg();
    if (z2c.gran) fakegpu_set_vm_granularity(z2c.gran);
    memset(&z2, 0, sizeof z2);
    run(world, z2_rank);
    for (r = 0; r < world; r++)
        if (z2.r[r] != DDP_OK) {
            snprintf(why, cap, "shard %d, rank %d: %s%s%.400s", (int)z2c.shard, r, z2.err[r], res[r].logged[0] ? "; ddp_shutdown: " : "",
                     res[r].logged);
            for (r = 0; r < world; r++) free(z2.params[r]);
            return NULL;
        }
    p = z2.params[0];
    for (r = 1; r < world; r++) free(z2.params[r]);
    memcpy(norms, z2.norm[0], sizeof z2.norm[0]);
    *count = z2.count;
    return p;
}

/* ZeRO-2 against unsharded, both on the NCCL backend: the same norms and parameters, bit for
   bit, and (several ranks) the device bytes after every step. */
static void test_z2_outer(int world, int micro, int wire_bf16, int params_bf16, int unused, int group, size_t gran, int outer_group) {
    float na[Z2_STEPS], nb[Z2_STEPS], *a, *b = NULL;
    size_t ca = 0, cb = 0;
    int ok, checks = 0, r;
    char name[200], why[DDP__ERR_MAX + 64] = "";
    memset(&z2c, 0, sizeof z2c);
    z2c.micro = micro; z2c.wire_bf16 = wire_bf16; z2c.params_bf16 = params_bf16; z2c.unused = unused; z2c.group = group; z2c.gran = gran;
    z2c.outer_group = outer_group;
    /* hybrid: averaged in the shard group, then across the groups (another order than a flat
       average): the reference is ZeRO-1 with the same groups, which keeps the gradients */
    if (group) z2c.shard = DDP_SHARD_OPTIMIZER;
    a = z2_run(world, na, &ca, why, sizeof why);
    z2c.shard = DDP_SHARD_GRADIENTS;
    if (a) b = z2_run(world, nb, &cb, why, sizeof why);
    for (r = 0; r < world; r++) checks += z2.bytes_checks[r];
    if (checks)
        printf("  (ZeRO-2 on %d ranks, %zu B granules (fake): rank 0's gradients %zu B mapped from ddp_zero_grad to the step, "
               "%zu B after it (%.1f %%); rank %d: %zu of %zu B)\n", world, gran ? gran : (size_t)64 << 10, z2.grad_bytes[0], z2.kept[0],
               100.0 * (double)z2.kept[0] / (double)z2.grad_bytes[0], world - 1, z2.kept[world - 1], z2.grad_bytes[world - 1]);
    ok = a && b && ca == cb;
    if (ok && memcmp(na, nb, sizeof na)) { snprintf(why, sizeof why, "the gradient norms differ (step 1: %.9g, %.9g)", na[1], nb[1]); ok = 0; }
    if (ok && memcmp(a, b, ca * sizeof(float))) { snprintf(why, sizeof why, "the parameters differ"); ok = 0; }
    if (ok && world > 1 && outer_group != 1 && checks != world * (Z2_STEPS - 1)) { snprintf(why, sizeof why, "%d device-byte checks, want %d", checks, world * (Z2_STEPS - 1)); ok = 0; }
    snprintf(name, sizeof name, "fake_nccl_zero2_ranks%d_accum%d%s%s%s%s%s_gran%zuk_bitwise_equals_%s%s", world, micro,
             wire_bf16 ? "_bf16wire" : "", params_bf16 ? "_bf16params" : "", unused ? "_unused" : "", group ? "_hybrid2" : "",
             outer_group ? (outer_group == world ? "_diloco_one_group" : "_diloco_groups_of1") : "",
             (gran ? gran : (size_t)64 << 10) >> 10, group ? "zero1" : "unsharded", world > 1 && outer_group != 1 ? "_device_bytes_drop" : "");
    verdict(ok, name, "%s", why);
    free(a); free(b);
    check_clean(name);
}

static void test_z2(int world, int micro, int wire_bf16, int params_bf16, int unused, int group, size_t gran) {
    test_z2_outer(world, micro, wire_bf16, params_bf16, unused, group, gran, 0);
}

/* A full device: ddp_zero_grad cannot map the released gradients again. Refused by name
   (DDP_ERR_OUT_OF_MEMORY, the bucket), nothing changes; once memory is back the same call
   goes on and training ends with the bits of unsharded training. */
static void test_z2_oom(int world) {
    float na[Z2_STEPS], nb[Z2_STEPS], *a, *b = NULL;
    size_t ca = 0, cb = 0;
    int ok, named;
    char name[160], why[DDP__ERR_MAX + 64] = "";
    memset(&z2c, 0, sizeof z2c);
    z2c.micro = 1; z2c.gran = 4096;
    a = z2_run(world, na, &ca, why, sizeof why);
    z2c.shard = DDP_SHARD_GRADIENTS; z2c.oom_step = 3;
    if (a) b = z2_run(world, nb, &cb, why, sizeof why);
    named = z2.oom_named;
    ok = a && b && named && ca == cb && !memcmp(a, b, ca * sizeof(float)) && !memcmp(na, nb, sizeof na);
    snprintf(name, sizeof name, "fake_nccl_zero2_ranks%d_zero_grad_on_full_device_named_nothing_changes_retry_same_bits", world);
    verdict(ok, name, "%s", why[0] ? why : !named ? "the full device was not met" : "the bits differ after the retry");
    free(a); free(b);
    check_clean(name);
}

/* shard_accumulate on the NCCL backend against the CPU backend's on the same program: the same
   norms and parameters, bit for bit (the same reduce-scatters, then the same float adds in the
   same order: tests/test_zero2.c says how that differs from unsharded accumulation); between
   micro-steps only the granules of this rank's parts mapped, and zeros (several ranks); oom: a
   full device when ddp_set_sync maps the gradients back, named, nothing changed, retried. */
static void test_z2_acc_more(int world, int micro, int wire_bf16, int params_bf16, int unused, size_t gran, int oom, int wire_fp32,
                             int nan_step, int tape) {
    float na[Z2_STEPS], nb[Z2_STEPS], *a, *b = NULL;
    size_t ca = 0, cb = 0;
    int ok, checks = 0, r, named = 0;
    char name[256], why[DDP__ERR_MAX + 64] = "";
    memset(&z2c, 0, sizeof z2c);
    z2c.micro = micro; z2c.wire_bf16 = wire_bf16; z2c.params_bf16 = params_bf16; z2c.unused = unused; z2c.gran = gran;
    z2c.shard = DDP_SHARD_GRADIENTS; z2c.acc = 1; z2c.wire_fp32 = wire_fp32; z2c.nan_step = nan_step; z2c.tape = tape;
    z2c.backend = DDP_BACKEND_CPU;
    a = z2_run(world, na, &ca, why, sizeof why);
    z2c.backend = DDP_BACKEND_NCCL; z2c.acc_oom = oom;
    if (a) b = z2_run(world, nb, &cb, why, sizeof why);
    named = z2.oom_named;
    for (r = 0; r < world; r++) checks += z2.micro_checks[r];
    if (b && world > 1)
        printf("  (shard_accumulate on %d ranks, %zu B granules (fake): rank 0 keeps %zu of %zu gradient bytes mapped between "
               "micro-steps)\n", world, gran ? gran : (size_t)64 << 10, z2.kept[0], z2.grad_bytes[0]);
    ok = a && b && ca == cb;
    if (ok && memcmp(na, nb, sizeof na)) { snprintf(why, sizeof why, "the gradient norms differ (step 1: %.9g, %.9g)", na[1], nb[1]); ok = 0; }
    if (ok && memcmp(a, b, ca * sizeof(float))) { snprintf(why, sizeof why, "the parameters differ"); ok = 0; }
    if (ok && world > 1 && checks != world * Z2_STEPS * (micro - 1)) {
        snprintf(why, sizeof why, "%d micro-step device-byte checks, want %d", checks, world * Z2_STEPS * (micro - 1));
        ok = 0;
    }
    if (ok && oom && !named) { snprintf(why, sizeof why, "the full device was not met"); ok = 0; }
    if (ok && nan_step && (na[nan_step] == na[nan_step] || na[nan_step + 1] != na[nan_step + 1])) {
        snprintf(why, sizeof why, "step %d's norm %g, the next %g: want NaN (skipped), then a number", nan_step, na[nan_step],
                 na[nan_step + 1]);
        ok = 0;
    }
    snprintf(name, sizeof name, "fake_nccl_zero2_accumulate_ranks%d_accum%d%s%s%s%s%s_gran%zuk%s_bitwise_equals_cpu_backend%s", world,
             micro, wire_bf16 ? "_bf16wire" : "", wire_fp32 ? "_fp32wire" : "", params_bf16 ? "_bf16params" : "", unused ? "_unused" : "",
             nan_step ? (tape ? "_nan_skipped_tape" : "_nan_skipped") : tape ? "_tape" : "",
             (gran ? gran : (size_t)64 << 10) >> 10, oom ? "_set_sync_on_full_device_named_retried" : "",
             world > 1 ? "_only_parts_mapped_between_micro_steps" : "");
    verdict(ok, name, "%s", why);
    free(a); free(b);
    check_clean(name);
}

static void test_z2_acc(int world, int micro, int wire_bf16, int params_bf16, int unused, size_t gran, int oom) {
    test_z2_acc_more(world, micro, wire_bf16, params_bf16, unused, gran, oom, 0, 0, 0);
}

/* A checkpoint saved under ZeRO-2 loads unsharded, and one saved unsharded loads under ZeRO-2:
   the continuation has the bits of the uninterrupted run. */
static void test_z2_checkpoint(int world) {
    float nref[Z2_STEPS], n2[Z2_STEPS], *ref, *got = NULL;
    size_t cref = 0, c2 = 0;
    int ok = 1, dir;
    char name[160], why[DDP__ERR_MAX + 64] = "", path[64];
    snprintf(path, sizeof path, "/tmp/ddp_z2_nccl_%d.ckpt", (int)getpid());
    memset(&z2c, 0, sizeof z2c);
    z2c.micro = 1; z2c.gran = 4096;
    ref = z2_run(world, nref, &cref, why, sizeof why);
    ok = ref != NULL;
    for (dir = 0; dir < 2 && ok; dir++) {   /* 0: saved under ZeRO-2, loaded unsharded; 1: the other way */
        memset(&z2c, 0, sizeof z2c);
        z2c.micro = 1; z2c.gran = 4096;
        z2c.shard = dir ? DDP_SHARD_NONE : DDP_SHARD_GRADIENTS;
        z2c.save_path = path; z2c.save_step = 3;
        if (!(got = z2_run(world, n2, &c2, why, sizeof why))) { ok = 0; break; }
        free(got); got = NULL;
        z2c.save_path = NULL;
        z2c.shard = dir ? DDP_SHARD_GRADIENTS : DDP_SHARD_NONE;
        z2c.load_path = path; z2c.first_step = 3;
        got = z2_run(world, n2, &c2, why, sizeof why);
        if (!(ok = got != NULL)) break;
        if (c2 != cref || memcmp(got, ref, cref * sizeof(float)) || memcmp(&n2[3], &nref[3], 3 * sizeof(float))) {
            snprintf(why, sizeof why, "saved %s, loaded %s: the continuation differs from the uninterrupted run",
                     dir ? "unsharded" : "under ZeRO-2", dir ? "under ZeRO-2" : "unsharded");
            ok = 0;
        }
        free(got); got = NULL;
    }
    remove(path);
    free(ref); free(got);
    snprintf(name, sizeof name, "fake_nccl_zero2_ranks%d_checkpoint_saved_sharded_loads_unsharded_and_back", world);
    verdict(ok, name, "%s", why);
    check_clean(name);
}

/* ---- a small model whose gradients the test writes itself ---- */
enum { NA = 100, NB = 37 };

static ddp_result small_init(test_rank *self, ddp_context **ctx, int *a, int *b, int skip_nonfinite) {
    ddp_desc d = test_desc(self);
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    float ia[NA], ib[NB];
    ddp_result r;
    int i;
    d.backend = DDP_BACKEND_NCCL;
    d.skip_nonfinite = skip_nonfinite;
    d.first_bucket_mb = 0.0001;   /* "b" and "a" in buckets of their own */
    for (i = 0; i < NA; i++) ia[i] = test_value(100 + (uint64_t)self->rank, (uint64_t)i);   /* rank 0's must win */
    for (i = 0; i < NB; i++) ib[i] = test_value(200 + (uint64_t)self->rank, (uint64_t)i);
    if ((r = ddp_init(ctx, &d)) != DDP_OK) return r;
    if ((r = ddp_register_param(*ctx, "a", NA, 0, ia, a)) != DDP_OK) return r;
    if ((r = ddp_register_param(*ctx, "b", NB, DDP_NO_DECAY, ib, b)) != DDP_OK) return r;
    return ddp_commit(*ctx);
}

/* One backward by hand: rank r's gradient of element i is grad(r, i); NaN at b[3] on rank
   `nan_rank`. Device memory is host memory here: written in place, as a kernel would. */
static float grad_value(int rank, int i) { return (float)(rank + 1) * 0.25f + (float)i * 0.125f; }
static ddp_result small_backward(ddp_context *ctx, int a, int b, int rank, int nan_rank) {
    float *ga = ddp_grad(ctx, a), *gb = ddp_grad(ctx, b);
    ddp_result r;
    int i;
    if ((r = ddp_zero_grad(ctx)) != DDP_OK) return r;
    for (i = 0; i < NB; i++) gb[i] = grad_value(rank, i);
    if (rank == nan_rank) gb[3] = NAN;
    if ((r = ddp_grad_ready(ctx, b)) != DDP_OK) return r;
    for (i = 0; i < NA; i++) ga[i] = grad_value(rank, i);
    if ((r = ddp_grad_ready(ctx, a)) != DDP_OK) return r;
    return ddp_finish(ctx);
}

#define CHECK(cond, ...) do { if (!(cond)) { snprintf(out->err, sizeof out->err, __VA_ARGS__); out->r = DDP_ERR_BACKEND; goto done; } } while (0)
#define CALL(call) do { ddp_result r_ = (call); if (r_ != DDP_OK) { snprintf(out->err, sizeof out->err, "%.60s: %.900s", #call, ddp_last_error(ctx)); out->r = r_; goto done; } } while (0)

/* ---- the device address-space layer (ddp.h's >>nccl-vm) through the fake driver ---- */
static void gvm_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    ddp__gvm g;
    int a, b, dev;
    size_t gran = (size_t)64 << 10, base_bytes, lo, hi, i;
    int base_res = fakegpu_vm_live_reservations(), base_misuse = fakegpu_misuse_count();
    memset(&g, 0, sizeof g);
    CALL(small_init(self, &ctx, &a, &b, 0));
    dev = ctx->impl.gpu->device;
    base_bytes = fakegpu_device_bytes(dev);
    CALL(ddp__gvm_reserve(ctx, &g, 4 * gran + 100, "the test's range"));
    CHECK(g.gran == gran && g.bytes == 5 * gran && g.base && ((uintptr_t)g.base % gran) == 0,
          "reserve: gran %zu bytes %zu (want %zu, %zu, aligned)", g.gran, g.bytes, gran, 5 * gran);
    CHECK(ddp__gvm_mapped(&g) == 0 && fakegpu_device_bytes(dev) == base_bytes && fakegpu_vm_live_reservations() == base_res + 1,
          "a reservation holds no memory (mapped %zu, device bytes %zu -> %zu)", ddp__gvm_mapped(&g), base_bytes,
          fakegpu_device_bytes(dev));
    /* a map inside one granule maps it; an overlapping one maps only the new granules */
    CALL(ddp__gvm_map_range(ctx, &g, gran / 2, gran / 2, "part", &lo, &hi));
    CHECK(lo == 0 && hi == gran && g.refs[0] == 1 && g.handle[0] && ddp__gvm_mapped(&g) == gran &&
          fakegpu_device_bytes(dev) == base_bytes + gran, "first map: [%zu, %zu) refs %u bytes %zu", lo, hi, g.refs[0],
          fakegpu_device_bytes(dev) - base_bytes);
    CALL(ddp__gvm_map_range(ctx, &g, 100, 2 * gran + 1 - 100, "span", &lo, &hi));
    CHECK(lo == gran && hi == 3 * gran && g.refs[0] == 2 && g.refs[1] == 1 && g.refs[2] == 1 && g.refs[3] == 0 &&
          fakegpu_device_bytes(dev) == base_bytes + 3 * gran, "second map: [%zu, %zu) refs %u %u %u %u", lo, hi, g.refs[0],
          g.refs[1], g.refs[2], g.refs[3]);
    /* mapped granules are one piece of device memory to a copy across them */
    CHECK(cudaMemsetAsync(g.base, 0, 3 * gran, NULL) == cudaSuccess && fakegpu_misuse_count() == base_misuse,
          "a memset across three mapped granules was refused: %s", fakegpu_misuse_first());
    for (i = 0; i < 3 * gran; i += 4096) g.base[i] = (unsigned char)(i / 4096);
    /* an unmap that leaves a holder keeps the granule and its contents */
    CALL(ddp__gvm_unmap(ctx, &g, gran / 2, gran / 2));
    CHECK(g.refs[0] == 1 && g.handle[0] && g.base[4096] == 1 && ddp__gvm_mapped(&g) == 3 * gran,
          "unmap of one holder of two: refs %u, contents %d", g.refs[0], g.base[4096]);
    /* a map the device cannot back fails by name and changes nothing (granule 3 mapped, 4 not) */
    fakegpu_set_device_memory(dev, fakegpu_device_bytes(dev) + gran);
    {
        ddp_result r = ddp__gvm_map(ctx, &g, 0, 5 * gran, "the test's full range");
        fakegpu_set_device_memory(dev, 0);
        CHECK(r == DDP_ERR_OUT_OF_MEMORY && strstr(ddp_last_error(ctx), "the test's full range") &&
              strstr(ddp_last_error(ctx), "out of memory"), "a map beyond the device: %d %.900s", (int)r, ddp_last_error(ctx));
    }
    CHECK(g.refs[0] == 1 && g.refs[1] == 1 && g.refs[2] == 1 && g.refs[3] == 0 && g.refs[4] == 0 && !g.handle[3] &&
          fakegpu_device_bytes(dev) == base_bytes + 3 * gran && g.base[4096] == 1,
          "a failed map changed the range: refs %u %u %u %u %u, bytes %zu", g.refs[0], g.refs[1], g.refs[2], g.refs[3], g.refs[4],
          fakegpu_device_bytes(dev) - base_bytes);
    /* an unmap of what nobody holds is refused and changes nothing */
    CHECK(ddp__gvm_unmap(ctx, &g, 2 * gran, 2 * gran) != DDP_OK && g.refs[2] == 1 && g.handle[2],
          "unmapping an unmapped granule was accepted or changed granule 2");
    CHECK(ddp__gvm_unmap(ctx, &g, 0, 6 * gran) != DDP_OK, "an unmap beyond the reservation was accepted");
    /* last holders out: the memory goes back, the addresses stay reserved */
    CALL(ddp__gvm_unmap(ctx, &g, 0, 3 * gran));
    CHECK(ddp__gvm_mapped(&g) == 0 && fakegpu_device_bytes(dev) == base_bytes && !g.handle[0] && g.base,
          "all unmapped: mapped %zu, device bytes +%zu", ddp__gvm_mapped(&g), fakegpu_device_bytes(dev) - base_bytes);
    /* the same addresses map again; teardown with mappings gives everything back, twice is harmless */
    CALL(ddp__gvm_map(ctx, &g, 4 * gran, 1, "again"));
    CHECK(fakegpu_device_bytes(dev) == base_bytes + gran, "remap: +%zu", fakegpu_device_bytes(dev) - base_bytes);
    ddp__gvm_free(ctx, &g);
    ddp__gvm_free(ctx, &g);
    CHECK(fakegpu_device_bytes(dev) == base_bytes && fakegpu_vm_live_reservations() == base_res && fakegpu_vm_live_handles() == 0 &&
          fakegpu_misuse_count() == base_misuse, "teardown: bytes +%zu, reservations %d, handles %d, misuse: %s",
          fakegpu_device_bytes(dev) - base_bytes, fakegpu_vm_live_reservations() - base_res, fakegpu_vm_live_handles(),
          fakegpu_misuse_first());
    CALL(ddp_barrier(ctx));
done:
    if (ctx) ddp__gvm_free(ctx, &g);
    out->shut = ddp_shutdown(ctx);
}

/* A driver without virtual memory management: a reservation fails by name, nothing else does.
   (Before any other use: ddp.h keeps the functions once it found them.) */
static void gvm_missing_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    ddp__gvm g;
    int a, b;
    ddp_result r;
    memset(&g, 0, sizeof g);
    CALL(small_init(self, &ctx, &a, &b, 0));
    fakegpu_set_vm_missing(1);
    r = ddp__gvm_reserve(ctx, &g, 1000, "the test's range");
    fakegpu_set_vm_missing(0);
    CHECK(r == DDP_ERR_BACKEND && strstr(ddp_last_error(ctx), "needs CUDA virtual memory management") &&
          strstr(ddp_last_error(ctx), "the test's range") && !g.base, "without the driver's functions: %d %.900s", (int)r,
          ddp_last_error(ctx));
    CALL(ddp__gvm_reserve(ctx, &g, 1000, "the test's range"));   /* asked again: found now */
    CHECK(g.base && g.bytes == g.gran, "reserve after the driver came back: %zu bytes", g.bytes);
done:
    if (ctx) ddp__gvm_free(ctx, &g);
    out->shut = ddp_shutdown(ctx);
}

/* ---- (b) user collectives, (c) host copies, (d) stats ---- */
static void collectives_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    enum { N = 1000, BYTES = 13 };
    float host[N], back[N], want;
    unsigned char bytes[BYTES];
    float *dev = NULL, *flat, m[NA + NB + 32];
    int a, b, i, s, world = self->world, root = world - 1;
    size_t ob;   /* b's offset: parameters start on 16-float boundaries */
    int64_t *step;
    float *mdev, *vdev;
    ddp_step_stats st;
    size_t count;
    out->fail_step = -1;
    CALL(small_init(self, &ctx, &a, &b, 0));
    flat = ddp_flat_params(ctx, &count);
    ob = (size_t)(ddp_param(ctx, b) - flat);
    CHECK(flat == ddp_param(ctx, a) && ob >= NA && count == ob + NB + (16 - NB % 16) % 16, "layout: b at %zu of %zu", ob, count);
    /* (c) rank 0's initial parameters everywhere (the commit's broadcast), read on the host */
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, host, count));
    for (i = 0; i < NA; i++) CHECK(host[i] == test_value(100, (uint64_t)i), "parameter a[%d] is not rank 0's", i);
    for (i = 0; i < NB; i++) CHECK(host[ob + i] == test_value(200, (uint64_t)i), "parameter b[%d] is not rank 0's", i);
    /* (b) allreduce sum and avg on device memory, in place */
    CHECK(cudaMalloc((void **)&dev, N * sizeof(float)) == cudaSuccess, "cudaMalloc");
    for (i = 0; i < N; i++) host[i] = grad_value(self->rank, i);
    CHECK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
    CALL(ddp_allreduce(ctx, dev, N, DDP_SUM));
    CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy back");
    for (i = 0; i < N; i++) {
        for (want = grad_value(0, i), s = 1; s < world; s++) want += grad_value(s, i);
        CHECK(back[i] == want, "device allreduce(sum)[%d] = %g, want %g", i, back[i], want);
    }
    CHECK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
    CALL(ddp_allreduce(ctx, dev, N, DDP_AVG));
    CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy back");
    for (i = 0; i < N; i++) {
        for (want = grad_value(0, i), s = 1; s < world; s++) want += grad_value(s, i);
        want = want / (float)world;   /* the average of the sum just computed: exact inputs */
        CHECK(back[i] == want, "device allreduce(avg)[%d] = %g, want %g", i, back[i], want);
    }
    /* host memory: staged and waited for */
    for (i = 0; i < N; i++) host[i] = grad_value(self->rank, i);
    CALL(ddp_allreduce(ctx, host, N, DDP_AVG));
    for (i = 0; i < N; i++) {
        for (want = grad_value(0, i), s = 1; s < world; s++) want += grad_value(s, i);
        want = want / (float)world;
        CHECK(host[i] == want, "host allreduce(avg)[%d] = %g, want %g", i, host[i], want);
    }
    /* broadcast: host bytes, then device bytes, from the last rank */
    for (i = 0; i < BYTES; i++) bytes[i] = (unsigned char)(self->rank * 16 + i);
    CALL(ddp_broadcast(ctx, bytes, BYTES, root));
    for (i = 0; i < BYTES; i++) CHECK(bytes[i] == (unsigned char)(root * 16 + i), "host broadcast byte %d = %d", i, bytes[i]);
    for (i = 0; i < N; i++) host[i] = (float)(self->rank * N + i);
    CHECK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
    CALL(ddp_broadcast(ctx, dev, 7 * sizeof(float) + 1, root));
    CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy back");
    for (i = 0; i < N; i++) {
        float w = i < 7 ? (float)(root * N + i) : i == 7 ? back[7] : (float)(self->rank * N + i);
        CHECK(back[i] == w, "device broadcast[%d] = %g, want %g", i, back[i], w);
    }
    CALL(ddp_barrier(ctx));
    /* (c) host copies of every flat buffer; (d) stats of a step */
    CALL(small_backward(ctx, a, b, self->rank, -1));
    CALL(ddp_copy_to_host(ctx, DDP_GRADS, 0, host, count));
    for (i = 0; i < (int)count; i++) {
        int k = i < NA ? i : i - (int)ob;
        if ((i >= NA && i < (int)ob) || i >= (int)ob + NB) continue;   /* padding */
        for (want = grad_value(0, k), s = 1; s < world; s++) want += grad_value(s, k);
        want = want / (float)world;
        CHECK(host[i] == want, "averaged gradient %d = %g, want %g", i, host[i], want);
    }
    {
        ddp_adamw opt;
        memset(&opt, 0, sizeof opt);
        opt.lr = 0.01f;
        CALL(ddp_adamw_step(ctx, &opt, NULL));
    }
    CALL(ddp_copy_to_host(ctx, DDP_ADAM_M, 0, m, count));
    for (i = 0; i < (int)count; i++) {   /* first step, no clipping: m = 0.9 * 0 + (1 - 0.9) * g */
        float one_minus_b1 = 1.0f - 0.9f, b1m = 0.9f * 0.0f, g1 = host[i] * 1.0f;
        CHECK(m[i] == b1m + one_minus_b1 * g1, "m[%d] = %g, want %g", i, m[i], b1m + one_minus_b1 * g1);
    }
    CALL(ddp_adamw_state(ctx, &mdev, &vdev, &step));
    CHECK(*step == 1 && mdev && vdev, "ddp_adamw_state: step %lld", (long long)*step);
    for (i = 0; i < NB; i++) host[i] = (float)i;
    CALL(ddp_copy_from_host(ctx, DDP_PARAMS, ob, host, NB));
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, back, count));
    for (i = 0; i < NB; i++) CHECK(back[ob + i] == (float)i, "copy_from_host: b[%d] = %g", i, back[ob + i]);
    st = ddp_last_step_stats(ctx);
    CHECK(st.step == 1 && st.buckets_launched == 2 && ddp_num_buckets(ctx) == 2 &&
          st.bytes_reduced == (world > 1 ? (uint64_t)count * sizeof(float) : st.bytes_reduced),
          "stats: step %lld, %d buckets of %d, %llu bytes", (long long)st.step, st.buckets_launched, ddp_num_buckets(ctx),
          (unsigned long long)st.bytes_reduced);
done:
    if (dev) cudaFree(dev);
    if (out->r == DDP_OK) out->same_as_rank0 = 1;
    out->shut = ddp_shutdown(ctx);
}

/* ---- (e) non-finite gradients ---- */
static void nonfinite_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    float before[NA + NB + 32], after[NA + NB + 32], norm = 0;
    size_t count;
    ddp_result r;
    int a, b;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.max_grad_norm = 1.0f;
    out->fail_step = -1;
    memset(before, 0, sizeof before);
    memset(after, 0, sizeof after);
    CALL(small_init(self, &ctx, &a, &b, 0));
    ddp_flat_params(ctx, &count);
    CHECK(count <= NA + NB + 32, "layout");
    CALL(small_backward(ctx, a, b, self->rank, -1));
    CALL(ddp_adamw_step(ctx, &opt, &norm));
    CHECK(norm > 0 && isfinite(norm), "norm %g", norm);
    /* with grad_norm_out: the step itself fails and names the parameter; nothing changes */
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, before, count));
    CALL(small_backward(ctx, a, b, self->rank, self->world - 1));
    r = ddp_adamw_step(ctx, &opt, &norm);
    CHECK(r == DDP_ERR_NONFINITE && strstr(ddp_last_error(ctx), "optimizer step 2: the gradient of 'b' is nan at element 3"),
          "step 2 with grad_norm_out: %s: %.800s", ddp_result_string(r), ddp_last_error(ctx));
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, after, count));
    CHECK(!memcmp(before, after, sizeof before), "a non-finite step changed the parameters");
    /* without: skipped on the device, reported by the next step */
    CALL(small_backward(ctx, a, b, self->rank, self->world - 1));
    r = ddp_adamw_step(ctx, &opt, NULL);
    CHECK(r == DDP_OK, "the skipped step itself: %s: %.800s", ddp_result_string(r), ddp_last_error(ctx));
    CALL(small_backward(ctx, a, b, self->rank, -1));
    r = ddp_adamw_step(ctx, &opt, NULL);
    CHECK(r == DDP_ERR_NONFINITE && strstr(ddp_last_error(ctx), "earlier optimizer step(s) had non-finite gradients"),
          "the step after a skipped one: %s: %.800s", ddp_result_string(r), ddp_last_error(ctx));
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, after, count));
    CHECK(!memcmp(before, after, sizeof before), "a skipped step changed the parameters");
    /* and training goes on */
    CALL(small_backward(ctx, a, b, self->rank, -1));
    CALL(ddp_adamw_step(ctx, &opt, &norm));
    CALL(ddp_copy_to_host(ctx, DDP_PARAMS, 0, after, count));
    CHECK(memcmp(before, after, sizeof before), "a finite step after the skips changed nothing");
done:
    if (out->r == DDP_OK) out->same_as_rank0 = 1;
    out->shut = ddp_shutdown(ctx);
}

static void run_small(const char *name, int world, test_rank_fn fn) {
    int r, ok = 1;
    char why[DDP__ERR_MAX + 64] = "";
    fakegpu_reset();
    reset_cfg();
    run(world, fn);
    for (r = 0; r < world && ok; r++)
        if (res[r].r != DDP_OK || res[r].shut != DDP_OK) {
            ok = 0;
            snprintf(why, sizeof why, "rank %d: %s; ddp_shutdown %s%s%.400s", r, res[r].err, ddp_result_string(res[r].shut),
                     res[r].logged[0] ? ": " : "", res[r].logged);
        }
    verdict(ok, name, "%s", why);
    check_clean(name);
}

/* ---- (h) checkpoints: ddp_save on 2 NCCL ranks (device memory), ddp_load on 3 and 1 NCCL
   ranks and on 2 CPU-backend ranks: every rank holds the saved bits, and the step count reaches
   the device (the next step is the saved one + 1) ---- */
static char ck_path[64];
static float ck_saved[3][NA + NB];   /* parameters, m, v of a and b, as rank 0 of the saver had them */
static int64_t ck_step;
static ddp_backend ck_backend;

static ddp_result ck_state(ddp_context *ctx, int a, int b, float out[3][NA + NB]) {
    ddp_buffer which[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    size_t oa = (size_t)(ddp_param(ctx, a) - ddp_flat_params(ctx, NULL)), ob = (size_t)(ddp_param(ctx, b) - ddp_flat_params(ctx, NULL));
    ddp_result r = DDP_OK;
    int k;
    for (k = 0; k < 3 && r == DDP_OK; k++) {
        r = ddp_copy_to_host(ctx, which[k], oa, out[k], NA);
        if (r == DDP_OK) r = ddp_copy_to_host(ctx, which[k], ob, out[k] + NA, NB);
    }
    return r;
}

static void ckpt_save_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    ddp_adamw opt;
    int64_t *step;
    int a, b, s;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f;
    out->fail_step = -1;
    CALL(small_init(self, &ctx, &a, &b, 0));
    for (s = 0; s < 3; s++) {
        CALL(small_backward(ctx, a, b, self->rank, -1));
        CALL(ddp_adamw_step(ctx, &opt, NULL));   /* no norm read back: the step count stays on the device */
    }
    CALL(ddp_save(ctx, ck_path, "fake-nccl", 10));
    if (self->rank == 0) {
        CALL(ck_state(ctx, a, b, ck_saved));
        CALL(ddp_adamw_state(ctx, NULL, NULL, &step));
        ck_step = *step;
    }
done:
    if (out->r == DDP_OK) out->same_as_rank0 = 1;
    out->shut = ddp_shutdown(ctx);
}

static void ckpt_load_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_context *ctx = NULL;
    ddp_desc d = test_desc(self);
    ddp_adamw opt;
    ddp_checkpoint_info info;
    float got[3][NA + NB], ia[NA], ib[NB];
    char blob[16];
    int64_t *step;
    int a, b, i;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f;
    out->fail_step = -1;
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    d.backend = ck_backend;
    for (i = 0; i < NA; i++) ia[i] = 0.5f;   /* not the saved values */
    for (i = 0; i < NB; i++) ib[i] = -0.5f;
    CALL(ddp_init(&ctx, &d));
    CALL(ddp_register_param(ctx, "a", NA, 0, ia, &a));
    CALL(ddp_register_param(ctx, "b", NB, DDP_NO_DECAY, ib, &b));
    CALL(ddp_commit(ctx));
    CALL(ddp_load(ctx, ck_path, blob, sizeof blob, NULL, NULL, &info));
    CHECK(info.world_size == 2 && info.step == ck_step && info.user_bytes == 10 && !strcmp(blob, "fake-nccl"),
          "info: world %d step %lld (saved %lld), blob '%.10s'", info.world_size, (long long)info.step, (long long)ck_step, blob);
    CALL(ck_state(ctx, a, b, got));
    CHECK(!memcmp(got, ck_saved, sizeof got), "the loaded parameters, m or v differ from the saved ones");
    CALL(small_backward(ctx, a, b, self->rank, -1));
    CALL(ddp_adamw_step(ctx, &opt, NULL));
    CALL(ddp_adamw_state(ctx, NULL, NULL, &step));
    CHECK(*step == ck_step + 1, "the step after the load is %lld, want %lld", (long long)*step, (long long)ck_step + 1);
done:
    if (out->r == DDP_OK) out->same_as_rank0 = 1;
    out->shut = ddp_shutdown(ctx);
}

static void checkpoints(void) {
    snprintf(ck_path, sizeof ck_path, "/tmp/fake_nccl_ckpt.%d", (int)getpid());
    ck_backend = DDP_BACKEND_NCCL;
    run_small("fake_nccl_ranks2_ddp_save_from_device_memory", 2, ckpt_save_rank);
    run_small("fake_nccl_ranks3_ddp_load_into_device_memory_bitwise", 3, ckpt_load_rank);
    run_small("fake_nccl_ranks1_ddp_load_into_device_memory_bitwise", 1, ckpt_load_rank);
    ck_backend = DDP_BACKEND_CPU;
    run_small("fake_nccl_checkpoint_loaded_on_cpu_backend_bitwise", 2, ckpt_load_rank);
    unlink(ck_path);
}

/* ---- (f), (g) faults: every rank fails, with a message, soon; shutdown is quick ---- */
/* `want` may list alternatives, "a|b": a peer learns of rank 1's failure either from its poison
   ("stopped because rank 1: ...") or, when rank 1 has shut down first, from its store connection
   closing ("rank 1 disconnected ..."); both name the rank, and which comes first is timing. */
static int has_one_of(const char *text, const char *want) {
    char alt[256];
    const char *p = want;
    while (*p) {
        size_t n = strcspn(p, "|");
        snprintf(alt, sizeof alt, "%.*s", (int)n, p);
        if (strstr(text, alt)) return 1;
        p += n + (p[n] == '|');
    }
    return 0;
}

static void expect_failure(const char *name, int world, double within_s, const char *const *want) {
    int r, ok = 1;
    char why[2 * DDP__ERR_MAX] = "";
    for (r = 0; r < world; r++) {
        const char *w = want[r < 3 ? r : 2];
        printf("  (%s: rank %d: %s after %.2f s, shutdown %.2f s: %s)\n", name, r, ddp_result_string(res[r].r), res[r].t_fail,
               res[r].t_shutdown, res[r].err);
        if (ok && res[r].r == DDP_OK) { ok = 0; snprintf(why, sizeof why, "rank %d did not fail", r); }
        else if (ok && w && !has_one_of(res[r].err, w)) { ok = 0; snprintf(why, sizeof why, "rank %d's error lacks '%s': %s", r, w, res[r].err); }
        else if (ok && res[r].t_fail > within_s) { ok = 0; snprintf(why, sizeof why, "rank %d failed after %.1f s (> %.1f s)", r, res[r].t_fail, within_s); }
        else if (ok && res[r].t_shutdown > 3) { ok = 0; snprintf(why, sizeof why, "rank %d's shutdown took %.1f s", r, res[r].t_shutdown); }
    }
    verdict(ok, name, "%s", why);
    check_clean(name);
}

static void fault_inject(int world, int after) {
    char name[96];
    const char *want[3] = { "stopped because rank 1|rank 1 disconnected", "unhandled system error", "stopped because rank 1|rank 1 disconnected" };
    fakegpu_reset();
    reset_cfg();
    fakegpu_inject_async_error(1, after, ncclSystemError);
    run(world, train_rank);
    snprintf(name, sizeof name, "fake_nccl_ranks%d_async_error_on_rank1_after%d_fails_every_rank", world, after);
    expect_failure(name, world, 5, want);
}

/* The error arrives while rank 1 enqueues nothing: its watchdog finds it. */
static void fault_async_idle(void) {
    const char *want[3] = { "stopped because rank 1|rank 1 disconnected", "NCCL reported an asynchronous error", NULL };
    fakegpu_reset();
    reset_cfg();
    cfg.stop_rank = 1; cfg.stop_step = 3; cfg.stop_fails = 1;
    run(2, train_rank);
    expect_failure("fake_nccl_async_error_found_by_watchdog_fails_every_rank", 2, 5, want);
    /* everything it enqueued had completed: the message must not blame an old operation */
    verdict(!strstr(res[1].err, "initial parameters"), "fake_nccl_async_error_names_no_completed_operation", "%s", res[1].err);
}

static void fault_abort(int world) {
    const char *want[3] = { "stopped because rank 1|rank 1 disconnected", "the NCCL communicator is gone (aborted)", "stopped because rank 1|rank 1 disconnected" };
    fakegpu_reset();
    reset_cfg();
    cfg.abort_rank = 1; cfg.abort_step = 3;
    run(world, train_rank);
    expect_failure(world == 2 ? "fake_nccl_ranks2_rank1_aborts_fails_every_rank" : "fake_nccl_ranks3_rank1_aborts_fails_every_rank",
                   world, 5, want);
}

/* Replica groups of 2 on 4 ranks: rank 1 (group 0) aborts its communicators (the group's and
   the world's); its group's peer and the other group's ranks, which share no bucket with it,
   fail by name too, within seconds, and nothing leaks. */
static void fault_abort_in_group(void) {
    const char *want[3] = { "stopped because rank 1|rank 1 disconnected", "communicator is gone (aborted)",
                            "stopped because rank 1|rank 1 disconnected" };
    fakegpu_reset();
    reset_cfg();
    cfg.outer.mode = DDP_OUTER_DILOCO; cfg.outer.group_size = 2; cfg.outer.inner_steps = 5;
    cfg.abort_rank = 1; cfg.abort_step = 3;
    run(4, train_rank);
    expect_failure("fake_nccl_ranks4_groups_of2_rank1_aborts_fails_every_rank", 4, 5, want);
}

/* A cancel is not a failure: every rank, the peers too, ends with DDP_ERR_CANCELLED (the
   poison in the store carries the code), not with a lost peer. */
static void fault_cancel(int world) {
    const char *want[3] = { "cancelled", "cancelled", "cancelled" };
    char name[96];
    int r, all = 1;
    fakegpu_reset();
    reset_cfg();
    cfg.cancel_rank = 1; cfg.cancel_step = 3;
    run(world, train_rank);
    snprintf(name, sizeof name, "fake_nccl_ranks%d_rank1_cancels_every_rank_stops", world);
    expect_failure(name, world, 5, want);
    for (r = 0; r < world; r++) all &= res[r].r == DDP_ERR_CANCELLED;
    snprintf(name, sizeof name, "fake_nccl_ranks%d_rank1_cancels_every_rank_gets_cancelled", world);
    verdict(all, name, "results: rank 0 %s, rank 1 %s%s%s", ddp_result_string(res[0].r), ddp_result_string(res[1].r),
            world > 2 ? ", rank 2 " : "", world > 2 ? ddp_result_string(res[2].r) : "");
}

static void fault_stop(void) {
    const char *want[3] = { "timed out after 2 s", "timed out after 2 s", NULL };
    fakegpu_reset();
    reset_cfg();
    cfg.stop_rank = 1; cfg.stop_step = 3; cfg.timeout_s = 2;
    run(2, train_rank);
    expect_failure("fake_nccl_rank1_stops_peer_times_out_naming_it", 2, 6, want);
}

static void fault_hold(void) {
    const char *want[3] = { "the GPU never finished it", "stopped because rank 0: timed out after 2 s", NULL };
    fakegpu_reset();
    reset_cfg();
    cfg.hold_rank = 0; cfg.hold_step = 3; cfg.timeout_s = 2; cfg.steps = 1000000;   /* until it fails */
    run(2, train_rank);
    fakegpu_hold_device(0, 0);
    expect_failure("fake_nccl_gpu_stops_events_never_complete_timeout_names_it", 2, 6, want);
}

static void init_never_completes(void) {
    const char *want[3] = { "rank(s) that did not finish it: 0, 1, 2", "rank(s) that did not finish it: 0, 1, 2",
                            "rank(s) that did not finish it: 0, 1, 2" };
    fakegpu_reset();
    reset_cfg();
    fakegpu_stall_init(1);
    cfg.timeout_s = 2;
    run(3, train_rank);
    expect_failure("fake_nccl_setup_never_completes_timeout_names_ranks", 3, 6, want);
}

/* 2 groups of 2 on 4 ranks: rank 3's second set-up (its group's communicator) never finishes.
   Its group times out naming the group's ranks (not the world's), the other group's ranks fail
   by name instead of waiting for the first broadcast, and the stalled communicator is freed. */
static void team_init_never_completes(void) {
#define TEAM_PEER_LOST "stopped because rank 2|stopped because rank 3|rank 2 disconnected|rank 3 disconnected"
    const char *want[3] = { TEAM_PEER_LOST, TEAM_PEER_LOST,
                            "replica group's communicator; rank(s) never started it: none; rank(s) that did not finish it: 2, 3;" };
    fakegpu_reset();
    reset_cfg();
    fakegpu_stall_init_on(3, 1);
    cfg.outer.mode = DDP_OUTER_DILOCO; cfg.outer.group_size = 2; cfg.outer.inner_steps = 5;
    cfg.timeout_s = 2;
    run(4, train_rank);
    expect_failure("fake_nccl_ranks4_groups_of2_group_setup_never_completes_timeout_names_its_ranks", 4, 6, want);
#undef TEAM_PEER_LOST
}

static void duplicate_gpu(void) {
    const char *want[3] = { "Duplicate GPU detected", "Duplicate GPU detected", NULL };
    fakegpu_reset();
    reset_cfg();
    fakegpu_set_device_count(1);
    cfg.timeout_s = 5;
    run(2, train_rank);
    expect_failure("fake_nccl_two_ranks_one_gpu_named", 2, 6, want);
}

static void auto_backend(void) {
    ddp_context *ctx;
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.log_level = DDP_LOG_OFF;
    fakegpu_reset();
    ddp_init(&ctx, &d);
    verdict(!strcmp(ddp_backend_name(ctx), "nccl"), "fake_auto_backend_is_nccl_with_a_gpu", "got %s", ddp_backend_name(ctx));
    ddp_shutdown(ctx);
    {   /* ZeRO-2 runs on NCCL, with shard_accumulate too (test_z2_acc); under ZeRO-3 it is refused
           by name, as on every backend */
        ddp_result r;
        d.shard = DDP_SHARD_PARAMETERS;
        d.shard_accumulate = 1;
        fakegpu_reset();
        r = ddp_init(&ctx, &d);
        verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ctx), "shard_accumulate 1 needs shard DDP_SHARD_GRADIENTS"),
                "fake_nccl_zero3_shard_accumulate_refused_by_name", "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
        ddp_shutdown(ctx);
        d.shard = DDP_SHARD_GRADIENTS;
        fakegpu_reset();
        r = ddp_init(&ctx, &d);
        verdict(r == DDP_OK, "fake_nccl_zero2_shard_accumulate_accepted", "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
        ddp_shutdown(ctx);
        d.shard_accumulate = 0;
        r = ddp_init(&ctx, &d);
        verdict(r == DDP_OK, "fake_nccl_zero2_accepted", "%s: %s", ddp_result_string(r), ddp_last_error(ctx));
        ddp_shutdown(ctx);
        d.shard = DDP_SHARD_DEFAULT;
        fakegpu_reset();
    }
    {   /* ZeRO-3 in replica groups of several ranks: the outer step gathers the parameters among the
           group, which NCCL has no broadcast for: refused by name at ddp_init (before any rendezvous) */
        ddp_result r;
        ddp_desc z = d;
        z.world_size = 2;
        z.rank = 0;
        z.master_port = 1;   /* never reached */
        z.backend = DDP_BACKEND_NCCL;
        z.shard = DDP_SHARD_PARAMETERS;
        z.outer.mode = DDP_OUTER_DILOCO;
        z.outer.group_size = 2;
        z.outer.inner_steps = 2;
        r = ddp_init(&ctx, &z);
        verdict(r == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_last_error(ctx), "DDP_SHARD_PARAMETERS in replica groups of 2 ranks") &&
                strstr(ddp_last_error(ctx), "nccl"), "fake_nccl_zero3_replica_groups_of_several_refused_by_name", "%s: %s",
                ddp_result_string(r), ddp_last_error(ctx));
        ddp_shutdown(ctx);
        fakegpu_reset();
    }
    fakegpu_set_device_count(0);
    ddp_init(&ctx, &d);
    verdict(!strcmp(ddp_backend_name(ctx), "single"), "fake_auto_backend_without_a_gpu", "got %s", ddp_backend_name(ctx));
    ddp_shutdown(ctx);
    check_clean("auto_backend");
}

/* Non-blocking set-up that completes late, collectives that answer ncclInProgress a few polls
   after they are done, and a stream kept busy (events not ready when first polled). */
static void slow_nccl(int world) {
    float *gpu = NULL, *cpu = NULL;
    size_t ng = 0, nc = 0;
    char why[DDP__ERR_MAX + 64] = "", name[96];
    int ok;
    fakegpu_reset();
    reset_cfg();
    fakegpu_set_init_delay(0.3);
    fakegpu_set_inprogress_polls(3);
    cfg.inject_comm_ms = 1;
    cfg.steps = 10;
    ok = train(world, DDP_BACKEND_NCCL, &gpu, &ng, why, sizeof why);
    snprintf(name, sizeof name, "fake_nccl_ranks%d_late_setup_inprogress_busy_stream_trains", world);
    verdict(ok && res[0].t_fail >= 0.3, name, "%s (%.2f s)", why, res[0].t_fail);
    if (ok) {
        reset_cfg();
        cfg.steps = 10;
        ok = train(world, DDP_BACKEND_CPU, &cpu, &nc, why, sizeof why) && nc == ng && !memcmp(gpu, cpu, ng * sizeof(float));
        snprintf(name, sizeof name, "fake_nccl_ranks%d_late_setup_inprogress_bitwise_equals_cpu_backend", world);
        verdict(ok, name, "%s", why[0] ? why : "parameters differ");
    }
    free(gpu);
    free(cpu);
    check_clean(name);
}

/* A rank slow through ddp_shutdown (its GPU 0.4 s late: what a loaded machine did to CI's
   sanitizer run): the others pass the first shutdown barrier, hang up on the store and wait in
   the second, their watchdogs polling the store the slow rank 0 still serves. A hang-up after
   the barrier is a goodbye, not a death: every rank's shutdown is DDP_OK. (Before the goodbye,
   the pollers read "rank N disconnected", aborted, and ddp_shutdown failed.) */
static void slow_shutdown(int world, int slow_rank) {
    float *gpu = NULL;
    size_t ng = 0;
    char why[DDP__ERR_MAX + 64] = "", name[96];
    int ok;
    fakegpu_reset();
    reset_cfg();
    cfg.steps = 3;
    cfg.slow_shutdown_rank = slow_rank;
    ok = train(world, DDP_BACKEND_NCCL, &gpu, &ng, why, sizeof why);
    snprintf(name, sizeof name, "fake_nccl_ranks%d_rank%d_slow_in_shutdown_every_shutdown_ok", world, slow_rank);
    verdict(ok && res[slow_rank].t_shutdown >= 0.4, name, "%s (rank %d's shutdown took %.2f s)", why, slow_rank,
            res[slow_rank].t_shutdown);
    free(gpu);
    snprintf(name, sizeof name, "nccl_ranks%d_slow_shutdown", world);
    check_clean(name);
}

/* ---- (i) the timeline's GPU spans: per rank and step one "backward (gpu)" and one "exposed
   comm (gpu)" on the comm lane (tid 1); backward starts no earlier than the step's first host
   event and
   no later than any of its allreduces; exposed runs from backward's end to the last allreduce's
   end (empty when that came first), and its length is what ddp_last_step_stats reported ---- */
typedef struct tl_ev { char cat[24]; int pid, tid, step; double ts, dur; } tl_ev;

static int tl_parse(const char *line, tl_ev *e) {
    const char *c = strstr(line, "\"cat\":\""), *p = strstr(line, "\"pid\":"), *t = strstr(line, "\"tid\":"),
               *ts = strstr(line, "\"ts\":"), *d = strstr(line, "\"dur\":"), *st = strstr(line, "\"step\":");
    size_t n;
    if (!c || !p || !t || !ts || !st) return 0;
    c += 7;
    n = strcspn(c, "\"");
    if (n >= sizeof e->cat) return 0;
    memcpy(e->cat, c, n);
    e->cat[n] = 0;
    e->dur = 0;
    return sscanf(p + 6, "%d", &e->pid) == 1 && sscanf(t + 6, "%d", &e->tid) == 1 && sscanf(ts + 5, "%lf", &e->ts) == 1 &&
           sscanf(st + 7, "%d", &e->step) == 1 && (!d || sscanf(d + 6, "%lf", &e->dur) == 1);
}

static void timeline_gpu_spans(int world) {
    char path[64], line[1024], name[96], why[DDP__ERR_MAX + 160] = "";
    float *gpu = NULL;
    size_t ng = 0, n = 0, cap = 4096, i;
    tl_ev *ev = (tl_ev *)malloc(cap * sizeof *ev);
    FILE *f;
    int ok, r, s, fd, exposed_seen = 0;
    snprintf(path, sizeof path, "/tmp/ddp_fake_tl_XXXXXX");
    fd = mkstemp(path);
    if (fd >= 0) close(fd);
    fakegpu_reset();
    reset_cfg();
    cfg.steps = 6;
    cfg.inject_comm_ms = 2;   /* each bucket's comm outlasts the MLP's backward: a real exposed tail */
    cfg.timeline = path;
    cfg.step_sleep_ms = 10;   /* every step's events complete before the next step reuses them */
    ok = fd >= 0 && ev && train(world, DDP_BACKEND_NCCL, &gpu, &ng, why, sizeof why);
    if (ok && !(f = fopen(path, "r"))) { ok = 0; snprintf(why, sizeof why, "no timeline at %s", path); }
    else if (ok) {
        while (fgets(line, sizeof line, f))
            if (n < cap && tl_parse(line, &ev[n])) n++;
        fclose(f);
    }
    for (r = 0; ok && r < world; r++)
        for (s = 0; ok && s < cfg.steps; s++) {
            const tl_ev *bwd = NULL, *exp_ = NULL;
            double fwd = -1, last_end = -1, first_comm = 1e300;
            int nb = 0, ne = 0, nc = 0;
            for (i = 0; i < n; i++) {
                const tl_ev *e = &ev[i];
                if (e->pid != r || e->step != s) continue;
                if (!strcmp(e->cat, "gpu_backward")) { bwd = e; nb++; ok &= e->tid == 1; }
                else if (!strcmp(e->cat, "gpu_exposed")) { exp_ = e; ne++; ok &= e->tid == 1; }
                else if (e->tid == 0 && (fwd < 0 || e->ts < fwd)) fwd = e->ts;   /* the step's first host event */
                else if (!strcmp(e->cat, "comm")) {
                    nc++;
                    if (e->ts < first_comm) first_comm = e->ts;
                    if (e->ts + e->dur > last_end) last_end = e->ts + e->dur;
                }
            }
            if (!ok || nb != 1 || ne != 1 || nc != res[r].buckets || fwd < 0) {
                snprintf(why, sizeof why, "rank %d step %d: %d backward (gpu), %d exposed (gpu), %d allreduces of %d buckets, "
                         "host events %s (all on tid 1: %s)", r, s, nb, ne, nc, res[r].buckets, fwd < 0 ? "missing" : "there", ok ? "yes" : "no");
                ok = 0;
                break;
            }
            /* 0.002 us: the trace prints 3 decimals */
            if (bwd->ts + 0.002 < fwd || bwd->ts > first_comm + 0.002 || bwd->dur < 0 ||
                fabs(exp_->ts - (bwd->ts + bwd->dur)) > 0.002 ||
                fabs(exp_->ts + exp_->dur - (last_end > bwd->ts + bwd->dur ? last_end : bwd->ts + bwd->dur)) > 0.004) {
                snprintf(why, sizeof why, "rank %d step %d: first host event at %.3f, backward (gpu) %.3f + %.3f, exposed (gpu) %.3f + %.3f, "
                         "allreduces %.3f .. %.3f", r, s, fwd, bwd->ts, bwd->dur, exp_->ts, exp_->dur, first_comm, last_end);
                ok = 0;
            }
            exposed_seen += exp_->dur > 0;
            if (ok && (int64_t)s == (int64_t)res[r].st.step - 1 && fabs(exp_->dur * 1e-3 - res[r].st.exposed_ms) > 1e-3) {
                snprintf(why, sizeof why, "rank %d step %d: exposed (gpu) %.3f us, ddp_last_step_stats %.4f ms", r, s, exp_->dur,
                         res[r].st.exposed_ms);
                ok = 0;
            }
        }
    if (ok && !exposed_seen) { ok = 0; snprintf(why, sizeof why, "no step left communication exposed (2 ms per bucket)"); }
    snprintf(name, sizeof name, "fake_nccl_ranks%d_timeline_gpu_backward_and_exposed_spans", world);
    verdict(ok, name, "%s", why);
    remove(path);
    free(ev);
    free(gpu);
    check_clean(name);
}

/* ---- sharded parameters (ZeRO-3, DDP_SHARD_PARAMETERS) on the NCCL backend: a model of three
   tanh layers and a head, a unit each, trained by one program (its forward gathers, prefetches
   and releases units; at DDP_SHARD_NONE those calls do nothing) at NONE and at PARAMETERS on
   fake NCCL: every step's norm and the parameters gathered to rank 0 the same bits; ddp_param
   never moves; after each step every released unit's granules that hold no part of this rank
   unmapped (not device memory for the fake), those that do mapped; while gathered all of the
   unit mapped; a collective or copy that touches a released unit counted as misuse; ---- */
enum { Z3_D = 64, Z3_LAYERS = 3, Z3_B = 3, Z3_STEPS = 4, Z3_UNUSED = 300, Z3_GRAN = 4096 };
typedef struct z3_config { const char *name; int micro, bf16, unused, own; float clip; } z3_config;
typedef struct z3_model {
    ddp_context *ddp;
    const z3_config *c;
    int rank, world;
    int W[Z3_LAYERS], b[Z3_LAYERS], head, unused, unit[Z3_LAYERS + 1];
    float act[Z3_B][Z3_LAYERS + 1][Z3_D], out[Z3_B], dact[Z3_B][Z3_LAYERS + 1][Z3_D];
} z3_model;
static struct {
    const z3_config *c;
    ddp_shard level;
    int group;   /* shard_group at a sharded level (hybrid), 0: none */
    int outer;   /* replica groups of one rank (desc.outer, DiLoCo H = 2) at every level: 1, 0: none */
    float norm[MAX_WORLD][Z3_STEPS];
    uint64_t hash[Z3_STEPS];
    ddp_result r[MAX_WORLD];
    char err[MAX_WORLD][DDP__ERR_MAX], local[MAX_WORLD][256];   /* local: a broken local property */
    size_t mapped_after, view_bytes;   /* rank 0 at PARAMETERS: the view's device bytes after the last step, reserved */
} z3;

static float z3_pv(z3_model *m, int id, size_t i) {
    return m->c->bf16 ? ddp__from_bf16(ddp_param_bf16(m->ddp, id)[i]) : ddp_param(m->ddp, id)[i];
}
static void z3_gadd(z3_model *m, int id, size_t i, float v) {
    if (m->c->bf16) { ddp_bf16 *g = ddp_grad_bf16(m->ddp, id); g[i] = ddp__to_bf16(ddp__from_bf16(g[i]) + v); }
    else ddp_grad(m->ddp, id)[i] += v;
}
typedef struct z3_op { z3_model *m; int layer; } z3_op;
static void z3_backward_op(void *p) {
    const z3_op *a = (const z3_op *)p;
    z3_model *m = a->m;
    int s, i, j, l = a->layer;
    if (l == Z3_LAYERS) {   /* out = head . act; loss = out^2 / 2 */
        for (s = 0; s < Z3_B; s++)
            for (i = 0; i < Z3_D; i++) {
                z3_gadd(m, m->head, (size_t)i, m->out[s] * m->act[s][Z3_LAYERS][i]);
                m->dact[s][Z3_LAYERS][i] = m->out[s] * z3_pv(m, m->head, (size_t)i);
            }
        return;
    }
    for (s = 0; s < Z3_B; s++) {
        float da[Z3_D];
        for (j = 0; j < Z3_D; j++) {
            float h = m->act[s][l + 1][j];
            da[j] = m->dact[s][l + 1][j] * (1.0f - h * h);
            z3_gadd(m, m->b[l], (size_t)j, da[j]);
            for (i = 0; i < Z3_D; i++) z3_gadd(m, m->W[l], (size_t)j * Z3_D + (size_t)i, da[j] * m->act[s][l][i]);
        }
        for (i = 0; i < Z3_D; i++) {
            float acc = 0;
            for (j = 0; j < Z3_D; j++) acc += z3_pv(m, m->W[l], (size_t)j * Z3_D + (size_t)i) * da[j];
            m->dact[s][l][i] = acc;
        }
    }
}

static void z3_local(z3_model *m, const char *fmt, const char *what, long x, long y) {
    if (!z3.local[m->rank][0]) snprintf(z3.local[m->rank], sizeof z3.local[m->rank], fmt, what, x, y);
}

/* [p, p + n) is device memory to the fake (its first and last byte: a granule is mapped whole). */
static int z3_is_device(const unsigned char *p, size_t n) {
    struct cudaPointerAttributes a, z;
    cudaPointerGetAttributes(&a, p);
    cudaPointerGetAttributes(&z, p + n - 1);
    return a.type == cudaMemoryTypeDevice && z.type == cudaMemoryTypeDevice;
}

/* Unit u's floats [lo, hi) in the flat buffer. */
static void z3_unit_range(z3_model *m, int u, size_t *lo, size_t *hi) {
    *lo = m->ddp->z3.units[u].lo;
    *hi = m->ddp->z3.units[u].hi;
}
/* Does this rank own a part of any bucket touching flat elements [a, z)? */
static int z3_owns_some(z3_model *m, size_t a, size_t z) {
    size_t lo, hi;
    int b;
    for (b = 0; b < m->ddp->model.num_buckets; b++) {
        ddp__shard_range(m->ddp, b, ddp__team_rank(m->ddp), &lo, &hi);
        if (hi > lo && lo < z && hi > a) return 1;
    }
    return 0;
}
/* Unit u's granules as the fake sees them: gathered, all device memory; released, exactly those
   holding a part of this rank (or of a gathered neighbour) stay. Returns the unit's granules unmapped. */
static int z3_check_granules(z3_model *m, int u, int gathered) {
    size_t es = m->c->bf16 ? 2 : 4, lo, hi, g0, g1, g, gone = 0;
    const unsigned char *base = m->ddp->z3.view;
    z3_unit_range(m, u, &lo, &hi);
    g0 = lo * es / Z3_GRAN;
    g1 = (hi * es + Z3_GRAN - 1) / Z3_GRAN;
    for (g = g0; g < g1; g++) {
        int mapped = z3_is_device(base + g * Z3_GRAN, Z3_GRAN);
        int want = gathered || z3_owns_some(m, g * Z3_GRAN / es, (g + 1) * Z3_GRAN / es) ||
                   (g == g0 && u > 0 && m->ddp->z3.units[u - 1].state != DDP__Z3_RELEASED) ||
                   (g == g1 - 1 && u < Z3_LAYERS && m->ddp->z3.units[u + 1].state != DDP__Z3_RELEASED);
        if (mapped != want) {
            z3_local(m, "%s: unit %ld granule %ld mapped when it should not be, or the reverse", m->c->name, u, (long)g);
            return -1;
        }
        gone += !mapped;
    }
    return (int)gone;
}

/* Layer l's forward (the head's: out). */
static void z3_layer_values(z3_model *m, int l) {
    int s, i, j;
    if (l < Z3_LAYERS)
        for (s = 0; s < Z3_B; s++)
            for (j = 0; j < Z3_D; j++) {
                float acc = z3_pv(m, m->b[l], (size_t)j);
                for (i = 0; i < Z3_D; i++) acc += z3_pv(m, m->W[l], (size_t)j * Z3_D + (size_t)i) * m->act[s][l][i];
                m->act[s][l + 1][j] = tanhf(acc);
            }
    else
        for (s = 0; s < Z3_B; s++) {
            float acc = 0;
            for (i = 0; i < Z3_D; i++) acc += z3_pv(m, m->head, (size_t)i) * m->act[s][Z3_LAYERS][i];
            m->out[s] = acc;
        }
}

static ddp_result z3_forward(z3_model *m, int step, int micro) {
    ddp_context *ddp = m->ddp;
    ddp_result r = DDP_OK;
    int s, i, l, sharded = ddp_config(ddp)->shard == DDP_SHARD_PARAMETERS;
    for (s = 0; s < Z3_B; s++)
        for (i = 0; i < Z3_D; i++)
            m->act[s][0][i] = test_value(1000 * (uint64_t)step + 10 * (uint64_t)micro + 100000 * (uint64_t)m->rank + (uint64_t)s, (uint64_t)i);
    for (l = 0; l <= Z3_LAYERS && r == DDP_OK; l++) {
        z3_op a;
        if ((r = ddp_unit_gather(ddp, m->unit[l])) != DDP_OK) break;
        if (l < Z3_LAYERS) r = ddp_unit_prefetch(ddp, m->unit[l + 1]);
        if (r == DDP_OK && sharded && z3_check_granules(m, m->unit[l], 1) != 0 && !z3.local[m->rank][0])
            z3_local(m, "%s: gathered unit %ld is not all device memory (step %ld)", m->c->name, l, step);
        if (r == DDP_OK) z3_layer_values(m, l);
        a.m = m; a.layer = l;
        if (!m->c->own && r == DDP_OK) {
            int ids[2];
            ids[0] = l < Z3_LAYERS ? m->W[l] : m->head;
            ids[1] = l < Z3_LAYERS ? m->b[l] : m->head;
            r = ddp_tape_record(ddp, z3_backward_op, &a, sizeof a, ids, l < Z3_LAYERS ? 2 : 1);
        }
        if (r == DDP_OK) r = ddp_unit_release(ddp, m->unit[l]);
    }
    return r;
}

/* The program's own backward: units gathered in reverse, released after their gradients. */
static ddp_result z3_own_backward(z3_model *m) {
    ddp_result r = DDP_OK;
    int l;
    for (l = Z3_LAYERS; l >= 0 && r == DDP_OK; l--) {
        z3_op a;
        a.m = m; a.layer = l;
        if ((r = ddp_unit_gather(m->ddp, m->unit[l])) != DDP_OK) break;
        if (l > 0 && (r = ddp_unit_prefetch(m->ddp, m->unit[l - 1])) != DDP_OK) break;
        z3_backward_op(&a);
        if (l == Z3_LAYERS) r = ddp_grad_ready(m->ddp, m->head);
        else if ((r = ddp_grad_ready(m->ddp, m->W[l])) == DDP_OK) r = ddp_grad_ready(m->ddp, m->b[l]);
        if (r == DDP_OK) r = ddp_unit_release(m->ddp, m->unit[l]);
    }
    return r == DDP_OK ? ddp_finish(m->ddp) : r;
}

static ddp_result z3_open(test_rank *self, z3_model *m, const z3_config *c, ddp_shard level) {
    ddp_desc d = test_desc(self);
    ddp_result r;
    int l;
    char name[32];
    static float init[MAX_WORLD][Z3_LAYERS + 1][Z3_D * Z3_D];   /* one each: ddp_commit reads them */
    memset(m, 0, sizeof *m);
    m->c = c;
    m->rank = self->rank;
    m->world = self->world;
    m->unused = -1;
    d.log = keep_errors; d.log_level = DDP_LOG_ERROR;
    d.backend = DDP_BACKEND_NCCL;
    d.bucket_cap_mb = 0.01;   /* buckets of ~2600 floats: a layer's unit is two */
    d.first_bucket_mb = 0.004;
    d.find_unused = c->unused;
    d.param_dtype = c->bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.shard = level;
    d.shard_group = level != DDP_SHARD_NONE ? z3.group : 0;
    if (z3.outer) { d.outer.mode = DDP_OUTER_DILOCO; d.outer.group_size = 1; d.outer.inner_steps = 2; }
    if ((r = ddp_init(&m->ddp, &d)) != DDP_OK) return r;
    for (l = 0; l <= Z3_LAYERS; l++) {
        size_t i;
        for (i = 0; i < Z3_D * Z3_D; i++) init[self->rank][l][i] = 0.2f * test_value(77 + (uint64_t)l, i);
    }
    for (l = 0; l < Z3_LAYERS && r == DDP_OK; l++) {
        snprintf(name, sizeof name, "layer%d.W", l);
        r = ddp_register_param(m->ddp, name, Z3_D * Z3_D, 0, init[self->rank][l], &m->W[l]);
        snprintf(name, sizeof name, "layer%d.b", l);
        if (r == DDP_OK) r = ddp_register_param(m->ddp, name, Z3_D, DDP_NO_DECAY, init[self->rank][Z3_LAYERS] + 100 * l, &m->b[l]);
        snprintf(name, sizeof name, "layer%d", l);
        if (r == DDP_OK) r = ddp_register_unit(m->ddp, name, m->W[l], 2, &m->unit[l]);
    }
    if (r == DDP_OK) r = ddp_register_param(m->ddp, "head", Z3_D, 0, init[self->rank][Z3_LAYERS] + 500, &m->head);
    if (r == DDP_OK && c->unused)
        r = ddp_register_param(m->ddp, "never.used", Z3_UNUSED, 0, init[self->rank][Z3_LAYERS] + 900, &m->unused);
    if (r == DDP_OK) r = ddp_register_unit(m->ddp, "head", m->head, c->unused ? 2 : 1, &m->unit[Z3_LAYERS]);
    return r == DDP_OK ? ddp_commit(m->ddp) : r;
}

static void z3_rank(test_rank *self) {
    const z3_config *c = z3.c;
    z3_model *m = (z3_model *)calloc(1, sizeof *m);
    ddp_adamw opt;
    ddp_result r;
    int step, u, k, sharded = z3.level == DDP_SHARD_PARAMETERS;
    const void *w0 = NULL;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.1f; opt.max_grad_norm = c->clip;
    r = z3_open(self, m, c, z3.level);
    if (r == DDP_OK) w0 = c->bf16 ? (const void *)ddp_param_bf16(m->ddp, m->W[1]) : (const void *)ddp_param(m->ddp, m->W[1]);
    for (step = 0; step < Z3_STEPS && r == DDP_OK; step++) {
        size_t n;
        float *all;
        if ((r = ddp_zero_grad(m->ddp)) != DDP_OK) break;
        for (u = 0; u < c->micro && r == DDP_OK; u++) {
            ddp_set_sync(m->ddp, u == c->micro - 1);
            if ((r = z3_forward(m, step, u)) == DDP_OK) r = c->own ? z3_own_backward(m) : ddp_backward(m->ddp);
        }
        if (r == DDP_OK) r = ddp_adamw_step(m->ddp, &opt, &z3.norm[self->rank][step]);
        if (r != DDP_OK) break;
        if (c->bf16) ddp_flat_grads_bf16(m->ddp, &n);
        else ddp_flat_grads(m->ddp, &n);
        all = (float *)calloc(n, sizeof(float));
        r = ddp_gather_to_host(m->ddp, DDP_PARAMS, 0, self->rank == 0 ? all : NULL, n, 0);
        if (self->rank == 0) z3.hash[step] = test_hash(all, n * sizeof(float));
        free(all);
        if ((c->bf16 ? (const void *)ddp_param_bf16(m->ddp, m->W[1]) : (const void *)ddp_param(m->ddp, m->W[1])) != w0)
            z3_local(m, "%s: ddp_param moved at step %ld (%ld)", c->name, step, 0);
        if (sharded && self->world > 1) {
            int gone = 0, g;
            for (k = 0; k <= Z3_LAYERS; k++) if ((g = z3_check_granules(m, k, 0)) > 0) gone += g;
            /* replica groups of one rank: every part is this rank's, nothing goes */
            if (gone == 0 && !z3.outer) z3_local(m, "%s: no granule of any released unit was unmapped (step %ld, %ld)", c->name, step, 0);
            if (gone > 0 && z3.outer) z3_local(m, "%s: %ld granule(s) unmapped in groups of one rank (step %ld)", c->name, gone, step);
        }
    }
    if (r == DDP_OK && sharded && self->rank == 0) {
        z3.mapped_after = ddp__gvm_mapped(m->ddp->impl.gpu->z3vm);
        z3.view_bytes = m->ddp->z3.view_bytes;
    }
    z3.r[self->rank] = r;
    snprintf(z3.err[self->rank], sizeof z3.err[self->rank], "%s", ddp_last_error(m->ddp));
    if (ddp_shutdown(m->ddp) != DDP_OK && z3.r[self->rank] == DDP_OK) z3.r[self->rank] = DDP_ERR_BACKEND;
    free(m);
}

/* group > 0: hybrid sharding (shard_group), whose average is hierarchical (the group's sum, then
   the groups'), another order than a flat one: the reference is then ZeRO-1 with the same groups,
   whose parameters are whole, and ZeRO-3 within the groups must give its bits (the same reduction,
   the same AdamW on the same parts; only where the parameters live differs). */
static void test_zero3_group(int world, const z3_config *c, int group, int outer) {
    float norm[Z3_STEPS];
    uint64_t hash[Z3_STEPS];
    char name[160], why[DDP__ERR_MAX + 128];
    int pass, r, ok = 1, step;
    why[0] = 0;
    for (pass = 0; pass < 2 && ok; pass++) {   /* 0: unsharded (hybrid: ZeRO-1), 1: DDP_SHARD_PARAMETERS */
        fakegpu_reset();
        fakegpu_set_vm_granularity(Z3_GRAN);
        if (world > 4) fakegpu_set_device_count(world);   /* a GPU a rank (the fake's default is 4) */
        reset_cfg();
        memset(&z3, 0, sizeof z3);
        z3.c = c;
        z3.group = group;
        z3.outer = outer;
        z3.level = pass ? DDP_SHARD_PARAMETERS : group ? DDP_SHARD_OPTIMIZER : DDP_SHARD_NONE;
        run(world, z3_rank);
        for (r = 0; r < world && ok; r++) {
            if (z3.r[r] != DDP_OK) {
                snprintf(why, sizeof why, "%s, rank %d: %s%s%.400s", pass ? "parameters" : "none", r, z3.err[r],
                         res[r].logged[0] ? "; ddp_shutdown: " : "", res[r].logged);
                ok = 0;
            } else if (z3.local[r][0]) {
                snprintf(why, sizeof why, "rank %d: %s", r, z3.local[r]);
                ok = 0;
            }
        }
        if (ok && pass == 0) { memcpy(norm, z3.norm[0], sizeof norm); memcpy(hash, z3.hash, sizeof hash); }
        for (step = 0; ok && pass == 1 && step < Z3_STEPS; step++)
            if (memcmp(&norm[step], &z3.norm[0][step], sizeof(float)) || hash[step] != z3.hash[step] || !hash[step]) {
                snprintf(why, sizeof why, "step %d: norm %.9g sharded, %.9g unsharded; hash %llx, %llx", step, z3.norm[0][step],
                         norm[step], (unsigned long long)z3.hash[step], (unsigned long long)hash[step]);
                ok = 0;
            }
        if (ok && pass == 1 && world > 1 && !z3.outer && !(z3.mapped_after > 0 && z3.mapped_after < z3.view_bytes)) {
            snprintf(why, sizeof why, "after the steps the view has %zu of %zu bytes mapped (want some, not all)", z3.mapped_after,
                     z3.view_bytes);
            ok = 0;
        }
        snprintf(name, sizeof name, "zero3_%s_ranks%d_%s", c->name, world, pass ? "parameters" : "none");
        check_clean(name);
    }
    if (outer) snprintf(name, sizeof name, "fake_nccl_zero3_%s_ranks%d_diloco_groups_of1_equals_unsharded_pointers_fixed", c->name, world);
    else if (group) snprintf(name, sizeof name, "fake_nccl_zero3_%s_ranks%d_groups_of%d_equals_hybrid_zero1_granules_released_pointers_fixed",
                        c->name, world, group);
    else snprintf(name, sizeof name, "fake_nccl_zero3_%s_ranks%d_equals_unsharded_granules_released_pointers_fixed", c->name, world);
    verdict(ok, name, "%s", why);
}
static void test_zero3(int world, const z3_config *c) { test_zero3_group(world, c, 0, 0); }

/* Misuse on NCCL: each of >>zero3's checks named; a copy from a released unit's memory is
   counted by the fake (it is no device memory); a checkpoint saved at PARAMETERS loads unsharded. */
static char z3_ck_path[64];
static int z3_contains(const char *s, const char *a, const char *b) { return strstr(s, a) && (!b || strstr(s, b)); }
static int z3_probe[MAX_WORLD] = { -1, -1, -1, -1 };   /* per rank: a unit its next backward op tries to release */
static ddp_result z3_probe_result[MAX_WORLD];
static char z3_probe_err[MAX_WORLD][DDP__ERR_MAX];
static void z3_probe_op(void *p) {
    z3_op *a = (z3_op *)p;
    if (a->layer == Z3_LAYERS && z3_probe[a->m->rank] >= 0) {
        z3_probe_result[a->m->rank] = ddp_unit_release(a->m->ddp, z3_probe[a->m->rank]);
        snprintf(z3_probe_err[a->m->rank], DDP__ERR_MAX, "%s", ddp_last_error(a->m->ddp));
    }
    z3_backward_op(p);
}
static void z3_misuse_rank(test_rank *self) {
    static const z3_config c = { "misuse", 1, 0, 0, 0, 0 };
    z3_model *m = (z3_model *)calloc(1, sizeof *m);
    ddp_adamw opt;
    ddp_result r, q;
    int ids[2], l, me = self->rank;
    z3_op a;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f;
    r = z3_open(self, m, &c, DDP_SHARD_PARAMETERS);
    if (r != DDP_OK) { z3.r[me] = r; snprintf(z3.err[me], DDP__ERR_MAX, "%s", ddp_last_error(m->ddp)); ddp_shutdown(m->ddp); free(m); return; }
    /* a recorded op whose unit is released */
    ids[0] = m->W[1]; ids[1] = m->b[1];
    a.m = m; a.layer = 1;
    q = ddp_tape_record(m->ddp, z3_backward_op, &a, sizeof a, ids, 2);
    if (me == 0) verdict(q == DDP_ERR_INVALID_STATE && z3_contains(ddp_last_error(m->ddp), "'layer1.W'", "unit 'layer1'"),
                         "fake_nccl_zero3_record_of_released_unit_named", "%s", ddp_last_error(m->ddp));
    ddp_tape_reset(m->ddp);
    q = ddp_unit_release(m->ddp, m->unit[0]);
    if (me == 0) verdict(q == DDP_ERR_INVALID_STATE && z3_contains(ddp_last_error(m->ddp), "'layer0'", "not gathered"),
                         "fake_nccl_zero3_release_of_released_named", "%s", ddp_last_error(m->ddp));
    /* the backward releasing a unit a later-replayed op still lists */
    r = ddp_zero_grad(m->ddp);
    for (l = 0; l <= Z3_LAYERS && r == DDP_OK; l++) {
        int n = l < Z3_LAYERS ? 2 : 1;
        if ((r = ddp_unit_gather(m->ddp, m->unit[l])) != DDP_OK) break;
        a.layer = l;
        ids[0] = l < Z3_LAYERS ? m->W[l] : m->head;
        ids[1] = l < Z3_LAYERS ? m->b[l] : m->head;
        z3_layer_values(m, l);
        r = ddp_tape_record(m->ddp, z3_probe_op, &a, sizeof a, ids, n);
        if (r == DDP_OK) r = ddp_unit_release(m->ddp, m->unit[l]);
    }
    z3_probe[me] = m->unit[0];   /* the head's op runs first: layer 0's ops are still to replay */
    if (r == DDP_OK) r = ddp_backward(m->ddp);
    z3_probe[me] = -1;
    if (me == 0) verdict(r == DDP_OK && z3_probe_result[0] == DDP_ERR_INVALID_STATE &&
                         z3_contains(z3_probe_err[0], "still in use by a recorded op", "'layer0'"),
                         "fake_nccl_zero3_release_of_unit_in_use_by_recorded_op_named", "%s / %s", ddp_result_string(r), z3_probe_err[0]);
    for (l = 0; l <= Z3_LAYERS && r == DDP_OK; l++)
        if (ddp_unit_gathered(m->ddp, m->unit[l]) != 0) r = DDP_ERR_INVALID_STATE;
    if (me == 0) verdict(r == DDP_OK, "fake_nccl_zero3_backward_releases_every_unit", "a unit is still gathered after ddp_backward");
    /* a gather without a release, then the step */
    if (r == DDP_OK && (r = ddp_unit_gather(m->ddp, m->unit[2])) == DDP_OK) {
        q = ddp_adamw_step(m->ddp, &opt, NULL);
        if (me == 0) verdict(q == DDP_ERR_INVALID_STATE && z3_contains(ddp_last_error(m->ddp), "'layer2'", "without a release"),
                             "fake_nccl_zero3_step_with_gathered_unit_named", "%s", ddp_last_error(m->ddp));
        r = ddp_unit_release(m->ddp, m->unit[2]);
    }
    if (r == DDP_OK) r = ddp_adamw_step(m->ddp, &opt, NULL);
    /* a copy of parameters outside this rank's parts: named; a raw copy from released memory: the fake's misuse */
    if (r == DDP_OK && self->world > 1) {
        float x[2];
        size_t n, g;
        ddp_flat_grads(m->ddp, &n);
        q = ddp_copy_to_host(m->ddp, DDP_PARAMS, me == 0 ? n - 2 : 0, x, 2);
        if (me == 0) verdict(q == DDP_ERR_INVALID_ARGUMENT && z3_contains(ddp_last_error(m->ddp), "the parameters (DDP_SHARD_PARAMETERS", NULL),
                             "fake_nccl_zero3_host_copy_outside_parts_named", "%s: %s", ddp_result_string(q), ddp_last_error(m->ddp));
        if (me == 0) {   /* a granule of the view that is not mapped now (every unit released) */
            int before = fakegpu_misuse_count();
            cudaError_t e = cudaSuccess;
            for (g = 0; g < m->ddp->z3.view_bytes / Z3_GRAN && z3_is_device(m->ddp->z3.view + g * Z3_GRAN, Z3_GRAN); g++) {}
            if (g < m->ddp->z3.view_bytes / Z3_GRAN)
                e = cudaMemcpy(x, m->ddp->z3.view + g * Z3_GRAN + 8, 2 * sizeof(float), cudaMemcpyDeviceToHost);
            verdict(g < m->ddp->z3.view_bytes / Z3_GRAN && e != cudaSuccess && fakegpu_misuse_count() == before + 1,
                    "fake_nccl_zero3_copy_from_released_unit_is_misuse", "granule %zu of %zu: cudaMemcpy %s, misuse %d -> %d", g,
                    m->ddp->z3.view_bytes / Z3_GRAN, cudaGetErrorName(e), before, fakegpu_misuse_count());
        }
    }
    /* a checkpoint saved here (PARAMETERS) */
    if (r == DDP_OK) r = ddp_save(m->ddp, z3_ck_path, NULL, 0);
    if (r == DDP_OK) {
        size_t n;
        float *all;
        ddp_flat_grads(m->ddp, &n);
        all = (float *)calloc(n, sizeof(float));
        r = ddp_gather_to_host(m->ddp, DDP_PARAMS, 0, me == 0 ? all : NULL, n, 0);
        if (me == 0) z3.hash[0] = test_hash(all, n * sizeof(float));
        free(all);
    }
    z3.r[me] = r;
    snprintf(z3.err[me], DDP__ERR_MAX, "%s", ddp_last_error(m->ddp));
    ddp_shutdown(m->ddp);
    free(m);
}

/* Loads the checkpoint unsharded (NCCL, DDP_SHARD_NONE): the parameters saved. */
static void z3_load_rank(test_rank *self) {
    static const z3_config c = { "load", 1, 0, 0, 0, 0 };
    z3_model *m = (z3_model *)calloc(1, sizeof *m);
    ddp_result r = z3_open(self, m, &c, DDP_SHARD_NONE);
    if (r == DDP_OK) r = ddp_load(m->ddp, z3_ck_path, NULL, 0, NULL, NULL, NULL);
    if (r == DDP_OK) {
        size_t n;
        float *all;
        ddp_flat_grads(m->ddp, &n);
        all = (float *)calloc(n, sizeof(float));
        r = ddp_gather_to_host(m->ddp, DDP_PARAMS, 0, self->rank == 0 ? all : NULL, n, 0);
        if (self->rank == 0) z3.hash[1] = test_hash(all, n * sizeof(float));
        free(all);
    }
    z3.r[self->rank] = r;
    snprintf(z3.err[self->rank], DDP__ERR_MAX, "%s", ddp_last_error(m->ddp));
    ddp_shutdown(m->ddp);
    free(m);
}

static void test_zero3_misuse(int world) {
    char why[DDP__ERR_MAX + 64];
    int r, ok = 1;
    snprintf(z3_ck_path, sizeof z3_ck_path, "/tmp/ddp_fake_z3_%d.ckpt", (int)getpid());
    fakegpu_reset();
    fakegpu_set_vm_granularity(Z3_GRAN);
    reset_cfg();
    memset(&z3, 0, sizeof z3);
    run(world, z3_misuse_rank);
    why[0] = 0;
    for (r = 0; r < world && ok; r++)
        if (z3.r[r] != DDP_OK) { snprintf(why, sizeof why, "rank %d: %s", r, z3.err[r]); ok = 0; }
    verdict(ok, "fake_nccl_zero3_misuse_run_completes", "%s", why);
    verdict(fakegpu_misuse_count() == (world > 1) && fakegpu_live_comms() == 0 && fakegpu_live_events() == 0 &&
            fakegpu_live_device_bytes() == 0, "fake_zero3_misuse_only_the_tests_own_nothing_leaked",
            "%d misuse(s) (first: %s), %d communicator(s), %d event(s), %zu device bytes left", fakegpu_misuse_count(),
            fakegpu_misuse_first(), fakegpu_live_comms(), fakegpu_live_events(), fakegpu_live_device_bytes());
    fakegpu_reset();   /* the misuse above was the test's own */
    fakegpu_set_vm_granularity(Z3_GRAN);
    reset_cfg();
    run(world, z3_load_rank);
    for (r = 0; r < world && ok; r++)
        if (z3.r[r] != DDP_OK) { snprintf(why, sizeof why, "load, rank %d: %s", r, z3.err[r]); ok = 0; }
    verdict(ok && z3.hash[0] && z3.hash[0] == z3.hash[1], "fake_nccl_zero3_checkpoint_loads_unsharded_bitwise", "%s (hash %llx saved, %llx loaded)",
            why, (unsigned long long)z3.hash[0], (unsigned long long)z3.hash[1]);
    check_clean("zero3_load");
    remove(z3_ck_path);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* the device address-space layer (>>nccl-vm) */
    run_small("fake_nccl_gvm_driver_without_vmm_named", 1, gvm_missing_rank);
    run_small("fake_nccl_gvm_map_unmap_refcounts_bytes_failed_map", 1, gvm_rank);
    /* ZeRO-2 on NCCL (the gradients' granules outside this rank's parts released after each step) */
    test_z2(1, 1, 0, 0, 0, 0, 4096);
    test_z2(2, 1, 0, 0, 0, 0, 4096);
    test_z2(3, 2, 0, 0, 1, 0, 4096);      /* accumulation, an unused parameter */
    test_z2(4, 1, 1, 0, 0, 0, 4096);      /* the bf16 wire */
    test_z2(2, 2, 0, 1, 1, 0, 4096);      /* bf16 parameters */
    test_z2(3, 1, 0, 1, 0, 0, 0);         /* bf16 parameters, the default 64 KiB granules */
    test_z2(2, 1, 0, 0, 0, 0, 0);
    test_z2(4, 1, 0, 0, 0, 2, 4096);      /* hybrid: shard groups of 2 */
    test_z2_outer(2, 1, 0, 0, 0, 0, 4096, 2);   /* DiLoCo, one group of every rank: sharded across it */
    test_z2_outer(2, 1, 0, 0, 0, 0, 4096, 1);   /* groups of one rank: nothing to shard */
    test_z2_checkpoint(2);
    test_z2_oom(2);
    test_z2_acc(1, 2, 0, 0, 0, 4096, 0);
    test_z2_acc(2, 2, 0, 0, 0, 4096, 0);
    test_z2_acc(3, 3, 0, 0, 1, 4096, 0);   /* an unused parameter */
    test_z2_acc(4, 2, 1, 0, 0, 4096, 0);   /* the bf16 wire */
    test_z2_acc(2, 3, 0, 1, 1, 4096, 0);   /* bf16 parameters (bf16 gradients) */
    test_z2_acc(3, 2, 0, 1, 0, 0, 0);      /* the default 64 KiB granules */
    test_z2_acc(2, 3, 0, 0, 0, 4096, 1);   /* a full device at ddp_set_sync */
    test_z2_acc_more(2, 2, 0, 1, 0, 4096, 0, 1, 0, 0);   /* bf16 parameters on an fp32 wire */
    test_z2_acc_more(3, 2, 0, 0, 0, 4096, 0, 0, 4, 0);   /* skip_nonfinite: a NaN in a micro-step skips the step */
    test_z2_acc_more(2, 3, 0, 0, 1, 4096, 0, 0, 0, 1);   /* the tape: ddp_backward maps the gradients back */
    /* (a) training equals the CPU backend */
    test_training(1, 1, 0, 0, 0);
    test_training(2, 1, 0, 0, 0);
    test_training(3, 1, 0, 0, 0);
    test_training(1, 2, 0, 0, 0);
    test_training(2, 2, 0, 0, 0);
    test_training(3, 2, 0, 0, 0);
    test_training(2, 1, 1, 0, 0);
    test_training(3, 2, 1, 0, 0);
    test_training(2, 1, 0, 3, 0);
    test_training(3, 2, 1, 4, 0);
    test_training(2, 1, 0, 0, 1);
    test_training(3, 1, 0, 0, 1);
    /* sharded: reduce-scatter, the norm's blocks, all-gather (the MLP: the tail path only) */
    test_training_shard(2, 1, 0, 0, 0, 1);
    test_training_shard(3, 2, 1, 3, 0, 1);
    test_shard_parts(2, 1, 0);
    test_shard_parts(3, 2, 0);
    test_shard_parts(4, 1, 1);
    test_shard_parts(1, 1, 0);
    /* hybrid sharding (shard_group): the group's reduce-scatter, the part across the groups */
    test_hybrid(4, 2, 2, 0, 0, 1);   /* fp32, accumulation, the timeline's two spans */
    test_hybrid(4, 2, 1, 1, 0, 0);   /* the bf16 wire */
    test_hybrid(4, 2, 2, 0, 1, 0);   /* bf16 parameters, fp32 on the wire (widened) */
    test_hybrid(6, 2, 1, 0, 0, 0);
    test_hybrid(6, 3, 2, 1, 0, 0);
    test_hybrid(6, 3, 1, 1, 1, 0);   /* bf16 parameters, bf16 on the wire */
    hybrid_cross_fails();
    hybrid_cross_init_never_completes();
    test_training_outer(2, 1, DDP_OUTER_DILOCO, DDP_WIRE_DEFAULT, 1, 0, 0, 0);
    test_training_outer(3, 1, DDP_OUTER_AVERAGE, DDP_WIRE_DEFAULT, 1, 0, 0, 1);
    test_training_outer(3, 1, DDP_OUTER_STREAMING, DDP_WIRE_INT8, 2, 1, 0.5f, 0);
    test_training_outer(4, 2, DDP_OUTER_DILOCO, DDP_WIRE_DEFAULT, 1, 0, 0, 0);    /* 2 groups of 2: fp32 buckets */
    test_training_outer(4, 2, DDP_OUTER_DILOCO, DDP_WIRE_INT8, 1, 0, 0, 1);       /* bf16 buckets */
    test_training_outer(4, 2, DDP_OUTER_STREAMING, DDP_WIRE_BF16, 2, 1, 0.5f, 1);
    test_training_outer(4, 2, DDP_OUTER_STREAMING, DDP_WIRE_FP32, 2, 0, 0, 0);
    test_outer_resume(2, DDP_OUTER_DILOCO, DDP_WIRE_DEFAULT, 1, 0, 0, 7);
    test_outer_resume(3, DDP_OUTER_STREAMING, DDP_WIRE_INT8, 2, 1, 0.5f, 8);   /* fragment 1: sent at inner step 8, lands after 9 */
    slow_nccl(2);
    slow_shutdown(2, 0);
    slow_shutdown(3, 0);
    /* (b)-(e) */
    run_small("fake_nccl_ranks1_collectives_copies_stats", 1, collectives_rank);
    run_small("fake_nccl_ranks2_collectives_copies_stats", 2, collectives_rank);
    run_small("fake_nccl_ranks3_collectives_copies_stats", 3, collectives_rank);
    run_small("fake_nccl_ranks1_nonfinite_named_or_reported_next_step", 1, nonfinite_rank);
    run_small("fake_nccl_ranks2_nonfinite_named_or_reported_next_step", 2, nonfinite_rank);
    auto_backend();
    checkpoints();
    /* (f), (g) faults */
    fault_inject(2, 6);
    fault_inject(3, 20);
    fault_inject(2, 0);
    fault_async_idle();
    fault_abort(2);
    fault_abort(3);
    fault_abort_in_group();
    fault_cancel(2);
    fault_cancel(3);
    fault_stop();
    fault_hold();
    init_never_completes();
    team_init_never_completes();
    duplicate_gpu();
    timeline_gpu_spans(1);
    timeline_gpu_spans(2);
    {   /* sharded parameters (ZeRO-3) */
        static const z3_config tape = { "tape", 1, 0, 0, 0, 0 }, accum = { "accum2", 2, 0, 0, 0, 0 },
                               bf16 = { "bf16", 1, 1, 0, 0, 0 }, clip = { "clip", 1, 0, 0, 0, 0.05f },
                               unused = { "unused", 1, 0, 1, 0, 0 }, own = { "own_autograd", 2, 0, 0, 1, 0 };
        int w;
        for (w = 1; w <= 4; w++) test_zero3(w, &tape);
        test_zero3(2, &accum);
        test_zero3(3, &bf16);
        test_zero3(4, &clip);
        test_zero3(3, &unused);
        test_zero3(2, &own);
        test_zero3_group(4, &clip, 2, 0);   /* hybrid: ZeRO-3 within shard groups */
        test_zero3_group(6, &accum, 3, 0);
        test_zero3_group(6, &bf16, 2, 0);
        test_zero3_group(2, &tape, 0, 1);   /* DiLoCo, each rank its own replica: nothing sharded */
        test_zero3_group(3, &bf16, 0, 1);
        test_zero3_misuse(2);
    }
    return test_summary("test_fake_nccl");
}
