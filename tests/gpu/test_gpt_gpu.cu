/* test_gpt_gpu.cu — the CUDA model of examples/gpt (gpt_cuda.cuh), one rank:
   1. Against tests/gpt_reference.bin (PyTorch, float64), exactly as tests/test_gpt.c part 1
      checks the CPU model: the seeded init reproduces the file's parameters bit for bit; one
      fixed batch gives its logits, loss and every gradient; 10 AdamW steps (clip, weight decay)
      give its 10 losses and final parameters. The tolerances but the last are the CPU model's:
          logits, loss, step losses  |err| <= 1e-5 * max|ref| + 1e-5 * |ref|
          each gradient tensor       |err| <= 1e-4 * max|ref of that tensor| + 1e-4 * |ref|
      Why the same: they bound float32 rounding against float64, and the GPU's float32 differs
      from the CPU's only in which roundings happen — expf/logf/sqrtf within 1-2 ulp of the
      correctly rounded value (the CPU's exp polynomial is ~1 ulp too), fused multiply-adds
      (one rounding fewer), and cuBLAS's summation order (blocked, if anything more accurate
      than a dot product's running sum). None of that changes the size of the error, so a
      looser bound would only hide bugs. (The CPU model uses 1.4% and 0.5% of them.)
      The final parameters get a bound of their own, element by element, from a float32 error
      analysis of the gradients and of AdamW's answer to their errors (see adam_bound below):
      the CPU model's |err| <= 2e-5 + 1e-4*|ref| is met by both float32 models on the host (at
      0.41 and 0.455 of it), but only by luck where a gradient is pure rounding noise (the key
      bias), which AdamW turns into a step of up to lr; a GPU's summation order may be unluckier.
      The first run prints the worst elements: value, reference, error, bound.
   2. Against the CPU model (gpt.h) on the same batches, at configs whose sizes are not
      multiples of a warp: the logits of the first forward, the loss of every forward and every
      gradient after each of 4 steps (1, then 2 accumulated micro-steps), each step starting
      both models from the same parameters (the CPU's, uploaded). Tolerances: part 1's (two
      float32 computations of one function, each within those bounds of the exact result).
      Parameters after several AdamW steps are compared only in part 1, against float64: AdamW
      divides each element's gradient by its own RMS, so an element whose gradient is a
      near-cancelling sum moves by a fraction of lr in a direction that rounding decides, and
      two float32 implementations drift apart by amounts no |ref|-relative bound covers (seen
      in emulation: 3e-5, 1.4x that bound, in mlp.proj.w after 4 steps at lr 1e-3, width 384).
   3. Determinism: two identical training runs (fresh contexts, 4 steps of 2 accumulated
      micro-steps) give the same losses and parameters, bit for bit.
   4. --bf16 (GPT_CUDA_BF16) against fp32 from the same bf16-rounded parameters: logits, loss,
      every gradient, 8 AdamW steps' losses, within bounds counted from bf16's unit roundoff
      (see test_cuda_bf16); on ddp.h's bf16 parameters the same losses as on the model's own
      bf16 copies.
   5. The bf16 matmul at a split-K shape (K = 8192) against the bound of one rounding (see
      test_cuda_bf16_gemm).
   6. GPT_KERNELS=2 (the segmented token-embedding backward, the one-pass softmax, 16-byte
      elementwise maps, one batched matmul per attention matmul, the fused LayerNorm backward)
      against the CPU model as in part 2, with batches where a byte fills several segments; the
      maps, the batched attention matmuls and the fused LayerNorm backward against GPT_KERNELS=1's
      kernels and calls bit for bit (fp32 and bf16).
   7. GPT_ATTENTION=fused (no [T, T] matrices) against the explicit attention: the op at an odd
      shape, fp32 and bf16, forward and dQ, dK, dV, with and without dropout, within bounds
      derived there (see test_fused_attention_op), and a broken mask that must fail them; the
      switch; the model against the CPU model as in part 2 (with dropout); part 4 with both
      models fused (the bf16 model then rounds neither scores nor probabilities: fewer roundings
      than part 4's bounds count).
   Parts: all by default; `test_gpt_gpu bf16 gemm` (or GPT_GPU_PARTS=bf16,gemm) runs those only.
   Built twice from this file: by nvcc (build/gpu/test_gpt_gpu: NCCL backend; prints "SKIP
   gpu: ..." without a device) and by a C++ compiler with -DGPT_CUDA_EMULATE
   (build/test_gpt_gpu_emulated: the model's kernels and matmuls run on the host, CPU backend;
   part of `make test`, so everything but the CUDA calls is checked on every machine; the
   larger config of part 2 only with GPT_TEST_LARGER=1 there, as the host's naive sgemm needs
   minutes for it — it passed: gradients 0.010, losses 0.000 of the tolerances). */
#include "../testlib.h"
#include "../../examples/gpt/gpt.h"
#include "../support/gpt_reference.h"   /* test_gpt.c's reference reader and worst_ratio */
#ifndef GPT_CUDA_EMULATE
#include "gpu_common.h"
#endif
#include "../../examples/gpt/gpt_cuda.cuh"

#ifdef GPT_CUDA_EMULATE
#define NAME(s) "gpt_cuda_emulated_" s
#else
#define NAME(s) "gpt_cuda_" s
#endif

/* A single-rank context: NCCL with the per-thread default stream as the compute stream (as
   train_gpt), or the CPU backend (the CPU model, and the emulated CUDA model). */
static ddp_context *open_solo_dtype(int for_cuda_model, ddp_dtype param_dtype) {
    ddp_context *ddp;
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.param_dtype = param_dtype;
    d.world_size = 1;
    d.backend = DDP_BACKEND_CPU;
#ifndef GPT_CUDA_EMULATE
    if (for_cuda_model) { d.backend = DDP_BACKEND_NCCL; d.cuda_stream = (void *)cudaStreamPerThread; }
#else
    (void)for_cuda_model;
#endif
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL %s: %s\n", NAME("init"), ddp_last_error(ddp)); exit(1); }
    return ddp;
}
static ddp_context *open_solo(int for_cuda_model) { return open_solo_dtype(for_cuda_model, DDP_DTYPE_FP32); }

/* n floats of device memory (host memory in emulation) as a fresh host array. */
static float *download(ddp_context *ddp, const float *device, size_t n) {
    float *host = (float *)malloc(n * sizeof(float) + 1);
    if (!host) { printf("FAIL %s: out of memory\n", NAME("download")); exit(1); }
    gpt_cuda_download(ddp_config(ddp)->cuda_stream, host, device, n * sizeof(float));
    return host;
}

static void step_or_die(ddp_context *ddp, ddp_result r, const char *what) {
    if (r != DDP_OK) { printf("FAIL %s: %s: %s\n", NAME("step"), what, ddp_last_error(ddp)); exit(1); }
}

static float one_loss(gpt_cuda *m) {
    int n = 0;
    const float *l = gpt_cuda_losses(m, &n);
    if (n != 1) { printf("FAIL %s: %d losses read back, 1 expected\n", NAME("loss_readback"), n); exit(1); }
    return l[0];
}

/* Worst error over every gradient tensor (device) against packed host values, naming the worst. */
static double worst_gradient(ddp_context *ddp, const float *want_packed, ddp_context *want_ctx, char *bad, size_t badn, int *nbad,
                             const char **worst_name) {
    size_t off = 0, len = 0;
    double worst = 0;
    int i;
    *nbad = 0;
    bad[0] = 0;
    *worst_name = ddp_param_name(ddp, 0);
    for (i = 0; i < ddp_num_params(ddp); i++) {
        size_t n = ddp_param_count(ddp, i);
        float *got = download(ddp, ddp_grad(ddp, i), n);
        const float *want = want_ctx ? ddp_grad(want_ctx, i) : want_packed + off;
        double w = worst_ratio(got, want, n, 0, 1e-4, 1e-4);
        if (w > worst) { worst = w; *worst_name = ddp_param_name(ddp, i); }
        if (!(w <= 1) && len + 80 < badn)
            len += (size_t)snprintf(bad + len, badn - len, "%s%s (%.3g)", (*nbad)++ ? ", " : "", ddp_param_name(ddp, i), w);
        off += n;
        free(got);
    }
    return worst;
}

/* Every tensor of a context (parameters or gradients, device memory) as one packed host array,
   in registration order: the reference file's layout. The caller frees it. */
static float *download_packed(ddp_context *ddp, int grads) {
    size_t total = 0, off = 0;
    float *all;
    int i;
    for (i = 0; i < ddp_num_params(ddp); i++) total += ddp_param_count(ddp, i);
    all = (float *)malloc(total * sizeof(float) + 1);
    if (!all) { printf("FAIL %s: out of memory\n", NAME("download")); exit(1); }
    for (i = 0; i < ddp_num_params(ddp); i++) {
        size_t n = ddp_param_count(ddp, i);
        float *t = download(ddp, grads ? ddp_grad(ddp, i) : ddp_param(ddp, i), n);
        memcpy(all + off, t, n * sizeof(float));
        free(t);
        off += n;
    }
    return all;
}

/* ---- The parameters after 10 AdamW steps against float64: a bound from an error analysis ----
   Element i may differ from the float64 reference by
       bound_i = 2 * ( T*4u*(|ref_i| + lr) + sum over steps t of lr * min(2 U_t, 2 eta_t / (sqrt(vhat_i,t) + eps)) )
   u = 2^-24 (float32's unit roundoff), T steps, lr, eps: the run's. Why:
   - AdamW's own float32 arithmetic. Each step p <- p - lr*(mhat/(sqrt(vhat)+eps) + wd*p) rounds m, v,
     the square root, the quotient and the update: at most ~4u relative to |p| (and u*lr for the
     step itself) per step, T*4u*(|p| + lr) in all, whatever the order or fusion of the operations.
   - The gradient's own rounding, eta. A gradient element is reached from the loss through at most
     D = 4 + 10 L ops (cross-entropy, the tied head, the final LayerNorm, the embedding's sum; per
     layer the MLP's two matmuls and GELU, LayerNorm twice, the attention's projection, its softmax
     and three matmuls, the qkv matmul). Each sums at most K terms, K = max(vocab, 4C, B*T); a sum
     of K float32 terms in ANY order, fused multiply-adds or not (so cuBLAS's blocking and split-K,
     nvcc's contraction and the CPU's loops alike), is off by at most (K-1)u times the sum of its
     terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), and to first
     order the errors of a chain of ops add: eta <= D*K*u*S. S, the size of the terms, is taken
     as the tensor's largest |gradient| at that step: for a sum that cancels (below) the terms
     are no larger than the tensor's other gradients.
   - AdamW's answer to that error. The update mhat/(sqrt(vhat)+eps) moves by at most
     2 eta/(sqrt(vhat)+eps) when every gradient moves by eta (mhat by eta, sqrt(vhat) by at most
     eta), and by at most 2 U_t whatever the gradients: U_t = sqrt(sum_k w1_k^2 / w2_k) over the
     bias-corrected moment weights is the largest |mhat|/sqrt(vhat) any gradient sequence can
     give (Cauchy-Schwarz; ~1). So an element with a healthy gradient (sqrt(vhat) >> eta) is
     off by ~lr*T*2 eta/|g| ~ 1e-5 here, while one whose exact gradient is ZERO is moved by
     rounding noise alone, up to ~lr per step in a direction rounding decides: the attention's
     key bias (softmax ignores a constant added to a row of scores), whose float64 gradient is
     1e-20 and ours noise of ~1e-12 that AdamW divides by its own RMS. No |ref|-relative bound
     covers those; this one gives them lr*T*4 and stays tight everywhere else. A bug in them is
     left to the gradient check above (exact zeros, within 1e-4 of the tensor's largest).
   - The factor 2: a first-order analysis; the parameters' own errors change later gradients.
   sqrt(vhat) and eta come from this run's own gradients, downloaded at each step (within 1e-4
   of float64, as checked above) and clipped as ddp.h clips them. The bound is what it must be
   to pass without a bug; that it still catches one is checked too: the same run at lr x 1.01
   must exceed it, and an error of one step (lr) in one element must exceed it at most elements
   (seen in emulation: 8.5% of the parameters beyond it at lr x 1.01; 73% of the elements would
   show a one-step error, 45% a tenth of one; the real errors are at most 0.003 of it). (A wrong gradient SCALE would not show here at all: AdamW divides it out; the
   gradient check above is where that is caught.) */
