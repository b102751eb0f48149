/* own_autograd.c — an existing single-file trainer with its OWN backward made data-parallel:
   no tape. The shape is the one hand-written C trainers have: every parameter in one buffer
   (a struct of pointers into it), every gradient in another, a forward that keeps its
   activations, a backward written out by hand that ADDS into the gradients (so micro-batches
   accumulate), and the program's own optimizer (SGD with momentum here).

   What changes for ddp.h (each marked "ddp:" below):
   1. The buffers are ddp.h's: register the tensors in the program's memory order, then take
      the pointers from ddp_param (the flat layout is the registration order, each parameter
      rounded up to DDP_PARAM_ALIGN_FLOATS floats: the program's offsets hold when every count
      is a multiple of 16, as here; otherwise use ddp_param and never compute offsets).
   2. Stacked tensors: the hidden layers' weights are ONE array [LAYERS][H][H] in the program.
      Registered as one parameter it is final only when the backward ends (no overlap);
      registered as one slice per layer (--layout sliced, the default) each layer's slice is
      its own parameter and its bucket leaves while the layers below still compute. The memory
      is the same either way: the slices are contiguous because 1024 floats is a multiple of 16.
   3. The backward marks each parameter ready (ddp_grad_ready) once its gradient is final,
      then ddp_finish. Every parameter, every backward (micro-steps included).
   4. The step: ddp_consume_grads, then the program's own update on ddp.h's buffers (or
      ddp_adamw_step with --adamw). ddp_zero_grad instead of memset.
   5. Data: rank r takes its slice of each global batch.
   It prints the global mean loss each step, and at the end whether every rank holds the same
   bits. --save PATH: rank 0 writes the final parameters (floats, program layout).

   Build:  cc -O2 -o own_autograd examples/own_autograd.c -lpthread -lm
   Run:    ./own_autograd                    (one rank)
           build/ddprun -n 2 ./own_autograd --batch 4   (= one rank at --batch 8, to rounding) */
#define DDP_IMPLEMENTATION
#include "../ddp.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 16, H = 32, LAYERS = 3, CLASSES = 4, MAX_BATCH = 256 };

/* The program's parameters: one buffer, a pointer per tensor (the hidden layers stacked). */
typedef struct model {
    float *w0, *b0;        /* input layer  [H][IN], [H] */
    float *wh;             /* hidden layers, stacked: [LAYERS][H][H] (no bias) */
    float *wout, *bout;    /* output layer [CLASSES][H], [CLASSES] */
} model;
static const size_t counts[5] = { H * IN, H, (size_t)LAYERS * H * H, CLASSES * H, CLASSES };

/* Activations of one micro-batch, kept for the backward. */
typedef struct acts {
    float x[MAX_BATCH][IN], h[LAYERS + 1][MAX_BATCH][H], logits[MAX_BATCH][CLASSES];
    int label[MAX_BATCH];
} acts;

/* Deterministic data: sample k's inputs in [-1, 1), its label the teacher's argmax. */
static float hash01(uint64_t a, uint64_t b) {
    uint64_t z = a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / 8388608.0f - 1.0f;
}
static void sample(uint64_t k, float *x, int *label) {
    float best = -1e30f;
    int c, d;
    for (d = 0; d < IN; d++) x[d] = hash01(1, k * IN + (uint64_t)d);
    for (c = 0; c < CLASSES; c++) {
        float s = 0;
        for (d = 0; d < IN; d++) s += hash01(2, (uint64_t)(c * IN + d)) * x[d];
        if (s > best) { best = s; *label = c; }
    }
}

