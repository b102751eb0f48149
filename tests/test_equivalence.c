/* test_equivalence.c — the central property: N ranks at batch B/N each train exactly the model
   that 1 rank trains at batch B, to float32 rounding, and all ranks hold the same bits.
   A 2-layer MLP (linear, tanh, linear, softmax cross-entropy) whose ops record their backward
   on the ddp tape; AdamW with weight decay, a no-decay bias and clipping; 30 steps.
   Each rank also trains the 1-rank reference itself, in a second single-rank context.
   Run: build/ddprun -n N build/test_equivalence      (N = 1, 2, 4; N must divide 32)
        build/test_equivalence --threads N           (the same, ranks as threads of one process)
   Rank 0 prints a hash of the final parameters ("params_hash"): the same N gives the same bits
   as processes or threads. Built with -DTEST_PORTABLE_MATH (and -ffp-contract=off) the model's
   own arithmetic is +, -, *, / only (its exp below, and tanh from it), which every C library
   rounds alike, so the Linux and Windows builds must print the same hashes (tests/test_windows.sh
   compares them); by default it uses libm's expf and tanhf (the GPU tests reuse this model). */
#include "testlib.h"

enum { IN = 24, HID = 64, CLASSES = 10, GLOBAL_BATCH = 32, STEPS = 30, MICRO = 2 };

typedef struct mlp {
    ddp_context *ddp;
    int w1, b1, w2, b2;
    /* activations and their gradients for the largest batch */
    float x[GLOBAL_BATCH * IN], h[GLOBAL_BATCH * HID], a[GLOBAL_BATCH * HID], z[GLOBAL_BATCH * CLASSES];
    float dh[GLOBAL_BATCH * HID], da[GLOBAL_BATCH * HID], dz[GLOBAL_BATCH * CLASSES];
    int label[GLOBAL_BATCH];
} mlp;

/* ---- ops: each forward records its backward with the parameters it finalizes ---- */
typedef struct { ddp_context *ddp; int w, b, n, in, out; const float *x; float *dx; const float *dy; } linear_args;

static void linear_backward(void *p) {
    const linear_args *l = (const linear_args *)p;
    const float *W = ddp_param(l->ddp, l->w);
    float *gW = ddp_grad(l->ddp, l->w), *gb = ddp_grad(l->ddp, l->b);
    int i, o, k;
    for (i = 0; i < l->n; i++)
        for (o = 0; o < l->out; o++) {
            float d = l->dy[i * l->out + o];
            gb[o] += d;
            for (k = 0; k < l->in; k++) gW[o * l->in + k] += d * l->x[i * l->in + k];
        }
    if (l->dx)
        for (i = 0; i < l->n; i++)
            for (k = 0; k < l->in; k++) {
                float s = 0;
                for (o = 0; o < l->out; o++) s += l->dy[i * l->out + o] * W[o * l->in + k];
                l->dx[i * l->in + k] = s;
            }
}

static void linear(ddp_context *ddp, int w, int b, const float *x, float *y, int n, int in, int out, float *dx, const float *dy) {
    const float *W = ddp_param(ddp, w), *B = ddp_param(ddp, b);
    linear_args args;
    int ids[2], i, o, k;
    for (i = 0; i < n; i++)
        for (o = 0; o < out; o++) {
            float s = B[o];
            for (k = 0; k < in; k++) s += W[o * in + k] * x[i * in + k];
            y[i * out + o] = s;
        }
    args.ddp = ddp; args.w = w; args.b = b; args.n = n; args.in = in; args.out = out; args.x = x; args.dx = dx; args.dy = dy;
    ids[0] = w; ids[1] = b;
    ddp_tape_record(ddp, linear_backward, &args, sizeof args, ids, 2);
}

/* exp(x) for x <= 0 (all the softmax needs): e^(x/256) by its Taylor series to the 7th power
   (|x/256| is small), then squared 8 times. Accurate to ~1e-6 relative, and the same bits on
   every platform (no libm). */