typedef struct {
    size_t n;
    int steps;
    double *m, *v, *noise;       /* AdamW's moments as the run's own gradients make them; the noise term */
    double gamma;                /* D*K*u */
    double u_bound_sum;          /* sum of U_t, for the report */
} adam_bound;

static void adam_bound_init(adam_bound *b, size_t n, const gpt_config *cfg) {
    int D = 4 + 10 * cfg->layers, K = GPT_VOCAB;
    if (4 * cfg->dim > K) K = 4 * cfg->dim;
    if (cfg->batch * cfg->seq > K) K = cfg->batch * cfg->seq;
    memset(b, 0, sizeof *b);
    b->n = n;
    b->m = (double *)calloc(n, sizeof(double));
    b->v = (double *)calloc(n, sizeof(double));
    b->noise = (double *)calloc(n, sizeof(double));
    if (!b->m || !b->v || !b->noise) { printf("FAIL %s: out of memory\n", NAME("adam_bound")); exit(1); }
    b->gamma = (double)D * K * ldexp(1.0, -24);
}

static void adam_bound_free(adam_bound *b) { free(b->m); free(b->v); free(b->noise); }

/* One step: g is this step's gradient as the run computed it (packed), norm its global norm
   before clipping (ddp_adamw_step's). */
static void adam_bound_step(adam_bound *b, ddp_context *ddp, const float *g, float norm, const ddp_adamw *opt) {
    double b1 = opt->beta1 > 0 ? opt->beta1 : 0.9, b2 = opt->beta2 > 0 ? opt->beta2 : 0.999;
    double eps = opt->eps > 0 ? opt->eps : 1e-8, clip = 1, bc1, bc2, ut = 0;
    size_t off = 0, k;
    int t, i;
    if (opt->max_grad_norm > 0 && norm > opt->max_grad_norm) clip = opt->max_grad_norm / ((double)norm + 1e-6);
    t = ++b->steps;
    bc1 = 1 - pow(b1, t);
    bc2 = 1 - pow(b2, t);
    for (i = 1; i <= t; i++) {   /* U_t: the bias-corrected weights of gradient t-i+1 in mhat and vhat */
        double w1 = (1 - b1) * pow(b1, t - i) / bc1, w2 = (1 - b2) * pow(b2, t - i) / bc2;
        ut += w1 * w1 / w2;
    }
    ut = sqrt(ut);
    b->u_bound_sum += ut;
    for (i = 0; i < ddp_num_params(ddp); i++) {
        size_t n = ddp_param_count(ddp, i);
        double big = 0, eta;
        for (k = off; k < off + n; k++) big = fabs(clip * g[k]) > big ? fabs(clip * g[k]) : big;
        eta = b->gamma * big;
        for (k = off; k < off + n; k++) {
            double gk = clip * g[k], d;
            b->m[k] = b1 * b->m[k] + (1 - b1) * gk;
            b->v[k] = b2 * b->v[k] + (1 - b2) * gk * gk;
            d = 2 * eta / (sqrt(b->v[k] / bc2) + eps);
            b->noise[k] += (double)opt->lr * (d < 2 * ut ? d : 2 * ut);
        }
        off += n;
    }
}

static double adam_bound_at(const adam_bound *b, size_t k, double ref, double lr) {
    return 2 * (b->steps * 4 * ldexp(1.0, -24) * (fabs(ref) + lr) + b->noise[k]);
}

/* The tensor holding packed element k, and k's index in it. */
static const char *tensor_of(ddp_context *ddp, size_t k, size_t *at) {
    int i;
    for (i = 0; i < ddp_num_params(ddp); i++) {
        size_t n = ddp_param_count(ddp, i);
        if (k < n) { *at = k; return ddp_param_name(ddp, i); }
        k -= n;
    }
    *at = 0;
    return "?";
}

/* 10 steps from the reference's parameters on a fresh model at lr * lr_scale; the packed final
   parameters (the caller frees them). */
static float *train_reference(const reference *ref, const int *tok, const int *tgt, float lr_scale) {
    ddp_context *ddp = open_solo(1);
    gpt_cuda m;
    gpt_config cfg;
    ddp_adamw opt = reference_adamw(ref);
    size_t off = 0;
    float *final;
    int i, s;
    cfg.layers = ref->layers; cfg.heads = ref->heads; cfg.dim = ref->dim; cfg.seq = ref->seq; cfg.batch = ref->batch;
    if (gpt_cuda_create(&m, ddp, &cfg, ref->seed, 0) != DDP_OK) { printf("FAIL %s: %s\n", NAME("create"), ddp_last_error(ddp)); exit(1); }
    for (i = 0; i < ddp_num_params(ddp); i++) {
        size_t n = ddp_param_count(ddp, i);
        gpt_cuda_upload(ddp_config(ddp)->cuda_stream, ddp_param(ddp, i), ref->init + off, n * sizeof(float));
        off += n;
    }
    opt.lr *= lr_scale;
    for (s = 0; s < ref->steps; s++) {
        step_or_die(ddp, ddp_zero_grad(ddp), "zero_grad");
        gpt_cuda_forward(&m, tok, tgt, ref->batch, ref->seq, 1.0f, 1);
        step_or_die(ddp, ddp_backward(ddp), "backward");
        step_or_die(ddp, ddp_adamw_step(ddp, &opt, NULL), "adamw");
    }
    final = download_packed(ddp, 0);
    gpt_cuda_destroy(&m);
    ddp_shutdown(ddp);
    return final;
}

/* Checks the final parameters against the reference with the bound, prints the worst elements;
   then shows the bound catches a 1% learning-rate error and a one-element error. */
static void check_final_params(ddp_context *ddp, const reference *ref, const adam_bound *b, const int *tok, const int *tgt) {
    enum { SHOW = 6 };
    float *got = download_packed(ddp, 0), *off_lr;
    size_t n = b->n, k, worst[SHOW], nworst = 0, at, over = 0, caught = 0, caught_tenth = 0, tight = 0;
    double lr = ref->lr, ratio_old = 0, bmin = 1e30, bmax = 0, worst_r[SHOW];
    int j;
    for (k = 0; k < n; k++) {
        double err = fabs((double)got[k] - ref->final[k]), bd = adam_bound_at(b, k, ref->final[k], lr), r = err / bd;
        double old = err / (2e-5 + 1e-4 * fabs(ref->final[k]));
        if (!(r <= 1)) over++;
        if (old > ratio_old || old != old) ratio_old = old;
        if (bd < lr) caught++;
        if (bd < lr / 10) caught_tenth++;
        if (bd < 1e-4) tight++;
        bmin = bd < bmin ? bd : bmin;
        bmax = bd > bmax ? bd : bmax;
        if (r != r) r = INFINITY;   /* NaN: the worst */
        if (nworst < SHOW || r > worst_r[nworst - 1]) {   /* keep the SHOW largest err/bound, in order */
            j = nworst < SHOW ? (int)nworst++ : SHOW - 1;
            for (; j > 0 && worst_r[j - 1] < r; j--) { worst[j] = worst[j - 1]; worst_r[j] = worst_r[j - 1]; }
            worst[j] = k;
            worst_r[j] = r;
        }
    }
    verdict(over == 0, NAME("params_after_10_adamw_steps_match_pytorch"), "%zu of %zu parameters beyond the bound (see below)", over, n);
    printf("  (parameters after %d steps: %zu of %zu beyond the bound; gamma = D*K*u = %.3g, sum of U_t %.3f; the bound "
           "is %.2g .. %.2g, below 1e-4 for %.1f%% of the parameters; the old |err| <= 2e-5 + 1e-4*|ref| would be at %.3f)\n",
           ref->steps, over, n, b->gamma, b->u_bound_sum, bmin, bmax, 100.0 * tight / n, ratio_old);
    {   /* the largest error in absolute terms: where the old bound was tightest (the key bias) */
        size_t kmax = 0;
        for (k = 1; k < n; k++)
            if (fabs((double)got[k] - ref->final[k]) > fabs((double)got[kmax] - ref->final[kmax])) kmax = k;
        worst[nworst < SHOW ? nworst++ : SHOW - 1] = kmax;
    }
    for (j = 0; j < (int)nworst; j++) {
        k = worst[j];
        const char *name = tensor_of(ddp, k, &at);
        double err = fabs((double)got[k] - ref->final[k]);
        printf("    %-16s [%4zu] %.9g vs %.9g: error %.3g, bound %.3g (%.3f of it; rounding %.2g, gradient noise %.2g)\n", name, at,
               got[k], ref->final[k], err, adam_bound_at(b, k, ref->final[k], lr), err / adam_bound_at(b, k, ref->final[k], lr),
               2 * b->steps * 4 * ldexp(1.0, -24) * (fabs(ref->final[k]) + lr), 2 * b->noise[k]);
    }
    /* a 1% learning-rate error (a wrong bias correction, schedule or step size does as much) */
    off_lr = train_reference(ref, tok, tgt, 1.01f);
    over = 0;
    for (k = 0; k < n; k++)
        if (!(fabs((double)off_lr[k] - ref->final[k]) <= adam_bound_at(b, k, ref->final[k], lr))) over++;
    verdict(over > 0, NAME("params_bound_catches_a_1pct_lr_error"), "the run at lr x 1.01 stays within the bound everywhere");
    printf("  (the same 10 steps at lr x 1.01: %zu of %zu parameters beyond the bound)\n", over, n);
    /* one element off by one step (a kernel that misses or repeats one element's update once) */
    verdict(caught * 2 > n, NAME("params_bound_catches_a_one_element_error_of_one_step"),
            "an error of lr in one element exceeds the bound at only %zu of %zu elements", caught, n);
    printf("  (an error of one step, lr = %.2g, in one element exceeds the bound at %.1f%% of the elements; of lr/10 at %.1f%%)\n",
           lr, 100.0 * caught / n, 100.0 * caught_tenth / n);
    free(off_lr);
    free(got);
}

