/* bench_zero2_memory.c — what a rank really holds at each sharding level (NONE, OPTIMIZER = ZeRO-1,
   GRADIENTS = ZeRO-2), measured by the kernel, and the step time against NONE, in one run.
   Each level in turn, in this process: ddp_init, 8 tensors of PARAMS / 8 floats, ddp_commit, then
   STEPS steps (ddp_zero_grad, a "backward" that writes every gradient from its parameter, the last
   tensor first, with ddp_grad_ready after each, ddp_finish, ddp_adamw_step), ddp_shutdown. Read
   from /proc/self/smaps_rollup just before ddp_init (the baseline) and after the last step:
     Rss  pages mapped in this process (the CPU backend's shared segment counts every page this
          rank has touched, its peers' included: the reduce-scatter reads them)
     Pss  the same with each shared page divided among the processes that map it: a rank's share
          of the machine's memory, what the levels' formulas predict
   in bytes a parameter above the baseline; the peak Rss over the steps (VmHWM, reset through
   /proc/self/clear_refs before each level); the mean step time over steps 2..STEPS. Linux only.
   Run: build/ddprun -n N build/bench_zero2_memory [PARAMS_MILLIONS (8)] [STEPS (20)] [LEVEL]
   Without LEVEL the three levels run in turn in one process (the step times side by side; the
   memory of the later ones is understated: the allocator keeps pages of the earlier ones and
   hands them out again); with LEVEL (0 NONE, 1 OPTIMIZER, 2 GRADIENTS) only that one, whose
   memory is then its own: one process a level for the memory columns. */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

static void mem_now(double *rss, double *pss, double *hwm) {
    char line[256];
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    *rss = *pss = *hwm = 0;
    while (f && fgets(line, sizeof line, f)) {
        double kb;
        if (sscanf(line, "Rss: %lf kB", &kb) == 1) *rss = kb * 1024;
        else if (sscanf(line, "Pss: %lf kB", &kb) == 1) *pss = kb * 1024;
    }
    if (f) fclose(f);
    f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f)) {
        double kb;
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1) *hwm = kb * 1024;
    }
    if (f) fclose(f);
}

static void reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) { fputs("5", f); fclose(f); }
}

typedef struct level_result { double rss, pss, peak, step_ms; } level_result;

static level_result run_level(ddp_shard level, size_t params, int steps, int *world_out) {
    ddp_context *ddp;
    ddp_desc d;
    ddp_adamw opt;
    level_result out;
    double rss0, pss0, hwm0, rss, pss, hwm, t0 = 0;
    size_t per = params / 8, i;
    int k, ids[8], step;
    memset(&out, 0, sizeof out);
    memset(&d, 0, sizeof d);
    d.shard = level;
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f; opt.max_grad_norm = 1.0f;
    reset_peak();
    mem_now(&rss0, &pss0, &hwm0);
    if (ddp_init(&ddp, &d) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    for (k = 0; k < 8; k++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", k);
        if (ddp_register_param(ddp, name, per, 0, NULL, &ids[k]) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    }
    if (ddp_commit(ddp) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    for (step = 0; step < steps; step++) {
        if (step == 1) { ddp_barrier(ddp); t0 = ddp__now(); }
        if (ddp_zero_grad(ddp) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
        for (k = 7; k >= 0; k--) {
            const float *p = ddp_param(ddp, ids[k]);
            float *g = ddp_grad(ddp, ids[k]);
            for (i = 0; i < per; i++) g[i] += 1e-3f * p[i] + 1e-4f * (float)((i + (size_t)step) % 17);
            ddp_grad_ready(ddp, ids[k]);
        }
        if (ddp_finish(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); exit(1); }
    }
    ddp_barrier(ddp);
    out.step_ms = steps > 1 ? 1e3 * (ddp__now() - t0) / (steps - 1) : 0;
    mem_now(&rss, &pss, &hwm);
    out.rss = (rss - rss0) / (double)(8 * per);
    out.pss = (pss - pss0) / (double)(8 * per);
    out.peak = (hwm - rss0) / (double)(8 * per);
    *world_out = ddp_world_size(ddp);
    ddp_shutdown(ddp);
    return out;
}

int main(int argc, char **argv) {
    static const ddp_shard levels[3] = { DDP_SHARD_NONE, DDP_SHARD_OPTIMIZER, DDP_SHARD_GRADIENTS };
    static const char *const names[3] = { "NONE", "OPTIMIZER (ZeRO-1)", "GRADIENTS (ZeRO-2)" };
    size_t params = (size_t)((argc > 1 ? atof(argv[1]) : 8.0) * 1e6);
    int steps = argc > 2 ? atoi(argv[2]) : 20, world = 1, rank = -1, l;
    level_result res[3];
    const char *r = getenv("RANK");
    if (r) rank = atoi(r);
    if (argc > 3) {   /* one level in this process: its memory alone (a level run before would leave the allocator's pages) */
        l = atoi(argv[3]);
        if (l < 0 || l > 2) { fprintf(stderr, "LEVEL: 0 NONE, 1 OPTIMIZER, 2 GRADIENTS\n"); return 2; }
        res[l] = run_level(levels[l], params, steps, &world);
        if (rank <= 0)
            printf("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", world, names[l],
                   l == 0 ? 16.0 : l == 1 ? 8 + 8.0 / world : 4 + 12.0 / world, res[l].pss, res[l].rss, res[l].peak, res[l].step_ms);
        return 0;
    }
    for (l = 0; l < 3; l++) res[l] = run_level(levels[l], params, steps, &world);
    if (rank <= 0) {
        double n = (double)world;
        const double formula[3] = { 16, 8 + 8 / n, 4 + 12 / n };
        printf("rank 0 of %d, %.1fM fp32 parameters, %d steps\n", world, (double)params / 1e6, steps);
        printf("| level | formula B/param | Pss B/param | Rss B/param | peak Rss B/param | step ms | vs NONE |\n|---|---|---|---|---|---|---|\n");
        for (l = 0; l < 3; l++)
            printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %+.1f%% |\n", names[l], formula[l], res[l].pss, res[l].rss, res[l].peak,
                   res[l].step_ms, 100.0 * (res[l].step_ms / res[0].step_ms - 1));
        fflush(stdout);
    }
    return 0;
}