#ifdef TEST_PORTABLE_MATH
static float test_exp(float x) {
    float r = x / 256.0f, p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int i;
    if (x < -80.0f) return 0.0f;
    for (i = 0; i < 8; i++) p *= p;
    return p;
}
/* tanh from it: (1 - e^-2|x|) / (1 + e^-2|x|), signed */
static float test_tanh(float x) {
    float e = test_exp(-2.0f * (x < 0 ? -x : x)), t = (1.0f - e) / (1.0f + e);
    return x < 0 ? -t : t;
}
#define MODEL_EXP test_exp
#define MODEL_TANH test_tanh
#else
#define MODEL_EXP expf
#define MODEL_TANH tanhf
#endif

typedef struct { size_t n; const float *a; const float *da; float *dh; } tanh_args;
static void tanh_backward(void *p) {
    const tanh_args *t = (const tanh_args *)p;
    size_t i;
    for (i = 0; i < t->n; i++) t->dh[i] = t->da[i] * (1.0f - t->a[i] * t->a[i]);
}

static void tanh_op(ddp_context *ddp, const float *h, float *a, size_t n, const float *da, float *dh) {
    tanh_args args;
    size_t i;
    for (i = 0; i < n; i++) a[i] = MODEL_TANH(h[i]);
    args.n = n; args.a = a; args.da = da; args.dh = dh;
    ddp_tape_record(ddp, tanh_backward, &args, sizeof args, NULL, 0);
}

/* Mean cross-entropy over this rank's examples; the gradient is computed right away (it needs
   nothing else), and scaled by `scale` for accumulation micro-steps. */
static float cross_entropy(const float *z, const int *label, float *dz, int n, float scale) {
    float loss = 0;
    int i, c;
    for (i = 0; i < n; i++) {
        float mx = z[i * CLASSES], sum = 0;
        for (c = 1; c < CLASSES; c++) mx = fmaxf(mx, z[i * CLASSES + c]);
        for (c = 0; c < CLASSES; c++) sum += MODEL_EXP(z[i * CLASSES + c] - mx);
        for (c = 0; c < CLASSES; c++) {
            float pr = MODEL_EXP(z[i * CLASSES + c] - mx) / sum;
            dz[i * CLASSES + c] = scale * (pr - (c == label[i])) / (float)n;
        }
        loss += (logf(sum) + mx - z[i * CLASSES + label[i]]) / (float)n;
    }
    return loss;
}

/* ---- data: example e of global batch `step`, the same on every rank ---- */
static void make_example(int step, int e, float *x, int *label) {
    uint64_t id = (uint64_t)step * GLOBAL_BATCH + (uint64_t)e;
    float best = -1e30f;
    int k, c;
    for (k = 0; k < IN; k++) x[k] = test_value(id, (uint64_t)k);
    *label = 0;
    for (c = 0; c < CLASSES; c++) {   /* a fixed random teacher decides the label */
        float s = 0;
        for (k = 0; k < IN; k++) s += test_value(999, (uint64_t)(c * IN + k)) * x[k];
        if (s > best) { best = s; *label = c; }
    }
}

static ddp_result mlp_init(mlp *m, ddp_context *ddp) {
    float w1[HID * IN], w2[CLASSES * HID];
    int i;
    ddp_result r;
    m->ddp = ddp;
    for (i = 0; i < HID * IN; i++) w1[i] = test_value(11, (uint64_t)i) / sqrtf((float)IN);
    for (i = 0; i < CLASSES * HID; i++) w2[i] = test_value(12, (uint64_t)i) / sqrtf((float)HID);
    if ((r = ddp_register_param(ddp, "fc1.weight", HID * IN, 0, w1, &m->w1)) != DDP_OK) return r;
    if ((r = ddp_register_param(ddp, "fc1.bias", HID, DDP_NO_DECAY, NULL, &m->b1)) != DDP_OK) return r;
    if ((r = ddp_register_param(ddp, "fc2.weight", CLASSES * HID, 0, w2, &m->w2)) != DDP_OK) return r;
    if ((r = ddp_register_param(ddp, "fc2.bias", CLASSES, DDP_NO_DECAY, NULL, &m->b2)) != DDP_OK) return r;
    return ddp_commit(ddp);
}