/* ---- 1. against the PyTorch reference ---- */
static void test_cuda_reference(void) {
    reference ref;
    char why[512], bad[1024];
    ddp_context *ddp;
    gpt_cuda m;
    gpt_config cfg;
    int *tok, *tgt, i, s, nbad, init_same = 1;
    size_t BT, off = 0;
    double w;
    const char *worst_name;
    if (!read_reference(&ref, why, sizeof why)) { verdict(0, NAME("reference_file"), "%s", why); return; }
    ddp = open_solo(1);
    cfg.layers = ref.layers; cfg.heads = ref.heads; cfg.dim = ref.dim; cfg.seq = ref.seq; cfg.batch = ref.batch;
    if (gpt_cuda_create(&m, ddp, &cfg, ref.seed, 0) != DDP_OK) { verdict(0, NAME("create"), "%s", ddp_last_error(ddp)); return; }
    if ((int64_t)m.num_floats != ref.num_floats) {
        verdict(0, NAME("reference_shapes"), "%zu parameters here, %lld in the reference", m.num_floats, (long long)ref.num_floats);
        return;
    }
    for (i = 0; i < ddp_num_params(ddp); i++) {   /* tensor by tensor: the flat buffer pads them */
        size_t n = ddp_param_count(ddp, i);
        float *got = download(ddp, ddp_param(ddp, i), n);
        init_same &= memcmp(got, ref.init + off, n * sizeof(float)) == 0;
        gpt_cuda_upload(ddp_config(ddp)->cuda_stream, ddp_param(ddp, i), ref.init + off, n * sizeof(float));   /* compare the math regardless */
        off += n;
        free(got);
    }
    verdict(init_same, NAME("init_matches_reference_bitwise"), "the seeded init uploaded by ddp.h differs from the reference's parameters");

    BT = (size_t)ref.batch * ref.seq;
    reference_batch(&ref, &tok, &tgt);
    {
        float loss, *logits;
        step_or_die(ddp, ddp_zero_grad(ddp), "zero_grad");
        gpt_cuda_forward(&m, tok, tgt, ref.batch, ref.seq, 1.0f, 1);
        loss = one_loss(&m);
        logits = download(ddp, (const float *)m.logits, BT * GPT_VOCAB);
        w = worst_ratio(logits, ref.logits, BT * GPT_VOCAB, 0, 1e-5, 1e-5);
        verdict(w <= 1, NAME("logits_match_pytorch"), "worst error %.3g of the tolerance", w);
        printf("  (logits: worst error %.3f of |err| <= 1e-5*max|ref| + 1e-5*|ref|)\n", w);
        w = worst_ratio(&loss, &ref.loss, 1, 0, 1e-5, 1e-5);
        verdict(w <= 1, NAME("loss_matches_pytorch"), "loss %.7f, reference %.7f", loss, ref.loss);
        printf("  (loss %.7f vs %.7f)\n", loss, ref.loss);
        free(logits);
        step_or_die(ddp, ddp_backward(ddp), "backward");
    }
    w = worst_gradient(ddp, ref.grads, NULL, bad, sizeof bad, &nbad, &worst_name);
    verdict(nbad == 0, NAME("every_gradient_matches_pytorch"), "%d tensor(s) beyond tolerance: %s", nbad, bad);
    printf("  (%d gradient tensors: worst error %.3f of |err| <= 1e-4*max|ref| + 1e-4*|ref|, in %s)\n",
           ddp_num_params(ddp), w, worst_name);
    {
        ddp_adamw opt = reference_adamw(&ref);
        float losses[64];
        double wl = 0;
        adam_bound bound;
        adam_bound_init(&bound, (size_t)ref.num_floats, &cfg);
        for (s = 0; s < ref.steps && s < 64; s++) {
            float norm = 0, *g;
            step_or_die(ddp, ddp_zero_grad(ddp), "zero_grad");
            gpt_cuda_forward(&m, tok, tgt, ref.batch, ref.seq, 1.0f, 1);
            step_or_die(ddp, ddp_backward(ddp), "backward");
            g = download_packed(ddp, 1);
            step_or_die(ddp, ddp_adamw_step(ddp, &opt, &norm), "adamw");
            adam_bound_step(&bound, ddp, g, norm, &opt);
            free(g);
            losses[s] = one_loss(&m);
            w = worst_ratio(&losses[s], &ref.step_losses[s], 1, 0, 1e-5, 1e-5);
            wl = w > wl ? w : wl;
        }
        verdict(wl <= 1, NAME("10_adamw_step_losses_match_pytorch"), "worst %.3g of the tolerance; last loss %.6f vs %.6f",
                wl, losses[ref.steps - 1], ref.step_losses[ref.steps - 1]);
        printf("  (step losses %.5f .. %.5f: worst error %.3f of the tolerance)\n", losses[0], losses[ref.steps - 1], wl);
        check_final_params(ddp, &ref, &bound, tok, tgt);
        adam_bound_free(&bound);
    }
    free(tok); free(tgt);
    free(ref.data); free(ref.init); free(ref.logits); free(ref.grads); free(ref.step_losses); free(ref.final);
    gpt_cuda_destroy(&m);
    ddp_shutdown(ddp);
}

/* ---- 2. against the CPU model, same batches ---- */
enum { DATA_BYTES = 1 << 14 };
static unsigned char text[DATA_BYTES];

static void make_text(void) {   /* text-like bytes: letters, spaces, a few newlines */
    int i;
    for (i = 0; i < DATA_BYTES; i++) {
        float u = test_value(11, (uint64_t)i);
        text[i] = (unsigned char)(u > 0.9f ? '\n' : u > 0.6f ? ' ' : 'a' + (int)(13.0f * (1.0f + test_value(12, (uint64_t)i))));
    }
}

static void test_cuda_vs_cpu(const gpt_config *cfg, float dropout, int kernels, int fused = 0) {
    ddp_context *gd = open_solo(1), *cd = open_solo(0);
    gpt_cuda gm;
    gpt cm;
    ddp_adamw opt;
    char name[160], what[96], bad[1024], first_bad[1024] = "";
    int B = cfg->batch, T = cfg->seq, *tok, *tgt, step, u, nbad, bad_steps = 0, forwards = 0, most_segments = 0;
    size_t BT = (size_t)B * T, count;
    ddp_result r;
    double w, worst_loss = 0, worst_grad = 0;
    const char *worst_name, *worst_grad_name = "";
    snprintf(what, sizeof what, "%dL_%dH_C%d_T%d_B%d%s%s", cfg->layers, cfg->heads, cfg->dim, cfg->seq, cfg->batch,
             dropout > 0 ? "_dropout" : "", kernels == 2 ? "_kernels2" : fused ? "_fused_attention" : "");
    if (fused) setenv("GPT_ATTENTION", "fused", 1);   /* as a user sets it: no [T, T] buffers */
    r = gpt_cuda_create(&gm, gd, cfg, 7, 0);
    unsetenv("GPT_ATTENTION");
    if (r != DDP_OK || gpt_create(&cm, cd, cfg, 7) != DDP_OK) {
        printf("FAIL %s: %s / %s\n", NAME("vs_cpu_create"), ddp_last_error(gd), ddp_last_error(cd));
        exit(1);
    }
    gpt_cuda_set_kernels(&gm, kernels);
    gpt_cuda_set_dropout(&gm, dropout, 13);   /* the same masks on both: drawn from (seed, step, row) */
    gpt_set_dropout(&cm, dropout, 13);
    tok = (int *)malloc(sizeof(int) * BT);
    tgt = (int *)malloc(sizeof(int) * BT);
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f; opt.beta2 = 0.99f; opt.weight_decay = 0.1f; opt.max_grad_norm = 1.0f;
    for (step = 0; step < 4; step++) {
        int micro = step == 0 ? 1 : 2;   /* later steps accumulate two micro-batches */
        if (step > 0) {   /* the same starting point for both (see the file's comment, part 2) */
            const float *cpu_params = ddp_flat_params(cd, &count);
            gpt_cuda_upload(ddp_config(gd)->cuda_stream, ddp_flat_params(gd, NULL), cpu_params, count * sizeof(float));
        }
        step_or_die(gd, ddp_zero_grad(gd), "zero_grad");
        step_or_die(cd, ddp_zero_grad(cd), "zero_grad");
        for (u = 0; u < micro; u++) {
            float gl, cl;
            gpt_make_batch(text, DATA_BYTES, 3, (uint64_t)step, u * B, B, T, tok, tgt);
            gpt_cuda_set_rows(&gm, (uint64_t)step, (uint64_t)(u * B * 2 + 1), 2);   /* as rank 1 of 2 */
            gpt_set_rows(&cm, (uint64_t)step, (uint64_t)(u * B * 2 + 1), 2);
            ddp_set_sync(gd, u == micro - 1);
            ddp_set_sync(cd, u == micro - 1);
            gpt_cuda_forward(&gm, tok, tgt, B, T, 1.0f / (float)micro, 1);
            {   /* GPT_KERNELS=2: how many more segments than tokens present (a token cut in several) */
                int seen[GPT_VOCAB] = { 0 }, distinct = 0;
                size_t i;
                for (i = 0; i < BT; i++) distinct += !seen[tok[i]]++;
                if (gm.segments - distinct > most_segments) most_segments = gm.segments - distinct;
            }
            cl = gpt_forward(&cm, tok, tgt, B, T, 1.0f / (float)micro, 1);
            gl = one_loss(&gm);
            w = worst_ratio(&gl, &cl, 1, 0, 1e-5, 1e-5);
            worst_loss = w > worst_loss || w != w ? w : worst_loss;
            forwards++;
            if (step == 0) {   /* the logits of the first forward */
                float *logits = download(gd, (const float *)gm.logits, BT * GPT_VOCAB);
                w = worst_ratio(logits, cm.logits, BT * GPT_VOCAB, 0, 1e-5, 1e-5);
                snprintf(name, sizeof name, NAME("logits_match_cpu_model_%s"), what);
                verdict(w <= 1, name, "worst error %.3g of the tolerance", w);
                printf("  (%s: worst error %.3f of |err| <= 1e-5*max|cpu| + 1e-5*|cpu|)\n", name, w);
                free(logits);
            }
            step_or_die(gd, ddp_backward(gd), "backward");
            step_or_die(cd, ddp_backward(cd), "backward");
        }
        w = worst_gradient(gd, NULL, cd, bad, sizeof bad, &nbad, &worst_name);
        if (w > worst_grad || w != w) { worst_grad = w; worst_grad_name = worst_name; }
        if (nbad && !bad_steps++) snprintf(first_bad, sizeof first_bad, "step %d: %.900s", step, bad);
        step_or_die(gd, ddp_adamw_step(gd, &opt, NULL), "adamw");
        step_or_die(cd, ddp_adamw_step(cd, &opt, NULL), "adamw");
    }
    snprintf(name, sizeof name, NAME("losses_match_cpu_model_%s"), what);
    verdict(worst_loss <= 1, name, "worst error %.3g of the tolerance", worst_loss);
    printf("  (%s: %d forwards, worst error %.3f of |err| <= 2e-5*|cpu|)\n", name, forwards, worst_loss);
    snprintf(name, sizeof name, NAME("every_gradient_matches_cpu_model_%s"), what);
    verdict(bad_steps == 0, name, "%d step(s) with tensors beyond tolerance; first %s", bad_steps, first_bad);
    printf("  (%s: 4 steps, 1 then 2 micro-steps, worst error %.3f of |err| <= 1e-4*max|cpu| + 1e-4*|cpu|, in %s)\n", name,
           worst_grad, worst_grad_name);
    if (kernels == 2 && BT >= 8 * GC_WTE_SEGMENT) {   /* a batch this large must have met a token of several segments */
        snprintf(name, sizeof name, NAME("kernels2_batches_cut_tokens_in_segments_%s"), what);
        verdict(most_segments > 0, name, "no token had more than %d positions: the segments were never summed", (int)GC_WTE_SEGMENT);
    }
    free(tok); free(tgt);
    gpt_cuda_destroy(&gm);
    gpt_destroy(&cm);
    ddp_shutdown(gd);
    ddp_shutdown(cd);
}

