/* bench_gpu.cu — the GPU numbers bench/RESULTS.md asks for, as lines to paste:
   1. device-to-device copy bandwidth (cudaMemcpyAsync, bytes read + written per second);
   2. the fused AdamW kernel's bandwidth over the same kind of flat buffers (p, g, m, v read;
      p, m, v written: 28 bytes per parameter), and its share of the copy bandwidth (target >= 85%);
   3. the cost of ddp.h at 1 rank on the NCCL backend: a chain of cuBLAS linear layers (forward,
      backward, AdamW) with ddp.h against the same loop with its own buffers and the same AdamW
      kernels, no ddp.h (target: <= 2% of the step time).
   Everything timed with CUDA events after a warm-up; the median of several repetitions.
   Prints "SKIP gpu: ..." without a device. Run: build/gpu/bench_gpu */
#define DDP_IMPLEMENTATION
#include "../../ddp.h"
#include "../../tests/gpu/gpu_common.h"
#include <cublas_v2.h>

#define CB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    printf("FAIL %s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_); exit(1); } } while (0)
#define DK(call) do { ddp_result r_ = (call); if (r_ != DDP_OK) { printf("FAIL %s: %s\n", #call, ddp_last_error(ddp)); exit(1); } } while (0)

static int cmp_float(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return (x > y) - (x < y); }
static float median(float *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_float); return v[n / 2]; }

enum { REPS = 7 };

static void bench_bandwidth(void) {
    const size_t n = (size_t)64 << 20;   /* 64 Mi parameters: 256 MiB per buffer */
    float *p, *g, *m, *v, t[REPS], copy_ms, adam_ms;
    unsigned char *mask;
    double *partials, *norm_sq;
    ddp_k_adamw_state *state;
    cudaEvent_t e0, e1;
    int r;
    CK(cudaMalloc((void **)&p, n * 4)); CK(cudaMalloc((void **)&g, n * 4));
    CK(cudaMalloc((void **)&m, n * 4)); CK(cudaMalloc((void **)&v, n * 4));
    CK(cudaMalloc((void **)&mask, n / DDP_K_MASK_GROUP));
    CK(cudaMalloc((void **)&partials, DDP_K_NORM_BLOCKS * sizeof(double)));
    CK(cudaMalloc((void **)&norm_sq, sizeof(double)));
    CK(cudaMalloc((void **)&state, sizeof *state));
    CK(cudaMemset(mask, 0, n / DDP_K_MASK_GROUP)); CK(cudaMemset(state, 0, sizeof *state));
    CK(ddp_k_fill(p, n, 0.5f, 0)); CK(ddp_k_fill(g, n, 1e-3f, 0)); CK(ddp_k_fill(m, n, 0, 0)); CK(ddp_k_fill(v, n, 0, 0));
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (r = -1; r < REPS; r++) {   /* r = -1: warm-up */
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(m, g, n * 4, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0)); CK(cudaEventSynchronize(e1));
        if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    copy_ms = median(t, REPS);
    CK(ddp_k_fill(m, n, 0, 0));
    CK(ddp_k_sum_squares(g, n, partials, norm_sq, 0));
    CK(ddp_k_adamw_prepare(state, norm_sq, 0, 1e-3f, 0.9f, 0.999f, 0));
    for (r = -1; r < REPS; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(ddp_k_adamw(p, g, m, v, n, mask, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, state, 0));
        CK(cudaEventRecord(e1, 0)); CK(cudaEventSynchronize(e1));
        if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    adam_ms = median(t, REPS);
    {
        double copy_gbs = 2.0 * n * 4 / (copy_ms * 1e-3) / 1e9, adam_gbs = 28.0 * n / (adam_ms * 1e-3) / 1e9;
        printf("RESULT gpu=\"%s\" d2d_copy_GBps=%.0f (read+write, %zu MiB)\n", gpu_name(), copy_gbs, n * 4 >> 20);
        printf("RESULT gpu=\"%s\" adamw_GBps=%.0f adamw_ms=%.3f params=%zu share_of_copy=%.1f%% (target >= 85%%)\n",
               gpu_name(), adam_gbs, adam_ms, n, 100.0 * adam_gbs / copy_gbs);
    }
    cudaFree(p); cudaFree(g); cudaFree(m); cudaFree(v); cudaFree(mask); cudaFree(partials); cudaFree(norm_sq); cudaFree(state);
}

/* A chain of LAYERS square linear layers, activations H x B (column-major), no nonlinearity:
   forward Y = W X; backward dX = W^T dY, dW += dY X^T. Timing, not learning. */
enum { LAYERS = 8, H = 2048, B = 4096, STEPS = 20 };

typedef struct { float *w[LAYERS], *gw[LAYERS], *act[LAYERS + 1], *dact[LAYERS + 1]; } chain;

static void chain_forward_backward(cublasHandle_t h, chain *c, ddp_context *ddp, const int *ids) {
    const float one = 1, zero = 0;
    int l;
    for (l = 0; l < LAYERS; l++)
        CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, H, B, H, &one, c->w[l], H, c->act[l], H, &zero, c->act[l + 1], H));
    for (l = LAYERS - 1; l >= 0; l--) {
        CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, H, H, B, &one, c->dact[l + 1], H, c->act[l], H, &one, c->gw[l], H));
        if (ddp && ddp_grad_ready(ddp, ids[l]) != DDP_OK) { printf("FAIL grad_ready: %s\n", ddp_last_error(ddp)); exit(1); }
        CB(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, H, B, H, &one, c->w[l], H, c->dact[l + 1], H, &zero, c->dact[l], H));
    }
}

