/* bench_adamw_guard — what the bf16 misuse guard costs in the CPU AdamW pass.

     build/bench_adamw_guard [--n 4M] [--reps 40]

   ddp.h's bf16 AdamW loop (ddp__adamw_range_bf16: the fp32 master updated from the bf16
   gradients, the working copy rounded in the same pass) compares each working copy with its
   master rounded before the update, to name a lone write of one of the two (PARAMETER DTYPE).
   This times that loop against the same loop without the comparison, alternating the two on the
   same buffers in one process (the machine's noise hits both alike), and prints the median and
   minimum of each and their ratio:
     adamw_guard n=4194304 reps=40 guarded_ms=... unguarded_ms=... (min ... / ...) ratio=...
   The unguarded loop below is the library's with the comparison left out; keep the two in step. */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void adamw_unguarded(float *p, ddp_bf16 *w, const ddp_bf16 *g, float *m, float *v, size_t n, float clip, float lr,
                            float b1, float b2, float eps, float decay, float step_size, float bc2_sqrt) {
    size_t i;
    for (i = 0; i < n; i++) {
        float grad = ddp__from_bf16(g[i]) * clip;
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        p[i] -= lr * decay * p[i];
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        w[i] = ddp__to_bf16(p[i]);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t n = (size_t)4 << 20, i, bad = 0;
    int reps = 40, k;
    float *p, *m, *v;
    ddp_bf16 *w, *g;
    double *tg, *tu;
    for (k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--n") && k + 1 < argc) {
            char *end;
            double x = strtod(argv[++k], &end);
            n = (size_t)(x * (*end == 'M' ? 1048576.0 : *end == 'K' ? 1024.0 : 1.0));
        } else if (!strcmp(argv[k], "--reps") && k + 1 < argc) reps = atoi(argv[++k]);
        else { fprintf(stderr, "usage: %s [--n 4M] [--reps 40]\n", argv[0]); return 2; }
    }
    if (n == 0 || reps < 1) { fprintf(stderr, "bench_adamw_guard: --n and --reps must be positive\n"); return 2; }
    p = (float *)malloc(n * sizeof(float)); m = (float *)calloc(n, sizeof(float)); v = (float *)calloc(n, sizeof(float));
    w = (ddp_bf16 *)malloc(n * sizeof(ddp_bf16)); g = (ddp_bf16 *)malloc(n * sizeof(ddp_bf16));
    tg = (double *)malloc((size_t)reps * sizeof(double)); tu = (double *)malloc((size_t)reps * sizeof(double));
    if (!p || !m || !v || !w || !g || !tg || !tu) { fprintf(stderr, "bench_adamw_guard: out of memory\n"); return 1; }
    for (i = 0; i < n; i++) {
        p[i] = 0.01f * (float)((i * 2654435761u) % 2001) - 10.0f;
        w[i] = ddp__to_bf16(p[i]);
        g[i] = ddp__to_bf16(1e-3f * (float)((i * 40503u) % 1001) - 0.5f);
    }
    for (k = 0; k < reps; k++) {   /* alternate, the guarded one first on even reps, second on odd */
        int j;
        for (j = 0; j < 2; j++) {
            int guarded = (j + k) % 2 == 0;
            double t0 = now_ms();
            if (guarded) bad += ddp__adamw_range_bf16(p, w, g, m, v, n, 1.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1e-2f, 0.5f);
            else adamw_unguarded(p, w, g, m, v, n, 1.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1e-2f, 0.5f);
            (guarded ? tg : tu)[k] = now_ms() - t0;
        }
    }
    qsort(tg, (size_t)reps, sizeof *tg, cmp_double);
    qsort(tu, (size_t)reps, sizeof *tu, cmp_double);
    printf("adamw_guard n=%zu reps=%d guarded_ms=%.3f unguarded_ms=%.3f (min %.3f / %.3f) ratio=%.3f diverged=%zu\n", n, reps,
           tg[reps / 2], tu[reps / 2], tg[0], tu[0], tg[reps / 2] / tu[reps / 2], bad);
    free(p); free(m); free(v); free(w); free(g); free(tg); free(tu);
    return bad != 0;   /* the copies always agreed: the guard must have found nothing */
}