/* ---- 3. two identical runs, the same bits ---- */
enum { RUN_STEPS = 4, RUN_MICRO = 2 };

/* Trains a fresh model; returns the FNV-1a of its parameters and fills the step losses. */
static uint64_t train_run(const gpt_config *cfg, float *losses) {
    ddp_context *ddp = open_solo(1);
    gpt_cuda m;
    ddp_adamw opt;
    int B = cfg->batch, T = cfg->seq, *tok, *tgt, step, u, n;
    size_t count;
    float *params, *flat;
    uint64_t h;
    if (gpt_cuda_create(&m, ddp, cfg, 9, 0) != DDP_OK) { printf("FAIL %s: %s\n", NAME("run_create"), ddp_last_error(ddp)); exit(1); }
    tok = (int *)malloc(sizeof(int) * (size_t)B * T);
    tgt = (int *)malloc(sizeof(int) * (size_t)B * T);
    memset(&opt, 0, sizeof opt);
    opt.lr = 3e-3f; opt.beta2 = 0.99f; opt.weight_decay = 0.1f;   /* no clip: no norm read, nothing waits */
    for (step = 0; step < RUN_STEPS; step++) {
        const float *l;
        step_or_die(ddp, ddp_zero_grad(ddp), "zero_grad");
        for (u = 0; u < RUN_MICRO; u++) {
            gpt_make_batch(text, DATA_BYTES, 5, (uint64_t)step, u * B, B, T, tok, tgt);
            ddp_set_sync(ddp, u == RUN_MICRO - 1);
            gpt_cuda_forward(&m, tok, tgt, B, T, 1.0f / RUN_MICRO, 1);
            step_or_die(ddp, ddp_backward(ddp), "backward");
        }
        step_or_die(ddp, ddp_adamw_step(ddp, &opt, NULL), "adamw");
        l = gpt_cuda_losses(&m, &n);
        losses[step] = n == RUN_MICRO ? l[0] / RUN_MICRO + l[1] / RUN_MICRO : NAN;   /* the step's mean, as train_gpt */
    }
    flat = ddp_flat_params(ddp, &count);
    params = download(ddp, flat, count);
    h = test_hash(params, count * sizeof(float));
    free(params); free(tok); free(tgt);
    gpt_cuda_destroy(&m);
    ddp_shutdown(ddp);
    return h;
}

static void test_cuda_deterministic(const gpt_config *cfg) {
    float a[RUN_STEPS], b[RUN_STEPS];
    uint64_t ha = train_run(cfg, a), hb = train_run(cfg, b);
    verdict(ha == hb && memcmp(a, b, sizeof a) == 0 && !isnan(a[RUN_STEPS - 1]), NAME("two_runs_bitwise_identical"),
            "parameters %016llx vs %016llx, last loss %.9g vs %.9g", (unsigned long long)ha, (unsigned long long)hb,
            a[RUN_STEPS - 1], b[RUN_STEPS - 1]);
    printf("  (%d steps of %d micro-steps, twice: parameters fnv1a %016llx both, losses %.6f .. %.6f)\n", RUN_STEPS, RUN_MICRO,
           (unsigned long long)ha, a[0], a[RUN_STEPS - 1]);
}

/* ---- 4. --bf16 against fp32 ---- */

/* n bf16 values of device memory, widened. */
static float *download_bf16(ddp_context *ddp, const gc_bf16 *device, size_t n) {
    gc_bf16 *h = (gc_bf16 *)malloc(n * sizeof(gc_bf16) + 1);
    float *f = (float *)malloc(n * sizeof(float) + 1);
    size_t i;
    if (!h || !f) { printf("FAIL %s: out of memory\n", NAME("download")); exit(1); }
    gpt_cuda_download(ddp_config(ddp)->cuda_stream, h, device, n * sizeof(gc_bf16));
    for (i = 0; i < n; i++) f[i] = gc_ld(h[i]);
    free(h);
    return f;
}

/* The largest |err| / (k * max|ref|) over n values: the error at the scale of the tensor. */
static double scaled_error(const float *got, const float *ref, size_t n, double k) {
    double mx = 0, worst = 0;
    size_t i;
    for (i = 0; i < n; i++) mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (k * mx);
        if (!(e <= worst)) worst = e;   /* NaN sticks */
    }
    return worst;
}

/* The bf16 model (GPT_CUDA_BF16) against the fp32 model, both from the same parameters: the
   fp32 context's init rounded to bf16 (what the bf16 model's working copies hold), so what
   differs is only the bf16 storage of activations and gradients. The bounds, from bf16's unit
   roundoff u = 2^-9: every stored activation is rounded once (relative error <= u at its own
   scale), the arithmetic inside a kernel or matmul is fp32 (its error, ~1e-6, is negligible
   beside u). Counting the roundings on the longest path to a tensor: the logits see
   n_f = 10 L + 3 (the embedding; per layer ln1, qkv, scores, P, attention out, the residual,
   ln2, fc, GELU, the residual; lnf; the logits), a parameter's gradient n_b = n_f + 11 L + 4
   (dlogits, the head's dln, lnf's dres; per layer dGELU, dfc, dln, dres, d(att out), dV, dP,
   dS, dQ/dK, dln, dres; the gradient itself). If each stage carries its input's relative
   error to its output at that output's scale (LayerNorm renormalises; the weights, std 0.02
   over widths 80..320, keep |W x| ~ |x|), the errors add at most linearly:
       logits      |err| <= n_f u max|logits|
       loss        |err| <= 2 n_f u max|logits|   (log-sum-exp and z[target] are 1-Lipschitz in max-norm)
       gradients   |err| <= n_b u max|that tensor's gradient|
   (L = 3: 0.064 and 0.14 of the scale). Then 8 AdamW steps (lr 1e-3), each run from its own
   parameters (the bf16 run: its gradients widened into ddp.h's fp32 buffers, its working copies
   rounded from the updated fp32 master weights): every step's loss within the loss bound at
   the first forward's logit scale — the parameters move by at most 8 lr = 0.008 per element
   in each run, in the same direction wherever the gradient is not rounding noise, which moves
   the logits by a fraction of what the forward's own rounding does.
   A third run uses ddp.h's bf16 parameters (param_dtype DDP_DTYPE_BF16, as train_gpt --bf16):
   the same recipe (widen the bf16 gradients, AdamW on the fp32 master, round to nearest even),
   so in emulation (host loops on both sides) its losses must be those of the model's own
   copies, bit for bit; on a GPU ddp.h's fused bf16 AdamW kernel and its fp32 one may contract
   multiply-adds differently, so there they must agree within the loss bound. */