static float time_steps(cudaStream_t s, cublasHandle_t h, chain *c, ddp_context *ddp, const int *ids, float *flat_p,
                        float *flat_g, float *m, float *v, size_t n, double *partials, double *norm_sq, ddp_k_adamw_state *st) {
    cudaEvent_t e0, e1;
    ddp_adamw opt;
    float ms;
    int k;
    memset(&opt, 0, sizeof opt);
    opt.lr = 1e-4f; opt.weight_decay = 0.01f;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (k = -3; k < STEPS; k++) {
        if (k == 0) CK(cudaEventRecord(e0, s));
        if (ddp) {
            if (ddp_zero_grad(ddp) != DDP_OK) exit(1);
            chain_forward_backward(h, c, ddp, ids);
            if (ddp_finish(ddp) != DDP_OK || ddp_adamw_step(ddp, &opt, NULL) != DDP_OK) { printf("FAIL step: %s\n", ddp_last_error(ddp)); exit(1); }
        } else {   /* the same work without ddp.h */
            CK(cudaMemsetAsync(flat_g, 0, n * 4, s));
            chain_forward_backward(h, c, NULL, ids);
            CK(ddp_k_sum_squares(flat_g, n, partials, norm_sq, s));
            CK(ddp_k_adamw_prepare(st, norm_sq, 0, opt.lr, 0.9f, 0.999f, s));
            CK(ddp_k_adamw(flat_p, flat_g, m, v, n, NULL, opt.lr, 0.9f, 0.999f, 1e-8f, opt.weight_decay, st, s));
        }
    }
    CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / STEPS;
}

static void bench_overhead(void) {
    cudaStream_t s;
    cublasHandle_t h;
    chain c;
    ddp_context *ddp;
    ddp_desc d;
    int ids[LAYERS], l, r;
    size_t n = (size_t)LAYERS * H * H;
    float *flat_p, *flat_g, *m, *v, with_ms[3], without_ms[3];
    double *partials, *norm_sq;
    ddp_k_adamw_state *st;
    ddp_step_stats stats;
    char name[32];
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CB(cublasCreate(&h));
    CB(cublasSetStream(h, s));
    CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));   /* plain fp32 */
    for (l = 0; l <= LAYERS; l++) {
        CK(cudaMalloc((void **)&c.act[l], (size_t)H * B * 4)); CK(cudaMalloc((void **)&c.dact[l], (size_t)H * B * 4));
        CK(ddp_k_fill(c.act[l], (size_t)H * B, 0.01f, s)); CK(ddp_k_fill(c.dact[l], (size_t)H * B, 1e-4f, s));
    }
    /* without ddp.h: one flat buffer of our own */
    CK(cudaMalloc((void **)&flat_p, n * 4)); CK(cudaMalloc((void **)&flat_g, n * 4));
    CK(cudaMalloc((void **)&m, n * 4)); CK(cudaMalloc((void **)&v, n * 4));
    CK(cudaMemsetAsync(m, 0, n * 4, s)); CK(cudaMemsetAsync(v, 0, n * 4, s)); CK(ddp_k_fill(flat_p, n, 0.01f, s));
    CK(cudaMalloc((void **)&partials, DDP_K_NORM_BLOCKS * sizeof(double)));
    CK(cudaMalloc((void **)&norm_sq, sizeof(double)));
    CK(cudaMalloc((void **)&st, sizeof *st)); CK(cudaMemsetAsync(st, 0, sizeof *st, s));
    /* with ddp.h: the same parameters registered, one rank, NCCL backend */
    memset(&d, 0, sizeof d);
    d.world_size = 1; d.backend = DDP_BACKEND_NCCL; d.cuda_stream = s;
    if (ddp_init(&ddp, &d) != DDP_OK) { printf("FAIL init: %s\n", ddp_last_error(ddp)); exit(1); }
    for (l = 0; l < LAYERS; l++) { snprintf(name, sizeof name, "layer%d.w", l); DK(ddp_register_param(ddp, name, (size_t)H * H, 0, NULL, &ids[l])); }
    DK(ddp_commit(ddp));
    CK(ddp_k_fill(ddp_flat_params(ddp, NULL), n, 0.01f, s));
    for (r = 0; r < 3; r++) {   /* alternate, so clocks and thermals hit both alike */
        for (l = 0; l < LAYERS; l++) { c.w[l] = flat_p + (size_t)l * H * H; c.gw[l] = flat_g + (size_t)l * H * H; }
        without_ms[r] = time_steps(s, h, &c, NULL, ids, flat_p, flat_g, m, v, n, partials, norm_sq, st);
        for (l = 0; l < LAYERS; l++) { c.w[l] = ddp_param(ddp, ids[l]); c.gw[l] = ddp_grad(ddp, ids[l]); }
        with_ms[r] = time_steps(s, h, &c, ddp, ids, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL);
    }
    stats = ddp_last_step_stats(ddp);
    {
        float w = median(with_ms, 3), wo = median(without_ms, 3);
        printf("RESULT gpu=\"%s\" step_without_ddp_ms=%.3f step_with_ddp_ms=%.3f overhead=%.2f%% (target <= 2%%; "
               "%d layers %dx%d, batch %d, %d buckets, 1 rank, NCCL %s)\n", gpu_name(), wo, w, 100.0 * (w - wo) / wo,
               LAYERS, H, H, B, stats.buckets_launched, "backend");
        printf("RESULT gpu=\"%s\" step_stats backward_ms=%.3f comm_ms=%.3f exposed_ms=%.3f overlap=%.0f%%\n", gpu_name(),
               stats.backward_ms, stats.comm_ms, stats.exposed_ms, stats.overlap_pct);
    }
    ddp_shutdown(ddp);
    cublasDestroy(h);
}

int main(void) {
    gpu_require_device();
    bench_bandwidth();
    bench_overhead();
    return 0;
}
