/* equivalence_model.h — the model tests/test_equivalence.c trains, shared with the tests that
   train it on other backends (tests/test_fake_nccl.c, tests/gpu/test_gpu_train.cu): a 2-layer
   MLP (linear, tanh, linear, softmax cross-entropy) whose ops record their backward on the ddp
   tape, its data (example e of global batch `step`, the same on every rank), its registration
   and one AdamW step (weight decay, a no-decay bias, clipping). Include it after testlib.h.
   With -DTEST_PORTABLE_MATH the model's own arithmetic is +, -, *, / only (its exp below, and
   tanh from it), which every C library rounds alike; by default libm's expf and tanhf. */
#ifndef EQUIVALENCE_MODEL_H
#define EQUIVALENCE_MODEL_H

/* each includer uses what it needs of these */
#if defined(__GNUC__) || defined(__clang__)
#define MODEL_FN static __attribute__((unused))
#else
#define MODEL_FN static
#endif

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

MODEL_FN void linear_backward(void *p) {
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

MODEL_FN void linear(ddp_context *ddp, int w, int b, const float *x, float *y, int n, int in, int out, float *dx, const float *dy) {
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
MODEL_FN float test_exp(float x) {
    float r = x / 256.0f, p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int i;
    if (x < -80.0f) return 0.0f;
    for (i = 0; i < 8; i++) p *= p;
    return p;
}
/* tanh from it: (1 - e^-2|x|) / (1 + e^-2|x|), signed */
MODEL_FN float test_tanh(float x) {
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
MODEL_FN void tanh_backward(void *p) {
    const tanh_args *t = (const tanh_args *)p;
    size_t i;
    for (i = 0; i < t->n; i++) t->dh[i] = t->da[i] * (1.0f - t->a[i] * t->a[i]);
}

MODEL_FN void tanh_op(ddp_context *ddp, const float *h, float *a, size_t n, const float *da, float *dh) {
    tanh_args args;
    size_t i;
    for (i = 0; i < n; i++) a[i] = MODEL_TANH(h[i]);
    args.n = n; args.a = a; args.da = da; args.dh = dh;
    ddp_tape_record(ddp, tanh_backward, &args, sizeof args, NULL, 0);
}

/* Mean cross-entropy over this rank's examples; the gradient is computed right away (it needs
   nothing else), and scaled by `scale` for accumulation micro-steps. */
MODEL_FN float cross_entropy(const float *z, const int *label, float *dz, int n, float scale) {
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
MODEL_FN void make_example(int step, int e, float *x, int *label) {
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

MODEL_FN ddp_result mlp_init(mlp *m, ddp_context *ddp) {
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
   accumulation micro-steps; the global gradient norm into *norm (NULL: not wanted). On the fake
   GPU (tests/fakegpu) device memory is host memory: these CPU ops read parameters and write
   gradients in place, as kernels on the compute stream would. */
MODEL_FN ddp_result mlp_step_norm(mlp *m, int step, int first, int count, int micro, float *norm) {
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
    return ddp_adamw_step(m->ddp, &opt, norm);
}

MODEL_FN ddp_result mlp_step(mlp *m, int step, int first, int count, int micro) {
    return mlp_step_norm(m, step, first, count, micro, NULL);
}

#endif