/* One optimizer step over examples [first, first + count) of global batch `step`, in `micro`
   accumulation micro-steps. */
static ddp_result mlp_step(mlp *m, int step, int first, int count, int micro) {
    ddp_adamw opt;
    ddp_result r;
    int u, i, n = count / micro;
    memset(&opt, 0, sizeof opt);
    opt.lr = 0.01f; opt.weight_decay = 0.05f; opt.max_grad_norm = 1.0f;
    if ((r = ddp_zero_grad(m->ddp)) != DDP_OK) return r;
    for (u = 0; u < micro; u++) {
        for (i = 0; i < n; i++) make_example(step, first + u * n + i, m->x + i * IN, &m->label[i]);
        ddp_set_sync(m->ddp, u == micro - 1);
        linear(m->ddp, m->w1, m->b1, m->x, m->h, n, IN, HID, NULL, m->dh);
        tanh_op(m->ddp, m->h, m->a, (size_t)n * HID, m->da, m->dh);
        linear(m->ddp, m->w2, m->b2, m->a, m->z, n, HID, CLASSES, m->da, m->dz);
        cross_entropy(m->z, m->label, m->dz, n, 1.0f / (float)micro);
        if ((r = ddp_backward(m->ddp)) != DDP_OK) return r;
    }
    return ddp_adamw_step(m->ddp, &opt, NULL);
}

/* One rank's whole run: desc NULL = the process group from the environment (ddprun), else by
   hand (a thread-rank). Only a loud rank prints. Returns the failures it saw. */
static int run_rank(const ddp_desc *desc, int loud) {
    ddp_context *ddp, *solo;
    ddp_desc solo_desc;
    mlp *model = (mlp *)calloc(1, sizeof(mlp)), *reference = (mlp *)calloc(1, sizeof(mlp));
    int rank, world, step, micro, bad = 0, failures = 0;
    size_t count, i;
    double worst = 0, tol_abs = 2e-6, tol_rel = 2e-5;
    char name[96];
    memset(&solo_desc, 0, sizeof solo_desc);
    solo_desc.world_size = 1;
    if (!model || !reference) { printf("FAIL equivalence: out of memory\n"); return 1; }
    if (ddp_init(&ddp, desc) != DDP_OK || ddp_init(&solo, &solo_desc) != DDP_OK) {
        fprintf(stderr, "%s\n", ddp_last_error(ddp));
        return 1;
    }
    rank = ddp_rank(ddp);
    world = ddp_world_size(ddp);
    if (GLOBAL_BATCH % (world * MICRO)) { printf("FAIL equivalence: world %d must divide %d\n", world, GLOBAL_BATCH / MICRO); return 1; }
    for (micro = 1; micro <= MICRO; micro++) {
        ddp_context *d = ddp;
        if (micro == 2) {   /* a fresh process group for the accumulation run */
            ddp_desc again;
            ddp_shutdown(ddp);
            ddp_shutdown(solo);
            ddp_init(&solo, &solo_desc);
            if (desc) { again = *desc; again.master_port = desc->master_port + 1; }   /* the first store's port may linger */
            if (ddp_init(&d, desc ? &again : NULL) != DDP_OK) { printf("FAIL reinit: %s\n", ddp_last_error(d)); return 1; }
        }
        memset(model, 0, sizeof *model);
        memset(reference, 0, sizeof *reference);
        if (mlp_init(model, d) != DDP_OK || mlp_init(reference, solo) != DDP_OK) {
            printf("FAIL init: %s / %s\n", ddp_last_error(d), ddp_last_error(solo));
            return 1;
        }
        for (step = 0; step < STEPS; step++) {
            int n = GLOBAL_BATCH / world;
            if (mlp_step(model, step, rank * n, n, micro) != DDP_OK) {
                printf("FAIL equivalence_ranks%d: step %d: %s\n", world, step, ddp_last_error(d));
                return 1;
            }
            if (mlp_step(reference, step, 0, GLOBAL_BATCH, 1) != DDP_OK) {
                printf("FAIL reference: %s\n", ddp_last_error(solo));
                return 1;
            }
        }
        {
            const float *got = ddp_flat_params(d, &count), *want = ddp_flat_params(solo, NULL);
            uint64_t mine = test_hash(got, count * sizeof(float)), rank0 = mine;
            float fails;
            for (i = 0; i < count; i++) {
                double err = fabs((double)got[i] - want[i]), tol = tol_abs + tol_rel * fabs(want[i]);
                if (err > tol) bad++;
                if (err / tol > worst) worst = err / tol;
            }
            ddp_broadcast(d, &rank0, sizeof rank0, 0);
            fails = (float)bad;
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            failures += fails != 0;
            snprintf(name, sizeof name, "equivalence_ranks%d_accum%d_vs_1rank_batch%d", world, micro, GLOBAL_BATCH);
            if (loud) {
                verdict(fails == 0, name, "%g parameter(s) beyond |err| <= %g + %g*|ref| (worst %.2f of tolerance)",
                        fails, tol_abs, tol_rel, worst);
                printf("  (%s: worst error %.3f of the tolerance |err| <= %g + %g*|ref|)\n", name, worst, tol_abs, tol_rel);
                printf("params_hash ranks%d_accum%d %016llx reference %016llx\n", world, micro, (unsigned long long)rank0,
                       (unsigned long long)test_hash(want, count * sizeof(float)));
            }
            fails = (float)(rank0 != mine);
            ddp_allreduce(d, &fails, 1, DDP_SUM);
            failures += fails != 0;
            snprintf(name, sizeof name, "equivalence_ranks%d_accum%d_bitwise_identical_across_ranks", world, micro);
            if (loud) verdict(fails == 0, name, "%g rank(s) differ from rank 0", fails);
            if (world == 1 && micro == 1 && loud) {   /* one rank through ddp.h is the reference, bit for bit */
                verdict(memcmp(got, want, count * sizeof(float)) == 0, "equivalence_ranks1_bitwise_equals_reference", "differs");
            }
        }
        ddp = d;
    }
    ddp_shutdown(solo);
    if (ddp_shutdown(ddp) != DDP_OK) { printf("FAIL shutdown: %s\n", ddp_last_error(ddp)); return 1; }
    free(model);
    free(reference);
    return failures;
}

