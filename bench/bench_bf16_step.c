/* bench_bf16_step — ddp.h's part of a training step of a model with bf16 parameters
   (param_dtype BF16: bf16 working copies and gradients, fp32 master, m, v).

     build/ddprun -n 2 build/bench_bf16_step [--params 16M] [--tensors 16] [--steps 20] [--reduce bf16|fp32]

   A step: ddp_zero_grad; the "backward" writes every tensor's bf16 gradients (a constant, not
   timed as the library's) and marks it ready, last tensor first, so buckets launch while it goes
   on; ddp_finish; ddp_adamw_step with clipping (the norm is computed every step). Printed by rank
   0, the median over the steps after 3 warm-up steps of the slowest rank's times:
     bf16_step ranks=2 params=16777216 reduce=bf16 backward_ms=... finish_ms=... adamw_ms=... library_ms=... step_ms=...
   library_ms = step_ms - backward_ms: zero, launches, the wait in finish and the optimizer step.
   It uses only the public API, so the same file builds against another version of ddp.h (to
   compare two versions interleaved on one machine). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STEPS 1000

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void die(ddp_context *ctx, const char *what, ddp_result r) {
    fprintf(stderr, "bench_bf16_step: rank %d: %s failed: %s: %s\n", ctx ? ddp_rank(ctx) : -1, what, ddp_result_string(r),
            ctx ? ddp_last_error(ctx) : "");
    if (ctx) ddp_shutdown(ctx);
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The slowest rank's value (every rank contributes its own slot of a zeroed vector: exact). */
static double slowest(ddp_context *ctx, double v) {
    float slot[64];
    int w = ddp_world_size(ctx), s;
    double m = 0;
    ddp_result r;
    memset(slot, 0, sizeof slot);
    slot[ddp_rank(ctx)] = (float)v;
    if ((r = ddp_allreduce(ctx, slot, (size_t)w, DDP_SUM)) != DDP_OK) die(ctx, "ddp_allreduce", r);
    for (s = 0; s < w; s++) if (slot[s] > m) m = slot[s];
    return m;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static size_t parse_count(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1048576;
    return (size_t)v;
}

int main(int argc, char **argv) {
    static double t_back[MAX_STEPS], t_finish[MAX_STEPS], t_adamw[MAX_STEPS], t_step[MAX_STEPS], t_lib[MAX_STEPS];
    size_t params = (size_t)16 << 20, per, i;
    int tensors = 16, steps = 20, fp32_reduce = 0, k, s, n = 0, *ids;
    ddp_context *ctx = NULL;
    ddp_desc desc;
    ddp_adamw opt;
    ddp_result r;
    for (k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--params") && k + 1 < argc) params = parse_count(argv[++k]);
        else if (!strcmp(argv[k], "--tensors") && k + 1 < argc) tensors = atoi(argv[++k]);
        else if (!strcmp(argv[k], "--steps") && k + 1 < argc) steps = atoi(argv[++k]);
        else if (!strcmp(argv[k], "--reduce") && k + 1 < argc) fp32_reduce = !strcmp(argv[++k], "fp32");
        else {
            fprintf(stderr, "usage: %s [--params 16M] [--tensors 16] [--steps 20] [--reduce bf16|fp32]\n", argv[0]);
            return 2;
        }
    }
    if (tensors < 1 || steps < 4 || steps + 3 > MAX_STEPS || params < (size_t)tensors) {
        fprintf(stderr, "bench_bf16_step: --tensors >= 1, 4 <= --steps <= %d, --params >= --tensors\n", MAX_STEPS - 3);
        return 2;
    }
    per = params / (size_t)tensors;
    memset(&desc, 0, sizeof desc);
    desc.param_dtype = DDP_DTYPE_BF16;
    desc.reduce_dtype = fp32_reduce ? DDP_DTYPE_FP32 : DDP_DTYPE_BF16;
    if ((r = ddp_init(&ctx, &desc)) != DDP_OK) die(ctx, "ddp_init", r);
    if (ddp_world_size(ctx) > 64) die(ctx, "more than 64 ranks", DDP_ERR_INVALID_ARGUMENT);
    if (!(ids = (int *)malloc(sizeof(int) * (size_t)tensors))) die(ctx, "malloc", DDP_ERR_OUT_OF_MEMORY);
    for (k = 0; k < tensors; k++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", k);
        if ((r = ddp_register_param(ctx, name, per, 0, NULL, &ids[k])) != DDP_OK) die(ctx, "ddp_register_param", r);
    }
    if ((r = ddp_commit(ctx)) != DDP_OK) die(ctx, "ddp_commit", r);
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f; opt.weight_decay = 0.1f; opt.max_grad_norm = 1.0f;
    for (s = 0; s < steps + 3; s++) {
        double t0, tb = 0, t1, t2, t3;
        if ((r = ddp_barrier(ctx)) != DDP_OK) die(ctx, "ddp_barrier", r);
        t0 = now_ms();
        if ((r = ddp_zero_grad(ctx)) != DDP_OK) die(ctx, "ddp_zero_grad", r);
        for (k = tensors - 1; k >= 0; k--) {   /* the backward: gradients written, then ready */
            ddp_bf16 *g = ddp_grad_bf16(ctx, ids[k]);
            double b0 = now_ms();
            for (i = 0; i < per; i++) g[i] = (ddp_bf16)(0x3c00 + ((i + (size_t)ddp_rank(ctx)) & 0xff));   /* ~0.008 */
            tb += now_ms() - b0;
            if ((r = ddp_grad_ready(ctx, ids[k])) != DDP_OK) die(ctx, "ddp_grad_ready", r);
        }
        t1 = now_ms();
        if ((r = ddp_finish(ctx)) != DDP_OK) die(ctx, "ddp_finish", r);
        t2 = now_ms();
        if ((r = ddp_adamw_step(ctx, &opt, NULL)) != DDP_OK) die(ctx, "ddp_adamw_step", r);
        t3 = now_ms();
        if (s < 3) continue;
        t_back[n] = slowest(ctx, tb);
        t_finish[n] = slowest(ctx, t2 - t1);
        t_adamw[n] = slowest(ctx, t3 - t2);
        t_step[n] = slowest(ctx, t3 - t0);
        t_lib[n] = slowest(ctx, t3 - t0 - tb);
        n++;
    }
    if (ddp_rank(ctx) == 0)
        printf("bf16_step ranks=%d params=%zu reduce=%s backward_ms=%.2f finish_ms=%.2f adamw_ms=%.2f library_ms=%.2f step_ms=%.2f\n",
               ddp_world_size(ctx), per * (size_t)tensors, fp32_reduce ? "fp32" : "bf16", median(t_back, n),
               median(t_finish, n), median(t_adamw, n), median(t_lib, n), median(t_step, n));
    free(ids);
    if ((r = ddp_shutdown(ctx)) != DDP_OK) { fprintf(stderr, "bench_bf16_step: ddp_shutdown: %s\n", ddp_result_string(r)); return 1; }
    return 0;
}
