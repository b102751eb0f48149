/* minimal.c — the smallest complete ddp.h training program.
   Fits a linear model y = W x + b to a synthetic dataset of 1000 examples, in shuffled epochs:
   ddp.h's distributed sampler gives every rank its own part of each global batch; ddp.h averages
   the gradients while backward runs and steps AdamW on every rank.
       make && build/ddprun -n 2 build/minimal                                                 */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include <stdio.h>

enum { IN = 32, OUT = 8, GLOBAL_BATCH = 64, STEPS = 300, EXAMPLES = 1000 };

/* Deterministic numbers in [-1, 1): every rank can make any example of the dataset. */
static float noise(unsigned seed) {
    seed = seed * 2654435761u ^ 0x9e3779b9u; seed ^= seed >> 15; seed *= 2246822519u; seed ^= seed >> 13;
    return (float)(seed & 0xffffff) / 8388608.0f - 1.0f;
}

/* The forward of an op records its backward: the args are copied onto the tape, and the ids
   name the parameters whose gradients this backward finishes. */
typedef struct { ddp_context *ddp; int w, b, n; const float *x; const float *dy; } linear_args;

static void linear_backward(void *p) {
    const linear_args *a = (const linear_args *)p;
    float *gw = ddp_grad(a->ddp, a->w), *gb = ddp_grad(a->ddp, a->b);
    for (int i = 0; i < a->n; i++)
        for (int o = 0; o < OUT; o++) {
            float d = a->dy[i * OUT + o];
            gb[o] += d;
            for (int k = 0; k < IN; k++) gw[o * IN + k] += d * a->x[i * IN + k];
        }
}

static void linear(ddp_context *ddp, int w, int b, const float *x, float *y, const float *dy, int n) {
    const float *W = ddp_param(ddp, w), *B = ddp_param(ddp, b);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < OUT; o++) {
            float s = B[o];
            for (int k = 0; k < IN; k++) s += W[o * IN + k] * x[i * IN + k];
            y[i * OUT + o] = s;
        }
    linear_args args = { ddp, w, b, n, x, dy };
    int ids[2] = { w, b };
    ddp_tape_record(ddp, linear_backward, &args, sizeof args, ids, 2);
}

#define CHECK(call) do { if ((call) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); \
                                                 ddp_shutdown(ddp); return 1; } } while (0)
/* The sampler needs no context: its message is in ddp_last_error(NULL). */
#define SAMPLER_FAILED() do { fprintf(stderr, "%s\n", ddp_last_error(NULL)); ddp_shutdown(ddp); return 1; } while (0)

int main(void) {
    ddp_context *ddp;
    CHECK(ddp_init(&ddp, NULL));
    int rank = ddp_rank(ddp), world = ddp_world_size(ddp), n = GLOBAL_BATCH / world;
    if (GLOBAL_BATCH % world) { fprintf(stderr, "world size must divide %d\n", GLOBAL_BATCH); return 1; }

    float w_init[OUT * IN];                  /* rank 0's values win: commit broadcasts them */
    for (int i = 0; i < OUT * IN; i++) w_init[i] = 0.1f * noise(1000 + i);
    int w, b;
    CHECK(ddp_register_param(ddp, "linear.weight", OUT * IN, 0, w_init, &w));
    CHECK(ddp_register_param(ddp, "linear.bias", OUT, DDP_NO_DECAY, NULL, &b));
    CHECK(ddp_commit(ddp));
    if (!ddp_param(ddp, w)) CHECK(DDP_ERR_INVALID_STATE);   /* fp32 views: NULL if the parameters are bf16 */

    /* Each epoch a permutation of the examples, the same on every rank; rank r takes its
       positions r, r + world, ... (drop_last: floor(1000 / world) each). Global batch k of an
       epoch is positions [64k, 64k + 64) whatever the world: 15 batches an epoch. */
    ddp_sampler sampler = { .n = EXAMPLES, .world = world, .rank = rank, .seed = 1, .shuffle = 1, .drop_last = 1 };
    uint64_t per_rank;
    if (ddp_sampler_count(&sampler, &per_rank) != DDP_OK) SAMPLER_FAILED();
    int batches_per_epoch = (int)(per_rank / (uint64_t)n);

    static float x[GLOBAL_BATCH * IN], t[GLOBAL_BATCH * OUT], y[GLOBAL_BATCH * OUT], dy[GLOBAL_BATCH * OUT];
    ddp_adamw opt = { .lr = 0.02f, .weight_decay = 0.01f, .max_grad_norm = 1.0f };
    for (int step = 0; step < STEPS; step++) {
        uint64_t epoch = (uint64_t)(step / batches_per_epoch), first = (uint64_t)(step % batches_per_epoch * n);
        for (int i = 0; i < n; i++) {        /* this rank's part of global batch `step` */
            uint64_t index;
            if (ddp_sample(&sampler, epoch, first + (uint64_t)i, &index) != DDP_OK) SAMPLER_FAILED();
            unsigned example = (unsigned)index * 131u;
            for (int k = 0; k < IN; k++) x[i * IN + k] = noise(example + k);
            for (int o = 0; o < OUT; o++) {  /* the target: a fixed linear map plus noise */
                float s = 0.5f * (float)(o - OUT / 2) / OUT + 0.01f * noise(example + 99 + o);
                for (int k = 0; k < IN; k++) s += noise(7 * o + 13 * k) * x[i * IN + k];
                t[i * OUT + o] = s;
            }
        }
        CHECK(ddp_zero_grad(ddp));
        linear(ddp, w, b, x, y, dy, n);
        float loss = 0;                      /* mean squared error; dy feeds linear_backward */
        for (int j = 0; j < n * OUT; j++) {
            loss += (y[j] - t[j]) * (y[j] - t[j]) / (float)(n * OUT);
            dy[j] = 2.0f * (y[j] - t[j]) / (float)(n * OUT);
        }
        CHECK(ddp_backward(ddp));            /* gradients are now averaged over all ranks */
        CHECK(ddp_adamw_step(ddp, &opt, NULL));
        CHECK(ddp_allreduce(ddp, &loss, 1, DDP_AVG));
        ddp_step_stats st = ddp_last_step_stats(ddp);
        if (rank == 0 && (step % 50 == 0 || step == STEPS - 1))
            printf("step %3d  loss %.5f  compute %.3f ms  comm %.3f ms  exposed %.3f ms  overlap %.0f%%\n",
                   step, loss, st.backward_ms, st.comm_ms, st.exposed_ms, st.overlap_pct);
    }
    return ddp_shutdown(ddp) == DDP_OK ? 0 : 1;
}
