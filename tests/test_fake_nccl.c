/* test_fake_nccl.c — ddp.h's NCCL backend RUN without a GPU: the implementation compiled by the
   C compiler with -DDDP_CUDA against tests/fakegpu (a host emulation of the CUDA runtime and of
   NCCL, ranks as threads of one process; see tests/fakegpu/fakegpu.h for what it emulates and
   what it does not). It proves the backend's host logic: set-up, buckets, the order of
   enqueues, the AdamW launches and their arguments, user collectives, host copies, stats,
   non-finite gradients, the watchdog, timeouts, aborts and shutdown. It proves nothing about
   the CUDA kernels on a GPU or about real NCCL.
   Checks:
   - training the MLP of tests/test_equivalence.c on 1, 2 and 3 thread-ranks on the NCCL backend
     ends with the same bits as the same training on the CPU backend (single for 1 rank), with
     accumulation, bf16 buckets, clipping and the norm read back on some steps; with NCCL's
     pre-multiplied ncclAvg, the same bits on 2 ranks and a stated bound on 3;
   - user collectives on device and host buffers, host copies of every flat buffer, step stats;
   - non-finite gradients, named by the step with grad_norm_out, reported by the next without;
   - faults: an asynchronous NCCL error on one rank, a rank that aborts its communicator, a rank
     that stops, a GPU that stops (events never complete) — every rank fails with a named error
     within seconds, nothing hangs, shutdown is fast; set-up that completes late, that never
     completes (the timeout names the ranks), two ranks on one GPU;
   - the fake saw no misuse of the CUDA or NCCL API (wrong pointers, devices, destroyed handles)
     and nothing leaked (communicators, events, device memory). */
#define main test_equivalence_main   /* its model, data and CPU ops */
#include "test_equivalence.c"
#undef main
#include "fakegpu/fakegpu.h"

#define MAX_WORLD 4

typedef struct result {
    ddp_result r, shut;
    int fail_step;
    char err[DDP__ERR_MAX];
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
    double timeout_s;
    int abort_rank, abort_step;    /* that rank aborts its communicator before that step */
    int hold_rank, hold_step;      /* that rank's GPU stops before that step */
    int stop_rank, stop_step;      /* that rank stops stepping (sleeps) at that step */
    int inject_comm_ms;
} cfg;
static result res[MAX_WORLD];

static double t_start;

static void reset_cfg(void) {
    int r;
    memset(&cfg, 0, sizeof cfg);
    cfg.backend = DDP_BACKEND_NCCL;
    cfg.micro = 1;
    cfg.steps = STEPS;
    cfg.abort_rank = cfg.hold_rank = cfg.stop_rank = -1;
    for (r = 0; r < MAX_WORLD; r++) { free(res[r].params); memset(&res[r], 0, sizeof res[r]); }
}

static ddp_result train_step(mlp *m, int step, int first, int count, int micro, float *norm) {
    ddp_adamw opt;
    ddp_result r;
    int u, i, n = count / micro;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.05f; opt.max_grad_norm = 1.0f;   /* as mlp_step */
    if ((r = ddp_zero_grad(m->ddp)) != DDP_OK) return r;
    for (u = 0; u < micro; u++) {
        /* the fake's device memory is host memory: the CPU ops read parameters and write
           gradients in place, as kernels on the compute stream would */
        for (i = 0; i < n; i++) make_example(step, first + u * n + i, m->x + i * IN, &m->label[i]);
        ddp_set_sync(m->ddp, u == micro - 1);
        linear(m->ddp, m->w1, m->b1, m->x, m->h, n, IN, HID, NULL, m->dh);
        tanh_op(m->ddp, m->h, m->a, (size_t)n * HID, m->da, m->dh);
        linear(m->ddp, m->w2, m->b2, m->a, m->z, n, HID, CLASSES, m->da, m->dz);
        cross_entropy(m->z, m->label, m->dz, n, 1.0f / (float)micro);
        if ((r = ddp_backward(m->ddp)) != DDP_OK) return r;
    }
    return ddp_adamw_step(m->ddp, &opt, norm);
}

