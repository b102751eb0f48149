/* bench_adamw_guard — what the bf16 misuse guard costs in the CPU AdamW pass.

     build/bench_adamw_guard [--n 4M] [--reps 40]

   ddp.h's bf16 AdamW loop (ddp__adamw_range_bf16: the fp32 master updated from the bf16
   gradients, the working copy rounded in the same pass) compares each working copy with its
   master rounded before the update, to name a lone write of one of the two (PARAMETER DTYPE).
   This times three loops in turn on the same buffers in one process (the machine's noise hits
   all alike): the library's; the same without the comparison (the guard's cost); the library's
   without __restrict on its buffers (as it was before), and prints each one's median and minimum:
     adamw_guard n=4194304 reps=40 library_ms=... unguarded_ms=... unrestricted_ms=... (min ...) guard=+..% restrict=x..
   The two other loops are the library's with one thing left out; keep them in step with it. */
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

typedef size_t (*adamw_fn)(float *p, ddp_bf16 *w, const ddp_bf16 *g, float *m, float *v, size_t n, float clip, float lr,
                           float b1, float b2, float eps, float decay, float step_size, float bc2_sqrt);


/* The library's loop without the comparison; and (as the loop was before __restrict) with it,
   without __restrict. noinline, and all called through a volatile pointer below: none is
   inlined into main, where the compiler would see distinct buffers and vectorize it otherwise. */
#define ADAMW_BODY                                                            \
    float grad = ddp__from_bf16(g[i]) * clip;                                 \
    m[i] = b1 * m[i] + (1.0f - b1) * grad;                                    \
    v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;                             \
    p[i] -= lr * decay * p[i];                                                \
    p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);                \
    w[i] = ddp__to_bf16(p[i]);
__attribute__((noinline)) static size_t adamw_unguarded(float *DDP__RESTRICT p, ddp_bf16 *DDP__RESTRICT w,
                                                         const ddp_bf16 *DDP__RESTRICT g, float *DDP__RESTRICT m,
                                                         float *DDP__RESTRICT v, size_t n, float clip, float lr, float b1,
                                                         float b2, float eps, float decay, float step_size, float bc2_sqrt) {
    size_t i;
    for (i = 0; i < n; i++) { ADAMW_BODY }
    return 0;
}
__attribute__((noinline)) static size_t adamw_unrestricted(float *p, ddp_bf16 *w, const ddp_bf16 *g, float *m, float *v, size_t n,
                                                            float clip, float lr, float b1, float b2, float eps, float decay,
                                                            float step_size, float bc2_sqrt) {
    size_t i, diverged = 0;
    for (i = 0; i < n; i++) { diverged += w[i] != ddp__to_bf16(p[i]); ADAMW_BODY }
    return diverged;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    static const char *names[3] = { "library", "unguarded", "unrestricted" };
    size_t n = (size_t)4 << 20, i, bad = 0;
    int reps = 40, k, j;
    float *p, *m, *v;
    ddp_bf16 *w, *g;
    double *t[3], med[3], lo[3];
    adamw_fn volatile fns[3] = { ddp__adamw_range_bf16, adamw_unguarded, adamw_unrestricted };
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
    for (j = 0; j < 3; j++) t[j] = (double *)malloc((size_t)reps * sizeof(double));
    if (!p || !m || !v || !w || !g || !t[0] || !t[1] || !t[2]) { fprintf(stderr, "bench_adamw_guard: out of memory\n"); return 1; }
    for (i = 0; i < n; i++) {
        p[i] = 0.01f * (float)((i * 2654435761u) % 2001) - 10.0f;
        w[i] = ddp__to_bf16(p[i]);
        g[i] = ddp__to_bf16(1e-3f * (float)((i * 40503u) % 1001) - 0.5f);
    }
    for (k = 0; k < reps; k++)   /* in turn, starting with a different one each rep */
        for (j = 0; j < 3; j++) {
            int f = (j + k) % 3;
            double t0 = now_ms();
            bad += fns[f](p, w, g, m, v, n, 1.0f, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1e-2f, 0.5f);
            t[f][k] = now_ms() - t0;
        }
    for (j = 0; j < 3; j++) {
        qsort(t[j], (size_t)reps, sizeof(double), cmp_double);
        med[j] = t[j][reps / 2];
        lo[j] = t[j][0];
    }
    printf("adamw_guard n=%zu reps=%d", n, reps);
    for (j = 0; j < 3; j++) printf(" %s_ms=%.3f", names[j], med[j]);
    printf(" (min %.3f %.3f %.3f) guard=%+.1f%% restrict=x%.2f diverged=%zu\n", lo[0], lo[1], lo[2],
           100.0 * (med[0] / med[1] - 1.0), med[2] / med[0], bad);
    free(p); free(m); free(v); free(w); free(g);
    for (j = 0; j < 3; j++) free(t[j]);
    return bad != 0;   /* the copies always agreed: the guard must have found nothing */
}
