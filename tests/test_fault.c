/* test_fault.c — a training loop for the fault tests (tests/test_failures.sh).
   A deep stack of linear layers with gradients in several buckets, so allreduces are in flight
   while backward runs. With DIE_RANK=r and DIE_STEP=s, rank r SIGKILLs itself inside the
   backward of step s, while its peers are mid-allreduce; DIE_WHERE=forward or optimizer moves the
   kill before the forward or between backward and the AdamW step. OUTER=H (and OUTER_DELAY=d):
   replica groups of one rank (OUTER_GROUP=S: of S ranks) and their outer sync, so that a kill
   before the AdamW step of an outer step leaves the peers in the exchange (or, delayed, its
   thread).
   Usage: test_fault STEPS; prints "step N" per step; on error prints the error, exits 3. */
#include "testlib.h"
#include <signal.h>

#ifdef TEST_SANITIZED
enum { LAYERS = 8, WIDTH = 64, BATCH = 4 };
#else
enum { LAYERS = 8, WIDTH = 256, BATCH = 16 };
#endif

static ddp_context *ddp;
static int die_rank = -1, die_step = -1, step;
static const char *die_where = "backward";

static void maybe_die(const char *where) {
    if (step == die_step && ddp_rank(ddp) == die_rank && !strcmp(where, die_where)) raise(SIGKILL);
}
static float acts[LAYERS + 1][BATCH * WIDTH], grads[LAYERS + 1][BATCH * WIDTH];

typedef struct { int layer, w; } layer_args;

static void layer_backward(void *p) {
    const layer_args *a = (const layer_args *)p;
    float *gw = ddp_grad(ddp, a->w);
    const float *W = ddp_param(ddp, a->w), *x = acts[a->layer], *dy = grads[a->layer + 1];
    float *dx = grads[a->layer];
    int i, o, k;
    if (a->layer == LAYERS / 2) maybe_die("backward");
    for (i = 0; i < BATCH; i++)
        for (o = 0; o < WIDTH; o++)
            for (k = 0; k < WIDTH; k++) gw[o * WIDTH + k] += dy[i * WIDTH + o] * x[i * WIDTH + k];
    for (i = 0; i < BATCH; i++)
        for (k = 0; k < WIDTH; k++) {
            float s = 0;
            for (o = 0; o < WIDTH; o++) s += dy[i * WIDTH + o] * W[o * WIDTH + k];
            dx[i * WIDTH + k] = s;
        }
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 100, ids[LAYERS], l, i;
    ddp_adamw opt;
    ddp_desc desc;
    memset(&opt, 0, sizeof opt);
    memset(&desc, 0, sizeof desc);
    opt.lr = 1e-3f;
    desc.first_bucket_mb = WIDTH * WIDTH * 4 / 1048576.0;   /* one layer per bucket: many allreduces per step */
    desc.bucket_cap_mb = desc.first_bucket_mb;
    if (getenv("DIE_RANK")) die_rank = atoi(getenv("DIE_RANK"));
    if (getenv("DIE_STEP")) die_step = atoi(getenv("DIE_STEP"));
    if (getenv("DIE_WHERE")) die_where = getenv("DIE_WHERE");
    /* OUTER=H: every rank its own replica, DiLoCo every H steps; OUTER_DELAY=d: streaming, the
       exchange on its own thread for d steps (a fault test: a rank dies before an exchange) */
    if (getenv("OUTER")) {
        desc.outer.mode = getenv("OUTER_DELAY") ? DDP_OUTER_STREAMING : DDP_OUTER_DILOCO;
        desc.outer.group_size = getenv("OUTER_GROUP") ? atoi(getenv("OUTER_GROUP")) : 1;   /* ranks a group */
        desc.outer.inner_steps = atoi(getenv("OUTER"));
        desc.outer.delay_steps = getenv("OUTER_DELAY") ? atoi(getenv("OUTER_DELAY")) : 0;
    }
    if (ddp_init(&ddp, &desc) != DDP_OK) goto fail;
    for (l = 0; l < LAYERS; l++) {
        char name[32];
        /* MISMATCH_RANK=r: that rank registers a different first layer (a failure test) */
        int odd = getenv("MISMATCH_RANK") && atoi(getenv("MISMATCH_RANK")) == ddp_rank(ddp) && l == 0;
        snprintf(name, sizeof name, odd ? "layer%d.weights" : "layer%d.weight", l);
        if (ddp_register_param(ddp, name, WIDTH * WIDTH, 0, NULL, &ids[l]) != DDP_OK) goto fail;
    }
    if (ddp_commit(ddp) != DDP_OK) goto fail;
    for (step = 0; step < steps; step++) {
        maybe_die("forward");
        for (i = 0; i < BATCH * WIDTH; i++) acts[0][i] = test_value((uint64_t)step, (uint64_t)i);
        for (i = 0; i < BATCH * WIDTH; i++) grads[LAYERS][i] = 1e-3f;
        if (ddp_zero_grad(ddp) != DDP_OK) goto fail;
        for (l = 0; l < LAYERS; l++) {
            layer_args a;
            a.layer = l; a.w = ids[l];
            if (ddp_tape_record(ddp, layer_backward, &a, sizeof a, &ids[l], 1) != DDP_OK) goto fail;
        }
        if (ddp_backward(ddp) != DDP_OK) goto fail;
        maybe_die("optimizer");
        if (ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) goto fail;
        printf("step %d\n", step);
        fflush(stdout);
    }
    return ddp_shutdown(ddp) == DDP_OK ? 0 : 3;
fail:
    fprintf(stderr, "test_fault: %s\n", ddp_last_error(ddp));
    ddp_shutdown(ddp);
    return 3;
}
