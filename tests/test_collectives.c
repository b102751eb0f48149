/* test_collectives.c — allreduce, broadcast and barrier against a float64 reference.
   Run as real processes: build/ddprun -n N build/test_collectives   (N = 1, 2, 3, 4).
   Sizes run from 1 element to 40 MiB, around the chunk and rank-count boundaries. */
#include "testlib.h"
#include <float.h>

static ddp_context *ddp;
static int rank, world;

/* All ranks' failures, so rank 0's verdict covers everyone. */
static int failures_everywhere(int mine) {
    float f = (float)mine;
    if (ddp_allreduce(ddp, &f, 1, DDP_SUM) != DDP_OK) return 1;
    return f != 0;
}

/* 1 if every rank holds the same bytes as rank 0. */
static int same_on_every_rank(const void *data, size_t bytes) {
    uint64_t mine = test_hash(data, bytes), ref = mine;
    if (ddp_broadcast(ddp, &ref, sizeof ref, 0) != DDP_OK) return 0;
    return !failures_everywhere(ref != mine);
}

static void check_allreduce(size_t n, ddp_op op) {
    char name[96];
    float *buf = (float *)malloc(n * sizeof(float));
    size_t i, bad = 0, first_bad = 0;
    double worst = 0;
    int r, ok;
    snprintf(name, sizeof name, "allreduce_%s_n%zu_ranks%d", op == DDP_SUM ? "sum" : "avg", n, world);
    for (i = 0; i < n; i++) buf[i] = test_value((uint64_t)rank * 7919 + n, i) * (1.0f + (float)(i % 7));
    if (ddp_allreduce(ddp, buf, n, op) != DDP_OK) {
        verdict(0, name, "%s", ddp_last_error(ddp));
        free(buf);
        return;
    }
    for (i = 0; i < n; i++) {
        double sum = 0, sum_abs = 0, err, tol;
        for (r = 0; r < world; r++) {
            double x = (double)(test_value((uint64_t)r * 7919 + n, i) * (1.0f + (float)(i % 7)));
            sum += x;
            sum_abs += fabs(x);
        }
        if (op == DDP_AVG) { sum /= world; sum_abs /= world; }
        /* float32 summation of `world` terms: at most (world - 1) roundings, plus the division */
        tol = (world + 1) * FLT_EPSILON * sum_abs + 1e-30;
        err = fabs((double)buf[i] - sum);
        if (err > tol) { if (!bad++) first_bad = i; }
        if (err / tol > worst) worst = err / tol;
    }
    ok = !failures_everywhere(bad != 0);
    verdict(ok, name, "%zu element(s) off the float64 reference on some rank (first at %zu)", bad, first_bad);
    snprintf(name, sizeof name, "allreduce_%s_n%zu_ranks%d_identical", op == DDP_SUM ? "sum" : "avg", n, world);
    verdict(same_on_every_rank(buf, n * sizeof(float)), name, "ranks hold different bits");
    free(buf);
}

static void check_broadcast(size_t bytes, int root) {
    char name[96];
    unsigned char *buf = (unsigned char *)malloc(bytes);
    size_t i, bad = 0;
    snprintf(name, sizeof name, "broadcast_%zuB_root%d_ranks%d", bytes, root, world);
    for (i = 0; i < bytes; i++) buf[i] = (unsigned char)(rank == root ? (i * 31 + 7) : 0xee);
    if (ddp_broadcast(ddp, buf, bytes, root) != DDP_OK) { verdict(0, name, "%s", ddp_last_error(ddp)); free(buf); return; }
    for (i = 0; i < bytes; i++) bad += buf[i] != (unsigned char)(i * 31 + 7);
    verdict(!failures_everywhere(bad != 0), name, "%zu byte(s) differ from the root's", bad);
    free(buf);
}