static void test_cuda_bf16(const gpt_config *cfg) {
    ddp_context *d32 = open_solo(1), *d16 = open_solo(1), *dlib = open_solo_dtype(1, DDP_DTYPE_BF16);
    gpt_cuda m32, m16, mlib;
    int lib_same = 1;
    float llib;
    ddp_adamw opt;
    char name[160], what[96];
    int B = cfg->batch, T = cfg->seq, L = cfg->layers, *tok, *tgt, step, i, nbad = 0, differs = 0;
    size_t BT = (size_t)B * T, count, k;
    const double u = 1.0 / 512;
    double nf = 10.0 * L + 3, nb = nf + 11.0 * L + 4, w, worst_grad = 0, worst_loss = 0, max_logit = 0;
    const char *worst_grad_name = "";
    char bad[1024] = "";
    float *p32, l32, l16;
    snprintf(what, sizeof what, "%dL_%dH_C%d_T%d_B%d%s", cfg->layers, cfg->heads, cfg->dim, cfg->seq, cfg->batch,
             getenv("GPT_ATTENTION") && !strcmp(getenv("GPT_ATTENTION"), "fused") ? "_fused_attention" : "");   /* part 7 */
    if (gpt_cuda_create(&m32, d32, cfg, 7, GPT_CUDA_FP32) != DDP_OK || gpt_cuda_create(&m16, d16, cfg, 7, GPT_CUDA_BF16) != DDP_OK) {
        printf("FAIL %s: %s / %s\n", NAME("bf16_create"), ddp_last_error(d32), ddp_last_error(d16));
        exit(1);
    }
    if (gpt_cuda_create(&mlib, dlib, cfg, 7, GPT_CUDA_BF16) != DDP_OK) {
        printf("FAIL %s: %s\n", NAME("bf16_create_on_bf16_params"), ddp_last_error(dlib));
        exit(1);
    }
    /* the fp32 model gets the bf16 working copies' values */
    p32 = download_bf16(d16, m16.params16, m16.flat_floats);   /* the flat layout, padding included */
    count = m16.flat_floats;
    gpt_cuda_upload(ddp_config(d32)->cuda_stream, ddp_flat_params(d32, NULL), p32, count * sizeof(float));
    free(p32);
    tok = (int *)malloc(sizeof(int) * BT);
    tgt = (int *)malloc(sizeof(int) * BT);
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-3f; opt.beta2 = 0.99f; opt.weight_decay = 0.1f; opt.max_grad_norm = 1.0f;
    for (step = 0; step < 8; step++) {
        gpt_make_batch(text, DATA_BYTES, 11, (uint64_t)step, 0, B, T, tok, tgt);
        step_or_die(d32, ddp_zero_grad(d32), "zero_grad");
        step_or_die(d16, ddp_zero_grad(d16), "zero_grad");
        step_or_die(dlib, ddp_zero_grad(dlib), "zero_grad");
        gpt_cuda_bf16_zero_grads(&m16);
        gpt_cuda_forward(&m32, tok, tgt, B, T, 1.0f, 1);
        gpt_cuda_forward(&m16, tok, tgt, B, T, 1.0f, 1);
        gpt_cuda_forward(&mlib, tok, tgt, B, T, 1.0f, 1);
        l32 = one_loss(&m32);
        l16 = one_loss(&m16);
        llib = one_loss(&mlib);
#ifdef GPT_CUDA_EMULATE
        lib_same &= memcmp(&llib, &l16, sizeof llib) == 0;
#else
        lib_same &= fabs((double)llib - l16) <= 2 * nf * u * max_logit || step == 0;   /* max_logit: set after step 0's check */
        lib_same &= step > 0 || memcmp(&llib, &l16, sizeof llib) == 0;   /* the same parameters: the same first loss */
#endif
        if (step == 0) {   /* logits and every gradient of the first batch */
            float *g32 = (float *)malloc(BT * GPT_VOCAB * sizeof(float)), *g16 = (float *)malloc(BT * GPT_VOCAB * sizeof(float));
            if (!g32 || !g16) { printf("FAIL %s: out of memory\n", NAME("bf16")); exit(1); }
            gpt_cuda_logits_rows(&m32, 0, (int)BT, g32);
            gpt_cuda_logits_rows(&m16, 0, (int)BT, g16);
            for (k = 0; k < BT * GPT_VOCAB; k++) {
                max_logit = fabs(g32[k]) > max_logit ? fabs(g32[k]) : max_logit;
                differs += g32[k] != g16[k];
            }
            w = scaled_error(g16, g32, BT * GPT_VOCAB, nf * u);
            snprintf(name, sizeof name, NAME("bf16_logits_within_bound_%s"), what);
            verdict(w <= 1 && differs > 0, name, "worst error %.3g of n_f u max|logits| (%d of %zu logits differ from fp32)", w,
                    differs, BT * GPT_VOCAB);
            printf("  (%s: worst error %.3f of %.0f u max|logits| = %.3g; %d of %zu logits differ from fp32)\n", name, w, nf,
                   nf * u * max_logit, differs, BT * GPT_VOCAB);
            free(g32); free(g16);
        }
        step_or_die(d32, ddp_backward(d32), "backward");
        step_or_die(d16, ddp_backward(d16), "backward");
        step_or_die(dlib, ddp_backward(dlib), "backward");
        if (step == 0) {
            size_t len = 0;
            for (i = 0; i < ddp_num_params(d32); i++) {
                size_t n = ddp_param_count(d32, i);
                float *g32 = download(d32, ddp_grad(d32, i), n);
                float *g16 = download_bf16(d16, m16.grads16 + (ddp_param(d16, i) - ddp_flat_params(d16, NULL)), n);
                w = scaled_error(g16, g32, n, nb * u);
                if (!(w <= worst_grad)) { worst_grad = w; worst_grad_name = ddp_param_name(d32, i); }
                if (!(w <= 1) && len + 80 < sizeof bad)
                    len += (size_t)snprintf(bad + len, sizeof bad - len, "%s%s (%.3g)", nbad++ ? ", " : "", ddp_param_name(d32, i), w);
                free(g32); free(g16);
            }
            snprintf(name, sizeof name, NAME("bf16_every_gradient_within_bound_%s"), what);
            verdict(nbad == 0, name, "%d tensor(s) beyond n_b u max|grad|: %s", nbad, bad);
            printf("  (%s: worst error %.3f of %.0f u max|grad of the tensor|, in %s)\n", name, worst_grad, nb, worst_grad_name);
        }
        w = fabs((double)l16 - l32) / (2 * nf * u * max_logit);
        if (!(w <= worst_loss)) worst_loss = w;
        gpt_cuda_bf16_grads_to_fp32(&m16);
        step_or_die(d32, ddp_adamw_step(d32, &opt, NULL), "adamw");
        step_or_die(d16, ddp_adamw_step(d16, &opt, NULL), "adamw");
        step_or_die(dlib, ddp_adamw_step(dlib, &opt, NULL), "adamw");
        gpt_cuda_bf16_round_params(&m16);
        printf("  (step %d: loss fp32 %.9g, bf16 %.9g)\n", step + 1, l32, l16);
    }
    snprintf(name, sizeof name, NAME("bf16_losses_of_8_steps_within_bound_%s"), what);
    verdict(worst_loss <= 1, name, "worst loss error %.3g of 2 n_f u max|logits|", worst_loss);
    printf("  (%s: worst error %.3f of 2 n_f u max|logits| = %.3g)\n", name, worst_loss, 2 * nf * u * max_logit);
#ifdef GPT_CUDA_EMULATE
    snprintf(name, sizeof name, NAME("bf16_on_ddp_bf16_params_same_losses_%s"), what);
#else
    snprintf(name, sizeof name, NAME("bf16_on_ddp_bf16_params_losses_within_bound_%s"), what);
#endif
    verdict(lib_same, name, "the run on ddp.h's bf16 parameters gave other losses than the model's own bf16 copies (last %.9g vs %.9g)",
            llib, l16);
    free(tok); free(tgt);
    gpt_cuda_destroy(&mlib);
    ddp_shutdown(dlib);
    gpt_cuda_destroy(&m32);
    gpt_cuda_destroy(&m16);
    ddp_shutdown(d32);
    ddp_shutdown(d16);
}

/* 5. The model's bf16 matmul at a split-K shape: the weight gradient's C[M, N] += A^T B with
   K = 8192 (B*T of the GPT-2-sized run; the tests' own shapes are far too small for cuBLAS to
   split K), positive inputs (no cancellation: S = sum |a b| + |C0| is the result's own size).
   With fp32 accumulation in any order and one rounding to bf16 (round to nearest even):
       |got - exact| <= ulp(got) / 2 + gamma_K S,   gamma_K = K 2^-23 / (1 - K 2^-23)
   (2^-23: a whole fp32 ulp per addition, so an accumulator that truncates is covered too;
   gamma_K S ~ 0.25 ulp here). Partial sums of K slices added in bf16 (cuBLAS's reduced-
   precision split-K reduction, which gpt_cuda_create disallows in bf16) each carry up to half
   an ulp of their own, and over 4096+ outputs some exceed the bound. On a GPU the handle's math
   mode is checked too. In emulation the host sgemm runs the same check (the bound's arithmetic
   and the call's layout, not cuBLAS). */
static void test_cuda_bf16_gemm(int M, int N, int K) {
    ddp_context *d = open_solo(1);
    gpt_config cfg = { 1, 1, 32, 8, 1 };
    gpt_cuda m;
    char name[128];
    size_t i, j, k;
    const double gamma = K * ldexp(1.0, -23) / (1 - K * ldexp(1.0, -23));
    double worst = 0;
    size_t worst_at = 0;
    if (gpt_cuda_create(&m, d, &cfg, 1, GPT_CUDA_BF16) != DDP_OK) {
        printf("FAIL %s: %s\n", NAME("bf16_gemm_create"), ddp_last_error(d));
        exit(1);
    }
#ifndef GPT_CUDA_EMULATE
    {
        cublasMath_t mode;
        GC_CUBLAS(cublasGetMathMode(m.blas, &mode));
        verdict((mode & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) != 0 && (mode & 0xf) == CUBLAS_DEFAULT_MATH,
                NAME("bf16_cublas_disallows_reduced_precision_reduction"), "math mode %d", (int)mode);
    }
#endif
    gc_bf16 *ha = (gc_bf16 *)malloc(sizeof(gc_bf16) * (size_t)K * M), *hb = (gc_bf16 *)malloc(sizeof(gc_bf16) * (size_t)K * N);
    gc_bf16 *hc = (gc_bf16 *)malloc(sizeof(gc_bf16) * (size_t)M * N);
    double *exact = (double *)calloc((size_t)M * N, sizeof(double));
    if (!ha || !hb || !hc || !exact) { printf("FAIL %s: out of memory\n", NAME("bf16_gemm")); exit(1); }
    /* values in [0.5, 1): a = A^T's rows (A is [K, M] row-major, as dout), b = [K, N] (as inp) */
    for (i = 0; i < (size_t)K * M; i++) ha[i] = ddp_k__to_bf16(0.75f + 0.25f * test_value(51, i));
    for (i = 0; i < (size_t)K * N; i++) hb[i] = ddp_k__to_bf16(0.75f + 0.25f * test_value(52, i));
    for (i = 0; i < (size_t)M * N; i++) { hc[i] = ddp_k__to_bf16(0.75f + 0.25f * test_value(53, i)); exact[i] = gc_ld(hc[i]); }
    for (k = 0; k < (size_t)K; k++)
        for (i = 0; i < (size_t)M; i++) {
            double a = gc_ld(ha[k * M + i]);
            for (j = 0; j < (size_t)N; j++) exact[i * N + j] += a * gc_ld(hb[k * N + j]);
        }
    gc_bf16 *da = (gc_bf16 *)gc_device_alloc(&m, sizeof(gc_bf16) * (size_t)K * M);
    gc_bf16 *db = (gc_bf16 *)gc_device_alloc(&m, sizeof(gc_bf16) * (size_t)K * N);
    gc_bf16 *dc = (gc_bf16 *)gc_device_alloc(&m, sizeof(gc_bf16) * (size_t)M * N);
    gpt_cuda_upload(m.stream, da, ha, sizeof(gc_bf16) * (size_t)K * M);
    gpt_cuda_upload(m.stream, db, hb, sizeof(gc_bf16) * (size_t)K * N);
    gpt_cuda_upload(m.stream, dc, hc, sizeof(gc_bf16) * (size_t)M * N);
    /* as gc_linear_backward's grad W += dout^T inp */
    GC_MATMUL(&m, 1, 0, M, N, K, 1.0f, (const gc_bf16 *)da, M, (const gc_bf16 *)db, N, 1.0f, dc, N);
    gpt_cuda_download(m.stream, hc, dc, sizeof(gc_bf16) * (size_t)M * N);
    for (i = 0; i < (size_t)M * N; i++) {
        double got = gc_ld(hc[i]), ulp = ldexp(1.0, ilogb(got) - 7);
        double r = fabs(got - exact[i]) / (0.5 * ulp + gamma * exact[i]);   /* exact = S: all terms positive */
        if (!(r <= worst)) { worst = r; worst_at = i; }
    }
    snprintf(name, sizeof name, NAME("bf16_gemm_rounded_once_M%d_N%d_K%d"), M, N, K);
    verdict(worst <= 1, name, "C[%zu] = %.9g, exact %.9g: %.3g of the bound (half an ulp + gamma_K S)", worst_at,
            (double)gc_ld(hc[worst_at]), exact[worst_at], worst);
    if (worst <= 1) printf("  (worst %.3f of the bound)\n", worst);
    free(ha); free(hb); free(hc); free(exact);
    gpt_cuda_destroy(&m);
    ddp_shutdown(d);
}

/* GPT_KERNELS=2's 16-byte elementwise maps against the one-element kernels, bit for bit: GELU
   forward and backward and the bias (+ residual) init, over a length that leaves a tail, a bias
   width that is no multiple of a vector, in S = float and bf16; and the launcher's refusal of a
   misaligned operand (the caller then runs the one-element kernel). */