static void train_rank(test_rank *self) {
    result *out = &res[self->rank];
    ddp_desc d = test_desc(self);
    ddp_context *ctx = NULL;
    mlp *m = (mlp *)calloc(1, sizeof *m);
    int step, n = GLOBAL_BATCH / self->world;
    double t0;
    d.backend = cfg.backend;
    d.bucket_cap_mb = 0.004;   /* several buckets for this small model */
    d.first_bucket_mb = 0.001;
    d.reduce_dtype = cfg.bf16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
    d.inject_comm_latency_ms = cfg.inject_comm_ms;
    if (cfg.timeout_s > 0) d.timeout_s = cfg.timeout_s;
    out->fail_step = -1;
    out->r = ddp_init(&ctx, &d);
    if (out->r == DDP_OK) out->r = mlp_init(m, ctx);
    for (step = 0; out->r == DDP_OK && step < cfg.steps; step++) {
        float norm = 0;
        if (self->rank == cfg.hold_rank && step == cfg.hold_step) fakegpu_hold_device(ctx->gpu->device, 1);
        if (self->rank == cfg.abort_rank && step == cfg.abort_step) ddp__gpu_abort(ctx);   /* as the watchdog does */
        if (self->rank == cfg.stop_rank && step == cfg.stop_step) {
            while (!ddp__failed(ctx)) usleep(1000);   /* a rank that hangs: until its peers give up */
            out->r = ddp__failed(ctx);
            break;
        }
        out->r = train_step(m, step, self->rank * n, n, cfg.micro, cfg.norm_every && step % cfg.norm_every == 0 ? &norm : NULL);
        if (out->r != DDP_OK) out->fail_step = step;
    }
    out->t_fail = ddp__now() - t_start;
    if (out->r == DDP_OK) {
        out->count = ddp_flat_params(ctx, NULL) ? 0 : 0;
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
            snprintf(why, cap, "rank %d: %s", r, res[r].err);
            return 0;
        }
        if (!res[r].same_as_rank0) { snprintf(why, cap, "rank %d's parameters differ from rank 0's", r); ok = 0; }
    }
    *params = res[0].params;
    *count = res[0].count;
    res[0].params = NULL;
    return ok;
}

static void test_training(int world, int micro, int bf16, int norm_every, int premul) {
    float *gpu = NULL, *cpu = NULL;
    size_t ng = 0, nc = 0, i, differ = 0;
    double worst = 0, tol_abs = 2e-6, tol_rel = 2e-5;
    char name[160], why[DDP__ERR_MAX + 64];
    ddp_step_stats st;
    int ok, buckets;
    fakegpu_reset();
    fakegpu_set_avg_premul(premul);
    reset_cfg();
    cfg.micro = micro; cfg.bf16 = bf16; cfg.norm_every = norm_every;
    snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s%s%s_trains", world, micro, bf16 ? "_bf16" : "",
             norm_every ? "_norm" : "", premul ? "_premul" : "");
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
        snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s%s%s_bitwise_equals_cpu_backend", world, micro, bf16 ? "_bf16" : "",
                 norm_every ? "_norm" : "", premul ? "_premul" : "");
        verdict(differ == 0, name, "%zu of %zu parameters differ (worst %.3f of |err| <= %g + %g*|ref|)", differ, ng, worst,
                tol_abs, tol_rel);
    }
    snprintf(name, sizeof name, "fake_nccl_ranks%d_accum%d%s_stats", world, micro, bf16 ? "_bf16" : "");
    verdict(st.step == (int64_t)STEPS * micro && st.buckets_launched == buckets && buckets > 2, name,
            "step %lld (want %d), %d of %d buckets", (long long)st.step, STEPS * micro, st.buckets_launched, buckets);
    free(gpu);
    free(cpu);
    snprintf(name, sizeof name, "train_ranks%d_accum%d%s", world, micro, bf16 ? "_bf16" : "");
    check_clean(name);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_training(1, 1, 0, 0, 0);
    test_training(2, 1, 0, 0, 0);
    return test_summary("test_fake_nccl");
}