/* Nobody leaves a barrier before the last rank has entered it. */
static void check_barrier(void) {
    float arrive[64] = { 0 }, leave[64] = { 0 };
    double t0 = ddp__now();   /* CLOCK_MONOTONIC is one clock for all processes: use rank 0's origin */
    int r, ok = 1;
    if (world > 64) return;
    ddp_broadcast(ddp, &t0, sizeof t0, 0);
    usleep(30000u * (unsigned)rank);
    arrive[rank] = (float)(ddp__now() - t0);
    if (ddp_barrier(ddp) != DDP_OK) { verdict(0, "barrier", "%s", ddp_last_error(ddp)); return; }
    leave[rank] = (float)(ddp__now() - t0);
    ddp_allreduce(ddp, arrive, (size_t)world, DDP_SUM);
    ddp_allreduce(ddp, leave, (size_t)world, DDP_SUM);
    for (r = 0; r < world; r++) {
        int s;
        for (s = 0; s < world; s++) ok &= leave[r] >= arrive[s];
    }
    verdict(ok, "barrier_waits_for_the_last_rank", "a rank left before another arrived");
}

/* Gradient buckets: parameters of awkward sizes over many small buckets (some smaller than
   world x 16 floats, so a rank's part can be empty), two steps so a bucket's buffer is reused.
   Each step every gradient is set, marked ready from the last parameter to the first (the order
   a backward finishes them), and must come back as the float64 average on every rank, with
   the same bits everywhere. */
static void check_gradient_buckets(void) {
    static const size_t counts[] = { 1, 3, 17, 33, 4097, 65537, 196613, 5, (1u << 20) + 3, 2 };
    enum { NP = sizeof counts / sizeof counts[0] };
    char name[96];
    int ids[NP], p, step, r;
    size_t i, total;
    for (p = 0; p < NP; p++) {
        snprintf(name, sizeof name, "p%d", p);
        if (ddp_register_param(ddp, name, counts[p], 0, NULL, &ids[p]) != DDP_OK) { verdict(0, "buckets_register", "%s", ddp_last_error(ddp)); return; }
    }
    if (ddp_commit(ddp) != DDP_OK) { verdict(0, "buckets_commit", "%s", ddp_last_error(ddp)); return; }
    for (step = 0; step < 2; step++) {
        size_t bad = 0;
        double worst = 0;
        for (p = 0; p < NP; p++)
            for (i = 0; i < counts[p]; i++) ddp_grad(ddp, ids[p])[i] = test_value((uint64_t)(rank * 131 + step * 17 + p), i);
        for (p = NP - 1; p >= 0; p--)
            if (ddp_grad_ready(ddp, ids[p]) != DDP_OK) { verdict(0, "buckets_ready", "%s", ddp_last_error(ddp)); return; }
        if (ddp_finish(ddp) != DDP_OK) { verdict(0, "buckets_finish", "%s", ddp_last_error(ddp)); return; }
        for (p = 0; p < NP; p++)
            for (i = 0; i < counts[p]; i++) {
                double sum = 0, sum_abs = 0, err, tol;
                for (r = 0; r < world; r++) {
                    double x = test_value((uint64_t)(r * 131 + step * 17 + p), i);
                    sum += x / world;
                    sum_abs += fabs(x) / world;
                }
                tol = (world + 1) * FLT_EPSILON * sum_abs + 1e-30;
                err = fabs((double)ddp_grad(ddp, ids[p])[i] - sum);
                bad += err > tol;
                if (err / tol > worst) worst = err / tol;
            }
        snprintf(name, sizeof name, "gradient_buckets_step%d_ranks%d_%d_buckets", step, world, ddp_num_buckets(ddp));
        verdict(!failures_everywhere(bad != 0), name, "%zu gradient element(s) off the float64 average on some rank", bad);
        ddp_flat_grads(ddp, &total);
        snprintf(name, sizeof name, "gradient_buckets_step%d_ranks%d_identical", step, world);
        verdict(same_on_every_rank(ddp_flat_grads(ddp, NULL), total * sizeof(float)), name, "ranks hold different bits");
    }
}