template <class S> static void test_vec_maps_one(gpt_cuda *m, const char *type) {
    const size_t n = 3 * 4096 + 13;
    const int width = 77;
    S *h = (S *)malloc(sizeof(S) * n * 3), *got = (S *)malloc(sizeof(S) * n), *want = (S *)malloc(sizeof(S) * n);
    S *x = (S *)gc_device_alloc(m, sizeof(S) * n), *d = (S *)gc_device_alloc(m, sizeof(S) * n), *bias = (S *)gc_device_alloc(m, sizeof(S) * width);
    S *o1 = (S *)gc_device_alloc(m, sizeof(S) * n), *o2 = (S *)gc_device_alloc(m, sizeof(S) * n);
    size_t i;
    int bad = 0, t, vec = 1;
    char name[128];
    for (i = 0; i < 3 * n; i++) gc_put(&h[i], 3.0f * test_value(61, i));
    gpt_cuda_upload(m->stream, x, h, sizeof(S) * n);
    gpt_cuda_upload(m->stream, d, h + n, sizeof(S) * n);
    gpt_cuda_upload(m->stream, bias, h + 2 * n, sizeof(S) * width);
    for (t = 0; t < 4; t++) {
        gc_gelu_fwd<S> f = { x, o1 };
        gc_gelu_bwd<S> g = { x, d, o1 };
        gc_linear_init<S> li = { bias, t == 2 ? (const S *)d : (const S *)NULL, o1, width };
        gc_f_bias<S> fb = { bias, width, t == 2 };
        if (t == 0) { GC_FOR_EACH(m, f, n); vec &= GC_MAP_VEC(m, S, gc_f_gelu, gc_f_gelu(), x, (const S *)NULL, o2, n); }
        if (t == 1) { GC_FOR_EACH(m, g, n); vec &= GC_MAP_VEC(m, S, gc_f_gelu_grad, gc_f_gelu_grad(), x, d, o2, n); }
        if (t >= 2) { GC_FOR_EACH(m, li, n); vec &= GC_MAP_VEC(m, S, gc_f_bias<S>, fb, li.resid, (const S *)NULL, o2, n); }
        if (t == 3) vec &= !GC_MAP_VEC(m, S, gc_f_gelu, gc_f_gelu(), x + 1, (const S *)NULL, o2, n - 1);   /* misaligned: refused */
        gpt_cuda_download(m->stream, want, o1, sizeof(S) * n);
        gpt_cuda_download(m->stream, got, o2, sizeof(S) * n);
        if (memcmp(want, got, sizeof(S) * n) != 0) {
            for (i = 0; i < n && !memcmp(&want[i], &got[i], sizeof(S)); i++) {}
            printf("  (map %d: element %zu differs: %.9g, the one-element kernel's %.9g)\n", t, i, (double)gc_ld(got[i]), (double)gc_ld(want[i]));
            bad++;
        }
    }
    snprintf(name, sizeof name, NAME("kernels2_vector_maps_same_bits_%s"), type);
    verdict(bad == 0 && vec, name, "%d of 4 maps differ from the one-element kernels; vector path taken where it should: %d", bad, vec);
    free(h); free(got); free(want);
}
static void test_vec_maps(void) {
    ddp_context *d = open_solo(1);
    gpt_config cfg = { 1, 1, 32, 8, 1 };
    gpt_cuda m;
    if (gpt_cuda_create(&m, d, &cfg, 1, GPT_CUDA_FP32) != DDP_OK) { printf("FAIL %s: %s\n", NAME("kernels2_create"), ddp_last_error(d)); exit(1); }
    test_vec_maps_one<float>(&m, "fp32");
    test_vec_maps_one<gc_bf16>(&m, "bf16");
    gpt_cuda_destroy(&m);
    ddp_shutdown(d);
}

/* GPT_KERNELS=2's batched attention matmuls and fused LayerNorm backward against GPT_KERNELS=1's
   calls, bit for bit, in S = float and bf16, B = 4 sequences of T < the allocated 13, 3 heads:
   each of the attention's six matmuls (gc_attention's operands, strides and transposes) run both
   ways on the same inputs, at heads of 8 and T = 12 (every operand 16-byte aligned: all six must
   be one batched call) and at heads of 19 and T = 11 (not aligned: all six must fall back to the
   per-sequence calls); the LayerNorm backward (dx accumulated, w and b gradients added) at
   C = 57 on 2500 rows (chunks of 40: more rows than a chunk's 4 blocks x 8 warps, so each warp
   takes several; the last chunk part-filled, one empty), the partials' scratch refilled with NaN
   before each run. On the GPU the same bits hold when cuBLAS computes each batch entry as the
   same GEMM (same types, compute type, math mode): what this checks there. The comparison is
   shown to see a change: a perturbed input must differ. */
template <class S> static int same_bits(gpt_cuda *m, const S *a, const S *b, size_t n, const char *what) {
    S *x = (S *)malloc(sizeof(S) * n), *y = (S *)malloc(sizeof(S) * n);
    size_t i;
    int bad = 0;
    gpt_cuda_download(m->stream, x, a, sizeof(S) * n);
    gpt_cuda_download(m->stream, y, b, sizeof(S) * n);
    for (i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(S)) != 0 || gc_ld(x[i]) != gc_ld(x[i])) {   /* differs, or never written (NaN) */
            if (what) printf("  (%s: element %zu: %.9g, GPT_KERNELS=1's %.9g)\n", what, i, (double)gc_ld(y[i]), (double)gc_ld(x[i]));
            bad = 1;
            break;
        }
    free(x); free(y);
    return !bad;
}
/* One model's six attention matmuls, each way: same bits, and whether GPT_KERNELS=2 made the one
   batched call (want_batched: an aligned shape; else it must have fallen back). */
template <class S> static void test_attn_matmuls_same_bits(int precision, const char *type, int C, int T, int want_batched) {
    ddp_context *d = open_solo(1);
    gpt_config cfg = { 1, 3, C, 13, 4 };
    gpt_cuda m;
    int B = 4, NH = 3, hs = C / NH, C3 = 3 * C, i, bad = 0, sees = 0, batched = 1;
    long long TT = (long long)T * T, sq = (long long)T * C3, so = (long long)T * C, HTT = NH * TT;
    size_t nqkv = (size_t)B * T * C3, natt = (size_t)B * NH * TT, nout = (size_t)B * T * C, k;
    float scale = 1.0f / sqrtf((float)hs);
    char name[160];
    if (gpt_cuda_create(&m, d, &cfg, 1, precision) != DDP_OK) { printf("FAIL %s: %s\n", NAME("kernels2_create"), ddp_last_error(d)); exit(1); }
    m.B = B;
    m.T = T;
    S *h = (S *)malloc(sizeof(S) * (nqkv + natt + nout));
    for (k = 0; k < nqkv + natt + nout; k++) gc_put(&h[k], test_value(71, k) * 2.0f - 1.0f);
    S *qkv = (S *)gc_device_alloc(&m, sizeof(S) * nqkv), *att = (S *)gc_device_alloc(&m, sizeof(S) * natt);
    S *dout = (S *)gc_device_alloc(&m, sizeof(S) * nout);
    S *o[2][6];
    gpt_cuda_upload(m.stream, qkv, h, sizeof(S) * nqkv);
    gpt_cuda_upload(m.stream, att, h + nqkv, sizeof(S) * natt);
    gpt_cuda_upload(m.stream, dout, h + nqkv + natt, sizeof(S) * nout);
    for (int kern = 1; kern <= 2; kern++) {   /* the six matmuls of gc_attention and its backward, each way */
        S **r = o[kern - 1];
        int made = 0;
        gpt_cuda_set_kernels(&m, kern);
        r[0] = (S *)gc_device_alloc(&m, sizeof(S) * natt); r[1] = (S *)gc_device_alloc(&m, sizeof(S) * nout);
        r[2] = (S *)gc_device_alloc(&m, sizeof(S) * nqkv); r[3] = (S *)gc_device_alloc(&m, sizeof(S) * natt);
        r[4] = (S *)gc_device_alloc(&m, sizeof(S) * nqkv); r[5] = r[4];   /* dQ and dK: the q and k columns of one dqkv */
        made += GC_ATTN_MATMUL(&m, 0, 1, T, T, hs, scale, qkv, C3, sq, hs, qkv + C, C3, sq, hs, r[0], T, HTT, TT);     /* S = scale Q K^T */
        made += GC_ATTN_MATMUL(&m, 0, 0, T, hs, T, 1.0f, att, T, HTT, TT, qkv + 2 * C, C3, sq, hs, r[1], C, so, hs);   /* O = P V */
        made += GC_ATTN_MATMUL(&m, 1, 0, T, hs, T, 1.0f, att, T, HTT, TT, dout, C, so, hs, r[2] + 2 * C, C3, sq, hs);  /* dV = P^T dO */
        made += GC_ATTN_MATMUL(&m, 0, 1, T, T, hs, 1.0f, dout, C, so, hs, qkv + 2 * C, C3, sq, hs, r[3], T, HTT, TT);  /* dP = dO V^T */
        made += GC_ATTN_MATMUL(&m, 0, 0, T, hs, T, scale, att, T, HTT, TT, qkv + C, C3, sq, hs, r[4], C3, sq, hs);    /* dQ = scale dS K */
        made += GC_ATTN_MATMUL(&m, 1, 0, T, hs, T, scale, att, T, HTT, TT, qkv, C3, sq, hs, r[4] + C, C3, sq, hs);    /* dK = scale dS^T Q */
        if (made != (kern == 2 && want_batched ? 6 : 0)) batched = 0;
    }
    {   /* written parts only: dV's columns of r[2] (the rest stays NaN in both), the q|k columns of r[4] */
        const char *names[5] = { "S = Q K^T", "O = P V", "dV", "dP", "dQ, dK" };
        for (i = 0; i < 5; i++) {
            if (i == 2 || i == 4) {
                for (int row = 0; row < B * T; row++) {
                    size_t at = (size_t)row * C3 + (i == 2 ? 2 * C : 0), n = i == 2 ? (size_t)C : 2 * (size_t)C;
                    if (!same_bits(&m, o[0][i] + at, o[1][i] + at, n, names[i])) { bad++; break; }
                }
            } else if (!same_bits(&m, o[0][i], o[1][i], i == 1 ? nout : natt, names[i])) bad++;
        }
        /* the comparison sees a change: one head's input of sequence 2 perturbed, S recomputed */
        S one;
        gc_put(&one, 0.5f);
        gpt_cuda_upload(m.stream, qkv + 2 * sq + 2 * hs + C, &one, sizeof(S));
        GC_ATTN_MATMUL(&m, 0, 1, T, T, hs, scale, qkv, C3, sq, hs, qkv + C, C3, sq, hs, o[1][0], T, HTT, TT);
        sees = !same_bits(&m, o[0][0], o[1][0], natt, NULL);
    }
    snprintf(name, sizeof name, NAME("kernels2_%s_attention_matmuls_same_bits_%s_C%d_T%d"), want_batched ? "batched" : "unaligned",
             type, C, T);
    verdict(bad == 0 && sees && batched, name, "%d of 5 outputs differ from the per-sequence calls; a perturbed input seen: %d; "
            "%s: %d", bad, sees, want_batched ? "all six were one batched call" : "all six fell back to the per-sequence calls", batched);
    free(h);
    gpt_cuda_set_kernels(&m, 1);
    gpt_cuda_destroy(&m);
    ddp_shutdown(d);
}

