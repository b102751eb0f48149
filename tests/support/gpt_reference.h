/* gpt_reference.h — what tests/test_gpt.c and tests/gpu/test_gpt_gpu.cu share: the reader of
   tests/gpt_reference.bin (written by tests/support/gpt_reference.py: the tiny GPT in PyTorch,
   float64; the format is in that script), its AdamW settings and fixed batch, the tolerance
   measure both compare with, and the BLAS thread setting of the sanitizer builds. Include after
   testlib.h and examples/gpt/gpt.h. */
#ifndef GPT_REFERENCE_H
#define GPT_REFERENCE_H

#define REF_PATH "tests/gpt_reference.bin"

typedef struct reference {
    int32_t layers, heads, dim, seq, batch, vocab, steps;
    uint32_t seed;
    float lr, beta1, beta2, eps, wd, clip;
    int64_t num_floats;
    int32_t *data;
    float *init, *logits, loss, *grads, *step_losses, *final;
} reference;

/* The AdamW settings the reference's 10 steps used. */
static ddp_adamw reference_adamw(const reference *r) {
    ddp_adamw opt;
    memset(&opt, 0, sizeof opt);
    opt.lr = r->lr; opt.beta1 = r->beta1; opt.beta2 = r->beta2; opt.eps = r->eps;
    opt.weight_decay = r->wd; opt.max_grad_norm = r->clip;
    return opt;
}

/* The reference's fixed batch as model inputs: each row of data holds seq + 1 bytes, the
   tokens and, shifted by one, their targets. The caller frees *tok and *tgt. */
static void reference_batch(const reference *r, int **tok, int **tgt) {
    int b, t;
    *tok = (int *)malloc(sizeof(int) * (size_t)r->batch * r->seq);
    *tgt = (int *)malloc(sizeof(int) * (size_t)r->batch * r->seq);
    for (b = 0; b < r->batch; b++)
        for (t = 0; t < r->seq; t++) {
            (*tok)[b * r->seq + t] = r->data[b * (r->seq + 1) + t];
            (*tgt)[b * r->seq + t] = r->data[b * (r->seq + 1) + t + 1];
        }
}

static int read_reference(reference *r, char *why, size_t n) {
    FILE *f = fopen(REF_PATH, "rb");
    char magic[8];
    size_t P, BT, ok = 1;
    memset(r, 0, sizeof *r);
    if (!f) { snprintf(why, n, "cannot open %s (run from the repository root)", REF_PATH); return 0; }
    ok = fread(magic, 8, 1, f) == 1 && memcmp(magic, "GPTREF01", 8) == 0 &&
         fread(&r->layers, 4, 7, f) == 7 && fread(&r->seed, 4, 1, f) == 1 && fread(&r->lr, 4, 6, f) == 6 &&
         fread(&r->num_floats, 8, 1, f) == 1 && r->vocab == GPT_VOCAB && r->num_floats > 0 && r->steps > 0;
    if (ok) {
        P = (size_t)r->num_floats;
        BT = (size_t)r->batch * r->seq;
        r->data = (int32_t *)malloc(sizeof(int32_t) * (size_t)r->batch * (r->seq + 1));
        r->init = (float *)malloc(sizeof(float) * P);
        r->logits = (float *)malloc(sizeof(float) * BT * GPT_VOCAB);
        r->grads = (float *)malloc(sizeof(float) * P);
        r->step_losses = (float *)malloc(sizeof(float) * (size_t)r->steps);
        r->final = (float *)malloc(sizeof(float) * P);
        ok = r->data && r->init && r->logits && r->grads && r->step_losses && r->final &&
             fread(r->data, 4, (size_t)r->batch * (r->seq + 1), f) == (size_t)r->batch * (r->seq + 1) &&
             fread(r->init, 4, P, f) == P && fread(r->logits, 4, BT * GPT_VOCAB, f) == BT * GPT_VOCAB &&
             fread(&r->loss, 4, 1, f) == 1 && fread(r->grads, 4, P, f) == P &&
             fread(r->step_losses, 4, (size_t)r->steps, f) == (size_t)r->steps && fread(r->final, 4, P, f) == P;
    }
    fclose(f);
    if (!ok) snprintf(why, n, "%s is malformed or truncated (regenerate: /usr/bin/python3 tests/support/gpt_reference.py)", REF_PATH);
    return (int)ok;
}

/* Worst |got - want| / (atol + rtol |want|) over n values, atol = abs + rel_max * max|want|. */
static double worst_ratio(const float *got, const float *want, size_t n, double abs_tol, double rel_max, double rtol) {
    double mx = 0, worst = 0, atol;
    size_t i;
    for (i = 0; i < n; i++) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
    atol = abs_tol + rel_max * mx;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (atol + rtol * fabs(want[i]));
        if (!(e <= worst)) worst = e;   /* NaN counts as the worst */
    }
    return worst;
}

/* OpenBLAS's worker threads are not instrumented: under ThreadSanitizer their hand-offs read as
   races. The sanitizer builds check ddp.h and the model, with one BLAS thread. */
static void test_blas_threads(void) {
#ifdef TEST_SANITIZED
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
#endif
}

#endif
