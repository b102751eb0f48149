/* bench_overlap.c — does bucketing hide the allreduce under backward? Run under ddprun:
       build/ddprun -n 2 build/bench_overlap [options]
   A synthetic model of --layers layers, each --layer-mb of float32 parameters and a fixed
   amount of arithmetic in its backward (calibrated once to --compute-ms). Every allreduce is
   slowed as if it crossed a network of --latency-ms per call and --gbps bandwidth (ddp.h's
   injection option, off by default), standing in for a slow interconnect. Two ways to reduce:
     blocking  one allreduce of all gradients after the whole backward (no overlap)
     overlap   ddp.h's buckets, launched as backward finishes each layer
   Reports medians of step time, compute, total comm and exposed comm, and checks the targets:
   exposed <= last bucket's comm + 10%, step <= 1.1 * (max(compute, comm) + last bucket).
   --sweep 1,5,25,100 instead runs the overlap mode once per bucket cap (MiB) and prints CSV
   (bucket_cap_mb,step_ms,comm_ms,exposed_ms,compute_ms,buckets) for tools/sweep_svg.py.
   --timeline PATH writes the overlap run's trace (see tools/trace_svg.py). */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include <stdio.h>

typedef struct options {
    int layers, steps;
    double layer_mb, compute_ms, latency_ms, gbps;
    const char *sweep, *timeline;
} options;

static ddp_context *ddp;
static long work_per_layer;          /* kernel iterations for compute_ms, the same on every rank */
static float scratch[4096];

/* Arithmetic that stays in cache: a stand-in for a layer's backward kernels. */
static float kernel(long iterations) {
    float a = 1.0001f, acc[8] = { 0 };
    long i;
    int k;
    for (i = 0; i < iterations; i++)
        for (k = 0; k < 8; k++) acc[k] = acc[k] * a + scratch[(i * 8 + k) & 4095];
    return acc[0] + acc[7];
}

static volatile float sink;

static long calibrate(double ms) {
    long n = 1000;
    double t = 0;
    while (t < 0.05) {
        double t0 = ddp__now();
        sink = kernel(n);
        t = ddp__now() - t0;
        if (t < 0.05) n *= 2;
    }
    return (long)((double)n * ms * 1e-3 / t);
}

typedef struct { int w; } layer_args;
static void layer_backward(void *p) {
    const layer_args *a = (const layer_args *)p;
    float *g = ddp_grad(ddp, a->w);
    sink = kernel(work_per_layer);
    g[0] += 1.0f;                  /* the gradient itself: contents do not matter here */
}

typedef struct result { double step_ms, compute_ms, comm_ms, exposed_ms, last_ms; int buckets; } result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); return v[n / 2]; }

/* One configuration: a fresh process group with its bucket cap, warm-up, then `steps` steps. */
static int run(const options *o, double cap_mb, int blocking, result *out) {
    ddp_desc d;
    double *step = calloc((size_t)o->steps, sizeof *step), *comp = calloc((size_t)o->steps, sizeof *comp),
           *comm = calloc((size_t)o->steps, sizeof *comm), *expo = calloc((size_t)o->steps, sizeof *expo),
           *last = calloc((size_t)o->steps, sizeof *last);
    int *ids = calloc((size_t)o->layers, sizeof *ids), l, s;
    size_t n = (size_t)(o->layer_mb * 1048576 / sizeof(float)), total;
    memset(&d, 0, sizeof d);
    d.bucket_cap_mb = cap_mb;
    d.first_bucket_mb = cap_mb < o->layer_mb ? cap_mb : o->layer_mb;
    d.inject_comm_latency_ms = o->latency_ms;
    d.inject_comm_gbps = o->gbps;
    d.timeline_path = !blocking && !o->sweep ? o->timeline : NULL;
    if (ddp_init(&ddp, &d) != DDP_OK) goto fail;
    for (l = 0; l < o->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        if (ddp_register_param(ddp, name, n, 0, NULL, &ids[l]) != DDP_OK) goto fail;
    }
    if (ddp_commit(ddp) != DDP_OK) goto fail;
    ddp_flat_grads(ddp, &total);
    for (s = -2; s < o->steps; s++) {          /* two warm-up steps */
        double t0, t1, t_comm = 0;
        ddp_step_stats st = { 0 };
        ddp_barrier(ddp);
        t0 = ddp__now();
        if (ddp_zero_grad(ddp) != DDP_OK) goto fail;
        ddp_set_sync(ddp, !blocking);
        for (l = 0; l < o->layers; l++) {
            layer_args a = { ids[l] };
            ddp_tape_record(ddp, layer_backward, &a, sizeof a, &ids[l], 1);
        }
        if (ddp_backward(ddp) != DDP_OK) goto fail;
        st = ddp_last_step_stats(ddp);
        if (blocking) {                        /* everything at once, after backward */
            double c0 = ddp__now();
            if (ddp_allreduce(ddp, ddp_flat_grads(ddp, NULL), total, DDP_AVG) != DDP_OK) goto fail;
            t_comm = ddp__now() - c0;
        }
        t1 = ddp__now();
        if (s < 0) continue;
        step[s] = 1e3 * (t1 - t0);
        comp[s] = st.backward_ms;
        comm[s] = blocking ? 1e3 * t_comm : st.comm_ms;
        expo[s] = blocking ? 1e3 * t_comm : st.exposed_ms;
        last[s] = blocking ? 1e3 * t_comm : st.last_bucket_comm_ms;
    }
    out->buckets = blocking ? 1 : ddp_num_buckets(ddp);
    out->step_ms = median(step, o->steps);
    out->compute_ms = median(comp, o->steps);
    out->comm_ms = median(comm, o->steps);
    out->exposed_ms = median(expo, o->steps);
    out->last_ms = median(last, o->steps);
    free(step); free(comp); free(comm); free(expo); free(last); free(ids);
    return ddp_shutdown(ddp) == DDP_OK ? 0 : 1;
fail:
    fprintf(stderr, "bench_overlap: %s\n", ddp_last_error(ddp));
    ddp_shutdown(ddp);
    return 1;
}

