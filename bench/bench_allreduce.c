/* bench_allreduce — time ddp_allreduce(SUM) on user buffers of float32, size by size.

     build/ddprun -n 2 build/bench_allreduce [--sizes 64K,256K,1M,4M,16M,25M,64M,256M]
                                             [--iters auto|N] [--target-s 0.5] [--grads]

   --grads times gradient buckets instead (impl=ddp-grads): per size a context with one
   parameter of that size, which is one bucket; an iteration is ddp_grad_ready + ddp_finish (the
   bucket averaged in place through the shared gradient segment), the path a training step takes.

   Sizes are bytes of float32 data (K/M/G are powers of 1024). For each size every rank
     1. fills its buffer with rank-dependent integers, allreduces once and checks every element
        against the exactly known sum (exit 1 with a message if any is wrong);
     2. refills the buffer with zeros (so repeated SUMs never overflow or go denormal),
        calibrates: runs k = 1, 4, 16, ... iterations until a batch takes >= 50 ms (this is
        also the warm-up), and picks iters so the timed run takes about --target-s seconds;
     3. barrier, then times `iters` back-to-back allreduces; the reported time is the slowest
        rank's elapsed time (taken as a max across ranks) divided by iters.
   Rank 0 prints one line per size:
     allreduce impl=ddp ranks=2 bytes=26214400 iters=40 time_us=5123.4 busbw=5.117
   busbw = bytes / time * 2(n-1)/n in GB/s (1e9 bytes/s); 0 for a single rank.

   bench/mpi_allreduce.c and bench/gloo_allreduce.py follow exactly the same procedure. */
#define DDP_IMPLEMENTATION
#include "../ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_sizes.h"

#define BENCH_MIN_ITERS 3
#define BENCH_MAX_ITERS 1000000L

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(ddp_context *ctx, const char *what, ddp_result r) {
    fprintf(stderr, "bench_allreduce: rank %d: %s failed: %s: %s\n", ctx ? ddp_rank(ctx) : -1, what,
            ddp_result_string(r), ctx ? ddp_last_error(ctx) : "");
    if (ctx) ddp_shutdown(ctx);
    exit(1);
}

/* The largest of each rank's value: every rank contributes only its own slot of a
   zeroed vector, so a SUM allreduce gathers all of them exactly. */
static double max_across_ranks(ddp_context *ctx, float *scratch, double value) {
    int world = ddp_world_size(ctx), s;
    double m = 0;
    ddp_result r;
    memset(scratch, 0, (size_t)world * sizeof(float));
    scratch[ddp_rank(ctx)] = (float)value;
    if ((r = ddp_allreduce(ctx, scratch, (size_t)world, DDP_SUM)) != DDP_OK) die(ctx, "ddp_allreduce(max)", r);
    for (s = 0; s < world; s++) if (scratch[s] > m) m = scratch[s];
    return m;
}

/* One gradient bucket averaged, the way a step does it (--grads): the only parameter is ready. */
static ddp_result bucket_step(ddp_context *ctx) {
    ddp_result r = ddp_grad_ready(ctx, 0);
    return r != DDP_OK ? r : ddp_finish(ctx);
}

/* Seconds the slowest rank took for k allreduces of n floats (or k bucket steps), started after
   a barrier. */
static double timed_run(ddp_context *ctx, float *buf, size_t n, long k, float *scratch, int grads) {
    double t0, t;
    long i;
    ddp_result r;
    if ((r = ddp_barrier(ctx)) != DDP_OK) die(ctx, "ddp_barrier", r);
    t0 = now_s();
    for (i = 0; i < k; i++)
        if ((r = grads ? bucket_step(ctx) : ddp_allreduce(ctx, buf, n, DDP_SUM)) != DDP_OK) die(ctx, grads ? "bucket step" : "ddp_allreduce", r);
    t = now_s() - t0;
    return max_across_ranks(ctx, scratch, t * 1e6) * 1e-6;   /* microseconds keep float precision */
}

/* One size: the exact check, the calibration, the timed run; rank 0 prints the line. */
static void measure(ddp_context *ctx, float *buf, size_t bytes, long fixed_iters, double target_s, float *scratch, int grads) {
    size_t n = bytes / sizeof(float), j;
    int rank = ddp_rank(ctx), world = ddp_world_size(ctx);
    const float ranks_sum = (float)(world * (world + 1) / 2);
    long k, iters;
    double t, per, busbw;
    ddp_result r;

    /* 1. correctness: element j of rank s holds (j % 251 + 1) * (s + 1), all small integers,
       so the float sum is exact, and so is the average (a multiple of (world + 1) / 2). */
    for (j = 0; j < n; j++) buf[j] = (float)((j % 251 + 1) * (size_t)(rank + 1));
    if ((r = grads ? bucket_step(ctx) : ddp_allreduce(ctx, buf, n, DDP_SUM)) != DDP_OK) die(ctx, "the checked allreduce", r);
    for (j = 0; j < n; j++) {
        float want = (float)(j % 251 + 1) * (grads ? ranks_sum / (float)world : ranks_sum);
        if (buf[j] != want) {
            fprintf(stderr, "bench_allreduce: rank %d: WRONG RESULT at %zu bytes: element %zu is %g, expected %g\n",
                    rank, bytes, j, (double)buf[j], (double)want);
            ddp_shutdown(ctx);
            exit(1);
        }
    }

    /* 2. calibrate (doubles as warm-up) on zeros. */
    memset(buf, 0, n * sizeof(float));
    k = 1;
    for (;;) {
        t = timed_run(ctx, buf, n, k, scratch, grads);
        if (t >= 0.05 || k >= BENCH_MAX_ITERS / 4) break;
        k *= 4;
    }
    per = t / (double)k;
    if (fixed_iters) iters = fixed_iters;
    else {
        double want = target_s / (per > 0 ? per : 1e-9);
        iters = want > (double)BENCH_MAX_ITERS ? BENCH_MAX_ITERS : (long)want;
        if (iters < BENCH_MIN_ITERS) iters = BENCH_MIN_ITERS;
    }

    /* 3. measure. */
    t = timed_run(ctx, buf, n, iters, scratch, grads);
    per = t / (double)iters;
    busbw = world > 1 ? (double)bytes / per * 2.0 * (world - 1) / world / 1e9 : 0.0;
    if (rank == 0) {
        printf("allreduce impl=%s ranks=%d bytes=%zu iters=%ld time_us=%.1f busbw=%.3f\n",
               grads ? "ddp-grads" : "ddp", world, bytes, iters, per * 1e6, busbw);
        fflush(stdout);
    }
}

