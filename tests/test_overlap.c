/* test_overlap.c — the claim at the heart of ddp.h: bucketed allreduces run under backward, so
   only the last bucket's communication stays exposed. Run: build/ddprun -n 2 build/test_overlap
   Each layer's backward "computes" by sleeping (a stand-in for GPU kernels, and immune to a
   noisy CI machine); every allreduce is slowed by ddp.h's injected network delay to ~5 ms,
   below the 15 ms of compute per layer. The margins are generous on purpose. */
#include "testlib.h"

enum { LAYERS = 6, STEPS = 5, LAYER_FLOATS = 256 * 1024 };

static ddp_context *ddp;

typedef struct { int w; } layer_args;
static void layer_backward(void *p) {
    const layer_args *a = (const layer_args *)p;
    struct timespec ts = { 0, 15 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    ddp_grad(ddp, a->w)[0] += 1.0f;
}

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(void) {
    ddp_desc d;
#ifdef TEST_SANITIZED
    if (getenv("RANK") && atoi(getenv("RANK")) == 0) printf("SKIP overlap: timing is meaningless under a sanitizer\n");
    return 0;
#endif
    double exposed[STEPS], comm[STEPS], last[STEPS];
    int ids[LAYERS], l, s, rank;
    memset(&d, 0, sizeof d);
    d.bucket_cap_mb = d.first_bucket_mb = 1;          /* one layer per bucket */
    d.inject_comm_latency_ms = 1;
    d.inject_comm_gbps = 0.25;                         /* 1 MiB: ~4.2 ms + 1 ms per allreduce */
    if (ddp_init(&ddp, &d) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); return 1; }
    rank = ddp_rank(ddp);
    test_quiet_others(rank);
    if (ddp_world_size(ddp) < 2) { printf("FAIL overlap: needs 2 or more ranks\n"); return 1; }
    for (l = 0; l < LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "layer%d", l);
        ddp_register_param(ddp, name, LAYER_FLOATS, 0, NULL, &ids[l]);
    }
    if (ddp_commit(ddp) != DDP_OK) { printf("FAIL overlap: %s\n", ddp_last_error(ddp)); return 1; }
    for (s = -1; s < STEPS; s++) {
        ddp_step_stats st;
        ddp_zero_grad(ddp);
        for (l = 0; l < LAYERS; l++) {
            layer_args a = { ids[l] };
            ddp_tape_record(ddp, layer_backward, &a, sizeof a, &ids[l], 1);
        }
        if (ddp_backward(ddp) != DDP_OK) { printf("FAIL overlap: %s\n", ddp_last_error(ddp)); return 1; }
        st = ddp_last_step_stats(ddp);
        if (s < 0) continue;                           /* warm-up */
        exposed[s] = st.exposed_ms; comm[s] = st.comm_ms; last[s] = st.last_bucket_comm_ms;
    }
    qsort(exposed, STEPS, sizeof(double), cmp);
    qsort(comm, STEPS, sizeof(double), cmp);
    qsort(last, STEPS, sizeof(double), cmp);
    {
        double e = exposed[STEPS / 2], c = comm[STEPS / 2], lb = last[STEPS / 2];
        float worst[2];
        worst[0] = (float)(e - lb);                    /* every rank must see it */
        worst[1] = (float)(e / c);
        ddp_allreduce(ddp, worst, 2, DDP_AVG);
        printf("  (median exposed %.2f ms, last bucket %.2f ms, all comm %.2f ms over %d buckets)\n",
               e, lb, c, ddp_num_buckets(ddp));
        verdict(c > 4.0 * LAYERS && lb > 4.0, "overlap_injected_delay_applies", "comm %.2f ms, last bucket %.2f ms", c, lb);
        verdict(worst[0] <= 5.0f, "overlap_exposed_at_most_last_bucket_plus_5ms", "exposed %.2f ms, last bucket %.2f ms", e, lb);
        verdict(worst[1] <= 0.5f, "overlap_hides_most_comm", "exposed/comm = %.2f", (double)worst[1]);
    }
    if (ddp_shutdown(ddp) != DDP_OK) return 1;
    return test_summary("test_overlap");
}