/* forward of n samples; returns the sum of their losses */
static double forward(const model *m, acts *a, int n) {
    double loss = 0;
    int i, o, k, l, c;
    for (i = 0; i < n; i++) {
        for (o = 0; o < H; o++) {
            float s = m->b0[o];
            for (k = 0; k < IN; k++) s += m->w0[o * IN + k] * a->x[i][k];
            a->h[0][i][o] = tanhf(s);
        }
        for (l = 0; l < LAYERS; l++) {
            const float *w = m->wh + (size_t)l * H * H;   /* the program's own arithmetic on the stack */
            for (o = 0; o < H; o++) {
                float s = 0;
                for (k = 0; k < H; k++) s += w[o * H + k] * a->h[l][i][k];
                a->h[l + 1][i][o] = tanhf(s);
            }
        }
        {
            float mx = -1e30f, z = 0;
            for (c = 0; c < CLASSES; c++) {
                float s = m->bout[c];
                for (k = 0; k < H; k++) s += m->wout[c * H + k] * a->h[LAYERS][i][k];
                a->logits[i][c] = s;
                if (s > mx) mx = s;
            }
            for (c = 0; c < CLASSES; c++) z += expf(a->logits[i][c] - mx);
            for (c = 0; c < CLASSES; c++) a->logits[i][c] = expf(a->logits[i][c] - mx) / z;   /* now probabilities */
            loss -= log((double)a->logits[i][a->label[i]]);
        }
    }
    return loss;
}

/* The hand-written backward: gradients of (sum of the n losses) * scale ADDED into g.
   ddp: each parameter is marked ready right after its last addition. */
static int backward(ddp_context *ddp, const model *m, const model *g, const acts *a, int n, float scale,
                    const int *id_wout, const int *id_bout, const int *id_wh, int sliced, const int *id_w0,
                    const int *id_b0) {
    static float dh[MAX_BATCH][H], dz[MAX_BATCH][H];
    int i, o, k, l, c;
    for (i = 0; i < n; i++) {
        for (k = 0; k < H; k++) dh[i][k] = 0;
        for (c = 0; c < CLASSES; c++) {
            float d = (a->logits[i][c] - (c == a->label[i] ? 1.0f : 0.0f)) * scale;
            g->bout[c] += d;
            for (k = 0; k < H; k++) {
                g->wout[c * H + k] += d * a->h[LAYERS][i][k];
                dh[i][k] += d * m->wout[c * H + k];
            }
        }
    }
    if (ddp_grad_ready(ddp, *id_bout) != DDP_OK || ddp_grad_ready(ddp, *id_wout) != DDP_OK) return 0;
    for (l = LAYERS - 1; l >= 0; l--) {
        const float *w = m->wh + (size_t)l * H * H;
        float *gw = g->wh + (size_t)l * H * H;
        for (i = 0; i < n; i++)
            for (o = 0; o < H; o++) dz[i][o] = dh[i][o] * (1.0f - a->h[l + 1][i][o] * a->h[l + 1][i][o]);
        for (i = 0; i < n; i++)
            for (o = 0; o < H; o++)
                for (k = 0; k < H; k++) gw[o * H + k] += dz[i][o] * a->h[l][i][k];
        for (i = 0; i < n; i++)
            for (k = 0; k < H; k++) {
                float s = 0;
                for (o = 0; o < H; o++) s += dz[i][o] * w[o * H + k];
                dh[i][k] = s;
            }
        if (sliced && ddp_grad_ready(ddp, id_wh[l]) != DDP_OK) return 0;   /* this layer's slice is final */
    }
    if (!sliced && ddp_grad_ready(ddp, id_wh[0]) != DDP_OK) return 0;     /* the stacked tensor: only now */
    for (i = 0; i < n; i++)
        for (o = 0; o < H; o++) {
            float d = dh[i][o] * (1.0f - a->h[0][i][o] * a->h[0][i][o]);
            g->b0[o] += d;
            for (k = 0; k < IN; k++) g->w0[o * IN + k] += d * a->x[i][k];
        }
    return ddp_grad_ready(ddp, *id_w0) == DDP_OK && ddp_grad_ready(ddp, *id_b0) == DDP_OK;
}

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    while (n--) h = (h ^ *b++) * 1099511628211ull;
    return h;
}

#define CHECK(call) do { if ((call) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 1; } } while (0)

