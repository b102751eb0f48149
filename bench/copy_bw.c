/* copy_bw — the single-core memcpy bandwidth the allreduce tables are measured against.

     build/copy_bw [--sizes 64K,256K,1M,...] [--target-s 0.2] [--passes 5]

   For each size S (bytes) it copies one buffer of S bytes into another (both allocated once and
   touched first, so no page fault is timed), calibrates an iteration count that takes about
   --target-s, and keeps the best of --passes timed runs. One line per size:
     copy bytes=26214400 iters=40 time_us=1234.5 gbps=21.23
   gbps = S / time in GB/s (1e9): bytes *copied* per second (each is read once and written once).
   Small sizes run from cache, as an allreduce of that size does; large ones from memory. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_sizes.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


/* Time `iters` copies of `bytes`; the two buffers swap roles so neither stays only read. */
static double time_copies(unsigned char *a, unsigned char *b, size_t bytes, long iters) {
    double t0 = now_s();
    long i;
    for (i = 0; i < iters; i++) {
        memcpy((i & 1) ? a : b, (i & 1) ? b : a, bytes);
        __asm__ __volatile__("" ::: "memory");   /* keep every copy */
    }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    const char *sizes = default_sizes;
    size_t list[BENCH_MAX_SIZES];
    double target_s = 0.2;
    int passes = 5, i, n, k;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "--target-s") && i + 1 < argc) target_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else { fprintf(stderr, "copy_bw: unknown argument '%s' (usage: copy_bw [--sizes LIST] [--target-s S] [--passes N])\n", argv[i]); return 2; }
    }
    if (!(target_s > 0) || passes < 1) { fprintf(stderr, "copy_bw: --target-s must be > 0 and --passes >= 1\n"); return 2; }
    if ((n = parse_sizes(sizes, list, BENCH_MAX_SIZES)) <= 0) { fprintf(stderr, "copy_bw: bad --sizes '%s' (e.g. 64K,1M,256M)\n", sizes); return 2; }
    for (i = 0; i < n; i++) {
        size_t bytes = list[i];
        unsigned char *a, *b;
        long iters = 1;
        double t, best = 1e30;
        a = (unsigned char *)malloc(bytes);
        b = (unsigned char *)malloc(bytes);
        if (!a || !b) { fprintf(stderr, "copy_bw: no memory for 2 x %zu bytes\n", bytes); return 1; }
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        while ((t = time_copies(a, b, bytes, iters)) < 0.02 && iters < (1L << 30)) iters *= 4;   /* warm-up too */
        iters = (long)(iters * target_s / (t > 0 ? t : 1e-9));
        if (iters < 2) iters = 2;
        for (k = 0; k < passes; k++) {
            t = time_copies(a, b, bytes, iters) / (double)iters;
            if (t < best) best = t;
        }
        printf("copy bytes=%zu iters=%ld time_us=%.2f gbps=%.3f\n", bytes, iters, best * 1e6, (double)bytes / best / 1e9);
        fflush(stdout);
        free(a);
        free(b);
    }
    return 0;
}
