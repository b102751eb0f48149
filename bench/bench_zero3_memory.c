/* bench_zero3_memory.c — a rank's resident memory per parameter at DDP_SHARD_NONE, OPTIMIZER and
   PARAMETERS (ZeRO-3), measured, not computed: the proportional set size (/proc/self/
   smaps_rollup's Pss: private pages, and the CPU backend's shared segment pages divided among
   the ranks that map them) after a first optimizer step with
   every unit released, minus the resident set before ddp_commit; and the peak while one unit is
   gathered. The model: PARAMS_MILLIONS fp32 parameters in 8 units of one parameter each; one
   step of the program's own backward (gradients written whole, ddp_grad_ready, ddp_finish) and
   ddp_adamw_step. The formula (CPU backend, fp32): NONE 4 + 4 + 8 = 16; OPTIMIZER 4 + 4 + 8/N;
   PARAMETERS 4/N + 4/N + 8/N = 16/N (+ 4 x a unit's share while it is gathered).
   One level a process (memory a run freed stays in the allocator's heap and would blur the next).
   Run: build/ddprun -n N build/bench_zero3_memory PARAMS_MILLIONS none|optimizer|parameters   (Linux) */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include <stdio.h>

enum { UNITS = 8 };

/* This rank's proportional set size: its private pages, and each shared page divided by the
   ranks that map it (a peer's gradients read by the in-place reduce-scatter count for both): the
   ranks' values add up to what the job holds. The plain RSS (statm) counts every shared page
   a rank touched in full, so N ranks' RSS add up to more than the machine gives them. */
static double rss_bytes(void) {
    char line[256];
    double kb = 0;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "Pss:", 4)) { kb = atof(line + 4); break; }
    if (f) fclose(f);
    return kb * 1024.0;
}

static int run(ddp_shard level, size_t params, double *per, double *peak_per) {
    ddp_context *ddp;
    ddp_desc d;
    ddp_adamw opt;
    double r0, r1, peak = 0;
    int k, ids[UNITS];
    size_t each = params / UNITS;
    memset(&d, 0, sizeof d);
    d.shard = level;
    if (ddp_init(&ddp, &d) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); return 1; }
    for (k = 0; k < UNITS; k++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", k);
        ddp_register_param(ddp, name, each, 0, NULL, &ids[k]);
        ddp_register_unit(ddp, name, ids[k], 1, NULL);
    }
    r0 = rss_bytes();
    if (ddp_commit(ddp) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 1; }
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f;
    ddp_zero_grad(ddp);
    for (k = UNITS - 1; k >= 0; k--) {   /* the backward: each unit gathered, its gradient written, released */
        float *g = ddp_grad(ddp, ids[k]);
        const float *p;
        size_t i;
        ddp_unit_gather(ddp, k);
        p = ddp_param(ddp, ids[k]);
        for (i = 0; i < each; i++) g[i] = 1e-3f * p[i] + 1e-4f;
        if (rss_bytes() > peak) peak = rss_bytes();
        ddp_grad_ready(ddp, ids[k]);
        ddp_unit_release(ddp, k);
    }
    if (ddp_finish(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) {
        fprintf(stderr, "%s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 1;
    }
    r1 = rss_bytes();
    if (r1 > peak) peak = r1;
    *per = (r1 - r0) / (double)params;
    *peak_per = (peak - r0) / (double)params;
    return ddp_shutdown(ddp) != DDP_OK;
}

int main(int argc, char **argv) {
    static const char *names[] = { "none", "optimizer", "parameters" };
    static const ddp_shard levels[] = { DDP_SHARD_NONE, DDP_SHARD_OPTIMIZER, DDP_SHARD_PARAMETERS };
    size_t params = (size_t)((argc > 1 ? atof(argv[1]) : 8.0) * 1e6) / UNITS / 16 * 16 * UNITS;
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    int rank = r ? atoi(r) : 0, world = w ? atoi(w) : 1, k;
    for (k = 0; k < 3; k++) {
        if (argc > 2 && strcmp(argv[2], names[k])) continue;
        double per = 0, peak = 0, n = world;
        double formula = k == 0 ? 16 : k == 1 ? 8 + 8 / n : 16 / n;
        if (run(levels[k], params, &per, &peak)) return 1;
        if (rank == 0)
            printf("N=%d %-10s formula %5.2f B/param | measured PSS after the step %5.2f B/param, peak (one unit gathered) %5.2f\n",
                   world, names[k], formula, per, peak);
    }
    return 0;
}