/* LayerNorm backward: fused (GPT_KERNELS=2) against dx, then the partials (1), at C = 57. */
template <class S> static void test_fused_layernorm_same_bits(int precision, const char *type) {
    ddp_context *d = open_solo(1);
    gpt_config cfg = { 1, 3, 57, 13, 4 };
    gpt_cuda m;
    int C = 57, rows = 2500, bad = 0;
    size_t nx = (size_t)rows * C, k;
    char name[128];
    if (gpt_cuda_create(&m, d, &cfg, 1, precision) != DDP_OK) { printf("FAIL %s: %s\n", NAME("kernels2_create"), ddp_last_error(d)); exit(1); }
    S *h = (S *)malloc(sizeof(S) * (2 * nx + C));   /* x, dy; then room for a run's gradients */
    for (k = 0; k < 2 * nx; k++) gc_put(&h[k], test_value(73, k) * 2.0f - 1.0f);
    {   /* LayerNorm backward: fused (2) against dx, then partials (1) */
        S *x = (S *)gc_device_alloc(&m, sizeof(S) * nx), *dy = (S *)gc_device_alloc(&m, sizeof(S) * nx), *ln = (S *)gc_device_alloc(&m, sizeof(S) * nx);
        S *dx[2], *gw[2], *gb[2];
        float *mean = gc_floats(&m, (size_t)rows), *rstd = gc_floats(&m, (size_t)rows);
        S *w = gc_param<S>(&m, m.lnfw), *gwp = gc_grad<S>(&m, m.lnfw), *gbp = gc_grad<S>(&m, m.lnfb);
        const S *hx = h;
        void *nan_bytes = malloc(sizeof(float) * GC_CHUNKS * C);
        memset(nan_bytes, 0xff, sizeof(float) * GC_CHUNKS * C);
        gpt_cuda_upload(m.stream, x, hx, sizeof(S) * nx);
        gpt_cuda_upload(m.stream, dy, hx + nx, sizeof(S) * nx);
        gpt_cuda_upload(m.stream, w, h, sizeof(S) * C);   /* w not all ones: dxhat = dy w */
        gc_layernorm_fwd<S> fwd = { x, w, gc_param<S>(&m, m.lnfb), ln, mean, rstd, C };
        GC_FOR_ROWS(&m, fwd, rows);
        for (int kern = 1; kern <= 2; kern++) {
            gc_ln_args<S> a;
            dx[kern - 1] = (S *)gc_device_alloc(&m, sizeof(S) * nx);
            gw[kern - 1] = (S *)gc_device_alloc(&m, sizeof(S) * C);
            gb[kern - 1] = (S *)gc_device_alloc(&m, sizeof(S) * C);
            gpt_cuda_upload(m.stream, dx[kern - 1], hx + nx / 2, sizeof(S) * nx);   /* accumulated onto */
            gpt_cuda_upload(m.stream, gwp, h + C, sizeof(S) * C);
            gpt_cuda_upload(m.stream, gbp, h + 2 * C, sizeof(S) * C);
            gpt_cuda_upload(m.stream, m.partial_a, nan_bytes, sizeof(float) * GC_CHUNKS * C);   /* no partial left from run 1 */
            gpt_cuda_upload(m.stream, m.partial_b, nan_bytes, sizeof(float) * GC_CHUNKS * C);
            gpt_cuda_set_kernels(&m, kern);
            a.m = &m; a.w = m.lnfw; a.b = m.lnfb; a.rows = rows; a.accumulate = 1;
            a.x = x; a.mean = mean; a.rstd = rstd; a.dout = dy; a.dx = dx[kern - 1];
            gc_layernorm_backward<S>(&a);
            gpt_cuda_download(m.stream, h + 2 * nx, gwp, sizeof(S) * C);   /* keep this run's gradients */
            gpt_cuda_upload(m.stream, gw[kern - 1], h + 2 * nx, sizeof(S) * C);
            gpt_cuda_download(m.stream, h + 2 * nx, gbp, sizeof(S) * C);
            gpt_cuda_upload(m.stream, gb[kern - 1], h + 2 * nx, sizeof(S) * C);
        }
        bad = !same_bits(&m, dx[0], dx[1], nx, "LayerNorm dx") + !same_bits(&m, gw[0], gw[1], (size_t)C, "LayerNorm dw") +
              !same_bits(&m, gb[0], gb[1], (size_t)C, "LayerNorm db");
        free(nan_bytes);
        snprintf(name, sizeof name, NAME("kernels2_fused_layernorm_backward_same_bits_%s"), type);
        verdict(bad == 0, name, "%d of 3 outputs (dx, dw, db) differ from the two kernels'", bad);
    }
    free(h);
    gpt_cuda_set_kernels(&m, 1);
    gpt_cuda_destroy(&m);
    ddp_shutdown(d);
}
static void test_kernels2_same_bits(void) {
    test_attn_matmuls_same_bits<float>(GPT_CUDA_FP32, "fp32", 24, 12, 1);    /* 3 heads of 8: every operand 16-byte aligned */
    test_attn_matmuls_same_bits<gc_bf16>(GPT_CUDA_BF16, "bf16", 24, 12, 1);
    test_attn_matmuls_same_bits<float>(GPT_CUDA_FP32, "fp32", 57, 11, 0);    /* 3 heads of 19, T = 11: not aligned */
    test_attn_matmuls_same_bits<gc_bf16>(GPT_CUDA_BF16, "bf16", 57, 11, 0);
    test_fused_layernorm_same_bits<float>(GPT_CUDA_FP32, "fp32");
    test_fused_layernorm_same_bits<gc_bf16>(GPT_CUDA_BF16, "bf16");
}

/* ---- 7. GPT_ATTENTION=fused against the explicit attention ---- */

/* The op alone at an odd shape (B 2, 3 heads of 40, T 37): the fused forward O and backward dQ,
   dK, dV (S = float, and S = bf16) against the explicit fp32 op on the same inputs (values in
   [-1, 1), bf16-representable). Bounds, u = 2^-24: a score s = scale q.k carries an absolute
   error <= (hs + 1) u a (a = scale hs max|q| max|k|, the largest |s| can be), which exp turns
   into a relative error of P; the softmax's sum and O = P V add (T + 4) u relative at the scale
   of max|V|; each path is that far from the exact value, so they differ by twice it:
       fp32 O       |err| <= 2 (2 (hs + 1) a + T + 8) u max|ref|
   the backward goes through P again and one more sum (dS over T keys, or over T queries): twice
   the forward's. bf16 (computed in fp32, each output rounded once): O and dV within half a bf16
   ulp (2^-8 relative, at the tensor's scale) plus the fp32 bound; dQ and dK also through
   D = dO . O read from the rounded O (its error, relative 2^-8, enters dS at the scale of dS): two
   roundings. A mask off by one (the key t + 1 let in) must fail the fp32 bound. */