int main(int argc, char **argv) {
    int steps = 20, batch = 8, accum = 1, sliced = 1, use_adamw = 0, i, l, step, rank, world;
    float lr = 0.05f, mu = 0.9f;
    const char *save = NULL;
    ddp_context *ddp = NULL;
    ddp_desc desc;
    model m, g;
    static acts a;
    int id_w0, id_b0, id_wh[LAYERS], id_wout, id_bout;
    float *momentum, *init;
    size_t total = 0, flat_n;
    for (i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--accum") && v) accum = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layout") && v && (!strcmp(v, "sliced") || !strcmp(v, "stacked"))) sliced = !strcmp(argv[++i], "sliced");
        else if (!strcmp(argv[i], "--save") && v) save = argv[++i];
        else if (!strcmp(argv[i], "--adamw")) use_adamw = 1;
        else {
            fprintf(stderr, "usage: %s [--steps N] [--batch B (per rank)] [--accum K] [--layout sliced|stacked] "
                    "[--adamw] [--save PATH]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1 || batch < 1 || accum < 1 || batch % accum || batch / accum > MAX_BATCH) {
        fprintf(stderr, "own_autograd: --steps >= 1, --batch >= 1, --accum dividing it, batch/accum <= %d\n", MAX_BATCH);
        return 2;
    }

    /* The program's initial parameters, in its own layout (one buffer). */
    for (i = 0; i < 5; i++) total += counts[i];
    if (!(init = (float *)malloc(total * sizeof(float)))) return 1;
    for (i = 0; i < (int)total; i++) init[i] = 0.3f * hash01(3, (uint64_t)i);

    /* ddp: the process group; buckets of 1024 floats so this small model has several */
    memset(&desc, 0, sizeof desc);
    desc.first_bucket_mb = desc.bucket_cap_mb = 1024.0 * sizeof(float) / 1048576.0;
    if (ddp_init(&ddp, &desc) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); ddp_shutdown(ddp); return 1; }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);

    /* ddp: register in the program's memory order, so the flat buffer IS the program's layout
       (every count here is a multiple of DDP_PARAM_ALIGN_FLOATS except bout, which is last). */
    {
        const float *at = init;
        CHECK(ddp_register_param(ddp, "w0", counts[0], 0, at, &id_w0));                  at += counts[0];
        CHECK(ddp_register_param(ddp, "b0", counts[1], DDP_NO_DECAY, at, &id_b0));       at += counts[1];
        if (sliced) {
            for (l = 0; l < LAYERS; l++) {
                char name[32];
                snprintf(name, sizeof name, "wh.%d", l);
                CHECK(ddp_register_param(ddp, name, (size_t)H * H, 0, at + (size_t)l * H * H, &id_wh[l]));
            }
        } else {
            CHECK(ddp_register_param(ddp, "wh", counts[2], 0, at, &id_wh[0]));
        }
        at += counts[2];
        CHECK(ddp_register_param(ddp, "wout", counts[3], 0, at, &id_wout));               at += counts[3];
        CHECK(ddp_register_param(ddp, "bout", counts[4], DDP_NO_DECAY, at, &id_bout));
    }
    CHECK(ddp_commit(ddp));   /* rank 0's initial values on every rank */
    m.w0 = ddp_param(ddp, id_w0); m.b0 = ddp_param(ddp, id_b0); m.wh = ddp_param(ddp, id_wh[0]);
    m.wout = ddp_param(ddp, id_wout); m.bout = ddp_param(ddp, id_bout);
    g.w0 = ddp_grad(ddp, id_w0); g.b0 = ddp_grad(ddp, id_b0); g.wh = ddp_grad(ddp, id_wh[0]);
    g.wout = ddp_grad(ddp, id_wout); g.bout = ddp_grad(ddp, id_bout);
    if (!m.w0 || !g.w0) {   /* NULL: e.g. DDP_PARAM_DTYPE=bf16 made the parameters bf16 (ddp_param_bf16) */
        fprintf(stderr, "own_autograd: %s\n", ddp_last_error(ddp));
        ddp_shutdown(ddp);
        return 1;
    }
    /* the stacked array is still one array: layer l's slice is where the program expects it */
    if (sliced)
        for (l = 1; l < LAYERS; l++)
            if (ddp_param(ddp, id_wh[l]) != m.wh + (size_t)l * H * H) {
                fprintf(stderr, "own_autograd: slice %d of wh is not contiguous\n", l);
                ddp_shutdown(ddp);
                return 1;
            }
    ddp_flat_params(ddp, &flat_n);
    if (!(momentum = (float *)calloc(flat_n, sizeof(float)))) { ddp_shutdown(ddp); return 1; }

    for (step = 0; step < steps; step++) {
        int micro, n = batch / accum;
        double loss = 0;
        float mean[1];
        CHECK(ddp_zero_grad(ddp));   /* ddp: not memset (see README: own autograd) */
        for (micro = 0; micro < accum; micro++) {
            /* ddp: rank r's samples of global batch `step`: [step*G + r*batch, ... + batch) */
            uint64_t first = (uint64_t)step * (uint64_t)batch * (uint64_t)world + (uint64_t)rank * (uint64_t)batch +
                             (uint64_t)micro * (uint64_t)n;
            for (i = 0; i < n; i++) sample(first + (uint64_t)i, a.x[i], &a.label[i]);
            loss += forward(&m, &a, n);
            ddp_set_sync(ddp, micro == accum - 1);   /* ddp: micro-steps accumulate, the last averages */
            if (!backward(ddp, &m, &g, &a, n, 1.0f / (float)batch, &id_wout, &id_bout, id_wh, sliced, &id_w0, &id_b0)) {
                fprintf(stderr, "%s\n", ddp_last_error(ddp));
                ddp_shutdown(ddp);
                return 1;
            }
            CHECK(ddp_finish(ddp));
        }
        if (use_adamw) {
            ddp_adamw opt = { 0 };
            opt.lr = lr * 0.1f;
            CHECK(ddp_adamw_step(ddp, &opt, NULL));
        } else {
            /* ddp: the program's own optimizer on ddp.h's buffers, after the guard */
            float *p = ddp_flat_params(ddp, NULL), *gr = ddp_flat_grads(ddp, NULL);
            size_t k;
            CHECK(ddp_consume_grads(ddp));
            for (k = 0; k < flat_n; k++) {
                momentum[k] = mu * momentum[k] + gr[k];
                p[k] -= lr * momentum[k];
            }
        }
        mean[0] = (float)(loss / batch);
        CHECK(ddp_allreduce(ddp, mean, 1, DDP_AVG));   /* the global batch's mean loss */
        if (rank == 0) printf("step %d loss %.7f\n", step + 1, mean[0]);
    }

    {   /* every rank holds the same bits? */
        uint64_t h = fnv1a(ddp_flat_params(ddp, NULL), flat_n * sizeof(float));
        float mine[2], root[2];
        ddp_step_stats st = ddp_last_step_stats(ddp);
        mine[0] = root[0] = (float)(h & 0xffffff);
        mine[1] = root[1] = (float)((h >> 24) & 0xffffff);
        CHECK(ddp_broadcast(ddp, root, sizeof root, 0));
        CHECK(ddp_allreduce(ddp, mine, 2, DDP_SUM));
        if (rank == 0) {
            int same = mine[0] == root[0] * (float)world && mine[1] == root[1] * (float)world;
            printf("replicas identical: %s (%d rank(s), parameters fnv1a %016llx)\n", same ? "yes" : "NO", world,
                   (unsigned long long)h);
            printf("last step: %d bucket(s), backward %.3f ms, comm %.3f ms, %.0f%% of it under the backward\n",
                   st.buckets_launched, st.backward_ms, st.comm_ms, st.overlap_pct);
            if (!same) { ddp_shutdown(ddp); return 1; }
        }
    }
    if (save && rank == 0) {   /* the program's layout: its own tensors, in order */
        FILE *f = fopen(save, "wb");
        int ok = f && fwrite(m.w0, sizeof(float), total - counts[4], f) == total - counts[4] &&
                 fwrite(m.bout, sizeof(float), counts[4], f) == counts[4];
        if (f) ok &= fclose(f) == 0;
        if (!ok) { fprintf(stderr, "own_autograd: cannot write %s\n", save); ddp_shutdown(ddp); return 1; }
    }
    free(momentum);
    free(init);
    return ddp_shutdown(ddp) == DDP_OK ? 0 : 1;
}
