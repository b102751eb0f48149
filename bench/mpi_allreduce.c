/* mpi_allreduce — the baseline for bench_allreduce.c: the same procedure with
   MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD).

     mpicc -std=c99 -O3 -march=native -o build/mpi_allreduce bench/mpi_allreduce.c
     mpirun --allow-run-as-root -n 2 build/mpi_allreduce [--sizes 64K,...] [--iters auto|N]

   For each size (bytes of float32): a correctness check on rank-dependent integers, a
   calibration on zeros that doubles as warm-up (k = 1, 4, 16, ... until a batch takes
   >= 50 ms), then `iters` timed allreduces after a barrier, iters chosen for about
   --target-s seconds. Reported: the slowest rank's time (MPI_MAX) / iters. Rank 0 prints
     allreduce impl=mpi ranks=2 bytes=26214400 iters=40 time_us=5123.4 busbw=5.117
   with busbw = bytes / time * 2(n-1)/n in GB/s (1e9), 0 for one rank. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_sizes.h"

#define BENCH_MIN_ITERS 3
#define BENCH_MAX_ITERS 1000000L

static void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "mpi_allreduce: %s failed: %s\n", what, msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* Seconds the slowest rank took for k allreduces of n floats, started after a barrier. */
static double timed_run(float *buf, size_t n, long k) {
    double t0, t, tmax;
    long i;
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    t0 = MPI_Wtime();
    for (i = 0; i < k; i++)
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    t = MPI_Wtime() - t0;
    check_mpi(MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(max)");
    return tmax;
}

int main(int argc, char **argv) {
    size_t sizes[BENCH_MAX_SIZES], max_bytes = 0;
    int nsizes, i, rank, world;
    long fixed_iters = 0;
    double target_s = 0.5;
    const char *size_spec = default_sizes;
    float *buf;

    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) size_spec = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            const char *v = argv[++i];
            fixed_iters = strcmp(v, "auto") ? atol(v) : 0;
            if (strcmp(v, "auto") && fixed_iters <= 0) {
                if (rank == 0) fprintf(stderr, "bad --iters '%s'\n", v);
                MPI_Finalize();
                return 2;
            }
        } else if (!strcmp(argv[i], "--target-s") && i + 1 < argc) {
            target_s = atof(argv[++i]);
            if (!(target_s > 0)) { if (rank == 0) fprintf(stderr, "bad --target-s\n"); MPI_Finalize(); return 2; }
        } else {
            if (rank == 0) fprintf(stderr, "usage: %s [--sizes 64K,1M,...] [--iters auto|N] [--target-s SECONDS]\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    nsizes = parse_sizes(size_spec, sizes, BENCH_MAX_SIZES);
    if (nsizes <= 0) {
        if (rank == 0) fprintf(stderr, "bad --sizes '%s' (comma-separated byte counts, multiples of 4, K/M/G suffixes)\n", size_spec);
        MPI_Finalize();
        return 2;
    }
    for (i = 0; i < nsizes; i++) if (sizes[i] > max_bytes) max_bytes = sizes[i];
    if (max_bytes / sizeof(float) > 2147483647u) {
        if (rank == 0) fprintf(stderr, "sizes above 8 GiB do not fit MPI's int count\n");
        MPI_Finalize();
        return 2;
    }

    if (posix_memalign((void **)&buf, 64, max_bytes) != 0) {
        fprintf(stderr, "mpi_allreduce: rank %d: out of memory for %zu bytes\n", rank, max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, 0, max_bytes);   /* fault every page in before any timing */

    for (i = 0; i < nsizes; i++) {
        size_t n = sizes[i] / sizeof(float), j;
        const float ranks_sum = (float)(world * (world + 1) / 2);
        long k, iters;
        double t, per, busbw;

        /* 1. correctness: element j of rank s holds (j % 251 + 1) * (s + 1); the sum is exact. */
        for (j = 0; j < n; j++) buf[j] = (float)((j % 251 + 1) * (size_t)(rank + 1));
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
        for (j = 0; j < n; j++) {
            float want = (float)(j % 251 + 1) * ranks_sum;
            if (buf[j] != want) {
                fprintf(stderr, "mpi_allreduce: rank %d: WRONG RESULT at %zu bytes: element %zu is %g, expected %g\n",
                        rank, sizes[i], j, (double)buf[j], (double)want);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }

        /* 2. calibrate (doubles as warm-up) on zeros. */
        memset(buf, 0, n * sizeof(float));
        k = 1;
        for (;;) {
            t = timed_run(buf, n, k);
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
        t = timed_run(buf, n, iters);
        per = t / (double)iters;
        busbw = world > 1 ? (double)sizes[i] / per * 2.0 * (world - 1) / world / 1e9 : 0.0;
        if (rank == 0) {
            printf("allreduce impl=mpi ranks=%d bytes=%zu iters=%ld time_us=%.1f busbw=%.3f\n",
                   world, sizes[i], iters, per * 1e6, busbw);
            fflush(stdout);
        }
    }

    free(buf);
    MPI_Finalize();
    return 0;
}