typedef struct { ddp_desc desc; int failures; } thread_rank;
static void *thread_rank_main(void *arg) {
    thread_rank *t = (thread_rank *)arg;
    t->failures = run_rank(&t->desc, t->desc.rank == 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--threads")) {   /* ranks as threads of this process */
        thread_rank ranks[16];
        pthread_t threads[16];
        int world = atoi(argv[2]), r, port = test_free_port(), failures = 0;
        if (world < 1 || world > 16) { printf("FAIL equivalence: --threads takes 1 to 16\n"); return 2; }
        for (r = 0; r < world; r++) {
            memset(&ranks[r], 0, sizeof ranks[r]);
            ranks[r].desc.world_size = world;
            ranks[r].desc.rank = r;
            ranks[r].desc.master_port = port;
            ranks[r].desc.timeout_s = 60;
            ranks[r].desc.job_token = "test-equivalence-threads";
            pthread_create(&threads[r], NULL, thread_rank_main, &ranks[r]);
        }
        for (r = 0; r < world; r++) { pthread_join(threads[r], NULL); failures += ranks[r].failures; }
        if (failures && !test_failures) printf("FAIL equivalence_threads%d: a rank saw %d failure(s)\n", world, failures);
        return failures || test_failures ? 1 : test_summary("test_equivalence");
    }
    if (argc != 1) { printf("usage: test_equivalence [--threads N]   (without it: launched by ddprun)\n"); return 2; }
    {
        const char *rank = getenv("RANK");
#ifdef _WIN32
        const char *null_device = "NUL";
#else
        const char *null_device = "/dev/null";
#endif
        if (rank && strcmp(rank, "0")) { FILE *quiet = freopen(null_device, "w", stdout); (void)quiet; }
    }
    if (run_rank(NULL, 1) && !test_failures) return 1;
    return test_summary("test_equivalence");
}