static void parse(int argc, char **argv, options *o) {
    int i;
    o->layers = 8; o->steps = 10; o->layer_mb = 4; o->compute_ms = 20; o->latency_ms = 1; o->gbps = 0.5;
    o->sweep = NULL; o->timeline = NULL;
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) o->layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) o->steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layer-mb")) o->layer_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--compute-ms")) o->compute_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--latency-ms")) o->latency_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--gbps")) o->gbps = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--sweep")) o->sweep = argv[i + 1];
        else if (!strcmp(argv[i], "--timeline")) o->timeline = argv[i + 1];
        else { fprintf(stderr, "bench_overlap: unknown option %s\n", argv[i]); exit(2); }
    }
    if (o->layers < 1 || o->steps < 1 || o->layer_mb <= 0 || o->compute_ms < 0) {
        fprintf(stderr, "bench_overlap: --layers, --steps, --layer-mb must be positive\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    options o;
    result blocking, overlap;
    ddp_context *probe;
    int rank, world;
    parse(argc, argv, &o);
    for (int i = 0; i < 4096; i++) scratch[i] = 1e-3f * (float)(i % 17);
    /* Calibrate on rank 0 and share, so every rank does the same work. */
    if (ddp_init(&probe, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(probe)); return 1; }
    rank = ddp_rank(probe);
    world = ddp_world_size(probe);
    if (rank == 0) work_per_layer = calibrate(o.compute_ms);
    ddp_broadcast(probe, &work_per_layer, sizeof work_per_layer, 0);
    ddp_shutdown(probe);
    if (rank != 0) { FILE *quiet = freopen("/dev/null", "w", stdout); (void)quiet; }

    if (o.sweep) {
        char caps[256], *tok, *save = NULL;
        snprintf(caps, sizeof caps, "%s", o.sweep);
        printf("bucket_cap_mb,step_ms,comm_ms,exposed_ms,compute_ms,buckets\n");
        for (tok = strtok_r(caps, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            result r;
            if (run(&o, atof(tok), 0, &r)) return 1;
            printf("%g,%.3f,%.3f,%.3f,%.3f,%d\n", atof(tok), r.step_ms, r.comm_ms, r.exposed_ms, r.compute_ms, r.buckets);
            fflush(stdout);
        }
        return 0;
    }
    if (run(&o, o.layer_mb, 1, &blocking) || run(&o, o.layer_mb, 0, &overlap)) return 1;
    printf("# %d ranks, %d layers x %.2f MiB, compute %.1f ms/layer, injected network %.2f ms + %.2f GB/s per allreduce\n",
           world, o.layers, o.layer_mb, o.compute_ms, o.latency_ms, o.gbps);
    {
        double bound = (overlap.compute_ms > overlap.comm_ms ? overlap.compute_ms : overlap.comm_ms) + overlap.last_ms;
        printf("overlap mode=blocking ranks=%d buckets=1 step_ms=%.2f compute_ms=%.2f comm_ms=%.2f exposed_ms=%.2f\n",
               world, blocking.step_ms, blocking.compute_ms, blocking.comm_ms, blocking.exposed_ms);
        printf("overlap mode=bucketed ranks=%d buckets=%d step_ms=%.2f compute_ms=%.2f comm_ms=%.2f exposed_ms=%.2f "
               "last_bucket_ms=%.2f\n", world, overlap.buckets, overlap.step_ms, overlap.compute_ms, overlap.comm_ms,
               overlap.exposed_ms, overlap.last_ms);
        printf("speedup %.2fx; exposed %.2f ms vs last bucket %.2f ms (target <= +10%%: %s); step %.2f ms vs "
               "max(compute, comm) + last bucket = %.2f ms (target <= +10%%: %s)\n",
               blocking.step_ms / overlap.step_ms, overlap.exposed_ms, overlap.last_ms,
               overlap.exposed_ms <= 1.1 * overlap.last_ms ? "met" : "MISSED", overlap.step_ms, bound,
               overlap.step_ms <= 1.1 * bound ? "met" : "MISSED");
    }
    return 0;
}