/* --grads: a context per size whose one parameter is one bucket; its gradient is the buffer. */
static void measure_grads(size_t bytes, long fixed_iters, double target_s) {
    ddp_context *ctx = NULL;
    ddp_desc desc;
    float *scratch;
    int id;
    ddp_result r;
    memset(&desc, 0, sizeof desc);
    desc.bucket_cap_mb = desc.first_bucket_mb = (double)bytes / 1048576.0 + 1.0;
    if ((r = ddp_init(&ctx, &desc)) != DDP_OK) die(ctx, "ddp_init", r);
    if ((r = ddp_register_param(ctx, "g", bytes / sizeof(float), 0, NULL, &id)) != DDP_OK) die(ctx, "ddp_register_param", r);
    if ((r = ddp_commit(ctx)) != DDP_OK) die(ctx, "ddp_commit", r);
    if (!(scratch = (float *)calloc((size_t)ddp_world_size(ctx), sizeof(float)))) die(ctx, "calloc", DDP_ERR_OUT_OF_MEMORY);
    measure(ctx, ddp_grad(ctx, id), bytes, fixed_iters, target_s, scratch, 1);
    free(scratch);
    if ((r = ddp_shutdown(ctx)) != DDP_OK) { fprintf(stderr, "bench_allreduce: ddp_shutdown: %s\n", ddp_result_string(r)); exit(1); }
}

int main(int argc, char **argv) {
    size_t sizes[BENCH_MAX_SIZES], max_bytes = 0;
    int nsizes, i, rank, world, grads = 0;
    long fixed_iters = 0;
    double target_s = 0.5;
    const char *size_spec = default_sizes;
    ddp_context *ctx = NULL;
    ddp_result r;
    float *buf, *scratch;

    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) size_spec = argv[++i];
        else if (!strcmp(argv[i], "--grads")) grads = 1;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            const char *v = argv[++i];
            fixed_iters = strcmp(v, "auto") ? atol(v) : 0;
            if (strcmp(v, "auto") && fixed_iters <= 0) { fprintf(stderr, "bad --iters '%s'\n", v); return 2; }
        } else if (!strcmp(argv[i], "--target-s") && i + 1 < argc) {
            target_s = atof(argv[++i]);
            if (!(target_s > 0)) { fprintf(stderr, "bad --target-s\n"); return 2; }
        } else {
            fprintf(stderr, "usage: %s [--sizes 64K,1M,...] [--iters auto|N] [--target-s SECONDS] [--grads]\n", argv[0]);
            return 2;
        }
    }
    nsizes = parse_sizes(size_spec, sizes, BENCH_MAX_SIZES);
    if (nsizes <= 0) {
        fprintf(stderr, "bad --sizes '%s' (comma-separated byte counts, multiples of 4, K/M/G suffixes)\n", size_spec);
        return 2;
    }
    if (grads) {
        for (i = 0; i < nsizes; i++) measure_grads(sizes[i], fixed_iters, target_s);
        return 0;
    }
    for (i = 0; i < nsizes; i++) if (sizes[i] > max_bytes) max_bytes = sizes[i];

    if ((r = ddp_init(&ctx, NULL)) != DDP_OK) die(ctx, "ddp_init", r);
    rank = ddp_rank(ctx);
    world = ddp_world_size(ctx);

    if (posix_memalign((void **)&buf, 64, max_bytes) != 0 || !(scratch = calloc((size_t)world, sizeof(float)))) {
        fprintf(stderr, "bench_allreduce: rank %d: out of memory for %zu bytes\n", rank, max_bytes);
        ddp_shutdown(ctx);
        return 1;
    }
    memset(buf, 0, max_bytes);   /* fault every page in before any timing */
    for (i = 0; i < nsizes; i++) measure(ctx, buf, sizes[i], fixed_iters, target_s, scratch, 0);

    free(scratch);
    free(buf);
    if ((r = ddp_shutdown(ctx)) != DDP_OK) {
        fprintf(stderr, "bench_allreduce: rank %d: ddp_shutdown: %s\n", rank, ddp_result_string(r));
        return 1;
    }
    return 0;
}