/* ddp_scatter_from_host / ddp_gather_to_host: the committed state from one rank's host memory
   to every rank and back, from every root, for parameters and AdamW's m; bad input named. */
static void check_state_scatter_gather(void) {
    char name[96];
    size_t total, i, bad = 0, off, n;
    float *src, *back;
    int root, w;
    ddp_buffer which;
    ddp_flat_params(ddp, &total);
    src = (float *)malloc(total * sizeof(float));
    back = (float *)malloc(total * sizeof(float));
    for (root = 0; root < world; root++)
        for (w = 0; w < 2; w++) {
            which = w ? DDP_ADAM_M : DDP_PARAMS;
            for (i = 0; i < total; i++) src[i] = test_value((uint64_t)(root * 7 + w + 1000), i);
            off = (size_t)root * 3 + 1;                 /* a range that starts and ends inside parameters */
            n = total - off - 5;
            bad = ddp_scatter_from_host(ddp, which, off, rank == root ? src + off : NULL, n, root) != DDP_OK;
            memset(back, 0, total * sizeof(float));
            if (!bad) bad = ddp_copy_to_host(ddp, which, off, back + off, n) != DDP_OK;
            for (i = off; i < off + n && !bad; i++) bad = back[i] != src[i];
            snprintf(name, sizeof name, "scatter_from_host_%s_root%d_ranks%d", w ? "m" : "params", root, world);
            verdict(!failures_everywhere(bad != 0), name, "some rank does not hold root's values: %s", ddp_last_error(ddp));
            memset(back, 0, total * sizeof(float));
            bad = ddp_gather_to_host(ddp, which, off, rank == root ? back : NULL, n, root) != DDP_OK;
            for (i = 0; rank == root && i < n && !bad; i++) bad = back[i] != src[off + i];
            snprintf(name, sizeof name, "gather_to_host_%s_root%d_ranks%d", w ? "m" : "params", root, world);
            verdict(!failures_everywhere(bad != 0), name, "root's copy differs: %s", ddp_last_error(ddp));
        }
    bad = ddp_gather_to_host(ddp, DDP_PARAMS, 0, back, 1, world) != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_last_error(ddp), "root");
    bad |= ddp_scatter_from_host(ddp, DDP_PARAMS, total, src, 1, 0) != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_last_error(ddp), "outside");
    snprintf(name, sizeof name, "scatter_gather_bad_input_named_ranks%d", world);
    verdict(!failures_everywhere(bad != 0), name, "a bad root or range was not refused by name: %s", ddp_last_error(ddp));
    free(src);
    free(back);
}

int main(void) {
    static const size_t sizes[] = { 1, 2, 3, 7, 16, 17, 1000, 4097, 65535, 65536, 65537, 196613,
                                    (1u << 20) + 3, 10u * (1u << 20) + 1 };
    static const size_t bcast_sizes[] = { 1, 13, 262144 + 7, 3u * 1048576 + 1 };
    size_t i;
    int root;
    ddp_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.bucket_cap_mb = 0.25;      /* many buckets for check_gradient_buckets */
    desc.first_bucket_mb = 0.0001;
    if (ddp_init(&ddp, &desc) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); return 1; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    test_quiet_others(rank);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_allreduce(sizes[i], DDP_SUM);
        if (sizes[i] < 100000 || i + 1 == sizeof sizes / sizeof sizes[0]) check_allreduce(sizes[i], DDP_AVG);
    }
    for (i = 0; i < sizeof bcast_sizes / sizeof bcast_sizes[0]; i++)
        for (root = 0; root < world; root++) check_broadcast(bcast_sizes[i], root);
    check_barrier();
    check_gradient_buckets();
    check_state_scatter_gather();
    if (ddp_shutdown(ddp) != DDP_OK) { printf("FAIL shutdown_ranks%d\n", world); test_failures++; }
    return test_summary("test_collectives");
}