template <class S> static float *fetch(gpt_cuda *m, const S *dev, size_t n) {
    S *h = (S *)malloc(sizeof(S) * n + 1);
    float *f = (float *)malloc(sizeof(float) * n + 1);
    size_t i;
    if (!h || !f) { printf("FAIL %s: out of memory\n", NAME("fused")); exit(1); }
    gpt_cuda_download(m->stream, h, dev, sizeof(S) * n);
    for (i = 0; i < n; i++) f[i] = gc_ld(h[i]);
    free(h);
    return f;
}
/* The fused op on model m (S): O and dqkv, widened. extra_keys 1: the broken mask (forward only). */
template <class S> static void run_fused(gpt_cuda *m, const float *hqkv, const float *hdout, int extra_keys, float **O, float **dqkv) {
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->cfg.dim, i;
    S *h = (S *)malloc(sizeof(S) * BT * 3 * C);
    S *qkv = (S *)gc_device_alloc(m, sizeof(S) * BT * 3 * C), *dout = (S *)gc_device_alloc(m, sizeof(S) * BT * C);
    S *out = (S *)gc_device_alloc(m, sizeof(S) * BT * C), *dq = (S *)gc_device_alloc(m, sizeof(S) * BT * 3 * C);
    for (i = 0; i < BT * 3 * C; i++) gc_put(&h[i], hqkv[i]);
    gpt_cuda_upload(m->stream, qkv, h, sizeof(S) * BT * 3 * C);
    for (i = 0; i < BT * C; i++) gc_put(&h[i], hdout[i]);
    gpt_cuda_upload(m->stream, dout, h, sizeof(S) * BT * C);
    free(h);
    gc_att_fused_fwd<S> f;
    f.qkv = qkv; f.out = out; f.lse = m->acts[0].lse; f.sh = gc_att_shape_of(m, GPT_DROP_ATT(0)); f.extra_keys = extra_keys;
    GC_FOR_ROWS(m, f, m->B * m->cfg.heads * m->T);
    gc_att_fused_args<S> a;
    a.m = m; a.qkv = qkv; a.out = out; a.dout = dout; a.lse = m->acts[0].lse; a.dqkv = dq; a.site = GPT_DROP_ATT(0);
    gc_attention_fused_backward<S>(&a);
    *O = fetch<S>(m, out, BT * C);
    *dqkv = fetch<S>(m, dq, BT * 3 * C);
}
/* The columns q (0), k (1), v (2) of dqkv [BT, 3C]. */
static float *part_of(const float *dqkv, size_t BT, size_t C, int which) {
    float *p = (float *)malloc(sizeof(float) * BT * C + 1);
    size_t r, c;
    for (r = 0; r < BT; r++)
        for (c = 0; c < C; c++) p[r * C + c] = dqkv[r * 3 * C + which * C + c];
    return p;
}
static void test_fused_attention_op(float dropout) {
    gpt_config cfg = { 1, 3, 120, 37, 2 };
    ddp_context *d32 = open_solo(1), *d16 = open_solo(1);
    gpt_cuda m32, m16;
    int B = cfg.batch, T = cfg.seq, C = cfg.dim, hs = C / cfg.heads, w;
    size_t BT = (size_t)B * T, i;
    const double u = ldexp(1.0, -24), ub = ldexp(1.0, -8);
    double a = (1.0 / sqrt((double)hs)) * hs, k_fwd = 2 * (2 * (hs + 1) * a + T + 8) * u, k_bwd = 2 * k_fwd;
    float *hqkv = (float *)malloc(sizeof(float) * BT * 3 * C), *hdout = (float *)malloc(sizeof(float) * BT * C);
    float *refO, *refd, *O, *dq, *bO, *bd;
    char name[160];
    const char *tag = dropout > 0 ? "_dropout" : "";
    if (gpt_cuda_create(&m32, d32, &cfg, 5, GPT_CUDA_FP32) != DDP_OK || gpt_cuda_create(&m16, d16, &cfg, 5, GPT_CUDA_BF16) != DDP_OK) {
        printf("FAIL %s: %s / %s\n", NAME("fused_create"), ddp_last_error(d32), ddp_last_error(d16));
        exit(1);
    }
    for (gpt_cuda *m = &m32; m; m = m == &m32 ? &m16 : NULL) {
        m->B = B; m->T = T;
        gpt_cuda_set_dropout(m, dropout, 17);
        gpt_cuda_set_rows(m, 3, 5, 2);
        m->dropping = dropout > 0;
    }
    for (i = 0; i < BT * 3 * C; i++) hqkv[i] = gc_ld(ddp_k__to_bf16(test_value(71, i)));   /* bf16-representable */
    for (i = 0; i < BT * C; i++) hdout[i] = gc_ld(ddp_k__to_bf16(test_value(72, i)));
    {   /* the explicit fp32 op */
        float *qkv = (float *)gc_device_alloc(&m32, sizeof(float) * BT * 3 * C), *dout = (float *)gc_device_alloc(&m32, sizeof(float) * BT * C);
        float *out = (float *)gc_device_alloc(&m32, sizeof(float) * BT * C), *dqkv = (float *)gc_device_alloc(&m32, sizeof(float) * BT * 3 * C);
        gc_attn_args<float> args;
        gpt_cuda_upload(m32.stream, qkv, hqkv, sizeof(float) * BT * 3 * C);
        gpt_cuda_upload(m32.stream, dout, hdout, sizeof(float) * BT * C);
        gc_attention<float>(&m32, qkv, (float *)m32.acts[0].att, out, dout, dqkv, GPT_DROP_ATT(0), 0);
        args.m = &m32; args.qkv = qkv; args.att = (const float *)m32.acts[0].att; args.dout = dout; args.dqkv = dqkv;
        args.site = GPT_DROP_ATT(0);
        gc_attention_backward<float>(&args);
        refO = fetch<float>(&m32, out, BT * C);
        refd = fetch<float>(&m32, dqkv, BT * 3 * C);
    }
    run_fused<float>(&m32, hqkv, hdout, 0, &O, &dq);
    run_fused<gc_bf16>(&m16, hqkv, hdout, 0, &bO, &bd);
    {
        static const char *const what[3] = { "dQ", "dK", "dV" };
        double r = scaled_error(O, refO, BT * C, k_fwd), rb = scaled_error(bO, refO, BT * C, ub + k_fwd);
        snprintf(name, sizeof name, NAME("fused_attention_forward_matches_explicit_2x3x37_hs40_fp32%s"), tag);
        verdict(r <= 1, name, "O: worst error %.3g of the bound %.3g * max|ref|", r, k_fwd);
        printf("  (%s: worst %.3f of the bound)\n", name, r);
        snprintf(name, sizeof name, NAME("fused_attention_forward_matches_explicit_2x3x37_hs40_bf16%s"), tag);
        verdict(rb <= 1, name, "O: worst error %.3g of the bound %.3g * max|ref|", rb, ub + k_fwd);
        printf("  (%s: worst %.3f of the bound)\n", name, rb);
        for (w = 0; w < 3; w++) {
            float *g = part_of(dq, BT, C, w), *gb = part_of(bd, BT, C, w), *rf = part_of(refd, BT, C, w);
            double kb = (w == 2 ? 1 : 2) * ub + k_bwd;
            r = scaled_error(g, rf, BT * C, k_bwd);
            rb = scaled_error(gb, rf, BT * C, kb);
            snprintf(name, sizeof name, NAME("fused_attention_%s_matches_explicit_fp32%s"), what[w], tag);
            verdict(r <= 1, name, "worst error %.3g of the bound %.3g * max|ref|", r, k_bwd);
            printf("  (%s: worst %.3f of the bound)\n", name, r);
            snprintf(name, sizeof name, NAME("fused_attention_%s_matches_explicit_bf16%s"), what[w], tag);
            verdict(rb <= 1, name, "worst error %.3g of the bound %.3g * max|ref|", rb, kb);
            printf("  (%s: worst %.3f of the bound)\n", name, rb);
            free(g); free(gb); free(rf);
        }
    }
    if (dropout == 0) {   /* the bound catches a mask off by one */
        float *xO, *xd;
        double r;
        run_fused<float>(&m32, hqkv, hdout, 1, &xO, &xd);
        r = scaled_error(xO, refO, BT * C, k_fwd);
        snprintf(name, sizeof name, NAME("fused_attention_bound_catches_mask_off_by_one"));
        verdict(r > 1, name, "a forward that lets key t + 1 in is within the bound (%.3g of it): the check cannot fail", r);
        printf("  (%s: the broken forward at %.3g x the bound)\n", name, r);
        free(xO); free(xd);
    }
    free(hqkv); free(hdout); free(refO); free(refd); free(O); free(dq); free(bO); free(bd);
    gpt_cuda_destroy(&m32);
    gpt_cuda_destroy(&m16);
    ddp_shutdown(d32);
    ddp_shutdown(d16);
}

/* The switch: GPT_ATTENTION refused by name for another value; a model created fused has no
   [T, T] buffers and refuses a switch back to explicit; a head over GC_ATT_MAX_HS refused. */
static void test_fused_attention_switch(void) {
    gpt_config cfg = { 1, 2, 32, 8, 1 };
    ddp_context *d = open_solo(1);
    gpt_cuda m;
    ddp_result r;
    setenv("GPT_ATTENTION", "flash", 1);
    r = gpt_cuda_create(&m, d, &cfg, 1, GPT_CUDA_FP32);
    gpt_cuda_destroy(&m);
    verdict(r == DDP_ERR_INVALID_ARGUMENT, NAME("fused_attention_switch_refuses_unknown_value"), "GPT_ATTENTION=flash: create returned %d", (int)r);
    ddp_shutdown(d);
    d = open_solo(1);
    setenv("GPT_ATTENTION", "fused", 1);
    r = gpt_cuda_create(&m, d, &cfg, 1, GPT_CUDA_FP32);
    unsetenv("GPT_ATTENTION");
    verdict(r == DDP_OK && m.attention_fused && !m.acts[0].att && !m.datt && !gpt_cuda_set_attention(&m, 0) && m.attention_fused,
            NAME("fused_attention_switch_fused_has_no_TxT_buffers"), "create %d, fused %d, att %p, datt %p", (int)r,
            m.attention_fused, m.acts[0].att, m.datt);
    gpt_cuda_destroy(&m);
    ddp_shutdown(d);
    {   /* a head of 160 > GC_ATT_MAX_HS: refused at create and by the setter */
        gpt_config wide = { 1, 1, 160, 8, 1 };
        int set;
        d = open_solo(1);
        setenv("GPT_ATTENTION", "fused", 1);
        r = gpt_cuda_create(&m, d, &wide, 1, GPT_CUDA_FP32);
        unsetenv("GPT_ATTENTION");
        gpt_cuda_destroy(&m);
        ddp_shutdown(d);
        d = open_solo(1);
        if (gpt_cuda_create(&m, d, &wide, 1, GPT_CUDA_FP32) != DDP_OK) { printf("FAIL %s: %s\n", NAME("fused_create"), ddp_last_error(d)); exit(1); }
        set = gpt_cuda_set_attention(&m, 1);
        verdict(r == DDP_ERR_INVALID_ARGUMENT && !set && !m.attention_fused, NAME("fused_attention_refuses_head_over_128"),
                "head size 160: create returned %d, the setter %d", (int)r, set);
        gpt_cuda_destroy(&m);
        ddp_shutdown(d);
    }
}

/* Which parts run: all by default; else the names given as arguments or in GPT_GPU_PARTS
   (comma or space separated), in the file's order: reference vs_cpu determinism bf16 gemm kernels2 fused.
   The GPU check runs "gemm bf16" alone first: its bf16 part then comes before the parts that
   run the templated fp32 code. */
static const char *const part_names[] = { "reference", "vs_cpu", "determinism", "bf16", "gemm", "kernels2", "fused" };
enum { NPARTS = 7 };
static int parts_selected[NPARTS];
static int select_parts(int argc, char **argv) {
    char list[512] = "";
    int i, n;
    for (i = 1; i < argc; i++) { strncat(list, argv[i], sizeof list - strlen(list) - 2); strcat(list, " "); }
    if (!list[0] && getenv("GPT_GPU_PARTS")) snprintf(list, sizeof list, "%s", getenv("GPT_GPU_PARTS"));
    for (char *t = strtok(list, ", "); t; t = strtok(NULL, ", ")) {
        for (n = 0; n < NPARTS && strcmp(t, part_names[n]) != 0; n++) {}
        if (n == NPARTS) {
            printf("FAIL %s: no part '%s' (parts: reference vs_cpu determinism bf16 gemm kernels2 fused)\n", NAME("parts"), t);
            return 0;
        }
        parts_selected[n] = 1;
    }
    for (n = 0, i = 0; n < NPARTS; n++) i |= parts_selected[n];
    if (!i) for (n = 0; n < NPARTS; n++) parts_selected[n] = 1;
    return 1;
}

int main(int argc, char **argv) {
    gpt_config small = { 3, 4, 80, 40, 3 };   /* layers, heads, dim, seq, batch: nothing a multiple of 32 */
    gpt_config larger = { 2, 6, 384, 256, 4 };
    int run_larger = 1;
    if (!select_parts(argc, argv)) return 2;
#ifndef GPT_CUDA_EMULATE
    gpu_require_device();
    printf("device: %s\n", gpu_name());
#else
    run_larger = getenv("GPT_TEST_LARGER") != NULL;   /* the naive host sgemm needs minutes for it */
#endif
    test_blas_threads();
    gpt_blas_init(1);
    make_text();
    if (parts_selected[0]) test_cuda_reference();
    if (parts_selected[1]) {
        test_cuda_vs_cpu(&small, 0.0f, 1);
        test_cuda_vs_cpu(&small, 0.2f, 1);
        if (run_larger) test_cuda_vs_cpu(&larger, 0.0f, 1);
    }
    if (parts_selected[2]) test_cuda_deterministic(&small);
    if (parts_selected[3]) test_cuda_bf16(&small);
    if (parts_selected[4]) {
        test_cuda_bf16_gemm(64, 64, 8192);
#ifndef GPT_CUDA_EMULATE
        test_cuda_bf16_gemm(768, 256, 8192);   /* a weight gradient's shape (768 outputs); host reference ~1.6 G mult-adds */
#endif
    }
    if (parts_selected[5]) {   /* GPT_KERNELS=2 against the CPU model; batches where tokens need several segments */
        gpt_config many = { 2, 2, 40, 67, 7 };   /* 469 positions: the frequent bytes exceed a segment */
        test_vec_maps();
        test_kernels2_same_bits();
        test_cuda_vs_cpu(&many, 0.0f, 2);
        test_cuda_vs_cpu(&small, 0.2f, 2);
    }
    if (parts_selected[6]) {   /* GPT_ATTENTION=fused: the op against the explicit one, the switch, the model against the CPU's */
        test_fused_attention_op(0.0f);
        test_fused_attention_op(0.2f);
        test_fused_attention_switch();
        test_cuda_vs_cpu(&small, 0.2f, 1, 1);
        setenv("GPT_ATTENTION", "fused", 1);   /* the bf16 model against fp32, both fused: part 4's bounds (fewer roundings) */
        test_cuda_bf16(&small);
        unsetenv("GPT_ATTENTION");
    }
    return test_summary(NAME("test"));
}
